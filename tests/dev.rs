//! `spindle dev`, the binary, on a fresh data directory and nothing else: the demo's first
//! delivery within a minute, the router's dedup, the dashboard page in headless Chromium, and
//! a restart that loses nothing (the earlier run's JobDB is drained into the new one).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::browser::{chromium, render};
use common::procs::{self, free_port};
use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

struct Dev {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Dev {
    fn start(data: &std::path::Path, ports: [u16; 3], demo: bool) -> Dev {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
        cmd.args(["dev", "--data-dir"])
            .arg(data)
            .args(["--listen", &format!("127.0.0.1:{}", ports[0])])
            .args(["--director-listen", &format!("127.0.0.1:{}", ports[1])])
            .args(["--dashboard-listen", &format!("127.0.0.1:{}", ports[2])])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if demo {
            cmd.arg("--demo");
        }
        let mut child = cmd.spawn().expect("spindle dev starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(out).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                println!("dev| {line}");
                sink.lock().unwrap().push(line);
            }
        });
        Dev { child, lines }
    }

    async fn line_starting(&self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.starts_with(prefix))
            {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no line {prefix:?} in {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("spindle dev stops within 30 s after SIGTERM")
            .unwrap();
        assert!(status.success(), "spindle dev exited {status}");
    }
}

fn submit(router: &str, jobs: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["submit", "--url", router])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(jobs.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "spindle submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_demo_delivers_at_once_and_a_restart_loses_nothing() {
    let data = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port(), free_port()];
    let started = Instant::now();
    let dev = Dev::start(data.path(), ports, true);
    let line = dev
        .line_starting("demo: first delivery", Duration::from_secs(60))
        .await;
    let seconds: f64 = line
        .split_whitespace()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .expect("seconds in the line");
    println!(
        "first demo delivery {seconds:.2} s after start ({:.2} s by this test's clock)",
        started.elapsed().as_secs_f64()
    );
    assert!(seconds < 60.0);
    // Events: the demo's subscriptions live in the control database under the data
    // directory; `spindle subscriptions list` shows them, crm disabled until 30 s in.
    dev.line_starting("demo: subscriptions", Duration::from_secs(10))
        .await;
    // Through the router, which serves the subscription API from the same control database.
    let router = format!("http://127.0.0.1:{}", ports[0]);
    let out = procs::run(&["subscriptions", "list", "--api", &router]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listed}");
    assert_eq!(
        listed.lines().count(),
        4,
        "a header and three subscriptions:\n{listed}"
    );
    assert!(
        listed.contains("disabled") && listed.contains("customer.*"),
        "{listed}"
    );
    assert!(data.path().join("control").exists());

    // Our own jobs through the router, with `spindle submit`: a repeat is a duplicate.
    let sink = spindle::cli::sink::Sink::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let ok = sink.url("/ok");
    let jobs: String = (0..5)
        .map(|i| {
            format!("{{\"bucket\":\"mine\",\"endpoint\":\"{ok}\",\"idempotency_key\":\"k{i}\"}}\n")
        })
        .collect();
    let first = submit(&router, &jobs);
    assert_eq!(first.matches("\"accepted\"").count(), 5, "{first}");
    let again = submit(&router, &jobs);
    assert_eq!(again.matches("\"duplicate\"").count(), 5, "{again}");
    wait_for(Duration::from_secs(20), "5 deliveries", || async {
        sink.per_job().len() == 5
    })
    .await;

    // The dashboard, in a real browser, shows the live JobDB (it discovers it within 1 s).
    let page = format!("http://127.0.0.1:{}/?minutes=5", ports[2]);
    let mut dom = String::new();
    for _ in 0..5 {
        dom = String::from_utf8_lossy(&render(chromium(), &["--dump-dom", &page]).await).into();
        if dom.contains("data-jobdb=\"spindle_") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        dom.contains(r#"data-ready="true""#),
        "page never ready:\n{dom}"
    );
    assert!(
        dom.contains("data-jobdb=\"spindle_"),
        "no jobdb on the page:\n{dom}"
    );

    // Five jobs that fail once and retry in 3 s; stop before the retry.
    let fail = sink.url("/fail/1");
    let retrying: String = (0..5)
        .map(|_| {
            format!(
                "{{\"bucket\":\"mine\",\"endpoint\":\"{fail}\",\"backoff_min_delay_ms\":3000}}\n"
            )
        })
        .collect();
    let answered = submit(&router, &retrying);
    assert_eq!(answered.matches("\"accepted\"").count(), 5, "{answered}");
    wait_for(Duration::from_secs(10), "5 first attempts", || async {
        sink.received()
            .iter()
            .filter(|r| r.path == "/fail/1")
            .count()
            == 5
    })
    .await;
    dev.stop().await;

    // A new run on the same directory: the earlier JobDB is drained into the new one and its
    // retries are delivered.
    let restarted = Instant::now();
    let dev = Dev::start(data.path(), ports, false);
    wait_for(
        Duration::from_secs(60),
        "the retries after a restart",
        || async {
            let per_job = sink.per_job();
            let retried = sink
                .received()
                .iter()
                .filter(|r| r.path == "/fail/1" && r.attempt == 2 && r.status == 200)
                .count();
            retried == 5 && per_job.len() == 10
        },
    )
    .await;
    println!(
        "retries of the earlier run delivered {:.2} s after the restart",
        restarted.elapsed().as_secs_f64()
    );
    dev.stop().await;
    sink.stop().await;
}
