//! The book: what the writer knows of its JobDB's sequences, completely.
//!
//! The writer is the only one who adds, releases or ends ordered jobs in its JobDB (a drainer's
//! moves come through it as imports, operator commands and the scheduler's ends are its
//! writes; an operator's SQL only deletes `ordering_blocked` rows). So once a new owner has read
//! every ordered entry and block at start ([`Book::load`]), the book tells every sequence's state
//! as well as the store does, at no statement's cost: which of its jobs is *under way*
//! (released), which *wait* (in position order), and whether it is *blocked*. A waiting job may
//! be *kept*: a fresh job with no entry in the store, held in the book with the job itself
//! (Director alone only). The book changes only with the commits that change the store: every
//! change made while a write is planned is journaled ([`Book::begin`]), and undone if that
//! write does not commit ([`Book::rollback`]).
//!
//! The book holds at most `limit` jobs. A sequence it cannot hold is *spilled*: the store alone
//! holds it (every job of it has an entry), the book only counts its open jobs, and its heads
//! go by the sequencer's reads of the store, as across JobDBs. A spilled sequence is booked
//! again once its count reaches zero.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use ulid::Ulid;

use crate::job::{Job, JobId, Seq};

/// Most bytes of kept jobs (as [`crate::jobdb::job_row_bytes`] counts them): beyond it a new
/// job waits with its entry, as it would without memory.
pub const MAX_KEPT_BYTES: usize = 64 * 1024 * 1024;

/// A waiting job: whether its unsuccessful end blocks its key, and, if it is kept (no entry),
/// the job itself.
#[derive(Clone, Debug)]
struct Wait {
    blocks: bool,
    kept: Option<Arc<Job>>,
}

/// One booked sequence.
#[derive(Clone, Debug, Default)]
struct Sequence {
    /// Jobs released: an attempt under way or a retry to come (one, except a held job
    /// released only to be ended as expired).
    under_way: Vec<Going>,
    /// Jobs waiting for their turn, by position then id.
    waiting: BTreeMap<(Ulid, JobId), Wait>,
    /// A block stops it (an `ordering_blocked` row), written at or after this id.
    blocked: Option<u64>,
}

impl Sequence {
    fn is_empty(&self) -> bool {
        self.under_way.is_empty() && self.waiting.is_empty() && self.blocked.is_none()
    }

    fn jobs(&self) -> usize {
        self.under_way.len() + self.waiting.len()
    }
}

/// A job under way: its place, and whether its unsuccessful end blocks its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Going {
    job: JobId,
    position: Ulid,
    blocks: bool,
}

/// A sequence the store alone holds: how many of its jobs are open, and its block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Spilled {
    open: u32,
    blocked: Option<u64>,
}

/// Where a booked job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Waiting for its turn, with an entry in the store (`held = 1`).
    Held,
    /// Waiting for its turn in the book only (fresh, no entry).
    Kept,
    /// Released: its sequence's job under way.
    UnderWay,
}

/// What a write's plan changed, to be undone if the write does not commit.
#[derive(Debug)]
enum Undo {
    /// A sequence was made.
    Made(Seq),
    /// A sequence that emptied was dropped.
    Dropped(Seq, Sequence),
    /// A job began to wait.
    Waited(JobId),
    /// A waiting job went (its kept body, if any).
    Went(JobId, Ulid, Wait),
    /// A job left its sequence: it was waiting, or under way.
    LeftWaiting(JobId, Seq, Ulid, Wait),
    LeftUnderWay(Seq, Going),
    /// A kept job got its entry.
    Rested(JobId, Arc<Job>),
    /// A sequence's block changed.
    Block(Seq, Option<u64>),
    /// A spilled sequence's count or block changed (its former state, if it was spilled).
    Spill(Seq, Option<Spilled>),
    /// A booked sequence was spilled whole.
    Spilled(Seq, Sequence),
}

/// The writer's book of its JobDB's sequences (see the module doc).
#[derive(Debug)]
pub struct Book {
    seqs: HashMap<Seq, Sequence>,
    /// Every booked job: its sequence and position.
    jobs: HashMap<JobId, (Seq, Ulid)>,
    spilled: HashMap<Seq, Spilled>,
    /// Kept jobs by expiry, and their bytes.
    kept_expiry: BTreeSet<(DateTime<Utc>, JobId)>,
    kept_bytes: usize,
    /// Most jobs booked.
    limit: usize,
    /// The changes since [`Book::begin`], while a write is planned.
    journal: Option<Vec<Undo>>,
}

impl Book {
    /// An empty book of at most `limit` jobs.
    pub fn new(limit: usize) -> Self {
        Book {
            seqs: HashMap::new(),
            jobs: HashMap::new(),
            spilled: HashMap::new(),
            kept_expiry: BTreeSet::new(),
            kept_bytes: 0,
            limit,
            journal: None,
        }
    }

    /// A book of what a new owner read: every ordered entry (`job`, its sequence, position,
    /// whether it is held, whether its end may block its key) and every block. Sequences past
    /// the limit are spilled.
    pub fn load(
        limit: usize,
        entries: Vec<crate::jobdb::OrderedEntry>,
        blocked: impl IntoIterator<Item = Seq>,
    ) -> Self {
        let mut book = Book::new(limit);
        let mut by_seq: BTreeMap<Seq, Vec<crate::jobdb::OrderedEntry>> = BTreeMap::new();
        for e in entries {
            by_seq.entry(e.seq).or_default().push(e);
        }
        for (seq, entries) in by_seq {
            if book.jobs.len() + entries.len() > limit {
                let open = u32::try_from(entries.len()).unwrap_or(u32::MAX);
                book.spilled.insert(
                    seq,
                    Spilled {
                        open,
                        blocked: None,
                    },
                );
                continue;
            }
            for e in entries {
                match e.held {
                    true => book.wait(seq, e.position, e.job, e.blocks, None),
                    false => book.under_way(seq, e.job, e.position, e.blocks),
                }
            }
        }
        for seq in blocked {
            book.block(seq, 0);
        }
        book
    }

    /// Starts journaling: what changes until [`Book::commit`] or [`Book::rollback`] is one
    /// write's plan.
    pub fn begin(&mut self) {
        self.journal = Some(Vec::new());
    }

    /// The planned write committed: its changes stay.
    pub fn commit(&mut self) {
        self.journal = None;
    }

    /// The planned write did not commit: its changes are undone, last first.
    pub fn rollback(&mut self) {
        let Some(journal) = self.journal.take() else {
            return;
        };
        for undo in journal.into_iter().rev() {
            self.undo(undo);
        }
    }

    fn note(&mut self, undo: Undo) {
        if let Some(journal) = &mut self.journal {
            journal.push(undo);
        }
    }

    /// How many jobs it books.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether it books no job.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Whether `seq` is spilled (the store alone holds it).
    pub fn is_spilled(&self, seq: &Seq) -> bool {
        self.spilled.contains_key(seq)
    }

    /// Whether any sequence is spilled.
    pub fn any_spilled(&self) -> bool {
        !self.spilled.is_empty()
    }

    /// Where a booked `job` stands (`None`: not booked).
    pub fn standing(&self, job: &JobId) -> Option<Standing> {
        let (seq, position) = self.jobs.get(job)?;
        let s = self.seqs.get(seq)?;
        match s.waiting.get(&(*position, *job)) {
            Some(Wait { kept: Some(_), .. }) => Some(Standing::Kept),
            Some(_) => Some(Standing::Held),
            None => Some(Standing::UnderWay),
        }
    }

    /// The sequence of a booked `job`.
    pub fn seq_of(&self, job: &JobId) -> Option<Seq> {
        self.jobs.get(job).map(|(seq, _)| *seq)
    }

    /// Whether a booked `job`'s unsuccessful end blocks its key.
    pub fn blocks(&self, job: &JobId) -> bool {
        let Some((seq, position)) = self.jobs.get(job) else {
            return false;
        };
        let Some(s) = self.seqs.get(seq) else {
            return false;
        };
        match s.waiting.get(&(*position, *job)) {
            Some(w) => w.blocks,
            None => s.under_way.iter().any(|g| g.job == *job && g.blocks),
        }
    }

    /// The job that may go next in `seq`: its first waiting job, when none is under way and
    /// no block stops it.
    pub fn head(&self, seq: &Seq) -> Option<JobId> {
        let s = self.seqs.get(seq)?;
        if !s.under_way.is_empty() || s.blocked.is_some() {
            return None;
        }
        s.waiting.keys().next().map(|(_, job)| *job)
    }

    /// Whether a block stops the booked `seq`.
    pub fn head_blocked(&self, seq: &Seq) -> bool {
        self.seqs.get(seq).is_some_and(|s| s.blocked.is_some())
    }

    /// Whether `bytes` more of kept jobs fit.
    pub fn kept_room(&self, bytes: usize) -> bool {
        self.kept_bytes.saturating_add(bytes) <= MAX_KEPT_BYTES
    }

    /// Whether one more job fits.
    pub fn has_room(&self) -> bool {
        self.jobs.len() < self.limit
    }

    /// Every kept job.
    pub fn kept(&self) -> Vec<JobId> {
        self.kept_expiry.iter().map(|(_, job)| *job).collect()
    }

    /// The kept jobs of `seq`.
    pub fn kept_in(&self, seq: &Seq) -> Vec<JobId> {
        self.seqs.get(seq).map_or_else(Vec::new, |s| {
            s.waiting
                .iter()
                .filter(|(_, w)| w.kept.is_some())
                .map(|((_, job), _)| *job)
                .collect()
        })
    }

    /// Kept jobs whose expiry passed by `now`.
    pub fn kept_expired(&self, now: DateTime<Utc>) -> Vec<JobId> {
        self.kept_expiry
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, job)| *job)
            .collect()
    }

    /// When the first kept job expires.
    pub fn next_kept_expiry(&self) -> Option<DateTime<Utc>> {
        self.kept_expiry.first().map(|(at, _)| *at)
    }

    /// The blocked sequences (booked or spilled), each with the id its block was written at
    /// or after.
    pub fn blocked(&self) -> Vec<(Seq, u64)> {
        let booked = self
            .seqs
            .iter()
            .filter_map(|(seq, s)| s.blocked.map(|at| (*seq, at)));
        let spilled = self
            .spilled
            .iter()
            .filter_map(|(seq, s)| s.blocked.map(|at| (*seq, at)));
        booked.chain(spilled).collect()
    }

    /// `job` waits in `seq` at `position` (kept: in the book only, with the job). A job booked
    /// already is left as it is.
    pub fn wait(
        &mut self,
        seq: Seq,
        position: Ulid,
        job: JobId,
        blocks: bool,
        kept: Option<Arc<Job>>,
    ) {
        if self.jobs.contains_key(&job) {
            return;
        }
        self.make(seq);
        if let Some(body) = &kept {
            self.kept_bytes += crate::jobdb::job_row_bytes(body);
            self.kept_expiry.insert((body.expire_at, job));
        }
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.waiting.insert((position, job), Wait { blocks, kept });
        }
        self.jobs.insert(job, (seq, position));
        self.note(Undo::Waited(job));
    }

    /// A job booked at load as under way (released in the store).
    fn under_way(&mut self, seq: Seq, job: JobId, position: Ulid, blocks: bool) {
        let going = Going {
            job,
            position,
            blocks,
        };
        self.seqs.entry(seq).or_default().under_way.push(going);
        self.jobs.insert(job, (seq, position));
    }

    /// The waiting `job` goes: under way from now on. Returns it if it was kept (it goes on
    /// from the book, with no entry); `None` for a job with an entry (or not waiting).
    pub fn go(&mut self, job: &JobId) -> Option<Arc<Job>> {
        let (seq, position) = *self.jobs.get(job)?;
        let s = self.seqs.get_mut(&seq)?;
        let wait = s.waiting.remove(&(position, *job))?;
        s.under_way.push(Going {
            job: *job,
            position,
            blocks: wait.blocks,
        });
        let body = wait.kept.clone();
        if let Some(body) = &body {
            self.unkeep(*job, body);
        }
        self.note(Undo::Went(*job, position, wait));
        body
    }

    /// `job` leaves its sequence (it ended, or moved to `archiving`). A sequence left with
    /// nothing is dropped.
    pub fn leave(&mut self, job: &JobId) {
        let Some((seq, position)) = self.jobs.remove(job) else {
            return;
        };
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        let undo = match s.waiting.remove(&(position, *job)) {
            Some(wait) => Undo::LeftWaiting(*job, seq, position, wait),
            None => match s.under_way.iter().position(|g| g.job == *job) {
                Some(at) => Undo::LeftUnderWay(seq, s.under_way.remove(at)),
                None => return,
            },
        };
        if let Undo::LeftWaiting(
            _,
            _,
            _,
            Wait {
                kept: Some(body), ..
            },
        ) = &undo
        {
            let body = body.clone();
            self.unkeep(*job, &body);
        }
        self.note(undo);
        self.drop_if_empty(seq);
    }

    /// A kept `job` gets its held entry (it rests): the book no longer holds the job itself.
    pub fn rest(&mut self, job: &JobId) {
        let Some((seq, position)) = self.jobs.get(job).copied() else {
            return;
        };
        let Some(w) = self
            .seqs
            .get_mut(&seq)
            .and_then(|s| s.waiting.get_mut(&(position, *job)))
        else {
            return;
        };
        let Some(body) = w.kept.take() else {
            return;
        };
        self.unkeep(*job, &body);
        self.note(Undo::Rested(*job, body));
    }

    /// A block (written at or after id `at`) stops `seq`, booked, spilled or new.
    pub fn block(&mut self, seq: Seq, at: u64) {
        if let Some(s) = self.spilled.get(&seq).copied() {
            if s.blocked.is_none() {
                self.spilled.insert(
                    seq,
                    Spilled {
                        blocked: Some(at),
                        ..s
                    },
                );
                self.note(Undo::Spill(seq, Some(s)));
            }
            return;
        }
        self.make(seq);
        if let Some(s) = self.seqs.get_mut(&seq) {
            if s.blocked.is_none() {
                s.blocked = Some(at);
                self.note(Undo::Block(seq, None));
            }
        }
    }

    /// An operator deleted `seq`'s block.
    pub fn unblock(&mut self, seq: &Seq) {
        if let Some(s) = self.spilled.get(seq).copied() {
            self.note(Undo::Spill(*seq, Some(s)));
            match s.open {
                0 => {
                    self.spilled.remove(seq);
                }
                _ => {
                    self.spilled.insert(*seq, Spilled { blocked: None, ..s });
                }
            }
            return;
        }
        if let Some(s) = self.seqs.get_mut(seq) {
            if let Some(was) = s.blocked.take() {
                self.note(Undo::Block(*seq, Some(was)));
                self.drop_if_empty(*seq);
            }
        }
    }

    /// Spills the booked `seq` whole: the store alone holds it from now on. Returns its jobs
    /// that have no entry the store can see (kept ones, which must rest held, and those under
    /// way, which must rest released if they are fresh), with whether each waits.
    pub fn spill(&mut self, seq: Seq) -> Vec<(JobId, bool)> {
        let Some(s) = self.seqs.remove(&seq) else {
            return Vec::new();
        };
        let mut unseen = Vec::new();
        for ((_, job), wait) in &s.waiting {
            self.jobs.remove(job);
            if let Some(body) = &wait.kept {
                self.unkeep(*job, body);
                unseen.push((*job, true));
            }
        }
        for g in &s.under_way {
            self.jobs.remove(&g.job);
            unseen.push((g.job, false));
        }
        let was = self.spilled.get(&seq).copied();
        self.spilled.insert(
            seq,
            Spilled {
                open: u32::try_from(s.jobs()).unwrap_or(u32::MAX),
                blocked: s.blocked,
            },
        );
        self.note(Undo::Spill(seq, was));
        self.note(Undo::Spilled(seq, s));
        unseen
    }

    /// A job of the spilled `seq` arrived (`more`), or left.
    pub fn count_spilled(&mut self, seq: Seq, more: bool) {
        let was = self.spilled.get(&seq).copied();
        let mut s = was.unwrap_or_default();
        s.open = match more {
            true => s.open.saturating_add(1),
            false => s.open.saturating_sub(1),
        };
        match s.open == 0 && s.blocked.is_none() {
            true => self.spilled.remove(&seq),
            false => self.spilled.insert(seq, s),
        };
        self.note(Undo::Spill(seq, was));
    }

    /// Makes `seq`'s (empty) sequence if it has none.
    fn make(&mut self, seq: Seq) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.seqs.entry(seq) {
            e.insert(Sequence::default());
            self.note(Undo::Made(seq));
        }
    }

    fn unkeep(&mut self, job: JobId, body: &Job) {
        self.kept_bytes = self
            .kept_bytes
            .saturating_sub(crate::jobdb::job_row_bytes(body));
        self.kept_expiry.remove(&(body.expire_at, job));
    }

    fn keep(&mut self, job: JobId, body: &Job) {
        self.kept_bytes += crate::jobdb::job_row_bytes(body);
        self.kept_expiry.insert((body.expire_at, job));
    }

    fn drop_if_empty(&mut self, seq: Seq) {
        if self.seqs.get(&seq).is_some_and(Sequence::is_empty) {
            if let Some(s) = self.seqs.remove(&seq) {
                self.note(Undo::Dropped(seq, s));
            }
        }
    }

    fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::Made(seq) => {
                self.seqs.remove(&seq);
            }
            Undo::Dropped(seq, s) => {
                self.seqs.insert(seq, s);
            }
            Undo::Waited(job) => {
                if let Some((seq, position)) = self.jobs.remove(&job) {
                    let wait = self
                        .seqs
                        .get_mut(&seq)
                        .and_then(|s| s.waiting.remove(&(position, job)));
                    if let Some(body) = wait.and_then(|w| w.kept) {
                        self.unkeep(job, &body);
                    }
                }
            }
            Undo::Went(job, position, wait) => {
                if let Some((seq, _)) = self.jobs.get(&job).copied() {
                    if let Some(body) = &wait.kept {
                        self.keep(job, body);
                    }
                    if let Some(s) = self.seqs.get_mut(&seq) {
                        s.under_way.retain(|g| g.job != job);
                        s.waiting.insert((position, job), wait);
                    }
                }
            }
            // A sequence dropped when it emptied was put back first (undone in reverse).
            Undo::LeftWaiting(job, seq, position, wait) => {
                if let Some(body) = &wait.kept {
                    self.keep(job, body);
                }
                if let Some(s) = self.seqs.get_mut(&seq) {
                    s.waiting.insert((position, job), wait);
                    self.jobs.insert(job, (seq, position));
                }
            }
            Undo::LeftUnderWay(seq, going) => {
                if let Some(s) = self.seqs.get_mut(&seq) {
                    s.under_way.push(going);
                    self.jobs.insert(going.job, (seq, going.position));
                }
            }
            Undo::Rested(job, body) => {
                if let Some((seq, position)) = self.jobs.get(&job).copied() {
                    self.keep(job, &body);
                    if let Some(w) = self
                        .seqs
                        .get_mut(&seq)
                        .and_then(|s| s.waiting.get_mut(&(position, job)))
                    {
                        w.kept = Some(body);
                    }
                }
            }
            Undo::Block(seq, was) => {
                if let Some(s) = self.seqs.get_mut(&seq) {
                    s.blocked = was;
                }
            }
            Undo::Spill(seq, was) => {
                match was {
                    Some(s) => self.spilled.insert(seq, s),
                    None => self.spilled.remove(&seq),
                };
            }
            Undo::Spilled(seq, s) => {
                for ((position, job), wait) in &s.waiting {
                    self.jobs.insert(*job, (seq, *position));
                    if let Some(body) = &wait.kept {
                        self.keep(*job, body);
                    }
                }
                for g in &s.under_way {
                    self.jobs.insert(g.job, (seq, g.position));
                }
                self.seqs.insert(seq, s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn seq(n: u8) -> Seq {
        Seq([n; 16])
    }

    fn id(n: u128) -> JobId {
        JobId(Ulid(n))
    }

    fn body(n: u128) -> Arc<Job> {
        let mut job = crate::job::tests::sample();
        job.id = id(n);
        Arc::new(job)
    }

    /// What the book says, in a form that compares: per sequence, its jobs under way, its
    /// waiting jobs (kept or not) and its block; the spilled counts; the kept accounting.
    fn state(b: &Book) -> String {
        let mut seqs: Vec<String> = b
            .seqs
            .iter()
            .map(|(seq, s)| {
                let mut under: Vec<_> = s.under_way.iter().map(|g| (g.job, g.blocks)).collect();
                under.sort();
                let waiting: Vec<_> = s
                    .waiting
                    .iter()
                    .map(|(k, w)| (*k, w.blocks, w.kept.as_ref().map(|j| j.id)))
                    .collect();
                format!("{seq:?} {under:?} {waiting:?} {:?}", s.blocked)
            })
            .collect();
        seqs.sort();
        let mut jobs: Vec<_> = b.jobs.iter().collect();
        jobs.sort();
        let mut spilled: Vec<_> = b.spilled.iter().collect();
        spilled.sort();
        format!(
            "{seqs:?}\n{jobs:?}\n{spilled:?}\n{:?} {}",
            b.kept_expiry, b.kept_bytes
        )
    }

    #[test]
    fn a_sequence_goes_one_job_at_a_time_by_position() {
        let mut b = Book::new(100);
        b.wait(seq(1), Ulid(30), id(3), false, None);
        b.wait(seq(1), Ulid(20), id(2), false, Some(body(2)));
        // A move's import keeps its old position: it goes first.
        b.wait(seq(1), Ulid(10), id(1), true, None);
        assert_eq!(b.head(&seq(1)), Some(id(1)));
        assert_eq!(b.standing(&id(2)), Some(Standing::Kept));
        assert_eq!(b.go(&id(1)).map(|j| j.id), None, "it has an entry");
        assert_eq!(b.standing(&id(1)), Some(Standing::UnderWay));
        assert!(b.blocks(&id(1)));
        assert_eq!(b.head(&seq(1)), None, "one is under way");
        b.leave(&id(1));
        assert_eq!(b.head(&seq(1)), Some(id(2)));
        assert_eq!(b.go(&id(2)).map(|j| j.id), Some(id(2)), "kept: from memory");
        assert!(b.kept().is_empty());
        b.leave(&id(2));
        b.rest(&id(3));
        b.block(seq(1), 7);
        assert_eq!(b.head(&seq(1)), None, "blocked");
        assert_eq!(b.blocked(), vec![(seq(1), 7)]);
        b.leave(&id(3));
        assert_eq!(b.len(), 0);
        b.unblock(&seq(1));
        assert!(b.seqs.is_empty(), "an emptied sequence is dropped");
    }

    #[test]
    fn a_spilled_sequence_is_counted_until_it_empties() {
        let mut b = Book::new(100);
        b.wait(seq(2), Ulid(1), id(1), false, None);
        b.wait(seq(2), Ulid(2), id(2), false, Some(body(2)));
        assert_eq!(b.go(&id(1)), None);
        let mut unseen = b.spill(seq(2));
        unseen.sort();
        assert_eq!(unseen, vec![(id(1), false), (id(2), true)]);
        assert!(b.is_spilled(&seq(2)) && b.is_empty() && b.kept_bytes == 0);
        b.count_spilled(seq(2), true);
        b.count_spilled(seq(2), false);
        b.count_spilled(seq(2), false);
        assert!(b.is_spilled(&seq(2)));
        b.block(seq(2), 3);
        b.count_spilled(seq(2), false);
        assert!(b.is_spilled(&seq(2)), "blocked: kept until unblocked");
        b.unblock(&seq(2));
        assert!(!b.is_spilled(&seq(2)));
    }

    #[test]
    fn a_load_books_held_and_released_entries_and_spills_past_its_limit() {
        let entry = |n: u128, s: u8, held: bool| crate::jobdb::OrderedEntry {
            job: id(n),
            seq: seq(s),
            position: Ulid(n),
            held,
            blocks: false,
        };
        let b = Book::load(
            3,
            vec![
                entry(1, 1, false),
                entry(2, 1, true),
                entry(3, 2, true),
                entry(4, 3, true),
                entry(5, 3, true),
            ],
            [seq(4)],
        );
        assert_eq!(b.head(&seq(1)), None, "job 1 is under way");
        assert_eq!(b.head(&seq(2)), Some(id(3)));
        assert!(b.is_spilled(&seq(3)), "past the limit");
        assert_eq!(b.blocked(), vec![(seq(4), 0)]);
    }

    /// Whatever a plan does, a rollback leaves the book as it was.
    #[test]
    fn a_rollback_undoes_every_change() {
        for run in 0..200u64 {
            let mut rng = StdRng::seed_from_u64(run);
            let mut b = Book::new(12);
            let mut next = 1u128;
            for round in 0..30 {
                let before = state(&b);
                let plan = round % 3 != 0;
                b.begin();
                for _ in 0..rng.random_range(1..8) {
                    let s = seq(rng.random_range(1..4));
                    let known: Vec<JobId> = b.jobs.keys().copied().collect();
                    let pick = |rng: &mut StdRng| {
                        (!known.is_empty()).then(|| known[rng.random_range(0..known.len())])
                    };
                    match rng.random_range(0..9) {
                        0 | 1 => {
                            let kept = rng.random_bool(0.5).then(|| body(next));
                            if b.has_room() {
                                b.wait(s, Ulid(next), id(next), rng.random_bool(0.3), kept);
                            }
                            next += 1;
                        }
                        2 => {
                            if let Some(j) = pick(&mut rng) {
                                b.go(&j);
                            }
                        }
                        3 => {
                            if let Some(j) = pick(&mut rng) {
                                b.leave(&j);
                            }
                        }
                        4 => {
                            if let Some(j) = pick(&mut rng) {
                                b.rest(&j);
                            }
                        }
                        5 => b.block(s, round),
                        6 => b.unblock(&s),
                        7 => {
                            b.spill(s);
                        }
                        _ => b.count_spilled(s, rng.random_bool(0.5)),
                    }
                }
                match plan {
                    true => {
                        b.rollback();
                        assert_eq!(state(&b), before, "run {run}, round {round}");
                    }
                    false => b.commit(),
                }
                // The index and the sequences agree.
                let indexed: usize = b.seqs.values().map(Sequence::jobs).sum();
                assert_eq!(indexed, b.jobs.len(), "run {run}, round {round}");
                let kept: usize = b
                    .seqs
                    .values()
                    .flat_map(|s| s.waiting.values())
                    .filter_map(|w| w.kept.as_ref())
                    .map(|j| crate::jobdb::job_row_bytes(j))
                    .sum();
                assert_eq!(kept, b.kept_bytes, "run {run}, round {round}");
                assert_eq!(b.kept_expiry.len(), b.kept().len());
            }
        }
    }
}
