//! Private `redis-server`s for tests that need several stores or must kill one: each on its own
//! port, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of this test alone, killed on drop.
pub struct PrivateRedis {
    child: Child,
    pub port: u16,
    /// Its data directory when it persists (AOF), so a restart finds its data.
    dir: Option<PathBuf>,
}

impl PrivateRedis {
    /// Starts one without persistence on a free port and waits until it answers PING.
    pub async fn start(extra: &[&str]) -> PrivateRedis {
        for _ in 0..5 {
            if let Some(server) = Self::start_at(free_port(), None, extra).await {
                return server;
            }
        }
        panic!("could not start a private redis-server");
    }

    /// Starts one with an append-only file fsynced on every write in `dir`, so a `kill -9`
    /// loses nothing it acknowledged.
    pub async fn start_durable(dir: &Path) -> PrivateRedis {
        for _ in 0..5 {
            if let Some(server) = Self::start_at(free_port(), Some(dir), &[]).await {
                return server;
            }
        }
        panic!("could not start a private redis-server");
    }

    /// Kills it with SIGKILL (a crash) and starts it again on the same port and data.
    pub async fn crash_and_restart(&mut self, down_for: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        tokio::time::sleep(down_for).await;
        let restarted = Self::start_at(self.port, self.dir.as_deref(), &[])
            .await
            .expect("redis-server restarts on its port");
        *self = restarted;
    }

    async fn start_at(port: u16, dir: Option<&Path>, extra: &[&str]) -> Option<PrivateRedis> {
        let mut command = Command::new("redis-server");
        command.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ]);
        match dir {
            Some(dir) => {
                command.args(["--appendonly", "yes", "--appendfsync", "always", "--dir"]);
                command.arg(dir);
            }
            None => {
                command.args(["--appendonly", "no"]);
            }
        }
        let mut child = command
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return None; // exited: most likely the port was taken
            }
            if ping(&format!("redis://127.0.0.1:{port}")).await {
                return Some(PrivateRedis {
                    child,
                    port,
                    dir: dir.map(Path::to_path_buf),
                });
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Whether the server at `url` answers PING.
pub async fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .is_ok()
}
