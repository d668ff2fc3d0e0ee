//! Operator commands: rows operators append with plain SQL (`operator_commands`), which the
//! owning Director reads, applies to the matching jobs, and answers in
//! `operator_command_results`. Nothing is updated: the command, the transitions it caused
//! (whose `error_response` names it) and its result are all appended.

use std::str::FromStr;

use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::{job_id_of, progress_of, text, text_opt, JobDb, JobDbError};
use crate::job::{Job, JobId, Progress};

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
    pub fn error_type(self) -> &'static str {
        match self {
            Action::Expedite => "operator-expedite",
            Action::Postpone => "operator-postpone",
            Action::Flush => "operator-flush",
            Action::Discard => "operator-discard",
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
        let rows = sqlx::query(
            "SELECT id, issued_by, action, bucket, endpoint_prefix, job_id, created_before, \
             postpone_until, reason FROM operator_commands WHERE id > ? ORDER BY id LIMIT 100",
        )
        .bind(after)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(command_from_row).collect()
    }

    /// The highest command id with a recorded result (0 if none): where a new owner resumes.
    pub async fn last_applied_command(&self) -> Result<u64, JobDbError> {
        let last: Option<u64> =
            sqlx::query_scalar("SELECT MAX(command_id) FROM operator_command_results")
                .fetch_one(&self.pool)
                .await?;
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
        sqlx::query(
            "INSERT IGNORE INTO operator_command_results (command_id, applied_at, applied_by, jobs) \
             VALUES (?, ?, ?, ?)",
        )
        .bind(id)
        .bind(Utc::now().naive_utc())
        .bind(applied_by)
        .bind(jobs)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The jobs command `id` names that wait for an attempt (latest row `awaiting-scheduling`
    /// or `awaiting-retry`, written before `before_row`), with their progress.
    pub async fn command_targets(
        &self,
        id: u64,
        before_row: u64,
    ) -> Result<Vec<(JobId, Progress)>, JobDbError> {
        let rows = sqlx::query(
            "SELECT t.job_id, t.state, t.attempts, t.retry_at \
             FROM operator_commands c \
             JOIN jobs j ON (c.job_id IS NULL OR j.id = c.job_id) \
             JOIN job_state_transitions t ON t.job_id = j.id \
             WHERE c.id = ? \
               AND (c.bucket IS NULL OR j.bucket = c.bucket) \
               AND (c.endpoint_prefix IS NULL \
                    OR LEFT(j.endpoint, CHAR_LENGTH(c.endpoint_prefix)) = c.endpoint_prefix) \
               AND (c.created_before IS NULL OR j.created_at < c.created_before) \
               AND t.id = (SELECT MAX(l.id) FROM job_state_transitions l WHERE l.job_id = t.job_id) \
               AND t.id < ? \
               AND t.state IN ('awaiting-scheduling', 'awaiting-retry')",
        )
        .bind(id)
        .bind(before_row)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((job_id_of(row, "job_id")?, progress_of(row)?)))
            .collect()
    }
}

fn command_from_row(row: &MySqlRow) -> Result<Command, JobDbError> {
    let job_id: Option<Vec<u8>> = row.try_get("job_id")?;
    let job_id = match job_id {
        Some(_) => Some(job_id_of(row, "job_id")?),
        None => None,
    };
    let created_before: Option<NaiveDateTime> = row.try_get("created_before")?;
    let postpone_until: Option<NaiveDateTime> = row.try_get("postpone_until")?;
    Ok(Command {
        id: row.try_get("id")?,
        issued_by: text(row, "issued_by")?,
        action: text(row, "action")?.parse()?,
        bucket: text_opt(row, "bucket")?,
        endpoint_prefix: text_opt(row, "endpoint_prefix")?,
        job_id,
        created_before: created_before.map(|t| t.and_utc()),
        postpone_until: postpone_until.map(|t| t.and_utc()),
        reason: text_opt(row, "reason")?,
    })
}
