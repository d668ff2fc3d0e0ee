//! `spindle replay` (the binary): ended jobs re-submitted as new jobs linked to the originals,
//! from a live JobDB and from the archive (moto S3, and a local directory).

mod common;

use std::time::Duration;

use common::s3::{ArchiveStore, Backend};
use common::*;
use serde_json::json;
use spindle::archive::Archive;
use spindle::job::{JobId, State};

fn replay(args: &[&str]) -> String {
    let mut all = vec!["replay"];
    all.extend_from_slice(args);
    procs::run_ok(&all)
}

/// (original, new) pairs printed by `spindle replay`.
fn links(output: &str) -> Vec<(String, String)> {
    output
        .lines()
        .filter_map(|l| l.split_once(" -> "))
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discarded_jobs_come_back_as_new_jobs_linked_to_them() {
    let rig = Rig::start("replay", |_| {}).await;
    let gone = |bucket: &str| json!({"bucket": bucket, "endpoint": rig.sink.url("/status/410"), "headers": {"x-kept": "1"}, "payload": {"n": bucket}});
    let mut jobs: Vec<_> = (0..5).map(|_| gone("r")).collect();
    jobs.extend((0..2).map(|_| gone("other")));
    jobs.extend(rig.jobs(3, "/ok", json!({})));
    let originals: Vec<String> = rig
        .submit(jobs)
        .await
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    wait_all_final(&rig.reader, 10, Duration::from_secs(10)).await;
    let url = rig.db.url_string();
    let base = rig.base();

    let dry = replay(&[
        "--from-jobdb",
        &url,
        "--bucket",
        "r",
        "--to",
        &base,
        "--dry-run",
    ]);
    assert!(dry.contains("selected 5, submitted 0 (dry run)"), "{dry}");
    let out = replay(&[
        "--from-jobdb",
        &url,
        "--bucket",
        "r",
        "--state",
        "discarded",
        "--to",
        &base,
    ]);
    assert!(out.contains("selected 5, submitted 5"), "{out}");
    let pairs = links(&out);
    assert_eq!(pairs.len(), 5);
    wait_all_final(&rig.reader, 15, Duration::from_secs(10)).await;

    let received = rig.sink.received();
    for (original, new) in &pairs {
        assert!(
            originals[..5].contains(original),
            "{original} was not a discarded job of r"
        );
        let view = rig.job_view(new).await;
        assert_eq!(view["idempotency_key"], format!("replay-of:{original}"));
        assert_eq!(view["bucket"], "r");
        assert_eq!(view["headers"]["spindle-replay-of"], original.as_str());
        assert_eq!(view["headers"]["x-kept"], "1");
        assert_eq!(view["payload_base64"], "eyJuIjoiciJ9");
        // Delivered (and discarded again: the endpoint still answers 410).
        assert!(
            received.iter().any(|r| &r.job_id == new),
            "{new} not delivered"
        );
    }
    // The originals keep their histories: replay adds, it does not change.
    let all = histories(&rig.reader).await;
    for original in &originals[..7] {
        let history = &all[&original.parse::<JobId>().unwrap()];
        assert_eq!(history.len(), 3);
        assert_eq!(history.last().unwrap().state, State::Discarded);
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_jobs_are_replayed_from_s3() {
    archived_jobs_are_replayed_from_the_archive(Backend::S3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_jobs_are_replayed_from_a_directory() {
    archived_jobs_are_replayed_from_the_archive(Backend::Dir).await
}

/// The Director archives expired jobs to `backend`; `spindle replay --from-archive` reads them.
async fn archived_jobs_are_replayed_from_the_archive(backend: Backend) {
    let store = ArchiveStore::start(backend, "replay-archive").await;
    let archive = Archive::open(&store.config()).await.expect("archive");
    let rig = Rig::start("replayarch", |c| c.archive = Some(archive)).await;
    // Down for 4 s; the jobs live 1 s, so they expire and are archived while it is down.
    let up_at = chrono::Utc::now().timestamp_millis() + 4000;
    let path = format!("/down-until/{up_at}");
    rig.submit(rig.jobs(
        4,
        &path,
        json!({"ttl_ms": 1000, "backoff_min_delay_ms": 200,
               "traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}),
    ))
    .await;
    rig.wait_in_state(State::Archived, 4, Duration::from_secs(20))
        .await;
    while chrono::Utc::now().timestamp_millis() < up_at {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let base = rig.base();
    let mut args = vec!["--from-archive", "--state", "archived", "--to", &base];
    let archive_args = store.cli_args();
    args.extend(archive_args.iter().map(String::as_str));
    let out = replay(&args);
    assert!(out.contains("selected 4, submitted 4"), "{out}");
    wait_for(
        Duration::from_secs(10),
        "the replayed jobs to succeed",
        || async {
            rig.reader
                .count_by_state()
                .await
                .unwrap()
                .get(&State::Succeeded)
                == Some(&4)
        },
    )
    .await;
    assert_eq!(
        rig.sink
            .received()
            .iter()
            .filter(|r| r.status == 200)
            .count(),
        4
    );
    for (original, new) in links(&out) {
        let view = rig.job_view(&new).await;
        assert_eq!(view["state"], "succeeded");
        assert_eq!(view["headers"]["spindle-replay-of"], original.as_str());
        // The archive kept the trace the original was submitted in; the replay links to it.
        assert_eq!(view["traceparent"], TRACEPARENT);
        assert_eq!(view["tracestate"], "congo=t61rcWkgMzE");
    }
    rig.stop().await;
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
