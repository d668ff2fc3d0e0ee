//! The group-commit writer: the only task that writes to the JobDB.
//!
//! Submissions and transitions queue on one channel. The writer takes everything queued (up to
//! a row and a byte budget), appends it in one fenced transaction with multi-row INSERTs, and
//! only after COMMIT acknowledges the producers and hands the new jobs to the scheduler. One
//! writer keeps transition ids and commit order identical, so a crash can never leave a gap in
//! a history.
//!
//! A commit that accepts jobs or begins attempts writes its `commit_log` row, listing them:
//! that is their record until they have rows of their own (schema 5). The writer keeps the
//! account of what its commits left open ([`open`]): it rests jobs that wait long without a row
//! (their `open_jobs` entries), knows which ending jobs never had an entry, and moves the
//! JobDB's checkpoint past commits that hold nothing open.
//!
//! Every transaction is bounded ([`JobDb::append_bounded`], [`WriterLimits::write_timeout`]):
//! its lock waits by the server, its work before the COMMIT and the COMMIT's answer by the
//! writer, so a JobDB that stops answering costs a bounded wait, never a hung writer.
//!
//! A failed append is classified before anything is retried:
//! - not committed, may pass (connection, pool, a lock wait or the work running out of time):
//!   producers get a 503 at once, transitions of known jobs wait and go again;
//! - outcome unknown (the COMMIT's answer was lost, or did not come in time): once the server
//!   is certainly done with that connection, the JobDB is asked whether the batch's log row
//!   (or last row) exists;
//! - refused (the server will never take these rows): the batch is split in halves until the
//!   one request that carries the refused rows is found; it alone is refused (counted, logged),
//!   everything batched with it is written. One oversized job never costs its neighbours.
//!
//! A producer's request is claimed once ([`Ticket`]): by the writer when it takes it into a
//! batch, or by its handler when the handler's wait ends first, and then it is never written.
//! A handler that stops waiting after the writer took its request answers 504 (outcome
//! unknown), and no later try of a failed batch writes that request. A router's forward is
//! never committed after its `not_after`, checked just before every COMMIT that carries it.
//!
//! Until a commit succeeds the writer reports that it has work ([`Progress`]): the watchdog
//! turns the Director non-ready when that lasts past [`WriterLimits::unwritable_after`], and
//! while the last try failed the writer probes the JobDB (the checkpoint alone) every second,
//! so it finds out that the JobDB can be written again with no request to carry it.
//!
//! # Files
//! - `mod.rs`: [`WriterLimits`], the [`Writer`] task, and taking queued requests into a batch
//!   (numbering their rows, refusing at once what can never be written);
//! - `ops.rs`: what its senders use: [`WriteOp`], [`WriteRejected`] (and what a producer hears
//!   of it), [`Accepted`], [`Ticket`];
//! - `batch.rs`: a batch of requests, split, narrowed and answered request by request;
//! - `commit.rs`: committing a batch and what its outcome means: acknowledge, retry, isolate
//!   a refused request, find out an unknown outcome;
//! - `open.rs`: its account of what its commits left open.

mod batch;
mod commit;
mod open;
mod ops;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::job::{Job, JobId, Seq, Transition};
use crate::jobdb::lifecycle::Origin;
use crate::jobdb::{
    job_row_bytes, transition_row_bytes, Bounds, Fresh, JobDb, KnownSequences, OpenRow,
};
use crate::metrics::Metrics;
use batch::{Batch, Reply};
use open::OpenWork;
pub use ops::{Accepted, Ticket, WriteOp, WriteRejected};

use super::scheduler::Event;
use super::sequencer::{MarkChange, Peer, Peers};
use super::supervise::Progress;
use crate::registry::inventory::FreshMark;

/// Limits of one group commit.
#[derive(Clone, Copy, Debug)]
pub struct WriterLimits {
    /// Stop adding queued requests to a transaction past this many rows.
    pub max_rows: usize,
    /// Stop adding queued requests past this many bytes of rows (every column counted).
    pub max_bytes: usize,
    /// A job accepted this long ago without a row of its own (never tried, or tried and not
    /// ended) rests: it gets its `open_jobs` entry, and the checkpoint moves on. Longer means
    /// fewer entries written under a backlog and more of `commit_log` read by a new owner.
    pub rest_after: Duration,
    /// The most a producer's request waits for its outcome (`--write-timeout-ms`); each
    /// transaction's bounds derive from it (see [`WriterLimits::lock_wait`]).
    pub write_timeout: Duration,
    /// A writer alone keeps a new ordered job that must wait for its turn in memory, fresh,
    /// instead of entering it held (see [`crate::jobdb::KnownSequences`]; `--no-keep-ordered`
    /// turns it off).
    pub keep_ordered: bool,
}

impl WriterLimits {
    /// How long the writer may try to commit without success before the JobDB counts as not
    /// writable (the Director not ready): two fifths of the write timeout, so a request that
    /// reaches a JobDB gone silent still hears the definite 503 within its wait.
    pub fn unwritable_after(&self) -> Duration {
        self.write_timeout * 2 / 5
    }

    /// The most any statement of the Director's connections waits for a lock, enforced by the
    /// server (whole seconds, at least one): [`WriterLimits::unwritable_after`], rounded down.
    pub fn lock_wait(&self) -> Duration {
        Duration::from_secs(self.unwritable_after().as_secs().max(1))
    }

    /// The bounds of one transaction: its work before the COMMIT, and the COMMIT's answer,
    /// each the write timeout (a transaction that takes longer has no producer left to tell)
    /// and at least a second longer than the server's own lock wait, which ends a statement
    /// waiting for a lock first, with an error, keeping the connection. What these bounds
    /// catch is a server or network that stopped answering.
    fn bounds(&self, not_after: Option<DateTime<Utc>>) -> Bounds {
        let bound = self
            .write_timeout
            .max(self.lock_wait() + Duration::from_secs(1));
        Bounds {
            work: Some(bound),
            commit: Some(bound),
            not_after,
        }
    }
}

/// How often a writer whose last try failed writes the checkpoint alone, to find out whether
/// the JobDB can be written again.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long a listing of the live JobDBs before a commit may take (past it: not alone).
const LIST_TIMEOUT: Duration = Duration::from_millis(250);
/// How long after a listing that found another live JobDB the next is made.
const RELIST_AFTER: Duration = Duration::from_secs(1);
/// How long after the last ordered job arrived commits still list the live JobDBs.
const ORDERED_QUIET_AFTER: Duration = Duration::from_secs(60);
/// Most cleared jobs remembered (beyond it the memory starts over).
const MAX_CLEARED: usize = 1_000_000;

/// Lifts this JobDB's fresh `mark` when no fresh ordered job is left (the commits since it
/// was not alone gave them entries); whether nothing is left for this writer to lift (lifted
/// now, or set by a later owner, whose it is).
async fn lift_mark(peers: &Peers, open: &OpenWork, token: u64, mark: FreshMark) -> bool {
    if mark.token > token {
        return true;
    }
    if !open.sequences().is_empty() || !open.kept_sequences().is_empty() {
        return false;
    }
    matches!(
        tokio::time::timeout(LIST_TIMEOUT, peers.change_mark(MarkChange::Clear(mark))).await,
        Ok(Ok(true))
    )
}

/// What a listing of the live JobDBs says of `own`: whether it is the only one, and its
/// fresh mark.
fn standing(live: &[Peer], own: &str) -> (bool, Option<FreshMark>) {
    let alone = live.iter().all(|p| p.name == own);
    let mark = live
        .iter()
        .find(|p| p.name == own)
        .and_then(|p| p.fresh_mark);
    (alone, mark)
}

/// Sleeps for `wait`, or forever when there is none.
async fn sleep_for(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// What a cluster writer's listing before a commit decided.
#[derive(Clone, Copy, Debug)]
struct Alone {
    /// No other JobDB is live: the commit releases in itself.
    alone: bool,
    /// And its JobDB's fresh mark is set: the commit bears new ordered jobs fresh (no entry).
    bear_fresh: bool,
}

/// The writer task's state.
pub struct Writer {
    db: JobDb,
    token: u64,
    next_id: u64,
    limits: WriterLimits,
    rx: mpsc::Receiver<WriteOp>,
    scheduler: mpsc::UnboundedSender<Event>,
    /// Told the sequences whose turn may have moved.
    sequencer: mpsc::UnboundedSender<Vec<Seq>>,
    /// Whether this JobDB is the only live one: a commit releases the next job of the
    /// sequences it touches itself (see [`Append::release_touched`]).
    release_in_commit: bool,
    /// In a cluster, the other live JobDBs, listed before a commit with ordered work to find
    /// out whether this JobDB is alone *now* (see [`Writer::alone_now`]).
    peers: Option<Peers>,
    /// After a listing that found another live JobDB (or failed), the next is not before this.
    relist_at: Option<Instant>,
    /// After a try to set the fresh mark failed, the next is not before this.
    mark_retry_at: Option<Instant>,
    /// The last listing found another live JobDB and this JobDB's fresh mark still set.
    lift_pending: bool,
    /// When the last ordered job arrived: only commits near it list the peers.
    ordered_seen: Option<Instant>,
    /// Whether the last commit released in itself (its memory of sequences is current),
    /// shared with the intake (see [`Writer::in_cluster`]).
    alone_shared: Arc<AtomicBool>,
    /// Ordered jobs the intake cleared, not yet released (see [`WriteOp::Submit`]).
    cleared: HashSet<JobId>,
    /// What it knows of its sequences' entries, when it releases in its commits.
    known: std::sync::Mutex<KnownSequences>,
    metrics: Arc<Metrics>,
    lock_lost: CancellationToken,
    /// What its commits left open.
    open: OpenWork,
    /// Memory of kept jobs was dropped (a sequence forgotten, a failed write): every kept
    /// job rests in the next commit.
    rest_kept: bool,
    /// The checkpoint last written, and when (`None`: not yet by this writer).
    checkpoint: Option<(u64, Instant)>,
    /// Busy from a try to commit until one succeeds: what the watchdog and the intake read
    /// as "the JobDB cannot be written" once it lasts.
    progress: Progress,
}

impl Writer {
    /// A writer for `db` under fencing `token`, numbering rows from `next_id`, taking requests
    /// from `rx`, telling `scheduler` about durable jobs and `sequencer` about sequences
    /// whose turn may have moved.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        db: JobDb,
        token: u64,
        next_id: u64,
        limits: WriterLimits,
        rx: mpsc::Receiver<WriteOp>,
        scheduler: mpsc::UnboundedSender<Event>,
        sequencer: mpsc::UnboundedSender<Vec<Seq>>,
        metrics: Arc<Metrics>,
        lock_lost: CancellationToken,
    ) -> Self {
        Writer {
            db,
            token,
            next_id,
            limits,
            rx,
            scheduler,
            sequencer,
            release_in_commit: false,
            peers: None,
            relist_at: None,
            mark_retry_at: None,
            lift_pending: false,
            ordered_seen: None,
            alone_shared: Arc::new(AtomicBool::new(false)),
            cleared: HashSet::new(),
            known: Default::default(),
            metrics,
            lock_lost,
            open: OpenWork::default(),
            rest_kept: false,
            checkpoint: None,
            progress: Progress::default(),
        }
    }

    /// Reports its progress to `progress` (the watchdog's handle).
    pub fn watched(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Runs until every sender is gone (a clean stop) or ownership is lost.
    pub async fn run(mut self) {
        loop {
            // While the last try failed, nothing may come to try again: probe.
            let next = match self.progress.is_busy() {
                true => tokio::select! {
                    next = self.rx.recv() => next,
                    _ = tokio::time::sleep(PROBE_EVERY) => {
                        self.probe().await;
                        continue;
                    }
                },
                false => {
                    // A kept job rests at its expiry, or at once when memory of it was
                    // dropped, even while nothing comes to commit.
                    let kept_due = self.open.next_kept_expiry().map(|at| match self.rest_kept {
                        true => Duration::ZERO,
                        false => (at - Utc::now()).to_std().unwrap_or_default(),
                    });
                    tokio::select! {
                        next = self.rx.recv() => next,
                        _ = sleep_for(self.lift_pending.then_some(RELIST_AFTER)) => {
                            self.lift_idle().await;
                            continue;
                        }
                        _ = sleep_for(kept_due) => {
                            self.rest_due_kept().await;
                            continue;
                        }
                    }
                }
            };
            let Some(first) = next else { break };
            let mut batch = Batch::default();
            self.add(&mut batch, first);
            while batch.rows.len() + batch.jobs.len() + batch.starts.len() < self.limits.max_rows
                && batch.bytes < self.limits.max_bytes
            {
                match self.rx.try_recv() {
                    Ok(op) => self.add(&mut batch, op),
                    Err(_) => break,
                }
            }
            self.commit(batch).await;
        }
    }

    /// Numbers a request's rows and adds it to the batch, or answers it at once: a router's
    /// forward whose `not_after` has passed, or jobs with a row larger than the JobDB takes.
    fn add(&mut self, batch: &mut Batch, op: WriteOp) {
        let max_row = self.db.max_row_bytes();
        match op {
            WriteOp::Submit {
                jobs,
                scheduled,
                not_after,
                forwarded,
                cleared,
                reply,
                ticket,
            } => {
                if !ticket.take() {
                    // Its handler stopped waiting first and answered 503: never written.
                    return;
                }
                if not_after.is_some_and(|deadline| Utc::now() > deadline) {
                    self.metrics.write_rejected("submit", "expired");
                    tracing::warn!(
                        jobs = jobs.len(),
                        "forwarded jobs refused: their not_after passed before the write"
                    );
                    let _ = reply.send(Err(WriteRejected::Expired));
                    return;
                }
                if let Some(job) = jobs.iter().find(|j| job_row_bytes(j) > max_row) {
                    self.refused_too_large("submit", job, max_row);
                    let _ = reply.send(Err(WriteRejected::Refused { too_large: true }));
                    return;
                }
                if self.cleared.len() + cleared.len() > MAX_CLEARED {
                    // Forgotten clearances cost only the sequencer's round trip.
                    self.cleared.clear();
                }
                self.cleared.extend(cleared);
                let now = Utc::now();
                // `scheduled` lists jobs in the order of `jobs`.
                let mut later = scheduled.iter().peekable();
                for job in &jobs {
                    batch.bytes += job_row_bytes(job);
                    // A scheduled job rests from the start: its row puts it in `open_jobs`. So
                    // does an ordered job, held there until its turn.
                    match later.next_if(|(id, _)| *id == job.id) {
                        Some((id, at)) => {
                            let row = self.take_id();
                            batch.rows.push((row, Transition::scheduled(*id, now, *at)));
                        }
                        None if job.ordering.is_some() => {
                            let id = self.take_id();
                            batch
                                .rests
                                .push(OpenRow::resting(job.id, id, Some(Fresh::of(job))));
                        }
                        None => batch.accepted.push((job.id, Fresh::of(job))),
                    }
                }
                batch.jobs.extend(jobs);
                let reply = Reply::Submit(reply, forwarded, 0, scheduled);
                batch.seal_producers(reply, Some(ticket), not_after);
            }
            WriteOp::Import {
                jobs,
                from_jobdb,
                blocks,
                reply,
                ticket,
            } => {
                if !ticket.take() {
                    // Its handler stopped waiting first and answered 503: never written.
                    return;
                }
                if let Some(r) = jobs.iter().find(|r| job_row_bytes(&r.job) > max_row) {
                    self.refused_too_large("import", &r.job, max_row);
                    let _ = reply.send(Err(WriteRejected::Refused { too_large: true }));
                    return;
                }
                let now = Utc::now();
                for r in &jobs {
                    let retry_at = r.retry_at.unwrap_or(now);
                    let id = self.take_id();
                    batch.bytes += job_row_bytes(&r.job);
                    batch.rows.push((
                        id,
                        Transition::imported(r.job.id, r.attempts, now, retry_at),
                    ));
                    batch.origins.push(Origin {
                        job_id: r.job.id,
                        from_jobdb: from_jobdb.clone(),
                        imported_at: now,
                    });
                    batch.jobs.push(r.job.clone());
                }
                batch.seal_producers(Reply::Import(reply, jobs, blocks), Some(ticket), None);
            }
            WriteOp::Transitions { rows, done } => {
                self.push_rows(batch, rows);
                batch.seal(Reply::Transitions(done));
            }
            WriteOp::Start { rows, starts, done } => {
                self.push_rows(batch, rows);
                batch.bytes += starts.len() * 40;
                batch.starts.extend(starts);
                batch.seal(Reply::Start(done));
            }
            WriteOp::Rest {
                jobs,
                recovered,
                done,
            } => {
                for (job, place) in jobs {
                    // Numbered now, before any later barrier: a backlog page read after that
                    // barrier sees the entry.
                    let rest = match (self.open.fresh(&job), recovered) {
                        (Some(fresh), _) => OpenRow::rest_of_fresh(job, self.take_id(), fresh),
                        // A previous owner's fresh ordered job may have been under way or
                        // kept: held, its sequence's head goes by the sequencer's first sweep.
                        (None, true) => OpenRow {
                            place,
                            ..OpenRow::resting(job, self.take_id(), None)
                        },
                        (None, false) => continue,
                    };
                    batch.rests.push(rest);
                }
                batch.seal(Reply::Rest(done));
            }
            WriteOp::Begin { seqs } => {
                batch.bytes += seqs.len() * 16;
                batch.seal(Reply::Begin(seqs));
            }
            WriteOp::Release { heads, expired } => {
                batch.bytes += (heads.len() + expired.len()) * 32;
                batch.release.extend(heads);
                batch.seal(Reply::Release(expired));
            }
            WriteOp::Barrier(reply) => batch.seal(Reply::Barrier(reply, self.next_id)),
            WriteOp::RestKept(reply) => {
                // An operator command's read sees entries only: every kept job gets its own
                // first (held, before the barrier's id).
                let kept = self.open.kept_jobs();
                self.rest_fresh(&mut batch.rests, kept);
                batch.seal(Reply::Barrier(reply, self.next_id));
            }
        }
    }

    fn push_rows(&mut self, batch: &mut Batch, rows: Vec<Transition>) {
        for row in rows {
            let id = self.take_id();
            batch.bytes += transition_row_bytes(&row);
            batch.rows.push((id, row));
        }
    }

    /// This JobDB is the only live one: each commit releases the next job of the sequences
    /// it touches (no sequencer round trip, one commit less per ordered job).
    pub fn alone(mut self) -> Self {
        self.release_in_commit = true;
        self
    }

    /// In a cluster: a commit releases in itself while `peers` lists no other live JobDB
    /// (and says so in `alone`, which the intake's clearance reads).
    pub fn in_cluster(mut self, peers: Peers, alone: Arc<AtomicBool>) -> Self {
        self.peers = Some(peers);
        self.alone_shared = alone;
        self
    }

    /// Whether the commit of `batch` may release the next job of the sequences it touches
    /// itself (and bear new ordered jobs released). Always, for a JobDB without peers. In a
    /// cluster, when a listing of the live JobDBs begun now, after every job of the batch and
    /// every head it could release got its position, names no other: a job that must go
    /// before one of them was accepted before it was, so it is stored in a JobDB live now
    /// (or moved from it into one), and there is none but this. A JobDB that turns live
    /// later only holds jobs accepted after these. A listing that finds another (or fails)
    /// leaves releases to the sequencer, and is not repeated for [`RELIST_AFTER`]; nor is
    /// one made while no ordered job arrived for [`ORDERED_QUIET_AFTER`]. Entering the state
    /// forgets what the writer knew of its sequences (commits without it do not keep that).
    /// Alone, the commit bears new ordered jobs fresh once this JobDB's fresh mark is set
    /// (set here first if the listing showed it unset); not alone, it bears none, and a
    /// listing that shows the mark while no fresh ordered job is left lifts it.
    async fn alone_now(&mut self, batch: &Batch) -> Alone {
        let Some(peers) = &self.peers else {
            self.metrics
                .ordered_alone
                .set(i64::from(self.release_in_commit));
            return Alone {
                alone: self.release_in_commit,
                bear_fresh: self.release_in_commit,
            };
        };
        let now = Instant::now();
        if batch.rests.iter().any(|r| r.place.is_some()) {
            self.ordered_seen = Some(now);
        }
        let quiet = self
            .ordered_seen
            .is_none_or(|at| now.duration_since(at) > ORDERED_QUIET_AFTER);
        let due = self.relist_at.is_none_or(|at| now >= at);
        let listed = match !quiet && due {
            true => match tokio::time::timeout(LIST_TIMEOUT, peers.list()).await {
                Ok(Ok(live)) => Some(live),
                _ => None,
            },
            false => None,
        };
        let (alone, mark) = listed
            .as_deref()
            .map_or((false, None), |live| standing(live, self.db.name()));
        if !alone && !quiet && due {
            self.relist_at = Some(now + RELIST_AFTER);
        }
        let bear_fresh = match (alone, mark) {
            (true, Some(mark)) if mark.token == self.token => true,
            // Set before the commit that bears the first: another JobDB's read that could
            // miss such a job then finds the mark. One an earlier owner set is set again, so
            // that owner (if it still runs) can never lift it.
            (true, _) if self.mark_retry_at.is_none_or(|at| now >= at) => {
                let set = tokio::time::timeout(
                    LIST_TIMEOUT,
                    peers.change_mark(MarkChange::Set(self.token)),
                )
                .await;
                let set = matches!(set, Ok(Ok(true)));
                // A registry that refuses or stalls is not asked again at every commit.
                self.mark_retry_at = (!set).then(|| now + RELIST_AFTER);
                set
            }
            (true, _) => false,
            (false, Some(mark)) => {
                // Lifted now if it can be; if not, tried again while the writer idles.
                self.lift_pending = !lift_mark(peers, &self.open, self.token, mark).await;
                false
            }
            (false, None) => {
                // A listing that shows no mark ends the wait; none made changes nothing.
                if listed.is_some() {
                    self.lift_pending = false;
                }
                false
            }
        };
        if alone {
            self.lift_pending = false;
        }
        let was_alone = self.alone_shared.swap(alone, Ordering::Relaxed);
        if alone && !was_alone {
            self.known
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clear();
        }
        self.metrics.ordered_alone.set(i64::from(alone));
        self.metrics.ordered_fresh_marked.set(i64::from(bear_fresh));
        Alone { alone, bear_fresh }
    }

    /// While the writer idles with its JobDB's fresh mark still set and another JobDB live:
    /// lists again and lifts the mark once no fresh ordered job is left (commits list only
    /// while ordered work comes, and an idle writer would leave it set).
    async fn lift_idle(&mut self) {
        let Some(peers) = &self.peers else {
            self.lift_pending = false;
            return;
        };
        let Ok(Ok(live)) = tokio::time::timeout(LIST_TIMEOUT, peers.list()).await else {
            return;
        };
        self.lift_pending = match standing(&live, self.db.name()) {
            // Alone again (its commits decide what to bear), or no mark.
            (true, _) | (false, None) => false,
            (false, Some(mark)) => !lift_mark(peers, &self.open, self.token, mark).await,
        };
    }

    /// Rests the kept jobs whose expiry passed (held: the sequencer's expiry pass ends them),
    /// or every kept job when memory of some was dropped (the sequencer's sweep then
    /// releases their heads).
    async fn rest_due_kept(&mut self) {
        let mut batch = Batch::default();
        let due = self.kept_due(Utc::now());
        self.rest_fresh(&mut batch.rests, due);
        batch.seal(Reply::Rest(None));
        self.commit(batch).await;
    }

    /// The kept jobs that rest now: those expired by `now`, or every one when memory of some
    /// was dropped.
    fn kept_due(&self, now: DateTime<Utc>) -> Vec<(JobId, Fresh)> {
        match self.rest_kept {
            true => self.open.kept_jobs(),
            false => self.open.kept_expired(now),
        }
    }

    /// Adds to `rests` the entry of each fresh job of `jobs` that has none there yet (see
    /// [`OpenRow::rest_of_fresh`]), numbered now.
    fn rest_fresh(&mut self, rests: &mut Vec<OpenRow>, jobs: Vec<(JobId, Fresh)>) {
        let mut listed: HashSet<JobId> = rests.iter().map(|r| r.job_id).collect();
        for (job, fresh) in jobs {
            if listed.insert(job) {
                let id = self.take_id();
                rests.push(OpenRow::rest_of_fresh(job, id, fresh));
            }
        }
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn refused_too_large(&self, op: &'static str, job: &Job, max_row: usize) {
        self.metrics.write_rejected(op, "refused");
        tracing::error!(
            job = %job.id,
            bytes = job_row_bytes(job),
            max_row,
            "jobs refused: a row is larger than the jobdb's server accepts (max_allowed_packet)"
        );
    }
}
