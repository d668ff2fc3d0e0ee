//! `spindle director`: the Director's options ([`DirectorArgs`], [`RegistryKind`]), their
//! validation into a [`DirectorConfig`], and running a Director on one JobDB (`--registry
//! mysql`) or campaigning for one in Consul (`--registry consul`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use super::{ConsulArgs, S3Args};
use crate::director::defaults as D;
use crate::director::ordering::sequencer::DEFAULT_CLOCK_SKEW;
use crate::director::parks::{self, Redrive};
use crate::director::{self, breaker, DirectorConfig};
use crate::rpc::rules;
use crate::secret::SecretUrl;

/// How a Director gets exclusive ownership of a JobDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RegistryKind {
    /// MySQL `GET_LOCK` on `--jobdb`: one site, no Consul.
    Mysql,
    /// Consul: campaign for a spare or orphaned JobDB from the inventory, register in the catalog.
    Consul,
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
        hide_env_values = true,
        default_value = "mysql://root@127.0.0.1:3306/spindle"
    )]
    pub jobdb: SecretUrl,
    /// Do not create the database when it is missing (fail instead).
    #[arg(long, env = "SPINDLE_NO_CREATE_DATABASE")]
    pub no_create_database: bool,
    /// Attempts in flight across all endpoints.
    #[arg(long, env = "SPINDLE_MAX_IN_FLIGHT", default_value_t = D::MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Attempts in flight per endpoint (URL without query).
    #[arg(long, env = "SPINDLE_ENDPOINT_CONCURRENCY", default_value_t = D::ENDPOINT_CONCURRENCY)]
    pub endpoint_concurrency: usize,
    /// Attempts of one endpoint begun ahead of its HTTP slots (being committed, or committed and
    /// waiting for a slot), as a multiple of its concurrency: commit latency overlaps delivery.
    /// Those waiting are held back, not sent, if the endpoint pauses or its breaker opens.
    #[arg(long, env = "SPINDLE_START_WINDOW", default_value_t = D::START_WINDOW)]
    pub start_window: usize,
    /// A job accepted this long ago (ms) without a row of its own yet (never tried, or its
    /// first attempt not ended) gets its `open_jobs` entry: longer writes fewer entries under a
    /// backlog; shorter leaves less of `commit_log` for a new owner to read.
    #[arg(long, env = "SPINDLE_REST_AFTER_MS", default_value_t = D::ms(D::REST_AFTER))]
    pub rest_after_ms: u64,
    /// Most ordered jobs the writer's book of sequences holds (about 120 bytes each, plus the
    /// bodies of kept jobs, at most 64 MiB); past it a sequence spills: the store alone holds
    /// it, and its jobs go by the sequencer's reads (see docs/director.md, "Ordered keys").
    #[arg(long, env = "SPINDLE_ORDERED_BOOK_JOBS", default_value_t = crate::director::ordering::DEFAULT_BOOK_LIMIT)]
    pub ordered_book_jobs: usize,
    /// Longest delay between two attempts of a job, in ms.
    #[arg(long, env = "SPINDLE_BACKOFF_CAP_MS", default_value_t = D::ms(D::BACKOFF_CAP))]
    pub backoff_cap_ms: u64,
    /// How long a stopping Director waits for attempts in flight, in ms.
    #[arg(long, env = "SPINDLE_SHUTDOWN_GRACE_MS", default_value_t = D::ms(D::SHUTDOWN_GRACE))]
    pub shutdown_grace_ms: u64,
    /// Jobs waiting at least this long (ms) for their next attempt keep only their metadata in
    /// memory; the payload is read back from the JobDB when due.
    #[arg(long, env = "SPINDLE_SPILL_AFTER_MS", default_value_t = D::ms(D::SPILL_AFTER))]
    pub spill_after_ms: u64,
    /// Most payload and header bytes of cached jobs held in memory, in MiB; beyond it, new jobs
    /// keep only their metadata and their payload is read back from the JobDB when their turn
    /// comes (bounds memory under a backlog).
    #[arg(long, env = "SPINDLE_MAX_CACHED_PAYLOAD_MIB", default_value_t = D::MAX_CACHED_PAYLOAD_MIB)]
    pub max_cached_payload_mib: usize,
    /// Most jobs held in the Director's cache; beyond it, jobs wait in the JobDB and are read
    /// in a page at a time as room appears, jobs waiting far in the future are evicted, and
    /// one endpoint takes at most half of it in ready jobs (bounds memory under any backlog).
    #[arg(long, env = "SPINDLE_MAX_CACHED_JOBS", default_value_t = D::MAX_CACHED_JOBS)]
    pub max_cached_jobs: usize,
    /// Circuit breaker: share of an endpoint's last 20 attempts that must have failed (server
    /// error, timeout, no connection) for it to be judged down and get one probe at a time
    /// instead of its full concurrency (at least 10 attempts seen; above 1 disables it).
    #[arg(long, env = "SPINDLE_BREAKER_FAILURE_RATIO", default_value_t = breaker::FAILURE_RATIO)]
    pub breaker_failure_ratio: f64,
    /// Circuit breaker: wait before the first probe of a down endpoint (ms); doubled after
    /// each failed probe up to `--breaker-probe-max-ms`; the first success closes it.
    #[arg(long, env = "SPINDLE_BREAKER_PROBE_MS", default_value_t = D::ms(breaker::PROBE_MIN))]
    pub breaker_probe_ms: u64,
    /// Circuit breaker: longest wait between two probes (ms).
    #[arg(long, env = "SPINDLE_BREAKER_PROBE_MAX_MS", default_value_t = D::ms(breaker::PROBE_MAX))]
    pub breaker_probe_max_ms: u64,
    /// Park an endpoint whose circuit breaker has been open this long (no success), in
    /// seconds: its jobs wait, nothing is discarded, one probe goes every
    /// `--park-probe-secs`, and a success (or `spindle endpoints unpark`) ends it. 0: never
    /// (a bucket's own policy, `spindle buckets park-after`, still applies to its jobs).
    #[arg(long, env = "SPINDLE_PARK_AFTER_SECS", default_value_t = parks::PARK_AFTER.as_secs())]
    pub park_after_secs: u64,
    /// Wait between two probes of a parked endpoint, per Director, in seconds.
    #[arg(long, env = "SPINDLE_PARK_PROBE_SECS", default_value_t = parks::PROBE_EVERY.as_secs())]
    pub park_probe_secs: u64,
    /// Requests per second, per Director, to an endpoint just unparked: the pace of its
    /// re-drive, doubled every `--redrive-double-secs` until it reaches
    /// `--redrive-until-per-second`.
    #[arg(long, env = "SPINDLE_REDRIVE_PER_SECOND", default_value_t = Redrive::DEFAULT.start)]
    pub redrive_per_second: f64,
    /// How often the re-drive's pace doubles, in seconds.
    #[arg(long, env = "SPINDLE_REDRIVE_DOUBLE_SECS", default_value_t = Redrive::DEFAULT.double_every.as_secs())]
    pub redrive_double_secs: u64,
    /// The re-drive's pace at which pacing ends (then the endpoint's own limits apply).
    #[arg(
        long,
        env = "SPINDLE_REDRIVE_UNTIL_PER_SECOND",
        default_value_t = Redrive::DEFAULT.until
    )]
    pub redrive_until_per_second: f64,
    /// Most attempts of one job: when the last one fails with a retryable error the job ends
    /// `discarded` with `error_type` `max-attempts` (1 to 65535).
    #[arg(long, env = "SPINDLE_MAX_ATTEMPTS", default_value_t = D::MAX_ATTEMPTS)]
    pub max_attempts: u16,
    /// Shortest wait between two attempts of a job, in ms, whatever its backoff policy or the
    /// endpoint's `Retry-After` say.
    #[arg(long, env = "SPINDLE_MIN_RETRY_DELAY_MS", default_value_t = D::ms(D::MIN_RETRY_DELAY))]
    pub min_retry_delay_ms: u64,
    /// In a cluster: how far the Directors' clocks may disagree, in ms. An ordered job accepted
    /// at least this long before a complete read of the other JobDBs goes without reading them
    /// again, so a JobDB that cannot be read holds back only the ordered jobs accepted since
    /// (larger: safer with poor clocks, more reads; at most one hour).
    #[arg(long, env = "SPINDLE_MAX_CLOCK_SKEW_MS", default_value_t = D::ms(DEFAULT_CLOCK_SKEW))]
    pub max_clock_skew_ms: u64,
    /// Most rows in one group-commit transaction.
    #[arg(long, env = "SPINDLE_WRITE_BATCH_ROWS", default_value_t = D::WRITE_BATCH_ROWS)]
    pub write_batch_rows: usize,
    /// Connections to the JobDB.
    #[arg(long, env = "SPINDLE_DB_CONNECTIONS", default_value_t = D::DB_CONNECTIONS)]
    pub db_connections: u32,
    /// The most a submit or import waits for its write, in ms: then it is answered 503 (not
    /// written, and never will be) or 504 (being written, outcome unknown). Keep it below the
    /// routers' `--forward-timeout-ms`. A JobDB that no commit reaches for two fifths of it
    /// makes the Director not ready, and its statements' lock waits are bounded by that too.
    #[arg(long, env = "SPINDLE_WRITE_TIMEOUT_MS", default_value_t = D::ms(D::WRITE_TIMEOUT))]
    pub write_timeout_ms: u64,
    /// Largest payload of one job, in bytes.
    #[arg(long, env = "SPINDLE_MAX_PAYLOAD_BYTES", default_value_t = rules::MAX_PAYLOAD_BYTES)]
    pub max_payload_bytes: usize,
    /// Largest request body, in bytes.
    #[arg(long, env = "SPINDLE_MAX_REQUEST_BYTES", default_value_t = rules::MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,
    /// Time to live of jobs that give neither `expire_at` nor `ttl_ms`, in ms.
    #[arg(long, env = "SPINDLE_DEFAULT_TTL_MS", default_value_t = D::ms(rules::DEFAULT_TTL))]
    pub default_ttl_ms: u64,
    /// Most bytes of a response body read.
    #[arg(long, env = "SPINDLE_MAX_RESPONSE_BYTES", default_value_t = crate::delivery::MAX_RESPONSE_BYTES)]
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
    /// Buckets whose receivers get no `traceparent` header (repeatable; comma-separated in
    /// the environment). Every other delivery names its attempt's span, so the receiver's
    /// trace continues it.
    #[arg(
        long = "no-traceparent-bucket",
        env = "SPINDLE_NO_TRACEPARENT_BUCKETS",
        value_delimiter = ','
    )]
    pub no_traceparent_buckets: Vec<String>,
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
    /// The control database (subscriptions).
    #[command(flatten)]
    pub control: super::subscriptions::ControlArgs,
    /// The archive for expired jobs.
    #[command(flatten)]
    pub s3: S3Args,
}

impl DirectorArgs {
    /// [`DirectorArgs::to_config`], connected to the archive when a bucket is given and to
    /// the control database (its subscriptions loaded) when one is.
    pub async fn to_config_with_archive(&self) -> anyhow::Result<DirectorConfig> {
        let mut config = self.to_config()?;
        if let Some(subscriptions) = self.control.subscriptions(config.intake.clone()).await? {
            config.publish_to(subscriptions);
        }
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
            (1..=1024).contains(&self.start_window),
            "--start-window must be 1 to 1024"
        );
        anyhow::ensure!(
            (1_000..=3_600_000).contains(&self.rest_after_ms),
            "--rest-after-ms must be 1000 to 3600000"
        );
        anyhow::ensure!(
            self.write_batch_rows > 0,
            "--write-batch-rows must be at least 1"
        );
        anyhow::ensure!(
            self.db_connections >= 2,
            "--db-connections must be at least 2"
        );
        anyhow::ensure!(
            (1_000..=600_000).contains(&self.write_timeout_ms),
            "--write-timeout-ms must be 1000 to 600000"
        );
        anyhow::ensure!(self.max_attempts >= 1, "--max-attempts must be at least 1");
        anyhow::ensure!(
            self.redrive_per_second.is_finite() && self.redrive_per_second > 0.0,
            "--redrive-per-second must be a positive number"
        );
        anyhow::ensure!(
            self.redrive_until_per_second.is_finite()
                && self.redrive_until_per_second >= self.redrive_per_second,
            "--redrive-until-per-second must be a number at least --redrive-per-second"
        );
        anyhow::ensure!(
            self.park_after_secs <= MAX_BACKOFF_CAP_MS / 1000
                && self.park_probe_secs <= 86_400
                && self.redrive_double_secs <= 86_400,
            "--park-after-secs must be at most 30 days, --park-probe-secs and \
             --redrive-double-secs at most a day"
        );
        anyhow::ensure!(
            self.backoff_cap_ms <= MAX_BACKOFF_CAP_MS,
            "--backoff-cap-ms must be at most {MAX_BACKOFF_CAP_MS} (30 days)"
        );
        anyhow::ensure!(
            self.min_retry_delay_ms <= self.backoff_cap_ms,
            "--min-retry-delay-ms must not exceed --backoff-cap-ms"
        );
        anyhow::ensure!(
            self.max_clock_skew_ms <= 3_600_000,
            "--max-clock-skew-ms must be at most 3600000 (one hour)"
        );
        let mut config = DirectorConfig::new(self.listen, jobdb);
        config.create_database = !self.no_create_database;
        config.db_max_connections = self.db_connections;
        config.scheduler.max_in_flight = self.max_in_flight;
        config.scheduler.per_endpoint = self.endpoint_concurrency;
        config.scheduler.start_window = self.start_window;
        config.writer.rest_after = Duration::from_millis(self.rest_after_ms);
        config.book_limit = self.ordered_book_jobs.max(1);
        config.scheduler.backoff_cap = Duration::from_millis(self.backoff_cap_ms);
        config.scheduler.max_attempts = self.max_attempts;
        config.scheduler.min_retry_delay = Duration::from_millis(self.min_retry_delay_ms);
        config.max_clock_skew = Duration::from_millis(self.max_clock_skew_ms);
        config.scheduler.shutdown_grace = Duration::from_millis(self.shutdown_grace_ms);
        config.scheduler.spill_after = Duration::from_millis(self.spill_after_ms);
        config.scheduler.max_cached_bytes = self.max_cached_payload_mib.saturating_mul(1024 * 1024);
        config.scheduler.max_cached_jobs = self.max_cached_jobs.max(1);
        config.scheduler.breaker.failure_ratio = self.breaker_failure_ratio;
        config.scheduler.park = crate::director::parks::ParkPolicy {
            after: (self.park_after_secs > 0).then(|| Duration::from_secs(self.park_after_secs)),
            probe_every: Duration::from_secs(self.park_probe_secs.max(1)),
            redrive: crate::director::parks::Redrive {
                start: self.redrive_per_second,
                double_every: Duration::from_secs(self.redrive_double_secs.max(1)),
                until: self.redrive_until_per_second,
            },
        };
        config.scheduler.breaker.probe_min = Duration::from_millis(self.breaker_probe_ms.max(1));
        config.scheduler.breaker.probe_max =
            Duration::from_millis(self.breaker_probe_max_ms.max(self.breaker_probe_ms));
        config.writer.max_rows = self.write_batch_rows;
        config.writer.write_timeout = Duration::from_millis(self.write_timeout_ms);
        config.intake.max_payload_bytes = self.max_payload_bytes;
        config.intake.max_request_bytes = self.max_request_bytes;
        config.intake.default_ttl = Duration::from_millis(self.default_ttl_ms);
        config.delivery.max_response_bytes = self.max_response_bytes;
        config.delivery.allow_subnets = self.allow_subnets.clone();
        config.delivery.untraced_buckets = self.no_traceparent_buckets.iter().cloned().collect();
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

/// Runs a Director until it ends or `stop` is cancelled: on `--jobdb` under a MySQL lock, or
/// campaigning for a JobDB of the Consul inventory.
pub(super) async fn run(
    args: DirectorArgs,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    match args.registry {
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
            director::campaign::run(args.to_config_with_archive().await?, cluster, stop).await?;
        }
    }
    Ok(())
}
