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

/// The `spindle` binary the tests run: this build's, or `SPINDLE_BIN` (another build's, to
/// show a test or the history checker catching what that build gets wrong).
pub fn spindle_bin() -> String {
    std::env::var("SPINDLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_spindle").to_owned())
}

/// Runs a `spindle` command (`spindle replay ...`, `spindle endpoints ...`) to its end.
pub fn run(args: &[&str]) -> std::process::Output {
    std::process::Command::new(spindle_bin())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run spindle {args:?}: {e}"))
}

/// [`run`] from async code, without holding a runtime thread while it runs.
pub async fn run_async(args: &[&str]) -> std::process::Output {
    Command::new(spindle_bin())
        .args(args)
        .output()
        .await
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

/// A `spindle` process, which remembers how it was started so that it can start again on its
/// port.
pub struct Proc {
    pub child: Child,
    pub port: u16,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Proc {
    /// Starts `spindle` with `args`, replacing `{port}` in them by `port` (a free one if 0).
    /// Its log level is `SPINDLE_TEST_LOG` (default `warn`).
    pub fn spawn(args: &[String], port: u16) -> Proc {
        Self::spawn_with_env(args, port, &[])
    }

    /// [`Proc::spawn`] with more environment variables (e.g. `LD_PRELOAD` of libfaketime).
    pub fn spawn_with_env(args: &[String], port: u16, env: &[(&str, &str)]) -> Proc {
        let port = if port == 0 { free_port() } else { port };
        let child = Command::new(spindle_bin())
            .args(args.iter().map(|a| a.replace("{port}", &port.to_string())))
            .env(
                "SPINDLE_LOG",
                std::env::var("SPINDLE_TEST_LOG").unwrap_or("warn".into()),
            )
            .envs(env.iter().copied())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn spindle");
        Proc {
            child,
            port,
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Starts it again (killing it first if it still runs) on its port, with its arguments
    /// and environment: a supervisor's restart.
    pub async fn restart(&mut self) {
        self.kill9().await;
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let again = Self::spawn_with_env(&self.args, self.port, &env);
        *self = again;
    }

    /// Sends it `signal` (it must be running).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().expect("running") as i32);
        nix::sys::signal::kill(pid, signal).expect("signal");
    }

    /// Whether it answers `/readyz` 200 within half a second.
    pub async fn ready(&self, client: &reqwest::Client) -> bool {
        let probe = client
            .get(format!("{}/readyz", self.base()))
            .timeout(Duration::from_millis(500));
        matches!(probe.send().await, Ok(r) if r.status().is_success())
    }

    /// The value of the unlabelled sample `name` on its `/metrics` (`None` when it does not
    /// answer or has no such sample).
    pub async fn metric(&self, client: &reqwest::Client, name: &str) -> Option<f64> {
        let text = client
            .get(format!("{}/metrics", self.base()))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// How it ended, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
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

/// The environment that runs a process (itself, not through a wrapper that a kill would leave
/// behind) with its wall clock `offset` ahead, e.g. `+1.5s`: Debian's libfaketime, installed if
/// missing; the monotonic clock, which timers use, stays true.
pub fn skewed_clock(offset: &str) -> Vec<(&'static str, String)> {
    let lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
    if !std::path::Path::new(lib).exists() {
        let installed = std::process::Command::new("apt-get")
            .args(["install", "-y", "-qq", "faketime"])
            .status();
        assert!(
            installed.is_ok_and(|s| s.success()) && std::path::Path::new(lib).exists(),
            "libfaketime is needed: apt-get install faketime"
        );
    }
    vec![
        ("LD_PRELOAD", lib.to_owned()),
        ("FAKETIME", offset.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("FAKETIME_NO_CACHE", "1".to_owned()),
    ]
}

/// Strings from string literals, for argument lists.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The arguments of a command line written as one string (none of them holds a space).
pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}
