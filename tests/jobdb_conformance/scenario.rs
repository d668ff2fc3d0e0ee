//! The whole store in one scenario: every operation, written and read back through every
//! read (appends and counts, reads of jobs and histories, what a new owner loads and the
//! backlog's pages, operator commands, imports and planned moves, archive batches, replay's
//! reader, the dashboard's reads, a reader and the purge), and schema 5's write path through
//! the commit log. Each runs on both engines, and both engines' transcripts of the two must be
//! equal, so an engine cannot drift even where a check is loose.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use spindle::job::{Job, JobId, Progress, State, Transition};
use spindle::jobdb::lifecycle::{BatchKind, Origin, PlannedBatch};
use spindle::jobdb::replay::EndedFilter;
use spindle::jobdb::{self, JobDb};
use sqlx::{ConnectOptions, Connection};

use crate::common::*;
use crate::{attempt, base_time, job, row};

crate::on_both_engines!(
    every_store_operation_behaves_as_specified,
    the_commit_log_holds_what_has_no_row_yet,
);

/// The scenario: writes a small JobDB through the store and reads it back through every read.
/// Returns a transcript of every answer that does not depend on the clock or the engine's
/// storage layout, for the cross-engine comparison. Each step covers one group of the store's
/// operations on what the steps before it wrote.
async fn scenario(db: &JobDb, t0: DateTime<Utc>) -> Vec<String> {
    let mut log = Vec::new();
    let written = appends_and_counts(db, t0, &mut log).await;
    reads_of_jobs_and_histories(db, &written, &mut log).await;
    what_a_new_owner_loads(db, &written).await;
    operator_commands(db, &written, &mut log).await;
    imports_and_planned_moves(db, &written).await;
    archive_batches(db, &written).await;
    replays_reader(db, &written).await;
    the_dashboards_reads(db, &written, &mut log).await;
    a_reader_and_the_purge(db).await;
    log
}

/// What the scenario's first step wrote, for the steps after it.
struct Written {
    t0: DateTime<Utc>,
    token: u64,
    /// `a` succeeded, `b` awaits its retry at `retry_at`, `c` was discarded, `d` is executing,
    /// `e` was never tried.
    jobs: [Arc<Job>; 5],
    retry_at: DateTime<Utc>,
    /// The rows of their attempts (ids 10 to 16).
    more: Vec<(u64, Transition)>,
}

/// Takes the JobDB's ownership, writes five jobs in two buckets and three lanes, in each
/// interesting state, and counts them.
async fn appends_and_counts(db: &JobDb, t0: DateTime<Utc>, log: &mut Vec<String>) -> Written {
    let ms = |n: i64| t0 + TimeDelta::milliseconds(n);
    let token = db.take_ownership("conformance").await.unwrap();
    assert_eq!(token, 1);
    let (owner_token, holder) = db.owner().await.unwrap();
    assert_eq!((owner_token, holder.as_str()), (1, "conformance"));

    // Five jobs in two buckets and three lanes, in each interesting state.
    let a = job(1, "b1", "https://a.example/hook?x=1", ms(0));
    let b = job(2, "b1", "https://a.example/hook#frag", ms(1));
    let c = job(3, "b2", "https://b.example/other", ms(2));
    let d = job(4, "b2", "https://b.example/other", ms(3));
    let e = job(5, "b2", "https://c.example/x", ms(4));
    let jobs = [a.clone(), b.clone(), c.clone(), d.clone(), e.clone()];
    let mut rows = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        rows.push((i as u64 + 1, row(j, State::AwaitingScheduling, 0, ms(10))));
    }
    db.append(token, &jobs, &rows).await.unwrap();
    let retry_at = ms(60_000);
    let more = vec![
        (10, row(&a, State::Executing, 1, ms(100))),
        (
            11,
            attempt(row(&a, State::Succeeded, 1, ms(150)), 200, 50, None),
        ),
        (12, row(&b, State::Executing, 1, ms(100))),
        (
            13,
            Transition {
                retry_at: Some(retry_at),
                ..attempt(
                    row(&b, State::AwaitingRetry, 1, ms(400)),
                    500,
                    300,
                    Some("server-error"),
                )
            },
        ),
        (14, row(&c, State::Executing, 1, ms(100))),
        (
            15,
            attempt(
                row(&c, State::Discarded, 1, ms(2100)),
                400,
                2000,
                Some("client-error"),
            ),
        ),
        (16, row(&d, State::Executing, 1, ms(200))),
    ];
    db.append(token, &[], &more).await.unwrap();
    assert!(db.transition_exists(b.id, 13).await.unwrap());
    assert!(!db.transition_exists(b.id, 14).await.unwrap());
    assert_eq!(db.max_transition_id().await.unwrap(), 16);
    assert_eq!(db.count_jobs().await.unwrap(), 5);
    assert_eq!(
        db.count_transitions_into(State::Executing).await.unwrap(),
        4
    );

    let counts = db.count_by_state().await.unwrap();
    let expected: HashMap<State, u64> = [
        (State::Succeeded, 1),
        (State::AwaitingRetry, 1),
        (State::Discarded, 1),
        (State::Executing, 1),
        (State::AwaitingScheduling, 1),
    ]
    .into();
    assert_eq!(counts, expected);
    log.push(format!("{:?}", sorted(counts)));
    Written {
        t0,
        token,
        jobs: [a, b, c, d, e],
        retry_at,
        more,
    }
}

/// Reads of jobs and histories give back exactly what was written.
async fn reads_of_jobs_and_histories(db: &JobDb, written: &Written, log: &mut Vec<String>) {
    let [a, b, c, d, e] = written.jobs.clone();
    let more = &written.more;
    let got = db.get_jobs(&[a.id, e.id]).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got.iter().find(|j| j.id == a.id).unwrap(), &*a);
    let history = db.get_transitions(b.id).await.unwrap();
    assert_eq!(
        history.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![2, 12, 13]
    );
    assert_eq!(history[2].1, more[3].1);
    log.push(format!("{history:?}"));
    let all = db.all_transitions().await.unwrap();
    assert_eq!(all.len(), 12);
    log.push(format!("{all:?}"));
    let histories = db.histories_of(&[b.id, c.id]).await.unwrap();
    assert_eq!(histories[&c.id].len(), 3);
    let latest = db.latest_of(&[a.id, d.id]).await.unwrap();
    assert_eq!(latest[&a.id].state, State::Succeeded);
    assert_eq!(latest[&d.id].state, State::Executing);
    assert_eq!(
        db.existing_jobs(&[a.id, JobId::from_bytes([9; 16])])
            .await
            .unwrap(),
        [a.id].into()
    );
    // The drainer's id index reads the keyed jobs in id order, page by page.
    let ids: Vec<JobId> = all.iter().map(|(_, t)| t.job_id).collect();
    let mut keyed: Vec<ulid::Ulid> = db
        .get_jobs(&ids)
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.idempotency_key.is_some() || j.event.is_some())
        .map(|j| j.id.0)
        .collect();
    keyed.sort();
    keyed.dedup();
    assert!(!keyed.is_empty(), "the scenario has keyed jobs");
    assert_eq!(db.keyed_ids(None, 1000).await.unwrap(), keyed);
    let mut paged = Vec::new();
    loop {
        let page = db.keyed_ids(paged.last().copied(), 1).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert_eq!(page.len(), 1);
        paged.extend(page);
    }
    assert_eq!(paged, keyed);
}

/// What a new owner loads: unfinished jobs, stranded attempts, the backlog by pages.
async fn what_a_new_owner_loads(db: &JobDb, written: &Written) {
    let [_, b, _, d, e] = written.jobs.clone();
    let ms = |n: i64| written.t0 + TimeDelta::milliseconds(n);
    let retry_at = written.retry_at;
    let unfinished = db.load_unfinished().await.unwrap();
    assert_eq!(
        unfinished.iter().map(|(j, _)| j.id).collect::<Vec<_>>(),
        vec![b.id, d.id, e.id]
    );
    assert_eq!(unfinished[0].0.payload, b.payload, "payloads included");
    assert_eq!(db.unfinished_count().await.unwrap(), 3);
    let stranded = db.load_stranded().await.unwrap();
    assert_eq!(
        stranded.settle,
        vec![(
            d.id,
            Progress {
                state: State::Executing,
                attempts: 1,
                retry_at: None,
                started: None,
            }
        )]
    );
    assert!(
        stranded.unlisted.is_empty(),
        "rows written before schema 5 are all listed"
    );
    // Due now: only e (never tried); b's retry is a minute ahead.
    let page = db
        .backlog_page(None, ms(1000), ms(1000), 100, 10, None)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|(j, _)| j.id).collect::<Vec<_>>(),
        vec![e.id]
    );
    assert!(page[0].0.payload.is_empty(), "pages carry no payload");
    // Due later: b too, in id order, and the cursor and the limit page through them.
    let page = db
        .backlog_page(None, retry_at, retry_at, 100, 1, None)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|(j, _)| j.id).collect::<Vec<_>>(),
        vec![b.id]
    );
    assert_eq!(page[0].1.retry_at, Some(retry_at));
    let page = db
        .backlog_page(Some(b.id), retry_at, retry_at, 100, 10, None)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|(j, _)| j.id).collect::<Vec<_>>(),
        vec![e.id]
    );
    // A page may leave one lane out (the endpoint without query or fragment).
    for (left_out, rest) in [
        ("https://a.example/hook", e.id),
        ("https://c.example/x", b.id),
    ] {
        let page = db
            .backlog_page(None, retry_at, retry_at, 100, 10, Some(left_out))
            .await
            .unwrap();
        assert_eq!(
            page.iter().map(|(j, _)| j.id).collect::<Vec<_>>(),
            vec![rest],
            "without {left_out}"
        );
    }
    // The writer named each entry's lane; an entry of unknown lane (written by hand, or by a
    // release before schema 6) is read by every page.
    operator_sql(
        db,
        "UPDATE open_jobs SET lane = NULL WHERE lane = 'https://a.example/hook'",
    )
    .await;
    let page = db
        .backlog_page(
            None,
            retry_at,
            retry_at,
            100,
            10,
            Some("https://a.example/hook"),
        )
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|(j, _)| j.id).collect::<Vec<_>>(),
        vec![b.id, e.id]
    );
    // Rows written at or after `before_row` are not the backlog's.
    let page = db
        .backlog_page(None, retry_at, retry_at, 13, 10, None)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|(j, _)| j.id).collect::<Vec<_>>(),
        vec![e.id]
    );
}

/// Operator commands: appended with plain SQL (the same statement on both engines).
async fn operator_commands(db: &JobDb, written: &Written, log: &mut Vec<String>) {
    let [_, b, ..] = written.jobs.clone();
    assert!(db.commands_after(0).await.unwrap().is_empty());
    operator_sql(
        db,
        "INSERT INTO operator_commands (issued_by, action, endpoint_prefix, reason) \
         VALUES ('ops', 'expedite', 'https://a.example/', 'outage over')",
    )
    .await;
    let commands = db.commands_after(0).await.unwrap();
    assert_eq!(commands.len(), 1);
    let command = &commands[0];
    assert_eq!(command.issued_by, "ops");
    assert_eq!(
        command.endpoint_prefix.as_deref(),
        Some("https://a.example/")
    );
    let targets = db.command_targets(command.id, 100).await.unwrap();
    assert_eq!(
        targets.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![b.id]
    );
    assert_eq!(db.last_applied_command().await.unwrap(), 0);
    db.record_command_result(command.id, "conformance", 1)
        .await
        .unwrap();
    db.record_command_result(command.id, "again", 5)
        .await
        .unwrap();
    assert_eq!(db.last_applied_command().await.unwrap(), command.id);
    log.push(format!("{:?} {:?}", command.action, targets));
}

/// Lifecycle: imports with origins, planned moves.
async fn imports_and_planned_moves(db: &JobDb, written: &Written) {
    let [a, b, _, _, e] = written.jobs.clone();
    let ms = |n: i64| written.t0 + TimeDelta::milliseconds(n);
    let token = written.token;
    let f = job(6, "b3", "https://c.example/x", ms(5));
    let origin = Origin {
        job_id: f.id,
        from_jobdb: "old_jobdb".into(),
        imported_at: ms(500),
    };
    db.append_all(
        token,
        &jobdb::Append {
            jobs: std::slice::from_ref(&f),
            transitions: &[(17, row(&f, State::AwaitingScheduling, 0, ms(500)))],
            origins: &[origin.clone(), origin.clone()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        db.origin_of(f.id).await.unwrap().as_deref(),
        Some("old_jobdb")
    );
    assert_eq!(db.origin_of(a.id).await.unwrap(), None);
    let batch = ulid::Ulid::from_parts(1, 7);
    db.plan_moves(token, batch, "live_jobdb", &[b.id, e.id])
        .await
        .unwrap();
    let planned = db.planned_moves().await.unwrap();
    assert_eq!(planned.len(), 1);
    assert_eq!(planned[0].jobs, vec![b.id, e.id]);
    assert_eq!(planned[0].to_jobdb, "live_jobdb");
    db.append(token, &[], &[(18, row(&e, State::Moved, 0, ms(600)))])
        .await
        .unwrap();
    assert_eq!(db.planned_moves().await.unwrap()[0].jobs, vec![b.id]);
    assert_eq!(db.move_targets(&[e.id]).await.unwrap()[&e.id], "live_jobdb");
}

/// Lifecycle: archive batches, planned and confirmed.
async fn archive_batches(db: &JobDb, written: &Written) {
    let [a, _, c, _, e] = written.jobs.clone();
    let token = written.token;
    let history_batch = PlannedBatch {
        batch: ulid::Ulid::from_parts(2, 9),
        kind: BatchKind::History,
        object_key: "conformance/history/2.ndjson.gz".into(),
        jobs: vec![a.id, c.id],
    };
    db.plan_archive_batch(token, &history_batch).await.unwrap();
    assert!(
        db.plan_archive_batch(
            token,
            &PlannedBatch {
                batch: ulid::Ulid::from_parts(3, 9),
                ..history_batch.clone()
            }
        )
        .await
        .is_err(),
        "a job is archived once per kind"
    );
    assert_eq!(
        db.archive_batch(history_batch.batch).await.unwrap(),
        Some(history_batch.clone())
    );
    assert_eq!(
        db.archive_batches_of(BatchKind::History, &[c.id])
            .await
            .unwrap(),
        vec![history_batch.clone()]
    );
    assert!(db
        .archive_batches_of(BatchKind::Expired, &[c.id])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        db.without_archived_history().await.unwrap(),
        vec![a.id, c.id, e.id]
    );
    db.confirm_archive_batch(token, history_batch.batch, &"ab".repeat(32), &[])
        .await
        .unwrap();
    db.confirm_archive_batch(token, history_batch.batch, &"ab".repeat(32), &[])
        .await
        .unwrap();
    assert_eq!(db.without_archived_history().await.unwrap(), vec![e.id]);
}

/// Replay's reader: ended jobs by filter, with payloads.
async fn replays_reader(db: &JobDb, written: &Written) {
    let [_, _, c, ..] = written.jobs.clone();
    let filter = EndedFilter {
        discarded: true,
        archived: true,
        endpoint_prefix: Some("https://b.".into()),
        ..Default::default()
    };
    let ended = db.ended_jobs(&filter, None, 10).await.unwrap();
    assert_eq!(ended.len(), 1);
    assert_eq!((ended[0].0.id, ended[0].1), (c.id, State::Discarded));
    assert_eq!(ended[0].0.payload, c.payload);
    let none = EndedFilter {
        bucket: Some("b1".into()),
        ..filter.clone()
    };
    assert!(db.ended_jobs(&none, None, 10).await.unwrap().is_empty());
}

/// The dashboard's reads.
async fn the_dashboards_reads(db: &JobDb, written: &Written, log: &mut Vec<String>) {
    let [a, b, c, ..] = written.jobs.clone();
    let t0 = written.t0;
    let slots = db.transitions_per_slot(t0, 1).await.unwrap();
    let slotted: u64 = slots.iter().map(|s| s.count).sum();
    assert_eq!(slotted, 14, "every row since t0: {slots:?}");
    assert!(slots
        .iter()
        .any(|s| s.slot == 2 && s.state == State::Discarded && s.count == 1));
    log.push(format!("{:?}", sorted_debug(&slots)));
    let backlog = db.lane_backlog().await.unwrap();
    let lanes: Vec<_> = sorted_debug(&backlog);
    assert!(backlog
        .iter()
        .any(|l| l.lane == "https://a.example/hook" && l.state == State::AwaitingRetry));
    log.push(format!("{lanes:?}"));
    let attempts = db.lane_attempts(t0).await.unwrap();
    let total: u64 = attempts.iter().map(|a| a.attempts).sum();
    assert_eq!(total, 3);
    for a in &attempts {
        let expect = match a.state {
            State::Succeeded => 50,
            State::AwaitingRetry => 300,
            _ => 2000,
        };
        let back = spindle::jobdb::stats::latency_ms(a.latency_key);
        assert!((back - f64::from(expect)).abs() / f64::from(expect) < 0.05);
    }
    log.push(format!("{:?}", sorted_debug(&attempts)));
    let lane_slots = db.lane_slots(t0, 1).await.unwrap();
    assert_eq!(
        lane_slots.iter().map(|s| s.succeeded).sum::<u64>(),
        1,
        "{lane_slots:?}"
    );
    assert_eq!(lane_slots.iter().map(|s| s.failed).sum::<u64>(), 2);
    log.push(format!("{:?}", sorted_debug(&lane_slots)));
    let errors = db.lane_errors(t0).await.unwrap();
    assert_eq!(errors.len(), 2);
    assert!(errors
        .iter()
        .any(|e| e.error_type == "client-error" && e.response_status == Some(400)));
    log.push(format!("{:?}", sorted_debug(&errors)));
    assert_eq!(db.succeeded_by_attempts().await.unwrap(), vec![(1, 1)]);
    assert_eq!(
        db.jobs_with_idempotency_key("key-2", 10).await.unwrap(),
        vec![b.id]
    );
    let summaries = db.job_summaries(&[c.id, a.id]).await.unwrap();
    assert_eq!(summaries.len(), 2);
    assert_eq!(summaries[0].job.id, a.id);
    assert_eq!(summaries[0].payload_bytes, a.payload.len() as u64);
    assert!(summaries[0].job.payload.is_empty());
    log.push(format!("{summaries:?}"));
    let record = db.owner_record().await.unwrap();
    assert_eq!(
        (record.fencing_token, record.holder.as_str()),
        (1, "conformance")
    );
    assert!(record.acquired_at.is_some());
    let created = db.created_at().await.unwrap().expect("migrated");
    assert!((Utc::now() - created).num_seconds().abs() < 3600);
    let size = db.size().await.unwrap();
    assert!(size.bytes > 0 && db.data_bytes().await.unwrap() > 0);
}

/// A reader of the same release opens it without migrating; the purge empties it.
async fn a_reader_and_the_purge(db: &JobDb) {
    let reader = JobDb::open_reader(db.url(), 1).await.unwrap();
    assert_eq!(reader.count_jobs().await.unwrap(), 6);
    reader.close().await;
    assert_eq!(db.delete_all_in_chunks(4).await.unwrap(), 6 + 14);
    assert_eq!(db.count_jobs().await.unwrap(), 0);
}

fn sorted<K: std::fmt::Debug, V: std::fmt::Debug>(map: HashMap<K, V>) -> Vec<String> {
    let mut out: Vec<String> = map.iter().map(|e| format!("{e:?}")).collect();
    out.sort();
    out
}

fn sorted_debug<T: std::fmt::Debug>(items: &[T]) -> Vec<String> {
    let mut out: Vec<String> = items.iter().map(|e| format!("{e:?}")).collect();
    out.sort();
    out
}

async fn every_store_operation_behaves_as_specified(engine: Engine) {
    let test = TestDb::on(engine, "conform");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    scenario(&db, base_time()).await;
    db.close().await;
}

/// Rows of an operator's query, each column read as text (the same on both engines).
pub(crate) async fn operator_rows(db: &JobDb, sql: &str, columns: usize) -> Vec<Vec<String>> {
    use sqlx::Row;
    let url = db.url();
    let text = |row: Vec<Option<String>>| {
        row.into_iter()
            .map(|v| v.unwrap_or_else(|| "NULL".into()))
            .collect::<Vec<_>>()
    };
    match url.sqlite_file() {
        Some(file) => {
            let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
                .await
                .unwrap();
            let rows = sqlx::query(sql).fetch_all(&mut conn).await.unwrap();
            let out = rows
                .iter()
                .map(|r| {
                    text(
                        (0..columns)
                            .map(|i| r.get::<Option<String>, _>(i))
                            .collect(),
                    )
                })
                .collect();
            conn.close().await.unwrap();
            out
        }
        None => {
            let mut conn = url.mysql_options().unwrap().connect().await.unwrap();
            let rows = sqlx::query(sql).fetch_all(&mut conn).await.unwrap();
            // MySQL types a UNION's text columns as binary: read bytes.
            let bytes = |r: &sqlx::mysql::MySqlRow, i: usize| {
                r.get::<Option<Vec<u8>>, _>(i)
                    .map(|b| String::from_utf8(b).unwrap())
            };
            let out = rows
                .iter()
                .map(|r| text((0..columns).map(|i| bytes(r, i)).collect()))
                .collect();
            conn.close().await.unwrap();
            out
        }
    }
}

/// Schema 5's write path: jobs accepted and attempts begun are recorded by the commit that
/// accepts or begins them (`commit_log`), rows that end attempts name that commit, jobs rest
/// into `open_jobs` only when told, and the checkpoint bounds what is read. The open work, the
/// stranded jobs, the histories the library expands and the `job_history` view all agree.
async fn commit_log_scenario(db: &JobDb, t0: DateTime<Utc>) -> Vec<String> {
    use spindle::job::{AttemptRecord, AttemptStart};
    use spindle::jobdb::{Append, CommitLog, Fresh, OpenRow};
    let mut log = Vec::new();
    let ms = |n: i64| t0 + TimeDelta::milliseconds(n);
    let token = db.take_ownership("conformance").await.unwrap();
    let (g, h, i, k) = (
        job(11, "b1", "https://a.example/g", ms(0)),
        job(12, "b1", "https://a.example/h", ms(0)),
        job(13, "b2", "https://b.example/i", ms(0)),
        job(14, "b2", "https://b.example/k", ms(0)),
    );
    let jobs = [g.clone(), h.clone(), i.clone(), k.clone()];
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    // Commit 100 accepts four jobs: no row of their own.
    db.append_all(
        token,
        &Append {
            jobs: &jobs,
            log: Some(CommitLog {
                id: 100,
                time: ms(10),
                accepted: &ids,
                started: &[],
            }),
            ..Append::default()
        },
    )
    .await
    .unwrap();
    assert!(db.commit_exists(100).await.unwrap());
    assert!(!db.commit_exists(99).await.unwrap());
    assert_eq!(
        db.count_transitions_into(State::AwaitingScheduling)
            .await
            .unwrap(),
        0
    );
    let work = db.open_work().await.unwrap();
    assert_eq!(work.len(), 4);
    assert!(work
        .iter()
        .all(|w| !w.listed && w.progress.state == State::AwaitingScheduling));
    assert_eq!(db.unfinished_count().await.unwrap(), 4);
    let unlisted = db.load_stranded().await.unwrap().unlisted;
    assert_eq!(unlisted.iter().map(|(id, _)| *id).collect::<Vec<_>>(), ids);
    assert!(
        unlisted.iter().all(|(_, place)| place.is_none()),
        "unordered: no place"
    );
    // Commit 101 begins attempts of g and h.
    db.append_all(
        token,
        &Append {
            log: Some(CommitLog {
                id: 101,
                time: ms(20),
                accepted: &[],
                started: &[(g.id, 1), (h.id, 1)],
            }),
            ..Append::default()
        },
    )
    .await
    .unwrap();
    let stranded = db.load_stranded().await.unwrap();
    let start = AttemptStart {
        commit: 101,
        at: ms(20),
    };
    assert_eq!(
        stranded.settle,
        vec![
            (
                g.id,
                Progress {
                    state: State::Executing,
                    attempts: 1,
                    retry_at: None,
                    started: Some(start),
                }
            ),
            (
                h.id,
                Progress {
                    state: State::Executing,
                    attempts: 1,
                    retry_at: None,
                    started: Some(start),
                }
            ),
        ]
    );
    let history = db.get_transitions(g.id).await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|(id, t)| (*id, t.state))
            .collect::<Vec<_>>(),
        vec![(0, State::AwaitingScheduling), (101, State::Executing)]
    );
    // g succeeds, h waits for a retry (its entry gets its expiry from the writer's account),
    // i rests, and the checkpoint stays at the oldest commit holding something open (100: k).
    let begun = AttemptRecord {
        started: Some(AttemptStart {
            commit: 101,
            at: ms(25),
        }),
        duration: Some(Duration::from_millis(5)),
        response_status: Some(200),
        ..AttemptRecord::default()
    };
    let retry_at = ms(60_000);
    let rows = [
        (102, Transition::succeeded(g.id, 1, ms(30), begun.clone())),
        (
            103,
            Transition::awaiting_retry(h.id, 1, ms(30), retry_at, begun.clone()),
        ),
    ];
    let fresh: HashMap<JobId, Fresh> = [(g.id, Fresh::of(&g)), (h.id, Fresh::of(&h))].into();
    db.append_all(
        token,
        &Append {
            transitions: &rows,
            rests: &[OpenRow::resting(i.id, 104, Some(Fresh::of(&i)))],
            fresh: Some(&fresh),
            checkpoint: Some(100),
            ..Append::default()
        },
    )
    .await
    .unwrap();
    let mut work = db.open_work().await.unwrap();
    work.sort_by_key(|w| w.job_id);
    assert_eq!(
        work.iter()
            .map(|w| (w.job_id, w.progress.state, w.listed))
            .collect::<Vec<_>>(),
        vec![
            (h.id, State::AwaitingRetry, true),
            (i.id, State::AwaitingScheduling, true),
            (k.id, State::AwaitingScheduling, false),
        ]
    );
    assert_eq!(work[0].progress.retry_at, Some(retry_at));
    // k rests too, its writer knowing nothing of it (a recovered job: the entry reads its
    // expiry and lane from `jobs`); the checkpoint moves past both commits: nothing below it
    // is open.
    db.append_all(
        token,
        &Append {
            rests: &[OpenRow::resting(k.id, 105, None)],
            checkpoint: Some(106),
            ..Append::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(db.unfinished_count().await.unwrap(), 3);
    assert!(db.load_stranded().await.unwrap().unlisted.is_empty());
    assert_eq!(db.max_transition_id().await.unwrap(), 105);
    // Rested entries carry the jobs' expiry (a page due by then finds them).
    let page = db
        .backlog_page(None, ms(1000), ms(1000), 200, 10, None)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|(j, _)| j.id).collect::<Vec<_>>(),
        vec![i.id, k.id]
    );
    // Each new entry got its lane, however its writer knew the job: a page leaves it out.
    for (left_out, rest) in [
        ("https://b.example/i", vec![h.id, k.id]),
        ("https://b.example/k", vec![h.id, i.id]),
        ("https://a.example/h", vec![i.id, k.id]),
    ] {
        let page = db
            .backlog_page(None, retry_at, retry_at, 200, 10, Some(left_out))
            .await
            .unwrap();
        let ids: Vec<JobId> = page.iter().map(|(j, _)| j.id).collect();
        assert_eq!(ids, rest, "without {left_out}");
    }
    let expiring = db.next_due_after(ms(70_000), false).await.unwrap();
    assert_eq!(expiring, Some(g.expire_at.min(h.expire_at)));
    // Histories: the library's expansion and the operators' view tell the same story.
    let histories = db.histories_of(&ids).await.unwrap();
    let steps = |id: JobId| {
        histories[&id]
            .iter()
            .map(|(n, t)| (*n, t.state, t.attempts))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        steps(g.id),
        vec![
            (0, State::AwaitingScheduling, 0),
            (101, State::Executing, 1),
            (102, State::Succeeded, 1)
        ]
    );
    assert_eq!(histories[&g.id][1].1.time, ms(25), "when its request began");
    assert_eq!(
        steps(h.id),
        vec![
            (0, State::AwaitingScheduling, 0),
            (101, State::Executing, 1),
            (103, State::AwaitingRetry, 1)
        ]
    );
    assert_eq!(steps(i.id), vec![(0, State::AwaitingScheduling, 0)]);
    let view = operator_rows(
        db,
        "SELECT hex(job_id), CAST(id AS CHAR), state, CAST(attempts AS CHAR) \
         FROM job_history ORDER BY job_id, id",
        4,
    )
    .await;
    let ours: Vec<Vec<String>> = ids
        .iter()
        .flat_map(|id| {
            histories[id].iter().map(move |(n, t)| {
                vec![
                    id.to_hex(),
                    n.to_string(),
                    t.state.as_str().to_owned(),
                    t.attempts.to_string(),
                ]
            })
        })
        .collect();
    assert_eq!(view, ours);
    let latest = operator_rows(
        db,
        "SELECT hex(job_id), state FROM job_latest ORDER BY job_id",
        2,
    )
    .await;
    assert_eq!(
        latest.iter().map(|r| r[1].as_str()).collect::<Vec<_>>(),
        vec![
            "succeeded",
            "awaiting-retry",
            "awaiting-scheduling",
            "awaiting-scheduling"
        ]
    );
    log.push(format!("{view:?}"));
    log.push(format!("{:?}", sorted(db.count_by_state().await.unwrap())));
    log
}

async fn the_commit_log_holds_what_has_no_row_yet(engine: Engine) {
    let test = TestDb::on(engine, "commitlog");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    commit_log_scenario(&db, base_time()).await;
    db.close().await;
}

/// The same scenario on both engines answers the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_engines_answer_alike() {
    let t0 = base_time();
    let mut transcripts = Vec::new();
    for engine in [Engine::MySql, Engine::Sqlite] {
        let test = TestDb::on(engine, "alike");
        let db = JobDb::open(&test.url, true, 2).await.unwrap();
        transcripts.push(scenario(&db, t0).await);
        db.close().await;
        let test = TestDb::on(engine, "alike5");
        let db = JobDb::open(&test.url, true, 2).await.unwrap();
        let last = transcripts.len() - 1;
        transcripts[last].extend(commit_log_scenario(&db, t0).await);
        db.close().await;
    }
    assert_eq!(transcripts[0].len(), transcripts[1].len());
    for (mysql, sqlite) in transcripts[0].iter().zip(&transcripts[1]) {
        assert_eq!(mysql, sqlite);
    }
}
