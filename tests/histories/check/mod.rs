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
mod parks;
mod payloads;
mod settles;
mod traces;

use super::endpoint::Arrival;
use super::record::{Log, Outcome, SeqKey, Violation};
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
    let now = Utc::now();
    let log = i.log;
    let crashes: Vec<DateTime<Utc>> = log.crashes.iter().map(|(t, _)| *t).collect();
    let crash_between = |a: DateTime<Utc>, b: DateTime<Utc>| {
        crashes
            .iter()
            .any(|c| *c >= a - Duration::seconds(1) && *c <= b)
    };

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
                    &mut out,
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
                &mut out,
                "invented",
                now,
                Some(*id),
                format!("stored job {id} with key {key:?} was never submitted"),
            );
        }
    }

    // Every acknowledged job is stored; a stored job that was not acknowledged came from a
    // submission whose outcome was unknown; through routers alone, one job per key.
    for (id, a) in &log.accepted {
        tally.accepted += 1;
        if !i.stored.contains_key(id) {
            v(
                &mut out,
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
    for (key, ids) in &by_spec {
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
            v(&mut out, "invented", now, unanswered.first().copied().copied(),
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
                    &mut out,
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
                    &mut out,
                    "dedup",
                    now,
                    Some(ids[0]),
                    format!("key {key}: answers name several jobs: {outcomes:?}"),
                );
            }
        }
    }

    // One end each, legal histories, nothing delivered after its end.
    for (id, s) in i.stored.iter().filter(|(id, _)| ours.contains(id)) {
        for p in &s.places {
            if let Some(why) = illegal(&p.history) {
                v(
                    &mut out,
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
                    &mut out,
                    "one-end",
                    s.job.created_at,
                    Some(*id),
                    format!("job {id} never ended: {last:?}"),
                );
            }
            1 => {}
            n => v(
                &mut out,
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
                v(&mut out, "discard-cause", end.time, Some(*id), format!(
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
                    &mut out,
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
                    v(&mut out, "duplicate", later.at, Some(*id), format!(
                        "job {id} arrived again (attempt {}) after its final answer {} at attempt {}, no crash between",
                        later.attempt, arrivals[first_final].status, arrivals[first_final].attempt));
                }
            }
        }
    }

    // Nothing invented at the endpoints.
    let known: HashSet<String> = ours.iter().map(|id| id.to_string()).collect();
    for a in i.arrivals {
        if !known.contains(&a.job) {
            v(
                &mut out,
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

    // Ordered keys: job n+1 is not tried before job n ended, in acknowledged order. And
    // blocked keys: after a job that asked to block its key ends without success (not an
    // operator's choice), the key's next job is not tried before an operator released the
    // blocks; the quiet period deletes them every few seconds from its start on.
    let releases: Vec<DateTime<Utc>> = log
        .ops
        .iter()
        .filter(|(_, text)| text.contains(super::ops::RELEASES_BLOCKS))
        .map(|(at, _)| *at)
        .collect();
    let quiet_from = log
        .ops
        .iter()
        .find(|(_, text)| text.starts_with("quiet:"))
        .map(|(at, _)| *at);
    let released_between = |from: DateTime<Utc>, to: DateTime<Utc>| {
        quiet_from.is_some_and(|q| q <= to)
            || releases
                .iter()
                .any(|r| *r >= from - Duration::milliseconds(5) && *r <= to)
    };
    let mut order: BTreeMap<SeqKey, Vec<JobId>> = log.sequences.clone();
    for (key, seq) in &log.uncertain {
        for id in by_spec.get(key.as_str()).into_iter().flatten() {
            order.entry(seq.clone()).or_default().push(*id);
        }
    }
    for (seq, ids) in &order {
        tally.sequences += 1;
        tally.ordered_jobs += ids.len();
        for pair in ids.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let Some(first) = by_job.get(&b.to_string()).and_then(|l| l.first()) else {
                continue;
            };
            let stored_a = i.stored.get(&a);
            let end_a = stored_a.and_then(first_end);
            let blocks =
                stored_a.is_some_and(|s| s.job.ordering.as_ref().is_some_and(|o| o.blocks));
            if let Some(end) =
                end_a.filter(|e| blocks && spindle::jobdb::ordering::blocks_sequence(e))
            {
                if !released_between(end.time, first.at) {
                    v(
                        &mut out,
                        "block-held",
                        first.at,
                        [b, a],
                        format!(
                            "key {}: job {b} tried at {} though job {a}, which blocks its key, ended {} ({}) at {} and no operator released the key between",
                            seq.key,
                            first.at.format("%H:%M:%S%.3f"),
                            end.state,
                            end.error_type.as_deref().unwrap_or("-"),
                            end.time.format("%H:%M:%S%.3f"),
                        ),
                    );
                }
            }
            let via = |id: JobId| {
                log.accepted
                    .get(&id)
                    .map_or("an unknown front".to_owned(), |x| {
                        format!("{} at {}", x.via, x.at.format("%H:%M:%S%.3f"))
                    })
            };
            let what = match end_a {
                Some(end) if end.time <= first.at + Duration::milliseconds(5) => continue,
                Some(end) => format!("ended {} at {}", end.state, end.time.format("%H:%M:%S%.3f")),
                None => "never ended".to_owned(),
            };
            v(
                &mut out,
                "key-order",
                first.at,
                [b, a],
                format!(
                    "key {}: job {b} (acknowledged by {}) tried at {}; job {a} before it \
                     (acknowledged by {}) {what}",
                    seq.key,
                    via(b),
                    first.at.format("%H:%M:%S%.3f"),
                    via(a)
                ),
            );
        }
    }

    // Alone: every request that reached the endpoint was listed as begun, with its attempt
    // number, by a commit of the JobDB (durable before it was sent, fenced), whichever commit
    // began it: its own, or the one that ended the job before it in its key.
    if let Some(listed) = i.listed {
        for a in i.arrivals {
            let Ok(id) = a.job.parse::<JobId>() else {
                continue;
            };
            if i.stored.contains_key(&id) && !listed.contains(&(id, a.attempt)) {
                v(
                    &mut out,
                    "unlisted",
                    a.at,
                    Some(id),
                    format!(
                        "job {id} arrived (attempt {}, {}) but no commit lists that attempt as begun",
                        a.attempt, a.path
                    ),
                );
            }
        }
    }

    // Alone: the writer's book of its sequences never names a head the JobDB does not hold
    // waiting (kill -9, commit faults, commands, expiry, blocks and their release all leave it
    // right).
    if let Some(r) = i.remembered {
        (tally.released, tally.kept, tally.spilled) = (r.released, r.kept, r.spilled);
        if r.wrong > 0 {
            v(
                &mut out,
                "misremembered",
                now,
                None,
                format!(
                    "the writer's book named {} of {} heads that were not held",
                    r.wrong, r.released
                ),
            );
        }
        // Keys with several jobs waiting wait in the book (kept): with no job kept, the key
        // order, expiry and command checks above would not have met that path at all.
        if tally.ordered_jobs >= 100 && r.kept == 0 {
            v(
                &mut out,
                "kept",
                now,
                None,
                format!(
                    "{} ordered jobs and none kept in the writer's book: the path was not run",
                    tally.ordered_jobs
                ),
            );
        }
    }

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
                &mut out,
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
                    &mut out,
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
                &mut out,
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
                &mut out,
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
                    &mut out,
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
                &mut out,
                "invented",
                now,
                None,
                format!("a notice about {of}, no job of ours"),
            );
        }
    }

    // The API agrees with SQL.
    for (id, s) in i.stored.iter().filter(|(id, s)| {
        ours.contains(id)
            && !s
                .job
                .idempotency_key
                .as_deref()
                .unwrap_or("")
                .starts_with("notice:")
    }) {
        let Some((status, state)) = i.api.get(id) else {
            continue;
        };
        tally.api_checked += 1;
        let Some(end_place) = s
            .places
            .iter()
            .find(|p| p.history.iter().any(|t| is_end(t.state)))
        else {
            // Never ended: reported as such.
            continue;
        };
        let end_place = Some(end_place);
        let sql = end_place
            .and_then(|p| p.history.last())
            .map(|t| t.state.as_str());
        match (*status, state.as_deref(), sql) {
            (200, Some(api), Some(sql)) if api == sql => {}
            (200, Some("archiving"), Some("archived"))
            | (200, Some("archived"), Some("archiving")) => {}
            (404, _, _) if end_place.is_none_or(|p| !i.active.contains(&p.jobdb)) => {}
            (status, api, sql) => v(
                &mut out,
                "api",
                now,
                Some(*id),
                format!("job {id}: the API answers {status} {api:?}, SQL says {sql:?}"),
            ),
        }
    }

    // The listing at the end holds exactly the jobs of the JobDBs Directors serve, once each,
    // in id order, in the state SQL says.
    match i.listing {
        Err(why) => v(
            &mut out,
            "list",
            now,
            None,
            format!("the final listing failed: {why}"),
        ),
        Ok(listed) => {
            tally.listed = listed.len();
            if let Some(w) = listed.windows(2).find(|w| w[0].0 >= w[1].0) {
                let what = format!("{} listed after {} (oldest first)", w[1].0, w[0].0);
                v(&mut out, "list", now, w[1].0.parse().ok(), what);
            }
            let by_id: HashMap<&str, &str> = listed
                .iter()
                .map(|(id, s)| (id.as_str(), s.as_str()))
                .collect();
            for (id, s) in i.stored {
                let Some(place) = s.places.iter().find(|p| i.active.contains(&p.jobdb)) else {
                    continue;
                };
                let sql = place.history.last().map(|t| t.state.as_str());
                match (by_id.get(id.to_string().as_str()), sql) {
                    (Some(api), Some(sql)) if *api == sql => {}
                    (Some(&"archived"), Some("archiving"))
                    | (Some(&"archiving"), Some("archived")) => {}
                    (listed, sql) => v(
                        &mut out,
                        "list",
                        now,
                        Some(*id),
                        format!(
                            "job {id} of {}: listed as {listed:?}, SQL says {sql:?}",
                            place.jobdb
                        ),
                    ),
                }
            }
            for (id, _) in listed {
                let held = id
                    .parse::<JobId>()
                    .ok()
                    .and_then(|j| i.stored.get(&j))
                    .is_some_and(|s| s.places.iter().any(|p| i.active.contains(&p.jobdb)));
                if !held {
                    v(
                        &mut out,
                        "list",
                        now,
                        id.parse().ok(),
                        format!("job {id} listed, held by no served JobDB"),
                    );
                }
            }
        }
    }

    // Readiness: ready exactly when it accepts.
    let mut by_director: BTreeMap<&str, Vec<&super::record::ReadySample>> = BTreeMap::new();
    for r in &log.readiness {
        by_director.entry(r.director.as_str()).or_default().push(r);
        tally.readiness_samples += 1;
    }
    for (director, samples) in by_director {
        // A stretch of samples that answered ready yet took no job (refused, or no answer in
        // 3 s), or answered not ready yet took one: two in a row spanning 2 s or more.
        let mut stretch: Option<(DateTime<Utc>, usize, bool)> = None;
        for s in samples {
            let ready = s.ready_before && s.ready_after;
            let not_ready = !s.ready_before && !s.ready_after;
            let odd = if ready && s.accepted != Some(true) {
                Some(true)
            } else if not_ready && s.accepted == Some(true) {
                Some(false)
            } else {
                None
            };
            stretch = match (stretch, odd) {
                (Some((from, n, kind)), Some(k)) if k == kind => Some((from, n + 1, kind)),
                (_, Some(k)) => Some((s.at, 1, k)),
                (_, None) => None,
            };
            if let Some((from, n, kind)) = stretch {
                if n >= 2 && s.at - from >= Duration::seconds(2) {
                    let span = format!(
                        "from {} to {} ({n} samples)",
                        from.format("%H:%M:%S%.3f"),
                        s.at.format("%H:%M:%S%.3f")
                    );
                    let what = if kind {
                        format!(
                            "{director} answered /readyz 200 {span} but took no job (last: {:?})",
                            s.accepted
                        )
                    } else {
                        format!("{director} answered /readyz 503 {span} but took jobs")
                    };
                    v(&mut out, "readiness", from, None, what);
                    stretch = None;
                }
            }
        }
    }
    events::events(i, &mut out, &mut tally);
    traces::traces(i, &mut out, &mut tally);
    payloads::payloads(i, &mut out, &mut tally);
    settles::settles(i, &mut out, &mut tally);
    parks::parks(i, &mut out, &mut tally);
    erasure::erasures(i, &mut out, &mut tally);
    (out, tally)
}
