//! The RPC server (axum, JSON): submit jobs, trace a job, health, readiness, metrics and the
//! OpenAPI document. Handlers validate, hand work to the Director's writer and wait for the
//! commit; they never touch delivery.

pub mod api;
pub mod auth;
pub mod error;
pub mod import;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;

use crate::director::writer::WriteOp;
use crate::job::JobId;
use crate::jobdb::JobDb;
use crate::metrics::Metrics;
use api::{AcceptedJob, IntakeLimits, JobView, SubmitReply, SubmitRequest};
use error::ApiError;

/// What the handlers share.
#[derive(Clone)]
pub struct RpcState {
    /// The Director's writer.
    pub writer: mpsc::Sender<WriteOp>,
    /// For reads (job traces).
    pub db: JobDb,
    /// Exported at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Intake limits and defaults.
    pub limits: Arc<IntakeLimits>,
    /// Cancelled when the Director stops taking work.
    pub stopping: CancellationToken,
    /// Set once recovery is done and the JobDB is owned.
    pub ready: Arc<AtomicBool>,
    /// Job id generator: monotonic within a millisecond, so ids keep submission order.
    pub ids: Arc<Mutex<ulid::Generator>>,
    /// Known API tokens; `None` leaves the API open (a warning is logged at start).
    pub auth: Option<Arc<auth::TokenStore>>,
    /// Job ids of the imports in progress (requests sharing an id run one at a time).
    pub imports: Arc<import::InFlight>,
    /// The scheduler's endpoint health, refreshed once a second.
    pub health: Arc<Mutex<Vec<api::EndpointHealth>>>,
}

impl RpcState {
    /// The caller behind the request's bearer token (`None` when authentication is off).
    fn caller(&self, headers: &HeaderMap) -> Result<Option<auth::Caller>, ApiError> {
        caller_of(self.auth.as_deref(), headers)
    }

    fn next_id(&self) -> JobId {
        next_id(&self.ids)
    }
}

/// A new job id from `ids`: monotonic within a millisecond, so ids keep submission order.
pub fn next_id(ids: &Mutex<ulid::Generator>) -> JobId {
    let generated = ids
        .lock()
        .map(|mut generator| generator.generate())
        .unwrap_or_else(|poisoned| poisoned.into_inner().generate());
    // The generator only fails when 2^80 ids were made in one millisecond.
    JobId(generated.unwrap_or_else(|_| ulid::Ulid::new()))
}

/// The OpenAPI document of the RPC API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "spindle",
        description = "Database-as-a-queue HTTP delivery engine: Director RPC API"
    ),
    paths(
        submit_jobs,
        get_job,
        endpoints,
        import::import_jobs,
        healthz,
        readyz,
        metrics
    ),
    components(schemas(
        api::SubmitRequest,
        api::NewJob,
        api::SubmitReply,
        api::AcceptedJob,
        api::JobStatus,
        api::JobView,
        api::TransitionView,
        api::EndpointsView,
        api::EndpointHealth,
        api::ErrorBody,
        api::ErrorDetail,
        import::ImportRequest,
        import::ImportJob,
        import::ImportResponse
    ))
)]
pub struct ApiDoc;

/// The routes of a Director.
pub fn router(state: RpcState) -> Router {
    let body_limit = state.limits.max_request_bytes;
    Router::new()
        .route("/v1/jobs", post(submit_jobs))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/endpoints", get(endpoints))
        .route("/v1/import", post(import::import_jobs))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
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

/// The routes of a Director process that owns no JobDB at the moment (campaigning): alive,
/// not ready, metrics, and a 503 for everything else so producers go elsewhere.
pub fn idle_router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/readyz",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: no jobdb owned\n",
                )
            }),
        )
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let metrics = metrics.clone();
                async move { exposition(&metrics, &headers) }
            }),
        )
        .route("/openapi.json", get(openapi))
        .fallback(|| async {
            ApiError::Unavailable(
                "this director owns no jobdb right now; nothing was stored".into(),
            )
        })
}

/// Submit jobs. The whole batch is persisted in one transaction before the answer.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    request_body = SubmitRequest,
    responses(
        (status = 202, description = "All jobs persisted", body = SubmitReply),
        (status = 400, description = "Malformed JSON, or unknown or missing field", body = api::ErrorBody),
        (status = 413, description = "Body, payload or batch too large", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not submit to a job's bucket; nothing stored", body = api::ErrorBody),
        (status = 422, description = "A field has an invalid value", body = api::ErrorBody),
        (status = 429, description = "The token is over its request rate (see Retry-After); nothing stored", body = api::ErrorBody),
        (status = 503, description = "JobDB unavailable or Director stopping; nothing stored", body = api::ErrorBody)
    )
)]
async fn submit_jobs(
    State(state): State<RpcState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    if state.stopping.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    let caller = state.caller(&headers)?;
    let body = request_body(body, &state.limits)?;
    let jobs = check_submission(&body, &state.limits, || state.next_id())?;
    check_buckets(caller.as_ref(), &jobs)?;

    let (reply, outcome) = oneshot::channel();
    state
        .writer
        .send(WriteOp::Submit {
            jobs: jobs.clone(),
            not_after: None,
            reply,
        })
        .await
        .map_err(|_| ApiError::ShuttingDown)?;
    let transaction = match outcome.await {
        Ok(Ok(transaction)) => transaction,
        Ok(Err(why)) => return Err(why.into()),
        Err(_) => return Err(ApiError::ShuttingDown),
    };
    let response = SubmitReply {
        transaction_id: transaction.to_string(),
        jobs: jobs.iter().map(|job| AcceptedJob::from(&**job)).collect(),
    };
    Ok((StatusCode::ACCEPTED, Json(response)))
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
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::BodyTooLarge {
            limit: limits.max_request_bytes,
        },
        _ => ApiError::InvalidJson {
            field: None,
            message: rejection.body_text(),
        },
    })
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
    next_id: impl FnMut() -> JobId,
) -> Result<Vec<Arc<crate::job::Job>>, ApiError> {
    let request: SubmitRequest = parse_json(body)?;
    Ok(api::validate_request(request, limits, Utc::now(), next_id)?)
}

/// Parses a JSON body, naming the path of the first error (`jobs[2].bucket`).
fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
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

/// The health of the endpoints this Director works for (admin): queue, requests in flight,
/// circuit breaker, controls.
#[utoipa::path(
    get,
    path = "/v1/endpoints",
    responses(
        (status = 200, description = "Every endpoint with work or a remembered breaker", body = api::EndpointsView),
        (status = 401, description = "No valid token", body = api::ErrorBody),
        (status = 403, description = "Not an admin token", body = api::ErrorBody),
    )
)]
async fn endpoints(
    State(state): State<RpcState>,
    headers: HeaderMap,
) -> Result<Json<api::EndpointsView>, ApiError> {
    if let Some(caller) = state.caller(&headers)? {
        if !matches!(caller.scope, auth::Scope::Admin) {
            return Err(ApiError::Forbidden {
                message: format!("token {:?} is not an admin token", caller.name),
                field: None,
            });
        }
    }
    let endpoints = state
        .health
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|poisoned| poisoned.into_inner().clone());
    Ok(Json(api::EndpointsView { endpoints }))
}

/// A job with its current state and full transition trace.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    params(("id" = String, Path, description = "Job id: ULID, or 32 hex digits as HEX(id) prints",
        pattern = "^([0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}|[0-9A-Fa-f]{32})$")),
    responses(
        (status = 200, description = "The job and its trace", body = JobView),
        (status = 400, description = "Not a job id", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not read this job's bucket", body = api::ErrorBody),
        (status = 404, description = "No such job in this Director's JobDB", body = api::ErrorBody)
    )
)]
async fn get_job(
    State(state): State<RpcState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let caller = state.caller(&headers)?;
    let id = parse_job_id(&id)?;
    let unavailable = |e: crate::jobdb::JobDbError| {
        tracing::warn!(error = %e, "job lookup failed");
        ApiError::Unavailable("the jobdb is unavailable".into())
    };
    let job = state
        .db
        .get_jobs(&[id])
        .await
        .map_err(unavailable)?
        .pop()
        .ok_or_else(|| ApiError::NotFound(format!("no job {id} in this director's jobdb")))?;
    if let Some(caller) = caller.filter(|c| !c.may_use(&job.bucket)) {
        return Err(ApiError::Forbidden {
            message: format!(
                "token {:?} may not read jobs of bucket {:?}",
                caller.name, job.bucket
            ),
            field: None,
        });
    }
    let trace = state.db.get_transitions(id).await.map_err(unavailable)?;
    Ok(Json(api::job_view(&job, &trace)))
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "Alive")))]
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: the JobDB is owned, recovery is done, and the Director takes jobs.
#[utoipa::path(get, path = "/readyz", responses((status = 200, description = "Ready"), (status = 503, description = "Not ready")))]
async fn readyz(State(state): State<RpcState>) -> impl IntoResponse {
    if state.ready.load(Ordering::Acquire) && !state.stopping.is_cancelled() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// Prometheus metrics: OpenMetrics when the scraper asks for it, else the classic text format.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Metrics")))]
async fn metrics(State(state): State<RpcState>, headers: HeaderMap) -> impl IntoResponse {
    let queued = state.writer.max_capacity() - state.writer.capacity();
    state.metrics.write_queue.set(queued as i64);
    exposition(&state.metrics, &headers)
}

/// The metrics in the format the `Accept` header prefers.
fn exposition(
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

/// The OpenAPI document, with what the derive cannot express: constraints on header names and
/// values (JSON Schema `propertyNames`), and a payload that may be any JSON value.
pub fn openapi_document() -> Result<String, serde_json::Error> {
    let mut doc = serde_json::to_value(ApiDoc::openapi())?;
    if let Some(payload) = doc.pointer_mut("/components/schemas/JobSpec/properties/payload") {
        let description = payload.get("description").cloned().unwrap_or_default();
        *payload = serde_json::json!({ "description": description });
    }
    if let Some(headers) = doc.pointer_mut("/components/schemas/JobSpec/properties/headers") {
        headers["maxProperties"] = serde_json::json!(api::MAX_HEADERS);
        headers["propertyNames"] =
            serde_json::json!({"pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", "maxLength": 256});
        headers["additionalProperties"] = serde_json::json!({"type": "string", "pattern": "^[^\\u0000-\\u0008\\u000A-\\u001F\\u007F]*$", "maxLength": 4096});
    }
    serde_json::to_string_pretty(&doc)
}

async fn openapi() -> impl IntoResponse {
    match openapi_document() {
        Ok(doc) => ([(header::CONTENT_TYPE, "application/json")], doc).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "openapi document failed to render");
            ApiError::Internal.into_response()
        }
    }
}
