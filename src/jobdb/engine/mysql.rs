//! MySQL (and MariaDB): the production engine. A JobDB is a database on a server.
//!
//! Everything specific to it: connection options and the pool, CREATE/DROP DATABASE, listing
//! schemas, the `GET_LOCK` lock, connection ids and `KILL`, the fence check under `LOCK IN
//! SHARE MODE`, the statements spelled its way (`INSERT IGNORE`, `LEFT`/`CHAR_LENGTH`,
//! `SUBSTRING_INDEX`, `DELETE … LIMIT`, sizes from `information_schema`), and the decoders and
//! write path generated for its types. Named `q` inside `with_pool!` bodies.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, Row};

use crate::jobdb::{JobDbError, JobDbUrl};

super::engine_common!(sqlx::MySql, sqlx::mysql::MySqlRow);
crate::jobdb::write::write_path!(sqlx::MySql);
crate::jobdb::ordering::ordering_sql!(sqlx::MySql);
crate::jobdb::notices::notices_sql!(sqlx::MySql);

/// This engine's schema migrations (`migrations/`), embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A pool to the JobDB's database, and the largest packet its server accepts
/// (`max_allowed_packet`): no statement may be larger.
pub(crate) async fn connect(
    url: &JobDbUrl,
    max_connections: u32,
    lock_wait: Option<Duration>,
) -> Result<(MySqlPool, usize), JobDbError> {
    let mut options = MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10));
    if let Some(wait) = lock_wait {
        // Whole seconds (the server takes no fractions), at least one.
        let seconds = wait.as_secs().max(1);
        options = options.after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION lock_wait_timeout = ?, innodb_lock_wait_timeout = ?")
                    .bind(seconds)
                    .bind(seconds)
                    .execute(conn)
                    .await
                    .map(drop)
            })
        });
    }
    let pool = options.connect_with(url.mysql_options()?).await?;
    let packet: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
        .fetch_one(&pool)
        .await?;
    Ok((pool, usize::try_from(packet).unwrap_or(usize::MAX)))
}

/// Opens and closes one connection to the JobDB's database.
pub(crate) async fn probe(url: &JobDbUrl) -> Result<(), JobDbError> {
    url.mysql_options()?.connect().await?.close().await?;
    Ok(())
}

/// Creates the database if it does not exist. The name was validated by [`JobDbUrl`], which is
/// why it may be spliced into the statement (identifiers cannot be bound).
pub(crate) async fn create_database(
    server: &MySqlConnectOptions,
    database: &str,
) -> Result<(), JobDbError> {
    let mut conn = server.connect().await?;
    conn.execute(
        format!(
            "CREATE DATABASE IF NOT EXISTS `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        )
        .as_str(),
    )
    .await?;
    conn.close().await?;
    Ok(())
}

/// Drops the database (one DROP instead of millions of DELETEs). Name validated by
/// [`JobDbUrl`].
pub(crate) async fn drop_database(
    server: &MySqlConnectOptions,
    database: &str,
) -> Result<(), JobDbError> {
    let mut conn = server.connect().await?;
    conn.execute(format!("DROP DATABASE IF EXISTS `{database}`").as_str())
        .await?;
    conn.close().await?;
    Ok(())
}

/// The server's schemas whose name matches a `LIKE` pattern, read without opening any of them
/// (so nothing is migrated).
pub(crate) async fn databases_like(
    server: &MySqlConnectOptions,
    pattern: &str,
) -> Result<Vec<String>, JobDbError> {
    let mut conn = server.connect().await?;
    let rows = sqlx::query(
        "SELECT schema_name AS name FROM information_schema.schemata WHERE schema_name LIKE ?",
    )
    .bind(pattern)
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    rows.iter().map(|r| text(r, "name")).collect()
}

/// The lock name for a database: server-wide, at most 64 characters.
fn lock_name(database: &str) -> String {
    let mut name = format!("spindle.jobdb.{database}");
    name.truncate(64);
    name
}

/// A server-wide named lock (`GET_LOCK`) on a JobDB's name, held by a connection of its own:
/// it lives exactly as long as that connection.
#[derive(Debug)]
pub struct NamedLock {
    /// The connection holding it.
    conn: MySqlConnection,
    /// The lock's name.
    name: String,
}

impl NamedLock {
    /// Takes the lock without waiting; [`JobDbError::Held`] if another session holds it.
    pub(crate) async fn try_acquire(
        server: &MySqlConnectOptions,
        database: &str,
    ) -> Result<Self, JobDbError> {
        let mut conn = server.connect().await?;
        let name = lock_name(database);
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(&name)
            .fetch_one(&mut conn)
            .await?;
        if got != Some(1) {
            let _ = conn.close().await;
            return Err(JobDbError::Held(database.to_owned()));
        }
        Ok(NamedLock { conn, name })
    }

    /// Confirms the lock is still this connection's, within `timeout`.
    pub(crate) async fn check(&mut self, timeout: Duration) -> Result<(), JobDbError> {
        let query =
            sqlx::query_scalar::<_, Option<i64>>("SELECT IS_USED_LOCK(?) = CONNECTION_ID()")
                .bind(&self.name)
                .fetch_one(&mut self.conn);
        match tokio::time::timeout(timeout, query).await {
            Ok(Ok(Some(1))) => Ok(()),
            Ok(Ok(_)) => Err(JobDbError::Held(self.name.clone())),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(JobDbError::Sql(sqlx::Error::PoolTimedOut)),
        }
    }

    /// Releases the lock and closes its connection.
    pub(crate) async fn release(mut self) -> Result<(), JobDbError> {
        sqlx::query("DO RELEASE_LOCK(?)")
            .bind(&self.name)
            .execute(&mut self.conn)
            .await?;
        self.conn.close().await?;
        Ok(())
    }
}

/// The connection id holding the JobDB's `GET_LOCK`, if any.
pub(crate) async fn lock_connection(
    pool: &MySqlPool,
    database: &str,
) -> Result<Option<u64>, JobDbError> {
    let id: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
        .bind(lock_name(database))
        .fetch_one(pool)
        .await?;
    Ok(id)
}

/// Kills a connection (`KILL CONNECTION`).
pub(crate) async fn kill_connection(pool: &MySqlPool, id: u64) -> Result<(), JobDbError> {
    sqlx::query("KILL CONNECTION ?")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Ends (`KILL`) the connections of other sessions with a transaction open in this database
/// for longer than `older_than`; how many. Needs the `PROCESS` and `CONNECTION ADMIN` (or
/// `SUPER`) privileges.
pub(crate) async fn kill_stalled_transactions(
    pool: &MySqlPool,
    older_than: Duration,
) -> Result<u64, JobDbError> {
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

/// A connection of its own for a takeover, whose row-lock waits last at most `wait` (whole
/// seconds, at least one), so the short wait does not leak into the pool.
pub(crate) async fn takeover_connection(
    url: &JobDbUrl,
    wait: Duration,
) -> Result<MySqlConnection, JobDbError> {
    let mut conn = url.mysql_options()?.connect().await?;
    sqlx::query("SET SESSION innodb_lock_wait_timeout = ?")
        .bind(wait.as_secs().max(1))
        .execute(&mut conn)
        .await?;
    Ok(conn)
}

/// Makes sure the server is done with a connection whose COMMIT got no answer in time
/// (closed on our side): ends it (`KILL CONNECTION`; a connection already gone is fine) and
/// waits until the server no longer lists it. Only then can a read tell whether the COMMIT
/// happened: a thread the server still runs may commit later.
pub(crate) async fn end_connection(pool: &MySqlPool, id: u64) -> Result<(), JobDbError> {
    // A server-given thread id (an integer), not input: KILL takes no placeholder.
    match sqlx::raw_sql(&format!("KILL CONNECTION {id}"))
        .execute(pool)
        .await
    {
        Ok(_) => {}
        // ER_NO_SUCH_THREAD: it ended already.
        Err(sqlx::Error::Database(e))
            if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == 1094) => {}
        Err(e) => return Err(e.into()),
    }
    let mut pause = Duration::from_millis(10);
    loop {
        let listed: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?")
                .bind(id)
                .fetch_one(pool)
                .await?;
        if listed == 0 {
            return Ok(());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// A connection whose COMMIT got no answer in time, closed: what [`end_connection`] needs.
pub(crate) fn stalled(conn: MySqlConnection, id: u64) -> crate::jobdb::write::Stalled {
    drop(conn);
    crate::jobdb::write::Stalled::MySql(id)
}

/// Whether an error is a row-lock wait that timed out: a previous owner still holds the row.
pub(crate) fn is_lock_wait(e: &dyn sqlx::error::DatabaseError) -> bool {
    e.code().as_deref() == Some("HY000") && e.message().contains("Lock wait timeout")
}

/// `_sqlx_migrations.installed_on` (a TIMESTAMP, UTC on the wire).
pub fn installed_on(row: &DbRow, column: &str) -> Result<Option<DateTime<Utc>>, JobDbError> {
    Ok(row.try_get(column)?)
}

/// The fence check: a shared lock on the owner row, so a takeover waits for this commit; with
/// the connection's id, by which a COMMIT that gets no answer is ended (`end_connection`).
pub const FENCE_CHECK: &str =
    "SELECT fencing_token, CAST(CONNECTION_ID() AS UNSIGNED) FROM jobdb_owner WHERE id = 1 \
     LOCK IN SHARE MODE";

/// Replaces an existing `open_jobs` row (MariaDB and MySQL both take `VALUES()`); an entry
/// that moves to `archiving` leaves its sequence (its turn is over).
pub const UPSERT_OPEN_JOBS: &str = " ON DUPLICATE KEY UPDATE \
     transition_id = VALUES(transition_id), state = VALUES(state), \
     attempts = VALUES(attempts), retry_at = VALUES(retry_at), \
     expire_at = COALESCE(VALUES(expire_at), expire_at), \
     seq = IF(VALUES(state) = 'archiving', NULL, seq), \
     held = IF(VALUES(state) = 'archiving', 0, held)";

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

/// The condition "`$text` starts with `$prefix`", whole: `$text` cut to `$prefix`'s length in
/// characters equals `$prefix`.
macro_rules! starts_with {
    ($text:literal, $prefix:literal) => {
        concat!("LEFT(", $text, ", CHAR_LENGTH(", $prefix, ")) = ", $prefix)
    };
}

/// The lane of `jobs j`: its endpoint cut at the first `?` or `#`.
macro_rules! lane {
    () => {
        "SUBSTRING_INDEX(SUBSTRING_INDEX(j.endpoint, '?', 1), '#', 1)"
    };
}

super::spelled_sql! {
    insert_ignore: "INSERT IGNORE",
    empty_blob: "CAST('' AS BINARY)",
    int: "SIGNED",
    starts_with: starts_with,
    by_seq: "FORCE INDEX (open_jobs_seq)",
    in_order: "STRAIGHT_JOIN",
}

/// The first entry of one sequence in `(seq, held, position)` order, as one arm of a
/// `UNION ALL` (binds: the sequence): a released one (`held` 0: the sequence has a job under
/// way) if it has any, else its held entry of the lowest position, its head; one look-up
/// whatever the planner thinks of the sequence's length. A grouped read of a single sequence
/// was planned as a walk of every held entry (a key with a thousand jobs waiting read a
/// thousand rows per commit). A parenthesised arm, not a derived table, which MariaDB would
/// materialise.
pub const HEAD_OR_RELEASED: (&str, &str) = (
    "(SELECT seq, job_id, position, held FROM open_jobs FORCE INDEX (open_jobs_seq) \
     WHERE seq = ",
    " ORDER BY held, position, job_id LIMIT 1)",
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

super::backlog_sql! {
    lane: lane!(),
    held_as: ("LEFT(CAST(", " AS BINARY), 2048)"),
}

super::stats_sql! {
    lane: lane!(),
    slot: "CAST(TIMESTAMPDIFF(SECOND, ?, t.time) DIV ? AS SIGNED)",
    int: "SIGNED",
    latency: "CAST(CASE WHEN t.duration_ms < 64 THEN t.duration_ms \
              ELSE 64 + FLOOR(LOG2(t.duration_ms / 64) * 16) END AS SIGNED)",
    latency_in_sql: true,
    json_len: "JSON_LENGTH",
}

/// The hint that makes a statement read a table through the index `name` (listing pages,
/// [`crate::jobdb::listing`]).
pub fn use_index(name: &str) -> String {
    format!(" FORCE INDEX ({name})")
}
