//! Ordered keys: every statement about sequences, their heads and their blocks.
//!
//! Jobs that share an ordering key (with their bucket and endpoint: a *sequence*, [`Seq`]) go
//! one at a time, in the order of their positions. An ordered job's `open_jobs` entry names
//! its sequence (`seq`), its `position`, and whether it is `held` (waiting for its turn). A
//! sequence's *head* ([`Head`]) is its held job of the lowest position; it may go (be
//! released: `held = 0`) when none of the sequence's jobs is released already and no row of
//! `ordering_blocked` stops the sequence.
//!
//! - A job leaves its sequence when it ends or moves to `archiving` (its entry is deleted or
//!   loses its `seq`); the write that does it reads which sequences it left
//!   (`left_sequences`), so their next head may go.
//! - A job that asked to block its sequence (`ordering_blocks`) and ends without success
//!   ([`blocks_sequence`]) writes a row of `ordering_blocked` ([`BlockedKey`]); the sequence
//!   stays stopped until an operator deletes the row. A drainer carries blocks to a live
//!   JobDB with the jobs they stop ([`JobDb::blocked_keys`], [`JobDb::forget_blocks`]).
//! - Releasing (`release_heads`, `release_jobs`) happens inside a write's transaction, which
//!   reads the heads again there: an older job may have arrived since the caller looked.
//! - Across JobDBs, a head must not overtake an older job of its sequence elsewhere
//!   ([`JobDb::sequences_elsewhere`], [`Elsewhere`]).
//!
//! The statements are the constants below (both engines spell them alike, except
//! `INSERT_ORDERING_BLOCKED` and the reads that name their index, `OLDEST_HELD`,
//! `OLDEST_RELEASED`, `HEAD_OR_RELEASED` and `RELEASED_SEQS`: constants of each engine
//! module); `ordering_sql!` binds and runs them for each engine's sqlx types, invoked by
//! [`super::engine::mysql`] and [`super::engine::sqlite`] beside `write_path!`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use ulid::Ulid;

use super::{with_pool, JobDb, JobDbError};
use crate::job::{ErrorType, JobId, Seq, State, Transition};

/// The ordered jobs among some leaving ones, with what decides whether they block their
/// sequence: the caller binds the ids and closes the list.
pub(crate) const LEFT_SEQUENCES: &str =
    "SELECT o.job_id, o.seq, j.ordering_blocks, j.bucket, j.endpoint, \
     j.ordering_key FROM open_jobs o JOIN jobs j ON j.id = o.job_id \
     WHERE o.seq IS NOT NULL AND o.job_id IN (";

/// Held ordered jobs that wait for an attempt, with their progress; the caller adds
/// [`HELD_EXPIRED_BY`] and its time or not, then [`HELD_AMONG`] and the bound ids.
pub(crate) const HELD_WAITING: &str = "SELECT job_id, state, attempts, retry_at FROM open_jobs \
                     WHERE held = 1 AND seq IS NOT NULL \
                     AND state IN ('awaiting-scheduling', 'awaiting-retry')";
/// Narrows [`HELD_WAITING`] to jobs expired by a bound time.
pub(crate) const HELD_EXPIRED_BY: &str = " AND expire_at <= ";
/// Narrows [`HELD_WAITING`] to a list of jobs (the caller binds them and closes the list).
pub(crate) const HELD_AMONG: &str = " AND job_id IN (";

/// Releases held jobs: the caller binds the ids and closes the list.
pub(crate) const RELEASE: &str = "UPDATE open_jobs SET held = 0 WHERE job_id IN (";

/// Sequences a grouped head read covers at most; fewer are read one `LIMIT 1` probe each
/// (see `HEAD_OR_RELEASED`), whose cost does not grow with the sequence's length, and which
/// tells in the same statement whether a job of it is released, and whether it is blocked.
pub(crate) const PROBE_AT_MOST: usize = 16;

/// The rows of `ordering_blocked` among the sequences a head probe reads, as one more arm of
/// its `UNION ALL` (`held` 0: no head goes): the caller adds which sequences.
pub(crate) const BLOCKED_ARM: &str =
    " UNION ALL SELECT seq, NULL AS job_id, NULL AS position, 0 AS held \
     FROM ordering_blocked WHERE seq";

/// Sequences with an entry here, `held` 0 when one of their jobs is released, and (with
/// [`PRESENT_OR_BLOCKED_SEQS`]) those a row of `ordering_blocked` stops, `held` 0: the caller
/// adds which sequences, [`PRESENT_OR_BLOCKED_SEQS`] and them again. The grouped `MIN` lets
/// MariaDB skip through the `(seq, held, position)` index, one probe per sequence, rather
/// than read every entry of a long sequence.
pub(crate) const PRESENT_SEQS: &str = "SELECT seq, MIN(held) AS held FROM open_jobs WHERE seq";
/// Closes [`PRESENT_SEQS`] and adds the blocked sequences.
pub(crate) const PRESENT_OR_BLOCKED_SEQS: &str =
    " GROUP BY seq UNION ALL SELECT seq, 0 AS held FROM ordering_blocked WHERE seq";

/// Keeps in `oldest` the lower of its position for `seq` and `position`.
pub(crate) fn keep_oldest(oldest: &mut HashMap<Seq, Ulid>, seq: Seq, position: Ulid) {
    let entry = oldest.entry(seq).or_insert(position);
    *entry = (*entry).min(position);
}

/// What a write finds in the sequences it adds entries to, where no other JobDB is live (see
/// `arrivals` in [`ordering_sql`]).
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    /// Sequences whose first new job goes at once, with that job.
    pub(crate) born: HashMap<Seq, JobId>,
    /// Sequences with a job under way or a block: their head cannot go unless one of their
    /// jobs leaves in this write.
    pub(crate) settled: std::collections::HashSet<Seq>,
    /// Sequences read with no entry and no block (what a writer's memory may learn, see
    /// [`super::KnownSequences`]).
    pub(crate) empty: Vec<Seq>,
    /// The write's new jobs without a row of their own: those that may be fresh (born or
    /// kept). Read only for a write with ordered entries and a log row.
    pub(crate) new: std::collections::HashSet<JobId>,
}

/// Sequences a row of `ordering_blocked` stops: the caller adds which sequences.
pub(crate) const BLOCKED_SEQS: &str = "SELECT seq FROM ordering_blocked WHERE seq";

/// The entry of the lowest position of each sequence, held, in a JobDB of schema 8 (the id
/// was the position): before and after the caller's sequences.
pub(crate) const OLDEST_HELD_BY_ID: (&str, &str) = (
    "SELECT seq, MIN(job_id) AS job_id, MIN(job_id) AS position FROM open_jobs \
                     WHERE held = 1 AND seq",
    " GROUP BY seq",
);
/// [`OLDEST_HELD_BY_ID`] of released entries.
pub(crate) const OLDEST_RELEASED_BY_ID: (&str, &str) = (
    "SELECT seq, MIN(job_id) AS job_id, MIN(job_id) AS position FROM open_jobs \
                     WHERE held = 0 AND seq",
    " GROUP BY seq",
);
/// Fresh jobs (listed by their commit, no entry) with their places if ordered (schema 9);
/// [`FRESH_ORDERED`] narrows it.
pub(crate) const FRESH_PLACES: &str =
    "SELECT f.job_id, j.bucket, j.endpoint, j.ordering_key, j.ordering_position \
     FROM jobs_fresh f JOIN jobs j ON j.id = f.job_id";
/// Narrows [`FRESH_PLACES`] to ordered jobs (unordered ones are most of a busy JobDB's).
pub(crate) const FRESH_ORDERED: &str = " WHERE j.ordering_key IS NOT NULL";
/// Held ordered jobs expired by a time, oldest expiry first (binds: time, limit).
const EXPIRED_HELD: &str = "SELECT job_id FROM open_jobs WHERE expire_at <= ? AND held = 1 \
                 ORDER BY expire_at LIMIT ?";

/// The highest position of an ordered job open here.
const MAX_OPEN_POSITION: &str =
    "SELECT MAX(position) AS position FROM open_jobs WHERE seq IS NOT NULL";

/// Every row of `ordering_blocked`.
const BLOCKED_KEYS: &str = "SELECT job_id, state, blocked_at, bucket, endpoint, ordering_key \
                 FROM ordering_blocked ORDER BY seq";

/// Deletes one block (binds: seq, job id).
const FORGET_BLOCK: &str = "DELETE FROM ordering_blocked WHERE seq = ? AND job_id = ?";

/// The ordered-sequence code of one engine: reading the sequences a write leaves, blocking
/// keys, releasing heads inside a write's transaction, and reading heads, blocks and the
/// oldest positions. `$db` is the engine's sqlx database type; the engine module provides
/// `INSERT_ORDERING_BLOCKED`, `OLDEST_HELD`, `OLDEST_RELEASED` and `RELEASED_SEQS` (from
/// `engine::spelled_sql!`), `HEAD_OR_RELEASED` (its own), and (from `engine::engine_common!`)
/// the decoders and `ids_query`.
macro_rules! ordering_sql {
    ($db:ty) => {
        /// The sequences of the ordered jobs among `leaving` (jobs this transaction ends or
        /// moves to `archiving`, whose entries it deletes or takes out of their sequences),
        /// read before it does; a job that asked to block its sequence and ends without
        /// success blocks it (`ordering_blocked`, see [`blocks_sequence`]).
        ///
        /// `fresh_blocks`: the blocks of fresh ordered jobs that end here (no entry of theirs
        /// is read), written with the others.
        async fn left_sequences(
            tx: &mut sqlx::Transaction<'_, $db>,
            append: &$crate::jobdb::write::Append<'_>,
            leaving: &[$crate::job::JobId],
            fresh_blocks: &[$crate::jobdb::BlockedKey],
        ) -> Result<Vec<$crate::job::Seq>, $crate::jobdb::JobDbError> {
            use sqlx::Row as _;
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            let mut seqs = Vec::new();
            let mut blocked: Vec<$crate::jobdb::BlockedKey> = Vec::new();
            let ends = append.last_rows();
            // A job of a sequence the writer knows whose end cannot block: its sequence from
            // memory, no read.
            let mut unknown = Vec::with_capacity(leaving.len());
            append.with_known(|known| {
                for id in leaving {
                    let may_block = ends
                        .get(id)
                        .is_none_or(|end| $crate::jobdb::ordering::blocks_sequence(end));
                    match known.seq_of(id).filter(|_| !may_block) {
                        Some(seq) => seqs.push(seq),
                        None => unknown.push(*id),
                    }
                }
            });
            let leaving = match append.known {
                Some(_) => &unknown[..],
                None => leaving,
            };
            for chunk in leaving.chunks(MAX_IDS_PER_SELECT) {
                let rows = ids_query($crate::jobdb::ordering::LEFT_SEQUENCES, chunk, ")")
                    .build()
                    .fetch_all(&mut **tx)
                    .await?;
                for row in &rows {
                    seqs.push(seq_of_row(row, "seq")?);
                    let id = job_id_of(row, "job_id")?;
                    let blocks: bool = row.try_get("ordering_blocks")?;
                    let Some(end) = ends.get(&id) else {
                        continue;
                    };
                    if blocks && $crate::jobdb::ordering::blocks_sequence(end) {
                        blocked.push($crate::jobdb::BlockedKey {
                            job_id: id,
                            state: end.state.as_str().to_owned(),
                            blocked_at: end.time,
                            bucket: text(row, "bucket")?,
                            endpoint: text(row, "endpoint")?,
                            ordering_key: text_opt(row, "ordering_key")?.unwrap_or_default(),
                        });
                    }
                }
            }
            blocked.extend(append.blocks.iter().cloned());
            blocked.extend(fresh_blocks.iter().cloned());
            insert_blocks(tx, &blocked).await?;
            // Only an operator's SQL lifts a block: a blocked sequence is read from the store.
            append.with_known(|known| blocked.iter().for_each(|b| known.forget(&b.seq())));
            Ok(seqs)
        }

        /// What a write that no other live JobDB shares ([`Append::release_touched`]) finds in
        /// the sequences it adds entries to, read before they go in (see [`Arrivals`]): the
        /// new jobs that go at once (born released: fresh, with no entry, rather than held and
        /// released by a read of their sequence's head), each a job stored by this write and
        /// due now (not scheduled, not imported, with no row of its own) that comes first by
        /// position among the write's entries of a sequence with no entry here, no fresh job
        /// and no block; and the sequences with a job under way (an entry released, or a
        /// fresh job) or a block, whose head cannot go unless a job of theirs leaves. Nothing
        /// is born without the write's log row, which lists what it accepts.
        ///
        /// [`Append::release_touched`]: $crate::jobdb::write::Append::release_touched
        async fn arrivals(
            tx: &mut sqlx::Transaction<'_, $db>,
            append: &$crate::jobdb::write::Append<'_>,
            open: &[$crate::jobdb::OpenRow],
        ) -> Result<$crate::jobdb::ordering::Arrivals, $crate::jobdb::JobDbError> {
            use sqlx::Row as _;
            use std::collections::{HashMap, HashSet};
            use $crate::jobdb::ordering::{Arrivals, PRESENT_OR_BLOCKED_SEQS, PRESENT_SEQS};
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            // Each sequence's first entry of the write, by position, and whether it is due
            // now (not scheduled, not imported).
            let mut first: HashMap<$crate::job::Seq, (ulid::Ulid, $crate::job::JobId, bool)> =
                HashMap::new();
            for o in open {
                if let Some(p) = o.place {
                    let due_now =
                        o.state == $crate::job::State::AwaitingScheduling && o.retry_at.is_none();
                    let entry = (p.position, o.job_id, due_now);
                    let kept = first.entry(p.seq).or_insert(entry);
                    *kept = (*kept).min(entry);
                }
            }
            let mut arrivals = Arrivals::default();
            if first.is_empty() {
                // No ordered entry (every unordered write): nothing to read.
                return Ok(arrivals);
            }
            let mut present = HashSet::new();
            // A sequence with a fresh job is under way: no read tells more.
            let mut seqs: Vec<$crate::job::Seq> = Vec::with_capacity(first.len());
            for seq in first.keys() {
                match append.fresh_sequences.is_some_and(|f| f.contains_key(seq)) {
                    true => {
                        present.insert(*seq);
                        arrivals.settled.insert(*seq);
                    }
                    false => seqs.push(*seq),
                }
            }
            // A sequence the writer knows is answered from its memory, as its head is; the
            // others are read.
            let unknown: Vec<$crate::job::Seq> = append
                .with_known(|known| {
                    seqs.iter()
                        .filter(|seq| match known.presence(seq) {
                            Some((has_entry, has_released)) => {
                                if has_entry {
                                    present.insert(**seq);
                                }
                                if has_released {
                                    arrivals.settled.insert(**seq);
                                }
                                false
                            }
                            None => true,
                        })
                        .copied()
                        .collect()
                })
                .unwrap_or_else(|| seqs.clone());
            // Each list is bound twice.
            for chunk in unknown.chunks(MAX_IDS_PER_SELECT / 2) {
                let mut qb = seqs_query(PRESENT_SEQS, Some(chunk), PRESENT_OR_BLOCKED_SEQS);
                push_seqs(&mut qb, Some(chunk));
                for row in &qb.build().fetch_all(&mut **tx).await? {
                    let seq = seq_of_row(row, "seq")?;
                    present.insert(seq);
                    if row.try_get::<i64, _>("held")? == 0 {
                        arrivals.settled.insert(seq);
                    }
                }
            }
            arrivals.empty = seqs
                .iter()
                .filter(|s| !present.contains(*s))
                .copied()
                .collect();
            if append.log.is_none() {
                return Ok(arrivals);
            }
            // A job with a row of its own is listed by it, never fresh: it cannot be born.
            let with_row: HashSet<$crate::job::JobId> =
                append.transitions.iter().map(|(_, t)| t.job_id).collect();
            let new: HashSet<$crate::job::JobId> = append
                .jobs
                .iter()
                .map(|j| j.id)
                .filter(|id| !with_row.contains(id))
                .collect();
            arrivals.born = first
                .into_iter()
                .filter(|(seq, (_, id, due_now))| {
                    *due_now
                        && !present.contains(seq)
                        && new.contains(id)
                        && append.cleared.is_none_or(|cleared| cleared.contains(id))
                })
                .map(|(seq, (_, id, _))| (seq, id))
                .collect();
            arrivals.new = new;
            Ok(arrivals)
        }

        /// Blocks keys (`ordering_blocked`); a key blocked already keeps its first block.
        async fn insert_blocks(
            tx: &mut sqlx::Transaction<'_, $db>,
            blocked: &[$crate::jobdb::BlockedKey],
        ) -> Result<(), $crate::jobdb::JobDbError> {
            use $crate::jobdb::MAX_ROWS_PER_INSERT;
            for chunk in blocked.chunks(MAX_ROWS_PER_INSERT) {
                let mut qb = sqlx::QueryBuilder::<$db>::new(INSERT_ORDERING_BLOCKED);
                qb.push_values(chunk, |mut row, b| {
                    row.push_bind(b.seq().to_vec())
                        .push_bind(b.job_id.to_bytes().to_vec())
                        .push_bind(b.state.clone())
                        .push_bind(b.blocked_at.naive_utc())
                        .push_bind(b.bucket.clone())
                        .push_bind(b.endpoint.clone())
                        .push_bind(b.ordering_key.clone());
                });
                qb.build().execute(&mut **tx).await?;
            }
            Ok(())
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
                        .filter(|(seq, id)| heads.get(seq).is_some_and(|h| h.job == *id))
                        .map(|(_, id)| *id),
                );
            }
            go.sort_unstable();
            go.dedup();
            release_jobs(tx, &go, None).await
        }

        /// The head of each of `seqs` that may go now (see [`sequence_heads`]), read inside
        /// `tx` a page of sequences at a time.
        async fn head_jobs(
            tx: &mut sqlx::Transaction<'_, $db>,
            seqs: &[$crate::job::Seq],
        ) -> Result<Vec<$crate::job::JobId>, $crate::jobdb::JobDbError> {
            let mut go = Vec::new();
            for chunk in seqs.chunks($crate::jobdb::MAX_IDS_PER_SELECT) {
                let heads = sequence_heads(&mut **tx, Some(chunk)).await?;
                go.extend(heads.into_values().map(|head| head.job));
            }
            Ok(go)
        }

        /// Releases the held jobs `go` that still wait for an attempt (heads of their
        /// sequences, or with `expired_by`, jobs whose expiry has passed by then: their end is
        /// the scheduler's to write, and it lets their sequence go on) and returns them as
        /// resting jobs with where they stand. A job that has left its sequence (flushed,
        /// expired) or ended is never released.
        async fn release_jobs(
            tx: &mut sqlx::Transaction<'_, $db>,
            go: &[$crate::job::JobId],
            expired_by: Option<chrono::DateTime<chrono::Utc>>,
        ) -> Result<Vec<$crate::job::Recovered>, $crate::jobdb::JobDbError> {
            use $crate::jobdb::ordering::{HELD_AMONG, HELD_EXPIRED_BY, HELD_WAITING, RELEASE};
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            let mut released = Vec::with_capacity(go.len());
            for chunk in go.chunks(MAX_IDS_PER_SELECT) {
                let mut waiting = std::collections::HashMap::new();
                let mut qb = sqlx::QueryBuilder::<$db>::new(HELD_WAITING);
                if let Some(now) = expired_by {
                    qb.push(HELD_EXPIRED_BY).push_bind(now.naive_utc());
                }
                qb.push(HELD_AMONG);
                let mut list = qb.separated(", ");
                for id in chunk {
                    list.push_bind(id.to_bytes().to_vec());
                }
                qb.push(")");
                for row in &qb.build().fetch_all(&mut **tx).await? {
                    waiting.insert(job_id_of(row, "job_id")?, progress_of(row)?);
                }
                if waiting.is_empty() {
                    continue;
                }
                let ids: Vec<$crate::job::JobId> = waiting.keys().copied().collect();
                ids_query(RELEASE, &ids, ")")
                    .build()
                    .execute(&mut **tx)
                    .await?;
                let rows = ids_query($crate::jobdb::SELECT_JOBS, &ids, ")")
                    .build()
                    .fetch_all(&mut **tx)
                    .await?;
                for row in &rows {
                    let job = job_from_row(row)?;
                    if let Some(p) = waiting.remove(&job.id) {
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

        /// The head of each of `seqs` (every sequence with `None`) that may go now: its held
        /// job of the lowest position, when none of its jobs is released (one is under way)
        /// and no row of `ordering_blocked` stops it.
        pub(crate) async fn sequence_heads(
            conn: &mut <$db as sqlx::Database>::Connection,
            seqs: Option<&[$crate::job::Seq]>,
        ) -> Result<
            std::collections::HashMap<$crate::job::Seq, $crate::jobdb::ordering::Head>,
            $crate::jobdb::JobDbError,
        > {
            if seqs.is_some_and(|s| s.is_empty()) {
                return Ok(std::collections::HashMap::new());
            }
            if let Some(few) = seqs.filter(|s| s.len() <= $crate::jobdb::ordering::PROBE_AT_MOST) {
                return probed_heads(&mut *conn, few).await;
            }
            let mut heads = oldest_held(&mut *conn, seqs).await?;
            if heads.is_empty() {
                return Ok(heads);
            }
            let rows = seqs_query(RELEASED_SEQS, seqs, " GROUP BY seq")
                .build()
                .fetch_all(&mut *conn)
                .await?;
            for row in &rows {
                heads.remove(&seq_of_row(row, "seq")?);
            }
            for seq in sequence_blocks(&mut *conn, seqs).await? {
                heads.remove(&seq);
            }
            Ok(heads)
        }

        /// [`sequence_heads`] of a few sequences, in one statement: each sequence's first
        /// entry in `(seq, held, position)` order (a released one when it has any: no head
        /// goes), and its row of `ordering_blocked` if any. Ties go to the lower job id, as
        /// in [`oldest_held`].
        async fn probed_heads(
            conn: &mut <$db as sqlx::Database>::Connection,
            seqs: &[$crate::job::Seq],
        ) -> Result<
            std::collections::HashMap<$crate::job::Seq, $crate::jobdb::ordering::Head>,
            $crate::jobdb::JobDbError,
        > {
            use sqlx::Row as _;
            use $crate::jobdb::ordering::{Head, BLOCKED_ARM};
            let mut qb = sqlx::QueryBuilder::<$db>::new("");
            for (i, seq) in seqs.iter().enumerate() {
                if i > 0 {
                    qb.push(" UNION ALL ");
                }
                qb.push(HEAD_OR_RELEASED.0)
                    .push_bind(seq.to_vec())
                    .push(HEAD_OR_RELEASED.1);
            }
            qb.push(BLOCKED_ARM);
            push_seqs(&mut qb, Some(seqs));
            let mut heads = std::collections::HashMap::new();
            let mut stopped = std::collections::HashSet::new();
            for row in &qb.build().fetch_all(&mut *conn).await? {
                let seq = seq_of_row(row, "seq")?;
                if row.try_get::<i64, _>("held")? == 0 {
                    stopped.insert(seq);
                    continue;
                }
                let head = Head {
                    job: job_id_of(row, "job_id")?,
                    position: ulid_of(row, "position")?,
                };
                heads.insert(seq, head);
            }
            heads.retain(|seq, _| !stopped.contains(seq));
            Ok(heads)
        }

        /// Which of `seqs` (every sequence with `None`) a row of `ordering_blocked` stops.
        pub(crate) async fn sequence_blocks(
            conn: &mut <$db as sqlx::Database>::Connection,
            seqs: Option<&[$crate::job::Seq]>,
        ) -> Result<Vec<$crate::job::Seq>, $crate::jobdb::JobDbError> {
            let rows = seqs_query($crate::jobdb::ordering::BLOCKED_SEQS, seqs, "")
                .build()
                .fetch_all(&mut *conn)
                .await?;
            rows.iter().map(|row| seq_of_row(row, "seq")).collect()
        }

        /// The lowest position of an open job of each of `seqs` here, released or not: what
        /// another JobDB's head must not overtake. `by_id`: a JobDB of schema 8, whose jobs
        /// have no position (their id was their place).
        pub(crate) async fn sequence_oldest(
            conn: &mut <$db as sqlx::Database>::Connection,
            seqs: &[$crate::job::Seq],
            by_id: bool,
        ) -> Result<
            std::collections::HashMap<$crate::job::Seq, ulid::Ulid>,
            $crate::jobdb::JobDbError,
        > {
            use $crate::jobdb::ordering::{OLDEST_HELD_BY_ID, OLDEST_RELEASED_BY_ID};
            let mut oldest = std::collections::HashMap::new();
            if seqs.is_empty() {
                return Ok(oldest);
            }
            // Held and released apart, each one probe per sequence into the
            // `(seq, held, position)` index (both at once walked every entry of each), but in
            // one statement: two would read at two moments, and a job released between them
            // would be in neither answer.
            let (held, released) = match by_id {
                true => (OLDEST_HELD_BY_ID, OLDEST_RELEASED_BY_ID),
                false => (OLDEST_HELD, OLDEST_RELEASED),
            };
            let mut qb = seqs_query(held.0, Some(seqs), held.1);
            qb.push(" UNION ALL ").push(released.0);
            push_seqs(&mut qb, Some(seqs));
            qb.push(released.1);
            for row in &qb.build().fetch_all(&mut *conn).await? {
                $crate::jobdb::ordering::keep_oldest(
                    &mut oldest,
                    seq_of_row(row, "seq")?,
                    ulid_of(row, "position")?,
                );
            }
            Ok(oldest)
        }

        /// The held entry of the lowest position of each of `seqs` (every sequence with
        /// `None`): one probe per sequence into the `(seq, held, position)` index, then its
        /// row. Ties (two JobDBs' positions can meet only after a move) go to the lower job id.
        async fn oldest_held(
            conn: &mut <$db as sqlx::Database>::Connection,
            seqs: Option<&[$crate::job::Seq]>,
        ) -> Result<
            std::collections::HashMap<$crate::job::Seq, $crate::jobdb::ordering::Head>,
            $crate::jobdb::JobDbError,
        > {
            use $crate::jobdb::ordering::Head;
            let mut oldest: std::collections::HashMap<$crate::job::Seq, Head> =
                std::collections::HashMap::new();
            for row in &seqs_query(OLDEST_HELD.0, seqs, OLDEST_HELD.1)
                .build()
                .fetch_all(&mut *conn)
                .await?
            {
                let head = Head {
                    job: job_id_of(row, "job_id")?,
                    position: ulid_of(row, "position")?,
                };
                let entry = oldest.entry(seq_of_row(row, "seq")?).or_insert(head);
                if head.job < entry.job {
                    *entry = head;
                }
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
            push_seqs(&mut qb, seqs);
            qb.push(suffix);
            qb
        }

        /// ` IN (` a bound list of `seqs` `)`, or ` IS NOT NULL` for every sequence.
        fn push_seqs<'a>(
            qb: &mut sqlx::QueryBuilder<'a, $db>,
            seqs: Option<&'a [$crate::job::Seq]>,
        ) {
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
        }

        /// A 16-byte sequence id column.
        pub(crate) fn seq_of_row(
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
    };
}
pub(crate) use ordering_sql;

/// Whether an ordered job leaving its sequence with row `end` blocks it, when it asked to: it
/// ended without success (discarded by a failure, or expired). An operator's flush or discard
/// skips a job on purpose and blocks nothing; a job `moved` goes on elsewhere; an `archived`
/// row follows the `archiving` one, which decided.
pub fn blocks_sequence(end: &Transition) -> bool {
    let by_operator = end.error_type.as_deref().is_some_and(|e| {
        e == ErrorType::OperatorFlush.as_str() || e == ErrorType::OperatorDiscard.as_str()
    });
    matches!(end.state, State::Discarded | State::Archiving) && !by_operator
}

/// A sequence's head: the job of the lowest position among those it asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// The job.
    pub job: JobId,
    /// Its position.
    pub position: Ulid,
}

/// A key blocked by a job that ended without success and asked to block it
/// (`ordering_blocked`); it stays blocked until an operator deletes the row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedKey {
    /// The job whose end blocked it.
    pub job_id: JobId,
    /// How that job ended (`discarded`, `archiving`).
    pub state: String,
    /// When.
    pub blocked_at: DateTime<Utc>,
    /// The key's bucket.
    pub bucket: String,
    /// The key's endpoint.
    pub endpoint: String,
    /// The ordering key.
    pub ordering_key: String,
}

impl BlockedKey {
    /// The key's sequence.
    pub fn seq(&self) -> Seq {
        crate::job::seq_of(&self.bucket, &self.endpoint, &self.ordering_key)
    }
}

/// What another JobDB holds of some sequences that a head here must wait for.
#[derive(Clone, Debug, Default)]
pub struct Elsewhere {
    /// The lowest position of an open job of each sequence it holds.
    pub oldest: HashMap<Seq, Ulid>,
    /// The sequences blocked there.
    pub blocked: std::collections::HashSet<Seq>,
}

impl JobDb {
    /// The head of each of `seqs` (every sequence with `None`) that may go now: its held job
    /// of the lowest position, when none of its jobs is released and no `ordering_blocked`
    /// row stops it.
    pub async fn sequence_heads(
        &self,
        seqs: Option<&[Seq]>,
    ) -> Result<HashMap<Seq, Head>, JobDbError> {
        with_pool!(self, |p, q| {
            let mut conn = p.acquire().await?;
            q::sequence_heads(&mut conn, seqs).await
        })
    }

    /// What this JobDB holds of `seqs` that another JobDB's heads must wait for: the lowest
    /// position of an open job of each (released or not), and which are blocked. `schema` is
    /// this JobDB's schema version ([`JobDb::open_peer`]): one before schema 8 holds no ordered
    /// job, one of schema 8 orders by id.
    pub async fn sequences_elsewhere(
        &self,
        seqs: &[Seq],
        schema: i64,
    ) -> Result<Elsewhere, JobDbError> {
        if schema < 8 {
            return Ok(Elsewhere::default());
        }
        with_pool!(self, |p, q| {
            let mut conn = p.acquire().await?;
            let oldest = q::sequence_oldest(&mut conn, seqs, schema < 9).await?;
            let blocked = q::sequence_blocks(&mut conn, Some(seqs)).await?;
            Ok(Elsewhere {
                oldest,
                blocked: blocked.into_iter().collect(),
            })
        })
    }

    /// The lowest position of a *fresh* ordered job (born released, no entry) of each of
    /// `seqs` here: what another JobDB's read must add when this JobDB's fresh mark is set.
    /// Reads every fresh job's place (the commits since the checkpoint), so only a marked
    /// JobDB is read this way.
    pub async fn fresh_oldest(
        &self,
        seqs: &[Seq],
        schema: i64,
    ) -> Result<HashMap<Seq, Ulid>, JobDbError> {
        let mut oldest = HashMap::new();
        if schema < 9 || seqs.is_empty() {
            return Ok(oldest);
        }
        let wanted: std::collections::HashSet<&Seq> = seqs.iter().collect();
        for (_, place) in self.fresh_places(true).await? {
            if let Some(place) = place.filter(|place| wanted.contains(&place.seq)) {
                keep_oldest(&mut oldest, place.seq, place.position);
            }
        }
        Ok(oldest)
    }

    /// Up to `limit` held ordered jobs whose expiry is at or before `now`: they end now, not
    /// when their turn would have come.
    pub async fn expired_held(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<JobId>, JobDbError> {
        let rows = with_pool!(self, |p, q| {
            sqlx::query(EXPIRED_HELD)
                .bind(now.naive_utc())
                .bind(limit)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| q::job_id_of(row, "job_id"))
                .collect::<Result<Vec<_>, _>>()
        });
        rows
    }

    /// The highest position of an ordered job open here, if any: a new owner's positions
    /// continue above it whatever its clock says.
    pub async fn max_open_position(&self) -> Result<Option<ulid::Ulid>, JobDbError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query(MAX_OPEN_POSITION).fetch_one(p).await?;
            let found: Option<Vec<u8>> = sqlx::Row::try_get(&row, "position")?;
            match found {
                Some(_) => Ok(Some(q::ulid_of(&row, "position")?)),
                None => Ok(None),
            }
        })
    }

    /// The keys blocked here (`ordering_blocked`): what a drainer carries to a live JobDB so a
    /// block follows its key. A row without its key's names (its job was gone when schema 9
    /// named the rows) cannot be carried and is left out.
    pub async fn blocked_keys(&self) -> Result<Vec<BlockedKey>, JobDbError> {
        with_pool!(self, |p, q| {
            let rows = sqlx::query(BLOCKED_KEYS).fetch_all(p).await?;
            let mut keys = Vec::with_capacity(rows.len());
            for row in &rows {
                let (Some(bucket), Some(endpoint), Some(ordering_key)) = (
                    q::text_opt(row, "bucket")?,
                    q::text_opt(row, "endpoint")?,
                    q::text_opt(row, "ordering_key")?,
                ) else {
                    continue;
                };
                keys.push(BlockedKey {
                    job_id: q::job_id_of(row, "job_id")?,
                    state: q::text(row, "state")?,
                    blocked_at: q::time_of(row, "blocked_at")?,
                    bucket,
                    endpoint,
                    ordering_key,
                });
            }
            Ok(keys)
        })
    }

    /// Deletes the blocks of these keys (a drainer, once a live JobDB holds them).
    pub async fn forget_blocks(&self, token: u64, keys: &[BlockedKey]) -> Result<(), JobDbError> {
        if keys.is_empty() {
            return Ok(());
        }
        with_pool!(self, |p, q| {
            let mut tx = p.begin().await?;
            for key in keys {
                sqlx::query(FORGET_BLOCK)
                    .bind(key.seq().to_vec())
                    .bind(key.job_id.to_bytes().to_vec())
                    .execute(&mut *tx)
                    .await?;
            }
            q::commit_fenced(tx, token).await
        })
    }
}
