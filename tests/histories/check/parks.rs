//! The invariants of parks: a parked lane gets its probes and nothing more (`park-quiet`),
//! and an unparked one its re-drive's pace, not its whole backlog at once (`park-pace`).
//! Nothing a park holds may be lost or end early: `one-end`, `expiry-liveness` and
//! `key-order` hold the parked jobs to that as they do every job.
//!
//! Directors learn of a park through Consul within a second or two, and a Director that
//! starts again reads it once its controls watch has answered: requests within
//! [`GRACE_MS`] of a park, an unpark or a Director's return are not counted.

use chrono::{DateTime, Duration, Utc};

use super::{v, Inputs, Tally};
use crate::histories::parks::{PROBE_EVERY_SECS, REDRIVE_START};
use crate::histories::record::Violation;

/// Milliseconds after a change (a park, an unpark, a Director back) in which a Director may
/// not have seen it yet: its controls watch answers within milliseconds of a change, Consul
/// runs up to 400 ms late in the slow-Consul operation, and an attempt begun just before may
/// still be on its way.
const GRACE_MS: i64 = 1500;

pub(super) fn parks(i: &Inputs, out: &mut Vec<Violation>, tally: &mut Tally) {
    let log = i.log;
    let grace = Duration::milliseconds(GRACE_MS);
    // Windows in which some Director may not know the parks: it was down, or just back.
    let blind: Vec<(DateTime<Utc>, DateTime<Utc>)> = log
        .downs
        .iter()
        .map(|(_, from, until)| (*from, until.unwrap_or_else(Utc::now) + grace))
        .collect();
    let blind_in = |a: DateTime<Utc>, b: DateTime<Utc>| {
        blind.iter().any(|(from, until)| *from < b && *until > a)
    };
    let directors = i.directors.max(1) as f64;
    for park in &log.parks {
        tally.parks += 1;
        let path = format!("lane/{}", park.lane);
        let arrivals = |a: DateTime<Utc>, b: DateTime<Utc>| {
            i.arrivals
                .iter()
                .filter(|r| r.path == path && r.at >= a && r.at < b)
                .count()
        };
        // Parked: probes only.
        let from = park.parked_at + grace;
        let until = park.unparked_at.unwrap_or(park.seen_at);
        if from < until && !blind_in(from, until) {
            let secs = (until - from).num_milliseconds() as f64 / 1000.0;
            let allowed = directors * (secs / PROBE_EVERY_SECS + 2.0);
            let seen = arrivals(from, until);
            println!(
                "histories: lane {} parked {secs:.1} s: {seen} requests (probes allow {allowed:.0})",
                park.lane
            );
            if seen as f64 > allowed {
                v(
                    out,
                    "park-quiet",
                    from,
                    vec![],
                    format!(
                        "lane {} parked {:.1} s got {seen} requests (probes allow {allowed:.0})",
                        park.lane, secs
                    ),
                );
            }
        }
        // Unparked: the first second goes at the re-drive's first pace (its burst and one
        // second's worth), on each Director that knows.
        if let Some(u) = park.unparked_at {
            let end = u + Duration::seconds(1);
            if !blind_in(u - grace, end) {
                let allowed = directors * (2.0 * REDRIVE_START + 2.0);
                let seen = arrivals(u, end);
                if seen as f64 > allowed {
                    v(
                        out,
                        "park-pace",
                        u,
                        vec![],
                        format!(
                            "lane {} got {seen} requests in the second after its unpark (the \
                             pace allows {allowed:.0})",
                            park.lane
                        ),
                    );
                }
            }
        }
    }
}
