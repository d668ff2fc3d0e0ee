//! The address guard end to end: every blocked way of naming a local address is tried against
//! listening loopback sockets that count the connections they accept, and none may arrive. Then
//! an allowlist admits exactly what it names. (Private and metadata ranges are covered by the
//! guard's unit tests only: a broken guard must never send traffic off this machine.)

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::json;
use spindle::job::State;

/// A listener that counts accepted connections and never answers.
async fn counting(addr: &str) -> Option<(u16, Arc<AtomicUsize>)> {
    let listener = tokio::net::TcpListener::bind(addr).await.ok()?;
    let port = listener.local_addr().ok()?.port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    Some((port, accepted))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_blocked_form_is_discarded_without_a_connection() {
    // No allowlist: the production default.
    let rig = Rig::start("ssrf", |c| c.delivery.allow_subnets.clear()).await;
    let (p, v4) = counting("127.0.0.1:0").await.expect("loopback listener");
    let mut forms = vec![
        format!("http://127.0.0.1:{p}/"),
        format!("http://localhost:{p}/"),
        format!("http://2130706433:{p}/"),
        format!("http://0x7f000001:{p}/"),
        format!("http://0177.0.0.1:{p}/"),
        format!("http://127.1:{p}/"),
        format!("http://0.0.0.0:{p}/"),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        format!("http://[::ffff:7f00:1]:{p}/"),
        format!("http://[::127.0.0.1]:{p}/"),
        format!("http://[64:ff9b::7f00:1]:{p}/"),
        format!("http://[2002:7f00:1::1]:{p}/"),
        format!("http://[64:ff9b:1::7f00:1]:{p}/"),
        format!("http://[::ffff:0:7f00:1]:{p}/"),
        format!("http://192.88.99.1:{p}/"),
        format!("https://127.0.0.1:{p}/"),
    ];
    let v6 = counting("[::1]:0").await;
    if let Some((p6, _)) = &v6 {
        forms.push(format!("http://[::1]:{p6}/"));
        forms.push(format!("http://[::]:{p6}/"));
    }
    let jobs: Vec<_> = forms
        .iter()
        .map(|endpoint| json!({"bucket": "b", "endpoint": endpoint}))
        .collect();
    let reply = rig.submit(jobs).await;
    wait_all_final(&rig.reader, forms.len() as u64, Duration::from_secs(20)).await;

    let histories = histories(&rig.reader).await;
    for (form, job) in forms.iter().zip(&reply.jobs) {
        let history = &histories[&job.id.parse().unwrap()];
        let last = history.last().unwrap();
        assert_eq!(last.state, State::Discarded, "{form}: {history:#?}");
        assert_eq!(
            last.error_type.as_deref(),
            Some("blocked-address"),
            "{form}"
        );
        assert_eq!(last.attempts, 1, "{form}: blocked jobs are not retried");
    }
    // Every job ended `blocked-address`, i.e. without a connection by its client: a form that
    // reached a listener would have been answered and not end blocked. The counters are the
    // listeners' own proof of the same, read as they are now (no wait needed).
    assert_eq!(
        v4.load(Ordering::SeqCst),
        0,
        "a blocked form reached the IPv4 loopback listener"
    );
    if let Some((_, accepted)) = &v6 {
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            0,
            "a blocked form reached the IPv6 loopback listener"
        );
    }
    println!(
        "ssrf: {} blocked forms, 0 connections: {}",
        forms.len(),
        forms.join(" ")
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allowlist_admits_exactly_what_it_names() {
    let rig = Rig::start("allow", |c| {
        c.delivery.allow_subnets = vec!["127.0.0.0/8".parse().unwrap()]
    })
    .await;
    let (p, unspecified) = counting("127.0.0.1:0").await.unwrap();
    let reply = rig
        .submit(vec![
            json!({"bucket": "b", "endpoint": rig.sink.url("/ok")}),
            json!({"bucket": "b", "endpoint": format!("http://localhost:{}/ok", rig.sink.addr().port())}),
            json!({"bucket": "b", "endpoint": format!("http://0.0.0.0:{p}/")}),
            json!({"bucket": "b", "endpoint": format!("http://[64:ff9b::7f00:1]:{p}/")}),
        ])
        .await;
    wait_all_final(&rig.reader, 4, Duration::from_secs(20)).await;
    let histories = histories(&rig.reader).await;
    let last = |i: usize| {
        histories[&reply.jobs[i].id.parse().unwrap()]
            .last()
            .unwrap()
            .clone()
    };
    assert_eq!(last(0).state, State::Succeeded, "127.0.0.1 is named");
    assert_eq!(
        last(1).state,
        State::Succeeded,
        "localhost resolves into the named subnet"
    );
    assert_eq!(
        last(2).error_type.as_deref(),
        Some("blocked-address"),
        "0.0.0.0 is not named"
    );
    assert_eq!(
        last(3).error_type.as_deref(),
        Some("blocked-address"),
        "NAT64 of 127.0.0.1 is not named"
    );
    assert_eq!(unspecified.load(Ordering::SeqCst), 0);
    assert_eq!(rig.sink.total(), 2);

    // Control: the counting listener does see a connection when the address is admitted.
    rig.submit(vec![json!({"bucket": "b", "endpoint": format!("http://127.0.0.1:{p}/"), "execution_timeout_ms": 200, "backoff_min_delay_ms": 60000})])
        .await;
    wait_for(
        Duration::from_secs(10),
        "the admitted connection",
        || async { unspecified.load(Ordering::SeqCst) >= 1 },
    )
    .await;
    rig.stop().await;
}
