//! Headless Chromium for the tests that load pages (Debian's `chromium`, installed if missing).

use std::time::Duration;

/// The Chromium binary, installing Debian's `chromium` package first if it is missing.
pub fn chromium() -> &'static str {
    super::debian_tool("chromium", "--version", "chromium")
}

/// Runs headless Chromium on `args` (plus the common flags and a private profile) and
/// returns its stdout.
pub async fn render(chromium: &str, args: &[&str]) -> Vec<u8> {
    let profile = tempfile::tempdir().expect("profile dir");
    let run = tokio::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1400,2200",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("chromium finishes within 60 s")
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
