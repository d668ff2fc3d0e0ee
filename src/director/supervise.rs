//! The Director's core tasks, watched: the writer, the scheduler, the RPC server, the archiver
//! and the watchers of operator commands and controls. Each serves every endpoint and bucket,
//! so none may end quietly: if one returns or panics while the Director is not stopping, the
//! Director turns non-ready at once, closes intake, stops like on SIGTERM, and its
//! [`super::Director::wait`] returns [`super::DirectorError::TaskFailed`], so the process exits
//! non-zero and its supervisor restarts it (recovery settles whatever was in flight).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Spawns core tasks and remembers the first that ended unexpectedly.
#[derive(Clone)]
pub struct Supervisor {
    /// Cancelled when the Director stops on purpose (SIGTERM, hand-off); also cancelled here
    /// when a core task fails, which starts the same orderly stop.
    stopping: CancellationToken,
    /// Cancelled when ownership is lost: tasks ending then are expected too.
    lost: CancellationToken,
    /// The Director's readiness (`/readyz`).
    ready: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<&'static str>>>,
    metrics: Arc<Metrics>,
}

impl Supervisor {
    /// A supervisor that fails the Director through `stopping` and `ready`.
    pub fn new(
        stopping: CancellationToken,
        lost: CancellationToken,
        ready: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
    ) -> Self {
        metrics.core_tasks_up.set(1);
        Supervisor {
            stopping,
            lost,
            ready,
            failed: Arc::default(),
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

    fn fail(&self, name: &'static str, panicked: bool) {
        tracing::error!(
            task = name,
            panicked,
            "a core task of the director ended unexpectedly: not ready, stopping"
        );
        self.ready.store(false, Ordering::Release);
        self.metrics.core_tasks_up.set(0);
        if let Ok(mut failed) = self.failed.lock() {
            failed.get_or_insert(name);
        }
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
        let ready = Arc::new(AtomicBool::new(true));
        let supervisor = Supervisor::new(stopping.clone(), lost, ready.clone(), metrics);
        let crashing = supervisor.spawn("scheduler", async {
            tokio::task::yield_now().await;
            panic!("injected");
        });
        assert_eq!(crashing.await.expect("joined"), None::<()>);
        assert_eq!(supervisor.failure(), Some("scheduler"));
        assert!(stopping.is_cancelled());
        assert!(!ready.load(Ordering::Acquire));

        let (stopping, lost) = (CancellationToken::new(), CancellationToken::new());
        let ready = Arc::new(AtomicBool::new(true));
        let supervisor = Supervisor::new(
            stopping.clone(),
            lost,
            ready.clone(),
            Arc::new(Metrics::default()),
        );
        stopping.cancel();
        let done = supervisor.spawn("writer", async { 7 });
        assert_eq!(done.await.expect("joined"), Some(7));
        assert_eq!(supervisor.failure(), None);
        assert!(ready.load(Ordering::Acquire));
    }
}
