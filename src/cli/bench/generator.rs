//! An outside load generator for `spindle bench --generator`: a program that is not spindle's
//! (wrk with `scripts/bench/submit.lua`, oha, a producer of one's own) submits the measured
//! jobs, so the bench measures the path as any HTTP client drives it, and the generator's CPU
//! is reported apart from spindle's.
//!
//! The program runs under `sh -c` with these variables, and the bench waits for it to exit:
//!
//! | variable | what |
//! |---|---|
//! | `SPINDLE_BENCH_TARGET` | where to submit (`POST $SPINDLE_BENCH_TARGET/v1/jobs`): the first router, or the Director |
//! | `SPINDLE_BENCH_TARGETS` | every target, comma-separated |
//! | `SPINDLE_BENCH_ENDPOINT` | the endpoint every job names (it answers 200 at once) |
//! | `SPINDLE_BENCH_JOBS`, `SPINDLE_BENCH_BATCH` | how many jobs, in requests of how many |
//! | `SPINDLE_BENCH_FIRST` | the number of the first job (jobs before it are the backlog's) |
//! | `SPINDLE_BENCH_PAYLOAD_BYTES` | payload size |
//! | `SPINDLE_BENCH_ORDERING_KEYS` | ordering keys per bucket (0: unordered) |
//! | `SPINDLE_BENCH_BUCKETS` | buckets, round-robin (`bench-<n mod buckets>`) |
//! | `SPINDLE_BENCH_TAG` | this run's name: idempotency keys must start with it (`$TAG-<n>`) |
//! | `SPINDLE_BENCH_KEYED` | `1` when the target is a router: give every job an idempotency key |
//!
//! What is measured is what the JobDBs accepted (less the backlog), whatever the program did.

use anyhow::Context;
use tokio::process::Command;

use super::procs::Measured;
use super::topology::Topology;
use super::BenchArgs;
use crate::jobdb::JobDb;

/// The variables a generator is given.
pub struct Env(Vec<(&'static str, String)>);

impl Env {
    /// What `args` asks for, against `topology`, jobs naming `endpoint`.
    pub fn of(args: &BenchArgs, topology: &Topology, endpoint: &str) -> Env {
        let first = topology.targets.first().cloned().unwrap_or_default();
        Env(vec![
            ("SPINDLE_BENCH_TARGET", first),
            ("SPINDLE_BENCH_TARGETS", topology.targets.join(",")),
            ("SPINDLE_BENCH_ENDPOINT", endpoint.to_owned()),
            ("SPINDLE_BENCH_JOBS", args.jobs.to_string()),
            ("SPINDLE_BENCH_FIRST", args.backlog.to_string()),
            ("SPINDLE_BENCH_BATCH", args.batch.to_string()),
            (
                "SPINDLE_BENCH_PAYLOAD_BYTES",
                args.payload_bytes.to_string(),
            ),
            (
                "SPINDLE_BENCH_ORDERING_KEYS",
                args.ordering_keys.to_string(),
            ),
            ("SPINDLE_BENCH_BUCKETS", args.buckets.to_string()),
            ("SPINDLE_BENCH_TAG", topology.tag.clone()),
            (
                "SPINDLE_BENCH_KEYED",
                if args.via_router { "1" } else { "0" }.to_owned(),
            ),
        ])
    }
}

/// Runs `command` under `sh -c` with `env` until it exits, its CPU (with that of anything it
/// started and waited for) measured as `generator` and pushed onto `measured`. Fails if it
/// cannot start or exits unsuccessfully.
pub async fn run(command: &str, env: &Env, measured: &mut Vec<Measured>) -> anyhow::Result<()> {
    // The bench's other children (Directors, routers) run on past the generator, so the CPU
    // of children that ended is the generator's own.
    let before = children_cpu_seconds()?;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .envs(env.0.iter().map(|(k, v)| (*k, v.as_str())))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the generator `{command}`"))?;
    let status = child.wait().await?;
    measured.push(Measured {
        component: "generator",
        // Ended: no pid to read again (its number may be another process's by now).
        pid: 0,
        start: before,
        last: children_cpu_seconds()?,
    });
    anyhow::ensure!(
        status.success(),
        "the generator `{command}` failed: {status}"
    );
    Ok(())
}

/// How long the count of jobs must stay the same to be taken as settled.
const SETTLED_AFTER: std::time::Duration = std::time::Duration::from_millis(300);

/// The jobs in `dbs`, once two counts `SETTLED_AFTER` apart agree.
pub async fn settled(dbs: &[JobDb]) -> anyhow::Result<u64> {
    let count = || async {
        let mut jobs = 0;
        for db in dbs {
            jobs += db.count_jobs().await?;
        }
        Ok::<u64, anyhow::Error>(jobs)
    };
    let mut last = count().await?;
    loop {
        tokio::time::sleep(SETTLED_AFTER).await;
        let now = count().await?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
}

/// CPU seconds (user + system) of this process's children that have ended and been waited for.
fn children_cpu_seconds() -> anyhow::Result<f64> {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).context("getrusage")?;
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(seconds(usage.user_time()) + seconds(usage.system_time()))
}
