//! `spindle audit`, the conservation ledger: green on a JobDB a Director serves, red and naming
//! the job when a row is deleted by hand or an attempt is made to overlap another; its metrics
//! and the shipped alert rules pass `promtool`.

mod common;

use std::time::Duration;

use common::procs;
use common::{Engine, Rig};
use serde_json::{json, Value};
use spindle::job::State;

/// `spindle audit --json` over these JobDBs: whether it passed, and each JobDB's ledger.
fn audit(urls: &[String]) -> (bool, Vec<Value>) {
    let mut args = vec!["audit", "--json"];
    for u in urls {
        args.extend(["--jobdb", u.as_str()]);
    }
    let out = procs::run(&args);
    let ledgers = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON ledger per line"))
        .collect();
    (out.status.success(), ledgers)
}

fn hex(id: &str) -> String {
    id.parse::<spindle::job::JobId>().unwrap().to_hex()
}

fn kinds_of(ledger: &Value, job: &str) -> Vec<String> {
    ledger["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["job"] == job)
        .map(|f| f["kind"].as_str().unwrap().to_owned())
        .collect()
}

async fn the_ledger_balances_and_names_a_job_made_to_vanish_or_overlap(engine: Engine) {
    let mut rig = Rig::start_on(engine, "audit", |_| {}).await;
    let url = rig.db.url_string();
    // 20 that succeed, 5 that fail and wait an hour for their next attempt.
    rig.submit(rig.jobs(20, "/ok", json!({}))).await;
    let resting = rig
        .submit(rig.jobs(5, "/status/500", json!({"backoff_min_delay_ms": 3_600_000})))
        .await;
    rig.wait_in_state(State::Succeeded, 20, Duration::from_secs(30))
        .await;
    rig.wait_in_state(State::AwaitingRetry, 5, Duration::from_secs(30))
        .await;

    let (ok, ledgers) = audit(std::slice::from_ref(&url));
    assert!(ok, "a healthy JobDB: {ledgers:?}");
    let l = &ledgers[0];
    assert_eq!(
        (&l["accepted"], &l["succeeded"], &l["open"]),
        (&json!(25), &json!(20), &json!(5)),
        "{l}"
    );

    // An operator deletes a resting job's open_jobs entry: it is in no list any more.
    let gone = resting.jobs[0].id.clone();
    common::operator_sql(
        &rig.reader,
        &format!("DELETE FROM open_jobs WHERE job_id = X'{}'", hex(&gone)),
    )
    .await;
    let (ok, ledgers) = audit(std::slice::from_ref(&url));
    assert!(!ok, "a vanished job must fail the audit: {ledgers:?}");
    assert_eq!(kinds_of(&ledgers[0], &gone), ["vanished"], "{}", ledgers[0]);
    assert_eq!(ledgers[0]["findings"].as_array().unwrap().len(), 1);

    // Another resting job gets a second attempt begun by the commit that began its first,
    // before the first one's end: two attempts at once.
    rig.stop_director().await;
    let twice = resting.jobs[1].id.clone();
    common::operator_sql(
        &rig.reader,
        &format!(
            "INSERT INTO job_state_transitions (id, job_id, time, attempts, state, started_in, \
             started_at) SELECT id + 1, job_id, time, attempts + 1, 'awaiting-retry', \
             started_in, started_at FROM job_state_transitions \
             WHERE job_id = X'{}' AND started_in IS NOT NULL",
            hex(&twice)
        ),
    )
    .await;
    let (ok, ledgers) = audit(std::slice::from_ref(&url));
    assert!(!ok);
    assert_eq!(kinds_of(&ledgers[0], &twice), ["overlap"], "{}", ledgers[0]);
    assert_eq!(kinds_of(&ledgers[0], &gone), ["vanished"], "{}", ledgers[0]);
    rig.stop().await;
}

on_both_engines!(the_ledger_balances_and_names_a_job_made_to_vanish_or_overlap);

/// A tracker's rounds (with no lag, every job goes through the windows and the carried set)
/// agree with a whole read each time, and name a job that vanishes between two rounds.
async fn rounds_of_a_tracker_agree_with_a_whole_read(engine: Engine) {
    use spindle::ledger::{Ledger, Tracker};
    let mut rig = Rig::start_on(engine, "auditrounds", |_| {}).await;
    let name = rig.db.url.database.clone();
    let margin = chrono::Duration::seconds(60);
    let mut tracker = Tracker::with_lag(&name, chrono::Duration::zero());
    let whole = |l: &Ledger| {
        (
            l.accepted,
            l.succeeded,
            l.discarded,
            l.archived,
            l.moved,
            l.open,
        )
    };
    let resting = rig
        .submit(rig.jobs(6, "/status/500", json!({"backoff_min_delay_ms": 3_600_000})))
        .await;
    let mut done = 0;
    let mut ok = None;
    for round in 0..4 {
        ok = Some(rig.submit(rig.jobs(10, "/ok", json!({}))).await);
        done += 10;
        rig.wait_in_state(State::Succeeded, done, Duration::from_secs(30))
            .await;
        rig.wait_in_state(State::AwaitingRetry, 6, Duration::from_secs(30))
            .await;
        let l = tracker.round(&rig.reader, None, margin).await;
        let full = Tracker::new(&name).round(&rig.reader, None, margin).await;
        assert!(l.is_clean() && full.is_clean(), "round {round}: {l}{full}");
        assert_eq!(whole(&l), whole(&full), "round {round}: {l}{full}");
        assert_eq!(whole(&l), (done + 6, done, 0, 0, 0, 6), "{l}");
        assert_eq!(tracker.carried(), 6);
    }
    let gone = hex(&resting.jobs[2].id);
    common::operator_sql(
        &rig.reader,
        &format!("DELETE FROM open_jobs WHERE job_id = X'{gone}'"),
    )
    .await;
    let l = tracker.round(&rig.reader, None, margin).await;
    let kinds: Vec<_> = l
        .findings
        .iter()
        .map(|f| (f.kind, f.job.map(|j| j.to_hex())))
        .collect();
    assert_eq!(
        kinds,
        [(spindle::ledger::Kind::Vanished, Some(gone.clone()))],
        "{l}"
    );

    // After the cursor: a carried job's second attempt, begun by the commit that began its
    // first (whose row is before the cursor), and a second end of a job that succeeded in an
    // earlier round. Rounds read a carried job by its new rows alone unless it was retried.
    rig.stop_director().await;
    let twice = hex(&resting.jobs[3].id);
    let succeeded = hex(&ok.expect("submitted").jobs[0].id);
    for sql in [
        format!(
            "INSERT INTO job_state_transitions (id, job_id, time, attempts, state, started_in, \
             started_at) SELECT m.top + 1, t.job_id, t.time, t.attempts + 1, 'awaiting-retry', \
             t.started_in, t.started_at FROM job_state_transitions t, \
             (SELECT MAX(id) AS top FROM job_state_transitions) m \
             WHERE t.job_id = X'{twice}' AND t.started_in IS NOT NULL"
        ),
        format!(
            "INSERT INTO job_state_transitions (id, job_id, time, attempts, state) \
             SELECT m.top + 1, t.job_id, t.time, t.attempts, 'discarded' \
             FROM job_state_transitions t, (SELECT MAX(id) AS top FROM job_state_transitions) m \
             WHERE t.job_id = X'{succeeded}' AND t.state = 'succeeded'"
        ),
    ] {
        common::operator_sql(&rig.reader, &sql).await;
    }
    let l = tracker.round(&rig.reader, None, margin).await;
    let mut kinds: Vec<_> = l
        .findings
        .iter()
        .map(|f| (f.kind, f.job.map(|j| j.to_hex())))
        .collect();
    kinds.sort();
    use spindle::ledger::Kind;
    let mut expected = vec![
        (Kind::Vanished, Some(gone)),
        (Kind::Overlap, Some(twice)),
        (Kind::EndedTwice, Some(succeeded)),
    ];
    expected.sort();
    assert_eq!(kinds, expected, "{l}");
    rig.stop().await;
}

on_both_engines!(rounds_of_a_tracker_agree_with_a_whole_read);

#[test]
fn the_metrics_and_the_alert_rules_pass_promtool() {
    use spindle::ledger::metrics::LedgerMetrics;
    use spindle::ledger::Ledger;
    let metrics = LedgerMetrics::default();
    let ledger = Ledger {
        jobdb: "a".into(),
        accepted: 3,
        succeeded: 2,
        open: 1,
        ..Ledger::default()
    };
    metrics.record(&[ledger, Ledger::unreachable("b", "down")], Duration::ZERO);
    common::promtool_accepts(&metrics.render());
    let promtool = common::debian_tool("promtool", "--version", "prometheus");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/prometheus");
    for args in [
        ["check", "rules", "spindle-alerts.yml"],
        ["test", "rules", "spindle-alerts.test.yml"],
    ] {
        let out = std::process::Command::new(promtool)
            .args(args)
            .current_dir(dir)
            .output()
            .expect("promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Stalls: jobs left open past their expiry by a stopped Director are `overdue`, and its JobDB,
/// active in the inventory with nobody holding its lock, is `unowned`; the inventory's JobDBs
/// are found through `--registry consul`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_directors_jobdb_is_unowned_and_its_expired_jobs_overdue() {
    use spindle::registry::inventory::{Inventory, JobDbRecord, JobDbState};
    let consul = common::ConsulUnderTest::start().await;
    if consul.double.is_none() {
        // The inventory's keys are global: only write them into a Consul of this test's own.
        println!("skipped: needs the in-repo Consul double");
        return;
    }
    let mut rig = Rig::start("auditstall", |_| {}).await;
    let failing = json!({"backoff_min_delay_ms": 3_600_000, "ttl_ms": 1_500});
    let stuck = rig.submit(rig.jobs(3, "/status/500", failing)).await;
    rig.wait_in_state(State::AwaitingRetry, 3, Duration::from_secs(30))
        .await;
    rig.stop_director().await;
    let inventory = Inventory::new(consul.client.clone());
    let record = JobDbRecord {
        name: rig.db.url.database.clone(),
        url: rig.db.url_string(),
        state: JobDbState::Active,
        changed_at: chrono::Utc::now(),
        changed_by: "audit test".into(),
    };
    assert!(inventory.add(&record).await.unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;

    let consul_addr = consul.double.as_ref().unwrap().url();
    let out = procs::run(&[
        "audit",
        "--json",
        "--registry",
        "consul",
        "--consul-addr",
        &consul_addr,
        "--margin-secs",
        "0",
    ]);
    assert!(!out.status.success());
    let ledgers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let l = ledgers
        .iter()
        .find(|l| l["jobdb"] == rig.db.url.database.as_str())
        .expect("the inventory's JobDB is audited");
    for job in &stuck.jobs {
        assert_eq!(kinds_of(l, &job.id), ["overdue"], "{l}");
    }
    let kinds: Vec<&str> = l["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"unowned"), "{l}");
    assert_eq!(kinds.len(), 4, "nothing lost, only stalls: {l}");
    rig.stop().await;
    consul.stop().await;
}
