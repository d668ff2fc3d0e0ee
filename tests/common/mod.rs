//! Test harness: a uniquely named JobDB per test (dropped afterwards), Directors and sinks on
//! free loopback ports, waits on conditions instead of sleeps, ([`s3`]) an S3 server behind a
//! fault proxy, and ([`cluster`]) a cluster of `spindle` processes on Consul.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde_json::{json, Value};
use spindle::director::{self, Director, DirectorConfig};
use spindle::job::{JobId, State, Transition};
use spindle::jobdb::{self, JobDb, JobDbUrl};
use spindle::rpc::api::SubmitReply;

pub mod browser;
pub mod cluster;
pub mod mariadb;
pub mod procs;
pub mod redis_server;
pub mod s3;
pub mod sql_proxy;

/// The MySQL server the tests use (the machine's MariaDB unless overridden).
pub fn mysql_server() -> String {
    std::env::var("SPINDLE_TEST_MYSQL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned())
}

/// The JobDB engines; tests that must hold on both take one ([`on_both_engines!`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    MySql,
    Sqlite,
}

/// The directory SQLite test JobDBs live in (each test's file has a unique name).
pub fn sqlite_dir() -> std::path::PathBuf {
    std::env::temp_dir().join("spindle-tests")
}

/// Runs the async test function `$name(engine)` as two tests, `$name::mysql` and
/// `$name::sqlite`.
#[macro_export]
macro_rules! on_both_engines {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn mysql() {
                    super::$name($crate::common::Engine::MySql).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name($crate::common::Engine::Sqlite).await
                }
            }
        )+
    };
}

/// A JobDB of this test alone, dropped when the value is.
pub struct TestDb {
    pub url: JobDbUrl,
    url_text: String,
}

impl TestDb {
    /// A MySQL JobDB.
    pub fn new(tag: &str) -> Self {
        Self::on(Engine::MySql, tag)
    }

    /// A JobDB on `engine`.
    pub fn on(engine: Engine, tag: &str) -> Self {
        let name = format!(
            "spindle_t_{tag}_{}",
            ulid::Ulid::new().to_string().to_lowercase()
        );
        let name = &name[..name.len().min(48)];
        let server = match engine {
            Engine::MySql => mysql_server(),
            Engine::Sqlite => format!("sqlite://{}", sqlite_dir().display()),
        };
        let url_text = format!("{server}/{name}");
        TestDb {
            url: url_text.parse().expect("test jobdb url"),
            url_text,
        }
    }

    pub fn url_string(&self) -> String {
        self.url_text.clone()
    }

    /// A reader on the JobDB (it must exist: start a Director first).
    pub async fn open(&self) -> JobDb {
        JobDb::open(&self.url, false, 2)
            .await
            .expect("open test jobdb")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let url = self.url.clone();
        // Drop runs outside async context: use a private runtime on a plain thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async { jobdb::drop_database(&url).await })
        })
        .join();
    }
}

/// A Director on `db`, on a free port, with fast test-friendly settings adjusted by `tweak`.
pub async fn start_director(db: &TestDb, tweak: impl FnOnce(&mut DirectorConfig)) -> Director {
    let mut config = DirectorConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    config.lock_check_interval = Duration::from_millis(200);
    config.scheduler.shutdown_grace = Duration::from_secs(10);
    // The tests' endpoints are on loopback, which the address guard blocks by default.
    config.delivery.allow_subnets = vec!["127.0.0.0/8".parse().unwrap()];
    tweak(&mut config);
    director::start(config).await.expect("director starts")
}

pub fn base(director: &Director) -> String {
    format!("http://{}", director.addr())
}

/// Submits jobs (JSON objects in the `POST /v1/jobs` job schema) through the client crate and
/// returns the accepted answer (panics on anything else).
pub async fn submit(client: &reqwest::Client, base: &str, jobs: Vec<Value>) -> SubmitReply {
    let jobs: Vec<spindle_client::NewJob> = jobs
        .into_iter()
        .map(|job| serde_json::from_value(job).expect("a job in the submit schema"))
        .collect();
    spindle_client::Client::from_reqwest(client.clone(), base, None)
        .expect("api client")
        .submit(&jobs)
        .await
        .unwrap_or_else(|e| panic!("submit failed: {e}"))
}

/// Waits until `check` holds, polling every 20 ms, failing after `timeout`.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until no job of the JobDB is in a non-terminal state except those allowed.
pub async fn wait_all_final(db: &JobDb, expected_jobs: u64, timeout: Duration) {
    if let Err(why) = try_wait_all_final(db, expected_jobs, timeout).await {
        panic!("{why}");
    }
}

/// [`wait_all_final`], saying why it gave up instead of panicking (so a test can add what it
/// knows of the Director before failing).
pub async fn try_wait_all_final(
    db: &JobDb,
    expected_jobs: u64,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let counts = db.count_by_state().await.expect("count");
        let total: u64 = counts.values().sum();
        let open: u64 = counts
            .iter()
            .filter(|(s, _)| !s.is_terminal())
            .map(|(_, n)| n)
            .sum();
        if total >= expected_jobs && open == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "jobdb {}: jobs not final in time: {counts:?}, expected {expected_jobs}",
                db.name()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every job's history, by job.
pub async fn histories(db: &JobDb) -> BTreeMap<JobId, Vec<Transition>> {
    let mut out: BTreeMap<JobId, Vec<Transition>> = BTreeMap::new();
    for (_, t) in db.all_transitions().await.expect("transitions") {
        out.entry(t.job_id).or_default().push(t);
    }
    out
}

/// Asserts a history is legal: starts awaiting-scheduling (or, for a job imported from a
/// retired JobDB, with its `imported` awaiting-retry row), each step allowed, attempts never
/// decrease, at most one terminal state and only at the end.
pub fn assert_legal(history: &[Transition]) {
    let imported = history[0].state == State::AwaitingRetry
        && history[0].error_type.as_deref() == Some("imported");
    assert!(
        history[0].state == State::AwaitingScheduling || imported,
        "{history:#?}"
    );
    for pair in history.windows(2) {
        assert!(
            pair[0].state.may_precede(pair[1].state),
            "illegal step in {history:#?}"
        );
        assert!(
            pair[1].attempts >= pair[0].attempts,
            "attempts went down in {history:#?}"
        );
        assert!(
            pair[1].time >= pair[0].time,
            "time went back in {history:#?}"
        );
    }
    let terminal = history.iter().filter(|t| t.state.is_terminal()).count();
    assert!(terminal <= 1, "several terminal states in {history:#?}");
}

pub fn states(history: &[Transition]) -> Vec<State> {
    history.iter().map(|t| t.state).collect()
}

/// A percentile of durations, in milliseconds.
pub fn percentile_ms(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i].as_secs_f64() * 1000.0
}

/// The Consul the registry tests talk to: a real agent when `CONSUL_HTTP_ADDR` is set, else an
/// in-repo `consul-double` with fast session TTLs and fault hooks.
pub struct ConsulUnderTest {
    pub client: spindle::registry::consul::ConsulClient,
    pub double: Option<consul_double::ConsulDouble>,
    /// A key prefix of this test alone.
    pub prefix: String,
    /// The shortest session TTL the server accepts (1 s on the double, 10 s on Consul).
    pub ttl: Duration,
}

impl ConsulUnderTest {
    pub async fn start() -> Self {
        let prefix = format!(
            "spindle-test/{}",
            ulid::Ulid::new().to_string().to_lowercase()
        );
        match std::env::var("CONSUL_HTTP_ADDR") {
            Ok(addr) if !addr.is_empty() => ConsulUnderTest {
                client: spindle::registry::consul::ConsulClient::new(
                    &addr,
                    std::env::var("CONSUL_HTTP_TOKEN")
                        .ok()
                        .map(spindle::secret::Secret::new),
                )
                .expect("consul client"),
                double: None,
                prefix,
                ttl: Duration::from_secs(10),
            },
            _ => {
                let config = consul_double::Config {
                    listen: "127.0.0.1:0".parse().unwrap(),
                    session_ttl_min: Duration::from_secs(1),
                    ..consul_double::Config::default()
                };
                let double = consul_double::ConsulDouble::start(config)
                    .await
                    .expect("consul double");
                ConsulUnderTest {
                    client: spindle::registry::consul::ConsulClient::new(&double.url(), None)
                        .unwrap(),
                    double: Some(double),
                    prefix,
                    ttl: Duration::from_secs(1),
                }
            }
        }
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.prefix)
    }

    pub async fn stop(self) {
        if let Some(double) = self.double {
            double.stop().await;
        } else {
            let _ = self.client.kv_delete_prefix(&self.prefix).await;
        }
    }
}

/// One Director on its own JobDB, a recording endpoint, an HTTP client and a JobDB reader.
pub struct Rig {
    pub db: TestDb,
    pub sink: spindle::cli::sink::Sink,
    pub client: reqwest::Client,
    pub reader: JobDb,
    director: Option<Director>,
}

impl Rig {
    pub async fn start(tag: &str, tweak: impl FnOnce(&mut DirectorConfig)) -> Rig {
        Self::start_on(Engine::MySql, tag, tweak).await
    }

    /// [`Rig::start`] on a JobDB of `engine`.
    pub async fn start_on(
        engine: Engine,
        tag: &str,
        tweak: impl FnOnce(&mut DirectorConfig),
    ) -> Rig {
        let db = TestDb::on(engine, tag);
        let sink = spindle::cli::sink::Sink::start("127.0.0.1:0".parse().unwrap())
            .await
            .expect("sink");
        let director = start_director(&db, tweak).await;
        let reader = db.open().await;
        Rig {
            db,
            sink,
            client: reqwest::Client::new(),
            reader,
            director: Some(director),
        }
    }

    pub fn director(&self) -> &Director {
        self.director.as_ref().expect("a director is running")
    }

    pub fn base(&self) -> String {
        base(self.director())
    }

    pub async fn submit(&self, jobs: Vec<Value>) -> SubmitReply {
        submit(&self.client, &self.base(), jobs).await
    }

    /// The client crate's client of this Director's API (no token).
    pub fn api(&self) -> spindle_client::Client {
        spindle_client::Client::from_reqwest(self.client.clone(), &self.base(), None)
            .expect("api client")
    }

    /// `GET /v1/jobs/{id}`: the job's view, as JSON.
    pub async fn job_view(&self, id: &str) -> Value {
        self.client
            .get(format!("{}/v1/jobs/{id}", self.base()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `n` jobs to one sink path with extra job fields.
    pub fn jobs(&self, n: usize, path: &str, extra: Value) -> Vec<Value> {
        (0..n)
            .map(|_| {
                let mut job = json!({"bucket": "b", "endpoint": self.sink.url(path)});
                job.as_object_mut()
                    .unwrap()
                    .extend(extra.as_object().cloned().unwrap_or_default());
                job
            })
            .collect()
    }

    /// Waits until exactly `n` jobs are in `state`.
    pub async fn wait_in_state(&self, state: State, n: u64, timeout: Duration) {
        wait_for(timeout, &format!("{n} jobs {state}"), || async {
            self.reader
                .count_by_state()
                .await
                .expect("count")
                .get(&state)
                == Some(&n)
        })
        .await;
    }

    /// Stops the Director cleanly (SIGTERM semantics) and asserts it exited without error.
    pub async fn stop_director(&mut self) {
        let director = self.director.take().expect("a director is running");
        director.shutdown();
        director.wait().await.expect("clean stop");
    }

    /// Starts a new Director on the same JobDB.
    pub async fn restart_director(&mut self, tweak: impl FnOnce(&mut DirectorConfig)) {
        assert!(self.director.is_none(), "stop the running director first");
        self.director = Some(start_director(&self.db, tweak).await);
    }

    /// Takes the running Director out, e.g. to observe how it ends.
    pub fn take_director(&mut self) -> Director {
        self.director.take().expect("a director is running")
    }

    pub async fn stop(mut self) {
        if self.director.is_some() {
            self.stop_director().await;
        }
        self.reader.close().await;
        self.sink.stop().await;
    }
}

/// Submits `jobs()` to `base` every `every` for `run`, then returns each job's
/// submit-to-delivery latency (first arrival at the sink's `/ok`): a steady load's latencies.
pub async fn steady_latencies(
    client: &reqwest::Client,
    base: &str,
    sink: &spindle::cli::sink::Sink,
    every: Duration,
    run: Duration,
    jobs: impl Fn() -> Vec<Value>,
) -> Vec<Duration> {
    let mut submitted: std::collections::HashMap<String, std::time::Instant> =
        std::collections::HashMap::new();
    let started = std::time::Instant::now();
    let mut tick = tokio::time::interval(every);
    while started.elapsed() < run {
        tick.tick().await;
        let at = std::time::Instant::now();
        for job in submit(client, base, jobs()).await.jobs {
            submitted.insert(job.id, at);
        }
    }
    delivery_latencies(sink, &submitted, Duration::from_secs(30)).await
}

/// Waits until the sink received every submitted job (id → submit instant), then returns each
/// job's submit-to-delivery latency (first arrival at `/ok`).
pub async fn delivery_latencies(
    sink: &spindle::cli::sink::Sink,
    submitted: &std::collections::HashMap<String, std::time::Instant>,
    timeout: Duration,
) -> Vec<Duration> {
    wait_for(timeout, "deliveries", || async {
        let per_job = sink.per_job();
        submitted.keys().all(|id| per_job.contains_key(id))
    })
    .await;
    let mut arrived: std::collections::HashMap<String, std::time::Instant> =
        std::collections::HashMap::new();
    for r in sink.received().into_iter().filter(|r| r.path == "/ok") {
        arrived.entry(r.job_id).or_insert(r.at);
    }
    submitted
        .iter()
        .map(|(id, at)| arrived[id].duration_since(*at))
        .collect()
}

/// `binary`, installing Debian's `package` first if `binary version_arg` does not run: the
/// tools some tests drive (promtool, Chromium, docker-compose) on a machine that lacks them.
pub fn debian_tool(binary: &'static str, version_arg: &str, package: &str) -> &'static str {
    use std::process::Command;
    let present = || {
        Command::new(binary)
            .arg(version_arg)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !present() {
        // Test binaries run side by side: wait for another's apt-get instead of failing on its lock.
        let apt = "apt-get -o DPkg::Lock::Timeout=600";
        let install = format!("DEBIAN_FRONTEND=noninteractive {apt} install -y -qq {package}");
        let installed = Command::new("sh")
            .args([
                "-c",
                &format!("{install} || ({apt} update -qq && {install})"),
            ])
            .status()
            .expect("apt-get");
        assert!(
            installed.success() && present(),
            "could not install {package} (for {binary})"
        );
    }
    binary
}

/// Runs Prometheus's own `promtool check metrics` over an exposition (installing Debian's
/// `prometheus` package first if `promtool` is missing).
pub fn promtool_accepts(exposition: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(debian_tool("promtool", "--version", "prometheus"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let complaints =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check metrics: {complaints}");
}

/// The `/metrics` text of the server at `base`.
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of an unlabelled sample `name` in a `/metrics` text (0 when absent).
pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Runs schemathesis (from PyPI, installed on first use) against the OpenAPI document at
/// `spec`: every check except "schema-valid request accepted" (some rules cannot be written in
/// JSON Schema, so a valid-looking request may rightly get a 4xx naming its field), 100
/// examples per operation, a fixed seed. Panics with its report if it finds a problem.
pub async fn schemathesis_passes(spec: &str) {
    use std::process::Command;
    let available = || {
        Command::new("schemathesis")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !available() {
        let installed = Command::new("python3")
            .args(["-m", "pip", "install", "-q", "schemathesis==4.32.5"])
            .status()
            .expect("pip");
        assert!(
            installed.success(),
            "could not install schemathesis from PyPI"
        );
    }
    assert!(available(), "schemathesis not on PATH");
    let spec = spec.to_owned();
    let run = tokio::task::spawn_blocking(move || {
        Command::new("schemathesis")
            .args(["run", &spec, "--checks", "all"])
            .args(["--exclude-checks", "positive_data_acceptance"])
            .args([
                "--max-examples",
                "100",
                "--workers",
                "1",
                "--seed",
                "20261121",
            ])
            .env("SCHEMATHESIS_HOOKS", "")
            .output()
            .expect("schemathesis runs")
    });
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("within 10 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("generated") || l.contains("passed") || l.contains("failed"))
        .collect();
    println!("schemathesis: {}", summary.join(" | "));
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An HTTP endpoint no server library would write: it answers a status line and then sends
/// one more header line every `every`, forever (headers that never end). Returns its URL;
/// it stops with the test's runtime.
pub async fn endless_headers(every: Duration) -> String {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                // Read (and drop) whatever the client sends, then start the endless answer.
                let mut buf = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_millis(200), async {
                    use tokio::io::AsyncReadExt;
                    let _ = socket.read(&mut buf).await;
                })
                .await;
                if socket.write_all(b"HTTP/1.1 200 OK\r\n").await.is_err() {
                    return;
                }
                for i in 0u64.. {
                    let line = format!("x-never-ends-{i}: {}\r\n", "v".repeat(64));
                    if socket.write_all(line.as_bytes()).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            });
        }
    });
    format!("http://{addr}/endless")
}

/// A job as a router or a drainer sends it to `POST /v1/import`: bucket `b`, no payload,
/// `attempts` made so far, due now, expiring in an hour.
pub fn import_form(
    id: ulid::Ulid,
    endpoint: String,
    attempts: u16,
) -> spindle::rpc::import::ImportJob {
    let now = chrono::Utc::now();
    spindle::rpc::import::ImportJob {
        id: id.to_string(),
        bucket: "b".into(),
        endpoint,
        method: "POST".into(),
        headers: vec![],
        payload: None,
        payload_base64: None,
        execution_timeout_ms: 10_000,
        backoff_min_delay_ms: 1_000,
        backoff_coefficient: 2.0,
        created_at: now,
        expire_at: now + chrono::Duration::hours(1),
        idempotency_key: None,
        on_complete: None,
        ordering_key: None,
        ordering_failure: None,
        ordering_position: None,
        event: None,
        attempts,
        retry_at: now,
        traceparent: None,
        tracestate: None,
    }
}

/// Runs an operator's statement with a connection of its own, as `mysql` or `sqlite3` would.
pub async fn operator_sql(db: &JobDb, sql: &str) {
    try_sql(db.url(), sql).await.unwrap();
}

/// Runs `sql` as an operator would, on its own connection to the database at `url`; the
/// database's answer if it refuses.
pub async fn try_sql(url: &JobDbUrl, sql: &str) -> Result<(), sqlx::Error> {
    use sqlx::{ConnectOptions, Connection, Executor};
    match url.sqlite_file() {
        Some(file) => {
            let mut conn =
                sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display())).await?;
            let done = conn.execute(sql).await.map(|_| ());
            conn.close().await?;
            done
        }
        None => {
            let mut conn = url.mysql_options().expect("mysql url").connect().await?;
            let done = conn.execute(sql).await.map(|_| ());
            conn.close().await?;
            done
        }
    }
}

/// Asserts a key's requests (each job's position in the key's acceptance order, and the status
/// answered, in arrival order) went one job at a time in order: positions never go back, a
/// job is asked again only until it succeeds, the next starts only after it did, none is
/// skipped, and all `expected` succeeded.
pub fn assert_one_at_a_time(key: &str, seen: &[(usize, u16)], expected: usize) {
    let mut done: Option<usize> = None;
    let mut at = 0;
    for &(i, status) in seen {
        assert!(
            i >= at,
            "key {key}: job {i} requested after job {at}: {seen:?}"
        );
        if i > at {
            assert_eq!(
                done,
                Some(at),
                "key {key}: job {i} started before job {at} ended"
            );
            assert_eq!(i, at + 1, "key {key}: job {i} went before job {}", at + 1);
            at = i;
        }
        if status == 200 {
            done = Some(i);
        }
    }
    assert_eq!(
        (done, at),
        (Some(expected - 1), expected - 1),
        "key {key}: every job delivered"
    );
}

/// A control database of this test alone (dropped with the value) and its subscription cache.
pub struct Control {
    _db: TestDb,
    pub subscriptions: std::sync::Arc<spindle::events::Subscriptions>,
}

impl Control {
    pub async fn start(engine: Engine) -> Control {
        let db = TestDb::on(engine, "ctl");
        let store = spindle::events::ControlDb::open(&db.url)
            .await
            .expect("control db");
        let subscriptions = spindle::events::Subscriptions::load(store, Default::default())
            .await
            .expect("subscriptions");
        Control {
            _db: db,
            subscriptions,
        }
    }

    /// Director settings that publish to these subscriptions.
    pub fn tweak(&self) -> impl FnOnce(&mut DirectorConfig) + use<> {
        publishing_to(self.subscriptions.clone())
    }

    /// Another process's cache of the same control database (its own pool, read whole now):
    /// as a second Director or a router holds it.
    pub async fn another_cache(&self) -> std::sync::Arc<spindle::events::Subscriptions> {
        let store = spindle::events::ControlDb::open(self.subscriptions.db().url())
            .await
            .expect("control db");
        spindle::events::Subscriptions::load(store, Default::default())
            .await
            .expect("subscriptions")
    }

    /// Where the control database is.
    pub fn url(&self) -> &JobDbUrl {
        self.subscriptions.db().url()
    }

    pub async fn stop(self) {
        self.subscriptions.db().close().await;
    }
}

/// Director settings that publish to `subscriptions`.
pub fn publishing_to(
    subscriptions: std::sync::Arc<spindle::events::Subscriptions>,
) -> impl FnOnce(&mut DirectorConfig) + use<> {
    move |c: &mut DirectorConfig| c.publish_to(subscriptions)
}

/// An event's job as a subscriber received it, its signature checked.
pub struct EventArrival {
    /// `spindle-event-id`.
    pub event_id: String,
    /// `spindle-subscription-id`.
    pub subscription: String,
    /// `spindle-event-type`.
    pub event_type: String,
    /// The envelope.
    pub body: serde_json::Value,
}

/// Reads an event's job from what the sink received, asserting it is signed (Standard
/// Webhooks) with its subscription's own secret among `secrets` (by subscription id).
pub fn event_arrival(
    r: &spindle::cli::sink::Received,
    secrets: &std::collections::HashMap<String, spindle::delivery::signing::SigningSecret>,
) -> EventArrival {
    let header = |name: &str| {
        r.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let subscription = header("spindle-subscription-id");
    let timestamp: i64 = header("webhook-timestamp").parse().expect("a timestamp");
    let expected = spindle::delivery::signing::sign(
        std::slice::from_ref(&secrets[&subscription]),
        &header("webhook-id"),
        timestamp,
        &r.body,
    );
    assert_eq!(
        header("webhook-signature"),
        expected,
        "signed with the secret of subscription {subscription}"
    );
    EventArrival {
        event_id: header("spindle-event-id"),
        event_type: header("spindle-event-type"),
        body: serde_json::from_slice(&r.body).expect("a JSON envelope"),
        subscription,
    }
}

/// When requests for `path` reached `sink`, after `since`, in order.
pub fn arrivals_at(
    sink: &spindle::cli::sink::Sink,
    path: &str,
    since: std::time::Instant,
) -> Vec<Duration> {
    let mut at: Vec<Duration> = sink
        .received()
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.at.duration_since(since))
        .collect();
    at.sort();
    at
}
