//! `/v1/session/...` handlers: create (body decoding with Consul's LockDelay and Checks
//! fix-ups), destroy, renew (with the renew-fails fault), info, list and node (blocking).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::Extension;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    json, json_with_index, parse_json_body, respond_blocking, AppState, BlockOpts, Fields, Params,
};
use crate::duration::parse_go_duration_ns;
use crate::error::ApiError;
use crate::server::ConnHandle;
use crate::store::session::{ServiceCheckRef, SessionSpec, SERF_CHECK_ID};
use crate::store::Session;

/// Numbers (or parsed strings) below this many nanoseconds are taken as seconds.
const LOCK_DELAY_MIN_THRESHOLD: i64 = 1000;
/// Default LockDelay: 15s.
const DEFAULT_LOCK_DELAY_NS: i64 = 15_000_000_000;

/// A session entry as Consul renders it.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct SessionJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    name: &'a str,
    node: &'a str,
    lock_delay: i64,
    behavior: &'static str,
    #[serde(rename = "TTL")]
    ttl: &'a str,
    node_checks: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    checks: Option<&'a [String]>,
    service_checks: Option<Vec<ServiceCheckJson<'a>>>,
    create_index: u64,
    modify_index: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ServiceCheckJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    namespace: &'a str,
}

impl<'a> From<&'a Session> for SessionJson<'a> {
    fn from(s: &'a Session) -> Self {
        SessionJson {
            id: &s.id,
            name: &s.name,
            node: &s.node,
            lock_delay: s.lock_delay_ns,
            behavior: s.behavior.as_str(),
            ttl: &s.ttl,
            node_checks: &s.node_checks,
            checks: s.checks.as_deref(),
            service_checks: s.service_checks.as_ref().map(|v| {
                v.iter()
                    .map(|c| ServiceCheckJson {
                        id: &c.id,
                        namespace: &c.namespace,
                    })
                    .collect()
            }),
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

fn sessions_json(sessions: &[Session]) -> Vec<SessionJson<'_>> {
    sessions.iter().map(SessionJson::from).collect()
}

/// `LockDelay` as Consul's `FixupLockDelay` reads it: a duration string or a number of
/// nanoseconds, values under 1000 taken as seconds.
fn lock_delay(v: &Value) -> Result<i64, ApiError> {
    let ns = match v {
        Value::String(s) => parse_go_duration_ns(s)
            .map_err(|e| ApiError::BadRequest(format!("Request decode failed: {e}")))?,
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .ok_or_else(|| {
                ApiError::BadRequest("Request decode failed: invalid LockDelay".into())
            })?,
        _ => {
            return Err(ApiError::BadRequest(
                "Request decode failed: LockDelay must be a duration string or a number".into(),
            ))
        }
    };
    Ok(if ns < LOCK_DELAY_MIN_THRESHOLD {
        ns.saturating_mul(1_000_000_000)
    } else {
        ns
    })
}

/// Decodes a create body into a spec, applying Consul's defaults and fix-ups.
fn decode_create(body: &[u8], node_name: &str) -> Result<SessionSpec, ApiError> {
    let value = parse_json_body(body)?;
    let empty = Map::new();
    let f = Fields::of(&value, &empty)?;
    let lock_delay_ns = match f.get("LockDelay") {
        Some(v) => lock_delay(v)?,
        None => DEFAULT_LOCK_DELAY_NS,
    };
    let node_checks = if f.present("NodeChecks") {
        f.str_list("NodeChecks")?.unwrap_or_default()
    } else {
        vec![SERF_CHECK_ID.to_string()]
    };
    let checks = if f.present("Checks") {
        Some(f.str_list("Checks")?.unwrap_or_default())
    } else {
        None
    };
    // fixupEmptySessionChecks: `"Checks": []` clears the default serfHealth node check; the
    // legacy default `["serfHealth"]` in Checks defers to NodeChecks.
    let (node_checks, checks) = match checks {
        Some(c) if c.is_empty() => (Vec::new(), None),
        Some(c) if c.len() == 1 && c[0] == SERF_CHECK_ID => (node_checks, None),
        other => (node_checks, other),
    };
    let service_checks = match f.get("ServiceChecks") {
        None => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|item| {
                    let inner = Fields::of(item, &empty)?;
                    Ok(ServiceCheckRef {
                        id: inner.str("ID")?.unwrap_or_default(),
                        namespace: inner.str("Namespace")?.unwrap_or_default(),
                    })
                })
                .collect::<Result<Vec<_>, ApiError>>()?,
        ),
        Some(_) => {
            return Err(ApiError::BadRequest(
                "Request decode failed: ServiceChecks must be a list".into(),
            ))
        }
    };
    Ok(SessionSpec {
        name: f.str("Name")?.unwrap_or_default(),
        node: match f.get("Node") {
            None => node_name.to_string(),
            Some(_) => f.str("Node")?.unwrap_or_default(),
        },
        lock_delay_ns,
        behavior: f.str("Behavior")?.unwrap_or_default(),
        ttl: f.str("TTL")?.unwrap_or_default(),
        node_checks,
        checks,
        service_checks,
    })
}

/// `PUT /v1/session/create`.
pub(crate) async fn create(
    State(shared): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let node_name = shared.store.read(|st| st.config.node_name.clone());
    let spec = decode_create(&body, &node_name)?;
    let id = shared.store.write(|st| st.session_create(spec))?;
    #[derive(Serialize)]
    struct Created {
        #[serde(rename = "ID")]
        id: String,
    }
    Ok(json(&Created { id }))
}

/// `/v1/session/{destroy,renew,info}/` with no ID: 400 `Missing session`.
pub(crate) async fn missing_session() -> ApiError {
    ApiError::BadRequest("Missing session".into())
}

/// `PUT /v1/session/destroy/:id`: invalidates the session; `true` even when unknown.
pub(crate) async fn destroy(State(shared): State<AppState>, Path(id): Path<String>) -> Response {
    shared.store.write(|st| st.session_invalidate(&id));
    json(&true)
}

/// `PUT /v1/session/renew/:id`: `[entry]`, or 404 text when unknown (or the fault is on).
pub(crate) async fn renew(
    State(shared): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let not_found = || ApiError::NotFound(format!("Session id '{id}' not found"));
    if shared.faults.renew_fails() {
        return Err(not_found());
    }
    let session = shared
        .store
        .write(|st| st.session_renew(&id))
        .ok_or_else(not_found)?;
    Ok(json(&[SessionJson::from(&session)]))
}

/// `GET /v1/session/info/:id`: `[entry]` or `[]`; blocking on the sessions index.
pub(crate) async fn info(
    State(shared): State<AppState>,
    Path(id): Path<String>,
    params: Params,
    conn: Option<Extension<ConnHandle>>,
) -> Result<Response, ApiError> {
    let opts = BlockOpts::from_params(&params)?;
    Ok(respond_blocking(
        &shared,
        &opts,
        conn.map(|c| c.0),
        move |st| {
            let found: Vec<Session> = st.sessions.get(&id).cloned().into_iter().collect();
            (st.sessions_index, found)
        },
        |idx, sessions| json_with_index(idx, &sessions_json(&sessions)),
    )
    .await)
}

/// `GET /v1/session/list`: every session; blocking on the sessions index.
pub(crate) async fn list(
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
            let all: Vec<Session> = st.sessions.values().cloned().collect();
            (st.sessions_index, all)
        },
        |idx, sessions| json_with_index(idx, &sessions_json(&sessions)),
    )
    .await)
}

/// `GET /v1/session/node/:node`: the node's sessions; blocking on the sessions index.
pub(crate) async fn node(
    State(shared): State<AppState>,
    Path(node): Path<String>,
    params: Params,
    conn: Option<Extension<ConnHandle>>,
) -> Result<Response, ApiError> {
    let opts = BlockOpts::from_params(&params)?;
    Ok(respond_blocking(
        &shared,
        &opts,
        conn.map(|c| c.0),
        move |st| {
            let mine: Vec<Session> = st
                .sessions
                .values()
                .filter(|s| s.node == node)
                .cloned()
                .collect();
            (st.sessions_index, mine)
        },
        |idx, sessions| json_with_index(idx, &sessions_json(&sessions)),
    )
    .await)
}
