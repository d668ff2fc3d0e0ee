//! The invariants of erasure: once `spindle erase` says it finished every place, no job it
//! names is sent again (`erase-quiet`) and no copy of one keeps its payload (`erase-blank`).
//! A job it names is a job of its bucket created before its bound; one it ended in flight
//! ends `discarded` by an operator command, which `one-end` already accepts. A run that says
//! it did not finish (a JobDB it could not reach, a job that would not end in its wait)
//! promises nothing: its jobs are held to the other invariants only.

use chrono::Duration;

use super::{v, Inputs, Tally};
use crate::histories::record::{Erasure, Violation};

/// Milliseconds of clock between the endpoint's record of a request and the erase run's.
const SLACK_MS: i64 = 50;

/// Whether `e` names a job of `bucket` created at `created_at`.
pub(super) fn names(e: &Erasure, bucket: &str, created_at: chrono::DateTime<chrono::Utc>) -> bool {
    e.bucket == bucket && created_at < e.before
}

pub(super) fn erasures(i: &Inputs, out: &mut Vec<Violation>, tally: &mut Tally) {
    for e in i.log.erasures.iter().filter(|e| e.complete) {
        tally.erasures += 1;
        let after = e.finished + Duration::milliseconds(SLACK_MS);
        for a in i.arrivals.iter().filter(|a| a.at > after) {
            let Some(id) = a.job.parse().ok() else {
                continue;
            };
            let Some(s) = i.stored.get(&id) else { continue };
            if names(e, &s.job.bucket, s.job.created_at) {
                let what = format!(
                    "{} (attempt {}) arrived at {} after the erasure of bucket {} finished at {}",
                    a.job, a.attempt, a.at, e.bucket, e.finished
                );
                v(out, "erase-quiet", a.at, Some(id), what);
            }
        }
        for (id, s) in i.stored {
            if !names(e, &s.job.bucket, s.job.created_at) {
                continue;
            }
            for place in s.places.iter().filter(|p| !p.payload.is_empty()) {
                let what = format!(
                    "job {id} in {} keeps a payload of {} bytes after the erasure of bucket {} \
                     finished at {}",
                    place.jobdb,
                    place.payload.len(),
                    e.bucket,
                    e.finished
                );
                v(out, "erase-blank", e.finished, Some(*id), what);
            }
        }
    }
}
