//! The drainer: empties retired JobDBs so the manager can drop them.
//!
//! A drainer takes a `retiring` JobDB whose Director has released it (or a `draining` one whose
//! drainer died) by its Consul lock, bumps the JobDB's fencing token with the lock's token, and:
//! 1. archives its id index, the ids of its keyed jobs and its events (`ids.rs`), so routers
//!    can settle a lapsed claim whose holder it may hold after it is dropped; then finishes
//!    the moves a previous drainer planned (see below);
//! 2. records attempts left `executing` as interrupted, and jobs past their expiry as
//!    `archiving`;
//! 3. archives expired jobs to the archive, S3 or a directory (the shared [`crate::archiver`]);
//! 4. moves every job still awaiting a retry to a live Director through `POST /v1/import`,
//!    in batches: the batch and its target JobDB are planned in this JobDB first, the import
//!    is idempotent on job ids in the target, and the jobs are recorded `moved` after the
//!    target confirmed. A job a target refuses is discarded only if no Director of this version
//!    could import it; otherwise it waits for one that does (`refusals.rs`), and steps 2–4
//!    repeat until it is moved or expires;
//! 5. archives the histories of the moved jobs (kind `history`), so each keeps its whole trace,
//!    and the events kept without a job (published when nothing subscribed: `events` objects);
//! 6. marks the JobDB `drained` when no job in it is unfinished; the manager drops it.
//!
//! Resolving a planned move after a crash: while the target JobDB is active, the same batch is
//! sent to its Director again (jobs already there are skipped). Once the target has been taken
//! by a drainer of its own (its fencing token moved past its Director's, so nothing more can
//! land in it), its tables tell which jobs arrived; the others get a new plan. Either way a job
//! ends up in exactly one live JobDB.
//!
//! # Files
//! - `mod.rs`: taking retired JobDBs by their lock and the drain of one, step by step;
//!   archiving goes through the shared [`crate::archiver`].
//! - `moves.rs`: moving jobs to live JobDBs: planning a batch, sending it through
//!   `POST /v1/import`, resolving a plan after a crash, recording the jobs `moved`.
//! - `refusals.rs`: a job a live Director refuses: discarded (`import-refused`) when no Director
//!   of this version can import it, otherwise waiting for one that does (`move-refused`).
//! - `ids.rs`: the id index a router reads after the JobDB is gone.
//! - `blocks.rs`: carrying the keys blocked here to a live JobDB before the drain ends.

mod blocks;
mod ids;
mod moves;
mod refusals;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use crate::archive::BatchKind;
use crate::archive::{Archive, ArchiveError};
use crate::archiver::{Archiver, ArchiverError, Direct};
use crate::job::JobId;
use crate::job::{AttemptRecord, ErrorType, State, Transition};
use crate::jobdb::owner::OWNER_ID_GAP;
use crate::jobdb::{JobDb, JobDbError, JobDbUrl};
use crate::metrics::JobDbLabels;
use crate::metrics::Metrics;
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::{Inventory, JobDbState, Listed};
use crate::registry::lease::{consul_lock, Lease, LockTiming};
use crate::registry::RegistryError;
use crate::rpc::import::MAX_IMPORT_JOBS;
use moves::{import_batches, MAX_IMPORT_BYTES};
use refusals::Turn;

/// The longest a drain whose only jobs left wait for a Director that takes them goes without
/// looking again (each look reads every unfinished job).
const WAITING_LOOK_EVERY: Duration = Duration::from_secs(60);

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

/// One drain at work: what it needs to drain the JobDBs it takes.
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
    archiver: Archiver<Direct>,
    /// Jobs live Directors refused that a Director of this version could take.
    waiting: refusals::Waiting,
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
        self.metrics
            .jobs_waiting_for_target
            .remove(&JobDbLabels { jobdb: name });
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
        let next_id = db.max_transition_id().await? + OWNER_ID_GAP;
        // Its last owner's fresh jobs (accepted, never rested) get their entries before
        // anything is moved: each ordered one held in its place, so the live JobDBs' reads see
        // a key's job here until it is moved, whichever of its jobs moves first.
        let unlisted = db.load_stranded().await?.unlisted;
        let next_id = db.enter_unlisted(token, next_id, &unlisted).await?;
        let next_id = Arc::new(AtomicU64::new(next_id));
        let archiver = Archiver {
            db: db.clone(),
            token,
            archive: self.archive.clone(),
            recorder: Direct(next_id.clone()),
            metrics: self.metrics.clone(),
        };
        Ok(Owned {
            db,
            token,
            next_id,
            archiver,
            waiting: refusals::Waiting::default(),
        })
    }

    async fn drain_owned(
        &self,
        o: &Owned,
        stop: &CancellationToken,
    ) -> Result<usize, DrainerError> {
        // What a router may ask of it once it is gone: written before anything leaves.
        self.index_ids(o).await?;
        let mut moved = 0;
        for plan in o.db.planned_moves().await? {
            moved += self.resolve(o, &plan, stop).await?.moved;
        }
        let gauge = self
            .metrics
            .jobs_waiting_for_target
            .get_or_create(&JobDbLabels {
                jobdb: o.db.name().to_owned(),
            })
            .clone();
        // The count of waiting jobs last logged.
        let mut told = None;
        loop {
            let unfinished = o.db.load_unfinished().await?;
            if unfinished.is_empty() {
                break;
            }
            let now = Utc::now();
            let instant = tokio::time::Instant::now();
            let mut rows = Vec::new();
            let mut expired = Vec::new();
            let mut to_move = Vec::new();
            // Jobs refused before, by the JobDBs whose Directors refused them.
            let mut again: BTreeMap<BTreeSet<String>, Vec<(JobId, usize)>> = BTreeMap::new();
            let mut next_turn: Option<tokio::time::Instant> = None;
            let mut open = HashSet::new();
            for (job, p) in unfinished {
                match p.state {
                    State::Executing => rows.push(Transition::awaiting_retry(
                        job.id,
                        p.attempts,
                        now,
                        now,
                        AttemptRecord {
                            error_type: Some(ErrorType::Interrupted.into()),
                            started: p.started,
                            ..AttemptRecord::default()
                        },
                    )),
                    State::Archiving => expired.push(job.id),
                    _ if job.expire_at <= now => {
                        rows.push(Transition::archiving(job.id, p.attempts, now));
                        expired.push(job.id);
                    }
                    _ => {
                        open.insert(job.id);
                        // An import carries the payload in base64 (4/3 of its bytes).
                        let weight = crate::jobdb::job_row_bytes(&job) * 4 / 3;
                        match o.waiting.turn(job.id, instant) {
                            Turn::Fresh => to_move.push((job.id, weight)),
                            Turn::Due(refused_by) => {
                                again.entry(refused_by).or_default().push((job.id, weight))
                            }
                            Turn::Later(at) => {
                                // Looked at again at its turn, or at its expiry if sooner.
                                let expiry = instant
                                    + (job.expire_at - now).to_std().unwrap_or(Duration::ZERO);
                                let at = at.min(expiry);
                                next_turn =
                                    Some(next_turn.map_or(at, |n: tokio::time::Instant| n.min(at)))
                            }
                        }
                    }
                }
            }
            let waiting = o.waiting.retain(|id| open.contains(id));
            gauge.set(i64::try_from(waiting).unwrap_or(i64::MAX));
            let idle =
                rows.is_empty() && expired.is_empty() && to_move.is_empty() && again.is_empty();
            self.append(o, rows).await?;
            o.archiver
                .archive(BatchKind::Expired, &expired, stop)
                .await?;
            let batch = self.config.import_batch.clamp(1, MAX_IMPORT_JOBS);
            let none = BTreeSet::new();
            for chunk in import_batches(&to_move, batch, MAX_IMPORT_BYTES) {
                moved += self.move_jobs(o, chunk, &none, stop).await?;
            }
            for (refused_by, jobs) in &again {
                for chunk in import_batches(jobs, batch, MAX_IMPORT_BYTES) {
                    moved += self.move_jobs(o, chunk, refused_by, stop).await?;
                }
            }
            // Only refused jobs are left, each waiting its turn: look again at the first turn or
            // expiry, and at least every WAITING_LOOK_EVERY (the list is read whole each time).
            if let (true, Some(at)) = (idle, next_turn) {
                if told != Some(waiting) {
                    tracing::warn!(
                        jobdb = o.db.name(),
                        waiting,
                        "jobs refused by every live director wait for one that takes them; the \
                         drain goes on when they are moved or expire"
                    );
                    told = Some(waiting);
                }
                let pause = at
                    .saturating_duration_since(instant)
                    .clamp(Duration::from_millis(100), WAITING_LOOK_EVERY);
                self.pause(stop, pause).await?;
            }
        }
        // Every job that could end here has: its key's blocks go to a live JobDB.
        self.carry_blocks(o, stop).await?;
        gauge.set(0);
        let histories = o.db.without_archived_history().await?;
        o.archiver
            .archive(BatchKind::History, &histories, stop)
            .await?;
        // Events that made no job here live on only in the archive (for back-fills).
        o.archiver.archive_kept_events(stop).await?;
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
        // An ordered job that asked to block its key and expires here blocks it, as at its
        // Director: the store reads the sequences of the jobs that end and writes the blocks
        // (a move then carries them).
        let ending: Vec<JobId> = numbered
            .iter()
            .filter(|(_, t)| crate::jobdb::blocks_sequence(t))
            .map(|(_, t)| t.job_id)
            .collect();
        let append = crate::jobdb::Append {
            transitions: &numbered,
            read_left: &ending,
            ..crate::jobdb::Append::default()
        };
        o.db.append_all(o.token, &append).await?;
        Ok(())
    }

    async fn pause(&self, stop: &CancellationToken, pause: Duration) -> Result<(), DrainerError> {
        tokio::select! {
            _ = stop.cancelled() => Err(DrainerError::Stopped),
            _ = tokio::time::sleep(pause) => Ok(()),
        }
    }
}
