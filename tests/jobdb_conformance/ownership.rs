//! Ownership: one owner writes at a time, fenced by its token (a stale owner's writes are
//! refused, nothing of them stored); and a JobDB's own life on its server: created, listed by
//! a pattern, locked by one holder at a time, probed and dropped.

use std::time::Duration;

use chrono::Utc;
use spindle::job::State;
use spindle::jobdb::lock::ServerLock;
use spindle::jobdb::{self, JobDb, JobDbError};

use crate::common::*;
use crate::{job, row};

crate::on_both_engines!(
    fencing_refuses_a_stale_owner,
    a_jobdb_is_created_listed_locked_and_dropped,
);

async fn fencing_refuses_a_stale_owner(engine: Engine) {
    let test = TestDb::on(engine, "fence");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    let first = db.take_ownership("one").await.unwrap();
    let j = job(1, "b", "https://x.example/", Utc::now());
    db.append(
        first,
        std::slice::from_ref(&j),
        &[(1, row(&j, State::AwaitingScheduling, 0, Utc::now()))],
    )
    .await
    .unwrap();
    // An external lock's token: higher wins, lower or equal is refused.
    assert_eq!(
        db.take_ownership_at(100, "two", Duration::from_secs(1))
            .await
            .unwrap(),
        100
    );
    match db
        .take_ownership_at(50, "old", Duration::from_secs(1))
        .await
    {
        Err(JobDbError::Fenced { ours, current }) => assert_eq!((ours, current), (50, 100)),
        other => panic!("expected fenced, got {other:?}"),
    }
    let k = job(2, "b", "https://x.example/", Utc::now());
    match db
        .append(
            first,
            std::slice::from_ref(&k),
            &[(2, row(&k, State::AwaitingScheduling, 0, Utc::now()))],
        )
        .await
    {
        Err(JobDbError::Fenced { ours, current }) => assert_eq!((ours, current), (first, 100)),
        other => panic!("a stale owner wrote: {other:?}"),
    }
    assert_eq!(
        db.count_jobs().await.unwrap(),
        1,
        "nothing of the stale write stored"
    );
    db.append(
        100,
        std::slice::from_ref(&k),
        &[(2, row(&k, State::AwaitingScheduling, 0, Utc::now()))],
    )
    .await
    .unwrap();
    assert_eq!(db.count_jobs().await.unwrap(), 2);
    assert_eq!(db.owner().await.unwrap(), (100, "two".to_owned()));
    db.close().await;
}

async fn a_jobdb_is_created_listed_locked_and_dropped(engine: Engine) {
    let test = TestDb::on(engine, "life");
    jobdb::create_database(&test.url).await.unwrap();
    let db = JobDb::open(&test.url, false, 1).await.unwrap();
    // Listed by a LIKE pattern on its server (or in its directory).
    let pattern = format!("{}%", &test.url.database[..test.url.database.len() - 4]);
    assert_eq!(
        db.databases_like(&pattern).await.unwrap(),
        vec![test.url.database.clone()]
    );
    // One lock holder at a time, and the lock frees when released.
    let lock = ServerLock::try_acquire(&test.url).await.unwrap();
    assert!(matches!(
        ServerLock::try_acquire(&test.url).await,
        Err(JobDbError::Held(_))
    ));
    lock.release().await.unwrap();
    let mut again = ServerLock::try_acquire(&test.url).await.unwrap();
    again.check(Duration::from_secs(1)).await.unwrap();
    again.release().await.unwrap();
    db.close().await;
    jobdb::probe(&test.url).await.unwrap();
    jobdb::drop_database(&test.url).await.unwrap();
    assert!(jobdb::probe(&test.url).await.is_err(), "dropped");
    jobdb::drop_database(&test.url).await.unwrap();
}
