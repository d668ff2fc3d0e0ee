//! The random-history checker (issue 25): a seeded schedule of operations against real
//! processes, every request, answer and endpoint arrival recorded, and the lifecycle's
//! invariants checked while it runs and at the end (tests/histories/check.rs lists them).
//!
//! - `a_director_alone_keeps_every_invariant::{mysql,sqlite}`: one Director process on a JobDB
//!   of each engine; operations: lanes that fail, 429, hang and recover, operator commands
//!   (expedite, postpone, flush, discard of one job, a lane or a bucket), endpoint pause,
//!   resume and caps, kill -9 and restart, releases of blocked keys, a lock on the
//!   checkpoint row while it takes its JobDB over again (MySQL), a slow Consul, and (MySQL:
//!   the Director writes through a proxy) commits that fail or lose their answer. Alone, an
//!   ordered job whose key has nothing open goes in the commit that stores it (fresh, with no
//!   entry: a kill -9 leaves it to the next owner through the commit log), the key's later
//!   ones wait in the writer's book (*kept*: fresh, no entry, until their turn or a rest),
//!   and the next one goes in the commit that ends one, its attempt begun there too when the
//!   lane could take it (*begun on release*); its book is small (40 jobs), so sequences also
//!   spill to the store and go by the sequencer's reads. The key-order, one-end and
//!   nothing-early checks hold those paths, `unlisted` checks that every request that arrived
//!   was listed as begun by a commit of the JobDB, `misremembered` that the book never named
//!   a head the JobDB did not hold waiting, `kept` that the path ran at all, and `block-held`
//!   (both worlds) that a blocked key waits for the operator. The Director has a control
//!   database: a publisher sends events to two subscriptions (one takes every type, one
//!   `hist.created` only, and an operation disables it for a while); `event-atomic` checks
//!   every stored event has exactly one job per matching subscription across kill -9s and
//!   outages, `subscription-held` that the disabled one's jobs wait.
//! - `a_cluster_keeps_every_invariant`: three Directors on Consul, two routers (one with its
//!   clock 1.5 s ahead, under Debian's `faketime`), a manager retiring JobDBs every 12 s, a
//!   drainer, S3 (moto), JobDBs on the shared MariaDB and on a private one (reached through
//!   the commit-fault proxy); adds kill -9 of routers, retirements, a JobDB outage (`FLUSH
//!   TABLES WITH READ LOCK` on the private server), a dead Director's JobDB retired before any
//!   takeover, Directors leaving and joining while keys flow, a lock on the checkpoint row
//!   during a takeover. Events go through the routers (a control database on the shared
//!   server), again with the same key until settled and sometimes on purpose: `event-once`
//!   checks each key stored one event and every answer named its jobs, across router kills,
//!   and `dedup-expiry` that every key the routers wrote in Redis expires.
//!   Directors 1 and 2 join after the first seconds. A job whose key no other JobDB holds is
//!   *cleared* at intake and goes in the writer's commits, the others through the sequencer
//!   (producers send a key's jobs to several Directors and routers, so keys do meet in two
//!   JobDBs). The key-order checks hold across both (the log prints how many jobs went each
//!   way).
//!
//! In both worlds an operation lists jobs (`GET /v1/jobs`, through a router in the cluster) by
//! a random filter, checking each page as it comes, and at the end the whole listing must be
//! exactly the jobs of the JobDBs Directors serve, in SQL's states (`list`).
//!
//! A third of the producers' jobs carry a `traceparent`: every copy of such a job (each JobDB
//! it passed through, the archive) must keep it, and every request an endpoint gets must name
//! an attempt span of its own, outside its producer's trace (`trace`).
//!
//! In both worlds `spindle audit` runs at random moments (every 2–6 s): the binary reading
//! every JobDB whole, and in-process trackers reading what is new since their last round; a
//! loss either names is a violation at once (`audit`). At the end the binary's verdict must
//! agree with the checker's (a loss it names is a job the checker finds never ended or ended
//! twice, and nothing stalls), and the trackers' counts may not exceed the whole read's.
//! (Seen: with the write path's `open_jobs` entry of a retrying job left out, both fail: the
//! audit names the jobs vanished at the first random moment, the checker finds them never
//! ended after a kill -9.)
//!
//! Every run prints its seed; `SPINDLE_HISTORY_SEED=<seed>` replays its schedule and its
//! producers' choices (timing differs run to run), `SPINDLE_HISTORY_SECS` sets how long the
//! operations run (the suite's default is short; see docs/testing.md for the long run).

mod common;
#[path = "histories/mod.rs"]
mod histories;

use common::Engine;
use histories::world::World;
use histories::Plan;

/// The runs of this file take turns: each is a whole system on two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn verdict(name: &str, violations: &[histories::record::Violation]) {
    assert!(
        violations.is_empty(),
        "{name}: {} violations (the report above lists each, with the operations before it and \
         the seed to replay)",
        violations.len()
    );
}

async fn a_director_alone_keeps_every_invariant(engine: Engine) {
    let _one = ONE_AT_A_TIME.lock().await;
    let name = match engine {
        Engine::MySql => "a_director_alone_keeps_every_invariant::mysql",
        Engine::Sqlite => "a_director_alone_keeps_every_invariant::sqlite",
    };
    let world = World::alone(engine).await;
    let violations = histories::run(world, Plan::from_env(15, 3), name).await;
    verdict(name, &violations);
}

on_both_engines!(a_director_alone_keeps_every_invariant);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_every_invariant() {
    let _one = ONE_AT_A_TIME.lock().await;
    let name = "a_cluster_keeps_every_invariant";
    common::debian_tool("faketime", "--version", "faketime");
    let world = World::cluster().await;
    let violations = histories::run(world, Plan::from_env(25, 4), name).await;
    verdict(name, &violations);
}

/// Found by the checker (seed 2 of `a_cluster_keeps_every_invariant`): a job submitted
/// through a router whose clock runs ahead (within `--dedup-max-skew-ms`) with a `deliver_at`
/// less than the skew away was delivered at once, up to the skew early. The router reads a
/// `deliver_at` its clock has passed as "now", and the Director takes a forwarded job as
/// scheduled only when its time is after `created_at`, which is the router's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_scheduled_through_a_router_whose_clock_runs_ahead_never_arrives_early() {
    use histories::world::Slot;
    use spindle::registry::inventory::{Inventory, JobDbRecord, JobDbState};
    use std::time::{Duration, Instant};
    let _one = ONE_AT_A_TIME.lock().await;
    common::debian_tool("faketime", "--version", "faketime");
    let consul = common::ConsulUnderTest::start().await;
    let consul_url = consul.double.as_ref().unwrap().url();
    let tag = format!("hr{}", &ulid::Ulid::new().to_string().to_lowercase()[18..]);
    let name = format!("{tag}_0");
    let url = format!("{}/{name}", common::mysql_server());
    let db = spindle::jobdb::JobDb::open(&url.parse().unwrap(), true, 2)
        .await
        .unwrap();
    let record = JobDbRecord {
        name: name.clone(),
        url: url.clone(),
        state: JobDbState::Spare,
        changed_at: chrono::Utc::now(),
        changed_by: "test".into(),
    };
    assert!(Inventory::new(consul.client.clone())
        .add(&record)
        .await
        .unwrap());
    let sink = spindle::cli::sink::Sink::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let director = Slot::new(
        "director",
        args(&[
            "director",
            "--registry",
            "consul",
            "--consul-addr",
            &consul_url,
            "--listen",
            "127.0.0.1:{port}",
            "--lock-ttl-ms",
            "1000",
            "--lock-delay-ms",
            "500",
            "--service-ttl-ms",
            "3000",
            "--campaign-retry-ms",
            "200",
            "--allow-subnet",
            "127.0.0.0/8",
            "--director-id",
            &format!("{tag}-d0"),
        ]),
        None,
    );
    let router = Slot::new(
        "router",
        args(&[
            "router",
            "--consul-addr",
            &consul_url,
            "--listen",
            "127.0.0.1:{port}",
            "--redis",
            "a=memory:",
            "--placement-prefix",
            &format!("spindle-test/{tag}/placements"),
            "--dedup-max-skew-ms",
            "2000",
            "--pending-wait-ms",
            "1000",
            "--dedup-pending-ttl-ms",
            "3000",
            "--catalog-ms",
            "200",
        ]),
        Some(format!(
            "+{:.1}s",
            histories::world::SKEW_MS as f64 / 1000.0
        )),
    );
    let client = reqwest::Client::new();
    for base in [director.base(), router.base()] {
        common::wait_for(
            Duration::from_secs(30),
            &format!("{base} ready"),
            || async {
                matches!(client.get(format!("{base}/readyz")).send().await,
                     Ok(r) if r.status().is_success())
            },
        )
        .await;
    }
    let ahead = Duration::from_millis(700);
    let submitted = Instant::now();
    let deliver_at = chrono::Utc::now() + chrono::Duration::from_std(ahead).unwrap();
    let jobs: Vec<serde_json::Value> = (0..5)
        .map(|i| {
            serde_json::json!({"bucket": "b", "endpoint": sink.url("/ok"),
                "idempotency_key": format!("{tag}-{i}"), "deliver_at": deliver_at})
        })
        .collect();
    let reply = common::submit(&client, &router.base(), jobs).await;
    assert!(reply.jobs.iter().all(|j| j.status.is_stored()));
    common::wait_for(Duration::from_secs(20), "five deliveries", || async {
        sink.ok_total() >= 5
    })
    .await;
    for r in sink.received() {
        let after = r.at.duration_since(submitted);
        assert!(
            after + Duration::from_millis(2) >= ahead,
            "job {} arrived {} ms after submission, due {} ms after",
            r.job_id,
            after.as_millis(),
            ahead.as_millis()
        );
    }
    router.term().await;
    director.term().await;
    db.close().await;
    let _ = spindle::jobdb::drop_database(&url.parse().unwrap()).await;
    sink.stop().await;
    consul.stop().await;
}

/// Found by the checker (seed 3 of `a_director_alone_keeps_every_invariant::sqlite`, seed 1 on
/// MySQL): an operator's `postpone` whose time is before a job's own next attempt brought the
/// job forward. A job scheduled for 4 s ahead, postponed "until 1 s from now", was delivered
/// at 1 s, three seconds before its `deliver_at`; a postpone means "due later", never sooner.
async fn a_postpone_never_brings_a_job_forward(engine: Engine) {
    use std::time::{Duration, Instant};
    let rig = common::Rig::start_on(engine, "postpone", |_| {}).await;
    let ahead = Duration::from_secs(4);
    let submitted = Instant::now();
    let deliver_at = chrono::Utc::now() + chrono::Duration::from_std(ahead).unwrap();
    let reply = rig
        .submit(rig.jobs(
            3,
            "/ok",
            serde_json::json!({"bucket": "later", "deliver_at": deliver_at}),
        ))
        .await;
    assert_eq!(reply.jobs.len(), 3);
    let until = chrono::Utc::now() + chrono::Duration::seconds(1);
    common::operator_sql(
        &rig.reader,
        &format!(
            "INSERT INTO operator_commands (issued_by, action, bucket, postpone_until) \
             VALUES ('test', 'postpone', 'later', '{}')",
            until.format("%Y-%m-%d %H:%M:%S%.6f")
        ),
    )
    .await;
    common::wait_for(Duration::from_secs(15), "three deliveries", || async {
        rig.sink.ok_total() >= 3
    })
    .await;
    for r in rig.sink.received() {
        let after = r.at.duration_since(submitted);
        assert!(
            after + Duration::from_millis(2) >= ahead,
            "job {} arrived {} ms after submission, scheduled for {} ms and postponed",
            r.job_id,
            after.as_millis(),
            ahead.as_millis()
        );
    }
    rig.stop().await;
}

on_both_engines!(a_postpone_never_brings_a_job_forward);
