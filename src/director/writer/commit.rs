//! Committing a batch, and what its outcome means: a commit that succeeded is acknowledged
//! (producers answered, new jobs handed to the scheduler); a failure is classified (fenced,
//! refused, duplicate, expired, outcome unknown, or not committed) before anything is retried,
//! as the module doc of [`super`] describes.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use ulid::Ulid;

use super::batch::{Batch, Reply};
use super::{Accepted, Alone, Ticket, WriteRejected, Writer};
use crate::director::scheduler::Event;
use crate::job::{AttemptStart, Job, JobId, Recovered, Transition};
use crate::jobdb::{Append, CommitLog, Fresh, JobDbError, Stalled, Written};

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
            if batch.is_empty() {
                return self.acknowledge(batch, None);
            }
            let started = Instant::now();
            let now = Utc::now();
            self.progress.busy();
            // The checkpoint, now and then, from what was open before this commit: it can
            // only close more, and everything it opens is numbered after (its own log row
            // included). Then its log row when it accepts jobs or begins attempts, and the
            // rests of jobs that waited long without a row.
            let checkpoint = self.checkpoint_due(started);
            // Listed after every job of the batch got its position: see `alone_now`.
            let Alone { alone, bear_fresh } = self.alone_now(&batch).await;
            // Not alone: the jobs the intake cleared may still go in this commit.
            let cleared_only = !alone && !self.cleared.is_empty();
            let release_touched = alone || cleared_only;
            let begins = match release_touched {
                true => batch.begins(),
                false => Default::default(),
            };
            let log_id = (!batch.accepted.is_empty()
                || !batch.starts.is_empty()
                || (release_touched && (batch.may_bear() || !begins.is_empty())))
            .then(|| self.take_id());
            let accepted: Vec<JobId> = batch.accepted.iter().map(|(id, _)| *id).collect();
            let mut rests = batch.rests.clone();
            let mut due = self.open.due_rests(started, self.limits.rest_after);
            if self.peers.is_some() && !bear_fresh {
                // Another JobDB may be live: it must find every job under way (and every
                // kept one) in an entry before this JobDB's fresh mark is lifted.
                due.extend(self.open.ordered_fresh());
            }
            // Memory of kept jobs dropped: no head of theirs may go before they have their
            // entries.
            self.rest_kept |= self.dropped_kept();
            due.extend(self.kept_due(now));
            self.rest_fresh(&mut rests, due);
            let fresh = self
                .open
                .fresh_among(batch.rows.iter().map(|(_, t)| &t.job_id));
            let (expired, blocks) = (batch.expired_releases(), batch.blocks());
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
                fresh_sequences: Some(self.open.sequences()),
                checkpoint,
                release: &batch.release,
                release_expired: &expired,
                blocks: &blocks,
                release_touched,
                cleared: cleared_only.then_some(&self.cleared),
                // In a cluster a job born released must be seen by the other JobDBs' reads:
                // through an entry, or through the fresh mark while no other is live.
                born_with_entry: self.peers.is_some() && !bear_fresh,
                begin_released: Some(&begins),
                known: alone.then_some(&self.known),
                keep: alone && bear_fresh && self.limits.keep_ordered,
                kept_sequences: Some(self.open.kept_sequences()),
            };
            let bounds = self.limits.bounds(batch.not_after());
            let result = self.db.append_bounded(self.token, &append, &bounds).await;
            if result.is_err() {
                // It may have changed memory and not the store.
                self.known
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clear();
            }
            let mut written = Written::default();
            let mut known = true;
            let mut committed = match result {
                Ok(w) => {
                    written = w;
                    Committed::Yes
                }
                Err(JobDbError::Fenced { ours, current }) => {
                    self.fenced_out(ours, current);
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
                // A forward's `not_after` passed before the COMMIT: rolled back. It is answered
                // and left out at the top; the rest goes again at once.
                Err(JobDbError::Expired) => continue,
                Err(e @ (JobDbError::CommitUnknown(_) | JobDbError::CommitStalled(_))) => {
                    tracing::warn!(error = %e, cause = ?std::error::Error::source(&e), "jobdb commit's answer lost; checking whether it committed");
                    // If it committed, what it wrote besides its rows (notices, releases) is
                    // not known here (nor, for a batch of rests and releases alone, whether
                    // it did): the scheduler's next pass reads it, and the sequencer's sweep
                    // moves on the sequences it touched.
                    let _ = self.scheduler.send(Event::ReadBacklog);
                    let stalled = match e {
                        JobDbError::CommitStalled(stalled) => Some(stalled),
                        _ => None,
                    };
                    known = false;
                    self.committed_after_error(stalled, log_id, &batch.rows)
                        .await
                }
                Err(err) => {
                    tracing::warn!(error = %err, cause = ?std::error::Error::source(&err), "jobdb append failed before its commit; nothing of it was stored");
                    Committed::No
                }
            };
            if committed == Committed::Yes && !known && release_touched {
                // Jobs it bore or kept were not told: they are the new ordered ones it left
                // without an entry. Which were born is not known, so every one of them is
                // taken as kept, and rests held for the sequencer to release by its turn.
                match self.unlisted_new(&batch).await {
                    Some(unlisted) => written.kept = unlisted,
                    None => committed = Committed::Unknown,
                }
            }
            // Kept jobs rest in the next commit if memory dropped some, or if this one's
            // were not told; once a commit rested them, no more.
            if self.dropped_kept() || (!known && !written.kept.is_empty()) {
                self.rest_kept = true;
            } else if committed == Committed::Yes {
                self.rest_kept = false;
            }
            if committed == Committed::Unknown {
                // Ownership was lost before the outcome could be read: producers hear that it
                // is unknown; nothing else will be written by this writer.
                for request in batch.requests {
                    match request.reply.is_producers() {
                        true => request.reply.reject(WriteRejected::Unknown),
                        false => request.reply.reject(WriteRejected::LockLost),
                    }
                }
                return;
            }
            if committed == Committed::Yes {
                self.progress.idle();
                let rows = batch.rows.len() + batch.jobs.len() + rests.len();
                self.metrics.observe_write(rows, started.elapsed());
                self.metrics
                    .jobs_rested
                    .inc_by((rests.len() - batch.rests.len()) as u64);
                if let Some(open_from) = checkpoint {
                    self.checkpoint = Some((open_from, started));
                }
                // Jobs born released or kept are fresh from now on, as if accepted unordered.
                let mut accepted = batch.accepted.clone();
                if !written.born.is_empty() || !written.kept.is_empty() {
                    let born: HashSet<JobId> = written.born.iter().copied().collect();
                    let kept: HashSet<JobId> = written.kept.iter().copied().collect();
                    accepted.extend(batch.jobs.iter().filter_map(|job| {
                        let fresh = Fresh::of(job);
                        match (born.contains(&job.id), kept.contains(&job.id)) {
                            (true, _) => Some((job.id, fresh)),
                            (_, true) => Some((
                                job.id,
                                Fresh {
                                    kept: true,
                                    ..fresh
                                },
                            )),
                            _ => None,
                        }
                    }));
                }
                // Attempts begun by releases are open in this commit as the batch's own.
                let mut starts = batch.starts.clone();
                starts.extend(written.started.iter().map(|r| (r.job.id, r.next_attempt())));
                self.open
                    .committed(log_id, started, &accepted, &starts, &batch.rows, &rests);
                self.open.gone_on(&written.gone_on);
                let (fresh, under_way) = self.open.counts();
                self.metrics.jobs_fresh.set(fresh as i64);
                self.metrics.attempts_under_way.set(under_way as i64);
                let Written {
                    notices,
                    released,
                    touched,
                    born,
                    born_with_entry,
                    started: begun,
                    heads_known,
                    heads_misremembered,
                    kept,
                    gone_on: _,
                } = written;
                self.metrics.ordered_kept.inc_by(kept.len() as u64);
                if !self.cleared.is_empty() {
                    for job in released.iter().chain(&begun) {
                        self.cleared.remove(&job.job.id);
                    }
                }
                // A sequence whose head this commit released has nothing more that may go
                // until that job ends: the sequencer need not look at it.
                let mut touched = touched;
                if cleared_only {
                    let went: std::collections::HashSet<crate::job::Seq> = released
                        .iter()
                        .chain(&begun)
                        .filter_map(|r| r.job.seq())
                        .collect();
                    touched.retain(|seq| !went.contains(seq));
                }
                self.metrics.ordered_heads_known.inc_by(heads_known as u64);
                self.metrics
                    .ordered_heads_misremembered
                    .inc_by(heads_misremembered as u64);
                if let (false, Some(commit)) = (begun.is_empty(), log_id) {
                    self.metrics.ordered_released.inc_by(begun.len() as u64);
                    self.metrics
                        .ordered_begun_on_release
                        .inc_by(begun.len() as u64);
                    let start = AttemptStart { commit, at: now };
                    let _ = self.scheduler.send(Event::BegunOnRelease(begun, start));
                }
                if !released.is_empty() {
                    // Ordered jobs whose turn came: resting jobs, due as their entry says.
                    self.metrics.ordered_released.inc_by(released.len() as u64);
                    self.metrics
                        .ordered_born
                        .inc_by((born.len() + born_with_entry) as u64);
                    let _ = self.scheduler.send(Event::HandedOver(released));
                }
                if !touched.is_empty() && !alone {
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
                    let _ = self.scheduler.send(Event::HandedOver(notices));
                }
                let start = log_id.map(|commit| AttemptStart { commit, at: now });
                return self.acknowledge(batch, start);
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

    /// Whether memory dropped kept jobs since the last ask (see
    /// [`crate::jobdb::KnownSequences::take_dropped_kept`]).
    fn dropped_kept(&self) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take_dropped_kept()
    }

    /// The new ordered jobs a batch whose answer was lost left without an entry (born
    /// released, or kept); `None` when ownership was lost first.
    async fn unlisted_new(&self, batch: &Batch) -> Option<Vec<JobId>> {
        let new: std::collections::HashSet<JobId> = batch.jobs.iter().map(|j| j.id).collect();
        let candidates: Vec<JobId> = batch
            .rests
            .iter()
            .filter(|r| r.place.is_some() && new.contains(&r.job_id))
            .map(|r| r.job_id)
            .collect();
        if candidates.is_empty() {
            return Some(Vec::new());
        }
        let mut pause = Duration::from_millis(100);
        loop {
            if self.lock_lost.is_cancelled() {
                return None;
            }
            match self.db.listed_among(&candidates).await {
                Ok(listed) => {
                    return Some(
                        candidates
                            .into_iter()
                            .filter(|id| !listed.contains(id))
                            .collect(),
                    );
                }
                Err(err) => {
                    tracing::warn!(error = %err, "jobdb unreachable while reading a commit's entries");
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
