//! Jobs moved out of a retiring JobDB: scheduled jobs keep their times, completion notices are
//! moved and told, a job a live Director refuses waits for one that takes it, and a Director
//! with a small request limit takes a batch one job at a time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle::job::{JobId, State};
use spindle::registry::inventory::JobDbState;

use crate::common::*;
use crate::{fill_retired, start};

/// A job of bucket `b` to `endpoint`, empty, as a test writes it straight into a JobDB.
fn stored_job(
    endpoint: String,
    created_at: chrono::DateTime<chrono::Utc>,
    expire_at: chrono::DateTime<chrono::Utc>,
) -> spindle::job::Job {
    spindle::job::Job {
        id: JobId(ulid::Ulid::new()),
        bucket: "b".into(),
        endpoint: endpoint.into(),
        method: "POST".into(),
        headers: vec![],
        payload: bytes::Bytes::new(),
        execution_timeout: Duration::from_secs(5),
        retry: spindle::job::RetryPolicy {
            min_delay: Duration::from_millis(100),
            coefficient: 2.0,
        },
        created_at,
        expire_at,
        idempotency_key: None,
        on_complete: None,
        ordering: None,
        event: None,
        trace: None,
    }
}

/// A retiring JobDB hands its scheduled jobs on with their times: the live Director delivers
/// the one due in seconds at its time, not before, and keeps tomorrow's waiting, untried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retiring_jobdb_hands_scheduled_jobs_on_with_their_times() {
    use spindle::job::{Job, Transition};
    let life = start().await;
    let (retired, db) = life.add_jobdb("sched", JobDbState::Retiring).await;
    let token = db.take_ownership("test").await.unwrap();
    let started = (Instant::now(), chrono::Utc::now());
    let now = started.1;
    let times = [
        now + chrono::Duration::seconds(6),
        now + chrono::Duration::days(1),
    ];
    let jobs: Vec<Arc<Job>> = times
        .iter()
        .map(|at| {
            Arc::new(stored_job(
                life.sink.url("/ok"),
                now,
                *at + chrono::Duration::hours(1),
            ))
        })
        .collect();
    let rows: Vec<(u64, Transition)> = jobs
        .iter()
        .zip(times)
        .enumerate()
        .map(|(i, (job, at))| (i as u64 + 1, Transition::scheduled(job.id, now, at)))
        .collect();
    db.append(token, &jobs, &rows).await.unwrap();
    db.close().await;
    let (spare, spare_db) = life.add_jobdb("schedto", JobDbState::Spare).await;
    let mut director = life.director("d1");
    life.wait_owned(&spare, "the director on the spare").await;
    let mut drainer = life.drainer("dr");
    life.wait_drained(&retired, Duration::from_secs(60)).await;
    let drained = started.0.elapsed();
    wait_for(
        Duration::from_secs(20),
        "the job due in seconds",
        || async { life.sink.ok_total() >= 1 },
    )
    .await;
    let got = life.sink.received();
    assert_eq!(got.len(), 1, "tomorrow's job waits");
    assert_eq!(got[0].job_id, jobs[0].id.to_string());
    let arrived = got[0].at - started.0;
    println!("drained in {drained:?}; the job due at 6 s arrived at {arrived:?}");
    assert!(drained < Duration::from_secs(6), "drained too late to tell");
    assert!(arrived >= Duration::from_millis(5_950) && arrived < Duration::from_secs(8));
    let open = spare_db.open_work().await.unwrap();
    let tomorrow = open
        .iter()
        .find(|r| r.job_id == jobs[1].id)
        .expect("tomorrow's job is open in the live jobdb");
    assert_eq!(tomorrow.progress.attempts, 0);
    let kept = tomorrow.progress.retry_at.expect("its time") - times[1];
    assert!(
        kept.num_milliseconds().abs() <= 1,
        "moved {kept} off its time"
    );
    drainer.term().await;
    director.term().await;
    life.stop().await;
}

/// Completion notices survive JobDB cycling. In a retiring JobDB, one job asking to be told
/// has expired (the drainer archives it: its notice is written there, with the `archived`
/// row, and moved on like any waiting job) and another waits for its first attempt (it moves
/// with its URL, and the live Director writes its notice when it succeeds). Each notice
/// arrives once, saying how its job ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_notices_are_moved_and_told_across_a_drain() {
    use spindle::job::{Job, Transition};
    let life = start().await;
    let (retired, db) = life.add_jobdb("told", JobDbState::Retiring).await;
    let token = db.take_ownership("test").await.unwrap();
    let now = chrono::Utc::now();
    let job = |expire_at| {
        Arc::new(Job {
            on_complete: Some(life.sink.url("/capture").into()),
            ..stored_job(
                life.sink.url("/ok"),
                now - chrono::Duration::minutes(10),
                expire_at,
            )
        })
    };
    let expired = job(now - chrono::Duration::minutes(1));
    let waiting = job(now + chrono::Duration::hours(1));
    let jobs = vec![expired.clone(), waiting.clone()];
    let rows: Vec<(u64, Transition)> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (i as u64 + 1, Transition::awaiting_scheduling(j)))
        .collect();
    db.append(token, &jobs, &rows).await.unwrap();
    assert_eq!(db.notices_owed().await.unwrap(), 2);
    db.close().await;
    let (spare, _spare_db) = life.add_jobdb("toldto", JobDbState::Spare).await;
    let mut director = life.director("d1");
    life.wait_owned(&spare, "the director on the spare").await;
    let mut drainer = life.drainer("dr");
    life.wait_drained(&retired, Duration::from_secs(60)).await;
    let captured = || {
        life.sink
            .received()
            .into_iter()
            .filter(|r| r.path == "/capture")
            .collect::<Vec<_>>()
    };
    wait_for(Duration::from_secs(20), "both notices", || async {
        captured().len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut told: HashMap<String, String> = HashMap::new();
    for r in captured() {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let id = body["job_id"].as_str().unwrap().to_owned();
        let state = body["state"].as_str().unwrap().to_owned();
        assert!(told.insert(id, state).is_none(), "one notice per job");
    }
    assert_eq!(told.len(), 2);
    // Expiry is the end: told at `archiving`, not when the archive confirms its copy.
    assert_eq!(told[&expired.id.to_string()], "archiving");
    assert_eq!(told[&waiting.id.to_string()], "succeeded");
    drainer.term().await;
    director.term().await;
    life.stop().await;
}

/// A job accepted once is never discarded because of where it is being moved. A retiring JobDB
/// holds 40 ordinary jobs and three odd ones: a bucket of 128 two-byte characters (once a valid
/// submission and an invalid import: both paths now share one validation, so it moves), a
/// 100 KiB payload (accepted by a Director with the default 1 MiB limit), and an `ftp://`
/// endpoint (an older version's row: no Director of this version can take it). The only live
/// Director runs with `--max-payload-bytes 65536`: it refuses the big job (413). Before, that
/// job ended `discarded`/`import-refused` like the invalid one. Now the drainer parks only the
/// invalid job (with why), keeps the big one waiting in the retired JobDB (a `move-refused`
/// row, counted, tried again with backoff, the JobDB not drained), and once a Director with
/// default limits comes, moves it there: it is delivered exactly once and the drain ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_live_director_refuses_waits_for_one_that_takes_it() {
    use spindle::job::{Job, RetryPolicy, Transition};
    let life = start().await;
    let (retired, db) = life.add_jobdb("refusing", JobDbState::Retiring).await;
    let (live, _) = fill_retired(&db, &life.sink, 40, 0).await;
    let now = chrono::Utc::now();
    let odd = |bucket: &str, endpoint: String, payload: Vec<u8>| Job {
        id: JobId(ulid::Ulid::new()),
        bucket: bucket.into(),
        endpoint: endpoint.into(),
        method: "POST".into(),
        headers: vec![("content-type".into(), "application/octet-stream".into())],
        payload: bytes::Bytes::from(payload),
        execution_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            min_delay: Duration::from_millis(100),
            coefficient: 2.0,
        },
        created_at: now,
        expire_at: now + chrono::Duration::hours(1),
        idempotency_key: None,
        on_complete: None,
        ordering: None,
        event: None,
        trace: None,
    };
    let wide = odd(&"é".repeat(128), life.sink.url("/ok"), b"{}".to_vec());
    let big = odd("b1", life.sink.url("/ok"), vec![b'x'; 100 * 1024]);
    let invalid = odd("b1", "ftp://files.example/up".into(), b"{}".to_vec());
    let (token, _) = db.owner().await.unwrap();
    let odd_ones = [&wide, &big, &invalid];
    let rows: Vec<(u64, Transition)> = odd_ones
        .iter()
        .enumerate()
        .map(|(i, job)| {
            (
                1_000_000 + i as u64,
                Transition::imported(job.id, 1, now, now),
            )
        })
        .collect();
    let jobs: Vec<Arc<Job>> = odd_ones.iter().map(|j| Arc::new((*j).clone())).collect();
    db.append(token, &jobs, &rows).await.unwrap();
    db.close().await;
    let (small, _small_db) = life.add_jobdb("small", JobDbState::Spare).await;
    let mut strict = life.director_with("d1", &["--max-payload-bytes", "65536"]);
    life.wait_owned(&small, "the strict director on its spare")
        .await;
    let mut drainer = life.drainer("dr");
    let old = life.open(&retired).await;

    // The target has answered for both odd jobs.
    wait_for(Duration::from_secs(60), "both refusals taken", || async {
        let h = histories(&old).await;
        let answered = |id: &JobId| {
            h.get(id).and_then(|h| h.last()).is_some_and(|t| {
                t.state.is_terminal() || t.error_type.as_deref() == Some("move-refused")
            })
        };
        answered(&big.id) && answered(&invalid.id)
    })
    .await;
    let last = histories(&old).await[&big.id].last().cloned().unwrap();
    assert_eq!(
        (last.state, last.error_type.as_deref()),
        (State::AwaitingRetry, Some("move-refused")),
        "the job the target refused for its own limit: {last:?}"
    );
    // It waits: refused (413) again and again, with its answer in a row, counted.
    let refusals = |text: &str, reason: &str| {
        metric_value(
            text,
            &format!("spindle_import_refusals_total{{reason=\"{reason}\"}}"),
        )
    };
    wait_for(
        Duration::from_secs(60),
        "the big job refused three times",
        || async {
            refusals(
                &metrics_text(&life.client, &drainer.base()).await,
                "target_limit",
            ) >= 3.0
        },
    )
    .await;
    let text = metrics_text(&life.client, &drainer.base()).await;
    assert_eq!(refusals(&text, "invalid"), 1.0, "{text}");
    assert_eq!(
        metric_value(
            &text,
            &format!("spindle_jobs_waiting_for_target{{jobdb=\"{retired}\"}}")
        ),
        1.0,
        "{text}"
    );
    let h = histories(&old).await;
    for id in live.iter().chain([&wide.id]) {
        assert_eq!(h[id].last().unwrap().state, State::Moved, "{id}");
    }
    let waiting = h[&big.id].last().unwrap();
    assert_legal(&h[&big.id]);
    assert_eq!(waiting.state, State::AwaitingRetry);
    assert_eq!(waiting.error_type.as_deref(), Some("move-refused"));
    let answer = String::from_utf8_lossy(waiting.error_response.as_deref().unwrap());
    assert!(
        answer.contains(&small) && answer.contains("413"),
        "{answer}"
    );
    println!("waiting: {answer}");
    // One row per answer, however often it is heard.
    let rows = h[&big.id]
        .iter()
        .filter(|t| t.error_type.as_deref() == Some("move-refused"))
        .count();
    assert_eq!(rows, 1);
    // The job no Director of this version can take is parked, saying why.
    let parked = h[&invalid.id].last().unwrap();
    assert_legal(&h[&invalid.id]);
    assert_eq!(parked.state, State::Discarded);
    assert_eq!(parked.error_type.as_deref(), Some("import-refused"));
    let why = String::from_utf8_lossy(parked.error_response.as_deref().unwrap());
    assert!(
        why.contains("no director of this version") && why.contains("endpoint"),
        "{why}"
    );
    println!("parked: {why}");
    // Not drained while a job waits (the manager would drop it).
    let state = life
        .inventory
        .get(&retired)
        .await
        .unwrap()
        .unwrap()
        .record
        .state;
    assert_eq!(state, JobDbState::Draining);

    // A Director with the default limits comes: the job moves there and is delivered once.
    let (roomy, roomy_db) = life.add_jobdb("roomy", JobDbState::Spare).await;
    let mut director = life.director("d2");
    life.wait_owned(&roomy, "the second director on its spare")
        .await;
    life.wait_drained(&retired, Duration::from_secs(90)).await;
    let h = histories(&old).await;
    assert_eq!(h[&big.id].last().unwrap().state, State::Moved);
    assert_legal(&h[&big.id]);
    assert_eq!(
        roomy_db.origin_of(big.id).await.unwrap().as_deref(),
        Some(retired.as_str())
    );
    let big_id = big.id.to_string();
    wait_for(Duration::from_secs(30), "the big job delivered", || async {
        life.sink.per_job().get(&big_id).copied().unwrap_or(0) >= 1
    })
    .await;
    let delivered = life.sink.received();
    let copies = delivered.iter().filter(|r| r.job_id == big_id).count();
    assert_eq!(copies, 1, "delivered exactly once");
    let text = metrics_text(&life.client, &drainer.base()).await;
    assert!(
        !text.contains(&format!(
            "spindle_jobs_waiting_for_target{{jobdb=\"{retired}\"}}"
        )),
        "{text}"
    );
    old.close().await;
    roomy_db.close().await;
    drainer.term().await;
    director.term().await;
    strict.term().await;
    life.stop().await;
}

/// A target whose request limit is below a batch refuses the batch without naming a job (413,
/// `body`). The drainer then sends its jobs one request each; those were not recorded `moved`
/// before, so the whole batch went again, was refused again, and the drain never ended. Now
/// each job that goes through alone is recorded at once and the drain ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_director_with_a_small_request_limit_takes_a_batch_one_job_at_a_time() {
    let life = start().await;
    let (retired, db) = life.add_jobdb("batchy", JobDbState::Retiring).await;
    let (live, _) = fill_retired(&db, &life.sink, 30, 0).await;
    db.close().await;
    let (spare, _spare_db) = life.add_jobdb("narrow", JobDbState::Spare).await;
    let mut director = life.director_with("d1", &["--max-request-bytes", "4096"]);
    life.wait_owned(&spare, "the director on the spare").await;
    let mut drainer = life.drainer("dr");
    life.wait_drained(&retired, Duration::from_secs(60)).await;
    let old = life.open(&retired).await;
    let h = histories(&old).await;
    for id in &live {
        assert_eq!(h[id].last().unwrap().state, State::Moved, "{id}");
        assert_legal(&h[id]);
    }
    let text = metrics_text(&life.client, &drainer.base()).await;
    assert_eq!(
        metric_value(&text, "spindle_jobs_moved_total"),
        30.0,
        "{text}"
    );
    old.close().await;
    drainer.term().await;
    director.term().await;
    life.stop().await;
}
