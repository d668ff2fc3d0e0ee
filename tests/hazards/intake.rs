//! Intake: every request a Director accepts is written, and only those. Rows of the largest
//! headers must not poison the group commit they share; a request the JobDB refuses fails
//! alone, its batch written; a router's forward is not stored after its deadline, wherever it
//! waits (in the writer's queue, at its commit, in a retry); what one Director accepts another
//! imports; and a tenant retrying in a loop cannot saturate the single writer.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use spindle::job::{JobId, State};

use crate::common::*;
use crate::{alone, calm_latencies, pct, shared, tail_within};

/// A router's forward of `jobs` to the rig's JobDB, to be stored only before `not_after`.
fn forward(
    rig: &Rig,
    jobs: Vec<spindle::rpc::import::ImportJob>,
    not_after: chrono::DateTime<Utc>,
) -> spindle::rpc::import::ImportRequest {
    spindle::rpc::import::ImportRequest {
        jobdb: rig.db.url.database.clone(),
        from_jobdb: None,
        not_after: Some(not_after),
        blocked_keys: Vec::new(),
        events: Vec::new(),
        jobs,
    }
}

/// Sends `request` in the background (its write is about to wait for a lock the test holds).
fn send_forward(
    rig: &Rig,
    request: spindle::rpc::import::ImportRequest,
) -> tokio::task::JoinHandle<Result<spindle::rpc::import::ImportResponse, spindle_client::Error>> {
    let api = rig.api();
    tokio::spawn(async move { api.import(&request).await })
}

/// Waits until `not_after` has passed (by 50 ms).
async fn wait_past(not_after: chrono::DateTime<Utc>) {
    wait_for(Duration::from_secs(5), "not_after to pass", || async {
        Utc::now() > not_after + chrono::Duration::milliseconds(50)
    })
    .await;
}

/// The answer of a forward sent with [`send_forward`], which must be the Director's 409.
async fn refused_late(
    sent: tokio::task::JoinHandle<
        Result<spindle::rpc::import::ImportResponse, spindle_client::Error>,
    >,
) -> spindle_client::ApiError {
    let refused = sent.await.unwrap().expect_err("stored after its not_after");
    let api = refused.api().expect("an error answer").clone();
    assert_eq!(api.status, 409, "{api}");
    api
}

/// Whether the Director's writer is waiting at the fence check of its JobDB (behind the
/// test's lock on the fence row): a statement of this database reading the owner row is
/// executing.
async fn writer_waits_for_a_lock(pool: &sqlx::MySqlPool) -> bool {
    let waiting: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE DB = DATABASE() AND COMMAND <> 'Sleep' \
           AND INFO LIKE 'SELECT fencing_token%FROM jobdb_owner%LOCK IN SHARE MODE'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    waiting > 0
}

/// A connection pool of the rig's JobDB, for the SQL a test runs beside the Director.
async fn jobdb_pool(rig: &Rig) -> sqlx::MySqlPool {
    sqlx::MySqlPool::connect_with(rig.db.url.mysql_options().unwrap())
        .await
        .unwrap()
}

/// Locks the JobDB's fence row in a transaction of the test's: the Director's writer waits at
/// its fence check until the transaction ends, and requests pile up in its queue meanwhile.
async fn hold_the_fence(pool: &sqlx::MySqlPool) -> sqlx::Transaction<'static, sqlx::MySql> {
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT fencing_token FROM jobdb_owner WHERE id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

/// `POST /v1/jobs` with `jobs`, in a task of its own; yields the answer's status.
fn post_jobs(rig: &Rig, jobs: Vec<serde_json::Value>) -> tokio::task::JoinHandle<u16> {
    let (client, base) = (rig.client.clone(), rig.base());
    tokio::spawn(async move {
        client
            .post(format!("{base}/v1/jobs"))
            .json(&json!({ "jobs": jobs }))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    })
}

/// Write requests waiting for the Director's writer (its `/metrics`).
async fn write_queue(rig: &Rig) -> f64 {
    metric_value(
        &metrics_text(&rig.client, &rig.base()).await,
        "spindle_jobdb_write_queue",
    )
}

/// Rows were sized by payload and endpoint only: valid jobs with 64 headers of 8 KiB made a
/// multi-row INSERT larger than `max_allowed_packet`, and the writer answered every request
/// batched with them 503, forever. Now every byte of a row counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_with_the_largest_headers_are_stored_with_their_neighbours() {
    let _machine = shared().await;
    // 20 MiB in one request: a debug build on shared cores may take longer to write it than
    // the default write timeout (5 s), which is not what this test is about.
    let rig = Rig::start("bigheaders", |c| {
        c.writer.write_timeout = Duration::from_secs(60)
    })
    .await;
    let headers: serde_json::Map<String, serde_json::Value> = (0..64)
        .map(|i| {
            let name = format!("x-big-{i:02}");
            let value = "h".repeat(8 * 1024 - name.len());
            (name, json!(value))
        })
        .collect();
    let big = rig.jobs(40, "/ok", json!({"headers": headers}));
    let small = rig.jobs(10, "/ok", json!({}));
    let base = rig.base();
    let (a, b) = tokio::join!(
        submit(&rig.client, &base, big),
        submit(&rig.client, &base, small)
    );
    assert_eq!(a.jobs.len() + b.jobs.len(), 50);
    // Stored whole: every header of every job comes back from the JobDB.
    let id: JobId = a.jobs[39].id.parse().unwrap();
    let stored = rig.reader.get_jobs(&[id]).await.unwrap().remove(0);
    assert!(
        stored
            .headers
            .iter()
            .filter(|(n, _)| n.starts_with("x-big-"))
            .count()
            == 64
    );
    assert_eq!(rig.reader.count_jobs().await.unwrap(), 50);
    // And delivered: each ends (the sink may refuse 512 KiB of headers: that is its answer).
    wait_all_final(&rig.reader, 50, Duration::from_secs(60)).await;
    rig.stop().await;
}

/// The JobDB refuses one request's data (a trigger stands in for any value the server will
/// never take): the writer used to treat it as "maybe committed" and answer every request of
/// the batch 503 on every retry. Now the batch is split until the refused request is alone:
/// it gets a 422 naming the reason, and everything batched with it is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_fails_alone_and_its_batch_is_written() {
    let _machine = shared().await;
    let rig = Rig::start("refused", |_| {}).await;
    let pool = jobdb_pool(&rig).await;
    sqlx::raw_sql(
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON jobs FOR EACH ROW \
         IF NEW.bucket = 'poison' THEN \
           SIGNAL SQLSTATE '22003' SET MYSQL_ERRNO = 1264, MESSAGE_TEXT = 'refused by the test'; \
         END IF",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Requests pile up behind the held fence and go in one batch.
    let holder = hold_the_fence(&pool).await;
    let first = post_jobs(&rig, rig.jobs(1, "/ok", json!({})));
    wait_for(Duration::from_secs(10), "the first commit to wait", || {
        writer_waits_for_a_lock(&pool)
    })
    .await;
    let poison = post_jobs(
        &rig,
        vec![json!({"bucket": "poison", "endpoint": rig.sink.url("/ok")})],
    );
    let healthy: Vec<_> = (0..5)
        .map(|_| post_jobs(&rig, rig.jobs(3, "/ok", json!({}))))
        .collect();
    wait_for(Duration::from_secs(10), "six requests queued", || async {
        write_queue(&rig).await >= 6.0
    })
    .await;
    holder.rollback().await.unwrap();
    assert_eq!(first.await.unwrap(), 202);
    assert_eq!(poison.await.unwrap(), 422, "the refused request");
    for h in healthy {
        assert_eq!(
            h.await.unwrap(),
            202,
            "a request batched with the refused one"
        );
    }
    rig.wait_in_state(State::Succeeded, 16, Duration::from_secs(20))
        .await;
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert_eq!(
        metric_value(
            &text,
            r#"spindle_jobdb_write_rejections_total{op="submit",reason="refused"}"#
        ),
        1.0,
        "{text}"
    );
    pool.close().await;
    rig.stop().await;
}

/// `not_after` was checked before the write was queued; a forward that waited in the writer's
/// queue past it was stored anyway, after its claim could have been taken over. It now travels
/// with the write and is checked when the batch is assembled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_whose_deadline_passes_in_the_writer_queue_is_refused() {
    let _machine = shared().await;
    let rig = Rig::start("notafter", |_| {}).await;
    let pool = jobdb_pool(&rig).await;
    let holder = hold_the_fence(&pool).await;
    let blocker = post_jobs(&rig, rig.jobs(1, "/ok", json!({})));
    wait_for(
        Duration::from_secs(10),
        "the blocker's commit to wait",
        || writer_waits_for_a_lock(&pool),
    )
    .await;
    let not_after = Utc::now() + chrono::Duration::milliseconds(300);
    let id = ulid::Ulid::new();
    let job = spindle::rpc::import::ImportJob {
        idempotency_key: Some("k".into()),
        on_complete: None,
        ..import_form(id, rig.sink.url("/ok"), 0)
    };
    let sent = send_forward(&rig, forward(&rig, vec![job], not_after));
    wait_for(Duration::from_secs(10), "the forward queued", || async {
        write_queue(&rig).await >= 1.0
    })
    .await;
    wait_past(not_after).await;
    holder.rollback().await.unwrap();
    assert_eq!(blocker.await.unwrap(), 202);
    let api = refused_late(sent).await;
    assert_eq!(api.field.as_deref(), Some("not_after"));
    assert!(rig.reader.get_jobs(&[JobId(id)]).await.unwrap().is_empty());
    pool.close().await;
    rig.stop().await;
}

/// A forward taken into a transaction before its `not_after` was committed after it when the
/// transaction had to wait (here at its fence check, behind the test's lock on the owner row):
/// the deadline was checked when the batch was assembled only. It is now checked again right
/// before the COMMIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_whose_deadline_passes_while_its_commit_waits_is_not_stored() {
    let _machine = shared().await;
    let rig = Rig::start("notafter_commit", |_| {}).await;
    let pool = jobdb_pool(&rig).await;
    let holder = hold_the_fence(&pool).await;
    let not_after = Utc::now() + chrono::Duration::milliseconds(300);
    let id = ulid::Ulid::new();
    let job = import_form(id, rig.sink.url("/ok"), 0);
    let sent = send_forward(&rig, forward(&rig, vec![job], not_after));
    wait_for(
        Duration::from_secs(10),
        "the forward's commit to wait at the fence",
        || writer_waits_for_a_lock(&pool),
    )
    .await;
    wait_past(not_after).await;
    holder.rollback().await.unwrap();
    let api = refused_late(sent).await;
    assert_eq!(api.field.as_deref(), Some("not_after"));
    assert!(rig.reader.get_jobs(&[JobId(id)]).await.unwrap().is_empty());
    // The Director writes on: the next forward is stored.
    let next = forward(
        &rig,
        vec![import_form(ulid::Ulid::new(), rig.sink.url("/ok"), 0)],
        Utc::now() + chrono::Duration::seconds(30),
    );
    assert_eq!(rig.api().import(&next).await.unwrap().imported, 1);
    pool.close().await;
    rig.stop().await;
}

/// A forward retried by the writer (an earlier try of the same request had stored one of its
/// jobs: the JobDB refused the duplicate, the writer left that job out and wrote the rest) was
/// committed again without a look at its `not_after`, which had passed while the first try
/// waited. Every try now checks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_retried_after_its_deadline_is_not_stored() {
    let _machine = shared().await;
    let rig = Rig::start("notafter_retry", |_| {}).await;
    let pool = jobdb_pool(&rig).await;
    let forward = |ids: &[ulid::Ulid], not_after| {
        let jobs = ids
            .iter()
            .map(|id| import_form(*id, rig.sink.url("/ok"), 0))
            .collect();
        forward(&rig, jobs, not_after)
    };
    // The first try of a forward stored its first job (its answer was lost, say).
    let (stored, new) = (ulid::Ulid::new(), ulid::Ulid::new());
    let far = Utc::now() + chrono::Duration::seconds(30);
    assert_eq!(
        rig.api()
            .import(&forward(&[stored], far))
            .await
            .unwrap()
            .imported,
        1
    );
    // The router sends it again with both jobs; the INSERT waits on the stored job's row.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = ? FOR UPDATE")
        .bind(JobId(stored).to_bytes().to_vec())
        .execute(&mut *holder)
        .await
        .unwrap();
    let not_after = Utc::now() + chrono::Duration::milliseconds(300);
    let sent = send_forward(&rig, forward(&[stored, new], not_after));
    wait_for(
        Duration::from_secs(10),
        "the retry's insert to wait for the row",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE DB = DATABASE() AND COMMAND <> 'Sleep' AND INFO LIKE 'INSERT INTO jobs%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            waiting > 0
        },
    )
    .await;
    wait_past(not_after).await;
    holder.rollback().await.unwrap();
    refused_late(sent).await;
    assert!(rig.reader.get_jobs(&[JobId(new)]).await.unwrap().is_empty());
    pool.close().await;
    rig.stop().await;
}

/// A bucket of 128 two-byte characters was accepted by a submit (the column counts characters)
/// and refused by an import (128 bytes), so a drainer could never move it. One validation now
/// serves both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_director_accepts_another_imports() {
    let _machine = shared().await;
    let rig = Rig::start("sameimport", |_| {}).await;
    let bucket = "é".repeat(128);
    let reply = rig
        .submit(vec![
            json!({"bucket": bucket, "endpoint": rig.sink.url("/status/500"),
                            "backoff_min_delay_ms": 600_000}),
        ])
        .await;
    let id: JobId = reply.jobs[0].id.parse().unwrap();
    rig.wait_in_state(State::AwaitingRetry, 1, Duration::from_secs(20))
        .await;
    let job = rig.reader.get_jobs(&[id]).await.unwrap().remove(0);
    // The same job, moved to another Director as a drainer would.
    let other = Rig::start("sameimport2", |_| {}).await;
    let moved = spindle::rpc::import::ImportRequest {
        jobdb: other.db.url.database.clone(),
        from_jobdb: Some(rig.db.url.database.clone()),
        not_after: None,
        blocked_keys: Vec::new(),
        events: Vec::new(),
        jobs: vec![spindle::rpc::import::import_job(&job, 1, Utc::now())],
    };
    let answer = other.api().import(&moved).await.expect("imported");
    assert_eq!(answer.imported, 1);
    // And what a submit refuses, an import refuses too, naming the same field.
    let mut bad = moved.clone();
    bad.jobs[0].bucket = "b".repeat(129);
    let refused = other.api().import(&bad).await.expect_err("refused");
    assert_eq!(
        refused.api().unwrap().field.as_deref(),
        Some("jobs[0].bucket")
    );
    bad.jobs[0].bucket = "b".into();
    bad.jobs[0].headers = vec![("host".into(), "evil".into())];
    let refused = other.api().import(&bad).await.expect_err("refused");
    assert_eq!(
        refused.api().unwrap().field.as_deref(),
        Some("jobs[0].headers.host")
    );
    other.stop().await;
    rig.stop().await;
}

/// A tenant whose jobs retry every millisecond (coefficient 1.0, 30-day TTL) against an endpoint
/// answering 429 forever wrote rows as fast as the writer could commit, and a job's attempts
/// wrapped its u16 counter. Now the delay has a floor, a 429-answering endpoint is probed like
/// a down one (no sooner than it asks), a job's attempts are bounded, and a calm tenant's
/// latency does not notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_retrying_in_a_loop_cannot_saturate_the_writer() {
    let _machine = alone().await;
    let rig = Rig::start("looping", |c| c.scheduler.max_attempts = 50).await;
    let calm = |rig: &Rig| {
        (0..5)
            .map(|_| json!({"bucket": "calm", "endpoint": rig.sink.url("/ok")}))
            .collect::<Vec<_>>()
    };
    let baseline = calm_latencies(&rig, calm, Duration::from_secs(3)).await;
    // The loop: 300 jobs, retried after 1 ms, for 30 days, against 429 forever.
    let looping: Vec<_> = (0..300)
        .map(|_| {
            json!({"bucket": "loud", "endpoint": rig.sink.url("/status/429"),
                   "backoff_min_delay_ms": 1, "backoff_coefficient": 1.0,
                   "ttl_ms": 30u64 * 24 * 3600 * 1000})
        })
        .collect();
    rig.submit(looping).await;
    let beside = calm_latencies(&rig, calm, Duration::from_secs(5)).await;
    let loud_attempts = rig
        .sink
        .received()
        .iter()
        .filter(|r| r.path == "/status/429")
        .count();
    let (b50, b95) = (pct(&baseline, 0.5), pct(&baseline, 0.95));
    let (l50, l95) = (pct(&beside, 0.5), pct(&beside, 0.95));
    println!(
        "calm tenant p50/p95 {b50:.1}/{b95:.1} ms alone, {l50:.1}/{l95:.1} ms beside a 429 loop \
         of 300 jobs; loop made {loud_attempts} requests in 5 s"
    );
    // Without the fixes the loop makes tens of thousands of requests in 5 s.
    assert!(
        loud_attempts < 1_000,
        "{loud_attempts} requests from the loop"
    );
    assert!(l50 <= b50 * 1.5 + 20.0, "p50 {b50:.1} → {l50:.1} ms");
    let l95 = tail_within(
        l95,
        b95 * 1.5 + 50.0,
        "calm tenant p95 beside the loop",
        || async {
            pct(
                &calm_latencies(&rig, calm, Duration::from_secs(5)).await,
                0.95,
            )
        },
    )
    .await;
    assert!(l95 <= b95 * 1.5 + 50.0, "p95 {b95:.1} → {l95:.1} ms");

    // Attempts are bounded: a job imported with 65,535 attempts (the u16's last value) ends
    // `max-attempts` without a request instead of wrapping (or panicking the scheduler).
    let tired = ulid::Ulid::new();
    let import = spindle::rpc::import::ImportRequest {
        jobdb: rig.db.url.database.clone(),
        from_jobdb: Some("elsewhere".into()),
        not_after: None,
        blocked_keys: Vec::new(),
        events: Vec::new(),
        jobs: vec![import_form(tired, rig.sink.url("/ok"), u16::MAX)],
    };
    rig.api().import(&import).await.expect("imported");
    wait_for(Duration::from_secs(10), "the tired job to end", || async {
        histories(&rig.reader)
            .await
            .get(&JobId(tired))
            .and_then(|h| h.last().map(|t| t.state))
            == Some(State::Discarded)
    })
    .await;
    let h = histories(&rig.reader).await;
    let last = h[&JobId(tired)].last().unwrap().clone();
    assert_eq!(last.error_type.as_deref(), Some("max-attempts"));
    assert_eq!(last.attempts, u16::MAX);
    assert!(rig
        .sink
        .received()
        .iter()
        .all(|r| r.job_id != tired.to_string()));
    rig.stop().await;
}
