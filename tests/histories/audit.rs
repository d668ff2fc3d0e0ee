//! `spindle audit` inside the checker: run at random moments while the operations go on (its
//! losses must never appear, kill -9 and outages included), and once at the end, where its
//! verdict must agree with the checker's own.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use spindle::dashboard::fleet::Fleet;
use spindle::dashboard::ledger::Rounds;
use spindle::ledger::{Kind, Ledger};

use super::record::{Recorder, Violation};
use super::world::World;

/// The invariants of the checker that name what the ledger sees: a job that never ended or
/// ended twice. (`lost`, a job acknowledged and stored nowhere, has no row for a ledger to
/// read.)
const LEDGER_INVARIANTS: [&str; 1] = ["one-end"];

/// What one run of `spindle audit --json` over the world's JobDBs said.
pub struct Audit {
    /// Its exit status was success.
    pub passed: bool,
    /// Each JobDB's ledger.
    pub ledgers: Vec<Value>,
    /// What it printed on stderr.
    pub stderr: String,
}

impl Audit {
    /// The findings of these kinds' class: losses (`loss`) or all.
    fn findings(&self, losses_only: bool) -> Vec<String> {
        let mut out = Vec::new();
        for l in &self.ledgers {
            for f in l["findings"].as_array().into_iter().flatten() {
                let loss =
                    serde_json::from_value::<Kind>(f["kind"].clone()).map_or(true, Kind::is_loss);
                if loss || !losses_only {
                    out.push(format!("{}: {f}", l["jobdb"]));
                }
            }
        }
        out
    }
}

/// Runs `spindle audit --json` over the world's JobDBs (alone: its one; in a cluster, the
/// inventory's).
pub async fn audit(world: &World) -> Audit {
    let mut args: Vec<String> = ["audit", "--json", "--margin-secs", "30"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    match &world.alone {
        Some(db) => args.extend(["--jobdb".into(), db.url_string()]),
        None => args.extend([
            "--registry".into(),
            "consul".into(),
            "--consul-addr".into(),
            world.consul.double.as_ref().unwrap().url(),
        ]),
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = crate::common::procs::run_async(&args).await;
    Audit {
        passed: out.status.success(),
        ledgers: String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The sampler's rounds over the world's JobDBs, kept from round to round: the incremental
/// ledger `spindle audit --every-secs` keeps (the same `Rounds` over the same kind of fleet),
/// compared at the end with a whole read.
pub struct Trackers {
    fleet: Fleet,
    rounds: Rounds,
}

impl Trackers {
    /// Over the world's JobDBs: alone, its one; in a cluster, the inventory's.
    pub fn new(world: &World) -> Trackers {
        let urls: Vec<String> = world.alone.iter().map(|db| db.url_string()).collect();
        let fleet = Fleet::new(&urls, world.inventory.clone(), 1, Duration::from_secs(10))
            .expect("the world's JobDBs make a fleet");
        Trackers {
            fleet,
            rounds: Rounds::default(),
        }
    }

    /// One round of every JobDB's tracker.
    async fn round(&mut self) -> Vec<Ledger> {
        self.rounds
            .round(&self.fleet, chrono::Duration::seconds(30))
            .await
    }
}

/// Audits at random moments (every 2–6 s) until `until`, by the binary (a whole read) and by
/// the trackers (what is new since their last round): any loss is a violation at once.
pub async fn sampler(
    world: Arc<World>,
    rec: Arc<Recorder>,
    until: tokio::time::Instant,
    seed: u64,
    trackers: Arc<tokio::sync::Mutex<Trackers>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00a0_d170);
    let mut n = 0;
    loop {
        let pause = Duration::from_secs_f64(rng.random_range(2.0..6.0));
        if tokio::time::Instant::now() + pause >= until {
            break;
        }
        tokio::time::sleep(pause).await;
        let at = Utc::now();
        let audit = audit(&world).await;
        let rounds = trackers.lock().await.round().await;
        n += 1;
        let by_binary = audit.findings(true);
        let by_rounds: Vec<String> = rounds
            .iter()
            .flat_map(|l| {
                l.findings.iter().filter(|f| f.kind.is_loss()).map(|f| {
                    let job = f.job.map(|j| j.to_string()).unwrap_or_default();
                    format!("{}: {} {job}: {}", l.jobdb, f.kind, f.detail)
                })
            })
            .collect();
        if !by_binary.is_empty() || !by_rounds.is_empty() {
            let first = |v: &[String]| v.iter().take(3).cloned().collect::<Vec<_>>();
            rec.violation(Violation {
                invariant: "audit",
                at,
                jobs: vec![],
                what: format!(
                    "losses at a random moment: spindle audit names {} ({:?}), the trackers {} ({:?})",
                    by_binary.len(),
                    first(&by_binary),
                    by_rounds.len(),
                    first(&by_rounds)
                ),
            });
        }
    }
    rec.op(format!("{n} audits at random moments"));
}

/// The trackers' last round against the end's whole read: the same findings (none, in a
/// healthy run), and no job counted that the whole read did not count. (A tracker may count
/// fewer: a job stored more than its lag after its id was made and ended between two rounds
/// is in no window.)
pub async fn rounds_agree(end: &Audit, trackers: &mut Trackers) -> Option<Violation> {
    let rounds = trackers.round().await;
    let mut wrong = Vec::new();
    for l in &rounds {
        let Some(full) = end.ledgers.iter().find(|f| f["jobdb"] == l.jobdb.as_str()) else {
            continue;
        };
        for (part, n) in l.parts().into_iter().filter(|(p, _)| *p != "open") {
            let whole = full[part].as_u64().unwrap_or(0);
            if n > whole {
                wrong.push(format!("{}: {part} {n} by rounds, {whole} whole", l.jobdb));
            } else if n < whole {
                println!(
                    "histories: {}: {part} {n} by rounds, {whole} whole",
                    l.jobdb
                );
            }
        }
        if full["open"].as_u64() != Some(l.open)
            || l.is_clean() != full["findings"].as_array().is_none_or(Vec::is_empty)
        {
            wrong.push(format!("{}: rounds say {l}, a whole read {full}", l.jobdb));
        }
    }
    (!wrong.is_empty()).then(|| Violation {
        invariant: "audit",
        at: Utc::now(),
        jobs: vec![],
        what: format!("the trackers' rounds and a whole read differ: {wrong:?}"),
    })
}

/// The end's audit against the checker's verdict. A loss the audit names must be one the
/// checker found too (a job that never ended or ended twice), and with the world quiet
/// nothing may stall. The converse cannot be asked: the checker also sees a job that stays
/// open too long, or ends once in each of two JobDBs, which no single JobDB's ledger shows.
pub fn agree(audit: &Audit, violations: &[Violation]) -> Option<Violation> {
    let checker_red = violations
        .iter()
        .any(|v| LEDGER_INVARIANTS.contains(&v.invariant));
    if audit.passed {
        if checker_red {
            println!("histories: spindle audit passed; the checker found one-end violations");
        }
        return None;
    }
    if checker_red {
        return None;
    }
    Some(Violation {
        invariant: "audit",
        at: Utc::now(),
        jobs: vec![],
        what: format!(
            "spindle audit failed where the checker found nothing: {:?} {}",
            audit.findings(false),
            audit.stderr
        ),
    })
}
