//! The JobDB side of replay: jobs that ended `discarded` or `archived`, selected by bucket,
//! endpoint and creation time, read a page at a time with their payloads.

use chrono::{DateTime, Utc};

use super::{with_pool, JobDb, JobDbError};
use crate::job::{Job, JobId, State};

/// Which ended jobs a replay takes.
#[derive(Clone, Debug, Default)]
pub struct EndedFilter {
    /// Only jobs of this bucket.
    pub bucket: Option<String>,
    /// Only jobs whose endpoint starts with this.
    pub endpoint_prefix: Option<String>,
    /// Only jobs created at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only jobs created before this instant.
    pub until: Option<DateTime<Utc>>,
    /// Take jobs that ended `discarded`.
    pub discarded: bool,
    /// Take jobs that ended `archived`.
    pub archived: bool,
}

impl EndedFilter {
    /// Whether a job that ended in `state` passes (the same conditions as
    /// [`JobDb::ended_jobs`], for jobs read from the archive).
    pub fn matches(&self, job: &Job, state: State) -> bool {
        let state_ok = match state {
            State::Discarded => self.discarded,
            State::Archived => self.archived,
            _ => false,
        };
        state_ok
            && self.bucket.as_deref().is_none_or(|b| *job.bucket == *b)
            && self
                .endpoint_prefix
                .as_deref()
                .is_none_or(|p| job.endpoint.starts_with(p))
            && self.since.is_none_or(|t| job.created_at >= t)
            && self.until.is_none_or(|t| job.created_at < t)
    }
}

impl JobDb {
    /// Up to `limit` jobs after `after` (id order) whose latest transition is `discarded` or
    /// `archived` as `filter` asks, with that state and their payloads.
    pub async fn ended_jobs(
        &self,
        filter: &EndedFilter,
        after: Option<JobId>,
        limit: usize,
    ) -> Result<Vec<(Job, State)>, JobDbError> {
        let after = after.map_or_else(|| vec![0u8; 16], |id| id.to_bytes().to_vec());
        with_pool!(self, |p, q| {
            sqlx::query(q::ENDED_JOBS)
                .bind(after)
                .bind(filter.discarded)
                .bind(filter.archived)
                .bind(&filter.bucket)
                .bind(&filter.bucket)
                .bind(&filter.endpoint_prefix)
                .bind(&filter.endpoint_prefix)
                .bind(&filter.endpoint_prefix)
                .bind(filter.since.map(|t| t.naive_utc()))
                .bind(filter.since.map(|t| t.naive_utc()))
                .bind(filter.until.map(|t| t.naive_utc()))
                .bind(filter.until.map(|t| t.naive_utc()))
                .bind(limit as i64)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| Ok((q::job_from_row(row)?, q::state_of(row)?)))
                .collect()
        })
    }
}
