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
    paths(
        submit_jobs,
        list_jobs,
        get_job,
        job_attempts,
        endpoints,
        import_jobs,
        publish_event,
        get_event,
        list_events,
        list_subscriptions,
        add_subscription,
        show_subscription,
        update_subscription,
        remove_subscription,
        backfill_subscription,
        healthz,
        readyz,
        metrics
    ),
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
        import::ImportResponse,
        api::EventLink,
        api::NewEvent,
        api::EventBatch,
        PublishBody,
        api::PublishReply,
        api::PublishBatchReply,
        PublishAnswer,
        api::EventView,
        api::EventDelivery,
        api::NewSubscription,
        api::PayloadFilter,
        api::SubscriptionPatch,
        api::SubscriptionView,
        api::SubscriptionList,
        api::JobList,
        api::JobDescription,
        api::EventList,
        api::AttemptList,
        api::AttemptView,
        api::BackfillRequest,
        api::PastEvent,
        api::BackfillReply,
        api::BackfilledEvent
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
    for any in [
        "/components/schemas/NewEvent/properties/payload",
        "/components/schemas/PastEvent/properties/data",
        "/components/schemas/PayloadFilter/properties/equals",
    ] {
        if let Some(value) = doc.pointer_mut(any) {
            let description = value.get("description").cloned().unwrap_or_default();
            *value = serde_json::json!({ "description": description });
        }
    }
    if let Some(headers) = doc.pointer_mut("/components/schemas/JobSpec/properties/headers") {
        headers["maxProperties"] = serde_json::json!(api::MAX_HEADERS);
        headers["propertyNames"] =
            serde_json::json!({"pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", "maxLength": 256});
        headers["additionalProperties"] = serde_json::json!({"type": "string", "pattern": "^[^\\u0000-\\u0008\\u000A-\\u001F\\u007F]*$", "maxLength": 4096});
    }
    // A header is a `[name, value]` pair: the derive writes it as a tuple (`prefixItems` and
    // the boolean schema `false`), which code generators refuse.
    if let Some(pair) = doc.pointer_mut("/components/schemas/ImportJob/properties/headers/items") {
        *pair = serde_json::json!({
            "type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2
        });
    }
    serde_json::to_string_pretty(&doc)
}

/// The router's document: the Director's without what only Directors serve (`/v1/import`,
/// `/v1/endpoints`: each Director's own view of its endpoints, `/v1/events/{id}`: one
/// JobDB's view of an event).
pub fn router_document() -> Result<String, serde_json::Error> {
    serde_json::to_string(&router_value()?)
}

/// [`router_document`], indented (what `spindle openapi` prints and `sdks/` is made from).
pub fn router_document_pretty() -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(&router_value()?)
}

fn router_value() -> Result<serde_json::Value, serde_json::Error> {
    let mut doc: serde_json::Value = serde_json::from_str(&director_document()?)?;
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        paths.remove("/v1/import");
        paths.remove("/v1/endpoints");
        paths.remove("/v1/events/{id}");
    }
    doc["info"]["description"] = serde_json::Value::String(
        "Database-as-a-queue HTTP delivery engine: router RPC API (dedup by idempotency key, \
         forwarding to Directors)"
            .into(),
    );
    Ok(doc)
}

/// Submit jobs. The whole batch is persisted in one transaction before the answer.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    params(
        ("traceparent" = Option<String>, Header, description = "W3C trace context of the producer's span: the request's spans are its children, and each job (event) without a `traceparent` field of its own keeps it; each attempt's span links to it. One that is not W3C trace context is ignored."),
        ("tracestate" = Option<String>, Header, description = "W3C tracestate that goes with `traceparent`")
    ),
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

/// List jobs by bucket, endpoint, state, ordering key and creation time, newest first unless
/// `order=oldest`, a page at a time. A router lists every live JobDB's jobs merged in id order;
/// a Director its own. A page may hold fewer than `limit` jobs and still name a `next_after`
/// (filters on the endpoint or the state are checked within a bounded window of rows): go on
/// until `next_after` is absent. A token limited to some buckets must name one.
#[utoipa::path(
    get,
    path = "/v1/jobs",
    params(
        ("bucket" = Option<String>, Query, description = "Only this bucket's"),
        ("endpoint" = Option<String>, Query, description = "Only those sent to this URL, exactly as submitted"),
        ("state" = Option<String>, Query, description = "Only those in this state now: awaiting-scheduling, executing, awaiting-retry, succeeded, discarded, archiving, archived, moved"),
        ("ordering_key" = Option<String>, Query, description = "Only those of this ordering key"),
        ("created_after" = Option<String>, Query, description = "Only those created at or after this time (RFC 3339; an id's time, to the millisecond)", format = DateTime),
        ("created_before" = Option<String>, Query, description = "Only those created before this time (RFC 3339)", format = DateTime),
        ("order" = Option<String>, Query, description = "`newest` (the default) or `oldest` first"),
        ("after" = Option<String>, Query, description = "Go on after this id: the previous page's `next_after` (same filters)"),
        ("limit" = Option<usize>, Query, description = "At most this many (1 to 500; 100 unless given)", minimum = 1, maximum = 500)
    ),
    responses(
        (status = 200, description = "A page of jobs with their traces", body = api::JobList),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not read the bucket, or must name one", body = api::ErrorBody),
        (status = 413, description = "A parameter over 2 KiB", body = api::ErrorBody),
        (status = 422, description = "A parameter is unknown, given twice or invalid (named in the answer)", body = api::ErrorBody),
        (status = 503, description = "The JobDB, or through a router a Director, did not answer: the page would be incomplete", body = api::ErrorBody)
    )
)]
fn list_jobs() {}

/// A job's delivery attempts, first first: when each started and ended, and how.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/attempts",
    params(("id" = String, Path, description = "Job id: ULID, or 32 hex digits as HEX(id) prints",
        pattern = "^([0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}|[0-9A-Fa-f]{32})$")),
    responses(
        (status = 200, description = "The job's attempts", body = api::AttemptList),
        (status = 400, description = "Not a job id", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not read this job's bucket", body = api::ErrorBody),
        (status = 404, description = "No such job", body = api::ErrorBody)
    )
)]
fn job_attempts() {}

/// List events by bucket, type and publication time, newest first unless `order=oldest`,
/// each with its jobs; a page at a time, as `GET /v1/jobs`.
#[utoipa::path(
    get,
    path = "/v1/events",
    params(
        ("bucket" = Option<String>, Query, description = "Only this bucket's"),
        ("event_type" = Option<String>, Query, description = "Only this type (needs `bucket`)"),
        ("created_after" = Option<String>, Query, description = "Only those created at or after this time (RFC 3339; an id's time, to the millisecond)", format = DateTime),
        ("created_before" = Option<String>, Query, description = "Only those created before this time (RFC 3339)", format = DateTime),
        ("order" = Option<String>, Query, description = "`newest` (the default) or `oldest` first"),
        ("after" = Option<String>, Query, description = "Go on after this id: the previous page's `next_after` (same filters)"),
        ("limit" = Option<usize>, Query, description = "At most this many (1 to 500; 100 unless given)", minimum = 1, maximum = 500)
    ),
    responses(
        (status = 200, description = "A page of events", body = api::EventList),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not read the bucket, or must name one", body = api::ErrorBody),
        (status = 413, description = "A parameter over 2 KiB", body = api::ErrorBody),
        (status = 422, description = "A parameter is unknown, given twice or invalid, or `event_type` without `bucket`", body = api::ErrorBody),
        (status = 503, description = "The JobDB, or through a router a Director, did not answer", body = api::ErrorBody)
    )
)]
fn list_events() {}

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

/// `POST /v1/events` body: one event, or a batch of events.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
enum PublishBody {
    One(api::NewEvent),
    Batch(api::EventBatch),
}

/// `POST /v1/events` answer: one event's, or a batch's.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
enum PublishAnswer {
    One(api::PublishReply),
    Batch(api::PublishBatchReply),
}

/// Publish an event, or a batch of 1 to 1,000 (`{"events": [...]}`): one job per matching
/// subscription of its bucket (exact type, prefix wildcard, payload filter), all of the
/// request's jobs persisted in one transaction before the answer; an event no subscription
/// wants is kept (it has an id, and a later subscription can be back-filled with it).
/// Through a router, a repeated `idempotency_key` (within the dedup window) stores nothing and
/// answers the first event, `duplicate: true`.
#[utoipa::path(
    post,
    path = "/v1/events",
    params(
        ("traceparent" = Option<String>, Header, description = "W3C trace context of the producer's span: the request's spans are its children, and each job (event) without a `traceparent` field of its own keeps it; each attempt's span links to it. One that is not W3C trace context is ignored."),
        ("tracestate" = Option<String>, Header, description = "W3C tracestate that goes with `traceparent`")
    ),
    request_body = PublishBody,
    responses(
        (status = 202, description = "The events' jobs are persisted (none for an event no subscription matched); a batch is answered per event, in order", body = PublishAnswer),
        (status = 400, description = "Malformed JSON, or unknown or missing field", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not publish to the bucket; nothing stored", body = api::ErrorBody),
        (status = 413, description = "Body or payload too large, or a batch's events make more than 10,000 jobs", body = api::ErrorBody),
        (status = 422, description = "A field has an invalid value (in a batch, named `events[i].…`), or a batch holds no event or more than 1,000, or (router) a batch; nothing stored", body = api::ErrorBody),
        (status = 429, description = "The token is over its request rate; nothing stored", body = api::ErrorBody),
        (status = 503, description = "No control database, JobDB unavailable, Director stopping, or (router) another publish of the key still being stored; nothing stored", body = api::ErrorBody),
        (status = 504, description = "The jobs were being written when the write timeout ran out: they may or may not be stored; publish again with the same idempotency key", body = api::ErrorBody)
    )
)]
fn publish_event() {}

/// An event and its jobs, as this Director's JobDB holds them (its other JobDBs' jobs of it,
/// moved or archived, are not listed).
#[utoipa::path(
    get,
    path = "/v1/events/{id}",
    params(("id" = String, Path, description = "Event id: ULID, or 32 hex digits as HEX(id) prints",
        pattern = "^([0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}|[0-9A-Fa-f]{32})$")),
    responses(
        (status = 200, description = "The event and its jobs here", body = api::EventView),
        (status = 400, description = "Not an event id", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not read this event's bucket", body = api::ErrorBody),
        (status = 404, description = "No such event in this Director's JobDB", body = api::ErrorBody),
        (status = 503, description = "JobDB unavailable", body = api::ErrorBody)
    )
)]
fn get_event() {}

/// The subscriptions the token may see (of one bucket with `?bucket=`), by id, a page at a
/// time: `next_after` names where the next page starts.
#[utoipa::path(
    get,
    path = "/v1/subscriptions",
    params(
        ("bucket" = Option<String>, Query, description = "Only this bucket's"),
        ("after" = Option<String>, Query, description = "Only those after this id (a ULID): the previous page's `next_after`"),
        ("limit" = Option<usize>, Query, description = "At most this many (1 to 1000; 100 unless given)", minimum = 1, maximum = 1000)
    ),
    responses(
        (status = 200, description = "The subscriptions, by id", body = api::SubscriptionList),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 422, description = "`after` is not an id, `limit` is not 1 to 1000, or a parameter is given twice", body = api::ErrorBody),
        (status = 503, description = "No control database is configured", body = api::ErrorBody)
    )
)]
fn list_subscriptions() {}

/// Add a subscription; the answer shows its signing secret, once.
#[utoipa::path(
    post,
    path = "/v1/subscriptions",
    request_body = api::NewSubscription,
    responses(
        (status = 201, description = "Stored; `ETag` (and `version`) is its version", body = api::SubscriptionView),
        (status = 400, description = "Malformed JSON, or unknown or missing field", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not use the bucket; nothing stored", body = api::ErrorBody),
        (status = 413, description = "Body over 64 KiB, or `filter.equals` over 1 KiB; nothing stored", body = api::ErrorBody),
        (status = 422, description = "A field has an invalid value (a URL in a blocked range, an event type, a filter that is not a JSON pointer), or the bucket has 1,000 live subscriptions; nothing stored", body = api::ErrorBody),
        (status = 429, description = "The token is over its request rate; nothing stored", body = api::ErrorBody),
        (status = 503, description = "No control database, or it is unavailable; nothing stored", body = api::ErrorBody)
    )
)]
fn add_subscription() {}

/// One subscription (without its secret).
#[utoipa::path(
    get,
    path = "/v1/subscriptions/{id}",
    params(("id" = String, Path, description = "Subscription id (a ULID)")),
    responses(
        (status = 200, description = "The subscription", body = api::SubscriptionView),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 404, description = "No such subscription the token may see", body = api::ErrorBody),
        (status = 422, description = "Not a subscription id", body = api::ErrorBody),
        (status = 503, description = "No control database is configured", body = api::ErrorBody)
    )
)]
fn show_subscription() {}

/// Change a subscription: enable or disable it (a disabled one's jobs wait), its URL, its
/// event types. Only the fields named change, on the subscription as stored now; with
/// `If-Match`, only if it is still at that version.
#[utoipa::path(
    patch,
    path = "/v1/subscriptions/{id}",
    params(
        ("id" = String, Path, description = "Subscription id (a ULID)"),
        ("If-Match" = Option<String>, Header, description = "The version the change was made from (`\"12\"`, a view's `version` or an answer's `ETag`)")
    ),
    request_body = api::SubscriptionPatch,
    responses(
        (status = 200, description = "Changed; `ETag` is its new version", body = api::SubscriptionView),
        (status = 400, description = "Malformed JSON, or unknown field", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 404, description = "No such subscription the token may see", body = api::ErrorBody),
        (status = 409, description = "Other edits kept overtaking this one, or the stored subscription is not valid; nothing changed", body = api::ErrorBody),
        (status = 412, description = "The subscription is no longer at the version `If-Match` names; nothing changed", body = api::ErrorBody),
        (status = 413, description = "Body over 64 KiB; nothing changed", body = api::ErrorBody),
        (status = 422, description = "A field has an invalid value; nothing changed", body = api::ErrorBody),
        (status = 503, description = "No control database, or it is unavailable; nothing changed", body = api::ErrorBody)
    )
)]
fn update_subscription() {}

/// Remove a subscription: no new event reaches it; its jobs already made go on.
#[utoipa::path(
    delete,
    path = "/v1/subscriptions/{id}",
    params(("id" = String, Path, description = "Subscription id (a ULID)")),
    responses(
        (status = 200, description = "Removed", body = api::SubscriptionView),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 404, description = "No such subscription the token may see", body = api::ErrorBody),
        (status = 422, description = "Not a subscription id", body = api::ErrorBody),
        (status = 503, description = "No control database, or it is unavailable; nothing changed", body = api::ErrorBody)
    )
)]
fn remove_subscription() {}

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

/// Deliver past events to a subscription added after them (`spindle subscriptions backfill`
/// reads them from a JobDB or the archive): one job per event it wants (types, filter), with
/// the event's own id and timestamp, all persisted in one transaction before the answer. A
/// Director skips events that have a job of the subscription in its JobDB; a router skips
/// those back-filled to it before within its dedup window, through any router.
#[utoipa::path(
    post,
    path = "/v1/subscriptions/{id}/backfill",
    params(("id" = String, Path, description = "The subscription's id (ULID)")),
    request_body = api::BackfillRequest,
    responses(
        (status = 202, description = "The jobs made (none when every event was skipped)", body = api::BackfillReply),
        (status = 400, description = "Malformed JSON, or unknown or missing field", body = api::ErrorBody),
        (status = 401, description = "Missing or invalid bearer token", body = api::ErrorBody),
        (status = 403, description = "The token may not use the subscription's bucket; nothing stored", body = api::ErrorBody),
        (status = 404, description = "No such subscription", body = api::ErrorBody),
        (status = 413, description = "Body or an event's data too large", body = api::ErrorBody),
        (status = 422, description = "A field has an invalid value; nothing stored", body = api::ErrorBody),
        (status = 429, description = "The token is over its request rate; nothing stored", body = api::ErrorBody),
        (status = 503, description = "No control database, JobDB unavailable, or Director stopping; nothing stored", body = api::ErrorBody),
        (status = 504, description = "The jobs were being written when the write timeout ran out: they may or may not be stored (a repeat skips those stored)", body = api::ErrorBody)
    )
)]
fn backfill_subscription() {}
