//! Latency at a fixed offered load (`spindle bench --rate R`, `--latency`): an open loop, so
//! queueing shows. Requests of `--batch` jobs are sent on a fixed schedule whatever the
//! answers (a closed loop would slow down with the server and hide its queue); each job's
//! submit time is its request's send time. Measured per job: submit → accepted (the answer),
//! submit → first attempt (its first request at the endpoint) and submit → succeeded (its
//! `succeeded` row's time in its JobDB, the Director's clock, this machine's).
//!
//! `--latency` first measures the capacity of the topology (the closed-loop run, delivered
//! jobs per second), then runs an open loop at 25%, 50%, 75% and 90% of it, each for
//! `--rate-secs`, on the same processes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde_json::json;

use super::topology::Topology;
use super::{bodies, percentile, BenchArgs};
use crate::cli::sink::Sink;
use crate::job::{JobId, State};
use crate::jobdb::JobDb;

/// The shares of the measured capacity `--latency` offers.
pub const LOADS: [f64; 4] = [0.25, 0.50, 0.75, 0.90];

/// Jobs one open loop may send (their bodies are encoded ahead).
const MAX_JOBS: usize = 10_000_000;

/// Requests in flight at most: past it a send waits (and counts as late), so an overloaded
/// server cannot exhaust this machine.
const MAX_IN_FLIGHT: usize = 4096;

/// Percentiles of one latency, in ms.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
}

impl Percentiles {
    fn of(mut ms: Vec<f64>) -> Option<Percentiles> {
        ms.sort_by(f64::total_cmp);
        let at = |p: f64| percentile(&ms, p).copied();
        Some(Percentiles {
            p50_ms: at(0.50)?,
            p99_ms: at(0.99)?,
            p999_ms: at(0.999)?,
        })
    }
}

/// One open-loop run at a fixed rate.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Phase {
    /// Share of the measured capacity offered (`None`: `--rate` given).
    pub load: Option<f64>,
    /// Jobs per second offered.
    pub offered_per_sec: f64,
    /// Jobs sent.
    pub jobs: usize,
    /// Requests sent more than 10 ms after their time (the in-flight cap, or this machine).
    pub late_sends: usize,
    /// Submit → accepted.
    pub accepted: Option<Percentiles>,
    /// Submit → first attempt at the endpoint.
    pub first_attempt: Option<Percentiles>,
    /// Submit → `succeeded` committed.
    pub succeeded: Option<Percentiles>,
}

/// What a request's send and answer were.
struct Sent {
    at: Instant,
    wall: DateTime<Utc>,
    answered: Instant,
    jobs: Vec<String>,
}

/// Runs one open loop of `jobs` jobs at `rate` per second, numbered from `first`, and waits
/// until every job has succeeded (at most two minutes after the last send).
pub async fn phase(
    args: &BenchArgs,
    topology: &Topology,
    sink: &Sink,
    dbs: &[JobDb],
    rate: f64,
    first: usize,
    jobs: usize,
) -> anyhow::Result<Phase> {
    anyhow::ensure!(
        rate.is_finite() && rate > 0.0,
        "--rate must be a positive number of jobs per second"
    );
    let work = bodies(
        args,
        &topology.tag,
        &sink.url("/ok"),
        first,
        jobs,
        json!({}),
    );
    let interval = Duration::from_secs_f64(args.batch as f64 / rate);
    let clients: Vec<spindle_client::Client> = topology
        .targets
        .iter()
        .map(|t| {
            spindle_client::Client::builder(t)
                .pool_max_idle_per_host(256)
                .no_timeout()
                .build()
        })
        .collect::<Result<_, _>>()?;
    sink.clear();
    let ok_before = sink.ok_total();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let start = tokio::time::Instant::now();
    let mut late_sends = 0;
    let mut sends = tokio::task::JoinSet::new();
    for (k, body) in work.into_iter().enumerate() {
        let due = start + interval.mul_f64(k as f64);
        tokio::time::sleep_until(due).await;
        let permit = slots.clone().acquire_owned().await?;
        if tokio::time::Instant::now() > due + Duration::from_millis(10) {
            late_sends += 1;
        }
        let client = clients[k % clients.len()].clone();
        sends.spawn(async move {
            let (at, wall) = (Instant::now(), Utc::now());
            let reply = client.submit_encoded(body).await;
            drop(permit);
            let reply = reply.context("submit")?;
            Ok::<_, anyhow::Error>(Sent {
                at,
                wall,
                answered: Instant::now(),
                jobs: reply.jobs.into_iter().map(|j| j.id).collect(),
            })
        });
    }
    let mut sent = Vec::new();
    while let Some(joined) = sends.join_next().await {
        sent.push(joined??);
    }
    let ids: Vec<JobId> = sent
        .iter()
        .flat_map(|s| s.jobs.iter().filter_map(|j| j.parse().ok()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    // The endpoint's count is free to read; the JobDBs are asked once it is reached.
    while (sink.ok_total() - ok_before) < ids.len() as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let succeeded = loop {
        let mut done = HashMap::new();
        for db in dbs {
            for (id, t) in db.latest_of(&ids).await? {
                if t.state == State::Succeeded {
                    done.insert(id.to_string(), t.time);
                }
            }
        }
        if done.len() >= ids.len() {
            break done;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {} jobs succeeded within two minutes of the last send",
            done.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut first_arrival: HashMap<String, Instant> = HashMap::new();
    for r in sink.received() {
        first_arrival
            .entry(r.job_id)
            .and_modify(|at| *at = (*at).min(r.at))
            .or_insert(r.at);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (mut accepted, mut attempted, mut done) = (Vec::new(), Vec::new(), Vec::new());
    for s in &sent {
        for job in &s.jobs {
            accepted.push(ms(s.answered - s.at));
            if let Some(at) = first_arrival.get(job) {
                attempted.push(ms(at.saturating_duration_since(s.at)));
            }
            if let Some(at) = succeeded.get(job) {
                done.push((*at - s.wall).num_microseconds().unwrap_or(0).max(0) as f64 / 1000.0);
            }
        }
    }
    Ok(Phase {
        load: None,
        offered_per_sec: rate,
        jobs: ids.len(),
        late_sends,
        accepted: Percentiles::of(accepted),
        first_attempt: Percentiles::of(attempted),
        succeeded: Percentiles::of(done),
    })
}

/// Runs the open loops the options ask for on `topology`: `--rate`, or with `--latency` the
/// shares [`LOADS`] of `capacity` (jobs per second). Jobs are numbered from `first` on (their
/// idempotency keys must not repeat the closed-loop run's).
pub async fn run(
    args: &BenchArgs,
    topology: &Topology,
    sink: &Sink,
    capacity: Option<f64>,
    mut first: usize,
) -> anyhow::Result<Vec<Phase>> {
    let rates: Vec<(Option<f64>, f64)> = match (args.rate, capacity) {
        (Some(rate), _) => vec![(None, rate)],
        (None, Some(capacity)) if args.latency => {
            LOADS.iter().map(|l| (Some(*l), capacity * l)).collect()
        }
        _ => return Ok(Vec::new()),
    };
    anyhow::ensure!(
        args.rate_secs.is_finite() && (1.0..=3600.0).contains(&args.rate_secs),
        "--rate-secs must be 1 to 3600"
    );
    let mut dbs = Vec::new();
    for url in &topology.jobdbs {
        dbs.push(JobDb::open(url, false, 2).await?);
    }
    let mut phases = Vec::new();
    for (load, rate) in rates {
        let jobs = ((rate * args.rate_secs).round() as usize).max(args.batch);
        // Every request body is encoded before the loop starts.
        anyhow::ensure!(
            jobs <= MAX_JOBS,
            "--rate × --rate-secs asks for {jobs} jobs; at most {MAX_JOBS}"
        );
        let mut phase = phase(args, topology, sink, &dbs, rate, first, jobs).await?;
        phase.load = load;
        first += jobs;
        phases.push(phase);
    }
    for db in dbs {
        db.close().await;
    }
    Ok(phases)
}

/// Prints the phases as a table (ms).
pub fn print(phases: &[Phase]) {
    println!(
        "{:>6} {:>9} {:>7} {:>5}  {:>22}  {:>22}  {:>22}",
        "load", "jobs/s", "jobs", "late", "accepted p50/p99/p99.9", "first attempt", "succeeded"
    );
    let cell = |p: &Option<Percentiles>| match p {
        Some(p) => format!("{:.1}/{:.1}/{:.1}", p.p50_ms, p.p99_ms, p.p999_ms),
        None => "-".to_owned(),
    };
    for p in phases {
        println!(
            "{:>6} {:>9.0} {:>7} {:>5}  {:>22}  {:>22}  {:>22}",
            p.load
                .map_or("-".to_owned(), |l| format!("{:.0}%", l * 100.0)),
            p.offered_per_sec,
            p.jobs,
            p.late_sends,
            cell(&p.accepted),
            cell(&p.first_attempt),
            cell(&p.succeeded)
        );
    }
}
