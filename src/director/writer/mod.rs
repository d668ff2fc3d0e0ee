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
//! A failed append is classified before anything is retried (see [`JobDb::append_all`]):
//! - not committed, may pass (connection, pool): producers get a 503 at once, transitions of
//!   known jobs wait and go again;
//! - outcome unknown (the COMMIT's answer was lost): the JobDB is asked whether the batch's
//!   log row (or last row) exists;
//! - refused (the server will never take these rows): the batch is split in halves until the
//!   one request that carries the refused rows is found; it alone is refused (counted, logged),
//!   everything batched with it is written. One oversized job never costs its neighbours.

mod open;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::job::{AttemptStart, Job, JobId, Seq, Transition};
use crate::jobdb::write::Written;
use crate::jobdb::{
    job_row_bytes, transition_row_bytes, Append, CommitLog, Fresh, JobDb, JobDbError, OpenRow,
};
use crate::metrics::Metrics;
use open::OpenWork;

use super::scheduler::Event;
use crate::job::Recovered;
use crate::jobdb::lifecycle::Origin;
pub use crate::jobdb::write::{Accepted, WriteOp, WriteRejected};

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
}

/// How often the checkpoint is written (at most): a new owner reads at most this much more of
/// `commit_log` than it must.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

type Ack = oneshot::Sender<Result<(), WriteRejected>>;

/// Requests taken together into one transaction: their rows side by side in id order, and
/// for each request, where its rows end and who hears about it.
#[derive(Default)]
struct Batch {
    jobs: Vec<Arc<Job>>,
    rows: Vec<(u64, Transition)>,
    origins: Vec<Origin>,
    /// Submitted jobs (imports rest at once), with what their first entry takes from them.
    accepted: Vec<(JobId, Fresh)>,
    /// Attempts begun.
    starts: Vec<(JobId, u16)>,
    /// Jobs that rest on request.
    rests: Vec<OpenRow>,
    /// Ordered jobs to release.
    release: Vec<(Seq, JobId)>,
    requests: Vec<Request>,
    bytes: usize,
}

/// Where a request's items end in each of the batch's lists (exclusive), from the previous
/// request's ends.
#[derive(Clone, Copy, Default)]
struct Ends {
    jobs: usize,
    rows: usize,
    origins: usize,
    accepted: usize,
    starts: usize,
    rests: usize,
    release: usize,
}

impl std::ops::Sub for Ends {
    type Output = Ends;

    fn sub(self, o: Ends) -> Ends {
        Ends {
            jobs: self.jobs - o.jobs,
            rows: self.rows - o.rows,
            origins: self.origins - o.origins,
            accepted: self.accepted - o.accepted,
            starts: self.starts - o.starts,
            rests: self.rests - o.rests,
            release: self.release - o.release,
        }
    }
}

/// One request of a batch: its items are the batch's up to `ends`.
struct Request {
    ends: Ends,
    reply: Reply,
}

/// Who hears about a request's outcome.
enum Reply {
    /// A submission: its reply, whether its ids were minted elsewhere (forwarded), how many
    /// of its jobs an earlier try had stored already, and which of its jobs wait for a later
    /// first attempt.
    Submit(
        oneshot::Sender<Result<Accepted, WriteRejected>>,
        bool,
        usize,
        crate::job::Scheduled,
    ),
    Import(Ack, Vec<Recovered>),
    Transitions(Option<Ack>),
    Start(oneshot::Sender<Result<AttemptStart, WriteRejected>>),
    Rest(Option<Ack>),
    Release,
    Barrier(oneshot::Sender<u64>, u64),
}

impl Reply {
    fn kind(&self) -> &'static str {
        match self {
            Reply::Submit(..) => "submit",
            Reply::Import(..) => "import",
            Reply::Transitions(_) => "transitions",
            Reply::Start(_) => "start",
            Reply::Rest(_) => "rest",
            Reply::Release => "release",
            Reply::Barrier(..) => "barrier",
        }
    }

    /// A producer's request (a submission or an import): refused at once when the JobDB is
    /// unavailable, since the producer may send it again.
    fn is_producers(&self) -> bool {
        matches!(self, Reply::Submit(..) | Reply::Import(..))
    }

    fn reject(self, why: WriteRejected) {
        match self {
            Reply::Submit(reply, ..) => {
                let _ = reply.send(Err(why));
            }
            Reply::Import(reply, _)
            | Reply::Transitions(Some(reply))
            | Reply::Rest(Some(reply)) => {
                let _ = reply.send(Err(why));
            }
            Reply::Start(reply) => {
                let _ = reply.send(Err(why));
            }
            Reply::Transitions(None) | Reply::Rest(None) | Reply::Release => {}
            // A barrier has nothing to refuse; its waiter learns from its channel closing.
            Reply::Barrier(..) => {}
        }
    }
}

impl Batch {
    fn ends(&self) -> Ends {
        Ends {
            jobs: self.jobs.len(),
            rows: self.rows.len(),
            origins: self.origins.len(),
            accepted: self.accepted.len(),
            starts: self.starts.len(),
            rests: self.rests.len(),
            release: self.release.len(),
        }
    }

    /// Closes the request whose items were just pushed.
    fn seal(&mut self, reply: Reply) {
        let ends = self.ends();
        self.requests.push(Request { ends, reply });
    }

    /// Where request `at` begins.
    fn start_of(&self, at: usize) -> Ends {
        at.checked_sub(1)
            .map_or_else(Ends::default, |prev| self.requests[prev].ends)
    }

    /// The requests from index `at` on, as a batch of their own (their items move with them).
    fn split_off(&mut self, at: usize) -> Batch {
        let start = self.start_of(at);
        let mut requests = self.requests.split_off(at);
        for r in &mut requests {
            r.ends = r.ends - start;
        }
        Batch {
            jobs: self.jobs.split_off(start.jobs),
            rows: self.rows.split_off(start.rows),
            origins: self.origins.split_off(start.origins),
            accepted: self.accepted.split_off(start.accepted),
            starts: self.starts.split_off(start.starts),
            rests: self.rests.split_off(start.rests),
            release: self.release.split_off(start.release),
            requests,
            bytes: 0,
        }
    }

    /// Keeps only the requests `keep` says yes to (with their items); the others are
    /// returned, with how many jobs each carried.
    fn retain(&mut self, keep: impl Fn(&Reply) -> bool) -> Vec<(Reply, usize)> {
        let old = std::mem::take(self);
        let (mut jobs, mut rows, mut origins) = (
            old.jobs.into_iter(),
            old.rows.into_iter(),
            old.origins.into_iter(),
        );
        let (mut accepted, mut starts, mut rests) = (
            old.accepted.into_iter(),
            old.starts.into_iter(),
            old.rests.into_iter(),
        );
        let mut release = old.release.into_iter();
        let mut at = Ends::default();
        let mut dropped = Vec::new();
        for request in old.requests {
            let n = request.ends - at;
            at = request.ends;
            if keep(&request.reply) {
                self.jobs.extend(jobs.by_ref().take(n.jobs));
                self.rows.extend(rows.by_ref().take(n.rows));
                self.origins.extend(origins.by_ref().take(n.origins));
                self.accepted.extend(accepted.by_ref().take(n.accepted));
                self.starts.extend(starts.by_ref().take(n.starts));
                self.rests.extend(rests.by_ref().take(n.rests));
                self.release.extend(release.by_ref().take(n.release));
                self.seal(request.reply);
            } else {
                jobs.by_ref().take(n.jobs).for_each(drop);
                rows.by_ref().take(n.rows).for_each(drop);
                origins.by_ref().take(n.origins).for_each(drop);
                accepted.by_ref().take(n.accepted).for_each(drop);
                starts.by_ref().take(n.starts).for_each(drop);
                rests.by_ref().take(n.rests).for_each(drop);
                release.by_ref().take(n.release).for_each(drop);
                dropped.push((request.reply, n.jobs));
            }
        }
        dropped
    }

    /// Indexes of the requests that write something.
    fn writing(&self) -> Vec<usize> {
        let mut start = Ends::default();
        let mut out = Vec::new();
        for (i, r) in self.requests.iter().enumerate() {
            let n = r.ends - start;
            if n.jobs + n.rows + n.starts + n.rests + n.release > 0 {
                out.push(i);
            }
            start = r.ends;
        }
        out
    }

    /// Ids of the jobs of forwarded submissions.
    fn forwarded_ids(&self) -> Vec<JobId> {
        let mut start = Ends::default();
        let mut ids = Vec::new();
        for r in &self.requests {
            if let Reply::Submit(_, true, ..) = r.reply {
                ids.extend(self.jobs[start.jobs..r.ends.jobs].iter().map(|j| j.id));
            }
            start = r.ends;
        }
        ids
    }

    /// Drops the jobs in `present` from forwarded submissions, counting them on each
    /// request; returns how many were dropped.
    fn skip_present(&mut self, present: &std::collections::HashSet<JobId>) -> usize {
        let old = std::mem::take(self);
        let (mut jobs, mut accepted) = (old.jobs.into_iter(), old.accepted.into_iter());
        let (mut rows, mut origins) = (old.rows.into_iter(), old.origins.into_iter());
        let (mut starts, mut rests) = (old.starts.into_iter(), old.rests.into_iter());
        let mut release = old.release.into_iter();
        let mut at = Ends::default();
        let mut skipped = 0;
        for request in old.requests {
            let n = request.ends - at;
            at = request.ends;
            let forwarded = matches!(request.reply, Reply::Submit(_, true, ..));
            let reply = match request.reply {
                Reply::Submit(reply, true, count, scheduled) => {
                    let mut dropped = 0;
                    for job in jobs.by_ref().take(n.jobs) {
                        if present.contains(&job.id) {
                            dropped += 1;
                        } else {
                            self.bytes += job_row_bytes(&job);
                            self.jobs.push(job);
                        }
                    }
                    let absent = |id: &JobId| !present.contains(id);
                    let taken = accepted.by_ref().take(n.accepted);
                    self.accepted.extend(taken.filter(|(id, _)| absent(id)));
                    // A forward's rows are its scheduled jobs' rows.
                    let taken = rows.by_ref().take(n.rows);
                    self.rows.extend(taken.filter(|(_, t)| absent(&t.job_id)));
                    skipped += dropped;
                    Reply::Submit(reply, true, count + dropped, scheduled)
                }
                other => {
                    self.jobs.extend(jobs.by_ref().take(n.jobs));
                    self.accepted.extend(accepted.by_ref().take(n.accepted));
                    self.rows.extend(rows.by_ref().take(n.rows));
                    other
                }
            };
            self.origins.extend(origins.by_ref().take(n.origins));
            self.starts.extend(starts.by_ref().take(n.starts));
            // A forward's rests are its ordered jobs' entries: one stored already keeps its
            // own (it may have moved on since).
            let taken = rests.by_ref().take(n.rests);
            self.rests
                .extend(taken.filter(|r| !forwarded || !present.contains(&r.job_id)));
            self.release.extend(release.by_ref().take(n.release));
            self.seal(reply);
        }
        skipped
    }

    /// Whether the batch writes nothing.
    fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.rows.is_empty()
            && self.starts.is_empty()
            && self.rests.is_empty()
            && self.release.is_empty()
    }
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
    metrics: Arc<Metrics>,
    lock_lost: CancellationToken,
    /// What its commits left open.
    open: OpenWork,
    /// The checkpoint last written, and when (`None`: not yet by this writer).
    checkpoint: Option<(u64, Instant)>,
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
            metrics,
            lock_lost,
            open: OpenWork::default(),
            checkpoint: None,
        }
    }

    /// Runs until every sender is gone (a clean stop) or ownership is lost.
    pub async fn run(mut self) {
        while let Some(first) = self.rx.recv().await {
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
                reply,
            } => {
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
                batch.seal(Reply::Submit(reply, forwarded, 0, scheduled));
            }
            WriteOp::Import {
                jobs,
                from_jobdb,
                reply,
            } => {
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
                batch.seal(Reply::Import(reply, jobs));
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
                for job in jobs {
                    let fresh = self.open.fresh(&job);
                    if fresh.is_some() || recovered {
                        // Numbered now, before any later barrier: a backlog page read after
                        // that barrier sees the entry.
                        let id = self.take_id();
                        batch.rests.push(OpenRow::resting(job, id, fresh));
                    }
                }
                batch.seal(Reply::Rest(done));
            }
            WriteOp::Release { heads } => {
                batch.bytes += heads.len() * 32;
                batch.release.extend(heads);
                batch.seal(Reply::Release);
            }
            WriteOp::Barrier(reply) => batch.seal(Reply::Barrier(reply, self.next_id)),
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

    /// Writes a batch, retrying what may pass and isolating what the JobDB refuses.
    async fn commit(&mut self, mut batch: Batch) {
        let mut pause = Duration::from_millis(50);
        loop {
            if self.lock_lost.is_cancelled() {
                return fail(batch, WriteRejected::LockLost);
            }
            if batch.is_empty() {
                return self.acknowledge(batch, None);
            }
            let started = Instant::now();
            let now = Utc::now();
            // The checkpoint, now and then, from what was open before this commit: it can
            // only close more, and everything it opens is numbered after (its own log row
            // included). Then its log row when it accepts jobs or begins attempts, and the
            // rests of jobs that waited long without a row.
            let checkpoint = self.checkpoint_due(started);
            let log_id =
                (!batch.accepted.is_empty() || !batch.starts.is_empty()).then(|| self.take_id());
            let accepted: Vec<JobId> = batch.accepted.iter().map(|(id, _)| *id).collect();
            let mut rests = batch.rests.clone();
            for (job, fresh) in self.open.due_rests(started, self.limits.rest_after) {
                let id = self.take_id();
                rests.push(OpenRow::resting(job, id, Some(fresh)));
            }
            let fresh = self
                .open
                .fresh_among(batch.rows.iter().map(|(_, t)| &t.job_id));
            let append = Append {
                jobs: &batch.jobs,
                transitions: &batch.rows,
                origins: &batch.origins,
                log: log_id.map(|id| CommitLog {
                    id,
                    time: now,
                    accepted: &accepted,
                    started: &batch.starts,
                }),
                rests: &rests,
                fresh: Some(&fresh),
                checkpoint,
                release: &batch.release,
                release_touched: self.release_in_commit,
            };
            let result = self.db.append_all(self.token, &append).await;
            let mut written = Written::default();
            let committed = match result {
                Ok(w) => {
                    written = w;
                    true
                }
                Err(JobDbError::Fenced { ours, current }) => {
                    tracing::error!(
                        ours,
                        current,
                        "fenced out of the jobdb: another director owns it"
                    );
                    self.metrics.fence_rejections.inc();
                    self.lock_lost.cancel();
                    return fail(batch, WriteRejected::LockLost);
                }
                Err(JobDbError::Duplicate(why)) => {
                    match self.skip_present(&mut batch).await {
                        Some(0) | None => return self.isolate(batch, why).await,
                        // Jobs an earlier try stored are out of the batch: write the rest.
                        Some(_) => continue,
                    }
                }
                Err(JobDbError::Refused(why)) => return self.isolate(batch, why).await,
                Err(JobDbError::CommitUnknown(err)) => {
                    tracing::warn!(error = %err, "jobdb commit's answer lost; checking whether it committed");
                    // If it committed, what it wrote besides its rows (notices, releases) is
                    // not known here (nor, for a batch of rests and releases alone, whether
                    // it did): the scheduler's next pass reads it, and the sequencer's sweep
                    // moves on the sequences it touched.
                    let _ = self.scheduler.send(Event::ReadBacklog);
                    self.committed_after_error(log_id, &batch.rows).await
                }
                Err(err) => {
                    tracing::warn!(error = %err, cause = ?std::error::Error::source(&err), "jobdb append failed before its commit; nothing of it was stored");
                    false
                }
            };
            if committed {
                let rows = batch.rows.len() + batch.jobs.len() + rests.len();
                self.metrics.observe_write(rows, started.elapsed());
                self.metrics
                    .jobs_rested
                    .inc_by((rests.len() - batch.rests.len()) as u64);
                if let Some(open_from) = checkpoint {
                    self.checkpoint = Some((open_from, started));
                }
                self.open.committed(
                    log_id,
                    started,
                    &batch.accepted,
                    &batch.starts,
                    &batch.rows,
                    &rests,
                );
                let (fresh, under_way) = self.open.counts();
                self.metrics.jobs_fresh.set(fresh as i64);
                self.metrics.attempts_under_way.set(under_way as i64);
                let Written {
                    notices,
                    released,
                    touched,
                } = written;
                if !released.is_empty() {
                    // Ordered jobs whose turn came: resting jobs, due as their entry says.
                    self.metrics.ordered_released.inc_by(released.len() as u64);
                    let _ = self.scheduler.send(Event::Imported(released));
                }
                if !touched.is_empty() && !self.release_in_commit {
                    let _ = self.sequencer.send(touched);
                }
                if !notices.is_empty() {
                    // Completion notices of jobs this commit ended: resting jobs, as imported.
                    self.metrics.notices_written.inc_by(notices.len() as u64);
                    let notices = notices
                        .into_iter()
                        .map(|job| Recovered {
                            job,
                            attempts: 0,
                            retry_at: None,
                        })
                        .collect();
                    let _ = self.scheduler.send(Event::Imported(notices));
                }
                let start = log_id.map(|commit| AttemptStart { commit, at: now });
                return self.acknowledge(batch, start);
            }
            // Not committed: producers get a clear 503 now (they may retry), while transitions
            // of jobs already owned must reach the JobDB, so they wait and go again.
            if batch.requests.iter().any(|r| r.reply.is_producers()) {
                let rejected = batch.retain(|reply| !reply.is_producers());
                let rejected_jobs: usize = rejected.iter().map(|(_, jobs)| jobs).sum();
                for (reply, _) in rejected {
                    reply.reject(WriteRejected::Unavailable);
                }
                tracing::warn!(rejected_jobs, "submission rejected: jobdb unavailable");
            }
            if batch.is_empty() {
                return self.acknowledge(batch, None);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// After the JobDB refused a duplicate key: which jobs of the batch's forwarded
    /// submissions are stored already (by an earlier try of the same request), dropped from
    /// the batch and counted on their requests. Returns how many (`None`: the JobDB could not
    /// be asked, or the batch forwards nothing).
    async fn skip_present(&self, batch: &mut Batch) -> Option<usize> {
        let ids = batch.forwarded_ids();
        if ids.is_empty() {
            return None;
        }
        let present = match self.db.existing_jobs(&ids).await {
            Ok(present) => present,
            Err(err) => {
                tracing::warn!(error = %err, "jobdb unreachable while looking for forwarded jobs stored already");
                return None;
            }
        };
        let skipped = batch.skip_present(&present);
        if skipped > 0 {
            tracing::info!(
                skipped,
                "forwarded jobs stored already by an earlier try: not stored again"
            );
        }
        Some(skipped)
    }

    /// The checkpoint to write with the next commit, if one is due: the oldest commit that
    /// holds something open, or the next id when none does. Taken before the commit numbers
    /// anything of its own.
    fn checkpoint_due(&self, now: Instant) -> Option<u64> {
        let open_from = self.open.open_from(self.next_id);
        match self.checkpoint {
            Some((written, _)) if written == open_from => None,
            Some((_, at)) if now < at + CHECKPOINT_EVERY => None,
            _ => Some(open_from),
        }
    }

    /// The JobDB refused the batch's data: writes it in halves until the request carrying the
    /// refused rows is alone, and refuses that one only.
    async fn isolate(&mut self, mut batch: Batch, why: String) {
        let writing = batch.writing();
        if writing.len() <= 1 {
            let refused = batch.retain(|reply| matches!(reply, Reply::Barrier(..)));
            for (reply, jobs) in refused {
                let kind = reply.kind();
                self.metrics.write_rejected(kind, "refused");
                tracing::error!(
                    request = kind,
                    jobs,
                    reason = %why,
                    "the jobdb refused a write request; it alone is not stored"
                );
                reply.reject(WriteRejected::Refused {
                    too_large: why.contains("max_allowed_packet"),
                });
            }
            return self.acknowledge(batch, None);
        }
        // Split between two writing requests; a barrier stays with what precedes it.
        let second = batch.split_off(writing[writing.len() / 2]);
        Box::pin(self.commit(batch)).await;
        Box::pin(self.commit(second)).await;
    }

    /// After a failed COMMIT, finds out whether it committed anyway (the COMMIT may have
    /// reached the server before the connection broke): its log row, or else its last row,
    /// exists or not. Keeps asking until the JobDB answers, because a wrong guess either loses
    /// or duplicates work. A batch of rests alone is taken as not committed: writing its
    /// entries again changes nothing.
    async fn committed_after_error(&self, log: Option<u64>, rows: &[(u64, Transition)]) -> bool {
        let last = rows.last();
        if log.is_none() && last.is_none() {
            return false;
        }
        let mut pause = Duration::from_millis(100);
        loop {
            if self.lock_lost.is_cancelled() {
                return false;
            }
            let found = match (log, last) {
                (Some(id), _) => self.db.commit_exists(id).await,
                (None, Some((id, t))) => self.db.transition_exists(t.job_id, *id).await,
                (None, None) => Ok(false),
            };
            match found {
                Ok(found) => return found,
                Err(err) => {
                    tracing::warn!(error = %err, "jobdb unreachable while checking a commit");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Answers every request of a committed batch; `start` is where its attempts began.
    fn acknowledge(&self, batch: Batch, start: Option<AttemptStart>) {
        let transaction = Ulid::new();
        let mut jobs = batch.jobs.into_iter();
        let mut at = 0;
        for request in batch.requests {
            let taken = request.ends.jobs - at;
            at = request.ends.jobs;
            match request.reply {
                Reply::Import(reply, mut imported) => {
                    jobs.by_ref().take(taken).for_each(drop);
                    self.metrics.jobs_imported.inc_by(imported.len() as u64);
                    // Ordered jobs wait, held, for the sequencer to release them.
                    imported.retain(|r| r.job.ordering.is_none());
                    let _ = self.scheduler.send(Event::Imported(imported));
                    let _ = reply.send(Ok(()));
                }
                Reply::Submit(reply, _, already_present, scheduled) => {
                    let mut accepted: Vec<Arc<Job>> = jobs.by_ref().take(taken).collect();
                    self.metrics.jobs_accepted.inc_by(accepted.len() as u64);
                    // The scheduler learns of the jobs only now that they are durable; the
                    // producer hears about it at the same moment. Scheduled jobs reach it as
                    // resting jobs, due at their time.
                    if !scheduled.is_empty() {
                        let times: std::collections::HashMap<JobId, DateTime<Utc>> =
                            scheduled.into_iter().collect();
                        let mut later = Vec::with_capacity(times.len());
                        accepted.retain(|job| match times.get(&job.id) {
                            Some(at) => {
                                later.push(Recovered {
                                    job: job.clone(),
                                    attempts: 0,
                                    retry_at: Some(*at),
                                });
                                false
                            }
                            None => true,
                        });
                        self.metrics.jobs_scheduled.inc_by(later.len() as u64);
                        later.retain(|r| r.job.ordering.is_none());
                        let _ = self.scheduler.send(Event::Imported(later));
                    }
                    // Ordered jobs wait, held, for the sequencer to release them.
                    accepted.retain(|job| job.ordering.is_none());
                    if !accepted.is_empty() {
                        let _ = self.scheduler.send(Event::Accepted(accepted));
                    }
                    let _ = reply.send(Ok(Accepted {
                        transaction,
                        already_present,
                    }));
                }
                Reply::Release => {}
                Reply::Transitions(done) | Reply::Rest(done) => {
                    if let Some(done) = done {
                        let _ = done.send(Ok(()));
                    }
                }
                Reply::Start(done) => {
                    // A committed batch with starts always wrote its log row.
                    let _ = done.send(start.ok_or(WriteRejected::Unavailable));
                }
                Reply::Barrier(reply, next_id) => {
                    let _ = reply.send(next_id);
                }
            }
        }
    }
}

fn fail(batch: Batch, why: WriteRejected) {
    for request in batch.requests {
        request.reply.reject(why);
    }
}
