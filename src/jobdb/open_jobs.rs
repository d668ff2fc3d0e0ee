//! The `open_jobs` entries a write keeps in step: each unfinished job's latest resting state,
//! what a new entry takes from its job ([`Fresh`]), and what one write changes there
//! (`open_changes`: entries replaced, new ones without a known expiry, entries deleted, and
//! the jobs and sequences that leave their ordered sequence). No SQL: `write::write_path!`
//! writes what this computes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::write::Append;
use super::BlockedKey;
use crate::job::{Job, JobId, Place, Seq, State, Transition};

/// A job its writer accepted that has no `open_jobs` entry yet: what its first entry takes
/// from it.
#[derive(Clone, Debug)]
pub struct Fresh {
    /// Its `expire_at`.
    pub expire_at: DateTime<Utc>,
    /// Its endpoint, shared with the job: the entry's lane is cut from it.
    pub endpoint: Arc<str>,
    /// Its ordered sequence and position, if any. An ordered job is fresh when it was born
    /// released (its sequence was empty: it is under way, and its first entry says so), when
    /// it is *kept* (below), or when a kept job went on from memory (under way).
    pub place: Option<Place>,
    /// An ordered job *kept*: held in its writer's memory only, behind its sequence's job
    /// under way, instead of entered held (see [`super::KnownSequences`]). Its first entry
    /// goes in held.
    pub kept: bool,
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
            kept: false,
            blocking: job
                .ordering
                .as_ref()
                .filter(|o| o.blocks)
                .map(|o| (job.bucket.clone(), o.key.clone())),
        }
    }

    /// The block a fresh ordered job's end `t` writes, if it blocks its key (see
    /// [`super::ordering::blocks_sequence`]).
    fn block(&self, t: &Transition) -> Option<BlockedKey> {
        let (bucket, key) = self.blocking.as_ref()?;
        super::ordering::blocks_sequence(t).then(|| BlockedKey {
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
    /// way already (born released, and fresh until now).
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

    /// The same entry going in released, when it has a sequence: for a job that was fresh
    /// and under way (born released, or a kept job gone on).
    pub fn under_way(mut self) -> Self {
        self.released = self.place.is_some();
        self
    }

    /// The entry of a fresh job that rests now: an ordered one goes in released (under way)
    /// unless it is kept (held, waiting for its turn).
    pub fn rest_of_fresh(job_id: JobId, id: u64, fresh: Fresh) -> Self {
        let kept = fresh.kept;
        let rest = OpenRow::resting(job_id, id, Some(fresh));
        match kept {
            true => rest,
            false => rest.under_way(),
        }
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
    /// Jobs that leave their sequence, if they have one: those `closed`, and those moving to
    /// `archiving` (which keep their entry for the archive).
    pub(crate) leaving: Vec<JobId>,
    /// Sequences known here of jobs leaving them (their entry may be new in this batch).
    pub(crate) left: Vec<Seq>,
    /// Keys that fresh ordered jobs block as they end (no entry of theirs names them).
    pub(crate) blocked: Vec<BlockedKey>,
    /// Sequences a fresh ordered job leaves (also in `left`): their job under way, which
    /// only the writer knew of, is gone.
    pub(crate) fresh_left: HashSet<Seq>,
}

/// What a batch changes in `open_jobs`: its rests, then each job's last row of the batch,
/// which replaces its entry or, when it is terminal, removes it (a job the writer knows has
/// none, `fresh`, removes nothing).
///
/// `executing` rows (JobDBs before schema 5 wrote them) are left out: an attempt's start
/// changes nothing there, so an entry holds a job's latest *resting* state.
pub(crate) fn open_changes(append: &Append<'_>) -> OpenChanges {
    let mut changes = OpenChanges {
        open: Vec::new(),
        without_expiry: Vec::new(),
        closed: Vec::new(),
        leaving: Vec::new(),
        left: Vec::new(),
        blocked: Vec::new(),
        fresh_left: HashSet::new(),
    };
    let mut last: HashMap<JobId, usize> = HashMap::with_capacity(append.transitions.len());
    for (i, (_, t)) in append.transitions.iter().enumerate() {
        if t.state != State::Executing {
            last.insert(t.job_id, i);
        }
    }
    let rested: HashMap<JobId, &OpenRow> = append.rests.iter().map(|r| (r.job_id, r)).collect();
    for r in append.rests {
        if !last.contains_key(&r.job_id) {
            if r.expire_at.is_none() {
                changes.without_expiry.push(r.job_id);
            }
            changes.open.push(r.clone());
        }
    }
    if last.is_empty() {
        return changes;
    }
    let batch: HashMap<JobId, Fresh> = append
        .jobs
        .iter()
        .map(|job| (job.id, Fresh::of(job)))
        .collect();
    for (i, (id, t)) in append.transitions.iter().enumerate() {
        if last.get(&t.job_id) != Some(&i) {
            continue;
        }
        let fresh = append.fresh.and_then(|f| f.get(&t.job_id));
        let rest = rested.get(&t.job_id).copied();
        if t.state.is_terminal() {
            // A job the writer knows has no entry (accepted, never rested) deletes nothing
            // (its rest in this batch, if any, is not written); a fresh ordered one leaves its
            // sequence all the same, from what the writer knows.
            match fresh {
                Some(f) => changes.leave_fresh(f, t),
                None => changes.leaving.push(t.job_id),
            }
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
        // A fresh ordered job (born released) is under way: its first entry says so (as its
        // rest in this batch, if any, does).
        let released =
            known.is_none() && place.is_some() && rest.map_or(fresh.is_some(), |r| r.released);
        if t.state == State::Archiving {
            // Expiry and flush are ends: the job leaves its sequence now, so the next goes.
            match fresh {
                Some(f) if known.is_none() => changes.leave_fresh(f, t),
                _ => changes.leaving.push(t.job_id),
            }
            changes.left.extend(place.take().map(|p| p.seq));
        }
        // The Director's writer knows every job it accepted and never rested (`fresh`);
        // any other job of its JobDB has an entry already, whose expiry stays. Elsewhere, or
        // for a rest that did not name it, a new entry reads its expiry from `jobs`.
        if expire_at.is_none() && (append.fresh.is_none() || rest.is_some()) {
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

impl OpenChanges {
    /// A fresh job `f` ends or moves to `archiving` by `t`: an ordered one leaves its
    /// sequence, and may block it, from what the writer knows (it has no entry to read).
    fn leave_fresh(&mut self, f: &Fresh, t: &Transition) {
        if let Some(place) = f.place {
            if t.state.is_terminal() {
                self.left.push(place.seq);
            }
            self.fresh_left.insert(place.seq);
            self.blocked.extend(f.block(t));
        }
    }
}
