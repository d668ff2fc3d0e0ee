//! The router with real parts: Directors and the router as processes of the `spindle` binary,
//! coordinated through the in-repo Consul double, on MariaDB JobDBs, deduplicating in the
//! machine's Redis (key and placement prefixes of the test's own; the second dedup store is
//! another Redis database).
//!
//! - `duplicates_are_accepted_once_through_kills_and_a_placement_change`: producers submit jobs
//!   whose keys repeat (seconds apart, across a placement change that adds a Redis store, and
//!   after a router is killed with SIGKILL mid-load and a Director too), retrying whatever was
//!   not settled: exactly one job per key is stored and delivered, and every answer for a key
//!   names that job. `SPINDLE_ROUTER_JOBS` sets the size (default 6,000; the run is
//!   100,000: `SPINDLE_ROUTER_JOBS=100000 cargo test --release --test router -- --nocapture`).
//! - `a_bucket_stays_on_its_shard_and_a_hanging_tenant_does_not_slow_the_others`: eight
//!   Directors, shard size 2: each bucket's jobs land only in its two Directors' JobDBs, and a
//!   tenant whose endpoint hangs leaves the other tenants' delivery p99 within 20% (+ a few ms
//!   of timer noise) of a run without it.

mod common;
#[path = "router/events.rs"]
mod events;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::mariadb::PrivateMariaDb;
use common::procs::{args, Proc};
use common::redis_server::PrivateRedis;
use common::*;
use serde_json::{json, Value};
use spindle::rpc::api::{JobStatus, SubmitReply};

/// The tests of this file run one at a time: each starts a cluster of processes, and the
/// isolation test measures latency, which another cluster on the same two cores would skew.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// `directors` Directors, each on a JobDB of its own (on `mariadb` when given), and a router
/// with this shard size over the shared Redis (stores `a` and `b`, databases 0 and 1; the first
/// layout names only `a`), or over `private` alone.
async fn start(
    directors: usize,
    shard_size: usize,
    private: Option<PrivateRedis>,
    mariadb: Option<PrivateMariaDb>,
) -> Cluster {
    Cluster::builder("rt")
        .jobdbs(directors)
        .directors(directors)
        .service_ttl_ms(2000)
        .director_args("--shutdown-grace-ms 3000")
        .mariadb(mariadb)
        .redis(private)
        .router(shard_size)
        .start()
        .await
}

/// Every answer the producers got, per key: (status, id).
type Answers = Arc<Mutex<HashMap<String, Vec<(JobStatus, String)>>>>;

/// What made producers submit again: transport errors, 503s, `pending` and `failed` jobs.
type Retries = Arc<[std::sync::atomic::AtomicUsize; 4]>;

fn retried(retries: &Retries, kind: usize) {
    retries[kind].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Submits `jobs` until every one is settled (`accepted` or `duplicate`): the whole batch again
/// after a transport error or a 503, the unsettled jobs again after a 202.
async fn submit_settled(
    client: &reqwest::Client,
    base: &str,
    jobs: Vec<Value>,
    answers: &Answers,
    retries: &Retries,
) {
    let mut open = jobs;
    let mut pause = Duration::from_millis(100);
    let started = Instant::now();
    while !open.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "jobs unsettled for 90 s"
        );
        let sent = client
            .post(format!("{base}/v1/jobs"))
            .json(&json!({ "jobs": open }))
            .send()
            .await;
        let response = match sent {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                r.json::<SubmitReply>().await.unwrap()
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                assert!(
                    status == reqwest::StatusCode::SERVICE_UNAVAILABLE,
                    "router answered {status}: {text}"
                );
                retried(retries, 1);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
            Err(_) => {
                retried(retries, 0);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let mut again = Vec::new();
        {
            let mut answers = answers.lock().unwrap();
            for (job, answer) in open.iter().zip(response.jobs) {
                match answer.status {
                    JobStatus::Accepted | JobStatus::Duplicate => {
                        let key = job["idempotency_key"].as_str().unwrap().to_owned();
                        answers
                            .entry(key)
                            .or_default()
                            .push((answer.status, answer.id));
                    }
                    JobStatus::Pending | JobStatus::Failed => {
                        retried(
                            retries,
                            if answer.status == JobStatus::Pending {
                                2
                            } else {
                                3
                            },
                        );
                        again.push(job.clone())
                    }
                }
            }
        }
        open = again;
        if !open.is_empty() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// A fault injected once a share of the keys is settled.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `spindle placements propose --store a --store b`.
    AddStore,
    /// SIGKILL the router, restart it on its port.
    KillRouter,
    /// SIGKILL a Director, restart it with the same id and port.
    KillDirector,
    /// SIGKILL the private Redis, restart it on its port and data.
    CrashRedis,
    /// SIGKILL the private MariaDB holding every JobDB, restart it a second later.
    CrashMariaDb,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_accepted_once_through_kills_and_a_placement_change() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = start(3, 2, None, None).await;
    let faults = [
        (Fault::AddStore, 0.15),
        (Fault::KillRouter, 0.35),
        (Fault::KillDirector, 0.55),
        (Fault::KillRouter, 0.75),
    ];
    let jobs = env_usize("SPINDLE_ROUTER_JOBS", 6_000);
    let retries = exactly_once(cluster, jobs, &faults, &["/ok"]).await;
    assert!(
        retries[0] > 0,
        "the router kills broke no request: {retries:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_crash_under_the_router_loses_no_claim() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let redis = common::redis_server::PrivateRedis::start_durable(dir.path()).await;
    let cluster = start(2, 2, Some(redis), None).await;
    let faults = [(Fault::CrashRedis, 0.4)];
    exactly_once(
        cluster,
        env_usize("SPINDLE_ROUTER_REDIS_JOBS", 3_000),
        &faults,
        &["/ok"],
    )
    .await;
}

/// Producers submit `total` keyed jobs, every tenth repeating a recent key, retrying whatever
/// is not settled, while `faults` happen; then each key must be stored exactly once and every
/// answer for it must name that job.
/// Returns how often producers submitted again: transport errors, 503s, `pending` and `failed`
/// jobs.
async fn exactly_once(
    mut cluster: Cluster,
    total: usize,
    faults: &[(Fault, f64)],
    paths: &[&str],
) -> Vec<usize> {
    let producers = 4;
    let batch = 100;
    let base = cluster.router_base();
    let urls: Vec<String> = paths.iter().map(|p| cluster.sink.url(p)).collect();
    let answers: Answers = Arc::default();
    let retries: Retries = Arc::default();
    // Keys whose first answer arrived, with when: repeats pick from these.
    let settled: Arc<Mutex<Vec<(String, String, Instant)>>> = Arc::default();
    let repeats = Arc::new(Mutex::new(0usize));
    // Set when a placement change is proposed: producers past half their jobs wait for it to
    // take effect, so the second half of the load always runs under the new layout.
    let change_gate: Arc<Mutex<Option<Instant>>> = Arc::default();
    let started = Instant::now();

    let mut tasks = tokio::task::JoinSet::new();
    let per_producer = total / producers;
    for p in 0..producers {
        let (client, base, urls) = (cluster.client.clone(), base.clone(), urls.clone());
        let (answers, settled, repeats) = (answers.clone(), settled.clone(), repeats.clone());
        let (retries, change_gate) = (retries.clone(), change_gate.clone());
        tasks.spawn(async move {
            let mut made = 0;
            let mut n = 0;
            while made < per_producer {
                let gate = *change_gate.lock().unwrap();
                if let Some(at) = gate.filter(|_| made >= per_producer / 2) {
                    tokio::time::sleep_until(at.into()).await;
                }
                let mut jobs = Vec::with_capacity(batch);
                let mut fresh = Vec::new();
                for j in 0..batch.min(per_producer - made) {
                    // Every tenth job repeats an earlier key from up to 6 s ago, well inside
                    // the 60 s window even when faults hold a submission up for half a minute
                    // (its 5 s slots roll over during the run, so repeats also span slots and
                    // the placement change).
                    let repeat = if j % 10 == 9 {
                        let settled = settled.lock().unwrap();
                        let candidates: Vec<_> = settled
                            .iter()
                            .rev()
                            .take_while(|(_, _, at)| at.elapsed() < Duration::from_secs(6))
                            .collect();
                        (!candidates.is_empty()).then(|| {
                            let pick = (n * 7919 + j) % candidates.len();
                            (candidates[pick].0.clone(), candidates[pick].1.clone())
                        })
                    } else {
                        None
                    };
                    let (bucket, key) = repeat.clone().unwrap_or_else(|| {
                        (format!("tenant-{}", (n + j) % 4), format!("p{p}-{n}-{j}"))
                    });
                    if repeat.is_some() {
                        *repeats.lock().unwrap() += 1;
                    } else {
                        fresh.push((bucket.clone(), key.clone()));
                    }
                    // The endpoint follows the key, so a repeat goes where its original went.
                    let endpoint =
                        &urls[xxhash_rust::xxh3::xxh3_64(key.as_bytes()) as usize % urls.len()];
                    jobs.push(json!({"bucket": bucket, "endpoint": endpoint,
                        "idempotency_key": key, "payload": {"key": key},
                        "backoff_min_delay_ms": 200, "backoff_coefficient": 1.5}));
                    made += 1;
                }
                n += 1;
                submit_settled(&client, &base, jobs, &answers, &retries).await;
                let now = Instant::now();
                settled
                    .lock()
                    .unwrap()
                    .extend(fresh.into_iter().map(|(b, k)| (b, k, now)));
            }
        });
    }

    let consul_url = cluster.consul_url();
    let placement_prefix = cluster.placement_prefix();
    // Each fault waits for a share of the keys to be settled, so all land mid-load.
    let progress = |share: f64| {
        let answers = answers.clone();
        async move {
            let want = (total as f64 * 0.9 * share) as usize;
            wait_for(Duration::from_secs(120), "producer progress", || async {
                answers.lock().unwrap().len() >= want
            })
            .await;
        }
    };
    let mut change_at = None;
    let mut injected = Vec::new();
    for &(fault, share) in faults {
        progress(share).await;
        match fault {
            Fault::AddStore => {
                let proposed = tokio::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
                    .args([
                        "placements",
                        "propose",
                        "--consul-addr",
                        &consul_url,
                        "--placement-prefix",
                        &placement_prefix,
                        "--placement-lead-ms",
                        "4000",
                        "--store",
                        "a",
                        "--store",
                        "b",
                    ])
                    .output()
                    .await
                    .unwrap();
                assert!(proposed.status.success(), "{proposed:?}");
                change_at = Some(Instant::now() + Duration::from_secs(5));
                *change_gate.lock().unwrap() = change_at;
            }
            Fault::KillRouter => {
                let router = cluster.router.as_mut().unwrap();
                router.kill9().await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                router.restart().await;
            }
            Fault::KillDirector => {
                cluster.directors[1].kill9().await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                cluster.directors[1].restart().await;
            }
            Fault::CrashRedis => {
                let redis = cluster.redis.as_mut().unwrap();
                redis.crash_and_restart(Duration::from_secs(1)).await;
            }
            Fault::CrashMariaDb => {
                let mariadb = cluster.mariadb.as_mut().unwrap();
                mariadb.kill();
                tokio::time::sleep(Duration::from_secs(1)).await;
                tokio::task::block_in_place(|| mariadb.restart());
            }
        }
        injected.push((fault, started.elapsed()));
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let submit_took = started.elapsed();
    if let Some(change_at) = change_at {
        assert!(
            Instant::now() > change_at,
            "the run ended before the placement change took effect"
        );
    }

    // Exactly one stored job per key, the one every answer for the key names.
    let answers = answers.lock().unwrap().clone();
    let planned_repeats = *repeats.lock().unwrap();
    let mut stored_by_key: HashMap<String, Vec<String>> = HashMap::new();
    let mut waited = Instant::now();
    let stored = loop {
        let stored = cluster.stored().await;
        if stored.len() >= answers.len() || waited.elapsed() > Duration::from_secs(20) {
            break stored;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = &mut waited;
    };
    for (id, key, _, _) in &stored {
        stored_by_key
            .entry(key.clone().expect("every job has a key"))
            .or_default()
            .push(id.clone());
    }
    let doubled: Vec<_> = stored_by_key
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .collect();
    if !doubled.is_empty() {
        // Where each copy is and how it got there, for the failure report.
        let mut report = String::new();
        for (key, copies) in doubled.iter().take(3) {
            report += &format!("key {key}: answers {:?}\n", answers.get(*key));
            for (id, _, _, jobdb) in stored.iter().filter(|(id, ..)| copies.contains(id)) {
                let db = &cluster.jobdbs.iter().find(|(n, _)| n == jobdb).unwrap().1;
                let job_id: spindle::job::JobId = id.parse().unwrap();
                let trace: Vec<String> = histories(db)
                    .await
                    .remove(&job_id)
                    .unwrap_or_default()
                    .iter()
                    .map(|t| format!("{:?}@{}", t.state, t.time.format("%H:%M:%S%.3f")))
                    .collect();
                report += &format!("  {id} in {jobdb}: {trace:?}\n");
            }
        }
        panic!("{} keys stored twice:\n{report}", doubled.len());
    }
    assert_eq!(stored_by_key.len(), answers.len(), "every key stored");
    let mut duplicates = 0;
    for (key, got) in &answers {
        let id = &stored_by_key[key][0];
        for (status, answered) in got {
            assert_eq!(
                answered, id,
                "key {key}: answered {status:?} {answered}, stored {id}"
            );
            duplicates += usize::from(*status == JobStatus::Duplicate);
        }
    }
    assert!(
        duplicates >= planned_repeats,
        "{duplicates} duplicate answers for {planned_repeats} planned repeats"
    );

    // Every stored job is delivered; more than once only if it was in flight at the kill.
    let ids: HashSet<String> = stored.iter().map(|(id, ..)| id.clone()).collect();
    let sink = &cluster.sink;
    wait_for(
        Duration::from_secs(60),
        "every stored job delivered",
        || async {
            let per_job = sink.per_job();
            ids.iter().all(|id| per_job.contains_key(id))
        },
    )
    .await;
    // Every stored job ends in one final state, through a legal history.
    let mut ended = 0;
    for (_, db) in &cluster.jobdbs {
        wait_for(Duration::from_secs(90), "every job final", || async {
            histories(db).await.values().all(|h| {
                h.last().is_some_and(|t| {
                    matches!(
                        t.state,
                        spindle::job::State::Succeeded | spindle::job::State::Discarded
                    )
                })
            })
        })
        .await;
        for history in histories(db).await.into_values() {
            assert_legal(&history);
            ended += 1;
        }
    }
    assert_eq!(ended, ids.len(), "every stored job ended once");
    // After a placement change the new layout took entries: store `b` holds keys of this test.
    let on_b = if change_at.is_some() {
        let on_b = cluster.dedup_keys(1).await;
        assert!(
            on_b > 0,
            "no dedup entry landed on the store the placement change added"
        );
        on_b
    } else {
        0
    };
    let retries: Vec<usize> = retries
        .iter()
        .map(|r| r.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    let per_job = sink.per_job();
    let delivered_twice = per_job.values().filter(|n| **n > 1).count();
    assert!(
        per_job.keys().all(|id| ids.contains(id)),
        "a delivery of an unknown job"
    );
    println!(
        "router exactly-once: {total} jobs submitted ({planned_repeats} planned repeats) in {:.1} s \
         by {producers} producers; {} keys, each stored once; {duplicates} duplicate answers; \
         faults at {injected:?}; jobs the endpoint saw more than once (retries of misbehaving \
         endpoints, attempts in flight at a kill): {delivered_twice}; producers submitted again after \
         {retries:?} (transport errors, 503s, pending jobs, failed jobs); {on_b} hashes on the \
         added store",
        submit_took.as_secs_f64(),
        answers.len()
    );
    // The router's metrics pass promtool and count what happened since its last start.
    let metrics = metrics_text(&cluster.client, &cluster.router_base()).await;
    promtool_accepts(&metrics);
    // (A router restarted late in the run may have counted little: the families must be there.)
    for family in [
        "# TYPE spindle_router_jobs_total counter",
        "# TYPE spindle_router_forwards_total counter",
        "# TYPE spindle_router_dedup_claim_duration_seconds histogram",
    ] {
        assert!(
            metrics.contains(family),
            "{family} missing from:\n{metrics}"
        );
    }
    cluster.stop().await;
    retries
}

/// The fault suite's random schedule: seeded (`SPINDLE_FAULT_SEED`, printed), six faults drawn
/// from every kind, at random points of the load, against jobs whose endpoints misbehave
/// (503 at random, 429 with `Retry-After`, 410, slow answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_schedule_of_faults_loses_and_duplicates_nothing() {
    use rand::{Rng, SeedableRng};
    let _one = ONE_AT_A_TIME.lock().await;
    let seed: u64 = std::env::var("SPINDLE_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("random fault schedule: SPINDLE_FAULT_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kinds = [
        Fault::KillRouter,
        Fault::KillDirector,
        Fault::CrashRedis,
        Fault::CrashMariaDb,
    ];
    let mut faults: Vec<(Fault, f64)> = (0..6)
        .map(|i| {
            let kind = if i < kinds.len() {
                kinds[i]
            } else {
                kinds[rng.random_range(0..kinds.len())]
            };
            (kind, rng.random_range(0.1..0.85))
        })
        .collect();
    faults.sort_by(|a, b| a.1.total_cmp(&b.1));
    println!("random fault schedule: {faults:?}");
    let dir = tempfile::tempdir().unwrap();
    let redis = common::redis_server::PrivateRedis::start_durable(dir.path()).await;
    let mariadb = tokio::task::block_in_place(common::mariadb::PrivateMariaDb::start);
    let cluster = start(2, 2, Some(redis), Some(mariadb)).await;
    let paths = [
        "/ok",
        "/ok",
        "/flaky/30",
        "/retry-after/1",
        "/status/410",
        "/slow/300",
    ];
    exactly_once(
        cluster,
        env_usize("SPINDLE_FAULT_JOBS", 3_000),
        &faults,
        &paths,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_conforms_to_its_openapi_document() {
    let _one = ONE_AT_A_TIME.lock().await;
    // With a control database: events and subscriptions are part of the document.
    let cluster = Cluster::builder("rt")
        .jobdbs(1)
        .directors(1)
        .router(1)
        .control()
        .start()
        .await;
    schemathesis_passes(&format!("{}/openapi.json", cluster.router_base())).await;
    cluster.stop().await;
}

/// A job scheduled through the router (with and without an idempotency key) keeps its time:
/// the forward carries it, the Director stores it `scheduled`, and it arrives then, not
/// before; a job without a time is not delayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_jobs_keep_their_time_through_the_router() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = start(1, 1, None, None).await;
    let url = cluster.sink.url("/ok");
    let started = (Instant::now(), chrono::Utc::now());
    let at = started.1 + chrono::Duration::milliseconds(2_500);
    let jobs = vec![
        json!({"bucket": "s", "endpoint": url, "deliver_at": at, "idempotency_key": "k1"}),
        json!({"bucket": "s", "endpoint": url, "delay_ms": 1_500}),
        json!({"bucket": "s", "endpoint": url}),
    ];
    let reply = submit(&cluster.client, &cluster.router_base(), jobs).await;
    assert!(reply.jobs.iter().all(|j| j.status == JobStatus::Accepted));
    assert_eq!(
        reply.jobs[0].deliver_at,
        Some(at),
        "the answer names the time"
    );
    assert!(reply.jobs[1].deliver_at.is_some());
    assert_eq!(reply.jobs[2].deliver_at, None);
    wait_for(Duration::from_secs(15), "three deliveries", || async {
        cluster.sink.ok_total() >= 3
    })
    .await;
    let received = cluster.sink.received();
    let after = |i: usize| {
        let r = received
            .iter()
            .find(|r| r.job_id == reply.jobs[i].id)
            .expect("delivered");
        r.at - started.0
    };
    let (first, second, third) = (after(0), after(1), after(2));
    println!("through the router: due at 2.5 s arrived {first:?}, due at 1.5 s {second:?}, immediate {third:?}");
    assert!(first >= Duration::from_millis(2_450) && first < Duration::from_millis(4_000));
    assert!(second >= Duration::from_millis(1_450) && second < Duration::from_millis(3_000));
    assert!(third < Duration::from_millis(1_000));
    let (_, db) = &cluster.jobdbs[0];
    let all = histories(db).await;
    for (i, kind) in [(0, Some("scheduled")), (1, Some("scheduled")), (2, None)] {
        let history = &all[&reply.jobs[i].id.parse().unwrap()];
        assert_legal(history);
        assert_eq!(history[1].error_type.as_deref(), kind, "{history:#?}");
    }
    cluster.stop().await;
}

/// Every forward the router has made, by any outcome.
async fn forwards(cluster: &Cluster) -> f64 {
    let text = metrics_text(&cluster.client, &cluster.router_base()).await;
    ["stored", "refused", "unknown"]
        .iter()
        .map(|o| {
            metric_value(
                &text,
                &format!("spindle_router_forwards_total{{outcome=\"{o}\"}}"),
            )
        })
        .sum()
}

/// A request's jobs go in one forward per Director. Before, each ordered sequence had a
/// forward of its own, all at once (a request of 100 jobs on 100 keys made 100 concurrent
/// imports). 50 keys × 2 jobs and 20 unordered jobs of two buckets, through a router over
/// three Directors: at most three forwards, every job accepted, each key's jobs in one JobDB in
/// request order. Then one job the Directors refuse for its size (the router's limit is
/// larger) fails alone: the jobs that shared its forward go again apart and are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_goes_in_one_forward_per_director_and_a_refused_job_fails_alone() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = start(3, 3, None, None).await;
    let url = cluster.sink.url("/ok");
    let mut jobs = Vec::new();
    for round in 0..2 {
        for k in 0..50 {
            jobs.push(
                json!({"bucket": "o", "endpoint": url, "ordering_key": format!("k{k}"),
                             "payload": {"k": k, "round": round}}),
            );
        }
    }
    for i in 0..20 {
        jobs.push(json!({"bucket": format!("u{}", i % 2), "endpoint": url}));
    }
    let before = forwards(&cluster).await;
    let reply = submit(&cluster.client, &cluster.router_base(), jobs).await;
    let made = forwards(&cluster).await - before;
    assert!(
        reply.jobs.iter().all(|j| j.status == JobStatus::Accepted),
        "{:?}",
        reply.jobs.iter().find(|j| j.status != JobStatus::Accepted)
    );
    println!("120 jobs on 50 keys and 2 buckets: {made} forwards");
    assert!((1.0..=3.0).contains(&made), "{made} forwards");
    let stored = cluster.stored().await;
    let jobdb_of: HashMap<String, String> = stored
        .iter()
        .map(|(id, _, _, jobdb)| (id.clone(), jobdb.clone()))
        .collect();
    assert_eq!(jobdb_of.len(), 120);
    for k in 0..50 {
        let (first, second) = (&reply.jobs[k].id, &reply.jobs[50 + k].id);
        assert_eq!(jobdb_of[first], jobdb_of[second], "key k{k} split");
        assert!(first < second, "key k{k}: ids out of request order");
    }

    // The router takes 2 MiB payloads, the Directors 1 MiB.
    cluster
        .restart_router(&["--max-payload-bytes", "2097152"])
        .await;
    cluster.wait_router_ready(3).await;
    let big = "x".repeat(1_500_000);
    let mut jobs = vec![json!({"bucket": "big", "endpoint": url, "payload": big})];
    for i in 0..30 {
        jobs.push(json!({"bucket": format!("n{}", i % 3), "endpoint": url}));
    }
    for k in 0..10 {
        jobs.push(json!({"bucket": "o", "endpoint": url, "ordering_key": format!("m{k}")}));
    }
    let reply = submit(&cluster.client, &cluster.router_base(), jobs).await;
    assert_eq!(
        reply.jobs[0].status,
        JobStatus::Failed,
        "{:?}",
        reply.jobs[0]
    );
    let error = reply.jobs[0].error.clone().unwrap_or_default();
    assert!(error.contains("413"), "{error}");
    for answer in &reply.jobs[1..] {
        assert_eq!(answer.status, JobStatus::Accepted, "{answer:?}");
    }
    assert_eq!(cluster.stored().await.len(), 160);
    cluster.stop().await;
}

/// Submits 20 jobs of each calm bucket every 50 ms for `run`, and returns each job's
/// submit-to-delivery latency once all arrived.
async fn calm_latencies(cluster: &Cluster, buckets: &[String], run: Duration) -> Vec<Duration> {
    let mut submitted: HashMap<String, Instant> = HashMap::new();
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let ok = cluster.sink.url("/ok");
    while started.elapsed() < run {
        tick.tick().await;
        let jobs: Vec<_> = buckets
            .iter()
            .flat_map(|b| {
                let ok = &ok;
                (0..5).map(move |_| json!({"bucket": b, "endpoint": ok}))
            })
            .collect();
        let at = Instant::now();
        for job in submit(&cluster.client, &cluster.router_base(), jobs)
            .await
            .jobs
        {
            submitted.insert(job.id, at);
        }
    }
    delivery_latencies(&cluster.sink, &submitted, Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_stays_on_its_shard_and_a_hanging_tenant_does_not_slow_the_others() {
    let _one = ONE_AT_A_TIME.lock().await;
    let directors = env_usize("SPINDLE_ROUTER_DIRECTORS", 8);
    let run = Duration::from_secs(env_usize("SPINDLE_ROUTER_ISOLATION_S", 4) as u64);
    let cluster = start(directors, 2, None, None).await;
    let calm: Vec<String> = (0..6).map(|i| format!("calm-{i}")).collect();

    let mut baseline = calm_latencies(&cluster, &calm, run).await;

    // The noisy tenant: every request hangs until the 1 s attempt timeout, retried at once.
    // On a server of its own, as a tenant's endpoint would be: the calm tenants' endpoint (the
    // in-test sink, which also times arrivals) does not share its connections or threads.
    let noisy_sink = Proc::spawn(&args(&["sink", "--listen", "127.0.0.1:{port}"]), 0);
    let hang = format!("{}/hang", noisy_sink.base());
    let noisy: Vec<_> = (0..400)
        .map(|_| {
            json!({"bucket": "noisy", "endpoint": hang, "execution_timeout_ms": 1000,
            "backoff_min_delay_ms": 100, "backoff_coefficient": 1.0})
        })
        .collect();
    for chunk in noisy.chunks(200) {
        submit(&cluster.client, &cluster.router_base(), chunk.to_vec()).await;
    }
    let (client, procs) = (&cluster.client, &cluster.directors);
    wait_for(
        Duration::from_secs(10),
        "the hanging endpoint to fill its slots",
        || async {
            let mut in_flight = 0.0;
            for d in procs {
                let Ok(r) = client.get(format!("{}/metrics", d.base())).send().await else {
                    continue;
                };
                let text = r.text().await.unwrap_or_default();
                in_flight += text
                    .lines()
                    .filter_map(|l| l.strip_prefix("spindle_attempts_in_flight "))
                    .filter_map(|v| v.trim().parse::<f64>().ok())
                    .sum::<f64>();
            }
            in_flight >= 64.0
        },
    )
    .await;
    let mut with_noise = calm_latencies(&cluster, &calm, run).await;

    // Each bucket's jobs are in the JobDBs of exactly its shard (size 2) and no others.
    let mut jobdbs_of: HashMap<String, HashSet<String>> = HashMap::new();
    for (_, _, bucket, jobdb) in cluster.stored().await {
        jobdbs_of.entry(bucket).or_default().insert(jobdb);
    }
    for (bucket, jobdbs) in &jobdbs_of {
        assert!(
            jobdbs.len() <= 2,
            "bucket {bucket} landed in {} jobdbs: {jobdbs:?}",
            jobdbs.len()
        );
    }
    let all: HashSet<&String> = jobdbs_of.values().flatten().collect();

    let (b50, b99) = (
        percentile_ms(&mut baseline, 0.5),
        percentile_ms(&mut baseline, 0.99),
    );
    let (n50, n99) = (
        percentile_ms(&mut with_noise, 0.5),
        percentile_ms(&mut with_noise, 0.99),
    );
    println!(
        "router isolation ({directors} directors, shard size 2, {} jobdbs used): calm tenants' \
         submit-to-delivery latency alone p50 {b50:.1} ms p99 {b99:.1} ms ({} jobs); beside a \
         hanging tenant p50 {n50:.1} ms p99 {n99:.1} ms ({} jobs); noisy shard {:?}",
        all.len(),
        baseline.len(),
        with_noise.len(),
        jobdbs_of.get("noisy")
    );
    // Within 20% of the run without the noisy tenant (plus 10 ms of timer noise) in a release
    // build: the bound, on p99 (the release figures are in docs/benchmarks.md). A debug
    // build runs eight unoptimised Directors on two cores, where the p99 of either phase alone
    // moves between 66 and 203 ms from run to run (measured), so the suite checks what a broken
    // isolation would move: the median (calm jobs queued behind 1 s timeouts would take it to
    // hundreds of ms), with the p99 only bounded against gross regressions.
    if cfg!(debug_assertions) {
        assert!(
            n50 <= 1.5 * b50 + 30.0,
            "calm p50 {n50:.1} ms beside the hanging tenant vs {b50:.1} ms without"
        );
        assert!(
            n99 <= 3.0 * b99 + 100.0,
            "calm p99 {n99:.1} ms beside the hanging tenant vs {b99:.1} ms without"
        );
    } else {
        assert!(
            n99 <= 1.2 * b99 + 10.0,
            "calm p99 {n99:.1} ms beside the hanging tenant vs {b99:.1} ms without"
        );
    }
    cluster.stop().await;
}
