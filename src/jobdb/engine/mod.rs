//! The two JobDB engines, one module each ([`mysql`], [`sqlite`]), and what they share.
//!
//! # How a statement is written once
//!
//! [`super::JobDb`] holds a `Pool` of either engine. A method's body is written once and
//! compiled once per engine by `with_pool!`, which runs it with `p` bound to that engine's pool
//! and `q` naming that engine's module here. So:
//!
//! - a statement both engines accept (most of them: `?` placeholders, the same tables and
//!   column names) is written once, in the method, as a literal;
//! - a statement the engines spell differently is `q::NAME`, a constant of each engine module.
//!   Where the difference is a few words, the constants too are written once, by
//!   `spelled_sql!` and `stats_sql!`, from each engine's spelling of those words (each a
//!   whole SQL expression or keyword, never a fragment opened here and closed elsewhere);
//! - rows are decoded by plain generic functions ([`rows`]) over a row of either engine;
//! - rows are written by functions generated for each engine's sqlx types from one text:
//!   `engine_common!` (id lists), `write::write_path!` (INSERT builders, the fenced commit,
//!   what a refusal is), `ordering::ordering_sql!` (heads, releases, blocks) and
//!   `notices::notices_sql!` (completion notices). These bind and run statements kept as
//!   named constants beside them, so the SQL reads as SQL;
//! - reads that take several statements in one snapshot run them as methods of `Tx`, a
//!   transaction of either engine (the ledger's round);
//! - what only one engine has (a connection id to `KILL`, a file lock, a busy timeout) is a
//!   function of the same name and signature in both modules, and the engine without it says
//!   so (`Ok(0)`, or [`super::JobDbError::Unsupported`]).
//!
//! An engine difference is therefore always visible as `q::NAME` (or a `match` on
//! [`super::Server`] where there is no pool yet), and lives in [`mysql`], [`sqlite`] and the two
//! `migrations/` directories, nowhere else. The generators name everything they use by its full
//! path and bring no `use` into an engine module, so each engine module imports what its own
//! code needs.

use sqlx::mysql::MySqlPool;
use sqlx::sqlite::SqlitePool;

pub mod mysql;
pub mod rows;
pub mod sqlite;

/// A connection pool of either engine.
#[derive(Clone, Debug)]
pub(crate) enum Pool {
    /// A MySQL JobDB.
    MySql(MySqlPool),
    /// A SQLite JobDB.
    Sqlite(SqlitePool),
}

/// Runs `$body` with `$x` bound to what the `$kind` enum (`Pool` or `Tx`, whose variants are
/// named for the engines) holds in `$value`, and `$q` naming that engine's module ([`mysql`] or
/// [`sqlite`]): one body, compiled once per engine. `with_pool!` and `with_tx!` are its uses.
macro_rules! per_engine {
    ($value:expr, $kind:ident, |$x:ident, $q:ident| $body:expr) => {
        match $value {
            $crate::jobdb::engine::$kind::MySql($x) => {
                #[allow(unused_imports)]
                use $crate::jobdb::engine::mysql as $q;
                $body
            }
            $crate::jobdb::engine::$kind::Sqlite($x) => {
                #[allow(unused_imports)]
                use $crate::jobdb::engine::sqlite as $q;
                $body
            }
        }
    };
}
pub(crate) use per_engine;

/// Runs `$body` against the JobDB's pool `$p`, with `$q` naming the engine's module.
macro_rules! with_pool {
    ($db:expr, |$p:ident, $q:ident| $body:expr) => {
        $crate::jobdb::engine::per_engine!(&$db.pool, Pool, |$p, $q| $body)
    };
}
pub(crate) use with_pool;

/// A transaction of either engine, begun by [`super::JobDb::begin`]: reads that must see one
/// snapshot take it from step to step.
pub(crate) enum Tx {
    /// On a MySQL JobDB.
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
    /// On a SQLite JobDB.
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

/// Runs `$body` in the transaction `$tx` ([`Tx`]), bound as `$t`, with `$q` naming its
/// engine's module.
macro_rules! with_tx {
    ($tx:expr, |$t:ident, $q:ident| $body:expr) => {
        $crate::jobdb::engine::per_engine!($tx, Tx, |$t, $q| $body)
    };
}
pub(crate) use with_tx;

impl Tx {
    /// Ends the transaction without writing.
    pub(crate) async fn rollback(self) -> Result<(), super::JobDbError> {
        with_tx!(self, |t, _q| t.rollback().await?);
        Ok(())
    }
}

impl super::JobDb {
    /// A transaction on this JobDB.
    pub(crate) async fn begin(&self) -> Result<Tx, super::JobDbError> {
        Ok(match &self.pool {
            Pool::MySql(p) => Tx::MySql(p.begin().await?),
            Pool::Sqlite(p) => Tx::Sqlite(p.begin().await?),
        })
    }
}

/// What both engines share besides the write path: their sqlx types, the decoders of [`rows`]
/// (re-exported, so `q::job_from_row` names them), and bound id lists. `$db` is the sqlx
/// database type, `$row` its row type.
macro_rules! engine_common {
    ($db:ty, $row:ty) => {
        /// This engine's sqlx database type.
        pub type Db = $db;
        /// This engine's row type.
        pub type DbRow = $row;

        pub use $crate::jobdb::engine::rows::{
            command_from_row, count_of, job_from_row, job_id_of, open_work_of, progress_of,
            started_of, state_of, text, text_opt, time_of, time_opt, transition_from_row, ulid_of,
        };

        /// `prefix` + a bound list of ids + `suffix`.
        pub fn ids_query<'a>(
            prefix: &'a str,
            ids: &'a [$crate::job::JobId],
            suffix: &'a str,
        ) -> sqlx::QueryBuilder<'a, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new(prefix);
            let mut list = qb.separated(", ");
            for id in ids {
                list.push_bind(id.to_bytes().to_vec());
            }
            qb.push(suffix);
            qb
        }
    };
}
pub(crate) use engine_common;

/// Attempts (rows with a duration) that ended in these states: a success, or a failure that is
/// retried or discarded. Rows without a duration in the same states are not attempts
/// (`interrupted`, `imported`, operator commands).
macro_rules! attempt_rows {
    () => {
        "t.state IN ('succeeded', 'awaiting-retry', 'discarded') AND t.duration_ms IS NOT NULL"
    };
}
pub(crate) use attempt_rows;

/// The backlog page's statement ([`super::JobDb::backlog_page`]) for one engine, from its
/// spelling of `lane` (as for [`stats_sql!`]) and of how `open_jobs.lane` holds a lane
/// (`held_as`: what goes before and after it, for a bound `?` and for `lane` alike):
/// `BACKLOG_PAGE` reads every lane; `BACKLOG_PAGE_OTHER_LANES` leaves one lane out (its last bind, before the limit) by
/// the `(lane, job_id)` index, reading entries of unknown lane too. `LANE_OPEN`/`LANE_CLOSE`
/// surround a bound lane an entry stores; `LANE_OF_JOB` opens the subquery that reads it from
/// the job instead (the caller binds the id and closes it).
macro_rules! backlog_sql {
    (lane: $lane:expr, held_as: ($open:expr, $close:expr) $(,)?) => {
        /// The next waiting jobs after a job id, due by a time (binds: after, before_row,
        /// scheduled_by twice, due_by twice, limit).
        pub const BACKLOG_PAGE: &str = concat!(
            "SELECT o.job_id, o.state, o.attempts, o.retry_at FROM open_jobs o WHERE ",
            $crate::jobdb::engine::backlog_due!(),
            " ORDER BY o.job_id LIMIT ?"
        );
        /// [`BACKLOG_PAGE`] without the jobs of one lane (bound before the limit).
        pub const BACKLOG_PAGE_OTHER_LANES: &str = concat!(
            "SELECT o.job_id, o.state, o.attempts, o.retry_at FROM open_jobs o WHERE ",
            $crate::jobdb::engine::backlog_due!(),
            " AND (o.lane IS NULL OR o.lane <> ",
            $open,
            "?",
            $close,
            ") ORDER BY o.job_id LIMIT ?"
        );
        /// Before a bound lane that an entry stores.
        pub const LANE_OPEN: &str = $open;
        /// After a bound lane that an entry stores.
        pub const LANE_CLOSE: &str = $close;
        /// An entry's lane, read from its job: `(SELECT lane FROM jobs j WHERE j.id = `, then
        /// the caller's bound id and `)`.
        pub const LANE_OF_JOB: &str = concat!(
            "(SELECT ",
            $open,
            $lane,
            $close,
            " FROM jobs j WHERE j.id = "
        );
    };
}
pub(crate) use backlog_sql;

/// The condition of a backlog page on `open_jobs o`: after a job id, its entry older than a
/// row id, not held (an ordered job waiting for its turn), waiting for its first attempt, or
/// for a retry (or its expiry) due by a time (a job never tried that waits is due by another),
/// and no attempt under way.
macro_rules! backlog_due {
    () => {
        "o.job_id > ? AND o.transition_id < ? AND o.held = 0 \
         AND (o.state = 'awaiting-scheduling' \
              OR (o.state = 'awaiting-retry' \
                  AND (CASE WHEN o.attempts = 0 \
                            THEN o.retry_at <= ? OR o.expire_at <= ? \
                            ELSE o.retry_at <= ? OR o.expire_at <= ? END))) \
         AND NOT EXISTS (SELECT 1 FROM job_state_transitions t \
                         WHERE t.job_id = o.job_id AND t.id > o.transition_id)"
    };
}
pub(crate) use backlog_due;

/// The statements of [`super::stats`] for one engine, from its spellings: `lane`, the lane of
/// `jobs j` (its endpoint cut at the first `?` or `#`); `slot`, the time slot of `t.time` (whole
/// slots of the second parameter's seconds since the first); `int`, its name for a signed
/// integer cast; `latency`, the latency bucket of `t.duration_ms`
/// ([`super::stats::latency_key`]) or, where the engine lacks `LOG2`, the duration itself (then
/// `latency_in_sql` is false and the caller buckets); `json_len`, its function for a JSON
/// array's length.
macro_rules! stats_sql {
    (
        lane: $lane:expr,
        slot: $slot:expr,
        int: $int:literal,
        latency: $latency:expr,
        latency_in_sql: $in_sql:literal,
        json_len: $json_len:literal $(,)?
    ) => {
        /// Whether `LANE_ATTEMPTS` returns latency buckets (else durations).
        pub const LATENCY_IN_SQL: bool = $in_sql;
        /// Steps per state and slot: rows, and the acceptances and attempt starts that
        /// `commit_log` records (binds: start, slot seconds, then start four times).
        pub const TRANSITIONS_PER_SLOT: &str = concat!(
            "SELECT ",
            $slot,
            " AS slot, t.state, CAST(SUM(t.n) AS ",
            $int,
            ") AS n FROM (\
             SELECT time, state, 1 AS n FROM job_state_transitions WHERE time >= ? \
             UNION ALL SELECT time, 'awaiting-scheduling', ",
            $json_len,
            "(accepted) FROM commit_log WHERE time >= ? AND accepted IS NOT NULL \
             UNION ALL SELECT time, 'executing', ",
            $json_len,
            "(started) FROM commit_log WHERE time >= ? AND started IS NOT NULL) t \
             WHERE t.time >= ? GROUP BY slot, t.state"
        );
        /// Waiting jobs by lane and state (from the open work, not the history).
        pub const LANE_BACKLOG: &str = concat!(
            "SELECT ",
            $lane,
            " AS lane, w.state, \
             CAST(CASE WHEN w.state = 'awaiting-retry' AND w.attempts = 0 THEN 1 ELSE 0 END \
                  AS SIGNED) AS scheduled, \
             COUNT(*) AS n \
             FROM open_work w JOIN jobs j ON j.id = w.job_id \
             WHERE w.state IN ('awaiting-scheduling', 'awaiting-retry', 'executing') \
             GROUP BY lane, w.state, scheduled"
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
            $crate::jobdb::engine::attempt_rows!(),
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
            $crate::jobdb::engine::attempt_rows!(),
            " GROUP BY lane, slot"
        );
        /// Kinds of failed attempts since a time, by lane.
        pub const LANE_ERRORS: &str = concat!(
            "SELECT ",
            $lane,
            " AS lane, t.error_type, t.response_status, MAX(t.time) AS last_at \
             FROM job_state_transitions t JOIN jobs j ON j.id = t.job_id \
             WHERE t.time >= ? AND t.error_type IS NOT NULL AND ",
            $crate::jobdb::engine::attempt_rows!(),
            " GROUP BY lane, t.error_type, t.response_status"
        );
    };
}
pub(crate) use stats_sql;

/// The statements that differ between the engines only in a few words, from each engine's
/// spelling of them: `insert_ignore`, how an INSERT skips rows whose key exists; `empty_blob`,
/// an empty binary literal; `int`, a signed integer cast; `starts_with`, the name of the
/// engine's macro `starts_with!(text, prefix)`, which spells the whole condition "`text` starts
/// with `prefix`" (`prefix` appears in it twice, so a placeholder there is bound twice);
/// `by_seq`, what follows a table name to make the planner read `open_jobs` through its
/// `(seq, held, position)` index; `in_order`, a join that reads its left side first.
macro_rules! spelled_sql {
    (
        insert_ignore: $ignore:literal,
        empty_blob: $empty_blob:literal,
        int: $int:literal,
        starts_with: $starts_with:ident,
        by_seq: $by_seq:literal,
        in_order: $in_order:literal $(,)?
    ) => {
        /// The entry of the lowest position of each sequence, held: before and after the
        /// caller's sequences. Both reads go through the `(seq, held, position)` index by
        /// name, the grouped read first: left to itself, MariaDB joined back through
        /// `(held, expire_at)` and read every held entry per statement (tens of thousands of
        /// rows with a deep backlog), or began with a scan of the whole index.
        pub const OLDEST_HELD: (&str, &str) = (
            concat!(
                "SELECT h.seq, o.job_id, o.position FROM (SELECT seq, MIN(position) AS m FROM open_jobs ",
                $by_seq,
                " WHERE held = 1 AND seq"
            ),
            concat!(
                " GROUP BY seq) h ",
                $in_order,
                " open_jobs o ",
                $by_seq,
                " ON o.seq = h.seq AND o.held = 1 AND o.position = h.m"
            ),
        );
        /// [`OLDEST_HELD`] of released entries.
        pub const OLDEST_RELEASED: (&str, &str) = (
            concat!(
                "SELECT h.seq, o.job_id, o.position FROM (SELECT seq, MIN(position) AS m FROM open_jobs ",
                $by_seq,
                " WHERE held = 0 AND seq"
            ),
            concat!(
                " GROUP BY seq) h ",
                $in_order,
                " open_jobs o ",
                $by_seq,
                " ON o.seq = h.seq AND o.held = 0 AND o.position = h.m"
            ),
        );
        /// Sequences with a released job (one under way): the caller adds which sequences,
        /// then ` GROUP BY seq`.
        pub const RELEASED_SEQS: &str = concat!(
            "SELECT seq FROM open_jobs ",
            $by_seq,
            " WHERE held = 0 AND seq"
        );
        /// Jobs that owe a completion notice; a repeat is ignored.
        pub const INSERT_NOTICES_OWED: &str = concat!($ignore, " INTO notices_owed (job_id) ");
        /// Sequences blocked by a job's unsuccessful end; a sequence blocked already keeps
        /// its first blocker.
        pub const INSERT_ORDERING_BLOCKED: &str = concat!(
            $ignore,
            " INTO ordering_blocked (seq, job_id, state, blocked_at, bucket, endpoint, \
             ordering_key) "
        );
        /// Origins of imported jobs; a repeat is ignored.
        pub const INSERT_ORIGINS: &str =
            concat!($ignore, " INTO job_origins (job_id, from_jobdb, imported_at) ");
        /// Events of the jobs written, and events kept without a job; a repeat is ignored.
        pub const INSERT_EVENTS: &str =
            concat!($ignore, " INTO events (id, bucket, event_type, created_at, payload) ");
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
             created_at, expire_at, idempotency_key, on_complete, ordering_key, ordering_blocks, \
             ordering_position, event_id, event_type, subscription_id, traceparent, tracestate \
             FROM jobs WHERE id IN ("
        );
        /// Job summaries (no payload, its size).
        pub const SELECT_JOB_SUMMARIES: &str = concat!(
            "SELECT id, bucket, endpoint, method, '{}' AS headers, ",
            $empty_blob,
            " AS payload, execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, \
             created_at, expire_at, idempotency_key, on_complete, ordering_key, ordering_blocks, \
             ordering_position, event_id, event_type, subscription_id, traceparent, tracestate, \
             CAST(LENGTH(payload) AS ",
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
            $starts_with!("j.endpoint", "c.endpoint_prefix"),
            ") \
               AND (c.created_before IS NULL OR j.created_at < c.created_before) \
               AND (c.idempotency_key_prefix IS NULL OR ",
            $starts_with!("j.idempotency_key", "c.idempotency_key_prefix"),
            ") \
               AND t.transition_id < ? \
               AND t.state IN ('awaiting-scheduling', 'awaiting-retry') \
               AND (t.held = 0 OR c.action IN ('flush', 'discard')) \
               AND NOT EXISTS (SELECT 1 FROM job_state_transitions l \
                               WHERE l.job_id = t.job_id AND l.id > t.transition_id)"
        );
        /// Ended jobs for replay (not erased: nothing is left to send).
        pub const ENDED_JOBS: &str = concat!(
            "SELECT j.id, j.bucket, j.endpoint, j.method, j.headers, j.payload, \
             j.execution_timeout_ms, j.backoff_min_delay_ms, j.backoff_coefficient, \
             j.created_at, j.expire_at, j.idempotency_key, j.on_complete, j.ordering_key, \
             j.ordering_blocks, j.ordering_position, j.event_id, j.event_type, j.subscription_id, \
             j.traceparent, j.tracestate, t.state \
             FROM jobs j JOIN job_state_transitions t ON t.job_id = j.id \
             WHERE j.id > ? AND j.erased_at IS NULL \
               AND t.id = (SELECT MAX(l.id) FROM job_state_transitions l WHERE l.job_id = j.id) \
               AND ((? AND t.state = 'discarded') OR (? AND t.state = 'archived')) \
               AND (? IS NULL OR j.bucket = ?) \
               AND (? IS NULL OR ",
            $starts_with!("j.endpoint", "?"),
            ") \
               AND (? IS NULL OR j.created_at >= ?) \
               AND (? IS NULL OR j.created_at < ?) \
             ORDER BY j.id LIMIT ?"
        );
    };
}
pub(crate) use spelled_sql;
