//! The rules of a stored job, shared by every way a job enters a JobDB: a submission
//! ([`super::validate`]) and an import ([`super::import`]). A job one path takes, the other
//! takes too, so a drainer can always move what a Director accepted. Each check names the
//! field it refuses ([`FieldError`]); [`IntakeLimits`] are the limits a server configures.

use std::fmt::Display;
use std::time::Duration;

use super::api::{OrderingFailure, MAX_JOBS_PER_REQUEST};

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

/// The default largest request body accepted.
pub const MAX_REQUEST_BYTES: usize = 32 * 1024 * 1024;
/// The default largest payload accepted.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// The default time to live.
pub const DEFAULT_TTL: Duration = Duration::from_secs(4 * 3600);

impl Default for IntakeLimits {
    fn default() -> Self {
        IntakeLimits {
            max_jobs_per_request: MAX_JOBS_PER_REQUEST,
            max_request_bytes: MAX_REQUEST_BYTES,
            max_payload_bytes: MAX_PAYLOAD_BYTES,
            default_timeout: Duration::from_secs(10),
            max_timeout: Duration::from_secs(300),
            default_min_delay: Duration::from_secs(1),
            max_min_delay: Duration::from_secs(3600),
            default_coefficient: 2.0,
            max_coefficient: 10.0,
            default_ttl: DEFAULT_TTL,
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

/// Where a field is (`jobs[2]` and `bucket`), written out as its path (`jobs[2].bucket`) only
/// when an error names it: a batch's checks run per job, and building every path up front was
/// a tenth of a router's CPU.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field<'a> {
    /// The path of the object the field is in (empty at the top).
    pub at: &'a str,
    /// The field's name within it.
    pub name: &'static str,
}

impl<'a> Field<'a> {
    /// The field `name` of the object at `at`.
    pub(crate) fn new(at: &'a str, name: &'static str) -> Self {
        Field { at, name }
    }
}

impl std::fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.at {
            "" => f.write_str(self.name),
            at => write!(f, "{at}.{}", self.name),
        }
    }
}

impl From<Field<'_>> for String {
    fn from(field: Field<'_>) -> String {
        field.to_string()
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

    pub(crate) fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            too_large: true,
            ..FieldError::new(field, message)
        }
    }
}

/// A bucket: 1 to [`MAX_BUCKET_CHARS`] characters (as the column counts them), no control
/// characters.
pub(crate) fn check_bucket(bucket: &str, field: impl Display + Copy) -> Result<(), FieldError> {
    if bucket.is_empty() || bucket.chars().count() > MAX_BUCKET_CHARS {
        return Err(FieldError::new(
            field.to_string(),
            format!("must be 1 to {MAX_BUCKET_CHARS} characters"),
        ));
    }
    if bucket.chars().any(char::is_control) {
        return Err(FieldError::new(
            field.to_string(),
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// The endpoints one request's jobs named that passed the endpoint check: a request's jobs
/// mostly share a few, and parsing the URL was the largest part of checking a job (under
/// callgrind, a tenth of a router's instructions per routed job).
#[derive(Default)]
pub struct CheckedEndpoints(Vec<Box<str>>);

impl CheckedEndpoints {
    /// Checks `endpoint` (an encoded http(s) URL naming a host; errors name `field`), unless
    /// this request's jobs named it already and it passed.
    pub fn check(&mut self, endpoint: &str, field: impl Display + Copy) -> Result<(), FieldError> {
        if self.0.iter().any(|passed| **passed == *endpoint) {
            return Ok(());
        }
        check_endpoint(endpoint, field)?;
        // A handful of distinct endpoints per request is the common case; past that, no gain.
        if self.0.len() < 16 {
            self.0.push(endpoint.into());
        }
        Ok(())
    }
}

/// An endpoint: an encoded http(s) URL of at most [`MAX_URL_BYTES`] naming a host.
pub(crate) fn check_endpoint(endpoint: &str, field: impl Display + Copy) -> Result<(), FieldError> {
    if endpoint.len() > MAX_URL_BYTES {
        return Err(FieldError::new(
            field.to_string(),
            format!("is longer than {MAX_URL_BYTES} bytes"),
        ));
    }
    if endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(FieldError::new(
            field.to_string(),
            "must be an encoded URL: no spaces or control characters",
        ));
    }
    let url = url::Url::parse(endpoint)
        .map_err(|e| FieldError::new(field.to_string(), format!("is not a valid URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(FieldError::new(
            field.to_string(),
            "scheme must be http or https",
        ));
    }
    match url.host() {
        None => Err(FieldError::new(field.to_string(), "must name a host")),
        Some(url::Host::Domain(name)) if !valid_host_name(name) => Err(FieldError::new(
            field.to_string(),
            "host must be a DNS name or an IP address",
        )),
        Some(_) => Ok(()),
    }
}

/// A method, upper case, one of [`METHODS`].
pub(crate) fn check_method(method: &str, field: impl Display + Copy) -> Result<(), FieldError> {
    if METHODS.contains(&method) {
        Ok(())
    } else {
        Err(FieldError::new(
            field.to_string(),
            format!("must be one of {}", METHODS.join(", ")),
        ))
    }
}

/// Headers: at most [`MAX_HEADERS`], each valid, not reserved, name and value within
/// [`MAX_HEADER_BYTES`]. Returns them with their names normalised (lower case).
pub(crate) fn check_headers(
    given: &[(String, String)],
    field: impl Display + Copy,
) -> Result<Vec<(String, String)>, FieldError> {
    if given.len() > MAX_HEADERS {
        return Err(FieldError::too_large(
            field.to_string(),
            format!("at most {MAX_HEADERS} headers are allowed"),
        ));
    }
    let mut headers = Vec::with_capacity(given.len());
    for (name, value) in given {
        let f = || format!("{field}.{name}");
        if name.len() + value.len() > MAX_HEADER_BYTES {
            return Err(FieldError::too_large(
                f(),
                format!("name and value exceed {MAX_HEADER_BYTES} bytes"),
            ));
        }
        let parsed = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| FieldError::new(f(), "is not a valid header name"))?;
        if RESERVED_HEADERS.contains(&parsed.as_str()) {
            return Err(FieldError::new(
                f(),
                "is set by spindle and may not be given",
            ));
        }
        if value.contains(['\r', '\n']) || http::HeaderValue::from_str(value).is_err() {
            return Err(FieldError::new(
                f(),
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
    field: impl Display + Copy,
) -> Result<(), FieldError> {
    if len > limits.max_payload_bytes {
        return Err(FieldError::too_large(
            field.to_string(),
            format!(
                "is {len} bytes; at most {} are allowed",
                limits.max_payload_bytes
            ),
        ));
    }
    Ok(())
}

/// A job's body from its two exclusive fields, `payload` (the bytes of a JSON value) or
/// `payload_base64` (neither: no body), held to `limits.max_payload_bytes`: the bytes, and
/// whether they came in base64 (`field` names a field of the job).
pub(crate) fn check_body<'a>(
    json: Option<bytes::Bytes>,
    base64: Option<&str>,
    limits: &IntakeLimits,
    field: impl Fn(&'static str) -> Field<'a>,
) -> Result<(bytes::Bytes, bool), FieldError> {
    use base64::Engine;
    let (body, binary) = match (json, base64) {
        (Some(_), Some(_)) => {
            return Err(FieldError::new(
                field("payload_base64"),
                "give payload or payload_base64, not both",
            ))
        }
        (Some(json), None) => (json, false),
        (None, Some(text)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| {
                    FieldError::new(field("payload_base64"), format!("is not valid base64: {e}"))
                })?;
            (bytes::Bytes::from(bytes), true)
        }
        (None, None) => (bytes::Bytes::new(), false),
    };
    let name = if binary { "payload_base64" } else { "payload" };
    check_payload(body.len(), limits, field(name))?;
    Ok((body, binary))
}

/// An execution timeout between [`MIN_TIMEOUT`] and `limits.max_timeout`.
pub(crate) fn check_timeout(
    ms: u64,
    limits: &IntakeLimits,
    field: impl Display + Copy,
) -> Result<Duration, FieldError> {
    let d = Duration::from_millis(ms);
    if d < MIN_TIMEOUT || d > limits.max_timeout {
        return Err(FieldError::new(
            field.to_string(),
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
    field: impl Display + Copy,
) -> Result<Duration, FieldError> {
    let d = Duration::from_millis(ms);
    if ms == 0 || d > limits.max_min_delay {
        return Err(FieldError::new(
            field.to_string(),
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
    field: impl Display + Copy,
) -> Result<(), FieldError> {
    if !(1.0..=limits.max_coefficient).contains(&coefficient) {
        return Err(FieldError::new(
            field.to_string(),
            format!("must be between 1.0 and {}", limits.max_coefficient),
        ));
    }
    Ok(())
}

/// An idempotency key of 1 to [`MAX_IDEMPOTENCY_KEY_CHARS`] characters.
pub(crate) fn check_idempotency_key(
    key: &str,
    field: impl Display + Copy,
) -> Result<(), FieldError> {
    if key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS {
        return Err(FieldError::new(
            field.to_string(),
            format!("must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters"),
        ));
    }
    Ok(())
}

/// A job's trace context from its `traceparent` and `tracestate` fields (W3C; `tracestate`
/// only with a `traceparent`). `field` names a field of the job.
pub(crate) fn check_trace<S>(
    traceparent: Option<&str>,
    tracestate: Option<&str>,
    field: impl Fn(&'static str) -> S,
) -> Result<Option<crate::telemetry::TraceContext>, FieldError>
where
    S: Into<String>,
{
    match (traceparent, tracestate) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(FieldError::new(
            field("tracestate"),
            "is given only with a traceparent",
        )),
        (Some(parent), state) => crate::telemetry::TraceContext::parse(parent, state)
            .map(Some)
            .map_err(|e| FieldError::new(field(e.field()), e.to_string())),
    }
}

/// Most bytes of an ordering key.
pub const MAX_ORDERING_KEY_BYTES: usize = 255;

/// A job's ordering from its key and failure policy: a key of 1 to 255 bytes without control
/// characters; a failure policy only with a key. `position` is its place in the key's order.
pub(crate) fn check_ordering(
    key: Option<&str>,
    failure: Option<OrderingFailure>,
    position: ulid::Ulid,
    key_field: impl Display + Copy,
    failure_field: impl Display + Copy,
) -> Result<Option<crate::job::OrderedKey>, FieldError> {
    let Some(key) = key else {
        return match failure {
            Some(_) => Err(FieldError::new(
                failure_field.to_string(),
                "is only allowed with an ordering_key",
            )),
            None => Ok(None),
        };
    };
    if key.is_empty() || key.len() > MAX_ORDERING_KEY_BYTES {
        return Err(FieldError::new(
            key_field.to_string(),
            format!("must be 1 to {MAX_ORDERING_KEY_BYTES} bytes"),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(FieldError::new(
            key_field.to_string(),
            "must not hold control characters",
        ));
    }
    Ok(Some(crate::job::OrderedKey {
        key: key.into(),
        blocks: failure == Some(OrderingFailure::Block),
        position,
    }))
}
