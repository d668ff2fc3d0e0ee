//! The invariant of traces (`trace`): every copy of a job (each JobDB it passed through, the
//! archive) keeps the `traceparent` its producer gave, and every request an endpoint got
//! names an attempt's span of its own: a W3C `traceparent`, no two requests the same span,
//! never the producer's trace (an attempt is a trace of its own, linked to it).

use std::collections::HashSet;

use spindle::telemetry::TraceContext;

use super::{v, Inputs, Tally};
use crate::histories::record::Violation;

pub(super) fn traces(i: &Inputs, out: &mut Vec<Violation>, tally: &mut Tally) {
    let now = chrono::Utc::now();
    let mut producers: std::collections::HashMap<String, String> = Default::default();
    for (id, s) in i.stored {
        let key = s.job.idempotency_key.as_deref().unwrap_or("");
        let Some(spec) = i.log.specs.get(key) else {
            continue;
        };
        let want = spec.json.get("traceparent").and_then(|t| t.as_str());
        if let Some(want) = want {
            tally.traced += 1;
            producers.insert(id.to_string(), want[3..35].to_owned());
        }
        for place in &s.places {
            if place.traceparent.as_deref() != want {
                v(
                    out,
                    "trace",
                    now,
                    Some(*id),
                    format!(
                        "job {id} in {} keeps traceparent {:?}; its producer gave {want:?}",
                        place.jobdb, place.traceparent
                    ),
                );
            }
        }
    }
    let mut spans = HashSet::new();
    for a in i.arrivals {
        let job = a.job.parse().ok();
        let Some(header) = &a.traceparent else {
            v(
                out,
                "trace",
                a.at,
                job,
                format!(
                    "{} (attempt {}) came without a traceparent",
                    a.job, a.attempt
                ),
            );
            continue;
        };
        let Ok(span) = TraceContext::parse(header, None) else {
            let what = format!("{} came with traceparent {header:?}, not W3C", a.job);
            v(out, "trace", a.at, job, what);
            continue;
        };
        if !spans.insert(span.span_id().to_owned()) {
            let what = format!(
                "{} (attempt {}) names span {header} again",
                a.job, a.attempt
            );
            v(out, "trace", a.at, job, what);
        }
        if producers.get(&a.job).map(String::as_str) == Some(span.trace_id()) {
            let what = format!("{} attempt {} is in its producer's trace", a.job, a.attempt);
            v(out, "trace", a.at, job, what);
        }
    }
}
