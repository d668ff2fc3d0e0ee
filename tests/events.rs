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
use spindle::delivery::signing::{sign, SigningSecret};
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
    assert!(nobody.deliveries.is_empty() && nobody.transaction_id.is_none());
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
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        let subscription = header("spindle-subscription-id");
        let timestamp: i64 = header("webhook-timestamp").parse().unwrap();
        let expected = sign(
            std::slice::from_ref(&secrets[&subscription]),
            &header("webhook-id"),
            timestamp,
            &r.body,
        );
        assert_eq!(
            header("webhook-signature"),
            expected,
            "signed with its own secret"
        );
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["type"], header("spindle-event-type"));
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
    assert_eq!(view["event"]["event_id"], golden.event_id);
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

on_both_engines!(
    events_reach_every_matching_subscription,
    a_disabled_subscription_holds_its_jobs_until_enabled
);
