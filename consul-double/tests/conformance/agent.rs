//! Agent, health and catalog: service registration, TTL checks, and sessions tied to a
//! service's check.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{index_of, start};

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
