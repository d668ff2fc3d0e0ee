//! Operator commands as a plan: from a command, the cached jobs it names and the waiting jobs
//! the JobDB holds for it, the transitions to append and what becomes of each cached job.
//! Pure: no clock but the one given, no I/O; the scheduler carries the plan out.
//!
//! Jobs mid-attempt are left to their attempt, except that a discard or flush still applies
//! if the attempt ends in a retry (the job is *doomed*).

use chrono::{DateTime, Utc};

use crate::job::{AttemptRecord, JobId, Progress, State, Transition};
use crate::jobdb::commands::{Action, Command};

/// Where a cached job named by a command stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Standing {
    /// Waiting for a retry (or set aside behind a paused bucket).
    Waiting,
    /// In its lane's queue.
    Ready,
    /// An attempt is under way (or its payload is being read back).
    Busy,
}

/// A cached job a command names.
#[derive(Clone, Copy, Debug)]
pub(super) struct Named {
    pub(super) id: JobId,
    pub(super) attempts: u16,
    pub(super) expire_at: DateTime<Utc>,
    pub(super) standing: Standing,
    /// When a waiting job's next attempt is due (`None`: now).
    pub(super) due: Option<DateTime<Utc>>,
}

/// What becomes of a cached job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// It waits until `until` (now for an expedite). `postponed`: an operator's wait, not
    /// its own failure's.
    Wait {
        id: JobId,
        until: DateTime<Utc>,
        postponed: bool,
    },
    /// It leaves the cache (its ending row is in the plan).
    End(JobId),
    /// Its attempt decides: a retry ends it as the command says.
    Doom(JobId),
}

/// A command's effect.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Rows to append, in order.
    pub(super) rows: Vec<Transition>,
    /// What becomes of the cached jobs named.
    pub(super) steps: Vec<Step>,
    /// Jobs flushed: the archive takes them.
    pub(super) flushed: Vec<JobId>,
    /// Jobs only in the JobDB the command changed, with their new due time (`None`: ended).
    pub(super) in_db: Vec<(JobId, Option<DateTime<Utc>>)>,
    /// Rows changed the due times of jobs only in the JobDB: a backlog pass must look again.
    pub(super) due_now: bool,
    /// Jobs the command changed (its result).
    pub(super) changed: u64,
}

/// Plans `command` over the cached jobs it names and the JobDB's `targets`, skipping targets
/// for which `skip` holds (cached, or gone since the read began: not the JobDB's to change).
pub(super) fn plan(
    command: &Command,
    named: &[Named],
    targets: Vec<(JobId, Progress)>,
    skip: impl Fn(JobId) -> bool,
    now: DateTime<Utc>,
) -> Plan {
    let mut plan = Plan::default();
    for job in named {
        let id = job.id;
        let waiting = job.standing == Standing::Waiting;
        if job.standing == Standing::Busy {
            if matches!(command.action, Action::Discard | Action::Flush) {
                plan.steps.push(Step::Doom(id));
            }
            continue;
        }
        match command.action {
            Action::Expedite if waiting => {
                plan.rows.push(retry(id, job.attempts, now, now, command));
                plan.steps.push(Step::Wait {
                    id,
                    until: now,
                    postponed: false,
                });
            }
            Action::Expedite => continue,
            Action::Postpone => {
                let until = command.postpone_until.unwrap_or(now);
                // "Due later", never sooner: a job due after `until` keeps its time.
                if job.due.is_some_and(|due| due >= until) {
                    continue;
                }
                plan.rows.push(retry(id, job.attempts, now, until, command));
                plan.steps.push(Step::Wait {
                    id,
                    until: until.min(job.expire_at),
                    postponed: true,
                });
            }
            Action::Flush | Action::Discard => {
                plan.steps.push(Step::End(id));
                plan.rows.push(end(command, id, job.attempts, now));
                if command.action == Action::Flush {
                    plan.flushed.push(id);
                }
            }
        }
        plan.changed += 1;
    }
    for (id, progress) in targets {
        if skip(id) {
            continue;
        }
        let (row, due) = match command.action {
            // Due now: a backlog pass reads it in.
            Action::Expedite if progress.state == State::AwaitingRetry => {
                (retry(id, progress.attempts, now, now, command), Some(now))
            }
            Action::Expedite => continue,
            Action::Postpone => {
                let until = command.postpone_until.unwrap_or(now);
                if progress.retry_at.is_some_and(|due| due >= until) {
                    continue;
                }
                (
                    retry(id, progress.attempts, now, until, command),
                    Some(until),
                )
            }
            Action::Flush => {
                plan.flushed.push(id);
                (end(command, id, progress.attempts, now), None)
            }
            Action::Discard => (end(command, id, progress.attempts, now), None),
        };
        plan.rows.push(row);
        plan.in_db.push((id, due));
        plan.changed += 1;
        // Its due time changed (a postpone may bring it closer), and its new row may be newer
        // than a pass in progress can see: a pass after this one plans from the new times.
        plan.due_now = true;
    }
    plan
}

/// What an operator command writes into the transitions it causes.
fn record(command: &Command) -> AttemptRecord {
    AttemptRecord {
        error_type: Some(command.action.error_kind().into()),
        error_response: Some(bytes::Bytes::from(command.note())),
        ..Default::default()
    }
}

/// A waiting job rescheduled by a command (expedite, postpone).
fn retry(
    id: JobId,
    attempts: u16,
    now: DateTime<Utc>,
    retry_at: DateTime<Utc>,
    command: &Command,
) -> Transition {
    Transition::awaiting_retry(id, attempts, now, retry_at, record(command))
}

/// A job ended by a command: `archiving` for a flush, `discarded` for a discard.
pub(super) fn end(command: &Command, id: JobId, attempts: u16, now: DateTime<Utc>) -> Transition {
    let record = record(command);
    match command.action {
        Action::Flush => {
            let mut row = Transition::archiving(id, attempts, now);
            row.error_type = record.error_type;
            row.error_response_encoding = Some("utf-8");
            row.error_response = record.error_response;
            row
        }
        _ => Transition::discarded(id, attempts, now, record),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> JobId {
        JobId(ulid::Ulid::from(n))
    }

    fn command(action: Action) -> Command {
        Command {
            id: 1,
            issued_by: "ops".into(),
            action,
            bucket: None,
            endpoint_prefix: None,
            job_id: None,
            created_before: None,
            idempotency_key_prefix: None,
            postpone_until: None,
            reason: Some("test".into()),
        }
    }

    fn named(n: u128, standing: Standing, expire_at: DateTime<Utc>) -> Named {
        Named {
            id: id(n),
            attempts: 2,
            expire_at,
            standing,
            due: None,
        }
    }

    fn waiting_progress(attempts: u16) -> Progress {
        Progress {
            state: State::AwaitingRetry,
            attempts,
            retry_at: None,
            started: None,
        }
    }

    #[test]
    fn expedite_moves_waiting_jobs_only() {
        let now = Utc::now();
        let later = now + chrono::Duration::hours(1);
        let cached = [
            named(1, Standing::Waiting, later),
            named(2, Standing::Ready, later),
            named(3, Standing::Busy, later),
        ];
        let targets = vec![
            (id(10), waiting_progress(1)),
            (
                id(11),
                Progress {
                    state: State::AwaitingScheduling,
                    attempts: 0,
                    retry_at: None,
                    started: None,
                },
            ),
        ];
        let plan = plan(&command(Action::Expedite), &cached, targets, |_| false, now);
        assert_eq!(plan.in_db, [(id(10), Some(now))], "due now, not ended");
        assert_eq!(
            plan.steps,
            [Step::Wait {
                id: id(1),
                until: now,
                postponed: false
            }]
        );
        let rows: Vec<(JobId, State)> = plan.rows.iter().map(|t| (t.job_id, t.state)).collect();
        assert_eq!(
            rows,
            [
                (id(1), State::AwaitingRetry),
                (id(10), State::AwaitingRetry)
            ]
        );
        assert!(plan.rows.iter().all(|t| t.retry_at == Some(now)));
        assert_eq!(plan.changed, 2);
        assert!(plan.due_now);
    }

    #[test]
    fn postpone_never_waits_past_expiry() {
        let now = Utc::now();
        let expire_at = now + chrono::Duration::minutes(5);
        let mut cmd = command(Action::Postpone);
        cmd.postpone_until = Some(now + chrono::Duration::hours(2));
        let plan = plan(
            &cmd,
            &[named(1, Standing::Ready, expire_at)],
            vec![],
            |_| false,
            now,
        );
        assert_eq!(
            plan.steps,
            [Step::Wait {
                id: id(1),
                until: expire_at,
                postponed: true
            }]
        );
        // The row says what the operator asked for.
        assert_eq!(plan.rows[0].retry_at, cmd.postpone_until);
        assert!(!plan.due_now);
    }

    /// Found by the history checker: a job scheduled 4 s ahead, postponed "until 1 s from
    /// now", was sent at 1 s. A postpone makes a job due later, never sooner.
    #[test]
    fn postpone_never_brings_a_job_forward() {
        let now = Utc::now();
        let later = now + chrono::Duration::hours(1);
        let mut cmd = command(Action::Postpone);
        cmd.postpone_until = Some(now + chrono::Duration::seconds(1));
        let waits_longer = Named {
            due: Some(now + chrono::Duration::seconds(4)),
            ..named(1, Standing::Waiting, later)
        };
        let waits_less = Named {
            due: Some(now + chrono::Duration::milliseconds(500)),
            ..named(2, Standing::Waiting, later)
        };
        let stored_later = Progress {
            retry_at: Some(now + chrono::Duration::seconds(4)),
            ..waiting_progress(0)
        };
        let stored_sooner = Progress {
            retry_at: Some(now),
            ..waiting_progress(0)
        };
        let plan = plan(
            &cmd,
            &[waits_longer, waits_less],
            vec![(id(3), stored_later), (id(4), stored_sooner)],
            |_| false,
            now,
        );
        let moved: Vec<JobId> = plan.rows.iter().map(|t| t.job_id).collect();
        assert_eq!(moved, [id(2), id(4)]);
        assert_eq!(plan.changed, 2);
        assert!(plan.rows.iter().all(|t| t.retry_at == cmd.postpone_until));
    }

    #[test]
    fn discard_ends_idle_jobs_and_dooms_busy_ones() {
        let now = Utc::now();
        let later = now + chrono::Duration::hours(1);
        let cached = [
            named(1, Standing::Waiting, later),
            named(2, Standing::Busy, later),
        ];
        let plan = plan(
            &command(Action::Discard),
            &cached,
            vec![(id(3), waiting_progress(4))],
            |_| false,
            now,
        );
        assert_eq!(plan.steps, [Step::End(id(1)), Step::Doom(id(2))]);
        assert!(plan.rows.iter().all(|t| t.state == State::Discarded));
        assert_eq!(plan.rows[0].error_type.as_deref(), Some("operator-discard"));
        assert_eq!(plan.rows[1].attempts, 4);
        assert!(plan.flushed.is_empty());
        assert_eq!(plan.changed, 2);
        // The job only in the JobDB is reported ended: a release read before the command
        // must not hand it to the scheduler afterwards.
        assert_eq!(plan.in_db, [(id(3), None)]);
    }

    #[test]
    fn flush_archives_and_reports_what_it_flushed() {
        let now = Utc::now();
        let later = now + chrono::Duration::hours(1);
        let plan = plan(
            &command(Action::Flush),
            &[named(1, Standing::Ready, later)],
            vec![(id(2), waiting_progress(1)), (id(3), waiting_progress(1))],
            |job| job == id(3),
            now,
        );
        assert_eq!(plan.flushed, [id(1), id(2)]);
        assert_eq!(
            plan.in_db,
            [(id(2), None)],
            "only the JobDB's own target, ended"
        );
        assert!(plan.rows.iter().all(|t| t.state == State::Archiving));
        assert!(plan.rows[0]
            .error_response
            .as_ref()
            .is_some_and(|note| !note.is_empty()));
        assert_eq!(plan.changed, 2);
    }
}
