//! W3C trace context (`traceparent`, `tracestate`) as a job carries it: checked once when it
//! arrives, stored with the job, and turned back into the span context a job's attempts link
//! to.

use std::str::FromStr;
use std::sync::Arc;

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// Length of a version-00 `traceparent` (`00-` + 32 + `-` + 16 + `-` + 2).
pub const TRACEPARENT_LEN: usize = 55;
/// Longest `tracestate` kept (the W3C limit a vendor must pass on).
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// The trace a job was submitted in: the producer's span, as W3C `traceparent` and
/// `tracestate` text. Stored with the job (`jobs.traceparent`, `jobs.tracestate`), moved and
/// archived with it, so an attempt made hours later, by another Director, still links to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-{trace id}-{parent span id}-{flags}`, lower-case hex, 55 characters.
    pub traceparent: Arc<str>,
    /// The vendors' list that travels with it, if any.
    pub tracestate: Option<Arc<str>>,
}

/// Which half of a trace context is not W3C trace context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTraceContext {
    /// `traceparent` is not `{version}-{32 hex}-{16 hex}-{2 hex}` with non-zero ids.
    #[error("traceparent must be W3C trace context: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, ids not all zero")]
    Traceparent,
    /// `tracestate` is not a W3C list of at most 512 bytes.
    #[error("tracestate must be a W3C list of key=value members, at most 512 bytes")]
    Tracestate,
}

impl InvalidTraceContext {
    /// The field (or header) named in the error.
    pub fn field(self) -> &'static str {
        match self {
            InvalidTraceContext::Traceparent => "traceparent",
            InvalidTraceContext::Tracestate => "tracestate",
        }
    }
}

fn lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl TraceContext {
    /// Checks `traceparent` (and `tracestate`) as W3C trace context. A version after `00` is
    /// read as its first 55 characters, which the specification keeps compatible; the
    /// stored text is then that prefix, as version `00`.
    pub fn parse(
        traceparent: &str,
        tracestate: Option<&str>,
    ) -> Result<TraceContext, InvalidTraceContext> {
        let bad = InvalidTraceContext::Traceparent;
        let head = traceparent.get(..TRACEPARENT_LEN).ok_or(bad)?;
        let version = &head[..2];
        let exact = traceparent.len() == TRACEPARENT_LEN;
        let extended = traceparent.as_bytes().get(TRACEPARENT_LEN) == Some(&b'-');
        let fields: Vec<&str> = head.split('-').collect();
        let [_, trace, span, flags] = fields[..] else {
            return Err(bad);
        };
        let well_formed = lower_hex(version)
            && version != "ff"
            && (exact || (version != "00" && extended))
            && trace.len() == 32
            && span.len() == 16
            && flags.len() == 2
            && lower_hex(trace)
            && lower_hex(span)
            && lower_hex(flags)
            && trace.bytes().any(|b| b != b'0')
            && span.bytes().any(|b| b != b'0');
        if !well_formed {
            return Err(bad);
        }
        let tracestate = match tracestate.map(str::trim).filter(|s| !s.is_empty()) {
            None => None,
            Some(state) => {
                if state.len() > MAX_TRACESTATE_BYTES || TraceState::from_str(state).is_err() {
                    return Err(InvalidTraceContext::Tracestate);
                }
                Some(Arc::from(state))
            }
        };
        Ok(TraceContext {
            traceparent: format!("00-{trace}-{span}-{flags}").into(),
            tracestate,
        })
    }

    /// The context of a span, to send on as `traceparent`/`tracestate`; `None` for an
    /// invalid one (no tracer installed).
    pub fn of_span(span: &SpanContext) -> Option<TraceContext> {
        if !span.is_valid() {
            return None;
        }
        let state = span.trace_state().header();
        Some(TraceContext {
            traceparent: format!(
                "00-{}-{}-{:02x}",
                span.trace_id(),
                span.span_id(),
                span.trace_flags().to_u8()
            )
            .into(),
            tracestate: (!state.is_empty()).then(|| state.into()),
        })
    }

    /// The producer's span as a remote span context (what an attempt links to).
    pub fn span_context(&self) -> SpanContext {
        let part = |range: std::ops::Range<usize>| self.traceparent.get(range).unwrap_or("");
        let trace = TraceId::from_hex(part(3..35)).unwrap_or(TraceId::INVALID);
        let span = SpanId::from_hex(part(36..52)).unwrap_or(SpanId::INVALID);
        let flags = u8::from_str_radix(part(53..55), 16).unwrap_or(0);
        let state = self
            .tracestate
            .as_deref()
            .and_then(|s| TraceState::from_str(s).ok())
            .unwrap_or_default();
        SpanContext::new(trace, span, TraceFlags::new(flags), true, state)
    }

    /// The `traceparent` and `tracestate` fields of a job's wire forms (views, imports, the
    /// archive) for `trace`.
    pub fn fields(trace: Option<&TraceContext>) -> (Option<String>, Option<String>) {
        match trace {
            Some(t) => (
                Some(t.traceparent.to_string()),
                t.tracestate.as_deref().map(str::to_owned),
            ),
            None => (None, None),
        }
    }

    /// Its trace id, 32 hex digits.
    pub fn trace_id(&self) -> &str {
        self.traceparent.get(3..35).unwrap_or("")
    }

    /// The producer's span id, 16 hex digits.
    pub fn span_id(&self) -> &str {
        self.traceparent.get(36..52).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn w3c_examples_parse_and_bad_ones_do_not() {
        let tc = TraceContext::parse(GOOD, Some("congo=t61rcWkgMzE")).expect("valid");
        assert_eq!(&*tc.traceparent, GOOD);
        assert_eq!(tc.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tc.span_id(), "00f067aa0ba902b7");
        let sc = tc.span_context();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(TraceContext::of_span(&sc).expect("valid"), tc);
        // A later version: its 55-character prefix, stored as version 00.
        let later = format!("{}-extra", GOOD.replacen("00", "01", 1));
        assert_eq!(
            &*TraceContext::parse(&later, None)
                .expect("valid")
                .traceparent,
            GOOD
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(
                TraceContext::parse(bad, None),
                Err(InvalidTraceContext::Traceparent),
                "{bad}"
            );
        }
        for bad in ["a=b=c", &"k=v,".repeat(200), "UPPER=x"] {
            assert_eq!(
                TraceContext::parse(GOOD, Some(bad)),
                Err(InvalidTraceContext::Tracestate),
                "{bad}"
            );
        }
    }
}
