//! The intake toolkit: what every HTTP front of spindle (the Director's API in
//! `director::http`, the router) shares — the RPC's types (`api`, `import`), request
//! validation (`validate`), what answers show (`views`), the OpenAPI document (`openapi`),
//! bearer tokens and their rate limits (`auth`), error bodies (`error`), request parsing, job
//! ids, and the metrics endpoint of processes that only report. It imports nothing above it.

pub mod api;
pub mod auth;
pub mod error;
pub mod import;
pub mod listing;
pub mod openapi;
pub mod rules;
pub mod validate;
pub mod views;

use std::sync::{Arc, Mutex};

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use chrono::Utc;
use tokio_util::sync::CancellationToken;

use crate::job::JobId;
use crate::metrics::Metrics;
use api::{IntakeLimits, SubmitRequest};
use error::ApiError;

/// A new job id from `ids`: monotonic within a millisecond, so ids keep submission order.
pub fn next_id(ids: &Mutex<ulid::Generator>) -> JobId {
    let generated = ids
        .lock()
        .map(|mut generator| generator.generate())
        .unwrap_or_else(|poisoned| poisoned.into_inner().generate());
    // The generator only fails when 2^80 ids were made in one millisecond.
    JobId(generated.unwrap_or_else(|_| ulid::Ulid::new()))
}

/// Liveness: the process answers.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// The routes of a process that only reports: `/healthz` and `/metrics` (manager, drainer).
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route("/healthz", get(healthz)).route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let metrics = metrics.clone();
            async move { exposition(&metrics, &headers) }
        }),
    )
}

/// Serves [`metrics_router`] on `addr` until `stop`.
pub async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let served = axum::serve(listener, metrics_router(metrics))
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "metrics server failed");
        }
    });
    tracing::info!(addr = %bound, "metrics at /metrics");
    Ok(bound)
}

/// The caller behind a request's bearer token, admitted by its rate limit (`None` when `store`
/// is `None`: authentication is off).
pub fn caller_of(
    store: Option<&auth::TokenStore>,
    headers: &HeaderMap,
) -> Result<Option<auth::Caller>, ApiError> {
    let Some(store) = store else {
        return Ok(None);
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthenticated)?;
    let caller = store
        .authenticate(token.trim())
        .ok_or(ApiError::Unauthenticated)?;
    caller
        .admit()
        .map_err(|retry_after| ApiError::RateLimited {
            name: caller.name.clone(),
            retry_after,
        })?;
    Ok(Some(caller))
}

/// The request body, or the error that answers a body too large or unreadable.
pub fn request_body(
    body: Result<Bytes, BytesRejection>,
    limits: &IntakeLimits,
) -> Result<Bytes, ApiError> {
    request_body_within(body, limits.max_request_bytes)
}

/// [`request_body`] of a route whose body limit is `limit` (its `DefaultBodyLimit`).
pub fn request_body_within(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::BodyTooLarge { limit },
        _ => ApiError::InvalidJson {
            field: None,
            message: rejection.body_text(),
        },
    })
}

/// Refuses (403) a caller that may not publish events to `bucket`.
pub fn check_publisher(caller: Option<&auth::Caller>, bucket: &str) -> Result<(), ApiError> {
    match caller {
        Some(caller) if !caller.may_use(bucket) => Err(ApiError::Forbidden {
            message: format!(
                "token {:?} may not publish to bucket {bucket:?}; nothing was stored",
                caller.name
            ),
            field: Some("bucket".to_owned()),
        }),
        _ => Ok(()),
    }
}

/// Refuses the whole batch (403, naming the first offending job) when the caller may not use
/// one of its buckets.
pub fn check_buckets(
    caller: Option<&auth::Caller>,
    jobs: &[Arc<crate::job::Job>],
) -> Result<(), ApiError> {
    let Some(caller) = caller else {
        return Ok(());
    };
    match jobs
        .iter()
        .enumerate()
        .find(|(_, job)| !caller.may_use(&job.bucket))
    {
        Some((i, job)) => Err(ApiError::Forbidden {
            message: format!(
                "token {:?} may not submit to bucket {:?}; nothing was stored",
                caller.name, job.bucket
            ),
            field: Some(format!("jobs[{i}].bucket")),
        }),
        None => Ok(()),
    }
}

/// A JSON value's text as bytes, moved rather than copied (a job's body, an event's envelope).
pub fn json_bytes(raw: Box<serde_json::value::RawValue>) -> Bytes {
    Bytes::from(String::from(Box::<str>::from(raw)))
}

/// A job id from a path segment (ULID or `HEX(id)`), or the 400 that names it.
pub fn parse_job_id(id: &str) -> Result<JobId, ApiError> {
    id.parse()
        .map_err(|e: crate::job::InvalidJobId| ApiError::InvalidJson {
            field: Some("id".into()),
            message: e.to_string(),
        })
}

/// Parses and validates a `POST /v1/jobs` body into jobs, exactly as the handler does (the fuzz
/// target calls this too).
pub fn check_submission(
    body: &[u8],
    limits: &IntakeLimits,
    trace: Option<&crate::telemetry::TraceContext>,
    next_id: impl FnMut() -> JobId,
) -> Result<(Vec<Arc<crate::job::Job>>, crate::job::Scheduled), ApiError> {
    let request: SubmitRequest = parse_json(body)?;
    Ok(api::validate_request(
        request,
        limits,
        Utc::now(),
        chrono::Duration::zero(),
        trace,
        next_id,
    )?)
}

/// [`check_submission`] for a router, whose clock may run up to `max_skew` ahead of the
/// Director that stores the job: a requested first attempt time this clock has passed by less
/// than that is kept, for the Director to judge by its own (so a router's clock running ahead
/// cannot make a job early); one passed longer ago means now.
pub fn check_forward(
    body: &[u8],
    limits: &IntakeLimits,
    max_skew: std::time::Duration,
    trace: Option<&crate::telemetry::TraceContext>,
    next_id: impl FnMut() -> JobId,
) -> Result<(Vec<Arc<crate::job::Job>>, crate::job::Scheduled), ApiError> {
    let request: SubmitRequest = parse_json(body)?;
    let skew = chrono::Duration::from_std(max_skew).unwrap_or(chrono::Duration::zero());
    Ok(api::validate_request(
        request,
        limits,
        Utc::now(),
        skew,
        trace,
        next_id,
    )?)
}

/// Parses a JSON body, naming the path of the first error (`jobs[2].bucket`).
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // Tracking the path allocates at every field: only a body that fails is read again so.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::InvalidJson {
            field: (path != ".").then_some(path),
            message: e.inner().to_string(),
        }
    })?;
    de.end().map_err(|e| ApiError::InvalidJson {
        field: None,
        message: e.to_string(),
    })?;
    Ok(value)
}

/// The metrics in the format the `Accept` header prefers.
pub fn exposition(
    metrics: &Metrics,
    headers: &HeaderMap,
) -> ([(header::HeaderName, &'static str); 1], String) {
    let open_metrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    if open_metrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            metrics.render(),
        )
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            metrics.render_prometheus(),
        )
    }
}
