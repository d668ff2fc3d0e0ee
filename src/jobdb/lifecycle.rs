//! The JobDB statements of its lifecycle: imports, a drainer's planned moves, archive batches.
//!
//! Every plan is written (fenced, so only the current owner plans) before the work it
//! describes, and every step's outcome is an appended row: a process killed at any point
//! finds the unfinished plans and redoes exactly them.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;
use ulid::Ulid;

use super::{with_pool, JobDb, JobDbError, MAX_IDS_PER_SELECT, MAX_ROWS_PER_INSERT};
use crate::job::{JobId, State, Transition};

/// Why a batch of jobs left its JobDB: the `kind` of an `archive_batches` row. The archive's
/// format defines it (a segment of its object keys), below the store.
pub use crate::archive::BatchKind;

pub use super::write::Origin;

/// A planned archive batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedBatch {
    /// Batch id (also the object's name).
    pub batch: Ulid,
    /// What it holds.
    pub kind: BatchKind,
    /// The S3 key of its data object.
    pub object_key: String,
    /// Its jobs, sorted.
    pub jobs: Vec<JobId>,
}

/// A planned move whose job is not yet recorded `moved`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedMove {
    /// The import batch.
    pub batch: Ulid,
    /// The JobDB the jobs were sent to.
    pub to_jobdb: String,
    /// Its jobs still not `moved`, sorted.
    pub jobs: Vec<JobId>,
}

/// Jobs a router may have claimed a key for (an idempotency key's, or a back-fill's, whose
/// job is of an event), after an id: the caller binds the id and a limit.
const KEYED_JOBS: &str = "SELECT id FROM jobs WHERE id > ? \
     AND (idempotency_key IS NOT NULL OR event_id IS NOT NULL) ORDER BY id LIMIT ?";

/// Events (each may hold a key's claim), after an id: the caller binds the id and a limit.
const EVENT_IDS: &str = "SELECT id FROM events WHERE id > ? ORDER BY id LIMIT ?";

impl JobDb {
    /// Which of these jobs have a row here (imports skip them: an import is idempotent).
    pub async fn existing_jobs(&self, ids: &[JobId]) -> Result<HashSet<JobId>, JobDbError> {
        let mut out = HashSet::new();
        for chunk in ids.chunks(MAX_IDS_PER_SELECT) {
            with_pool!(self, |p, q| {
                let rows = q::ids_query("SELECT id FROM jobs WHERE id IN (", chunk, ")")
                    .build()
                    .fetch_all(p)
                    .await?;
                for row in &rows {
                    out.insert(q::job_id_of(row, "id")?);
                }
            });
        }
        Ok(out)
    }

    /// The whole histories of these jobs, oldest step first ([`crate::job::history`]: their
    /// rows, their acceptance, their attempts' starts and any attempt under way); jobs this
    /// JobDB does not hold are absent.
    pub async fn histories_of(
        &self,
        ids: &[JobId],
    ) -> Result<HashMap<JobId, Vec<(u64, Transition)>>, JobDbError> {
        let mut out: HashMap<JobId, Vec<(u64, Transition)>> = HashMap::new();
        for chunk in ids.chunks(MAX_IDS_PER_SELECT) {
            let mut rows: HashMap<JobId, Vec<(u64, Transition)>> = HashMap::new();
            let mut created: HashMap<JobId, DateTime<Utc>> = HashMap::new();
            let mut under_way: HashMap<JobId, (crate::job::AttemptStart, u16)> = HashMap::new();
            with_pool!(self, |p, q| {
                for row in &q::ids_query(
                    "SELECT id, job_id, time, retry_at, attempts, state, error_type, \
                     error_response, error_response_encoding, response_status, duration_ms, \
                     started_in, started_at FROM job_state_transitions WHERE job_id IN (",
                    chunk,
                    ") ORDER BY job_id, id",
                )
                .build()
                .fetch_all(p)
                .await?
                {
                    let (id, t) = q::transition_from_row(row)?;
                    rows.entry(t.job_id).or_default().push((id, t));
                }
                for row in
                    &q::ids_query("SELECT id, created_at FROM jobs WHERE id IN (", chunk, ")")
                        .build()
                        .fetch_all(p)
                        .await?
                {
                    created.insert(q::job_id_of(row, "id")?, q::time_of(row, "created_at")?);
                }
                for row in &q::ids_query(
                    "SELECT job_id, started_in, started_at, attempts FROM attempts_under_way \
                     WHERE job_id IN (",
                    chunk,
                    ")",
                )
                .build()
                .fetch_all(p)
                .await?
                {
                    let attempts: u64 = sqlx::Row::try_get(row, "attempts")?;
                    if let Some(start) = q::started_of(row)? {
                        under_way.insert(
                            q::job_id_of(row, "job_id")?,
                            (start, u16::try_from(attempts).unwrap_or(u16::MAX)),
                        );
                    }
                }
            });
            for id in chunk {
                let job_rows = rows.remove(id).unwrap_or_default();
                let at = created.get(id).copied();
                if job_rows.is_empty() && at.is_none() {
                    continue;
                }
                let steps = crate::job::history(*id, at, job_rows, under_way.remove(id));
                out.insert(*id, steps);
            }
        }
        Ok(out)
    }

    /// The latest row of each of these jobs.
    pub async fn latest_of(&self, ids: &[JobId]) -> Result<HashMap<JobId, Transition>, JobDbError> {
        Ok(self
            .histories_of(ids)
            .await?
            .into_iter()
            .filter_map(|(id, mut h)| h.pop().map(|(_, t)| (id, t)))
            .collect())
    }

    /// The ids of the jobs with an idempotency key or of an event, and of the events stored
    /// here, after `after` in id order, at most `limit`: what a lapsed claim's holder could
    /// be, for the drainer's id index (read once the JobDB is fenced, when no row can be
    /// added).
    pub async fn keyed_ids(
        &self,
        after: Option<Ulid>,
        limit: usize,
    ) -> Result<Vec<Ulid>, JobDbError> {
        let after = after.map_or_else(|| vec![0u8; 16], |id| id.to_bytes().to_vec());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut ids = Vec::new();
        for statement in [KEYED_JOBS, EVENT_IDS] {
            with_pool!(self, |p, q| {
                for row in sqlx::query(statement)
                    .bind(after.clone())
                    .bind(limit)
                    .fetch_all(p)
                    .await?
                {
                    ids.push(q::job_id_of(&row, "id")?.0);
                }
            });
        }
        ids.sort_unstable();
        ids.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(ids)
    }

    /// How many jobs are not in a terminal state here (a JobDB is dropped only at zero): the
    /// `open_work` view, which counts jobs accepted that never rested as well as `open_jobs`.
    pub async fn unfinished_count(&self) -> Result<u64, JobDbError> {
        let n: i64 = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT COUNT(*) FROM open_work")
                .fetch_one(p)
                .await?
        });
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Bytes the JobDB's tables take (data and indexes), as the server reports them: what
    /// the manager compares with its memory budget.
    pub async fn data_bytes(&self) -> Result<u64, JobDbError> {
        Ok(self.size().await?.bytes)
    }

    /// Plans a move: these jobs go to `to_jobdb` in import batch `batch`. Fenced.
    pub async fn plan_moves(
        &self,
        token: u64,
        batch: Ulid,
        to_jobdb: &str,
        ids: &[JobId],
    ) -> Result<(), JobDbError> {
        let now = Utc::now().naive_utc();
        with_pool!(self, |p, q| {
            let mut tx = p.begin().await?;
            for chunk in ids.chunks(MAX_ROWS_PER_INSERT) {
                let mut qb = QueryBuilder::<q::Db>::new(
                    "INSERT INTO job_moves (job_id, batch_id, to_jobdb, planned_at) ",
                );
                qb.push_values(chunk, |mut row, id| {
                    row.push_bind(id.to_bytes().to_vec())
                        .push_bind(batch.to_bytes().to_vec())
                        .push_bind(to_jobdb)
                        .push_bind(now);
                });
                qb.build().execute(&mut *tx).await?;
            }
            q::commit_fenced(tx, token).await
        })
    }

    /// Moves that were planned but whose jobs are not yet recorded `moved`, by batch (each
    /// job under its current plan only).
    pub async fn planned_moves(&self) -> Result<Vec<PlannedMove>, JobDbError> {
        let mut current: HashMap<JobId, (Ulid, String)> = HashMap::new();
        with_pool!(self, |p, q| {
            let rows = sqlx::query(
                "SELECT job_id, batch_id, to_jobdb FROM job_moves ORDER BY job_id, batch_id",
            )
            .fetch_all(p)
            .await?;
            for row in &rows {
                current.insert(
                    q::job_id_of(row, "job_id")?,
                    (q::ulid_of(row, "batch_id")?, q::text(row, "to_jobdb")?),
                );
            }
        });
        let ids: Vec<JobId> = current.keys().copied().collect();
        let latest = self.latest_of(&ids).await?;
        let mut planned: HashMap<Ulid, PlannedMove> = HashMap::new();
        for (id, (batch, to_jobdb)) in current {
            if latest.get(&id).is_some_and(|t| t.state == State::Moved) {
                continue;
            }
            planned
                .entry(batch)
                .or_insert_with(|| PlannedMove {
                    batch,
                    to_jobdb,
                    jobs: Vec::new(),
                })
                .jobs
                .push(id);
        }
        let mut out: Vec<PlannedMove> = planned.into_values().collect();
        for p in &mut out {
            p.jobs.sort();
        }
        out.sort_by_key(|p| p.batch);
        Ok(out)
    }

    /// Plans an archive batch of `ids`. Fenced; fails if a job is already in a batch of
    /// this kind (a job is archived once).
    pub async fn plan_archive_batch(
        &self,
        token: u64,
        planned: &PlannedBatch,
    ) -> Result<(), JobDbError> {
        with_pool!(self, |p, q| {
            let mut tx = p.begin().await?;
            sqlx::query(
                "INSERT INTO archive_batches (batch_id, kind, object_key, planned_at) \
                 VALUES (?, ?, ?, ?)",
            )
            .bind(planned.batch.to_bytes().to_vec())
            .bind(planned.kind.as_str())
            .bind(planned.object_key.as_str())
            .bind(Utc::now().naive_utc())
            .execute(&mut *tx)
            .await?;
            for chunk in planned.jobs.chunks(MAX_ROWS_PER_INSERT) {
                let mut qb = QueryBuilder::<q::Db>::new(
                    "INSERT INTO archive_batch_jobs (job_id, kind, batch_id) ",
                );
                qb.push_values(chunk, |mut row, id| {
                    row.push_bind(id.to_bytes().to_vec())
                        .push_bind(planned.kind.as_str())
                        .push_bind(planned.batch.to_bytes().to_vec());
                });
                qb.build().execute(&mut *tx).await?;
            }
            q::commit_fenced(tx, token).await
        })
    }

    /// The batches (of `kind`) that already hold some of these jobs, each with all its jobs.
    pub async fn archive_batches_of(
        &self,
        kind: BatchKind,
        ids: &[JobId],
    ) -> Result<Vec<PlannedBatch>, JobDbError> {
        let mut batches = HashSet::new();
        for chunk in ids.chunks(MAX_IDS_PER_SELECT) {
            with_pool!(self, |p, q| {
                let mut qb = QueryBuilder::<q::Db>::new(
                    "SELECT DISTINCT batch_id FROM archive_batch_jobs WHERE kind = ",
                );
                qb.push_bind(kind.as_str()).push(" AND job_id IN (");
                let mut list = qb.separated(", ");
                for id in chunk {
                    list.push_bind(id.to_bytes().to_vec());
                }
                qb.push(")");
                for row in &qb.build().fetch_all(p).await? {
                    batches.insert(q::ulid_of(row, "batch_id")?);
                }
            });
        }
        let mut out = Vec::with_capacity(batches.len());
        for batch in batches {
            if let Some(planned) = self.archive_batch(batch).await? {
                out.push(planned);
            }
        }
        out.sort_by_key(|b| b.batch);
        Ok(out)
    }

    /// One planned batch with its jobs.
    pub async fn archive_batch(&self, batch: Ulid) -> Result<Option<PlannedBatch>, JobDbError> {
        let found = with_pool!(self, |p, q| {
            let Some(row) =
                sqlx::query("SELECT kind, object_key FROM archive_batches WHERE batch_id = ?")
                    .bind(batch.to_bytes().to_vec())
                    .fetch_optional(p)
                    .await?
            else {
                return Ok(None);
            };
            let jobs = sqlx::query(
                "SELECT job_id FROM archive_batch_jobs WHERE batch_id = ? ORDER BY job_id",
            )
            .bind(batch.to_bytes().to_vec())
            .fetch_all(p)
            .await?
            .iter()
            .map(|r| q::job_id_of(r, "job_id"))
            .collect::<Result<Vec<_>, _>>()?;
            (q::text(&row, "kind")?, q::text(&row, "object_key")?, jobs)
        });
        let (kind, object_key, jobs) = found;
        let kind = match kind.as_str() {
            "history" => BatchKind::History,
            "expired" => BatchKind::Expired,
            other => return Err(JobDbError::Corrupt(format!("archive batch kind {other:?}"))),
        };
        Ok(Some(PlannedBatch {
            batch,
            kind,
            object_key,
            jobs,
        }))
    }

    /// Records that S3 confirmed a batch's object, with the transitions that follow from it
    /// (`archived` rows for expired jobs; none for histories), in one fenced commit.
    pub async fn confirm_archive_batch(
        &self,
        token: u64,
        batch: Ulid,
        sha256: &str,
        transitions: &[(u64, Transition)],
    ) -> Result<(), JobDbError> {
        with_pool!(self, |p, q| {
            let mut tx = p.begin().await?;
            sqlx::query(q::INSERT_CONFIRMATION)
                .bind(batch.to_bytes().to_vec())
                .bind(sha256)
                .bind(Utc::now().naive_utc())
                .execute(&mut *tx)
                .await?;
            let append = super::write::Append {
                transitions,
                ..Default::default()
            };
            q::write_rows(&mut tx, &append, self.max_statement_bytes()).await?;
            q::commit_fenced(tx, token).await
        })
    }

    /// Jobs that ended here (succeeded, discarded, moved) whose trace is not yet in a
    /// confirmed `history` batch: a drained JobDB is dropped only when there are none.
    pub async fn without_archived_history(&self) -> Result<Vec<JobId>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT t.job_id FROM job_state_transitions t \
                 LEFT JOIN archive_batch_jobs b ON b.job_id = t.job_id AND b.kind = 'history' \
                 LEFT JOIN archive_confirmations c ON c.batch_id = b.batch_id \
                 WHERE t.state IN ('succeeded', 'discarded', 'moved') AND c.batch_id IS NULL \
                 ORDER BY t.job_id",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(|r| q::job_id_of(r, "job_id"))
            .collect()
        })
    }

    /// Deletes every job and transition, `chunk` rows per statement: the purge a DROP of a
    /// retired JobDB replaces (kept for the benchmark that compares them, and for operators
    /// emptying a JobDB in place). Returns the job and transition rows deleted.
    pub async fn delete_all_in_chunks(&self, chunk: u32) -> Result<u64, JobDbError> {
        let mut deleted = 0;
        with_pool!(self, |p, q| {
            while sqlx::query(q::DELETE_OPEN_CHUNK)
                .bind(chunk)
                .execute(p)
                .await?
                .rows_affected()
                > 0
            {}
            for statement in q::DELETE_CHUNKS {
                loop {
                    let done = sqlx::query(statement).bind(chunk).execute(p).await?;
                    deleted += done.rows_affected();
                    if done.rows_affected() == 0 {
                        break;
                    }
                }
            }
        });
        Ok(deleted)
    }

    /// Databases on this JobDB's server whose name matches a `LIKE` pattern (`%`, `_`, and
    /// `\` escaping either); for SQLite, the JobDB files in its directory.
    pub async fn databases_like(&self, pattern: &str) -> Result<Vec<String>, JobDbError> {
        super::databases_like(&self.url.server, pattern).await
    }

    /// The JobDB each of these jobs is (currently) planned to move to.
    pub async fn move_targets(&self, ids: &[JobId]) -> Result<HashMap<JobId, String>, JobDbError> {
        let mut out = HashMap::new();
        for chunk in ids.chunks(MAX_IDS_PER_SELECT) {
            with_pool!(self, |p, q| {
                let rows = q::ids_query(
                    "SELECT job_id, to_jobdb FROM job_moves WHERE job_id IN (",
                    chunk,
                    ") ORDER BY job_id, batch_id",
                )
                .build()
                .fetch_all(p)
                .await?;
                for row in &rows {
                    out.insert(q::job_id_of(row, "job_id")?, q::text(row, "to_jobdb")?);
                }
            });
        }
        Ok(out)
    }

    /// Where an imported job came from, if it was imported.
    pub async fn origin_of(&self, id: JobId) -> Result<Option<String>, JobDbError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query("SELECT from_jobdb FROM job_origins WHERE job_id = ?")
                .bind(id.to_bytes().to_vec())
                .fetch_optional(p)
                .await?;
            row.map(|r| q::text(&r, "from_jobdb")).transpose()
        })
    }
}
