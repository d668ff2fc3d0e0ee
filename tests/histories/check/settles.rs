//! The invariant of lapsed claims (`settles`): a key a router answers `pending` because an
//! earlier submission of it may have been stored (its router died before confirming) is
//! settled within seconds, whatever became of the JobDB that may hold it (retired, drained,
//! dropped: the drainer's id index answers for it). Producers give a key up after 40 tries
//! that stored nothing (ten seconds and more); none may be given up on that answer unless a
//! JobDB outage ran in the ten seconds before.

use chrono::Duration;

use super::{v, Inputs, Tally};
use crate::histories::record::{Outcome, Violation};

/// What a router answers while it cannot tell whether a lapsed claim's job was stored.
const LAPSED: &str = "may have been stored and cannot be checked now";

pub(super) fn settles(i: &Inputs, out: &mut Vec<Violation>, tally: &mut Tally) {
    tally.lapsed_waits = i
        .log
        .outcomes
        .values()
        .filter(|o| {
            o.iter()
                .any(|(_, o)| matches!(o, Outcome::NotStored(why) if why.contains(LAPSED)))
        })
        .count();
    for (key, at) in &i.log.gave_up {
        tally.given_up += 1;
        let outcomes = i.log.outcomes.get(key).map(Vec::as_slice).unwrap_or(&[]);
        let Some((via, Outcome::NotStored(why))) = outcomes.last() else {
            continue;
        };
        if !via.starts_with("router") || !why.contains(LAPSED) {
            continue;
        }
        let outage = i.log.outages.iter().any(|(from, until)| {
            *from <= *at && until.is_none_or(|u| u >= *at - Duration::seconds(10))
        });
        if !outage {
            v(
                out,
                "settles",
                *at,
                None,
                format!(
                    "key {key} given up after {} tries; the last answer, from {via}: {why}",
                    outcomes.len()
                ),
            );
        }
    }
}
