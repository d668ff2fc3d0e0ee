//! Jobs scheduled for later (`deliver_at`, `delay_ms`): they wait in the JobDB, not in the
//! Director's memory, arrive at their time and not before, survive a restart, and answer to
//! the operator commands. Against a real Director, MariaDB and SQLite, real HTTP over loopback.

mod common;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::*;
use serde_json::json;
use spindle::job::{JobId, State};

/// Tests that measure lateness run alone; the others share the machine.
static QUIET: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Wall-clock time of a sink arrival (the sink records monotonic instants).
fn wall(at: Instant, origin: (Instant, DateTime<Utc>)) -> DateTime<Utc> {
    let (instant, time) = origin;
    match at.checked_duration_since(instant) {
        Some(d) => time + chrono::Duration::from_std(d).unwrap(),
        None => time - chrono::Duration::from_std(instant - at).unwrap(),
    }
}

/// Scheduled jobs, one within the cache's horizon and two beyond it, across a restart: none
/// is attempted before its time, each within a second after, and those beyond the horizon
/// are never in the cache while they wait.
async fn scheduled_jobs_arrive_on_time_across_a_restart(engine: Engine) {
    let _quiet = QUIET.write().await;
    // A horizon of 2 s: jobs due later than that wait in the JobDB only.
    let tweak = |c: &mut spindle::director::DirectorConfig| {
        c.scheduler.spill_after = Duration::from_secs(2);
    };
    let mut rig = Rig::start_on(engine, "scheduled", tweak).await;
    let origin = (Instant::now(), Utc::now());
    let now = Utc::now();
    let times = [
        now + chrono::Duration::milliseconds(1_500),
        now + chrono::Duration::seconds(4),
        now + chrono::Duration::seconds(6),
    ];
    let mut jobs: Vec<_> = times
        .iter()
        .map(|at| json!({"bucket": "b", "endpoint": rig.sink.url("/ok"), "deliver_at": at}))
        .collect();
    jobs.push(json!({"bucket": "b", "endpoint": rig.sink.url("/ok"), "delay_ms": 3_600_000}));
    let reply = rig.submit(jobs).await;
    let ids: Vec<JobId> = reply.jobs.iter().map(|j| j.id.parse().unwrap()).collect();
    // The answer says when each will be attempted first, and its expiry counts from then.
    for (job, at) in reply.jobs.iter().zip(times) {
        let said = job.deliver_at.expect("deliver_at in the answer");
        assert!((said - at).num_milliseconds().abs() <= 1);
        assert!(job.expire_at.unwrap() - said >= chrono::Duration::hours(4));
    }

    // In SQL: each waits in `open_jobs` with its time, its history says why.
    let open = rig.reader.open_work().await.expect("open work");
    for (id, at) in ids.iter().zip(times) {
        let row = open.iter().find(|r| r.job_id == *id).expect("listed");
        assert!(row.listed);
        assert_eq!(row.progress.state, State::AwaitingRetry);
        assert_eq!(row.progress.attempts, 0);
        let due = row.progress.retry_at.expect("retry_at");
        assert!((due - at).num_milliseconds().abs() <= 1, "{due} vs {at}");
    }
    // The dashboard's backlog query counts them apart.
    let lanes = rig.reader.lane_backlog().await.expect("lane backlog");
    let scheduled: u64 = lanes.iter().filter(|l| l.scheduled).map(|l| l.jobs).sum();
    assert_eq!(scheduled, 4, "{lanes:?}");
    let cached = metric_value(
        &metrics_text(&rig.client, &rig.base()).await,
        "spindle_jobs_cached",
    );
    assert!(
        cached <= 1.0,
        "{cached} jobs cached: only the first is due within the horizon"
    );

    // A restart while they wait.
    rig.stop_director().await;
    rig.restart_director(tweak).await;
    let cached = metric_value(
        &metrics_text(&rig.client, &rig.base()).await,
        "spindle_jobs_cached",
    );
    assert!(cached <= 2.0, "{cached} jobs cached after the restart");

    wait_for(
        Duration::from_secs(20),
        "three scheduled jobs delivered",
        || async { rig.sink.ok_total() >= 3 },
    )
    .await;
    let received = rig.sink.received();
    for (i, (id, at)) in ids.iter().zip(times).enumerate() {
        let got = received
            .iter()
            .find(|r| r.job_id == id.to_string())
            .unwrap_or_else(|| panic!("job {i} delivered"));
        let arrived = wall(got.at, origin);
        let late = (arrived - at).num_milliseconds();
        println!(
            "{engine:?}: job due {} ms after submit arrived {late} ms late",
            (at - now).num_milliseconds()
        );
        assert!(late >= -5, "job {i} arrived {late} ms early");
        assert!(late < 1_500, "job {i} arrived {late} ms late");
    }
    // The job due in an hour is still waiting, untried, and not in memory: looked at after a
    // moment in which an early attempt would have shown (in the sink's log, read again now,
    // and in the JobDB).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = rig.sink.received();
    assert!(
        !later.iter().any(|r| r.job_id == reply.jobs[3].id),
        "the job due in an hour was delivered"
    );
    assert_eq!(later.len(), 3, "{later:?}");
    let open = rig.reader.open_work().await.expect("open work");
    let waiting = open
        .iter()
        .find(|r| r.job_id == ids[3])
        .expect("the job due in an hour is open");
    assert_eq!(waiting.progress.state, State::AwaitingRetry);
    assert_eq!(waiting.progress.attempts, 0);
    assert!(
        waiting.progress.retry_at.expect("its time") > Utc::now() + chrono::Duration::minutes(59)
    );
    let cached = metric_value(
        &metrics_text(&rig.client, &rig.base()).await,
        "spindle_jobs_cached",
    );
    assert_eq!(cached, 0.0, "the job due in an hour is not cached");
    let all = histories(&rig.reader).await;
    for id in &ids {
        let history = &all[id];
        assert_legal(history);
        assert_eq!(history[1].error_type.as_deref(), Some("scheduled"));
    }
    rig.stop().await;
}

/// Operators reach scheduled jobs with the existing commands: an expedite delivers one now,
/// a discard ends another untried, a postpone moves a third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_expedite_postpone_and_discard_scheduled_jobs() {
    let _quiet = QUIET.read().await;
    let rig = Rig::start("schedops", |_| {}).await;
    let later = Utc::now() + chrono::Duration::hours(2);
    let job = |bucket: &str| json!({"bucket": bucket, "endpoint": rig.sink.url("/ok"), "deliver_at": later});
    let reply = rig
        .submit(vec![job("rush"), job("drop"), job("wait")])
        .await;
    let ids: Vec<JobId> = reply.jobs.iter().map(|j| j.id.parse().unwrap()).collect();
    let pool = sqlx::MySqlPool::connect_with(rig.db.url.mysql_options().unwrap())
        .await
        .unwrap();
    let postpone_to = later + chrono::Duration::hours(1);
    for (action, bucket, until) in [
        ("expedite", "rush", None),
        ("discard", "drop", None),
        ("postpone", "wait", Some(postpone_to)),
    ] {
        sqlx::query(
            "INSERT INTO operator_commands (issued_by, action, bucket, postpone_until) \
             VALUES ('test', ?, ?, ?)",
        )
        .bind(action)
        .bind(bucket)
        .bind(until.map(|t: DateTime<Utc>| t.naive_utc()))
        .execute(&pool)
        .await
        .unwrap();
    }
    wait_for(
        Duration::from_secs(10),
        "the expedited job delivered",
        || async { rig.sink.ok_total() == 1 },
    )
    .await;
    wait_for(Duration::from_secs(10), "the discard applied", || async {
        histories(&rig.reader).await[&ids[1]]
            .last()
            .is_some_and(|t| t.state == State::Discarded)
    })
    .await;
    wait_for(Duration::from_secs(10), "the postpone applied", || async {
        histories(&rig.reader).await[&ids[2]]
            .last()
            .is_some_and(|t| {
                t.retry_at
                    .is_some_and(|at| (at - postpone_to).num_seconds().abs() < 2)
            })
    })
    .await;
    assert_eq!(rig.sink.received()[0].job_id, ids[0].to_string());
    pool.close().await;
    rig.stop().await;
}

/// Many jobs due in the same second: how late they arrive, when they wait in the cache
/// (due within the horizon) and when they wait in the JobDB only (a pass reads them in).
/// `SPINDLE_SCHEDULED_JOBS` sets how many (default 2,000; the figure is 10,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_jobs_due_in_the_same_second_arrive_on_time() {
    let _quiet = QUIET.write().await;
    let n: usize = std::env::var("SPINDLE_SCHEDULED_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    for horizon_s in [60u64, 1] {
        let rig = Rig::start("schedmany", |c| {
            c.scheduler.spill_after = Duration::from_secs(horizon_s);
        })
        .await;
        let origin = (Instant::now(), Utc::now());
        let due = Utc::now() + chrono::Duration::seconds(4);
        // Spread over one second, in submission batches of 500.
        let jobs: Vec<_> = (0..n)
            .map(|i| {
                let at = due + chrono::Duration::microseconds((i as i64 * 1_000_000) / n as i64);
                json!({"bucket": format!("b{}", i % 10), "endpoint": rig.sink.url("/ok"), "deliver_at": at})
            })
            .collect();
        let mut ids = std::collections::HashMap::with_capacity(n);
        for chunk in jobs.chunks(500) {
            let reply = rig.submit(chunk.to_vec()).await;
            let first = ids.len();
            ids.extend(
                reply
                    .jobs
                    .into_iter()
                    .enumerate()
                    .map(|(i, j)| (j.id, first + i)),
            );
        }
        assert!(
            Utc::now() < due,
            "the submissions took too long to measure lateness"
        );
        wait_for(
            Duration::from_secs(60),
            "every scheduled job delivered",
            || async { rig.sink.ok_total() >= n as u64 },
        )
        .await;
        let received = rig.sink.received();
        let mut lateness: Vec<Duration> = Vec::with_capacity(n);
        let mut early = 0;
        for (i, r) in received.iter().enumerate() {
            let k = ids[&r.job_id];
            let at = due + chrono::Duration::microseconds((k as i64 * 1_000_000) / n as i64);
            let late = wall(r.at, origin) - at;
            if late < chrono::Duration::milliseconds(-5) {
                early += 1;
                println!("{i}: {} ms early", -late.num_milliseconds());
            }
            lateness.push(late.to_std().unwrap_or_default());
        }
        let p50 = percentile_ms(&mut lateness, 0.50);
        let p99 = percentile_ms(&mut lateness, 0.99);
        let max = percentile_ms(&mut lateness, 1.0);
        println!(
            "{n} jobs due within one second, horizon {horizon_s} s: lateness p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms"
        );
        assert_eq!(early, 0, "jobs attempted before their time");
        assert_eq!(received.len(), n, "each delivered once");
        assert!(p99 < 2_000.0, "p99 lateness {p99} ms");
        rig.stop().await;
    }
}

on_both_engines!(scheduled_jobs_arrive_on_time_across_a_restart);
