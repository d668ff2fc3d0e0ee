//! What the scheduler takes in from the JobDB, off its own task: spilled jobs read back when
//! due, backlog pages (jobs waiting in the JobDB only), and the jobs an operator command names,
//! with the command carried out as [`operator::plan`] says.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::job::{Job, JobId, Progress, State};
use crate::jobdb::commands::{Action, Command};

use super::cache::{Entry, Phase};
use super::{backlog, operator, wait_until, Event, Scheduler};
use crate::director::mailbox::WriteOp;

impl Scheduler {
    /// Reads due spilled jobs back from the JobDB, in batches, off the scheduler task.
    pub(super) fn reload(&self, ids: Vec<JobId>) {
        let (db, events) = (self.db.clone(), self.events_tx.clone());
        tokio::spawn(async move {
            for chunk in ids.chunks(1000) {
                let event = match db.get_jobs(chunk).await {
                    Ok(jobs) => Event::Reloaded(jobs, chunk.to_vec()),
                    Err(e) => {
                        tracing::warn!(error = %e, jobs = chunk.len(), "reading spilled jobs back failed");
                        Event::ReloadFailed(chunk.to_vec())
                    }
                };
                let _ = events.send(event);
            }
        });
    }

    /// Spilled jobs read back: each rejoins its queue (a job fetched at the head of its queue
    /// goes back to the head; a retry that came due joins the back like any other).
    pub(super) fn reloaded(&mut self, jobs: Vec<Job>, asked: Vec<JobId>) {
        let now = Instant::now();
        let mut found = HashSet::with_capacity(jobs.len());
        for job in jobs {
            let id = job.id;
            found.insert(id);
            let Some(entry) = self.cache.restore(job) else {
                continue;
            };
            let fetched = entry.phase == Phase::Fetching;
            if fetched {
                if let Some(lane) = self.queues.lane_mut(&entry.lane) {
                    lane.fetched();
                }
            }
            self.enqueue_at(id, fetched);
        }
        self.cache.publish_memory();
        for id in asked.into_iter().filter(|id| !found.contains(id)) {
            tracing::error!(job = %id, "spilled job missing from the jobdb; trying again");
            self.unfetch(id);
            self.wait(id, now + Duration::from_secs(5));
        }
    }

    /// Reads the next page of the backlog (or the jobs of the oldest pending command) when
    /// the cache has room for it: after a writer barrier, so the read sees every row this
    /// scheduler has handed over.
    pub(super) async fn load_backlog(&mut self) {
        let now = Instant::now();
        if self.backlog.busy(now) {
            return;
        }
        if let Some(command) = self.commands.pop_front() {
            let (reply, barrier) = oneshot::channel();
            if self.writer.send(WriteOp::RestKept(reply)).await.is_err() {
                self.commands.push_front(command);
                return;
            }
            self.backlog.begin_read();
            backlog::read_targets(self.db.clone(), self.events_tx.clone(), barrier, command);
            return;
        }
        if !self.backlog.wanted(now) {
            return;
        }
        let page = self.page();
        if self.cache.room() < page && self.backlog.may_evict(now) {
            let evicted = self
                .cache
                .evict_far_waiting(page, now, self.limits.spill_after);
            if !evicted.is_empty() {
                self.backlog.evicted();
                // A job evicted before it ever rested (its start was refused) needs its entry
                // to be found again; the writer knows which do.
                self.rests.extend(evicted);
                self.flush_rests().await;
            }
        }
        let room = self.cache.room();
        if room < page {
            self.load_other_lanes(now, page).await;
            return;
        }
        let (reply, barrier) = oneshot::channel();
        if self.writer.send(WriteOp::Barrier(reply)).await.is_err() {
            return;
        }
        let (after, to_horizon) = self.backlog.begin_page(self.cache.roomy());
        let horizon = self.horizon();
        let limit = room.min(1000);
        // A lane holding more than half the cache is not read back while it does: its jobs
        // would take the room that the jobs of every other lane free, and each would make one
        // of theirs rest again to come in (a read and a write per job, for nothing).
        let hog = self
            .cache
            .hog(now, self.limits.spill_after, page)
            .map(|(lane, _)| lane);
        if let Some(lane) = &hog {
            self.backlog.leaving_out(lane.clone(), self.ready_in(lane));
        }
        let read = backlog::PageRead {
            after,
            horizon,
            whole: !to_horizon,
            limit,
            except_lane: hog,
        };
        backlog::read_page(
            self.db.clone(),
            self.events_tx.clone(),
            barrier,
            read,
            false,
        );
    }

    /// Takes a page of the backlog into the cache, as metadata (payloads are read when due).
    pub(super) fn backlog_page(
        &mut self,
        jobs: Option<Vec<(Job, Progress)>>,
        limit: usize,
        next_due: Option<DateTime<Utc>>,
    ) {
        let left = self.backlog.end_read(jobs.is_some(), Instant::now());
        let Some(jobs) = jobs else {
            return;
        };
        let read = jobs.len();
        let last = jobs.last().map(|(job, _)| job.id);
        let loaded = self.take_in(jobs, &left);
        self.backlog.loaded(loaded);
        let roomy = self.cache.roomy();
        self.backlog
            .page_taken(read, limit, last, roomy, next_due, self.limits.spill_after);
    }

    /// Caches jobs read from the JobDB, as metadata (payloads are read when due), but those
    /// cached already or that `left` the cache while they were read.
    fn take_in(&mut self, jobs: Vec<(Job, Progress)>, left: &HashSet<JobId>) -> usize {
        let mut loaded = 0;
        for (job, progress) in jobs {
            if self.cache.contains(&job.id) || left.contains(&job.id) {
                continue;
            }
            let retry_at = match progress.state {
                State::AwaitingRetry => progress.retry_at,
                _ => None,
            };
            let mut entry = Entry::new(Arc::new(job), progress.attempts);
            entry.spilled = true;
            self.admit_at(entry, retry_at);
            loaded += 1;
        }
        self.metrics.jobs_backlog_loaded.inc_by(loaded as u64);
        self.cache.gauge();
        loaded
    }

    /// The cache is too full for a backlog page. If one lane holds more than half of it (an
    /// endpoint that hangs or fails with more jobs than the cache holds), the other lanes'
    /// jobs resting in the JobDB would wait until that lane drains: read a page of theirs
    /// (leaving that lane's out, in SQL), and that lane gives way to them: never below half
    /// the cache, so two lanes cannot take turns evicting each other. At once again while
    /// pages come back full; else a second later, longer while such reads find nothing.
    async fn load_other_lanes(&mut self, now: Instant, page: usize) {
        if !self.backlog.pending || self.backlog.others_at.is_some_and(|at| at > now) {
            return;
        }
        self.backlog.others_at = Some(now + self.backlog.leaving_out_wait(self.limits.spill_after));
        let Some((lane, surplus)) = self
            .cache
            .hog(now, self.limits.spill_after, page)
            .filter(|(_, surplus)| *surplus > 0)
        else {
            return;
        };
        let (reply, barrier) = oneshot::channel();
        if self.writer.send(WriteOp::Barrier(reply)).await.is_err() {
            return;
        }
        self.backlog.begin_read();
        let horizon = self.horizon();
        let read = backlog::PageRead {
            after: self.backlog.others_cursor,
            horizon,
            whole: false,
            limit: surplus.min(page),
            except_lane: Some(lane),
        };
        backlog::read_page(self.db.clone(), self.events_tx.clone(), barrier, read, true);
    }

    /// A page of other lanes' jobs: `lane` gives way to them (its newest waiting jobs go
    /// back to rest in the JobDB) and they come in.
    pub(super) fn other_lanes_page(
        &mut self,
        jobs: Option<Vec<(Job, Progress)>>,
        lane: &Arc<str>,
        limit: usize,
    ) {
        let left = self.backlog.end_read(jobs.is_some(), Instant::now());
        let Some(mut jobs) = jobs else {
            return;
        };
        if self.backlog.others_cursor.is_none() {
            self.backlog.left_out_found(jobs.len());
        }
        if jobs.len() < limit {
            self.backlog.others_cursor = None;
        } else {
            // More may wait: read on at once.
            self.backlog.others_cursor = jobs.last().map(|(job, _)| job.id);
            self.backlog.others_at = None;
        }
        jobs.retain(|(job, _)| !self.cache.contains(&job.id) && !left.contains(&job.id));
        let short = jobs.len().saturating_sub(self.cache.room());
        if short > 0 {
            let newest = self.cache.newest_waiting_of(lane, short);
            self.evict(newest);
        }
        self.take_in(jobs, &left);
    }

    /// Applies an operator command to the waiting jobs it names: those in the cache, and
    /// those only in the JobDB (`targets`), as [`operator::plan`] says.
    pub(super) fn apply_command(
        &mut self,
        command: Command,
        targets: Option<Vec<(JobId, Progress)>>,
    ) {
        let left = self.backlog.end_read(targets.is_some(), Instant::now());
        let Some(targets) = targets else {
            self.commands.push_front(command);
            return;
        };
        let command = Arc::new(command);
        let (now, instant) = (Utc::now(), Instant::now());
        let named: Vec<operator::Named> = self
            .cache
            .iter()
            .filter(|(_, e)| command.matches(&e.job))
            .map(|(id, e)| operator::Named {
                id: *id,
                attempts: e.attempts,
                expire_at: e.job.expire_at,
                standing: match e.phase {
                    Phase::Waiting { .. } | Phase::Aside => operator::Standing::Waiting,
                    Phase::Ready => operator::Standing::Ready,
                    _ => operator::Standing::Busy,
                },
                due: match e.phase {
                    Phase::Waiting { due } => chrono::Duration::from_std(due - instant)
                        .ok()
                        .and_then(|left| now.checked_add_signed(left)),
                    _ => None,
                },
            })
            .collect();
        let cache = &self.cache;
        let plan = operator::plan(
            &command,
            &named,
            targets,
            |id| cache.contains(&id) || left.contains(&id),
            now,
        );
        self.outbox.extend(plan.rows);
        let at = Instant::now();
        if let Some(cutoff) = at.checked_sub(super::PLANNED_IN_DB_KEEP) {
            self.planned_in_db
                .retain(|_, (planned, _)| *planned >= cutoff);
        }
        self.planned_in_db
            .extend(plan.in_db.into_iter().map(|(id, due)| (id, (at, due))));
        for step in plan.steps {
            match step {
                operator::Step::Wait {
                    id,
                    until,
                    postponed,
                } => {
                    self.wait(id, Instant::now() + wait_until(now, until));
                    if let Some(entry) = self.cache.get_mut(&id).filter(|_| postponed) {
                        entry.failed_at = None;
                    }
                }
                operator::Step::End(id) => {
                    self.forget(id);
                }
                operator::Step::Doom(id) => {
                    if let Some(entry) = self.cache.get_mut(&id) {
                        entry.doomed = Some(command.clone());
                    }
                }
            }
        }
        if plan.due_now {
            self.backlog.due_now();
        }
        if !plan.flushed.is_empty() {
            self.metrics.jobs_expired.inc_by(plan.flushed.len() as u64);
            self.expired(plan.flushed);
        }
        self.cache.gauge();
        tracing::info!(
            command = command.id,
            action = %command.action.error_kind(),
            by = %command.issued_by,
            jobs = plan.changed,
            "operator command applied"
        );
        self.applied.push((command.id, plan.changed));
    }

    /// Ends a job a discard or flush named while it was mid-attempt.
    pub(super) fn end_doomed(&mut self, id: JobId) {
        let Some(entry) = self.forget(id) else { return };
        let Some(command) = entry.doomed else { return };
        self.outbox
            .push(operator::end(&command, id, entry.attempts, Utc::now()));
        if command.action == Action::Flush {
            self.metrics.jobs_expired.inc();
            self.expired(vec![id]);
        }
        self.cache.gauge();
    }

    /// Once the transitions of the commands applied so far are durable, records their results.
    pub(super) async fn record_applied(&mut self) {
        if self.applied.is_empty() {
            return;
        }
        let applied = std::mem::take(&mut self.applied);
        let (reply, barrier) = oneshot::channel();
        if self.writer.send(WriteOp::Barrier(reply)).await.is_err() {
            return;
        }
        let (db, holder, metrics) = (self.db.clone(), self.holder.clone(), self.metrics.clone());
        tokio::spawn(async move {
            if barrier.await.is_err() {
                return;
            }
            for (id, jobs) in applied {
                match db.record_command_result(id, &holder, jobs).await {
                    Ok(()) => {
                        metrics.operator_commands.inc();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, command = id, "recording a command's result failed; a new owner applies it again")
                    }
                }
            }
        });
    }
}
