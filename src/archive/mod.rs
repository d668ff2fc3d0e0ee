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
//! - A JobDB's events that made no job (kept for back-fill) are objects of their own,
//!   `{prefix}{jobdb}/events/{first event id}.ndjson.gz`, one event (id, bucket, type, time,
//!   envelope) per line, written by the drainer before the JobDB is dropped.
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
//! This module does no SQL and knows no JobDB: selecting jobs, planning and confirming batches
//! belong to the store and the archiver above it, deleting jobs after a successful write to the
//! drainer.

//!
//! # Modules
//! - `format`: the object layout (keys), the records ([`ArchivedJob`], [`Manifest`]) and the
//!   batch encoding; the same for every backend, no I/O.
//! - `s3`: the S3 backend ([`S3Config`], the client store).
//! - `dir`: the directory backend ([`DirConfig`]).
//! - `ids`: a fenced JobDB's id index ([`IdIndex`]), read by routers settling lapsed claims.

mod dir;
mod format;
mod ids;
mod s3;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use ulid::Ulid;

pub(crate) use format::sha256_hex;
use format::{check_jobdb_name, normalized_prefix};
pub use format::{
    decode_batch, decode_events, encode_batch, encode_events, ArchivedJob, ArchivedTransition,
    BatchKind, EncodedBatch, Manifest, TextEncoding,
};
pub use ids::{IdChunk, IdIndex};
pub use s3::S3Config;

/// How many manifests [`Archive::manifests`] downloads at once.
const MANIFEST_FETCH_CONCURRENCY: usize = 8;

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
    S3(s3::S3Store),
    Dir(dir::DirStore),
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
        let store = s3::S3Store::connect(config).await?;
        Ok(Archive {
            backend: Backend::S3(store),
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
        format::object_key(&self.prefix, jobdb, kind, batch)
    }

    /// Key of a batch's manifest: `{prefix}{jobdb}/{kind}/{batch}.manifest.json`.
    pub fn manifest_key(&self, jobdb: &str, kind: BatchKind, batch: Ulid) -> String {
        format::manifest_key(&self.prefix, jobdb, kind, batch)
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

    /// Writes kept events of `jobdb` (events that made no job there: none of them is in a
    /// batch) as one object named by the first one's id, confirmed stored as a batch is.
    /// Idempotent: the same events give the same key and bytes. Returns the key.
    pub async fn put_events(
        &self,
        jobdb: &str,
        events: &[spindle_client::KeptEvent],
    ) -> Result<String, ArchiveError> {
        check_jobdb_name(jobdb)?;
        let first = events
            .first()
            .and_then(|e| e.event_id.parse::<Ulid>().ok())
            .ok_or_else(|| ArchiveError::Rejected(format!("events of {jobdb}: none, or no id")))?;
        let encoded = encode_events(events)?;
        let key = format::events_key(&self.prefix, jobdb, first);
        self.put_verified(&key, encoded.data, &encoded.sha256, "application/gzip")
            .await?;
        Ok(key)
    }

    /// Replaces the kept events of object `key` ([`Archive::event_objects`]) with `events`
    /// (the same events, rewritten by an erasure), confirmed stored as a batch is.
    pub async fn replace_events(
        &self,
        key: &str,
        events: &[spindle_client::KeptEvent],
    ) -> Result<(), ArchiveError> {
        if !format::is_events_key(&self.prefix, key) {
            return Err(ArchiveError::Rejected(format!(
                "{key} is not an object of events"
            )));
        }
        let encoded = encode_events(events)?;
        self.put_verified(key, encoded.data, &encoded.sha256, "application/gzip")
            .await
    }

    /// Stores the receipt of erasure `id` (JSON) as `{prefix}erasures/{id}.json`, confirmed
    /// stored as a batch is; returns its key. No JobDB is named `erasures` with that shape of
    /// key under it, so listings of batches and events never see a receipt.
    pub async fn put_erasure_receipt(&self, id: Ulid, json: Bytes) -> Result<String, ArchiveError> {
        let key = self.erasure_receipt_key(id);
        let sha256 = sha256_hex(&json);
        self.put_verified(&key, json, &sha256, "application/json")
            .await?;
        Ok(key)
    }

    /// The key of erasure `id`'s receipt.
    pub fn erasure_receipt_key(&self, id: Ulid) -> String {
        format!("{}erasures/{id}.json", self.prefix)
    }

    /// Keys of every object of kept events (optionally of one JobDB), in key order.
    pub async fn event_objects(&self, jobdb: Option<&str>) -> Result<Vec<String>, ArchiveError> {
        let mut keys = self.list(&self.prefix_of(jobdb)?).await?;
        keys.retain(|k| format::is_events_key(&self.prefix, k));
        Ok(keys)
    }

    /// The kept events of one object ([`Archive::event_objects`]).
    pub async fn read_events(
        &self,
        key: &str,
    ) -> Result<Vec<spindle_client::KeptEvent>, ArchiveError> {
        decode_events(&self.get_object(key).await?)
    }

    /// PUTs an object with its SHA-256 in metadata, then HEADs it to confirm it is there whole.
    async fn put_verified(
        &self,
        key: &str,
        data: Bytes,
        sha256: &str,
        content_type: &str,
    ) -> Result<(), ArchiveError> {
        match &self.backend {
            Backend::S3(store) => store.put(key, data, sha256, content_type).await,
            Backend::Dir(store) => store.put(key, data, sha256, self.timeout).await,
        }
    }

    /// Downloads a whole object with its metadata, within the configured timeout.
    async fn get(
        &self,
        key: &str,
    ) -> Result<Option<(Bytes, HashMap<String, String>)>, ArchiveError> {
        match &self.backend {
            Backend::S3(store) => store.get(key).await,
            // No metadata in a directory: gzip's CRC and the manifest guard the data.
            Backend::Dir(store) => Ok(store
                .get(key, self.timeout)
                .await?
                .map(|data| (data, HashMap::new()))),
        }
    }

    /// Reads a batch object back (by data object key), checking it against its SHA-256.
    pub async fn read_batch(&self, object_key: &str) -> Result<Vec<ArchivedJob>, ArchiveError> {
        decode_batch(&self.get_object(object_key).await?)
    }

    /// An object's bytes; one that is not there is refused.
    async fn get_object(&self, key: &str) -> Result<Bytes, ArchiveError> {
        let (data, _) = self
            .get(key)
            .await?
            .ok_or_else(|| ArchiveError::Rejected(format!("no object {key}")))?;
        Ok(data)
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
        let mut keys = self.list(&self.prefix_of(jobdb)?).await?;
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

    /// The keys of one JobDB (`{prefix}{jobdb}/`), or of the whole archive.
    fn prefix_of(&self, jobdb: Option<&str>) -> Result<String, ArchiveError> {
        match jobdb {
            Some(name) => {
                check_jobdb_name(name)?;
                Ok(format!("{}{name}/", self.prefix))
            }
            None => Ok(self.prefix.to_string()),
        }
    }

    /// Every key starting with `list_prefix`, in byte order (ListObjectsV2's order, paginated).
    async fn list(&self, list_prefix: &str) -> Result<Vec<String>, ArchiveError> {
        match &self.backend {
            Backend::S3(store) => store.list(list_prefix).await,
            Backend::Dir(store) => store.list(list_prefix, self.timeout).await,
        }
    }

    /// Whether `key` has the shape `{prefix}{jobdb}/{kind}/{ulid}.manifest.json`, so foreign
    /// objects sharing the prefix are ignored.
    fn is_manifest_key(&self, key: &str) -> bool {
        format::is_manifest_key(&self.prefix, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
