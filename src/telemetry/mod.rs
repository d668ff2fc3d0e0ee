//! Traces across the queue (OpenTelemetry): the W3C trace context a job carries
//! ([`TraceContext`]), the spans spindle makes, and their export over OTLP ([`install`]).
//!
//! A job is submitted in its producer's trace: the router's and the Director's request spans
//! and the commit are children of the producer's span (`traceparent` header). Its attempts
//! may run hours later, on another Director: each is the root of a trace of its own, **linked**
//! to the producer's span (stored with the job), and the receiver gets that attempt's
//! `traceparent`, so its own trace continues the attempt's.
//!
//! Export is off unless an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); spans are then not recorded, but still have a
//! context, so receivers get a `traceparent` either way. The spans go through the process-wide
//! OpenTelemetry tracer, so no configuration is threaded through the services.
//!
//! Names no other module of the crate.

pub mod context;
mod export;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::context::FutureExt;
use opentelemetry::global;
use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracerProvider;

pub use context::{InvalidTraceContext, TraceContext};
pub use export::{export_wanted, TelemetryError};
pub use opentelemetry::trace::Status;

/// The W3C header naming the caller's span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header carrying vendors' state along with it.
pub const TRACESTATE: &str = "tracestate";

/// The installed tracer provider: flushes what is left when the process ends.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

/// Installs the process-wide tracer from the standard variables (see [`export_wanted`]):
/// `default_service` names the process when `OTEL_SERVICE_NAME` does not. Needs a Tokio
/// runtime (the export requests run on it).
pub fn install(default_service: &str) -> Result<Telemetry, TelemetryError> {
    let (provider, exporting) = export::provider(default_service)?;
    global::set_tracer_provider(provider.clone());
    if exporting {
        tracing::info!(
            service = default_service,
            "traces: exporting over OTLP/HTTP"
        );
    }
    Ok(Telemetry { provider })
}

impl Telemetry {
    /// Sends the spans still batched and stops the exporter (off the runtime's threads: the
    /// SDK blocks while the export runs on the runtime).
    pub async fn shutdown(self) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "traces: the last export failed");
        }
    }
}

/// The process-wide tracer.
fn tracer() -> global::BoxedTracer {
    global::tracer("spindle")
}

/// The trace context of a request's `traceparent`/`tracestate` headers. One that is not W3C
/// trace context is ignored, as the specification asks (the request starts a trace of its
/// own); a bad `tracestate` alone drops only the state.
pub fn from_headers(headers: &HeaderMap) -> Option<TraceContext> {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let parent = text(TRACEPARENT)?;
    TraceContext::parse(parent, text(TRACESTATE))
        .or_else(|_| TraceContext::parse(parent, None))
        .ok()
}

/// Sets `traceparent` (and `tracestate`) on `headers` to name `cx`'s span.
pub fn to_headers(cx: &Context, headers: &mut HeaderMap) {
    let Some(tc) = TraceContext::of_span(cx.span().span_context()) else {
        return;
    };
    if let Ok(value) = HeaderValue::from_str(&tc.traceparent) {
        headers.insert(TRACEPARENT, value);
    }
    if let Some(Ok(value)) = tc.tracestate.as_deref().map(HeaderValue::from_str) {
        headers.insert(TRACESTATE, value);
    }
}

/// Middleware (`axum::middleware::from_fn`) of the routes that take work: runs each request
/// within its own span ([`request_span`]), the current context of everything it awaits, so
/// the spans it makes ([`current_child`]) are children of it; ends it with the answer's
/// status.
pub async fn trace_request(request: Request, next: Next) -> Response {
    let route = match request.extensions().get::<MatchedPath>() {
        Some(path) => path.as_str().to_owned(),
        None => request.uri().path().to_owned(),
    };
    let cx = request_span(request.method().as_str(), &route, request.headers());
    let response = next.run(request).with_context(cx.clone()).await;
    end_request(&cx, response.status().as_u16());
    response
}

/// A span within the current one (a router's forward, a commit): see [`trace_request`].
pub fn current_child(name: &'static str, kind: SpanKind, attributes: Vec<KeyValue>) -> Context {
    child_span(&Context::current(), name, kind, attributes)
}

/// The span of a request that arrives (`POST /v1/jobs`, a server span), a child of the
/// caller's span when its headers name one.
pub fn request_span(method: &str, route: &str, headers: &HeaderMap) -> Context {
    let parent = match from_headers(headers) {
        Some(tc) => Context::new().with_remote_span_context(tc.span_context()),
        None => Context::new(),
    };
    let tracer = tracer();
    let span = tracer
        .span_builder(format!("{method} {route}"))
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("http.route", route.to_owned()),
        ])
        .start_with_context(&tracer, &parent);
    parent.with_span(span)
}

/// A span within `parent`'s.
fn child_span(
    parent: &Context,
    name: &'static str,
    kind: SpanKind,
    attributes: Vec<KeyValue>,
) -> Context {
    let tracer = tracer();
    let span = tracer
        .span_builder(name)
        .with_kind(kind)
        .with_attributes(attributes)
        .start_with_context(&tracer, parent);
    parent.with_span(span)
}

/// The span of one delivery attempt: the root of a trace of its own (a retry may run hours
/// after the submission), linked to the producer's span when the job carries one. Its
/// `attributes` are made only for a span that is recorded (sampled, exported): an attempt
/// that is not costs two ids and no allocation of them.
pub fn attempt_span(
    name: String,
    link: Option<&TraceContext>,
    attributes: impl FnOnce() -> Vec<KeyValue>,
) -> Context {
    let tracer = tracer();
    let mut builder = tracer.span_builder(name).with_kind(SpanKind::Client);
    if let Some(tc) = link {
        builder = builder.with_links(vec![opentelemetry::trace::Link::with_context(
            tc.span_context(),
        )]);
    }
    let root = Context::new();
    let cx = root.with_span(builder.start_with_context(&tracer, &root));
    if cx.span().is_recording() {
        cx.span().set_attributes(attributes());
    }
    cx
}

/// Ends a request's span with its answer's status (an error status for a 5xx).
pub fn end_request(cx: &Context, status: u16) {
    let span = cx.span();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if status >= 500 {
        span.set_attribute(KeyValue::new("error.type", status.to_string()));
        span.set_status(Status::error(format!("answered {status}")));
    }
    span.end();
}

/// Ends a span of a step (a forward, a commit), failed with `error` if there is one.
pub fn end_step(cx: &Context, error: Option<String>) {
    let span = cx.span();
    if let Some(error) = error {
        span.set_status(Status::error(error));
    }
    span.end();
}
