//! The JobDB store: every SQL statement spindle runs against a JobDB, one named function each.
//!
//! A JobDB is one MySQL database (schema in `migrations/`). Its owner appends jobs and state
//! transitions in fenced transactions ([`JobDb::append`]); readers trace jobs and count states.
//! Exclusive ownership without Consul comes from [`lock::ServerLock`] (MySQL `GET_LOCK`).
//! [`stats`] holds the dashboard's read queries.

pub mod commands;
pub mod lifecycle;
pub mod lock;
pub mod replay;
pub mod stats;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{ConnectOptions, Connection, Executor, QueryBuilder, Row};

use crate::job::{Job, JobId, Progress, RetryPolicy, State, Transition};

/// The JobDB schema migrations, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Most rows in one multi-row INSERT (MySQL allows 65,535 placeholders per statement).
/// Chunks are powers of two up to this, so a connection prepares at most ten statement shapes
/// per table and reuses them, instead of preparing a new statement for every row count.
const MAX_ROWS_PER_INSERT: usize = 512;
/// Most payload bytes in one multi-row INSERT, well under the default 16 MiB `max_allowed_packet`.
const MAX_BYTES_PER_INSERT: usize = 4 * 1024 * 1024;
/// Most ids in one `IN (...)` lookup.
const MAX_IDS_PER_SELECT: usize = 1000;

/// Errors of the JobDB store.
#[derive(Debug, thiserror::Error)]
pub enum JobDbError {
    /// The JobDB URL is not `mysql://user[:pass]@host[:port]/database`.
    #[error("invalid jobdb url: {0}")]
    InvalidUrl(String),
    /// The server or the connection failed.
    #[error("jobdb query failed")]
    Sql(#[from] sqlx::Error),
    /// The schema could not be brought to this binary's version (or is newer than it).
    #[error("jobdb schema check failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Another owner took the JobDB: this process must stop writing.
    #[error("fenced out: our token is {ours}, the jobdb's is {current}")]
    Fenced {
        /// The token this process holds.
        ours: u64,
        /// The token in the JobDB.
        current: u64,
    },
    /// Another live process holds the JobDB's lock.
    #[error("jobdb {0} is held by another director")]
    Held(String),
    /// A previous owner still has a transaction open on the fence row.
    #[error("a previous owner's transaction is still open")]
    Busy,
    /// A row the JobDB returned breaks an invariant.
    #[error("corrupt jobdb row: {0}")]
    Corrupt(String),
}

impl JobDbError {
    /// Whether retrying the same operation later may succeed (a connection problem), as
    /// opposed to a verdict (fenced, corrupt, invalid).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            JobDbError::Sql(
                sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::WorkerCrashed
                    | sqlx::Error::Protocol(_)
                    | sqlx::Error::Database(_)
            )
        )
    }
}

/// Where a JobDB lives, parsed from its URL.
#[derive(Clone, Debug)]
pub struct JobDbUrl {
    /// The server, without a database.
    pub server: MySqlConnectOptions,
    /// The database name (validated: `[A-Za-z0-9_]{1,48}`).
    pub database: String,
}

impl FromStr for JobDbUrl {
    type Err = JobDbError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut url = url::Url::parse(s).map_err(|e| JobDbError::InvalidUrl(e.to_string()))?;
        if url.scheme() != "mysql" && url.scheme() != "mariadb" {
            return Err(JobDbError::InvalidUrl("scheme must be mysql://".into()));
        }
        let _ = url.set_scheme("mysql");
        let database = url.path().trim_start_matches('/').to_owned();
        if !valid_database_name(&database) {
            return Err(JobDbError::InvalidUrl(format!(
                "database name {database:?} must be 1 to 48 of [A-Za-z0-9_]"
            )));
        }
        url.set_path("");
        let server = MySqlConnectOptions::from_str(url.as_str())
            .map_err(|e| JobDbError::InvalidUrl(e.to_string()))?
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(2));
        Ok(JobDbUrl { server, database })
    }
}

impl JobDbUrl {
    /// Connection options for the database itself.
    pub fn options(&self) -> MySqlConnectOptions {
        self.server.clone().database(&self.database)
    }

    /// The same server with another database name (validated).
    pub fn with_database(&self, database: &str) -> Result<JobDbUrl, JobDbError> {
        if !valid_database_name(database) {
            return Err(JobDbError::InvalidUrl(format!(
                "database name {database:?} must be 1 to 48 of [A-Za-z0-9_]"
            )));
        }
        Ok(JobDbUrl {
            server: self.server.clone(),
            database: database.to_owned(),
        })
    }
}

/// A JobDB URL with any password replaced by `***`, for printing and display.
pub fn redact_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

fn valid_database_name(name: &str) -> bool {
    (1..=48).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Creates the database if it does not exist. The name was validated by [`JobDbUrl`], which is
/// why it may be spliced into the statement (identifiers cannot be bound).
pub async fn create_database(url: &JobDbUrl) -> Result<(), JobDbError> {
    let mut conn = url.server.connect().await?;
    conn.execute(
        format!(
            "CREATE DATABASE IF NOT EXISTS `{}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            url.database
        )
        .as_str(),
    )
    .await?;
    conn.close().await?;
    Ok(())
}

/// Opens and closes one connection to the database: fails at once with the server's or the
/// network's own error (a pool keeps retrying until its timeout, and then says only that).
pub async fn probe(url: &JobDbUrl) -> Result<(), JobDbError> {
    url.options().connect().await?.close().await?;
    Ok(())
}

/// Drops the database (one DROP instead of millions of DELETEs). Name validated by [`JobDbUrl`].
pub async fn drop_database(url: &JobDbUrl) -> Result<(), JobDbError> {
    let mut conn = url.server.connect().await?;
    conn.execute(format!("DROP DATABASE IF EXISTS `{}`", url.database).as_str())
        .await?;
    conn.close().await?;
    Ok(())
}

/// A connection pool to one JobDB whose schema matches this binary.
#[derive(Clone, Debug)]
pub struct JobDb {
    pool: MySqlPool,
    url: JobDbUrl,
}

impl JobDb {
    /// Connects (creating the database if asked), then applies pending migrations and refuses a
    /// schema that is newer than, or differs from, this binary's.
    pub async fn open(
        url: &JobDbUrl,
        create: bool,
        max_connections: u32,
    ) -> Result<Self, JobDbError> {
        if create {
            create_database(url).await?;
        }
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(url.options())
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(JobDb {
            pool,
            url: url.clone(),
        })
    }

    /// Opens a JobDB for reading only (dashboards, replay): no migration is applied, so a
    /// reader of another release never changes the schema under the Directors; the schema must
    /// be at least this binary's (every migration it knows applied), or it is refused.
    pub async fn open_reader(url: &JobDbUrl, max_connections: u32) -> Result<Self, JobDbError> {
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(url.options())
            .await?;
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&pool)
                .await?;
        if let Some(missing) = MIGRATOR.iter().find(|m| !applied.contains(&m.version)) {
            pool.close().await;
            return Err(JobDbError::Corrupt(format!(
                "schema version {} ({}) is not applied: a Director of this release migrates it",
                missing.version, missing.description
            )));
        }
        Ok(JobDb {
            pool,
            url: url.clone(),
        })
    }

    /// Where this JobDB lives.
    pub fn url(&self) -> &JobDbUrl {
        &self.url
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.url.database
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Takes ownership: bumps the fencing token and returns it. From now on every transaction
    /// of an earlier owner fails its fence check.
    pub async fn take_ownership(&self, holder: &str) -> Result<u64, JobDbError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE jobdb_owner SET fencing_token = fencing_token + 1, holder = ?, acquired_at = ? \
             WHERE id = 1",
        )
        .bind(holder)
        .bind(Utc::now().naive_utc())
        .execute(&mut *tx)
        .await?;
        let token: u64 = sqlx::query_scalar("SELECT fencing_token FROM jobdb_owner WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(token)
    }

    /// Ends (`KILL`) the connections of other sessions that have a transaction open in this
    /// JobDB for longer than `older_than`: a stalled previous owner's. Needs the `PROCESS`
    /// and `CONNECTION ADMIN` (or `SUPER`) privileges. Returns how many were ended.
    pub async fn kill_stalled_transactions(&self, older_than: Duration) -> Result<u64, JobDbError> {
        let stalled: Vec<u64> = sqlx::query_scalar(
            "SELECT t.trx_mysql_thread_id FROM information_schema.INNODB_TRX t \
             JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
             WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() \
             AND t.trx_started < NOW() - INTERVAL ? SECOND",
        )
        .bind(older_than.as_secs().max(1))
        .fetch_all(&self.pool)
        .await?;
        for thread in &stalled {
            // A server-given thread id (an integer), not input: KILL takes no placeholder.
            sqlx::raw_sql(&format!("KILL CONNECTION {thread}"))
                .execute(&self.pool)
                .await?;
        }
        Ok(stalled.len() as u64)
    }

    /// Takes ownership with a token from an external lock (a Consul lock key's ModifyIndex):
    /// succeeds only if it is higher than every token the JobDB has seen, so an older holder
    /// can never take it back; [`JobDbError::Fenced`] otherwise. Waits at most `wait` for a
    /// previous owner's transaction in its final round trip ([`JobDbError::Busy`] then).
    pub async fn take_ownership_at(
        &self,
        token: u64,
        holder: &str,
        wait: Duration,
    ) -> Result<u64, JobDbError> {
        // A connection of its own, so the short lock wait does not leak into the pool.
        let mut conn = self.url.options().connect().await?;
        sqlx::query("SET SESSION innodb_lock_wait_timeout = ?")
            .bind(wait.as_secs().max(1))
            .execute(&mut conn)
            .await?;
        let mut tx = conn.begin().await?;
        let updated = sqlx::query(
            "UPDATE jobdb_owner SET fencing_token = ?, holder = ?, acquired_at = ? \
             WHERE id = 1 AND fencing_token < ?",
        )
        .bind(token)
        .bind(holder)
        .bind(Utc::now().naive_utc())
        .bind(token)
        .execute(&mut *tx)
        .await;
        let updated = match updated {
            Ok(done) => done.rows_affected(),
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some("HY000")
                    && e.message().contains("Lock wait timeout") =>
            {
                return Err(JobDbError::Busy);
            }
            Err(e) => return Err(e.into()),
        };
        let current: u64 = sqlx::query_scalar("SELECT fencing_token FROM jobdb_owner WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        conn.close().await?;
        if updated == 1 {
            Ok(token)
        } else {
            Err(JobDbError::Fenced {
                ours: token,
                current,
            })
        }
    }

    /// The current fencing token and holder.
    pub async fn owner(&self) -> Result<(u64, String), JobDbError> {
        let row = sqlx::query("SELECT fencing_token, holder FROM jobdb_owner WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        Ok((row.try_get("fencing_token")?, text(&row, "holder")?))
    }

    /// Appends jobs and transitions in one transaction, checking the fencing token as the
    /// last statement before COMMIT, under a shared lock: a new owner's takeover waits for that
    /// one round trip at most, and once it has happened our check fails and nothing of the
    /// transaction is stored. (Checking first would make a paused owner block its successor
    /// for as long as it stays paused.)
    pub async fn append(
        &self,
        token: u64,
        jobs: &[Arc<Job>],
        transitions: &[(u64, Transition)],
    ) -> Result<(), JobDbError> {
        self.append_with_origins(token, jobs, transitions, &[])
            .await
    }

    /// [`JobDb::append`], also recording where imported jobs came from (`job_origins`).
    pub async fn append_with_origins(
        &self,
        token: u64,
        jobs: &[Arc<Job>],
        transitions: &[(u64, Transition)],
        origins: &[lifecycle::Origin],
    ) -> Result<(), JobDbError> {
        let mut tx = self.pool.begin().await?;
        for chunk in chunks_by_size(jobs, |job| job.payload.len() + job.endpoint.len()) {
            insert_jobs(chunk).build().execute(&mut *tx).await?;
        }
        for chunk in chunks_by_size(transitions, |(_, t)| {
            t.error_response.as_ref().map_or(0, Bytes::len)
        }) {
            insert_transitions(chunk).build().execute(&mut *tx).await?;
        }
        for chunk in origins.chunks(MAX_ROWS_PER_INSERT) {
            lifecycle::insert_origins(chunk)
                .build()
                .execute(&mut *tx)
                .await?;
        }
        commit_fenced(tx, token).await
    }

    /// Whether a transition row exists: tells, after a failed COMMIT, whether it happened.
    pub async fn transition_exists(&self, job_id: JobId, id: u64) -> Result<bool, JobDbError> {
        let found: Option<u64> =
            sqlx::query_scalar("SELECT id FROM job_state_transitions WHERE job_id = ? AND id = ?")
                .bind(&job_id.to_bytes()[..])
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.is_some())
    }

    /// The highest transition id so far (0 for an empty JobDB): new ids continue from it.
    pub async fn max_transition_id(&self) -> Result<u64, JobDbError> {
        let max: Option<u64> = sqlx::query_scalar("SELECT MAX(id) FROM job_state_transitions")
            .fetch_one(&self.pool)
            .await?;
        Ok(max.unwrap_or(0))
    }

    /// Every job whose latest transition is not terminal, with that transition.
    pub async fn load_unfinished(&self) -> Result<Vec<(Job, Progress)>, JobDbError> {
        let rows = sqlx::query(
            "SELECT t.job_id, t.state, t.attempts, t.retry_at \
             FROM job_state_transitions t \
             JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) last \
               ON last.job_id = t.job_id AND last.id = t.id \
             WHERE t.state NOT IN ('succeeded', 'discarded', 'archived', 'moved')",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut progress = HashMap::with_capacity(rows.len());
        for row in rows {
            progress.insert(job_id_of(&row, "job_id")?, progress_of(&row)?);
        }
        self.with_jobs(progress, true).await
    }

    /// Jobs whose latest transition is `executing` or `archiving`, with it: what a new owner
    /// must settle before serving (attempts cut short, expired jobs for the archive). Only
    /// their ids and progress: the jobs themselves come back through [`JobDb::backlog_page`].
    pub async fn load_stranded(&self) -> Result<Vec<(JobId, Progress)>, JobDbError> {
        let rows = sqlx::query(
            "SELECT t.job_id, t.state, t.attempts, t.retry_at \
             FROM job_state_transitions t \
             JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) last \
               ON last.job_id = t.job_id AND last.id = t.id \
             WHERE t.state IN ('executing', 'archiving') \
             ORDER BY t.job_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((job_id_of(row, "job_id")?, progress_of(row)?)))
            .collect()
    }

    /// The next `limit` jobs after `after` (in id order) that wait for an attempt, due by
    /// `due_by` (jobs never tried are always due), without their payloads and headers: the
    /// page a Director's cache reads when it has room. A job is in it when its latest
    /// transition is `awaiting-scheduling`, or `awaiting-retry` with `retry_at <= due_by`, and
    /// that transition's id is below `before_row` (rows written since are the cache's own news).
    pub async fn backlog_page(
        &self,
        after: Option<JobId>,
        due_by: DateTime<Utc>,
        before_row: u64,
        limit: usize,
    ) -> Result<Vec<(Job, Progress)>, JobDbError> {
        let after = after.map_or_else(|| vec![0u8; 16], |id| id.to_bytes().to_vec());
        let rows = sqlx::query(
            "SELECT t.job_id, t.state, t.attempts, t.retry_at \
             FROM job_state_transitions t \
             WHERE t.job_id > ? \
               AND t.id = (SELECT MAX(l.id) FROM job_state_transitions l WHERE l.job_id = t.job_id) \
               AND t.id < ? \
               AND (t.state = 'awaiting-scheduling' \
                    OR (t.state = 'awaiting-retry' AND t.retry_at <= ?)) \
             ORDER BY t.job_id \
             LIMIT ?",
        )
        .bind(after)
        .bind(before_row)
        .bind(due_by.naive_utc())
        .bind(limit as u64)
        .fetch_all(&self.pool)
        .await?;
        let mut progress = HashMap::with_capacity(rows.len());
        for row in &rows {
            progress.insert(job_id_of(row, "job_id")?, progress_of(row)?);
        }
        self.with_jobs(progress, false).await
    }

    /// Pairs each job's progress with the job (without payload and headers unless
    /// `payloads`), in id order; a progress without its job row means a corrupt JobDB.
    async fn with_jobs(
        &self,
        mut progress: HashMap<JobId, Progress>,
        payloads: bool,
    ) -> Result<Vec<(Job, Progress)>, JobDbError> {
        let ids: Vec<JobId> = progress.keys().copied().collect();
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_IDS_PER_SELECT) {
            for job in self.select_jobs(chunk, payloads).await? {
                if let Some(p) = progress.remove(&job.id) {
                    out.push((job, p));
                }
            }
        }
        if let Some(orphan) = progress.keys().next() {
            return Err(JobDbError::Corrupt(format!(
                "transitions without a job row, e.g. {orphan}"
            )));
        }
        out.sort_by_key(|(job, _)| job.id);
        Ok(out)
    }

    /// The jobs with these ids (those that exist).
    pub async fn get_jobs(&self, ids: &[JobId]) -> Result<Vec<Job>, JobDbError> {
        self.select_jobs(ids, true).await
    }

    /// The jobs with these ids; without `payloads`, their payloads and headers are left out
    /// (empty), for a cache that reads them back only when due.
    async fn select_jobs(&self, ids: &[JobId], payloads: bool) -> Result<Vec<Job>, JobDbError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut qb = QueryBuilder::<MySql>::new(if payloads {
            "SELECT id, bucket, endpoint, method, headers, payload, execution_timeout_ms, \
             backoff_min_delay_ms, backoff_coefficient, created_at, expire_at, idempotency_key \
             FROM jobs WHERE id IN ("
        } else {
            "SELECT id, bucket, endpoint, method, '{}' AS headers, CAST('' AS BINARY) AS payload, \
             execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, created_at, \
             expire_at, idempotency_key FROM jobs WHERE id IN ("
        });
        let mut list = qb.separated(", ");
        for id in ids {
            list.push_bind(id.to_bytes().to_vec());
        }
        qb.push(")");
        let rows = qb.build().fetch_all(&self.pool).await?;
        rows.iter().map(job_from_row).collect()
    }

    /// A job's transitions with their ids, oldest first.
    pub async fn get_transitions(&self, id: JobId) -> Result<Vec<(u64, Transition)>, JobDbError> {
        let rows = sqlx::query(
            "SELECT id, job_id, time, retry_at, attempts, state, error_type, error_response, \
             error_response_encoding, response_status, duration_ms \
             FROM job_state_transitions WHERE job_id = ? ORDER BY id",
        )
        .bind(&id.to_bytes()[..])
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(transition_from_row).collect()
    }

    /// How many jobs are in each state now (by their latest transition).
    pub async fn count_by_state(&self) -> Result<HashMap<State, u64>, JobDbError> {
        let rows = sqlx::query(
            "SELECT t.state, COUNT(*) AS n \
             FROM job_state_transitions t \
             JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) last \
               ON last.job_id = t.job_id AND last.id = t.id \
             GROUP BY t.state",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut counts = HashMap::new();
        for row in rows {
            let state = state_of(&row)?;
            let n: i64 = row.try_get("n")?;
            counts.insert(state, u64::try_from(n).unwrap_or(0));
        }
        Ok(counts)
    }

    /// How many transitions into `state` were recorded (a cheap progress probe for benches).
    pub async fn count_transitions_into(&self, state: State) -> Result<u64, JobDbError> {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM job_state_transitions WHERE state = ?")
                .bind(state.as_str())
                .fetch_one(&self.pool)
                .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The MySQL connection id holding this JobDB's `GET_LOCK`, if any (for operators and
    /// fault tests).
    pub async fn lock_connection(&self) -> Result<Option<u64>, JobDbError> {
        let id: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
            .bind(lock::lock_name(&self.url.database))
            .fetch_one(&self.pool)
            .await?;
        Ok(id)
    }

    /// Kills a MySQL connection (`KILL CONNECTION`): how an operator evicts a hung owner.
    pub async fn kill_connection(&self, id: u64) -> Result<(), JobDbError> {
        sqlx::query("KILL CONNECTION ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every transition of every job, ordered by job then id: for audits of small JobDBs
    /// (tests, benches, post-mortems), not for a hot path.
    pub async fn all_transitions(&self) -> Result<Vec<(u64, Transition)>, JobDbError> {
        let rows = sqlx::query(
            "SELECT id, job_id, time, retry_at, attempts, state, error_type, error_response, \
             error_response_encoding, response_status, duration_ms \
             FROM job_state_transitions ORDER BY job_id, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(transition_from_row).collect()
    }

    /// How many job rows the JobDB holds.
    pub async fn count_jobs(&self) -> Result<u64, JobDbError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Checks the fencing token as the last statement of `tx` and commits only if it is ours.
async fn commit_fenced(mut tx: sqlx::Transaction<'_, MySql>, token: u64) -> Result<(), JobDbError> {
    let current: u64 =
        sqlx::query_scalar("SELECT fencing_token FROM jobdb_owner WHERE id = 1 LOCK IN SHARE MODE")
            .fetch_one(&mut *tx)
            .await?;
    if current != token {
        tx.rollback().await?;
        return Err(JobDbError::Fenced {
            ours: token,
            current,
        });
    }
    tx.commit().await?;
    Ok(())
}

/// Splits rows into INSERT-sized chunks: at most [`MAX_BYTES_PER_INSERT`] bytes each, and a
/// power-of-two number of rows up to [`MAX_ROWS_PER_INSERT`] (so statement shapes repeat).
fn chunks_by_size<T>(rows: &[T], bytes_of: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, row) in rows.iter().enumerate() {
        let size = bytes_of(row);
        if i > start && (i - start == MAX_ROWS_PER_INSERT || bytes + size > MAX_BYTES_PER_INSERT) {
            push_pow2(&mut chunks, &rows[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    push_pow2(&mut chunks, &rows[start..]);
    chunks
}

/// Pushes `rows` as chunks whose lengths are powers of two, largest first.
fn push_pow2<'a, T>(chunks: &mut Vec<&'a [T]>, mut rows: &'a [T]) {
    while !rows.is_empty() {
        let take = 1 << rows.len().ilog2();
        chunks.push(&rows[..take]);
        rows = &rows[take..];
    }
}

fn insert_jobs(jobs: &[Arc<Job>]) -> QueryBuilder<'_, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(
        "INSERT INTO jobs (id, bucket, endpoint, method, headers, payload, execution_timeout_ms, \
         backoff_min_delay_ms, backoff_coefficient, created_at, expire_at, idempotency_key) ",
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

fn insert_transitions(rows: &[(u64, Transition)]) -> QueryBuilder<'_, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(
        "INSERT INTO job_state_transitions (id, job_id, time, retry_at, attempts, state, \
         error_type, error_response, error_response_encoding, response_status, duration_ms) ",
    );
    qb.push_values(rows, |mut row, (id, t)| {
        row.push_bind(*id)
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

fn millis_u32(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Headers as the JSON object stored in `jobs.headers`.
fn headers_json(headers: &[(String, String)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// A text column, whatever its collation (sqlx types `_bin` collations as binary).
fn text(row: &MySqlRow, column: &str) -> Result<String, JobDbError> {
    let bytes: Vec<u8> = row.try_get(column)?;
    String::from_utf8(bytes).map_err(|_| JobDbError::Corrupt(format!("{column} is not utf-8")))
}

/// A nullable text column.
fn text_opt(row: &MySqlRow, column: &str) -> Result<Option<String>, JobDbError> {
    let bytes: Option<Vec<u8>> = row.try_get(column)?;
    bytes
        .map(|b| {
            String::from_utf8(b).map_err(|_| JobDbError::Corrupt(format!("{column} is not utf-8")))
        })
        .transpose()
}

fn state_of(row: &MySqlRow) -> Result<State, JobDbError> {
    State::from_str(&text(row, "state")?).map_err(|e| JobDbError::Corrupt(e.to_string()))
}

fn job_id_of(row: &MySqlRow, column: &str) -> Result<JobId, JobDbError> {
    let bytes: Vec<u8> = row.try_get(column)?;
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| JobDbError::Corrupt(format!("{column} is not 16 bytes")))?;
    Ok(JobId::from_bytes(bytes))
}

fn progress_of(row: &MySqlRow) -> Result<Progress, JobDbError> {
    let retry_at: Option<NaiveDateTime> = row.try_get("retry_at")?;
    Ok(Progress {
        state: state_of(row)?,
        attempts: row.try_get("attempts")?,
        retry_at: retry_at.map(|t| t.and_utc()),
    })
}

fn job_from_row(row: &MySqlRow) -> Result<Job, JobDbError> {
    let id = job_id_of(row, "id")?;
    let headers = text(row, "headers")?;
    let headers: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&headers)
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
    let created_at: NaiveDateTime = row.try_get("created_at")?;
    let expire_at: NaiveDateTime = row.try_get("expire_at")?;
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
        created_at: created_at.and_utc(),
        expire_at: expire_at.and_utc(),
        idempotency_key: text_opt(row, "idempotency_key")?,
    })
}

fn transition_from_row(row: &MySqlRow) -> Result<(u64, Transition), JobDbError> {
    let encoding = text_opt(row, "error_response_encoding")?;
    let time: NaiveDateTime = row.try_get("time")?;
    let retry_at: Option<NaiveDateTime> = row.try_get("retry_at")?;
    let error_response: Option<Vec<u8>> = row.try_get("error_response")?;
    Ok((
        row.try_get("id")?,
        Transition {
            job_id: job_id_of(row, "job_id")?,
            state: state_of(row)?,
            attempts: row.try_get("attempts")?,
            time: time.and_utc(),
            retry_at: retry_at.map(|t| t.and_utc()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_validated() {
        let url: JobDbUrl = "mysql://root@127.0.0.1:3306/spindle_x1".parse().unwrap();
        assert_eq!(url.database, "spindle_x1");
        assert!("mysql://root@127.0.0.1:3306/".parse::<JobDbUrl>().is_err());
        assert!("mysql://root@127.0.0.1:3306/a;drop"
            .parse::<JobDbUrl>()
            .is_err());
        assert!("postgres://root@127.0.0.1/x".parse::<JobDbUrl>().is_err());
        assert!(url.with_database("a`b").is_err());
        assert_eq!(url.with_database("other").unwrap().database, "other");
    }

    #[test]
    fn chunks_respect_rows_and_bytes() {
        let rows: Vec<usize> = vec![1; 1100];
        let chunks = chunks_by_size(&rows, |r| *r);
        assert_eq!(
            chunks.iter().map(|c| c.len()).collect::<Vec<_>>(),
            vec![512, 512, 64, 8, 4]
        );
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), 1100);
        let big: Vec<usize> = vec![3 * 1024 * 1024; 3];
        assert_eq!(chunks_by_size(&big, |r| *r).len(), 3);
        let empty: Vec<usize> = vec![];
        assert!(chunks_by_size(&empty, |r| *r).is_empty());
    }
}
