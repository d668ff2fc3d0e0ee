//! The ordering decision of one write, as a plan: from the book and what the write carries
//! (new ordered jobs, ends, the sequencer's proposals, offers to begin), which new jobs are
//! stored fresh or with an entry, which jobs go (and how: from the book, or released by
//! SQL), which keys a failure blocks, and what the sequencer must look at. Pure: no clock but
//! the one given, no I/O; it changes the book as the write would, journaled, so the writer
//! keeps the change if the write commits and rolls it back if not ([`Book::rollback`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::book::{Book, Standing};
use crate::job::{Job, JobId, Recovered, Seq};

/// How a Director's heads may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No other JobDB can be live (a Director without a registry): every head goes in the
    /// writer's commits, and a new ordered job due now may be fresh (kept in the book, no
    /// entry).
    Alone,
    /// A cluster: a head goes in the writer's commits only when the intake cleared it against
    /// the other live JobDBs, or the sequencer proposes it after reading them; every ordered
    /// job has an entry, since their reads see entries only.
    Cluster,
}

/// An ordered job new to this JobDB in this write.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// The job (ordered: it has a place).
    pub job: Arc<Job>,
    /// Attempts it made elsewhere (an import).
    pub attempts: u16,
    /// When its next attempt is due (`None`: now).
    pub retry_at: Option<DateTime<Utc>>,
    /// A submission due now, listed by the write's log row as accepted: it may be stored fresh.
    pub fresh: bool,
}

/// A job this write ends or takes out of its sequence (`archiving`).
#[derive(Clone, Copy, Debug)]
pub struct Leaving {
    /// The job.
    pub job: JobId,
    /// Whether this end blocks a key that asked to be ([`crate::jobdb::blocks_sequence`]).
    pub ends_badly: bool,
}

/// What one write carries that ordering decides on, as the writer gathers it.
#[derive(Debug)]
pub struct Write<'a> {
    /// The write's time.
    pub now: DateTime<Utc>,
    /// The id a block this write writes is stamped with: taken for the write, so every
    /// barrier answered before it is at most this, every one after it above.
    pub at: u64,
    /// New ordered jobs, in the write's order.
    pub arrivals: &'a [Arrival],
    /// Jobs leaving their sequences (each once; unordered ones too: the book tells).
    pub leaving: &'a [Leaving],
    /// Heads the sequencer proposes after reading the other JobDBs.
    pub proposed: &'a [(Seq, JobId)],
    /// Held jobs past their expiry the sequencer found: released to be ended, never tried.
    pub expired: &'a [JobId],
    /// Keys blocked elsewhere that imports carry.
    pub carried: &'a [Seq],
    /// Sequences whose job just ended where its lane could start an attempt: a head released
    /// here may begin its attempt in this commit.
    pub begins: &'a HashSet<Seq>,
}

/// A write, with what the ordering part itself brings to its plan.
#[derive(Debug)]
pub struct Input<'a> {
    /// How heads may go.
    pub mode: Mode,
    /// The write.
    pub write: &'a Write<'a>,
    /// An operator deleted these blocks: read after every block written before `as_of`
    /// committed, these were the blocks left (`None`: nothing read).
    pub blocks_read: Option<(u64, &'a HashSet<Seq>)>,
    /// Jobs the intake cleared against the other live JobDBs (a cluster).
    pub cleared: &'a HashSet<JobId>,
    /// Sequences to look at again.
    pub touch: &'a [Seq],
}

/// What ordering decided for one write.
#[derive(Debug, Default)]
pub struct Plan {
    /// New jobs stored fresh: no entry, listed as accepted by the log row.
    pub fresh: HashSet<JobId>,
    /// New jobs whose entry goes in released (`held = 0`): they go at once.
    pub released_entries: HashSet<JobId>,
    /// Held entries whose turn came: released by SQL and read back.
    pub release: Vec<JobId>,
    /// Of those, the ones whose attempt begins in this commit, if due by then.
    pub begin: HashSet<JobId>,
    /// Jobs that go from what the writer holds (new ones, kept ones), each with whether its
    /// attempt begins in this commit.
    pub go: Vec<(Recovered, bool)>,
    /// Fresh jobs the store must see now: of sequences spilled here, or kept jobs of keys blocked
    /// here. They rest, held (`true`) or under way.
    pub rest: Vec<(JobId, bool)>,
    /// Heads proposed for spilled sequences: released if still their sequence's head in the
    /// store.
    pub release_if_head: Vec<(Seq, JobId)>,
    /// Expired held jobs to release to be ended (if still held and expired in the store).
    pub release_expired: Vec<JobId>,
    /// Leaving jobs whose end blocks their key.
    pub blockers: Vec<JobId>,
    /// Leaving jobs the book does not hold, while some sequence is spilled: the store reads
    /// their sequences (and blocks).
    pub read_left: Vec<JobId>,
    /// Sequences the sequencer must look at: heads waiting for its read of the other JobDBs,
    /// spilled ones that moved.
    pub tell: BTreeSet<Seq>,
    /// Sequences this write spilled (the book had no room for them).
    pub spilled: usize,
}

impl Plan {
    /// The jobs this plan lets go, each once.
    pub fn going(&self) -> impl Iterator<Item = JobId> + '_ {
        self.release
            .iter()
            .copied()
            .chain(self.go.iter().map(|(r, _)| r.job.id))
    }
}

/// Decides what the write carried by `input` does to ordered keys, changing `book` as the
/// write would (journaled by the caller).
pub fn plan(book: &mut Book, input: &Input<'_>) -> Plan {
    let write = input.write;
    let mut plan = Plan::default();
    let mut touched: BTreeSet<Seq> = input.touch.iter().copied().collect();
    if let Some((as_of, left)) = input.blocks_read {
        for (seq, at) in book.blocked() {
            if at < as_of && !left.contains(&seq) {
                book.unblock(&seq);
                touched.insert(seq);
            }
        }
    }
    // Expired held jobs go to be ended; their sequence waits for that end.
    for job in write.expired {
        match book.standing(job) {
            Some(Standing::Held) => {
                book.go(job);
                plan.release_expired.push(*job);
            }
            Some(_) => {}
            None => plan.release_expired.push(*job),
        }
    }
    for l in write.leaving {
        match book.seq_of(&l.job) {
            Some(seq) => {
                let blocks = l.ends_badly && book.blocks(&l.job);
                book.leave(&l.job);
                if blocks {
                    book.block(seq, write.at);
                    plan.blockers.push(l.job);
                }
                touched.insert(seq);
            }
            None if book.any_spilled() => plan.read_left.push(l.job),
            None => {}
        }
    }
    for seq in write.carried {
        book.block(*seq, write.at);
        touched.insert(*seq);
    }
    // A blocked key waits for an operator, who reads its jobs with SQL: its kept ones rest.
    for seq in &touched {
        if book.head_blocked(seq) {
            plan.rest
                .extend(book.kept_in(seq).into_iter().map(|job| (job, true)));
        }
    }
    let mut arriving: HashMap<JobId, &Arrival> = HashMap::new();
    for a in write.arrivals {
        let Some(place) = a.job.place() else {
            continue;
        };
        let (seq, id) = (place.seq, a.job.id);
        if book.is_spilled(&seq) || !book.has_room() {
            // The store alone holds the sequence: every job of it enters held, and its heads
            // go by the sequencer's reads.
            plan.spilled += usize::from(!book.is_spilled(&seq));
            for (job, waits) in book.spill(seq) {
                match plan.fresh.remove(&job) {
                    // A job of this write: its entry goes in as planned for any.
                    true => {}
                    false => plan.rest.push((job, waits)),
                }
            }
            book.count_spilled(seq, true);
            plan.tell.insert(seq);
            continue;
        }
        let bytes = crate::jobdb::job_row_bytes(&a.job);
        let kept = input.mode == Mode::Alone && a.fresh && book.kept_room(bytes);
        let blocks = a.job.ordering.as_ref().is_some_and(|o| o.blocks);
        book.wait(seq, place.position, id, blocks, kept.then(|| a.job.clone()));
        if kept {
            plan.fresh.insert(id);
        }
        arriving.insert(id, a);
        touched.insert(seq);
    }
    let mut proposed: HashMap<Seq, JobId> = HashMap::new();
    for (seq, job) in write.proposed {
        match book.is_spilled(seq) {
            true => plan.release_if_head.push((*seq, *job)),
            false => {
                proposed.insert(*seq, *job);
                touched.insert(*seq);
            }
        }
    }
    for seq in touched {
        if book.is_spilled(&seq) {
            continue;
        }
        let Some(head) = book.head(&seq) else {
            continue;
        };
        let may_go = match input.mode {
            Mode::Alone => true,
            Mode::Cluster => input.cleared.contains(&head) || proposed.get(&seq) == Some(&head),
        };
        if !may_go {
            plan.tell.insert(seq);
            continue;
        }
        let kept = book.go(&head);
        let offered = write.begins.contains(&seq);
        match (arriving.get(&head), kept) {
            (Some(a), body) => {
                // New, and first: it goes in the commit that stores it (born released).
                if body.is_none() {
                    plan.released_entries.insert(head);
                }
                let due = a.retry_at.is_none_or(|at| at <= write.now);
                let went = Recovered {
                    job: a.job.clone(),
                    attempts: a.attempts,
                    retry_at: a.retry_at,
                };
                plan.go.push((went, offered && due));
            }
            (None, Some(job)) => {
                let went = Recovered {
                    job,
                    attempts: 0,
                    retry_at: None,
                };
                plan.go.push((went, offered));
            }
            (None, None) => {
                plan.release.push(head);
                if offered {
                    plan.begin.insert(head);
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use ulid::Ulid;

    fn job(n: u128, key: &str, blocks: bool) -> Arc<Job> {
        let mut job = crate::job::tests::sample();
        job.id = JobId(Ulid(n));
        job.ordering = Some(crate::job::OrderedKey {
            key: key.into(),
            blocks,
            position: Ulid(n),
        });
        Arc::new(job)
    }

    fn new(job: &Arc<Job>) -> Arrival {
        Arrival {
            job: job.clone(),
            attempts: 0,
            retry_at: None,
            fresh: true,
        }
    }

    /// One write's input, built field by field.
    #[derive(Default)]
    struct W {
        arrivals: Vec<Arrival>,
        leaving: Vec<Leaving>,
        proposed: Vec<(Seq, JobId)>,
        expired: Vec<JobId>,
        carried: Vec<Seq>,
        blocks_read: Option<(u64, HashSet<Seq>)>,
        begins: HashSet<Seq>,
        cleared: HashSet<JobId>,
    }

    impl W {
        fn plan(&self, book: &mut Book, mode: Mode) -> Plan {
            book.begin();
            let write = Write {
                now: Utc::now(),
                at: 100,
                arrivals: &self.arrivals,
                leaving: &self.leaving,
                proposed: &self.proposed,
                expired: &self.expired,
                carried: &self.carried,
                begins: &self.begins,
            };
            let plan = plan(
                book,
                &Input {
                    mode,
                    write: &write,
                    blocks_read: self.blocks_read.as_ref().map(|(at, left)| (*at, left)),
                    cleared: &self.cleared,
                    touch: &[],
                },
            );
            book.commit();
            plan
        }
    }

    fn ids(go: &[(Recovered, bool)]) -> Vec<(JobId, bool)> {
        go.iter().map(|(r, begun)| (r.job.id, *begun)).collect()
    }

    fn ended(j: &Arc<Job>, badly: bool) -> Leaving {
        Leaving {
            job: j.id,
            ends_badly: badly,
        }
    }

    #[test]
    fn alone_a_key_goes_from_the_book_one_job_at_a_time() {
        let mut book = Book::new(100);
        let (k1, k2, k3) = (job(1, "k", false), job(2, "k", false), job(3, "k", false));
        let seq = k1.seq().unwrap();
        let w = W {
            arrivals: vec![new(&k2), new(&k1), new(&k3)],
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        // Every new one is fresh; the first by position goes at once (born released).
        assert_eq!(plan.fresh.len(), 3);
        assert_eq!(ids(&plan.go), vec![(k1.id, false)]);
        assert!(plan.release.is_empty() && plan.released_entries.is_empty());
        assert!(plan.tell.is_empty(), "alone, the sequencer is not needed");
        assert_eq!(book.standing(&k2.id), Some(Standing::Kept));
        // k1 ends where its lane could start an attempt: k2 goes on from the book, begun.
        let w = W {
            leaving: vec![ended(&k1, false)],
            begins: HashSet::from([seq]),
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        assert_eq!(ids(&plan.go), vec![(k2.id, true)]);
        assert!(plan.fresh.is_empty());
        // k2 fails for good, but it did not ask to block: k3 goes.
        let w = W {
            leaving: vec![ended(&k2, true)],
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        assert_eq!(ids(&plan.go), vec![(k3.id, false)]);
        assert!(plan.blockers.is_empty());
        let w = W {
            leaving: vec![ended(&k3, false)],
            ..W::default()
        };
        w.plan(&mut book, Mode::Alone);
        assert!(book.is_empty());
    }

    #[test]
    fn a_job_with_an_entry_goes_by_sql_and_a_scheduled_first_job_goes_at_once() {
        let mut book = Book::new(100);
        let (s1, s2) = (job(1, "s", false), job(2, "s", false));
        let later = Utc::now() + chrono::Duration::hours(1);
        // Scheduled: not fresh (its row gives it an entry). The first goes at once, its entry
        // released, and waits for its time in the scheduler; the second waits, held.
        let scheduled = |j: &Arc<Job>| Arrival {
            retry_at: Some(later),
            fresh: false,
            ..new(j)
        };
        let w = W {
            arrivals: vec![scheduled(&s1), scheduled(&s2)],
            begins: HashSet::from([s1.seq().unwrap()]),
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        assert_eq!(ids(&plan.go), vec![(s1.id, false)], "not due: not begun");
        assert_eq!(plan.released_entries, HashSet::from([s1.id]));
        assert!(plan.fresh.is_empty());
        assert_eq!(book.standing(&s2.id), Some(Standing::Held));
        let w = W {
            leaving: vec![ended(&s1, false)],
            begins: HashSet::from([s1.seq().unwrap()]),
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        assert!(plan.go.is_empty());
        assert_eq!(plan.release, vec![s2.id], "released by SQL");
        assert_eq!(plan.begin, HashSet::from([s2.id]));
    }

    #[test]
    fn in_a_cluster_only_cleared_or_proposed_heads_go_and_every_job_has_its_entry() {
        let mut book = Book::new(100);
        let (a1, a2, b1) = (job(1, "a", false), job(2, "a", false), job(3, "b", false));
        let w = W {
            arrivals: vec![new(&a1), new(&a2), new(&b1)],
            cleared: HashSet::from([b1.id]),
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Cluster);
        assert!(plan.fresh.is_empty(), "the other JobDBs read entries only");
        assert_eq!(ids(&plan.go), vec![(b1.id, false)]);
        assert_eq!(plan.released_entries, HashSet::from([b1.id]));
        assert_eq!(plan.tell, BTreeSet::from([a1.seq().unwrap()]));
        // The sequencer read the other JobDBs and proposes a1; a stale proposal (a2) is not
        // its head.
        let seq = a1.seq().unwrap();
        let w = W {
            proposed: vec![(seq, a2.id)],
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Cluster);
        assert!(plan.release.is_empty());
        assert_eq!(plan.tell, BTreeSet::from([seq]), "looked at again");
        let w = W {
            proposed: vec![(seq, a1.id)],
            ..W::default()
        };
        assert_eq!(w.plan(&mut book, Mode::Cluster).release, vec![a1.id]);
        // a1 ends: a2 was not cleared, so it waits for the sequencer again.
        let w = W {
            leaving: vec![ended(&a1, false)],
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Cluster);
        assert!(plan.release.is_empty());
        assert_eq!(plan.tell, BTreeSet::from([seq]));
    }

    #[test]
    fn a_blocking_failure_stops_its_key_until_its_block_is_read_gone() {
        let mut book = Book::new(100);
        let (b1, b2) = (job(1, "b", true), job(2, "b", false));
        let seq = b1.seq().unwrap();
        let w = W {
            arrivals: vec![new(&b1), new(&b2)],
            ..W::default()
        };
        w.plan(&mut book, Mode::Alone);
        let w = W {
            leaving: vec![ended(&b1, true)],
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        assert_eq!(plan.blockers, vec![b1.id]);
        assert!(plan.go.is_empty(), "blocked");
        // A read of the blocks begun before the block was written says nothing of it.
        let w = W {
            blocks_read: Some((100, HashSet::new())),
            ..W::default()
        };
        assert!(w.plan(&mut book, Mode::Alone).go.is_empty());
        // One begun after it that finds it still there, neither.
        let w = W {
            blocks_read: Some((101, HashSet::from([seq]))),
            ..W::default()
        };
        assert!(w.plan(&mut book, Mode::Alone).go.is_empty());
        // One begun after it that finds it gone: an operator deleted it, the key goes on.
        let w = W {
            blocks_read: Some((101, HashSet::new())),
            ..W::default()
        };
        assert_eq!(
            ids(&w.plan(&mut book, Mode::Alone).go),
            vec![(b2.id, false)]
        );
        // An operator's flush of a blocking job does not block.
        let (c1, c2) = (job(3, "c", true), job(4, "c", false));
        let w = W {
            arrivals: vec![new(&c1), new(&c2)],
            ..W::default()
        };
        w.plan(&mut book, Mode::Alone);
        let w = W {
            leaving: vec![ended(&c1, false)],
            ..W::default()
        };
        assert_eq!(
            ids(&w.plan(&mut book, Mode::Alone).go),
            vec![(c2.id, false)]
        );
    }

    #[test]
    fn an_expired_held_job_goes_to_be_ended_and_its_key_waits_for_that_end() {
        let mut book = Book::new(100);
        let (e1, e2, e3) = (job(1, "e", false), job(2, "e", false), job(3, "e", false));
        let entry = |j: &Arc<Job>| Arrival {
            fresh: false,
            ..new(j)
        };
        let w = W {
            arrivals: vec![entry(&e1), entry(&e2), entry(&e3)],
            ..W::default()
        };
        w.plan(&mut book, Mode::Alone);
        let w = W {
            expired: vec![e2.id, e1.id],
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        assert_eq!(plan.release_expired, vec![e2.id]);
        assert!(plan.release.is_empty(), "e1 is under way");
        let w = W {
            leaving: vec![ended(&e1, false)],
            ..W::default()
        };
        assert!(
            w.plan(&mut book, Mode::Alone).release.is_empty(),
            "e2 ends first"
        );
        let w = W {
            leaving: vec![ended(&e2, true)],
            ..W::default()
        };
        assert_eq!(w.plan(&mut book, Mode::Alone).release, vec![e3.id]);
    }

    #[test]
    fn a_full_book_spills_a_sequence_to_the_store() {
        let mut book = Book::new(2);
        let (a1, a2, a3) = (job(1, "a", false), job(2, "a", false), job(3, "a", false));
        let seq = a1.seq().unwrap();
        let w = W {
            arrivals: vec![new(&a1), new(&a2)],
            ..W::default()
        };
        w.plan(&mut book, Mode::Alone);
        // The third does not fit: the sequence spills, its fresh jobs rest so the store sees
        // them (a1 under way, a2 waiting).
        let w = W {
            arrivals: vec![new(&a3)],
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        let mut rest = plan.rest.clone();
        rest.sort();
        assert_eq!(rest, vec![(a1.id, false), (a2.id, true)]);
        assert!(plan.fresh.is_empty() && plan.go.is_empty());
        assert_eq!(plan.tell, BTreeSet::from([seq]));
        assert!(book.is_spilled(&seq) && book.is_empty());
        // Its heads go by the store's reads; its jobs' ends are read there.
        let w = W {
            proposed: vec![(seq, a2.id)],
            leaving: vec![ended(&a1, false)],
            ..W::default()
        };
        let plan = w.plan(&mut book, Mode::Alone);
        assert_eq!(plan.release_if_head, vec![(seq, a2.id)]);
        assert_eq!(plan.read_left, vec![a1.id]);
    }

    #[test]
    fn a_plan_rolled_back_leaves_the_book_as_it_was() {
        let mut book = Book::new(100);
        let (k1, k2) = (job(1, "k", false), job(2, "k", false));
        book.begin();
        let arrivals = [new(&k1), new(&k2)];
        let write = Write {
            now: Utc::now(),
            at: 1,
            arrivals: &arrivals,
            leaving: &[],
            proposed: &[],
            expired: &[],
            carried: &[],
            begins: &HashSet::new(),
        };
        plan(
            &mut book,
            &Input {
                mode: Mode::Alone,
                write: &write,
                blocks_read: None,
                cleared: &HashSet::new(),
                touch: &[],
            },
        );
        book.rollback();
        assert!(book.is_empty() && book.kept().is_empty());
        // The same write tried again plans the same.
        let w = W {
            arrivals: vec![new(&k1), new(&k2)],
            ..W::default()
        };
        assert_eq!(
            ids(&w.plan(&mut book, Mode::Alone).go),
            vec![(k1.id, false)]
        );
    }
}
