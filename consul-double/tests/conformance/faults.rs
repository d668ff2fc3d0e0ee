//! Fault hooks: failing renewals, 500s, latency and stalls, an index going backwards, dropped
//! blocking queries, and expiring a session on demand.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::{index_of, poll_until, start};

#[tokio::test]
async fn fault_renew_fails() {
    let t = start().await;
    let id = t.session(json!({"TTL": "10s"})).await;
    t.d.faults().set_renew_fails(true);
    let r = t.put(&format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        r.text().await.unwrap(),
        format!("Session id '{id}' not found")
    );
    assert_eq!(
        t.session_info(&id).await.len(),
        1,
        "session itself untouched"
    );
    t.d.faults().clear();
    assert_eq!(
        t.put(&format!("/v1/session/renew/{id}"), "").await.status(),
        StatusCode::OK
    );
    // Same over HTTP.
    assert!(t
        .put("/_test/faults/renew_fails?on=true", "")
        .await
        .status()
        .is_success());
    assert_eq!(
        t.put(&format!("/v1/session/renew/{id}"), "").await.status(),
        StatusCode::NOT_FOUND
    );
    assert!(t
        .put("/_test/faults/renew_fails?on=false", "")
        .await
        .status()
        .is_success());
    assert_eq!(
        t.put(&format!("/v1/session/renew/{id}"), "").await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn fault_error_500_no_cluster_leader() {
    let t = start().await;
    t.d.faults().set_error_500(true);
    for r in [
        t.get("/v1/kv/x").await,
        t.put("/v1/kv/x", "v").await,
        t.get("/v1/status/leader").await,
    ] {
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(r.text().await.unwrap(), "No cluster leader");
    }
    assert!(t.put("/_test/faults/clear", "").await.status().is_success());
    assert_eq!(t.get("/v1/status/leader").await.status(), StatusCode::OK);
    assert!(t
        .put("/_test/faults/error_500?on=true", "")
        .await
        .status()
        .is_success());
    assert_eq!(
        t.get("/v1/status/leader").await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    t.d.faults().set_error_500(false);
    assert_eq!(t.get("/v1/status/leader").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn fault_latency_and_stall() {
    let t = start().await;
    t.d.faults().set_latency(Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(t.get("/v1/status/leader").await.status(), StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(300));
    t.d.faults().set_latency(Duration::ZERO);
    let started = Instant::now();
    t.get("/v1/status/leader").await;
    assert!(started.elapsed() < Duration::from_millis(250));

    assert!(t
        .put("/_test/faults/latency?ms=200", "")
        .await
        .status()
        .is_success());
    let started = Instant::now();
    t.get("/v1/status/leader").await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    t.d.faults().clear();

    // Stall: requests arriving within the window hang until it ends, then succeed.
    let started = Instant::now();
    t.d.faults().stall(Duration::from_millis(500));
    assert!(t.put_bool("/v1/kv/stalled", "v").await);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(450), "{took:?}");
    let started = Instant::now();
    assert!(t.entry("stalled").await.is_some());
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "stall is over"
    );

    let started = Instant::now();
    assert!(t
        .put("/_test/faults/stall?ms=300", "")
        .await
        .status()
        .is_success());
    assert_eq!(t.get("/v1/status/leader").await.status(), StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn fault_index_backwards_once() {
    let t = start().await;
    for i in 0..5 {
        assert!(t.put_bool(&format!("/v1/kv/ib/{i}"), "v").await);
    }
    let idx = index_of(&t.get("/v1/kv/ib/?recurse").await);
    assert!(idx > 1);

    // Armed before the read: answered at once with a lower index, once.
    t.d.faults().index_backwards_once();
    let r = t
        .get(&format!("/v1/kv/ib/?recurse&index={idx}&wait=10s"))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(index_of(&r), 1);
    let r = t
        .get(&format!("/v1/kv/ib/?recurse&index={}&wait=10s", idx - 1))
        .await;
    assert_eq!(index_of(&r), idx, "only once");

    // Armed while parked: the parked query is woken with the lower index.
    let c = t.c.clone();
    let url = t.url(&format!("/v1/kv/ib/?recurse&index={idx}&wait=20s"));
    let started = Instant::now();
    let h = tokio::spawn(async move { c.get(url).send().await.unwrap() });
    t.wait_parked(1).await;
    assert!(t
        .put("/_test/faults/index_backwards_once", "")
        .await
        .status()
        .is_success());
    let r = h.await.unwrap();
    assert_eq!(index_of(&r), 1);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn fault_drop_blocking_queries_closes_connection() {
    let t = start().await;
    assert!(t.put_bool("/v1/kv/dq", "v").await);
    let idx = index_of(&t.get("/v1/kv/dq").await);
    let mut handles = Vec::new();
    for path in [
        format!("/v1/kv/dq?index={idx}&wait=20s"),
        format!("/v1/session/list?index={}&wait=20s", t.d.index()),
    ] {
        let c = t.c.clone();
        let url = t.url(&path);
        handles.push(tokio::spawn(async move {
            match c.get(url).send().await {
                Ok(r) => Err(r.status()),
                Err(e) => Ok(e),
            }
        }));
    }
    t.wait_parked(2).await;
    let started = Instant::now();
    t.d.faults().drop_blocking_queries();
    for h in handles {
        let res = h.await.unwrap();
        assert!(res.is_ok(), "expected a transport error, got {res:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        poll_until(Duration::from_secs(2), || async {
            t.d.parked_queries() == 0
        })
        .await
    );

    // Later queries are unaffected; the HTTP hook works too.
    let c = t.c.clone();
    let url = t.url(&format!("/v1/kv/dq?index={idx}&wait=20s"));
    let h = tokio::spawn(async move { c.get(url).send().await });
    t.wait_parked(1).await;
    assert!(t.put_bool("/v1/kv/dq", "changed").await);
    assert_eq!(h.await.unwrap().unwrap().status(), StatusCode::OK);

    let c = t.c.clone();
    let url = t.url(&format!("/v1/kv/dq?index={}&wait=20s", idx + 100));
    let h = tokio::spawn(async move { c.get(url).send().await });
    t.wait_parked(1).await;
    assert!(t
        .put("/_test/faults/drop_blocking_queries", "")
        .await
        .status()
        .is_success());
    assert!(h.await.unwrap().is_err());
}

#[tokio::test]
async fn expire_session_hook_over_http_and_library() {
    let t = start().await;
    let id = t.session(json!({"LockDelay": "0s"})).await;
    assert!(t.put_bool(&format!("/v1/kv/eh?acquire={id}"), "v").await);
    let r = t.put(&format!("/_test/sessions/expire/{id}"), "").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.json::<bool>().await.unwrap());
    assert!(t.session_info(&id).await.is_empty());
    assert!(t.entry("eh").await.unwrap().get("Session").is_none());
    let r = t.put(&format!("/_test/sessions/expire/{id}"), "").await;
    assert!(!r.json::<bool>().await.unwrap());
    assert!(!t.d.expire_session(&id));
    t.d.stop().await;
}
