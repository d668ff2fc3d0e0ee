//! The endpoints the jobs go to: lanes whose behaviour the operations switch (answer at once,
//! fail, 429, hang, flaky), the URLs notices are sent to, and the readiness probes' URL. Every
//! request is recorded as an [`Arrival`] with the wall-clock time it arrived (the Directors
//! write their rows with the same clock, so arrivals and rows compare).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use chrono::{DateTime, Utc};
use rand::Rng;

/// A job header that makes its lane answer this status whatever its mode (a job that fails
/// for good: `400` is discarded, `503` retries until it expires).
pub const WANT: &str = "x-want";
/// A job header: answer 503 to this job's first n attempts, then follow the lane's mode.
pub const FAIL_FIRST: &str = "x-fail-first";

/// How a lane answers now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Ok,
    /// 503.
    Fail,
    /// 429 with `Retry-After: 1`.
    TooMany,
    /// Never answers (the job's `execution_timeout_ms` ends the attempt).
    Hang,
    /// 503 for a third of the requests, at random.
    Flaky,
}

/// One request an endpoint received.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// The `spindle-job-id` header.
    pub job: String,
    /// The `spindle-attempt` header.
    pub attempt: u16,
    /// `lane/<name>`, `notice/<name>` or `probe`.
    pub path: String,
    pub at: DateTime<Utc>,
    /// The status answered; 0 for a request left hanging.
    pub status: u16,
    /// Notices only: the body.
    pub body: Option<serde_json::Value>,
    /// Lanes only: the request's body, as it came.
    pub payload: Option<bytes::Bytes>,
    /// The `traceparent` header: the attempt's span.
    pub traceparent: Option<String>,
}

impl Arrival {
    /// Whether this answer ends the job on the Director's side (2xx, or a 4xx other than
    /// 408/425/429: the job is not tried again).
    pub fn is_final_answer(&self) -> bool {
        (200..300).contains(&self.status)
            || ((400..500).contains(&self.status) && ![408, 425, 429].contains(&self.status))
    }
}

#[derive(Default)]
struct Shared {
    modes: Mutex<HashMap<String, Mode>>,
    log: Mutex<Vec<Arrival>>,
}

/// The recording endpoint server.
pub struct Endpoint {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    pub async fn start() -> Endpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/lane/{name}", any(lane))
            .route("/notice/{name}", any(notice))
            .route("/probe", any(probe))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Endpoint { addr, shared, task }
    }

    pub fn lane_url(&self, lane: &str) -> String {
        format!("http://{}/lane/{lane}", self.addr)
    }

    pub fn notice_url(&self, name: &str) -> String {
        format!("http://{}/notice/{name}", self.addr)
    }

    pub fn probe_url(&self) -> String {
        format!("http://{}/probe", self.addr)
    }

    pub fn set_mode(&self, lane: &str, mode: Mode) {
        self.shared
            .modes
            .lock()
            .unwrap()
            .insert(lane.to_owned(), mode);
    }

    /// Every lane back to answering at once.
    pub fn all_ok(&self) {
        self.shared.modes.lock().unwrap().clear();
    }

    pub fn arrivals(&self) -> Vec<Arrival> {
        self.shared.log.lock().unwrap().clone()
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn note(
    s: &Shared,
    headers: &HeaderMap,
    path: String,
    status: u16,
    body: Option<serde_json::Value>,
    payload: Option<bytes::Bytes>,
) {
    let arrival = Arrival {
        job: header(headers, "spindle-job-id").to_owned(),
        attempt: header(headers, "spindle-attempt").parse().unwrap_or(0),
        path,
        at: Utc::now(),
        status,
        body,
        payload,
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    s.log.lock().unwrap().push(arrival);
}

async fn lane(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    payload: bytes::Bytes,
) -> Response {
    let mode = s
        .modes
        .lock()
        .unwrap()
        .get(&name)
        .copied()
        .unwrap_or(Mode::Ok);
    let attempt: u32 = header(&headers, "spindle-attempt").parse().unwrap_or(0);
    let fail_first: u32 = header(&headers, FAIL_FIRST).parse().unwrap_or(0);
    let want: Option<u16> = header(&headers, WANT).parse().ok();
    let path = format!("lane/{name}");
    let status = match (want, mode) {
        (Some(code), _) => code,
        _ if attempt <= fail_first => 503,
        (None, Mode::Ok) => 200,
        (None, Mode::Fail) => 503,
        (None, Mode::TooMany) => 429,
        (None, Mode::Flaky) => {
            if rand::rng().random_range(0..3) == 0 {
                503
            } else {
                200
            }
        }
        (None, Mode::Hang) => {
            note(&s, &headers, path, 0, None, Some(payload));
            tokio::time::sleep(Duration::from_secs(30)).await;
            return StatusCode::OK.into_response();
        }
    };
    note(&s, &headers, path, status, None, Some(payload));
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status == 429 {
        (code, [("retry-after", "1")], "slow down").into_response()
    } else {
        code.into_response()
    }
}

async fn notice(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: bytes::Bytes,
) -> StatusCode {
    let body = serde_json::from_slice(&body).ok();
    note(&s, &headers, format!("notice/{name}"), 200, body, None);
    StatusCode::OK
}

async fn probe(State(s): State<Arc<Shared>>, headers: HeaderMap) -> StatusCode {
    note(&s, &headers, "probe".into(), 200, None, None);
    StatusCode::OK
}
