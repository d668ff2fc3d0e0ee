//! One JobDB's ledger, kept from round to round: what earlier rounds counted (jobs accepted
//! and ended before the boundary), the jobs they found not ended (carried), the transition
//! cursor, and what the rows already checked showed (it stays until the JobDB goes).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Duration, Utc};

use super::{Context, Counted, Ends, Ledger, LIMIT};
use crate::job::JobId;
use crate::jobdb::ledger::{RoundAsk, RoundRead};
use crate::jobdb::JobDb;

/// How far behind now a round's boundary is: jobs newer than this are counted whole each
/// round (the live part), older ones once. A job is stored a few ms after its id is made; one
/// stored later than this (a router's forward retried) is adopted when a round finds it open,
/// and not counted if it ended unseen.
const LAG: Duration = Duration::seconds(2);

/// Every this many rounds the open work is listed whole even when its count is what the
/// rounds expect: two differences that cancel out (a job vanished while another was stored
/// late) are then named within this many rounds.
pub const LIST_OPEN_EVERY: u64 = 30;

/// One JobDB's ledger from round to round.
pub struct Tracker {
    name: String,
    lag: Duration,
    /// The next window's first id, and its time (imports are read by when they came).
    boundary: JobId,
    since: DateTime<Utc>,
    /// Rows after this transition id are still to be checked.
    after: u64,
    /// Jobs before the boundary: accepted, and ended by state.
    accepted: u64,
    ended: Ends,
    /// Jobs before the boundary that were not ended at the last round, with when made.
    carried: HashMap<JobId, DateTime<Utc>>,
    /// What the rows already checked showed (kept until the JobDB goes): jobs ended more
    /// than once (how many times), jobs without their `jobs` row, attempts that overlapped.
    ended_twice: BTreeMap<JobId, u64>,
    without_job: BTreeSet<JobId>,
    overlaps: BTreeMap<JobId, DateTime<Utc>>,
    /// Rounds read so far, and how often one lists the open work whole.
    rounds: u64,
    list_open_every: u64,
}

impl Tracker {
    /// A tracker of the JobDB named `name`; its first round reads the whole JobDB.
    pub fn new(name: &str) -> Tracker {
        Tracker::with_lag(name, LAG)
    }

    /// [`Tracker::new`] with another lag (a test's: zero reads every job by windows).
    pub fn with_lag(name: &str, lag: Duration) -> Tracker {
        Tracker {
            name: name.to_owned(),
            lag,
            boundary: JobId::from_bytes([0; 16]),
            since: DateTime::UNIX_EPOCH,
            after: 0,
            accepted: 0,
            ended: Ends::default(),
            carried: HashMap::new(),
            ended_twice: BTreeMap::new(),
            without_job: BTreeSet::new(),
            overlaps: BTreeMap::new(),
            rounds: 0,
            list_open_every: LIST_OPEN_EVERY,
        }
    }

    /// This tracker, listing the open work whole every `rounds` rounds (1: each round).
    pub fn listing_open_every(mut self, rounds: u64) -> Tracker {
        self.list_open_every = rounds.max(1);
        self
    }

    /// Jobs carried from round to round (not ended at the last one).
    pub fn carried(&self) -> usize {
        self.carried.len()
    }

    /// One round over `db`: reads what is new and what is open, and returns the ledger. A
    /// JobDB that cannot be read gives an `unreachable` ledger and leaves the tracker as it
    /// was. `owned`: whether the inventory says someone holds its lock.
    pub async fn round(&mut self, db: &JobDb, owned: Option<bool>, margin: Duration) -> Ledger {
        let now = Utc::now();
        let until = (now - self.lag).max(self.since);
        let to = boundary_at(until).max(self.boundary);
        let ask = RoundAsk {
            from: self.boundary,
            to,
            imported_from: self.since,
            imported_to: until,
            carried: &self.carried,
            after: self.after,
            overdue_before: now - margin,
            limit: LIMIT,
            list_open: self.rounds.is_multiple_of(self.list_open_every),
        };
        let read = match db.ledger_round(ask).await {
            Ok(read) => read,
            Err(e) => return Ledger::unreachable(&self.name, &crate::delivery::error_chain(&e)),
        };
        let timeouts = match timeouts(db, &read).await {
            Ok(t) => t,
            Err(e) => return Ledger::unreachable(&self.name, &crate::delivery::error_chain(&e)),
        };
        self.rounds += 1;
        self.fold(&read, to, until);
        let counted = self.counted(read);
        let cx = Context {
            now,
            margin,
            timeouts,
            owned,
        };
        Ledger::of(&self.name, &counted, &cx)
    }

    /// Takes a round's reads into the carried state.
    fn fold(&mut self, read: &RoundRead, to: JobId, until: DateTime<Utc>) {
        for (id, made, state) in &read.window {
            self.accepted += 1;
            match state {
                Some(state) => self.ended.add(*state, 1),
                None => {
                    self.carried.insert(*id, *made);
                }
            }
        }
        for (id, state) in &read.carried_ends {
            if self.carried.remove(id).is_some() {
                self.ended.add(*state, 1);
            }
        }
        // Open, stored, not ended, and no round saw it: stored after its window was read, or
        // imported with an old id. One that ended is left to the ledger (ended and open).
        for stray in read.strays.iter().filter(|s| s.stored && !s.ended) {
            self.accepted += 1;
            self.carried.insert(stray.job, made_at(stray.job));
        }
        self.ended_twice.extend(read.ended_twice.iter().copied());
        self.without_job
            .extend(read.without_job.iter().chain(&read.carried_gone));
        for (id, at) in &read.overlaps {
            self.overlaps.entry(*id).or_insert(*at);
        }
        self.boundary = to;
        self.since = until;
        self.after = self.after.max(read.last_row);
    }

    /// The ledger's view now: the carried counts plus the live part.
    fn counted(&self, read: RoundRead) -> Counted {
        let mut ended = self.ended;
        let mut not_ended = self.carried.clone();
        for (id, made, state) in &read.live {
            match state {
                Some(state) => ended.add(*state, 1),
                None => {
                    not_ended.insert(*id, *made);
                }
            }
        }
        Counted {
            accepted: self.accepted + read.live.len() as u64,
            ended,
            not_ended,
            open: read.open,
            ended_twice: self.ended_twice.iter().map(|(id, n)| (*id, *n)).collect(),
            without_job: self.without_job.iter().copied().collect(),
            under_way: read.under_way,
            overdue: read.overdue,
            overlaps: self.overlaps.iter().map(|(id, at)| (*id, *at)).collect(),
        }
    }
}

/// The execution timeouts of the jobs of the attempts under way (jobs never change: read
/// outside the round's snapshot).
async fn timeouts(
    db: &JobDb,
    read: &RoundRead,
) -> Result<HashMap<JobId, Duration>, crate::jobdb::JobDbError> {
    let ids: Vec<JobId> = read.under_way.iter().map(|(id, _)| *id).collect();
    Ok(db
        .get_jobs(&ids)
        .await?
        .iter()
        .map(|j| {
            let t = Duration::from_std(j.execution_timeout).unwrap_or(Duration::MAX);
            (j.id, t)
        })
        .collect())
}

/// The lowest job id made at `t`.
fn boundary_at(t: DateTime<Utc>) -> JobId {
    let ms = u64::try_from(t.timestamp_millis()).unwrap_or(0);
    JobId(ulid::Ulid::from_parts(ms, 0))
}

/// When a job's id says it was made.
fn made_at(id: JobId) -> DateTime<Utc> {
    let ms = i64::try_from(id.0.timestamp_ms()).unwrap_or(i64::MAX);
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}
