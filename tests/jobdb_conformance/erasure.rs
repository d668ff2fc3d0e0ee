//! Erasure's statements: the discard that names jobs by idempotency key prefix, the count of
//! named jobs not ended, and the erasing of ended ones (payload, headers, answers, kept event
//! envelopes) that keeps their rows and operator notes and changes nothing the second time.

use std::sync::Arc;

use bytes::Bytes;
use chrono::{TimeDelta, Utc};
use spindle::erasure::{Erased, Selector};
use spindle::job::{Job, State};
use spindle::jobdb::JobDb;

use crate::common::*;
use crate::{attempt, base_time, job, row};

crate::on_both_engines!(erasure_ends_what_is_in_flight_and_erases_only_what_ended);

async fn erasure_ends_what_is_in_flight_and_erases_only_what_ended(engine: Engine) {
    let test = TestDb::on(engine, "eraseconf");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let t0 = base_time();
    let keyed = |n: u8, bucket: &str, key: &str| {
        Arc::new(Job {
            idempotency_key: Some(key.into()),
            payload: Bytes::from(format!("SECRET-{n}")),
            headers: vec![("x-secret".into(), format!("SECRET-{n}"))],
            ..(*job(n, bucket, "https://x.example/a", t0)).clone()
        })
    };
    let delivered = keyed(1, "b", "cust-1/a");
    let other_key = keyed(2, "b", "cust-2/a");
    let waiting = keyed(3, "b", "cust-1/b");
    let other_bucket = keyed(4, "c", "cust-1/a");
    let jobs = [
        delivered.clone(),
        other_key.clone(),
        waiting.clone(),
        other_bucket.clone(),
    ];
    let rows: Vec<(u64, _)> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (i as u64 + 1, row(j, State::AwaitingScheduling, 0, t0)))
        .collect();
    db.append(token, &jobs, &rows).await.unwrap();
    let end = t0 + TimeDelta::seconds(1);
    let ends = [
        (
            10,
            attempt(
                row(&delivered, State::AwaitingRetry, 1, end),
                500,
                5,
                Some("http-5xx"),
            ),
        ),
        (
            11,
            attempt(row(&delivered, State::Succeeded, 2, end), 200, 5, None),
        ),
        (12, row(&other_key, State::Succeeded, 1, end)),
        (
            13,
            attempt(
                row(&other_bucket, State::Succeeded, 1, end),
                500,
                5,
                Some("x"),
            ),
        ),
    ];
    db.append(token, &[], &ends).await.unwrap();
    operator_sql(
        &db,
        "INSERT INTO events (id, bucket, event_type, created_at, payload) VALUES \
         (X'0100000000000000000000000000000A', 'b', 't', '2020-01-01 00:00:00', X'53454352'), \
         (X'0100000000000000000000000000000B', 'c', 't', '2020-01-01 00:00:00', X'53454352')",
    )
    .await;

    let customer = Selector {
        bucket: "b".into(),
        idempotency_key_prefix: Some("cust-1/".into()),
        created_before: Utc::now(),
    };
    assert!(customer.names("b", t0, Some("cust-1/x")));
    assert!(!customer.names("b", t0, Some("cust-2/x")) && !customer.names("b", t0, None));
    assert!(
        !customer.names_event("b", t0),
        "a prefix leaves the bucket's events"
    );

    // The waiting job is named and not ended: the discard names it, by its key's prefix.
    assert_eq!(db.not_ended(&customer).await.unwrap(), 1);
    let command = db.issue_erasing_discard(&customer, "eraser").await.unwrap();
    let issued = db.commands_after(command - 1).await.unwrap();
    assert_eq!(issued[0].idempotency_key_prefix.as_deref(), Some("cust-1/"));
    assert_eq!(issued[0].reason.as_deref(), Some("erased"));
    assert!(issued[0].matches(&waiting) && !issued[0].matches(&other_key));
    let targets = db.command_targets(command, 1000).await.unwrap();
    assert_eq!(
        targets.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![waiting.id]
    );
    assert_eq!(db.command_result(command).await.unwrap(), None);
    db.record_command_result(command, "test", 1).await.unwrap();
    assert_eq!(db.command_result(command).await.unwrap(), Some(1));

    // Only the ended job of the prefix is erased; its operator-free answers go.
    let erased = db.erase_ended(&customer, Utc::now()).await.unwrap();
    assert_eq!(
        erased,
        Erased {
            jobs: 1,
            answers: 1,
            events: 0
        }
    );
    let read = db
        .get_jobs(&[delivered.id, other_key.id, waiting.id, other_bucket.id])
        .await
        .unwrap();
    let of = |id| read.iter().find(|j| j.id == id).unwrap();
    assert!(of(delivered.id).payload.is_empty() && of(delivered.id).headers.is_empty());
    assert_eq!(
        of(delivered.id).idempotency_key.as_deref(),
        Some("cust-1/a")
    );
    for untouched in [other_key.id, waiting.id, other_bucket.id] {
        assert!(!of(untouched).payload.is_empty(), "{untouched}");
    }
    let history = db.get_transitions(delivered.id).await.unwrap();
    assert_eq!(
        history.last().unwrap().1.state,
        State::Succeeded,
        "the story stays"
    );
    assert!(history.iter().all(|(_, t)| t.error_response.is_none()));
    assert_eq!(
        db.erase_ended(&customer, Utc::now()).await.unwrap(),
        Erased::default(),
        "a second pass changes nothing"
    );

    // The whole bucket: its other ended job and its kept event, not the open one.
    let bucket = Selector {
        idempotency_key_prefix: None,
        ..customer
    };
    assert_eq!(db.not_ended(&bucket).await.unwrap(), 1);
    let erased = db.erase_ended(&bucket, Utc::now()).await.unwrap();
    assert_eq!(
        erased,
        Erased {
            jobs: 1,
            answers: 0,
            events: 1
        }
    );
    db.rebuild_erased_tables().await.unwrap();
    let c = db.get_jobs(&[other_bucket.id]).await.unwrap();
    assert_eq!(
        c[0].payload,
        Bytes::from("SECRET-4"),
        "another bucket keeps its bytes"
    );
    let c = db.get_transitions(other_bucket.id).await.unwrap();
    assert!(c.iter().any(|(_, t)| t.error_response.is_some()));
    assert!(db
        .kept_events(None, 10)
        .await
        .unwrap()
        .iter()
        .all(|e| &*e.bucket == "c"));
    db.close().await;
}
