//! Erasure with a receipt (`spindle erase`): a bucket's payloads, headers and answer bodies
//! removed from every place they live, the fact of each job and its ending kept.
//!
//! # Steps
//! 1. Each JobDB, those that no longer take jobs (retiring, draining, drained) before live
//!    ones, pass after pass until one changes nothing ([`PASSES`]): a job a drain moves
//!    meanwhile is ended where it was, or found where it went.
//!    - Jobs still in flight are ended first: a `discard` command (reason `erased`) for the
//!      owning Director, issued again while any named job has not ended (an attempt under way
//!      when one was applied comes back to wait), until none is left or `wait` runs out.
//!    - Then every ended job named is erased and marked `erased_at`
//!      ([`JobDb::erase_ended`]), and the tables are rebuilt so the bytes leave the files.
//! 2. The archive: every batch object holding a named job not erased yet is rewritten with
//!    the job erased (same key, new checksum in its manifest); every object of kept events
//!    with a named event likewise.
//! 3. The router's dedup store holds no payload (a digest of bucket and idempotency key, and a
//!    job id): nothing there to erase, and a producer's retry of an erased job still gets the
//!    first job's id.
//!
//! The [`Receipt`] counts what each place changed and names what could not be reached; a run
//! again finishes what one left and changes nothing else. Jobs are named by a [`Selector`]
//! whose time bound is never later than the run's start, so jobs accepted meanwhile are not
//! named.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ulid::Ulid;

use crate::archive::Archive;
pub use crate::jobdb::erasure::{Erased, Selector};
use crate::jobdb::JobDb;

/// How an erasure runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long to wait, per JobDB, for the jobs named still in flight to end.
    pub wait: Duration,
    /// Rebuild the tables after erasing, so the bytes leave the database files.
    pub rebuild: bool,
    /// Who the discard commands name as their issuer.
    pub issued_by: String,
}

/// What the router's dedup store holds of a job, said in every receipt.
pub const DEDUP_STORE: &str = "holds a SHA-256 digest of (bucket, idempotency key) and a job \
     id per entry, no payload: nothing to erase";

/// What an erasure did, place by place.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    /// The erasure's id (a ULID): the receipt's name in the archive.
    pub id: String,
    /// The bucket erased.
    pub bucket: String,
    /// Only jobs whose idempotency key starts with this.
    pub idempotency_key_prefix: Option<String>,
    /// Only jobs and events created before this instant.
    pub created_before: DateTime<Utc>,
    /// When the run started.
    pub started_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: DateTime<Utc>,
    /// Each JobDB, in the order they were erased.
    pub jobdbs: Vec<JobDbReceipt>,
    /// The archive, if one was given.
    pub archive: Option<ArchiveReceipt>,
    /// The router's dedup store.
    pub dedup_store: String,
    /// Everything not reached or not finished: empty when the erasure is complete.
    pub unreached: Vec<String>,
}

/// What an erasure did in one JobDB.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobDbReceipt {
    /// Its name.
    pub name: String,
    /// Its lifecycle state in the inventory (`given` when named by URL).
    pub state: String,
    /// Jobs in flight the discard commands ended.
    pub discarded: u64,
    /// Jobs erased.
    pub jobs: u64,
    /// Transition rows whose answer body was erased.
    pub answers: u64,
    /// Events whose kept envelope was erased.
    pub events: u64,
    /// Whether the tables were rebuilt.
    pub rebuilt: bool,
    /// Jobs named that had not ended when the wait ran out (not erased).
    pub not_ended: u64,
    /// Its tables were gone (the JobDB was dropped while the run read it): nothing is left.
    #[serde(default)]
    pub gone: bool,
    /// Why the JobDB could not be reached or finished, if so.
    pub error: Option<String>,
}

/// What an erasure did in the archive.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ArchiveReceipt {
    /// Where it is.
    pub location: String,
    /// Batch objects read.
    pub batches_read: u64,
    /// Batch objects rewritten.
    pub batches_rewritten: u64,
    /// Archived jobs erased.
    pub jobs: u64,
    /// Objects of kept events read.
    pub event_objects_read: u64,
    /// Objects of kept events rewritten.
    pub event_objects_rewritten: u64,
    /// Kept events erased.
    pub events: u64,
    /// Where the receipt is stored.
    pub receipt_key: Option<String>,
    /// What could not be read or rewritten (the listing, or one object each: the others are
    /// still done).
    pub errors: Vec<String>,
}

impl Receipt {
    /// A receipt for a run starting now.
    pub fn new(id: Ulid, selector: &Selector, started_at: DateTime<Utc>) -> Self {
        Receipt {
            id: id.to_string(),
            bucket: selector.bucket.clone(),
            idempotency_key_prefix: selector.idempotency_key_prefix.clone(),
            created_before: selector.created_before,
            started_at,
            finished_at: started_at,
            jobdbs: Vec::new(),
            archive: None,
            dedup_store: DEDUP_STORE.to_owned(),
            unreached: Vec::new(),
        }
    }

    /// Whether every place was reached and finished.
    pub fn complete(&self) -> bool {
        self.unreached.is_empty()
    }

    /// Adds one JobDB's part, naming it in `unreached` if it was not finished.
    pub fn add_jobdb(&mut self, part: JobDbReceipt) {
        if let Some(error) = &part.error {
            self.unreached
                .push(format!("jobdb {} ({}): {error}", part.name, part.state));
        } else if part.not_ended > 0 {
            self.unreached.push(format!(
                "jobdb {} ({}): {} jobs named had not ended (no Director applied the discard \
                 in time, or an attempt outlasted the wait); run again",
                part.name, part.state, part.not_ended
            ));
        }
        self.jobdbs.push(part);
    }

    /// Says that jobs were still moving between JobDBs after the last pass.
    pub fn add_unsettled(&mut self) {
        self.unreached.push(format!(
            "jobs named kept turning up after {PASSES} passes over the JobDBs (moves under \
             way?); run again"
        ));
    }

    /// Adds the archive's part, naming it in `unreached` if it was not finished.
    pub fn add_archive(&mut self, part: ArchiveReceipt) {
        for error in &part.errors {
            self.unreached
                .push(format!("archive {}: {error}", part.location));
        }
        self.archive = Some(part);
    }
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "erasure {} of bucket {:?}", self.id, self.bucket)?;
        if let Some(prefix) = &self.idempotency_key_prefix {
            writeln!(f, "  idempotency keys starting {prefix:?}")?;
        }
        writeln!(f, "  created before {}", self.created_before.to_rfc3339())?;
        writeln!(
            f,
            "  ran {} to {}",
            self.started_at.to_rfc3339(),
            self.finished_at.to_rfc3339()
        )?;
        for j in &self.jobdbs {
            writeln!(
                f,
                "  jobdb {} ({}): {} discarded, {} jobs, {} answers, {} events erased{}",
                j.name,
                j.state,
                j.discarded,
                j.jobs,
                j.answers,
                j.events,
                match (j.rebuilt, j.gone) {
                    (_, true) => ", dropped meanwhile",
                    (true, _) => ", tables rebuilt",
                    _ => "",
                }
            )?;
        }
        match &self.archive {
            Some(a) => writeln!(
                f,
                "  archive {}: {} of {} batches rewritten ({} jobs), {} of {} event objects \
                 ({} events)",
                a.location,
                a.batches_rewritten,
                a.batches_read,
                a.jobs,
                a.event_objects_rewritten,
                a.event_objects_read,
                a.events
            )?,
            None => writeln!(f, "  archive: none")?,
        }
        writeln!(f, "  router dedup store: {}", self.dedup_store)?;
        if self.complete() {
            writeln!(f, "  complete")
        } else {
            for u in &self.unreached {
                writeln!(f, "  NOT DONE: {u}")?;
            }
            Ok(())
        }
    }
}

/// Most passes over the JobDBs. A pass that changed nothing proves the last one found
/// everything; one changes something after the first only when a job moved between JobDBs
/// while they were read (a drain), so a third that still does means moves under way.
pub const PASSES: usize = 3;

/// A JobDB to erase in, opened (or why it could not be).
pub struct Opened {
    /// Its name.
    pub name: String,
    /// Its lifecycle state, for the receipt.
    pub state: String,
    /// The store, or what became of it.
    pub db: Opening,
}

/// What opening a JobDB gave.
pub enum Opening {
    /// The store.
    Open(JobDb),
    /// The database does not exist (dropped since the inventory was read): nothing is left.
    Gone,
    /// Why it could not be opened.
    Failed(String),
}

/// Erases what `selector` names in every JobDB, in the order given, pass after pass until a
/// pass changes nothing (at most [`PASSES`]); returns each JobDB's part and whether the last
/// pass changed nothing.
pub async fn erase_jobdbs(
    jobdbs: &[Opened],
    selector: &Selector,
    options: &Options,
) -> (Vec<JobDbReceipt>, bool) {
    let mut parts: Vec<JobDbReceipt> = jobdbs
        .iter()
        .map(|j| JobDbReceipt {
            name: j.name.clone(),
            state: j.state.clone(),
            error: match &j.db {
                Opening::Failed(e) => Some(e.clone()),
                _ => None,
            },
            gone: matches!(j.db, Opening::Gone),
            ..JobDbReceipt::default()
        })
        .collect();
    for _ in 0..PASSES {
        let mut changed = false;
        for (j, part) in jobdbs.iter().zip(&mut parts) {
            let Opening::Open(db) = &j.db else { continue };
            if part.error.is_some() || part.not_ended > 0 || part.gone {
                continue;
            }
            let before = part.changes();
            erase_pass(db, selector, options, part).await;
            changed |= part.changes() > before;
        }
        if !changed {
            return (parts, true);
        }
    }
    (parts, false)
}

impl JobDbReceipt {
    /// Everything its passes changed, summed: a pass that leaves it as it was changed nothing.
    fn changes(&self) -> u64 {
        self.discarded + self.jobs + self.answers + self.events
    }
}

/// One pass over one JobDB, added to its part: ends the jobs in flight, then erases the
/// ended ones. Errors are recorded in the part, not returned: other places still get their
/// turn.
async fn erase_pass(db: &JobDb, selector: &Selector, options: &Options, part: &mut JobDbReceipt) {
    match erase_in(db, selector, options, part).await {
        // Dropped under us (a drained JobDB the manager removed): nothing is left there.
        Err(e) if e.is_gone() => part.gone = true,
        Err(e) => part.error = Some(crate::delivery::error_chain(&e)),
        Ok(()) => {}
    }
}

async fn erase_in(
    db: &JobDb,
    selector: &Selector,
    options: &Options,
    part: &mut JobDbReceipt,
) -> Result<(), crate::jobdb::JobDbError> {
    let deadline = tokio::time::Instant::now() + options.wait;
    let mut command: Option<u64> = None;
    loop {
        let open = db.not_ended(selector).await?;
        if let Some(id) = command {
            if let Some(jobs) = db.command_result(id).await? {
                part.discarded += jobs;
                command = None;
            }
        }
        if open == 0 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            part.not_ended = open;
            break;
        }
        if command.is_none() {
            command = Some(
                db.issue_erasing_discard(selector, &options.issued_by)
                    .await?,
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let erased = db.erase_ended(selector, Utc::now()).await?;
    part.jobs += erased.jobs;
    part.answers += erased.answers;
    part.events += erased.events;
    if options.rebuild && erased != Erased::default() {
        db.rebuild_erased_tables().await?;
        part.rebuilt = true;
    }
    Ok(())
}

/// Erases what `selector` names in the archive: rewrites each batch and each object of kept
/// events that holds something named not erased yet. An object that cannot be read or
/// written is named in the part and the others are still done.
pub async fn erase_archive(archive: &Archive, selector: &Selector) -> ArchiveReceipt {
    let mut part = ArchiveReceipt {
        location: archive.location(),
        ..ArchiveReceipt::default()
    };
    let error = |e: &crate::archive::ArchiveError| crate::delivery::error_chain(e);
    let now = Utc::now();
    match archive.manifests(None).await {
        Ok(manifests) => {
            for manifest in manifests {
                match erase_batch(archive, selector, &manifest, now).await {
                    Ok(erased) => {
                        part.batches_read += 1;
                        part.batches_rewritten += u64::from(erased > 0);
                        part.jobs += erased;
                    }
                    Err(e) => {
                        part.errors
                            .push(format!("batch {}: {}", manifest.object_key, error(&e)))
                    }
                }
            }
        }
        Err(e) => part
            .errors
            .push(format!("listing the batches: {}", error(&e))),
    }
    match archive.event_objects(None).await {
        Ok(keys) => {
            for key in keys {
                match erase_events(archive, selector, &key).await {
                    Ok(erased) => {
                        part.event_objects_read += 1;
                        part.event_objects_rewritten += u64::from(erased > 0);
                        part.events += erased;
                    }
                    Err(e) => part.errors.push(format!("events {key}: {}", error(&e))),
                }
            }
        }
        Err(e) => part
            .errors
            .push(format!("listing the events: {}", error(&e))),
    }
    part
}

/// Rewrites one batch without the bytes of the jobs `selector` names; returns how many.
async fn erase_batch(
    archive: &Archive,
    selector: &Selector,
    manifest: &crate::archive::Manifest,
    now: DateTime<Utc>,
) -> Result<u64, crate::archive::ArchiveError> {
    let mut jobs = archive.read_batch(&manifest.object_key).await?;
    let mut erased = 0;
    for job in &mut jobs {
        if job.erased_at.is_none()
            && job.holds_bytes()
            && selector.names(&job.bucket, job.created_at, job.idempotency_key.as_deref())
        {
            job.erase(now);
            erased += 1;
        }
    }
    if erased > 0 {
        let batch: Ulid = manifest.batch.parse().map_err(|_| {
            crate::archive::ArchiveError::Corrupt(format!(
                "batch {:?} is not a ULID",
                manifest.batch
            ))
        })?;
        archive
            .put_batch(&manifest.jobdb, manifest.kind, batch, &jobs)
            .await?;
    }
    Ok(erased)
}

/// Rewrites one object of kept events without the envelopes `selector` names; returns how
/// many.
async fn erase_events(
    archive: &Archive,
    selector: &Selector,
    key: &str,
) -> Result<u64, crate::archive::ArchiveError> {
    let mut events = archive.read_events(key).await?;
    let mut erased = 0;
    for event in &mut events {
        if event.envelope.get() != ERASED_ENVELOPE
            && selector.names_event(&event.bucket, event.created_at)
        {
            event.envelope = erased_envelope();
            erased += 1;
        }
    }
    if erased > 0 {
        archive.replace_events(key, &events).await?;
    }
    Ok(erased)
}

/// The envelope an erased kept event is left with.
const ERASED_ENVELOPE: &str = "null";

fn erased_envelope() -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(ERASED_ENVELOPE.to_owned())
        .unwrap_or_else(|_| unreachable!("`null` is JSON"))
}
