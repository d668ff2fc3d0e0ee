//! Crash: `kill -9` a Director process in the middle of a load of 12,000 jobs, restart it,
//! and check that every acknowledged job reaches a terminal state, nothing was invented, no
//! request went out without its `executing` row, and that duplicate deliveries happened only
//! for attempts in flight at the crash. On MySQL and on SQLite (`::mysql`, `::sqlite`).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use spindle::cli::sink::Sink;
use spindle::job::{JobId, State};
use tokio::process::{Child, Command};

const BATCHES: usize = 120;
const BATCH: usize = 100;

fn spawn_director(port: u16, jobdb: &str) -> Child {
    spawn_director_with(port, jobdb, &[])
}

/// A Director for the load below without a circuit breaker. After the restart, most requests
/// to the flaky endpoint are the first that reach it (fresh jobs, and attempts the kill
/// interrupted before they were sent), so more than 80% fail and the breaker rightly judges it
/// down: it then gets one probe at a time, up to 30 s apart, and its 2,000 waiting jobs did
/// not all end within the two minutes allowed (seen under load). What this test checks is what
/// the kill loses, not the breaker.
fn spawn_loaded_director(port: u16, jobdb: &str) -> Child {
    spawn_director_with(port, jobdb, &["--breaker-failure-ratio", "2"])
}

fn spawn_director_with(port: u16, jobdb: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args([
            "director",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--jobdb",
            jobdb,
            "--log",
            "warn",
            "--allow-subnet",
            "127.0.0.0/8",
        ])
        .args(extra)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn director")
}

async fn wait_ready(client: &reqwest::Client, base: &str) {
    wait_for(Duration::from_secs(30), "director ready", || async {
        matches!(client.get(format!("{base}/readyz")).send().await, Ok(r) if r.status().is_success())
    })
    .await;
}

/// Producers that submit batches until the batches run out or the Director stops answering.
fn produce(
    client: &reqwest::Client,
    base: &str,
    sink: &Sink,
    next: &Arc<AtomicUsize>,
    acked: &Arc<Mutex<Vec<String>>>,
    unacked: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4)
        .map(|_| {
            let (client, url, next, acked, unacked) =
                (client.clone(), format!("{base}/v1/jobs"), next.clone(), acked.clone(), unacked.clone());
            let (slow, flaky) = (sink.url("/slow/5"), sink.url("/fail/1"));
            tokio::spawn(async move {
                loop {
                    let b = next.fetch_add(1, Ordering::SeqCst);
                    if b >= BATCHES {
                        return;
                    }
                    let jobs: Vec<_> = (0..BATCH)
                        .map(|i| {
                            let endpoint = if i % 5 == 0 { &flaky } else { &slow };
                            json!({"bucket": format!("t{}", i % 7), "endpoint": endpoint, "backoff_min_delay_ms": 300})
                        })
                        .collect();
                    let reply = client.post(&url).json(&json!({ "jobs": jobs })).send().await;
                    match reply {
                        Ok(r) if r.status().as_u16() == 202 => {
                            let body: spindle::rpc::api::SubmitReply = r.json().await.expect("reply");
                            acked.lock().unwrap().extend(body.jobs.into_iter().map(|j| j.id));
                        }
                        _ => {
                            // The Director died under this request: it may or may not be stored.
                            unacked.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            })
        })
        .collect()
}

on_both_engines!(
    kill_9_mid_load_loses_nothing,
    a_kill_9_after_an_idle_moment_loses_nothing,
    a_kill_9_keeps_a_job_born_released_ahead_of_its_key
);

async fn kill_9_mid_load_loses_nothing(engine: Engine) {
    let db = TestDb::on(engine, "crash");
    let sink = Sink::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let unacked = Arc::new(AtomicUsize::new(0));

    let mut director = spawn_loaded_director(port, &db.url_string());
    wait_ready(&client, &base).await;
    let producers = produce(&client, &base, &sink, &next, &acked, &unacked);
    wait_for(
        Duration::from_secs(60),
        "half the load accepted",
        || async { acked.lock().unwrap().len() >= BATCHES * BATCH / 2 },
    )
    .await;
    director.start_kill().expect("kill -9");
    director.wait().await.unwrap();
    let killed_at = Instant::now();
    for p in producers {
        p.await.unwrap();
    }
    let delivered_before = sink.total();

    // Restart on the same JobDB, then submit the rest of the load.
    let mut director = spawn_loaded_director(port, &db.url_string());
    wait_ready(&client, &base).await;
    let recovery = killed_at.elapsed();
    for p in produce(&client, &base, &sink, &next, &acked, &unacked) {
        p.await.unwrap();
    }
    let acked: Vec<JobId> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|id| id.parse().unwrap())
        .collect();
    assert!(
        acked.len() >= 10_000,
        "load of at least 10,000 accepted jobs: {}",
        acked.len()
    );

    let reader = db.open().await;
    if let Err(why) =
        try_wait_all_final(&reader, acked.len() as u64, Duration::from_secs(120)).await
    {
        // Say whether the Director still runs and what its scheduler holds.
        let exited = director.try_wait();
        let metrics = match client.get(format!("{base}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("(no metrics: {e})"),
        };
        let held: Vec<&str> = metrics
            .lines()
            .filter(|l| {
                !l.starts_with('#')
                    && [
                        "in_flight",
                        "under_way",
                        "fresh",
                        "cached",
                        "queued",
                        "core_tasks",
                    ]
                    .iter()
                    .any(|k| l.contains(k))
            })
            .collect();
        let endpoints = match client.get(format!("{base}/v1/endpoints")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("(no endpoints: {e})"),
        };
        panic!(
            "{why}; director exited: {exited:?}; its gauges: {held:#?}; its endpoints: {endpoints}"
        );
    }
    let histories = histories(&reader).await;

    // Every acknowledged job is in the JobDB and succeeded, with a legal history.
    for id in &acked {
        let history = histories
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged job {id} lost"));
        assert_eq!(
            history.last().unwrap().state,
            State::Succeeded,
            "{history:#?}"
        );
    }
    for history in histories.values() {
        assert_legal(history);
        assert!(history.last().unwrap().state.is_terminal());
    }

    // Nothing invented, and no request without its executing row.
    let received = sink.received();
    let mut receipts: HashMap<JobId, Vec<u16>> = HashMap::new();
    for r in &received {
        let id: JobId = r.job_id.parse().expect("job id header");
        receipts.entry(id).or_default().push(r.status);
    }
    let mut duplicates = 0;
    let mut interrupted = HashSet::new();
    for (id, history) in &histories {
        if history
            .iter()
            .any(|t| t.error_type.as_deref() == Some("interrupted"))
        {
            interrupted.insert(*id);
        }
    }
    for (id, statuses) in &receipts {
        let history = histories
            .get(id)
            .unwrap_or_else(|| panic!("delivery of unknown job {id}"));
        let executing = history
            .iter()
            .filter(|t| t.state == State::Executing)
            .count();
        assert!(
            statuses.len() <= executing,
            "{id}: {} requests, {executing} executing rows",
            statuses.len()
        );
        let successes = statuses.iter().filter(|s| **s == 200).count();
        if successes > 1 {
            duplicates += successes - 1;
            assert!(
                interrupted.contains(id),
                "{id} delivered twice without an interrupted attempt"
            );
        }
    }
    println!(
        "crash ({engine:?}): accepted {} jobs ({} unacknowledged batches at the kill), {} jobs in the jobdb, all terminal; \
         {} requests before the kill, {} after; {} attempts interrupted by the kill; {} duplicate deliveries; \
         restart to ready in {:.2} s",
        acked.len(),
        unacked.load(Ordering::SeqCst),
        histories.len(),
        delivered_before,
        received.len() as u64 - delivered_before,
        interrupted.len(),
        duplicates,
        recovery.as_secs_f64()
    );
    assert!(duplicates <= interrupted.len());

    sigterm(&director);
    let status = director.wait().await.unwrap();
    assert!(status.success(), "SIGTERM exits 0: {status}");
    reader.close().await;
    sink.stop().await;
}

/// Jobs accepted into an idle JobDB (nothing else open, the checkpoint due) and still waiting
/// for their first attempt when the Director is killed: the commit that accepted them is their
/// only record, and the new owner must find it. The first version of schema 5's writer moved
/// the checkpoint past that very commit, and these jobs were never delivered.
async fn a_kill_9_after_an_idle_moment_loses_nothing(engine: Engine) {
    let db = TestDb::on(engine, "idlecrash");
    let sink = Sink::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = procs::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    // One request at a time to the slow endpoint: the others wait, accepted and never tried.
    let mut director =
        spawn_director_with(port, &db.url_string(), &["--endpoint-concurrency", "1"]);
    wait_ready(&client, &base).await;
    // Idle for longer than the checkpoint's period.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let jobs: Vec<_> = (0..40)
        .map(|i| json!({"bucket": format!("t{}", i % 3), "endpoint": sink.url("/slow/2000")}))
        .collect();
    let accepted = submit(&client, &base, jobs).await.jobs.len();
    assert_eq!(accepted, 40);
    tokio::time::sleep(Duration::from_millis(300)).await;
    director.start_kill().expect("kill -9");
    director.wait().await.unwrap();
    let mut director = spawn_director(port, &db.url_string());
    wait_ready(&client, &base).await;
    let reader = db.open().await;
    wait_all_final(&reader, 40, Duration::from_secs(60)).await;
    let histories = histories(&reader).await;
    assert_eq!(histories.len(), 40);
    for history in histories.values() {
        assert_legal(history);
        assert_eq!(
            history.last().unwrap().state,
            State::Succeeded,
            "{history:#?}"
        );
    }
    sigterm(&director);
    director.wait().await.unwrap();
    reader.close().await;
    sink.stop().await;
}

/// Alone, a key's first job is born released: fresh, with no `open_jobs` entry, as an
/// unordered job is (its writer knows its key is under way), and the later ones are kept in
/// the writer's memory, fresh too. Killed while the first job's attempt is in flight, the
/// Director leaves all three listed only by their commit's log row; the next owner finds them
/// there with their key and enters them held, and its sequencer releases them one at a time
/// by position, so the key's later jobs still wait for the first.
async fn a_kill_9_keeps_a_job_born_released_ahead_of_its_key(engine: Engine) {
    let db = TestDb::on(engine, "borncrash");
    let sink = Sink::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = procs::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    // Fresh for the whole test: no entry until the kill.
    let slow = ["--rest-after-ms", "3600000"];
    let mut director = spawn_director_with(port, &db.url_string(), &slow);
    wait_ready(&client, &base).await;
    let jobs: Vec<_> = (0..3)
        .map(|i| {
            json!({"bucket": "o", "endpoint": sink.url("/slow/1500"), "ordering_key": "k",
                        "payload": {"i": i}})
        })
        .collect();
    let ids: Vec<JobId> = submit(&client, &base, jobs)
        .await
        .jobs
        .iter()
        .map(|j| j.id.parse().unwrap())
        .collect();
    let reader = db.open().await;
    assert!(
        reader.ordered_entries().await.unwrap().is_empty(),
        "the first job is under way and the later two are kept: none has an entry"
    );
    let unlisted = reader.load_stranded().await.unwrap().unlisted;
    for id in &ids {
        assert!(
            unlisted.iter().any(|(u, place)| u == id && place.is_some()),
            "its log row lists {id}, with its key: {unlisted:?}"
        );
    }
    let counts = reader.ordering_counts().await.unwrap();
    assert_eq!(
        counts.held, 2,
        "the dashboard counts the kept two as waiting"
    );
    // Its attempt is under way (1.5 s) when the Director dies.
    tokio::time::sleep(Duration::from_millis(300)).await;
    director.start_kill().expect("kill -9");
    director.wait().await.unwrap();
    let mut director = spawn_director_with(port, &db.url_string(), &slow);
    wait_ready(&client, &base).await;
    wait_all_final(&reader, 3, Duration::from_secs(30)).await;
    // Each job's attempt takes 1.5 s and may start only once the one before has ended: had
    // the second gone while the first was under way, both would end within moments.
    let histories = histories(&reader).await;
    let ended: Vec<_> = ids
        .iter()
        .map(|id| {
            let history = &histories[id];
            assert_legal(history);
            let last = history.last().unwrap();
            assert_eq!(last.state, State::Succeeded, "{history:#?}");
            last.time
        })
        .collect();
    for pair in ended.windows(2) {
        assert!(
            pair[1] - pair[0] >= chrono::TimeDelta::milliseconds(1400),
            "a job of the key went before the one ahead of it ended: ended at {ended:?}"
        );
    }
    sigterm(&director);
    director.wait().await.unwrap();
    reader.close().await;
    sink.stop().await;
}

fn sigterm(director: &Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(director.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
}
