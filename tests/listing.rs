//! Listing jobs and events (`GET /v1/jobs`, `GET /v1/events`, `GET /v1/jobs/{id}/attempts`)
//! with real parts.
//!
//! - `pages_through_a_router_list_every_jobdb_once_in_order`: two Directors on MariaDB JobDBs
//!   and a router; jobs of several buckets, endpoints, outcomes and an ordering key. Paged
//!   through the router a few at a time (each way), every job is listed exactly once, in id
//!   order, while more are submitted; each filter lists exactly its jobs; a Director lists its
//!   own JobDB's; a job's attempts and the events of a bucket are listed; a bad parameter is a
//!   422 naming it.
//! - `list_queries_read_ranges_of_an_index` (a JobDB of 20,000 jobs; `SPINDLE_LIST_JOBS` sets
//!   it, 1,000,000 for the figures in docs/operations.md): every listing query's `EXPLAIN`
//!   reads a range of an index, never the whole table, and a page's time is printed (and held
//!   to 50 ms when `SPINDLE_LIST_JOBS` is set: a figure, not a check for a loaded CI box).

mod common;

crate::on_both_engines!(a_director_lists_its_jobs_by_each_filter);

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use common::cluster::Cluster;
use common::procs::run_ok;
use common::*;
use spindle::job::State;
use spindle_client::{
    Client, EventFilter, JobFilter, JobList, ListOrder, NewEvent, NewJob, NewSubscription,
};

/// Every job `filter` lists, a page of `limit` at a time.
async fn list_all(api: &Client, filter: &JobFilter, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let page: JobList = api
            .jobs_page(filter, after.as_deref(), limit)
            .await
            .expect("a page");
        assert!(page.jobs.len() <= limit, "a page over its limit");
        out.extend(page.jobs.into_iter().map(|j| j.id));
        match page.next_after {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
    panic!("the listing never ended");
}

/// A submitted job: bucket, endpoint, the state it settles in, ordering key.
type Submitted = (String, String, State, Option<String>);

fn ms_of(id: &str) -> u64 {
    id.parse::<ulid::Ulid>().expect("an id").timestamp_ms()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_through_a_router_list_every_jobdb_once_in_order() {
    let cluster = Cluster::builder("ls")
        .jobdbs(2)
        .directors(2)
        .service_ttl_ms(2000)
        .redis(None)
        .router(1)
        .control()
        .start()
        .await;
    cluster.wait_router_ready(2).await;
    let api = Client::new(&cluster.router_base(), None).unwrap();
    // Six buckets, so both JobDBs hold some (a bucket's unordered jobs go to one Director).
    let mut expected: HashMap<String, Submitted> = HashMap::new();
    let mut jobs = Vec::new();
    for i in 0..90 {
        let bucket = format!("b{}", i % 6);
        let (path, state) = match i % 9 {
            0 => ("/status/410", State::Discarded),
            1 => ("/status/500", State::AwaitingRetry),
            _ => ("/ok", State::Succeeded),
        };
        let mut job = NewJob::new(&bucket, cluster.sink.url(path));
        job.backoff_min_delay_ms = Some(600_000);
        if i % 6 == 0 && i % 9 > 1 {
            job.ordering_key = Some("k1".into());
        }
        jobs.push((job, state));
    }
    for chunk in jobs.chunks(30) {
        let batch: Vec<NewJob> = chunk.iter().map(|(j, _)| j.clone()).collect();
        let reply = api.submit(&batch).await.expect("submitted");
        for (accepted, (job, state)) in reply.jobs.iter().zip(chunk) {
            expected.insert(
                accepted.id.clone(),
                (
                    job.bucket.clone(),
                    job.endpoint.clone(),
                    *state,
                    job.ordering_key.clone(),
                ),
            );
        }
    }
    let settled = |f: JobFilter| {
        let api = api.clone();
        async move { list_all(&api, &f, 500).await.len() }
    };
    wait_for(
        Duration::from_secs(30),
        "every job to end its first attempt",
        || async {
            let waiting = settled(JobFilter {
                state: Some(State::AwaitingScheduling),
                ..JobFilter::default()
            })
            .await
                + settled(JobFilter {
                    state: Some(State::Executing),
                    ..JobFilter::default()
                })
                .await;
            waiting == 0
        },
    )
    .await;

    // Every job once, newest first, pages of 7 while more are submitted.
    let all_ids: BTreeSet<String> = expected.keys().cloned().collect();
    let submitting = {
        let api = api.clone();
        let url = cluster.sink.url("/ok");
        tokio::spawn(async move {
            for _ in 0..20 {
                api.submit(&[NewJob::new("b9", url.clone())])
                    .await
                    .expect("submitted");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let newest = list_all(&api, &JobFilter::default(), 7).await;
    submitting.await.unwrap();
    let listed: Vec<&String> = newest.iter().filter(|id| all_ids.contains(*id)).collect();
    let mut descending: Vec<&String> = all_ids.iter().collect();
    descending.reverse();
    assert_eq!(listed, descending, "newest first, each job once");
    let unique: BTreeSet<&String> = newest.iter().collect();
    assert_eq!(unique.len(), newest.len(), "a job listed twice");
    let oldest = list_all(
        &api,
        &JobFilter {
            order: ListOrder::Oldest,
            ..JobFilter::default()
        },
        11,
    )
    .await;
    let listed: Vec<&String> = oldest.iter().filter(|id| all_ids.contains(*id)).collect();
    assert_eq!(listed, all_ids.iter().collect::<Vec<_>>(), "oldest first");

    // Each filter lists exactly its jobs (pages of 5: several per JobDB).
    let only = |keep: &dyn Fn(&Submitted) -> bool| {
        expected
            .iter()
            .filter(|(_, j)| keep(j))
            .map(|(id, _)| id.clone())
            .collect::<BTreeSet<String>>()
    };
    let listed = |f: JobFilter| {
        let api = api.clone();
        async move {
            list_all(&api, &f, 5)
                .await
                .into_iter()
                .collect::<BTreeSet<String>>()
        }
    };
    let b1 = JobFilter {
        bucket: Some("b1".into()),
        ..JobFilter::default()
    };
    assert_eq!(listed(b1).await, only(&|j| j.0 == "b1"));
    // The same through the command line.
    let base = cluster.router_base();
    let lines = run_ok(&[
        "jobs", "list", "--api", &base, "--bucket", "b1", "--oldest", "--json", "--limit", "1000",
    ]);
    let cli: Vec<String> = lines
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let b1: Vec<String> = only(&|j| j.0 == "b1").into_iter().collect();
    assert_eq!(cli, b1, "spindle jobs list");
    let table = run_ok(&[
        "jobs",
        "list",
        "--api",
        &base,
        "--state",
        "discarded",
        "--limit",
        "3",
    ]);
    assert_eq!(
        table.lines().count(),
        4,
        "a header and three jobs:\n{table}"
    );
    for state in [State::Succeeded, State::Discarded, State::AwaitingRetry] {
        let f = JobFilter {
            state: Some(state),
            ..JobFilter::default()
        };
        let mut got = listed(f).await;
        got.retain(|id| all_ids.contains(id));
        assert_eq!(got, only(&|j| j.2 == state), "state {state:?}");
    }
    let failing = cluster.sink.url("/status/500");
    let by_endpoint = JobFilter {
        endpoint: Some(failing.clone()),
        ..JobFilter::default()
    };
    assert_eq!(listed(by_endpoint).await, only(&|j| j.1 == failing));
    let keyed = JobFilter {
        bucket: Some("b0".into()),
        ordering_key: Some("k1".into()),
        ..JobFilter::default()
    };
    assert_eq!(listed(keyed).await, only(&|j| j.3.as_deref() == Some("k1")));
    let ids: Vec<&String> = all_ids.iter().collect();
    let middle = ms_of(ids[ids.len() / 2]);
    let at = chrono::DateTime::from_timestamp_millis(middle as i64).unwrap();
    let after = JobFilter {
        created_after: Some(at),
        ..JobFilter::default()
    };
    let mut got = listed(after).await;
    got.retain(|id| all_ids.contains(id));
    let want: BTreeSet<String> = all_ids
        .iter()
        .filter(|id| ms_of(id) >= middle)
        .cloned()
        .collect();
    assert_eq!(got, want, "created_after");
    let before = JobFilter {
        created_before: Some(at),
        ..JobFilter::default()
    };
    let want: BTreeSet<String> = all_ids
        .iter()
        .filter(|id| ms_of(id) < middle)
        .cloned()
        .collect();
    assert_eq!(listed(before).await, want, "created_before");

    // A Director lists its own JobDB's jobs; together they are the router's.
    let mut union = BTreeSet::new();
    for director in &cluster.directors {
        let own = Client::new(&director.base(), None).unwrap();
        let mine = list_all(&own, &JobFilter::default(), 50).await;
        assert!(!mine.is_empty(), "each JobDB holds some of the jobs");
        union.extend(mine);
    }
    assert!(union.is_superset(&all_ids));

    // A job's attempts: the failing one's first ended awaiting a retry, with the 500.
    let failed = only(&|j| j.2 == State::AwaitingRetry)
        .into_iter()
        .next()
        .unwrap();
    let attempts = api.attempts(&failed).await.expect("attempts");
    assert_eq!(attempts.job_id, failed);
    assert_eq!(attempts.attempts.len(), 1, "{attempts:?}");
    let first = &attempts.attempts[0];
    assert_eq!((first.attempt, first.response_status), (1, Some(500)));
    assert_eq!(first.outcome, Some(State::AwaitingRetry));
    assert!(first.ended_at >= Some(first.started_at) && first.retry_at.is_some());

    // Events of a bucket, a page of two at a time, each with its delivery.
    api.add_subscription(&NewSubscription::new("ev", cluster.sink.url("/ok"), ["*"]))
        .await
        .expect("subscribed");
    let mut published = Vec::new();
    // The Directors read a new subscription within their cache's refresh.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while published.len() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "events never reached the subscription"
        );
        let event = NewEvent {
            bucket: "ev".into(),
            event_type: "thing.made".into(),
            payload: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            idempotency_key: None,
            deliver_at: None,
            on_complete: None,
            traceparent: None,
            tracestate: None,
        };
        match api.publish(&event).await {
            Ok(r) if !r.deliveries.is_empty() => published.push(r.event_id.unwrap()),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let mut events = Vec::new();
    let mut after: Option<String> = None;
    let filter = EventFilter {
        bucket: Some("ev".into()),
        order: ListOrder::Oldest,
        ..EventFilter::default()
    };
    loop {
        let page = api.events_page(&filter, after.as_deref(), 2).await.unwrap();
        for e in &page.events {
            if e.event_type == "thing.made" && published.contains(&e.event_id) {
                assert_eq!(e.deliveries.len(), 1, "{e:?}");
            }
        }
        events.extend(page.events.into_iter().map(|e| e.event_id));
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    for id in &published {
        assert_eq!(
            events.iter().filter(|e| *e == id).count(),
            1,
            "event {id} once"
        );
    }
    assert!(events.windows(2).all(|w| w[0] < w[1]), "oldest first");

    // Bad parameters are refused, naming the field, by the router and by a Director.
    let http = &cluster.client;
    for base in [cluster.router_base(), cluster.directors[0].base()] {
        for (query, field) in [
            ("state=done", "state"),
            ("limit=0", "limit"),
            ("bukket=b1", "bukket"),
            ("after=zzz", "after"),
        ] {
            let r = http
                .get(format!("{base}/v1/jobs?{query}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 422, "{query}");
            let text = r.text().await.unwrap();
            assert!(text.contains(field), "{query}: {text}");
        }
        let r = http
            .get(format!("{base}/v1/events?event_type=x"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 422);
    }
    cluster.stop().await;
}

/// One Director on each engine: the same filters list the same jobs (SQLite reads its own
/// index hints), in pages that go on to the end.
async fn a_director_lists_its_jobs_by_each_filter(engine: Engine) {
    let rig = Rig::start_on(engine, "listing", |_| {}).await;
    let api = rig.api();
    let mut jobs = rig.jobs(12, "/ok", serde_json::json!({"ordering_key": "k"}));
    jobs.extend(rig.jobs(9, "/status/410", serde_json::json!({"bucket": "other"})));
    let reply = rig.submit(jobs).await;
    rig.wait_in_state(State::Succeeded, 12, Duration::from_secs(20))
        .await;
    rig.wait_in_state(State::Discarded, 9, Duration::from_secs(20))
        .await;
    let ids: Vec<String> = reply.jobs.iter().map(|j| j.id.clone()).collect();
    let oldest = JobFilter {
        order: ListOrder::Oldest,
        ..JobFilter::default()
    };
    assert_eq!(list_all(&api, &oldest, 4).await, ids);
    let other = JobFilter {
        bucket: Some("other".into()),
        state: Some(State::Discarded),
        ..oldest.clone()
    };
    assert_eq!(list_all(&api, &other, 4).await, ids[12..].to_vec());
    let keyed = JobFilter {
        ordering_key: Some("k".into()),
        endpoint: Some(rig.sink.url("/ok")),
        ..JobFilter::default()
    };
    let mut newest = ids[..12].to_vec();
    newest.reverse();
    assert_eq!(list_all(&api, &keyed, 5).await, newest);
    let none = JobFilter {
        state: Some(State::AwaitingRetry),
        ..JobFilter::default()
    };
    assert!(list_all(&api, &none, 5).await.is_empty());
    rig.stop().await;
}

/// The id of the `n`th job (or event) of a synthetic JobDB: the time `start_ms + n / 10` ms,
/// then `n`, as 16 bytes.
const ID: &str =
    "CONCAT(UNHEX(LPAD(HEX({start} + seq DIV 10), 12, '0')), UNHEX(LPAD(HEX(seq), 20, '0')))";

/// Fills a JobDB with `n` jobs in SQL (a million in a minute): 100 buckets, 37 endpoints, one
/// job in 50 with one of 7 ordering keys; each with one attempt, every tenth awaiting a retry,
/// the others succeeded; and `n / 10` events of 100 buckets and 5 types.
async fn fill(pool: &sqlx::MySqlPool, n: usize, start_ms: i64) {
    let id = ID.replace("{start}", &start_ms.to_string());
    let seq = format!("seq_0_to_{}", n - 1);
    let statements = [
        format!(
            "INSERT INTO jobs (id, bucket, endpoint, method, headers, payload, \
             execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, created_at, \
             expire_at, ordering_key) SELECT {id}, CONCAT('b', seq % 100), \
             CONCAT('http://endpoint.test/', seq % 37), 'POST', '{{}}', '', 10000, 1000, 2, \
             NOW(6), NOW(6) + INTERVAL 1 DAY, IF(seq % 50 = 0, CONCAT('k', seq % 7), NULL) \
             FROM {seq}"
        ),
        format!(
            "INSERT INTO job_state_transitions (id, job_id, time, retry_at, attempts, state, \
             response_status, duration_ms, started_at) SELECT seq + 1, {id}, NOW(6), \
             IF(seq % 10 = 3, NOW(6) + INTERVAL 1 HOUR, NULL), 1, \
             IF(seq % 10 = 3, 'awaiting-retry', 'succeeded'), IF(seq % 10 = 3, 500, 200), 5, \
             NOW(6) FROM {seq}"
        ),
        format!(
            "INSERT INTO events (id, bucket, event_type, created_at) SELECT {id}, \
             CONCAT('b', seq % 100), CONCAT('type.', seq % 5), NOW(6) FROM {seq} \
             WHERE seq % 10 = 0"
        ),
        "ANALYZE TABLE jobs, job_state_transitions, events".to_owned(),
    ];
    for sql in statements {
        sqlx::query(&sql).execute(pool).await.expect(&sql);
    }
}

/// `EXPLAIN` of a listing statement: each table's access `type`, `key` and `Extra`.
async fn explain(
    pool: &sqlx::MySqlPool,
    sql: &str,
    params: Vec<spindle::jobdb::listing::Param>,
) -> Vec<(String, Option<String>, Option<String>)> {
    use spindle::jobdb::listing::Param;
    use sqlx::Row;
    let text = format!("EXPLAIN {sql}");
    let mut q = sqlx::query(&text);
    for p in params {
        q = match p {
            Param::Id(v) => q.bind(v),
            Param::Text(v) => q.bind(v),
            Param::Count(v) => q.bind(v),
        };
    }
    q.fetch_all(pool)
        .await
        .expect("explain")
        .iter()
        .map(|row| {
            let text = |c: &str| {
                row.try_get::<Option<Vec<u8>>, _>(c)
                    .ok()
                    .flatten()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .or_else(|| row.try_get::<Option<String>, _>(c).ok().flatten())
            };
            (text("type").unwrap_or_default(), text("key"), text("Extra"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_queries_read_ranges_of_an_index() {
    use spindle::jobdb::engine::mysql::use_index;
    use spindle::jobdb::listing::{events_window, jobs_window, SCAN_WINDOW};
    use spindle::jobdb::{JobDb, JobDbUrl};
    let asked: Option<usize> = std::env::var("SPINDLE_LIST_JOBS")
        .ok()
        .and_then(|s| s.parse().ok());
    // The page time is a figure of the on-demand run; in the suite, where other tests load
    // the same two cores, it is printed only (the EXPLAIN checks are what the suite holds).
    let timed = asked.is_some();
    let n = asked.unwrap_or(20_000).clamp(1000, 1_000_000);
    let name = format!(
        "spindle_list_{}",
        &ulid::Ulid::new().to_string().to_lowercase()[16..]
    );
    let url: JobDbUrl = format!("{}/{name}", mysql_server()).parse().unwrap();
    let db = JobDb::open(&url, true, 4).await.expect("jobdb");
    let pool = sqlx::MySqlPool::connect(&format!("{}/{name}", mysql_server()))
        .await
        .unwrap();
    let start_ms = chrono::Utc::now().timestamp_millis() - 86_400_000;
    let filled = std::time::Instant::now();
    fill(&pool, n, start_ms).await;
    println!("filled {n} jobs in {:?}", filled.elapsed());

    let at =
        |k: usize| chrono::DateTime::from_timestamp_millis(start_ms + (k / 10) as i64).unwrap();
    let cases: Vec<(&str, JobFilter, &str)> = vec![
        ("every job", JobFilter::default(), "PRIMARY"),
        (
            "a bucket",
            JobFilter {
                bucket: Some("b7".into()),
                ..JobFilter::default()
            },
            "jobs_bucket",
        ),
        (
            "an ordering key",
            JobFilter {
                ordering_key: Some("k3".into()),
                ..JobFilter::default()
            },
            "jobs_ordering_key",
        ),
        (
            "a bucket, oldest first, created between",
            JobFilter {
                bucket: Some("b7".into()),
                created_after: Some(at(n / 4)),
                created_before: Some(at(n / 2)),
                order: ListOrder::Oldest,
                ..JobFilter::default()
            },
            "jobs_bucket",
        ),
        (
            "an endpoint",
            JobFilter {
                endpoint: Some("http://endpoint.test/5".into()),
                ..JobFilter::default()
            },
            "PRIMARY",
        ),
        (
            "a bucket's jobs awaiting a retry",
            JobFilter {
                bucket: Some("b3".into()),
                state: Some(State::AwaitingRetry),
                ..JobFilter::default()
            },
            "jobs_bucket",
        ),
    ];
    for (what, filter, index) in &cases {
        let (sql, params) = jobs_window(filter, None, SCAN_WINDOW, use_index);
        let plan = explain(&pool, &sql, params).await;
        println!("{what}: {sql}\n  EXPLAIN {plan:?}");
        assert_eq!(plan.len(), 1, "{what}");
        let (kind, key, extra) = &plan[0];
        assert_eq!(kind, "range", "{what}: {plan:?}");
        assert_eq!(key.as_deref(), Some(*index), "{what}: {plan:?}");
        assert!(
            !extra.as_deref().unwrap_or("").contains("filesort"),
            "{what}: {plan:?}"
        );
        let mut times = Vec::new();
        let mut page_len = 0;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let page = db.list_jobs(filter, None, 100).await.expect("a page");
            times.push(t.elapsed());
            page_len = page.jobs.len();
            if let Some(state) = filter.state {
                assert!(page
                    .jobs
                    .iter()
                    .all(|(_, h)| h.last().map(|(_, t)| t.state) == Some(state)));
            }
        }
        times.sort();
        println!(
            "  a page of {page_len}: median {:?}, worst {:?}",
            times[2], times[4]
        );
        assert!(page_len > 0, "{what}: an empty first page");
        assert!(
            !timed || times[2] <= Duration::from_millis(50),
            "{what}: a page took {:?}",
            times[2]
        );
    }
    for (what, filter, index) in [
        ("every event", EventFilter::default(), "PRIMARY"),
        (
            "a bucket's events",
            EventFilter {
                bucket: Some("b40".into()),
                ..EventFilter::default()
            },
            "events_bucket",
        ),
        (
            "a bucket's events of a type",
            EventFilter {
                bucket: Some("b40".into()),
                event_type: Some("type.0".into()),
                ..EventFilter::default()
            },
            "events_type",
        ),
    ] {
        let (sql, params) = events_window(&filter, None, 101, use_index);
        let plan = explain(&pool, &sql, params).await;
        println!("{what}: {sql}\n  EXPLAIN {plan:?}");
        let (kind, key, extra) = &plan[0];
        assert_eq!(
            (kind.as_str(), key.as_deref()),
            ("range", Some(index)),
            "{what}"
        );
        assert!(
            !extra.as_deref().unwrap_or("").contains("filesort"),
            "{what}: {plan:?}"
        );
        let t = std::time::Instant::now();
        let page = db.list_events(&filter, None, 100).await.expect("a page");
        println!("  a page of {}: {:?}", page.events.len(), t.elapsed());
        assert!(!page.events.is_empty(), "{what}: an empty first page");
    }

    // Pages whose filter is checked within windows go on past short pages to the last match.
    if n <= 50_000 {
        let filter = JobFilter {
            endpoint: Some("http://endpoint.test/5".into()),
            ..JobFilter::default()
        };
        let mut after = None;
        let mut listed = 0;
        let mut short = 0;
        loop {
            let page = db.list_jobs(&filter, after, 100).await.unwrap();
            assert!(page
                .jobs
                .iter()
                .all(|(j, _)| j.endpoint.to_string() == "http://endpoint.test/5"));
            listed += page.jobs.len();
            short += usize::from(page.jobs.len() < 100 && page.next_after.is_some());
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(listed, (0..n).filter(|k| k % 37 == 5).count());
        assert!(short > 0, "no page was cut short by its window");
        let filter = JobFilter {
            state: Some(State::AwaitingRetry),
            order: ListOrder::Oldest,
            ..JobFilter::default()
        };
        let mut after = None;
        let mut listed = 0;
        loop {
            let page = db.list_jobs(&filter, after, 500).await.unwrap();
            listed += page.jobs.len();
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(listed, n / 10);
    }
    pool.close().await;
    spindle::jobdb::drop_database(&url).await.unwrap();
}
