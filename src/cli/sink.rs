//! A local HTTP endpoint that records what it receives: the receiving side of demos, the
//! benchmark and the tests (`spindle sink` runs it alone).
//!
//! Behaviour is chosen by path, per request:
//! `/ok` 200 · `/status/{code}` that status · `/fail/{n}` 500 for a job's first n attempts, then
//! 200, keeping each body, its `x-` headers and its trace context · `/flaky/{percent}` 503 at random (a request
//! with an `x-sink-status` header gets that status instead: one job of many on the same URL
//! can fail for good) · `/hang` never answers · `/slow/{ms}` answers after a
//! delay · `/retry-after/{secs}` 429 with `Retry-After` on a job's first attempt, then 200 ·
//! `/redirect/{code}` that 3xx status pointing at `/ok` · `/capture` 200, keeping the body and
//! the `webhook-*` headers (for signature checks) and an event's `spindle-event-*` and
//! `spindle-subscription-id` headers · `/down-until/{unix_ms}` 503 until then ·
//! `/outage/{from_ms}/{until_ms}` 500 in that window, 200 outside it.
//!
//! Hostile answers, for the tests that a receiver cannot stop a Director:
//! `/answer/{status}/retry-after/{value}` that status with `Retry-After: value` (any text, e.g.
//! `99999999999999` or a percent-encoded HTTP date) · `/big/{status}/{bytes}` that status with a
//! body of that many bytes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use rand::Rng;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::delivery::{ATTEMPT_HEADER, JOB_ID_HEADER};

/// A request header that makes `/flaky/{percent}` answer the status it names.
pub const STATUS_HEADER: &str = "x-sink-status";

/// One request the sink received.
#[derive(Clone, Debug)]
pub struct Received {
    /// The `spindle-job-id` header.
    pub job_id: String,
    /// The `spindle-attempt` header.
    pub attempt: u16,
    /// The path requested.
    pub path: String,
    /// When it arrived.
    pub at: Instant,
    /// The status answered (0 for `/hang`).
    pub status: u16,
    /// For `/capture`: the `webhook-*` headers.
    pub headers: Vec<(String, String)>,
    /// For `/capture`: the body.
    pub body: bytes::Bytes,
}

#[derive(Default)]
struct Record {
    log: Vec<Received>,
    per_job: HashMap<String, u32>,
}

#[derive(Default)]
struct Shared {
    record: Mutex<Record>,
    total: AtomicU64,
    /// Requests to `/ok`.
    ok: AtomicU64,
    /// Count requests only, keep no log (benchmarks: the endpoint should cost little).
    counting: bool,
}

impl Shared {
    /// Notes a request and returns how many times this job was seen, this one included.
    fn note(&self, headers: &HeaderMap, path: &str, status: u16) -> u32 {
        self.note_with(headers, path, status, Vec::new(), bytes::Bytes::new())
    }

    fn note_with(
        &self,
        headers: &HeaderMap,
        path: &str,
        status: u16,
        kept: Vec<(String, String)>,
        body: bytes::Bytes,
    ) -> u32 {
        self.total.fetch_add(1, Ordering::Relaxed);
        if path == "/ok" {
            self.ok.fetch_add(1, Ordering::Relaxed);
        }
        if self.counting {
            return 1;
        }
        let job_id = header_str(headers, JOB_ID_HEADER).to_owned();
        let attempt = header_str(headers, ATTEMPT_HEADER).parse().unwrap_or(0);
        let mut record = self.record.lock().unwrap_or_else(|p| p.into_inner());
        let seen = record.per_job.entry(job_id.clone()).or_insert(0);
        *seen += 1;
        let seen = *seen;
        record.log.push(Received {
            job_id,
            attempt,
            path: path.to_owned(),
            at: Instant::now(),
            status,
            headers: kept,
            body,
        });
        seen
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A running sink.
pub struct Sink {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    /// Starts a sink on `addr` (port 0 picks a free one).
    pub async fn start(addr: SocketAddr) -> std::io::Result<Sink> {
        Self::start_with(addr, false).await
    }

    /// A sink that only counts requests (no log: [`Sink::received`] and [`Sink::per_job`]
    /// stay empty), for benchmarks.
    pub async fn start_counting(addr: SocketAddr) -> std::io::Result<Sink> {
        Self::start_with(addr, true).await
    }

    async fn start_with(addr: SocketAddr, counting: bool) -> std::io::Result<Sink> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            counting,
            ..Shared::default()
        });
        let app = Router::new()
            .route("/ok", any(ok))
            .route("/status/{code}", any(status))
            .route("/fail/{n}", any(fail))
            .route("/flaky/{percent}", any(flaky))
            .route("/down-until/{unix_ms}", any(down_until))
            .route("/outage/{from_ms}/{until_ms}", any(outage))
            .route("/hang", any(hang))
            .route("/slow/{ms}", any(slow))
            .route("/retry-after/{secs}", any(retry_after))
            .route("/redirect/{code}", any(redirect))
            .route("/capture", any(capture))
            .route(
                "/answer/{status}/retry-after/{value}",
                any(answer_retry_after),
            )
            .route("/big/{status}/{bytes}", any(big))
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "sink stopped with an error");
            }
        });
        Ok(Sink {
            addr,
            shared,
            stop,
            task,
        })
    }

    /// The sink's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL of `path` on this sink.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Requests received so far.
    pub fn total(&self) -> u64 {
        self.shared.total.load(Ordering::Relaxed)
    }

    /// Requests to `/ok` received so far.
    pub fn ok_total(&self) -> u64 {
        self.shared.ok.load(Ordering::Relaxed)
    }

    /// Every request received, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.shared
            .record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .log
            .clone()
    }

    /// Requests received per job id.
    pub fn per_job(&self) -> HashMap<String, u32> {
        self.shared
            .record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .per_job
            .clone()
    }

    /// Forgets what was received (long benchmarks).
    pub fn clear(&self) {
        let mut record = self.shared.record.lock().unwrap_or_else(|p| p.into_inner());
        record.log.clear();
        record.log.shrink_to_fit();
    }

    /// Stops the sink. Requests parked in `/hang` are dropped with their connections.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task.abort();
        let _ = self.task.await;
    }
}

type Shared_ = State<Arc<Shared>>;

async fn ok(State(s): Shared_, headers: HeaderMap) -> StatusCode {
    s.note(&headers, "/ok", 200);
    StatusCode::OK
}

async fn status(State(s): Shared_, headers: HeaderMap, Path(code): Path<u16>) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    s.note(
        &headers,
        &format!("/status/{}", code.as_u16()),
        code.as_u16(),
    );
    (code, format!("sink answered {}", code.as_u16())).into_response()
}

async fn fail(
    State(s): Shared_,
    headers: HeaderMap,
    Path(n): Path<u32>,
    body: bytes::Bytes,
) -> Response {
    let path = format!("/fail/{n}");
    let seen = {
        let record = s.record.lock().unwrap_or_else(|p| p.into_inner());
        record
            .per_job
            .get(header_str(&headers, JOB_ID_HEADER))
            .copied()
            .unwrap_or(0)
            + 1
    };
    // Bodies, `x-` headers and the trace context are kept (tests compare what each attempt
    // carried).
    let kept: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| {
            name.as_str().starts_with("x-") || matches!(name.as_str(), "traceparent" | "tracestate")
        })
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    if seen <= n {
        s.note_with(&headers, &path, 500, kept, body);
        (StatusCode::INTERNAL_SERVER_ERROR, "sink fails on purpose").into_response()
    } else {
        s.note_with(&headers, &path, 200, kept, body);
        StatusCode::OK.into_response()
    }
}

async fn flaky(State(s): Shared_, headers: HeaderMap, Path(percent): Path<u32>) -> StatusCode {
    let fail = rand::rng().random_range(0..100) < percent;
    let told = header_str(&headers, STATUS_HEADER)
        .parse::<u16>()
        .ok()
        .and_then(|code| StatusCode::from_u16(code).ok());
    let code = match told {
        Some(code) => code,
        None if fail => StatusCode::SERVICE_UNAVAILABLE,
        None => StatusCode::OK,
    };
    s.note(&headers, &format!("/flaky/{percent}"), code.as_u16());
    code
}

/// 503 until the given Unix time (ms), then 200: an endpoint that is down for a while.
async fn down_until(State(s): Shared_, headers: HeaderMap, Path(unix_ms): Path<i64>) -> StatusCode {
    let code = if chrono::Utc::now().timestamp_millis() < unix_ms {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    s.note(&headers, &format!("/down-until/{unix_ms}"), code.as_u16());
    code
}

/// 500 between two Unix times (ms), 200 before and after: an outage drill.
async fn outage(
    State(s): Shared_,
    headers: HeaderMap,
    Path((from_ms, until_ms)): Path<(i64, i64)>,
) -> StatusCode {
    let now = chrono::Utc::now().timestamp_millis();
    let code = if (from_ms..until_ms).contains(&now) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    s.note(
        &headers,
        &format!("/outage/{from_ms}/{until_ms}"),
        code.as_u16(),
    );
    code
}

async fn hang(State(s): Shared_, headers: HeaderMap) -> StatusCode {
    s.note(&headers, "/hang", 0);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    StatusCode::OK
}

async fn slow(State(s): Shared_, headers: HeaderMap, Path(ms): Path<u64>) -> StatusCode {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    s.note(&headers, &format!("/slow/{ms}"), 200);
    StatusCode::OK
}

async fn retry_after(State(s): Shared_, headers: HeaderMap, Path(secs): Path<u64>) -> Response {
    let path = format!("/retry-after/{secs}");
    let first = {
        let record = s.record.lock().unwrap_or_else(|p| p.into_inner());
        !record
            .per_job
            .contains_key(header_str(&headers, JOB_ID_HEADER))
    };
    if first {
        s.note(&headers, &path, 429);
        (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", secs.to_string())],
            "slow down",
        )
            .into_response()
    } else {
        s.note(&headers, &path, 200);
        StatusCode::OK.into_response()
    }
}

async fn answer_retry_after(
    State(s): Shared_,
    headers: HeaderMap,
    Path((status, value)): Path<(u16, String)>,
) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    s.note(&headers, "/answer", status.as_u16());
    match axum::http::HeaderValue::from_str(&value) {
        Ok(value) => (status, [("retry-after", value)], "come back later").into_response(),
        Err(_) => status.into_response(),
    }
}

async fn big(
    State(s): Shared_,
    headers: HeaderMap,
    Path((status, bytes)): Path<(u16, usize)>,
) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    s.note(
        &headers,
        &format!("/big/{}", status.as_u16()),
        status.as_u16(),
    );
    // At most 64 MiB, whatever is asked.
    (status, vec![b'x'; bytes.min(64 << 20)]).into_response()
}

async fn capture(State(s): Shared_, headers: HeaderMap, body: bytes::Bytes) -> StatusCode {
    let kept = headers
        .iter()
        .filter(|(name, _)| {
            name.as_str().starts_with("webhook-")
                || name.as_str().starts_with("spindle-event-")
                || name.as_str() == "spindle-subscription-id"
        })
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    s.note_with(&headers, "/capture", 200, kept, body);
    StatusCode::OK
}

async fn redirect(State(s): Shared_, headers: HeaderMap, Path(code): Path<u16>) -> Response {
    let code = StatusCode::from_u16(code)
        .ok()
        .filter(|c| c.is_redirection())
        .unwrap_or(StatusCode::FOUND);
    s.note(
        &headers,
        &format!("/redirect/{}", code.as_u16()),
        code.as_u16(),
    );
    (code, [("location", "/ok")]).into_response()
}
