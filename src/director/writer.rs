//! The group-commit writer: the only task that writes to the JobDB.
//!
//! Submissions and transitions queue on one channel. The writer takes everything queued (up to
//! a row and a byte budget), appends it in one fenced transaction with multi-row INSERTs, and
//! only after COMMIT acknowledges the producers and hands the new jobs to the scheduler. One
//! writer keeps transition ids and commit order identical, so a crash can never leave a gap in
//! a history.
//!
//! A failed append is classified before anything is retried (see [`JobDb::append_with_origins`]):
//! - not committed, may pass (connection, pool): producers get a 503 at once, transitions of
//!   known jobs wait and go again;
//! - outcome unknown (the COMMIT's answer was lost): the JobDB is asked whether the batch's last
//!   row exists;
//! - refused (the server will never take these rows): the batch is split in halves until the
//!   one request that carries the refused rows is found; it alone is refused (counted, logged),
//!   everything batched with it is written. One oversized job never costs its neighbours.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::job::{Job, Transition};
use crate::jobdb::{job_row_bytes, transition_row_bytes, JobDb, JobDbError};
use crate::metrics::Metrics;

use super::scheduler::Event;
use crate::job::Recovered;
use crate::jobdb::lifecycle::Origin;
pub use crate::jobdb::write::{WriteOp, WriteRejected};

/// Limits of one group commit.
#[derive(Clone, Copy, Debug)]
pub struct WriterLimits {
    /// Stop adding queued requests to a transaction past this many rows.
    pub max_rows: usize,
    /// Stop adding queued requests past this many bytes of rows (every column counted).
    pub max_bytes: usize,
}

type Ack = oneshot::Sender<Result<(), WriteRejected>>;

/// Requests taken together into one transaction: their rows side by side in id order, and
/// for each request, where its rows end and who hears about it.
#[derive(Default)]
struct Batch {
    jobs: Vec<Arc<Job>>,
    rows: Vec<(u64, Transition)>,
    origins: Vec<Origin>,
    requests: Vec<Request>,
    bytes: usize,
}

/// One request of a batch: its rows are the batch's up to these ends (exclusive), from the
/// previous request's ends.
struct Request {
    jobs_end: usize,
    rows_end: usize,
    origins_end: usize,
    reply: Reply,
}

/// Who hears about a request's outcome.
enum Reply {
    Submit(oneshot::Sender<Result<Ulid, WriteRejected>>),
    Import(Ack, Vec<Recovered>),
    Transitions(Option<Ack>),
    Barrier(oneshot::Sender<u64>, u64),
}

impl Reply {
    fn kind(&self) -> &'static str {
        match self {
            Reply::Submit(_) => "submit",
            Reply::Import(..) => "import",
            Reply::Transitions(_) => "transitions",
            Reply::Barrier(..) => "barrier",
        }
    }

    /// A producer's request (a submission or an import): refused at once when the JobDB is
    /// unavailable, since the producer may send it again.
    fn is_producers(&self) -> bool {
        matches!(self, Reply::Submit(_) | Reply::Import(..))
    }

    fn reject(self, why: WriteRejected) {
        match self {
            Reply::Submit(reply) => {
                let _ = reply.send(Err(why));
            }
            Reply::Import(reply, _) | Reply::Transitions(Some(reply)) => {
                let _ = reply.send(Err(why));
            }
            Reply::Transitions(None) => {}
            // A barrier has nothing to refuse; its waiter learns from its channel closing.
            Reply::Barrier(..) => {}
        }
    }
}

impl Batch {
    /// Closes the request whose rows were just pushed.
    fn seal(&mut self, reply: Reply) {
        self.requests.push(Request {
            jobs_end: self.jobs.len(),
            rows_end: self.rows.len(),
            origins_end: self.origins.len(),
            reply,
        });
    }

    /// The requests from index `at` on, as a batch of their own (their rows move with them).
    fn split_off(&mut self, at: usize) -> Batch {
        let start = |b: &Batch| match at.checked_sub(1) {
            Some(prev) => {
                let r = &b.requests[prev];
                (r.jobs_end, r.rows_end, r.origins_end)
            }
            None => (0, 0, 0),
        };
        let (jobs, rows, origins) = start(self);
        let mut requests = self.requests.split_off(at);
        for r in &mut requests {
            r.jobs_end -= jobs;
            r.rows_end -= rows;
            r.origins_end -= origins;
        }
        Batch {
            jobs: self.jobs.split_off(jobs),
            rows: self.rows.split_off(rows),
            origins: self.origins.split_off(origins),
            requests,
            bytes: 0,
        }
    }

    /// Keeps only the requests `keep` says yes to (with their rows); the others are returned.
    fn retain(&mut self, keep: impl Fn(&Reply) -> bool) -> Vec<(Reply, usize)> {
        let old = std::mem::take(self);
        let (mut jobs, mut rows, mut origins) = (
            old.jobs.into_iter(),
            old.rows.into_iter(),
            old.origins.into_iter(),
        );
        let (mut j0, mut r0, mut o0) = (0, 0, 0);
        let mut dropped = Vec::new();
        for request in old.requests {
            let (nj, nr, no) = (
                request.jobs_end - j0,
                request.rows_end - r0,
                request.origins_end - o0,
            );
            (j0, r0, o0) = (request.jobs_end, request.rows_end, request.origins_end);
            if keep(&request.reply) {
                self.jobs.extend(jobs.by_ref().take(nj));
                self.rows.extend(rows.by_ref().take(nr));
                self.origins.extend(origins.by_ref().take(no));
                self.seal(request.reply);
            } else {
                jobs.by_ref().take(nj).for_each(drop);
                rows.by_ref().take(nr).for_each(drop);
                origins.by_ref().take(no).for_each(drop);
                dropped.push((request.reply, nj));
            }
        }
        dropped
    }

    /// Indexes of the requests that write rows.
    fn writing(&self) -> Vec<usize> {
        let mut start = 0;
        let mut out = Vec::new();
        for (i, r) in self.requests.iter().enumerate() {
            if r.rows_end > start {
                out.push(i);
            }
            start = r.rows_end;
        }
        out
    }
}

/// The writer task's state.
pub struct Writer {
    pub(super) db: JobDb,
    pub(super) token: u64,
    pub(super) next_id: u64,
    pub(super) limits: WriterLimits,
    pub(super) rx: mpsc::Receiver<WriteOp>,
    pub(super) scheduler: mpsc::UnboundedSender<Event>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) lock_lost: CancellationToken,
}

impl Writer {
    /// Runs until every sender is gone (a clean stop) or ownership is lost.
    pub async fn run(mut self) {
        while let Some(first) = self.rx.recv().await {
            let mut batch = Batch::default();
            self.add(&mut batch, first);
            while batch.rows.len() < self.limits.max_rows && batch.bytes < self.limits.max_bytes {
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
                not_after,
                reply,
            } => {
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
                for job in &jobs {
                    let id = self.take_id();
                    batch.bytes += job_row_bytes(job);
                    batch.rows.push((id, Transition::awaiting_scheduling(job)));
                }
                batch.jobs.extend(jobs);
                batch.seal(Reply::Submit(reply));
            }
            WriteOp::Import {
                jobs,
                from_jobdb,
                reply,
            } => {
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
                batch.seal(Reply::Import(reply, jobs));
            }
            WriteOp::Transitions { rows, done } => {
                for row in rows {
                    let id = self.take_id();
                    batch.bytes += transition_row_bytes(&row);
                    batch.rows.push((id, row));
                }
                batch.seal(Reply::Transitions(done));
            }
            WriteOp::Barrier(reply) => batch.seal(Reply::Barrier(reply, self.next_id)),
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

    /// Writes a batch, retrying what may pass and isolating what the JobDB refuses.
    async fn commit(&mut self, mut batch: Batch) {
        let mut pause = Duration::from_millis(50);
        loop {
            if self.lock_lost.is_cancelled() {
                return fail(batch, WriteRejected::LockLost);
            }
            if batch.rows.is_empty() && batch.jobs.is_empty() {
                return self.acknowledge(batch);
            }
            let started = Instant::now();
            let result = self
                .db
                .append_with_origins(self.token, &batch.jobs, &batch.rows, &batch.origins)
                .await;
            let committed = match result {
                Ok(()) => true,
                Err(JobDbError::Fenced { ours, current }) => {
                    tracing::error!(
                        ours,
                        current,
                        "fenced out of the jobdb: another director owns it"
                    );
                    self.metrics.fence_rejections.inc();
                    self.lock_lost.cancel();
                    return fail(batch, WriteRejected::LockLost);
                }
                Err(JobDbError::Refused(why)) => return self.isolate(batch, why).await,
                Err(JobDbError::CommitUnknown(err)) => {
                    tracing::warn!(error = %err, "jobdb commit's answer lost; checking whether it committed");
                    self.committed_after_error(&batch.rows).await
                }
                Err(err) => {
                    tracing::warn!(error = %err, cause = ?std::error::Error::source(&err), "jobdb append failed before its commit; nothing of it was stored");
                    false
                }
            };
            if committed {
                self.metrics
                    .observe_write(batch.rows.len(), started.elapsed());
                return self.acknowledge(batch);
            }
            // Not committed: producers get a clear 503 now (they may retry), while transitions
            // of jobs already owned must reach the JobDB, so they wait and go again.
            if batch.requests.iter().any(|r| r.reply.is_producers()) {
                let rejected = batch.retain(|reply| !reply.is_producers());
                let rejected_jobs: usize = rejected.iter().map(|(_, jobs)| jobs).sum();
                for (reply, _) in rejected {
                    reply.reject(WriteRejected::Unavailable);
                }
                tracing::warn!(rejected_jobs, "submission rejected: jobdb unavailable");
            }
            if batch.rows.is_empty() {
                return self.acknowledge(batch);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// The JobDB refused the batch's data: writes it in halves until the request carrying the
    /// refused rows is alone, and refuses that one only.
    async fn isolate(&mut self, mut batch: Batch, why: String) {
        let writing = batch.writing();
        if writing.len() <= 1 {
            let refused = batch.retain(|reply| matches!(reply, Reply::Barrier(..)));
            for (reply, jobs) in refused {
                let kind = reply.kind();
                self.metrics.write_rejected(kind, "refused");
                tracing::error!(
                    request = kind,
                    jobs,
                    reason = %why,
                    "the jobdb refused a write request; it alone is not stored"
                );
                reply.reject(WriteRejected::Refused {
                    too_large: why.contains("max_allowed_packet"),
                });
            }
            return self.acknowledge(batch);
        }
        // Split between two writing requests; a barrier stays with what precedes it.
        let second = batch.split_off(writing[writing.len() / 2]);
        Box::pin(self.commit(batch)).await;
        Box::pin(self.commit(second)).await;
    }

    /// After a failed COMMIT, finds out whether it committed anyway (the COMMIT may have
    /// reached the server before the connection broke): its last row exists or not. Keeps
    /// asking until the JobDB answers, because a wrong guess either loses or duplicates work.
    async fn committed_after_error(&self, rows: &[(u64, Transition)]) -> bool {
        let Some((id, last)) = rows.last() else {
            return false;
        };
        let mut pause = Duration::from_millis(100);
        loop {
            if self.lock_lost.is_cancelled() {
                return false;
            }
            match self.db.transition_exists(last.job_id, *id).await {
                Ok(found) => return found,
                Err(err) => {
                    tracing::warn!(error = %err, "jobdb unreachable while checking a commit");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    fn acknowledge(&self, batch: Batch) {
        let transaction = Ulid::new();
        let mut jobs = batch.jobs.into_iter();
        let mut start = 0;
        for request in batch.requests {
            let taken = request.jobs_end - start;
            start = request.jobs_end;
            match request.reply {
                Reply::Import(reply, imported) => {
                    jobs.by_ref().take(taken).for_each(drop);
                    self.metrics.jobs_imported.inc_by(imported.len() as u64);
                    let _ = self.scheduler.send(Event::Imported(imported));
                    let _ = reply.send(Ok(()));
                }
                Reply::Submit(reply) => {
                    let accepted: Vec<Arc<Job>> = jobs.by_ref().take(taken).collect();
                    self.metrics.jobs_accepted.inc_by(accepted.len() as u64);
                    // The scheduler learns of the jobs only now that they are durable; the
                    // producer hears about it at the same moment.
                    let _ = self.scheduler.send(Event::Accepted(accepted));
                    let _ = reply.send(Ok(transaction));
                }
                Reply::Transitions(done) => {
                    if let Some(done) = done {
                        let _ = done.send(Ok(()));
                    }
                }
                Reply::Barrier(reply, next_id) => {
                    let _ = reply.send(next_id);
                }
            }
        }
    }
}

fn fail(batch: Batch, why: WriteRejected) {
    for request in batch.requests {
        request.reply.reject(why);
    }
}
