//! Every SQL block in docs/operations.md runs against a live Director's JobDB and finds what it
//! is meant to find, so the operator documentation cannot drift from the schema.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use spindle::job::{JobId, State};
use spindle::rpc::api::SubmitReply;
use sqlx::{Connection, Row};

/// The example event and subscription ids of the events recipes.
const EXAMPLE_EVENT: &str = "0192F5E0A1B2C3D4E5F60718293A4B5C";
const EXAMPLE_SUBSCRIPTION: &str = "0192F5E0A1B2C3D4E5F60718293A4B5D";

fn sql_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim()) {
            (None, "```sql") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_statement_runs_and_finds_its_rows() {
    // A request left in flight when the test ends is abandoned at once (the JobDB is dropped).
    // A control database, so the events recipes have events to find.
    let control = Control::start(Engine::MySql).await;
    let publish = control.tweak();
    let rig = Rig::start("opsql", |c| {
        c.scheduler.shutdown_grace = Duration::from_millis(100);
        publish(c);
    })
    .await;
    // Events: one before a second subscription existed (it missed it), one after (both got it).
    let api = rig.api();
    let subscribe = |path: &str| {
        spindle_client::NewSubscription::new("acme", rig.sink.url(path), ["invoice.*"])
    };
    api.add_subscription(&subscribe("/ok")).await.unwrap();
    let invoice = |n: u32| spindle_client::NewEvent {
        bucket: "acme".into(),
        event_type: "invoice.paid".into(),
        payload: serde_json::value::RawValue::from_string(format!("{{\"n\": {n}}}")).unwrap(),
        idempotency_key: None,
        deliver_at: None,
        on_complete: None,
        traceparent: None,
        tracestate: None,
    };
    let missed = api.publish(&invoice(1)).await.unwrap();
    let late = api.add_subscription(&subscribe("/ok?late")).await.unwrap();
    let both = api.publish(&invoice(2)).await.unwrap();
    assert_eq!(both.deliveries.len(), 2);
    let hex_of = |ulid: &str| ulid.parse::<JobId>().unwrap().to_hex();
    // A request in flight throughout, for the recipe that lists them.
    rig.submit(vec![
        json!({"bucket": "slow", "endpoint": rig.sink.url("/slow/60000"),
                          "execution_timeout_ms": 90_000}),
    ])
    .await;
    // A scenario with something for every recipe: deliveries, a retrying endpoint (failures in
    // the last minutes, a backlog), a job refused by the address guard, and waiting retries
    // for each operator command to change.
    let ok = rig.submit(rig.jobs(3, "/ok", json!({}))).await;
    let waiting = |bucket: &str, path: &str| {
        (0..2)
            .map(|_| json!({"bucket": bucket, "endpoint": rig.sink.url(path), "backoff_min_delay_ms": 600000}))
            .collect::<Vec<_>>()
    };
    let ids =
        |reply: SubmitReply| -> Vec<String> { reply.jobs.into_iter().map(|j| j.id).collect() };
    let expedite = ids(rig.submit(waiting("b", "/status/500")).await);
    let postpone = ids(rig.submit(waiting("acme", "/status/502")).await);
    let flush = ids(rig.submit(waiting("b", "/status/503")).await);
    let discard = ids(rig.submit(waiting("trial-42", "/status/504")).await);
    rig.submit(vec![
        json!({"bucket": "b", "endpoint": "http://0.0.0.0:9/blocked"}),
    ])
    .await;
    // A job scheduled for tomorrow (waits `awaiting-retry`, never tried).
    let later = ids(rig
        .submit(vec![
            json!({"bucket": "later", "endpoint": rig.sink.url("/ok"), "delay_ms": 86_400_000}),
        ])
        .await);
    // An ordered key whose first job is scheduled for the day after tomorrow: the key's second
    // job waits behind it.
    let behind = ids(rig
        .submit(vec![
            json!({"bucket": "sched", "endpoint": rig.sink.url("/ok"), "ordering_key": "sched-1",
                   "delay_ms": 172_800_000}),
            json!({"bucket": "sched", "endpoint": rig.sink.url("/ok"), "ordering_key": "sched-1"}),
        ])
        .await);
    // Two jobs that ask to be told when they end: one delivered (its notice delivered too),
    // one waiting for a retry (its notice still owed).
    rig.submit(vec![
        json!({"bucket": "told", "endpoint": rig.sink.url("/ok"), "on_complete": rig.sink.url("/ok")}),
        json!({"bucket": "told", "endpoint": rig.sink.url("/status/507"),
               "backoff_min_delay_ms": 600000, "on_complete": rig.sink.url("/ok")}),
    ])
    .await;
    // A job submitted in a producer's trace (the traces recipe finds it).
    rig.submit(vec![
        json!({"bucket": "traced", "endpoint": rig.sink.url("/ok"),
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
    ])
    .await;
    // An ordered key whose first job is refused and asked to block it: the second waits.
    let ordered = ids(rig
        .submit(vec![
            json!({"bucket": "ord", "endpoint": rig.sink.url("/flaky/0"), "ordering_key": "order-1234",
                   "ordering_failure": "block", "headers": {"x-sink-status": "400"}}),
            json!({"bucket": "ord", "endpoint": rig.sink.url("/flaky/0"), "ordering_key": "order-1234"}),
        ])
        .await);
    rig.wait_in_state(State::AwaitingRetry, 11, Duration::from_secs(10))
        .await;
    rig.wait_in_state(State::Succeeded, 9, Duration::from_secs(10))
        .await;
    rig.wait_in_state(State::Discarded, 2, Duration::from_secs(10))
        .await;

    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let blocks = sql_blocks(&doc);
    assert!(blocks.len() >= 12, "found {} sql blocks", blocks.len());
    let hex = ok.jobs[0].id.parse::<JobId>().unwrap().to_hex();
    let mut conn = sqlx::mysql::MySqlConnection::connect_with(&rig.db.url.mysql_options().unwrap())
        .await
        .unwrap();
    let pool = sqlx::MySqlPool::connect_with(rig.db.url.mysql_options().unwrap())
        .await
        .unwrap();
    let mut commands = 0;
    for block in blocks {
        // The documented example id and endpoints stand for "yours": use real ones (the
        // blocked key's recipes name the job that blocked it).
        let blocker = ordered[0].parse::<JobId>().unwrap().to_hex();
        let id = match block.contains("ordering_blocked") {
            true => &blocker,
            false => &hex,
        };
        // The events recipes name an example event and subscription.
        let sql = match block.contains(EXAMPLE_EVENT) || block.contains(EXAMPLE_SUBSCRIPTION) {
            true => block
                .replace(
                    EXAMPLE_EVENT,
                    &hex_of(both.event_id.as_deref().expect("an event")),
                )
                .replace(EXAMPLE_SUBSCRIPTION, &hex_of(&late.id)),
            false => regex_free_replace_unhex(&block, id),
        }
        .replace(
            "https://hooks.example.com/orders",
            &rig.sink.url("/status/500"),
        )
        .replace(
            "https://hooks.example.com/legacy",
            &rig.sink.url("/status/503"),
        );
        if sql
            .trim_start()
            .starts_with("INSERT INTO operator_commands")
        {
            let issued = std::time::Instant::now();
            sqlx::raw_sql(&sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{sql}"));
            commands += 1;
            let (action, jobs) = [
                ("'expedite'", &expedite),
                ("'postpone'", &postpone),
                ("'flush'", &flush),
                ("'discard'", &discard),
            ]
            .into_iter()
            .find(|(action, _)| sql.contains(action))
            .unwrap_or_else(|| panic!("a command the test does not know:\n{sql}"));
            wait_for(
                Duration::from_secs(5),
                &format!("{action} to take effect"),
                || command_took_effect(&rig, action, jobs),
            )
            .await;
            println!(
                "{action} took effect {:.2} s after the INSERT",
                issued.elapsed().as_secs_f64()
            );
            continue;
        }
        let rows = sqlx::raw_sql(&sql)
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{sql}"));
        assert!(!rows.is_empty(), "no rows from:\n{sql}");
        if sql.contains("error_type = 'blocked-address'") {
            assert!(rows[0]
                .try_get::<Vec<u8>, _>("endpoint")
                .unwrap()
                .ends_with(b"/blocked"));
        }
        if sql.contains("WHERE job_id = UNHEX") && !sql.contains("ordering_blocked") {
            assert_eq!(rows.len(), 3, "a delivered job's trace has three steps");
        }
        if sql.contains("w.attempts = 0") {
            assert_eq!(rows.len(), 2, "two jobs scheduled for later");
            let job: String = rows[0].try_get("job").unwrap();
            assert_eq!(job, later[0].parse::<JobId>().unwrap().to_hex());
        }
        if sql.contains("AS scheduled_job") {
            // The key waits for its scheduled job, with one job behind it.
            assert_eq!(rows.len(), 1, "one key waits for a scheduled job");
            let job: String = rows[0].try_get("scheduled_job").unwrap();
            assert_eq!(job, behind[0].parse::<JobId>().unwrap().to_hex());
            let waiting: i64 = rows[0].try_get("waiting").unwrap();
            assert_eq!(waiting, 1);
            assert!(!rig.sink.per_job().contains_key(&behind[1]));
        }
        if sql.contains("'move-refused'") {
            // A live Director's JobDB has no refused move: one row saying none waits.
            let waiting: i64 = rows[0].try_get("waiting").unwrap();
            assert_eq!(waiting, 0);
        }
        if sql.contains("open_work") && sql.contains("'order-1234'") {
            // The blocked key's waiting job, with or without its entry.
            assert_eq!(rows.len(), 1, "the key's one open job");
            let job: String = rows[0].try_get("job").unwrap();
            assert_eq!(job, ordered[1].parse::<JobId>().unwrap().to_hex());
        }
        if sql.contains("DELETE FROM ordering_blocked") {
            // Both reads found the waiting job and the block; the release lets it go.
            assert_eq!(rows.len(), 2, "the waiting job, and the blocked key");
            let waiting: String = rows[0].try_get("job").unwrap();
            assert_eq!(waiting, ordered[1].parse::<JobId>().unwrap().to_hex());
            wait_for(
                spindle::director::ordering::sequencer::SWEEP_EVERY * 2,
                "the released key's next job delivered",
                || async { rig.sink.per_job().get(&ordered[1]) == Some(&1) },
            )
            .await;
            // Its end is committed a moment after the endpoint answered: until then its
            // attempt is still under way for the statements that follow.
            wait_for(Duration::from_secs(5), "its end committed", || async {
                rig.job_view(&ordered[1]).await["state"] == "succeeded"
            })
            .await;
        }
        if sql.contains("j.event_id = UNHEX") {
            assert_eq!(rows.len(), 2, "both subscriptions got the later event");
        }
        if sql.contains("FROM events e") {
            assert_eq!(rows.len(), 1, "the late subscription missed one event");
            let event: String = rows[0].try_get("event").unwrap();
            assert_eq!(event, hex_of(missed.event_id.as_deref().expect("an event")));
        }
        if sql.contains("FROM attempts_under_way") {
            assert_eq!(rows.len(), 1, "one request in flight");
            assert!(rows[0]
                .try_get::<Vec<u8>, _>("endpoint")
                .unwrap()
                .ends_with(b"/slow/60000"));
        }
        if sql.contains("operator_command_results") {
            // Each command changed exactly its two jobs, and says who issued it.
            wait_for(Duration::from_secs(5), "every command's result", || async {
                let results: Vec<(u64, u32)> = sqlx::query_as(
                    "SELECT command_id, jobs FROM operator_command_results ORDER BY command_id",
                )
                .fetch_all(&pool)
                .await
                .unwrap();
                results.len() == commands && results.iter().all(|(_, jobs)| *jobs == 2)
            })
            .await;
        }
        if sql.contains("LIKE 'operator-%'") {
            assert_eq!(rows.len(), 8, "two jobs changed by each of four commands");
            let text: String = rows[0].try_get("command").unwrap();
            assert!(text.starts_with("command 4 by root@"), "{text}");
        }
    }
    assert_eq!(
        commands, 4,
        "expedite, postpone, flush and discard are documented"
    );
    // Everything the commands touched has a legal history; nothing else was delivered again.
    for history in histories(&rig.reader).await.values() {
        assert_legal(history);
    }
    let per_job = rig.sink.per_job();
    for id in postpone.iter().chain(&flush).chain(&discard) {
        assert_eq!(per_job[id], 1, "{id} was attempted again");
    }
    // `spindle jobs show` prints the same trace, operator commands included.
    let base = rig.base();
    let show = |id: &str| procs::run(&["jobs", "show", id, "--api", &base]);
    let out = show(&discard[0]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("state     discarded")
            && text.contains("operator-discard")
            && text.contains("command 4 by")
            && text.contains(" 504 "),
        "{text}"
    );
    let unknown = show("01ARZ3NDEKTSV4RRFFQ69G5FAV");
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("404"));
    let bad = show("not-an-id");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("ULID or 32 hex digits"));
    conn.close().await.unwrap();
    pool.close().await;
    rig.stop().await;
    control.stop().await;
}

/// Whether the documented command `action` has changed its `jobs` as documented.
async fn command_took_effect(rig: &Rig, action: &str, jobs: &[String]) -> bool {
    if action == "'expedite'" {
        // Due now, so attempted a second time (the endpoint still fails).
        let per_job = rig.sink.per_job();
        return jobs.iter().all(|id| per_job.get(id) == Some(&2));
    }
    let all = histories(&rig.reader).await;
    jobs.iter().all(|id| {
        let last = all[&id.parse::<JobId>().unwrap()].last().unwrap().clone();
        let by_command = last
            .error_response
            .as_ref()
            .is_some_and(|r| r.starts_with(b"command "));
        by_command
            && match action {
                "'postpone'" => {
                    last.state == State::AwaitingRetry
                        && last.error_type.as_deref() == Some("operator-postpone")
                        && last.retry_at.unwrap()
                            > chrono::Utc::now() + chrono::Duration::minutes(50)
                }
                "'flush'" => {
                    last.state == State::Archiving
                        && last.error_type.as_deref() == Some("operator-flush")
                }
                _ => {
                    last.state == State::Discarded
                        && last.error_type.as_deref() == Some("operator-discard")
                }
            }
    })
}

/// Replaces the argument of every `UNHEX('...')` with `hex`.
fn regex_free_replace_unhex(sql: &str, hex: &str) -> String {
    let mut out = String::new();
    let mut rest = sql;
    while let Some(at) = rest.find("UNHEX('") {
        out.push_str(&rest[..at + 7]);
        rest = &rest[at + 7..];
        let end = rest.find('\'').unwrap_or(0);
        out.push_str(hex);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}
