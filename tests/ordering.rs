//! Ordered delivery per key (`ordering_key`): the jobs of one (bucket, endpoint, key) reach
//! the endpoint one at a time, in the order they were accepted, across a restart; a key whose
//! job keeps failing holds only its own later jobs; a job that asked to block its key stops it
//! until an operator releases it. Against a real Director, MariaDB and SQLite, real HTTP over
//! loopback (the cluster case, through a router with a kill -9, a retirement and a drain, is
//! in `tests/lifecycle.rs`).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use spindle::job::State;
use spindle::sink::Received;

on_both_engines!(
    ordered_keys_go_one_at_a_time_in_acceptance_order_across_a_restart,
    a_blocking_failure_holds_its_key_until_an_operator_releases_it,
);

fn fast_retries(c: &mut spindle::director::DirectorConfig) {
    c.scheduler.min_retry_delay = Duration::from_millis(10);
}

/// An ordered job to `url` of key `key`, numbered `i`, with more fields from `extra`.
fn ordered(url: &str, key: &str, i: usize, extra: Value) -> Value {
    let mut job = json!({"bucket": "o", "endpoint": url, "ordering_key": key,
        "backoff_min_delay_ms": 10, "backoff_coefficient": 1.0, "payload": {"key": key, "i": i}});
    job.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    job
}

/// For each key, the position in its sequence of every request the sink received for it, in
/// arrival order, with the status answered.
fn arrivals(
    log: &[Received],
    place: &HashMap<String, (String, usize)>,
) -> HashMap<String, Vec<(usize, u16)>> {
    let mut out: HashMap<String, Vec<(usize, u16)>> = HashMap::new();
    for r in log {
        if let Some((key, i)) = place.get(&r.job_id) {
            out.entry(key.clone()).or_default().push((*i, r.status));
        }
    }
    out
}

async fn ordered_keys_go_one_at_a_time_in_acceptance_order_across_a_restart(engine: Engine) {
    const KEYS: usize = 4;
    const PER_KEY: usize = 60;
    let mut rig = Rig::start_on(engine, "ordered", fast_retries).await;
    let url = rig.sink.url("/flaky/30");
    let mut jobs = Vec::new();
    let mut keys = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            let key = format!("k{k}");
            jobs.push(ordered(&url, &key, i, json!({})));
            keys.push((key, i));
        }
    }
    // A key whose first job fails for good (it holds its own sequence only), and unordered
    // jobs on the same URL.
    for i in 0..3 {
        let extra = match i {
            // Backing off as jobs do: a tight loop of 503s would open the endpoint's breaker
            // (the endpoint would look down), which is not what this shows.
            0 => json!({"headers": {"x-sink-status": "503"}, "backoff_min_delay_ms": 200,
                        "backoff_coefficient": 2.0}),
            _ => json!({}),
        };
        jobs.push(ordered(&url, "stuck", i, extra));
        keys.push(("stuck".into(), i));
    }
    let free = 40;
    for _ in 0..free {
        jobs.push(json!({"bucket": "o", "endpoint": url, "backoff_min_delay_ms": 10, "backoff_coefficient": 1.0}));
    }
    let mut place = HashMap::new();
    let mut n = 0;
    for chunk in jobs.chunks(37) {
        let reply = rig.submit(chunk.to_vec()).await;
        for job in reply.jobs {
            if let Some(k) = keys.get(n) {
                place.insert(job.id, k.clone());
            }
            n += 1;
        }
    }
    // Halfway through, the Director stops and another takes the JobDB: the order is the
    // JobDB's, not the process's.
    wait_for(
        Duration::from_secs(60),
        "half the ordered jobs delivered",
        || async {
            let ok = rig
                .sink
                .received()
                .iter()
                .filter(|r| r.status == 200)
                .count();
            ok >= KEYS * PER_KEY / 2
        },
    )
    .await;
    rig.stop_director().await;
    rig.restart_director(fast_retries).await;
    rig.wait_in_state(
        State::Succeeded,
        (KEYS * PER_KEY + free) as u64,
        Duration::from_secs(120),
    )
    .await;
    let seen = arrivals(&rig.sink.received(), &place);
    for k in 0..KEYS {
        let key = format!("k{k}");
        assert_one_at_a_time(&key, &seen[&key], PER_KEY);
    }
    let stuck = &seen["stuck"];
    assert!(
        stuck.iter().all(|(i, status)| *i == 0 && *status == 503),
        "a failing job holds its key's later jobs: {stuck:?}"
    );
    let counts = rig.reader.ordering_counts().await.unwrap();
    assert_eq!(counts.held, 2, "the stuck key's two later jobs wait");
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert!(metric_value(&text, "spindle_ordered_released_total") >= (KEYS * PER_KEY / 2) as f64);
    rig.stop().await;
}

async fn a_blocking_failure_holds_its_key_until_an_operator_releases_it(engine: Engine) {
    let rig = Rig::start_on(engine, "orderblock", fast_retries).await;
    let url = rig.sink.url("/flaky/0");
    let refused = json!({"headers": {"x-sink-status": "400"}});
    let jobs = vec![
        ordered(
            &url,
            "blocks",
            0,
            json!({"headers": {"x-sink-status": "400"}, "ordering_failure": "block"}),
        ),
        ordered(&url, "blocks", 1, json!({})),
        ordered(&url, "blocks", 2, json!({})),
        ordered(&url, "releases", 0, refused),
        ordered(&url, "releases", 1, json!({})),
    ];
    let reply = rig.submit(jobs).await;
    let ids: Vec<String> = reply.jobs.iter().map(|j| j.id.clone()).collect();
    rig.wait_in_state(State::Discarded, 2, Duration::from_secs(30))
        .await;
    rig.wait_in_state(State::Succeeded, 1, Duration::from_secs(30))
        .await;
    // Longer than a sweep: nothing releases a blocked key by itself.
    tokio::time::sleep(spindle::director::sequencer::SWEEP_EVERY + Duration::from_secs(1)).await;
    let per_job = rig.sink.per_job();
    assert_eq!(
        per_job.get(&ids[4]),
        Some(&1),
        "a releasing failure lets the next go"
    );
    assert!(!per_job.contains_key(&ids[1]) && !per_job.contains_key(&ids[2]));
    let counts = rig.reader.ordering_counts().await.unwrap();
    assert_eq!((counts.held, counts.blocked), (2, 1));
    // The operator's release: the row goes, and the key goes on in order.
    operator_sql(&rig.reader, "DELETE FROM ordering_blocked").await;
    rig.wait_in_state(State::Succeeded, 3, Duration::from_secs(20))
        .await;
    let log = rig.sink.received();
    let at = |id: &str| log.iter().position(|r| r.job_id == id).unwrap();
    assert!(at(&ids[1]) < at(&ids[2]));
    assert_eq!(
        rig.reader.ordering_counts().await.unwrap(),
        Default::default()
    );
    rig.stop().await;
}
