//! `spindle bench --dedup`: the router's dedup store alone. Claims of `--jobs` new ids through
//! one [`DedupStore`] over the stores of `--redis` (comma-separated; `memory:` for an
//! in-process store), `--batch` ids per claim call from `--concurrency` tasks, in three passes
//! as a router makes them: claim (every id new), confirm, and claim again with other owners
//! (every id a duplicate). Per pass: ids per second, this process's CPU per id, and on Redis
//! the time spent inside the scripts (`INFO commandstats`); then the bytes each stored id costs
//! (`used_memory`) and how Redis encodes the hashes.
//!
//! Point it at Redis servers of its own: it resets their command statistics, and their memory
//! is read whole. Its keys live under a prefix of the run, deleted at the end.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;

use super::BenchArgs;
use crate::job::JobId;
use crate::router::dedup::memory::MemoryStore;
use crate::router::dedup::{
    Claim, ClaimOutcome, ConfirmOutcome, DedupConfig, DedupKey, DedupStore, StoreSpec,
};
use crate::router::placement::{PlacementManager, PlacementSettings};

/// What one pass measured.
#[derive(Debug, serde::Serialize)]
pub struct Pass {
    /// `claim`, `confirm` or `repeat`.
    pub pass: &'static str,
    /// Wall time of the pass.
    pub seconds: f64,
    /// Ids through the pass per second.
    pub ids_per_sec: f64,
    /// This process's CPU time per id (the router's side of the store).
    pub router_cpu_us_per_id: f64,
    /// Time inside the Redis scripts per id (zero for memory stores).
    pub script_us_per_id: f64,
    /// Script calls the Redis servers ran in the pass.
    pub script_calls: u64,
}

/// The report of `spindle bench --dedup`.
#[derive(Debug, serde::Serialize)]
pub struct DedupReport {
    /// Ids claimed (`--jobs`).
    pub ids: usize,
    /// Stores (`--redis`).
    pub stores: usize,
    /// Ids per claim call (`--batch`).
    pub per_call: usize,
    /// Claiming tasks (`--concurrency`).
    pub tasks: usize,
    /// The store's `hash_bits`, sized to the ids (about 30 per hash).
    pub hash_bits: u8,
    /// Hashing one idempotency key into its dedup key.
    pub key_hash_ns_per_id: f64,
    /// Claim, confirm, repeat.
    pub passes: Vec<Pass>,
    /// `used_memory` grown per id while the claims are pending (Redis).
    pub bytes_per_id_pending: Option<f64>,
    /// `used_memory` grown per id once the claims are confirmed (Redis).
    pub bytes_per_id_confirmed: Option<f64>,
    /// Hashes stored over the Redis stores.
    pub hashes: Option<usize>,
    /// Encodings of a sample of the hashes, with how many had each.
    pub encodings: BTreeMap<String, usize>,
    /// Entries the memory stores hold at the end.
    pub memory_entries: Option<usize>,
}

/// Runs the benchmark and returns its report.
pub async fn run(args: &BenchArgs, tag: &str) -> anyhow::Result<DedupReport> {
    let urls: Vec<&str> = args.redis.split(',').map(str::trim).collect();
    let memory = urls.iter().all(|u| u.starts_with(MemoryStore::SCHEME));
    anyhow::ensure!(
        memory || urls.iter().all(|u| !u.starts_with(MemoryStore::SCHEME)),
        "--redis: all Redis URLs or all memory:, not both"
    );
    let specs: Vec<StoreSpec> = urls
        .iter()
        .enumerate()
        .map(|(i, url)| StoreSpec {
            id: format!("s{i}"),
            url: match memory {
                true => format!("{}bench-{tag}-{i}", MemoryStore::SCHEME),
                false => (*url).to_owned(),
            },
        })
        .collect();
    let redis = match memory {
        true => Vec::new(),
        false => connect_all(&urls).await?,
    };
    let prefix = format!("bench:{tag}:");
    let hash_bits = super::topology::hash_bits_for(args.jobs);
    let store = open_store(&specs, &prefix, hash_bits).await?;

    let hashing = Instant::now();
    let keys: Vec<DedupKey> = (0..args.jobs)
        .map(|i| DedupKey::new("bench-bucket", &format!("order-{i:08}")))
        .collect();
    let key_hash_ns_per_id = hashing.elapsed().as_nanos() as f64 / args.jobs as f64;
    let at = Utc::now();
    let claims: Vec<Claim> = keys
        .iter()
        .map(|&key| Claim {
            key,
            at,
            owner: JobId(ulid::Ulid::new()),
        })
        .collect();
    let repeats: Vec<Claim> = claims
        .iter()
        .map(|c| Claim {
            owner: JobId(ulid::Ulid::new()),
            ..*c
        })
        .collect();
    let (claims, repeats) = (Arc::new(claims), Arc::new(repeats));

    let measured = async {
        // used_memory before the passes, and after each.
        let mut used = vec![used_memory(&redis).await?];
        let mut passes = Vec::new();
        // Each pass, and the outcome every id must have in it.
        for (name, ask, of, outcome) in [
            ("claim", Ask::Claim, &claims, 0),
            ("confirm", Ask::Confirm, &claims, 0),
            ("repeat", Ask::Claim, &repeats, 2),
        ] {
            let run = run_pass(&store, of.clone(), args, ask);
            let (pass, counts) = measure(&redis, name, args, run).await?;
            anyhow::ensure!(
                counts[outcome] == args.jobs,
                "{name}: {} of {} ids as expected ({counts:?})",
                counts[outcome],
                args.jobs
            );
            passes.push(pass);
            used.push(used_memory(&redis).await?);
        }
        let (before, pending, confirmed) = (used[0], used[1], used[2]);
        let per_id = |grown: i64| grown as f64 / args.jobs as f64;
        let (hashes, encodings) = hashes(&redis, &prefix).await?;
        Ok(DedupReport {
            ids: args.jobs,
            stores: specs.len(),
            per_call: args.batch,
            tasks: args.concurrency,
            hash_bits,
            key_hash_ns_per_id,
            passes,
            bytes_per_id_pending: (!memory).then(|| per_id(pending - before)),
            bytes_per_id_confirmed: (!memory).then(|| per_id(confirmed - before)),
            hashes: (!memory).then_some(hashes),
            encodings,
            memory_entries: memory.then(|| {
                (0..specs.len())
                    .map(|i| MemoryStore::named(&format!("bench-{tag}-{i}")).live_entries(&prefix))
                    .sum()
            }),
        })
    }
    .await;
    for conn in &redis {
        delete_keys(conn.clone(), &prefix).await?;
    }
    measured
}

/// The store a router would open over `specs` (script calls of at most 1,000 ids, 8 in flight
/// per claim call: the defaults).
async fn open_store(
    specs: &[StoreSpec],
    prefix: &str,
    hash_bits: u8,
) -> anyhow::Result<DedupStore> {
    let placements = Arc::new(PlacementManager::in_memory(PlacementSettings::default()));
    placements
        .bootstrap(specs.iter().map(|s| s.id.clone()).collect(), 1024)
        .await?;
    let config = DedupConfig {
        hash_bits,
        // The passes share one claim time and may take a while on a busy machine.
        max_skew: Duration::from_secs(120),
        key_prefix: prefix.to_owned(),
        ..DedupConfig::default()
    };
    let store = DedupStore::connect(config, specs.to_vec(), placements).await?;
    // Warm up: placements cached, scripts loaded, connections open.
    let warm: Vec<Claim> = (0..specs.len() * 64)
        .map(|i| Claim {
            key: DedupKey::new("warm", &i.to_string()),
            at: Utc::now(),
            owner: JobId(ulid::Ulid::new()),
        })
        .collect();
    store.claim(&warm).await?;
    store.release(&warm).await?;
    Ok(store)
}

/// Counts of outcomes: new (claimed or confirmed), mine, duplicate or lapsed (or not
/// confirmed).
type Counts = [usize; 3];

/// Runs `run` (not started before it is handed over) and reads what it cost: wall time, this
/// process's CPU, the scripts' time.
async fn measure(
    redis: &[redis::aio::MultiplexedConnection],
    name: &'static str,
    args: &BenchArgs,
    run: impl Future<Output = anyhow::Result<Counts>>,
) -> anyhow::Result<(Pass, Counts)> {
    for conn in redis {
        let _: String = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn.clone())
            .await?;
    }
    let cpu = super::procs::cpu_seconds(std::process::id()).unwrap_or(0.0);
    let started = Instant::now();
    let counts = run.await?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = super::procs::cpu_seconds(std::process::id()).unwrap_or(0.0) - cpu;
    let (calls, usec) = script_stats(redis).await?;
    let ids = args.jobs as f64;
    Ok((
        Pass {
            pass: name,
            seconds,
            ids_per_sec: ids / seconds.max(f64::MIN_POSITIVE),
            router_cpu_us_per_id: cpu * 1e6 / ids,
            script_us_per_id: usec as f64 / ids,
            script_calls: calls,
        },
        counts,
    ))
}

/// What a pass asks of the store for each claim.
#[derive(Clone, Copy)]
enum Ask {
    Claim,
    Confirm,
}

/// One pass over `claims`: slices of `--batch` from `--concurrency` tasks, each asking the
/// store and counting the outcomes (claims: claimed, mine, duplicate or lapsed; confirms:
/// confirmed, not).
async fn run_pass(
    store: &DedupStore,
    claims: Arc<Vec<Claim>>,
    args: &BenchArgs,
    ask: Ask,
) -> anyhow::Result<Counts> {
    let next = Arc::new(AtomicUsize::new(0));
    let per_call = args.batch;
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (store, claims, next) = (store.clone(), claims.clone(), next.clone());
            tokio::spawn(async move {
                let mut counts = [0usize; 3];
                loop {
                    let start = next.fetch_add(per_call, Ordering::Relaxed);
                    if start >= claims.len() {
                        return Ok::<_, anyhow::Error>(counts);
                    }
                    let slice = &claims[start..(start + per_call).min(claims.len())];
                    match ask {
                        Ask::Claim => {
                            for o in store.claim(slice).await? {
                                counts[match o {
                                    ClaimOutcome::Claimed => 0,
                                    ClaimOutcome::Mine => 1,
                                    ClaimOutcome::Duplicate { .. }
                                    | ClaimOutcome::Lapsed { .. } => 2,
                                }] += 1;
                            }
                        }
                        Ask::Confirm => {
                            for o in store.confirm(slice).await? {
                                counts[usize::from(o != ConfirmOutcome::Confirmed)] += 1;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let mut counts = [0usize; 3];
    for w in workers {
        let got = w.await.context("a claiming task")??;
        (0..3).for_each(|i| counts[i] += got[i]);
    }
    Ok(counts)
}

/// One connection to each Redis server.
async fn connect_all(urls: &[&str]) -> anyhow::Result<Vec<redis::aio::MultiplexedConnection>> {
    let mut conns = Vec::new();
    for url in urls {
        let client = redis::Client::open(*url).with_context(|| format!("--redis {url}"))?;
        conns.push(
            client
                .get_multiplexed_async_connection()
                .await
                .with_context(|| format!("--redis {url}"))?,
        );
    }
    Ok(conns)
}

/// Script calls and microseconds spent in them (`EVALSHA` and `EVAL`), over the servers.
async fn script_stats(redis: &[redis::aio::MultiplexedConnection]) -> anyhow::Result<(u64, u64)> {
    let (mut calls, mut usec) = (0, 0);
    for conn in redis {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn.clone())
            .await?;
        for line in info.lines() {
            let Some(stats) = line
                .strip_prefix("cmdstat_evalsha:")
                .or_else(|| line.strip_prefix("cmdstat_eval:"))
            else {
                continue;
            };
            for field in stats.split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => calls += v.parse::<u64>().unwrap_or(0),
                    Some(("usec", v)) => usec += v.parse::<u64>().unwrap_or(0),
                    _ => {}
                }
            }
        }
    }
    Ok((calls, usec))
}

/// Sum of `used_memory` over the servers.
async fn used_memory(redis: &[redis::aio::MultiplexedConnection]) -> anyhow::Result<i64> {
    let mut total = 0;
    for conn in redis {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn.clone())
            .await?;
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<i64>().ok())
            .context("no used_memory in INFO memory")?;
    }
    Ok(total)
}

/// The hashes under `prefix` over the servers, and the encodings of up to 200 of each's.
async fn hashes(
    redis: &[redis::aio::MultiplexedConnection],
    prefix: &str,
) -> anyhow::Result<(usize, BTreeMap<String, usize>)> {
    let (mut hashes, mut encodings) = (0, BTreeMap::new());
    for conn in redis {
        let keys = keys_under(conn.clone(), prefix).await?;
        hashes += keys.len();
        for key in keys.iter().take(200) {
            let encoding: String = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(key)
                .query_async(&mut conn.clone())
                .await?;
            *encodings.entry(encoding).or_default() += 1;
        }
    }
    Ok((hashes, encodings))
}

/// Every key under `prefix`.
async fn keys_under(
    mut conn: redis::aio::MultiplexedConnection,
    prefix: &str,
) -> anyhow::Result<Vec<Vec<u8>>> {
    use futures::TryStreamExt;
    use redis::AsyncCommands;
    let scan = redis::ScanOptions::default()
        .with_pattern(format!("{prefix}*"))
        .with_count(1000);
    Ok(conn.scan_options(scan).await?.try_collect().await?)
}

/// Deletes every key under `prefix`.
async fn delete_keys(conn: redis::aio::MultiplexedConnection, prefix: &str) -> anyhow::Result<()> {
    let keys = keys_under(conn.clone(), prefix).await?;
    for chunk in keys.chunks(1000) {
        let _: i64 = redis::cmd("UNLINK")
            .arg(chunk)
            .query_async(&mut conn.clone())
            .await?;
    }
    Ok(())
}

impl std::fmt::Display for DedupReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "dedup: {} ids over {} store(s), {} per claim call from {} task(s), hash_bits {}",
            self.ids, self.stores, self.per_call, self.tasks, self.hash_bits
        )?;
        writeln!(
            f,
            "  key hashing (SHA-256)  {:.0} ns/id",
            self.key_hash_ns_per_id
        )?;
        for p in &self.passes {
            writeln!(
                f,
                "  {:<8} {:>7.2} s {:>9.0} ids/s | router CPU {:>5.2} µs/id | in scripts {:>5.2} µs/id ({} calls)",
                p.pass, p.seconds, p.ids_per_sec, p.router_cpu_us_per_id, p.script_us_per_id, p.script_calls
            )?;
        }
        if let (Some(pending), Some(confirmed)) =
            (self.bytes_per_id_pending, self.bytes_per_id_confirmed)
        {
            writeln!(
                f,
                "  memory per id: {pending:.1} bytes pending, {confirmed:.1} bytes confirmed"
            )?;
        }
        if let Some(hashes) = self.hashes {
            writeln!(
                f,
                "  {hashes} hashes ({:.0} ids each), encodings of a sample: {:?}",
                self.ids as f64 / hashes.max(1) as f64,
                self.encodings
            )?;
        }
        if let Some(entries) = self.memory_entries {
            writeln!(f, "  {entries} entries held")?;
        }
        write!(
            f,
            "{}",
            serde_json::to_string(self).map_err(|_| std::fmt::Error)?
        )
    }
}
