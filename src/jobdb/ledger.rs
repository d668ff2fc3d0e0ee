//! The reads of the conservation ledger (`spindle audit`): one round of a JobDB's audit, read
//! in one transaction so that everything it counts describes one moment.
//!
//! Both engines give a transaction one snapshot for all its reads (InnoDB's repeatable read
//! takes it at the first read; SQLite's deferred read transaction likewise), so a commit that
//! lands half way through a round is either wholly in every count or in none: the ledger
//! balances at every moment, kill -9 or not, and a difference is a real one.
//!
//! A round reads what is new since the last one, and the open work:
//! - the **window**: jobs whose id (a ULID: its creation time) lies between the last round's
//!   boundary and this one's, each read once, with the state that ended it if one did;
//! - the **carried** jobs: those an earlier round found not ended, ended since by a row after
//!   the cursor;
//! - the **live** part: jobs newer than this round's boundary, counted whole (a few seconds of
//!   intake), so the counts cover the JobDB up to the snapshot;
//! - the open work (`open_jobs`, `jobs_fresh`), **counted**: when it holds as many jobs as the
//!   carried, window and live jobs not ended, it is those; otherwise (a job vanished, listed
//!   twice, ended and open, stored after its window was read or imported with an old id), and
//!   on a round that asks, it is **listed** whole and every difference looked up by id;
//! - the **rows after** the cursor, each checked once: a second end, an attempt that began
//!   before an earlier one ended, a row without its job.
//!
//! The first round of a tracker (boundary and cursor at zero) therefore reads the whole JobDB;
//! later ones cost what is new, and a count of what is open.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::{with_pool, JobDb, JobDbError, MAX_IDS_PER_SELECT};
use crate::job::{JobId, State};

/// The states that end a job here (a `moved` job goes on in another JobDB).
macro_rules! ends {
    () => {
        "('succeeded', 'discarded', 'archived', 'moved')"
    };
}

/// The state of a job's first row that ends it, if any (of `j`).
macro_rules! end_of {
    () => {
        concat!(
            "(SELECT t.state FROM job_state_transitions t WHERE t.job_id = j.id AND t.state IN ",
            ends!(),
            " ORDER BY t.id LIMIT 1) AS state"
        )
    };
}

/// Whether job `j` was imported (moved here from another JobDB).
macro_rules! imported {
    () => {
        "EXISTS (SELECT 1 FROM job_origins o WHERE o.job_id = j.id)"
    };
}

/// The jobs made here in a window of ids, each with the state that ended it (binds: from,
/// to). Imported jobs keep the ids they were made with: they are read by when they came.
const WINDOW: &str = concat!(
    "SELECT j.id, j.created_at, ",
    end_of!(),
    " FROM jobs j WHERE j.id >= ? AND j.id < ? AND NOT ",
    imported!()
);

/// The jobs imported in a window of time, each with the state that ended it (binds: from,
/// to).
const IMPORTED: &str = concat!(
    "SELECT j.id, j.created_at, ",
    end_of!(),
    " FROM job_origins o JOIN jobs j ON j.id = o.job_id \
     WHERE o.imported_at >= ? AND o.imported_at < ?"
);

/// The rows that end these jobs (an id list follows).
const ENDS_OF: &str = concat!(
    "SELECT job_id, state FROM job_state_transitions WHERE state IN ",
    ends!(),
    " AND job_id IN ("
);

/// Which of these jobs have a `jobs` row (an id list follows).
const JOBS_OF: &str = "SELECT id AS job_id FROM jobs WHERE id IN (";

/// The live part: jobs made here at or after an id, and jobs imported at or after a time
/// (binds: id, time), each with the state that ended it.
const LIVE: &str = concat!(
    "SELECT j.id, j.created_at, ",
    end_of!(),
    " FROM jobs j WHERE j.id >= ? AND NOT ",
    imported!(),
    " UNION ALL SELECT j.id, j.created_at, ",
    end_of!(),
    " FROM job_origins o JOIN jobs j ON j.id = o.job_id WHERE o.imported_at >= ?"
);

/// Every unfinished job: its `open_jobs` entry, or the commit that accepted it (`jobs_fresh`).
/// The `open_work` view says the same with each job's state, which costs a join per job this
/// does not need.
const OPEN: &str = "SELECT job_id FROM open_jobs UNION ALL SELECT job_id FROM jobs_fresh";

/// How many jobs the open work holds (`OPEN`'s rows, counted where they lie).
const OPEN_COUNT: &str =
    "SELECT (SELECT COUNT(*) FROM open_jobs) + (SELECT COUNT(*) FROM jobs_fresh) AS n";

/// The rows after the cursor that end a job (binds: cursor), through the index on `id`.
const ENDS_AFTER: &str = concat!(
    "SELECT job_id, state FROM job_state_transitions WHERE id > ? AND state IN ",
    ends!()
);

/// The highest transition id.
const LAST_ROW: &str = "SELECT MAX(id) FROM job_state_transitions";

/// Jobs with a row after the cursor that ends them, and more than one such row, with how
/// many (binds: cursor, limit). The new rows come through the index on `id`, each job's others
/// by its key.
const ENDED_TWICE: &str = concat!(
    "SELECT t.job_id, COUNT(*) AS n FROM \
     (SELECT DISTINCT job_id FROM job_state_transitions WHERE id > ? AND state IN ",
    ends!(),
    ") n JOIN job_state_transitions t ON t.job_id = n.job_id AND t.state IN ",
    ends!(),
    " GROUP BY t.job_id HAVING COUNT(*) > 1 LIMIT ?"
);

/// Jobs with a row after the cursor and no `jobs` row (binds: cursor, limit).
const WITHOUT_JOB: &str = "SELECT DISTINCT t.job_id FROM job_state_transitions t \
     WHERE t.id > ? AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = t.job_id) LIMIT ?";

/// Attempts that began before an earlier attempt of their job ended: the commit that began
/// one precedes the row that ended the other (ids are one sequence per JobDB, and a new
/// owner's are all higher, so a crash between the two cannot make this so). Each pair is found
/// from whichever of its two rows is after the cursor, and attempts under way from each (binds:
/// cursor, limit, cursor, limit, limit).
const OVERLAPS: &str = "SELECT job_id, started_at FROM \
     (SELECT t.job_id, t.started_at FROM job_state_transitions t \
      JOIN job_state_transitions p ON p.job_id = t.job_id AND p.started_in IS NOT NULL \
       AND p.attempts < t.attempts AND p.id > t.started_in \
      WHERE t.id > ? AND t.started_in IS NOT NULL LIMIT ?) a \
     UNION SELECT job_id, started_at FROM \
     (SELECT t.job_id, t.started_at FROM job_state_transitions p \
      JOIN job_state_transitions t ON t.job_id = p.job_id AND t.started_in IS NOT NULL \
       AND p.attempts < t.attempts AND p.id > t.started_in \
      WHERE p.id > ? AND p.started_in IS NOT NULL LIMIT ?) b \
     UNION SELECT job_id, started_at FROM \
     (SELECT u.job_id, u.started_at FROM attempts_under_way u \
      JOIN job_state_transitions p ON p.job_id = u.job_id AND p.started_in IS NOT NULL \
       AND p.attempts < u.attempts AND p.id > u.started_in LIMIT ?) c";

/// Open jobs past their expiry, with it: an expiry ends a job whatever gates its lane, so one
/// still open long after it is stuck (binds: before, limit). Jobs with an `open_jobs` entry
/// (through its index on the expiry): a fresh job gets one once it has waited
/// `--rest-after-ms`, and one whose Director died is the `unowned` finding. `archiving` ones
/// have ended, and wait for the archive.
const OVERDUE: &str = "SELECT job_id, expire_at FROM open_jobs \
     WHERE expire_at < ? AND state <> 'archiving' LIMIT ?";

/// Attempts begun and not ended, with when they began.
const UNDER_WAY: &str = "SELECT job_id, started_at FROM attempts_under_way";

/// A job, when it was made, and the state that ended it if one did.
pub type Judged = (JobId, DateTime<Utc>, Option<State>);

/// What one round asks of a JobDB.
#[derive(Clone, Copy, Debug)]
pub struct RoundAsk<'a> {
    /// The window's first id: the last round's boundary (zero at first).
    pub from: JobId,
    /// This round's boundary: the window ends here, the live part begins.
    pub to: JobId,
    /// The import window's start: the last round's boundary in time (the epoch at first).
    pub imported_from: DateTime<Utc>,
    /// This round's boundary in time: the import window ends here.
    pub imported_to: DateTime<Utc>,
    /// Jobs an earlier round found not ended (with when each was made, which the read ignores:
    /// it is the tracker's own map, lent as it is).
    pub carried: &'a HashMap<JobId, DateTime<Utc>>,
    /// Rows after this transition id are checked (zero at first).
    pub after: u64,
    /// Open jobs that expired before this are read (overdue).
    pub overdue_before: DateTime<Utc>,
    /// At most this many rows of each kind that should not exist are read.
    pub limit: u32,
    /// List the open work whole even when its count is what the ledger expects.
    pub list_open: bool,
}

/// What one round read, at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundRead {
    /// The window's jobs (made in the id window, or imported in the time window): id, when
    /// made, the state that ended it.
    pub window: Vec<Judged>,
    /// Rows that end carried jobs no longer open (a job ended twice has two).
    pub carried_ends: Vec<(JobId, State)>,
    /// Carried jobs no longer open whose `jobs` row is gone.
    pub carried_gone: Vec<JobId>,
    /// The live part's jobs: id, when made, the state that ended it.
    pub live: Vec<Judged>,
    /// The open jobs: `open_jobs` entries and fresh jobs (a job listed twice appears twice).
    pub open: Vec<JobId>,
    /// Open jobs no round saw (not carried, in neither window nor the live part), with
    /// whether a row ends them and whether they have a `jobs` row.
    pub strays: Vec<Stray>,
    /// Jobs with a row after the cursor that ends them, and more than one such row.
    pub ended_twice: Vec<(JobId, u64)>,
    /// Jobs with a row after the cursor and no `jobs` row.
    pub without_job: Vec<JobId>,
    /// Attempts that began before an earlier one of their job ended, with when.
    pub overlaps: Vec<(JobId, DateTime<Utc>)>,
    /// Attempts under way, with when each began.
    pub under_way: Vec<(JobId, DateTime<Utc>)>,
    /// Open jobs past [`RoundAsk::overdue_before`], with their expiry.
    pub overdue: Vec<(JobId, DateTime<Utc>)>,
    /// The highest transition id: the next round's cursor.
    pub last_row: u64,
    /// Whether the open work was listed whole: asked to, or its count was not what the
    /// jobs read and carried expect (then `open` is the listing; otherwise it is those jobs).
    pub listed_open: bool,
}

/// An open job no round had seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stray {
    /// The job.
    pub job: JobId,
    /// A row ended it.
    pub ended: bool,
    /// It has a `jobs` row.
    pub stored: bool,
}

impl JobDb {
    /// One round of the ledger's reads ([`RoundAsk`]), in one snapshot.
    pub async fn ledger_round(&self, ask: RoundAsk<'_>) -> Result<RoundRead, JobDbError> {
        let limit = i64::from(ask.limit);
        let after = super::int(ask.after);
        let from = ask.from.to_bytes().to_vec();
        let to = ask.to.to_bytes().to_vec();
        with_pool!(self, |p, q| {
            let job_with_end = |row: &q::DbRow| -> Result<Judged, JobDbError> {
                let state = match q::text_opt(row, "state")? {
                    Some(s) => Some(s.parse().map_err(|e: crate::job::UnknownState| {
                        JobDbError::Corrupt(e.to_string())
                    })?),
                    None => None,
                };
                Ok((
                    q::job_id_of(row, "id")?,
                    q::time_of(row, "created_at")?,
                    state,
                ))
            };
            let mut tx = p.begin().await?;
            let mut read = RoundRead::default();
            let window = sqlx::query(WINDOW)
                .bind(&from)
                .bind(&to)
                .fetch_all(&mut *tx)
                .await?;
            let imported = sqlx::query(IMPORTED)
                .bind(ask.imported_from.naive_utc())
                .bind(ask.imported_to.naive_utc())
                .fetch_all(&mut *tx)
                .await?;
            for row in window.iter().chain(&imported) {
                read.window.push(job_with_end(row)?);
            }
            for row in sqlx::query(LIVE)
                .bind(&to)
                .bind(ask.imported_to.naive_utc())
                .fetch_all(&mut *tx)
                .await?
            {
                read.live.push(job_with_end(&row)?);
            }
            // The carried jobs that ended since the last round: every row that ends one is
            // after the cursor (rows are numbered in commit order, a new owner's higher).
            let mut ends_after = Vec::new();
            for row in sqlx::query(ENDS_AFTER)
                .bind(after)
                .fetch_all(&mut *tx)
                .await?
            {
                let id = q::job_id_of(&row, "job_id")?;
                if ask.carried.contains_key(&id) {
                    ends_after.push((id, q::state_of(&row)?));
                }
            }
            let ended_since: HashSet<JobId> = ends_after.iter().map(|(id, _)| *id).collect();
            let expected: Vec<JobId> = ask
                .carried
                .keys()
                .filter(|id| !ended_since.contains(id))
                .copied()
                .chain(
                    read.window
                        .iter()
                        .chain(&read.live)
                        .filter(|(_, _, end)| end.is_none())
                        .map(|(id, _, _)| *id),
                )
                .collect();
            let count: i64 = sqlx::query_scalar(OPEN_COUNT).fetch_one(&mut *tx).await?;
            // The open work is what the rounds expect when it holds as many jobs: then it is
            // not listed. A difference (a job vanished, listed twice, ended and open, stored
            // late) lists it whole, and so does every round that asks.
            if !ask.list_open && usize::try_from(count).ok() == Some(expected.len()) {
                read.open = expected;
                read.carried_ends = ends_after;
            } else {
                read.listed_open = true;
                for row in sqlx::query(OPEN).fetch_all(&mut *tx).await? {
                    read.open.push(q::job_id_of(&row, "job_id")?);
                }
                let seen: HashSet<JobId> = read
                    .window
                    .iter()
                    .chain(&read.live)
                    .map(|(id, _, _)| *id)
                    .collect();
                let strays: Vec<JobId> = read
                    .open
                    .iter()
                    .filter(|id| !seen.contains(id) && !ask.carried.contains_key(id))
                    .copied()
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
                // The carried jobs no longer open, and the strays, looked up by id: the rows
                // that end them, and whether their `jobs` rows are there. (A carried job still
                // listed as open is taken to be open: a whole read checks it.)
                let open: HashSet<JobId> = read.open.iter().copied().collect();
                let left: Vec<JobId> = ask
                    .carried
                    .keys()
                    .filter(|id| !open.contains(id))
                    .copied()
                    .collect();
                let (mut ends, mut stored) = (Vec::new(), HashSet::new());
                let looked: Vec<JobId> = left.iter().chain(&strays).copied().collect();
                for chunk in looked.chunks(MAX_IDS_PER_SELECT) {
                    for row in q::ids_query(ENDS_OF, chunk, ")")
                        .build()
                        .fetch_all(&mut *tx)
                        .await?
                    {
                        ends.push((q::job_id_of(&row, "job_id")?, q::state_of(&row)?));
                    }
                    for row in q::ids_query(JOBS_OF, chunk, ")")
                        .build()
                        .fetch_all(&mut *tx)
                        .await?
                    {
                        stored.insert(q::job_id_of(&row, "job_id")?);
                    }
                }
                let ended: HashSet<JobId> = ends.iter().map(|(id, _)| *id).collect();
                read.carried_ends = ends
                    .into_iter()
                    .filter(|(id, _)| ask.carried.contains_key(id))
                    .collect();
                read.carried_gone = left
                    .iter()
                    .filter(|id| !stored.contains(id))
                    .copied()
                    .collect();
                read.strays = strays
                    .iter()
                    .map(|job| Stray {
                        job: *job,
                        ended: ended.contains(job),
                        stored: stored.contains(job),
                    })
                    .collect();
            }
            for row in sqlx::query(ENDED_TWICE)
                .bind(after)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?
            {
                read.ended_twice
                    .push((q::job_id_of(&row, "job_id")?, q::count_of(&row, "n")?));
            }
            for row in sqlx::query(WITHOUT_JOB)
                .bind(after)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?
            {
                read.without_job.push(q::job_id_of(&row, "job_id")?);
            }
            let timed = |rows: Vec<_>| -> Result<Vec<(JobId, DateTime<Utc>)>, JobDbError> {
                rows.iter()
                    .map(|r| Ok((q::job_id_of(r, "job_id")?, q::time_of(r, "started_at")?)))
                    .collect()
            };
            read.overlaps = timed(
                sqlx::query(OVERLAPS)
                    .bind(after)
                    .bind(limit)
                    .bind(after)
                    .bind(limit)
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?,
            )?;
            read.under_way = timed(sqlx::query(UNDER_WAY).fetch_all(&mut *tx).await?)?;
            let before = ask.overdue_before.naive_utc();
            for row in sqlx::query(OVERDUE)
                .bind(before)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?
            {
                read.overdue.push((
                    q::job_id_of(&row, "job_id")?,
                    q::time_of(&row, "expire_at")?,
                ));
            }
            let last: Option<u64> = sqlx::query_scalar(LAST_ROW).fetch_one(&mut *tx).await?;
            read.last_row = last.unwrap_or(0);
            tx.rollback().await?;
            Ok(read)
        })
    }
}
