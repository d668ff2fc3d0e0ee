//! Signed deliveries, verified by an independent implementation: the `standardwebhooks`
//! package from PyPI (installed on first use if missing), over the exact bytes the endpoint
//! received. Covers per-bucket secrets during a rotation (two secrets), an endpoint override,
//! binary payloads, and unsigned jobs.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use common::*;
use serde_json::json;
use spindle::delivery::signing::SigningConfig;

fn secret(byte: u8) -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([byte; 32])
    )
}

/// Makes sure Python can import `standardwebhooks`, installing it from PyPI if needed.
fn python_verifier() {
    let importable = || {
        Command::new("python3")
            .args(["-c", "import standardwebhooks"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !importable() {
        let installed = Command::new("python3")
            .args(["-m", "pip", "install", "-q", "standardwebhooks==1.1.0"])
            .status()
            .expect("pip");
        assert!(
            installed.success(),
            "could not install standardwebhooks from PyPI"
        );
    }
    assert!(importable(), "standardwebhooks not importable");
}

/// For each case, which of its secrets verify the delivery. UTF-8 bodies go through the
/// `standardwebhooks` library; it decodes every body as UTF-8 first, so a binary body is checked
/// with Python's own `hmac` over `{id}.{timestamp}.{body}` as the specification defines it.
const VERIFY: &str = r#"
import base64, hashlib, hmac, json, sys
from standardwebhooks import Webhook

def by_spec(secret, body, headers):
    key = base64.b64decode(secret[len("whsec_"):])
    signed = headers["webhook-id"].encode() + b"." + headers["webhook-timestamp"].encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(s.split(",", 1)[1], expected) for s in headers["webhook-signature"].split(" "))

for case in json.load(open(sys.argv[1])):
    body = base64.b64decode(case["body"])
    ok = []
    for secret in case["secrets"]:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            ok.append(by_spec(secret, body, case["headers"]))
            continue
        try:
            Webhook(secret).verify(body, case["headers"], json_parse=False)
            ok.append(True)
        except Exception:
            ok.append(False)
    print(json.dumps({"case": case["case"], "ok": ok}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_verify_with_an_independent_implementation() {
    python_verifier();
    let (old, new, override_secret, wrong) = (secret(1), secret(2), secret(3), secret(4));
    let mut rig = Rig::start("signing", |_| {}).await;
    // Two spellings of the same endpoint: the second has secrets of its own.
    let by_bucket = rig.sink.url("/capture");
    let overridden = format!("http://localhost:{}/capture", rig.sink.addr().port());
    let config = Arc::new(
        SigningConfig::default()
            .with_bucket("signed", vec![old.parse().unwrap(), new.parse().unwrap()])
            .with_endpoint(&overridden, vec![override_secret.parse().unwrap()]),
    );
    rig.stop_director().await;
    rig.restart_director(|c| c.delivery.signing = config.clone())
        .await;

    // Payload bytes are signed exactly as they are sent, odd whitespace and all.
    let raw = r#"{"event":  "signed",   "n": 1}"#;
    let binary = [0u8, 159, 146, 150];
    let b64 = base64::engine::general_purpose::STANDARD;
    // Job 0 goes in a hand-written body so its payload keeps its exact spelling.
    let first: spindle::rpc::api::SubmitReply = rig
        .client
        .post(format!("{}/v1/jobs", rig.base()))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"jobs": [{{"bucket": "signed", "endpoint": "{by_bucket}", "payload": {raw}}}]}}"#
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut reply = rig
        .submit(vec![
            json!({"bucket": "signed", "endpoint": overridden, "payload": {"event": "override"}}),
            json!({"bucket": "signed", "endpoint": by_bucket, "payload_base64": b64.encode(binary)}),
            json!({"bucket": "plain", "endpoint": by_bucket, "payload": {"event": "plain"}}),
        ])
        .await;
    reply.jobs.insert(0, first.jobs.into_iter().next().unwrap());
    wait_all_final(&rig.reader, 4, Duration::from_secs(20)).await;
    let received = rig.sink.received();
    let got = |i: usize| {
        received
            .iter()
            .find(|r| r.job_id == reply.jobs[i].id)
            .unwrap()
            .clone()
    };

    let case = |name: &str, i: usize, secrets: &[&String]| {
        let delivery = got(i);
        json!({
            "case": name,
            "body": b64.encode(&delivery.body),
            "headers": delivery.headers.iter().cloned().collect::<HashMap<_, _>>(),
            "secrets": secrets,
        })
    };
    let cases = json!([
        case("bucket", 0, &[&old, &new, &wrong]),
        case("override", 1, &[&override_secret, &old, &new]),
        case("binary", 2, &[&old, &new, &wrong]),
    ]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), cases.to_string()).unwrap();
    let out = Command::new("python3")
        .args(["-c", VERIFY, file.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: HashMap<String, Vec<bool>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                v["case"].as_str().unwrap().to_owned(),
                serde_json::from_value(v["ok"].clone()).unwrap(),
            )
        })
        .collect();
    println!("signing: standardwebhooks verdicts {verdicts:?}");
    assert_eq!(
        verdicts["bucket"],
        vec![true, true, false],
        "both rotation secrets verify, a wrong one does not"
    );
    assert_eq!(
        verdicts["override"],
        vec![true, false, false],
        "the endpoint's own secret wins over the bucket's"
    );
    assert_eq!(verdicts["binary"], vec![true, true, false]);

    assert_eq!(
        got(0).body,
        raw.as_bytes(),
        "the signed bytes are the submitted bytes"
    );
    assert_eq!(got(2).body, binary.as_slice());
    let first = got(0);
    let signature = &first
        .headers
        .iter()
        .find(|(n, _)| n == "webhook-signature")
        .unwrap()
        .1;
    assert_eq!(
        signature.split(' ').count(),
        2,
        "one signature per secret in rotation"
    );
    assert_eq!(
        got(0)
            .headers
            .iter()
            .find(|(n, _)| n == "webhook-id")
            .unwrap()
            .1,
        reply.jobs[0].id
    );
    assert!(
        got(3).headers.is_empty(),
        "jobs without secrets go unsigned"
    );
    rig.stop().await;
}
