//! The router's dedup store against real Redis and against the in-process store: claims,
//! duplicates and retries by the same owner over batches; the window across time slots in both
//! directions; pending claims that expire; release by owner only; hashes that expire; three
//! shards; a placement change (and a race across it); and the placement get-or-create race in
//! Consul.
//!
//! Every store case is a function of the backend, run as `<case>::redis` and `<case>::memory`
//! with the same body; only the inspection of what is stored ([`Inspect`]) differs.
//! Single-store Redis cases use the machine's shared Redis (`SPINDLE_TEST_REDIS`, default
//! `redis://127.0.0.1:6379`) under a key prefix of their own, deleted at the end (and every key
//! expires with its window anyway); memory cases share the in-process store `shared` the same
//! way. Multi-store cases start private `redis-server`s on free ports and kill them when done,
//! or use memory stores named for the case. Claim times are given explicitly, so no case sleeps
//! to move through time except the two that wait for something to expire.
//!
//! The store's benchmark is `spindle bench --dedup` (docs/benchmarks.md).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use common::redis_server::PrivateRedis;
use common::wait_for;
use spindle::job::JobId;
use spindle::router::dedup::memory::MemoryStore;
use spindle::router::dedup::{
    Claim, ClaimOutcome, ConfirmOutcome, DedupConfig, DedupKey, DedupStore, StoreSpec,
};
use spindle::router::placement::{PlacementManager, PlacementSettings};

/// The shared Redis server.
fn shared_redis() -> String {
    std::env::var("SPINDLE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A key prefix of this test alone.
fn unique_prefix(tag: &str) -> String {
    format!("sdt:{tag}:{}:", ulid::Ulid::new())
}

async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

/// Every key under `prefix`.
async fn redis_keys(url: &str, prefix: &str) -> Vec<Vec<u8>> {
    use futures::TryStreamExt;
    use redis::AsyncCommands;
    let mut conn = connection(url).await;
    let scan = redis::ScanOptions::default()
        .with_pattern(format!("{prefix}*"))
        .with_count(1000);
    let keys = conn.scan_options(scan).await.unwrap();
    keys.try_collect().await.unwrap()
}

/// Fields stored under `prefix`.
async fn fields(url: &str, prefix: &str) -> usize {
    let mut conn = connection(url).await;
    let mut total = 0;
    for key in redis_keys(url, prefix).await {
        let n: usize = redis::cmd("HLEN")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        total += n;
    }
    total
}

/// Deletes every key under `prefix`.
async fn cleanup(url: &str, prefix: &str) {
    let mut conn = connection(url).await;
    for key in redis_keys(url, prefix).await {
        let _: i64 = redis::cmd("UNLINK")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// Which dedup backend a case runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Redis stores, through the scripts.
    Redis,
    /// In-process stores.
    Memory,
}

/// Runs the case `$name(kind)` once per backend, as the tests `$name::redis` and
/// `$name::memory`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$name(Kind::Redis).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$name(Kind::Memory).await
            }
        }
    )*};
}

on_both_backends!(
    claims_duplicates_and_mine_over_batches,
    duplicates_are_found_across_slots_within_the_window_and_not_beyond,
    a_pending_claim_expires_and_frees_the_key,
    a_confirmation_later_than_the_skew_is_accepted,
    only_the_owner_releases_a_claim,
    hashes_expire_with_the_window,
);

// The parts come after `on_both_backends!`, which they use.
#[path = "dedup/model.rs"]
mod model;
#[path = "dedup/shards.rs"]
mod shards;

/// One stored entry: the owner and, while pending, its deadline (ms, the store's clock).
type Stored = ([u8; 16], Option<i64>);

/// A store as the cases look into it, around the `DedupStore`: a Redis server by URL, or an
/// in-process store.
#[derive(Clone)]
enum Inspect {
    Redis(String),
    Memory(Arc<MemoryStore>),
}

impl Inspect {
    /// Entries stored under `prefix`.
    async fn fields(&self, prefix: &str) -> usize {
        match self {
            Inspect::Redis(url) => fields(url, prefix).await,
            Inspect::Memory(store) => store.live_entries(prefix),
        }
    }

    /// Deletes what is stored under `prefix` (Redis; memory stores expire alone).
    async fn cleanup(&self, prefix: &str) {
        if let Inspect::Redis(url) = self {
            cleanup(url, prefix).await;
        }
    }

    /// The entry of `key` in the slot of `at` (1 s slots; on Redis read through the documented
    /// layout with `hash_bits` 8: hash `<prefix><slot>:<top 8 bits>`, field = the other 15
    /// bytes), and the store's clock in ms.
    async fn entry(
        &self,
        prefix: &str,
        key: &DedupKey,
        at: DateTime<Utc>,
    ) -> (Option<Stored>, i64) {
        let slot = at.timestamp_millis().div_euclid(1000);
        match self {
            Inspect::Redis(url) => {
                let mut conn = connection(url).await;
                let hash = format!("{prefix}{slot}:{}", key.as_bytes()[0]);
                let value: Option<Vec<u8>> = redis::cmd("HGET")
                    .arg(hash)
                    .arg(&key.as_bytes()[1..])
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let (secs, micros): (i64, i64) =
                    redis::cmd("TIME").query_async(&mut conn).await.unwrap();
                let stored = value.map(|v| {
                    let owner: [u8; 16] = v[..16].try_into().unwrap();
                    let deadline = (v.len() > 16)
                        .then(|| std::str::from_utf8(&v[16..]).unwrap().parse().unwrap());
                    (owner, deadline)
                });
                (stored, secs * 1000 + micros / 1000)
            }
            Inspect::Memory(store) => {
                let stored = store
                    .entry(prefix, slot, key)
                    .map(|e| (e.owner.to_bytes(), e.deadline_ms));
                (stored, MemoryStore::now_ms())
            }
        }
    }

    /// Each Redis hash (or memory slot) holding entries under `prefix`, with the ms it has left.
    async fn ttls(&self, prefix: &str) -> Vec<(String, i64)> {
        match self {
            Inspect::Redis(url) => common::cluster::keys_with_ttl(url, prefix)
                .await
                .expect("the keys' expiries"),
            Inspect::Memory(store) => {
                let now = MemoryStore::now_ms();
                store
                    .live_slots(prefix)
                    .into_iter()
                    .map(|(slot, expiry)| (format!("slot {slot}"), expiry - now))
                    .collect()
            }
        }
    }
}

/// Small window and slots (2 s of 1 s each), a skew large enough for hand-picked times.
fn config(prefix: &str) -> DedupConfig {
    DedupConfig {
        window: Duration::from_secs(2),
        slots_per_window: 2,
        hash_bits: 8,
        pending_ttl: Duration::from_secs(30),
        max_skew: Duration::from_secs(60),
        key_prefix: prefix.to_owned(),
        max_batch: 1000,
        ..DedupConfig::default()
    }
}

fn settings(prefix: &str, period: Duration, lead: Duration) -> PlacementSettings {
    PlacementSettings {
        prefix: prefix.to_owned(),
        period,
        lead,
        ..PlacementSettings::default()
    }
}

/// A dedup store over the shared Redis or the shared in-process store (one store, "shared"),
/// placements in memory.
async fn shared_store(kind: Kind, config: DedupConfig) -> (DedupStore, Inspect) {
    let placements = Arc::new(PlacementManager::in_memory(settings(
        "mem",
        Duration::from_secs(3600),
        Duration::from_secs(600),
    )));
    placements
        .bootstrap(vec!["shared".to_owned()], 1024)
        .await
        .unwrap();
    let spec = match kind {
        Kind::Redis => StoreSpec {
            id: "shared".to_owned(),
            url: shared_redis(),
        },
        Kind::Memory => StoreSpec::memory("shared"),
    };
    let store = DedupStore::connect(config, vec![spec], placements)
        .await
        .expect("connect to the shared store");
    let inspect = match kind {
        Kind::Redis => Inspect::Redis(shared_redis()),
        Kind::Memory => Inspect::Memory(store.memory_store("shared").expect("a memory store")),
    };
    (store, inspect)
}

fn new_owner() -> JobId {
    JobId(ulid::Ulid::new())
}

fn new_keys(tag: &str, n: usize) -> Vec<DedupKey> {
    let batch = ulid::Ulid::new();
    (0..n)
        .map(|i| DedupKey::new(tag, &format!("{batch}-{i}")))
        .collect()
}

fn claims_of(keys: &[DedupKey], at: DateTime<Utc>, owners: &[JobId]) -> Vec<Claim> {
    keys.iter()
        .zip(owners)
        .map(|(&key, &owner)| Claim { key, at, owner })
        .collect()
}

fn owners(n: usize) -> Vec<JobId> {
    (0..n).map(|_| new_owner()).collect()
}

/// A time `offset_ms` after the start of the current 1 s slot (+1 ms, off the boundary).
fn slot_aligned(offset_ms: i64) -> DateTime<Utc> {
    let now = Utc::now().timestamp_millis();
    Utc.timestamp_millis_opt(now - now.rem_euclid(1000) + 1 + offset_ms)
        .unwrap()
}

async fn claims_duplicates_and_mine_over_batches(kind: Kind) {
    let prefix = unique_prefix("batches");
    let (store, inspect) = shared_store(kind, config(&prefix)).await;
    let n = 2_500; // three script calls of at most 1,000
    let keys = new_keys("b", n);
    let (first, second) = (owners(n), owners(n));
    let at = Utc::now();

    let outcomes = store.claim(&claims_of(&keys, at, &first)).await.unwrap();
    assert!(outcomes.iter().all(|o| *o == ClaimOutcome::Claimed));

    let retried = store.claim(&claims_of(&keys, at, &first)).await.unwrap();
    assert!(
        retried.iter().all(|o| *o == ClaimOutcome::Mine),
        "same owner is a retry"
    );

    let repeated = store.claim(&claims_of(&keys, at, &second)).await.unwrap();
    for (outcome, owner) in repeated.iter().zip(&first) {
        assert_eq!(
            *outcome,
            ClaimOutcome::Duplicate {
                owner: *owner,
                confirmed: false
            }
        );
    }

    let confirmed = store.confirm(&claims_of(&keys, at, &first)).await.unwrap();
    assert!(confirmed.iter().all(|o| *o == ConfirmOutcome::Confirmed));
    let repeated = store.claim(&claims_of(&keys, at, &second)).await.unwrap();
    assert!(repeated.iter().zip(&first).all(|(o, owner)| *o
        == ClaimOutcome::Duplicate {
            owner: *owner,
            confirmed: true
        }));
    // A confirmed claim stays confirmed when its owner claims again.
    assert!(store
        .claim(&claims_of(&keys[..10], at, &first[..10]))
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ClaimOutcome::Mine));
    assert!(store
        .claim(&claims_of(&keys[..10], at, &second[..10]))
        .await
        .unwrap()
        .iter()
        .all(|o| matches!(
            o,
            ClaimOutcome::Duplicate {
                confirmed: true,
                ..
            }
        )));

    // The same key twice in one batch: the first claim wins, the second sees it.
    let fresh = new_keys("b", 1)[0];
    let (x, y) = (new_owner(), new_owner());
    let mixed = vec![
        claim(fresh, at, x),
        claim(fresh, at, y),
        claim(fresh, at, x),
        claim(keys[0], at, x),
    ];
    assert_eq!(
        store.claim(&mixed).await.unwrap(),
        vec![
            ClaimOutcome::Claimed,
            ClaimOutcome::Duplicate {
                owner: x,
                confirmed: false
            },
            ClaimOutcome::Mine,
            ClaimOutcome::Duplicate {
                owner: first[0],
                confirmed: true
            },
        ]
    );

    // Claims far from the router's clock are refused as a whole batch.
    let skewed = store
        .claim(&[claim(fresh, at + chrono::Duration::minutes(5), y)])
        .await;
    assert!(matches!(
        skewed,
        Err(spindle::router::dedup::DedupError::Skewed { index: 0, .. })
    ));
    assert!(store.claim(&[]).await.unwrap().is_empty());
    inspect.cleanup(&prefix).await;
}

async fn duplicates_are_found_across_slots_within_the_window_and_not_beyond(kind: Kind) {
    let prefix = unique_prefix("window");
    let (store, inspect) = shared_store(kind, config(&prefix)).await; // window 2 s = 2 slots of 1 s
    let t0 = slot_aligned(0);
    let cases: [(i64, bool); 8] = [
        (0, true),
        (999, true),    // same slot
        (1_500, true),  // next slot
        (2_000, true),  // exactly the window, two slots on
        (2_998, true),  // beyond the window but within window + slot: still two slots on
        (-1_900, true), // an earlier own time claimed later is found too
        (3_000, false), // three slots on: never
        (-3_000, false),
    ];
    let keys = new_keys("w", cases.len());
    let originals = owners(cases.len());
    let claimed = store
        .claim(&claims_of(&keys, t0, &originals))
        .await
        .unwrap();
    assert!(claimed.iter().all(|o| *o == ClaimOutcome::Claimed));
    for (i, (offset, duplicate)) in cases.iter().enumerate() {
        let at = t0 + chrono::Duration::milliseconds(*offset);
        let outcome = store
            .claim(&[claim(keys[i], at, new_owner())])
            .await
            .unwrap()[0];
        let expected = if *duplicate {
            ClaimOutcome::Duplicate {
                owner: originals[i],
                confirmed: false,
            }
        } else {
            ClaimOutcome::Claimed
        };
        assert_eq!(outcome, expected, "repeat {offset} ms after the original");
    }

    // The same in one batch: several slot ranges (and runs sharing hashes) in one script call.
    let keys = new_keys("w", 400);
    let originals = owners(keys.len());
    store
        .claim(&claims_of(&keys, t0, &originals))
        .await
        .unwrap();
    let repeats: Vec<Claim> = keys
        .iter()
        .enumerate()
        .map(|(i, &key)| Claim {
            key,
            at: t0 + chrono::Duration::milliseconds(cases[i % cases.len()].0),
            owner: new_owner(),
        })
        .collect();
    let outcomes = store.claim(&repeats).await.unwrap();
    for (i, outcome) in outcomes.iter().enumerate() {
        let expected = if cases[i % cases.len()].1 {
            ClaimOutcome::Duplicate {
                owner: originals[i],
                confirmed: false,
            }
        } else {
            ClaimOutcome::Claimed
        };
        assert_eq!(*outcome, expected, "key {i} in one batch");
    }
    inspect.cleanup(&prefix).await;
}

/// One claim.
fn claim(key: DedupKey, at: DateTime<Utc>, owner: JobId) -> Claim {
    Claim { key, at, owner }
}

/// Whether the key's pending entry in the slot of `at` has passed its deadline (the store's
/// clock).
async fn deadline_passed(
    inspect: &Inspect,
    prefix: &str,
    key: &DedupKey,
    at: DateTime<Utc>,
) -> bool {
    let (stored, now) = inspect.entry(prefix, key, at).await;
    let (_, deadline) = stored.expect("entry present until someone meets it");
    now > deadline.expect("a pending entry")
}

async fn a_pending_claim_expires_and_frees_the_key(kind: Kind) {
    let prefix = unique_prefix("pending");
    let mut cfg = config(&prefix);
    cfg.pending_ttl = Duration::from_millis(400);
    let (store, inspect) = shared_store(kind, cfg).await;
    let [abandoned, restored] = new_keys("p", 2)[..] else {
        unreachable!()
    };
    let at = Utc::now();
    let [a, b, c, d, e] = [(); 5].map(|_| new_owner());
    let pending = |owner| ClaimOutcome::Duplicate {
        owner,
        confirmed: false,
    };

    let claimed_at = Instant::now();
    let outcomes = store.claim(&[claim(abandoned, at, a)]).await.unwrap();
    assert_eq!(outcomes, vec![ClaimOutcome::Claimed]);
    let outcomes = store.claim(&[claim(abandoned, at, b)]).await.unwrap();
    assert_eq!(outcomes, vec![pending(a)]);
    assert_eq!(
        &inspect.entry(&prefix, &abandoned, at).await.0.unwrap().0,
        &a.to_bytes()[..]
    );

    // A's job never persists: once the pending TTL passes, a claim reports A's claim as lapsed
    // and leaves it in place (A's job might have been stored by a router that died before
    // confirming); once the caller has checked it was not, a take-over frees the key. One batch
    // meets the lapsed entry, takes the key for B, and sees B's claim for the repeats.
    wait_for(
        Duration::from_secs(5),
        "the pending deadline to pass",
        || deadline_passed(&inspect, &prefix, &abandoned, at),
    )
    .await;
    assert!(claimed_at.elapsed() >= Duration::from_millis(390));
    assert_eq!(
        store.claim(&[claim(abandoned, at, b)]).await.unwrap(),
        vec![ClaimOutcome::Lapsed { owner: a }]
    );
    assert_eq!(
        &inspect.entry(&prefix, &abandoned, at).await.0.unwrap().0,
        &a.to_bytes()[..],
        "a plain claim leaves a lapsed entry in place"
    );
    let batch = [
        claim(abandoned, at, b),
        claim(abandoned, at, e),
        claim(abandoned, at, b),
    ];
    assert_eq!(
        store.take_over(&batch).await.unwrap(),
        vec![ClaimOutcome::Claimed, pending(b), ClaimOutcome::Mine]
    );
    // A's late confirmation learns that its job is a duplicate.
    let confirmed = store.confirm(&[claim(abandoned, at, a)]).await.unwrap();
    assert_eq!(confirmed, vec![ConfirmOutcome::Lost { owner: b }]);
    let confirmed = store.confirm(&[claim(abandoned, at, b)]).await.unwrap();
    assert_eq!(confirmed, vec![ConfirmOutcome::Confirmed]);

    // A confirmation after the claim expired, with nobody else on the key, restores it.
    store.claim(&[claim(restored, at, c)]).await.unwrap();
    wait_for(
        Duration::from_secs(5),
        "the pending deadline to pass",
        || deadline_passed(&inspect, &prefix, &restored, at),
    )
    .await;
    let confirmed = store.confirm(&[claim(restored, at, c)]).await.unwrap();
    assert_eq!(confirmed, vec![ConfirmOutcome::Restored]);
    assert_eq!(
        inspect.entry(&prefix, &restored, at).await.0.unwrap(),
        (c.to_bytes(), None),
        "restored as confirmed"
    );
    let outcomes = store.claim(&[claim(restored, at, d)]).await.unwrap();
    assert_eq!(
        outcomes,
        vec![ClaimOutcome::Duplicate {
            owner: c,
            confirmed: true
        }]
    );
    inspect.cleanup(&prefix).await;
}

async fn a_confirmation_later_than_the_skew_is_accepted(kind: Kind) {
    let prefix = unique_prefix("late");
    let (store, inspect) = shared_store(
        kind,
        DedupConfig {
            max_skew: Duration::from_millis(100),
            ..config(&prefix)
        },
    )
    .await;
    let key = new_keys("l", 1)[0];
    let (owner, other) = (new_owner(), new_owner());
    let at = Utc::now();
    store.claim(&[Claim { key, at, owner }]).await.unwrap();
    // The job took longer to persist than the skew allows a new claim's time to be old.
    wait_for(
        Duration::from_secs(5),
        "the claim time to be stale",
        || async { Utc::now() > at + chrono::Duration::milliseconds(300) },
    )
    .await;
    assert!(
        store.claim(&[Claim { key, at, owner }]).await.is_err(),
        "stale claim refused"
    );
    assert_eq!(
        store.confirm(&[Claim { key, at, owner }]).await.unwrap(),
        vec![ConfirmOutcome::Confirmed]
    );
    let outcomes = store.claim(&[claim(key, Utc::now(), other)]).await.unwrap();
    let expected = ClaimOutcome::Duplicate {
        owner,
        confirmed: true,
    };
    assert_eq!(outcomes, vec![expected]);
    inspect.cleanup(&prefix).await;
}

async fn only_the_owner_releases_a_claim(kind: Kind) {
    let prefix = unique_prefix("release");
    let (store, inspect) = shared_store(kind, config(&prefix)).await;
    let n = 50;
    let keys = new_keys("r", n);
    let (holders, strangers, later) = (owners(n), owners(n), owners(n));
    let at = Utc::now();
    store.claim(&claims_of(&keys, at, &holders)).await.unwrap();

    let refused = store
        .release(&claims_of(&keys, at, &strangers))
        .await
        .unwrap();
    assert!(refused.iter().all(|r| !r), "a stranger released a claim");
    assert!(store
        .claim(&claims_of(&keys, at, &later))
        .await
        .unwrap()
        .iter()
        .all(|o| matches!(o, ClaimOutcome::Duplicate { .. })));

    let released = store
        .release(&claims_of(&keys, at, &holders))
        .await
        .unwrap();
    assert!(released.iter().all(|r| *r));
    assert_eq!(inspect.fields(&prefix).await, 0);
    assert!(store
        .claim(&claims_of(&keys, at, &later))
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ClaimOutcome::Claimed));
    let again = store
        .release(&claims_of(&keys, at, &holders))
        .await
        .unwrap();
    assert!(again.iter().all(|r| !r), "released twice");
    inspect.cleanup(&prefix).await;
}

async fn hashes_expire_with_the_window(kind: Kind) {
    let prefix = unique_prefix("expire");
    let cfg = DedupConfig {
        window: Duration::from_secs(1),
        slots_per_window: 1,
        max_skew: Duration::from_millis(200),
        ..config(&prefix)
    };
    let (store, inspect) = shared_store(kind, cfg).await;
    let n = 300;
    let keys = new_keys("e", n);
    store
        .claim(&claims_of(&keys, Utc::now(), &owners(n)))
        .await
        .unwrap();
    let stored = inspect.ttls(&prefix).await;
    assert!(!stored.is_empty());
    // Each hash lives until its slot's end + window + 2 × skew: at most 2.4 s from now.
    for (key, ttl) in &stored {
        assert!((1..=2_400).contains(ttl), "{key} has ttl {ttl} ms");
    }
    match &inspect {
        Inspect::Redis(url) => {
            let mut conn = connection(url).await;
            let encoding: String = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(&stored[0].0)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(encoding, "listpack", "small hashes stay compact");
            wait_for(Duration::from_secs(10), "every hash to expire", || async {
                redis_keys(url, &prefix).await.is_empty()
            })
            .await;
        }
        Inspect::Memory(memory) => {
            assert_eq!(memory.held_entries(&prefix), n);
            wait_for(Duration::from_secs(10), "every slot to expire", || async {
                memory.live_entries(&prefix) == 0
            })
            .await;
            // Expired slots are dropped by the store's own sweep (at most a second apart, run
            // by the calls), so memory stays bounded by the window.
            let idle = claims_of(&new_keys("e", 1), Utc::now(), &owners(1));
            wait_for(
                Duration::from_secs(5),
                "the expired slots to be dropped",
                || async {
                    store.release(&idle).await.unwrap();
                    memory.held_entries(&prefix) == 0
                },
            )
            .await;
        }
    }
}

/// Stores named `r0`, `r1`, …: private Redis servers, or in-process stores of this call alone.
async fn private_stores(kind: Kind, n: usize) -> (Vec<PrivateRedis>, Vec<StoreSpec>, Vec<Inspect>) {
    let mut servers = Vec::new();
    let mut specs = Vec::new();
    let mut inspects = Vec::new();
    let tag = ulid::Ulid::new();
    for i in 0..n {
        let id = format!("r{i}");
        match kind {
            Kind::Redis => {
                let server = PrivateRedis::start(&[]).await;
                specs.push(StoreSpec {
                    id,
                    url: server.url(),
                });
                inspects.push(Inspect::Redis(server.url()));
                servers.push(server);
            }
            Kind::Memory => {
                let name = format!("{tag}-r{i}");
                inspects.push(Inspect::Memory(MemoryStore::named(&name)));
                specs.push(StoreSpec {
                    id,
                    url: format!("{}{name}", MemoryStore::SCHEME),
                });
            }
        }
    }
    (servers, specs, inspects)
}
