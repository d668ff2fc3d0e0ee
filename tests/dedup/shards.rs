//! Stores side by side: three shards split the keys, a placement change over two stores lets
//! no duplicate through (nor do claims racing across it), and concurrent creators in Consul get
//! the same placement.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use spindle::router::dedup::{ClaimOutcome, DedupConfig, DedupStore};
use spindle::router::placement::{Placement, PlacementManager, PlacementSettings};

use crate::common::redis_server::PrivateRedis;
use crate::common::{wait_for, ConsulUnderTest};
use crate::{claims_of, config, new_keys, owners, private_stores, settings, Inspect, Kind};

on_both_backends!(
    three_shards_split_the_keys,
    a_placement_change_never_lets_a_duplicate_through,
    racing_claims_across_a_placement_change_admit_exactly_one,
);

async fn three_shards_split_the_keys(kind: Kind) {
    let (servers, specs, inspects) = private_stores(kind, 3).await;
    let prefix = "sd3:";
    let placements = Arc::new(PlacementManager::in_memory(PlacementSettings::default()));
    placements
        .bootstrap(specs.iter().map(|s| s.id.clone()).collect(), 1024)
        .await
        .unwrap();
    let store = DedupStore::connect(config(prefix), specs, placements)
        .await
        .unwrap();
    let n = 3_000;
    let keys = new_keys("s", n);
    let (first, second) = (owners(n), owners(n));
    let at = Utc::now();
    assert!(store
        .claim(&claims_of(&keys, at, &first))
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ClaimOutcome::Claimed));
    let mut total = 0;
    for inspect in &inspects {
        let here = inspect.fields(prefix).await;
        assert!((700..1300).contains(&here), "{here} of {n} on one shard");
        total += here;
    }
    assert_eq!(total, n, "each key stored once");
    let repeated = store.claim(&claims_of(&keys, at, &second)).await.unwrap();
    assert!(repeated.iter().zip(&first).all(|(o, owner)| *o
        == ClaimOutcome::Duplicate {
            owner: *owner,
            confirmed: false
        }));
    drop(servers);
}

/// Two routers (each its own placement cache) over one Consul and two private stores.
struct ChangeRig {
    consul: ConsulUnderTest,
    _servers: Vec<PrivateRedis>,
    stores: Vec<Inspect>,
    routers: Vec<DedupStore>,
}

const CHANGE_PREFIX: &str = "sdc:";

impl ChangeRig {
    async fn start(kind: Kind) -> ChangeRig {
        let consul = ConsulUnderTest::start().await;
        let (servers, specs, stores) = private_stores(kind, 2).await;
        // 1 s slots; a layout change takes effect at least 4.5 s ahead (more than 2 × skew).
        let config = DedupConfig {
            window: Duration::from_secs(6),
            slots_per_window: 6,
            max_skew: Duration::from_secs(2),
            max_batch: 50,
            ..config(CHANGE_PREFIX)
        };
        let mut routers = Vec::new();
        for _ in 0..2 {
            let placements = Arc::new(PlacementManager::consul(
                consul.client.clone(),
                settings(
                    &consul.key("placements"),
                    Duration::from_millis(500),
                    Duration::from_millis(4_500),
                ),
            ));
            placements
                .bootstrap(vec!["r0".to_owned()], 1024)
                .await
                .unwrap();
            routers.push(
                DedupStore::connect(config.clone(), specs.clone(), placements)
                    .await
                    .unwrap(),
            );
        }
        ChangeRig {
            consul,
            stores,
            _servers: servers,
            routers,
        }
    }

    /// Adds store r1; returns the start of the first slot under the new placement, once the
    /// clock is within half a second of it (claims must be within 2 s of the clock).
    async fn add_store(&self) -> DateTime<Utc> {
        let layout = self.routers[0]
            .placements()
            .propose(vec!["r0".to_owned(), "r1".to_owned()], vec![])
            .await
            .unwrap();
        let from = layout.effective_from.timestamp_millis();
        let switch = Utc
            .timestamp_millis_opt(from + (1_000 - from.rem_euclid(1_000)) % 1_000)
            .unwrap();
        assert!(switch > Utc::now() + chrono::Duration::seconds(4));
        wait_for(
            Duration::from_secs(15),
            "the change to come near",
            || async { Utc::now() >= switch - chrono::Duration::milliseconds(500) },
        )
        .await;
        switch
    }
}

async fn a_placement_change_never_lets_a_duplicate_through(kind: Kind) {
    let rig = ChangeRig::start(kind).await;
    let router = &rig.routers[0];
    let n = 1_000;
    let keys = new_keys("c", n);
    let originals = owners(n);
    let t0 = Utc::now();
    let before = router.placements().placement_at(t0).await.unwrap();
    assert_eq!(before.stores, vec!["r0".to_owned()]);
    assert!(router
        .claim(&claims_of(&keys, t0, &originals))
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ClaimOutcome::Claimed));
    assert_eq!(rig.stores[1].fields(CHANGE_PREFIX).await, 0);

    let switch = rig.add_store().await;
    // The issued placement of t0 is untouched; the new one has just started.
    assert_eq!(router.placements().placement_at(t0).await.unwrap(), before);
    let after = router.placements().placement_at(switch).await.unwrap();
    assert_eq!(after.stores, vec!["r0".to_owned(), "r1".to_owned()]);
    assert!(after.layout_generation > before.layout_generation);

    // Repeats whose own time falls under the new placement still find the originals, through
    // the other router too (its own cache, same Consul).
    let t1 = switch + chrono::Duration::milliseconds(100);
    for router in &rig.routers {
        let repeats = router
            .claim(&claims_of(&keys, t1, &owners(n)))
            .await
            .unwrap();
        for (outcome, owner) in repeats.iter().zip(&originals) {
            assert_eq!(
                *outcome,
                ClaimOutcome::Duplicate {
                    owner: *owner,
                    confirmed: false
                }
            );
        }
    }
    // New keys under the new placement spread over both stores.
    let fresh = new_keys("c", n);
    assert!(router
        .claim(&claims_of(&fresh, t1, &owners(n)))
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ClaimOutcome::Claimed));
    let on_r1 = rig.stores[1].fields(CHANGE_PREFIX).await;
    assert!(
        (200..800).contains(&on_r1),
        "{on_r1} of {n} new keys on the new store"
    );
    rig.consul.stop().await;
}

async fn racing_claims_across_a_placement_change_admit_exactly_one(kind: Kind) {
    let rig = ChangeRig::start(kind).await;
    let switch = rig.add_store().await;
    // Router 0 claims with an own time in the last slot before the change (all on r0),
    // router 1 with one in the first slot after it (half the keys' logical shards on r1).
    let before = switch - chrono::Duration::milliseconds(500);
    let after = switch + chrono::Duration::milliseconds(500);
    let n = 2_000;
    let keys = new_keys("race", n);
    let (mine, theirs) = (owners(n), owners(n));
    // One call each, racing: 40 script calls of 50 claims per router, 8 in flight at a time.
    let (ca, cb) = (
        claims_of(&keys, before, &mine),
        claims_of(&keys, after, &theirs),
    );
    let (ra, rb) = tokio::join!(rig.routers[0].claim(&ca), rig.routers[1].claim(&cb));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    for i in 0..n {
        match (ra[i], rb[i]) {
            (ClaimOutcome::Claimed, ClaimOutcome::Duplicate { owner, .. }) => {
                assert_eq!(owner, mine[i])
            }
            (ClaimOutcome::Duplicate { owner, .. }, ClaimOutcome::Claimed) => {
                assert_eq!(owner, theirs[i])
            }
            other => panic!("key {i}: {other:?}"),
        }
    }
    let placement = rig.routers[1]
        .placements()
        .placement_at(after)
        .await
        .unwrap();
    let moved = keys
        .iter()
        .filter(|key| placement.store_of(key.logical_shard(1024)) == "r1")
        .count();
    assert!(
        moved > n / 4,
        "only {moved} keys changed store: the race is not exercised"
    );
    rig.consul.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creators_get_the_same_placement() {
    let consul = ConsulUnderTest::start().await;
    let prefix = consul.key("placements");
    let managers: Vec<Arc<PlacementManager>> = (0..2)
        .map(|_| {
            Arc::new(PlacementManager::consul(
                consul.client.clone(),
                settings(&prefix, Duration::from_secs(60), Duration::from_secs(60)),
            ))
        })
        .collect();

    // Bootstrap race: different store lists, one winner.
    let (x, y) = tokio::join!(
        managers[0].bootstrap(vec!["a".to_owned()], 64),
        managers[1].bootstrap(vec!["b".to_owned()], 64)
    );
    assert_eq!(x.unwrap(), y.unwrap());

    // Issue race: 16 creators, two different candidates for one epoch, one winner.
    let record = managers[0].layout().await.unwrap().unwrap();
    let epoch = managers[0]
        .epoch_of_ms(Utc::now().timestamp_millis())
        .await
        .unwrap()
        + 10;
    let mut candidates = Vec::new();
    for stores in [["a"], ["b"]] {
        let mut layout = record.current.clone();
        layout.stores = stores.iter().map(|s| s.to_string()).collect();
        candidates.push(Placement::build(epoch, record.period_ms, &layout).unwrap());
    }
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let manager = managers[i % 2].clone();
            let candidate = candidates[i / 2 % 2].clone();
            tokio::spawn(async move { manager.issue(candidate).await.unwrap() })
        })
        .collect();
    let mut issued = Vec::new();
    for task in tasks {
        issued.push(task.await.unwrap());
    }
    assert!(issued.windows(2).all(|w| w[0] == w[1]), "creators disagree");

    // get-or-create race over several epochs from both managers.
    let base = Utc::now();
    let lookups: Vec<_> = (0..20)
        .map(|i| {
            let manager = managers[i % 2].clone();
            let at = base + chrono::Duration::minutes((i / 2) as i64 + 20);
            tokio::spawn(async move { (i / 2, manager.placement_at(at).await.unwrap()) })
        })
        .collect();
    let mut by_epoch: HashMap<usize, Arc<Placement>> = HashMap::new();
    for task in lookups {
        let (slot, placement) = task.await.unwrap();
        if let Some(seen) = by_epoch.get(&slot) {
            assert_eq!(*seen, placement, "two placements for one epoch");
        }
        by_epoch.insert(slot, placement);
    }
    consul.stop().await;
}
