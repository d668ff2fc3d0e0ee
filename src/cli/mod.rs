//! The `spindle` command line. Every option also reads a `SPINDLE_*` environment variable;
//! defaults are the documented ones (README, "Configuration").
//!
//! This module holds the command line itself ([`Cli`], [`Command`]), running it ([`run`],
//! [`execute`], [`run_service`]) and the option groups several commands share ([`ConsulArgs`],
//! [`S3Args`]). Each component's options and how it is run live beside it:
//! - `director`: `spindle director` ([`DirectorArgs`], [`RegistryKind`]);
//! - `router`: `spindle router` and `spindle placements` ([`RouterArgs`], [`DedupArgs`],
//!   [`PlacementsCommand`]);
//! - `lifecycle`: `spindle manager` and `spindle drainer` ([`ManagerArgs`], [`DrainerArgs`]);
//! - `dashboard`: `spindle dashboard` ([`DashboardArgs`], [`DashboardRegistry`]);
//! - `ops`: operator tooling: `jobs`, `endpoints`, `replay`, `jobdbs`, `tokens`, `sink`;
//! - `audit` and `erase`: `spindle audit` (the ledger) and `spindle erase` (erasure);
//! - `subscriptions`: `subscriptions` (with `backfill`) and `publish` (events).
//!
//! The programs that are more than options have modules of their own here: [`dev`] (`spindle
//! dev`: everything in one process on embedded parts), [`bench`](mod@bench), [`demo`],
//! [`submit`] (through the `spindle-client` crate), [`replay`] (re-sending archived jobs),
//! [`backfill`] (past events to a new subscription) and [`sink`] (a recording HTTP endpoint for demos, benchmarks and tests).
//!
//! Every type is re-exported here: `spindle::cli::ManagerArgs` and the like are the paths to
//! use.

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::secret::Secret;

mod audit;
pub mod backfill;
pub mod bench;
mod dashboard;
pub mod demo;
pub mod dev;
mod director;
mod erase;
mod jobs;
mod lifecycle;
mod ops;
pub mod replay;
mod router;
pub mod sink;
pub mod submit;
mod subscriptions;

pub use dashboard::{DashboardArgs, DashboardRegistry};
pub use director::{DirectorArgs, RegistryKind};
pub use lifecycle::{DrainerArgs, ManagerArgs};
pub use ops::{
    ControlTarget, EndpointsCommand, JobdbsCommand, PauseArgs, ReplayArgs, SinkArgs, TokensCommand,
};
pub use router::{DedupArgs, PlacementsCommand, RouterArgs};
pub use subscriptions::{AddArgs, ApiArgs, PublishArgs, SubscriptionsCommand};

/// spindle: a database-as-a-queue HTTP delivery engine.
#[derive(Debug, Parser)]
#[command(name = "spindle", version, about)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `spindle=debug`.
    #[arg(long, env = "SPINDLE_LOG", default_value = "info", global = true)]
    pub log: String,
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a Director: own one JobDB, accept jobs over RPC, deliver them.
    Director(Box<DirectorArgs>),
    /// Run a Director on a fresh demo JobDB with a local test endpoint, submit a mix of jobs
    /// (successes, retries, a rate limit, discards), and show them reach their final states.
    Demo(crate::cli::demo::DemoArgs),
    /// Run everything in one process on embedded parts (SQLite JobDBs, a directory archive,
    /// in-process registry and dedup), data under one directory: nothing to install.
    /// `--demo` adds a local endpoint and a producer to watch on the dashboard.
    Dev(Box<crate::cli::dev::DevArgs>),
    /// Measure intake and end-to-end delivery throughput against a local endpoint.
    Bench(crate::cli::bench::BenchArgs),
    /// Run the recording test endpoint alone (see `spindle::cli::sink` for its paths).
    Sink(SinkArgs),
    /// The JobDB inventory in Consul: add spare JobDBs, list them.
    #[command(subcommand)]
    Jobdbs(JobdbsCommand),
    /// API tokens: make a new one.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Run the JobDB manager (one active, others stand by): keep spares, retire old JobDBs,
    /// drop drained ones.
    Manager(ManagerArgs),
    /// Run a drainer: move retrying jobs out of retired JobDBs, archive expired ones to S3.
    Drainer(DrainerArgs),
    /// Run a router: the front door that drops duplicate submissions (by idempotency key,
    /// across the cluster, within the dedup window) and forwards the rest to the Directors of
    /// each bucket's shuffle shard.
    Router(Box<RouterArgs>),
    /// Serve a web page on localhost, and the JSON API behind it, over every live JobDB:
    /// throughput by state, endpoints (backlog, success rate, latency), attempts per success,
    /// the JobDB inventory, and job traces by id or idempotency key.
    Dashboard(DashboardArgs),
    /// The dedup store's placements in Consul: show them, or propose a new set of Redis stores
    /// (taking effect at a future epoch, so no duplicate slips through the change).
    #[command(subcommand)]
    Placements(PlacementsCommand),
    /// Endpoint and bucket controls, applied by every Director within seconds (stored in
    /// Consul): pause and resume an endpoint or a bucket, cap an endpoint's concurrency and
    /// request rate, list what is in force.
    #[command(subcommand)]
    Endpoints(EndpointsCommand),
    /// Jobs, over the RPC API of a Director or a router (which asks every Director).
    #[command(subcommand)]
    Jobs(jobs::JobsCommand),
    /// Submit jobs to a Director or a router: one from options (--bucket, --endpoint,
    /// --payload, -H, ...), or many as NDJSON from --file or stdin, one job object per line as
    /// `POST /v1/jobs` takes it (all lines are checked before anything is sent). Prints each
    /// job's id and status as NDJSON.
    Submit(Box<crate::cli::submit::SubmitArgs>),
    /// Re-submit jobs that ended discarded or archived, from a JobDB or from the S3 archive,
    /// as new jobs linked to the originals (idempotency key `replay-of:<id>`, header
    /// `spindle-replay-of`), selected by bucket, endpoint and creation time.
    Replay(Box<ReplayArgs>),
    /// Subscriptions (stored in the control database): who gets which events of a bucket.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCommand),
    /// Publish an event to every matching subscription of its bucket (all of its jobs are
    /// committed together), or a file of events (`--ndjson`, in batches); prints each event's
    /// id and each subscription's job.
    Publish(Box<PublishArgs>),
    /// The conservation ledger of every JobDB: accepted = succeeded + discarded + archived +
    /// moved + open, from its rows in one snapshot, with every difference named by job, and
    /// attempts that overlap or overran, and open jobs no owner holds. Once (exit 1 when
    /// anything is off), or `--every-secs N` serving the figures as Prometheus metrics.
    Audit(Box<audit::AuditArgs>),
    /// Erase a bucket's payloads, headers and answer bodies (or only the jobs whose
    /// idempotency key starts with a prefix) from every JobDB and the archive, keeping that
    /// each job existed and how it ended; jobs still in flight are discarded first (reason
    /// `erased`). Prints and stores a receipt; exits 1 when anything was not reached (a run
    /// again finishes it).
    Erase(Box<erase::EraseArgs>),
    /// Print the OpenAPI document of the RPC API, as `GET /openapi.json` serves it: the
    /// router's (what producers call; the SDKs in `sdks/` are generated from it), or with
    /// `--director` the Director's.
    Openapi {
        /// The Director's document (adds import, endpoints and one JobDB's view of an event).
        #[arg(long)]
        director: bool,
    },
}

/// Where the archive is: an S3 bucket, or a local directory (`--archive-dir`). S3 credentials
/// come from the standard AWS chain (environment,
/// profile, instance role) unless given here.
#[derive(Debug, Clone, Args)]
pub struct S3Args {
    /// Bucket of the archive; without it (or `--archive-dir`) expired jobs stay `archiving`
    /// (for a drainer).
    #[arg(long, env = "SPINDLE_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// S3-compatible endpoint URL (default: AWS).
    #[arg(long, env = "SPINDLE_S3_ENDPOINT", hide_env_values = true)]
    pub s3_endpoint: Option<String>,
    /// Region.
    #[arg(long, env = "SPINDLE_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,
    /// Key prefix of every archive object.
    #[arg(long, env = "SPINDLE_S3_PREFIX", default_value = "spindle/")]
    pub s3_prefix: String,
    /// Path-style addressing (most S3-compatible servers need it).
    #[arg(long, env = "SPINDLE_S3_PATH_STYLE")]
    pub s3_path_style: bool,
    /// Access key id (default: the AWS credential chain).
    #[arg(long, env = "SPINDLE_S3_ACCESS_KEY_ID")]
    pub s3_access_key_id: Option<String>,
    /// Secret access key (default: the AWS credential chain).
    #[arg(long, env = "SPINDLE_S3_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<Secret>,
    /// Create the bucket when it is missing.
    #[arg(long, env = "SPINDLE_S3_CREATE_BUCKET")]
    pub s3_create_bucket: bool,
    /// Deadline of one S3 operation, in ms.
    #[arg(long, env = "SPINDLE_S3_TIMEOUT_MS", default_value_t = 10_000)]
    pub s3_timeout_ms: u64,
    /// Keep the archive in this local directory instead of S3, with the same object layout:
    /// `DIR/<bucket>/<key>`, the bucket being `--s3-bucket` or `spindle-archive` (created if
    /// missing, except by `replay`). `--s3-prefix` and `--s3-timeout-ms` apply; for one
    /// machine (`spindle dev`).
    #[arg(
        long,
        env = "SPINDLE_ARCHIVE_DIR",
        conflicts_with_all = ["s3_endpoint", "s3_path_style", "s3_access_key_id", "s3_secret_access_key"]
    )]
    pub archive_dir: Option<std::path::PathBuf>,
}

impl S3Args {
    /// The archive configuration: a directory with `--archive-dir`, else S3 if a bucket is
    /// given, else none.
    pub fn to_config(&self) -> Option<crate::archive::ArchiveConfig> {
        if let Some(root) = &self.archive_dir {
            let mut config = crate::archive::DirConfig::new(root);
            if let Some(bucket) = &self.s3_bucket {
                config.bucket = bucket.clone();
            }
            config.prefix = self.s3_prefix.clone();
            config.timeout = Duration::from_millis(self.s3_timeout_ms);
            return Some(config.into());
        }
        let bucket = self.s3_bucket.clone()?;
        let mut config = crate::archive::S3Config::new(bucket);
        config.endpoint = self.s3_endpoint.clone();
        config.region = self.s3_region.clone();
        config.prefix = self.s3_prefix.clone();
        config.path_style = self.s3_path_style;
        config.access_key_id = self.s3_access_key_id.clone();
        config.secret_access_key = self
            .s3_secret_access_key
            .as_ref()
            .map(|s| s.expose().to_owned());
        config.create_bucket = self.s3_create_bucket;
        config.timeout = Duration::from_millis(self.s3_timeout_ms);
        Some(config.into())
    }
}

/// Where the Consul agent is.
#[derive(Debug, Clone, Args)]
pub struct ConsulArgs {
    /// Consul agent address.
    #[arg(
        long,
        env = "CONSUL_HTTP_ADDR",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8500"
    )]
    pub consul_addr: String,
    /// Consul ACL token.
    #[arg(long, env = "CONSUL_HTTP_TOKEN", hide_env_values = true)]
    pub consul_token: Option<Secret>,
    /// Password of the JobDBs the inventory names. The inventory in Consul never holds
    /// passwords: `spindle jobdbs add` and the manager store URLs without one, and every
    /// process that reads them connects with this one (a URL that has a password keeps it).
    #[arg(long, env = "SPINDLE_JOBDB_PASSWORD", hide_env_values = true)]
    pub jobdb_password: Option<Secret>,
}

impl ConsulArgs {
    fn client(&self) -> anyhow::Result<crate::registry::consul::ConsulClient> {
        Ok(crate::registry::consul::ConsulClient::new(
            &self.consul_addr,
            self.consul_token.clone(),
        )?
        .with_jobdb_password(self.jobdb_password.clone()))
    }
}

/// Runs until SIGINT or SIGTERM: the token those signals cancel.
fn until_signal() -> tokio_util::sync::CancellationToken {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stopper = shutdown.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        stopper.cancel();
    });
    shutdown
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log).context("--log")?)
        .with_writer(std::io::stderr)
        .init();
    let service = match &cli.command {
        Command::Director(_) => "spindle-director",
        Command::Router(_) => "spindle-router",
        Command::Drainer(_) => "spindle-drainer",
        Command::Manager(_) => "spindle-manager",
        _ => "spindle",
    };
    let telemetry = crate::telemetry::install(service).context("traces (OTEL_* variables)")?;
    let result = execute(cli.command, until_signal()).await;
    telemetry.shutdown().await;
    result
}

/// Runs one command until it ends or `stop` is cancelled (SIGINT/SIGTERM for the binary;
/// `spindle dev` runs several in one process with one token).
pub async fn execute(
    command: Command,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    match command {
        command @ (Command::Manager(_)
        | Command::Drainer(_)
        | Command::Router(_)
        | Command::Director(_)
        | Command::Dashboard(_)) => run_service(command, stop).await?,
        Command::Placements(command) => router::placements(command).await?,
        Command::Jobdbs(command) => ops::jobdbs(command).await?,
        Command::Tokens(command) => ops::tokens(command)?,
        Command::Endpoints(command) => ops::endpoints(command).await?,
        Command::Replay(args) => ops::replay(*args).await?,
        Command::Jobs(command) => jobs::jobs(command).await?,
        Command::Submit(args) => crate::cli::submit::run(*args).await?,
        Command::Demo(args) => crate::cli::demo::run(args).await?,
        Command::Dev(args) => crate::cli::dev::run(*args, stop).await?,
        Command::Bench(args) => crate::cli::bench::run(args).await?,
        Command::Sink(args) => ops::sink(args).await?,
        Command::Subscriptions(command) => subscriptions::run(command).await?,
        Command::Publish(args) => subscriptions::publish(*args).await?,
        Command::Audit(args) => audit::run(&args, stop).await?,
        Command::Erase(args) => erase::run(&args).await?,
        Command::Openapi { director } => {
            let doc = match director {
                true => crate::rpc::openapi::director_document()?,
                false => crate::rpc::openapi::router_document_pretty()?,
            };
            println!("{doc}");
        }
    }
    Ok(())
}

/// Runs one of the long-running parts (manager, drainer, router, Director, dashboard) until
/// it ends or `stop` is cancelled; any other command is refused. `spindle dev` runs its parts
/// through this.
pub async fn run_service(
    command: Command,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    match command {
        Command::Manager(args) => lifecycle::run_manager(args, stop).await?,
        Command::Drainer(args) => lifecycle::run_drainer(args, stop).await?,
        Command::Router(args) => router::run(&args, stop).await?,
        Command::Director(args) => director::run(*args, stop).await?,
        Command::Dashboard(args) => dashboard::run(&args, stop).await?,
        _ => anyhow::bail!("not a long-running part of spindle"),
    }
    Ok(())
}
