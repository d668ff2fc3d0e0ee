//! The backlog: unfinished jobs that are in the JobDB but maybe not in the cache, and the pass
//! that reads them in.
//!
//! A pass reads pages in id order. With room in the cache (less than half full) it reads every
//! waiting job, whenever due; otherwise only those due within the horizon (`spill_after`), and
//! when it reaches the end it asks the JobDB when the first job beyond the horizon comes due
//! and looks again shortly before then. So a job waiting in the JobDB only (after a restart, a
//! takeover, an eviction, an import into a full cache) is read in before it is due or expires,
//! however far ahead that is.
//!
//! Each page's read starts after a writer barrier and skips jobs that left the cache since
//! (`left`), so a job that finished never comes back. Operator commands read the jobs they name
//! the same way, never at the same time as a page.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::job::JobId;
use crate::jobdb::commands::Command;
use crate::jobdb::JobDb;

use super::{wait_until, Event};

/// The pass state machine.
#[derive(Default)]
pub(super) struct Backlog {
    /// Some unfinished jobs may be in the JobDB only.
    pub(super) pending: bool,
    /// The last job id the current pass has read; `None` before its first page.
    pub(super) cursor: Option<JobId>,
    /// The current pass reads every waiting job, not only those due within the horizon.
    pub(super) whole: bool,
    /// A job was left out of the cache since the pass began: go round again.
    again: bool,
    /// A page of the current pass left a lane's jobs out: reaching the end does not mean
    /// every waiting job was read.
    left_out: bool,
    /// Jobs the current pass brought into the cache.
    pass_loaded: usize,
    /// A page (or a command's jobs) is being read.
    loading: bool,
    /// Jobs that left the cache since the read's barrier was sent: the read may predate it.
    left: HashSet<JobId>,
    /// No pass before this instant (the next one is planned for then).
    wake: Option<Instant>,
    /// No read of the JobDB before this instant (the last one failed).
    pause: Option<Instant>,
    /// Look at a full cache again at this instant (eviction is due again).
    recheck: Option<Instant>,
    /// When waiting entries were last looked over for eviction.
    evicted_at: Option<Instant>,
    /// A pass is due then: jobs accepted to wait beyond the horizon (scheduled) come due
    /// within it from that instant.
    reminder: Option<Instant>,
    /// Where the next read of other lanes' jobs (for a full cache that one lane holds)
    /// continues; `None`: from the start.
    pub(super) others_cursor: Option<JobId>,
    /// No read of other lanes' jobs before this instant.
    pub(super) others_at: Option<Instant>,
    /// Reads that left a lane out (passes, and reads of other lanes' jobs) and found nothing,
    /// in a row: each waits twice as long as the last (up to half a minute), since each reads
    /// every other lane's resting entries (by the lane index) to sort them.
    others_idle: u32,
    /// The lane the last page left out, and its ready jobs then: when it holds few again, a
    /// pass reads it at once (see [`Backlog::hog_drained`]), not when the wait after that
    /// page ends.
    pub(super) hog: Option<(Arc<str>, usize)>,
}

impl Backlog {
    /// A backlog that may hold jobs (a Director's JobDB may, when it starts).
    pub(super) fn pending() -> Self {
        Backlog {
            pending: true,
            ..Backlog::default()
        }
    }

    /// Jobs due now wait in the JobDB only: a pass must find them soon, whatever was planned.
    pub(super) fn due_now(&mut self) {
        self.pending = true;
        self.again = true;
        self.wake = None;
    }

    /// A job of the hog stays in the backlog instead of coming in: the backlog is not done,
    /// and a pass under way (which may have read past it) goes round again, but none need
    /// start for it now (it would leave that lane out).
    pub(super) fn hog_stays_in_backlog(&mut self) {
        self.pending = true;
        self.again = true;
    }

    /// No read may start now: one is under way, or the last failed a moment ago.
    pub(super) fn busy(&self, now: Instant) -> bool {
        self.loading || self.pause.is_some_and(|at| at > now)
    }

    /// A pass is wanted now.
    pub(super) fn wanted(&self, now: Instant) -> bool {
        self.pending && self.wake.is_none_or(|at| at <= now)
    }

    /// A job left in the JobDB to wait comes within the horizon at `at`: a pass must run by
    /// then, whatever was planned.
    pub(super) fn remind(&mut self, at: Instant) {
        self.reminder = Some(self.reminder.map_or(at, |r| r.min(at)));
    }

    /// Whether a full cache may be looked over for eviction now (at most once a second; if
    /// not, a look is planned for when it may).
    pub(super) fn may_evict(&mut self, now: Instant) -> bool {
        let next = self.evicted_at.map(|at| at + Duration::from_secs(1));
        if next.is_some_and(|next| now < next) {
            self.recheck = next;
            return false;
        }
        self.evicted_at = Some(now);
        true
    }

    /// Jobs were evicted: a later pass finds them by their due time; the current one can no
    /// longer be a whole one, which would end believing every waiting job is cached.
    pub(super) fn evicted(&mut self) {
        self.pending = true;
        self.whole = false;
    }

    /// A read begins: a new pass reads everything if the cache is `roomy`, else what is due
    /// soon. Returns where the page starts and whether it reads only up to the horizon.
    pub(super) fn begin_page(&mut self, roomy: bool) -> (Option<JobId>, bool) {
        if self.cursor.is_none() {
            self.again = false;
            self.left_out = false;
            self.pass_loaded = 0;
            self.whole = roomy;
        }
        self.begin_read();
        (self.cursor, !self.whole)
    }

    /// The page being read leaves a lane's jobs out (that lane holds most of the cache).
    /// `ready`: how many of its jobs were ready then.
    pub(super) fn leaving_out(&mut self, lane: Arc<str>, ready: usize) {
        self.left_out = true;
        self.hog = Some((lane, ready));
    }

    /// The lane pages left out holds `ready` jobs now: at less than half of what it held
    /// then, a pass is due now, so its resting jobs come in before it runs dry (a lane left
    /// out for retries waiting, not ready jobs, never asks).
    pub(super) fn hog_drained(&mut self, ready: usize) {
        if self.hog.as_ref().is_some_and(|(_, then)| ready < then / 2) {
            self.hog = None;
            self.due_now();
        }
    }

    /// The page read brought `n` jobs into the cache.
    pub(super) fn loaded(&mut self, n: usize) {
        self.pass_loaded += n;
    }

    /// How long to wait before the next read that leaves a lane out, which reads past all of
    /// that lane's resting jobs: a second, doubled after each such read that found nothing
    /// (up to 30 s, and within half the `horizon`, so a pass still reads every job before it
    /// is due).
    pub(super) fn leaving_out_wait(&self, horizon: Duration) -> Duration {
        Duration::from_secs(1 << self.others_idle.min(5))
            .min(Duration::from_secs(30))
            .min(horizon / 2)
            .max(Duration::from_millis(100))
    }

    /// A read leaving a lane out found `found` jobs: the next waits according to whether
    /// reads like it find anything ([`Backlog::leaving_out_wait`]).
    pub(super) fn left_out_found(&mut self, found: usize) {
        self.others_idle = if found == 0 {
            self.others_idle.saturating_add(1)
        } else {
            0
        };
    }

    /// A read (page or command targets) begins: from now on, jobs leaving the cache are noted.
    pub(super) fn begin_read(&mut self) {
        self.loading = true;
        self.left.clear();
    }

    /// A job left the cache: a read under way must not bring it back.
    pub(super) fn left_cache(&mut self, id: JobId) {
        if self.loading {
            self.left.insert(id);
        }
    }

    /// The read ended (`ok`: it succeeded; else the next waits a second). Returns the jobs
    /// that left the cache while it ran.
    pub(super) fn end_read(&mut self, ok: bool, now: Instant) -> HashSet<JobId> {
        self.loading = false;
        if !ok {
            self.pause = Some(now + Duration::from_secs(1));
        }
        std::mem::take(&mut self.left)
    }

    /// A page was taken in: `read` jobs of at most `limit`, the last with id `last`. Fewer
    /// than `limit` means the pass reached the end of the JobDB; what comes next depends on
    /// the cache (`roomy`) and, for a pass up to the horizon, on when the first job beyond it
    /// is due (`next_due`).
    pub(super) fn page_taken(
        &mut self,
        read: usize,
        limit: usize,
        last: Option<JobId>,
        roomy: bool,
        next_due: Option<DateTime<Utc>>,
        horizon: Duration,
    ) {
        if last.is_some() {
            self.cursor = last;
        }
        if read >= limit {
            return;
        }
        let now = Instant::now();
        let every = (horizon / 4).clamp(Duration::from_millis(100), Duration::from_secs(15));
        self.cursor = None;
        if self.left_out {
            // The lane left out still has jobs in the JobDB: look again in a moment (it may
            // hold less of the cache by then, or other lanes' jobs may rest).
            self.left_out_found(self.pass_loaded);
            self.wake = Some(now + self.leaving_out_wait(horizon));
        } else if self.again {
            self.wake = None;
        } else if self.whole && next_due.is_none() {
            // Every waiting job of the JobDB is cached now.
            self.pending = false;
        } else if roomy && !self.whole {
            // A pass of the due jobs ended with room to spare: the next reads the rest,
            // whenever due.
            self.wake = None;
        } else if let Some(due) = next_due {
            // Jobs wait in the JobDB beyond the horizon (after a whole pass: jobs scheduled
            // for later): look again shortly before the first comes due (no sooner than
            // `every`, the cache may hold it already).
            let wall = Utc::now();
            let horizon = chrono::Duration::from_std(horizon).unwrap_or(chrono::Duration::MAX);
            let read_at = due.checked_sub_signed(horizon).unwrap_or(wall);
            self.wake = Some((now + wait_until(wall, read_at)).max(now + every));
        } else {
            self.pending = false;
        }
    }

    /// The earliest instant the pass waits for (a planned pass, a recheck, a pause).
    pub(super) fn next_wake(&self) -> Option<Instant> {
        [
            self.wake,
            self.recheck,
            self.pause,
            self.reminder,
            self.others_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Forgets the waits that have passed.
    pub(super) fn woke(&mut self, now: Instant) {
        self.wake = self.wake.filter(|at| *at > now);
        self.recheck = self.recheck.filter(|at| *at > now);
        self.pause = self.pause.filter(|at| *at > now);
        self.others_at = self.others_at.filter(|at| *at > now);
        if self.reminder.is_some_and(|at| at <= now) {
            self.reminder = None;
            self.due_now();
        }
    }
}

/// What a page of the backlog reads: up to `limit` waiting jobs after `after`, due by
/// `horizon` from now (a `whole` pass: every retry whenever due, and jobs never tried by the
/// horizon), leaving out the jobs of `except_lane`.
pub(super) struct PageRead {
    pub(super) after: Option<JobId>,
    pub(super) horizon: chrono::Duration,
    pub(super) whole: bool,
    pub(super) limit: usize,
    pub(super) except_lane: Option<Arc<str>>,
}

/// Reads a page of the backlog off the scheduler task, once the writer has passed `barrier`,
/// and sends it as [`Event::BacklogPage`] with, for the pass's last page, when the first job
/// beyond the horizon comes due (for a whole pass, the first never tried: every retry is in
/// the cache by then). With `for_others`, it is a read of the other lanes' jobs for a full
/// cache that `except_lane` holds, sent as [`Event::OtherLanesPage`].
pub(super) fn read_page(
    db: JobDb,
    events: mpsc::UnboundedSender<Event>,
    barrier: oneshot::Receiver<u64>,
    read: PageRead,
    for_others: bool,
) {
    tokio::spawn(async move {
        let (mut jobs, mut next_due) = (None, None);
        let limit = read.limit;
        if let Ok(before_row) = barrier.await {
            let now = Utc::now();
            let soon = now.checked_add_signed(read.horizon).unwrap_or(now);
            let due_by = if read.whole {
                crate::jobdb::latest_time()
            } else {
                soon
            };
            let lane = read.except_lane.as_deref();
            let page = db
                .backlog_page(read.after, due_by, soon, before_row, limit, lane)
                .await;
            let last = page.as_ref().is_ok_and(|jobs| jobs.len() < limit);
            let beyond = match last && !for_others {
                true => db.next_due_after(soon, read.whole).await,
                false => Ok(None),
            };
            match (page, beyond) {
                (Ok(page), Ok(due)) => (jobs, next_due) = (Some(page), due),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "reading the backlog failed; trying again")
                }
            }
        }
        let event = match read.except_lane.filter(|_| for_others) {
            Some(lane) => Event::OtherLanesPage { jobs, lane, limit },
            None => Event::BacklogPage {
                jobs,
                limit,
                next_due,
            },
        };
        let _ = events.send(event);
    });
}

/// Reads which waiting jobs in the JobDB `command` names, off the scheduler task once the
/// writer has passed `barrier`, and sends them as [`Event::CommandTargets`].
pub(super) fn read_targets(
    db: JobDb,
    events: mpsc::UnboundedSender<Event>,
    barrier: oneshot::Receiver<u64>,
    command: Command,
) {
    tokio::spawn(async move {
        let targets = match barrier.await {
            Ok(before_row) => match db.command_targets(command.id, before_row).await {
                Ok(targets) => Some(targets),
                Err(e) => {
                    tracing::warn!(error = %e, command = command.id, "reading a command's jobs failed; trying again");
                    None
                }
            },
            Err(_) => None,
        };
        let _ = events.send(Event::CommandTargets {
            command: Box::new(command),
            targets,
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const HORIZON: Duration = Duration::from_secs(60);

    fn id(n: u128) -> JobId {
        JobId(ulid::Ulid::from(n))
    }

    #[test]
    fn a_whole_pass_that_reaches_the_end_leaves_nothing_pending() {
        let mut b = Backlog::pending();
        assert!(b.wanted(Instant::now()));
        assert_eq!(b.begin_page(true), (None, false));
        b.end_read(true, Instant::now());
        b.page_taken(10, 1000, Some(id(10)), true, None, HORIZON);
        assert!(!b.pending && b.cursor.is_none());
    }

    #[test]
    fn a_full_page_continues_after_its_last_job() {
        let mut b = Backlog::pending();
        b.begin_page(true);
        b.end_read(true, Instant::now());
        b.page_taken(1000, 1000, Some(id(7)), true, None, HORIZON);
        assert!(b.pending);
        assert_eq!(
            b.begin_page(false),
            (Some(id(7)), false),
            "a pass keeps its kind"
        );
    }

    #[test]
    fn a_horizon_pass_plans_the_next_before_the_first_job_beyond_it() {
        let mut b = Backlog::pending();
        assert_eq!(b.begin_page(false), (None, true));
        b.end_read(true, Instant::now());
        let due = Utc::now() + chrono::Duration::minutes(10);
        b.page_taken(3, 1000, Some(id(3)), false, Some(due), HORIZON);
        let wake = b.wake.expect("a planned pass");
        let ahead = wake - Instant::now();
        // Ten minutes ahead, less the one-minute horizon.
        assert!(ahead > Duration::from_secs(530) && ahead <= Duration::from_secs(540));
        assert!(b.pending && !b.wanted(Instant::now()));
        // Something became due meanwhile: the plan gives way.
        b.due_now();
        assert!(b.wanted(Instant::now()));
    }

    #[test]
    fn a_horizon_pass_with_nothing_beyond_ends_the_backlog() {
        let mut b = Backlog::pending();
        b.begin_page(false);
        b.end_read(true, Instant::now());
        b.page_taken(0, 1000, None, false, None, HORIZON);
        assert!(!b.pending);
    }

    #[test]
    fn a_hog_job_resting_sends_a_pass_round_again_and_a_drained_hog_asks_for_one() {
        // A job of the hog rests while a whole pass (which may have read past it) runs: the
        // pass does not end the backlog, it goes round again.
        let mut b = Backlog::pending();
        b.begin_page(true);
        b.hog_stays_in_backlog();
        b.end_read(true, Instant::now());
        b.page_taken(5, 1000, Some(id(5)), true, None, HORIZON);
        assert!(b.pending && b.wanted(Instant::now()));
        // A pass leaves the hog out while it holds 100 ready jobs and waits a while after.
        b.begin_page(false);
        b.leaving_out("http://hog/".into(), 100);
        b.end_read(true, Instant::now());
        b.page_taken(0, 1000, None, false, None, HORIZON);
        assert!(!b.wanted(Instant::now()), "a pass leaving a lane out waits");
        b.hog_drained(60);
        assert!(!b.wanted(Instant::now()), "still holding more than half");
        b.hog_drained(49);
        assert!(b.wanted(Instant::now()), "below half of it: a pass now");
        assert!(b.hog.is_none());
        // A hog left out for its retries (none ready) does not ask again and again.
        b.begin_page(false);
        b.leaving_out("http://hog/".into(), 0);
        b.end_read(true, Instant::now());
        b.page_taken(0, 1000, None, false, None, HORIZON);
        b.hog_drained(0);
        assert!(!b.wanted(Instant::now()));
    }

    #[test]
    fn jobs_left_out_during_a_pass_send_it_round_again() {
        let mut b = Backlog::pending();
        b.begin_page(true);
        b.due_now();
        b.end_read(true, Instant::now());
        b.page_taken(5, 1000, Some(id(5)), true, None, HORIZON);
        assert!(b.pending && b.wanted(Instant::now()));
        // The next pass starts from the beginning.
        assert_eq!(b.begin_page(true).0, None);
    }

    #[test]
    fn a_failed_read_pauses_and_jobs_that_left_are_reported() {
        let mut b = Backlog::pending();
        let now = Instant::now();
        b.begin_read();
        b.left_cache(id(1));
        assert!(b.busy(now));
        let left = b.end_read(false, now);
        assert!(left.contains(&id(1)));
        assert!(b.busy(now), "paused a second");
        assert!(!b.busy(now + Duration::from_secs(2)));
        b.woke(now + Duration::from_secs(2));
        assert_eq!(b.next_wake(), None);
        // Outside a read, leaving is not noted.
        b.left_cache(id(2));
        assert!(b.end_read(true, now).is_empty());
    }

    #[test]
    fn a_pass_that_left_a_lane_out_looks_again_later_and_less_often_while_it_finds_nothing() {
        let mut b = Backlog::pending();
        let mut waits = Vec::new();
        for _ in 0..3 {
            b.begin_page(false);
            b.leaving_out("http://hog/".into(), 0);
            b.end_read(true, Instant::now());
            b.page_taken(0, 1000, None, false, None, HORIZON);
            // The lane left out still has jobs in the JobDB: the backlog is not done.
            assert!(b.pending && b.cursor.is_none());
            waits.push(b.wake.expect("a planned pass") - Instant::now());
        }
        assert!(waits[0] <= Duration::from_secs(2) && waits[0] > Duration::from_millis(500));
        assert!(waits[1] > waits[0] && waits[2] > waits[1], "{waits:?}");
        // A pass that finds something makes the next one come soon again.
        b.begin_page(false);
        b.leaving_out("http://hog/".into(), 0);
        b.end_read(true, Instant::now());
        b.loaded(3);
        b.page_taken(3, 1000, Some(id(3)), false, None, HORIZON);
        assert!(b.wake.expect("a planned pass") - Instant::now() <= Duration::from_secs(1));
        // A pass that leaves nothing out ends the backlog as before.
        b.begin_page(false);
        b.end_read(true, Instant::now());
        b.page_taken(0, 1000, None, false, None, HORIZON);
        assert!(!b.pending);
    }

    #[test]
    fn eviction_looks_at_most_once_a_second() {
        let mut b = Backlog::pending();
        let now = Instant::now();
        assert!(b.may_evict(now));
        assert!(!b.may_evict(now + Duration::from_millis(500)));
        assert_eq!(b.next_wake(), Some(now + Duration::from_secs(1)));
        assert!(b.may_evict(now + Duration::from_secs(1)));
    }
}
