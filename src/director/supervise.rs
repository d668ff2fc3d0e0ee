//! The Director's core tasks, watched, and its readiness.
//!
//! The writer, the scheduler, the RPC server, the archiver, the sequencer and the watchers of
//! operator commands and controls each serve every endpoint and bucket, so none may end
//! quietly: if one returns or panics while the Director is not stopping, the Director turns
//! non-ready at once, closes intake, stops like on SIGTERM, and its
//! [`super::Director::wait`] returns [`super::DirectorError::TaskFailed`], so the process exits
//! non-zero and its supervisor restarts it (recovery settles whatever was in flight).
//!
//! Nor may one hang quietly. The writer, the scheduler and the sequencer report their
//! [`Progress`]: when they have work, and when they finished it. The watchdog looks every
//! quarter second; a task that has had work for longer than its bound without finishing it
//! (the writer: no commit succeeded, so the JobDB cannot be written; the scheduler or the
//! sequencer: stuck in one step) makes the Director non-ready, and the first progress makes it
//! ready again by itself. Readiness ([`Readiness`]) is what `/readyz` answers and, in a
//! cluster, what the catalog check says, so routers stop sending while it is not.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How often the watchdog looks at the tasks' progress.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Whether the Director is ready (`None`), or why not.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<watch::Sender<Option<String>>>);

impl Default for Readiness {
    fn default() -> Self {
        Readiness(Arc::new(watch::Sender::new(None)))
    }
}

impl Readiness {
    /// Why the Director is not ready, or `None` when it is.
    pub fn why_not(&self) -> Option<String> {
        self.0.borrow().clone()
    }

    /// Told every change (for the catalog check).
    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.0.subscribe()
    }

    fn set(&self, why_not: Option<String>) {
        self.0.send_if_modified(|now| {
            let changed = *now != why_not;
            *now = why_not;
            changed
        });
    }
}

/// Milliseconds since this process's first look at the clock, plus one (0 means "none").
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// A watched task's progress: since when it has had work it has not finished (none: idle).
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    /// The task has work from now on (if it had none already).
    pub fn busy(&self) {
        self.busy_at(now_ms());
    }

    /// The task finished its work (progress): nothing pending.
    pub fn idle(&self) {
        self.0.store(0, Ordering::Release);
    }

    /// One step of work: busy until the returned guard is dropped.
    pub fn step(&self) -> Step<'_> {
        self.busy();
        Step(self)
    }

    /// Whether the task has work it has not finished.
    pub fn is_busy(&self) -> bool {
        self.0.load(Ordering::Acquire) != 0
    }

    /// Whether the task has had work for longer than `bound` without finishing it.
    pub fn stalled(&self, bound: Duration) -> bool {
        self.stalled_at(bound, now_ms())
    }

    fn stalled_at(&self, bound: Duration, now: u64) -> bool {
        stalled(self.0.load(Ordering::Acquire), now, bound)
    }

    fn busy_at(&self, now: u64) {
        let _ = self
            .0
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A step of work under way (see [`Progress::step`]).
pub struct Step<'a>(&'a Progress);

impl Drop for Step<'_> {
    fn drop(&mut self) {
        self.0.idle();
    }
}

/// Whether work pending since `busy_since` (0: none) is older than `bound` at `now`
/// (milliseconds on one clock).
fn stalled(busy_since: u64, now: u64, bound: Duration) -> bool {
    let bound = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    busy_since != 0 && now.saturating_sub(busy_since) > bound
}

/// A task the watchdog looks at.
struct Watched {
    name: &'static str,
    progress: Progress,
    bound: Duration,
    /// What its stall means, for `/readyz` and the log.
    meaning: &'static str,
}

/// Spawns core tasks, remembers the first that ended unexpectedly, and watches the progress of
/// those that report it.
#[derive(Clone)]
pub struct Supervisor {
    /// Cancelled when the Director stops on purpose (SIGTERM, hand-off); also cancelled here
    /// when a core task fails, which starts the same orderly stop.
    stopping: CancellationToken,
    /// Cancelled when ownership is lost: tasks ending then are expected too.
    lost: CancellationToken,
    /// The Director's readiness (`/readyz`, the catalog check).
    readiness: Readiness,
    failed: Arc<Mutex<Option<&'static str>>>,
    watched: Arc<Mutex<Vec<Watched>>>,
    metrics: Arc<Metrics>,
}

impl Supervisor {
    /// A supervisor that fails the Director through `stopping` and `readiness`.
    pub fn new(
        stopping: CancellationToken,
        lost: CancellationToken,
        readiness: Readiness,
        metrics: Arc<Metrics>,
    ) -> Self {
        metrics.core_tasks_up.set(1);
        metrics.jobdb_writable.set(1);
        Supervisor {
            stopping,
            lost,
            readiness,
            failed: Arc::default(),
            watched: Arc::default(),
            metrics,
        }
    }

    /// Spawns `task` as the core task `name`. Its handle yields `None` if it panicked.
    pub fn spawn<F>(&self, name: &'static str, task: F) -> JoinHandle<Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let this = self.clone();
        tokio::spawn(async move {
            let ended = AssertUnwindSafe(task).catch_unwind().await;
            if !this.stopping.is_cancelled() && !this.lost.is_cancelled() {
                this.fail(name, ended.is_err());
            }
            ended.ok()
        })
    }

    /// The progress of the core task `name`, watched: having work for longer than `bound`
    /// without finishing it makes the Director non-ready (`meaning` says what that means).
    pub fn watch(&self, name: &'static str, bound: Duration, meaning: &'static str) -> Progress {
        let progress = Progress::default();
        if let Ok(mut watched) = self.watched.lock() {
            watched.push(Watched {
                name,
                progress: progress.clone(),
                bound,
                meaning,
            });
        }
        progress
    }

    /// Looks at the watched tasks every quarter second until the Director stops, and sets
    /// readiness from what it sees.
    pub async fn watchdog(self) {
        let mut stalled_before: Vec<&'static str> = Vec::new();
        loop {
            tokio::select! {
                _ = self.stopping.cancelled() => return,
                _ = self.lost.cancelled() => return,
                _ = tokio::time::sleep(WATCH_EVERY) => {}
            }
            let stalled = self.look();
            if stalled != stalled_before {
                match stalled.is_empty() {
                    true => tracing::info!("the director's tasks progress again: ready"),
                    false => tracing::warn!(
                        stalled = ?stalled,
                        "a core task has had work without progress past its bound: not ready"
                    ),
                }
                stalled_before = stalled;
            }
        }
    }

    /// One look: sets readiness and the gauges; returns the stalled tasks.
    fn look(&self) -> Vec<&'static str> {
        self.look_at(now_ms())
    }

    fn look_at(&self, now: u64) -> Vec<&'static str> {
        let Ok(watched) = self.watched.lock() else {
            return Vec::new();
        };
        let mut stalled = Vec::new();
        let mut why = Vec::new();
        for task in watched.iter() {
            let stuck = task.progress.stalled_at(task.bound, now);
            self.metrics.task_stalled(task.name).set(i64::from(stuck));
            if task.name == "writer" {
                self.metrics.jobdb_writable.set(i64::from(!stuck));
            }
            if stuck {
                stalled.push(task.name);
                why.push(format!("{}: {}", task.name, task.meaning));
            }
        }
        if self.failure().is_none() {
            self.readiness
                .set((!why.is_empty()).then(|| why.join("; ")));
        }
        stalled
    }

    fn fail(&self, name: &'static str, panicked: bool) {
        tracing::error!(
            task = name,
            panicked,
            "a core task of the director ended unexpectedly: not ready, stopping"
        );
        if let Ok(mut failed) = self.failed.lock() {
            failed.get_or_insert(name);
        }
        self.readiness
            .set(Some(format!("the {name} task ended unexpectedly")));
        self.metrics.core_tasks_up.set(0);
        self.stopping.cancel();
    }

    /// The first core task that ended unexpectedly, if any.
    pub fn failure(&self) -> Option<&'static str> {
        self.failed.lock().ok().and_then(|f| *f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_ending_early_fails_the_director_and_a_stop_does_not() {
        let metrics = Arc::new(Metrics::default());
        let (stopping, lost) = (CancellationToken::new(), CancellationToken::new());
        let readiness = Readiness::default();
        let supervisor = Supervisor::new(stopping.clone(), lost, readiness.clone(), metrics);
        let crashing = supervisor.spawn("scheduler", async {
            tokio::task::yield_now().await;
            panic!("injected");
        });
        assert_eq!(crashing.await.expect("joined"), None::<()>);
        assert_eq!(supervisor.failure(), Some("scheduler"));
        assert!(stopping.is_cancelled());
        assert!(readiness.why_not().is_some());

        let (stopping, lost) = (CancellationToken::new(), CancellationToken::new());
        let readiness = Readiness::default();
        let supervisor = Supervisor::new(
            stopping.clone(),
            lost,
            readiness.clone(),
            Arc::new(Metrics::default()),
        );
        stopping.cancel();
        let done = supervisor.spawn("writer", async { 7 });
        assert_eq!(done.await.expect("joined"), Some(7));
        assert_eq!(supervisor.failure(), None);
        assert_eq!(readiness.why_not(), None);
    }

    #[test]
    fn a_task_with_work_and_no_progress_past_its_bound_is_stalled_and_progress_clears_it() {
        let bound = Duration::from_millis(2000);
        // Idle: never stalled, however long.
        assert!(!stalled(0, u64::MAX, bound));
        // Work since t = 1,000 ms: not at 3,000 (exactly the bound), stalled at 3,001.
        assert!(!stalled(1000, 3000, bound));
        assert!(stalled(1000, 3001, bound));
        // A clock read before the work began (another thread's look) is not a stall.
        assert!(!stalled(5000, 4000, bound));

        let progress = Progress::default();
        progress.busy_at(1000);
        // More work while busy keeps the oldest start: a task that keeps taking work without
        // finishing any still stalls.
        progress.busy_at(2500);
        assert_eq!(progress.0.load(Ordering::Acquire), 1000);
        assert!(progress.is_busy());
        progress.idle();
        assert!(!progress.is_busy());
        {
            let _step = progress.step();
            assert!(progress.is_busy());
        }
        assert!(!progress.is_busy(), "a finished step is progress");
    }

    #[test]
    fn the_watchdog_turns_a_stalled_task_non_ready_and_its_progress_ready_again() {
        let metrics = Arc::new(Metrics::default());
        let (stopping, lost) = (CancellationToken::new(), CancellationToken::new());
        let readiness = Readiness::default();
        let supervisor = Supervisor::new(stopping, lost, readiness.clone(), metrics.clone());
        let bound = Duration::from_secs(2);
        let writer = supervisor.watch("writer", bound, "the jobdb cannot be written");
        let scheduler = supervisor.watch("scheduler", bound * 5, "stuck in one step");
        assert!(supervisor.look_at(100_000).is_empty());
        assert_eq!(readiness.why_not(), None);

        writer.busy_at(1_000);
        scheduler.busy_at(1_000);
        assert!(supervisor.look_at(3_000).is_empty(), "within the bound");
        assert_eq!(supervisor.look_at(3_001), vec!["writer"]);
        assert_eq!(
            readiness.why_not().as_deref(),
            Some("writer: the jobdb cannot be written")
        );
        assert_eq!(metrics.jobdb_writable.get(), 0);
        assert_eq!(supervisor.look_at(11_001), vec!["writer", "scheduler"]);

        writer.idle();
        scheduler.idle();
        assert!(supervisor.look_at(20_000).is_empty());
        assert_eq!(readiness.why_not(), None);
        assert_eq!(metrics.jobdb_writable.get(), 1);
    }
}
