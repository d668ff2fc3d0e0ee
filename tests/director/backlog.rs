//! The cache's limits: payloads spilled while jobs wait, backlogs beyond the payload budget or
//! the job cap waiting in the JobDB, far retries evicted for new work, and operator commands
//! that reach jobs waiting only in the JobDB.

use std::time::Duration;

use serde_json::json;
use spindle::job::{JobId, State};

use crate::common::*;

crate::on_both_engines!(
    a_backlog_beyond_the_cache_budget_waits_in_the_jobdb,
    beyond_the_job_cap_jobs_wait_in_the_jobdb_and_come_in_by_pages,
    long_waits_spill_payloads_and_reload_them_intact,
);

async fn long_waits_spill_payloads_and_reload_them_intact(engine: Engine) {
    use base64::Engine as _;
    let rig = Rig::start_on(engine, "spill", |c| {
        c.scheduler.spill_after = Duration::from_millis(100)
    })
    .await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let payloads: Vec<Vec<u8>> = (0..40u8)
        .map(|i| (0..2048).map(|j| (j as u8).wrapping_mul(31) ^ i).collect())
        .collect();
    let jobs = payloads
        .iter()
        .map(|p| json!({"bucket": "b", "endpoint": rig.sink.url("/fail/1"), "payload_base64": b64.encode(p), "headers": {"x-kept": "yes"}, "backoff_min_delay_ms": 1500}))
        .collect();
    let reply = rig.submit(jobs).await;
    // While they wait 1.2-1.5 s for their retry, none of their payloads is in memory.
    wait_for(Duration::from_secs(10), "payloads spilled", || async {
        let text = metrics_text(&rig.client, &rig.base()).await;
        text.lines().any(|l| l == "spindle_jobs_spilled 40")
    })
    .await;
    wait_all_final(&rig.reader, 40, Duration::from_secs(20)).await;
    // The second attempt carried exactly the submitted bytes (and headers), read back from the JobDB.
    let received = rig.sink.received();
    for (job, payload) in reply.jobs.iter().zip(&payloads) {
        let attempts: Vec<_> = received.iter().filter(|r| r.job_id == job.id).collect();
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[1].attempt, 2);
        assert_eq!(
            &attempts[1].body[..],
            &payload[..],
            "reloaded payload differs"
        );
        assert!(
            attempts[1]
                .headers
                .contains(&("x-kept".to_owned(), "yes".to_owned())),
            "reloaded headers"
        );
    }
    let text = metrics_text(&rig.client, &rig.base()).await;
    assert!(
        text.lines().any(|l| l == "spindle_jobs_spilled 0"),
        "all reloaded"
    );
    rig.stop().await;
}

async fn a_backlog_beyond_the_cache_budget_waits_in_the_jobdb(engine: Engine) {
    use base64::Engine as _;
    // 64 KiB of payloads in memory at most; 200 jobs of 4 KiB (800 KiB) queue behind an
    // endpoint taken two at a time (`/fail/0` answers 200 and keeps what it received).
    const BUDGET: usize = 64 * 1024;
    let rig = Rig::start_on(engine, "budget", |c| {
        c.scheduler.max_cached_bytes = BUDGET;
        c.scheduler.per_endpoint = 2;
    })
    .await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let payloads: Vec<Vec<u8>> = (0..200u32)
        .map(|i| (0..4096u32).map(|j| ((j * 31) ^ i) as u8).collect())
        .collect();
    let mut ids = Vec::new();
    for chunk in payloads.chunks(100) {
        let jobs = chunk
            .iter()
            .map(|p| json!({"bucket": "b", "endpoint": rig.sink.url("/fail/0"), "payload_base64": b64.encode(p), "headers": {"x-kept": "yes"}}))
            .collect();
        ids.extend(rig.submit(jobs).await.jobs.into_iter().map(|j| j.id));
    }
    // While the backlog drains, the payload bytes held in memory stay within the budget (plus
    // the jobs of one lane being read back, begun or in flight: its start window, at most
    // 16 × 2 here, and its 2 in flight).
    let mut peak = 0.0f64;
    let mut spilled_seen = 0.0f64;
    let started = std::time::Instant::now();
    while rig.sink.per_job().len() < ids.len() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "backlog did not drain"
        );
        let text = metrics_text(&rig.client, &rig.base()).await;
        peak = peak.max(metric_value(&text, "spindle_jobs_cached_payload_bytes"));
        spilled_seen = spilled_seen.max(metric_value(&text, "spindle_jobs_spilled"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bound = (BUDGET + (16 * 2 + 2) * (4096 + 10)) as f64;
    println!(
        "cache budget: peak payload bytes in memory {peak} (budget {BUDGET}), most jobs spilled at once {spilled_seen}"
    );
    assert!(peak <= bound, "{peak} payload bytes held, bound {bound}");
    assert!(
        spilled_seen >= 100.0,
        "only {spilled_seen} jobs waited in the jobdb"
    );
    // Every job delivered once, with exactly its bytes and headers.
    wait_all_final(&rig.reader, 200, Duration::from_secs(20)).await;
    let received = rig.sink.received();
    for (id, payload) in ids.iter().zip(&payloads) {
        let got: Vec<_> = received.iter().filter(|r| &r.job_id == id).collect();
        assert_eq!(got.len(), 1, "job {id} delivered {} times", got.len());
        assert_eq!(&got[0].body[..], &payload[..], "payload of {id}");
        assert!(got[0]
            .headers
            .contains(&("x-kept".to_owned(), "yes".to_owned())));
    }
    rig.stop().await;
}

async fn beyond_the_job_cap_jobs_wait_in_the_jobdb_and_come_in_by_pages(engine: Engine) {
    // At most 50 jobs in the cache; 600 jobs for an endpoint answering in 20 ms, 4 at a time.
    // Half-way the Director stops and a new one starts on the JobDB with the same cap: it too
    // reads the backlog a page at a time instead of loading it whole.
    const CAP: usize = 50;
    let tweak = |c: &mut spindle::director::DirectorConfig| {
        c.scheduler.max_cached_jobs = CAP;
        c.scheduler.per_endpoint = 4;
    };
    let mut rig = Rig::start_on(engine, "jobcap", tweak).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let reply = rig.submit(rig.jobs(100, "/slow/20", json!({}))).await;
        ids.extend(reply.jobs.into_iter().map(|j| j.id));
    }
    let mut peak = 0.0f64;
    let mut loaded = 0.0f64;
    let mut restarted = false;
    let started = std::time::Instant::now();
    while rig.sink.per_job().len() < ids.len() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "backlog did not drain"
        );
        if !restarted && rig.sink.per_job().len() >= 250 {
            rig.stop_director().await;
            rig.restart_director(tweak).await;
            restarted = true;
        }
        let text = metrics_text(&rig.client, &rig.base()).await;
        peak = peak.max(metric_value(&text, "spindle_jobs_cached"));
        loaded = loaded.max(metric_value(&text, "spindle_jobs_backlog_loaded_total"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("job cap {CAP}: most jobs cached {peak}, read in from the backlog by the second Director {loaded}");
    assert!(restarted);
    assert!(peak <= CAP as f64, "{peak} jobs cached, cap {CAP}");
    assert!(
        loaded >= 250.0,
        "only {loaded} jobs came in from the backlog after the restart"
    );
    wait_all_final(&rig.reader, 600, Duration::from_secs(20)).await;
    let per_job = rig.sink.per_job();
    assert_eq!(per_job.len(), 600);
    assert!(
        per_job.values().all(|n| *n == 1),
        "a job was delivered twice"
    );
    for history in histories(&rig.reader).await.values() {
        assert_legal(history);
        assert_eq!(history.last().unwrap().state, State::Succeeded);
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_full_of_waiting_retries_evicts_them_so_new_work_runs() {
    // 40 jobs fill the cache and wait ≥ 4 s for their retry (`/fail/1` fails once); 100 new
    // jobs must not wait for them: the far retries leave the cache and come back in time.
    const CAP: usize = 40;
    let rig = Rig::start("evict", |c| {
        c.scheduler.max_cached_jobs = CAP;
        c.scheduler.spill_after = Duration::from_millis(200);
        // 40 first attempts failing at once would open the endpoint's circuit breaker, whose
        // closing makes the retries due early: this test is about eviction, not the breaker.
        c.scheduler.breaker.failure_ratio = 2.0;
    })
    .await;
    let failing: Vec<String> = rig
        .submit(rig.jobs(40, "/fail/1", json!({"backoff_min_delay_ms": 5000})))
        .await
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    rig.wait_in_state(State::AwaitingRetry, 40, Duration::from_secs(10))
        .await;
    let fresh: Vec<String> = rig
        .submit(rig.jobs(100, "/ok", json!({})))
        .await
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    wait_all_final(&rig.reader, 140, Duration::from_secs(30)).await;
    let text = metrics_text(&rig.client, &rig.base()).await;
    let evicted = metric_value(&text, "spindle_jobs_evicted_total");
    let all = histories(&rig.reader).await;
    let parse = |id: &String| id.parse::<JobId>().unwrap();
    let last_fresh_done = fresh
        .iter()
        .map(|id| all[&parse(id)].last().unwrap().time)
        .max()
        .unwrap();
    let first_retry_due = failing
        .iter()
        .map(|id| all[&parse(id)][2].retry_at.unwrap())
        .min()
        .unwrap();
    println!(
        "evicted {evicted}; new jobs all done {} ms before the first retry was due",
        (first_retry_due - last_fresh_done).num_milliseconds()
    );
    assert!(evicted >= 1.0, "nothing was evicted");
    assert!(
        last_fresh_done < first_retry_due,
        "new jobs waited for the retries: last done {last_fresh_done}, first retry due {first_retry_due}"
    );
    // The evicted retries came back on time and ran once each.
    let per_job = rig.sink.per_job();
    for id in &failing {
        let history = &all[&parse(id)];
        assert_legal(history);
        assert_eq!(history.last().unwrap().state, State::Succeeded, "{id}");
        assert!(
            history[3].time >= history[2].retry_at.unwrap(),
            "{id} retried early"
        );
        assert_eq!(per_job[id], 2, "{id}");
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_reach_jobs_that_wait_only_in_the_jobdb() {
    // A cache of 4 jobs and 20 waiting retries: most of them are evicted to the JobDB, and
    // commands must still reach every one, exactly once.
    let rig = Rig::start("commands", |c| {
        c.scheduler.max_cached_jobs = 4;
        c.scheduler.spill_after = Duration::from_millis(200);
    })
    .await;
    let jobs = |bucket: &str, path: &str| {
        (0..10)
            .map(|_| json!({"bucket": bucket, "endpoint": rig.sink.url(path), "backoff_min_delay_ms": 600000}))
            .collect::<Vec<_>>()
    };
    let doomed: Vec<String> = rig
        .submit(jobs("x", "/status/500"))
        .await
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    let rushed: Vec<String> = rig
        .submit(jobs("y", "/fail/1"))
        .await
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    rig.wait_in_state(State::AwaitingRetry, 20, Duration::from_secs(20))
        .await;
    let text = metrics_text(&rig.client, &rig.base()).await;
    let evicted = metric_value(&text, "spindle_jobs_evicted_total");
    assert!(evicted >= 10.0, "only {evicted} jobs evicted");
    let pool = sqlx::MySqlPool::connect_with(rig.db.url.mysql_options().unwrap())
        .await
        .unwrap();
    for (action, bucket) in [("discard", "x"), ("expedite", "y")] {
        sqlx::query(
            "INSERT INTO operator_commands (issued_by, action, bucket) VALUES ('test', ?, ?)",
        )
        .bind(action)
        .bind(bucket)
        .execute(&pool)
        .await
        .unwrap();
    }
    let issued = std::time::Instant::now();
    wait_all_final(&rig.reader, 20, Duration::from_secs(10)).await;
    println!(
        "commands over {evicted} evicted jobs: all 20 final {:.2} s after the INSERTs",
        issued.elapsed().as_secs_f64()
    );
    let all = histories(&rig.reader).await;
    let per_job = rig.sink.per_job();
    for id in &doomed {
        let history = &all[&id.parse::<JobId>().unwrap()];
        assert_legal(history);
        let last = history.last().unwrap();
        assert_eq!(last.state, State::Discarded);
        assert_eq!(last.error_type.as_deref(), Some("operator-discard"));
        assert_eq!(per_job[id], 1, "{id} attempted after its discard");
    }
    for id in &rushed {
        let history = &all[&id.parse::<JobId>().unwrap()];
        assert_legal(history);
        let kinds: Vec<_> = history.iter().map(|t| t.error_type.as_deref()).collect();
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == Some("operator-expedite"))
                .count(),
            1,
            "{id}: {kinds:?}"
        );
        assert_eq!(history.last().unwrap().state, State::Succeeded);
        assert_eq!(per_job[id], 2);
    }
    let results: Vec<(u64, u32)> =
        sqlx::query_as("SELECT command_id, jobs FROM operator_command_results ORDER BY command_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(results, vec![(1, 10), (2, 10)]);
    pool.close().await;
    rig.stop().await;
}
