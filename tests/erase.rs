//! Erasure: `spindle erase --bucket B` leaves no byte of B's payloads, headers or answer bodies
//! in any JobDB's files (a live one with jobs still in flight, a drained one), the archive's
//! objects or the router's Redis, while another bucket's bytes stay; the jobs still in flight
//! end `discarded` first and nothing of B is delivered after; the receipt is printed, stored
//! in the archive and true; an unreachable JobDB makes the run fail and a run again finishes
//! it; a run after that changes nothing.

mod common;

use std::io::Read as _;
use std::time::Duration;

use common::cluster::{s3_args, Cluster, SHARED_REDIS};
use common::procs::run_async;
use common::s3::{boto3_keys, boto3_read};
use common::*;
use serde_json::{json, Value};
use spindle::registry::inventory::{JobDbRecord, JobDbState};

/// An endpoint that fails every request, answering 500 with the request's body: a job's
/// answer bodies then carry its payload.
async fn echo_failing() -> String {
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(|body: bytes::Bytes| async move {
            (axum::http::StatusCode::INTERNAL_SERVER_ERROR, body)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

/// The jobs of one bucket whose payloads and headers carry `marker`: delivered ones (one
/// large), ones
/// that fail with the payload echoed until they expire into the archive, ones waiting a long
/// retry (in flight), and one under way for 3 s.
fn jobs_of(bucket: &str, marker: &str, cluster: &Cluster, echo: &str, live: bool) -> Vec<Value> {
    let job = |endpoint: String, i: usize, extra: Value| {
        let mut job = json!({
            "bucket": bucket,
            "endpoint": endpoint,
            "payload": {"secret": format!("{marker}-payload-{i}")},
            "headers": {"x-secret": format!("{marker}-header")},
            "idempotency_key": format!("customer-1/{i}"),
            "ttl_ms": 600_000,
        });
        job.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        job
    };
    let mut jobs: Vec<Value> = (0..10)
        .map(|i| job(cluster.sink.url("/ok"), i, json!({})))
        .collect();
    // Large enough that InnoDB keeps it off the row's page: what an UPDATE frees but leaves.
    let big = format!("{marker}-big-").repeat(2_000);
    jobs.push(job(
        cluster.sink.url("/ok"),
        19,
        json!({"payload": {"secret": big}}),
    ));
    jobs.extend((10..14).map(|i| {
        job(
            echo.to_owned(),
            i,
            json!({"ttl_ms": 2500, "backoff_min_delay_ms": 300, "backoff_coefficient": 1.0}),
        )
    }));
    if live {
        jobs.extend((14..18).map(|i| {
            job(
                cluster.sink.url("/status/503"),
                i,
                json!({"backoff_min_delay_ms": 3_600_000}),
            )
        }));
        jobs.push(job(cluster.sink.url("/slow/3000"), 18, json!({})));
    }
    jobs
}

/// The JobDB a Director of the catalog serves, other than `except`, once there is one.
async fn served_jobdb(cluster: &Cluster, except: Option<&str>) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut served = cluster.catalog().await.into_values();
        if let Some(name) = served.find(|n| Some(n.as_str()) != except) {
            return name;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Director in the catalog"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `needle` occurs in `hay`.
fn holds(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Every byte of a database's files on the shared MariaDB (its directory under `@@datadir`),
/// once the server has written the tables' changed pages there (`FLUSH TABLES ... FOR
/// EXPORT`): what a raw grep of the disk would find.
async fn database_files(cluster: &Cluster, name: &str) -> Vec<u8> {
    let server = sqlx::MySqlPool::connect(&format!("{}/{name}", cluster.mysql))
        .await
        .unwrap();
    let dir: String = sqlx::query_scalar("SELECT @@datadir")
        .fetch_one(&server)
        .await
        .unwrap();
    let mut conn = server.acquire().await.unwrap();
    sqlx::raw_sql("FLUSH TABLES jobs, job_state_transitions, events FOR EXPORT")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    server.close().await;
    let mut all = Vec::new();
    let path = std::path::Path::new(&dir).join(name);
    for entry in std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        let entry = entry.unwrap();
        all.extend(std::fs::read(entry.path()).unwrap());
    }
    all
}

/// Every archive object, gunzipped where it is gzip.
async fn archive_bytes(cluster: &Cluster) -> Vec<u8> {
    let endpoint = cluster.s3().moto_endpoint();
    let mut all = Vec::new();
    for key in boto3_keys(&endpoint, cluster.bucket()).await {
        let data = boto3_read(&endpoint, cluster.bucket(), &key).await;
        if key.ends_with(".gz") {
            flate2::read::GzDecoder::new(&data[..])
                .read_to_end(&mut all)
                .unwrap();
        } else {
            all.extend(data);
        }
    }
    all
}

/// Every value (DUMP) and key of this cluster in the shared Redis.
async fn redis_bytes(tag: &str) -> Vec<u8> {
    let mut all = Vec::new();
    for db in 0..2 {
        let client = redis::Client::open(format!("{SHARED_REDIS}/{db}")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(format!("{tag}:*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        for key in keys {
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            all.extend(key);
            all.extend(dump);
        }
    }
    all
}

/// Runs `spindle erase` for bucket `bucket` over the cluster's inventory and archive.
async fn erase(cluster: &Cluster, bucket: &str, receipt: &std::path::Path) -> (bool, Value) {
    let consul = cluster.consul_url();
    let mut args: Vec<String> = [
        "erase",
        "--bucket",
        bucket,
        "--registry",
        "consul",
        "--consul-addr",
        &consul,
        "--wait-secs",
        "20",
        "--json",
        "--receipt",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(receipt.display().to_string());
    args.extend(s3_args(cluster.s3(), cluster.bucket()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_async(&args).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let receipt: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "a JSON receipt ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), receipt)
}

fn sum(receipt: &Value, field: &str) -> u64 {
    receipt["jobdbs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j[field].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erase_leaves_no_byte_of_a_bucket_anywhere_and_a_true_receipt() {
    let cluster = Cluster::builder("erase")
        .jobdbs(2)
        .redis(None)
        .s3()
        .control()
        .start()
        .await;
    let echo = echo_failing().await;
    let (gone, kept) = ("acme", "other");
    let gone_marker = format!("ERASEME{}", cluster.tag);
    let kept_marker = format!("KEEPME{}", cluster.tag);

    // The older Director's JobDB ends up drained: its jobs end, it stops, the state is set.
    let mut older = cluster.director("d1");
    cluster.wait_ready([&older]).await;
    let older_db = served_jobdb(&cluster, None).await;
    for (bucket, marker) in [(gone, &gone_marker), (kept, &kept_marker)] {
        submit(
            &cluster.client,
            &older.base(),
            jobs_of(bucket, marker, &cluster, &echo, false),
        )
        .await;
    }
    let older_reader = cluster.open(&older_db).await;
    wait_all_final(&older_reader, 30, Duration::from_secs(60)).await;
    older.term().await;
    let listed = cluster.inventory.get(&older_db).await.unwrap().unwrap();
    cluster
        .inventory
        .set_state(&listed, JobDbState::Drained, "test")
        .await
        .unwrap();

    // The live Director, behind the router, with jobs in flight when the erasure starts.
    let live = cluster.director("d0");
    cluster.wait_ready([&live]).await;
    let live_db = served_jobdb(&cluster, Some(&older_db)).await;
    let router = cluster.spawn_router(1, &[]);
    wait_for(
        Duration::from_secs(30),
        "the router sees the Director",
        || async {
            match cluster
                .client
                .get(format!("{}/readyz", router.base()))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => {
                    r.text().await.is_ok_and(|t| t.contains("1 directors"))
                }
                _ => false,
            }
        },
    )
    .await;
    for (bucket, marker) in [(gone, &gone_marker), (kept, &kept_marker)] {
        submit(
            &cluster.client,
            &router.base(),
            jobs_of(bucket, marker, &cluster, &echo, true),
        )
        .await;
        let event = json!({"bucket": bucket, "event_type": "order.paid",
                           "payload": {"secret": format!("{marker}-event")}});
        let published = cluster
            .client
            .post(format!("{}/v1/events", live.base()))
            .json(&event)
            .send()
            .await
            .unwrap();
        assert!(
            published.status().is_success(),
            "{:?}",
            published.text().await
        );
    }
    let live_reader = cluster.open(&live_db).await;
    // The expiring jobs are archived, the rest delivered or waiting.
    wait_for(
        Duration::from_secs(60),
        "the expired jobs archived",
        || async {
            live_reader
                .count_transitions_into(spindle::job::State::Archived)
                .await
                .unwrap()
                >= 8
        },
    )
    .await;
    assert!(holds(
        &database_files(&cluster, &live_db).await,
        &gone_marker
    ));
    assert!(holds(&archive_bytes(&cluster).await, &gone_marker));

    let mut named = 0;
    for reader in [&live_reader, &older_reader] {
        let ids: Vec<_> = histories(reader).await.into_keys().collect();
        let jobs = reader.get_jobs(&ids).await.unwrap();
        named += jobs.iter().filter(|j| *j.bucket == *gone).count() as u64;
    }
    assert_eq!(named, 15 + 20);

    // A JobDB the run cannot reach: the run does the rest, says so, and fails.
    let unreachable = JobDbRecord {
        name: format!("{}_gone", cluster.tag),
        url: "mysql://root@127.0.0.1:1/nowhere".into(),
        state: JobDbState::Retiring,
        changed_at: chrono::Utc::now(),
        changed_by: "test".into(),
    };
    assert!(cluster.inventory.add(&unreachable).await.unwrap());
    let file = std::env::temp_dir().join(format!("{}-receipt.json", cluster.tag));
    let (ok, first) = erase(&cluster, gone, &file).await;
    assert!(!ok, "an unreachable JobDB fails the run: {first:#}");
    let unreached = first["unreached"].as_array().unwrap();
    assert_eq!(unreached.len(), 1, "{first:#}");
    assert!(unreached[0].as_str().unwrap().contains(&unreachable.name));
    assert_eq!(
        sum(&first, "discarded"),
        4,
        "the waiting retries: {first:#}"
    );
    assert_eq!(sum(&first, "not_ended"), 0, "{first:#}");
    assert_eq!(sum(&first, "jobs"), named, "{first:#}");
    assert!(sum(&first, "answers") >= 8, "{first:#}");
    assert_eq!(sum(&first, "events"), 1, "{first:#}");
    let archive = &first["archive"];
    assert_eq!(archive["jobs"].as_u64(), Some(8), "{first:#}");
    assert!(archive["batches_rewritten"].as_u64().unwrap() >= 1);
    let stored_key = archive["receipt_key"].as_str().unwrap();
    let stored: Value = serde_json::from_slice(
        &boto3_read(&cluster.s3().moto_endpoint(), cluster.bucket(), stored_key).await,
    )
    .unwrap();
    assert_eq!(stored["id"], first["id"]);
    assert_eq!(stored["jobdbs"], first["jobdbs"]);
    let written: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(written, first);

    // Nothing of the bucket is sent once the run ended.
    let finished = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ids: Vec<_> = histories(&live_reader).await.into_keys().collect();
    let gone_ids: std::collections::HashSet<String> = live_reader
        .get_jobs(&ids)
        .await
        .unwrap()
        .into_iter()
        .filter(|j| *j.bucket == *gone)
        .map(|j| j.id.to_string())
        .collect();
    let gone_after: Vec<_> = cluster
        .sink
        .received()
        .into_iter()
        .filter(|r| r.at > finished && gone_ids.contains(&r.job_id))
        .collect();
    assert!(
        gone_after.is_empty(),
        "sent after the erasure: {gone_after:?}"
    );

    // No byte of the bucket left; the other bucket's bytes all there.
    for name in [&live_db, &older_db] {
        let files = database_files(&cluster, name).await;
        assert!(
            !holds(&files, &gone_marker),
            "{name} still holds the erased bytes"
        );
        assert!(holds(&files, &format!("{kept_marker}-payload-")), "{name}");
        assert!(holds(&files, &format!("{kept_marker}-header")), "{name}");
    }
    let archived = archive_bytes(&cluster).await;
    assert!(
        !holds(&archived, &gone_marker),
        "the archive holds the erased bytes"
    );
    assert!(holds(&archived, &kept_marker));
    assert!(!holds(&redis_bytes(&cluster.tag).await, &gone_marker));

    // Every job of the bucket ended once, in flight ones discarded for the erasure, and is
    // marked; the other bucket's jobs keep their payloads.
    for reader in [&live_reader, &older_reader] {
        let histories = histories(reader).await;
        let ids: Vec<_> = histories.keys().copied().collect();
        for job in reader.get_jobs(&ids).await.unwrap() {
            let history = &histories[&job.id];
            assert_legal(history);
            if *job.bucket == *gone {
                assert!(job.payload.is_empty() && job.headers.is_empty());
                let last = history.last().unwrap();
                if job.endpoint.contains("/status/503") {
                    assert_eq!(last.state, spindle::job::State::Discarded);
                    let note = last.error_response.as_deref().unwrap_or(b"");
                    let note = String::from_utf8_lossy(note);
                    assert!(
                        note.ends_with(": erased"),
                        "the command's note stays: {note}"
                    );
                }
            } else {
                assert!(holds(&job.payload, &kept_marker));
            }
        }
    }

    // The place it could not reach is gone: a run again finishes, then one more changes nothing.
    let listed = cluster
        .inventory
        .get(&unreachable.name)
        .await
        .unwrap()
        .unwrap();
    cluster
        .inventory
        .set_state(&listed, JobDbState::Dropped, "test")
        .await
        .unwrap();
    for _ in 0..2 {
        let (ok, again) = erase(&cluster, gone, &file).await;
        assert!(ok, "{again:#}");
        for field in ["discarded", "jobs", "answers", "events", "not_ended"] {
            assert_eq!(sum(&again, field), 0, "{field}: {again:#}");
        }
        assert_eq!(again["archive"]["batches_rewritten"].as_u64(), Some(0));
        assert_eq!(again["archive"]["jobs"].as_u64(), Some(0));
    }
    let _ = std::fs::remove_file(&file);
    drop((live, router));
    cluster.stop().await;
}
