//! `POST /v1/import`: jobs that already have an id enter this Director's JobDB. Admin scope only.
//!
//! Two callers:
//! - a drainer hands over the jobs of a retired JobDB that still await a retry (`from_jobdb`
//!   set): each keeps its id, attempts, creation and expiry times and next attempt, gets an
//!   `imported` row and records the JobDB it came from;
//! - a router forwards new jobs whose ids it chose when it claimed their idempotency keys
//!   (`from_jobdb` absent): they start like submitted jobs (`awaiting-scheduling`), and a
//!   `not_after` instant (the end of the router's claim) is refused once passed, so a forward
//!   that arrives after its claim could have been taken over stores nothing.
//!
//! Idempotent per JobDB: jobs already present are skipped, so a caller that lost the answer
//! sends the same batch again. The caller names the JobDB it expects this Director to own;
//! a Director that owns another one (or none) answers 409/503 and stores nothing, so a batch
//! meant for one JobDB can never land in two. Requests sharing a job id are checked and written
//! one after the other; others run concurrently and share the writer's group commits.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::{oneshot, Notify};

use super::api::{self, FieldError, IntakeLimits};
use super::auth::Scope;
use super::error::ApiError;
use super::RpcState;
use crate::director::scheduler::Recovered;
use crate::director::writer::{WriteOp, WriteRejected};
use crate::job::{Job, JobId, RetryPolicy};

pub use spindle_client::api::{ImportJob, ImportRequest, ImportResponse, MAX_IMPORT_JOBS};

/// The import form of a stored job and its progress.
pub fn import_job(job: &Job, attempts: u16, retry_at: DateTime<Utc>) -> ImportJob {
    ImportJob {
        id: job.id.to_string(),
        bucket: job.bucket.to_string(),
        endpoint: job.endpoint.to_string(),
        method: job.method.to_string(),
        headers: job.headers.clone(),
        payload_base64: base64::engine::general_purpose::STANDARD.encode(&job.payload),
        execution_timeout_ms: u32::try_from(job.execution_timeout.as_millis()).unwrap_or(u32::MAX),
        backoff_min_delay_ms: u32::try_from(job.retry.min_delay.as_millis()).unwrap_or(u32::MAX),
        backoff_coefficient: job.retry.coefficient,
        created_at: job.created_at,
        expire_at: job.expire_at,
        idempotency_key: job.idempotency_key.clone(),
        attempts,
        retry_at,
    }
}

/// The job of an import, checked by the same rules as a submitted job (`api::check_*`, with
/// this Director's `limits`), plus the times an import carries (`i` is its index, for error
/// paths): what a Director accepted directly, another accepts as an import.
pub fn job_of(spec: &ImportJob, i: usize, limits: &IntakeLimits) -> Result<Job, FieldError> {
    let field = |name: &str| format!("jobs[{i}].{name}");
    let id: JobId = spec
        .id
        .parse()
        .map_err(|_| FieldError::new(field("id"), "is not a ULID"))?;
    api::check_bucket(&spec.bucket, &field("bucket"))?;
    api::check_endpoint(&spec.endpoint, &field("endpoint"))?;
    api::check_method(&spec.method, &field("method"))?;
    let headers = api::check_headers(&spec.headers, &field("headers"))?;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(&spec.payload_base64)
        .map_err(|_| FieldError::new(field("payload_base64"), "is not base64"))?;
    api::check_payload(payload.len(), limits, &field("payload_base64"))?;
    let timeout = api::check_timeout(
        spec.execution_timeout_ms.into(),
        limits,
        &field("execution_timeout_ms"),
    )?;
    let min_delay = api::check_min_delay(
        spec.backoff_min_delay_ms.into(),
        limits,
        &field("backoff_min_delay_ms"),
    )?;
    api::check_coefficient(
        spec.backoff_coefficient,
        limits,
        &field("backoff_coefficient"),
    )?;
    if let Some(key) = &spec.idempotency_key {
        api::check_idempotency_key(key, &field("idempotency_key"))?;
    }
    for (name, at) in [
        ("created_at", spec.created_at),
        ("expire_at", spec.expire_at),
        ("retry_at", spec.retry_at),
    ] {
        check_stored_time(at, &field(name))?;
    }
    if spec.expire_at < spec.created_at {
        return Err(FieldError::new(field("expire_at"), "is before created_at"));
    }
    Ok(Job {
        id,
        bucket: spec.bucket.as_str().into(),
        endpoint: spec.endpoint.as_str().into(),
        method: spec.method.as_str().into(),
        headers,
        payload: Bytes::from(payload),
        execution_timeout: timeout,
        retry: RetryPolicy {
            min_delay,
            coefficient: spec.backoff_coefficient,
        },
        created_at: spec.created_at,
        expire_at: spec.expire_at,
        idempotency_key: spec.idempotency_key.clone(),
    })
}

/// A time a JobDB can store: from 1970 to the end of year 9999 (MySQL's DATETIME).
fn check_stored_time(at: DateTime<Utc>, field: &str) -> Result<(), FieldError> {
    if at < DateTime::<Utc>::UNIX_EPOCH || at > crate::jobdb::latest_time() {
        return Err(FieldError::new(
            field,
            "must be between 1970-01-01 and 9999-12-31",
        ));
    }
    Ok(())
}

/// Import jobs from a retired JobDB (admin).
#[utoipa::path(
    post,
    path = "/v1/import",
    request_body = ImportRequest,
    responses(
        (status = 200, description = "Every job is stored in this Director's JobDB", body = ImportResponse),
        (status = 400, description = "Malformed JSON, or unknown or missing field", body = super::api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = super::api::ErrorBody),
        (status = 403, description = "The token is not an admin token; nothing stored", body = super::api::ErrorBody),
        (status = 409, description = "This Director owns another JobDB than `jobdb`; nothing stored", body = super::api::ErrorBody),
        (status = 413, description = "Body or batch too large", body = super::api::ErrorBody),
        (status = 422, description = "A field has an invalid value", body = super::api::ErrorBody),
        (status = 503, description = "JobDB unavailable or Director stopping; nothing stored", body = super::api::ErrorBody)
    )
)]
pub(super) async fn import_jobs(
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
    let body = super::request_body(body, &state.limits)?;
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

    // Requests sharing an id are checked and written one after the other: the check for jobs
    // already present and their insert must not interleave with another request's.
    let ids: Vec<JobId> = jobs.iter().map(|(job, _, _)| job.id).collect();
    let _held = state.imports.hold(&ids).await;
    let present = state.db.existing_jobs(&ids).await.map_err(|e| {
        tracing::warn!(error = %e, "import: reading existing jobs failed");
        ApiError::Unavailable("the jobdb is unavailable; nothing was stored".into())
    })?;
    let fresh: Vec<Recovered> = jobs
        .into_iter()
        .filter(|(job, _, _)| !present.contains(&job.id))
        .map(|(job, attempts, retry_at)| Recovered {
            job: Arc::new(job),
            attempts,
            retry_at: Some(retry_at),
        })
        .collect();
    let imported = fresh.len();
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
                // The deadline travels with the write: checked again when its batch is
                // assembled, the last moment before the jobs can be stored.
                let op = WriteOp::Submit {
                    jobs: fresh.into_iter().map(|r| r.job).collect(),
                    not_after: request.not_after,
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
        let outcome = match outcome {
            Outcome::Imported(rx) => rx.await,
            Outcome::Submitted(rx) => rx.await.map(|r| r.map(|_| ())),
        };
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(why)) => return Err(why.into()),
            Err(_) => return Err(ApiError::ShuttingDown),
        }
    }
    tracing::debug!(
        from = request.from_jobdb.as_deref().unwrap_or("router"),
        imported,
        already_present = present.len(),
        "jobs imported"
    );
    Ok((
        StatusCode::OK,
        Json(ImportResponse {
            jobdb: state.db.name().to_owned(),
            imported,
            already_present: present.len(),
        }),
    ))
}

/// Where a write's outcome arrives: imports are acknowledged, submissions get a transaction id.
enum Outcome {
    Imported(oneshot::Receiver<Result<(), WriteRejected>>),
    Submitted(oneshot::Receiver<Result<ulid::Ulid, WriteRejected>>),
}

/// Job ids of the imports in progress: requests sharing an id wait for each other.
#[derive(Debug, Default)]
pub struct InFlight {
    ids: Mutex<HashSet<JobId>>,
    released: Notify,
}

/// Holds ids in an [`InFlight`] set until dropped.
pub struct Held<'a> {
    set: &'a InFlight,
    ids: Vec<JobId>,
}

impl InFlight {
    /// Waits until none of `ids` is held by another request, then holds them.
    pub async fn hold(&self, ids: &[JobId]) -> Held<'_> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self.ids.lock().unwrap_or_else(|p| p.into_inner());
                if !ids.iter().any(|id| held.contains(id)) {
                    held.extend(ids.iter().copied());
                    return Held {
                        set: self,
                        ids: ids.to_vec(),
                    };
                }
            }
            released.await;
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut held = self.set.ids.lock().unwrap_or_else(|p| p.into_inner());
        for id in &self.ids {
            held.remove(id);
        }
        drop(held);
        self.set.released.notify_waiters();
    }
}
