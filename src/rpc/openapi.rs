//! The OpenAPI document of the RPC API (`GET /openapi.json`), served by Directors and routers.
//!
//! The schemas are the wire types' (`spindle-client`'s `openapi` feature); the operations are
//! described here, one documentation-only function per route, because the contract is the
//! intake toolkit's, not one front's: the Director's handlers (`director::http`) and the
//! router's implement it. Each function's doc comment is its operation's summary and
//! description.

// The operations' functions are never called: `#[utoipa::path]` reads their signature and
// documentation only.
#![allow(dead_code)]

use utoipa::OpenApi;

use super::api::{self, JobView, SubmitReply, SubmitRequest};
use super::import::{self, ImportRequest, ImportResponse};

/// The operations and schemas of the RPC API.
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

/// The Director's document, with what the derive cannot express: constraints on header names
/// and values (JSON Schema `propertyNames`), and a payload that may be any JSON value.
pub fn director_document() -> Result<String, serde_json::Error> {
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

/// The router's document: the Director's without what only Directors serve (`/v1/import`, and
/// `/v1/endpoints`: each Director's own view of its endpoints).
pub fn router_document() -> Result<String, serde_json::Error> {
    let mut doc: serde_json::Value = serde_json::from_str(&director_document()?)?;
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        paths.remove("/v1/import");
        paths.remove("/v1/endpoints");
    }
    doc["info"]["description"] = serde_json::Value::String(
        "Database-as-a-queue HTTP delivery engine: router RPC API (dedup by idempotency key, \
         forwarding to Directors)"
            .into(),
    );
    serde_json::to_string(&doc)
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
        (status = 503, description = "JobDB unavailable or not written in time, or Director stopping; nothing stored (see Retry-After)", body = api::ErrorBody),
        (status = 504, description = "The jobs were being written when the write timeout ran out: they may or may not be stored; submit again with the same idempotency keys", body = api::ErrorBody)
    )
)]
fn submit_jobs() {}

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
fn get_job() {}

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
fn endpoints() {}

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
        (status = 503, description = "JobDB unavailable or not written in time, or Director stopping; nothing stored (see Retry-After)", body = api::ErrorBody),
        (status = 504, description = "The jobs were being written when the write timeout ran out: they may or may not be stored; send the same request again (imports are idempotent)", body = api::ErrorBody)
    )
)]
fn import_jobs() {}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "Alive")))]
fn healthz() {}

/// Readiness: the JobDB is owned and can be written, recovery is done, every core task runs
/// and makes progress, and the Director takes jobs. A 503 says why not.
#[utoipa::path(get, path = "/readyz", responses((status = 200, description = "Ready"), (status = 503, description = "Not ready, and why (the JobDB cannot be written, a core task stalled or ended, stopping)")))]
fn readyz() {}

/// Prometheus metrics: OpenMetrics when the scraper asks for it, else the classic text format.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Metrics")))]
fn metrics() {}
