//! What happens to the system (the producers are [`super::producers`]): a schedule of
//! operations drawn from the seed switches
//! endpoints' behaviour, issues operator commands and endpoint controls, kills processes,
//! retires JobDBs, locks the private MariaDB, and releases blocked keys; and the faults that
//! find where a key's order breaks: a commit that fails or loses its answer, a dead
//! Director's JobDB retired and drained before any takeover, Directors leaving and joining
//! while keys flow, a lock on the checkpoint row during a takeover, a slow Consul. Samplers
//! look at readiness and at jobs past their expiry while it runs.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use spindle::job::JobId;
use spindle::registry::inventory::JobDbState;
use spindle_client::JobStatus;

use super::endpoint::Mode;
use super::record::{Outcome, Recorder, Spec, Violation};
use super::world::{Slot, World};
use crate::common::sql_proxy::Hold;

/// The lanes (endpoints) jobs go to; ordered keys use the first two.
pub const LANES: [&str; 4] = ["a", "b", "c", "d"];
pub const BUCKETS: [&str; 2] = ["t1", "t2"];

/// How long past its expiry a job may still be open before that is a violation: the spec's
/// "expired within a few seconds", plus a drain or a failover in a cluster.
pub const EXPIRY_BOUND: Duration = Duration::from_secs(15);

/// One operation.
#[derive(Clone, Debug)]
pub enum Op {
    /// Switch a lane's behaviour.
    Mode(&'static str, Mode),
    /// An operator command (`expedite`, `postpone`, `flush`, `discard`) naming a recent job
    /// (an ordered one when `ordered`), a lane or a bucket.
    Command(&'static str, Target),
    Pause(&'static str),
    Resume(&'static str),
    Limit(&'static str, u32),
    Unlimit(&'static str),
    /// kill -9 of a Director, started again after the pause.
    KillDirector(usize, Duration),
    KillRouter(usize, Duration),
    /// A live JobDB marked retiring (as the manager does by age).
    Retire,
    /// The private MariaDB stops answering writes (`FLUSH TABLES WITH READ LOCK`) for a while.
    Outage(Duration),
    /// An operator releases every blocked key (`DELETE FROM ordering_blocked`).
    ReleaseBlocks,
    /// The `created` subscription disabled (`false`) or enabled again (`true`).
    Subscription(bool),
    /// Alone: a back-fill of this many events never published (`hist.updated`, so each wants
    /// one job, of `all`) sent twice at once, and once more a moment later, as a producer
    /// whose answer was lost would.
    Backfill(usize),
    /// The next COMMIT through the proxy in front of a JobDB fails (its connection drops, or
    /// it never reaches the server) or loses its answer; what it holds goes after the pause.
    CommitFault(Hold, Duration),
    /// kill -9 of a Director, its JobDB marked retiring before anyone takes it over (the
    /// drain of a dead Director's JobDB); the Director starts again after the pause.
    KillAndRetire(usize, Duration),
    /// A Director stops (SIGTERM) and starts again after the pause: Directors leaving and
    /// joining while keys flow.
    Leave(usize, Duration),
    /// kill -9 of a Director, then a transaction holds its JobDB's checkpoint row while it
    /// starts again and takes the JobDB over, for the pause.
    LockCheckpoint(usize, Duration),
    /// Every answer of Consul comes this much later, for a while.
    SlowConsul(Duration, Duration),
}

/// The cap the `created` subscription puts on its URL (lane b, which producers' jobs use too),
/// per Director.
pub const CREATED_PER_SECOND: f64 = 15.0;

/// The bucket events are published in.
pub const EVENT_BUCKET: &str = "events";
/// The payload limit of the worlds' Directors (`--max-payload-bytes`), below the routers'
/// (their default): an event larger than it passes a router's checks and is refused by every
/// Director for its content.
pub const DIRECTOR_MAX_PAYLOAD: usize = 8192;
/// How the log names the `created` subscription being disabled, and enabled again.
pub const DISABLES: &str = "subscription created disabled";
pub const ENABLES: &str = "subscription created enabled";

/// How the log names an operator's release of every blocked key (the quiet period's start
/// releases them too, and again until the end).
pub const RELEASES_BLOCKS: &str = "operator releases blocked keys";

#[derive(Clone, Copy, Debug)]
pub enum Target {
    Job { ordered: bool },
    Lane(&'static str),
    Bucket(&'static str),
}

/// Which operations a world supports.
#[derive(Clone, Copy)]
pub struct Kinds {
    pub cluster: bool,
    /// Events published to subscriptions (a control database).
    pub events: bool,
    /// A proxy in front of a JobDB's server, for commit faults.
    pub commit_faults: bool,
}

/// The operations of a run of `run`, in time order, drawn from `rng`.
pub fn schedule(rng: &mut StdRng, run: Duration, kinds: Kinds) -> Vec<(Duration, Op)> {
    let mut ops: Vec<(Duration, Op)> = Vec::new();
    let mut t = Duration::from_secs(2);
    let lane = |rng: &mut StdRng| LANES[rng.random_range(0..LANES.len())];
    let directors = if kinds.cluster { 3 } else { 1 };
    // The cluster's opening is its own (see [`Opening`]): until 4 s after the join, lanes and
    // operator commands only.
    let opened = match kinds.cluster {
        true => join_at(run) + Duration::from_secs(4),
        false => Duration::ZERO,
    };
    while t < run {
        let roll = match t < opened {
            true => rng.random_range(0..50),
            false => rng.random_range(0..115),
        };
        let op = match roll {
            0..=21 => {
                let l = lane(rng);
                let mode =
                    [Mode::Fail, Mode::TooMany, Mode::Hang, Mode::Flaky][rng.random_range(0..4)];
                let back = t + secs(rng, 2.0, 8.0);
                ops.push((back.min(run), Op::Mode(l, Mode::Ok)));
                Op::Mode(l, mode)
            }
            22..=49 => {
                let action = ["expedite", "postpone", "flush", "discard"][rng.random_range(0..4)];
                let target = match rng.random_range(0..10) {
                    0..=3 => Target::Job { ordered: true },
                    4..=6 => Target::Job { ordered: false },
                    7..=8 => Target::Lane(lane(rng)),
                    _ => Target::Bucket(BUCKETS[rng.random_range(0..BUCKETS.len())]),
                };
                Op::Command(action, target)
            }
            50..=59 => {
                let l = lane(rng);
                ops.push(((t + secs(rng, 1.0, 6.0)).min(run), Op::Resume(l)));
                Op::Pause(l)
            }
            60..=64 => {
                let l = lane(rng);
                ops.push(((t + secs(rng, 2.0, 8.0)).min(run), Op::Unlimit(l)));
                Op::Limit(l, rng.random_range(1..3))
            }
            65..=74 => Op::KillDirector(
                rng.random_range(0..if kinds.cluster { 3 } else { 1 }),
                secs(rng, 0.0, 2.0),
            ),
            75..=76 if kinds.events && !kinds.cluster => Op::Backfill(rng.random_range(1..40)),
            75..=79 => Op::ReleaseBlocks,
            80..=84 if kinds.cluster => Op::KillRouter(rng.random_range(0..2), secs(rng, 0.0, 1.5)),
            85..=91 if kinds.cluster => Op::Retire,
            92..=96 if kinds.cluster => Op::Outage(secs(rng, 2.0, 6.0)),
            97..=99 if kinds.cluster && !kinds.events => Op::Outage(secs(rng, 2.0, 6.0)),
            85..=99 if kinds.events => {
                ops.push(((t + secs(rng, 1.5, 5.0)).min(run), Op::Subscription(true)));
                Op::Subscription(false)
            }
            100..=104 if kinds.commit_faults => {
                let hold = [Hold::Drop, Hold::Commit, Hold::Answer][rng.random_range(0..3)];
                Op::CommitFault(hold, secs(rng, 2.5, 4.0))
            }
            105..=107 => Op::LockCheckpoint(rng.random_range(0..directors), secs(rng, 1.0, 4.0)),
            108..=109 => {
                let latency = Duration::from_millis(rng.random_range(100..400));
                Op::SlowConsul(latency, secs(rng, 2.0, 6.0))
            }
            110..=112 if kinds.cluster => {
                Op::KillAndRetire(rng.random_range(0..directors), secs(rng, 0.0, 2.0))
            }
            113..=114 if kinds.cluster => {
                Op::Leave(rng.random_range(0..directors), secs(rng, 1.0, 4.0))
            }
            _ => Op::ReleaseBlocks,
        };
        ops.push((t, op));
        t += secs(rng, 0.4, 2.5);
    }
    ops.sort_by_key(|(t, _)| *t);
    ops
}

/// A time between `lo` and `hi` seconds.
fn secs(rng: &mut StdRng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(rng.random_range(lo..hi))
}

/// Runs the operations at their times (relative to `start`).
pub async fn run_schedule(
    world: Arc<World>,
    rec: Arc<Recorder>,
    ops: Vec<(Duration, Op)>,
    start: tokio::time::Instant,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0005_eed0_f0b5);
    for (at, op) in ops {
        tokio::time::sleep_until(start + at).await;
        execute(&world, &rec, &op, &mut rng).await;
    }
}

async fn execute(world: &World, rec: &Recorder, op: &Op, rng: &mut StdRng) {
    let consul = world.consul.double.as_ref().unwrap().url();
    match op {
        Op::Subscription(enabled) => {
            // Told before the change when enabling, after it when disabling: the log's
            // window is never wider than the one the Director saw.
            if *enabled {
                rec.op(ENABLES.into());
            }
            set_created_enabled(world, *enabled).await;
            if !*enabled {
                rec.op(DISABLES.into());
            }
        }
        Op::Backfill(n) => backfill(world, rec, *n).await,
        Op::Mode(lane, mode) => {
            world.endpoint.set_mode(lane, *mode);
            rec.op(format!("lane {lane} answers {mode:?}"));
        }
        Op::Command(action, target) => {
            let condition = match target {
                Target::Job { ordered } => {
                    match rec.recent_job(rng.random_range(0..1000), *ordered) {
                        Some(id) => ("job_id", format!("X'{}'", id.to_hex()), id.to_string()),
                        None => return,
                    }
                }
                Target::Lane(lane) => {
                    let url = world.endpoint.lane_url(lane);
                    ("endpoint_prefix", format!("'{url}'"), url)
                }
                Target::Bucket(b) => ("bucket", format!("'{b}'"), b.to_string()),
            };
            let (extra_col, extra_val) = if *action == "postpone" {
                let until =
                    Utc::now() + chrono::Duration::milliseconds(rng.random_range(1000..5000));
                (
                    ", postpone_until",
                    format!(", '{}'", until.format("%Y-%m-%d %H:%M:%S%.6f")),
                )
            } else {
                ("", String::new())
            };
            let sql = format!(
                "INSERT INTO operator_commands (issued_by, action, {}{extra_col}) \
                 VALUES ('histories', '{action}', {}{extra_val})",
                condition.0, condition.1
            );
            let n = world.on_every_jobdb(&sql).await;
            rec.op(format!(
                "operator {action} {}={} (in {n} jobdbs)",
                condition.0, condition.2
            ));
        }
        Op::Pause(lane) | Op::Resume(lane) => {
            let verb = if matches!(op, Op::Pause(_)) {
                "pause"
            } else {
                "resume"
            };
            let url = world.endpoint.lane_url(lane);
            spindle_cmd(&[
                "endpoints",
                verb,
                "--endpoint",
                &url,
                "--consul-addr",
                &consul,
            ])
            .await;
            rec.op(format!("endpoints {verb} lane {lane}"));
        }
        Op::Limit(lane, n) => {
            let url = world.endpoint.lane_url(lane);
            let n = n.to_string();
            spindle_cmd(&[
                "endpoints",
                "limit",
                "--endpoint",
                &url,
                "--concurrency",
                &n,
                "--per-second",
                "20",
                "--consul-addr",
                &consul,
            ])
            .await;
            rec.op(format!("endpoints limit lane {lane} concurrency {n} 20/s"));
        }
        Op::Unlimit(lane) => {
            let url = world.endpoint.lane_url(lane);
            spindle_cmd(&[
                "endpoints",
                "limit",
                "--endpoint",
                &url,
                "--consul-addr",
                &consul,
            ])
            .await;
            rec.op(format!("endpoints limit lane {lane} (caps removed)"));
        }
        Op::KillDirector(i, down) => {
            let slot = &world.directors[*i];
            world.tally_remembered().await;
            slot.kill9().await;
            rec.killed(&slot.name);
            rec.op(format!(
                "kill -9 {} (back in {} ms)",
                slot.name,
                down.as_millis()
            ));
            tokio::time::sleep(*down).await;
            slot.start().await;
            rec.op(format!("{} started", slot.name));
        }
        Op::KillRouter(i, down) => {
            let slot = &world.routers[*i];
            slot.kill9().await;
            rec.op(format!(
                "kill -9 {} (back in {} ms)",
                slot.name,
                down.as_millis()
            ));
            tokio::time::sleep(*down).await;
            slot.start().await;
            rec.op(format!("{} started", slot.name));
        }
        Op::Retire => {
            let Some(inventory) = &world.inventory else {
                return;
            };
            let listed = inventory.list().await.unwrap_or_default();
            let active: Vec<_> = listed
                .into_iter()
                .filter(|l| l.record.state == JobDbState::Active)
                .collect();
            if active.is_empty() {
                return;
            }
            let pick = &active[rng.random_range(0..active.len())];
            let done = inventory
                .set_state(pick, JobDbState::Retiring, "histories")
                .await
                .unwrap_or(false);
            rec.op(format!(
                "retire jobdb {} ({})",
                pick.record.name,
                if done { "done" } else { "lost the race" }
            ));
        }
        Op::Outage(how_long) => {
            let Some(mariadb) = &world.mariadb else {
                return;
            };
            let server = mariadb.lock().unwrap().server();
            rec.op(format!(
                "outage: private mariadb read-locked for {} ms",
                how_long.as_millis()
            ));
            rec.crash("jobdb outage".into());
            rec.outage(true);
            outage(&server, *how_long).await;
            rec.outage(false);
            rec.op("outage over: private mariadb unlocked".into());
        }
        Op::ReleaseBlocks => {
            let at = chrono::Utc::now();
            let n = world.on_every_jobdb("DELETE FROM ordering_blocked").await;
            rec.op_at(at, format!("{RELEASES_BLOCKS} (in {n} jobdbs)"));
        }
        Op::CommitFault(hold, pause) => {
            let Some(proxy) = &world.proxy else {
                return;
            };
            proxy.arm(*hold);
            rec.op(format!(
                "commit fault: the next commit through the proxy, {hold:?}"
            ));
            // For the JobDB's writer, a short outage.
            rec.outage(true);
            tokio::time::sleep(*pause).await;
            let used = proxy.holding();
            proxy.disarm();
            proxy.release();
            rec.outage(false);
            rec.op(format!(
                "commit fault over ({})",
                if used {
                    "it happened"
                } else {
                    "no commit came"
                }
            ));
        }
        Op::KillAndRetire(i, down) => {
            let slot = &world.directors[*i];
            if !slot.running().await {
                return;
            }
            let owned = world.jobdb_of(*i).await;
            slot.kill9().await;
            rec.killed(&slot.name);
            // Before its lock's session expires: no one can have taken the JobDB over.
            let retired = match (&world.inventory, owned) {
                (Some(inventory), Some((_, Some(listed)))) => {
                    let done = inventory
                        .set_state(&listed, JobDbState::Retiring, "histories")
                        .await
                        .unwrap_or(false);
                    format!("jobdb {} retired: {done}", listed.record.name)
                }
                _ => "it served no jobdb".to_owned(),
            };
            rec.op(format!(
                "kill -9 {} and retire its jobdb before a takeover ({retired}; back in {} ms)",
                slot.name,
                down.as_millis()
            ));
            tokio::time::sleep(*down).await;
            slot.start().await;
            rec.op(format!("{} started", slot.name));
        }
        Op::Leave(i, down) => {
            let slot = &world.directors[*i];
            if !slot.running().await {
                return;
            }
            slot.term().await;
            rec.down(&slot.name);
            rec.op(format!(
                "{} leaves (SIGTERM; back in {} ms)",
                slot.name,
                down.as_millis()
            ));
            tokio::time::sleep(*down).await;
            slot.start().await;
            rec.op(format!("{} joins again", slot.name));
        }
        Op::LockCheckpoint(i, pause) => {
            let slot = &world.directors[*i];
            let Some((url, _)) = world.jobdb_of(*i).await else {
                return;
            };
            if url.sqlite_file().is_some() {
                return;
            }
            world.tally_remembered().await;
            slot.kill9().await;
            rec.killed(&slot.name);
            let lock = CheckpointLock::take(&url).await;
            start_held(rec, slot, lock, *pause).await;
        }
        Op::SlowConsul(latency, pause) => {
            let faults = world.consul.double.as_ref().unwrap().faults();
            faults.set_latency(*latency);
            rec.op(format!(
                "consul answers {} ms late for {} ms",
                latency.as_millis(),
                pause.as_millis()
            ));
            tokio::time::sleep(*pause).await;
            faults.set_latency(Duration::ZERO);
            rec.op("consul answers on time".into());
        }
    }
}

/// A transaction holding a MySQL JobDB's checkpoint row (`SELECT ... FOR UPDATE`), as an
/// operator's would. (A SQLite JobDB has no row locks: a transaction there stops every
/// writer, which a starting Director's ownership write then fails on.)
/// Starts `slot` again while `lock` holds its JobDB's checkpoint row, and lets the row go after
/// `pause`: the new owner cannot commit meanwhile.
async fn start_held(rec: &Recorder, slot: &Slot, lock: Option<CheckpointLock>, pause: Duration) {
    rec.op(format!(
        "{} starts again, its jobdb's checkpoint row locked ({}) for {} ms",
        slot.name,
        if lock.is_some() { "held" } else { "could not" },
        pause.as_millis()
    ));
    slot.start().await;
    tokio::time::sleep(pause).await;
    if let Some(lock) = lock {
        lock.release().await;
    }
    rec.op(format!("{}'s checkpoint row unlocked", slot.name));
}

struct CheckpointLock(sqlx::MySqlConnection);

impl CheckpointLock {
    async fn take(url: &spindle::jobdb::JobDbUrl) -> Option<CheckpointLock> {
        use sqlx::{ConnectOptions, Executor};
        if url.sqlite_file().is_some() {
            return None;
        }
        let mut conn = url.mysql_options().ok()?.connect().await.ok()?;
        conn.execute("BEGIN").await.ok()?;
        conn.execute("SELECT open_from FROM jobdb_checkpoint WHERE id = 1 FOR UPDATE")
            .await
            .ok()?;
        Some(CheckpointLock(conn))
    }

    async fn release(self) {
        use sqlx::{Connection, Executor};
        let mut conn = self.0;
        let _ = conn.execute("ROLLBACK").await;
        let _ = conn.close().await;
    }
}

/// Holds `FLUSH TABLES WITH READ LOCK` on the server for `how_long`: every write waits, reads
/// go on (a JobDB that stops answering writes).
async fn outage(server: &str, how_long: Duration) {
    use sqlx::{ConnectOptions, Connection, Executor};
    let url: spindle::jobdb::JobDbUrl = format!("{server}/mysql").parse().unwrap();
    let Ok(options) = url.mysql_options() else {
        return;
    };
    let Ok(mut conn) = options.connect().await else {
        return;
    };
    if conn.execute("FLUSH TABLES WITH READ LOCK").await.is_ok() {
        tokio::time::sleep(how_long).await;
        let _ = conn.execute("UNLOCK TABLES").await;
    }
    let _ = conn.close().await;
}

async fn spindle_cmd(args: &[&str]) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::common::procs::run(&args)
    })
    .await
    .unwrap();
    if !out.status.success() {
        println!(
            "histories: spindle command failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// When the other Directors join the cluster's director 0 in a run of `run`: a quarter in, at
/// most 6 s (until then its JobDB is the only live one).
pub fn join_at(run: Duration) -> Duration {
    (run / 4).min(Duration::from_secs(6))
}

/// How the cluster's start ends, when the other Directors join director 0 (the seed chooses):
/// the moments at which keys move between JobDBs, each with the fault that once broke a key's
/// order there.
#[derive(Clone, Copy, Debug)]
pub enum Opening {
    /// They join.
    Join,
    /// They join while every statement to the JobDBs' server is sent this late (a survey's
    /// reads of director 0's JobDB far apart), for 4 s.
    JoinWhileSlow(Duration),
    /// Director 0 dies, its JobDB is retired before anyone takes it over (the drainer moves its
    /// jobs), they join, and it starts again after the pause.
    KillAndRetire(Duration),
    /// Director 0 dies, they join, and it starts again held at its first commit (its JobDB's
    /// checkpoint row locked) for the pause.
    LockCheckpoint(Duration),
}

impl Opening {
    /// The opening of the run of `seed` (its own draw: the schedule of a seed stays as it was).
    pub fn of(seed: u64) -> Opening {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0be1_1175);
        match rng.random_range(0..4) {
            0 => Opening::Join,
            1 => Opening::JoinWhileSlow(Duration::from_millis(rng.random_range(50..250))),
            2 => Opening::KillAndRetire(secs(&mut rng, 0.0, 2.0)),
            _ => Opening::LockCheckpoint(secs(&mut rng, 1.0, 4.0)),
        }
    }
}

/// The cluster's start: director 0 alone for `after` (its JobDB the only live one: its
/// intake clears every key, and its commits let their jobs go), then the other Directors join
/// as `opening` says (their JobDBs go live, and keys that meet in two JobDBs go by the
/// sequencer). The others' reads must find director 0's jobs under way and waiting when they
/// join (key-order): lane a hangs from 2 s before the join (its keys' first jobs in flight
/// until their timeout, then retried; the ones behind them wait) until 2 s after the opening's
/// fault. What director 0 did alone is
/// printed.
pub async fn join_directors(
    world: Arc<World>,
    rec: Arc<Recorder>,
    after: Duration,
    opening: Opening,
) {
    let (w, r) = (world.as_ref(), rec.as_ref());
    let lane_a = |mode| async move {
        let op = Op::Mode(LANES[0], mode);
        execute(w, r, &op, &mut StdRng::seed_from_u64(0)).await;
    };
    let failing = Duration::from_secs(2).min(after);
    tokio::time::sleep(after - failing).await;
    lane_a(Mode::Hang).await;
    tokio::time::sleep(failing).await;
    let base = world.directors[0].base();
    let client = reqwest::Client::new();
    // Director 0 may be down (a kill -9 of the schedule): then nothing is read.
    let text = match client.get(format!("{base}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let born = crate::common::metric_value(&text, "spindle_ordered_born_total");
    rec.op(format!(
        "directors 1 and 2 join, {opening:?} (director 0's jobdb the only live one until now: \
         {born} ordered jobs born released, cleared at intake)"
    ));
    join(&world, &rec, opening).await;
    tokio::time::sleep(failing).await;
    lane_a(Mode::Ok).await;
}

/// Directors 1 and 2 start, with the opening's fault.
async fn join(world: &World, rec: &Recorder, opening: Opening) {
    let join = || async {
        for slot in &world.directors[1..] {
            slot.start().await;
        }
    };
    match opening {
        Opening::Join => join().await,
        Opening::JoinWhileSlow(late) => {
            let proxy = world.proxy.as_ref().expect("the cluster's proxy");
            proxy.slow(Some(late));
            rec.outage(true);
            join().await;
            tokio::time::sleep(Duration::from_secs(4)).await;
            proxy.slow(None);
            rec.outage(false);
            rec.op("the jobdbs' server answers at its own pace again".into());
        }
        Opening::KillAndRetire(down) => {
            let (op, mut rng) = (Op::KillAndRetire(0, down), StdRng::seed_from_u64(0));
            tokio::join!(execute(world, rec, &op, &mut rng), join());
        }
        Opening::LockCheckpoint(pause) => {
            let slot = &world.directors[0];
            let Some((url, _)) = world.jobdb_of(0).await else {
                return join().await;
            };
            slot.kill9().await;
            rec.killed(&slot.name);
            let lock = CheckpointLock::take(&url).await;
            join().await;
            // They serve their JobDBs (or 15 s passed) before it starts again.
            let _ = tokio::time::timeout(Duration::from_secs(15), async {
                for slot in &world.directors[1..] {
                    while !matches!(
                        world.client.get(format!("{}/readyz", slot.base())).send().await,
                        Ok(r) if r.status().is_success()
                    ) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            })
            .await;
            start_held(rec, slot, lock, pause).await;
        }
    }
}

/// Until `until`, every half second: a Director or router whose process exited on its own
/// (a Director that cannot read its JobDB at start exits non-zero) is started again, as the
/// deployment's supervisor would, and the log says so.
pub async fn supervise(world: Arc<World>, rec: Arc<Recorder>, until: tokio::time::Instant) {
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for slot in world.directors.iter().chain(&world.routers) {
            if let Some(ended) = slot.revive().await {
                rec.down(&slot.name);
                rec.op(format!(
                    "{} exited on its own ({ended}); started again by its supervisor",
                    slot.name
                ));
            }
        }
    }
}

/// While the run goes on: every few seconds, a job still open in a live JobDB more than
/// [`EXPIRY_BOUND`] past its expiry, not counting JobDB outages and the time Directors were
/// down since (a killed Director's JobDB waits for a takeover), is a violation (reported once
/// per job).
pub async fn expiry_watch(world: Arc<World>, rec: Arc<Recorder>, until: tokio::time::Instant) {
    let mut reported: std::collections::HashSet<JobId> = Default::default();
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = Utc::now();
        let bound = chrono::Duration::from_std(EXPIRY_BOUND).unwrap();
        for (name, url, _) in world.live_jobdbs().await {
            let Ok(db) = spindle::jobdb::JobDb::open_reader(&url, 1).await else {
                continue;
            };
            let open = db.open_work().await.unwrap_or_default();
            let ids: Vec<JobId> = open.iter().map(|w| w.job_id).collect();
            let jobs = db.get_jobs(&ids).await.unwrap_or_default();
            db.close().await;
            for job in jobs {
                let state = open
                    .iter()
                    .find(|w| w.job_id == job.id)
                    .map(|w| w.progress.state);
                // `archiving` is an end (the archive's confirmation follows it).
                if state == Some(spindle::job::State::Archiving) {
                    continue;
                }
                // Time the JobDBs could not be written does not count: nothing ends then.
                let stalled = rec.stalled_time(job.expire_at, now);
                if job.expire_at + bound + stalled < now && reported.insert(job.id) {
                    rec.violation(Violation {
                        invariant: "expiry-liveness",
                        at: job.expire_at,
                        jobs: vec![job.id],
                        what: format!(
                            "job {} ({}) still open ({state:?}) in {name} {:.1} s after its expiry",
                            job.id,
                            job.ordering
                                .as_ref()
                                .map_or("unordered".to_owned(), |o| format!("key {}", o.key)),
                            (now - job.expire_at).num_milliseconds() as f64 / 1000.0
                        ),
                    });
                }
            }
        }
    }
}

/// The two subscriptions of [`EVENT_BUCKET`] (see [`super::world::Subscribed`]).
pub async fn subscribe(world: &World) {
    let api = events_api(world);
    let add = |lane: &str, types: &[&str], per_second: Option<f64>| {
        let mut given = spindle_client::NewSubscription::new(
            EVENT_BUCKET,
            world.endpoint.lane_url(lane),
            types.iter().copied(),
        );
        given.execution_timeout_ms = Some(1000);
        given.backoff_min_delay_ms = Some(100);
        given.backoff_coefficient = Some(1.5);
        given.ttl_ms = Some(20_000);
        given.max_per_second = per_second;
        let api = api.clone();
        async move { api.add_subscription(&given).await.expect("subscription").id }
    };
    let all = add("a", &["hist.*"], None).await;
    let created = add("b", &["hist.created"], Some(CREATED_PER_SECOND)).await;
    // Every router's and Director's cache reads them within about a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = world
        .subscriptions
        .set(super::world::Subscribed { all, created });
}

fn events_api(world: &World) -> spindle_client::Client {
    spindle_client::Client::from_reqwest(world.client.clone(), &world.api_base(), None)
        .expect("events api")
}

/// Enables or disables the `created` subscription, trying until the Director answers.
pub async fn set_created_enabled(world: &World, enabled: bool) {
    let Some(s) = world.subscriptions.get() else {
        return;
    };
    let patch = spindle_client::SubscriptionPatch {
        enabled: Some(enabled),
        ..Default::default()
    };
    let api = events_api(world);
    for _ in 0..100 {
        match api.update_subscription(&s.created, &patch).await {
            Ok(_) => {
                edit_elsewhere(world, &s.created).await;
                return;
            }
            Err(e) => {
                println!("histories: subscription change failed, again: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    panic!("the subscription could not be changed");
}

/// At once, through another process (a Director, whose cache may not have read the change
/// yet), an edit of another field that changes nothing: it must not undo the change
/// (`subscription-held` fails if it enables the subscription again).
async fn edit_elsewhere(world: &World, id: &str) {
    let patch = spindle_client::SubscriptionPatch {
        event_types: Some(vec!["hist.created".to_owned()]),
        ..Default::default()
    };
    for director in &world.directors {
        let Ok(api) =
            spindle_client::Client::from_reqwest(world.client.clone(), &director.base(), None)
        else {
            continue;
        };
        if director.base() == world.api_base() {
            continue;
        }
        match api.update_subscription(id, &patch).await {
            Ok(_) => return,
            Err(e) => println!("histories: the edit through {} failed: {e}", director.name),
        }
    }
}

/// [`Op::Backfill`]: `n` events, each recorded as a spec of its own (its back-fill key), sent
/// to subscription `all` twice at once and once more 300 ms later. Every event must get one
/// job (`event-atomic` counts them); each answer's jobs are its acknowledged ones.
async fn backfill(world: &World, rec: &Recorder, n: usize) {
    let Some(subscribed) = world.subscriptions.get() else {
        return;
    };
    let events: Vec<spindle_client::PastEvent> = (0..n)
        .map(|i| spindle_client::PastEvent {
            event_id: ulid::Ulid::new().to_string(),
            event_type: "hist.updated".into(),
            timestamp: Utc::now(),
            data: serde_json::value::RawValue::from_string(json!({ "backfilled": i }).to_string())
                .expect("json"),
        })
        .collect();
    let specs: std::collections::HashMap<String, Spec> = events
        .iter()
        .map(|e| {
            let key = format!("backfill:{}", e.event_id);
            let spec = Spec {
                json: json!({"bucket": EVENT_BUCKET, "event_type": e.event_type}),
                key: key.clone(),
                seq: None,
                deliver_at: None,
            };
            rec.spec(&spec);
            (e.event_id.clone(), spec)
        })
        .collect();
    let request = spindle_client::BackfillRequest { events };
    let url = format!(
        "{}/v1/subscriptions/{}/backfill",
        world.api_base(),
        subscribed.all
    );
    let send = |delay: u64| {
        let (client, url, request) = (&world.client, &url, &request);
        async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            rec.request();
            client.post(url).json(request).send().await
        }
    };
    let answers = futures::future::join3(send(0), send(0), send(300)).await;
    let mut told = Vec::new();
    for sent in [answers.0, answers.1, answers.2] {
        let status = match sent {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                match r.json::<spindle_client::BackfillReply>().await {
                    Ok(reply) => {
                        for d in &reply.deliveries {
                            let Some(spec) = specs.get(&d.event_id) else {
                                continue;
                            };
                            let answer = spindle_client::AcceptedJob {
                                id: d.job_id.clone(),
                                status: JobStatus::Accepted,
                                bucket: EVENT_BUCKET.into(),
                                created_at: None,
                                expire_at: None,
                                deliver_at: None,
                                idempotency_key: Some(spec.key.clone()),
                                error: None,
                            };
                            let o = Outcome::Accepted(d.job_id.clone());
                            rec.outcome(spec, "director0", o, Some(&answer));
                        }
                        format!("{} made, {} skipped", reply.deliveries.len(), reply.skipped)
                    }
                    Err(e) => {
                        unknown(rec, &specs, format!("202 without a body: {e}"));
                        "202 unread".into()
                    }
                }
            }
            // The writer may have taken it: whether its jobs were stored is unknown.
            Ok(r) if r.status() == reqwest::StatusCode::GATEWAY_TIMEOUT => {
                unknown(rec, &specs, "504".into());
                "504".into()
            }
            Ok(r) => format!("{}", r.status()),
            Err(e) if e.is_connect() => "not connected".into(),
            Err(e) => {
                unknown(rec, &specs, e.to_string());
                "no answer".into()
            }
        };
        told.push(status);
    }
    rec.op(format!(
        "back-fill of {n} unpublished events to subscription all, twice at once and again: {}",
        told.join("; ")
    ));
}

/// Every spec of a back-fill whose answer was lost has an unknown outcome.
fn unknown(rec: &Recorder, specs: &std::collections::HashMap<String, Spec>, why: String) {
    for spec in specs.values() {
        rec.outcome(spec, "director0", Outcome::Unknown(why.clone()), None);
    }
}

/// How many jobs an event of this type makes (both subscriptions exist for the whole run).
pub fn fan_out(event_type: &str) -> usize {
    match event_type {
        "hist.created" => 2,
        _ => 1,
    }
}

/// Publishes events until `until`, recording each event's jobs as acknowledged jobs of one
/// spec (its idempotency key, which every job of the event carries). Alone, straight to the
/// Director, once (an unknown outcome stays unknown: no dedup there). In a cluster, through
/// the routers, again with the same key until an answer settles it: a repeat is answered
/// with the first event's jobs (`duplicate`), and a few keys are published twice on purpose.
pub async fn publisher(
    seed: u64,
    world: Arc<World>,
    rec: Arc<Recorder>,
    until: tokio::time::Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00e0_e0e0);
    let fronts: Vec<(String, String)> = match world.routers.is_empty() {
        true => vec![("director0".to_owned(), world.api_base())],
        false => world
            .routers
            .iter()
            .map(|r| (r.name.clone(), r.base()))
            .collect(),
    };
    let retries = fronts.len() > 1;
    let mut settled: Vec<Spec> = Vec::new();
    let mut n = 0usize;
    while tokio::time::Instant::now() < until {
        let again = retries && rng.random_range(0..100) < 10 && !settled.is_empty();
        let spec = match again {
            true => {
                settled[rng.random_range(settled.len().saturating_sub(5)..settled.len())].clone()
            }
            false => {
                n += 1;
                let event_type = ["hist.created", "hist.updated"][rng.random_range(0..2)];
                let key = format!("{}-ev-{n}", world.tag);
                // Now and then one too large for the Directors: answered 413, never stored.
                let payload = match rng.random_range(0..100) < 3 {
                    true => json!({"n": n, "pad": "x".repeat(DIRECTOR_MAX_PAYLOAD)}),
                    false => json!({"n": n}),
                };
                Spec {
                    json: json!({"bucket": EVENT_BUCKET, "event_type": event_type,
                                 "payload": payload, "idempotency_key": key}),
                    key,
                    seq: None,
                    deliver_at: None,
                }
            }
        };
        let expected = fan_out(spec.json["event_type"].as_str().unwrap_or_default());
        let oversized = spec.json["payload"].get("pad").is_some();
        rec.spec(&spec);
        for attempt in 0..40usize {
            let (via, base) = &fronts[(n + attempt) % fronts.len()];
            rec.request();
            let sent = world
                .client
                .post(format!("{base}/v1/events"))
                .json(&spec.json)
                .send()
                .await;
            let outcome = |o: Outcome| rec.outcome(&spec, via, o, None);
            let unknown = |why: String| {
                for _ in 0..expected {
                    outcome(Outcome::Unknown(why.clone()));
                }
            };
            match sent {
                // Refused for its content, straight or by every Director behind a router:
                // nothing stored, and no retry can help.
                Ok(r) if oversized && r.status() == reqwest::StatusCode::PAYLOAD_TOO_LARGE => {
                    outcome(Outcome::NotStored("413".into()));
                    break;
                }
                // Stored, or a content refusal answered as if a retry could help (503 naming
                // a Director's 413).
                Ok(r) if oversized && (r.status().is_success() || r.status().as_u16() == 503) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    if status.is_success() || text.contains("413 from") {
                        rec.violation(Violation {
                            invariant: "api",
                            at: Utc::now(),
                            jobs: Vec::new(),
                            what: format!(
                                "{via} answered {status} for event {} ({} bytes of payload, \
                                 over the Directors' {DIRECTOR_MAX_PAYLOAD}): {text}",
                                spec.key,
                                spec.json["payload"].to_string().len(),
                            ),
                        });
                        break;
                    }
                    outcome(Outcome::NotStored(format!("{status}")));
                }
                Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                    match r.json::<spindle_client::PublishReply>().await {
                        Ok(reply) => {
                            for d in &reply.deliveries {
                                let answer = spindle_client::AcceptedJob {
                                    id: d.job_id.clone(),
                                    status: JobStatus::Accepted,
                                    bucket: EVENT_BUCKET.into(),
                                    created_at: None,
                                    expire_at: None,
                                    deliver_at: None,
                                    idempotency_key: Some(spec.key.clone()),
                                    error: None,
                                };
                                let o = match reply.duplicate {
                                    true => Outcome::Duplicate(d.job_id.clone()),
                                    false => Outcome::Accepted(d.job_id.clone()),
                                };
                                rec.outcome(&spec, via, o, Some(&answer));
                            }
                            if reply.duplicate && reply.deliveries.is_empty() {
                                outcome(Outcome::Duplicate(String::new()));
                            }
                            if !reply.duplicate && reply.deliveries.len() != expected {
                                rec.violation(Violation {
                                    invariant: "event-fan-out",
                                    at: Utc::now(),
                                    jobs: Vec::new(),
                                    what: format!(
                                        "{via} answered event {} ({}) with {} jobs; it fans out \
                                         to {expected}",
                                        spec.key,
                                        spec.json["event_type"],
                                        reply.deliveries.len()
                                    ),
                                });
                            }
                            if !again {
                                settled.push(spec.clone());
                            }
                            break;
                        }
                        Err(e) => unknown(format!("202 without a body: {e}")),
                    }
                }
                // A write that ran out of time, or a router's unresolved forward.
                Ok(r) if r.status() == reqwest::StatusCode::GATEWAY_TIMEOUT => {
                    unknown(format!("504: {}", r.text().await.unwrap_or_default()))
                }
                Ok(r) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    if status.is_client_error() {
                        panic!("publish refused: {status} {text}");
                    }
                    outcome(Outcome::NotStored(format!("{status}")));
                }
                Err(e) if e.is_connect() => outcome(Outcome::NotStored(format!("connect: {e}"))),
                Err(e) => unknown(format!("{e}")),
            }
            if !retries {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(80..300))).await;
    }
}
