//! The invariant of payloads (`payload`): a producer's job keeps the exact bytes its producer
//! gave, in every copy (each JobDB it passed through, the archive; a copy an erasure emptied
//! aside) and in every request an endpoint got for it, whatever form they crossed a forward
//! or a move in (a JSON value as itself, other bytes in base64).

use std::collections::HashMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use super::{v, Inputs, Tally};
use crate::histories::record::Violation;

/// The bytes a producer's job spec asks for: its `payload` as the request wrote it, or its
/// `payload_base64` decoded.
fn given(json: &serde_json::Value) -> Option<Vec<u8>> {
    match (json.get("payload"), json.get("payload_base64")) {
        (Some(value), None) => serde_json::to_vec(value).ok(),
        (None, Some(b64)) => STANDARD.decode(b64.as_str()?).ok(),
        _ => Some(Vec::new()),
    }
}

pub(super) fn payloads(i: &Inputs, out: &mut Vec<Violation>, tally: &mut Tally) {
    let now = chrono::Utc::now();
    let mut wanted: HashMap<String, Vec<u8>> = HashMap::new();
    for (id, s) in i.stored {
        if s.job.event.is_some() {
            // An event's job carries the event's envelope: `event-atomic` and the events'
            // checks look after those.
            continue;
        }
        let key = s.job.idempotency_key.as_deref().unwrap_or("");
        let Some(want) = i.log.specs.get(key).and_then(|spec| given(&spec.json)) else {
            continue;
        };
        if std::str::from_utf8(&want).is_err() {
            tally.binary_payloads += 1;
        }
        let erased = |place: &crate::histories::world::Place| {
            place.payload.is_empty()
                && !want.is_empty()
                && i.log
                    .erasures
                    .iter()
                    .any(|e| super::erasure::names(e, &s.job.bucket, s.job.created_at))
        };
        for place in s.places.iter().filter(|p| !erased(p)) {
            if place.payload[..] != want[..] {
                let what = format!(
                    "job {id} in {} keeps a payload of {} bytes ({:?}); its producer gave {} \
                     ({:?})",
                    place.jobdb,
                    place.payload.len(),
                    String::from_utf8_lossy(&place.payload),
                    want.len(),
                    String::from_utf8_lossy(&want)
                );
                v(out, "payload", now, Some(*id), what);
            }
        }
        wanted.insert(id.to_string(), want);
    }
    for a in i.arrivals {
        let (Some(want), Some(got)) = (wanted.get(&a.job), &a.payload) else {
            continue;
        };
        if got[..] != want[..] {
            let what = format!(
                "{} (attempt {}) arrived with {} bytes ({:?}); its producer gave {} ({:?})",
                a.job,
                a.attempt,
                got.len(),
                String::from_utf8_lossy(got),
                want.len(),
                String::from_utf8_lossy(want)
            );
            v(out, "payload", a.at, a.job.parse().ok(), what);
        }
    }
}
