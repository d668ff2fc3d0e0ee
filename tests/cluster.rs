//! Many Directors coordinated through Consul (the in-repo double), as real processes on real
//! JobDBs: each holds exactly one JobDB; a killed Director's JobDB is taken over and finished;
//! a paused Director that outlived its session is fenced out; Consul faults never produce two
//! writers, and service resumes after them.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, LOCK_DELAY, LOCK_TTL as TTL};
use common::procs::Proc;
use common::*;
use serde_json::json;
use spindle::registry::inventory::JobDbState;

/// Submits `n` jobs over three buckets to one sink path through `director`; how many it took.
async fn submit_to(
    cluster: &Cluster,
    director: &Proc,
    n: usize,
    path: &str,
    min_delay_ms: u64,
) -> usize {
    let jobs: Vec<_> = (0..n)
        .map(|i| json!({"bucket": format!("t{}", i % 3), "endpoint": cluster.sink.url(path), "backoff_min_delay_ms": min_delay_ms}))
        .collect();
    submit(&cluster.client, &director.base(), jobs)
        .await
        .jobs
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_directors_five_jobdbs_and_a_kill_9() {
    let mut cluster = Cluster::builder("ka").jobdbs(5).directors(3).start().await;
    let placement = cluster.settled().await;
    let spares = cluster.in_state(JobDbState::Spare).await;
    assert_eq!(spares, 2, "three jobdbs became active, two stay spare");

    // Work that is still retrying when the first Director dies.
    let mut submitted = HashMap::new();
    for d in &cluster.directors {
        let n = submit_to(&cluster, d, 200, "/fail/1", 1500).await;
        submitted.insert(placement[&d.port].clone(), n as u64);
    }
    let orphan = placement[&cluster.directors[0].port].clone();
    cluster.directors[0].kill9().await;
    let killed = Instant::now();

    // The Director restarted (same id, as a supervisor would) takes its JobDB back once Consul
    // has expired the dead session (up to 2×TTL) and the lock-delay has run.
    let replacement = cluster.director("d0");
    wait_for(
        Duration::from_secs(20),
        "the orphaned jobdb to be taken over",
        || async { cluster.catalog().await.get(&replacement.port) == Some(&orphan) },
    )
    .await;
    let takeover = killed.elapsed();
    let bound = TTL * 2 + LOCK_DELAY + Duration::from_secs(2);
    println!("cluster: orphaned jobdb taken over {:.2} s after kill -9 (bound 2×TTL + lock-delay = {:.1} s, + campaign and start-up)", takeover.as_secs_f64(), (TTL * 2 + LOCK_DELAY).as_secs_f64());
    assert!(takeover <= bound, "takeover took {takeover:?}");

    for (name, n) in &submitted {
        cluster.assert_all_terminal(name, *n).await;
    }
    drop(replacement);
    cluster.stop().await;
}

/// A Director serves a spare JobDB only once the inventory lists it active. Its address is one
/// listener across JobDBs, so a producer submitting straight to it reaches a new JobDB at once,
/// and other Directors' sequencers look for a key's older jobs only in JobDBs the inventory
/// lists as live: found by the history checker (seed 11), where a key's job accepted in a
/// JobDB still listed as spare was overtaken by the key's next job in another JobDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_is_listed_active_before_its_director_accepts_a_job() {
    let cluster = Cluster::builder("sa").jobdbs(1).start().await;
    let double = cluster.double();
    // The Director's write of the record takes 2 s: what it does meanwhile is what a producer
    // would see.
    double.faults().delay_kv_writes(Some((
        spindle::registry::inventory::RECORDS,
        Duration::from_secs(2),
    )));
    let director = cluster.director("d0");
    let body = json!({"jobs": [{"bucket": "t", "endpoint": cluster.sink.url("/ok")}]});
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut refused = 0;
    loop {
        assert!(Instant::now() < deadline, "no job accepted in 30 s");
        let answer = cluster
            .client
            .post(format!("{}/v1/jobs", director.base()))
            .json(&body)
            .timeout(Duration::from_millis(300))
            .send()
            .await;
        match answer {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => break,
            _ => {
                refused += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    let listed = cluster.inventory.list().await.unwrap();
    assert_eq!(
        listed[0].record.state,
        JobDbState::Active,
        "a job was accepted while its JobDB was listed {:?} (after {refused} tries)",
        listed[0].record.state
    );
    double.faults().delay_kv_writes(None);
    drop(director);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_director_is_fenced_out() {
    use nix::sys::signal::Signal;
    let cluster = Cluster::builder("st").jobdbs(5).directors(3).start().await;
    let placement = cluster.settled().await;
    let zombie = &cluster.directors[0];
    let jobdb = placement[&zombie.port].clone();

    // Keep it busy: slow deliveries, so attempts are in flight when it freezes.
    let n = submit_to(&cluster, zombie, 400, "/slow/30", 200).await as u64;
    wait_for(Duration::from_secs(10), "deliveries under way", || async {
        cluster.sink.total() >= 50
    })
    .await;
    zombie.signal(Signal::SIGSTOP);
    wait_for(Duration::from_secs(10), "its session to expire", || async {
        cluster.holders().await.get(&jobdb) == Some(&None)
    })
    .await;
    // A new Director prefers the orphaned JobDB over the spares.
    let successor = cluster.director("d9");
    wait_for(
        Duration::from_secs(20),
        "another director to take the jobdb",
        || async { cluster.catalog().await.get(&successor.port) == Some(&jobdb) },
    )
    .await;
    let owner_before = cluster.jobdb(&jobdb).owner().await.unwrap();

    let resumed = std::time::SystemTime::now();
    zombie.signal(Signal::SIGCONT);
    // It notices at once (its last renew is older than the TTL), and re-campaigns.
    wait_for(
        Duration::from_secs(10),
        "the zombie to stand down",
        || async {
            let on = cluster.catalog().await.get(&zombie.port).cloned();
            let ready = zombie.ready(&cluster.client).await;
            (!ready || on.is_some_and(|j| j != jobdb))
                && zombie
                    .metric(&cluster.client, "spindle_jobs_cached")
                    .await
                    .is_some()
        },
    )
    .await;
    // Anything it still had in flight finishes now; nothing new may start.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rejections = zombie
        .metric(&cluster.client, "spindle_jobdb_fence_rejections_total")
        .await
        .unwrap_or(0.0);
    let last_start = zombie
        .metric(
            &cluster.client,
            "spindle_attempt_last_started_timestamp_seconds",
        )
        .await
        .unwrap();
    let resumed_at = resumed
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    println!(
        "cluster: paused director resumed; writes rejected by the fence: {rejections}; its last attempt started {:.3} s after resuming (renew interval {:.1} s)",
        last_start - resumed_at,
        (TTL / 2).as_secs_f64()
    );
    assert!(
        last_start - resumed_at <= (TTL / 2).as_secs_f64(),
        "kept delivering after resuming"
    );
    // The JobDB still belongs to the successor: the zombie's token never came back.
    let owner_after = cluster.jobdb(&jobdb).owner().await.unwrap();
    assert_eq!(owner_after.0, owner_before.0);
    cluster.assert_all_terminal(&jobdb, n).await;
    drop(successor);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_faults_never_make_two_writers_and_service_resumes() {
    let mut cluster = Cluster::builder("cf").jobdbs(4).directors(2).start().await;
    let double = cluster.double();
    let placement = cluster.settled().await;
    let mut submitted: HashMap<String, u64> = HashMap::new();
    for d in &cluster.directors {
        *submitted.entry(placement[&d.port].clone()).or_default() +=
            submit_to(&cluster, d, 100, "/fail/1", 300).await as u64;
    }

    for (fault, apply) in [
        (
            "renew answered 404",
            Box::new(|| double.faults().set_renew_fails(true)) as Box<dyn Fn()>,
        ),
        (
            "every call answered 500",
            Box::new(|| double.faults().set_error_500(true)),
        ),
        (
            "consul stalled for 3×TTL",
            Box::new(|| double.faults().stall(TTL * 3)),
        ),
    ] {
        let started = Instant::now();
        apply();
        // Every Director must stop: none may write while it cannot prove its lock.
        wait_for(
            Duration::from_secs(10),
            "directors to stand down",
            || async {
                let mut ready = 0;
                for d in &cluster.directors {
                    ready += d.ready(&cluster.client).await as usize;
                }
                ready == 0
            },
        )
        .await;
        let stood_down = started.elapsed();
        tokio::time::sleep(TTL * 3 - stood_down.min(TTL * 3)).await;
        double.faults().clear();
        let placement = cluster.settled().await;
        println!("cluster: {fault}: all directors stood down within {:.2} s; service resumed {:.2} s after the fault began", stood_down.as_secs_f64(), started.elapsed().as_secs_f64());
        assert!(
            // Within the fault (the registry suite pins the loss itself to the TTL).
            stood_down < TTL * 3,
            "{fault}: stood down after {stood_down:?}"
        );
        for d in &cluster.directors {
            *submitted.entry(placement[&d.port].clone()).or_default() +=
                submit_to(&cluster, d, 20, "/ok", 300).await as u64;
        }
    }
    for (name, n) in &submitted {
        cluster.assert_all_terminal(name, *n).await;
    }
    // SIGTERM: the Director leaves the catalog, releases its lock and exits 0.
    let mut leaving = cluster.directors.remove(0);
    let jobdb = cluster.catalog().await[&leaving.port].clone();
    leaving.signal(nix::sys::signal::Signal::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(20), leaving.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "SIGTERM exits 0: {status}");
    assert!(
        !cluster.catalog().await.contains_key(&leaving.port),
        "deregistered"
    );
    assert_eq!(cluster.holders().await[&jobdb], None, "lock released");
    cluster.stop().await;
}
