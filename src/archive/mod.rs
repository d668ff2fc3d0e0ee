//! The archive: jobs that leave a JobDB for good, stored as compressed batches in S3 or, for a
//! single-machine setup, in a local directory with the same object layout ([`ArchiveConfig`]).
//!
//! # Design
//! - A batch is one object, `{prefix}{jobdb}/{kind}/{batch}.ndjson.gz`: gzip of NDJSON, one
//!   [`ArchivedJob`] (the job row and its whole transition history) per line. Beside it sits
//!   `{prefix}{jobdb}/{kind}/{batch}.manifest.json`, a [`Manifest`] naming the jobs, the sizes and
//!   the SHA-256 of the data object. Both are readable with nothing but `aws s3 cp`, `gunzip`
//!   and `jq`.
//! - The manifest is written after the data object, so a manifest means a complete batch. A
//!   caller deletes jobs from its JobDB only after [`Archive::put_batch`] returned `Ok`, which it
//!   does once both objects are read back (HEAD) with the expected length and checksum.
//! - Writing is idempotent and deterministic: the same batch id and the same jobs give the same
//!   keys and byte-identical objects (gzip with mtime 0; the manifest's time is the batch ULID's),
//!   so a caller that crashed between the upload and its own commit can simply write again.
//! - Errors are classified for the caller's retry decision: [`ArchiveError::is_transient`].
//!   Every S3 operation is bounded by [`S3Config::timeout`], so a dead store cannot hang a drainer.
//!
//! # Backends
//! [`Archive`] hides where objects live: an S3-compatible bucket ([`S3Config`]), or a local
//! directory ([`DirConfig`]) where the object with key `K` is the file `root/bucket/K`, written
//! atomically (temp file, fsync, rename, fsync of the directory) and read back before a write
//! is confirmed (see the `dir` module). Keys, bytes, listing order, idempotent rewrites, the
//! manifest-after-data order and the error kinds are the same for both; only the directory has
//! no object metadata (the data object's SHA-256 is in its manifest).
//!
//! This module does no SQL: selecting jobs and deleting them after a successful write belong to
//! the JobDB code and the drainer.

pub mod archiver;
mod dir;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{BucketLocationConstraint, CreateBucketConfiguration};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use ulid::Ulid;

use crate::job::{Job, JobId, RetryPolicy, State, Transition};

/// The object-metadata key (sent as `x-amz-meta-sha256`) holding the hex SHA-256 of an object.
const SHA256_METADATA: &str = "sha256";

/// How many manifests [`Archive::manifests`] downloads at once.
const MANIFEST_FETCH_CONCURRENCY: usize = 8;

/// Where and how to reach the S3-compatible store. Its `Debug` output hides the secret.
#[derive(Clone)]
pub struct S3Config {
    /// The store's URL, e.g. `http://127.0.0.1:9000`; `None` uses AWS's own endpoints.
    pub endpoint: Option<String>,
    /// The signing region (default `us-east-1`); also the region a created bucket is placed in.
    pub region: String,
    /// The bucket holding the archive.
    pub bucket: String,
    /// Key prefix, e.g. `spindle/` (default empty). A `/` is appended when missing.
    pub prefix: String,
    /// Address buckets as `endpoint/bucket/key` rather than `bucket.endpoint/key` (default
    /// false; most self-hosted stores need true).
    pub path_style: bool,
    /// Static access key; `None` (the default) uses the standard AWS credential chain
    /// (environment, profile, web identity, container, instance metadata).
    pub access_key_id: Option<String>,
    /// The secret of `access_key_id`; both or neither must be set.
    pub secret_access_key: Option<String>,
    /// Create the bucket at connect if it is missing (default false; for tests and dev).
    pub create_bucket: bool,
    /// Deadline of one whole S3 operation, retries included (default 10 s), so a stopped
    /// server cannot hang us.
    pub timeout: Duration,
}

impl S3Config {
    /// A configuration for `bucket` with the defaults documented on each field.
    pub fn new(bucket: impl Into<String>) -> Self {
        S3Config {
            endpoint: None,
            region: "us-east-1".to_owned(),
            bucket: bucket.into(),
            prefix: String::new(),
            path_style: false,
            access_key_id: None,
            secret_access_key: None,
            create_bucket: false,
            timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Configs end up in start-up logs; the secret must not.
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("path_style", &self.path_style)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("create_bucket", &self.create_bucket)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A local directory holding the archive with the S3 object layout: the object with key `K` is
/// the file `root/bucket/K`. For a single machine (`spindle dev`, `--archive-dir`).
#[derive(Clone, Debug)]
pub struct DirConfig {
    /// The directory holding bucket directories.
    pub root: PathBuf,
    /// The bucket: the directory below `root` holding the objects (default
    /// [`DirConfig::DEFAULT_BUCKET`]).
    pub bucket: String,
    /// Key prefix, e.g. `spindle/` (default empty). A `/` is appended when missing.
    pub prefix: String,
    /// Create `root/bucket` at open if it is missing (default true). Without it, a missing
    /// bucket directory fails every operation as a missing S3 bucket does.
    pub create_bucket: bool,
    /// Deadline of one whole operation (default 10 s), so a hung file system cannot hang us.
    pub timeout: Duration,
}

impl DirConfig {
    /// The bucket directory's name when none is configured.
    pub const DEFAULT_BUCKET: &'static str = "spindle-archive";

    /// A configuration for the directory `root` with the defaults documented on each field.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirConfig {
            root: root.into(),
            bucket: Self::DEFAULT_BUCKET.to_owned(),
            prefix: String::new(),
            create_bucket: true,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Where the archive lives: an S3 bucket or a local directory.
#[derive(Clone, Debug)]
pub enum ArchiveConfig {
    /// An S3-compatible store.
    S3(S3Config),
    /// A local directory with the same object layout.
    Dir(DirConfig),
}

impl From<S3Config> for ArchiveConfig {
    fn from(config: S3Config) -> Self {
        ArchiveConfig::S3(config)
    }
}

impl From<DirConfig> for ArchiveConfig {
    fn from(config: DirConfig) -> Self {
        ArchiveConfig::Dir(config)
    }
}

/// Why a batch of jobs left its JobDB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchKind {
    /// Jobs that expired before delivery (their terminal state is `archived`).
    Expired,
    /// The whole trace of every other job of a drained JobDB (succeeded, discarded, or moved
    /// to another JobDB: see [`ArchivedJob::moved_to`]), kept before the JobDB is dropped.
    History,
}

impl BatchKind {
    /// The spelling used in object keys and manifests.
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

/// What went wrong talking to the archive, classified for the caller's retry decision.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Network error, timeout, throttling or a 5xx (for a directory: a timeout, a full disk,
    /// an I/O error): the same call may succeed later.
    #[error("archive unavailable: {0}")]
    Unavailable(String),
    /// A 4xx or a configuration or input error (for a directory: a missing bucket directory,
    /// a permission or path error): retrying the same call will not help.
    #[error("archive rejected the request: {0}")]
    Rejected(String),
    /// An object could not be decoded, or does not match its size or checksum.
    #[error("corrupt archive object: {0}")]
    Corrupt(String),
}

impl ArchiveError {
    /// Whether retrying later may succeed (only [`ArchiveError::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, ArchiveError::Unavailable(_))
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
    /// The archived form of transition row `id`.
    pub fn new(id: u64, t: &Transition) -> Self {
        let (error_response, error_response_encoding) = match &t.error_response {
            None => (None, None),
            Some(body) => match std::str::from_utf8(body) {
                Ok(text) => (Some(text.to_owned()), Some(TextEncoding::Utf8)),
                Err(_) => (Some(BASE64.encode(body)), Some(TextEncoding::Base64)),
            },
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
        // Same rule as `Transition`'s own constructors: the bytes decide the encoding.
        let error_response_encoding = error_response.as_ref().map(|body| {
            if std::str::from_utf8(body).is_ok() {
                "utf-8"
            } else {
                "binary"
            }
        });
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
    /// The whole history, ordered by row id.
    pub transitions: Vec<ArchivedTransition>,
    /// For a [`BatchKind::History`] batch, the JobDB the job now lives in.
    pub moved_to: Option<String>,
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
            transitions: history,
            moved_to,
        }
    }

    /// The job id, parsed.
    pub fn job_id(&self) -> Result<JobId, ArchiveError> {
        self.id
            .parse()
            .map_err(|_| ArchiveError::Corrupt(format!("job id {:?} is not a ULID", self.id)))
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
        Ok(Job {
            id: self.job_id()?,
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

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(data);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// A handle on the archive bucket (S3 or a local directory). Cheap to clone; clones share
/// connections.
#[derive(Clone, Debug)]
pub struct Archive {
    backend: Backend,
    bucket: Arc<str>,
    prefix: Arc<str>,
    timeout: Duration,
}

/// Where the objects are: the only place the two engines differ.
#[derive(Clone, Debug)]
enum Backend {
    S3(aws_sdk_s3::Client),
    Dir(dir::DirStore),
}

/// A key prefix with a `/` appended when missing (and not empty).
fn normalized_prefix(prefix: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('/') {
        prefix.to_owned()
    } else {
        format!("{prefix}/")
    }
}

impl Archive {
    /// Opens the archive `config` describes: [`Archive::connect`] or [`Archive::open_dir`].
    pub async fn open(config: &ArchiveConfig) -> Result<Archive, ArchiveError> {
        match config {
            ArchiveConfig::S3(s3) => Archive::connect(s3).await,
            ArchiveConfig::Dir(dir) => Archive::open_dir(dir).await,
        }
    }

    /// Opens an archive in a local directory, creating the bucket directory when it is missing
    /// and `config.create_bucket` is set.
    pub async fn open_dir(config: &DirConfig) -> Result<Archive, ArchiveError> {
        if config.timeout.is_zero() {
            return Err(ArchiveError::Rejected(
                "the archive timeout is zero".to_owned(),
            ));
        }
        let prefix = normalized_prefix(&config.prefix);
        if !prefix.is_empty() {
            // The prefix becomes directories: it must be a valid key on its own.
            dir::check_prefix(&prefix)?;
        }
        let store = dir::DirStore::open(
            &config.root,
            &config.bucket,
            config.create_bucket,
            config.timeout,
        )
        .await?;
        Ok(Archive {
            backend: Backend::Dir(store),
            bucket: config.bucket.as_str().into(),
            prefix: prefix.into(),
            timeout: config.timeout,
        })
    }

    /// Builds the S3 client. Makes no request unless `config.create_bucket` is set, in which
    /// case the bucket is created when HeadBucket says it is missing.
    pub async fn connect(config: &S3Config) -> Result<Archive, ArchiveError> {
        if config.bucket.is_empty() {
            return Err(ArchiveError::Rejected("no bucket configured".to_owned()));
        }
        if config.timeout.is_zero() {
            return Err(ArchiveError::Rejected("the s3 timeout is zero".to_owned()));
        }
        // One TLS stack for the whole binary: rustls on ring, as reqwest uses.
        let http_client = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let timeouts = TimeoutConfig::builder()
            .operation_timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(3)))
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()))
            .http_client(http_client)
            .timeout_config(timeouts);
        match (&config.access_key_id, &config.secret_access_key) {
            (Some(id), Some(secret)) => {
                loader = loader.credentials_provider(Credentials::new(
                    id.clone(),
                    secret.clone(),
                    None,
                    None,
                    "spindle-config",
                ));
            }
            (None, None) => {}
            _ => {
                return Err(ArchiveError::Rejected(
                    "set both the s3 access key id and secret, or neither".to_owned(),
                ))
            }
        }
        let shared = loader.load().await;
        let mut s3 = aws_sdk_s3::config::Builder::from(&shared).force_path_style(config.path_style);
        if let Some(endpoint) = &config.endpoint {
            s3 = s3.endpoint_url(endpoint.clone());
        }
        let client = aws_sdk_s3::Client::from_conf(s3.build());
        if config.create_bucket {
            ensure_bucket(&client, &config.bucket, &config.region).await?;
        }
        Ok(Archive {
            backend: Backend::S3(client),
            bucket: config.bucket.as_str().into(),
            prefix: normalized_prefix(&config.prefix).into(),
            timeout: config.timeout,
        })
    }

    /// The bucket this archive writes to (for a directory: the bucket directory's name).
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Where the objects are, for logs: `s3://bucket/prefix` or the bucket directory's path
    /// with the prefix.
    pub fn location(&self) -> String {
        match &self.backend {
            Backend::S3(_) => format!("s3://{}/{}", self.bucket, self.prefix),
            Backend::Dir(store) => format!("{}/{}", store.bucket_dir().display(), self.prefix),
        }
    }

    /// Key of a batch's data object: `{prefix}{jobdb}/{kind}/{batch}.ndjson.gz`.
    pub fn object_key(&self, jobdb: &str, kind: BatchKind, batch: Ulid) -> String {
        format!("{}{jobdb}/{kind}/{batch}.ndjson.gz", self.prefix)
    }

    /// Key of a batch's manifest: `{prefix}{jobdb}/{kind}/{batch}.manifest.json`.
    pub fn manifest_key(&self, jobdb: &str, kind: BatchKind, batch: Ulid) -> String {
        format!("{}{jobdb}/{kind}/{batch}.manifest.json", self.prefix)
    }

    /// Writes one batch: gzip NDJSON (one [`ArchivedJob`] per line) then the manifest, and
    /// returns only after both are confirmed stored (HEAD answers the expected length and the
    /// `x-amz-meta-sha256` we set). Idempotent and deterministic: writing the same batch id with
    /// the same jobs again overwrites the same keys with byte-identical content. Writing other
    /// jobs under a batch id already used replaces that batch: callers use fresh ids.
    pub async fn put_batch(
        &self,
        jobdb: &str,
        kind: BatchKind,
        batch: Ulid,
        jobs: &[ArchivedJob],
    ) -> Result<Manifest, ArchiveError> {
        check_jobdb_name(jobdb)?;
        if jobs.is_empty() {
            return Err(ArchiveError::Rejected(format!(
                "batch {batch} of {jobdb} has no jobs"
            )));
        }
        let encoded = encode_batch(jobs)?;
        let object_key = self.object_key(jobdb, kind, batch);
        let manifest = Manifest {
            batch: batch.to_string(),
            jobdb: jobdb.to_owned(),
            kind,
            object_key: object_key.clone(),
            jobs: jobs.len() as u64,
            job_ids: jobs.iter().map(|j| j.id.clone()).collect(),
            compressed_bytes: encoded.data.len() as u64,
            uncompressed_bytes: encoded.uncompressed_bytes,
            sha256: encoded.sha256.clone(),
            created_at: DateTime::<Utc>::from(batch.datetime()),
        };
        self.put_verified(
            &object_key,
            encoded.data,
            &encoded.sha256,
            "application/gzip",
        )
        .await?;
        let manifest_json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| ArchiveError::Rejected(format!("manifest of batch {batch}: {e}")))?;
        let manifest_sha = sha256_hex(&manifest_json);
        self.put_verified(
            &self.manifest_key(jobdb, kind, batch),
            Bytes::from(manifest_json),
            &manifest_sha,
            "application/json",
        )
        .await?;
        tracing::debug!(
            jobdb,
            %kind,
            %batch,
            jobs = manifest.jobs,
            bytes = manifest.compressed_bytes,
            "archived batch"
        );
        Ok(manifest)
    }

    /// PUTs an object with its SHA-256 in metadata, then HEADs it to confirm it is there whole.
    async fn put_verified(
        &self,
        key: &str,
        data: Bytes,
        sha256: &str,
        content_type: &str,
    ) -> Result<(), ArchiveError> {
        let client = match &self.backend {
            Backend::S3(client) => client,
            Backend::Dir(store) => return store.put(key, data, sha256, self.timeout).await,
        };
        let len = data.len();
        client
            .put_object()
            .bucket(&*self.bucket)
            .key(key)
            .content_type(content_type)
            .metadata(SHA256_METADATA, sha256)
            .body(ByteStream::from(data))
            .send()
            .await
            .map_err(|e| classify(&format!("put {key}"), e))?;
        let head = client
            .head_object()
            .bucket(&*self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| match e.as_service_error() {
                // Just written, yet missing: a store with lagging reads. Try again later.
                Some(s) if s.is_not_found() => {
                    ArchiveError::Unavailable(format!("{key} is missing right after its upload"))
                }
                _ => classify(&format!("head {key}"), e),
            })?;
        let stored_len = head.content_length();
        if stored_len != Some(len as i64) {
            return Err(ArchiveError::Corrupt(format!(
                "{key}: stored length {stored_len:?}, uploaded {len}"
            )));
        }
        let stored_sha = head.metadata().and_then(|m| m.get(SHA256_METADATA));
        if stored_sha.map(String::as_str) != Some(sha256) {
            return Err(ArchiveError::Corrupt(format!(
                "{key}: stored sha256 {stored_sha:?}, uploaded {sha256}"
            )));
        }
        Ok(())
    }

    /// Downloads a whole object with its metadata, within the configured timeout.
    async fn get(
        &self,
        key: &str,
    ) -> Result<Option<(Bytes, HashMap<String, String>)>, ArchiveError> {
        let client = match &self.backend {
            Backend::S3(client) => client,
            // No metadata in a directory: gzip's CRC and the manifest guard the data.
            Backend::Dir(store) => {
                return Ok(store
                    .get(key, self.timeout)
                    .await?
                    .map(|data| (data, HashMap::new())))
            }
        };
        let output = match client
            .get_object()
            .bucket(&*self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(classify(&format!("get {key}"), e)),
        };
        let metadata = output.metadata.clone().unwrap_or_default();
        // The SDK's operation timeout ends when the headers arrive; the body needs its own.
        let body = tokio::time::timeout(self.timeout, output.body.collect())
            .await
            .map_err(|_| ArchiveError::Unavailable(format!("get {key}: body timed out")))?
            .map_err(|e| ArchiveError::Unavailable(format!("get {key}: {e}")))?
            .into_bytes();
        if let Some(expected) = metadata.get(SHA256_METADATA) {
            let actual = sha256_hex(&body);
            if &actual != expected {
                return Err(ArchiveError::Corrupt(format!(
                    "{key}: sha256 {actual}, metadata says {expected}"
                )));
            }
        }
        Ok(Some((body, metadata)))
    }

    /// Reads a batch object back (by data object key), checking it against its SHA-256.
    pub async fn read_batch(&self, object_key: &str) -> Result<Vec<ArchivedJob>, ArchiveError> {
        let (data, _) = self
            .get(object_key)
            .await?
            .ok_or_else(|| ArchiveError::Rejected(format!("no object {object_key}")))?;
        decode_batch(&data)
    }

    /// The manifest of one batch, or `None` if that batch was never completely written.
    pub async fn manifest(
        &self,
        jobdb: &str,
        kind: BatchKind,
        batch: Ulid,
    ) -> Result<Option<Manifest>, ArchiveError> {
        check_jobdb_name(jobdb)?;
        self.read_manifest(&self.manifest_key(jobdb, kind, batch))
            .await
    }

    async fn read_manifest(&self, key: &str) -> Result<Option<Manifest>, ArchiveError> {
        let Some((data, _)) = self.get(key).await? else {
            return Ok(None);
        };
        serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| ArchiveError::Corrupt(format!("{key}: {e}")))
    }

    /// Every manifest under the prefix (optionally of one jobdb), in key order, paginating
    /// ListObjectsV2.
    pub async fn manifests(&self, jobdb: Option<&str>) -> Result<Vec<Manifest>, ArchiveError> {
        let list_prefix = match jobdb {
            Some(name) => {
                check_jobdb_name(name)?;
                format!("{}{name}/", self.prefix)
            }
            None => self.prefix.to_string(),
        };
        let mut keys = self.list(&list_prefix).await?;
        keys.retain(|k| self.is_manifest_key(k));
        futures::stream::iter(keys)
            .map(|key| async move {
                self.read_manifest(&key).await?.ok_or_else(|| {
                    // Listed a moment ago; deleted since. Listing again will tell.
                    ArchiveError::Unavailable(format!("{key} vanished while listing"))
                })
            })
            .buffered(MANIFEST_FETCH_CONCURRENCY)
            .try_collect()
            .await
    }

    /// Every key starting with `list_prefix`, in byte order (ListObjectsV2's order, paginated).
    async fn list(&self, list_prefix: &str) -> Result<Vec<String>, ArchiveError> {
        let client = match &self.backend {
            Backend::S3(client) => client,
            Backend::Dir(store) => return store.list(list_prefix, self.timeout).await,
        };
        let mut keys = Vec::new();
        let mut continuation: Option<String> = None;
        loop {
            let page = client
                .list_objects_v2()
                .bucket(&*self.bucket)
                .prefix(list_prefix)
                .set_continuation_token(continuation.take())
                .send()
                .await
                .map_err(|e| classify(&format!("list {}/{list_prefix}", self.bucket), e))?;
            keys.extend(
                page.contents()
                    .iter()
                    .filter_map(|o| o.key())
                    .map(str::to_owned),
            );
            match page.next_continuation_token() {
                Some(token) if page.is_truncated() == Some(true) => {
                    continuation = Some(token.to_owned())
                }
                _ => break,
            }
        }
        Ok(keys)
    }

    /// Whether `key` has the shape `{prefix}{jobdb}/{kind}/{ulid}.manifest.json`, so foreign
    /// objects sharing the prefix are ignored.
    fn is_manifest_key(&self, key: &str) -> bool {
        let Some(rest) = key.strip_prefix(&*self.prefix) else {
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
}

/// Creates the bucket when HeadBucket says it is missing.
async fn ensure_bucket(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    region: &str,
) -> Result<(), ArchiveError> {
    let what = format!("head bucket {bucket}");
    match client.head_bucket().bucket(bucket).send().await {
        Ok(_) => return Ok(()),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => {}
        Err(e) => return Err(classify(&what, e)),
    }
    let mut create = client.create_bucket().bucket(bucket);
    // us-east-1 is the one region that refuses an explicit location constraint.
    if region != "us-east-1" {
        create = create.create_bucket_configuration(
            CreateBucketConfiguration::builder()
                .location_constraint(BucketLocationConstraint::from(region))
                .build(),
        );
    }
    match create.send().await {
        Ok(_) => Ok(()),
        // Another process created it between our HEAD and CREATE.
        Err(e) if e.code() == Some("BucketAlreadyOwnedByYou") => Ok(()),
        Err(e) => Err(classify(&format!("create bucket {bucket}"), e)),
    }
}

/// A JobDB name becomes one key segment: it must be non-empty, without `/` or control chars.
fn check_jobdb_name(jobdb: &str) -> Result<(), ArchiveError> {
    if jobdb.is_empty() || jobdb.contains('/') || jobdb.chars().any(char::is_control) {
        return Err(ArchiveError::Rejected(format!(
            "jobdb name {jobdb:?} cannot be a key segment"
        )));
    }
    Ok(())
}

/// S3 error codes that mean "slow down or try again", whatever the status says.
const TRANSIENT_CODES: &[&str] = &[
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
];

/// Sorts an SDK error into transient (network, timeout, 5xx, throttling) or not.
fn classify<E>(what: &str, err: SdkError<E>) -> ArchiveError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ConstructionFailure(_) => {
            ArchiveError::Rejected(format!("{what}: {}", DisplayErrorContext(&err)))
        }
        SdkError::TimeoutError(_) => ArchiveError::Unavailable(format!("{what}: timed out")),
        SdkError::DispatchFailure(failure) if failure.is_user() => {
            ArchiveError::Rejected(format!("{what}: {}", DisplayErrorContext(&err)))
        }
        SdkError::ServiceError(_) => {
            let status = err.raw_response().map(|r| r.status().as_u16());
            let code = err.code().unwrap_or("unknown");
            let message = format!(
                "{what}: {code} (status {}): {}",
                status.map_or_else(|| "?".to_owned(), |s| s.to_string()),
                err.message().unwrap_or("")
            );
            let transient =
                status.is_some_and(|s| s >= 500 || s == 429) || TRANSIENT_CODES.contains(&code);
            if transient {
                ArchiveError::Unavailable(message)
            } else {
                ArchiveError::Rejected(message)
            }
        }
        // Dispatch (connect, reset, I/O) and unreadable responses: the store or the path to it.
        _ => ArchiveError::Unavailable(format!("{what}: {}", DisplayErrorContext(&err))),
    }
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

    #[tokio::test]
    async fn keys_follow_the_documented_layout() {
        let mut config = S3Config::new("b");
        config.endpoint = Some("http://127.0.0.1:9".into());
        config.access_key_id = Some("k".into());
        config.secret_access_key = Some("s".into());
        config.prefix = "spindle".into();
        let archive = Archive::connect(&config).await.unwrap();
        let batch = Ulid::from_string("01JH0000000000000000000000").unwrap();
        assert_eq!(
            archive.object_key("jobdb_1", BatchKind::Expired, batch),
            "spindle/jobdb_1/expired/01JH0000000000000000000000.ndjson.gz"
        );
        assert_eq!(
            archive.manifest_key("jobdb_1", BatchKind::History, batch),
            "spindle/jobdb_1/history/01JH0000000000000000000000.manifest.json"
        );
        assert!(archive.is_manifest_key(&archive.manifest_key("d", BatchKind::History, batch)));
        assert!(!archive.is_manifest_key(&archive.object_key("d", BatchKind::History, batch)));
        assert!(
            !archive.is_manifest_key("spindle/d/other/01JH0000000000000000000000.manifest.json")
        );
        assert!(
            !archive.is_manifest_key("elsewhere/d/moved/01JH0000000000000000000000.manifest.json")
        );
        assert!(check_jobdb_name("a/b").is_err() && check_jobdb_name("").is_err());
    }

    #[tokio::test]
    async fn a_directory_archive_uses_the_same_keys() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = DirConfig::new(root.path());
        dir.prefix = "spindle".into();
        let local = Archive::open(&dir.clone().into()).await.unwrap();
        let mut s3 = S3Config::new("b");
        s3.endpoint = Some("http://127.0.0.1:9".into());
        s3.access_key_id = Some("k".into());
        s3.secret_access_key = Some("s".into());
        s3.prefix = "spindle".into();
        let remote = Archive::open(&s3.into()).await.unwrap();
        let batch = Ulid::new();
        for kind in [BatchKind::Expired, BatchKind::History] {
            assert_eq!(
                local.object_key("d", kind, batch),
                remote.object_key("d", kind, batch)
            );
            assert_eq!(
                local.manifest_key("d", kind, batch),
                remote.manifest_key("d", kind, batch)
            );
        }
        assert!(root.path().join(DirConfig::DEFAULT_BUCKET).is_dir());
        assert_eq!(local.bucket(), DirConfig::DEFAULT_BUCKET);
        assert!(local.location().ends_with("spindle-archive/spindle/"));
        // A prefix or bucket that would leave the directory is refused.
        dir.prefix = "../up".into();
        assert!(matches!(
            Archive::open_dir(&dir).await,
            Err(ArchiveError::Rejected(_))
        ));
        dir.prefix = String::new();
        dir.bucket = "..".into();
        assert!(matches!(
            Archive::open_dir(&dir).await,
            Err(ArchiveError::Rejected(_))
        ));
    }

    #[test]
    fn the_config_debug_output_hides_the_secret() {
        let mut config = S3Config::new("b");
        config.access_key_id = Some("AKIDEXAMPLE".into());
        config.secret_access_key = Some("wJalrXUtnFEMI".into());
        let shown = format!("{config:?}");
        assert!(shown.contains("AKIDEXAMPLE") && !shown.contains("wJalrXUtnFEMI"));
    }

    #[tokio::test]
    async fn half_given_credentials_are_rejected() {
        let mut config = S3Config::new("b");
        config.access_key_id = Some("k".into());
        let err = Archive::connect(&config).await.unwrap_err();
        assert!(matches!(err, ArchiveError::Rejected(_)));
    }
}
