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
//! The window's and the live part's jobs, and all their transitions, are two scans in key
//! order from the window's first id (both tables are clustered by job id, a ULID), not a lookup
//! per job. The new rows of older jobs come through the index on `id`; a carried job is judged
//! by those rows alone (its ends are all new, its `jobs` row was read in its window), and only
//! the few others (a carried job with a second attempt, a stray, a job ended before, an import)
//! are read whole by id. Each job's rows are judged here, in Rust: the state that ended it, a
//! second end, overlapping attempts. A `jobs` row deleted by hand from a carried job is
//! therefore not seen by rounds; a whole read (`spindle audit` once) sees it.
//!
//! The first round of a tracker (boundary and cursor at zero) therefore reads the whole JobDB;
//! later ones cost what is new, and a count of what is open.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use futures::TryStreamExt;

use super::engine::{with_tx, Tx};
use super::{JobDb, JobDbError, MAX_IDS_PER_SELECT};
use crate::job::{JobId, State};

/// Every job stored at or after an id: the window's and the live part's (binds: id).
const JOBS_FROM: &str = "SELECT id, created_at FROM jobs WHERE id >= ?";

/// Which jobs at or after an id were imported: they are read by when they came (binds: id).
const IMPORTED_FROM: &str = "SELECT job_id FROM job_origins WHERE job_id >= ?";

/// The jobs imported at or after a time, with when (binds: time). Imported jobs keep the ids
/// they were made with.
const IMPORTED_SINCE: &str = "SELECT j.id, j.created_at, o.imported_at \
     FROM job_origins o JOIN jobs j ON j.id = o.job_id WHERE o.imported_at >= ?";

/// Every transition of the jobs at or after an id, job by job (binds: id): the columns
/// [`judge`] reads.
const ROWS_FROM: &str = "SELECT job_id, id, state, attempts, started_in, started_at \
     FROM job_state_transitions WHERE job_id >= ? ORDER BY job_id, id";

/// [`ROWS_FROM`] of these jobs (an id list follows).
const ROWS_OF: &str = "SELECT job_id, id, state, attempts, started_in, started_at \
     FROM job_state_transitions WHERE job_id IN (";

/// [`ROWS_FROM`]'s columns of the rows after the cursor of jobs older than an id (binds:
/// cursor, id), through the index on `id`.
const OLDER_ROWS_AFTER: &str = "SELECT job_id, id, state, attempts, started_in, started_at \
     FROM job_state_transitions WHERE id > ? AND job_id < ?";

/// The rows that end these jobs (an id list follows).
const ENDS_OF: &str = "SELECT job_id, state FROM job_state_transitions \
     WHERE state IN ('succeeded', 'discarded', 'archived', 'moved') AND job_id IN (";

/// Which of these jobs have a `jobs` row (an id list follows).
const JOBS_OF: &str = "SELECT id AS job_id FROM jobs WHERE id IN (";

/// Every unfinished job: its `open_jobs` entry, or the commit that accepted it (`jobs_fresh`).
/// The `open_work` view says the same with each job's state, which costs a join per job this
/// does not need.
const OPEN: &str = "SELECT job_id FROM open_jobs UNION ALL SELECT job_id FROM jobs_fresh";

/// How many jobs the open work holds (`OPEN`'s rows, counted where they lie).
const OPEN_COUNT: &str =
    "SELECT (SELECT COUNT(*) FROM open_jobs) + (SELECT COUNT(*) FROM jobs_fresh) AS n";

/// The highest transition id.
const LAST_ROW: &str = "SELECT MAX(id) FROM job_state_transitions";

/// Open jobs past their expiry, with it: an expiry ends a job whatever gates its lane, so one
/// still open long after it is stuck (binds: before, limit). Jobs with an `open_jobs` entry
/// (through its index on the expiry): a fresh job gets one once it has waited
/// `--rest-after-ms`, and one whose Director died is the `unowned` finding. `archiving` ones
/// have ended, and wait for the archive.
const OVERDUE: &str = "SELECT job_id, expire_at FROM open_jobs \
     WHERE expire_at < ? AND state <> 'archiving' LIMIT ?";

/// Attempts begun and not ended: which, and where and when each began.
const UNDER_WAY: &str = "SELECT job_id, attempts, started_in, started_at FROM attempts_under_way";

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

/// One transition as the ledger judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    id: u64,
    state: State,
    attempts: u16,
    /// The commit that began the attempt this row ends, and when.
    started_in: Option<u64>,
    started_at: Option<DateTime<Utc>>,
}

/// What one job's rows show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Judgement {
    /// The state of the first row that ends it.
    end: Option<State>,
    /// The rows after the cursor that end it, in order.
    ends_after: Vec<State>,
    /// How many rows end it.
    ends: u64,
    /// It has a row after the cursor.
    row_after: bool,
    /// An attempt began before an earlier one ended, one of the two after the cursor: when
    /// the later began.
    overlap: Option<DateTime<Utc>>,
    /// It has a `jobs` row (set by the reader of `jobs`).
    stored: bool,
}

/// An attempt under way: which, and the commit that began it, and when.
type UnderWay = (u16, u64, DateTime<Utc>);

/// Judges one job's rows (in id order) against the cursor `after`, with its attempts under
/// way (one that began before an earlier attempt's row overlaps it, cursor or not).
fn judge(rows: &[Row], after: u64, under_way: &[UnderWay]) -> Judgement {
    let mut j = Judgement::default();
    for r in rows {
        j.row_after |= r.id > after;
        if r.state.is_terminal() {
            j.ends += 1;
            j.end.get_or_insert(r.state);
            if r.id > after {
                j.ends_after.push(r.state);
            }
        }
    }
    // Attempt t overlaps an earlier attempt p when p's row comes after the commit that began
    // t. The latest row of the attempts below t's is the only one to try.
    let mut attempts: Vec<&Row> = rows.iter().filter(|r| r.started_in.is_some()).collect();
    attempts.sort_by_key(|r| r.attempts);
    let mut below: Option<u64> = None;
    let mut i = 0;
    while i < attempts.len() && j.overlap.is_none() {
        let same = attempts[i..]
            .iter()
            .take_while(|r| r.attempts == attempts[i].attempts)
            .count();
        for t in &attempts[i..i + same] {
            let (Some(p), Some(began)) = (below, t.started_in) else {
                continue;
            };
            if p > began && (t.id > after || p > after) {
                j.overlap = Some(t.started_at.unwrap_or_default());
                break;
            }
        }
        let top = attempts[i..i + same].iter().map(|r| r.id).max();
        below = below.max(top);
        i += same;
    }
    for (attempt, began, at) in under_way {
        let overlapped = rows
            .iter()
            .any(|p| p.started_in.is_some() && p.attempts < *attempt && p.id > *began);
        if overlapped && j.overlap.is_none() {
            j.overlap = Some(*at);
        }
    }
    j
}

/// Collects rows that come job by job into each job's [`Judgement`].
struct Judge<'a> {
    after: u64,
    under_way: &'a HashMap<JobId, Vec<UnderWay>>,
    job: Option<JobId>,
    rows: Vec<Row>,
    judged: HashMap<JobId, Judgement>,
}

impl<'a> Judge<'a> {
    fn new(after: u64, under_way: &'a HashMap<JobId, Vec<UnderWay>>) -> Judge<'a> {
        Judge {
            after,
            under_way,
            job: None,
            rows: Vec::new(),
            judged: HashMap::new(),
        }
    }

    fn push(&mut self, job: JobId, row: Row) {
        if self.job != Some(job) {
            self.close();
            self.job = Some(job);
        }
        self.rows.push(row);
    }

    fn close(&mut self) {
        if let Some(job) = self.job.take() {
            self.rows.sort_by_key(|r| r.id);
            let under_way = self.under_way.get(&job).map_or(&[][..], Vec::as_slice);
            let judged = judge(&self.rows, self.after, under_way);
            self.judged.insert(job, judged);
            self.rows.clear();
        }
    }

    fn done(mut self) -> HashMap<JobId, Judgement> {
        self.close();
        self.judged
    }
}

/// The older jobs and imports read whole by id: an older job with a new row that no earlier
/// round found open (a stray, or one ended before: a second end), a carried one with a second
/// attempt (new or under way: it may overlap its first, whose row is before the cursor), and
/// the imports made before the window.
fn read_whole(
    ask: &RoundAsk<'_>,
    older: &HashMap<JobId, Vec<Row>>,
    under_way: &HashMap<JobId, Vec<UnderWay>>,
    imported: &[(Judged, bool)],
) -> Vec<JobId> {
    let retried = |id: &JobId| {
        older
            .get(id)
            .is_some_and(|rows| rows.iter().any(|r| r.attempts > 1))
            || under_way.get(id).is_some_and(|u| u.iter().any(|a| a.0 > 1))
    };
    older
        .keys()
        .filter(|id| !ask.carried.contains_key(id) || retried(id))
        .chain(under_way.keys().filter(|id| retried(id)))
        .copied()
        .chain(imported.iter().map(|((id, _, _), _)| *id))
        .filter(|id| *id < ask.from)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect()
}

/// The older jobs judged: those read whole (`whole`, with which have a `jobs` row), and the
/// carried ones by their new rows alone (their `jobs` rows were read in their windows).
fn judge_older(
    older: HashMap<JobId, Vec<Row>>,
    looked: &[JobId],
    whole: HashMap<JobId, Judgement>,
    stored: &[JobId],
    ask: &RoundAsk<'_>,
    under_way: &HashMap<JobId, Vec<UnderWay>>,
) -> HashMap<JobId, Judgement> {
    let looked: HashSet<JobId> = looked.iter().copied().collect();
    let mut judged = whole;
    for id in stored {
        if let Some(j) = judged.get_mut(id) {
            j.stored = true;
        }
    }
    let mut judging = Judge::new(ask.after, under_way);
    for (id, rows) in older.into_iter().filter(|(id, _)| !looked.contains(id)) {
        for row in rows {
            judging.push(id, row);
        }
    }
    for (id, mut j) in judging.done() {
        j.stored = true;
        judged.insert(id, j);
    }
    judged
}

impl RoundRead {
    /// Puts the imports where they count: in the window, or the live part when they came
    /// after its boundary; each with the state that ended it.
    fn place_imports(&mut self, imported: Vec<(Judged, bool)>, judged: &HashMap<JobId, Judgement>) {
        for ((id, made, _), live) in imported {
            let end = judged.get(&id).and_then(|j| j.end);
            let part = if live {
                &mut self.live
            } else {
                &mut self.window
            };
            part.push((id, made, end));
        }
    }

    /// Takes what the judged jobs' new rows show (second ends, rows without a job, overlaps)
    /// into the findings, and returns the new rows that end carried jobs.
    fn take_findings(
        &mut self,
        judged: &HashMap<JobId, Judgement>,
        carried: &HashMap<JobId, DateTime<Utc>>,
    ) -> Vec<(JobId, State)> {
        let mut ends_after = Vec::new();
        for (id, j) in judged {
            if !j.ends_after.is_empty() && j.ends > 1 {
                self.ended_twice.push((*id, j.ends));
            }
            if j.row_after && !j.stored {
                self.without_job.push(*id);
            }
            if let Some(at) = j.overlap {
                self.overlaps.push((*id, at));
            }
            if carried.contains_key(id) {
                ends_after.extend(j.ends_after.iter().map(|s| (*id, *s)));
            }
        }
        ends_after
    }

    /// The open work the rounds expect: the carried jobs not ended since, and the window's
    /// and the live part's not ended.
    fn expected_open(
        &self,
        carried: &HashMap<JobId, DateTime<Utc>>,
        ends_after: &[(JobId, State)],
    ) -> Vec<JobId> {
        let ended_since: HashSet<JobId> = ends_after.iter().map(|(id, _)| *id).collect();
        let not_ended = self.window.iter().chain(&self.live);
        carried
            .keys()
            .filter(|id| !ended_since.contains(id))
            .copied()
            .chain(
                not_ended
                    .filter(|(_, _, end)| end.is_none())
                    .map(|(id, _, _)| *id),
            )
            .collect()
    }

    /// Against the open work as listed: the carried jobs no longer in it, and the jobs in it
    /// that no round saw (each once).
    fn left_and_strays(&self, carried: &HashMap<JobId, DateTime<Utc>>) -> (Vec<JobId>, Vec<JobId>) {
        let seen: HashSet<JobId> = self
            .window
            .iter()
            .chain(&self.live)
            .map(|(id, _, _)| *id)
            .collect();
        let strays: HashSet<JobId> = self
            .open
            .iter()
            .filter(|id| !seen.contains(id) && !carried.contains_key(id))
            .copied()
            .collect();
        let open: HashSet<JobId> = self.open.iter().copied().collect();
        let left = carried.keys().filter(|id| !open.contains(id)).copied();
        (left.collect(), strays.into_iter().collect())
    }

    /// Each kind of finding, in order, at most `limit`.
    fn cut_findings(&mut self, limit: u32) {
        let cut = usize::try_from(limit).unwrap_or(usize::MAX);
        self.ended_twice.sort_unstable();
        self.ended_twice.truncate(cut);
        self.without_job.sort_unstable();
        self.without_job.truncate(cut);
        self.overlaps.sort_unstable();
        self.overlaps.truncate(cut);
    }
}

impl JobDb {
    /// One round of the ledger's reads ([`RoundAsk`]), in one snapshot.
    pub async fn ledger_round(&self, ask: RoundAsk<'_>) -> Result<RoundRead, JobDbError> {
        let from = ask.from.to_bytes().to_vec();
        let mut tx = self.begin().await?;
        let mut read = RoundRead::default();
        let mut under_way: HashMap<JobId, Vec<UnderWay>> = HashMap::new();
        for (id, attempts, began, at) in tx.under_way().await? {
            read.under_way.push((id, at));
            let attempts = u16::try_from(attempts).unwrap_or(u16::MAX);
            under_way.entry(id).or_default().push((attempts, began, at));
        }
        // Every row of the window's and the live part's jobs, judged job by job.
        let mut judging = Judge::new(ask.after, &under_way);
        tx.rows(Rows::From(&from), |job, row| judging.push(job, row))
            .await?;
        let mut judged = judging.done();
        // The older jobs' rows after the cursor. A carried job is judged by them alone: its
        // ends are all after the cursor, its `jobs` row was read in its window, and only a
        // later attempt (or one under way) can overlap an earlier one. Any other older job, a
        // carried one retried, and the imports are read whole, by id.
        let mut older: HashMap<JobId, Vec<Row>> = HashMap::new();
        tx.rows(Rows::OlderAfter(ask.after, &from), |job, row| {
            older.entry(job).or_default().push(row)
        })
        .await?;
        let imported: Vec<(Judged, bool)> = tx
            .imported_since(ask.imported_from)
            .await?
            .into_iter()
            .map(|(id, made, at)| ((id, made, None), at >= ask.imported_to))
            .collect();
        let looked = read_whole(&ask, &older, &under_way, &imported);
        let mut judging = Judge::new(ask.after, &under_way);
        let mut stored = Vec::new();
        for chunk in looked.chunks(MAX_IDS_PER_SELECT) {
            tx.rows(Rows::Of(chunk), |job, row| judging.push(job, row))
                .await?;
            stored.extend(tx.stored(chunk).await?);
        }
        // The older jobs' ids are below the window's, so the two sets do not meet.
        judged.extend(judge_older(
            older,
            &looked,
            judging.done(),
            &stored,
            &ask,
            &under_way,
        ));
        // The window and the live part.
        let from_imports: HashSet<JobId> = tx.imported_from(&from).await?.into_iter().collect();
        tx.jobs_from(&from, |id, made| {
            let end = judged.get_mut(&id).and_then(|j| {
                j.stored = true;
                j.end
            });
            if from_imports.contains(&id) {
                return;
            }
            let part = if id < ask.to {
                &mut read.window
            } else {
                &mut read.live
            };
            part.push((id, made, end));
        })
        .await?;
        read.place_imports(imported, &judged);
        let ends_after = read.take_findings(&judged, ask.carried);
        let expected = read.expected_open(ask.carried, &ends_after);
        let count = tx.open_count().await?;
        // The open work is what the rounds expect when it holds as many jobs: then it is not
        // listed. A difference (a job vanished, listed twice, ended and open, stored late)
        // lists it whole, and so does every round that asks.
        if !ask.list_open && usize::try_from(count).ok() == Some(expected.len()) {
            read.open = expected;
            read.carried_ends = ends_after;
        } else {
            read.open = tx.open().await?;
            read.listed_open = true;
            read.look_up_open(&mut tx, ask.carried).await?;
        }
        read.cut_findings(ask.limit);
        read.overdue = tx.overdue(ask.overdue_before, ask.limit).await?;
        read.last_row = tx.last_row().await?.unwrap_or(0);
        tx.rollback().await?;
        Ok(read)
    }
}

impl RoundRead {
    /// With the open work listed: the carried jobs no longer open, and the strays, looked up by
    /// id: the rows that end them, and whether their `jobs` rows are there. (A carried job
    /// still listed as open is taken to be open: a whole read checks it.)
    async fn look_up_open(
        &mut self,
        tx: &mut Tx,
        carried: &HashMap<JobId, DateTime<Utc>>,
    ) -> Result<(), JobDbError> {
        let (left, strays) = self.left_and_strays(carried);
        let (mut ends, mut stored) = (Vec::new(), HashSet::new());
        let looked: Vec<JobId> = left.iter().chain(&strays).copied().collect();
        for chunk in looked.chunks(MAX_IDS_PER_SELECT) {
            ends.extend(tx.ends_of(chunk).await?);
            stored.extend(tx.stored(chunk).await?);
        }
        let ended: HashSet<JobId> = ends.iter().map(|(id, _)| *id).collect();
        self.carried_ends = ends
            .into_iter()
            .filter(|(id, _)| carried.contains_key(id))
            .collect();
        self.carried_gone = left
            .iter()
            .filter(|id| !stored.contains(id))
            .copied()
            .collect();
        self.strays = strays
            .iter()
            .map(|job| Stray {
                job: *job,
                ended: ended.contains(job),
                stored: stored.contains(job),
            })
            .collect();
        Ok(())
    }
}

/// Which transitions a round reads, each in `(job_id, id)` order.
enum Rows<'a> {
    /// Those of every job at or after an id (bytes).
    From(&'a [u8]),
    /// Those after a transition id of jobs before an id (bytes).
    OlderAfter(u64, &'a [u8]),
    /// Those of these jobs.
    Of(&'a [JobId]),
}

/// The statements of a round, one per method, each run in the round's transaction.
impl Tx {
    /// Attempts under way: job, attempts, the commit it began in, when.
    async fn under_way(&mut self) -> Result<Vec<(JobId, u64, u64, DateTime<Utc>)>, JobDbError> {
        with_tx!(self, |tx, q| {
            use sqlx::Row as _;
            let mut out = Vec::new();
            for row in sqlx::query(UNDER_WAY).fetch_all(&mut **tx).await? {
                out.push((
                    q::job_id_of(&row, "job_id")?,
                    row.try_get("attempts")?,
                    row.try_get("started_in")?,
                    q::time_of(&row, "started_at")?,
                ));
            }
            Ok(out)
        })
    }

    /// Hands each transition `rows` names to `each`, in order.
    async fn rows(
        &mut self,
        rows: Rows<'_>,
        mut each: impl FnMut(JobId, Row),
    ) -> Result<(), JobDbError> {
        with_tx!(self, |tx, q| {
            let row_of = |row: &q::DbRow| -> Result<(JobId, Row), JobDbError> {
                use sqlx::Row as _;
                Ok((
                    q::job_id_of(row, "job_id")?,
                    Row {
                        id: row.try_get("id")?,
                        state: q::state_of(row)?,
                        attempts: row.try_get("attempts")?,
                        started_in: row.try_get("started_in")?,
                        started_at: q::time_opt(row, "started_at")?,
                    },
                ))
            };
            match rows {
                Rows::From(from) => {
                    let mut rows = sqlx::query(ROWS_FROM).bind(from).fetch(&mut **tx);
                    while let Some(row) = rows.try_next().await? {
                        let (job, row) = row_of(&row)?;
                        each(job, row);
                    }
                }
                Rows::OlderAfter(after, from) => {
                    for row in sqlx::query(OLDER_ROWS_AFTER)
                        .bind(super::int(after))
                        .bind(from)
                        .fetch_all(&mut **tx)
                        .await?
                    {
                        let (job, row) = row_of(&row)?;
                        each(job, row);
                    }
                }
                Rows::Of(ids) => {
                    for row in q::ids_query(ROWS_OF, ids, ") ORDER BY job_id, id")
                        .build()
                        .fetch_all(&mut **tx)
                        .await?
                    {
                        let (job, row) = row_of(&row)?;
                        each(job, row);
                    }
                }
            }
            Ok(())
        })
    }

    /// Jobs imported since a time: id, when made, when imported.
    async fn imported_since(
        &mut self,
        since: DateTime<Utc>,
    ) -> Result<Vec<(JobId, DateTime<Utc>, DateTime<Utc>)>, JobDbError> {
        with_tx!(self, |tx, q| {
            let mut out = Vec::new();
            for row in sqlx::query(IMPORTED_SINCE)
                .bind(since.naive_utc())
                .fetch_all(&mut **tx)
                .await?
            {
                out.push((
                    q::job_id_of(&row, "id")?,
                    q::time_of(&row, "created_at")?,
                    q::time_of(&row, "imported_at")?,
                ));
            }
            Ok(out)
        })
    }

    /// Which of these jobs have their `jobs` row.
    async fn stored(&mut self, ids: &[JobId]) -> Result<Vec<JobId>, JobDbError> {
        with_tx!(self, |tx, q| {
            let mut out = Vec::new();
            for row in q::ids_query(JOBS_OF, ids, ")")
                .build()
                .fetch_all(&mut **tx)
                .await?
            {
                out.push(q::job_id_of(&row, "job_id")?);
            }
            Ok(out)
        })
    }

    /// Jobs at or after an id (bytes) that were imported.
    async fn imported_from(&mut self, from: &[u8]) -> Result<Vec<JobId>, JobDbError> {
        with_tx!(self, |tx, q| {
            let mut out = Vec::new();
            for row in sqlx::query(IMPORTED_FROM)
                .bind(from)
                .fetch_all(&mut **tx)
                .await?
            {
                out.push(q::job_id_of(&row, "job_id")?);
            }
            Ok(out)
        })
    }

    /// Hands every job at or after an id (bytes), and when it was made, to `each`.
    async fn jobs_from(
        &mut self,
        from: &[u8],
        mut each: impl FnMut(JobId, DateTime<Utc>),
    ) -> Result<(), JobDbError> {
        with_tx!(self, |tx, q| {
            let mut jobs = sqlx::query(JOBS_FROM).bind(from).fetch(&mut **tx);
            while let Some(row) = jobs.try_next().await? {
                each(q::job_id_of(&row, "id")?, q::time_of(&row, "created_at")?);
            }
            Ok(())
        })
    }

    /// How many jobs the open work lists.
    async fn open_count(&mut self) -> Result<i64, JobDbError> {
        with_tx!(self, |tx, _q| Ok(sqlx::query_scalar(OPEN_COUNT)
            .fetch_one(&mut **tx)
            .await?))
    }

    /// The open work's jobs.
    async fn open(&mut self) -> Result<Vec<JobId>, JobDbError> {
        with_tx!(self, |tx, q| {
            let mut out = Vec::new();
            for row in sqlx::query(OPEN).fetch_all(&mut **tx).await? {
                out.push(q::job_id_of(&row, "job_id")?);
            }
            Ok(out)
        })
    }

    /// The rows that end these jobs.
    async fn ends_of(&mut self, ids: &[JobId]) -> Result<Vec<(JobId, State)>, JobDbError> {
        with_tx!(self, |tx, q| {
            let mut out = Vec::new();
            for row in q::ids_query(ENDS_OF, ids, ")")
                .build()
                .fetch_all(&mut **tx)
                .await?
            {
                out.push((q::job_id_of(&row, "job_id")?, q::state_of(&row)?));
            }
            Ok(out)
        })
    }

    /// At most `limit` open jobs that expired before a time, with their expiry.
    async fn overdue(
        &mut self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<(JobId, DateTime<Utc>)>, JobDbError> {
        with_tx!(self, |tx, q| {
            let mut out = Vec::new();
            for row in sqlx::query(OVERDUE)
                .bind(before.naive_utc())
                .bind(i64::from(limit))
                .fetch_all(&mut **tx)
                .await?
            {
                out.push((
                    q::job_id_of(&row, "job_id")?,
                    q::time_of(&row, "expire_at")?,
                ));
            }
            Ok(out)
        })
    }

    /// The last transition's id.
    async fn last_row(&mut self) -> Result<Option<u64>, JobDbError> {
        with_tx!(self, |tx, _q| Ok(sqlx::query_scalar(LAST_ROW)
            .fetch_one(&mut **tx)
            .await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u64, state: State, attempts: u16, started_in: Option<u64>) -> Row {
        Row {
            id,
            state,
            attempts,
            started_in,
            started_at: started_in.and_then(|c| DateTime::from_timestamp(c as i64, 0)),
        }
    }

    #[test]
    fn a_job_ends_at_its_first_ending_row_and_a_second_is_counted() {
        let rows = [
            row(3, State::AwaitingRetry, 1, Some(2)),
            row(5, State::Succeeded, 2, Some(4)),
            row(9, State::Discarded, 2, None),
        ];
        let j = judge(&rows, 6, &[]);
        assert_eq!(j.end, Some(State::Succeeded));
        assert_eq!(j.ends, 2);
        assert_eq!(j.ends_after, vec![State::Discarded]);
        assert!(j.row_after);
        assert_eq!(j.overlap, None);
        let before = judge(&rows, 9, &[]);
        assert!(!before.row_after && before.ends_after.is_empty());
    }

    #[test]
    fn an_attempt_begun_before_an_earlier_one_ended_overlaps_once_either_is_new() {
        // Attempt 2 began in commit 4; attempt 1's row is 6, after it.
        let rows = [
            row(6, State::AwaitingRetry, 1, Some(2)),
            row(8, State::Succeeded, 2, Some(4)),
        ];
        assert_eq!(judge(&rows, 0, &[]).overlap, rows[1].started_at);
        assert_eq!(
            judge(&rows, 7, &[]).overlap,
            rows[1].started_at,
            "the later row is new"
        );
        assert_eq!(
            judge(&rows, 8, &[]).overlap,
            None,
            "both rows were checked before"
        );
        // In order: attempt 1 ended (6) before attempt 2 began (7).
        let fine = [
            row(6, State::AwaitingRetry, 1, Some(2)),
            row(9, State::Succeeded, 2, Some(7)),
        ];
        assert_eq!(judge(&fine, 0, &[]).overlap, None);
        // The latest of the attempts below counts, not the last one read.
        let late = [
            row(12, State::AwaitingRetry, 1, Some(2)),
            row(10, State::AwaitingRetry, 2, Some(9)),
            row(14, State::Succeeded, 3, Some(13)),
        ];
        assert_eq!(judge(&late, 0, &[]).overlap, late[1].started_at);
    }

    #[test]
    fn an_attempt_under_way_begun_before_an_earlier_one_ended_overlaps_whatever_the_cursor() {
        let rows = [row(6, State::AwaitingRetry, 1, Some(2))];
        let at = DateTime::from_timestamp(4, 0).unwrap();
        assert_eq!(judge(&rows, 9, &[(2, 4, at)]).overlap, Some(at));
        assert_eq!(
            judge(&rows, 9, &[(2, 7, at)]).overlap,
            None,
            "begun after it ended"
        );
    }
}
