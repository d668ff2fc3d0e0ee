//! Delivery: the HTTP client, one attempt of one job, and what its result means.
//!
//! No SQL and no scheduling here. [`Deliverer::attempt`] sends a job once (redirects are never
//! followed), reads at most a bounded prefix of the answer, and returns a typed
//! [`classify::Verdict`] plus what goes on the transition row. When to retry is
//! [`backoff::delay`], a pure function.

pub mod backoff;
pub mod classify;
pub mod guard;
pub mod signing;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chrono::Utc;
use reqwest::header::RETRY_AFTER;

use crate::job::{AttemptRecord, ErrorType, Job};
use crate::telemetry::{self, TraceContext};
use classify::{classify_status, parse_retry_after, Verdict};
use guard::{AddressPolicy, Blocked, GuardedResolver};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::KeyValue;

/// Header carrying the job id on every delivery, so receivers can deduplicate.
pub const JOB_ID_HEADER: &str = "spindle-job-id";
/// Header carrying the 1-based attempt number on every delivery.
pub const ATTEMPT_HEADER: &str = "spindle-attempt";
/// Header naming the event an event's job delivers.
pub const EVENT_ID_HEADER: &str = "spindle-event-id";
/// Header naming that event's type.
pub const EVENT_TYPE_HEADER: &str = "spindle-event-type";
/// Header naming the subscription the job delivers it to.
pub const SUBSCRIPTION_ID_HEADER: &str = "spindle-subscription-id";

/// Settings of the delivery client.
#[derive(Clone, Debug)]
pub struct DeliveryConfig {
    /// The most of a response body read (the rest is dropped with the connection).
    pub max_response_bytes: usize,
    /// The most of a failed response recorded on its transition.
    pub max_error_response_bytes: usize,
    /// Longest wait for a TCP (and TLS) connection, within the job's own timeout.
    pub connect_timeout: Duration,
    /// Subnets deliveries may reach even though they are special-purpose (loopback, private,
    /// ...); everything else special is blocked (see [`guard`]).
    pub allow_subnets: Vec<ipnet::IpNet>,
    /// Which secrets sign which jobs (none by default).
    pub signing: Arc<signing::SigningConfig>,
    /// Where an event's job finds its subscription's secret (`None`: no control database).
    pub subscriptions: Option<Arc<dyn signing::SubscriptionSecrets>>,
    /// Buckets whose receivers get no `traceparent` header (every other one does).
    pub untraced_buckets: std::collections::HashSet<String>,
}

/// The default most of a response body read.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            max_response_bytes: MAX_RESPONSE_BYTES,
            max_error_response_bytes: 4 * 1024,
            connect_timeout: Duration::from_secs(10),
            allow_subnets: Vec::new(),
            signing: Arc::default(),
            subscriptions: None,
            untraced_buckets: Default::default(),
        }
    }
}

/// The result of one attempt: what to do next, and what to record.
#[derive(Clone, Debug)]
pub struct AttemptResult {
    /// Succeeded, discard, or retry.
    pub verdict: Verdict,
    /// Status, error text and duration for the transition row.
    pub record: AttemptRecord,
}

/// Sends jobs over HTTP with one shared connection pool.
#[derive(Clone, Debug)]
pub struct Deliverer {
    client: reqwest::Client,
    config: DeliveryConfig,
    policy: Arc<AddressPolicy>,
}

impl Deliverer {
    /// Builds the client: rustls, no redirects, no proxy from the environment, and name
    /// resolution through the address guard.
    pub fn new(config: DeliveryConfig) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(AddressPolicy::new(config.allow_subnets.clone()));
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver::new(policy.clone())))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("spindle/", env!("CARGO_PKG_VERSION")))
            .pool_max_idle_per_host(1024)
            .pool_idle_timeout(Duration::from_secs(60))
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .no_proxy()
            .build()?;
        Ok(Deliverer {
            client,
            config,
            policy,
        })
    }

    /// The verdict for a job whose endpoint names a blocked address: discarded, never retried.
    fn blocked(&self, blocked: &Blocked, started: Instant) -> AttemptResult {
        AttemptResult {
            verdict: Verdict::Discard {
                error_type: ErrorType::BlockedAddress,
            },
            record: AttemptRecord {
                error_type: Some(ErrorType::BlockedAddress.into()),
                error_response: Some(Bytes::from(blocked.to_string())),
                response_status: None,
                duration: Some(started.elapsed()),
                started: None,
            },
        }
    }

    /// The verdict for an event's job whose subscription's secret is not known here: not
    /// sent (it would go unsigned, or signed with another secret), retried after its backoff.
    fn unknown_subscription(&self, subscription: &ulid::Ulid, started: Instant) -> AttemptResult {
        AttemptResult {
            verdict: Verdict::Retry {
                error_type: ErrorType::UnknownSubscription,
                retry_after: None,
            },
            record: AttemptRecord {
                error_type: Some(ErrorType::UnknownSubscription.into()),
                error_response: Some(Bytes::from(format!(
                    "subscription {subscription} is not known to this director (no control \
                     database, or not read yet): not sent"
                ))),
                response_status: None,
                duration: Some(started.elapsed()),
                started: None,
            },
        }
    }

    /// Makes attempt number `attempt` (1-based) of `job`, in a span of its own (HTTP client
    /// semantic conventions) linked to the trace the job was submitted in; its receiver gets
    /// that span as `traceparent` unless the bucket or subscription said no.
    pub async fn attempt(&self, job: &Job, attempt: u16) -> AttemptResult {
        let span = telemetry::attempt_span(job.method.to_string(), job.trace.as_ref(), || {
            attempt_attributes(job, attempt)
        });
        let propagate = !self.config.untraced_buckets.contains(&*job.bucket)
            && match (&job.event, &self.config.subscriptions) {
                (Some(e), Some(subscriptions)) => subscriptions.sends_traceparent(&e.subscription),
                _ => true,
            };
        let trace = propagate
            .then(|| TraceContext::of_span(span.span().span_context()))
            .flatten();
        let result = self.attempt_in(job, attempt, trace.as_ref()).await;
        let span_of = span.span();
        if span_of.is_recording() {
            let record = &result.record;
            if let Some(status) = record.response_status {
                span_of.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
            }
            // `error.type` is the status of an error answer (semantic conventions), else the
            // kind of failure; spindle's own classification is `spindle.error_type`.
            if let Some(kind) = &record.error_type {
                let shown = match record.response_status {
                    Some(status) => status.to_string(),
                    None => kind.clone(),
                };
                span_of.set_attribute(KeyValue::new("error.type", shown));
                span_of.set_attribute(KeyValue::new("spindle.error_type", kind.clone()));
                span_of.set_status(telemetry::Status::error(kind.clone()));
            }
        }
        span_of.end();
        result
    }

    async fn attempt_in(
        &self,
        job: &Job,
        attempt: u16,
        trace: Option<&TraceContext>,
    ) -> AttemptResult {
        let started = Instant::now();
        // IP literals are not resolved by the client: check them here. The URL parser has
        // already normalised decimal, octal, hex and short IPv4 forms.
        let url = reqwest::Url::parse(&job.endpoint).ok();
        if let Some(url) = &url {
            let literal = match url.host() {
                Some(url::Host::Ipv4(v4)) => Some(std::net::IpAddr::V4(v4)),
                Some(url::Host::Ipv6(v6)) => Some(std::net::IpAddr::V6(v6)),
                _ => None,
            };
            if let Some(Err(blocked)) = literal.map(|ip| self.policy.check(ip)) {
                return self.blocked(&blocked, started);
            }
        }
        let method =
            reqwest::Method::from_bytes(job.method.as_bytes()).unwrap_or(reqwest::Method::POST);
        // Parsed once: the client would parse the text again.
        let request = match url {
            Some(url) => self.client.request(method, url),
            None => self.client.request(method, &*job.endpoint),
        };
        let mut request = request
            .timeout(job.execution_timeout)
            .body(job.payload.clone());
        for (name, value) in &job.headers {
            request = request.header(name, value);
        }
        let id = job.id.to_string();
        // An event's job is signed with its subscription's secret, the configured ones
        // otherwise.
        let mut own = None;
        if let Some(e) = &job.event {
            request = request
                .header(EVENT_ID_HEADER, e.event_id.to_string())
                .header(EVENT_TYPE_HEADER, &*e.event_type)
                .header(SUBSCRIPTION_ID_HEADER, e.subscription.to_string());
            own = self
                .config
                .subscriptions
                .as_ref()
                .and_then(|s| s.secret(&e.subscription));
            if own.is_none() {
                return self.unknown_subscription(&e.subscription, started);
            }
        }
        let secrets = match &own {
            Some(secret) => std::slice::from_ref(secret),
            None => self.config.signing.secrets_for(job),
        };
        if !secrets.is_empty() {
            let timestamp = Utc::now().timestamp();
            request = request
                .header(signing::ID_HEADER, &id)
                .header(signing::TIMESTAMP_HEADER, timestamp)
                .header(
                    signing::SIGNATURE_HEADER,
                    signing::sign(secrets, &id, timestamp, &job.payload),
                );
        }
        request = request
            .header(JOB_ID_HEADER, id)
            .header(ATTEMPT_HEADER, attempt);
        if let Some(trace) = trace {
            request = request.header(telemetry::TRACEPARENT, &*trace.traceparent);
            if let Some(state) = &trace.tracestate {
                request = request.header(telemetry::TRACESTATE, &**state);
            }
        }

        let result = async {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, Utc::now()));
            let body = self.read_capped(response).await;
            Ok::<_, reqwest::Error>((status, retry_after, body))
        }
        .await;
        let duration = Some(started.elapsed());

        match result {
            Ok((status, retry_after, body)) => {
                let verdict = classify_status(status, retry_after);
                let error_response = match verdict {
                    Verdict::Succeeded => None,
                    _ => Some(truncate(body, self.config.max_error_response_bytes)),
                };
                AttemptResult {
                    record: AttemptRecord {
                        error_type: error_type_of(&verdict).map(String::from),
                        error_response,
                        response_status: Some(status),
                        duration,
                        started: None,
                    },
                    verdict,
                }
            }
            Err(err) => {
                if let Some(blocked) = find_blocked(&err) {
                    return self.blocked(&blocked, started);
                }
                let error_type = if err.is_timeout() {
                    ErrorType::Timeout
                } else if err.is_connect() {
                    ErrorType::Connect
                } else {
                    ErrorType::Request
                };
                let text = error_chain(&err);
                AttemptResult {
                    verdict: Verdict::Retry {
                        error_type,
                        retry_after: None,
                    },
                    record: AttemptRecord {
                        error_type: Some(error_type.into()),
                        error_response: Some(truncate(
                            Bytes::from(text),
                            self.config.max_error_response_bytes,
                        )),
                        response_status: None,
                        duration,
                        started: None,
                    },
                }
            }
        }
    }

    /// Reads up to `max_response_bytes` of the body. A body that fails midway, or that is
    /// longer than the cap, yields what was read: the status already decided the outcome.
    async fn read_capped(&self, mut response: reqwest::Response) -> Bytes {
        let mut body = BytesMut::new();
        while body.len() < self.config.max_response_bytes {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) | Err(_) => break,
            }
        }
        body.truncate(self.config.max_response_bytes);
        body.freeze()
    }
}

/// The attributes of an attempt's span: HTTP client semantic conventions (the URL without
/// its query, fragment and credentials) and the job's.
fn attempt_attributes(job: &Job, attempt: u16) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("http.request.method", job.method.to_string()),
        KeyValue::new("spindle.job.id", job.id.to_string()),
        KeyValue::new("spindle.bucket", job.bucket.to_string()),
        KeyValue::new("spindle.attempt", i64::from(attempt)),
    ];
    if attempt > 1 {
        attributes.push(KeyValue::new(
            "http.request.resend_count",
            i64::from(attempt) - 1,
        ));
    }
    if let Ok(mut url) = reqwest::Url::parse(&job.endpoint) {
        url.set_query(None);
        url.set_fragment(None);
        if !url.username().is_empty() || url.password().is_some() {
            let _ = url.set_username("REDACTED");
            let _ = url.set_password(None);
        }
        if let Some(host) = url.host_str() {
            attributes.push(KeyValue::new("server.address", host.to_owned()));
        }
        if let Some(port) = url.port_or_known_default() {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        attributes.push(KeyValue::new("url.full", url.to_string()));
    }
    if let Some(e) = &job.event {
        attributes.push(KeyValue::new(
            "spindle.event.type",
            e.event_type.to_string(),
        ));
    }
    attributes
}

fn error_type_of(verdict: &Verdict) -> Option<ErrorType> {
    match verdict {
        Verdict::Succeeded => None,
        Verdict::Discard { error_type } | Verdict::Retry { error_type, .. } => Some(*error_type),
    }
}

fn truncate(mut bytes: Bytes, max: usize) -> Bytes {
    bytes.truncate(max);
    bytes
}

/// The guard's refusal, if that is what failed the request.
fn find_blocked(err: &(dyn std::error::Error + 'static)) -> Option<Blocked> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(blocked) = e.downcast_ref::<Blocked>() {
            return Some(blocked.clone());
        }
        current = e.source();
    }
    None
}

/// The error and its sources on one line, for the transition row (and the dashboard's
/// reasons why a JobDB is unreachable). A cause whose text is already in the line is left
/// out: some errors (sqlx's I/O error) print their source in their own message.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{EventLink, JobId, RetryPolicy};

    #[derive(Debug)]
    struct Known(ulid::Ulid);

    impl signing::SubscriptionSecrets for Known {
        fn secret(&self, subscription: &ulid::Ulid) -> Option<signing::SigningSecret> {
            (*subscription == self.0).then(|| {
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
                    .parse()
                    .expect("a secret")
            })
        }
    }

    fn event_job(subscription: ulid::Ulid) -> Job {
        let now = chrono::Utc::now();
        Job {
            id: JobId(ulid::Ulid::new()),
            bucket: "b".into(),
            endpoint: "http://127.0.0.1:9/hook".into(),
            method: "POST".into(),
            headers: Vec::new(),
            payload: Bytes::from_static(b"{}"),
            execution_timeout: Duration::from_secs(1),
            retry: RetryPolicy {
                min_delay: Duration::from_secs(1),
                coefficient: 2.0,
            },
            created_at: now,
            expire_at: now + chrono::Duration::hours(1),
            idempotency_key: None,
            on_complete: None,
            ordering: None,
            event: Some(EventLink {
                event_id: ulid::Ulid::new(),
                event_type: "a.b".into(),
                subscription,
            }),
            trace: None,
        }
    }

    /// An event's job is never sent without its subscription's own signature: unknown here,
    /// it is retried unsent; known, it goes (to a closed port here: a connect error).
    #[tokio::test]
    async fn an_event_job_waits_for_its_subscription_secret() {
        let subscription = ulid::Ulid::new();
        let config = |known: Option<Arc<dyn signing::SubscriptionSecrets>>| DeliveryConfig {
            allow_subnets: vec!["127.0.0.0/8".parse().expect("a subnet")],
            subscriptions: known,
            ..DeliveryConfig::default()
        };
        for known in [None, Some(Arc::new(Known(ulid::Ulid::new())) as Arc<_>)] {
            let deliverer = Deliverer::new(config(known)).expect("a deliverer");
            let result = deliverer.attempt(&event_job(subscription), 1).await;
            assert_eq!(
                result.record.error_type.as_deref(),
                Some("unknown-subscription")
            );
            assert!(matches!(result.verdict, Verdict::Retry { .. }));
        }
        let deliverer =
            Deliverer::new(config(Some(Arc::new(Known(subscription))))).expect("a deliverer");
        let result = deliverer.attempt(&event_job(subscription), 1).await;
        assert_eq!(result.record.error_type.as_deref(), Some("connect"));
    }
}
