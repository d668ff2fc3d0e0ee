//! Events through routers: each key's event published once across router crashes, a lapsed
//! claim settled whatever became of its JobDB (retired, drained, dropped), and an event
//! refused for its content answered so.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::cluster::Cluster;
use crate::common::*;
use crate::ONE_AT_A_TIME;

/// `POST /v1/events` through routers, with a router crashing (a test fault: abort, as a
/// kill -9) right after claiming an event's key and another right after its jobs were stored
/// but before the key was confirmed: every key's event is stored once, with one job per
/// matching subscription, and every answer for the key names that event; a repeat is answered
/// `duplicate` with the event's jobs; each subscription gets each of its events once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_published_once_through_router_crashes() {
    use spindle_client::{Client, NewEvent, NewSubscription, PayloadFilter, PublishReply};
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::builder("rev")
        .jobdbs(2)
        .directors(2)
        .service_ttl_ms(2000)
        .redis(None)
        .router(2)
        .control()
        .start()
        .await;
    let api = Client::new(&cluster.router_base(), None).unwrap();
    let capture = |name: &str| cluster.sink.url(&format!("/capture?s={name}"));
    let all_orders = NewSubscription::new("shop", capture("all"), ["order.*"]);
    let paid_in_order = NewSubscription {
        ordering_key: Some("/customer".into()),
        ..NewSubscription::new("shop", capture("paid"), ["order.paid"])
    };
    let gold = NewSubscription {
        filter: Some(PayloadFilter {
            pointer: "/tier".into(),
            equals: json!("gold"),
        }),
        ..NewSubscription::new("shop", capture("gold"), ["*"])
    };
    // Published at once: a Director that has not read a subscription yet holds its jobs
    // rather than send them without its signature.
    let mut secrets = HashMap::new();
    // Two through the router, one through a Director: the router's cache reads the third
    // from the control database within two seconds.
    let director = Client::new(&cluster.directors[0].base(), None).unwrap();
    for (i, s) in [all_orders, paid_in_order, gold].into_iter().enumerate() {
        let via = if i == 2 { &director } else { &api };
        let added = via.add_subscription(&s).await.unwrap();
        let secret = added.secret.unwrap().parse().unwrap();
        secrets.insert(added.id, secret);
    }
    let seen = Instant::now();
    wait_for(
        Duration::from_secs(2),
        "the router sees all three",
        || async {
            api.subscriptions(Some("shop"))
                .await
                .is_ok_and(|l| l.subscriptions.len() == 3)
        },
    )
    .await;
    println!(
        "a subscription made at a Director reached the router in {} ms",
        seen.elapsed().as_millis()
    );
    let event = |n: usize, key: &str| {
        let tier = if n.is_multiple_of(2) {
            "gold"
        } else {
            "silver"
        };
        order_paid(
            key,
            json!({"n": n, "customer": format!("c{}", n % 3), "tier": tier}),
        )
    };
    // Publishes through `via` until it answers (503s and transport errors: again).
    let settle = |via: Client, event: NewEvent| async move {
        let started = Instant::now();
        loop {
            match via.publish(&event).await {
                Ok(reply) => return reply,
                Err(e) => {
                    assert!(
                        e.status().is_none_or(|s| s == 503 || s == 504),
                        "publish refused: {e}"
                    );
                    assert!(
                        started.elapsed() < Duration::from_secs(60),
                        "unsettled: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
    let sorted = |reply: &PublishReply| {
        let mut d: Vec<(String, String)> = reply
            .deliveries
            .iter()
            .map(|d| (d.subscription_id.clone(), d.job_id.clone()))
            .collect();
        d.sort();
        d
    };

    // Ten events, then five of their keys again.
    let mut answers: HashMap<String, Vec<PublishReply>> = HashMap::new();
    for n in 0..10 {
        let key = format!("k{n}");
        let reply = settle(api.clone(), event(n, &key)).await;
        assert!(!reply.duplicate);
        assert_eq!(
            reply.deliveries.len(),
            if n.is_multiple_of(2) { 3 } else { 2 }
        );
        answers.entry(key).or_default().push(reply);
    }
    for n in 0..5 {
        let key = format!("k{n}");
        let reply = settle(api.clone(), event(n, &key)).await;
        let first = &answers[&key][0];
        assert!(reply.duplicate, "{key}: a repeat is a duplicate");
        assert_eq!(reply.event_id, first.event_id, "{key}: the first event");
        assert_eq!(
            sorted(&reply),
            sorted(first),
            "{key}: the first event's jobs"
        );
        answers.entry(key).or_default().push(reply);
    }
    // An event no subscription wants is kept all the same: it has an id, a repeat of its key
    // names the same one, and a Director's JobDB holds it (with no job).
    let unwanted = spindle_client::NewEvent {
        bucket: "quiet".into(),
        ..order_paid("unwanted", json!({"n": 99}))
    };
    let kept = settle(api.clone(), unwanted.clone()).await;
    let kept_id = kept.event_id.clone().expect("a kept event has an id");
    assert!(kept.deliveries.is_empty() && !kept.duplicate);
    let again = settle(api.clone(), unwanted).await;
    assert!(again.duplicate && again.event_id.as_deref() == Some(kept_id.as_str()));
    let mut holders = 0;
    for d in &cluster.directors {
        let client = Client::new(&d.base(), None).unwrap();
        if let Ok(view) = client.event(&kept_id).await {
            assert!(view.deliveries.is_empty() && view.bucket == "quiet");
            holders += 1;
        }
    }
    assert_eq!(holders, 1, "one JobDB keeps the event");

    // A batch through the router: its new events stored together; a key published before is
    // answered `duplicate` with that event's jobs, and so is a key given twice in the batch.
    let quiet = spindle_client::NewEvent {
        bucket: "quiet".into(),
        ..order_paid("b-quiet", json!({"n": 98}))
    };
    let batch = vec![
        event(20, "b20"),
        event(21, "b21"),
        event(0, "k0"),
        event(20, "b20"),
        quiet,
    ];
    let reply = api.publish_batch(&batch).await.unwrap();
    let r = &reply.events;
    assert_eq!(r.len(), 5);
    assert!(!r[0].duplicate && r[0].deliveries.len() == 3, "{r:?}");
    assert!(!r[1].duplicate && r[1].deliveries.len() == 2, "{r:?}");
    assert!(r[2].duplicate && r[2].event_id == answers["k0"][0].event_id);
    assert_eq!(sorted(&r[2]), sorted(&answers["k0"][0]));
    assert!(r[3].duplicate && r[3].event_id == r[0].event_id);
    assert_eq!(sorted(&r[3]), sorted(&r[0]));
    assert!(r[4].event_id.is_some() && r[4].deliveries.is_empty());
    for (key, at) in [("b20", 0), ("b20", 3), ("b21", 1)] {
        answers
            .entry(key.to_owned())
            .or_default()
            .push(r[at].clone());
    }
    // Its events may make at most 1,000 jobs between them (one forward): refused whole.
    let big: Vec<spindle_client::NewEvent> =
        (0..450).map(|n| event(n, &format!("big{n}"))).collect();
    match api.publish_batch(&big).await {
        Err(e) => assert_eq!(e.status(), Some(413), "{e}"),
        Ok(reply) => panic!("{} events stored", reply.events.len()),
    }

    // A back-fill through two routers at once, and again: one job per event between them
    // (each (subscription, event) claims its back-fill key), delivered once each below.
    let late = api
        .add_subscription(&NewSubscription::new(
            "shop",
            capture("late"),
            ["order.refunded"],
        ))
        .await
        .unwrap();
    secrets.insert(
        late.id.clone(),
        late.secret.clone().unwrap().parse().unwrap(),
    );
    let mut second = cluster.spawn_router(2, &[]);
    cluster.wait_ready([&second]).await;
    let other = Client::new(&second.base(), None).unwrap();
    let past: Vec<spindle_client::PastEvent> = (0..5)
        .map(|n| spindle_client::PastEvent {
            event_id: ulid::Ulid::new().to_string(),
            event_type: "order.refunded".into(),
            timestamp: chrono::Utc::now(),
            data: serde_json::value::RawValue::from_string(
                json!({"n": 40 + n, "customer": "c9", "tier": "silver"}).to_string(),
            )
            .unwrap(),
        })
        .collect();
    let request = spindle_client::BackfillRequest { events: past };
    // Both routers' caches must know the new subscription (404 until then).
    let started = Instant::now();
    let mut made: Vec<spindle_client::BackfilledEvent> = Vec::new();
    loop {
        let (one, two) = futures::future::join(
            api.backfill(&late.id, &request),
            other.backfill(&late.id, &request),
        )
        .await;
        let mut unknown = false;
        for answer in [one, two] {
            match answer {
                Ok(reply) => made.extend(reply.deliveries),
                Err(e) if e.status() == Some(404) => unknown = true,
                Err(e) => panic!("back-fill through a router: {e}"),
            }
        }
        if !unknown || started.elapsed() > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let again = api.backfill(&late.id, &request).await.unwrap();
    assert_eq!(again.skipped, 5, "{again:?}");
    let events: std::collections::BTreeSet<&str> =
        made.iter().map(|d| d.event_id.as_str()).collect();
    assert!(
        made.len() == 5 && events.len() == 5,
        "one job per event: {made:?}"
    );
    let mut backfilled: Vec<PublishReply> = Vec::new();
    for d in &made {
        backfilled.push(PublishReply {
            event_id: Some(d.event_id.clone()),
            transaction_id: None,
            deliveries: vec![spindle_client::EventDelivery {
                subscription_id: late.id.clone(),
                job_id: d.job_id.clone(),
            }],
            duplicate: false,
        });
    }
    for reply in backfilled {
        let event = reply.event_id.clone().unwrap();
        answers.insert(format!("backfill:{event}"), vec![reply]);
    }
    second.kill9().await;

    // Its metrics count events apart from jobs: ten stored with their 25 jobs, five repeats.
    let text = metrics_text(&cluster.client, &cluster.router_base()).await;
    let events = |result: &str| {
        metric_value(
            &text,
            &format!("spindle_router_events_total{{result=\"{result}\"}}"),
        )
    };
    assert!(
        events("stored") >= 10.0 && events("stored") + events("duplicate") >= 15.0,
        "{text}"
    );
    assert!(
        metric_value(&text, "spindle_router_event_jobs_total") >= 25.0,
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "spindle_router_jobs_total{status=\"accepted\"}"),
        0.0,
        "an event's jobs are not submitted jobs"
    );

    // A router that crashes after storing (before confirming), and one that crashes after
    // claiming (before forwarding): the retry through the cluster's router settles both.
    for (step, n, stored) in [("stored", 10, true), ("claimed", 11, false)] {
        let key = format!("crash-{step}");
        let crash = format!("{step}:{key}");
        let mut doomed = cluster.spawn_router(2, &[("SPINDLE_FAULT_CRASH", &crash)]);
        cluster.wait_ready([&doomed]).await;
        let lost = Client::new(&doomed.base(), None)
            .unwrap()
            .publish(&event(n, &key))
            .await;
        assert!(lost.is_err(), "the router crashed at {step}: {lost:?}");
        let reply = settle(api.clone(), event(n, &key)).await;
        assert_eq!(reply.duplicate, stored, "{key}: {reply:?}");
        assert_eq!(
            reply.deliveries.len(),
            if n.is_multiple_of(2) { 3 } else { 2 }
        );
        let again = settle(api.clone(), event(n, &key)).await;
        assert!(again.duplicate && again.event_id == reply.event_id, "{key}");
        answers.entry(key).or_default().extend([reply, again]);
        doomed.kill9().await;
    }

    // Stored: per key, exactly the jobs of the one event every answer names.
    let expected: usize = answers.values().map(|a| a[0].deliveries.len()).sum();
    wait_for(
        Duration::from_secs(30),
        "every event job delivered",
        || async { cluster.sink.received().len() >= expected },
    )
    .await;
    let mut stored: HashMap<String, Vec<String>> = HashMap::new();
    for (id, key, _, _) in cluster.stored().await {
        stored.entry(key.expect("a key")).or_default().push(id);
    }
    assert_eq!(stored.len(), answers.len(), "one set of jobs per key");
    let mut delivered_pairs = std::collections::BTreeSet::new();
    for (key, replies) in &answers {
        let event_id = replies[0].event_id.as_ref().expect("an event");
        assert!(
            replies
                .iter()
                .all(|r| r.event_id.as_ref() == Some(event_id)),
            "{key}"
        );
        let mut jobs: Vec<String> = replies
            .iter()
            .find(|r| !r.deliveries.is_empty())
            .unwrap()
            .deliveries
            .iter()
            .map(|d| d.job_id.clone())
            .collect();
        jobs.sort();
        let mut held = stored[key].clone();
        held.sort();
        assert_eq!(held, jobs, "{key}: stored jobs are the event's");
        for d in &replies[0].deliveries {
            delivered_pairs.insert((event_id.clone(), d.subscription_id.clone()));
        }
    }
    // Delivered: each (event, subscription) once, signed for that subscription.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut seen = std::collections::BTreeSet::new();
    for r in cluster.sink.received() {
        let arrival = event_arrival(&r, &secrets);
        let pair = (arrival.event_id, arrival.subscription);
        assert!(seen.insert(pair.clone()), "{pair:?} delivered twice");
    }
    assert_eq!(seen, delivered_pairs);
    cluster.stop().await;
}

/// Lapsed claims whose events sat in a JobDB that left service every way it can: a router
/// dies after claiming a key (nothing stored) and others after storing an event (not
/// confirmed), all into a JobDB that was retiring five minutes earlier and still served
/// because no spare was free; then its Director is killed -9 and a new one takes a spare.
/// - While no Director or drainer has the retired JobDB, a retry is answered `pending` (503),
///   never stored a second time (before: the retired JobDB was searched only if it changed
///   state less than 60 s before the event was made, so the stored event read as absent).
/// - Once a drainer has fenced it and archived its id index, the stored key is answered
///   `duplicate` with its event and the claimed one is published fresh.
/// - Drained, then dropped by the manager, the JobDB's id index still answers a later retry
///   `duplicate` (before: `pending` for the whole dedup window). The router reads no JobDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_claim_settles_whatever_became_of_its_jobdb() {
    use spindle::registry::consul::Put;
    use spindle::registry::inventory::{JobDbState, RECORDS};
    use spindle_client::{Client, NewSubscription, PublishReply};
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::builder("rlc")
        .jobdbs(1)
        .directors(1)
        .service_ttl_ms(2000)
        .redis(None)
        .router(1)
        .control()
        .s3()
        .start()
        .await;
    let api = Client::new(&cluster.router_base(), None).unwrap();
    let sub = NewSubscription::new("shop", cluster.sink.url("/ok"), ["order.*"]);
    api.add_subscription(&sub).await.unwrap();
    let event = |key: &str| order_paid(key, json!({}));
    let retired = cluster.jobdbs[0].0.clone();
    cluster
        .wait_owned(&retired, "the first director on its jobdb")
        .await;

    // Retiring since five minutes, and still served: no spare is free.
    let listed = cluster.inventory.get(&retired).await.unwrap().unwrap();
    let mut record = listed.record.clone();
    record.state = JobDbState::Retiring;
    record.changed_at = chrono::Utc::now() - chrono::Duration::minutes(5);
    let cas = Put::Cas(listed.modify_index);
    let value = serde_json::to_vec(&record).unwrap();
    let key = format!("{RECORDS}{retired}");
    assert!(cluster
        .consul
        .client
        .kv_put(&key, &value, cas)
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let keys = [
        "crash-stored",
        "crash-claimed",
        "crash-drained",
        "crash-dropped",
    ];
    for key in keys {
        let step = if key == "crash-claimed" {
            "claimed"
        } else {
            "stored"
        };
        let mut doomed =
            cluster.spawn_router(1, &[("SPINDLE_FAULT_CRASH", &format!("{step}:{key}"))]);
        cluster.wait_ready([&doomed]).await;
        let lost = Client::new(&doomed.base(), None)
            .unwrap()
            .publish(&event(key))
            .await;
        assert!(lost.is_err(), "the router crashed at {step}: {lost:?}");
        doomed.kill9().await;
    }
    let db = cluster.jobdb(&retired);
    let ids: Vec<_> = histories(db).await.into_keys().collect();
    // Each stored key's event, by key (one job per event: one subscription).
    let first: HashMap<String, String> = db
        .get_jobs(&ids)
        .await
        .unwrap()
        .into_iter()
        .map(|j| {
            (
                j.idempotency_key.expect("a key"),
                j.event.expect("an event").event_id.to_string(),
            )
        })
        .collect();
    assert_eq!(first.len(), 3, "{first:?}");

    // Its Director dies there; a new one takes a spare.
    cluster.directors[0].kill9().await;
    let (spare, spare_db) = cluster.add_jobdb("1", JobDbState::Spare).await;
    cluster.directors.push(cluster.director("d1"));
    cluster
        .wait_owned(&spare, "the new director on the spare")
        .await;
    cluster.wait_router_ready(1).await;

    let publish = |key: &'static str| {
        let api = api.clone();
        async move { api.publish(&event(key)).await }
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        for key in ["crash-stored", "crash-claimed"] {
            match publish(key).await {
                Err(e) if e.status() == Some(503) => {}
                other => panic!("{key} answered while its jobdb has no director: {other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let settle = |key: &'static str| async move {
        let started = Instant::now();
        loop {
            match publish(key).await {
                Ok(reply) => break reply,
                Err(e) => {
                    assert_eq!(e.status(), Some(503), "{key}: {e}");
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "{key} unsettled: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
    let is_first = |reply: &PublishReply, key: &str| {
        let id = reply.event_id.as_deref().unwrap_or("?");
        reply.duplicate && first.get(key).is_some_and(|e| e == id)
    };
    let mut drainer = cluster.drainer("dr");
    let stored = settle("crash-stored").await;
    assert!(is_first(&stored, "crash-stored"), "{stored:?}");
    let claimed = settle("crash-claimed").await;
    assert!(!claimed.duplicate, "{claimed:?}");

    cluster
        .wait_drained(&retired, Duration::from_secs(30))
        .await;
    let drained = settle("crash-drained").await;
    assert!(is_first(&drained, "crash-drained"), "{drained:?}");

    let mut manager = cluster.manager("m", 3600, 0);
    wait_for(
        Duration::from_secs(30),
        "the drained jobdb dropped",
        || async { cluster.in_state(JobDbState::Dropped).await == 1 },
    )
    .await;
    let dropped = settle("crash-dropped").await;
    assert!(is_first(&dropped, "crash-dropped"), "{dropped:?}");
    // Only the claimed key made an event in the spare; the others' jobs there are the retired
    // JobDB's, moved by the drainer (same job, same event).
    let there: Vec<_> = histories(&spare_db).await.into_keys().collect();
    let mut made_there = Vec::new();
    for job in spare_db.get_jobs(&there).await.unwrap() {
        let key = job.idempotency_key.clone().expect("a key");
        let event = job.event.as_ref().expect("an event").event_id.to_string();
        match ids.contains(&job.id) {
            true => assert_eq!(first.get(&key), Some(&event), "{key} moved"),
            false => made_there.push(key),
        }
    }
    assert_eq!(made_there, ["crash-claimed"]);
    manager.term().await;
    drainer.term().await;
    spare_db.close().await;
    cluster.stop().await;
}

/// A Director whose payload limit is below the router's refuses an event's jobs for their
/// content: the publish is answered 413 naming the `event` (every Director refused it; a retry
/// cannot help), not 503, nothing is stored, and the key's claim is released so the producer
/// can publish a smaller event under the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_refused_for_its_content_is_answered_so() {
    use spindle_client::{Client, NewSubscription};
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::builder("rce")
        .jobdbs(2)
        .directors(2)
        .service_ttl_ms(2000)
        .director_args("--max-payload-bytes 512")
        .redis(None)
        .router(1)
        .control()
        .start()
        .await;
    let api = Client::new(&cluster.router_base(), None).unwrap();
    let sub = NewSubscription::new("shop", cluster.sink.url("/ok"), ["order.*"]);
    api.add_subscription(&sub).await.unwrap();
    let event = |payload: Value| order_paid("big-then-small", payload);
    let refused = api
        .publish(&event(json!({ "note": "x".repeat(2000) })))
        .await
        .unwrap_err();
    let answer = refused.api().expect("an error answer");
    assert_eq!(answer.status, 413, "{refused}");
    assert_eq!(answer.field.as_deref(), Some("event"), "{refused}");
    assert!(answer.message.contains("payload"), "{refused}");
    assert!(cluster.stored().await.is_empty(), "nothing stored");

    // The key is free again: a smaller event under it is published, not a duplicate.
    let reply = api.publish(&event(json!({"n": 1}))).await.unwrap();
    assert!(!reply.duplicate, "{reply:?}");
    assert_eq!(reply.deliveries.len(), 1);
    wait_for(
        Duration::from_secs(20),
        "the small event delivered",
        || async { cluster.sink.received().len() == 1 },
    )
    .await;
    assert_eq!(cluster.stored().await.len(), 1);
    cluster.stop().await;
}

/// An `order.paid` event of bucket `shop` under idempotency key `key`.
fn order_paid(key: &str, payload: Value) -> spindle_client::NewEvent {
    spindle_client::NewEvent {
        bucket: "shop".into(),
        event_type: "order.paid".into(),
        payload: serde_json::value::RawValue::from_string(payload.to_string()).unwrap(),
        idempotency_key: Some(key.to_owned()),
        deliver_at: None,
        on_complete: None,
        traceparent: None,
        tracestate: None,
    }
}
