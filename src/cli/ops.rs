//! Operator tooling on the command line: `spindle jobs show` (a job's trace), `spindle
//! endpoints` (controls in Consul, endpoint health), `spindle replay`, `spindle jobdbs` (the
//! inventory), `spindle tokens` and `spindle sink` (the recording test endpoint). `submit`,
//! `bench`, `demo` and `dev` have modules of their own (`crate::cli::submit`, ...); `execute` in
//! the parent module dispatches to them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{ConsulArgs, S3Args};
use crate::secret::{Secret, SecretUrl};

/// Where `spindle replay` and `spindle subscriptions backfill` read past jobs: JobDBs, the
/// archive, or both, read one after another.
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// Read from this JobDB (`mysql://user[:password]@host:port/name`); repeat it to read
    /// several.
    #[arg(long)]
    pub from_jobdb: Vec<SecretUrl>,
    /// Read from the archive (the `--s3-*` options, or `--archive-dir`), every JobDB's
    /// batches or those of `--archive-jobdb`, after any `--from-jobdb`.
    #[arg(long)]
    pub from_archive: bool,
    /// With `--from-archive`: only this JobDB's batches.
    #[arg(long, requires = "from_archive")]
    pub archive_jobdb: Option<String>,
    /// The archive.
    #[command(flatten)]
    pub s3: S3Args,
}

impl SourceArgs {
    /// Opens each JobDB (a reader), then the archive, in that order.
    pub async fn open(&self) -> anyhow::Result<Vec<crate::cli::replay::ReplaySource>> {
        use crate::cli::replay::ReplaySource;
        if self.from_jobdb.is_empty() && !self.from_archive {
            anyhow::bail!("give --from-jobdb URL (one or more) or --from-archive, or both");
        }
        let mut sources = Vec::new();
        for url in &self.from_jobdb {
            let url: crate::jobdb::JobDbUrl = url.expose().parse().context("--from-jobdb")?;
            let db = crate::jobdb::JobDb::open_reader(&url, 2).await?;
            sources.push(ReplaySource::JobDb(Box::new(db)));
        }
        if self.from_archive {
            let mut config = self.s3.to_config().context(
                "--from-archive needs --s3-bucket (and the other --s3-* options) or --archive-dir",
            )?;
            // A reader: a mistyped directory is an error, not a new empty archive.
            if let crate::archive::ArchiveConfig::Dir(dir) = &mut config {
                dir.create_bucket = false;
            }
            sources.push(ReplaySource::Archive {
                archive: crate::archive::Archive::open(&config).await?,
                jobdb: self.archive_jobdb.clone(),
            });
        }
        Ok(sources)
    }
}

/// Options of `spindle replay`.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// Where the ended jobs are read.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Only jobs of this bucket.
    #[arg(long)]
    pub bucket: Option<String>,
    /// Only jobs whose endpoint starts with this.
    #[arg(long)]
    pub endpoint_prefix: Option<String>,
    /// Only jobs created at or after this time (RFC 3339, e.g. 2026-11-21T10:00:00Z).
    #[arg(long)]
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only jobs created before this time (RFC 3339).
    #[arg(long)]
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    /// Which endings to replay: discarded, archived (repeatable or comma-separated).
    #[arg(long = "state", value_delimiter = ',', default_value = "discarded")]
    pub states: Vec<String>,
    /// The RPC API that takes the new jobs: a Director, or a router (which also drops a replay
    /// of a job already replayed within its dedup window).
    #[arg(
        long,
        env = "SPINDLE_API",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080"
    )]
    pub to: String,
    /// An API token for `--to`.
    #[arg(long, env = "SPINDLE_TOKEN", hide_env_values = true)]
    pub token: Option<Secret>,
    /// Lifetime of the new jobs, in ms (default: the Director's).
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// Replay at most this many jobs.
    #[arg(long, default_value_t = 100_000)]
    pub limit: usize,
    /// Count what would be replayed; submit nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// What an endpoint control names: one endpoint, or one bucket.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct ControlTarget {
    /// The endpoint URL (query and fragment are ignored: Directors queue by the rest).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// The bucket.
    #[arg(long)]
    pub bucket: Option<String>,
}

/// What `spindle endpoints pause|resume` act on.
#[derive(Debug, Clone, Args)]
pub struct PauseArgs {
    /// The agent.
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// The endpoint or the bucket.
    #[command(flatten)]
    pub target: ControlTarget,
    /// Who does it (recorded with the control).
    #[arg(long, env = "USER", default_value = "operator")]
    pub by: String,
}

/// `spindle endpoints` subcommands.
#[derive(Debug, Subcommand)]
pub enum EndpointsCommand {
    /// Print the controls in force: paused endpoints and buckets, concurrency and rate caps.
    List {
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
    },
    /// Print each endpoint's health as Directors see it: jobs queued, requests in flight,
    /// circuit breaker (and its recent failures), pause and caps.
    Health {
        /// A Director's RPC API (repeatable: one table per Director).
        #[arg(
            long = "api",
            env = "SPINDLE_API",
            hide_env_values = true,
            value_delimiter = ',',
            default_value = "http://127.0.0.1:8080"
        )]
        apis: Vec<String>,
        /// An admin API token.
        #[arg(long, env = "SPINDLE_TOKEN", hide_env_values = true)]
        token: Option<Secret>,
    },
    /// Stop new attempts to an endpoint, or for a bucket's jobs, on every Director; jobs wait
    /// (and still expire) until resumed. Attempts in flight finish.
    Pause(PauseArgs),
    /// Let a paused endpoint or bucket go on (an endpoint keeps any caps set with `limit`).
    Resume(PauseArgs),
    /// Park an endpoint on every Director: its jobs wait (and still expire), one probe goes
    /// now and then, and the first success unparks it. Directors park an endpoint themselves
    /// when it fails for `--park-after-secs`.
    Park {
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
        /// The endpoint URL.
        #[arg(long)]
        endpoint: String,
        /// Why (told to the buckets' subscribers).
        #[arg(long, default_value = "parked by an operator")]
        reason: String,
        /// Who parks it.
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
    },
    /// Unpark an endpoint: its jobs go again at the re-drive's growing pace, on every
    /// Director.
    Unpark {
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
        /// The endpoint URL.
        #[arg(long)]
        endpoint: String,
        /// Requests per second, per Director, just after the unpark.
        #[arg(long, default_value_t = 10.0)]
        redrive_per_second: f64,
        /// How often the pace doubles, in seconds.
        #[arg(long, default_value_t = 30)]
        redrive_double_secs: u64,
        /// The pace at which pacing ends.
        #[arg(long, default_value_t = 10_000.0)]
        redrive_until_per_second: f64,
        /// Who unparks it.
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
    },
    /// Set how long an endpoint with a bucket's jobs may fail before it is parked, instead of
    /// the Directors' `--park-after-secs`: a number of seconds, `never`, or `default`.
    ParkAfter {
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
        /// The bucket.
        #[arg(long)]
        bucket: String,
        /// Seconds, `never` or `default`.
        #[arg(long)]
        after: String,
        /// Who sets it.
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
    },
    /// Cap an endpoint's requests in flight and started per second, per Director (give
    /// neither to remove the caps).
    Limit {
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
        /// The endpoint URL.
        #[arg(long)]
        endpoint: String,
        /// Most requests in flight at once (below `--endpoint-concurrency`).
        #[arg(long)]
        concurrency: Option<u32>,
        /// Most requests started per second.
        #[arg(long)]
        per_second: Option<f64>,
        /// Who set the caps.
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
    },
}

/// `spindle tokens` subcommands.
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Print a new random token, and the entry to add to the `--tokens` file (which stores only
    /// its SHA-256). Give it buckets (a producer), buckets to manage, or `--admin`.
    New {
        /// A name for the token, shown in errors and logs instead of the token.
        #[arg(long)]
        name: String,
        /// A bucket the token may submit to, publish to and read (repeatable; `*` for all).
        #[arg(long = "bucket")]
        buckets: Vec<String>,
        /// A bucket whose subscriptions the token may manage: add, list, change, remove,
        /// back-fill (repeatable; `*` for all).
        #[arg(long = "manage-bucket")]
        manages: Vec<String>,
        /// Operator actions and every bucket.
        #[arg(long)]
        admin: bool,
    },
}

/// `spindle jobdbs` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobdbsCommand {
    /// Create and migrate a JobDB, and add it to the inventory as a spare.
    Add {
        /// The JobDB: `mysql://user[:password]@host[:port]/name` (name in `[a-z0-9_]`).
        #[arg(long)]
        jobdb: SecretUrl,
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
    },
    /// List the inventory: name, state, lock holder, URL.
    List {
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
    },
}

/// Options of `spindle sink`.
#[derive(Debug, Args)]
pub struct SinkArgs {
    /// Listen address.
    #[arg(long, env = "SPINDLE_SINK_LISTEN", default_value = "127.0.0.1:9090")]
    pub listen: SocketAddr,
}

/// `spindle jobdbs ...`: adds a spare JobDB to the inventory, or lists the inventory.
pub(super) async fn jobdbs(command: JobdbsCommand) -> anyhow::Result<()> {
    match command {
        JobdbsCommand::Add { jobdb, consul } => {
            let url: crate::jobdb::JobDbUrl = jobdb.expose().parse().context("--jobdb")?;
            let db = crate::jobdb::JobDb::open(&url, true, 2).await?;
            db.close().await;
            let record = crate::registry::inventory::JobDbRecord {
                name: url.database.clone(),
                url: jobdb.expose().to_owned(),
                state: crate::registry::inventory::JobDbState::Spare,
                changed_at: chrono::Utc::now(),
                changed_by: "spindle jobdbs add".to_owned(),
            };
            let inventory = crate::registry::inventory::Inventory::new(consul.client()?);
            anyhow::ensure!(
                inventory.add(&record).await?,
                "jobdb {} is already in the inventory",
                record.name
            );
            println!("added spare jobdb {}", record.name);
        }
        JobdbsCommand::List { consul } => {
            let inventory = crate::registry::inventory::Inventory::new(consul.client()?);
            println!(
                "{:<24} {:<9} {:<38} url",
                "name", "state", "lock holder (session)"
            );
            for listed in inventory.list().await? {
                println!(
                    "{:<24} {:<9} {:<38} {}",
                    listed.record.name,
                    format!("{:?}", listed.record.state).to_lowercase(),
                    listed.holder.as_deref().unwrap_or("-"),
                    crate::secret::redact_url(&listed.record.url)
                );
            }
        }
    }
    Ok(())
}

/// `spindle tokens ...`: prints a new token and its `--tokens` file entry.
pub(super) fn tokens(command: TokensCommand) -> anyhow::Result<()> {
    match command {
        TokensCommand::New {
            name,
            buckets,
            manages,
            admin,
        } => {
            anyhow::ensure!(
                admin || !buckets.is_empty() || !manages.is_empty(),
                "give --bucket or --manage-bucket (repeatable), or --admin"
            );
            let (token, entry) = crate::rpc::auth::new_token(&name, &buckets, &manages, admin);
            println!("token (give it to the caller; it is not stored): {token}");
            println!("entry for the --tokens file: {entry}");
        }
    }
    Ok(())
}

/// `spindle sink`: runs the recording test endpoint until SIGINT or SIGTERM.
pub(super) async fn sink(args: SinkArgs) -> anyhow::Result<()> {
    let sink = crate::cli::sink::Sink::start(args.listen).await?;
    println!("sink listening on http://{}", sink.addr());
    crate::shutdown_signal().await;
    sink.stop().await;
    Ok(())
}

/// `spindle endpoints ...`: reads and writes the controls in Consul.
pub(super) async fn endpoints(command: EndpointsCommand) -> anyhow::Result<()> {
    use crate::registry::controls;
    match command {
        EndpointsCommand::List { consul } => list_controls(&consul).await?,
        EndpointsCommand::Health { apis, token } => endpoint_health(apis, token).await?,
        EndpointsCommand::Park {
            consul,
            endpoint,
            reason,
            by,
        } => {
            let endpoint = crate::job::lane(&endpoint);
            let change = crate::registry::parks::Change::Park { reason };
            let done =
                crate::registry::parks::update(&consul.client()?, endpoint, &by, &change).await?;
            match done {
                Some(_) => println!("endpoint {endpoint} parked"),
                None => println!("endpoint {endpoint} was parked already"),
            }
        }
        EndpointsCommand::Unpark {
            consul,
            endpoint,
            redrive_per_second,
            redrive_double_secs,
            redrive_until_per_second,
            by,
        } => {
            let endpoint = crate::job::lane(&endpoint);
            anyhow::ensure!(
                redrive_per_second.is_finite() && redrive_per_second > 0.0,
                "--redrive-per-second must be a positive number"
            );
            anyhow::ensure!(
                redrive_until_per_second.is_finite()
                    && redrive_until_per_second >= redrive_per_second,
                "--redrive-until-per-second must be a number at least --redrive-per-second"
            );
            let redrive = crate::registry::parks::Redrive {
                start: redrive_per_second,
                double_every: Duration::from_secs(redrive_double_secs.clamp(1, 86_400)),
                until: redrive_until_per_second,
            };
            let change = crate::registry::parks::Change::Unpark { redrive };
            let done =
                crate::registry::parks::update(&consul.client()?, endpoint, &by, &change).await?;
            match done {
                Some(_) => println!("endpoint {endpoint} unparked: its jobs go again, paced"),
                None => println!("endpoint {endpoint} was not parked"),
            }
        }
        EndpointsCommand::ParkAfter {
            consul,
            bucket,
            after,
            by,
        } => {
            let secs = match after.as_str() {
                "never" => Some(0),
                "default" => None,
                n => Some(
                    n.parse::<u64>()
                        .ok()
                        .filter(|n| *n > 0 && *n <= 30 * 86_400)
                        .context("--after must be 1 to 2592000 seconds, never, or default")?,
                ),
            };
            controls::update_bucket(&consul.client()?, &bucket, &by, |c| {
                c.park_after_secs = secs
            })
            .await?;
            println!("bucket {bucket}: park after {after}");
        }
        EndpointsCommand::Pause(args) => set_paused(args, true).await?,
        EndpointsCommand::Resume(args) => set_paused(args, false).await?,
        EndpointsCommand::Limit {
            consul,
            endpoint,
            concurrency,
            per_second,
            by,
        } => {
            anyhow::ensure!(
                per_second.is_none_or(|r| r.is_finite() && r > 0.0),
                "--per-second must be a positive number"
            );
            anyhow::ensure!(
                concurrency != Some(0),
                "--concurrency must be at least 1 (use pause to stop)"
            );
            let endpoint = crate::job::lane(&endpoint);
            controls::update_endpoint(&consul.client()?, endpoint, &by, |c| {
                c.max_concurrency = concurrency;
                c.max_per_second = per_second;
            })
            .await?;
            println!("{endpoint}: concurrency {concurrency:?}, per second {per_second:?}");
        }
    }
    Ok(())
}

/// `spindle endpoints list`: the controls in Consul, endpoints, then buckets, then parks.
async fn list_controls(consul: &ConsulArgs) -> anyhow::Result<()> {
    use crate::registry::controls;
    let (controls, _) = controls::read(&consul.client()?, 0, Duration::from_secs(1)).await?;
    println!(
        "{:<8} {:<48} {:<7} {:>11} {:>10}  set by, at",
        "kind", "name", "state", "concurrency", "per second"
    );
    let mut endpoints: Vec<_> = controls.endpoints.values().collect();
    endpoints.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    for c in endpoints {
        println!(
            "{:<8} {:<48} {:<7} {:>11} {:>10}  {}, {}",
            "endpoint",
            c.endpoint,
            if c.paused { "paused" } else { "running" },
            c.max_concurrency.map_or("-".to_owned(), |n| n.to_string()),
            c.max_per_second.map_or("-".to_owned(), |r| r.to_string()),
            c.updated_by,
            c.updated_at.format("%Y-%m-%d %H:%M:%S UTC"),
        );
    }
    let mut buckets: Vec<_> = controls.buckets.values().collect();
    buckets.sort_by(|a, b| a.bucket.cmp(&b.bucket));
    for c in buckets {
        println!(
            "{:<8} {:<48} {:<7} {:>11} {:>10}  {}, {}{}",
            "bucket",
            c.bucket,
            if c.paused { "paused" } else { "running" },
            "-",
            "-",
            c.updated_by,
            c.updated_at.format("%Y-%m-%d %H:%M:%S UTC"),
            match c.park_after_secs {
                Some(0) => "; never parks".to_owned(),
                Some(secs) => format!("; parks after {secs} s"),
                None => String::new(),
            }
        );
    }
    let mut parks: Vec<_> = controls.parks.values().collect();
    parks.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    for p in parks {
        let (state, by, at) = match (&p.unparked_by, p.unparked_at) {
            (by, Some(at)) => ("unparked", by.clone().unwrap_or_default(), at),
            _ => ("parked", p.parked_by.clone(), p.parked_at),
        };
        println!(
            "{:<8} {:<48} {:<8} {:>10} {:>10}  {}, {}; {}",
            "park",
            p.endpoint,
            state,
            "-",
            "-",
            by,
            at.format("%Y-%m-%d %H:%M:%S UTC"),
            p.reason,
        );
    }
    Ok(())
}

/// `spindle endpoints health`: each Director's view of its endpoints.
async fn endpoint_health(apis: Vec<String>, token: Option<Secret>) -> anyhow::Result<()> {
    for api in apis {
        let token = token.as_ref().map(|t| t.expose());
        let body = super::jobs::api_get(&api, "/v1/endpoints", token).await?;
        let view: crate::rpc::api::EndpointsView =
            serde_json::from_str(&body).context("the api's answer")?;
        println!("{api}");
        println!(
            "  {:<56} {:>6} {:>9} {:<7} {:>15} {:>11}",
            "endpoint", "ready", "in flight", "breaker", "recent failures", "concurrency"
        );
        for e in view.endpoints {
            println!(
                "  {:<56} {:>6} {:>9} {:<7} {:>15} {:>11}{}",
                e.endpoint,
                e.ready,
                e.in_flight,
                e.breaker,
                format!("{}/{}", e.recent_failures, e.recent_attempts),
                e.concurrency,
                match (&e.parked_since, e.paused, e.redrive_per_second) {
                    (Some(since), _, _) =>
                        format!("  parked since {}", since.format("%Y-%m-%d %H:%M:%S UTC")),
                    (None, true, _) => "  paused".to_owned(),
                    (None, false, Some(pace)) => format!(
                        "  re-drive at {pace}/s, {:.0} s to go",
                        e.redrive_eta_secs.unwrap_or(0.0)
                    ),
                    _ => String::new(),
                }
            );
        }
    }
    Ok(())
}

/// `spindle replay`: selects the ended jobs and submits them as new ones.
pub(super) async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    use crate::cli::replay::ReplayOptions;
    let (discarded, archived) =
        crate::cli::replay::states(&args.states).map_err(anyhow::Error::msg)?;
    let sources = args.source.open().await?;
    let options = ReplayOptions {
        filter: crate::jobdb::replay::EndedFilter {
            bucket: args.bucket,
            endpoint_prefix: args.endpoint_prefix,
            since: args.since,
            until: args.until,
            discarded,
            archived,
        },
        to: args.to,
        token: args.token.map(|t| t.expose().to_owned()),
        ttl_ms: args.ttl_ms,
        dry_run: args.dry_run,
        limit: args.limit,
    };
    let mut report = crate::cli::replay::ReplayReport::default();
    for source in &sources {
        let Some(limit) = options
            .limit
            .checked_sub(report.selected)
            .filter(|n| *n > 0)
        else {
            break;
        };
        let options = ReplayOptions {
            limit,
            ..options.clone()
        };
        let read = crate::cli::replay::replay(source, &options).await?;
        report.selected += read.selected;
        report.submitted += read.submitted;
        report.links.extend(read.links);
    }
    for (original, new) in &report.links {
        println!("{original} -> {new}");
    }
    println!(
        "selected {}, submitted {}{}",
        report.selected,
        report.submitted,
        if options.dry_run { " (dry run)" } else { "" }
    );
    Ok(())
}

/// Pauses or resumes an endpoint (keeping its caps) or a bucket.
async fn set_paused(args: PauseArgs, paused: bool) -> anyhow::Result<()> {
    use crate::registry::controls;
    let PauseArgs { consul, target, by } = args;
    let client = consul.client()?;
    let verb = if paused { "paused" } else { "resumed" };
    match (target.endpoint, target.bucket) {
        (Some(endpoint), _) => {
            let endpoint = crate::job::lane(&endpoint);
            controls::update_endpoint(&client, endpoint, &by, |c| c.paused = paused).await?;
            println!("endpoint {endpoint} {verb}");
        }
        (None, Some(bucket)) => {
            controls::update_bucket(&client, &bucket, &by, |c| c.paused = paused).await?;
            println!("bucket {bucket} {verb}");
        }
        (None, None) => anyhow::bail!("give --endpoint or --bucket"),
    }
    Ok(())
}
