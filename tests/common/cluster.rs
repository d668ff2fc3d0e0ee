//! A cluster of `spindle` processes, the one harness of the tests that run them
//! (tests/cluster.rs, tests/router.rs, tests/lifecycle.rs): the in-repo Consul double and its
//! inventory, JobDBs registered spare (on the shared MariaDB or a private one), Directors with
//! short lock and session TTLs, optionally a router over Redis or in-memory stores, S3 (moto)
//! to archive to, a manager and drainers, a sink, and the waits and reads those tests share.
//!
//! Everything of the cluster is named after its tag: its databases (`{tag}_…`, the manager's
//! too), its Redis keys (`{tag}:…`), its placements. When it stops, or is dropped by a failing
//! test, its processes end and its databases and Redis keys go.
//!
//! The argument lists ([`director_args`], [`router_args`], ...) are shared with the history
//! checker's world (tests/histories/world.rs), which runs the same processes its own way.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use spindle::archive::{Archive, BatchKind};
use spindle::cli::sink::Sink;
use spindle::job::{JobId, State, Transition};
use spindle::jobdb::{JobDb, JobDbUrl};
use spindle::registry::catalog;
use spindle::registry::inventory::{Inventory, JobDbRecord, JobDbState};
use spindle::router::placement::{PlacementManager, PlacementSettings};

use super::mariadb::PrivateMariaDb;
use super::procs::{words, Proc};
use super::redis_server::PrivateRedis;
use super::s3::S3Server;
use super::{assert_legal, histories, mysql_server, wait_all_final, wait_for, ConsulUnderTest};

/// The Consul lock TTL of every Director, manager and drainer of a cluster.
pub const LOCK_TTL: Duration = Duration::from_secs(1);
/// The Consul lock-delay of every Director, manager and drainer of a cluster.
pub const LOCK_DELAY: Duration = Duration::from_millis(500);
/// The machine's Redis (a router's dedup stores are its databases 0 and 1).
pub const SHARED_REDIS: &str = "redis://127.0.0.1:6379";

/// [`LOCK_TTL`] and [`LOCK_DELAY`] as flags.
fn lock() -> String {
    let (ttl, delay) = (LOCK_TTL.as_millis(), LOCK_DELAY.as_millis());
    format!("--lock-ttl-ms {ttl} --lock-delay-ms {delay}")
}

/// A Director on Consul with the cluster's lock TTLs, a session (service) TTL, quick campaigns,
/// loopback endpoints allowed.
pub fn director_args(consul: &str, id: &str, service_ttl_ms: u64) -> Vec<String> {
    words(&format!(
        "director --registry consul --consul-addr {consul} --listen 127.0.0.1:{{port}} {lock} \
         --service-ttl-ms {service_ttl_ms} --campaign-retry-ms 200 --director-id {id} \
         --allow-subnet 127.0.0.0/8",
        lock = lock()
    ))
}

/// A router over the Directors of `consul`'s catalog, quick to see them come and go.
pub fn router_args(consul: &str, stores: &str, shard_size: usize, placements: &str) -> Vec<String> {
    words(&format!(
        "router --consul-addr {consul} --listen 127.0.0.1:{{port}} --redis {stores} \
         --shard-size {shard_size} --catalog-ms 200 --suspect-ms 1000 \
         --placement-prefix {placements}"
    ))
}

/// A router's dedup settings: keys under `key_prefix`, a window of `window_s`, 12 slots,
/// short pending claims.
pub fn dedup_args(key_prefix: &str, window_s: u64) -> Vec<String> {
    words(&format!(
        "--dedup-key-prefix {key_prefix} --dedup-window-s {window_s} --dedup-slots 12 \
         --dedup-pending-ttl-ms 3000 --dedup-max-skew-ms 2000 --pending-wait-ms 1000"
    ))
}

/// A manager creating and retiring JobDBs named `{prefix}_…` on the `mysql` servers.
pub fn manager_args(
    consul: &str,
    mysql: &[String],
    prefix: &str,
    id: &str,
    spares: usize,
    max_age_s: u64,
) -> Vec<String> {
    let mysql: Vec<String> = mysql.iter().map(|m| format!("--mysql {m}")).collect();
    words(&format!(
        "manager --consul-addr {consul} {} --prefix {prefix} --spares {spares} {lock} \
         --max-age-s {max_age_s} --interval-ms 300 --manager-id {id} \
         --metrics-listen 127.0.0.1:{{port}}",
        mysql.join(" "),
        lock = lock()
    ))
}

/// A drainer polling every 200 ms (it needs [`s3_args`] too).
pub fn drainer_args(consul: &str, id: &str) -> Vec<String> {
    words(&format!(
        "drainer --consul-addr {consul} {lock} --poll-ms 200 --drainer-id {id} \
         --metrics-listen 127.0.0.1:{{port}}",
        lock = lock()
    ))
}

/// The archive of a process: `bucket` through the S3 server's fault proxy.
pub fn s3_args(s3: &S3Server, bucket: &str) -> Vec<String> {
    words(&format!(
        "--s3-bucket {bucket} --s3-endpoint {} --s3-path-style --s3-access-key-id test \
         --s3-secret-access-key test --s3-timeout-ms 3000",
        s3.endpoint()
    ))
}

/// The keys under `prefix` in the Redis at `url`.
async fn redis_keys(url: &str, prefix: &str) -> redis::RedisResult<Vec<Vec<u8>>> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
}

/// Deletes the keys under `prefix` in the Redis at `url`.
pub async fn delete_keys(url: &str, prefix: &str) -> redis::RedisResult<()> {
    let keys = redis_keys(url, prefix).await?;
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    for chunk in keys.chunks(500) {
        let _: () = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
    }
    Ok(())
}

/// The keys under `prefix` in the Redis at `url`, each with its `PTTL` (ms; -1 if it has no
/// expiry).
pub async fn keys_with_ttl(url: &str, prefix: &str) -> redis::RedisResult<Vec<(String, i64)>> {
    let keys = redis_keys(url, prefix).await?;
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await?;
        out.push((String::from_utf8_lossy(&key).into_owned(), ttl));
    }
    Ok(out)
}

/// What [`Cluster::start`] builds.
pub struct Builder {
    prefix: String,
    jobdbs: usize,
    directors: usize,
    service_ttl_ms: u64,
    director_args: Vec<String>,
    mariadb: Option<PrivateMariaDb>,
    redis: Option<Option<PrivateRedis>>,
    router: Option<usize>,
    s3: bool,
    control: bool,
}

impl Builder {
    /// `n` JobDBs (`{tag}_0`, ...), registered spare.
    pub fn jobdbs(mut self, n: usize) -> Self {
        self.jobdbs = n;
        self
    }

    /// `n` Directors (`d0`, ...), in [`Cluster::directors`].
    pub fn directors(mut self, n: usize) -> Self {
        self.directors = n;
        self
    }

    /// The Directors' `--service-ttl-ms` (3000 unless set).
    pub fn service_ttl_ms(mut self, ms: u64) -> Self {
        self.service_ttl_ms = ms;
        self
    }

    /// More flags for every Director, as one line.
    pub fn director_args(mut self, line: &str) -> Self {
        self.director_args = words(line);
        self
    }

    /// The JobDBs (and the manager's) on `mariadb` instead of the shared server.
    pub fn mariadb(mut self, mariadb: Option<PrivateMariaDb>) -> Self {
        self.mariadb = mariadb;
        self
    }

    /// Routers deduplicate in Redis (with the dedup settings of [`dedup_args`], a 60 s window,
    /// and a first placement layout of store `a` alone, changing 4 s after a proposal): `a` and
    /// `b` are databases 0 and 1 of the machine's Redis, or `a` is `private`. Without this, in
    /// memory.
    pub fn redis(mut self, private: Option<PrivateRedis>) -> Self {
        self.redis = Some(private);
        self
    }

    /// A router with this shard size, in [`Cluster::router`], started once every Director
    /// is and waited for until it sees them all.
    pub fn router(mut self, shard_size: usize) -> Self {
        self.router = Some(shard_size);
        self
    }

    /// An S3 server and a bucket the Directors and drainers archive to.
    pub fn s3(mut self) -> Self {
        self.s3 = true;
        self
    }

    /// A control database (`{tag}_control`) the Directors and routers share: events and
    /// subscriptions on.
    pub fn control(mut self) -> Self {
        self.control = true;
        self
    }

    pub async fn start(self) -> Cluster {
        let consul = ConsulUnderTest::start().await;
        assert!(
            consul.double.is_some(),
            "the cluster tests use the in-repo Consul double (fault hooks, 1 s TTLs)"
        );
        let tag = format!(
            "{}{}",
            self.prefix,
            &ulid::Ulid::new().to_string().to_lowercase()[16..]
        );
        let s3 = match self.s3 {
            true => Some(Archiving::start(&self.prefix).await),
            false => None,
        };
        let dedup = self.redis.is_some();
        let redis = self.redis.flatten();
        let stores = match (dedup, &redis) {
            (false, _) => "a=memory:".to_owned(),
            (true, None) => format!("a={SHARED_REDIS}/0,b={SHARED_REDIS}/1"),
            (true, Some(redis)) => format!("a={}", redis.url()),
        };
        let mysql = self
            .mariadb
            .as_ref()
            .map_or_else(mysql_server, |m| m.server());
        let control = self
            .control
            .then(|| words(&format!("--control-db {mysql}/{tag}_control")));
        let mut cluster = Cluster {
            inventory: Inventory::new(consul.client.clone()),
            sink: Sink::start("127.0.0.1:0".parse().unwrap()).await.unwrap(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            directors: Vec::new(),
            router: None,
            jobdbs: Vec::new(),
            leftovers: Leftovers {
                server: self.mariadb.is_none().then(|| mysql.clone()),
                tag: tag.clone(),
                redis: dedup && redis.is_none(),
                done: false,
            },
            tag,
            consul,
            mysql,
            service_ttl_ms: self.service_ttl_ms,
            control,
            director_args: self.director_args,
            stores,
            dedup,
            shard_size: self.router.unwrap_or(1),
            s3,
            redis,
            mariadb: self.mariadb,
        };
        for i in 0..self.jobdbs {
            let jobdb = cluster.add_jobdb(&i.to_string(), JobDbState::Spare).await;
            cluster.jobdbs.push(jobdb);
        }
        if dedup {
            let settings = PlacementSettings {
                prefix: cluster.placement_prefix(),
                period: Duration::from_secs(2),
                lead: Duration::from_secs(4),
                ..PlacementSettings::default()
            };
            let placements = PlacementManager::consul(cluster.consul.client.clone(), settings);
            placements.bootstrap(vec!["a".into()], 1024).await.unwrap();
        }
        for i in 0..self.directors {
            let director = cluster.director(&format!("d{i}"));
            cluster.directors.push(director);
        }
        if let Some(shard_size) = self.router {
            cluster.router = Some(cluster.spawn_router(shard_size, &[]));
            cluster.wait_router_ready(self.directors).await;
        }
        cluster
    }
}

/// An S3 server, a bucket of its own (named after `tag`), and a reader of the archive the
/// processes write there.
pub struct Archiving {
    pub server: S3Server,
    pub bucket: String,
    pub archive: Archive,
}

impl Archiving {
    pub async fn start(tag: &str) -> Archiving {
        let server = S3Server::start().await;
        let bucket = super::s3::unique_bucket(tag);
        let mut config = server.config(&bucket);
        // What the processes use (`--s3-prefix` default).
        config.prefix = "spindle/".into();
        let archive = Archive::connect(&config).await.expect("archive");
        Archiving {
            server,
            bucket,
            archive,
        }
    }
}

/// What a cluster leaves behind unless it is removed: the databases named after its tag on the
/// shared server (a private server goes with its data), and its keys in the shared Redis.
struct Leftovers {
    server: Option<String>,
    tag: String,
    redis: bool,
    done: bool,
}

impl Leftovers {
    async fn remove(&mut self) {
        if let Some(server) = &self.server {
            let url: JobDbUrl = format!("{server}/any").parse().unwrap();
            let pattern = format!("{}\\_%", self.tag);
            let names = spindle::jobdb::databases_like(&url.server, &pattern)
                .await
                .unwrap_or_default();
            for name in names {
                let url: JobDbUrl = format!("{server}/{name}").parse().unwrap();
                let _ = spindle::jobdb::drop_database(&url).await;
            }
        }
        if self.redis {
            for db in ["0", "1"] {
                let _ =
                    delete_keys(&format!("{SHARED_REDIS}/{db}"), &format!("{}:", self.tag)).await;
            }
        }
        self.done = true;
    }
}

impl Drop for Leftovers {
    /// A failing test's cluster: its processes were killed as it was dropped (they come first
    /// in [`Cluster`]); remove the rest from a runtime of its own.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut leftovers = Leftovers {
            server: self.server.take(),
            tag: self.tag.clone(),
            redis: self.redis,
            done: true,
        };
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(leftovers.remove())
        })
        .join();
    }
}

/// The Consul double, the inventory, JobDBs, Directors, optionally a router and S3, a sink.
/// Fields drop in order: processes first, then what they used.
pub struct Cluster {
    /// The Directors the builder started (tests may start more of their own).
    pub directors: Vec<Proc>,
    /// The router the builder started.
    pub router: Option<Proc>,
    /// The JobDBs the builder made: (name, a reader).
    pub jobdbs: Vec<(String, JobDb)>,
    leftovers: Leftovers,
    /// Names everything of this cluster: databases, Redis keys, placements.
    pub tag: String,
    pub consul: ConsulUnderTest,
    pub inventory: Inventory,
    pub sink: Sink,
    /// An HTTP client (30 s timeout).
    pub client: reqwest::Client,
    /// The MySQL server of the JobDBs (no database).
    pub mysql: String,
    service_ttl_ms: u64,
    /// `--control-db` of every Director and router, when the cluster has one.
    control: Option<Vec<String>>,
    director_args: Vec<String>,
    /// The routers' `--redis`, and whether they deduplicate there (not in memory).
    stores: String,
    dedup: bool,
    shard_size: usize,
    s3: Option<Archiving>,
    /// The private Redis the router deduplicates in, when it has one.
    pub redis: Option<PrivateRedis>,
    /// The private MariaDB of the JobDBs, when they are on one.
    pub mariadb: Option<PrivateMariaDb>,
}

impl Cluster {
    /// A cluster whose tag starts with `prefix`: Consul and a sink, the rest as the builder's
    /// options say.
    pub fn builder(prefix: &str) -> Builder {
        Builder {
            prefix: prefix.to_owned(),
            jobdbs: 0,
            directors: 0,
            service_ttl_ms: 3000,
            director_args: Vec::new(),
            mariadb: None,
            redis: None,
            router: None,
            s3: false,
            control: false,
        }
    }

    pub fn consul_url(&self) -> String {
        self.double().url()
    }

    /// The Consul double, for its fault hooks.
    pub fn double(&self) -> &consul_double::ConsulDouble {
        self.consul.double.as_ref().unwrap()
    }

    /// Where the routers' placements live in Consul.
    pub fn placement_prefix(&self) -> String {
        format!("spindle-test/{}/placements", self.tag)
    }

    fn s3_args(&self) -> Vec<String> {
        self.s3
            .as_ref()
            .map(|s3| s3_args(&s3.server, &s3.bucket))
            .unwrap_or_default()
    }

    /// The S3 server (a cluster built with `s3()`).
    pub fn s3(&self) -> &S3Server {
        &self.s3.as_ref().expect("a cluster with s3").server
    }

    pub fn bucket(&self) -> &str {
        &self.s3.as_ref().expect("a cluster with s3").bucket
    }

    pub fn archive(&self) -> &Archive {
        &self.s3.as_ref().expect("a cluster with s3").archive
    }

    /// Starts a Director `id` on a free port, the test's to keep.
    pub fn director(&self, id: &str) -> Proc {
        self.director_with(id, &[])
    }

    /// [`Cluster::director`] with more flags.
    pub fn director_with(&self, id: &str, extra: &[&str]) -> Proc {
        let mut args = director_args(&self.consul_url(), id, self.service_ttl_ms);
        args.extend(self.director_args.iter().cloned());
        args.extend(self.control.iter().flatten().cloned());
        args.extend(self.s3_args());
        args.extend(extra.iter().map(|a| a.to_string()));
        Proc::spawn(&args, 0)
    }

    fn router_command(&self, shard_size: usize, extra: &[&str]) -> Vec<String> {
        let consul = self.consul_url();
        let mut args = router_args(&consul, &self.stores, shard_size, &self.placement_prefix());
        args.extend(words("--forward-timeout-ms 5000 --resolve-ms 20000"));
        args.extend(self.s3_args());
        if let Some(control) = &self.control {
            args.extend(control.iter().cloned());
            args.extend(words("--allow-subnet 127.0.0.0/8"));
        }
        if self.dedup {
            args.extend(dedup_args(&format!("{}:", self.tag), 60));
            args.extend(words("--placement-period-s 2 --placement-lead-ms 4000"));
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    /// Starts a router with this shard size (and environment variables) on a free port, the
    /// test's to keep.
    pub fn spawn_router(&self, shard_size: usize, env: &[(&str, &str)]) -> Proc {
        Proc::spawn_with_env(&self.router_command(shard_size, &[]), 0, env)
    }

    /// Stops the builder's router (SIGTERM) and starts it again on its port with more flags.
    pub async fn restart_router(&mut self, extra: &[&str]) {
        let router = self.router.as_mut().expect("a router");
        router.term().await;
        let port = router.port;
        let args = self.router_command(self.shard_size, extra);
        self.router = Some(Proc::spawn(&args, port));
    }

    /// The builder's router.
    pub fn router_base(&self) -> String {
        self.router.as_ref().expect("a router").base()
    }

    /// Starts a manager keeping `spares` spare JobDBs and retiring them at `max_age_s`.
    pub fn manager(&self, id: &str, max_age_s: u64, spares: usize) -> Proc {
        let args = manager_args(
            &self.consul_url(),
            std::slice::from_ref(&self.mysql),
            &self.tag,
            id,
            spares,
            max_age_s,
        );
        Proc::spawn(&args, 0)
    }

    pub fn drainer(&self, id: &str) -> Proc {
        let mut args = drainer_args(&self.consul_url(), id);
        args.extend(self.s3_args());
        Proc::spawn(&args, 0)
    }

    /// Creates JobDB `{tag}_{name}` and adds it to the inventory in `state`; returns its name
    /// and a reader.
    pub async fn add_jobdb(&self, name: &str, state: JobDbState) -> (String, JobDb) {
        let name = format!("{}_{name}", self.tag);
        let url = format!("{}/{name}", self.mysql);
        let db = JobDb::open(&url.parse().unwrap(), true, 4).await.unwrap();
        let record = JobDbRecord {
            name: name.clone(),
            url,
            state,
            changed_at: chrono::Utc::now(),
            changed_by: "test".into(),
        };
        assert!(self.inventory.add(&record).await.unwrap());
        (name, db)
    }

    /// A reader of JobDB `name` of this cluster.
    pub async fn open(&self, name: &str) -> JobDb {
        let url = format!("{}/{name}", self.mysql).parse().unwrap();
        JobDb::open(&url, false, 2).await.unwrap()
    }

    /// The reader of a JobDB the builder made.
    pub fn jobdb(&self, name: &str) -> &JobDb {
        &self
            .jobdbs
            .iter()
            .find(|(n, _)| n == name)
            .expect("a jobdb of the cluster")
            .1
    }

    /// How many JobDBs the inventory lists in `state`.
    pub async fn in_state(&self, state: JobDbState) -> usize {
        let listed = self.inventory.list().await.unwrap();
        listed.iter().filter(|l| l.record.state == state).count()
    }

    /// JobDB name → lock holder session.
    pub async fn holders(&self) -> HashMap<String, Option<String>> {
        self.inventory
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.record.name, l.holder))
            .collect()
    }

    /// Port → JobDB of every healthy Director in the catalog.
    pub async fn catalog(&self) -> HashMap<u16, String> {
        catalog::healthy_directors(&self.consul.client)
            .await
            .unwrap()
            .into_iter()
            .map(|i| (i.port, i.meta.get("jobdb").cloned().unwrap_or_default()))
            .collect()
    }

    /// Waits until every Director of [`Cluster::directors`] is ready, registered, and on a
    /// JobDB of its own; returns the catalog then.
    pub async fn settled(&self) -> HashMap<u16, String> {
        wait_for(
            Duration::from_secs(30),
            "directors settled on distinct jobdbs",
            || async {
                for d in &self.directors {
                    if !d.ready(&self.client).await {
                        return false;
                    }
                }
                let catalog = self.catalog().await;
                let jobdbs: HashSet<_> = self
                    .directors
                    .iter()
                    .filter_map(|d| catalog.get(&d.port))
                    .collect();
                let held = self
                    .holders()
                    .await
                    .values()
                    .filter(|h| h.is_some())
                    .count();
                jobdbs.len() == self.directors.len() && held == self.directors.len()
            },
        )
        .await;
        self.catalog().await
    }

    /// Waits until every one of `procs` answers `/readyz` 200.
    pub async fn wait_ready<'a>(&self, procs: impl IntoIterator<Item = &'a Proc>) {
        let procs: Vec<&Proc> = procs.into_iter().collect();
        wait_for(Duration::from_secs(30), "processes ready", || async {
            for p in &procs {
                if !p.ready(&self.client).await {
                    return false;
                }
            }
            true
        })
        .await;
    }

    /// Waits until the builder's router is ready and sees `directors` Directors.
    pub async fn wait_router_ready(&self, directors: usize) {
        let url = format!("{}/readyz", self.router_base());
        let client = &self.client;
        wait_for(
            Duration::from_secs(30),
            "the router to see every director",
            || async {
                match client.get(&url).send().await {
                    Ok(r) if r.status().is_success() => r
                        .text()
                        .await
                        .is_ok_and(|t| t.contains(&format!("{directors} directors"))),
                    _ => false,
                }
            },
        )
        .await;
    }

    /// Waits until a process holds the lock of JobDB `name`.
    pub async fn wait_owned(&self, name: &str, what: &str) {
        wait_for(Duration::from_secs(20), what, || async {
            self.inventory
                .get(name)
                .await
                .unwrap()
                .is_some_and(|l| l.holder.is_some())
        })
        .await;
    }

    /// Waits until JobDB `name` is marked drained.
    pub async fn wait_drained(&self, name: &str, timeout: Duration) {
        wait_for(timeout, "the jobdb drained", || async {
            self.inventory
                .get(name)
                .await
                .unwrap()
                .is_some_and(|l| l.record.state == JobDbState::Drained)
        })
        .await;
    }

    /// Asserts every job of a JobDB the builder made reached exactly one terminal state,
    /// `succeeded`, through a legal history.
    pub async fn assert_all_terminal(&self, name: &str, expected: u64) {
        let reader = self.jobdb(name);
        wait_all_final(reader, expected, Duration::from_secs(60)).await;
        let histories = histories(reader).await;
        assert_eq!(histories.len() as u64, expected, "{name}");
        for history in histories.values() {
            assert_legal(history);
            assert_eq!(history.last().unwrap().state, State::Succeeded);
        }
    }

    /// Every job of every JobDB the builder made: (id, idempotency key, bucket, jobdb).
    pub async fn stored(&self) -> Vec<(String, Option<String>, String, String)> {
        let mut out = Vec::new();
        for (name, db) in &self.jobdbs {
            let ids: Vec<_> = histories(db).await.into_keys().collect();
            for job in db.get_jobs(&ids).await.unwrap() {
                out.push((
                    job.id.to_string(),
                    job.idempotency_key.clone(),
                    job.bucket.to_string(),
                    name.clone(),
                ));
            }
        }
        out
    }

    /// How many dedup keys of this cluster database `db` of the shared Redis holds.
    pub async fn dedup_keys(&self, db: u8) -> usize {
        let url = format!("{SHARED_REDIS}/{db}");
        redis_keys(&url, &format!("{}:", self.tag))
            .await
            .unwrap()
            .len()
    }

    /// Every database of this cluster that exists on its server.
    pub async fn databases(&self) -> HashSet<String> {
        let server: JobDbUrl = format!("{}/any", self.mysql).parse().unwrap();
        let names = spindle::jobdb::databases_like(&server.server, &format!("{}\\_%", self.tag))
            .await
            .unwrap();
        names.into_iter().collect()
    }

    /// Where every job ended: final states found in the JobDBs still there, plus every job
    /// in the archive (expired ones, and the histories of dropped JobDBs).
    pub async fn census(&self) -> Census {
        let mut census = Census::default();
        for l in self.inventory.list().await.unwrap() {
            if l.record.state == JobDbState::Dropped {
                continue;
            }
            // A drained JobDB may be dropped while we look: its jobs are in the archive
            // (listed after this), so a JobDB that vanishes is skipped.
            let Ok(db) = JobDb::open(&l.record.url.parse().unwrap(), false, 2).await else {
                continue;
            };
            let Ok(rows) = db.all_transitions().await else {
                continue;
            };
            db.close().await;
            let mut by_job: BTreeMap<JobId, Vec<Transition>> = BTreeMap::new();
            for (_, t) in rows {
                by_job.entry(t.job_id).or_default().push(t);
            }
            for (id, history) in by_job {
                assert_legal(&history);
                let last = history.last().unwrap().state;
                census.note(id, last, &l.record.name);
            }
        }
        for m in self.archive().manifests(None).await.unwrap() {
            for job in self.archive().read_batch(&m.object_key).await.unwrap() {
                let id = job.job_id().unwrap();
                let last = job.last_state();
                census.archived_copies.entry(id).or_default().push(m.kind);
                match (m.kind, last) {
                    // The object holds the job up to `archiving`; `archived` follows its
                    // confirmation, in a JobDB that may be gone by now.
                    (BatchKind::Expired, _) => census.note(id, State::Archived, &m.jobdb),
                    (_, Some(state)) => census.note(id, state, &m.jobdb),
                    _ => {}
                }
            }
        }
        census
    }

    /// Stops the builder's processes (SIGTERM), then removes the cluster's databases and
    /// Redis keys and stops the sink and Consul.
    pub async fn stop(mut self) {
        if let Some(router) = &mut self.router {
            router.term().await;
        }
        for d in &mut self.directors {
            d.term().await;
        }
        for (_, db) in &self.jobdbs {
            db.close().await;
        }
        self.leftovers.remove().await;
        self.sink.stop().await;
        self.consul.stop().await;
    }
}

/// Where the jobs of a cluster ended ([`Cluster::census`]).
#[derive(Default)]
pub struct Census {
    /// Final states (succeeded, discarded, archived) seen per job, with where.
    pub finals: HashMap<JobId, Vec<(State, String)>>,
    /// Archive batch kinds each job appears in.
    pub archived_copies: HashMap<JobId, Vec<BatchKind>>,
    /// Jobs moved out of a retired JobDB at least once.
    pub moved: HashSet<JobId>,
    /// The last state of each job in each place that holds it, final or not: where a job
    /// that never ended stands.
    pub last: HashMap<JobId, Vec<(State, String)>>,
}

impl Census {
    fn note(&mut self, id: JobId, state: State, place: &str) {
        self.last
            .entry(id)
            .or_default()
            .push((state, place.to_owned()));
        if state == State::Moved {
            self.moved.insert(id);
        }
        let entry = self.finals.entry(id).or_default();
        if state.is_final() {
            // One end, two records of it: a job archived as expired is also `archived` in its
            // JobDB; and a JobDB read live may be drained before the archive is read, its
            // history batch then holding the same end (the place is the JobDB either way).
            if entry.iter().any(|(s, p)| {
                *s == state && (p == place || (state == State::Archived && *s == State::Archived))
            }) {
                return;
            }
            entry.push((state, place.to_owned()));
        }
    }

    /// Asserts every accepted job has exactly one final state and nothing else appears.
    pub fn assert_exactly_once(&self, accepted: &HashSet<JobId>) -> HashMap<State, usize> {
        let mut by_state = HashMap::new();
        for id in accepted {
            let finals = self.finals.get(id).map(Vec::as_slice).unwrap_or(&[]);
            assert_eq!(
                finals.len(),
                1,
                "job {id} ended {finals:?}; its last states: {:?}",
                self.last.get(id)
            );
            *by_state.entry(finals[0].0).or_default() += 1;
        }
        let invented: Vec<_> = self
            .finals
            .keys()
            .filter(|id| !accepted.contains(id))
            .collect();
        assert!(invented.is_empty(), "jobs nobody submitted: {invented:?}");
        for (id, kinds) in &self.archived_copies {
            let expired = kinds.iter().filter(|k| **k == BatchKind::Expired).count();
            assert!(expired <= 1, "job {id} archived {expired} times");
        }
        by_state
    }
}
