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
use std::sync::Mutex;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use super::api::{FieldError, IntakeLimits};
use super::rules;
use crate::job::{Job, JobId, RetryPolicy};

pub use super::views::import_job;
pub use spindle_client::api::{ImportJob, ImportRequest, ImportResponse, MAX_IMPORT_JOBS};

/// The job of an import, checked by the same rules as a submitted job (`rules::check_*`, with
/// this Director's `limits`), plus the times an import carries (`i` is its index, for error
/// paths): what a Director accepted directly, another accepts as an import. `endpoints` are
/// those the request's earlier jobs named and passed.
pub fn job_of(
    spec: &ImportJob,
    i: usize,
    limits: &IntakeLimits,
    endpoints: &mut rules::CheckedEndpoints,
) -> Result<Job, FieldError> {
    let at = format!("jobs[{i}]");
    let field = |name: &'static str| rules::Field::new(&at, name);
    let id: JobId = spec
        .id
        .parse()
        .map_err(|_| FieldError::new(field("id"), "is not a ULID"))?;
    rules::check_bucket(&spec.bucket, field("bucket"))?;
    endpoints.check(&spec.endpoint, field("endpoint"))?;
    rules::check_method(&spec.method, field("method"))?;
    let headers = rules::check_headers(&spec.headers, field("headers"))?;
    let (payload, _) = rules::check_body(
        spec.payload
            .as_ref()
            .map(|raw| Bytes::copy_from_slice(raw.get().as_bytes())),
        spec.payload_base64.as_deref(),
        limits,
        field,
    )?;
    let timeout = rules::check_timeout(
        spec.execution_timeout_ms.into(),
        limits,
        field("execution_timeout_ms"),
    )?;
    let min_delay = rules::check_min_delay(
        spec.backoff_min_delay_ms.into(),
        limits,
        field("backoff_min_delay_ms"),
    )?;
    rules::check_coefficient(
        spec.backoff_coefficient,
        limits,
        field("backoff_coefficient"),
    )?;
    if let Some(key) = &spec.idempotency_key {
        rules::check_idempotency_key(key, field("idempotency_key"))?;
    }
    if let Some(url) = &spec.on_complete {
        rules::check_endpoint(url, field("on_complete"))?;
    }
    let position = match &spec.ordering_position {
        Some(p) => p
            .parse::<ulid::Ulid>()
            .map_err(|_| FieldError::new(field("ordering_position"), "is not a ULID"))?,
        None => id.0,
    };
    let ordering = rules::check_ordering(
        spec.ordering_key.as_deref(),
        spec.ordering_failure,
        position,
        field("ordering_key"),
        field("ordering_failure"),
    )?;
    for (name, at) in [
        ("created_at", spec.created_at),
        ("expire_at", spec.expire_at),
        ("retry_at", spec.retry_at),
    ] {
        check_stored_time(at, field(name))?;
    }
    if spec.expire_at < spec.created_at {
        return Err(FieldError::new(field("expire_at"), "is before created_at"));
    }
    let event = spec
        .event
        .as_ref()
        .map(|link| {
            crate::job::EventLink::from_wire(link).map_err(|(name, message)| {
                FieldError::new(format!("{}.{name}", field("event")), message)
            })
        })
        .transpose()?;
    let trace = rules::check_trace(
        spec.traceparent.as_deref(),
        spec.tracestate.as_deref(),
        field,
    )?;
    Ok(Job {
        id,
        bucket: spec.bucket.as_str().into(),
        endpoint: spec.endpoint.as_str().into(),
        method: spec.method.as_str().into(),
        headers,
        payload,
        execution_timeout: timeout,
        retry: RetryPolicy {
            min_delay,
            coefficient: spec.backoff_coefficient,
        },
        created_at: spec.created_at,
        expire_at: spec.expire_at,
        idempotency_key: spec.idempotency_key.clone(),
        on_complete: spec.on_complete.as_deref().map(Into::into),
        ordering,
        event,
        trace,
    })
}

/// A key blocked in a retired JobDB, carried by a move (`i` is its index, for error paths),
/// checked by the rules of the jobs it blocks.
pub fn blocked_key_of(
    spec: &spindle_client::BlockedKey,
    i: usize,
) -> Result<crate::jobdb::BlockedKey, FieldError> {
    let field = |name: &str| format!("blocked_keys[{i}].{name}");
    let job_id: JobId = spec
        .job_id
        .parse()
        .map_err(|_| FieldError::new(field("job_id"), "is not a ULID"))?;
    rules::check_bucket(&spec.bucket, &field("bucket"))?;
    rules::check_endpoint(&spec.endpoint, &field("endpoint"))?;
    rules::check_ordering(
        Some(&spec.ordering_key),
        None,
        job_id.0,
        &field("ordering_key"),
        &field("ordering_key"),
    )?;
    if !matches!(spec.state.as_str(), "discarded" | "archiving" | "archived") {
        return Err(FieldError::new(
            field("state"),
            "must be discarded, archiving or archived",
        ));
    }
    check_stored_time(spec.blocked_at, field("blocked_at"))?;
    Ok(crate::jobdb::BlockedKey {
        job_id,
        state: spec.state.clone(),
        blocked_at: spec.blocked_at,
        bucket: spec.bucket.clone(),
        endpoint: spec.endpoint.clone(),
        ordering_key: spec.ordering_key.clone(),
    })
}

/// The wire form of a blocked key, for a move.
pub fn blocked_key(key: &crate::jobdb::BlockedKey) -> spindle_client::BlockedKey {
    spindle_client::BlockedKey {
        bucket: key.bucket.clone(),
        endpoint: key.endpoint.clone(),
        ordering_key: key.ordering_key.clone(),
        job_id: key.job_id.to_string(),
        state: key.state.clone(),
        blocked_at: key.blocked_at,
    }
}

/// The widest limits a Director of this version can be configured with: the size limits
/// (`--max-payload-bytes`, `--max-request-bytes`) have no ceiling, the others are fixed.
pub fn widest_limits() -> IntakeLimits {
    IntakeLimits {
        max_payload_bytes: usize::MAX,
        max_request_bytes: usize::MAX,
        ..IntakeLimits::default()
    }
}

/// Whether some Director of this version could import `spec`: the checks of [`job_of`] under
/// [`widest_limits`]. A job that passes and is refused anyway was refused for where it was
/// sent (that Director's smaller limits, its JobDB server's packet size, an older version);
/// one that fails can never be imported by this version, and the error says why.
pub fn importable(spec: &ImportJob) -> Result<(), FieldError> {
    job_of(spec, 0, &widest_limits(), &mut Default::default()).map(|_| ())
}

/// A time a JobDB can store: from 1970 to the end of year 9999 (MySQL's DATETIME).
fn check_stored_time(at: DateTime<Utc>, field: impl std::fmt::Display) -> Result<(), FieldError> {
    if at < DateTime::<Utc>::UNIX_EPOCH || at > crate::jobdb::latest_time() {
        return Err(FieldError::new(
            field.to_string(),
            "must be between 1970-01-01 and 9999-12-31",
        ));
    }
    Ok(())
}

/// Job ids of the imports in progress: requests sharing an id wait for each other.
#[derive(Debug, Default)]
pub struct InFlight {
    ids: Mutex<HashSet<JobId>>,
    released: Notify,
}

/// Holds ids in an [`InFlight`] set until dropped (it may outlive the request: a request
/// answered before the writer is done with it keeps its ids until it is).
pub struct Held {
    set: std::sync::Arc<InFlight>,
    ids: Vec<JobId>,
}

impl InFlight {
    /// Waits until none of `ids` is held by another request, then holds them.
    pub async fn hold(self: &std::sync::Arc<Self>, ids: &[JobId]) -> Held {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self.ids.lock().unwrap_or_else(|p| p.into_inner());
                if !ids.iter().any(|id| held.contains(id)) {
                    held.extend(ids.iter().copied());
                    return Held {
                        set: self.clone(),
                        ids: ids.to_vec(),
                    };
                }
            }
            released.await;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.set.ids.lock().unwrap_or_else(|p| p.into_inner());
        for id in &self.ids {
            held.remove(id);
        }
        drop(held);
        self.set.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    fn spec(payload: usize) -> ImportJob {
        let now = Utc::now();
        ImportJob {
            id: ulid::Ulid::new().to_string(),
            bucket: "b".into(),
            endpoint: "https://example.test/hook".into(),
            method: "POST".into(),
            headers: vec![],
            payload: None,
            payload_base64: Some(
                base64::engine::general_purpose::STANDARD.encode(vec![b'x'; payload]),
            ),
            execution_timeout_ms: 10_000,
            backoff_min_delay_ms: 1_000,
            backoff_coefficient: 2.0,
            created_at: now,
            expire_at: now + chrono::Duration::hours(1),
            idempotency_key: None,
            on_complete: Some("https://example.test/told".into()),
            ordering_key: Some("k".into()),
            ordering_failure: None,
            ordering_position: None,
            event: None,
            attempts: 3,
            retry_at: now,
            traceparent: None,
            tracestate: None,
        }
    }

    /// What one Director's limits refuse another's may take; what this version's rules refuse
    /// no Director of it takes.
    #[test]
    fn importable_means_some_director_of_this_version_takes_it() {
        let big = spec(4 * 1024 * 1024);
        assert!(job_of(&big, 0, &IntakeLimits::default(), &mut Default::default()).is_err());
        assert!(importable(&big).is_ok());
        let mut ftp = spec(2);
        ftp.endpoint = "ftp://example.test/x".into();
        let why = importable(&ftp).unwrap_err();
        assert_eq!(why.field, "jobs[0].endpoint");
        let mut backwards = spec(2);
        backwards.expire_at = backwards.created_at - chrono::Duration::seconds(1);
        assert_eq!(
            importable(&backwards).unwrap_err().field,
            "jobs[0].expire_at"
        );
        let mut slow = spec(2);
        slow.execution_timeout_ms = 3_600_000;
        assert!(importable(&slow).is_err(), "timeouts have a fixed ceiling");
    }

    /// A payload crosses an import byte for byte: as itself when it is exactly a JSON value,
    /// in base64 otherwise (whitespace around a value, bytes that are not UTF-8 or not JSON).
    #[test]
    fn payloads_cross_an_import_byte_for_byte() {
        let limits = IntakeLimits::default();
        let template = job_of(&spec(0), 0, &limits, &mut Default::default()).unwrap();
        for (bytes, raw) in [
            (&b"{\"a\": [1, 2.50, \"\\u00e9\"]}"[..], true),
            (b"\"text\"", true),
            (b"17", true),
            (b" {}", false),
            (b"{}\n", false),
            (b"not json", false),
            (b"\x00\xff\xfe", false),
            (b"", false),
        ] {
            let job = Job {
                payload: Bytes::copy_from_slice(bytes),
                ..template.clone()
            };
            let wire = import_job(&job, 0, job.created_at);
            assert_eq!(wire.payload.is_some(), raw, "{bytes:?}");
            assert_eq!(wire.payload_base64.is_some(), !raw && !bytes.is_empty());
            let text = serde_json::to_string(&wire).unwrap();
            let back: ImportJob = serde_json::from_str(&text).unwrap();
            assert_eq!(
                job_of(&back, 0, &limits, &mut Default::default())
                    .unwrap()
                    .payload,
                bytes,
                "{text}"
            );
        }
        let mut both = spec(1);
        both.payload = Some(serde_json::value::RawValue::from_string("1".into()).unwrap());
        assert_eq!(
            job_of(&both, 0, &limits, &mut Default::default())
                .unwrap_err()
                .field,
            "jobs[0].payload_base64"
        );
    }
}
