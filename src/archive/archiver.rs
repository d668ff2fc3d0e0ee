//! Archiving jobs of a JobDB to S3, shared by the Director (its own expired jobs) and the
//! drainer (expired jobs and the histories of moved ones).
//!
//! Exactly once, across crashes: a batch is planned in the JobDB first (fenced: only the
//! owner plans; a job joins at most one batch of a kind), then uploaded under a key derived
//! from the batch id, then confirmed in the JobDB together with the jobs' `archived` rows.
//! A process killed anywhere finds the planned batch and uploads the same jobs to the same
//! key again; a job is never in two objects and never `archived` without a confirmed object.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::{Archive, ArchiveError, ArchivedJob};
use crate::job::{JobId, State, Transition};
use crate::jobdb::lifecycle::{BatchKind, PlannedBatch};
use crate::jobdb::write::WriteOp;
use crate::jobdb::{JobDb, JobDbError};
use crate::metrics::Metrics;

/// Most jobs in one archive object.
pub const MAX_BATCH_JOBS: usize = 1000;

/// Why archiving stopped.
#[derive(Debug, thiserror::Error)]
pub enum ArchiverError {
    /// The JobDB failed (or fenced us out).
    #[error(transparent)]
    JobDb(#[from] JobDbError),
    /// Asked to stop before the work was done (the plan stays for the next owner).
    #[error("stopped before the archive was confirmed")]
    Stopped,
    /// The Director's writer is gone.
    #[error("the director's writer is gone")]
    WriterGone,
}

/// Where the `archived` rows go.
#[derive(Clone, Debug)]
pub enum Recorder {
    /// Through the Director's writer (it numbers rows).
    Writer(mpsc::Sender<WriteOp>),
    /// Committed directly by a drainer, numbered from this counter.
    Direct(Arc<AtomicU64>),
}

/// Archives jobs of one owned JobDB.
#[derive(Clone)]
pub struct Archiver {
    /// The JobDB.
    pub db: JobDb,
    /// Our fencing token.
    pub token: u64,
    /// The S3 archive.
    pub archive: Archive,
    /// Where `archived` rows go.
    pub recorder: Recorder,
    /// Counters.
    pub metrics: Arc<Metrics>,
}

impl Archiver {
    /// Archives `ids` (jobs in `archiving`, or moved jobs for [`BatchKind::History`]): plans the
    /// batches they are not yet in, finishes every batch they are in. Returns the number of
    /// jobs archived by this call; S3 failures are retried until `stop`.
    pub async fn archive(
        &self,
        kind: BatchKind,
        ids: &[JobId],
        stop: &CancellationToken,
    ) -> Result<usize, ArchiverError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut batches = self.db.archive_batches_of(kind, ids).await?;
        let planned: std::collections::HashSet<JobId> = batches
            .iter()
            .flat_map(|b| b.jobs.iter().copied())
            .collect();
        let mut rest: Vec<JobId> = ids
            .iter()
            .filter(|id| !planned.contains(id))
            .copied()
            .collect();
        rest.sort();
        rest.dedup();
        for chunk in rest.chunks(MAX_BATCH_JOBS) {
            let batch = Ulid::new();
            let plan = PlannedBatch {
                batch,
                kind,
                object_key: self.archive.object_key(self.db.name(), kind, batch),
                jobs: chunk.to_vec(),
            };
            self.db.plan_archive_batch(self.token, &plan).await?;
            batches.push(plan);
        }
        let mut done = 0;
        for batch in &batches {
            done += self.finish(batch, stop).await?;
        }
        Ok(done)
    }

    /// Uploads a planned batch (again, if it was) and confirms it.
    async fn finish(
        &self,
        batch: &PlannedBatch,
        stop: &CancellationToken,
    ) -> Result<usize, ArchiverError> {
        let histories = self.db.histories_of(&batch.jobs).await?;
        let pending: Vec<(JobId, u16)> = match batch.kind {
            BatchKind::Expired => histories
                .iter()
                .filter_map(|(id, h)| {
                    let (_, last) = h.last()?;
                    (last.state == State::Archiving).then_some((*id, last.attempts))
                })
                .collect(),
            BatchKind::History => Vec::new(),
        };
        if batch.kind == BatchKind::Expired && pending.is_empty() {
            return Ok(0);
        }
        let jobs = self.db.get_jobs(&batch.jobs).await?;
        let targets = match batch.kind {
            BatchKind::History => self.db.move_targets(&batch.jobs).await?,
            BatchKind::Expired => HashMap::new(),
        };
        let mut records: Vec<ArchivedJob> = jobs
            .iter()
            .map(|job| {
                let history = histories.get(&job.id).map(Vec::as_slice).unwrap_or(&[]);
                ArchivedJob::new(job, history, targets.get(&job.id).cloned())
            })
            .collect();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        let manifest = self.upload(batch, &records, stop).await?;

        let now = Utc::now();
        let rows: Vec<Transition> = pending
            .iter()
            .map(|(id, attempts)| Transition::archived(*id, *attempts, now))
            .collect();
        match &self.recorder {
            Recorder::Direct(next_id) => {
                let numbered: Vec<(u64, Transition)> = rows
                    .into_iter()
                    .map(|t| (next_id.fetch_add(1, Ordering::SeqCst), t))
                    .collect();
                self.db
                    .confirm_archive_batch(self.token, batch.batch, &manifest.sha256, &numbered)
                    .await?;
            }
            Recorder::Writer(writer) => {
                self.db
                    .confirm_archive_batch(self.token, batch.batch, &manifest.sha256, &[])
                    .await?;
                if !rows.is_empty() {
                    let (done, committed) = oneshot::channel();
                    writer
                        .send(WriteOp::Transitions {
                            rows,
                            done: Some(done),
                        })
                        .await
                        .map_err(|_| ArchiverError::WriterGone)?;
                    match committed.await {
                        Ok(Ok(())) => {}
                        _ => return Err(ArchiverError::WriterGone),
                    }
                }
            }
        }
        self.metrics.jobs_archived.inc_by(pending.len() as u64);
        tracing::info!(
            jobdb = self.db.name(),
            batch = %batch.batch,
            kind = batch.kind.as_str(),
            jobs = records.len(),
            bytes = manifest.compressed_bytes,
            "archive batch confirmed"
        );
        Ok(match batch.kind {
            BatchKind::Expired => pending.len(),
            BatchKind::History => records.len(),
        })
    }

    /// Puts the batch until S3 confirms it, backing off on failures, or until `stop`.
    async fn upload(
        &self,
        batch: &PlannedBatch,
        records: &[ArchivedJob],
        stop: &CancellationToken,
    ) -> Result<super::Manifest, ArchiverError> {
        let mut pause = Duration::from_millis(200);
        loop {
            match self
                .archive
                .put_batch(self.db.name(), batch.kind, batch.batch, records)
                .await
            {
                Ok(manifest) => return Ok(manifest),
                Err(e) => {
                    self.metrics.archive_failures.inc();
                    log_failure(&e, batch.batch, pause);
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return Err(ArchiverError::Stopped),
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

fn log_failure(e: &ArchiveError, batch: Ulid, pause: Duration) {
    if e.is_transient() {
        tracing::warn!(error = %e, %batch, retry_in_ms = pause.as_millis() as u64, "archive upload failed; retrying");
    } else {
        tracing::error!(error = %e, %batch, retry_in_ms = pause.as_millis() as u64, "archive upload refused; retrying (check the archive configuration)");
    }
}

/// The Director's archiving task: receives ids of jobs it moved to `archiving`, waits until
/// those rows are durable, and archives them in batches, until `stop`.
pub async fn run_for_director(
    archiver: Archiver,
    mut expired: mpsc::UnboundedReceiver<Vec<JobId>>,
    mut pending: Vec<JobId>,
    stop: CancellationToken,
) {
    let tick = Duration::from_millis(500);
    let mut open = true;
    loop {
        if !pending.is_empty() {
            match archiver.db.latest_of(&pending).await {
                Ok(latest) => {
                    let ready: Vec<JobId> = pending
                        .iter()
                        .filter(|id| latest.get(id).is_some_and(|t| t.state == State::Archiving))
                        .copied()
                        .collect();
                    // Rows not yet committed stay pending; archived ones are done.
                    pending.retain(|id| {
                        latest
                            .get(id)
                            .is_none_or(|t| !t.state.is_terminal() && t.state != State::Archiving)
                    });
                    for chunk in ready.chunks(MAX_BATCH_JOBS) {
                        match archiver.archive(BatchKind::Expired, chunk, &stop).await {
                            Ok(_) => {}
                            Err(ArchiverError::Stopped) => return,
                            Err(e) => {
                                tracing::warn!(error = %e, "archiving expired jobs failed; trying again");
                                pending.extend_from_slice(chunk);
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading expired jobs failed; trying again"),
            }
        }
        if !open && pending.is_empty() {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            more = expired.recv(), if open => match more {
                Some(ids) => pending.extend(ids),
                None => open = false,
            },
            _ = tokio::time::sleep(tick), if !pending.is_empty() || !open => {}
        }
        while let Ok(ids) = expired.try_recv() {
            pending.extend(ids);
        }
    }
}
