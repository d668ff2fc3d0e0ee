//! The write path: how rows enter a JobDB. What one transaction writes ([`Append`]: jobs, their
//! transitions and import origins, the commit's log row, rests, releases of ordered jobs) and
//! what it did ([`Written`]); the per-engine functions that write it, `write_path!`, are the
//! one way rows enter `jobs` and `job_state_transitions`, whoever writes (the Director's
//! writer, a drainer, the archiver), keeping `open_jobs` (each unfinished job's latest
//! resting state, see [`super::open_jobs`]) in step. What the same transaction does for
//! ordered keys and completion notices lives in [`super::ordering`] and [`super::notices`];
//! the `JobDb` methods that run it, in `append.rs`.
//!
//! Rows go in multi-row INSERTs chunked by bytes (below the server's packet limit) and by a
//! power-of-two number of rows (so a connection prepares few statement shapes and reuses them).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::open_jobs::{Fresh, OpenRow};
use crate::job::{EventRecord, Job, JobId, Recovered, Seq, State, Transition};

/// Most rows in one multi-row INSERT (MySQL allows 65,535 placeholders per statement, SQLite
/// 32,766). Chunks are powers of two up to this, so a connection prepares at most ten
/// statement shapes per table and reuses them, instead of a new statement per row count.
pub(crate) const MAX_ROWS_PER_INSERT: usize = 512;
/// Most bytes in one multi-row INSERT (every column counted), and at most half the server's
/// `max_allowed_packet`: a statement and its bound values travel as one packet.
pub(crate) const MAX_BYTES_PER_INSERT: usize = 4 * 1024 * 1024;
/// Room a statement needs besides its rows' bytes (text, per-value framing), per row and in all.
const ROW_OVERHEAD_BYTES: usize = 128;

/// One multi-row INSERT of jobs: the caller adds the rows.
pub(crate) const INSERT_JOBS: &str =
    "INSERT INTO jobs (id, bucket, endpoint, method, headers, payload, \
                 execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, created_at, \
                 expire_at, idempotency_key, on_complete, ordering_key, ordering_blocks, \
                 ordering_position, event_id, event_type, subscription_id, traceparent, \
                 tracestate) ";

/// Where an imported job came from (its `import_origins` row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The job (same id in both JobDBs).
    pub job_id: JobId,
    /// The retired JobDB it was moved out of.
    pub from_jobdb: String,
    /// When it was imported.
    pub imported_at: DateTime<Utc>,
}

/// An `events` row a write adds: the event's id, bucket, type, publication time, and the
/// envelope when no job here carries it.
pub(crate) struct EventRow<'a> {
    pub(crate) id: ulid::Ulid,
    pub(crate) bucket: &'a str,
    pub(crate) event_type: &'a str,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) envelope: Option<&'a [u8]>,
}

/// The `events` rows of a write: one per event among `jobs` (written with its first job, which
/// carries the envelope), and one per event kept without a job.
pub(crate) fn event_rows<'a>(jobs: &'a [Arc<Job>], kept: &'a [EventRecord]) -> Vec<EventRow<'a>> {
    let mut seen = std::collections::HashSet::new();
    let of_jobs = jobs.iter().filter_map(|job| {
        let e = job.event.as_ref().filter(|e| seen.insert(e.event_id))?;
        Some(EventRow {
            id: e.event_id,
            bucket: &job.bucket,
            event_type: &e.event_type,
            created_at: job.created_at,
            envelope: None,
        })
    });
    let kept = kept.iter().map(|e| EventRow {
        id: e.id,
        bucket: &e.bucket,
        event_type: &e.event_type,
        created_at: e.created_at,
        envelope: Some(&e.envelope[..]),
    });
    of_jobs.chain(kept).collect()
}

/// One multi-row INSERT of transitions: the caller adds the rows.
pub(crate) const INSERT_TRANSITIONS: &str =
    "INSERT INTO job_state_transitions (id, job_id, time, retry_at, attempts, state, \
                 error_type, error_response, error_response_encoding, response_status, \
                 duration_ms, started_in, started_at) ";

/// One multi-row INSERT of `open_jobs` entries: the caller adds the rows and the engine's
/// `UPSERT_OPEN_JOBS`.
pub(crate) const INSERT_OPEN_JOBS: &str =
    "INSERT INTO open_jobs (job_id, transition_id, state, attempts, retry_at, \
                 expire_at, seq, held, position, lane) ";

/// A commit's `commit_log` row (binds: id, time, accepted, started).
pub(crate) const INSERT_COMMIT_LOG: &str =
    "INSERT INTO commit_log (id, time, accepted, started) VALUES (?, ?, ?, ?)";

/// Sets the expiry of new entries that lack it from their jobs: the caller binds the ids and
/// closes the list.
pub(crate) const FILL_OPEN_EXPIRY: &str = "UPDATE open_jobs SET expire_at = \
                     (SELECT j.expire_at FROM jobs j WHERE j.id = open_jobs.job_id) \
                     WHERE expire_at IS NULL AND job_id IN (";

/// Deletes the entries of ended jobs: the caller binds the ids and closes the list.
pub(crate) const DELETE_OPEN_JOBS: &str = "DELETE FROM open_jobs WHERE job_id IN (";

/// Moves the checkpoint (binds: `open_from`).
pub(crate) const UPDATE_CHECKPOINT: &str = "UPDATE jobdb_checkpoint SET open_from = ? WHERE id = 1";

/// The write path of one engine: INSERT builders for each row type, `write_rows` (every row
/// a batch adds, and its `open_jobs` changes), the fenced commit, and which errors refuse the
/// data. It binds and runs the statements above. `$db` is the engine's sqlx database type;
/// the engine module provides `INSERT_ORIGINS`, `INSERT_EVENTS`, `UPSERT_OPEN_JOBS`, `FENCE_CHECK`,
/// `refused_code`, (from `engine::backlog_sql!`) `LANE_OPEN`, `LANE_CLOSE`, `LANE_OF_JOB`,
/// (from `engine::engine_common!`) `ids_query`, (from `ordering::ordering_sql!`)
/// `left_sequences`, `release_heads`, `release_jobs` and `head_jobs`, and (from
/// `notices::notices_sql!`) `owe_notices` and `write_notices`.
macro_rules! write_path {
    ($db:ty) => {
        /// One multi-row INSERT of jobs.
        fn insert_jobs(jobs: &[std::sync::Arc<$crate::job::Job>]) -> sqlx::QueryBuilder<'_, $db> {
            use $crate::jobdb::write::{headers_json, millis_u32};
            let mut qb = sqlx::QueryBuilder::<$db>::new($crate::jobdb::write::INSERT_JOBS);
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
                    .push_bind(job.idempotency_key.as_deref())
                    .push_bind(job.on_complete.as_deref())
                    .push_bind(job.ordering.as_ref().map(|o| &*o.key))
                    .push_bind(job.ordering.as_ref().is_some_and(|o| o.blocks))
                    .push_bind(
                        job.ordering
                            .as_ref()
                            .map(|o| o.position.to_bytes().to_vec()),
                    )
                    .push_bind(job.event.as_ref().map(|e| e.event_id.to_bytes().to_vec()))
                    .push_bind(job.event.as_ref().map(|e| &*e.event_type))
                    .push_bind(
                        job.event
                            .as_ref()
                            .map(|e| e.subscription.to_bytes().to_vec()),
                    )
                    .push_bind(job.trace.as_ref().map(|t| &*t.traceparent))
                    .push_bind(job.trace.as_ref().and_then(|t| t.tracestate.as_deref()));
            });
            qb
        }

        /// One multi-row INSERT of transitions.
        fn insert_transitions(
            rows: &[(u64, $crate::job::Transition)],
        ) -> sqlx::QueryBuilder<'_, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new($crate::jobdb::write::INSERT_TRANSITIONS);
            qb.push_values(rows, |mut row, (id, t)| {
                row.push_bind($crate::jobdb::int(*id))
                    .push_bind(t.job_id.to_bytes().to_vec())
                    .push_bind(t.time.naive_utc())
                    .push_bind(t.retry_at.map(|r| r.naive_utc()))
                    .push_bind(t.attempts)
                    .push_bind(t.state.as_str())
                    .push_bind(t.error_type.as_deref())
                    .push_bind(t.error_response.as_deref())
                    .push_bind(t.error_response_encoding)
                    .push_bind(t.response_status)
                    .push_bind(t.duration_ms)
                    .push_bind(t.started.map(|s| $crate::jobdb::int(s.commit)))
                    .push_bind(t.started.map(|s| s.at.naive_utc()));
            });
            qb
        }

        /// One multi-row INSERT of import origins (a repeated import keeps the first).
        fn insert_origins(origins: &[$crate::jobdb::write::Origin]) -> sqlx::QueryBuilder<'_, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new(INSERT_ORIGINS);
            qb.push_values(origins, |mut row, o| {
                row.push_bind(o.job_id.to_bytes().to_vec())
                    .push_bind(o.from_jobdb.as_str())
                    .push_bind(o.imported_at.naive_utc());
            });
            qb
        }

        /// One multi-row INSERT of events (a repeat, such as a moved job's, is ignored).
        fn insert_events<'a>(
            events: &'a [$crate::jobdb::write::EventRow<'a>],
        ) -> sqlx::QueryBuilder<'a, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new(INSERT_EVENTS);
            qb.push_values(events, |mut row, e| {
                row.push_bind(e.id.to_bytes().to_vec())
                    .push_bind(e.bucket)
                    .push_bind(e.event_type)
                    .push_bind(e.created_at.naive_utc())
                    .push_bind(e.envelope);
            });
            qb
        }

        /// One multi-row upsert of jobs' latest states into `open_jobs` (a job's `expire_at` is
        /// kept when the row does not name it; a new entry's lane is read from its job, which
        /// this transaction may have just written; an entry that moves to `archiving` leaves its
        /// sequence).
        pub(crate) fn upsert_open_jobs<'a>(
            rows: &'a [$crate::jobdb::OpenRow],
        ) -> sqlx::QueryBuilder<'a, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new($crate::jobdb::write::INSERT_OPEN_JOBS);
            qb.push_values(rows, |mut row, o| {
                row.push_bind(o.job_id.to_bytes().to_vec())
                    .push_bind($crate::jobdb::int(o.transition_id))
                    .push_bind(o.state.as_str())
                    .push_bind(o.attempts)
                    .push_bind(o.retry_at.map(|r| r.naive_utc()))
                    .push_bind(o.expire_at.map(|r| r.naive_utc()))
                    // A new entry of an ordered job waits for its turn, unless its job is
                    // under way; an entry's sequence, hold and position are never replaced by
                    // a later row (but `archiving` takes it out of its sequence:
                    // `UPSERT_OPEN_JOBS`).
                    .push_bind(o.place.map(|p| p.seq.to_vec()))
                    .push_bind(o.place.is_some() && !o.released)
                    .push_bind(o.place.map(|p| p.position.to_bytes().to_vec()));
                match &o.endpoint {
                    Some(endpoint) => row
                        .push(LANE_OPEN)
                        .push_bind_unseparated($crate::job::lane(endpoint).to_owned())
                        .push_unseparated(LANE_CLOSE),
                    None => row
                        .push(LANE_OF_JOB)
                        .push_bind_unseparated(o.job_id.to_bytes().to_vec())
                        .push_unseparated(")"),
                };
            });
            qb.push(UPSERT_OPEN_JOBS);
            qb
        }

        /// Writes everything `append` holds in `tx`: jobs, their transitions, import origins,
        /// the commit's log row, rests and the checkpoint, keeping `open_jobs` in step, and the
        /// completion notices of the jobs that end here: the one way rows enter `jobs` and
        /// `job_state_transitions`, whoever writes (the Director's writer, a drainer, the
        /// archiver). Statements of at most `limit` bytes of rows. Returns the notice jobs
        /// written (each resting in `open_jobs`, for its JobDB's owner to deliver), the
        /// ordered jobs released and the sequences whose turn may have moved.
        pub(crate) async fn write_rows(
            tx: &mut sqlx::Transaction<'_, $db>,
            append: &$crate::jobdb::write::Append<'_>,
            limit: usize,
        ) -> Result<$crate::jobdb::write::Written, $crate::jobdb::JobDbError> {
            use $crate::jobdb::open_jobs::open_changes;
            use $crate::jobdb::write::{
                chunks_by_size, job_row_bytes, transition_row_bytes, MAX_ROWS_PER_INSERT,
            };
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            // In id order: a commit's jobs come from requests that minted their ids at
            // different moments (a router's forwards most of all), and rows that reach the
            // clustered index out of order split its pages.
            let mut jobs = append.jobs.to_vec();
            jobs.sort_unstable_by_key(|job| job.id);
            for chunk in chunks_by_size(&jobs, limit, |job| job_row_bytes(job)) {
                insert_jobs(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in chunks_by_size(append.transitions, limit, |(_, t)| transition_row_bytes(t))
            {
                insert_transitions(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in append.origins.chunks(MAX_ROWS_PER_INSERT) {
                insert_origins(chunk).build().execute(&mut **tx).await?;
            }
            let events = $crate::jobdb::write::event_rows(append.jobs, append.events);
            for chunk in chunks_by_size(&events, limit, |e| {
                e.envelope.map_or(0, <[u8]>::len) + e.bucket.len() + e.event_type.len() + 32
            }) {
                insert_events(chunk).build().execute(&mut **tx).await?;
            }
            owe_notices(tx, append).await?;
            let notices = write_notices(tx, append, limit).await?;
            let released_entries: std::collections::HashSet<$crate::job::JobId> =
                append.released_entries.iter().copied().collect();
            let changes = open_changes(&$crate::jobdb::open_jobs::Rows {
                jobs: append.jobs,
                transitions: append.transitions,
                rests: append.rests,
                fresh: append.fresh,
                released: &released_entries,
            });
            // Read before the upsert and the delete below take them out of their sequences.
            let ends = append.last_rows();
            let (left, blocks_written) =
                left_sequences(tx, append.read_left, &ends, append.blocks).await?;
            for chunk in changes.open.chunks(MAX_ROWS_PER_INSERT) {
                upsert_open_jobs(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in changes.without_expiry.chunks(MAX_IDS_PER_SELECT) {
                ids_query($crate::jobdb::write::FILL_OPEN_EXPIRY, chunk, ")")
                    .build()
                    .execute(&mut **tx)
                    .await?;
            }
            for chunk in changes.closed.chunks(MAX_IDS_PER_SELECT) {
                ids_query($crate::jobdb::write::DELETE_OPEN_JOBS, chunk, ")")
                    .build()
                    .execute(&mut **tx)
                    .await?;
            }
            if let Some(open_from) = append.checkpoint {
                sqlx::query($crate::jobdb::write::UPDATE_CHECKPOINT)
                    .bind($crate::jobdb::int(open_from))
                    .execute(&mut **tx)
                    .await?;
            }
            let mut released = release_jobs(tx, append.release, None).await?;
            released.extend(release_heads(tx, append.release_if_head).await?);
            if !append.release_expired.is_empty() {
                let now = chrono::Utc::now();
                released.extend(release_jobs(tx, append.release_expired, Some(now)).await?);
            }
            // A head whose attempt begins here, when it is due by the log row's time: listed
            // by it as started.
            let begin: std::collections::HashSet<$crate::job::JobId> =
                append.begin.iter().copied().collect();
            let (started, released): (Vec<_>, Vec<_>) =
                released.into_iter().partition(|r| append.begins(r, &begin));
            // Last: it lists the attempts the releases above began.
            if let Some(log) = &append.log {
                let begun: Vec<($crate::job::JobId, u16)> = started
                    .iter()
                    .map(|r| (r.job.id, r.next_attempt()))
                    .collect();
                sqlx::query($crate::jobdb::write::INSERT_COMMIT_LOG)
                    .bind($crate::jobdb::int(log.id))
                    .bind(log.time.naive_utc())
                    .bind(log.accepted_json())
                    .bind(log.started_json(&begun))
                    .execute(&mut **tx)
                    .await?;
            }
            Ok($crate::jobdb::write::Written {
                notices,
                released,
                started,
                left,
                blocks_written,
            })
        }

        /// Checks the fencing token, as the last statement of `tx` before its COMMIT: rolls
        /// `tx` back and fails with `Fenced` unless it is ours. Returns the connection's id (0
        /// where the engine has none).
        pub async fn check_fence(
            mut tx: sqlx::Transaction<'_, $db>,
            token: u64,
        ) -> Result<(sqlx::Transaction<'_, $db>, u64), $crate::jobdb::JobDbError> {
            use $crate::jobdb::JobDbError;
            let (current, connection): (u64, u64) =
                sqlx::query_as(FENCE_CHECK).fetch_one(&mut *tx).await?;
            if current != token {
                tx.rollback().await?;
                return Err(JobDbError::Fenced {
                    ours: token,
                    current,
                });
            }
            Ok((tx, connection))
        }

        /// Checks the fencing token as the last statement of `tx` and commits only if it is
        /// ours.
        pub async fn commit_fenced(
            tx: sqlx::Transaction<'_, $db>,
            token: u64,
        ) -> Result<(), $crate::jobdb::JobDbError> {
            use $crate::jobdb::JobDbError;
            let (tx, _) = check_fence(tx, token).await?;
            // Past this point a failure may come after the server committed.
            tx.commit().await.map_err(JobDbError::CommitUnknown)
        }

        /// Why the server refused a write for good (its data, not the connection), or `None`
        /// when the error may pass (connection lost, deadlock, lock wait, pool).
        pub fn refusal(e: &sqlx::Error) -> Option<String> {
            match e {
                sqlx::Error::Encode(why) => Some(format!("a value cannot be encoded: {why}")),
                sqlx::Error::Database(db) => {
                    use sqlx::error::ErrorKind;
                    let by_kind = !matches!(db.kind(), ErrorKind::Other);
                    (by_kind || refused_code(&**db)).then(|| db.message().to_owned())
                }
                _ => None,
            }
        }
    };
}
pub(crate) use write_path;

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

/// Pushes `rows` as chunks whose lengths are powers of two, largest first.
fn push_pow2<'a, T>(chunks: &mut Vec<&'a [T]>, mut rows: &'a [T]) {
    while !rows.is_empty() {
        let take = 1 << rows.len().ilog2();
        chunks.push(&rows[..take]);
        rows = &rows[take..];
    }
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
        + job.on_complete.as_ref().map_or(0, |url| url.len())
        + job.event.as_ref().map_or(0, |e| 32 + e.event_type.len())
        + job.trace.as_ref().map_or(0, |t| {
            t.traceparent.len() + t.tracestate.as_ref().map_or(0, |s| s.len())
        })
        + 64
}

/// The bytes a transition's row takes on the wire.
pub fn transition_row_bytes(t: &Transition) -> usize {
    16 + t.error_type.as_ref().map_or(0, String::len)
        + t.error_response.as_ref().map_or(0, Bytes::len)
        + 64
}

/// Everything one transaction writes. [`JobDb::append`](super::JobDb::append) fills in jobs
/// and transitions; the Director's writer adds its commit's log row, rests and the
/// checkpoint.
#[derive(Default)]
pub struct Append<'a> {
    /// New jobs.
    pub jobs: &'a [Arc<Job>],
    /// Events kept without a job (the events of `jobs` are written with them).
    pub events: &'a [EventRecord],
    /// Rows of `job_state_transitions`, with their ids.
    pub transitions: &'a [(u64, Transition)],
    /// Where imported jobs came from.
    pub origins: &'a [Origin],
    /// The commit's own `commit_log` row (the Director's writer writes one per transaction).
    pub log: Option<CommitLog<'a>>,
    /// Jobs that rest now without a row of their own (accepted, not tried, and waiting): their
    /// `open_jobs` entries, `awaiting-scheduling`.
    pub rests: &'a [OpenRow],
    /// Jobs accepted here that have no `open_jobs` entry yet (the writer knows them: accepted
    /// and never rested), with their expiry: a terminal row of theirs deletes nothing, and a
    /// resting one gets their expiry. Anyone else's terminal row deletes its entry.
    pub fresh: Option<&'a HashMap<JobId, Fresh>>,
    /// A new `jobdb_checkpoint.open_from`.
    pub checkpoint: Option<u64>,
    /// New ordered jobs whose entry goes in released (`held = 0`): they go at once. Every
    /// other new entry of an ordered job goes in held.
    pub released_entries: &'a [JobId],
    /// Held ordered jobs whose turn came (their writer's book says so): released, if still
    /// held and waiting for an attempt, and read back.
    pub release: &'a [JobId],
    /// Ordered jobs proposed as their sequence's head, each with its sequence, for sequences
    /// only the store holds: released if still the head when the transaction reads it.
    pub release_if_head: &'a [(Seq, JobId)],
    /// Held jobs whose expiry has passed: released (those still held and expired when the
    /// transaction reads them) so their owner's scheduler ends them, which lets their
    /// sequences go on; never tried.
    pub release_expired: &'a [JobId],
    /// Of the jobs released here, those whose attempt begins in this commit when due by
    /// `log`'s time: listed by it as started. The attempt a job's end allows its successor
    /// then costs no commit of its own.
    pub begin: &'a [JobId],
    /// Leaving jobs whose sequence the store reads (returned), blocking it when a job that
    /// asked to block ends without success ([`super::ordering::blocks_sequence`]). A job the
    /// caller knows has none, or whose sequence it knows, need not be named.
    pub read_left: &'a [JobId],
    /// Keys blocked (carried by a drainer's move, or by fresh jobs whose end blocks them,
    /// which have no entry to read).
    pub blocks: &'a [super::BlockedKey],
}

impl Append<'_> {
    /// Whether `released`, released by this write, begins its attempt here (see
    /// [`Append::begin`]): it was asked to, there is a log row to list it, and it is due.
    pub(crate) fn begins(&self, released: &Recovered, begin: &HashSet<JobId>) -> bool {
        let Some(log) = &self.log else {
            return false;
        };
        begin.contains(&released.job.id) && released.retry_at.is_none_or(|at| at <= log.time)
    }

    /// Each job's last row of this write but an `executing` one, by job.
    pub(crate) fn last_rows(&self) -> HashMap<JobId, &Transition> {
        self.transitions
            .iter()
            .filter(|(_, t)| t.state != State::Executing)
            .map(|(_, t)| (t.job_id, t))
            .collect()
    }
}

/// A `commit_log` row: the commit that accepts jobs (which have no row of their own yet) and
/// begins attempts (which have no row until they end).
pub struct CommitLog<'a> {
    /// Its id, from the transition sequence.
    pub id: u64,
    /// When it was written.
    pub time: DateTime<Utc>,
    /// The jobs it accepts.
    pub accepted: &'a [JobId],
    /// The attempts it begins: job and attempt number.
    pub started: &'a [(JobId, u16)],
}

impl CommitLog<'_> {
    /// `accepted` as stored: a JSON array of hex ids, or NULL.
    pub(crate) fn accepted_json(&self) -> Option<String> {
        let all = self.accepted.len();
        if all == 0 {
            return None;
        }
        let mut out = String::with_capacity(2 + all * 35);
        out.push('[');
        for (i, id) in self.accepted.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_hex(&mut out, *id);
        }
        out.push(']');
        Some(out)
    }

    /// `started` and then `begun` (attempts of jobs the write released) as stored: a JSON
    /// array of `[hex id, attempt]`, or NULL.
    pub(crate) fn started_json(&self, begun: &[(JobId, u16)]) -> Option<String> {
        let all = self.started.len() + begun.len();
        if all == 0 {
            return None;
        }
        let mut out = String::with_capacity(2 + all * 42);
        out.push('[');
        for (i, (id, attempt)) in self.started.iter().chain(begun).enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('[');
            push_hex(&mut out, *id);
            out.push(',');
            // Writing to a String cannot fail.
            let _ = write!(out, "{attempt}");
            out.push(']');
        }
        out.push(']');
        Some(out)
    }
}

/// Appends `"HEXID"` (32 upper-case hex digits, as `HEX(id)` prints it).
fn push_hex(out: &mut String, id: JobId) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    out.push('"');
    for byte in id.to_bytes() {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out.push('"');
}

/// What one write did besides its rows.
#[derive(Debug, Default)]
pub struct Written {
    /// The completion notices written (jobs resting in `open_jobs`).
    pub notices: Vec<Arc<Job>>,
    /// The ordered jobs released (their turn came, or they expired), as resting jobs with
    /// their progress.
    pub released: Vec<Recovered>,
    /// Ordered jobs released whose attempt this commit began (see [`Append::begin`]), with
    /// the attempts they had before it: listed in its log row, not in `released`.
    pub started: Vec<Recovered>,
    /// Of [`Append::read_left`], the ordered jobs, with their sequences.
    pub left: Vec<(JobId, Seq)>,
    /// The sequences blocked by the jobs of [`Append::read_left`].
    pub blocks_written: Vec<Seq>,
}

/// How long a bounded write ([`JobDb::append_bounded`](super::JobDb::append_bounded)) may
/// take, and until when it may commit. `None`: no bound.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bounds {
    /// Most time for everything before the COMMIT (a connection, the statements, the fence
    /// check); past it nothing is stored.
    pub work: Option<Duration>,
    /// Most time for the COMMIT's answer; past it the outcome is unknown.
    pub commit: Option<Duration>,
    /// No COMMIT after this instant (checked after the fence check, right before the
    /// COMMIT): a router's claim deadline.
    pub not_after: Option<DateTime<Utc>>,
}

/// The connection of a COMMIT that got no answer in time, closed on our side: what
/// [`JobDb::settle`](super::JobDb::settle) needs to make sure the server is done with it.
#[derive(Debug)]
pub enum Stalled {
    /// A MySQL connection, by its id on the server.
    MySql(u64),
    /// A SQLite connection, still open: its worker thread may be running the COMMIT.
    Sqlite(sqlx::SqliteConnection),
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
