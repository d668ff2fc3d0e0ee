//! What a new owner reads is bounded by the open work, not by the JobDB's history.
//!
//! A takeover used to scan every transition ever written three times: `MAX(id)` (the key is
//! `(job_id, id)`), a GROUP BY over all of them to find stranded jobs, and a correlated MAX per
//! row for the first backlog page. `open_jobs` (schema 4) and an index on `id` make each a
//! look-up. The suite's test counts the rows InnoDB reads during a takeover on a private
//! MariaDB (its counters are this test's alone); `takeover_benchmark` (ignored, on demand)
//! times one over 10 M transitions.

mod common;

use std::time::{Duration, Instant};

use common::mariadb::PrivateMariaDb;
use common::*;
use spindle::director::{self, DirectorConfig};
use spindle::jobdb::JobDbUrl;

/// Appends `delivered` finished jobs (5 transitions each: scheduled, attempt, retry, attempt,
/// success) and open work (`open` retries due in an hour, 100 attempts in flight, 100 new
/// jobs) to a JobDB a Director created, as its own rows would be (`open_jobs` included).
async fn fill_history(pool: &sqlx::MySqlPool, delivered: u64, open: u64) {
    let statements = [
        "SET @ts = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS UNSIGNED) - 3600000".to_owned(),
        "SET @now = UTC_TIMESTAMP(6)".to_owned(),
        format!(
            "INSERT INTO jobs (id, bucket, endpoint, method, headers, payload, \
             execution_timeout_ms, backoff_min_delay_ms, backoff_coefficient, created_at, \
             expire_at, idempotency_key) \
             SELECT UNHEX(CONCAT(LPAD(HEX(@ts), 12, '0'), LPAD(HEX(seq), 20, '0'))), 'bench', \
             'http://127.0.0.1:9/hook', 'POST', '{{}}', REPEAT('x', 100), 10000, 1000, 2.0, \
             @now, @now + INTERVAL 4 HOUR, NULL FROM seq_1_to_{}",
            delivered + open + 200
        ),
        format!(
            "INSERT INTO job_state_transitions (id, job_id, time, retry_at, attempts, state) \
             SELECT (j.seq - 1) * 5 + k.seq, \
             UNHEX(CONCAT(LPAD(HEX(@ts), 12, '0'), LPAD(HEX(j.seq), 20, '0'))), @now, \
             IF(k.seq = 3, @now, NULL), \
             CASE k.seq WHEN 1 THEN 0 WHEN 2 THEN 1 WHEN 3 THEN 1 ELSE 2 END, \
             ELT(k.seq, 'awaiting-scheduling', 'executing', 'awaiting-retry', 'executing', \
                 'succeeded') \
             FROM seq_1_to_{delivered} j JOIN seq_1_to_5 k"
        ),
        // Open work: retries due in an hour, attempts in flight, new jobs.
        format!(
            "INSERT INTO job_state_transitions (id, job_id, time, retry_at, attempts, state) \
             SELECT {base} + j.seq, \
             UNHEX(CONCAT(LPAD(HEX(@ts), 12, '0'), LPAD(HEX(j.seq), 20, '0'))), @now, \
             CASE WHEN j.seq <= {retry_end} THEN @now + INTERVAL 1 HOUR END, \
             IF(j.seq <= {exec_end}, 1, 0), \
             CASE WHEN j.seq <= {retry_end} THEN 'awaiting-retry' \
                  WHEN j.seq <= {exec_end} THEN 'executing' \
                  ELSE 'awaiting-scheduling' END \
             FROM seq_{first}_to_{last} j",
            base = delivered * 5,
            first = delivered + 1,
            retry_end = delivered + open,
            exec_end = delivered + open + 100,
            last = delivered + open + 200,
        ),
        format!(
            "INSERT INTO open_jobs (job_id, transition_id, state, attempts, retry_at, expire_at) \
             SELECT t.job_id, t.id, t.state, t.attempts, t.retry_at, j.expire_at \
             FROM job_state_transitions t JOIN jobs j ON j.id = t.job_id WHERE t.id > {}",
            delivered * 5
        ),
    ];
    let mut conn = pool.acquire().await.unwrap();
    for statement in statements {
        sqlx::raw_sql(&statement)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

/// Rows InnoDB has read so far on the whole server (every `Handler_read_*` counter).
async fn rows_read(pool: &sqlx::MySqlPool) -> u64 {
    let rows: Vec<(String, String)> = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Handler_read%'")
        .fetch_all(pool)
        .await
        .unwrap();
    rows.iter().filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
}

/// Reads the server has been asked for so far: `SELECT`s run, and statements prepared (a read
/// whose table is missing fails at its prepare, and sqlx prepares it again on every try).
async fn selects(pool: &sqlx::MySqlPool) -> u64 {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_select', 'Com_stmt_prepare')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.iter().filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
}

fn config(url: &str) -> DirectorConfig {
    let url: JobDbUrl = url.parse().unwrap();
    let mut config = DirectorConfig::new("127.0.0.1:0".parse().unwrap(), url);
    config.lock_check_interval = Duration::from_millis(500);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_reads_the_open_work_not_the_history() {
    let server = PrivateMariaDb::start();
    let url = server.url("takeover_bound");
    let first = director::start(config(&url)).await.expect("schema");
    first.shutdown();
    first.wait().await.unwrap();
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    const DELIVERED: u64 = 100_000;
    fill_history(&pool, DELIVERED, 100).await;

    let before = rows_read(&pool).await;
    let started = Instant::now();
    let director = director::start(config(&url)).await.expect("takeover");
    let ready = started.elapsed();
    let base = format!("http://{}", director.addr());
    let client = reqwest::Client::new();
    // Everything open is back in the cache: the 100 retries, and the 200 jobs due now (the 100
    // attempts in flight were settled as interrupted and are due again).
    wait_for(Duration::from_secs(30), "the open work cached", || async {
        metric_value(
            &metrics_text(&client, &base).await,
            "spindle_jobs_backlog_loaded_total",
        ) >= 300.0
    })
    .await;
    let read = rows_read(&pool).await - before;
    println!(
        "takeover over {} transitions and 300 open jobs: ready in {:.0} ms, open work cached \
         in {:.0} ms, {read} rows read",
        DELIVERED * 5 + 300,
        ready.as_secs_f64() * 1000.0,
        started.elapsed().as_secs_f64() * 1000.0
    );
    // Before, each of three statements scanned the 500,000-row history.
    assert!(read < 50_000, "the takeover read {read} rows");

    // A failed read of the operator commands used to be retried at once, forever, when it was
    // the first one: the poller now always waits its second.
    director.shutdown();
    director.wait().await.unwrap();
    sqlx::raw_sql("RENAME TABLE operator_command_results TO hidden_results")
        .execute(&pool)
        .await
        .unwrap();
    let director = director::start(config(&url)).await.expect("restart");
    let before = selects(&pool).await;
    let window = Instant::now();
    wait_for(Duration::from_secs(5), "two seconds", || async {
        window.elapsed() >= Duration::from_secs(2)
    })
    .await;
    let ran = selects(&pool).await - before;
    println!("commands unreadable: {ran} reads in 2 s");
    assert!(ran < 200, "{ran} reads in 2 s: the command poller spins");
    director.shutdown();
    director.wait().await.unwrap();
    pool.close().await;
}

/// Takeover time over a JobDB of `SPINDLE_TAKEOVER_TRANSITIONS` transitions (10 M by default)
/// on the machine's MariaDB: time to ready, and to the first backlog pass done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; cargo test --release --test takeover takeover_benchmark -- --ignored --nocapture"]
async fn takeover_benchmark() {
    let transitions: u64 = std::env::var("SPINDLE_TAKEOVER_TRANSITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let db = TestDb::new("takeover");
    let url = db.url_string();
    let first = director::start(config(&url)).await.expect("schema");
    first.shutdown();
    first.wait().await.unwrap();
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let filled = Instant::now();
    fill_history(&pool, transitions / 5, 10_000).await;
    println!(
        "filled {transitions} transitions in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    for round in 1..=2 {
        let started = Instant::now();
        let director = director::start(config(&url)).await.expect("takeover");
        let ready = started.elapsed();
        let base = format!("http://{}", director.addr());
        let client = reqwest::Client::new();
        wait_for(Duration::from_secs(600), "the open work cached", || async {
            metric_value(&metrics_text(&client, &base).await, "spindle_jobs_cached") >= 10_000.0
        })
        .await;
        println!(
            "round {round}: ready after {:.2} s, open work (10,200 jobs) cached after {:.2} s",
            ready.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        director.shutdown();
        director.wait().await.unwrap();
    }
    pool.close().await;
}
