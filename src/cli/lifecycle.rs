//! `spindle manager` and `spindle drainer`, the JobDB lifecycle's two roles: their options
//! ([`ManagerArgs`], [`DrainerArgs`]), the configurations they describe, and running each (with
//! its `/metrics` server when asked). The `spindle-manager` and `spindle-drainer` binaries run
//! these same commands.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::{ConsulArgs, S3Args};
use crate::director;
use crate::secret::{Secret, SecretUrl};

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
        hide_env_values = true,
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

/// Runs the manager until `stop` is cancelled.
pub(super) async fn run_manager(
    args: ManagerArgs,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let config = args.to_config()?;
    let stop = metrics_until(args.metrics_listen, &config.metrics, stop).await?;
    crate::manager::run(config, stop).await?;
    Ok(())
}

/// Runs a drainer until `stop` is cancelled.
pub(super) async fn run_drainer(
    args: DrainerArgs,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let config = args.to_config()?;
    let stop = metrics_until(args.metrics_listen, &config.metrics, stop).await?;
    crate::drainer::run(config, stop).await?;
    Ok(())
}
