//! Operator commands: rows operators append with plain SQL (`operator_commands`), which the
//! owning Director reads, applies to the matching jobs, and answers in
//! `operator_command_results`. Nothing is updated: the command, the transitions it caused
//! (whose `error_response` names it) and its result are all appended.

use std::str::FromStr;

use chrono::{DateTime, Utc};

use super::{with_pool, JobDb, JobDbError};
use crate::job::{ErrorType, Job, JobId, Progress};

/// What a command does to the jobs it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Waiting retries become due now.
    Expedite,
    /// Waiting jobs (first attempts included) wait until `postpone_until`.
    Postpone,
    /// Waiting jobs go to the archive now, as if expired.
    Flush,
    /// Waiting jobs end `discarded`.
    Discard,
}

impl Action {
    /// The `error_type` of the transitions the action appends.
    pub const fn error_kind(self) -> ErrorType {
        match self {
            Action::Expedite => ErrorType::OperatorExpedite,
            Action::Postpone => ErrorType::OperatorPostpone,
            Action::Flush => ErrorType::OperatorFlush,
            Action::Discard => ErrorType::OperatorDiscard,
        }
    }
}

impl FromStr for Action {
    type Err = JobDbError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "expedite" => Ok(Action::Expedite),
            "postpone" => Ok(Action::Postpone),
            "flush" => Ok(Action::Flush),
            "discard" => Ok(Action::Discard),
            other => Err(JobDbError::Corrupt(format!(
                "unknown command action {other:?}"
            ))),
        }
    }
}

/// One operator command, as appended to `operator_commands`.
#[derive(Clone, Debug, PartialEq)]
pub struct Command {
    /// Its id (commands apply in id order).
    pub id: u64,
    /// Who issued it.
    pub issued_by: String,
    /// What it does.
    pub action: Action,
    /// Only jobs of this bucket.
    pub bucket: Option<String>,
    /// Only jobs whose endpoint starts with this.
    pub endpoint_prefix: Option<String>,
    /// Only this job.
    pub job_id: Option<JobId>,
    /// Only jobs created before this instant.
    pub created_before: Option<DateTime<Utc>>,
    /// Only jobs whose idempotency key starts with this (a job without one is not named).
    pub idempotency_key_prefix: Option<String>,
    /// For `postpone`: when the jobs become due.
    pub postpone_until: Option<DateTime<Utc>>,
    /// Why, in the operator's words.
    pub reason: Option<String>,
}

impl Command {
    /// Whether the command names this job (the same conditions as [`JobDb::command_targets`]).
    pub fn matches(&self, job: &Job) -> bool {
        self.bucket.as_deref().is_none_or(|b| *job.bucket == *b)
            && self
                .endpoint_prefix
                .as_deref()
                .is_none_or(|p| job.endpoint.starts_with(p))
            && self.job_id.is_none_or(|id| job.id == id)
            && self.created_before.is_none_or(|t| job.created_at < t)
            && self.idempotency_key_prefix.as_deref().is_none_or(|p| {
                job.idempotency_key
                    .as_deref()
                    .is_some_and(|k| k.starts_with(p))
            })
    }

    /// The text recorded in each transition the command causes: which command, and who.
    pub fn note(&self) -> String {
        match &self.reason {
            Some(reason) => format!("command {} by {}: {reason}", self.id, self.issued_by),
            None => format!("command {} by {}", self.id, self.issued_by),
        }
    }
}

impl JobDb {
    /// Commands with ids above `after`, oldest first.
    pub async fn commands_after(&self, after: u64) -> Result<Vec<Command>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT id, issued_by, action, bucket, endpoint_prefix, job_id, created_before, \
                 idempotency_key_prefix, postpone_until, reason FROM operator_commands \
                 WHERE id > ? ORDER BY id LIMIT 100",
            )
            .bind(super::int(after))
            .fetch_all(p)
            .await?
            .iter()
            .map(q::command_from_row)
            .collect()
        })
    }

    /// Commands without a recorded result, oldest first (at most 100): what the owner must
    /// still apply. Read by what is missing, not by id order, so a command whose id was
    /// assigned before another's but committed after it is never skipped.
    pub async fn unapplied_commands(&self) -> Result<Vec<Command>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(
                "SELECT c.id, c.issued_by, c.action, c.bucket, c.endpoint_prefix, c.job_id, \
                 c.created_before, c.idempotency_key_prefix, c.postpone_until, c.reason \
                 FROM operator_commands c \
                 LEFT JOIN operator_command_results r ON r.command_id = c.id \
                 WHERE r.command_id IS NULL ORDER BY c.id LIMIT 100",
            )
            .fetch_all(p)
            .await?
            .iter()
            .map(q::command_from_row)
            .collect()
        })
    }

    /// The highest command id with a recorded result (0 if none): where a new owner resumes.
    pub async fn last_applied_command(&self) -> Result<u64, JobDbError> {
        let last: Option<u64> = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT MAX(command_id) FROM operator_command_results")
                .fetch_one(p)
                .await?
        });
        Ok(last.unwrap_or(0))
    }

    /// Records that `applied_by` applied command `id` to `jobs` jobs. Applying a command again
    /// (after a crash between its transitions and this row) changes nothing it already changed,
    /// so a second result for the same command is ignored.
    pub async fn record_command_result(
        &self,
        id: u64,
        applied_by: &str,
        jobs: u64,
    ) -> Result<(), JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(q::INSERT_COMMAND_RESULT)
                .bind(super::int(id))
                .bind(Utc::now().naive_utc())
                .bind(applied_by)
                .bind(super::int(jobs))
                .execute(p)
                .await?;
        });
        Ok(())
    }

    /// The jobs command `id` names that wait for an attempt (latest row `awaiting-scheduling`
    /// or `awaiting-retry`, written before `before_row`), with their progress.
    pub async fn command_targets(
        &self,
        id: u64,
        before_row: u64,
    ) -> Result<Vec<(JobId, Progress)>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(q::COMMAND_TARGETS)
                .bind(super::int(id))
                .bind(super::int(before_row))
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| Ok((q::job_id_of(row, "job_id")?, q::progress_of(row)?)))
                .collect()
        })
    }
}
