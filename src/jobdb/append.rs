//! Appending to a JobDB: [`JobDb::append`], [`JobDb::append_all`] and the bounded forms a
//! Director's writer uses ([`JobDb::append_bounded`], [`JobDb::append_answered`]), one fenced
//! transaction each, run on either engine by the write path (`write::write_path!`); and what
//! a writer needs around them: the largest row a JobDB takes, settling a COMMIT that got no
//! answer, and finding out whether a commit happened.

use chrono::Utc;

use super::write::{
    job_row_bytes, transition_row_bytes, Append, Bounds, Stalled, Written, MAX_BYTES_PER_INSERT,
};
use super::{int, with_pool, JobDb, JobDbError};
use crate::job::{Job, JobId, Transition};
use std::sync::Arc;

impl JobDb {
    /// The largest row (in [`job_row_bytes`] / [`transition_row_bytes`]) this JobDB can store:
    /// a bigger one is refused whatever else is in its batch.
    pub fn max_row_bytes(&self) -> usize {
        self.max_packet.saturating_sub(64 * 1024)
    }

    /// Most bytes of rows in one INSERT statement on this JobDB.
    pub(crate) fn max_statement_bytes(&self) -> usize {
        MAX_BYTES_PER_INSERT.min(self.max_packet / 2)
    }

    /// Appends jobs and transitions in one transaction, checking the fencing token as the
    /// last statement before COMMIT, under a shared lock: a new owner's takeover waits for that
    /// one round trip at most, and once it has happened our check fails and nothing of the
    /// transaction is stored. (Checking first would make a paused owner block its successor
    /// for as long as it stays paused.)
    pub async fn append(
        &self,
        token: u64,
        jobs: &[Arc<Job>],
        transitions: &[(u64, Transition)],
    ) -> Result<(), JobDbError> {
        self.append_all(
            token,
            &Append {
                jobs,
                transitions,
                ..Append::default()
            },
        )
        .await
        .map(drop)
    }

    /// Writes everything `append` holds in one fenced transaction (see [`JobDb::append`]),
    /// keeping `open_jobs` (each resting job's latest state) in step.
    ///
    /// What a failure means for the caller: [`JobDbError::Fenced`], another owner holds the
    /// JobDB; [`JobDbError::Refused`], the server (or the size check before sending) refused
    /// the data, nothing was stored and the same rows will be refused again;
    /// [`JobDbError::CommitUnknown`], the COMMIT's answer was lost; any other error happened
    /// before the COMMIT was sent, so nothing was stored and trying again may succeed. Returns
    /// what the write did besides its rows (see [`Written`]).
    pub async fn append_all(&self, token: u64, append: &Append<'_>) -> Result<Written, JobDbError> {
        self.append_bounded(token, append, &Bounds::default()).await
    }

    /// [`JobDb::append_all`] within `bounds`: the work before the COMMIT within
    /// [`Bounds::work`] (else [`JobDbError::TimedOut`], nothing stored), the COMMIT's answer
    /// within [`Bounds::commit`] (else [`JobDbError::CommitStalled`], outcome unknown until
    /// [`JobDb::settle`]), and no COMMIT once [`Bounds::not_after`] has passed
    /// ([`JobDbError::Expired`], nothing stored). A connection that ran out of time is closed,
    /// never handed back to the pool with a statement still running on the server.
    pub async fn append_bounded(
        &self,
        token: u64,
        append: &Append<'_>,
        bounds: &Bounds,
    ) -> Result<Written, JobDbError> {
        let (result, written) = self.append_answered(token, append, bounds).await;
        result.map(|()| written.unwrap_or_default())
    }

    /// [`JobDb::append_bounded`], with what the transaction did before its COMMIT whenever it
    /// reached it (`Some`: committed, or its outcome unknown): what a writer that finds out
    /// later that the COMMIT happened still needs.
    pub async fn append_answered(
        &self,
        token: u64,
        append: &Append<'_>,
        bounds: &Bounds,
    ) -> (Result<(), JobDbError>, Option<Written>) {
        let max_row = self.max_row_bytes();
        if let Some(job) = append.jobs.iter().find(|job| job_row_bytes(job) > max_row) {
            let why = format!(
                "job {} takes {} bytes; this jobdb's server accepts rows of at most {max_row} \
                 (max_allowed_packet)",
                job.id,
                job_row_bytes(job)
            );
            return (Err(JobDbError::Refused(why)), None);
        }
        if let Some((_, t)) = append
            .transitions
            .iter()
            .find(|(_, t)| transition_row_bytes(t) > max_row)
        {
            let why = format!(
                "a transition of job {} takes {} bytes; this jobdb's server accepts rows of at \
                 most {max_row} (max_allowed_packet)",
                t.job_id,
                transition_row_bytes(t)
            );
            return (Err(JobDbError::Refused(why)), None);
        }
        let limit = self.max_statement_bytes();
        let work_until = bounds
            .work
            .and_then(|d| tokio::time::Instant::now().checked_add(d));
        with_pool!(self, |p, q| {
            let mut conn = match within(work_until, p.acquire()).await {
                Some(Ok(conn)) => conn,
                Some(Err(e)) => return (Err(e.into()), None),
                None => return (Err(JobDbError::TimedOut), None),
            };
            // How the transaction ended; it borrows the connection only until then.
            let ended = async {
                let work = async {
                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                    let written = q::write_rows(&mut tx, append, limit).await?;
                    let (tx, connection) = q::check_fence(tx, token).await?;
                    // After the fence check (which may have waited for a lock), right before
                    // the COMMIT: a forward is never stored after its claim could lapse.
                    if bounds.not_after.is_some_and(|t| Utc::now() > t) {
                        tx.rollback().await?;
                        return Err(JobDbError::Expired);
                    }
                    Ok((tx, connection, written))
                };
                let (tx, connection, written) = match within(work_until, work).await {
                    None => return Ended::TimedOut,
                    Some(Err(e)) => return Ended::Done(Err(e)),
                    Some(Ok(done)) => done,
                };
                let commit_until = bounds
                    .commit
                    .and_then(|d| tokio::time::Instant::now().checked_add(d));
                match within(commit_until, tx.commit()).await {
                    None => Ended::Stalled(connection, written),
                    Some(Ok(())) => Ended::Done(Ok(written)),
                    // Past this point a failure may come after the server committed.
                    Some(Err(e)) => Ended::Unanswered(e, written),
                }
            }
            .await;
            match ended {
                Ended::Done(Ok(written)) => (Ok(()), Some(written)),
                Ended::Done(Err(JobDbError::Sql(sql))) => {
                    let e = match q::refusal(&sql) {
                        Some(why) if is_duplicate(&sql) => JobDbError::Duplicate(why),
                        Some(why) => JobDbError::Refused(why),
                        None => JobDbError::Sql(sql),
                    };
                    (Err(e), None)
                }
                Ended::Done(Err(other)) => (Err(other), None),
                Ended::Unanswered(e, written) => (Err(JobDbError::CommitUnknown(e)), Some(written)),
                // The server may still be running a statement of this connection (waiting for
                // a lock): closed, it never commits, and the pool opens a fresh one.
                Ended::TimedOut => {
                    drop(conn.detach());
                    (Err(JobDbError::TimedOut), None)
                }
                Ended::Stalled(connection, written) => {
                    let stalled = q::stalled(conn.detach(), connection);
                    (Err(JobDbError::CommitStalled(stalled)), Some(written))
                }
            }
        })
    }

    /// Makes sure the server is done with the connection of a COMMIT that got no answer in
    /// time ([`JobDbError::CommitStalled`]): MySQL ends it (`KILL CONNECTION`) and waits until
    /// the server no longer lists it; SQLite closes it, which waits for the COMMIT its worker
    /// still runs. After this returns, reading the JobDB tells whether the COMMIT happened.
    /// An error (the server cannot be reached) means: not known yet, try again.
    pub async fn settle(&self, stalled: &mut Option<Stalled>) -> Result<(), JobDbError> {
        match stalled.take() {
            None => Ok(()),
            Some(Stalled::MySql(id)) => match &self.pool {
                super::engine::Pool::MySql(p) => {
                    let ended = super::engine::mysql::end_connection(p, id).await;
                    if ended.is_err() {
                        *stalled = Some(Stalled::MySql(id));
                    }
                    ended
                }
                super::engine::Pool::Sqlite(_) => Ok(()),
            },
            Some(Stalled::Sqlite(conn)) => {
                sqlx::Connection::close(conn).await?;
                Ok(())
            }
        }
    }

    /// Whether the Director's commit `id` (its `commit_log` row) happened: tells, after a
    /// failed COMMIT, whether it did.
    pub async fn commit_exists(&self, id: u64) -> Result<bool, JobDbError> {
        let found: Option<u64> = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT id FROM commit_log WHERE id = ?")
                .bind(int(id))
                .fetch_optional(p)
                .await?
        });
        Ok(found.is_some())
    }

    /// Whether a transition row exists: tells, after a failed COMMIT, whether it happened.
    pub async fn transition_exists(&self, job_id: JobId, id: u64) -> Result<bool, JobDbError> {
        let found: Option<u64> = with_pool!(self, |p, q| {
            sqlx::query_scalar("SELECT id FROM job_state_transitions WHERE job_id = ? AND id = ?")
                .bind(&job_id.to_bytes()[..])
                .bind(int(id))
                .fetch_optional(p)
                .await?
        });
        Ok(found.is_some())
    }

    /// The highest id of the sequence taken so far (0 for an empty JobDB): of transitions,
    /// commits and entries of jobs that rested without a row. New ids continue from it (a row
    /// ends an attempt only with an id above the commit that began it).
    pub async fn max_transition_id(&self) -> Result<u64, JobDbError> {
        let max: Option<u64> = with_pool!(self, |p, q| {
            sqlx::query_scalar(
                "SELECT MAX(m) FROM (\
                 SELECT MAX(id) AS m FROM job_state_transitions \
                 UNION ALL SELECT MAX(id) FROM commit_log \
                 UNION ALL SELECT MAX(transition_id) FROM open_jobs) ids",
            )
            .fetch_one(p)
            .await?
        });
        Ok(max.unwrap_or(0))
    }
}

/// Whether the server refused a row because its key exists (either engine).
fn is_duplicate(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.kind(), sqlx::error::ErrorKind::UniqueViolation))
}

/// How a bounded transaction ended, before its connection is dealt with.
enum Ended {
    /// Committed, or failed before its COMMIT with this error (nothing stored).
    Done(Result<Written, JobDbError>),
    /// The COMMIT's answer was an error: it may have committed what it wrote.
    Unanswered(sqlx::Error, Written),
    /// The work before the COMMIT ran out of time.
    TimedOut,
    /// The COMMIT got no answer in time; the connection's id, and what it wrote.
    Stalled(u64, Written),
}

/// `fut`'s output, or `None` if `until` passes first (`None`: no bound).
async fn within<F: std::future::Future>(
    until: Option<tokio::time::Instant>,
    fut: F,
) -> Option<F::Output> {
    match until {
        Some(until) => tokio::time::timeout_at(until, fut).await.ok(),
        None => Some(fut.await),
    }
}
