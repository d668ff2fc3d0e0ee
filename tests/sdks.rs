//! The SDKs in `sdks/`: what the generators make of the current OpenAPI document, with no
//! difference (`sdks/generate.sh`), and their own tests (pytest; node's test runner) passing
//! against a live router and Director. Tools missing on the machine are installed first
//! (PyPI, npm).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::cluster::Cluster;

/// The repository's `sdks/`.
fn sdks() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sdks")
}

/// Runs `command`; panics with what it printed unless it succeeds. Returns its stdout.
fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{command:?} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// The generators and test tools: openapi-python-client and the Python test packages (pip),
/// the TypeScript package's locked dependencies (npm ci). Once per run: the tests run at
/// once, and two `npm ci` in one directory delete each other's files.
fn tools() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(install_tools);
}

fn install_tools() {
    let python_has = |module: &str| {
        Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let wanted = [
        ("openapi_python_client", "openapi-python-client==0.29.1"),
        ("pytest", "pytest"),
        ("standardwebhooks", "standardwebhooks==1.1.0"),
        ("httpx", "httpx>=0.23,<0.29"),
        ("attrs", "attrs>=22.2"),
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(module, _)| !python_has(module))
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        run(Command::new("python3")
            .args(["-m", "pip", "install", "-q"])
            .args(&missing));
    }
    let typescript = sdks().join("typescript");
    if !typescript
        .join("node_modules/.bin/openapi-typescript")
        .exists()
    {
        run(Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&typescript));
    }
}

/// Every file under `dir`, by its path relative to `dir`.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "__pycache__") {
                    continue;
                }
                walk(root, &path, out);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.insert(path.strip_prefix(root).unwrap().to_owned(), bytes);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Regenerated from this build's document, the generated parts of both SDKs are the files
/// in the repository: the SDKs cannot drift from the API. The TypeScript layer's types check.
#[test]
fn the_sdks_are_what_the_generators_make_of_the_document() {
    tools();
    let out = tempfile::tempdir().unwrap();
    run(Command::new(sdks().join("generate.sh"))
        .arg(out.path())
        .env("SPINDLE", env!("CARGO_BIN_EXE_spindle")));
    let stale = "is not what sdks/generate.sh makes of this build's document: run it and commit";
    for file in ["openapi.json", "typescript/src/schema.d.ts"] {
        let (made, kept) = (
            std::fs::read(out.path().join(file)).unwrap(),
            std::fs::read(sdks().join(file)).unwrap(),
        );
        assert!(made == kept, "sdks/{file} {stale}");
    }
    let (made, kept) = (
        files(&out.path().join("python/spindle_api")),
        files(&sdks().join("python/spindle_api")),
    );
    let differ: Vec<_> = made
        .keys()
        .chain(kept.keys())
        .filter(|p| made.get(*p) != kept.get(*p))
        .collect();
    assert!(
        differ.is_empty(),
        "sdks/python/spindle_api {stale}: {differ:?}"
    );
}

/// Both SDKs' tests, against a router (Redis dedup) and its Director with a control database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_pass_their_tests_against_live_processes() {
    tools();
    let cluster = Cluster::builder("sdk")
        .jobdbs(1)
        .directors(1)
        .redis(None)
        .router(1)
        .control()
        .start()
        .await;
    let env = [
        ("SPINDLE_ROUTER_URL", cluster.router_base()),
        ("SPINDLE_DIRECTOR_URL", cluster.directors[0].base()),
    ];
    let suites = tokio::task::spawn_blocking(move || {
        let python = run(Command::new("python3")
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .current_dir(sdks().join("python"))
            .envs(env.clone()));
        let typescript = run(Command::new("node")
            .args(["--test", "test/"])
            .current_dir(sdks().join("typescript"))
            .envs(env));
        (python, typescript)
    });
    let (python, typescript) = tokio::time::timeout(Duration::from_secs(300), suites)
        .await
        .expect("within 5 minutes")
        .unwrap();
    println!("pytest: {}", python.lines().last().unwrap_or_default());
    println!("node --test: {typescript}");
    assert!(
        !python.contains("skipped"),
        "every Python test ran: {python}"
    );
    assert!(
        typescript.contains("# skipped 0") && typescript.contains("# fail 0"),
        "every TypeScript test ran: {typescript}"
    );
    cluster.stop().await;
}
