//! The invariants, checked over what the run recorded (requests, answers, arrivals, readiness
//! samples) and what the JobDBs, the archive and the API say at the end. Each finding is a
//! [`Violation`] naming its invariant; nothing here panics, so one run reports everything.
//!
//! The ends of a job are `succeeded`, `discarded` and `archiving` (an expiry or an operator
//! flush; `archived` follows it once the archive confirms). Duplicate deliveries are allowed
//! only when a crash (kill -9 of a Director, a JobDB outage) happened between a final answer
//! and the next arrival of the same job; they are counted.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use spindle::job::{JobId, State, Transition};

mod erasure;
mod events;
mod ordered;
mod parks;
mod payloads;
mod reads;
mod settles;
mod traces;

use super::endpoint::Arrival;
use super::record::{Log, Outcome, Violation};
use super::world::{Stored, SKEW_MS};

/// What the API answered for a job: the status and, for a 200, the state.
pub type ApiViews = HashMap<JobId, (u16, Option<String>)>;

/// Every job `GET /v1/jobs` listed at the end (oldest first, every page), with its state; or
/// why the listing failed.
pub type Listing = Result<Vec<(String, String)>, String>;

/// Counts of what was checked, for the report.
#[derive(Debug, Default)]
pub struct Tally {
    pub accepted: usize,
    pub stored_unacknowledged: usize,
    pub notices: usize,
    pub ends: BTreeMap<String, usize>,
    pub arrivals: usize,
    pub duplicates_allowed: usize,
    pub sequences: usize,
    pub ordered_jobs: usize,
    pub scheduled: usize,
    pub readiness_samples: usize,
    pub api_checked: usize,
    /// Jobs the final listing held.
    pub listed: usize,
    /// Jobs made in a producer's trace.
    pub traced: usize,
    /// Producers' jobs whose payload is not UTF-8 (sent as `payload_base64`).
    pub binary_payloads: usize,
    /// Keys producers gave up after too many tries that stored nothing.
    pub given_up: usize,
    /// Keys a router answered `pending` at least once for a lapsed claim it could not check.
    pub lapsed_waits: usize,
    /// Alone: ordered jobs released.
    pub released: u64,
    /// Alone: ordered jobs kept in the writer's book until their turn.
    pub kept: u64,
    /// Alone: sequences spilled to the store (the book was full).
    pub spilled: u64,
    pub events: usize,
    /// Parks of lanes the records showed.
    pub parks: usize,
    /// Erasures that said they finished.
    pub erasures: usize,
    /// Events refused (413) as too large for the Directors: none of their jobs may be stored.
    pub events_refused: usize,
    pub event_jobs: usize,
}

fn v(
    out: &mut Vec<Violation>,
    invariant: &'static str,
    at: DateTime<Utc>,
    jobs: impl IntoIterator<Item = JobId>,
    what: String,
) {
    out.push(Violation {
        invariant,
        at,
        jobs: jobs.into_iter().collect(),
        what,
    });
}

fn is_end(state: State) -> bool {
    matches!(
        state,
        State::Succeeded | State::Discarded | State::Archiving | State::Archived
    )
}

/// A job's first end over all its places: state, time, error type.
pub fn first_end(stored: &Stored) -> Option<&Transition> {
    stored
        .places
        .iter()
        .filter_map(|p| p.history.iter().find(|t| is_end(t.state)))
        .min_by_key(|t| t.time)
}

/// How many places hold an end of the job (an `archiving` and its `archived` are one end).
fn ends(stored: &Stored) -> usize {
    stored
        .places
        .iter()
        .filter(|p| p.history.iter().any(|t| is_end(t.state)))
        .count()
}

/// Why a history breaks the state machine, if it does.
pub fn illegal(history: &[Transition]) -> Option<String> {
    let first = history.first()?;
    let imported =
        first.state == State::AwaitingRetry && first.error_type.as_deref() == Some("imported");
    if first.state != State::AwaitingScheduling && !imported {
        return Some(format!("starts {:?}", first.state));
    }
    let skew = Duration::milliseconds(SKEW_MS + 200);
    for (i, pair) in history.windows(2).enumerate() {
        if !pair[0].state.may_precede(pair[1].state) {
            return Some(format!("{:?} -> {:?}", pair[0].state, pair[1].state));
        }
        if pair[1].attempts < pair[0].attempts {
            return Some("attempts went down".into());
        }
        // The acceptance step carries the front's clock (a router's may run ahead).
        let slack = if i == 0 { skew } else { Duration::zero() };
        if pair[1].time + slack < pair[0].time {
            return Some(format!("time went back at step {}", i + 1));
        }
    }
    let terminal = history.iter().filter(|t| t.state.is_terminal()).count();
    if terminal > 1 || (terminal == 1 && !history.last().unwrap().state.is_terminal()) {
        return Some("a terminal state before the end".into());
    }
    None
}

/// The state a notice should report for a job that ended in `state`.
fn notice_state(state: State) -> &'static str {
    match state {
        State::Succeeded => "succeeded",
        State::Discarded => "discarded",
        _ => "archiving",
    }
}

pub struct Inputs<'a> {
    pub log: &'a Log,
    pub arrivals: &'a [Arrival],
    pub stored: &'a HashMap<JobId, Stored>,
    pub api: &'a ApiViews,
    /// The whole listing at the end.
    pub listing: &'a Listing,
    /// JobDBs a Director serves at the end (a job whose end lies elsewhere may be unknown to
    /// the API).
    pub active: &'a HashSet<String>,
    /// Alone: every attempt the JobDB's commits list as begun (job, attempt number).
    pub listed: Option<&'a HashSet<(JobId, u16)>>,
    /// Alone: heads the writer took from its memory of its sequences, and of those, heads
    /// the JobDB did not hold waiting (the Director's counters over its lives).
    pub remembered: Option<super::world::Remembered>,
    /// Alone: the subscription an operation disables for a while (its jobs must wait).
    pub held_subscription: Option<ulid::Ulid>,
    /// How many Directors deliver (each applies a subscription's caps on its own).
    pub directors: usize,
    /// Acknowledged events no subscription wants that a JobDB or the archive holds at the end.
    pub kept_found: &'a HashSet<String>,
}

pub fn check(i: &Inputs) -> (Vec<Violation>, Tally) {
    let mut out = Vec::new();
    let mut tally = Tally::default();
    let seen = Seen::of(i, &mut out, &mut tally);
    for step in [
        acknowledged,
        one_end,
        endpoint_arrivals,
        ordered::key_order,
        ordered::listed_attempts,
        ordered::book,
        scheduled,
        notices,
        reads::api,
        reads::listing,
        reads::readiness,
    ] {
        step(i, &seen, &mut out, &mut tally);
    }
    events::events(i, &mut out, &mut tally);
    traces::traces(i, &mut out, &mut tally);
    payloads::payloads(i, &mut out, &mut tally);
    settles::settles(i, &mut out, &mut tally);
    parks::parks(i, &mut out, &mut tally);
    erasure::erasures(i, &mut out, &mut tally);
    (out, tally)
}

/// What the invariants share: when the check ran, the crashes, the arrivals by job, which
/// stored jobs are ours (by the key they were submitted with), and the notices of each job.
struct Seen<'a> {
    now: DateTime<Utc>,
    crashes: Vec<DateTime<Utc>>,
    by_job: HashMap<String, Vec<&'a Arrival>>,
    ours: HashSet<JobId>,
    by_spec: HashMap<&'a str, Vec<JobId>>,
    notices: HashMap<JobId, Vec<JobId>>,
}

impl<'a> Seen<'a> {
    /// Sorts what the run recorded; a stored job that is not ours is `invented`.
    fn of(i: &'a Inputs, out: &mut Vec<Violation>, tally: &mut Tally) -> Self {
        let now = Utc::now();
        let log = i.log;
        // Arrivals by job, in time order.
        let mut by_job: HashMap<String, Vec<&Arrival>> = HashMap::new();
        for a in i.arrivals {
            by_job.entry(a.job.clone()).or_default().push(a);
        }
        for list in by_job.values_mut() {
            list.sort_by_key(|a| a.at);
        }
        tally.arrivals = i.arrivals.len();

        // Which stored jobs are ours: by idempotency key (every job of ours has a unique one), or
        // a notice of one of ours.
        let mut ours: HashSet<JobId> = HashSet::new();
        let mut by_spec: HashMap<&str, Vec<JobId>> = HashMap::new();
        let mut notices: HashMap<JobId, Vec<JobId>> = HashMap::new();
        for (id, s) in i.stored {
            let key = s.job.idempotency_key.as_deref().unwrap_or("");
            if let Some(told) = key.strip_prefix("notice:") {
                match told.parse::<JobId>() {
                    Ok(of)
                        if i.stored
                            .get(&of)
                            .is_some_and(|o| o.job.on_complete.is_some()) =>
                    {
                        notices.entry(of).or_default().push(*id);
                        ours.insert(*id);
                    }
                    _ => v(
                        out,
                        "invented",
                        now,
                        Some(*id),
                        format!("notice job {id} for {told}, which asked for none"),
                    ),
                }
            } else if log.specs.contains_key(key) {
                by_spec.entry(key).or_default().push(*id);
                ours.insert(*id);
            } else {
                v(
                    out,
                    "invented",
                    now,
                    Some(*id),
                    format!("stored job {id} with key {key:?} was never submitted"),
                );
            }
        }
        Seen {
            now,
            crashes: log.crashes.iter().map(|(t, _)| *t).collect(),
            by_job,
            ours,
            by_spec,
            notices,
        }
    }

    /// Whether a crash happened between `a` (less a second) and `b`.
    fn crash_between(&self, a: DateTime<Utc>, b: DateTime<Utc>) -> bool {
        self.crashes
            .iter()
            .any(|c| *c >= a - Duration::seconds(1) && *c <= b)
    }
}

/// Every acknowledged job is stored; a stored job nobody was told of came from a submission
/// whose outcome was unknown; through routers alone, one job per key.
fn acknowledged(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let log = i.log;
    let now = seen.now;
    let by_spec = &seen.by_spec;
    // Every acknowledged job is stored; a stored job that was not acknowledged came from a
    // submission whose outcome was unknown; through routers alone, one job per key.
    for (id, a) in &log.accepted {
        tally.accepted += 1;
        if !i.stored.contains_key(id) {
            v(
                out,
                "lost",
                a.at,
                Some(*id),
                format!(
                    "job {id} (key {}) acknowledged by {} but stored nowhere",
                    a.spec_key, a.via
                ),
            );
        }
    }
    tally.events_refused = log
        .outcomes
        .values()
        .filter(|o| {
            o.iter()
                .any(|(_, o)| matches!(o, Outcome::NotStored(why) if why == "413"))
        })
        .count();
    for (key, ids) in by_spec {
        let outcomes = log.outcomes.get(*key).map(Vec::as_slice).unwrap_or(&[]);
        let answered: HashSet<&str> = outcomes
            .iter()
            .filter_map(|(_, o)| match o {
                Outcome::Accepted(id) | Outcome::Duplicate(id) => Some(id.as_str()),
                _ => None,
            })
            .collect();
        let unknown = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Unknown(_)))
            .count();
        let unanswered: Vec<&JobId> = ids
            .iter()
            .filter(|id| !answered.contains(id.to_string().as_str()))
            .collect();
        tally.stored_unacknowledged += unanswered.len();
        if unanswered.len() > unknown {
            v(out, "invented", now, unanswered.first().copied().copied(),
              format!("key {key}: {} stored jobs nobody was told of, {unknown} submissions with an unknown outcome ({outcomes:?})", unanswered.len()));
        }
        let via_routers_only =
            !outcomes.is_empty() && outcomes.iter().all(|(via, _)| via.starts_with("router"));
        // An event's key holds one job per subscription: `event-once` judges it.
        let event = log
            .specs
            .get(*key)
            .is_some_and(|s| s.json.get("event_type").is_some());
        if via_routers_only && !event {
            if ids.len() > 1 {
                v(
                    out,
                    "dedup",
                    now,
                    Some(ids[0]),
                    format!(
                        "key {key} stored {} times through the routers: {ids:?}",
                        ids.len()
                    ),
                );
            }
            if answered.len() > 1 {
                v(
                    out,
                    "dedup",
                    now,
                    Some(ids[0]),
                    format!("key {key}: answers name several jobs: {outcomes:?}"),
                );
            }
        }
    }
}

/// One end each, legal histories, a cause for each discard, nothing delivered after its end,
/// and a second delivery only across a crash.
fn one_end(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let now = seen.now;
    let Seen { by_job, ours, .. } = seen;
    let crash_between = |a, b| seen.crash_between(a, b);
    // One end each, legal histories, nothing delivered after its end.
    for (id, s) in i.stored.iter().filter(|(id, _)| ours.contains(id)) {
        for p in &s.places {
            if let Some(why) = illegal(&p.history) {
                v(
                    out,
                    "state-machine",
                    p.history.last().map_or(now, |t| t.time),
                    Some(*id),
                    format!("job {id} in {}: {why}", p.jobdb),
                );
            }
        }
        match ends(s) {
            0 => {
                let last: Vec<String> = s
                    .places
                    .iter()
                    .map(|p| format!("{}: {:?}", p.jobdb, p.history.last().map(|t| t.state)))
                    .collect();
                v(
                    out,
                    "one-end",
                    s.job.created_at,
                    Some(*id),
                    format!("job {id} never ended: {last:?}"),
                );
            }
            1 => {}
            n => v(
                out,
                "one-end",
                now,
                Some(*id),
                format!("job {id} ended {n} times"),
            ),
        }
        let end = first_end(s);
        if let Some(end) = end {
            *tally
                .ends
                .entry(format!(
                    "{}{}",
                    end.state,
                    end.error_type
                        .as_deref()
                        .map(|e| format!("/{e}"))
                        .unwrap_or_default()
                ))
                .or_default() += 1;
        }
        let arrivals = by_job
            .get(&id.to_string())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        // A job is discarded only for a cause: its endpoint's final refusal, its last allowed
        // attempt, or an operator's discard.
        if let Some(end) = end.filter(|e| e.state == State::Discarded) {
            let cause = match end.error_type.as_deref() {
                Some("operator-discard") | Some("max-attempts") => true,
                Some("client-error") | Some("redirect") => arrivals
                    .iter()
                    .any(|a| a.is_final_answer() && a.status >= 300),
                _ => false,
            };
            if !cause {
                v(out, "discard-cause", end.time, Some(*id), format!(
                    "job {id} discarded ({}) without its endpoint refusing it or an operator discarding it",
                    end.error_type.as_deref().unwrap_or("-")));
            }
        }
        if let Some(end) = end {
            if let Some(late) = arrivals
                .iter()
                .find(|a| a.at > end.time + Duration::milliseconds(10))
            {
                v(
                    out,
                    "after-end",
                    late.at,
                    Some(*id),
                    format!(
                        "job {id} arrived (attempt {}) {} ms after it ended {} ({})",
                        late.attempt,
                        (late.at - end.time).num_milliseconds(),
                        end.state,
                        end.error_type.as_deref().unwrap_or("-")
                    ),
                );
            }
        }
        // Duplicate deliveries: an arrival after a final answer.
        if let Some(first_final) = arrivals.iter().position(|a| a.is_final_answer()) {
            for later in &arrivals[first_final + 1..] {
                if crash_between(arrivals[first_final].at, later.at) {
                    tally.duplicates_allowed += 1;
                } else {
                    v(out, "duplicate", later.at, Some(*id), format!(
                        "job {id} arrived again (attempt {}) after its final answer {} at attempt {}, no crash between",
                        later.attempt, arrivals[first_final].status, arrivals[first_final].attempt));
                }
            }
        }
    }
}

/// Nothing invented at the endpoints.
fn endpoint_arrivals(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, _tally: &mut Tally) {
    let ours = &seen.ours;
    // Nothing invented at the endpoints.
    let known: HashSet<String> = ours.iter().map(|id| id.to_string()).collect();
    for a in i.arrivals {
        if !known.contains(&a.job) {
            v(
                out,
                "invented",
                a.at,
                a.job.parse().ok(),
                format!(
                    "{} arrived at {} but is no job of ours (body {})",
                    a.job,
                    a.path,
                    a.body.as_ref().map_or("-".into(), |b| b.to_string())
                ),
            );
        }
    }
}

/// Scheduled jobs never arrive early (unless an operator expedited them).
fn scheduled(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let log = i.log;
    let by_job = &seen.by_job;
    // Scheduled jobs never arrive early (unless an operator expedited them).
    for (id, a) in &log.accepted {
        let Some(at) = a.deliver_at else { continue };
        tally.scheduled += 1;
        let Some(first) = by_job.get(&id.to_string()).and_then(|l| l.first()) else {
            continue;
        };
        let expedited = i.stored.get(id).is_some_and(|s| {
            s.places
                .iter()
                .flat_map(|p| &p.history)
                .any(|t| t.error_type.as_deref() == Some("operator-expedite") && t.time <= first.at)
        });
        if first.at + Duration::milliseconds(2) < at && !expedited {
            v(
                out,
                "scheduled-early",
                first.at,
                Some(*id),
                format!(
                    "job {id} arrived {} ms before its deliver_at {}",
                    (at - first.at).num_milliseconds(),
                    at.format("%H:%M:%S%.3f")
                ),
            );
        }
    }
}

/// Notices: exactly one per ended job that asked for one, saying how it ended.
fn notices(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let now = seen.now;
    let Seen { ours, notices, .. } = seen;
    let crash_between = |a, b| seen.crash_between(a, b);
    // Notices: exactly one per ended job that asked for one, saying how it ended.
    let mut told: HashMap<String, HashSet<String>> = HashMap::new();
    let mut told_state: HashMap<String, Vec<String>> = HashMap::new();
    for a in i.arrivals.iter().filter(|a| a.path.starts_with("notice/")) {
        let Some(body) = &a.body else { continue };
        let of = body["job_id"].as_str().unwrap_or("").to_owned();
        told.entry(of.clone()).or_default().insert(a.job.clone());
        told_state
            .entry(of)
            .or_default()
            .push(body["state"].as_str().unwrap_or("").to_owned());
    }
    for (id, s) in i.stored.iter().filter(|(id, _)| ours.contains(id)) {
        if s.job.on_complete.is_none() {
            if told.contains_key(&id.to_string()) {
                v(
                    out,
                    "notice",
                    now,
                    Some(*id),
                    format!("job {id} asked for no notice and got one"),
                );
            }
            continue;
        }
        let Some(end) = first_end(s) else { continue };
        tally.notices += 1;
        let got = told.get(&id.to_string()).map_or(0, HashSet::len);
        let written = notices.get(id).map_or(0, Vec::len);
        // A notice is a job of its job's bucket: an operator's command that ends the bucket's
        // waiting jobs (discard, flush), read by the Director after the notice was written,
        // ends it too.
        let written_ids = notices.get(id).cloned().unwrap_or_default();
        let ended_by_operator = [
            spindle::job::ErrorType::OperatorDiscard,
            spindle::job::ErrorType::OperatorFlush,
        ]
        .map(|e| e.as_str());
        let by_operator = !written_ids.is_empty()
            && written_ids.iter().all(|n| {
                i.stored.get(n).and_then(first_end).is_some_and(|e| {
                    e.error_type
                        .as_deref()
                        .is_some_and(|t| ended_by_operator.contains(&t))
                })
            });
        if got == 0 && !by_operator {
            // The notice jobs too, so the report shows where each stopped.
            v(
                out,
                "notice",
                end.time,
                std::iter::once(*id).chain(written_ids),
                format!(
                    "job {id} ended {} ({}) and no notice arrived ({written} notice jobs stored)",
                    end.state,
                    end.error_type.as_deref().unwrap_or("-")
                ),
            );
        } else if got > 1
            && !crash_between(
                end.time - Duration::seconds(5),
                end.time + Duration::seconds(5),
            )
        {
            v(
                out,
                "notice",
                end.time,
                Some(*id),
                format!("job {id} got {got} distinct notices"),
            );
        }
        let want = notice_state(end.state);
        if let Some(states) = told_state.get(&id.to_string()) {
            if let Some(wrong) = states.iter().find(|s| s.as_str() != want) {
                v(
                    out,
                    "notice",
                    end.time,
                    Some(*id),
                    format!(
                        "job {id} ended {} ({}) but its notice says {wrong}",
                        end.state,
                        end.error_type.as_deref().unwrap_or("-")
                    ),
                );
            }
        }
    }
    for of in told.keys() {
        let known_job = of
            .parse::<JobId>()
            .ok()
            .is_some_and(|id| i.stored.contains_key(&id));
        if !known_job {
            v(
                out,
                "invented",
                now,
                None,
                format!("a notice about {of}, no job of ours"),
            );
        }
    }
}
