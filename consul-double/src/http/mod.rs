//! The HTTP face of the double: the axum router, the fault middleware in front of `/v1`,
//! query-parameter and JSON-body helpers, and the blocking-query machinery shared by every
//! blockable read.
//!
//! Submodules hold the handlers: [`kv`], [`session`], [`agent`] (agent, health, catalog,
//! status) and [`test_hooks`] (`/_test/...`).

pub(crate) mod agent;
pub(crate) mod kv;
pub(crate) mod session;
pub(crate) mod test_hooks;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::Router;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::duration::parse_go_duration;
use crate::error::ApiError;
use crate::faults::Faults;
use crate::server::ConnHandle;
use crate::store::{State as StoreState, Store};

/// Default `wait` of a blocking query.
const DEFAULT_WAIT: Duration = Duration::from_secs(5 * 60);
/// Longest `wait` honoured.
const MAX_WAIT: Duration = Duration::from_secs(10 * 60);
/// Jitter is up to wait / JITTER_FRACTION.
const JITTER_FRACTION: u32 = 16;

/// What every handler shares: the state store and the fault hooks.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The in-memory state.
    pub(crate) store: Store,
    /// The fault hooks.
    pub(crate) faults: Faults,
    /// Number of blocking queries parked right now.
    pub(crate) parked: AtomicUsize,
}

/// Counts a parked blocking query for as long as it lives.
struct ParkedGuard<'a>(&'a AtomicUsize);

impl<'a> ParkedGuard<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        ParkedGuard(counter)
    }
}

impl Drop for ParkedGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Handler state type.
pub(crate) type AppState = Arc<Shared>;

/// Builds the full router: `/v1` (behind the fault middleware) and `/_test`.
pub(crate) fn router(shared: AppState) -> Router {
    let v1 = Router::new()
        .route(
            "/v1/kv/",
            get(kv::get_root).put(kv::put_root).delete(kv::delete_root),
        )
        .route(
            "/v1/kv/{*key}",
            get(kv::get_key).put(kv::put_key).delete(kv::delete_key),
        )
        .route("/v1/session/create", put(session::create))
        .route("/v1/session/destroy/", put(session::missing_session))
        .route("/v1/session/destroy/{id}", put(session::destroy))
        .route("/v1/session/renew/", put(session::missing_session))
        .route("/v1/session/renew/{id}", put(session::renew))
        .route("/v1/session/info/", get(session::missing_session))
        .route("/v1/session/info/{id}", get(session::info))
        .route("/v1/session/list", get(session::list))
        .route("/v1/session/node/{node}", get(session::node))
        .route("/v1/agent/service/register", put(agent::register))
        .route("/v1/agent/service/deregister/{id}", put(agent::deregister))
        .route("/v1/agent/check/pass/{id}", put(agent::pass))
        .route("/v1/agent/check/warn/{id}", put(agent::warn))
        .route("/v1/agent/check/fail/{id}", put(agent::fail))
        .route("/v1/agent/check/update/{id}", put(agent::update))
        .route("/v1/agent/services", get(agent::services))
        .route("/v1/agent/checks", get(agent::checks))
        .route("/v1/health/service/{service}", get(agent::health_service))
        .route("/v1/catalog/service/{service}", get(agent::catalog_service))
        .route("/v1/catalog/services", get(agent::catalog_services))
        .route("/v1/status/leader", get(agent::leader))
        .route("/v1/status/peers", get(agent::peers))
        .layer(middleware::from_fn_with_state(shared.clone(), fault_layer));
    v1.merge(test_hooks::router())
        .fallback(not_found)
        .with_state(shared)
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "Invalid URL path: not a recognized HTTP API endpoint",
    )
        .into_response()
}

/// Applies stall, latency and the "no leader" fault to every `/v1` request.
async fn fault_layer(State(shared): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(until) = shared.faults.stall_until() {
        if Instant::now() < until {
            tokio::time::sleep_until(until).await;
        }
    }
    let latency = shared.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if shared.faults.error_500() {
        return ApiError::Internal("No cluster leader".into()).into_response();
    }
    next.run(req).await
}

/// Query parameters in order, with presence checks (Consul treats `?recurse` and
/// `?recurse=false` alike for most flags).
#[derive(Debug, Default)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    /// Whether the parameter is present, whatever its value.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }

    /// The first value of a parameter.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a parameter.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Parses an unsigned integer parameter; `what` names it in the 400 text.
    pub(crate) fn u64(&self, name: &str, what: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::BadRequest(format!("Invalid {what}: {v:?}")))
            })
            .transpose()
    }

    /// A boolean parameter as Consul reads it: absent → false, present and empty → true,
    /// else Go's `ParseBool`.
    pub(crate) fn bool(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None => Ok(false),
            Some("" | "1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(v) => Err(ApiError::BadRequest(format!(
                "Invalid value for ?{name}: {v:?}"
            ))),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("Invalid query: {e}")))?;
        Ok(Params(pairs))
    }
}

/// Blocking-query options from `?index=&wait=` (plus the consistency-flag conflict check).
#[derive(Clone, Debug)]
pub(crate) struct BlockOpts {
    /// `?index=` if present.
    pub(crate) index: Option<u64>,
    /// `?wait=`, defaulted and capped, before jitter.
    pub(crate) wait: Duration,
}

impl BlockOpts {
    /// Reads and validates the blocking parameters.
    pub(crate) fn from_params(p: &Params) -> Result<Self, ApiError> {
        if p.has("stale") && p.has("consistent") {
            return Err(ApiError::BadRequest(
                "Cannot specify ?stale with ?consistent, conflicting semantics.".into(),
            ));
        }
        let index = p.u64("index", "index")?;
        let wait = match p.get("wait") {
            None => DEFAULT_WAIT,
            Some(w) => parse_go_duration(w)
                .map_err(|_| ApiError::BadRequest(format!("Invalid wait time: {w:?}")))?,
        };
        Ok(BlockOpts {
            index,
            wait: wait.min(MAX_WAIT),
        })
    }

    /// The wait plus random jitter of up to wait/16.
    fn wait_with_jitter(&self) -> Duration {
        let max_jitter = (self.wait / JITTER_FRACTION).as_nanos();
        if max_jitter == 0 {
            return self.wait;
        }
        let r = uuid::Uuid::new_v4().as_u128() % (max_jitter + 1);
        self.wait + Duration::from_nanos(r as u64)
    }
}

/// Result of a blocking read.
pub(crate) enum Blocked<T> {
    /// Answer with this index (≥ 1) and data.
    Ready(u64, T),
    /// The drop fault fired while parked: the connection must be closed.
    Dropped,
}

/// Runs `query` under Consul's blocking rules: without `?index` (or with 0) answer at
/// once; otherwise park until the resource index exceeds it or the wait (plus jitter)
/// elapses. Also applies the `index_backwards_once` and `drop_blocking_queries` faults.
pub(crate) async fn blocking<T>(
    shared: &Shared,
    opts: &BlockOpts,
    query: impl Fn(&StoreState) -> (u64, T),
) -> Blocked<T> {
    let mut index_rx = shared.store.subscribe_index();
    let mut back_rx = shared.faults.subscribe_backwards();
    let mut drop_rx = shared.faults.subscribe_drop();
    index_rx.borrow_and_update();
    back_rx.borrow_and_update();
    drop_rx.borrow_and_update();
    let run = || {
        let (idx, data) = shared.store.read(&query);
        (idx.max(1), data)
    };
    let applies_backwards = opts.index.is_some();
    if applies_backwards && shared.faults.take_index_backwards() {
        return Blocked::Ready(1, run().1);
    }
    let (idx, data) = run();
    let min = match opts.index {
        Some(m) if m > 0 && idx <= m => m,
        _ => return Blocked::Ready(idx, data),
    };
    drop(data);
    let _parked = ParkedGuard::new(&shared.parked);
    let sleep = tokio::time::sleep(opts.wait_with_jitter());
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            changed = index_rx.changed() => {
                let (idx, data) = run();
                if changed.is_err() || idx > min {
                    return Blocked::Ready(idx, data);
                }
            }
            changed = back_rx.changed() => {
                if changed.is_err() || shared.faults.take_index_backwards() {
                    return Blocked::Ready(1, run().1);
                }
            }
            changed = drop_rx.changed() => {
                if changed.is_ok() {
                    return Blocked::Dropped;
                }
                let (idx, data) = run();
                return Blocked::Ready(idx, data);
            }
            _ = &mut sleep => {
                let (idx, data) = run();
                return Blocked::Ready(idx, data);
            }
        }
    }
}

/// Runs a blocking read and renders it; a dropped query closes the connection (or
/// answers 500 without a connection handle).
pub(crate) async fn respond_blocking<T>(
    shared: &Shared,
    opts: &BlockOpts,
    conn: Option<ConnHandle>,
    query: impl Fn(&StoreState) -> (u64, T),
    render: impl FnOnce(u64, T) -> Response,
) -> Response {
    match blocking(shared, opts, query).await {
        Blocked::Ready(idx, data) => render(idx, data),
        Blocked::Dropped => match conn {
            Some(handle) => {
                handle.kill();
                // The connection task drops this future together with the connection.
                std::future::pending::<Response>().await
            }
            None => {
                ApiError::Internal("blocking query dropped by consul-double".into()).into_response()
            }
        },
    }
}

/// The headers Consul sets on blockable reads.
pub(crate) fn meta_headers(idx: u64) -> [(HeaderName, HeaderValue); 3] {
    [
        (
            HeaderName::from_static("x-consul-index"),
            HeaderValue::from(idx),
        ),
        (
            HeaderName::from_static("x-consul-knownleader"),
            HeaderValue::from_static("true"),
        ),
        (
            HeaderName::from_static("x-consul-lastcontact"),
            HeaderValue::from_static("0"),
        ),
    ]
}

/// A 200 JSON response.
pub(crate) fn json<T: Serialize + ?Sized>(body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            bytes,
        )
            .into_response(),
        Err(e) => ApiError::Internal(format!("encode failed: {e}")).into_response(),
    }
}

/// A 200 JSON response carrying the blocking-query headers.
pub(crate) fn json_with_index<T: Serialize + ?Sized>(idx: u64, body: &T) -> Response {
    (meta_headers(idx), json(body)).into_response()
}

/// A 404 with an empty body and the blocking-query headers.
pub(crate) fn not_found_with_index(idx: u64) -> Response {
    (StatusCode::NOT_FOUND, meta_headers(idx)).into_response()
}

/// Case- and underscore-insensitive access to a JSON object, the way Consul's decoder
/// matches `Name`, `name` and snake_case keys alike.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fields<'a>(pub(crate) &'a Map<String, Value>);

fn normalize(k: &str) -> String {
    k.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

fn decode_err(name: &str, want: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "Request decode failed: field {name:?} must be {want}"
    ))
}

impl<'a> Fields<'a> {
    /// Wraps a JSON value that must be an object (or `null`, treated as empty).
    pub(crate) fn of(v: &'a Value, empty: &'a Map<String, Value>) -> Result<Self, ApiError> {
        match v {
            Value::Object(m) => Ok(Fields(m)),
            Value::Null => Ok(Fields(empty)),
            _ => Err(ApiError::BadRequest(
                "Request decode failed: body must be a JSON object".into(),
            )),
        }
    }

    /// The value of a field whose normalized name matches; JSON `null` counts as absent.
    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        let want = normalize(name);
        self.0
            .iter()
            .find(|(k, _)| normalize(k) == want)
            .map(|(_, v)| v)
            .filter(|v| !v.is_null())
    }

    /// Whether the field is present at all (even as `null`).
    pub(crate) fn present(&self, name: &str) -> bool {
        let want = normalize(name);
        self.0.keys().any(|k| normalize(k) == want)
    }

    /// A string field.
    pub(crate) fn str(&self, name: &str) -> Result<Option<String>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(decode_err(name, "a string")),
        }
    }

    /// A list-of-strings field.
    pub(crate) fn str_list(&self, name: &str) -> Result<Option<Vec<String>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(decode_err(name, "a list of strings")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(decode_err(name, "a list of strings")),
        }
    }

    /// An integer field.
    pub(crate) fn int(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map(Some)
                .ok_or_else(|| decode_err(name, "an integer")),
            Some(_) => Err(decode_err(name, "an integer")),
        }
    }

    /// A boolean field.
    pub(crate) fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(decode_err(name, "a boolean")),
        }
    }

    /// A nested object field.
    pub(crate) fn obj(&self, name: &str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(Fields(m))),
            Some(_) => Err(decode_err(name, "an object")),
        }
    }
}

/// Parses a request body as JSON; an empty body is `null`.
pub(crate) fn parse_json_body(body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("Request decode failed: {e}")))
}
