//! What the Director's tasks send one another. To the writer: the requests it takes
//! ([`WriteOp`]), the answers it gives ([`Accepted`], or why nothing was stored:
//! [`WriteRejected`]), and the claim on a producer's request ([`Ticket`]); its senders are the
//! intake (submissions, imports), the scheduler (transitions, starts, rests, offers), the
//! sequencer (releases, blocks left) and archiving (`archived` rows). To the scheduler: what
//! it must react to ([`Event`]), from the writer, its attempts, its reads and the watchers. A
//! leaf: it names no task, so the tasks name it and not each other.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use ulid::Ulid;

use crate::delivery::AttemptResult;
use crate::job::{AttemptStart, Job, JobId, Progress, Recovered, Seq, Transition};
use crate::jobdb::commands::Command;
use crate::jobdb::BlockedKey;
use crate::registry::controls::Controls;
use crate::rpc::api::FieldError;
use crate::rpc::error::{ApiError, OUTCOME_UNKNOWN};

/// A producer's request to the writer (a submission or an import), claimed exactly once:
/// by the writer when it takes the request into a transaction ([`Ticket::take`]), or by
/// the handler that stopped waiting first ([`Ticket::withdraw`]), whose request is then
/// never written. A handler that stops waiting after the writer took its request marks it
/// abandoned: the writer leaves it out of any later try.
#[derive(Clone, Debug, Default)]
pub struct Ticket(Arc<std::sync::atomic::AtomicU8>);

impl Ticket {
    const QUEUED: u8 = 0;
    const TAKEN: u8 = 1;
    const WITHDRAWN: u8 = 2;
    const ABANDONED: u8 = 3;

    /// A ticket for a request about to be queued.
    pub fn new() -> Self {
        Self::default()
    }

    /// The writer takes the request into a transaction: `false` if its handler withdrew it
    /// first (then it must not be written, ever).
    pub fn take(&self) -> bool {
        self.swap(Self::QUEUED, Self::TAKEN)
    }

    /// The handler stops waiting. `true`: the request was still queued, and now never will
    /// be written (nothing stored). `false`: the writer had taken it, its outcome is unknown;
    /// it is abandoned, and no later try writes it.
    pub fn withdraw(&self) -> bool {
        if self.swap(Self::QUEUED, Self::WITHDRAWN) {
            return true;
        }
        self.swap(Self::TAKEN, Self::ABANDONED);
        false
    }

    /// Whether its handler stopped waiting after the writer took it.
    pub fn abandoned(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire) == Self::ABANDONED
    }

    fn swap(&self, from: u8, to: u8) -> bool {
        use std::sync::atomic::Ordering;
        self.0
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A submission made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The transaction's id (what producers are told).
    pub transaction: Ulid,
    /// Jobs of a forwarded submission that an earlier try had stored already (not stored
    /// again, not handed to the scheduler again).
    pub already_present: usize,
}

/// Which jobs of a submission may be stored already (an earlier request's), and so are
/// skipped rather than stored twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeats {
    /// None: its ids were minted for it here.
    Impossible,
    /// A job whose id is stored: its ids were minted elsewhere (a router's forward), and an
    /// earlier try of the same request may have stored some. Found only when the JobDB
    /// refuses a duplicate, so a first try costs no read.
    SameIds,
    /// A job of an event that has a job of the same subscription here (a back-fill, perhaps
    /// sent again after a 504). The writer looks before each try of the commit: it alone
    /// stores jobs in its JobDB, so nothing can store one between its look and its commit.
    SameDeliveries,
}

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
    /// The request was in a transaction whose outcome cannot be known now (the Director lost
    /// its JobDB while finding out): it may or may not have been stored.
    #[error("the outcome of the write is unknown")]
    Unknown,
}

impl From<WriteRejected> for ApiError {
    /// What a producer hears when the writer did not store its request.
    fn from(why: WriteRejected) -> Self {
        match why {
            WriteRejected::Unavailable => {
                ApiError::Unavailable("the jobdb is unavailable; nothing was stored".into())
            }
            WriteRejected::LockLost => ApiError::ShuttingDown,
            WriteRejected::Refused { too_large: true } => {
                ApiError::InvalidField(FieldError::too_large(
                    "jobs",
                    "a job is larger than this director's jobdb server accepts \
                     (max_allowed_packet); nothing was stored",
                ))
            }
            WriteRejected::Refused { too_large: false } => ApiError::InvalidField(FieldError::new(
                "jobs",
                "the jobdb refused a value of this batch; nothing was stored",
            )),
            WriteRejected::Unknown => ApiError::OutcomeUnknown(OUTCOME_UNKNOWN.into()),
            WriteRejected::Expired => ApiError::Conflict {
                message: "not_after passed before the jobs were written: the claim may have \
                          been taken over; nothing was stored"
                    .into(),
                field: Some("not_after".to_owned()),
            },
        }
    }
}

/// A request to the writer.
#[derive(Debug)]
pub enum WriteOp {
    /// New jobs (their `jobs` rows are their acceptance; the commit's log row lists them);
    /// answered with the transaction id.
    Submit {
        /// The validated jobs.
        jobs: Vec<Arc<Job>>,
        /// Events kept without a job (published, matching no subscription), written with them.
        events: Vec<crate::job::EventRecord>,
        /// Those of `jobs` that wait for a later first attempt: each gets its `scheduled` row
        /// (and so its `open_jobs` entry) in the same commit.
        scheduled: crate::job::Scheduled,
        /// Never committed after this instant (a router's claim deadline): checked when the
        /// batch is assembled and again just before each COMMIT that carries the jobs.
        not_after: Option<DateTime<Utc>>,
        /// Which of its jobs may be stored already, by an earlier request: those are skipped
        /// (and counted), not refused.
        repeats: Repeats,
        /// Those of its ordered jobs the intake cleared against the other live JobDBs
        /// (`director::ordering::survey::Clearance`): they may go in the writer's commits.
        cleared: Vec<JobId>,
        /// Where the outcome goes once known.
        reply: oneshot::Sender<Result<Accepted, WriteRejected>>,
        /// Claimed by the writer or by the handler that stopped waiting, whichever comes first.
        ticket: Ticket,
    },
    /// Jobs imported from a retired JobDB (each gets its `imported` row and its origin).
    Import {
        /// The jobs with their progress.
        jobs: Vec<Recovered>,
        /// The retired JobDB they come from.
        from_jobdb: String,
        /// Keys blocked there: blocked here in the same commit, so the block follows the key.
        blocks: Vec<BlockedKey>,
        /// Told once they are durable (or will never be).
        reply: oneshot::Sender<Result<(), WriteRejected>>,
        /// Claimed by the writer or by the handler that stopped waiting, whichever comes first.
        ticket: Ticket,
    },
    /// State transitions of known jobs, optionally acknowledged after COMMIT.
    Transitions {
        /// Rows to append, in order.
        rows: Vec<Transition>,
        /// Told once the rows are durable (or will never be).
        done: Option<oneshot::Sender<Result<(), WriteRejected>>>,
    },
    /// Attempts to begin: the commit's log row lists them, and once it is durable their
    /// requests may be sent. `rows` (earlier outcomes) go first, in order.
    Start {
        /// Rows queued before these starts.
        rows: Vec<Transition>,
        /// Each job and the number of the attempt it begins.
        starts: Vec<(JobId, u16)>,
        /// Told where the attempts began once durable (or that they will not be).
        done: oneshot::Sender<Result<AttemptStart, WriteRejected>>,
    },
    /// Ordered jobs just ended (their rows sent before this) whose lanes could start an
    /// attempt: the next job of each of their sequences may begin its attempt in the commit
    /// that releases it, one commit less per job of a key. The scheduler hears `BegunOnRelease` for the jobs begun so; an offer not
    /// taken costs nothing.
    Begin {
        /// The sequences.
        seqs: Vec<Seq>,
    },
    /// Jobs accepted and never tried that wait in the JobDB only from now on (the cache has
    /// no room for them): each gets its `open_jobs` entry unless it has one, so backlog passes
    /// find it. A fresh ordered job is under way: its entry goes in released.
    Rest {
        /// The jobs.
        jobs: Vec<JobId>,
        /// Told once their entries are durable (or will never be).
        done: Option<oneshot::Sender<Result<(), WriteRejected>>>,
    },
    /// Ordered jobs whose turn came (the sequencer found each its sequence's head): released
    /// in the commit if each still is (the writer's book tells, or the store for a spilled
    /// sequence), and handed to the scheduler after it.
    Release {
        /// Each sequence with the job at its head.
        heads: Vec<(Seq, JobId)>,
        /// Held jobs whose expiry has passed: released if still held and expired, for the
        /// scheduler to end (never tried), which lets their sequences go on.
        expired: Vec<JobId>,
    },
    /// Answered, once everything queued before it is durable, with the first transition id
    /// after it: a read whose snapshot starts later sees every earlier row, and rows with
    /// lower ids are all the writes that came before it.
    Barrier(oneshot::Sender<u64>),
    /// A [`WriteOp::Barrier`] before which every kept ordered job gets its held entry: what an
    /// operator command's read of the JobDB waits for (kept jobs have no entry to find).
    RestKept(oneshot::Sender<u64>),
    /// The blocks left (`ordering_blocked`), read after every write before barrier id `as_of`
    /// committed: a key whose block an operator deleted goes on.
    BlocksLeft {
        /// The barrier's id.
        as_of: u64,
        /// The blocked sequences read.
        left: std::collections::HashSet<Seq>,
    },
}

/// Something the scheduler must react to.
#[derive(Debug)]
pub enum Event {
    /// New jobs, durable in the JobDB.
    Accepted(Vec<Arc<Job>>),
    /// Jobs a commit hands over with a past (attempts, a due time): imports from a retired
    /// JobDB, ordered jobs released for their turn (or to be expired), completion notices.
    HandedOver(Vec<Recovered>),
    /// The commit that begins these jobs' attempts is durable: deliver them now.
    Started(Vec<JobId>, AttemptStart),
    /// The commit that would begin these jobs' attempts could not be written.
    StartFailed(Vec<JobId>, WriteRejected),
    /// Spilled jobs read back from the JobDB (with the ids that were asked for).
    Reloaded(Vec<Job>, Vec<JobId>),
    /// Reading spilled jobs back failed; they are tried again shortly.
    ReloadFailed(Vec<JobId>),
    /// A page of the backlog (jobs in the JobDB but not in the cache), read with `limit`.
    BacklogPage {
        /// The jobs, without payloads; `None` if the read failed.
        jobs: Option<Vec<(Job, Progress)>>,
        /// The most the page could hold: fewer means the pass reached the end.
        limit: usize,
        /// For a last page read up to a horizon: when the first job beyond it comes due.
        next_due: Option<DateTime<Utc>>,
    },
    /// Waiting jobs of every lane but `lane`, read while that lane holds most of a full
    /// cache: they come in, and `lane` gives way to them.
    OtherLanesPage {
        /// The jobs, without payloads; `None` if the read failed.
        jobs: Option<Vec<(Job, Progress)>>,
        /// The lane left out.
        lane: Arc<str>,
        /// The most the page could hold: fewer means the read reached the end.
        limit: usize,
    },
    /// An operator command appended to the JobDB, to apply.
    Command(Box<Command>),
    /// The endpoint and bucket controls in force now (from the registry).
    Controls(Arc<Controls>),
    /// The subscriptions whose jobs wait now (disabled, or not known yet; from the control
    /// database).
    SubscriptionGate(Arc<crate::events::SubscriptionGate>),
    /// The caps subscriptions put on their URLs now (from the control database): applied
    /// with the registry's endpoint controls, the tighter of the two.
    SubscriptionCaps(Arc<crate::events::EndpointCaps>),
    /// The jobs in the JobDB a command names (`None` if the read failed).
    CommandTargets {
        /// The command.
        command: Box<Command>,
        /// Waiting jobs it names, with their progress.
        targets: Option<Vec<(JobId, Progress)>>,
    },
    /// Ordered jobs a commit released and began the attempts of (their sequences offered:
    /// [`WriteOp::Begin`]), with where they began.
    BegunOnRelease(Vec<Recovered>, AttemptStart),
    /// An attempt ended.
    Finished {
        /// The job.
        id: JobId,
        /// What happened.
        result: Box<AttemptResult>,
    },
}
