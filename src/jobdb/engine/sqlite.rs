//! SQLite: the embedded engine. A JobDB is a file, `<dir>/<database>.sqlite3`.
//!
//! Everything specific to it: connection options (WAL, `synchronous = FULL`, a busy timeout)
//! and the pool, creating and deleting the file, listing a directory's JobDBs, the `flock`
//! beside the file, the fence check (SQLite's one writer at a time), the statements spelled
//! its way (`INSERT OR IGNORE`, `substr`/`length`, `instr`, `unixepoch`, DELETEs by subquery,
//! sizes from the file's pages), and the decoders and write path generated for its types.
//! SQLite has no connection ids: asked to `KILL`, it says so ([`JobDbError::Unsupported`]).
//! Named `q` inside `with_pool!` bodies.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use nix::fcntl::{Flock, FlockArg};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};

use crate::jobdb::url::SQLITE_SUFFIX;
use crate::jobdb::{JobDbError, JobDbUrl};

super::engine_common!(sqlx::Sqlite, sqlx::sqlite::SqliteRow);
crate::jobdb::write::write_path!(sqlx::Sqlite);
crate::jobdb::ordering::ordering_sql!(sqlx::Sqlite);
crate::jobdb::notices::notices_sql!(sqlx::Sqlite);

/// This engine's schema migrations (`migrations/sqlite/`: the same versions as MySQL's, in
/// SQLite's types), embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// The packet limit assumed for SQLite (which has none below its 1 GB value limit), so one
/// row is refused on both engines at the same size.
const MAX_PACKET: usize = 64 * 1024 * 1024;

/// An I/O error on `path`, as a [`JobDbError::File`].
fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> JobDbError + '_ {
    move |source| JobDbError::File {
        path: path.to_path_buf(),
        source,
    }
}

/// The JobDB's file; [`JobDbError::Unsupported`] for a MySQL URL.
fn file_of(url: &JobDbUrl) -> Result<PathBuf, JobDbError> {
    url.sqlite_file()
        .ok_or(JobDbError::Unsupported("a SQLite file"))
}

/// Connection options for the JobDB's file: WAL (readers never block the writer),
/// `synchronous = FULL` (a commit is on disk before a job is acknowledged), and a busy timeout
/// for the one-writer-at-a-time lock; the file is created only if `create`.
fn options(url: &JobDbUrl, create: bool) -> Result<SqliteConnectOptions, JobDbError> {
    Ok(SqliteConnectOptions::new()
        .filename(file_of(url)?)
        .create_if_missing(create)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(false)
        .busy_timeout(Duration::from_secs(10))
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(2)))
}

/// A pool to the JobDB's file (which must exist), and the packet limit assumed for it.
pub(crate) async fn connect(
    url: &JobDbUrl,
    max_connections: u32,
    lock_wait: Option<Duration>,
) -> Result<(SqlitePool, usize), JobDbError> {
    let mut options = options(url, false)?;
    if let Some(wait) = lock_wait {
        options = options.busy_timeout(wait.max(Duration::from_millis(1)));
    }
    let pool = retry_busy(|| {
        SqlitePoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
    })
    .await?;
    Ok((pool, MAX_PACKET))
}

/// Runs `open` again while SQLite answers "database is locked" (up to 20 times, 20 ms more
/// pause each time): processes opening a new file at the same moment (a cluster's first boot)
/// race to create it and switch it to WAL, and SQLite refuses the loser at once rather than
/// through the busy timeout.
async fn retry_busy<T, Fut>(open: impl FnMut() -> Fut) -> Result<T, sqlx::Error>
where
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    retry_while(20, Duration::from_millis(20), is_busy, open).await
}

/// Runs `op` until it succeeds, fails with an error `retryable` refuses, or has been tried
/// again `retries` times, pausing `step` longer before each new try (`step`, `2 × step`, ...).
pub(crate) async fn retry_while<T, E, Fut>(
    retries: u32,
    step: Duration,
    retryable: impl Fn(&E) -> bool,
    mut op: impl FnMut() -> Fut,
) -> Result<T, E>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(e) if tries < retries && retryable(&e) => {
                tries += 1;
                tokio::time::sleep(step * tries).await;
            }
            other => return other,
        }
    }
}

/// Whether `e` is SQLite's `SQLITE_BUSY` (any of its extended codes).
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 5)
}

/// Opens and closes one connection to the JobDB's file, which must exist.
pub(crate) async fn probe(url: &JobDbUrl) -> Result<(), JobDbError> {
    options(url, false)?.connect().await?.close().await?;
    Ok(())
}

/// Creates the JobDB's directory and file if they do not exist.
pub(crate) async fn create_database(url: &JobDbUrl, dir: &Path) -> Result<(), JobDbError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(file_error(dir))?;
    let options = options(url, true)?;
    retry_busy(|| options.connect()).await?.close().await?;
    Ok(())
}

/// Deletes the JobDB's file, its WAL and shared-memory files, and its lock file.
pub(crate) async fn drop_database(url: &JobDbUrl) -> Result<(), JobDbError> {
    let file = file_of(url)?;
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
    Ok(())
}

/// The JobDBs (files) in `dir` whose name matches a `LIKE` pattern, sorted.
pub(crate) async fn databases_like(dir: &Path, pattern: &str) -> Result<Vec<String>, JobDbError> {
    let mut names = Vec::new();
    let mut entries = tokio::fs::read_dir(dir).await.map_err(file_error(dir))?;
    while let Some(entry) = entries.next_entry().await.map_err(file_error(dir))? {
        let file = entry.file_name();
        let Some(name) = file.to_str().and_then(|f| f.strip_suffix(SQLITE_SUFFIX)) else {
            continue;
        };
        if like(pattern.as_bytes(), name.as_bytes()) {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// SQL `LIKE` (case-sensitive, `\` escapes): `%` any run, `_` one character.
fn like(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'%', rest)) => (0..=text.len()).any(|i| like(rest, &text[i..])),
        Some((b'_', rest)) => !text.is_empty() && like(rest, &text[1..]),
        Some((b'\\', rest)) if !rest.is_empty() => {
            text.first() == Some(&rest[0]) && like(&rest[1..], &text[1..])
        }
        Some((c, rest)) => text.first() == Some(c) && like(rest, &text[1..]),
    }
}

/// An exclusive `flock` on `<database>.lock` beside a JobDB's file, held by an open file
/// descriptor: it ends with the process.
#[derive(Debug)]
pub struct FileLock {
    /// The locked file, open.
    lock: Flock<File>,
    /// The JobDB's file, which must still exist for the lock to mean anything.
    jobdb: PathBuf,
}

impl FileLock {
    /// Takes the lock without waiting (creating `dir` if needed); [`JobDbError::Held`] if
    /// another process holds it.
    pub(crate) async fn try_acquire(url: &JobDbUrl, dir: &Path) -> Result<Self, JobDbError> {
        let jobdb = url
            .sqlite_file()
            .ok_or(JobDbError::Unsupported("a file lock"))?;
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(file_error(dir))?;
        let path = dir.join(format!("{}.lock", url.database));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(file_error(&path))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|_| JobDbError::Held(url.database.clone()))?;
        Ok(FileLock { lock, jobdb })
    }

    /// Confirms the lock still means something: the descriptor holds it until dropped, so a
    /// deleted JobDB file is a lost lock.
    pub(crate) async fn check(&self) -> Result<(), JobDbError> {
        match tokio::fs::metadata(&self.jobdb).await {
            Ok(_) => Ok(()),
            Err(e) => Err(file_error(&self.jobdb)(e)),
        }
    }

    /// Releases the lock.
    pub(crate) fn release(self) {
        drop(self.lock);
    }
}

/// SQLite has no lock connection: [`JobDbError::Unsupported`].
pub(crate) async fn lock_connection(
    _pool: &SqlitePool,
    _database: &str,
) -> Result<Option<u64>, JobDbError> {
    Err(JobDbError::Unsupported("a lock connection"))
}

/// SQLite has no connections to kill: [`JobDbError::Unsupported`].
pub(crate) async fn kill_connection(_pool: &SqlitePool, _id: u64) -> Result<(), JobDbError> {
    Err(JobDbError::Unsupported("KILL CONNECTION"))
}

/// Nothing to end: a stalled writer's lock is waited for by the busy timeout. Always 0.
pub(crate) async fn kill_stalled_transactions(
    _pool: &SqlitePool,
    _older_than: Duration,
) -> Result<u64, JobDbError> {
    Ok(0)
}

/// A connection of its own for a takeover, whose busy timeout (the wait for another writer's
/// lock) is `wait` (at least 1 ms), so the short wait does not leak into the pool.
pub(crate) async fn takeover_connection(
    url: &JobDbUrl,
    wait: Duration,
) -> Result<SqliteConnection, JobDbError> {
    Ok(options(url, false)?
        .busy_timeout(wait.max(Duration::from_millis(1)))
        .connect()
        .await?)
}

/// A connection whose COMMIT got no answer in time: kept, so that closing it
/// ([`crate::jobdb::JobDb::settle`]) waits for the COMMIT its worker thread is still running.
pub(crate) fn stalled(conn: SqliteConnection, _id: u64) -> crate::jobdb::write::Stalled {
    crate::jobdb::write::Stalled::Sqlite(conn)
}

/// Whether an error is the busy timeout running out: another writer still holds the lock.
pub(crate) fn is_lock_wait(e: &dyn sqlx::error::DatabaseError) -> bool {
    e.message().contains("locked")
}

/// `_sqlx_migrations.installed_on` (SQLite's `CURRENT_TIMESTAMP` text, UTC).
pub fn installed_on(row: &DbRow, column: &str) -> Result<Option<DateTime<Utc>>, JobDbError> {
    time_opt(row, column)
}

/// The fence check. SQLite has one writer at a time: by this statement the transaction
/// holds the write lock (its first INSERT took it), so a takeover waits for the commit.
/// SQLite has no connection ids (0 stands in).
pub const FENCE_CHECK: &str = "SELECT fencing_token, 0 AS connection FROM jobdb_owner WHERE id = 1";

/// Replaces an existing `open_jobs` row.
pub const UPSERT_OPEN_JOBS: &str = " ON CONFLICT (job_id) DO UPDATE SET \
     transition_id = excluded.transition_id, state = excluded.state, \
     attempts = excluded.attempts, retry_at = excluded.retry_at, \
     expire_at = COALESCE(excluded.expire_at, open_jobs.expire_at), \
     seq = CASE WHEN excluded.state = 'archiving' THEN NULL ELSE open_jobs.seq END, \
     held = CASE WHEN excluded.state = 'archiving' THEN 0 ELSE open_jobs.held END";

/// SQLite result codes that refuse the data itself: too big, constraint, type mismatch,
/// parameter out of range (the primary code is the low byte of an extended one).
fn refused_code(db: &dyn sqlx::error::DatabaseError) -> bool {
    db.code()
        .and_then(|c| c.parse::<u32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 18 | 19 | 20 | 25))
}

/// The condition "`$text` starts with `$prefix`", whole: `$text` cut to `$prefix`'s length in
/// characters equals `$prefix`.
macro_rules! starts_with {
    ($text:literal, $prefix:literal) => {
        concat!("substr(", $text, ", 1, length(", $prefix, ")) = ", $prefix)
    };
}

/// The lane of `jobs j`: its endpoint cut before the earlier of the first `?` and `#` (SQLite
/// has no `SUBSTRING_INDEX`).
macro_rules! lane {
    () => {
        "substr(j.endpoint, 1, min(\
         CASE WHEN instr(j.endpoint, '?') > 0 THEN instr(j.endpoint, '?') - 1 \
              ELSE length(j.endpoint) END, \
         CASE WHEN instr(j.endpoint, '#') > 0 THEN instr(j.endpoint, '#') - 1 \
              ELSE length(j.endpoint) END))"
    };
}

super::spelled_sql! {
    insert_ignore: "INSERT OR IGNORE",
    empty_blob: "X''",
    int: "INTEGER",
    starts_with: starts_with,
    by_seq: "INDEXED BY open_jobs_seq",
    in_order: "CROSS JOIN",
}

/// The first entry of one sequence in `(seq, held, position)` order, as one arm of a
/// `UNION ALL` (binds: the sequence), as MariaDB's (see `mysql::HEAD_OR_RELEASED`); SQLite
/// takes `LIMIT` in an arm only inside a subquery.
pub const HEAD_OR_RELEASED: (&str, &str) = (
    "SELECT * FROM (SELECT seq, job_id, position, held FROM open_jobs \
     INDEXED BY open_jobs_seq WHERE seq = ",
    " ORDER BY held, position, job_id LIMIT 1)",
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

super::backlog_sql! {
    lane: lane!(),
    held_as: ("(", ")"),
}

super::stats_sql! {
    lane: lane!(),
    slot: "(CAST(unixepoch(t.time, 'subsec') - unixepoch(?, 'subsec') AS INTEGER) / ?)",
    int: "INTEGER",
    latency: "t.duration_ms",
    latency_in_sql: false,
    json_len: "json_array_length",
}

/// The hint that makes a statement read a table through the index `name` (listing pages,
/// [`crate::jobdb::listing`]).
pub fn use_index(name: &str) -> String {
    format!(" INDEXED BY {name}")
}

#[cfg(test)]
mod tests {
    use super::like;

    #[test]
    fn like_matches_as_sql_does() {
        assert!(like(b"spindle\\_%", b"spindle_01"));
        assert!(!like(b"spindle\\_%", b"spindleX01"));
        assert!(like(b"a_c", b"abc"));
        assert!(!like(b"a_c", b"ac"));
        assert!(like(b"%", b""));
        assert!(like(b"jobdb%", b"jobdb"));
    }
}
