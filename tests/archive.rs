//! The S3 archive against a real S3-compatible server (moto, behind a fault proxy): what
//! `put_batch` stores is read back with boto3, an independent client, and checked job by job;
//! writing a batch twice is harmless; a failing, unreachable or hanging store gives a transient
//! error within the configured timeout and leaves nothing behind.

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use chrono::Utc;
use rand::Rng;
use serde_json::Value;
use spindle::archive::{encode_batch, Archive, ArchiveError, ArchivedJob, BatchKind};
use spindle::job::{AttemptRecord, Job, JobId, RetryPolicy, State, Transition};
use ulid::Ulid;

use common::s3::{boto3_dump, boto3_keys, boto3_read, unique_bucket, Mode, S3Server};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_reads_back_job_by_job_with_an_independent_client() {
    let s3 = S3Server::start().await;
    let bucket = unique_bucket("put");
    let mut config = s3.config(&bucket);
    config.prefix = "spindle/".to_owned();
    let archive = Archive::connect(&config).await.expect("connect");
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

    // Straight from moto, not through the proxy, with boto3.
    let mut listed = boto3_keys(&s3.moto_endpoint(), &bucket).await;
    listed.sort();
    assert_eq!(listed, vec![manifest_key.clone(), object_key.clone()]);
    let dump = boto3_dump(&s3.moto_endpoint(), &bucket).await;
    assert_eq!(sorted_keys(&dump), listed);

    let object = &dump[&object_key];
    assert_eq!(
        object["sha256"],
        manifest.sha256.as_str(),
        "sha256 computed by Python"
    );
    assert_eq!(object["metadata"]["sha256"], manifest.sha256.as_str());
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

    // The bytes on the server are exactly the deterministic encoding.
    let raw = boto3_read(&s3.moto_endpoint(), &bucket, &object_key).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_a_batch_twice_leaves_one_identical_batch() {
    let s3 = S3Server::start().await;
    let bucket = unique_bucket("idem");
    let config = s3.config(&bucket);
    let archive = Archive::connect(&config).await.expect("connect");
    let (_, mut archived) = expired_jobs(40);
    for job in &mut archived {
        job.moved_to = Some("jobdb_next".to_owned());
    }
    let batch = Ulid::new();

    let first = archive
        .put_batch(JOBDB, BatchKind::History, batch, &archived)
        .await
        .expect("first put");
    let after_first = boto3_dump(&s3.moto_endpoint(), &bucket).await;
    // A restarted drainer writes the same batch again with a new connection.
    let again = Archive::connect(&config).await.expect("reconnect");
    let second = again
        .put_batch(JOBDB, BatchKind::History, batch, &archived)
        .await
        .expect("second put");
    let after_second = boto3_dump(&s3.moto_endpoint(), &bucket).await;

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
    assert_eq!(archive.manifests(None).await.unwrap(), vec![first]);
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

    // Permanent errors are not transient: a missing object, a missing bucket.
    let missing = archive
        .read_batch("no/such/key.ndjson.gz")
        .await
        .unwrap_err();
    assert!(matches!(missing, ArchiveError::Rejected(_)), "{missing}");
    let mut elsewhere = s3.config(&unique_bucket("absent"));
    elsewhere.create_bucket = false;
    let absent = Archive::connect(&elsewhere).await.expect("connect lazily");
    let err = absent
        .put_batch(JOBDB, BatchKind::Expired, Ulid::new(), &archived)
        .await
        .unwrap_err();
    assert!(!err.is_transient(), "missing bucket: {err}");
}
