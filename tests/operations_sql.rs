//! Every SQL block in docs/operations.md runs against a live Director's JobDB and finds what it
//! is meant to find, so the operator documentation cannot drift from the schema.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use spindle::job::{JobId, State};
use sqlx::{Connection, Row};

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
    let rig = Rig::start("opsql", |_| {}).await;
    // A scenario with something for every recipe: deliveries, a retrying endpoint (failures in
    // the last minutes, a backlog), and a job refused by the address guard.
    let ok = rig.submit(rig.jobs(3, "/ok", json!({}))).await;
    rig.submit(rig.jobs(2, "/status/500", json!({"backoff_min_delay_ms": 600000})))
        .await;
    rig.submit(vec![
        json!({"bucket": "b", "endpoint": "http://0.0.0.0:9/blocked"}),
    ])
    .await;
    rig.wait_in_state(State::AwaitingRetry, 2, Duration::from_secs(10))
        .await;
    rig.wait_in_state(State::Succeeded, 3, Duration::from_secs(10))
        .await;
    rig.wait_in_state(State::Discarded, 1, Duration::from_secs(10))
        .await;

    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let blocks = sql_blocks(&doc);
    assert!(blocks.len() >= 6, "found {} sql blocks", blocks.len());
    let hex = ok.jobs[0].id.parse::<JobId>().unwrap().to_hex();
    let mut conn = sqlx::mysql::MySqlConnection::connect_with(&rig.db.url.options())
        .await
        .unwrap();
    for block in blocks {
        // The documented example id stands for "your job": use a real one.
        let sql = regex_free_replace_unhex(&block, &hex);
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
        if sql.contains("WHERE job_id = UNHEX") {
            assert_eq!(rows.len(), 3, "a delivered job's trace has three rows");
        }
    }
    conn.close().await.unwrap();
    rig.stop().await;
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
