//! The write path: how rows enter a JobDB. [`JobDb::append`] (and [`JobDb::append_all`],
//! [`JobDb::append_bounded`]) write jobs, their transitions and import origins in one fenced
//! transaction, keeping `open_jobs` (each unfinished job's latest resting state, see
//! [`super::open_jobs`]) in step; the per-engine functions that do it, `write_path!`, are the
//! one way rows enter `jobs` and `job_state_transitions`, whoever writes (the Director's
//! writer, a drainer, the archiver). What the same transaction does for ordered keys and
//! completion notices lives in [`super::ordering`] and [`super::notices`].
//!
//! Rows go in multi-row INSERTs chunked by bytes (below the server's packet limit) and by a
//! power-of-two number of rows (so a connection prepares few statement shapes and reuses them).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::notices::tells_completion;
use super::open_jobs::{Fresh, OpenRow};
use super::{int, lifecycle, with_pool, JobDb, JobDbError};
use crate::job::{Job, JobId, Recovered, Seq, State, Transition};

/// Most rows in one multi-row INSERT (MySQL allows 65,535 placeholders per statement, SQLite
/// 32,766). Chunks are powers of two up to this, so a connection prepares at most ten
/// statement shapes per table and reuses them, instead of a new statement per row count.
pub(crate) const MAX_ROWS_PER_INSERT: usize = 512;
/// Most bytes in one multi-row INSERT (every column counted), and at most half the server's
/// `max_allowed_packet`: a statement and its bound values travel as one packet.
const MAX_BYTES_PER_INSERT: usize = 4 * 1024 * 1024;
/// Room a statement needs besides its rows' bytes (text, per-value framing), per row and in all.
const ROW_OVERHEAD_BYTES: usize = 128;

/// One multi-row INSERT of jobs: the caller adds the rows.
pub(crate) const INSERT_JOBS: &str =
    "INSERT INTO jobs (id, bucket, endpoint, method, headers, payload, \
                 execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, created_at, \
                 expire_at, idempotency_key, on_complete, ordering_key, ordering_blocks, \
                 ordering_position, event_id, event_type, subscription_id) ";

/// The first job of each event among `jobs` (an event's row is written with its jobs).
pub(crate) fn events_of(jobs: &[Arc<Job>]) -> Vec<&Job> {
    let mut seen = std::collections::HashSet::new();
    jobs.iter()
        .filter(|job| job.event.as_ref().is_some_and(|e| seen.insert(e.event_id)))
        .map(|job| &**job)
        .collect()
}

/// Takes out of `open` the new ordered jobs this write keeps (see [`Append::keep`]) and
/// returns them: each among `new` (no row of its own: see `Arrivals::new`), due now, not
/// born (born ones left `open` already), of a sequence the writer knows (so something goes
/// before it), while memory has room.
pub(crate) fn keep_new(
    append: &Append<'_>,
    new: &HashSet<JobId>,
    open: &mut Vec<OpenRow>,
) -> Vec<JobId> {
    let mut kept = Vec::new();
    let may = append.keep
        && append.release_touched
        && append.log.is_some()
        && !append.born_with_entry
        && append.cleared.is_none();
    if !may || !open.iter().any(|o| o.place.is_some() && !o.released) {
        return kept;
    }
    let new: HashMap<JobId, &Arc<Job>> = append
        .jobs
        .iter()
        .filter(|job| job.ordering.is_some() && new.contains(&job.id))
        .map(|job| (job.id, job))
        .collect();
    append.with_known(|known| {
        open.retain(|o| {
            let (Some(place), Some(job)) = (o.place, new.get(&o.job_id)) else {
                return true;
            };
            let due_now = o.state == State::AwaitingScheduling && o.retry_at.is_none();
            if !o.released && due_now && known.keep(place.seq, job, place.position) {
                kept.push(o.job_id);
                return false;
            }
            true
        })
    });
    kept
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

/// The entries of some jobs: the caller binds the ids and closes the list.
const LISTED_AMONG: &str = "SELECT job_id FROM open_jobs WHERE job_id IN (";

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
                    );
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

        /// One multi-row INSERT of events (a repeat, such as a moved job's, is ignored).
        fn insert_events<'a>(events: &'a [&'a $crate::job::Job]) -> sqlx::QueryBuilder<'a, $db> {
            let mut qb = sqlx::QueryBuilder::<$db>::new(INSERT_EVENTS);
            qb.push_values(events, |mut row, job| {
                let event = job.event.as_ref();
                row.push_bind(event.map(|e| e.event_id.to_bytes().to_vec()))
                    .push_bind(&*job.bucket)
                    .push_bind(event.map(|e| &*e.event_type))
                    .push_bind(job.created_at.naive_utc());
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
            use $crate::jobdb::open_jobs::open_changes;
            use $crate::jobdb::write::{
                chunks_by_size, job_row_bytes, transition_row_bytes, MAX_ROWS_PER_INSERT,
            };
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            for chunk in chunks_by_size(append.jobs, limit, |job| job_row_bytes(job)) {
                insert_jobs(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in chunks_by_size(append.transitions, limit, |(_, t)| transition_row_bytes(t))
            {
                insert_transitions(chunk).build().execute(&mut **tx).await?;
            }
            for chunk in append.origins.chunks(MAX_ROWS_PER_INSERT) {
                insert_origins(chunk).build().execute(&mut **tx).await?;
            }
            let events = $crate::jobdb::write::events_of(append.jobs);
            for chunk in events.chunks(MAX_ROWS_PER_INSERT) {
                insert_events(chunk).build().execute(&mut **tx).await?;
            }
            owe_notices(tx, append).await?;
            let notices = write_notices(tx, append, limit).await?;
            let mut changes = open_changes(append);
            // Read before the upsert and the delete below take them out of their sequences.
            let mut left: Vec<$crate::job::Seq> = changes.left.clone();
            left.extend(left_sequences(tx, append, &changes.leaving, &changes.blocked).await?);
            let mut touched: Vec<$crate::job::Seq> = changes
                .open
                .iter()
                .filter_map(|o| o.place.map(|p| p.seq))
                .chain(left.iter().copied())
                .collect();
            let arrivals = match append.release_touched {
                true => arrivals(tx, append, &changes.open).await?,
                false => Default::default(),
            };
            append.with_known(|known| {
                for seq in &arrivals.empty {
                    known.learn_empty(*seq);
                }
            });
            // A job born released is fresh, as an unordered one is: no entry, and the log row
            // lists it as accepted. It goes to the scheduler from memory.
            let mut born: Vec<$crate::job::JobId> = arrivals.born.values().copied().collect();
            let mut released: Vec<$crate::job::Recovered> = Vec::new();
            let mut started: Vec<$crate::job::Recovered> = Vec::new();
            let mut born_with_entry = 0;
            if !born.is_empty() {
                let new: std::collections::HashSet<$crate::job::JobId> =
                    born.iter().copied().collect();
                if append.born_with_entry {
                    // Its entry goes in released: the other JobDBs' reads see it under way.
                    for o in changes.open.iter_mut().filter(|o| new.contains(&o.job_id)) {
                        o.released = true;
                    }
                    born_with_entry = born.len();
                    born.clear();
                } else {
                    changes.open.retain(|o| !new.contains(&o.job_id));
                }
                released.extend(append.jobs.iter().filter(|job| new.contains(&job.id)).map(
                    |job| $crate::job::Recovered {
                        job: job.clone(),
                        attempts: 0,
                        retry_at: None,
                    },
                ));
            }
            let kept = $crate::jobdb::write::keep_new(append, &arrivals.new, &mut changes.open);
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
            append.with_known(|known| {
                for o in &changes.open {
                    if let Some(p) = o.place {
                        known.entered(p.seq, o.job_id, p.position, !o.released);
                    }
                }
                for job in changes.closed.iter().chain(&changes.leaving) {
                    known.left(job);
                }
            });
            if let Some(open_from) = append.checkpoint {
                sqlx::query($crate::jobdb::write::UPDATE_CHECKPOINT)
                    .bind($crate::jobdb::int(open_from))
                    .execute(&mut **tx)
                    .await?;
            }
            // A sequence with a fresh job has it under way, which only the writer knows: a
            // head read from the store (the sequencer's sweep) would see it empty.
            let release: Vec<($crate::job::Seq, $crate::job::JobId)> = append
                .release
                .iter()
                .filter(|(seq, _)| {
                    !append.fresh_sequences.is_some_and(|f| f.contains_key(seq))
                        && !append.kept_sequences.is_some_and(|k| k.contains_key(seq))
                })
                .copied()
                .collect();
            released.extend(release_heads(tx, &release).await?);
            if !append.release_expired.is_empty() {
                let now = chrono::Utc::now();
                released.extend(release_jobs(tx, append.release_expired, Some(now)).await?);
            }
            append.with_known(|known| {
                for r in &released {
                    known.released(&r.job.id);
                }
            });
            let (mut heads_known, mut heads_misremembered) = (0, 0);
            let mut gone_on: Vec<$crate::job::JobId> = Vec::new();
            touched.sort_unstable();
            touched.dedup();
            if append.release_touched {
                // A sequence whose first job was born released has it under way; one with a
                // job under way or a block has no head that may go, unless a job of it left;
                // one with a fresh job has it under way (the store cannot tell), unless that
                // job left.
                let left: std::collections::HashSet<$crate::job::Seq> = left.into_iter().collect();
                let fresh_under_way = |seq: &$crate::job::Seq| {
                    append.fresh_sequences.is_some_and(|f| f.contains_key(seq))
                        && !changes.fresh_left.contains(seq)
                };
                let may_go: Vec<$crate::job::Seq> = touched
                    .iter()
                    .filter(|&seq| {
                        !arrivals.born.contains_key(seq)
                            && !fresh_under_way(seq)
                            && (!arrivals.settled.contains(seq) || left.contains(seq))
                    })
                    .copied()
                    .collect();
                // The heads of sequences the writer knows come from its memory (a kept one
                // goes on from there); the others are read, except those of sequences with
                // kept jobs (the store cannot see them: they wait for their entries).
                let may_clear =
                    |job: &$crate::job::JobId| append.cleared.is_none_or(|c| c.contains(job));
                let mut remembered = Vec::new();
                let mut going: Vec<$crate::job::Recovered> = Vec::new();
                let unknown: Vec<$crate::job::Seq> = append
                    .with_known(|known| {
                        may_go
                            .iter()
                            .filter(|seq| match known.head(seq) {
                                Some(Some(job)) if known.is_kept(&job) => {
                                    if may_clear(&job) {
                                        going.extend(known.go_on(&job).map(|job| {
                                            $crate::job::Recovered {
                                                job,
                                                attempts: 0,
                                                retry_at: None,
                                            }
                                        }));
                                    }
                                    false
                                }
                                Some(head) => {
                                    remembered.extend(head.map(|job| (**seq, job)));
                                    false
                                }
                                None => true,
                            })
                            .copied()
                            .collect()
                    })
                    .unwrap_or(may_go);
                let unknown = append.readable_heads(unknown);
                gone_on.extend(going.iter().map(|r| r.job.id));
                heads_known = remembered.len() + going.len();
                let mut go: Vec<$crate::job::JobId> =
                    remembered.iter().map(|(_, job)| *job).collect();
                go.extend(head_jobs(tx, &unknown).await?);
                // Heads not cleared wait for the sequencer (it is told their sequences).
                go.retain(may_clear);
                going.extend(release_jobs(tx, &go, None).await?);
                // A head remembered that the store does not hold waiting would say memory is
                // wrong: forget its sequence and read it, so it cannot stall.
                let got: std::collections::HashSet<$crate::job::JobId> =
                    going.iter().map(|r| r.job.id).collect();
                let missed: Vec<$crate::job::Seq> = remembered
                    .iter()
                    .filter(|(_, job)| !got.contains(job))
                    .map(|(seq, _)| *seq)
                    .collect();
                heads_misremembered = missed.len();
                if !missed.is_empty() {
                    tracing::warn!(
                        sequences = missed.len(),
                        "remembered heads not held in the jobdb; reading them"
                    );
                    append.with_known(|known| missed.iter().for_each(|seq| known.forget(seq)));
                    let go = head_jobs(tx, &append.readable_heads(missed)).await?;
                    going.extend(release_jobs(tx, &go, None).await?);
                }
                append.with_known(|known| {
                    for r in &going {
                        known.released(&r.job.id);
                    }
                    // A sequence whose job under way (fresh) left with none after it: nothing
                    // of it is left to remember.
                    let went: std::collections::HashSet<$crate::job::Seq> =
                        going.iter().filter_map(|r| r.job.seq()).collect();
                    for seq in changes.fresh_left.difference(&went) {
                        known.forget_if_empty(seq);
                    }
                });
                for job in going {
                    match append.begins(&job) {
                        true => started.push(job),
                        false => released.push(job),
                    }
                }
            }
            // Last: it lists the attempts the releases above began.
            if let Some(log) = &append.log {
                let begun: Vec<($crate::job::JobId, u16)> = started
                    .iter()
                    .map(|r| (r.job.id, r.next_attempt()))
                    .collect();
                let fresh: Vec<$crate::job::JobId> = born.iter().chain(&kept).copied().collect();
                sqlx::query($crate::jobdb::write::INSERT_COMMIT_LOG)
                    .bind($crate::jobdb::int(log.id))
                    .bind(log.time.naive_utc())
                    .bind(log.accepted_json(&fresh))
                    .bind(log.started_json(&begun))
                    .execute(&mut **tx)
                    .await?;
            }
            Ok($crate::jobdb::write::Written {
                notices,
                released,
                touched,
                born,
                born_with_entry,
                started,
                heads_known,
                heads_misremembered,
                kept,
                gone_on,
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
        self.append_bounded(token, append, &Bounds::default()).await
    }

    /// [`JobDb::append_all`] within `bounds`: the work before the COMMIT within
    /// [`Bounds::work`] (else [`JobDbError::TimedOut`], nothing stored), the COMMIT's answer
    /// within [`Bounds::commit`] (else [`JobDbError::CommitStalled`], outcome unknown until
    /// [`JobDb::settle`]), and no COMMIT once [`Bounds::not_after`] has passed
    /// ([`JobDbError::Expired`], nothing stored). A connection that ran out of time is closed,
    /// never handed back to the pool with a statement still running on the server.
    pub async fn append_bounded(
        &self,
        token: u64,
        append: &Append<'_>,
        bounds: &Bounds,
    ) -> Result<Written, JobDbError> {
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
        let work_until = bounds
            .work
            .and_then(|d| tokio::time::Instant::now().checked_add(d));
        with_pool!(self, |p, q| {
            let mut conn = match within(work_until, p.acquire()).await {
                Some(conn) => conn?,
                None => return Err(JobDbError::TimedOut),
            };
            // How the transaction ended; it borrows the connection only until then.
            let ended = async {
                let work = async {
                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                    let written = q::write_rows(&mut tx, append, limit).await?;
                    let (tx, connection) = q::check_fence(tx, token).await?;
                    // After the fence check (which may have waited for a lock), right before
                    // the COMMIT: a forward is never stored after its claim could lapse.
                    if bounds.not_after.is_some_and(|t| Utc::now() > t) {
                        tx.rollback().await?;
                        return Err(JobDbError::Expired);
                    }
                    Ok((tx, connection, written))
                };
                let (tx, connection, written) = match within(work_until, work).await {
                    None => return Ended::TimedOut,
                    Some(Err(e)) => return Ended::Done(Err(e)),
                    Some(Ok(done)) => done,
                };
                let commit_until = bounds
                    .commit
                    .and_then(|d| tokio::time::Instant::now().checked_add(d));
                match within(commit_until, tx.commit()).await {
                    None => Ended::Stalled(connection),
                    Some(Ok(())) => Ended::Done(Ok(written)),
                    // Past this point a failure may come after the server committed.
                    Some(Err(e)) => Ended::Done(Err(JobDbError::CommitUnknown(e))),
                }
            }
            .await;
            match ended {
                Ended::Done(Ok(written)) => Ok(written),
                Ended::Done(Err(JobDbError::Sql(sql))) => Err(match q::refusal(&sql) {
                    Some(why) if is_duplicate(&sql) => JobDbError::Duplicate(why),
                    Some(why) => JobDbError::Refused(why),
                    None => JobDbError::Sql(sql),
                }),
                Ended::Done(Err(other)) => Err(other),
                // The server may still be running a statement of this connection (waiting for
                // a lock): closed, it never commits, and the pool opens a fresh one.
                Ended::TimedOut => {
                    drop(conn.detach());
                    Err(JobDbError::TimedOut)
                }
                Ended::Stalled(connection) => Err(JobDbError::CommitStalled(q::stalled(
                    conn.detach(),
                    connection,
                ))),
            }
        })
    }

    /// Makes sure the server is done with the connection of a COMMIT that got no answer in
    /// time ([`JobDbError::CommitStalled`]): MySQL ends it (`KILL CONNECTION`) and waits until
    /// the server no longer lists it; SQLite closes it, which waits for the COMMIT its worker
    /// still runs. After this returns, reading the JobDB tells whether the COMMIT happened.
    /// An error (the server cannot be reached) means: not known yet, try again.
    pub async fn settle(&self, stalled: &mut Option<Stalled>) -> Result<(), JobDbError> {
        match stalled.take() {
            None => Ok(()),
            Some(Stalled::MySql(id)) => match &self.pool {
                super::engine::Pool::MySql(p) => {
                    let ended = super::engine::mysql::end_connection(p, id).await;
                    if ended.is_err() {
                        *stalled = Some(Stalled::MySql(id));
                    }
                    ended
                }
                super::engine::Pool::Sqlite(_) => Ok(()),
            },
            Some(Stalled::Sqlite(conn)) => {
                sqlx::Connection::close(conn).await?;
                Ok(())
            }
        }
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

    /// Which of `ids` have an `open_jobs` entry: after a COMMIT whose answer was lost, the
    /// new ordered jobs without one are those it bore released.
    pub async fn listed_among(
        &self,
        ids: &[JobId],
    ) -> Result<std::collections::HashSet<JobId>, JobDbError> {
        let mut listed = std::collections::HashSet::new();
        for chunk in ids.chunks(super::MAX_IDS_PER_SELECT) {
            with_pool!(self, |p, q| {
                for row in &q::ids_query(LISTED_AMONG, chunk, ")")
                    .build()
                    .fetch_all(p)
                    .await?
                {
                    listed.insert(q::job_id_of(row, "job_id")?);
                }
            });
        }
        Ok(listed)
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
        + job.event.as_ref().map_or(0, |e| 32 + e.event_type.len())
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
    /// Sequences with a fresh job (born released, so under way, and without an entry yet),
    /// with how many: as settled as if an entry said so. Only the Director's writer knows
    /// them.
    pub fresh_sequences: Option<&'a HashMap<Seq, u32>>,
    /// A new `jobdb_checkpoint.open_from`.
    pub checkpoint: Option<u64>,
    /// Ordered jobs to release, each with its sequence: those still their sequence's head
    /// when the transaction reads it are, unless their sequence is one of `fresh_sequences`.
    pub release: &'a [(Seq, JobId)],
    /// Keys blocked elsewhere that come with this write (a drainer's move): blocked here too.
    pub blocks: &'a [super::BlockedKey],
    /// Held jobs whose expiry has passed: released (those still held and expired when the
    /// transaction reads them) so their owner's scheduler ends them, which lets their
    /// sequences go on; never tried.
    pub release_expired: &'a [JobId],
    /// Release, in the same transaction, the head of every sequence this write adds a job to
    /// or ends one of: right only where no other JobDB is live (nothing elsewhere can be
    /// older), and it saves the sequencer's read and a commit per ordered job. With a `log`
    /// row, a new job due now whose sequence is empty is *born* released: it gets no entry
    /// and is listed in `log` as accepted, a fresh job as an unordered one is.
    pub release_touched: bool,
    /// With `release_touched`, only these jobs may go in this write (born, or released as
    /// their sequence's head): the ones the intake cleared against the other live JobDBs
    /// (`director::sequencer::Clearance`). `None`: any (no other JobDB is live).
    pub cleared: Option<&'a HashSet<JobId>>,
    /// A job born released keeps an entry, released (`held = 0`), instead of being fresh:
    /// in a cluster, where other JobDBs' reads of its sequence (which see entries only) must
    /// find it under way. It is then handed over as released, not listed as accepted.
    pub born_with_entry: bool,
    /// Sequences whose head, when this write releases it through `release_touched` and it is
    /// due by `log`'s time, begins its attempt in this commit: listed in `log` as started
    /// (the scheduler offered it: its lane could start one). The attempt a job's end allows
    /// its successor then costs no commit of its own.
    pub begin_released: Option<&'a HashSet<Seq>>,
    /// The writer's memory of its sequences' entries (with `release_touched`): this write
    /// keeps it in step with what its statements change, and takes the head of a sequence
    /// it knows from it instead of reading the store. The writer forgets it all when the
    /// write fails.
    pub known: Option<&'a std::sync::Mutex<super::KnownSequences>>,
    /// With `known` and a `log` row, and every job born released fresh: a new job due now of
    /// a known sequence that is not born is *kept* in memory, fresh, instead of entered held
    /// (see [`super::KnownSequences`]). The writer sets it while alone and bearing fresh
    /// jobs, unless `--no-keep-ordered`.
    pub keep: bool,
    /// Sequences with kept jobs, with how many: their heads are never read from the store,
    /// which cannot see a kept job (see [`Append::readable_heads`]).
    pub kept_sequences: Option<&'a HashMap<Seq, u32>>,
}

impl Append<'_> {
    /// Runs `f` on the writer's memory of sequences, if this write keeps one.
    pub(crate) fn with_known<T>(
        &self,
        f: impl FnOnce(&mut super::KnownSequences) -> T,
    ) -> Option<T> {
        self.known.map(|known| {
            let mut known = known
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&mut known)
        })
    }
}

impl Append<'_> {
    /// Of `seqs`, those whose head may be read from the store: not those with kept jobs,
    /// which the store cannot see (in the writer's account, or dropped from its memory in
    /// this write); they go once those jobs have their entries.
    pub(crate) fn readable_heads(&self, mut seqs: Vec<Seq>) -> Vec<Seq> {
        seqs.retain(|seq| !self.kept_sequences.is_some_and(|k| k.contains_key(seq)));
        self.with_known(|known| seqs.retain(|seq| !known.dropped_kept(seq)));
        seqs
    }

    /// Whether `released`, released by this write's `release_touched`, begins its attempt
    /// here (see [`Append::begin_released`]): its sequence asked for it, there is a log row
    /// to list it, and it is due.
    pub(crate) fn begins(&self, released: &Recovered) -> bool {
        let (Some(log), Some(begin)) = (&self.log, self.begin_released) else {
            return false;
        };
        released.retry_at.is_none_or(|at| at <= log.time)
            && released.job.seq().is_some_and(|seq| begin.contains(&seq))
    }

    /// The rows that end a job (see [`tells_completion`]), by job.
    pub(crate) fn ended(&self) -> HashMap<JobId, &Transition> {
        self.transitions
            .iter()
            .filter(|(_, t)| tells_completion(t.state))
            .map(|(_, t)| (t.job_id, t))
            .collect()
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
    /// `accepted` and then `born` (ordered jobs born released, accepted as fresh) as stored:
    /// a JSON array of hex ids, or NULL.
    pub(crate) fn accepted_json(&self, born: &[JobId]) -> Option<String> {
        let all = self.accepted.len() + born.len();
        if all == 0 {
            return None;
        }
        let mut out = String::with_capacity(2 + all * 35);
        out.push('[');
        for (i, id) in self.accepted.iter().chain(born).enumerate() {
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
    /// The ordered jobs released (their turn came), as resting jobs with their progress.
    pub released: Vec<Recovered>,
    /// The sequences of the ordered jobs this write added or ended: their head may go now.
    pub touched: Vec<Seq>,
    /// The new jobs of `released` born released (their sequence was empty): fresh, with no
    /// entry, listed as accepted in the commit's log row.
    pub born: Vec<JobId>,
    /// New jobs of `released` born released with an entry (see [`Append::born_with_entry`]).
    pub born_with_entry: usize,
    /// Ordered jobs released whose attempt this commit began (see
    /// [`Append::begin_released`]), with the attempts they had before it: listed in its log
    /// row, not in `released`.
    pub started: Vec<Recovered>,
    /// Heads this write found in the writer's memory (see [`Append::known`]), not read.
    pub heads_known: usize,
    /// Of those, heads the store did not hold waiting: read again, their sequences forgotten
    /// (memory was wrong; never expected).
    pub heads_misremembered: usize,
    /// New jobs kept (see [`Append::keep`]): fresh, listed as accepted in the log row.
    pub kept: Vec<JobId>,
    /// Kept jobs whose turn came, handed on from memory (in `released` or `started`): under
    /// way from now on, still fresh.
    pub gone_on: Vec<JobId>,
}

/// How long a bounded write ([`JobDb::append_bounded`]) may take, and until when it may
/// commit. `None`: no bound.
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
/// [`JobDb::settle`] needs to make sure the server is done with it.
#[derive(Debug)]
pub enum Stalled {
    /// A MySQL connection, by its id on the server.
    MySql(u64),
    /// A SQLite connection, still open: its worker thread may be running the COMMIT.
    Sqlite(sqlx::SqliteConnection),
}

/// How a bounded transaction ended, before its connection is dealt with.
enum Ended {
    /// Committed, or failed with this error (nothing stored, or `CommitUnknown`).
    Done(Result<Written, JobDbError>),
    /// The work before the COMMIT ran out of time.
    TimedOut,
    /// The COMMIT got no answer in time; the connection's id.
    Stalled(u64),
}

/// `fut`'s output, or `None` if `until` passes first (`None`: no bound).
async fn within<F: std::future::Future>(
    until: Option<tokio::time::Instant>,
    fut: F,
) -> Option<F::Output> {
    match until {
        Some(until) => tokio::time::timeout_at(until, fut).await.ok(),
        None => Some(fut.await),
    }
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
