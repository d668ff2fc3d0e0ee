//! The archiver: moving jobs of an owned JobDB into the archive, exactly once, as a service
//! above the store and the archive. The Director archives its own expired jobs with it, the
//! drainer the expired jobs and the histories of moved ones of a JobDB it drains; each says
//! where the `archived` rows go ([`Recorder`]: a drainer commits them itself, [`Direct`]; a
//! Director sends them through its writer).
//!
//! Exactly once, across crashes: a batch is planned in the JobDB first (fenced: only the
//! owner plans; a job joins at most one batch of a kind), then uploaded under a key derived
//! from the batch id, then confirmed in the JobDB together with the jobs' `archived` rows.
//! A process killed anywhere finds the planned batch and uploads the same jobs to the same
//! key again; a job is never in two objects and never `archived` without a confirmed object.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::archive::{Archive, ArchiveError, ArchivedJob, BatchKind, Manifest};
use crate::job::{JobId, State, Transition};
use crate::jobdb::lifecycle::PlannedBatch;
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
    /// The writer that records the rows (a Director's) is gone.
    #[error("the director's writer is gone")]
    WriterGone,
}

/// Where the `archived` rows of a confirmed batch go: whoever owns the JobDB's row numbering
/// writes them.
pub trait Recorder: Send + Sync {
    /// Confirms `batch` (its data object's SHA-256 is `sha256`) in `db`, fenced by `token`,
    /// and records `rows` (the `archived` rows of its expired jobs; none for a history
    /// batch). Returns once both are durable.
    fn confirm(
        &self,
        db: &JobDb,
        token: u64,
        batch: Ulid,
        sha256: &str,
        rows: Vec<Transition>,
    ) -> impl Future<Output = Result<(), ArchiverError>> + Send;
}

/// Rows committed directly with the confirmation, numbered from this counter: a drainer's,
/// which owns the numbering of the JobDB it drains.
#[derive(Clone, Debug)]
pub struct Direct(pub Arc<AtomicU64>);

impl Recorder for Direct {
    async fn confirm(
        &self,
        db: &JobDb,
        token: u64,
        batch: Ulid,
        sha256: &str,
        rows: Vec<Transition>,
    ) -> Result<(), ArchiverError> {
        let numbered: Vec<(u64, Transition)> = rows
            .into_iter()
            .map(|t| (self.0.fetch_add(1, Ordering::SeqCst), t))
            .collect();
        db.confirm_archive_batch(token, batch, sha256, &numbered)
            .await?;
        Ok(())
    }
}

/// Archives jobs of one owned JobDB, recording their `archived` rows with `R`.
#[derive(Clone)]
pub struct Archiver<R> {
    /// The JobDB.
    pub db: JobDb,
    /// Our fencing token.
    pub token: u64,
    /// The S3 archive.
    pub archive: Archive,
    /// Where `archived` rows go.
    pub recorder: R,
    /// Counters.
    pub metrics: Arc<Metrics>,
}

impl<R: Recorder> Archiver<R> {
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
        self.recorder
            .confirm(&self.db, self.token, batch.batch, &manifest.sha256, rows)
            .await?;
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

    /// Archives the events kept in the JobDB without a job (a drained JobDB's, before it is
    /// dropped), [`MAX_BATCH_JOBS`] per object. Nothing is planned or confirmed: the events
    /// no longer change once their JobDB is drained, so writing them again (after a crash)
    /// writes the same objects. Returns how many were archived.
    pub async fn archive_kept_events(
        &self,
        stop: &CancellationToken,
    ) -> Result<usize, ArchiverError> {
        let (mut after, mut archived) = (None, 0);
        loop {
            let page = self.db.kept_events(after, MAX_BATCH_JOBS).await?;
            let Some(last) = page.last() else {
                return Ok(archived);
            };
            after = Some(last.id);
            // An envelope that is not JSON (a row changed by hand) cannot be written as one;
            // it is named, not silently left out.
            let mut events = Vec::with_capacity(page.len());
            for event in &page {
                match event.to_wire() {
                    Some(wire) => events.push(wire),
                    None => tracing::error!(
                        jobdb = self.db.name(),
                        event = %event.id,
                        "a kept event's envelope is not JSON; it is not archived"
                    ),
                }
            }
            if events.is_empty() {
                continue;
            }
            let name = self.db.name();
            self.until_stored(last.id, stop, || self.archive.put_events(name, &events))
                .await?;
            archived += events.len();
        }
    }

    /// Puts the batch until S3 confirms it, backing off on failures, or until `stop`.
    async fn upload(
        &self,
        batch: &PlannedBatch,
        records: &[ArchivedJob],
        stop: &CancellationToken,
    ) -> Result<Manifest, ArchiverError> {
        let name = self.db.name();
        self.until_stored(batch.batch, stop, || {
            self.archive
                .put_batch(name, batch.kind, batch.batch, records)
        })
        .await
    }

    /// Runs `put` until it succeeds, backing off on failures, or until `stop`.
    async fn until_stored<T, F: std::future::Future<Output = Result<T, ArchiveError>>>(
        &self,
        batch: Ulid,
        stop: &CancellationToken,
        put: impl Fn() -> F,
    ) -> Result<T, ArchiverError> {
        let mut pause = Duration::from_millis(200);
        loop {
            match put().await {
                Ok(done) => return Ok(done),
                Err(e) => {
                    self.metrics.archive_failures.inc();
                    log_failure(&e, batch, pause);
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
