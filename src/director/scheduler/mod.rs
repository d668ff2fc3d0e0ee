//! The scheduler: the Director's in-memory cache of unfinished jobs and its lanes (what
//! Centrifuge calls "virtual queues").
//!
//! Every unfinished job of the JobDB is cached here (or waits in the JobDB for a backlog pass
//! to read it in); a job leaves the cache when it reaches a terminal state (or `archiving`,
//! which the archive takes over). An attempt starts only once the commit that lists it
//! (`commit_log`, batched with the others picked at the same time) is durable, so a fenced-out
//! Director cannot start deliveries and after a crash the attempts that were in flight are
//! known.
//!
//! The parts, each owning its state:
//! - `cache`: the jobs, their memory (spill/reload, eviction) and retry timers;
//! - `queues`: lanes (one per endpoint), a FIFO per bucket, the ring that shares the
//!   Director fairly between endpoints and an endpoint between buckets;
//! - `gates`: breakers, parks, rate limits, controls, jobs set aside, lane timers — one
//!   `limit(lane, now)`;
//! - `backlog`: the pass that reads jobs waiting in the JobDB only;
//! - `operator`: operator commands as a pure plan;
//! - `health`: queue depths and endpoint health, read over queues and gates;
//! - `attempts`: starting, delivering and ending attempts (the verbs of one attempt);
//! - `reads`: what comes in from the JobDB (spilled jobs, backlog pages, command targets).
//!
//! This module holds the event loop and the verbs that span parts (queue, wait, forget,
//! expire). Everything runs on one task and owns its state: no locks.

mod attempts;
mod backlog;
mod cache;
mod gates;
mod health;
mod operator;
mod parks;
mod queues;
mod reads;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::delivery::Deliverer;
pub use crate::job::Recovered;
use crate::job::{JobId, Transition};
use crate::jobdb::commands::Command;
use crate::jobdb::JobDb;
use crate::metrics::Metrics;
use crate::registry::controls::{Controls, EndpointControl};

use super::breaker::BreakerConfig;
pub use super::mailbox::Event;
use super::mailbox::WriteOp;
use super::parks::{ParkPolicy, ParkRequest};
use backlog::Backlog;
use cache::{Admitted, Cache, Entry, Phase};
use gates::{Gates, Limit};
use queues::Queues;

/// How long a command planned over jobs only in the JobDB is remembered against commits read
/// before it (a release hands its jobs over within moments of its commit).
const PLANNED_IN_DB_KEEP: Duration = Duration::from_secs(60);

/// Bounds of the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerLimits {
    /// Attempts in flight across all endpoints.
    pub max_in_flight: usize,
    /// Attempts in flight per endpoint.
    pub per_endpoint: usize,
    /// Most attempts begun by one commit.
    pub start_batch: usize,
    /// Attempts of one endpoint that may be begun ahead of its HTTP slots (being committed, or
    /// committed and waiting for a slot), as a multiple of its concurrency: a commit takes a
    /// few milliseconds, so a window of one concurrency's worth caps a fast endpoint at about
    /// `concurrency / commit time`. A lane that pauses or whose breaker opens sends none of
    /// those waiting (they are held back), so the window never reaches an endpoint judged down.
    pub start_window: usize,
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
    /// When a failing endpoint is parked, how it is probed, and how fast it goes again.
    pub park: ParkPolicy,
    /// Most attempts of one job: a retryable failure of the last one discards the job
    /// (`error_type` `max-attempts`). At most `u16::MAX`, the column's range.
    pub max_attempts: u16,
    /// Shortest wait between two attempts of a job, whatever its policy or the endpoint's
    /// `Retry-After` say.
    pub min_retry_delay: Duration,
}

/// The scheduler task's state.
pub struct Scheduler {
    cache: Cache,
    queues: Queues,
    gates: Gates,
    /// The registry's controls and the subscriptions' caps, merged into the gates' controls.
    registry_controls: Arc<Controls>,
    subscription_caps: Arc<crate::events::EndpointCaps>,
    backlog: Backlog,
    /// Ready jobs and those set aside, by deadline: gated queues (paused, parked, breaker open,
    /// rate-limited) expire their jobs on time without being walked.
    queued_by_deadline: BTreeSet<(Instant, JobId)>,
    /// Attempts under way (starting or in flight), across all lanes.
    in_flight: usize,
    limits: SchedulerLimits,
    writer: mpsc::Sender<WriteOp>,
    deliverer: Deliverer,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    metrics: Arc<Metrics>,
    /// For reading spilled jobs and the backlog (never for writing).
    db: JobDb,
    /// Rows waiting to go to the writer, in the order they happened. Only this task sends
    /// them, so a job's rows reach the writer (and get their ids) in order.
    outbox: Vec<Transition>,
    /// Jobs left out of the cache that may never have rested: they get their `open_jobs`
    /// entries (the writer skips those that have one) before the next backlog read.
    rests: Vec<JobId>,
    /// Told the ids of jobs that expired (the archiver takes them from `archiving`).
    expired_tx: Option<mpsc::UnboundedSender<Vec<JobId>>>,
    /// Operator commands waiting to be applied, oldest first.
    commands: VecDeque<Command>,
    /// Commands applied whose transitions are on their way to the JobDB: (id, jobs changed).
    applied: Vec<(u64, u64)>,
    /// Jobs a command changed while they were only in the JobDB, when (and their new due
    /// time; `None`: ended): a commit read before the command's may still hand one over.
    planned_in_db: HashMap<JobId, (Instant, Option<DateTime<Utc>>)>,
    /// Who applies commands (the Director's holder name), for their results.
    holder: Arc<str>,
    /// When the queue-depth gauges were last computed.
    gauges_at: Instant,
    /// Something changed since: compute them again a second after the last time.
    gauges_stale: bool,
    /// Endpoint health for `GET /v1/endpoints`, refreshed with the gauges.
    health: Arc<std::sync::Mutex<Vec<crate::rpc::api::EndpointHealth>>>,
    /// Busy during each step of its loop: the watchdog's view of it.
    progress: crate::director::supervise::Progress,
    /// Its JobDB is the only live one: when an ordered job ends, its successor may begin
    /// its attempt in the commit that releases it (see [`WriteOp::Begin`]).
    begin_on_release: bool,
    /// Shutting down: no new attempts, none begun on release.
    stopping: bool,
    /// Sequences whose next job may begin on release, not yet offered to the writer.
    begins: Vec<crate::job::Seq>,
    /// Where park requests go (`None`: lanes are never parked).
    parks_tx: Option<mpsc::UnboundedSender<ParkRequest>>,
    /// Park requests sent lately (see [`parks::ASK_AGAIN`]).
    asked: HashMap<parks::Ask, Instant>,
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
            cache: Cache::new(
                limits.max_cached_jobs,
                limits.max_cached_bytes,
                metrics.clone(),
            ),
            queues: Queues::default(),
            gates: Gates::new(limits.per_endpoint, limits.breaker, limits.park),
            registry_controls: Arc::default(),
            subscription_caps: Arc::default(),
            // The JobDB may hold unfinished jobs: the first pass reads them in.
            backlog: Backlog::pending(),
            queued_by_deadline: BTreeSet::new(),
            in_flight: 0,
            limits,
            writer,
            deliverer,
            events_tx,
            events,
            metrics,
            db,
            outbox: Vec::new(),
            rests: Vec::new(),
            expired_tx: None,
            commands: VecDeque::new(),
            applied: Vec::new(),
            planned_in_db: HashMap::new(),
            holder: "director".into(),
            gauges_at: Instant::now(),
            gauges_stale: true,
            health: Arc::default(),
            progress: Default::default(),
            begin_on_release: false,
            stopping: false,
            begins: Vec::new(),
            parks_tx: None,
            asked: HashMap::new(),
        }
    }

    /// Asks `parks` to park, unpark and announce lanes from now on.
    pub fn park_to(&mut self, parks: mpsc::UnboundedSender<ParkRequest>) {
        self.parks_tx = Some(parks);
    }

    /// Its JobDB is the only live one (its writer releases in the commit that ends): the
    /// next job of an ordered key begins its attempt in that commit too.
    pub fn begin_on_release(&mut self) {
        self.begin_on_release = true;
    }

    /// Reports each step of its loop to `progress` (the watchdog's handle).
    pub fn watched(&mut self, progress: crate::director::supervise::Progress) {
        self.progress = progress;
    }

    /// Where the scheduler publishes its endpoints' health (once a second).
    pub fn health(&self) -> Arc<std::sync::Mutex<Vec<crate::rpc::api::EndpointHealth>>> {
        self.health.clone()
    }

    /// Starts with these subscriptions waiting: a job recovered or accepted before the
    /// watcher's first word is set aside, never begun. (Without a control database no
    /// subscription is known: every event's job waits, until its expiry.)
    pub fn start_gate(&mut self, gate: Arc<crate::events::SubscriptionGate>) {
        self.gates.set_gate(gate);
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
        let (now, instant) = (Utc::now(), Instant::now());
        let horizon = self.horizon();
        let far = now.checked_add_signed(horizon).unwrap_or(now);
        for r in recovered {
            match r.retry_at.filter(|at| *at > far && *at < r.job.expire_at) {
                // Due beyond the horizon (scheduled for later, or a far retry handed on): it
                // waits in the JobDB, not in memory, and a pass reads it in before it is due.
                Some(at) => {
                    let read_at = at.checked_sub_signed(horizon / 2).unwrap_or(now);
                    self.backlog.remind(instant + wait_until(now, read_at));
                }
                None => {
                    let (id, ordered) = (r.job.id, r.job.ordering.is_some());
                    if !self.admit_at(Entry::new(r.job, r.attempts), r.retry_at) && ordered {
                        // Left out of the cache: an ordered job born released has no entry
                        // for a pass to find it by, so it rests now (the writer skips any
                        // that has one).
                        self.rests.push(id);
                    }
                }
            }
        }
        self.cache.gauge();
    }

    /// Jobs a commit hands over (released ordered jobs, imports, notices) as the operator
    /// commands planned over the JobDB since have left them. A command reads its targets
    /// from the JobDB, and a release committed after that read but before the command's rows
    /// reaches this task after the command was applied: a job the command ended must not be
    /// tried (its end is written), and one it expedited or postponed keeps the new time.
    fn after_commands(&mut self, jobs: Vec<Recovered>) -> Vec<Recovered> {
        if self.planned_in_db.is_empty() {
            return jobs;
        }
        if let Some(cutoff) = Instant::now().checked_sub(PLANNED_IN_DB_KEEP) {
            self.planned_in_db.retain(|_, (at, _)| *at >= cutoff);
        }
        jobs.into_iter()
            .filter_map(|mut r| match self.planned_in_db.get(&r.job.id) {
                None => Some(r),
                Some((_, None)) => None,
                Some((_, Some(due))) => {
                    r.retry_at = Some(*due);
                    Some(r)
                }
            })
            .collect()
    }

    /// Runs until `shutdown`, then lets attempts in flight finish (up to the grace period) and
    /// hands their outcomes to the writer before returning.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut stopping_at: Option<Instant> = None;
        // Recovered jobs that are already due wait for no event: start them now.
        self.pump().await;
        self.flush().await;
        self.load_backlog().await;
        let progress = self.progress.clone();
        loop {
            let next_timer = [
                self.cache.next_timer(),
                self.gates.next_wake(),
                self.queued_by_deadline.first().map(|(at, _)| *at),
                self.gauges_stale
                    .then(|| self.gauges_at + Duration::from_secs(1)),
                // A failing or parked lane is looked at even when nothing happens.
                self.parks_to_review()
                    .then(|| self.gauges_at + parks::REVIEW_EVERY),
            ]
            .into_iter()
            .flatten()
            .min();
            let backlog_wake = self.backlog.next_wake();
            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if stopping_at.is_none() => {
                    stopping_at = Some(Instant::now() + self.limits.shutdown_grace);
                    self.stopping = true;
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
                    self.backlog.woke(Instant::now());
                }
                _ = tokio::time::sleep_until(stopping_at.unwrap_or_else(Instant::now)), if stopping_at.is_some() => {
                    tracing::warn!(in_flight = self.in_flight, "grace period over; attempts still in flight will be recovered as interrupted");
                    break;
                }
            }
            // One step: whatever woke it, handled, and what follows (starts, the writer, the
            // backlog). A step that never ends is a stall the watchdog sees.
            let _step = progress.step();
            if stopping_at.is_none() {
                self.pump().await;
            }
            self.flush().await;
            self.record_applied().await;
            self.update_gauges();
            if stopping_at.is_none() {
                if let Some((hog, _)) = &self.backlog.hog {
                    self.backlog.hog_drained(self.ready_in(hog));
                }
                self.load_backlog().await;
            }
            if stopping_at.is_some() && self.in_flight == 0 {
                break;
            }
        }
        self.flush().await;
    }

    /// Hands queued rows to the writer, in order, in one request (and the rests before them).
    async fn flush(&mut self) {
        self.flush_rests().await;
        if self.outbox.is_empty() {
            // The rows these offers follow went with a start.
            return self.send_begins().await;
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
        self.send_begins().await;
    }

    /// Hands the jobs left out of the cache to the writer to rest.
    async fn flush_rests(&mut self) {
        if self.rests.is_empty() {
            return;
        }
        let jobs = std::mem::take(&mut self.rests);
        let rest = WriteOp::Rest { jobs, done: None };
        if self.writer.send(rest).await.is_err() {
            tracing::warn!("writer gone; jobs left out of the cache are found by the next owner");
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
                    } else if !self.cache.contains(&id) {
                        // The cache is full: it waits in the JobDB only, resting there for a
                        // pass to find.
                        self.rests.push(id);
                    }
                }
                self.cache.gauge();
            }
            Event::HandedOver(jobs) => {
                let jobs = self.after_commands(jobs);
                self.recover(jobs);
            }
            Event::Started(ids, start) => self.started(ids, start),
            Event::StartFailed(ids, why) => self.start_failed(ids, why),
            Event::Reloaded(jobs, asked) => self.reloaded(jobs, asked),
            Event::ReloadFailed(ids) => {
                let later = Instant::now() + Duration::from_secs(1);
                for id in ids {
                    if self
                        .cache
                        .get(&id)
                        .is_some_and(|e| matches!(e.phase, Phase::Reloading | Phase::Fetching))
                    {
                        self.unfetch(id);
                        self.wait(id, later);
                    }
                }
            }
            Event::BegunOnRelease(jobs, start) => self.begun_on_release(jobs, start),
            Event::Finished { id, result } => self.finish(id, *result),
            Event::BacklogPage {
                jobs,
                limit,
                next_due,
            } => self.backlog_page(jobs, limit, next_due),
            Event::OtherLanesPage { jobs, lane, limit } => {
                self.other_lanes_page(jobs, &lane, limit)
            }
            Event::Command(command) => self.commands.push_back(*command),
            Event::Controls(controls) => {
                self.registry_controls = controls;
                self.merge_controls();
            }
            Event::SubscriptionCaps(caps) => {
                self.subscription_caps = caps;
                self.merge_controls();
            }
            Event::SubscriptionGate(gate) => self.set_gate(gate),
            Event::CommandTargets { command, targets } => self.apply_command(*command, targets),
        }
    }

    /// Takes a ready job or one set aside out of its queue's accounting (its slot stays behind
    /// and is skipped): the caller gives it its next phase.
    fn leave_queue(&mut self, id: JobId) {
        let Some(entry) = self.cache.get_mut(&id) else {
            return;
        };
        match entry.phase {
            Phase::Ready => {
                self.queued_by_deadline.remove(&(entry.deadline, id));
                entry.phase = Phase::Unplaced;
                let key = entry.lane.clone();
                let cache = &self.cache;
                self.queues.left(&key, |(id, ticket)| {
                    cache
                        .get(&id)
                        .is_some_and(|e| e.phase == Phase::Ready && e.ticket == ticket)
                });
                self.relist(&key);
            }
            Phase::Aside => {
                self.queued_by_deadline.remove(&(entry.deadline, id));
                entry.phase = Phase::Unplaced;
                let cache = &self.cache;
                self.gates
                    .left_aside(|id| cache.get(&id).is_some_and(|e| e.phase == Phase::Aside));
            }
            _ => {}
        }
    }

    /// Puts a lane back in the ring if its gates let it start something, or forgets an idle
    /// lane; a lane gated until an instant gets a timer for it.
    fn relist(&mut self, key: &Arc<str>) {
        let Some(lane) = self.queues.lane(key) else {
            return;
        };
        let limit = match self.gates.limit(key, Instant::now()) {
            Limit::Open(n) => lane.window(n, self.limits.start_window),
            // An open breaker: one probe, when nothing else is under way.
            Limit::Probe if lane.pending() + lane.in_flight() == 0 => 1,
            Limit::Probe | Limit::Wait(None) | Limit::Paused => 0,
            Limit::Wait(Some(at)) => {
                if lane.ready() > 0 {
                    self.gates.wake_at(key, at);
                }
                0
            }
        };
        self.queues.relist(key, limit);
    }

    fn enqueue(&mut self, id: JobId) {
        self.enqueue_at(id, false);
    }

    /// Queues a job in its lane and bucket: at the back, or at the front for a job that was
    /// at the head already and only waited for its payload to be read back. A job of a paused
    /// bucket is set aside instead.
    fn enqueue_at(&mut self, id: JobId, front: bool) {
        self.leave_queue(id);
        let Some(entry) = self.cache.get_mut(&id) else {
            return;
        };
        self.queued_by_deadline.insert((entry.deadline, id));
        let bucket = entry.job.bucket.clone();
        if let Some(key) = self.gates.aside_key(&entry.job) {
            entry.phase = Phase::Aside;
            self.gates.set_aside(key, id);
            return;
        }
        entry.phase = Phase::Ready;
        entry.ticket = entry.ticket.wrapping_add(1);
        let key = entry.lane.clone();
        // Behind an open breaker the next probe comes from the head of the queue: a job that
        // was tried before goes first, since a job-specific failure of a first attempt is no
        // evidence that the endpoint is still down.
        let front = front || (entry.attempts > 0 && self.gates.is_open(&key));
        self.queues.push(&key, &bucket, (id, entry.ticket), front);
        self.relist(&key);
    }

    /// Makes a job wait for its timer (leaving its queue if it was in one).
    fn wait(&mut self, id: JobId, due: Instant) {
        self.leave_queue(id);
        if let Some(entry) = self.cache.get_mut(&id) {
            entry.phase = Phase::Waiting { due };
            self.cache.set_timer(id, due);
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        let wall = Utc::now();
        // Queued jobs whose time ran out while their queue was gated (paused, breaker open,
        // rate-limited, bucket paused): a gated queue is not picked from, where expiry is
        // usually noticed. Each is found through the deadline index, never by a walk.
        while let Some(&(deadline, id)) = self.queued_by_deadline.first() {
            if deadline > now {
                break;
            }
            self.queued_by_deadline.pop_first();
            let Some(expire_at) = self.cache.get(&id).map(|e| e.job.expire_at) else {
                continue;
            };
            if expire_at <= wall {
                self.expire(id, wall);
            } else if let Some(entry) = self.cache.get_mut(&id) {
                // The monotonic clock ran ahead of the wall clock: look again when it is due.
                entry.deadline = now + wait_until(wall, expire_at).max(Duration::from_millis(1));
                self.queued_by_deadline.insert((entry.deadline, id));
            }
        }
        while let Some(key) = self.gates.pop_wake(now) {
            // A lane may wait for a token to send what it has begun, or to begin more.
            match self.queues.lane(&key).is_some_and(|l| l.has_begun()) {
                true => self.dispatch(&key),
                false => self.relist(&key),
            }
        }
        let mut expired = Vec::new();
        let mut reload = Vec::new();
        while let Some(id) = self.cache.pop_due(now) {
            let Some(entry) = self.cache.get(&id) else {
                continue;
            };
            if entry.job.expire_at <= wall {
                expired.push(id);
            } else if entry.spilled {
                reload.push(id);
            } else {
                self.enqueue(id);
            }
        }
        for id in &reload {
            if let Some(entry) = self.cache.get_mut(id) {
                entry.phase = Phase::Reloading;
            }
        }
        if !reload.is_empty() {
            self.reload(reload);
        }
        if !expired.is_empty() {
            let rows: Vec<Transition> = expired
                .iter()
                .filter_map(|id| self.forget(*id))
                .map(|e| Transition::archiving(e.job.id, e.attempts, wall))
                .collect();
            self.metrics.jobs_expired.inc_by(rows.len() as u64);
            self.cache.gauge();
            self.outbox.extend(rows);
            self.expired(expired);
        }
    }

    /// The job expired before delivery: it leaves the cache as `archiving` for the archive.
    fn expire(&mut self, id: JobId, now: DateTime<Utc>) {
        if let Some(entry) = self.forget(id) {
            self.metrics.jobs_expired.inc();
            self.cache.gauge();
            self.outbox
                .push(Transition::archiving(id, entry.attempts, now));
            self.expired(vec![id]);
        }
    }

    /// A job whose payload was being fetched for its turn no longer is: its lane may take
    /// another.
    fn unfetch(&mut self, id: JobId) {
        let Some(entry) = self.cache.get(&id).filter(|e| e.phase == Phase::Fetching) else {
            return;
        };
        let key = entry.lane.clone();
        if let Some(lane) = self.queues.lane_mut(&key) {
            lane.fetched();
        }
        self.relist(&key);
    }

    /// Caches a job. Returns whether it is cached: a full cache leaves it in the JobDB for a
    /// backlog pass.
    fn admit(&mut self, entry: Entry) -> bool {
        if self.holds_half(&entry.lane) && !self.cache.contains(&entry.job.id) {
            // The lane is the hog already (more than half the cache ready): the job rests
            // now, where pages that leave the hog out do not read it, instead of filling the
            // rest of the cache to be evicted, one write each, as other lanes' jobs come.
            self.backlog.hog_stays_in_backlog();
            return false;
        }
        self.make_room(&entry);
        match self.cache.admit(entry) {
            Admitted::Cached => true,
            Admitted::Present => false,
            Admitted::Full => {
                self.backlog.due_now();
                false
            }
        }
    }

    /// Jobs a backlog page reads at most.
    fn page(&self) -> usize {
        (self.limits.max_cached_jobs / 4).clamp(1, 1000)
    }

    /// Ready jobs of the lane in the queues.
    fn ready_in(&self, lane: &Arc<str>) -> usize {
        self.queues.lane(lane).map_or(0, |l| l.ready())
    }

    /// Whether the lane holds more than half the cache's cap in ready jobs: it is the hog
    /// ([`Cache::hog`] counts these and more), and takes no more jobs into the cache.
    fn holds_half(&self, lane: &Arc<str>) -> bool {
        self.ready_in(lane) > self.limits.max_cached_jobs / 2
    }

    /// A full cache takes a job of a lane holding fewer ready jobs than the largest lane by
    /// letting the largest lane's newest ready job go back to rest in the JobDB (a pass reads
    /// it in again when there is room): a lane whose endpoint hangs with more jobs than the
    /// cache holds cannot keep every other lane's new jobs out.
    fn make_room(&mut self, entry: &Entry) {
        if self.cache.room() > 0 || self.cache.contains(&entry.job.id) {
            return;
        }
        let mine = self.queues.lane(&entry.lane).map_or(0, |lane| lane.ready());
        let cache = &self.cache;
        let victim = self.queues.newest_of_largest(mine, |(id, ticket)| {
            cache
                .get(&id)
                .is_some_and(|e| e.phase == Phase::Ready && e.ticket == ticket)
        });
        if let Some(victim) = victim {
            self.evict(vec![victim]);
        }
    }

    /// Waiting jobs leave the cache to rest in the JobDB, where a later pass finds them.
    fn evict(&mut self, ids: Vec<JobId>) {
        for id in &ids {
            self.forget(*id);
        }
        self.metrics.jobs_evicted.inc_by(ids.len() as u64);
        // A job that never rested needs its entry to be found again; the writer knows which.
        self.rests.extend(ids);
        self.backlog.evicted();
    }

    /// How far ahead a job counts as due soon (`--spill-after-ms`), for the JobDB's clock.
    fn horizon(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.limits.spill_after).unwrap_or(chrono::Duration::MAX)
    }

    /// Caches a job at its place: ready now, or waiting until it is due (`retry_at`);
    /// whether it is in the cache.
    fn admit_at(&mut self, entry: Entry, retry_at: Option<DateTime<Utc>>) -> bool {
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
            return true;
        }
        self.cache.contains(&id)
    }

    /// Removes a job from the cache and its queue, keeping the counts right.
    fn forget(&mut self, id: JobId) -> Option<Entry> {
        self.leave_queue(id);
        let entry = self.cache.remove(id)?;
        self.backlog.left_cache(id);
        Some(entry)
    }

    /// Applies the registry's controls with the subscriptions' caps: on an endpoint both
    /// cap, the tighter of each.
    fn merge_controls(&mut self) {
        if self.subscription_caps.is_empty() {
            self.set_controls(self.registry_controls.clone());
            return;
        }
        let mut merged = (*self.registry_controls).clone();
        for (endpoint, cap) in self.subscription_caps.iter() {
            let control = merged
                .endpoints
                .entry(endpoint.clone())
                .or_insert_with(|| EndpointControl::unset(endpoint, "subscriptions"));
            let tighter = crate::events::Cap {
                max_concurrency: control.max_concurrency,
                max_per_second: control.max_per_second,
            }
            .tighter(*cap);
            control.max_concurrency = tighter.max_concurrency;
            control.max_per_second = tighter.max_per_second;
        }
        self.set_controls(Arc::new(merged));
    }

    /// Applies a new set of controls: sets aside the due jobs of newly paused buckets, queues
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
            .queues
            .buckets()
            .filter(|b| controls.bucket_paused(b) && !self.gates.bucket_paused(b))
            .cloned()
            .collect();
        self.gates.set_controls(controls);
        if !newly_paused.is_empty() {
            // Rare (an operator's pause), so a walk over the paused buckets' queues is fine.
            let queued = self.queues.queued_in(&newly_paused);
            self.set_aside_queued(queued);
        }
        self.gates_changed();
    }

    /// Applies a new set of waiting subscriptions: sets aside the queued jobs of those disabled
    /// now (a walk over every queue, only then: an operator's change), and queues those of
    /// subscriptions that go again (enabled, or known at last).
    fn set_gate(&mut self, gate: Arc<crate::events::SubscriptionGate>) {
        let disabled = gate.disabled();
        if !self.gates.set_gate(gate) {
            self.gates_changed();
            return;
        }
        tracing::info!(disabled, "disabled subscriptions changed");
        let all: HashSet<Arc<str>> = self.queues.buckets().cloned().collect();
        let queued: Vec<JobId> = self
            .queues
            .queued_in(&all)
            .into_iter()
            .filter(|id| {
                self.cache.get(id).is_some_and(|e| {
                    e.job
                        .event
                        .as_ref()
                        .is_some_and(|ev| self.gates.subscription_waits(&ev.subscription))
                })
            })
            .collect();
        self.set_aside_queued(queued);
        self.gates_changed();
    }

    /// Queues these jobs again where they are still queued: a job a gate now holds is set aside.
    fn set_aside_queued(&mut self, ids: Vec<JobId>) {
        for id in ids {
            if self.cache.get(&id).is_some_and(|e| e.phase == Phase::Ready) {
                self.enqueue(id);
            }
        }
    }

    /// After a pause or a disable was lifted or set: queues the jobs no gate holds any more,
    /// and looks at every lane again.
    fn gates_changed(&mut self) {
        for id in self.gates.take_resumed() {
            if self.cache.get(&id).is_some_and(|e| e.phase == Phase::Aside) {
                self.enqueue(id);
            }
        }
        let cache = &self.cache;
        self.gates
            .prune_aside(|id| cache.get(&id).is_some_and(|e| e.phase == Phase::Aside));
        let keys: Vec<Arc<str>> = self.queues.lanes().map(|(key, _)| key.clone()).collect();
        for key in keys {
            self.dispatch(&key);
        }
    }
}

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
