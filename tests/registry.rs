//! The registry conformance suite: the Consul client and the lock recipe against the in-repo
//! Consul double, or against a real Consul when `CONSUL_HTTP_ADDR` is set (then the cases that
//! need fault hooks are skipped).

mod common;

use std::time::{Duration, Instant};

use common::*;
use spindle::registry::catalog;
use spindle::registry::consul::{Put, ReadOptions};
use spindle::registry::inventory::{Inventory, JobDbRecord, JobDbState};
use spindle::registry::lease::{consul_lock, LockTiming};

/// The entry stored at `key` (it must exist).
async fn stored(c: &ConsulUnderTest, key: &str) -> spindle::registry::consul::KvEntry {
    c.client
        .kv_get(key, ReadOptions::default())
        .await
        .unwrap()
        .value
        .expect("key exists")
}

fn timing(c: &ConsulUnderTest) -> LockTiming {
    LockTiming {
        ttl: c.ttl,
        lock_delay: Duration::from_millis(500),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_check_and_set_and_blocking_reads() {
    let c = ConsulUnderTest::start().await;
    let key = c.key("cas");
    assert!(
        c.client.kv_put(&key, b"one", Put::Cas(0)).await.unwrap(),
        "create if absent"
    );
    assert!(
        !c.client.kv_put(&key, b"two", Put::Cas(0)).await.unwrap(),
        "cas=0 refuses an existing key"
    );
    let read = c.client.kv_get(&key, ReadOptions::default()).await.unwrap();
    let entry = read.value.unwrap();
    assert_eq!(entry.value, b"one");
    assert!(read.index >= 1);
    assert!(c
        .client
        .kv_put(&key, b"two", Put::Cas(entry.modify_index))
        .await
        .unwrap());
    assert!(
        !c.client
            .kv_put(&key, b"three", Put::Cas(entry.modify_index))
            .await
            .unwrap(),
        "stale cas refused"
    );

    // A blocking read returns when the key changes, not before.
    let now = c.client.kv_get(&key, ReadOptions::default()).await.unwrap();
    let (client, k) = (c.client.clone(), key.clone());
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.kv_put(&k, b"four", Put::Set).await.unwrap();
    });
    let started = Instant::now();
    let woke = c
        .client
        .kv_get(
            &key,
            ReadOptions {
                index: now.index,
                wait: Some(Duration::from_secs(10)),
                consistent: false,
            },
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "returned before the write"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "did not wake on the write"
    );
    assert_eq!(woke.value.unwrap().value, b"four");
    assert!(woke.index > now.index);
    writer.await.unwrap();

    // A missing key reads as None with an index to block on.
    let missing = c
        .client
        .kv_get(&c.key("missing"), ReadOptions::default())
        .await
        .unwrap();
    assert!(missing.value.is_none() && missing.index >= 1);
    assert!(c.client.kv_delete(&key, None).await.unwrap());
    assert!(c
        .client
        .kv_get(&key, ReadOptions::default())
        .await
        .unwrap()
        .value
        .is_none());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_exclusive_and_tokens_rise_with_every_grant() {
    let c = ConsulUnderTest::start().await;
    let key = c.key("lock");
    let first = consul_lock(&c.client, &key, b"a", "test", timing(&c))
        .await
        .unwrap()
        .expect("free lock");
    assert!(
        consul_lock(&c.client, &key, b"b", "test", timing(&c))
            .await
            .unwrap()
            .is_none(),
        "held lock refused"
    );
    let t1 = first.token.unwrap();
    first.release().await;
    // Released (not expired): no lock-delay, the next grant succeeds at once with a higher token.
    let second = consul_lock(&c.client, &key, b"b", "test", timing(&c))
        .await
        .unwrap()
        .expect("released lock");
    let t2 = second.token.unwrap();
    assert!(t2 > t1, "token {t2} after {t1}");
    let entry = stored(&c, &key).await;
    assert_eq!(entry.value, b"b");
    assert!(entry.session.is_some());
    second.release().await;
    let entry = stored(&c, &key).await;
    assert!(
        entry.session.is_none(),
        "release leaves the key unlocked, not deleted"
    );
    c.stop().await;
}

/// Waits for `lost` and returns how long it took.
async fn time_to_loss(lease: &spindle::registry::lease::Lease, limit: Duration) -> Duration {
    let started = Instant::now();
    tokio::time::timeout(limit, lease.lost.cancelled())
        .await
        .expect("lease not declared lost in time");
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_renew_consul_errors_or_stalls_lose_the_lease_within_the_ttl() {
    let c = ConsulUnderTest::start().await;
    let Some(double) = &c.double else {
        return c.stop().await;
    };
    let faults: [(&str, &dyn Fn()); 3] = [
        ("renew-404", &|| double.faults().set_renew_fails(true)),
        ("500s", &|| double.faults().set_error_500(true)),
        ("stall", &|| double.faults().stall(c.ttl * 3)),
    ];
    for (fault, apply) in faults {
        let lease = consul_lock(&c.client, &c.key(fault), b"x", "test", timing(&c))
            .await
            .unwrap()
            .unwrap();
        apply();
        let took = time_to_loss(&lease, c.ttl * 2).await;
        assert!(
            took <= c.ttl + Duration::from_millis(200),
            "{fault}: lost after {took:?}"
        );
        lease.release().await;
        double.faults().clear();
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_noticed_and_its_key_waits_out_the_lock_delay() {
    let c = ConsulUnderTest::start().await;
    let Some(double) = &c.double else {
        return c.stop().await;
    };
    let key = c.key("expire");
    let lease = consul_lock(&c.client, &key, b"x", "test", timing(&c))
        .await
        .unwrap()
        .unwrap();
    let session = stored(&c, &key).await.session.unwrap();
    assert!(double.expire_session(&session));
    // The key watch sees the session gone well before any renew deadline.
    let took = time_to_loss(&lease, c.ttl * 2).await;
    assert!(took < c.ttl, "noticed after {took:?}");
    // Lock-delay: nobody may take the key for 500 ms after an invalidation.
    assert!(consul_lock(&c.client, &key, b"y", "test", timing(&c))
        .await
        .unwrap()
        .is_none());
    let mut retaken = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Some(l) = consul_lock(&c.client, &key, b"y", "test", timing(&c))
            .await
            .unwrap()
        {
            retaken = Some(l);
            break;
        }
    }
    let retaken = retaken.expect("free after the lock-delay");
    assert!(retaken.token.unwrap() > lease.token.unwrap());
    retaken.release().await;
    lease.release().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directors_register_and_deregister_in_the_catalog() {
    let c = ConsulUnderTest::start().await;
    let id = format!(
        "spindle-director-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    let (readiness, ready) = tokio::sync::watch::channel(None::<String>);
    let registration = catalog::register_director(
        &c.client,
        &id,
        "127.0.0.1",
        8123,
        "jobdb_x",
        Duration::from_secs(10),
        ready,
    )
    .await
    .unwrap();
    let healthy = catalog::healthy_directors(&c.client).await.unwrap();
    let me = healthy
        .iter()
        .find(|i| i.id == id)
        .expect("registered and passing");
    assert_eq!((me.address.as_str(), me.port), ("127.0.0.1", 8123));
    assert_eq!(me.meta.get("jobdb").map(String::as_str), Some("jobdb_x"));
    // Not ready: the check turns critical at once (not at the next heartbeat, 3.3 s away),
    // and passes again as soon as the Director is ready again.
    let listed = || async {
        catalog::healthy_directors(&c.client)
            .await
            .unwrap()
            .iter()
            .any(|i| i.id == id)
    };
    readiness.send_replace(Some("writer: the jobdb cannot be written".into()));
    wait_for(Duration::from_secs(2), "the check critical", || async {
        !listed().await
    })
    .await;
    readiness.send_replace(None);
    wait_for(Duration::from_secs(2), "the check passing again", listed).await;
    registration.deregister().await;
    let healthy = catalog::healthy_directors(&c.client).await.unwrap();
    assert!(healthy.iter().all(|i| i.id != id));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_offers_orphans_first_then_spares() {
    let c = ConsulUnderTest::start().await;
    if c.double.is_none() {
        // The inventory lives at fixed keys; do not touch a real cluster's.
        return c.stop().await;
    }
    let inventory = Inventory::new(c.client.clone());
    let record = |name: &str, state| JobDbRecord {
        name: name.to_owned(),
        url: format!("mysql://root@127.0.0.1:3306/{name}"),
        state,
        changed_at: chrono::Utc::now(),
        changed_by: "test".to_owned(),
    };
    assert!(inventory
        .add(&record("spare_a", JobDbState::Spare))
        .await
        .unwrap());
    assert!(inventory
        .add(&record("active_b", JobDbState::Active))
        .await
        .unwrap());
    assert!(inventory
        .add(&record("retiring_c", JobDbState::Retiring))
        .await
        .unwrap());
    assert!(
        !inventory
            .add(&record("spare_a", JobDbState::Spare))
            .await
            .unwrap(),
        "names are unique"
    );
    assert!(inventory
        .add(&record("Bad-Name", JobDbState::Spare))
        .await
        .is_err());

    let names = |list: Vec<spindle::registry::inventory::Listed>| {
        list.into_iter().map(|l| l.record.name).collect::<Vec<_>>()
    };
    assert_eq!(
        names(inventory.candidates().await.unwrap()),
        vec!["active_b", "spare_a"]
    );
    let held = consul_lock(
        &c.client,
        &Inventory::lock_key("active_b"),
        b"d",
        "test",
        timing(&c),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        names(inventory.candidates().await.unwrap()),
        vec!["spare_a"],
        "a held jobdb is no candidate"
    );

    let listed = inventory
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.record.name == "spare_a")
        .unwrap();
    assert!(inventory
        .set_state(&listed, JobDbState::Active, "test")
        .await
        .unwrap());
    assert!(
        !inventory
            .set_state(&listed, JobDbState::Retiring, "test")
            .await
            .unwrap(),
        "stale update refused"
    );
    held.release().await;
    c.stop().await;
}
