//! The RPC contract: the request and answer bodies of the HTTP API.
//!
//! The bodies are the wire types of the `spindle-client` crate, re-exported here: client and
//! server share one definition of the contract (and its OpenAPI schemas). What only the server
//! does with them has its own module, re-exported here so `rpc::api` names the whole contract:
//! [`super::validate`] turns a [`NewJob`] into a [`Job`](crate::job::Job) or a [`FieldError`]
//! naming the exact field, and [`super::views`] builds the answers that show stored jobs.

pub use spindle_client::api::{
    AcceptedJob, AttemptList, AttemptView, BackfillReply, BackfillRequest, BackfilledEvent,
    EndpointHealth, EndpointsView, ErrorBody, ErrorDetail, EventBatch, EventDelivery, EventFilter,
    EventLink, EventList, EventView, JobDescription, JobFilter, JobList, JobStatus, JobView,
    ListOrder, NewEvent, NewJob, NewSubscription, OrderingFailure, PastEvent, PayloadFilter,
    PublishBatchReply, PublishReply, SubmitReply, SubmitRequest, SubscriptionList,
    SubscriptionPatch, SubscriptionView, TransitionView, MAX_EVENTS_PER_REQUEST,
    MAX_JOBS_PER_EVENT_BATCH, MAX_JOBS_PER_REQUEST, MAX_LISTED_PER_PAGE,
};

pub use super::rules::{
    FieldError, IntakeLimits, MAX_BUCKET_CHARS, MAX_HEADERS, MAX_HEADER_BYTES,
    MAX_IDEMPOTENCY_KEY_CHARS, MAX_ORDERING_KEY_BYTES, MAX_URL_BYTES, METHODS, MIN_TIMEOUT,
};
pub use super::validate::{check_job, validate_request, JobTemplate};
pub use super::views::{accepted_jobs, describe, job_view, transition_view};
