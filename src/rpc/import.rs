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

use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use super::api::{self, FieldError, IntakeLimits};
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
        on_complete: job.on_complete.as_deref().map(str::to_owned),
        ordering_key: job.ordering.as_ref().map(|o| o.key.to_string()),
        ordering_failure: job.ordering.as_ref().map(crate::job::Ordering::failure),
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
    if let Some(url) = &spec.on_complete {
        api::check_endpoint(url, &field("on_complete"))?;
    }
    let ordering = api::check_ordering(
        spec.ordering_key.as_deref(),
        spec.ordering_failure,
        &field("ordering_key"),
        &field("ordering_failure"),
    )?;
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
        on_complete: spec.on_complete.as_deref().map(Into::into),
        ordering,
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
