//! Ordered keys in the store: every statement about sequences, their heads and their blocks.
//! Which job of a key goes is decided above the store, by the Director's ordering part
//! (`director::ordering`); here is how what it decides is read and written.
//!
//! Jobs that share an ordering key (with their bucket and endpoint: a *sequence*, [`Seq`]) go
//! one at a time, in the order of their positions. An ordered job's `open_jobs` entry names
//! its sequence (`seq`), its `position`, and whether it is `held` (waiting for its turn). A
//! sequence's *head* ([`Head`]) is its held job of the lowest position; it may go (be
//! released: `held = 0`) when none of the sequence's jobs is released already and no row of
//! `ordering_blocked` stops the sequence.
//!
//! - A job leaves its sequence when it ends or moves to `archiving` (its entry is deleted or
//!   loses its `seq`); a write reads the sequences of the leaving jobs its caller names
//!   (`left_sequences`).
//! - A job that asked to block its sequence (`ordering_blocks`) and ends without success
//!   ([`blocks_sequence`]) writes a row of `ordering_blocked` ([`BlockedKey`]); the sequence
//!   stays stopped until an operator deletes the row. A drainer carries blocks to a live
//!   JobDB with the jobs they stop ([`JobDb::blocked_keys`], [`JobDb::forget_blocks`]).
//! - A write releases the held jobs its caller names (`release_jobs`: still held and waiting
//!   for an attempt), or the heads it proposes for sequences the store alone holds
//!   (`release_heads`: still the head when the transaction reads it).
//! - A new owner reads every ordered entry ([`JobDb::ordered_entries`]); the sequencer reads
//!   heads ([`JobDb::sequence_heads`]); across JobDBs, a head must not overtake an older job
//!   of its sequence elsewhere ([`JobDb::sequences_elsewhere`], [`Elsewhere`]).
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

/// Keeps in `oldest` the lower of its position for `seq` and `position`.
pub(crate) fn keep_oldest(oldest: &mut HashMap<Seq, Ulid>, seq: Seq, position: Ulid) {
    let entry = oldest.entry(seq).or_insert(position);
    *entry = (*entry).min(position);
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
/// Every ordered entry, with whether its job asked to block its key: what a new owner's book
/// is made of.
const ORDERED_ENTRIES: &str =
    "SELECT o.job_id, o.seq, o.held, COALESCE(o.position, o.job_id) AS position, \
     j.ordering_blocks \
     FROM open_jobs o JOIN jobs j ON j.id = o.job_id WHERE o.seq IS NOT NULL";
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
        /// The sequences of the ordered jobs among `read_left` (jobs a write ends or moves to
        /// `archiving`, whose entries it deletes or takes out of their sequences, with their
        /// `ends`), read before it does; a job that asked to block its sequence and ends
        /// without success blocks it (`ordering_blocked`, see [`blocks_sequence`]), as do
        /// `blocks`. Returns each ordered job read with its sequence, and the sequences its
        /// jobs blocked.
        async fn left_sequences(
            tx: &mut sqlx::Transaction<'_, $db>,
            read_left: &[$crate::job::JobId],
            ends: &std::collections::HashMap<$crate::job::JobId, &$crate::job::Transition>,
            blocks: &[$crate::jobdb::BlockedKey],
        ) -> Result<
            (
                Vec<($crate::job::JobId, $crate::job::Seq)>,
                Vec<$crate::job::Seq>,
            ),
            $crate::jobdb::JobDbError,
        > {
            use sqlx::Row as _;
            use $crate::jobdb::MAX_IDS_PER_SELECT;
            let mut left = Vec::new();
            let mut blocked: Vec<$crate::jobdb::BlockedKey> = Vec::new();
            for chunk in read_left.chunks(MAX_IDS_PER_SELECT) {
                let rows = ids_query($crate::jobdb::ordering::LEFT_SEQUENCES, chunk, ")")
                    .build()
                    .fetch_all(&mut **tx)
                    .await?;
                for row in &rows {
                    let id = job_id_of(row, "job_id")?;
                    left.push((id, seq_of_row(row, "seq")?));
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
            let blocked_seqs = blocked.iter().map(|b| b.seq()).collect();
            blocked.extend(blocks.iter().cloned());
            insert_blocks(tx, &blocked).await?;
            Ok((left, blocked_seqs))
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

/// An ordered job's entry, as a new owner's book takes it in ([`JobDb::ordered_entries`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderedEntry {
    /// The job.
    pub job: JobId,
    /// Its sequence.
    pub seq: Seq,
    /// Its position.
    pub position: Ulid,
    /// Waiting for its turn (`held = 1`), or released.
    pub held: bool,
    /// Its unsuccessful end blocks its key.
    pub blocks: bool,
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

    /// Every ordered entry (what the writer's book is made of at start), in no order.
    pub async fn ordered_entries(&self) -> Result<Vec<OrderedEntry>, JobDbError> {
        with_pool!(self, |p, q| {
            let rows = sqlx::query(ORDERED_ENTRIES).fetch_all(p).await?;
            let mut entries = Vec::with_capacity(rows.len());
            for row in &rows {
                entries.push(OrderedEntry {
                    job: q::job_id_of(row, "job_id")?,
                    seq: q::seq_of_row(row, "seq")?,
                    position: q::ulid_of(row, "position")?,
                    held: sqlx::Row::try_get::<i64, _>(row, "held")? != 0,
                    blocks: sqlx::Row::try_get::<bool, _>(row, "ordering_blocks")?,
                });
            }
            Ok(entries)
        })
    }

    /// The sequences a row of `ordering_blocked` stops.
    pub async fn blocked_sequences(&self) -> Result<Vec<Seq>, JobDbError> {
        with_pool!(self, |p, q| {
            let mut conn = p.acquire().await?;
            q::sequence_blocks(&mut conn, None).await
        })
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
