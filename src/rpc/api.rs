//! The RPC contract: request and response bodies, and validation of submitted jobs.
//!
//! Validation turns a [`JobSpec`] into a [`Job`] or a [`FieldError`] naming the exact field
//! (`jobs[3].endpoint`); a batch with any error is rejected whole.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::job::{Job, JobId, RetryPolicy, State, Transition};

/// Limits and defaults applied to submitted jobs.
#[derive(Clone, Debug)]
pub struct IntakeLimits {
    /// Most jobs in one request.
    pub max_jobs_per_request: usize,
    /// Largest request body.
    pub max_request_bytes: usize,
    /// Largest payload of one job (after base64 decoding).
    pub max_payload_bytes: usize,
    /// Execution timeout when none is given.
    pub default_timeout: Duration,
    /// Longest execution timeout accepted.
    pub max_timeout: Duration,
    /// Backoff minimum delay when none is given.
    pub default_min_delay: Duration,
    /// Longest backoff minimum delay accepted.
    pub max_min_delay: Duration,
    /// Backoff coefficient when none is given.
    pub default_coefficient: f64,
    /// Largest backoff coefficient accepted.
    pub max_coefficient: f64,
    /// Time to live when neither `expire_at` nor `ttl_ms` is given.
    pub default_ttl: Duration,
    /// Longest time to live accepted.
    pub max_ttl: Duration,
}

impl Default for IntakeLimits {
    fn default() -> Self {
        IntakeLimits {
            max_jobs_per_request: 1000,
            max_request_bytes: 32 * 1024 * 1024,
            max_payload_bytes: 1024 * 1024,
            default_timeout: Duration::from_secs(10),
            max_timeout: Duration::from_secs(300),
            default_min_delay: Duration::from_secs(1),
            max_min_delay: Duration::from_secs(3600),
            default_coefficient: 2.0,
            max_coefficient: 10.0,
            default_ttl: Duration::from_secs(4 * 3600),
            max_ttl: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// Shortest execution timeout accepted: below this nothing real can answer.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(10);
/// Longest endpoint URL.
pub const MAX_URL_BYTES: usize = 2048;
/// Longest bucket name, in characters (as the VARCHAR column counts them).
pub const MAX_BUCKET_CHARS: usize = 128;
/// Longest idempotency key, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;
/// Most headers on one job.
pub const MAX_HEADERS: usize = 64;
/// Largest header name plus value.
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// Methods a job may use.
pub const METHODS: [&str; 5] = ["POST", "PUT", "PATCH", "DELETE", "GET"];
/// Headers a job may not set: they describe the connection or the framing, which the client
/// owns, or they are spindle's own.
const RESERVED_HEADERS: [&str; 12] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "spindle-job-id",
    "spindle-attempt",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
];

/// `POST /v1/jobs` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// 1 to 1000 jobs, persisted atomically.
    #[schema(min_items = 1, max_items = 1000)]
    pub jobs: Vec<JobSpec>,
}

/// One job to deliver.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Isolation key: a tenant or a source–destination pair (1–128 characters, no control
    /// characters).
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$"
    )]
    pub bucket: String,
    /// The http or https URL to deliver to (at most 2048 bytes).
    #[schema(
        max_length = 2048,
        pattern = r"^[hH][tT][tT][pP][sS]?://[^\s\u0000-\u001F\u007F]+$"
    )]
    pub endpoint: String,
    /// HTTP method: POST (default), PUT, PATCH, DELETE or GET.
    #[serde(default)]
    #[schema(pattern = "^(POST|PUT|PATCH|DELETE|GET|post|put|patch|delete|get)$")]
    pub method: Option<String>,
    /// Request headers (at most 64): token names, values without control characters.
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
    /// The body, as any JSON value (sent as `application/json` unless headers say otherwise).
    /// Kept as the exact bytes given: never parsed into a tree and re-serialized.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub payload: Option<Box<serde_json::value::RawValue>>,
    /// The body, as base64 bytes (sent as `application/octet-stream` unless headers say otherwise).
    #[serde(default)]
    pub payload_base64: Option<String>,
    /// Deadline of one attempt in ms (10..=300000, default 10000).
    #[serde(default, deserialize_with = "integral")]
    #[schema(minimum = 10, maximum = 300000)]
    pub execution_timeout_ms: Option<u64>,
    /// Delay before the second attempt in ms (1..=3600000, default 1000).
    #[serde(default, deserialize_with = "integral")]
    #[schema(minimum = 1, maximum = 3600000)]
    pub backoff_min_delay_ms: Option<u64>,
    /// Growth of the delay per attempt (1.0..=10.0, default 2.0).
    #[serde(default)]
    #[schema(minimum = 1.0, maximum = 10.0)]
    pub backoff_coefficient: Option<f64>,
    /// When to stop retrying and archive (RFC 3339, in the future). Excludes `ttl_ms`.
    #[serde(default)]
    pub expire_at: Option<DateTime<Utc>>,
    /// Time to live in ms (default 4 h, at most 30 days). Excludes `expire_at`.
    #[serde(default, deserialize_with = "integral")]
    #[schema(minimum = 1, maximum = 2592000000u64)]
    pub ttl_ms: Option<u64>,
    /// The producer's idempotency key (1 to 255 characters); stored with the job.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255)]
    pub idempotency_key: Option<String>,
}

/// Whether `name` (as the URL parser normalised it: lower case, IDNA applied) is a DNS name.
fn valid_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.trim_end_matches('.').split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
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

/// A field that failed validation, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, e.g. `jobs[2].headers.x-a`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
    /// Whether the failure is about size (answered 413).
    pub too_large: bool,
}

impl FieldError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
            too_large: false,
        }
    }

    fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            too_large: true,
            ..FieldError::new(field, message)
        }
    }
}

/// Validates a whole request; every job gets an id from `next_id`.
pub fn validate_request(
    request: SubmitRequest,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    mut next_id: impl FnMut() -> JobId,
) -> Result<Vec<Arc<Job>>, FieldError> {
    if request.jobs.is_empty() {
        return Err(FieldError::new("jobs", "must hold at least one job"));
    }
    if request.jobs.len() > limits.max_jobs_per_request {
        return Err(FieldError::new(
            "jobs",
            format!(
                "holds {} jobs; at most {} are allowed",
                request.jobs.len(),
                limits.max_jobs_per_request
            ),
        ));
    }
    request
        .jobs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            validate_job(spec, &format!("jobs[{i}]"), limits, now, next_id()).map(Arc::new)
        })
        .collect()
}

fn validate_job(
    spec: JobSpec,
    at: &str,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    id: JobId,
) -> Result<Job, FieldError> {
    let field = |name: &str| format!("{at}.{name}");

    if spec.bucket.is_empty() || spec.bucket.chars().count() > MAX_BUCKET_CHARS {
        return Err(FieldError::new(
            field("bucket"),
            format!("must be 1 to {MAX_BUCKET_CHARS} characters"),
        ));
    }
    if spec.bucket.chars().any(char::is_control) {
        return Err(FieldError::new(
            field("bucket"),
            "must not contain control characters",
        ));
    }

    if spec.endpoint.len() > MAX_URL_BYTES {
        return Err(FieldError::new(
            field("endpoint"),
            format!("is longer than {MAX_URL_BYTES} bytes"),
        ));
    }
    if spec
        .endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(FieldError::new(
            field("endpoint"),
            "must be an encoded URL: no spaces or control characters",
        ));
    }
    let url = url::Url::parse(&spec.endpoint)
        .map_err(|e| FieldError::new(field("endpoint"), format!("is not a valid URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(FieldError::new(
            field("endpoint"),
            "scheme must be http or https",
        ));
    }
    match url.host() {
        None => return Err(FieldError::new(field("endpoint"), "must name a host")),
        Some(url::Host::Domain(name)) if !valid_host_name(name) => {
            return Err(FieldError::new(
                field("endpoint"),
                "host must be a DNS name or an IP address",
            ));
        }
        Some(_) => {}
    }

    let method = spec
        .method
        .as_deref()
        .unwrap_or("POST")
        .to_ascii_uppercase();
    if !METHODS.contains(&method.as_str()) {
        return Err(FieldError::new(
            field("method"),
            format!("must be one of {}", METHODS.join(", ")),
        ));
    }

    let mut headers = Vec::new();
    let given = spec.headers.unwrap_or_default();
    if given.len() > MAX_HEADERS {
        return Err(FieldError::too_large(
            field("headers"),
            format!("at most {MAX_HEADERS} headers are allowed"),
        ));
    }
    for (name, value) in given {
        let f = field(&format!("headers.{name}"));
        if name.len() + value.len() > MAX_HEADER_BYTES {
            return Err(FieldError::too_large(
                f,
                format!("name and value exceed {MAX_HEADER_BYTES} bytes"),
            ));
        }
        let parsed = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| FieldError::new(f.clone(), "is not a valid header name"))?;
        if RESERVED_HEADERS.contains(&parsed.as_str()) {
            return Err(FieldError::new(f, "is set by spindle and may not be given"));
        }
        if value.contains(['\r', '\n']) || http::HeaderValue::from_str(&value).is_err() {
            return Err(FieldError::new(
                f,
                "value must be visible ASCII or spaces, without CR or LF",
            ));
        }
        headers.push((parsed.as_str().to_owned(), value));
    }

    let (payload, default_type) = match (spec.payload, spec.payload_base64) {
        (Some(_), Some(_)) => {
            return Err(FieldError::new(
                field("payload_base64"),
                "give payload or payload_base64, not both",
            ))
        }
        (Some(raw), None) => (
            Bytes::from(String::from(Box::<str>::from(raw))),
            "application/json",
        ),
        (None, Some(b64)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| {
                    FieldError::new(field("payload_base64"), format!("is not valid base64: {e}"))
                })?;
            (Bytes::from(bytes), "application/octet-stream")
        }
        (None, None) => (Bytes::new(), "application/json"),
    };
    if payload.len() > limits.max_payload_bytes {
        let name = if default_type == "application/json" {
            "payload"
        } else {
            "payload_base64"
        };
        return Err(FieldError::too_large(
            field(name),
            format!(
                "is {} bytes; at most {} are allowed",
                payload.len(),
                limits.max_payload_bytes
            ),
        ));
    }
    if !payload.is_empty() && !headers.iter().any(|(n, _)| n == "content-type") {
        headers.push(("content-type".to_owned(), default_type.to_owned()));
    }

    let timeout = match spec.execution_timeout_ms {
        None => limits.default_timeout,
        Some(ms) => {
            let d = Duration::from_millis(ms);
            if d < MIN_TIMEOUT || d > limits.max_timeout {
                return Err(FieldError::new(
                    field("execution_timeout_ms"),
                    format!(
                        "must be between {} and {} ms",
                        MIN_TIMEOUT.as_millis(),
                        limits.max_timeout.as_millis()
                    ),
                ));
            }
            d
        }
    };
    let min_delay = match spec.backoff_min_delay_ms {
        None => limits.default_min_delay,
        Some(ms) => {
            let d = Duration::from_millis(ms);
            if ms == 0 || d > limits.max_min_delay {
                return Err(FieldError::new(
                    field("backoff_min_delay_ms"),
                    format!(
                        "must be between 1 and {} ms",
                        limits.max_min_delay.as_millis()
                    ),
                ));
            }
            d
        }
    };
    let coefficient = spec
        .backoff_coefficient
        .unwrap_or(limits.default_coefficient);
    if !(1.0..=limits.max_coefficient).contains(&coefficient) {
        return Err(FieldError::new(
            field("backoff_coefficient"),
            format!("must be between 1.0 and {}", limits.max_coefficient),
        ));
    }

    let max_expiry =
        now + chrono::Duration::from_std(limits.max_ttl).unwrap_or(chrono::Duration::MAX);
    let expire_at = match (spec.expire_at, spec.ttl_ms) {
        (Some(_), Some(_)) => {
            return Err(FieldError::new(
                field("ttl_ms"),
                "give expire_at or ttl_ms, not both",
            ))
        }
        (Some(at), None) => {
            if at <= now {
                return Err(FieldError::new(field("expire_at"), "must be in the future"));
            }
            if at > max_expiry {
                return Err(FieldError::new(
                    field("expire_at"),
                    format!("must be within {} s from now", limits.max_ttl.as_secs()),
                ));
            }
            at
        }
        (None, ttl) => {
            let ttl = ttl.map(Duration::from_millis).unwrap_or(limits.default_ttl);
            if ttl.is_zero() || ttl > limits.max_ttl {
                return Err(FieldError::new(
                    field("ttl_ms"),
                    format!("must be between 1 and {} ms", limits.max_ttl.as_millis()),
                ));
            }
            now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX)
        }
    };

    if let Some(key) = &spec.idempotency_key {
        if key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS {
            return Err(FieldError::new(
                field("idempotency_key"),
                format!("must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters"),
            ));
        }
    }

    Ok(Job {
        id,
        bucket: spec.bucket.into(),
        endpoint: spec.endpoint.into(),
        method: method.into(),
        headers,
        payload,
        execution_timeout: timeout,
        retry: RetryPolicy {
            min_delay,
            coefficient,
        },
        created_at: now,
        expire_at,
        idempotency_key: spec.idempotency_key,
    })
}

/// `POST /v1/jobs` answer: the commit that made the jobs durable, and the jobs in request order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SubmitResponse {
    /// Id of the JobDB transaction that persisted the batch.
    pub transaction_id: String,
    /// The accepted jobs, in request order.
    pub jobs: Vec<AcceptedJob>,
}

/// What became of one job of a submission. A Director answers `accepted` for every job of a
/// 202; a router also answers `duplicate`, `pending` and `failed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

/// One job of a submission's answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AcceptedJob {
    /// The job id (ULID): this job's, or for a duplicate the original job's.
    pub id: String,
    /// What became of it.
    #[serde(default)]
    pub status: JobStatus,
    /// The bucket given.
    pub bucket: String,
    /// When the job was accepted (for `accepted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// When it stops being retried (for `accepted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<DateTime<Utc>>,
    /// The idempotency key given, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// For `pending` and `failed`: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<&Job> for AcceptedJob {
    fn from(job: &Job) -> Self {
        AcceptedJob {
            id: job.id.to_string(),
            status: JobStatus::Accepted,
            bucket: job.bucket.to_string(),
            created_at: Some(job.created_at),
            expire_at: Some(job.expire_at),
            idempotency_key: job.idempotency_key.clone(),
            error: None,
        }
    }
}

/// `GET /v1/jobs/{id}` answer: the job, its current state and its full trace.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    /// The job id (ULID).
    pub id: String,
    /// The id as `HEX(id)` prints it in SQL.
    pub id_hex: String,
    /// Current state (that of the latest transition).
    #[schema(value_type = String, example = "succeeded")]
    pub state: State,
    /// Attempts started so far.
    pub attempts: u16,
    /// The bucket.
    pub bucket: String,
    /// The endpoint URL.
    pub endpoint: String,
    /// The HTTP method.
    pub method: String,
    /// Headers sent with each attempt.
    pub headers: BTreeMap<String, String>,
    /// The body, base64-encoded.
    pub payload_base64: String,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Every state transition, oldest first.
    pub transitions: Vec<TransitionView>,
}

/// One row of a job's trace.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TransitionView {
    /// Monotonic row id within the JobDB.
    pub id: u64,
    /// State entered.
    #[schema(value_type = String, example = "awaiting-retry")]
    pub state: State,
    /// Attempts started so far.
    pub attempts: u16,
    /// When the state was entered.
    pub time: DateTime<Utc>,
    /// When the next attempt is due (awaiting-retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
    /// Failure kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// Start of the failed answer (text, or base64 when `error_response_encoding` is `base64`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_response: Option<String>,
    /// `utf-8` or `base64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_response_encoding: Option<String>,
    /// HTTP status of the attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    /// Duration of the attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u32>,
}

impl JobView {
    /// The view of a job and its trace (oldest first).
    pub fn new(job: &Job, trace: &[(u64, Transition)]) -> Self {
        let last = trace.last().map(|(_, t)| t);
        let b64 = base64::engine::general_purpose::STANDARD;
        JobView {
            id: job.id.to_string(),
            id_hex: job.id.to_hex(),
            state: last.map_or(State::AwaitingScheduling, |t| t.state),
            attempts: last.map_or(0, |t| t.attempts),
            bucket: job.bucket.to_string(),
            endpoint: job.endpoint.to_string(),
            method: job.method.to_string(),
            headers: job.headers.iter().cloned().collect(),
            payload_base64: b64.encode(&job.payload),
            execution_timeout_ms: job.execution_timeout.as_millis() as u64,
            backoff_min_delay_ms: job.retry.min_delay.as_millis() as u64,
            backoff_coefficient: job.retry.coefficient,
            created_at: job.created_at,
            expire_at: job.expire_at,
            idempotency_key: job.idempotency_key.clone(),
            transitions: trace
                .iter()
                .map(|(id, t)| TransitionView::new(*id, t))
                .collect(),
        }
    }
}

impl TransitionView {
    /// The view of one transition row (its error response as text, or base64 when it is not
    /// UTF-8).
    pub fn new(id: u64, t: &Transition) -> Self {
        let b64 = base64::engine::general_purpose::STANDARD;
        let (error_response, encoding) = match (&t.error_response, t.error_response_encoding) {
            (Some(body), Some("utf-8")) => (
                Some(String::from_utf8_lossy(body).into_owned()),
                Some("utf-8".to_owned()),
            ),
            (Some(body), _) => (Some(b64.encode(body)), Some("base64".to_owned())),
            (None, _) => (None, None),
        };
        TransitionView {
            id,
            state: t.state,
            attempts: t.attempts,
            time: t.time,
            retry_at: t.retry_at,
            error_type: t.error_type.clone(),
            error_response,
            error_response_encoding: encoding,
            response_status: t.response_status,
            duration_ms: t.duration_ms,
        }
    }
}

/// Every error answer: `{"error": {...}}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The detail of an error answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code (`invalid_json`, `invalid_field`, `too_large`, `not_found`,
    /// `unavailable`, `shutting_down`, `internal`).
    pub code: String,
    /// Human-readable explanation (lower case, no internal detail).
    pub message: String,
    /// The offending field, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> JobSpec {
        serde_json::from_value(json).unwrap()
    }

    fn check(json: serde_json::Value) -> Result<Job, FieldError> {
        validate_job(
            spec(json),
            "jobs[0]",
            &IntakeLimits::default(),
            Utc::now(),
            JobId(ulid::Ulid::new()),
        )
    }

    #[test]
    fn defaults_apply() {
        let job = check(
            serde_json::json!({"bucket": "b", "endpoint": "http://x/y", "payload": {"a": 1}}),
        )
        .unwrap();
        assert_eq!(&*job.method, "POST");
        assert_eq!(job.execution_timeout, Duration::from_secs(10));
        assert_eq!(job.retry.coefficient, 2.0);
        assert_eq!(&job.payload[..], br#"{"a":1}"#);
        assert_eq!(
            job.headers,
            vec![("content-type".to_owned(), "application/json".to_owned())]
        );
        let ttl = job.expire_at - job.created_at;
        assert_eq!(ttl, chrono::Duration::hours(4));
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (
                serde_json::json!({"bucket": "", "endpoint": "http://x"}),
                "jobs[0].bucket",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "ftp://x"}),
                "jobs[0].endpoint",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "not a url"}),
                "jobs[0].endpoint",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://a*/"}),
                "jobs[0].endpoint",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://a/b c"}),
                "jobs[0].endpoint",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "method": "TRACE"}),
                "jobs[0].method",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "headers": {"x-a": "1\r\nx-b: 2"}}),
                "jobs[0].headers.x-a",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "headers": {"bad name": "1"}}),
                "jobs[0].headers.bad name",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "headers": {"Host": "evil"}}),
                "jobs[0].headers.Host",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "payload": 1, "payload_base64": "AA=="}),
                "jobs[0].payload_base64",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "payload_base64": "%%%"}),
                "jobs[0].payload_base64",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "execution_timeout_ms": 0}),
                "jobs[0].execution_timeout_ms",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "execution_timeout_ms": 86_400_000u64}),
                "jobs[0].execution_timeout_ms",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "backoff_min_delay_ms": 0}),
                "jobs[0].backoff_min_delay_ms",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "backoff_coefficient": 0.5}),
                "jobs[0].backoff_coefficient",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "expire_at": "2001-01-01T00:00:00Z"}),
                "jobs[0].expire_at",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "ttl_ms": 0}),
                "jobs[0].ttl_ms",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "ttl_ms": 5, "expire_at": "2999-01-01T00:00:00Z"}),
                "jobs[0].ttl_ms",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "idempotency_key": ""}),
                "jobs[0].idempotency_key",
            ),
        ];
        for (json, field) in cases {
            let err = check(json.clone()).expect_err(&json.to_string());
            assert_eq!(err.field, field, "{json}: {}", err.message);
        }
    }

    #[test]
    fn oversized_payload_is_too_large() {
        let big = "x".repeat(1024 * 1024 + 1);
        let err = check(serde_json::json!({"bucket": "b", "endpoint": "http://x", "payload": big}))
            .unwrap_err();
        assert_eq!(err.field, "jobs[0].payload");
        assert!(err.too_large);
    }
}

/// `GET /v1/endpoints` answer: the health of every endpoint this Director is working for.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct EndpointsView {
    /// One entry per endpoint with jobs queued or in flight, or a breaker that remembers it.
    pub endpoints: Vec<EndpointHealth>,
}

/// One endpoint as a Director sees it (updated once a second).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
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
}
