//! Validation of submitted jobs: a [`NewJob`] becomes a [`Job`] or a [`FieldError`] naming the
//! exact field (`jobs[3].endpoint`), a batch with any error being rejected whole. The field
//! checks (`check_*`) are shared with imports ([`super::import`]).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::api::{NewJob, OrderingFailure, SubmitRequest, MAX_JOBS_PER_REQUEST};
use crate::job::{Job, JobId, RetryPolicy, Scheduled};

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
            max_jobs_per_request: MAX_JOBS_PER_REQUEST,
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
const RESERVED_HEADERS: [&str; 15] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "spindle-job-id",
    "spindle-attempt",
    "spindle-event-id",
    "spindle-event-type",
    "spindle-subscription-id",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
];

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

    pub(crate) fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            too_large: true,
            ..FieldError::new(field, message)
        }
    }
}

/// Validates a whole request; every job gets an id from `next_id`. A job's requested first
/// attempt time is in the answer when it is after `now`, less `keep_passed` (a router, whose
/// clock may run that far ahead of the Director that judges the time).
pub fn validate_request(
    request: SubmitRequest,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    keep_passed: chrono::Duration,
    mut next_id: impl FnMut() -> JobId,
) -> Result<(Vec<Arc<Job>>, Scheduled), FieldError> {
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
    // Jobs of one request mostly share their bucket, endpoint and method: one allocation each
    // for the request, not one per job (a backlog of jobs in memory holds them all).
    let mut shared = Shared::default();
    let mut jobs = Vec::with_capacity(request.jobs.len());
    let mut scheduled = Scheduled::new();
    for (i, spec) in request.jobs.into_iter().enumerate() {
        let (job, deliver_at) = validate_job(spec, &format!("jobs[{i}]"), limits, now, next_id())?;
        // A time already passed means now: the job is delivered like any other.
        let passed_since = now.checked_sub_signed(keep_passed).unwrap_or(now);
        if let Some(at) = deliver_at.filter(|at| *at > passed_since) {
            scheduled.push((job.id, at));
        }
        jobs.push(Arc::new(shared.intern(job)));
    }
    Ok((jobs, scheduled))
}

/// The strings the jobs of one request share, allocated once.
#[derive(Default)]
struct Shared {
    strings: Vec<Arc<str>>,
}

impl Shared {
    /// `text` as an `Arc` this request already holds, or a new one it keeps.
    fn get(&mut self, text: Arc<str>) -> Arc<str> {
        if let Some(found) = self.strings.iter().find(|s| ***s == *text) {
            return found.clone();
        }
        // A handful of distinct values per request is the common case; past that, no gain.
        if self.strings.len() < 16 {
            self.strings.push(text.clone());
        }
        text
    }

    fn intern(&mut self, mut job: Job) -> Job {
        job.bucket = self.get(job.bucket);
        job.endpoint = self.get(job.endpoint);
        job.method = self.get(job.method);
        job
    }
}

/// Checks one job as intake does, before it is sent (`spindle submit` checks a whole file
/// first). Fields are named without the `jobs[i].` prefix (`endpoint`, `headers.x-a`).
/// Limits that a server may configure (`max_payload_bytes`) are the caller's `limits`.
pub fn check_job(
    spec: NewJob,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
) -> Result<(), FieldError> {
    JobTemplate::check(spec, limits, now).map(drop)
}

/// A job checked once and made many times, each with its own id, body, times and ordering
/// key: a subscription's, whose event jobs differ only there (publishing does not check its
/// URL and headers again for every event).
#[derive(Clone, Debug)]
pub struct JobTemplate {
    job: Job,
    ttl_ms: Option<u64>,
    ordering_failure: Option<OrderingFailure>,
}

impl JobTemplate {
    /// Checks `spec` as intake does ([`check_job`] names its fields); its id, payload, times
    /// and ordering key are [`JobTemplate::make`]'s.
    pub fn check(
        spec: NewJob,
        limits: &IntakeLimits,
        now: DateTime<Utc>,
    ) -> Result<JobTemplate, FieldError> {
        let (ttl_ms, ordering_failure) = (spec.ttl_ms, spec.ordering_failure);
        let (job, _) =
            validate_job(spec, "job", limits, now, JobId(ulid::Ulid::nil())).map_err(|mut e| {
                if let Some(name) = e.field.strip_prefix("job.") {
                    e.field = name.to_owned();
                }
                e
            })?;
        Ok(JobTemplate {
            job,
            ttl_ms,
            ordering_failure,
        })
    }

    /// Its job `id`, accepted `now`, carrying `payload` (the caller checked its size). Its
    /// first attempt is at `deliver_at` (the field so named; returned when given) and it
    /// lives for the template's `ttl_ms` from then; `ordering_key` (1 to
    /// [`MAX_ORDERING_KEY_BYTES`], field `ordering_key`) orders it with the template's
    /// `ordering_failure`.
    pub fn make(
        &self,
        id: JobId,
        payload: Bytes,
        ordering_key: Option<&str>,
        deliver_at: Option<DateTime<Utc>>,
        limits: &IntakeLimits,
        now: DateTime<Utc>,
    ) -> Result<(Job, Option<DateTime<Utc>>), FieldError> {
        let given = Times {
            deliver_at,
            ttl_ms: self.ttl_ms,
            ..Times::default()
        };
        let (deliver_at, expire_at) = check_times(given, limits, now, str::to_owned)?;
        let failure = ordering_key.and(self.ordering_failure);
        let ordering = check_ordering(
            ordering_key,
            failure,
            id.0,
            "ordering_key",
            "ordering_failure",
        )?;
        let job = Job {
            id,
            payload,
            created_at: now,
            expire_at,
            ordering,
            ..self.job.clone()
        };
        Ok((job, deliver_at))
    }
}

fn validate_job(
    spec: NewJob,
    at: &str,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    id: JobId,
) -> Result<(Job, Option<DateTime<Utc>>), FieldError> {
    let field = |name: &str| format!("{at}.{name}");

    check_bucket(&spec.bucket, &field("bucket"))?;
    check_endpoint(&spec.endpoint, &field("endpoint"))?;
    let method = spec
        .method
        .as_deref()
        .unwrap_or("POST")
        .to_ascii_uppercase();
    check_method(&method, &field("method"))?;
    let given: Vec<(String, String)> = spec.headers.unwrap_or_default().into_iter().collect();
    let mut headers = check_headers(&given, &field("headers"))?;

    let (payload, default_type) = match (spec.payload, spec.payload_base64) {
        (Some(_), Some(_)) => {
            return Err(FieldError::new(
                field("payload_base64"),
                "give payload or payload_base64, not both",
            ))
        }
        (Some(raw), None) => (super::json_bytes(raw), "application/json"),
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
    let payload_field = if default_type == "application/json" {
        field("payload")
    } else {
        field("payload_base64")
    };
    check_payload(payload.len(), limits, &payload_field)?;
    if !payload.is_empty() && !headers.iter().any(|(n, _)| n == "content-type") {
        headers.push(("content-type".to_owned(), default_type.to_owned()));
    }

    let timeout = match spec.execution_timeout_ms {
        None => limits.default_timeout,
        Some(ms) => check_timeout(ms, limits, &field("execution_timeout_ms"))?,
    };
    let min_delay = match spec.backoff_min_delay_ms {
        None => limits.default_min_delay,
        Some(ms) => check_min_delay(ms, limits, &field("backoff_min_delay_ms"))?,
    };
    let coefficient = spec
        .backoff_coefficient
        .unwrap_or(limits.default_coefficient);
    check_coefficient(coefficient, limits, &field("backoff_coefficient"))?;

    let (deliver_at, expire_at) = check_times(
        Times {
            deliver_at: spec.deliver_at,
            delay_ms: spec.delay_ms,
            expire_at: spec.expire_at,
            ttl_ms: spec.ttl_ms,
        },
        limits,
        now,
        field,
    )?;

    if let Some(key) = &spec.idempotency_key {
        check_idempotency_key(key, &field("idempotency_key"))?;
    }
    if let Some(url) = &spec.on_complete {
        check_endpoint(url, &field("on_complete"))?;
    }
    // Where the job is stored, the Director gives it the position of its acceptance.
    let ordering = check_ordering(
        spec.ordering_key.as_deref(),
        spec.ordering_failure,
        id.0,
        &field("ordering_key"),
        &field("ordering_failure"),
    )?;

    let job = Job {
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
        on_complete: spec.on_complete.map(Into::into),
        ordering,
        event: None,
    };
    Ok((job, deliver_at))
}

/// What a job gives of its times: each pair excludes the other.
#[derive(Default)]
struct Times {
    deliver_at: Option<DateTime<Utc>>,
    delay_ms: Option<u64>,
    expire_at: Option<DateTime<Utc>>,
    ttl_ms: Option<u64>,
}

/// A job's first attempt time (as given) and its expiry, checked against `limits`; `field`
/// names a field as the request does.
fn check_times(
    given: Times,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    field: impl Fn(&str) -> String,
) -> Result<(Option<DateTime<Utc>>, DateTime<Utc>), FieldError> {
    let max_ttl = chrono::Duration::from_std(limits.max_ttl).unwrap_or(chrono::Duration::MAX);
    // The first attempt may be at most the longest time to live ahead.
    let latest_start = now.checked_add_signed(max_ttl);
    let too_far = |at: DateTime<Utc>| latest_start.is_some_and(|latest| at > latest);
    let deliver_at = match (given.deliver_at, given.delay_ms) {
        (Some(_), Some(_)) => {
            return Err(FieldError::new(
                field("delay_ms"),
                "give deliver_at or delay_ms, not both",
            ))
        }
        (Some(at), None) if too_far(at) => {
            return Err(FieldError::new(
                field("deliver_at"),
                format!("must be within {} s from now", limits.max_ttl.as_secs()),
            ))
        }
        (Some(at), None) => Some(at),
        (None, Some(ms)) => Some(
            chrono::Duration::try_milliseconds(i64::try_from(ms).unwrap_or(i64::MAX))
                .and_then(|delay| now.checked_add_signed(delay))
                .filter(|at| !too_far(*at))
                .ok_or_else(|| {
                    FieldError::new(
                        field("delay_ms"),
                        format!("must be at most {} ms", limits.max_ttl.as_millis()),
                    )
                })?,
        ),
        (None, None) => None,
    };
    // The time to live counts from the first attempt's time (a time already passed: now).
    let start = deliver_at.filter(|at| *at > now).unwrap_or(now);
    let max_expiry = start.checked_add_signed(max_ttl).unwrap_or(start);
    let expire_at = match (given.expire_at, given.ttl_ms) {
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
            if at <= start {
                return Err(FieldError::new(
                    field("expire_at"),
                    "must be after deliver_at (or now + delay_ms)",
                ));
            }
            if at > max_expiry {
                return Err(FieldError::new(
                    field("expire_at"),
                    format!(
                        "must be within {} s from the first attempt's time",
                        limits.max_ttl.as_secs()
                    ),
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
            let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
            start.checked_add_signed(ttl).unwrap_or(max_expiry)
        }
    };
    Ok((deliver_at, expire_at))
}

// The checks below are the rules of a stored job, shared by every way a job enters a JobDB:
// a submission (`validate_job`) and an import (`rpc::import::job_of`). A job one path takes,
// the other takes too, so a drainer can always move what a Director accepted.

/// A bucket: 1 to [`MAX_BUCKET_CHARS`] characters (as the column counts them), no control
/// characters.
pub(crate) fn check_bucket(bucket: &str, field: &str) -> Result<(), FieldError> {
    if bucket.is_empty() || bucket.chars().count() > MAX_BUCKET_CHARS {
        return Err(FieldError::new(
            field,
            format!("must be 1 to {MAX_BUCKET_CHARS} characters"),
        ));
    }
    if bucket.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// An endpoint: an encoded http(s) URL of at most [`MAX_URL_BYTES`] naming a host.
pub(crate) fn check_endpoint(endpoint: &str, field: &str) -> Result<(), FieldError> {
    if endpoint.len() > MAX_URL_BYTES {
        return Err(FieldError::new(
            field,
            format!("is longer than {MAX_URL_BYTES} bytes"),
        ));
    }
    if endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(FieldError::new(
            field,
            "must be an encoded URL: no spaces or control characters",
        ));
    }
    let url = url::Url::parse(endpoint)
        .map_err(|e| FieldError::new(field, format!("is not a valid URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(FieldError::new(field, "scheme must be http or https"));
    }
    match url.host() {
        None => Err(FieldError::new(field, "must name a host")),
        Some(url::Host::Domain(name)) if !valid_host_name(name) => Err(FieldError::new(
            field,
            "host must be a DNS name or an IP address",
        )),
        Some(_) => Ok(()),
    }
}

/// A method, upper case, one of [`METHODS`].
pub(crate) fn check_method(method: &str, field: &str) -> Result<(), FieldError> {
    if METHODS.contains(&method) {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("must be one of {}", METHODS.join(", ")),
        ))
    }
}

/// Headers: at most [`MAX_HEADERS`], each valid, not reserved, name and value within
/// [`MAX_HEADER_BYTES`]. Returns them with their names normalised (lower case).
pub(crate) fn check_headers(
    given: &[(String, String)],
    field: &str,
) -> Result<Vec<(String, String)>, FieldError> {
    if given.len() > MAX_HEADERS {
        return Err(FieldError::too_large(
            field,
            format!("at most {MAX_HEADERS} headers are allowed"),
        ));
    }
    let mut headers = Vec::with_capacity(given.len());
    for (name, value) in given {
        let f = format!("{field}.{name}");
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
        if value.contains(['\r', '\n']) || http::HeaderValue::from_str(value).is_err() {
            return Err(FieldError::new(
                f,
                "value must be visible ASCII or spaces, without CR or LF",
            ));
        }
        headers.push((parsed.as_str().to_owned(), value.clone()));
    }
    Ok(headers)
}

/// A payload of at most `limits.max_payload_bytes`.
pub(crate) fn check_payload(
    len: usize,
    limits: &IntakeLimits,
    field: &str,
) -> Result<(), FieldError> {
    if len > limits.max_payload_bytes {
        return Err(FieldError::too_large(
            field,
            format!(
                "is {len} bytes; at most {} are allowed",
                limits.max_payload_bytes
            ),
        ));
    }
    Ok(())
}

/// An execution timeout between [`MIN_TIMEOUT`] and `limits.max_timeout`.
pub(crate) fn check_timeout(
    ms: u64,
    limits: &IntakeLimits,
    field: &str,
) -> Result<Duration, FieldError> {
    let d = Duration::from_millis(ms);
    if d < MIN_TIMEOUT || d > limits.max_timeout {
        return Err(FieldError::new(
            field,
            format!(
                "must be between {} and {} ms",
                MIN_TIMEOUT.as_millis(),
                limits.max_timeout.as_millis()
            ),
        ));
    }
    Ok(d)
}

/// A backoff minimum delay between 1 ms and `limits.max_min_delay`.
pub(crate) fn check_min_delay(
    ms: u64,
    limits: &IntakeLimits,
    field: &str,
) -> Result<Duration, FieldError> {
    let d = Duration::from_millis(ms);
    if ms == 0 || d > limits.max_min_delay {
        return Err(FieldError::new(
            field,
            format!(
                "must be between 1 and {} ms",
                limits.max_min_delay.as_millis()
            ),
        ));
    }
    Ok(d)
}

/// A backoff coefficient between 1.0 and `limits.max_coefficient`.
pub(crate) fn check_coefficient(
    coefficient: f64,
    limits: &IntakeLimits,
    field: &str,
) -> Result<(), FieldError> {
    if !(1.0..=limits.max_coefficient).contains(&coefficient) {
        return Err(FieldError::new(
            field,
            format!("must be between 1.0 and {}", limits.max_coefficient),
        ));
    }
    Ok(())
}

/// An idempotency key of 1 to [`MAX_IDEMPOTENCY_KEY_CHARS`] characters.
pub(crate) fn check_idempotency_key(key: &str, field: &str) -> Result<(), FieldError> {
    if key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS {
        return Err(FieldError::new(
            field,
            format!("must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters"),
        ));
    }
    Ok(())
}

/// Most bytes of an ordering key.
pub const MAX_ORDERING_KEY_BYTES: usize = 255;

/// A job's ordering from its key and failure policy: a key of 1 to 255 bytes without control
/// characters; a failure policy only with a key. `position` is its place in the key's order.
pub(crate) fn check_ordering(
    key: Option<&str>,
    failure: Option<OrderingFailure>,
    position: ulid::Ulid,
    key_field: &str,
    failure_field: &str,
) -> Result<Option<crate::job::OrderedKey>, FieldError> {
    let Some(key) = key else {
        return match failure {
            Some(_) => Err(FieldError::new(
                failure_field,
                "is only allowed with an ordering_key",
            )),
            None => Ok(None),
        };
    };
    if key.is_empty() || key.len() > MAX_ORDERING_KEY_BYTES {
        return Err(FieldError::new(
            key_field,
            format!("must be 1 to {MAX_ORDERING_KEY_BYTES} bytes"),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(FieldError::new(
            key_field,
            "must not hold control characters",
        ));
    }
    Ok(Some(crate::job::OrderedKey {
        key: key.into(),
        blocks: failure == Some(OrderingFailure::Block),
        position,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> NewJob {
        serde_json::from_value(json).unwrap()
    }

    fn check(json: serde_json::Value) -> Result<Job, FieldError> {
        check_at(json, Utc::now()).map(|(job, _)| job)
    }

    fn check_at(
        json: serde_json::Value,
        now: DateTime<Utc>,
    ) -> Result<(Job, Option<DateTime<Utc>>), FieldError> {
        validate_job(
            spec(json),
            "jobs[0]",
            &IntakeLimits::default(),
            now,
            JobId(ulid::Ulid::new()),
        )
    }

    #[test]
    fn a_scheduled_job_lives_from_its_time() {
        let now = Utc::now();
        let in_an_hour = now + chrono::Duration::hours(1);
        let (job, at) = check_at(
            serde_json::json!({"bucket": "b", "endpoint": "http://x", "deliver_at": in_an_hour, "ttl_ms": 60000}),
            now,
        )
        .unwrap();
        assert_eq!(at, Some(in_an_hour));
        assert_eq!(job.expire_at, in_an_hour + chrono::Duration::minutes(1));
        let (job, at) = check_at(
            serde_json::json!({"bucket": "b", "endpoint": "http://x", "delay_ms": 5000}),
            now,
        )
        .unwrap();
        assert_eq!(at, Some(now + chrono::Duration::seconds(5)));
        assert_eq!(
            job.expire_at,
            now + chrono::Duration::seconds(5) + chrono::Duration::hours(4),
            "the default time to live counts from the scheduled time"
        );
        // A time passed means now for its time to live; the time asked for is kept, for a
        // router to hand to the Director that judges it.
        let hour_ago = now - chrono::Duration::hours(1);
        let passed =
            serde_json::json!({"bucket": "b", "endpoint": "http://x", "deliver_at": hour_ago});
        let (job, at) = check_at(passed.clone(), now).unwrap();
        assert_eq!(at, Some(hour_ago));
        assert_eq!(job.expire_at, now + chrono::Duration::hours(4));
        let request = || SubmitRequest {
            jobs: vec![spec(passed.clone())],
        };
        let next = || JobId(ulid::Ulid::new());
        let limits = IntakeLimits::default();
        let none = chrono::Duration::zero();
        let (_, scheduled) = validate_request(request(), &limits, now, none, next).unwrap();
        assert!(scheduled.is_empty(), "a Director delivers it now");
        let skew = chrono::Duration::hours(2);
        let (_, scheduled) = validate_request(request(), &limits, now, skew, next).unwrap();
        assert_eq!(
            scheduled.len(),
            1,
            "a router forwards a time within its skew"
        );
        let skew = chrono::Duration::seconds(10);
        let (_, scheduled) = validate_request(request(), &limits, now, skew, next).unwrap();
        assert!(scheduled.is_empty(), "passed longer ago: now");
        let (_, at) = check_at(
            serde_json::json!({"bucket": "b", "endpoint": "http://x", "delay_ms": 0}),
            now,
        )
        .unwrap();
        assert_eq!(at, Some(now));
    }

    #[test]
    fn bad_schedules_are_named() {
        let now = Utc::now();
        let far = now + chrono::Duration::days(31);
        let cases = [
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "deliver_at": now + chrono::Duration::hours(1), "delay_ms": 10}),
                "jobs[0].delay_ms",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "deliver_at": far}),
                "jobs[0].deliver_at",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "delay_ms": u64::MAX}),
                "jobs[0].delay_ms",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "delay_ms": -1}),
                "jobs[0].delay_ms",
            ),
            (
                serde_json::json!({"bucket": "b", "endpoint": "http://x", "delay_ms": 7_200_000, "expire_at": now + chrono::Duration::hours(1)}),
                "jobs[0].expire_at",
            ),
        ];
        for (json, field) in cases {
            let error = match serde_json::from_value::<NewJob>(json.clone()) {
                Err(_) => {
                    // Refused by the parser (the handler names the path the same way).
                    assert_eq!(field, "jobs[0].delay_ms", "{json}");
                    continue;
                }
                Ok(spec) => validate_job(
                    spec,
                    "jobs[0]",
                    &IntakeLimits::default(),
                    now,
                    JobId(ulid::Ulid::new()),
                )
                .expect_err(&json.to_string()),
            };
            assert_eq!(error.field, field, "{json}: {}", error.message);
        }
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
