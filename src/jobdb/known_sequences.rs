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

use std::collections::{BTreeSet, HashMap, HashSet};

use ulid::Ulid;

use crate::job::{JobId, Seq};

/// Most entries remembered across all known sequences (about 100 bytes each): beyond it a
/// sequence is not learnt, and one that would grow past it is forgotten. Forgetting costs a
/// read of the store, never a wrong release.
pub const MAX_KNOWN_ENTRIES: usize = 1_000_000;

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
