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
pub mod writes;

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
pub(crate) const MAX_ROWS_PER_INSERT: usize = 512;
/// Most bytes in one multi-row INSERT (every column counted), and at most half the server's
/// `max_allowed_packet`: a statement and its bound values travel as one packet.
const MAX_BYTES_PER_INSERT: usize = 4 * 1024 * 1024;
/// Room a statement needs besides its rows' bytes (text, per-value framing), per row and in all.
const ROW_OVERHEAD_BYTES: usize = 128;
/// The packet limit assumed for SQLite (which has none below its 1 GB value limit), so one
/// row is refused on both engines at the same size.
const SQLITE_MAX_PACKET: usize = 64 * 1024 * 1024;
/// Most ids in one `IN (...)` lookup.
pub(crate) const MAX_IDS_PER_SELECT: usize = 1000;
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
    /// The server refused the data of a write (a value out of range, a row larger than the
    /// server accepts, a duplicate key): nothing was stored, and sending the same rows again
    /// will be refused again.
    #[error("the jobdb refused the write: {0}")]
    Refused(String),
    /// The COMMIT was sent but its answer was lost: the transaction may or may not have
    /// committed. Only reading the JobDB tells.
    #[error("the commit's outcome is unknown")]
    CommitUnknown(#[source] sqlx::Error),
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
            JobDbError::CommitUnknown(_)
                | JobDbError::Sql(
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

/// The server a JobDB lives on: a MySQL server, or a directory of SQLite files. Its `Debug`
/// never shows the MySQL password.
#[derive(Clone)]
pub enum Server {
    /// A MySQL (MariaDB) server, without a database.
    MySql(Box<MySqlConnectOptions>),
    /// A directory holding one `<database>.sqlite3` file per JobDB.
    Sqlite(PathBuf),
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Server::MySql(options) => write!(
                f,
                "MySql(mysql://{}@{}:{})",
                options.get_username(),
                options.get_host(),
                options.get_port()
            ),
            Server::Sqlite(dir) => f.debug_tuple("Sqlite").field(dir).finish(),
        }
    }
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

/// Databases on `server` whose name matches a `LIKE` pattern (`%`, `_`, and `\` escaping
/// either): schemas of a MySQL server (read without opening any of them, so nothing is
/// migrated), or the JobDB files of a SQLite directory.
pub async fn databases_like(server: &Server, pattern: &str) -> Result<Vec<String>, JobDbError> {
    match server {
        Server::MySql(options) => {
            let mut conn = options.connect().await?;
            let rows = sqlx::query(
                "SELECT schema_name AS name FROM information_schema.schemata \
                 WHERE schema_name LIKE ?",
            )
            .bind(pattern)
            .fetch_all(&mut conn)
            .await?;
            conn.close().await?;
            rows.iter()
                .map(|r| dialect::mysql::text(r, "name"))
                .collect()
        }
        Server::Sqlite(dir) => {
            let mut names = Vec::new();
            let mut entries = tokio::fs::read_dir(dir).await.map_err(file_error(dir))?;
            while let Some(entry) = entries.next_entry().await.map_err(file_error(dir))? {
                let file = entry.file_name();
                let Some(name) = file.to_str().and_then(|f| f.strip_suffix(SQLITE_SUFFIX)) else {
                    continue;
                };
                if lifecycle::like(pattern.as_bytes(), name.as_bytes()) {
                    names.push(name.to_owned());
                }
            }
            names.sort();
            Ok(names)
        }
    }
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
    /// The largest packet the server accepts (`max_allowed_packet`), read at connect: no
    /// statement may be larger.
    max_packet: usize,
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
        let max_packet = match &pool {
            Pool::MySql(p) => {
                let packet: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
                    .fetch_one(p)
                    .await?;
                usize::try_from(packet).unwrap_or(usize::MAX)
            }
            Pool::Sqlite(_) => SQLITE_MAX_PACKET,
        };
        Ok(JobDb {
            pool,
            url: url.clone(),
            max_packet,
        })
    }

    /// The largest row (in [`job_row_bytes`] / [`transition_row_bytes`]) this JobDB can store:
    /// a bigger one is refused whatever else is in its batch.
    pub fn max_row_bytes(&self) -> usize {
        self.max_packet.saturating_sub(64 * 1024)
    }

    /// Most bytes of rows in one INSERT statement on this JobDB.
    pub(crate) fn max_statement_bytes(&self) -> usize {
        MAX_BYTES_PER_INSERT.min(self.max_packet / 2)
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

    /// [`JobDb::append`], also recording where imported jobs came from (`job_origins`), and
    /// keeping `open_jobs` (each unfinished job's latest state) in step in the same
    /// transaction.
    ///
    /// What a failure means for the caller: [`JobDbError::Fenced`], another owner holds the
    /// JobDB; [`JobDbError::Refused`], the server (or the size check before sending) refused
    /// the data, nothing was stored and the same rows will be refused again;
    /// [`JobDbError::CommitUnknown`], the COMMIT's answer was lost; any other error happened
    /// before the COMMIT was sent, so nothing was stored and trying again may succeed.
    pub async fn append_with_origins(
        &self,
        token: u64,
        jobs: &[Arc<Job>],
        transitions: &[(u64, Transition)],
        origins: &[lifecycle::Origin],
    ) -> Result<(), JobDbError> {
        let max_row = self.max_row_bytes();
        if let Some(job) = jobs.iter().find(|job| job_row_bytes(job) > max_row) {
            return Err(JobDbError::Refused(format!(
                "job {} takes {} bytes; this jobdb's server accepts rows of at most {max_row} \
                 (max_allowed_packet)",
                job.id,
                job_row_bytes(job)
            )));
        }
        if let Some((_, t)) = transitions
            .iter()
            .find(|(_, t)| transition_row_bytes(t) > max_row)
        {
            return Err(JobDbError::Refused(format!(
                "a transition of job {} takes {} bytes; this jobdb's server accepts rows of at \
                 most {max_row} (max_allowed_packet)",
                t.job_id,
                transition_row_bytes(t)
            )));
        }
        let limit = self.max_statement_bytes();
        with_pool!(self, |p, q| {
            let written: Result<(), JobDbError> = async {
                let mut tx = p.begin().await?;
                q::write_rows(&mut tx, jobs, transitions, origins, limit).await?;
                q::commit_fenced(tx, token).await
            }
            .await;
            written.map_err(|e| match e {
                JobDbError::Sql(sql) => match q::refusal(&sql) {
                    Some(why) => JobDbError::Refused(why),
                    None => JobDbError::Sql(sql),
                },
                other => other,
            })
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

    /// Every job whose latest transition is not terminal, with that transition (from
    /// `open_jobs` and the attempt under way it may not show: as many rows as unfinished jobs,
    /// whatever the history's length).
    pub async fn load_unfinished(&self) -> Result<Vec<(Job, Progress)>, JobDbError> {
        let progress: HashMap<JobId, Progress> = with_pool!(self, |p, q| {
            sqlx::query(OPEN_JOBS_AS_THEY_ARE)
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
    /// Bounded by the open work: `open_jobs`, and one key probe each for an attempt under way.
    pub async fn load_stranded(&self) -> Result<Vec<(JobId, Progress)>, JobDbError> {
        let mut stranded: Vec<(JobId, Progress)> = with_pool!(self, |p, q| {
            sqlx::query(OPEN_JOBS_AS_THEY_ARE)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| Ok((q::job_id_of(row, "job_id")?, q::progress_of(row)?)))
                .collect::<Result<Vec<_>, JobDbError>>()?
        });
        stranded.retain(|(_, p)| matches!(p.state, State::Executing | State::Archiving));
        stranded.sort_by_key(|(id, _)| *id);
        Ok(stranded)
    }

    /// The next `limit` jobs after `after` (in id order) that wait for an attempt, due by
    /// `due_by` (jobs never tried are always due), without their payloads and headers: the
    /// page a Director's cache reads when it has room. A job is in it when its latest
    /// transition is `awaiting-scheduling`, or `awaiting-retry` with `retry_at <= due_by` or
    /// an expiry by then (so it is archived on time), and that transition's id is below
    /// `before_row` (rows written since are the cache's own news). Reads `open_jobs`, with one
    /// key probe per job for an attempt under way (which is not waiting).
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
                "SELECT o.job_id, o.state, o.attempts, o.retry_at FROM open_jobs o \
                 WHERE o.job_id > ? AND o.transition_id < ? \
                   AND (o.state = 'awaiting-scheduling' \
                        OR (o.state = 'awaiting-retry' \
                            AND (o.retry_at <= ? OR o.expire_at <= ?))) \
                   AND NOT EXISTS (SELECT 1 FROM job_state_transitions t \
                                   WHERE t.job_id = o.job_id AND t.id > o.transition_id) \
                 ORDER BY o.job_id \
                 LIMIT ?",
            )
            .bind(after)
            .bind(int(before_row))
            .bind(due_by.naive_utc())
            .bind(due_by.naive_utc())
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(p)
            .await?
            .iter()
            .map(|row| Ok((q::job_id_of(row, "job_id")?, q::progress_of(row)?)))
            .collect::<Result<_, JobDbError>>()?
        });
        self.with_jobs(progress, false).await
    }

    /// When the first job waiting in the JobDB beyond `after` comes due: the earliest
    /// `retry_at` of an `awaiting-retry` job, or expiry of a waiting job, later than `after`
    /// (`None`: nothing waits beyond it). A backlog pass that read everything due by `after`
    /// must look again before this instant. Two index look-ups on `open_jobs`.
    pub async fn next_due_after(
        &self,
        after: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, JobDbError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query(
                "SELECT (SELECT MIN(retry_at) FROM open_jobs \
                         WHERE state = 'awaiting-retry' AND retry_at > ?) AS next_retry, \
                        (SELECT MIN(expire_at) FROM open_jobs \
                         WHERE expire_at > ? \
                           AND state IN ('awaiting-scheduling', 'awaiting-retry')) AS next_expiry",
            )
            .bind(after.naive_utc())
            .bind(after.naive_utc())
            .fetch_one(p)
            .await?;
            let retry = q::time_opt(&row, "next_retry")?;
            let expiry = q::time_opt(&row, "next_expiry")?;
            Ok(match (retry, expiry) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            })
        })
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

/// Splits rows into INSERT-sized chunks: at most `max_bytes` bytes each (a single larger row
/// is a chunk of its own), and a power-of-two number of rows up to [`MAX_ROWS_PER_INSERT`] (so
/// statement shapes repeat).
pub(crate) fn chunks_by_size<T>(
    rows: &[T],
    max_bytes: usize,
    bytes_of: impl Fn(&T) -> usize,
) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0usize, 0usize);
    for (i, row) in rows.iter().enumerate() {
        let size = bytes_of(row).saturating_add(ROW_OVERHEAD_BYTES);
        if i > start && (i - start == MAX_ROWS_PER_INSERT || bytes.saturating_add(size) > max_bytes)
        {
            push_pow2(&mut chunks, &rows[start..i]);
            start = i;
            bytes = 0;
        }
        bytes = bytes.saturating_add(size);
    }
    push_pow2(&mut chunks, &rows[start..]);
    chunks
}

/// The bytes a job's row takes on the wire: every column, headers as their stored JSON.
pub fn job_row_bytes(job: &Job) -> usize {
    let headers: usize = job
        .headers
        .iter()
        .map(|(name, value)| name.len() + value.len() + 6)
        .sum();
    16 + job.bucket.len()
        + job.endpoint.len()
        + job.method.len()
        + headers
        + 2
        + job.payload.len()
        + job.idempotency_key.as_ref().map_or(0, String::len)
        + 64
}

/// The bytes a transition's row takes on the wire.
pub fn transition_row_bytes(t: &Transition) -> usize {
    16 + t.error_type.as_ref().map_or(0, String::len)
        + t.error_response.as_ref().map_or(0, Bytes::len)
        + 64
}

/// A job's new latest state for `open_jobs`.
pub(crate) struct OpenRow {
    pub(crate) job_id: JobId,
    pub(crate) transition_id: u64,
    pub(crate) state: State,
    pub(crate) attempts: u16,
    pub(crate) retry_at: Option<DateTime<Utc>>,
    /// Known for jobs written in the same batch; else the stored value is kept.
    pub(crate) expire_at: Option<DateTime<Utc>>,
}

/// What a batch changes in `open_jobs`: each job's last row of the batch that is not
/// `executing` replaces its entry, or, when it is terminal, removes it.
///
/// `executing` rows are left out on purpose: an attempt's start is written on the hot path of
/// every delivery, and its outcome follows within the job's timeout. So a job's entry holds its
/// latest *resting* state, and at most one later row exists for it: the `executing` row of an
/// attempt under way (every other state is written here). Readers that need the true latest
/// state (recovery, drainers) look for that row after the entry's `transition_id`.
pub(crate) fn open_changes(
    jobs: &[Arc<Job>],
    transitions: &[(u64, Transition)],
) -> (Vec<OpenRow>, Vec<JobId>) {
    let mut last: HashMap<JobId, usize> = HashMap::with_capacity(transitions.len());
    for (i, (_, t)) in transitions.iter().enumerate() {
        if t.state != State::Executing {
            last.insert(t.job_id, i);
        }
    }
    if last.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let expiry: HashMap<JobId, DateTime<Utc>> =
        jobs.iter().map(|job| (job.id, job.expire_at)).collect();
    let (mut open, mut closed) = (Vec::new(), Vec::new());
    for (i, (id, t)) in transitions.iter().enumerate() {
        if last.get(&t.job_id) != Some(&i) {
            continue;
        }
        if t.state.is_terminal() {
            closed.push(t.job_id);
        } else {
            open.push(OpenRow {
                job_id: t.job_id,
                transition_id: *id,
                state: t.state,
                attempts: t.attempts,
                retry_at: t.retry_at,
                expire_at: expiry.get(&t.job_id).copied(),
            });
        }
    }
    (open, closed)
}

/// Pushes `rows` as chunks whose lengths are powers of two, largest first.
fn push_pow2<'a, T>(chunks: &mut Vec<&'a [T]>, mut rows: &'a [T]) {
    while !rows.is_empty() {
        let take = 1 << rows.len().ilog2();
        chunks.push(&rows[..take]);
        rows = &rows[take..];
    }
}

/// The latest time a JobDB column holds (MySQL's DATETIME ends with year 9999): "no bound"
/// in a query that compares times.
pub fn latest_time() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Every unfinished job's latest state: its `open_jobs` entry, or the one row that may follow
/// it (the `executing` row of an attempt under way, which `open_jobs` does not record).
const OPEN_JOBS_AS_THEY_ARE: &str = "SELECT o.job_id, \
     COALESCE(t.state, o.state) AS state, COALESCE(t.attempts, o.attempts) AS attempts, \
     CASE WHEN t.id IS NULL THEN o.retry_at ELSE t.retry_at END AS retry_at \
     FROM open_jobs o \
     LEFT JOIN job_state_transitions t ON t.job_id = o.job_id AND t.id > o.transition_id";

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
        let chunks = chunks_by_size(&rows, MAX_BYTES_PER_INSERT, |r| *r);
        assert_eq!(
            chunks.iter().map(|c| c.len()).collect::<Vec<_>>(),
            vec![512, 512, 64, 8, 4]
        );
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), 1100);
        let big: Vec<usize> = vec![3 * 1024 * 1024; 3];
        assert_eq!(chunks_by_size(&big, MAX_BYTES_PER_INSERT, |r| *r).len(), 3);
        let empty: Vec<usize> = vec![];
        assert!(chunks_by_size(&empty, MAX_BYTES_PER_INSERT, |r| *r).is_empty());
        // Every byte of a row counts, and a chunk never passes the limit unless one row does.
        let rows: Vec<usize> = vec![600; 100];
        let chunks = chunks_by_size(&rows, 8 * 1024, |r| *r);
        assert!(chunks
            .iter()
            .all(|c| c.len() * (600 + ROW_OVERHEAD_BYTES) <= 8 * 1024));
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), 100);
    }
}
