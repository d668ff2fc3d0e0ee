//! Traces across the queue, against a real OTLP receiver (rotel, from PyPI): a job submitted
//! with a `traceparent` through a router yields, in the receiver, the router's request span,
//! its forward, the Director's request and its commit in the producer's trace, and one span per
//! attempt, each the root of its own trace and linked to the producer's span, across a kill -9
//! of the Director between the first attempt and its retry; each attempt's receiver got a
//! `traceparent` naming that attempt's span.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::cluster::Cluster;
use common::procs::{free_port, Proc};
use serde_json::{json, Value};

/// The receiver, pinned: a pre-release, so an exact version.
const ROTEL: &str = "rotel==0.0.1a15";

/// The producer's span.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// The `rotel-agent` binary, installed with pip when missing.
fn rotel_agent() -> PathBuf {
    let find = || {
        Command::new("python3")
            .args([
                "-c",
                "import os, rotel; print(os.path.dirname(rotel.__file__))",
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("rotel-agent"))
    };
    if let Some(found) = find() {
        return found;
    }
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "-q", ROTEL])
        .status()
        .expect("pip");
    assert!(status.success(), "pip install {ROTEL}");
    find().expect("rotel installed")
}

/// A running receiver, writing every span it gets to `out` (the collector debug format).
struct Receiver {
    child: tokio::process::Child,
    out: PathBuf,
    http: u16,
}

impl Receiver {
    async fn start(dir: &Path) -> Receiver {
        let (http, grpc) = (free_port(), free_port());
        let out = dir.join("spans.txt");
        let child = tokio::process::Command::new(rotel_agent())
            .args(["start", "--exporter", "blackhole", "--debug-log", "traces"])
            .args(["--debug-log-verbosity", "detailed"])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}")])
            .stdout(std::fs::File::create(&out).expect("spans file"))
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start rotel-agent");
        let client = reqwest::Client::new();
        common::wait_for(Duration::from_secs(20), "the OTLP receiver", || {
            let probe = client
                .post(format!("http://127.0.0.1:{http}/v1/traces"))
                .header("content-type", "application/x-protobuf")
                .body(Vec::new())
                .send();
            async move { matches!(probe.await, Ok(r) if r.status().is_success()) }
        })
        .await;
        Receiver { child, out, http }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    fn spans(&self) -> Vec<Span> {
        parse(&std::fs::read_to_string(&self.out).unwrap_or_default())
    }
}

/// One span as the receiver printed it.
#[derive(Clone, Debug, Default)]
struct Span {
    service: String,
    trace: String,
    parent: String,
    id: String,
    name: String,
    kind: String,
    status: String,
    attributes: HashMap<String, String>,
    /// (trace id, span id) of each link.
    links: Vec<(String, String)>,
}

/// Reads the collector debug exporter's detailed format.
fn parse(text: &str) -> Vec<Span> {
    let mut spans = Vec::new();
    let mut service = String::new();
    let mut current: Option<Span> = None;
    let mut section = "";
    for line in text.lines() {
        let trimmed = line.trim();
        let field = |name: &str| {
            trimmed
                .strip_prefix(name)
                .map(|rest| rest.trim_start().trim_start_matches(':').trim().to_owned())
        };
        if trimmed.starts_with("ResourceSpans #") {
            spans.extend(current.take());
            section = "resource";
        } else if trimmed.starts_with("Span #") {
            spans.extend(current.take());
            current = Some(Span {
                service: service.clone(),
                ..Span::default()
            });
            section = "span";
        } else if trimmed == "Attributes:" {
            section = "attributes";
        } else if trimmed.starts_with("SpanLink #") {
            section = "link";
        } else if let Some(rest) = trimmed.strip_prefix("-> ") {
            let Some((key, value)) = rest.split_once(": ") else {
                continue;
            };
            let value = value
                .strip_suffix(')')
                .and_then(|v| v.split_once('('))
                .map_or(value, |(_, v)| v)
                .to_owned();
            match (section, current.as_mut()) {
                ("resource", _) if key == "service.name" => service = value,
                ("attributes", Some(span)) => {
                    span.attributes.insert(key.to_owned(), value);
                }
                ("link", Some(span)) if key == "Trace ID" => {
                    span.links.push((value.trim().to_owned(), String::new()))
                }
                ("link", Some(span)) if key == "ID" => {
                    if let Some(link) = span.links.last_mut() {
                        link.1 = value.trim().to_owned();
                    }
                }
                _ => {}
            }
        } else if let Some(span) = current.as_mut() {
            if let Some(v) = field("Trace ID") {
                span.trace = v;
            } else if let Some(v) = field("Parent ID") {
                span.parent = v;
            } else if let Some(v) = field("ID") {
                span.id = v;
            } else if let Some(v) = field("Name") {
                span.name = v;
            } else if let Some(v) = field("Kind") {
                span.kind = v;
            } else if let Some(v) = field("Status code") {
                span.status = v;
            }
        }
    }
    spans.extend(current);
    spans
}

/// The one item `pick` chooses (a span, a request the sink received).
fn one<'a, T: std::fmt::Debug>(items: &'a [T], what: &str, pick: impl Fn(&T) -> bool) -> &'a T {
    let found: Vec<&T> = items.iter().filter(|s| pick(s)).collect();
    assert_eq!(found.len(), 1, "{what}: {found:#?}");
    found[0]
}

/// Submits one job through the router in the producer's trace; its id.
async fn submit_traced(cluster: &Cluster, job: Value, tracestate: Option<&str>) -> String {
    let mut request = cluster
        .client
        .post(format!("{}/v1/jobs", cluster.router_base()))
        .header("traceparent", format!("00-{TRACE}-{PRODUCER_SPAN}-01"));
    if let Some(state) = tracestate {
        request = request.header("tracestate", state);
    }
    let answer = request
        .json(&json!({ "jobs": [job] }))
        .send()
        .await
        .expect("submit");
    assert_eq!(answer.status(), 202);
    let answer: Value = answer.json().await.expect("an answer");
    answer["jobs"][0]["id"]
        .as_str()
        .expect("a job id")
        .to_owned()
}

/// `GET /v1/jobs/{id}` through the router.
async fn job_view(cluster: &Cluster, id: &str) -> Value {
    cluster
        .client
        .get(format!("{}/v1/jobs/{id}", cluster.router_base()))
        .send()
        .await
        .expect("the job")
        .json()
        .await
        .expect("its view")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_one_trace_from_producer_to_receiver_across_a_kill_and_a_retry() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let receiver = Receiver::start(dir.path()).await;
    // Every process this test starts exports there, flushing often.
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "100");
    let mut cluster = Cluster::builder("traces")
        .jobdbs(1)
        .directors(1)
        .router(1)
        .director_args("--no-traceparent-bucket quiet")
        .control()
        .start()
        .await;

    let endpoint = cluster.sink.url("/fail/1");
    let job_id = submit_traced(
        &cluster,
        json!({"bucket": "traced", "endpoint": endpoint, "backoff_min_delay_ms": 4000}),
        Some("congo=t61rcWkgMzE"),
    )
    .await;

    // The first attempt fails; once its span is out, the Director dies before the retry.
    let attempt_span = |spans: &[Span], n: &str| {
        spans.iter().any(|s| {
            s.kind == "SPAN_KIND_CLIENT"
                && s.attributes.get("spindle.attempt").map(String::as_str) == Some(n)
        })
    };
    common::wait_for(Duration::from_secs(20), "the first attempt's span", || {
        let seen = attempt_span(&receiver.spans(), "1");
        async move { seen }
    })
    .await;
    let mut first = cluster.directors.remove(0);
    first.kill9().await;
    let second: Proc = cluster.director("d1");
    cluster.directors.push(second);
    common::wait_for(Duration::from_secs(60), "the retry's span", || {
        let seen = attempt_span(&receiver.spans(), "2");
        async move { seen }
    })
    .await;

    let spans = receiver.spans();
    let in_trace = |name: &str, service: &str| {
        one(&spans, &format!("{name} of {service}"), |s| {
            s.trace == TRACE && s.name == name && s.service == service
        })
        .clone()
    };
    let intake = in_trace("POST /v1/jobs", "spindle-router");
    assert_eq!(
        intake.parent, PRODUCER_SPAN,
        "the router's span is the producer's child"
    );
    assert_eq!(intake.kind, "SPAN_KIND_SERVER");
    assert_eq!(intake.attributes["http.response.status_code"], "202");
    let forward = in_trace("spindle.forward", "spindle-router");
    assert_eq!(forward.parent, intake.id);
    assert_eq!(forward.attributes["spindle.outcome"], "stored");
    let import = in_trace("POST /v1/import", "spindle-director");
    assert_eq!(
        import.parent, forward.id,
        "the Director continues the forward"
    );
    let commit = in_trace("spindle.commit", "spindle-director");
    assert_eq!(commit.parent, import.id);

    let received: Vec<_> = cluster
        .sink
        .received()
        .into_iter()
        .filter(|r| r.job_id == job_id)
        .collect();
    assert_eq!(
        received.len(),
        2,
        "one failed attempt, one retry: {received:?}"
    );
    for (n, got) in [("1", &received[0]), ("2", &received[1])] {
        let attempt = one(&spans, &format!("attempt {n}"), |s| {
            s.attributes.get("spindle.attempt").map(String::as_str) == Some(n)
        });
        assert_eq!(attempt.name, "POST");
        assert_eq!(attempt.kind, "SPAN_KIND_CLIENT");
        assert_eq!(attempt.service, "spindle-director");
        assert_ne!(attempt.trace, TRACE, "an attempt is a trace of its own");
        assert!(
            attempt.parent.is_empty(),
            "an attempt has no parent: {attempt:?}"
        );
        assert_eq!(
            attempt.links,
            vec![(TRACE.to_owned(), PRODUCER_SPAN.to_owned())],
            "attempt {n} links to the producer's span"
        );
        assert_eq!(attempt.attributes["spindle.job.id"], job_id);
        assert_eq!(attempt.attributes["spindle.bucket"], "traced");
        assert_eq!(attempt.attributes["http.request.method"], "POST");
        assert_eq!(attempt.attributes["url.full"], endpoint);
        let status = if n == "1" { "500" } else { "200" };
        assert_eq!(attempt.attributes["http.response.status_code"], status);
        assert_eq!(
            attempt.attributes.get("error.type").map(String::as_str),
            (n == "1").then_some("500"),
            "{attempt:?}"
        );
        assert_eq!(
            attempt
                .attributes
                .get("spindle.error_type")
                .map(String::as_str),
            (n == "1").then_some("server-error"),
        );
        let header = got
            .headers
            .iter()
            .find(|(name, _)| name == "traceparent")
            .map(|(_, v)| v.clone());
        assert_eq!(
            header,
            Some(format!("00-{}-{}-01", attempt.trace, attempt.id)),
            "the receiver's trace continues attempt {n}"
        );
    }
    let attempts: Vec<&Span> = spans
        .iter()
        .filter(|s| s.attributes.contains_key("spindle.attempt"))
        .collect();
    assert_ne!(attempts[0].trace, attempts[1].trace);

    // A bucket that said no: its receiver gets no traceparent, its attempts still have spans.
    let quiet_id = submit_traced(
        &cluster,
        json!({"bucket": "quiet", "endpoint": cluster.sink.url("/fail/0")}),
        None,
    )
    .await;
    common::wait_for(Duration::from_secs(20), "the quiet job's attempt", || {
        let seen = receiver
            .spans()
            .iter()
            .any(|s| s.attributes.get("spindle.job.id") == Some(&quiet_id));
        async move { seen }
    })
    .await;
    let quiet_got = cluster.sink.received();
    let quiet_got = one(&quiet_got, "the quiet job's request", |r| {
        r.job_id == quiet_id
    });
    assert!(
        !quiet_got
            .headers
            .iter()
            .any(|(name, _)| name == "traceparent"),
        "{quiet_got:?}"
    );

    // Events: the publish's header is each job's trace; a subscription that said no gets no
    // traceparent, the other one does.
    let mut subscriptions = Vec::new();
    for send in [false, true] {
        let made: Value = cluster
            .client
            .post(format!("{}/v1/subscriptions", cluster.router_base()))
            .json(
                &json!({"bucket": "events", "url": cluster.sink.url("/fail/0"),
                          "event_types": ["*"], "send_traceparent": send}),
            )
            .send()
            .await
            .expect("a subscription")
            .json()
            .await
            .expect("its view");
        assert_eq!(made["send_traceparent"], send, "{made}");
        subscriptions.push(made["id"].as_str().expect("an id").to_owned());
    }
    let event_trace = "0af7651916cd43dd8448eb211c80319c";
    let published = cluster
        .client
        .post(format!("{}/v1/events", cluster.router_base()))
        .header(
            "traceparent",
            format!("00-{event_trace}-b7ad6b7169203331-01"),
        )
        .json(&json!({"bucket": "events", "event_type": "a.b", "payload": {}}))
        .send()
        .await
        .expect("publish");
    assert_eq!(published.status(), 202);
    let published: Value = published.json().await.expect("an answer");
    let deliveries = published["deliveries"]
        .as_array()
        .expect("deliveries")
        .clone();
    assert_eq!(deliveries.len(), 2, "{published}");
    for d in &deliveries {
        let job = d["job_id"].as_str().expect("a job id").to_owned();
        let send = d["subscription_id"].as_str() == Some(&subscriptions[1]);
        common::wait_for(Duration::from_secs(30), "the event's delivery", || {
            let seen = cluster.sink.received().iter().any(|r| r.job_id == job);
            async move { seen }
        })
        .await;
        let got = cluster.sink.received();
        let got = one(&got, "the event job's request", |r| r.job_id == job);
        let header = got.headers.iter().find(|(name, _)| name == "traceparent");
        assert_eq!(header.is_some(), send, "{got:?}");
        let view = job_view(&cluster, &job).await;
        assert_eq!(
            view["traceparent"],
            format!("00-{event_trace}-b7ad6b7169203331-01")
        );
    }

    // The job kept its trace context in the JobDB, across the kill.
    let view = job_view(&cluster, &job_id).await;
    assert_eq!(view["state"], "succeeded");
    assert_eq!(
        view["traceparent"],
        format!("00-{TRACE}-{PRODUCER_SPAN}-01")
    );
    assert_eq!(view["tracestate"], "congo=t61rcWkgMzE");
    println!(
        "{} spans; attempts in traces {} and {}",
        spans.len(),
        attempts[0].trace,
        attempts[1].trace
    );
    drop(receiver.child);
    cluster.stop().await;
}
