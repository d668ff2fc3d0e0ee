//! The dashboard's read queries over a JobDB: transitions by state over time, per-lane
//! outcomes, latencies, backlog and errors, attempts per success, the JobDB's size, age and
//! owner, and job look-ups for traces.
//!
//! All of them only read, and every value comes in through a bind parameter. The JobDB indexes
//! nothing but its primary keys (the write path pays for no index a dashboard would like), so
//! the window queries scan `job_state_transitions`: cheap for JobDBs that retire after half an
//! hour or a few GiB, which is how the lifecycle keeps them. A lane is an endpoint without its
//! query or fragment, as the Director's queues group them ([`crate::job::endpoint_key`]);
//! grouping by it in SQL keeps one row per lane however many query strings there are.

use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::lifecycle::ids_query;
use super::{job_from_row, job_id_of, state_of, text, text_opt, JobDb, JobDbError};
use crate::job::{Job, JobId, State};

/// The lane of `jobs j` in SQL: `endpoint` cut at the first `?` or `#`, exactly as
/// [`crate::job::endpoint_key`] cuts it (cutting at `?` and then at `#` finds the earlier one).
macro_rules! lane {
    () => {
        "SUBSTRING_INDEX(SUBSTRING_INDEX(j.endpoint, '?', 1), '#', 1)"
    };
}

/// The time slot of `t.time` in SQL: whole slots of the second parameter's seconds since the
/// first (the window's start), as the dashboard's `Window` cuts them.
macro_rules! slot {
    () => {
        "CAST(TIMESTAMPDIFF(SECOND, ?, t.time) DIV ? AS SIGNED)"
    };
}

/// The latency bucket of `t.duration_ms` in SQL; [`latency_key`] is the same function in Rust
/// and [`latency_ms`] its inverse.
macro_rules! latency_key {
    () => {
        "CAST(CASE WHEN t.duration_ms < 64 THEN t.duration_ms \
         ELSE 64 + FLOOR(LOG2(t.duration_ms / 64) * 16) END AS SIGNED)"
    };
}

/// Attempts (rows with a duration) that ended in these states: a success, or a failure that is
/// retried or discarded. Rows without a duration in the same states are not attempts
/// (`interrupted`, `imported`, operator commands).
macro_rules! attempt_rows {
    () => {
        "t.state IN ('succeeded', 'awaiting-retry', 'discarded') AND t.duration_ms IS NOT NULL"
    };
}

/// Durations below this many ms have a latency bucket each.
pub const LATENCY_EXACT_BELOW_MS: u32 = 64;
/// Latency buckets per doubling above [`LATENCY_EXACT_BELOW_MS`]: each spans 4.4%, so a
/// percentile read from them is within 2.2% of the true one.
pub const LATENCY_STEPS_PER_DOUBLING: u32 = 16;

/// The latency bucket of a duration: exact below 64 ms, then 16 buckets per doubling. The
/// SQL of [`JobDb::lane_attempts`] computes the same; keeping percentiles in buckets makes
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

impl JobDb {
    /// Transitions per state and time slot of `slot_s` seconds since `start` (slot 0 starts
    /// at `start`; rows before it are not counted).
    pub async fn transitions_per_slot(
        &self,
        start: DateTime<Utc>,
        slot_s: u32,
    ) -> Result<Vec<SlotCount>, JobDbError> {
        let start = start.naive_utc();
        let rows = sqlx::query(concat!(
            "SELECT ",
            slot!(),
            " AS slot, t.state, COUNT(*) AS n \
             FROM job_state_transitions t WHERE t.time >= ? \
             GROUP BY slot, t.state"
        ))
        .bind(start)
        .bind(slot_s.max(1))
        .bind(start)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(SlotCount {
                    slot: row.try_get("slot")?,
                    state: state_of(row)?,
                    count: count_of(row, "n")?,
                })
            })
            .collect()
    }

    /// Jobs waiting (latest state `awaiting-scheduling`, `awaiting-retry` or `executing`), by
    /// lane and state.
    pub async fn lane_backlog(&self) -> Result<Vec<LaneBacklog>, JobDbError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            lane!(),
            " AS lane, l.state, COUNT(*) AS n \
             FROM jobs j JOIN job_latest l ON l.job_id = j.id \
             WHERE l.state IN ('awaiting-scheduling', 'awaiting-retry', 'executing') \
             GROUP BY lane, l.state"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(LaneBacklog {
                    lane: text(row, "lane")?,
                    state: state_of(row)?,
                    jobs: count_of(row, "n")?,
                })
            })
            .collect()
    }

    /// Attempts that ended since `since`, by lane, outcome state and latency bucket.
    pub async fn lane_attempts(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<LaneAttempts>, JobDbError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            lane!(),
            " AS lane, t.state, ",
            latency_key!(),
            " AS latency_key, COUNT(*) AS n \
             FROM job_state_transitions t JOIN jobs j ON j.id = t.job_id \
             WHERE t.time >= ? AND ",
            attempt_rows!(),
            " GROUP BY lane, t.state, latency_key"
        ))
        .bind(since.naive_utc())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(LaneAttempts {
                    lane: text(row, "lane")?,
                    state: state_of(row)?,
                    latency_key: row.try_get("latency_key")?,
                    attempts: count_of(row, "n")?,
                })
            })
            .collect()
    }

    /// Attempts per lane and time slot of `slot_s` seconds since `start`: succeeded and failed.
    pub async fn lane_slots(
        &self,
        start: DateTime<Utc>,
        slot_s: u32,
    ) -> Result<Vec<LaneSlot>, JobDbError> {
        let start = start.naive_utc();
        let rows = sqlx::query(concat!(
            "SELECT ",
            lane!(),
            " AS lane, ",
            slot!(),
            " AS slot, \
             CAST(SUM(t.state = 'succeeded') AS SIGNED) AS succeeded, \
             CAST(SUM(t.state <> 'succeeded') AS SIGNED) AS failed \
             FROM job_state_transitions t JOIN jobs j ON j.id = t.job_id \
             WHERE t.time >= ? AND ",
            attempt_rows!(),
            " GROUP BY lane, slot"
        ))
        .bind(start)
        .bind(slot_s.max(1))
        .bind(start)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(LaneSlot {
                    lane: text(row, "lane")?,
                    slot: row.try_get("slot")?,
                    succeeded: count_of(row, "succeeded")?,
                    failed: count_of(row, "failed")?,
                })
            })
            .collect()
    }

    /// The kinds of failed attempts since `since`, by lane, each with when it was last seen.
    pub async fn lane_errors(&self, since: DateTime<Utc>) -> Result<Vec<LaneError>, JobDbError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            lane!(),
            " AS lane, t.error_type, t.response_status, MAX(t.time) AS last_at \
             FROM job_state_transitions t JOIN jobs j ON j.id = t.job_id \
             WHERE t.time >= ? AND t.error_type IS NOT NULL AND ",
            attempt_rows!(),
            " GROUP BY lane, t.error_type, t.response_status"
        ))
        .bind(since.naive_utc())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let last_at: NaiveDateTime = row.try_get("last_at")?;
                Ok(LaneError {
                    lane: text(row, "lane")?,
                    error_type: text_opt(row, "error_type")?.unwrap_or_default(),
                    response_status: row.try_get("response_status")?,
                    last_at: last_at.and_utc(),
                })
            })
            .collect()
    }

    /// Succeeded jobs by the attempts they took (Centrifuge's "retries by attempt number").
    pub async fn succeeded_by_attempts(&self) -> Result<Vec<(u16, u64)>, JobDbError> {
        let rows = sqlx::query(
            "SELECT attempts, COUNT(*) AS n FROM job_latest WHERE state = 'succeeded' \
             GROUP BY attempts ORDER BY attempts",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("attempts")?, count_of(row, "n")?)))
            .collect()
    }

    /// Rows and bytes of the JobDB's tables, from `information_schema`.
    pub async fn size(&self) -> Result<JobDbSize, JobDbError> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(table_rows), 0) AS UNSIGNED) AS n_rows, \
             CAST(COALESCE(SUM(data_length + index_length), 0) AS UNSIGNED) AS n_bytes \
             FROM information_schema.tables WHERE table_schema = ?",
        )
        .bind(self.name())
        .fetch_one(&self.pool)
        .await?;
        Ok(JobDbSize {
            rows: row.try_get("n_rows")?,
            bytes: row.try_get("n_bytes")?,
        })
    }

    /// When the JobDB was created: when its first migration was applied.
    pub async fn created_at(&self) -> Result<Option<DateTime<Utc>>, JobDbError> {
        let at: Option<DateTime<Utc>> =
            sqlx::query_scalar("SELECT MIN(installed_on) FROM _sqlx_migrations")
                .fetch_one(&self.pool)
                .await?;
        Ok(at)
    }

    /// The `jobdb_owner` row.
    pub async fn owner_record(&self) -> Result<OwnerRecord, JobDbError> {
        let row =
            sqlx::query("SELECT fencing_token, holder, acquired_at FROM jobdb_owner WHERE id = 1")
                .fetch_one(&self.pool)
                .await?;
        let acquired_at: Option<NaiveDateTime> = row.try_get("acquired_at")?;
        Ok(OwnerRecord {
            fencing_token: row.try_get("fencing_token")?,
            holder: text(&row, "holder")?,
            acquired_at: acquired_at.map(|t| t.and_utc()),
        })
    }

    /// Ids of the jobs submitted with this idempotency key (in any bucket), oldest first, at
    /// most `limit`. Not indexed: a scan of `jobs`, for an operator's search.
    pub async fn jobs_with_idempotency_key(
        &self,
        key: &str,
        limit: u32,
    ) -> Result<Vec<JobId>, JobDbError> {
        let rows = sqlx::query("SELECT id FROM jobs WHERE idempotency_key = ? ORDER BY id LIMIT ?")
            .bind(key)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|row| job_id_of(row, "id")).collect()
    }

    /// The jobs with these ids (those that exist here), without payloads and headers, in id
    /// order.
    pub async fn job_summaries(&self, ids: &[JobId]) -> Result<Vec<JobSummary>, JobDbError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows = ids_query(
            "SELECT id, bucket, endpoint, method, '{}' AS headers, CAST('' AS BINARY) AS payload, \
             execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, created_at, \
             expire_at, idempotency_key, CAST(LENGTH(payload) AS SIGNED) AS payload_bytes \
             FROM jobs WHERE id IN (",
            ids,
            ") ORDER BY id",
        )
        .build()
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(JobSummary {
                    job: job_from_row(row)?,
                    payload_bytes: count_of(row, "payload_bytes")?,
                })
            })
            .collect()
    }
}

/// A count column (`COUNT(*)`, a cast sum, a length) as a `u64`.
fn count_of(row: &MySqlRow, column: &str) -> Result<u64, JobDbError> {
    let n: i64 = row.try_get(column)?;
    u64::try_from(n).map_err(|_| JobDbError::Corrupt(format!("{column} is negative: {n}")))
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
