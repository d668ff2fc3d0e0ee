//! The group-commit writer: the only task that writes to the JobDB.
//!
//! Submissions and transitions queue on one channel. The writer takes everything queued (up to
//! a row budget), appends it in one fenced transaction with multi-row INSERTs, and only after
//! COMMIT acknowledges the producers and hands the new jobs to the scheduler. One writer keeps
//! transition ids and commit order identical, so a crash can never leave a gap in a history.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::job::{Job, Transition};
use crate::jobdb::{JobDb, JobDbError};
use crate::metrics::Metrics;

use super::scheduler::{Event, Recovered};
use crate::jobdb::lifecycle::Origin;

/// Why a write was not made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteRejected {
    /// The JobDB could not be reached; nothing of the request was stored.
    #[error("the jobdb is unavailable; nothing was stored")]
    Unavailable,
    /// This Director lost its JobDB; nothing of the request was stored.
    #[error("this director no longer owns its jobdb; nothing was stored")]
    LockLost,
}

/// A request to the writer.
#[derive(Debug)]
pub enum WriteOp {
    /// New jobs (each gets its `awaiting-scheduling` row); answered with the transaction id.
    Submit {
        /// The validated jobs.
        jobs: Vec<Arc<Job>>,
        /// Where the outcome goes once known.
        reply: oneshot::Sender<Result<Ulid, WriteRejected>>,
    },
    /// Jobs imported from a retired JobDB (each gets its `imported` row and its origin).
    Import {
        /// The jobs with their progress.
        jobs: Vec<Recovered>,
        /// The retired JobDB they come from.
        from_jobdb: String,
        /// Told once they are durable (or will never be).
        reply: oneshot::Sender<Result<(), WriteRejected>>,
    },
    /// State transitions of known jobs, optionally acknowledged after COMMIT.
    Transitions {
        /// Rows to append, in order.
        rows: Vec<Transition>,
        /// Told once the rows are durable (or will never be).
        done: Option<oneshot::Sender<Result<(), WriteRejected>>>,
    },
    /// Answered, once everything queued before it is durable, with the first transition id
    /// after it: a read whose snapshot starts later sees every earlier row, and rows with
    /// lower ids are all the writes that came before it.
    Barrier(oneshot::Sender<u64>),
}

/// Limits of one group commit.
#[derive(Clone, Copy, Debug)]
pub struct WriterLimits {
    /// Stop adding queued requests to a transaction past this many rows.
    pub max_rows: usize,
    /// Stop adding queued requests past this many payload bytes.
    pub max_bytes: usize,
}

type Ack = oneshot::Sender<Result<(), WriteRejected>>;

#[derive(Default)]
struct Batch {
    jobs: Vec<Arc<Job>>,
    rows: Vec<(u64, Transition)>,
    submits: Vec<Submitted>,
    imports: Vec<(Ack, Vec<Recovered>)>,
    origins: Vec<Origin>,
    dones: Vec<oneshot::Sender<Result<(), WriteRejected>>>,
    barriers: Vec<(oneshot::Sender<u64>, u64)>,
    bytes: usize,
}

struct Submitted {
    reply: oneshot::Sender<Result<Ulid, WriteRejected>>,
    jobs: usize,
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

    fn add(&mut self, batch: &mut Batch, op: WriteOp) {
        match op {
            WriteOp::Submit { jobs, reply } => {
                for job in &jobs {
                    batch.bytes += job.payload.len();
                    batch
                        .rows
                        .push((self.next_id, Transition::awaiting_scheduling(job)));
                    self.next_id += 1;
                }
                batch.submits.push(Submitted {
                    reply,
                    jobs: jobs.len(),
                });
                batch.jobs.extend(jobs);
            }
            WriteOp::Import {
                jobs,
                from_jobdb,
                reply,
            } => {
                let now = chrono::Utc::now();
                for r in &jobs {
                    batch.bytes += r.job.payload.len();
                    let retry_at = r.retry_at.unwrap_or(now);
                    batch.rows.push((
                        self.next_id,
                        Transition::imported(r.job.id, r.attempts, now, retry_at),
                    ));
                    self.next_id += 1;
                    batch.origins.push(Origin {
                        job_id: r.job.id,
                        from_jobdb: from_jobdb.clone(),
                        imported_at: now,
                    });
                    batch.jobs.push(r.job.clone());
                }
                batch.imports.push((reply, jobs));
            }
            WriteOp::Transitions { rows, done } => {
                for row in rows {
                    batch.rows.push((self.next_id, row));
                    self.next_id += 1;
                }
                batch.dones.extend(done);
            }
            WriteOp::Barrier(reply) => batch.barriers.push((reply, self.next_id)),
        }
    }

    async fn commit(&mut self, mut batch: Batch) {
        let mut pause = Duration::from_millis(50);
        loop {
            if self.lock_lost.is_cancelled() {
                return fail(batch, WriteRejected::LockLost);
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
                Err(err) => {
                    tracing::warn!(error = %err, cause = ?std::error::Error::source(&err), "jobdb append failed; checking whether it committed");
                    self.committed_after_error(&batch).await
                }
            };
            if committed {
                self.metrics
                    .observe_write(batch.rows.len(), started.elapsed());
                return self.acknowledge(batch);
            }
            // Not committed: producers get a clear 503 now (they may retry), while transitions
            // of jobs already owned must reach the JobDB, so they wait and go again.
            if !batch.submits.is_empty() || !batch.imports.is_empty() {
                let new_jobs = batch.jobs.len();
                for s in batch.submits.drain(..) {
                    let _ = s.reply.send(Err(WriteRejected::Unavailable));
                }
                for (reply, _) in batch.imports.drain(..) {
                    let _ = reply.send(Err(WriteRejected::Unavailable));
                }
                batch.origins.clear();
                let fresh: std::collections::HashSet<_> =
                    batch.jobs.drain(..).map(|j| j.id).collect();
                batch.rows.retain(|(_, t)| !fresh.contains(&t.job_id));
                tracing::warn!(
                    rejected_jobs = new_jobs,
                    "submission rejected: jobdb unavailable"
                );
            }
            if batch.rows.is_empty() {
                return self.acknowledge(batch);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// After a failed append, finds out whether it committed anyway (the COMMIT may have
    /// reached the server before the connection broke): its last row exists or not. Keeps
    /// asking until the JobDB answers, because a wrong guess either loses or duplicates work.
    async fn committed_after_error(&self, batch: &Batch) -> bool {
        let Some((id, last)) = batch.rows.last() else {
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
        for (reply, jobs) in batch.imports {
            self.metrics.jobs_imported.inc_by(jobs.len() as u64);
            let _ = self.scheduler.send(Event::Imported(jobs));
            let _ = reply.send(Ok(()));
        }
        let imported: std::collections::HashSet<_> =
            batch.origins.iter().map(|o| o.job_id).collect();
        let mut jobs = batch.jobs.into_iter().filter(|j| !imported.contains(&j.id));
        for submitted in batch.submits {
            let accepted: Vec<Arc<Job>> = jobs.by_ref().take(submitted.jobs).collect();
            self.metrics.jobs_accepted.inc_by(accepted.len() as u64);
            // The scheduler learns of the jobs only now that they are durable; the producer
            // hears about it at the same moment.
            let _ = self.scheduler.send(Event::Accepted(accepted));
            let _ = submitted.reply.send(Ok(transaction));
        }
        for done in batch.dones {
            let _ = done.send(Ok(()));
        }
        for (reply, next_id) in batch.barriers {
            let _ = reply.send(next_id);
        }
    }
}

fn fail(batch: Batch, why: WriteRejected) {
    for s in batch.submits {
        let _ = s.reply.send(Err(why));
    }
    for (reply, _) in batch.imports {
        let _ = reply.send(Err(why));
    }
    for done in batch.dones {
        let _ = done.send(Err(why));
    }
}
