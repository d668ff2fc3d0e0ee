//! What a writer alone knows of its sequences' `open_jobs` entries ([`KnownSequences`]), so
//! the commit that ends a key's job finds the key's next head without reading the store.
//!
//! A writer with no other live JobDB is the only one that adds, releases or deletes ordered
//! entries in its JobDB (a drainer's moves come through it as imports; the sequencer's
//! releases and the scheduler's ends are its writes). Once a read inside one of its
//! transactions finds a sequence with no entry and no block, every entry the sequence gets
//! afterwards is one its own writes put there: from then on memory tells the sequence's head
//! as well as the `(seq, held, position)` index does, at no statement's cost. A sequence is
//! *known* from that read until it has no entry again, until a block is written for it
//! (which only an operator's SQL lifts), or until a write fails (memory may then be ahead of
//! the store: all of it is forgotten). An unknown sequence is read from the store, as every
//! sequence was before.
//!
//! Memory also holds the *kept* jobs: a new ordered job of a known sequence that must wait
//! for a job before it is held here only, fresh (no entry; its commit's log row lists it),
//! with the job itself, instead of entered held. When its turn comes the commit that ends
//! the job before it hands it on from memory: no entry is inserted, released or deleted for
//! it, and nothing is read back. A kept job gets its held entry (rests) when its writer can
//! no longer vouch for memory: a sequence forgotten or all memory cleared (the writer is told
//! through [`KnownSequences::take_dropped_kept`]), its expiry, `rest_after`, an operator
//! command, a commit that finds another JobDB live, and a new owner's recovery.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use ulid::Ulid;

use crate::job::{Job, JobId, Seq};

/// Most entries remembered across all known sequences (about 100 bytes each): beyond it a
/// sequence is not learnt, and one that would grow past it is forgotten. Forgetting costs a
/// read of the store, never a wrong release.
pub const MAX_KNOWN_ENTRIES: usize = 1_000_000;

/// Most bytes of kept jobs (as [`super::job_row_bytes`] counts them): beyond it a new job is
/// entered held, as it would be without memory.
pub const MAX_KEPT_BYTES: usize = 64 * 1024 * 1024;

/// The entries of one known sequence.
#[derive(Debug, Default)]
struct Entries {
    /// Held entries, in the order their jobs go: position, then job id.
    held: BTreeSet<(Ulid, JobId)>,
    /// Released entries (`held = 0`): jobs under way or waiting for a retry.
    released: HashSet<JobId>,
}

impl Entries {
    fn is_empty(&self) -> bool {
        self.held.is_empty() && self.released.is_empty()
    }
}

/// A writer's memory of the entries of the sequences it knows completely (see the module
/// doc). The writer owns it; a write updates it as its statements change the store.
#[derive(Debug, Default)]
pub struct KnownSequences {
    seqs: HashMap<Seq, Entries>,
    /// Each remembered entry's job, with its sequence and position (`None`: released).
    jobs: HashMap<JobId, (Seq, Option<Ulid>)>,
    /// Kept jobs (held in memory only, no entry), whole: how a turn hands them on.
    kept: HashMap<JobId, Arc<Job>>,
    /// Bytes of `kept`.
    kept_bytes: usize,
    /// Sequences whose kept jobs memory dropped (forgotten) since the writer last asked: no
    /// head of theirs may be read from the store until those jobs have their entries.
    dropped: HashSet<Seq>,
    /// All memory of kept jobs was dropped (cleared) since the writer last asked.
    dropped_all: bool,
}

impl KnownSequences {
    /// Whether `seq` is known.
    pub fn knows(&self, seq: &Seq) -> bool {
        self.seqs.contains_key(seq)
    }

    /// How many sequences are known.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Whether no sequence is known.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// A read inside the current write found no entry and no block of `seq` (the store is
    /// right where memory disagrees).
    pub fn learn_empty(&mut self, seq: Seq) {
        self.forget(&seq);
        if self.jobs.len() < MAX_KNOWN_ENTRIES {
            self.seqs.insert(seq, Entries::default());
        }
    }

    /// The sequence of `job`, when its entry is remembered.
    pub fn seq_of(&self, job: &JobId) -> Option<Seq> {
        self.jobs.get(job).map(|(seq, _)| *seq)
    }

    /// The current write put (or kept) an entry of `job` in `seq` at `position`, held or
    /// released. An entry already remembered keeps its hold: a later row never changes it.
    pub fn entered(&mut self, seq: Seq, job: JobId, position: Ulid, held: bool) {
        let Some(entries) = self.seqs.get_mut(&seq) else {
            return;
        };
        if self.jobs.contains_key(&job) {
            // A kept job's rest: its held entry is in the store now.
            self.unkeep(&job);
            return;
        }
        if self.jobs.len() >= MAX_KNOWN_ENTRIES {
            self.forget(&seq);
            return;
        }
        match held {
            true => entries.held.insert((position, job)),
            false => entries.released.insert(job),
        };
        self.jobs.insert(job, (seq, held.then_some(position)));
    }

    /// The current write deleted `job`'s entry or took it out of its sequence. A sequence left
    /// with no entry is forgotten: its next arrival reads it again.
    pub fn left(&mut self, job: &JobId) {
        let Some((seq, position)) = self.jobs.remove(job) else {
            return;
        };
        self.unkeep(job);
        let Some(entries) = self.seqs.get_mut(&seq) else {
            return;
        };
        match position {
            Some(p) => entries.held.remove(&(p, *job)),
            None => entries.released.remove(job),
        };
        if entries.is_empty() {
            self.seqs.remove(&seq);
        }
    }

    /// Keeps `job`, a new ordered job at `position` of the known `seq`, in memory only (see
    /// the module doc): `false` when `seq` is not known or memory is full (it is entered
    /// held instead).
    pub fn keep(&mut self, seq: Seq, job: &Arc<Job>, position: Ulid) -> bool {
        let bytes = super::job_row_bytes(job);
        let Some(entries) = self.seqs.get_mut(&seq) else {
            return false;
        };
        if self.jobs.len() >= MAX_KNOWN_ENTRIES
            || self.kept_bytes.saturating_add(bytes) > MAX_KEPT_BYTES
            || self.jobs.contains_key(&job.id)
        {
            return false;
        }
        entries.held.insert((position, job.id));
        self.jobs.insert(job.id, (seq, Some(position)));
        self.kept.insert(job.id, job.clone());
        self.kept_bytes += bytes;
        true
    }

    /// Whether `job` is kept (held in memory, without an entry).
    pub fn is_kept(&self, job: &JobId) -> bool {
        self.kept.contains_key(job)
    }

    /// Hands on the kept `job` whose turn came: it leaves memory (it is under way, fresh, as a
    /// job born released is), its sequence stays known.
    pub fn go_on(&mut self, job: &JobId) -> Option<Arc<Job>> {
        let kept = self.kept.remove(job)?;
        self.kept_bytes = self.kept_bytes.saturating_sub(super::job_row_bytes(&kept));
        if let Some((seq, Some(position))) = self.jobs.remove(job) {
            if let Some(entries) = self.seqs.get_mut(&seq) {
                entries.held.remove(&(position, *job));
            }
        }
        Some(kept)
    }

    /// Forgets `seq` if nothing of it is remembered: its job under way (fresh, no entry)
    /// left and none went on after it.
    pub fn forget_if_empty(&mut self, seq: &Seq) {
        if self.seqs.get(seq).is_some_and(Entries::is_empty) {
            self.seqs.remove(seq);
        }
    }

    /// Whether memory of a kept job was dropped since the last call: every kept job must
    /// then get its held entry, since no memory vouches for its place any more.
    pub fn take_dropped_kept(&mut self) -> bool {
        let dropped = !self.dropped.is_empty() || self.dropped_all;
        self.dropped.clear();
        self.dropped_all = false;
        dropped
    }

    /// Whether memory dropped kept jobs of `seq` since the writer last asked: its head must
    /// not be read from the store, which cannot see them.
    pub fn dropped_kept(&self, seq: &Seq) -> bool {
        self.dropped.contains(seq)
    }

    fn unkeep(&mut self, job: &JobId) {
        if let Some(kept) = self.kept.remove(job) {
            self.kept_bytes = self.kept_bytes.saturating_sub(super::job_row_bytes(&kept));
        }
    }

    /// The current write released `job`'s held entry.
    pub fn released(&mut self, job: &JobId) {
        let Some((seq, position)) = self.jobs.get_mut(job) else {
            return;
        };
        let Some(p) = position.take() else {
            return;
        };
        if let Some(entries) = self.seqs.get_mut(seq) {
            entries.held.remove(&(p, *job));
            entries.released.insert(*job);
        }
    }

    /// Forgets `seq` (a block was written for it, or memory of it cannot be kept).
    pub fn forget(&mut self, seq: &Seq) {
        if let Some(entries) = self.seqs.remove(seq) {
            for (_, job) in entries.held {
                self.jobs.remove(&job);
                if self.kept.contains_key(&job) {
                    self.unkeep(&job);
                    self.dropped.insert(*seq);
                }
            }
            for job in entries.released {
                self.jobs.remove(&job);
            }
        }
    }

    /// Forgets everything (a write failed: memory may be ahead of the store).
    pub fn clear(&mut self) {
        self.seqs.clear();
        self.jobs.clear();
        self.dropped_all |= !self.kept.is_empty();
        self.kept.clear();
        self.kept_bytes = 0;
    }

    /// What the store's read of a known `seq`'s entries would tell (`None` when it is not
    /// known): whether it has an entry, and whether one of them is released. A known
    /// sequence has no block (a block makes it forgotten).
    pub fn presence(&self, seq: &Seq) -> Option<(bool, bool)> {
        let entries = self.seqs.get(seq)?;
        Some((!entries.is_empty(), !entries.released.is_empty()))
    }

    /// The head of a known `seq` that may go, as the store's read would tell it: `None` when
    /// `seq` is not known; `Some(None)` when no job of it may go (one is released, or none is
    /// held); else its held job of the lowest position.
    pub fn head(&self, seq: &Seq) -> Option<Option<JobId>> {
        let entries = self.seqs.get(seq)?;
        Some(match entries.released.is_empty() {
            true => entries.held.first().map(|(_, job)| *job),
            false => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: u8) -> Seq {
        [n; 16]
    }

    fn job(n: u128) -> JobId {
        JobId(Ulid(n))
    }

    #[test]
    fn a_known_sequence_tells_its_head_until_it_empties() {
        let mut known = KnownSequences::default();
        // Not known: entries are not remembered.
        known.entered(seq(1), job(1), Ulid(1), true);
        assert_eq!(known.head(&seq(1)), None);
        known.learn_empty(seq(1));
        assert_eq!(known.head(&seq(1)), Some(None));
        assert_eq!(known.presence(&seq(1)), Some((false, false)));
        known.entered(seq(1), job(30), Ulid(30), true);
        known.entered(seq(1), job(20), Ulid(20), true);
        assert_eq!(known.presence(&seq(1)), Some((true, false)));
        // A move's import keeps its old position: it goes first.
        known.entered(seq(1), job(5), Ulid(10), true);
        assert_eq!(known.head(&seq(1)), Some(Some(job(5))));
        assert_eq!(known.seq_of(&job(5)), Some(seq(1)));
        known.released(&job(5));
        assert_eq!(known.head(&seq(1)), Some(None), "one is under way");
        assert_eq!(known.presence(&seq(1)), Some((true, true)));
        // A later row of a remembered entry changes nothing.
        known.entered(seq(1), job(5), Ulid(10), true);
        assert_eq!(known.head(&seq(1)), Some(None));
        known.left(&job(5));
        assert_eq!(known.head(&seq(1)), Some(Some(job(20))));
        known.left(&job(20));
        known.left(&job(30));
        assert!(!known.knows(&seq(1)), "an emptied sequence is read again");
        assert_eq!(known.presence(&seq(1)), None);
        assert!(known.is_empty());
    }

    fn ordered_job(n: u128) -> Arc<Job> {
        let mut job = crate::job::tests::sample();
        job.id = self::job(n);
        Arc::new(job)
    }

    #[test]
    fn a_kept_job_is_a_head_that_goes_on_from_memory() {
        let mut known = KnownSequences::default();
        // Only a known sequence keeps.
        assert!(!known.keep(seq(3), &ordered_job(2), Ulid(2)));
        known.learn_empty(seq(3));
        known.entered(seq(3), job(1), Ulid(1), false);
        assert!(known.keep(seq(3), &ordered_job(2), Ulid(2)));
        assert!(known.keep(seq(3), &ordered_job(3), Ulid(3)));
        assert!(!known.keep(seq(3), &ordered_job(3), Ulid(3)), "kept once");
        assert_eq!(known.presence(&seq(3)), Some((true, true)));
        assert_eq!(known.head(&seq(3)), Some(None), "job 1 is under way");
        known.left(&job(1));
        assert_eq!(known.head(&seq(3)), Some(Some(job(2))));
        assert!(known.is_kept(&job(2)));
        let went = known.go_on(&job(2)).map(|j| j.id);
        assert_eq!(went, Some(job(2)));
        assert!(!known.is_kept(&job(2)));
        assert_eq!(known.head(&seq(3)), Some(Some(job(3))));
        // A rest puts job 3's entry in the store: still its head, no longer kept.
        known.entered(seq(3), job(3), Ulid(3), true);
        assert!(!known.is_kept(&job(3)));
        assert_eq!(known.head(&seq(3)), Some(Some(job(3))));
        assert!(!known.take_dropped_kept());
        assert_eq!(
            known.go_on(&job(3)).map(|j| j.id),
            None,
            "stored: released by SQL"
        );
        known.left(&job(3));
        assert!(!known.knows(&seq(3)), "its last entry left");
    }

    #[test]
    fn dropping_memory_of_a_kept_job_is_told_once() {
        let mut known = KnownSequences::default();
        known.learn_empty(seq(4));
        assert!(known.keep(seq(4), &ordered_job(5), Ulid(5)));
        known.forget(&seq(4));
        assert!(!known.is_kept(&job(5)));
        assert!(known.take_dropped_kept());
        assert!(!known.take_dropped_kept());
        known.learn_empty(seq(4));
        assert!(known.keep(seq(4), &ordered_job(6), Ulid(6)));
        known.clear();
        assert!(known.take_dropped_kept());
        // A clear without kept jobs drops nothing.
        known.clear();
        assert!(!known.take_dropped_kept());
        // One went on: its sequence, empty, is forgotten once its job under way leaves.
        known.learn_empty(seq(5));
        assert!(known.keep(seq(5), &ordered_job(7), Ulid(7)));
        assert!(known.go_on(&job(7)).is_some());
        assert!(known.knows(&seq(5)));
        known.forget_if_empty(&seq(5));
        assert!(!known.knows(&seq(5)));
        assert!(!known.take_dropped_kept());
    }

    #[test]
    fn ties_go_to_the_lower_job_and_forgetting_drops_every_entry() {
        let mut known = KnownSequences::default();
        known.learn_empty(seq(2));
        known.entered(seq(2), job(9), Ulid(7), true);
        known.entered(seq(2), job(8), Ulid(7), true);
        known.entered(seq(2), job(4), Ulid(3), false);
        assert_eq!(known.head(&seq(2)), Some(None));
        known.left(&job(4));
        assert_eq!(known.head(&seq(2)), Some(Some(job(8))));
        known.forget(&seq(2));
        assert_eq!(known.head(&seq(2)), None);
        // Its jobs are forgotten with it: learning it again starts empty.
        known.learn_empty(seq(2));
        known.entered(seq(2), job(9), Ulid(7), true);
        assert_eq!(known.head(&seq(2)), Some(Some(job(9))));
        // A read that finds it empty is right where memory disagrees.
        known.learn_empty(seq(2));
        assert_eq!(known.head(&seq(2)), Some(None));
        assert_eq!(known.seq_of(&job(9)), None);
        known.clear();
        assert!(known.is_empty());
    }
}
