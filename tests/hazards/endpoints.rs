//! Endpoints: a receiver hurts only itself. Answers meant to stop a scheduler
//! (`Retry-After: 99999999999999`, a `Retry-After` in year 9999, 429 forever, 2 MiB error
//! bodies, headers that never end) leave the healthy endpoint's latency and the Director's
//! readiness alone; attempts begun for an endpoint do not go out once it is judged down; a
//! long queue behind a rate cap costs the others nothing; and a cache full of one endpoint's
//! jobs (hanging, or waiting for their retries) still takes other endpoints' jobs.

use std::time::{Duration, Instant};

use serde_json::json;
use spindle::job::{JobId, State};

use crate::common::*;
use crate::{alone, calm_latencies, pct, ready, shared, tail_within};

crate::on_both_engines!(a_huge_retry_after_cannot_stop_deliveries);

/// `Retry-After: 99999999999999` made the scheduler panic on a chrono overflow (nothing was
/// delivered any more, `/readyz` still said 200); a far-future HTTP date gave a `retry_at` past
/// year 9999 that the JobDB refused forever. Now both are clamped to the backoff cap and the
/// job's expiry, and the healthy endpoint is served throughout.
async fn a_huge_retry_after_cannot_stop_deliveries(engine: Engine) {
    let _machine = shared().await;
    let rig = Rig::start_on(engine, "retryafter", |_| {}).await;
    let hostile = [
        rig.sink.url("/answer/429/retry-after/99999999999999"),
        rig.sink
            .url("/answer/503/retry-after/Fri,%2031%20Dec%209999%2023:59:59%20GMT"),
        rig.sink
            .url("/answer/429/retry-after/184467440737095516151844674407370955161"),
    ];
    let jobs: Vec<_> = hostile
        .iter()
        .map(|url| json!({"bucket": "hostile", "endpoint": url, "ttl_ms": 600_000}))
        .collect();
    let reply = rig.submit(jobs).await;
    rig.wait_in_state(State::AwaitingRetry, 3, Duration::from_secs(20))
        .await;
    // The Director still delivers, and says it is ready because it is.
    let healthy = rig.submit(rig.jobs(20, "/ok", json!({}))).await;
    rig.wait_in_state(State::Succeeded, 20, Duration::from_secs(20))
        .await;
    assert_eq!(ready(&rig).await, 200);
    let h = histories(&rig.reader).await;
    for job in &reply.jobs {
        let history = &h[&job.id.parse::<JobId>().unwrap()];
        let last = history.last().unwrap();
        assert_eq!(last.state, State::AwaitingRetry, "{history:?}");
        let retry_at = last.retry_at.expect("retry_at");
        // Clamped to the backoff cap (1 h) and the job's expiry (10 min).
        assert!(
            retry_at <= last.time + chrono::Duration::minutes(10) + chrono::Duration::seconds(1),
            "retry_at {retry_at} for a job expiring within 10 minutes"
        );
    }
    assert_eq!(healthy.jobs.len(), 20);
    rig.stop().await;
}

/// The receivers of the review, all at once, beside a healthy endpoint: `Retry-After:
/// 99999999999999`, `Retry-After` as a date in year 9999, 429 forever, 2 MiB error bodies, and
/// headers that never end. They hurt only themselves: the healthy endpoint keeps its latency
/// (p99 within 1.5× of its baseline), `/readyz` says 200 throughout because the Director is
/// delivering, and every hostile job waits within its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_receivers_hurt_only_themselves() {
    let _machine = alone().await;
    let rig = Rig::start("hostile", |c| {
        c.scheduler.breaker.probe_max = Duration::from_secs(2);
    })
    .await;
    // `SPINDLE_HOSTILE_S` lengthens both phases (6 s each in the suite).
    let phase = Duration::from_secs(
        std::env::var("SPINDLE_HOSTILE_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(6),
    );
    // The healthy tenant sends 100 jobs a second in batches of two: jobs of one batch share a
    // commit, so small batches make the p99 a statistic of many commits, not of the one
    // slowest.
    let calm = || async {
        let (base, every) = (rig.base(), Duration::from_millis(20));
        steady_latencies(&rig.client, &base, &rig.sink, every, phase, || {
            rig.jobs(2, "/ok", json!({}))
        })
        .await
    };
    let baseline = calm().await;
    let endless = endless_headers(Duration::from_millis(50)).await;
    let hostile = [
        rig.sink.url("/answer/429/retry-after/99999999999999"),
        rig.sink
            .url("/answer/503/retry-after/Fri,%2031%20Dec%209999%2023:59:59%20GMT"),
        rig.sink.url("/status/429"),
        rig.sink.url("/big/500/2097152"),
        endless,
    ];
    // The hostile tenant sends steadily: 8 jobs to each receiver every second of the phase.
    let hostile_load = {
        let (client, base) = (rig.client.clone(), rig.base());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            let started = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            while started.elapsed() < phase {
                tick.tick().await;
                let jobs: Vec<_> = hostile
                    .iter()
                    .flat_map(|url| {
                        (0..8).map(move |_| {
                            json!({"bucket": "hostile", "endpoint": url,
                                   "execution_timeout_ms": 2_000, "backoff_min_delay_ms": 100,
                                   "backoff_coefficient": 1.0, "ttl_ms": 3_600_000})
                        })
                    })
                    .collect();
                ids.extend(
                    submit(&client, &base, jobs)
                        .await
                        .jobs
                        .into_iter()
                        .map(|j| j.id),
                );
            }
            ids
        })
    };
    // Readiness is watched all along: a Director that cannot deliver must not say 200, and
    // one that delivers must.
    let watch = {
        let (client, base) = (rig.client.clone(), rig.base());
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let started = Instant::now();
            while started.elapsed() < phase {
                let status = client
                    .get(format!("{base}/readyz"))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0);
                answers.push(status);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answers
        })
    };
    let beside = calm().await;
    let answers = watch.await.unwrap();
    let ids = hostile_load.await.unwrap();
    let (b50, b99) = (pct(&baseline, 0.5), pct(&baseline, 0.99));
    let (l50, l99) = (pct(&beside, 0.5), pct(&beside, 0.99));
    let hostile_requests = rig.sink.total() as usize - baseline.len() - beside.len();
    println!(
        "healthy endpoint p50/p99 {b50:.1}/{b99:.1} ms alone, {l50:.1}/{l99:.1} ms beside {} \
         hostile jobs on 5 receivers ({hostile_requests} requests to the sink's hostile paths \
         in {} s, {} healthy jobs each phase); /readyz {} × 200 of {}",
        ids.len(),
        phase.as_secs(),
        beside.len(),
        answers.iter().filter(|s| **s == 200).count(),
        answers.len()
    );
    assert!(answers.iter().all(|s| *s == 200), "readyz said {answers:?}");
    assert!(l50 <= b50 * 1.5 + 10.0, "p50 {b50:.1} → {l50:.1} ms");
    // Beside the hostile jobs, still retrying, if measured again.
    let l99 = tail_within(l99, b99 * 1.5 + 30.0, "healthy endpoint p99", || async {
        pct(&calm().await, 0.99)
    })
    .await;
    assert!(l99 <= b99 * 1.5 + 30.0, "p99 {b99:.1} → {l99:.1} ms");
    // Every hostile job is still waiting, within its expiry, its next attempt a time the
    // JobDB stores.
    let h = histories(&rig.reader).await;
    for id in &ids {
        let history = &h[&id.parse::<JobId>().unwrap()];
        assert_legal(history);
        let last = history.last().unwrap();
        assert!(!last.state.is_terminal(), "{history:?}");
        if let Some(at) = last.retry_at {
            assert!(
                at <= history[0].time + chrono::Duration::hours(1) + chrono::Duration::seconds(1)
            );
        }
    }
    rig.stop().await;
}

/// A Director begins up to `start_window × concurrency` attempts of an endpoint ahead of its
/// HTTP slots (so commit latency overlaps delivery). When the endpoint's breaker opens, those
/// begun and not yet sent must not go out: they are held back (`held-back`, due again when the
/// endpoint opens). With a fixed window of 16 × 8 and no hold-back, 145 requests reached an
/// endpoint already judged down; with the hold-back, 18. (The window now also adapts: it grows
/// only while begun attempts all find free slots, so a failing endpoint keeps it small; the
/// unit tests of `queues` and `gates` cover both rules on their own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_begun_attempts_never_reaches_an_endpoint_judged_down() {
    let _machine = shared().await;
    let rig = Rig::start("window", |c| {
        c.scheduler.per_endpoint = 8;
        c.scheduler.start_window = 16;
        c.scheduler.breaker.probe_max = Duration::from_secs(2);
    })
    .await;
    // Down from now on, for a minute.
    let from = chrono::Utc::now().timestamp_millis();
    let path = format!("/outage/{from}/{}", from + 60_000);
    let started = Instant::now();
    let jobs = (0..400)
        .map(|_| json!({"bucket": "down", "endpoint": rig.sink.url(&path), "backoff_min_delay_ms": 100}))
        .collect();
    rig.submit(jobs).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let requests = rig
        .sink
        .received()
        .iter()
        .filter(|r| r.path == path && r.at.duration_since(started) < Duration::from_millis(1500))
        .count();
    let held = metric_value(
        &metrics_text(&rig.client, &rig.base()).await,
        "spindle_attempts_held_back_total",
    );
    println!(
        "window 16 × concurrency 8 over an endpoint down from the start: {requests} requests in \
         1.5 s, {held} begun attempts held back"
    );
    // The breaker opens after at most 10 failures of its last 20; with 8 in flight at that
    // moment and a probe a second later, about 20 requests reach it, not a window of 128.
    assert!(
        requests <= 40,
        "{requests} requests reached an endpoint judged down"
    );
    let h = histories(&rig.reader).await;
    for history in h.values() {
        assert_legal(history);
    }
    let held_rows = h
        .values()
        .flatten()
        .filter(|t| t.error_type.as_deref() == Some("held-back"))
        .count();
    assert!(
        held_rows as f64 >= held,
        "{held_rows} held-back rows for {held} held back"
    );
    // Held back is not lost: once the endpoint answers again every job succeeds (here: it
    // stays down, so each job is still waiting).
    assert!(h.values().all(|t| !t.last().unwrap().state.is_terminal()));
    rig.stop().await;
}

/// Every token of a rate-capped lane woke a walk of its whole queue (`expire_held`): with a big
/// queue behind a 100/s cap the scheduler did nothing else. Held queues now expire their jobs
/// through a deadline index, so a token costs a heap operation. `SPINDLE_RATE_CAP_QUEUE` sets
/// the queue (50,000 in the suite; 1,000,000 on demand, in release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_queue_behind_a_rate_cap_leaves_other_endpoints_alone() {
    let _machine = alone().await;
    let queued: usize = std::env::var("SPINDLE_RATE_CAP_QUEUE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let consul = ConsulUnderTest::start().await;
    let client = consul.client.clone();
    let rig = Rig::start("ratecap", |c| c.controls = Some(client)).await;
    let capped = rig.sink.url("/status/200");
    spindle::registry::controls::update_endpoint(&consul.client, &capped, "test", |c| {
        c.max_per_second = Some(100.0)
    })
    .await
    .expect("rate cap");
    wait_for(Duration::from_secs(10), "the cap in force", || async {
        metric_value(
            &metrics_text(&rig.client, &rig.base()).await,
            r#"spindle_controls{target="endpoint"}"#,
        ) == 1.0
    })
    .await;
    let calm = |rig: &Rig| rig.jobs(5, "/ok", json!({}));
    let baseline = calm_latencies(&rig, calm, Duration::from_secs(3)).await;
    let loaded = Instant::now();
    let payload = json!({"bucket": "capped", "endpoint": capped});
    for _ in 0..queued / 1000 {
        rig.submit(vec![payload.clone(); 1000]).await;
    }
    println!(
        "{queued} jobs queued behind 100/s in {:.1} s",
        loaded.elapsed().as_secs_f64()
    );
    let sent_before = rig.sink.total();
    let measured = Instant::now();
    let beside = calm_latencies(&rig, calm, Duration::from_secs(5)).await;
    let capped_rate = rig
        .sink
        .received()
        .iter()
        .filter(|r| r.path == "/status/200")
        .count() as f64;
    let span = measured.elapsed().as_secs_f64();
    let (b50, b95) = (pct(&baseline, 0.5), pct(&baseline, 0.95));
    let (l50, l95) = (pct(&beside, 0.5), pct(&beside, 0.95));
    println!(
        "calm endpoint p50/p95 {b50:.1}/{b95:.1} ms alone, {l50:.1}/{l95:.1} ms beside {queued} \
         jobs behind a 100/s cap; capped endpoint {capped_rate} requests so far ({} in the last {span:.1} s)",
        rig.sink.total() - sent_before
    );
    assert!(l50 <= b50 * 1.5 + 20.0, "p50 {b50:.1} → {l50:.1} ms");
    // Beside the same capped queue, if measured again.
    let l95 = tail_within(l95, b95 * 1.5 + 50.0, "calm endpoint p95", || async {
        pct(
            &calm_latencies(&rig, calm, Duration::from_secs(5)).await,
            0.95,
        )
    })
    .await;
    assert!(l95 <= b95 * 1.5 + 50.0, "p95 {b95:.1} → {l95:.1} ms");
    rig.stop().await;
    consul.stop().await;
}

/// A hanging endpoint must not keep a healthy endpoint's new jobs out of the cache.
/// Before, with the cache full of a hanging endpoint's ready jobs, new jobs for any other
/// endpoint rested in the JobDB until a quarter of the cache was free: here, until the hanging
/// jobs expired. Then the largest lane's newest ready job went back to rest to let each in
/// (a write for each). Now a lane holding more than half the cache in ready jobs takes no
/// more: the rest of its jobs rest as they come, and the other half stays free for others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_full_of_a_hanging_endpoint_still_takes_other_endpoints_jobs() {
    let _machine = shared().await;
    const CAP: f64 = 40.0;
    const WINDOW: f64 = 2.0;
    let rig = Rig::start("fullcache", |c| {
        c.scheduler.max_cached_jobs = CAP as usize;
        c.scheduler.per_endpoint = WINDOW as usize;
    })
    .await;
    let hanging = rig.jobs(
        60,
        "/hang",
        json!({"execution_timeout_ms": 60_000, "ttl_ms": 600_000}),
    );
    rig.submit(hanging).await;
    // Half the cache and one (some of them in flight now); the others rest.
    let held = CAP / 2.0 + 1.0;
    wait_for(
        Duration::from_secs(10),
        "the hanging lane's share",
        || async {
            let text = metrics_text(&rig.client, &rig.base()).await;
            metric_value(&text, "spindle_jobs_cached") >= held
                && metric_value(&text, "spindle_attempts_in_flight") >= WINDOW
        },
    )
    .await;
    let started = Instant::now();
    let healthy = rig.submit(rig.jobs(10, "/ok", json!({}))).await;
    wait_for(
        Duration::from_secs(10),
        "the healthy jobs delivered",
        || async { rig.sink.ok_total() >= 10 },
    )
    .await;
    let took = started.elapsed();
    println!("10 jobs beside a cache half full of a hanging endpoint's: delivered in {took:?}");
    let per_job = rig.sink.per_job();
    for job in &healthy.jobs {
        assert_eq!(per_job.get(&job.id), Some(&1));
    }
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert!(metric_value(&text, "spindle_jobs_cached") <= held);
    assert_eq!(
        metric_value(&text, "spindle_jobs_evicted_total"),
        0.0,
        "nothing had to make room"
    );
    // Nothing was lost: every hanging job is still open (in flight, cached or resting), and
    // only they once the healthy jobs' outcomes are committed (a moment after the sink saw
    // their requests).
    wait_for(
        Duration::from_secs(5),
        "only the hanging jobs open",
        || async { rig.reader.open_work().await.unwrap().len() == 60 },
    )
    .await;
    rig.stop().await;
}

/// A cache full of one endpoint's jobs waiting for their retries (due within the horizon, so
/// not evicted), with more of them resting in the JobDB, must still take other endpoints' jobs
/// that rest there. Before, those waited until the failing endpoint's retries moved beyond the
/// horizon (here at least 20 s): a backlog page needs a quarter of the cache free, and pages
/// in id order read the failing endpoint's older jobs first. Now the other lanes' jobs are
/// read with that lane left out, and it gives way to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_full_of_one_endpoints_retries_still_takes_other_endpoints_resting_jobs() {
    let _machine = shared().await;
    let rig = Rig::start("fullretries", |c| {
        c.scheduler.max_cached_jobs = 40;
        // No breaker: the failing endpoint's jobs wait for their own retries.
        c.scheduler.breaker.failure_ratio = 2.0;
    })
    .await;
    let failing = rig.jobs(
        100,
        "/fail/1000",
        json!({"backoff_min_delay_ms": 20_000, "ttl_ms": 600_000}),
    );
    rig.submit(failing).await;
    wait_for(
        Duration::from_secs(10),
        "the cached jobs tried once",
        || async { rig.sink.total() >= 40 },
    )
    .await;
    let started = Instant::now();
    let healthy = rig.submit(rig.jobs(30, "/ok", json!({}))).await;
    wait_for(
        Duration::from_secs(15),
        "the healthy jobs delivered",
        || async { rig.sink.ok_total() >= 30 },
    )
    .await;
    let took = started.elapsed();
    println!(
        "30 jobs resting beside a cache full of another endpoint's retries: delivered in {took:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "delivered before the failing jobs' first retries: {took:?}"
    );
    let per_job = rig.sink.per_job();
    for job in &healthy.jobs {
        assert_eq!(per_job.get(&job.id), Some(&1));
    }
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert!(metric_value(&text, "spindle_jobs_cached") <= 40.0);
    assert!(metric_value(&text, "spindle_jobs_evicted_total") >= 1.0);
    // Nothing was lost: once the healthy jobs' outcomes are written, every failing job is
    // still open (cached or resting), and only those.
    wait_for(Duration::from_secs(10), "100 jobs open", || async {
        rig.reader.open_work().await.unwrap().len() == 100
    })
    .await;
    rig.stop().await;
}
