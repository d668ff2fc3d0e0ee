//! A batch: the requests the writer takes together into one transaction, their rows side by
//! side in id order, and who hears about each request's outcome. Splitting a batch (to find
//! the request the JobDB refuses), leaving requests out (lapsed, or not written) and dropping
//! jobs an earlier try stored all keep each request's items with it.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

use crate::director::mailbox::{Accepted, Repeats, Ticket, WriteRejected};
use crate::director::ordering::plan::{Arrival, Leaving};
use crate::job::{AttemptStart, EventRecord, Job, JobId, Recovered, Seq, State, Transition};
use crate::jobdb::lifecycle::Origin;
use crate::jobdb::{blocks_sequence, job_row_bytes, BlockedKey, Fresh, OpenRow};

pub(super) type Ack = oneshot::Sender<Result<(), WriteRejected>>;

/// Requests taken together into one transaction: their rows side by side in id order, and
/// for each request, where its rows end and who hears about it.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) jobs: Vec<Arc<Job>>,
    /// Events kept without a job (published when no subscription matched them).
    pub(super) events: Vec<EventRecord>,
    pub(super) rows: Vec<(u64, Transition)>,
    pub(super) origins: Vec<Origin>,
    /// Submitted jobs (imports rest at once), with what their first entry takes from them.
    pub(super) accepted: Vec<(JobId, Fresh)>,
    /// Attempts begun.
    pub(super) starts: Vec<(JobId, u16)>,
    /// Jobs that rest on request.
    pub(super) rests: Vec<OpenRow>,
    /// Ordered jobs to release.
    pub(super) release: Vec<(Seq, JobId)>,
    pub(super) requests: Vec<Request>,
    pub(super) bytes: usize,
}

/// Where a request's items end in each of the batch's lists (exclusive), from the previous
/// request's ends.
#[derive(Clone, Copy, Default)]
pub(super) struct Ends {
    pub(super) jobs: usize,
    pub(super) events: usize,
    pub(super) rows: usize,
    pub(super) origins: usize,
    pub(super) accepted: usize,
    pub(super) starts: usize,
    pub(super) rests: usize,
    pub(super) release: usize,
}

impl std::ops::Sub for Ends {
    type Output = Ends;

    fn sub(self, o: Ends) -> Ends {
        Ends {
            jobs: self.jobs - o.jobs,
            events: self.events - o.events,
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
pub(super) struct Request {
    pub(super) ends: Ends,
    pub(super) reply: Reply,
    /// A producer's request: claimed when it was taken; abandoned if its handler stopped
    /// waiting since.
    pub(super) ticket: Option<Ticket>,
    /// A router's forward: never committed after this.
    pub(super) not_after: Option<DateTime<Utc>>,
}

impl Request {
    /// Whether no try may write it any more: its handler stopped waiting (and answered 504),
    /// or its `not_after` has passed.
    pub(super) fn lapsed(&self, now: DateTime<Utc>) -> bool {
        self.ticket.as_ref().is_some_and(Ticket::abandoned)
            || self.not_after.is_some_and(|t| now > t)
    }
}

/// Who hears about a request's outcome.
pub(super) enum Reply {
    /// A submission: its reply, which of its jobs may be stored already, how many of its
    /// jobs an earlier request had stored already, and which of its jobs wait for a later
    /// first attempt.
    Submit(
        oneshot::Sender<Result<Accepted, WriteRejected>>,
        Repeats,
        usize,
        crate::job::Scheduled,
    ),
    /// An import: its reply, its jobs, and the keys blocked where they come from (written
    /// with them).
    Import(Ack, Vec<Recovered>, Vec<BlockedKey>),
    Transitions(Option<Ack>),
    Start(oneshot::Sender<Result<AttemptStart, WriteRejected>>),
    Rest(Option<Ack>),
    /// Sequences whose next job may begin its attempt in the commit that releases it.
    Begin(Vec<Seq>),
    /// A release: its heads are the batch's `release` items; these held jobs past their
    /// expiry are released to be ended.
    Release(Vec<JobId>),
    Barrier(oneshot::Sender<u64>, u64),
}

impl Reply {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Reply::Submit(..) => "submit",
            Reply::Import(..) => "import",
            Reply::Transitions(_) => "transitions",
            Reply::Start(_) => "start",
            Reply::Rest(_) => "rest",
            Reply::Begin(..) => "begin",
            Reply::Release(_) => "release",
            Reply::Barrier(..) => "barrier",
        }
    }

    /// A producer's request (a submission or an import): refused at once when the JobDB is
    /// unavailable, since the producer may send it again.
    pub(super) fn is_producers(&self) -> bool {
        matches!(self, Reply::Submit(..) | Reply::Import(..))
    }

    pub(super) fn reject(self, why: WriteRejected) {
        match self {
            Reply::Submit(reply, ..) => {
                let _ = reply.send(Err(why));
            }
            Reply::Import(reply, ..)
            | Reply::Transitions(Some(reply))
            | Reply::Rest(Some(reply)) => {
                let _ = reply.send(Err(why));
            }
            Reply::Start(reply) => {
                let _ = reply.send(Err(why));
            }
            // An offer: what it does not begin goes on as any released job.
            Reply::Transitions(None) | Reply::Rest(None) | Reply::Release(_) | Reply::Begin(_) => {}
            // A barrier has nothing to refuse; its waiter learns from its channel closing.
            Reply::Barrier(..) => {}
        }
    }
}

impl Batch {
    pub(super) fn ends(&self) -> Ends {
        Ends {
            jobs: self.jobs.len(),
            events: self.events.len(),
            rows: self.rows.len(),
            origins: self.origins.len(),
            accepted: self.accepted.len(),
            starts: self.starts.len(),
            rests: self.rests.len(),
            release: self.release.len(),
        }
    }

    /// Closes the request whose items were just pushed.
    pub(super) fn seal(&mut self, reply: Reply) {
        self.seal_producers(reply, None, None);
    }

    /// Closes a producer's request whose items were just pushed, with its ticket and deadline.
    pub(super) fn seal_producers(
        &mut self,
        reply: Reply,
        ticket: Option<Ticket>,
        not_after: Option<DateTime<Utc>>,
    ) {
        let ends = self.ends();
        self.requests.push(Request {
            ends,
            reply,
            ticket,
            not_after,
        });
    }

    /// The earliest `not_after` of its requests.
    pub(super) fn not_after(&self) -> Option<DateTime<Utc>> {
        self.requests.iter().filter_map(|r| r.not_after).min()
    }

    /// Where request `at` begins.
    pub(super) fn start_of(&self, at: usize) -> Ends {
        at.checked_sub(1)
            .map_or_else(Ends::default, |prev| self.requests[prev].ends)
    }

    /// The requests from index `at` on, as a batch of their own (their items move with them).
    pub(super) fn split_off(&mut self, at: usize) -> Batch {
        let start = self.start_of(at);
        let mut requests = self.requests.split_off(at);
        for r in &mut requests {
            r.ends = r.ends - start;
        }
        Batch {
            jobs: self.jobs.split_off(start.jobs),
            events: self.events.split_off(start.events),
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
    pub(super) fn retain(&mut self, keep: impl Fn(&Request) -> bool) -> Vec<(Request, usize)> {
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
        let mut events = old.events.into_iter();
        let mut at = Ends::default();
        let mut dropped = Vec::new();
        for request in old.requests {
            let n = request.ends - at;
            at = request.ends;
            if keep(&request) {
                self.jobs.extend(jobs.by_ref().take(n.jobs));
                self.events.extend(events.by_ref().take(n.events));
                self.rows.extend(rows.by_ref().take(n.rows));
                self.origins.extend(origins.by_ref().take(n.origins));
                self.accepted.extend(accepted.by_ref().take(n.accepted));
                self.starts.extend(starts.by_ref().take(n.starts));
                self.rests.extend(rests.by_ref().take(n.rests));
                self.release.extend(release.by_ref().take(n.release));
                self.seal_producers(request.reply, request.ticket, request.not_after);
            } else {
                jobs.by_ref().take(n.jobs).for_each(drop);
                events.by_ref().take(n.events).for_each(drop);
                rows.by_ref().take(n.rows).for_each(drop);
                origins.by_ref().take(n.origins).for_each(drop);
                accepted.by_ref().take(n.accepted).for_each(drop);
                starts.by_ref().take(n.starts).for_each(drop);
                rests.by_ref().take(n.rests).for_each(drop);
                release.by_ref().take(n.release).for_each(drop);
                dropped.push((request, n.jobs));
            }
        }
        dropped
    }

    /// Indexes of the requests that write something.
    pub(super) fn writing(&self) -> Vec<usize> {
        let mut start = Ends::default();
        let mut out = Vec::new();
        for (i, r) in self.requests.iter().enumerate() {
            let n = r.ends - start;
            if n.jobs + n.events + n.rows + n.starts + n.rests + n.release > 0 {
                out.push(i);
            }
            start = r.ends;
        }
        out
    }

    /// The jobs of the submissions that may repeat an earlier request's as `repeats` says.
    pub(super) fn repeating(&self, repeats: Repeats) -> Vec<Arc<Job>> {
        let mut start = Ends::default();
        let mut jobs = Vec::new();
        for r in &self.requests {
            if matches!(r.reply, Reply::Submit(_, of, ..) if of == repeats) {
                jobs.extend(self.jobs[start.jobs..r.ends.jobs].iter().cloned());
            }
            start = r.ends;
        }
        jobs
    }

    /// Drops the jobs in `present` from the submissions that may repeat an earlier request's,
    /// counting them on each request; returns how many were dropped.
    pub(super) fn skip_present(&mut self, present: &HashSet<JobId>) -> usize {
        let old = std::mem::take(self);
        let (mut jobs, mut accepted) = (old.jobs.into_iter(), old.accepted.into_iter());
        let (mut rows, mut origins) = (old.rows.into_iter(), old.origins.into_iter());
        let (mut starts, mut rests) = (old.starts.into_iter(), old.rests.into_iter());
        let mut release = old.release.into_iter();
        let mut events = old.events.into_iter();
        let mut at = Ends::default();
        let mut skipped = 0;
        for request in old.requests {
            let n = request.ends - at;
            at = request.ends;
            let repeating =
                matches!(request.reply, Reply::Submit(_, r, ..) if r != Repeats::Impossible);
            let (ticket, not_after) = (request.ticket, request.not_after);
            let reply = match request.reply {
                Reply::Submit(reply, repeats, count, scheduled) if repeating => {
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
                    // A submission's rows are its scheduled jobs' rows.
                    let taken = rows.by_ref().take(n.rows);
                    self.rows.extend(taken.filter(|(_, t)| absent(&t.job_id)));
                    skipped += dropped;
                    Reply::Submit(reply, repeats, count + dropped, scheduled)
                }
                other => {
                    self.jobs.extend(jobs.by_ref().take(n.jobs));
                    self.accepted.extend(accepted.by_ref().take(n.accepted));
                    self.rows.extend(rows.by_ref().take(n.rows));
                    other
                }
            };
            // A kept event stored already is not written twice (its row's insert ignores a
            // repeat).
            self.events.extend(events.by_ref().take(n.events));
            self.origins.extend(origins.by_ref().take(n.origins));
            self.starts.extend(starts.by_ref().take(n.starts));
            // A submission's rests are its ordered jobs' entries: one stored already keeps its
            // own (it may have moved on since).
            let taken = rests.by_ref().take(n.rests);
            self.rests
                .extend(taken.filter(|r| !repeating || !present.contains(&r.job_id)));
            self.release.extend(release.by_ref().take(n.release));
            self.seal_producers(reply, ticket, not_after);
        }
        skipped
    }

    /// Its new ordered jobs, in order: submissions (fresh when due now, without a
    /// `deliver_at`) and imports (with the attempts they made elsewhere).
    pub(super) fn arrivals(&self) -> Vec<Arrival> {
        let mut arrivals = Vec::new();
        let mut start = Ends::default();
        for r in &self.requests {
            let jobs = &self.jobs[start.jobs..r.ends.jobs];
            start = r.ends;
            match &r.reply {
                Reply::Submit(_, _, _, scheduled) => {
                    let times: std::collections::HashMap<JobId, DateTime<Utc>> =
                        scheduled.iter().copied().collect();
                    for job in jobs.iter().filter(|j| j.ordering.is_some()) {
                        let at = times.get(&job.id).copied();
                        arrivals.push(Arrival {
                            job: job.clone(),
                            attempts: 0,
                            retry_at: at,
                            fresh: at.is_none(),
                        });
                    }
                }
                Reply::Import(_, imported, _) => {
                    for r in imported.iter().filter(|r| r.job.ordering.is_some()) {
                        arrivals.push(Arrival {
                            job: r.job.clone(),
                            attempts: r.attempts,
                            retry_at: r.retry_at,
                            fresh: false,
                        });
                    }
                }
                _ => {}
            }
        }
        arrivals
    }

    /// The jobs its rows end or take out of their sequences (`archiving`), each once, with
    /// the row that does it.
    pub(super) fn leaving(&self) -> Vec<(Leaving, &Transition)> {
        let mut last: std::collections::HashMap<JobId, &Transition> =
            std::collections::HashMap::new();
        for (_, t) in &self.rows {
            if t.state != State::Executing {
                last.insert(t.job_id, t);
            }
        }
        last.into_values()
            .filter(|t| t.state.is_terminal() || t.state == State::Archiving)
            .map(|t| {
                let leaving = Leaving {
                    job: t.job_id,
                    ends_badly: blocks_sequence(t),
                };
                (leaving, t)
            })
            .collect()
    }

    /// Whether the batch writes nothing.
    pub(super) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.events.is_empty()
            && self.rows.is_empty()
            && self.starts.is_empty()
            && self.rests.is_empty()
            && self.release.is_empty()
            && self.expired_releases().is_empty()
            && self.blocks().is_empty()
    }

    /// The held jobs past their expiry its releases name.
    pub(super) fn expired_releases(&self) -> Vec<JobId> {
        self.requests
            .iter()
            .flat_map(|r| match &r.reply {
                Reply::Release(expired) => expired.as_slice(),
                _ => &[],
            })
            .copied()
            .collect()
    }

    /// The sequences whose released head may begin its attempt in this commit.
    pub(super) fn begins(&self) -> HashSet<Seq> {
        self.requests
            .iter()
            .flat_map(|r| match &r.reply {
                Reply::Begin(seqs) => seqs.as_slice(),
                _ => &[],
            })
            .copied()
            .collect()
    }

    /// The keys its imports carry blocked.
    pub(super) fn blocks(&self) -> Vec<BlockedKey> {
        self.requests
            .iter()
            .flat_map(|r| match &r.reply {
                Reply::Import(_, _, blocks) => blocks.as_slice(),
                _ => &[],
            })
            .cloned()
            .collect()
    }
}
