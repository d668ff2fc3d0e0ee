//! Producer ergonomics: the real `spindle submit` binary against a real Director (jobs from
//! options, from an NDJSON file and from stdin, stored and delivered; malformed files refused
//! whole, naming the line and field), and the `spindle-client` crate against a live Director
//! (submit, look-ups, error answers mapped with the server's message and field, tokens) and
//! against misbehaving servers (timeouts, a proxy's 502, a 503 with Retry-After).

mod common;

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use spindle::job::State;
use spindle::rpc::auth::{Scope, TokenStore};
use spindle_client::{Client, Error, JobStatus, NewJob};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one run of the binary did.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Stdout's lines, each parsed as JSON.
    fn lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }
}

/// Runs `spindle submit ARGS` (with `input` on stdin, else an empty stdin), with no token or
/// API in the environment unless `env` sets them.
async fn spindle_submit(args: &[&str], input: Option<&str>, env: &[(&str, &str)]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_spindle"));
    command
        .args(["--log", "warn", "submit"])
        .args(args)
        .env_remove("SPINDLE_TOKEN")
        .env_remove("SPINDLE_API")
        .envs(env.iter().copied())
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spindle submit starts");
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(input.as_bytes())
            .await
            .expect("write stdin");
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("spindle submit ends within 60 s")
        .expect("spindle submit output");
    Run {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Total jobs stored in the rig's JobDB.
async fn stored(rig: &Rig) -> u64 {
    rig.reader
        .count_by_state()
        .await
        .expect("count")
        .values()
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spindle_submit_takes_jobs_from_options_a_file_and_stdin() {
    let rig = Rig::start("submit_cli", |_| {}).await;
    let base = rig.base();
    let ok = rig.sink.url("/ok");

    // One job from options: headers, payload and key arrive as given (`/fail/0` answers 200
    // and keeps bodies and `x-` headers).
    let keeps = rig.sink.url("/fail/0");
    let run = spindle_submit(
        &[
            "--url",
            &base,
            "--bucket",
            "cli",
            "--endpoint",
            &keeps,
            "--payload",
            r#"{"from": "options"}"#,
            "-H",
            "x-source: cli",
            "--idempotency-key",
            "order-1",
            "--execution-timeout-ms",
            "2000",
            "--ordering-key",
            "order-1",
            "--ordering-failure",
            "block",
        ],
        None,
        &[],
    )
    .await;
    assert!(run.success, "{}", run.stderr);
    let lines = run.lines();
    assert_eq!(lines.len(), 1, "{}", run.stdout);
    assert_eq!(lines[0]["status"], "accepted");
    assert!(lines[0].get("line").is_none());
    let from_options = lines[0]["id"].as_str().unwrap().to_owned();

    // A file, with a blank line, in batches of 2: one output line per job, with its line.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.ndjson");
    let job = |n: u32| json!({"bucket": "cli", "endpoint": ok, "payload": {"n": n}}).to_string();
    std::fs::write(&file, format!("{}\n\n{}\n{}\n", job(1), job(2), job(3))).unwrap();
    let run = spindle_submit(
        &[
            "--url",
            &base,
            "--file",
            file.to_str().unwrap(),
            "--batch",
            "2",
        ],
        None,
        &[],
    )
    .await;
    assert!(run.success, "{}", run.stderr);
    let lines = run.lines();
    let numbers: Vec<u64> = lines.iter().map(|l| l["line"].as_u64().unwrap()).collect();
    assert_eq!(numbers, vec![1, 3, 4], "{}", run.stdout);
    assert!(lines.iter().all(|l| l["status"] == "accepted"));
    let mut ids: Vec<String> = lines
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_owned())
        .collect();

    // Stdin, read because it is not a terminal and no job is given by options; a summary.
    let input = format!("{}\n{}\n", job(4), job(5));
    let run = spindle_submit(&["--url", &base, "--quiet"], Some(&input), &[]).await;
    assert!(run.success, "{}", run.stderr);
    assert_eq!(
        run.stdout.trim(),
        format!("submitted 2 jobs in 1 requests to {base}: 2 accepted, 0 duplicate, 0 pending, 0 failed")
    );
    // `--file -` reads stdin too, and the API comes from SPINDLE_API.
    let run = spindle_submit(
        &["--file", "-"],
        Some(&job(6)),
        &[("SPINDLE_API", base.as_str())],
    )
    .await;
    assert!(run.success, "{}", run.stderr);
    ids.extend(
        run.lines()
            .iter()
            .map(|l| l["id"].as_str().unwrap().to_owned()),
    );

    // Every job is stored and delivered.
    rig.wait_in_state(State::Succeeded, 7, Duration::from_secs(20))
        .await;
    assert_eq!(stored(&rig).await, 7);
    let received = rig.sink.received();
    let first = received
        .iter()
        .find(|r| r.job_id == from_options)
        .expect("the job from options arrived");
    assert_eq!(&first.body[..], br#"{"from": "options"}"#);
    assert!(first
        .headers
        .iter()
        .any(|(n, v)| n == "x-source" && v == "cli"));
    let delivered: HashSet<&str> = received.iter().map(|r| r.job_id.as_str()).collect();
    for id in &ids {
        assert!(delivered.contains(id.as_str()), "job {id} not delivered");
    }
    let view = rig.api().job(&from_options).await.unwrap();
    assert_eq!(view.job.idempotency_key.as_deref(), Some("order-1"));
    assert_eq!(view.job.execution_timeout_ms, 2000);
    assert_eq!(view.job.ordering_key.as_deref(), Some("order-1"));
    let id = from_options.parse().unwrap();
    let job = &rig.reader.get_jobs(&[id]).await.unwrap()[0];
    let ordering = job.ordering.clone().expect("ordered");
    assert_eq!((&*ordering.key, ordering.blocks), ("order-1", true));
    // Its position was minted by the Director when it accepted the job.
    assert!(ordering.position.timestamp_ms() >= job.id.0.timestamp_ms());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spindle_submit_refuses_malformed_input_and_stores_nothing() {
    let rig = Rig::start("submit_bad", |_| {}).await;
    let base = rig.base();
    let good = json!({"bucket": "cli", "endpoint": rig.sink.url("/ok")}).to_string();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // Bad JSON on line 3 (after two good lines, which must not be sent either).
        (
            format!("{good}\n{good}\n{{\"bucket\": \"cli\",\n{good}\n"),
            "line 3",
            "invalid JSON",
        ),
        // A missing field on line 2.
        (
            format!("{good}\n{{\"bucket\": \"cli\"}}\n"),
            "line 2",
            "endpoint",
        ),
        // An invalid value on line 2, named as intake would.
        (
            format!("{good}\n{{\"bucket\": \"cli\", \"endpoint\": \"ftp://x/\"}}\n"),
            "line 2, field endpoint",
            "http or https",
        ),
        // A field the schema does not have.
        (
            format!("{good}\n{good}\n{{\"bucket\": \"cli\", \"endpoint\": \"http://x/\", \"max_attempts\": 3}}\n"),
            "line 3",
            "max_attempts",
        ),
    ];
    for (i, (text, line, field)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad-{i}.ndjson"));
        std::fs::write(&file, text).unwrap();
        let run = spindle_submit(
            &["--url", &base, "--file", file.to_str().unwrap()],
            None,
            &[],
        )
        .await;
        assert!(!run.success, "case {i} succeeded: {}", run.stdout);
        assert!(
            run.stderr.contains(line) && run.stderr.contains(field),
            "case {i}: expected {line:?} and {field:?} in: {}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "case {i}: {}", run.stdout);
    }
    // Bad options: a header without a colon, a payload that is not JSON, an invalid value.
    let ok = rig.sink.url("/ok");
    for (args, expected) in [
        (vec!["-H", "x-a"], "name: value"),
        (vec!["--payload", "{nope"], "--payload is not JSON"),
        (vec!["--method", "TRACE"], "field method"),
    ] {
        let mut all = vec!["--url", &base, "--bucket", "cli", "--endpoint", &ok];
        all.extend(args);
        let run = spindle_submit(&all, None, &[]).await;
        assert!(
            !run.success && run.stderr.contains(expected),
            "{all:?}: {}",
            run.stderr
        );
    }
    // No input at all.
    let run = spindle_submit(&["--url", &base], None, &[]).await;
    assert!(
        !run.success && run.stderr.contains("no jobs"),
        "{}",
        run.stderr
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stored(&rig).await, 0);
    assert_eq!(rig.sink.total(), 0);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_submits_looks_up_and_maps_errors() {
    let rig = Rig::start("client", |_| {}).await;
    let api = Client::new(&rig.base(), None).unwrap();
    assert!(api.ready().await.unwrap());

    let jobs = vec![
        NewJob::new("c1", rig.sink.url("/ok"))
            .with_payload(&json!({"n": 1}))
            .unwrap()
            .with_header("x-k", "v"),
        NewJob::new("c2", rig.sink.url("/ok")).with_payload_bytes(b"\x00raw"),
    ];
    let reply = api.submit(&jobs).await.unwrap();
    assert_eq!(reply.jobs.len(), 2);
    assert!(reply.jobs.iter().all(|j| j.status == JobStatus::Accepted));
    rig.wait_in_state(State::Succeeded, 2, Duration::from_secs(20))
        .await;
    let view = api.job(&reply.jobs[1].id).await.unwrap();
    assert_eq!(view.job.state, State::Succeeded);
    assert_eq!(view.job.bucket, "c2");
    assert_eq!(view.payload_base64, "AHJhdw==");
    assert!(view.job.transitions.len() >= 3);

    // Scheduled for later: the answer names the time; the job waits, untried, until then.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let scheduled = [
        NewJob::new("c3", rig.sink.url("/ok")).with_deliver_at(later),
        NewJob::new("c3", rig.sink.url("/ok")).with_delay(Duration::from_secs(3600)),
    ];
    let reply = api.submit(&scheduled).await.unwrap();
    assert_eq!(reply.jobs[0].deliver_at, Some(later));
    let delayed = reply.jobs[1]
        .deliver_at
        .expect("a time for the delayed job");
    assert!((delayed - later).num_seconds().abs() < 5);
    let view = api.job(&reply.jobs[0].id).await.unwrap();
    assert_eq!(view.job.state, State::AwaitingRetry);
    assert_eq!(view.job.attempts, 0);

    // 422: an invalid value, named by the server; nothing stored.
    let bad = [
        NewJob::new("c1", rig.sink.url("/ok")),
        NewJob::new("c1", "ftp://example.test/"),
    ];
    let e = api.submit(&bad).await.unwrap_err();
    let answer = e.api().expect("an error answer");
    assert_eq!(answer.status, 422);
    assert_eq!(answer.code.as_deref(), Some("invalid_field"));
    assert_eq!(answer.field.as_deref(), Some("jobs[1].endpoint"));
    assert!(answer.message.contains("jobs[1].endpoint"), "{e}");
    assert!(e.to_string().contains("422") && e.stored_nothing(), "{e}");

    // 400: a body that does not have the schema's shape, with the field's path.
    let e = api
        .submit_encoded(
            json!({"jobs": [{"bucket": "c1", "endpoint": "http://x/", "ttl_ms": "soon"}]})
                .to_string(),
        )
        .await
        .unwrap_err();
    let answer = e.api().unwrap();
    assert_eq!(
        (
            answer.status,
            answer.code.as_deref(),
            answer.field.as_deref()
        ),
        (400, Some("invalid_json"), Some("jobs[0].ttl_ms")),
        "{e}"
    );
    let e = api
        .submit_encoded(r#"{"jobs": [{"bucket": "c1"}]}"#)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert!(e.to_string().contains("endpoint"), "{e}");

    // Look-ups: 404 for an unknown job, 400 naming `id` for something that is not an id.
    let e = api
        .job(&spindle::job::JobId(ulid::Ulid::new()).to_string())
        .await
        .unwrap_err();
    assert_eq!(e.api().unwrap().code.as_deref(), Some("not_found"));
    let e = api.job("not an id").await.unwrap_err();
    assert_eq!(e.api().unwrap().field.as_deref(), Some("id"));
    // Import needs the Director's own JobDB: 409 naming `jobdb`, nothing stored.
    let e = api
        .import(&spindle_client::ImportRequest {
            jobdb: "some_other_jobdb".into(),
            from_jobdb: None,
            not_after: None,
            blocked_keys: Vec::new(),
            events: Vec::new(),
            jobs: Vec::new(),
        })
        .await
        .unwrap_err();
    let answer = e.api().unwrap();
    assert_eq!(
        (answer.status, answer.field.as_deref()),
        (409, Some("jobdb"))
    );
    assert_eq!(
        stored(&rig).await,
        4,
        "the two delivered, the two scheduled, nothing else"
    );

    // No server: a connect error, nothing sent.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = api
        .with_base_url(&format!("http://127.0.0.1:{port}"))
        .unwrap()
        .submit(&jobs)
        .await
        .unwrap_err();
    assert!(e.is_connect() && e.stored_nothing(), "{e}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_and_spindle_submit_send_tokens() {
    let store = TokenStore::default()
        .with_token(
            "spt_producer_secret",
            "producer-a",
            Scope::Buckets(HashSet::from(["t1".to_owned()])),
        )
        .with_token("spt_admin_secret", "ops", Scope::Admin);
    let rig = Rig::start("client_auth", |c| c.auth = Some(Arc::new(store))).await;
    let base = rig.base();
    let job = |bucket: &str| NewJob::new(bucket, rig.sink.url("/ok"));

    // 401 without a token or with a wrong one.
    for token in [None, Some("spt_wrong".to_owned())] {
        let e = Client::new(&base, token.clone())
            .unwrap()
            .submit(&[job("t1")])
            .await
            .unwrap_err();
        let answer = e.api().unwrap();
        assert_eq!(answer.status, 401, "{token:?}");
        assert_eq!(answer.code.as_deref(), Some("unauthenticated"));
        assert!(e.stored_nothing());
    }
    // The producer's token: its bucket is accepted, another is refused naming the field.
    let producer = Client::new(&base, Some("spt_producer_secret".into())).unwrap();
    let reply = producer.submit(&[job("t1")]).await.unwrap();
    assert_eq!(reply.jobs[0].status, JobStatus::Accepted);
    let e = producer.submit(&[job("t1"), job("t2")]).await.unwrap_err();
    let answer = e.api().unwrap();
    assert_eq!(
        (answer.status, answer.field.as_deref()),
        (403, Some("jobs[1].bucket"))
    );
    assert!(!answer.message.contains("spt_producer_secret"));
    // The admin endpoints are not the producer's.
    assert_eq!(
        producer.endpoints().await.unwrap_err().status(),
        Some(403),
        "endpoints with a producer token"
    );
    let admin = Client::new(&base, Some("spt_admin_secret".into())).unwrap();
    admin.endpoints().await.unwrap();
    assert_eq!(
        admin.job(&reply.jobs[0].id).await.unwrap().job.bucket,
        "t1",
        "admin reads every bucket"
    );

    // spindle submit takes the token from SPINDLE_TOKEN or --token.
    let ok = rig.sink.url("/ok");
    let args = ["--url", &base, "--bucket", "t1", "--endpoint", &ok];
    let run = spindle_submit(&args, None, &[]).await;
    assert!(!run.success && run.stderr.contains("401"), "{}", run.stderr);
    assert!(
        run.stderr.contains("nothing of it was stored"),
        "{}",
        run.stderr
    );
    let run = spindle_submit(&args, None, &[("SPINDLE_TOKEN", "spt_producer_secret")]).await;
    assert!(run.success, "{}", run.stderr);
    let mut with_flag = args.to_vec();
    with_flag.extend(["--token", "spt_admin_secret"]);
    let run = spindle_submit(&with_flag, None, &[]).await;
    assert!(run.success, "{}", run.stderr);
    rig.wait_in_state(State::Succeeded, 3, Duration::from_secs(20))
        .await;
    rig.stop().await;
}

/// An HTTP/1.1 answer with `body`, closing the connection.
fn http_answer(status: &str, headers: &str, body: &str) -> &'static str {
    let text = format!(
        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    Box::leak(text.into_boxed_str())
}

/// A server on loopback that answers each connection with `answer` after reading the request
/// head (or never, when `answer` is `None`).
async fn fake_server(answer: Option<&'static str>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = socket.read(&mut buf).await;
                match answer {
                    Some(answer) => {
                        let _ = socket.write_all(answer.as_bytes()).await;
                        let _ = socket.shutdown().await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(30)).await,
                }
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_says_when_an_outcome_is_unknown() {
    let job = [NewJob::new("b", "http://example.test/")];

    // No answer in time: maybe stored.
    let silent = fake_server(None).await;
    let client = Client::builder(&silent)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let e = client.submit(&job).await.unwrap_err();
    assert!(e.is_timeout() && !e.stored_nothing(), "{e}");

    // A proxy's 502 page: its text is the message; maybe stored.
    let proxy = fake_server(Some(http_answer(
        "502 Bad Gateway",
        "content-type: text/html\r\n",
        "<html>upstream down</html>\n",
    )))
    .await;
    let e = Client::new(&proxy, None)
        .unwrap()
        .submit(&job)
        .await
        .unwrap_err();
    let answer = e.api().unwrap();
    assert_eq!((answer.status, answer.code.as_deref()), (502, None));
    assert_eq!(answer.message, "<html>upstream down</html>");
    assert!(!e.stored_nothing());

    // spindle's 503 with Retry-After: nothing stored, and when to come back.
    let body = r#"{"error":{"code":"unavailable","message":"the jobdb is unavailable; nothing was stored"}}"#;
    let busy = fake_server(Some(http_answer(
        "503 Service Unavailable",
        "content-type: application/json\r\nretry-after: 7\r\n",
        body,
    )))
    .await;
    let e = Client::new(&busy, None)
        .unwrap()
        .submit(&job)
        .await
        .unwrap_err();
    let answer = e.api().unwrap();
    assert_eq!(answer.code.as_deref(), Some("unavailable"));
    assert_eq!(answer.retry_after, Some(Duration::from_secs(7)));
    assert!(e.stored_nothing() && matches!(e, Error::Api(_)));
    assert!(!Client::new(&busy, None).unwrap().ready().await.unwrap());

    // A 2xx that is not the answer's JSON: maybe stored.
    let odd = fake_server(Some(http_answer("202 Accepted", "", "ok"))).await;
    let e = Client::new(&odd, None)
        .unwrap()
        .submit(&job)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Decode { status: 202, .. }) && !e.stored_nothing(),
        "{e}"
    );
}
