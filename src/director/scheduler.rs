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
//! - Before an attempt starts, its `executing` row is committed (batched with the others picked
//!   at the same time), so a fenced-out Director cannot start deliveries, and after a crash the
//!   attempts that were in flight are known.
//!
//! Everything here runs on one task and owns its state: no locks.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::delivery::classify::Verdict;
use crate::delivery::{backoff, AttemptResult, Deliverer};
use crate::job::{Job, JobId, Transition};
use crate::jobdb::JobDb;
use crate::metrics::Metrics;

use super::writer::{WriteOp, WriteRejected};

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
}

/// Where a job is, with respect to delivery.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
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
}

struct Entry {
    job: Arc<Job>,
    /// The payload and headers were dropped from memory; read the job back before delivering.
    spilled: bool,
    /// The job's lane (its endpoint without query), computed once.
    lane: Arc<str>,
    attempts: u16,
    phase: Phase,
}

impl Entry {
    fn new(job: Arc<Job>, attempts: u16) -> Self {
        Entry {
            lane: job.endpoint_key().into(),
            spilled: false,
            job,
            attempts,
            phase: Phase::Ready,
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
    ready: usize,
    queues: HashMap<Arc<str>, VecDeque<JobId>>,
    buckets: VecDeque<Arc<str>>,
    listed: bool,
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
    /// Rows waiting to go to the writer, in the order they happened. Only this task sends
    /// them, so a job's rows reach the writer (and get their ids) in order.
    outbox: Vec<Transition>,
    /// Told the ids of jobs that expired (the archiver takes them from `archiving`).
    expired_tx: Option<mpsc::UnboundedSender<Vec<JobId>>>,
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
            outbox: Vec::new(),
            expired_tx: None,
        }
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
        let now = Utc::now();
        let instant = Instant::now();
        for r in recovered {
            let id = r.job.id;
            let due = r
                .retry_at
                .map(|at| at.min(r.job.expire_at))
                .filter(|at| *at > now)
                .map(|at| instant + (at - now).to_std().unwrap_or_default());
            self.jobs.insert(id, Entry::new(r.job, r.attempts));
            match due {
                Some(due) => self.wait(id, due),
                None => self.enqueue(id),
            }
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
        loop {
            let next_timer = self.timers.peek().map(|Reverse((due, _))| *due);
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
                _ = tokio::time::sleep_until(stopping_at.unwrap_or_else(Instant::now)), if stopping_at.is_some() => {
                    tracing::warn!(in_flight = self.in_flight, "grace period over; attempts still in flight will be recovered as interrupted");
                    break;
                }
            }
            if stopping_at.is_none() {
                self.pump().await;
            }
            self.flush().await;
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
                    let id = job.id;
                    self.jobs.insert(id, Entry::new(job, 0));
                    self.enqueue(id);
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
                tracing::warn!(jobs = ids.len(), reason = %why, "could not record attempts; not starting them");
                for id in ids {
                    let Some(key) = self.lane_of(id) else {
                        continue;
                    };
                    self.in_flight -= 1;
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.starting -= 1;
                    }
                    if let Some(entry) = self.jobs.get_mut(&id) {
                        entry.attempts -= 1;
                    }
                    self.enqueue(id);
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
                        .filter(|e| e.phase == Phase::Reloading)
                    {
                        entry.job = Arc::new(job);
                        entry.spilled = false;
                        self.spilled -= 1;
                        self.enqueue(id);
                    }
                }
                for id in asked.into_iter().filter(|id| !found.contains(id)) {
                    tracing::error!(job = %id, "spilled job missing from the jobdb; trying again");
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
                        .is_some_and(|e| e.phase == Phase::Reloading)
                    {
                        self.wait(id, later);
                    }
                }
            }
            Event::Finished { id, result } => self.finish(id, *result),
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
        while self.in_flight < self.limits.max_in_flight && starts.len() < self.limits.start_batch {
            let Some((id, key)) = self.pick() else { break };
            match self.jobs.get_mut(&id) {
                Some(entry) if entry.job.expire_at <= now => self.expire(id, now),
                Some(entry) => {
                    entry.attempts += 1;
                    entry.phase = Phase::Starting;
                    starts.push(Transition::executing(id, entry.attempts, now));
                    self.in_flight += 1;
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.starting += 1;
                    }
                }
                None => {}
            }
            self.relist(&key);
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

    /// The next job to start (head lane of the ring, its next bucket) and its lane. The caller
    /// relists the lane once it has counted the attempt, so a lane is never forgotten while
    /// an attempt of it is being started.
    fn pick(&mut self) -> Option<(JobId, Arc<str>)> {
        let key = self.ring.pop_front()?;
        let lane = self.lanes.get_mut(&key)?;
        lane.listed = false;
        let bucket = lane.buckets.pop_front()?;
        let queue = lane.queues.get_mut(&bucket)?;
        let id = queue.pop_front();
        if queue.is_empty() {
            lane.queues.remove(&bucket);
        } else {
            lane.buckets.push_back(bucket);
        }
        lane.ready -= 1;
        id.map(|id| (id, key))
    }

    /// Puts a lane back in the ring if it can start something, or forgets an idle lane.
    fn relist(&mut self, key: &Arc<str>) {
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        let pending = lane.starting + lane.started.len();
        if lane.ready > 0 && pending < self.limits.per_endpoint {
            if !lane.listed {
                lane.listed = true;
                self.ring.push_back(key.clone());
            }
        } else if lane.ready == 0 && pending == 0 && lane.in_flight == 0 && !lane.listed {
            self.lanes.remove(key);
        }
    }

    fn enqueue(&mut self, id: JobId) {
        let Some(entry) = self.jobs.get_mut(&id) else {
            return;
        };
        entry.phase = Phase::Ready;
        let key = entry.lane.clone();
        let bucket = entry.job.bucket.clone();
        let lane = self.lanes.entry(key.clone()).or_default();
        let queue = lane.queues.entry(bucket.clone()).or_default();
        if queue.is_empty() {
            lane.buckets.push_back(bucket);
        }
        queue.push_back(id);
        lane.ready += 1;
        self.relist(&key);
    }

    fn wait(&mut self, id: JobId, due: Instant) {
        if let Some(entry) = self.jobs.get_mut(&id) {
            entry.phase = Phase::Waiting { due };
            self.timers.push(Reverse((due, id)));
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        let wall = Utc::now();
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
            let removed: Vec<Entry> = expired
                .iter()
                .filter_map(|id| self.jobs.remove(id))
                .collect();
            self.spilled -= removed.iter().filter(|e| e.spilled).count();
            self.metrics.jobs_spilled.set(self.spilled as i64);
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
        if let Some(entry) = self.jobs.remove(&id) {
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
        let per_endpoint = self.limits.per_endpoint;
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
            let mut stub = (*entry.job).clone();
            stub.payload = bytes::Bytes::new();
            stub.headers = Vec::new();
            entry.job = Arc::new(stub);
            entry.spilled = true;
            self.spilled += 1;
            self.metrics.jobs_spilled.set(self.spilled as i64);
        }
    }

    fn finish(&mut self, id: JobId, result: AttemptResult) {
        let Some(key) = self.lane_of(id) else { return };
        self.in_flight -= 1;
        self.metrics.in_flight.set(self.in_flight as i64);
        if let Some(lane) = self.lanes.get_mut(&key) {
            lane.in_flight -= 1;
        }
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
                self.jobs.remove(&id);
                Transition::succeeded(id, attempt, now, result.record)
            }
            Verdict::Discard { .. } => {
                self.jobs.remove(&id);
                Transition::discarded(id, attempt, now, result.record)
            }
            Verdict::Retry { retry_after, .. } => {
                let job = &entry.job;
                let unit: f64 = rand::rng().random();
                let mut delay = backoff::delay(&job.retry, attempt, self.limits.backoff_cap, unit);
                if let Some(asked) = retry_after {
                    delay = delay.max(asked);
                }
                let retry_at =
                    now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
                let wake = retry_at.min(job.expire_at);
                let wait = (wake - now).to_std().unwrap_or_default();
                let row = Transition::awaiting_retry(id, attempt, now, retry_at, result.record);
                if wait >= self.limits.spill_after {
                    self.spill(id);
                }
                self.wait(id, Instant::now() + wait);
                row
            }
        };
        self.metrics.jobs_cached.set(self.jobs.len() as i64);
        self.outbox.push(row);
    }
}
