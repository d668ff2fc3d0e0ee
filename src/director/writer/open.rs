//! What the writer's commits left open: jobs accepted that have no row of their own and no
//! `open_jobs` entry yet (*fresh*), and attempts begun that have not ended. The writer is the
//! only one who sees every commit, so it keeps this account and writes what follows from it:
//! - a job fresh for longer than `rest_after` *rests*: it gets its `open_jobs` entry, so a new
//!   owner finds it there and the checkpoint can move past the commit that accepted it;
//! - a terminal row of a fresh job deletes nothing (it never had an entry);
//! - `jobdb_checkpoint.open_from`: the oldest commit that still holds something open, which
//!   bounds what a new owner or a drainer reads of `commit_log`.
//!
//! Which fresh ordered jobs wait and which are under way is the ordering part's book's to know.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::job::{JobId, State, Transition};
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

    /// Whether `id` is fresh.
    pub(super) fn is_fresh(&self, id: &JobId) -> bool {
        self.fresh.contains_key(id)
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

    /// The oldest commit that holds something open, or `next_id` when none does: every
    /// `commit_log` row below it holds nothing open.
    pub(super) fn open_from(&self, next_id: u64) -> u64 {
        self.commits.keys().next().copied().unwrap_or(next_id)
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
        if let Some((c, _)) = self.fresh.remove(id) {
            self.close(c);
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
}
