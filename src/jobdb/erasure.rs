//! The JobDB side of erasure (`spindle erase`): the operator command that ends a bucket's jobs
//! still in flight, the count of those not ended yet, and the erasing of ended jobs (payload,
//! headers, answer bodies) and of the bucket's kept event envelopes, marked `erased_at`. Ids,
//! times, states and error types stay: the log still says each job existed and how it ended.
//! Only ended jobs are erased, so a Director never sends an erased payload. Here a job has
//! *ended* once it is never sent again: a row that ends it, or `archiving` (its archive copy,
//! made later, then carries no payload either).

use chrono::{DateTime, Utc};

use super::engine::Pool;
use super::{with_pool, JobDb, JobDbError, MAX_IDS_PER_SELECT};
use crate::job::JobId;

/// Which jobs an erasure names: a bucket's, created before a time, optionally only those whose
/// idempotency key starts with a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    /// The bucket.
    pub bucket: String,
    /// Only jobs whose idempotency key starts with this (events are then left alone: they are
    /// the bucket's, not a key's).
    pub idempotency_key_prefix: Option<String>,
    /// Only jobs (and events) created before this instant.
    pub created_before: DateTime<Utc>,
}

impl Selector {
    /// Whether a job of `bucket` created at `created_at` with `idempotency_key` is named (the
    /// same conditions as the statements here, for the archive's records).
    pub fn names(
        &self,
        bucket: &str,
        created_at: DateTime<Utc>,
        idempotency_key: Option<&str>,
    ) -> bool {
        bucket == self.bucket
            && created_at < self.created_before
            && self
                .idempotency_key_prefix
                .as_deref()
                .is_none_or(|p| idempotency_key.is_some_and(|k| k.starts_with(p)))
    }

    /// Whether events of `bucket` created at `created_at` are named.
    pub fn names_event(&self, bucket: &str, created_at: DateTime<Utc>) -> bool {
        self.idempotency_key_prefix.is_none()
            && bucket == self.bucket
            && created_at < self.created_before
    }

    /// The prefix's length in characters (what `SUBSTR` counts in both engines).
    fn prefix_chars(&self) -> Option<i64> {
        self.idempotency_key_prefix
            .as_deref()
            .map(|p| i64::try_from(p.chars().count()).unwrap_or(i64::MAX))
    }
}

/// What one erasure pass changed in a JobDB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Erased {
    /// Jobs whose payload and headers were erased.
    pub jobs: u64,
    /// Transition rows whose answer body (or error text) was erased.
    pub answers: u64,
    /// Events whose kept envelope was erased.
    pub events: u64,
}

/// The jobs a selector names (binds: bucket, created before, the prefix three times (is it
/// given, its length, itself), after this id): the caller adds the rest.
macro_rules! named {
    () => {
        "FROM jobs j WHERE j.bucket = ? AND j.created_at < ? \
         AND (? IS NULL OR SUBSTR(j.idempotency_key, 1, ?) = ?) AND j.id > ? "
    };
}

/// Binds [`named!`]'s parameters to `$query`.
macro_rules! bind_named {
    ($query:expr, $selector:expr, $after:expr) => {
        $query
            .bind($selector.bucket.as_str())
            .bind($selector.created_before.naive_utc())
            .bind($selector.idempotency_key_prefix.as_deref())
            .bind($selector.prefix_chars())
            .bind($selector.idempotency_key_prefix.as_deref())
            .bind($after)
    };
}

/// The states after which a job is never sent again: its ends, and `archiving` (an expired
/// or flushed job waiting for its archive copy, which then carries no payload either).
macro_rules! sent_no_more {
    () => {
        "('succeeded', 'discarded', 'archived', 'moved', 'archiving')"
    };
}

/// Jobs never sent again not erased yet, a page at a time (binds: [`named!`], then a limit).
const ENDED_UNERASED: &str = concat!(
    "SELECT j.id ",
    named!(),
    "AND j.erased_at IS NULL AND EXISTS (SELECT 1 FROM job_state_transitions t \
     WHERE t.job_id = j.id AND t.state IN ",
    sent_no_more!(),
    ") ORDER BY j.id LIMIT ?"
);

/// How many jobs named may still be sent (binds: [`named!`]).
const NOT_ENDED: &str = concat!(
    "SELECT COUNT(*) ",
    named!(),
    "AND NOT EXISTS (SELECT 1 FROM job_state_transitions t WHERE t.job_id = j.id \
     AND t.state IN ",
    sent_no_more!(),
    ")"
);

/// The discard that ends jobs still in flight (binds: who, bucket, prefix, created before).
const ISSUE_DISCARD: &str = "INSERT INTO operator_commands \
     (issued_by, action, bucket, idempotency_key_prefix, created_before, reason) \
     VALUES (?, 'discard', ?, ?, ?, 'erased')";

/// A command's result: how many jobs it changed.
const RESULT: &str = "SELECT jobs FROM operator_command_results WHERE command_id = ?";

/// Erases jobs by id: the caller binds the time, adds [`ERASE_JOBS_BY_ID`], the ids, `)`.
const ERASE_JOBS: &str = "UPDATE jobs SET payload = X'', headers = '{}', erased_at = ";

/// The rest of [`ERASE_JOBS`] before its ids.
const ERASE_JOBS_BY_ID: &str = " WHERE erased_at IS NULL AND id IN (";

/// Erases the answer bodies (and error texts) of jobs by id, keeping the notes of operator
/// commands, which say who ended a job and why (the caller binds the ids and closes the list).
const ERASE_ANSWERS: &str = "UPDATE job_state_transitions SET error_response = NULL, \
     error_response_encoding = NULL WHERE error_response IS NOT NULL \
     AND (error_type IS NULL OR error_type NOT LIKE 'operator-%') AND job_id IN (";

/// Erases a bucket's kept event envelopes (binds: the time, bucket, created before).
const ERASE_EVENTS: &str = "UPDATE events SET payload = NULL, erased_at = ? \
     WHERE bucket = ? AND created_at < ? AND erased_at IS NULL";

impl JobDb {
    /// Appends the `discard` command (reason `erased`) that ends the jobs `selector` names
    /// that wait for an attempt, for the owning Director to apply; returns its id.
    pub async fn issue_erasing_discard(
        &self,
        selector: &Selector,
        issued_by: &str,
    ) -> Result<u64, JobDbError> {
        let bucket = selector.bucket.as_str();
        let prefix = selector.idempotency_key_prefix.as_deref();
        let before = selector.created_before.naive_utc();
        let id = match &self.pool {
            Pool::MySql(p) => {
                let query = sqlx::query(ISSUE_DISCARD).bind(issued_by).bind(bucket);
                let done = query.bind(prefix).bind(before).execute(p).await?;
                done.last_insert_id()
            }
            Pool::Sqlite(p) => {
                let query = sqlx::query(ISSUE_DISCARD).bind(issued_by).bind(bucket);
                let done = query.bind(prefix).bind(before).execute(p).await?;
                let id = done.last_insert_rowid();
                u64::try_from(id).map_err(|_| JobDbError::Corrupt(format!("command id {id}")))?
            }
        };
        Ok(id)
    }

    /// How many jobs command `id` changed, once the owner has applied it.
    pub async fn command_result(&self, id: u64) -> Result<Option<u64>, JobDbError> {
        let jobs: Option<u32> = with_pool!(self, |p, q| {
            sqlx::query_scalar(RESULT)
                .bind(super::int(id))
                .fetch_optional(p)
                .await?
        });
        Ok(jobs.map(u64::from))
    }

    /// How many jobs `selector` names have not ended (waiting, or under way).
    pub async fn not_ended(&self, selector: &Selector) -> Result<u64, JobDbError> {
        let n: i64 = with_pool!(self, |p, q| {
            let query = sqlx::query_scalar(NOT_ENDED);
            bind_named!(query, selector, Vec::<u8>::new())
                .fetch_one(p)
                .await?
        });
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Erases every ended job `selector` names that is not erased yet, a page of ids per
    /// statement, and (without a key prefix) the bucket's kept event envelopes. Marks each
    /// `erased_at = now`. Running it again changes nothing.
    pub async fn erase_ended(
        &self,
        selector: &Selector,
        now: DateTime<Utc>,
    ) -> Result<Erased, JobDbError> {
        let mut erased = Erased::default();
        let mut after: Vec<u8> = Vec::new();
        loop {
            let ids: Vec<JobId> = with_pool!(self, |p, q| {
                let query = sqlx::query(ENDED_UNERASED);
                bind_named!(query, selector, after.clone())
                    .bind(MAX_IDS_PER_SELECT as i64)
                    .fetch_all(p)
                    .await?
                    .iter()
                    .map(|row| q::job_id_of(row, "id"))
                    .collect::<Result<_, _>>()?
            });
            let Some(last) = ids.last() else { break };
            after = last.to_bytes().to_vec();
            let (jobs, answers) = with_pool!(self, |p, q| {
                let mut tx = p.begin().await?;
                let mut jobs = sqlx::QueryBuilder::<q::Db>::new(ERASE_JOBS);
                jobs.push_bind(now.naive_utc()).push(ERASE_JOBS_BY_ID);
                let mut list = jobs.separated(", ");
                for id in &ids {
                    list.push_bind(id.to_bytes().to_vec());
                }
                jobs.push(")");
                let jobs = jobs.build().execute(&mut *tx).await?.rows_affected();
                let answers = q::ids_query(ERASE_ANSWERS, &ids, ")")
                    .build()
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                (jobs, answers)
            });
            erased.jobs += jobs;
            erased.answers += answers;
        }
        if selector.idempotency_key_prefix.is_none() {
            erased.events = with_pool!(self, |p, q| {
                sqlx::query(ERASE_EVENTS)
                    .bind(now.naive_utc())
                    .bind(&selector.bucket)
                    .bind(selector.created_before.naive_utc())
                    .execute(p)
                    .await?
                    .rows_affected()
            });
        }
        Ok(erased)
    }

    /// Rebuilds the tables erasure changed, so the erased bytes leave the database's files
    /// (an UPDATE leaves them in freed pages until they are reused). MySQL: `OPTIMIZE TABLE`
    /// (InnoDB copies the rows to a new file, online); SQLite: `VACUUM`, then a checkpoint that
    /// empties the write-ahead log.
    pub async fn rebuild_erased_tables(&self) -> Result<(), JobDbError> {
        match &self.pool {
            Pool::MySql(p) => {
                sqlx::raw_sql("OPTIMIZE TABLE jobs, job_state_transitions, events")
                    .fetch_all(p)
                    .await?;
            }
            Pool::Sqlite(p) => {
                sqlx::raw_sql("VACUUM").execute(p).await?;
                sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                    .fetch_all(p)
                    .await?;
            }
        }
        Ok(())
    }
}
