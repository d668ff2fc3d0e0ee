//! Refusals: what a drainer does when a live Director refuses to import a job.
//!
//! A job accepted once is never discarded because of where it is being moved. The drainer
//! checks a refused job itself, with this version's import rules under the widest limits a
//! Director can be given ([`crate::rpc::import::importable`]):
//! - a job that fails them could never be imported by a Director of this version: it is
//!   *discarded* in the retired JobDB with `error_type` `import-refused`, the
//!   reason and the target's answer in `error_response`, instead of blocking the drain forever;
//! - a job that passes was refused for where it was sent (the target's smaller limits, its
//!   JobDB server's packet size, an older version that does not know a field): it *waits*. It
//!   gets a `move-refused` row holding the answer (one per answer), is counted
//!   (`spindle_import_refusals_total`, `spindle_jobs_waiting_for_target`) and logged at error,
//!   and goes to another live Director at once; once every live Director has refused it, it is
//!   tried again after a backoff (1 s, doubling to a minute). The drain does not end while a
//!   job waits, so the manager does not drop the JobDB; a job whose expiry passes meanwhile is
//!   archived as any expired job.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use super::{Drain, DrainerError, Owned};
use crate::job::{AttemptRecord, ErrorType, JobId, State, Transition};
use crate::metrics::RefusalLabels;
use crate::rpc::import::{importable, ImportJob};

/// The first wait of a job every live Director refused; doubled per round up to
/// [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait between two rounds of a refused job.
const LONGEST_WAIT: Duration = Duration::from_secs(60);
/// Most bytes of a target's answer kept in a row or a log line.
const ANSWER_BYTES: usize = 2048;

/// A job a live Director refused that a Director of this version could take.
#[derive(Debug)]
struct Refused {
    /// The JobDBs whose Directors refused it since its last wait.
    by: BTreeSet<String>,
    /// Not sent again before then (`None`: at once, to a JobDB not in `by`).
    not_before: Option<Instant>,
    /// Its next wait once every live Director has refused it.
    wait: Duration,
    /// The JobDB and status of the refusal its latest `move-refused` row records.
    recorded: Option<(String, u16)>,
}

/// When a job of the retired JobDB may be sent.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// Never refused: to any live Director.
    Fresh,
    /// Refused before: now, to a Director whose JobDB is not among these.
    Due(BTreeSet<String>),
    /// Refused by every live Director: not before then.
    Later(Instant),
}

/// The jobs of one retired JobDB that wait for a Director that takes them.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    jobs: Mutex<HashMap<JobId, Refused>>,
}

impl Waiting {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Refused>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When `id` may be sent, at `now`.
    pub(super) fn turn(&self, id: JobId, now: Instant) -> Turn {
        match self.jobs().get(&id) {
            None => Turn::Fresh,
            Some(r) => match r.not_before {
                Some(at) if at > now => Turn::Later(at),
                _ => Turn::Due(r.by.clone()),
            },
        }
    }

    /// The Director of `jobdb` refused `id` with `status`; whether that is new to its rows (a
    /// row is due: one per target and status, however often it is heard).
    fn refused(&self, id: JobId, jobdb: &str, status: u16) -> bool {
        let mut jobs = self.jobs();
        let r = jobs.entry(id).or_insert_with(|| Refused {
            by: BTreeSet::new(),
            not_before: None,
            wait: FIRST_WAIT,
            recorded: None,
        });
        r.by.insert(jobdb.to_owned());
        r.not_before = None;
        let heard = (jobdb.to_owned(), status);
        if r.recorded.as_ref() == Some(&heard) {
            return false;
        }
        r.recorded = Some(heard);
        true
    }

    /// Every live Director has refused `ids`: each waits its backoff, then all are asked again
    /// (a Director may have been restarted with other limits).
    pub(super) fn all_refused(&self, ids: &[JobId], now: Instant) {
        let mut jobs = self.jobs();
        for id in ids {
            if let Some(r) = jobs.get_mut(id) {
                r.by.clear();
                r.not_before = Some(now + r.wait);
                r.wait = (r.wait * 2).min(LONGEST_WAIT);
            }
        }
    }

    /// Keeps the jobs `open` says are still to move here (the others were moved, discarded or
    /// expired); returns how many wait.
    pub(super) fn retain(&self, open: impl Fn(&JobId) -> bool) -> usize {
        let mut jobs = self.jobs();
        jobs.retain(|id, _| open(id));
        jobs.len()
    }
}

/// The start of a target's answer, on a char boundary.
fn clipped(answer: &str) -> &str {
    if answer.len() <= ANSWER_BYTES {
        return answer;
    }
    let mut end = ANSWER_BYTES;
    while !answer.is_char_boundary(end) {
        end -= 1;
    }
    &answer[..end]
}

impl Drain {
    /// The Director of `to_jobdb` refused `spec` with `status` and `answer`: discarded if no
    /// Director of this version could import it, otherwise it waits for one that does.
    pub(super) async fn refused(
        &self,
        o: &Owned,
        spec: &ImportJob,
        to_jobdb: &str,
        status: u16,
        answer: &str,
    ) -> Result<(), DrainerError> {
        let Ok(job) = spec.id.parse::<JobId>() else {
            // Ids come from this JobDB's own rows.
            return Err(DrainerError::JobDb(crate::jobdb::JobDbError::Corrupt(
                format!("job id {:?} of an import is not a ULID", spec.id),
            )));
        };
        let answer = clipped(answer);
        match importable(spec) {
            Ok(()) => self.wait_for_target(o, job, to_jobdb, status, answer).await,
            Err(why) => {
                self.metrics
                    .import_refusals
                    .get_or_create(&RefusalLabels { reason: "invalid" })
                    .inc();
                let field = why.field.strip_prefix("jobs[0].").unwrap_or(&why.field);
                let reason = format!(
                    "no director of this version can import it: {field} {}; jobdb {to_jobdb} \
                     answered: {answer}",
                    why.message
                );
                self.park_refused(o, job, &reason).await
            }
        }
    }

    /// A job a Director of this version could take was refused by the Director of
    /// `to_jobdb`: counted, and the first time that target refuses it so, logged at error and
    /// given a `move-refused` row; it waits in [`Owned::waiting`] for a Director that takes it.
    async fn wait_for_target(
        &self,
        o: &Owned,
        job: JobId,
        to_jobdb: &str,
        status: u16,
        answer: &str,
    ) -> Result<(), DrainerError> {
        let reason = if status == 413 {
            "target_limit"
        } else {
            "target_refused"
        };
        self.metrics
            .import_refusals
            .get_or_create(&RefusalLabels { reason })
            .inc();
        if !o.waiting.refused(job, to_jobdb, status) {
            tracing::debug!(jobdb = o.db.name(), job = %job, to = to_jobdb, answer, "refused again");
            return Ok(());
        }
        tracing::error!(
            jobdb = o.db.name(),
            job = %job,
            to = to_jobdb,
            status,
            answer,
            "a live director refuses a job that a director of this version can take (its limits \
             or its version): the job waits in the retired jobdb for a director that takes it \
             (another one now, then again with backoff)"
        );
        let latest = o.db.latest_of(&[job]).await?;
        let Some(last) = latest
            .get(&job)
            .filter(|t| matches!(t.state, State::AwaitingScheduling | State::AwaitingRetry))
        else {
            return Ok(());
        };
        let now = Utc::now();
        let row = Transition::awaiting_retry(
            job,
            last.attempts,
            now,
            last.retry_at.unwrap_or(now),
            AttemptRecord {
                error_type: Some(ErrorType::MoveRefused.into()),
                error_response: Some(bytes::Bytes::from(format!(
                    "jobdb {to_jobdb} answered: {answer}"
                ))),
                ..AttemptRecord::default()
            },
        );
        self.append(o, vec![row]).await
    }

    /// Ends a job no Director of this version can import: `discarded`, `error_type`
    /// `import-refused`, with the reason, so it is visible in SQL and archived with the JobDB's
    /// history instead of blocking the drain forever.
    pub(super) async fn park_refused(
        &self,
        o: &Owned,
        job: JobId,
        reason: &str,
    ) -> Result<(), DrainerError> {
        let latest = o.db.latest_of(&[job]).await?;
        let Some(last) = latest.get(&job).filter(|t| !t.state.is_terminal()) else {
            return Ok(());
        };
        tracing::error!(
            jobdb = o.db.name(),
            job = %job,
            reason,
            "no director of this version can import this job: discarded (import-refused)"
        );
        let row = Transition::discarded(
            job,
            last.attempts,
            Utc::now(),
            AttemptRecord {
                error_type: Some(ErrorType::ImportRefused.into()),
                error_response: Some(bytes::Bytes::from(reason.to_owned())),
                ..AttemptRecord::default()
            },
        );
        self.append(o, vec![row]).await?;
        self.metrics.jobs_import_refused.inc();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> JobId {
        JobId(ulid::Ulid::from(n))
    }

    #[test]
    fn a_refused_job_tries_other_directors_then_waits_longer_each_round() {
        let w = Waiting::default();
        let now = Instant::now();
        assert_eq!(w.turn(id(1), now), Turn::Fresh);
        // Refused by a: at once, elsewhere; a row for each target and status.
        assert!(w.refused(id(1), "a", 413));
        assert!(!w.refused(id(1), "a", 413));
        assert_eq!(w.turn(id(1), now), Turn::Due(["a".to_owned()].into()));
        assert!(w.refused(id(1), "b", 413));
        assert_eq!(
            w.turn(id(1), now),
            Turn::Due(["a".to_owned(), "b".to_owned()].into())
        );
        // No live Director left: it waits 1 s, then any may be asked again; then 2 s, 4 s...
        let mut waits = Vec::new();
        for _ in 0..8 {
            w.all_refused(&[id(1)], now);
            match w.turn(id(1), now) {
                Turn::Later(at) => waits.push((at - now).as_secs()),
                other => panic!("{other:?}"),
            }
            assert_eq!(
                w.turn(id(1), now + LONGEST_WAIT),
                Turn::Due(BTreeSet::new())
            );
            w.refused(id(1), "a", 413);
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        // A job moved, discarded or expired is forgotten.
        assert_eq!(w.retain(|_| false), 0);
        assert_eq!(w.turn(id(1), now), Turn::Fresh);
    }

    #[test]
    fn answers_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(ANSWER_BYTES);
        let clipped = clipped(&long);
        assert!(clipped.len() <= ANSWER_BYTES && clipped.len() >= ANSWER_BYTES - 1);
        assert_eq!(super::clipped("short"), "short");
    }
}
