//! Director acceptance tests against the machine's real MariaDB and real HTTP over loopback.
//! The engine-independent ones run twice, `NAME::mysql` and `NAME::sqlite` (an embedded
//! JobDB file): the Director must behave the same on both.

#[path = "director/backlog.rs"]
mod backlog;
mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::json;
use spindle::director::DirectorError;
use spindle::job::{JobId, State};
use spindle::jobdb::JobDbError;

on_both_engines!(
    round_trip_records_exactly_three_transitions,
    retries_follow_the_jobs_own_jittered_backoff,
    retry_after_is_honoured_400_discarded_redirects_not_followed,
    expired_jobs_go_to_archiving_not_away,
    restart_recovers_retries_still_waiting,
    restart_starts_retries_already_due_without_new_traffic,
    shutdown_lets_attempts_in_flight_finish,
    a_second_director_refuses_a_held_jobdb,
    a_fenced_out_director_stores_nothing_and_stops,
    a_forward_tried_again_stores_each_job_once,
    completion_notices_tell_how_each_job_ended,
    an_expired_or_flushed_job_tells_its_notice_at_once_without_an_archive,
);

/// Jobs naming an `on_complete` URL: once each ends, a JSON notice of how it ended reaches
/// that URL, once, as a job of its own (in the JobDB, with its own history); jobs without one
/// tell nothing.
async fn completion_notices_tell_how_each_job_ended(engine: Engine) {
    let rig = Rig::start_on(engine, "notices", |_| {}).await;
    let told_at = rig.sink.url("/capture");
    let mut jobs = Vec::new();
    for i in 0..20 {
        jobs.push(json!({"bucket": "n", "endpoint": rig.sink.url("/ok"), "on_complete": told_at, "payload": {"n": i}}));
    }
    for _ in 0..10 {
        jobs.push(
            json!({"bucket": "n", "endpoint": rig.sink.url("/status/400"), "on_complete": told_at}),
        );
    }
    for _ in 0..5 {
        jobs.push(json!({"bucket": "n", "endpoint": rig.sink.url("/ok")}));
    }
    let reply = rig.submit(jobs).await;
    // 35 jobs and 30 notices, every one ended.
    wait_all_final(&rig.reader, 65, Duration::from_secs(30)).await;
    let captured: Vec<_> = rig
        .sink
        .received()
        .into_iter()
        .filter(|r| r.path == "/capture")
        .collect();
    let mut told: HashMap<String, serde_json::Value> = HashMap::new();
    for r in &captured {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let id = body["job_id"].as_str().unwrap().to_owned();
        assert!(told.insert(id, body).is_none(), "one notice per job");
    }
    assert_eq!(captured.len(), 30);
    let histories = histories(&rig.reader).await;
    for (i, job) in reply.jobs.iter().enumerate() {
        let last = histories[&job.id.parse::<JobId>().unwrap()]
            .last()
            .unwrap()
            .clone();
        let Some(body) = told.get(&job.id) else {
            assert!(i >= 30, "job {i} told nothing");
            continue;
        };
        assert!(i < 30, "job {i} asked for no notice");
        assert_eq!(body["type"], "job.completed");
        assert_eq!(body["bucket"], "n");
        assert_eq!(body["state"], last.state.as_str());
        assert_eq!(body["attempts"], last.attempts);
        let (state, status) = if i < 20 {
            ("succeeded", 200)
        } else {
            ("discarded", 400)
        };
        assert_eq!(
            (body["state"].as_str(), body["response_status"].as_u64()),
            (Some(state), Some(status))
        );
        // The notice is a job of its own: keyed `notice:<id>`, delivered once, succeeded.
        let ids = rig
            .reader
            .jobs_with_idempotency_key(&format!("notice:{}", job.id), 10)
            .await
            .unwrap();
        assert_eq!(ids.len(), 1);
        assert_eq!(histories[&ids[0]].last().unwrap().state, State::Succeeded);
        assert_eq!(rig.sink.per_job()[&ids[0].to_string()], 1);
    }
    assert_eq!(rig.reader.notices_owed().await.unwrap(), 0);
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert_eq!(metric_value(&text, "spindle_notices_written_total"), 30.0);
    rig.stop().await;
}

async fn round_trip_records_exactly_three_transitions(engine: Engine) {
    let rig = Rig::start_on(engine, "roundtrip", |_| {}).await;
    let jobs: Vec<_> = (0..300)
        .map(|i| json!({"bucket": format!("t{}", i % 5), "endpoint": rig.sink.url("/ok"), "payload": {"n": i}}))
        .collect();
    let mut ids = Vec::new();
    for chunk in jobs.chunks(100) {
        let reply = rig.submit(chunk.to_vec()).await;
        assert_eq!(reply.jobs.len(), chunk.len());
        ids.extend(reply.jobs.into_iter().map(|j| j.id));
    }
    wait_all_final(&rig.reader, 300, Duration::from_secs(30)).await;

    let histories = histories(&rig.reader).await;
    assert_eq!(histories.len(), 300);
    for id in &ids {
        let history = &histories[&id.parse::<JobId>().unwrap()];
        assert_eq!(
            states(history),
            vec![
                State::AwaitingScheduling,
                State::Executing,
                State::Succeeded
            ]
        );
        assert_eq!(
            history.iter().map(|t| t.attempts).collect::<Vec<_>>(),
            vec![0, 1, 1]
        );
        assert_eq!(history[2].response_status, Some(200));
    }
    let per_job = rig.sink.per_job();
    assert_eq!(per_job.len(), 300);
    assert!(
        per_job.values().all(|n| *n == 1),
        "each job delivered exactly once"
    );
    assert!(rig.sink.received().iter().all(|r| r.attempt == 1));

    // The RPC trace says the same.
    let view = rig.job_view(&ids[0]).await;
    assert_eq!(view["state"], "succeeded");
    assert_eq!(view["transitions"].as_array().unwrap().len(), 3);
    assert_eq!(view["payload_base64"], "eyJuIjowfQ==");
    rig.stop().await;
}

async fn retries_follow_the_jobs_own_jittered_backoff(engine: Engine) {
    // The endpoint fails every first and second attempt: its breaker would open (and hold
    // begun attempts back, a row each); this test is about each job's own backoff.
    let rig = Rig::start_on(engine, "retry", |c| c.scheduler.breaker.failure_ratio = 2.0).await;
    rig.submit(rig.jobs(
        6,
        "/fail/2",
        json!({"backoff_min_delay_ms": 200, "backoff_coefficient": 2.0}),
    ))
    .await;
    wait_all_final(&rig.reader, 6, Duration::from_secs(30)).await;

    let mut first_delays = Vec::new();
    for history in histories(&rig.reader).await.values() {
        use State::*;
        assert_eq!(
            states(history),
            vec![
                AwaitingScheduling,
                Executing,
                AwaitingRetry,
                Executing,
                AwaitingRetry,
                Executing,
                Succeeded
            ]
        );
        assert_eq!(
            history.iter().map(|t| t.attempts).collect::<Vec<_>>(),
            vec![0, 1, 1, 2, 2, 3, 3]
        );
        // Delay n is in [0.8, 1.0] × 200 ms × 2^(n−1), and the next attempt waits for it.
        for (retry, nominal_ms) in [(2, 200.0), (4, 400.0)] {
            let row = &history[retry];
            assert_eq!(row.error_type.as_deref(), Some("server-error"));
            assert_eq!(row.response_status, Some(500));
            let delay = (row.retry_at.unwrap() - row.time)
                .num_microseconds()
                .unwrap() as f64
                / 1000.0;
            assert!(
                delay >= nominal_ms * 0.8 - 1.0 && delay <= nominal_ms + 1.0,
                "delay {delay} ms vs {nominal_ms}"
            );
            assert!(
                history[retry + 1].time >= row.retry_at.unwrap(),
                "attempt before its retry_at"
            );
            if retry == 2 {
                first_delays.push(delay);
            }
        }
    }
    first_delays.sort_by(f64::total_cmp);
    first_delays.dedup();
    assert!(
        first_delays.len() > 1,
        "delays are jittered: {first_delays:?}"
    );

    // The endpoint saw attempts 1, 2, 3 of each job, spaced by at least the jittered delays.
    let mut by_job: HashMap<String, Vec<_>> = HashMap::new();
    for r in rig.sink.received() {
        by_job.entry(r.job_id.clone()).or_default().push(r);
    }
    for received in by_job.values() {
        assert_eq!(
            received.iter().map(|r| r.attempt).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert!(received[1].at - received[0].at >= Duration::from_millis(160));
        assert!(received[2].at - received[1].at >= Duration::from_millis(320));
    }
    rig.stop().await;
}

async fn retry_after_is_honoured_400_discarded_redirects_not_followed(engine: Engine) {
    let rig = Rig::start_on(engine, "classify", |_| {}).await;
    let reply = rig
        .submit(vec![
            json!({"bucket": "b", "endpoint": rig.sink.url("/retry-after/2"), "backoff_min_delay_ms": 50}),
            json!({"bucket": "b", "endpoint": rig.sink.url("/status/400")}),
            json!({"bucket": "b", "endpoint": rig.sink.url("/redirect/301")}),
            json!({"bucket": "b", "endpoint": rig.sink.url("/redirect/302"), "backoff_min_delay_ms": 60000}),
        ])
        .await;
    let id = |i: usize| reply.jobs[i].id.parse::<JobId>().unwrap();
    wait_for(Duration::from_secs(20), "classified outcomes", || async {
        let h = histories(&rig.reader).await;
        [
            (0, State::Succeeded),
            (1, State::Discarded),
            (2, State::Discarded),
            (3, State::AwaitingRetry),
        ]
        .iter()
        .all(|(i, s)| h.get(&id(*i)).and_then(|x| x.last()).map(|t| t.state) == Some(*s))
    })
    .await;
    let h = histories(&rig.reader).await;

    // 429 + Retry-After: 2 → the second attempt waits at least 2 s although the policy says 50 ms.
    let limited = &h[&id(0)];
    assert_eq!(limited[2].error_type.as_deref(), Some("rate-limited"));
    assert_eq!(limited[2].response_status, Some(429));
    assert!(limited[2].retry_at.unwrap() - limited[2].time >= chrono::Duration::seconds(2));
    let hits: Vec<_> = rig
        .sink
        .received()
        .into_iter()
        .filter(|r| r.path == "/retry-after/2")
        .collect();
    assert_eq!(hits.len(), 2);
    assert!(hits[1].at - hits[0].at >= Duration::from_secs(2));

    // 400 → discarded after one attempt, with the answer recorded.
    let bad = &h[&id(1)];
    assert_eq!(
        states(bad),
        vec![
            State::AwaitingScheduling,
            State::Executing,
            State::Discarded
        ]
    );
    assert_eq!(bad[2].attempts, 1);
    assert_eq!(bad[2].error_type.as_deref(), Some("client-error"));
    assert_eq!(
        bad[2].error_response.as_deref(),
        Some(&b"sink answered 400"[..])
    );

    // Redirects are never followed: nothing reached /ok; 301 is permanent, 302 is retried.
    assert!(rig.sink.received().iter().all(|r| r.path != "/ok"));
    assert_eq!(
        h[&id(2)].last().unwrap().error_type.as_deref(),
        Some("redirect")
    );
    assert_eq!(h[&id(3)].last().unwrap().response_status, Some(302));
    rig.stop().await;
}

async fn expired_jobs_go_to_archiving_not_away(engine: Engine) {
    let rig = Rig::start_on(engine, "expiry", |_| {}).await;
    rig.submit(rig.jobs(
        1,
        "/status/503",
        json!({"ttl_ms": 1500, "backoff_min_delay_ms": 200}),
    ))
    .await;
    rig.wait_in_state(State::Archiving, 1, Duration::from_secs(20))
        .await;
    let h = histories(&rig.reader).await;
    let history = h.values().next().unwrap();
    assert_legal(history);
    let last = history.last().unwrap();
    assert_eq!(last.error_type.as_deref(), Some("expired"));
    assert!(last.attempts >= 2, "retried until expiry: {history:#?}");
    rig.stop().await;
}

/// Twenty jobs fail once; the Director stops while they wait for their retry; `pause` later a
/// new Director on the same JobDB must finish them, whether their retry_at is still ahead
/// (a timer) or already past (started without any new traffic to prompt it).
async fn restart_with_retries_pending(
    engine: Engine,
    tag: &str,
    min_delay_ms: u64,
    pause: Duration,
) {
    let mut rig = Rig::start_on(engine, tag, |_| {}).await;
    rig.submit(rig.jobs(20, "/fail/1", json!({"backoff_min_delay_ms": min_delay_ms})))
        .await;
    rig.wait_in_state(State::AwaitingRetry, 20, Duration::from_secs(10))
        .await;
    rig.stop_director().await;
    tokio::time::sleep(pause).await;
    rig.restart_director(|_| {}).await;
    wait_all_final(&rig.reader, 20, Duration::from_secs(20)).await;
    for history in histories(&rig.reader).await.values() {
        assert_legal(history);
        assert_eq!(history.last().unwrap().state, State::Succeeded);
        assert_eq!(history.last().unwrap().attempts, 2);
    }
    assert!(rig.sink.per_job().values().all(|n| *n == 2));
    rig.stop().await;
}

async fn restart_recovers_retries_still_waiting(engine: Engine) {
    restart_with_retries_pending(engine, "recover", 1500, Duration::ZERO).await;
}

async fn restart_starts_retries_already_due_without_new_traffic(engine: Engine) {
    restart_with_retries_pending(engine, "due", 300, Duration::from_millis(400)).await;
}

async fn shutdown_lets_attempts_in_flight_finish(engine: Engine) {
    let mut rig = Rig::start_on(engine, "drain", |_| {}).await;
    rig.submit(rig.jobs(10, "/slow/700", json!({}))).await;
    rig.wait_in_state(State::Executing, 10, Duration::from_secs(10))
        .await;
    rig.stop_director().await;
    let counts = rig.reader.count_by_state().await.unwrap();
    assert_eq!(counts.get(&State::Succeeded), Some(&10), "{counts:?}");
    rig.stop().await;
}

async fn a_second_director_refuses_a_held_jobdb(engine: Engine) {
    let rig = Rig::start_on(engine, "exclusive", |_| {}).await;
    let mut config =
        spindle::director::DirectorConfig::new("127.0.0.1:0".parse().unwrap(), rig.db.url.clone());
    config.create_database = false;
    match spindle::director::start(config).await {
        Err(DirectorError::JobDb(JobDbError::Held(name))) => assert_eq!(name, rig.db.url.database),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("two directors on one jobdb"),
    }
    rig.stop().await;
}

async fn a_fenced_out_director_stores_nothing_and_stops(engine: Engine) {
    let mut rig = Rig::start_on(engine, "fence", |_| {}).await;
    rig.submit(rig.jobs(1, "/ok", json!({}))).await;
    wait_all_final(&rig.reader, 1, Duration::from_secs(10)).await;

    // Someone else takes the JobDB (as a new lock holder would): the token moves on.
    rig.reader.take_ownership("intruder").await.unwrap();
    let response = rig
        .client
        .post(format!("{}/v1/jobs", rig.base()))
        .json(&json!({"jobs": rig.jobs(1, "/ok", json!({}))}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    match rig.take_director().wait().await {
        Err(DirectorError::LockLost(_)) => {}
        other => panic!("expected lock loss, got {other:?}"),
    }
    assert_eq!(
        rig.reader.count_jobs().await.unwrap(),
        1,
        "the fenced write stored nothing"
    );
    assert_eq!(rig.sink.total(), 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_the_field_named_and_nothing_stored() {
    let rig = Rig::start("badinput", |c| c.intake.max_request_bytes = 3 * 1024 * 1024).await;
    let url = format!("{}/v1/jobs", rig.base());
    let ok = json!({"bucket": "b", "endpoint": "http://127.0.0.1:9/x"});
    let with = |extra: serde_json::Value| {
        let mut job = ok.clone();
        job.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"jobs": [ok.clone(), job]})
    };
    let big = "x".repeat(1024 * 1024 + 10);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("malformed json", "{\"jobs\": [".into(), 400, ""),
        ("trailing garbage", format!("{} x", json!({"jobs": [ok]})), 400, ""),
        ("unknown top field", json!({"jobs": [ok], "extra": 1}).to_string(), 400, "extra"),
        ("unknown job field", with(json!({"colour": "red"})).to_string(), 400, "colour"),
        ("missing bucket", json!({"jobs": [{"endpoint": "http://x"}]}).to_string(), 400, "bucket"),
        ("wrong type", with(json!({"execution_timeout_ms": "soon"})).to_string(), 400, "jobs[1].execution_timeout_ms"),
        ("bad url", with(json!({"endpoint": "http//nope"})).to_string(), 422, "jobs[1].endpoint"),
        ("bad scheme", with(json!({"endpoint": "file:///etc/passwd"})).to_string(), 422, "jobs[1].endpoint"),
        ("crlf header", with(json!({"headers": {"x-a": "1\r\nx-b: 2"}})).to_string(), 422, "jobs[1].headers.x-a"),
        ("bad header name", with(json!({"headers": {"x a": "1"}})).to_string(), 422, "jobs[1].headers.x a"),
        ("payload over limit", with(json!({"payload": big})).to_string(), 413, "jobs[1].payload"),
        ("absurd timeout", with(json!({"execution_timeout_ms": 3_600_000})).to_string(), 422, "jobs[1].execution_timeout_ms"),
        ("zero timeout", with(json!({"execution_timeout_ms": 0})).to_string(), 422, "jobs[1].execution_timeout_ms"),
        ("expiry in the past", with(json!({"expire_at": "2020-01-01T00:00:00Z"})).to_string(), 422, "jobs[1].expire_at"),
        ("bad method", with(json!({"method": "CONNECT"})).to_string(), 422, "jobs[1].method"),
        ("bad traceparent", with(json!({"traceparent": "00-0000-01"})).to_string(), 422, "jobs[1].traceparent"),
        ("upper-case trace id", with(json!({"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"})).to_string(), 422, "jobs[1].traceparent"),
        ("bad tracestate", with(json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=b=c"})).to_string(), 422, "jobs[1].tracestate"),
        ("tracestate alone", with(json!({"tracestate": "a=b"})).to_string(), 422, "jobs[1].tracestate"),
        ("no jobs", json!({"jobs": []}).to_string(), 422, "jobs"),
        ("too many jobs", json!({"jobs": vec![ok.clone(); 1001]}).to_string(), 422, "jobs"),
        ("body too large", json!({"jobs": [{"bucket": "b", "endpoint": "http://x", "payload": "y".repeat(3 * 1024 * 1024 + 4096)}]}).to_string(), 413, "body"),
    ];
    for (name, body, status, field) in cases {
        // A server may answer 413 from the declared length and close while the client is still
        // writing the body; the client then sees a broken pipe instead of the answer. That race
        // says nothing about the API, so such a send is simply made again.
        let mut tries = 0;
        let response = loop {
            tries += 1;
            let sent = rig
                .client
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(response) => break response,
                Err(e)
                    if tries < 10 && {
                        let text = format!("{e:?}");
                        text.contains("BrokenPipe") || text.contains("ConnectionReset")
                    } => {}
                Err(e) => panic!("{name}: {e:?}"),
            }
        };
        assert_eq!(response.status().as_u16(), status, "{name}");
        let error: serde_json::Value = response
            .json()
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let named = error["error"]["field"].as_str().unwrap_or("").to_owned()
            + " "
            + error["error"]["message"].as_str().unwrap_or("");
        assert!(named.contains(field), "{name}: {error}");
    }
    assert_eq!(rig.reader.count_jobs().await.unwrap(), 0, "nothing stored");
    assert!(rig.reader.count_by_state().await.unwrap().is_empty());

    // Unknown and malformed job ids.
    let missing = rig
        .client
        .get(format!("{}/v1/jobs/{}", rig.base(), ulid::Ulid::new()))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    let malformed = rig
        .client
        .get(format!("{}/v1/jobs/nope", rig.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status().as_u16(), 400);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_openapi_health_readiness_and_metrics() {
    let rig = Rig::start("meta", |_| {}).await;
    let get = |path: &str| rig.client.get(format!("{}{path}", rig.base())).send();
    let doc: serde_json::Value = get("/openapi.json").await.unwrap().json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["paths"]["/v1/jobs"]["post"].is_object());
    assert!(doc["paths"]["/v1/jobs/{id}"]["get"].is_object());
    assert!(doc["components"]["schemas"]["JobSpec"]["properties"]["endpoint"].is_object());
    assert_eq!(get("/healthz").await.unwrap().status().as_u16(), 200);
    assert_eq!(get("/readyz").await.unwrap().status().as_u16(), 200);
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    assert!(metrics.contains("spindle_jobs_accepted_total"), "{metrics}");
    assert!(metrics.contains("spindle_jobs_cached"), "{metrics}");
    promtool_accepts(&metrics);
    let open_metrics = rig
        .client
        .get(format!("{}/metrics", rig.base()))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        open_metrics.trim_end().ends_with("# EOF"),
        "OpenMetrics on request"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_sharing_an_endpoint_take_turns() {
    // One request at a time to the endpoint, so the order of deliveries is the scheduler's.
    let rig = Rig::start("fair", |c| c.scheduler.per_endpoint = 1).await;
    let big: Vec<_> = (0..60)
        .map(|_| json!({"bucket": "big", "endpoint": rig.sink.url("/slow/5")}))
        .collect();
    rig.submit(big).await;
    let small = rig
        .submit(
            (0..5)
                .map(|_| json!({"bucket": "small", "endpoint": rig.sink.url("/slow/5")}))
                .collect(),
        )
        .await;
    wait_all_final(&rig.reader, 65, Duration::from_secs(30)).await;
    let order: Vec<String> = rig.sink.received().into_iter().map(|r| r.job_id).collect();
    let small_ids: std::collections::HashSet<_> = small.jobs.iter().map(|j| j.id.clone()).collect();
    let last_small = order.iter().rposition(|id| small_ids.contains(id)).unwrap();
    // Round-robin between the two buckets: the small tenant is done within about twice its
    // size (plus the big tenant's head start while the small batch was being committed),
    // not after the 60 jobs queued before it.
    assert!(
        last_small < 25,
        "small bucket's last delivery was #{last_small} of {}",
        order.len()
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_lock_connection_stops_the_director() {
    let mut rig = Rig::start("lockconn", |c| {
        c.lock_check_interval = Duration::from_millis(100)
    })
    .await;
    rig.submit(rig.jobs(1, "/ok", json!({}))).await;
    wait_all_final(&rig.reader, 1, Duration::from_secs(10)).await;
    // Kill the MySQL connection that holds the JobDB's GET_LOCK, as a network fault would.
    let holder = rig
        .reader
        .lock_connection()
        .await
        .unwrap()
        .expect("the lock is held");
    rig.reader.kill_connection(holder).await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(5), rig.take_director().wait()).await;
    match stopped {
        Ok(Err(DirectorError::LockLost(_))) => {}
        other => panic!("expected the director to stop on lock loss, got {other:?}"),
    }
    rig.stop().await;
}

/// A router's forward (`POST /v1/import` without `from_jobdb`) whose answer was lost is sent
/// again with the same ids. The Director does not read which exist before writing (a forward
/// costs what a submit costs); the JobDB refuses the duplicates, and the writer then skips the
/// jobs an earlier try stored and writes the rest. Each job is stored and delivered once, and
/// the answers count what was imported and what was there already.
async fn a_forward_tried_again_stores_each_job_once(engine: Engine) {
    use spindle::rpc::import::{ImportJob, ImportRequest};
    let rig = Rig::start_on(engine, "forward", |_| {}).await;
    let ids: Vec<ulid::Ulid> = (0..6).map(|_| ulid::Ulid::new()).collect();
    // Two of them scheduled 1.5 s ahead: their `scheduled` rows must not be written twice.
    let scheduled = [ids[1], ids[3]];
    let job = |id: ulid::Ulid| {
        let form = import_form(id, rig.sink.url("/ok"), 0);
        ImportJob {
            idempotency_key: Some(format!("k-{id}")),
            on_complete: None,
            retry_at: match scheduled.contains(&id) {
                true => form.created_at + chrono::Duration::milliseconds(1_500),
                false => form.retry_at,
            },
            ..form
        }
    };
    let forward = |ids: &[ulid::Ulid]| ImportRequest {
        jobdb: rig.db.url.database.clone(),
        from_jobdb: None,
        not_after: Some(chrono::Utc::now() + chrono::Duration::seconds(30)),
        blocked_keys: Vec::new(),
        events: Vec::new(),
        jobs: ids.iter().map(|id| job(*id)).collect(),
    };
    let api = rig.api();
    let first = api.import(&forward(&ids[..3])).await.expect("first try");
    assert_eq!((first.imported, first.already_present), (3, 0));
    let again = api.import(&forward(&ids[..3])).await.expect("second try");
    assert_eq!((again.imported, again.already_present), (0, 3));
    // Two stored, two new, in one request.
    let mixed = api.import(&forward(&ids[1..5])).await.expect("mixed");
    assert_eq!((mixed.imported, mixed.already_present), (2, 2));
    // The same new forward twice at once: written one after the other, stored once.
    let (twice_a, twice_b) = (forward(&ids[5..]), forward(&ids[5..]));
    let (a, b) = tokio::join!(api.import(&twice_a), api.import(&twice_b));
    let (a, b) = (a.expect("a"), b.expect("b"));
    assert_eq!(a.imported + b.imported, 1);
    assert_eq!(a.already_present + b.already_present, 1);
    wait_all_final(&rig.reader, 6, Duration::from_secs(10)).await;
    let per_job = rig.sink.per_job();
    for id in &ids {
        assert_eq!(
            per_job.get(&id.to_string()),
            Some(&1),
            "{id} delivered once"
        );
    }
    for (id, history) in histories(&rig.reader).await {
        assert_legal(&history);
        assert_eq!(history.last().unwrap().state, State::Succeeded);
        let rows = history
            .iter()
            .filter(|t| t.error_type.as_deref() == Some("scheduled"))
            .count();
        let expected = usize::from(scheduled.contains(&id.0));
        assert_eq!(rows, expected, "{id}: {history:#?}");
    }
    rig.stop().await;
}

/// Expiry and an operator's flush are ends: a job that asked for `on_complete` is told within
/// seconds of either, with or without an archive (notices used to wait for `archived`, which
/// never comes where no archive is configured).
async fn an_expired_or_flushed_job_tells_its_notice_at_once_without_an_archive(engine: Engine) {
    let rig = Rig::start_on(engine, "noticeexpiry", |_| {}).await;
    let told_at = rig.sink.url("/capture");
    let jobs = vec![
        json!({"bucket": "n", "endpoint": rig.sink.url("/status/503"), "on_complete": told_at,
               "ttl_ms": 1500, "backoff_min_delay_ms": 200, "backoff_coefficient": 1.0}),
        json!({"bucket": "flushed", "endpoint": rig.sink.url("/status/503"),
               "on_complete": told_at, "backoff_min_delay_ms": 60000}),
    ];
    let reply = rig.submit(jobs).await;
    wait_for(
        Duration::from_secs(10),
        "the flushed job tried once",
        || async { rig.sink.per_job().contains_key(&reply.jobs[1].id) },
    )
    .await;
    operator_sql(
        &rig.reader,
        "INSERT INTO operator_commands (issued_by, action, bucket) VALUES ('test', 'flush', 'flushed')",
    )
    .await;
    let told = || {
        rig.sink
            .received()
            .into_iter()
            .filter(|r| r.path == "/capture")
            .map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap())
            .collect::<Vec<_>>()
    };
    wait_for(Duration::from_secs(10), "two notices", || async {
        told().len() >= 2
    })
    .await;
    let told = told();
    assert_eq!(told.len(), 2, "one notice per job: {told:?}");
    for (job, why) in reply.jobs.iter().zip(["expired", "operator-flush"]) {
        let body = told
            .iter()
            .find(|b| b["job_id"] == job.id.as_str())
            .unwrap_or_else(|| panic!("no notice of {why} job: {told:?}"));
        assert_eq!(
            (body["state"].as_str(), body["error_type"].as_str()),
            (Some("archiving"), Some(why))
        );
    }
    // Nothing is owed any more, and no later row (an archive) tells again.
    assert_eq!(rig.reader.notices_owed().await.unwrap(), 0);
    rig.stop().await;
}
