//! `spindle demo`: a Director on a fresh demo JobDB, a local test endpoint, and a producer
//! submitting a mix of jobs, so a newcomer sees deliveries, retries and discards in seconds.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use spindle_client::NewJob;

use crate::cli::sink::Sink;
use crate::director::{self, DirectorConfig};
use crate::job::State;
use crate::jobdb::{self, JobDb, JobDbUrl};

/// Options of `spindle demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Director RPC listen address.
    #[arg(long, env = "SPINDLE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The demo JobDB (dropped and recreated at start).
    #[arg(
        long,
        env = "SPINDLE_DEMO_JOBDB",
        hide_env_values = true,
        default_value = "mysql://root@127.0.0.1:3306/spindle_demo"
    )]
    pub jobdb: crate::secret::SecretUrl,
    /// Jobs that succeed at once (the others are a fixed mix).
    #[arg(long, default_value_t = 500)]
    pub jobs: usize,
    /// Exit when every job is final instead of serving until Ctrl-C.
    #[arg(long)]
    pub exit: bool,
}

/// Runs the demo.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let url: JobDbUrl = args.jobdb.expose().parse().context("--jobdb")?;
    jobdb::drop_database(&url)
        .await
        .context("resetting the demo jobdb")?;
    let sink = Sink::start("127.0.0.1:0".parse()?).await?;
    let mut config = DirectorConfig::new(args.listen, url.clone());
    // The demo's endpoint is on loopback, which deliveries may not reach by default.
    config.delivery.allow_subnets = vec!["127.0.0.0/8".parse()?];
    let director = director::start(config).await?;
    let base = format!("http://{}", director.addr());
    println!("director  {base}  (jobdb {})", url.database);
    println!("endpoint  {}", sink.url("/"));

    let mix = [
        ("/ok", args.jobs, "deliver at once"),
        ("/fail/2", 20, "fail twice, then succeed"),
        ("/retry-after/1", 5, "429 with Retry-After: 1, then succeed"),
        ("/status/400", 10, "400: discarded"),
        ("/redirect/301", 5, "301: not followed, discarded"),
    ];
    let client = spindle_client::Client::new(&base, None)?;
    let mut sample = HashMap::new();
    let mut total = 0;
    for (path, count, what) in mix {
        let jobs = (0..count)
            .map(|i| {
                Ok(NewJob {
                    backoff_min_delay_ms: Some(300),
                    execution_timeout_ms: Some(2000),
                    ..NewJob::new(format!("demo-tenant-{}", i % 3), sink.url(path))
                        .with_payload(&json!({"event": "demo", "n": i}))?
                })
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        for chunk in jobs.chunks(500) {
            let reply = client.submit(chunk).await?;
            sample
                .entry(path)
                .or_insert_with(|| reply.jobs[0].id.clone());
        }
        total += count;
        println!("submitted {count:>4} jobs to {path:<16} {what}");
    }

    let db = JobDb::open(&url, false, 2).await?;
    let started = std::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let counts = db.count_by_state().await?;
        let done: u64 = counts
            .iter()
            .filter(|(s, _)| s.is_terminal())
            .map(|(_, n)| n)
            .sum();
        let line: Vec<String> = State::ALL
            .iter()
            .filter_map(|s| counts.get(s).map(|n| format!("{s}={n}")))
            .collect();
        println!(
            "{:>5.1}s  {}",
            started.elapsed().as_secs_f64(),
            line.join("  ")
        );
        if done as usize >= total || started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    db.close().await;

    println!(
        "\nTrace a job over RPC:   curl -s {base}/v1/jobs/{}",
        sample["/fail/2"]
    );
    let hex = sample["/fail/2"]
        .parse::<crate::job::JobId>()
        .map(|id| id.to_hex())
        .unwrap_or_default();
    println!(
        "Trace it in SQL:        mysql -uroot -h127.0.0.1 {} -e \"SELECT id, time, state, attempts, retry_at, error_type, response_status FROM job_state_transitions WHERE job_id = UNHEX('{hex}') ORDER BY id\"",
        url.database
    );
    println!("Submit your own:        curl -s {base}/v1/jobs -H 'content-type: application/json' -d '{{\"jobs\":[{{\"bucket\":\"me\",\"endpoint\":\"{}\",\"payload\":{{\"hello\":\"world\"}}}}]}}'", sink.url("/ok"));
    println!(
        "Or with the CLI:        spindle submit --url {base} --bucket me --endpoint {} --payload '{{\"hello\":\"world\"}}'",
        sink.url("/ok")
    );
    if !args.exit {
        println!("\nThe director keeps running; Ctrl-C stops it.");
        crate::shutdown_signal().await;
    }
    director.shutdown();
    director.wait().await?;
    sink.stop().await;
    Ok(())
}
