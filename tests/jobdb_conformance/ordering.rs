//! Ordered keys: jobs of a sequence wait held and are released one at a time, in their
//! positions' order; what ends, expires or is flushed leaves its sequence; blocks are kept,
//! carried in and forgotten; and another JobDB's read of a sequence always sees its open job.

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
    a_writer_alone_reads_a_head_its_memory_cannot_vouch_for,
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

/// A writer alone on its JobDB, as the Director's is, for the writes of one test: what it
/// knows of the jobs it bore released (fresh: no entry), and its next log row.
#[derive(Default)]
struct Alone {
    fresh: HashMap<JobId, jobdb::Fresh>,
    sequences: HashMap<spindle::job::Seq, u32>,
    log: u64,
    /// Sequences whose next released job begins its attempt in the write (the scheduler
    /// held a place for it).
    begin: std::collections::HashSet<spindle::job::Seq>,
    /// The jobs the last write released and began, with their attempts before it.
    begun: Vec<(JobId, u16)>,
    /// What it knows of its sequences' entries, as the Director's writer keeps it.
    known: std::sync::Mutex<jobdb::KnownSequences>,
    /// How many heads the last write took from `known`, and of those, found not held.
    heads_known: (usize, usize),
}

impl Alone {
    /// Writes `jobs` and `rows` as a writer with no other live JobDB does (releasing the heads
    /// it makes in the same commit, with a log row): a new job whose only row is
    /// `awaiting-scheduling` and due now rests without it, as the writer enters an ordered
    /// job. Returns the jobs released and how many of them were born released (fresh).
    async fn write(
        &mut self,
        db: &JobDb,
        token: u64,
        jobs: &[Arc<Job>],
        rows: &[(u64, Transition)],
    ) -> (Vec<JobId>, usize) {
        let new = |t: &Transition| {
            t.state == State::AwaitingScheduling
                && t.retry_at.is_none()
                && jobs.iter().any(|j| j.id == t.job_id)
        };
        let rests: Vec<jobdb::OpenRow> = rows
            .iter()
            .filter(|(_, t)| new(t))
            .map(|(id, t)| {
                let job = jobs.iter().find(|j| j.id == t.job_id).unwrap();
                jobdb::OpenRow::resting(t.job_id, *id, Some(jobdb::Fresh::of(job)))
            })
            .collect();
        let rows: Vec<(u64, Transition)> = rows.iter().filter(|(_, t)| !new(t)).cloned().collect();
        let fresh: HashMap<JobId, jobdb::Fresh> = rows
            .iter()
            .filter_map(|(_, t)| Some((t.job_id, self.fresh.get(&t.job_id)?.clone())))
            .collect();
        self.log += 1;
        let append = jobdb::Append {
            jobs,
            transitions: &rows,
            rests: &rests,
            fresh: Some(&fresh),
            fresh_sequences: Some(&self.sequences),
            log: Some(jobdb::CommitLog {
                id: 1_000_000 + self.log,
                time: Utc::now(),
                accepted: &[],
                started: &[],
            }),
            release_touched: true,
            begin_released: Some(&self.begin),
            known: Some(&self.known),
            ..jobdb::Append::default()
        };
        let written = db.append_all(token, &append).await.unwrap();
        self.heads_known = (written.heads_known, written.heads_misremembered);
        self.begun = written
            .started
            .iter()
            .map(|r| (r.job.id, r.attempts))
            .collect();
        for (_, t) in &rows {
            if let Some(f) = self.fresh.remove(&t.job_id) {
                let seq = f.place.unwrap().seq;
                *self.sequences.get_mut(&seq).unwrap() -= 1;
                self.sequences.retain(|_, n| *n > 0);
            }
        }
        for id in &written.born {
            let job = jobs.iter().find(|j| j.id == *id).unwrap();
            *self.sequences.entry(job.seq().unwrap()).or_default() += 1;
            self.fresh.insert(*id, jobdb::Fresh::of(job));
        }
        let ids = written.released.into_iter().map(|r| r.job.id).collect();
        (ids, written.born.len())
    }
}

async fn ordered_jobs_wait_held_and_are_released_one_at_a_time(engine: Engine) {
    use spindle::jobdb::{Append, BlockedKey};
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
    let mut expected = vec![seq_a, seq_b];
    expected.sort();
    assert_eq!(written.touched, expected, "both sequences gained jobs");
    assert!(written.released.is_empty());
    let stored = db.get_jobs(&[a2.id]).await.unwrap();
    assert_eq!(
        stored[0].ordering, a2.ordering,
        "the key is stored with its job"
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
    // A release of a job that is not its sequence's head releases nothing.
    let release = |db: &JobDb, heads: Vec<(spindle::job::Seq, JobId)>| {
        let db = db.clone();
        async move {
            db.append_all(
                token,
                &Append {
                    release: &heads,
                    ..Append::default()
                },
            )
            .await
            .unwrap()
            .released
        }
    };
    let released = release(&db, vec![(seq_a, a2.id), (seq_a, a1.id)]).await;
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].job.id, a1.id);
    assert_eq!(released[0].job.payload, a1.payload, "released whole");
    assert_eq!(released[0].attempts, 0);
    // One job of a sequence at a time: a is under way, b still waits.
    assert_eq!(
        heads_of(db.sequence_heads(None).await.unwrap()),
        HashMap::from([(seq_b, b1.id)])
    );
    assert!(release(&db, vec![(seq_a, a2.id)]).await.is_empty());
    let mut due = page(&db).await;
    due.sort();
    assert_eq!(due, vec![a1.id, free.id], "a released job is read like any");
    // Its end moves the sequence on.
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
                ..Append::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(written.touched, vec![seq_a]);
    assert_eq!(
        heads_of(db.sequence_heads(Some(&[seq_a])).await.unwrap()),
        HashMap::from([(seq_a, a2.id)])
    );
    // a2 asked to block: discarded, it stops its sequence until an operator says otherwise.
    assert_eq!(release(&db, vec![(seq_a, a2.id)]).await.len(), 1);
    let ends = [(
        21,
        attempt(row(&a2, State::Discarded, 1, end), 400, 5, Some("http-4xx")),
    )];
    db.append_all(
        token,
        &Append {
            transitions: &ends,
            ..Append::default()
        },
    )
    .await
    .unwrap();
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
    assert_eq!(
        heads_of(db.sequence_heads(Some(&[seq_a])).await.unwrap()),
        HashMap::from([(seq_a, a3.id)])
    );
    // Where no other JobDB is live, a write releases the heads it makes: the first job of a
    // new sequence in the commit that stores it, the next in the commit that ends one.
    let (c1, c2) = (ordered(6, "c", false), ordered(7, "c", false));
    // The later of two new jobs of an empty sequence comes first in the write: order is by
    // position, not by place in the write.
    let jobs = [c2.clone(), c1.clone()];
    let rows: Vec<(u64, Transition)> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (30 + i as u64, row(j, State::AwaitingScheduling, 0, t0)))
        .collect();
    let mut alone = Alone::default();
    assert_eq!(
        alone.write(&db, token, &jobs, &rows).await,
        (vec![c1.id], 1)
    );
    // c1 was born released (no head read, no UPDATE, no entry): fresh, as an unordered job
    // is, listed as accepted by the commit's log row, where a new owner finds it with its
    // place. Its writer knows its sequence is under way, so a later job of it waits.
    assert_eq!(
        db.listed_among(&[c1.id, c2.id]).await.unwrap(),
        [c2.id].into_iter().collect()
    );
    assert!(db
        .load_stranded()
        .await
        .unwrap()
        .unlisted
        .contains(&(c1.id, c1.place())));
    // A head read from the store (the sequencer's sweep) sees c1's sequence with no job
    // under way and names c2; the write refuses it, as its writer knows better.
    let seq_c = c1.seq().unwrap();
    let sweep = [(seq_c, c2.id)];
    let written = db
        .append_all(
            token,
            &Append {
                release: &sweep,
                fresh_sequences: Some(&alone.sequences),
                ..Append::default()
            },
        )
        .await
        .unwrap();
    assert!(written.released.is_empty(), "{:?}", written.released);
    let c3 = ordered(8, "c", false);
    let later = [(33, row(&c3, State::AwaitingScheduling, 0, t0))];
    assert_eq!(
        alone
            .write(&db, token, std::slice::from_ref(&c3), &later)
            .await,
        (vec![], 0)
    );
    // A held job that leaves (flushed) does not free its sequence: c1 is still under way.
    let flushed = [(
        36,
        Transition {
            error_type: Some(spindle::job::ErrorType::OperatorFlush.as_str().into()),
            ..Transition::archiving(c3.id, 0, t0)
        },
    )];
    assert_eq!(alone.write(&db, token, &[], &flushed).await, (vec![], 0));
    // A new job of a key blocked here waits too, though its sequence has no entry.
    let (d1, d0) = (ordered(9, "d", false), ordered(10, "d", true));
    let block = BlockedKey {
        job_id: d0.id,
        state: "discarded".into(),
        blocked_at: t0,
        bucket: d0.bucket.to_string(),
        endpoint: d0.endpoint.to_string(),
        ordering_key: "d".into(),
    };
    db.append_all(
        token,
        &Append {
            blocks: &[block],
            ..Append::default()
        },
    )
    .await
    .unwrap();
    let first = [(34, row(&d1, State::AwaitingScheduling, 0, t0))];
    assert_eq!(
        alone
            .write(&db, token, std::slice::from_ref(&d1), &first)
            .await,
        (vec![], 0)
    );
    // A new first job that is scheduled is not born released: it holds its key, held, and
    // the commit's head read releases it to wait for its time (as any head).
    let e1 = ordered(11, "e", false);
    let at = t0 + TimeDelta::seconds(60);
    let scheduled = [(35, Transition::scheduled(e1.id, t0, at))];
    assert_eq!(
        alone
            .write(&db, token, std::slice::from_ref(&e1), &scheduled)
            .await,
        (vec![e1.id], 0)
    );
    let end = [(
        40,
        attempt(row(&c1, State::Succeeded, 1, end), 200, 5, None),
    )];
    // c1 ends: its writer knows its place (it has no entry to read), so its sequence's
    // next job goes in the same commit; the scheduler held a place for it, so its attempt
    // begins there too: listed by the commit's log row (a new owner finds it under way),
    // not handed over as released.
    alone.begin.insert(seq_c);
    assert_eq!(alone.write(&db, token, &[], &end).await, (vec![], 0));
    assert_eq!(alone.begun, vec![(c2.id, 0)]);
    assert!(alone.sequences.is_empty());
    let settle = db.load_stranded().await.unwrap().settle;
    let c2_under_way = settle.iter().find(|(id, _)| *id == c2.id);
    assert!(
        c2_under_way.is_some_and(|(_, p)| p.attempts == 1 && p.started.is_some()),
        "{settle:?}"
    );
    // c2's attempt ends (a retry: it stays its sequence's head) and the place held for the
    // sequence is not used: nothing else of it is released or begun.
    let t1 = t0 + TimeDelta::seconds(2);
    let retry = [(
        41,
        attempt(
            Transition::awaiting_retry(c2.id, 1, t1, t1, Default::default()),
            503,
            5,
            None,
        ),
    )];
    assert_eq!(alone.write(&db, token, &[], &retry).await, (vec![], 0));
    assert!(alone.begun.is_empty());
    // Due later, a released head is released but not begun: its attempt waits for its time.
    let (f1, f2) = (ordered(12, "f", false), ordered(13, "f", false));
    let f_rows = [
        (42, row(&f1, State::AwaitingScheduling, 0, t0)),
        (
            43,
            Transition::scheduled(f2.id, t0, t0 + TimeDelta::hours(1)),
        ),
    ];
    assert_eq!(
        alone
            .write(&db, token, &[f1.clone(), f2.clone()], &f_rows)
            .await,
        (vec![f1.id], 1)
    );
    alone.begin.insert(f1.seq().unwrap());
    let f_end = [(44, attempt(row(&f1, State::Succeeded, 1, t1), 200, 5, None))];
    assert_eq!(alone.write(&db, token, &[], &f_end).await, (vec![f2.id], 0));
    assert!(alone.begun.is_empty());
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
            db.append_all(
                token,
                &Append {
                    jobs: &jobs,
                    transitions: &rows,
                    release: &release,
                    release_expired: &expired,
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
    assert_eq!(written.touched, vec![seq]);
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
                    release: &release,
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

/// A writer alone takes the next head of a sequence it saw empty from its memory of the
/// entries it made (no read), and when the store does not hold that head waiting (memory
/// wrong, here an entry deleted behind its back), it forgets the sequence and reads it in the
/// same commit: the store's head goes, nothing stalls.
async fn a_writer_alone_reads_a_head_its_memory_cannot_vouch_for(engine: Engine) {
    let test = TestDb::on(engine, "seqknown");
    let db = JobDb::open(&test.url, true, 2).await.unwrap();
    let token = db.take_ownership("test").await.unwrap();
    let t0 = base_time();
    let ordered = |n: u8, key: &str, blocks: bool| {
        let base = job(n, "b", "https://x.example/a", t0);
        Arc::new(keyed(&base, key, blocks, base.id.0))
    };
    let mut alone = Alone::default();
    let keyed_jobs = |jobs: &[Arc<Job>], from: u64| -> Vec<(u64, Transition)> {
        jobs.iter()
            .enumerate()
            .map(|(i, j)| (from + i as u64, row(j, State::AwaitingScheduling, 0, t0)))
            .collect()
    };
    let g: Vec<Arc<Job>> = (1..=4).map(|n| ordered(n, "g", false)).collect();
    // g1 is born released; the read that found its sequence empty teaches the writer it.
    assert_eq!(
        alone.write(&db, token, &g, &keyed_jobs(&g, 10)).await,
        (vec![g[0].id], 1)
    );
    let end = |j: &Job, id: u64| [(id, attempt(row(j, State::Succeeded, 1, t0), 200, 5, None))];
    assert_eq!(
        alone.write(&db, token, &[], &end(&g[0], 20)).await,
        (vec![g[1].id], 0)
    );
    assert_eq!(alone.heads_known, (1, 0), "g2 came from memory");
    // Behind the writer's back, g3's entry goes: memory still names it next.
    crate::scenario::operator_rows(
        &db,
        &format!("DELETE FROM open_jobs WHERE job_id = X'{}'", hex(&g[2].id)),
        0,
    )
    .await;
    assert_eq!(
        alone.write(&db, token, &[], &end(&g[1], 21)).await,
        (vec![g[3].id], 0),
        "the store's head goes in the same commit"
    );
    assert_eq!(
        alone.heads_known,
        (1, 1),
        "memory named g3, which was not held"
    );
    // Forgotten, the sequence is read from the store from then on.
    let g5 = ordered(5, "g", false);
    assert_eq!(
        alone
            .write(
                &db,
                token,
                std::slice::from_ref(&g5),
                &keyed_jobs(std::slice::from_ref(&g5), 30)
            )
            .await,
        (vec![], 0)
    );
    assert_eq!(
        alone.write(&db, token, &[], &end(&g[3], 31)).await,
        (vec![g5.id], 0)
    );
    assert_eq!(alone.heads_known, (0, 0), "read, not remembered");
    // A key known to the writer that a failure blocks is forgotten: its next job waits for
    // the operator, as the store says.
    let h1 = ordered(6, "h", true);
    let h2 = ordered(7, "h", false);
    let h = [h1.clone(), h2.clone()];
    assert_eq!(
        alone.write(&db, token, &h, &keyed_jobs(&h, 40)).await,
        (vec![h1.id], 1)
    );
    let failed = [(
        50,
        attempt(
            row(&h1, State::Discarded, 1, t0),
            400,
            5,
            Some("client-error"),
        ),
    )];
    assert_eq!(alone.write(&db, token, &[], &failed).await, (vec![], 0));
    assert_eq!(alone.heads_known, (0, 0));
    // The same with an entry: i1 rests (a retry), so its end is read from its entry (memory
    // knows its sequence, but not whether it blocks), and blocks.
    let i1 = ordered(8, "i", true);
    let i2 = ordered(9, "i", false);
    let i = [i1.clone(), i2.clone()];
    assert_eq!(
        alone.write(&db, token, &i, &keyed_jobs(&i, 60)).await,
        (vec![i1.id], 1)
    );
    let t1 = t0 + TimeDelta::seconds(1);
    let retry = [(
        70,
        attempt(
            Transition::awaiting_retry(i1.id, 1, t1, t1, Default::default()),
            503,
            5,
            None,
        ),
    )];
    assert_eq!(alone.write(&db, token, &[], &retry).await, (vec![], 0));
    let failed = [(
        71,
        attempt(
            row(&i1, State::Discarded, 2, t1),
            400,
            5,
            Some("client-error"),
        ),
    )];
    assert_eq!(alone.write(&db, token, &[], &failed).await, (vec![], 0));
    assert_eq!(
        db.blocked_keys().await.unwrap().len(),
        2,
        "h and i are blocked"
    );
    db.close().await;
}

/// A job id as the hex of its stored bytes.
fn hex(id: &JobId) -> String {
    id.to_bytes().iter().map(|b| format!("{b:02X}")).collect()
}
