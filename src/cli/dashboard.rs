//! `spindle dashboard`: its options ([`DashboardArgs`], [`DashboardRegistry`]), the
//! configuration they describe, and serving the page until stopped.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::ConsulArgs;
use crate::secret::SecretUrl;

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
        hide_env_values = true,
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
    /// The Ledger panel audits every JobDB at most this often, in seconds (`spindle audit`'s
    /// rounds: the first reads each JobDB whole, later ones what is new and what is open).
    #[arg(
        long,
        env = "SPINDLE_DASHBOARD_LEDGER_EVERY_SECS",
        default_value_t = 30
    )]
    pub ledger_every_secs: u64,
    /// API tokens (the Directors' `--tokens` file): the JSON API then needs an admin token
    /// (`Authorization: Bearer`; the page asks for it once and keeps it in the browser).
    #[arg(long, env = "SPINDLE_DASHBOARD_TOKENS")]
    pub tokens: Option<std::path::PathBuf>,
    /// The control database: the page lists the subscriptions and their waiting jobs.
    #[command(flatten)]
    pub control: super::subscriptions::ControlArgs,
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
        config.ledger_every = Duration::from_secs(self.ledger_every_secs);
        if let Some(path) = &self.tokens {
            config.auth = Some(std::sync::Arc::new(crate::rpc::auth::TokenStore::load(
                path,
            )?));
        }
        Ok(config)
    }
}

/// Serves the dashboard until `stop` is cancelled.
pub(super) async fn run(
    args: &DashboardArgs,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let mut config = args.to_config()?;
    config.subscriptions = args
        .control
        .subscriptions(crate::rpc::api::IntakeLimits::default())
        .await?;
    let stop_cache = tokio_util::sync::CancellationToken::new();
    if let Some(cache) = config.subscriptions.clone() {
        tokio::spawn(cache.run(stop_cache.clone()));
    }
    let dashboard = crate::dashboard::serve(config).await?;
    println!("dashboard at http://{}/", dashboard.addr());
    stop.cancelled().await;
    stop_cache.cancel();
    dashboard.stop().await;
    Ok(())
}
