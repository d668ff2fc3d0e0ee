//! What happens to the system (the producers are [`super::producers`]): a schedule of
//! operations drawn from the seed switches
//! endpoints' behaviour, issues operator commands and endpoint controls, kills processes,
//! retires JobDBs, locks the private MariaDB, and releases blocked keys; and the faults that
//! find where a key's order breaks: a commit that fails or loses its answer, a dead
//! Director's JobDB retired and drained before any takeover, Directors leaving and joining
//! while keys flow, a lock on the checkpoint row during a takeover, a slow Consul; and a
//! bucket's erasure (`spindle erase`) while its jobs flow. Samplers
//! look at readiness and at jobs past their expiry while it runs.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spindle::job::JobId;
use spindle::registry::inventory::JobDbState;

use super::endpoint::Mode;
use super::events::{backfill, set_created_enabled, DISABLES, ENABLES};
use super::record::{Recorder, Violation};
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
    /// An operator parks a lane (`spindle endpoints park`; the schedule makes it fail for a
    /// while from then), or unparks it.
    Park(&'static str),
    Unpark(&'static str),
    /// `GET /v1/jobs` through the API (a router, or the Director alone), a few pages of a
    /// random filter: each page in id order, no job twice, each job matching the filter.
    List,
    /// `spindle erase --bucket B` over every JobDB (and the archive) while jobs flow: its
    /// jobs in flight end discarded, the ended ones lose their bytes.
    Erase(&'static str),
}

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
            false => rng.random_range(0..126),
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
            75..=76 if kinds.events => Op::Backfill(rng.random_range(1..40)),
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
            115..=119 => Op::List,
            120..=123 => {
                // A lane failing while parked: its jobs pile up, held, until it answers again
                // (a probe then unparks it) or the operator unparks it.
                let l = lane(rng);
                let back = t + secs(rng, 3.0, 6.0);
                ops.push((back.min(run), Op::Mode(l, Mode::Ok)));
                ops.push(((back + secs(rng, 0.0, 3.0)).min(run), Op::Unpark(l)));
                ops.push((t, Op::Mode(l, Mode::Fail)));
                Op::Park(l)
            }
            124..=125 => Op::Erase(BUCKETS[rng.random_range(0..BUCKETS.len())]),
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
        Op::Erase(bucket) => erase(world, rec, bucket, &consul).await,
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
        Op::Park(lane) | Op::Unpark(lane) | Op::Pause(lane) | Op::Resume(lane) => {
            let verb = match op {
                Op::Park(_) => "park",
                Op::Unpark(_) => "unpark",
                Op::Pause(_) => "pause",
                _ => "resume",
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
        Op::List => list(world, rec, rng).await,
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

/// Runs `spindle erase --bucket bucket` over the world's JobDBs (the inventory's, in a
/// cluster) and archive, and records what its receipt says.
async fn erase(world: &World, rec: &Recorder, bucket: &str, consul: &str) {
    let mut args: Vec<String> = ["erase", "--bucket", bucket, "--wait-secs", "8", "--json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    match &world.alone {
        Some(db) => args.extend(["--jobdb".into(), db.url_string()]),
        None => args.extend(["--registry", "consul", "--consul-addr", consul].map(String::from)),
    }
    match world.archive_args.is_empty() {
        true => args.push("--no-archive".into()),
        false => args.extend(world.archive_args.iter().cloned()),
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = crate::common::procs::run_async(&args).await;
    let receipt: serde_json::Value = match serde_json::from_slice(&out.stdout) {
        Ok(receipt) => receipt,
        Err(_) => {
            rec.op(format!(
                "erase bucket {bucket}: no receipt ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return;
        }
    };
    let time = |field: &str| {
        receipt[field]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    let (Some(before), Some(finished)) = (time("created_before"), time("finished_at")) else {
        return;
    };
    let sum = |field: &str| -> u64 {
        receipt["jobdbs"]
            .as_array()
            .map(|a| a.iter().filter_map(|j| j[field].as_u64()).sum())
            .unwrap_or(0)
    };
    rec.op_at(
        before,
        format!(
            "erase bucket {bucket}: {} discarded, {} jobs erased, {} archived erased; {} \
             (finished {})",
            sum("discarded"),
            sum("jobs"),
            receipt["archive"]["jobs"].as_u64().unwrap_or(0),
            match out.status.success() {
                true => "complete".to_owned(),
                false => format!("NOT complete: {}", receipt["unreached"]),
            },
            finished.format("%H:%M:%S%.3f"),
        ),
    );
    rec.erased(super::record::Erasure {
        bucket: bucket.to_owned(),
        before,
        finished,
        complete: out.status.success(),
    });
}

async fn spindle_cmd(args: &[&str]) {
    let out = crate::common::procs::run_async(args).await;
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

/// [`Op::List`]: up to 20 pages of a random filter and page size, checked as they come.
async fn list(world: &World, rec: &Recorder, rng: &mut StdRng) {
    use spindle::job::State;
    use spindle_client::{JobFilter, ListOrder};
    let filter = JobFilter {
        bucket: rng
            .random_bool(0.6)
            .then(|| BUCKETS[rng.random_range(0..BUCKETS.len())].to_owned()),
        state: [
            None,
            Some(State::Succeeded),
            Some(State::AwaitingRetry),
            Some(State::Discarded),
        ][rng.random_range(0..4)],
        order: [ListOrder::Newest, ListOrder::Oldest][rng.random_range(0..2)],
        ..JobFilter::default()
    };
    let limit = rng.random_range(1..60);
    let Ok(api) = spindle_client::Client::new(&world.api_base(), None) else {
        return;
    };
    let (mut after, mut seen, mut last): (Option<String>, HashSet<String>, Option<String>) =
        (None, HashSet::new(), None);
    let mut pages = 0;
    let what = format!("list {filter:?} by {limit}");
    let bad = |why: String, id: &str| {
        rec.violation(Violation {
            invariant: "list",
            at: Utc::now(),
            jobs: id.parse().ok().into_iter().collect(),
            what: format!("{what}: {why}"),
        })
    };
    let mut refused = String::new();
    while pages < 20 {
        // A page refused (a Director down: the listing would be incomplete) ends the op.
        let page = match api.jobs_page(&filter, after.as_deref(), limit).await {
            Ok(page) => page,
            Err(e) => {
                refused = format!("; then refused: {e}");
                break;
            }
        };
        pages += 1;
        if page.jobs.len() > limit {
            bad(format!("a page of {} jobs", page.jobs.len()), "");
        }
        for job in &page.jobs {
            if !seen.insert(job.id.clone()) {
                bad(format!("job {} listed twice", job.id), &job.id);
            }
            let in_order = last.as_ref().is_none_or(|l| match filter.order {
                ListOrder::Oldest => job.id > *l,
                ListOrder::Newest => job.id < *l,
            });
            if !in_order {
                bad(
                    format!("job {} out of order after {last:?}", job.id),
                    &job.id,
                );
            }
            last = Some(job.id.clone());
            let bucket_ok = filter.bucket.as_ref().is_none_or(|b| *b == job.bucket);
            let state_ok = filter.state.is_none_or(|s| s == job.state);
            if !(bucket_ok && state_ok) {
                bad(
                    format!("job {} of {} in {:?} listed", job.id, job.bucket, job.state),
                    &job.id,
                );
            }
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    rec.op(format!(
        "{what}: {} jobs in {pages} pages{refused}",
        seen.len()
    ));
}
