//! The cache: every unfinished job the scheduler holds, what each costs in memory, and the
//! timers of the jobs waiting for a retry.
//!
//! A job waiting long enough keeps only its metadata here (it is *spilled*: payload and
//! headers dropped) and is read back from the JobDB when it comes due. Beyond `max_jobs`
//! entries new jobs stay in the JobDB only (a backlog pass reads them in later); a full cache
//! can *evict* jobs waiting far ahead, which a later pass reads back before they are due.

use std::cmp::Reverse;
use std::collections::hash_map::Entry as Slot;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::job::{Job, JobId};
use crate::jobdb::commands::Command;
use crate::metrics::Metrics;

use super::deadline_of;

/// Where a job is, with respect to delivery.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Phase {
    /// Out of every queue and timer for a moment: just cached, or just taken from its queue;
    /// the code at hand gives it its next phase.
    Unplaced,
    /// In its lane's queue.
    Ready,
    /// Waiting for its timer.
    Waiting { due: Instant },
    /// The commit that begins its attempt (its `commit_log` row) is being written.
    Starting,
    /// Its attempt is in flight.
    InFlight,
    /// Due, its payload being read back from the JobDB.
    Reloading,
    /// At the head of its queue, its payload being read back (it was cached over budget).
    Fetching,
    /// Due, but its bucket is paused: out of the queues until it is resumed.
    Aside,
}

/// One cached job and where it stands.
pub(super) struct Entry {
    pub(super) job: Arc<Job>,
    /// When it expires, on the scheduler's clock: ready jobs and those set aside are indexed by it.
    pub(super) deadline: Instant,
    /// Which of its queue slots is live: a job leaving its queue other than by being picked
    /// leaves its slot behind, skipped when reached (O(1) removal from the middle).
    pub(super) ticket: u32,
    /// A discard or flush that named the job while an attempt was under way: applied if
    /// the attempt ends in a retry.
    pub(super) doomed: Option<Arc<Command>>,
    /// When its last attempt failed into the wait it is in (`None`: not waiting on its own
    /// failure, e.g. postponed by an operator or read in from the JobDB).
    pub(super) failed_at: Option<Instant>,
    /// The payload and headers were dropped from memory; read the job back before delivering.
    pub(super) spilled: bool,
    /// The job's lane (its endpoint without query), computed once.
    pub(super) lane: Arc<str>,
    /// Attempts started so far.
    pub(super) attempts: u16,
    /// Where its attempt under way began (the commit that listed it), for the row that ends it.
    pub(super) started: Option<crate::job::AttemptStart>,
    /// Its attempt under way is its endpoint's breaker probe (sent even though the breaker is
    /// open).
    pub(super) probe: bool,
    pub(super) phase: Phase,
}

impl Entry {
    /// A job about to be cached, with the attempts it has made.
    pub(super) fn new(job: Arc<Job>, attempts: u16) -> Self {
        Entry {
            deadline: deadline_of(job.expire_at),
            ticket: 0,
            doomed: None,
            failed_at: None,
            // Most endpoints have no query: the lane is the endpoint, held once.
            lane: if job.lane().len() == job.endpoint.len() {
                job.endpoint.clone()
            } else {
                job.lane().into()
            },
            spilled: false,
            job,
            attempts,
            started: None,
            probe: false,
            phase: Phase::Unplaced,
        }
    }

    /// Whether it waits for its turn (ready in its queue, waiting for its timer, or set aside),
    /// with nothing under way: it may go back to rest in the JobDB.
    fn is_waiting(&self) -> bool {
        matches!(
            self.phase,
            Phase::Ready | Phase::Waiting { .. } | Phase::Aside
        )
    }
}

/// What [`Cache::admit`] did with a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admitted {
    /// Cached (maybe spilled, if over the byte budget).
    Cached,
    /// Already cached (read in by a backlog page before its own event arrived).
    Present,
    /// The cache is full: the job stays in the JobDB only.
    Full,
}

/// The cached jobs, their memory accounting and their retry timers.
pub(super) struct Cache {
    jobs: HashMap<JobId, Entry>,
    /// Retry timers, `(due, job)`; stale ones (the job moved on) are skipped when reached.
    timers: BinaryHeap<Reverse<(Instant, JobId)>>,
    /// Entries whose payload is not in memory.
    spilled: usize,
    /// Payload and header bytes of the entries that are not spilled.
    bytes: usize,
    max_jobs: usize,
    max_bytes: usize,
    metrics: Arc<Metrics>,
}

impl Cache {
    /// An empty cache of at most `max_jobs` entries and `max_bytes` payload bytes.
    pub(super) fn new(max_jobs: usize, max_bytes: usize, metrics: Arc<Metrics>) -> Self {
        Cache {
            jobs: HashMap::new(),
            timers: BinaryHeap::new(),
            spilled: 0,
            bytes: 0,
            max_jobs,
            max_bytes,
            metrics,
        }
    }

    pub(super) fn get(&self, id: &JobId) -> Option<&Entry> {
        self.jobs.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &JobId) -> Option<&mut Entry> {
        self.jobs.get_mut(id)
    }

    pub(super) fn contains(&self, id: &JobId) -> bool {
        self.jobs.contains_key(id)
    }

    pub(super) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Less than half full: a backlog pass may read every waiting job.
    pub(super) fn roomy(&self) -> bool {
        self.jobs.len() < self.max_jobs / 2
    }

    /// Entries it can still take.
    pub(super) fn room(&self) -> usize {
        self.max_jobs.saturating_sub(self.jobs.len())
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&JobId, &Entry)> {
        self.jobs.iter()
    }

    /// Publishes the number of cached jobs.
    pub(super) fn gauge(&self) {
        self.metrics.jobs_cached.set(self.jobs.len() as i64);
    }

    /// Caches a job; beyond the byte budget it keeps only its metadata.
    pub(super) fn admit(&mut self, entry: Entry) -> Admitted {
        if self.jobs.contains_key(&entry.job.id) {
            return Admitted::Present;
        }
        if self.jobs.len() >= self.max_jobs {
            return Admitted::Full;
        }
        let id = entry.job.id;
        if entry.spilled {
            self.spilled += 1;
            self.metrics.jobs_spilled.set(self.spilled as i64);
        } else {
            self.bytes += weight(&entry.job);
        }
        if let Slot::Vacant(slot) = self.jobs.entry(id) {
            slot.insert(entry);
        }
        if self.bytes > self.max_bytes {
            self.spill(id);
        }
        self.metrics.cached_payload_bytes.set(self.bytes as i64);
        Admitted::Cached
    }

    /// Drops a job's payload and headers from memory; it is read back when due.
    pub(super) fn spill(&mut self, id: JobId) {
        if let Some(entry) = self.jobs.get_mut(&id).filter(|e| !e.spilled) {
            self.bytes = self.bytes.saturating_sub(weight(&entry.job));
            let mut stub = (*entry.job).clone();
            stub.payload = bytes::Bytes::new();
            stub.headers = Vec::new();
            entry.job = Arc::new(stub);
            entry.spilled = true;
            self.spilled += 1;
            self.metrics.jobs_spilled.set(self.spilled as i64);
            self.metrics.cached_payload_bytes.set(self.bytes as i64);
        }
    }

    /// Puts a spilled job's payload back (read from the JobDB). Returns its entry if it was
    /// waiting for exactly that (being reloaded or fetched).
    pub(super) fn restore(&mut self, job: Job) -> Option<&mut Entry> {
        let entry = self
            .jobs
            .get_mut(&job.id)
            .filter(|e| matches!(e.phase, Phase::Reloading | Phase::Fetching))?;
        if entry.spilled {
            self.spilled -= 1;
        } else {
            self.bytes = self.bytes.saturating_sub(weight(&entry.job));
        }
        self.bytes += weight(&job);
        entry.job = Arc::new(job);
        entry.spilled = false;
        Some(entry)
    }

    /// Publishes the memory gauges (after a run of [`Cache::restore`]).
    pub(super) fn publish_memory(&self) {
        self.metrics.jobs_spilled.set(self.spilled as i64);
        self.metrics.cached_payload_bytes.set(self.bytes as i64);
    }

    /// Removes a job, keeping the counts right. The caller takes it out of its queue first.
    pub(super) fn remove(&mut self, id: JobId) -> Option<Entry> {
        let entry = self.jobs.remove(&id)?;
        if entry.spilled {
            self.spilled -= 1;
            self.metrics.jobs_spilled.set(self.spilled as i64);
        } else {
            self.bytes = self.bytes.saturating_sub(weight(&entry.job));
            self.metrics.cached_payload_bytes.set(self.bytes as i64);
        }
        Some(entry)
    }

    /// Sets a job's retry timer (its phase says `Waiting { due }`).
    pub(super) fn set_timer(&mut self, id: JobId, due: Instant) {
        self.timers.push(Reverse((due, id)));
    }

    /// When the next retry timer fires.
    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((due, _))| *due)
    }

    /// The next job whose timer fired by `now` and that is still waiting on it.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<JobId> {
        while let Some(Reverse((due, id))) = self.timers.peek().copied() {
            if due > now {
                return None;
            }
            self.timers.pop();
            if self
                .jobs
                .get(&id)
                .is_some_and(|e| e.phase == Phase::Waiting { due })
            {
                return Some(id);
            }
        }
        None
    }

    /// The lane holding more jobs due soon (ready, set aside, or waiting for a retry due within
    /// `horizon` of `now`) than half the cache's cap less `margin`, if one does, and how many
    /// it holds above half: the *hog*, and what it may give way. Jobs waiting beyond the
    /// horizon do not count: a full cache evicts them anyway, and counted they made a lane
    /// whose retries wait far ahead keep its own untried jobs out of the cache. The margin (a
    /// backlog page) keeps a hog one while a few of its jobs go: read again, its resting jobs
    /// would come in by the page only to be refused (see `Scheduler::holds_half`), and its
    /// cached ones be read again for nothing. A walk over the cache when it is more than
    /// that full (once per backlog page then).
    pub(super) fn hog(
        &self,
        now: Instant,
        horizon: Duration,
        margin: usize,
    ) -> Option<(Arc<str>, usize)> {
        let half = self.max_jobs / 2;
        let threshold = half.saturating_sub(margin);
        if self.jobs.len() <= threshold {
            return None;
        }
        let soon = now + horizon;
        let mut cached: HashMap<&Arc<str>, usize> = HashMap::new();
        for entry in self.jobs.values() {
            let due_soon = match entry.phase {
                Phase::Ready | Phase::Aside => true,
                Phase::Waiting { due } => due <= soon,
                _ => false,
            };
            if due_soon {
                *cached.entry(&entry.lane).or_default() += 1;
            }
        }
        let (lane, n) = cached.into_iter().max_by_key(|(_, n)| *n)?;
        (n > threshold).then(|| (lane.clone(), n.saturating_sub(half)))
    }

    /// Up to `n` of the lane's waiting jobs (ready, waiting for a retry, or set aside), the
    /// newest first: those whose turn is furthest away.
    pub(super) fn newest_waiting_of(&self, lane: &Arc<str>, n: usize) -> Vec<JobId> {
        let mut ids: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, e)| e.lane == *lane && e.is_waiting())
            .map(|(id, _)| *id)
            .collect();
        if ids.len() > n {
            ids.select_nth_unstable_by(n, |a, b| b.cmp(a));
            ids.truncate(n);
        }
        ids
    }

    /// Makes room: up to `want` (at least a quarter of the cache) jobs waiting beyond
    /// `horizon` leave it, the furthest first (they would sit in memory longest). Returns
    /// those that left.
    pub(super) fn evict_far_waiting(
        &mut self,
        want: usize,
        now: Instant,
        horizon: Duration,
    ) -> Vec<JobId> {
        let mut far: Vec<(Instant, JobId)> = self
            .jobs
            .iter()
            .filter_map(|(id, e)| match e.phase {
                Phase::Waiting { due } if due > now + horizon => Some((due, *id)),
                _ => None,
            })
            .collect();
        if far.is_empty() {
            return Vec::new();
        }
        far.sort_unstable_by(|a, b| b.cmp(a));
        far.truncate(want.max(self.max_jobs / 4));
        for (_, id) in &far {
            if let Some(entry) = self.jobs.remove(id) {
                if entry.spilled {
                    self.spilled -= 1;
                } else {
                    self.bytes = self.bytes.saturating_sub(weight(&entry.job));
                }
            }
        }
        let jobs = &self.jobs;
        self.timers.retain(|Reverse((_, id))| jobs.contains_key(id));
        self.metrics.jobs_evicted.inc_by(far.len() as u64);
        self.publish_memory();
        self.gauge();
        far.into_iter().map(|(_, id)| id).collect()
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
