//! API conformance: schemathesis (from PyPI, installed on first use if missing) generates
//! requests from the Director's own `/openapi.json`, valid and deliberately invalid, and checks
//! that no answer is a 5xx, every answer matches the document (status, content type, body
//! schema), and invalid requests are refused.
//!
//! One check is left out: "schema-valid request accepted". Some rules cannot be written in
//! JSON Schema (an `expire_at` in the future, `payload` xor `payload_base64`, `expire_at` xor
//! `ttl_ms`, reserved header names, a URL whose host parses), so a request can satisfy the
//! document and still be refused with a 4xx naming the field, as it should be.
//! The Director under test starts no deliveries, so generated endpoints are never contacted.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn schemathesis() {
    let available = || {
        Command::new("schemathesis")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !available() {
        let installed = Command::new("python3")
            .args(["-m", "pip", "install", "-q", "schemathesis==4.32.5"])
            .status()
            .expect("pip");
        assert!(
            installed.success(),
            "could not install schemathesis from PyPI"
        );
    }
    assert!(available(), "schemathesis not on PATH");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_director_conforms_to_its_openapi_document() {
    schemathesis();
    let rig = Rig::start("openapi", |c| c.scheduler.max_in_flight = 0).await;
    let spec = format!("{}/openapi.json", rig.base());
    let run = tokio::task::spawn_blocking(move || {
        Command::new("schemathesis")
            .args([
                "run",
                &spec,
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
            ])
            .args([
                "--max-examples",
                "100",
                "--workers",
                "1",
                "--seed",
                "20261121",
            ])
            .env("SCHEMATHESIS_HOOKS", "")
            .output()
            .expect("schemathesis runs")
    });
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("within 10 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("generated") || l.contains("passed") || l.contains("failed"))
        .collect();
    println!("schemathesis: {}", summary.join(" | "));
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rig.stop().await;
}
