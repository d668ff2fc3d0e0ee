//! Agent, health, catalog and status handlers: service register/deregister with TTL
//! checks, check pass/warn/fail/update, `GET /v1/health/service/:name[?passing]`,
//! `GET /v1/catalog/service/:name`, `GET /v1/catalog/services`, and `/v1/status/*`.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json as j, Map, Value};

use super::{
    json, json_with_index, parse_json_body, respond_blocking, AppState, BlockOpts, Fields, Params,
};
use crate::duration::parse_go_duration;
use crate::error::ApiError;
use crate::server::ConnHandle;
use crate::store::agent::{CheckSpec, ServiceSpec};
use crate::store::session::SERF_CHECK_ID;
use crate::store::{Check, CheckStatus, Service, State as StoreState};

/// The node address every instance reports.
const NODE_ADDRESS: &str = "127.0.0.1";
/// The datacenter name.
const DATACENTER: &str = "dc1";
/// Check fields that mean a check type the double does not run.
const UNSUPPORTED_CHECK_TYPES: &[&str] = &[
    "HTTP",
    "TCP",
    "UDP",
    "GRPC",
    "H2PING",
    "Args",
    "ScriptArgs",
    "Script",
    "DockerContainerID",
    "AliasService",
    "AliasNode",
    "OSService",
];

fn decode_check(f: Fields<'_>) -> Result<CheckSpec, ApiError> {
    let ttl = match f.str("TTL")? {
        Some(s) => parse_go_duration(&s)
            .map_err(|e| ApiError::BadRequest(format!("Invalid check TTL {s:?}: {e}")))?,
        None => {
            if UNSUPPORTED_CHECK_TYPES.iter().any(|t| f.present(t)) {
                return Err(ApiError::BadRequest(
                    "consul-double supports only TTL checks".into(),
                ));
            }
            return Err(ApiError::BadRequest(
                "Check is not valid: missing TTL".into(),
            ));
        }
    };
    if ttl.is_zero() {
        return Err(ApiError::BadRequest(
            "Invalid check: TTL must be > 0 for TTL checks".into(),
        ));
    }
    let status = match f.str("Status")? {
        None => None,
        Some(s) if s.is_empty() => None,
        Some(s) => Some(CheckStatus::parse(&s).ok_or_else(|| {
            ApiError::BadRequest(format!("Invalid initial health check status: {s:?}"))
        })?),
    };
    let id = match f.str("CheckID")? {
        Some(id) if !id.is_empty() => Some(id),
        _ => f.str("ID")?.filter(|s| !s.is_empty()),
    };
    Ok(CheckSpec {
        id,
        name: f.str("Name")?.filter(|s| !s.is_empty()),
        ttl,
        status,
        notes: f.str("Notes")?.unwrap_or_default(),
    })
}

fn validate_meta(meta: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bad = |why: String| ApiError::BadRequest(format!("Invalid Service Meta: {why}"));
    if meta.len() > 64 {
        return Err(bad("more than 64 pairs".into()));
    }
    for (k, v) in meta {
        if k.is_empty()
            || k.len() > 128
            || !k
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(bad(format!("invalid key {k:?}")));
        }
        if k.starts_with("consul-") {
            return Err(bad(format!("key {k:?} uses the reserved 'consul-' prefix")));
        }
        if v.len() > 512 {
            return Err(bad(format!("value of {k:?} is longer than 512 bytes")));
        }
    }
    Ok(())
}

fn decode_service(body: &[u8]) -> Result<ServiceSpec, ApiError> {
    let value = parse_json_body(body)?;
    let empty = Map::new();
    let f = Fields::of(&value, &empty)?;
    let name = f.str("Name")?.unwrap_or_default();
    if name.is_empty() {
        return Err(ApiError::BadRequest("Missing service name".into()));
    }
    let id = f
        .str("ID")?
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| name.clone());
    let mut meta = BTreeMap::new();
    if let Some(m) = f.obj("Meta")? {
        for (k, v) in m.0 {
            match v {
                Value::String(s) => {
                    meta.insert(k.clone(), s.clone());
                }
                _ => {
                    return Err(ApiError::BadRequest(
                        "Request decode failed: Meta values must be strings".into(),
                    ))
                }
            }
        }
    }
    validate_meta(&meta)?;
    let (mut passing, mut warning) = (1, 1);
    if let Some(w) = f.obj("Weights")? {
        passing = w.int("Passing")?.unwrap_or(1);
        warning = w.int("Warning")?.unwrap_or(1);
        if passing < 1 {
            return Err(ApiError::BadRequest(
                "Passing must be greater than 0".into(),
            ));
        }
    }
    let mut checks = Vec::new();
    if let Some(c) = f.obj("Check")? {
        checks.push(decode_check(c)?);
    }
    match f.get("Checks") {
        None => {}
        Some(Value::Array(items)) => {
            for item in items {
                checks.push(decode_check(Fields::of(item, &empty)?)?);
            }
        }
        Some(_) => {
            return Err(ApiError::BadRequest(
                "Request decode failed: Checks must be a list".into(),
            ))
        }
    }
    Ok(ServiceSpec {
        id,
        name,
        tags: f.str_list("Tags")?.unwrap_or_default(),
        address: f.str("Address")?.unwrap_or_default(),
        port: f.int("Port")?.unwrap_or(0),
        meta,
        weights_passing: passing,
        weights_warning: warning,
        enable_tag_override: f.bool("EnableTagOverride")?.unwrap_or(false),
        checks,
    })
}

/// `PUT /v1/agent/service/register[?replace-existing-checks]`.
pub(crate) async fn register(
    State(shared): State<AppState>,
    params: Params,
    body: Bytes,
) -> Result<Response, ApiError> {
    let spec = decode_service(&body)?;
    let replace = params.has("replace-existing-checks");
    shared.store.write(|st| st.service_register(spec, replace));
    Ok(().into_response())
}

/// `PUT /v1/agent/service/deregister/:id`: 200, no-op when unknown.
pub(crate) async fn deregister(State(shared): State<AppState>, Path(id): Path<String>) -> Response {
    shared.store.write(|st| st.service_deregister(&id));
    ().into_response()
}

async fn set_status(
    shared: &AppState,
    id: &str,
    status: CheckStatus,
    output: String,
) -> Result<Response, ApiError> {
    shared
        .store
        .write(|st| st.check_update(id, status, output))?;
    Ok(().into_response())
}

/// `PUT /v1/agent/check/pass/:id[?note=]`.
pub(crate) async fn pass(
    State(shared): State<AppState>,
    Path(id): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let note = params.get("note").unwrap_or_default().to_string();
    set_status(&shared, &id, CheckStatus::Passing, note).await
}

/// `PUT /v1/agent/check/warn/:id[?note=]`.
pub(crate) async fn warn(
    State(shared): State<AppState>,
    Path(id): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let note = params.get("note").unwrap_or_default().to_string();
    set_status(&shared, &id, CheckStatus::Warning, note).await
}

/// `PUT /v1/agent/check/fail/:id[?note=]`.
pub(crate) async fn fail(
    State(shared): State<AppState>,
    Path(id): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let note = params.get("note").unwrap_or_default().to_string();
    set_status(&shared, &id, CheckStatus::Critical, note).await
}

/// `PUT /v1/agent/check/update/:id` with `{"Status", "Output"}`.
pub(crate) async fn update(
    State(shared): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let value = parse_json_body(&body)?;
    let empty = Map::new();
    let f = Fields::of(&value, &empty)?;
    let status_text = f.str("Status")?.unwrap_or_default();
    let status = CheckStatus::parse(&status_text)
        .ok_or_else(|| ApiError::BadRequest(format!("Invalid check status: '{status_text}'")))?;
    let output = f.str("Output")?.unwrap_or_default();
    set_status(&shared, &id, status, output).await
}

fn check_json(c: &Check, node: &str, tags: &[String]) -> Value {
    j!({
        "Node": node,
        "CheckID": c.id,
        "Name": c.name,
        "Status": c.status.as_str(),
        "Notes": c.notes,
        "Output": c.output,
        "ServiceID": c.service_id,
        "ServiceName": c.service_name,
        "ServiceTags": tags,
        "Type": "ttl",
        "Definition": {},
        "CreateIndex": c.create_index,
        "ModifyIndex": c.modify_index,
    })
}

fn serf_check_json(node: &str) -> Value {
    j!({
        "Node": node,
        "CheckID": SERF_CHECK_ID,
        "Name": "Serf Health Status",
        "Status": "passing",
        "Notes": "",
        "Output": "Agent alive and reachable",
        "ServiceID": "",
        "ServiceName": "",
        "ServiceTags": [],
        "Type": "",
        "Definition": {},
        "CreateIndex": 1,
        "ModifyIndex": 1,
    })
}

fn tagged_addresses() -> Value {
    j!({
        "lan": NODE_ADDRESS,
        "lan_ipv4": NODE_ADDRESS,
        "wan": NODE_ADDRESS,
        "wan_ipv4": NODE_ADDRESS,
    })
}

fn node_json(st: &StoreState) -> Value {
    j!({
        "ID": st.node_id,
        "Node": st.config.node_name,
        "Address": NODE_ADDRESS,
        "Datacenter": DATACENTER,
        "TaggedAddresses": tagged_addresses(),
        "Meta": {"consul-network-segment": ""},
        "CreateIndex": 1,
        "ModifyIndex": 1,
    })
}

fn service_json(s: &Service) -> Value {
    j!({
        "ID": s.id,
        "Service": s.name,
        "Tags": s.tags,
        "Address": s.address,
        "TaggedAddresses": {},
        "Meta": s.meta,
        "Port": s.port,
        "Weights": {"Passing": s.weights_passing, "Warning": s.weights_warning},
        "EnableTagOverride": s.enable_tag_override,
        "Datacenter": DATACENTER,
        "CreateIndex": s.create_index,
        "ModifyIndex": s.modify_index,
    })
}

/// Instances of `name` carrying every tag in `tags`.
fn instances<'a>(
    st: &'a StoreState,
    name: &'a str,
    tags: &'a [String],
) -> impl Iterator<Item = &'a Service> + 'a {
    st.services
        .values()
        .filter(move |s| s.name == name && tags.iter().all(|t| s.tags.contains(t)))
}

fn reject_filter(params: &Params) -> Result<(), ApiError> {
    if params.has("filter") {
        return Err(ApiError::BadRequest(
            "consul-double does not support ?filter expressions".into(),
        ));
    }
    Ok(())
}

/// `GET /v1/health/service/:service[?passing][&tag=]`: blocking on the health index.
pub(crate) async fn health_service(
    State(shared): State<AppState>,
    Path(service): Path<String>,
    params: Params,
    conn: Option<Extension<ConnHandle>>,
) -> Result<Response, ApiError> {
    let opts = BlockOpts::from_params(&params)?;
    reject_filter(&params)?;
    let passing_only = params.bool("passing")?;
    let tags: Vec<String> = params.all("tag").map(str::to_string).collect();
    Ok(respond_blocking(
        &shared,
        &opts,
        conn.map(|c| c.0),
        move |st| {
            let node = node_json(st);
            let entries: Vec<Value> = instances(st, &service, &tags)
                .filter_map(|s| {
                    let checks = st.service_checks(&s.id);
                    if passing_only && checks.iter().any(|c| c.status != CheckStatus::Passing) {
                        return None;
                    }
                    let mut all = vec![serf_check_json(&st.config.node_name)];
                    all.extend(
                        checks
                            .iter()
                            .map(|c| check_json(c, &st.config.node_name, &s.tags)),
                    );
                    Some(j!({"Node": node, "Service": service_json(s), "Checks": all}))
                })
                .collect();
            (st.health_index, entries)
        },
        |idx, entries| json_with_index(idx, &entries),
    )
    .await)
}

/// `GET /v1/catalog/service/:service[?tag=]`: flat instances, no health filtering.
pub(crate) async fn catalog_service(
    State(shared): State<AppState>,
    Path(service): Path<String>,
    params: Params,
    conn: Option<Extension<ConnHandle>>,
) -> Result<Response, ApiError> {
    let opts = BlockOpts::from_params(&params)?;
    reject_filter(&params)?;
    let tags: Vec<String> = params.all("tag").map(str::to_string).collect();
    Ok(respond_blocking(
        &shared,
        &opts,
        conn.map(|c| c.0),
        move |st| {
            let entries: Vec<Value> = instances(st, &service, &tags)
                .map(|s| {
                    j!({
                        "ID": st.node_id,
                        "Node": st.config.node_name,
                        "Address": NODE_ADDRESS,
                        "Datacenter": DATACENTER,
                        "TaggedAddresses": tagged_addresses(),
                        "NodeMeta": {"consul-network-segment": ""},
                        "ServiceKind": "",
                        "ServiceID": s.id,
                        "ServiceName": s.name,
                        "ServiceTags": s.tags,
                        "ServiceAddress": s.address,
                        "ServiceTaggedAddresses": {},
                        "ServiceWeights": {"Passing": s.weights_passing, "Warning": s.weights_warning},
                        "ServiceMeta": s.meta,
                        "ServicePort": s.port,
                        "ServiceEnableTagOverride": s.enable_tag_override,
                        "CreateIndex": s.create_index,
                        "ModifyIndex": s.modify_index,
                    })
                })
                .collect();
            (st.health_index, entries)
        },
        |idx, entries| json_with_index(idx, &entries),
    )
    .await)
}

/// `GET /v1/catalog/services`: service name → union of tags (plus the `consul` service).
pub(crate) async fn catalog_services(
    State(shared): State<AppState>,
    params: Params,
    conn: Option<Extension<ConnHandle>>,
) -> Result<Response, ApiError> {
    let opts = BlockOpts::from_params(&params)?;
    Ok(respond_blocking(
        &shared,
        &opts,
        conn.map(|c| c.0),
        |st| {
            let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
            names.insert("consul".into(), Vec::new());
            for s in st.services.values() {
                let tags = names.entry(s.name.clone()).or_default();
                for t in &s.tags {
                    if !tags.contains(t) {
                        tags.push(t.clone());
                    }
                }
            }
            (st.health_index, names)
        },
        |idx, names| json_with_index(idx, &names),
    )
    .await)
}

/// `GET /v1/agent/services`: the agent's local services by ID.
pub(crate) async fn services(State(shared): State<AppState>) -> Response {
    let body = shared.store.read(|st| {
        st.services
            .values()
            .map(|s| (s.id.clone(), service_json(s)))
            .collect::<BTreeMap<_, _>>()
    });
    json(&body)
}

/// `GET /v1/agent/checks`: the agent's local checks by ID.
pub(crate) async fn checks(State(shared): State<AppState>) -> Response {
    let body = shared.store.read(|st| {
        st.checks
            .values()
            .map(|c| {
                let tags = st
                    .services
                    .get(&c.service_id)
                    .map(|s| s.tags.clone())
                    .unwrap_or_default();
                (c.id.clone(), check_json(c, &st.config.node_name, &tags))
            })
            .collect::<BTreeMap<_, _>>()
    });
    json(&body)
}

/// `GET /v1/status/leader`: the (fake) raft leader address; clients use it as a ping.
pub(crate) async fn leader() -> Response {
    json("127.0.0.1:8300")
}

/// `GET /v1/status/peers`: the (fake) raft peer set.
pub(crate) async fn peers() -> Response {
    json(&["127.0.0.1:8300"])
}
