//! `spindle dev`: the whole system in one process on embedded parts, for a laptop that has
//! nothing installed. A router, a Director, the manager, a drainer and the dashboard run
//! as they do in production (each from the same command line a separate process would be
//! given, parsed by the same CLI), over
//! - SQLite JobDBs (one file each) under `<data-dir>/jobdbs/`,
//! - an archive directory with the S3 object layout, `<data-dir>/archive/`,
//! - the control database (subscriptions) in a SQLite file under `<data-dir>/control/`,
//! - the router's in-process dedup store,
//! - and an in-process registry: the Consul-API server of `consul-double`, on loopback, so
//!   locks, sessions, inventory and catalog go through the very client production uses.
//!
//! The registry lives in memory. On start, JobDB files left by an earlier run are put back
//! into the inventory as `retiring`: a drainer moves their unfinished jobs into the live
//! JobDB and archives the rest, so a restart loses nothing.
//!
//! `--demo` adds a local endpoint and a producer, so deliveries, retries, duplicates and a
//! JobDB cycle show on the dashboard within a minute.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser};
use tokio_util::sync::CancellationToken;

use crate::cli::{run_service, Cli};
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::{Inventory, JobDbRecord, JobDbState};

/// `spindle dev` options.
#[derive(Clone, Debug, Args)]
pub struct DevArgs {
    /// Where everything is kept: `jobdbs/` (SQLite files), `archive/` and `control/`.
    #[arg(long, env = "SPINDLE_DATA_DIR", default_value = "spindle-data")]
    pub data_dir: PathBuf,
    /// The producers' API: the router (same `POST /v1/jobs` as a Director, with dedup).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The Director's own API.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub director_listen: SocketAddr,
    /// The dashboard.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub dashboard_listen: SocketAddr,
    /// The in-process registry's Consul API (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub registry_listen: SocketAddr,
    /// Retire a JobDB after this many seconds (30 with `--demo`, so a cycle shows).
    #[arg(long)]
    pub max_age_s: Option<u64>,
    /// Start a local endpoint and a producer: deliveries, retries, duplicates and JobDB
    /// cycles on the dashboard within a minute.
    #[arg(long)]
    pub demo: bool,
    /// Jobs per second the demo producer submits.
    #[arg(long, default_value_t = 20)]
    pub demo_rate: u32,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub exit_after_s: Option<u64>,
}

/// The command lines `spindle dev` runs, each as `spindle <args>` would.
pub fn commands(args: &DevArgs, data: &Path, registry: &str) -> Vec<Vec<String>> {
    let jobdbs = format!("sqlite://{}", data.join("jobdbs").display());
    let archive = data.join("archive").display().to_string();
    let max_age = args
        .max_age_s
        .unwrap_or(if args.demo { 30 } else { 1800 })
        .to_string();
    let director = args.director_listen.to_string();
    let control = format!(
        "sqlite://{}",
        data.join("control").join("spindle_control").display()
    );
    let lines: [&[&str]; 5] = [
        &[
            "manager",
            "--consul-addr",
            registry,
            "--mysql",
            &jobdbs,
            "--spares",
            "1",
            "--max-age-s",
            &max_age,
            "--interval-ms",
            "1000",
        ],
        &[
            "director",
            "--registry",
            "consul",
            "--consul-addr",
            registry,
            "--listen",
            &director,
            "--advertise",
            &director,
            "--archive-dir",
            &archive,
            "--control-db",
            &control,
            // Endpoints on this machine are what a developer tries first.
            "--allow-subnet",
            "127.0.0.0/8",
            "--allow-subnet",
            "::1/128",
        ],
        &[
            "drainer",
            "--consul-addr",
            registry,
            "--archive-dir",
            &archive,
            "--poll-ms",
            "1000",
        ],
        &[
            "router",
            "--consul-addr",
            registry,
            "--redis",
            "local=memory:",
            "--shard-size",
            "1",
            "--listen",
            &args.listen.to_string(),
            "--catalog-ms",
            "500",
            // Events and subscriptions through the front door, as in production.
            "--control-db",
            &control,
            "--allow-subnet",
            "127.0.0.0/8",
            "--allow-subnet",
            "::1/128",
            // Drained JobDBs' id indexes settle a claim a router died holding.
            "--archive-dir",
            &archive,
        ],
        &[
            "dashboard",
            "--registry",
            "consul",
            "--consul-addr",
            registry,
            "--listen",
            &args.dashboard_listen.to_string(),
            "--discover-every-ms",
            "1000",
            "--control-db",
            &control,
        ],
    ];
    lines
        .iter()
        .map(|line| line.iter().map(|s| (*s).to_owned()).collect())
        .collect()
}

/// How long the front (router, demo) may take to stop before the parts behind it stop anyway.
const FRONT_DRAIN: Duration = Duration::from_secs(15);

/// Runs everything until Ctrl-C (or `--exit-after-s`).
pub async fn run(args: DevArgs, stop: CancellationToken) -> anyhow::Result<()> {
    let started = Instant::now();
    tokio::fs::create_dir_all(args.data_dir.join("jobdbs"))
        .await
        .with_context(|| format!("--data-dir {}", args.data_dir.display()))?;
    tokio::fs::create_dir_all(args.data_dir.join("archive")).await?;
    let data = tokio::fs::canonicalize(&args.data_dir).await?;

    let registry = consul_double::ConsulDouble::start(consul_double::Config {
        listen: args.registry_listen,
        node_name: "spindle-dev".into(),
        ..consul_double::Config::default()
    })
    .await
    .context("--registry-listen")?;
    let registry_url = registry.url();
    readopt_jobdbs(&data, &registry_url).await?;

    // The front (router, demo) stops before the parts behind it, so a request it is still
    // forwarding finds its Director alive and the producer hears how it ended.
    let front = CancellationToken::new();
    let back = CancellationToken::new();
    let mut front_running = 1 + usize::from(args.demo);
    let mut tasks = tokio::task::JoinSet::new();
    let lines = commands(&args, &data, &registry_url);
    for line in &lines {
        let cli = Cli::try_parse_from(std::iter::once("spindle".to_owned()).chain(line.clone()))
            .with_context(|| format!("spindle {}", line.join(" ")))?;
        let name = line[0].clone();
        let part_stop = if name == "router" {
            front.clone()
        } else {
            back.clone()
        };
        tasks.spawn(async move { (name, run_service(cli.command, part_stop).await) });
    }
    println!("spindle dev: data in {}", data.display());
    println!("  producers' API (router):  http://{}/v1/jobs", args.listen);
    println!(
        "  Director API:             http://{}",
        args.director_listen
    );
    println!(
        "  dashboard:                http://{}/",
        args.dashboard_listen
    );
    println!("  registry (Consul API):    {registry_url}");
    println!("  the same parts as separate processes:");
    for line in &lines {
        println!("    spindle {}", line.join(" "));
    }

    if args.demo {
        let demo_stop = front.clone();
        let api = format!("http://{}", args.listen);
        let director = format!("http://{}", args.director_listen);
        let rate = args.demo_rate.max(1);
        tasks.spawn(async move {
            let ended = demo(api, director, rate, started, demo_stop).await;
            ("demo".to_owned(), ended)
        });
    }
    if let Some(seconds) = args.exit_after_s {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            stop.cancel();
        });
    }

    let mut failure = None;
    let back_deadline = tokio::time::sleep(Duration::MAX);
    tokio::pin!(back_deadline);
    loop {
        let done = tokio::select! {
            done = tasks.join_next() => done,
            () = stop.cancelled(), if !front.is_cancelled() => {
                front.cancel();
                back_deadline.as_mut().reset(tokio::time::Instant::now() + FRONT_DRAIN);
                continue;
            }
            () = &mut back_deadline, if !back.is_cancelled() => {
                tracing::warn!("spindle dev: the router is still draining; stopping the rest");
                back.cancel();
                continue;
            }
        };
        let Some(done) = done else { break };
        let (name, ended) = done.context("a part of spindle dev panicked")?;
        if let Err(e) = ended {
            tracing::error!(part = %name, error = format!("{e:#}"), "spindle dev part failed");
            failure.get_or_insert(e.context(name.clone()));
        }
        if name == "router" || name == "demo" {
            front_running = front_running.saturating_sub(1);
        }
        // One part ending ends them all: a half-running system would only confuse.
        stop.cancel();
        if front_running == 0 {
            back.cancel();
        }
    }
    registry.stop().await;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Puts JobDB files of an earlier run back into the (new, empty) inventory as `retiring`.
async fn readopt_jobdbs(data: &Path, registry_url: &str) -> anyhow::Result<()> {
    let inventory = Inventory::new(ConsulClient::new(registry_url, None)?);
    let dir = data.join("jobdbs");
    let mut entries = tokio::fs::read_dir(&dir).await?;
    while let Some(entry) = entries.next_entry().await? {
        let file = entry.file_name();
        let Some(name) = file
            .to_str()
            .and_then(|f| f.strip_suffix(crate::jobdb::SQLITE_SUFFIX))
        else {
            continue;
        };
        let url = format!("sqlite://{}", dir.join(name).display());
        let added = inventory
            .add(&JobDbRecord {
                name: name.to_owned(),
                url,
                state: JobDbState::Retiring,
                changed_at: chrono::Utc::now(),
                changed_by: "spindle dev (restart)".into(),
            })
            .await?;
        if added {
            tracing::info!(
                jobdb = name,
                "an earlier run's jobdb: retiring, to be drained"
            );
        }
    }
    Ok(())
}

/// The demo's subscriptions: `billing` takes `invoice.*`, `audit` every event, `crm`
/// `customer.*` and starts disabled (its events wait until it is enabled, 30 s in).
struct DemoEvents {
    crm: String,
    crm_enabled: bool,
}

async fn demo_subscriptions(
    director: &spindle_client::Client,
    sink: &crate::cli::sink::Sink,
) -> anyhow::Result<DemoEvents> {
    use spindle_client::NewSubscription;
    let add = |name: &str, types: &[&str], enabled: bool| NewSubscription {
        enabled: Some(enabled),
        description: Some(format!("demo: {name}")),
        ..NewSubscription::new("shop-1", sink.url("/ok"), types.iter().copied())
    };
    // A Director between JobDBs (a campaign round) answers 503 and stores nothing: again.
    let subscribe = |given: NewSubscription| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match director.add_subscription(&given).await {
                Err(e) if e.stored_nothing() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                done => return done,
            }
        }
    };
    subscribe(add("billing", &["invoice.*"], true)).await?;
    subscribe(add("audit", &["*"], true)).await?;
    let crm = subscribe(add("crm", &["customer.*"], false)).await?;
    println!(
        "demo: subscriptions billing (invoice.*), audit (*), crm (customer.*, disabled for 30 s)"
    );
    Ok(DemoEvents {
        crm: crm.id,
        crm_enabled: false,
    })
}

impl DemoEvents {
    async fn publish(&mut self, director: &spindle_client::Client, n: u64, started: Instant) {
        let event_type = if n.is_multiple_of(2) {
            "invoice.paid"
        } else {
            "customer.created"
        };
        let event = spindle_client::NewEvent {
            bucket: "shop-1".into(),
            event_type: event_type.into(),
            payload: serde_json::value::RawValue::from_string(format!("{{\"n\": {n}}}"))
                .unwrap_or_else(|_| unreachable!("a JSON object")),
            idempotency_key: None,
            deliver_at: None,
            on_complete: None,
            traceparent: None,
            tracestate: None,
        };
        if let Err(e) = director.publish(&event).await {
            tracing::warn!(error = %e, "demo publish failed");
        }
        if !self.crm_enabled && started.elapsed() > Duration::from_secs(30) {
            let patch = spindle_client::SubscriptionPatch {
                enabled: Some(true),
                ..Default::default()
            };
            if director
                .update_subscription(&self.crm, &patch)
                .await
                .is_ok()
            {
                self.crm_enabled = true;
                println!("demo: subscription crm enabled: its waiting events go now");
            }
        }
    }
}

/// A producer and a local endpoint: a steady mix of jobs that succeed, fail and retry, are
/// rate limited, are refused, and repeat an idempotency key.
async fn demo(
    api: String,
    director: String,
    rate: u32,
    started: Instant,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    use spindle_client::{Client, NewJob};
    let sink = crate::cli::sink::Sink::start("127.0.0.1:0".parse()?).await?;
    let client = Client::new(&api, None)?;
    let director = Client::new(&director, None)?;
    // Start producing once the Director serves a JobDB (the router finds it in the catalog
    // within its refresh; until then it answers 503 and the producer retries).
    let ready = Instant::now();
    while client.ready().await.is_err() || director.ready().await.is_err() {
        anyhow::ensure!(
            ready.elapsed() < Duration::from_secs(60),
            "the router at {api} did not become ready"
        );
        if stop.is_cancelled() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "demo: endpoint at {}, producing {rate} jobs/s through the router",
        sink.url("/")
    );
    let mut events = demo_subscriptions(&client, &sink).await?;
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / u64::from(rate).min(1000)));
    let mut n: u64 = 0;
    let mut first_delivery = false;
    let mut last_report = Instant::now();
    let (mut accepted, mut duplicates) = (0u64, 0u64);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        n += 1;
        let (bucket, path) = match n % 20 {
            0 => ("shop-2", "/fail/2".to_owned()),
            1 => ("shop-2", "/retry-after/1".to_owned()),
            2 => ("shop-3", "/status/400".to_owned()),
            3 | 4 => ("shop-3", "/slow/300".to_owned()),
            5 => ("shop-1", "/flaky/50".to_owned()),
            _ => ("shop-1", "/ok".to_owned()),
        };
        let mut job =
            NewJob::new(bucket, sink.url(&path)).with_payload(&serde_json::json!({"order": n}))?;
        // Every tenth job repeats the previous one's key: the router answers `duplicate`.
        let key = if n.is_multiple_of(10) { n - 1 } else { n };
        job = job.with_idempotency_key(format!("order-{key}"));
        // A producer retries what certainly stored nothing (a 503 while no Director serves).
        let mut reply = client.submit(std::slice::from_ref(&job)).await;
        for _ in 0..20 {
            match &reply {
                Err(e) if e.stored_nothing() && !stop.is_cancelled() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    reply = client.submit(std::slice::from_ref(&job)).await;
                }
                _ => break,
            }
        }
        match reply {
            Ok(reply) => {
                for j in &reply.jobs {
                    match j.status.as_str() {
                        "duplicate" => duplicates += 1,
                        _ => accepted += 1,
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "demo submit failed"),
        }
        // An event every second, through the router: it fans the event out to the
        // subscriptions and sends all its jobs to the Director in one forward.
        if n.is_multiple_of(u64::from(rate)) {
            events.publish(&client, n, started).await;
        }
        if !first_delivery && sink.total() > 0 {
            first_delivery = true;
            println!(
                "demo: first delivery {:.2} s after start",
                started.elapsed().as_secs_f64()
            );
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            println!(
                "demo: {accepted} accepted, {duplicates} duplicates answered, {} requests delivered",
                sink.total()
            );
        }
    }
    sink.stop().await;
    Ok(())
}
