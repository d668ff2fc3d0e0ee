//! The control database: where subscriptions live (they outlive JobDB cycling, so not in a
//! JobDB). MySQL in production (`--control-db mysql://.../spindle_control`), a SQLite file
//! under `spindle dev`; the URL syntax is a JobDB's. Every statement is here, written once for
//! both engines (`with_pool!`); the schema is `migrations/control/`.
//!
//! Each change takes the next `control_version.version` inside its transaction and stamps its
//! row with it, so a cache that holds version `v` learns every later change by reading the
//! rows past `v` (the version row's lock orders the commits).

use chrono::{DateTime, Utc};
use sqlx::Row as _;
use ulid::Ulid;

use super::subscription::Stored;
use crate::jobdb::engine::{with_pool, Pool};
use crate::jobdb::{JobDbError, JobDbUrl, Server};

/// The control schema's migrations (`migrations/control/`), MySQL.
static MYSQL_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/control");
/// The same versions in SQLite's types (`migrations/control/sqlite/`).
static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/control/sqlite");

/// Serialises the migrations of one control database across processes (waits up to a minute).
const MIGRATION_LOCK: &str = "SELECT GET_LOCK(CONCAT('spindle-control-migrate:', DATABASE()), 60)";
const MIGRATION_UNLOCK: &str =
    "SELECT RELEASE_LOCK(CONCAT('spindle-control-migrate:', DATABASE()))";
const NEXT_VERSION: &str = "UPDATE control_version SET version = version + 1 WHERE id = 1";
/// Takes as many versions as the caller binds.
const ADVANCE_VERSION: &str = "UPDATE control_version SET version = version + ? WHERE id = 1";
/// The head of a multi-row insert (the caller pushes the rows).
const INSERT_ROWS: &str =
    "INSERT INTO subscriptions (id, bucket, enabled, removed, spec, version, created_at, updated_at) ";
/// Rows per statement of [`ControlDb::insert_many`].
const ROWS_PER_INSERT: usize = 500;
const READ_VERSION: &str = "SELECT version FROM control_version WHERE id = 1";
/// Stores a subscription unless its bucket has as many live ones as bound last (counted after
/// the version row's lock is taken, so two adds at once cannot both take the last place).
const INSERT: &str = "INSERT INTO subscriptions \
     (id, bucket, enabled, removed, spec, version, created_at, updated_at) \
     SELECT ?, ?, ?, 0, ?, ?, ?, ? FROM control_version WHERE id = 1 \
     AND (SELECT COUNT(*) FROM subscriptions WHERE bucket = ? AND removed = 0) < ?";
/// Replaces a live subscription's spec if it is still at the version its editor read.
const UPDATE: &str = "UPDATE subscriptions SET enabled = ?, spec = ?, version = ?, updated_at = ? \
     WHERE id = ? AND removed = 0 AND version = ?";
/// One live subscription, as an edit reads it before it writes.
const READ_ONE: &str =
    "SELECT id, enabled, removed, spec, version FROM subscriptions WHERE id = ? AND removed = 0";
const REMOVE: &str =
    "UPDATE subscriptions SET removed = 1, version = ?, updated_at = ? WHERE id = ? AND removed = 0";
const CHANGES: &str = "SELECT id, enabled, removed, spec, version FROM subscriptions \
     WHERE version > ? ORDER BY version LIMIT ?";

/// One change in its own transaction: takes the next version (the version row stays locked
/// until the commit), runs the statement `$query` builds with it, and commits. `Ok(None)`
/// when the statement changed no row (nothing is committed).
macro_rules! change {
    ($db:ident, |$version:ident| $query:expr) => {
        with_pool!($db, |p, _q| async {
            let mut tx = p.begin().await?;
            sqlx::query(NEXT_VERSION).execute(&mut *tx).await?;
            let v: i64 = sqlx::query_scalar(READ_VERSION).fetch_one(&mut *tx).await?;
            let $version = u64::try_from(v).unwrap_or(0);
            let done = $query.execute(&mut *tx).await?;
            if done.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(None);
            }
            tx.commit().await?;
            Ok::<_, StoreError>(Some($version))
        }
        .await)
    };
}

/// A `subscriptions` row as [`ChangedRow`], with the engine module `$q`'s decoders.
macro_rules! changed_row {
    ($q:ident, $row:expr) => {{
        let row = $row;
        let version: i64 = row.try_get("version")?;
        Ok::<_, StoreError>(ChangedRow {
            id: $q::ulid_of(row, "id")?,
            enabled: row.try_get("enabled")?,
            removed: row.try_get("removed")?,
            spec: $q::text(row, "spec")?,
            version: u64::try_from(version).unwrap_or(0),
        })
    }};
}

/// Most rows one read of changes returns (a cache reads on until it has them all).
const CHANGES_PER_READ: i64 = 5000;

/// Errors of the control database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or could not be reached.
    #[error(transparent)]
    Db(#[from] JobDbError),
    /// A row could not be encoded.
    #[error("subscription {0} cannot be encoded: {1}")]
    Encode(Ulid, String),
    /// Another process held the migration lock for a minute.
    #[error("another process has been migrating the control database for a minute")]
    Busy,
    /// The database refused a value for its size: the request can never succeed as it is.
    #[error("the control database refused a value as too long: {0}")]
    TooLarge(String),
    /// The bucket already has the most live subscriptions allowed.
    #[error("bucket {bucket:?} has {limit} subscriptions, the most allowed")]
    BucketFull {
        /// The bucket.
        bucket: String,
        /// The most it may have.
        limit: u64,
    },
}

/// SQLSTATE of a value too long for its column (MySQL 1406 in strict mode).
const DATA_TOO_LONG: &str = "22001";

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Database(d) if d.code().as_deref() == Some(DATA_TOO_LONG) => {
                StoreError::TooLarge(d.message().to_owned())
            }
            _ => StoreError::Db(e.into()),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError::Db(e.into())
    }
}

/// One changed row, as a cache reads it. `spec` is unchecked text: an operator may have
/// written it.
#[derive(Clone, Debug)]
pub struct ChangedRow {
    /// The subscription.
    pub id: Ulid,
    /// The `enabled` column (it wins over the spec's).
    pub enabled: bool,
    /// Removed: forget it.
    pub removed: bool,
    /// The `spec` JSON.
    pub spec: String,
    /// The change's version.
    pub version: u64,
}

/// A connection pool to the control database.
#[derive(Clone, Debug)]
pub struct ControlDb {
    pub(crate) pool: Pool,
    url: JobDbUrl,
}

impl ControlDb {
    /// Opens the control database at `url`, creating it (and its schema) when missing.
    pub async fn open(url: &JobDbUrl) -> Result<ControlDb, StoreError> {
        crate::jobdb::create_database(url).await?;
        let pool = match &url.server {
            Server::MySql(_) => {
                Pool::MySql(crate::jobdb::engine::mysql::connect(url, 4, None).await?.0)
            }
            Server::Sqlite(_) => {
                Pool::Sqlite(crate::jobdb::engine::sqlite::connect(url, 4, None).await?.0)
            }
        };
        match &pool {
            Pool::MySql(p) => {
                // Every Director and router of a site opens it, often at once on first boot.
                // sqlx's own migration lock does not hold on MariaDB (its `GET_LOCK(name, -1)`
                // does not wait there), so the migration runs under a lock of ours, on the
                // connection that holds it.
                let mut conn = p.acquire().await?;
                let locked: Option<i64> = sqlx::query_scalar(MIGRATION_LOCK)
                    .fetch_one(&mut *conn)
                    .await?;
                if locked != Some(1) {
                    return Err(StoreError::Busy);
                }
                let migrated = MYSQL_MIGRATOR.run_direct(&mut *conn).await;
                let _ = sqlx::query(MIGRATION_UNLOCK).execute(&mut *conn).await;
                migrated?;
            }
            // SQLite migrates each version in one transaction: a process that lost the race
            // rolled back and finds it applied the next time.
            Pool::Sqlite(p) => {
                crate::jobdb::engine::sqlite::retry_while(
                    9,
                    std::time::Duration::from_millis(50),
                    |_| true,
                    || SQLITE_MIGRATOR.run(p),
                )
                .await?;
            }
        }
        Ok(ControlDb {
            pool,
            url: url.clone(),
        })
    }

    /// Where it is (for logs; no password).
    pub fn url(&self) -> &JobDbUrl {
        &self.url
    }

    /// Stores a new subscription, unless its bucket already has `per_bucket` live ones;
    /// returns the change's version.
    pub async fn insert(
        &self,
        id: Ulid,
        stored: &Stored,
        per_bucket: u64,
    ) -> Result<u64, StoreError> {
        let spec = encode(id, stored)?;
        let enabled = stored.given.enabled.unwrap_or(true);
        let bucket = stored.given.bucket.as_str();
        let version = change!(self, |version| sqlx::query(INSERT)
            .bind(id.to_bytes().to_vec())
            .bind(bucket)
            .bind(enabled)
            .bind(spec)
            .bind(crate::jobdb::int(version))
            .bind(stored.created_at.naive_utc())
            .bind(stored.updated_at.naive_utc())
            .bind(bucket)
            .bind(crate::jobdb::int(per_bucket)))?;
        version.ok_or_else(|| StoreError::BucketFull {
            bucket: bucket.to_owned(),
            limit: per_bucket,
        })
    }

    /// Stores many new subscriptions in one transaction (an import; a benchmark's set-up),
    /// each with a version of its own, so that a cache reading changes a page at a time sees
    /// every one. Returns the last version.
    pub async fn insert_many(&self, rows: &[(Ulid, Stored)]) -> Result<u64, StoreError> {
        let count = i64::try_from(rows.len()).unwrap_or(i64::MAX);
        let mut encoded = Vec::with_capacity(rows.len());
        for (id, stored) in rows {
            encoded.push((*id, stored, encode(*id, stored)?));
        }
        with_pool!(self, |p, q| async {
            let mut tx = p.begin().await?;
            sqlx::query(ADVANCE_VERSION)
                .bind(count)
                .execute(&mut *tx)
                .await?;
            let last: i64 = sqlx::query_scalar(READ_VERSION).fetch_one(&mut *tx).await?;
            let mut version = last - count;
            for chunk in encoded.chunks(ROWS_PER_INSERT) {
                let mut query = sqlx::QueryBuilder::<q::Db>::new(INSERT_ROWS);
                query.push_values(chunk, |mut row, (id, stored, spec)| {
                    version += 1;
                    row.push_bind(id.to_bytes().to_vec())
                        .push_bind(stored.given.bucket.clone())
                        .push_bind(stored.given.enabled.unwrap_or(true))
                        .push_bind(false)
                        .push_bind(spec.clone())
                        .push_bind(version)
                        .push_bind(stored.created_at.naive_utc())
                        .push_bind(stored.updated_at.naive_utc());
                });
                query.build().execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok::<_, StoreError>(u64::try_from(last).unwrap_or(0))
        }
        .await)
    }

    /// Replaces a subscription's spec if its row is still at `read` (the version its editor
    /// read); `Ok(None)` when it is not (changed since, removed, or never was).
    pub async fn update(
        &self,
        id: Ulid,
        stored: &Stored,
        read: u64,
    ) -> Result<Option<u64>, StoreError> {
        let spec = encode(id, stored)?;
        let enabled = stored.given.enabled.unwrap_or(true);
        change!(self, |version| sqlx::query(UPDATE)
            .bind(enabled)
            .bind(spec)
            .bind(crate::jobdb::int(version))
            .bind(stored.updated_at.naive_utc())
            .bind(id.to_bytes().to_vec())
            .bind(crate::jobdb::int(read)))
    }

    /// A live subscription's row as it is now (not as a cache last read it).
    pub async fn read(&self, id: Ulid) -> Result<Option<ChangedRow>, StoreError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query(READ_ONE)
                .bind(id.to_bytes().to_vec())
                .fetch_optional(p)
                .await?;
            row.as_ref().map(|row| changed_row!(q, row)).transpose()
        })
    }

    /// Removes a subscription (its row stays, marked); `Ok(None)` when there is none.
    pub async fn remove(&self, id: Ulid, at: DateTime<Utc>) -> Result<Option<u64>, StoreError> {
        change!(self, |version| sqlx::query(REMOVE)
            .bind(crate::jobdb::int(version))
            .bind(at.naive_utc())
            .bind(id.to_bytes().to_vec()))
    }

    /// The latest version.
    pub async fn version(&self) -> Result<u64, StoreError> {
        with_pool!(self, |p, _q| {
            let v: i64 = sqlx::query_scalar(READ_VERSION).fetch_one(p).await?;
            Ok(u64::try_from(v).unwrap_or(0))
        })
    }

    /// Rows changed after version `after`, oldest change first, at most a page of them.
    pub async fn changes(&self, after: u64) -> Result<Vec<ChangedRow>, StoreError> {
        with_pool!(self, |p, q| {
            let rows = sqlx::query(CHANGES)
                .bind(crate::jobdb::int(after))
                .bind(CHANGES_PER_READ)
                .fetch_all(p)
                .await?;
            let changed = rows
                .iter()
                .map(|row| changed_row!(q, row))
                .collect::<Result<_, StoreError>>()?;
            Ok(changed)
        })
    }

    /// Closes the pool.
    pub async fn close(&self) {
        with_pool!(self, |p, _q| p.close().await)
    }
}

fn encode(id: Ulid, stored: &Stored) -> Result<String, StoreError> {
    serde_json::to_string(stored).map_err(|e| StoreError::Encode(id, e.to_string()))
}
