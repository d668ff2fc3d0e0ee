//! The processes a benchmark runs: a Director on a fresh JobDB (direct), or the production
//! path (`--via-router`): an in-process registry (the repository's Consul-API server), fresh
//! JobDBs in its inventory, Directors and routers as child processes, dedup on the given Redis.

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::process::{Child, Command};

use super::BenchArgs;
use crate::jobdb::{self, JobDbUrl};
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::{Inventory, JobDbRecord, JobDbState};

/// A child process of the bench.
pub struct ChildProc {
    /// `director`, `router` or `drainer`.
    pub component: &'static str,
    /// Its RPC address (a drainer's: its metrics).
    pub base: String,
    child: Child,
}

impl ChildProc {
    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// The running topology.
pub struct Topology {
    /// Directors and routers.
    pub children: Vec<ChildProc>,
    /// Where producers submit: the routers, or the Director.
    pub targets: Vec<String>,
    /// The JobDBs in use.
    pub jobdbs: Vec<JobDbUrl>,
    /// With `--events`: the Director's control database.
    control: Option<JobDbUrl>,
    /// Names jobs' idempotency keys (and the dedup keys in Redis) apart from other runs.
    pub tag: String,
    registry: Option<consul_double::ConsulDouble>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn spawn(
    bin: Option<&std::path::Path>,
    component: &'static str,
    args: &[String],
) -> anyhow::Result<ChildProc> {
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let exe = match bin {
        Some(bin) => bin.to_owned(),
        None => std::env::current_exe()?,
    };
    // A drainer serves only its metrics.
    let listen_flag = match component {
        "drainer" => "--metrics-listen",
        _ => "--listen",
    };
    let child = Command::new(exe)
        .arg(component)
        .arg(listen_flag)
        .arg(&listen)
        .args(args)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting a {component}"))?;
    Ok(ChildProc {
        component,
        base: format!("http://{listen}"),
        child,
    })
}

/// A Director child: `first` (where its JobDB comes from), the bench's own flags, then the
/// user's `-- ...` flags.
fn spawn_director(args: &BenchArgs, mut first: Vec<String>) -> anyhow::Result<ChildProc> {
    first.extend(
        [
            "--log",
            "warn",
            "--allow-subnet",
            "127.0.0.0/8",
            // A backlog's requests never end: no point waiting for them at the end.
            "--shutdown-grace-ms",
            "2000",
        ]
        .map(str::to_owned),
    );
    first.extend(args.director_args.iter().cloned());
    spawn(args.bin.as_deref(), "director", &first)
}

impl Topology {
    /// With `--events`: the Director's control database.
    pub fn control(&self) -> Option<&JobDbUrl> {
        self.control.as_ref()
    }

    /// One Director on one fresh JobDB.
    pub async fn direct(args: &BenchArgs, tag: &str) -> anyhow::Result<Topology> {
        let (text, url) = jobdb_url(args, tag, None)?;
        let mut first = vec!["--jobdb".to_owned(), text];
        let mut control = None;
        if args.events {
            let (text, url) = jobdb_url(args, &format!("{tag}c"), None)?;
            first.extend(["--control-db".to_owned(), text]);
            control = Some(url);
        }
        let director = spawn_director(args, first)?;
        let target = director.base.clone();
        let topology = Topology {
            children: vec![director],
            targets: vec![target.clone()],
            jobdbs: vec![url],
            control,
            tag: tag.to_owned(),
            registry: None,
        };
        wait_ready(&target, "director", |_| true).await?;
        Ok(topology)
    }

    /// `routers` routers in front of Directors, each Director on a JobDB of its own taken from
    /// the registry's inventory, dedup on `--redis` (no router: the Directors on the registry
    /// alone).
    pub async fn via_router(
        args: &BenchArgs,
        tag: &str,
        routers: usize,
    ) -> anyhow::Result<Topology> {
        let registry = consul_double::ConsulDouble::start(consul_double::Config {
            listen: "127.0.0.1:0".parse()?,
            node_name: "spindle-bench".into(),
            session_ttl_min: Duration::from_secs(1),
            ..consul_double::Config::default()
        })
        .await
        .context("starting the in-process registry")?;
        let consul = registry.url();
        let inventory = Inventory::new(ConsulClient::new(&consul, None)?);
        let mut jobdbs = Vec::new();
        for i in 0..args.directors {
            let (text, url) = jobdb_url(args, tag, Some(i))?;
            // Created empty: the Director that takes it migrates it to its own schema (so a
            // `--bin` of another build runs on a JobDB of its own version).
            jobdb::create_database(&url).await?;
            let record = JobDbRecord {
                name: url.database.clone(),
                url: text,
                state: JobDbState::Spare,
                changed_at: chrono::Utc::now(),
                changed_by: "bench".into(),
            };
            inventory.add(&record).await?;
            jobdbs.push(url);
        }
        let mut children = Vec::new();
        for i in 0..args.directors {
            let registry = vec![
                "--registry".to_owned(),
                "consul".to_owned(),
                "--consul-addr".to_owned(),
                consul.clone(),
                "--director-id".to_owned(),
                format!("{tag}-d{i}"),
            ];
            children.push(spawn_director(args, registry)?);
        }
        let shard = args.directors.min(2).to_string();
        let mut targets = Vec::new();
        for _ in 0..routers {
            let router_args = vec![
                "--consul-addr".to_owned(),
                consul.clone(),
                "--redis".to_owned(),
                format!("a={}", args.redis),
                "--dedup-key-prefix".to_owned(),
                format!("{tag}:"),
                "--dedup-window-s".to_owned(),
                "600".to_owned(),
                "--dedup-hash-bits".to_owned(),
                hash_bits_for(args.jobs.saturating_add(args.backlog)).to_string(),
                "--placement-prefix".to_owned(),
                format!("spindle-bench/{tag}/placements"),
                "--shard-size".to_owned(),
                shard.clone(),
                "--log".to_owned(),
                "warn".to_owned(),
            ];
            let router = spawn(args.bin.as_deref(), "router", &router_args)?;
            targets.push(router.base.clone());
            children.push(router);
        }
        let topology = Topology {
            children,
            targets: targets.clone(),
            jobdbs,
            control: None,
            tag: tag.to_owned(),
            registry: Some(registry),
        };
        let directors = format!("{} directors", args.directors);
        for target in &targets {
            wait_ready(target, "router", |body| body.contains(&directors)).await?;
        }
        Ok(topology)
    }

    /// The in-process registry's address (Consul's HTTP API), with `--via-router`.
    pub fn registry_url(&self) -> Option<String> {
        self.registry.as_ref().map(|r| r.url())
    }

    /// Starts a drainer child on the registry, archiving to the directory `archive`.
    pub fn spawn_drainer(
        &mut self,
        args: &BenchArgs,
        consul: &str,
        archive: &std::path::Path,
    ) -> anyhow::Result<()> {
        let drainer_args = vec![
            "--consul-addr".to_owned(),
            consul.to_owned(),
            "--drainer-id".to_owned(),
            format!("{}-drainer", self.tag),
            "--poll-ms".to_owned(),
            "200".to_owned(),
            "--archive-dir".to_owned(),
            archive.display().to_string(),
            "--s3-prefix".to_owned(),
            super::drain::ARCHIVE_PREFIX.to_owned(),
            "--log".to_owned(),
            "warn".to_owned(),
        ];
        let drainer = spawn(args.bin.as_deref(), "drainer", &drainer_args)?;
        self.children.push(drainer);
        Ok(())
    }

    /// Stops every child (SIGTERM, then kill), the registry, and drops the JobDBs unless kept.
    pub async fn stop(mut self, keep: bool) -> anyhow::Result<()> {
        for c in &self.children {
            if let Some(pid) = c.pid() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        for c in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(30), c.child.wait())
                .await
                .is_err()
            {
                let _ = c.child.start_kill();
            }
        }
        if let Some(registry) = self.registry.take() {
            registry.stop().await;
        }
        if !keep {
            for url in self.jobdbs.iter().chain(&self.control) {
                jobdb::drop_database(url).await?;
            }
        }
        Ok(())
    }
}

/// A fresh JobDB's URL on `--mysql` (as text, and parsed): `spindle_bench_<tag>` (with `_<i>`
/// for the i-th).
pub(super) fn jobdb_url(
    args: &BenchArgs,
    tag: &str,
    i: Option<usize>,
) -> anyhow::Result<(String, JobDbUrl)> {
    let name = match i {
        Some(i) => format!("spindle_bench_{tag}_{i}"),
        None => format!("spindle_bench_{tag}"),
    };
    let text = format!("{}/{}", args.mysql.expose().trim_end_matches('/'), name);
    let url = text.parse().context("--mysql")?;
    Ok((text, url))
}

/// Waits until `base`'s `/readyz` answers 200 with a body `ok` accepts.
async fn wait_ready(base: &str, what: &str, ok: impl Fn(&str) -> bool) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await {
            if r.status().is_success() && r.text().await.is_ok_and(|t| ok(&t)) {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The routers' `--dedup-hash-bits` for a run of `keys` keys, sized as the dedup store's docs
/// advise (about 30 keys per hash in a slot: a run fits in one slot of the bench's window),
/// so the bench measures the store as it is meant to be set up.
pub(super) fn hash_bits_for(keys: usize) -> u8 {
    let hashes = (keys / 30).max(1);
    // ceil(log2(hashes)), at most the default's 16.
    u8::try_from(usize::BITS - (hashes - 1).leading_zeros())
        .unwrap_or(16)
        .min(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_bits_give_about_30_keys_per_hash() {
        assert_eq!(hash_bits_for(0), 0);
        assert_eq!(hash_bits_for(30), 0);
        assert_eq!(hash_bits_for(100_000), 12);
        assert_eq!(hash_bits_for(usize::MAX), 16);
    }
}
