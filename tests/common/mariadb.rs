//! A private MariaDB server for tests that kill the database (never the shared one CI needs).

use std::path::PathBuf;
use std::time::Duration;

/// A private MariaDB server (own port and data directory), killed and restarted at will.
pub struct PrivateMariaDb {
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<std::process::Child>,
}

impl PrivateMariaDb {
    pub fn start() -> PrivateMariaDb {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).expect("private tmpdir");
        // The bootstrap is a mariadbd too: in the shared /tmp it would clear other servers'
        // (and other bootstraps') `#sql*` temporary tables, failing with "Unknown table
        // 'mysql.tmp_user_sys'" when two tests start servers at once.
        let installed = std::process::Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .output()
            .expect("mariadb-install-db");
        assert!(
            installed.status.success(),
            "{}",
            String::from_utf8_lossy(&installed.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut db = PrivateMariaDb {
            dir,
            port,
            child: None,
        };
        db.restart();
        db
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn restart(&mut self) {
        std::fs::create_dir_all(self.path("tmp")).expect("private tmpdir");
        let child = std::process::Command::new("mariadbd")
            .args([
                "--no-defaults",
                "--user=root",
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=64M",
            ])
            .arg(format!("--datadir={}", self.path("data").display()))
            // Its own tmpdir: a mariadbd clears the `#sql*` files of its tmpdir when it starts,
            // and in the shared /tmp those are the machine's server's temporary tables, in use.
            .arg(format!("--tmpdir={}", self.path("tmp").display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", self.path("sock").display()))
            .arg(format!("--pid-file={}", self.path("pid").display()))
            .stderr(std::fs::File::create(self.path("err.log")).unwrap())
            .spawn()
            .expect("mariadbd");
        self.child = Some(child);
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "private mariadbd did not start: {}",
            std::fs::read_to_string(self.path("err.log")).unwrap_or_default()
        );
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        self.kill();
    }
}

impl PrivateMariaDb {
    /// The server's URL without a database, as `mysql_server()` gives it.
    pub fn server(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }
}
