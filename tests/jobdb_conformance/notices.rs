//! Completion notices: written in the commit of the row that ends a job that asked for one
//! (not for a move: the job's copy elsewhere tells), shaped as `job.completed`, resting due
//! in their URL's lane, and written once.

use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use spindle::job::{Job, JobId, State, Transition};
use spindle::jobdb::JobDb;

use crate::common::*;
use crate::{attempt, base_time, job, row};

crate::on_both_engines!(completion_notices_are_written_with_the_row_that_ends_a_job);

async fn completion_notices_are_written_with_the_row_that_ends_a_job(engine: Engine) {
    use spindle::jobdb::Append;
    let test = TestDb::on(engine, "noticeconf");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let t0 = base_time();
    let with = |n: u8, url: &str| {
        Arc::new(Job {
            on_complete: Some(url.into()),
            ..(*job(n, "b", "https://x.example/a?q=1", t0)).clone()
        })
    };
    let done = with(1, "https://n.example/told");
    let refused = with(2, "https://n.example/told#f");
    let moved = with(3, "https://n.example/told");
    let quiet = job(4, "b", "https://x.example/a", t0);
    let jobs = [done.clone(), refused.clone(), moved.clone(), quiet.clone()];
    let rows: Vec<(u64, Transition)> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (i as u64 + 1, row(j, State::AwaitingScheduling, 0, t0)))
        .collect();
    db.append(token, &jobs, &rows).await.unwrap();
    assert_eq!(db.notices_owed().await.unwrap(), 3);
    assert_eq!(
        db.get_jobs(&[done.id]).await.unwrap()[0]
            .on_complete
            .as_deref(),
        Some("https://n.example/told"),
        "the URL is stored with its job"
    );
    let end = t0 + TimeDelta::seconds(2);
    let ends = [
        (
            10,
            attempt(row(&done, State::Succeeded, 1, end), 200, 5, None),
        ),
        (
            11,
            attempt(
                row(&refused, State::Discarded, 2, end),
                400,
                5,
                Some("http-4xx"),
            ),
        ),
        (12, row(&moved, State::Moved, 0, end)),
        (
            13,
            attempt(row(&quiet, State::Succeeded, 1, end), 200, 5, None),
        ),
    ];
    let notices = db
        .append_all(
            token,
            &Append {
                transitions: &ends,
                ..Append::default()
            },
        )
        .await
        .unwrap()
        .notices;
    // Two notices: a moved job goes on in another JobDB (its copy there tells), and the quiet
    // one asked for none.
    assert_eq!(notices.len(), 2);
    assert_eq!(db.notices_owed().await.unwrap(), 1, "the moved job's");
    let ids: Vec<JobId> = notices.iter().map(|n| n.id).collect();
    let stored = db.get_jobs(&ids).await.unwrap();
    assert_eq!(stored.len(), 2);
    for notice in &stored {
        assert!(notice.endpoint.starts_with("https://n.example/told"));
        assert!(notice.on_complete.is_none(), "a notice has no notice");
        assert_eq!(&*notice.bucket, "b");
        let body: serde_json::Value = serde_json::from_slice(&notice.payload).unwrap();
        assert_eq!(body["type"], "job.completed");
        assert_eq!(body["bucket"], "b");
        assert_eq!(body["endpoint"], "https://x.example/a?q=1");
        let told = body["job_id"].as_str().unwrap().to_owned();
        assert_eq!(notice.idempotency_key, Some(format!("notice:{told}")));
        let (state, attempts, status) = if told == done.id.to_string() {
            ("succeeded", 1, 200)
        } else {
            assert_eq!(told, refused.id.to_string());
            assert_eq!(body["error_type"], "http-4xx");
            ("discarded", 2, 400)
        };
        assert_eq!(body["state"], state);
        assert_eq!(body["attempts"], attempts);
        assert_eq!(body["response_status"], status);
        let at = |field: &str| {
            body[field]
                .as_str()
                .unwrap()
                .parse::<DateTime<Utc>>()
                .unwrap()
        };
        assert_eq!((at("created_at"), at("ended_at")), (t0, end));
    }
    // They rest in `open_jobs`, due now, in their URL's lane.
    let mut page: Vec<JobId> = db
        .backlog_page(None, end, end, 100, 10, None)
        .await
        .unwrap()
        .into_iter()
        .map(|(j, _)| j.id)
        .collect();
    page.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(page, expected);
    assert!(db
        .backlog_page(None, end, end, 100, 10, Some("https://n.example/told"))
        .await
        .unwrap()
        .is_empty());
    // A job tells once: another row ending it writes no second notice.
    let again = [(14, row(&done, State::Succeeded, 1, end))];
    let notices = db
        .append_all(
            token,
            &Append {
                transitions: &again,
                ..Append::default()
            },
        )
        .await
        .unwrap()
        .notices;
    assert!(notices.is_empty());
    db.close().await;
}
