//! Jobs scheduled for later: they rest in the JobDB by their time, read by a backlog page only
//! once due within the horizon, and a takeover has nothing of them to settle.

use std::sync::Arc;

use chrono::TimeDelta;
use spindle::job::{Job, Progress, State, Transition};
use spindle::jobdb::{self, JobDb};

use crate::common::*;
use crate::{base_time, job, row};

crate::on_both_engines!(scheduled_jobs_wait_by_their_time);

/// A job scheduled for later rests in `open_jobs` by its time: a pass of every waiting retry
/// leaves it in the JobDB until it is due within the horizon (`scheduled_by`), a retry does
/// not wait for that, and `next_due_after` finds the first such job.
async fn scheduled_jobs_wait_by_their_time(engine: Engine) {
    let test = TestDb::on(engine, "schedconf");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let t0 = base_time();
    let tomorrow = t0 + TimeDelta::days(1);
    // Its time to live counts from its time, as intake sets it.
    let later = Arc::new(Job {
        expire_at: tomorrow + TimeDelta::hours(4),
        ..(*job(1, "b", "http://x/a", t0)).clone()
    });
    let retried = job(2, "b", "http://x/a", t0);
    let in_an_hour = t0 + TimeDelta::hours(1);
    let rows = vec![
        (1, Transition::scheduled(later.id, t0, tomorrow)),
        (2, Transition::executing(retried.id, 1, t0)),
        (
            3,
            Transition {
                retry_at: Some(in_an_hour),
                ..row(&retried, State::AwaitingRetry, 1, t0)
            },
        ),
    ];
    db.append(token, &[later.clone(), retried.clone()], &rows)
        .await
        .unwrap();
    let ids = |page: Vec<(Job, Progress)>| page.into_iter().map(|(j, _)| j.id).collect::<Vec<_>>();
    let whenever = jobdb::latest_time();
    let soon = t0 + TimeDelta::minutes(1);
    // A whole pass (every retry, whenever due) with a one-minute horizon for jobs never tried.
    assert_eq!(
        ids(db
            .backlog_page(None, whenever, soon, 100, 10, None)
            .await
            .unwrap()),
        vec![retried.id]
    );
    // Once tomorrow is within the horizon, the scheduled job is read too, untried.
    let page = db
        .backlog_page(None, whenever, tomorrow, 100, 10, None)
        .await
        .unwrap();
    assert_eq!(page[0].0.id, later.id);
    assert_eq!(
        (page[0].1.state, page[0].1.attempts, page[0].1.retry_at),
        (State::AwaitingRetry, 0, Some(tomorrow))
    );
    // The first job beyond the horizon: any (the retry), or only those never tried.
    assert_eq!(
        db.next_due_after(soon, false).await.unwrap(),
        Some(in_an_hour)
    );
    assert_eq!(db.next_due_after(soon, true).await.unwrap(), Some(tomorrow));
    // It is waiting work, and the takeover has nothing of it to settle.
    let stranded = db.load_stranded().await.unwrap();
    assert!(
        stranded.settle.is_empty() && stranded.unlisted.is_empty(),
        "{stranded:?}"
    );
    let history = &histories(&db).await[&later.id];
    assert_legal(history);
    assert_eq!(history[1].error_type.as_deref(), Some("scheduled"));
    db.close().await;
}
