//! Committing a batch, and what its outcome means: a commit that succeeded is acknowledged
//! (producers answered, new jobs handed to the scheduler); a failure is classified (fenced,
//! refused, duplicate, expired, outcome unknown, or not committed) before anything is retried,
//! as the module doc of [`super`] describes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use ulid::Ulid;

use super::batch::{Batch, Reply};
use super::Writer;
use crate::director::mailbox::{Accepted, Event, Repeats, Ticket, WriteRejected};
use crate::director::ordering::plan::Plan;
use crate::director::ordering::{Done, Write};
use crate::job::{AttemptStart, Job, JobId, Recovered, Transition};
use crate::jobdb::{Append, BlockedKey, CommitLog, Fresh, JobDbError, OpenRow, Stalled, Written};

/// How often the checkpoint is written (at most): a new owner reads at most this much more of
/// `commit_log` than it must.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

impl Writer {
    /// Writes a batch, retrying what may pass and isolating what the JobDB refuses.
    pub(super) async fn commit(&mut self, mut batch: Batch) {
        let mut pause = Duration::from_millis(50);
        loop {
            if self.lock_lost.is_cancelled() {
                return fail(batch, WriteRejected::LockLost);
            }
            self.leave_out_lapsed(&mut batch);
            self.skip_delivered(&mut batch).await;
            if batch.is_empty() && !self.ordering.pending() {
                return self.acknowledge(batch, None);
            }
            let started = Instant::now();
            self.progress.busy();
            let prepared = self.prepare(&batch, started);
            let bounds = self.limits.bounds(batch.not_after());
            let (result, answered) = self
                .db
                .append_answered(self.token, &prepared.append(&batch), &bounds)
                .await;
            let committed = match self.outcome(result, &mut batch, prepared.log_id).await {
                Outcome::Settled(committed) => committed,
                Outcome::Again => continue,
                Outcome::Fail(why) => return fail(batch, why),
                Outcome::Isolate(why) => return self.isolate(batch, why).await,
            };
            match committed {
                // What it wrote, if it committed, is what the transaction read before its
                // COMMIT.
                Committed::Yes => {
                    let written = answered.unwrap_or_default();
                    return self.after_commit(batch, prepared, written, started);
                }
                // Ownership was lost before the outcome could be read: producers hear that it
                // is unknown; nothing else will be written by this writer.
                Committed::Unknown => {
                    self.ordering.rolled_back();
                    for request in batch.requests {
                        match request.reply.is_producers() {
                            true => request.reply.reject(WriteRejected::Unknown),
                            false => request.reply.reject(WriteRejected::LockLost),
                        }
                    }
                    return;
                }
                Committed::No => self.ordering.rolled_back(),
            }
            // Not committed: producers get a clear 503 now (they may retry), while transitions
            // of jobs already owned must reach the JobDB, so they wait and go again.
            if batch.requests.iter().any(|r| r.reply.is_producers()) {
                let rejected = batch.retain(|r| !r.reply.is_producers());
                let rejected_jobs: usize = rejected.iter().map(|(_, jobs)| jobs).sum();
                for (request, _) in rejected {
                    request.reply.reject(WriteRejected::Unavailable);
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

    /// Plans one write of `batch`: the ordering book's plan, the ids it takes, and every list
    /// the store's [`Append`] borrows.
    fn prepare(&mut self, batch: &Batch, started: Instant) -> Prepared {
        let now = Utc::now();
        // The checkpoint, now and then, from what was open before this commit: it can only
        // close more, and everything it opens is numbered after (its own log row included).
        let checkpoint = self.checkpoint_due(started);
        let leaving = batch.leaving();
        let at = self.next_id;
        let plan = self.ordering.plan(&Write {
            now,
            at,
            arrivals: &batch.arrivals(),
            leaving: &leaving.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
            proposed: &batch.release,
            expired: &batch.expired_releases(),
            carried: &batch
                .blocks()
                .iter()
                .map(BlockedKey::seq)
                .collect::<Vec<_>>(),
            begins: &batch.begins(),
        });
        // A block this write may write is stamped `at`: the id is taken, so a barrier answered
        // before this commit reads below it and one answered after above it (the sequencer
        // judges a block gone only by a read after a barrier above its stamp).
        if !plan.blockers.is_empty() || !batch.blocks().is_empty() || self.ordering.spilled() {
            self.take_id();
        }
        // Jobs accepted here and fresh (no entry): the unordered ones, and the ordered ones
        // the plan keeps or lets go at once. Attempts begun: the scheduler's, and those of
        // jobs going from memory.
        let mut accepted = batch.accepted.clone();
        accepted.extend(
            batch
                .jobs
                .iter()
                .filter(|j| plan.fresh.contains(&j.id))
                .map(|j| (j.id, Fresh::of(j))),
        );
        let mut starts = batch.starts.clone();
        starts.extend(
            plan.go
                .iter()
                .filter(|(_, begun)| *begun)
                .map(|(r, _)| (r.job.id, r.next_attempt())),
        );
        // A commit that stores jobs always writes its log row: it is what tells, after a lost
        // answer, whether the jobs were stored (an ordered job with an entry is not listed by
        // it, and has no row of its own).
        let log_id = (!accepted.is_empty()
            || !starts.is_empty()
            || !plan.begin.is_empty()
            || !batch.jobs.is_empty())
        .then(|| self.take_id());
        let accepted_ids = accepted.iter().map(|(id, _)| *id).collect();
        let rests = self.rests(batch, &plan, started);
        let fresh = self
            .open
            .fresh_among(batch.rows.iter().map(|(_, t)| &t.job_id));
        let (read_left, blocks) = self.left_reads(batch, &plan, &leaving, &fresh);
        Prepared {
            now,
            at,
            checkpoint,
            released_entries: plan.released_entries.iter().copied().collect(),
            begin: plan.begin.iter().copied().collect(),
            plan,
            accepted,
            accepted_ids,
            starts,
            log_id,
            rests,
            fresh,
            read_left,
            blocks,
        }
    }

    /// What the store's answer to a write means for the batch: settled (committed, not, or
    /// unknown), to be written again at once, or ended for the batch (lock lost, refused).
    async fn outcome(
        &mut self,
        result: Result<(), JobDbError>,
        batch: &mut Batch,
        log_id: Option<u64>,
    ) -> Outcome {
        match result {
            Ok(()) => Outcome::Settled(Committed::Yes),
            Err(JobDbError::Fenced { ours, current }) => {
                self.ordering.rolled_back();
                self.fenced_out(ours, current);
                Outcome::Fail(WriteRejected::LockLost)
            }
            Err(JobDbError::Duplicate(why)) => {
                self.ordering.rolled_back();
                match self.skip_present(batch).await {
                    Some(0) | None => Outcome::Isolate(why),
                    // Jobs an earlier try stored are out of the batch: write the rest.
                    Some(_) => Outcome::Again,
                }
            }
            Err(JobDbError::Refused(why)) => {
                self.ordering.rolled_back();
                Outcome::Isolate(why)
            }
            // A forward's `not_after` passed before the COMMIT: rolled back. It is answered and
            // left out at the top; the rest goes again at once.
            Err(JobDbError::Expired) => {
                self.ordering.rolled_back();
                Outcome::Again
            }
            Err(e @ (JobDbError::CommitUnknown(_) | JobDbError::CommitStalled(_))) => {
                tracing::warn!(error = %e, cause = ?std::error::Error::source(&e), "jobdb commit's answer lost; checking whether it committed");
                let stalled = match e {
                    JobDbError::CommitStalled(stalled) => Some(stalled),
                    _ => None,
                };
                Outcome::Settled(
                    self.committed_after_error(stalled, log_id, &batch.rows)
                        .await,
                )
            }
            Err(err) => {
                tracing::warn!(error = %err, cause = ?std::error::Error::source(&err), "jobdb append failed before its commit; nothing of it was stored");
                Outcome::Settled(Committed::No)
            }
        }
    }

    /// A write committed: its metrics, the checkpoint, the ordering book, the open work, and
    /// the answers to its requests.
    fn after_commit(
        &mut self,
        batch: Batch,
        mut prepared: Prepared,
        written: Written,
        started: Instant,
    ) {
        self.progress.idle();
        let rows = batch.rows.len() + batch.jobs.len() + prepared.rests.len();
        self.metrics.observe_write(rows, started.elapsed());
        let rested = prepared
            .rests
            .iter()
            .filter(|r| self.open.is_fresh(&r.job_id));
        self.metrics.jobs_rested.inc_by(rested.count() as u64);
        if let Some(open_from) = prepared.checkpoint {
            self.checkpoint = Some((open_from, started));
        }
        // Attempts begun by releases are open in this commit as the batch's own.
        prepared
            .starts
            .extend(written.started.iter().map(|r| (r.job.id, r.next_attempt())));
        let (log_id, now) = (prepared.log_id, prepared.now);
        self.committed(prepared.plan, written, log_id, now, prepared.at);
        self.open.committed(
            log_id,
            started,
            &prepared.accepted,
            &prepared.starts,
            &batch.rows,
            &prepared.rests,
        );
        let (fresh, under_way) = self.open.counts();
        self.metrics.jobs_fresh.set(fresh as i64);
        self.metrics.attempts_under_way.set(under_way as i64);
        let start = log_id.map(|commit| AttemptStart { commit, at: now });
        self.acknowledge(batch, start)
    }

    /// The entries this write gives: the batch's (new ordered jobs, as the plan stores them;
    /// requested rests), those of fresh jobs waiting past `rest_after`, and those of fresh
    /// jobs whose sequence the plan spilled. An ordered fresh one goes in held when it waits
    /// for its turn, released when it is under way, as the book says.
    fn rests(&mut self, batch: &Batch, plan: &Plan, now: Instant) -> Vec<OpenRow> {
        let mut rests: Vec<OpenRow> = batch
            .rests
            .iter()
            .filter(|r| !plan.fresh.contains(&r.job_id))
            .cloned()
            .map(|mut r| {
                if plan.released_entries.contains(&r.job_id) {
                    r.released = true;
                }
                r
            })
            .collect();
        let due = self.open.due_rests(now, self.limits.rest_after);
        self.rest_fresh(&mut rests, due);
        let mut listed: std::collections::HashSet<JobId> = rests.iter().map(|r| r.job_id).collect();
        for (job, waits) in &plan.rest {
            let Some(fresh) = self.open.fresh(job) else {
                continue;
            };
            if listed.insert(*job) {
                let id = self.take_id();
                rests.push(OpenRow::rest_of_fresh(*job, id, fresh, *waits));
            }
        }
        for r in rests.iter_mut().filter(|r| r.place.is_some()) {
            if !self.open.is_fresh(&r.job_id) {
                continue;
            }
            if let Some(held) = self.ordering.rest(&r.job_id) {
                r.released = !held;
            }
        }
        rests
    }

    /// What the store must read of the batch's leaving jobs (the sequences the book does not
    /// hold, the blocks of jobs with an entry) and the blocks this write knows (carried by
    /// imports, or of fresh jobs, which have no entry to read).
    fn left_reads(
        &self,
        batch: &Batch,
        plan: &Plan,
        leaving: &[(crate::director::ordering::plan::Leaving, &Transition)],
        fresh: &HashMap<JobId, Fresh>,
    ) -> (Vec<JobId>, Vec<BlockedKey>) {
        let mut blocks = batch.blocks();
        let mut read: Vec<JobId> = plan
            .read_left
            .iter()
            .filter(|job| !fresh.contains_key(job))
            .copied()
            .collect();
        if plan.blockers.is_empty() {
            return (read, blocks);
        }
        let ends: HashMap<JobId, &Transition> = leaving.iter().map(|(l, t)| (l.job, *t)).collect();
        for job in &plan.blockers {
            match (fresh.get(job), ends.get(job)) {
                (Some(f), Some(end)) => blocks.extend(f.block(end)),
                _ => read.push(*job),
            }
        }
        (read, blocks)
    }

    /// A write committed: the book keeps what its plan changed, and the scheduler gets the
    /// jobs that go (begun in this commit or not) and the completion notices written.
    fn committed(
        &mut self,
        plan: Plan,
        written: Written,
        log: Option<u64>,
        now: DateTime<Utc>,
        at: u64,
    ) {
        let Written {
            notices,
            mut released,
            started,
            left,
            blocks_written,
        } = written;
        let done_ids: Vec<JobId> = released.iter().chain(&started).map(|r| r.job.id).collect();
        self.ordering.committed(
            &plan,
            &Done {
                released: done_ids,
                left: &left,
                blocked: &blocks_written,
            },
            at,
        );
        let mut begun = started;
        for (job, began) in plan.go {
            match began {
                true => begun.push(job),
                false => released.push(job),
            }
        }
        if let (false, Some(commit)) = (begun.is_empty(), log) {
            let start = AttemptStart { commit, at: now };
            let _ = self.scheduler.send(Event::BegunOnRelease(begun, start));
        }
        if !released.is_empty() {
            let _ = self.scheduler.send(Event::HandedOver(released));
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
            let _ = self.scheduler.send(Event::HandedOver(notices));
        }
    }

    /// Leaves out of the batch the requests no try may write any more: a forward whose
    /// `not_after` has passed is refused (`Expired`: nothing stored); one whose handler
    /// stopped waiting (and answered 504) is dropped, its handler hears nothing more.
    fn leave_out_lapsed(&self, batch: &mut Batch) {
        let now = Utc::now();
        if !batch.requests.iter().any(|r| r.lapsed(now)) {
            return;
        }
        for (request, jobs) in batch.retain(|r| !r.lapsed(now)) {
            let kind = request.reply.kind();
            if request.ticket.as_ref().is_some_and(Ticket::abandoned) {
                tracing::warn!(
                    request = kind,
                    jobs,
                    "left out of the write: its producer stopped waiting, told the outcome is unknown"
                );
                continue;
            }
            self.metrics.write_rejected(kind, "expired");
            tracing::warn!(
                request = kind,
                jobs,
                "forwarded jobs refused: their not_after passed before the commit"
            );
            request.reply.reject(WriteRejected::Expired);
        }
    }

    /// Writes the checkpoint alone, bounded like any commit: how a writer whose last try
    /// failed finds out that the JobDB can be written again when nothing else comes to try.
    pub(super) async fn probe(&mut self) {
        if self.lock_lost.is_cancelled() {
            return;
        }
        let started = Instant::now();
        let open_from = self.open.open_from(self.next_id);
        let append = Append {
            checkpoint: Some(open_from),
            ..Append::default()
        };
        let bounds = self.limits.bounds(None);
        match self.db.append_bounded(self.token, &append, &bounds).await {
            Ok(_) => {
                tracing::info!("the jobdb can be written again");
                self.checkpoint = Some((open_from, started));
                self.metrics.observe_commit();
                self.progress.idle();
            }
            Err(JobDbError::Fenced { ours, current }) => self.fenced_out(ours, current),
            // Whether an unanswered checkpoint committed does not matter: the same value,
            // or one that only makes a new owner read a little more.
            Err(e) => tracing::debug!(error = %e, "the jobdb still cannot be written"),
        }
    }

    /// Another Director owns the JobDB now (its fencing token refused ours): says so,
    /// counts it and gives up the lock, so nothing more is written by this writer.
    fn fenced_out(&self, ours: u64, current: u64) {
        tracing::error!(
            ours,
            current,
            "fenced out of the jobdb: another director owns it"
        );
        self.metrics.fence_rejections.inc();
        self.lock_lost.cancel();
    }

    /// After the JobDB refused a duplicate key: which jobs of the batch's forwarded
    /// submissions are stored already (by an earlier try of the same request), dropped from
    /// the batch and counted on their requests. Returns how many (`None`: the JobDB could not
    /// be asked, or the batch forwards nothing).
    async fn skip_present(&self, batch: &mut Batch) -> Option<usize> {
        let ids: Vec<JobId> = batch
            .repeating(Repeats::SameIds)
            .iter()
            .map(|j| j.id)
            .collect();
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

    /// Before a try that stores back-filled jobs: drops each whose event has a job of its
    /// subscription here already, or earlier in the batch (counted on its request). This
    /// writer alone stores jobs in its JobDB, and its commits go one at a time, so what it
    /// reads holds until its commit. If the JobDB cannot be read, the back-fills are refused
    /// (nothing of them stored; they may be sent again).
    async fn skip_delivered(&self, batch: &mut Batch) {
        let jobs = batch.repeating(Repeats::SameDeliveries);
        if jobs.is_empty() {
            return;
        }
        let mut events: HashMap<Ulid, Vec<Ulid>> = HashMap::new();
        for link in jobs.iter().filter_map(|j| j.event.as_ref()) {
            events
                .entry(link.subscription)
                .or_default()
                .push(link.event_id);
        }
        let mut delivered = HashSet::new();
        for (subscription, events) in &events {
            match self.db.events_delivered_to(*subscription, events).await {
                Ok(found) => delivered.extend(found.into_iter().map(|e| (*subscription, e))),
                Err(err) => {
                    tracing::warn!(error = %err, "back-fill refused: the jobdb could not be read");
                    let refused = batch.retain(|r| {
                        !matches!(r.reply, Reply::Submit(_, Repeats::SameDeliveries, ..))
                    });
                    for (request, _) in refused {
                        request.reply.reject(WriteRejected::Unavailable);
                    }
                    return;
                }
            }
        }
        let present: HashSet<JobId> = jobs
            .iter()
            .filter(|j| {
                j.event
                    .as_ref()
                    .is_some_and(|e| !delivered.insert((e.subscription, e.event_id)))
            })
            .map(|j| j.id)
            .collect();
        if !present.is_empty() && batch.skip_present(&present) > 0 {
            tracing::info!(
                skipped = present.len(),
                "back-filled events with a job of their subscription already: not stored again"
            );
        }
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
            let refused = batch.retain(|r| matches!(r.reply, Reply::Barrier(..)));
            for (request, jobs) in refused {
                let reply = request.reply;
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
    /// exists or not. A COMMIT that got no answer in time (`stalled`) is settled first: only
    /// once the server is done with its connection does a read tell. Keeps asking until the
    /// JobDB answers, because a wrong guess either loses or duplicates work; `Unknown` only if
    /// ownership is lost meanwhile. A batch of rests alone is taken as not committed: writing
    /// its entries again changes nothing.
    async fn committed_after_error(
        &self,
        mut stalled: Option<Stalled>,
        log: Option<u64>,
        rows: &[(u64, Transition)],
    ) -> Committed {
        let last = rows.last();
        let mut pause = Duration::from_millis(100);
        loop {
            if self.lock_lost.is_cancelled() {
                return Committed::Unknown;
            }
            let found = match self.db.settle(&mut stalled).await {
                Err(e) => Err(e),
                Ok(()) => match (log, last) {
                    (Some(id), _) => self.db.commit_exists(id).await,
                    (None, Some((id, t))) => self.db.transition_exists(t.job_id, *id).await,
                    (None, None) => Ok(false),
                },
            };
            match found {
                Ok(true) => return Committed::Yes,
                Ok(false) => return Committed::No,
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
                Reply::Import(reply, mut imported, _) => {
                    jobs.by_ref().take(taken).for_each(drop);
                    self.metrics.jobs_imported.inc_by(imported.len() as u64);
                    // Ordered jobs wait, held, for the sequencer to release them.
                    imported.retain(|r| r.job.ordering.is_none());
                    let _ = self.scheduler.send(Event::HandedOver(imported));
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
                        let _ = self.scheduler.send(Event::HandedOver(later));
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
                Reply::Release(_) | Reply::Begin(_) => {}
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

/// Whether a transaction committed, as far as the writer can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Committed {
    Yes,
    No,
    /// Ownership was lost before it could be found out.
    Unknown,
}

fn fail(batch: Batch, why: WriteRejected) {
    for request in batch.requests {
        request.reply.reject(why);
    }
}

/// One write of a batch, planned: what [`Writer::prepare`] computed for the store's
/// [`Append`] and for the bookkeeping after it commits.
struct Prepared {
    now: DateTime<Utc>,
    /// The next id when the plan was made (the stamp of blocks it writes).
    at: u64,
    checkpoint: Option<u64>,
    plan: Plan,
    /// Jobs accepted fresh (no entry), with what the open work keeps of each.
    accepted: Vec<(JobId, Fresh)>,
    accepted_ids: Vec<JobId>,
    /// Attempts begun, with their numbers.
    starts: Vec<(JobId, u16)>,
    log_id: Option<u64>,
    rests: Vec<OpenRow>,
    fresh: HashMap<JobId, Fresh>,
    read_left: Vec<JobId>,
    blocks: Vec<BlockedKey>,
    released_entries: Vec<JobId>,
    begin: Vec<JobId>,
}

impl Prepared {
    /// The store's write of `batch` as planned.
    fn append<'a>(&'a self, batch: &'a Batch) -> Append<'a> {
        Append {
            jobs: &batch.jobs,
            events: &batch.events,
            transitions: &batch.rows,
            origins: &batch.origins,
            log: self.log_id.map(|id| CommitLog {
                id,
                time: self.now,
                accepted: &self.accepted_ids,
                started: &self.starts,
            }),
            rests: &self.rests,
            fresh: Some(&self.fresh),
            checkpoint: self.checkpoint,
            released_entries: &self.released_entries,
            release: &self.plan.release,
            release_if_head: &self.plan.release_if_head,
            release_expired: &self.plan.release_expired,
            begin: &self.begin,
            read_left: &self.read_left,
            blocks: &self.blocks,
        }
    }
}

/// What the store's answer to one write leaves the commit loop to do.
enum Outcome {
    /// Whether it committed is known (or known to be unknowable).
    Settled(Committed),
    /// Nothing was stored; the batch (what is left of it) goes again at once.
    Again,
    /// Every request of the batch is answered with this.
    Fail(WriteRejected),
    /// The JobDB refused the batch: find the job it refuses.
    Isolate(String),
}
