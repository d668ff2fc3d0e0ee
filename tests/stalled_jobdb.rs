//! A JobDB that stops answering writes: `FLUSH TABLES WITH READ LOCK` held on a separate
//! connection of a private `mariadbd` (never the shared server) while producers submit to a
//! Director process. Every submit must be answered within the write timeout, saying whether
//! anything was stored (503 + `Retry-After`: nothing; 504: unknown), the Director must turn
//! non-ready while the JobDB cannot be written (in a cluster, its catalog check critical, so
//! routers stop sending) and ready again by itself once the lock is gone; afterwards nothing
//! answered 503 is stored, nothing answered 504 is stored twice, and every accepted job ends
//! exactly once.
//!
//! `SPINDLE_LOCK_S` sets how long the lock is held (20 s in the suite).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::mariadb::PrivateMariaDb;
use common::procs::{args, free_port, spindle_bin};
use common::sql_proxy::{Hold, SqlProxy};
use common::*;
use spindle::job::State;
use spindle::jobdb::{JobDb, JobDbUrl};
use spindle::registry::catalog;
use spindle::registry::inventory::{Inventory, JobDbRecord, JobDbState};
use spindle_client::NewJob;
use sqlx::Connection;
use tokio::process::{Child, Command};

/// The Director's `--write-timeout-ms` in the standalone drill (the cluster's is shorter, so
/// that requests being written when the wait ends, answered 504, are common too).
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// The cluster drill's: a request taken into a transaction waits at most the server's lock
/// wait (1 s), as long as its whole wait, so it is answered 504 as often as 503.
const CLUSTER_WRITE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Jobs per submit.
const BATCH: usize = 10;

/// What a producer heard for one request.
#[derive(Debug, Clone, PartialEq)]
enum Heard {
    /// 202: stored, under these ids.
    Accepted(Vec<String>),
    /// 503 (nothing stored), with its `Retry-After`.
    Refused(Option<Duration>),
    /// 504: outcome unknown.
    Unknown,
    /// No answer in the client's time (15 s).
    NoAnswer,
    /// Anything else (status, or the error).
    Other(String),
}

/// One request: its idempotency keys, what was heard, how long it took, when it was sent.
#[derive(Debug, Clone)]
struct Request {
    keys: Vec<String>,
    heard: Heard,
    took: Duration,
    sent: Instant,
}

/// Producers submitting batches of keyed jobs until stopped.
struct Producers {
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Request>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Producers {
    fn start(base: &str, endpoint: &str, n: usize) -> Producers {
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..n)
            .map(|p| {
                let client = spindle_client::Client::builder(base)
                    .timeout(Duration::from_secs(15))
                    .build()
                    .unwrap();
                let (stop, requests, endpoint) =
                    (stop.clone(), requests.clone(), endpoint.to_owned());
                tokio::spawn(async move {
                    let mut n = 0usize;
                    while !stop.load(Ordering::SeqCst) {
                        let keys: Vec<String> =
                            (0..BATCH).map(|i| format!("p{p}-{n}-{i}")).collect();
                        n += 1;
                        let jobs: Vec<NewJob> = keys
                            .iter()
                            .map(|k| NewJob::new("b", &endpoint).with_idempotency_key(k))
                            .collect();
                        let sent = Instant::now();
                        let heard = match client.submit(&jobs).await {
                            Ok(reply) => {
                                Heard::Accepted(reply.jobs.into_iter().map(|j| j.id).collect())
                            }
                            Err(e) if e.status() == Some(503) => {
                                Heard::Refused(e.api().and_then(|a| a.retry_after))
                            }
                            Err(e) if e.status() == Some(504) => Heard::Unknown,
                            Err(e) if e.is_timeout() => Heard::NoAnswer,
                            Err(e) => Heard::Other(e.to_string()),
                        };
                        let took = sent.elapsed();
                        let pause = !matches!(heard, Heard::Accepted(_));
                        requests.lock().unwrap().push(Request {
                            keys,
                            heard,
                            took,
                            sent,
                        });
                        if pause {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                })
            })
            .collect();
        Producers {
            stop,
            requests,
            tasks,
        }
    }

    fn accepted(&self) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| matches!(r.heard, Heard::Accepted(_)))
            .count()
    }

    async fn stop(self) -> Vec<Request> {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        let requests = self.requests.lock().unwrap().clone();
        requests
    }
}

/// `/readyz` looked at every 100 ms: when it changed, since `start`.
struct ReadyWatch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(Instant, bool)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    fn start(base: &str) -> ReadyWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (url, stopped, log) = (format!("{base}/readyz"), stop.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let client = reqwest::Client::new();
            while !stopped.load(Ordering::SeqCst) {
                let ready = matches!(
                    client.get(&url).timeout(Duration::from_secs(1)).send().await,
                    Ok(r) if r.status().is_success()
                );
                {
                    let mut log = log.lock().unwrap();
                    if log.last().map(|(_, r)| *r) != Some(ready) {
                        log.push((Instant::now(), ready));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        ReadyWatch { stop, seen, task }
    }

    fn now_ready(&self) -> bool {
        self.seen.lock().unwrap().last().is_some_and(|(_, r)| *r)
    }

    /// The first time readiness was `ready` at or after `after`.
    fn first(&self, ready: bool, after: Instant) -> Option<Instant> {
        let seen = self.seen.lock().unwrap();
        // The state in force at `after` counts from `after`.
        let before = seen.iter().rev().find(|(at, _)| *at <= after);
        if before.is_some_and(|(_, r)| *r == ready) {
            return Some(after);
        }
        seen.iter()
            .find(|(at, r)| *at > after && *r == ready)
            .map(|(at, _)| *at)
    }

    async fn stop(self) -> Vec<(Instant, bool)> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        let seen = self.seen.lock().unwrap().clone();
        seen
    }
}

/// A `spindle director` process with `--write-timeout-ms` given through its environment.
fn spawn_director(args: &[String], port: u16, write_timeout: Duration) -> Child {
    Command::new(spindle_bin())
        .args(args.iter().map(|a| a.replace("{port}", &port.to_string())))
        .env(
            "SPINDLE_WRITE_TIMEOUT_MS",
            write_timeout.as_millis().to_string(),
        )
        .env(
            "SPINDLE_LOG",
            std::env::var("SPINDLE_TEST_LOG").unwrap_or("warn".into()),
        )
        .kill_on_drop(true)
        .spawn()
        .expect("spawn spindle director")
}

/// A Director alone (`--registry mysql`) on `jobdb`, ready, with its base URL.
async fn spawn_alone(jobdb: &str, write_timeout: Duration) -> (Child, String) {
    let port = free_port();
    let director = spawn_director(
        &args(&[
            "director",
            "--registry",
            "mysql",
            "--jobdb",
            jobdb,
            "--listen",
            "127.0.0.1:{port}",
            "--allow-subnet",
            "127.0.0.0/8",
        ]),
        port,
        write_timeout,
    );
    let base = until_ready(port).await;
    (director, base)
}

/// The base URL of the Director listening on `port`, once it answers ready.
async fn until_ready(port: u16) -> String {
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_for(Duration::from_secs(60), "the director ready", || {
        ready(&client, &base)
    })
    .await;
    base
}

async fn ready(client: &reqwest::Client, base: &str) -> bool {
    matches!(
        client.get(format!("{base}/readyz")).timeout(Duration::from_millis(500)).send().await,
        Ok(r) if r.status().is_success()
    )
}

fn lock_seconds() -> u64 {
    std::env::var("SPINDLE_LOCK_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// What the drill measured.
struct Drill {
    write_timeout: Duration,
    /// The Director's `spindle_jobdb_write_rejections_total` samples afterwards.
    rejections: Vec<String>,
    requests: Vec<Request>,
    locked_at: Instant,
    unlocked_at: Instant,
    non_ready_after: Option<Duration>,
    ready_again_after: Option<Duration>,
}

/// Runs producers against `base`, locks the private server's tables for [`lock_seconds`]
/// meanwhile, calls `during` once the Director is non-ready (and `after` once it is ready
/// again), and returns what was heard.
async fn drill<D, A>(
    mariadb: &PrivateMariaDb,
    base: &str,
    write_timeout: Duration,
    endpoint: &str,
    during: impl FnOnce() -> D,
    after: impl FnOnce() -> A,
) -> Drill
where
    D: std::future::Future<Output = ()>,
    A: std::future::Future<Output = ()>,
{
    let watch = ReadyWatch::start(base);
    let producers = Producers::start(base, endpoint, 4);
    wait_for(
        Duration::from_secs(30),
        "submits before the lock",
        || async { producers.accepted() >= 20 },
    )
    .await;
    let mut lock = sqlx::mysql::MySqlConnection::connect(&mariadb.server())
        .await
        .unwrap();
    sqlx::query("FLUSH TABLES WITH READ LOCK")
        .execute(&mut lock)
        .await
        .unwrap();
    let locked_at = Instant::now();
    let hold = Duration::from_secs(lock_seconds());
    // Non-ready while the lock is held (the bound: the write timeout and a look).
    let deadline = locked_at + hold;
    while watch.now_ready() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !watch.now_ready() {
        during().await;
    }
    tokio::time::sleep_until(deadline.into()).await;
    sqlx::query("UNLOCK TABLES")
        .execute(&mut lock)
        .await
        .unwrap();
    lock.close().await.unwrap();
    let unlocked_at = Instant::now();
    wait_for(
        Duration::from_secs(30),
        "ready again after the lock",
        || async { watch.now_ready() },
    )
    .await;
    after().await;
    let accepted_then = producers.accepted();
    wait_for(
        Duration::from_secs(30),
        "submits accepted after the lock",
        || async { producers.accepted() >= accepted_then + 20 },
    )
    .await;
    let requests = producers.stop().await;
    let non_ready_after = watch.first(false, locked_at).map(|at| at - locked_at);
    let ready_again_after = watch
        .first(true, unlocked_at)
        .map(|at| at.saturating_duration_since(unlocked_at));
    watch.stop().await;
    let rejections = metrics_text(&reqwest::Client::new(), base)
        .await
        .lines()
        .filter(|l| l.starts_with("spindle_jobdb_write_rejections_total"))
        .map(str::to_owned)
        .collect();
    Drill {
        write_timeout,
        rejections,
        requests,
        locked_at,
        unlocked_at,
        non_ready_after,
        ready_again_after,
    }
}

/// Checks the drill's answers and the JobDB afterwards; prints the fault-table row.
async fn check(scenario: &str, drill: &Drill, url_text: &str, sink: &spindle::cli::sink::Sink) {
    let url: JobDbUrl = url_text.parse().unwrap();
    let Drill {
        write_timeout,
        rejections,
        requests,
        locked_at,
        unlocked_at,
        non_ready_after,
        ready_again_after,
    } = drill;
    let count = |f: &dyn Fn(&Heard) -> bool| requests.iter().filter(|r| f(&r.heard)).count();
    let refused = count(&|h| matches!(h, Heard::Refused(_)));
    let unknown = count(&|h| matches!(h, Heard::Unknown));
    let accepted = count(&|h| matches!(h, Heard::Accepted(_)));
    let during_lock = |r: &&Request| r.sent + r.took >= *locked_at && r.sent <= *unlocked_at;
    let longest = requests
        .iter()
        .filter(during_lock)
        .map(|r| r.took)
        .max()
        .unwrap_or_default();
    let others: Vec<_> = requests
        .iter()
        .filter(|r| matches!(r.heard, Heard::NoAnswer | Heard::Other(_)))
        .map(|r| (&r.heard, r.took))
        .collect();
    println!(
        "{scenario}: {} requests ({accepted} accepted, {refused} × 503, {unknown} × 504, {} other); \
         longest wait during the lock {:.2} s; non-ready {:?} after the lock, ready {:?} after \
         its release",
        requests.len(),
        others.len(),
        longest.as_secs_f64(),
        non_ready_after,
        ready_again_after,
    );
    println!("{scenario}: {rejections:?}");
    assert!(
        others.is_empty(),
        "{scenario}: requests without a 202, 503 or 504 in time: {others:?}"
    );
    assert!(
        longest <= *write_timeout + Duration::from_millis(1500),
        "{scenario}: a submit waited {longest:?} (write timeout {write_timeout:?})"
    );
    for r in requests {
        if let Heard::Refused(retry_after) = r.heard {
            assert!(
                retry_after.is_some(),
                "{scenario}: a 503 without Retry-After"
            );
        }
    }
    assert!(
        refused + unknown > 0,
        "{scenario}: the lock refused nothing"
    );
    let non_ready_after =
        non_ready_after.unwrap_or_else(|| panic!("{scenario}: /readyz stayed 200 under the lock"));
    assert!(
        non_ready_after <= *write_timeout,
        "{scenario}: non-ready only {non_ready_after:?} after the lock"
    );
    let ready_again_after = ready_again_after.expect("ready again");
    assert!(
        ready_again_after <= Duration::from_secs(5),
        "{scenario}: ready again {ready_again_after:?} after the lock ended"
    );

    // What the JobDB holds, by idempotency key.
    let reader = JobDb::open_reader(&url, 2).await.unwrap();
    let mut conn = sqlx::mysql::MySqlConnection::connect(url_text)
        .await
        .unwrap();
    let stored: HashMap<String, i64> = sqlx::query_as::<_, (Vec<u8>, i64)>(
        "SELECT idempotency_key, COUNT(*) FROM jobs WHERE idempotency_key IS NOT NULL \
         GROUP BY idempotency_key",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .into_iter()
    .map(|(key, n)| (String::from_utf8(key).unwrap(), n))
    .collect();
    conn.close().await.unwrap();
    let mut accepted_ids = Vec::new();
    let (mut stored_504, mut absent_504) = (0usize, 0usize);
    for r in requests {
        for key in &r.keys {
            let n = stored.get(key).copied().unwrap_or(0);
            match &r.heard {
                Heard::Accepted(_) => {
                    assert_eq!(n, 1, "{scenario}: accepted {key} stored {n} times")
                }
                Heard::Refused(_) => {
                    assert_eq!(n, 0, "{scenario}: {key} answered 503, stored {n} times")
                }
                Heard::Unknown => {
                    assert!(n <= 1, "{scenario}: {key} answered 504, stored {n} times");
                    if n == 1 {
                        stored_504 += 1;
                    } else {
                        absent_504 += 1;
                    }
                }
                other => panic!("{scenario}: {other:?}"),
            }
        }
        if let Heard::Accepted(ids) = &r.heard {
            accepted_ids.extend(ids.iter().cloned());
        }
    }
    let total: i64 = stored.values().sum();
    try_wait_all_final(&reader, total as u64, Duration::from_secs(60))
        .await
        .unwrap_or_else(|why| panic!("{scenario}: {why}"));
    let histories = histories(&reader).await;
    let mut final_ = 0;
    for id in &accepted_ids {
        let history = &histories[&id.parse().unwrap()];
        assert_legal(history);
        assert_eq!(
            history.last().unwrap().state,
            State::Succeeded,
            "{history:#?}"
        );
        final_ += 1;
    }
    reader.close().await;
    // Nothing invented: every request the endpoint saw is a stored job's.
    let known: std::collections::HashSet<String> =
        histories.keys().map(|id| id.to_string()).collect();
    let per_job = sink.per_job();
    let invented = per_job.keys().filter(|id| !known.contains(*id)).count();
    let duplicates: usize = per_job
        .values()
        .map(|n| (*n as usize).saturating_sub(1))
        .sum();
    assert_eq!(invented, 0, "{scenario}: deliveries of jobs never stored");
    println!(
        "| {scenario} | {} | {final_} | {} | {invented} | {duplicates} | 503: {refused} \
         requests, none stored; 504: {unknown} requests ({stored_504} jobs stored once, \
         {absent_504} not stored); longest submit {:.2} s; non-ready {:.2} s after the lock, \
         ready {:.2} s after its release |",
        accepted_ids.len(),
        accepted_ids.len() - final_,
        longest.as_secs_f64(),
        non_ready_after.as_secs_f64(),
        ready_again_after.as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_director_alone_on_a_locked_jobdb_answers_in_time_and_is_not_ready() {
    let mariadb = tokio::task::block_in_place(PrivateMariaDb::start);
    let sink = spindle::cli::sink::Sink::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url_text = mariadb.url("spindle_stall");
    let (mut director, base) = spawn_alone(&url_text, WRITE_TIMEOUT).await;
    let client = reqwest::Client::new();
    let metrics = |name: &'static str| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let text = metrics_text(&client, &base).await;
            metric_value(&text, name)
        }
    };
    let (writable_during, writable_after) =
        (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
    let drill = drill(
        &mariadb,
        &base,
        WRITE_TIMEOUT,
        &sink.url("/ok"),
        || {
            let (m, w) = (metrics, writable_during.clone());
            async move { *w.lock().unwrap() = Some(m("spindle_jobdb_writable").await) }
        },
        || {
            let (m, w) = (metrics, writable_after.clone());
            async move { *w.lock().unwrap() = Some(m("spindle_jobdb_writable").await) }
        },
    )
    .await;
    check(
        "standalone director (`--registry mysql`)",
        &drill,
        &url_text,
        &sink,
    )
    .await;
    assert_eq!(
        *writable_during.lock().unwrap(),
        Some(0.0),
        "spindle_jobdb_writable under the lock"
    );
    assert_eq!(
        *writable_after.lock().unwrap(),
        Some(1.0),
        "spindle_jobdb_writable after it"
    );
    director.start_kill().unwrap();
    director.wait().await.unwrap();
    sink.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_director_on_a_locked_jobdb_leaves_the_catalog_until_it_can_write() {
    let mariadb = tokio::task::block_in_place(PrivateMariaDb::start);
    let consul = ConsulUnderTest::start().await;
    let double = consul
        .double
        .as_ref()
        .expect("the in-repo consul double")
        .url();
    let sink = spindle::cli::sink::Sink::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url_text = mariadb.url("spindle_stall_c");
    let url: JobDbUrl = url_text.parse().unwrap();
    JobDb::open(&url, true, 1).await.unwrap().close().await;
    let inventory = Inventory::new(consul.client.clone());
    assert!(inventory
        .add(&JobDbRecord {
            name: url.database.clone(),
            url: url_text.clone(),
            state: JobDbState::Spare,
            changed_at: chrono::Utc::now(),
            changed_by: "test".to_owned(),
        })
        .await
        .unwrap());
    let port = free_port();
    let mut director = spawn_director(
        &args(&[
            "director",
            "--registry",
            "consul",
            "--consul-addr",
            &double,
            "--listen",
            "127.0.0.1:{port}",
            "--lock-ttl-ms",
            "1000",
            "--lock-delay-ms",
            "500",
            "--service-ttl-ms",
            "2000",
            "--campaign-retry-ms",
            "200",
            "--director-id",
            "stall",
            "--allow-subnet",
            "127.0.0.0/8",
        ]),
        port,
        CLUSTER_WRITE_TIMEOUT,
    );
    let base = until_ready(port).await;
    let healthy = || {
        let consul = consul.client.clone();
        async move {
            catalog::healthy_directors(&consul)
                .await
                .map(|d| d.len())
                .unwrap_or(usize::MAX)
        }
    };
    wait_for(
        Duration::from_secs(10),
        "registered and passing",
        || async { healthy().await == 1 },
    )
    .await;
    let (left, came_back) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
    let drill = drill(
        &mariadb,
        &base,
        CLUSTER_WRITE_TIMEOUT,
        &sink.url("/ok"),
        || {
            let left = left.clone();
            async move {
                let since = Instant::now();
                wait_for(
                    Duration::from_secs(10),
                    "the catalog check critical",
                    || async { healthy().await == 0 },
                )
                .await;
                *left.lock().unwrap() = Some(since.elapsed());
            }
        },
        || {
            let came_back = came_back.clone();
            async move {
                let since = Instant::now();
                wait_for(
                    Duration::from_secs(10),
                    "the catalog check passing again",
                    || async { healthy().await == 1 },
                )
                .await;
                *came_back.lock().unwrap() = Some(since.elapsed());
            }
        },
    )
    .await;
    check(
        "cluster director (`--registry consul`)",
        &drill,
        &url_text,
        &sink,
    )
    .await;
    println!(
        "catalog: critical {:?} after non-ready, passing {:?} after ready",
        left.lock().unwrap(),
        came_back.lock().unwrap()
    );
    director.start_kill().unwrap();
    director.wait().await.unwrap();
    sink.stop().await;
    consul.stop().await;
}

/// A bounded write's COMMIT that gets no answer is neither waited for forever nor guessed at:
/// it fails `CommitStalled` within its bound, and only once `settle` has made sure the server
/// is done with that connection does a read tell whether it committed. Both ways: a COMMIT the
/// server never received must not commit later (the held packet is let through afterwards),
/// and one it committed whose answer was lost reads as committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_without_an_answer_is_settled_before_it_is_read() {
    let mariadb = tokio::task::block_in_place(PrivateMariaDb::start);
    let direct: JobDbUrl = mariadb.url("spindle_commit").parse().unwrap();
    JobDb::open(&direct, true, 1).await.unwrap().close().await;
    let proxy = SqlProxy::start(mariadb.port).await;
    let proxied: JobDbUrl = format!("mysql://root@127.0.0.1:{}/spindle_commit", proxy.port)
        .parse()
        .unwrap();
    let db = JobDb::open(&proxied, false, 2).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let reader = sqlx::MySqlPool::connect(&mariadb.url("spindle_commit"))
        .await
        .unwrap();
    let bounds = spindle::jobdb::Bounds {
        work: Some(Duration::from_secs(5)),
        commit: Some(Duration::from_millis(500)),
        not_after: None,
    };
    for (hold, open_from, committed) in [(Hold::Commit, 111, false), (Hold::Answer, 222, true)] {
        proxy.arm(hold);
        let append = spindle::jobdb::Append {
            checkpoint: Some(open_from),
            ..Default::default()
        };
        let started = Instant::now();
        let stalled = match db.append_bounded(token, &append, &bounds).await {
            Err(spindle::jobdb::JobDbError::CommitStalled(stalled)) => stalled,
            other => panic!("expected a stalled commit, got {other:?}"),
        };
        assert!(proxy.holding());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the commit's bound is 500 ms, it took {:?}",
            started.elapsed()
        );
        let mut stalled = Some(stalled);
        db.settle(&mut stalled).await.unwrap();
        let read = || async {
            sqlx::query_scalar::<_, u64>("SELECT open_from FROM jobdb_checkpoint WHERE id = 1")
                .fetch_one(&reader)
                .await
                .unwrap()
        };
        let seen = read().await;
        assert_eq!(seen == open_from, committed, "read {seen} after settling");
        // What the proxy held goes through now: a COMMIT the server never got cannot commit
        // any more (its connection is gone), nor change what was read.
        proxy.release();
        let again = db
            .append_bounded(token, &spindle::jobdb::Append::default(), &bounds)
            .await;
        assert!(again.is_ok(), "the pool writes on: {again:?}");
        assert_eq!(
            read().await,
            seen,
            "the held commit changed the jobdb after settling"
        );
    }
    db.close().await;
    reader.close().await;
}
