//! The directory backend of the archive: the S3 object layout on a local file system, for a
//! single-machine setup (`spindle dev`, `--archive-dir`) with nothing to install.
//!
//! An object with key `K` of bucket `B` is the file `root/B/K` (each `/` of the key a directory
//! level), so `gunzip`, `jq` and `find` read the archive as `aws s3 cp` reads the bucket.
//!
//! What the S3 path relies on holds here too:
//! - A write is atomic: the bytes go to a temporary file in the object's own directory, which
//!   is fsynced, renamed over the key (replacing an older version whole, as a PUT does) and
//!   followed by an fsync of the directory (and of every directory level created for it), so
//!   after a crash an object is either absent, its previous version, or complete. Since
//!   [`super::Archive::put_batch`] writes the manifest only after the data object is durable,
//!   a manifest still means a complete batch.
//! - A write is confirmed by reading the object back and comparing its length and SHA-256 (the
//!   HEAD check of the S3 path).
//! - A missing object reads as absent (S3's `NoSuchKey`), a missing bucket directory is a
//!   rejected request (S3's `NoSuchBucket`).
//! - Listing returns every key starting with a prefix in byte order, as ListObjectsV2 does
//!   (the walk's order is not relied on: keys are sorted).
//! - Every operation runs on the blocking pool under the archive's timeout, so a hung file
//!   system (a dead NFS mount) cannot hang a drainer.
//!
//! There is no object metadata: the SHA-256 the S3 path keeps in `x-amz-meta-sha256` is not
//! stored; data objects carry gzip's CRC-32, and the manifest names their SHA-256.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{sha256_hex, ArchiveError};

/// Suffix of the temporary file an object is written to before it is renamed into place.
const TEMP_SUFFIX: &str = ".tmp";

/// The bucket directory and the policy for a missing one.
#[derive(Clone, Debug)]
pub(super) struct DirStore {
    /// `root/bucket`.
    bucket_dir: Arc<Path>,
}

impl DirStore {
    /// A store over `root/bucket`, created (with `root`) when `create` is set and it is missing.
    pub(super) async fn open(
        root: &Path,
        bucket: &str,
        create: bool,
        timeout: Duration,
    ) -> Result<DirStore, ArchiveError> {
        if bucket.is_empty() || bucket.contains('/') || bucket == "." || bucket == ".." {
            return Err(ArchiveError::Rejected(format!(
                "bucket {bucket:?} cannot be a directory name"
            )));
        }
        let bucket_dir: Arc<Path> = root.join(bucket).into();
        if create {
            let dir = bucket_dir.clone();
            blocking(timeout, "create the bucket directory", move || {
                fs::create_dir_all(&dir)
                    .map_err(|e| io_error(&format!("create {}", dir.display()), e))
            })
            .await?;
        }
        Ok(DirStore { bucket_dir })
    }

    /// The directory holding the bucket's objects.
    pub(super) fn bucket_dir(&self) -> &Path {
        &self.bucket_dir
    }

    /// Writes `data` under `key` atomically and durably, then reads it back to confirm its
    /// length and SHA-256.
    pub(super) async fn put(
        &self,
        key: &str,
        data: Bytes,
        sha256: &str,
        timeout: Duration,
    ) -> Result<(), ArchiveError> {
        let segments = key_segments(key)?;
        let bucket_dir = self.bucket_dir.clone();
        let sha256 = sha256.to_owned();
        let key = key.to_owned();
        blocking(timeout, &format!("put {key}"), move || {
            check_bucket(&bucket_dir)?;
            let (file_name, dirs) = segments
                .split_last()
                .ok_or_else(|| ArchiveError::Rejected("empty key".to_owned()))?;
            let parent = ensure_dirs(&bucket_dir, dirs, &key)?;
            let path = parent.join(file_name);
            write_atomically(&parent, &path, &data)
                .map_err(|e| io_error(&format!("put {key}"), e))?;
            // The HEAD of the S3 path: is the object there, whole?
            let stored = match fs::read(&path) {
                Ok(stored) => stored,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    return Err(ArchiveError::Unavailable(format!(
                        "{key} is missing right after it was written"
                    )))
                }
                Err(e) => return Err(io_error(&format!("read back {key}"), e)),
            };
            if stored.len() != data.len() {
                return Err(ArchiveError::Corrupt(format!(
                    "{key}: stored length {}, written {}",
                    stored.len(),
                    data.len()
                )));
            }
            let stored_sha = sha256_hex(&stored);
            if stored_sha != sha256 {
                return Err(ArchiveError::Corrupt(format!(
                    "{key}: stored sha256 {stored_sha}, written {sha256}"
                )));
            }
            Ok(())
        })
        .await
    }

    /// The bytes of `key`, or `None` when there is no such object.
    pub(super) async fn get(
        &self,
        key: &str,
        timeout: Duration,
    ) -> Result<Option<Bytes>, ArchiveError> {
        let segments = key_segments(key)?;
        let bucket_dir = self.bucket_dir.clone();
        let key = key.to_owned();
        blocking(timeout, &format!("get {key}"), move || {
            check_bucket(&bucket_dir)?;
            let path = segments
                .iter()
                .fold(bucket_dir.to_path_buf(), |p, s| p.join(s));
            let mut file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if is_absent(&e) => return Ok(None),
                Err(e) => return Err(io_error(&format!("get {key}"), e)),
            };
            let mut data = Vec::new();
            match file.read_to_end(&mut data) {
                Ok(_) => Ok(Some(Bytes::from(data))),
                // A directory is not an object (a key that is only a prefix of others).
                Err(e) if is_absent(&e) => Ok(None),
                Err(e) => Err(io_error(&format!("get {key}"), e)),
            }
        })
        .await
    }

    /// Every key starting with `prefix`, in byte order (ListObjectsV2's order).
    pub(super) async fn list(
        &self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, ArchiveError> {
        // Walk from the deepest directory the prefix names whole; the rest is a string filter.
        let (dir_part, _) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let segments = if dir_part.is_empty() {
            Vec::new()
        } else {
            key_segments(dir_part)?
        };
        let bucket_dir = self.bucket_dir.clone();
        let prefix = prefix.to_owned();
        blocking(timeout, &format!("list {prefix}"), move || {
            check_bucket(&bucket_dir)?;
            let start = segments
                .iter()
                .fold(bucket_dir.to_path_buf(), |p, s| p.join(s));
            let mut base = segments.join("/");
            if !base.is_empty() {
                base.push('/');
            }
            let mut keys = Vec::new();
            walk(&start, &base, &mut keys).map_err(|e| io_error(&format!("list {prefix}"), e))?;
            keys.retain(|k| k.starts_with(&prefix));
            keys.sort_unstable();
            Ok(keys)
        })
        .await
    }
}

/// Runs `work` on the blocking pool, giving up (transiently) after `timeout`. The thread of a
/// call that timed out finishes on its own; nothing waits for it.
async fn blocking<T: Send + 'static>(
    timeout: Duration,
    what: &str,
    work: impl FnOnce() -> Result<T, ArchiveError> + Send + 'static,
) -> Result<T, ArchiveError> {
    match tokio::time::timeout(timeout, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(ArchiveError::Unavailable(format!("{what}: {join}"))),
        Err(_) => Err(ArchiveError::Unavailable(format!("{what}: timed out"))),
    }
}

/// The key's path segments; a key must name a file below the bucket directory.
fn key_segments(key: &str) -> Result<Vec<String>, ArchiveError> {
    let segments: Vec<String> = key.split('/').map(str::to_owned).collect();
    let bad = key.is_empty()
        || key.contains('\0')
        || segments
            .iter()
            .any(|s| s.is_empty() || s == "." || s == "..");
    if bad {
        return Err(ArchiveError::Rejected(format!(
            "key {key:?} cannot be a path in the archive directory"
        )));
    }
    Ok(segments)
}

/// Checks that a key prefix (ending in `/`) names directories below the bucket directory.
pub(super) fn check_prefix(prefix: &str) -> Result<(), ArchiveError> {
    key_segments(prefix.strip_suffix('/').unwrap_or(prefix)).map(|_| ())
}

/// A missing bucket directory is S3's `NoSuchBucket`: a rejected request.
fn check_bucket(bucket_dir: &Path) -> Result<(), ArchiveError> {
    match fs::metadata(bucket_dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(ArchiveError::Rejected(format!(
            "{} is not a directory",
            bucket_dir.display()
        ))),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(ArchiveError::Rejected(format!(
            "no archive bucket directory {}",
            bucket_dir.display()
        ))),
        Err(e) => Err(io_error(&format!("stat {}", bucket_dir.display()), e)),
    }
}

/// Creates the directories `dirs` below `bucket_dir` as needed, fsyncing the parent of each
/// one created so that the new entry survives a crash; returns the innermost.
fn ensure_dirs(bucket_dir: &Path, dirs: &[String], key: &str) -> Result<PathBuf, ArchiveError> {
    let mut path = bucket_dir.to_path_buf();
    for segment in dirs {
        let parent = path.clone();
        path.push(segment);
        match fs::create_dir(&path) {
            Ok(()) => sync_dir(&parent).map_err(|e| io_error(&format!("put {key}"), e))?,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                if !path.is_dir() {
                    return Err(ArchiveError::Rejected(format!(
                        "put {key}: {} is a file, not a directory",
                        path.display()
                    )));
                }
            }
            Err(e) => return Err(io_error(&format!("put {key}"), e)),
        }
    }
    Ok(path)
}

/// Temp file in `dir`, fsync, rename over `path`, fsync `dir`. The temp file is removed if
/// anything fails before the rename.
fn write_atomically(dir: &Path, path: &Path, data: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidInput, "no file name"))?;
    let temp = dir.join(format!(".{name}.{}{TEMP_SUFFIX}", ulid::Ulid::new()));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(data)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written?;
    sync_dir(dir)
}

/// fsyncs a directory, making the entries created or renamed in it durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Whether a temp file left by [`write_atomically`] (a crash between create and rename).
fn is_temp(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(TEMP_SUFFIX)
}

/// Appends the key of every file below `dir` (whose key is `base`, ending in `/` or empty).
/// Symbolic links, temp files and names that are not UTF-8 are not objects. A missing `dir` is
/// an empty listing.
fn walk(dir: &Path, base: &str, keys: &mut Vec<String>) -> std::io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_absent(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(&entry.path(), &format!("{base}{name}/"), keys)?;
        } else if kind.is_file() && !is_temp(&name) {
            keys.push(format!("{base}{name}"));
        }
    }
    Ok(())
}

/// Errors that mean "no such object": the path, or a directory on it, is missing, or it is a
/// directory (a prefix of other keys).
fn is_absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::NotFound | ErrorKind::NotADirectory | ErrorKind::IsADirectory
    )
}

/// Sorts an I/O error like the S3 path sorts answers: what an operator must fix (permissions,
/// a read-only or misnamed path) is rejected; the rest (a full disk, I/O errors) may pass.
fn io_error(what: &str, e: std::io::Error) -> ArchiveError {
    match e.kind() {
        ErrorKind::PermissionDenied
        | ErrorKind::ReadOnlyFilesystem
        | ErrorKind::InvalidInput
        | ErrorKind::InvalidFilename
        | ErrorKind::NotADirectory
        | ErrorKind::IsADirectory
        | ErrorKind::Unsupported => ArchiveError::Rejected(format!("{what}: {e}")),
        _ => ArchiveError::Unavailable(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_stay_below_the_bucket_directory() {
        assert!(key_segments("a/b/c.json").is_ok());
        for bad in ["", "/a", "a//b", "a/../b", "..", "a/./b", "a/", "a\0b"] {
            assert!(key_segments(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn temp_files_are_not_objects() {
        assert!(is_temp(".x.manifest.json.01JH0000000000000000000000.tmp"));
        assert!(!is_temp("x.manifest.json"));
    }

    #[tokio::test]
    async fn an_interrupted_write_leaves_no_object_and_no_listing() {
        let root = tempfile::tempdir().unwrap();
        let store = DirStore::open(root.path(), "b", true, Duration::from_secs(5))
            .await
            .unwrap();
        // A crash between the temp file's creation and its rename leaves only the temp file.
        fs::create_dir_all(store.bucket_dir().join("p")).unwrap();
        fs::write(store.bucket_dir().join("p/.k.json.x.tmp"), b"half").unwrap();
        let timeout = Duration::from_secs(5);
        assert!(store.list("", timeout).await.unwrap().is_empty());
        assert_eq!(store.get("p/k.json", timeout).await.unwrap(), None);
        store
            .put(
                "p/k.json",
                Bytes::from_static(b"{}"),
                &sha256_hex(b"{}"),
                timeout,
            )
            .await
            .unwrap();
        assert_eq!(store.list("p/", timeout).await.unwrap(), vec!["p/k.json"]);
        // A key that is only a directory is no object.
        assert_eq!(store.get("p", timeout).await.unwrap(), None);
    }
}
