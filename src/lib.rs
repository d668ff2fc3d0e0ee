//! spindle: a database-as-a-queue HTTP delivery engine, after Segment's Centrifuge.
//!
//! Producers submit jobs ("send this payload to this endpoint") over RPC; a Director appends
//! them to the MySQL JobDB it owns, delivers them over HTTP with per-job exponential backoff,
//! and records every state change in an append-only transition log that operators read with SQL.
//!
//! # Layout
//! - [`job`]: the domain: ids, states, retry policy, jobs and legal transitions. No I/O.
//! - [`jobdb`]: every SQL statement against a JobDB, one function each, and its lock.
//! - [`delivery`]: the HTTP client, response classification and the backoff formula. No SQL.
//! - [`director`]: the Director process: start-up, group-commit [`director::writer`],
//!   [`director::scheduler`] (cache, virtual queues, timers), recovery and shutdown.
//! - [`rpc`]: the axum routes, request validation, error mapping and OpenAPI document.
//! - [`metrics`]: Prometheus metrics on an explicit registry.
//! - [`registry`]: coordination: the Consul client, JobDB leases with fencing tokens, the JobDB
//!   inventory and the service catalog.
//! - [`router`]: the router's core: the Redis dedup store (Tapjoy's layout, Lua claims, owner
//!   ids; or an in-process store with the same semantics), time-bounded placements of logical
//!   shards on stores, and shuffle sharding of buckets onto Directors. No HTTP.
//! - [`archive`]: the archive of jobs that leave a JobDB (expired, or history of moved jobs):
//!   gzip NDJSON batches with a manifest each, in S3 or a local directory. No SQL.
//! - [`dashboard`]: `spindle dashboard`, a web page and JSON API over every live JobDB
//!   (throughput, endpoints, attempts, inventory, job traces).
//! - [`secret`]: tokens, keys and passwords that print as `***`.
//! - [`sink`]: a recording HTTP endpoint for demos, benchmarks and tests.
//! - [`cli`]: the `spindle` command line (`director`, `dashboard`, `demo`, `bench`, `sink`, ...).
//! - [`bench`] and [`demo`]: the `spindle bench` and `spindle demo` subcommands.
//! - [`dev`]: `spindle dev`, everything in one process on embedded parts.
//! - `faults` (feature `fault-injection`, tests only): make a Director's core task panic.
//! - [`submit`]: `spindle submit`, jobs from options, a file or stdin, through the
//!   `spindle-client` crate (the typed client whose wire types [`rpc::api`] re-exports).
//!
//! The `manager/` and `drainer/` crates hold the JobDB manager and drainer binaries.

pub mod archive;
pub mod bench;
pub mod cli;
pub mod dashboard;
pub mod delivery;
pub mod demo;
pub mod dev;
pub mod director;
pub mod drainer;
#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod job;
pub mod jobdb;
pub mod manager;
pub mod metrics;
pub mod registry;
pub mod replay;
pub mod router;
pub mod rpc;
pub mod secret;
pub mod sink;
pub mod submit;

/// Resolves on SIGINT or SIGTERM: how every long-running subcommand learns to stop.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
