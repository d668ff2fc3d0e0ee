//! Completion notices: when a job that named an `on_complete` URL ends, a new job tells it.
//!
//! A job submitted with `on_complete` owes a notice from the commit that accepts it (a row of
//! `notices_owed`, written by `owe_notices` in the same transaction as its `jobs` row). The
//! write that ends it ([`tells_completion`]: succeeded, discarded, or expired or flushed) reads
//! what is owed, writes the notice ([`notice_job`]: a job of the same bucket to the URL, with
//! a JSON body saying how the job ended) resting in `open_jobs`, and deletes the debt, all in
//! that same transaction (`write_notices`): a job is told once, and never before its end is
//! durable. The JobDB's owner then delivers the notice as any other job.
//!
//! The statements are the constants below (both engines spell them alike, except
//! `INSERT_NOTICES_OWED`, a constant of each engine module); `notices_sql!` binds and runs them
//! for each engine's sqlx types, invoked by [`super::engine::mysql`] and
//! [`super::engine::sqlite`] beside `write_path!`.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use ulid::Ulid;

use crate::job::{Job, JobId, State, Transition};

/// The notices owed by some jobs, with what a notice says of its job: the caller binds the ids
/// and closes the list.
pub(crate) const OWED: &str = "SELECT o.job_id, j.bucket, j.endpoint, j.on_complete, j.created_at \
                     FROM notices_owed o JOIN jobs j ON j.id = o.job_id WHERE o.job_id IN (";

/// Deletes the debts of jobs told: the caller binds the ids and closes the list.
pub(crate) const DELETE_OWED: &str = "DELETE FROM notices_owed WHERE job_id IN (";

/// The completion notices of one engine: the debts of new jobs, and the notices of the jobs a
/// write ends. `$db` is the engine's sqlx database type; the engine module provides
/// `INSERT_NOTICES_OWED` (from `engine::spelled_sql!`), `insert_jobs` and `upsert_open_jobs`
/// (from `write::write_path!`), and (from `engine::engine_common!`) the decoders and
/// `ids_query`.
macro_rules! notices_sql {
    ($db:ty) => {
        /// Records that the jobs of `append` with an `on_complete` URL owe a notice
        /// (`notices_owed`), in the transaction that writes them.
        async fn owe_notices(
            tx: &mut sqlx::Transaction<'_, $db>,
            append: &$crate::jobdb::write::Append<'_>,
        ) -> Result<(), $crate::jobdb::JobDbError> {
            use $crate::jobdb::write::MAX_ROWS_PER_INSERT;
            let owed: Vec<$crate::job::JobId> = append
                .jobs
                .iter()
                .filter(|job| job.on_complete.is_some())
                .map(|job| job.id)
                .collect();
            for chunk in owed.chunks(MAX_ROWS_PER_INSERT) {
                let mut qb = sqlx::QueryBuilder::<$db>::new(INSERT_NOTICES_OWED);
                qb.push_values(chunk, |mut row, id| {
                    row.push_bind(id.to_bytes().to_vec());
                });
                qb.build().execute(&mut **tx).await?;
            }
            Ok(())
        }

        /// The completion notices of the jobs `append` ends that owe one (`notices_owed`, a
        /// small table: one look-up per commit that ends jobs, usually finding nothing): each
        /// a new job to the job's `on_complete` URL, resting in `open_jobs`, written in the
        /// same transaction as the row that ends its job, which then owes nothing.
        async fn write_notices(
            tx: &mut sqlx::Transaction<'_, $db>,
            append: &$crate::jobdb::write::Append<'_>,
            limit: usize,
        ) -> Result<Vec<std::sync::Arc<$crate::job::Job>>, $crate::jobdb::JobDbError> {
            use $crate::jobdb::notices::notice_job;
            use $crate::jobdb::write::{chunks_by_size, job_row_bytes, MAX_ROWS_PER_INSERT};
            use $crate::jobdb::{OpenRow, MAX_IDS_PER_SELECT};
            let ended = $crate::jobdb::notices::ended(append.transitions);
            if ended.is_empty() {
                return Ok(Vec::new());
            }
            let ids: Vec<$crate::job::JobId> = ended.keys().copied().collect();
            let now = chrono::Utc::now();
            let (mut notices, mut told) = (Vec::new(), Vec::new());
            for chunk in ids.chunks(MAX_IDS_PER_SELECT) {
                let rows = ids_query($crate::jobdb::notices::OWED, chunk, ")")
                    .build()
                    .fetch_all(&mut **tx)
                    .await?;
                for row in &rows {
                    let id = job_id_of(row, "job_id")?;
                    told.push(id);
                    let (Some(url), Some(end)) = (text_opt(row, "on_complete")?, ended.get(&id))
                    else {
                        continue;
                    };
                    notices.push(std::sync::Arc::new(notice_job(
                        id,
                        &text(row, "bucket")?,
                        &text(row, "endpoint")?,
                        &url,
                        time_of(row, "created_at")?,
                        end,
                        now,
                    )));
                }
            }
            for chunk in chunks_by_size(&notices, limit, |job| job_row_bytes(job)) {
                insert_jobs(chunk).build().execute(&mut **tx).await?;
            }
            let entries: Vec<OpenRow> = notices.iter().map(|job| OpenRow::notice(job)).collect();
            for chunk in entries.chunks(MAX_ROWS_PER_INSERT) {
                upsert_open_jobs(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in told.chunks(MAX_IDS_PER_SELECT) {
                ids_query($crate::jobdb::notices::DELETE_OWED, chunk, ")")
                    .build()
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(notices)
        }
    };
}
pub(crate) use notices_sql;

/// How long a completion notice is retried: as long as a job submitted without a time to
/// live.
pub const NOTICE_TTL: Duration = Duration::from_secs(4 * 3600);

/// Whether a job entering `state` has ended, so its `on_complete` URL is told: it succeeded,
/// was discarded, or expired or was flushed (`archiving`: the end; the archive only copies
/// it, and a job archived before schema 9 told at `archived`). A job `moved` goes on in
/// another JobDB. A job is told once: its `notices_owed` row goes with the first telling.
pub fn tells_completion(state: State) -> bool {
    matches!(
        state,
        State::Succeeded | State::Discarded | State::Archiving | State::Archived
    )
}

/// The rows of `transitions` that end a job (see [`tells_completion`]), by job.
pub(crate) fn ended(
    transitions: &[(u64, Transition)],
) -> std::collections::HashMap<JobId, &Transition> {
    transitions
        .iter()
        .filter(|(_, t)| tells_completion(t.state))
        .map(|(_, t)| (t.job_id, t))
        .collect()
}

/// The body of a completion notice: how the job ended.
#[derive(serde::Serialize)]
struct Notice<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    job_id: String,
    bucket: &'a str,
    endpoint: &'a str,
    state: &'static str,
    attempts: u16,
    response_status: Option<u16>,
    error_type: Option<&'a str>,
    created_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
}

/// The completion notice of job `job_id` (of `bucket`, sent to `endpoint`, accepted at
/// `created_at`) that ended with `end`: a job of the same bucket to `url`, a JSON body
/// (`type` `job.completed`, the job's id, bucket, endpoint, final state, attempts, last HTTP
/// status and error kind, and times), with the default timeout and backoff, `NOTICE_TTL` to
/// live, no notice of its own, and `notice:<job id>` as its idempotency key. It is signed as
/// any job of the bucket is.
pub fn notice_job(
    job_id: JobId,
    bucket: &str,
    endpoint: &str,
    url: &str,
    created_at: DateTime<Utc>,
    end: &Transition,
    now: DateTime<Utc>,
) -> Job {
    let body = Notice {
        kind: "job.completed",
        job_id: job_id.to_string(),
        bucket,
        endpoint,
        state: end.state.as_str(),
        attempts: end.attempts,
        response_status: end.response_status,
        error_type: end.error_type.as_deref(),
        created_at,
        ended_at: end.time,
    };
    let payload = serde_json::to_vec(&body).unwrap_or_default();
    let ttl = chrono::Duration::from_std(NOTICE_TTL).unwrap_or(chrono::Duration::zero());
    Job {
        id: JobId(Ulid::new()),
        bucket: bucket.into(),
        endpoint: url.into(),
        method: "POST".into(),
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        payload: Bytes::from(payload),
        execution_timeout: Duration::from_secs(10),
        retry: crate::job::RetryPolicy {
            min_delay: Duration::from_secs(1),
            coefficient: 2.0,
        },
        created_at: now,
        expire_at: now.checked_add_signed(ttl).unwrap_or(now),
        idempotency_key: Some(format!("notice:{job_id}")),
        on_complete: None,
        ordering: None,
        event: None,
        trace: None,
    }
}
