//! `spindle bench`, small: the benchmark runs both paths (straight to a Director, and through
//! routers with Redis dedup to two Directors), delivers every job once and reports what each
//! component cost. The full runs are on demand (docs/benchmarks.md).

mod common;

use common::procs;

fn report(args: &[&str]) -> serde_json::Value {
    let out = procs::run(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "spindle {}\n{stdout}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
    let json = stdout.lines().last().expect("the report line");
    serde_json::from_str(json).expect("a JSON report")
}

fn check(r: &serde_json::Value, jobs: u64, components: &[&str]) {
    assert_eq!(r["jobs"], jobs);
    assert!(r["delivered_per_sec"].as_f64().unwrap() > 0.0);
    let requests = r["endpoint_requests"].as_u64().unwrap();
    assert!(requests >= jobs, "{requests} requests for {jobs} jobs");
    assert!(r["director_peak_rss_mib"].as_f64().unwrap() > 1.0);
    let cpu = r["cpu_ms_per_1000_jobs"].as_object().unwrap();
    for c in components {
        assert!(
            cpu.get(*c)
                .and_then(|v| v.as_f64())
                .is_some_and(|v| v > 0.0),
            "no CPU measured for {c}: {cpu:?}"
        );
    }
    assert!(r["spindle_cpu_us_per_job"].as_f64().unwrap() > 0.0);
    // What the jobs cost the server's disk: every job is at least its row and its end's row,
    // and group commits share a COMMIT among several jobs' requests.
    let writes = &r["mariadb_writes"];
    assert!(
        writes["rows_per_job"].as_f64().unwrap() >= 2.0,
        "rows per job: {writes}"
    );
    assert!(
        writes["log_bytes_per_job"].as_f64().unwrap() > 100.0,
        "{writes}"
    );
    assert!(
        writes["jobs_per_commit"].as_f64().unwrap() > 0.0,
        "{writes}"
    );
    assert!(
        writes["commits_per_sec"].as_f64().unwrap() > 0.0,
        "{writes}"
    );
}

#[test]
fn the_benchmark_measures_both_paths() {
    let direct = report(&[
        "bench",
        "--jobs",
        "2000",
        "--batch",
        "50",
        "--concurrency",
        "4",
    ]);
    check(&direct, 2000, &["director", "mariadb", "bench"]);
    assert_eq!(direct["routers"], 0);
    let routed = report(&[
        "bench",
        "--via-router",
        "--directors",
        "2",
        "--jobs",
        "2000",
        "--batch",
        "50",
        "--concurrency",
        "4",
        "--traced",
    ]);
    check(
        &routed,
        2000,
        &["director", "router", "mariadb", "redis", "bench"],
    );
    assert_eq!(routed["routers"], 1);
    assert_eq!(routed["traced"], true);
    assert!(routed["router_peak_rss_mib"].as_f64().unwrap() > 1.0);
    let backlog = report(&[
        "bench",
        "--jobs",
        "1000",
        "--backlog",
        "2000",
        "--concurrency",
        "4",
    ]);
    check(&backlog, 1000, &["director", "mariadb"]);
    assert_eq!(backlog["backlog"], 2000);
    // Events: 200 events to 5 subscriptions each (batches of 100 events a request) are 1,000
    // jobs, every one delivered, beside 2,000 subscriptions of other buckets that get none.
    let events = report(&[
        "bench",
        "--events",
        "--subscribers",
        "5",
        "--other-subscriptions",
        "2000",
        "--jobs",
        "1000",
        "--concurrency",
        "4",
    ]);
    check(&events, 1000, &["director", "mariadb"]);
    assert_eq!(events["subscribers"], 5);
    assert_eq!(events["other_subscriptions"], 2000);
}

/// A program that is not spindle's submits (`--generator`): what the JobDBs accepted is
/// measured, with the program's own CPU apart. Here a Python producer (10 requests of 20
/// keyed jobs through a router); with wrk installed, `scripts/bench/submit.lua` too, for 2 s.
#[test]
fn an_outside_generator_drives_the_production_path() {
    let producer = r#"python3 -c '
import json, os, urllib.request
env = os.environ
for r in range(10):
    jobs = [{"bucket": "bench-%d" % (k % 8), "endpoint": env["SPINDLE_BENCH_ENDPOINT"],
             "payload": {"n": k}, "idempotency_key": "%s-%d" % (env["SPINDLE_BENCH_TAG"], k)}
            for k in range(r * 20, r * 20 + 20)]
    request = urllib.request.Request(env["SPINDLE_BENCH_TARGET"] + "/v1/jobs",
        data=json.dumps({"jobs": jobs}).encode(), headers={"Content-Type": "application/json"})
    assert urllib.request.urlopen(request).status == 202
'"#;
    let routed = report(&["bench", "--via-router", "--generator", producer]);
    // 200 jobs: Redis and MariaDB may use less than a clock tick (10 ms) of CPU.
    check(&routed, 200, &["director", "router", "generator"]);
    assert!(routed["submit_p50_ms"].is_null(), "the generator's own");
    let wrk = std::process::Command::new("wrk").arg("--version").output();
    if wrk.is_err() {
        println!("wrk is not installed: scripts/bench/submit.lua not tried");
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench/submit.lua");
    let command = format!("exec wrk -t1 -c4 -d2s -s {script} \"$SPINDLE_BENCH_TARGET\" -- 1");
    let r = report(&[
        "bench",
        "--via-router",
        "--ordering-keys",
        "100",
        "--generator",
        &command,
    ]);
    let jobs = r["jobs"].as_u64().unwrap();
    assert!(jobs >= 100, "wrk submitted {jobs} jobs in 2 s");
    check(&r, jobs, &["director", "router", "generator"]);
}

/// Latency in open loops (`--latency`: the capacity, then 25–90% of it; `--rate`: one rate),
/// straight and through a router: every phase sends its rate for its seconds and reports
/// submit → accepted, first attempt and succeeded percentiles for every job.
#[test]
fn latency_is_measured_at_fixed_offered_loads() {
    let check_phases = |r: &serde_json::Value, loads: &[Option<f64>]| {
        let phases = r["latency"].as_array().expect("phases");
        assert_eq!(phases.len(), loads.len(), "{r}");
        for (p, load) in phases.iter().zip(loads) {
            assert_eq!(p["load"].as_f64(), *load, "{p}");
            let offered = p["offered_per_sec"].as_f64().unwrap();
            let jobs = p["jobs"].as_u64().unwrap() as f64;
            assert!(
                (jobs - (offered * 2.0).round().max(10.0)).abs() < 1.0,
                "{p}"
            );
            for what in ["accepted", "first_attempt", "succeeded"] {
                let q = &p[what];
                let (p50, p99, p999) = (
                    q["p50_ms"].as_f64().unwrap(),
                    q["p99_ms"].as_f64().unwrap(),
                    q["p999_ms"].as_f64().unwrap(),
                );
                assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{what}: {p}");
            }
        }
    };
    let direct = report(&[
        "bench",
        "--latency",
        "--jobs",
        "2000",
        "--batch",
        "10",
        "--concurrency",
        "4",
        "--rate-secs",
        "2",
    ]);
    let capacity = direct["capacity_per_sec"].as_f64().unwrap();
    assert!(capacity > 0.0, "{direct}");
    check_phases(&direct, &[Some(0.25), Some(0.5), Some(0.75), Some(0.9)]);
    let routed = report(&[
        "bench",
        "--via-router",
        "--rate",
        "200",
        "--rate-secs",
        "2",
        "--batch",
        "10",
    ]);
    assert!(routed["capacity_per_sec"].is_null(), "{routed}");
    check_phases(&routed, &[None]);
}

/// `--drain`: a drainer empties a retired JobDB of 2,000 jobs, a tenth expired: every retrying
/// job moved, every expired one archived; `--drop`: both ways of emptying a JobDB timed.
#[test]
fn the_drain_and_drop_benchmarks_account_for_every_job() {
    let r = report(&[
        "bench",
        "--drain",
        "--jobs",
        "2000",
        "--expired-percent",
        "10",
    ]);
    let drain = &r["drain"];
    assert_eq!(drain["jobs"], 2000, "{r}");
    assert_eq!(drain["expired"], 200, "{r}");
    assert_eq!(drain["retrying"], 1800, "{r}");
    assert_eq!(
        drain["archived_expired"], 200,
        "every expired job archived: {r}"
    );
    assert_eq!(
        drain["archived_histories"], 1800,
        "every moved job's history: {r}"
    );
    assert!(drain["jobs_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    let r = report(&["bench", "--drop", "--jobs", "2000"]);
    let drop = &r["drop"];
    assert_eq!(drop["jobs"], 2000, "{r}");
    assert!(drop["delete_seconds"].as_f64().unwrap() > 0.0, "{r}");
    assert!(drop["drop_seconds"].as_f64().unwrap() > 0.0, "{r}");
}

/// `spindle bench --dedup` over two private Redis servers and over two in-process stores: every
/// id claimed new, confirmed, then refused as a duplicate (the bench fails otherwise), with the
/// cost of each pass and, on Redis, the bytes each id holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dedup_benchmark_claims_confirms_and_repeats() {
    let servers = [
        common::redis_server::PrivateRedis::start(&[]).await,
        common::redis_server::PrivateRedis::start(&[]).await,
    ];
    let urls = format!("{},{}", servers[0].url(), servers[1].url());
    for stores in [urls.as_str(), "memory:,memory:"] {
        let args = [
            "bench",
            "--dedup",
            "--jobs",
            "20000",
            "--batch",
            "100",
            "--concurrency",
            "4",
            "--redis",
            stores,
        ];
        let r = tokio::task::block_in_place(|| report(&args));
        assert_eq!(r["ids"], 20000);
        let passes = r["passes"].as_array().unwrap();
        assert_eq!(passes.len(), 3);
        assert!(passes
            .iter()
            .all(|p| p["ids_per_sec"].as_f64().unwrap() > 0.0));
        if stores.starts_with("redis") {
            assert!(passes
                .iter()
                .all(|p| p["script_calls"].as_u64().unwrap() > 0));
            let confirmed = r["bytes_per_id_confirmed"].as_f64().unwrap();
            assert!(
                (1.0..1000.0).contains(&confirmed),
                "{confirmed} bytes per id"
            );
            assert!(r["hashes"].as_u64().unwrap() > 0);
            // The run's keys are gone.
            for server in &servers {
                let client = redis::Client::open(server.url()).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("bench:*")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(keys.is_empty(), "{} keys left", keys.len());
            }
        } else {
            assert_eq!(r["memory_entries"], 20000);
        }
    }
}
