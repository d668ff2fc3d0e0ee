//! `spindle bench`: intake and end-to-end delivery throughput of one Director process.
//!
//! Starts a local endpoint that answers at once, a Director child process on a fresh JobDB,
//! and `concurrency` producers submitting batches of 1 KB jobs. Reports jobs accepted per
//! second, jobs fully delivered per second (every transition committed), submit latency
//! percentiles, and the Director's peak resident memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::json;

use crate::job::State;
use crate::jobdb::{self, JobDb, JobDbUrl};
use crate::sink::Sink;

/// Options of `spindle bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// MySQL server for the throwaway bench JobDB (`mysql://user@host:port`, no database).
    #[arg(
        long,
        env = "SPINDLE_BENCH_MYSQL",
        default_value = "mysql://root@127.0.0.1:3306"
    )]
    pub mysql: crate::secret::SecretUrl,
    /// Jobs to submit.
    #[arg(long, default_value_t = 100_000)]
    pub jobs: usize,
    /// Jobs per request.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Concurrent producers.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Keep the bench JobDB afterwards.
    #[arg(long)]
    pub keep: bool,
    /// Extra options passed to the Director child process.
    #[arg(last = true)]
    pub director_args: Vec<String>,
}

/// What one bench run measured.
#[derive(Debug, serde::Serialize)]
pub struct BenchReport {
    /// Jobs submitted and accepted.
    pub jobs: usize,
    /// Jobs per request.
    pub batch: usize,
    /// Concurrent producers.
    pub concurrency: usize,
    /// Payload bytes per job.
    pub payload_bytes: usize,
    /// Jobs accepted per second (intake only).
    pub accepted_per_sec: f64,
    /// Jobs delivered per second, until every job's last transition was committed.
    pub delivered_per_sec: f64,
    /// Median submit latency (one request of `batch` jobs), ms.
    pub submit_p50_ms: f64,
    /// 99th percentile submit latency, ms.
    pub submit_p99_ms: f64,
    /// Peak resident memory of the Director process, MiB.
    pub director_peak_rss_mib: f64,
    /// Requests the endpoint received (more than `jobs` means duplicates or retries).
    pub endpoint_requests: u64,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.batch > 0 && args.jobs > 0 && args.concurrency > 0,
        "jobs, batch and concurrency must be positive"
    );
    let name = format!(
        "spindle_bench_{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    let url: JobDbUrl = format!("{}/{}", args.mysql.expose().trim_end_matches('/'), name)
        .parse()
        .context("--mysql")?;
    let sink = Sink::start("127.0.0.1:0".parse()?).await?;
    let port = free_port()?;
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .arg("director")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--jobdb")
        .arg(format!(
            "{}/{}",
            args.mysql.expose().trim_end_matches('/'),
            name
        ))
        .arg("--log")
        .arg("warn")
        .arg("--allow-subnet")
        .arg("127.0.0.0/8")
        .args(&args.director_args)
        .kill_on_drop(true)
        .spawn()
        .context("starting the director")?;
    let pid = child.id().context("director pid")?;
    let base = format!("http://127.0.0.1:{port}");
    // No deadline on a request: the bench measures how long they take.
    let client = spindle_client::Client::builder(&base)
        .pool_max_idle_per_host(args.concurrency)
        .no_timeout()
        .build()?;
    wait_ready(&client).await?;

    let payload = "x".repeat(args.payload_bytes.saturating_sub(12));
    let batches = args.jobs.div_ceil(args.batch);
    let bodies: Arc<Vec<bytes::Bytes>> = Arc::new(
        (0..batches)
            .map(|b| {
                let n = args.batch.min(args.jobs - b * args.batch);
                let jobs: Vec<_> = (0..n)
                    .map(|i| json!({"bucket": format!("bench-{}", (b + i) % 8), "endpoint": sink.url("/ok"), "payload": {"data": payload}}))
                    .collect();
                bytes::Bytes::from(json!({ "jobs": jobs }).to_string())
            })
            .collect(),
    );

    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut producers = Vec::new();
    for _ in 0..args.concurrency {
        let (client, bodies, next) = (client.clone(), bodies.clone(), next.clone());
        producers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= bodies.len() {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let t = Instant::now();
                // Bodies are encoded ahead, so the producers' JSON work is not measured.
                client
                    .submit_encoded(bodies[i].clone())
                    .await
                    .context("submit")?;
                latencies.push(t.elapsed());
            }
        }));
    }
    let mut latencies = Vec::new();
    for p in producers {
        latencies.extend(p.await??);
    }
    let accepted_in = started.elapsed();

    let db = JobDb::open(&url, false, 2).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        sample_rss(pid, &peak);
        if sink.total() as usize >= args.jobs
            && db.count_transitions_into(State::Succeeded).await? as usize >= args.jobs
        {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "jobs not delivered within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered_in = started.elapsed();
    let peak_kib = read_status_kib(pid, "VmHWM:").unwrap_or(peak.load(Ordering::Relaxed));

    latencies.sort();
    let pct = |p: f64| {
        latencies[((latencies.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
    };
    let report = BenchReport {
        jobs: args.jobs,
        batch: args.batch,
        concurrency: args.concurrency,
        payload_bytes: args.payload_bytes,
        accepted_per_sec: args.jobs as f64 / accepted_in.as_secs_f64(),
        delivered_per_sec: args.jobs as f64 / delivered_in.as_secs_f64(),
        submit_p50_ms: pct(0.50),
        submit_p99_ms: pct(0.99),
        director_peak_rss_mib: peak_kib as f64 / 1024.0,
        endpoint_requests: sink.total(),
    };

    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    db.close().await;
    if !args.keep {
        jobdb::drop_database(&url).await?;
    }
    sink.stop().await;

    println!(
        "jobs {} × {} B, batch {}, {} producers",
        report.jobs, report.payload_bytes, report.batch, report.concurrency
    );
    println!("accepted        {:>10.0} jobs/s", report.accepted_per_sec);
    println!(
        "delivered       {:>10.0} jobs/s (all transitions committed)",
        report.delivered_per_sec
    );
    println!(
        "submit latency  p50 {:.1} ms   p99 {:.1} ms",
        report.submit_p50_ms, report.submit_p99_ms
    );
    println!(
        "director peak   {:.0} MiB RSS",
        report.director_peak_rss_mib
    );
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn wait_ready(client: &spindle_client::Client) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(true) = client.ready().await {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "director not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn read_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn sample_rss(pid: u32, peak: &std::sync::atomic::AtomicU64) {
    if let Some(kib) = read_status_kib(pid, "VmRSS:") {
        peak.fetch_max(kib, Ordering::Relaxed);
    }
}
