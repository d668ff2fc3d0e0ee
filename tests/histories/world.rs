//! The system under test, as processes of the `spindle` binary: a Director alone on a MySQL or
//! SQLite JobDB (controls read from the Consul double), or a cluster (the Consul double, three
//! Directors, two routers, one of them with its clock ahead, a manager that retires JobDBs
//! every few seconds, a drainer, moto as S3, the machine's Redis for dedup, and a private
//! `mariadbd` that holds some JobDBs so that an outage can lock it). Writes to a MySQL JobDB
//! of the Director alone, and to the cluster's private `mariadbd`, go through a proxy that an
//! operation arms to fail a COMMIT or lose its answer. And the readers: every job's histories
//! in every JobDB still there and in the archive.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use spindle::archive::{Archive, BatchKind};
use spindle::job::{Job, JobId, State, Transition};
use spindle::jobdb::{JobDb, JobDbUrl};
use spindle::registry::inventory::{Inventory, JobDbState};

use super::endpoint::Endpoint;
use crate::common::cluster::{
    dedup_args, delete_keys, director_args, drainer_args, manager_args, router_args, s3_args,
    Archiving, SHARED_REDIS,
};
use crate::common::mariadb::PrivateMariaDb;
use crate::common::procs::{free_port, skewed_clock, words, Proc};
use crate::common::s3::S3Server;
use crate::common::sql_proxy::SqlProxy;
use crate::common::{mysql_server, ConsulUnderTest, Engine, TestDb};

/// How far ahead the skewed router's clock runs (within the routers' `--dedup-max-skew-ms`).
pub const SKEW_MS: i64 = 1500;

/// A process the operations may kill and start again, on the same port with the same
/// arguments.
pub struct Slot {
    pub name: String,
    args: Vec<String>,
    /// Runs under `faketime` with this offset.
    skew: Option<String>,
    /// More environment variables (settings an older build, run through `SPINDLE_BIN`,
    /// ignores rather than refuses).
    env: Vec<(String, String)>,
    pub port: u16,
    proc: tokio::sync::Mutex<Option<Proc>>,
}

impl Slot {
    pub fn new(name: &str, args: Vec<String>, skew: Option<String>) -> Slot {
        let slot = Slot::idle(name, args, skew);
        *slot.proc.try_lock().unwrap() = Some(slot.spawn());
        slot
    }

    /// The same (idle) slot with more environment variables.
    pub fn with_env(mut self, env: &[(&str, &str)]) -> Slot {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self
    }

    /// A slot whose process is not started yet ([`Slot::start`] starts it).
    pub fn idle(name: &str, args: Vec<String>, skew: Option<String>) -> Slot {
        Slot {
            name: name.to_owned(),
            args,
            skew,
            env: Vec::new(),
            port: free_port(),
            proc: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether its process was started (and not killed since).
    pub async fn running(&self) -> bool {
        self.proc.lock().await.is_some()
    }

    fn spawn(&self) -> Proc {
        // libfaketime preloaded into the process itself: the wall clock runs ahead, the
        // monotonic clock (timers, timeouts) stays true. (Through the `faketime` wrapper a kill
        // reached the wrapper and left the process running.)
        let skew = self.skew.as_deref().map(skewed_clock).unwrap_or_default();
        let mut env: Vec<(&str, &str)> = skew.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        Proc::spawn_with_env(&self.args, self.port, &env)
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn kill9(&self) {
        if let Some(mut p) = self.proc.lock().await.take() {
            p.kill9().await;
        }
    }

    pub async fn start(&self) {
        let mut proc = self.proc.lock().await;
        if proc.is_none() {
            *proc = Some(self.spawn());
        }
    }

    pub async fn term(&self) {
        if let Some(mut p) = self.proc.lock().await.take() {
            p.term().await;
        }
    }

    /// Starts its process again if it exited on its own (no operation stopped it), as the
    /// deployment's supervisor does (`restart: unless-stopped`); returns how it had ended.
    pub async fn revive(&self) -> Option<std::process::ExitStatus> {
        let mut proc = self.proc.lock().await;
        let ended = proc.as_mut()?.exited()?;
        *proc = Some(self.spawn());
        Some(ended)
    }
}

/// What one place (a JobDB, or an archive object) holds of a job.
#[derive(Clone, Debug)]
pub struct Place {
    pub jobdb: String,
    pub history: Vec<Transition>,
    /// The `traceparent` this place's copy of the job keeps.
    pub traceparent: Option<String>,
    /// The payload this place's copy keeps.
    pub payload: bytes::Bytes,
}

/// A stored job: its row and its histories, one per JobDB it passed through.
#[derive(Clone, Debug)]
pub struct Stored {
    pub job: Job,
    pub places: Vec<Place>,
}

pub struct World {
    pub tag: String,
    pub consul: ConsulUnderTest,
    pub endpoint: Endpoint,
    pub client: reqwest::Client,
    pub directors: Vec<Slot>,
    pub routers: Vec<Slot>,
    pub manager: Option<Slot>,
    pub drainer: Option<Slot>,
    /// The Director's JobDB when it runs alone.
    pub alone: Option<TestDb>,
    /// The control database of the subscriptions, and (once made) the two subscriptions
    /// events are published to.
    pub control: Option<TestDb>,
    pub subscriptions: std::sync::OnceLock<Subscribed>,
    /// Kept for its lifetime: moto stops when it is dropped.
    #[allow(dead_code)]
    pub s3: Option<S3Server>,
    pub archive: Option<Archive>,
    /// The `--s3-*` options of the archive's processes (a cluster).
    pub archive_args: Vec<String>,
    pub inventory: Option<Inventory>,
    pub mariadb: Option<std::sync::Mutex<PrivateMariaDb>>,
    /// In front of the Director's MySQL JobDB (alone), or of the private `mariadbd` (cluster):
    /// what the commit faults arm.
    pub proxy: Option<SqlProxy>,
    /// Alone: the Director's `spindle_ordered_released_total`,
    /// `spindle_ordered_heads_misremembered_total`, `spindle_ordered_kept_total` and
    /// `spindle_ordered_spilled_total`, summed over its lives (read before each kill -9 and at
    /// the end).
    pub remembered: std::sync::Mutex<Remembered>,
}

/// The subscriptions of bucket [`crate::histories::events::EVENT_BUCKET`]: `all` takes
/// every event type (lane a), `created` only `hist.created` (lane b) and is the one an
/// operation disables for a while.
pub struct Subscribed {
    pub all: String,
    pub created: String,
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

impl World {
    /// A Director alone on a JobDB of `engine`, reading controls from the Consul double.
    pub async fn alone(engine: Engine) -> World {
        let consul = ConsulUnderTest::start().await;
        let tag = format!("hs{}", &ulid::Ulid::new().to_string().to_lowercase()[18..]);
        let db = TestDb::on(engine, &tag);
        let control = TestDb::on(engine, &format!("{tag}c"));
        let consul_url = consul.double.as_ref().unwrap().url();
        // The Director writes a MySQL JobDB through the proxy; the checker reads it directly.
        let proxy = match engine {
            Engine::MySql => Some(SqlProxy::start(3306).await),
            Engine::Sqlite => None,
        };
        let jobdb = match &proxy {
            Some(proxy) => {
                spindle::jobdb::JobDb::open(&db.url, true, 1)
                    .await
                    .unwrap()
                    .close()
                    .await;
                proxy.url(&db.url.database)
            }
            None => db.url_string(),
        };
        let mut args = strings(&[
            "director",
            "--listen",
            "127.0.0.1:{port}",
            "--read-controls",
            "--consul-addr",
            &consul_url,
            "--allow-subnet",
            "127.0.0.0/8",
        ]);
        args.extend(["--jobdb".into(), jobdb]);
        args.extend(["--control-db".into(), control.url_string()]);
        args.extend(director_flags());
        // A small book: sequences spill to the store (the sequencer's path) when keys back up.
        let director =
            Slot::idle("director0", args, None).with_env(&[("SPINDLE_ORDERED_BOOK_JOBS", "40")]);
        director.start().await;
        World {
            tag,
            consul,
            endpoint: Endpoint::start().await,
            client: client(),
            directors: vec![director],
            routers: vec![],
            manager: None,
            drainer: None,
            alone: Some(db),
            control: Some(control),
            subscriptions: Default::default(),
            remembered: Default::default(),
            s3: None,
            archive: None,
            archive_args: Vec::new(),
            inventory: None,
            mariadb: None,
            proxy,
        }
    }

    /// The cluster: see the module's comment.
    pub async fn cluster() -> World {
        let consul = ConsulUnderTest::start().await;
        let consul_url = consul.double.as_ref().unwrap().url();
        let tag = format!("hc{}", &ulid::Ulid::new().to_string().to_lowercase()[18..]);
        let Archiving {
            server: s3,
            bucket,
            archive,
        } = Archiving::start("hist").await;
        let mariadb = tokio::task::block_in_place(PrivateMariaDb::start);
        let s3_args = s3_args(&s3, &bucket);
        // The JobDBs the manager makes on the private server are reached through the proxy.
        let proxy = SqlProxy::start(mariadb.port).await;
        let servers = [
            mysql_server(),
            format!("mysql://root@127.0.0.1:{}", proxy.port),
        ];
        let manager = manager_args(&consul_url, &servers, &tag, "m0", 2, max_age_s());
        let mut drainer = drainer_args(&consul_url, "dr0");
        drainer.extend(s3_args.clone());
        let control = TestDb::on(Engine::MySql, &format!("{tag}c"));
        let control_db = ["--control-db".to_owned(), control.url_string()];
        let directors = (0..3)
            .map(|i| {
                let mut args = director_args(&consul_url, &format!("{tag}-d{i}"), 3000);
                args.extend(s3_args.clone());
                args.extend(control_db.iter().cloned());
                args.extend(director_flags());
                // Directors 1 and 2 join after the first seconds: until then one JobDB is
                // live and director 0's commits release ordered jobs in themselves.
                match i {
                    0 => Slot::new(&format!("director{i}"), args, None),
                    _ => Slot::idle(&format!("director{i}"), args, None),
                }
            })
            .collect();
        let placements = format!("spindle-test/{tag}/placements");
        let redis = format!("a={SHARED_REDIS}/0");
        let routers = (0..2)
            .map(|i| {
                let mut args = router_args(&consul_url, &redis, 2, &placements);
                args.extend(dedup_args(&format!("{tag}:"), 120));
                args.extend(words("--forward-timeout-ms 4000 --resolve-ms 15000"));
                args.extend(words("--allow-subnet 127.0.0.0/8"));
                args.extend(control_db.iter().cloned());
                // Drained JobDBs' id indexes settle lapsed claims.
                args.extend(s3_args.clone());
                let skew = (i == 1).then(|| format!("+{:.1}s", SKEW_MS as f64 / 1000.0));
                Slot::new(&format!("router{i}"), args, skew)
            })
            .collect();
        World {
            tag,
            inventory: Some(Inventory::new(consul.client.clone())),
            consul,
            endpoint: Endpoint::start().await,
            client: client(),
            directors,
            routers,
            manager: Some(Slot::new("manager", manager, None)),
            drainer: Some(Slot::new("drainer", drainer, None)),
            alone: None,
            control: Some(control),
            subscriptions: Default::default(),
            remembered: Default::default(),
            s3: Some(s3),
            archive: Some(archive),
            archive_args: s3_args,
            mariadb: Some(std::sync::Mutex::new(mariadb)),
            proxy: Some(proxy),
        }
    }

    /// Waits until every Director answers `/readyz` 200 (and in a cluster, the routers too).
    pub async fn wait_ready(&self) {
        let mut bases = Vec::new();
        for slot in self.directors.iter().chain(&self.routers) {
            if slot.running().await {
                bases.push(slot.base());
            }
        }
        for base in bases {
            crate::common::wait_for(
                Duration::from_secs(60),
                &format!("{base} ready"),
                || async {
                    matches!(self.client.get(format!("{base}/readyz")).send().await,
                         Ok(r) if r.status().is_success())
                },
            )
            .await;
        }
    }

    /// The fronts producers submit to: (name, base URL).
    pub fn fronts(&self) -> Vec<(String, String)> {
        self.routers
            .iter()
            .chain(&self.directors)
            .map(|s| (s.name.clone(), s.base()))
            .collect()
    }

    /// Where events are published and back-filled: the routers (name, base URL), or the
    /// Director alone.
    pub fn event_fronts(&self) -> Vec<(String, String)> {
        match self.routers.is_empty() {
            true => vec![("director0".to_owned(), self.api_base())],
            false => self
                .routers
                .iter()
                .map(|r| (r.name.clone(), r.base()))
                .collect(),
        }
    }

    /// Where `GET /v1/jobs/{id}` is asked: a router, or the Director alone.
    pub fn api_base(&self) -> String {
        self.routers.first().unwrap_or(&self.directors[0]).base()
    }

    /// The dedup store's keys of this world that would never expire (none alone: no router).
    pub async fn dedup_keys_without_expiry(&self) -> Result<Vec<String>, String> {
        if self.inventory.is_none() {
            return Ok(Vec::new());
        }
        let keys = crate::common::cluster::keys_with_ttl(
            &format!("{SHARED_REDIS}/0"),
            &format!("{}:", self.tag),
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok(keys
            .into_iter()
            .filter(|(_, ttl)| *ttl == -1)
            .map(|(key, _)| key)
            .collect())
    }

    /// Of `ids` (events kept without a job), those some JobDB or the archive holds now.
    pub async fn kept_events(&self, ids: &[String]) -> HashSet<String> {
        let mut found = HashSet::new();
        if let Some(archive) = &self.archive {
            for key in archive.event_objects(None).await.unwrap_or_default() {
                for e in archive.read_events(&key).await.unwrap_or_default() {
                    found.insert(e.event_id);
                }
            }
        }
        for (_, url, _) in self.live_jobdbs().await {
            let Ok(db) = JobDb::open_reader(&url, 2).await else {
                continue;
            };
            for id in ids {
                let Ok(ulid) = id.parse() else { continue };
                if let Ok(Some(_)) = db.event(ulid).await {
                    found.insert(id.clone());
                }
            }
            db.close().await;
        }
        found
    }

    /// Every JobDB that may hold jobs now (name, URL, whether a Director serves it).
    pub async fn live_jobdbs(&self) -> Vec<(String, JobDbUrl, JobDbState)> {
        match (&self.alone, &self.inventory) {
            (Some(db), _) => vec![(db.url.database.clone(), db.url.clone(), JobDbState::Active)],
            (None, Some(inventory)) => inventory
                .list()
                .await
                .unwrap_or_default()
                .into_iter()
                .filter(|l| !matches!(l.record.state, JobDbState::Dropped | JobDbState::Spare))
                .filter_map(|l| Some((l.record.name, l.record.url.parse().ok()?, l.record.state)))
                .collect(),
            _ => vec![],
        }
    }

    /// The JobDB director `i` serves: alone, its one JobDB; in a cluster, the active one whose
    /// lock its id was last written in. With its inventory entry, in a cluster.
    pub async fn jobdb_of(
        &self,
        i: usize,
    ) -> Option<(JobDbUrl, Option<spindle::registry::inventory::Listed>)> {
        if let Some(db) = &self.alone {
            return Some((db.url.clone(), None));
        }
        let id = format!("{}-d{i}", self.tag);
        let listed = self.inventory.as_ref()?.list().await.ok()?;
        let mine = listed.into_iter().find(|l| {
            l.record.state == JobDbState::Active && l.holder_id.as_deref() == Some(&id)
        })?;
        Some((mine.record.url.parse().ok()?, Some(mine)))
    }

    /// Runs `sql` on every live JobDB (an operator's statement); JobDBs that fail are skipped.
    pub async fn on_every_jobdb(&self, sql: &str) -> usize {
        let mut done = 0;
        for (_, url, _) in self.live_jobdbs().await {
            if operator_sql(&url, sql).await.is_ok() {
                done += 1;
            }
        }
        done
    }

    /// Every stored job with its histories: each live JobDB, then the archive (expired
    /// batches, and the histories of drained JobDBs).
    pub async fn collect(&self) -> HashMap<JobId, Stored> {
        let mut out: HashMap<JobId, Stored> = HashMap::new();
        for (name, url, _) in self.live_jobdbs().await {
            let Ok(db) = JobDb::open_reader(&url, 2).await else {
                continue;
            };
            let Ok(rows) = db.all_transitions().await else {
                db.close().await;
                continue;
            };
            let mut by_job: HashMap<JobId, Vec<Transition>> = HashMap::new();
            for (_, t) in rows {
                by_job.entry(t.job_id).or_default().push(t);
            }
            let ids: Vec<JobId> = by_job.keys().copied().collect();
            let mut jobs = Vec::new();
            for chunk in ids.chunks(500) {
                jobs.extend(db.get_jobs(chunk).await.unwrap_or_default());
            }
            db.close().await;
            for job in jobs {
                let history = by_job.remove(&job.id).unwrap_or_default();
                add_place(&mut out, job, &name, history);
            }
        }
        if let Some(archive) = &self.archive {
            for m in archive.manifests(None).await.unwrap_or_default() {
                for archived in archive.read_batch(&m.object_key).await.unwrap_or_default() {
                    let (Ok(job), Ok(rows)) = (archived.to_job(), archived.to_transitions()) else {
                        continue;
                    };
                    let mut history: Vec<Transition> = rows.into_iter().map(|(_, t)| t).collect();
                    // An expired batch holds the job up to `archiving`; `archived` follows
                    // its confirmation, in a JobDB that may be gone.
                    if m.kind == BatchKind::Expired
                        && history.last().is_some_and(|t| t.state == State::Archiving)
                    {
                        let last = history.last().unwrap().clone();
                        history.push(Transition {
                            state: State::Archived,
                            error_type: None,
                            ..last
                        });
                    }
                    add_place(&mut out, job, &m.jobdb, history);
                }
            }
        }
        out
    }

    pub async fn stop(self) {
        for slot in self
            .routers
            .iter()
            .chain(&self.directors)
            .chain(&self.manager)
            .chain(&self.drainer)
        {
            slot.term().await;
        }
        if self.inventory.is_some() {
            let server: JobDbUrl = format!("{}/any", mysql_server()).parse().unwrap();
            let names =
                spindle::jobdb::databases_like(&server.server, &format!("{}\\_%", self.tag))
                    .await
                    .unwrap_or_default();
            for name in names {
                let url: JobDbUrl = format!("{}/{name}", mysql_server()).parse().unwrap();
                let _ = spindle::jobdb::drop_database(&url).await;
            }
            let prefix = format!("{}:", self.tag);
            let _ = delete_keys(&format!("{SHARED_REDIS}/0"), &prefix).await;
        }
        self.endpoint.stop();
        self.consul.stop().await;
        drop(self.alone);
        drop(self.control);
    }
}

/// What the Director alone's ordering did (see [`World::remembered`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Remembered {
    /// Ordered jobs it released.
    pub released: u64,
    /// Heads its book held waiting that the JobDB did not.
    pub wrong: u64,
    /// Ordered jobs it kept in its book (no entry) until their turn.
    pub kept: u64,
    /// Sequences it spilled to the store.
    pub spilled: u64,
}

impl World {
    /// Alone: adds the Director's counts of what its ordering did (see
    /// [`World::remembered`]), read from its `/metrics` now. A count bumped between this read
    /// and a kill -9 is lost: the tally is a floor.
    pub async fn tally_remembered(&self) {
        if self.alone.is_none() {
            return;
        }
        let Some(director) = self.directors.first() else {
            return;
        };
        let Ok(answer) = self
            .client
            .get(format!("{}/metrics", director.base()))
            .send()
            .await
        else {
            return;
        };
        let text = answer.text().await.unwrap_or_default();
        let count = |name: &str| crate::common::metric_value(&text, name) as u64;
        let mut tally = self.remembered.lock().unwrap();
        tally.released += count("spindle_ordered_released_total");
        tally.wrong += count("spindle_ordered_heads_misremembered_total");
        tally.kept += count("spindle_ordered_kept_total");
        tally.spilled += count("spindle_ordered_spilled_total");
    }

    /// Alone: every attempt the JobDB's commits list as begun (`commit_log.started`), as
    /// (job, attempt number); `None` in a cluster (JobDBs retire and are dropped) or when the
    /// JobDB cannot be read.
    pub async fn listed_attempts(&self) -> Option<HashSet<(JobId, u16)>> {
        use sqlx::{ConnectOptions, Connection};
        let url = &self.alone.as_ref()?.url;
        let sql = "SELECT started FROM commit_log WHERE started IS NOT NULL";
        let lists: Vec<String> = match url.sqlite_file() {
            Some(file) => {
                let mut conn =
                    sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
                        .await
                        .ok()?;
                let lists = sqlx::query_scalar(sql).fetch_all(&mut conn).await.ok()?;
                let _ = conn.close().await;
                lists
            }
            None => {
                let mut conn = url.mysql_options().ok()?.connect().await.ok()?;
                let lists = sqlx::query_scalar(sql).fetch_all(&mut conn).await.ok()?;
                let _ = conn.close().await;
                lists
            }
        };
        let mut out = HashSet::new();
        for list in lists {
            let Ok(serde_json::Value::Array(items)) = serde_json::from_str(&list) else {
                continue;
            };
            for item in items {
                let (Some(hex), Some(attempt)) = (item[0].as_str(), item[1].as_u64()) else {
                    continue;
                };
                let (Ok(id), Ok(attempt)) = (u128::from_str_radix(hex, 16), u16::try_from(attempt))
                else {
                    continue;
                };
                out.insert((JobId::from_bytes(id.to_be_bytes()), attempt));
            }
        }
        Some(out)
    }
}

/// Adds what one place holds of a job; the same JobDB read twice (live, then its history
/// batch) keeps the longer history.
fn add_place(out: &mut HashMap<JobId, Stored>, job: Job, jobdb: &str, history: Vec<Transition>) {
    let traceparent = job.trace.as_ref().map(|t| t.traceparent.to_string());
    let payload = job.payload.clone();
    let stored = out.entry(job.id).or_insert_with(|| Stored {
        job,
        places: vec![],
    });
    match stored.places.iter_mut().find(|p| p.jobdb == jobdb) {
        Some(place) if place.history.len() >= history.len() => {}
        Some(place) => place.history = history,
        None => stored.places.push(Place {
            jobdb: jobdb.to_owned(),
            history,
            traceparent,
            payload,
        }),
    }
}

/// The retirement age of the cluster's manager: JobDBs cycle several times in a short run.
pub fn max_age_s() -> u64 {
    12
}

/// Flags every Director of the checker runs with: quick retries and breaker probes, a short
/// shutdown.
fn director_flags() -> Vec<String> {
    let mut flags = strings(&super::parks::DIRECTOR_FLAGS);
    flags.extend(strings(&[
        "--shutdown-grace-ms",
        "3000",
        "--min-retry-delay-ms",
        "50",
        "--breaker-probe-ms",
        "300",
        "--breaker-probe-max-ms",
        "2000",
        "--max-payload-bytes",
        &super::events::DIRECTOR_MAX_PAYLOAD.to_string(),
        // A commit held back by the proxy fails within 2 s: the commit faults hold longer.
        "--write-timeout-ms",
        "2000",
    ]));
    flags
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// An operator's statement on its own connection, as `mysql` or `sqlite3` would run it.
pub async fn operator_sql(url: &JobDbUrl, sql: &str) -> Result<(), String> {
    use sqlx::{ConnectOptions, Connection, Executor};
    let run = async {
        match url.sqlite_file() {
            Some(file) => {
                let mut conn =
                    sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
                        .await
                        .map_err(|e| e.to_string())?;
                conn.execute(sql).await.map_err(|e| e.to_string())?;
                conn.close().await.map_err(|e| e.to_string())
            }
            None => {
                let mut conn = url
                    .mysql_options()
                    .map_err(|e| e.to_string())?
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                conn.execute(sql).await.map_err(|e| e.to_string())?;
                conn.close().await.map_err(|e| e.to_string())
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .map_err(|_| "timed out".to_owned())?
}
