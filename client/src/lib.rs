//! A typed client for spindle's RPC API, and the API's wire types.
//!
//! spindle delivers jobs ("POST this payload to this endpoint, retry with backoff until it
//! succeeds or expires"). Producers submit them to a Director or, in a cluster, to a router,
//! which drops duplicates by idempotency key. Both answer the same `POST /v1/jobs`.
//!
//! - [`Client`]: one request per call (submit, look a job up, import, endpoint health,
//!   readiness), a bearer token, configurable timeouts, no hidden retries.
//! - [`Error`]: what failed, with the server's status, code, message and field; and
//!   [`Error::stored_nothing`] to decide whether a retry may go elsewhere.
//! - [`api`]: the request and answer bodies. The spindle server uses these same types, so
//!   client and server cannot disagree on the contract (feature `openapi` derives their
//!   OpenAPI schemas, for the server).
//!
//! # Example
//!
//! ```no_run
//! use spindle_client::{Client, JobStatus, NewJob};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:8080", std::env::var("SPINDLE_TOKEN").ok())?;
//! let job = NewJob::new("tenant-1", "https://example.test/hook")
//!     .with_payload(&serde_json::json!({"hello": "world"}))?
//!     .with_idempotency_key("order-1234");
//! match client.submit(&[job]).await {
//!     Ok(reply) => {
//!         for job in &reply.jobs {
//!             // A router may answer `duplicate` (the first job's id), `pending` or `failed`
//!             // (submit again later with the same key).
//!             println!("{} {}", job.id, job.status);
//!             if job.status == JobStatus::Accepted {
//!                 let view = client.job(&job.id).await?;
//!                 println!("state {} after {} attempts", view.job.state, view.job.attempts);
//!             }
//!         }
//!     }
//!     // 4xx: the server names the field, e.g. `jobs[0].endpoint is not a valid URL`.
//!     Err(e) if e.status().is_some_and(|s| (400..500).contains(&s)) => eprintln!("refused: {e}"),
//!     // Nothing stored for sure (no connection, 503): another server may take the batch.
//!     Err(e) if e.stored_nothing() => eprintln!("not stored, try again: {e}"),
//!     // Timeout, reset, 5xx: it may have been stored; send it again with the same keys.
//!     Err(e) => eprintln!("outcome unknown: {e}"),
//! }
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod api;
mod client;
mod error;

pub use api::{
    AcceptedJob, AttemptList, AttemptView, BackfillReply, BackfillRequest, BackfilledEvent,
    BlockedKey, EventBatch, EventDelivery, EventFilter, EventLink, EventList, EventView, ImportJob,
    ImportRequest, ImportResponse, JobDescription, JobFilter, JobList, JobState, JobStatus,
    JobView, KeptEvent, ListOrder, NewEvent, NewJob, NewSubscription, OrderingFailure, PastEvent,
    PayloadFilter, PublishBatchReply, PublishReply, SubmitReply, SubmitRequest, SubscriptionList,
    SubscriptionPatch, SubscriptionView, TransitionView,
};
pub use client::{Client, ClientBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT};
pub use error::{ApiError, Error};
