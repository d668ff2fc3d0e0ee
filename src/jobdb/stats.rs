//! The dashboard's read queries over a JobDB: transitions by state over time, per-lane
//! outcomes, latencies, backlog and errors, attempts per success, the JobDB's size, age and
//! owner, and job look-ups for traces; and the server's write counters a benchmark divides
//! by its jobs ([`JobDb::server_writes`]).
//!
//! All of them only read, and every value comes in through a bind parameter. The JobDB indexes
//! nothing but its primary keys (the write path pays for no index a dashboard would like), so
//! the window queries scan `job_state_transitions`: cheap for JobDBs that retire after half an
//! hour or a few GiB, which is how the lifecycle keeps them. A lane is an endpoint without its
//! query or fragment, as the Director's queues group them ([`crate::job::lane`]);
//! grouping by it in SQL keeps one row per lane however many query strings there are.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{with_pool, JobDb, JobDbError};
use crate::job::{Job, JobId, State};

/// The server's write counters: COMMIT statements, fsyncs, bytes written to data files and to
/// the redo log, rows written (MariaDB and MySQL spell them alike).
const SERVER_WRITES: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', \
     'Innodb_data_fsyncs', 'Innodb_data_written', 'Innodb_os_log_written', \
     'Handler_write', 'Handler_update', 'Handler_delete')";

/// What a MySQL server has written since it started: read before and after a benchmark, the
/// difference per job says what a job costs the disk, so a reader with another disk can
/// predict their own figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerWrites {
    /// `COMMIT` statements (`Com_commit`).
    pub commits: u64,
    /// fsyncs of InnoDB's files, redo log included (`Innodb_data_fsyncs`).
    pub fsyncs: u64,
    /// Bytes written to InnoDB's data files (`Innodb_data_written`; pages are flushed after
    /// their commits, so a short run shows less than it caused).
    pub data_bytes: u64,
    /// Bytes written to the redo log (`Innodb_os_log_written`).
    pub log_bytes: u64,
    /// Rows inserted, updated and deleted (`Handler_write`, `_update`, `_delete`: MariaDB has
    /// no `Innodb_rows_*`).
    pub rows: u64,
}

impl ServerWrites {
    /// What was written from `earlier` to `self` (a restart in between counts from zero).
    pub fn since(&self, earlier: &ServerWrites) -> ServerWrites {
        ServerWrites {
            commits: self.commits.saturating_sub(earlier.commits),
            fsyncs: self.fsyncs.saturating_sub(earlier.fsyncs),
            data_bytes: self.data_bytes.saturating_sub(earlier.data_bytes),
            log_bytes: self.log_bytes.saturating_sub(earlier.log_bytes),
            rows: self.rows.saturating_sub(earlier.rows),
        }
    }
}

/// Durations below this many ms have a latency bucket each.
pub const LATENCY_EXACT_BELOW_MS: u32 = 64;
/// Latency buckets per doubling above [`LATENCY_EXACT_BELOW_MS`]: each spans 4.4%, so a
/// percentile read from them is within 2.2% of the true one.
pub const LATENCY_STEPS_PER_DOUBLING: u32 = 16;

/// The latency bucket of a duration: exact below 64 ms, then 16 buckets per doubling. The
/// MySQL statement of [`JobDb::lane_attempts`] computes the same (SQLite has no `LOG2`: there
/// this function buckets the durations it returns); keeping percentiles in buckets makes
/// the answer small (a few hundred rows per lane at most) whatever the number of attempts.
pub fn latency_key(duration_ms: u32) -> i64 {
    if duration_ms < LATENCY_EXACT_BELOW_MS {
        return i64::from(duration_ms);
    }
    let doublings = (f64::from(duration_ms) / f64::from(LATENCY_EXACT_BELOW_MS)).log2();
    i64::from(LATENCY_EXACT_BELOW_MS)
        + (doublings * f64::from(LATENCY_STEPS_PER_DOUBLING)).floor() as i64
}

/// The duration a latency bucket stands for, in ms: the value itself below 64 ms, else the
/// geometric middle of the bucket.
pub fn latency_ms(key: i64) -> f64 {
    let exact = i64::from(LATENCY_EXACT_BELOW_MS);
    if key < exact {
        return key.max(0) as f64;
    }
    let steps = (key - exact) as f64 + 0.5;
    f64::from(LATENCY_EXACT_BELOW_MS) * (steps / f64::from(LATENCY_STEPS_PER_DOUBLING)).exp2()
}

/// Transitions into one state within one time slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotCount {
    /// The slot: 0 is the one starting at the window's start.
    pub slot: i64,
    /// The state entered.
    pub state: State,
    /// How many transitions.
    pub count: u64,
}

/// Jobs of one lane whose latest state is one of the waiting ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneBacklog {
    /// The lane (endpoint without query).
    pub lane: String,
    /// `awaiting-scheduling`, `awaiting-retry` or `executing`.
    pub state: State,
    /// `awaiting-retry` before any attempt: scheduled for later (`deliver_at`, `delay_ms`, or
    /// postponed by an operator before its first attempt).
    pub scheduled: bool,
    /// How many jobs.
    pub jobs: u64,
}

/// Attempts of one lane that ended in one state, with durations in one latency bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneAttempts {
    /// The lane.
    pub lane: String,
    /// `succeeded`, `awaiting-retry` or `discarded`.
    pub state: State,
    /// The latency bucket ([`latency_ms`] gives its duration).
    pub latency_key: i64,
    /// How many attempts.
    pub attempts: u64,
}

/// Attempts of one lane within one time slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneSlot {
    /// The lane.
    pub lane: String,
    /// The slot (0 starts at the window's start).
    pub slot: i64,
    /// Attempts that succeeded.
    pub succeeded: u64,
    /// Attempts that failed (retried or discarded).
    pub failed: u64,
}

/// The last time one kind of failure was recorded on a lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneError {
    /// The lane.
    pub lane: String,
    /// The failure kind (`server-error`, `client-error`, `request-timeout`, ...).
    pub error_type: String,
    /// The HTTP status, when the endpoint answered.
    pub response_status: Option<u16>,
    /// When it was last recorded.
    pub last_at: DateTime<Utc>,
}

/// The JobDB's tables as the server reports them in `information_schema`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobDbSize {
    /// Rows of all tables (InnoDB's estimate).
    pub rows: u64,
    /// Data and index bytes of all tables.
    pub bytes: u64,
}

/// The `jobdb_owner` row: who holds the JobDB, with which fencing token, since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRecord {
    /// The fencing token of the current holder.
    pub fencing_token: u64,
    /// The holder's name (empty before any owner).
    pub holder: String,
    /// When the holder took it.
    pub acquired_at: Option<DateTime<Utc>>,
}

/// A job without its payload and headers (a trace shows where it went, not what it carried).
#[derive(Clone, Debug, PartialEq)]
pub struct JobSummary {
    /// The job, with an empty payload and no headers.
    pub job: Job,
    /// Size of the payload it carries, in bytes.
    pub payload_bytes: u64,
}

/// How ordered work stands in one JobDB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OrderingCounts {
    /// Ordered jobs waiting for their turn.
    pub held: u64,
    /// Sequences stopped by a job that ended without success and asked to block.
    pub blocked: u64,
    /// Of `held`, those whose key waits for a job scheduled for later (`deliver_at`,
    /// `delay_ms`): its turn came, and it holds the key until its time.
    pub behind_scheduled: u64,
}

/// The sequences whose released job is scheduled for later and never tried (binds: now).
macro_rules! scheduled_heads {
    () => {
        "SELECT r.seq FROM open_jobs r \
         WHERE r.seq IS NOT NULL AND r.held = 0 AND r.attempts = 0 \
           AND r.state = 'awaiting-retry' AND r.retry_at > ? \
           AND NOT EXISTS (SELECT 1 FROM job_state_transitions t \
                           WHERE t.job_id = r.job_id AND t.id > r.transition_id)"
    };
}

impl JobDb {
    /// When the oldest job here was made (its id's time), if there is one; the dashboard fits
    /// its default window to it.
    pub async fn first_job_at(&self) -> Result<Option<DateTime<Utc>>, JobDbError> {
        let first: Option<Vec<u8>> = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT MIN(id) FROM jobs")
                .fetch_one(p)
                .await?
        });
        let Some(bytes) = first else {
            return Ok(None);
        };
        let bytes: [u8; 16] = bytes
            .try_into()
            .map_err(|_| JobDbError::Corrupt("a job id is not 16 bytes".into()))?;
        let ms = JobId::from_bytes(bytes).0.timestamp_ms();
        Ok(i64::try_from(ms)
            .ok()
            .and_then(DateTime::from_timestamp_millis))
    }

    /// Steps per state and time slot of `slot_s` seconds since `start` (slot 0 starts at
    /// `start`; steps before it are not counted): rows, and the acceptances and attempt
    /// starts recorded by `commit_log`.
    pub async fn transitions_per_slot(
        &self,
        start: DateTime<Utc>,
        slot_s: u32,
    ) -> Result<Vec<SlotCount>, JobDbError> {
        let start = start.naive_utc();
        with_pool!(self, |p, q| {
            sqlx::query(q::TRANSITIONS_PER_SLOT)
                .bind(start)
                .bind(slot_s.max(1))
                .bind(start)
                .bind(start)
                .bind(start)
                .bind(start)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    Ok(SlotCount {
                        slot: row.try_get("slot")?,
                        state: q::state_of(row)?,
                        count: q::count_of(row, "n")?,
                    })
                })
                .collect()
        })
    }

    /// Jobs waiting (latest state `awaiting-scheduling`, `awaiting-retry` or `executing`), by
    /// lane and state.
    pub async fn lane_backlog(&self) -> Result<Vec<LaneBacklog>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(q::LANE_BACKLOG)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    Ok(LaneBacklog {
                        lane: q::text(row, "lane")?,
                        state: q::state_of(row)?,
                        scheduled: q::count_of(row, "scheduled")? == 1,
                        jobs: q::count_of(row, "n")?,
                    })
                })
                .collect()
        })
    }

    /// Attempts that ended since `since`, by lane, outcome state and latency bucket.
    pub async fn lane_attempts(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<LaneAttempts>, JobDbError> {
        let (rows, in_sql) = with_pool!(self, |p, q| {
            let rows = sqlx::query(q::LANE_ATTEMPTS)
                .bind(since.naive_utc())
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    Ok(LaneAttempts {
                        lane: q::text(row, "lane")?,
                        state: q::state_of(row)?,
                        latency_key: row.try_get("latency_key")?,
                        attempts: q::count_of(row, "n")?,
                    })
                })
                .collect::<Result<Vec<_>, JobDbError>>()?;
            (rows, q::LATENCY_IN_SQL)
        });
        if in_sql {
            return Ok(rows);
        }
        // Durations came back: bucket them here, merging rows that share a bucket.
        let mut merged: HashMap<(String, State, i64), u64> = HashMap::new();
        for row in rows {
            let ms = u32::try_from(row.latency_key.max(0)).unwrap_or(u32::MAX);
            *merged
                .entry((row.lane, row.state, latency_key(ms)))
                .or_default() += row.attempts;
        }
        Ok(merged
            .into_iter()
            .map(|((lane, state, latency_key), attempts)| LaneAttempts {
                lane,
                state,
                latency_key,
                attempts,
            })
            .collect())
    }

    /// Attempts per lane and time slot of `slot_s` seconds since `start`: succeeded and failed.
    pub async fn lane_slots(
        &self,
        start: DateTime<Utc>,
        slot_s: u32,
    ) -> Result<Vec<LaneSlot>, JobDbError> {
        let start = start.naive_utc();
        with_pool!(self, |p, q| {
            sqlx::query(q::LANE_SLOTS)
                .bind(start)
                .bind(slot_s.max(1))
                .bind(start)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    Ok(LaneSlot {
                        lane: q::text(row, "lane")?,
                        slot: row.try_get("slot")?,
                        succeeded: q::count_of(row, "succeeded")?,
                        failed: q::count_of(row, "failed")?,
                    })
                })
                .collect()
        })
    }

    /// The kinds of failed attempts since `since`, by lane, each with when it was last seen.
    pub async fn lane_errors(&self, since: DateTime<Utc>) -> Result<Vec<LaneError>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(q::LANE_ERRORS)
                .bind(since.naive_utc())
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    Ok(LaneError {
                        lane: q::text(row, "lane")?,
                        error_type: q::text_opt(row, "error_type")?.unwrap_or_default(),
                        response_status: row.try_get("response_status")?,
                        last_at: q::time_of(row, "last_at")?,
                    })
                })
                .collect()
        })
    }

    /// Succeeded jobs by the attempts they took (Centrifuge's "retries by attempt number").
    pub async fn succeeded_by_attempts(&self) -> Result<Vec<(u16, u64)>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT attempts, COUNT(*) AS n FROM job_state_transitions \
                 WHERE state = 'succeeded' GROUP BY attempts ORDER BY attempts",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(|row| Ok((row.try_get("attempts")?, q::count_of(row, "n")?)))
            .collect()
        })
    }

    /// Rows and bytes of the JobDB's tables: from `information_schema` (MySQL), or the
    /// file's pages (SQLite).
    pub async fn size(&self) -> Result<JobDbSize, JobDbError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query(q::SIZE).bind(self.name()).fetch_one(p).await?;
            Ok(JobDbSize {
                rows: row.try_get("n_rows")?,
                bytes: row.try_get("n_bytes")?,
            })
        })
    }

    /// The server's write counters ([`ServerWrites`]); `None` for SQLite, which has none.
    pub async fn server_writes(&self) -> Result<Option<ServerWrites>, JobDbError> {
        let super::engine::Pool::MySql(pool) = &self.pool else {
            return Ok(None);
        };
        let mut writes = ServerWrites::default();
        for row in sqlx::query(SERVER_WRITES).fetch_all(pool).await? {
            let name: String = row.try_get(0)?;
            let value: String = row.try_get(1)?;
            let value: u64 = value.parse().unwrap_or(0);
            match name.as_str() {
                "Com_commit" => writes.commits = value,
                "Innodb_data_fsyncs" => writes.fsyncs = value,
                "Innodb_data_written" => writes.data_bytes = value,
                "Innodb_os_log_written" => writes.log_bytes = value,
                _ => writes.rows = writes.rows.saturating_add(value),
            }
        }
        Ok(Some(writes))
    }

    /// When the JobDB was created: when its first migration was applied.
    pub async fn created_at(&self) -> Result<Option<DateTime<Utc>>, JobDbError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query("SELECT MIN(installed_on) AS at FROM _sqlx_migrations")
                .fetch_one(p)
                .await?;
            q::installed_on(&row, "at")
        })
    }

    /// The `jobdb_owner` row.
    pub async fn owner_record(&self) -> Result<OwnerRecord, JobDbError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query(
                "SELECT fencing_token, holder, acquired_at FROM jobdb_owner WHERE id = 1",
            )
            .fetch_one(p)
            .await?;
            Ok(OwnerRecord {
                fencing_token: row.try_get("fencing_token")?,
                holder: q::text(&row, "holder")?,
                acquired_at: q::time_opt(&row, "acquired_at")?,
            })
        })
    }

    /// Ids of the jobs submitted with this idempotency key (in any bucket), oldest first, at
    /// most `limit`. Not indexed: a scan of `jobs`, for an operator's search.
    pub async fn jobs_with_idempotency_key(
        &self,
        key: &str,
        limit: u32,
    ) -> Result<Vec<JobId>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query("SELECT id FROM jobs WHERE idempotency_key = ? ORDER BY id LIMIT ?")
                .bind(key)
                .bind(limit)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| q::job_id_of(row, "id"))
                .collect()
        })
    }

    /// Jobs that name an `on_complete` URL and have not ended here yet (their notice is owed):
    /// a small table, counted whole.
    pub async fn notices_owed(&self) -> Result<u64, JobDbError> {
        let n: i64 = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT COUNT(*) FROM notices_owed")
                .fetch_one(p)
                .await?
        });
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Ordered jobs waiting for their turn (held, and kept: fresh ones waiting in a writer's
    /// book, behind an older open job of their sequence),
    /// sequences blocked by a failure (`ordering_blocked`, until an operator deletes the
    /// row), and the waiting jobs whose sequence's released job is scheduled for later: it
    /// was never tried, is due after now, and no row followed its `open_jobs` entry (one
    /// postponed since is not counted).
    pub async fn ordering_counts(&self) -> Result<OrderingCounts, JobDbError> {
        let now = Utc::now().naive_utc();
        // Kept jobs have no entry: they are the fresh ordered jobs behind an older open job
        // of their sequence (its first fresh job, when no entry is older, is under way).
        let mut fresh: HashMap<crate::job::Seq, Vec<ulid::Ulid>> = HashMap::new();
        for (_, place) in self.fresh_places(true).await? {
            if let Some(place) = place {
                fresh.entry(place.seq).or_default().push(place.position);
            }
        }
        let seqs: Vec<crate::job::Seq> = fresh.keys().copied().collect();
        let (held, blocked, behind, oldest, scheduled) = with_pool!(self, |p, q| {
            let (held, blocked, behind): (i64, i64, i64) = sqlx::query_as(concat!(
                "SELECT (SELECT COUNT(*) FROM open_jobs WHERE seq IS NOT NULL AND held = 1), \
                        (SELECT COUNT(*) FROM ordering_blocked), \
                        (SELECT COUNT(*) FROM open_jobs h \
                         WHERE h.seq IS NOT NULL AND h.held = 1 AND h.seq IN (",
                scheduled_heads!(),
                "))"
            ))
            .bind(now)
            .fetch_one(p)
            .await?;
            let mut conn = p.acquire().await?;
            let mut oldest = HashMap::new();
            // Each list is bound twice.
            for chunk in seqs.chunks(super::MAX_IDS_PER_SELECT / 2) {
                oldest.extend(q::sequence_oldest(&mut conn, chunk, false).await?);
            }
            let mut scheduled = std::collections::HashSet::new();
            if !seqs.is_empty() {
                for row in &sqlx::query(scheduled_heads!())
                    .bind(now)
                    .fetch_all(&mut *conn)
                    .await?
                {
                    scheduled.insert(q::seq_of_row(row, "seq")?);
                }
            }
            Ok::<_, JobDbError>((held, blocked, behind, oldest, scheduled))
        })?;
        let (mut kept, mut kept_behind) = (0u64, 0u64);
        for (seq, positions) in &fresh {
            let first = positions.iter().min().copied();
            let under_way = first.is_some_and(|f| oldest.get(seq).is_none_or(|o| f < *o));
            let here = positions.len() as u64 - u64::from(under_way);
            kept += here;
            if scheduled.contains(seq) {
                kept_behind += here;
            }
        }
        Ok(OrderingCounts {
            held: u64::try_from(held).unwrap_or(0) + kept,
            blocked: u64::try_from(blocked).unwrap_or(0),
            behind_scheduled: u64::try_from(behind).unwrap_or(0) + kept_behind,
        })
    }

    /// The jobs with these ids (those that exist here), without payloads and headers, in id
    /// order.
    pub async fn job_summaries(&self, ids: &[JobId]) -> Result<Vec<JobSummary>, JobDbError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        with_pool!(self, |p, q| {
            q::ids_query(q::SELECT_JOB_SUMMARIES, ids, ") ORDER BY id")
                .build()
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    Ok(JobSummary {
                        job: q::job_from_row(row)?,
                        payload_bytes: q::count_of(row, "payload_bytes")?,
                    })
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_exact_then_within_two_percent() {
        for ms in 0..LATENCY_EXACT_BELOW_MS {
            assert_eq!(latency_ms(latency_key(ms)), f64::from(ms));
        }
        for ms in [
            64,
            65,
            100,
            150,
            200,
            999,
            1_000,
            10_000,
            3_600_000,
            u32::MAX,
        ] {
            let back = latency_ms(latency_key(ms));
            let error = (back - f64::from(ms)).abs() / f64::from(ms);
            assert!(error <= 0.023, "{ms} ms comes back as {back} ms");
        }
        // Buckets only grow with the duration.
        let keys: Vec<i64> = (0..5_000).map(latency_key).collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]));
    }
}
