//! Supervision: a Director tells what supervises it the truth. A core task that dies makes it
//! non-ready and stop with an error, and the process exit non-zero saying why (so its
//! supervisor restarts it); a Director that does not read the endpoint controls says so.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::*;
use crate::{ready, shared};

/// A core task that ends while the Director is not stopping makes the Director non-ready and
/// stop with an error (before, a dead scheduler left `/readyz` at 200 and intake at 202 while
/// nothing was delivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_director_whose_core_task_dies_turns_non_ready_and_fails() {
    let _machine = shared().await;
    let bucket = format!("poison-{}", ulid::Ulid::new());
    spindle::faults::panic_on_bucket(&bucket);
    let mut rig = Rig::start("coretask", |_| {}).await;
    assert_eq!(ready(&rig).await, 200);
    let url = rig.sink.url("/ok");
    let _ = rig
        .client
        .post(format!("{}/v1/jobs", rig.base()))
        .json(&json!({"jobs": [{"bucket": bucket, "endpoint": url}]}))
        .send()
        .await;
    let director = rig.take_director();
    let ended = tokio::time::timeout(Duration::from_secs(20), director.wait())
        .await
        .expect("the director stops by itself");
    match ended {
        Err(spindle::director::DirectorError::TaskFailed(task)) => {
            assert_eq!(task, "scheduler")
        }
        other => panic!("expected the scheduler's failure, got {other:?}"),
    }
    rig.stop().await;
}

/// A child process killed when the test ends, whatever its outcome.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary: a Director process whose core task dies exits non-zero (so its supervisor
/// restarts it), and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_director_process_whose_core_task_dies_exits_non_zero() {
    let _machine = shared().await;
    let db = TestDb::new("coreproc");
    let bucket = format!("poison-{}", ulid::Ulid::new());
    let port = procs::free_port();
    let mut child = Reaped(
        std::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["director", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--jobdb", &db.url_string(), "--allow-subnet", "127.0.0.0/8"])
            .env("SPINDLE_FAULT_PANIC_BUCKET", &bucket)
            .env("SPINDLE_LOG", "warn")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spindle director"),
    );
    let child = &mut child.0;
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_for(Duration::from_secs(30), "the director ready", || async {
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let _ = client
        .post(format!("{base}/v1/jobs"))
        .json(&json!({"jobs": [{"bucket": bucket, "endpoint": "http://127.0.0.1:9/x"}]}))
        .send()
        .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the director kept running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success(), "exit status {status}");
    assert!(
        stderr.contains("ended unexpectedly"),
        "stderr does not say why: {stderr}"
    );
}

/// With `--registry mysql` the endpoint controls were silently never read. A Director says so
/// at start (and reads them with `--read-controls`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_director_without_consul_says_it_does_not_read_controls() {
    let _machine = shared().await;
    let db = TestDb::new("nocontrols");
    let port = procs::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["director", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--jobdb", &db.url_string()])
        .env("SPINDLE_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spindle director");
    let client = reqwest::Client::new();
    wait_for(Duration::from_secs(30), "the director ready", || async {
        client
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("controls") && stderr.contains("are not read"),
        "{stderr}"
    );
}
