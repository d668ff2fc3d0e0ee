//! The group-commit writer: the only task that writes to the JobDB.
//!
//! Submissions and transitions queue on one channel. The writer takes everything queued (up to
//! a row and a byte budget), appends it in one fenced transaction with multi-row INSERTs, and
//! only after COMMIT acknowledges the producers and hands the new jobs to the scheduler. One
//! writer keeps transition ids and commit order identical, so a crash can never leave a gap in
//! a history.
//!
//! A commit that accepts jobs or begins attempts writes its `commit_log` row, listing them:
//! that is their record until they have rows of their own (schema 5). The writer keeps the
//! account of what its commits left open (`open`): it rests jobs that wait long without a row
//! (their `open_jobs` entries), knows which ending jobs never had an entry, and moves the
//! JobDB's checkpoint past commits that hold nothing open.
//!
//! Every transaction is bounded ([`JobDb::append_bounded`], [`WriterLimits::write_timeout`]):
//! its lock waits by the server, its work before the COMMIT and the COMMIT's answer by the
//! writer, so a JobDB that stops answering costs a bounded wait, never a hung writer.
//!
//! A failed append is classified before anything is retried:
//! - not committed, may pass (connection, pool, a lock wait or the work running out of time):
//!   producers get a 503 at once, transitions of known jobs wait and go again;
//! - outcome unknown (the COMMIT's answer was lost, or did not come in time): once the server
//!   is certainly done with that connection, the JobDB is asked whether the batch's log row
//!   (or last row) exists;
//! - refused (the server will never take these rows): the batch is split in halves until the
//!   one request that carries the refused rows is found; it alone is refused (counted, logged),
//!   everything batched with it is written. One oversized job never costs its neighbours.
//!
//! A producer's request is claimed once ([`Ticket`](crate::director::mailbox::Ticket)): by
//! the writer when it takes it into a batch, or by its handler when the handler's wait ends
//! first, and then it is never written.
//! A handler that stops waiting after the writer took its request answers 504 (outcome
//! unknown), and no later try of a failed batch writes that request. A router's forward is
//! never committed after its `not_after`, checked just before every COMMIT that carries it.
//!
//! Until a commit succeeds the writer reports that it has work ([`Progress`]): the watchdog
//! turns the Director non-ready when that lasts past [`WriterLimits::unwritable_after`], and
//! while the last try failed the writer probes the JobDB (the checkpoint alone) every second,
//! so it finds out that the JobDB can be written again with no request to carry it.
//!
//! Which ordered jobs a commit stores fresh, releases or blocks is not the writer's to decide:
//! it asks its [`Ordering`] for a plan before each try, writes what the plan says, and tells
//! it whether the commit happened.
//!
//! # Files
//! - `mod.rs`: [`WriterLimits`], the [`Writer`] task, and taking queued requests into a batch
//!   (numbering their rows, refusing at once what can never be written); the requests
//!   themselves are `director::mailbox`'s;
//! - `batch.rs`: a batch of requests, split, narrowed and answered request by request;
//! - `commit.rs`: committing a batch and what its outcome means: acknowledge, retry, isolate
//!   a refused request, find out an unknown outcome;
//! - `open.rs`: its account of what its commits left open.

mod batch;
mod commit;
mod open;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::job::{Job, JobId, Recovered, Transition};
use crate::jobdb::lifecycle::Origin;
use crate::jobdb::{job_row_bytes, transition_row_bytes, Bounds, Fresh, JobDb, OpenRow};
use crate::metrics::Metrics;
use batch::{Batch, Reply};
use open::OpenWork;

use super::mailbox::{Event, WriteOp, WriteRejected};
use super::ordering::Ordering;
use super::supervise::Progress;

/// Limits of one group commit.
#[derive(Clone, Copy, Debug)]
pub struct WriterLimits {
    /// Stop adding queued requests to a transaction past this many rows.
    pub max_rows: usize,
    /// Stop adding queued requests past this many bytes of rows (every column counted).
    pub max_bytes: usize,
    /// A job accepted this long ago without a row of its own (never tried, or tried and not
    /// ended) rests: it gets its `open_jobs` entry, and the checkpoint moves on. Longer means
    /// fewer entries written under a backlog and more of `commit_log` read by a new owner.
    pub rest_after: Duration,
    /// The most a producer's request waits for its outcome (`--write-timeout-ms`); each
    /// transaction's bounds derive from it (see [`WriterLimits::lock_wait`]).
    pub write_timeout: Duration,
}

impl WriterLimits {
    /// How long the writer may try to commit without success before the JobDB counts as not
    /// writable (the Director not ready): two fifths of the write timeout, so a request that
    /// reaches a JobDB gone silent still hears the definite 503 within its wait.
    pub fn unwritable_after(&self) -> Duration {
        self.write_timeout * 2 / 5
    }

    /// The most any statement of the Director's connections waits for a lock, enforced by the
    /// server (whole seconds, at least one): [`WriterLimits::unwritable_after`], rounded down.
    pub fn lock_wait(&self) -> Duration {
        Duration::from_secs(self.unwritable_after().as_secs().max(1))
    }

    /// The bounds of one transaction: its work before the COMMIT, and the COMMIT's answer,
    /// each the write timeout (a transaction that takes longer has no producer left to tell)
    /// and at least a second longer than the server's own lock wait, which ends a statement
    /// waiting for a lock first, with an error, keeping the connection. What these bounds
    /// catch is a server or network that stopped answering.
    fn bounds(&self, not_after: Option<DateTime<Utc>>) -> Bounds {
        let bound = self
            .write_timeout
            .max(self.lock_wait() + Duration::from_secs(1));
        Bounds {
            work: Some(bound),
            commit: Some(bound),
            not_after,
        }
    }
}

/// How often a writer whose last try failed writes the checkpoint alone, to find out whether
/// the JobDB can be written again.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Sleeps until `at`, or forever when there is none.
async fn sleep_until(at: Option<DateTime<Utc>>) {
    match at {
        Some(at) => tokio::time::sleep((at - Utc::now()).to_std().unwrap_or_default()).await,
        None => std::future::pending().await,
    }
}

/// The writer task's state.
pub struct Writer {
    db: JobDb,
    token: u64,
    next_id: u64,
    limits: WriterLimits,
    rx: mpsc::Receiver<WriteOp>,
    scheduler: mpsc::UnboundedSender<Event>,
    metrics: Arc<Metrics>,
    lock_lost: CancellationToken,
    /// What its commits left open.
    open: OpenWork,
    /// What ordered jobs each commit stores, releases and blocks.
    ordering: Ordering,
    /// The checkpoint last written, and when (`None`: not yet by this writer).
    checkpoint: Option<(u64, Instant)>,
    /// Busy from a try to commit until one succeeds: what the watchdog and the intake read
    /// as "the JobDB cannot be written" once it lasts.
    progress: Progress,
}

impl Writer {
    /// A writer for `db` under fencing `token`, numbering rows from `next_id`, taking requests
    /// from `rx`, telling `scheduler` about durable jobs, its ordered jobs decided by
    /// `ordering`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        db: JobDb,
        token: u64,
        next_id: u64,
        limits: WriterLimits,
        rx: mpsc::Receiver<WriteOp>,
        scheduler: mpsc::UnboundedSender<Event>,
        ordering: Ordering,
        metrics: Arc<Metrics>,
        lock_lost: CancellationToken,
    ) -> Self {
        Writer {
            db,
            token,
            next_id,
            limits,
            rx,
            scheduler,
            metrics,
            lock_lost,
            open: OpenWork::default(),
            ordering,
            checkpoint: None,
            progress: Progress::default(),
        }
    }

    /// Reports its progress to `progress` (the watchdog's handle).
    pub fn watched(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Runs until every sender is gone (a clean stop) or ownership is lost.
    pub async fn run(mut self) {
        loop {
            // While the last try failed, nothing may come to try again: probe.
            let next = match self.progress.is_busy() {
                true => tokio::select! {
                    next = self.rx.recv() => next,
                    _ = tokio::time::sleep(PROBE_EVERY) => {
                        self.probe().await;
                        continue;
                    }
                },
                false => tokio::select! {
                    next = self.rx.recv() => next,
                    // A kept job goes to be ended at its expiry, even while nothing comes to
                    // commit.
                    _ = sleep_until(self.ordering.next_kept_expiry()) => {
                        self.expire_kept();
                        continue;
                    }
                },
            };
            let Some(first) = next else { break };
            let mut batch = Batch::default();
            self.add(&mut batch, first);
            while batch.rows.len() + batch.jobs.len() + batch.starts.len() < self.limits.max_rows
                && batch.bytes < self.limits.max_bytes
            {
                match self.rx.try_recv() {
                    Ok(op) => self.add(&mut batch, op),
                    Err(_) => break,
                }
            }
            self.commit(batch).await;
        }
    }

    /// Numbers a request's rows and adds it to the batch, or answers it at once: a router's
    /// forward whose `not_after` has passed, or jobs with a row larger than the JobDB takes.
    fn add(&mut self, batch: &mut Batch, op: WriteOp) {
        let max_row = self.db.max_row_bytes();
        match op {
            WriteOp::Submit {
                jobs,
                events,
                scheduled,
                not_after,
                repeats,
                cleared,
                reply,
                ticket,
            } => {
                if !ticket.take() {
                    // Its handler stopped waiting first and answered 503: never written.
                    return;
                }
                if not_after.is_some_and(|deadline| Utc::now() > deadline) {
                    self.metrics.write_rejected("submit", "expired");
                    tracing::warn!(
                        jobs = jobs.len(),
                        "forwarded jobs refused: their not_after passed before the write"
                    );
                    let _ = reply.send(Err(WriteRejected::Expired));
                    return;
                }
                if let Some(job) = jobs.iter().find(|j| job_row_bytes(j) > max_row) {
                    self.refused_too_large("submit", job, max_row);
                    let _ = reply.send(Err(WriteRejected::Refused { too_large: true }));
                    return;
                }
                self.ordering.cleared(cleared);
                let now = Utc::now();
                // `scheduled` lists jobs in the order of `jobs`.
                let mut later = scheduled.iter().peekable();
                for job in &jobs {
                    batch.bytes += job_row_bytes(job);
                    // A scheduled job rests from the start: its row puts it in `open_jobs`. An
                    // ordered one gets its entry here unless its plan keeps it fresh.
                    match later.next_if(|(id, _)| *id == job.id) {
                        Some((id, at)) => {
                            let row = self.take_id();
                            batch.rows.push((row, Transition::scheduled(*id, now, *at)));
                        }
                        None if job.ordering.is_some() => {
                            let id = self.take_id();
                            batch
                                .rests
                                .push(OpenRow::resting(job.id, id, Some(Fresh::of(job))));
                        }
                        None => batch.accepted.push((job.id, Fresh::of(job))),
                    }
                }
                batch.jobs.extend(jobs);
                batch.bytes += events.iter().map(|e| e.envelope.len()).sum::<usize>();
                batch.events.extend(events);
                let reply = Reply::Submit(reply, repeats, 0, scheduled);
                batch.seal_producers(reply, Some(ticket), not_after);
            }
            WriteOp::Import {
                jobs,
                from_jobdb,
                blocks,
                reply,
                ticket,
            } => {
                if !ticket.take() {
                    // Its handler stopped waiting first and answered 503: never written.
                    return;
                }
                if let Some(r) = jobs.iter().find(|r| job_row_bytes(&r.job) > max_row) {
                    self.refused_too_large("import", &r.job, max_row);
                    let _ = reply.send(Err(WriteRejected::Refused { too_large: true }));
                    return;
                }
                let now = Utc::now();
                for r in &jobs {
                    let retry_at = r.retry_at.unwrap_or(now);
                    let id = self.take_id();
                    batch.bytes += job_row_bytes(&r.job);
                    batch.rows.push((
                        id,
                        Transition::imported(r.job.id, r.attempts, now, retry_at),
                    ));
                    batch.origins.push(Origin {
                        job_id: r.job.id,
                        from_jobdb: from_jobdb.clone(),
                        imported_at: now,
                    });
                    batch.jobs.push(r.job.clone());
                }
                batch.seal_producers(Reply::Import(reply, jobs, blocks), Some(ticket), None);
            }
            WriteOp::Transitions { rows, done } => {
                self.push_rows(batch, rows);
                batch.seal(Reply::Transitions(done));
            }
            WriteOp::Start { rows, starts, done } => {
                self.push_rows(batch, rows);
                batch.bytes += starts.len() * 40;
                batch.starts.extend(starts);
                batch.seal(Reply::Start(done));
            }
            WriteOp::Rest { jobs, done } => {
                // Numbered now, before any later barrier: a backlog page read after that
                // barrier sees the entry. Jobs no longer fresh have an entry, or ended.
                let fresh = jobs
                    .into_iter()
                    .filter_map(|job| Some((job, self.open.fresh(&job)?)))
                    .collect();
                self.rest_fresh(&mut batch.rests, fresh);
                batch.seal(Reply::Rest(done));
            }
            WriteOp::Begin { seqs } => {
                batch.bytes += seqs.len() * 16;
                batch.seal(Reply::Begin(seqs));
            }
            WriteOp::Release { heads, expired } => {
                batch.bytes += (heads.len() + expired.len()) * 32;
                batch.release.extend(heads);
                batch.seal(Reply::Release(expired));
            }
            WriteOp::Barrier(reply) => batch.seal(Reply::Barrier(reply, self.next_id)),
            WriteOp::RestKept(reply) => {
                // An operator command's read sees entries only: every kept job gets its own
                // first (held, before the barrier's id).
                let kept = self
                    .ordering
                    .kept()
                    .into_iter()
                    .filter_map(|job| Some((job, self.open.fresh(&job)?)))
                    .collect();
                self.rest_fresh(&mut batch.rests, kept);
                batch.seal(Reply::Barrier(reply, self.next_id));
            }
            WriteOp::BlocksLeft { as_of, left } => {
                self.ordering.blocks_left(as_of, left);
                batch.seal(Reply::Release(Vec::new()));
            }
        }
    }

    fn push_rows(&mut self, batch: &mut Batch, rows: Vec<Transition>) {
        for row in rows {
            let id = self.take_id();
            batch.bytes += transition_row_bytes(&row);
            batch.rows.push((id, row));
        }
    }

    /// Kept jobs whose expiry passed go to the scheduler, to be ended untried (they are fresh:
    /// nothing is written for them until that end).
    fn expire_kept(&mut self) {
        let expired: Vec<Recovered> = self
            .ordering
            .expire_kept(Utc::now())
            .into_iter()
            .map(|job| Recovered {
                job,
                attempts: 0,
                retry_at: None,
            })
            .collect();
        if !expired.is_empty() {
            let _ = self.scheduler.send(Event::HandedOver(expired));
        }
    }

    /// Adds to `rests` the entry of each fresh job of `jobs` that has none there yet (see
    /// [`OpenRow::rest_of_fresh`]), numbered now: held until the write's plan says whether an
    /// ordered one waits.
    fn rest_fresh(&mut self, rests: &mut Vec<OpenRow>, jobs: Vec<(JobId, Fresh)>) {
        let mut listed: HashSet<JobId> = rests.iter().map(|r| r.job_id).collect();
        for (job, fresh) in jobs {
            if listed.insert(job) {
                let id = self.take_id();
                rests.push(OpenRow::rest_of_fresh(job, id, fresh, true));
            }
        }
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn refused_too_large(&self, op: &'static str, job: &Job, max_row: usize) {
        self.metrics.write_rejected(op, "refused");
        tracing::error!(
            job = %job.id,
            bytes = job_row_bytes(job),
            max_row,
            "jobs refused: a row is larger than the jobdb's server accepts (max_allowed_packet)"
        );
    }
}
