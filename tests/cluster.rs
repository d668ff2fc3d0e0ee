//! Many Directors coordinated through Consul (the in-repo double), as real processes on real
//! JobDBs: each holds exactly one JobDB; a killed Director's JobDB is taken over and finished;
//! a paused Director that outlived its session is fenced out; Consul faults never produce two
//! writers, and service resumes after them.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use spindle::job::State;
use spindle::registry::catalog;
use spindle::registry::inventory::{Inventory, JobDbRecord, JobDbState};
use spindle::sink::Sink;
use tokio::process::{Child, Command};

const TTL: Duration = Duration::from_secs(1);
const LOCK_DELAY: Duration = Duration::from_millis(500);

struct Director {
    child: Child,
    base: String,
    port: u16,
}

impl Director {
    fn spawn(consul: &str, id: &str) -> Director {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args([
                "director",
                "--registry",
                "consul",
                "--consul-addr",
                consul,
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--lock-ttl-ms",
                &TTL.as_millis().to_string(),
                "--lock-delay-ms",
                &LOCK_DELAY.as_millis().to_string(),
                "--service-ttl-ms",
                "3000",
                "--campaign-retry-ms",
                "200",
                "--director-id",
                id,
                "--allow-subnet",
                "127.0.0.0/8",
                "--log",
                "warn",
            ])
            .kill_on_drop(true)
            .spawn()
            .expect("spawn director");
        Director {
            child,
            base: format!("http://127.0.0.1:{port}"),
            port,
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().expect("running") as i32);
        nix::sys::signal::kill(pid, signal).expect("signal");
    }

    async fn ready(&self, client: &reqwest::Client) -> bool {
        let probe = client
            .get(format!("{}/readyz", self.base))
            .timeout(Duration::from_millis(500));
        matches!(probe.send().await, Ok(r) if r.status().is_success())
    }

    async fn metric(&self, client: &reqwest::Client, name: &str) -> Option<f64> {
        let text = client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }
}

struct Cluster {
    consul: ConsulUnderTest,
    inventory: Inventory,
    dbs: Vec<TestDb>,
    sink: Sink,
    client: reqwest::Client,
}

impl Cluster {
    async fn start(tag: &str, jobdbs: usize) -> Cluster {
        let consul = ConsulUnderTest::start().await;
        assert!(
            consul.double.is_some(),
            "the cluster tests use the in-repo double (fault hooks, 1 s TTLs)"
        );
        let inventory = Inventory::new(consul.client.clone());
        let mut dbs = Vec::new();
        for i in 0..jobdbs {
            let db = TestDb::new(&format!("{tag}{i}"));
            spindle::jobdb::JobDb::open(&db.url, true, 1)
                .await
                .unwrap()
                .close()
                .await;
            let record = JobDbRecord {
                name: db.url.database.clone(),
                url: db.url_string(),
                state: JobDbState::Spare,
                changed_at: chrono::Utc::now(),
                changed_by: "test".to_owned(),
            };
            assert!(inventory.add(&record).await.unwrap());
            dbs.push(db);
        }
        Cluster {
            consul,
            inventory,
            dbs,
            sink: Sink::start("127.0.0.1:0".parse().unwrap()).await.unwrap(),
            client: reqwest::Client::new(),
        }
    }

    fn url(&self) -> String {
        self.consul.double.as_ref().unwrap().url()
    }

    /// JobDB name → lock holder session.
    async fn holders(&self) -> HashMap<String, Option<String>> {
        self.inventory
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.record.name, l.holder))
            .collect()
    }

    /// Port → JobDB of every healthy Director in the catalog.
    async fn catalog(&self) -> HashMap<u16, String> {
        catalog::healthy_directors(&self.consul.client)
            .await
            .unwrap()
            .into_iter()
            .map(|i| (i.port, i.meta.get("jobdb").cloned().unwrap_or_default()))
            .collect()
    }

    /// Waits until every Director is ready, registered, and on its own JobDB.
    async fn settled(&self, directors: &[&Director]) -> HashMap<u16, String> {
        wait_for(
            Duration::from_secs(30),
            "directors settled on distinct jobdbs",
            || async {
                for d in directors {
                    if !d.ready(&self.client).await {
                        return false;
                    }
                }
                let catalog = self.catalog().await;
                let jobdbs: HashSet<_> = directors
                    .iter()
                    .filter_map(|d| catalog.get(&d.port))
                    .collect();
                let held = self
                    .holders()
                    .await
                    .values()
                    .filter(|h| h.is_some())
                    .count();
                jobdbs.len() == directors.len() && held == directors.len()
            },
        )
        .await;
        self.catalog().await
    }

    fn db(&self, name: &str) -> &TestDb {
        self.dbs
            .iter()
            .find(|d| d.url.database == name)
            .expect("known jobdb")
    }

    async fn submit(&self, director: &Director, n: usize, path: &str, min_delay_ms: u64) -> usize {
        let jobs: Vec<_> = (0..n)
            .map(|i| json!({"bucket": format!("t{}", i % 3), "endpoint": self.sink.url(path), "backoff_min_delay_ms": min_delay_ms}))
            .collect();
        submit(&self.client, &director.base, jobs).await.jobs.len()
    }

    /// Asserts every job of a JobDB reached exactly one terminal state through a legal history.
    async fn assert_all_terminal(&self, name: &str, expected: u64) {
        let reader = self.db(name).open().await;
        wait_all_final(&reader, expected, Duration::from_secs(60)).await;
        let histories = histories(&reader).await;
        assert_eq!(histories.len() as u64, expected, "{name}");
        for history in histories.values() {
            assert_legal(history);
            assert_eq!(history.last().unwrap().state, State::Succeeded);
        }
        reader.close().await;
    }

    async fn stop(self) {
        self.sink.stop().await;
        self.consul.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_directors_five_jobdbs_and_a_kill_9() {
    let cluster = Cluster::start("ka", 5).await;
    let mut directors: Vec<Director> = (0..3)
        .map(|i| Director::spawn(&cluster.url(), &format!("d{i}")))
        .collect();
    let placement = cluster.settled(&directors.iter().collect::<Vec<_>>()).await;
    let spares = cluster
        .inventory
        .list()
        .await
        .unwrap()
        .iter()
        .filter(|l| l.record.state == JobDbState::Spare)
        .count();
    assert_eq!(spares, 2, "three jobdbs became active, two stay spare");

    // Work that is still retrying when the first Director dies.
    let mut submitted = HashMap::new();
    for d in &directors {
        let n = cluster.submit(d, 200, "/fail/1", 1500).await;
        submitted.insert(placement[&d.port].clone(), n as u64);
    }
    let victim = directors.remove(0);
    let orphan = placement[&victim.port].clone();
    let mut victim = victim;
    victim.child.start_kill().unwrap();
    victim.child.wait().await.unwrap();
    let killed = Instant::now();

    // The Director restarted (same id, as a supervisor would) takes its JobDB back once Consul
    // has expired the dead session (up to 2×TTL) and the lock-delay has run.
    let replacement = Director::spawn(&cluster.url(), "d0");
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
    drop(directors);
    drop(replacement);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_director_is_fenced_out() {
    use nix::sys::signal::Signal;
    let cluster = Cluster::start("st", 5).await;
    let directors: Vec<Director> = (0..3)
        .map(|i| Director::spawn(&cluster.url(), &format!("d{i}")))
        .collect();
    let placement = cluster.settled(&directors.iter().collect::<Vec<_>>()).await;
    let zombie = &directors[0];
    let jobdb = placement[&zombie.port].clone();

    // Keep it busy: slow deliveries, so attempts are in flight when it freezes.
    let n = cluster.submit(zombie, 400, "/slow/30", 200).await as u64;
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
    let successor = Director::spawn(&cluster.url(), "d9");
    wait_for(
        Duration::from_secs(20),
        "another director to take the jobdb",
        || async { cluster.catalog().await.get(&successor.port) == Some(&jobdb) },
    )
    .await;
    let owner_before = cluster.db(&jobdb).open().await.owner().await.unwrap();

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
    let owner_after = cluster.db(&jobdb).open().await.owner().await.unwrap();
    assert_eq!(owner_after.0, owner_before.0);
    cluster.assert_all_terminal(&jobdb, n).await;
    drop(directors);
    drop(successor);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_faults_never_make_two_writers_and_service_resumes() {
    let cluster = Cluster::start("cf", 4).await;
    let double = cluster.consul.double.as_ref().unwrap();
    let directors: Vec<Director> = (0..2)
        .map(|i| Director::spawn(&cluster.url(), &format!("d{i}")))
        .collect();
    let refs: Vec<&Director> = directors.iter().collect();
    let placement = cluster.settled(&refs).await;
    let mut submitted: HashMap<String, u64> = HashMap::new();
    for d in &directors {
        *submitted.entry(placement[&d.port].clone()).or_default() +=
            cluster.submit(d, 100, "/fail/1", 300).await as u64;
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
                for d in &directors {
                    ready += d.ready(&cluster.client).await as usize;
                }
                ready == 0
            },
        )
        .await;
        let stood_down = started.elapsed();
        tokio::time::sleep(TTL * 3 - stood_down.min(TTL * 3)).await;
        double.faults().clear();
        let placement = cluster.settled(&refs).await;
        println!("cluster: {fault}: all directors stood down within {:.2} s; service resumed {:.2} s after the fault began", stood_down.as_secs_f64(), started.elapsed().as_secs_f64());
        assert!(
            // Within the fault (the registry suite pins the loss itself to the TTL).
            stood_down < TTL * 3,
            "{fault}: stood down after {stood_down:?}"
        );
        for d in &directors {
            *submitted.entry(placement[&d.port].clone()).or_default() +=
                cluster.submit(d, 20, "/ok", 300).await as u64;
        }
    }
    for (name, n) in &submitted {
        cluster.assert_all_terminal(name, *n).await;
    }
    // SIGTERM: the Director leaves the catalog, releases its lock and exits 0.
    let mut leaving = directors.into_iter().next().unwrap();
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
