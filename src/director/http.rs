//! The Director's HTTP API: submit, import, job traces, endpoint health, readiness, metrics
//! and the OpenAPI document. The handlers are the Director's; what they share with the router
//! (authentication, request parsing and validation, error bodies) is the intake toolkit in
//! [`crate::rpc`], which imports nothing of the Director.

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

use crate::job::{JobId, Recovered};
use crate::jobdb::write::{WriteOp, WriteRejected};
use crate::jobdb::JobDb;
use crate::metrics::Metrics;
use crate::rpc::api::{self, FieldError, IntakeLimits, JobView, SubmitReply, SubmitRequest};
use crate::rpc::auth::{self, Scope};
use crate::rpc::error::ApiError;
use crate::rpc::import::{self, job_of, ImportRequest, ImportResponse, MAX_IMPORT_JOBS};
use crate::rpc::{
    self, caller_of, check_buckets, check_submission, exposition, next_id, parse_job_id,
    request_body,
};

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

/// The OpenAPI document of the RPC API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "spindle",
        description = "Database-as-a-queue HTTP delivery engine: Director RPC API"
    ),
    paths(submit_jobs, get_job, endpoints, import_jobs, healthz, readyz, metrics),
    components(schemas(
        api::SubmitRequest,
        api::NewJob,
        api::OrderingFailure,
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
        .route("/v1/import", post(import_jobs))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
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
    let (jobs, scheduled) = check_submission(&body, &state.limits, || state.next_id())?;
    check_buckets(caller.as_ref(), &jobs)?;

    let (reply, outcome) = oneshot::channel();
    state
        .writer
        .send(WriteOp::Submit {
            jobs: jobs.clone(),
            scheduled: scheduled.clone(),
            not_after: None,
            forwarded: false,
            reply,
        })
        .await
        .map_err(|_| ApiError::ShuttingDown)?;
    let transaction = match outcome.await {
        Ok(Ok(accepted)) => accepted.transaction,
        Ok(Err(why)) => return Err(why.into()),
        Err(_) => return Err(ApiError::ShuttingDown),
    };
    let response = SubmitReply {
        transaction_id: transaction.to_string(),
        jobs: api::accepted_jobs(&jobs, &scheduled),
    };
    Ok((StatusCode::ACCEPTED, Json(response)))
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

/// Import jobs from a retired JobDB (admin).
#[utoipa::path(
    post,
    path = "/v1/import",
    request_body = ImportRequest,
    responses(
        (status = 200, description = "Every job is stored in this Director's JobDB", body = ImportResponse),
        (status = 400, description = "Malformed JSON, or unknown or missing field", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token is not an admin token; nothing stored", body = api::ErrorBody),
        (status = 409, description = "This Director owns another JobDB than `jobdb`; nothing stored", body = api::ErrorBody),
        (status = 413, description = "Body or batch too large", body = api::ErrorBody),
        (status = 422, description = "A field has an invalid value", body = api::ErrorBody),
        (status = 503, description = "JobDB unavailable or Director stopping; nothing stored", body = api::ErrorBody)
    )
)]
async fn import_jobs(
    State(state): State<RpcState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<ImportResponse>), ApiError> {
    if state.stopping.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    if let Some(caller) = state.caller(&headers)? {
        if !matches!(caller.scope, Scope::Admin) {
            return Err(ApiError::Forbidden {
                message: format!(
                    "token {:?} is not an admin token; nothing was stored",
                    caller.name
                ),
                field: None,
            });
        }
    }
    let body = rpc::request_body(body, &state.limits)?;
    let request: ImportRequest =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&body))
            .map_err(|e| ApiError::InvalidJson {
                field: Some(e.path().to_string()),
                message: e.inner().to_string(),
            })?;
    if request.jobdb != state.db.name() {
        return Err(ApiError::Conflict {
            message: format!(
                "this director owns jobdb {:?}, not {:?}; nothing was stored",
                state.db.name(),
                request.jobdb
            ),
            field: Some("jobdb".to_owned()),
        });
    }
    if let Some(from) = &request.from_jobdb {
        if !crate::registry::inventory::valid_name(from) {
            return Err(FieldError::new("from_jobdb", "must be 1 to 48 of [a-z0-9_]").into());
        }
    }
    if let Some(not_after) = request.not_after {
        if request.from_jobdb.is_some() {
            return Err(
                FieldError::new("not_after", "is only for new jobs (without from_jobdb)").into(),
            );
        }
        if Utc::now() > not_after {
            return Err(ApiError::Conflict {
                message: format!(
                    "not_after ({not_after}) has passed: the claim may have been taken over; \
                     nothing was stored"
                ),
                field: Some("not_after".to_owned()),
            });
        }
    }
    if request.jobs.is_empty() || request.jobs.len() > MAX_IMPORT_JOBS {
        return Err(
            FieldError::new("jobs", format!("must hold 1 to {MAX_IMPORT_JOBS} jobs")).into(),
        );
    }
    let mut jobs = Vec::with_capacity(request.jobs.len());
    for (i, spec) in request.jobs.iter().enumerate() {
        if request.from_jobdb.is_none() && spec.attempts != 0 {
            return Err(FieldError::new(
                format!("jobs[{i}].attempts"),
                "must be 0 for new jobs (without from_jobdb)",
            )
            .into());
        }
        jobs.push((
            job_of(spec, i, &state.limits)?,
            spec.attempts,
            spec.retry_at,
        ));
    }

    // Requests sharing an id are written one after the other: the check for jobs already
    // present and their insert must not interleave with another request's. A drainer's import
    // reads which are present first; a router's forward (new jobs) does not: the writer finds
    // them only when the JobDB refuses a duplicate (a retry of a forward whose answer was
    // lost), so a forward costs what a submit costs.
    let ids: Vec<JobId> = jobs.iter().map(|(job, _, _)| job.id).collect();
    let _held = state.imports.hold(&ids).await;
    let present = match request.from_jobdb {
        Some(_) => state.db.existing_jobs(&ids).await.map_err(|e| {
            tracing::warn!(error = %e, "import: reading existing jobs failed");
            ApiError::Unavailable("the jobdb is unavailable; nothing was stored".into())
        })?,
        None => Default::default(),
    };
    let fresh: Vec<Recovered> = jobs
        .into_iter()
        .filter(|(job, _, _)| !present.contains(&job.id))
        .map(|(job, attempts, retry_at)| Recovered {
            job: Arc::new(job),
            attempts,
            retry_at: Some(retry_at),
        })
        .collect();
    let mut imported = fresh.len();
    let mut already_present = present.len();
    // Checked again now that the request may have waited (for the ids, for the JobDB): a job
    // must never be stored after `not_after`, or a lapsed claim could be taken over with it.
    if request.not_after.is_some_and(|t| Utc::now() > t) {
        return Err(ApiError::Conflict {
            message: "not_after passed while the request waited; nothing was stored".into(),
            field: Some("not_after".to_owned()),
        });
    }
    if imported > 0 {
        let (op, outcome) = match &request.from_jobdb {
            Some(from) => {
                let (reply, outcome) = oneshot::channel();
                let op = WriteOp::Import {
                    jobs: fresh,
                    from_jobdb: from.clone(),
                    reply,
                };
                (op, Outcome::Imported(outcome))
            }
            None => {
                let (reply, outcome) = oneshot::channel();
                // A new job whose first attempt is later than its acceptance was submitted
                // with `deliver_at` or `delay_ms` (a router sends the two equal otherwise).
                let now = Utc::now();
                let scheduled = fresh
                    .iter()
                    .filter_map(|r| {
                        let at = r.retry_at?;
                        (at > r.job.created_at && at > now).then_some((r.job.id, at))
                    })
                    .collect();
                // The deadline travels with the write: checked again when its batch is
                // assembled, the last moment before the jobs can be stored.
                let op = WriteOp::Submit {
                    jobs: fresh.into_iter().map(|r| r.job).collect(),
                    scheduled,
                    not_after: request.not_after,
                    forwarded: true,
                    reply,
                };
                (op, Outcome::Submitted(outcome))
            }
        };
        state
            .writer
            .send(op)
            .await
            .map_err(|_| ApiError::ShuttingDown)?;
        let stored_already = match outcome {
            Outcome::Imported(rx) => rx.await.map(|r| r.map(|()| 0)),
            Outcome::Submitted(rx) => rx.await.map(|r| r.map(|a| a.already_present)),
        };
        match stored_already {
            Ok(Ok(n)) => {
                imported -= n;
                already_present += n;
            }
            Ok(Err(why)) => return Err(why.into()),
            Err(_) => return Err(ApiError::ShuttingDown),
        }
    }
    tracing::debug!(
        from = request.from_jobdb.as_deref().unwrap_or("router"),
        imported,
        already_present,
        "jobs imported"
    );
    Ok((
        StatusCode::OK,
        Json(ImportResponse {
            jobdb: state.db.name().to_owned(),
            imported,
            already_present,
        }),
    ))
}

/// Where a write's outcome arrives: imports are acknowledged, submissions get a transaction id.
enum Outcome {
    Imported(oneshot::Receiver<Result<(), WriteRejected>>),
    Submitted(oneshot::Receiver<Result<crate::jobdb::Accepted, WriteRejected>>),
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
