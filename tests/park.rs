//! Parking: an endpoint that fails for the policy's time is parked (its jobs wait, nothing is
//! discarded, one probe now and then), the first good probe unparks it, its jobs go again at
//! the re-drive's doubling pace, and the buckets' subscribers hear of both changes.
//!
//! `SPINDLE_PARK_JOBS` sets how many jobs are parked (2,000 by default; the run is
//! 100,000).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use spindle::delivery::signing::SigningSecret;
use spindle::job::State;
use spindle_client::NewSubscription;

/// Runs `spindle endpoints <args>` against the agent at `consul`, returning its stdout.
fn endpoints(consul: &str, args: &[&str]) -> String {
    let mut all = vec!["endpoints"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--consul-addr", consul]);
    procs::run_ok(&all)
}

/// The Director's view of one endpoint.
async fn health_of(rig: &Rig, endpoint: &str) -> Option<spindle::rpc::api::EndpointHealth> {
    let view: spindle::rpc::api::EndpointsView = rig
        .client
        .get(format!("{}/v1/endpoints", rig.base()))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    view.endpoints.into_iter().find(|e| e.endpoint == endpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_endpoint_parks_then_its_jobs_go_again_paced() {
    let jobs: usize = std::env::var("SPINDLE_PARK_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let (start, double_every) = (50.0, Duration::from_secs(2));
    let consul = ConsulUnderTest::start().await;
    let addr = consul.client.address().to_owned();
    let control = Control::start(Engine::MySql).await;
    let (client, events) = (consul.client.clone(), control.tweak());
    let rig = Rig::start("park", move |c| {
        c.controls = Some(client);
        events(c);
        c.scheduler.breaker.probe_min = Duration::from_millis(200);
        c.scheduler.breaker.probe_max = Duration::from_millis(500);
        c.scheduler.park.after = Some(Duration::from_secs(2));
        c.scheduler.park.probe_every = Duration::from_secs(1);
        c.scheduler.park.redrive.start = start;
        c.scheduler.park.redrive.double_every = double_every;
        c.scheduler.max_cached_jobs = jobs.max(150_000);
    })
    .await;
    let ops = rig
        .api()
        .add_subscription(&NewSubscription::new(
            "acme",
            rig.sink.url("/capture"),
            ["spindle.endpoint.*"],
        ))
        .await
        .expect("subscription");
    let secrets: HashMap<String, SigningSecret> =
        HashMap::from([(ops.id.clone(), ops.secret.unwrap().parse().unwrap())]);

    // The endpoint is down long enough to be parked for a while, then comes back.
    let up_at = chrono::Utc::now() + chrono::Duration::seconds(12);
    let path = format!("/down-until/{}", up_at.timestamp_millis());
    let endpoint = rig.sink.url(&path);
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(1000) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|_| json!({"bucket": "acme", "endpoint": endpoint, "ttl_ms": 600_000}))
            .collect();
        rig.submit(batch).await;
    }
    wait_for(Duration::from_secs(20), "the endpoint parked", || async {
        health_of(&rig, &endpoint)
            .await
            .is_some_and(|h| h.parked_since.is_some())
    })
    .await;
    let parked_at = Instant::now();
    let health = health_of(&rig, &endpoint).await.unwrap();
    println!(
        "parked: {} ready, reason {:?}, oldest {:?}",
        health.ready, health.park_reason, health.oldest_created_at
    );
    assert!(health.oldest_created_at.is_some(), "{health:?}");
    let listed = endpoints(&addr, &["list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains(&endpoint) && l.contains("parked")),
        "{listed}"
    );

    // While parked: about one probe a second, and no job ends; the first good probe ends it.
    wait_until_unparked(&rig, &endpoint).await;
    let came_back = rig
        .sink
        .received()
        .iter()
        .find(|r| r.path == path && r.status == 200)
        .map(|r| r.at)
        .expect("a good probe");
    let probes = rig
        .sink
        .received()
        .iter()
        .filter(|r| r.path == path && r.at > parked_at && r.at < came_back)
        .count();
    let parked_for = came_back.duration_since(parked_at).as_secs_f64();
    println!("parked {parked_for:.1} s: {probes} probes");
    assert!(
        (probes as f64) <= parked_for + 2.0,
        "{probes} requests in {parked_for:.1} s parked"
    );
    assert_eq!(count_in(&rig, State::Discarded).await, 0);

    // Unparked: the jobs go at the pace, which doubles, and every one succeeds.
    let unparked = came_back;
    wait_for(Duration::from_secs(300), "every job succeeded", || async {
        delivered(&rig, &path) == jobs
    })
    .await;
    let took = unparked.elapsed().as_secs_f64();
    let ok_after: Vec<Duration> = rig
        .sink
        .received()
        .iter()
        .filter(|r| r.path == path && r.status == 200)
        .map(|r| r.at.duration_since(came_back))
        .collect();
    let first_step = ok_after.iter().filter(|d| **d < double_every).count();
    let mut per_second = vec![
        0usize;
        1 + ok_after
            .iter()
            .map(|d| d.as_secs() as usize)
            .max()
            .unwrap_or(0)
    ];
    for d in &ok_after {
        per_second[d.as_secs() as usize] += 1;
    }
    println!("delivered per second after the good probe: {per_second:?}");
    let eta = spindle::director::parks::Redrive {
        start,
        double_every,
        until: 10_000.0,
    }
    .eta(Duration::ZERO, jobs)
    .unwrap()
    .as_secs_f64();
    println!(
        "re-drive: {jobs} jobs in {took:.1} s (the pace's own time {eta:.1} s); {first_step} in \
         the first {} s",
        double_every.as_secs()
    );
    // The first step allows its burst (one second's worth) and then its pace.
    let allowed = start * (1.0 + double_every.as_secs_f64()) + 5.0;
    assert!(
        (first_step as f64) <= allowed,
        "{first_step} requests in the first step, pace allows {allowed}"
    );
    assert!(
        took >= eta * 0.5,
        "{jobs} jobs in {took:.1} s: faster than the pace ({eta:.1} s)"
    );
    assert_eq!(count_in(&rig, State::Discarded).await, 0);

    // The bucket's subscriber heard of the park and of the unpark, once each, signed.
    wait_for(Duration::from_secs(20), "both events", || async {
        rig.sink
            .received()
            .iter()
            .filter(|r| r.path == "/capture")
            .count()
            >= 2
    })
    .await;
    let told: Vec<_> = rig
        .sink
        .received()
        .iter()
        .filter(|r| r.path == "/capture")
        .map(|r| event_arrival(r, &secrets))
        .collect();
    let types: Vec<&str> = told.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        ["spindle.endpoint.parked", "spindle.endpoint.unparked"]
    );
    for e in &told {
        assert_eq!(e.body["data"]["endpoint"], json!(endpoint), "{}", e.body);
    }
    assert_ne!(told[0].event_id, told[1].event_id);
    let listed = endpoints(&addr, &["list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains(&endpoint) && l.contains("unparked")),
        "{listed}"
    );

    rig.stop().await;
    control.stop().await;
    consul.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_parks_and_unparks_an_endpoint_and_a_bucket_sets_its_policy() {
    let consul = ConsulUnderTest::start().await;
    let addr = consul.client.address().to_owned();
    let client = consul.client.clone();
    let rig = Rig::start("parkop", move |c| {
        c.controls = Some(client);
        c.scheduler.park.after = None;
        c.scheduler.park.probe_every = Duration::from_secs(3600);
        c.scheduler.park.redrive.start = 1000.0;
    })
    .await;
    let endpoint = rig.sink.url("/ok");
    let out = endpoints(&addr, &["park", "--endpoint", &endpoint, "--by", "test"]);
    assert!(out.contains("parked"), "{out}");
    assert!(
        endpoints(&addr, &["park", "--endpoint", &endpoint]).contains("already"),
        "parking twice changes nothing"
    );
    // The Directors' controls watch sees it within a second or two.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A parked endpoint gets its first probe at once, and a good probe unparks it: an
    // operator's park holds a healthy endpoint for one request (to hold it, pause it).
    rig.submit(rig.jobs(20, "/ok", json!({}))).await;
    wait_for(Duration::from_secs(20), "the probe unparks it", || async {
        endpoints(&addr, &["list"])
            .lines()
            .any(|l| l.contains(&endpoint) && l.contains("unparked"))
    })
    .await;
    rig.wait_in_state(State::Succeeded, 20, Duration::from_secs(20))
        .await;

    // An operator's unpark of a parked endpoint whose probes never come.
    let down = rig.sink.url("/status/503");
    endpoints(&addr, &["park", "--endpoint", &down]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    rig.submit(rig.jobs(5, "/status/503", json!({}))).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tried = rig
        .sink
        .received()
        .iter()
        .filter(|r| r.path == "/status/503")
        .count();
    assert!(tried <= 1, "{tried} requests to a parked endpoint");
    let out = endpoints(&addr, &["unpark", "--endpoint", &down]);
    assert!(out.contains("unparked"), "{out}");
    assert!(endpoints(&addr, &["unpark", "--endpoint", &down]).contains("not parked"));
    wait_for(Duration::from_secs(10), "attempts again", || async {
        rig.sink
            .received()
            .iter()
            .filter(|r| r.path == "/status/503")
            .count()
            > tried
    })
    .await;

    // A bucket's policy: bad input refused, naming the flag; good input listed.
    let bad = procs::run(&[
        "endpoints",
        "park-after",
        "--bucket",
        "b",
        "--after",
        "soon",
        "--consul-addr",
        &addr,
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--after"));
    endpoints(&addr, &["park-after", "--bucket", "b", "--after", "never"]);
    endpoints(&addr, &["park-after", "--bucket", "c", "--after", "120"]);
    let listed = endpoints(&addr, &["list"]);
    assert!(listed.contains("never parks"), "{listed}");
    assert!(listed.contains("parks after 120 s"), "{listed}");
    endpoints(
        &addr,
        &["park-after", "--bucket", "b", "--after", "default"],
    );
    assert!(!endpoints(&addr, &["list"]).contains("never parks"));

    rig.stop().await;
    consul.stop().await;
}

/// Waits until the Director no longer reports the endpoint parked.
async fn wait_until_unparked(rig: &Rig, endpoint: &str) {
    wait_for(Duration::from_secs(60), "the endpoint unparked", || async {
        health_of(rig, endpoint)
            .await
            .is_some_and(|h| h.parked_since.is_none())
    })
    .await;
}

/// Requests to `path` answered 200.
fn delivered(rig: &Rig, path: &str) -> usize {
    rig.sink
        .received()
        .iter()
        .filter(|r| r.path == path && r.status == 200)
        .count()
}

/// Jobs in `state` in the rig's JobDB.
async fn count_in(rig: &Rig, state: State) -> u64 {
    rig.reader
        .count_by_state()
        .await
        .expect("counts")
        .get(&state)
        .copied()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_unparked_while_failing_parks_again_after_the_whole_policy() {
    let consul = ConsulUnderTest::start().await;
    let addr = consul.client.address().to_owned();
    let client = consul.client.clone();
    let rig = Rig::start("parkagain", move |c| {
        c.controls = Some(client);
        c.scheduler.breaker.probe_min = Duration::from_millis(200);
        c.scheduler.breaker.probe_max = Duration::from_millis(500);
        c.scheduler.park.after = Some(Duration::from_secs(3));
        c.scheduler.park.probe_every = Duration::from_secs(1);
    })
    .await;
    let endpoint = rig.sink.url("/status/503");
    rig.submit(rig.jobs(40, "/status/503", json!({"ttl_ms": 600_000})))
        .await;
    let parked = || async {
        health_of(&rig, &endpoint)
            .await
            .is_some_and(|h| h.parked_since.is_some())
    };
    wait_for(Duration::from_secs(20), "parked", parked).await;
    endpoints(&addr, &["unpark", "--endpoint", &endpoint]);
    let unparked = Instant::now();
    wait_until_unparked(&rig, &endpoint).await;
    // Its breaker has been open for seconds, but the policy counts from the unpark.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!parked().await, "parked again at once after the unpark");
    wait_for(Duration::from_secs(20), "parked again", parked).await;
    let again = unparked.elapsed().as_secs_f64();
    println!("parked again {again:.1} s after the unpark");
    assert!(again >= 3.0, "{again:.1} s");
    assert_eq!(count_in(&rig, State::Discarded).await, 0);
    rig.stop().await;
    consul.stop().await;
}
