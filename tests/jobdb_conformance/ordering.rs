//! Ordered keys in the store: entries go in held or released as their writer says, held ones
//! are released by name (or, for a sequence only the store holds, as the head it reads); what
//! ends, expires or is flushed leaves its sequence; blocks are written, carried in, read and
//! forgotten; a new owner finds every ordered job in its place; and another JobDB's read of a
//! sequence always sees its open job. Which job goes is the Director's ordering part's
//! decision (unit-tested there); these test what the store does with it.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{TimeDelta, Utc};
use spindle::job::{Job, JobId, OrderedKey, State, Transition};
use spindle::jobdb::{self, JobDb};

use crate::common::*;
use crate::{attempt, base_time, job, row};

crate::on_both_engines!(
    ordered_jobs_wait_held_and_are_released_one_at_a_time,
    ordered_jobs_leave_their_sequence_when_they_end_expire_or_are_flushed,
    a_read_from_elsewhere_sees_a_job_while_it_is_released,
    a_new_owner_finds_every_ordered_job_in_its_place,
);

/// `base` as a job of ordering key `key` at `position` (blocking its key when it fails if
/// `blocks`).
fn keyed(base: &Job, key: &str, blocks: bool, position: ulid::Ulid) -> Job {
    Job {
        ordering: Some(OrderedKey {
            key: key.into(),
            blocks,
            position,
        }),
        ..base.clone()
    }
}

/// Every ordered entry of `db` as (job, sequence, position, held, blocks), by job.
async fn entries(db: &JobDb) -> Vec<(JobId, spindle::job::Seq, ulid::Ulid, bool, bool)> {
    let mut entries = db.ordered_entries().await.unwrap();
    entries.sort_by_key(|e| e.job);
    entries
        .iter()
        .map(|e| (e.job, e.seq, e.position, e.held, e.blocks))
        .collect()
}

async fn ordered_jobs_wait_held_and_are_released_one_at_a_time(engine: Engine) {
    use spindle::jobdb::Append;
    let test = TestDb::on(engine, "seqconf");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let t0 = base_time();
    let ordered = |n: u8, key: &str, blocks: bool| {
        let base = job(n, "b", "https://x.example/a", t0);
        Arc::new(keyed(&base, key, blocks, base.id.0))
    };
    let heads_of = |heads: HashMap<spindle::job::Seq, spindle::jobdb::Head>| {
        heads
            .into_iter()
            .map(|(seq, head)| (seq, head.job))
            .collect::<HashMap<_, _>>()
    };
    let (a1, a2, a3) = (
        ordered(1, "k", false),
        ordered(2, "k", true),
        ordered(3, "k", false),
    );
    // Same key, other endpoint: another sequence.
    let b1 = Arc::new(Job {
        endpoint: "https://x.example/b".into(),
        ..(*ordered(4, "k", false)).clone()
    });
    let free = job(5, "b", "https://x.example/a", t0);
    let seq_a = a1.seq().unwrap();
    let seq_b = b1.seq().unwrap();
    assert_ne!(seq_a, seq_b);
    assert_eq!(a2.seq(), Some(seq_a));
    let jobs = [a3.clone(), a1.clone(), b1.clone(), a2.clone(), free.clone()];
    let rows: Vec<(u64, Transition)> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (i as u64 + 1, row(j, State::AwaitingScheduling, 0, t0)))
        .collect();
    let written = db
        .append_all(
            token,
            &Append {
                jobs: &jobs,
                transitions: &rows,
                ..Append::default()
            },
        )
        .await
        .unwrap();
    assert!(written.released.is_empty());
    let stored = db.get_jobs(&[a2.id]).await.unwrap();
    assert_eq!(
        stored[0].ordering, a2.ordering,
        "the key is stored with its job"
    );
    // Every ordered entry, held, with its place and whether its job blocks its key.
    assert_eq!(
        entries(&db).await,
        vec![
            (a1.id, seq_a, a1.id.0, true, false),
            (a2.id, seq_a, a2.id.0, true, true),
            (a3.id, seq_a, a3.id.0, true, false),
            (b1.id, seq_b, b1.id.0, true, false),
        ]
    );
    // Held jobs are not read by backlog pages: only the unordered job is due.
    let page = |db: &JobDb| {
        let db = db.clone();
        async move {
            db.backlog_page(None, t0, t0, 1000, 100, None)
                .await
                .unwrap()
                .into_iter()
                .map(|(j, _)| j.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(page(&db).await, vec![free.id]);
    let heads = heads_of(db.sequence_heads(None).await.unwrap());
    assert_eq!(heads, HashMap::from([(seq_a, a1.id), (seq_b, b1.id)]));
    // A proposed head that is not its sequence's head in the store releases nothing.
    let release_if_head = |db: &JobDb, heads: Vec<(spindle::job::Seq, JobId)>| {
        let db = db.clone();
        async move {
            db.append_all(
                token,
                &Append {
                    release_if_head: &heads,
                    ..Append::default()
                },
            )
            .await
            .unwrap()
            .released
        }
    };
    let released = release_if_head(&db, vec![(seq_a, a2.id), (seq_a, a1.id)]).await;
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].job.id, a1.id);
    assert_eq!(released[0].job.payload, a1.payload, "released whole");
    assert_eq!(released[0].attempts, 0);
    // One job of a sequence at a time: a is under way, b still waits.
    assert_eq!(
        heads_of(db.sequence_heads(None).await.unwrap()),
        HashMap::from([(seq_b, b1.id)])
    );
    assert!(release_if_head(&db, vec![(seq_a, a2.id)]).await.is_empty());
    let mut due = page(&db).await;
    due.sort();
    assert_eq!(due, vec![a1.id, free.id], "a released job is read like any");
    // A job named to release is released only while it is held and waits: a1 is released
    // already.
    let release = |db: &JobDb, go: Vec<JobId>| {
        let db = db.clone();
        async move {
            db.append_all(
                token,
                &Append {
                    release: &go,
                    ..Append::default()
                },
            )
            .await
            .unwrap()
            .released
        }
    };
    assert!(release(&db, vec![a1.id]).await.is_empty());
    // Its end: the store reads its sequence when asked to.
    let end = t0 + TimeDelta::seconds(1);
    let ends = [(
        20,
        attempt(row(&a1, State::Succeeded, 1, end), 200, 5, None),
    )];
    let written = db
        .append_all(
            token,
            &Append {
                transitions: &ends,
                read_left: &[a1.id, free.id],
                ..Append::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        written.left,
        vec![(a1.id, seq_a)],
        "the unordered one has none"
    );
    assert!(written.blocks_written.is_empty());
    assert_eq!(
        heads_of(db.sequence_heads(Some(&[seq_a])).await.unwrap()),
        HashMap::from([(seq_a, a2.id)])
    );
    // a2 asked to block: discarded by a failure, it blocks its sequence until an operator
    // says otherwise.
    let released = release(&db, vec![a2.id]).await;
    assert_eq!(released.len(), 1);
    let ends = [(
        21,
        attempt(row(&a2, State::Discarded, 1, end), 400, 5, Some("http-4xx")),
    )];
    let written = db
        .append_all(
            token,
            &Append {
                transitions: &ends,
                read_left: &[a2.id],
                ..Append::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(written.blocks_written, vec![seq_a]);
    assert_eq!(db.blocked_sequences().await.unwrap(), vec![seq_a]);
    assert!(db.sequence_heads(Some(&[seq_a])).await.unwrap().is_empty());
    let elsewhere = db.sequences_elsewhere(&[seq_a, seq_b], 9).await.unwrap();
    assert_eq!(
        elsewhere.oldest,
        HashMap::from([(seq_a, a3.id.0), (seq_b, b1.id.0)]),
        "what another JobDB's head must not overtake"
    );
    assert_eq!(
        elsewhere.blocked.into_iter().collect::<Vec<_>>(),
        vec![seq_a],
        "a block another JobDB's head must respect"
    );
    assert_eq!(
        db.sequences_elsewhere(&[seq_a, seq_b], 8)
            .await
            .unwrap()
            .oldest,
        HashMap::from([(seq_a, a3.id.0), (seq_b, b1.id.0)]),
        "schema 8: the id is the position"
    );
    assert!(
        db.sequences_elsewhere(&[seq_a, seq_b], 7)
            .await
            .unwrap()
            .oldest
            .is_empty(),
        "schema 7 holds no ordered job"
    );
    operator_sql(&db, "DELETE FROM ordering_blocked").await;
    assert!(db.blocked_sequences().await.unwrap().is_empty());
    assert_eq!(
        heads_of(db.sequence_heads(Some(&[seq_a])).await.unwrap()),
        HashMap::from([(seq_a, a3.id)])
    );
    // A new job its writer lets go at once goes in released, with no release to write; one
    // it keeps fresh has no entry at all, and is listed by the log row as accepted.
    let (c1, c2) = (ordered(6, "c", false), ordered(7, "c", false));
    let rests = [jobdb::OpenRow::resting(
        c1.id,
        30,
        Some(jobdb::Fresh::of(&c1)),
    )];
    db.append_all(
        token,
        &Append {
            jobs: &[c1.clone(), c2.clone()],
            rests: &rests,
            released_entries: &[c1.id],
            log: Some(jobdb::CommitLog {
                id: 31,
                time: t0,
                accepted: &[c2.id],
                started: &[],
            }),
            ..Append::default()
        },
    )
    .await
    .unwrap();
    let entries = db.ordered_entries().await.unwrap();
    let c1_entry = entries.iter().find(|e| e.job == c1.id).unwrap();
    assert!(!c1_entry.held, "it went at once");
    assert!(!entries.iter().any(|e| e.job == c2.id), "c2 is fresh");
    assert!(db
        .load_stranded()
        .await
        .unwrap()
        .unlisted
        .contains(&(c2.id, c2.place())));
    // A released head whose attempt begins in this commit (due by the log row's time) is
    // listed by it as started, not handed over; one due later is released and not begun.
    let (f1, f2) = (ordered(12, "f", false), ordered(13, "f", false));
    let t1 = t0 + TimeDelta::seconds(2);
    let f_rows = [
        (42, row(&f1, State::AwaitingScheduling, 0, t0)),
        (
            43,
            Transition::scheduled(f2.id, t0, t0 + TimeDelta::hours(1)),
        ),
    ];
    db.append_all(
        token,
        &Append {
            jobs: &[f1.clone(), f2.clone()],
            transitions: &f_rows,
            ..Append::default()
        },
    )
    .await
    .unwrap();
    let begin_both = [f1.id, f2.id];
    let written = db
        .append_all(
            token,
            &Append {
                release: &begin_both,
                begin: &begin_both,
                log: Some(jobdb::CommitLog {
                    id: 44,
                    time: t1,
                    accepted: &[],
                    started: &[],
                }),
                ..Append::default()
            },
        )
        .await
        .unwrap();
    let ids = |r: &[spindle::job::Recovered]| r.iter().map(|r| r.job.id).collect::<Vec<_>>();
    assert_eq!(ids(&written.started), vec![f1.id]);
    assert_eq!(ids(&written.released), vec![f2.id], "due in an hour");
    let settle = db.load_stranded().await.unwrap().settle;
    assert!(
        settle
            .iter()
            .any(|(id, p)| *id == f1.id && p.attempts == 1 && p.started.is_some()),
        "f1's attempt is under way: {settle:?}"
    );
    db.close().await;
}

/// Schema 9's rules of a sequence, on both engines: the order is the jobs' positions, not
/// their ids; `archiving` (expiry, flush) takes a job out of its sequence at once, so its next
/// job goes, and a flushed held job is never released; only an unsuccessful end the operator
/// did not choose blocks; a held job past its expiry is released to be ended; blocks carried
/// in by a move are stored with their key's names, listed and forgotten; a completion notice
/// is written at `archiving`, once.
async fn ordered_jobs_leave_their_sequence_when_they_end_expire_or_are_flushed(engine: Engine) {
    use spindle::job::ErrorType;
    use spindle::jobdb::{Append, BlockedKey};
    let test = TestDb::on(engine, "seqleave");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let t0 = base_time();
    // Positions against id order: job n sits at position 10 - n.
    let ordered = |n: u8, key: &str, blocks: bool| {
        let base = job(n, "b", "https://x.example/a", t0);
        let mut position = [0u8; 16];
        position[0] = 2;
        position[15] = 10 - n;
        Arc::new(Job {
            on_complete: Some("https://told.example/".into()),
            ..keyed(&base, key, blocks, JobId::from_bytes(position).0)
        })
    };
    let (j1, j2, j3, j4) = (
        ordered(1, "k", true),
        ordered(2, "k", true),
        ordered(3, "k", true),
        ordered(4, "k", false),
    );
    let seq = j1.seq().unwrap();
    let write = |jobs: Vec<Arc<Job>>,
                 rows: Vec<(u64, Transition)>,
                 release: Vec<(spindle::job::Seq, JobId)>,
                 expired: Vec<JobId>| {
        let db = db.clone();
        async move {
            let leaving: Vec<JobId> = rows.iter().map(|(_, t)| t.job_id).collect();
            db.append_all(
                token,
                &Append {
                    jobs: &jobs,
                    transitions: &rows,
                    release_if_head: &release,
                    release_expired: &expired,
                    read_left: &leaving,
                    ..Append::default()
                },
            )
            .await
            .unwrap()
        }
    };
    let jobs = vec![j1.clone(), j2.clone(), j3.clone(), j4.clone()];
    let rows = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (i as u64 + 1, row(j, State::AwaitingScheduling, 0, t0)))
        .collect();
    write(jobs, rows, vec![], vec![]).await;
    let head = |db: JobDb| async move {
        db.sequence_heads(Some(&[seq]))
            .await
            .unwrap()
            .get(&seq)
            .map(|h| h.job)
    };
    assert_eq!(
        head(db.clone()).await,
        Some(j4.id),
        "the lowest position goes first"
    );
    // An operator flushes the held j3 and discards the held j2, both asking to block: they
    // leave the sequence, block nothing, and are never released.
    let flushed = Transition {
        error_type: Some(ErrorType::OperatorFlush.as_str().into()),
        ..Transition::archiving(j3.id, 0, t0)
    };
    let discarded = Transition {
        error_type: Some(ErrorType::OperatorDiscard.as_str().into()),
        ..row(&j2, State::Discarded, 0, t0)
    };
    let written = write(vec![], vec![(10, flushed), (11, discarded)], vec![], vec![]).await;
    let mut left = written.left.clone();
    left.sort();
    let mut both = vec![(j2.id, seq), (j3.id, seq)];
    both.sort();
    assert_eq!(left, both);
    assert!(written.blocks_written.is_empty());
    assert_eq!(
        written.notices.len(),
        2,
        "flushed and discarded jobs are told at once"
    );
    assert!(write(vec![], vec![], vec![(seq, j3.id)], vec![])
        .await
        .released
        .is_empty());
    assert_eq!(db.ordering_counts().await.unwrap().blocked, 0);
    // j4 is released and expires under way: it leaves the sequence at `archiving` (its entry
    // stays for the archive), so j1 is the head at once.
    assert_eq!(
        write(vec![], vec![], vec![(seq, j4.id)], vec![])
            .await
            .released
            .len(),
        1
    );
    assert_eq!(head(db.clone()).await, None, "one at a time");
    let written = write(
        vec![],
        vec![(12, Transition::archiving(j4.id, 1, t0))],
        vec![],
        vec![],
    )
    .await;
    assert_eq!(written.notices.len(), 1, "told at its expiry");
    assert_eq!(
        head(db.clone()).await,
        Some(j1.id),
        "an expiry lets the next go"
    );
    // Archived later: told nothing more.
    let written = write(
        vec![],
        vec![(13, Transition::archived(j4.id, 1, t0))],
        vec![],
        vec![],
    )
    .await;
    assert!(written.notices.is_empty());
    // j1, held, is past its expiry: released to be ended; a job not expired is not.
    assert!(write(vec![], vec![], vec![], vec![j1.id])
        .await
        .released
        .is_empty());
    let late = Arc::new(Job {
        expire_at: t0 - TimeDelta::seconds(1),
        ..(*ordered(5, "late", true)).clone()
    });
    let late_seq = late.seq().unwrap();
    write(
        vec![late.clone()],
        vec![(20, row(&late, State::AwaitingScheduling, 0, t0))],
        vec![],
        vec![],
    )
    .await;
    let expired = db.expired_held(Utc::now(), 10).await.unwrap();
    assert_eq!(expired, vec![late.id]);
    let released = write(vec![], vec![], vec![], expired).await.released;
    assert_eq!(released.len(), 1);
    assert!(db.expired_held(Utc::now(), 10).await.unwrap().is_empty());
    // Its expiry, asking to block, blocks its key, named.
    let expiry = Transition {
        error_type: Some(ErrorType::Expired.as_str().into()),
        ..Transition::archiving(late.id, 0, t0)
    };
    write(vec![], vec![(21, expiry)], vec![], vec![]).await;
    let blocked = db.blocked_keys().await.unwrap();
    assert_eq!(blocked.len(), 1);
    assert_eq!(
        (
            blocked[0].job_id,
            blocked[0].state.as_str(),
            blocked[0].ordering_key.as_str()
        ),
        (late.id, "archiving", "late")
    );
    assert_eq!(blocked[0].seq(), late_seq);
    // A block carried in by a move is stored with the write, once.
    let carried = BlockedKey {
        job_id: JobId::from_bytes([9; 16]),
        state: "discarded".into(),
        blocked_at: t0,
        bucket: "b".into(),
        endpoint: "https://x.example/a".into(),
        ordering_key: "moved".into(),
    };
    for _ in 0..2 {
        db.append_all(
            token,
            &Append {
                blocks: std::slice::from_ref(&carried),
                ..Append::default()
            },
        )
        .await
        .unwrap();
    }
    let blocked = db.blocked_keys().await.unwrap();
    assert_eq!(blocked.len(), 2);
    assert!(blocked.contains(&carried));
    db.forget_blocks(token, &blocked).await.unwrap();
    assert!(db.blocked_keys().await.unwrap().is_empty());
    db.close().await;
}

/// Another JobDB's read of a sequence (`sequences_elsewhere`) finds its open job however the
/// job moves meanwhile: here a sequence always has one open job while its jobs arrive held, are
/// released, and end, as fast as the store takes them; a read that saw the held entries before
/// a release and the released ones after it would find none (found by the long checker run:
/// a key's next job in another JobDB overtook a job released during the read).
async fn a_read_from_elsewhere_sees_a_job_while_it_is_released(engine: Engine) {
    use spindle::jobdb::Append;
    let test = TestDb::on(engine, "seqread");
    let db = JobDb::open(&test.url, true, 4).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let t0 = base_time();
    let ordered = |n: u32| {
        let mut id = [0u8; 16];
        id[0] = 1;
        id[12..].copy_from_slice(&n.to_be_bytes());
        let id = JobId::from_bytes(id);
        let base = job(0, "b", "https://x.example/a", t0);
        Arc::new(Job {
            id,
            idempotency_key: None,
            ..keyed(&base, "k", false, id.0)
        })
    };
    let seq = ordered(1).seq().unwrap();
    let mut next_row = 1u64;
    let mut row_id = || {
        next_row += 1;
        next_row
    };
    let write = |jobs: Vec<Arc<Job>>, rows: Vec<(u64, Transition)>, release: Vec<_>| {
        let db = db.clone();
        async move {
            db.append_all(
                token,
                &Append {
                    jobs: &jobs,
                    transitions: &rows,
                    release_if_head: &release,
                    ..Append::default()
                },
            )
            .await
            .unwrap()
        }
    };
    let first = ordered(1);
    let arrive = |j: &Arc<Job>, id: u64| (id, row(j, State::AwaitingScheduling, 0, t0));
    write(vec![first.clone()], vec![arrive(&first, row_id())], vec![]).await;
    write(vec![], vec![], vec![(seq, first.id)]).await;

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = tokio::spawn({
        let (db, done) = (db.clone(), done.clone());
        async move {
            let (mut reads, mut missed) = (0u32, 0u32);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let found = db.sequences_elsewhere(&[seq], 9).await.unwrap();
                reads += 1;
                missed += u32::from(!found.oldest.contains_key(&seq));
            }
            (reads, missed)
        }
    });
    // Each turn: the next job arrives held, the released one ends, the next is released.
    let mut open = first;
    for n in 2..=600u32 {
        let next = ordered(n);
        write(vec![next.clone()], vec![arrive(&next, row_id())], vec![]).await;
        let end = (row_id(), row(&open, State::Succeeded, 1, t0));
        write(vec![], vec![end], vec![]).await;
        let released = write(vec![], vec![], vec![(seq, next.id)]).await.released;
        assert_eq!(released.len(), 1, "job {n} is its sequence's head");
        open = next;
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, missed) = reader.await.unwrap();
    assert!(reads > 100, "the reader ran alongside ({reads} reads)");
    assert_eq!(
        missed, 0,
        "reads that found no open job of a sequence that always had one ({reads} reads)"
    );
    db.close().await;
}

/// A new owner enters every fresh job its predecessor left (accepted, never rested) before
/// anything else: each ordered one held in its place, so its book (read from the entries) and
/// every other JobDB's read see it, and a drainer does the same before it moves them.
async fn a_new_owner_finds_every_ordered_job_in_its_place(engine: Engine) {
    use spindle::jobdb::Append;
    let test = TestDb::on(engine, "seqowner");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let t0 = base_time();
    let ordered = |n: u8| {
        let base = job(n, "b", "https://x.example/a", t0);
        Arc::new(keyed(&base, "k", n == 2, base.id.0))
    };
    let (k1, k2) = (ordered(1), ordered(2));
    let plain = job(3, "b", "https://x.example/a", t0);
    let seq = k1.seq().unwrap();
    // One commit accepted all three fresh (no entry): the first under way, the second kept.
    db.append_all(
        token,
        &Append {
            jobs: &[k1.clone(), k2.clone(), plain.clone()],
            log: Some(jobdb::CommitLog {
                id: 10,
                time: t0,
                accepted: &[k1.id, k2.id, plain.id],
                started: &[(k1.id, 1)],
            }),
            ..Append::default()
        },
    )
    .await
    .unwrap();
    assert!(db.ordered_entries().await.unwrap().is_empty());
    assert!(
        db.sequences_elsewhere(&[seq], 9)
            .await
            .unwrap()
            .oldest
            .is_empty(),
        "fresh jobs are invisible to entries"
    );
    let successor = db.take_ownership("next").await.unwrap();
    let stranded = db.load_stranded().await.unwrap();
    assert_eq!(stranded.unlisted.len(), 3);
    let next_id = db
        .enter_unlisted(successor, 100, &stranded.unlisted)
        .await
        .unwrap();
    assert_eq!(next_id, 103);
    assert_eq!(
        entries(&db).await,
        vec![
            (k1.id, seq, k1.id.0, true, false),
            (k2.id, seq, k2.id.0, true, true),
        ],
        "held in their places: the head goes by position"
    );
    assert_eq!(
        db.sequences_elsewhere(&[seq], 9).await.unwrap().oldest,
        HashMap::from([(seq, k1.id.0)])
    );
    assert!(db.load_stranded().await.unwrap().unlisted.is_empty());
    assert_eq!(
        db.backlog_page(None, t0, t0, 1000, 100, None)
            .await
            .unwrap()
            .into_iter()
            .map(|(j, _)| j.id)
            .collect::<Vec<_>>(),
        vec![plain.id],
        "the unordered one waits to be read like any"
    );
    db.close().await;
}
