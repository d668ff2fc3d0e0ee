//! What the writer's commits left open: jobs accepted that have no row of their own and no
//! `open_jobs` entry yet (*fresh*), and attempts begun that have not ended. The writer is the
//! only one who sees every commit, so it keeps this account and writes what follows from it:
//! - a job fresh for longer than `rest_after` *rests*: it gets its `open_jobs` entry, so a new
//!   owner finds it there and the checkpoint can move past the commit that accepted it;
//! - a terminal row of a fresh job deletes nothing (it never had an entry);
//! - `jobdb_checkpoint.open_from`: the oldest commit that still holds something open, which
//!   bounds what a new owner or a drainer reads of `commit_log`;
//! - a *kept* job (an ordered job held in memory only, see [`crate::jobdb::KnownSequences`])
//!   rests held at its expiry too, so the sequencer's expiry pass ends it on time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::job::{JobId, Seq, State, Transition};
use crate::jobdb::{Fresh, OpenRow};

/// One commit that still holds something open.
struct OpenCommit {
    /// When it committed.
    at: Instant,
    /// Fresh jobs it accepted and attempts it began, not yet rested or ended.
    open: usize,
    /// The jobs it accepted (some may have rested or ended since).
    accepted: Vec<JobId>,
}

/// The account of open work, by commit.
#[derive(Default)]
pub(super) struct OpenWork {
    /// Fresh jobs: the commit that accepted each, and what its first entry takes from it.
    fresh: HashMap<JobId, (u64, Fresh)>,
    /// The sequences of fresh ordered jobs under way (born released, or kept and gone on),
    /// with how many each has.
    sequences: HashMap<Seq, u32>,
    /// The sequences of kept jobs, with how many each has.
    kept: HashMap<Seq, u32>,
    /// Kept jobs by expiry.
    kept_expiry: BTreeSet<(DateTime<Utc>, JobId)>,
    /// Attempts under way: the commit that began each.
    attempts: HashMap<JobId, u64>,
    /// Commits that hold something open, oldest first.
    commits: BTreeMap<u64, OpenCommit>,
}

impl OpenWork {
    /// Each of these jobs that is fresh (the others have an entry or ended).
    pub(super) fn fresh_among<'a>(
        &self,
        ids: impl Iterator<Item = &'a JobId>,
    ) -> HashMap<JobId, Fresh> {
        ids.filter_map(|id| self.fresh(id).map(|f| (*id, f)))
            .collect()
    }

    /// Whether `id` is fresh, with what its first entry takes from it.
    pub(super) fn fresh(&self, id: &JobId) -> Option<Fresh> {
        self.fresh.get(id).map(|(_, fresh)| fresh.clone())
    }

    /// Fresh jobs accepted at least `rest_after` before `now`: they rest now.
    pub(super) fn due_rests(&self, now: Instant, rest_after: Duration) -> Vec<(JobId, Fresh)> {
        let mut due = Vec::new();
        for commit in self.commits.values() {
            if commit.at + rest_after > now {
                break;
            }
            due.extend(
                commit
                    .accepted
                    .iter()
                    .filter_map(|id| Some((*id, self.fresh(id)?))),
            );
        }
        due
    }

    /// Kept jobs expired by `now`: they rest (held) for the sequencer's expiry pass.
    pub(super) fn kept_expired(&self, now: DateTime<Utc>) -> Vec<(JobId, Fresh)> {
        self.kept_expiry
            .iter()
            .take_while(|(at, _)| *at <= now)
            .filter_map(|(_, id)| Some((*id, self.fresh(id)?)))
            .collect()
    }

    /// When the first kept job expires.
    pub(super) fn next_kept_expiry(&self) -> Option<DateTime<Utc>> {
        self.kept_expiry.first().map(|(at, _)| *at)
    }

    /// Every kept job.
    pub(super) fn kept_jobs(&self) -> Vec<(JobId, Fresh)> {
        self.kept_expiry
            .iter()
            .filter_map(|(_, id)| Some((*id, self.fresh(id)?)))
            .collect()
    }

    /// The sequences of kept jobs, with how many each has.
    pub(super) fn kept_sequences(&self) -> &HashMap<Seq, u32> {
        &self.kept
    }

    /// Kept jobs whose turn came went on from memory: under way now, still fresh.
    pub(super) fn gone_on(&mut self, ids: &[JobId]) {
        for id in ids {
            let Some((_, fresh)) = self.fresh.get_mut(id) else {
                continue;
            };
            if !std::mem::take(&mut fresh.kept) {
                continue;
            }
            let (expire_at, place) = (fresh.expire_at, fresh.place);
            self.kept_expiry.remove(&(expire_at, *id));
            if let Some(place) = place {
                decrement(&mut self.kept, place.seq);
                *self.sequences.entry(place.seq).or_default() += 1;
            }
        }
    }

    /// Fresh ordered jobs (under way or kept, without an entry): in a cluster they rest as
    /// soon as its commits stop bearing fresh (another JobDB turned live).
    pub(super) fn ordered_fresh(&self) -> Vec<(JobId, Fresh)> {
        if self.sequences.is_empty() && self.kept.is_empty() {
            return Vec::new();
        }
        self.fresh
            .iter()
            .filter(|(_, (_, fresh))| fresh.place.is_some())
            .map(|(id, (_, fresh))| (*id, fresh.clone()))
            .collect()
    }

    /// The oldest commit that holds something open, or `next_id` when none does: every
    /// `commit_log` row below it holds nothing open.
    pub(super) fn open_from(&self, next_id: u64) -> u64 {
        self.commits.keys().next().copied().unwrap_or(next_id)
    }

    /// The sequences of fresh ordered jobs, under way without an entry (see
    /// [`crate::jobdb::Append::fresh_sequences`]).
    pub(super) fn sequences(&self) -> &HashMap<Seq, u32> {
        &self.sequences
    }

    /// Fresh jobs and attempts under way.
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.fresh.len(), self.attempts.len())
    }

    /// Takes in a committed transaction: `commit`, its log row's id (if it wrote one), which
    /// accepted `accepted` and began `started`; its rows `rows` and rests `rests`.
    pub(super) fn committed(
        &mut self,
        commit: Option<u64>,
        at: Instant,
        accepted: &[(JobId, Fresh)],
        started: &[(JobId, u16)],
        rows: &[(u64, Transition)],
        rests: &[OpenRow],
    ) {
        // A row or a rest closes what was open for its job; a row ends an attempt (the start
        // rows of JobDBs before schema 5 are never written now).
        for (_, t) in rows {
            if t.state == State::Executing {
                continue;
            }
            if let Some(c) = self.attempts.remove(&t.job_id) {
                self.close(c);
            }
            self.unfresh(&t.job_id);
        }
        for r in rests {
            self.unfresh(&r.job_id);
        }
        let Some(commit) = commit else {
            return;
        };
        let mut open = 0;
        for (id, fresh) in accepted {
            if self.fresh.insert(*id, (commit, fresh.clone())).is_none() {
                open += 1;
                if let Some(place) = fresh.place {
                    let counts = match fresh.kept {
                        true => {
                            self.kept_expiry.insert((fresh.expire_at, *id));
                            &mut self.kept
                        }
                        false => &mut self.sequences,
                    };
                    *counts.entry(place.seq).or_default() += 1;
                }
            }
        }
        for (id, _) in started {
            if let Some(earlier) = self.attempts.insert(*id, commit) {
                self.close(earlier);
            }
            open += 1;
        }
        if open > 0 {
            self.commits.insert(
                commit,
                OpenCommit {
                    at,
                    open,
                    accepted: accepted.iter().map(|(id, _)| *id).collect(),
                },
            );
        }
    }

    /// `id` is no longer fresh (it rested or has a row).
    fn unfresh(&mut self, id: &JobId) {
        let Some((c, fresh)) = self.fresh.remove(id) else {
            return;
        };
        self.close(c);
        if let Some(place) = fresh.place {
            match fresh.kept {
                true => {
                    self.kept_expiry.remove(&(fresh.expire_at, *id));
                    decrement(&mut self.kept, place.seq);
                }
                false => decrement(&mut self.sequences, place.seq),
            }
        }
    }

    fn close(&mut self, commit: u64) {
        if let Some(c) = self.commits.get_mut(&commit) {
            c.open = c.open.saturating_sub(1);
            if c.open == 0 {
                self.commits.remove(&commit);
            }
        }
    }
}

/// One job fewer of `seq` in `counts`.
fn decrement(counts: &mut HashMap<Seq, u32>, seq: Seq) {
    if let std::collections::hash_map::Entry::Occupied(mut n) = counts.entry(seq) {
        *n.get_mut() -= 1;
        if *n.get() == 0 {
            n.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::AttemptRecord;
    use chrono::Utc;

    fn id(n: u128) -> JobId {
        JobId(ulid::Ulid::from(n))
    }

    fn fresh(expire_at: chrono::DateTime<Utc>) -> Fresh {
        Fresh {
            expire_at,
            endpoint: "http://a/".into(),
            place: None,
            kept: false,
            blocking: None,
        }
    }

    #[test]
    fn commits_stay_open_until_their_jobs_rest_or_end_and_their_attempts_end() {
        let (now, expiry) = (Instant::now(), Utc::now());
        let mut w = OpenWork::default();
        w.committed(
            Some(10),
            now,
            &[(id(1), fresh(expiry)), (id(2), fresh(expiry))],
            &[],
            &[],
            &[],
        );
        assert_eq!(w.open_from(99), 10);
        // Attempt of job 1 begins in commit 11.
        w.committed(Some(11), now, &[], &[(id(1), 1)], &[], &[]);
        // Its outcome closes both the attempt (11) and job 1's freshness (10).
        let done = Transition::succeeded(id(1), 1, expiry, AttemptRecord::default());
        w.committed(None, now, &[], &[], &[(12, done)], &[]);
        assert_eq!(w.open_from(99), 10, "job 2 is still fresh");
        assert!(w.fresh(&id(2)).is_some());
        // Job 2 rests: nothing is open any more.
        w.committed(
            None,
            now,
            &[],
            &[],
            &[],
            &[OpenRow::resting(id(2), 13, Some(fresh(expiry)))],
        );
        assert_eq!(w.open_from(99), 99);
        assert_eq!(w.counts(), (0, 0));
    }

    #[test]
    fn jobs_fresh_for_long_are_due_to_rest_oldest_commits_first() {
        let (start, expiry) = (Instant::now(), Utc::now());
        let mut w = OpenWork::default();
        w.committed(Some(1), start, &[(id(1), fresh(expiry))], &[], &[], &[]);
        w.committed(
            Some(2),
            start + Duration::from_secs(5),
            &[(id(2), fresh(expiry))],
            &[],
            &[],
            &[],
        );
        let later = start + Duration::from_secs(12);
        let due: Vec<JobId> = w
            .due_rests(later, Duration::from_secs(10))
            .into_iter()
            .map(|(j, _)| j)
            .collect();
        assert_eq!(due, vec![id(1)]);
        // A job that ended is not rested.
        let done = Transition::succeeded(id(1), 1, expiry, AttemptRecord::default());
        w.committed(None, later, &[], &[], &[(3, done)], &[]);
        assert!(w.due_rests(later, Duration::from_secs(10)).is_empty());
        assert_eq!(w.open_from(9), 2);
    }

    #[test]
    fn a_job_of_the_batch_is_fresh_only_while_it_has_no_row() {
        let (now, expiry) = (Instant::now(), Utc::now());
        let mut w = OpenWork::default();
        w.committed(
            Some(1),
            now,
            &[(id(1), fresh(expiry)), (id(2), fresh(expiry))],
            &[],
            &[],
            &[],
        );
        let retry = Transition::awaiting_retry(id(2), 1, expiry, expiry, AttemptRecord::default());
        w.committed(None, now, &[], &[], &[(2, retry)], &[]);
        let fresh = w.fresh_among([id(1), id(2), id(3)].iter());
        assert_eq!(fresh.len(), 1);
        assert!(fresh.contains_key(&id(1)));
    }

    #[test]
    fn sequences_of_fresh_ordered_jobs_are_counted_until_each_rests_or_ends() {
        let (now, expiry) = (Instant::now(), Utc::now());
        let place = |n: u8| crate::job::Place {
            seq: [n; 16],
            position: ulid::Ulid::from(u128::from(n)),
        };
        let born = |n: u8| Fresh {
            place: Some(place(n)),
            ..fresh(expiry)
        };
        let mut w = OpenWork::default();
        let accepted = [(id(1), born(7)), (id(2), born(7)), (id(3), born(8))];
        w.committed(Some(10), now, &accepted, &[], &[], &[]);
        assert_eq!(w.sequences(), &HashMap::from([([7; 16], 2), ([8; 16], 1)]));
        // One ends, one rests (its entry now says it is under way): their counts go.
        let end = Transition::discarded(id(1), 1, expiry, AttemptRecord::default());
        let rest = OpenRow::resting(id(3), 12, Some(born(8))).under_way();
        assert!(rest.released);
        w.committed(None, now, &[], &[], &[(11, end)], &[rest]);
        assert_eq!(w.sequences(), &HashMap::from([([7; 16], 1)]));
        // A job the writer never knew as fresh changes nothing.
        let other = Transition::discarded(id(9), 1, expiry, AttemptRecord::default());
        w.committed(None, now, &[], &[], &[(13, other)], &[]);
        assert_eq!(w.sequences().len(), 1);
    }

    #[test]
    fn kept_jobs_are_counted_apart_until_they_go_on_rest_or_expire() {
        let now = Instant::now();
        let soon = Utc::now() + chrono::Duration::seconds(10);
        let kept = |n: u8, expire_at| Fresh {
            place: Some(crate::job::Place {
                seq: [7; 16],
                position: ulid::Ulid::from(u128::from(n)),
            }),
            kept: true,
            ..fresh(expire_at)
        };
        let mut w = OpenWork::default();
        let later = soon + chrono::Duration::seconds(50);
        w.committed(
            Some(1),
            now,
            &[(id(1), kept(1, later)), (id(2), kept(2, soon))],
            &[],
            &[],
            &[],
        );
        assert!(w.sequences().is_empty(), "nothing of it is under way");
        assert_eq!(w.kept_sequences(), &HashMap::from([([7; 16], 2)]));
        assert_eq!(w.next_kept_expiry(), Some(soon));
        assert_eq!(w.ordered_fresh().len(), 2);
        assert!(w
            .kept_expired(soon - chrono::Duration::seconds(1))
            .is_empty());
        let expired = w.kept_expired(soon);
        assert_eq!(expired.len(), 1);
        assert!(expired[0].1.kept);
        // Job 1 goes on from memory: under way, fresh, no longer kept.
        w.gone_on(&[id(1)]);
        assert_eq!(w.sequences(), &HashMap::from([([7; 16], 1)]));
        assert_eq!(w.kept_sequences(), &HashMap::from([([7; 16], 1)]));
        assert!(!w.fresh(&id(1)).is_some_and(|f| f.kept));
        // Job 2 rests (held): nothing is kept any more.
        let rest = OpenRow::rest_of_fresh(id(2), 3, w.fresh(&id(2)).expect("fresh"));
        assert!(!rest.released, "a kept job's entry goes in held");
        w.committed(None, now, &[], &[], &[], &[rest]);
        assert!(w.kept_sequences().is_empty());
        assert_eq!(w.next_kept_expiry(), None);
        assert_eq!(w.kept_jobs().len(), 0);
        let under_way = OpenRow::rest_of_fresh(id(1), 4, w.fresh(&id(1)).expect("fresh"));
        assert!(under_way.released, "a job gone on rests under way");
    }
}
