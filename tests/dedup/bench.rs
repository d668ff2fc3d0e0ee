//! `dedup_benchmark` (ignored): claims per second through one router over Redis shards or
//! in-process stores, with the readings of the servers and of this process it prints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use spindle::router::dedup::{
    Claim, ClaimOutcome, ConfirmOutcome, DedupConfig, DedupKey, DedupStore,
};
use spindle::router::placement::{PlacementManager, PlacementSettings};

use crate::common::redis_server::PrivateRedis;
use crate::{connection, new_owner, private_stores, redis_keys, Kind};

/// One benchmark run: `ids` claims through one router over `shards` private Redis servers (or
/// in-process stores).
///
/// `per_call` claims per `claim` call, from `tasks` concurrent tasks; the store cuts each call
/// into script calls of `batch`, `in_flight` at a time.
#[allow(clippy::too_many_arguments)]
async fn bench_run(
    kind: Kind,
    shards: usize,
    ids: usize,
    per_call: usize,
    tasks: usize,
    in_flight: usize,
    hash_bits: u8,
    slots_per_window: u32,
) {
    let batch = env_usize("DEDUP_BENCH_BATCH", 1_000);
    let (servers, specs, inspects) = private_stores(kind, shards).await;
    let prefix = "b:";
    let placements = Arc::new(PlacementManager::in_memory(PlacementSettings::default()));
    placements
        .bootstrap(specs.iter().map(|s| s.id.clone()).collect(), 1024)
        .await
        .unwrap();
    let config = DedupConfig {
        window: Duration::from_secs(24 * 3600),
        slots_per_window,
        hash_bits,
        pending_ttl: Duration::from_secs(600),
        // The passes share one claim time and may take a while on a busy machine.
        max_skew: Duration::from_secs(120),
        key_prefix: prefix.to_owned(),
        max_batch: batch,
        max_in_flight: in_flight,
        ..DedupConfig::default()
    };
    let store = DedupStore::connect(config, specs, placements)
        .await
        .unwrap();
    // Warm up: placements cached, scripts loaded, connections open.
    let warm: Vec<Claim> = (0..shards * 64)
        .map(|i| Claim {
            key: DedupKey::new("warm", &i.to_string()),
            at: Utc::now(),
            owner: new_owner(),
        })
        .collect();
    store.claim(&warm).await.unwrap();
    store.release(&warm).await.unwrap();

    let hashing = Instant::now();
    let keys: Vec<DedupKey> = (0..ids)
        .map(|i| DedupKey::new("bench-bucket", &format!("order-{i:08}")))
        .collect();
    let hash_ns = hashing.elapsed().as_nanos() as f64 / ids as f64;
    let at = Utc::now();
    let claims: Arc<Vec<Claim>> = Arc::new(
        keys.iter()
            .map(|&key| Claim {
                key,
                at,
                owner: new_owner(),
            })
            .collect(),
    );
    let memory_before = used_memory(&servers).await;

    let pass = |claims: Arc<Vec<Claim>>, what: &'static str| {
        let store = store.clone();
        async move {
            let next = Arc::new(AtomicUsize::new(0));
            let started = Instant::now();
            let workers: Vec<_> = (0..tasks)
                .map(|_| {
                    let (store, claims, next) = (store.clone(), claims.clone(), next.clone());
                    tokio::spawn(async move {
                        let mut counts = [0usize; 3];
                        loop {
                            let start = next.fetch_add(per_call, Ordering::Relaxed);
                            if start >= claims.len() {
                                return counts;
                            }
                            let end = (start + per_call).min(claims.len());
                            let slice = &claims[start..end];
                            if what == "confirm" {
                                for o in store.confirm(slice).await.unwrap() {
                                    counts[usize::from(o != ConfirmOutcome::Confirmed)] += 1;
                                }
                            } else {
                                for o in store.claim(slice).await.unwrap() {
                                    counts[match o {
                                        ClaimOutcome::Claimed => 0,
                                        ClaimOutcome::Mine => 1,
                                        ClaimOutcome::Duplicate { .. }
                                        | ClaimOutcome::Lapsed { .. } => 2,
                                    }] += 1;
                                }
                            }
                        }
                    })
                })
                .collect();
            let mut counts = [0usize; 3];
            for w in workers {
                let c = w.await.unwrap();
                (0..3).for_each(|i| counts[i] += c[i]);
            }
            (started.elapsed(), counts)
        }
    };

    // Each pass: wall time, this process's CPU time, and the servers' time inside scripts.
    let measured = |claims: Arc<Vec<Claim>>, what: &'static str| {
        let pass = &pass;
        let servers = &servers;
        async move {
            reset_stats(servers).await;
            let cpu = cpu_seconds();
            let (wall, counts) = pass(claims, what).await;
            let cpu = cpu_seconds() - cpu;
            let (calls, usec) = script_stats(servers).await;
            (wall, cpu, calls, usec, counts)
        }
    };
    let claim = measured(claims.clone(), "claim").await;
    assert_eq!(claim.4[0], ids, "every id new: {:?}", claim.4);
    let memory_pending = used_memory(&servers).await;
    let confirm = measured(claims.clone(), "confirm").await;
    assert_eq!(confirm.4[0], ids, "every claim confirmed: {:?}", confirm.4);
    let memory_confirmed = used_memory(&servers).await;
    let repeats: Arc<Vec<Claim>> = Arc::new(
        claims
            .iter()
            .map(|c| Claim {
                owner: new_owner(),
                ..*c
            })
            .collect(),
    );
    let repeat = measured(repeats, "claim").await;
    assert_eq!(repeat.4[2], ids, "every repeat a duplicate: {:?}", repeat.4);

    if kind == Kind::Memory {
        let line = |name: &str, (wall, cpu, ..): &(Duration, f64, u64, u64, [usize; 3])| {
            format!(
                "  {name:<20} {:>6.2} s {:>9.0} ids/s | router CPU {:>5.2} µs/id",
                wall.as_secs_f64(),
                ids as f64 / wall.as_secs_f64(),
                cpu * 1e6 / ids as f64,
            )
        };
        let mut held = 0;
        for inspect in &inspects {
            held += inspect.fields(prefix).await;
        }
        println!(
            "dedup benchmark: {shards} memory store(s), {ids} ids, {per_call} per claim call from {tasks} task(s), batches of {batch}, {in_flight} in flight per call, {slots_per_window} slots per window\n\
             \x20 key hashing (SHA-256): {hash_ns:.0} ns/id\n{}\n{}\n{}\n\
             \x20 {held} entries held",
            line("claim (all new)", &claim),
            line("confirm", &confirm),
            line("claim (all repeats)", &repeat),
        );
        return;
    }
    let mut hashes = 0usize;
    let mut encodings: HashMap<String, usize> = HashMap::new();
    for server in &servers {
        let mut conn = connection(&server.url()).await;
        let n: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        hashes += n;
        for key in redis_keys(&server.url(), prefix)
            .await
            .into_iter()
            .take(200)
        {
            let e: String = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            *encodings.entry(e).or_default() += 1;
        }
    }
    let line = |name: &str, (wall, cpu, calls, usec, _): &(Duration, f64, u64, u64, [usize; 3])| {
        format!(
            "  {name:<20} {:>6.2} s {:>9.0} ids/s | router CPU {:>5.2} µs/id | in scripts {:>5.2} µs/id ({} calls, {:.1} ms each)",
            wall.as_secs_f64(),
            ids as f64 / wall.as_secs_f64(),
            cpu * 1e6 / ids as f64,
            *usec as f64 / ids as f64,
            calls,
            *usec as f64 / 1000.0 / (*calls).max(1) as f64,
        )
    };
    println!(
        "dedup benchmark: {shards} redis shard(s), {ids} ids, {per_call} per claim call from {tasks} task(s), script calls of {batch}, {in_flight} in flight per call, hash_bits {hash_bits}, {slots_per_window} slots per window\n\
         \x20 key hashing (SHA-256): {hash_ns:.0} ns/id\n{}\n{}\n{}\n\
         \x20 memory per id: {:.1} bytes pending, {:.1} bytes confirmed (used_memory delta / ids)\n\
         \x20 {hashes} hashes ({:.0} ids each), encodings of a sample: {encodings:?}",
        line("claim (all new)", &claim),
        line("confirm", &confirm),
        line("claim (all repeats)", &repeat),
        (memory_pending - memory_before) as f64 / ids as f64,
        (memory_confirmed - memory_before) as f64 / ids as f64,
        ids as f64 / hashes as f64,
    );
    drop(servers);
}

/// Resets the servers' command statistics.
async fn reset_stats(servers: &[PrivateRedis]) {
    for server in servers {
        let mut conn = connection(&server.url()).await;
        let _: String = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// Script calls and microseconds spent in them (`EVALSHA` and `EVAL`), over the servers.
async fn script_stats(servers: &[PrivateRedis]) -> (u64, u64) {
    let (mut calls, mut usec) = (0, 0);
    for server in servers {
        let mut conn = connection(&server.url()).await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
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
    (calls, usec)
}

/// This process's CPU time (user + system), from `/proc/self/stat` (clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Sum of `used_memory` over the servers.
async fn used_memory(servers: &[PrivateRedis]) -> i64 {
    let mut total = 0;
    for server in servers {
        let mut conn = connection(&server.url()).await;
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .unwrap();
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<i64>().ok())
            .expect("used_memory in INFO memory");
    }
    total
}

/// A benchmark knob from the environment.
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Claims per second through one router against 1 and 3 Redis shards (and bytes per stored
/// id), then against 1 and 3 in-process stores (`DEDUP_BENCH_BACKENDS`, default
/// `redis,memory`). Not a pass/fail test: run it in release mode and read the output.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
async fn dedup_benchmark() {
    let ids = env_usize("DEDUP_BENCH_IDS", 2_000_000);
    let batch = env_usize("DEDUP_BENCH_BATCH", 1_000);
    let in_flight = env_usize("DEDUP_BENCH_IN_FLIGHT", 8);
    let slots = env_usize("DEDUP_BENCH_SLOTS", 2) as u32;
    // 2^15 hashes: about 61 ids per hash, under the default hash-max-listpack-entries (128).
    let hash_bits = env_usize("DEDUP_BENCH_HASH_BITS", 15) as u8;
    let shard_counts: Vec<usize> = std::env::var("DEDUP_BENCH_SHARDS")
        .unwrap_or_else(|_| "1,3".to_owned())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let kinds: Vec<Kind> = std::env::var("DEDUP_BENCH_BACKENDS")
        .unwrap_or_else(|_| "redis,memory".to_owned())
        .split(',')
        .filter_map(|v| match v.trim() {
            "redis" => Some(Kind::Redis),
            "memory" => Some(Kind::Memory),
            _ => None,
        })
        .collect();
    for kind in kinds {
        for &shards in &shard_counts {
            // As a router sees them: calls of one batch each, several at once.
            bench_run(
                kind, shards, ids, batch, in_flight, in_flight, hash_bits, slots,
            )
            .await;
            // Tapjoy's setting: one call with every id (sorted, cut into script calls of `batch`).
            bench_run(kind, shards, ids, ids, 1, in_flight, hash_bits, slots).await;
        }
    }
}
