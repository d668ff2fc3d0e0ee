//! Isolation: an endpoint that hangs until every attempt times out must not slow the delivery
//! of a healthy endpoint. Measures the healthy endpoint's submit-to-delivery p99 with and
//! without the hanging one, and asserts they stay close.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use spindle::cli::sink::Sink;

/// Submits 20 healthy jobs every 50 ms for `run`, then returns each job's submit-to-delivery
/// latency once all arrived.
async fn healthy_latencies(
    client: &reqwest::Client,
    base: &str,
    sink: &Sink,
    bucket: &str,
    run: Duration,
) -> Vec<Duration> {
    steady_latencies(client, base, sink, Duration::from_millis(50), run, || {
        (0..20)
            .map(|_| json!({"bucket": bucket, "endpoint": sink.url("/ok")}))
            .collect()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_endpoint_does_not_slow_a_healthy_one() {
    let db = TestDb::new("isolation");
    let sink = Sink::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let director = start_director(&db, |c| {
        c.scheduler.per_endpoint = 16;
        c.scheduler.shutdown_grace = Duration::from_secs(3);
    })
    .await;
    let client = reqwest::Client::new();
    let base = base(&director);
    let run = Duration::from_secs(3);

    let mut baseline = healthy_latencies(&client, &base, &sink, "calm", run).await;

    // A noisy tenant whose endpoint never answers: every attempt runs into its 1 s timeout and
    // is retried 100 ms later, so its lane is always full.
    let hanging: Vec<_> = (0..400)
        .map(|_| json!({"bucket": "noisy", "endpoint": sink.url("/hang"), "execution_timeout_ms": 1000, "backoff_min_delay_ms": 100, "backoff_coefficient": 1.0}))
        .collect();
    for chunk in hanging.chunks(200) {
        submit(&client, &base, chunk.to_vec()).await;
    }
    wait_for(
        Duration::from_secs(5),
        "the hanging endpoint to fill its slots",
        || async { sink.received().iter().filter(|r| r.path == "/hang").count() >= 16 },
    )
    .await;
    let mut with_hang = healthy_latencies(&client, &base, &sink, "calm-2", run).await;
    let hang_requests = sink.received().iter().filter(|r| r.path == "/hang").count();

    let (b50, b99) = (
        percentile_ms(&mut baseline, 0.5),
        percentile_ms(&mut baseline, 0.99),
    );
    let (h50, h99) = (
        percentile_ms(&mut with_hang, 0.5),
        percentile_ms(&mut with_hang, 0.99),
    );
    println!(
        "isolation: healthy endpoint submit-to-delivery latency, alone: p50 {b50:.1} ms p99 {b99:.1} ms ({} jobs); \
         beside a hanging endpoint: p50 {h50:.1} ms p99 {h99:.1} ms ({} jobs); hanging endpoint got {hang_requests} requests",
        baseline.len(),
        with_hang.len()
    );
    assert!(
        h99 <= 3.0 * b99 + 50.0,
        "healthy p99 {h99:.1} ms beside the hang vs {b99:.1} ms alone"
    );
    // The hanging lane never held more than its 16 slots at once.
    assert!(
        hang_requests <= 16 * (run.as_secs() as usize + 8),
        "{hang_requests} requests to the hanging endpoint"
    );

    director.shutdown();
    director.wait().await.unwrap();
    sink.stop().await;
}
