//! The `open_jobs` entries a write keeps in step: each unfinished job's latest resting state,
//! what a new entry takes from its job ([`Fresh`]), and what one write changes there
//! (`open_changes`: entries replaced, new ones without a known expiry, entries deleted). Which
//! new entry of an ordered job goes in held or released is its writer's decision; this only
//! writes it down. No SQL: `write::write_path!` writes what this computes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::job::{Job, JobId, Place, State, Transition};

/// A job its writer accepted that has no `open_jobs` entry yet: what its first entry takes
/// from it.
#[derive(Clone, Debug)]
pub struct Fresh {
    /// Its `expire_at`.
    pub expire_at: DateTime<Utc>,
    /// Its endpoint, shared with the job: the entry's lane is cut from it.
    pub endpoint: Arc<str>,
    /// Its ordered sequence and position, if any. An ordered job is fresh when it went at
    /// once in the commit that stored it (born released: under way), or waits in its writer's
    /// book (kept, see `director::ordering`).
    pub place: Option<Place>,
    /// The bucket and ordering key of an ordered job whose unsuccessful end blocks its key:
    /// what its block row names, as no entry of its can be read for it.
    pub blocking: Option<(Arc<str>, Arc<str>)>,
}

impl Fresh {
    /// What a job's first entry takes from it.
    pub fn of(job: &Job) -> Self {
        Fresh {
            expire_at: job.expire_at,
            endpoint: job.endpoint.clone(),
            place: job.place(),
            blocking: job
                .ordering
                .as_ref()
                .filter(|o| o.blocks)
                .map(|o| (job.bucket.clone(), o.key.clone())),
        }
    }

    /// The block a fresh ordered job's end `t` writes, if it blocks its key (see
    /// [`super::ordering::blocks_sequence`]).
    pub fn block(&self, t: &Transition) -> Option<super::BlockedKey> {
        let (bucket, key) = self.blocking.as_ref()?;
        super::ordering::blocks_sequence(t).then(|| super::BlockedKey {
            job_id: t.job_id,
            state: t.state.as_str().to_owned(),
            blocked_at: t.time,
            bucket: bucket.to_string(),
            endpoint: self.endpoint.to_string(),
            ordering_key: key.to_string(),
        })
    }
}

/// A job's new latest state for `open_jobs`.
#[derive(Clone, Debug)]
pub struct OpenRow {
    /// The job.
    pub job_id: JobId,
    /// Its latest row, or for a job resting without one, an id of the sequence taken for it.
    pub transition_id: u64,
    /// Its state.
    pub state: State,
    /// Attempts started.
    pub attempts: u16,
    /// Its next attempt, when waiting for one.
    pub retry_at: Option<DateTime<Utc>>,
    /// Known for jobs written in the same batch or by the writer; else the stored value is
    /// kept (and a new entry reads it from `jobs`).
    pub expire_at: Option<DateTime<Utc>>,
    /// Its endpoint, known as `expire_at` is: a new entry's lane is cut from it, or read from
    /// `jobs` (a page behind the buffer pool) when it is not known. An entry keeps its lane.
    pub endpoint: Option<Arc<str>>,
    /// An ordered job's sequence and position, known as `endpoint` is: a new entry with one is
    /// held. An entry keeps them, until it moves to `archiving` (an end: it leaves its
    /// sequence).
    pub place: Option<Place>,
    /// A new entry with a `place` goes in released (`held = 0`), not held: its job is under
    /// way (it goes in this write, or went while fresh).
    pub released: bool,
}

impl OpenRow {
    /// The entry of a completion notice written now: it rests, never tried, until its
    /// JobDB's owner takes it in (the id 0 orders it before every row).
    pub fn notice(job: &Job) -> Self {
        OpenRow::resting(job.id, 0, Some(Fresh::of(job)))
    }

    /// The entry of a job that rests now without a row of its own: accepted, never tried;
    /// what the writer knows of it when it is fresh.
    pub fn resting(job_id: JobId, id: u64, fresh: Option<Fresh>) -> Self {
        let (expire_at, endpoint, place) = match fresh {
            Some(f) => (Some(f.expire_at), Some(f.endpoint), f.place),
            None => (None, None, None),
        };
        OpenRow {
            job_id,
            transition_id: id,
            state: State::AwaitingScheduling,
            attempts: 0,
            retry_at: None,
            expire_at,
            endpoint,
            place,
            released: false,
        }
    }

    /// The entry of a fresh job that rests now: an ordered one goes in released (under way)
    /// unless it is `held` (waiting for its turn).
    pub fn rest_of_fresh(job_id: JobId, id: u64, fresh: Fresh, held: bool) -> Self {
        let mut rest = OpenRow::resting(job_id, id, Some(fresh));
        rest.released = rest.place.is_some() && !held;
        rest
    }
}

/// What a batch changes in `open_jobs`.
pub(crate) struct OpenChanges {
    /// Entries to insert or replace.
    pub(crate) open: Vec<OpenRow>,
    /// New entries whose expiry is not known here (read from `jobs`).
    pub(crate) without_expiry: Vec<JobId>,
    /// Entries to delete: jobs that ended.
    pub(crate) closed: Vec<JobId>,
}

/// What a write's rows and rests change in `open_jobs`.
pub(crate) struct Rows<'a> {
    /// The write's new jobs.
    pub(crate) jobs: &'a [Arc<Job>],
    /// Its transitions, with their ids.
    pub(crate) transitions: &'a [(u64, Transition)],
    /// Its rests.
    pub(crate) rests: &'a [OpenRow],
    /// Jobs its writer accepted that have no entry yet (`None`: not the Director's writer).
    pub(crate) fresh: Option<&'a HashMap<JobId, Fresh>>,
    /// New jobs of the write whose entry goes in released (they go at once).
    pub(crate) released: &'a HashSet<JobId>,
}

/// What a batch changes in `open_jobs`: its rests, then each job's last row of the batch,
/// which replaces its entry or, when it is terminal, removes it (a job the writer knows has
/// none, `fresh`, removes nothing).
///
/// `executing` rows (JobDBs before schema 5 wrote them) are left out: an attempt's start
/// changes nothing there, so an entry holds a job's latest *resting* state.
pub(crate) fn open_changes(w: &Rows<'_>) -> OpenChanges {
    let mut changes = OpenChanges {
        open: Vec::new(),
        without_expiry: Vec::new(),
        closed: Vec::new(),
    };
    let mut last: HashMap<JobId, usize> = HashMap::with_capacity(w.transitions.len());
    for (i, (_, t)) in w.transitions.iter().enumerate() {
        if t.state != State::Executing {
            last.insert(t.job_id, i);
        }
    }
    let rested: HashMap<JobId, &OpenRow> = w.rests.iter().map(|r| (r.job_id, r)).collect();
    for r in w.rests {
        if !last.contains_key(&r.job_id) {
            if r.expire_at.is_none() {
                changes.without_expiry.push(r.job_id);
            }
            let mut r = r.clone();
            r.released |= r.place.is_some() && w.released.contains(&r.job_id);
            changes.open.push(r);
        }
    }
    if last.is_empty() {
        return changes;
    }
    let batch: HashMap<JobId, Fresh> = w.jobs.iter().map(|job| (job.id, Fresh::of(job))).collect();
    for (i, (id, t)) in w.transitions.iter().enumerate() {
        if last.get(&t.job_id) != Some(&i) {
            continue;
        }
        let fresh = w.fresh.and_then(|f| f.get(&t.job_id));
        let rest = rested.get(&t.job_id).copied();
        if t.state.is_terminal() {
            // A job the writer knows has no entry (accepted, never rested) deletes nothing
            // (its rest in this batch, if any, is not written).
            if fresh.is_none() || rest.is_some() {
                changes.closed.push(t.job_id);
            }
            continue;
        }
        let known = batch.get(&t.job_id);
        let expire_at = known
            .map(|f| f.expire_at)
            .or(rest.and_then(|r| r.expire_at))
            .or(fresh.map(|f| f.expire_at));
        let endpoint = known
            .map(|f| &f.endpoint)
            .or(rest.and_then(|r| r.endpoint.as_ref()))
            .or(fresh.map(|f| &f.endpoint))
            .cloned();
        let mut place = known
            .and_then(|f| f.place)
            .or(rest.and_then(|r| r.place))
            .or(fresh.and_then(|f| f.place));
        // A new job's entry is held unless its writer lets it go now; a fresh ordered job
        // with a row is under way (only a job under way gets one), as its rest says.
        let released = match known {
            Some(_) => w.released.contains(&t.job_id),
            None => rest.map_or(fresh.is_some(), |r| r.released),
        } && place.is_some();
        if t.state == State::Archiving {
            // Expiry and flush are ends: the entry stays for the archive, out of its sequence.
            place = None;
        }
        // The Director's writer knows every job it accepted and never rested (`fresh`);
        // any other job of its JobDB has an entry already, whose expiry stays. Elsewhere, or
        // for a rest that did not name it, a new entry reads its expiry from `jobs`.
        if expire_at.is_none() && (w.fresh.is_none() || rest.is_some()) {
            changes.without_expiry.push(t.job_id);
        }
        changes.open.push(OpenRow {
            job_id: t.job_id,
            transition_id: *id,
            state: t.state,
            attempts: t.attempts,
            retry_at: t.retry_at,
            expire_at,
            endpoint,
            place,
            released,
        });
    }
    changes
}
