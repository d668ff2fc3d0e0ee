//! Moving a retired JobDB's waiting jobs to live JobDBs: batches bounded in jobs and bytes,
//! each planned in the retired JobDB before it is sent to a live Director through
//! `POST /v1/import` (idempotent on job ids), and recorded `moved` once the target confirmed.
//! A plan found after a crash is resolved against the target: sent again while it is active,
//! or read from its tables once a drainer of its own holds it.

use std::time::Duration;

use chrono::Utc;
use rand::seq::IndexedRandom;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::{Drain, DrainerError, Owned};
use crate::job::{JobId, Transition};
use crate::jobdb::lifecycle::PlannedMove;
use crate::jobdb::{JobDb, JobDbError, JobDbUrl};
use crate::registry::catalog;
use crate::registry::inventory::JobDbState;
use crate::rpc::import::{import_job, ImportRequest, ImportResponse};

/// Most bytes of jobs in one import request: well inside a Director's default 32 MiB request
/// limit, whatever the batch size.
pub(super) const MAX_IMPORT_BYTES: usize = 8 * 1024 * 1024;

/// Jobs to move, in batches of at most `jobs` jobs and `bytes` bytes (a bigger job alone).
pub(super) fn import_batches(ids: &[(JobId, usize)], jobs: usize, bytes: usize) -> Vec<Vec<JobId>> {
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

impl Drain {
    /// Plans and performs the move of `ids` to live JobDBs; returns how many were moved.
    pub(super) async fn move_jobs(
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

    /// Sees a planned move through; returns the jobs that did not reach the target and need
    /// a new plan.
    pub(super) async fn resolve(
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

    /// Records `moved` the jobs of `ids` that reached their target (those not ended here).
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
