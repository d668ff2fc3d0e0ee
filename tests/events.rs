//! Events and subscriptions against a live Director on both engines: matching (exact,
//! wildcard, payload filter, bucket), one job per matching subscription committed together,
//! deliveries signed with each subscription's own secret, bad input refused with the field
//! named and nothing stored, a disabled subscription's jobs held until it is enabled again
//! (across a Director restart), and the SQL recipes of docs/operations.md.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::json;
use spindle::delivery::signing::SigningSecret;
use spindle::job::State;
use spindle_client::{NewEvent, NewSubscription, PayloadFilter, SubscriptionPatch};

fn event(bucket: &str, event_type: &str, payload: serde_json::Value) -> NewEvent {
    NewEvent {
        bucket: bucket.into(),
        event_type: event_type.into(),
        payload: serde_json::value::RawValue::from_string(payload.to_string()).unwrap(),
        idempotency_key: None,
        deliver_at: None,
        on_complete: None,
        traceparent: None,
        tracestate: None,
    }
}

/// The status and named field of a refused request.
fn refused(e: spindle_client::Error) -> (u16, Option<String>) {
    match e {
        spindle_client::Error::Api(api) => (api.status, api.field.clone()),
        other => panic!("not an API error: {other}"),
    }
}

async fn events_reach_every_matching_subscription(engine: Engine) {
    let control = Control::start(engine).await;
    let rig = Rig::start_on(engine, "events", control.tweak()).await;
    let api = rig.api();
    let capture = |name: &str| rig.sink.url(&format!("/capture?s={name}"));
    let add = |s: NewSubscription| {
        let api = api.clone();
        async move { api.add_subscription(&s).await.expect("subscription added") }
    };
    let exact = add(NewSubscription::new(
        "acme",
        capture("exact"),
        ["invoice.paid"],
    ))
    .await;
    let wildcard = add(NewSubscription::new("acme", capture("wild"), ["invoice.*"])).await;
    let gold = add(NewSubscription {
        filter: Some(PayloadFilter {
            pointer: "/tier".into(),
            equals: json!("gold"),
        }),
        ..NewSubscription::new("acme", capture("gold"), ["*"])
    })
    .await;
    let customers = add(NewSubscription::new(
        "acme",
        capture("cust"),
        ["customer.*"],
    ))
    .await;
    let elsewhere = add(NewSubscription::new("other", capture("else"), ["*"])).await;
    assert!(exact
        .secret
        .as_deref()
        .is_some_and(|s| s.starts_with("whsec_")));

    // Bad subscriptions: 422 naming the field, nothing stored.
    for (bad, field) in [
        (
            NewSubscription::new("acme", "http://10.0.0.1/x", ["a"]),
            "url",
        ),
        (
            NewSubscription::new("acme", "http://[::1]:9/x", ["a"]),
            "url",
        ),
        (
            NewSubscription::new("acme", capture("x"), ["a b"]),
            "event_types[0]",
        ),
        (
            NewSubscription::new("acme", capture("x"), ["*.paid"]),
            "event_types[0]",
        ),
        (
            NewSubscription {
                filter: Some(PayloadFilter {
                    pointer: "tier".into(),
                    equals: json!(1),
                }),
                ..NewSubscription::new("acme", capture("x"), ["a"])
            },
            "filter.pointer",
        ),
    ] {
        let (status, named) = refused(api.add_subscription(&bad).await.unwrap_err());
        assert_eq!((status, named.as_deref()), (422, Some(field)));
    }
    assert_eq!(
        api.subscriptions(None).await.unwrap().subscriptions.len(),
        5
    );
    assert_eq!(
        api.subscriptions(Some("other"))
            .await
            .unwrap()
            .subscriptions
            .len(),
        1
    );

    // A page at a time, by id: 2 + 2 + 1.
    let mut after: Option<String> = None;
    let mut pages = Vec::new();
    loop {
        let page = api
            .subscriptions_page(None, after.as_deref(), 2)
            .await
            .unwrap();
        pages.push(page.subscriptions.len());
        let ids: Vec<&String> = page.subscriptions.iter().map(|s| &s.id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "by id");
        assert!(after.as_ref().is_none_or(|a| ids.iter().all(|id| *id > a)));
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(pages, vec![2, 2, 1]);
    for (bad_after, limit, field) in [(None, 0, "limit"), (Some("x"), 1, "after")] {
        let (status, named) = refused(
            api.subscriptions_page(None, bad_after, limit)
                .await
                .unwrap_err(),
        );
        assert_eq!((status, named.as_deref()), (422, Some(field)));
    }

    // Exact and wildcard; the filter leaves gold out.
    let silver = api
        .publish(&event(
            "acme",
            "invoice.paid",
            json!({"tier": "silver", "n": 1}),
        ))
        .await
        .unwrap();
    // Deliveries come in subscription id order; ids made in one millisecond need not ascend.
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    let got = |reply: &spindle_client::PublishReply| -> Vec<String> {
        reply
            .deliveries
            .iter()
            .map(|d| d.subscription_id.clone())
            .collect()
    };
    assert_eq!(
        got(&silver),
        sorted(vec![exact.id.clone(), wildcard.id.clone()])
    );
    assert!(silver.transaction_id.is_some());
    let golden = api
        .publish(&event(
            "acme",
            "invoice.paid",
            json!({"tier": "gold", "n": 2}),
        ))
        .await
        .unwrap();
    assert_eq!(
        got(&golden),
        sorted(vec![exact.id.clone(), wildcard.id.clone(), gold.id.clone()])
    );
    let customer = api
        .publish(&event("acme", "customer.created", json!({"n": 3})))
        .await
        .unwrap();
    assert_eq!(got(&customer), vec![customers.id.clone()]);
    let nobody = api
        .publish(&event("nobody", "x", json!(null)))
        .await
        .unwrap();
    // Kept all the same: it has an id, and its JobDB knows it (with no job).
    assert!(nobody.deliveries.is_empty() && nobody.transaction_id.is_some());
    let kept = api
        .event(nobody.event_id.as_deref().expect("a kept event has an id"))
        .await
        .unwrap();
    assert!(kept.deliveries.is_empty() && kept.bucket == "nobody");
    // Bad events: 422 naming the field, nothing stored.
    for (bad, field) in [
        (event("acme", "bad type", json!(1)), "event_type"),
        (event("acme", "invoice.*", json!(1)), "event_type"),
        (event("", "x", json!(1)), "bucket"),
    ] {
        let (status, named) = refused(api.publish(&bad).await.unwrap_err());
        assert_eq!((status, named.as_deref()), (422, Some(field)));
    }
    rig.wait_in_state(State::Succeeded, 6, Duration::from_secs(20))
        .await;

    // Each subscription got its events, once, signed with its own secret, with the envelope
    // and the event's headers.
    let secrets: HashMap<String, SigningSecret> =
        [&exact, &wildcard, &gold, &customers, &elsewhere]
            .iter()
            .map(|s| (s.id.clone(), s.secret.clone().unwrap().parse().unwrap()))
            .collect();
    let received = rig.sink.received();
    assert_eq!(received.len(), 6);
    let mut per_subscription: HashMap<String, Vec<i64>> = HashMap::new();
    for r in &received {
        let arrival = event_arrival(r, &secrets);
        let (subscription, body) = (arrival.subscription, arrival.body);
        assert_eq!(body["type"], arrival.event_type.as_str());
        per_subscription
            .entry(subscription)
            .or_default()
            .push(body["data"]["n"].as_i64().unwrap());
    }
    for list in per_subscription.values_mut() {
        list.sort();
    }
    assert_eq!(per_subscription[&exact.id], vec![1, 2]);
    assert_eq!(per_subscription[&wildcard.id], vec![1, 2]);
    assert_eq!(per_subscription[&gold.id], vec![2]);
    assert_eq!(per_subscription[&customers.id], vec![3]);
    assert!(!per_subscription.contains_key(&elsewhere.id));

    // The job view names its event.
    let gold_job = &golden
        .deliveries
        .iter()
        .find(|d| d.subscription_id == gold.id)
        .unwrap()
        .job_id;
    let view = rig.job_view(gold_job).await;
    assert_eq!(view["event"]["event_id"], golden.event_id.clone().unwrap());
    assert_eq!(view["event"]["subscription_id"], gold.id);
    rig.stop().await;
    control.stop().await;
}

async fn a_disabled_subscription_holds_its_jobs_until_enabled(engine: Engine) {
    let control = Control::start(engine).await;
    let mut rig = Rig::start_on(engine, "evhold", control.tweak()).await;
    let api = rig.api();
    let on = api
        .add_subscription(&NewSubscription::new(
            "t",
            rig.sink.url("/capture?s=on"),
            ["*"],
        ))
        .await
        .unwrap();
    let held = api
        .add_subscription(&NewSubscription {
            enabled: Some(false),
            ..NewSubscription::new("t", rig.sink.url("/capture?s=held"), ["*"])
        })
        .await
        .unwrap();
    assert!(!held.enabled);
    let mut held_jobs = Vec::new();
    for n in 0..3 {
        let reply = api
            .publish(&event("t", "x.y", json!({"n": n})))
            .await
            .unwrap();
        assert_eq!(
            reply.deliveries.len(),
            2,
            "a disabled subscription still gets its jobs"
        );
        let mine = reply
            .deliveries
            .iter()
            .find(|d| d.subscription_id == held.id);
        held_jobs.push(mine.unwrap().job_id.clone());
    }
    rig.wait_in_state(State::Succeeded, 3, Duration::from_secs(10))
        .await;
    let from = |sink: &spindle::cli::sink::Sink, id: &str| {
        sink.received()
            .iter()
            .filter(|r| {
                r.headers
                    .iter()
                    .any(|(n, v)| n == "spindle-subscription-id" && v == id)
            })
            .count()
    };
    assert_eq!(from(&rig.sink, &on.id), 3);
    // Held: nothing goes out while it is disabled, across a Director restart too.
    tokio::time::sleep(Duration::from_millis(700)).await;
    rig.stop_director().await;
    rig.restart_director(control.tweak()).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        from(&rig.sink, &held.id),
        0,
        "a disabled subscription's jobs wait"
    );
    for id in &held_jobs {
        assert_eq!(rig.job_view(id).await["state"], "awaiting-scheduling");
    }
    // Enabled again: everything held is delivered.
    let api = rig.api();
    let patch = SubscriptionPatch {
        enabled: Some(true),
        ..SubscriptionPatch::default()
    };
    assert!(
        api.update_subscription(&held.id, &patch)
            .await
            .unwrap()
            .enabled
    );
    rig.wait_in_state(State::Succeeded, 6, Duration::from_secs(10))
        .await;
    assert_eq!(from(&rig.sink, &held.id), 3);
    // Removed: no new event reaches it.
    api.remove_subscription(&held.id).await.unwrap();
    let reply = api
        .publish(&event("t", "x.y", json!({"n": 9})))
        .await
        .unwrap();
    assert_eq!(reply.deliveries.len(), 1);
    let (status, _) = refused(api.subscription(&held.id).await.unwrap_err());
    assert_eq!(status, 404);
    rig.stop().await;
    control.stop().await;
}

/// A batch of events (`{"events": [...]}`) is one transaction: 1,000 events make their jobs
/// (two subscriptions of one type, one of the other; none for a type no one wants) committed
/// before the answer, which names each event's jobs in order; a bad event refuses the whole
/// batch, naming `events[i].…`, and so do a batch of 1,001 and one whose events make more than
/// 10,000 jobs, storing nothing. `spindle publish --ndjson` sends a file's events in batches.
async fn a_batch_of_events_is_one_transaction(engine: Engine) {
    let control = Control::start(engine).await;
    let rig = Rig::start_on(engine, "evbatch", control.tweak()).await;
    let api = rig.api();
    for types in [vec!["*"], vec!["order.paid"]] {
        api.add_subscription(&NewSubscription::new("shop", rig.sink.url("/ok"), types))
            .await
            .unwrap();
    }
    let kinds = ["order.paid", "order.made", "other.thing"];
    let batch: Vec<NewEvent> = (0..1000)
        .map(|n| {
            let kind = if n % 10 == 9 { kinds[2] } else { kinds[n % 2] };
            let bucket = if kind == kinds[2] { "nobody" } else { "shop" };
            event(bucket, kind, json!({ "n": n }))
        })
        .collect();
    let reply = api.publish_batch(&batch).await.unwrap();
    assert_eq!(reply.events.len(), 1000);
    let mut jobs = 0;
    let mut ids = std::collections::HashSet::new();
    for (n, (sent, answer)) in batch.iter().zip(&reply.events).enumerate() {
        let want = match sent.event_type.as_str() {
            "order.paid" if sent.bucket == "shop" => 2,
            "order.made" => 1,
            _ => 0,
        };
        assert_eq!(answer.deliveries.len(), want, "event {n}: {answer:?}");
        // An event that makes no job is kept all the same, in the same transaction.
        let id = answer.event_id.clone().expect("every event has an id");
        assert!(ids.insert(id), "event {n}: a new id");
        assert!(answer.transaction_id.is_some());
        assert_eq!(answer.transaction_id, reply.transaction_id);
        jobs += want;
    }
    let nobody = reply.events[9].event_id.as_deref().unwrap();
    let kept = api.event(nobody).await.unwrap();
    assert!(kept.deliveries.is_empty() && kept.bucket == "nobody");
    assert_eq!(
        rig.reader.count_jobs().await.unwrap(),
        jobs as u64,
        "every job stored before the answer"
    );
    // Refused whole, nothing stored.
    let mut bad = batch[..10].to_vec();
    bad[7].event_type = "order paid".into();
    let too_many: Vec<NewEvent> = (0..1001).map(|_| batch[0].clone()).collect();
    let refusals = [
        (bad, 422, "events[7].event_type"),
        (too_many, 422, "events"),
        (Vec::new(), 422, "events"),
    ];
    for (events, status, field) in refusals {
        let e = api.publish_batch(&events).await.unwrap_err();
        assert_eq!(refused(e), (status, Some(field.to_owned())));
    }
    for _ in 0..10 {
        api.add_subscription(&NewSubscription::new("shop", rig.sink.url("/ok"), ["*"]))
            .await
            .unwrap();
    }
    // 1,000 events of 11 or 12 subscriptions each: over 10,000 jobs.
    let wide: Vec<NewEvent> = (0..1000)
        .map(|n| event("shop", "order.made", json!({ "n": n })))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = api.publish_batch(&wide).await.unwrap_err();
    assert_eq!(refused(e), (413, Some("events".to_owned())));
    assert_eq!(rig.reader.count_jobs().await.unwrap(), jobs as u64);
    // From NDJSON, two at a time: one answer per event, in order.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.ndjson");
    let lines: Vec<String> = (0..5)
        .map(|n| serde_json::to_string(&event("shop", "order.made", json!({ "n": n }))).unwrap())
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n\n").unwrap();
    let base = rig.base();
    let out = procs::run_ok(&[
        "publish",
        "--ndjson",
        file.to_str().unwrap(),
        "--batch",
        "2",
        "--api",
        &base,
    ]);
    let answers: Vec<spindle_client::PublishReply> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 5, "{out}");
    assert!(answers.iter().all(|a| a.deliveries.len() == 11), "{out}");
    rig.wait_in_state(State::Succeeded, jobs as u64 + 55, Duration::from_secs(60))
        .await;
    rig.stop().await;
    control.stop().await;
}

on_both_engines!(
    a_batch_of_events_is_one_transaction,
    events_reach_every_matching_subscription,
    a_disabled_subscription_holds_its_jobs_until_enabled,
    processes_starting_together_share_a_new_control_database,
    a_later_subscription_is_backfilled_from_the_jobdb_and_from_s3,
    a_subscription_caps_the_requests_to_its_url
);

/// Processes starting together on a new control database (a cluster's first boot) all open
/// it: creating and migrating it is safe to race.
async fn processes_starting_together_share_a_new_control_database(engine: Engine) {
    let db = TestDb::on(engine, "ctlrace");
    let opens = (0..4).map(|_| spindle::events::ControlDb::open(&db.url));
    for opened in futures::future::join_all(opens).await {
        opened.expect("opened").close().await;
    }
}

/// Runs `spindle subscriptions backfill` and returns what it printed.
fn backfill(args: &[&str]) -> String {
    let mut all = vec!["subscriptions", "backfill"];
    all.extend_from_slice(args);
    procs::run_ok(&all)
}

/// Events published before a subscription existed reach it by a back-fill, from the JobDB and
/// from the S3 archive (moto), each once, with the event's own id and timestamp, signed with
/// the new subscription's secret; the types and filter it was made with decide; a second
/// back-fill sends nothing again. Events no subscription wanted when they were published
/// (a type's first subscriber) are kept and back-filled too.
async fn a_later_subscription_is_backfilled_from_the_jobdb_and_from_s3(engine: Engine) {
    use common::s3::{ArchiveStore, Backend};
    let store = ArchiveStore::start(Backend::S3, "backfill").await;
    let archive = spindle::archive::Archive::open(&store.config())
        .await
        .expect("archive");
    let control = Control::start(engine).await;
    let tweak = control.tweak();
    let rig = Rig::start_on(engine, "backfill", move |c| {
        tweak(c);
        c.archive = Some(archive);
    })
    .await;
    let api = rig.api();
    // The first subscriber is down: its jobs expire within a second, into the archive.
    let early = NewSubscription {
        ttl_ms: Some(1000),
        backoff_min_delay_ms: Some(200),
        ..NewSubscription::new("shop", rig.sink.url("/status/503"), ["order.*"])
    };
    api.add_subscription(&early).await.unwrap();
    let since = chrono::Utc::now() - chrono::Duration::seconds(1);
    let mut published = HashMap::new();
    for n in 0..9 {
        let event_type = match n {
            5 => "order.refunded",
            6.. => "invoice.sent",
            _ => "order.paid",
        };
        let tier = if n % 2 == 0 { "gold" } else { "silver" };
        let reply = api
            .publish(&event("shop", event_type, json!({"n": n, "tier": tier})))
            .await
            .unwrap();
        published.insert(reply.event_id.clone().unwrap(), (n, event_type, tier));
    }
    rig.wait_in_state(State::Archived, 6, Duration::from_secs(30))
        .await;

    // From the JobDB: the five `order.paid` events; `order.refunded` is not wanted.
    let paid = api
        .add_subscription(&NewSubscription::new(
            "shop",
            rig.sink.url("/capture?s=paid"),
            ["order.paid"],
        ))
        .await
        .unwrap();
    let (url, base) = (rig.db.url_string(), rig.base());
    let since_text = since.to_rfc3339();
    let from_jobdb = |id: &str| {
        backfill(&[
            id,
            "--since",
            &since_text,
            "--from-jobdb",
            &url,
            "--api",
            &base,
        ])
    };
    let out = from_jobdb(&paid.id);
    assert!(out.contains("selected 9, delivered 5, skipped 4"), "{out}");
    // Again: the five have its jobs now; the other ones are still not wanted.
    let out = from_jobdb(&paid.id);
    assert!(out.contains("selected 4, delivered 0, skipped 4"), "{out}");
    // The invoices made no job when published (nothing subscribed to them): kept all the
    // same, so their first subscriber gets them.
    let invoices = api
        .add_subscription(&NewSubscription::new(
            "shop",
            rig.sink.url("/capture?s=invoices"),
            ["invoice.*"],
        ))
        .await
        .unwrap();
    let out = from_jobdb(&invoices.id);
    assert!(out.contains("selected 9, delivered 3, skipped 6"), "{out}");

    // From S3: the gold ones of every order event.
    let gold = api
        .add_subscription(&NewSubscription {
            filter: Some(PayloadFilter {
                pointer: "/tier".into(),
                equals: json!("gold"),
            }),
            ..NewSubscription::new("shop", rig.sink.url("/capture?s=gold"), ["order.*"])
        })
        .await
        .unwrap();
    let mut args = vec![
        gold.id.as_str(),
        "--since",
        &since_text,
        "--from-archive",
        "--api",
        &base,
    ];
    let archive_args = store.cli_args();
    args.extend(archive_args.iter().map(String::as_str));
    let out = backfill(&args);
    assert!(out.contains("selected 6, delivered 3, skipped 3"), "{out}");
    // Again: the archive does not know of the new jobs, the Director's JobDB does.
    let out = backfill(&args);
    assert!(out.contains("selected 6, delivered 0, skipped 6"), "{out}");

    // Both sources in one run: the JobDB's nine events, then the archive's six order events;
    // the refund reaches the new subscription once.
    let refunds = api
        .add_subscription(&NewSubscription::new(
            "shop",
            rig.sink.url("/capture?s=refunds"),
            ["order.refunded"],
        ))
        .await
        .unwrap();
    let mut args = vec![
        refunds.id.as_str(),
        "--since",
        &since_text,
        "--from-jobdb",
        &url,
        "--from-archive",
        "--api",
        &base,
    ];
    args.extend(archive_args.iter().map(String::as_str));
    let out = backfill(&args);
    assert!(
        out.contains("selected 15, delivered 1, skipped 14"),
        "{out}"
    );

    // Bad back-fills: the field named, nothing stored.
    let past = |event_id: &str, event_type: &str| spindle_client::PastEvent {
        event_id: event_id.into(),
        event_type: event_type.into(),
        timestamp: chrono::Utc::now(),
        data: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
    };
    let fresh = ulid::Ulid::new().to_string();
    for (events, field) in [
        (vec![past("nope", "order.paid")], "events[0].event_id"),
        (
            vec![past(&fresh, "order.paid"), past(&fresh, "order paid")],
            "events[1].event_type",
        ),
        (vec![], "events"),
    ] {
        let request = spindle_client::BackfillRequest { events };
        let (status, named) = refused(api.backfill(&paid.id, &request).await.unwrap_err());
        assert_eq!((status, named.as_deref()), (422, Some(field)));
    }
    let request = spindle_client::BackfillRequest {
        events: vec![past(&fresh, "order.paid")],
    };
    let (status, _) = refused(api.backfill(&fresh, &request).await.unwrap_err());
    assert_eq!(status, 404);

    // Four back-fills of one subscription at once: one job per event between them (its
    // endpoint answers 503: they stay out of the deliveries below).
    let racing = api
        .add_subscription(&NewSubscription::new(
            "shop",
            rig.sink.url("/status/503"),
            ["order.paid"],
        ))
        .await
        .unwrap();
    let request = spindle_client::BackfillRequest {
        events: (0..8)
            .map(|_| past(&ulid::Ulid::new().to_string(), "order.paid"))
            .collect(),
    };
    let replies =
        futures::future::join_all((0..4).map(|_| api.backfill(&racing.id, &request))).await;
    let made: usize = replies
        .into_iter()
        .map(|r| r.unwrap().deliveries.len())
        .sum();
    assert_eq!(made, 8, "one job per event across concurrent back-fills");

    // Delivered once each, as the events were, signed for each subscription.
    let expected: usize = 5 + 3 + 3 + 1;
    wait_for(
        Duration::from_secs(20),
        "back-filled jobs delivered",
        || async {
            rig.sink
                .received()
                .iter()
                .filter(|r| r.status == 200)
                .count()
                >= expected
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let secrets: HashMap<String, SigningSecret> = [&paid, &gold, &invoices, &refunds]
        .iter()
        .map(|s| (s.id.clone(), s.secret.clone().unwrap().parse().unwrap()))
        .collect();
    let mut got: HashMap<String, Vec<i64>> = HashMap::new();
    for r in rig.sink.received().iter().filter(|r| r.status == 200) {
        let arrival = event_arrival(r, &secrets);
        let (n, event_type, tier) = published[&arrival.event_id];
        let (subscription, body) = (arrival.subscription, arrival.body);
        assert_eq!(body["type"], event_type);
        assert_eq!(body["data"]["n"], n);
        assert_eq!(body["data"]["tier"], tier);
        got.entry(subscription).or_default().push(n);
    }
    for list in got.values_mut() {
        list.sort();
    }
    assert_eq!(got[&paid.id], vec![0, 1, 2, 3, 4]);
    assert_eq!(got[&gold.id], vec![0, 2, 4]);
    assert_eq!(got[&invoices.id], vec![6, 7, 8]);
    assert_eq!(got[&refunds.id], vec![5]);
    rig.stop().await;
    control.stop().await;
}

/// A subscription's caps hold its URL's requests on the Director: concurrency 1 on an endpoint
/// answering in 200 ms (one request at a time), 5 per second on another; out-of-range caps are
/// refused naming the field.
async fn a_subscription_caps_the_requests_to_its_url(engine: Engine) {
    let control = Control::start(engine).await;
    let rig = Rig::start_on(engine, "caps", control.tweak()).await;
    let api = rig.api();
    for (bad, field) in [
        (
            NewSubscription {
                max_concurrency: Some(0),
                ..NewSubscription::new("caps", rig.sink.url("/ok"), ["*"])
            },
            "max_concurrency",
        ),
        (
            NewSubscription {
                max_per_second: Some(-1.0),
                ..NewSubscription::new("caps", rig.sink.url("/ok"), ["*"])
            },
            "max_per_second",
        ),
    ] {
        let (status, named) = refused(api.add_subscription(&bad).await.unwrap_err());
        assert_eq!((status, named.as_deref()), (422, Some(field)));
    }
    let one_at_a_time = NewSubscription {
        max_concurrency: Some(1),
        ..NewSubscription::new("caps", rig.sink.url("/slow/200"), ["slow.*"])
    };
    let paced = NewSubscription {
        max_per_second: Some(5.0),
        ..NewSubscription::new("caps", rig.sink.url("/status/203"), ["paced.*"])
    };
    for s in [one_at_a_time, paced] {
        let view = api.add_subscription(&s).await.unwrap();
        assert!(view.max_concurrency.is_some() || view.max_per_second.is_some());
    }
    let started = std::time::Instant::now();
    for n in 0..6 {
        api.publish(&event("caps", "slow.x", json!({"n": n})))
            .await
            .unwrap();
    }
    for n in 0..15 {
        api.publish(&event("caps", "paced.x", json!({"n": n})))
            .await
            .unwrap();
    }
    wait_for(Duration::from_secs(20), "the capped events", || async {
        let received = rig.sink.received();
        received.iter().filter(|r| r.path == "/slow/200").count() == 6
            && received.iter().filter(|r| r.path == "/status/203").count() == 15
    })
    .await;
    let arrivals = |path: &str| arrivals_at(&rig.sink, path, started);
    let slow = arrivals("/slow/200");
    let gaps = slow.windows(2).map(|w| w[1] - w[0]).min().unwrap();
    let paced = arrivals("/status/203");
    let span = *paced.last().unwrap() - paced[0];
    println!(
        "caps: concurrency 1 at 200 ms: closest starts {} ms apart; 5/s: 15 took {:.2} s",
        gaps.as_millis(),
        span.as_secs_f64()
    );
    assert!(
        gaps >= Duration::from_millis(190),
        "one at a time: {gaps:?}"
    );
    assert!(
        span >= Duration::from_millis(1800),
        "5 per second: {span:?}"
    );
    rig.stop().await;
    control.stop().await;
}
