//! Moving a retired JobDB's waiting jobs to live JobDBs: batches bounded in jobs and bytes,
//! each planned in the retired JobDB before it is sent to a live Director through
//! `POST /v1/import` (idempotent on job ids), and recorded `moved` once the target confirmed.
//! A plan found after a crash is resolved against the target: sent again while it is active,
//! or read from its tables once a drainer of its own holds it.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use chrono::Utc;
use rand::seq::IndexedRandom;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::{Drain, DrainerError, Owned};
use crate::job::{JobId, State, Transition};
use crate::jobdb::lifecycle::PlannedMove;
use crate::jobdb::{JobDb, JobDbError, JobDbUrl};
use crate::registry::catalog;
use crate::registry::inventory::JobDbState;
use crate::rpc::import::{import_job, importable, ImportJob, ImportRequest, ImportResponse};

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

/// Whether a job in `state` waits here to be moved (not ended, not expired).
fn waits(state: State) -> bool {
    matches!(state, State::AwaitingScheduling | State::AwaitingRetry)
}

/// Why sending a planned move did not work.
enum Sent {
    /// The target refused this job (a 4xx naming it): the same request will be refused again.
    Refused {
        /// The job as it was sent.
        spec: Box<ImportJob>,
        /// The answer's status.
        status: u16,
        /// The target's answer.
        answer: String,
    },
    /// The target refused the request without naming a job (400, 413, 422).
    BatchRefused {
        /// The jobs as they were sent.
        specs: Vec<ImportJob>,
        /// The target's answer.
        answer: String,
    },
    /// Anything that may pass (no connection, 5xx, 409, 429): send the batch again later.
    Failed(String),
}

/// How a planned move ended.
pub(super) struct Resolved {
    /// Jobs recorded `moved`.
    pub(super) moved: usize,
    /// Jobs that did not reach the target, still to move: they need a new plan.
    pub(super) missing: Vec<JobId>,
}

impl Drain {
    /// Plans and performs the move of `ids` to live JobDBs other than those of `refused_by`
    /// (whose Directors refused some of them); returns how many were moved. Jobs for which no
    /// live JobDB is left wait their turn in [`Owned::waiting`].
    pub(super) async fn move_jobs(
        &self,
        o: &Owned,
        mut ids: Vec<JobId>,
        refused_by: &BTreeSet<String>,
        stop: &CancellationToken,
    ) -> Result<usize, DrainerError> {
        let mut moved = 0;
        while !ids.is_empty() {
            let Some(target) = self.pick_target(o.db.name(), refused_by, stop).await? else {
                tracing::debug!(
                    jobdb = o.db.name(),
                    jobs = ids.len(),
                    refused_by = ?refused_by,
                    "every live director refused these jobs; they wait and are sent again"
                );
                o.waiting.all_refused(&ids, tokio::time::Instant::now());
                return Ok(moved);
            };
            let plan = PlannedMove {
                batch: Ulid::new(),
                to_jobdb: target,
                jobs: ids.clone(),
            };
            o.db.plan_moves(o.token, plan.batch, &plan.to_jobdb, &plan.jobs)
                .await?;
            let resolved = self.resolve(o, &plan, stop).await?;
            moved += resolved.moved;
            ids = resolved.missing;
        }
        Ok(moved)
    }

    /// A live JobDB served by a healthy Director, other than `this` and those of `refused_by`;
    /// `None` when every live one is in `refused_by`. Waits while there is none at all.
    async fn pick_target(
        &self,
        this: &str,
        refused_by: &BTreeSet<String>,
        stop: &CancellationToken,
    ) -> Result<Option<String>, DrainerError> {
        loop {
            let candidates = self.live_targets(this).await;
            if !candidates.is_empty() {
                let open: Vec<&String> = candidates
                    .iter()
                    .map(|(jobdb, _)| jobdb)
                    .filter(|jobdb| !refused_by.contains(*jobdb))
                    .collect();
                return Ok(open.choose(&mut rand::rng()).map(|j| (*j).clone()));
            }
            tracing::warn!(jobdb = this, "no live director to move jobs to; waiting");
            self.pause(stop, Duration::from_secs(1)).await?;
        }
    }

    /// `(jobdb, director base URL)` of every healthy Director serving an active JobDB.
    pub(super) async fn live_targets(&self, this: &str) -> Vec<(String, String)> {
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

    /// Sees a planned move through: the jobs that reached the target are recorded `moved`,
    /// those the target refused are discarded or wait (see `refusals.rs`), and the others are
    /// returned to be planned again.
    pub(super) async fn resolve(
        &self,
        o: &Owned,
        plan: &PlannedMove,
        stop: &CancellationToken,
    ) -> Result<Resolved, DrainerError> {
        let mut pause = Duration::from_millis(200);
        let mut moved = 0;
        // Jobs of the plan no longer sent with it: moved on their own, discarded as refused, or waiting.
        let mut settled: HashSet<JobId> = HashSet::new();
        loop {
            let ids: Vec<JobId> = plan
                .jobs
                .iter()
                .filter(|id| !settled.contains(id))
                .copied()
                .collect();
            if ids.is_empty() {
                return Ok(Resolved {
                    moved,
                    missing: Vec::new(),
                });
            }
            let record = self.inventory.get(&plan.to_jobdb).await?;
            match record.as_ref().map(|l| l.record.state) {
                Some(JobDbState::Active) => {
                    let director = self
                        .live_targets(o.db.name())
                        .await
                        .into_iter()
                        .find(|(jobdb, _)| *jobdb == plan.to_jobdb);
                    if let Some((_, base)) = director {
                        match self.send(o, plan, &ids, &base).await {
                            Ok(response) => {
                                moved += self.record_moved(o, &ids).await?;
                                tracing::info!(
                                    from = o.db.name(),
                                    to = plan.to_jobdb,
                                    batch = %plan.batch,
                                    imported = response.imported,
                                    already_present = response.already_present,
                                    "jobs moved"
                                );
                                return Ok(Resolved {
                                    moved,
                                    missing: Vec::new(),
                                });
                            }
                            // Discarded, or waiting for a target; the rest of the batch goes on at once.
                            Err(Sent::Refused {
                                spec,
                                status,
                                answer,
                            }) => {
                                self.refused(o, &spec, &plan.to_jobdb, status, &answer)
                                    .await?;
                                settled.extend(spec.id.parse::<JobId>().ok());
                                continue;
                            }
                            Err(Sent::BatchRefused { specs, answer }) => {
                                moved += self
                                    .one_by_one(o, plan, specs, &answer, &base, &mut settled)
                                    .await?;
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
                    let arrived = target.existing_jobs(&ids).await;
                    target.close().await;
                    let arrived = arrived?;
                    let (there, missing): (Vec<JobId>, Vec<JobId>) =
                        ids.iter().partition(|id| arrived.contains(id));
                    moved += self.record_moved(o, &there).await?;
                    tracing::info!(
                        from = o.db.name(),
                        to = plan.to_jobdb,
                        arrived = there.len(),
                        replanned = missing.len(),
                        "planned move resolved against a retired target"
                    );
                    return Ok(Resolved { moved, missing });
                }
                // Retiring (its Director may still be writing), or unknown: wait.
                _ => {}
            }
            self.pause(stop, pause).await?;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// The target refused a batch without naming a job. Jobs no Director of this version can
    /// import are discarded first (the batch then goes again without them); when there is none,
    /// the jobs go one request each to find which the target refuses (say, one larger than its
    /// JobDB server takes), and those that go through are recorded `moved`. Every job dealt
    /// with joins `settled`; returns how many were moved.
    async fn one_by_one(
        &self,
        o: &Owned,
        plan: &PlannedMove,
        specs: Vec<ImportJob>,
        answer: &str,
        base: &str,
        settled: &mut HashSet<JobId>,
    ) -> Result<usize, DrainerError> {
        let mut discarded = false;
        for spec in &specs {
            if importable(spec).is_err() {
                self.refused(o, spec, &plan.to_jobdb, 400, answer).await?;
                settled.extend(spec.id.parse::<JobId>().ok());
                discarded = true;
            }
        }
        if discarded {
            return Ok(0);
        }
        tracing::warn!(
            to = plan.to_jobdb,
            answer,
            "import batch refused; sending its jobs one by one"
        );
        let mut moved = 0;
        for spec in specs {
            let Ok(id) = spec.id.parse::<JobId>() else {
                continue;
            };
            match self.send(o, plan, &[id], base).await {
                Ok(_) => moved += self.record_moved(o, &[id]).await?,
                Err(Sent::Refused {
                    spec,
                    status,
                    answer,
                }) => {
                    self.refused(o, &spec, &plan.to_jobdb, status, &answer)
                        .await?
                }
                // One job is always named (see `send`).
                Err(Sent::BatchRefused { answer, .. }) => {
                    self.refused(o, &spec, &plan.to_jobdb, 400, &answer).await?
                }
                Err(Sent::Failed(e)) => {
                    tracing::warn!(to = plan.to_jobdb, error = %e, "import failed; retrying");
                    break;
                }
            }
            settled.insert(id);
        }
        Ok(moved)
    }

    /// Sends the jobs `ids` of a planned move that still wait here to the target.
    async fn send(
        &self,
        o: &Owned,
        plan: &PlannedMove,
        ids: &[JobId],
        base: &str,
    ) -> Result<ImportResponse, Sent> {
        let failed = |e: JobDbError| Sent::Failed(e.to_string());
        let latest = o.db.latest_of(ids).await.map_err(failed)?;
        // A job discarded as refused, moved, or expired meanwhile is not sent.
        let live: Vec<JobId> = ids
            .iter()
            .filter(|id| latest.get(id).is_some_and(|t| waits(t.state)))
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
            blocked_keys: Vec::new(),
            events: Vec::new(),
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
                    .filter(|i| *i < request.jobs.len())
                    .or((request.jobs.len() == 1).then_some(0));
                let mut specs = request.jobs;
                match named {
                    Some(i) => Err(Sent::Refused {
                        spec: Box::new(specs.swap_remove(i)),
                        status: api.status,
                        answer: api.to_string(),
                    }),
                    None => Err(Sent::BatchRefused {
                        specs,
                        answer: api.to_string(),
                    }),
                }
            }
            Err(e) => Err(Sent::Failed(e.to_string())),
        }
    }

    /// Records `moved` the jobs of `ids` that reached their target (those still waiting here:
    /// `send` sent no other); returns how many.
    async fn record_moved(&self, o: &Owned, ids: &[JobId]) -> Result<usize, DrainerError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let latest = o.db.latest_of(ids).await?;
        let now = Utc::now();
        let rows: Vec<Transition> = ids
            .iter()
            .filter_map(|id| {
                let last = latest.get(id)?;
                // A job discarded as refused ended here already; one that expired was not sent.
                waits(last.state).then(|| Transition::moved(*id, last.attempts, now))
            })
            .collect();
        let moved = rows.len();
        self.append(o, rows).await?;
        self.metrics.jobs_moved.inc_by(moved as u64);
        Ok(moved)
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
