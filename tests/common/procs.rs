//! `spindle` processes for tests that kill and restart them: each on a free loopback port,
//! killed when dropped.

use std::time::Duration;

use tokio::process::{Child, Command};

/// A free loopback port (bound and released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs a `spindle` command (`spindle replay ...`, `spindle endpoints ...`) to its end.
pub fn run(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run spindle {args:?}: {e}"))
}

/// [`run`], asserting that it succeeds; its stdout.
pub fn run_ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "spindle {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A `spindle` process.
pub struct Proc {
    pub child: Child,
    pub port: u16,
}

impl Proc {
    /// Starts `spindle` with `args`, replacing `{port}` in them by `port` (a free one if 0).
    /// Its log level is `SPINDLE_TEST_LOG` (default `warn`).
    pub fn spawn(args: &[String], port: u16) -> Proc {
        let port = if port == 0 { free_port() } else { port };
        let child = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(args.iter().map(|a| a.replace("{port}", &port.to_string())))
            .env(
                "SPINDLE_LOG",
                std::env::var("SPINDLE_TEST_LOG").unwrap_or("warn".into()),
            )
            .kill_on_drop(true)
            .spawn()
            .expect("spawn spindle");
        Proc { child, port }
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    pub async fn term(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = tokio::time::timeout(Duration::from_secs(40), self.child.wait()).await;
    }
}

/// Strings from string literals, for argument lists.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}
