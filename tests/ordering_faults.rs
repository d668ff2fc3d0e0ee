//! The ways a key's order broke at the edges, each against real processes and MariaDB: a key's
//! jobs must go one at a time, in acceptance order, whatever fault comes at whatever moment.
//!
//! - `a_dead_directors_jobdb_drained_before_any_takeover_keeps_its_keys_in_order`: a Director
//!   dies with a key's first job under way and two waiting; its JobDB is retired before anyone
//!   takes it over, and a drainer moves the jobs to another Director's JobDB (once from a
//!   cluster Director, once from a Director that ran without peers, whose waiting jobs had no
//!   entry); the drained JobDB on MariaDB and on SQLite;
//! - `a_failed_or_unanswered_commit_that_lets_a_kept_job_go_on_keeps_it`: a Director alone
//!   whose commit that ends a key's job (and lets the kept next one go) fails, or loses its
//!   answer, then gets the key's next job;
//! - `a_director_that_joins_while_a_key_flows_waits_for_its_job_under_way`: a second Director
//!   joins a cluster while a key's job is under way on the first and gets the key's next job,
//!   with the reads of the first's JobDB slowed;
//! - `a_new_owner_held_at_its_first_commit_hides_no_job_of_a_key`: a Director dies with a key's
//!   job under way; a peer joins; the dead one's successor cannot commit at first (a lock on
//!   its checkpoint row), and the peer gets the key's next job meanwhile;
//! - `a_lost_commit_answer_still_delivers_the_ordered_jobs_it_bore`: a Director alone whose
//!   COMMIT that stores a key's jobs loses its answer.
//!
//! `SPINDLE_BIN` runs them against another build (docs/testing.md): how each was shown to fail
//! before the ordering part was carved.

mod common;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::procs::{args, free_port, Proc};
use common::sql_proxy::{Hold, SqlProxy};
use common::*;
use serde_json::{json, Value};
use spindle::cli::sink::Sink;
use spindle::jobdb::JobDb;
use spindle::registry::inventory::{JobDbRecord, JobDbState};

/// The port of the shared MariaDB, which the proxies sit in front of.
const MARIADB_PORT: u16 = 3306;

/// `n` jobs of ordering key `key` to `url`, in order.
fn keyed(url: &str, key: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"bucket": "b", "endpoint": url, "ordering_key": key, "payload": {"i": i}}))
        .collect()
}

/// Submits `jobs` to `base` in one request, until it is accepted; their ids.
async fn submit(client: &reqwest::Client, base: &str, jobs: Vec<Value>) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reply = client
            .post(format!("{base}/v1/jobs"))
            .json(&json!({ "jobs": jobs }))
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        if let Ok(r) = reply {
            if r.status().as_u16() == 202 {
                let body: Value = r.json().await.unwrap();
                return body["jobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|j| j["id"].as_str().unwrap().to_owned())
                    .collect();
            }
        }
        assert!(Instant::now() < deadline, "{base} never accepted the jobs");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// When each attempt of `job` at `/slow/{ms}` ended (the sink notes a slow request when it
/// answers).
fn ends(sink: &Sink, job: &str) -> Vec<Instant> {
    sink.received()
        .iter()
        .filter(|r| r.job_id == job && r.status == 200)
        .map(|r| r.at)
        .collect()
}

/// Waits until every job of `order` was delivered, then asserts they went one at a time in
/// that order: each one's first attempt began (it ends `took` after it began) after the last
/// attempt of the one before ended.
async fn assert_one_at_a_time(sink: &Sink, order: &[String], took: Duration, timeout: Duration) {
    let until = Instant::now() + timeout;
    while order.iter().any(|job| ends(sink, job).is_empty()) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let delivered: Vec<(&String, usize)> = order.iter().map(|j| (j, ends(sink, j).len())).collect();
    assert!(
        delivered.iter().all(|(_, n)| *n > 0),
        "not every job of the key was delivered within {timeout:?} (job, attempts ended, in the \
         key's order): {delivered:?}"
    );
    let slack = Duration::from_millis(150);
    for pair in order.windows(2) {
        let before = ends(sink, &pair[0]);
        let after = ends(sink, &pair[1]);
        let last = *before.iter().max().unwrap();
        let first = *after.iter().min().unwrap();
        assert!(
            first + slack >= last + took,
            "job {} began {:?} before job {} ended (each takes {took:?}; ends {before:?} and \
             {after:?})",
            pair[1],
            (last + took).saturating_duration_since(first),
            pair[0],
        );
    }
}

/// JobDB `{tag}_{name}` created on the shared server (not yet in the inventory); its name.
async fn create_jobdb(life: &Cluster, name: &str) -> String {
    let name = format!("{}_{name}", life.tag);
    let url = format!("{}/{name}", life.mysql);
    JobDb::open(&url.parse().unwrap(), true, 1)
        .await
        .unwrap()
        .close()
        .await;
    name
}

/// Lists JobDB `name`, at `url`, in the inventory in `state`.
async fn register(life: &Cluster, name: &str, url: &str, state: JobDbState) {
    let record = JobDbRecord {
        name: name.to_owned(),
        url: url.to_owned(),
        state,
        changed_at: chrono::Utc::now(),
        changed_by: "test".into(),
    };
    assert!(life.inventory.add(&record).await.unwrap());
}

/// Sets JobDB `name`'s inventory state.
async fn set_state(life: &Cluster, name: &str, state: JobDbState) {
    let listed = life.inventory.get(name).await.unwrap().expect("listed");
    assert!(life
        .inventory
        .set_state(&listed, state, "test")
        .await
        .unwrap());
}

/// Waits until JobDB `name` is owned (its lock held).
async fn wait_owned(life: &Cluster, name: &str) {
    wait_for(Duration::from_secs(30), "the jobdb owned", || async {
        life.holders().await.get(name).is_some_and(Option::is_some)
    })
    .await;
}

async fn a_dead_directors_jobdb_drained_keeps_its_keys_in_order(engine: Engine, peers: bool) {
    let life = Cluster::builder("ordrain").s3().start().await;
    // The drained JobDB on `engine`; the one the jobs move to on MariaDB.
    let db = TestDb::on(engine, "ordrain");
    let first_url = db.url_string();
    JobDb::open(&db.url, true, 1).await.unwrap().close().await;
    let first = first_url.rsplit('/').next().unwrap().to_owned();
    let mut d0 = match peers {
        true => {
            register(&life, &first, &first_url, JobDbState::Spare).await;
            life.director("d0")
        }
        // Without peers: its waiting jobs are kept in its book, with no entry.
        false => Proc::spawn(
            &args(&[
                "director",
                "--registry",
                "mysql",
                "--jobdb",
                &first_url,
                "--listen",
                "127.0.0.1:{port}",
                "--allow-subnet",
                "127.0.0.0/8",
            ]),
            0,
        ),
    };
    life.wait_ready([&d0]).await;
    let took = Duration::from_millis(6000);
    let url = life.sink.url("/slow/6000");
    let ids = submit(&life.client, &d0.base(), keyed(&url, "k", 3)).await;
    // Job 1 under way, jobs 2 and 3 waiting: the Director dies.
    tokio::time::sleep(Duration::from_secs(2)).await;
    d0.kill9().await;
    // Retired before anyone takes it over; another Director serves a spare, and a drainer
    // moves the jobs there.
    match peers {
        true => set_state(&life, &first, JobDbState::Retiring).await,
        false => register(&life, &first, &first_url, JobDbState::Retiring).await,
    }
    let (second, _) = life.add_jobdb("second", JobDbState::Spare).await;
    let d1 = life.director("d1");
    wait_owned(&life, &second).await;
    let drainer = life.drainer("dr");
    assert_one_at_a_time(&life.sink, &ids, took, Duration::from_secs(90)).await;
    drop((d1, drainer));
    life.stop().await;
}

/// A Director dies with a key's first job under way and two waiting; its JobDB is retired
/// before anyone takes it over, and a drainer moves the jobs to another Director's JobDB: the
/// moved jobs wait for the first, which the drainer records interrupted and moves last. A
/// cluster Director's waiting jobs have entries from the start; a Director without peers kept
/// them in its book, and the drainer gives them (and the job under way) their entries, in
/// their places, before it moves anything.
async fn a_dead_directors_jobdb_drained_before_any_takeover_keeps_its_keys_in_order(
    engine: Engine,
) {
    a_dead_directors_jobdb_drained_keeps_its_keys_in_order(engine, true).await;
    a_dead_directors_jobdb_drained_keeps_its_keys_in_order(engine, false).await;
}

on_both_engines!(a_dead_directors_jobdb_drained_before_any_takeover_keeps_its_keys_in_order);

/// A Director alone on a JobDB behind a proxy, with a 1 s write timeout; its base URL.
async fn alone_behind(proxy: &SqlProxy, database: &str) -> (Proc, String) {
    let url = proxy.url(database);
    let director = Proc::spawn_with_env(
        &args(&[
            "director",
            "--registry",
            "mysql",
            "--jobdb",
            &url,
            "--listen",
            "127.0.0.1:{port}",
            "--allow-subnet",
            "127.0.0.0/8",
        ]),
        free_port(),
        &[("SPINDLE_WRITE_TIMEOUT_MS", "1000")],
    );
    let base = director.base();
    wait_for(Duration::from_secs(60), "the director ready", || async {
        matches!(reqwest::get(format!("{base}/readyz")).await, Ok(r) if r.status().is_success())
    })
    .await;
    (director, base)
}

/// A Director alone: a key's first job P goes at once, the next, K, waits in the writer's
/// book (kept, no entry). The commit that ends P and lets K go on fails (`hold`: its COMMIT
/// never reaches the server, or the connection drops) or loses its answer (it committed).
/// Then the key's next job N comes: it must wait for K.
async fn a_commit_that_lets_a_kept_job_go_on(hold: Hold) {
    let test = TestDb::new(&format!("kept{}", format!("{hold:?}").to_lowercase()));
    JobDb::open(&test.url, true, 1).await.unwrap().close().await;
    let proxy = SqlProxy::start(MARIADB_PORT).await;
    let (mut director, base) = alone_behind(&proxy, &test.url.database).await;
    let sink = Sink::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let client = reqwest::Client::new();
    let took = Duration::from_millis(1500);
    let url = sink.url("/slow/1500");
    let pk = submit(&client, &base, keyed(&url, "k", 2)).await;
    // P's attempt is under way (its start committed): the next commit is the one that ends P.
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.arm(hold);
    wait_for(
        Duration::from_secs(10),
        "the commit that ends P",
        || async { proxy.holding() },
    )
    .await;
    // The writer gives up on it within its bound and finds out whether it committed.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    proxy.release();
    let n = submit(&client, &base, keyed(&url, "k", 1)).await;
    let order = [pk[0].clone(), pk[1].clone(), n[0].clone()];
    // Longer than `--rest-after-ms` (30 s), after which a job the writer lost track of rests
    // and goes by the sequencer.
    assert_one_at_a_time(&sink, &order, took, Duration::from_secs(45)).await;
    director.kill9().await;
    sink.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_unanswered_commit_that_lets_a_kept_job_go_on_keeps_it() {
    for hold in [Hold::Drop, Hold::Commit, Hold::Answer] {
        a_commit_that_lets_a_kept_job_go_on(hold).await;
    }
}

/// A cluster whose one Director, d0, has a key's job under way (5 s); a second Director, d1,
/// joins and gets the key's next job. Every read of d0's JobDB that names `jobs_fresh` is slowed
/// by 1.5 s (a proxy in front of it; less than a peer read's 2 s bound), and d0 makes a commit
/// in that window: d1 must find the job under way, and the next waits for it to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_director_that_joins_while_a_key_flows_waits_for_its_job_under_way() {
    let life = Cluster::builder("orjoin").start().await;
    let proxy = SqlProxy::start(MARIADB_PORT).await;
    proxy.delay("jobs_fresh", Duration::from_millis(1500));
    let a = create_jobdb(&life, "a").await;
    register(&life, &a, &proxy.url(&a), JobDbState::Spare).await;
    let d0 = life.director("d0");
    wait_owned(&life, &a).await;
    life.wait_ready([&d0]).await;
    let took = Duration::from_millis(5000);
    let slow = life.sink.url("/slow/5000");
    let first = submit(&life.client, &d0.base(), keyed(&slow, "long", 1)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (b, _) = life.add_jobdb("b", JobDbState::Spare).await;
    let d1 = life.director("d1");
    wait_owned(&life, &b).await;
    life.wait_ready([&d1]).await;
    // The key's next job on d1, and (a moment later) other work on d0, whose commit then
    // finds a peer live.
    let next = tokio::spawn({
        let (client, base, slow) = (life.client.clone(), d1.base(), slow.clone());
        async move { submit(&client, &base, keyed(&slow, "long", 1)).await }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let ok = life.sink.url("/ok");
    submit(&life.client, &d0.base(), keyed(&ok, "other", 1)).await;
    let next = next.await.unwrap();
    let order = [first[0].clone(), next[0].clone()];
    assert_one_at_a_time(&life.sink, &order, took, Duration::from_secs(60)).await;
    drop((d0, d1));
    life.stop().await;
}

/// A cluster Director, d0, dies with a key's job under way (8 s); a peer, d1, joins on a spare;
/// d0 starts again on its JobDB, but its first commit waits (an operator's transaction holds
/// the checkpoint row) while d1 gets the key's next job: d1 must find the job d0 had under
/// way, and the next waits until d0, able to write again, has retried it and it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_held_at_its_first_commit_hides_no_job_of_a_key() {
    use sqlx::Connection;
    let life = Cluster::builder("ortake").start().await;
    let (a, _) = life.add_jobdb("a", JobDbState::Spare).await;
    let mut d0 = life.director("d0");
    wait_owned(&life, &a).await;
    life.wait_ready([&d0]).await;
    let took = Duration::from_millis(8000);
    let slow = life.sink.url("/slow/8000");
    let first = submit(&life.client, &d0.base(), keyed(&slow, "long", 1)).await;
    // Its attempt under way (8 s), d0 dies.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d0.kill9().await;
    // A peer on a spare, at once (d0's lock is still held: d1 takes the spare).
    let (b, _) = life.add_jobdb("b", JobDbState::Spare).await;
    let d1 = life.director("d1");
    wait_owned(&life, &b).await;
    life.wait_ready([&d1]).await;
    // An operator's transaction holds the checkpoint row: d0's next owner cannot commit.
    let mut lock = sqlx::MySqlConnection::connect(&format!("{}/{a}", life.mysql))
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut lock).await.unwrap();
    sqlx::query("SELECT open_from FROM jobdb_checkpoint WHERE id = 1 FOR UPDATE")
        .execute(&mut lock)
        .await
        .unwrap();
    d0.restart().await;
    wait_owned(&life, &a).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let next = submit(&life.client, &d1.base(), keyed(&slow, "long", 1)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    sqlx::query("ROLLBACK").execute(&mut lock).await.unwrap();
    let order = [first[0].clone(), next[0].clone()];
    assert_one_at_a_time(&life.sink, &order, took, Duration::from_secs(90)).await;
    drop((d0, d1, lock));
    life.stop().await;
}

/// A Director alone whose COMMIT stores a key's jobs (the first born released: fresh, no
/// `open_jobs` entry; the others kept in its book) and whose answer is lost: once it has read
/// that the commit happened, it holds what it planned for that commit (its book kept the
/// change), so the first job goes, and the others after it, in order, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_answer_still_delivers_the_ordered_jobs_it_bore() {
    let test = TestDb::new("bore");
    JobDb::open(&test.url, true, 1).await.unwrap().close().await;
    let proxy = SqlProxy::start(MARIADB_PORT).await;
    let sink = Sink::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (mut director, base) = alone_behind(&proxy, &test.url.database).await;
    let client = reqwest::Client::new();
    // The next COMMIT's answer is held: the submit's, which bears the key's first job.
    proxy.arm(Hold::Answer);
    let jobs = keyed(&sink.url("/capture"), "k", 3);
    let answer = client
        .post(format!("{base}/v1/jobs"))
        .json(&json!({ "jobs": jobs }))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    assert!(proxy.holding(), "the submit's COMMIT answer was held");
    // Committed, so 202 (told in time) or 504 (unknown): never 503.
    assert!(
        matches!(answer.status().as_u16(), 202 | 504),
        "submit answered {}",
        answer.status()
    );
    let received = || {
        sink.received()
            .iter()
            .filter(|r| r.path == "/capture")
            .map(|r| {
                let body: Value = serde_json::from_slice(&r.body).unwrap();
                (body["i"].as_i64().unwrap(), r.status)
            })
            .collect::<Vec<_>>()
    };
    wait_for(Duration::from_secs(30), "the key's three jobs", || async {
        received()
            .iter()
            .filter(|(_, status)| *status == 200)
            .count()
            >= 3
    })
    .await;
    assert_eq!(
        received(),
        [(0, 200), (1, 200), (2, 200)],
        "in order, once each"
    );
    proxy.release();
    director.kill9().await;
    sink.stop().await;
}
