//! Exporting spans over OTLP/HTTP (protobuf), configured by the standard `OTEL_*` variables,
//! through the reqwest client the rest of spindle uses (the exporter's own reqwest feature
//! would pull a second reqwest major).

use std::time::Duration;

use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;

/// Why traces cannot be exported as configured.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A variable asks for something spindle does not do (its name and value).
    #[error("{0}={1} is not supported: spindle exports traces over OTLP/HTTP with protobuf (http/protobuf)")]
    Unsupported(&'static str, String),
    /// A variable's value is not what it must be.
    #[error("{0}: {1}")]
    Invalid(&'static str, String),
    /// The exporter could not be built.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
}

/// The OTLP requests, sent on the process's Tokio runtime: the SDK's batch processor runs on
/// a thread of its own, outside the runtime.
#[derive(Debug)]
struct OtlpHttp {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    /// When a failed export was last logged (Unix seconds): at most one line a minute, however
    /// many batches a collector that is down refuses.
    warned_at: std::sync::atomic::AtomicU64,
}

impl OtlpHttp {
    /// Logs a failed export, unless one was logged less than a minute ago.
    fn warn(&self, why: &dyn std::fmt::Display) {
        use std::sync::atomic::Ordering;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.warned_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 60
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(error = %why, "traces: an export failed; its spans are dropped");
        }
    }
}

/// Most of an OTLP answer read: it is a small status message.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

#[async_trait::async_trait]
impl HttpClient for OtlpHttp {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = self
            .client
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .timeout(self.timeout)
            .body(body);
        let answer = self.runtime.spawn(async move {
            let mut response = request.send().await?;
            let status = response.status();
            let mut body = bytes::BytesMut::new();
            while body.len() < MAX_ANSWER_BYTES {
                match response.chunk().await? {
                    Some(chunk) => body.extend_from_slice(&chunk),
                    None => break,
                }
            }
            Ok::<_, reqwest::Error>((status, body.freeze()))
        });
        let (status, body) = match answer.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                self.warn(&format_args!("{e:?}"));
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        if !status.is_success() {
            self.warn(&format_args!("the collector answered {status}"));
        }
        Ok(http::Response::builder().status(status).body(body)?)
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether the variables ask for export: an OTLP endpoint is set, the SDK is not disabled and
/// the traces exporter is `otlp` (or unset). An unsupported protocol or exporter is an error.
pub fn export_wanted() -> Result<bool, TelemetryError> {
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(false),
        Some(other) => {
            return Err(TelemetryError::Unsupported(
                "OTEL_TRACES_EXPORTER",
                other.into(),
            ))
        }
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(protocol) = var(name).filter(|p| p != "http/protobuf") {
            return Err(TelemetryError::Unsupported(name, protocol));
        }
    }
    Ok(var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some())
}

/// The export timeout: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (milliseconds), else 10 s.
fn export_timeout() -> Result<Duration, TelemetryError> {
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ] {
        if let Some(ms) = var(name) {
            return ms
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| TelemetryError::Invalid(name, "must be milliseconds".into()));
        }
    }
    Ok(Duration::from_secs(10))
}

/// The tracer provider the variables describe: batching to the OTLP endpoint, sampled by
/// `OTEL_TRACES_SAMPLER`, named by `OTEL_SERVICE_NAME` (else `default_service`); or, without
/// export, one that records nothing but still gives every span a context to pass on.
pub(super) fn provider(default_service: &str) -> Result<(SdkTracerProvider, bool), TelemetryError> {
    if !export_wanted()? {
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::AlwaysOff)
            .build();
        return Ok((provider, false));
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let http = OtlpHttp {
        client,
        runtime: tokio::runtime::Handle::try_current()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?,
        timeout: export_timeout()?,
        warned_at: Default::default(),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(http)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let mut resource = Resource::builder();
    if var("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(default_service.to_string());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    Ok((provider, true))
}
