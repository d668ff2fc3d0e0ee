//! `spindle audit`: the conservation ledger ([`crate::ledger`]) of every JobDB, once (exit
//! non-zero when anything is off: usable from cron) or every `--every` seconds with the
//! figures served as Prometheus metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use super::dashboard::DashboardRegistry;
use super::ConsulArgs;
use crate::dashboard::fleet::Fleet;
use crate::dashboard::ledger::Rounds;
use crate::ledger::metrics::LedgerMetrics;
use crate::ledger::Ledger;
use crate::registry::inventory::Inventory;
use crate::secret::SecretUrl;

/// Options of `spindle audit`.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// A JobDB to audit, `mysql://user[:password]@host[:port]/database` or `sqlite://...`
    /// (repeatable; comma-separated in the environment).
    #[arg(
        long = "jobdb",
        env = "SPINDLE_AUDIT_JOBDBS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub jobdbs: Vec<SecretUrl>,
    /// Where else JobDBs come from: `consul` adds every JobDB of the inventory that holds jobs
    /// (not `spare`, not `dropped`) and says whether someone holds each one's lock.
    #[arg(long, env = "SPINDLE_REGISTRY", value_enum, default_value_t = DashboardRegistry::None)]
    pub registry: DashboardRegistry,
    /// With `--registry consul`: the agent.
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// How long past its execution timeout an attempt may be under way before it is an
    /// overrun, in seconds.
    #[arg(long, env = "SPINDLE_AUDIT_MARGIN_SECS", default_value_t = crate::ledger::MARGIN_SECS)]
    pub margin_secs: u32,
    /// Print each JobDB's ledger as one JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Audit again every this many seconds, until stopped, serving the last round's figures
    /// as Prometheus metrics on `--listen` (`/metrics`); without it, audit once and exit.
    #[arg(long, env = "SPINDLE_AUDIT_EVERY_SECS")]
    pub every_secs: Option<u64>,
    /// List the open work whole every this many rounds even when its count is what the
    /// rounds expect (1: every round, the most thorough and the dearest).
    #[arg(long, env = "SPINDLE_AUDIT_LIST_OPEN_EVERY", default_value_t = crate::ledger::LIST_OPEN_EVERY)]
    pub list_open_every: u64,
    /// With `--every-secs`: where `/metrics` is served.
    #[arg(long, env = "SPINDLE_AUDIT_LISTEN", default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,
}

/// Runs `spindle audit`: once, failing when any JobDB's ledger names anything; or, with
/// `--every-secs`, until `stop`.
pub(super) async fn run(
    args: &AuditArgs,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let urls: Vec<String> = args.jobdbs.iter().map(|u| u.expose().to_owned()).collect();
    let inventory = match args.registry {
        DashboardRegistry::Consul => Some(Inventory::new(args.consul.client()?)),
        DashboardRegistry::None => None,
    };
    anyhow::ensure!(
        !urls.is_empty() || inventory.is_some(),
        "give --jobdb URL (one or more) or --registry consul"
    );
    let fleet = Fleet::new(&urls, inventory, 1, Duration::from_secs(10)).context("--jobdb")?;
    let margin = chrono::Duration::seconds(i64::from(args.margin_secs));
    let mut rounds = Rounds::listing_open_every(args.list_open_every);
    let Some(every) = args.every_secs else {
        let ledgers = rounds.round(&fleet, margin).await;
        fleet.close().await;
        print(&ledgers, args.json)?;
        let off: usize = ledgers.iter().map(|l| l.findings.len()).sum();
        anyhow::ensure!(off == 0, "the ledger names {off} findings (above)");
        return Ok(());
    };
    let metrics = Arc::new(LedgerMetrics::default());
    let server = serve_metrics(args.listen, metrics.clone(), stop.clone()).await?;
    let mut tick = tokio::time::interval(Duration::from_secs(every.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let began = Instant::now();
        let ledgers = rounds.round(&fleet, margin).await;
        let took = began.elapsed();
        metrics.record(&ledgers, took);
        print(&ledgers, args.json)?;
        eprintln!(
            "audit round: {} JobDBs in {} ms",
            ledgers.len(),
            took.as_millis()
        );
    }
    fleet.close().await;
    server.await.context("the metrics server")??;
    Ok(())
}

fn print(ledgers: &[Ledger], json: bool) -> anyhow::Result<()> {
    if json {
        for l in ledgers {
            println!("{}", serde_json::to_string(l)?);
        }
        return Ok(());
    }
    for l in ledgers {
        print!("{l}");
    }
    if ledgers.len() > 1 {
        print!("{}", Ledger::total(ledgers));
    }
    Ok(())
}

/// Serves `/metrics` on `listen` until `stop`.
async fn serve_metrics(
    listen: SocketAddr,
    metrics: Arc<LedgerMetrics>,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { metrics.render() }
        }),
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("--listen {listen}"))?;
    println!("audit metrics at http://{}/metrics", listener.local_addr()?);
    Ok(tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    }))
}
