//! `consul-double`: an in-memory, Consul-compatible HTTP server for spindle's tests.
//!
//! It implements the subset of the Consul HTTP API that spindle's Consul client uses
//! (sessions, KV with locks, blocking queries, agent services with TTL checks, health,
//! catalog, status) with real Consul's status codes, bodies and quirks, following
//! `shared/reference/consul-http-api.md`. On top it offers fault hooks ([`Faults`]),
//! immediate session expiry ([`ConsulDouble::expire_session`]) and a virtual clock for
//! TTLs and lock-delays ([`ConsulDouble::freeze_time`], [`ConsulDouble::advance_time`]),
//! all also reachable over HTTP under `/_test/` (see the `http::test_hooks` module).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use consul_double::{Config, ConsulDouble};
//! let double = ConsulDouble::start(Config {
//!     listen: "127.0.0.1:0".parse().unwrap(),
//!     session_ttl_min: std::time::Duration::from_secs(1),
//!     ..Config::default()
//! })
//! .await?;
//! let base = double.url(); // http://127.0.0.1:PORT
//! double.faults().set_error_500(true);
//! double.stop().await;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod clock;
pub mod duration;
mod error;
mod faults;
mod http;
mod server;
mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use faults::Faults;

use http::Shared;
use store::Store;

/// Start-up settings of a [`ConsulDouble`].
#[derive(Clone, Debug)]
pub struct Config {
    /// Address to bind; use `127.0.0.1:0` in tests for a free port.
    pub listen: SocketAddr,
    /// The agent's node name (default `consul-double`); sessions default to it.
    pub node_name: String,
    /// Smallest session TTL accepted (Consul's `session_ttl_min`, default 10s).
    pub session_ttl_min: Duration,
    /// A TTL session is invalidated TTL × this after its last create/renew (default 2).
    pub session_ttl_multiplier: u32,
    /// Lock-delays are capped at this (Consul's `MaxLockDelay`, default 60s).
    pub max_lock_delay: Duration,
    /// Largest KV value accepted; larger PUT bodies get 413 (default 512 KiB).
    pub kv_max_value_size: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8500)),
            node_name: "consul-double".to_string(),
            session_ttl_min: Duration::from_secs(10),
            session_ttl_multiplier: 2,
            max_lock_delay: Duration::from_secs(60),
            kv_max_value_size: 512 * 1024,
        }
    }
}

/// A running double: an HTTP server on [`ConsulDouble::addr`] plus its TTL timer task.
/// Dropping it stops both (use [`ConsulDouble::stop`] to wait for that).
#[derive(Debug)]
pub struct ConsulDouble {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
    timers: Option<JoinHandle<()>>,
}

impl ConsulDouble {
    /// Binds `config.listen` and starts serving. Must be called inside a Tokio runtime.
    pub async fn start(config: Config) -> std::io::Result<ConsulDouble> {
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Store::new(config),
            faults: Faults::default(),
            parked: Default::default(),
        });
        let router = http::router(shared.clone());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let server = tokio::spawn(server::serve(listener, router, shutdown_rx));
        let timer_shared = shared.clone();
        let timers = tokio::spawn(async move { timer_shared.store.run_timers().await });
        Ok(ConsulDouble {
            addr,
            shared,
            shutdown,
            server: Some(server),
            timers: Some(timers),
        })
    }

    /// The bound address (with the real port when `listen` used port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The fault hooks.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Invalidates a session now, exactly as TTL expiry would: held keys are released or
    /// deleted per its behavior and get its lock-delay. False if no such session.
    pub fn expire_session(&self, id: &str) -> bool {
        self.shared.store.write(|st| st.session_invalidate(id))
    }

    /// Stops the virtual clock used for session TTLs, check TTLs and lock-delays: nothing
    /// expires until [`ConsulDouble::advance_time`] or [`ConsulDouble::resume_time`].
    pub fn freeze_time(&self) {
        self.shared.store.write(|st| st.clock.freeze());
    }

    /// Lets a frozen virtual clock run again from where it stopped.
    pub fn resume_time(&self) {
        self.shared.store.write(|st| st.clock.resume());
    }

    /// Moves the virtual clock forward by `d` and applies every timer that became due
    /// before returning (sessions expire, TTL checks go critical, lock-delays end).
    pub fn advance_time(&self, d: Duration) {
        self.shared.store.write(|st| {
            st.clock.advance(d);
            st.expire_due();
        });
    }

    /// The current global (raft-like) index.
    pub fn index(&self) -> u64 {
        self.shared.store.read(|st| st.index())
    }

    /// How many blocking queries are parked right now (lets tests wait for a query to be
    /// parked instead of sleeping).
    pub fn parked_queries(&self) -> usize {
        self.shared.parked.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops accepting, closes every open connection and stops the timer task.
    pub async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        if let Some(timers) = self.timers.take() {
            timers.abort();
            let _ = timers.await;
        }
    }
}

impl Drop for ConsulDouble {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(server) = self.server.take() {
            server.abort();
        }
        if let Some(timers) = self.timers.take() {
            timers.abort();
        }
    }
}
