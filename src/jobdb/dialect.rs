//! The two JobDB engines' SQL: one module per engine ([`mysql`], [`sqlite`]), each with the
//! statements whose spelling differs and the same row decoders and INSERT builders, generated
//! for that engine's types by one macro.
//!
//! [`super::JobDb`]'s methods are written once: `with_pool!` runs a method's body against the
//! engine's pool with `q` naming that engine's module here, so a statement both engines spell
//! alike stays in the method and one they spell differently is `q::NAME`. Engine differences
//! live here and in the two `migrations/` directories, nowhere else.

/// What both engines share: decoders from a row to spindle's types, INSERT builders, the
/// fenced commit. `$db` is the sqlx database type, `$row` its row type.
macro_rules! engine_common {
    ($db:ty, $row:ty) => {
        use std::sync::Arc;
        use std::time::Duration;

        use bytes::Bytes;
        use chrono::{DateTime, NaiveDateTime, Utc};
        use sqlx::{QueryBuilder, Row};
        use ulid::Ulid;

        use crate::job::{Job, JobId, Progress, RetryPolicy, State, Transition};
        use crate::jobdb::commands::Command;
        use crate::jobdb::lifecycle::Origin;
        use crate::jobdb::{headers_json, millis_u32, JobDbError, OpenRow};

        /// This engine's sqlx database type.
        pub type Db = $db;
        /// This engine's row type.
        pub type DbRow = $row;

        /// A text column, whatever its collation (sqlx types MySQL's `_bin` collations as
        /// binary; SQLite hands TEXT out as bytes too).
        pub fn text(row: &$row, column: &str) -> Result<String, JobDbError> {
            let bytes: Vec<u8> = row.try_get(column)?;
            String::from_utf8(bytes)
                .map_err(|_| JobDbError::Corrupt(format!("{column} is not utf-8")))
        }

        /// A nullable text column.
        pub fn text_opt(row: &$row, column: &str) -> Result<Option<String>, JobDbError> {
            let bytes: Option<Vec<u8>> = row.try_get(column)?;
            bytes
                .map(|b| {
                    String::from_utf8(b)
                        .map_err(|_| JobDbError::Corrupt(format!("{column} is not utf-8")))
                })
                .transpose()
        }

        /// The `state` column.
        pub fn state_of(row: &$row) -> Result<State, JobDbError> {
            std::str::FromStr::from_str(&text(row, "state")?)
                .map_err(|e: crate::job::UnknownState| JobDbError::Corrupt(e.to_string()))
        }

        /// A 16-byte id column.
        pub fn job_id_of(row: &$row, column: &str) -> Result<JobId, JobDbError> {
            let bytes: Vec<u8> = row.try_get(column)?;
            let bytes: [u8; 16] = bytes
                .try_into()
                .map_err(|_| JobDbError::Corrupt(format!("{column} is not 16 bytes")))?;
            Ok(JobId::from_bytes(bytes))
        }

        /// A 16-byte ULID column (batch ids).
        pub fn ulid_of(row: &$row, column: &str) -> Result<Ulid, JobDbError> {
            job_id_of(row, column).map(|id| id.0)
        }

        /// A count column (`COUNT(*)`, a cast sum, a length) as a `u64`.
        pub fn count_of(row: &$row, column: &str) -> Result<u64, JobDbError> {
            let n: i64 = row.try_get(column)?;
            u64::try_from(n).map_err(|_| JobDbError::Corrupt(format!("{column} is negative: {n}")))
        }

        /// A UTC time column.
        pub fn time_of(row: &$row, column: &str) -> Result<DateTime<Utc>, JobDbError> {
            let t: NaiveDateTime = row.try_get(column)?;
            Ok(t.and_utc())
        }

        /// A nullable UTC time column.
        pub fn time_opt(row: &$row, column: &str) -> Result<Option<DateTime<Utc>>, JobDbError> {
            let t: Option<NaiveDateTime> = row.try_get(column)?;
            Ok(t.map(|t| t.and_utc()))
        }

        /// `state`, `attempts`, `retry_at` of a transition row.
        pub fn progress_of(row: &$row) -> Result<Progress, JobDbError> {
            Ok(Progress {
                state: state_of(row)?,
                attempts: row.try_get("attempts")?,
                retry_at: time_opt(row, "retry_at")?,
            })
        }

        /// A `jobs` row.
        pub fn job_from_row(row: &$row) -> Result<Job, JobDbError> {
            let id = job_id_of(row, "id")?;
            let headers = text(row, "headers")?;
            let headers: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&headers)
                    .map_err(|e| JobDbError::Corrupt(format!("headers of {id}: {e}")))?;
            let headers = headers
                .into_iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => Ok((k, s)),
                    other => Err(JobDbError::Corrupt(format!(
                        "header {k} of {id} is {other}"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let payload: Vec<u8> = row.try_get("payload")?;
            let timeout: u32 = row.try_get("execution_timeout_ms")?;
            let min_delay: u32 = row.try_get("backoff_min_delay_ms")?;
            Ok(Job {
                id,
                bucket: text(row, "bucket")?.into(),
                endpoint: text(row, "endpoint")?.into(),
                method: text(row, "method")?.into(),
                headers,
                payload: Bytes::from(payload),
                execution_timeout: Duration::from_millis(timeout.into()),
                retry: RetryPolicy {
                    min_delay: Duration::from_millis(min_delay.into()),
                    coefficient: row.try_get("backoff_coefficient")?,
                },
                created_at: time_of(row, "created_at")?,
                expire_at: time_of(row, "expire_at")?,
                idempotency_key: text_opt(row, "idempotency_key")?,
            })
        }

        /// A `job_state_transitions` row with its id.
        pub fn transition_from_row(row: &$row) -> Result<(u64, Transition), JobDbError> {
            let encoding = text_opt(row, "error_response_encoding")?;
            let error_response: Option<Vec<u8>> = row.try_get("error_response")?;
            Ok((
                row.try_get("id")?,
                Transition {
                    job_id: job_id_of(row, "job_id")?,
                    state: state_of(row)?,
                    attempts: row.try_get("attempts")?,
                    time: time_of(row, "time")?,
                    retry_at: time_opt(row, "retry_at")?,
                    error_type: text_opt(row, "error_type")?,
                    error_response: error_response.map(Bytes::from),
                    error_response_encoding: match encoding.as_deref() {
                        Some("utf-8") => Some("utf-8"),
                        Some(_) => Some("binary"),
                        None => None,
                    },
                    response_status: row.try_get("response_status")?,
                    duration_ms: row.try_get("duration_ms")?,
                },
            ))
        }

        /// An `operator_commands` row.
        pub fn command_from_row(row: &$row) -> Result<Command, JobDbError> {
            let job_id: Option<Vec<u8>> = row.try_get("job_id")?;
            let job_id = match job_id {
                Some(_) => Some(job_id_of(row, "job_id")?),
                None => None,
            };
            Ok(Command {
                id: row.try_get("id")?,
                issued_by: text(row, "issued_by")?,
                action: text(row, "action")?.parse()?,
                bucket: text_opt(row, "bucket")?,
                endpoint_prefix: text_opt(row, "endpoint_prefix")?,
                job_id,
                created_before: time_opt(row, "created_before")?,
                postpone_until: time_opt(row, "postpone_until")?,
                reason: text_opt(row, "reason")?,
            })
        }

        /// One multi-row INSERT of jobs.
        fn insert_jobs(jobs: &[Arc<Job>]) -> QueryBuilder<'_, $db> {
            let mut qb = QueryBuilder::<$db>::new(
                "INSERT INTO jobs (id, bucket, endpoint, method, headers, payload, \
                 execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, created_at, \
                 expire_at, idempotency_key) ",
            );
            qb.push_values(jobs, |mut row, job| {
                row.push_bind(job.id.to_bytes().to_vec())
                    .push_bind(&*job.bucket)
                    .push_bind(&*job.endpoint)
                    .push_bind(&*job.method)
                    .push_bind(headers_json(&job.headers))
                    .push_bind(&job.payload[..])
                    .push_bind(millis_u32(job.execution_timeout))
                    .push_bind(millis_u32(job.retry.min_delay))
                    .push_bind(job.retry.coefficient)
                    .push_bind(job.created_at.naive_utc())
                    .push_bind(job.expire_at.naive_utc())
                    .push_bind(job.idempotency_key.as_deref());
            });
            qb
        }

        /// One multi-row INSERT of transitions.
        fn insert_transitions(rows: &[(u64, Transition)]) -> QueryBuilder<'_, $db> {
            let mut qb = QueryBuilder::<$db>::new(
                "INSERT INTO job_state_transitions (id, job_id, time, retry_at, attempts, state, \
                 error_type, error_response, error_response_encoding, response_status, \
                 duration_ms) ",
            );
            qb.push_values(rows, |mut row, (id, t)| {
                row.push_bind(crate::jobdb::int(*id))
                    .push_bind(t.job_id.to_bytes().to_vec())
                    .push_bind(t.time.naive_utc())
                    .push_bind(t.retry_at.map(|r| r.naive_utc()))
                    .push_bind(t.attempts)
                    .push_bind(t.state.as_str())
                    .push_bind(t.error_type.as_deref())
                    .push_bind(t.error_response.as_deref())
                    .push_bind(t.error_response_encoding)
                    .push_bind(t.response_status)
                    .push_bind(t.duration_ms);
            });
            qb
        }

        /// One multi-row INSERT of import origins (a repeated import keeps the first).
        fn insert_origins(origins: &[Origin]) -> QueryBuilder<'_, $db> {
            let mut qb = QueryBuilder::<$db>::new(INSERT_ORIGINS);
            qb.push_values(origins, |mut row, o| {
                row.push_bind(o.job_id.to_bytes().to_vec())
                    .push_bind(o.from_jobdb.as_str())
                    .push_bind(o.imported_at.naive_utc());
            });
            qb
        }

        /// One multi-row upsert of jobs' latest states into `open_jobs` (a job's `expire_at` is
        /// kept when the row does not name it).
        pub(crate) fn upsert_open_jobs(rows: &[OpenRow]) -> QueryBuilder<'_, $db> {
            let mut qb = QueryBuilder::<$db>::new(
                "INSERT INTO open_jobs (job_id, transition_id, state, attempts, retry_at, \
                 expire_at) ",
            );
            qb.push_values(rows, |mut row, o| {
                row.push_bind(o.job_id.to_bytes().to_vec())
                    .push_bind(crate::jobdb::int(o.transition_id))
                    .push_bind(o.state.as_str())
                    .push_bind(o.attempts)
                    .push_bind(o.retry_at.map(|r| r.naive_utc()))
                    .push_bind(o.expire_at.map(|r| r.naive_utc()));
            });
            qb.push(UPSERT_OPEN_JOBS);
            qb
        }

        /// Writes jobs, their transitions and import origins in `tx`, and keeps `open_jobs` in
        /// step: the one way rows enter `jobs` and `job_state_transitions`, whoever writes
        /// (the Director's writer, a drainer, the archiver). Statements of at most `limit`
        /// bytes of rows.
        pub(crate) async fn write_rows(
            tx: &mut sqlx::Transaction<'_, $db>,
            jobs: &[Arc<Job>],
            transitions: &[(u64, Transition)],
            origins: &[Origin],
            limit: usize,
        ) -> Result<(), sqlx::Error> {
            use crate::jobdb::{
                chunks_by_size, job_row_bytes, open_changes, transition_row_bytes,
                MAX_IDS_PER_SELECT, MAX_ROWS_PER_INSERT,
            };
            for chunk in chunks_by_size(jobs, limit, |job| job_row_bytes(job)) {
                insert_jobs(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in chunks_by_size(transitions, limit, |(_, t)| transition_row_bytes(t)) {
                insert_transitions(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in origins.chunks(MAX_ROWS_PER_INSERT) {
                insert_origins(chunk).build().execute(&mut **tx).await?;
            }
            let (open, closed) = open_changes(jobs, transitions);
            for chunk in open.chunks(MAX_ROWS_PER_INSERT) {
                upsert_open_jobs(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in closed.chunks(MAX_IDS_PER_SELECT) {
                ids_query("DELETE FROM open_jobs WHERE job_id IN (", chunk, ")")
                    .build()
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(())
        }

        /// `prefix` + a bound list of ids + `suffix`.
        pub fn ids_query<'a>(
            prefix: &'a str,
            ids: &'a [JobId],
            suffix: &'a str,
        ) -> QueryBuilder<'a, $db> {
            let mut qb = QueryBuilder::<$db>::new(prefix);
            let mut list = qb.separated(", ");
            for id in ids {
                list.push_bind(id.to_bytes().to_vec());
            }
            qb.push(suffix);
            qb
        }

        /// Checks the fencing token as the last statement of `tx` and commits only if it is
        /// ours.
        pub async fn commit_fenced(
            mut tx: sqlx::Transaction<'_, $db>,
            token: u64,
        ) -> Result<(), JobDbError> {
            let current: u64 = sqlx::query_scalar(FENCE_CHECK).fetch_one(&mut *tx).await?;
            if current != token {
                tx.rollback().await?;
                return Err(JobDbError::Fenced {
                    ours: token,
                    current,
                });
            }
            // Past this point a failure may come after the server committed.
            tx.commit().await.map_err(JobDbError::CommitUnknown)
        }

        /// Why the server refused a write for good (its data, not the connection), or `None`
        /// when the error may pass (connection lost, deadlock, lock wait, pool).
        pub fn refusal(e: &sqlx::Error) -> Option<String> {
            match e {
                sqlx::Error::Encode(why) => Some(format!("a value cannot be encoded: {why}")),
                sqlx::Error::Database(db) => {
                    use sqlx::error::ErrorKind;
                    let by_kind = !matches!(db.kind(), ErrorKind::Other);
                    (by_kind || refused_code(&**db)).then(|| db.message().to_owned())
                }
                _ => None,
            }
        }
    };
}

/// The lane of `jobs j` (its endpoint cut at the first `?` or `#`), MySQL's spelling.
macro_rules! lane_mysql {
    () => {
        "SUBSTRING_INDEX(SUBSTRING_INDEX(j.endpoint, '?', 1), '#', 1)"
    };
}

/// The lane of `jobs j`, SQLite's spelling (no SUBSTRING_INDEX: cut before the earlier of the
/// two characters).
macro_rules! lane_sqlite {
    () => {
        "substr(j.endpoint, 1, min(\
         CASE WHEN instr(j.endpoint, '?') > 0 THEN instr(j.endpoint, '?') - 1 \
              ELSE length(j.endpoint) END, \
         CASE WHEN instr(j.endpoint, '#') > 0 THEN instr(j.endpoint, '#') - 1 \
              ELSE length(j.endpoint) END))"
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

/// The statements of [`super::stats`] for one engine: `$lane` is its lane expression, `$slot`
/// its time slot of `t.time` (whole slots of the second parameter's seconds since the first),
/// `$int` its name for a signed integer cast, `$latency` the latency bucket of `t.duration_ms`
/// ([`super::stats::latency_key`]) or, where the engine lacks `LOG2`, the duration itself
/// (then `LATENCY_IN_SQL` is false and the caller buckets).
macro_rules! stats_sql {
    ($lane:expr, $slot:expr, $int:literal, $latency:expr, $in_sql:literal) => {
        /// Whether `LANE_ATTEMPTS` returns latency buckets (else durations).
        pub const LATENCY_IN_SQL: bool = $in_sql;
        /// Transitions per state and slot.
        pub const TRANSITIONS_PER_SLOT: &str = concat!(
            "SELECT ",
            $slot,
            " AS slot, t.state, COUNT(*) AS n \
             FROM job_state_transitions t WHERE t.time >= ? \
             GROUP BY slot, t.state"
        );
        /// Waiting jobs by lane and state.
        pub const LANE_BACKLOG: &str = concat!(
            "SELECT ",
            $lane,
            " AS lane, l.state, COUNT(*) AS n \
             FROM jobs j JOIN job_latest l ON l.job_id = j.id \
             WHERE l.state IN ('awaiting-scheduling', 'awaiting-retry', 'executing') \
             GROUP BY lane, l.state"
        );
        /// Attempts since a time by lane, state and latency bucket (or duration).
        pub const LANE_ATTEMPTS: &str = concat!(
            "SELECT ",
            $lane,
            " AS lane, t.state, ",
            $latency,
            " AS latency_key, COUNT(*) AS n \
             FROM job_state_transitions t JOIN jobs j ON j.id = t.job_id \
             WHERE t.time >= ? AND ",
            attempt_rows!(),
            " GROUP BY lane, t.state, latency_key"
        );
        /// Attempts per lane and slot, succeeded and failed.
        pub const LANE_SLOTS: &str = concat!(
            "SELECT ",
            $lane,
            " AS lane, ",
            $slot,
            " AS slot, \
             CAST(SUM(t.state = 'succeeded') AS ",
            $int,
            ") AS succeeded, CAST(SUM(t.state <> 'succeeded') AS ",
            $int,
            ") AS failed \
             FROM job_state_transitions t JOIN jobs j ON j.id = t.job_id \
             WHERE t.time >= ? AND ",
            attempt_rows!(),
            " GROUP BY lane, slot"
        );
        /// Kinds of failed attempts since a time, by lane.
        pub const LANE_ERRORS: &str = concat!(
            "SELECT ",
            $lane,
            " AS lane, t.error_type, t.response_status, MAX(t.time) AS last_at \
             FROM job_state_transitions t JOIN jobs j ON j.id = t.job_id \
             WHERE t.time >= ? AND t.error_type IS NOT NULL AND ",
            attempt_rows!(),
            " GROUP BY lane, t.error_type, t.response_status"
        );
    };
}

/// The statements that differ between the engines only in a few words: `$ignore` is how an
/// INSERT skips rows whose key exists, `$empty_blob` an empty binary literal, `$int` a signed
/// integer cast, and `$cut` opens a cut of `j.endpoint` to the length of what follows (the
/// statement closes it as `<x>)) = <x>`), for "the endpoint starts with".
macro_rules! spelled_sql {
    ($ignore:literal, $empty_blob:literal, $int:literal, $cut:literal) => {
        /// Origins of imported jobs; a repeat is ignored.
        pub const INSERT_ORIGINS: &str =
            concat!($ignore, " INTO job_origins (job_id, from_jobdb, imported_at) ");
        /// A confirmed archive batch; a repeat is ignored.
        pub const INSERT_CONFIRMATION: &str = concat!(
            $ignore,
            " INTO archive_confirmations (batch_id, sha256, confirmed_at) VALUES (?, ?, ?)"
        );
        /// A command's result; a repeat is ignored.
        pub const INSERT_COMMAND_RESULT: &str = concat!(
            $ignore,
            " INTO operator_command_results (command_id, applied_at, applied_by, jobs) \
             VALUES (?, ?, ?, ?)"
        );
        /// Jobs without payload and headers.
        pub const SELECT_JOBS_BARE: &str = concat!(
            "SELECT id, bucket, endpoint, method, '{}' AS headers, ",
            $empty_blob,
            " AS payload, execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, \
             created_at, expire_at, idempotency_key FROM jobs WHERE id IN ("
        );
        /// Job summaries (no payload, its size).
        pub const SELECT_JOB_SUMMARIES: &str = concat!(
            "SELECT id, bucket, endpoint, method, '{}' AS headers, ",
            $empty_blob,
            " AS payload, execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, \
             created_at, expire_at, idempotency_key, CAST(LENGTH(payload) AS ",
            $int,
            ") AS payload_bytes FROM jobs WHERE id IN ("
        );
        /// The jobs a command names that wait for an attempt, with their progress.
        pub const COMMAND_TARGETS: &str = concat!(
            "SELECT t.job_id, t.state, t.attempts, t.retry_at \
             FROM operator_commands c \
             JOIN open_jobs t ON (c.job_id IS NULL OR t.job_id = c.job_id) \
             JOIN jobs j ON j.id = t.job_id \
             WHERE c.id = ? \
               AND (c.bucket IS NULL OR j.bucket = c.bucket) \
               AND (c.endpoint_prefix IS NULL OR ",
            $cut,
            "c.endpoint_prefix)) = c.endpoint_prefix) \
               AND (c.created_before IS NULL OR j.created_at < c.created_before) \
               AND t.transition_id < ? \
               AND t.state IN ('awaiting-scheduling', 'awaiting-retry') \
               AND NOT EXISTS (SELECT 1 FROM job_state_transitions l \
                               WHERE l.job_id = t.job_id AND l.id > t.transition_id)"
        );
        /// Ended jobs for replay.
        pub const ENDED_JOBS: &str = concat!(
            "SELECT j.id, j.bucket, j.endpoint, j.method, j.headers, j.payload, \
             j.execution_timeout_ms, j.backoff_min_delay_ms, j.backoff_coefficient, \
             j.created_at, j.expire_at, j.idempotency_key, t.state \
             FROM jobs j JOIN job_state_transitions t ON t.job_id = j.id \
             WHERE j.id > ? \
               AND t.id = (SELECT MAX(l.id) FROM job_state_transitions l WHERE l.job_id = j.id) \
               AND ((? AND t.state = 'discarded') OR (? AND t.state = 'archived')) \
               AND (? IS NULL OR j.bucket = ?) \
               AND (? IS NULL OR ",
            $cut,
            "?)) = ?) \
               AND (? IS NULL OR j.created_at >= ?) \
               AND (? IS NULL OR j.created_at < ?) \
             ORDER BY j.id LIMIT ?"
        );
    };
}

/// MySQL (and MariaDB): the production engine. A JobDB is a database on a server.
pub mod mysql {
    engine_common!(sqlx::MySql, sqlx::mysql::MySqlRow);

    /// This engine's schema migrations.
    pub static MIGRATOR: &sqlx::migrate::Migrator = &crate::jobdb::MIGRATOR;

    /// `_sqlx_migrations.installed_on` (a TIMESTAMP, UTC on the wire).
    pub fn installed_on(row: &DbRow, column: &str) -> Result<Option<DateTime<Utc>>, JobDbError> {
        Ok(row.try_get(column)?)
    }

    /// The fence check: a shared lock on the owner row, so a takeover waits for this commit.
    pub const FENCE_CHECK: &str =
        "SELECT fencing_token FROM jobdb_owner WHERE id = 1 LOCK IN SHARE MODE";

    /// Replaces an existing `open_jobs` row (MariaDB and MySQL both take `VALUES()`).
    pub const UPSERT_OPEN_JOBS: &str = " ON DUPLICATE KEY UPDATE \
         transition_id = VALUES(transition_id), state = VALUES(state), \
         attempts = VALUES(attempts), retry_at = VALUES(retry_at), \
         expire_at = COALESCE(VALUES(expire_at), expire_at)";

    /// MySQL error numbers that refuse the data itself: out of range, bad value, too long,
    /// NULL where not allowed, packet or row too large, truncated, duplicate or constraint.
    fn refused_code(db: &dyn sqlx::error::DatabaseError) -> bool {
        const DATA: [u16; 14] = [
            1048, 1062, 1118, 1153, 1264, 1265, 1292, 1301, 1366, 1367, 1406, 1690, 3819, 4025,
        ];
        db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| {
                DATA.contains(&e.number()) || e.code().is_some_and(|c| c.starts_with("22"))
            })
    }
    spelled_sql!(
        "INSERT IGNORE",
        "CAST('' AS BINARY)",
        "SIGNED",
        "LEFT(j.endpoint, CHAR_LENGTH("
    );
    /// Deletes of a purge, `?` rows each.
    pub const DELETE_CHUNKS: [&str; 2] = [
        "DELETE FROM job_state_transitions LIMIT ?",
        "DELETE FROM jobs LIMIT ?",
    ];
    /// Deletes of a purge's `open_jobs` rows (not counted: they repeat the latest rows).
    pub const DELETE_OPEN_CHUNK: &str = "DELETE FROM open_jobs LIMIT ?";
    /// Rows and bytes of the JobDB's tables (`?` is the database name).
    pub const SIZE: &str = "SELECT CAST(COALESCE(SUM(table_rows), 0) AS UNSIGNED) AS n_rows, \
         CAST(COALESCE(SUM(data_length + index_length), 0) AS UNSIGNED) AS n_bytes \
         FROM information_schema.tables WHERE table_schema = ?";
    stats_sql!(
        lane_mysql!(),
        "CAST(TIMESTAMPDIFF(SECOND, ?, t.time) DIV ? AS SIGNED)",
        "SIGNED",
        "CAST(CASE WHEN t.duration_ms < 64 THEN t.duration_ms \
         ELSE 64 + FLOOR(LOG2(t.duration_ms / 64) * 16) END AS SIGNED)",
        true
    );
}

/// SQLite: the embedded engine. A JobDB is a file.
pub mod sqlite {
    engine_common!(sqlx::Sqlite, sqlx::sqlite::SqliteRow);

    /// This engine's schema migrations.
    pub static MIGRATOR: &sqlx::migrate::Migrator = &crate::jobdb::SQLITE_MIGRATOR;

    /// `_sqlx_migrations.installed_on` (SQLite's `CURRENT_TIMESTAMP` text, UTC).
    pub fn installed_on(row: &DbRow, column: &str) -> Result<Option<DateTime<Utc>>, JobDbError> {
        time_opt(row, column)
    }

    /// The fence check. SQLite has one writer at a time: by this statement the transaction
    /// holds the write lock (its first INSERT took it), so a takeover waits for the commit.
    pub const FENCE_CHECK: &str = "SELECT fencing_token FROM jobdb_owner WHERE id = 1";

    /// Replaces an existing `open_jobs` row.
    pub const UPSERT_OPEN_JOBS: &str = " ON CONFLICT (job_id) DO UPDATE SET \
         transition_id = excluded.transition_id, state = excluded.state, \
         attempts = excluded.attempts, retry_at = excluded.retry_at, \
         expire_at = COALESCE(excluded.expire_at, open_jobs.expire_at)";

    /// SQLite result codes that refuse the data itself: too big, constraint, type mismatch,
    /// parameter out of range (the primary code is the low byte of an extended one).
    fn refused_code(db: &dyn sqlx::error::DatabaseError) -> bool {
        db.code()
            .and_then(|c| c.parse::<u32>().ok())
            .is_some_and(|code| matches!(code & 0xff, 18 | 19 | 20 | 25))
    }
    spelled_sql!(
        "INSERT OR IGNORE",
        "X''",
        "INTEGER",
        "substr(j.endpoint, 1, length("
    );
    /// Deletes of a purge, `?` rows each (SQLite has no DELETE ... LIMIT by default).
    pub const DELETE_CHUNKS: [&str; 2] = [
        "DELETE FROM job_state_transitions WHERE (job_id, id) IN \
         (SELECT job_id, id FROM job_state_transitions LIMIT ?)",
        "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs LIMIT ?)",
    ];
    /// Deletes of a purge's `open_jobs` rows (not counted: they repeat the latest rows).
    pub const DELETE_OPEN_CHUNK: &str =
        "DELETE FROM open_jobs WHERE job_id IN (SELECT job_id FROM open_jobs LIMIT ?)";
    /// Rows of the two big tables and bytes of the file's pages (`?`, the name, is unused
    /// but bound so both engines take the same parameters).
    pub const SIZE: &str = "SELECT ? IS NOT NULL AS named, \
         (SELECT COUNT(*) FROM jobs) + (SELECT COUNT(*) FROM job_state_transitions) AS n_rows, \
         (SELECT page_count FROM pragma_page_count()) \
           * (SELECT page_size FROM pragma_page_size()) AS n_bytes";
    stats_sql!(
        lane_sqlite!(),
        "(CAST(unixepoch(t.time, 'subsec') - unixepoch(?, 'subsec') AS INTEGER) / ?)",
        "INTEGER",
        "t.duration_ms",
        false
    );
}
