//! spindle: a database-as-a-queue HTTP delivery engine, after Segment's Centrifuge.
//!
//! Producers submit jobs ("send this payload to this endpoint") over RPC; a Director appends
//! them to the MySQL JobDB it owns, delivers them over HTTP with per-job exponential backoff,
//! and records every state change in an append-only transition log that operators read with SQL.
//!
//! # Layout (the arrows point down: a module names only modules below it)
//! `tests/layers.rs` holds each module's rank and fails on any name of a module at or above
//! it. Top to bottom:
//! - [`cli`]: the `spindle` command line, one file per component (`director`, `router`,
//!   `lifecycle` for manager and drainer, `dashboard`, `ops` for operator tooling), and the
//!   programs: `spindle dev` (everything in one process on embedded parts), `bench`, `demo`,
//!   `submit` (through the `spindle-client` crate, whose wire types [`rpc::api`] re-exports),
//!   `replay` (re-sending archived jobs), `sink` (a recording HTTP endpoint for demos,
//!   benchmarks and tests).
//! - The services, peers that never name one another:
//!   - [`director`]: the Director process: start-up and recovery, the group-commit
//!     [`director::writer`] and the requests it takes ([`director::mailbox::WriteOp`]), the
//!     [`director::scheduler`] (cache, lanes, gates, backlog), the [`director::ordering`]
//!     (ordered keys), its HTTP API ([`director::http`]), archiving its expired jobs
//!     ([`director::archiving`]), supervision of its core tasks, campaigning in Consul.
//!   - [`router`]: the router: Redis dedup (Tapjoy's layout, Lua claims; or in-process),
//!     placements of logical shards, shuffle sharding of buckets onto Directors, its HTTP
//!     service.
//!   - [`manager`] and [`drainer`]: the JobDB manager (spares, retirement, drops) and the
//!     drainer (moves still-retrying jobs to live JobDBs, archives the rest). The `manager/`
//!     and `drainer/` crates are only their per-role binaries.
//!   - [`dashboard`]: `spindle dashboard`, a web page and JSON API over every live JobDB.
//! - [`archiver`]: moving jobs of an owned JobDB into the archive exactly once (plan, upload,
//!   confirm), shared by the Director and the drainer, each with its [`archiver::Recorder`] of
//!   the `archived` rows. [`events`]: events and subscriptions: matching an event to its
//!   subscriptions, the control database they live in and each process's cache of it, the
//!   subscription API. [`ledger`]: the conservation ledger (`spindle audit`): proof from each
//!   JobDB's rows that every accepted job ended or is open, with anything else named.
//!   [`erasure`]: `spindle erase`: a bucket's payloads removed from JobDBs and the archive,
//!   with a receipt.
//! - [`registry`]: coordination: the Consul client, JobDB leases with fencing tokens, the JobDB
//!   inventory, the service catalog, endpoint and bucket controls. [`rpc`]: the intake toolkit
//!   every HTTP front shares: RPC types, validation and views, the OpenAPI document, tokens,
//!   error bodies, request parsing.
//! - [`jobdb`]: the store: every SQL statement against a JobDB, written once and spelled per
//!   engine (`jobdb::engine::{mysql, sqlite}`): the write path ([`jobdb::write`]), ordered keys
//!   ([`jobdb::ordering`]), completion notices ([`jobdb::notices`]), locks, lifecycle, stats,
//!   commands. Its module doc lists every operation it offers.
//! - [`archive`]: the archive of jobs that leave a JobDB: its format (`archive::format`:
//!   gzip NDJSON batches with a manifest each, [`archive::BatchKind`]) and backends (S3, a
//!   local directory). No SQL, no JobDB.
//! - [`metrics`]: Prometheus metrics on an explicit registry.
//! - [`delivery`]: the HTTP client, SSRF guard, response classification, signing and the
//!   backoff formula. No SQL.
//! - [`job`]: the domain: ids, states, error types, retry policy, jobs and legal transitions.
//!   No I/O. [`secret`]: tokens, keys and passwords that print as `***`. [`telemetry`]: W3C
//!   trace context on jobs, the spans of intake, forward, commit and attempts, OTLP export. `faults` (feature
//!   `fault-injection`, tests only): make a Director's core task panic.

#![warn(missing_docs)]

pub mod archive;
pub mod archiver;
pub mod cli;
pub mod dashboard;
pub mod delivery;
pub mod director;
pub mod drainer;
pub mod erasure;
pub mod events;
#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod job;
pub mod jobdb;
pub mod ledger;
pub mod manager;
pub mod metrics;
pub mod registry;
pub mod router;
pub mod rpc;
pub mod secret;
pub mod telemetry;

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
