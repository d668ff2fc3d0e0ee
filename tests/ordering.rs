//! Ordered delivery per key (`ordering_key`): the jobs of one (bucket, endpoint, key) reach
//! the endpoint one at a time, in the order they were accepted, across a restart; a key whose
//! job keeps failing holds only its own later jobs; a job that asked to block its key stops it
//! until an operator releases it. Against a real Director, MariaDB and SQLite, real HTTP over
//! loopback (the cluster case, through a router with a kill -9, a retirement and a drain, is
//! in `tests/lifecycle.rs`).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use spindle::cli::sink::Received;
use spindle::job::State;
use spindle::jobdb::{JobDb, JobDbUrl};

on_both_engines!(
    ordered_keys_go_one_at_a_time_in_acceptance_order_across_a_restart,
    a_blocking_failure_holds_its_key_until_an_operator_releases_it,
    an_expired_job_lets_its_key_go_at_once_and_a_held_one_expires_on_time,
    an_operator_flush_or_discard_of_a_held_job_ends_it_and_never_blocks_its_key,
    a_scheduled_ordered_job_holds_its_key_until_its_time,
    alone_each_job_of_a_key_begins_in_the_commit_that_ends_the_one_before,
    jobs_born_released_into_a_full_cache_rest_and_go,
);

fn fast_retries(c: &mut spindle::director::DirectorConfig) {
    c.scheduler.min_retry_delay = Duration::from_millis(10);
}

/// An ordered job to `url` of key `key`, numbered `i`, with more fields from `extra`.
fn ordered(url: &str, key: &str, i: usize, extra: Value) -> Value {
    let mut job = json!({"bucket": "o", "endpoint": url, "ordering_key": key,
        "backoff_min_delay_ms": 10, "backoff_coefficient": 1.0, "payload": {"key": key, "i": i}});
    job.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    job
}

/// For each key, the position in its sequence of every request the sink received for it, in
/// arrival order, with the status answered.
fn arrivals(
    log: &[Received],
    place: &HashMap<String, (String, usize)>,
) -> HashMap<String, Vec<(usize, u16)>> {
    let mut out: HashMap<String, Vec<(usize, u16)>> = HashMap::new();
    for r in log {
        if let Some((key, i)) = place.get(&r.job_id) {
            out.entry(key.clone()).or_default().push((*i, r.status));
        }
    }
    out
}

async fn ordered_keys_go_one_at_a_time_in_acceptance_order_across_a_restart(engine: Engine) {
    const KEYS: usize = 4;
    const PER_KEY: usize = 60;
    let mut rig = Rig::start_on(engine, "ordered", fast_retries).await;
    let url = rig.sink.url("/flaky/30");
    let mut jobs = Vec::new();
    let mut keys = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            let key = format!("k{k}");
            jobs.push(ordered(&url, &key, i, json!({})));
            keys.push((key, i));
        }
    }
    // A key whose first job fails for good (it holds its own sequence only), and unordered
    // jobs on the same URL.
    for i in 0..3 {
        let extra = match i {
            // Backing off as jobs do: a tight loop of 503s would open the endpoint's breaker
            // (the endpoint would look down), which is not what this shows.
            0 => json!({"headers": {"x-sink-status": "503"}, "backoff_min_delay_ms": 200,
                        "backoff_coefficient": 2.0}),
            _ => json!({}),
        };
        jobs.push(ordered(&url, "stuck", i, extra));
        keys.push(("stuck".into(), i));
    }
    let free = 40;
    for _ in 0..free {
        jobs.push(json!({"bucket": "o", "endpoint": url, "backoff_min_delay_ms": 10, "backoff_coefficient": 1.0}));
    }
    let mut place = HashMap::new();
    let mut n = 0;
    for chunk in jobs.chunks(37) {
        let reply = rig.submit(chunk.to_vec()).await;
        for job in reply.jobs {
            if let Some(k) = keys.get(n) {
                place.insert(job.id, k.clone());
            }
            n += 1;
        }
    }
    // Halfway through, the Director stops and another takes the JobDB: the order is the
    // JobDB's, not the process's.
    wait_for(
        Duration::from_secs(60),
        "half the ordered jobs delivered",
        || async {
            let ok = rig
                .sink
                .received()
                .iter()
                .filter(|r| r.status == 200)
                .count();
            ok >= KEYS * PER_KEY / 2
        },
    )
    .await;
    // Alone, the first job of each key went in the commit that stored it (born released:
    // its sequence was empty), later ones when the job before them ended.
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert!(metric_value(&text, "spindle_ordered_born_total") >= (KEYS + 1) as f64);
    rig.stop_director().await;
    rig.restart_director(fast_retries).await;
    rig.wait_in_state(
        State::Succeeded,
        (KEYS * PER_KEY + free) as u64,
        Duration::from_secs(120),
    )
    .await;
    let seen = arrivals(&rig.sink.received(), &place);
    for k in 0..KEYS {
        let key = format!("k{k}");
        assert_one_at_a_time(&key, &seen[&key], PER_KEY);
    }
    let stuck = &seen["stuck"];
    assert!(
        stuck.iter().all(|(i, status)| *i == 0 && *status == 503),
        "a failing job holds its key's later jobs: {stuck:?}"
    );
    let counts = rig.reader.ordering_counts().await.unwrap();
    assert_eq!(counts.held, 2, "the stuck key's two later jobs wait");
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert!(metric_value(&text, "spindle_ordered_released_total") >= (KEYS * PER_KEY / 2) as f64);
    rig.stop().await;
}

async fn a_blocking_failure_holds_its_key_until_an_operator_releases_it(engine: Engine) {
    let rig = Rig::start_on(engine, "orderblock", fast_retries).await;
    let url = rig.sink.url("/flaky/0");
    let refused = json!({"headers": {"x-sink-status": "400"}});
    let jobs = vec![
        ordered(
            &url,
            "blocks",
            0,
            json!({"headers": {"x-sink-status": "400"}, "ordering_failure": "block"}),
        ),
        ordered(&url, "blocks", 1, json!({})),
        ordered(&url, "blocks", 2, json!({})),
        ordered(&url, "releases", 0, refused),
        ordered(&url, "releases", 1, json!({})),
    ];
    let reply = rig.submit(jobs).await;
    let ids: Vec<String> = reply.jobs.iter().map(|j| j.id.clone()).collect();
    rig.wait_in_state(State::Discarded, 2, Duration::from_secs(30))
        .await;
    rig.wait_in_state(State::Succeeded, 1, Duration::from_secs(30))
        .await;
    // Longer than a sweep: nothing releases a blocked key by itself.
    tokio::time::sleep(
        spindle::director::ordering::sequencer::SWEEP_EVERY + Duration::from_secs(1),
    )
    .await;
    let per_job = rig.sink.per_job();
    assert_eq!(
        per_job.get(&ids[4]),
        Some(&1),
        "a releasing failure lets the next go"
    );
    assert!(!per_job.contains_key(&ids[1]) && !per_job.contains_key(&ids[2]));
    let counts = rig.reader.ordering_counts().await.unwrap();
    assert_eq!((counts.held, counts.blocked), (2, 1));
    // The operator's release: the row goes, and the key goes on in order.
    operator_sql(&rig.reader, "DELETE FROM ordering_blocked").await;
    rig.wait_in_state(State::Succeeded, 3, Duration::from_secs(20))
        .await;
    let log = rig.sink.received();
    let at = |id: &str| log.iter().position(|r| r.job_id == id).unwrap();
    assert!(at(&ids[1]) < at(&ids[2]));
    assert_eq!(
        rig.reader.ordering_counts().await.unwrap(),
        Default::default()
    );
    rig.stop().await;
}

/// The last row of job `id` (as the API names it) in the JobDB.
async fn last_row(rig: &Rig, id: &str) -> spindle::job::Transition {
    let id: spindle::job::JobId = id.parse().unwrap();
    histories(&rig.reader).await[&id].last().cloned().unwrap()
}

/// Expiry is an end, with or without an archive: a key whose released job expires goes on at
/// once (it used to stop for good: the expired job's entry, released and left `archiving`,
/// counted as under way), and a job that expires while it waits for its turn ends then, not
/// when its turn comes. Neither expired job is ever sent.
async fn an_expired_job_lets_its_key_go_at_once_and_a_held_one_expires_on_time(engine: Engine) {
    let rig = Rig::start_on(engine, "orderexpiry", fast_retries).await;
    let url = rig.sink.url("/flaky/0");
    let failing = json!({"headers": {"x-sink-status": "503"}, "backoff_min_delay_ms": 200,
                         "ttl_ms": 3000});
    let jobs = vec![
        ordered(&url, "k", 0, failing),
        ordered(&url, "k", 1, json!({"ttl_ms": 1500})),
        ordered(&url, "k", 2, json!({})),
    ];
    let submitted = std::time::Instant::now();
    let reply = rig.submit(jobs).await;
    let ids: Vec<String> = reply.jobs.iter().map(|j| j.id.clone()).collect();
    // The two behind the first wait in the writer's memory (kept, no entry): the held one's
    // expiry still ends it on time.
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert_eq!(metric_value(&text, "spindle_ordered_kept_total"), 2.0);
    wait_for(
        Duration::from_secs(15),
        "the key's last job delivered",
        || async { rig.sink.per_job().contains_key(&ids[2]) },
    )
    .await;
    let took = submitted.elapsed();
    // The first job expires at 3 s; the next goes within a sweep of it, not later.
    assert!(
        took < Duration::from_millis(3000) + spindle::director::ordering::sequencer::SWEEP_EVERY,
        "the key went on {took:?} after submission"
    );
    let per_job = rig.sink.per_job();
    assert!(
        !per_job.contains_key(&ids[1]),
        "a job that expired waiting is never sent"
    );
    for (i, id) in ids.iter().take(2).enumerate() {
        let last = last_row(&rig, id).await;
        assert_eq!(
            (last.state, last.error_type.as_deref()),
            (State::Archiving, Some("expired")),
            "job {i}"
        );
    }
    // The held job ended at its expiry (1.5 s), within a sweep, not at its turn (3 s).
    let held_end = last_row(&rig, &ids[1]).await.time;
    let expiry = reply.jobs[1].expire_at.unwrap();
    let late = (held_end - expiry).to_std().unwrap_or_default();
    assert!(
        late < spindle::director::ordering::sequencer::SWEEP_EVERY,
        "a held job expired {late:?} after its expiry"
    );
    assert_eq!(
        rig.reader.ordering_counts().await.unwrap(),
        Default::default()
    );
    rig.stop().await;
}

/// An operator's flush or discard of an ordered job that waits for its turn ends it: it is
/// never sent afterwards (a flushed held job used to be released and delivered), and skipping
/// a job on purpose never blocks its key, even when the job asked to block.
async fn an_operator_flush_or_discard_of_a_held_job_ends_it_and_never_blocks_its_key(
    engine: Engine,
) {
    let rig = Rig::start_on(engine, "orderops", fast_retries).await;
    let url = rig.sink.url("/flaky/0");
    let failing = json!({"headers": {"x-sink-status": "503"}, "backoff_min_delay_ms": 200,
                         "ttl_ms": 4000});
    let blocks = json!({"ordering_failure": "block"});
    let jobs = vec![
        ordered(&url, "k", 0, failing),
        ordered(&url, "k", 1, blocks.clone()),
        ordered(&url, "k", 2, blocks),
        ordered(&url, "k", 3, json!({})),
    ];
    let reply = rig.submit(jobs).await;
    let ids: Vec<String> = reply.jobs.iter().map(|j| j.id.clone()).collect();
    // The three behind the first are kept (no entry): a command's read must still find them.
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert_eq!(metric_value(&text, "spindle_ordered_kept_total"), 3.0);
    let hex = |i: usize| ids[i].parse::<spindle::job::JobId>().unwrap().to_hex();
    for (action, i) in [("flush", 1), ("discard", 2)] {
        operator_sql(
            &rig.reader,
            &format!(
                "INSERT INTO operator_commands (issued_by, action, job_id) VALUES \
                 ('test', '{action}', X'{}')",
                hex(i)
            ),
        )
        .await;
    }
    wait_for(Duration::from_secs(10), "both commands applied", || async {
        let flushed = last_row(&rig, &ids[1]).await;
        let discarded = last_row(&rig, &ids[2]).await;
        flushed.state == State::Archiving && discarded.state == State::Discarded
    })
    .await;
    // The first job expires at 4 s; then the key goes on, past the two jobs skipped.
    wait_for(
        Duration::from_secs(15),
        "the key's last job delivered",
        || async { rig.sink.per_job().contains_key(&ids[3]) },
    )
    .await;
    // Longer than a sweep: nothing skipped is sent later.
    tokio::time::sleep(
        spindle::director::ordering::sequencer::SWEEP_EVERY + Duration::from_secs(1),
    )
    .await;
    let per_job = rig.sink.per_job();
    assert!(
        !per_job.contains_key(&ids[1]) && !per_job.contains_key(&ids[2]),
        "skipped jobs were sent: {per_job:?}"
    );
    let flushed = last_row(&rig, &ids[1]).await;
    assert_eq!(
        (flushed.state, flushed.error_type.as_deref()),
        (State::Archiving, Some("operator-flush"))
    );
    let discarded = last_row(&rig, &ids[2]).await;
    assert_eq!(
        (discarded.state, discarded.error_type.as_deref()),
        (State::Discarded, Some("operator-discard"))
    );
    for (id, history) in histories(&rig.reader).await {
        assert_legal(&history);
        let ended = history
            .iter()
            .position(|t| matches!(t.state, State::Archiving | State::Discarded));
        if let Some(at) = ended {
            assert!(
                history[at..].iter().all(|t| t.state != State::Executing),
                "job {id} executed after it ended: {history:?}"
            );
        }
    }
    assert_eq!(
        rig.reader.ordering_counts().await.unwrap().blocked,
        0,
        "an operator's skip blocks nothing"
    );
    rig.stop().await;
}

/// In a cluster, a head waits while another live JobDB may hold an older job of its key.
/// Before, one JobDB that could not be read (or one still at schema 7 during an upgrade)
/// stopped every key on every Director. Now a JobDB at schema 7 holds no ordered job (it
/// cannot), and while a JobDB cannot be read, jobs accepted before the last complete read of
/// every JobDB (less the clock bound) go on: nothing older of their key can be anywhere else.
/// Only keys with jobs accepted since wait, and go as soon as it can be read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_peer_jobdb_stops_only_the_jobs_accepted_since_it_was_read() {
    use spindle::director::ordering::survey::{Peer, Peers};
    use std::sync::{Arc, Mutex};
    let peer = TestDb::new("peer");
    JobDb::open(&peer.url, true, 1).await.unwrap().close().await;
    let old = TestDb::new("peer7");
    let old_db = JobDb::open(&old.url, true, 1).await.unwrap();
    // A JobDB a Director of an older release migrated only up to schema 7.
    operator_sql(&old_db, "DELETE FROM _sqlx_migrations WHERE version >= 8").await;
    old_db.close().await;
    let dead: JobDbUrl = "mysql://root@127.0.0.1:1/spindle_gone".parse().unwrap();
    let listed = Arc::new(Mutex::new(vec![
        Peer {
            name: "peer".into(),
            leaving: false,
            url: peer.url.clone(),
        },
        Peer {
            name: "peer7".into(),
            leaving: true,
            url: old.url.clone(),
        },
    ]));
    let peers = {
        let listed = listed.clone();
        Peers::new(move || {
            let list = listed.lock().unwrap().clone();
            Box::pin(async move { Ok(list) })
        })
    };
    let rig = Rig::start("orderpeers", |c| {
        fast_retries(c);
        c.peers = Some(peers);
        c.max_clock_skew = Duration::from_secs(1);
    })
    .await;
    let url = rig.sink.url("/slow/300");
    let a: Vec<Value> = (0..10).map(|i| ordered(&url, "a", i, json!({}))).collect();
    let a_ids: Vec<String> = rig.submit(a).await.jobs.into_iter().map(|j| j.id).collect();
    let delivered = |ids: &[String]| {
        let per_job = rig.sink.per_job();
        ids.iter().filter(|id| per_job.contains_key(*id)).count()
    };
    // Key a's jobs are cleared: by the intake's survey of every other JobDB (begun after they
    // got their positions), or by a sequencer's read made more than the clock bound (1 s)
    // after they were accepted; either way the next head goes without another read.
    wait_for(Duration::from_secs(20), "key a's heads cleared", || async {
        let text = metrics_text(&rig.client, &rig.base()).await;
        metric_value(&text, "spindle_ordered_cleared_total")
            + metric_value(&text, "spindle_ordered_cleared_at_intake_total")
            >= 1.0
    })
    .await;
    assert!(delivered(&a_ids) < 10, "key a still has jobs waiting");
    // Another live JobDB that cannot be read (its server is gone).
    listed.lock().unwrap().push(Peer {
        name: "gone".into(),
        leaving: false,
        url: dead,
    });
    let b: Vec<Value> = (0..2).map(|i| ordered(&url, "b", i, json!({}))).collect();
    let b_ids: Vec<String> = rig.submit(b).await.jobs.into_iter().map(|j| j.id).collect();
    wait_for(Duration::from_secs(20), "key a delivered", || async {
        delivered(&a_ids) == 10
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(delivered(&b_ids), 0, "a key accepted since the read waits");
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert!(metric_value(&text, "spindle_ordered_survey_failures_total") >= 1.0);
    listed.lock().unwrap().pop();
    wait_for(Duration::from_secs(20), "key b delivered", || async {
        delivered(&b_ids) == 2
    })
    .await;
    rig.stop().await;
}
/// A peer JobDB read at an older schema (a spare its new Director is still migrating, marked
/// active before it serves; an older release's in a rolling upgrade) holds no ordered job then,
/// but it is read afresh once migrated: a key's job accepted there first is not overtaken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_read_before_its_migration_is_read_again_after_it() {
    use spindle::director::ordering::survey::{Peer, Peers};
    use spindle::job::{Job, JobId, OrderedKey, RetryPolicy, Transition};
    use spindle::jobdb::Append;
    use std::sync::Arc;
    let old = TestDb::new("peermig");
    let old_db = JobDb::open(&old.url, true, 1).await.unwrap();
    // Recorded at schema 7 (its tables are today's, so its migration is only the record).
    operator_sql(
        &old_db,
        "CREATE TABLE later_migrations AS SELECT * FROM _sqlx_migrations WHERE version >= 8",
    )
    .await;
    operator_sql(&old_db, "DELETE FROM _sqlx_migrations WHERE version >= 8").await;
    let listed = vec![Peer {
        name: "peermig".into(),
        leaving: false,
        url: old.url.clone(),
    }];
    let peers = Peers::new(move || {
        let list = listed.clone();
        Box::pin(async move { Ok(list) })
    });
    let rig = Rig::start("orderpeermig", |c| {
        fast_retries(c);
        c.peers = Some(peers);
        c.max_clock_skew = Duration::from_secs(1);
    })
    .await;
    let url = rig.sink.url("/ok");
    // Read at schema 7: it holds no ordered job, so the key's first job goes.
    let first = rig.submit(vec![ordered(&url, "c", 0, json!({}))]).await;
    wait_for(Duration::from_secs(20), "the key's first job", || async {
        rig.sink.per_job().contains_key(&first.jobs[0].id)
    })
    .await;
    // Its Director migrates it and accepts a job of the same key there, before ours.
    operator_sql(
        &old_db,
        "INSERT INTO _sqlx_migrations SELECT * FROM later_migrations",
    )
    .await;
    old_db.close().await;
    let peer = JobDb::open(&old.url, true, 1).await.unwrap();
    let token = peer.take_ownership("test").await.unwrap();
    let now = chrono::Utc::now();
    let id = JobId(ulid::Ulid::new());
    let elsewhere = Arc::new(Job {
        id,
        bucket: "o".into(),
        endpoint: url.as_str().into(),
        method: "POST".into(),
        headers: Vec::new(),
        payload: bytes::Bytes::from_static(b"{}"),
        execution_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            min_delay: Duration::from_millis(10),
            coefficient: 1.0,
        },
        created_at: now,
        expire_at: now + chrono::Duration::minutes(10),
        idempotency_key: None,
        on_complete: None,
        ordering: Some(OrderedKey {
            key: "c".into(),
            blocks: false,
            position: id.0,
        }),
        event: None,
        trace: None,
    });
    peer.append_all(
        token,
        &Append {
            jobs: std::slice::from_ref(&elsewhere),
            transitions: &[(1, Transition::awaiting_scheduling(&elsewhere))],
            ..Append::default()
        },
    )
    .await
    .unwrap();
    // Past the clearance of the first survey (1 s of skew): the next job needs a read.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let second = rig.submit(vec![ordered(&url, "c", 1, json!({}))]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !rig.sink.per_job().contains_key(&second.jobs[0].id),
        "the key's job in the migrated peer was overtaken"
    );
    // The job there ends: ours goes.
    operator_sql(&peer, "DELETE FROM open_jobs").await;
    wait_for(Duration::from_secs(20), "the key's next job", || async {
        rig.sink.per_job().contains_key(&second.jobs[0].id)
    })
    .await;
    peer.close().await;
    rig.stop().await;
}

/// A job with both an `ordering_key` and a later time (`deliver_at`) holds its key until then:
/// the key's later jobs, due now, wait behind it (a key's jobs go in the order they were
/// accepted, and it was accepted first). This is the documented behaviour (README, "RPC API";
/// docs/operations.md); the dashboard's count of ordered jobs behind a scheduled one says so
/// while they wait. Another key's job is not held.
async fn a_scheduled_ordered_job_holds_its_key_until_its_time(engine: Engine) {
    let rig = Rig::start_on(engine, "schedord", fast_retries).await;
    let url = rig.sink.url("/ok");
    let at = chrono::Utc::now() + chrono::Duration::seconds(3);
    let reply = rig
        .submit(vec![
            ordered(&url, "k", 0, json!({"deliver_at": at})),
            ordered(&url, "k", 1, json!({})),
            ordered(&url, "k", 2, json!({})),
            ordered(&url, "other", 0, json!({})),
        ])
        .await;
    let ids: Vec<String> = reply.jobs.iter().map(|j| j.id.clone()).collect();
    wait_for(Duration::from_secs(5), "the other key's job", || async {
        rig.sink.per_job().contains_key(&ids[3])
    })
    .await;
    wait_for(
        Duration::from_secs(5),
        "two jobs counted behind the scheduled one",
        || async { rig.reader.ordering_counts().await.unwrap().behind_scheduled == 2 },
    )
    .await;
    let early = rig.sink.per_job();
    assert!(
        chrono::Utc::now() < at,
        "the machine was too slow to look before the scheduled time"
    );
    for id in &ids[..3] {
        assert!(
            !early.contains_key(id),
            "{id} delivered before the scheduled job's time"
        );
    }
    wait_for(Duration::from_secs(15), "the key's three jobs", || async {
        let got = rig.sink.per_job();
        ids[..3].iter().all(|id| got.contains_key(id))
    })
    .await;
    let log = rig.sink.received();
    let order: Vec<&str> = log
        .iter()
        .filter(|r| ids[..3].contains(&r.job_id))
        .map(|r| r.job_id.as_str())
        .collect();
    assert_eq!(
        order,
        [&ids[0], &ids[1], &ids[2]],
        "in acceptance order, once each"
    );
    assert_eq!(
        rig.reader.ordering_counts().await.unwrap().behind_scheduled,
        0
    );
    rig.stop().await;
}

/// Alone, a key's jobs cost one commit each: when one ends, the scheduler holds a place for
/// the next, and the commit that writes the end releases the next job and begins its
/// attempt (listed in its log row) before any request of it is sent. Order holds; every job
/// is delivered once.
async fn alone_each_job_of_a_key_begins_in_the_commit_that_ends_the_one_before(engine: Engine) {
    const JOBS: usize = 60;
    let rig = Rig::start_on(engine, "begun", fast_retries).await;
    let url = rig.sink.url("/ok");
    let jobs: Vec<Value> = (0..JOBS)
        .map(|i| ordered(&url, "one", i, json!({})))
        .collect();
    // One request: the first job is born released, the others wait behind it (kept).
    let reply = rig.submit(jobs).await;
    let place: HashMap<String, (String, usize)> = reply
        .jobs
        .iter()
        .enumerate()
        .map(|(i, job)| (job.id.clone(), ("one".to_owned(), i)))
        .collect();
    rig.wait_in_state(State::Succeeded, JOBS as u64, Duration::from_secs(60))
        .await;
    let seen = arrivals(&rig.sink.received(), &place);
    assert_one_at_a_time("one", &seen["one"], JOBS);
    assert_eq!(seen["one"].len(), JOBS, "each job once: {:?}", seen["one"]);
    let text = metrics_text(&rig.client, &rig.base()).await;
    let begun = metric_value(&text, "spindle_ordered_begun_on_release_total");
    assert!(
        begun >= (JOBS - 1) as f64 * 0.9,
        "{begun} of {} jobs begun in the commit that ended the one before",
        JOBS - 1
    );
    rig.stop().await;
}

/// Jobs born released (fresh: no entry) handed to a scheduler whose cache has no room for
/// them rest at once, so a backlog pass finds them: before, they waited for a commit after
/// `rest_after`, and a Director that went idle first never delivered them (seen under wrk
/// through a router, 3,900 of 142,500 jobs).
async fn jobs_born_released_into_a_full_cache_rest_and_go(engine: Engine) {
    const KEYS: usize = 40;
    let rig = Rig::start_on(engine, "fullcache", |c| {
        fast_retries(c);
        c.scheduler.max_cached_jobs = 8;
        // Only the rest at once can save them within the test.
        c.writer.rest_after = Duration::from_secs(3600);
    })
    .await;
    let url = rig.sink.url("/ok");
    // One request, every job of its own key: all born released in one commit.
    let jobs: Vec<Value> = (0..KEYS)
        .map(|i| ordered(&url, &format!("k{i}"), 0, json!({})))
        .collect();
    rig.submit(jobs).await;
    rig.wait_in_state(State::Succeeded, KEYS as u64, Duration::from_secs(30))
        .await;
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert!(
        metric_value(&text, "spindle_ordered_born_total") >= KEYS as f64,
        "every job was born released"
    );
    rig.stop().await;
}
