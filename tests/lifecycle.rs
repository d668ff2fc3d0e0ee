//! The JobDB lifecycle with real parts: Directors, the manager and the drainer as processes of
//! the `spindle` binary, coordinated through the in-repo Consul double, on the machine's
//! MariaDB, archiving to a real S3-compatible server (moto) read back with boto3.
//!
//! - JobDBs cycle under load and every accepted job ends in exactly one final state, counted
//!   over every JobDB still there plus the archive; dropped databases are gone; intake never
//!   stops (the longest submit latency is printed).
//! - A drainer killed with SIGKILL at random points converges without loss or duplicates.
//! - While S3 fails, expired jobs stay `archiving`; none is `archived` without its object.
//! - A standby manager takes over when the active one is killed.
//!
//! Longer runs: `SPINDLE_LIFECYCLE_SCALE=10 cargo test --release --test lifecycle -- --nocapture`
//! (the 50,000-job, 3-minute cycling run is `cycling_run_long`, `--ignored`).

mod common;
#[path = "lifecycle/moves.rs"]
mod moves;
#[path = "lifecycle/ordering.rs"]
mod ordering;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::procs::Proc;
use common::s3::Mode;
use common::*;
use serde_json::{json, Value};
use spindle::archive::BatchKind;
use spindle::cli::sink::Sink;
use spindle::job::{JobId, State};
use spindle::jobdb::JobDb;
use spindle::registry::inventory::JobDbState;

fn scale() -> usize {
    std::env::var("SPINDLE_LIFECYCLE_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// Consul, S3 and a sink; each test starts its own processes and JobDBs, dropped at the end.
async fn start() -> Cluster {
    Cluster::builder("lc")
        .s3()
        .director_args("--shutdown-grace-ms 5000")
        .start()
        .await
}

/// Submits `jobs` to any of `bases` until one takes them; returns ids and the latency.
async fn submit_anywhere(
    client: &reqwest::Client,
    bases: &[String],
    start: usize,
    jobs: &[Value],
) -> (Vec<JobId>, Duration) {
    let began = Instant::now();
    for round in 0..200 {
        let base = &bases[(start + round) % bases.len()];
        let response = client
            .post(format!("{base}/v1/jobs"))
            .json(&json!({ "jobs": jobs }))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        if let Ok(r) = response {
            if r.status() == reqwest::StatusCode::ACCEPTED {
                let body: Value = r.json().await.unwrap();
                let ids = body["jobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|j| j["id"].as_str().unwrap().parse().unwrap())
                    .collect();
                return (ids, began.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no director took a submission for 200 rounds");
}

struct Load {
    accepted: HashSet<JobId>,
    submits: usize,
    longest: Duration,
}

/// Submits batches for `duration` across the Directors: 60% to an endpoint that answers at
/// once, 25% to one that fails 30% of attempts, 5% to one that is down for `outage` from the
/// start (its jobs retry across JobDB cycles, are moved, and succeed once it is back), 5% to
/// one that stays down (they expire to the archive), 5% to one that refuses (discarded).
async fn load(
    life: &Cluster,
    bases: Vec<String>,
    duration: Duration,
    per_second: usize,
    outage: Duration,
) -> Load {
    let batch = 50;
    let every = Duration::from_secs_f64(batch as f64 / per_second as f64);
    let mut out = Load {
        accepted: HashSet::new(),
        submits: 0,
        longest: Duration::ZERO,
    };
    let back_at = chrono::Utc::now().timestamp_millis() + outage.as_millis() as i64;
    let down = format!("/down-until/{back_at}");
    let started = Instant::now();
    let mut next = Instant::now();
    let mut i = 0usize;
    while started.elapsed() < duration {
        let jobs: Vec<Value> = (0..batch)
            .map(|k| {
                let n = (i * batch + k) % 20;
                let (path, ttl) = match n {
                    0..=11 => ("/ok", 600_000),
                    12..=16 => ("/flaky/30", 600_000),
                    17 => (down.as_str(), 600_000),
                    18 => ("/status/503", 4_000),
                    _ => ("/status/400", 600_000),
                };
                json!({"bucket": format!("b{}", n % 4), "endpoint": life.sink.url(path),
                       "backoff_min_delay_ms": 300, "backoff_coefficient": 1.5, "ttl_ms": ttl})
            })
            .collect();
        let (ids, took) = submit_anywhere(&life.client, &bases, i, &jobs).await;
        out.accepted.extend(ids);
        out.longest = out.longest.max(took);
        out.submits += 1;
        i += 1;
        next += every;
        tokio::time::sleep_until(next.into()).await;
    }
    out
}

async fn cycling_run(
    duration: Duration,
    per_second: usize,
    max_age_s: u64,
    min_cycles: usize,
    outage: Duration,
) {
    let life = start().await;
    let mut manager = life.manager("m1", max_age_s, 2);
    let mut drainer = life.drainer("dr1");
    wait_for(Duration::from_secs(30), "spares created", || async {
        life.in_state(JobDbState::Spare).await >= 2
    })
    .await;
    let mut directors = vec![life.director("d1"), life.director("d2")];
    let bases: Vec<String> = directors.iter().map(Proc::base).collect();
    life.wait_ready(&directors).await;

    let load = load(&life, bases.clone(), duration, per_second, outage).await;
    println!(
        "lifecycle: {} jobs accepted in {} submits over {:.0} s; longest submit {:.0} ms",
        load.accepted.len(),
        load.submits,
        duration.as_secs_f64(),
        load.longest.as_secs_f64() * 1000.0
    );
    // Let every job end: retries finish or expire, retired JobDBs drain and drop.
    let settle = Instant::now();
    let mut census = life.census().await;
    while census.finals.values().filter(|f| !f.is_empty()).count() < load.accepted.len()
        && settle.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_secs(2)).await;
        census = life.census().await;
    }
    let by_state = census.assert_exactly_once(&load.accepted);
    let listed = life.inventory.list().await.unwrap();
    let dropped: Vec<&str> = listed
        .iter()
        .filter(|l| l.record.state == JobDbState::Dropped)
        .map(|l| l.record.name.as_str())
        .collect();
    let existing = life.databases().await;
    for name in &dropped {
        assert!(
            !existing.contains(*name),
            "dropped jobdb {name} still exists"
        );
    }
    println!(
        "lifecycle: final states {by_state:?}; jobdbs dropped {} (cycles), inventory {:?}",
        dropped.len(),
        listed
            .iter()
            .map(|l| (l.record.name.clone(), l.record.state))
            .collect::<Vec<_>>()
    );
    assert!(
        dropped.len() >= min_cycles,
        "only {} jobdbs cycled",
        dropped.len()
    );
    println!(
        "lifecycle: {} jobs were moved out of a retired jobdb at least once",
        census.moved.len()
    );
    assert!(
        !census.moved.is_empty(),
        "the outage left jobs retrying across a cycle"
    );
    // The manager and the drainer report what they did on /metrics, in a form promtool reads.
    let manager_metrics = metrics_text(&life.client, &manager.base()).await;
    let drainer_metrics = metrics_text(&life.client, &drainer.base()).await;
    promtool_accepts(&manager_metrics);
    promtool_accepts(&drainer_metrics);
    let sample = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
    };
    assert_eq!(sample(&manager_metrics, "spindle_manager_active "), 1.0);
    assert!(sample(&manager_metrics, "spindle_jobdbs{state=\"dropped\"} ") >= 1.0);
    assert!(
        sample(
            &manager_metrics,
            "spindle_manager_actions_total{action=\"drop_drained\"} "
        ) >= 1.0
    );
    assert!(sample(&drainer_metrics, "spindle_jobdbs_drained_total ") >= 1.0);
    assert!(sample(&drainer_metrics, "spindle_jobs_moved_total ") >= 1.0);
    for d in &mut directors {
        d.term().await;
    }
    drainer.term().await;
    manager.term().await;
    life.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobdbs_cycle_under_load_and_every_job_ends_once() {
    let s = scale() as u64;
    cycling_run(
        Duration::from_secs(20 * s),
        150,
        6,
        2,
        Duration::from_secs(10 * s),
    )
    .await;
}

/// The run: ≥ 50,000 jobs over ≥ 3 minutes, retire age 20 s, ≥ 4 cycles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "3-minute run; cargo test --release --test lifecycle -- --ignored --nocapture"]
async fn cycling_run_long() {
    cycling_run(
        Duration::from_secs(190),
        280,
        20,
        4,
        Duration::from_secs(60),
    )
    .await;
}

/// Fills a JobDB as a Director would have left it (`spindle bench --drain`'s fill): `n`
/// jobs to the sink awaiting a retry, `expired_percent` of them expired; their ids, retrying
/// and expired.
async fn fill_retired(
    db: &JobDb,
    sink: &Sink,
    n: usize,
    expired_percent: usize,
) -> (HashSet<JobId>, HashSet<JobId>) {
    let filled = spindle::cli::bench::drain::fill_retired(db, &sink.url("/ok"), n, expired_percent)
        .await
        .expect("filling a retired JobDB");
    (filled.retrying, filled.expired)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drainer_killed_at_random_converges_without_loss_or_duplicates() {
    let n = 6000 * scale();
    let kills = 20;
    let life = start().await;
    let (retired, db) = life.add_jobdb("old", JobDbState::Retiring).await;
    let (live, expired) = fill_retired(&db, &life.sink, n, 10).await;
    let kept = keep_events(&db, 2500).await;
    db.close().await;
    let (spare, _spare_db) = life.add_jobdb("new", JobDbState::Spare).await;
    let mut director = life.director("d1");
    life.wait_owned(&spare, "the director on the spare").await;

    let started = Instant::now();
    for k in 0..kills {
        let mut drainer = life.drainer(&format!("dr{k}"));
        let pause = 150 + (ulid::Ulid::new().random() % 1200) as u64;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        drainer.kill9().await;
    }
    let mut drainer = life.drainer("dr-final");
    life.wait_drained(&retired, Duration::from_secs(120)).await;
    println!(
        "drainer: {} jobs ({} live, {} expired) drained through {kills} kill -9s in {:.1} s",
        n,
        live.len(),
        expired.len(),
        started.elapsed().as_secs_f64()
    );

    // In the retired JobDB: every job moved or archived, once.
    let old = life.open(&retired).await;
    let old_histories = histories(&old).await;
    assert_eq!(old_histories.len(), n);
    for (id, history) in &old_histories {
        assert_legal(history);
        let last = history.last().unwrap().state;
        if expired.contains(id) {
            assert_eq!(last, State::Archived, "{id}");
        } else {
            assert_eq!(last, State::Moved, "{id}");
        }
    }
    // In the live JobDB: each moved job exactly once (one job row; the primary key), and
    // nothing else.
    let new = life.open(&spare).await;
    let present = new
        .existing_jobs(&live.iter().copied().collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(present.len(), live.len(), "every live job imported");
    assert_eq!(
        new.count_jobs().await.unwrap(),
        live.len() as u64,
        "nothing else imported"
    );
    for id in live.iter().take(50) {
        assert_eq!(
            new.origin_of(*id).await.unwrap().as_deref(),
            Some(retired.as_str())
        );
    }
    // In the archive: each expired job in exactly one object; every moved job's old history.
    let census = life.census().await;
    for id in &expired {
        let kinds = &census.archived_copies[id];
        assert_eq!(
            kinds.iter().filter(|k| **k == BatchKind::Expired).count(),
            1,
            "{id}"
        );
    }
    for id in &live {
        let kinds = census.archived_copies.get(id).cloned().unwrap_or_default();
        assert_eq!(
            kinds.iter().filter(|k| **k == BatchKind::History).count(),
            1,
            "{id}"
        );
    }
    // Events kept without a job: each in the archive once (they are not moved).
    let mut archived = Vec::new();
    for key in life.archive().event_objects(Some(&retired)).await.unwrap() {
        let events = life.archive().read_events(&key).await.unwrap();
        archived.extend(events.into_iter().map(|e| e.event_id));
    }
    archived.sort();
    assert_eq!(archived, kept, "every kept event archived once");
    old.close().await;
    new.close().await;
    drainer.term().await;
    director.term().await;
    life.stop().await;
}

/// Writes `n` events kept without a job (published when nothing subscribed) into `db`;
/// returns their ids, sorted.
async fn keep_events(db: &JobDb, n: usize) -> Vec<String> {
    let token = db.take_ownership("test").await.unwrap();
    let mut gen = ulid::Generator::new();
    let events: Vec<spindle::job::EventRecord> = (0..n)
        .map(|i| spindle::job::EventRecord {
            id: gen.generate().unwrap(),
            bucket: "b0".into(),
            event_type: "x.y".into(),
            created_at: chrono::Utc::now(),
            envelope: format!(
                "{{\"type\":\"x.y\",\"timestamp\":\"2026-11-29T00:00:00Z\",\"data\":{i}}}"
            )
            .into(),
        })
        .collect();
    for chunk in events.chunks(500) {
        let append = spindle::jobdb::Append {
            events: chunk,
            ..Default::default()
        };
        db.append_all(token, &append).await.unwrap();
    }
    let mut ids: Vec<String> = events.iter().map(|e| e.id.to_string()).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_s3_fails_expired_jobs_stay_archiving() {
    let life = start().await;
    let (jobdb, _db) = life.add_jobdb("s3", JobDbState::Spare).await;
    let mut director = life.director("d1");
    life.wait_owned(&jobdb, "the director").await;
    let reader = life.open(&jobdb).await;
    let n = 300;
    for mode in [Mode::Error503, Mode::Down] {
        life.s3().set_mode(mode);
        let jobs: Vec<Value> = (0..n)
            .map(|i| {
                json!({"bucket": "b", "endpoint": life.sink.url("/status/503"), "ttl_ms": 1000 + i,
                            "backoff_min_delay_ms": 200})
            })
            .collect();
        let base = director.base();
        submit_anywhere(&life.client, &[base], 0, &jobs).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let counts = reader.count_by_state().await.unwrap();
        assert_eq!(
            counts.get(&State::Archived),
            None,
            "{mode:?}: archived without an object: {counts:?}"
        );
        assert!(
            counts.get(&State::Archiving).copied().unwrap_or(0) > 0,
            "{mode:?}: {counts:?}"
        );
        let metrics = metrics_text(&life.client, &director.base()).await;
        let failures: f64 = metrics
            .lines()
            .find(|l| l.starts_with("spindle_archive_upload_failures_total "))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(failures > 0.0, "{mode:?}: uploads are being retried");
        // Straight to moto, past the failing proxy: nothing was stored.
        let stored = common::s3::boto3_keys(&life.s3().moto_endpoint(), life.bucket()).await;
        assert!(stored.is_empty(), "{mode:?}: objects stored: {stored:?}");
    }
    life.s3().set_mode(Mode::Pass);
    wait_all_final(&reader, 2 * n as u64, Duration::from_secs(60)).await;
    let counts = reader.count_by_state().await.unwrap();
    assert_eq!(
        counts.get(&State::Archived),
        Some(&(2 * n as u64)),
        "{counts:?}"
    );
    // Read back with an independent client: every job in exactly one object.
    let dump = common::s3::boto3_dump(&life.s3().moto_endpoint(), life.bucket()).await;
    let mut seen = HashMap::<String, usize>::new();
    for (key, value) in &dump {
        if key.ends_with(".ndjson.gz") {
            for line in value["records"].as_array().unwrap() {
                *seen
                    .entry(line["id"].as_str().unwrap().to_owned())
                    .or_default() += 1;
            }
        }
    }
    assert_eq!(seen.len(), 2 * n, "objects hold every job");
    assert!(seen.values().all(|c| *c == 1), "no job in two objects");
    reader.close().await;
    director.term().await;
    life.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_manager_takes_over_within_the_lock_bound() {
    let life = start().await;
    let mut first = life.manager("m1", 3600, 1);
    wait_for(
        Duration::from_secs(20),
        "the first manager's spare",
        || async { life.in_state(JobDbState::Spare).await > 0 },
    )
    .await;
    let _standby = life.manager("m2", 3600, 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        life.in_state(JobDbState::Spare).await,
        1,
        "the standby does nothing"
    );
    first.kill9().await;
    let killed = Instant::now();
    let holder = || async {
        life.consul
            .client
            .kv_get(
                spindle::manager::LOCK_KEY,
                spindle::registry::consul::ReadOptions::default(),
            )
            .await
            .unwrap()
            .value
            .filter(|e| e.session.is_some())
            .map(|e| String::from_utf8_lossy(&e.value).into_owned())
    };
    wait_for(
        Duration::from_secs(20),
        "the standby to hold the lock",
        || async { holder().await.as_deref() == Some("m2") },
    )
    .await;
    let locked = killed.elapsed();
    wait_for(Duration::from_secs(20), "the standby to manage", || async {
        life.in_state(JobDbState::Spare).await >= 2
    })
    .await;
    let acted = killed.elapsed();
    // Consul frees a dead session's lock within 2×TTL, then the lock-delay runs; a standby
    // tries every second.
    let bound = Duration::from_millis(2 * 1000 + 500 + 1000 + 500);
    println!(
        "manager: standby held the lock {:.2} s and created its first spare {:.2} s after kill -9 \
         (lock bound 2×TTL + lock-delay + retry = {:.1} s)",
        locked.as_secs_f64(),
        acted.as_secs_f64(),
        bound.as_secs_f64()
    );
    assert!(locked <= bound, "takeover took {locked:?}");
    life.stop().await;
}
