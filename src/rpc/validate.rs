//! Validation of submitted jobs: a [`NewJob`] becomes a [`Job`] or a [`FieldError`] naming the
//! exact field (`jobs[3].endpoint`), a batch with any error being rejected whole. The field
//! checks are the rules every stored job meets ([`super::rules`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::api::{NewJob, OrderingFailure, SubmitRequest};
use super::rules::{
    check_body, check_bucket, check_coefficient, check_endpoint, check_headers,
    check_idempotency_key, check_method, check_min_delay, check_ordering, check_timeout,
    CheckedEndpoints, Field, FieldError, IntakeLimits,
};
use crate::job::{Job, JobId, RetryPolicy, Scheduled};
use crate::telemetry::TraceContext;

/// Validates a whole request; every job gets an id from `next_id`, and `trace` (the request's
/// `traceparent` header) when it names no trace of its own. A job's requested first
/// attempt time is in the answer when it is after `now`, less `keep_passed` (a router, whose
/// clock may run that far ahead of the Director that judges the time).
pub fn validate_request(
    request: SubmitRequest,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    keep_passed: chrono::Duration,
    trace: Option<&TraceContext>,
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
    let mut endpoints = CheckedEndpoints::default();
    let mut jobs = Vec::with_capacity(request.jobs.len());
    let mut scheduled = Scheduled::new();
    for (i, spec) in request.jobs.into_iter().enumerate() {
        let (mut job, deliver_at) = validate_job(
            spec,
            &format!("jobs[{i}]"),
            limits,
            now,
            next_id(),
            &mut endpoints,
        )?;
        if job.trace.is_none() {
            job.trace = trace.cloned();
        }
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
        let nil = JobId(ulid::Ulid::nil());
        let (job, _) = validate_job(
            spec,
            "job",
            limits,
            now,
            nil,
            &mut CheckedEndpoints::default(),
        )
        .map_err(|mut e| {
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
    /// [`super::rules::MAX_ORDERING_KEY_BYTES`], field `ordering_key`) orders it with the template's
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
        let (deliver_at, expire_at) = check_times(given, limits, now, |name| Field::new("", name))?;
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
    endpoints: &mut CheckedEndpoints,
) -> Result<(Job, Option<DateTime<Utc>>), FieldError> {
    let field = |name: &'static str| Field::new(at, name);

    check_bucket(&spec.bucket, field("bucket"))?;
    endpoints.check(&spec.endpoint, field("endpoint"))?;
    let method = spec
        .method
        .as_deref()
        .unwrap_or("POST")
        .to_ascii_uppercase();
    check_method(&method, field("method"))?;
    let given: Vec<(String, String)> = spec.headers.unwrap_or_default().into_iter().collect();
    let mut headers = check_headers(&given, field("headers"))?;

    let (payload, binary) = check_body(
        spec.payload.map(super::json_bytes),
        spec.payload_base64.as_deref(),
        limits,
        field,
    )?;
    let default_type = if binary {
        "application/octet-stream"
    } else {
        "application/json"
    };
    if !payload.is_empty() && !headers.iter().any(|(n, _)| n == "content-type") {
        headers.push(("content-type".to_owned(), default_type.to_owned()));
    }

    let timeout = match spec.execution_timeout_ms {
        None => limits.default_timeout,
        Some(ms) => check_timeout(ms, limits, field("execution_timeout_ms"))?,
    };
    let min_delay = match spec.backoff_min_delay_ms {
        None => limits.default_min_delay,
        Some(ms) => check_min_delay(ms, limits, field("backoff_min_delay_ms"))?,
    };
    let coefficient = spec
        .backoff_coefficient
        .unwrap_or(limits.default_coefficient);
    check_coefficient(coefficient, limits, field("backoff_coefficient"))?;

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
        check_idempotency_key(key, field("idempotency_key"))?;
    }
    if let Some(url) = &spec.on_complete {
        check_endpoint(url, field("on_complete"))?;
    }
    let trace = super::rules::check_trace(
        spec.traceparent.as_deref(),
        spec.tracestate.as_deref(),
        field,
    )?;
    // Where the job is stored, the Director gives it the position of its acceptance.
    let ordering = check_ordering(
        spec.ordering_key.as_deref(),
        spec.ordering_failure,
        id.0,
        field("ordering_key"),
        field("ordering_failure"),
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
        trace,
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
fn check_times<'a>(
    given: Times,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    field: impl Fn(&'static str) -> Field<'a>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The endpoints a request's jobs share are parsed once: a later job naming a checked one
    /// passes, and any other endpoint is still checked and named by its job's index.
    #[test]
    fn a_request_checks_each_endpoint_it_names() {
        let request = |endpoints: &[&str]| -> SubmitRequest {
            let jobs: Vec<serde_json::Value> = endpoints
                .iter()
                .map(|e| serde_json::json!({"bucket": "b", "endpoint": e}))
                .collect();
            serde_json::from_value(serde_json::json!({ "jobs": jobs })).unwrap()
        };
        let validate = |endpoints: &[&str]| {
            validate_request(
                request(endpoints),
                &IntakeLimits::default(),
                Utc::now(),
                chrono::Duration::zero(),
                None,
                || JobId(ulid::Ulid::new()),
            )
        };
        let (jobs, _) = validate(&["http://a/x", "http://a/x", "https://b/y"]).unwrap();
        assert_eq!(jobs.len(), 3);
        for (bad, at) in [
            (["http://a/x", "ftp://a/x", "http://a/x"], 1),
            (["http://a/x", "http://a/x", "http://a /x"], 2),
            (["http://a/x", "http://a/x ", "http://a/x"], 1),
        ] {
            let err = validate(&bad).unwrap_err();
            assert_eq!(err.field, format!("jobs[{at}].endpoint"), "{bad:?}");
        }
    }

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
            &mut CheckedEndpoints::default(),
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
        let (_, scheduled) = validate_request(request(), &limits, now, none, None, next).unwrap();
        assert!(scheduled.is_empty(), "a Director delivers it now");
        let skew = chrono::Duration::hours(2);
        let (_, scheduled) = validate_request(request(), &limits, now, skew, None, next).unwrap();
        assert_eq!(
            scheduled.len(),
            1,
            "a router forwards a time within its skew"
        );
        let skew = chrono::Duration::seconds(10);
        let (_, scheduled) = validate_request(request(), &limits, now, skew, None, next).unwrap();
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
                    &mut CheckedEndpoints::default(),
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
