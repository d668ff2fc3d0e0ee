//! Ordered keys in a cluster: their order through a router, a kill -9, a retirement and a
//! drain; with a router's clock skewed; a block that follows its key to another JobDB; and a
//! second Director joining while keys flow.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use spindle::job::{JobId, State};
use spindle::jobdb::JobDb;
use spindle::registry::inventory::JobDbState;

use crate::common::cluster::Cluster;
use crate::common::procs::{skewed_clock, Proc};
use crate::common::{self, *};
use crate::{scale, start};

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
    tokio::time::sleep(
        spindle::director::ordering::sequencer::SWEEP_EVERY + Duration::from_secs(1),
    )
    .await;
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

/// A job that asked to block its key expires while its Director is dead, and the drainer ends
/// it: the key is blocked as if its Director had (found by the history checker, seed 502: the
/// drainer archived such a job without a block, and the key's next job, moved to a live
/// JobDB, went at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_job_the_drainer_expires_blocks_its_key() {
    let life = start().await;
    let (first, _) = life.add_jobdb("bex1", JobDbState::Spare).await;
    let mut dead = life.director_with("d0", &["--min-retry-delay-ms", "20"]);
    life.wait_owned(&first, "the director on its jobdb").await;
    let url = life.sink.url("/flaky/0");
    let body = json!({"jobs": [
        {"bucket": "bex", "endpoint": url, "ordering_key": "k", "ordering_failure": "block",
         "ttl_ms": 4000, "backoff_min_delay_ms": 20, "headers": {"x-sink-status": "503"}},
        {"bucket": "bex", "endpoint": url, "ordering_key": "k"},
    ]});
    let reply = wait_submit(&life.client, &dead.base(), &body).await;
    let ids: Vec<String> = reply["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect();
    // The first job fails and waits for its retries; its Director dies, and its JobDB retires
    // before anyone takes it over.
    tokio::time::sleep(Duration::from_millis(500)).await;
    dead.kill9().await;
    let listed = life.inventory.get(&first).await.unwrap().unwrap();
    assert!(life
        .inventory
        .set_state(&listed, JobDbState::Retiring, "test")
        .await
        .unwrap());
    let (second, second_db) = life.add_jobdb("bex2", JobDbState::Spare).await;
    let mut live = life.director_with("d1", &["--min-retry-delay-ms", "20"]);
    life.wait_owned(&second, "a director on the spare").await;
    // Past the first job's expiry, the drainer ends it and moves the second.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut drainer = life.drainer("dr");
    life.wait_drained(&first, Duration::from_secs(60)).await;
    let counts = second_db.ordering_counts().await.unwrap();
    assert_eq!(
        (counts.held, counts.blocked),
        (1, 1),
        "the moved job waits, blocked, in {second}"
    );
    tokio::time::sleep(
        spindle::director::ordering::sequencer::SWEEP_EVERY + Duration::from_secs(1),
    )
    .await;
    let sent = life
        .sink
        .per_job()
        .get(&ids[1])
        .copied()
        .unwrap_or_default();
    assert_eq!(
        sent, 0,
        "the key's next job went though the expired job blocks it"
    );
    second_db.close().await;
    drainer.term().await;
    live.term().await;
    life.stop().await;
}

/// In a cluster, ordered jobs the intake cleared against the other live JobDBs go in the
/// writer's commits (a key's first job born released, with its entry; the next in the commit
/// that ends one), the others through the sequencer. A second Director joins while keys flow
/// and while a 5 s job of key `long` is under way on the first, and gets that key's next job:
/// it must see the first (every ordered job of a cluster has its entry from the commit that
/// stores it) and wait for it to end. Every key keeps its order across the change, with its
/// jobs in both JobDBs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_keeps_its_order_when_a_second_director_joins_while_it_flows() {
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
    let born = d0
        .metric(&life.client, "spindle_ordered_born_total")
        .await
        .unwrap_or(0.0);
    println!("one live jobdb: {born} born released");
    assert!(
        born >= KEYS as f64,
        "keys' first jobs were cleared and born released: {born}"
    );

    // d0 idle (every job so far delivered, its commits done).
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

    // A job of key `long` born released on d0 while its JobDB is the only live one, its attempt
    // taking 5 s...
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
    // the first (its entry, released) and wait for it to end.
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
