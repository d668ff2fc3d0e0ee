//! Schedule: work due later is not lost. Retries due far beyond the horizon fire on time (and
//! an expiry archives on time) after a restart, with the cache roomy and nearly full; and an
//! operator command committed after a later one is applied too.

use std::time::Duration;

use serde_json::json;
use spindle::job::{JobId, State};

use crate::common::*;
use crate::{alone, shared};

crate::on_both_engines!(far_retries_fire_on_time_after_a_restart);

/// A restart (or takeover) read only retries due within the horizon; nothing scheduled the next
/// pass, so a retry due minutes ahead never ran and never expired. Scaled down: horizon 500 ms,
/// retries due 2 s, 4 s and 8 s after their failure, one job expiring at 4 s whose retry
/// would be at 6 s. Each fires (or is archived) on time after a restart, with the cache
/// roomy and with it nearly full.
async fn far_retries_fire_on_time_after_a_restart(engine: Engine) {
    let _machine = alone().await;
    for cache in [1_000_000usize, 2] {
        let tweak = move |c: &mut spindle::director::DirectorConfig| {
            c.scheduler.spill_after = Duration::from_millis(500);
            c.scheduler.max_cached_jobs = cache;
        };
        let mut rig = Rig::start_on(engine, "farretries", tweak).await;
        let mut jobs: Vec<_> = [2_000u64, 4_000, 8_000]
            .iter()
            .map(|ms| {
                json!({"bucket": "b", "endpoint": rig.sink.url("/fail/1"),
                       "backoff_min_delay_ms": ms, "backoff_coefficient": 1.0})
            })
            .collect();
        jobs.push(json!({"bucket": "b", "endpoint": rig.sink.url("/fail/5"),
                         "backoff_min_delay_ms": 6_000, "ttl_ms": 4_000}));
        let reply = rig.submit(jobs).await;
        wait_for(
            Duration::from_secs(20),
            "every first attempt failed",
            || async {
                let h = histories(&rig.reader).await;
                h.len() == 4
                    && h.values()
                        .all(|t| t.iter().any(|t| t.state == State::AwaitingRetry))
            },
        )
        .await;
        rig.stop_director().await;
        rig.restart_director(tweak).await;
        rig.wait_in_state(State::Succeeded, 3, Duration::from_secs(30))
            .await;
        rig.wait_in_state(State::Archiving, 1, Duration::from_secs(30))
            .await;
        let h = histories(&rig.reader).await;
        let per_job = rig.sink.received();
        for (i, job) in reply.jobs.iter().enumerate() {
            let history = &h[&job.id.parse::<JobId>().unwrap()];
            assert_legal(history);
            let failed = history
                .iter()
                .find(|t| t.state == State::AwaitingRetry && t.error_type.is_some())
                .expect("the failed first attempt");
            let due = failed.retry_at.expect("retry_at");
            if i < 3 {
                let second = per_job
                    .iter()
                    .filter(|r| r.job_id == job.id)
                    .nth(1)
                    .expect("a second attempt");
                let ran = history
                    .iter()
                    .rfind(|t| t.state == State::Executing)
                    .unwrap()
                    .time;
                let late = (ran - due).num_milliseconds();
                println!(
                    "cache {cache}: retry due {} ms after its failure ran {late} ms after due",
                    (due - failed.time).num_milliseconds()
                );
                assert!(ran >= due, "{i}: ran {ran} before due {due}");
                assert!(late < 1_500, "{i}: ran {late} ms late");
                assert!(second.attempt == 2);
            } else {
                let last = history.last().unwrap();
                assert_eq!(last.state, State::Archiving);
                let expired_late = (last.time
                    - (history[0].time + chrono::Duration::milliseconds(4_000)))
                .num_milliseconds();
                println!("cache {cache}: expiring job archived {expired_late} ms after expiry");
                assert!(
                    (0..1_500).contains(&expired_late),
                    "archived {expired_late} ms after its expiry"
                );
            }
        }
        rig.stop().await;
    }
}

/// Commands were read with `id > last`: a command whose AUTO_INCREMENT id was taken before
/// another's but committed after it was skipped forever. Commands are now read by what has no
/// result yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_committed_after_a_later_one_is_applied_too() {
    let _machine = shared().await;
    let rig = Rig::start("cmdorder", |_| {}).await;
    let reply = rig
        .submit(rig.jobs(2, "/status/500", json!({"backoff_min_delay_ms": 600_000})))
        .await;
    rig.wait_in_state(State::AwaitingRetry, 2, Duration::from_secs(20))
        .await;
    let pool = sqlx::MySqlPool::connect_with(rig.db.url.mysql_options().unwrap())
        .await
        .unwrap();
    let discard = "INSERT INTO operator_commands (issued_by, action, job_id) \
                   VALUES ('test', 'discard', UNHEX(?))";
    let hex = |i: usize| reply.jobs[i].id.parse::<JobId>().unwrap().to_hex();
    // The first command takes its id, and commits only after the second is applied.
    let mut early = pool.begin().await.unwrap();
    sqlx::query(discard)
        .bind(hex(0))
        .execute(&mut *early)
        .await
        .unwrap();
    sqlx::query(discard)
        .bind(hex(1))
        .execute(&pool)
        .await
        .unwrap();
    rig.wait_in_state(State::Discarded, 1, Duration::from_secs(10))
        .await;
    early.commit().await.unwrap();
    rig.wait_in_state(State::Discarded, 2, Duration::from_secs(10))
        .await;
    // Each result is recorded once its command's rows are durable, a moment after them.
    wait_for(Duration::from_secs(10), "both results recorded", || async {
        let results: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM operator_command_results")
            .fetch_one(&pool)
            .await
            .unwrap();
        results == 2
    })
    .await;
    pool.close().await;
    rig.stop().await;
}
