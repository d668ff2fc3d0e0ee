//! The `spindle` command line. Every option also reads a `SPINDLE_*` environment variable;
//! defaults are the documented ones (README, "Configuration").

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

use crate::director::{self, DirectorConfig};
use crate::secret::{Secret, SecretUrl};

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
    Demo(crate::demo::DemoArgs),
    /// Run everything in one process on embedded parts (SQLite JobDBs, a directory archive,
    /// in-process registry and dedup), data under one directory: nothing to install.
    /// `--demo` adds a local endpoint and a producer to watch on the dashboard.
    Dev(Box<crate::dev::DevArgs>),
    /// Measure intake and end-to-end delivery throughput against a local endpoint.
    Bench(crate::bench::BenchArgs),
    /// Run the recording test endpoint alone (see `spindle::sink` for its paths).
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
    Jobs(JobsCommand),
    /// Submit jobs to a Director or a router: one from options (--bucket, --endpoint,
    /// --payload, -H, ...), or many as NDJSON from --file or stdin, one job object per line as
    /// `POST /v1/jobs` takes it (all lines are checked before anything is sent). Prints each
    /// job's id and status as NDJSON.
    Submit(Box<crate::submit::SubmitArgs>),
    /// Re-submit jobs that ended discarded or archived, from a JobDB or from the S3 archive,
    /// as new jobs linked to the originals (idempotency key `replay-of:<id>`, header
    /// `spindle-replay-of`), selected by bucket, endpoint and creation time.
    Replay(Box<ReplayArgs>),
}

/// Options of `spindle replay`.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// Read ended jobs from this JobDB (mysql://user[:password]@host:port/name).
    #[arg(long, conflicts_with = "from_archive")]
    pub from_jobdb: Option<SecretUrl>,
    /// Read ended jobs from the archive (the `--s3-*` options, or `--archive-dir`), every
    /// JobDB's batches or those of `--archive-jobdb`.
    #[arg(long)]
    pub from_archive: bool,
    /// With `--from-archive`: only this JobDB's batches.
    #[arg(long, requires = "from_archive")]
    pub archive_jobdb: Option<String>,
    /// The archive.
    #[command(flatten)]
    pub s3: S3Args,
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
    #[arg(long, env = "SPINDLE_API", default_value = "http://127.0.0.1:8080")]
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

/// `spindle jobs` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Print a job and its full trace: every state it entered, when, after how many attempts,
    /// and why (status, error type, the start of the failed answer, operator commands).
    Show {
        /// The job id: a ULID, or 32 hex digits as SQL's `HEX(id)` prints it.
        id: String,
        /// The RPC API of a Director or a router.
        #[arg(long, env = "SPINDLE_API", default_value = "http://127.0.0.1:8080")]
        api: String,
        /// An API token (read scope for the job's bucket, or admin).
        #[arg(long, env = "SPINDLE_TOKEN", hide_env_values = true)]
        token: Option<Secret>,
        /// Print the API's JSON answer as it is.
        #[arg(long)]
        json: bool,
    },
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

/// Options of `spindle router`.
#[derive(Debug, Clone, Args)]
pub struct RouterArgs {
    /// RPC listen address.
    #[arg(long, env = "SPINDLE_ROUTER_LISTEN", default_value = "127.0.0.1:8070")]
    pub listen: SocketAddr,
    /// The agent (catalog of Directors, placements).
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// A Redis dedup store as `id=redis://host:port[/db]` (repeatable; comma-separated in the
    /// environment). Every store a placement names must be given, old ones included.
    /// `id=memory:` keeps the store in this process instead (same semantics; lost on restart,
    /// invisible to other routers: for a single router, as `spindle dev` runs it).
    #[arg(
        long = "redis",
        env = "SPINDLE_ROUTER_REDIS",
        value_delimiter = ',',
        required = true
    )]
    pub redis: Vec<String>,
    /// The dedup settings shared by every router.
    #[command(flatten)]
    pub dedup: DedupArgs,
    /// Directors per bucket (its shuffle shard; 0: every Director).
    #[arg(long, env = "SPINDLE_ROUTER_SHARD_SIZE", default_value_t = crate::router::shuffle::DEFAULT_SHARD_SIZE)]
    pub shard_size: usize,
    /// A bucket's own shard size as `bucket=size` (repeatable).
    #[arg(
        long = "shard-size-override",
        env = "SPINDLE_ROUTER_SHARD_SIZE_OVERRIDES",
        value_delimiter = ','
    )]
    pub shard_size_overrides: Vec<String>,
    /// API tokens of producers (as for a Director). Without it the router accepts every caller.
    #[arg(long, env = "SPINDLE_TOKENS_FILE")]
    pub tokens: Option<std::path::PathBuf>,
    /// Admin token presented to the Directors' import RPC, when they require tokens.
    #[arg(long, env = "SPINDLE_DIRECTOR_TOKEN", hide_env_values = true)]
    pub director_token: Option<Secret>,
    /// Largest request body, in bytes.
    #[arg(long, env = "SPINDLE_MAX_REQUEST_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_request_bytes: usize,
    /// Largest payload of one job, in bytes.
    #[arg(long, env = "SPINDLE_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024)]
    pub max_payload_bytes: usize,
    /// Time to live of jobs that give neither `expire_at` nor `ttl_ms`, in ms.
    #[arg(long, env = "SPINDLE_DEFAULT_TTL_MS", default_value_t = 4 * 3600 * 1000)]
    pub default_ttl_ms: u64,
    /// How often the catalog of Directors is re-read, in ms.
    #[arg(long, env = "SPINDLE_ROUTER_CATALOG_MS", default_value_t = 500)]
    pub catalog_ms: u64,
    /// How long a Director that failed a forward is skipped, in ms.
    #[arg(long, env = "SPINDLE_ROUTER_SUSPECT_MS", default_value_t = 3_000)]
    pub suspect_ms: u64,
    /// How long a request waits for another submission's unconfirmed claim of the same key
    /// before answering `pending`, in ms (less than `--dedup-max-skew-ms`).
    #[arg(long, env = "SPINDLE_ROUTER_PENDING_WAIT_MS", default_value_t = 5_000)]
    pub pending_wait_ms: u64,
    /// Deadline of one forward to a Director, in ms.
    #[arg(
        long,
        env = "SPINDLE_ROUTER_FORWARD_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub forward_timeout_ms: u64,
    /// How long a forward whose outcome is unknown is re-sent to its JobDB, in ms.
    #[arg(long, env = "SPINDLE_ROUTER_RESOLVE_MS", default_value_t = 30_000)]
    pub resolve_ms: u64,
}

/// Dedup settings. Every router of a deployment must use the same values (they decide where
/// entries live), and `spindle placements` the same `--placement-prefix`.
#[derive(Debug, Clone, Args)]
pub struct DedupArgs {
    /// Dedup window, in seconds: a key is accepted once within it.
    #[arg(long, env = "SPINDLE_DEDUP_WINDOW_S", default_value_t = 24 * 3600)]
    pub dedup_window_s: u64,
    /// Time slots per window (more: entries expire closer to the window, claims read more).
    #[arg(long, env = "SPINDLE_DEDUP_SLOTS", default_value_t = 2)]
    pub dedup_slots: u32,
    /// Hashes per slot as a power of two (size it to keys per slot / 60).
    #[arg(long, env = "SPINDLE_DEDUP_HASH_BITS", default_value_t = 16)]
    pub dedup_hash_bits: u8,
    /// How long an unconfirmed claim holds its key, in ms: longer than a forward takes,
    /// including a Director failover.
    #[arg(long, env = "SPINDLE_DEDUP_PENDING_TTL_MS", default_value_t = 60_000)]
    pub dedup_pending_ttl_ms: u64,
    /// Largest clock difference between routers, Redis and Directors, in ms.
    #[arg(long, env = "SPINDLE_DEDUP_MAX_SKEW_MS", default_value_t = 10_000)]
    pub dedup_max_skew_ms: u64,
    /// Prefix of every Redis key.
    #[arg(long, env = "SPINDLE_DEDUP_KEY_PREFIX", default_value = "sd:")]
    pub dedup_key_prefix: String,
    /// Consul KV prefix of the placements.
    #[arg(long, env = "SPINDLE_PLACEMENT_PREFIX", default_value = crate::router::placement::DEFAULT_PREFIX)]
    pub placement_prefix: String,
    /// Length of a placement epoch, in seconds (used when the first layout is created).
    #[arg(long, env = "SPINDLE_PLACEMENT_PERIOD_S", default_value_t = 3600)]
    pub placement_period_s: u64,
    /// How far ahead a proposed layout takes effect, at least, in ms (≥ 2 × max skew).
    #[arg(long, env = "SPINDLE_PLACEMENT_LEAD_MS", default_value_t = 600_000)]
    pub placement_lead_ms: u64,
    /// Logical shards (used when the first layout is created).
    #[arg(long, env = "SPINDLE_LOGICAL_SHARDS", default_value_t = crate::router::placement::DEFAULT_LOGICAL_SHARDS)]
    pub logical_shards: u32,
}

impl DedupArgs {
    /// The dedup configuration.
    pub fn config(&self) -> crate::router::dedup::DedupConfig {
        crate::router::dedup::DedupConfig {
            window: Duration::from_secs(self.dedup_window_s),
            slots_per_window: self.dedup_slots,
            hash_bits: self.dedup_hash_bits,
            pending_ttl: Duration::from_millis(self.dedup_pending_ttl_ms),
            max_skew: Duration::from_millis(self.dedup_max_skew_ms),
            key_prefix: self.dedup_key_prefix.clone(),
            ..crate::router::dedup::DedupConfig::default()
        }
    }

    /// The placement settings.
    pub fn placement(&self) -> crate::router::placement::PlacementSettings {
        crate::router::placement::PlacementSettings {
            prefix: self.placement_prefix.clone(),
            period: Duration::from_secs(self.placement_period_s),
            lead: Duration::from_millis(self.placement_lead_ms),
            ..crate::router::placement::PlacementSettings::default()
        }
    }
}

/// `spindle placements` subcommands.
#[derive(Debug, Subcommand)]
pub enum PlacementsCommand {
    /// Print the layout record: current and previous layouts, period, logical shards.
    Show {
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
        /// The dedup settings (only the placement ones matter here).
        #[command(flatten)]
        dedup: DedupArgs,
    },
    /// Propose the Redis stores of the next layout (a store left out is drained by time:
    /// placements issued before the change keep naming it until the window passes).
    Propose {
        /// The agent.
        #[command(flatten)]
        consul: ConsulArgs,
        /// The dedup settings (only the placement ones matter here).
        #[command(flatten)]
        dedup: DedupArgs,
        /// A store id of the new layout (repeatable).
        #[arg(long = "store", required = true)]
        stores: Vec<String>,
        /// A store id kept out of new placements (repeatable).
        #[arg(long = "exclude")]
        excluded: Vec<String>,
    },
}

impl RouterArgs {
    /// Connects the dedup store (bootstrapping the first layout from `--redis` if there is none)
    /// and returns what [`crate::router::service::Router::start`] needs.
    pub async fn connect(
        &self,
    ) -> anyhow::Result<(
        crate::router::service::RouterSettings,
        crate::router::dedup::DedupStore,
        std::sync::Arc<crate::router::directors::Directors>,
        crate::registry::consul::ConsulClient,
    )> {
        use crate::router::{dedup, directors, placement, service, shuffle};
        let consul = self.consul.client()?;
        let mut stores = Vec::new();
        for entry in &self.redis {
            let (id, url) = entry.split_once('=').with_context(|| {
                format!("--redis {entry:?}: expected id=redis://host:port or id=memory:")
            })?;
            anyhow::ensure!(
                placement::valid_store_id(id),
                "--redis {entry:?}: store id must be 1 to 64 of [A-Za-z0-9_.-]"
            );
            stores.push(dedup::StoreSpec {
                id: id.to_owned(),
                url: url.to_owned(),
            });
        }
        let mut overrides = std::collections::HashMap::new();
        for entry in &self.shard_size_overrides {
            let (bucket, size) = entry.rsplit_once('=').with_context(|| {
                format!("--shard-size-override {entry:?}: expected bucket=size")
            })?;
            let size: usize = size
                .parse()
                .with_context(|| format!("--shard-size-override {entry:?}: size"))?;
            overrides.insert(bucket.to_owned(), size);
        }
        anyhow::ensure!(
            self.pending_wait_ms < self.dedup.dedup_max_skew_ms,
            "--pending-wait-ms must be less than --dedup-max-skew-ms (re-claims keep the key's time)"
        );
        anyhow::ensure!(
            self.dedup.dedup_pending_ttl_ms > self.dedup.dedup_max_skew_ms,
            "--dedup-pending-ttl-ms must exceed --dedup-max-skew-ms"
        );
        let placements = std::sync::Arc::new(placement::PlacementManager::consul(
            consul.clone(),
            self.dedup.placement(),
        ));
        let ids: Vec<String> = stores.iter().map(|s| s.id.clone()).collect();
        let layout = placements
            .bootstrap(ids.clone(), self.dedup.logical_shards)
            .await
            .context("reading or creating the dedup layout")?;
        if layout.current.stores != ids {
            tracing::warn!(
                configured = ?ids, layout = ?layout.current.stores,
                "--redis differs from the layout in Consul; the layout rules (see `spindle placements`)"
            );
        }
        let store = dedup::DedupStore::connect(self.dedup.config(), stores, placements)
            .await
            .context("connecting to the dedup stores")?;
        let mut settings = service::RouterSettings::new(self.listen);
        settings.intake.max_request_bytes = self.max_request_bytes;
        settings.intake.max_payload_bytes = self.max_payload_bytes;
        settings.intake.default_ttl = Duration::from_millis(self.default_ttl_ms);
        if let Some(path) = &self.tokens {
            settings.auth = Some(std::sync::Arc::new(crate::rpc::auth::TokenStore::load(
                path,
            )?));
        }
        settings.director_token = self.director_token.clone();
        settings.catalog_every = Duration::from_millis(self.catalog_ms);
        settings.suspect_for = Duration::from_millis(self.suspect_ms);
        settings.pending_wait = Duration::from_millis(self.pending_wait_ms);
        settings.forward_timeout = Duration::from_millis(self.forward_timeout_ms);
        settings.resolve_for = Duration::from_millis(self.resolve_ms);
        let directors = std::sync::Arc::new(directors::Directors::new(
            shuffle::ShardSizes {
                default: self.shard_size,
                overrides,
            },
            settings.suspect_for,
        ));
        Ok((settings, store, directors, consul))
    }
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
    #[arg(long, env = "SPINDLE_S3_ENDPOINT")]
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

/// Options of `spindle manager`.
#[derive(Debug, Clone, Args)]
pub struct ManagerArgs {
    /// The agent.
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// A server that hosts JobDBs: a MySQL server, `mysql://user[:password]@host[:port]`, or a
    /// directory of SQLite JobDB files, `sqlite:///dir` (repeatable; comma-separated in the
    /// environment).
    #[arg(
        long = "mysql",
        visible_alias = "server",
        env = "SPINDLE_MANAGER_MYSQL",
        value_delimiter = ',',
        required = true
    )]
    pub mysql: Vec<SecretUrl>,
    /// Name prefix of the JobDBs it creates.
    #[arg(long, env = "SPINDLE_MANAGER_PREFIX", default_value = "spindle")]
    pub prefix: String,
    /// Spare JobDBs kept ready.
    #[arg(long, env = "SPINDLE_MANAGER_SPARES", default_value_t = 2)]
    pub spares: usize,
    /// Retire an active JobDB this long after it became active, in seconds.
    #[arg(long, env = "SPINDLE_MANAGER_MAX_AGE_S", default_value_t = 1800)]
    pub max_age_s: u64,
    /// Retire an active JobDB whose tables pass this many MiB (its share of the server's
    /// buffer pool).
    #[arg(long, env = "SPINDLE_MANAGER_MAX_MIB", default_value_t = 4096)]
    pub max_mib: u64,
    /// Pause between two rounds, in ms.
    #[arg(long, env = "SPINDLE_MANAGER_INTERVAL_MS", default_value_t = 2_000)]
    pub interval_ms: u64,
    /// Manager lock session TTL in ms (Consul's minimum is 10 s).
    #[arg(long, env = "SPINDLE_LOCK_TTL_MS", default_value_t = 10_000)]
    pub lock_ttl_ms: u64,
    /// Lock-delay in ms after a holder's session ends.
    #[arg(long, env = "SPINDLE_LOCK_DELAY_MS", default_value_t = 5_000)]
    pub lock_delay_ms: u64,
    /// This manager's identity (default: host name and pid).
    #[arg(long, env = "SPINDLE_MANAGER_ID")]
    pub manager_id: Option<String>,
    /// Serve `/metrics` and `/healthz` here (default: no metrics server).
    #[arg(long, env = "SPINDLE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
}

/// Options of `spindle drainer`.
#[derive(Debug, Clone, Args)]
pub struct DrainerArgs {
    /// The agent.
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// The archive (a bucket is required).
    #[command(flatten)]
    pub s3: S3Args,
    /// Admin token for the Directors' import RPC, when they require tokens.
    #[arg(long, env = "SPINDLE_IMPORT_TOKEN", hide_env_values = true)]
    pub import_token: Option<Secret>,
    /// Jobs per import request (1 to 1000).
    #[arg(long, env = "SPINDLE_DRAINER_IMPORT_BATCH", default_value_t = 500)]
    pub import_batch: usize,
    /// JobDBs drained at once.
    #[arg(long, env = "SPINDLE_DRAINER_CONCURRENCY", default_value_t = 4)]
    pub concurrency: usize,
    /// Pause between two looks at the inventory, in ms.
    #[arg(long, env = "SPINDLE_DRAINER_POLL_MS", default_value_t = 1_000)]
    pub poll_ms: u64,
    /// Lock session TTL in ms (Consul's minimum is 10 s).
    #[arg(long, env = "SPINDLE_LOCK_TTL_MS", default_value_t = 10_000)]
    pub lock_ttl_ms: u64,
    /// Lock-delay in ms after a holder's session ends.
    #[arg(long, env = "SPINDLE_LOCK_DELAY_MS", default_value_t = 5_000)]
    pub lock_delay_ms: u64,
    /// This drainer's identity (default: host name and pid).
    #[arg(long, env = "SPINDLE_DRAINER_ID")]
    pub drainer_id: Option<String>,
    /// Serve `/metrics` and `/healthz` here (default: no metrics server).
    #[arg(long, env = "SPINDLE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
}

impl ManagerArgs {
    /// The manager configuration these options describe.
    pub fn to_config(&self) -> anyhow::Result<crate::manager::ManagerConfig> {
        anyhow::ensure!(self.max_age_s > 0, "--max-age-s must be at least 1");
        Ok(crate::manager::ManagerConfig {
            consul: self.consul.client()?,
            servers: self.mysql.clone(),
            prefix: self.prefix.clone(),
            spares: self.spares,
            max_age: Duration::from_secs(self.max_age_s),
            max_bytes: self.max_mib.saturating_mul(1024 * 1024),
            interval: Duration::from_millis(self.interval_ms),
            timing: crate::registry::lease::LockTiming {
                ttl: Duration::from_millis(self.lock_ttl_ms),
                lock_delay: Duration::from_millis(self.lock_delay_ms),
            },
            manager_id: self
                .manager_id
                .clone()
                .unwrap_or_else(director::default_holder),
            metrics: std::sync::Arc::default(),
        })
    }
}

impl DrainerArgs {
    /// The drainer configuration these options describe.
    pub fn to_config(&self) -> anyhow::Result<crate::drainer::DrainerConfig> {
        let archive = self.s3.to_config().context(
            "--s3-bucket or --archive-dir is required: the drainer archives expired jobs",
        )?;
        anyhow::ensure!(
            (1..=1000).contains(&self.import_batch),
            "--import-batch must be 1 to 1000"
        );
        let id = self
            .drainer_id
            .clone()
            .unwrap_or_else(director::default_holder);
        Ok(crate::drainer::DrainerConfig {
            consul: self.consul.client()?,
            timing: crate::registry::lease::LockTiming {
                ttl: Duration::from_millis(self.lock_ttl_ms),
                lock_delay: Duration::from_millis(self.lock_delay_ms),
            },
            holder: format!("drainer:{id}"),
            drainer_id: id,
            archive,
            import_token: self.import_token.clone(),
            import_batch: self.import_batch,
            concurrency: self.concurrency,
            retry_every: Duration::from_millis(self.poll_ms),
            metrics: std::sync::Arc::default(),
        })
    }
}

/// `stop`, with `/metrics` served on `addr` (when given) until it is cancelled.
async fn metrics_until(
    addr: Option<SocketAddr>,
    metrics: &std::sync::Arc<crate::metrics::Metrics>,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<tokio_util::sync::CancellationToken> {
    if let Some(addr) = addr {
        crate::rpc::serve_metrics(addr, metrics.clone(), stop.clone())
            .await
            .with_context(|| format!("--metrics-listen {addr}"))?;
    }
    Ok(stop)
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

/// `spindle tokens` subcommands.
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Print a new random token, and the entry to add to the `--tokens` file (which stores only
    /// its SHA-256). Give it buckets (a producer) or `--admin`.
    New {
        /// A name for the token, shown in errors and logs instead of the token.
        #[arg(long)]
        name: String,
        /// A bucket the token may submit to and read (repeatable; `*` for all).
        #[arg(long = "bucket")]
        buckets: Vec<String>,
        /// Operator actions and every bucket.
        #[arg(long)]
        admin: bool,
    },
}

/// How a Director gets exclusive ownership of a JobDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RegistryKind {
    /// MySQL `GET_LOCK` on `--jobdb`: one site, no Consul.
    Mysql,
    /// Consul: campaign for a spare or orphaned JobDB from the inventory, register in the catalog.
    Consul,
}

/// Where the dashboard finds JobDBs besides `--jobdb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DashboardRegistry {
    /// Nowhere: the `--jobdb` list only (`mysql`, a Director's `SPINDLE_REGISTRY` default,
    /// means the same here).
    #[value(alias = "mysql")]
    None,
    /// The JobDB inventory in Consul: every JobDB not `dropped`.
    Consul,
}

/// Where the Consul agent is.
#[derive(Debug, Clone, Args)]
pub struct ConsulArgs {
    /// Consul agent address.
    #[arg(
        long,
        env = "CONSUL_HTTP_ADDR",
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

/// The longest `--backoff-cap-ms` (30 days, the longest a job may live).
const MAX_BACKOFF_CAP_MS: u64 = 30 * 24 * 3600 * 1000;

/// Options of `spindle director`.
#[derive(Debug, Clone, Args)]
pub struct DirectorArgs {
    /// RPC listen address.
    #[arg(long, env = "SPINDLE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The JobDB: `mysql://user[:password]@host[:port]/database`.
    #[arg(
        long,
        env = "SPINDLE_JOBDB",
        default_value = "mysql://root@127.0.0.1:3306/spindle"
    )]
    pub jobdb: SecretUrl,
    /// Do not create the database when it is missing (fail instead).
    #[arg(long, env = "SPINDLE_NO_CREATE_DATABASE")]
    pub no_create_database: bool,
    /// Attempts in flight across all endpoints.
    #[arg(long, env = "SPINDLE_MAX_IN_FLIGHT", default_value_t = 1024)]
    pub max_in_flight: usize,
    /// Attempts in flight per endpoint (URL without query).
    #[arg(long, env = "SPINDLE_ENDPOINT_CONCURRENCY", default_value_t = 64)]
    pub endpoint_concurrency: usize,
    /// Longest delay between two attempts of a job, in ms.
    #[arg(long, env = "SPINDLE_BACKOFF_CAP_MS", default_value_t = 3_600_000)]
    pub backoff_cap_ms: u64,
    /// How long a stopping Director waits for attempts in flight, in ms.
    #[arg(long, env = "SPINDLE_SHUTDOWN_GRACE_MS", default_value_t = 30_000)]
    pub shutdown_grace_ms: u64,
    /// Jobs waiting at least this long (ms) for their next attempt keep only their metadata in
    /// memory; the payload is read back from the JobDB when due.
    #[arg(long, env = "SPINDLE_SPILL_AFTER_MS", default_value_t = 60_000)]
    pub spill_after_ms: u64,
    /// Most payload and header bytes of cached jobs held in memory, in MiB; beyond it, new jobs
    /// keep only their metadata and their payload is read back from the JobDB when their turn
    /// comes (bounds memory under a backlog).
    #[arg(long, env = "SPINDLE_MAX_CACHED_PAYLOAD_MIB", default_value_t = 512)]
    pub max_cached_payload_mib: usize,
    /// Most jobs held in the Director's cache; beyond it, jobs wait in the JobDB and are read
    /// in a page at a time as room appears, and jobs waiting far in the future are evicted
    /// (bounds memory under any backlog).
    #[arg(long, env = "SPINDLE_MAX_CACHED_JOBS", default_value_t = 1_000_000)]
    pub max_cached_jobs: usize,
    /// Circuit breaker: share of an endpoint's last 20 attempts that must have failed (server
    /// error, timeout, no connection) for it to be judged down and get one probe at a time
    /// instead of its full concurrency (at least 10 attempts seen; above 1 disables it).
    #[arg(long, env = "SPINDLE_BREAKER_FAILURE_RATIO", default_value_t = 0.8)]
    pub breaker_failure_ratio: f64,
    /// Circuit breaker: wait before the first probe of a down endpoint (ms); doubled after
    /// each failed probe up to `--breaker-probe-max-ms`; the first success closes it.
    #[arg(long, env = "SPINDLE_BREAKER_PROBE_MS", default_value_t = 1000)]
    pub breaker_probe_ms: u64,
    /// Circuit breaker: longest wait between two probes (ms).
    #[arg(long, env = "SPINDLE_BREAKER_PROBE_MAX_MS", default_value_t = 30_000)]
    pub breaker_probe_max_ms: u64,
    /// Most attempts of one job: when the last one fails with a retryable error the job ends
    /// `discarded` with `error_type` `max-attempts` (1 to 65535).
    #[arg(long, env = "SPINDLE_MAX_ATTEMPTS", default_value_t = 1000)]
    pub max_attempts: u16,
    /// Shortest wait between two attempts of a job, in ms, whatever its backoff policy or the
    /// endpoint's `Retry-After` say.
    #[arg(long, env = "SPINDLE_MIN_RETRY_DELAY_MS", default_value_t = 100)]
    pub min_retry_delay_ms: u64,
    /// Most rows in one group-commit transaction.
    #[arg(long, env = "SPINDLE_WRITE_BATCH_ROWS", default_value_t = 4000)]
    pub write_batch_rows: usize,
    /// Connections to the JobDB.
    #[arg(long, env = "SPINDLE_DB_CONNECTIONS", default_value_t = 8)]
    pub db_connections: u32,
    /// Largest payload of one job, in bytes.
    #[arg(long, env = "SPINDLE_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024)]
    pub max_payload_bytes: usize,
    /// Largest request body, in bytes.
    #[arg(long, env = "SPINDLE_MAX_REQUEST_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_request_bytes: usize,
    /// Time to live of jobs that give neither `expire_at` nor `ttl_ms`, in ms.
    #[arg(long, env = "SPINDLE_DEFAULT_TTL_MS", default_value_t = 4 * 3600 * 1000)]
    pub default_ttl_ms: u64,
    /// Most bytes of a response body read.
    #[arg(long, env = "SPINDLE_MAX_RESPONSE_BYTES", default_value_t = 64 * 1024)]
    pub max_response_bytes: usize,
    /// Special-purpose subnets deliveries may reach anyway (repeatable; comma-separated in the
    /// environment), e.g. `127.0.0.0/8` for local test endpoints. Loopback, private, link-local,
    /// metadata and other special addresses are blocked unless named here.
    #[arg(
        long = "allow-subnet",
        env = "SPINDLE_ALLOW_SUBNETS",
        value_delimiter = ','
    )]
    pub allow_subnets: Vec<ipnet::IpNet>,
    /// Signing secrets per bucket and endpoint (Standard Webhooks), as a JSON file:
    /// `{"buckets": {"tenant": ["whsec_..."]}, "endpoints": {"https://host/path": ["whsec_..."]}}`.
    #[arg(long, env = "SPINDLE_SIGNING_CONFIG")]
    pub signing_config: Option<std::path::PathBuf>,
    /// API tokens (JSON file of names, SHA-256 hashes and scopes; see `spindle tokens new`).
    /// Without it the RPC API accepts every caller.
    #[arg(long, env = "SPINDLE_TOKENS_FILE")]
    pub tokens: Option<std::path::PathBuf>,
    /// How the Director owns its JobDB.
    #[arg(long, env = "SPINDLE_REGISTRY", value_enum, default_value_t = RegistryKind::Mysql)]
    pub registry: RegistryKind,
    /// With `--registry consul`, or `--read-controls`: the agent.
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// With `--registry mysql`: read endpoint and bucket controls from the Consul agent at
    /// `--consul-addr` anyway (with `--registry consul` they always are). Without it, a
    /// Director on `--registry mysql` says at start that it does not apply them.
    #[arg(long, env = "SPINDLE_READ_CONTROLS")]
    pub read_controls: bool,
    /// With `--registry consul`: address published in the catalog (default: the bound address).
    #[arg(long, env = "SPINDLE_ADVERTISE")]
    pub advertise: Option<std::net::SocketAddr>,
    /// With `--registry consul`: lock session TTL in ms (Consul's minimum is 10 s).
    #[arg(long, env = "SPINDLE_LOCK_TTL_MS", default_value_t = 10_000)]
    pub lock_ttl_ms: u64,
    /// With `--registry consul`: lock-delay in ms after a holder's session ends.
    #[arg(long, env = "SPINDLE_LOCK_DELAY_MS", default_value_t = 5_000)]
    pub lock_delay_ms: u64,
    /// With `--registry consul`: TTL of the catalog health check in ms.
    #[arg(long, env = "SPINDLE_SERVICE_TTL_MS", default_value_t = 10_000)]
    pub service_ttl_ms: u64,
    /// With `--registry consul`: this Director's stable identity (default: the host name). A
    /// Director restarted with the same id takes back the JobDB it held before a crash.
    #[arg(long, env = "SPINDLE_DIRECTOR_ID")]
    pub director_id: Option<String>,
    /// With `--registry consul`: pause between campaign rounds that found no free JobDB, in ms.
    #[arg(long, env = "SPINDLE_CAMPAIGN_RETRY_MS", default_value_t = 2_000)]
    pub campaign_retry_ms: u64,
    /// The archive for expired jobs.
    #[command(flatten)]
    pub s3: S3Args,
}

impl DirectorArgs {
    /// [`DirectorArgs::to_config`], connected to the archive when a bucket is given.
    pub async fn to_config_with_archive(&self) -> anyhow::Result<DirectorConfig> {
        let mut config = self.to_config()?;
        if let Some(archive) = self.s3.to_config() {
            config.archive = Some(
                crate::archive::Archive::open(&archive)
                    .await
                    .context("connecting to the archive")?,
            );
        }
        Ok(config)
    }

    /// The validated Director configuration these options describe.
    pub fn to_config(&self) -> anyhow::Result<DirectorConfig> {
        let jobdb = self.jobdb.expose().parse().context("--jobdb")?;
        anyhow::ensure!(self.max_in_flight > 0, "--max-in-flight must be at least 1");
        anyhow::ensure!(
            self.endpoint_concurrency > 0,
            "--endpoint-concurrency must be at least 1"
        );
        anyhow::ensure!(
            self.write_batch_rows > 0,
            "--write-batch-rows must be at least 1"
        );
        anyhow::ensure!(
            self.db_connections >= 2,
            "--db-connections must be at least 2"
        );
        anyhow::ensure!(self.max_attempts >= 1, "--max-attempts must be at least 1");
        anyhow::ensure!(
            self.backoff_cap_ms <= MAX_BACKOFF_CAP_MS,
            "--backoff-cap-ms must be at most {MAX_BACKOFF_CAP_MS} (30 days)"
        );
        anyhow::ensure!(
            self.min_retry_delay_ms <= self.backoff_cap_ms,
            "--min-retry-delay-ms must not exceed --backoff-cap-ms"
        );
        let mut config = DirectorConfig::new(self.listen, jobdb);
        config.create_database = !self.no_create_database;
        config.db_max_connections = self.db_connections;
        config.scheduler.max_in_flight = self.max_in_flight;
        config.scheduler.per_endpoint = self.endpoint_concurrency;
        config.scheduler.backoff_cap = Duration::from_millis(self.backoff_cap_ms);
        config.scheduler.max_attempts = self.max_attempts;
        config.scheduler.min_retry_delay = Duration::from_millis(self.min_retry_delay_ms);
        config.scheduler.shutdown_grace = Duration::from_millis(self.shutdown_grace_ms);
        config.scheduler.spill_after = Duration::from_millis(self.spill_after_ms);
        config.scheduler.max_cached_bytes = self.max_cached_payload_mib.saturating_mul(1024 * 1024);
        config.scheduler.max_cached_jobs = self.max_cached_jobs.max(1);
        config.scheduler.breaker.failure_ratio = self.breaker_failure_ratio;
        config.scheduler.breaker.probe_min = Duration::from_millis(self.breaker_probe_ms.max(1));
        config.scheduler.breaker.probe_max =
            Duration::from_millis(self.breaker_probe_max_ms.max(self.breaker_probe_ms));
        config.writer.max_rows = self.write_batch_rows;
        config.intake.max_payload_bytes = self.max_payload_bytes;
        config.intake.max_request_bytes = self.max_request_bytes;
        config.intake.default_ttl = Duration::from_millis(self.default_ttl_ms);
        config.delivery.max_response_bytes = self.max_response_bytes;
        config.delivery.allow_subnets = self.allow_subnets.clone();
        if let Some(path) = &self.tokens {
            config.auth = Some(std::sync::Arc::new(crate::rpc::auth::TokenStore::load(
                path,
            )?));
        }
        if let Some(path) = &self.signing_config {
            config.delivery.signing =
                std::sync::Arc::new(crate::delivery::signing::SigningConfig::load(path)?);
        }
        Ok(config)
    }
}

/// Options of `spindle dashboard`.
#[derive(Debug, Clone, Args)]
pub struct DashboardArgs {
    /// Address of the page and its JSON API. Without `--tokens` there is no authentication:
    /// keep it on localhost (or behind a proxy that authenticates).
    #[arg(
        long,
        env = "SPINDLE_DASHBOARD_LISTEN",
        default_value = "127.0.0.1:8090"
    )]
    pub listen: SocketAddr,
    /// A JobDB to show, `mysql://user[:password]@host[:port]/database` (repeatable;
    /// comma-separated in the environment). The dashboard only reads, with `--db-connections`
    /// connections, and never migrates: a JobDB whose schema is older than this binary's is
    /// shown as unreachable with the reason.
    #[arg(
        long = "jobdb",
        env = "SPINDLE_DASHBOARD_JOBDBS",
        value_delimiter = ','
    )]
    pub jobdbs: Vec<SecretUrl>,
    /// Where else JobDBs come from: `none` shows the `--jobdb` list only; `consul` adds every
    /// JobDB of the inventory whose state is not `dropped` (spares included), re-read every
    /// `--discover-every-ms`.
    #[arg(long, env = "SPINDLE_REGISTRY", value_enum, default_value_t = DashboardRegistry::None)]
    pub registry: DashboardRegistry,
    /// With `--registry consul`: the agent.
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// How often the inventory is re-read and JobDBs that could not be reached are tried
    /// again, in ms.
    #[arg(long, env = "SPINDLE_DASHBOARD_DISCOVER_MS", default_value_t = 10_000)]
    pub discover_every_ms: u64,
    /// Deadline of one JobDB's queries for one panel, in ms: a JobDB slower than this is shown
    /// as unreachable in that panel, and the others' numbers are still shown.
    #[arg(
        long,
        env = "SPINDLE_DASHBOARD_QUERY_TIMEOUT_MS",
        default_value_t = 5_000
    )]
    pub query_timeout_ms: u64,
    /// Connections to each JobDB.
    #[arg(long, env = "SPINDLE_DASHBOARD_DB_CONNECTIONS", default_value_t = 2)]
    pub db_connections: u32,
    /// API tokens (the Directors' `--tokens` file): the JSON API then needs an admin token
    /// (`Authorization: Bearer`; the page asks for it once and keeps it in the browser).
    #[arg(long, env = "SPINDLE_DASHBOARD_TOKENS")]
    pub tokens: Option<std::path::PathBuf>,
}

impl DashboardArgs {
    /// The dashboard configuration these options describe.
    pub fn to_config(&self) -> anyhow::Result<crate::dashboard::DashboardConfig> {
        anyhow::ensure!(
            self.db_connections >= 1,
            "--db-connections must be at least 1"
        );
        anyhow::ensure!(
            self.discover_every_ms >= 100,
            "--discover-every-ms must be at least 100"
        );
        let jobdbs = self.jobdbs.iter().map(|u| u.expose().to_owned()).collect();
        let mut config = crate::dashboard::DashboardConfig::new(self.listen, jobdbs);
        if self.registry == DashboardRegistry::Consul {
            config.consul = Some(self.consul.client()?);
        }
        config.discover_every = Duration::from_millis(self.discover_every_ms);
        config.query_timeout = Duration::from_millis(self.query_timeout_ms.max(1));
        config.db_connections = self.db_connections;
        if let Some(path) = &self.tokens {
            config.auth = Some(std::sync::Arc::new(crate::rpc::auth::TokenStore::load(
                path,
            )?));
        }
        Ok(config)
    }
}

/// Options of `spindle sink`.
#[derive(Debug, Args)]
pub struct SinkArgs {
    /// Listen address.
    #[arg(long, env = "SPINDLE_SINK_LISTEN", default_value = "127.0.0.1:9090")]
    pub listen: SocketAddr,
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log).context("--log")?)
        .with_writer(std::io::stderr)
        .init();
    execute(cli.command, until_signal()).await
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
        Command::Placements(PlacementsCommand::Show { consul, dedup }) => {
            let placements = crate::router::placement::PlacementManager::consul(
                consul.client()?,
                dedup.placement(),
            );
            match placements.layout().await? {
                Some(record) => println!("{}", serde_json::to_string_pretty(&record)?),
                None => println!("no layout yet (the first router creates it from --redis)"),
            }
        }
        Command::Placements(PlacementsCommand::Propose {
            consul,
            dedup,
            stores,
            excluded,
        }) => {
            let placements = crate::router::placement::PlacementManager::consul(
                consul.client()?,
                dedup.placement(),
            );
            let layout = placements.propose(stores, excluded).await?;
            println!(
                "layout generation {} takes effect at {}",
                layout.generation, layout.effective_from
            );
        }
        Command::Jobdbs(JobdbsCommand::Add { jobdb, consul }) => {
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
        Command::Tokens(TokensCommand::New {
            name,
            buckets,
            admin,
        }) => {
            anyhow::ensure!(
                admin || !buckets.is_empty(),
                "give --bucket (repeatable) or --admin"
            );
            let (token, entry) = crate::rpc::auth::new_token(&name, &buckets, admin);
            println!("token (give it to the caller; it is not stored): {token}");
            println!("entry for the --tokens file: {entry}");
        }
        Command::Jobdbs(JobdbsCommand::List { consul }) => {
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
        Command::Endpoints(command) => endpoints(command).await?,
        Command::Replay(args) => replay(*args).await?,
        Command::Jobs(JobsCommand::Show {
            id,
            api,
            token,
            json,
        }) => show_job(&id, &api, token.as_ref().map(Secret::expose), json).await?,
        Command::Submit(args) => crate::submit::run(*args).await?,
        Command::Demo(args) => crate::demo::run(args).await?,
        Command::Dev(args) => crate::dev::run(*args, stop).await?,
        Command::Bench(args) => crate::bench::run(args).await?,
        Command::Sink(args) => {
            let sink = crate::sink::Sink::start(args.listen).await?;
            println!("sink listening on http://{}", sink.addr());
            crate::shutdown_signal().await;
            sink.stop().await;
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
        Command::Manager(args) => {
            let config = args.to_config()?;
            let stop = metrics_until(args.metrics_listen, &config.metrics, stop).await?;
            crate::manager::run(config, stop).await?
        }
        Command::Drainer(args) => {
            let config = args.to_config()?;
            let stop = metrics_until(args.metrics_listen, &config.metrics, stop).await?;
            crate::drainer::run(config, stop).await?
        }
        Command::Router(args) => {
            let (settings, store, directors, consul) = args.connect().await?;
            let router =
                crate::router::service::Router::start(settings, store, directors, consul).await?;
            stop.cancelled().await;
            router.stop().await;
        }
        Command::Director(args) => match args.registry {
            RegistryKind::Mysql => {
                let mut config = args.to_config_with_archive().await?;
                if args.read_controls {
                    config.controls = Some(args.consul.client()?);
                } else {
                    tracing::warn!(
                        "--registry mysql: endpoint and bucket controls (`spindle endpoints`) \
                         live in Consul and are not read; give --read-controls (and \
                         --consul-addr) to apply them"
                    );
                }
                let director = director::start(config).await?;
                let stopper = director.stopper();
                tokio::spawn(async move {
                    stop.cancelled().await;
                    stopper.cancel();
                });
                director.wait().await?
            }
            RegistryKind::Consul => {
                let cluster = director::campaign::ClusterConfig {
                    consul: args.consul.client()?,
                    timing: crate::registry::lease::LockTiming {
                        ttl: Duration::from_millis(args.lock_ttl_ms),
                        lock_delay: Duration::from_millis(args.lock_delay_ms),
                    },
                    advertise: args.advertise,
                    service_ttl: Duration::from_millis(args.service_ttl_ms),
                    retry_every: Duration::from_millis(args.campaign_retry_ms),
                    director_id: args.director_id.clone().unwrap_or_else(director::host_name),
                };
                director::campaign::run(args.to_config_with_archive().await?, cluster, stop)
                    .await?;
            }
        },
        Command::Dashboard(args) => {
            let dashboard = crate::dashboard::serve(args.to_config()?).await?;
            println!("dashboard at http://{}/", dashboard.addr());
            stop.cancelled().await;
            dashboard.stop().await;
        }
        _ => anyhow::bail!("not a long-running part of spindle"),
    }
    Ok(())
}

/// `spindle endpoints ...`: reads and writes the controls in Consul.
async fn endpoints(command: EndpointsCommand) -> anyhow::Result<()> {
    use crate::registry::controls;
    match command {
        EndpointsCommand::List { consul } => {
            let (controls, _) =
                controls::read(&consul.client()?, 0, Duration::from_secs(1)).await?;
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
                    "{:<8} {:<48} {:<7} {:>11} {:>10}  {}, {}",
                    "bucket",
                    c.bucket,
                    if c.paused { "paused" } else { "running" },
                    "-",
                    "-",
                    c.updated_by,
                    c.updated_at.format("%Y-%m-%d %H:%M:%S UTC"),
                );
            }
        }
        EndpointsCommand::Health { apis, token } => {
            let client = reqwest::Client::new();
            for api in apis {
                let mut request = client.get(format!("{}/v1/endpoints", api.trim_end_matches('/')));
                if let Some(token) = &token {
                    request = request.bearer_auth(token.expose());
                }
                let response = request
                    .send()
                    .await
                    .with_context(|| format!("--api {api}"))?;
                let status = response.status();
                let body = response.text().await?;
                anyhow::ensure!(status.is_success(), "{api}: {status}: {body}");
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
                        if e.paused { "  paused" } else { "" }
                    );
                }
            }
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
            let endpoint = crate::job::endpoint_key(&endpoint);
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

/// `spindle replay`: selects the ended jobs and submits them as new ones.
async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    use crate::replay::{ReplayOptions, ReplaySource};
    let (discarded, archived) = crate::replay::states(&args.states).map_err(anyhow::Error::msg)?;
    let source = match (&args.from_jobdb, args.from_archive) {
        (Some(url), false) => {
            let url: crate::jobdb::JobDbUrl = url.expose().parse().context("--from-jobdb")?;
            ReplaySource::JobDb(Box::new(crate::jobdb::JobDb::open_reader(&url, 2).await?))
        }
        (None, true) => {
            let mut config = args.s3.to_config().context(
                "--from-archive needs --s3-bucket (and the other --s3-* options) or --archive-dir",
            )?;
            // A reader: a mistyped directory is an error, not a new empty archive.
            if let crate::archive::ArchiveConfig::Dir(dir) = &mut config {
                dir.create_bucket = false;
            }
            ReplaySource::Archive {
                archive: crate::archive::Archive::open(&config).await?,
                jobdb: args.archive_jobdb.clone(),
            }
        }
        _ => anyhow::bail!("give --from-jobdb URL or --from-archive"),
    };
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
    let report = crate::replay::replay(&source, &options).await?;
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

/// `spindle jobs show`: reads the job over the RPC API and prints it.
async fn show_job(id: &str, api: &str, token: Option<&str>, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric()),
        "the job id must be a ULID or 32 hex digits"
    );
    let mut request =
        reqwest::Client::new().get(format!("{}/v1/jobs/{id}", api.trim_end_matches('/')));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("--api {api}"))?;
    let status = response.status();
    let body = response.text().await?;
    anyhow::ensure!(status.is_success(), "{status}: {body}");
    if json {
        println!("{body}");
        return Ok(());
    }
    let job: crate::rpc::api::JobView = serde_json::from_str(&body).context("the api's answer")?;
    println!("job       {} (hex {})", job.id, job.id_hex);
    println!("state     {} after {} attempt(s)", job.state, job.attempts);
    println!("bucket    {}", job.bucket);
    println!("endpoint  {} {}", job.method, job.endpoint);
    println!("created   {}   expires {}", job.created_at, job.expire_at);
    if let Some(key) = &job.idempotency_key {
        println!("key       {key}");
    }
    println!();
    println!(
        "{:<28} {:<20} {:>3} {:>6} {:>7}  {:<18} detail",
        "time", "state", "n", "status", "ms", "error type"
    );
    for t in &job.transitions {
        let detail = match (&t.retry_at, &t.error_response) {
            (Some(at), Some(text)) => format!(
                "retry at {at}; {}",
                text.chars().take(80).collect::<String>()
            ),
            (Some(at), None) => format!("retry at {at}"),
            (None, Some(text)) => text.chars().take(100).collect(),
            (None, None) => String::new(),
        };
        println!(
            "{:<28} {:<20} {:>3} {:>6} {:>7}  {:<18} {}",
            t.time.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
            t.state.to_string(),
            t.attempts,
            t.response_status.map_or("-".to_owned(), |s| s.to_string()),
            t.duration_ms.map_or("-".to_owned(), |d| d.to_string()),
            t.error_type.as_deref().unwrap_or("-"),
            detail.replace('\n', " "),
        );
    }
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
            let endpoint = crate::job::endpoint_key(&endpoint);
            controls::update_endpoint(&client, endpoint, &by, |c| c.paused = paused).await?;
            println!("endpoint {endpoint} {verb}");
        }
        (None, Some(bucket)) => {
            controls::set_bucket_paused(&client, &bucket, &by, paused).await?;
            println!("bucket {bucket} {verb}");
        }
        (None, None) => anyhow::bail!("give --endpoint or --bucket"),
    }
    Ok(())
}
