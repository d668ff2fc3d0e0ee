//! The domain of a job: ids, states, retry policy, jobs and their state transitions.
//!
//! Nothing here does I/O. The legal state changes have constructors on [`Transition`], so the
//! rest of the crate cannot write an illegal one (River's lesson).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use ulid::Ulid;

/// A job id: a ULID, sortable by creation time and unique, stored as `BINARY(16)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub Ulid);

impl JobId {
    /// The 16 big-endian bytes stored in the JobDB.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_bytes()
    }

    /// Rebuilds an id from the 16 bytes stored in the JobDB.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        JobId(Ulid::from_bytes(bytes))
    }

    /// The id as 32 upper-case hex digits: what `HEX(id)` prints in `mysql`.
    pub fn to_hex(self) -> String {
        format!("{:032X}", u128::from(self.0))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Error for an id that is neither a ULID nor 32 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("not a job id: expected a 26-character ULID or 32 hex digits")]
pub struct InvalidJobId;

impl FromStr for JobId {
    type Err = InvalidJobId;

    /// Accepts the ULID text form and the `HEX(id)` form operators copy out of `mysql`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() == 32 {
            return u128::from_str_radix(s, 16)
                .map(|v| JobId(Ulid::from(v)))
                .map_err(|_| InvalidJobId);
        }
        Ulid::from_string(s).map(JobId).map_err(|_| InvalidJobId)
    }
}

/// The states of the job state machine, spelled as in the JobDB enum and the API: the wire
/// type of the RPC contract (`spindle_client::JobState`), with its classification
/// (`is_terminal`, `is_final`) and its legal steps (`may_precede`).
pub use spindle_client::api::{JobState as State, UnknownState};

/// A job's own retry policy: `min_delay × coefficient^(attempt−1)`, jittered and capped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Delay before the second attempt.
    pub min_delay: Duration,
    /// Growth factor of the delay per further attempt (≥ 1).
    pub coefficient: f64,
}

/// The jobs of a submission that wait for a later first attempt (`deliver_at`, `delay_ms`),
/// with their time; empty when none does (the common case costs nothing).
pub type Scheduled = Vec<(JobId, DateTime<Utc>)>;

/// A job: what to send where, how long to wait per attempt, how to back off, when to give up.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Unique, time-sortable id.
    pub id: JobId,
    /// The isolation key: a tenant, or a source–destination pair.
    pub bucket: Arc<str>,
    /// The URL the payload is sent to.
    pub endpoint: Arc<str>,
    /// HTTP method, upper case.
    pub method: Arc<str>,
    /// Request headers, in the order given (content-type included).
    pub headers: Vec<(String, String)>,
    /// The request body.
    pub payload: Bytes,
    /// Deadline of one attempt, including reading the response.
    pub execution_timeout: Duration,
    /// How retries are spaced.
    pub retry: RetryPolicy,
    /// When the job was accepted.
    pub created_at: DateTime<Utc>,
    /// When the job stops being retried and goes to the archive.
    pub expire_at: DateTime<Utc>,
    /// The producer's idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// A URL told when the job ends (succeeded, discarded or archived): its notice is a job of
    /// its own, written with the row that ends this one.
    pub on_complete: Option<Arc<str>>,
    /// Its ordering key, if it is delivered in order with the other jobs of its bucket and
    /// endpoint that carry the same key.
    pub ordering: Option<OrderedKey>,
    /// The event it delivers and the subscription it delivers it to, if an event made it.
    pub event: Option<EventLink>,
    /// The trace it was submitted in (the producer's span), which its attempts link to.
    pub trace: Option<crate::telemetry::TraceContext>,
}

/// Longest event type, in bytes (the `jobs.event_type` column).
pub const MAX_EVENT_TYPE_BYTES: usize = 255;

/// Whether `text` is an event type: dot-separated names of ASCII letters, digits, `_` and
/// `-`, at most [`MAX_EVENT_TYPE_BYTES`].
pub fn valid_event_type(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_EVENT_TYPE_BYTES
        && text.split('.').all(|name| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// Which event a job delivers, and to which subscription: written with the job
/// (`jobs.event_id`, `jobs.event_type`, `jobs.subscription_id`), kept when a drainer moves it
/// and in the archive, so "who got event X" is one SQL query and a subscription can be
/// back-filled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLink {
    /// The event (a ULID minted when it was published).
    pub event_id: Ulid,
    /// Its type.
    pub event_type: Arc<str>,
    /// The subscription the job delivers it to.
    pub subscription: Ulid,
}

/// An event kept without a job: one that matched no subscription when it was published. Its
/// `events` row holds the envelope (`{"type", "timestamp", "data"}`) no job carries, so the
/// event keeps its id and a subscription added later can be back-filled with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    /// The event.
    pub id: Ulid,
    /// Its bucket.
    pub bucket: Arc<str>,
    /// Its type.
    pub event_type: Arc<str>,
    /// When it was published.
    pub created_at: DateTime<Utc>,
    /// Its envelope, as a job of it would carry it.
    pub envelope: Bytes,
}

impl EventRecord {
    /// Its wire form (a router's forward, the archive); `None` if its envelope is not JSON (a
    /// row changed by hand).
    pub fn to_wire(&self) -> Option<spindle_client::KeptEvent> {
        let text = std::str::from_utf8(&self.envelope).ok()?;
        let envelope = serde_json::value::RawValue::from_string(text.to_owned()).ok()?;
        Some(spindle_client::KeptEvent {
            event_id: self.id.to_string(),
            bucket: self.bucket.to_string(),
            event_type: self.event_type.to_string(),
            created_at: self.created_at,
            envelope,
        })
    }
}

impl EventLink {
    /// Its wire form (job views, imports, the archive).
    pub fn to_wire(&self) -> spindle_client::EventLink {
        spindle_client::EventLink {
            event_id: self.event_id.to_string(),
            event_type: self.event_type.to_string(),
            subscription_id: self.subscription.to_string(),
        }
    }

    /// From its wire form, checked; the error names the field within the link
    /// (`event_type`, `event_id`, `subscription_id`) and what is wrong.
    pub fn from_wire(
        link: &spindle_client::EventLink,
    ) -> Result<EventLink, (&'static str, &'static str)> {
        if !valid_event_type(&link.event_type) {
            return Err(("event_type", "is not an event type"));
        }
        let ulid = |text: &str, name: &'static str| {
            text.parse::<Ulid>().map_err(|_| (name, "is not a ULID"))
        };
        Ok(EventLink {
            event_id: ulid(&link.event_id, "event_id")?,
            event_type: link.event_type.as_str().into(),
            subscription: ulid(&link.subscription_id, "subscription_id")?,
        })
    }
}

/// A job's ordered key: the key, whether its failure holds the rest, and its position in
/// the key's order (its place in its sequence).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderedKey {
    /// The producer's ordering key (1 to 255 bytes).
    pub key: Arc<str>,
    /// Whether the key's later jobs wait for an operator when this one ends without success
    /// (discarded by a failure, or expired); otherwise the next one goes. An operator's flush
    /// or discard never blocks.
    pub blocks: bool,
    /// Its place in the key's order: a ULID minted by the Director that accepted it, when it
    /// accepted it (never by a router, whose clock may disagree), kept when a drainer moves
    /// it. A key's jobs go in position order.
    pub position: Ulid,
}

impl OrderedKey {
    /// What this job's unsuccessful end does to its key's later jobs, as the API spells it.
    pub fn failure(&self) -> spindle_client::OrderingFailure {
        match self.blocks {
            true => spindle_client::OrderingFailure::Block,
            false => spindle_client::OrderingFailure::Release,
        }
    }
}

/// The id of one ordered sequence, (bucket, endpoint, ordering key): the first 16 bytes of
/// the SHA-256 of the three, each preceded by its length, so no two triples share it by
/// concatenation. Stored in `open_jobs.seq`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub [u8; 16]);

impl Seq {
    /// Its 16 bytes, as a query binds them.
    pub fn to_vec(&self) -> Vec<u8> {
        self.0.to_vec()
    }
}

impl AsRef<[u8]> for Seq {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl TryFrom<Vec<u8>> for Seq {
    type Error = Vec<u8>;

    /// A stored id: exactly 16 bytes (the bytes back otherwise).
    fn try_from(bytes: Vec<u8>) -> Result<Seq, Vec<u8>> {
        bytes.try_into().map(Seq)
    }
}

impl Job {
    /// The lane this job belongs to: its endpoint without query or fragment.
    pub fn lane(&self) -> &str {
        lane(&self.endpoint)
    }

    /// The ordered sequence this job belongs to, if any.
    pub fn seq(&self) -> Option<Seq> {
        let ordering = self.ordering.as_ref()?;
        Some(seq_of(&self.bucket, &self.endpoint, &ordering.key))
    }

    /// Its sequence and position in it, if it is ordered.
    pub fn place(&self) -> Option<Place> {
        let ordering = self.ordering.as_ref()?;
        Some(Place {
            seq: seq_of(&self.bucket, &self.endpoint, &ordering.key),
            position: ordering.position,
        })
    }
}

/// Where an ordered job stands: its sequence, and its position in the sequence's order
/// ([`OrderedKey::position`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    /// The sequence.
    pub seq: Seq,
    /// Its position: the sequence's jobs go in position order.
    pub position: Ulid,
}

/// The sequence of (bucket, endpoint, ordering key) (see [`Seq`]).
pub fn seq_of(bucket: &str, endpoint: &str, key: &str) -> Seq {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for part in [bucket, endpoint, key] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut seq = [0u8; 16];
    seq.copy_from_slice(&digest[..16]);
    Seq(seq)
}

/// The delivery queue (lane) of an endpoint URL: the URL without query or fragment; what
/// Directors queue, limit and control by. The dashboard's SQL groups by the same key
/// (`jobdb::stats`), so the two must agree.
pub fn lane(endpoint: &str) -> &str {
    &endpoint[..endpoint.find(['?', '#']).unwrap_or(endpoint.len())]
}

/// The kind of failure, or the reason, recorded in a transition's `error_type`: every value
/// spindle itself writes or compares. The column stays free text (`VARCHAR`: operators' SQL and
/// rows written by older versions may hold anything), so rows read back keep a `String`
/// ([`Transition::error_type`]); what spindle writes comes from here, spelled by
/// [`ErrorType::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorType {
    /// `redirect`: the endpoint answered 3xx (redirects are never followed); discarded for
    /// 301/308, retried for the others.
    Redirect,
    /// `request-timeout`: the endpoint answered 408; retried.
    RequestTimeout,
    /// `rate-limited`: the endpoint answered 425 or 429; retried (`Retry-After` honoured).
    RateLimited,
    /// `client-error`: the endpoint answered another 4xx; discarded.
    ClientError,
    /// `server-error`: the endpoint answered 5xx (or a status outside 2xx–4xx); retried.
    ServerError,
    /// `timeout`: no whole answer within the job's execution timeout; retried.
    Timeout,
    /// `connect`: no connection to the endpoint; retried.
    Connect,
    /// `request`: the request failed otherwise (reset, protocol error, ...); retried.
    Request,
    /// `blocked-address`: the endpoint resolves to an address deliveries may not reach (SSRF
    /// guard); discarded without a request.
    BlockedAddress,
    /// `imported`: the first row of a job imported from a retired JobDB (`awaiting-retry`,
    /// keeping its attempts).
    Imported,
    /// `scheduled`: a job submitted with `deliver_at` or `delay_ms` waits for that time
    /// (`awaiting-retry` with no attempt made, `retry_at` its time); written with the job.
    Scheduled,
    /// `expired`: the job reached its expiry before being delivered (`archiving`).
    Expired,
    /// `interrupted`: an attempt left `executing` by a Director that stopped or crashed,
    /// recorded by the next owner of the JobDB (a Director or a drainer) as `awaiting-retry`.
    Interrupted,
    /// `import-refused`: a live Director refused for good to import a job a drainer moved; it
    /// ends `discarded` in the retired JobDB with the Director's answer.
    ImportRefused,
    /// `move-refused`: a live Director refused to import a job a drainer moved, for a reason
    /// of its own (its size limits, its JobDB server's packet size, an older version), while
    /// a Director of this version could take it: the job stays in the retired JobDB
    /// (`awaiting-retry`, its attempts and next attempt kept, the answer in `error_response`)
    /// and the drainer tries other Directors, then again with backoff.
    MoveRefused,
    /// `max-attempts`: the job's last allowed attempt failed with a retryable error, or it
    /// arrived with its attempts used up; `discarded`.
    MaxAttempts,
    /// `endpoint-recovered`: a circuit breaker closed and made the retries of its outage due
    /// at once (`awaiting-retry` → `awaiting-retry`).
    EndpointRecovered,
    /// `held-back`: an attempt begun (its commit listed it) was withdrawn before its request
    /// was sent, because its endpoint was paused or judged down before the attempt had an HTTP
    /// slot; the row keeps the earlier count of attempts, and the job waits in its queue for
    /// the endpoint to open again (`awaiting-retry`, due now).
    HeldBack,
    /// `operator-expedite`: an operator command made a waiting job due now.
    OperatorExpedite,
    /// `operator-postpone`: an operator command made a waiting job due later.
    OperatorPostpone,
    /// `operator-flush`: an operator command sent a waiting job to the archive (`archiving`).
    OperatorFlush,
    /// `operator-discard`: an operator command ended a waiting job `discarded`.
    OperatorDiscard,
    /// `unknown-subscription`: an event's job whose subscription this Director does not know
    /// (its cache has not seen it yet, or it has no control database), so it cannot be signed
    /// with the subscription's secret: not sent, retried.
    UnknownSubscription,
}

impl ErrorType {
    /// Every variant, in declaration order.
    pub const ALL: [ErrorType; 23] = [
        ErrorType::Redirect,
        ErrorType::RequestTimeout,
        ErrorType::RateLimited,
        ErrorType::ClientError,
        ErrorType::ServerError,
        ErrorType::Timeout,
        ErrorType::Connect,
        ErrorType::Request,
        ErrorType::BlockedAddress,
        ErrorType::Imported,
        ErrorType::Scheduled,
        ErrorType::Expired,
        ErrorType::Interrupted,
        ErrorType::ImportRefused,
        ErrorType::MoveRefused,
        ErrorType::MaxAttempts,
        ErrorType::EndpointRecovered,
        ErrorType::HeldBack,
        ErrorType::OperatorExpedite,
        ErrorType::OperatorPostpone,
        ErrorType::OperatorFlush,
        ErrorType::OperatorDiscard,
        ErrorType::UnknownSubscription,
    ];

    /// The value stored in the `error_type` column.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorType::Redirect => "redirect",
            ErrorType::RequestTimeout => "request-timeout",
            ErrorType::RateLimited => "rate-limited",
            ErrorType::ClientError => "client-error",
            ErrorType::ServerError => "server-error",
            ErrorType::Timeout => "timeout",
            ErrorType::Connect => "connect",
            ErrorType::Request => "request",
            ErrorType::BlockedAddress => "blocked-address",
            ErrorType::Imported => "imported",
            ErrorType::Scheduled => "scheduled",
            ErrorType::Expired => "expired",
            ErrorType::Interrupted => "interrupted",
            ErrorType::ImportRefused => "import-refused",
            ErrorType::MoveRefused => "move-refused",
            ErrorType::MaxAttempts => "max-attempts",
            ErrorType::EndpointRecovered => "endpoint-recovered",
            ErrorType::HeldBack => "held-back",
            ErrorType::OperatorExpedite => "operator-expedite",
            ErrorType::OperatorPostpone => "operator-postpone",
            ErrorType::OperatorFlush => "operator-flush",
            ErrorType::OperatorDiscard => "operator-discard",
            ErrorType::UnknownSubscription => "unknown-subscription",
        }
    }
}

impl fmt::Display for ErrorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ErrorType> for String {
    /// The column value, for the row types' `Option<String>` fields.
    fn from(error_type: ErrorType) -> String {
        error_type.as_str().to_owned()
    }
}

/// An `error_type` value spindle does not write (an operator's, or an older version's).
#[derive(Debug, thiserror::Error)]
#[error("unknown error type {0:?}")]
pub struct UnknownErrorType(pub String);

impl FromStr for ErrorType {
    type Err = UnknownErrorType;

    /// The variant whose [`ErrorType::as_str`] is `s`, exactly.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownErrorType(s.to_owned()))
    }
}

/// One appended row of `job_state_transitions`. Build it with the constructors.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The job this row belongs to.
    pub job_id: JobId,
    /// The state entered.
    pub state: State,
    /// Attempts started so far (0 before the first).
    pub attempts: u16,
    /// When the state was entered.
    pub time: DateTime<Utc>,
    /// When the next attempt is due (awaiting-retry only).
    pub retry_at: Option<DateTime<Utc>>,
    /// The kind of failure that led here, if any: an [`ErrorType`]'s string when spindle wrote
    /// the row; free text in the column, so rows read back may hold other values.
    pub error_type: Option<String>,
    /// The start of the endpoint's answer (or the client error text), truncated.
    pub error_response: Option<Bytes>,
    /// How `error_response` is encoded (`utf-8` or `binary`).
    pub error_response_encoding: Option<&'static str>,
    /// HTTP status of the attempt, when the endpoint answered.
    pub response_status: Option<u16>,
    /// Duration of the attempt in milliseconds.
    pub duration_ms: Option<u32>,
    /// For a row that ends an attempt: the commit that began it, and when it began.
    pub started: Option<AttemptStart>,
}

/// How the store tags an answer's bytes (`error_response_encoding`): `utf-8` when they are
/// UTF-8, else `binary`. The bytes decide, whoever wrote them.
pub fn stored_encoding(body: &[u8]) -> &'static str {
    match std::str::from_utf8(body) {
        Ok(_) => "utf-8",
        Err(_) => "binary",
    }
}

/// The start of an endpoint's answer as text a JSON reader can carry: the text itself when its
/// bytes are UTF-8, else their base64. Every view of a history and the archive write it so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerText {
    /// The bytes were UTF-8: the text.
    Utf8(String),
    /// The bytes, standard base64.
    Base64(String),
}

impl AnswerText {
    /// The text form of `body`.
    pub fn of(body: &[u8]) -> Self {
        use base64::Engine as _;
        match std::str::from_utf8(body) {
            Ok(text) => AnswerText::Utf8(text.to_owned()),
            Err(_) => AnswerText::Base64(base64::engine::general_purpose::STANDARD.encode(body)),
        }
    }

    /// The text and the name of its encoding (`utf-8` or `base64`), as the API writes them.
    pub fn into_parts(self) -> (String, &'static str) {
        match self {
            AnswerText::Utf8(text) => (text, "utf-8"),
            AnswerText::Base64(text) => (text, "base64"),
        }
    }
}

/// Where an attempt began: the Director's commit that allowed it (its `commit_log` row, which
/// lists the attempt) and the time the attempt began. The row that ends the attempt carries it
/// (`started_in`, `started_at`), so the history shows the attempt's start without a row of its
/// own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptStart {
    /// The `commit_log` row (an id of the transition sequence).
    pub commit: u64,
    /// When the attempt began.
    pub at: DateTime<Utc>,
}

/// What an attempt's outcome contributes to its transition row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttemptRecord {
    /// The kind of failure, if it failed: an [`ErrorType`]'s string (`Some(kind.into())`).
    pub error_type: Option<String>,
    /// The start of the answer or the client error.
    pub error_response: Option<Bytes>,
    /// HTTP status, when the endpoint answered.
    pub response_status: Option<u16>,
    /// How long the attempt took.
    pub duration: Option<Duration>,
    /// Where the attempt began.
    pub started: Option<AttemptStart>,
}

impl Transition {
    fn bare(job_id: JobId, state: State, attempts: u16, time: DateTime<Utc>) -> Self {
        Transition {
            job_id,
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

    fn with_attempt(mut self, record: AttemptRecord) -> Self {
        self.error_response_encoding = record.error_response.as_deref().map(stored_encoding);
        self.error_type = record.error_type;
        self.error_response = record.error_response;
        self.response_status = record.response_status;
        self.duration_ms = record
            .duration
            .map(|d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX));
        self.started = record.started;
        self
    }

    /// A job's acceptance, as its history shows it: accepted, not yet attempted. Not stored (a
    /// job's `jobs` row is its acceptance); histories read back begin with it.
    pub fn awaiting_scheduling(job: &Job) -> Self {
        Self::accepted_at(job.id, job.created_at)
    }

    /// [`Transition::awaiting_scheduling`] of the job `job_id` created at `created_at`.
    pub fn accepted_at(job_id: JobId, created_at: DateTime<Utc>) -> Self {
        Self::bare(job_id, State::AwaitingScheduling, 0, created_at)
    }

    /// Attempt number `attempt` (1-based) began, as its history shows it: not stored (the
    /// commit that began it lists it, and the row that ends it names that commit).
    pub fn executing(job_id: JobId, attempt: u16, now: DateTime<Utc>) -> Self {
        Self::bare(job_id, State::Executing, attempt, now)
    }

    /// Attempt `attempt` succeeded.
    pub fn succeeded(job_id: JobId, attempt: u16, now: DateTime<Utc>, rec: AttemptRecord) -> Self {
        Self::bare(job_id, State::Succeeded, attempt, now).with_attempt(rec)
    }

    /// Attempt `attempt` failed permanently.
    pub fn discarded(job_id: JobId, attempt: u16, now: DateTime<Utc>, rec: AttemptRecord) -> Self {
        Self::bare(job_id, State::Discarded, attempt, now).with_attempt(rec)
    }

    /// Attempt `attempt` failed; the next is due at `retry_at`.
    pub fn awaiting_retry(
        job_id: JobId,
        attempt: u16,
        now: DateTime<Utc>,
        retry_at: DateTime<Utc>,
        rec: AttemptRecord,
    ) -> Self {
        let mut t = Self::bare(job_id, State::AwaitingRetry, attempt, now).with_attempt(rec);
        t.retry_at = Some(retry_at);
        t
    }

    /// The first row of a job imported from a retired JobDB: it keeps its attempts and its
    /// next attempt time.
    pub fn imported(
        job_id: JobId,
        attempts: u16,
        now: DateTime<Utc>,
        retry_at: DateTime<Utc>,
    ) -> Self {
        let mut t = Self::bare(job_id, State::AwaitingRetry, attempts, now);
        t.retry_at = Some(retry_at);
        t.error_type = Some(ErrorType::Imported.into());
        t
    }

    /// A submitted job waits until `deliver_at` for its first attempt.
    pub fn scheduled(job_id: JobId, now: DateTime<Utc>, deliver_at: DateTime<Utc>) -> Self {
        let mut t = Self::bare(job_id, State::AwaitingRetry, 0, now);
        t.retry_at = Some(deliver_at);
        t.error_type = Some(ErrorType::Scheduled.into());
        t
    }

    /// A drainer moved the job to another JobDB (named in `job_moves`).
    pub fn moved(job_id: JobId, attempts: u16, now: DateTime<Utc>) -> Self {
        Self::bare(job_id, State::Moved, attempts, now)
    }

    /// The archive confirmed the object holding the job.
    pub fn archived(job_id: JobId, attempts: u16, now: DateTime<Utc>) -> Self {
        Self::bare(job_id, State::Archived, attempts, now)
    }

    /// The job expired before being delivered; it waits for the archive.
    pub fn archiving(job_id: JobId, attempts: u16, now: DateTime<Utc>) -> Self {
        let mut t = Self::bare(job_id, State::Archiving, attempts, now);
        t.error_type = Some(ErrorType::Expired.into());
        t
    }
}

/// A job's whole history from what its JobDB stores: the rows of `job_state_transitions`
/// (`rows`, in id order) with the steps schema 5 no longer writes as rows of their own, each
/// at its place in id order:
/// - its acceptance (`awaiting-scheduling` at `created_at`, id 0), unless its first row is one
///   (an older JobDB stored it) or an import's (`imported`);
/// - each attempt's start (`executing`, with the id and time of the commit that began it)
///   before the row that ends it;
/// - an attempt begun and not ended yet (`under_way`), last.
///
/// The `job_history` view of the JobDB tells the same story in SQL (the conformance suite
/// requires them to agree).
pub fn history(
    job_id: JobId,
    created_at: Option<DateTime<Utc>>,
    rows: Vec<(u64, Transition)>,
    under_way: Option<(AttemptStart, u16)>,
) -> Vec<(u64, Transition)> {
    let mut out = Vec::with_capacity(rows.len() * 2 + 2);
    let begins = rows.first().is_some_and(|(_, t)| {
        t.state == State::AwaitingScheduling
            || t.error_type.as_deref() == Some(ErrorType::Imported.as_str())
    });
    if let (false, Some(at)) = (begins, created_at) {
        out.push((0, Transition::accepted_at(job_id, at)));
    }
    for (id, t) in rows {
        if let Some(start) = t.started {
            out.push((
                start.commit,
                Transition::executing(job_id, t.attempts, start.at),
            ));
        }
        out.push((id, t));
    }
    if let Some((start, attempt)) = under_way {
        out.push((
            start.commit,
            Transition::executing(job_id, attempt, start.at),
        ));
    }
    out
}

/// A job's latest known position, as read back from the JobDB on recovery.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Its last state.
    pub state: State,
    /// Attempts started so far.
    pub attempts: u16,
    /// When the next attempt is due, for awaiting-retry.
    pub retry_at: Option<DateTime<Utc>>,
    /// For `executing`: where the attempt under way began (`None` for one recorded as an
    /// `executing` row, as JobDBs before schema 5 did).
    pub started: Option<AttemptStart>,
}

/// A job recovered from the JobDB after a restart.
#[derive(Debug)]
pub struct Recovered {
    /// The job.
    pub job: Arc<Job>,
    /// Attempts started so far.
    pub attempts: u16,
    /// When its next attempt is due (`None`: now).
    pub retry_at: Option<DateTime<Utc>>,
}

impl Recovered {
    /// The number of the attempt it begins next.
    pub fn next_attempt(&self) -> u16 {
        self.attempts.saturating_add(1)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn job_id_parses_ulid_and_hex_forms() {
        let id = JobId(Ulid::new());
        assert_eq!(id.to_string().parse::<JobId>().unwrap(), id);
        assert_eq!(id.to_hex().parse::<JobId>().unwrap(), id);
        assert_eq!(id.to_hex().to_lowercase().parse::<JobId>().unwrap(), id);
        assert_eq!(JobId::from_bytes(id.to_bytes()), id);
        assert!("nope".parse::<JobId>().is_err());
        assert!("Z".repeat(32).parse::<JobId>().is_err());
    }

    #[test]
    fn error_types_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for kind in ErrorType::ALL {
            assert_eq!(kind.as_str().parse::<ErrorType>().unwrap(), kind);
            assert_eq!(kind.to_string(), kind.as_str());
            assert_eq!(String::from(kind), kind.as_str());
            assert!(seen.insert(kind.as_str()), "{kind:?} spelled twice");
        }
        assert_eq!(ErrorType::MaxAttempts.as_str(), "max-attempts");
        assert_eq!(ErrorType::EndpointRecovered.as_str(), "endpoint-recovered");
        assert_eq!(ErrorType::Interrupted.as_str(), "interrupted");
        assert!("status".parse::<ErrorType>().is_err());
        assert!("Server-Error".parse::<ErrorType>().is_err());
    }

    #[test]
    fn states_round_trip_and_classify() {
        for state in State::ALL {
            assert_eq!(state.as_str().parse::<State>().unwrap(), state);
        }
        let terminal: Vec<_> = State::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(
            terminal,
            vec![
                State::Succeeded,
                State::Discarded,
                State::Archived,
                State::Moved
            ]
        );
        assert!(!State::Moved.is_final());
        assert!(State::AwaitingRetry.may_precede(State::Moved));
        assert!(!State::Executing.may_precede(State::Moved));
        assert!(State::Executing.may_precede(State::AwaitingRetry));
        assert!(!State::Succeeded.may_precede(State::Executing));
        assert!(!State::AwaitingScheduling.may_precede(State::Succeeded));
    }

    #[test]
    fn lane_drops_query_and_fragment() {
        let mut job = sample();
        job.endpoint = "http://h/p?x=1#f".into();
        assert_eq!(job.lane(), "http://h/p");
        job.endpoint = "http://h/p".into();
        assert_eq!(job.lane(), "http://h/p");
    }

    /// A job to test with (unordered, expired now).
    pub(crate) fn sample() -> Job {
        Job {
            id: JobId(Ulid::new()),
            bucket: "b".into(),
            endpoint: "http://h/".into(),
            method: "POST".into(),
            headers: vec![],
            payload: Bytes::new(),
            execution_timeout: Duration::from_secs(1),
            retry: RetryPolicy {
                min_delay: Duration::from_secs(1),
                coefficient: 2.0,
            },
            created_at: Utc::now(),
            expire_at: Utc::now(),
            idempotency_key: None,
            on_complete: None,
            ordering: None,
            event: None,
            trace: None,
        }
    }
}
