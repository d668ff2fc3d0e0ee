//! The JobDB store: every SQL statement spindle runs against a JobDB, one named function each.
//!
//! A JobDB is one MySQL database (schema in `migrations/`) or, embedded, one SQLite file
//! (schema in `migrations/sqlite/`): [`JobDbUrl`] says which, and [`JobDb`] is the same store
//! over either. Its owner appends jobs and state transitions in fenced transactions
//! ([`JobDb::append`]); readers trace jobs and count states.
//!
//! # What the store can do
//! Every operation [`JobDb`] offers, by what it is for, with the file it lives in (all under
//! `src/jobdb/`). The SQL of each sits beside it, as a constant or a literal; what an engine
//! spells its own way is a constant of [`engine::mysql`] and [`engine::sqlite`].
//!
//! | Group      | Operation                                                     | File           |
//! |------------|---------------------------------------------------------------|----------------|
//! | open       | [`JobDb::open`], [`JobDb::open_with_lock_wait`] (migrating)   | `mod.rs`       |
//! | open       | [`JobDb::open_reader`], [`JobDb::open_peer`] (as is)          | `mod.rs`       |
//! | open       | [`JobDb::close`], [`JobDb::url`], [`JobDb::name`]             | `mod.rs`       |
//! | open       | [`JobDb::schema_version`] (the highest migration applied)     | `mod.rs`       |
//! | database   | [`create_database`], [`drop_database`]                        | `mod.rs`       |
//! | database   | [`probe`], [`databases_like`]                                 | `mod.rs`       |
//! | write path | [`JobDb::append`], [`JobDb::append_all`]                      | `write.rs`     |
//! | write path | [`JobDb::append_bounded`], [`JobDb::settle`]                  | `write.rs`     |
//! | write path | [`JobDb::commit_exists`], [`JobDb::transition_exists`]        | `write.rs`     |
//! | write path | [`JobDb::max_transition_id`], [`JobDb::max_row_bytes`]        | `write.rs`     |
//! | write path | what a write changes in `open_jobs` ([`OpenRow`], [`Fresh`])  | `open_jobs.rs` |
//! | reads      | [`JobDb::load_unfinished`], [`JobDb::open_work`]              | `mod.rs`       |
//! | reads      | [`JobDb::load_stranded`]                                      | `mod.rs`       |
//! | reads      | [`JobDb::backlog_page`], [`JobDb::next_due_after`]            | `mod.rs`       |
//! | reads      | [`JobDb::get_jobs`], [`JobDb::get_transitions`]               | `mod.rs`       |
//! | reads      | [`JobDb::all_transitions`], [`JobDb::count_jobs`]             | `mod.rs`       |
//! | reads      | [`JobDb::count_by_state`], [`JobDb::count_transitions_into`]  | `mod.rs`       |
//! | reads      | [`JobDb::existing_jobs`], [`JobDb::histories_of`]             | `lifecycle.rs` |
//! | reads      | [`JobDb::latest_of`]                                          | `lifecycle.rs` |
//! | listing    | [`JobDb::list_jobs`], [`JobDb::list_events`] (API pages)      | `listing.rs`   |
//! | ordering   | heads released, keys blocked in every write (`ordering_sql!`) | `ordering.rs`  |
//! | ordering   | [`JobDb::sequence_heads`], [`JobDb::sequences_elsewhere`]     | `ordering.rs`  |
//! | ordering   | [`JobDb::expired_held`], [`JobDb::max_open_position`]         | `ordering.rs`  |
//! | ordering   | [`JobDb::blocked_keys`], [`JobDb::forget_blocks`]             | `ordering.rs`  |
//! | notices    | owed and written in every write (`notices_sql!`)              | `notices.rs`   |
//! | notices    | [`JobDb::notices_owed`] (how many are owed)                   | `stats.rs`     |
//! | lifecycle  | [`JobDb::plan_moves`], [`JobDb::planned_moves`]               | `lifecycle.rs` |
//! | lifecycle  | [`JobDb::move_targets`], [`JobDb::origin_of`]                 | `lifecycle.rs` |
//! | lifecycle  | [`JobDb::plan_archive_batch`], [`JobDb::archive_batches_of`]  | `lifecycle.rs` |
//! | lifecycle  | [`JobDb::archive_batch`], [`JobDb::confirm_archive_batch`]    | `lifecycle.rs` |
//! | lifecycle  | [`JobDb::without_archived_history`]                           | `lifecycle.rs` |
//! | lifecycle  | [`JobDb::unfinished_count`], [`JobDb::data_bytes`]            | `lifecycle.rs` |
//! | lifecycle  | [`JobDb::delete_all_in_chunks`], [`JobDb::databases_like`]    | `lifecycle.rs` |
//! | owner      | [`JobDb::take_ownership`], [`JobDb::take_ownership_at`]       | `owner.rs`     |
//! | owner      | [`JobDb::owner`], [`JobDb::kill_stalled_transactions`]        | `owner.rs`     |
//! | owner      | [`JobDb::lock_connection`], [`JobDb::kill_connection`]        | `owner.rs`     |
//! | locks      | [`lock::ServerLock`]: `try_acquire`, `check`, `release`       | `lock.rs`      |
//! | commands   | [`JobDb::commands_after`], [`JobDb::unapplied_commands`]      | `commands.rs`  |
//! | commands   | [`JobDb::last_applied_command`]                               | `commands.rs`  |
//! | commands   | [`JobDb::record_command_result`], [`JobDb::command_targets`]  | `commands.rs`  |
//! | stats      | [`JobDb::transitions_per_slot`], [`JobDb::lane_backlog`]      | `stats.rs`     |
//! | stats      | [`JobDb::lane_attempts`], [`JobDb::lane_slots`]               | `stats.rs`     |
//! | stats      | [`JobDb::lane_errors`], [`JobDb::succeeded_by_attempts`]      | `stats.rs`     |
//! | stats      | [`JobDb::size`], [`JobDb::created_at`]                        | `stats.rs`     |
//! | stats      | [`JobDb::owner_record`], [`JobDb::ordering_counts`]           | `stats.rs`     |
//! | stats      | [`JobDb::jobs_with_idempotency_key`]                          | `stats.rs`     |
//! | stats      | [`JobDb::job_summaries`]                                      | `stats.rs`     |
//! | stats      | [`JobDb::server_writes`] (a benchmark's disk cost)            | `stats.rs`     |
//! | replay     | [`JobDb::ended_jobs`]                                         | `replay.rs`    |
//! | ledger     | [`JobDb::ledger_round`] (one round of the ledger, one snapshot) | `ledger.rs`  |
//! | events     | [`JobDb::event`], [`JobDb::event_sources`] (back-fill)        | `events.rs`    |
//! | erasure    | [`JobDb::issue_erasing_discard`], [`JobDb::command_result`]   | `erasure.rs`   |
//! | erasure    | [`JobDb::not_ended`], [`JobDb::erase_ended`]                  | `erasure.rs`   |
//! | erasure    | [`JobDb::rebuild_erased_tables`]                              | `erasure.rs`   |
//! | events     | [`JobDb::events_delivered_to`], [`JobDb::waiting_by_subscription`] | `events.rs` |
//!
//! # Layout
//! - this module: [`JobDb`] (open, close, the reads of jobs and their progress), the errors,
//!   and the operations on a database as a whole (create, probe, list, drop);
//! - [`url`]: [`JobDbUrl`] and [`Server`], where a JobDB lives;
//! - [`engine`]: one module per engine ([`engine::mysql`], [`engine::sqlite`]) holding
//!   everything that engine does its own way, and the macros that write each statement once
//!   over both (its module doc explains how);
//! - [`write`](mod@write): the write path, [`JobDb::append`] and the one function through which
//!   rows enter a JobDB; [`open_jobs`]: what a write changes in `open_jobs`;
//! - [`ordering`]: ordered keys: heads, releases, blocks, and what other JobDBs hold;
//! - [`notices`]: completion notices: owed, written with the row that ends a job;
//! - [`owner`]: the fencing token, and evicting a stalled previous owner;
//! - [`lock`]: exclusive ownership without Consul ([`lock::ServerLock`]: MySQL `GET_LOCK`, or
//!   a file lock beside a SQLite JobDB);
//! - [`commands`], [`lifecycle`], [`replay`], [`events`], [`stats`], [`ledger`],
//!   [`erasure`]: the statements of operator commands, of the JobDB lifecycle (imports,
//!   moves, archive batches), of replay, of events (one event's jobs, a back-fill's sources),
//!   of the dashboard, of the conservation ledger, and of erasure.
//!
//! The store names nothing above it: the Director's writer (which owns the requests it
//! takes), the archiver and the drainer use it.

mod append;
pub mod commands;
pub mod engine;
pub mod erasure;
pub mod events;
pub mod ledger;
pub mod lifecycle;
pub mod listing;
pub mod lock;
pub mod notices;
pub mod open_jobs;
pub mod ordering;
pub mod owner;
pub mod replay;
pub mod stats;
pub mod url;
pub mod write;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use chrono::{DateTime, Utc};

pub use engine::mysql::MIGRATOR;
pub use engine::sqlite::MIGRATOR as SQLITE_MIGRATOR;
pub(crate) use engine::with_pool;
use engine::{mysql, sqlite, Pool};
pub use open_jobs::{Fresh, OpenRow};
pub use ordering::{blocks_sequence, BlockedKey, Elsewhere, Head, OrderedEntry};
pub use url::SQLITE_SUFFIX;
pub use url::{JobDbUrl, Server};
pub(crate) use write::MAX_ROWS_PER_INSERT;
pub use write::{job_row_bytes, transition_row_bytes, Append, Bounds, CommitLog, Stalled, Written};

use crate::job::{Job, JobId, Progress, State, Transition};

/// Most ids in one `IN (...)` lookup.
pub(crate) const MAX_IDS_PER_SELECT: usize = 1000;

/// Whole jobs by id: the caller binds the ids and closes the list.
pub(crate) const SELECT_JOBS: &str =
    "SELECT id, bucket, endpoint, method, headers, payload, execution_timeout_ms, \
     backoff_min_delay_ms, backoff_coefficient, created_at, expire_at, idempotency_key, \
     on_complete, ordering_key, ordering_blocks, ordering_position, event_id, event_type, \
     subscription_id, traceparent, tracestate FROM jobs WHERE id IN (";

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
    /// The write was refused because a row's key exists already (a refusal of its own:
    /// jobs whose ids were minted elsewhere may have been stored by an earlier try).
    #[error("the jobdb refused a duplicate key: {0}")]
    Duplicate(String),
    /// The COMMIT was sent but its answer was lost: the transaction may or may not have
    /// committed. Only reading the JobDB tells.
    #[error("the commit's outcome is unknown")]
    CommitUnknown(#[source] sqlx::Error),
    /// The work before a bounded write's COMMIT ([`write::Bounds::work`]) did not finish in
    /// time: nothing was stored, and its connection was closed (not returned to the pool with
    /// a statement still running on the server).
    #[error("the jobdb did not finish the write in time; nothing was stored")]
    TimedOut,
    /// A bounded write's COMMIT got no answer in time ([`write::Bounds::commit`]): its
    /// connection was closed, and the outcome is unknown until [`JobDb::settle`] has made sure
    /// the server is done with that connection. Only then does reading the JobDB tell.
    #[error("the commit got no answer in time; its outcome is unknown")]
    CommitStalled(write::Stalled),
    /// A bounded write's `not_after` ([`write::Bounds::not_after`]) passed before its COMMIT:
    /// it was rolled back, nothing was stored.
    #[error("the write's not_after passed before its commit; nothing was stored")]
    Expired,
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
                | JobDbError::TimedOut
                | JobDbError::CommitStalled(_)
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

    /// Whether the JobDB is gone: the statement named a table or a database that does not
    /// exist (dropped under the caller, or before it came).
    pub fn is_gone(&self) -> bool {
        let JobDbError::Sql(sqlx::Error::Database(db)) = self else {
            return false;
        };
        // MySQL and MariaDB: ER_NO_SUCH_TABLE, ER_BAD_DB_ERROR; SQLite says it in words.
        db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| matches!(e.number(), 1146 | 1049))
            || db.message().starts_with("no such table")
    }
}

/// Creates the database if it does not exist (for SQLite: its directory and file). The name
/// was validated by [`JobDbUrl`], which is why it may be spliced into the statement
/// (identifiers cannot be bound).
pub async fn create_database(url: &JobDbUrl) -> Result<(), JobDbError> {
    match &url.server {
        Server::MySql(server) => mysql::create_database(server, &url.database).await,
        Server::Sqlite(dir) => sqlite::create_database(url, dir).await,
    }
}

/// Databases on `server` whose name matches a `LIKE` pattern (`%`, `_`, and `\` escaping
/// either): schemas of a MySQL server (read without opening any of them, so nothing is
/// migrated), or the JobDB files of a SQLite directory.
pub async fn databases_like(server: &Server, pattern: &str) -> Result<Vec<String>, JobDbError> {
    match server {
        Server::MySql(options) => mysql::databases_like(options, pattern).await,
        Server::Sqlite(dir) => sqlite::databases_like(dir, pattern).await,
    }
}

/// Opens and closes one connection to the database: fails at once with the server's or the
/// network's own error (a pool keeps retrying until its timeout, and then says only that).
/// A SQLite JobDB must exist.
pub async fn probe(url: &JobDbUrl) -> Result<(), JobDbError> {
    match &url.server {
        Server::MySql(_) => mysql::probe(url).await,
        Server::Sqlite(_) => sqlite::probe(url).await,
    }
}

/// Drops the database (one DROP instead of millions of DELETEs; for SQLite, deletes the file
/// and its WAL). Name validated by [`JobDbUrl`].
pub async fn drop_database(url: &JobDbUrl) -> Result<(), JobDbError> {
    match &url.server {
        Server::MySql(server) => mysql::drop_database(server, &url.database).await,
        Server::Sqlite(_) => sqlite::drop_database(url).await,
    }
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
        Self::open_with_lock_wait(url, create, max_connections, None).await
    }

    /// [`JobDb::open`], with every lock wait of its connections bounded by `lock_wait` (MySQL:
    /// `lock_wait_timeout` and `innodb_lock_wait_timeout`, whole seconds, at least one; SQLite:
    /// the busy timeout): a statement that waits longer for a lock (a global read lock, an
    /// `ALTER TABLE`'s metadata lock, a row lock, another writer of the file) fails, and the
    /// server rolls it back, instead of waiting a day. For a Director's own pool, whose writes
    /// must end in a bounded time.
    pub async fn open_with_lock_wait(
        url: &JobDbUrl,
        create: bool,
        max_connections: u32,
        lock_wait: Option<std::time::Duration>,
    ) -> Result<Self, JobDbError> {
        if create {
            create_database(url).await?;
        }
        let db = Self::connect(url, max_connections, lock_wait).await?;
        let migrated = with_pool!(db, |p, q| q::MIGRATOR.run(p).await);
        if let Err(e) = migrated {
            db.close().await;
            return Err(e.into());
        }
        Ok(db)
    }

    /// A pool to the JobDB, with its server's packet limit.
    async fn connect(
        url: &JobDbUrl,
        max_connections: u32,
        lock_wait: Option<std::time::Duration>,
    ) -> Result<Self, JobDbError> {
        let (pool, max_packet) = match &url.server {
            Server::MySql(_) => {
                let (pool, max_packet) = mysql::connect(url, max_connections, lock_wait).await?;
                (Pool::MySql(pool), max_packet)
            }
            Server::Sqlite(_) => {
                let (pool, max_packet) = sqlite::connect(url, max_connections, lock_wait).await?;
                (Pool::Sqlite(pool), max_packet)
            }
        };
        Ok(JobDb {
            pool,
            url: url.clone(),
            max_packet,
        })
    }

    /// Opens a JobDB for reading only (dashboards, replay): no migration is applied, so a
    /// reader of another release never changes the schema under the Directors; the schema must
    /// be at least this binary's (every migration it knows applied), or it is refused.
    pub async fn open_reader(url: &JobDbUrl, max_connections: u32) -> Result<Self, JobDbError> {
        let db = Self::connect(url, max_connections, None).await?;
        let (applied, migrator) = with_pool!(db, |p, q| {
            let applied: Result<Vec<i64>, _> =
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                    .fetch_all(p)
                    .await;
            (applied, &q::MIGRATOR)
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

    /// A reader of another Director's JobDB whatever its schema (a rolling upgrade leaves
    /// some a version behind), with its schema version (the highest migration applied):
    /// callers choose what they may ask of it (see [`JobDb::sequences_elsewhere`]).
    pub async fn open_peer(
        url: &JobDbUrl,
        max_connections: u32,
    ) -> Result<(Self, i64), JobDbError> {
        let db = Self::connect(url, max_connections, None).await?;
        match db.schema_version().await {
            Ok(version) => Ok((db, version)),
            Err(e) => {
                db.close().await;
                Err(e)
            }
        }
    }

    /// The highest migration applied to this JobDB (0 before the first).
    pub async fn schema_version(&self) -> Result<i64, JobDbError> {
        let version: Option<i64> = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(p)
                .await
        })?;
        Ok(version.unwrap_or(0))
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
        with_pool!(self, |p, q| p.close().await)
    }

    /// Every unfinished job with where it stands (the `open_work` view: `open_jobs`, jobs
    /// accepted and never rested, attempts under way; as many rows as unfinished jobs,
    /// whatever the history's length), with the job.
    pub async fn load_unfinished(&self) -> Result<Vec<(Job, Progress)>, JobDbError> {
        let progress: HashMap<JobId, Progress> = self
            .open_work()
            .await?
            .into_iter()
            .map(|w| (w.job_id, w.progress))
            .collect();
        self.with_jobs(progress, true).await
    }

    /// Every unfinished job with where it stands, and whether it has its `open_jobs` entry:
    /// the `open_work` view.
    pub async fn open_work(&self) -> Result<Vec<OpenWork>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT job_id, state, attempts, retry_at, started_in, started_at, listed \
                 FROM open_work",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(|row| {
                let listed: i64 = sqlx::Row::try_get(row, "listed")?;
                Ok(OpenWork {
                    job_id: q::job_id_of(row, "job_id")?,
                    progress: q::open_work_of(row)?,
                    listed: listed != 0,
                })
            })
            .collect()
        })
    }

    /// What a new owner must settle before serving: attempts under way when the previous
    /// owner stopped, expired jobs left `archiving` (both with their progress), and jobs it
    /// accepted that have no `open_jobs` entry (which must get one, so backlog passes find
    /// them). Only ids and progress: the jobs themselves come back through
    /// [`JobDb::backlog_page`]. The same as filtering [`JobDb::open_work`], in three narrow
    /// reads: a JobDB holding a million jobs scheduled for tomorrow is taken over with one
    /// index probe per entry, and none of them leaves the server.
    pub async fn load_stranded(&self) -> Result<Stranded, JobDbError> {
        let mut settle: BTreeMap<JobId, Progress> = BTreeMap::new();
        with_pool!(self, |p, q| {
            // Entries left `archiving` (or `executing`, by a version before schema 5), or
            // followed by a row (an attempt such a version began with an `executing` row).
            let rows = sqlx::query(
                "SELECT o.job_id, COALESCE(t.state, o.state) AS state, \
                        CAST(COALESCE(t.attempts, o.attempts) AS UNSIGNED) AS attempts, \
                        CASE WHEN t.id IS NULL THEN o.retry_at ELSE t.retry_at END AS retry_at, \
                        t.started_in, t.started_at \
                 FROM open_jobs o \
                 LEFT JOIN job_state_transitions t ON t.job_id = o.job_id AND t.id > o.transition_id \
                 WHERE (t.id IS NULL AND o.state IN ('executing', 'archiving')) \
                    OR t.state IN ('executing', 'archiving')",
            )
            .fetch_all(p)
            .await?;
            for row in &rows {
                settle.insert(q::job_id_of(row, "job_id")?, q::open_work_of(row)?);
            }
            // Attempts under way (their commit listed them; nothing ended them).
            let rows = sqlx::query(
                "SELECT job_id, 'executing' AS state, CAST(attempts AS UNSIGNED) AS attempts, \
                        NULL AS retry_at, started_in, started_at \
                 FROM attempts_under_way",
            )
            .fetch_all(p)
            .await?;
            for row in &rows {
                settle.insert(q::job_id_of(row, "job_id")?, q::open_work_of(row)?);
            }
            Ok::<(), JobDbError>(())
        })?;
        // With each ordered one's place: its entry must keep its sequence.
        let mut unlisted = self.fresh_places(false).await?;
        unlisted.sort_by_key(|(id, _)| *id);
        Ok(Stranded {
            settle: settle.into_iter().collect(),
            unlisted,
        })
    }

    /// Gives every job of `unlisted` (accepted by an owner that is gone, never rested: see
    /// [`JobDb::load_stranded`]) its `open_jobs` entry, numbered from `next_id`, in one
    /// fenced write: each ordered one held in its place (whether it was under way or waiting
    /// cannot be told; its sequence's head goes by position), so other JobDBs' reads and the
    /// next owner's book see it. What a new owner and a drainer do before anything else.
    /// Returns the next id.
    pub async fn enter_unlisted(
        &self,
        token: u64,
        next_id: u64,
        unlisted: &[(JobId, Option<crate::job::Place>)],
    ) -> Result<u64, JobDbError> {
        let rests: Vec<OpenRow> = unlisted
            .iter()
            .zip(next_id..)
            .map(|((job, place), id)| OpenRow {
                place: *place,
                ..OpenRow::resting(*job, id, None)
            })
            .collect();
        if !rests.is_empty() {
            let append = Append {
                rests: &rests,
                ..Append::default()
            };
            self.append_all(token, &append).await?;
        }
        Ok(next_id + rests.len() as u64)
    }

    /// Every fresh job (listed by its commit, no entry), or only the ordered ones, with its
    /// place if it is ordered: what a new owner lists again and what the dashboard counts.
    pub(crate) async fn fresh_places(
        &self,
        ordered_only: bool,
    ) -> Result<Vec<(JobId, Option<crate::job::Place>)>, JobDbError> {
        let sql = match ordered_only {
            true => format!("{}{}", ordering::FRESH_PLACES, ordering::FRESH_ORDERED),
            false => ordering::FRESH_PLACES.to_owned(),
        };
        with_pool!(self, |p, q| {
            let rows = sqlx::query(&sql).fetch_all(p).await?;
            let mut places = Vec::with_capacity(rows.len());
            for row in &rows {
                let id = q::job_id_of(row, "job_id")?;
                let place = match q::text_opt(row, "ordering_key")? {
                    None => None,
                    Some(key) => Some(crate::job::Place {
                        seq: crate::job::seq_of(
                            &q::text(row, "bucket")?,
                            &q::text(row, "endpoint")?,
                            &key,
                        ),
                        // Jobs of schema 8 have none: their id was their position.
                        position: match sqlx::Row::try_get::<Option<Vec<u8>>, _>(
                            row,
                            "ordering_position",
                        )? {
                            Some(_) => q::ulid_of(row, "ordering_position")?,
                            None => id.0,
                        },
                    }),
                };
                places.push((id, place));
            }
            Ok(places)
        })
    }

    /// The next `limit` jobs after `after` (in id order) that wait for an attempt, due by
    /// `due_by` (jobs never tried are always due), without their payloads and headers: the
    /// page a Director's cache reads when it has room. A job is in it when its latest
    /// transition is `awaiting-scheduling`, or `awaiting-retry` with `retry_at <= due_by` or
    /// an expiry by then (so it is archived on time), and that transition's id is below
    /// `before_row` (rows written since are the cache's own news). Reads `open_jobs`, with one
    /// key probe per job for an attempt under way (which is not waiting). A job never tried
    /// that waits (scheduled with `deliver_at`, or postponed) is due by `scheduled_by`
    /// instead, so a pass that reads every retry still leaves tomorrow's jobs in the JobDB.
    /// With `except_lane`, jobs of that lane (endpoint without query) are left out: a full
    /// cache held by one lane reads the others' jobs without reading that lane's again.
    pub async fn backlog_page(
        &self,
        after: Option<JobId>,
        due_by: DateTime<Utc>,
        scheduled_by: DateTime<Utc>,
        before_row: u64,
        limit: usize,
        except_lane: Option<&str>,
    ) -> Result<Vec<(Job, Progress)>, JobDbError> {
        let after = after.map_or_else(|| vec![0u8; 16], |id| id.to_bytes().to_vec());
        let progress: HashMap<JobId, Progress> = with_pool!(self, |p, q| {
            let query = sqlx::query(match except_lane {
                None => q::BACKLOG_PAGE,
                Some(_) => q::BACKLOG_PAGE_OTHER_LANES,
            })
            .bind(after)
            .bind(int(before_row))
            .bind(scheduled_by.naive_utc())
            .bind(scheduled_by.naive_utc())
            .bind(due_by.naive_utc())
            .bind(due_by.naive_utc());
            let query = match except_lane {
                Some(lane) => query.bind(lane),
                None => query,
            };
            query
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
    /// must look again before this instant. Two index look-ups on `open_jobs`. With
    /// `never_tried`, only jobs without an attempt count (those a pass of every retry left
    /// behind: see [`JobDb::backlog_page`]).
    pub async fn next_due_after(
        &self,
        after: DateTime<Utc>,
        never_tried: bool,
    ) -> Result<Option<DateTime<Utc>>, JobDbError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query(
                // ORDER BY .. LIMIT 1, not MIN(): with conditions beyond the index's columns
                // MIN() scanned the whole table (0.33 s beside a 425,000-entry backlog);
                // this walks the index from its first row after `after`.
                "SELECT (SELECT retry_at FROM open_jobs \
                         WHERE state = 'awaiting-retry' AND retry_at > ? \
                           AND (attempts = 0 OR ? = 0) AND held = 0 \
                         ORDER BY retry_at LIMIT 1) AS next_retry, \
                        (SELECT expire_at FROM open_jobs \
                         WHERE expire_at > ? AND (attempts = 0 OR ? = 0) AND held = 0 \
                           AND state IN ('awaiting-scheduling', 'awaiting-retry') \
                         ORDER BY expire_at LIMIT 1) AS next_expiry",
            )
            .bind(after.naive_utc())
            .bind(i64::from(never_tried))
            .bind(after.naive_utc())
            .bind(i64::from(never_tried))
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
                SELECT_JOBS
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

    /// A job's whole history with the ids of its steps, oldest first ([`crate::job::history`]:
    /// its rows, its acceptance and its attempts' starts).
    pub async fn get_transitions(&self, id: JobId) -> Result<Vec<(u64, Transition)>, JobDbError> {
        Ok(self
            .histories_of(&[id])
            .await?
            .remove(&id)
            .unwrap_or_default())
    }

    /// How many jobs are in each state now: the unfinished ones by `open_work`, the others by
    /// their terminal row (a job has at most one). Reads the open work and the terminal rows,
    /// not every history (for tests, benches and small JobDBs all the same).
    pub async fn count_by_state(&self) -> Result<HashMap<State, u64>, JobDbError> {
        let mut counts: HashMap<State, u64> = with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT state, COUNT(*) AS n FROM job_state_transitions \
                 WHERE state IN ('succeeded', 'discarded', 'archived', 'moved') GROUP BY state",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(|row| Ok((q::state_of(row)?, q::count_of(row, "n")?)))
            .collect::<Result<_, JobDbError>>()?
        });
        for w in self.open_work().await? {
            *counts.entry(w.progress.state).or_default() += 1;
        }
        Ok(counts)
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

    /// Every job's whole history ([`crate::job::history`]), ordered by job then step: for
    /// audits of small JobDBs (tests, benches, post-mortems), not for a hot path.
    pub async fn all_transitions(&self) -> Result<Vec<(u64, Transition)>, JobDbError> {
        let ids: Vec<JobId> = with_pool!(self, |p, q| {
            sqlx::query("SELECT id FROM jobs ORDER BY id")
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| q::job_id_of(row, "id"))
                .collect::<Result<_, JobDbError>>()?
        });
        let mut histories = self.histories_of(&ids).await?;
        Ok(ids
            .iter()
            .filter_map(|id| histories.remove(id))
            .flatten()
            .collect())
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

/// The latest time a JobDB column holds (MySQL's DATETIME ends with year 9999): "no bound"
/// in a query that compares times.
pub fn latest_time() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// An unfinished job, as the `open_work` view shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenWork {
    /// The job.
    pub job_id: JobId,
    /// Where it stands (`executing` for an attempt under way, with where it began).
    pub progress: Progress,
    /// Whether it has its `open_jobs` entry (else it is found through `commit_log`).
    pub listed: bool,
}

/// What a new owner settles before serving ([`JobDb::load_stranded`]).
#[derive(Debug, Default)]
pub struct Stranded {
    /// Attempts under way and expired jobs left `archiving`, with their progress.
    pub settle: Vec<(JobId, Progress)>,
    /// Unfinished jobs without an `open_jobs` entry, each ordered one with its place (it was
    /// born released: under way).
    pub unlisted: Vec<(JobId, Option<crate::job::Place>)>,
}

/// A `u64` as the `i64` SQLite binds (MySQL takes either): ids, tokens and counts stay far
/// below 2^63.
pub(crate) fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
