//! `spindle dashboard` over a live Director's JobDB: the JSON API's numbers against what the
//! JobDB holds, the page rendered by a real headless Chromium (Debian's `chromium`, installed
//! if missing), and discovery of JobDBs from the Consul inventory.
//!
//! The screenshot is kept at `<target dir>/dashboard-screenshot.png` (printed) to look at.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::browser::{chromium, render};
use common::*;
use serde_json::{json, Value};
use spindle::dashboard::{self, DashboardConfig};
use spindle::jobdb::JobDb;
use spindle::registry::inventory::{Inventory, JobDbRecord, JobDbState};

/// A JobDB nobody listens for: connections are refused at once.
const UNREACHABLE: &str = "mysql://root@127.0.0.1:1/spindle_nowhere";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_a_live_jobdb() {
    let started = Instant::now();
    let rig = Rig::start("dash", |_| {}).await;
    let fast_retry = json!({"backoff_min_delay_ms": 100});
    // Six successes (two with a query: the same lane), three jobs failing twice before they
    // succeed, two discards, four successes that take about 150 ms.
    let mut jobs = rig.jobs(4, "/ok", json!({}));
    jobs.extend(rig.jobs(1, "/ok?order=1", json!({})));
    jobs.extend(rig.jobs(1, "/ok?order=2#frag", json!({})));
    jobs.extend(rig.jobs(3, "/fail/2", fast_retry.clone()));
    jobs[6]["idempotency_key"] = json!("order-42");
    jobs[6]["payload"] = json!({"order": 42});
    jobs.extend(rig.jobs(2, "/status/400", json!({})));
    jobs.extend(rig.jobs(4, "/slow/150", json!({})));
    let accepted = rig.submit(jobs).await;
    assert_eq!(accepted.jobs.len(), 15);
    wait_all_final(&rig.reader, 15, Duration::from_secs(30)).await;
    let retried_id = accepted.jobs[6].id.clone();

    let mut config = DashboardConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        vec![rig.db.url_string(), UNREACHABLE.to_owned()],
    );
    config.query_timeout = Duration::from_secs(5);
    let dash = dashboard::serve(config).await.expect("dashboard starts");
    let base = format!("http://{}", dash.addr());
    let client = reqwest::Client::new();
    let name = rig.db.url.database.clone();

    // Attempts until success: 10 at the first attempt, none at the second, 3 at the third.
    let attempts = get(&client, &format!("{base}/api/attempts"), 200).await;
    println!("attempts: {}", attempts["succeeded"]);
    assert_eq!(bars(&attempts), vec![(1, 10), (2, 0), (3, 3)]);
    assert_eq!(attempts["total"], 13);
    assert_eq!(attempts["jobdbs"], 1);
    assert_eq!(unreachable_names(&attempts), vec!["spindle_nowhere"]);

    // Endpoints: one lane per path (queries folded in), nothing waiting.
    let endpoints = get(&client, &format!("{base}/api/endpoints?minutes=30"), 200).await;
    let lanes: BTreeMap<String, &Value> = endpoints["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["endpoint"].as_str().unwrap().to_owned(), e))
        .collect();
    let lane = |path: &str| {
        *lanes
            .get(&rig.sink.url(path))
            .unwrap_or_else(|| panic!("{path} in {lanes:?}"))
    };
    assert_eq!(lanes.len(), 4, "{endpoints}");
    for (path, succeeded, retried, discarded) in [
        ("/ok", 6, 0, 0),
        ("/fail/2", 3, 6, 0),
        ("/status/400", 0, 0, 2),
        ("/slow/150", 4, 0, 0),
    ] {
        let e = lane(path);
        println!(
            "{path}: backlog {} ok {} retried {} discarded {} rate {} p50 {} p95 {} last error {}",
            e["backlog"],
            e["succeeded"],
            e["retried"],
            e["discarded"],
            e["success_rate"],
            e["p50_ms"],
            e["p95_ms"],
            e["last_error"]
        );
        assert_eq!(e["backlog"], 0, "{path}");
        assert_eq!(e["succeeded"], succeeded, "{path}");
        assert_eq!(e["retried"], retried, "{path}");
        assert_eq!(e["discarded"], discarded, "{path}");
        assert_eq!(e["failed"], retried + discarded, "{path}");
        let activity: u64 = ["succeeded", "failed"]
            .iter()
            .map(|k| {
                e["activity"][k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .sum::<u64>()
            })
            .sum();
        assert_eq!(activity, succeeded + retried + discarded, "{path} activity");
        let p50 = e["p50_ms"].as_f64().unwrap();
        assert!(p50 <= e["p95_ms"].as_f64().unwrap(), "{path}");
    }
    assert_eq!(lane("/ok")["success_rate"], 1.0);
    assert!((lane("/fail/2")["success_rate"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9);
    assert_eq!(lane("/status/400")["success_rate"], 0.0);
    assert_eq!(lane("/fail/2")["last_error"]["error_type"], "server-error");
    assert_eq!(lane("/fail/2")["last_error"]["response_status"], 500);
    assert_eq!(
        lane("/status/400")["last_error"]["error_type"],
        "client-error"
    );
    assert_eq!(lane("/ok")["last_error"], Value::Null);
    // The sink waits 150 ms before answering: the latency buckets are within 2.2% above 64 ms.
    let p50 = lane("/slow/150")["p50_ms"].as_f64().unwrap();
    assert!((146.0..1_000.0).contains(&p50), "slow p50 {p50}");
    assert!(lane("/ok")["p95_ms"].as_f64().unwrap() < 146.0);

    // Without a window asked for, a fresh JobDB's chart fits its data: 5 minutes, not 30.
    let fitted = get(&client, &format!("{base}/api/overview"), 200).await;
    assert_eq!(fitted["minutes"], 5, "{fitted}");
    // Overview: transitions per state add up to what the JobDB holds.
    let overview = get(&client, &format!("{base}/api/overview?minutes=30"), 200).await;
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for (_, t) in rig.reader.all_transitions().await.unwrap() {
        *expected.entry(t.state.as_str().to_owned()).or_default() += 1;
    }
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for s in overview["series"].as_array().unwrap() {
        let counts: u64 = s["counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(s["total"].as_u64().unwrap(), counts, "{s}");
        assert_eq!(
            s["counts"].as_array().unwrap().len(),
            overview["slots"].as_array().unwrap().len()
        );
        if counts > 0 {
            totals.insert(s["state"].as_str().unwrap().to_owned(), counts);
        }
    }
    println!("overview totals: {totals:?}, slot {} s", overview["slot_s"]);
    assert_eq!(totals, expected);
    assert_eq!(totals["awaiting-scheduling"], 15);
    assert_eq!(totals["executing"], 21);
    assert_eq!(totals["awaiting-retry"], 6);
    assert_eq!(totals["succeeded"], 13);
    assert_eq!(totals["discarded"], 2);
    assert_eq!(overview["slot_s"], 30);
    let current: BTreeMap<String, u64> = overview["current"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["state"].as_str().unwrap().to_owned(),
                c["jobs"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!((current["succeeded"], current["discarded"]), (13, 2));

    // Traces by id (ULID and hex) and by idempotency key: the full history.
    let full = [
        "awaiting-scheduling",
        "executing",
        "awaiting-retry",
        "executing",
        "awaiting-retry",
        "executing",
        "succeeded",
    ];
    let by_id = get(&client, &format!("{base}/api/jobs/{retried_id}"), 200).await;
    let hex = by_id["traces"][0]["id_hex"].as_str().unwrap().to_owned();
    let by_hex = get(
        &client,
        &format!("{base}/api/jobs/{}", hex.to_lowercase()),
        200,
    )
    .await;
    let by_key = get(
        &client,
        &format!("{base}/api/jobs?idempotency_key=order-42"),
        200,
    )
    .await;
    for found in [&by_id, &by_hex, &by_key] {
        assert_eq!(found["traces"].as_array().unwrap().len(), 1, "{found}");
        let trace = &found["traces"][0];
        assert_eq!(trace["id"], retried_id.as_str());
        assert_eq!(trace["jobdb"], name.as_str());
        assert_eq!(trace["state"], "succeeded");
        assert_eq!(trace["attempts"], 3);
        assert_eq!(trace["idempotency_key"], "order-42");
        assert_eq!(trace["endpoint"], rig.sink.url("/fail/2"));
        assert!(trace.get("payload_base64").is_none() && trace.get("headers").is_none());
        assert_eq!(trace["payload_bytes"], r#"{"order":42}"#.len());
        let states: Vec<&str> = trace["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["state"].as_str().unwrap())
            .collect();
        assert_eq!(states, full);
        assert_eq!(found["unreachable"][0]["name"], "spindle_nowhere");
    }
    let none = get(
        &client,
        &format!("{base}/api/jobs?idempotency_key=nobody"),
        200,
    )
    .await;
    assert_eq!(none["traces"], json!([]));

    // Errors: unknown id 404 with a message, bad id and missing or bad parameters 400 naming
    // the field.
    let unknown = ulid::Ulid::new().to_string();
    let missing = get(&client, &format!("{base}/api/jobs/{unknown}"), 404).await;
    let message = missing["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&unknown) && message.contains("spindle_nowhere"),
        "{message}"
    );
    assert_eq!(missing["error"]["code"], "not_found");
    let bad = get(&client, &format!("{base}/api/jobs/not-a-job"), 400).await;
    assert_eq!(bad["error"]["field"], "id");
    assert!(bad["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not-a-job"));
    // Listing: every JobDB's jobs, newest first, by filter, a page at a time; the JobDB that
    // cannot be read is named.
    let discarded = get(&client, &format!("{base}/api/list?state=discarded"), 200).await;
    assert_eq!(
        discarded["jobs"].as_array().unwrap().len(),
        2,
        "{discarded}"
    );
    assert_eq!(discarded["unreachable"][0]["name"], "spindle_nowhere");
    let mut listed: Vec<String> = Vec::new();
    let mut after = String::new();
    loop {
        let page = get(&client, &format!("{base}/api/list?limit=4{after}"), 200).await;
        listed.extend(
            page["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_str().unwrap().to_owned()),
        );
        match page["next_after"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(listed.len(), 15, "{listed:?}");
    assert!(
        listed.windows(2).all(|w| w[0] > w[1]),
        "newest first: {listed:?}"
    );
    assert!(listed.contains(&retried_id));
    let bad = get(&client, &format!("{base}/api/list?state=done"), 422).await;
    assert_eq!(bad["error"]["field"], "state");
    let no_key = get(&client, &format!("{base}/api/jobs"), 400).await;
    assert_eq!(no_key["error"]["field"], "idempotency_key");
    for minutes in ["0", "abc", "100000"] {
        let bad = get(
            &client,
            &format!("{base}/api/overview?minutes={minutes}"),
            400,
        )
        .await;
        assert_eq!(bad["error"]["field"], "minutes");
    }

    // The inventory: the live JobDB with its size and owner, the other unreachable.
    let jobdbs = get(&client, &format!("{base}/api/jobdbs"), 200).await;
    println!("jobdbs: {jobdbs}");
    assert_eq!(jobdbs["discovery"], "static");
    let listed = jobdbs["jobdbs"].as_array().unwrap();
    assert_eq!(listed.len(), 2);
    let live = listed.iter().find(|j| j["name"] == name.as_str()).unwrap();
    assert_eq!(live["reachable"], true);
    assert!(live["bytes"].as_u64().unwrap() > 0);
    assert!(live["fencing_token"].as_u64().unwrap() >= 1);
    assert!(!live["owner"].as_str().unwrap().is_empty());
    // Every job here ended: no ordered job waits, no key is blocked, no notice is owed.
    assert_eq!(
        (
            &live["ordered_waiting"],
            &live["ordering_blocked"],
            &live["notices_owed"]
        ),
        (&json!(0), &json!(0), &json!(0))
    );
    assert!(live["age_s"].as_i64().unwrap() >= 0);
    let dead = listed
        .iter()
        .find(|j| j["name"] == "spindle_nowhere")
        .unwrap();
    assert_eq!(dead["reachable"], false);
    assert!(!dead["error"].as_str().unwrap().is_empty());

    // The ledger: the live JobDB balances (13 succeeded, 2 discarded), the other is named
    // unreachable.
    let ledger = get(&client, &format!("{base}/api/ledger"), 200).await;
    println!("ledger: {ledger}");
    let ledgers = ledger["jobdbs"].as_array().unwrap();
    let live = ledgers
        .iter()
        .find(|l| l["jobdb"] == name.as_str())
        .unwrap();
    assert_eq!(
        (
            &live["accepted"],
            &live["succeeded"],
            &live["discarded"],
            &live["open"]
        ),
        (&json!(15), &json!(13), &json!(2), &json!(0)),
        "{live}"
    );
    assert_eq!(live["findings"], json!([]));
    let dead = ledgers
        .iter()
        .find(|l| l["jobdb"] == "spindle_nowhere")
        .unwrap();
    assert_eq!(dead["findings"][0]["kind"], "unreachable");
    assert_eq!(ledger["total"]["accepted"], 15);

    // The page, rendered by a real browser.
    let page = client.get(&base).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page
        .text()
        .await
        .unwrap()
        .contains(r#"<section class="card" id="controls">"#));
    let chromium = chromium();
    let url = format!("{base}/?minutes=5&trace={retried_id}");
    let dom = render(chromium, &["--dump-dom", &url]).await;
    let dom = String::from_utf8_lossy(&dom).into_owned();
    assert!(
        dom.contains(r#"data-ready="true""#),
        "page never became ready:\n{dom}"
    );
    let throughput = section(&dom, "throughput");
    let attempts_chart = section(&dom, "attempts");
    let bars_drawn = throughput.matches(r#"<rect class="bar""#).count();
    println!("throughput chart: {bars_drawn} bars");
    assert!(bars_drawn >= 3, "{throughput}");
    assert!(throughput.contains("<path"), "no lines in {throughput}");
    for n in [1, 3] {
        assert!(
            attempts_chart.contains(&format!(r#"data-attempts="{n}""#)),
            "no bar for {n} attempts in {attempts_chart}"
        );
    }
    assert!(
        !attempts_chart.contains(r#"data-attempts="2""#),
        "a bar for zero jobs"
    );
    let table = section(&dom, "endpoints");
    for path in ["/ok", "/fail/2", "/status/400", "/slow/150"] {
        assert!(
            table.contains(&format!(r#"data-endpoint="{}""#, rig.sink.url(path))),
            "{path} missing from {table}"
        );
    }
    assert!(section(&dom, "jobdbs").contains(r#"data-jobdb="spindle_nowhere""#));
    assert!(section(&dom, "ledger").contains(&format!(r#"data-ledger="{name}""#)));
    assert!(section(&dom, "trace").contains(&format!(r#"data-job="{retried_id}""#)));
    assert!(section(&dom, "jobs").contains(&format!(r#"data-job="{retried_id}""#)));

    let shot = screenshot_path();
    let _ = std::fs::remove_file(&shot);
    render(
        chromium,
        &[&format!("--screenshot={}", shot.display()), &url],
    )
    .await;
    let png = std::fs::read(&shot).expect("screenshot written");
    println!("screenshot: {} ({} bytes)", shot.display(), png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&png[12..16], b"IHDR");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (1400, 2200));
    assert!(png.len() > 10 * 1024, "screenshot only {} bytes", png.len());
    // At 1,400 px every table fits: nothing scrolls sideways (the page names what would).
    assert!(
        dom.contains(r#"data-sideways="""#),
        "scrolls sideways at 1,400 px: {}",
        dom.split("data-sideways=\"")
            .nth(1)
            .unwrap_or("(no mark)")
            .split('"')
            .next()
            .unwrap()
    );

    dash.stop().await;
    rig.stop().await;
    println!("took {:.1} s", started.elapsed().as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_discovers_jobdbs_in_the_inventory() {
    let consul = ConsulUnderTest::start().await;
    if consul.double.is_none() {
        // The inventory's keys are global: only write them into a Consul of this test's own.
        println!("skipped: needs the in-repo Consul double");
        return;
    }
    let inventory = Inventory::new(consul.client.clone());
    let spare = TestDb::new("dashspare");
    JobDb::open(&spare.url, true, 1)
        .await
        .unwrap()
        .close()
        .await;
    let record = |db: &TestDb, state| JobDbRecord {
        name: db.url.database.clone(),
        url: db.url_string(),
        state,
        changed_at: chrono::Utc::now(),
        changed_by: "dashboard test".into(),
    };
    assert!(inventory
        .add(&record(&spare, JobDbState::Spare))
        .await
        .unwrap());
    let dropped = TestDb::new("dashdropped");
    assert!(inventory
        .add(&record(&dropped, JobDbState::Dropped))
        .await
        .unwrap());

    let mut config = DashboardConfig::new("127.0.0.1:0".parse().unwrap(), vec![]);
    config.consul = Some(consul.client.clone());
    config.discover_every = Duration::from_millis(100);
    let dash = dashboard::serve(config).await.expect("dashboard starts");
    let base = format!("http://{}", dash.addr());
    let client = reqwest::Client::new();

    let jobdbs = get(&client, &format!("{base}/api/jobdbs"), 200).await;
    assert_eq!(jobdbs["discovery"], "consul");
    let listed = jobdbs["jobdbs"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "dropped jobdbs are not shown: {jobdbs}");
    assert_eq!(listed[0]["name"], spare.url.database.as_str());
    assert_eq!(listed[0]["state"], "spare");
    assert_eq!(listed[0]["reachable"], true);
    assert_eq!(listed[0]["fencing_token"], 0);

    // A JobDB added to the inventory later is found by the next round; an unreachable one is
    // shown as such, and the panels still answer.
    let later = TestDb::new("dashlater");
    JobDb::open(&later.url, true, 1)
        .await
        .unwrap()
        .close()
        .await;
    assert!(inventory
        .add(&record(&later, JobDbState::Active))
        .await
        .unwrap());
    let ghost = JobDbRecord {
        url: UNREACHABLE.to_owned(),
        ..record(&TestDb::new("dashghost"), JobDbState::Active)
    };
    assert!(inventory.add(&ghost).await.unwrap());
    wait_for(Duration::from_secs(10), "re-discovery", || async {
        get(&client, &format!("{base}/api/jobdbs"), 200).await["jobdbs"]
            .as_array()
            .unwrap()
            .len()
            == 3
    })
    .await;
    let jobdbs = get(&client, &format!("{base}/api/jobdbs"), 200).await;
    let state_of = |name: &str| {
        jobdbs["jobdbs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["name"] == name)
            .map(|j| (j["state"].clone(), j["reachable"].clone()))
    };
    assert_eq!(
        state_of(&later.url.database),
        Some((json!("active"), json!(true)))
    );
    assert_eq!(state_of(&ghost.name), Some((json!("active"), json!(false))));
    let overview = get(&client, &format!("{base}/api/overview"), 200).await;
    assert_eq!(overview["jobdbs"], 2);
    assert_eq!(unreachable_names(&overview), vec![ghost.name.as_str()]);

    dash.stop().await;
    consul.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_controls_need_an_admin_token_and_reach_the_directors() {
    use spindle::rpc::auth::{Scope, TokenStore};
    let consul = ConsulUnderTest::start().await;
    if consul.double.is_none() {
        println!("skipped: controls are global keys; needs the in-repo Consul double");
        return;
    }
    let client = consul.client.clone();
    let rig = Rig::start("dashctl", |c| c.controls = Some(client)).await;
    let store = TokenStore::default()
        .with_token("spt_dash_admin", "ops", Scope::Admin)
        .with_token(
            "spt_dash_producer",
            "producer",
            Scope::Buckets(["b".to_owned()].into()),
        );
    let mut config =
        DashboardConfig::new("127.0.0.1:0".parse().unwrap(), vec![rig.db.url_string()]);
    config.consul = Some(consul.client.clone());
    config.auth = Some(std::sync::Arc::new(store));
    let dash = dashboard::serve(config).await.expect("dashboard starts");
    let base = format!("http://{}", dash.addr());
    let http = reqwest::Client::new();
    let status = |r: reqwest::Response| r.status().as_u16();

    // The page and the metrics are open (they hold no job data); the API needs an admin token.
    assert_eq!(status(http.get(&base).send().await.unwrap()), 200);
    let text = metrics_text(&http, &base).await;
    promtool_accepts(&text);
    assert_eq!(
        metric_value(&text, "spindle_dashboard_jobdbs{reachable=\"true\"}"),
        1.0,
        "{text}"
    );
    let api = format!("{base}/api/overview");
    assert_eq!(status(http.get(&api).send().await.unwrap()), 401);
    let producer = http
        .get(&api)
        .bearer_auth("spt_dash_producer")
        .send()
        .await
        .unwrap();
    assert_eq!(status(producer), 403);
    assert_eq!(
        status(
            http.get(&api)
                .bearer_auth("spt_dash_admin")
                .send()
                .await
                .unwrap()
        ),
        200
    );

    // Pause an endpoint from the dashboard: the running Director stops calling it.
    let paused = rig.sink.url("/status/299");
    let post = |body: Value| {
        http.post(format!("{base}/api/controls"))
            .bearer_auth("spt_dash_admin")
            .json(&body)
            .send()
    };
    let answer = post(json!({"action": "pause", "endpoint": format!("{paused}?x=1")}))
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let view: Value = answer.json().await.unwrap();
    assert_eq!(view["endpoints"][0]["endpoint"], paused.as_str());
    assert_eq!(view["endpoints"][0]["paused"], true);
    assert_eq!(view["endpoints"][0]["updated_by"], "ops (dashboard)");
    for (body, field) in [
        (json!({"action": "explode", "bucket": "b"}), "action"),
        (json!({"action": "limit", "bucket": "b"}), "endpoint"),
        (json!({"action": "pause"}), "endpoint"),
        (
            json!({"action": "limit", "endpoint": paused, "concurrency": 0}),
            "concurrency",
        ),
        (
            json!({"action": "pause", "endpoint": "ftp://x"}),
            "endpoint",
        ),
        (
            json!({"action": "pause", "bucket": "b", "extra": 1}),
            "body",
        ),
    ] {
        let refused = post(body.clone()).await.unwrap();
        assert_eq!(refused.status().as_u16(), 400, "{body}");
        let error: Value = refused.json().await.unwrap();
        assert_eq!(error["error"]["field"], field, "{body}: {error}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    rig.submit(rig.jobs(3, "/status/299", json!({}))).await;
    rig.submit(rig.jobs(3, "/ok", json!({}))).await;
    wait_for(Duration::from_secs(10), "the unpaused jobs", || async {
        rig.sink.per_job().len() == 3
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        rig.sink.received().iter().all(|r| r.path == "/ok"),
        "the paused endpoint was called"
    );

    // Park an endpoint from the dashboard: the panel lists it with who parked it.
    let failing = rig.sink.url("/status/503");
    let answer = post(json!({"action": "park", "endpoint": failing}))
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let view: Value = answer.json().await.unwrap();
    assert_eq!(view["parks"][0]["endpoint"], failing.as_str(), "{view}");
    assert_eq!(view["parks"][0]["parked_by"], "ops (dashboard)");
    let refused = post(json!({"action": "unpark", "bucket": "b"}))
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 400);

    // The page shows the control, for a browser that brings the token in the URL fragment.
    let chromium = chromium();
    let dom = render(
        chromium,
        &["--dump-dom", &format!("{base}/#token=spt_dash_admin")],
    )
    .await;
    let dom = String::from_utf8_lossy(&dom);
    assert!(
        dom.contains(r#"data-ready="true""#),
        "the page never rendered"
    );
    let controls = section(&dom, "controls");
    assert!(
        controls.contains(&paused)
            && controls.contains("paused")
            && controls.contains("control-form"),
        "{controls}"
    );
    assert!(
        controls.contains("parks-table") && controls.contains(&failing),
        "{controls}"
    );
    let shot = screenshot_path().with_file_name("dashboard-controls-screenshot.png");
    let png = render(
        chromium,
        &[
            &format!("--screenshot={}", shot.display()),
            &format!("{base}/#token=spt_dash_admin"),
        ],
    )
    .await;
    drop(png);
    println!("screenshot: {}", shot.display());

    // Unpark from the dashboard: the record says who, and its pace.
    let answer = post(json!({"action": "unpark", "endpoint": failing}))
        .await
        .unwrap();
    let view: Value = answer.json().await.unwrap();
    assert_eq!(view["parks"][0]["unparked_by"], "ops (dashboard)", "{view}");
    assert!(
        view["parks"][0]["redrive"]["start"].as_f64().is_some(),
        "{view}"
    );

    // Resume from the dashboard: the held jobs go out.
    let answer = post(json!({"action": "resume", "endpoint": paused}))
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    wait_for(Duration::from_secs(10), "the held jobs", || async {
        rig.sink.per_job().len() == 6
    })
    .await;
    dash.stop().await;
    rig.stop().await;
    consul.stop().await;
}

/// GETs `url`, asserts the status, returns the JSON body.
async fn get(client: &reqwest::Client, url: &str, status: u16) -> Value {
    let response = client.get(url).send().await.expect("request");
    let got = response.status().as_u16();
    let text = response.text().await.expect("body");
    assert_eq!(got, status, "GET {url}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {url}: {e}: {text}"))
}

fn bars(attempts: &Value) -> Vec<(u64, u64)> {
    attempts["succeeded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["attempts"].as_u64().unwrap(), b["jobs"].as_u64().unwrap()))
        .collect()
}

fn unreachable_names(answer: &Value) -> Vec<&str> {
    answer["unreachable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect()
}

/// The HTML of `<section ... id="{id}">` up to its end.
fn section<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!(r#"id="{id}""#))
        .unwrap_or_else(|| panic!("no section {id} in the page"));
    let end = dom[start..]
        .find("</section>")
        .map_or(dom.len(), |e| start + e);
    &dom[start..end]
}

/// Where the screenshot goes: beside the test binaries, in the workspace's target directory.
fn screenshot_path() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target dir")
        .join("dashboard-screenshot.png")
}

/// With a control database the page lists the subscriptions: state, caps, and their jobs not
/// yet finished over the JobDBs (a disabled one's parked jobs); without one, the panel stays
/// hidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_lists_subscriptions_with_their_waiting_jobs() {
    let control = Control::start(Engine::MySql).await;
    let rig = Rig::start("dashsub", control.tweak()).await;
    let api = rig.api();
    let on = api
        .add_subscription(&spindle_client::NewSubscription {
            max_concurrency: Some(3),
            ..spindle_client::NewSubscription::new("shop", rig.sink.url("/ok"), ["order.*"])
        })
        .await
        .unwrap();
    let off = api
        .add_subscription(&spindle_client::NewSubscription {
            enabled: Some(false),
            ..spindle_client::NewSubscription::new("shop", rig.sink.url("/ok"), ["*"])
        })
        .await
        .unwrap();
    for n in 0..3 {
        let event = spindle_client::NewEvent {
            bucket: "shop".into(),
            event_type: "order.paid".into(),
            payload: serde_json::value::RawValue::from_string(format!("{{\"n\":{n}}}")).unwrap(),
            idempotency_key: None,
            deliver_at: None,
            on_complete: None,
            traceparent: None,
            tracestate: None,
        };
        assert_eq!(api.publish(&event).await.unwrap().deliveries.len(), 2);
    }
    rig.wait_in_state(spindle::job::State::Succeeded, 3, Duration::from_secs(20))
        .await;

    let mut config =
        DashboardConfig::new("127.0.0.1:0".parse().unwrap(), vec![rig.db.url_string()]);
    config.subscriptions = Some(control.subscriptions.clone());
    let dash = dashboard::serve(config).await.expect("dashboard starts");
    let base = format!("http://{}", dash.addr());
    let client = reqwest::Client::new();
    let view = get(&client, &format!("{base}/api/subscriptions"), 200).await;
    assert_eq!(view["configured"], true);
    let rows = view["subscriptions"].as_array().unwrap();
    let row = |id: &str| rows.iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(rows.len(), 2);
    assert_eq!(row(&on.id)["waiting"], 0);
    assert_eq!(row(&on.id)["max_concurrency"], 3);
    assert_eq!(row(&off.id)["waiting"], 3, "the disabled one's jobs wait");
    assert_eq!(row(&off.id)["enabled"], false);
    assert!(rows.iter().all(|r| r.get("secret").is_none()));

    let dom = render(chromium(), &["--dump-dom", &format!("{base}/?minutes=5")]).await;
    let dom = String::from_utf8_lossy(&dom).into_owned();
    let panel = section(&dom, "subscriptions");
    assert!(
        !panel.starts_with(r#"id="subscriptions" hidden"#),
        "{panel}"
    );
    assert!(
        panel.contains(&format!(r#"data-subscription="{}""#, off.id)),
        "{panel}"
    );
    assert!(
        panel.contains("disabled") && panel.contains("3 at once"),
        "{panel}"
    );
    assert!(
        panel.contains(&format!(r#"data-toggle="{}""#, off.id)),
        "{panel}"
    );

    // Enabled from the dashboard: its waiting jobs go.
    let post = |body: Value| {
        client
            .post(format!("{base}/api/subscriptions"))
            .json(&body)
            .send()
    };
    let answer = post(json!({"id": off.id, "enabled": true})).await.unwrap();
    assert_eq!(answer.status(), 200);
    let view: Value = answer.json().await.unwrap();
    let rows = view["subscriptions"].as_array().unwrap();
    assert!(rows
        .iter()
        .any(|r| r["id"] == off.id.as_str() && r["enabled"] == true));
    rig.wait_in_state(spindle::job::State::Succeeded, 6, Duration::from_secs(20))
        .await;
    for (body, status) in [
        (json!({"id": "nope", "enabled": true}), 400),
        (
            json!({"id": ulid::Ulid::new().to_string(), "enabled": true}),
            404,
        ),
        (json!({"id": off.id}), 400),
    ] {
        assert_eq!(post(body.clone()).await.unwrap().status(), status, "{body}");
    }
    dash.stop().await;

    // Without a control database: not configured, the panel hidden.
    let dash = dashboard::serve(DashboardConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        vec![rig.db.url_string()],
    ))
    .await
    .unwrap();
    let bare = format!("http://{}/api/subscriptions", dash.addr());
    assert_eq!(get(&client, &bare, 200).await["configured"], false);
    dash.stop().await;
    rig.stop().await;
    control.stop().await;
}
