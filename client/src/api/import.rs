//! The bodies of `POST /v1/import`: jobs moved out of a retired JobDB with their progress, or
//! new jobs a router forwards with their ids.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::NewJob;
use super::{EventLink, OrderingFailure};

/// Jobs moved out of a retired JobDB.
// (`POST /v1/import` body, admin only: also new jobs a router forwards with their ids. The
// doc line above is the schema's description in /openapi.json.)
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    /// The JobDB the caller expects this Director to own (409 if it owns another).
    pub jobdb: String,
    /// The retired JobDB the jobs come from; absent for new jobs forwarded by a router.
    #[serde(default)]
    pub from_jobdb: Option<String>,
    /// New jobs only: refuse the request (409, nothing stored) once this instant has passed.
    #[serde(default, serialize_with = "super::timestamp::option")]
    pub not_after: Option<DateTime<Utc>>,
    /// 1 to 1000 jobs (none when the request only carries `blocked_keys` or `events`).
    pub jobs: Vec<ImportJob>,
    /// Moves only: ordered keys blocked in the retired JobDB (a job that asked to block its key
    /// ended without success there), carried so the block follows the key: stored in this
    /// JobDB with the same transaction as `jobs`; a key blocked here already keeps its block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_keys: Vec<BlockedKey>,
    /// New events only (a router's publish): events that matched no subscription, kept in the
    /// same transaction as `jobs` (which may then be empty) so they keep their ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<KeptEvent>,
}

/// An event published without a job (it matched no subscription), kept with its envelope so a
/// subscription added later can be back-filled with it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct KeptEvent {
    /// The event's id (a ULID).
    pub event_id: String,
    /// Its bucket.
    pub bucket: String,
    /// Its type.
    pub event_type: String,
    /// When it was published.
    pub created_at: DateTime<Utc>,
    /// Its envelope, `{"type", "timestamp", "data"}`, as a job of it would carry it.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub envelope: Box<serde_json::value::RawValue>,
}

/// An ordered key stopped by a job that ended without success and asked to block it; it stays
/// stopped until an operator deletes its `ordering_blocked` row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BlockedKey {
    /// The key's bucket.
    pub bucket: String,
    /// The key's endpoint URL.
    pub endpoint: String,
    /// The ordering key.
    pub ordering_key: String,
    /// The job whose end blocked it (ULID).
    pub job_id: String,
    /// How that job ended (`discarded`, `archiving`).
    pub state: String,
    /// When it blocked the key.
    pub blocked_at: DateTime<Utc>,
}

/// One job as it was stored in the retired JobDB, with its progress.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ImportJob {
    /// The job's id (ULID), kept.
    pub id: String,
    /// Its bucket.
    pub bucket: String,
    /// Its endpoint URL.
    pub endpoint: String,
    /// Its HTTP method.
    pub method: String,
    /// Its headers as `[name, value]` pairs, in order.
    pub headers: Vec<(String, String)>,
    /// Its body when it is a JSON value, exactly these bytes (a router forwards a job submitted
    /// with `payload` so: no re-encoding); give this or `payload_base64` (neither: no body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: Option<Box<serde_json::value::RawValue>>,
    /// Its body, base64, for any bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// Deadline of one attempt.
    pub execution_timeout_ms: u32,
    /// Delay before the second attempt.
    pub backoff_min_delay_ms: u32,
    /// Growth of the delay per attempt.
    pub backoff_coefficient: f64,
    /// When it was first accepted.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub created_at: DateTime<Utc>,
    /// When it stops being retried.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub expire_at: DateTime<Utc>,
    /// The producer's idempotency key.
    pub idempotency_key: Option<String>,
    /// The URL told when it ends (see [`NewJob::on_complete`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_complete: Option<String>,
    /// Its ordering key (see [`NewJob::ordering_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// What it does to its key's later jobs if it ends without success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_failure: Option<OrderingFailure>,
    /// Moves only: its place in its key's order (a ULID the accepting Director minted), kept
    /// so a moved job keeps its turn; a router's new jobs get theirs where they are stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_position: Option<String>,
    /// The event it delivers, if an event's subscription made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<EventLink>,
    /// The trace it was submitted in (see [`NewJob::traceparent`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Its `tracestate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// Attempts made so far (0 for new jobs).
    #[serde(default)]
    pub attempts: u16,
    /// When its next attempt is due (new jobs: when they were accepted).
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub retry_at: DateTime<Utc>,
}

/// What an import did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportResponse {
    /// The JobDB the jobs are now in.
    pub jobdb: String,
    /// Jobs stored by this request.
    pub imported: usize,
    /// Jobs that were already there (an earlier attempt of the same import).
    pub already_present: usize,
}
