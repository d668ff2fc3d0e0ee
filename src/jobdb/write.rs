//! The write path: how rows enter a JobDB. [`JobDb::append`] (and
//! [`JobDb::append_with_origins`]) write jobs, their transitions and import origins in one
//! fenced transaction, keeping `open_jobs` (each unfinished job's latest resting state) in step;
//! the per-engine functions that do it, `write_path!`, are the one way rows enter `jobs` and
//! `job_state_transitions`, whoever writes (the Director's writer, a drainer, the archiver).
//!
//! The requests the Director's group-commit writer takes ([`WriteOp`]) and why one is not
//! made ([`WriteRejected`]) live here too, below everyone who sends them (the Director's
//! intake, imports, the scheduler, the archiver); the writer task is `director::writer`.
//!
//! Rows go in multi-row INSERTs chunked by bytes (below the server's packet limit) and by a
//! power-of-two number of rows (so a connection prepares few statement shapes and reuses them).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use ulid::Ulid;

use super::{int, lifecycle, with_pool, JobDb, JobDbError};
use crate::job::{AttemptStart, Job, JobId, Recovered, Seq, State, Transition};

/// Most rows in one multi-row INSERT (MySQL allows 65,535 placeholders per statement, SQLite
/// 32,766). Chunks are powers of two up to this, so a connection prepares at most ten
/// statement shapes per table and reuses them, instead of a new statement per row count.
pub(crate) const MAX_ROWS_PER_INSERT: usize = 512;
/// Most bytes in one multi-row INSERT (every column counted), and at most half the server's
/// `max_allowed_packet`: a statement and its bound values travel as one packet.
const MAX_BYTES_PER_INSERT: usize = 4 * 1024 * 1024;
/// Room a statement needs besides its rows' bytes (text, per-value framing), per row and in all.
const ROW_OVERHEAD_BYTES: usize = 128;

/// The write path of one engine: INSERT builders for each row type, `write_rows` (every row
/// a batch adds, and its `open_jobs` changes), the fenced commit, and which errors refuse the
/// data. `$db` is the engine's sqlx database type; the engine module provides `INSERT_ORIGINS`,
/// `UPSERT_OPEN_JOBS`, `FENCE_CHECK`, `refused_code`, (from `engine::backlog_sql!`)
/// `LANE_OPEN`, `LANE_CLOSE`, `LANE_OF_JOB` and (from `engine::engine_common!`) `ids_query`.
macro_rules! write_path {
    ($db:ty) => {
        /// One multi-row INSERT of jobs.
        fn insert_jobs(
            jobs: &[std::sync::Arc<$crate::job::Job>],
        ) -> sqlx::QueryBuilder<'_, $db> {
            use $crate::jobdb::write::{headers_json, millis_u32};
            let mut qb = sqlx::QueryBuilder::<$db>::new(
                "INSERT INTO jobs (id, bucket, endpoint, method, headers, payload, \
                 execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, created_at, \
                 expire_at, idempotency_key, on_complete, ordering_key, ordering_blocks) ",
            );
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
                    .push_bind(job.ordering.as_ref().is_some_and(|o| o.blocks));
            });
            qb
        }

        /// One multi-row INSERT of transitions.
        fn insert_transitions(
            rows: &[(u64, $crate::job::Transition)],
        ) -> sqlx::QueryBuilder<'_, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new(
                "INSERT INTO job_state_transitions (id, job_id, time, retry_at, attempts, state, \
                 error_type, error_response, error_response_encoding, response_status, \
                 duration_ms, started_in, started_at) ",
            );
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
        fn insert_origins(
            origins: &[$crate::jobdb::lifecycle::Origin],
        ) -> sqlx::QueryBuilder<'_, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new(INSERT_ORIGINS);
            qb.push_values(origins, |mut row, o| {
                row.push_bind(o.job_id.to_bytes().to_vec())
                    .push_bind(o.from_jobdb.as_str())
                    .push_bind(o.imported_at.naive_utc());
            });
            qb
        }

        /// One multi-row upsert of jobs' latest states into `open_jobs` (a job's `expire_at` is
        /// kept when the row does not name it; a new entry's lane is read from its job, which
        /// this transaction may have just written).
        pub(crate) fn upsert_open_jobs(
            rows: &[$crate::jobdb::write::OpenRow],
        ) -> sqlx::QueryBuilder<'_, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new(
                "INSERT INTO open_jobs (job_id, transition_id, state, attempts, retry_at, \
                 expire_at, seq, held, lane) ",
            );
            qb.push_values(rows, |mut row, o| {
                row.push_bind(o.job_id.to_bytes().to_vec())
                    .push_bind($crate::jobdb::int(o.transition_id))
                    .push_bind(o.state.as_str())
                    .push_bind(o.attempts)
                    .push_bind(o.retry_at.map(|r| r.naive_utc()))
                    .push_bind(o.expire_at.map(|r| r.naive_utc()))
                    // A new entry of an ordered job waits for its turn; an entry's sequence
                    // and hold are never replaced by a later row.
                    .push_bind(o.seq.map(|s| s.to_vec()))
                    .push_bind(o.seq.is_some());
                match &o.endpoint {
                    Some(endpoint) => row
                        .push(LANE_OPEN)
                        .push_bind_unseparated($crate::job::endpoint_key(endpoint).to_owned())
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
            use $crate::jobdb::write::{
                chunks_by_size, job_row_bytes, open_changes, transition_row_bytes,
                MAX_ROWS_PER_INSERT,
            };
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            for chunk in chunks_by_size(append.jobs, limit, |job| job_row_bytes(job)) {
                insert_jobs(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in chunks_by_size(append.transitions, limit, |(_, t)| {
                transition_row_bytes(t)
            }) {
                insert_transitions(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in append.origins.chunks(MAX_ROWS_PER_INSERT) {
                insert_origins(chunk).build().execute(&mut **tx).await?;
            }
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
            let notices = write_notices(tx, append, limit).await?;
            if let Some(log) = &append.log {
                sqlx::query(
                    "INSERT INTO commit_log (id, time, accepted, started) VALUES (?, ?, ?, ?)",
                )
                .bind($crate::jobdb::int(log.id))
                .bind(log.time.naive_utc())
                .bind(log.accepted_json())
                .bind(log.started_json())
                .execute(&mut **tx)
                .await?;
            }
            let changes = open_changes(append);
            for chunk in changes.open.chunks(MAX_ROWS_PER_INSERT) {
                upsert_open_jobs(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in changes.without_expiry.chunks(MAX_IDS_PER_SELECT) {
                ids_query(
                    "UPDATE open_jobs SET expire_at = \
                     (SELECT j.expire_at FROM jobs j WHERE j.id = open_jobs.job_id) \
                     WHERE expire_at IS NULL AND job_id IN (",
                    chunk,
                    ")",
                )
                .build()
                .execute(&mut **tx)
                .await?;
            }
            let mut touched: Vec<$crate::job::Seq> =
                changes.open.iter().filter_map(|o| o.seq).collect();
            touched.extend(ended_in_sequences(tx, append, &changes.closed).await?);
            for chunk in changes.closed.chunks(MAX_IDS_PER_SELECT) {
                ids_query("DELETE FROM open_jobs WHERE job_id IN (", chunk, ")")
                    .build()
                    .execute(&mut **tx)
                    .await?;
            }
            if let Some(open_from) = append.checkpoint {
                sqlx::query("UPDATE jobdb_checkpoint SET open_from = ? WHERE id = 1")
                    .bind($crate::jobdb::int(open_from))
                    .execute(&mut **tx)
                    .await?;
            }
            let mut released = release_heads(tx, append.release).await?;
            touched.sort_unstable();
            touched.dedup();
            if append.release_touched {
                let mut go = Vec::new();
                for chunk in touched.chunks(MAX_IDS_PER_SELECT) {
                    go.extend(sequence_heads(&mut **tx, Some(chunk)).await?.into_values());
                }
                released.extend(release_jobs(tx, &go).await?);
            }
            Ok($crate::jobdb::write::Written {
                notices,
                released,
                touched,
            })
        }

        /// The sequences of the ordered jobs among `closed` (jobs whose entries this
        /// transaction deletes), read before the delete; a job that asked to block its
        /// sequence and ends without success blocks it (`ordering_blocked`).
        async fn ended_in_sequences(
            tx: &mut sqlx::Transaction<'_, $db>,
            append: &$crate::jobdb::write::Append<'_>,
            closed: &[$crate::job::JobId],
        ) -> Result<Vec<$crate::job::Seq>, $crate::jobdb::JobDbError> {
            use sqlx::Row as _;
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            let mut seqs = Vec::new();
            if closed.is_empty() {
                return Ok(seqs);
            }
            let mut blocked = Vec::new();
            let ends = append.ended();
            for chunk in closed.chunks(MAX_IDS_PER_SELECT) {
                let rows = ids_query(
                    "SELECT o.job_id, o.seq, j.ordering_blocks FROM open_jobs o \
                     JOIN jobs j ON j.id = o.job_id \
                     WHERE o.seq IS NOT NULL AND o.job_id IN (",
                    chunk,
                    ")",
                )
                .build()
                .fetch_all(&mut **tx)
                .await?;
                for row in &rows {
                    let seq = seq_of_row(row, "seq")?;
                    seqs.push(seq);
                    let id = job_id_of(row, "job_id")?;
                    let blocks: bool = row.try_get("ordering_blocks")?;
                    if let Some(end) = ends.get(&id) {
                        if blocks && $crate::jobdb::write::blocks_sequence(end.state) {
                            blocked.push((seq, id, end.state, end.time));
                        }
                    }
                }
            }
            if !blocked.is_empty() {
                let mut qb = sqlx::QueryBuilder::<$db>::new(INSERT_ORDERING_BLOCKED);
                qb.push_values(&blocked, |mut row, (seq, id, state, at)| {
                    row.push_bind(seq.to_vec())
                        .push_bind(id.to_bytes().to_vec())
                        .push_bind(state.as_str())
                        .push_bind(at.naive_utc());
                });
                qb.build().execute(&mut **tx).await?;
            }
            Ok(seqs)
        }

        /// Releases each `(sequence, job)` of `candidates` whose job is still its sequence's
        /// head (see [`sequence_heads`], read again inside this transaction: an older job may
        /// have arrived since the caller looked), and returns them as resting jobs with where
        /// they stand.
        async fn release_heads(
            tx: &mut sqlx::Transaction<'_, $db>,
            candidates: &[($crate::job::Seq, $crate::job::JobId)],
        ) -> Result<Vec<$crate::job::Recovered>, $crate::jobdb::JobDbError> {
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let mut go = Vec::new();
            for chunk in candidates.chunks(MAX_IDS_PER_SELECT) {
                let seqs: Vec<$crate::job::Seq> = chunk.iter().map(|(s, _)| *s).collect();
                let heads = sequence_heads(&mut **tx, Some(&seqs)).await?;
                go.extend(
                    chunk
                        .iter()
                        .filter(|(seq, id)| heads.get(seq) == Some(id))
                        .map(|(_, id)| *id),
                );
            }
            go.sort_unstable();
            go.dedup();
            release_jobs(tx, &go).await
        }

        /// Releases the held jobs `go` (heads of their sequences) and returns them as
        /// resting jobs with where they stand.
        async fn release_jobs(
            tx: &mut sqlx::Transaction<'_, $db>,
            go: &[$crate::job::JobId],
        ) -> Result<Vec<$crate::job::Recovered>, $crate::jobdb::JobDbError> {
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            let mut released = Vec::with_capacity(go.len());
            for chunk in go.chunks(MAX_IDS_PER_SELECT) {
                ids_query(
                    "UPDATE open_jobs SET held = 0 WHERE held = 1 AND job_id IN (",
                    chunk,
                    ")",
                )
                .build()
                .execute(&mut **tx)
                .await?;
                let mut progress = std::collections::HashMap::new();
                let rows = ids_query(
                    "SELECT job_id, state, attempts, retry_at FROM open_jobs WHERE job_id IN (",
                    chunk,
                    ")",
                )
                .build()
                .fetch_all(&mut **tx)
                .await?;
                for row in &rows {
                    progress.insert(job_id_of(row, "job_id")?, progress_of(row)?);
                }
                let rows = ids_query($crate::jobdb::SELECT_JOBS, chunk, ")")
                    .build()
                    .fetch_all(&mut **tx)
                    .await?;
                for row in &rows {
                    let job = job_from_row(row)?;
                    if let Some(p) = progress.remove(&job.id) {
                        released.push($crate::job::Recovered {
                            job: std::sync::Arc::new(job),
                            attempts: p.attempts,
                            retry_at: p.retry_at,
                        });
                    }
                }
            }
            Ok(released)
        }

        /// The head of each of `seqs` (every sequence with `None`) that may go now: its oldest
        /// held job, when none of its jobs is released (one is under way) and no row of
        /// `ordering_blocked` stops it.
        pub(crate) async fn sequence_heads(
            conn: &mut <$db as sqlx::Database>::Connection,
            seqs: Option<&[$crate::job::Seq]>,
        ) -> Result<
            std::collections::HashMap<$crate::job::Seq, $crate::job::JobId>,
            $crate::jobdb::JobDbError,
        > {
            if seqs.is_some_and(|s| s.is_empty()) {
                return Ok(std::collections::HashMap::new());
            }
            let mut heads = oldest_by_seq(&mut *conn, true, seqs).await?;
            if heads.is_empty() {
                return Ok(heads);
            }
            let rows = seqs_query(
                "SELECT DISTINCT seq FROM open_jobs WHERE held = 0 AND seq",
                seqs,
                "",
            )
            .build()
            .fetch_all(&mut *conn)
            .await?;
            for row in &rows {
                heads.remove(&seq_of_row(row, "seq")?);
            }
            let rows = seqs_query("SELECT seq FROM ordering_blocked WHERE seq", seqs, "")
                .build()
                .fetch_all(&mut *conn)
                .await?;
            for row in &rows {
                heads.remove(&seq_of_row(row, "seq")?);
            }
            Ok(heads)
        }

        /// The oldest open job of each of `seqs` here, released or not: what another JobDB's
        /// head must not overtake.
        pub(crate) async fn sequence_oldest(
            conn: &mut <$db as sqlx::Database>::Connection,
            seqs: &[$crate::job::Seq],
        ) -> Result<
            std::collections::HashMap<$crate::job::Seq, $crate::job::JobId>,
            $crate::jobdb::JobDbError,
        > {
            let mut oldest = std::collections::HashMap::new();
            if seqs.is_empty() {
                return Ok(oldest);
            }
            // Released and held apart: each is one probe per sequence into the
            // `(seq, held, job_id)` index, where both at once walked every entry of each.
            for held in [false, true] {
                for (seq, head) in oldest_by_seq(&mut *conn, held, Some(seqs)).await? {
                    let entry = oldest.entry(seq).or_insert(head);
                    *entry = (*entry).min(head);
                }
            }
            Ok(oldest)
        }

        /// The oldest entry of each of `seqs` (every sequence with `None`) that is held, or
        /// released: one probe per sequence into the `(seq, held, job_id)` index.
        async fn oldest_by_seq(
            conn: &mut <$db as sqlx::Database>::Connection,
            held: bool,
            seqs: Option<&[$crate::job::Seq]>,
        ) -> Result<
            std::collections::HashMap<$crate::job::Seq, $crate::job::JobId>,
            $crate::jobdb::JobDbError,
        > {
            let prefix = match held {
                true => "SELECT seq, MIN(job_id) AS head FROM open_jobs WHERE held = 1 AND seq",
                false => "SELECT seq, MIN(job_id) AS head FROM open_jobs WHERE held = 0 AND seq",
            };
            let mut oldest = std::collections::HashMap::new();
            for row in &seqs_query(prefix, seqs, " GROUP BY seq")
                .build()
                .fetch_all(&mut *conn)
                .await?
            {
                oldest.insert(seq_of_row(row, "seq")?, job_id_of(row, "head")?);
            }
            Ok(oldest)
        }

        /// `prefix` + ` IN (` a bound list of `seqs` `)`, or ` IS NOT NULL` for every
        /// sequence, + `suffix`.
        fn seqs_query<'a>(
            prefix: &'a str,
            seqs: Option<&'a [$crate::job::Seq]>,
            suffix: &'a str,
        ) -> sqlx::QueryBuilder<'a, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new(prefix);
            match seqs {
                None => {
                    qb.push(" IS NOT NULL");
                }
                Some(seqs) => {
                    qb.push(" IN (");
                    let mut list = qb.separated(", ");
                    for seq in seqs {
                        list.push_bind(seq.to_vec());
                    }
                    qb.push(")");
                }
            }
            qb.push(suffix);
            qb
        }

        /// A 16-byte sequence id column.
        fn seq_of_row(
            row: &<$db as sqlx::Database>::Row,
            column: &str,
        ) -> Result<$crate::job::Seq, $crate::jobdb::JobDbError> {
            use sqlx::Row as _;
            let bytes: Vec<u8> = row.try_get(column)?;
            bytes.try_into().map_err(|b: Vec<u8>| {
                $crate::jobdb::JobDbError::Corrupt(format!(
                    "a sequence id of {} bytes in {column}",
                    b.len()
                ))
            })
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
            use $crate::jobdb::write::{
                chunks_by_size, job_row_bytes, notice_job, OpenRow, MAX_ROWS_PER_INSERT,
            };
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            let ended = append.ended();
            if ended.is_empty() {
                return Ok(Vec::new());
            }
            let ids: Vec<$crate::job::JobId> = ended.keys().copied().collect();
            let now = chrono::Utc::now();
            let (mut notices, mut told) = (Vec::new(), Vec::new());
            for chunk in ids.chunks(MAX_IDS_PER_SELECT) {
                let rows = ids_query(
                    "SELECT o.job_id, j.bucket, j.endpoint, j.on_complete, j.created_at \
                     FROM notices_owed o JOIN jobs j ON j.id = o.job_id WHERE o.job_id IN (",
                    chunk,
                    ")",
                )
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
                ids_query("DELETE FROM notices_owed WHERE job_id IN (", chunk, ")")
                    .build()
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(notices)
        }

        /// Checks the fencing token as the last statement of `tx` and commits only if it is
        /// ours.
        pub async fn commit_fenced(
            mut tx: sqlx::Transaction<'_, $db>,
            token: u64,
        ) -> Result<(), $crate::jobdb::JobDbError> {
            use $crate::jobdb::JobDbError;
            let current: u64 = sqlx::query_scalar(FENCE_CHECK).fetch_one(&mut *tx).await?;
            if current != token {
                tx.rollback().await?;
                return Err(JobDbError::Fenced {
                    ours: token,
                    current,
                });
            }
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

impl JobDb {
    /// The largest row (in [`job_row_bytes`] / [`transition_row_bytes`]) this JobDB can store:
    /// a bigger one is refused whatever else is in its batch.
    pub fn max_row_bytes(&self) -> usize {
        self.max_packet.saturating_sub(64 * 1024)
    }

    /// Most bytes of rows in one INSERT statement on this JobDB.
    pub(crate) fn max_statement_bytes(&self) -> usize {
        MAX_BYTES_PER_INSERT.min(self.max_packet / 2)
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
        self.append_all(
            token,
            &Append {
                jobs,
                transitions,
                ..Append::default()
            },
        )
        .await
        .map(drop)
    }

    /// Writes everything `append` holds in one fenced transaction (see [`JobDb::append`]),
    /// keeping `open_jobs` (each resting job's latest state) in step.
    ///
    /// What a failure means for the caller: [`JobDbError::Fenced`], another owner holds the
    /// JobDB; [`JobDbError::Refused`], the server (or the size check before sending) refused
    /// the data, nothing was stored and the same rows will be refused again;
    /// [`JobDbError::CommitUnknown`], the COMMIT's answer was lost; any other error happened
    /// before the COMMIT was sent, so nothing was stored and trying again may succeed. Returns
    /// what the write did besides its rows (see [`Written`]).
    pub async fn append_all(&self, token: u64, append: &Append<'_>) -> Result<Written, JobDbError> {
        let max_row = self.max_row_bytes();
        if let Some(job) = append.jobs.iter().find(|job| job_row_bytes(job) > max_row) {
            return Err(JobDbError::Refused(format!(
                "job {} takes {} bytes; this jobdb's server accepts rows of at most {max_row} \
                 (max_allowed_packet)",
                job.id,
                job_row_bytes(job)
            )));
        }
        if let Some((_, t)) = append
            .transitions
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
            let written: Result<Written, JobDbError> = async {
                let mut tx = p.begin().await?;
                let written = q::write_rows(&mut tx, append, limit).await?;
                q::commit_fenced(tx, token).await?;
                Ok(written)
            }
            .await;
            written.map_err(|e| match e {
                JobDbError::Sql(sql) => match q::refusal(&sql) {
                    Some(why) if is_duplicate(&sql) => JobDbError::Duplicate(why),
                    Some(why) => JobDbError::Refused(why),
                    None => JobDbError::Sql(sql),
                },
                other => other,
            })
        })
    }

    /// Whether the Director's commit `id` (its `commit_log` row) happened: tells, after a
    /// failed COMMIT, whether it did.
    pub async fn commit_exists(&self, id: u64) -> Result<bool, JobDbError> {
        let found: Option<u64> = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT id FROM commit_log WHERE id = ?")
                .bind(int(id))
                .fetch_optional(p)
                .await?
        });
        Ok(found.is_some())
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

    /// The highest id of the sequence taken so far (0 for an empty JobDB): of transitions,
    /// commits and entries of jobs that rested without a row. New ids continue from it (a row
    /// ends an attempt only with an id above the commit that began it).
    pub async fn max_transition_id(&self) -> Result<u64, JobDbError> {
        let max: Option<u64> = with_pool!(self, |p, q| {
            sqlx::query_scalar(
                "SELECT MAX(m) FROM (\
                 SELECT MAX(id) AS m FROM job_state_transitions \
                 UNION ALL SELECT MAX(id) FROM commit_log \
                 UNION ALL SELECT MAX(transition_id) FROM open_jobs) ids",
            )
            .fetch_one(p)
            .await?
        });
        Ok(max.unwrap_or(0))
    }
}

/// Whether the server refused a row because its key exists (either engine).
fn is_duplicate(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.kind(), sqlx::error::ErrorKind::UniqueViolation))
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
        + 64
}

/// The bytes a transition's row takes on the wire.
pub fn transition_row_bytes(t: &Transition) -> usize {
    16 + t.error_type.as_ref().map_or(0, String::len)
        + t.error_response.as_ref().map_or(0, Bytes::len)
        + 64
}

/// Everything one transaction writes. [`JobDb::append`] fills in jobs and transitions; the
/// Director's writer adds its commit's log row, rests and the checkpoint.
#[derive(Default)]
pub struct Append<'a> {
    /// New jobs.
    pub jobs: &'a [Arc<Job>],
    /// Rows of `job_state_transitions`, with their ids.
    pub transitions: &'a [(u64, Transition)],
    /// Where imported jobs came from.
    pub origins: &'a [lifecycle::Origin],
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
    /// Ordered jobs to release, each with its sequence: those still their sequence's head
    /// when the transaction reads it are.
    pub release: &'a [(Seq, JobId)],
    /// Release, in the same transaction, the head of every sequence this write adds a job to
    /// or ends one of: right only where no other JobDB is live (nothing elsewhere can be
    /// older), and it saves the sequencer's read and a commit per ordered job.
    pub release_touched: bool,
}

impl Append<'_> {
    /// The rows that end a job for good (succeeded, discarded, archived), by job.
    pub(crate) fn ended(&self) -> HashMap<JobId, &Transition> {
        self.transitions
            .iter()
            .filter(|(_, t)| tells_completion(t.state))
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
        if self.accepted.is_empty() {
            return None;
        }
        let mut out = String::with_capacity(2 + self.accepted.len() * 35);
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

    /// `started` as stored: a JSON array of `[hex id, attempt]`, or NULL.
    pub(crate) fn started_json(&self) -> Option<String> {
        if self.started.is_empty() {
            return None;
        }
        let mut out = String::with_capacity(2 + self.started.len() * 42);
        out.push('[');
        for (i, (id, attempt)) in self.started.iter().enumerate() {
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

/// A job its writer accepted that has no `open_jobs` entry yet: what its first entry takes
/// from it.
#[derive(Clone, Debug)]
pub struct Fresh {
    /// Its `expire_at`.
    pub expire_at: DateTime<Utc>,
    /// Its endpoint, shared with the job: the entry's lane is cut from it.
    pub endpoint: Arc<str>,
    /// Its ordered sequence, if any: its first entry is held until its turn.
    pub seq: Option<Seq>,
}

impl Fresh {
    /// What a job's first entry takes from it.
    pub fn of(job: &Job) -> Self {
        Fresh {
            expire_at: job.expire_at,
            endpoint: job.endpoint.clone(),
            seq: job.seq(),
        }
    }
}

/// A job's new latest state for `open_jobs`.
#[derive(Clone, Debug)]
pub struct OpenRow {
    /// The job.
    pub job_id: JobId,
    /// Its latest row, or for a job resting without one, an id of the sequence taken for it.
    pub transition_id: u64,
    /// Its state.
    pub state: State,
    /// Attempts started.
    pub attempts: u16,
    /// Its next attempt, when waiting for one.
    pub retry_at: Option<DateTime<Utc>>,
    /// Known for jobs written in the same batch or by the writer; else the stored value is
    /// kept (and a new entry reads it from `jobs`).
    pub expire_at: Option<DateTime<Utc>>,
    /// Its endpoint, known as `expire_at` is: a new entry's lane is cut from it, or read from
    /// `jobs` (a page behind the buffer pool) when it is not known. An entry keeps its lane.
    pub endpoint: Option<Arc<str>>,
    /// An ordered job's sequence, known as `endpoint` is: a new entry with one is held. An
    /// entry keeps its sequence and hold.
    pub seq: Option<Seq>,
}

impl OpenRow {
    /// The entry of a completion notice written now: it rests, never tried, until its
    /// JobDB's owner takes it in (the id 0 orders it before every row).
    pub fn notice(job: &Job) -> Self {
        OpenRow::resting(job.id, 0, Some(Fresh::of(job)))
    }

    /// The entry of a job that rests now without a row of its own: accepted, never tried;
    /// what the writer knows of it when it is fresh.
    pub fn resting(job_id: JobId, id: u64, fresh: Option<Fresh>) -> Self {
        let (expire_at, endpoint, seq) = match fresh {
            Some(f) => (Some(f.expire_at), Some(f.endpoint), f.seq),
            None => (None, None, None),
        };
        OpenRow {
            job_id,
            transition_id: id,
            state: State::AwaitingScheduling,
            attempts: 0,
            retry_at: None,
            expire_at,
            endpoint,
            seq,
        }
    }
}

/// How long a completion notice is retried: as long as a job submitted without a time to
/// live.
pub const NOTICE_TTL: Duration = Duration::from_secs(4 * 3600);

/// Whether a job entering `state` has ended for good, so its `on_complete` URL is told: it
/// succeeded, was discarded or was archived (a job `moved` goes on in another JobDB).
pub fn tells_completion(state: State) -> bool {
    matches!(state, State::Succeeded | State::Discarded | State::Archived)
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
    }
}

/// What a batch changes in `open_jobs`.
pub(crate) struct OpenChanges {
    /// Entries to insert or replace.
    pub(crate) open: Vec<OpenRow>,
    /// New entries whose expiry is not known here (read from `jobs`).
    pub(crate) without_expiry: Vec<JobId>,
    /// Entries to delete: jobs that ended.
    pub(crate) closed: Vec<JobId>,
}

/// What a batch changes in `open_jobs`: its rests, then each job's last row of the batch,
/// which replaces its entry or, when it is terminal, removes it (a job the writer knows has
/// none, `fresh`, removes nothing).
///
/// `executing` rows (JobDBs before schema 5 wrote them) are left out: an attempt's start
/// changes nothing there, so an entry holds a job's latest *resting* state.
pub(crate) fn open_changes(append: &Append<'_>) -> OpenChanges {
    let mut changes = OpenChanges {
        open: Vec::new(),
        without_expiry: Vec::new(),
        closed: Vec::new(),
    };
    let mut last: HashMap<JobId, usize> = HashMap::with_capacity(append.transitions.len());
    for (i, (_, t)) in append.transitions.iter().enumerate() {
        if t.state != State::Executing {
            last.insert(t.job_id, i);
        }
    }
    let rested: HashMap<JobId, &OpenRow> = append.rests.iter().map(|r| (r.job_id, r)).collect();
    for r in append.rests {
        if !last.contains_key(&r.job_id) {
            if r.expire_at.is_none() {
                changes.without_expiry.push(r.job_id);
            }
            changes.open.push(r.clone());
        }
    }
    if last.is_empty() {
        return changes;
    }
    let batch: HashMap<JobId, Fresh> = append
        .jobs
        .iter()
        .map(|job| (job.id, Fresh::of(job)))
        .collect();
    for (i, (id, t)) in append.transitions.iter().enumerate() {
        if last.get(&t.job_id) != Some(&i) {
            continue;
        }
        let fresh = append.fresh.and_then(|f| f.get(&t.job_id));
        let rest = rested.get(&t.job_id).copied();
        if t.state.is_terminal() {
            // A job the writer knows has no entry (accepted, never rested) deletes nothing.
            if fresh.is_none() || rest.is_some() {
                changes.closed.push(t.job_id);
            }
            continue;
        }
        let known = batch.get(&t.job_id);
        let expire_at = known
            .map(|f| f.expire_at)
            .or(rest.and_then(|r| r.expire_at))
            .or(fresh.map(|f| f.expire_at));
        let endpoint = known
            .map(|f| &f.endpoint)
            .or(rest.and_then(|r| r.endpoint.as_ref()))
            .or(fresh.map(|f| &f.endpoint))
            .cloned();
        let seq = known
            .and_then(|f| f.seq)
            .or(rest.and_then(|r| r.seq))
            .or(fresh.and_then(|f| f.seq));
        // The Director's writer knows every job it accepted and never rested (`fresh`);
        // any other job of its JobDB has an entry already, whose expiry stays. Elsewhere, or
        // for a rest that did not name it, a new entry reads its expiry from `jobs`.
        if expire_at.is_none() && (append.fresh.is_none() || rest.is_some()) {
            changes.without_expiry.push(t.job_id);
        }
        changes.open.push(OpenRow {
            job_id: t.job_id,
            transition_id: *id,
            state: t.state,
            attempts: t.attempts,
            retry_at: t.retry_at,
            expire_at,
            endpoint,
            seq,
        });
    }
    changes
}

/// Whether an ordered job ending in `state` blocks its sequence, when it asked to: it ended
/// without success (discarded, or archived on expiry); a job `moved` goes on elsewhere.
pub fn blocks_sequence(state: State) -> bool {
    matches!(state, State::Discarded | State::Archived)
}

/// What one write did besides its rows.
#[derive(Debug, Default)]
pub struct Written {
    /// The completion notices written (jobs resting in `open_jobs`).
    pub notices: Vec<Arc<Job>>,
    /// The ordered jobs released (their turn came), as resting jobs with their progress.
    pub released: Vec<Recovered>,
    /// The sequences of the ordered jobs this write added or ended: their head may go now.
    pub touched: Vec<Seq>,
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

/// A submission made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The transaction's id (what producers are told).
    pub transaction: Ulid,
    /// Jobs of a forwarded submission that an earlier try had stored already (not stored
    /// again, not handed to the scheduler again).
    pub already_present: usize,
}

/// Why a write was not made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteRejected {
    /// The JobDB could not be reached; nothing of the request was stored.
    #[error("the jobdb is unavailable; nothing was stored")]
    Unavailable,
    /// This Director lost its JobDB; nothing of the request was stored.
    #[error("this director no longer owns its jobdb; nothing was stored")]
    LockLost,
    /// The JobDB refused the request's data (`too_large`: a row is larger than its server
    /// accepts); nothing of the request was stored, and sending it again cannot help.
    #[error("the jobdb refused this request's data; nothing was stored")]
    Refused {
        /// A row is larger than the server's packet limit.
        too_large: bool,
    },
    /// The request's `not_after` passed before its batch was written; nothing was stored.
    #[error("not_after passed before the write; nothing was stored")]
    Expired,
}

/// A request to the writer.
#[derive(Debug)]
pub enum WriteOp {
    /// New jobs (their `jobs` rows are their acceptance; the commit's log row lists them);
    /// answered with the transaction id.
    Submit {
        /// The validated jobs.
        jobs: Vec<Arc<Job>>,
        /// Those of `jobs` that wait for a later first attempt: each gets its `scheduled` row
        /// (and so its `open_jobs` entry) in the same commit.
        scheduled: crate::job::Scheduled,
        /// Refused unless the batch is assembled by then (a router's claim deadline).
        not_after: Option<DateTime<Utc>>,
        /// The jobs' ids were minted elsewhere (a router's forward): an earlier try of the same
        /// request may have stored some. Those are skipped (and counted), not refused, found
        /// only when the JobDB refuses a duplicate, so a first try costs no read.
        forwarded: bool,
        /// Where the outcome goes once known.
        reply: oneshot::Sender<Result<Accepted, WriteRejected>>,
    },
    /// Jobs imported from a retired JobDB (each gets its `imported` row and its origin).
    Import {
        /// The jobs with their progress.
        jobs: Vec<Recovered>,
        /// The retired JobDB they come from.
        from_jobdb: String,
        /// Told once they are durable (or will never be).
        reply: oneshot::Sender<Result<(), WriteRejected>>,
    },
    /// State transitions of known jobs, optionally acknowledged after COMMIT.
    Transitions {
        /// Rows to append, in order.
        rows: Vec<Transition>,
        /// Told once the rows are durable (or will never be).
        done: Option<oneshot::Sender<Result<(), WriteRejected>>>,
    },
    /// Attempts to begin: the commit's log row lists them, and once it is durable their
    /// requests may be sent. `rows` (earlier outcomes) go first, in order.
    Start {
        /// Rows queued before these starts.
        rows: Vec<Transition>,
        /// Each job and the number of the attempt it begins.
        starts: Vec<(JobId, u16)>,
        /// Told where the attempts began once durable (or that they will not be).
        done: oneshot::Sender<Result<AttemptStart, WriteRejected>>,
    },
    /// Jobs accepted and never tried that wait in the JobDB only from now on (the cache has
    /// no room for them): each gets its `open_jobs` entry unless it has one, so backlog passes
    /// find it. `recovered`: jobs a previous owner accepted, which this writer does not know;
    /// they rest whatever it knows.
    Rest {
        /// The jobs.
        jobs: Vec<JobId>,
        /// A previous owner's jobs.
        recovered: bool,
        /// Told once their entries are durable (or will never be).
        done: Option<oneshot::Sender<Result<(), WriteRejected>>>,
    },
    /// Ordered jobs whose turn came (the sequencer found each its sequence's head): released
    /// in the commit if each still is, and handed to the scheduler after it.
    Release {
        /// Each sequence with the job at its head.
        heads: Vec<(Seq, JobId)>,
    },
    /// Answered, once everything queued before it is durable, with the first transition id
    /// after it: a read whose snapshot starts later sees every earlier row, and rows with
    /// lower ids are all the writes that came before it.
    Barrier(oneshot::Sender<u64>),
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
