//! Blocking queries: KV reads that wake on a write or return at the wait timeout, and session
//! reads that wake on a destroy.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{b64, index_of, poll_until, start};

#[tokio::test]
async fn blocking_kv_read_wakes_on_write() {
    let t = start().await;
    assert!(t.put_bool("/v1/kv/w", "one").await);
    let idx = index_of(&t.get("/v1/kv/w").await);
    let c = t.c.clone();
    let url = t.url(&format!("/v1/kv/w?index={idx}&wait=20s"));
    let started = Instant::now();
    let h = tokio::spawn(async move { c.get(url).send().await.unwrap() });
    t.wait_parked(1).await;
    // An unrelated write does not wake a found-key query.
    assert!(t.put_bool("/v1/kv/unrelated", "x").await);
    assert!(t.put_bool("/v1/kv/w", "two").await);
    let r = h.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r.status(), StatusCode::OK);
    let new_idx = index_of(&r);
    assert!(new_idx > idx);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v[0]["Value"], b64("two"));
    assert_eq!(v[0]["ModifyIndex"], new_idx);

    // Blocking on an absent key wakes when it is created; recurse and keys block too.
    for mode in ["", "recurse&", "keys&"] {
        let idx = index_of(&t.get("/v1/kv/later").await);
        let path = format!("/v1/kv/later?{mode}index={idx}&wait=20s");
        let c = t.c.clone();
        let url = t.url(&path);
        let h = tokio::spawn(async move { c.get(url).send().await.unwrap() });
        t.wait_parked(1).await;
        assert!(t.put_bool("/v1/kv/later", "now").await);
        let r = h.await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert!(index_of(&r) > idx);
        assert!(t.delete_bool("/v1/kv/later").await);
        assert!(
            poll_until(Duration::from_secs(2), || async {
                t.d.parked_queries() == 0
            })
            .await
        );
    }
}

#[tokio::test]
async fn blocking_read_returns_at_wait_timeout() {
    let t = start().await;
    assert!(t.put_bool("/v1/kv/idle", "v").await);
    let idx = index_of(&t.get("/v1/kv/idle").await);
    let started = Instant::now();
    let r = t.get(&format!("/v1/kv/idle?index={idx}&wait=400ms")).await;
    let took = started.elapsed();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(index_of(&r), idx);
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(
        took < Duration::from_millis(400 * 17 / 16 + 400),
        "{took:?}"
    );

    // index lower than current → immediate; index=0 → immediate.
    let started = Instant::now();
    let r = t.get("/v1/kv/idle?index=0&wait=10s").await;
    assert_eq!(r.status(), StatusCode::OK);
    let r2 = t
        .get(&format!("/v1/kv/idle?index={}&wait=10s", idx - 1))
        .await;
    assert_eq!(r2.status(), StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(2));

    // Missing key at timeout: 404 with the index.
    let idx = index_of(&t.get("/v1/kv/never").await);
    let r = t.get(&format!("/v1/kv/never?index={idx}&wait=100ms")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(index_of(&r), idx);

    assert_eq!(
        t.get("/v1/kv/idle?index=abc").await.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        t.get("/v1/kv/idle?index=1&wait=10").await.status(),
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn blocking_session_info_and_list_wake_on_destroy() {
    let t = start().await;
    let id = t.session(json!({})).await;
    let r = t.get(&format!("/v1/session/info/{id}")).await;
    let idx = index_of(&r);
    let c = t.c.clone();
    let info_url = t.url(&format!("/v1/session/info/{id}?index={idx}&wait=20s"));
    let list_url = t.url(&format!("/v1/session/list?index={idx}&wait=20s"));
    let c2 = t.c.clone();
    let h1 = tokio::spawn(async move { c.get(info_url).send().await.unwrap() });
    let h2 = tokio::spawn(async move { c2.get(list_url).send().await.unwrap() });
    t.wait_parked(2).await;
    assert!(t.put_bool(&format!("/v1/session/destroy/{id}"), "").await);
    for h in [h1, h2] {
        let r = h.await.unwrap();
        assert!(index_of(&r) > idx);
        assert!(r.json::<Vec<Value>>().await.unwrap().is_empty());
    }
}
