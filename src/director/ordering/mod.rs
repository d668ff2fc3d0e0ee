//! Ordered keys, one part: every decision about which job of a key may go. A producer's
//! `ordering_key` makes its jobs to one endpoint of one bucket a *sequence*: they go one at a
//! time, in acceptance order. Here is everything that decides it; the writer only writes what
//! it is told, and the store's ordering statements live beside it in `jobdb::ordering`.
//!
//! The words, each one idea:
//! - *position*: a job's place in its sequence, a ULID the accepting Director mints when it
//!   accepts it ([`Positions`]); a drainer's move keeps it.
//! - *head*: a sequence's waiting job of the lowest position; it may go when no job of the
//!   sequence is *under way* (released: an attempt, or a retry to come) and no *block* stops
//!   it (an `ordering_blocked` row, written when a job that asked to block ends without
//!   success, deleted only by an operator).
//! - *book* ([`book::Book`]): the writer's complete account of its JobDB's sequences, loaded
//!   at start and changed only by the commits that change the store. Heads come from it: no
//!   write reads one.
//! - *kept*: a new job due now that waits in the book only (fresh: no `open_jobs` entry, its
//!   commit's log row lists it) with the job itself; it rests held after `--rest-after-ms`,
//!   before an operator command reads the JobDB, or when its sequence spills. A kept job that
//!   is its sequence's head at once goes in the commit that stores it (*born released*).
//! - *mode* ([`plan::Mode`]): *alone* (no registry: no other JobDB can hold a job of a key, so
//!   every head goes in the writer's commits, and new jobs may be kept), or *cluster* (a head
//!   goes in the writer's commits when the intake *cleared* it against the other live JobDBs
//!   ([`survey::Clearance`]), otherwise after the *sequencer*'s read of them
//!   ([`sequencer::Sequencer`]); every ordered job has an entry, which is what those reads
//!   see).
//! - *spilled*: a sequence the book has no room for; the store alone holds it and the
//!   sequencer moves it.
//! - *begun on release*: a head that goes in the commit that ends the job before it begins its
//!   attempt in that commit too, when the scheduler offered its sequence.
//!
//! The decision of one write is a pure function ([`plan::plan`]); [`Ordering`] is what the
//! writer holds: the book, the mode, the intake's clearances, and the sequencer's channel.

pub mod book;
pub mod plan;
pub mod sequencer;
pub mod survey;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use ulid::Ulid;

use crate::job::{Job, JobId, Seq};
use crate::metrics::Metrics;
use book::{Book, Standing};
pub use plan::Write;
use plan::{Input, Mode, Plan};

/// Most cleared jobs remembered (beyond it the memory starts over: a forgotten clearance costs
/// the sequencer's round trip, never a wrong release).
const MAX_CLEARED: usize = 1_000_000;

/// The default most jobs a book holds (about 120 bytes each; kept jobs' bodies apart, bounded
/// by [`book::MAX_KEPT_BYTES`]); past it sequences spill.
pub const DEFAULT_BOOK_LIMIT: usize = 1_000_000;

/// Mints positions: ULIDs of this process's clock, strictly increasing, and above every
/// position its JobDB already holds (a new owner whose clock is behind the last one's still
/// places new jobs after the old).
#[derive(Debug)]
pub struct Positions {
    last: Mutex<Ulid>,
}

impl Positions {
    /// A minter whose positions are all above `floor` (the JobDB's highest open position).
    pub fn above(floor: Option<Ulid>) -> Self {
        Positions {
            last: Mutex::new(floor.unwrap_or(Ulid::nil())),
        }
    }

    /// The next position.
    pub fn next(&self) -> Ulid {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Ulid::new();
        let next = match now > *last {
            true => now,
            // The clock is behind the last position (or in the same millisecond): one above.
            false => last.increment().unwrap_or(now),
        };
        *last = next;
        next
    }

    /// Gives the ordered jobs of a batch their positions, in request order (jobs just made,
    /// so each is ours alone; one shared elsewhere keeps the position it has).
    pub fn place(&self, jobs: &mut [Arc<Job>]) {
        for job in jobs.iter_mut() {
            if job.ordering.is_some() {
                let position = self.next();
                if let Some(ordering) = Arc::get_mut(job).and_then(|j| j.ordering.as_mut()) {
                    ordering.position = position;
                }
            }
        }
    }
}

/// What the store did of a plan, as the write's answer tells it.
#[derive(Debug, Default)]
pub struct Done<'a> {
    /// Jobs released (by SQL, as expired, or as heads the store checked).
    pub released: Vec<JobId>,
    /// Leaving jobs of spilled sequences, with their sequences.
    pub left: &'a [(JobId, Seq)],
    /// Sequences the store blocked.
    pub blocked: &'a [Seq],
}

/// The ordering part the writer holds (see the module doc).
pub struct Ordering {
    mode: Mode,
    book: Book,
    /// Jobs the intake cleared (a cluster), until they go or leave.
    cleared: HashSet<JobId>,
    /// Told the sequences the sequencer must look at.
    sequencer: mpsc::UnboundedSender<Vec<Seq>>,
    /// Sequences the next write looks at again.
    touch: Vec<Seq>,
    /// The blocks left as the sequencer last read them (after barrier id `as_of`), for the
    /// next write.
    blocks_left: Option<(u64, HashSet<Seq>)>,
    metrics: Arc<Metrics>,
}

impl Ordering {
    /// The ordering of a writer in `mode` over `book`, telling `sequencer` what it must look
    /// at.
    pub fn new(
        mode: Mode,
        book: Book,
        sequencer: mpsc::UnboundedSender<Vec<Seq>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let ordering = Ordering {
            mode,
            book,
            cleared: HashSet::new(),
            sequencer,
            touch: Vec::new(),
            blocks_left: None,
            metrics,
        };
        ordering.gauge();
        ordering
    }

    /// The intake cleared these jobs against the other live JobDBs.
    pub fn cleared(&mut self, jobs: Vec<JobId>) {
        if jobs.is_empty() {
            return;
        }
        if self.cleared.len() + jobs.len() > MAX_CLEARED {
            self.cleared.clear();
        }
        self.cleared.extend(jobs);
    }

    /// The sequencer read the blocks left after every block written before id `as_of`: the
    /// next write lets go the keys whose block an operator deleted.
    pub fn blocks_left(&mut self, as_of: u64, left: HashSet<Seq>) {
        let lifted = self
            .book
            .blocked()
            .iter()
            .any(|(seq, at)| *at < as_of && !left.contains(seq));
        // Nothing to let go (the usual case): no write for it.
        if lifted {
            self.blocks_left = Some((as_of, left));
        }
    }

    /// Whether the next write has ordering work of its own (blocks to look at, heads to look
    /// at again), even with nothing else to write.
    pub fn pending(&self) -> bool {
        !self.touch.is_empty() || self.blocks_left.is_some()
    }

    /// Plans a write: what it stores, releases and blocks. The book changes as the write would;
    /// [`Ordering::committed`] keeps that, [`Ordering::rolled_back`] undoes it.
    pub fn plan(&mut self, write: &Write<'_>) -> Plan {
        self.book.begin();
        let input = Input {
            mode: self.mode,
            write,
            blocks_read: self.blocks_left.as_ref().map(|(at, left)| (*at, left)),
            cleared: &self.cleared,
            touch: &self.touch,
        };
        plan::plan(&mut self.book, &input)
    }

    /// A fresh ordered job gets its entry in the planned write: whether the entry goes in
    /// held (it waits for its turn) or released (under way). `None`: not in the book.
    pub fn rest(&mut self, job: &JobId) -> Option<bool> {
        match self.book.standing(job)? {
            Standing::Kept => {
                self.book.rest(job);
                Some(true)
            }
            Standing::Held => Some(true),
            Standing::UnderWay => Some(false),
        }
    }

    /// The planned write committed, and the store did `done` (at ids below `at`).
    pub fn committed(&mut self, plan: &Plan, done: &Done<'_>, at: u64) {
        self.book.commit();
        self.touch.clear();
        self.blocks_left = None;
        let mut tell = plan.tell.clone();
        // A head the book says was held and waiting that the store did not release: the
        // store is right (an operator's SQL changed it); the book lets it go and looks again.
        let got: HashSet<JobId> = done.released.iter().copied().collect();
        for job in plan.release.iter().chain(&plan.release_expired) {
            if got.contains(job) {
                continue;
            }
            let Some(seq) = self.book.seq_of(job) else {
                continue;
            };
            tracing::warn!(job = %job, "an ordered job the writer's book held waiting was not waiting in the jobdb; its key moves on");
            self.metrics.ordered_heads_misremembered.inc();
            self.book.leave(job);
            self.touch.push(seq);
            tell.insert(seq);
        }
        for (_, seq) in done.left {
            self.book.count_spilled(*seq, false);
            tell.insert(*seq);
        }
        for seq in done.blocked {
            self.book.block(*seq, at);
        }
        if !self.cleared.is_empty() {
            for job in plan.going() {
                self.cleared.remove(&job);
            }
        }
        // New jobs that went at once (born released), fresh or with their entry released.
        let born_fresh = plan
            .go
            .iter()
            .filter(|(r, _)| plan.fresh.contains(&r.job.id))
            .count();
        let born = born_fresh + plan.released_entries.len();
        let begun = plan.go.iter().filter(|(_, begun)| *begun).count();
        self.metrics
            .ordered_released
            .inc_by((plan.release.len() + plan.go.len()) as u64);
        self.metrics.ordered_born.inc_by(born as u64);
        self.metrics
            .ordered_kept
            .inc_by((plan.fresh.len() - born_fresh) as u64);
        self.metrics.ordered_begun_on_release.inc_by(begun as u64);
        self.metrics.ordered_spilled.inc_by(plan.spilled as u64);
        self.gauge();
        if !tell.is_empty() {
            let _ = self.sequencer.send(tell.into_iter().collect());
        }
    }

    /// The planned write did not commit: the book is as it was before the plan.
    pub fn rolled_back(&mut self) {
        self.book.rollback();
    }

    /// Whether some sequence is spilled (a write's leaving jobs may then block one in the
    /// store).
    pub fn spilled(&self) -> bool {
        self.book.any_spilled()
    }

    /// Every kept job (they rest before an operator command reads the JobDB).
    pub fn kept(&self) -> Vec<JobId> {
        self.book.kept()
    }

    /// When the first kept job expires.
    pub fn next_kept_expiry(&self) -> Option<DateTime<Utc>> {
        self.book.next_kept_expiry()
    }

    /// Kept jobs whose expiry passed by `now` go, to be ended by the scheduler untried: under
    /// way from now on, so their keys wait for those ends. No write is needed (they are fresh).
    pub fn expire_kept(&mut self, now: DateTime<Utc>) -> Vec<Arc<Job>> {
        let expired = self.book.kept_expired(now);
        let went: Vec<Arc<Job>> = expired.iter().filter_map(|job| self.book.go(job)).collect();
        self.gauge();
        went
    }

    fn gauge(&self) {
        self.metrics
            .ordered_booked
            .set(i64::try_from(self.book.len()).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_rise_above_their_floor_and_each_other() {
        // A floor an hour ahead of this clock (the last owner's clock was ahead).
        let ahead = Ulid::from_parts(
            u64::try_from((Utc::now() + chrono::Duration::hours(1)).timestamp_millis()).unwrap(),
            7,
        );
        let positions = Positions::above(Some(ahead));
        let mut last = ahead;
        for _ in 0..1000 {
            let p = positions.next();
            assert!(p > last);
            last = p;
        }
        let fresh = Positions::above(None);
        let (a, b) = (fresh.next(), fresh.next());
        assert!(b > a);
        assert!(a.timestamp_ms() + 1000 > u64::try_from(Utc::now().timestamp_millis()).unwrap());
    }
}
