//! Fault hooks: switches a test flips to make the double misbehave the way a real Consul
//! cluster can (failed renews, no leader, slowness, stalls, index resets, dropped
//! connections). All methods take `&self`; the state lives in atomics, mutexes and watch
//! channels so handlers see changes at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Fault hooks shared by every request handler. Obtain it with
/// [`ConsulDouble::faults`](crate::ConsulDouble::faults) or drive it over HTTP under `/_test/faults/`.
#[derive(Debug)]
pub struct Faults {
    renew_fails: AtomicBool,
    error_500: AtomicBool,
    latency: Mutex<Duration>,
    stall_until: Mutex<Option<Instant>>,
    index_backwards: AtomicBool,
    /// KV writes under this prefix wait this long before they apply.
    kv_write_delay: Mutex<Option<(String, Duration)>>,
    /// Bumped when `index_backwards_once` is armed, to wake parked blocking queries.
    backwards_gen: watch::Sender<u64>,
    /// Bumped by `drop_blocking_queries`; parked queries that see a bump drop their connection.
    drop_gen: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            renew_fails: AtomicBool::new(false),
            error_500: AtomicBool::new(false),
            latency: Mutex::new(Duration::ZERO),
            stall_until: Mutex::new(None),
            index_backwards: AtomicBool::new(false),
            kv_write_delay: Mutex::new(None),
            backwards_gen: watch::Sender::new(0),
            drop_gen: watch::Sender::new(0),
        }
    }
}

impl Faults {
    /// While on, `PUT /v1/session/renew/:id` answers 404 `Session id '<id>' not found` even
    /// for live sessions (the session itself is left alone and expires on its TTL).
    pub fn set_renew_fails(&self, on: bool) {
        self.renew_fails.store(on, Ordering::SeqCst);
    }

    /// While on, every `/v1` request answers 500 with the text `No cluster leader`.
    pub fn set_error_500(&self, on: bool) {
        self.error_500.store(on, Ordering::SeqCst);
    }

    /// Every `/v1` request waits `d` before being handled; `Duration::ZERO` turns it off.
    pub fn set_latency(&self, d: Duration) {
        *lock(&self.latency) = d;
    }

    /// Every `/v1` request arriving within the next `d` hangs until `d` has passed, then is
    /// handled normally (a leader election or a long GC pause, as seen by clients).
    pub fn stall(&self, d: Duration) {
        let until = Instant::now() + d;
        let mut slot = lock(&self.stall_until);
        *slot = Some(slot.map_or(until, |old| old.max(until)));
    }

    /// The next blocking-read response (a read carrying `?index=`) answers at once with
    /// `X-Consul-Index: 1`, lower than any index a client has seen after a write, as after a
    /// snapshot restore. Queries already parked are woken so one of them takes it. Once only.
    pub fn index_backwards_once(&self) {
        self.index_backwards.store(true, Ordering::SeqCst);
        self.backwards_gen.send_modify(|g| *g += 1);
    }

    /// Every blocking query parked right now has its TCP connection closed abruptly, without
    /// any response bytes (clients see a connection reset / incomplete message). Queries
    /// that arrive afterwards are not affected. When the router is used without the double's
    /// own accept loop (no connection handle), those queries answer 500 instead.
    pub fn drop_blocking_queries(&self) {
        self.drop_gen.send_modify(|g| *g += 1);
    }

    /// Every `PUT /v1/kv/<key>` whose key starts with `prefix` waits `d` before it applies
    /// (a slow write as one client sees it; reads and other keys are not delayed), so a test
    /// can hold a write in flight and look at what its writer does meanwhile. `None` turns it
    /// off.
    pub fn delay_kv_writes(&self, under: Option<(&str, Duration)>) {
        *lock(&self.kv_write_delay) = under.map(|(prefix, d)| (prefix.to_string(), d));
    }

    pub(crate) fn kv_write_delay(&self, key: &str) -> Option<Duration> {
        lock(&self.kv_write_delay)
            .as_ref()
            .filter(|(prefix, _)| key.starts_with(prefix.as_str()))
            .map(|(_, d)| *d)
    }

    /// Turns every fault off: renew failures, 500s, latency, stall, delayed KV writes and a
    /// pending index reset.
    pub fn clear(&self) {
        self.delay_kv_writes(None);
        self.set_renew_fails(false);
        self.set_error_500(false);
        self.set_latency(Duration::ZERO);
        *lock(&self.stall_until) = None;
        self.index_backwards.store(false, Ordering::SeqCst);
    }

    pub(crate) fn renew_fails(&self) -> bool {
        self.renew_fails.load(Ordering::SeqCst)
    }

    pub(crate) fn error_500(&self) -> bool {
        self.error_500.load(Ordering::SeqCst)
    }

    pub(crate) fn latency(&self) -> Duration {
        *lock(&self.latency)
    }

    pub(crate) fn stall_until(&self) -> Option<Instant> {
        *lock(&self.stall_until)
    }

    /// Consumes a pending index reset; true for exactly one caller per arming.
    pub(crate) fn take_index_backwards(&self) -> bool {
        self.index_backwards.swap(false, Ordering::SeqCst)
    }

    pub(crate) fn subscribe_backwards(&self) -> watch::Receiver<u64> {
        self.backwards_gen.subscribe()
    }

    pub(crate) fn subscribe_drop(&self) -> watch::Receiver<u64> {
        self.drop_gen.subscribe()
    }
}

/// Locks a mutex, ignoring poisoning (the guarded values are always valid).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
