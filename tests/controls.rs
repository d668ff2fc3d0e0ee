//! Endpoint and bucket controls: set with the `spindle endpoints` command against Consul (the
//! in-repo double), applied by a running Director within seconds.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// Runs `spindle endpoints <args>` against the agent at `consul`, returning its stdout.
fn endpoints(consul: &str, args: &[&str]) -> String {
    let mut all = vec!["endpoints"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--consul-addr", consul]);
    procs::run_ok(&all)
}

/// Waits until the Director's metric `name` (with its labels) reads `value`.
async fn wait_metric(rig: &Rig, name: &str, value: f64) {
    wait_for(Duration::from_secs(10), name, || async {
        metric_value(&metrics_text(&rig.client, &rig.base()).await, name) == value
    })
    .await;
}

/// Jobs the sink has seen at `path`.
fn seen(rig: &Rig, path: &str) -> usize {
    rig.sink
        .received()
        .iter()
        .filter(|r| r.path == path)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_caps_reach_a_running_director() {
    let consul = ConsulUnderTest::start().await;
    let client = consul.client.clone();
    let rig = Rig::start("controls", |c| c.controls = Some(client)).await;
    let addr = consul.client.address().to_owned();

    // Pause an endpoint (with a query string: controls go by the URL without it) and a bucket.
    let paused_url = rig.sink.url("/status/201");
    endpoints(
        &addr,
        &[
            "pause",
            "--endpoint",
            &format!("{paused_url}?v=1"),
            "--by",
            "test",
        ],
    );
    endpoints(&addr, &["pause", "--bucket", "quiet"]);
    let listed = endpoints(&addr, &["list"]);
    assert!(
        listed.contains(&paused_url) && listed.contains("quiet"),
        "{listed}"
    );
    // The Director has them in force once its gauges say so.
    wait_metric(&rig, r#"spindle_controls{target="endpoint"}"#, 1.0).await;
    wait_metric(&rig, r#"spindle_controls{target="bucket"}"#, 1.0).await;
    rig.submit(rig.jobs(10, "/status/201", json!({}))).await;
    let quiet: Vec<_> = (0..10)
        .map(|_| json!({"bucket": "quiet", "endpoint": rig.sink.url("/status/202")}))
        .collect();
    rig.submit(quiet).await;
    rig.submit(rig.jobs(10, "/ok", json!({}))).await;
    wait_for(Duration::from_secs(10), "the unpaused jobs", || async {
        seen(&rig, "/ok") == 10
    })
    .await;
    // Both held groups are queued (the gauges count them), and not one request went out.
    wait_metric(&rig, r#"spindle_jobs_queued{class="paused"}"#, 10.0).await;
    wait_metric(&rig, r#"spindle_jobs_queued{class="bucket_paused"}"#, 10.0).await;
    assert_eq!(seen(&rig, "/status/201"), 0, "a paused endpoint was called");
    // The Director reports the paused endpoint with its queue (the CLI reads the same API).
    let health = procs::run_ok(&["endpoints", "health", "--api", &rig.base()]);
    let line = health
        .lines()
        .find(|l| l.contains(&paused_url))
        .unwrap_or_else(|| panic!("{health}"));
    assert!(
        line.contains("paused") && line.split_whitespace().nth(1) == Some("10"),
        "{line}"
    );
    assert_eq!(
        seen(&rig, "/status/202"),
        0,
        "a paused bucket's job was sent"
    );

    // Resume both: everything held goes out.
    let resumed = Instant::now();
    endpoints(&addr, &["resume", "--endpoint", &paused_url]);
    endpoints(&addr, &["resume", "--bucket", "quiet"]);
    wait_for(Duration::from_secs(10), "the held jobs", || async {
        seen(&rig, "/status/201") == 10 && seen(&rig, "/status/202") == 10
    })
    .await;
    println!(
        "held jobs delivered {:.2} s after resume",
        resumed.elapsed().as_secs_f64()
    );
    assert!(
        endpoints(&addr, &["list"]).lines().count() == 1,
        "resume left controls behind"
    );

    // A concurrency cap of 2 on an endpoint that answers in 200 ms: 12 jobs take ≥ 1.2 s.
    let slow = rig.sink.url("/slow/200");
    endpoints(&addr, &["limit", "--endpoint", &slow, "--concurrency", "2"]);
    // A rate cap of 5/s: 15 jobs take ≥ 2 s (a burst of 5, then 5 a second).
    let paced = rig.sink.url("/status/203");
    endpoints(&addr, &["limit", "--endpoint", &paced, "--per-second", "5"]);
    wait_metric(&rig, r#"spindle_controls{target="endpoint"}"#, 2.0).await;
    let started = Instant::now();
    rig.submit(rig.jobs(12, "/slow/200", json!({}))).await;
    rig.submit(rig.jobs(15, "/status/203", json!({}))).await;
    wait_for(Duration::from_secs(15), "the capped jobs", || async {
        seen(&rig, "/slow/200") == 12 && seen(&rig, "/status/203") == 15
    })
    .await;
    let arrivals = |path: &str| arrivals_at(&rig.sink, path, started);
    let slow_at = arrivals("/slow/200");
    // At most 2 requests start within any 200 ms (each holds its slot that long).
    let most_in_200ms = slow_at
        .iter()
        .map(|t| {
            slow_at
                .iter()
                .filter(|u| **u >= *t && **u < *t + Duration::from_millis(190))
                .count()
        })
        .max()
        .unwrap();
    let paced_at = arrivals("/status/203");
    let paced_span = *paced_at.last().unwrap() - paced_at[0];
    println!(
        "concurrency 2: most requests started within 190 ms {most_in_200ms}, 12 took {:.2} s; rate 5/s: 15 took {:.2} s",
        (*slow_at.last().unwrap() - slow_at[0]).as_secs_f64(),
        paced_span.as_secs_f64()
    );
    assert!(
        most_in_200ms <= 2,
        "{most_in_200ms} requests at once under a cap of 2"
    );
    assert!(
        paced_span >= Duration::from_millis(1800),
        "15 requests at 5/s in {paced_span:?}"
    );
    rig.stop().await;
}
