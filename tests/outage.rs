//! The outage drill (docs/testing.md): one endpoint answers 500 for a while under steady load.
//! Its request rate while down must stay bounded (the circuit breaker sends probes, not the
//! growing wave of retries that hit Centrifuge at ~6× normal), another endpoint on the same
//! Director must not notice, and the failed endpoint's backlog must drain once it recovers.
//!
//! `SPINDLE_OUTAGE_S` sets the outage length (8 s in the suite; the drill in the docs is 60 s);
//! `SPINDLE_OUTAGE_NO_BREAKER=1` runs the same load with the breaker disabled, for comparison.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_outage_is_probed_not_stormed() {
    let outage_s: u64 = std::env::var("SPINDLE_OUTAGE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let breaker = std::env::var_os("SPINDLE_OUTAGE_NO_BREAKER").is_none();
    let calm = |(before, during): (f64, f64)| during <= before * 1.5 + 50.0;
    let mut p95 = drill(outage_s, breaker).await;
    if breaker && !calm(p95) {
        // The p95 of a few hundred calm jobs moves with one commit that waits on the disk (a
        // stall delays every job of its batches, calm or failing): the drill runs once more,
        // on a new Director. A calm endpoint the outage really slows is slow both times.
        println!(
            "outage drill: calm p95 {:.1} → {:.1} ms; once more",
            p95.0, p95.1
        );
        p95 = drill(outage_s, breaker).await;
    }
    if breaker {
        assert!(
            calm(p95),
            "calm endpoint p95 {} ms during the outage vs {} ms before",
            p95.1,
            p95.0
        );
    }
}

/// One drill of `outage_s` seconds (with the breaker or not): checks all but the calm
/// endpoint's p95, and returns it before and during the outage.
async fn drill(outage_s: u64, breaker: bool) -> (f64, f64) {
    let rig = Rig::start("outage", |c| {
        c.scheduler.breaker.probe_max = Duration::from_secs(2);
        if !breaker {
            c.scheduler.breaker.failure_ratio = 2.0;
        }
    })
    .await;
    const WARM_S: u64 = 4;
    const AFTER_S: u64 = 2;
    let start = Instant::now();
    let from_ms = chrono::Utc::now().timestamp_millis() + (WARM_S * 1000) as i64;
    let until_ms = from_ms + (outage_s * 1000) as i64;
    let (from, until) = (
        start + Duration::from_secs(WARM_S),
        start + Duration::from_secs(WARM_S + outage_s),
    );
    let down_path = format!("/outage/{from_ms}/{until_ms}");
    // 50 jobs/s to each endpoint, retries from 250 ms doubling: the retry wave a storm is made of.
    let retry = json!({"backoff_min_delay_ms": 250, "backoff_coefficient": 2.0});
    let mut calm_submitted: HashMap<String, Instant> = HashMap::new();
    let mut down_jobs = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut held_seen = 0.0f64;
    let mut ticks = 0u32;
    while start.elapsed() < Duration::from_secs(WARM_S + outage_s + AFTER_S) {
        tick.tick().await;
        ticks += 1;
        if ticks.is_multiple_of(10) {
            let text = metrics_text(&rig.client, &rig.base()).await;
            held_seen = held_seen.max(metric_value(
                &text,
                "spindle_jobs_queued{class=\"breaker_open\"}",
            ));
        }
        let mut jobs = rig.jobs(5, &down_path, retry.clone());
        jobs.extend(rig.jobs(5, "/ok", retry.clone()));
        let at = Instant::now();
        let reply = rig.submit(jobs).await;
        for (i, job) in reply.jobs.into_iter().enumerate() {
            if i < 5 {
                down_jobs += 1;
            } else {
                calm_submitted.insert(job.id, at);
            }
        }
    }
    let total = (down_jobs + calm_submitted.len()) as u64;
    // Without the breaker, backoffs grow through the whole outage: the last retries come late.
    let settle = if breaker { 60 } else { 60 + 4 * outage_s };
    wait_all_final(&rig.reader, total, Duration::from_secs(settle)).await;

    let received = rig.sink.received();
    let down: Vec<_> = received.iter().filter(|r| r.path == down_path).collect();
    // Requests per second to the failing endpoint, by second since the start.
    let mut per_second = HashMap::<u64, usize>::new();
    for r in &down {
        *per_second
            .entry(r.at.duration_since(start).as_secs())
            .or_default() += 1;
    }
    let normal = (1..WARM_S)
        .map(|s| per_second.get(&s).copied().unwrap_or(0))
        .sum::<usize>() as f64
        / (WARM_S - 1) as f64;
    let peak = (WARM_S..WARM_S + outage_s)
        .map(|s| per_second.get(&s).copied().unwrap_or(0))
        .max()
        .unwrap_or(0) as f64;
    let during = down.iter().filter(|r| r.at >= from && r.at < until).count();
    let last_success = down
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.at)
        .max()
        .unwrap();
    let drained_after = last_success.saturating_duration_since(until);
    // The calm endpoint: submit-to-delivery latency before and during the outage.
    let mut first_seen = HashMap::<&str, Instant>::new();
    for r in received.iter().filter(|r| r.path == "/ok") {
        first_seen.entry(r.job_id.as_str()).or_insert(r.at);
    }
    let (mut calm_before, mut calm_during) = (Vec::new(), Vec::new());
    for (id, submitted) in &calm_submitted {
        let latency = first_seen[id.as_str()].duration_since(*submitted);
        if *submitted < from {
            calm_before.push(latency);
        } else if *submitted < until {
            calm_during.push(latency);
        }
    }
    let p99_before = percentile_ms(&mut calm_before, 0.99);
    let p99_during = percentile_ms(&mut calm_during, 0.99);
    let p95_before = percentile_ms(&mut calm_before, 0.95);
    let p95_during = percentile_ms(&mut calm_during, 0.95);
    let max_during = percentile_ms(&mut calm_during, 1.0);
    let text = metrics_text(&rig.client, &rig.base()).await;
    promtool_accepts(&text);
    println!(
        "outage drill ({outage_s} s, breaker {}): failing endpoint normal {normal:.1} req/s, peak while down {peak} req/s ({:.2}× normal), {during} requests while down for {} jobs; backlog drained {:.2} s after recovery; calm endpoint p95 {p95_before:.1} ms before vs {p95_during:.1} ms during, p99 {p99_before:.1} vs {p99_during:.1} ms, max during {max_during:.1} ms; breaker opened {} times, at most {held_seen} jobs held behind it",
        if breaker { "on" } else { "off" },
        peak / normal,
        down_jobs,
        drained_after.as_secs_f64(),
        metric_value(&text, "spindle_endpoint_breaker_opened_total"),
    );
    for history in histories(&rig.reader).await.values() {
        assert_legal(history);
        assert_eq!(
            history.last().unwrap().state,
            spindle::job::State::Succeeded
        );
    }
    if breaker {
        assert!(
            peak <= normal,
            "the failing endpoint got {peak} req/s while down, normal {normal}"
        );
        assert!(
            held_seen >= 1.0,
            "the queue-depth gauge never showed jobs held by the breaker"
        );
        assert!(
            drained_after < Duration::from_secs(10),
            "backlog drained {drained_after:?} after recovery"
        );
        // The suite's 8 s run has ~400 calm jobs, so its p99 is the slowest 4: one commit that
        // waits on a busy disk (CI has just written the build) moves it. The p95 is the
        // steady-state check (by the caller); the worst job must still be far from a
        // retry-storm's delays.
        assert!(
            max_during < 1000.0,
            "a calm job waited {max_during} ms during the outage"
        );
    }
    rig.stop().await;
    (p95_before, p95_during)
}
