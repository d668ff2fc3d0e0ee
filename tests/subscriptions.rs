//! Subscriptions no one can abuse, against live Directors and their control database on both
//! engines: every part of a subscription is bounded (413/422 naming the field, nothing
//! stored), a bucket holds at most so many; edits from two processes at once both hold, and
//! `If-Match` refuses an edit of a version since changed; an operator's SQL reaches every
//! cache within a second and a subscription is never deleted from under them; an event's job
//! whose subscription is not known waits for it, using no attempt and telling its URL's
//! breaker nothing; a back-fill sent again while the first one's commit is under way makes
//! one job per event.

mod common;

use std::time::Duration;

use chrono::Utc;
use common::*;
use serde_json::json;
use spindle::delivery::guard::AddressPolicy;
use spindle::events::subscription::{
    MAX_FILTER_VALUE_BYTES, MAX_SUBSCRIPTIONS_PER_BUCKET, MAX_SUBSCRIPTION_BYTES,
};
use spindle::events::Subscription;
use spindle::job::State;
use spindle::rpc::api::IntakeLimits;
use spindle_client::{NewEvent, NewSubscription, PayloadFilter, SubscriptionPatch};

/// The status and named field of a refused request.
fn refused(e: spindle_client::Error) -> (u16, Option<String>) {
    match e {
        spindle_client::Error::Api(api) => (api.status, api.field.clone()),
        other => panic!("not an API error: {other}"),
    }
}

fn event(bucket: &str, n: usize) -> NewEvent {
    NewEvent {
        bucket: bucket.into(),
        event_type: "order.paid".into(),
        payload: serde_json::value::RawValue::from_string(json!({ "n": n }).to_string()).unwrap(),
        idempotency_key: None,
        deliver_at: None,
        on_complete: None,
        traceparent: None,
        tracestate: None,
    }
}

/// A subscription of `bucket` whose filter compares a string of `bytes` bytes.
fn filtered(bucket: &str, url: String, bytes: usize) -> NewSubscription {
    NewSubscription {
        filter: Some(PayloadFilter {
            pointer: "/tier".into(),
            equals: json!("x".repeat(bytes)),
        }),
        ..NewSubscription::new(bucket, url, ["*"])
    }
}

async fn every_part_of_a_subscription_is_bounded(engine: Engine) {
    let control = Control::start(engine).await;
    let rig = Rig::start_on(engine, "subbound", control.tweak()).await;
    let api = rig.api();
    let url = rig.sink.url("/ok");
    // At the bound: stored.
    let at_bound = MAX_FILTER_VALUE_BYTES - 2; // the JSON string's quotes
    api.add_subscription(&filtered("t", url.clone(), at_bound))
        .await
        .expect("a filter at its bound is stored");
    // Past it: 413 naming the filter's value; a body past the whole bound: 413 naming it.
    for (bytes, field) in [
        (at_bound + 1, "filter.equals"),
        (MAX_SUBSCRIPTION_BYTES, "body"),
        (1 << 20, "body"),
    ] {
        let e = api
            .add_subscription(&filtered("t", url.clone(), bytes))
            .await
            .expect_err("refused");
        assert_eq!(refused(e), (413, Some(field.to_owned())), "{bytes} bytes");
    }
    // Bodies of many MiB are refused before they are read: the 413 may reach the client, or
    // the connection is closed under its upload. Never a 503, never stored.
    for bytes in [8 << 20, 20 << 20] {
        match api
            .add_subscription(&filtered("t", url.clone(), bytes))
            .await
        {
            Ok(_) => panic!("a {bytes}-byte subscription was stored"),
            Err(spindle_client::Error::Api(e)) => assert_eq!(e.status, 413, "{bytes} bytes"),
            Err(_) => {}
        }
    }
    // A PATCH is bounded as an add is.
    let one = api
        .add_subscription(&NewSubscription::new("t", url.clone(), ["*"]))
        .await
        .unwrap();
    let patch = SubscriptionPatch {
        event_types: Some(vec!["a".repeat(200); 400]),
        ..SubscriptionPatch::default()
    };
    let e = api.update_subscription(&one.id, &patch).await.unwrap_err();
    assert_eq!(refused(e), (413, Some("body".to_owned())));
    // Nothing refused was stored.
    assert_eq!(
        api.subscriptions(Some("t"))
            .await
            .unwrap()
            .subscriptions
            .len(),
        2
    );

    // A bucket holds at most so many live subscriptions; a removed one frees its place.
    let now = Utc::now();
    let rows: Vec<_> = (2..MAX_SUBSCRIPTIONS_PER_BUCKET)
        .map(|_| {
            let s = Subscription::check(
                ulid::Ulid::new(),
                NewSubscription::new("t", "https://example.com/hook", ["*"]),
                &IntakeLimits::default(),
                &AddressPolicy::default(),
                now,
            )
            .unwrap();
            (s.id, s.spec)
        })
        .collect();
    control.subscriptions.db().insert_many(&rows).await.unwrap();
    let e = api
        .add_subscription(&NewSubscription::new("t", url.clone(), ["*"]))
        .await
        .expect_err("the bucket is full");
    assert_eq!(refused(e), (422, Some("bucket".to_owned())));
    api.add_subscription(&NewSubscription::new("other", url.clone(), ["*"]))
        .await
        .expect("another bucket has room");
    api.remove_subscription(&one.id).await.unwrap();
    api.add_subscription(&NewSubscription::new("t", url, ["*"]))
        .await
        .expect("a removed subscription frees its place");
    rig.stop().await;
    control.stop().await;
}

async fn edits_from_two_processes_at_once_both_hold(engine: Engine) {
    let control = Control::start(engine).await;
    let a = Rig::start_on(engine, "subedita", control.tweak()).await;
    let b = Rig::start_on(
        engine,
        "subeditb",
        publishing_to(control.another_cache().await),
    )
    .await;
    let (at_a, at_b) = (a.api(), b.api());
    let made = at_a
        .add_subscription(&NewSubscription::new("t", a.sink.url("/r0"), ["*"]))
        .await
        .unwrap();
    wait_for(Duration::from_secs(5), "b knows it", || async {
        at_b.subscription(&made.id).await.is_ok()
    })
    .await;
    // The answer that made it names the version stored, as every later read does.
    assert!(made.version > 0);
    assert_eq!(
        at_b.subscription(&made.id).await.unwrap().version,
        made.version
    );
    // One process changes the URL, the other at once the enabled flag: neither undoes the
    // other (each changes only what it names, on the row as it is).
    for round in 1..=6 {
        let url = a.sink.url(&format!("/r{round}"));
        let enabled = round % 2 == 0;
        at_a.update_subscription(
            &made.id,
            &SubscriptionPatch {
                url: Some(url.clone()),
                ..SubscriptionPatch::default()
            },
        )
        .await
        .unwrap();
        at_b.update_subscription(
            &made.id,
            &SubscriptionPatch {
                enabled: Some(enabled),
                ..SubscriptionPatch::default()
            },
        )
        .await
        .unwrap();
        wait_for(
            Duration::from_secs(5),
            "both caches read the edits",
            || async {
                let (x, y) = (
                    at_a.subscription(&made.id).await,
                    at_b.subscription(&made.id).await,
                );
                matches!((x, y), (Ok(x), Ok(y)) if x == y && x.version > 0)
            },
        )
        .await;
        let now = at_a.subscription(&made.id).await.unwrap();
        assert_eq!(
            (now.url.as_str(), now.enabled),
            (url.as_str(), enabled),
            "round {round}: an edit was lost"
        );
    }
    // If-Match: an edit made from what was read holds only if nobody changed it since.
    let read = at_b.subscription(&made.id).await.unwrap();
    let rename = |path: &str| SubscriptionPatch {
        url: Some(a.sink.url(path)),
        ..SubscriptionPatch::default()
    };
    let done = at_a
        .update_subscription_if(&made.id, &rename("/first"), Some(read.version))
        .await
        .expect("the version read is the current one");
    assert!(done.version > read.version);
    let e = at_b
        .update_subscription_if(&made.id, &rename("/second"), Some(read.version))
        .await
        .expect_err("a stale version is refused");
    assert_eq!(refused(e), (412, Some("If-Match".to_owned())));
    let now = at_a.subscription(&made.id).await.unwrap();
    assert_eq!(
        now.url,
        a.sink.url("/first"),
        "the refused edit changed nothing"
    );
    a.stop().await;
    b.stop().await;
    control.stop().await;
}

async fn an_operators_sql_reaches_every_cache_at_once(engine: Engine) {
    let control = Control::start(engine).await;
    let rig = Rig::start_on(engine, "subsql", control.tweak()).await;
    let api = rig.api();
    let made = api
        .add_subscription(&NewSubscription::new("t", rig.sink.url("/ok"), ["*"]))
        .await
        .unwrap();
    let hex = ulid::Ulid::from_string(&made.id).unwrap().0;
    let id_sql = match engine {
        Engine::MySql => format!("UNHEX('{hex:032X}')"),
        Engine::Sqlite => format!("X'{hex:032X}'"),
    };
    // An UPDATE that takes no version itself: read within a refresh or two.
    try_sql(
        control.url(),
        &format!("UPDATE subscriptions SET enabled = 0 WHERE id = {id_sql}"),
    )
    .await
    .unwrap();
    wait_for(
        Duration::from_secs(3),
        "the cache reads the operator's edit",
        || async { !api.subscription(&made.id).await.unwrap().enabled },
    )
    .await;
    // A copy INSERTed with version 0 takes a version too.
    let copy = ulid::Ulid::new();
    let copy_sql = match engine {
        Engine::MySql => format!("UNHEX('{:032X}')", copy.0),
        Engine::Sqlite => format!("X'{:032X}'", copy.0),
    };
    try_sql(
        control.url(),
        &format!(
            "INSERT INTO subscriptions (id, bucket, enabled, removed, spec, version, created_at, \
             updated_at) SELECT {copy_sql}, bucket, 1, 0, spec, 0, created_at, updated_at \
             FROM subscriptions WHERE id = {id_sql}"
        ),
    )
    .await
    .unwrap();
    wait_for(
        Duration::from_secs(3),
        "the cache reads the operator's copy",
        || async { api.subscription(&copy.to_string()).await.is_ok() },
    )
    .await;
    // A DELETE is refused: no cache could learn of it.
    let e = try_sql(
        control.url(),
        &format!("DELETE FROM subscriptions WHERE id = {id_sql}"),
    )
    .await
    .expect_err("a delete is refused");
    assert!(e.to_string().contains("removed = 1"), "{e}");
    rig.stop().await;
    control.stop().await;
}

async fn an_events_job_waits_for_its_subscription_without_failing_its_url(engine: Engine) {
    let control = Control::start(engine).await;
    let mut rig = Rig::start_on(engine, "subwait", control.tweak()).await;
    let api = rig.api();
    // Disabled while its events are published, so that their jobs wait in the JobDB.
    let made = api
        .add_subscription(&NewSubscription {
            backoff_min_delay_ms: Some(50),
            enabled: Some(false),
            ..NewSubscription::new("t", rig.sink.url("/ok"), ["*"])
        })
        .await
        .unwrap();
    let mut jobs = Vec::new();
    for n in 0..12 {
        let reply = api.publish(&event("t", n)).await.unwrap();
        jobs.push(reply.deliveries[0].job_id.clone());
    }
    // The Director comes back reading another control database, where the subscription
    // does not exist: as one made elsewhere and not read here yet.
    rig.stop_director().await;
    let elsewhere = Control::start(engine).await;
    rig.restart_director(elsewhere.tweak()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in &jobs {
        let view = rig.job_view(id).await;
        assert_eq!(view["attempts"], 0, "waiting is not an attempt: {view}");
        assert_eq!(view["state"], "awaiting-scheduling", "{view}");
    }
    let metrics = metrics_text(&rig.client, &rig.base()).await;
    assert_eq!(
        metric_value(&metrics, "spindle_endpoint_breaker_opened_total"),
        0.0,
        "waiting for a subscription opened its URL's breaker"
    );
    // Its URL serves everyone else meanwhile.
    rig.submit(rig.jobs(3, "/ok", json!({}))).await;
    rig.wait_in_state(State::Succeeded, 3, Duration::from_secs(5))
        .await;
    // Known (and enabled) at last: every waiting job goes, on its first attempt.
    rig.stop_director().await;
    rig.restart_director(control.tweak()).await;
    let patch = SubscriptionPatch {
        enabled: Some(true),
        ..SubscriptionPatch::default()
    };
    rig.api()
        .update_subscription(&made.id, &patch)
        .await
        .unwrap();
    rig.wait_in_state(State::Succeeded, 15, Duration::from_secs(10))
        .await;
    for id in &jobs {
        assert_eq!(rig.job_view(id).await["attempts"], 1);
    }
    rig.stop().await;
    elsewhere.stop().await;
    control.stop().await;
}

/// A back-fill whose commit outlasts its request (504), and the same events sent again at
/// once, while that commit is still under way: each event gets one job of the subscription,
/// not two: the writer, looking just before the commit that would store the second request's
/// jobs (after the first's commit landed), finds them all. A proxy slows every statement that
/// carries a marker event only the first request holds (the writer's look and one statement of
/// its commit), so the first outlasts its write timeout and the second does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_sent_again_after_a_timeout_makes_one_job_per_event() {
    use common::sql_proxy::SqlProxy;
    const MARKER: &[u8; 16] = b"SLOWSLOWSLOWSLOW";
    let control = Control::start(Engine::MySql).await;
    let proxy = SqlProxy::start(3306).await;
    let publishing = control.tweak();
    let through = proxy.url("");
    let rig = Rig::start_on(Engine::MySql, "bfagain", move |c| {
        publishing(c);
        let proxied: spindle::jobdb::JobDbUrl =
            format!("{through}{}", c.jobdb.database).parse().unwrap();
        c.jobdb = proxied;
        c.writer.write_timeout = Duration::from_millis(2000);
    })
    .await;
    let api = rig.api();
    let late = api
        .add_subscription(&NewSubscription {
            enabled: Some(false),
            ..NewSubscription::new("t", rig.sink.url("/ok"), ["*"])
        })
        .await
        .unwrap();
    let past = |id: ulid::Ulid, n: usize| spindle_client::PastEvent {
        event_id: id.to_string(),
        event_type: "order.paid".into(),
        timestamp: Utc::now(),
        data: serde_json::value::RawValue::from_string(json!({ "n": n }).to_string()).unwrap(),
    };
    let events: Vec<spindle_client::PastEvent> =
        (1..4).map(|n| past(ulid::Ulid::new(), n)).collect();
    let marker = ulid::Ulid::from_bytes(*MARKER);
    let first = spindle_client::BackfillRequest {
        events: [past(marker, 0)]
            .into_iter()
            .chain(events.clone())
            .collect(),
    };
    // The writer's look and the next statement that names the marker (its insert), each 1.6 s
    // late: answered 504 at 2 s, committed at about 3.2 s.
    proxy.delay_times(MARKER, Duration::from_millis(1600), 2);
    let answer = api.backfill(&late.id, &first).await;
    assert_eq!(
        refused(answer.expect_err("the commit outlasts the request")).0,
        504
    );
    let again = api
        .backfill(&late.id, &spindle_client::BackfillRequest { events })
        .await
        .expect("sent again while the first commit is under way");
    assert_eq!(
        (again.deliveries.len(), again.skipped),
        (0, 3),
        "the events the first back-fill stored are skipped"
    );
    let mut sql = {
        use sqlx::Connection;
        sqlx::MySqlConnection::connect(&rig.db.url_string())
            .await
            .unwrap()
    };
    let per_event: std::collections::HashMap<String, i64> = sqlx::query_as(
        "SELECT HEX(event_id), COUNT(*) FROM jobs WHERE event_id IS NOT NULL GROUP BY event_id",
    )
    .fetch_all(&mut sql)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(
        (per_event.len(), per_event.values().all(|n| *n == 1)),
        (4, true),
        "one job per event: {per_event:?}"
    );
    rig.stop().await;
    control.stop().await;
}

on_both_engines!(
    every_part_of_a_subscription_is_bounded,
    edits_from_two_processes_at_once_both_hold,
    an_operators_sql_reaches_every_cache_at_once,
    an_events_job_waits_for_its_subscription_without_failing_its_url
);
