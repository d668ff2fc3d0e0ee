//! The archive against both backends: a real S3-compatible server (moto, behind a fault proxy)
//! and a local directory. What `put_batch` stores is read back with an independent client
//! (boto3, or plain file calls in Python) and checked job by job; writing a batch twice is
//! harmless; a data object without its manifest is no batch; listing follows key byte order;
//! `spindle replay --from-archive` reads either; missing objects and buckets are permanent
//! errors. S3 only: a failing, unreachable or hanging store gives a transient error within the
//! configured timeout and leaves nothing behind. Directory only: a hung file gives a transient
//! error within the timeout.
//!
//! Each shared case is a function of the backend, run as `<case>::s3` and `<case>::dir`.

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use chrono::Utc;
use rand::Rng;
use serde_json::Value;
use spindle::archive::{encode_batch, Archive, ArchiveError, ArchivedJob, BatchKind, Manifest};
use spindle::job::{AttemptRecord, Job, JobId, RetryPolicy, State, Transition};
use ulid::Ulid;

use common::s3::{boto3_keys, unique_bucket, ArchiveStore, Backend, Mode, S3Server};

/// Runs the case `$name(backend)` once per backend, as the tests `$name::s3` and `$name::dir`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn s3() {
                super::$name(Backend::S3).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dir() {
                super::$name(Backend::Dir).await
            }
        }
    )*};
}

on_both_backends!(
    a_batch_reads_back_job_by_job_with_an_independent_client,
    writing_a_batch_twice_leaves_one_identical_batch,
    a_data_object_without_its_manifest_is_no_batch,
    manifests_are_listed_in_key_byte_order,
    replay_reads_ended_jobs_from_the_archive,
    missing_objects_and_buckets_are_permanent_errors,
);

const JOBDB: &str = "jobdb_archive_test";

/// `n` expired jobs with random payloads (binary, empty, up to 4 KiB) and a retry history.
fn expired_jobs(n: usize) -> (Vec<Job>, Vec<ArchivedJob>) {
    let mut rng = rand::rng();
    let mut next_row = 1u64;
    let mut jobs = Vec::with_capacity(n);
    let mut archived = Vec::with_capacity(n);
    for i in 0..n {
        let payload: Vec<u8> = match i {
            0 => Vec::new(),
            1 => (0..=255u8).collect(),
            2 => b"{\"json\": \"line\"}\n\r\n".to_vec(),
            _ => {
                let mut bytes = vec![0u8; rng.random_range(1..4096)];
                rng.fill(&mut bytes[..]);
                bytes
            }
        };
        let now = Utc::now();
        let job = Job {
            id: JobId(Ulid::new()),
            bucket: format!("tenant-{}", i % 7).into(),
            endpoint: format!("https://example.test/hooks/{i}?q=1").into(),
            method: "POST".into(),
            headers: vec![("content-type".into(), "application/octet-stream".into())],
            payload: Bytes::from(payload),
            execution_timeout: Duration::from_millis(1_000 + i as u64),
            retry: RetryPolicy {
                min_delay: Duration::from_millis(100),
                coefficient: 2.0,
            },
            created_at: now,
            expire_at: now + chrono::Duration::minutes(5),
            idempotency_key: (i % 3 == 0).then(|| format!("idem-{i}")),
            on_complete: None,
            ordering: None,
            event: None,
            trace: None,
        };
        let mut error_body = vec![0u8; rng.random_range(0..64)];
        rng.fill(&mut error_body[..]);
        let history = [
            Transition::awaiting_scheduling(&job),
            Transition::executing(job.id, 1, now),
            Transition::awaiting_retry(
                job.id,
                1,
                now,
                now + chrono::Duration::seconds(1),
                AttemptRecord {
                    error_type: Some("status".into()),
                    error_response: Some(Bytes::from(error_body)),
                    response_status: Some(503),
                    duration: Some(Duration::from_millis(rng.random_range(1..500))),
                    started: None,
                },
            ),
            Transition::archiving(job.id, 1, now),
        ];
        let rows: Vec<(u64, Transition)> = history
            .into_iter()
            .map(|t| {
                next_row += 1;
                (next_row, t)
            })
            .collect();
        archived.push(ArchivedJob::new(&job, &rows, None));
        jobs.push(job);
    }
    (jobs, archived)
}

fn sorted_keys(dump: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut keys: Vec<String> = dump.keys().cloned().collect();
    keys.sort();
    keys
}

async fn a_batch_reads_back_job_by_job_with_an_independent_client(backend: Backend) {
    let store = ArchiveStore::start(backend, "put").await;
    let config = store.config_of(&store.bucket, "spindle/");
    let archive = Archive::open(&config).await.expect("open");
    let (jobs, archived) = expired_jobs(500);
    let batch = Ulid::new();

    let manifest = archive
        .put_batch(JOBDB, BatchKind::Expired, batch, &archived)
        .await
        .expect("put_batch");
    let object_key = format!("spindle/{JOBDB}/expired/{batch}.ndjson.gz");
    let manifest_key = format!("spindle/{JOBDB}/expired/{batch}.manifest.json");
    assert_eq!(manifest.object_key, object_key);
    assert_eq!(
        archive.object_key(JOBDB, BatchKind::Expired, batch),
        object_key
    );
    assert_eq!(
        archive.manifest_key(JOBDB, BatchKind::Expired, batch),
        manifest_key
    );
    assert_eq!(manifest.jobs, 500);
    assert_eq!(manifest.batch, batch.to_string());
    assert_eq!(manifest.kind, BatchKind::Expired);

    // Straight from moto (not through the proxy) with boto3, or from the directory: exactly
    // the two objects, no temp file left behind.
    let listed = store.keys().await;
    assert_eq!(listed, vec![manifest_key.clone(), object_key.clone()]);
    let dump = store.dump().await;
    assert_eq!(sorted_keys(&dump), listed);
    if let Some(root) = store.root() {
        // The documented layout: root/bucket/key.
        assert!(root.join(&store.bucket).join(&object_key).is_file());
    }

    let object = &dump[&object_key];
    assert_eq!(
        object["sha256"],
        manifest.sha256.as_str(),
        "sha256 computed by Python"
    );
    if backend == Backend::S3 {
        assert_eq!(object["metadata"]["sha256"], manifest.sha256.as_str());
    }
    assert_eq!(object["size"], manifest.compressed_bytes);
    assert_eq!(object["content_length"], manifest.compressed_bytes);
    assert_eq!(object["uncompressed_size"], manifest.uncompressed_bytes);
    let records = object["records"].as_array().expect("records");
    assert_eq!(records.len(), jobs.len());
    let base64 = base64::engine::general_purpose::STANDARD;
    for (i, (record, job)) in records.iter().zip(&jobs).enumerate() {
        assert_eq!(record["id"], job.id.to_string(), "job {i}");
        let payload = base64
            .decode(record["payload"].as_str().expect("payload string"))
            .expect("payload base64");
        assert_eq!(payload, job.payload, "payload of job {i}");
        assert_eq!(record["bucket"], &*job.bucket);
        let transitions = record["transitions"].as_array().expect("transitions");
        assert_eq!(transitions.len(), 4);
        assert_eq!(transitions[3]["state"], "archiving");
        assert_eq!(record["moved_to"], Value::Null);
    }

    let stored_manifest = &dump[&manifest_key]["json"];
    assert_eq!(*stored_manifest, serde_json::to_value(&manifest).unwrap());
    let ids: Vec<String> = jobs.iter().map(|j| j.id.to_string()).collect();
    assert_eq!(stored_manifest["job_ids"], serde_json::json!(ids));
    assert_eq!(stored_manifest["jobs"], 500);
    assert_eq!(stored_manifest["kind"], "expired");

    // The bytes in the store are exactly the deterministic encoding.
    let raw = store.read(&object_key).await;
    assert_eq!(raw, encode_batch(&archived).unwrap().data);

    // And our own readers agree.
    let read = archive.read_batch(&object_key).await.expect("read_batch");
    assert_eq!(read, archived);
    for (back, job) in read.iter().zip(&jobs) {
        assert_eq!(&back.to_job().unwrap(), job);
        assert_eq!(back.last_state(), Some(State::Archiving));
    }
    assert_eq!(
        archive.manifests(None).await.unwrap(),
        vec![manifest.clone()]
    );
    assert_eq!(
        archive.manifests(Some(JOBDB)).await.unwrap(),
        vec![manifest.clone()]
    );
    assert!(archive
        .manifests(Some("other_db"))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        archive
            .manifest(JOBDB, BatchKind::Expired, batch)
            .await
            .unwrap(),
        Some(manifest)
    );
    assert_eq!(
        archive
            .manifest(JOBDB, BatchKind::History, batch)
            .await
            .unwrap(),
        None
    );
}

async fn writing_a_batch_twice_leaves_one_identical_batch(backend: Backend) {
    let store = ArchiveStore::start(backend, "idem").await;
    let config = store.config();
    let archive = Archive::open(&config).await.expect("open");
    let (_, mut archived) = expired_jobs(40);
    for job in &mut archived {
        job.moved_to = Some("jobdb_next".to_owned());
    }
    let batch = Ulid::new();

    let first = archive
        .put_batch(JOBDB, BatchKind::History, batch, &archived)
        .await
        .expect("first put");
    let after_first = store.dump().await;
    // A restarted drainer writes the same batch again with a new connection.
    let again = Archive::open(&config).await.expect("reopen");
    let second = again
        .put_batch(JOBDB, BatchKind::History, batch, &archived)
        .await
        .expect("second put");
    let after_second = store.dump().await;

    assert_eq!(first, second);
    assert_eq!(
        sorted_keys(&after_second),
        vec![
            format!("{JOBDB}/history/{batch}.manifest.json"),
            format!("{JOBDB}/history/{batch}.ndjson.gz"),
        ]
    );
    assert_eq!(
        after_first, after_second,
        "same keys, same bytes, same sha256"
    );
    assert_eq!(
        after_second[&first.object_key]["sha256"],
        first.sha256.as_str()
    );
    assert_eq!(archive.manifests(None).await.unwrap(), vec![first.clone()]);

    // Two writers of the same batch at once (a drainer and its stalled predecessor): each
    // write replaces the object whole, so both succeed and one identical batch remains.
    let (x, y) = tokio::join!(
        archive.put_batch(JOBDB, BatchKind::History, batch, &archived),
        again.put_batch(JOBDB, BatchKind::History, batch, &archived)
    );
    assert_eq!((x.unwrap(), y.unwrap()), (first.clone(), first));
    assert_eq!(store.dump().await, after_first);
}

async fn a_data_object_without_its_manifest_is_no_batch(backend: Backend) {
    let store = ArchiveStore::start(backend, "order").await;
    let archive = Archive::open(&store.config()).await.expect("open");
    let (_, archived) = expired_jobs(10);
    let batch = Ulid::new();
    // A writer that died between the data object and the manifest.
    let object_key = archive.object_key(JOBDB, BatchKind::Expired, batch);
    let data = encode_batch(&archived).unwrap().data;
    store.put_raw(&object_key, &data).await;
    assert_eq!(store.keys().await, vec![object_key.clone()]);
    assert!(archive.manifests(None).await.unwrap().is_empty());
    assert_eq!(
        archive
            .manifest(JOBDB, BatchKind::Expired, batch)
            .await
            .unwrap(),
        None
    );
    // Its successor writes the batch again, completing it.
    let manifest = archive
        .put_batch(JOBDB, BatchKind::Expired, batch, &archived)
        .await
        .unwrap();
    assert_eq!(archive.manifests(None).await.unwrap(), vec![manifest]);
    assert_eq!(archive.read_batch(&object_key).await.unwrap(), archived);
}

async fn manifests_are_listed_in_key_byte_order(backend: Backend) {
    let store = ArchiveStore::start(backend, "list").await;
    let archive = Archive::open(&store.config_of(&store.bucket, "p"))
        .await
        .expect("open");
    let (_, archived) = expired_jobs(2);
    // `-` and `.` sort before `/`: a directory walk in name order would put `a/...` first.
    let names = ["a", "a-b", "a.b", "ab", "B", "a_"];
    let mut written = Vec::new();
    for name in names {
        for kind in [BatchKind::History, BatchKind::Expired] {
            for _ in 0..2 {
                let batch = Ulid::new();
                written.push(
                    archive
                        .put_batch(name, kind, batch, &archived)
                        .await
                        .unwrap(),
                );
            }
        }
    }
    // A foreign object under the prefix is not a manifest.
    store
        .put_raw("p/a/expired/notes.manifest.json", b"{}")
        .await;
    let key = |m: &Manifest| archive.manifest_key(&m.jobdb, m.kind, m.batch.parse().unwrap());
    written.sort_by_key(|m| key(m).into_bytes());
    let listed = archive.manifests(None).await.unwrap();
    assert_eq!(listed, written);
    assert_eq!(
        archive.manifests(Some("a")).await.unwrap(),
        written
            .iter()
            .filter(|m| m.jobdb == "a")
            .cloned()
            .collect::<Vec<_>>()
    );
    assert!(archive.manifests(Some("a-")).await.unwrap().is_empty());
}

async fn replay_reads_ended_jobs_from_the_archive(backend: Backend) {
    let store = ArchiveStore::start(backend, "replay").await;
    let archive = Archive::open(&store.config()).await.expect("open");
    let (jobs, archived) = expired_jobs(30);
    archive
        .put_batch(JOBDB, BatchKind::Expired, Ulid::new(), &archived[..20])
        .await
        .unwrap();
    archive
        .put_batch(
            "jobdb_other",
            BatchKind::Expired,
            Ulid::new(),
            &archived[20..],
        )
        .await
        .unwrap();
    let in_bucket = jobs.iter().filter(|j| &*j.bucket == "tenant-1").count();
    // Nothing listens there: a dry run submits nothing.
    let mut args: Vec<String> = [
        "replay",
        "--from-archive",
        "--state",
        "archived",
        "--dry-run",
        "--to",
        "http://127.0.0.1:9",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(store.cli_args());
    let run = |extra: &[&str]| {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend_from_slice(extra);
        common::procs::run_ok(&all)
    };
    let out = run(&[]);
    assert!(out.contains("selected 30, submitted 0 (dry run)"), "{out}");
    let out = run(&["--archive-jobdb", JOBDB]);
    assert!(out.contains("selected 20, submitted 0 (dry run)"), "{out}");
    let out = run(&["--bucket", "tenant-1"]);
    assert!(
        out.contains(&format!("selected {in_bucket}, submitted 0 (dry run)")),
        "{out}"
    );
    if let Some(root) = store.root() {
        // A reader does not create a mistyped archive directory: it fails.
        let nowhere = root.join("nowhere");
        let failed = common::procs::run(&[
            "replay",
            "--from-archive",
            "--dry-run",
            "--to",
            "http://127.0.0.1:9",
            "--archive-dir",
            &nowhere.display().to_string(),
        ]);
        assert!(!failed.status.success());
        assert!(!nowhere.exists());
    }
}

async fn missing_objects_and_buckets_are_permanent_errors(backend: Backend) {
    let store = ArchiveStore::start(backend, "missing").await;
    let archive = Archive::open(&store.config()).await.expect("open");
    let (_, archived) = expired_jobs(3);
    let missing = archive
        .read_batch("no/such/key.ndjson.gz")
        .await
        .unwrap_err();
    assert!(matches!(missing, ArchiveError::Rejected(_)), "{missing}");
    assert_eq!(
        archive
            .manifest(JOBDB, BatchKind::Expired, Ulid::new())
            .await
            .unwrap(),
        None
    );
    // A key that is only a prefix of others is no object either.
    let manifest = archive
        .put_batch(JOBDB, BatchKind::Expired, Ulid::new(), &archived)
        .await
        .unwrap();
    let err = archive.read_batch(JOBDB).await.unwrap_err();
    assert!(matches!(err, ArchiveError::Rejected(_)), "{err}");
    assert_eq!(
        archive.read_batch(&manifest.object_key).await.unwrap(),
        archived
    );

    let mut elsewhere = store.config_of(&unique_bucket("absent"), "");
    match &mut elsewhere {
        spindle::archive::ArchiveConfig::S3(c) => c.create_bucket = false,
        spindle::archive::ArchiveConfig::Dir(c) => c.create_bucket = false,
    }
    let absent = Archive::open(&elsewhere).await.expect("open lazily");
    let err = absent
        .put_batch(JOBDB, BatchKind::Expired, Ulid::new(), &archived)
        .await
        .unwrap_err();
    assert!(!err.is_transient(), "missing bucket: {err}");
    let err = absent.manifests(None).await.unwrap_err();
    assert!(!err.is_transient(), "missing bucket: {err}");
}

/// Asserts `result` failed transiently within the configured timeout (+ slack).
fn assert_transient<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, ArchiveError>,
    started: Instant,
    timeout: Duration,
) {
    let elapsed = started.elapsed();
    let err = result.expect_err(what);
    assert!(err.is_transient(), "{what}: not transient: {err}");
    assert!(
        elapsed < timeout + Duration::from_secs(2),
        "{what}: took {elapsed:?}, timeout {timeout:?}"
    );
    println!("{what}: {err} after {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_gives_transient_errors_and_stores_nothing() {
    let s3 = S3Server::start().await;
    let bucket = unique_bucket("fault");
    let config = s3.config(&bucket);
    let archive = Archive::connect(&config).await.expect("connect");
    let (_, archived) = expired_jobs(20);

    s3.set_mode(Mode::Error503);
    let started = Instant::now();
    let result = archive
        .put_batch(JOBDB, BatchKind::Expired, Ulid::new(), &archived)
        .await;
    assert_transient("put during 503s", result, started, config.timeout);
    let started = Instant::now();
    let result = archive.manifests(None).await;
    assert_transient("list during 503s", result, started, config.timeout);
    assert!(
        boto3_keys(&s3.moto_endpoint(), &bucket).await.is_empty(),
        "nothing may be stored while the store answers 503"
    );

    s3.set_mode(Mode::Down);
    let started = Instant::now();
    let result = archive
        .put_batch(JOBDB, BatchKind::Expired, Ulid::new(), &archived)
        .await;
    assert_transient("put while down", result, started, config.timeout);
    assert!(boto3_keys(&s3.moto_endpoint(), &bucket).await.is_empty());

    // A server that accepts and never answers: only the configured timeout ends the wait.
    s3.set_mode(Mode::Hang);
    let started = Instant::now();
    let result = archive
        .put_batch(JOBDB, BatchKind::Expired, Ulid::new(), &archived)
        .await;
    assert!(
        started.elapsed() >= config.timeout,
        "gave up before the timeout"
    );
    assert_transient("put while hanging", result, started, config.timeout);

    s3.set_mode(Mode::Pass);
    let batch = Ulid::new();
    let manifest = archive
        .put_batch(JOBDB, BatchKind::Expired, batch, &archived)
        .await
        .expect("put after recovery");
    assert_eq!(boto3_keys(&s3.moto_endpoint(), &bucket).await.len(), 2);
    assert_eq!(
        archive.read_batch(&manifest.object_key).await.unwrap(),
        archived
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_file_gives_a_transient_error_within_the_timeout() {
    let store = ArchiveStore::start(Backend::Dir, "hung").await;
    let config = store.config();
    let archive = Archive::open(&config).await.expect("open");
    let timeout = match &config {
        spindle::archive::ArchiveConfig::Dir(c) => c.timeout,
        spindle::archive::ArchiveConfig::S3(_) => unreachable!(),
    };
    // Opening a FIFO for reading blocks until a writer comes: a file system that hangs.
    let key = "hung/expired/01JH0000000000000000000000.ndjson.gz";
    let bucket_dir = store.root().unwrap().join(&store.bucket);
    let path = bucket_dir.join(key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    let started = Instant::now();
    let result = archive.read_batch(key).await;
    assert!(started.elapsed() >= timeout, "gave up before the timeout");
    assert_transient("read while hanging", result, started, timeout);
    // Release the blocked reader thread (it reads an empty object and ends).
    drop(std::fs::OpenOptions::new().write(true).open(&path).unwrap());
}
