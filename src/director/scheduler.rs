//! The scheduler: the Director's in-memory cache of unfinished jobs and its virtual queues.
//!
//! Design, after Centrifuge's "virtual queues":
//! - Every unfinished job of the JobDB is cached here; a job leaves the cache when it reaches a
//!   terminal state (or `archiving`, which the archive takes over).
//! - Ready jobs wait in a FIFO per (endpoint, bucket). Each endpoint is a *lane*: at most
//!   `per_endpoint` HTTP requests in flight, plus a window of as many attempts whose `executing`
//!   rows are being committed, so commit latency overlaps delivery instead of idling the
//!   endpoint's slots. Lanes with a ready job and room in that window sit in a ring.
//! - Picking takes one job from the lane at the head of the ring, from the lane's next bucket
//!   (round-robin), and moves both to the back: endpoints share the Director fairly, and
//!   buckets share an endpoint fairly. A hanging endpoint only fills its own slots.
//! - Jobs waiting for a retry sit in a timer heap keyed by `min(retry_at, expire_at)`. A job
//!   whose wait is at least `spill_after` keeps only its metadata in memory (its payload and
//!   headers are dropped) and is read back from the JobDB, in batches, when it comes due: an
//!   outage's backlog of retries costs metadata, not payloads.
//! - The cache holds at most `max_cached_jobs` entries. Beyond that, new jobs stay in the
//!   JobDB only and the cache reads them back in pages, in id order, as room appears (a
//!   *backlog pass*); when it is full, jobs waiting far in the future (beyond `spill_after`)
//!   are evicted and read back shortly before they are due. Each page's read starts after a
//!   writer barrier and skips jobs that changed since, so a job that finished never comes back.
//! - Before an attempt starts, its `executing` row is committed (batched with the others picked
//!   at the same time), so a fenced-out Director cannot start deliveries, and after a crash the
//!   attempts that were in flight are known.
//!
//! Everything here runs on one task and owns its state: no locks.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::delivery::classify::Verdict;
use crate::delivery::{backoff, AttemptResult, Deliverer};
use crate::job::{Job, JobId, Progress, State, Transition};
use crate::jobdb::commands::{Action, Command};
use crate::jobdb::JobDb;
use crate::metrics::Metrics;
use crate::registry::controls::Controls;

use super::breaker::{Allowance, Breaker, BreakerConfig, Change};
use super::writer::{WriteOp, WriteRejected};

/// How long a job waits before it is tried again when its `executing` row was refused by the
/// JobDB (a bug, not a condition that passes by itself): long enough not to loop.
const REFUSED_START_PAUSE: Duration = Duration::from_secs(60);

/// Something the scheduler must react to.
#[derive(Debug)]
pub enum Event {
    /// New jobs, durable in the JobDB.
    Accepted(Vec<Arc<Job>>),
    /// Jobs imported from a retired JobDB, durable in this one.
    Imported(Vec<Recovered>),
    /// The `executing` rows of these jobs are durable: deliver them now.
    Started(Vec<JobId>),
    /// The `executing` rows of these jobs could not be written.
    StartFailed(Vec<JobId>, WriteRejected),
    /// Spilled jobs read back from the JobDB (with the ids that were asked for).
    Reloaded(Vec<Job>, Vec<JobId>),
    /// Reading spilled jobs back failed; they are tried again shortly.
    ReloadFailed(Vec<JobId>),
    /// A page of the backlog (jobs in the JobDB but not in the cache), read with `limit`.
    BacklogPage {
        /// The jobs, without payloads; `None` if the read failed.
        jobs: Option<Vec<(Job, Progress)>>,
        /// The most the page could hold: fewer means the pass reached the end.
        limit: usize,
        /// For a last page read up to a horizon: when the first job beyond it comes due.
        next_due: Option<DateTime<Utc>>,
    },
    /// An operator command appended to the JobDB, to apply.
    Command(Box<Command>),
    /// The endpoint and bucket controls in force now (from the registry).
    Controls(Arc<Controls>),
    /// The jobs in the JobDB a command names (`None` if the read failed).
    CommandTargets {
        /// The command.
        command: Box<Command>,
        /// Waiting jobs it names, with their progress.
        targets: Option<Vec<(JobId, Progress)>>,
    },
    /// An attempt ended.
    Finished {
        /// The job.
        id: JobId,
        /// What happened.
        result: Box<AttemptResult>,
    },
}

/// Bounds of the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerLimits {
    /// Attempts in flight across all endpoints.
    pub max_in_flight: usize,
    /// Attempts in flight per endpoint.
    pub per_endpoint: usize,
    /// Most attempts started by one `executing` batch.
    pub start_batch: usize,
    /// Longest backoff between two attempts.
    pub backoff_cap: Duration,
    /// How long a stopping scheduler waits for attempts in flight.
    pub shutdown_grace: Duration,
    /// Waits at least this long drop the job's payload from memory until it is due.
    pub spill_after: Duration,
    /// Most payload and header bytes held in memory: beyond it, newly cached jobs keep only
    /// their metadata and are read back from the JobDB when their turn comes.
    pub max_cached_bytes: usize,
    /// Most jobs in the cache: beyond it, jobs wait in the JobDB only.
    pub max_cached_jobs: usize,
    /// When an endpoint's circuit breaker opens, and how it probes.
    pub breaker: BreakerConfig,
    /// Most attempts of one job: a retryable failure of the last one discards the job
    /// (`error_type` `max-attempts`). At most `u16::MAX`, the column's range.
    pub max_attempts: u16,
    /// Shortest wait between two attempts of a job, whatever its policy or the endpoint's
    /// `Retry-After` say.
    pub min_retry_delay: Duration,
}

/// Unfinished jobs that are in the JobDB but maybe not in the cache, and the pass that reads
/// them in.
///
/// A pass reads pages in id order. With room in the cache (less than half full) it reads every
/// waiting job, whenever due; otherwise only those due within the horizon (`spill_after`), and
/// when it reaches the end it asks the JobDB when the first job beyond the horizon comes due
/// and looks again shortly before then. So a job waiting in the JobDB only (after a restart, a
/// takeover, an eviction, an import into a full cache) is read in before it is due or expires,
/// however far ahead that is.
#[derive(Default)]
struct Backlog {
    /// Some unfinished jobs may be in the JobDB only.
    pending: bool,
    /// The last job id the current pass has read; `None` before its first page.
    cursor: Option<JobId>,
    /// The current pass reads every waiting job, not only those due within the horizon.
    whole: bool,
    /// A job was left out of the cache since the pass began: go round again.
    again: bool,
    /// A page is being read.
    loading: bool,
    /// Jobs that left the cache since the page's barrier was sent: its read may predate it.
    left: HashSet<JobId>,
    /// No pass before this instant (the next one is planned for then).
    wake: Option<Instant>,
    /// No read of the JobDB before this instant (the last one failed).
    pause: Option<Instant>,
    /// Look at a full cache again at this instant (eviction is due again).
    recheck: Option<Instant>,
    /// When waiting entries were last looked over for eviction.
    evicted_at: Option<Instant>,
}

/// Where a job is, with respect to delivery.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Out of every queue and timer for a moment: just cached, or just taken from its queue;
    /// the code at hand gives it its next phase.
    Unplaced,
    /// In its lane's queue.
    Ready,
    /// Waiting for its timer.
    Waiting { due: Instant },
    /// Its `executing` row is being written.
    Starting,
    /// Its attempt is in flight.
    InFlight,
    /// Due, its payload being read back from the JobDB.
    Reloading,
    /// At the head of its queue, its payload being read back (it was cached over budget).
    Fetching,
    /// Due, but its bucket is paused: out of the queues until it is resumed.
    Parked,
}

struct Entry {
    job: Arc<Job>,
    /// When it expires, on the scheduler's clock: ready and parked jobs are indexed by it.
    deadline: Instant,
    /// Which of its queue slots is live: a job leaving its queue other than by being picked
    /// leaves its slot behind, skipped when reached (O(1) removal from the middle).
    ticket: u32,
    /// A discard or flush that named the job while an attempt was under way: applied if
    /// the attempt ends in a retry.
    doomed: Option<Arc<Command>>,
    /// When its last attempt failed into the wait it is in (`None`: not waiting on its own
    /// failure, e.g. postponed by an operator or read in from the JobDB).
    failed_at: Option<Instant>,
    /// The payload and headers were dropped from memory; read the job back before delivering.
    spilled: bool,
    /// The job's lane (its endpoint without query), computed once.
    lane: Arc<str>,
    attempts: u16,
    phase: Phase,
}

impl Backlog {
    /// Jobs due now wait in the JobDB only: a pass must find them soon, whatever was planned.
    fn due_now(&mut self) {
        self.pending = true;
        self.again = true;
        self.wake = None;
    }
}

impl Entry {
    fn new(job: Arc<Job>, attempts: u16) -> Self {
        Entry {
            deadline: deadline_of(job.expire_at),
            ticket: 0,
            doomed: None,
            failed_at: None,
            lane: job.endpoint_key().into(),
            spilled: false,
            job,
            attempts,
            phase: Phase::Unplaced,
        }
    }
}

/// The queues of one endpoint.
#[derive(Default)]
struct Lane {
    /// Attempts whose `executing` rows are being written.
    starting: usize,
    /// Attempts whose `executing` rows are durable, waiting for an HTTP slot.
    started: VecDeque<JobId>,
    /// HTTP requests in flight.
    in_flight: usize,
    /// Jobs taken from the head of the queue whose payload is being read back.
    fetching: usize,
    /// Live slots in the queues (slots of jobs that left are not counted).
    ready: usize,
    /// A queue per bucket of slots `(job, ticket)`.
    queues: HashMap<Arc<str>, VecDeque<(JobId, u32)>>,
    buckets: VecDeque<Arc<str>>,
    listed: bool,
    /// A lane timer is set for this instant (its breaker's next probe).
    wake_at: Option<Instant>,
}

/// A job recovered from the JobDB after a restart.
#[derive(Debug)]
pub struct Recovered {
    /// The job.
    pub job: Arc<Job>,
    /// Attempts started so far.
    pub attempts: u16,
    /// When its next attempt is due (`None`: now).
    pub retry_at: Option<DateTime<Utc>>,
}

/// The scheduler task's state.
pub struct Scheduler {
    jobs: HashMap<JobId, Entry>,
    lanes: HashMap<Arc<str>, Lane>,
    ring: VecDeque<Arc<str>>,
    timers: BinaryHeap<Reverse<(Instant, JobId)>>,
    in_flight: usize,
    limits: SchedulerLimits,
    writer: mpsc::Sender<WriteOp>,
    deliverer: Deliverer,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    metrics: Arc<Metrics>,
    /// For reading spilled jobs back (never for writing).
    db: JobDb,
    /// Entries whose payload is not in memory.
    spilled: usize,
    /// Payload and header bytes of the entries that are not spilled.
    cached_bytes: usize,
    /// Rows waiting to go to the writer, in the order they happened. Only this task sends
    /// them, so a job's rows reach the writer (and get their ids) in order.
    outbox: Vec<Transition>,
    /// Told the ids of jobs that expired (the archiver takes them from `archiving`).
    expired_tx: Option<mpsc::UnboundedSender<Vec<JobId>>>,
    backlog: Backlog,
    /// Operator commands waiting to be applied, oldest first.
    commands: VecDeque<Command>,
    /// Commands applied whose transitions are on their way to the JobDB: (id, jobs changed).
    applied: Vec<(u64, u64)>,
    /// Who applies commands (the Director's holder name), for their results.
    holder: Arc<str>,
    /// Circuit breakers by lane; they outlive idle lanes (a down endpoint's jobs may all be
    /// waiting on timers) and are forgotten a while after their last outcome.
    breakers: HashMap<Arc<str>, (Breaker, Instant)>,
    /// When each open breaker opened.
    opened_at: HashMap<Arc<str>, Instant>,
    /// When breakers were last pruned.
    breakers_pruned: Instant,
    /// Lanes to look at again at an instant (a breaker's next probe, a rate limit's token).
    lane_timers: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
    /// Endpoint and bucket controls in force.
    controls: Arc<Controls>,
    /// Due jobs of paused buckets, by bucket (ids of jobs that left since are skipped).
    parked: HashMap<Arc<str>, Vec<JobId>>,
    /// Jobs in the `Parked` phase.
    parked_count: usize,
    /// Ready and parked jobs by deadline: held queues (paused, breaker open, rate-limited)
    /// expire their jobs on time without being walked.
    queued_by_deadline: BTreeSet<(Instant, JobId)>,
    /// Request-rate token buckets of rate-limited lanes: tokens, and when last refilled.
    rates: HashMap<Arc<str>, (f64, Instant)>,
    /// When the queue-depth gauges were last computed.
    gauges_at: Instant,
    /// Something changed since: compute them again a second after the last time.
    gauges_stale: bool,
    /// Endpoint health for `GET /v1/endpoints`, refreshed with the gauges.
    health: Arc<std::sync::Mutex<Vec<crate::rpc::api::EndpointHealth>>>,
}

impl Scheduler {
    /// A scheduler fed by `events`, writing through `writer`.
    pub fn new(
        limits: SchedulerLimits,
        writer: mpsc::Sender<WriteOp>,
        deliverer: Deliverer,
        events_tx: mpsc::UnboundedSender<Event>,
        events: mpsc::UnboundedReceiver<Event>,
        metrics: Arc<Metrics>,
        db: JobDb,
    ) -> Self {
        Scheduler {
            jobs: HashMap::new(),
            lanes: HashMap::new(),
            ring: VecDeque::new(),
            timers: BinaryHeap::new(),
            in_flight: 0,
            limits,
            writer,
            deliverer,
            events_tx,
            events,
            metrics,
            db,
            spilled: 0,
            cached_bytes: 0,
            outbox: Vec::new(),
            expired_tx: None,
            // The JobDB may hold unfinished jobs: the first pass reads them in.
            backlog: Backlog {
                pending: true,
                ..Backlog::default()
            },
            commands: VecDeque::new(),
            applied: Vec::new(),
            holder: "director".into(),
            breakers: HashMap::new(),
            opened_at: HashMap::new(),
            breakers_pruned: Instant::now(),
            lane_timers: BinaryHeap::new(),
            controls: Arc::default(),
            parked: HashMap::new(),
            parked_count: 0,
            queued_by_deadline: BTreeSet::new(),
            rates: HashMap::new(),
            gauges_at: Instant::now(),
            gauges_stale: true,
            health: Arc::default(),
        }
    }

    /// Where the scheduler publishes its endpoints' health (once a second).
    pub fn health(&self) -> Arc<std::sync::Mutex<Vec<crate::rpc::api::EndpointHealth>>> {
        self.health.clone()
    }

    /// Names this Director in the results of the operator commands it applies.
    pub fn applied_by(&mut self, holder: &str) {
        self.holder = holder.into();
    }

    /// Tells `archiver` the ids of the jobs that expire from now on.
    pub fn archive_to(&mut self, archiver: mpsc::UnboundedSender<Vec<JobId>>) {
        self.expired_tx = Some(archiver);
    }

    fn expired(&self, ids: Vec<JobId>) {
        if let Some(tx) = &self.expired_tx {
            let _ = tx.send(ids);
        }
    }

    /// Seeds the cache with jobs recovered from the JobDB.
    pub fn recover(&mut self, recovered: Vec<Recovered>) {
        for r in recovered {
            self.admit_at(Entry::new(r.job, r.attempts), r.retry_at);
        }
        self.metrics.jobs_cached.set(self.jobs.len() as i64);
    }

    /// Runs until `shutdown`, then lets attempts in flight finish (up to the grace period) and
    /// hands their outcomes to the writer before returning.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut stopping_at: Option<Instant> = None;
        // Recovered jobs that are already due wait for no event: start them now.
        self.pump().await;
        self.flush().await;
        self.load_backlog().await;
        loop {
            let next_timer = [
                self.timers.peek().map(|Reverse((due, _))| *due),
                self.lane_timers.peek().map(|Reverse((due, _))| *due),
                self.queued_by_deadline.first().map(|(at, _)| *at),
                self.gauges_stale
                    .then(|| self.gauges_at + Duration::from_secs(1)),
            ]
            .into_iter()
            .flatten()
            .min();
            let backlog_wake = [self.backlog.wake, self.backlog.recheck, self.backlog.pause]
                .into_iter()
                .flatten()
                .min();
            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if stopping_at.is_none() => {
                    stopping_at = Some(Instant::now() + self.limits.shutdown_grace);
                    tracing::info!(in_flight = self.in_flight, "scheduler stopping: no new attempts");
                }
                Some(event) = self.events.recv() => {
                    self.handle(event);
                    for _ in 0..1024 {
                        match self.events.try_recv() {
                            Ok(event) => self.handle(event),
                            Err(_) => break,
                        }
                    }
                }
                _ = tokio::time::sleep_until(next_timer.unwrap_or_else(Instant::now)), if next_timer.is_some() && stopping_at.is_none() => {
                    self.fire_timers();
                }
                _ = tokio::time::sleep_until(backlog_wake.unwrap_or_else(Instant::now)), if backlog_wake.is_some() && stopping_at.is_none() => {
                    let now = Instant::now();
                    self.backlog.wake = self.backlog.wake.filter(|at| *at > now);
                    self.backlog.recheck = self.backlog.recheck.filter(|at| *at > now);
                    self.backlog.pause = self.backlog.pause.filter(|at| *at > now);
                }
                _ = tokio::time::sleep_until(stopping_at.unwrap_or_else(Instant::now)), if stopping_at.is_some() => {
                    tracing::warn!(in_flight = self.in_flight, "grace period over; attempts still in flight will be recovered as interrupted");
                    break;
                }
            }
            if stopping_at.is_none() {
                self.pump().await;
            }
            self.flush().await;
            self.record_applied().await;
            self.update_gauges();
            if stopping_at.is_none() {
                self.load_backlog().await;
            }
            if stopping_at.is_some() && self.in_flight == 0 {
                break;
            }
        }
        self.flush().await;
    }

    /// Hands queued rows to the writer, in order, in one request.
    async fn flush(&mut self) {
        if self.outbox.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut self.outbox);
        if self
            .writer
            .send(WriteOp::Transitions { rows, done: None })
            .await
            .is_err()
        {
            tracing::warn!(
                "writer gone; transitions not recorded will be recovered from the jobdb"
            );
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Accepted(jobs) => {
                for job in jobs {
                    #[cfg(feature = "fault-injection")]
                    crate::faults::on_accepted(&job.bucket);
                    let id = job.id;
                    if self.admit(Entry::new(job, 0)) {
                        self.enqueue(id);
                    }
                }
                self.metrics.jobs_cached.set(self.jobs.len() as i64);
            }
            Event::Imported(jobs) => self.recover(jobs),
            Event::Started(ids) => {
                let mut lanes = Vec::new();
                for id in ids {
                    let Some(key) = self.lane_of(id) else {
                        continue;
                    };
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.starting -= 1;
                        lane.started.push_back(id);
                    }
                    lanes.push(key);
                }
                lanes.dedup();
                for key in lanes {
                    self.dispatch(&key);
                }
            }
            Event::StartFailed(ids, why) => {
                let refused = matches!(why, WriteRejected::Refused { .. });
                if refused {
                    tracing::error!(
                        jobs = ids.len(),
                        "the jobdb refused attempts' rows; trying these jobs again later"
                    );
                } else {
                    tracing::warn!(jobs = ids.len(), reason = %why, "could not record attempts; not starting them");
                }
                let later = Instant::now() + REFUSED_START_PAUSE;
                for id in ids {
                    let Some(key) = self.lane_of(id) else {
                        continue;
                    };
                    self.in_flight -= 1;
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.starting -= 1;
                    }
                    if let Some(entry) = self.jobs.get_mut(&id) {
                        entry.attempts = entry.attempts.saturating_sub(1);
                    }
                    if refused {
                        self.wait(id, later);
                        self.relist(&key);
                    } else {
                        self.enqueue(id);
                    }
                }
                self.metrics.in_flight.set(self.in_flight as i64);
            }
            Event::Reloaded(jobs, asked) => {
                let now = Instant::now();
                let mut found = std::collections::HashSet::with_capacity(jobs.len());
                for job in jobs {
                    found.insert(job.id);
                    let id = job.id;
                    if let Some(entry) = self
                        .jobs
                        .get_mut(&id)
                        .filter(|e| matches!(e.phase, Phase::Reloading | Phase::Fetching))
                    {
                        // A job fetched at the head of its queue goes back to the head; a
                        // retry that came due joins the back like any other.
                        let fetched = entry.phase == Phase::Fetching;
                        if fetched {
                            if let Some(lane) = self.lanes.get_mut(&entry.lane) {
                                lane.fetching -= 1;
                            }
                        }
                        self.cached_bytes += weight(&job);
                        entry.job = Arc::new(job);
                        entry.spilled = false;
                        self.spilled -= 1;
                        self.enqueue_at(id, fetched);
                    }
                }
                self.metrics
                    .cached_payload_bytes
                    .set(self.cached_bytes as i64);
                for id in asked.into_iter().filter(|id| !found.contains(id)) {
                    tracing::error!(job = %id, "spilled job missing from the jobdb; trying again");
                    self.unfetch(id);
                    self.wait(id, now + Duration::from_secs(5));
                }
                self.metrics.jobs_spilled.set(self.spilled as i64);
            }
            Event::ReloadFailed(ids) => {
                let later = Instant::now() + Duration::from_secs(1);
                for id in ids {
                    if self
                        .jobs
                        .get(&id)
                        .is_some_and(|e| matches!(e.phase, Phase::Reloading | Phase::Fetching))
                    {
                        self.unfetch(id);
                        self.wait(id, later);
                    }
                }
            }
            Event::Finished { id, result } => self.finish(id, *result),
            Event::BacklogPage {
                jobs,
                limit,
                next_due,
            } => self.backlog_page(jobs, limit, next_due),
            Event::Command(command) => self.commands.push_back(*command),
            Event::Controls(controls) => self.set_controls(controls),
            Event::CommandTargets { command, targets } => self.apply_command(*command, targets),
        }
    }

    /// Reads due spilled jobs back from the JobDB, in batches, off the scheduler task.
    fn reload(&self, ids: Vec<JobId>) {
        let (db, events) = (self.db.clone(), self.events_tx.clone());
        tokio::spawn(async move {
            for chunk in ids.chunks(1000) {
                let event = match db.get_jobs(chunk).await {
                    Ok(jobs) => Event::Reloaded(jobs, chunk.to_vec()),
                    Err(e) => {
                        tracing::warn!(error = %e, jobs = chunk.len(), "reading spilled jobs back failed");
                        Event::ReloadFailed(chunk.to_vec())
                    }
                };
                let _ = events.send(event);
            }
        });
    }

    /// Starts as many attempts as the limits allow, fairly across lanes and buckets: their
    /// `executing` rows go to the writer, and delivery begins once those are durable.
    async fn pump(&mut self) {
        let now = Utc::now();
        let mut starts = Vec::new();
        let mut reload = Vec::new();
        // Reads of spilled jobs count against the batch too, so a full cache brings back at most
        // a batch of payloads at a time.
        while self.in_flight < self.limits.max_in_flight
            && starts.len() + reload.len() < self.limits.start_batch
        {
            let Some((id, key)) = self.pick() else { break };
            let max_attempts = self.limits.max_attempts;
            match self.jobs.get_mut(&id) {
                Some(entry) if entry.job.expire_at <= now => self.expire(id, now),
                // A discard or flush named it during an attempt that ended in a retry.
                Some(entry) if entry.doomed.is_some() => self.end_doomed(id),
                // Its attempts are used up (imported so, or the limit was lowered): it ends
                // without another request, and its count can never wrap.
                Some(entry) if entry.attempts >= max_attempts => {
                    let attempts = entry.attempts;
                    self.forget(id);
                    self.metrics.jobs_out_of_attempts.inc();
                    self.metrics.jobs_cached.set(self.jobs.len() as i64);
                    self.outbox.push(Transition::discarded(
                        id,
                        attempts,
                        now,
                        crate::job::AttemptRecord {
                            error_type: Some(MAX_ATTEMPTS.to_owned()),
                            ..Default::default()
                        },
                    ));
                }
                // Its payload waits in the JobDB (the cache was full): read it back first; it
                // rejoins its queue once loaded.
                Some(entry) if entry.spilled => {
                    entry.phase = Phase::Fetching;
                    reload.push(id);
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.fetching += 1;
                    }
                }
                Some(entry) => {
                    entry.attempts += 1;
                    entry.phase = Phase::Starting;
                    starts.push(Transition::executing(id, entry.attempts, now));
                    self.in_flight += 1;
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.starting += 1;
                    }
                    if let Some((breaker, _)) = self.breakers.get_mut(&key) {
                        if breaker.is_open() {
                            breaker.probe_started();
                        }
                    }
                    if let Some((tokens, _)) = self.rates.get_mut(&key) {
                        *tokens -= 1.0;
                    }
                }
                None => {}
            }
            self.relist(&key);
        }
        if !reload.is_empty() {
            self.reload(reload);
        }
        if starts.is_empty() {
            return;
        }
        self.metrics.in_flight.set(self.in_flight as i64);
        let ids: Vec<JobId> = starts.iter().map(|t| t.job_id).collect();
        let (done, committed) = oneshot::channel();
        // Rows queued before these starts (earlier outcomes) must keep their place.
        let mut rows = std::mem::take(&mut self.outbox);
        rows.extend(starts);
        let events = self.events_tx.clone();
        let sent = self
            .writer
            .send(WriteOp::Transitions {
                rows,
                done: Some(done),
            })
            .await;
        if sent.is_err() {
            let _ = events.send(Event::StartFailed(ids, WriteRejected::LockLost));
            return;
        }
        tokio::spawn(async move {
            let event = match committed.await {
                Ok(Ok(())) => Event::Started(ids),
                Ok(Err(why)) => Event::StartFailed(ids, why),
                Err(_) => Event::StartFailed(ids, WriteRejected::LockLost),
            };
            let _ = events.send(event);
        });
    }

    /// The next job to start (head lane of the ring, its next bucket) and its lane; the job
    /// leaves its queue (phase `Unplaced` until the caller says otherwise). The caller relists
    /// the lane once it has counted the attempt, so a lane is never forgotten while an attempt
    /// of it is being started. Slots of jobs that left are dropped on the way: each is passed
    /// once.
    fn pick(&mut self) -> Option<(JobId, Arc<str>)> {
        let key = self.ring.pop_front()?;
        let lane = self.lanes.get_mut(&key)?;
        lane.listed = false;
        while lane.ready > 0 {
            let bucket = lane.buckets.pop_front()?;
            let Some(queue) = lane.queues.get_mut(&bucket) else {
                continue;
            };
            let mut live = None;
            while let Some((id, ticket)) = queue.pop_front() {
                if let Some(entry) = self
                    .jobs
                    .get_mut(&id)
                    .filter(|e| e.phase == Phase::Ready && e.ticket == ticket)
                {
                    entry.phase = Phase::Unplaced;
                    self.queued_by_deadline.remove(&(entry.deadline, id));
                    live = Some(id);
                    break;
                }
            }
            if queue.is_empty() {
                lane.queues.remove(&bucket);
            } else {
                lane.buckets.push_back(bucket);
            }
            if let Some(id) = live {
                lane.ready -= 1;
                return Some((id, key));
            }
        }
        None
    }

    /// Takes a ready or parked job out of its queue's accounting (its slot stays behind and is
    /// skipped): the caller gives it its next phase.
    fn leave_queue(&mut self, id: JobId) {
        let Some(entry) = self.jobs.get_mut(&id) else {
            return;
        };
        match entry.phase {
            Phase::Ready => {
                self.queued_by_deadline.remove(&(entry.deadline, id));
                entry.phase = Phase::Unplaced;
                let key = entry.lane.clone();
                if let Some(lane) = self.lanes.get_mut(&key) {
                    lane.ready -= 1;
                }
                self.relist(&key);
            }
            Phase::Parked => {
                self.queued_by_deadline.remove(&(entry.deadline, id));
                entry.phase = Phase::Unplaced;
                self.parked_count -= 1;
            }
            _ => {}
        }
    }

    /// Puts a lane back in the ring if it can start something, or forgets an idle lane.
    fn relist(&mut self, key: &Arc<str>) {
        let allowance = self
            .breakers
            .get(key)
            .map_or(Allowance::Full, |(b, _)| b.allowance(Instant::now()));
        let concurrency = self.concurrency(key);
        let paused = concurrency == 0;
        let token_at = self.next_token(key);
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        let pending = lane.starting + lane.started.len() + lane.fetching;
        // A rate-limited lane out of tokens waits for the next one.
        let allowance = match (allowance, token_at) {
            (Allowance::Full | Allowance::Probe, Some(at)) => Allowance::Wait(Some(at)),
            (allowance, _) => allowance,
        };
        let limit = match allowance {
            _ if paused => 0,
            Allowance::Full => concurrency,
            // An open breaker: one probe, when nothing else is under way.
            Allowance::Probe if pending + lane.in_flight == 0 => 1,
            Allowance::Probe | Allowance::Wait(None) => 0,
            Allowance::Wait(Some(at)) => {
                if lane.ready > 0 && lane.wake_at != Some(at) {
                    lane.wake_at = Some(at);
                    self.lane_timers.push(Reverse((at, key.clone())));
                }
                0
            }
        };
        if lane.ready > 0 && pending < limit {
            if !lane.listed {
                lane.listed = true;
                self.ring.push_back(key.clone());
            }
        } else if lane.ready == 0 && pending == 0 && lane.in_flight == 0 && !lane.listed {
            self.lanes.remove(key);
        }
    }

    fn enqueue(&mut self, id: JobId) {
        self.enqueue_at(id, false);
    }

    /// Queues a job in its lane and bucket: at the back, or at the front for a job that was
    /// at the head already and only waited for its payload to be read back.
    fn enqueue_at(&mut self, id: JobId, front: bool) {
        self.leave_queue(id);
        let Some(entry) = self.jobs.get_mut(&id) else {
            return;
        };
        self.queued_by_deadline.insert((entry.deadline, id));
        let bucket = entry.job.bucket.clone();
        if self.controls.bucket_paused(&bucket) {
            entry.phase = Phase::Parked;
            self.parked_count += 1;
            self.parked.entry(bucket).or_default().push(id);
            return;
        }
        entry.phase = Phase::Ready;
        entry.ticket = entry.ticket.wrapping_add(1);
        let ticket = entry.ticket;
        let key = entry.lane.clone();
        // Behind an open breaker the next probe comes from the head of the queue: a job that
        // was tried before goes first, since a job-specific failure of a first attempt is no
        // evidence that the endpoint is still down.
        let front = front
            || (entry.attempts > 0 && self.breakers.get(&key).is_some_and(|(b, _)| b.is_open()));
        let lane = self.lanes.entry(key.clone()).or_default();
        let queue = lane.queues.entry(bucket.clone()).or_default();
        if queue.is_empty() {
            lane.buckets.push_back(bucket);
        }
        if front {
            queue.push_front((id, ticket));
        } else {
            queue.push_back((id, ticket));
        }
        lane.ready += 1;
        self.relist(&key);
    }

    /// Makes a job wait for its timer (leaving its queue if it was in one).
    fn wait(&mut self, id: JobId, due: Instant) {
        self.leave_queue(id);
        if let Some(entry) = self.jobs.get_mut(&id) {
            entry.phase = Phase::Waiting { due };
            self.timers.push(Reverse((due, id)));
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        let wall = Utc::now();
        // Queued jobs whose time ran out while their queue was held (paused, breaker open,
        // rate-limited, bucket paused): a held queue is not picked from, where expiry is
        // usually noticed. Each is found through the deadline index, never by a walk.
        while let Some(&(deadline, id)) = self.queued_by_deadline.first() {
            if deadline > now {
                break;
            }
            self.queued_by_deadline.pop_first();
            let Some(expire_at) = self.jobs.get(&id).map(|e| e.job.expire_at) else {
                continue;
            };
            if expire_at <= wall {
                self.expire(id, wall);
            } else if let Some(entry) = self.jobs.get_mut(&id) {
                // The monotonic clock ran ahead of the wall clock: look again when it is due.
                entry.deadline = now + wait_until(wall, expire_at).max(Duration::from_millis(1));
                self.queued_by_deadline.insert((entry.deadline, id));
            }
        }
        while let Some(Reverse((due, key))) = self.lane_timers.peek().cloned() {
            if due > now {
                break;
            }
            self.lane_timers.pop();
            if let Some(lane) = self.lanes.get_mut(&key) {
                if lane.wake_at == Some(due) {
                    lane.wake_at = None;
                }
            }
            self.relist(&key);
        }
        let mut expired = Vec::new();
        let mut reload = Vec::new();
        while let Some(Reverse((due, id))) = self.timers.peek().copied() {
            if due > now {
                break;
            }
            self.timers.pop();
            let Some(entry) = self.jobs.get(&id) else {
                continue;
            };
            if entry.phase != (Phase::Waiting { due }) {
                continue;
            }
            if entry.job.expire_at <= wall {
                expired.push(id);
            } else if entry.spilled {
                reload.push(id);
            } else {
                self.enqueue(id);
            }
        }
        for id in &reload {
            if let Some(entry) = self.jobs.get_mut(id) {
                entry.phase = Phase::Reloading;
            }
        }
        if !reload.is_empty() {
            self.reload(reload);
        }
        if !expired.is_empty() {
            let removed: Vec<Entry> = expired.iter().filter_map(|id| self.forget(*id)).collect();
            let rows: Vec<Transition> = removed
                .iter()
                .map(|e| Transition::archiving(e.job.id, e.attempts, wall))
                .collect();
            self.metrics.jobs_expired.inc_by(rows.len() as u64);
            self.metrics.jobs_cached.set(self.jobs.len() as i64);
            self.outbox.extend(rows);
            self.expired(expired);
        }
    }

    /// The job expired before delivery: it leaves the cache as `archiving` for the archive.
    fn expire(&mut self, id: JobId, now: DateTime<Utc>) {
        if let Some(entry) = self.forget(id) {
            self.metrics.jobs_expired.inc();
            self.metrics.jobs_cached.set(self.jobs.len() as i64);
            self.outbox
                .push(Transition::archiving(id, entry.attempts, now));
            self.expired(vec![id]);
        }
    }

    fn lane_of(&self, id: JobId) -> Option<Arc<str>> {
        self.jobs.get(&id).map(|e| e.lane.clone())
    }

    /// Sends the lane's durable-started attempts while it has free HTTP slots.
    fn dispatch(&mut self, key: &Arc<str>) {
        let per_endpoint = self.concurrency(key);
        let mut ready = Vec::new();
        if let Some(lane) = self.lanes.get_mut(key) {
            while lane.in_flight < per_endpoint {
                let Some(id) = lane.started.pop_front() else {
                    break;
                };
                lane.in_flight += 1;
                ready.push(id);
            }
        }
        for id in ready {
            self.deliver(id);
        }
        self.relist(key);
    }

    fn deliver(&mut self, id: JobId) {
        let Some(entry) = self.jobs.get_mut(&id) else {
            return;
        };
        entry.phase = Phase::InFlight;
        self.metrics.observe_start();
        let job = entry.job.clone();
        let attempt = entry.attempts;
        let deliverer = self.deliverer.clone();
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let result = deliverer.attempt(&job, attempt).await;
            let _ = events.send(Event::Finished {
                id: job.id,
                result: Box::new(result),
            });
        });
    }

    /// Drops a waiting job's payload and headers from memory; it is read back when due.
    fn spill(&mut self, id: JobId) {
        if let Some(entry) = self.jobs.get_mut(&id).filter(|e| !e.spilled) {
            self.cached_bytes = self.cached_bytes.saturating_sub(weight(&entry.job));
            let mut stub = (*entry.job).clone();
            stub.payload = bytes::Bytes::new();
            stub.headers = Vec::new();
            entry.job = Arc::new(stub);
            entry.spilled = true;
            self.spilled += 1;
            self.metrics.jobs_spilled.set(self.spilled as i64);
            self.metrics
                .cached_payload_bytes
                .set(self.cached_bytes as i64);
        }
    }

    /// A job whose payload was being fetched for its turn no longer is: its lane may take
    /// another.
    fn unfetch(&mut self, id: JobId) {
        let Some(entry) = self.jobs.get(&id).filter(|e| e.phase == Phase::Fetching) else {
            return;
        };
        let key = entry.lane.clone();
        if let Some(lane) = self.lanes.get_mut(&key) {
            lane.fetching -= 1;
        }
        self.relist(&key);
    }

    /// Caches a job; beyond `max_cached_bytes` it keeps only its metadata. Returns whether
    /// it is cached: a full cache leaves it in the JobDB for a backlog pass.
    fn admit(&mut self, entry: Entry) -> bool {
        let id = entry.job.id;
        if self.jobs.contains_key(&id) {
            // Read in by a backlog page before its own event arrived.
            return false;
        }
        if self.jobs.len() >= self.limits.max_cached_jobs {
            self.backlog.due_now();
            return false;
        }
        if entry.spilled {
            self.spilled += 1;
            self.metrics.jobs_spilled.set(self.spilled as i64);
        } else {
            self.cached_bytes += weight(&entry.job);
        }
        self.jobs.insert(id, entry);
        if self.cached_bytes > self.limits.max_cached_bytes {
            self.spill(id);
        }
        self.metrics
            .cached_payload_bytes
            .set(self.cached_bytes as i64);
        true
    }

    /// Caches a job at its place: ready now, or waiting until it is due.
    fn admit_at(&mut self, entry: Entry, retry_at: Option<DateTime<Utc>>) {
        let (now, instant) = (Utc::now(), Instant::now());
        let due = retry_at
            .map(|at| at.min(entry.job.expire_at))
            .filter(|at| *at > now)
            .map(|at| instant + wait_until(now, at));
        let id = entry.job.id;
        if self.admit(entry) {
            match due {
                Some(due) => self.wait(id, due),
                None => self.enqueue(id),
            }
        }
    }

    /// Reads the next page of the backlog when the cache has room for it: after a writer
    /// barrier, so the read sees every row this scheduler has handed over.
    async fn load_backlog(&mut self) {
        let now = Instant::now();
        if self.backlog.loading {
            return;
        }
        if self.backlog.pause.is_some_and(|at| at > now) {
            return;
        }
        if !self.commands.is_empty() {
            return self.read_command_targets().await;
        }
        let b = &self.backlog;
        if !b.pending || b.wake.is_some_and(|at| at > now) {
            return;
        }
        let page = (self.limits.max_cached_jobs / 4).clamp(1, 1000);
        if self.limits.max_cached_jobs.saturating_sub(self.jobs.len()) < page {
            self.evict_far_waiting(page, now);
        }
        let room = self.limits.max_cached_jobs.saturating_sub(self.jobs.len());
        if room < page {
            return;
        }
        let (reply, barrier) = oneshot::channel();
        if self.writer.send(WriteOp::Barrier(reply)).await.is_err() {
            return;
        }
        let b = &mut self.backlog;
        if b.cursor.is_none() {
            // A new pass: everything if the cache has room to spare, else what is due soon.
            b.again = false;
            b.whole = self.jobs.len() < self.limits.max_cached_jobs / 2;
        }
        b.loading = true;
        b.left.clear();
        let limit = room.min(1000);
        let after = b.cursor;
        let horizon = (!b.whole).then(|| {
            chrono::Duration::from_std(self.limits.spill_after).unwrap_or(chrono::Duration::MAX)
        });
        let (db, events) = (self.db.clone(), self.events_tx.clone());
        tokio::spawn(async move {
            let (mut jobs, mut next_due) = (None, None);
            if let Ok(before_row) = barrier.await {
                let now = Utc::now();
                let due_by = match horizon {
                    Some(horizon) => now.checked_add_signed(horizon).unwrap_or(now),
                    None => crate::jobdb::latest_time(),
                };
                let page = db.backlog_page(after, due_by, before_row, limit).await;
                // The pass's last page: when does the first job beyond the horizon come due?
                let last = page.as_ref().is_ok_and(|jobs| jobs.len() < limit);
                let beyond = match (last, horizon) {
                    (true, Some(_)) => db.next_due_after(due_by).await,
                    _ => Ok(None),
                };
                match (page, beyond) {
                    (Ok(page), Ok(due)) => (jobs, next_due) = (Some(page), due),
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::warn!(error = %e, "reading the backlog failed; trying again")
                    }
                }
            }
            let _ = events.send(Event::BacklogPage {
                jobs,
                limit,
                next_due,
            });
        });
    }

    /// Reads which waiting jobs in the JobDB the oldest pending command names, after a writer
    /// barrier (like a backlog page, and never at the same time as one).
    async fn read_command_targets(&mut self) {
        let Some(command) = self.commands.pop_front() else {
            return;
        };
        let (reply, barrier) = oneshot::channel();
        if self.writer.send(WriteOp::Barrier(reply)).await.is_err() {
            self.commands.push_front(command);
            return;
        }
        self.backlog.loading = true;
        self.backlog.left.clear();
        let (db, events) = (self.db.clone(), self.events_tx.clone());
        tokio::spawn(async move {
            let targets = match barrier.await {
                Ok(before_row) => match db.command_targets(command.id, before_row).await {
                    Ok(targets) => Some(targets),
                    Err(e) => {
                        tracing::warn!(error = %e, command = command.id, "reading a command's jobs failed; trying again");
                        None
                    }
                },
                Err(_) => None,
            };
            let _ = events.send(Event::CommandTargets {
                command: Box::new(command),
                targets,
            });
        });
    }

    /// Applies an operator command to the waiting jobs it names: those in the cache, and
    /// those only in the JobDB (`targets`). Jobs mid-attempt are left to their attempt, except
    /// that a discard or flush still applies if the attempt ends in a retry.
    fn apply_command(&mut self, command: Command, targets: Option<Vec<(JobId, Progress)>>) {
        self.backlog.loading = false;
        let left = std::mem::take(&mut self.backlog.left);
        let Some(targets) = targets else {
            self.commands.push_front(command);
            self.backlog.pause = Some(Instant::now() + Duration::from_secs(1));
            return;
        };
        let command = Arc::new(command);
        let now = Utc::now();
        let mut changed = 0u64;
        let mut flushed = Vec::new();
        let named: HashSet<JobId> = self
            .jobs
            .iter()
            .filter(|(_, e)| command.matches(&e.job))
            .map(|(id, _)| *id)
            .collect();
        for &id in &named {
            let Some(entry) = self.jobs.get_mut(&id) else {
                continue;
            };
            let (attempts, expire_at) = (entry.attempts, entry.job.expire_at);
            let waiting = matches!(entry.phase, Phase::Waiting { .. } | Phase::Parked);
            let ready = entry.phase == Phase::Ready;
            if !(ready || waiting) {
                if matches!(command.action, Action::Discard | Action::Flush) {
                    entry.doomed = Some(command.clone());
                }
                continue;
            }
            match command.action {
                Action::Expedite if waiting => {
                    self.outbox
                        .push(operator_retry(id, attempts, now, now, &command));
                    self.wait(id, Instant::now());
                }
                Action::Expedite => continue,
                Action::Postpone => {
                    let until = command.postpone_until.unwrap_or(now);
                    self.outbox
                        .push(operator_retry(id, attempts, now, until, &command));
                    let wake = until.min(expire_at);
                    self.wait(id, Instant::now() + wait_until(now, wake));
                    if let Some(entry) = self.jobs.get_mut(&id) {
                        entry.failed_at = None;
                    }
                }
                Action::Flush | Action::Discard => {
                    self.forget(id);
                    self.outbox
                        .push(operator_end(command.action, id, attempts, now, &command));
                    if command.action == Action::Flush {
                        flushed.push(id);
                    }
                }
            }
            changed += 1;
        }
        for (id, progress) in targets {
            // Cached when the command came (handled above, or left to its attempt), cached
            // since, or gone since the read began: not the JobDB's to change.
            if named.contains(&id) || self.jobs.contains_key(&id) || left.contains(&id) {
                continue;
            }
            let row = match command.action {
                Action::Expedite if progress.state == State::AwaitingRetry => {
                    // Due now: a backlog pass reads it in.
                    self.backlog.due_now();
                    operator_retry(id, progress.attempts, now, now, &command)
                }
                Action::Expedite => continue,
                Action::Postpone => operator_retry(
                    id,
                    progress.attempts,
                    now,
                    command.postpone_until.unwrap_or(now),
                    &command,
                ),
                Action::Flush => {
                    flushed.push(id);
                    operator_end(command.action, id, progress.attempts, now, &command)
                }
                Action::Discard => {
                    operator_end(command.action, id, progress.attempts, now, &command)
                }
            };
            self.outbox.push(row);
            changed += 1;
            // Its due time changed (a postpone may bring it closer), and its new row may be
            // newer than a pass in progress can see: a pass after this one plans from the
            // JobDB's new times.
            self.backlog.due_now();
        }
        if !flushed.is_empty() {
            self.metrics.jobs_expired.inc_by(flushed.len() as u64);
            self.expired(flushed);
        }
        self.metrics.jobs_cached.set(self.jobs.len() as i64);
        tracing::info!(
            command = command.id,
            action = command.action.error_type(),
            by = %command.issued_by,
            jobs = changed,
            "operator command applied"
        );
        self.applied.push((command.id, changed));
    }

    /// Queue depth by endpoint class, at most once a second (it walks the lanes, not the jobs).
    fn update_gauges(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.gauges_at) < Duration::from_secs(1) {
            self.gauges_stale = true;
            return;
        }
        self.gauges_at = now;
        self.gauges_stale = false;
        let (mut running, mut open, mut paused) = (0, 0, 0);
        for (key, lane) in &self.lanes {
            if self.concurrency(key) == 0 {
                paused += lane.ready;
            } else if self.breakers.get(key).is_some_and(|(b, _)| b.is_open()) {
                open += lane.ready;
            } else {
                running += lane.ready;
            }
        }
        let parked = self.parked_count;
        let waiting = self
            .jobs
            .len()
            .saturating_sub(running + open + paused + parked + self.in_flight);
        self.publish_health();
        for (class, n) in [
            ("running", running),
            ("breaker_open", open),
            ("paused", paused),
            ("bucket_paused", parked),
            ("waiting", waiting),
        ] {
            self.metrics
                .queued
                .get_or_create(&crate::metrics::QueueLabels { class })
                .set(n as i64);
        }
    }

    /// Publishes every known endpoint's health: lanes with work, and breakers that remember
    /// outcomes.
    fn publish_health(&self) {
        let keys: HashSet<&Arc<str>> = self.lanes.keys().chain(self.breakers.keys()).collect();
        let mut health: Vec<crate::rpc::api::EndpointHealth> = keys
            .into_iter()
            .map(|key| {
                let lane = self.lanes.get(key);
                let breaker = self.breakers.get(key).map(|(b, _)| b);
                let (recent_attempts, recent_failures) = breaker.map_or((0, 0), Breaker::recent);
                let control = self.controls.endpoints.get(&**key);
                crate::rpc::api::EndpointHealth {
                    endpoint: key.to_string(),
                    ready: lane.map_or(0, |l| l.ready),
                    in_flight: lane.map_or(0, |l| l.in_flight),
                    breaker: if breaker.is_some_and(Breaker::is_open) {
                        "open"
                    } else {
                        "closed"
                    }
                    .to_owned(),
                    recent_attempts,
                    recent_failures,
                    paused: control.is_some_and(|c| c.paused),
                    concurrency: self.concurrency(key),
                    max_per_second: control.and_then(|c| c.max_per_second),
                }
            })
            .collect();
        health.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
        if let Ok(mut published) = self.health.lock() {
            *published = health;
        }
    }

    /// Requests an endpoint may have in flight here: `--endpoint-concurrency`, lowered by
    /// its control; 0 while it is paused.
    fn concurrency(&self, key: &str) -> usize {
        match self.controls.endpoints.get(key) {
            Some(c) if c.paused => 0,
            Some(c) => c.max_concurrency.map_or(self.limits.per_endpoint, |cap| {
                self.limits.per_endpoint.min(cap.max(1) as usize)
            }),
            None => self.limits.per_endpoint,
        }
    }

    /// For a rate-limited endpoint, refills its tokens and tells when the next one comes if
    /// none is left (`None`: it may start a request now, or it has no rate limit).
    fn next_token(&mut self, key: &Arc<str>) -> Option<Instant> {
        let rate = self
            .controls
            .endpoints
            .get(&**key)
            .and_then(|c| c.max_per_second)
            .filter(|r| *r > 0.0)?;
        let now = Instant::now();
        // A burst of at most one second's worth.
        let burst = rate.max(1.0);
        let (tokens, at) = self.rates.entry(key.clone()).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * rate).min(burst);
        *at = now;
        (*tokens < 1.0).then(|| now + Duration::from_secs_f64((1.0 - *tokens) / rate))
    }

    /// Applies a new set of controls: parks the due jobs of newly paused buckets, queues
    /// those of resumed ones, and re-reads every lane's limits.
    fn set_controls(&mut self, controls: Arc<Controls>) {
        tracing::info!(
            endpoints = controls.endpoints.len(),
            buckets = controls.buckets.len(),
            "endpoint controls changed"
        );
        for (target, n) in [
            ("endpoint", controls.endpoints.len()),
            ("bucket", controls.buckets.len()),
        ] {
            self.metrics
                .controls
                .get_or_create(&crate::metrics::ControlLabels { target })
                .set(n as i64);
        }
        let newly_paused: HashSet<Arc<str>> = self
            .lanes
            .values()
            .flat_map(|lane| lane.queues.keys())
            .filter(|b| controls.bucket_paused(b) && !self.controls.bucket_paused(b))
            .cloned()
            .collect();
        self.controls = controls;
        self.rates.retain(|key, _| {
            self.controls
                .endpoints
                .get(&**key)
                .is_some_and(|c| c.max_per_second.is_some())
        });
        if !newly_paused.is_empty() {
            // Rare (an operator's pause), so a walk over the paused buckets' queues is fine.
            let park: Vec<JobId> = self
                .lanes
                .values()
                .flat_map(|lane| {
                    lane.queues
                        .iter()
                        .filter(|(b, _)| newly_paused.contains(*b))
                        .flat_map(|(_, q)| q.iter().map(|(id, _)| *id))
                })
                .collect();
            for id in park {
                if self.jobs.get(&id).is_some_and(|e| e.phase == Phase::Ready) {
                    // Queued again under the paused bucket: parked.
                    self.enqueue(id);
                }
            }
        }
        let resumed: Vec<Arc<str>> = self
            .parked
            .keys()
            .filter(|b| !self.controls.bucket_paused(b))
            .cloned()
            .collect();
        for bucket in resumed {
            for id in self.parked.remove(&bucket).unwrap_or_default() {
                if self.jobs.get(&id).is_some_and(|e| e.phase == Phase::Parked) {
                    self.enqueue(id);
                }
            }
        }
        let parked = &mut self.parked;
        let jobs = &self.jobs;
        parked.retain(|_, ids| {
            ids.retain(|id| jobs.get(id).is_some_and(|e| e.phase == Phase::Parked));
            !ids.is_empty()
        });
        let keys: Vec<Arc<str>> = self.lanes.keys().cloned().collect();
        for key in keys {
            self.dispatch(&key);
        }
    }

    /// Feeds an attempt's outcome to its endpoint's breaker. The endpoint cannot take the
    /// request when it did not answer, answered a server error, or asked us to slow down
    /// (429/425: other jobs of the same endpoint would be told the same); a 4xx or a success
    /// means it is up.
    fn record_outcome(&mut self, key: &Arc<str>, verdict: &Verdict) {
        let (ok, retry_after) = match verdict {
            Verdict::Retry { retry_after, .. } => (false, *retry_after),
            _ => (true, None),
        };
        let now = Instant::now();
        let (breaker, seen) = self
            .breakers
            .entry(key.clone())
            .or_insert_with(|| (Breaker::default(), now));
        *seen = now;
        match breaker.record(ok, now, &self.limits.breaker, retry_after) {
            Change::Opened => {
                tracing::warn!(endpoint = %key, "endpoint failing: circuit breaker open, probing");
                self.metrics.breaker_opened.inc();
                self.metrics.breakers_open.inc();
                self.opened_at.insert(key.clone(), now);
            }
            Change::Closed => {
                self.metrics.breakers_open.dec();
                let expedited = self.expedite_lane(key);
                tracing::info!(endpoint = %key, expedited, "endpoint answering again: circuit breaker closed; its waiting retries are due now");
            }
            Change::None => {}
        }
        if now.duration_since(self.breakers_pruned) > Duration::from_secs(60) {
            self.breakers_pruned = now;
            self.breakers.retain(|_, (b, seen)| {
                b.is_open() || now.duration_since(*seen) < Duration::from_secs(300)
            });
        }
    }

    /// An endpoint came back: the retries its outage made wait (attempts that failed from a
    /// minute before the breaker opened; backoffs that grew during the outage, mostly of the
    /// probes) become due now, each with an `awaiting-retry` row saying so. Jobs an operator
    /// postponed are left alone. Rare (once per outage), so a walk over the cache is fine.
    fn expedite_lane(&mut self, key: &Arc<str>) -> usize {
        let now = Utc::now();
        let Some(opened) = self.opened_at.remove(key) else {
            return 0;
        };
        let since = opened
            .checked_sub(Duration::from_secs(60))
            .unwrap_or(opened);
        let waiting: Vec<(JobId, u16)> = self
            .jobs
            .iter()
            .filter(|(_, e)| {
                e.lane == *key
                    && matches!(e.phase, Phase::Waiting { .. })
                    && e.failed_at.is_some_and(|t| t >= since)
            })
            .map(|(id, e)| (*id, e.attempts))
            .collect();
        for (id, attempts) in &waiting {
            self.outbox.push(Transition::awaiting_retry(
                *id,
                *attempts,
                now,
                now,
                crate::job::AttemptRecord {
                    error_type: Some("endpoint-recovered".to_owned()),
                    ..Default::default()
                },
            ));
            self.wait(*id, Instant::now());
        }
        waiting.len()
    }

    /// Ends a job a discard or flush named while it was mid-attempt.
    fn end_doomed(&mut self, id: JobId) {
        let Some(entry) = self.forget(id) else { return };
        let Some(command) = entry.doomed else { return };
        self.outbox.push(operator_end(
            command.action,
            id,
            entry.attempts,
            Utc::now(),
            &command,
        ));
        if command.action == Action::Flush {
            self.metrics.jobs_expired.inc();
            self.expired(vec![id]);
        }
        self.metrics.jobs_cached.set(self.jobs.len() as i64);
    }

    /// Once the transitions of the commands applied so far are durable, records their results.
    async fn record_applied(&mut self) {
        if self.applied.is_empty() {
            return;
        }
        let applied = std::mem::take(&mut self.applied);
        let (reply, barrier) = oneshot::channel();
        if self.writer.send(WriteOp::Barrier(reply)).await.is_err() {
            return;
        }
        let (db, holder, metrics) = (self.db.clone(), self.holder.clone(), self.metrics.clone());
        tokio::spawn(async move {
            if barrier.await.is_err() {
                return;
            }
            for (id, jobs) in applied {
                match db.record_command_result(id, &holder, jobs).await {
                    Ok(()) => {
                        metrics.operator_commands.inc();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, command = id, "recording a command's result failed; a new owner applies it again")
                    }
                }
            }
        });
    }

    /// Takes a page of the backlog into the cache, as metadata (payloads are read when due).
    fn backlog_page(
        &mut self,
        jobs: Option<Vec<(Job, Progress)>>,
        limit: usize,
        next_due: Option<DateTime<Utc>>,
    ) {
        let now = Instant::now();
        self.backlog.loading = false;
        let left = std::mem::take(&mut self.backlog.left);
        let Some(jobs) = jobs else {
            self.backlog.pause = Some(now + Duration::from_secs(1));
            return;
        };
        let read = jobs.len();
        if let Some((last, _)) = jobs.last() {
            self.backlog.cursor = Some(last.id);
        }
        let mut loaded = 0u64;
        for (job, progress) in jobs {
            if self.jobs.contains_key(&job.id) || left.contains(&job.id) {
                continue;
            }
            let retry_at = match progress.state {
                State::AwaitingRetry => progress.retry_at,
                _ => None,
            };
            let mut entry = Entry::new(Arc::new(job), progress.attempts);
            entry.spilled = true;
            self.admit_at(entry, retry_at);
            loaded += 1;
        }
        self.metrics.jobs_backlog_loaded.inc_by(loaded);
        self.metrics.jobs_cached.set(self.jobs.len() as i64);
        if read < limit {
            // The pass reached the end of the JobDB.
            let roomy = self.jobs.len() < self.limits.max_cached_jobs / 2;
            let every = (self.limits.spill_after / 4)
                .clamp(Duration::from_millis(100), Duration::from_secs(15));
            let b = &mut self.backlog;
            b.cursor = None;
            if b.again {
                b.wake = None;
            } else if b.whole {
                // Every waiting job of the JobDB is cached now.
                b.pending = false;
            } else if roomy {
                // A pass of the due jobs ended with room to spare: the next one reads the
                // rest, whenever due.
                b.wake = None;
            } else if let Some(due) = next_due {
                // Jobs wait in the JobDB beyond the horizon: look again shortly before the
                // first comes due (no sooner than `every`, the cache may hold it already).
                let wall = Utc::now();
                let horizon = chrono::Duration::from_std(self.limits.spill_after)
                    .unwrap_or(chrono::Duration::MAX);
                let read_at = due.checked_sub_signed(horizon).unwrap_or(wall);
                b.wake = Some((now + wait_until(wall, read_at)).max(now + every));
            } else {
                b.pending = false;
            }
        }
    }

    /// Makes room in a full cache: jobs waiting beyond the backlog's horizon (`spill_after`)
    /// leave it, and a later pass reads them back shortly before they are due. Looks at most
    /// once a second.
    fn evict_far_waiting(&mut self, want: usize, now: Instant) {
        if self
            .backlog
            .evicted_at
            .is_some_and(|at| now < at + Duration::from_secs(1))
        {
            self.backlog.recheck = self
                .backlog
                .evicted_at
                .map(|at| at + Duration::from_secs(1));
            return;
        }
        self.backlog.evicted_at = Some(now);
        let horizon = self.limits.spill_after;
        let mut far: Vec<(Instant, JobId)> = self
            .jobs
            .iter()
            .filter_map(|(id, e)| match e.phase {
                Phase::Waiting { due } if due > now + horizon => Some((due, *id)),
                _ => None,
            })
            .collect();
        if far.is_empty() {
            return;
        }
        // The furthest first: they would sit in memory longest.
        far.sort_unstable_by(|a, b| b.cmp(a));
        far.truncate(want.max(self.limits.max_cached_jobs / 4));
        for (_, id) in &far {
            if let Some(entry) = self.jobs.remove(id) {
                if entry.spilled {
                    self.spilled -= 1;
                } else {
                    self.cached_bytes = self.cached_bytes.saturating_sub(weight(&entry.job));
                }
            }
        }
        let jobs = &self.jobs;
        self.timers.retain(|Reverse((_, id))| jobs.contains_key(id));
        // A later pass finds them by their due time (`next_due_after`); the current one can no
        // longer be a whole one, which would end believing every waiting job is cached.
        self.backlog.pending = true;
        self.backlog.whole = false;
        self.metrics.jobs_evicted.inc_by(far.len() as u64);
        self.metrics.jobs_spilled.set(self.spilled as i64);
        self.metrics
            .cached_payload_bytes
            .set(self.cached_bytes as i64);
        self.metrics.jobs_cached.set(self.jobs.len() as i64);
    }

    /// Removes a job from the cache, keeping the counts right.
    fn forget(&mut self, id: JobId) -> Option<Entry> {
        self.leave_queue(id);
        let entry = self.jobs.remove(&id)?;
        if self.backlog.loading {
            self.backlog.left.insert(id);
        }
        if entry.spilled {
            self.spilled -= 1;
            self.metrics.jobs_spilled.set(self.spilled as i64);
        } else {
            self.cached_bytes = self.cached_bytes.saturating_sub(weight(&entry.job));
            self.metrics
                .cached_payload_bytes
                .set(self.cached_bytes as i64);
        }
        Some(entry)
    }

    fn finish(&mut self, id: JobId, result: AttemptResult) {
        let Some(key) = self.lane_of(id) else { return };
        self.in_flight -= 1;
        self.metrics.in_flight.set(self.in_flight as i64);
        if let Some(lane) = self.lanes.get_mut(&key) {
            lane.in_flight -= 1;
        }
        self.record_outcome(&key, &result.verdict);
        self.dispatch(&key);
        let Some(entry) = self.jobs.get(&id) else {
            return;
        };
        let attempt = entry.attempts;
        let now = Utc::now();
        if let Some(d) = result.record.duration {
            self.metrics.observe_attempt(&result.verdict, d);
        }
        let row = match result.verdict {
            Verdict::Succeeded => {
                self.forget(id);
                Transition::succeeded(id, attempt, now, result.record)
            }
            Verdict::Discard { .. } => {
                self.forget(id);
                Transition::discarded(id, attempt, now, result.record)
            }
            Verdict::Retry { .. } if attempt >= self.limits.max_attempts => {
                // The last attempt it may make failed: it ends here, with that answer.
                self.forget(id);
                self.metrics.jobs_out_of_attempts.inc();
                let mut record = result.record;
                record.error_type = Some(MAX_ATTEMPTS.to_owned());
                Transition::discarded(id, attempt, now, record)
            }
            Verdict::Retry { retry_after, .. } => {
                let job = &entry.job;
                let unit: f64 = rand::rng().random();
                let delay = backoff::next_delay(
                    &job.retry,
                    attempt,
                    self.limits.backoff_cap,
                    self.limits.min_retry_delay,
                    retry_after,
                    unit,
                );
                // Never past the job's expiry (it is archived then), whatever was asked.
                let retry_at = chrono::Duration::from_std(delay)
                    .ok()
                    .and_then(|d| now.checked_add_signed(d))
                    .map_or(job.expire_at, |at| at.min(job.expire_at));
                let wait = wait_until(now, retry_at);
                let row = Transition::awaiting_retry(id, attempt, now, retry_at, result.record);
                if wait >= self.limits.spill_after {
                    self.spill(id);
                }
                self.wait(id, Instant::now() + wait);
                if let Some(entry) = self.jobs.get_mut(&id) {
                    entry.failed_at = Some(Instant::now());
                }
                row
            }
        };
        self.metrics.jobs_cached.set(self.jobs.len() as i64);
        self.outbox.push(row);
        if self.jobs.get(&id).is_some_and(|e| e.doomed.is_some()) {
            self.end_doomed(id);
        }
    }
}

/// What an operator command writes into the transitions it causes.
fn operator_record(command: &Command) -> crate::job::AttemptRecord {
    crate::job::AttemptRecord {
        error_type: Some(command.action.error_type().to_owned()),
        error_response: Some(bytes::Bytes::from(command.note())),
        ..Default::default()
    }
}

/// A waiting job rescheduled by a command (expedite, postpone).
fn operator_retry(
    id: JobId,
    attempts: u16,
    now: DateTime<Utc>,
    retry_at: DateTime<Utc>,
    command: &Command,
) -> Transition {
    Transition::awaiting_retry(id, attempts, now, retry_at, operator_record(command))
}

/// A waiting job ended by a command: `archiving` for a flush, `discarded` for a discard.
fn operator_end(
    action: Action,
    id: JobId,
    attempts: u16,
    now: DateTime<Utc>,
    command: &Command,
) -> Transition {
    let record = operator_record(command);
    match action {
        Action::Flush => {
            let mut row = Transition::archiving(id, attempts, now);
            row.error_type = record.error_type;
            row.error_response_encoding = Some("utf-8");
            row.error_response = record.error_response;
            row
        }
        _ => Transition::discarded(id, attempts, now, record),
    }
}

/// Bytes a job holds in memory beyond its metadata: payload and headers.
fn weight(job: &Job) -> usize {
    job.payload.len()
        + job
            .headers
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum::<usize>()
}

/// The `error_type` of a job discarded because its attempts are used up.
pub const MAX_ATTEMPTS: &str = "max-attempts";

/// How long from `now` until `at` (zero if it has passed), capped so that adding it to an
/// `Instant` can never overflow: times come from the JobDB and from endpoints.
fn wait_until(now: DateTime<Utc>, at: DateTime<Utc>) -> Duration {
    const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    (at - now).to_std().unwrap_or_default().min(LONGEST)
}

/// The scheduler-clock instant at which a job expiring at `expire_at` expires.
fn deadline_of(expire_at: DateTime<Utc>) -> Instant {
    Instant::now() + wait_until(Utc::now(), expire_at)
}
