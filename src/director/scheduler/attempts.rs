//! The verbs of one attempt: picking jobs and committing the start of their attempts (the
//! commit's log row lists them: `pump`), handing durable starts to HTTP slots (`dispatch`),
//! and taking the outcome (`finish`, whose row names the commit that began the attempt):
//! success, discard, or a retry whose wait the backoff policy, the endpoint's `Retry-After`
//! and the job's expiry decide. Outcomes feed the endpoint's breaker.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::delivery::classify::Verdict;
use crate::delivery::{backoff, AttemptResult};
use crate::job::{
    AttemptRecord, AttemptStart, ErrorType, Job, JobId, Recovered, State, Transition,
};

use super::cache::{Entry, Phase};
use super::gates::{Limit, Recorded};
use super::{wait_until, Event, Scheduler, SchedulerLimits};
use crate::director::mailbox::{WriteOp, WriteRejected};

/// How long a job waits before it is tried again when the commit that would begin its attempt
/// was refused by the JobDB (a bug, not a condition that passes by itself): long enough not to loop.
const REFUSED_START_PAUSE: Duration = Duration::from_secs(60);

impl Scheduler {
    /// Starts as many attempts as the limits allow, fairly across lanes and buckets: their
    /// starts go to the writer (listed in its next commit), and delivery begins once that is
    /// durable.
    pub(super) async fn pump(&mut self) {
        let now = Utc::now();
        let mut starts = Vec::new();
        let mut reload = Vec::new();
        // Reads of spilled jobs count against the batch too, so a full cache brings back at most
        // a batch of payloads at a time.
        while self.in_flight < self.limits.max_in_flight
            && starts.len() + reload.len() < self.limits.start_batch
        {
            let (cache, deadlines) = (&mut self.cache, &mut self.queued_by_deadline);
            let picked = self.queues.pick(|(id, ticket)| {
                match cache
                    .get_mut(&id)
                    .filter(|e| e.phase == Phase::Ready && e.ticket == ticket)
                {
                    Some(entry) => {
                        entry.phase = Phase::Unplaced;
                        deadlines.remove(&(entry.deadline, id));
                        true
                    }
                    None => false,
                }
            });
            let Some((id, key, bucket)) = picked else {
                break;
            };
            let max_attempts = self.limits.max_attempts;
            match self.cache.get_mut(&id) {
                Some(entry) if entry.job.expire_at <= now => self.expire(id, now),
                // A discard or flush named it during an attempt that ended in a retry.
                Some(entry) if entry.doomed.is_some() => self.end_doomed(id),
                // Its attempts are used up (imported so, or the limit was lowered): it ends
                // without another request, and its count can never wrap.
                Some(entry) if entry.attempts >= max_attempts => {
                    let attempts = entry.attempts;
                    self.forget(id);
                    self.metrics.jobs_out_of_attempts.inc();
                    self.cache.gauge();
                    self.outbox.push(Transition::discarded(
                        id,
                        attempts,
                        now,
                        AttemptRecord {
                            error_type: Some(ErrorType::MaxAttempts.into()),
                            ..Default::default()
                        },
                    ));
                }
                // Its payload waits in the JobDB (the cache was full): read it back first; it
                // rejoins its queue once loaded.
                Some(entry) if entry.spilled => {
                    entry.phase = Phase::Fetching;
                    reload.push(id);
                    if let Some(lane) = self.queues.lane_mut(&key) {
                        lane.fetch();
                    }
                }
                Some(entry) => {
                    if self.gates.take_token(&key, Instant::now()).is_err() {
                        // Its lane's rate limit has no token now: back exactly where it was,
                        // and the lane waits for the token.
                        entry.phase = Phase::Ready;
                        self.queued_by_deadline.insert((entry.deadline, id));
                        self.queues.unpick(&key, &bucket, (id, entry.ticket));
                    } else {
                        entry.attempts += 1;
                        entry.phase = Phase::Starting;
                        starts.push((id, entry.attempts));
                        self.in_flight += 1;
                        if let Some(lane) = self.queues.lane_mut(&key) {
                            lane.begin();
                        }
                        entry.probe = self.gates.starting(&key);
                    }
                }
                None => {}
            }
            self.relist(&key);
        }
        if !reload.is_empty() {
            self.reload(reload);
        }
        if starts.is_empty() {
            return;
        }
        self.metrics.in_flight.set(self.in_flight as i64);
        let ids: Vec<JobId> = starts.iter().map(|(id, _)| *id).collect();
        let (done, committed) = oneshot::channel();
        // Rows queued before these starts (earlier outcomes) must keep their place.
        let rows = std::mem::take(&mut self.outbox);
        self.flush_rests().await;
        let events = self.events_tx.clone();
        let sent = self
            .writer
            .send(WriteOp::Start { rows, starts, done })
            .await;
        if sent.is_err() {
            let _ = events.send(Event::StartFailed(ids, WriteRejected::LockLost));
            return;
        }
        tokio::spawn(async move {
            let event = match committed.await {
                Ok(Ok(start)) => Event::Started(ids, start),
                Ok(Err(why)) => Event::StartFailed(ids, why),
                Err(_) => Event::StartFailed(ids, WriteRejected::LockLost),
            };
            let _ = events.send(event);
        });
    }

    /// The commit that begins these jobs' attempts is durable: they wait for their lanes'
    /// HTTP slots.
    pub(super) fn started(&mut self, ids: Vec<JobId>, start: AttemptStart) {
        let mut lanes = Vec::new();
        for id in ids {
            let Some(key) = self.lane_of(id) else {
                continue;
            };
            if let Some(entry) = self.cache.get_mut(&id) {
                entry.started = Some(start);
            }
            if let Some(lane) = self.queues.lane_mut(&key) {
                lane.begun(id);
            }
            lanes.push(key);
        }
        self.dispatch_begun(lanes);
    }

    /// Sends what these lanes have begun, as far as their HTTP slots go, and lets each
    /// lane's window adapt to whether all of it went.
    fn dispatch_begun(&mut self, mut lanes: Vec<Arc<str>>) {
        lanes.dedup();
        for key in lanes {
            self.dispatch(&key);
            let concurrency = self.gates.concurrency(&key);
            if let Some(lane) = self.queues.lane_mut(&key) {
                lane.adapt(concurrency, self.limits.start_window);
            }
        }
    }

    /// The commit that would begin these jobs' attempts could not be written: they did not
    /// start.
    pub(super) fn start_failed(&mut self, ids: Vec<JobId>, why: WriteRejected) {
        let refused = matches!(why, WriteRejected::Refused { .. });
        if refused {
            tracing::error!(
                jobs = ids.len(),
                "the jobdb refused attempts' rows; trying these jobs again later"
            );
        } else {
            tracing::warn!(jobs = ids.len(), reason = %why, "could not record attempts; not starting them");
        }
        let later = Instant::now() + REFUSED_START_PAUSE;
        for id in ids {
            let Some(key) = self.lane_of(id) else {
                continue;
            };
            self.in_flight -= 1;
            if let Some(lane) = self.queues.lane_mut(&key) {
                lane.not_begun();
            }
            if let Some(entry) = self.cache.get_mut(&id) {
                entry.attempts = entry.attempts.saturating_sub(1);
                if std::mem::take(&mut entry.probe) {
                    self.gates.probe_abandoned(&key);
                }
            }
            if refused {
                self.wait(id, later);
                self.relist(&key);
            } else {
                self.enqueue(id);
            }
        }
        self.metrics.in_flight.set(self.in_flight as i64);
    }

    fn lane_of(&self, id: JobId) -> Option<Arc<str>> {
        self.cache.get(&id).map(|e| e.lane.clone())
    }

    /// Sends the lane's begun attempts while it has free HTTP slots. A lane that was paused,
    /// or whose breaker opened, since they were picked sends none of them but its probe: the
    /// others are held back (their attempt is withdrawn with a `held-back` row, and they wait
    /// in their queue), so a window of attempts begun ahead never reaches an endpoint judged
    /// down.
    pub(super) fn dispatch(&mut self, key: &Arc<str>) {
        let per_endpoint = self.gates.concurrency(key);
        let hold = self.gates.holds_back(key);
        let mut ready = Vec::new();
        let mut withdrawn = Vec::new();
        let (queues, cache, gates) = (&mut self.queues, &self.cache, &self.gates);
        // A job whose bucket was paused, or whose subscription was disabled, while its start
        // was being written is not sent either: it is set aside.
        let aside = |id: &JobId| {
            cache
                .get(id)
                .is_some_and(|e| gates.aside_key(&e.job).is_some())
        };
        if let Some(lane) = queues.lane_mut(key) {
            if hold {
                while let Some(id) = lane.next_begun() {
                    let probe = cache.get(&id).is_some_and(|e| e.probe);
                    if probe && lane.in_flight() < per_endpoint && !aside(&id) {
                        lane.send();
                        ready.push(id);
                    } else {
                        withdrawn.push(id);
                    }
                }
            } else {
                while lane.in_flight() < per_endpoint {
                    let Some(id) = lane.next_begun() else {
                        break;
                    };
                    if aside(&id) {
                        withdrawn.push(id);
                        continue;
                    }
                    lane.send();
                    ready.push(id);
                }
            }
        }
        // A rate-limited lane sends at its rate: what has no token yet waits, begun, at the
        // head of its lane until one is due.
        let mut sending = 0;
        while sending < ready.len() {
            match self.gates.take_send_token(key, Instant::now()) {
                Ok(()) => sending += 1,
                Err(at) => {
                    self.gates.wake_at(key, at);
                    break;
                }
            }
        }
        if let Some(lane) = self.queues.lane_mut(key) {
            for id in ready.drain(sending..).rev() {
                lane.unsend(id);
            }
        }
        for id in ready {
            self.deliver(id);
        }
        if !withdrawn.is_empty() {
            self.hold_back(withdrawn);
        }
        self.relist(key);
    }

    /// Withdraws begun attempts that will not be sent (see [`Scheduler::dispatch`]): each gets
    /// an `awaiting-retry` row (`held-back`, due now) that keeps its earlier count of attempts
    /// and names no start, since no request went out; its job goes back to the head of its
    /// queue. The row also ends the commit's listing of the attempt.
    fn hold_back(&mut self, ids: Vec<JobId>) {
        let now = Utc::now();
        for id in ids {
            self.in_flight -= 1;
            let Some(entry) = self.cache.get_mut(&id) else {
                continue;
            };
            if std::mem::take(&mut entry.probe) {
                self.gates.probe_abandoned(&entry.lane);
            }
            entry.started = None;
            entry.attempts = entry.attempts.saturating_sub(1);
            let attempts = entry.attempts;
            self.withdraw(id, attempts, now);
            self.enqueue_at(id, true);
        }
        self.metrics.in_flight.set(self.in_flight as i64);
    }

    fn deliver(&mut self, id: JobId) {
        let Some(entry) = self.cache.get_mut(&id) else {
            return;
        };
        entry.phase = Phase::InFlight;
        // The row that ends the attempt says when its request began.
        if let Some(start) = entry.started.as_mut() {
            start.at = Utc::now();
        }
        self.metrics.observe_start();
        let job = entry.job.clone();
        let attempt = entry.attempts;
        let deliverer = self.deliverer.clone();
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let result = deliverer.attempt(&job, attempt).await;
            let _ = events.send(Event::Finished {
                id: job.id,
                result: Box::new(result),
            });
        });
    }

    /// An attempt ended: the job succeeds, is discarded, or waits for its next attempt.
    pub(super) fn finish(&mut self, id: JobId, result: AttemptResult) {
        let Some(key) = self.lane_of(id) else { return };
        self.in_flight -= 1;
        self.metrics.in_flight.set(self.in_flight as i64);
        if let Some(lane) = self.queues.lane_mut(&key) {
            lane.sent();
        }
        // Not sent for want of its subscription (read here since the job was started): no
        // word on the endpoint, and no attempt used.
        let unsent = matches!(
            result.verdict,
            Verdict::Retry {
                error_type: ErrorType::UnknownSubscription,
                ..
            }
        );
        if !unsent {
            self.record_outcome(&key, &result.verdict);
        }
        self.dispatch(&key);
        let Some(entry) = self.cache.get_mut(&id) else {
            return;
        };
        if unsent {
            entry.attempts = entry.attempts.saturating_sub(1);
        }
        let attempt = entry.attempts;
        let mut result = result;
        result.record.started = entry.started.take().filter(|_| !unsent);
        entry.probe = false;
        let now = Utc::now();
        if let Some(d) = result.record.duration {
            self.metrics.observe_attempt(&result.verdict, d);
        }
        let Some(entry) = self.cache.get(&id) else {
            return;
        };
        let ordered = entry.job.seq().map(|seq| (seq, entry.job.clone()));
        let row = match result.verdict {
            Verdict::Succeeded => {
                self.forget(id);
                Transition::succeeded(id, attempt, now, result.record)
            }
            Verdict::Discard { .. } => {
                self.forget(id);
                Transition::discarded(id, attempt, now, result.record)
            }
            Verdict::Retry { .. } if attempt >= self.limits.max_attempts && !unsent => {
                // The last attempt it may make failed: it ends here, with that answer.
                self.forget(id);
                self.metrics.jobs_out_of_attempts.inc();
                let mut record = result.record;
                record.error_type = Some(ErrorType::MaxAttempts.into());
                Transition::discarded(id, attempt, now, record)
            }
            Verdict::Retry { retry_after, .. } => {
                let unit: f64 = rand::rng().random();
                let retry_at = retry_at(&entry.job, attempt, &self.limits, retry_after, now, unit);
                let wait = wait_until(now, retry_at);
                let row = Transition::awaiting_retry(id, attempt, now, retry_at, result.record);
                if wait >= self.limits.spill_after {
                    self.cache.spill(id);
                }
                self.wait(id, Instant::now() + wait);
                if let Some(entry) = self.cache.get_mut(&id) {
                    entry.failed_at = Some(Instant::now());
                }
                row
            }
        };
        self.cache.gauge();
        let ended = matches!(row.state, State::Succeeded | State::Discarded);
        self.outbox.push(row);
        if let (true, Some((seq, job))) = (ended, ordered) {
            self.offer_begin(seq, &key, &job);
        }
        if self.cache.get(&id).is_some_and(|e| e.doomed.is_some()) {
            self.end_doomed(id);
        }
    }

    /// An ordered job of `seq` just ended (its row is queued): when its lane could start an
    /// attempt now, offers the writer to begin the sequence's next job in the commit that
    /// writes the end and releases that job: one commit per job of a key instead of two.
    /// Nothing is held for it (most keys have no next job waiting): the job begun is checked
    /// against the limits when it arrives. Not for a rate-limited lane, whose token would be
    /// taken after the attempt began.
    /// A key's jobs share their bucket and, for an event's jobs, their subscription (its id
    /// is part of the key): what holds `job` back holds its successor.
    fn offer_begin(&mut self, seq: crate::job::Seq, key: &Arc<str>, job: &Job) {
        if self.begin_on_release
            && !self.stopping
            && self.gates.aside_key(job).is_none()
            && !self.gates.is_rate_limited(key)
            && matches!(self.gates.limit(key, Instant::now()), Limit::Open(_))
        {
            self.begins.push(seq);
        }
    }

    /// Tells the writer of the sequences offered since the last time, after the rows they
    /// follow.
    pub(super) async fn send_begins(&mut self) {
        if self.begins.is_empty() {
            return;
        }
        let seqs = std::mem::take(&mut self.begins);
        if self.writer.send(WriteOp::Begin { seqs }).await.is_err() {
            tracing::debug!("writer gone; offers to begin on release dropped");
        }
    }

    /// Ordered jobs whose attempts the commit that released them began: they wait for their
    /// lane's HTTP slots as any begun attempt. One that may not go after all (the scheduler
    /// is at its limit of attempts or stopping, the job expired, is out of attempts, was
    /// changed by an operator command, is cached already, or finds no room in the cache)
    /// does not: unless a command wrote its row, a `held-back` row ends its listing, and it
    /// goes on as a released job.
    pub(super) fn begun_on_release(&mut self, jobs: Vec<Recovered>, start: AttemptStart) {
        let now = Utc::now();
        let mut lanes = Vec::new();
        let mut handed = Vec::new();
        for r in jobs {
            let id = r.job.id;
            let entry = Entry::new(r.job.clone(), r.attempts);
            let key = entry.lane.clone();
            let planned = self.planned_in_db.contains_key(&id);
            let present = self.cache.contains(&id);
            let may_go = !planned
                && !present
                && !self.stopping
                && self.in_flight < self.limits.max_in_flight
                && r.attempts < self.limits.max_attempts
                && r.job.expire_at > now;
            if may_go && self.admit(entry) {
                if let Some(entry) = self.cache.get_mut(&id).filter(|e| !e.spilled) {
                    entry.attempts += 1;
                    entry.phase = Phase::Starting;
                    entry.started = Some(start);
                    entry.probe = self.gates.starting(&key);
                    self.in_flight += 1;
                    self.queues.lane_or_new(&key).begun_before(id);
                    lanes.push(key);
                    continue;
                }
                // Cached without its payload (over the byte budget): it is read back first.
                self.withdraw(id, r.attempts, now);
                self.enqueue(id);
                continue;
            }
            if !planned && !present {
                self.withdraw(id, r.attempts, now);
            }
            if !present && !self.cache.contains(&id) {
                handed.push(r);
            }
        }
        self.metrics.in_flight.set(self.in_flight as i64);
        let handed = self.after_commands(handed);
        self.recover(handed);
        self.dispatch_begun(lanes);
    }

    /// Ends the listing of an attempt begun and not sent (held back, or begun on release and
    /// unable to go): an `awaiting-retry` row (`held-back`, due now) keeping the earlier
    /// count and naming no start.
    fn withdraw(&mut self, id: JobId, attempts: u16, now: DateTime<Utc>) {
        self.outbox.push(Transition::awaiting_retry(
            id,
            attempts,
            now,
            now,
            AttemptRecord {
                error_type: Some(ErrorType::HeldBack.into()),
                ..Default::default()
            },
        ));
        self.metrics.attempts_held_back.inc();
    }

    /// Feeds an attempt's outcome to its endpoint's breaker. The endpoint cannot take the
    /// request when it did not answer, answered a server error, or asked us to slow down
    /// (429/425: other jobs of the same endpoint would be told the same); a 4xx or a success
    /// means it is up.
    fn record_outcome(&mut self, key: &Arc<str>, verdict: &Verdict) {
        let (ok, retry_after) = match verdict {
            Verdict::Retry { retry_after, .. } => (false, *retry_after),
            _ => (true, None),
        };
        if ok {
            self.probe_succeeded(key);
        }
        match self.gates.record(key, ok, retry_after, Instant::now()) {
            Recorded::Opened => {
                tracing::warn!(endpoint = %key, "endpoint failing: circuit breaker open, probing");
                // Probes come from the head of the queue. Jobs tried before go first, like
                // those queued while the breaker is open: a first attempt may fail for the
                // job's own sake, and each failed probe doubles the wait for the next.
                let cache = &self.cache;
                self.queues.bring_forward(key, |(id, ticket)| {
                    cache.get(&id).is_some_and(|e| {
                        e.phase == Phase::Ready && e.ticket == ticket && e.attempts > 0
                    })
                });
                self.metrics.breaker_opened.inc();
                self.metrics.breakers_open.inc();
            }
            Recorded::Closed(opened_at) => {
                self.metrics.breakers_open.dec();
                let expedited = opened_at.map_or(0, |at| self.expedite_lane(key, at));
                tracing::info!(endpoint = %key, expedited, "endpoint answering again: circuit breaker closed; its waiting retries are due now");
            }
            Recorded::Nothing => {}
        }
    }

    /// An endpoint came back: the retries its outage made wait (attempts that failed from a
    /// minute before the breaker opened; backoffs that grew during the outage, mostly of the
    /// probes) become due now, each with an `awaiting-retry` row saying so. Jobs an operator
    /// postponed are left alone. Rare (once per outage), so a walk over the cache is fine.
    fn expedite_lane(&mut self, key: &Arc<str>, opened: Instant) -> usize {
        let now = Utc::now();
        let since = opened
            .checked_sub(Duration::from_secs(60))
            .unwrap_or(opened);
        let waiting: Vec<(JobId, u16)> = self
            .cache
            .iter()
            .filter(|(_, e)| {
                e.lane == *key
                    && matches!(e.phase, Phase::Waiting { .. })
                    && e.failed_at.is_some_and(|t| t >= since)
            })
            .map(|(id, e)| (*id, e.attempts))
            .collect();
        for (id, attempts) in &waiting {
            self.outbox.push(Transition::awaiting_retry(
                *id,
                *attempts,
                now,
                now,
                AttemptRecord {
                    error_type: Some(ErrorType::EndpointRecovered.into()),
                    ..Default::default()
                },
            ));
            self.wait(*id, Instant::now());
        }
        waiting.len()
    }
}

/// When a job's next attempt is due after attempt `attempt` failed: its backoff policy
/// (`unit` the jitter draw in `0..1`), floored and capped by the limits, no sooner than the
/// endpoint's `Retry-After`, and never past the job's expiry (it is archived then), whatever
/// was asked. Checked arithmetic throughout: the inputs come from outside.
fn retry_at(
    job: &Job,
    attempt: u16,
    limits: &SchedulerLimits,
    retry_after: Option<Duration>,
    now: DateTime<Utc>,
    unit: f64,
) -> DateTime<Utc> {
    let delay = backoff::next_delay(
        &job.retry,
        attempt,
        limits.backoff_cap,
        limits.min_retry_delay,
        retry_after,
        unit,
    );
    chrono::Duration::from_std(delay)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .map_or(job.expire_at, |at| at.min(job.expire_at))
}
