//! Black-box conformance tests for consul-double over real HTTP (reqwest), one double per
//! test on a free port. They follow the checklist in section 5 of
//! `shared/reference/consul-http-api.md`: status codes, KV/session/lock semantics,
//! blocking queries, agent/health/catalog, and every fault hook.

use std::future::Future;
use std::time::{Duration, Instant};

use base64::Engine;
use consul_double::{Config, ConsulDouble};
use reqwest::{Method, Response, StatusCode};
use serde_json::{json, Value};

/// One double plus a client.
struct T {
    d: ConsulDouble,
    c: reqwest::Client,
}

async fn start_with(f: impl FnOnce(&mut Config)) -> T {
    let mut cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        session_ttl_min: Duration::from_secs(1),
        ..Config::default()
    };
    f(&mut cfg);
    let d = ConsulDouble::start(cfg).await.unwrap();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    T { d, c }
}

async fn start() -> T {
    start_with(|_| {}).await
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn index_of(r: &Response) -> u64 {
    r.headers()
        .get("x-consul-index")
        .expect("X-Consul-Index header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Polls `cond` every 20ms until true or `timeout`.
async fn poll_until<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl T {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.d.url(), path)
    }

    async fn req(&self, m: Method, path: &str, body: impl Into<reqwest::Body>) -> Response {
        self.c
            .request(m, self.url(path))
            .body(body)
            .send()
            .await
            .unwrap()
    }

    async fn get(&self, path: &str) -> Response {
        self.req(Method::GET, path, "").await
    }

    async fn put(&self, path: &str, body: impl Into<reqwest::Body>) -> Response {
        self.req(Method::PUT, path, body).await
    }

    async fn delete(&self, path: &str) -> Response {
        self.req(Method::DELETE, path, "").await
    }

    /// PUT expecting 200 and a JSON bool.
    async fn put_bool(&self, path: &str, body: &str) -> bool {
        let r = self.put(path, body.to_string()).await;
        assert_eq!(r.status(), StatusCode::OK, "PUT {path}");
        r.json().await.unwrap()
    }

    async fn delete_bool(&self, path: &str) -> bool {
        let r = self.delete(path).await;
        assert_eq!(r.status(), StatusCode::OK, "DELETE {path}");
        r.json().await.unwrap()
    }

    /// The single entry for `key`, or None on 404.
    async fn entry(&self, key: &str) -> Option<Value> {
        let r = self.get(&format!("/v1/kv/{key}")).await;
        if r.status() == StatusCode::NOT_FOUND {
            return None;
        }
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        Some(v[0].clone())
    }

    async fn session(&self, body: Value) -> String {
        let r = self.put("/v1/session/create", body.to_string()).await;
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        v["ID"].as_str().unwrap().to_string()
    }

    async fn session_info(&self, id: &str) -> Vec<Value> {
        let r = self.get(&format!("/v1/session/info/{id}")).await;
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    async fn wait_parked(&self, n: usize) {
        assert!(
            poll_until(Duration::from_secs(5), || async {
                self.d.parked_queries() >= n
            })
            .await,
            "blocking query never parked"
        );
    }
}

// ---------------------------------------------------------------- basics

#[tokio::test]
async fn missing_key_is_404_with_index_and_status_leader_pings() {
    let t = start().await;
    let r = t.get("/v1/kv/nope").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(index_of(&r), 1, "index never 0, starts at 1");
    assert_eq!(r.headers()["x-consul-knownleader"], "true");
    assert_eq!(r.headers()["x-consul-lastcontact"], "0");
    assert!(r.bytes().await.unwrap().is_empty());

    let r = t.get("/v1/status/leader").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<String>().await.unwrap(), "127.0.0.1:8300");

    // After a write, a missing key reports the KV table index.
    assert!(t.put_bool("/v1/kv/other", "x").await);
    let r = t.get("/v1/kv/nope").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(index_of(&r), 2);

    // Wrong method and unknown path.
    assert_eq!(
        t.get("/v1/session/create").await.status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(t.get("/v1/nothing").await.status(), StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------- KV

#[tokio::test]
async fn kv_put_get_entry_shape_null_value_raw_and_flags() {
    let t = start().await;
    assert!(t.put_bool("/v1/kv/app/a?flags=42", "hello").await);
    let r = t.get("/v1/kv/app/a").await;
    assert_eq!(r.status(), StatusCode::OK);
    let idx = index_of(&r);
    let v: Value = r.json().await.unwrap();
    let e = &v[0];
    assert_eq!(e["Key"], "app/a");
    assert_eq!(e["Value"], b64("hello"));
    assert_eq!(e["Flags"], 42);
    assert_eq!(e["LockIndex"], 0);
    assert!(e.get("Session").is_none());
    assert_eq!(e["CreateIndex"], e["ModifyIndex"]);
    assert_eq!(e["ModifyIndex"], idx, "single-key index is the ModifyIndex");

    // Overwrite: CreateIndex kept, ModifyIndex bumped; flags reset to 0 when omitted.
    assert!(t.put_bool("/v1/kv/app/a", "bye").await);
    let e2 = t.entry("app/a").await.unwrap();
    assert_eq!(e2["CreateIndex"], e["CreateIndex"]);
    assert!(e2["ModifyIndex"].as_u64() > e["ModifyIndex"].as_u64());
    assert_eq!(e2["Flags"], 0);

    // Identical write is skipped: ModifyIndex unchanged.
    assert!(t.put_bool("/v1/kv/app/a", "bye").await);
    assert_eq!(
        t.entry("app/a").await.unwrap()["ModifyIndex"],
        e2["ModifyIndex"]
    );

    // Empty value → null.
    assert!(t.put_bool("/v1/kv/app/empty", "").await);
    assert_eq!(t.entry("app/empty").await.unwrap()["Value"], Value::Null);

    // Flags over the full u64 range.
    assert!(
        t.put_bool(&format!("/v1/kv/app/f?flags={}", u64::MAX), "x")
            .await
    );
    let e = t.entry("app/f").await.unwrap();
    assert_eq!(e["Flags"].as_u64(), Some(u64::MAX));

    // ?raw: the bytes, text/plain, nosniff and CSP sandbox.
    let bin: Vec<u8> = vec![0, 159, 146, 150, 255];
    assert_eq!(
        t.put("/v1/kv/app/bin", bin.clone()).await.status(),
        StatusCode::OK
    );
    let r = t.get("/v1/kv/app/bin?raw").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "text/plain");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert_eq!(r.headers()["content-security-policy"], "sandbox");
    assert!(r.headers().contains_key("x-consul-index"));
    assert_eq!(r.bytes().await.unwrap().to_vec(), bin);
    assert_eq!(
        t.get("/v1/kv/app/none?raw").await.status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn kv_put_rejections() {
    let t = start_with(|c| c.kv_max_value_size = 1024).await;
    let s = t.session(json!({})).await;

    for q in [
        format!("cas=0&acquire={s}"),
        format!("acquire={s}&release={s}"),
        format!("cas=1&release={s}"),
    ] {
        let r = t.put(&format!("/v1/kv/k?{q}"), "v").await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{q}");
        assert!(r.text().await.unwrap().starts_with("Conflicting flags"));
    }

    // Size limit: exactly the limit is fine, one byte more is 413.
    let r = t.put("/v1/kv/big", vec![b'a'; 1024]).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = t.put("/v1/kv/big", vec![b'a'; 1025]).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // Default limit is 512 KiB.
    let t2 = start().await;
    let r = t2.put("/v1/kv/big", vec![b'a'; 512 * 1024 + 1]).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let r = t2.put("/v1/kv/big", vec![b'a'; 512 * 1024]).await;
    assert_eq!(r.status(), StatusCode::OK);

    let r = t.put("/v1/kv/", "v").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.text().await.unwrap(), "Missing key name");
    assert_eq!(
        t.put("/v1/kv//lead", "v").await.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        t.put("/v1/kv/k?flags=-1", "v").await.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        t.put("/v1/kv/k?flags=18446744073709551616", "v")
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(t.get("/v1/kv/").await.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn kv_cas_semantics() {
    let t = start().await;
    assert!(t.put_bool("/v1/kv/c?cas=0", "one").await);
    assert!(
        !t.put_bool("/v1/kv/c?cas=0", "two").await,
        "cas=0 on existing"
    );
    let m = t.entry("c").await.unwrap()["ModifyIndex"].as_u64().unwrap();
    assert!(!t.put_bool(&format!("/v1/kv/c?cas={}", m + 100), "x").await);
    assert!(t.put_bool(&format!("/v1/kv/c?cas={m}"), "three").await);
    assert_eq!(t.entry("c").await.unwrap()["Value"], b64("three"));
    assert!(
        !t.put_bool("/v1/kv/absent?cas=5", "x").await,
        "cas>0 on absent"
    );
    assert!(t.entry("absent").await.is_none());
}

#[tokio::test]
async fn kv_recurse_and_keys() {
    let t = start().await;
    // Empty store: keys at the root is [], recurse is 404 with an index.
    let r = t.get("/v1/kv/?keys").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Vec<String>>().await.unwrap(), Vec::<String>::new());
    let r = t.get("/v1/kv/?recurse").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(index_of(&r) >= 1);

    for k in ["a/c/e", "a/b", "a/c/d", "b"] {
        assert!(t.put_bool(&format!("/v1/kv/{k}"), k).await);
    }
    let r = t.get("/v1/kv/a/?recurse").await;
    assert_eq!(r.status(), StatusCode::OK);
    let idx = index_of(&r);
    let v: Vec<Value> = r.json().await.unwrap();
    let keys: Vec<&str> = v.iter().map(|e| e["Key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["a/b", "a/c/d", "a/c/e"]);
    let max = v.iter().map(|e| e["ModifyIndex"].as_u64().unwrap()).max();
    assert_eq!(Some(idx), max);

    let keys: Vec<String> = t
        .get("/v1/kv/a/?keys&separator=/")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys, ["a/b", "a/c/"]);
    let keys: Vec<String> = t
        .get("/v1/kv/?keys&separator=/")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys, ["a/", "b"]);
    let keys: Vec<String> = t.get("/v1/kv/a?keys").await.json().await.unwrap();
    assert_eq!(keys, ["a/b", "a/c/d", "a/c/e"]);
    let keys: Vec<String> = t
        .get("/v1/kv/?keys&seperator=/")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys, ["a/", "b"], "misspelt seperator accepted");
    let r = t.get("/v1/kv/zzz?keys").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(r.headers().contains_key("x-consul-index"));
    assert_eq!(
        t.get("/v1/kv/zzz?recurse").await.status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn kv_delete_modes() {
    let t = start().await;
    assert!(t.delete_bool("/v1/kv/absent").await, "absent → true");
    assert!(t.put_bool("/v1/kv/d", "v").await);
    let m = t.entry("d").await.unwrap()["ModifyIndex"].as_u64().unwrap();
    assert!(!t.delete_bool(&format!("/v1/kv/d?cas={}", m + 1)).await);
    assert!(
        !t.delete_bool("/v1/kv/d?cas=0").await,
        "cas=0 never deletes"
    );
    assert!(t.entry("d").await.is_some());
    assert!(t.delete_bool(&format!("/v1/kv/d?cas={m}")).await);
    assert!(t.entry("d").await.is_none());
    assert!(
        t.delete_bool("/v1/kv/d?cas=7").await,
        "cas on absent → true"
    );

    assert!(t.put_bool("/v1/kv/p/1", "v").await);
    assert!(t.put_bool("/v1/kv/p/2", "v").await);
    assert!(t.put_bool("/v1/kv/q", "v").await);
    assert!(t.delete_bool("/v1/kv/p/?recurse").await);
    assert!(t.entry("p/1").await.is_none());
    assert!(t.entry("p/2").await.is_none());
    assert!(t.entry("q").await.is_some());

    let r = t.delete("/v1/kv/q?recurse&cas=1").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().starts_with("Conflicting flags"));
    assert_eq!(t.delete("/v1/kv/").await.status(), StatusCode::BAD_REQUEST);
    assert!(t.delete_bool("/v1/kv/?recurse").await);
    assert!(t.entry("q").await.is_none());
}

#[tokio::test]
async fn recursive_index_never_goes_backwards_after_delete() {
    let t = start().await;
    assert!(t.put_bool("/v1/kv/r/1", "v").await);
    assert!(t.put_bool("/v1/kv/r/2", "v").await);
    let r = t.get("/v1/kv/r/?recurse").await;
    let before = index_of(&r);
    assert!(t.delete_bool("/v1/kv/r/2").await);
    let r = t.get("/v1/kv/r/?recurse").await;
    assert_eq!(r.status(), StatusCode::OK);
    let after = index_of(&r);
    assert!(after > before, "{after} > {before}");
    let r = t.get("/v1/kv/r/?keys").await;
    assert_eq!(index_of(&r), after);
    // Deleting the last key: 404, index still not lower.
    assert!(t.delete_bool("/v1/kv/r/1").await);
    let r = t.get("/v1/kv/r/?recurse").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(index_of(&r) > after);
}

// ---------------------------------------------------------------- locks

#[tokio::test]
async fn acquire_release_lock_index_and_modify_index_rules() {
    let t = start().await;
    let s1 = t.session(json!({"Name": "one"})).await;
    let s2 = t.session(json!({"Name": "two"})).await;

    assert!(t.put_bool(&format!("/v1/kv/lock?acquire={s1}"), "v1").await);
    let e1 = t.entry("lock").await.unwrap();
    assert_eq!(e1["LockIndex"], 1);
    assert_eq!(e1["Session"], s1.as_str());
    assert_eq!(e1["CreateIndex"], e1["ModifyIndex"]);

    // Holder re-acquires: value updated, LockIndex unchanged, ModifyIndex bumps.
    assert!(t.put_bool(&format!("/v1/kv/lock?acquire={s1}"), "v2").await);
    let e2 = t.entry("lock").await.unwrap();
    assert_eq!(e2["LockIndex"], 1);
    assert_eq!(e2["Value"], b64("v2"));
    assert!(e2["ModifyIndex"].as_u64() > e1["ModifyIndex"].as_u64());
    assert_eq!(e2["CreateIndex"], e1["CreateIndex"]);

    // Another session cannot acquire or release.
    assert!(!t.put_bool(&format!("/v1/kv/lock?acquire={s2}"), "x").await);
    assert!(!t.put_bool(&format!("/v1/kv/lock?release={s2}"), "x").await);
    assert_eq!(t.entry("lock").await.unwrap()["Session"], s1.as_str());

    // Plain writes are advisory-lock-blind and keep the holder.
    assert!(t.put_bool("/v1/kv/lock", "plain").await);
    let e3 = t.entry("lock").await.unwrap();
    assert_eq!(e3["Session"], s1.as_str());
    assert_eq!(e3["LockIndex"], 1);

    // Release by the holder: Session gone, LockIndex kept, value replaced, ModifyIndex bumps.
    assert!(
        t.put_bool(&format!("/v1/kv/lock?release={s1}"), "released")
            .await
    );
    let e4 = t.entry("lock").await.unwrap();
    assert!(e4.get("Session").is_none());
    assert_eq!(e4["LockIndex"], 1);
    assert_eq!(e4["Value"], b64("released"));
    assert!(e4["ModifyIndex"].as_u64() > e3["ModifyIndex"].as_u64());
    assert!(!t.put_bool(&format!("/v1/kv/lock?release={s1}"), "x").await);
    assert!(!t.put_bool(&format!("/v1/kv/nokey?release={s1}"), "x").await);

    // Next acquisition increments LockIndex.
    assert!(t.put_bool(&format!("/v1/kv/lock?acquire={s2}"), "v").await);
    assert_eq!(t.entry("lock").await.unwrap()["LockIndex"], 2);

    // Deleting a locked key drops the lock; the next acquire starts at LockIndex 1.
    assert!(t.delete_bool("/v1/kv/lock").await);
    assert!(t.put_bool(&format!("/v1/kv/lock?acquire={s1}"), "v").await);
    let e5 = t.entry("lock").await.unwrap();
    assert_eq!(e5["LockIndex"], 1);
    assert!(e5["ModifyIndex"].as_u64() > e4["ModifyIndex"].as_u64());

    // Unknown session → 500; empty session → 500.
    let r = t
        .put(
            "/v1/kv/other?acquire=00000000-0000-0000-0000-000000000000",
            "v",
        )
        .await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text().await.unwrap().contains("invalid session"));
    let r = t.put("/v1/kv/other?acquire=", "v").await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn lock_delay_refuses_acquire_after_invalidation() {
    let t = start().await;
    t.d.freeze_time();
    let s1 = t.session(json!({"LockDelay": "10s"})).await;
    let s2 = t.session(json!({})).await;
    assert!(t.put_bool(&format!("/v1/kv/ld?acquire={s1}"), "v").await);
    let r = t.put(&format!("/v1/session/destroy/{s1}"), "").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.json::<bool>().await.unwrap());
    let e = t.entry("ld").await.unwrap();
    assert!(
        e.get("Session").is_none(),
        "release behaviour clears Session"
    );

    assert!(!t.put_bool(&format!("/v1/kv/ld?acquire={s2}"), "v").await);
    // Lock-delay is checked before the session: even an unknown session gets `false`.
    assert!(
        !t.put_bool(
            "/v1/kv/ld?acquire=00000000-0000-0000-0000-000000000000",
            "v"
        )
        .await
    );
    t.d.advance_time(Duration::from_secs(9));
    assert!(!t.put_bool(&format!("/v1/kv/ld?acquire={s2}"), "v").await);
    t.d.advance_time(Duration::from_secs(2));
    assert!(t.put_bool(&format!("/v1/kv/ld?acquire={s2}"), "v").await);
    assert_eq!(t.entry("ld").await.unwrap()["LockIndex"], 2);
}

#[tokio::test]
async fn lock_delay_real_time_and_absent_after_release_then_destroy() {
    let t = start().await;
    // LockDelay as a small number means seconds: 1 → 1s.
    let s1 = t.session(json!({"LockDelay": 1})).await;
    let s2 = t.session(json!({})).await;
    assert!(t.put_bool(&format!("/v1/kv/rt?acquire={s1}"), "v").await);
    assert!(t.d.expire_session(&s1));
    let refused_at = Instant::now();
    assert!(!t.put_bool(&format!("/v1/kv/rt?acquire={s2}"), "v").await);
    let path = format!("/v1/kv/rt?acquire={s2}");
    assert!(poll_until(Duration::from_secs(5), || t.put_bool(&path, "v")).await);
    assert!(refused_at.elapsed() >= Duration::from_millis(900));

    // Release first, then destroy: no lock-delay.
    let s3 = t.session(json!({"LockDelay": "30s"})).await;
    assert!(t.put_bool(&format!("/v1/kv/clean?acquire={s3}"), "v").await);
    assert!(t.put_bool(&format!("/v1/kv/clean?release={s3}"), "v").await);
    let r = t.put(&format!("/v1/session/destroy/{s3}"), "").await;
    assert!(r.status().is_success());
    assert!(t.put_bool(&format!("/v1/kv/clean?acquire={s2}"), "v").await);
}

#[tokio::test]
async fn lock_delay_is_capped_at_max_and_zero_disables() {
    let t = start_with(|c| c.max_lock_delay = Duration::from_secs(5)).await;
    t.d.freeze_time();
    let s1 = t.session(json!({"LockDelay": "60s"})).await;
    let s2 = t.session(json!({})).await;
    assert_eq!(t.session_info(&s1).await[0]["LockDelay"], 60_000_000_000i64);
    assert!(t.put_bool(&format!("/v1/kv/cap?acquire={s1}"), "v").await);
    assert!(t.d.expire_session(&s1));
    assert!(!t.put_bool(&format!("/v1/kv/cap?acquire={s2}"), "v").await);
    t.d.advance_time(Duration::from_millis(5001));
    assert!(t.put_bool(&format!("/v1/kv/cap?acquire={s2}"), "v").await);

    let s3 = t.session(json!({"LockDelay": "0s"})).await;
    assert!(t.put_bool(&format!("/v1/kv/zero?acquire={s3}"), "v").await);
    assert!(t.d.expire_session(&s3));
    assert!(t.put_bool(&format!("/v1/kv/zero?acquire={s2}"), "v").await);
}

// ---------------------------------------------------------------- sessions

#[tokio::test]
async fn session_create_fields_and_validation() {
    let t = start().await;
    // Defaults (no body at all).
    let r = t.put("/v1/session/create", "").await;
    assert_eq!(r.status(), StatusCode::OK);
    let id = r.json::<Value>().await.unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let e = &t.session_info(&id).await[0];
    assert_eq!(e["ID"], id.as_str());
    assert_eq!(e["Name"], "");
    assert_eq!(e["Node"], "consul-double");
    assert_eq!(e["LockDelay"], 15_000_000_000i64);
    assert_eq!(e["Behavior"], "release");
    assert_eq!(e["TTL"], "");
    assert_eq!(e["NodeChecks"], json!(["serfHealth"]));
    assert_eq!(e["ServiceChecks"], Value::Null);
    assert!(e["CreateIndex"].as_u64().unwrap() >= 1);
    assert_eq!(e["CreateIndex"], e["ModifyIndex"]);

    // Checks: [] clears the default node check.
    let id = t
        .session(json!({"Name": "n", "Checks": [], "NodeChecks": [], "TTL": "10s", "Behavior": "delete"}))
        .await;
    let e = &t.session_info(&id).await[0];
    assert_eq!(e["NodeChecks"], json!([]));
    assert_eq!(e["TTL"], "10s");
    assert_eq!(e["Behavior"], "delete");
    assert_eq!(e["Name"], "n");

    // TTL: none, bounds (min configured to 1s here), malformed.
    for ttl in ["", "0", "0s", "1s", "24h"] {
        let id = t.session(json!({ "TTL": ttl })).await;
        assert_eq!(t.session_info(&id).await[0]["TTL"], ttl);
    }
    for ttl in ["500ms", "24h0m1s", "25h", "10", "abc", "-5s"] {
        let r = t
            .put("/v1/session/create", json!({ "TTL": ttl }).to_string())
            .await;
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "TTL {ttl:?}");
    }
    let t10 = start_with(|c| c.session_ttl_min = Duration::from_secs(10)).await;
    let r = t10.put("/v1/session/create", r#"{"TTL":"9s"}"#).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let r = t10.put("/v1/session/create", r#"{"TTL":"10s"}"#).await;
    assert_eq!(r.status(), StatusCode::OK);

    // Behavior.
    let r = t
        .put("/v1/session/create", r#"{"Behavior":"explode"}"#)
        .await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);

    // LockDelay quirks: string, small number = seconds, small string = seconds,
    // big number = ns, unitless string → 400.
    for (given, ns) in [
        (json!("15s"), 15_000_000_000i64),
        (json!(15), 15_000_000_000),
        (json!("20ns"), 20_000_000_000),
        (json!(2_000_000_000i64), 2_000_000_000),
        (json!("1500ms"), 1_500_000_000),
        (json!(0), 0),
    ] {
        let id = t.session(json!({ "LockDelay": given })).await;
        assert_eq!(t.session_info(&id).await[0]["LockDelay"], ns, "{given}");
    }
    let r = t.put("/v1/session/create", r#"{"LockDelay":"20"}"#).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // Case-insensitive field names, as Go's decoder.
    let id = t.session(json!({"lockdelay": "3s", "name": "lower"})).await;
    let e = &t.session_info(&id).await[0];
    assert_eq!(e["LockDelay"], 3_000_000_000i64);
    assert_eq!(e["Name"], "lower");

    // Unknown node, unknown check, malformed body.
    let r = t.put("/v1/session/create", r#"{"Node":"elsewhere"}"#).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let r = t
        .put("/v1/session/create", r#"{"NodeChecks":["nope"]}"#)
        .await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let r = t.put("/v1/session/create", "{not json").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn unknown_session_ids() {
    let t = start().await;
    let u = "6c2ff4a4-1c55-4b27-b0b8-93c2f9a0d5f1";
    let r = t.put(&format!("/v1/session/renew/{u}"), "").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        r.text().await.unwrap(),
        format!("Session id '{u}' not found")
    );

    let r = t.get(&format!("/v1/session/info/{u}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().contains_key("x-consul-index"));
    assert_eq!(r.json::<Vec<Value>>().await.unwrap(), Vec::<Value>::new());

    let r = t.put(&format!("/v1/session/destroy/{u}"), "").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.json::<bool>().await.unwrap());

    let r = t.get("/v1/session/list").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Vec<Value>>().await.unwrap(), Vec::<Value>::new());
    assert_eq!(
        t.put("/v1/session/destroy/", "").await.status(),
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn session_renew_list_and_node() {
    let t = start().await;
    let id = t.session(json!({"TTL": "1s", "Name": "r"})).await;
    let r = t.put(&format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(r.status(), StatusCode::OK);
    let v: Vec<Value> = r.json().await.unwrap();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["ID"], id.as_str());
    assert_eq!(v[0]["TTL"], "1s");

    let all: Vec<Value> = t.get("/v1/session/list").await.json().await.unwrap();
    assert_eq!(all.len(), 1);
    let mine: Vec<Value> = t
        .get("/v1/session/node/consul-double")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(mine.len(), 1);
    let other: Vec<Value> = t.get("/v1/session/node/x").await.json().await.unwrap();
    assert!(other.is_empty());
}

#[tokio::test]
async fn session_ttl_expiry_real_time_releases_keys() {
    let t = start().await;
    let created = Instant::now();
    let id = t.session(json!({"TTL": "1s", "LockDelay": "0s"})).await;
    assert!(
        t.put_bool(&format!("/v1/kv/held?acquire={id}"), "keep")
            .await
    );
    let before = t.entry("held").await.unwrap();

    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(t.session_info(&id).await.len(), 1, "never before TTL");

    assert!(
        poll_until(Duration::from_secs(5), || async {
            t.session_info(&id).await.is_empty()
        })
        .await
    );
    let gone_after = created.elapsed();
    assert!(
        gone_after >= Duration::from_millis(1900),
        "TTL x 2: gone after {gone_after:?}"
    );
    assert!(
        gone_after < Duration::from_secs(4),
        "gone after {gone_after:?}"
    );

    let after = t.entry("held").await.unwrap();
    assert!(after.get("Session").is_none());
    assert_eq!(after["Value"], b64("keep"));
    assert_eq!(after["LockIndex"], before["LockIndex"]);
    assert!(after["ModifyIndex"].as_u64() > before["ModifyIndex"].as_u64());
    let r = t.put(&format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn session_renew_resets_timer_on_virtual_clock() {
    let t = start_with(|c| c.session_ttl_multiplier = 2).await;
    t.d.freeze_time();
    let id = t.session(json!({"TTL": "10s"})).await;
    t.d.advance_time(Duration::from_secs(15));
    assert_eq!(t.session_info(&id).await.len(), 1);
    let r = t.put(&format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(r.status(), StatusCode::OK);
    t.d.advance_time(Duration::from_secs(19));
    assert_eq!(t.session_info(&id).await.len(), 1, "renew re-armed 2 x TTL");
    t.d.advance_time(Duration::from_secs(2));
    assert!(t.session_info(&id).await.is_empty());

    // Configurable multiplier.
    let t3 = start_with(|c| c.session_ttl_multiplier = 3).await;
    t3.d.freeze_time();
    let id = t3.session(json!({"TTL": "10s"})).await;
    t3.d.advance_time(Duration::from_secs(29));
    assert_eq!(t3.session_info(&id).await.len(), 1);
    t3.d.advance_time(Duration::from_secs(2));
    assert!(t3.session_info(&id).await.is_empty());

    // HTTP time hooks.
    let t4 = start().await;
    assert!(t4.put("/_test/time/freeze", "").await.status().is_success());
    let id = t4.session(json!({"TTL": "5s"})).await;
    assert!(t4
        .put("/_test/time/advance?ms=10001", "")
        .await
        .status()
        .is_success());
    assert!(t4.session_info(&id).await.is_empty());
    assert!(t4.put("/_test/time/resume", "").await.status().is_success());
}

#[tokio::test]
async fn delete_behavior_deletes_held_keys() {
    let t = start().await;
    let s = t
        .session(json!({"Behavior": "delete", "LockDelay": "0s"}))
        .await;
    let keep = t.session(json!({})).await;
    assert!(t.put_bool(&format!("/v1/kv/del/a?acquire={s}"), "v").await);
    assert!(
        t.put_bool(&format!("/v1/kv/del/b?acquire={keep}"), "v")
            .await
    );
    assert!(t.put_bool("/v1/kv/del/c", "unlocked").await);
    let idx_before = index_of(&t.get("/v1/kv/del/?recurse").await);
    assert!(t.d.expire_session(&s));
    assert!(t.entry("del/a").await.is_none());
    assert!(t.entry("del/b").await.is_some());
    assert!(t.entry("del/c").await.is_some());
    let idx_after = index_of(&t.get("/v1/kv/del/?recurse").await);
    assert!(
        idx_after > idx_before,
        "tombstone advances the prefix index"
    );
    assert!(!t.d.expire_session(&s), "already gone");
}

// ---------------------------------------------------------------- blocking

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

// ---------------------------------------------------------------- agent / health / catalog

#[tokio::test]
async fn service_register_ttl_check_health_and_catalog() {
    let t = start().await;
    t.d.freeze_time();
    let reg = json!({
        "Name": "web", "ID": "web-1", "Tags": ["a", "b"], "Address": "10.0.0.5", "Port": 8080,
        "Meta": {"zone": "z1"},
        "Check": {"TTL": "10s"}
    });
    let r = t.put("/v1/agent/service/register", reg.to_string()).await;
    assert_eq!(r.status(), StatusCode::OK);

    // Checks start critical.
    let r = t.get("/v1/health/service/web").await;
    assert_eq!(r.status(), StatusCode::OK);
    let idx = index_of(&r);
    let v: Vec<Value> = r.json().await.unwrap();
    assert_eq!(v.len(), 1);
    let e = &v[0];
    assert_eq!(e["Node"]["Node"], "consul-double");
    assert_eq!(e["Node"]["Address"], "127.0.0.1");
    assert_eq!(e["Node"]["Datacenter"], "dc1");
    assert!(e["Node"]["ID"].is_string());
    assert!(e["Node"]["TaggedAddresses"].is_object());
    assert!(e["Node"]["Meta"].is_object());
    assert_eq!(e["Service"]["ID"], "web-1");
    assert_eq!(e["Service"]["Service"], "web");
    assert_eq!(e["Service"]["Tags"], json!(["a", "b"]));
    assert_eq!(e["Service"]["Address"], "10.0.0.5");
    assert_eq!(e["Service"]["Port"], 8080);
    assert_eq!(e["Service"]["Meta"], json!({"zone": "z1"}));
    assert_eq!(e["Service"]["Weights"], json!({"Passing": 1, "Warning": 1}));
    assert!(e["Service"]["TaggedAddresses"].is_object());
    let checks = e["Checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2);
    assert_eq!(checks[0]["CheckID"], "serfHealth");
    assert_eq!(checks[0]["Status"], "passing");
    let c = &checks[1];
    assert_eq!(c["CheckID"], "service:web-1");
    assert_eq!(c["Status"], "critical");
    assert_eq!(c["ServiceID"], "web-1");
    assert_eq!(c["ServiceName"], "web");
    assert_eq!(c["ServiceTags"], json!(["a", "b"]));
    for f in ["Node", "Name", "Notes", "Output"] {
        assert!(c[f].is_string(), "{f}");
    }
    let passing: Vec<Value> = t
        .get("/v1/health/service/web?passing")
        .await
        .json()
        .await
        .unwrap();
    assert!(passing.is_empty());

    // Pass (with note), blocking health query wakes.
    let cl = t.c.clone();
    let url = t.url(&format!(
        "/v1/health/service/web?passing&index={idx}&wait=20s"
    ));
    let h = tokio::spawn(async move { cl.get(url).send().await.unwrap() });
    t.wait_parked(1).await;
    let r = t
        .put("/v1/agent/check/pass/service:web-1?note=ok", "")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = h.await.unwrap();
    assert!(index_of(&r) > idx);
    let passing: Vec<Value> = r.json().await.unwrap();
    assert_eq!(passing.len(), 1);
    assert_eq!(passing[0]["Checks"][1]["Output"], "ok");

    // TTL lapses → critical.
    t.d.advance_time(Duration::from_secs(9));
    let passing: Vec<Value> = t
        .get("/v1/health/service/web?passing")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(passing.len(), 1);
    t.d.advance_time(Duration::from_secs(2));
    let all: Vec<Value> = t.get("/v1/health/service/web").await.json().await.unwrap();
    assert_eq!(all[0]["Checks"][1]["Status"], "critical");
    assert!(all[0]["Checks"][1]["Output"]
        .as_str()
        .unwrap()
        .starts_with("TTL expired"));

    // warn is not passing; update sets Status and Output; passing=false means no filter.
    assert!(t
        .put("/v1/agent/check/warn/service:web-1", "")
        .await
        .status()
        .is_success());
    let passing: Vec<Value> = t
        .get("/v1/health/service/web?passing")
        .await
        .json()
        .await
        .unwrap();
    assert!(passing.is_empty());
    let all: Vec<Value> = t
        .get("/v1/health/service/web?passing=false")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    let r = t
        .put(
            "/v1/agent/check/update/service:web-1",
            r#"{"Status":"passing","Output":"fine"}"#,
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let passing: Vec<Value> = t
        .get("/v1/health/service/web?passing")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(passing[0]["Checks"][1]["Output"], "fine");
    assert!(t
        .put("/v1/agent/check/fail/service:web-1", "")
        .await
        .status()
        .is_success());
    let passing: Vec<Value> = t
        .get("/v1/health/service/web?passing")
        .await
        .json()
        .await
        .unwrap();
    assert!(passing.is_empty());
    let r = t
        .put(
            "/v1/agent/check/update/service:web-1",
            r#"{"Status":"bogus"}"#,
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // Catalog: flat, unfiltered.
    let cat: Vec<Value> = t.get("/v1/catalog/service/web").await.json().await.unwrap();
    assert_eq!(cat.len(), 1);
    let c = &cat[0];
    assert_eq!(c["Node"], "consul-double");
    assert_eq!(c["Address"], "127.0.0.1");
    assert_eq!(c["Datacenter"], "dc1");
    assert_eq!(c["ServiceID"], "web-1");
    assert_eq!(c["ServiceName"], "web");
    assert_eq!(c["ServiceAddress"], "10.0.0.5");
    assert_eq!(c["ServicePort"], 8080);
    assert_eq!(c["ServiceTags"], json!(["a", "b"]));
    assert_eq!(c["ServiceMeta"], json!({"zone": "z1"}));
    assert!(c["ID"].is_string());
    let tagged: Vec<Value> = t
        .get("/v1/catalog/service/web?tag=a")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(tagged.len(), 1);
    let tagged: Vec<Value> = t
        .get("/v1/health/service/web?tag=zz")
        .await
        .json()
        .await
        .unwrap();
    assert!(tagged.is_empty());

    // Unknown service and unknown check.
    let none: Vec<Value> = t.get("/v1/health/service/nope").await.json().await.unwrap();
    assert!(none.is_empty());
    let none: Vec<Value> = t
        .get("/v1/catalog/service/nope")
        .await
        .json()
        .await
        .unwrap();
    assert!(none.is_empty());
    let r = t.put("/v1/agent/check/pass/nope", "").await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        r.text().await.unwrap(),
        r#"CheckID "nope" does not have associated TTL"#
    );

    // Deregister removes the instance and its checks; unknown is a no-op.
    let r = t.put("/v1/agent/service/deregister/web-1", "").await;
    assert_eq!(r.status(), StatusCode::OK);
    let none: Vec<Value> = t.get("/v1/health/service/web").await.json().await.unwrap();
    assert!(none.is_empty());
    assert_eq!(
        t.put("/v1/agent/check/pass/service:web-1", "")
            .await
            .status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        t.put("/v1/agent/service/deregister/ghost", "")
            .await
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn service_register_variants() {
    let t = start().await;
    // snake_case, ID defaults to Name, initial Status, several checks with generated IDs.
    let reg = json!({
        "name": "api", "port": 9000, "tags": ["x"],
        "checks": [{"ttl": "30s", "status": "passing"}, {"TTL": "30s", "CheckID": "custom", "Name": "mine"}]
    });
    let r = t.put("/v1/agent/service/register", reg.to_string()).await;
    assert_eq!(r.status(), StatusCode::OK);
    let v: Vec<Value> = t.get("/v1/health/service/api").await.json().await.unwrap();
    assert_eq!(v[0]["Service"]["ID"], "api");
    assert_eq!(v[0]["Service"]["Port"], 9000);
    let ids: Vec<&str> = v[0]["Checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["CheckID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["serfHealth", "custom", "service:api:1"]);
    let by_id = |id: &str| {
        v[0]["Checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["CheckID"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(by_id("service:api:1")["Status"], "passing");
    assert_eq!(by_id("custom")["Status"], "critical");
    assert_eq!(by_id("custom")["Name"], "mine");

    // Re-register replaces the service definition.
    let reg = json!({"Name": "api", "Port": 9001, "Check": {"TTL": "30s", "CheckID": "custom"}});
    assert_eq!(
        t.put(
            "/v1/agent/service/register?replace-existing-checks",
            reg.to_string()
        )
        .await
        .status(),
        StatusCode::OK
    );
    let v: Vec<Value> = t.get("/v1/health/service/api").await.json().await.unwrap();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["Service"]["Port"], 9001);
    assert_eq!(v[0]["Checks"].as_array().unwrap().len(), 2);

    // Two instances of one service.
    let reg = json!({"Name": "api", "ID": "api-2", "Port": 9002});
    assert!(t
        .put("/v1/agent/service/register", reg.to_string())
        .await
        .status()
        .is_success());
    let v: Vec<Value> = t
        .get("/v1/health/service/api?passing")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v.len(), 1, "only the instance without failing checks");
    assert_eq!(v[0]["Service"]["ID"], "api-2");

    // Rejections.
    let r = t.put("/v1/agent/service/register", r#"{"Port": 1}"#).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = t
        .put(
            "/v1/agent/service/register",
            r#"{"Name":"h","Check":{"HTTP":"http://x","Interval":"10s"}}"#,
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = t
        .put(
            "/v1/agent/service/register",
            r#"{"Name":"m","Meta":{"consul-x":"1"}}"#,
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn session_tied_to_service_check_dies_when_check_goes_critical() {
    let t = start().await;
    let reg = json!({"Name": "svc", "Check": {"TTL": "30s", "Status": "passing"}});
    assert!(t
        .put("/v1/agent/service/register", reg.to_string())
        .await
        .status()
        .is_success());
    let body = json!({"ServiceChecks": [{"ID": "service:svc"}], "LockDelay": "0s"});
    let id = t.session(body).await;
    assert_eq!(
        t.session_info(&id).await[0]["ServiceChecks"],
        json!([{"ID": "service:svc", "Namespace": ""}])
    );
    assert!(
        t.put_bool(&format!("/v1/kv/svc-lock?acquire={id}"), "v")
            .await
    );
    assert!(t
        .put("/v1/agent/check/fail/service:svc", "")
        .await
        .status()
        .is_success());
    assert!(t.session_info(&id).await.is_empty());
    assert!(t.entry("svc-lock").await.unwrap().get("Session").is_none());
    // A critical check cannot back a new session.
    let r = t
        .put(
            "/v1/session/create",
            json!({"ServiceChecks": [{"ID": "service:svc"}]}).to_string(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

// ---------------------------------------------------------------- faults

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
