//! What a benchmark reads of the processes it measures: CPU seconds and resident memory from
//! `/proc`, and which local process serves a TCP port (the MariaDB and Redis the bench talks
//! to, when they run on this machine).

use std::collections::HashSet;

/// CPU seconds (user + system) a process has used so far, or `None` once it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields are counted after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

fn clock_ticks() -> f64 {
    // Linux reports times in USER_HZ, 100 on every platform it supports.
    100.0
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS:`, `VmHWM:`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The process listening on local TCP `port` (IPv4 or IPv6), if it runs on this machine and
/// its file descriptors can be read.
pub fn listener_pid(port: u16) -> Option<u32> {
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let listening = *state == "0A";
            let on_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                == Some(port);
            if listening && on_port {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.contains(target.to_string_lossy().as_ref()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// A measured process: its name in the report, its pid, and the CPU it had used when the
/// measurement began.
#[derive(Clone, Debug)]
pub struct Measured {
    /// The component (`director`, `router`, `mariadb`, `redis`, `bench`).
    pub component: &'static str,
    /// The process.
    pub pid: u32,
    /// CPU seconds at the start.
    pub start: f64,
    /// CPU seconds last read (a child's last reading before it exits).
    pub last: f64,
}

impl Measured {
    /// Starts measuring `pid` now.
    pub fn start(component: &'static str, pid: u32) -> Option<Self> {
        let start = cpu_seconds(pid)?;
        Some(Measured {
            component,
            pid,
            start,
            last: start,
        })
    }

    /// Reads its CPU again (kept if the process is gone).
    pub fn sample(&mut self) {
        if let Some(now) = cpu_seconds(self.pid) {
            self.last = now;
        }
    }

    /// CPU seconds used since the start.
    pub fn used(&self) -> f64 {
        (self.last - self.start).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_measured_and_found_by_its_port() {
        let me = std::process::id();
        let before = cpu_seconds(me).expect("own stat");
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(cpu_seconds(me).unwrap() >= before);
        assert!(status_kib(me, "VmRSS:").unwrap() > 0);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listener_pid(port), Some(me));
        drop(listener);
        assert_eq!(listener_pid(port), None);
    }
}
