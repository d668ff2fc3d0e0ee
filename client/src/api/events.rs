//! Subscriptions and events: the bodies of `/v1/subscriptions` and `/v1/events`, back-fills,
//! and the link from a job to the event it delivers.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{integral, OrderingFailure};

/// `POST /v1/subscriptions` body: who gets which events of a bucket, and how.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewSubscription {
    /// The bucket (tenant) whose events it receives (1–128 characters).
    pub bucket: String,
    /// The http or https URL events are delivered to (at most 2048 bytes; not in a blocked
    /// address range).
    pub url: String,
    /// Event types it wants (1 to 64): exact names (`invoice.paid`), prefix wildcards
    /// (`invoice.*`) or `*` for every type.
    pub event_types: Vec<String>,
    /// Only events whose payload has this value at this JSON pointer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<PayloadFilter>,
    /// Extra request headers (at most 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// Its Standard Webhooks signing secret (`whsec_` + base64 of 24–64 bytes); one is made
    /// when absent and shown once, in the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// A JSON pointer into the payload whose value (a string or number) orders the events
    /// sent to it: events with the same value arrive one at a time, in publish order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// With `ordering_key`: what an event that fails for good does to the later events of
    /// its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_failure: Option<OrderingFailure>,
    /// Deadline of one attempt in ms (as a job's `execution_timeout_ms`).
    #[serde(
        default,
        deserialize_with = "integral",
        skip_serializing_if = "Option::is_none"
    )]
    pub execution_timeout_ms: Option<u64>,
    /// Delay before the second attempt in ms (as a job's `backoff_min_delay_ms`).
    #[serde(
        default,
        deserialize_with = "integral",
        skip_serializing_if = "Option::is_none"
    )]
    pub backoff_min_delay_ms: Option<u64>,
    /// Growth of the delay per attempt (as a job's `backoff_coefficient`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_coefficient: Option<f64>,
    /// How long an event is retried for it, in ms (as a job's `ttl_ms`).
    #[serde(
        default,
        deserialize_with = "integral",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttl_ms: Option<u64>,
    /// Whether it receives events now (default true). A disabled subscription still gets
    /// its jobs; they wait until it is enabled again (or expire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Free text for operators (at most 256 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Most requests to its URL in flight at once, per Director (1 to 10,000). Its URL's
    /// endpoint control in Consul, when lower, still rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// Most requests to its URL started per second, per Director (above 0, at most
    /// 1,000,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_second: Option<f64>,
    /// Whether its receiver gets a W3C `traceparent` header naming the attempt's span, so
    /// the receiver's trace continues it (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_traceparent: Option<bool>,
}

impl NewSubscription {
    /// A subscription of `bucket` to `event_types`, delivered to `url`, with every other field
    /// left to the server's defaults.
    pub fn new(
        bucket: impl Into<String>,
        url: impl Into<String>,
        event_types: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        NewSubscription {
            bucket: bucket.into(),
            url: url.into(),
            event_types: event_types.into_iter().map(Into::into).collect(),
            ..NewSubscription::default()
        }
    }
}

fn yes() -> bool {
    true
}

/// A payload filter: the value at a JSON pointer (RFC 6901) must equal `equals`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PayloadFilter {
    /// Where in the payload (`/customer/tier`; `""` is the whole payload).
    pub pointer: String,
    /// The value it must have.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub equals: serde_json::Value,
}

/// `PATCH /v1/subscriptions/{id}` body: the fields to change.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubscriptionPatch {
    /// Enable or disable it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// A new URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// New event types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
}

/// A stored subscription, as the API shows it (its secret only in the answer that made it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubscriptionView {
    /// Its id (a ULID).
    pub id: String,
    /// Its bucket.
    pub bucket: String,
    /// Where events go.
    pub url: String,
    /// The event types it wants.
    pub event_types: Vec<String>,
    /// Its payload filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<PayloadFilter>,
    /// Its extra headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Its signing secret: only in the answer to `POST /v1/subscriptions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Its ordering key pointer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// Whether events go out now.
    pub enabled: bool,
    /// Its description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its cap on requests in flight, per Director.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// Its cap on requests started per second, per Director.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_second: Option<f64>,
    /// Whether its receiver gets a `traceparent` header.
    #[serde(default = "yes")]
    pub send_traceparent: bool,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// The version of its last change: give it as `If-Match` to a `PATCH` so that the edit
    /// holds only if nobody changed it since (its answer's `ETag` too), from the answer that
    /// made it on.
    #[serde(default)]
    pub version: u64,
}

/// `GET /v1/subscriptions` answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubscriptionList {
    /// The subscriptions, by id.
    pub subscriptions: Vec<SubscriptionView>,
    /// More follow: ask again with `?after=` this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// Most subscriptions one page of `GET /v1/subscriptions` lists (`?limit=`; 100 unless given).
pub const MAX_SUBSCRIPTIONS_PER_PAGE: usize = 1000;

/// `POST /v1/events` body: one event of a bucket, delivered to every matching subscription.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewEvent {
    /// The bucket (tenant) it belongs to.
    pub bucket: String,
    /// Its type: dot-separated names of letters, digits, `_` and `-` (at most 255 bytes).
    pub event_type: String,
    /// Its data, any JSON value: subscribers get `{"type", "timestamp", "data"}`.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: Box<serde_json::value::RawValue>,
    /// The producer's idempotency key: a repeated key (through a router) stores nothing new.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// When to make the first attempts (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<DateTime<Utc>>,
    /// A URL told when each of its jobs ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_complete: Option<String>,
    /// The W3C trace context of the producer's span, for an event of a batch made in a trace
    /// of its own; otherwise the request's `traceparent` header applies (see
    /// [`crate::NewJob::traceparent`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The `tracestate` that goes with `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// `POST /v1/events` answer: the event and, per matching subscription, its job. The event and
/// every job were committed in one transaction before this answer; an event that matched no
/// subscription is kept all the same (a subscription added later can be back-filled with it).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PublishReply {
    /// The event's id (a ULID). Always given by this release; optional on the wire for
    /// servers that stored nothing for an event that matched no subscription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// The JobDB transaction that stored it (absent through a router, and from servers that
    /// stored nothing for an event that matched no subscription).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction_id: Option<String>,
    /// One job per matching subscription.
    pub deliveries: Vec<EventDelivery>,
    /// Through a router: the idempotency key was published before, within the dedup window.
    /// `event_id` is that event's, `deliveries` its jobs (when a Director could tell them),
    /// and nothing new was stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// Most events one `POST /v1/events` carries.
pub const MAX_EVENTS_PER_REQUEST: usize = 1000;

/// Most jobs one request's events make between them (each event makes one per matching
/// subscription); all of them are committed in one transaction.
pub const MAX_JOBS_PER_EVENT_BATCH: usize = 10_000;

/// `POST /v1/events` body for a batch: 1 to [`MAX_EVENTS_PER_REQUEST`] events, whose jobs are
/// all committed in one transaction, or none of them.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EventBatch {
    /// The events, each as `POST /v1/events` takes one.
    pub events: Vec<NewEvent>,
}

/// `POST /v1/events` answer to a batch: per event, in the request's order, what a publish of
/// it alone answers. Every job was committed in one transaction before this answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PublishBatchReply {
    /// The JobDB transaction that stored the jobs (absent when no event matched anything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction_id: Option<String>,
    /// One answer per event.
    pub events: Vec<PublishReply>,
}

/// `GET /v1/events/{id}` answer: an event as the JobDB of the Director asked holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventView {
    /// The event's id (a ULID).
    pub event_id: String,
    /// Its bucket.
    pub bucket: String,
    /// Its type.
    pub event_type: String,
    /// When it was published.
    pub created_at: DateTime<Utc>,
    /// Its jobs in this JobDB, one per subscription it reached, by subscription.
    pub deliveries: Vec<EventDelivery>,
}

/// `POST /v1/subscriptions/{id}/backfill` body: past events to deliver to one subscription
/// (added after they were published), as a back-fill reads them from a JobDB or the archive.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// 1 to 1000 events of the subscription's bucket; those its types or filter do not want,
    /// and those it already has a job for in this Director's JobDB, are skipped.
    pub events: Vec<PastEvent>,
}

/// An event as it was published: its id, type, time and data (its envelope's parts).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PastEvent {
    /// The event's id (a ULID): the subscriber sees the same `spindle-event-id`.
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// When it was published (its envelope's `timestamp`).
    pub timestamp: DateTime<Utc>,
    /// Its data, any JSON value.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: Box<serde_json::value::RawValue>,
}

/// `POST /v1/subscriptions/{id}/backfill` answer: the jobs made, all committed together.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BackfillReply {
    /// One job per event delivered now: its `subscription_id` is the back-filled one.
    pub deliveries: Vec<BackfilledEvent>,
    /// Events skipped: not wanted by the subscription, or already given a job for it here.
    pub skipped: usize,
}

/// A back-filled event's job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BackfilledEvent {
    /// The event.
    pub event_id: String,
    /// Its job for the subscription.
    pub job_id: String,
}

/// One subscription's job of an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventDelivery {
    /// The subscription.
    pub subscription_id: String,
    /// Its job.
    pub job_id: String,
}

/// Which event a job delivers, and for which subscription.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EventLink {
    /// The event's id (a ULID).
    pub event_id: String,
    /// The event's type.
    pub event_type: String,
    /// The subscription's id (a ULID).
    pub subscription_id: String,
}
