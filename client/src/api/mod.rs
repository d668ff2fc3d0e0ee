//! The wire types of spindle's RPC API: the bodies of requests and answers, exactly as they
//! travel. The server (`spindle::rpc`) uses these same types, so the contract has one
//! implementation; with the `openapi` feature they also describe themselves to the server's
//! OpenAPI document (`GET /openapi.json`).
//!
//! Validation of submitted jobs (URLs, header names, limits, defaults) is the server's: a job
//! that deserializes here may still be refused with a `422` naming its field.

mod events;
mod import;
mod listing;
pub mod timestamp;

pub use events::{
    BackfillReply, BackfillRequest, BackfilledEvent, EventBatch, EventDelivery, EventLink,
    EventView, NewEvent, NewSubscription, PastEvent, PayloadFilter, PublishBatchReply,
    PublishReply, SubscriptionList, SubscriptionPatch, SubscriptionView, MAX_EVENTS_PER_REQUEST,
    MAX_JOBS_PER_EVENT_BATCH, MAX_SUBSCRIPTIONS_PER_PAGE,
};
pub use import::{BlockedKey, ImportJob, ImportRequest, ImportResponse, KeptEvent};
pub use listing::{
    AttemptList, AttemptView, EventFilter, EventList, JobFilter, JobList, ListOrder, DEFAULT_PAGE,
    MAX_LISTED_PER_PAGE,
};

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Most jobs in one `POST /v1/jobs` request.
pub const MAX_JOBS_PER_REQUEST: usize = 1000;

/// Most jobs in one `POST /v1/import` request.
pub const MAX_IMPORT_JOBS: usize = 1000;

/// `POST /v1/jobs` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// 1 to 1000 jobs, persisted atomically.
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub jobs: Vec<NewJob>,
}

/// One job to deliver.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = JobSpec))]
#[serde(deny_unknown_fields)]
pub struct NewJob {
    /// Isolation key: a tenant or a source–destination pair (1–128 characters, no control
    /// characters).
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 128,
            pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$"
        )
    )]
    pub bucket: String,
    /// The http or https URL to deliver to (at most 2048 bytes).
    #[cfg_attr(
        feature = "openapi",
        schema(
            max_length = 2048,
            pattern = r"^[hH][tT][tT][pP][sS]?://[^\s\u0000-\u001F\u007F]+$"
        )
    )]
    pub endpoint: String,
    /// HTTP method: POST (default), PUT, PATCH, DELETE or GET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^(POST|PUT|PATCH|DELETE|GET|post|put|patch|delete|get)$")
    )]
    pub method: Option<String>,
    /// Request headers (at most 64): token names, values without control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// The body, as any JSON value (sent as `application/json` unless headers say otherwise).
    /// Kept as the exact bytes given: never parsed into a tree and re-serialized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: Option<Box<serde_json::value::RawValue>>,
    /// The body, as base64 bytes (sent as `application/octet-stream` unless headers say otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// Deadline of one attempt in ms (10..=300000, default 10000).
    #[serde(
        default,
        deserialize_with = "integral",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = 10, maximum = 300000))]
    pub execution_timeout_ms: Option<u64>,
    /// Delay before the second attempt in ms (1..=3600000, default 1000).
    #[serde(
        default,
        deserialize_with = "integral",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 3600000))]
    pub backoff_min_delay_ms: Option<u64>,
    /// Growth of the delay per attempt (1.0..=10.0, default 2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1.0, maximum = 10.0))]
    pub backoff_coefficient: Option<f64>,
    /// When to stop retrying and archive (RFC 3339, in the future). Excludes `ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<DateTime<Utc>>,
    /// Time to live in ms (default 4 h, at most 30 days). Excludes `expire_at`.
    #[serde(
        default,
        deserialize_with = "integral",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 2592000000u64))]
    pub ttl_ms: Option<u64>,
    /// When to make the first attempt (RFC 3339, at most the longest time to live ahead; a time
    /// passed means now). The job waits in the JobDB until then, and `ttl_ms` counts from
    /// then. Excludes `delay_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<DateTime<Utc>>,
    /// Wait this many ms before the first attempt (at most the longest time to live); as
    /// `deliver_at` = now + `delay_ms`. Excludes `deliver_at`.
    #[serde(
        default,
        deserialize_with = "integral",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 2592000000u64))]
    pub delay_ms: Option<u64>,
    /// The producer's idempotency key (1 to 255 characters); stored with the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 255))]
    pub idempotency_key: Option<String>,
    /// An http or https URL (at most 2048 bytes) told when the job ends: once it succeeds, is
    /// discarded or expires, a JSON notice of how it ended (`type` `job.completed`, `job_id`,
    /// `bucket`, `endpoint`, `state`, `attempts`, `response_status`, `error_type`,
    /// `created_at`, `ended_at`) is delivered there as a job of its own, in the same bucket,
    /// signed like the bucket's jobs and retried like any job (4 h to live). Written with the
    /// row that ends the job: never lost, never sent twice for one ending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            max_length = 2048,
            pattern = r"^[hH][tT][tT][pP][sS]?://[^\s\u0000-\u001F\u007F]+$"
        )
    )]
    pub on_complete: Option<String>,
    /// Jobs of one bucket and endpoint that share an ordering key (1 to 255 bytes) are
    /// delivered one at a time, in the order they were accepted: the next is sent only after
    /// the previous ended (succeeded, discarded or expired). A failing job holds only its own
    /// key's later jobs; other keys and unordered jobs go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 255))]
    pub ordering_key: Option<String>,
    /// What an ordered job that ends without success (discarded, expired) does to the jobs of
    /// its key after it: `release` (the default) lets the next one go; `block` holds them until
    /// an operator releases the key (docs/operations.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_failure: Option<OrderingFailure>,
    /// The W3C trace context of the producer's span (`00-<trace id>-<span id>-<flags>`), for
    /// a job of a batch that was made in a trace of its own; otherwise the request's
    /// `traceparent` header applies. Stored with the job: each attempt is a span linked to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
    )]
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that goes with `traceparent` (at most 512 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 512))]
    pub tracestate: Option<String>,
}

/// What an ordered job that ends without success does to the later jobs of its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OrderingFailure {
    /// The next job of the key goes.
    #[default]
    Release,
    /// The key's later jobs wait until an operator releases it.
    Block,
}

impl NewJob {
    /// A job to `endpoint` in `bucket` with no payload and every other field left to the
    /// server's defaults (POST, 10 s per attempt, backoff from 1 s doubling, 4 h to live).
    pub fn new(bucket: impl Into<String>, endpoint: impl Into<String>) -> Self {
        NewJob {
            bucket: bucket.into(),
            endpoint: endpoint.into(),
            method: None,
            headers: None,
            payload: None,
            payload_base64: None,
            execution_timeout_ms: None,
            backoff_min_delay_ms: None,
            backoff_coefficient: None,
            expire_at: None,
            ttl_ms: None,
            deliver_at: None,
            delay_ms: None,
            idempotency_key: None,
            on_complete: None,
            ordering_key: None,
            ordering_failure: None,
            traceparent: None,
            tracestate: None,
        }
    }

    /// Delivered first at `at`, not before (it waits in the JobDB until then).
    pub fn with_deliver_at(mut self, at: DateTime<Utc>) -> Self {
        self.deliver_at = Some(at);
        self.delay_ms = None;
        self
    }

    /// Delivered first `delay` after it is accepted.
    pub fn with_delay(mut self, delay: std::time::Duration) -> Self {
        self.delay_ms = Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        self.deliver_at = None;
        self
    }

    /// With `payload` serialized as the JSON body (replacing any base64 body).
    pub fn with_payload<T: Serialize + ?Sized>(
        mut self,
        payload: &T,
    ) -> Result<Self, serde_json::Error> {
        self.payload = Some(serde_json::value::to_raw_value(payload)?);
        self.payload_base64 = None;
        Ok(self)
    }

    /// With `bytes` as the body, sent base64-encoded (replacing any JSON body).
    pub fn with_payload_bytes(mut self, bytes: &[u8]) -> Self {
        self.payload_base64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        self.payload = None;
        self
    }

    /// With one more request header (a header of the same name is replaced).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers
            .get_or_insert_with(BTreeMap::new)
            .insert(name.into(), value.into());
        self
    }

    /// With an idempotency key: through a router, a second submission of the same bucket and
    /// key within the dedup window is answered `duplicate` with the first job's id.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Tells `url` when the job ends (a JSON notice, delivered as a job of its own).
    pub fn with_on_complete(mut self, url: impl Into<String>) -> Self {
        self.on_complete = Some(url.into());
        self
    }

    /// Delivered in order with the other jobs of its bucket and endpoint that carry `key`:
    /// one at a time, each after the previous ended.
    pub fn with_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// What this ordered job ending without success does to the later jobs of its key.
    pub fn with_ordering_failure(mut self, failure: OrderingFailure) -> Self {
        self.ordering_failure = Some(failure);
        self
    }
}

/// Reads an optional count of milliseconds: a JSON integer, or a number with no fraction
/// (`176.0`), which JSON Schema also calls an integer.
fn integral<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<u64>, D::Error> {
    let number: Option<serde_json::Number> = Option::deserialize(de)?;
    let Some(number) = number else {
        return Ok(None);
    };
    if let Some(n) = number.as_u64() {
        return Ok(Some(n));
    }
    match number.as_f64() {
        Some(f) if f.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&f) => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(format!(
            "expected a whole number, got {number}"
        ))),
    }
}

/// `POST /v1/jobs` answer: the commit that made the jobs durable, and the jobs in request order.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = SubmitResponse))]
pub struct SubmitReply {
    /// Id of the JobDB transaction that persisted the batch.
    pub transaction_id: String,
    /// The accepted jobs, in request order.
    pub jobs: Vec<AcceptedJob>,
}

/// What became of one job of a submission. A Director answers `accepted` for every job of a
/// 202; a router also answers `duplicate`, `pending` and `failed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Persisted now, under `id`.
    #[default]
    Accepted,
    /// Its idempotency key was used within the dedup window: `id` is the original job's, and
    /// nothing new was stored.
    Duplicate,
    /// Another submission of the same key is being stored and is not confirmed yet (`id` is
    /// its job): nothing was stored for this one; submit it again later, with the same key.
    Pending,
    /// Not stored (`error` says why); submit it again, with the same idempotency key if any.
    Failed,
}

impl JobStatus {
    /// The spelling on the wire (`accepted`, `duplicate`, `pending`, `failed`).
    pub const fn as_str(self) -> &'static str {
        match self {
            JobStatus::Accepted => "accepted",
            JobStatus::Duplicate => "duplicate",
            JobStatus::Pending => "pending",
            JobStatus::Failed => "failed",
        }
    }

    /// Whether the job is stored: now (`accepted`) or by an earlier submission (`duplicate`).
    /// Otherwise it should be submitted again (with the same idempotency key).
    pub const fn is_stored(self) -> bool {
        matches!(self, JobStatus::Accepted | JobStatus::Duplicate)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One job of a submission's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AcceptedJob {
    /// The job id (ULID): this job's, or for a duplicate the original job's.
    pub id: String,
    /// What became of it.
    #[serde(default)]
    pub status: JobStatus,
    /// The bucket given.
    pub bucket: String,
    /// When the job was accepted (for `accepted`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "timestamp::option"
    )]
    pub created_at: Option<DateTime<Utc>>,
    /// When it stops being retried (for `accepted`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "timestamp::option"
    )]
    pub expire_at: Option<DateTime<Utc>>,
    /// For an `accepted` job scheduled with `deliver_at` or `delay_ms`: its first attempt's
    /// time.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "timestamp::option"
    )]
    pub deliver_at: Option<DateTime<Utc>>,
    /// The idempotency key given, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// For `pending` and `failed`: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The states of the job state machine, spelled as in the JobDB enum and the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobState {
    /// Persisted, first attempt not yet started.
    AwaitingScheduling,
    /// An attempt is in flight.
    Executing,
    /// Terminal: the endpoint answered 2xx.
    Succeeded,
    /// Terminal: the endpoint answered a permanent failure.
    Discarded,
    /// The last attempt failed and another is scheduled at `retry_at`.
    AwaitingRetry,
    /// Expired before it could be delivered; waiting to be archived.
    Archiving,
    /// Terminal: stored in the archive.
    Archived,
    /// Terminal in this JobDB: a drainer moved the job to another JobDB, where it goes on.
    Moved,
}

impl JobState {
    /// Every state, in the order of the JobDB enum.
    pub const ALL: [JobState; 8] = [
        JobState::AwaitingScheduling,
        JobState::Executing,
        JobState::Succeeded,
        JobState::Discarded,
        JobState::AwaitingRetry,
        JobState::Archiving,
        JobState::Archived,
        JobState::Moved,
    ];

    /// The spelling used in the JobDB and the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            JobState::AwaitingScheduling => "awaiting-scheduling",
            JobState::Executing => "executing",
            JobState::Succeeded => "succeeded",
            JobState::Discarded => "discarded",
            JobState::AwaitingRetry => "awaiting-retry",
            JobState::Archiving => "archiving",
            JobState::Archived => "archived",
            JobState::Moved => "moved",
        }
    }

    /// Whether nothing more will ever happen to a job in this state, in this JobDB (a moved
    /// job goes on in the JobDB it was moved to).
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Discarded | JobState::Archived | JobState::Moved
        )
    }

    /// Whether this is the job's end everywhere: delivered, given up, or archived.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Discarded | JobState::Archived
        )
    }

    /// Whether `next` may follow `self` in a job's history.
    pub fn may_precede(self, next: JobState) -> bool {
        use JobState::*;
        matches!(
            (self, next),
            (AwaitingScheduling, Executing | Archiving | Moved)
                | (Executing, Succeeded | Discarded | AwaitingRetry)
                | (AwaitingRetry, Executing | Archiving | Moved)
                // Operator commands: expedite and postpone reschedule a waiting job, discard
                // ends it.
                | (AwaitingScheduling | AwaitingRetry, AwaitingRetry | Discarded)
                | (Archiving, Archived)
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for a state name that is not one of [`JobState::ALL`].
#[derive(Debug, thiserror::Error)]
#[error("unknown job state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// What a job is, as every view of a stored job shows it (the Director's `GET /v1/jobs/{id}`,
/// the dashboard's traces): one type, so a field added to a job is added to every view here.
/// Views flatten it and add what only they show.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobDescription {
    /// The job id (ULID).
    pub id: String,
    /// The id as `HEX(id)` prints it in SQL.
    pub id_hex: String,
    /// Current state (that of the latest transition).
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "succeeded"))]
    pub state: JobState,
    /// Attempts started so far.
    pub attempts: u16,
    /// The bucket.
    pub bucket: String,
    /// The endpoint URL.
    pub endpoint: String,
    /// The HTTP method.
    pub method: String,
    /// Deadline of one attempt.
    pub execution_timeout_ms: u64,
    /// Delay before the second attempt.
    pub backoff_min_delay_ms: u64,
    /// Growth of the delay per attempt.
    pub backoff_coefficient: f64,
    /// When the job was accepted.
    pub created_at: DateTime<Utc>,
    /// When it stops being retried.
    pub expire_at: DateTime<Utc>,
    /// The producer's idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Its ordering key, if it is delivered in order with its key's other jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// For an ordered job: what its failure does to its key's later jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_failure: Option<OrderingFailure>,
    /// Where its completion notice goes, if it asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_complete: Option<String>,
    /// The event it delivers, if an event's subscription made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<EventLink>,
    /// The W3C trace context it was submitted in, which its attempts' spans link to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The `tracestate` that went with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// Every state transition, oldest first.
    pub transitions: Vec<TransitionView>,
}

/// `GET /v1/jobs/{id}` answer: the job ([`JobDescription`], flattened), what it sends
/// (headers and body) and its full trace.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    /// The job, its state and its trace.
    #[serde(flatten)]
    pub job: JobDescription,
    /// Headers sent with each attempt.
    pub headers: BTreeMap<String, String>,
    /// The body, base64-encoded.
    pub payload_base64: String,
}

/// One row of a job's trace.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TransitionView {
    /// Monotonic row id within the JobDB.
    pub id: u64,
    /// State entered.
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, example = "awaiting-retry")
    )]
    pub state: JobState,
    /// Attempts started so far.
    pub attempts: u16,
    /// When the state was entered.
    pub time: DateTime<Utc>,
    /// When the next attempt is due (awaiting-retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
    /// Failure kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// Start of the failed answer (text, or base64 when `error_response_encoding` is `base64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_response: Option<String>,
    /// `utf-8` or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_response_encoding: Option<String>,
    /// HTTP status of the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    /// Duration of the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u32>,
}

/// `GET /v1/endpoints` answer: the health of every endpoint this Director is working for.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointsView {
    /// One entry per endpoint with jobs queued or in flight, or a breaker that remembers it.
    pub endpoints: Vec<EndpointHealth>,
}

/// One endpoint as a Director sees it (updated once a second).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointHealth {
    /// The endpoint (URL without query).
    pub endpoint: String,
    /// Jobs ready to be sent, waiting in its queue.
    pub ready: usize,
    /// Requests in flight.
    pub in_flight: usize,
    /// `closed` (normal) or `open` (judged down: one probe at a time).
    pub breaker: String,
    /// Attempts remembered by the breaker, and how many of them failed.
    pub recent_attempts: usize,
    /// Failed among `recent_attempts`.
    pub recent_failures: usize,
    /// Paused by an endpoint control.
    pub paused: bool,
    /// Requests in flight allowed now (after caps and pause).
    pub concurrency: usize,
    /// A rate cap, if any.
    pub max_per_second: Option<f64>,
    /// Parked since (its jobs wait, one probe now and then), if it is parked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_since: Option<chrono::DateTime<chrono::Utc>>,
    /// Why it was parked, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park_reason: Option<String>,
    /// When the oldest job at the head of one of its queues was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Requests per second allowed by the pace of its re-drive, if it was unparked lately.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive_per_second: Option<f64>,
    /// Seconds its ready jobs take at the re-drive's pace, if it is paced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive_eta_secs: Option<f64>,
}

/// Every error answer: `{"error": {...}}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The detail of an error answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    /// Stable machine-readable code (`invalid_json`, `invalid_field`, `too_large`, `not_found`,
    /// `unavailable`, `shutting_down`, `internal`).
    pub code: String,
    /// Human-readable explanation (lower case, no internal detail).
    pub message: String,
    /// The offending field, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_jobs_serialize_only_what_is_set() {
        let job = NewJob::new("b", "https://example.test/hook")
            .with_payload(&serde_json::json!({"a": 1}))
            .unwrap()
            .with_header("x-k", "v")
            .with_idempotency_key("k1");
        let text = serde_json::to_string(&job).unwrap();
        assert_eq!(
            text,
            r#"{"bucket":"b","endpoint":"https://example.test/hook","headers":{"x-k":"v"},"payload":{"a":1},"idempotency_key":"k1"}"#
        );
        let back: NewJob = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
    }

    #[test]
    fn payloads_keep_their_bytes_and_exclude_each_other() {
        let job: NewJob = serde_json::from_str(
            r#"{"bucket":"b","endpoint":"http://x","payload":{"z": 1.50, "a":[ ]}}"#,
        )
        .unwrap();
        assert_eq!(
            job.payload.as_ref().unwrap().get(),
            r#"{"z": 1.50, "a":[ ]}"#
        );
        let job = job.with_payload_bytes(b"\x00\x01");
        assert!(job.payload.is_none());
        assert_eq!(job.payload_base64.as_deref(), Some("AAE="));
    }

    #[test]
    fn jobs_convert_from_json_values() {
        let value =
            serde_json::json!({"bucket": "b", "endpoint": "http://x", "payload": {"a": [1, 2]}});
        let job: NewJob = serde_json::from_value(value).unwrap();
        assert_eq!(job.payload.unwrap().get(), r#"{"a":[1,2]}"#);
    }

    #[test]
    fn whole_numbers_are_integers_and_unknown_fields_are_refused() {
        let job: NewJob = serde_json::from_str(
            r#"{"bucket":"b","endpoint":"http://x","ttl_ms":176.0,"execution_timeout_ms":null}"#,
        )
        .unwrap();
        assert_eq!(job.ttl_ms, Some(176));
        assert_eq!(job.execution_timeout_ms, None);
        assert!(serde_json::from_str::<NewJob>(
            r#"{"bucket":"b","endpoint":"http://x","ttl_ms":1.5}"#
        )
        .is_err());
        let unknown = serde_json::from_str::<NewJob>(
            r#"{"bucket":"b","endpoint":"http://x","max_attempts":3}"#,
        )
        .unwrap_err();
        assert!(unknown.to_string().contains("max_attempts"), "{unknown}");
    }

    #[test]
    fn states_round_trip_and_classify() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().unwrap(), state);
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{state}\""));
        }
        assert!("running".parse::<JobState>().is_err());
        assert!(JobState::Moved.is_terminal() && !JobState::Moved.is_final());
    }

    #[test]
    fn statuses_spell_as_on_the_wire() {
        for status in [
            JobStatus::Accepted,
            JobStatus::Duplicate,
            JobStatus::Pending,
            JobStatus::Failed,
        ] {
            assert_eq!(
                serde_json::to_string(&status).unwrap(),
                format!("\"{status}\"")
            );
        }
        assert!(JobStatus::Duplicate.is_stored() && !JobStatus::Pending.is_stored());
    }
}
