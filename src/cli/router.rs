//! `spindle router` and `spindle placements`: the router's options ([`RouterArgs`]), the dedup
//! settings every router shares ([`DedupArgs`]), connecting the dedup store and running a
//! router, and the operator commands on the dedup store's placements in Consul.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{ConsulArgs, S3Args};
use crate::secret::Secret;

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
        hide_env_values = true,
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
    /// The control database (subscriptions): the router publishes events from it and serves
    /// the subscription API. Give it the Directors' database.
    #[command(flatten)]
    pub control: super::subscriptions::ControlArgs,
    /// Special-purpose subnets the Directors' deliveries may reach (their `--allow-subnet`):
    /// a subscription URL in a blocked range outside them is refused.
    #[arg(
        long = "allow-subnet",
        env = "SPINDLE_ALLOW_SUBNETS",
        value_delimiter = ','
    )]
    pub allow_subnets: Vec<ipnet::IpNet>,
    /// The archive the drainers write (read only): the id indexes of drained JobDBs, which
    /// settle a lapsed claim whose job may have been stored in one. Without it such a claim
    /// answers `pending` until its dedup window ends.
    #[command(flatten)]
    pub s3: S3Args,
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
    /// Hashes per slot as a power of two (size it to keys per slot / 30).
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
        if let Some(archive) = self.s3.to_config() {
            settings.archive = Some(
                crate::archive::Archive::open(&archive)
                    .await
                    .context("opening the archive")?,
            );
        }
        settings.subscriptions = self.control.subscriptions(settings.intake.clone()).await?;
        settings.policy = std::sync::Arc::new(crate::delivery::guard::AddressPolicy::new(
            self.allow_subnets.clone(),
        ));
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

/// Runs a router until `stop` is cancelled.
pub(super) async fn run(
    args: &RouterArgs,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let (settings, store, directors, consul) = args.connect().await?;
    let router = crate::router::service::Router::start(settings, store, directors, consul).await?;
    stop.cancelled().await;
    router.stop().await;
    tracing::info!("router stopped");
    Ok(())
}

/// `spindle placements ...`: shows the layout record, or proposes the next layout.
pub(super) async fn placements(command: PlacementsCommand) -> anyhow::Result<()> {
    match command {
        PlacementsCommand::Show { consul, dedup } => {
            let placements = crate::router::placement::PlacementManager::consul(
                consul.client()?,
                dedup.placement(),
            );
            match placements.layout().await? {
                Some(record) => println!("{}", serde_json::to_string_pretty(&record)?),
                None => println!("no layout yet (the first router creates it from --redis)"),
            }
        }
        PlacementsCommand::Propose {
            consul,
            dedup,
            stores,
            excluded,
        } => {
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
    }
    Ok(())
}
