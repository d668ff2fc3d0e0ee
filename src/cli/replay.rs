//! Replay: re-submits jobs that ended `discarded` or `archived` as new jobs, read from a JobDB
//! or from the S3 archive, selected by bucket, endpoint and creation time.
//!
//! A replayed job is a new job (new id, fresh attempts and expiry) with the original's bucket,
//! endpoint, method, headers, payload, timeout and backoff. It is linked to the original by its
//! idempotency key `replay-of:<original id>` (so replaying the same job twice through a router
//! within its dedup window is answered `duplicate`) and by a `spindle-replay-of` header the
//! receiver sees.

use std::collections::BTreeMap;

use spindle_client::NewJob;

use crate::archive::{Archive, ArchiveError, BatchKind};
use crate::job::{Job, JobId, State};
use crate::jobdb::replay::EndedFilter;
use crate::jobdb::{JobDb, JobDbError};

/// The header naming the job a replay came from.
pub const REPLAY_HEADER: &str = "spindle-replay-of";

/// Jobs submitted per request.
const BATCH: usize = 500;

/// Where ended jobs are read from.
pub enum ReplaySource {
    /// A live (or retired) JobDB.
    JobDb(Box<JobDb>),
    /// The archive: every batch, or those of one JobDB.
    Archive {
        /// The archive.
        archive: Archive,
        /// Only batches of this JobDB.
        jobdb: Option<String>,
    },
}

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Which ended jobs.
    pub filter: EndedFilter,
    /// The RPC API that takes the new jobs (a Director or a router).
    pub to: String,
    /// Its API token, if it needs one.
    pub token: Option<String>,
    /// Lifetime of the new jobs; `None`: the Director's default.
    pub ttl_ms: Option<u64>,
    /// Select and count, submit nothing.
    pub dry_run: bool,
    /// Replay at most this many jobs.
    pub limit: usize,
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayReport {
    /// Jobs selected.
    pub selected: usize,
    /// Jobs accepted as new jobs (or already replayed: `duplicate` through a router).
    pub submitted: usize,
    /// (original, new) ids of the jobs submitted.
    pub links: Vec<(JobId, String)>,
}

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Reading the JobDB failed.
    #[error(transparent)]
    JobDb(#[from] JobDbError),
    /// Reading the archive failed.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The API could not be reached, did not answer, or answered something unreadable; jobs of
    /// earlier batches were submitted.
    #[error("submitting to {to}: {source}")]
    Transport {
        /// The API.
        to: String,
        /// What failed.
        source: spindle_client::Error,
    },
    /// The API refused a batch; jobs before it were submitted.
    #[error("the api answered {status}: {body}")]
    Refused {
        /// Its status.
        status: u16,
        /// Its error message.
        body: String,
    },
}

impl ReplayError {
    /// A failed submission to `to`: refused by the API, or not answered.
    pub(super) fn submitting(to: &str, error: spindle_client::Error) -> Self {
        match error {
            spindle_client::Error::Api(answer) => ReplayError::Refused {
                status: answer.status,
                body: answer.message,
            },
            source => ReplayError::Transport {
                to: to.to_owned(),
                source,
            },
        }
    }
}

/// Selects the ended jobs and submits them as new jobs, a batch at a time.
pub async fn replay(
    source: &ReplaySource,
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    // No deadline on a batch (a router may wait for pending claims and resolve forwards).
    let client = spindle_client::Client::builder(&options.to)
        .token(options.token.clone())
        .no_timeout()
        .build()
        .map_err(|e| ReplayError::submitting(&options.to, e))?;
    let mut report = ReplayReport::default();
    let mut pending: Vec<Job> = Vec::new();
    match source {
        ReplaySource::JobDb(db) => {
            // Only jobs created before the replay began: the jobs it submits may end (and be
            // read by a later page) before it is done, and must not be replayed again.
            let started = chrono::Utc::now();
            let filter = EndedFilter {
                until: Some(options.filter.until.map_or(started, |t| t.min(started))),
                ..options.filter.clone()
            };
            let mut after = None;
            while report.selected < options.limit {
                let page = db
                    .ended_jobs(&filter, after, BATCH.min(options.limit - report.selected))
                    .await?;
                let Some((last, _)) = page.last() else { break };
                after = Some(last.id);
                for (job, _) in page {
                    report.selected += 1;
                    pending.push(job);
                }
                submit(&client, options, &mut pending, &mut report).await?;
            }
        }
        ReplaySource::Archive { archive, jobdb } => {
            // An expired job of a drained JobDB is in an `expired` batch and in its `history`.
            let mut seen = std::collections::HashSet::new();
            'batches: for manifest in archive.manifests(jobdb.as_deref()).await? {
                for archived in archive.read_batch(&manifest.object_key).await? {
                    // An expired batch is written before its jobs' `archived` rows: its jobs
                    // end `archiving` there.
                    let state = match archived.transitions.last().map(|t| t.state) {
                        Some(State::Archiving | State::Archived) => State::Archived,
                        Some(state) => state,
                        None => continue,
                    };
                    // A drained JobDB's history batch also holds jobs that went on elsewhere.
                    if manifest.kind == BatchKind::History && archived.moved_to.is_some() {
                        continue;
                    }
                    // Nothing is left to send.
                    if archived.erased_at.is_some() {
                        continue;
                    }
                    let job = archived.to_job()?;
                    if !options.filter.matches(&job, state) || !seen.insert(job.id) {
                        continue;
                    }
                    report.selected += 1;
                    pending.push(job);
                    if pending.len() >= BATCH {
                        submit(&client, options, &mut pending, &mut report).await?;
                    }
                    if report.selected >= options.limit {
                        break 'batches;
                    }
                }
            }
        }
    }
    submit(&client, options, &mut pending, &mut report).await?;
    Ok(report)
}

/// The new job for `original`, as `POST /v1/jobs` takes it.
pub fn new_job(original: &Job, ttl_ms: Option<u64>) -> NewJob {
    // A replay's attempts link to the trace the original was submitted in.
    let (traceparent, tracestate) = crate::telemetry::TraceContext::fields(original.trace.as_ref());
    let mut headers: BTreeMap<String, String> = original.headers.iter().cloned().collect();
    let original_id = original.id.to_string();
    headers.insert(REPLAY_HEADER.to_owned(), original_id.clone());
    NewJob {
        method: Some(original.method.to_string()),
        headers: Some(headers),
        execution_timeout_ms: Some(original.execution_timeout.as_millis() as u64),
        backoff_min_delay_ms: Some(original.retry.min_delay.as_millis() as u64),
        backoff_coefficient: Some(original.retry.coefficient),
        idempotency_key: Some(format!("replay-of:{original_id}")),
        on_complete: original.on_complete.as_deref().map(str::to_owned),
        // A replay goes after its key's jobs accepted so far, and replays of one key keep
        // their order (they are sent in id order).
        ordering_key: original.ordering.as_ref().map(|o| o.key.to_string()),
        ordering_failure: original
            .ordering
            .as_ref()
            .map(crate::job::OrderedKey::failure),
        ttl_ms,
        traceparent,
        tracestate,
        ..NewJob::new(&*original.bucket, &*original.endpoint)
    }
    .with_payload_bytes(&original.payload)
}

async fn submit(
    client: &spindle_client::Client,
    options: &ReplayOptions,
    pending: &mut Vec<Job>,
    report: &mut ReplayReport,
) -> Result<(), ReplayError> {
    if pending.is_empty() || options.dry_run {
        pending.clear();
        return Ok(());
    }
    let jobs: Vec<NewJob> = pending.iter().map(|j| new_job(j, options.ttl_ms)).collect();
    let answer = client
        .submit(&jobs)
        .await
        .map_err(|e| ReplayError::submitting(&options.to, e))?;
    for (original, accepted) in pending.drain(..).zip(answer.jobs) {
        if accepted.status.is_stored() {
            report.submitted += 1;
            report.links.push((original.id, accepted.id));
        }
    }
    Ok(())
}

/// Parses the `--state` list of `spindle replay`.
pub fn states(names: &[String]) -> Result<(bool, bool), String> {
    let mut out = (false, false);
    for name in names {
        match name.parse::<State>() {
            Ok(State::Discarded) => out.0 = true,
            Ok(State::Archived) => out.1 = true,
            _ => {
                return Err(format!(
                    "--state {name}: replay takes discarded or archived"
                ))
            }
        }
    }
    Ok(out)
}
