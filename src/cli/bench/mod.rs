//! `spindle bench`: end-to-end delivery throughput of the path producers use, and what each
//! part of it costs.
//!
//! Starts a local endpoint that answers at once (it only counts), the topology under test as
//! child processes ([`topology`]: one Director on a fresh JobDB, or `--via-router` routers
//! with Redis dedup in front of Directors that take JobDBs from an in-process registry), and
//! `concurrency` producers submitting batches of 1 KB jobs. Reports jobs accepted and delivered
//! per second (delivered: every job's outcome committed), submit latency percentiles, peak
//! resident memory of the Directors and routers, and CPU seconds per 1,000 jobs of every
//! component: Directors, routers, MariaDB and Redis (found by the port they listen on, when
//! they run on this machine) and the bench process itself (producers and endpoint).
//! `--backlog N` first queues N jobs behind an endpoint that never answers, so the measured
//! jobs are delivered beside a backlog held by the Director. `--generator CMD` lets an outside
//! program (wrk with `scripts/bench/submit.lua`) submit instead of the bench's producers, so
//! the path is measured as a client that is not spindle's sees it ([`generator`]). `--drain`
//! and `--drop` measure the JobDB cycle instead: a drainer emptying a retired JobDB, and a DROP
//! against DELETEs ([`drain`]).

pub mod dedup;
pub mod drain;
pub mod generator;
pub mod latency;
pub mod procs;
pub mod topology;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::json;

use crate::cli::sink::Sink;
use crate::job::State;
use crate::jobdb::stats::ServerWrites;
use crate::jobdb::JobDb;
use procs::Measured;
use topology::Topology;

/// Options of `spindle bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// MySQL server for the throwaway bench JobDBs (`mysql://user@host:port`, no database).
    #[arg(
        long,
        env = "SPINDLE_BENCH_MYSQL",
        hide_env_values = true,
        default_value = "mysql://root@127.0.0.1:3306"
    )]
    pub mysql: crate::secret::SecretUrl,
    /// Jobs to submit (and measure).
    #[arg(long, default_value_t = 100_000)]
    pub jobs: usize,
    /// Jobs per request (with `--events`: events per request, 1 to 1000).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Concurrent producers.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Submit through routers (dedup on every job's idempotency key in Redis) to Directors
    /// that take their JobDBs from a registry: the production path.
    #[arg(long)]
    pub via_router: bool,
    /// Directors (with `--via-router`; one otherwise).
    #[arg(long, default_value_t = 1)]
    pub directors: usize,
    /// Routers (with `--via-router`).
    #[arg(long, default_value_t = 1)]
    pub routers: usize,
    /// The routers' dedup store (with `--via-router`); with `--dedup`, the stores measured,
    /// comma-separated (Redis URLs, or `memory:` for in-process stores).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis: String,
    /// Jobs queued first behind an endpoint that never answers (and kept there), so the
    /// measured jobs are delivered beside a backlog of this size.
    #[arg(long, default_value_t = 0)]
    pub backlog: usize,
    /// Seconds to wait after the backlog is accepted before the measured jobs go: longer than
    /// the Director's `--rest-after-ms` (30 s) measures beside a backlog whose jobs have all
    /// rested (their entries written), as one held for long is.
    #[arg(long, default_value_t = 0)]
    pub backlog_settle_secs: u64,
    /// Buckets (tenants) the jobs are spread over, round-robin.
    #[arg(long, default_value_t = 8)]
    pub buckets: usize,
    /// Give the measured jobs ordering keys, spread round-robin over this many keys per
    /// bucket (0: unordered): each key's jobs are then delivered one at a time, in order.
    #[arg(long, default_value_t = 0)]
    pub ordering_keys: usize,
    /// Publish events instead of submitting jobs (straight to the Director, which gets a
    /// control database): each event matches every one of `--subscribers` subscriptions, so
    /// `--jobs` jobs are `--jobs / --subscribers` events, `--batch` per request.
    #[arg(long, conflicts_with_all = ["via_router", "ordering_keys", "generator"])]
    pub events: bool,
    /// With `--events`: subscriptions per event.
    #[arg(long, default_value_t = 10)]
    pub subscribers: usize,
    /// With `--events`: this many more subscriptions, of 1,000 other buckets (stored in bulk
    /// before the run), to show that publishing does not slow with them.
    #[arg(long, default_value_t = 0, requires = "events")]
    pub other_subscriptions: usize,
    /// Give every measured job a `traceparent` of its own (a producer's span), as a traced
    /// producer does; with the `OTEL_EXPORTER_OTLP_*` variables set, the Directors and
    /// routers export their spans (`docs/operations.md`, "Traces").
    #[arg(long)]
    pub traced: bool,
    /// Keep the bench JobDBs afterwards.
    #[arg(long)]
    pub keep: bool,
    /// The `spindle` binary the Directors and routers run (default: this one): to compare
    /// two builds under the same benchmark.
    #[arg(long)]
    pub bin: Option<std::path::PathBuf>,
    /// Submit the measured jobs with this outside program (run by `sh -c`) instead of the
    /// bench's own producers, e.g. `wrk ... -s scripts/bench/submit.lua "$SPINDLE_BENCH_TARGET"`;
    /// it is told where and what to submit in `SPINDLE_BENCH_*` variables, and the jobs the
    /// JobDBs accepted are measured.
    #[arg(long)]
    pub generator: Option<String>,
    /// Extra options passed to every Director child process.
    #[arg(last = true)]
    pub director_args: Vec<String>,
    /// Offer this many jobs per second in an open loop (instead of the closed-loop run) and
    /// report submit → accepted, first attempt and succeeded percentiles ([`latency`]).
    #[arg(long, conflicts_with_all = ["events", "generator", "backlog", "latency"])]
    pub rate: Option<f64>,
    /// Measure the capacity (the closed-loop run), then latency in open loops at 25%, 50%,
    /// 75% and 90% of it, on the same processes.
    #[arg(long, conflicts_with_all = ["events", "generator", "backlog"])]
    pub latency: bool,
    /// Seconds each open loop offers its rate.
    #[arg(long, default_value_t = 20.0)]
    pub rate_secs: f64,
    /// Time a drainer emptying a retired JobDB of `--jobs` jobs (awaiting a retry, or expired)
    /// into one live Director, instead of submitting ([`drain`]).
    #[arg(long, conflicts_with_all = ["events", "generator", "backlog", "latency", "rate", "via_router", "drop"])]
    pub drain: bool,
    /// With `--drain`: the percent of the jobs already expired (archived, not moved).
    #[arg(long, default_value_t = 10, requires = "drain")]
    pub expired_percent: usize,
    /// Time emptying a JobDB of `--jobs` jobs with DELETEs against one DROP, instead of
    /// submitting ([`drain`]).
    #[arg(long, conflicts_with_all = ["events", "generator", "backlog", "latency", "rate", "via_router"])]
    pub drop: bool,
    /// Measure the router's dedup store alone over the stores of `--redis`: `--jobs` ids,
    /// `--batch` per claim call from `--concurrency` tasks ([`dedup`]).
    #[arg(long, conflicts_with_all = ["events", "generator", "backlog", "latency", "rate", "via_router", "drain", "drop"])]
    pub dedup: bool,
}

/// What one bench run measured.
#[derive(Debug, serde::Serialize)]
pub struct BenchReport {
    /// Jobs submitted, accepted and measured.
    pub jobs: usize,
    /// Jobs per request.
    pub batch: usize,
    /// Concurrent producers.
    pub concurrency: usize,
    /// Payload bytes per job.
    pub payload_bytes: usize,
    /// Through routers.
    pub via_router: bool,
    /// Subscriptions per event (0: jobs were submitted, not events published).
    pub subscribers: usize,
    /// Subscriptions of other buckets stored before the run (`--other-subscriptions`).
    #[serde(default)]
    pub other_subscriptions: usize,
    /// Directors.
    pub directors: usize,
    /// Routers (0: straight to the Director).
    pub routers: usize,
    /// Jobs held in a backlog while the measured ones were delivered.
    pub backlog: usize,
    /// Every job carried a producer's `traceparent` (`--traced`).
    #[serde(default)]
    pub traced: bool,
    /// The `OTEL_*` variables asked for span export (the Directors and routers inherit them).
    #[serde(default)]
    pub trace_export: bool,
    /// Jobs accepted per second (intake only).
    pub accepted_per_sec: f64,
    /// Jobs delivered per second, until every job's outcome was committed.
    pub delivered_per_sec: f64,
    /// Median submit latency (one request of `batch` jobs), ms (`None` with `--generator`,
    /// which reports its own).
    pub submit_p50_ms: Option<f64>,
    /// 99th percentile submit latency, ms.
    pub submit_p99_ms: Option<f64>,
    /// Peak resident memory of the largest Director, MiB.
    pub director_peak_rss_mib: f64,
    /// Peak resident memory of the largest router, MiB (0 without routers).
    pub router_peak_rss_mib: f64,
    /// Requests the endpoint received for the measured jobs (more than `jobs`: duplicates).
    pub endpoint_requests: u64,
    /// CPU milliseconds per 1,000 measured jobs, by component (Directors and routers summed;
    /// `mariadb` and `redis` when they run on this machine; `bench`: producers and endpoint).
    pub cpu_ms_per_1000_jobs: BTreeMap<String, f64>,
    /// CPU µs per delivered job of spindle's parts: routers, Redis, Directors and MariaDB.
    pub spindle_cpu_us_per_job: f64,
    /// What the MySQL server wrote while the measured jobs went (server-wide counters, so
    /// only meaningful on a server nothing else writes to).
    pub mariadb_writes: Option<WriteCost>,
}

/// What the measured jobs cost the MySQL server's disk: the figures that map a run to other
/// hardware (a disk with a slower fsync lowers commits per second; jobs per commit say how
/// many jobs share each).
#[derive(Debug, serde::Serialize)]
pub struct WriteCost {
    /// Jobs per `COMMIT` statement.
    pub jobs_per_commit: f64,
    /// `COMMIT` statements per second.
    pub commits_per_sec: f64,
    /// InnoDB fsyncs per second (redo log included).
    pub fsyncs_per_sec: f64,
    /// Rows inserted, updated or deleted per job.
    pub rows_per_job: f64,
    /// Bytes written to InnoDB's data files per job.
    pub data_bytes_per_job: f64,
    /// Bytes written to the redo log per job.
    pub log_bytes_per_job: f64,
}

impl WriteCost {
    fn of(writes: &ServerWrites, jobs: usize, seconds: f64) -> WriteCost {
        let jobs = jobs.max(1) as f64;
        let seconds = seconds.max(f64::MIN_POSITIVE);
        WriteCost {
            jobs_per_commit: jobs / writes.commits.max(1) as f64,
            commits_per_sec: writes.commits as f64 / seconds,
            fsyncs_per_sec: writes.fsyncs as f64 / seconds,
            rows_per_job: writes.rows as f64 / jobs,
            data_bytes_per_job: writes.data_bytes as f64 / jobs,
            log_bytes_per_job: writes.log_bytes as f64 / jobs,
        }
    }
}

/// Runs the benchmark and prints its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.batch > 0 && args.jobs > 0 && args.concurrency > 0,
        "jobs, batch and concurrency must be positive"
    );
    anyhow::ensure!(
        (1..=16).contains(&args.directors) && (1..=8).contains(&args.routers),
        "--directors must be 1 to 16 and --routers 1 to 8"
    );
    anyhow::ensure!(
        (1..=10_000).contains(&args.buckets),
        "--buckets must be 1 to 10,000"
    );
    anyhow::ensure!(
        args.via_router || args.directors == 1,
        "--directors needs --via-router"
    );
    anyhow::ensure!(
        !args.events || (1..=1000).contains(&args.subscribers),
        "--subscribers must be 1 to 1000"
    );
    anyhow::ensure!(
        !args.events || (1..=1000).contains(&args.batch),
        "--batch must be 1 to 1000 events with --events"
    );
    anyhow::ensure!(
        args.expired_percent <= 100,
        "--expired-percent must be 0 to 100"
    );
    let tag = ulid::Ulid::new().to_string().to_lowercase();
    if args.drop {
        println!("{}", drain::drop_versus_delete(&args, &tag).await?);
        return Ok(());
    }
    if args.dedup {
        println!("{}", dedup::run(&args, &tag).await?);
        return Ok(());
    }
    // Open loops need each job's arrival; a plain run only counts them.
    let open_loop = args.rate.is_some() || args.latency;
    let sink = match open_loop {
        true => Sink::start("127.0.0.1:0".parse()?).await?,
        false => Sink::start_counting("127.0.0.1:0".parse()?).await?,
    };
    let mut topology = if args.drain {
        // A drain has no producers: its Director takes moved jobs from a drainer.
        Topology::via_router(&args, &tag, 0).await?
    } else if args.via_router {
        Topology::via_router(&args, &tag, args.routers).await?
    } else {
        Topology::direct(&args, &tag).await?
    };
    if args.drain {
        let drained = drain::drain(&args, &mut topology, &sink.url("/ok")).await;
        let stopped = topology.stop(args.keep).await;
        sink.stop().await;
        println!("{}", drained?);
        return stopped;
    }
    let measured = async {
        let report = match args.rate {
            Some(_) => None,
            None => Some(measure(&args, &topology, &sink).await?),
        };
        let capacity = report.as_ref().map(|r| r.delivered_per_sec);
        let first = args.backlog + args.jobs;
        let phases = latency::run(&args, &topology, &sink, capacity, first).await?;
        anyhow::Ok((report, phases))
    }
    .await;
    let stopped = topology.stop(args.keep).await;
    sink.stop().await;
    let (report, phases) = measured?;
    stopped?;
    if let Some(report) = &report {
        print(report)?;
    }
    if !phases.is_empty() {
        latency::print(&phases);
        println!(
            "{}",
            json!({
                "via_router": args.via_router,
                "batch": args.batch,
                "capacity_per_sec": report.as_ref().map(|r| r.delivered_per_sec),
                "latency": phases,
            })
        );
    }
    Ok(())
}

fn print(report: &BenchReport) -> anyhow::Result<()> {
    let path = if report.via_router {
        format!(
            "{} router(s) with dedup, {} Director(s)",
            report.routers, report.directors
        )
    } else {
        "straight to one Director".to_owned()
    };
    println!(
        "jobs {} × {} B, batch {}, {} producers, {path}{}",
        report.jobs,
        report.payload_bytes,
        report.batch,
        report.concurrency,
        if report.backlog > 0 {
            format!(", beside a backlog of {}", report.backlog)
        } else {
            String::new()
        }
    );
    if let Some(events) = report.jobs.checked_div(report.subscribers) {
        println!(
            "events          {events} × {} subscribers = {} jobs, {} events per request",
            report.subscribers, report.jobs, report.batch
        );
    }
    println!("accepted        {:>10.0} jobs/s", report.accepted_per_sec);
    println!(
        "delivered       {:>10.0} jobs/s (every outcome committed)",
        report.delivered_per_sec
    );
    match (report.submit_p50_ms, report.submit_p99_ms) {
        (Some(p50), Some(p99)) => println!("submit latency  p50 {p50:.1} ms   p99 {p99:.1} ms"),
        _ => println!("submit latency  (the generator's own report, above)"),
    }
    println!(
        "director peak   {:.0} MiB RSS",
        report.director_peak_rss_mib
    );
    if report.routers > 0 {
        println!("router peak     {:.0} MiB RSS", report.router_peak_rss_mib);
    }
    let cpu: Vec<String> = report
        .cpu_ms_per_1000_jobs
        .iter()
        .map(|(c, ms)| format!("{c} {ms:.0}"))
        .collect();
    println!("cpu ms/1000 jobs {}", cpu.join(", "));
    println!(
        "spindle cpu     {:.1} µs per job (routers, Redis, Directors, MariaDB)",
        report.spindle_cpu_us_per_job
    );
    if let Some(w) = &report.mariadb_writes {
        println!(
            "mariadb writes  {:.1} jobs per commit, {:.0} commits/s, {:.0} fsyncs/s; per job {:.1} rows, {:.0} B data, {:.0} B redo",
            w.jobs_per_commit,
            w.commits_per_sec,
            w.fsyncs_per_sec,
            w.rows_per_job,
            w.data_bytes_per_job,
            w.log_bytes_per_job
        );
    }
    println!("{}", serde_json::to_string(report)?);
    Ok(())
}

/// Request bodies of `count` jobs from `first` on, encoded ahead (the producers' JSON work is
/// not measured).
fn bodies(
    args: &BenchArgs,
    tag: &str,
    endpoint: &str,
    first: usize,
    count: usize,
    extra: serde_json::Value,
) -> Vec<bytes::Bytes> {
    let payload = "x".repeat(args.payload_bytes.saturating_sub(12));
    let batches = count.div_ceil(args.batch);
    (0..batches)
        .map(|b| {
            let n = args.batch.min(count - b * args.batch);
            let jobs: Vec<_> = (0..n)
                .map(|i| {
                    let k = first + b * args.batch + i;
                    let mut job = json!({"bucket": format!("bench-{}", k % args.buckets), "endpoint": endpoint, "payload": {"data": payload}});
                    if args.via_router {
                        job["idempotency_key"] = json!(format!("{tag}-{k}"));
                    }
                    // Only the measured jobs (no extra fields; the backlog has some) are ordered.
                    if args.ordering_keys > 0 && extra.as_object().is_some_and(|e| e.is_empty()) {
                        job["ordering_key"] =
                            json!(format!("key-{}", (k / args.buckets) % args.ordering_keys));
                    }
                    if args.traced {
                        let k = k as u128 + 1;
                        job["traceparent"] =
                            json!(format!("00-{:032x}-{:016x}-01", k << 64 | k, k as u64));
                    }
                    if let (Some(job), Some(extra)) = (job.as_object_mut(), extra.as_object()) {
                        job.extend(extra.clone());
                    }
                    job
                })
                .collect();
            bytes::Bytes::from(json!({ "jobs": jobs }).to_string())
        })
        .collect()
}

/// With `--events`: `--subscribers` subscriptions of bucket `bench-events` to `endpoint`,
/// each taking every `bench.*` event. Returns how many events make `--jobs` jobs.
async fn subscribe(args: &BenchArgs, topology: &Topology, endpoint: &str) -> anyhow::Result<usize> {
    let client = spindle_client::Client::new(&topology.targets[0], None)?;
    for _ in 0..args.subscribers {
        client
            .add_subscription(&spindle_client::NewSubscription::new(
                "bench-events",
                endpoint,
                ["bench.*"],
            ))
            .await
            .context("adding a subscription")?;
    }
    if args.other_subscriptions > 0 {
        let control = topology
            .control()
            .context("--other-subscriptions needs the Director's control database")?;
        others(control, args.other_subscriptions, &client).await?;
    }
    Ok(args.jobs.div_ceil(args.subscribers))
}

/// Stores `n` subscriptions of 1,000 buckets other than the bench's (exact types, prefixes
/// and `*`, a third each) in bulk, and waits until the Director's cache holds them all.
async fn others(
    control: &crate::jobdb::JobDbUrl,
    n: usize,
    client: &spindle_client::Client,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let db = crate::events::ControlDb::open(control).await?;
    let (limits, policy) = (
        crate::rpc::api::IntakeLimits::default(),
        crate::delivery::guard::AddressPolicy::new(Vec::new()),
    );
    let mut ids = ulid::Generator::new();
    let mut last = None;
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let mut rows = Vec::with_capacity(chunk.len());
        for &i in chunk {
            let pattern = ["bench.created", "bench.*", "*"][i % 3];
            let given = spindle_client::NewSubscription::new(
                format!("bench-other-{}", i % 1000),
                format!("https://example.com/hooks/{i}"),
                [pattern],
            );
            let id = ids.generate().context("ulid")?;
            let made =
                crate::events::Subscription::check(id, given, &limits, &policy, chrono::Utc::now())
                    .map_err(|e| anyhow::anyhow!("{}: {}", e.field, e.message))?;
            rows.push((id, made.spec));
            last = Some(id);
        }
        db.insert_many(&rows).await?;
    }
    db.close().await;
    let stored = started.elapsed();
    if let Some(last) = last {
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while client.subscription(&last.to_string()).await.is_err() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the Director did not read the other subscriptions within 300 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    println!(
        "other subscriptions {n} in 1,000 other buckets: stored in {:.1} s, in the Director's \
         cache {:.1} s later",
        stored.as_secs_f64(),
        (started.elapsed() - stored).as_secs_f64()
    );
    Ok(())
}

/// The `POST /v1/events` bodies, encoded ahead: one event each, or batches of `--batch`.
fn event_bodies(args: &BenchArgs, events: usize) -> Vec<bytes::Bytes> {
    let payload = "x".repeat(args.payload_bytes.saturating_sub(12));
    let event = |n: usize| {
        json!({"bucket": "bench-events", "event_type": "bench.created",
               "payload": {"n": n, "data": payload}})
    };
    let all: Vec<usize> = (0..events).collect();
    all.chunks(args.batch.max(1))
        .map(|chunk| {
            let body = match (args.batch, chunk) {
                (1, [n]) => event(*n),
                _ => json!({"events": chunk.iter().map(|n| event(*n)).collect::<Vec<_>>()}),
            };
            bytes::Bytes::from(body.to_string())
        })
        .collect()
}

/// Submits every body with `concurrency` producers spread over the targets; returns each
/// request's latency.
async fn produce(
    args: &BenchArgs,
    targets: &[String],
    bodies: Vec<bytes::Bytes>,
) -> anyhow::Result<Vec<Duration>> {
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicUsize::new(0));
    let mut producers = Vec::new();
    for p in 0..args.concurrency {
        // No deadline on a request: the bench measures how long they take.
        let client = spindle_client::Client::builder(&targets[p % targets.len()])
            .pool_max_idle_per_host(args.concurrency)
            .no_timeout()
            .build()?;
        let (bodies, next) = (bodies.clone(), next.clone());
        let (events, batch) = (args.events, args.batch);
        producers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= bodies.len() {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let t = Instant::now();
                match (events, batch) {
                    (true, 1) => client.publish_encoded(bodies[i].clone()).await.map(|_| ()),
                    (true, _) => client
                        .publish_batch_encoded(bodies[i].clone())
                        .await
                        .map(|_| ()),
                    (false, _) => client.submit_encoded(bodies[i].clone()).await.map(|_| ()),
                }
                .context("submit")?;
                latencies.push(t.elapsed());
            }
        }));
    }
    let mut latencies = Vec::new();
    for p in producers {
        latencies.extend(p.await??);
    }
    Ok(latencies)
}

/// The value at share `p` (0 to 1) of `sorted` (nearest rank); `None` when it is empty.
fn percentile<T>(sorted: &[T], p: f64) -> Option<&T> {
    let last = sorted.len().checked_sub(1)?;
    sorted.get((last as f64 * p).round() as usize)
}

/// The port of a `scheme://user@host:port...` URL.
fn port_of(url: &str, default: u16) -> u16 {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let host = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = host.rsplit('@').next().unwrap_or(host);
    host.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(default)
}

/// The cache and backlog counters of the Directors the producers reach directly (a bench
/// that did not finish says where its jobs are).
async fn director_counters(topology: &Topology) -> String {
    let client = reqwest::Client::new();
    let mut state = Vec::new();
    for target in &topology.targets {
        let text = match client.get(format!("{target}/metrics")).send().await {
            Ok(answer) => answer.text().await.unwrap_or_default(),
            Err(e) => {
                state.push(format!("{target}: {e}"));
                continue;
            }
        };
        state.extend(
            text.lines()
                .filter(|l| {
                    l.starts_with("spindle_jobs") || l.starts_with("spindle_attempts_in_flight")
                })
                .map(str::to_owned),
        );
    }
    state.join("; ")
}

async fn measure(
    args: &BenchArgs,
    topology: &Topology,
    sink: &Sink,
) -> anyhow::Result<BenchReport> {
    if args.backlog > 0 {
        fill_backlog(args, topology, sink).await?;
    }
    // Subscriptions are set up before the measurement starts (with --other-subscriptions, a
    // bulk insert and the Director's first read of them are not the run's cost).
    let events = match args.events {
        true => Some(subscribe(args, topology, &sink.url("/ok")).await?),
        false => None,
    };
    let mut measured = start_measuring(args, topology);

    let first = args.backlog;
    let work = match (&args.generator, events) {
        (_, Some(events)) => event_bodies(args, events),
        (None, None) => bodies(
            args,
            &topology.tag,
            &sink.url("/ok"),
            first,
            args.jobs,
            json!({}),
        ),
        (Some(_), None) => Vec::new(),
    };
    // Readers of the JobDBs: the server's write counters (read before and after, not per
    // job), and the count of outcomes once the endpoint has them all.
    let mut dbs = Vec::new();
    for url in &topology.jobdbs {
        dbs.push(JobDb::open(url, false, 1).await?);
    }
    let writes_before = match dbs.first() {
        Some(db) => db.server_writes().await?,
        None => None,
    };
    let started = Instant::now();
    let (mut latencies, jobs) = match &args.generator {
        None => {
            let jobs = events.map_or(args.jobs, |e| e * args.subscribers);
            (produce(args, &topology.targets, work).await?, jobs)
        }
        Some(command) => {
            let env = generator::Env::of(args, topology, &sink.url("/ok"));
            generator::run(command, &env, &mut measured).await?;
            // What the JobDBs accepted is what is measured, whatever the program was told:
            // once the count stops growing (a router may still be storing a request whose
            // client went away when the program stopped).
            let accepted = generator::settled(&dbs).await?;
            let accepted = accepted.saturating_sub(args.backlog as u64);
            anyhow::ensure!(
                accepted > 0,
                "the generator submitted no job that was accepted"
            );
            (Vec::new(), accepted as usize)
        }
    };
    let accepted_in = started.elapsed();

    wait_delivered(sink, &dbs, jobs, topology).await?;
    let delivered_in = started.elapsed();
    for m in &mut measured {
        m.sample();
    }
    let mut mariadb_writes = None;
    if let (Some(before), Some(db)) = (writes_before, dbs.first()) {
        if let Some(after) = db.server_writes().await? {
            mariadb_writes = Some(WriteCost::of(
                &after.since(&before),
                jobs,
                delivered_in.as_secs_f64(),
            ));
        }
    }
    if args.backlog > 0 {
        // What the backlog cost the cache: jobs evicted, rested and read back.
        eprintln!("director counters: {}", director_counters(topology).await);
    }
    for db in dbs {
        db.close().await;
    }
    latencies.sort();
    let run = Run {
        jobs,
        accepted_in,
        delivered_in,
        latencies,
        mariadb_writes,
    };
    Ok(run.report(args, topology, sink, &measured))
}

/// Fills the Directors' caches before the measurement: `--backlog` jobs to an endpoint that
/// hangs, left to settle.
async fn fill_backlog(args: &BenchArgs, topology: &Topology, sink: &Sink) -> anyhow::Result<()> {
    let held = json!({"execution_timeout_ms": 300_000, "bucket": "backlog"});
    let backlog = bodies(
        args,
        &topology.tag,
        &sink.url("/hang"),
        0,
        args.backlog,
        held,
    );
    produce(args, &topology.targets, backlog).await?;
    tokio::time::sleep(Duration::from_secs(args.backlog_settle_secs)).await;
    Ok(())
}

/// Starts reading the CPU time of every process the run measures: the topology's children,
/// MariaDB and (through a router) Redis by their listening ports, and this one.
fn start_measuring(args: &BenchArgs, topology: &Topology) -> Vec<Measured> {
    let mut measured: Vec<Measured> = Vec::new();
    for c in &topology.children {
        if let Some(m) = c.pid().and_then(|pid| Measured::start(c.component, pid)) {
            measured.push(m);
        }
    }
    let servers = [
        ("mariadb", Some(port_of(args.mysql.expose(), 3306))),
        ("redis", args.via_router.then(|| port_of(&args.redis, 6379))),
    ];
    for (component, port) in servers {
        if let Some(m) = port
            .and_then(procs::listener_pid)
            .and_then(|pid| Measured::start(component, pid))
        {
            measured.push(m);
        }
    }
    measured.extend(Measured::start("bench", std::process::id()));
    measured
}

/// Waits until every one of `jobs` has succeeded, for at most 10 minutes. The endpoint's
/// count is free to read; the JobDBs are asked once it is reached (a count of outcome rows
/// scans a table, which would load the database being measured).
async fn wait_delivered(
    sink: &Sink,
    dbs: &[JobDb],
    jobs: usize,
    topology: &Topology,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if sink.ok_total() as usize >= jobs {
            let mut succeeded = 0;
            for db in dbs {
                succeeded += db.count_transitions_into(State::Succeeded).await?;
            }
            if succeeded as usize >= jobs {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            let state = director_counters(topology).await;
            anyhow::bail!(
                "jobs not delivered within 10 minutes: {} of {} reached the endpoint; {state}",
                sink.ok_total(),
                jobs
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one measured run saw, before it is a report.
struct Run {
    jobs: usize,
    accepted_in: Duration,
    delivered_in: Duration,
    /// Submission latencies, sorted.
    latencies: Vec<Duration>,
    mariadb_writes: Option<WriteCost>,
}

impl Run {
    /// The run's report: rates, latencies, peak memory and CPU per job of each process.
    fn report(
        self,
        args: &BenchArgs,
        topology: &Topology,
        sink: &Sink,
        measured: &[Measured],
    ) -> BenchReport {
        let Run {
            jobs,
            accepted_in,
            delivered_in,
            latencies,
            mariadb_writes,
        } = self;
        let peak = |component: &str| {
            topology
                .children
                .iter()
                .filter(|c| c.component == component)
                .filter_map(|c| c.pid().and_then(|pid| procs::status_kib(pid, "VmHWM:")))
                .max()
                .unwrap_or(0) as f64
                / 1024.0
        };
        let mut cpu: BTreeMap<String, f64> = BTreeMap::new();
        for m in measured {
            *cpu.entry(m.component.to_owned()).or_default() += m.used();
        }
        let per_1000 = |seconds: f64| seconds * 1000.0 * 1000.0 / jobs as f64;
        let spindle_seconds: f64 = ["router", "redis", "director", "mariadb"]
            .iter()
            .filter_map(|c| cpu.get(*c))
            .sum();
        let pct = |p: f64| percentile(&latencies, p).map(|l| l.as_secs_f64() * 1000.0);
        BenchReport {
            jobs,
            batch: args.batch,
            concurrency: args.concurrency,
            payload_bytes: args.payload_bytes,
            via_router: args.via_router,
            subscribers: if args.events { args.subscribers } else { 0 },
            other_subscriptions: args.other_subscriptions,
            directors: args.directors,
            routers: if args.via_router { args.routers } else { 0 },
            backlog: args.backlog,
            traced: args.traced,
            trace_export: crate::telemetry::export_wanted().unwrap_or(false),
            accepted_per_sec: jobs as f64 / accepted_in.as_secs_f64(),
            delivered_per_sec: jobs as f64 / delivered_in.as_secs_f64(),
            submit_p50_ms: pct(0.50),
            submit_p99_ms: pct(0.99),
            director_peak_rss_mib: peak("director"),
            router_peak_rss_mib: peak("router"),
            endpoint_requests: sink.ok_total(),
            cpu_ms_per_1000_jobs: cpu.iter().map(|(c, s)| (c.clone(), per_1000(*s))).collect(),
            spindle_cpu_us_per_job: spindle_seconds * 1e6 / jobs as f64,
            mariadb_writes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::port_of;

    #[test]
    fn ports_come_from_urls_or_defaults() {
        assert_eq!(port_of("mysql://root@127.0.0.1:3306", 1), 3306);
        assert_eq!(port_of("redis://127.0.0.1:6380/0", 1), 6380);
        assert_eq!(port_of("mysql://u:p@db.example", 3306), 3306);
        assert_eq!(port_of("redis://h:7000", 6379), 7000);
    }
}
