//! spindle: a database-as-a-queue HTTP delivery engine, after Segment's Centrifuge.
//!
//! Producers submit jobs ("send this payload to this endpoint") over RPC; a Director appends
//! them to the MySQL JobDB it owns, delivers them over HTTP with per-job exponential backoff,
//! and records every state change in an append-only transition log that operators read with SQL.
//!
//! # Layout (the arrows point down: a module uses those listed after it, never one before)
//! - [`cli`]: the `spindle` command line, one file per component (`director`, `router`,
//!   `lifecycle` for manager and drainer, `dashboard`, `ops` for operator tooling).
//! - [`dev`], [`bench`](mod@bench), [`demo`], [`submit`]: `spindle dev` (everything in one process on
//!   embedded parts), `spindle bench`, `spindle demo`, `spindle submit` (through the
//!   `spindle-client` crate, whose wire types [`rpc::api`] re-exports).
//! - [`director`]: the Director process: start-up and recovery, the group-commit
//!   [`director::writer`], the [`director::scheduler`] (cache, virtual queues, gates, backlog),
//!   its HTTP API ([`director::http`]), supervision of its core tasks, campaigning in Consul.
//! - [`router`]: the router: Redis dedup (Tapjoy's layout, Lua claims; or in-process),
//!   placements of logical shards, shuffle sharding of buckets onto Directors, its HTTP service.
//! - [`manager`] and [`drainer`]: the JobDB manager (spares, retirement, drops) and the drainer
//!   (moves still-retrying jobs to live JobDBs, archives the rest). The `manager/` and
//!   `drainer/` crates are only their per-role binaries.
//! - [`dashboard`]: `spindle dashboard`, a web page and JSON API over every live JobDB.
//! - [`registry`]: coordination: the Consul client, JobDB leases with fencing tokens, the JobDB
//!   inventory, the service catalog, endpoint and bucket controls.
//! - [`rpc`]: the intake toolkit every HTTP front shares: RPC types and validation, tokens,
//!   error bodies, request parsing.
//! - [`archive`]: the archive of jobs that leave a JobDB: its format (`archive::format`:
//!   gzip NDJSON batches with a manifest each) and backends (S3, a local directory). No SQL.
//! - [`delivery`]: the HTTP client, SSRF guard, response classification, signing and the
//!   backoff formula. No SQL.
//! - [`jobdb`]: the store: every SQL statement against a JobDB, written once and spelled per
//!   engine (`jobdb::engine::{mysql, sqlite}`), the write path and the writer's requests
//!   ([`jobdb::write`]), locks, lifecycle, stats, commands.
//! - [`metrics`]: Prometheus metrics on an explicit registry. [`replay`]: re-sending archived
//!   jobs. [`secret`]: tokens, keys and passwords that print as `***`. [`sink`]: a recording
//!   HTTP endpoint for demos, benchmarks and tests.
//! - [`job`]: the domain: ids, states, error types, retry policy, jobs and legal transitions.
//!   No I/O.
//! - `faults` (feature `fault-injection`, tests only): make a Director's core task panic.
//!
//! `tests/layers.rs` fails when `rpc`, `archive`, `jobdb` or `delivery` name a module above
//! them.

#![warn(missing_docs)]

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
