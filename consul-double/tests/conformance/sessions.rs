//! Locks and sessions: acquire and release, lock-delay, session create, renew, TTL expiry and
//! the delete behavior.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{b64, index_of, poll_until, start, start_with};

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
