//! The archive's format, the same in every backend: the object layout (keys of a batch's data
//! object and manifest, which keys are manifests, which JobDB names can be a key segment), the
//! records ([`ArchivedJob`] and its [`ArchivedTransition`]s, one NDJSON line per job), the
//! [`Manifest`] beside each batch, why a batch left its JobDB ([`BatchKind`]), and the batch
//! encoding (gzip of NDJSON, deterministic: [`encode_batch`], [`decode_batch`]). No I/O.

use std::io::{Read, Write};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use ulid::Ulid;

use super::ArchiveError;
use crate::job::{stored_encoding, AnswerText, Job, JobId, RetryPolicy, State, Transition};

/// Why a batch of jobs left its JobDB: a segment of the batch's object keys and a field of its
/// manifest, and the `kind` of the JobDB's `archive_batches` row that plans it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchKind {
    /// Jobs that expired before delivery (their terminal state is `archived`).
    Expired,
    /// The whole trace of every other job of a drained JobDB (succeeded, discarded, or moved
    /// to another JobDB: see [`ArchivedJob::moved_to`]), kept before the JobDB
    /// is dropped.
    History,
}

impl BatchKind {
    /// The spelling used in the `kind` column, object keys and manifests.
    pub const fn as_str(self) -> &'static str {
        match self {
            BatchKind::Expired => "expired",
            BatchKind::History => "history",
        }
    }
}

impl std::fmt::Display for BatchKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How [`ArchivedTransition::error_response`] is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TextEncoding {
    /// The bytes were valid UTF-8 and are stored as text.
    #[serde(rename = "utf-8")]
    Utf8,
    /// The bytes are stored as standard base64.
    #[serde(rename = "base64")]
    Base64,
}

/// One row of a job's transition history, as stored in the archive.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ArchivedTransition {
    /// The row id in the JobDB's `job_state_transitions` (orders the history).
    pub id: u64,
    /// The state entered.
    pub state: State,
    /// Attempts started so far.
    pub attempts: u16,
    /// When the state was entered.
    pub time: DateTime<Utc>,
    /// When the next attempt was due (awaiting-retry only).
    pub retry_at: Option<DateTime<Utc>>,
    /// The kind of failure that led here, if any.
    pub error_type: Option<String>,
    /// The start of the endpoint's answer, as text or base64 per `error_response_encoding`.
    pub error_response: Option<String>,
    /// How `error_response` is written; set exactly when it is.
    pub error_response_encoding: Option<TextEncoding>,
    /// HTTP status of the attempt, when the endpoint answered.
    pub response_status: Option<u16>,
    /// Duration of the attempt in milliseconds.
    pub duration_ms: Option<u32>,
}

impl ArchivedTransition {
    /// Whether an operator's command wrote it (its `error_response` is the command's note).
    pub fn by_operator(&self) -> bool {
        self.error_type
            .as_deref()
            .is_some_and(|e| e.starts_with("operator-"))
    }

    /// The archived form of transition row `id`.
    pub fn new(id: u64, t: &Transition) -> Self {
        let (error_response, error_response_encoding) =
            match t.error_response.as_deref().map(AnswerText::of) {
                None => (None, None),
                Some(AnswerText::Utf8(text)) => (Some(text), Some(TextEncoding::Utf8)),
                Some(AnswerText::Base64(text)) => (Some(text), Some(TextEncoding::Base64)),
            };
        ArchivedTransition {
            id,
            state: t.state,
            attempts: t.attempts,
            time: t.time,
            retry_at: t.retry_at,
            error_type: t.error_type.clone(),
            error_response,
            error_response_encoding,
            response_status: t.response_status,
            duration_ms: t.duration_ms,
        }
    }

    /// The bytes of `error_response`, decoded.
    pub fn error_response_bytes(&self) -> Result<Option<Bytes>, ArchiveError> {
        match (&self.error_response, self.error_response_encoding) {
            (None, _) => Ok(None),
            (Some(text), Some(TextEncoding::Utf8)) => Ok(Some(Bytes::from(text.clone()))),
            (Some(text), Some(TextEncoding::Base64)) => BASE64
                .decode(text)
                .map(|b| Some(Bytes::from(b)))
                .map_err(|e| {
                    ArchiveError::Corrupt(format!("error_response of row {}: {e}", self.id))
                }),
            (Some(_), None) => Err(ArchiveError::Corrupt(format!(
                "error_response of row {} has no encoding",
                self.id
            ))),
        }
    }

    /// Rebuilds the JobDB row of job `job_id`.
    pub fn to_transition(&self, job_id: JobId) -> Result<Transition, ArchiveError> {
        let error_response = self.error_response_bytes()?;
        let error_response_encoding = error_response.as_deref().map(stored_encoding);
        Ok(Transition {
            job_id,
            state: self.state,
            attempts: self.attempts,
            time: self.time,
            retry_at: self.retry_at,
            error_type: self.error_type.clone(),
            error_response,
            error_response_encoding,
            response_status: self.response_status,
            duration_ms: self.duration_ms,
            // The archive keeps whole histories, attempts' starts as steps of their own.
            started: None,
        })
    }
}

/// One job as stored in the archive: the job row and its full transition history.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ArchivedJob {
    /// The job id as a ULID string.
    pub id: String,
    /// The isolation key.
    pub bucket: String,
    /// The URL the payload was sent to.
    pub endpoint: String,
    /// HTTP method, upper case.
    pub method: String,
    /// Request headers as `[name, value]` pairs, in the order given.
    pub headers: Vec<(String, String)>,
    /// The request body, standard base64 (payloads may be binary).
    pub payload: String,
    /// Deadline of one attempt, in milliseconds.
    pub execution_timeout_ms: u64,
    /// Delay before the second attempt, in milliseconds.
    pub backoff_min_delay_ms: u64,
    /// Growth factor of the retry delay.
    pub backoff_coefficient: f64,
    /// When the job was accepted.
    pub created_at: DateTime<Utc>,
    /// When the job stopped being retried.
    pub expire_at: DateTime<Utc>,
    /// The producer's idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// The URL told when the job ended, if any (absent in objects written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_complete: Option<String>,
    /// Its ordering key, if any (absent in objects written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// Whether its unsuccessful end blocked its key's later jobs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ordering_blocks: bool,
    /// The event it delivered, if an event's subscription made it (absent before events
    /// existed, and for other jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<spindle_client::EventLink>,
    /// The W3C `traceparent` it was submitted in, if any (absent before traces existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The `tracestate` that went with it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// The whole history, ordered by row id.
    pub transitions: Vec<ArchivedTransition>,
    /// For a [`BatchKind::History`] batch, the JobDB the job now lives in.
    pub moved_to: Option<String>,
    /// When `spindle erase` removed its payload, headers and answer bodies (absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erased_at: Option<DateTime<Utc>>,
}

impl ArchivedJob {
    /// The archived form of `job` with its history `(row id, transition)`, in any order (it is
    /// sorted by row id). Every transition must belong to `job`.
    pub fn new(job: &Job, transitions: &[(u64, Transition)], moved_to: Option<String>) -> Self {
        debug_assert!(transitions.iter().all(|(_, t)| t.job_id == job.id));
        let mut history: Vec<ArchivedTransition> = transitions
            .iter()
            .map(|(id, t)| ArchivedTransition::new(*id, t))
            .collect();
        history.sort_by_key(|t| t.id);
        let (traceparent, tracestate) = crate::telemetry::TraceContext::fields(job.trace.as_ref());
        ArchivedJob {
            id: job.id.to_string(),
            bucket: job.bucket.to_string(),
            endpoint: job.endpoint.to_string(),
            method: job.method.to_string(),
            headers: job.headers.clone(),
            payload: BASE64.encode(&job.payload),
            execution_timeout_ms: millis(job.execution_timeout),
            backoff_min_delay_ms: millis(job.retry.min_delay),
            backoff_coefficient: job.retry.coefficient,
            created_at: job.created_at,
            expire_at: job.expire_at,
            idempotency_key: job.idempotency_key.clone(),
            on_complete: job.on_complete.as_deref().map(str::to_owned),
            ordering_key: job.ordering.as_ref().map(|o| o.key.to_string()),
            ordering_blocks: job.ordering.as_ref().is_some_and(|o| o.blocks),
            event: job.event.as_ref().map(crate::job::EventLink::to_wire),
            traceparent,
            tracestate,
            transitions: history,
            moved_to,
            erased_at: None,
        }
    }

    /// The job id, parsed.
    pub fn job_id(&self) -> Result<JobId, ArchiveError> {
        self.id
            .parse()
            .map_err(|_| ArchiveError::Corrupt(format!("job id {:?} is not a ULID", self.id)))
    }

    /// Whether it holds anything [`ArchivedJob::erase`] removes (a job archived after its
    /// JobDB erased it holds nothing, though it is not marked).
    pub fn holds_bytes(&self) -> bool {
        !self.payload.is_empty()
            || !self.headers.is_empty()
            || self
                .transitions
                .iter()
                .any(|t| !t.by_operator() && t.error_response.is_some())
    }

    /// Removes the payload, headers and every answer body (or error text), keeping ids,
    /// times, states and the notes of operator commands, and marks the job erased at `now`.
    pub fn erase(&mut self, now: DateTime<Utc>) {
        self.payload.clear();
        self.headers.clear();
        for t in self.transitions.iter_mut().filter(|t| !t.by_operator()) {
            t.error_response = None;
            t.error_response_encoding = None;
        }
        self.erased_at = Some(now);
    }

    /// The state of the last transition (as State), if any.
    pub fn last_state(&self) -> Option<State> {
        self.transitions.last().map(|t| t.state)
    }

    /// The payload, decoded.
    pub fn payload_bytes(&self) -> Result<Bytes, ArchiveError> {
        BASE64
            .decode(&self.payload)
            .map(Bytes::from)
            .map_err(|e| ArchiveError::Corrupt(format!("payload of job {}: {e}", self.id)))
    }

    /// Rebuilds the job (durations at millisecond precision, as the JobDB stores them).
    pub fn to_job(&self) -> Result<Job, ArchiveError> {
        let id = self.job_id()?;
        Ok(Job {
            id,
            bucket: self.bucket.as_str().into(),
            endpoint: self.endpoint.as_str().into(),
            method: self.method.as_str().into(),
            headers: self.headers.clone(),
            payload: self.payload_bytes()?,
            execution_timeout: Duration::from_millis(self.execution_timeout_ms),
            retry: RetryPolicy {
                min_delay: Duration::from_millis(self.backoff_min_delay_ms),
                coefficient: self.backoff_coefficient,
            },
            created_at: self.created_at,
            expire_at: self.expire_at,
            idempotency_key: self.idempotency_key.clone(),
            on_complete: self.on_complete.as_deref().map(Into::into),
            ordering: self
                .ordering_key
                .as_deref()
                // An archived job has ended: its place in its key's order is over, and the
                // archive does not keep it (an object's bytes stay what they were).
                .map(|key| crate::job::OrderedKey {
                    key: key.into(),
                    blocks: self.ordering_blocks,
                    position: id.0,
                }),
            event: self
                .event
                .as_ref()
                .map(crate::job::EventLink::from_wire)
                .transpose()
                .map_err(|(field, message)| {
                    ArchiveError::Corrupt(format!("job {}: event.{field} {message}", self.id))
                })?,
            trace: match &self.traceparent {
                Some(parent) => Some(
                    crate::telemetry::TraceContext::parse(parent, self.tracestate.as_deref())
                        .map_err(|e| ArchiveError::Corrupt(format!("job {}: {e}", self.id)))?,
                ),
                None => None,
            },
        })
    }

    /// Rebuilds the history as `(row id, transition)` pairs.
    pub fn to_transitions(&self) -> Result<Vec<(u64, Transition)>, ArchiveError> {
        let id = self.job_id()?;
        self.transitions
            .iter()
            .map(|t| Ok((t.id, t.to_transition(id)?)))
            .collect()
    }
}

/// A [`Duration`] in whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The manifest written beside each batch object.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// The batch id (ULID), chosen by the caller.
    pub batch: String,
    /// The JobDB the jobs came from.
    pub jobdb: String,
    /// Why the jobs left it.
    pub kind: BatchKind,
    /// Key of the data object.
    pub object_key: String,
    /// Number of jobs in the batch.
    pub jobs: u64,
    /// Every job id (ULID strings), in the order of the data object's lines.
    pub job_ids: Vec<String>,
    /// Size of the data object (gzip).
    pub compressed_bytes: u64,
    /// Size of the NDJSON before compression.
    pub uncompressed_bytes: u64,
    /// Lower-case hex SHA-256 of the data object as stored.
    pub sha256: String,
    /// When the batch was made: the batch ULID's timestamp, so rewriting a batch is byte-identical.
    pub created_at: DateTime<Utc>,
}

/// A batch encoded for storage: gzip of NDJSON.
#[derive(Clone, Debug, PartialEq)]
pub struct EncodedBatch {
    /// The gzip bytes.
    pub data: Bytes,
    /// Size of the NDJSON before compression.
    pub uncompressed_bytes: u64,
    /// Lower-case hex SHA-256 of `data`.
    pub sha256: String,
}

/// Encodes jobs as gzip NDJSON, one job per line. Deterministic: the same jobs give the same
/// bytes (fixed gzip header with mtime 0, fixed compression level).
pub fn encode_batch(jobs: &[ArchivedJob]) -> Result<EncodedBatch, ArchiveError> {
    let mut ndjson = Vec::new();
    for job in jobs {
        // serde_json writes a NaN or infinite float as `null`, which would not read back.
        if !job.backoff_coefficient.is_finite() {
            return Err(ArchiveError::Rejected(format!(
                "job {}: backoff_coefficient is not a finite number",
                job.id
            )));
        }
        serde_json::to_writer(&mut ndjson, job)
            .map_err(|e| ArchiveError::Rejected(format!("job {}: {e}", job.id)))?;
        ndjson.push(b'\n');
    }
    gzip(ndjson)
}

/// Encodes a JobDB's kept events (events that made no job) as gzip NDJSON, one
/// [`KeptEvent`](spindle_client::KeptEvent) per line (the import's wire form).
pub fn encode_events(events: &[spindle_client::KeptEvent]) -> Result<EncodedBatch, ArchiveError> {
    let mut ndjson = Vec::new();
    for event in events {
        serde_json::to_writer(&mut ndjson, event)
            .map_err(|e| ArchiveError::Rejected(format!("event {}: {e}", event.event_id)))?;
        ndjson.push(b'\n');
    }
    gzip(ndjson)
}

/// Decodes an object [`encode_events`] wrote.
pub fn decode_events(data: &[u8]) -> Result<Vec<spindle_client::KeptEvent>, ArchiveError> {
    gunzip_lines(data)
}

/// Gzip (mtime 0, so the same lines give the same bytes) of NDJSON, with its SHA-256.
fn gzip(ndjson: Vec<u8>) -> Result<EncodedBatch, ArchiveError> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail; the errors are mapped only to avoid a panic path.
    encoder
        .write_all(&ndjson)
        .map_err(|e| ArchiveError::Rejected(format!("gzip: {e}")))?;
    let data = encoder
        .finish()
        .map_err(|e| ArchiveError::Rejected(format!("gzip: {e}")))?;
    Ok(EncodedBatch {
        sha256: sha256_hex(&data),
        uncompressed_bytes: ndjson.len() as u64,
        data: Bytes::from(data),
    })
}

/// Decodes a data object written by [`encode_batch`].
pub fn decode_batch(data: &[u8]) -> Result<Vec<ArchivedJob>, ArchiveError> {
    gunzip_lines(data)
}

/// The records of gzip NDJSON, one per non-empty line.
fn gunzip_lines<T: serde::de::DeserializeOwned>(data: &[u8]) -> Result<Vec<T>, ArchiveError> {
    let mut ndjson = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut ndjson)
        .map_err(|e| ArchiveError::Corrupt(format!("gunzip: {e}")))?;
    ndjson
        .split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(n, line)| {
            serde_json::from_slice(line)
                .map_err(|e| ArchiveError::Corrupt(format!("line {}: {e}", n + 1)))
        })
        .collect()
}

/// The lower-case hex SHA-256 of `data`, as manifests and object metadata hold it.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(data);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// A key prefix with a `/` appended when missing (and not empty).
pub(super) fn normalized_prefix(prefix: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('/') {
        prefix.to_owned()
    } else {
        format!("{prefix}/")
    }
}

/// Key of a batch's data object: `{prefix}{jobdb}/{kind}/{batch}.ndjson.gz` (`prefix`
/// normalized).
pub(super) fn object_key(prefix: &str, jobdb: &str, kind: BatchKind, batch: Ulid) -> String {
    format!("{prefix}{jobdb}/{kind}/{batch}.ndjson.gz")
}

/// Key of an object of a JobDB's kept events: `{prefix}{jobdb}/events/{first}.ndjson.gz`, named
/// by its first event's id (`prefix` normalized).
pub(super) fn events_key(prefix: &str, jobdb: &str, first: Ulid) -> String {
    format!("{prefix}{jobdb}/events/{first}.ndjson.gz")
}

/// Whether `key` has the shape of [`events_key`].
pub(super) fn is_events_key(prefix: &str, key: &str) -> bool {
    let Some(rest) = key.strip_prefix(prefix) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let [jobdb, "events", file] = parts.as_slice() else {
        return false;
    };
    !jobdb.is_empty()
        && file
            .strip_suffix(".ndjson.gz")
            .is_some_and(|first| Ulid::from_string(first).is_ok())
}

/// Key of a batch's manifest: `{prefix}{jobdb}/{kind}/{batch}.manifest.json` (`prefix`
/// normalized).
pub(super) fn manifest_key(prefix: &str, jobdb: &str, kind: BatchKind, batch: Ulid) -> String {
    format!("{prefix}{jobdb}/{kind}/{batch}.manifest.json")
}

/// Whether `key` has the shape `{prefix}{jobdb}/{kind}/{ulid}.manifest.json`, so foreign
/// objects sharing the prefix are ignored.
pub(super) fn is_manifest_key(prefix: &str, key: &str) -> bool {
    let Some(rest) = key.strip_prefix(prefix) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let [jobdb, kind, file] = parts.as_slice() else {
        return false;
    };
    !jobdb.is_empty()
        && (*kind == BatchKind::Expired.as_str() || *kind == BatchKind::History.as_str())
        && file
            .strip_suffix(".manifest.json")
            .is_some_and(|batch| Ulid::from_string(batch).is_ok())
}

/// A JobDB name becomes one key segment: it must be non-empty, without `/` or control chars.
pub(super) fn check_jobdb_name(jobdb: &str) -> Result<(), ArchiveError> {
    if jobdb.is_empty() || jobdb.contains('/') || jobdb.chars().any(char::is_control) {
        return Err(ArchiveError::Rejected(format!(
            "jobdb name {jobdb:?} cannot be a key segment"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::AttemptRecord;

    fn sample_job(payload: &[u8]) -> Job {
        let created = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.123456789Z")
            .unwrap()
            .with_timezone(&Utc);
        Job {
            id: JobId(Ulid::new()),
            bucket: "tenant-1".into(),
            endpoint: "https://example.test/hook?x=1".into(),
            method: "POST".into(),
            headers: vec![
                ("content-type".into(), "application/octet-stream".into()),
                ("x-trace".into(), "a\"b".into()),
            ],
            payload: Bytes::copy_from_slice(payload),
            execution_timeout: Duration::from_millis(2_500),
            retry: RetryPolicy {
                min_delay: Duration::from_millis(250),
                coefficient: 1.7,
            },
            created_at: created,
            expire_at: created + chrono::Duration::hours(1),
            idempotency_key: Some("key-1".into()),
            on_complete: None,
            ordering: None,
            event: None,
            trace: crate::telemetry::TraceContext::parse(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Some("congo=t61rcWkgMzE"),
            )
            .ok(),
        }
    }

    fn sample_history(job: &Job) -> Vec<(u64, Transition)> {
        let t = job.created_at;
        vec![
            (11, Transition::awaiting_scheduling(job)),
            (12, Transition::executing(job.id, 1, t)),
            (
                13,
                Transition::awaiting_retry(
                    job.id,
                    1,
                    t,
                    t + chrono::Duration::seconds(1),
                    AttemptRecord {
                        error_type: Some("status".into()),
                        error_response: Some(Bytes::from_static(&[0xff, 0x00, 0xfe])),
                        response_status: Some(503),
                        duration: Some(Duration::from_millis(12)),
                        started: None,
                    },
                ),
            ),
            (14, Transition::executing(job.id, 2, t)),
            (
                15,
                Transition::awaiting_retry(
                    job.id,
                    2,
                    t,
                    t + chrono::Duration::seconds(2),
                    AttemptRecord {
                        error_type: Some("status".into()),
                        error_response: Some(Bytes::from_static("busy ✓".as_bytes())),
                        response_status: Some(429),
                        duration: Some(Duration::from_millis(7)),
                        started: None,
                    },
                ),
            ),
            (16, Transition::archiving(job.id, 2, t)),
        ]
    }

    #[test]
    fn archived_job_round_trips_through_json_and_back_to_the_job() {
        let job = sample_job(&[0, 1, 2, 0xff, b'\n', b'"']);
        let mut history = sample_history(&job);
        let expected_history = history.clone();
        history.reverse(); // any order in, row-id order out
        let archived = ArchivedJob::new(&job, &history, Some("jobdb_7".into()));

        let json = serde_json::to_string(&archived).unwrap();
        assert!(!json.contains('\n'), "one job must be one NDJSON line");
        let back: ArchivedJob = serde_json::from_str(&json).unwrap();
        assert_eq!(back, archived);

        assert_eq!(back.job_id().unwrap(), job.id);
        assert_eq!(back.to_job().unwrap(), job);
        assert_eq!(back.to_transitions().unwrap(), expected_history);
        assert_eq!(back.last_state(), Some(State::Archiving));
        assert_eq!(back.moved_to.as_deref(), Some("jobdb_7"));

        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["transitions"][0]["state"], "awaiting-scheduling");
        assert_eq!(value["transitions"][2]["error_response_encoding"], "base64");
        assert_eq!(value["transitions"][4]["error_response"], "busy ✓");
        assert_eq!(value["transitions"][4]["error_response_encoding"], "utf-8");
        assert_eq!(value["headers"][1], serde_json::json!(["x-trace", "a\"b"]));
    }

    #[test]
    fn an_erased_job_keeps_its_story_and_operator_notes_and_nothing_else() {
        let job = sample_job(b"secret");
        let mut history = sample_history(&job);
        let mut note = Transition::archiving(job.id, 2, job.created_at);
        note.error_type = Some("operator-flush".into());
        note.error_response = Some(Bytes::from_static(b"command 7 by ops: erased"));
        note.error_response_encoding = Some("utf-8");
        history.push((17, note));
        let mut archived = ArchivedJob::new(&job, &history, None);
        assert!(archived.holds_bytes());
        let at = job.created_at + chrono::Duration::hours(1);
        archived.erase(at);
        assert!(!archived.holds_bytes());
        assert!(archived.payload.is_empty() && archived.headers.is_empty());
        assert_eq!(archived.erased_at, Some(at));
        assert_eq!(
            archived.transitions.len(),
            history.len(),
            "every step stays"
        );
        let with_bodies: Vec<_> = archived
            .transitions
            .iter()
            .filter(|t| t.error_response.is_some())
            .map(|t| t.id)
            .collect();
        assert_eq!(with_bodies, vec![17], "only the operator's note is left");
        let json = serde_json::to_string(&archived).unwrap();
        assert!(!json.contains("secret") && !json.contains("busy"));
        let back: ArchivedJob = serde_json::from_str(&json).unwrap();
        assert_eq!(back, archived, "the mark survives the archive's encoding");
    }

    #[test]
    fn a_job_without_history_has_no_last_state() {
        let job = sample_job(b"");
        let archived = ArchivedJob::new(&job, &[], None);
        assert_eq!(archived.last_state(), None);
        assert_eq!(archived.payload_bytes().unwrap(), Bytes::new());
    }

    #[test]
    fn gzip_encoding_is_deterministic_and_decodes() {
        let jobs: Vec<ArchivedJob> = (0..50u8)
            .map(|i| {
                let job = sample_job(&[i; 40]);
                ArchivedJob::new(&job, &sample_history(&job), None)
            })
            .collect();
        let first = encode_batch(&jobs).unwrap();
        let second = encode_batch(&jobs).unwrap();
        assert_eq!(first, second);
        // gzip header: magic, deflate, no flags, mtime 0.
        assert_eq!(&first.data[..8], &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0]);
        assert_eq!(first.sha256, sha256_hex(&first.data));
        assert_eq!(first.sha256.len(), 64);
        assert_eq!(decode_batch(&first.data).unwrap(), jobs);
    }

    #[test]
    fn corrupt_objects_are_reported_as_corrupt() {
        assert!(matches!(
            decode_batch(b"not gzip"),
            Err(ArchiveError::Corrupt(_))
        ));
        let mut encoder = flate2::GzBuilder::new().write(Vec::new(), flate2::Compression::fast());
        encoder.write_all(b"{\"id\":1}\n").unwrap();
        let data = encoder.finish().unwrap();
        let err = decode_batch(&data).unwrap_err();
        assert!(matches!(err, ArchiveError::Corrupt(_)) && !err.is_transient());
    }

    #[test]
    fn a_non_finite_coefficient_is_rejected_before_upload() {
        let mut job = sample_job(b"x");
        job.retry.coefficient = f64::NAN;
        let err = encode_batch(&[ArchivedJob::new(&job, &[], None)]).unwrap_err();
        assert!(matches!(err, ArchiveError::Rejected(_)));
    }
}
