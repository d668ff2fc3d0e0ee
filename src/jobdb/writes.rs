//! Requests to the JobDB's one writer (the Director's group commit) and why one is not made.
//! They live with the store, below everyone who sends them (the Director's intake, imports,
//! the scheduler, the archiver); the writer task itself is the Director's
//! (`director::writer`).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use ulid::Ulid;

use crate::job::{Job, Recovered, Transition};

/// Why a write was not made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteRejected {
    /// The JobDB could not be reached; nothing of the request was stored.
    #[error("the jobdb is unavailable; nothing was stored")]
    Unavailable,
    /// This Director lost its JobDB; nothing of the request was stored.
    #[error("this director no longer owns its jobdb; nothing was stored")]
    LockLost,
    /// The JobDB refused the request's data (`too_large`: a row is larger than its server
    /// accepts); nothing of the request was stored, and sending it again cannot help.
    #[error("the jobdb refused this request's data; nothing was stored")]
    Refused {
        /// A row is larger than the server's packet limit.
        too_large: bool,
    },
    /// The request's `not_after` passed before its batch was written; nothing was stored.
    #[error("not_after passed before the write; nothing was stored")]
    Expired,
}

/// A request to the writer.
#[derive(Debug)]
pub enum WriteOp {
    /// New jobs (each gets its `awaiting-scheduling` row); answered with the transaction id.
    Submit {
        /// The validated jobs.
        jobs: Vec<Arc<Job>>,
        /// Refused unless the batch is assembled by then (a router's claim deadline).
        not_after: Option<DateTime<Utc>>,
        /// Where the outcome goes once known.
        reply: oneshot::Sender<Result<Ulid, WriteRejected>>,
    },
    /// Jobs imported from a retired JobDB (each gets its `imported` row and its origin).
    Import {
        /// The jobs with their progress.
        jobs: Vec<Recovered>,
        /// The retired JobDB they come from.
        from_jobdb: String,
        /// Told once they are durable (or will never be).
        reply: oneshot::Sender<Result<(), WriteRejected>>,
    },
    /// State transitions of known jobs, optionally acknowledged after COMMIT.
    Transitions {
        /// Rows to append, in order.
        rows: Vec<Transition>,
        /// Told once the rows are durable (or will never be).
        done: Option<oneshot::Sender<Result<(), WriteRejected>>>,
    },
    /// Answered, once everything queued before it is durable, with the first transition id
    /// after it: a read whose snapshot starts later sees every earlier row, and rows with
    /// lower ids are all the writes that came before it.
    Barrier(oneshot::Sender<u64>),
}
