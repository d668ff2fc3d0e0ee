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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::procs::{skewed_clock, Proc};
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

/// Fills a JobDB as a Director would have left it: `n` jobs awaiting a retry, a tenth of them
/// already expired, some with their attempt in flight.
async fn fill_retired(
    db: &JobDb,
    sink: &Sink,
    n: usize,
    expired_percent: usize,
) -> (HashSet<JobId>, HashSet<JobId>) {
    use spindle::job::{AttemptRecord, Job, RetryPolicy, Transition};
    let token = db.take_ownership("test").await.unwrap();
    let now = chrono::Utc::now();
    let mut next_id = 1u64;
    let (mut live, mut expired) = (HashSet::new(), HashSet::new());
    let mut gen = ulid::Generator::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut jobs = Vec::new();
        let mut rows = Vec::new();
        for &i in chunk {
            let id = JobId(gen.generate().unwrap());
            let past = i % 100 < expired_percent;
            let job = Job {
                id,
                bucket: format!("b{}", i % 3).into(),
                endpoint: sink.url("/ok").into(),
                method: "POST".into(),
                headers: vec![("content-type".into(), "application/json".into())],
                payload: bytes::Bytes::from(format!("{{\"n\":{i}}}")),
                execution_timeout: Duration::from_secs(5),
                retry: RetryPolicy {
                    min_delay: Duration::from_millis(100),
                    coefficient: 2.0,
                },
                created_at: now - chrono::Duration::seconds(60),
                expire_at: if past {
                    now - chrono::Duration::seconds(1)
                } else {
                    now + chrono::Duration::hours(1)
                },
                idempotency_key: None,
                on_complete: None,
                ordering: None,
                event: None,
            };
            let mut push = |t: Transition| {
                rows.push((next_id, t));
                next_id += 1;
            };
            push(Transition::awaiting_scheduling(&job));
            push(Transition::executing(id, 1, now));
            if i % 7 != 3 {
                push(Transition::awaiting_retry(
                    id,
                    1,
                    now,
                    now,
                    AttemptRecord {
                        error_type: Some("status".into()),
                        response_status: Some(503),
                        ..Default::default()
                    },
                ));
            }
            if past {
                expired.insert(id);
            } else {
                live.insert(id);
            }
            jobs.push(Arc::new(job));
        }
        db.append(token, &jobs, &rows).await.unwrap();
    }
    (live, expired)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drainer_killed_at_random_converges_without_loss_or_duplicates() {
    let n = 6000 * scale();
    let kills = 20;
    let life = start().await;
    let (retired, db) = life.add_jobdb("old", JobDbState::Retiring).await;
    let (live, expired) = fill_retired(&db, &life.sink, n, 10).await;
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
    old.close().await;
    new.close().await;
    drainer.term().await;
    director.term().await;
    life.stop().await;
}

/// A job of bucket `b` to `endpoint`, empty, as a test writes it straight into a JobDB.
fn stored_job(
    endpoint: String,
    created_at: chrono::DateTime<chrono::Utc>,
    expire_at: chrono::DateTime<chrono::Utc>,
) -> spindle::job::Job {
    spindle::job::Job {
        id: JobId(ulid::Ulid::new()),
        bucket: "b".into(),
        endpoint: endpoint.into(),
        method: "POST".into(),
        headers: vec![],
        payload: bytes::Bytes::new(),
        execution_timeout: Duration::from_secs(5),
        retry: spindle::job::RetryPolicy {
            min_delay: Duration::from_millis(100),
            coefficient: 2.0,
        },
        created_at,
        expire_at,
        idempotency_key: None,
        on_complete: None,
        ordering: None,
        event: None,
    }
}

/// A retiring JobDB hands its scheduled jobs on with their times: the live Director delivers
/// the one due in seconds at its time, not before, and keeps tomorrow's waiting, untried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retiring_jobdb_hands_scheduled_jobs_on_with_their_times() {
    use spindle::job::{Job, Transition};
    let life = start().await;
    let (retired, db) = life.add_jobdb("sched", JobDbState::Retiring).await;
    let token = db.take_ownership("test").await.unwrap();
    let started = (Instant::now(), chrono::Utc::now());
    let now = started.1;
    let times = [
        now + chrono::Duration::seconds(6),
        now + chrono::Duration::days(1),
    ];
    let jobs: Vec<Arc<Job>> = times
        .iter()
        .map(|at| {
            Arc::new(stored_job(
                life.sink.url("/ok"),
                now,
                *at + chrono::Duration::hours(1),
            ))
        })
        .collect();
    let rows: Vec<(u64, Transition)> = jobs
        .iter()
        .zip(times)
        .enumerate()
        .map(|(i, (job, at))| (i as u64 + 1, Transition::scheduled(job.id, now, at)))
        .collect();
    db.append(token, &jobs, &rows).await.unwrap();
    db.close().await;
    let (spare, spare_db) = life.add_jobdb("schedto", JobDbState::Spare).await;
    let mut director = life.director("d1");
    life.wait_owned(&spare, "the director on the spare").await;
    let mut drainer = life.drainer("dr");
    life.wait_drained(&retired, Duration::from_secs(60)).await;
    let drained = started.0.elapsed();
    wait_for(
        Duration::from_secs(20),
        "the job due in seconds",
        || async { life.sink.ok_total() >= 1 },
    )
    .await;
    let got = life.sink.received();
    assert_eq!(got.len(), 1, "tomorrow's job waits");
    assert_eq!(got[0].job_id, jobs[0].id.to_string());
    let arrived = got[0].at - started.0;
    println!("drained in {drained:?}; the job due at 6 s arrived at {arrived:?}");
    assert!(drained < Duration::from_secs(6), "drained too late to tell");
    assert!(arrived >= Duration::from_millis(5_950) && arrived < Duration::from_secs(8));
    let open = spare_db.open_work().await.unwrap();
    let tomorrow = open
        .iter()
        .find(|r| r.job_id == jobs[1].id)
        .expect("tomorrow's job is open in the live jobdb");
    assert_eq!(tomorrow.progress.attempts, 0);
    let kept = tomorrow.progress.retry_at.expect("its time") - times[1];
    assert!(
        kept.num_milliseconds().abs() <= 1,
        "moved {kept} off its time"
    );
    drainer.term().await;
    director.term().await;
    life.stop().await;
}

/// Completion notices survive JobDB cycling. In a retiring JobDB, one job asking to be told
/// has expired (the drainer archives it: its notice is written there, with the `archived`
/// row, and moved on like any waiting job) and another waits for its first attempt (it moves
/// with its URL, and the live Director writes its notice when it succeeds). Each notice
/// arrives once, saying how its job ended.
/// Ordered delivery through every failure a cluster survives: 10 keys × `per_key` jobs
/// (100, or 100 × `SPINDLE_LIFECYCLE_SCALE`: 1,000 at scale 10) submitted through a router to
/// three Directors, over an endpoint that fails 30% of attempts; meanwhile one Director is
/// killed with SIGKILL (and restarted, as a supervisor would) and another's JobDB retires and
/// is drained. Every key's requests reach the endpoint one job at a time, in acceptance (id)
/// order, and every job succeeds exactly once. Prints the run's throughput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_keys_keep_their_order_through_a_router_a_kill_9_a_retirement_and_a_drain() {
    const KEYS: usize = 10;
    const PER_REQUEST: usize = 5;
    let per_key = 100 * scale();
    let life = start().await;
    for i in 0..5 {
        life.add_jobdb(&format!("o{i}"), JobDbState::Spare).await;
    }
    let fast = ["--min-retry-delay-ms", "20"];
    let mut directors: Vec<Proc> = (0..3)
        .map(|i| life.director_with(&format!("d{i}"), &fast))
        .collect();
    let mut drainer = life.drainer("dr");
    let mut router = life.spawn_router(3, &[]);
    let held = || async {
        life.inventory
            .list()
            .await
            .unwrap()
            .iter()
            .filter(|l| l.holder.is_some() && l.record.state == JobDbState::Active)
            .count()
    };
    wait_for(
        Duration::from_secs(30),
        "three directors on their jobdbs",
        || async { held().await == 3 },
    )
    .await;
    let router_base = router.base();
    life.wait_ready([&router]).await;

    // The producer: requests of five jobs per key, one after another, each job with its own
    // idempotency key. A job whose answer was lost or not final is submitted again under the
    // same key, so a job stored without an answer is answered `duplicate` with its id and
    // keeps its place in its key's order.
    let url = life.sink.url("/flaky/30");
    let started = Instant::now();
    let producer = {
        let (client, base, url) = (life.client.clone(), router_base.clone(), url.clone());
        tokio::spawn(async move {
            let mut accepted: HashMap<String, Vec<JobId>> = HashMap::new();
            // Per key, the jobs not yet answered `accepted` or `duplicate`, oldest first.
            let mut owed: Vec<Vec<usize>> = vec![(0..per_key).collect(); KEYS];
            // A key whose earlier submission cannot be settled (answered `pending` for ever)
            // fails the test instead of hanging it.
            let deadline = Instant::now() + Duration::from_secs(600);
            let mut last_answer = String::new();
            while owed.iter().any(|n| !n.is_empty()) {
                assert!(
                    Instant::now() < deadline,
                    "jobs still unsettled after 600 s: {:?}; last answer: {last_answer}",
                    owed.iter().map(Vec::len).collect::<Vec<_>>()
                );
                let mut jobs = Vec::new();
                for (k, nths) in owed.iter().enumerate() {
                    for nth in nths.iter().take(PER_REQUEST) {
                        jobs.push(json!({"bucket": "ord", "endpoint": url,
                            "ordering_key": format!("k{k}"), "backoff_min_delay_ms": 20,
                            "idempotency_key": format!("k{k}-{nth}"),
                            "backoff_coefficient": 1.5, "ttl_ms": 3_600_000}));
                    }
                }
                let reply = client
                    .post(format!("{base}/v1/jobs"))
                    .json(&json!({ "jobs": jobs }))
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await;
                if let Ok(r) = reply {
                    if r.status() == reqwest::StatusCode::ACCEPTED {
                        let body: Value = r.json().await.unwrap();
                        for (job, sent) in body["jobs"].as_array().unwrap().iter().zip(&jobs) {
                            if job["status"] != "accepted" && job["status"] != "duplicate" {
                                last_answer = job.to_string();
                            } else {
                                let key = sent["ordering_key"].as_str().unwrap().to_owned();
                                let k: usize = key[1..].parse().unwrap();
                                let nth: usize = sent["idempotency_key"].as_str().unwrap()
                                    [key.len() + 1..]
                                    .parse()
                                    .unwrap();
                                owed[k].retain(|n| *n != nth);
                                let id = job["id"].as_str().unwrap().parse().unwrap();
                                accepted.entry(key).or_default().push(id);
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            accepted
        })
    };
    let delivered = || {
        life.sink
            .received()
            .iter()
            .filter(|r| r.status == 200)
            .count()
    };
    let total = KEYS * per_key;

    // A quarter through: kill -9 a Director; it comes back under the same id.
    wait_for(Duration::from_secs(120), "a quarter delivered", || async {
        delivered() >= total / 4
    })
    .await;
    directors[0].kill9().await;
    println!(
        "ordering: director d0 killed with {} of {total} delivered",
        delivered()
    );
    directors[0] = life.director_with("d0", &fast);
    // Halfway: a live Director's JobDB retires (it hands off to a spare while the old one
    // finishes its attempts) and is drained, with ordered jobs waiting in it.
    wait_for(Duration::from_secs(120), "half delivered", || async {
        delivered() >= total / 2
    })
    .await;
    // The live JobDB holding the most ordered jobs waiting for their turn.
    let mut busiest = None;
    for l in life.inventory.list().await.unwrap() {
        if l.holder.is_none() || l.record.state != JobDbState::Active {
            continue;
        }
        let db = JobDb::open(&l.record.url.parse().unwrap(), false, 1)
            .await
            .unwrap();
        let waiting = db.ordering_counts().await.unwrap().held;
        db.close().await;
        if busiest.as_ref().is_none_or(|(_, most)| waiting > *most) {
            busiest = Some((l, waiting));
        }
    }
    let (retired, waiting) = busiest.unwrap();
    assert!(waiting > 0, "no live jobdb holds ordered jobs");
    assert!(life
        .inventory
        .set_state(&retired, JobDbState::Retiring, "test")
        .await
        .unwrap());
    println!(
        "ordering: jobdb {} retired with {} of {total} delivered",
        retired.record.name,
        delivered()
    );
    let accepted = producer.await.unwrap();
    life.wait_drained(&retired.record.name, Duration::from_secs(300))
        .await;
    let census = assert_delivered_in_key_order(&life, &accepted, per_key, &[], 300).await;
    let took = started.elapsed();
    let log = life.sink.received();
    println!(
        "ordering: {total} ordered jobs ({KEYS} keys) delivered in order in {:.1} s: {:.0} jobs/s, {} requests ({} moved by the drain)",
        took.as_secs_f64(),
        total as f64 / took.as_secs_f64(),
        log.len(),
        census.moved.len()
    );
    assert!(!census.moved.is_empty(), "the drain moved ordered jobs");
    router.term().await;
    for d in &mut directors {
        d.term().await;
    }
    drainer.term().await;
    life.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_notices_are_moved_and_told_across_a_drain() {
    use spindle::job::{Job, Transition};
    let life = start().await;
    let (retired, db) = life.add_jobdb("told", JobDbState::Retiring).await;
    let token = db.take_ownership("test").await.unwrap();
    let now = chrono::Utc::now();
    let job = |expire_at| {
        Arc::new(Job {
            on_complete: Some(life.sink.url("/capture").into()),
            ..stored_job(
                life.sink.url("/ok"),
                now - chrono::Duration::minutes(10),
                expire_at,
            )
        })
    };
    let expired = job(now - chrono::Duration::minutes(1));
    let waiting = job(now + chrono::Duration::hours(1));
    let jobs = vec![expired.clone(), waiting.clone()];
    let rows: Vec<(u64, Transition)> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (i as u64 + 1, Transition::awaiting_scheduling(j)))
        .collect();
    db.append(token, &jobs, &rows).await.unwrap();
    assert_eq!(db.notices_owed().await.unwrap(), 2);
    db.close().await;
    let (spare, _spare_db) = life.add_jobdb("toldto", JobDbState::Spare).await;
    let mut director = life.director("d1");
    life.wait_owned(&spare, "the director on the spare").await;
    let mut drainer = life.drainer("dr");
    life.wait_drained(&retired, Duration::from_secs(60)).await;
    let captured = || {
        life.sink
            .received()
            .into_iter()
            .filter(|r| r.path == "/capture")
            .collect::<Vec<_>>()
    };
    wait_for(Duration::from_secs(20), "both notices", || async {
        captured().len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut told: HashMap<String, String> = HashMap::new();
    for r in captured() {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let id = body["job_id"].as_str().unwrap().to_owned();
        let state = body["state"].as_str().unwrap().to_owned();
        assert!(told.insert(id, state).is_none(), "one notice per job");
    }
    assert_eq!(told.len(), 2);
    // Expiry is the end: told at `archiving`, not when the archive confirms its copy.
    assert_eq!(told[&expired.id.to_string()], "archiving");
    assert_eq!(told[&waiting.id.to_string()], "succeeded");
    drainer.term().await;
    director.term().await;
    life.stop().await;
}

/// A job accepted once is never discarded because of where it is being moved. A retiring JobDB
/// holds 40 ordinary jobs and three odd ones: a bucket of 128 two-byte characters (once a valid
/// submission and an invalid import: both paths now share one validation, so it moves), a
/// 100 KiB payload (accepted by a Director with the default 1 MiB limit), and an `ftp://`
/// endpoint (an older version's row: no Director of this version can take it). The only live
/// Director runs with `--max-payload-bytes 65536`: it refuses the big job (413). Before, that
/// job ended `discarded`/`import-refused` like the invalid one. Now the drainer parks only the
/// invalid job (with why), keeps the big one waiting in the retired JobDB (a `move-refused`
/// row, counted, tried again with backoff, the JobDB not drained), and once a Director with
/// default limits comes, moves it there: it is delivered exactly once and the drain ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_live_director_refuses_waits_for_one_that_takes_it() {
    use spindle::job::{Job, RetryPolicy, Transition};
    let life = start().await;
    let (retired, db) = life.add_jobdb("refusing", JobDbState::Retiring).await;
    let (live, _) = fill_retired(&db, &life.sink, 40, 0).await;
    let now = chrono::Utc::now();
    let odd = |bucket: &str, endpoint: String, payload: Vec<u8>| Job {
        id: JobId(ulid::Ulid::new()),
        bucket: bucket.into(),
        endpoint: endpoint.into(),
        method: "POST".into(),
        headers: vec![("content-type".into(), "application/octet-stream".into())],
        payload: bytes::Bytes::from(payload),
        execution_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            min_delay: Duration::from_millis(100),
            coefficient: 2.0,
        },
        created_at: now,
        expire_at: now + chrono::Duration::hours(1),
        idempotency_key: None,
        on_complete: None,
        ordering: None,
        event: None,
    };
    let wide = odd(&"é".repeat(128), life.sink.url("/ok"), b"{}".to_vec());
    let big = odd("b1", life.sink.url("/ok"), vec![b'x'; 100 * 1024]);
    let invalid = odd("b1", "ftp://files.example/up".into(), b"{}".to_vec());
    let (token, _) = db.owner().await.unwrap();
    let odd_ones = [&wide, &big, &invalid];
    let rows: Vec<(u64, Transition)> = odd_ones
        .iter()
        .enumerate()
        .map(|(i, job)| {
            (
                1_000_000 + i as u64,
                Transition::imported(job.id, 1, now, now),
            )
        })
        .collect();
    let jobs: Vec<Arc<Job>> = odd_ones.iter().map(|j| Arc::new((*j).clone())).collect();
    db.append(token, &jobs, &rows).await.unwrap();
    db.close().await;
    let (small, _small_db) = life.add_jobdb("small", JobDbState::Spare).await;
    let mut strict = life.director_with("d1", &["--max-payload-bytes", "65536"]);
    life.wait_owned(&small, "the strict director on its spare")
        .await;
    let mut drainer = life.drainer("dr");
    let old = life.open(&retired).await;

    // The target has answered for both odd jobs.
    wait_for(Duration::from_secs(60), "both refusals taken", || async {
        let h = histories(&old).await;
        let answered = |id: &JobId| {
            h.get(id).and_then(|h| h.last()).is_some_and(|t| {
                t.state.is_terminal() || t.error_type.as_deref() == Some("move-refused")
            })
        };
        answered(&big.id) && answered(&invalid.id)
    })
    .await;
    let last = histories(&old).await[&big.id].last().cloned().unwrap();
    assert_eq!(
        (last.state, last.error_type.as_deref()),
        (State::AwaitingRetry, Some("move-refused")),
        "the job the target refused for its own limit: {last:?}"
    );
    // It waits: refused (413) again and again, with its answer in a row, counted.
    let refusals = |text: &str, reason: &str| {
        metric_value(
            text,
            &format!("spindle_import_refusals_total{{reason=\"{reason}\"}}"),
        )
    };
    wait_for(
        Duration::from_secs(60),
        "the big job refused three times",
        || async {
            refusals(
                &metrics_text(&life.client, &drainer.base()).await,
                "target_limit",
            ) >= 3.0
        },
    )
    .await;
    let text = metrics_text(&life.client, &drainer.base()).await;
    assert_eq!(refusals(&text, "invalid"), 1.0, "{text}");
    assert_eq!(
        metric_value(
            &text,
            &format!("spindle_jobs_waiting_for_target{{jobdb=\"{retired}\"}}")
        ),
        1.0,
        "{text}"
    );
    let h = histories(&old).await;
    for id in live.iter().chain([&wide.id]) {
        assert_eq!(h[id].last().unwrap().state, State::Moved, "{id}");
    }
    let waiting = h[&big.id].last().unwrap();
    assert_legal(&h[&big.id]);
    assert_eq!(waiting.state, State::AwaitingRetry);
    assert_eq!(waiting.error_type.as_deref(), Some("move-refused"));
    let answer = String::from_utf8_lossy(waiting.error_response.as_deref().unwrap());
    assert!(
        answer.contains(&small) && answer.contains("413"),
        "{answer}"
    );
    println!("waiting: {answer}");
    // One row per answer, however often it is heard.
    let rows = h[&big.id]
        .iter()
        .filter(|t| t.error_type.as_deref() == Some("move-refused"))
        .count();
    assert_eq!(rows, 1);
    // The job no Director of this version can take is parked, saying why.
    let parked = h[&invalid.id].last().unwrap();
    assert_legal(&h[&invalid.id]);
    assert_eq!(parked.state, State::Discarded);
    assert_eq!(parked.error_type.as_deref(), Some("import-refused"));
    let why = String::from_utf8_lossy(parked.error_response.as_deref().unwrap());
    assert!(
        why.contains("no director of this version") && why.contains("endpoint"),
        "{why}"
    );
    println!("parked: {why}");
    // Not drained while a job waits (the manager would drop it).
    let state = life
        .inventory
        .get(&retired)
        .await
        .unwrap()
        .unwrap()
        .record
        .state;
    assert_eq!(state, JobDbState::Draining);

    // A Director with the default limits comes: the job moves there and is delivered once.
    let (roomy, roomy_db) = life.add_jobdb("roomy", JobDbState::Spare).await;
    let mut director = life.director("d2");
    life.wait_owned(&roomy, "the second director on its spare")
        .await;
    life.wait_drained(&retired, Duration::from_secs(90)).await;
    let h = histories(&old).await;
    assert_eq!(h[&big.id].last().unwrap().state, State::Moved);
    assert_legal(&h[&big.id]);
    assert_eq!(
        roomy_db.origin_of(big.id).await.unwrap().as_deref(),
        Some(retired.as_str())
    );
    let big_id = big.id.to_string();
    wait_for(Duration::from_secs(30), "the big job delivered", || async {
        life.sink.per_job().get(&big_id).copied().unwrap_or(0) >= 1
    })
    .await;
    let delivered = life.sink.received();
    let copies = delivered.iter().filter(|r| r.job_id == big_id).count();
    assert_eq!(copies, 1, "delivered exactly once");
    let text = metrics_text(&life.client, &drainer.base()).await;
    assert!(
        !text.contains(&format!(
            "spindle_jobs_waiting_for_target{{jobdb=\"{retired}\"}}"
        )),
        "{text}"
    );
    old.close().await;
    roomy_db.close().await;
    drainer.term().await;
    director.term().await;
    strict.term().await;
    life.stop().await;
}

/// A target whose request limit is below a batch refuses the batch without naming a job (413,
/// `body`). The drainer then sends its jobs one request each; those were not recorded `moved`
/// before, so the whole batch went again, was refused again, and the drain never ended. Now
/// each job that goes through alone is recorded at once and the drain ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_director_with_a_small_request_limit_takes_a_batch_one_job_at_a_time() {
    let life = start().await;
    let (retired, db) = life.add_jobdb("batchy", JobDbState::Retiring).await;
    let (live, _) = fill_retired(&db, &life.sink, 30, 0).await;
    db.close().await;
    let (spare, _spare_db) = life.add_jobdb("narrow", JobDbState::Spare).await;
    let mut director = life.director_with("d1", &["--max-request-bytes", "4096"]);
    life.wait_owned(&spare, "the director on the spare").await;
    let mut drainer = life.drainer("dr");
    life.wait_drained(&retired, Duration::from_secs(60)).await;
    let old = life.open(&retired).await;
    let h = histories(&old).await;
    for id in &live {
        assert_eq!(h[id].last().unwrap().state, State::Moved, "{id}");
        assert_legal(&h[id]);
    }
    let text = metrics_text(&life.client, &drainer.base()).await;
    assert_eq!(
        metric_value(&text, "spindle_jobs_moved_total"),
        30.0,
        "{text}"
    );
    old.close().await;
    drainer.term().await;
    director.term().await;
    life.stop().await;
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

/// Benchmark (on demand): drain a JobDB of `SPINDLE_DRAIN_JOBS` jobs (default 50,000), of
/// which `SPINDLE_DRAIN_EXPIRED_PERCENT` (default 10) expired, into one live Director; prints
/// the drain time, moves per second and the archive's throughput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; cargo test --release --test lifecycle drain_benchmark -- --ignored --nocapture"]
async fn drain_benchmark() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env("SPINDLE_DRAIN_JOBS", 50_000);
    let expired_percent = env("SPINDLE_DRAIN_EXPIRED_PERCENT", 10);
    let life = start().await;
    let (retired, db) = life.add_jobdb("old", JobDbState::Spare).await;
    let filled = Instant::now();
    let (live, expired) = fill_retired(&db, &life.sink, n, expired_percent).await;
    println!(
        "drain bench: filled {n} jobs in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let (spare, _spare_db) = life.add_jobdb("new", JobDbState::Spare).await;
    let mut director = life.director("d1");
    wait_for(Duration::from_secs(20), "the director", || async {
        let listed = life.inventory.list().await.unwrap();
        listed.iter().any(|l| l.holder.is_some())
    })
    .await;
    // The director took one of the two; the other is the one to drain.
    let listed = life.inventory.list().await.unwrap();
    let to_drain = listed.iter().find(|l| l.holder.is_none()).unwrap().clone();
    let _ = (&retired, &spare);
    assert!(life
        .inventory
        .set_state(&to_drain, JobDbState::Retiring, "bench")
        .await
        .unwrap());
    let started = Instant::now();
    let mut drainer = life.drainer("dr");
    life.wait_drained(&to_drain.record.name, Duration::from_secs(1800))
        .await;
    let took = started.elapsed().as_secs_f64();
    let manifests = life.archive().manifests(None).await.unwrap();
    let jobs: u64 = manifests.iter().map(|m| m.jobs).sum();
    let compressed: u64 = manifests.iter().map(|m| m.compressed_bytes).sum();
    let raw: u64 = manifests.iter().map(|m| m.uncompressed_bytes).sum();
    println!(
        "drain bench: {n} jobs ({} retrying moved, {} expired archived) drained in {took:.1} s: \
         {:.0} jobs/s; archive wrote {jobs} job records in {} objects, {:.1} MB raw / {:.1} MB \
         gzip: {:.0} records/s, {:.1} MB/s raw",
        live.len(),
        expired.len(),
        n as f64 / took,
        manifests.len(),
        raw as f64 / 1e6,
        compressed as f64 / 1e6,
        jobs as f64 / took,
        raw as f64 / 1e6 / took,
    );
    drainer.term().await;
    director.term().await;
    db.close().await;
    life.stop().await;
}

/// Benchmark (on demand): what a DROP of a retired JobDB replaces. Two JobDBs of
/// `SPINDLE_DROP_JOBS` jobs (default 1,000,000) and three transitions each; one is emptied
/// with the DELETEs a purge would run (10,000 rows per statement), the other dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; cargo test --release --test lifecycle drop_versus_delete -- --ignored --nocapture"]
async fn drop_versus_delete() {
    let n: usize = std::env::var("SPINDLE_DROP_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let life = start().await;
    let mut timings = Vec::new();
    for tag in ["del", "drop"] {
        let (_, db) = life.add_jobdb(tag, JobDbState::Spare).await;
        let filled = Instant::now();
        fill_retired(&db, &life.sink, n, 0).await;
        println!(
            "drop bench: filled {tag} with {n} jobs in {:.1} s",
            filled.elapsed().as_secs_f64()
        );
        let started = Instant::now();
        if tag == "del" {
            db.delete_all_in_chunks(10_000).await.unwrap();
        } else {
            db.close().await;
            spindle::jobdb::drop_database(db.url()).await.unwrap();
        }
        timings.push((tag, started.elapsed().as_secs_f64()));
    }
    println!(
        "drop bench: {n} jobs + {} transitions: DELETE {:.2} s, DROP {:.3} s",
        // fill_retired leaves every seventh job executing (two rows), the others three.
        2 * n + (0..n).filter(|i| i % 7 != 3).count(),
        timings[0].1,
        timings[1].1
    );
    life.stop().await;
}

/// A key's order is the order its jobs were accepted, whatever the clocks of the routers
/// that named them: a producer alternates two routers, one 5 s ahead, waiting for each answer
/// before the next job. The ahead router's job ids sort after the other's; ordering by id (as
/// schema 8 did) would send every job of the accurate router first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_keeps_acceptance_order_when_a_router_clock_is_skewed() {
    const JOBS: usize = 24;
    let life = start().await;
    life.add_jobdb("skew", JobDbState::Spare).await;
    let mut director = life.director("d0");
    let skew = skewed_clock("+5s");
    let skew: Vec<(&str, &str)> = skew.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut routers = [life.spawn_router(1, &skew), life.spawn_router(1, &[])];
    for router in &routers {
        life.wait_ready([router]).await;
    }
    // A slow endpoint, so most jobs wait for their turn while later ones arrive.
    let url = life.sink.url("/slow/50");
    let mut order = Vec::new();
    for i in 0..JOBS {
        let base = routers[i % 2].base();
        let body = json!({"jobs": [{"bucket": "skew", "endpoint": url, "ordering_key": "k",
                                    "payload": {"i": i}}]});
        let reply: Value = wait_submit(&life.client, &base, &body).await;
        assert_eq!(reply["jobs"][0]["status"], "accepted", "{reply}");
        order.push(reply["jobs"][0]["id"].as_str().unwrap().to_owned());
    }
    let ids: Vec<JobId> = order.iter().map(|id| id.parse().unwrap()).collect();
    let (ahead, accurate) = (ids[0].0.timestamp_ms(), ids[1].0.timestamp_ms());
    assert!(
        ahead > accurate + 3000,
        "the skewed router's ids are ahead: {ahead} vs {accurate}"
    );
    wait_for(Duration::from_secs(60), "every job delivered", || async {
        life.sink.per_job().len() == JOBS
    })
    .await;
    let place: HashMap<String, (String, usize)> = order
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), ("k".to_owned(), i)))
        .collect();
    let seen: Vec<(usize, u16)> = life
        .sink
        .received()
        .iter()
        .filter_map(|r| place.get(&r.job_id).map(|(_, i)| (*i, r.status)))
        .collect();
    assert_one_at_a_time("k", &seen, JOBS);
    for router in &mut routers {
        router.term().await;
    }
    director.term().await;
    life.stop().await;
}

/// Posts `body` to `base`'s `/v1/jobs` until it is answered 202 (a router may still be
/// finding its Directors), and returns the answer.
async fn wait_submit(client: &reqwest::Client, base: &str, body: &Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = client
            .post(format!("{base}/v1/jobs"))
            .json(body)
            .send()
            .await;
        if let Ok(r) = reply {
            if r.status() == reqwest::StatusCode::ACCEPTED {
                return r.json().await.unwrap();
            }
        }
        assert!(Instant::now() < deadline, "no 202 from {base}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `ordering_failure: block` follows its key across JobDBs: a key blocked in a JobDB that
/// retires keeps its later jobs waiting where the drainer moves them (a Director's sequencer
/// reads the draining JobDB's blocks as its own), the block lands in a live JobDB before the
/// retired one is drained, and the key goes on, in order, once an operator deletes it there.
/// (Before, the block was dropped with the retired JobDB and the moved jobs were delivered.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_key_stays_blocked_when_its_jobs_move_to_another_jobdb() {
    let life = start().await;
    let (first, _) = life.add_jobdb("blk1", JobDbState::Spare).await;
    let mut director = life.director_with("d0", &["--min-retry-delay-ms", "20"]);
    life.wait_owned(&first, "the director on its jobdb").await;
    let (second, second_db) = life.add_jobdb("blk2", JobDbState::Spare).await;
    let mut router = life.spawn_router(1, &[]);
    let base = router.base();
    let url = life.sink.url("/flaky/0");
    let job = |i: usize, extra: Value| {
        let mut job = json!({"bucket": "blk", "endpoint": url, "ordering_key": "k",
                             "payload": {"i": i}});
        job.as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap_or_default());
        job
    };
    let body = json!({"jobs": [
        job(0, json!({"ordering_failure": "block", "headers": {"x-sink-status": "400"}})),
        job(1, json!({})),
        job(2, json!({})),
    ]});
    let reply = wait_submit(&life.client, &base, &body).await;
    let ids: Vec<String> = reply["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect();
    let first_db = life.open(&first).await;
    wait_for(Duration::from_secs(20), "the key blocked", || async {
        first_db.ordering_counts().await.unwrap().blocked == 1
    })
    .await;
    first_db.close().await;
    // The JobDB retires: the Director hands off to the spare, a drainer moves the two
    // waiting jobs and carries the block.
    let listed = life.inventory.get(&first).await.unwrap().unwrap();
    assert!(life
        .inventory
        .set_state(&listed, JobDbState::Retiring, "test")
        .await
        .unwrap());
    let mut drainer = life.drainer("dr");
    life.wait_drained(&first, Duration::from_secs(60)).await;
    let counts = second_db.ordering_counts().await.unwrap();
    assert_eq!(
        (counts.held, counts.blocked),
        (2, 1),
        "the moved jobs wait, blocked, in {second}"
    );
    // Longer than a sweep: nothing releases a blocked key by itself.
    tokio::time::sleep(spindle::director::sequencer::SWEEP_EVERY + Duration::from_secs(1)).await;
    let per_job = life.sink.per_job();
    assert!(
        !per_job.contains_key(&ids[1]) && !per_job.contains_key(&ids[2]),
        "a blocked key's jobs were sent after a move: {per_job:?}"
    );
    let blocked = second_db.blocked_keys().await.unwrap();
    assert_eq!(blocked[0].job_id.to_string(), ids[0]);
    assert_eq!(blocked[0].ordering_key, "k");
    operator_sql(&second_db, "DELETE FROM ordering_blocked").await;
    wait_for(Duration::from_secs(20), "the key goes on", || async {
        let per_job = life.sink.per_job();
        per_job.contains_key(&ids[1]) && per_job.contains_key(&ids[2])
    })
    .await;
    let log = life.sink.received();
    let at = |id: &str| log.iter().position(|r| r.job_id == id).unwrap();
    assert!(at(&ids[1]) < at(&ids[2]));
    second_db.close().await;
    router.term().await;
    drainer.term().await;
    director.term().await;
    life.stop().await;
}

/// In a cluster, a Director whose JobDB is the only live one releases ordered jobs in its own
/// commits, as a Director without peers does (a key's first job born released, the next in
/// the commit that ends one: no sequencer round trip); once a second JobDB is live, only jobs
/// its intake cleared against the other JobDB go so (their keys held nowhere else), the
/// others through the sequencer. Every key keeps its order across the change, with its
/// jobs in both JobDBs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_director_alone_releases_in_its_commits_until_a_peer_is_live() {
    const KEYS: usize = 6;
    const PER_REQUEST: usize = 2;
    const PER_KEY: usize = 30;
    let life = start().await;
    for i in 0..2 {
        life.add_jobdb(&format!("a{i}"), JobDbState::Spare).await;
    }
    let fast = ["--min-retry-delay-ms", "20"];
    let mut directors = vec![life.director_with("d0", &fast)];
    let mut router = life.spawn_router(2, &[]);
    let live = || async { life.in_state(JobDbState::Active).await };
    wait_for(Duration::from_secs(30), "d0 on its jobdb", || async {
        live().await == 1
    })
    .await;
    life.wait_ready([&router]).await;
    let base = router.base();
    let url = life.sink.url("/flaky/20");
    // Requests of two jobs per key, one after another: a key's jobs were accepted in the order
    // of their answers.
    let submit = |from: usize, to: usize| {
        let (client, base, url) = (life.client.clone(), base.clone(), url.clone());
        async move {
            let mut accepted: HashMap<String, Vec<JobId>> = HashMap::new();
            for first in (from..to).step_by(PER_REQUEST) {
                let mut jobs = Vec::new();
                for k in 0..KEYS {
                    for nth in first..(first + PER_REQUEST).min(to) {
                        jobs.push(json!({"bucket": "ord", "endpoint": url,
                            "ordering_key": format!("k{k}"), "backoff_min_delay_ms": 20,
                            "idempotency_key": format!("k{k}-{nth}"), "ttl_ms": 3_600_000}));
                    }
                }
                let body: Value =
                    loop {
                        let reply = client
                            .post(format!("{base}/v1/jobs"))
                            .json(&json!({ "jobs": jobs }))
                            .send()
                            .await;
                        if let Ok(r) = reply {
                            if r.status() == reqwest::StatusCode::ACCEPTED {
                                let body: Value = r.json().await.unwrap();
                                if body["jobs"].as_array().unwrap().iter().all(|j| {
                                    j["status"] == "accepted" || j["status"] == "duplicate"
                                }) {
                                    break body;
                                }
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    };
                for (job, sent) in body["jobs"].as_array().unwrap().iter().zip(&jobs) {
                    let key = sent["ordering_key"].as_str().unwrap().to_owned();
                    let id = job["id"].as_str().unwrap().parse().unwrap();
                    let ids: &mut Vec<JobId> = accepted.entry(key).or_default();
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
            accepted
        }
    };
    let mut accepted = submit(0, PER_KEY / 2).await;
    let d0 = &directors[0];
    let alone = d0.metric(&life.client, "spindle_ordered_alone").await;
    let born = d0
        .metric(&life.client, "spindle_ordered_born_total")
        .await
        .unwrap_or(0.0);
    println!("alone in the cluster: spindle_ordered_alone {alone:?}, born released {born}");
    assert_eq!(alone, Some(1.0), "d0's commits found no other live jobdb");
    // Alone, it set its JobDB's fresh mark and bears ordered jobs without an entry.
    assert_eq!(
        d0.metric(&life.client, "spindle_ordered_fresh_marked")
            .await,
        Some(1.0)
    );
    assert_eq!(life.fresh_marks().await, 1, "d0's jobdb is marked");
    assert!(
        born >= KEYS as f64,
        "keys' first jobs were born released: {born}"
    );

    // d0 idle (every job so far delivered, its commits done): nothing makes it list the
    // inventory while the next job is under way, so it still bears fresh when d1 joins.
    let firsts: HashSet<String> = accepted
        .values()
        .flatten()
        .map(|id| id.to_string())
        .collect();
    wait_for(
        Duration::from_secs(60),
        "the first half delivered",
        || async {
            let received = life.sink.received();
            let done: HashSet<&str> = received
                .iter()
                .filter(|r| r.status == 200 && firsts.contains(r.job_id.as_str()))
                .map(|r| r.job_id.as_str())
                .collect();
            done.len() == firsts.len()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A job of key `long` born released on d0 while it is alone, its attempt taking 5 s...
    let long = life.sink.url("/slow/5000");
    let submit_long = |base: String| {
        let (client, long) = (life.client.clone(), long.clone());
        async move {
            let reply: Value = client
                .post(format!("{base}/v1/jobs"))
                .json(&json!({"jobs": [{"bucket": "long", "endpoint": long,
                    "ordering_key": "long", "ttl_ms": 3_600_000}]}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            reply["jobs"][0]["id"].as_str().unwrap().to_owned()
        }
    };
    let first_long = submit_long(directors[0].base()).await;

    // A second Director takes the other spare: two live JobDBs.
    directors.push(life.director_with("d1", &fast));
    wait_for(Duration::from_secs(30), "two live jobdbs", || async {
        live().await == 2
    })
    .await;
    life.wait_ready([&directors[1]]).await;
    // ...and the key's next job, accepted on d1 while the first is under way: d1 must see
    // the first (born fresh under d0's fresh mark: d1's reads of d0 read its fresh jobs, until
    // d0 gives them entries and lifts the mark) and wait for it to end.
    let second_long = submit_long(directors[1].base()).await;
    wait_for(Duration::from_secs(30), "the router sees both", || async {
        match life.client.get(format!("{base}/readyz")).send().await {
            Ok(r) => r.text().await.is_ok_and(|t| t.contains("2 directors")),
            Err(_) => false,
        }
    })
    .await;
    let rest = submit(PER_KEY / 2, PER_KEY).await;
    for (key, ids) in rest {
        accepted.entry(key).or_default().extend(ids);
    }
    wait_for(Duration::from_secs(10), "d0 sees its peer", || async {
        directors[0]
            .metric(&life.client, "spindle_ordered_alone")
            .await
            == Some(0.0)
    })
    .await;
    wait_for(
        Duration::from_secs(20),
        "d0 lifts its fresh mark",
        || async { life.fresh_marks().await == 0 },
    )
    .await;
    // With a peer, new jobs of keys held nowhere else were cleared at intake and went in
    // the commits that stored them; a key whose older jobs wait in the other JobDB was not.
    let mut cleared = 0.0;
    for d in &directors {
        cleared += d
            .metric(&life.client, "spindle_ordered_cleared_at_intake_total")
            .await
            .unwrap_or(0.0);
    }
    let born_after = directors[1]
        .metric(&life.client, "spindle_ordered_born_total")
        .await
        .unwrap_or(0.0);
    println!(
        "with a peer: {cleared} sequences cleared at intake, {born_after} born released on d1"
    );
    assert!(cleared > 0.0, "intakes cleared sequences against the peer");

    let longs: Vec<JobId> = [&first_long, &second_long]
        .iter()
        .map(|id| id.parse().unwrap())
        .collect();
    assert_delivered_in_key_order(&life, &accepted, PER_KEY, &longs, 120).await;
    let ended = |id: &str| {
        life.sink
            .received()
            .iter()
            .find(|r| r.job_id == id && r.status == 200)
            .map(|r| r.at)
    };
    wait_for(Duration::from_secs(30), "key long delivered", || async {
        ended(&second_long).is_some()
    })
    .await;
    let (first, second) = (ended(&first_long).unwrap(), ended(&second_long).unwrap());
    // Each attempt takes 5 s: the second began after the first ended.
    assert!(
        second.duration_since(first) >= Duration::from_millis(4500),
        "key long's second job overlapped its first: they ended {:?} apart",
        second.saturating_duration_since(first)
    );
    router.term().await;
    for d in &mut directors {
        d.term().await;
    }
    life.stop().await;
}

/// Waits up to `settle_s` for every job of `accepted` (per key, in acceptance order) and of
/// `others` to end, then asserts each succeeded exactly once and each key's jobs went one at a time in that
/// order; returns the census.
async fn assert_delivered_in_key_order(
    life: &Cluster,
    accepted: &HashMap<String, Vec<JobId>>,
    per_key: usize,
    others: &[JobId],
    settle_s: u64,
) -> common::cluster::Census {
    let mut ids: HashSet<JobId> = accepted.values().flatten().copied().collect();
    assert_eq!(ids.len(), accepted.len() * per_key);
    ids.extend(others);
    let settle = Instant::now();
    let mut census = life.census().await;
    while ids
        .iter()
        .any(|id| census.finals.get(id).is_none_or(Vec::is_empty))
        && settle.elapsed() < Duration::from_secs(settle_s)
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
        census = life.census().await;
    }
    let by_state = census.assert_exactly_once(&ids);
    assert_eq!(
        by_state.get(&State::Succeeded),
        Some(&ids.len()),
        "{by_state:?}"
    );
    // The producer waits for each answer before its next request: a key's jobs were
    // accepted in the order they were acknowledged, whatever their ids say.
    let mut place: HashMap<String, (String, usize)> = HashMap::new();
    for (key, jobs) in accepted {
        for (i, id) in jobs.iter().enumerate() {
            place.insert(id.to_string(), (key.clone(), i));
        }
    }
    let mut seen: HashMap<String, Vec<(usize, u16)>> = HashMap::new();
    for r in &life.sink.received() {
        if let Some((key, i)) = place.get(&r.job_id) {
            seen.entry(key.clone()).or_default().push((*i, r.status));
        }
    }
    for key in accepted.keys() {
        assert_one_at_a_time(key, &seen[key], per_key);
    }
    census
}
