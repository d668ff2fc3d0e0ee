//! The JobDB store's conformance suite: every store operation, run against both engines
//! (`NAME::mysql` on the machine's MariaDB, `NAME::sqlite` on a file), with the same
//! expectations; and one test that runs the whole scenario on both and requires the two
//! transcripts to be equal, so an engine cannot drift even where a check is loose.
//!
//! By subject: the whole store in one scenario, the commit log's, and the comparison of the
//! engines ([`scenario`]); owners and fencing, and a JobDB's creation, listing, lock and drop
//! ([`ownership`]); jobs scheduled for later ([`scheduled`]); completion notices
//! ([`notices`]); ordered keys' sequences ([`ordering`]); erasure's statements
//! ([`erasure`]). This file holds the fixtures they share: jobs, rows, attempts and the
//! scenario's start time.

#[path = "../common/mod.rs"]
mod common;

mod erasure;
mod notices;
mod ordering;
mod ownership;
mod scenario;
mod scheduled;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use spindle::job::{Job, JobId, RetryPolicy, State, Transition};

fn job(n: u8, bucket: &str, endpoint: &str, at: DateTime<Utc>) -> Arc<Job> {
    let mut id = [0u8; 16];
    id[0] = 1;
    id[15] = n;
    Arc::new(Job {
        id: JobId::from_bytes(id),
        bucket: bucket.into(),
        endpoint: endpoint.into(),
        method: "POST".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        payload: Bytes::from(format!("{{\"n\":{n}}}")),
        execution_timeout: Duration::from_millis(5000),
        retry: RetryPolicy {
            min_delay: Duration::from_millis(250),
            coefficient: 1.5,
        },
        created_at: at,
        expire_at: at + TimeDelta::hours(4),
        idempotency_key: n.is_multiple_of(2).then(|| format!("key-{n}")),
        on_complete: None,
        ordering: None,
        event: None,
        trace: None,
    })
}

fn row(job: &Job, state: State, attempts: u16, time: DateTime<Utc>) -> Transition {
    Transition {
        job_id: job.id,
        state,
        attempts,
        time,
        retry_at: None,
        error_type: None,
        error_response: None,
        error_response_encoding: None,
        response_status: None,
        duration_ms: None,
        started: None,
    }
}

fn attempt(t: Transition, status: u16, ms: u32, error: Option<&str>) -> Transition {
    Transition {
        response_status: Some(status),
        duration_ms: Some(ms),
        error_type: error.map(str::to_owned),
        error_response: error.map(|e| Bytes::from(format!("said {e}"))),
        error_response_encoding: error.map(|_| "utf-8"),
        ..t
    }
}

/// Whole milliseconds (both engines keep microseconds; this keeps sums exact too).
fn base_time() -> DateTime<Utc> {
    (Utc::now() - TimeDelta::minutes(10))
        .duration_trunc(TimeDelta::seconds(1))
        .unwrap()
}
