//! The drainer: empties retired JobDBs so the manager can drop them.
//!
//! A drainer takes a `retiring` JobDB whose Director has released it (or a `draining` one whose
//! drainer died) by its Consul lock, bumps the JobDB's fencing token with the lock's token, and:
//! 1. finishes the moves a previous drainer planned (see below);
//! 2. records attempts left `executing` as interrupted, and jobs past their expiry as
//!    `archiving`;
//! 3. archives expired jobs to the archive, S3 or a directory (the shared [`crate::archive::archiver`]);
//! 4. moves every job still awaiting a retry to a live Director through `POST /v1/import`,
//!    in batches: the batch and its target JobDB are planned in this JobDB first, the import
//!    is idempotent on job ids in the target, and the jobs are recorded `moved` after the
//!    target confirmed;
//! 5. archives the histories of the moved jobs (kind `moved`), so each keeps its whole trace;
//! 6. marks the JobDB `drained` when no job in it is unfinished; the manager drops it.
//!
//! Resolving a planned move after a crash: while the target JobDB is active, the same batch is
//! sent to its Director again (jobs already there are skipped). Once the target has been taken
//! by a drainer of its own (its fencing token moved past its Director's, so nothing more can
//! land in it), its tables tell which jobs arrived; the others get a new plan. Either way a job
//! ends up in exactly one live JobDB.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use rand::seq::IndexedRandom;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::archive::archiver::{Archiver, ArchiverError, Recorder};
use crate::archive::{Archive, ArchiveError};
use crate::director::OWNER_ID_GAP;
use crate::job::{AttemptRecord, ErrorType, JobId, State, Transition};
use crate::jobdb::lifecycle::{BatchKind, PlannedMove};
use crate::jobdb::{JobDb, JobDbError, JobDbUrl};
use crate::metrics::Metrics;
use crate::registry::catalog;
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::{Inventory, JobDbState, Listed};
use crate::registry::lease::{consul_lock, Lease, LockTiming};
use crate::registry::RegistryError;
use crate::rpc::import::{import_job, ImportRequest, ImportResponse, MAX_IMPORT_JOBS};

/// Errors of a drain.
#[derive(Debug, thiserror::Error)]
pub enum DrainerError {
    /// Consul failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A JobDB failed (or fenced us out).
    #[error(transparent)]
    JobDb(#[from] JobDbError),
    /// The archive failed.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// Archiving stopped.
    #[error(transparent)]
    Archiver(#[from] ArchiverError),
    /// Asked to stop, or the lock was lost.
    #[error("stopped")]
    Stopped,
    /// The HTTP client could not be built.
    #[error("cannot build the http client")]
    Client(#[from] reqwest::Error),
}

/// How a drainer runs.
#[derive(Clone, Debug)]
pub struct DrainerConfig {
    /// The Consul agent.
    pub consul: ConsulClient,
    /// Lock session TTL and lock-delay.
    pub timing: LockTiming,
    /// This drainer's identity (stored in the locks it holds).
    pub drainer_id: String,
    /// Name recorded as the JobDB owner.
    pub holder: String,
    /// The archive (S3 or a local directory).
    pub archive: crate::archive::ArchiveConfig,
    /// Admin bearer token for the Directors' import RPC, when they require tokens.
    pub import_token: Option<crate::secret::Secret>,
    /// Jobs per import request (at most 1000).
    pub import_batch: usize,
    /// JobDBs drained at once.
    pub concurrency: usize,
    /// Pause between two looks at the inventory.
    pub retry_every: Duration,
    /// Where moves, archived jobs and drained JobDBs are counted.
    pub metrics: Arc<Metrics>,
}

/// Runs a drainer until `shutdown`.
pub async fn run(config: DrainerConfig, shutdown: CancellationToken) -> Result<(), DrainerError> {
    let archive = Archive::open(&config.archive).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let metrics = config.metrics.clone();
    let inventory = Inventory::new(config.consul.clone());
    let mut draining = tokio::task::JoinSet::new();
    let mut mine: std::collections::HashSet<String> = std::collections::HashSet::new();
    tracing::info!(
        drainer = config.drainer_id,
        "drainer looking for retired jobdbs"
    );
    loop {
        while let Some(done) = draining.try_join_next() {
            if let Ok(name) = done {
                mine.remove(&name);
            }
        }
        if draining.len() < config.concurrency.max(1) {
            match inventory.list().await {
                Ok(listed) => {
                    for l in listed {
                        let free = l.holder.is_none()
                            && matches!(
                                l.record.state,
                                JobDbState::Retiring | JobDbState::Draining
                            );
                        if !free || mine.contains(&l.record.name) {
                            continue;
                        }
                        let key = Inventory::lock_key(&l.record.name);
                        let lease = match consul_lock(
                            &config.consul,
                            &key,
                            config.drainer_id.as_bytes(),
                            "spindle-drainer",
                            config.timing,
                        )
                        .await
                        {
                            Ok(Some(lease)) => lease,
                            Ok(None) => continue,
                            Err(e) => {
                                tracing::warn!(error = %e, "lock attempt failed");
                                break;
                            }
                        };
                        let name = l.record.name.clone();
                        mine.insert(name.clone());
                        let job = Drain {
                            config: config.clone(),
                            inventory: inventory.clone(),
                            archive: archive.clone(),
                            http: http.clone(),
                            metrics: metrics.clone(),
                        };
                        let stop = shutdown.child_token();
                        draining.spawn(async move {
                            job.take(l, lease, stop).await;
                            name
                        });
                        if draining.len() >= config.concurrency.max(1) {
                            break;
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading the inventory failed"),
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(config.retry_every) => {}
        }
    }
    while draining.join_next().await.is_some() {}
    tracing::info!("drainer stopped");
    Ok(())
}

/// Most bytes of jobs in one import request: well inside a Director's default 32 MiB request
/// limit, whatever the batch size.
const MAX_IMPORT_BYTES: usize = 8 * 1024 * 1024;

/// Jobs to move, in batches of at most `jobs` jobs and `bytes` bytes (a bigger job alone).
fn import_batches(ids: &[(JobId, usize)], jobs: usize, bytes: usize) -> Vec<Vec<JobId>> {
    let mut batches = Vec::new();
    let (mut current, mut size) = (Vec::new(), 0usize);
    for &(id, weight) in ids {
        if !current.is_empty() && (current.len() == jobs || size.saturating_add(weight) > bytes) {
            batches.push(std::mem::take(&mut current));
            size = 0;
        }
        current.push(id);
        size = size.saturating_add(weight);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Why sending a planned move did not work.
enum Sent {
    /// The target refused this job for good (a 4xx naming it).
    Refused {
        /// The job.
        job: JobId,
        /// The target's answer.
        reason: String,
    },
    /// The target refused the request for good without naming a job.
    BatchRefused(String),
    /// Anything that may pass (no connection, 5xx, 409, 429): send the batch again later.
    Failed(String),
}

struct Drain {
    config: DrainerConfig,
    inventory: Inventory,
    archive: Archive,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
}

/// A JobDB being drained by us.
struct Owned {
    db: JobDb,
    token: u64,
    next_id: Arc<AtomicU64>,
    archiver: Archiver,
}

impl Drain {
    /// Drains one JobDB whose lock we hold, then marks it drained and releases it.
    async fn take(self, listed: Listed, lease: Lease, stop: CancellationToken) {
        let name = listed.record.name.clone();
        let lost = lease.lost.clone();
        let stop_or_lost = stop.child_token();
        {
            let (lost, s) = (lost.clone(), stop_or_lost.clone());
            tokio::spawn(async move {
                lost.cancelled().await;
                s.cancel();
            });
        }
        if listed.record.state != JobDbState::Draining {
            let by = format!("drainer:{}", self.config.drainer_id);
            if let Err(e) = self
                .inventory
                .set_state(&listed, JobDbState::Draining, &by)
                .await
            {
                tracing::warn!(jobdb = name, error = %e, "could not mark draining");
            }
        }
        tracing::info!(jobdb = name, token = ?lease.token, "draining jobdb");
        let started = std::time::Instant::now();
        match self.drain(&listed, &lease, &stop_or_lost).await {
            Ok(moved) => {
                let by = format!("drainer:{}", self.config.drainer_id);
                let marked = match self.inventory.get(&name).await {
                    Ok(Some(now)) => self
                        .inventory
                        .set_state(&now, JobDbState::Drained, &by)
                        .await
                        .unwrap_or(false),
                    _ => false,
                };
                self.metrics.jobdbs_drained.inc();
                tracing::info!(
                    jobdb = name,
                    moved,
                    took_ms = started.elapsed().as_millis() as u64,
                    marked,
                    "jobdb drained"
                );
            }
            Err(DrainerError::Stopped) => {
                tracing::info!(jobdb = name, "drain stopped; it resumes from its plans")
            }
            Err(e) => {
                tracing::warn!(jobdb = name, error = %e, "drain failed; it resumes from its plans")
            }
        }
        lease.release().await;
    }

    async fn drain(
        &self,
        listed: &Listed,
        lease: &Lease,
        stop: &CancellationToken,
    ) -> Result<usize, DrainerError> {
        let url: JobDbUrl = self.inventory.jobdb_url(&listed.record)?;
        let db = JobDb::open(&url, false, 4).await?;
        let owned = self.own(db, lease, stop).await;
        let result = match owned {
            Ok(owned) => self.drain_owned(&owned, stop).await,
            Err(e) => Err(e),
        };
        result
    }

    async fn own(
        &self,
        db: JobDb,
        lease: &Lease,
        stop: &CancellationToken,
    ) -> Result<Owned, DrainerError> {
        let token = loop {
            let attempt = match lease.token {
                Some(token) => {
                    db.take_ownership_at(token, &self.config.holder, Duration::from_secs(2))
                        .await
                }
                None => db.take_ownership(&self.config.holder).await,
            };
            match attempt {
                Err(JobDbError::Busy) if !stop.is_cancelled() => continue,
                other => break other?,
            }
        };
        let next_id = Arc::new(AtomicU64::new(db.max_transition_id().await? + OWNER_ID_GAP));
        let archiver = Archiver {
            db: db.clone(),
            token,
            archive: self.archive.clone(),
            recorder: Recorder::Direct(next_id.clone()),
            metrics: self.metrics.clone(),
        };
        Ok(Owned {
            db,
            token,
            next_id,
            archiver,
        })
    }

    async fn drain_owned(
        &self,
        o: &Owned,
        stop: &CancellationToken,
    ) -> Result<usize, DrainerError> {
        let mut moved = 0;
        for plan in o.db.planned_moves().await? {
            let missing = self.resolve(o, &plan, stop).await?;
            moved += plan.jobs.len() - missing.len();
        }
        loop {
            let unfinished = o.db.load_unfinished().await?;
            if unfinished.is_empty() {
                break;
            }
            let now = Utc::now();
            let mut rows = Vec::new();
            let mut expired = Vec::new();
            let mut to_move = Vec::new();
            for (job, p) in unfinished {
                match p.state {
                    State::Executing => rows.push(Transition::awaiting_retry(
                        job.id,
                        p.attempts,
                        now,
                        now,
                        AttemptRecord {
                            error_type: Some(ErrorType::Interrupted.into()),
                            ..AttemptRecord::default()
                        },
                    )),
                    State::Archiving => expired.push(job.id),
                    _ if job.expire_at <= now => {
                        rows.push(Transition::archiving(job.id, p.attempts, now));
                        expired.push(job.id);
                    }
                    // An import carries the payload in base64 (4/3 of its bytes).
                    _ => to_move.push((job.id, crate::jobdb::job_row_bytes(&job) * 4 / 3)),
                }
            }
            self.append(o, rows).await?;
            o.archiver
                .archive(BatchKind::Expired, &expired, stop)
                .await?;
            let batch = self.config.import_batch.clamp(1, MAX_IMPORT_JOBS);
            for chunk in import_batches(&to_move, batch, MAX_IMPORT_BYTES) {
                moved += self.move_jobs(o, chunk, stop).await?;
            }
        }
        let histories = o.db.without_archived_history().await?;
        o.archiver
            .archive(BatchKind::History, &histories, stop)
            .await?;
        let open = o.db.unfinished_count().await?;
        let untraced = o.db.without_archived_history().await?.len();
        if open > 0 || untraced > 0 {
            return Err(DrainerError::JobDb(JobDbError::Corrupt(format!(
                "{open} unfinished jobs and {untraced} moved jobs without archived history remain"
            ))));
        }
        Ok(moved)
    }

    /// Appends rows to the drained JobDB (fenced), numbered after its last owner's.
    async fn append(&self, o: &Owned, rows: Vec<Transition>) -> Result<(), DrainerError> {
        if rows.is_empty() {
            return Ok(());
        }
        let numbered: Vec<(u64, Transition)> = rows
            .into_iter()
            .map(|t| (o.next_id.fetch_add(1, Ordering::SeqCst), t))
            .collect();
        o.db.append(o.token, &[], &numbered).await?;
        Ok(())
    }

    /// Plans and performs the move of `ids` to live JobDBs; returns how many were moved.
    async fn move_jobs(
        &self,
        o: &Owned,
        mut ids: Vec<JobId>,
        stop: &CancellationToken,
    ) -> Result<usize, DrainerError> {
        let total = ids.len();
        while !ids.is_empty() {
            let target = self.pick_target(o.db.name(), stop).await?;
            let plan = PlannedMove {
                batch: Ulid::new(),
                to_jobdb: target,
                jobs: ids.clone(),
            };
            o.db.plan_moves(o.token, plan.batch, &plan.to_jobdb, &plan.jobs)
                .await?;
            ids = self.resolve(o, &plan, stop).await?;
        }
        Ok(total)
    }

    /// A live JobDB served by a healthy Director, other than `this`.
    async fn pick_target(
        &self,
        this: &str,
        stop: &CancellationToken,
    ) -> Result<String, DrainerError> {
        loop {
            let candidates = self.live_targets(this).await;
            if let Some((jobdb, _)) = candidates.choose(&mut rand::rng()) {
                return Ok(jobdb.clone());
            }
            tracing::warn!(jobdb = this, "no live director to move jobs to; waiting");
            self.pause(stop, Duration::from_secs(1)).await?;
        }
    }

    /// `(jobdb, director base URL)` of every healthy Director serving an active JobDB.
    async fn live_targets(&self, this: &str) -> Vec<(String, String)> {
        let (Ok(directors), Ok(listed)) = (
            catalog::healthy_directors(&self.config.consul).await,
            self.inventory.list().await,
        ) else {
            return Vec::new();
        };
        directors
            .into_iter()
            .filter_map(|d| {
                let jobdb = d.meta.get("jobdb")?.clone();
                let active = listed.iter().any(|l| {
                    l.record.name == jobdb
                        && l.record.state == JobDbState::Active
                        && l.holder.is_some()
                });
                (active && jobdb != this)
                    .then(|| (jobdb, format!("http://{}:{}", d.address, d.port)))
            })
            .collect()
    }

    async fn pause(&self, stop: &CancellationToken, pause: Duration) -> Result<(), DrainerError> {
        tokio::select! {
            _ = stop.cancelled() => Err(DrainerError::Stopped),
            _ = tokio::time::sleep(pause) => Ok(()),
        }
    }

    /// Sees a planned move through; returns the jobs that did not reach the target and need
    /// a new plan.
    async fn resolve(
        &self,
        o: &Owned,
        plan: &PlannedMove,
        stop: &CancellationToken,
    ) -> Result<Vec<JobId>, DrainerError> {
        let mut pause = Duration::from_millis(200);
        loop {
            let record = self.inventory.get(&plan.to_jobdb).await?;
            match record.as_ref().map(|l| l.record.state) {
                Some(JobDbState::Active) => {
                    let director = self
                        .live_targets(o.db.name())
                        .await
                        .into_iter()
                        .find(|(jobdb, _)| *jobdb == plan.to_jobdb);
                    if let Some((_, base)) = director {
                        match self.send(o, plan, &plan.jobs, &base).await {
                            Ok(response) => {
                                self.record_moved(o, &plan.jobs).await?;
                                tracing::info!(
                                    from = o.db.name(),
                                    to = plan.to_jobdb,
                                    batch = %plan.batch,
                                    imported = response.imported,
                                    already_present = response.already_present,
                                    "jobs moved"
                                );
                                return Ok(Vec::new());
                            }
                            // The target will never take this job: it ends here, visibly, and
                            // the rest of the batch goes on at once.
                            Err(Sent::Refused { job, reason }) => {
                                self.park_refused(o, job, &reason).await?;
                                continue;
                            }
                            // Refused without naming a job: one at a time finds which.
                            Err(Sent::BatchRefused(reason)) => {
                                tracing::warn!(
                                    to = plan.to_jobdb,
                                    reason,
                                    "import batch refused; sending its jobs one by one"
                                );
                                for job in &plan.jobs {
                                    match self.send(o, plan, &[*job], &base).await {
                                        Ok(_) => {}
                                        Err(Sent::Refused { job, reason }) => {
                                            self.park_refused(o, job, &reason).await?
                                        }
                                        Err(Sent::BatchRefused(reason)) => {
                                            self.park_refused(o, *job, &reason).await?
                                        }
                                        Err(Sent::Failed(e)) => {
                                            tracing::warn!(to = plan.to_jobdb, error = %e, "import failed; retrying");
                                            break;
                                        }
                                    }
                                }
                                continue;
                            }
                            Err(Sent::Failed(e)) => {
                                tracing::warn!(to = plan.to_jobdb, error = %e, "import failed; retrying")
                            }
                        }
                    }
                }
                // Its drainer owns it now: nothing more can land in it, so its rows tell.
                Some(JobDbState::Draining | JobDbState::Drained) => {
                    let Some(listed) = record else { continue };
                    let url: JobDbUrl = self.inventory.jobdb_url(&listed.record)?;
                    let target = JobDb::open(&url, false, 1).await?;
                    let arrived = target.existing_jobs(&plan.jobs).await;
                    target.close().await;
                    let arrived = arrived?;
                    let (there, missing): (Vec<JobId>, Vec<JobId>) =
                        plan.jobs.iter().partition(|id| arrived.contains(id));
                    self.record_moved(o, &there).await?;
                    tracing::info!(
                        from = o.db.name(),
                        to = plan.to_jobdb,
                        arrived = there.len(),
                        replanned = missing.len(),
                        "planned move resolved against a retired target"
                    );
                    return Ok(missing);
                }
                // Retiring (its Director may still be writing), or unknown: wait.
                _ => {}
            }
            self.pause(stop, pause).await?;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Sends the jobs `ids` of a planned move that are still unfinished here to the target.
    async fn send(
        &self,
        o: &Owned,
        plan: &PlannedMove,
        ids: &[JobId],
        base: &str,
    ) -> Result<ImportResponse, Sent> {
        let failed = |e: JobDbError| Sent::Failed(e.to_string());
        let latest = o.db.latest_of(ids).await.map_err(failed)?;
        // A job parked as refused (or otherwise ended) is not sent again.
        let live: Vec<JobId> = ids
            .iter()
            .filter(|id| latest.get(id).is_some_and(|t| !t.state.is_terminal()))
            .copied()
            .collect();
        if live.is_empty() {
            return Ok(ImportResponse {
                jobdb: plan.to_jobdb.clone(),
                imported: 0,
                already_present: 0,
            });
        }
        let jobs = o.db.get_jobs(&live).await.map_err(failed)?;
        let now = Utc::now();
        let request = ImportRequest {
            jobdb: plan.to_jobdb.clone(),
            from_jobdb: Some(o.db.name().to_owned()),
            not_after: None,
            jobs: jobs
                .iter()
                .map(|job| {
                    let last = latest.get(&job.id);
                    import_job(
                        job,
                        last.map_or(0, |t| t.attempts),
                        last.and_then(|t| t.retry_at).unwrap_or(now),
                    )
                })
                .collect(),
        };
        let client = spindle_client::Client::from_reqwest(
            self.http.clone(),
            base,
            self.config
                .import_token
                .as_ref()
                .map(|t| t.expose().to_owned()),
        )
        .map_err(|e| Sent::Failed(e.to_string()))?;
        match client.import(&request).await {
            Ok(response) => Ok(response),
            Err(spindle_client::Error::Api(api)) if matches!(api.status, 400 | 413 | 422) => {
                // A definite refusal of the request's content: the same request will be
                // refused again. Which job, if the answer names one (`jobs[3].bucket`)?
                let named = api
                    .field
                    .as_deref()
                    .and_then(|f| f.strip_prefix("jobs["))
                    .and_then(|f| f.split(']').next())
                    .and_then(|i| i.parse::<usize>().ok())
                    .and_then(|i| jobs.get(i));
                match named {
                    Some(job) => Err(Sent::Refused {
                        job: job.id,
                        reason: api.to_string(),
                    }),
                    None if jobs.len() == 1 => Err(Sent::Refused {
                        job: jobs[0].id,
                        reason: api.to_string(),
                    }),
                    None => Err(Sent::BatchRefused(api.to_string())),
                }
            }
            Err(e) => Err(Sent::Failed(e.to_string())),
        }
    }

    /// Ends a job the target refused for good: `discarded`, `error_type` `import-refused`,
    /// with the target's answer, so it is visible in SQL and archived with the JobDB's
    /// history instead of blocking the drain forever.
    async fn park_refused(&self, o: &Owned, job: JobId, reason: &str) -> Result<(), DrainerError> {
        let latest = o.db.latest_of(&[job]).await?;
        let Some(last) = latest.get(&job).filter(|t| !t.state.is_terminal()) else {
            return Ok(());
        };
        tracing::error!(
            jobdb = o.db.name(),
            job = %job,
            reason,
            "a live director refuses this job for good: parked as discarded (import-refused)"
        );
        let row = Transition::discarded(
            job,
            last.attempts,
            Utc::now(),
            AttemptRecord {
                error_type: Some(ErrorType::ImportRefused.into()),
                error_response: Some(bytes::Bytes::from(reason.to_owned())),
                ..AttemptRecord::default()
            },
        );
        self.append(o, vec![row]).await?;
        self.metrics.jobs_import_refused.inc();
        Ok(())
    }

    async fn record_moved(&self, o: &Owned, ids: &[JobId]) -> Result<(), DrainerError> {
        if ids.is_empty() {
            return Ok(());
        }
        let latest = o.db.latest_of(ids).await?;
        let now = Utc::now();
        let rows: Vec<Transition> = ids
            .iter()
            .filter_map(|id| {
                let last = latest.get(id)?;
                // A job parked as refused ended here already.
                (!last.state.is_terminal()).then(|| Transition::moved(*id, last.attempts, now))
            })
            .collect();
        let moved = rows.len() as u64;
        self.append(o, rows).await?;
        self.metrics.jobs_moved.inc_by(moved);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_batches_are_bounded_by_jobs_and_bytes() {
        let id = || JobId(Ulid::new());
        let small: Vec<(JobId, usize)> = (0..1200).map(|_| (id(), 100)).collect();
        let sizes: Vec<usize> = import_batches(&small, 500, MAX_IMPORT_BYTES)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, vec![500, 500, 200]);
        let big: Vec<(JobId, usize)> = (0..10).map(|_| (id(), 3 * 1024 * 1024)).collect();
        let sizes: Vec<usize> = import_batches(&big, 500, MAX_IMPORT_BYTES)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, vec![2, 2, 2, 2, 2]);
        let huge = vec![(id(), 20 * 1024 * 1024)];
        assert_eq!(import_batches(&huge, 500, MAX_IMPORT_BYTES).len(), 1);
    }
}
