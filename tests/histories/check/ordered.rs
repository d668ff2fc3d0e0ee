//! Ordered keys: their order, their blocks, the attempts the JobDB listed as begun, and the
//! writer's book of sequences.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use spindle::job::JobId;

use super::{first_end, v, Inputs, Seen, Tally};
use crate::histories::record::{SeqKey, Violation};

/// Ordered keys keep their order, and blocked keys stay blocked until an operator releases
/// them.
pub(super) fn key_order(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let log = i.log;
    let Seen {
        by_job, by_spec, ..
    } = seen;
    // Ordered keys: job n+1 is not tried before job n ended, in acknowledged order. And
    // blocked keys: after a job that asked to block its key ends without success (not an
    // operator's choice), the key's next job is not tried before an operator released the
    // blocks; the quiet period deletes them every few seconds from its start on.
    let releases: Vec<DateTime<Utc>> = log
        .ops
        .iter()
        .filter(|(_, text)| text.contains(crate::histories::ops::RELEASES_BLOCKS))
        .map(|(at, _)| *at)
        .collect();
    let quiet_from = log
        .ops
        .iter()
        .find(|(_, text)| text.starts_with("quiet:"))
        .map(|(at, _)| *at);
    let released_between = |from: DateTime<Utc>, to: DateTime<Utc>| {
        quiet_from.is_some_and(|q| q <= to)
            || releases
                .iter()
                .any(|r| *r >= from - Duration::milliseconds(5) && *r <= to)
    };
    let mut order: BTreeMap<SeqKey, Vec<JobId>> = log.sequences.clone();
    for (key, seq) in &log.uncertain {
        for id in by_spec.get(key.as_str()).into_iter().flatten() {
            order.entry(seq.clone()).or_default().push(*id);
        }
    }
    for (seq, ids) in &order {
        tally.sequences += 1;
        tally.ordered_jobs += ids.len();
        for pair in ids.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let Some(first) = by_job.get(&b.to_string()).and_then(|l| l.first()) else {
                continue;
            };
            let stored_a = i.stored.get(&a);
            let end_a = stored_a.and_then(first_end);
            let blocks =
                stored_a.is_some_and(|s| s.job.ordering.as_ref().is_some_and(|o| o.blocks));
            if let Some(end) =
                end_a.filter(|e| blocks && spindle::jobdb::ordering::blocks_sequence(e))
            {
                if !released_between(end.time, first.at) {
                    v(
                        out,
                        "block-held",
                        first.at,
                        [b, a],
                        format!(
                            "key {}: job {b} tried at {} though job {a}, which blocks its key, ended {} ({}) at {} and no operator released the key between",
                            seq.key,
                            first.at.format("%H:%M:%S%.3f"),
                            end.state,
                            end.error_type.as_deref().unwrap_or("-"),
                            end.time.format("%H:%M:%S%.3f"),
                        ),
                    );
                }
            }
            let via = |id: JobId| {
                log.accepted
                    .get(&id)
                    .map_or("an unknown front".to_owned(), |x| {
                        format!("{} at {}", x.via, x.at.format("%H:%M:%S%.3f"))
                    })
            };
            let what = match end_a {
                Some(end) if end.time <= first.at + Duration::milliseconds(5) => continue,
                Some(end) => format!("ended {} at {}", end.state, end.time.format("%H:%M:%S%.3f")),
                None => "never ended".to_owned(),
            };
            v(
                out,
                "key-order",
                first.at,
                [b, a],
                format!(
                    "key {}: job {b} (acknowledged by {}) tried at {}; job {a} before it \
                     (acknowledged by {}) {what}",
                    seq.key,
                    via(b),
                    first.at.format("%H:%M:%S%.3f"),
                    via(a)
                ),
            );
        }
    }
}

/// Alone: every attempt that reached the endpoint was listed as begun by a commit.
pub(super) fn listed_attempts(
    i: &Inputs,
    _seen: &Seen,
    out: &mut Vec<Violation>,
    _tally: &mut Tally,
) {
    // Alone: every request that reached the endpoint was listed as begun, with its attempt
    // number, by a commit of the JobDB (durable before it was sent, fenced), whichever commit
    // began it: its own, or the one that ended the job before it in its key.
    if let Some(listed) = i.listed {
        for a in i.arrivals {
            let Ok(id) = a.job.parse::<JobId>() else {
                continue;
            };
            if i.stored.contains_key(&id) && !listed.contains(&(id, a.attempt)) {
                v(
                    out,
                    "unlisted",
                    a.at,
                    Some(id),
                    format!(
                        "job {id} arrived (attempt {}, {}) but no commit lists that attempt as begun",
                        a.attempt, a.path
                    ),
                );
            }
        }
    }
}

/// Alone: the writer's book of sequences names only heads the JobDB holds, and was used.
pub(super) fn book(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let now = seen.now;
    // Alone: the writer's book of its sequences never names a head the JobDB does not hold
    // waiting (kill -9, commit faults, commands, expiry, blocks and their release all leave it
    // right).
    if let Some(r) = i.remembered {
        (tally.released, tally.kept, tally.spilled) = (r.released, r.kept, r.spilled);
        if r.wrong > 0 {
            v(
                out,
                "misremembered",
                now,
                None,
                format!(
                    "the writer's book named {} of {} heads that were not held",
                    r.wrong, r.released
                ),
            );
        }
        // Keys with several jobs waiting wait in the book (kept): with no job kept, the key
        // order, expiry and command checks above would not have met that path at all.
        if tally.ordered_jobs >= 100 && r.kept == 0 {
            v(
                out,
                "kept",
                now,
                None,
                format!(
                    "{} ordered jobs and none kept in the writer's book: the path was not run",
                    tally.ordered_jobs
                ),
            );
        }
    }
}
