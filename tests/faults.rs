//! The fault suite: runs alone with `cargo test --test faults -- --nocapture` (see
//! docs/testing.md). After each scenario it checks that every acknowledged job reached a final
//! state, nothing was invented, each history is ordered and legal, and it prints one summary
//! row: scenario, accepted, final, lost, invented, duplicate deliveries, recovery time.
//!
//! Scenarios elsewhere in the suite, not repeated here: `kill -9` mid-delivery (`crash.rs`),
//! SIGSTOP past the session TTL and Consul faults (`cluster.rs`).

mod common;

use common::mariadb::PrivateMariaDb;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use spindle::director::{self, DirectorConfig};
use spindle::job::{JobId, State};
use spindle::jobdb::JobDb;
use spindle::metrics::Metrics;
use spindle::registry::lease::{consul_lock, LockTiming};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One row of the summary table.
fn report(
    scenario: &str,
    accepted: usize,
    final_: usize,
    invented: usize,
    duplicates: usize,
    recovery: Option<Duration>,
) {
    let lost = accepted - final_.min(accepted);
    println!(
        "| {scenario} | {accepted} | {final_} | {lost} | {invented} | {duplicates} | {} |",
        recovery.map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
    );
    assert_eq!(lost, 0, "{scenario}: jobs lost");
    assert_eq!(invented, 0, "{scenario}: jobs invented");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_killed_and_restarted_under_load() {
    let mut mariadb = PrivateMariaDb::start();
    let consul = ConsulUnderTest::start().await;
    let sink = spindle::cli::sink::Sink::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url: spindle::jobdb::JobDbUrl = mariadb.url("spindle_fault").parse().unwrap();
    let timing = LockTiming {
        ttl: consul.ttl,
        lock_delay: Duration::from_millis(500),
    };
    let lease = consul_lock(&consul.client, &consul.key("jobdb"), b"f", "faults", timing)
        .await
        .unwrap()
        .unwrap();
    let mut config = DirectorConfig::new("127.0.0.1:0".parse().unwrap(), url.clone());
    config.delivery.allow_subnets = vec!["127.0.0.0/8".parse().unwrap()];
    let director = director::start_owned(config, lease, Arc::new(Metrics::default()), None)
        .await
        .unwrap();
    let base = base(&director);

    // Producers: 60 batches of 100 jobs to an endpoint that takes 20 ms, each request allowed
    // 60 s (a producer facing a database outage waits or is told 503).
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let refused = Arc::new(AtomicUsize::new(0));
    let producers: Vec<_> = (0..4)
        .map(|_| {
            let (client, next, acked, refused) =
                (client.clone(), next.clone(), acked.clone(), refused.clone());
            let (url, endpoint) = (format!("{base}/v1/jobs"), sink.url("/slow/20"));
            tokio::spawn(async move {
                loop {
                    if next.fetch_add(1, Ordering::SeqCst) >= 60 {
                        return;
                    }
                    let jobs: Vec<_> = (0..100)
                        .map(|i| json!({"bucket": format!("t{}", i % 4), "endpoint": endpoint}))
                        .collect();
                    match client
                        .post(&url)
                        .json(&json!({ "jobs": jobs }))
                        .send()
                        .await
                    {
                        Ok(r) if r.status().as_u16() == 202 => {
                            let body: spindle::rpc::api::SubmitReply = r.json().await.unwrap();
                            acked
                                .lock()
                                .unwrap()
                                .extend(body.jobs.into_iter().map(|j| j.id));
                        }
                        Ok(r) => {
                            assert_eq!(
                                r.status().as_u16(),
                                503,
                                "only 503 while the database is down"
                            );
                            refused.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("submit failed: {e}"),
                    }
                }
            })
        })
        .collect();

    wait_for(Duration::from_secs(30), "load under way", || async {
        acked.lock().unwrap().len() >= 1500
    })
    .await;
    mariadb.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let restarted = Instant::now();
    mariadb.restart();
    let accepted_before = acked.lock().unwrap().len();
    wait_for(Duration::from_secs(60), "intake to resume", || async {
        acked.lock().unwrap().len() > accepted_before
    })
    .await;
    let recovery = restarted.elapsed();
    for p in producers {
        p.await.unwrap();
    }

    let acked: Vec<JobId> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|id| id.parse().unwrap())
        .collect();
    let reader = JobDb::open(&url, false, 2).await.unwrap();
    wait_all_final(&reader, acked.len() as u64, Duration::from_secs(120)).await;
    let histories = histories(&reader).await;
    let final_ = acked
        .iter()
        .filter(|id| {
            histories
                .get(id)
                .and_then(|h| h.last())
                .is_some_and(|t| t.state == State::Succeeded)
        })
        .count();
    for history in histories.values() {
        assert_legal(history);
    }
    let known: HashSet<String> = histories.keys().map(|id| id.to_string()).collect();
    let per_job = sink.per_job();
    let invented = per_job.keys().filter(|id| !known.contains(*id)).count();
    let duplicates: usize = per_job
        .values()
        .map(|n| (*n as usize).saturating_sub(1))
        .sum();
    println!(
        "faults: mariadb restart: {} jobs acknowledged, {} submissions refused with 503 during the outage, {} stored",
        acked.len(),
        refused.load(Ordering::SeqCst),
        histories.len()
    );
    report(
        "MariaDB killed and restarted under load",
        acked.len(),
        final_,
        invented,
        duplicates,
        Some(recovery),
    );

    director.shutdown();
    director.wait().await.unwrap();
    reader.close().await;
    sink.stop().await;
    consul.stop().await;
}

/// An endpoint that misbehaves at the TCP and HTTP level, by path and attempt number:
/// `/reset` resets the connection on attempts 1-2; `/trickle` sends its whole answer, status
/// line first, one byte every 200 ms on attempt 1; `/slow-body` answers 200 at once and then
/// trickles the body; `/endless` streams a body forever; `/gone` answers 410.
async fn misbehaving_endpoint() -> (u16, Arc<Mutex<HashMap<String, usize>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(Mutex::new(HashMap::new()));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut byte).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&byte[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_lowercase();
                let path = text.split_whitespace().nth(1).unwrap_or("").to_owned();
                let attempt: u32 = text
                    .lines()
                    .find_map(|l| l.strip_prefix("spindle-attempt:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                *counter.lock().unwrap().entry(path.clone()).or_insert(0) += 1;
                match path.as_str() {
                    "/reset" if attempt <= 2 => {
                        let _ = socket.set_zero_linger();
                        drop(socket);
                    }
                    "/trickle" if attempt <= 1 => {
                        for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n" {
                            if socket.write_all(&[*byte]).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                    "/slow-body" => {
                        let _ = socket
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
                            .await;
                        for _ in 0..100 {
                            if socket.write_all(b"x").await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                    "/endless" => {
                        let _ = socket
                            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                            .await;
                        let chunk = format!("{:x}\r\n{}\r\n", 16384, "y".repeat(16384));
                        while socket.write_all(chunk.as_bytes()).await.is_ok() {}
                    }
                    "/gone" => {
                        let _ = socket.write_all(b"HTTP/1.1 410 Gone\r\ncontent-length: 4\r\nconnection: close\r\n\r\ngone").await;
                    }
                    _ => {
                        let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
                    }
                }
            });
        }
    });
    (port, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_that_reset_trickle_stream_forever_or_are_gone() {
    let rig = Rig::start("endpoints", |_| {}).await;
    let (port, hits) = misbehaving_endpoint().await;
    let at = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let cases = [
        ("/reset", State::Succeeded, 3),
        ("/trickle", State::Succeeded, 2),
        ("/endless", State::Succeeded, 1),
        // The status line decides: a 200 whose body is slower than the deadline was delivered.
        ("/slow-body", State::Succeeded, 1),
        ("/gone", State::Discarded, 1),
    ];
    let jobs: Vec<_> = cases
        .iter()
        .flat_map(|(path, _, _)| {
            (0..5).map(move |_| json!({"bucket": "b", "endpoint": at(path), "execution_timeout_ms": 500, "backoff_min_delay_ms": 100}))
        })
        .collect();
    let started = Instant::now();
    let reply = rig.submit(jobs).await;
    wait_all_final(&rig.reader, 25, Duration::from_secs(30)).await;
    let took = started.elapsed();
    let histories = histories(&rig.reader).await;
    let mut final_ = 0;
    for (i, job) in reply.jobs.iter().enumerate() {
        let (path, state, attempts) = cases[i / 5];
        let history = &histories[&job.id.parse().unwrap()];
        assert_legal(history);
        let last = history.last().unwrap();
        assert_eq!(
            (last.state, last.attempts),
            (state, attempts),
            "{path}: {history:#?}"
        );
        final_ += 1;
        if path == "/trickle" {
            assert_eq!(
                history[2].error_type.as_deref(),
                Some("timeout"),
                "{history:#?}"
            );
        }
        if path == "/reset" {
            assert!(
                matches!(
                    history[2].error_type.as_deref(),
                    Some("request" | "connect")
                ),
                "{history:#?}"
            );
        }
    }
    let hits = hits.lock().unwrap().clone();
    assert_eq!(hits.get("/gone"), Some(&5), "410 is not retried");
    report(
        "endpoints: reset, byte-by-byte past the timeout, slow body, endless body, 410",
        25,
        final_,
        0,
        0,
        Some(took),
    );
    rig.stop().await;
}
