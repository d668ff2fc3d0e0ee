//! What the API, the final listing and `/readyz` say, against SQL and against what happened.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, Utc};
use spindle::job::JobId;

use super::{is_end, v, Inputs, Seen, Tally};
use crate::histories::record::Violation;

/// The API agrees with SQL.
pub(super) fn api(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let now = seen.now;
    let ours = &seen.ours;
    // The API agrees with SQL.
    for (id, s) in i.stored.iter().filter(|(id, s)| {
        ours.contains(id)
            && !s
                .job
                .idempotency_key
                .as_deref()
                .unwrap_or("")
                .starts_with("notice:")
    }) {
        let Some((status, state)) = i.api.get(id) else {
            continue;
        };
        tally.api_checked += 1;
        let Some(end_place) = s
            .places
            .iter()
            .find(|p| p.history.iter().any(|t| is_end(t.state)))
        else {
            // Never ended: reported as such.
            continue;
        };
        let end_place = Some(end_place);
        let sql = end_place
            .and_then(|p| p.history.last())
            .map(|t| t.state.as_str());
        match (*status, state.as_deref(), sql) {
            (200, Some(api), Some(sql)) if api == sql => {}
            (200, Some("archiving"), Some("archived"))
            | (200, Some("archived"), Some("archiving")) => {}
            (404, _, _) if end_place.is_none_or(|p| !i.active.contains(&p.jobdb)) => {}
            (status, api, sql) => v(
                out,
                "api",
                now,
                Some(*id),
                format!("job {id}: the API answers {status} {api:?}, SQL says {sql:?}"),
            ),
        }
    }
}

/// The final listing holds the served JobDBs' jobs once each, in order, as SQL says.
pub(super) fn listing(i: &Inputs, seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let now = seen.now;
    // The listing at the end holds exactly the jobs of the JobDBs Directors serve, once each,
    // in id order, in the state SQL says.
    match i.listing {
        Err(why) => v(
            out,
            "list",
            now,
            None,
            format!("the final listing failed: {why}"),
        ),
        Ok(listed) => {
            tally.listed = listed.len();
            if let Some(w) = listed.windows(2).find(|w| w[0].0 >= w[1].0) {
                let what = format!("{} listed after {} (oldest first)", w[1].0, w[0].0);
                v(out, "list", now, w[1].0.parse().ok(), what);
            }
            let by_id: HashMap<&str, &str> = listed
                .iter()
                .map(|(id, s)| (id.as_str(), s.as_str()))
                .collect();
            for (id, s) in i.stored {
                let Some(place) = s.places.iter().find(|p| i.active.contains(&p.jobdb)) else {
                    continue;
                };
                let sql = place.history.last().map(|t| t.state.as_str());
                match (by_id.get(id.to_string().as_str()), sql) {
                    (Some(api), Some(sql)) if *api == sql => {}
                    (Some(&"archived"), Some("archiving"))
                    | (Some(&"archiving"), Some("archived")) => {}
                    (listed, sql) => v(
                        out,
                        "list",
                        now,
                        Some(*id),
                        format!(
                            "job {id} of {}: listed as {listed:?}, SQL says {sql:?}",
                            place.jobdb
                        ),
                    ),
                }
            }
            for (id, _) in listed {
                let held = id
                    .parse::<JobId>()
                    .ok()
                    .and_then(|j| i.stored.get(&j))
                    .is_some_and(|s| s.places.iter().any(|p| i.active.contains(&p.jobdb)));
                if !held {
                    v(
                        out,
                        "list",
                        now,
                        id.parse().ok(),
                        format!("job {id} listed, held by no served JobDB"),
                    );
                }
            }
        }
    }
}

/// Readiness: ready exactly when it accepts.
pub(super) fn readiness(i: &Inputs, _seen: &Seen, out: &mut Vec<Violation>, tally: &mut Tally) {
    let log = i.log;
    // Readiness: ready exactly when it accepts.
    let mut by_director: BTreeMap<&str, Vec<&crate::histories::record::ReadySample>> =
        BTreeMap::new();
    for r in &log.readiness {
        by_director.entry(r.director.as_str()).or_default().push(r);
        tally.readiness_samples += 1;
    }
    for (director, samples) in by_director {
        // A stretch of samples that answered ready yet took no job (refused, or no answer in
        // 3 s), or answered not ready yet took one: two in a row spanning 2 s or more.
        let mut stretch: Option<(DateTime<Utc>, usize, bool)> = None;
        for s in samples {
            let ready = s.ready_before && s.ready_after;
            let not_ready = !s.ready_before && !s.ready_after;
            let odd = if ready && s.accepted != Some(true) {
                Some(true)
            } else if not_ready && s.accepted == Some(true) {
                Some(false)
            } else {
                None
            };
            stretch = match (stretch, odd) {
                (Some((from, n, kind)), Some(k)) if k == kind => Some((from, n + 1, kind)),
                (_, Some(k)) => Some((s.at, 1, k)),
                (_, None) => None,
            };
            if let Some((from, n, kind)) = stretch {
                if n >= 2 && s.at - from >= Duration::seconds(2) {
                    let span = format!(
                        "from {} to {} ({n} samples)",
                        from.format("%H:%M:%S%.3f"),
                        s.at.format("%H:%M:%S%.3f")
                    );
                    let what = if kind {
                        format!(
                            "{director} answered /readyz 200 {span} but took no job (last: {:?})",
                            s.accepted
                        )
                    } else {
                        format!("{director} answered /readyz 503 {span} but took jobs")
                    };
                    v(out, "readiness", from, None, what);
                    stretch = None;
                }
            }
        }
    }
}
