//! The recorder: every operation, every submission and its answer, every job acknowledged
//! (with its place in its key's acknowledged order), readiness samples, the windows in which a
//! crash allows a duplicate delivery, and the violations found while the run goes on. The
//! endpoints' arrivals are recorded by [`super::endpoint::Endpoint`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use spindle::job::JobId;

/// A sequence: the jobs of one bucket, endpoint and ordering key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqKey {
    pub bucket: String,
    pub endpoint: String,
    pub key: String,
}

/// One job as the producer wrote it; resubmissions send the same JSON (same idempotency key).
#[derive(Clone, Debug)]
pub struct Spec {
    /// Unique per logical job: its idempotency key.
    pub key: String,
    pub json: serde_json::Value,
    pub seq: Option<SeqKey>,
    pub deliver_at: Option<DateTime<Utc>>,
}

/// What a producer learnt of one submission of one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted(String),
    Duplicate(String),
    /// `pending` or `failed` from a router, or a 503/4xx for the whole request: nothing stored.
    NotStored(String),
    /// A transport error or a timeout: it may or may not be stored.
    Unknown(String),
}

/// An acknowledged job.
#[derive(Clone, Debug)]
pub struct Accepted {
    pub id: JobId,
    pub spec_key: String,
    pub seq: Option<SeqKey>,
    pub at: DateTime<Utc>,
    pub expire_at: Option<DateTime<Utc>>,
    pub deliver_at: Option<DateTime<Utc>>,
    /// Which front took it (`router0`, `director1`, ...).
    pub via: String,
}

/// One readiness sample of a Director: `/readyz` before and after a probe submission, and
/// whether the probe was accepted (None: no answer within the timeout).
#[derive(Clone, Debug)]
pub struct ReadySample {
    pub director: String,
    pub at: DateTime<Utc>,
    pub ready_before: bool,
    pub accepted: Option<bool>,
    pub ready_after: bool,
}

/// A broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    pub invariant: &'static str,
    pub at: DateTime<Utc>,
    /// The jobs it names (a `key-order` violation names both), each printed with its
    /// history in every place.
    pub jobs: Vec<JobId>,
    pub what: String,
}

#[derive(Default)]
pub struct Log {
    pub ops: Vec<(DateTime<Utc>, String)>,
    pub specs: HashMap<String, Spec>,
    /// Per spec key: every outcome, with the front it went through.
    pub outcomes: HashMap<String, Vec<(String, Outcome)>>,
    pub accepted: BTreeMap<JobId, Accepted>,
    /// Each sequence's jobs in the order they were acknowledged to their (sequential) producer.
    pub sequences: BTreeMap<SeqKey, Vec<JobId>>,
    /// Ordered jobs whose submission's outcome is unknown (direct to a Director): if stored,
    /// they are their key's last job (the producer moved to a new key).
    pub uncertain: HashMap<String, SeqKey>,
    pub readiness: Vec<ReadySample>,
    /// Times when a crash (kill -9, a JobDB outage) may let an attempt's request be sent again.
    pub crashes: Vec<(DateTime<Utc>, String)>,
    /// JobDB outages (global read locks on the private server): from, and until when over.
    pub outages: Vec<(DateTime<Utc>, Option<DateTime<Utc>>)>,
    /// Directors down (killed, or stopped to join again): which, from, and until when it
    /// answered `/readyz` again. Its JobDB has no owner meanwhile (a kill -9 leaves it so
    /// until the lock's session and lock-delay run out).
    pub downs: Vec<(String, DateTime<Utc>, Option<DateTime<Utc>>)>,
    pub live: Vec<Violation>,
    pub requests: usize,
    /// Events no subscription wants, acknowledged with an id: (key, front, event id).
    pub kept: Vec<(String, String, String)>,
    /// Keys a producer stopped sending after too many tries that stored nothing: when.
    pub gave_up: Vec<(String, DateTime<Utc>)>,
    /// Lanes parked, as the sampler of park records saw them.
    pub parks: Vec<super::parks::Parked>,
    /// `spindle erase` runs, as their receipts tell.
    pub erasures: Vec<Erasure>,
}

/// One run of `spindle erase`.
#[derive(Clone, Debug)]
pub struct Erasure {
    pub bucket: String,
    /// Jobs created before this are named.
    pub before: DateTime<Utc>,
    /// When the run finished.
    pub finished: DateTime<Utc>,
    /// Whether it said every place was reached and finished (exit 0).
    pub complete: bool,
}

/// The recorder, shared by the producers, the operations and the samplers.
#[derive(Default)]
pub struct Recorder {
    pub log: Mutex<Log>,
}

impl Recorder {
    pub fn op(&self, text: String) {
        self.op_at(Utc::now(), text);
    }

    /// An operation that took effect from `at` (taken before it began).
    pub fn op_at(&self, at: DateTime<Utc>, text: String) {
        println!("histories: {} op {text}", at.format("%H:%M:%S%.3f"));
        self.log.lock().unwrap().ops.push((at, text));
    }

    /// An event no subscription wants was acknowledged with `event_id` through `via`.
    pub fn kept(&self, key: &str, via: &str, event_id: &str) {
        let entry = (key.to_owned(), via.to_owned(), event_id.to_owned());
        self.log.lock().unwrap().kept.push(entry);
    }

    /// A `spindle erase` ran.
    pub fn erased(&self, erasure: Erasure) {
        self.log.lock().unwrap().erasures.push(erasure);
    }

    pub fn crash(&self, what: String) {
        self.log.lock().unwrap().crashes.push((Utc::now(), what));
    }

    /// kill -9 of a Director: a crash, and it is down until it is ready again.
    pub fn killed(&self, director: &str) {
        self.crash(format!("kill -9 {director}"));
        self.down(director);
    }

    /// A Director is down from now until a readiness sample finds it ready.
    pub fn down(&self, director: &str) {
        self.log
            .lock()
            .unwrap()
            .downs
            .push((director.to_owned(), Utc::now(), None));
    }

    /// A JobDB outage begins (`true`) or ends.
    pub fn outage(&self, begins: bool) {
        let now = Utc::now();
        let mut log = self.log.lock().unwrap();
        match begins {
            true => log.outages.push((now, None)),
            false => {
                if let Some((_, until)) = log.outages.last_mut() {
                    until.get_or_insert(now);
                }
            }
        }
    }

    /// How long, between `from` and `to`, a JobDB could not be written or some Director was
    /// down (its JobDB without an owner): the time an expiry may wait for.
    pub fn stalled_time(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> chrono::Duration {
        let log = self.log.lock().unwrap();
        let downs = log.downs.iter().map(|(_, start, until)| (*start, *until));
        covered(log.outages.iter().copied().chain(downs), from, to)
    }

    pub fn spec(&self, spec: &Spec) {
        self.log
            .lock()
            .unwrap()
            .specs
            .entry(spec.key.clone())
            .or_insert_with(|| spec.clone());
    }

    pub fn request(&self) {
        self.log.lock().unwrap().requests += 1;
    }

    /// Records what a submission of `spec` through `via` came to. Returns the id when stored.
    pub fn outcome(
        &self,
        spec: &Spec,
        via: &str,
        outcome: Outcome,
        answer: Option<&spindle_client::AcceptedJob>,
    ) {
        let mut log = self.log.lock().unwrap();
        if let (Outcome::Accepted(id), Some(answer)) = (&outcome, answer) {
            let id: JobId = id.parse().expect("a job id");
            if let Some(seq) = &spec.seq {
                log.sequences.entry(seq.clone()).or_default().push(id);
            }
            log.accepted.insert(
                id,
                Accepted {
                    id,
                    spec_key: spec.key.clone(),
                    seq: spec.seq.clone(),
                    at: Utc::now(),
                    expire_at: answer.expire_at,
                    deliver_at: answer.deliver_at.or(spec.deliver_at),
                    via: via.to_owned(),
                },
            );
        }
        if let (Outcome::Unknown(_), Some(seq)) = (&outcome, &spec.seq) {
            if !via.starts_with("router") {
                log.uncertain.insert(spec.key.clone(), seq.clone());
            }
        }
        log.outcomes
            .entry(spec.key.clone())
            .or_default()
            .push((via.to_owned(), outcome));
    }

    pub fn ready(&self, sample: ReadySample) {
        let mut log = self.log.lock().unwrap();
        if sample.ready_before {
            for (director, start, until) in log.downs.iter_mut() {
                if *director == sample.director && until.is_none() && *start <= sample.at {
                    *until = Some(sample.at);
                }
            }
        }
        log.readiness.push(sample);
    }

    pub fn violation(&self, v: Violation) {
        let mut log = self.log.lock().unwrap();
        if log
            .live
            .iter()
            .filter(|l| l.invariant == v.invariant)
            .count()
            < 5
        {
            println!(
                "histories: VIOLATION {} at {}: {}",
                v.invariant,
                v.at.format("%H:%M:%S%.3f"),
                v.what
            );
        }
        log.live.push(v);
    }

    /// A recently acknowledged job, for an operator command to name (None before any).
    pub fn recent_job(&self, pick: usize, ordered: bool) -> Option<JobId> {
        let log = self.log.lock().unwrap();
        let recent: Vec<&Accepted> = log
            .accepted
            .values()
            .rev()
            .filter(|a| !ordered || a.seq.is_some())
            .take(40)
            .collect();
        (!recent.is_empty()).then(|| recent[pick % recent.len()].id)
    }
}

/// How much of `from`..`to` the windows (from, until when over) cover, overlaps counted once.
fn covered(
    windows: impl Iterator<Item = (DateTime<Utc>, Option<DateTime<Utc>>)>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> chrono::Duration {
    let mut clipped: Vec<(DateTime<Utc>, DateTime<Utc>)> = windows
        .map(|(start, until)| (start.max(from), until.unwrap_or(to).min(to)))
        .filter(|(start, until)| start < until)
        .collect();
    clipped.sort();
    let mut total = chrono::Duration::zero();
    let mut reach: Option<DateTime<Utc>> = None;
    for (start, until) in clipped {
        let start = reach.map_or(start, |r| start.max(r));
        if until > start {
            total += until - start;
        }
        reach = Some(reach.map_or(until, |r| r.max(until)));
    }
    total
}
