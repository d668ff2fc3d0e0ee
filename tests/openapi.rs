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

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_director_conforms_to_its_openapi_document() {
    // With a control database, so events and subscriptions are exercised too.
    let control = Control::start(Engine::MySql).await;
    let publish = control.tweak();
    let rig = Rig::start("openapi", |c| {
        c.scheduler.max_in_flight = 0;
        publish(c);
    })
    .await;
    schemathesis_passes(&format!("{}/openapi.json", rig.base())).await;
    rig.stop().await;
    control.stop().await;
}
