//! The in-memory "raft state": one global index bumped by every write, the KV table with
//! tombstones and lock-delays, sessions with TTL deadlines, and the agent's services and
//! checks. [`Store`] wraps it in a mutex and wakes blocking queries and the timer task.
//!
//! Submodules add the operations: [`kv`], [`session`] and [`agent`].

pub(crate) mod agent;
pub(crate) mod kv;
pub(crate) mod session;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::clock::Clock;
use crate::Config;

pub(crate) use agent::{Check, CheckStatus, Service};
pub(crate) use kv::KvEntry;
pub(crate) use session::Session;

/// Everything the double remembers. All mutation goes through [`Store::write`].
#[derive(Debug)]
pub(crate) struct State {
    /// The configuration the double was started with.
    pub(crate) config: Config,
    /// This node's ID (a UUID chosen at start).
    pub(crate) node_id: String,
    /// Virtual clock for TTLs and lock-delays.
    pub(crate) clock: Clock,
    /// Global raft-like index; starts at 1, bumped by every write.
    index: u64,
    /// KV entries by key.
    pub(crate) kv: BTreeMap<String, KvEntry>,
    /// Deleted keys and the index of their deletion (never reaped).
    pub(crate) tombstones: BTreeMap<String, u64>,
    /// Highest index of any KV write or delete.
    pub(crate) kv_index: u64,
    /// Lock-delay expiry (virtual time) per key.
    pub(crate) lock_delays: HashMap<String, Duration>,
    /// Live sessions by ID.
    pub(crate) sessions: BTreeMap<String, Session>,
    /// Highest index of any session create/destroy/invalidation.
    pub(crate) sessions_index: u64,
    /// Agent services by service ID.
    pub(crate) services: BTreeMap<String, Service>,
    /// Agent checks by check ID (the node's `serfHealth` is implicit and always passing).
    pub(crate) checks: BTreeMap<String, Check>,
    /// Highest index of any service or check change.
    pub(crate) health_index: u64,
}

impl State {
    fn new(config: Config) -> Self {
        State {
            config,
            node_id: uuid::Uuid::new_v4().to_string(),
            clock: Clock::new(),
            index: 1,
            kv: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            kv_index: 0,
            lock_delays: HashMap::new(),
            sessions: BTreeMap::new(),
            sessions_index: 0,
            services: BTreeMap::new(),
            checks: BTreeMap::new(),
            health_index: 0,
        }
    }

    /// Takes the next raft index for a write.
    pub(crate) fn next_index(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    /// The current global index.
    pub(crate) fn index(&self) -> u64 {
        self.index
    }

    /// Applies every timer that is due: expired session TTLs are invalidated, lapsed TTL
    /// checks go critical.
    pub(crate) fn expire_due(&mut self) {
        let now = self.clock.now();
        let due_sessions: Vec<String> = self
            .sessions
            .values()
            .filter(|s| s.deadline.is_some_and(|d| d <= now))
            .map(|s| s.id.clone())
            .collect();
        for id in due_sessions {
            self.session_invalidate(&id);
        }
        let due_checks: Vec<String> = self
            .checks
            .values()
            .filter(|c| c.deadline.is_some_and(|d| d <= now))
            .map(|c| c.id.clone())
            .collect();
        for id in due_checks {
            self.check_ttl_lapsed(&id);
        }
        self.lock_delays.retain(|_, until| *until > now);
    }

    /// The earliest pending timer deadline (virtual time), if any.
    pub(crate) fn next_deadline(&self) -> Option<Duration> {
        let s = self.sessions.values().filter_map(|s| s.deadline);
        let c = self.checks.values().filter_map(|c| c.deadline);
        s.chain(c).min()
    }
}

/// The shared, locked [`State`] plus the signals that wake blocking queries (a watch on
/// the global index) and the timer task.
#[derive(Debug)]
pub(crate) struct Store {
    state: Mutex<State>,
    index_tx: watch::Sender<u64>,
    timers: Notify,
}

impl Store {
    /// A fresh store for `config`.
    pub(crate) fn new(config: Config) -> Self {
        let state = State::new(config);
        let index_tx = watch::Sender::new(state.index);
        Store {
            state: Mutex::new(state),
            index_tx,
            timers: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a read-only closure on the state.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock())
    }

    /// Runs a mutating closure, then wakes blocking queries if the index moved and lets the
    /// timer task recompute its next deadline.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = self.write_quiet(f);
        self.timers.notify_one();
        r
    }

    /// Like [`Store::write`] without waking the timer task (used by the timer task itself).
    fn write_quiet<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut st = self.lock();
        let before = st.index;
        let r = f(&mut st);
        let after = st.index;
        drop(st);
        if after != before {
            self.index_tx.send_replace(after);
        }
        r
    }

    /// A receiver that changes whenever the global index moves.
    pub(crate) fn subscribe_index(&self) -> watch::Receiver<u64> {
        self.index_tx.subscribe()
    }

    /// The timer task: applies due timers, then sleeps until the next deadline or until a
    /// write may have changed the deadlines. Runs until the task is aborted.
    pub(crate) async fn run_timers(&self) {
        loop {
            let notified = self.timers.notified();
            let wait = self.write_quiet(|st| {
                st.expire_due();
                st.next_deadline().and_then(|d| st.clock.real_wait_until(d))
            });
            match wait {
                Some(d) => {
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}
