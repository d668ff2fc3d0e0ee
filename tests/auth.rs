//! API authentication: bearer tokens scoped to buckets (producers) or admin, 401 for missing or
//! unknown tokens, 403 naming the field for out-of-scope buckets, and nothing stored on refusal.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::*;
use serde_json::json;
use spindle::rpc::auth::{Scope, TokenStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_gate_the_api_by_bucket() {
    let store = TokenStore::default()
        .with_token(
            "spt_producer_secret",
            "producer-a",
            Scope::Buckets(HashSet::from(["t1".to_owned()])),
        )
        .with_token("spt_admin_secret", "ops", Scope::Admin);
    let rig = Rig::start("auth", |c| c.auth = Some(Arc::new(store))).await;
    let url = format!("{}/v1/jobs", rig.base());
    let job = |bucket: &str| json!({"bucket": bucket, "endpoint": rig.sink.url("/ok")});
    let post = |token: Option<&str>, jobs: serde_json::Value| {
        let mut request = rig.client.post(&url).json(&json!({ "jobs": jobs }));
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        request.send()
    };

    // No token, an unknown token, another scheme: 401 with a challenge.
    for token in [
        None,
        Some("Bearer spt_wrong"),
        Some("Basic c3B0X2FkbWluX3NlY3JldA=="),
    ] {
        let response = post(token, json!([job("t1")])).await.unwrap();
        assert_eq!(response.status().as_u16(), 401, "{token:?}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthenticated");
    }

    // A producer submits to its bucket...
    let ok = post(Some("Bearer spt_producer_secret"), json!([job("t1")]))
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 202);
    let own: spindle::rpc::api::SubmitReply = ok.json().await.unwrap();
    // ...but a batch touching another bucket is refused whole, naming the field and the token's
    // name, never the token.
    let refused = post(
        Some("Bearer spt_producer_secret"),
        json!([job("t1"), job("t2")]),
    )
    .await
    .unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["field"], "jobs[1].bucket");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("producer-a") && !message.contains("spt_producer_secret"),
        "{message}"
    );
    assert_eq!(
        rig.reader.count_jobs().await.unwrap(),
        1,
        "nothing of the refused batch stored"
    );

    // The admin may use any bucket.
    let admin = post(Some("Bearer spt_admin_secret"), json!([job("t9")]))
        .await
        .unwrap();
    assert_eq!(admin.status().as_u16(), 202);
    let other: spindle::rpc::api::SubmitReply = admin.json().await.unwrap();

    // Reading a job needs a token whose scope covers its bucket.
    let get = |id: &str, token: Option<&str>| {
        let mut request = rig.client.get(format!("{}/v1/jobs/{id}", rig.base()));
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        request.send()
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(
        status(
            get(&own.jobs[0].id, Some("Bearer spt_producer_secret"))
                .await
                .unwrap()
        ),
        200
    );
    assert_eq!(
        status(
            get(&other.jobs[0].id, Some("Bearer spt_producer_secret"))
                .await
                .unwrap()
        ),
        403
    );
    assert_eq!(
        status(
            get(&other.jobs[0].id, Some("Bearer spt_admin_secret"))
                .await
                .unwrap()
        ),
        200
    );
    assert_eq!(status(get(&other.jobs[0].id, None).await.unwrap()), 401);

    // Listing: a token limited to some buckets must name one of them; the admin lists all.
    let list = |query: &str, token: &str| {
        rig.client
            .get(format!("{}/v1/jobs?{query}", rig.base()))
            .header("authorization", token)
            .send()
    };
    let producer = "Bearer spt_producer_secret";
    for query in ["", "bucket=t9"] {
        let refused = list(query, producer).await.unwrap();
        assert_eq!(refused.status().as_u16(), 403, "{query:?}");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(body["error"]["field"], "bucket", "{body}");
    }
    let mine: serde_json::Value = list("bucket=t1", producer)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(mine["jobs"].as_array().unwrap().len(), 1, "{mine}");
    let all: serde_json::Value = list("", "Bearer spt_admin_secret")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all["jobs"].as_array().unwrap().len(), 2, "{all}");

    // Health, readiness, metrics and the API description stay open.
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let response = rig
            .client
            .get(format!("{}{path}", rig.base()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{path}");
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_rate_is_told_to_wait() {
    let scope = Scope::Buckets(HashSet::from(["t1".to_owned()]));
    let store =
        TokenStore::default().with_limited_token("spt_limited", "slow-producer", scope, 2, 3);
    let rig = Rig::start("ratelimit", |c| c.auth = Some(Arc::new(store))).await;
    let post = || {
        rig.client
            .post(format!("{}/v1/jobs", rig.base()))
            .header("authorization", "Bearer spt_limited")
            .json(&json!({"jobs": [{"bucket": "t1", "endpoint": rig.sink.url("/ok")}]}))
            .send()
    };
    // A burst of 3 is admitted at once; the 4th request must wait.
    for _ in 0..3 {
        assert_eq!(post().await.unwrap().status().as_u16(), 202);
    }
    let limited = post().await.unwrap();
    assert_eq!(limited.status().as_u16(), 429);
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait >= 1);
    let body: serde_json::Value = limited.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("slow-producer"));
    assert_eq!(
        rig.reader.count_jobs().await.unwrap(),
        3,
        "the refused request stored nothing"
    );
    // At 2 per second, a request is admitted again within about half a second.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(post().await.unwrap().status().as_u16(), 202);
    rig.stop().await;
}

/// Subscriptions are managed by tokens given their bucket to manage (or admin tokens), not by
/// tokens that only use the bucket: a subscription decides where a bucket's events go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_managers_of_a_bucket_touch_its_subscriptions() {
    let store = TokenStore::default()
        .with_token(
            "spt_producer",
            "producer",
            Scope::Buckets(HashSet::from(["t1".to_owned()])),
        )
        .with_token("spt_manager", "manager", Scope::Buckets(HashSet::new()))
        .managing(&["t1"])
        .with_token("spt_admin", "ops", Scope::Admin);
    let control = Control::start(Engine::MySql).await;
    let tweak = control.tweak();
    let rig = Rig::start("authsub", move |c| {
        tweak(c);
        c.auth = Some(Arc::new(store));
    })
    .await;
    let as_token =
        |token: &str| spindle_client::Client::new(&rig.base(), Some(token.to_owned())).unwrap();
    let (producer, manager, admin) = (
        as_token("spt_producer"),
        as_token("spt_manager"),
        as_token("spt_admin"),
    );
    let subscription =
        |bucket: &str| spindle_client::NewSubscription::new(bucket, rig.sink.url("/ok"), ["a.*"]);
    let status = |e: spindle_client::Error| e.status();
    assert_eq!(
        status(
            producer
                .add_subscription(&subscription("t1"))
                .await
                .unwrap_err()
        ),
        Some(403)
    );
    let made = manager.add_subscription(&subscription("t1")).await.unwrap();
    assert_eq!(
        status(
            manager
                .add_subscription(&subscription("t2"))
                .await
                .unwrap_err()
        ),
        Some(403)
    );
    admin.add_subscription(&subscription("t2")).await.unwrap();
    // Each sees what it manages; a producer, nothing (not even a 404 tells it more).
    assert_eq!(
        manager
            .subscriptions(None)
            .await
            .unwrap()
            .subscriptions
            .len(),
        1
    );
    assert_eq!(
        admin.subscriptions(None).await.unwrap().subscriptions.len(),
        2
    );
    assert!(producer
        .subscriptions(None)
        .await
        .unwrap()
        .subscriptions
        .is_empty());
    assert_eq!(
        status(producer.subscription(&made.id).await.unwrap_err()),
        Some(404)
    );
    // Publishing is using the bucket: the producer may, the manager may not.
    let event = spindle_client::NewEvent {
        bucket: "t1".into(),
        event_type: "a.b".into(),
        payload: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
        idempotency_key: None,
        deliver_at: None,
        on_complete: None,
        traceparent: None,
        tracestate: None,
    };
    assert_eq!(producer.publish(&event).await.unwrap().deliveries.len(), 1);
    assert_eq!(
        status(manager.publish(&event).await.unwrap_err()),
        Some(403)
    );
    rig.stop().await;
    control.stop().await;
}
