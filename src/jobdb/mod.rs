//! The JobDB store: every SQL statement spindle runs against a JobDB, one named function each.
//!
//! A JobDB is one MySQL database (schema in `migrations/`) or, embedded, one SQLite file
//! (schema in `migrations/sqlite/`): [`JobDbUrl`] says which, and [`JobDb`] is the same store
//! over either. Its owner appends jobs and state transitions in fenced transactions
//! ([`JobDb::append`]); readers trace jobs and count states. Exclusive ownership without Consul
//! comes from [`lock::ServerLock`] (MySQL `GET_LOCK`, or a file lock beside a SQLite JobDB).
//! [`stats`] holds the dashboard's read queries; [`dialect`] the statements the two engines
//! spell differently.

pub mod commands;
pub mod dialect;
pub mod lifecycle;
pub mod lock;
pub mod replay;
pub mod stats;

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Executor, Row};

use crate::job::{Job, JobId, Progress, State, Transition};

/// The MySQL JobDB schema migrations, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
/// The SQLite JobDB schema migrations (same versions, SQLite's types).
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Most rows in one multi-row INSERT (MySQL allows 65,535 placeholders per statement, SQLite
/// 32,766). Chunks are powers of two up to this, so a connection prepares at most ten
/// statement shapes per table and reuses them, instead of a new statement per row count.
const MAX_ROWS_PER_INSERT: usize = 512;
/// Most payload bytes in one multi-row INSERT, well under the default 16 MiB `max_allowed_packet`.
const MAX_BYTES_PER_INSERT: usize = 4 * 1024 * 1024;
/// Most ids in one `IN (...)` lookup.
const MAX_IDS_PER_SELECT: usize = 1000;
/// The file name suffix of a SQLite JobDB.
pub const SQLITE_SUFFIX: &str = ".sqlite3";

/// Runs `$body` against the JobDB's pool `$p`, with `$q` naming the engine's
/// [`dialect`] module: one body, compiled once per engine.
macro_rules! with_pool {
    ($db:expr, |$p:ident, $q:ident| $body:expr) => {
        match &$db.pool {
            $crate::jobdb::Pool::MySql($p) => {
                #[allow(unused_imports)]
                use $crate::jobdb::dialect::mysql as $q;
                $body
            }
            $crate::jobdb::Pool::Sqlite($p) => {
                #[allow(unused_imports)]
                use $crate::jobdb::dialect::sqlite as $q;
                $body
            }
        }
    };
}
pub(crate) use with_pool;

/// Errors of the JobDB store.
#[derive(Debug, thiserror::Error)]
pub enum JobDbError {
    /// The JobDB URL is not `mysql://user[:pass]@host[:port]/database` or
    /// `sqlite://[/]dir/database`.
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
    /// The operation exists for the other engine only (e.g. MySQL connection ids).
    #[error("{0} is not supported by this jobdb engine")]
    Unsupported(&'static str),
    /// A SQLite JobDB's file or directory could not be used.
    #[error("jobdb file {path}")]
    File {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
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

/// The server a JobDB lives on: a MySQL server, or a directory of SQLite files.
#[derive(Clone, Debug)]
pub enum Server {
    /// A MySQL (MariaDB) server, without a database.
    MySql(Box<MySqlConnectOptions>),
    /// A directory holding one `<database>.sqlite3` file per JobDB.
    Sqlite(PathBuf),
}

/// Where a JobDB lives, parsed from its URL: `mysql://user[:pass]@host[:port]/database`, or
/// `sqlite:///abs/dir/database` / `sqlite://rel/dir/database` for the file
/// `dir/database.sqlite3`.
#[derive(Clone, Debug)]
pub struct JobDbUrl {
    /// The server (or directory).
    pub server: Server,
    /// The database name (validated: `[A-Za-z0-9_]{1,48}`).
    pub database: String,
}

impl FromStr for JobDbUrl {
    type Err = JobDbError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s
            .strip_prefix("sqlite://")
            .or_else(|| s.strip_prefix("sqlite:"))
        {
            if path.ends_with('/') {
                return Err(JobDbError::InvalidUrl(
                    "a sqlite url ends with the database name: sqlite:///dir/name".into(),
                ));
            }
            let path = PathBuf::from(path);
            let database = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            check_database_name(&database)?;
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
                _ => PathBuf::from("."),
            };
            return Ok(JobDbUrl {
                server: Server::Sqlite(dir),
                database,
            });
        }
        let mut url = url::Url::parse(s).map_err(|e| JobDbError::InvalidUrl(e.to_string()))?;
        if url.scheme() != "mysql" && url.scheme() != "mariadb" {
            return Err(JobDbError::InvalidUrl(
                "scheme must be mysql:// or sqlite://".into(),
            ));
        }
        let _ = url.set_scheme("mysql");
        let database = url.path().trim_start_matches('/').to_owned();
        check_database_name(&database)?;
        url.set_path("");
        let server = MySqlConnectOptions::from_str(url.as_str())
            .map_err(|e| JobDbError::InvalidUrl(e.to_string()))?
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(2));
        Ok(JobDbUrl {
            server: Server::MySql(Box::new(server)),
            database,
        })
    }
}

impl JobDbUrl {
    /// The same server with another database name (validated).
    pub fn with_database(&self, database: &str) -> Result<JobDbUrl, JobDbError> {
        check_database_name(database)?;
        Ok(JobDbUrl {
            server: self.server.clone(),
            database: database.to_owned(),
        })
    }

    /// Whether this JobDB is a SQLite file.
    pub fn is_sqlite(&self) -> bool {
        matches!(self.server, Server::Sqlite(_))
    }

    /// Connection options for a MySQL JobDB's database; [`JobDbError::Unsupported`] for SQLite.
    pub fn mysql_options(&self) -> Result<MySqlConnectOptions, JobDbError> {
        match &self.server {
            Server::MySql(server) => Ok((**server).clone().database(&self.database)),
            Server::Sqlite(_) => Err(JobDbError::Unsupported("a MySQL connection")),
        }
    }

    /// The file of a SQLite JobDB (`None` for MySQL).
    pub fn sqlite_file(&self) -> Option<PathBuf> {
        match &self.server {
            Server::Sqlite(dir) => Some(dir.join(format!("{}{SQLITE_SUFFIX}", self.database))),
            Server::MySql(_) => None,
        }
    }

    /// Connection options for a SQLite JobDB: WAL (readers never block the writer),
    /// `synchronous = FULL` (a commit is on disk before a job is acknowledged), and a busy
    /// timeout for the one-writer-at-a-time lock.
    fn sqlite_options(&self, create: bool) -> Option<SqliteConnectOptions> {
        self.sqlite_file().map(|file| {
            SqliteConnectOptions::new()
                .filename(file)
                .create_if_missing(create)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .foreign_keys(false)
                .busy_timeout(Duration::from_secs(10))
                .log_statements(tracing::log::LevelFilter::Trace)
                .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(2))
        })
    }

    /// The URL of a database named `name` on a server given by its URL without a database
    /// (`mysql://user@host:3306`, or a directory `sqlite:///var/lib/spindle`).
    pub fn on_server(server: &str, name: &str) -> Result<(String, JobDbUrl), JobDbError> {
        let text = if server.starts_with("sqlite:") {
            format!("{}/{name}", server.trim_end_matches('/'))
        } else {
            let mut url =
                url::Url::parse(server).map_err(|e| JobDbError::InvalidUrl(e.to_string()))?;
            url.set_path(&format!("/{name}"));
            url.to_string()
        };
        let parsed = text.parse()?;
        Ok((text, parsed))
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

fn check_database_name(name: &str) -> Result<(), JobDbError> {
    if valid_database_name(name) {
        Ok(())
    } else {
        Err(JobDbError::InvalidUrl(format!(
            "database name {name:?} must be 1 to 48 of [A-Za-z0-9_]"
        )))
    }
}

fn file_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> JobDbError + '_ {
    move |source| JobDbError::File {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates the database if it does not exist (for SQLite: its directory and file). The name
/// was validated by [`JobDbUrl`], which is why it may be spliced into the statement
/// (identifiers cannot be bound).
pub async fn create_database(url: &JobDbUrl) -> Result<(), JobDbError> {
    match &url.server {
        Server::MySql(server) => {
            let mut conn = server.connect().await?;
            conn.execute(
                format!(
                    "CREATE DATABASE IF NOT EXISTS `{}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                    url.database
                )
                .as_str(),
            )
            .await?;
            conn.close().await?;
        }
        Server::Sqlite(dir) => {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(file_error(dir))?;
            if let Some(options) = url.sqlite_options(true) {
                options.connect().await?.close().await?;
            }
        }
    }
    Ok(())
}

/// Opens and closes one connection to the database: fails at once with the server's or the
/// network's own error (a pool keeps retrying until its timeout, and then says only that).
/// A SQLite JobDB must exist.
pub async fn probe(url: &JobDbUrl) -> Result<(), JobDbError> {
    match url.sqlite_options(false) {
        Some(options) => options.connect().await?.close().await?,
        None => url.mysql_options()?.connect().await?.close().await?,
    }
    Ok(())
}

/// Drops the database (one DROP instead of millions of DELETEs; for SQLite, deletes the file
/// and its WAL). Name validated by [`JobDbUrl`].
pub async fn drop_database(url: &JobDbUrl) -> Result<(), JobDbError> {
    match &url.server {
        Server::MySql(server) => {
            let mut conn = server.connect().await?;
            conn.execute(format!("DROP DATABASE IF EXISTS `{}`", url.database).as_str())
                .await?;
            conn.close().await?;
        }
        Server::Sqlite(_) => {
            let Some(file) = url.sqlite_file() else {
                return Ok(());
            };
            // The lock file too: a JobDB is dropped only when nobody may hold it any more.
            let lock = file.with_file_name(format!("{}.lock", url.database));
            for path in ["", "-wal", "-shm"]
                .into_iter()
                .map(|suffix| {
                    let mut path = file.clone().into_os_string();
                    path.push(suffix);
                    PathBuf::from(path)
                })
                .chain([lock])
            {
                match tokio::fs::remove_file(&path).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(file_error(&path)(e)),
                }
            }
        }
    }
    Ok(())
}

/// A connection pool of either engine.
#[derive(Clone, Debug)]
pub(crate) enum Pool {
    /// A MySQL JobDB.
    MySql(MySqlPool),
    /// A SQLite JobDB.
    Sqlite(SqlitePool),
}

/// A connection pool to one JobDB whose schema matches this binary.
#[derive(Clone, Debug)]
pub struct JobDb {
    pool: Pool,
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
        let db = Self::connect(url, max_connections).await?;
        let migrated = match &db.pool {
            Pool::MySql(pool) => MIGRATOR.run(pool).await,
            Pool::Sqlite(pool) => SQLITE_MIGRATOR.run(pool).await,
        };
        if let Err(e) = migrated {
            db.close().await;
            return Err(e.into());
        }
        Ok(db)
    }

    async fn connect(url: &JobDbUrl, max_connections: u32) -> Result<Self, JobDbError> {
        let pool = match url.sqlite_options(false) {
            Some(options) => Pool::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(max_connections)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(options)
                    .await?,
            ),
            None => Pool::MySql(
                MySqlPoolOptions::new()
                    .max_connections(max_connections)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(url.mysql_options()?)
                    .await?,
            ),
        };
        Ok(JobDb {
            pool,
            url: url.clone(),
        })
    }

    /// Opens a JobDB for reading only (dashboards, replay): no migration is applied, so a
    /// reader of another release never changes the schema under the Directors; the schema must
    /// be at least this binary's (every migration it knows applied), or it is refused.
    pub async fn open_reader(url: &JobDbUrl, max_connections: u32) -> Result<Self, JobDbError> {
        let db = Self::connect(url, max_connections).await?;
        let (applied, migrator) = with_pool!(db, |p, q| {
            let applied: Result<Vec<i64>, _> =
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                    .fetch_all(p)
                    .await;
            (applied, q::MIGRATOR)
        });
        let applied = match applied {
            Ok(applied) => applied,
            Err(e) => {
                db.close().await;
                return Err(e.into());
            }
        };
        if let Some(missing) = migrator.iter().find(|m| !applied.contains(&m.version)) {
            db.close().await;
            return Err(JobDbError::Corrupt(format!(
                "schema version {} ({}) is not applied: a Director of this release migrates it",
                missing.version, missing.description
            )));
        }
        Ok(db)
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
        match &self.pool {
            Pool::MySql(p) => p.close().await,
            Pool::Sqlite(p) => p.close().await,
        }
    }

    /// Takes ownership: bumps the fencing token and returns it. From now on every transaction
    /// of an earlier owner fails its fence check.
    pub async fn take_ownership(&self, holder: &str) -> Result<u64, JobDbError> {
        with_pool!(self, |p, q| {
            let mut tx = p.begin().await?;
            sqlx::query(
                "UPDATE jobdb_owner SET fencing_token = fencing_token + 1, holder = ?, \
                 acquired_at = ? WHERE id = 1",
            )
            .bind(holder)
            .bind(Utc::now().naive_utc())
            .execute(&mut *tx)
            .await?;
            let token: u64 =
                sqlx::query_scalar("SELECT fencing_token FROM jobdb_owner WHERE id = 1")
                    .fetch_one(&mut *tx)
                    .await?;
            tx.commit().await?;
            Ok(token)
        })
    }

    /// Ends (`KILL`) the connections of other sessions that have a transaction open in this
    /// JobDB for longer than `older_than`: a stalled previous owner's. Needs the `PROCESS`
    /// and `CONNECTION ADMIN` (or `SUPER`) privileges. Returns how many were ended. SQLite:
    /// nothing to end (a stalled writer's lock is waited for by the busy timeout), 0.
    pub async fn kill_stalled_transactions(&self, older_than: Duration) -> Result<u64, JobDbError> {
        let Pool::MySql(pool) = &self.pool else {
            return Ok(0);
        };
        let stalled: Vec<u64> = sqlx::query_scalar(
            "SELECT t.trx_mysql_thread_id FROM information_schema.INNODB_TRX t \
             JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
             WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() \
             AND t.trx_started < NOW() - INTERVAL ? SECOND",
        )
        .bind(older_than.as_secs().max(1))
        .fetch_all(pool)
        .await?;
        for thread in &stalled {
            // A server-given thread id (an integer), not input: KILL takes no placeholder.
            sqlx::raw_sql(&format!("KILL CONNECTION {thread}"))
                .execute(pool)
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
        const UPDATE: &str = "UPDATE jobdb_owner SET fencing_token = ?, holder = ?, \
                              acquired_at = ? WHERE id = 1 AND fencing_token < ?";
        const CURRENT: &str = "SELECT fencing_token FROM jobdb_owner WHERE id = 1";
        // The same transaction on either engine's connection; `$busy` tells the engine's "a
        // previous owner still holds the row" from other errors.
        macro_rules! take_over {
            ($conn:ident, $busy:expr) => {{
                let mut tx = $conn.begin().await?;
                let updated = match sqlx::query(UPDATE)
                    .bind(int(token))
                    .bind(holder)
                    .bind(Utc::now().naive_utc())
                    .bind(int(token))
                    .execute(&mut *tx)
                    .await
                {
                    Ok(done) => done.rows_affected(),
                    Err(sqlx::Error::Database(e)) if $busy(&*e) => return Err(JobDbError::Busy),
                    Err(e) => return Err(e.into()),
                };
                let current: u64 = sqlx::query_scalar(CURRENT).fetch_one(&mut *tx).await?;
                tx.commit().await?;
                $conn.close().await?;
                (updated, current)
            }};
        }
        // A connection of its own, so the short lock wait does not leak into the pool.
        let (updated, current) = match self.url.sqlite_options(false) {
            Some(options) => {
                let mut conn = options
                    .busy_timeout(wait.max(Duration::from_millis(1)))
                    .connect()
                    .await?;
                take_over!(conn, |e: &dyn sqlx::error::DatabaseError| e
                    .message()
                    .contains("locked"))
            }
            None => {
                let mut conn = self.url.mysql_options()?.connect().await?;
                sqlx::query("SET SESSION innodb_lock_wait_timeout = ?")
                    .bind(wait.as_secs().max(1))
                    .execute(&mut conn)
                    .await?;
                take_over!(conn, |e: &dyn sqlx::error::DatabaseError| e
                    .code()
                    .as_deref()
                    == Some("HY000")
                    && e.message().contains("Lock wait timeout"))
            }
        };
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
        with_pool!(self, |p, q| {
            let row = sqlx::query("SELECT fencing_token, holder FROM jobdb_owner WHERE id = 1")
                .fetch_one(p)
                .await?;
            Ok((row.try_get("fencing_token")?, q::text(&row, "holder")?))
        })
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
        with_pool!(self, |p, q| {
            let mut tx = p.begin().await?;
            for chunk in chunks_by_size(jobs, |job| job.payload.len() + job.endpoint.len()) {
                q::insert_jobs(chunk).build().execute(&mut *tx).await?;
            }
            for chunk in chunks_by_size(transitions, |(_, t)| {
                t.error_response.as_ref().map_or(0, Bytes::len)
            }) {
                q::insert_transitions(chunk)
                    .build()
                    .execute(&mut *tx)
                    .await?;
            }
            for chunk in origins.chunks(MAX_ROWS_PER_INSERT) {
                q::insert_origins(chunk).build().execute(&mut *tx).await?;
            }
            q::commit_fenced(tx, token).await
        })
    }

    /// Whether a transition row exists: tells, after a failed COMMIT, whether it happened.
    pub async fn transition_exists(&self, job_id: JobId, id: u64) -> Result<bool, JobDbError> {
        let found: Option<u64> = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT id FROM job_state_transitions WHERE job_id = ? AND id = ?")
                .bind(&job_id.to_bytes()[..])
                .bind(int(id))
                .fetch_optional(p)
                .await?
        });
        Ok(found.is_some())
    }

    /// The highest transition id so far (0 for an empty JobDB): new ids continue from it.
    pub async fn max_transition_id(&self) -> Result<u64, JobDbError> {
        let max: Option<u64> = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT MAX(id) FROM job_state_transitions")
                .fetch_one(p)
                .await?
        });
        Ok(max.unwrap_or(0))
    }

    /// Every job whose latest transition is not terminal, with that transition.
    pub async fn load_unfinished(&self) -> Result<Vec<(Job, Progress)>, JobDbError> {
        let progress: HashMap<JobId, Progress> = with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT t.job_id, t.state, t.attempts, t.retry_at \
                 FROM job_state_transitions t \
                 JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) \
                   last ON last.job_id = t.job_id AND last.id = t.id \
                 WHERE t.state NOT IN ('succeeded', 'discarded', 'archived', 'moved')",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(|row| Ok((q::job_id_of(row, "job_id")?, q::progress_of(row)?)))
            .collect::<Result<_, JobDbError>>()?
        });
        self.with_jobs(progress, true).await
    }

    /// Jobs whose latest transition is `executing` or `archiving`, with it: what a new owner
    /// must settle before serving (attempts cut short, expired jobs for the archive). Only
    /// their ids and progress: the jobs themselves come back through [`JobDb::backlog_page`].
    pub async fn load_stranded(&self) -> Result<Vec<(JobId, Progress)>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT t.job_id, t.state, t.attempts, t.retry_at \
                 FROM job_state_transitions t \
                 JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) \
                   last ON last.job_id = t.job_id AND last.id = t.id \
                 WHERE t.state IN ('executing', 'archiving') \
                 ORDER BY t.job_id",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(|row| Ok((q::job_id_of(row, "job_id")?, q::progress_of(row)?)))
            .collect()
        })
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
        let progress: HashMap<JobId, Progress> = with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT t.job_id, t.state, t.attempts, t.retry_at \
                 FROM job_state_transitions t \
                 WHERE t.job_id > ? \
                   AND t.id = (SELECT MAX(l.id) FROM job_state_transitions l \
                               WHERE l.job_id = t.job_id) \
                   AND t.id < ? \
                   AND (t.state = 'awaiting-scheduling' \
                        OR (t.state = 'awaiting-retry' AND t.retry_at <= ?)) \
                 ORDER BY t.job_id \
                 LIMIT ?",
            )
            .bind(after)
            .bind(int(before_row))
            .bind(due_by.naive_utc())
            .bind(limit as i64)
            .fetch_all(p)
            .await?
            .iter()
            .map(|row| Ok((q::job_id_of(row, "job_id")?, q::progress_of(row)?)))
            .collect::<Result<_, JobDbError>>()?
        });
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
        with_pool!(self, |p, q| {
            let prefix = if payloads {
                "SELECT id, bucket, endpoint, method, headers, payload, execution_timeout_ms, \
                 backoff_min_delay_ms, backoff_coefficient, created_at, expire_at, \
                 idempotency_key FROM jobs WHERE id IN ("
            } else {
                q::SELECT_JOBS_BARE
            };
            q::ids_query(prefix, ids, ")")
                .build()
                .fetch_all(p)
                .await?
                .iter()
                .map(q::job_from_row)
                .collect()
        })
    }

    /// A job's transitions with their ids, oldest first.
    pub async fn get_transitions(&self, id: JobId) -> Result<Vec<(u64, Transition)>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT id, job_id, time, retry_at, attempts, state, error_type, error_response, \
                 error_response_encoding, response_status, duration_ms \
                 FROM job_state_transitions WHERE job_id = ? ORDER BY id",
            )
            .bind(&id.to_bytes()[..])
            .fetch_all(p)
            .await?
            .iter()
            .map(q::transition_from_row)
            .collect()
        })
    }

    /// How many jobs are in each state now (by their latest transition).
    pub async fn count_by_state(&self) -> Result<HashMap<State, u64>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT t.state, COUNT(*) AS n \
                 FROM job_state_transitions t \
                 JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) \
                   last ON last.job_id = t.job_id AND last.id = t.id \
                 GROUP BY t.state",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(|row| Ok((q::state_of(row)?, q::count_of(row, "n")?)))
            .collect()
        })
    }

    /// How many transitions into `state` were recorded (a cheap progress probe for benches).
    pub async fn count_transitions_into(&self, state: State) -> Result<u64, JobDbError> {
        let n: i64 = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT COUNT(*) FROM job_state_transitions WHERE state = ?")
                .bind(state.as_str())
                .fetch_one(p)
                .await?
        });
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The MySQL connection id holding this JobDB's `GET_LOCK`, if any (for operators and
    /// fault tests); [`JobDbError::Unsupported`] on SQLite.
    pub async fn lock_connection(&self) -> Result<Option<u64>, JobDbError> {
        let Pool::MySql(pool) = &self.pool else {
            return Err(JobDbError::Unsupported("a lock connection"));
        };
        let id: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
            .bind(lock::lock_name(&self.url.database))
            .fetch_one(pool)
            .await?;
        Ok(id)
    }

    /// Kills a MySQL connection (`KILL CONNECTION`): how an operator evicts a hung owner.
    pub async fn kill_connection(&self, id: u64) -> Result<(), JobDbError> {
        let Pool::MySql(pool) = &self.pool else {
            return Err(JobDbError::Unsupported("KILL CONNECTION"));
        };
        sqlx::query("KILL CONNECTION ?")
            .bind(id)
            .execute(pool)
            .await?;
        Ok(())
    }

    /// Every transition of every job, ordered by job then id: for audits of small JobDBs
    /// (tests, benches, post-mortems), not for a hot path.
    pub async fn all_transitions(&self) -> Result<Vec<(u64, Transition)>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT id, job_id, time, retry_at, attempts, state, error_type, error_response, \
                 error_response_encoding, response_status, duration_ms \
                 FROM job_state_transitions ORDER BY job_id, id",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(q::transition_from_row)
            .collect()
        })
    }

    /// How many job rows the JobDB holds.
    pub async fn count_jobs(&self) -> Result<u64, JobDbError> {
        let n: i64 = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
                .fetch_one(p)
                .await?
        });
        Ok(u64::try_from(n).unwrap_or(0))
    }
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

/// A `u64` as the `i64` SQLite binds (MySQL takes either): ids, tokens and counts stay far
/// below 2^63.
pub(crate) fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis_u32(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Headers as the JSON object stored in `jobs.headers`.
pub(crate) fn headers_json(headers: &[(String, String)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::Value::Object(map).to_string()
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
        assert!(!url.is_sqlite());

        let abs: JobDbUrl = "sqlite:///var/lib/spindle/jobdb_01".parse().unwrap();
        assert_eq!(abs.database, "jobdb_01");
        assert_eq!(
            abs.sqlite_file().unwrap(),
            PathBuf::from("/var/lib/spindle/jobdb_01.sqlite3")
        );
        let rel: JobDbUrl = "sqlite://data/j1".parse().unwrap();
        assert_eq!(rel.sqlite_file().unwrap(), PathBuf::from("data/j1.sqlite3"));
        let bare: JobDbUrl = "sqlite:j2".parse().unwrap();
        assert_eq!(bare.sqlite_file().unwrap(), PathBuf::from("./j2.sqlite3"));
        assert!("sqlite:///tmp/a;b".parse::<JobDbUrl>().is_err());
        assert!("sqlite:///tmp/".parse::<JobDbUrl>().is_err());
        assert!(abs.mysql_options().is_err());
        let (text, on) = JobDbUrl::on_server("sqlite:///data/", "jobdb_02").unwrap();
        assert_eq!(text, "sqlite:///data/jobdb_02");
        assert_eq!(
            on.sqlite_file().unwrap(),
            PathBuf::from("/data/jobdb_02.sqlite3")
        );
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
