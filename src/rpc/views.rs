//! Every wire view of a job, in one place: accepted jobs as the submit answer lists them, the
//! views of stored jobs and their transitions (`GET /v1/jobs/{id}`, the dashboard's trace),
//! and the import form a drainer's move and a router's forward send (`POST /v1/import`).

use std::sync::Arc;

use base64::Engine;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;

use super::api::{AcceptedJob, JobDescription, JobStatus, JobView, TransitionView};
use crate::job::{AnswerText, Job, Scheduled, Transition};
use spindle_client::api::ImportJob;

/// The answer for accepted jobs, in request order, with the time of those scheduled.
pub fn accepted_jobs(jobs: &[Arc<Job>], scheduled: &Scheduled) -> Vec<AcceptedJob> {
    let mut later = scheduled.iter().peekable();
    jobs.iter()
        .map(|job| AcceptedJob {
            deliver_at: later.next_if(|(id, _)| *id == job.id).map(|(_, at)| *at),
            ..AcceptedJob::from(&**job)
        })
        .collect()
}

impl From<&Job> for AcceptedJob {
    fn from(job: &Job) -> Self {
        AcceptedJob {
            id: job.id.to_string(),
            status: JobStatus::Accepted,
            bucket: job.bucket.to_string(),
            created_at: Some(job.created_at),
            expire_at: Some(job.expire_at),
            deliver_at: None,
            idempotency_key: job.idempotency_key.clone(),
            error: None,
        }
    }
}

/// What `job` is, with its trace (oldest first): the one place a stored job becomes its wire
/// description, for every view of it.
pub fn describe(job: &Job, trace: &[(u64, Transition)]) -> JobDescription {
    let (traceparent, tracestate) = crate::telemetry::TraceContext::fields(job.trace.as_ref());
    let last = trace.last().map(|(_, t)| t);
    JobDescription {
        id: job.id.to_string(),
        id_hex: job.id.to_hex(),
        state: last.map_or(crate::job::State::AwaitingScheduling, |t| t.state),
        attempts: last.map_or(0, |t| t.attempts),
        bucket: job.bucket.to_string(),
        endpoint: job.endpoint.to_string(),
        method: job.method.to_string(),
        execution_timeout_ms: u64::try_from(job.execution_timeout.as_millis()).unwrap_or(u64::MAX),
        backoff_min_delay_ms: u64::try_from(job.retry.min_delay.as_millis()).unwrap_or(u64::MAX),
        backoff_coefficient: job.retry.coefficient,
        created_at: job.created_at,
        expire_at: job.expire_at,
        idempotency_key: job.idempotency_key.clone(),
        ordering_key: job.ordering.as_ref().map(|o| o.key.to_string()),
        ordering_failure: job.ordering.as_ref().map(|o| o.failure()),
        on_complete: job.on_complete.as_deref().map(str::to_owned),
        event: job.event.as_ref().map(crate::job::EventLink::to_wire),
        traceparent,
        tracestate,
        transitions: trace
            .iter()
            .map(|(id, t)| transition_view(*id, t))
            .collect(),
    }
}

/// The view of a job and its trace (oldest first), as `GET /v1/jobs/{id}` answers it.
pub fn job_view(job: &Job, trace: &[(u64, Transition)]) -> JobView {
    let b64 = base64::engine::general_purpose::STANDARD;
    JobView {
        job: describe(job, trace),
        headers: job.headers.iter().cloned().collect(),
        payload_base64: b64.encode(&job.payload),
    }
}

/// The view of one transition row (its error response as text, or base64 when it is not
/// UTF-8).
pub fn transition_view(id: u64, t: &Transition) -> TransitionView {
    // The bytes decide, not the row's tag: an operator's SQL may have written either.
    let (error_response, encoding) = match t.error_response.as_deref().map(AnswerText::of) {
        Some(text) => {
            let (text, encoding) = text.into_parts();
            (Some(text), Some(encoding.to_owned()))
        }
        None => (None, None),
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

/// The import form of a stored job and its progress.
pub fn import_job(job: &Job, attempts: u16, retry_at: DateTime<Utc>) -> ImportJob {
    let (traceparent, tracestate) = crate::telemetry::TraceContext::fields(job.trace.as_ref());
    let (payload, payload_base64) = import_payload(&job.payload);
    ImportJob {
        id: job.id.to_string(),
        bucket: job.bucket.to_string(),
        endpoint: job.endpoint.to_string(),
        method: job.method.to_string(),
        headers: job.headers.clone(),
        payload,
        payload_base64,
        execution_timeout_ms: u32::try_from(job.execution_timeout.as_millis()).unwrap_or(u32::MAX),
        backoff_min_delay_ms: u32::try_from(job.retry.min_delay.as_millis()).unwrap_or(u32::MAX),
        backoff_coefficient: job.retry.coefficient,
        created_at: job.created_at,
        expire_at: job.expire_at,
        idempotency_key: job.idempotency_key.clone(),
        on_complete: job.on_complete.as_deref().map(str::to_owned),
        ordering_key: job.ordering.as_ref().map(|o| o.key.to_string()),
        ordering_failure: job.ordering.as_ref().map(crate::job::OrderedKey::failure),
        ordering_position: job.ordering.as_ref().map(|o| o.position.to_string()),
        event: job.event.as_ref().map(crate::job::EventLink::to_wire),
        traceparent,
        tracestate,
        attempts,
        retry_at,
    }
}

/// A payload as an import carries it: the JSON value itself when the bytes are exactly one
/// (most are: jobs submitted with `payload`), so nobody base64-encodes, escapes and decodes
/// them on the way; any other bytes in base64.
fn import_payload(payload: &[u8]) -> (Option<Box<RawValue>>, Option<String>) {
    if payload.is_empty() {
        return (None, None);
    }
    // One pass: the parse checks the value's bytes are UTF-8 as it reads them.
    let raw = serde_json::from_slice::<&RawValue>(payload)
        .ok()
        // Whitespace around the value is not part of it: such bytes go as base64.
        .filter(|raw| raw.get().len() == payload.len());
    match raw {
        Some(raw) => (Some(raw.to_owned()), None),
        None => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(payload)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::import_payload;

    #[test]
    fn only_exactly_one_json_value_goes_as_itself() {
        for json in [&br#"{"a":1}"#[..], b"[1,2]", "\"\u{e9}\"".as_bytes(), b"7"] {
            let (raw, base64) = import_payload(json);
            assert_eq!(
                raw.map(|r| r.get().as_bytes().to_vec()),
                Some(json.to_vec())
            );
            assert_eq!(base64, None);
        }
        for other in [
            &br#" {"a":1}"#[..],
            b"{\"a\":1}\n",
            b"1 2",
            b"{\"a\":\"\xff\"}",
            b"\xff",
            b"not json",
        ] {
            let (raw, base64) = import_payload(other);
            assert!(raw.is_none(), "{other:?}");
            assert!(base64.is_some(), "{other:?}");
        }
        let (raw, base64) = import_payload(b"");
        assert!(raw.is_none() && base64.is_none());
    }
}
