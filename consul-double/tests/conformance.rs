//! Black-box conformance tests for consul-double over real HTTP (reqwest), one double per
//! test on a free port. They follow the checklist in section 5 of
//! `shared/reference/consul-http-api.md`: status codes, KV/session/lock semantics,
//! blocking queries, agent/health/catalog, and every fault hook.

#[path = "conformance/agent.rs"]
mod agent;
#[path = "conformance/blocking.rs"]
mod blocking;
#[path = "conformance/faults.rs"]
mod faults;
#[path = "conformance/sessions.rs"]
mod sessions;

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
