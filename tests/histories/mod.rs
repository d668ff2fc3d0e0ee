//! The random-history checker's parts: the system under test ([`world`]), the endpoints that
//! record arrivals ([`endpoint`]), the recorder ([`record`]), the operations ([`ops`]), the
//! producers and the readiness sampler ([`producers`]), `spindle audit` at random moments and
//! at the end ([`audit`]) and the invariants ([`check`]); [`run`]
//! puts them together.

pub mod audit;
pub mod check;
pub mod endpoint;
pub mod events;
pub mod ops;
pub mod parks;
pub mod producers;
pub mod record;
pub mod world;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use spindle::job::JobId;
use spindle::registry::inventory::JobDbState;

use check::{first_end, ApiViews, Inputs};
use record::{Recorder, Violation};
use world::{Stored, World};

/// A run's seed (`SPINDLE_HISTORY_SEED`, else random) and length of operations
/// (`SPINDLE_HISTORY_SECS`, else `default_secs`).
pub struct Plan {
    pub seed: u64,
    pub run: Duration,
    pub producers: usize,
}

impl Plan {
    pub fn from_env(default_secs: u64, producers: usize) -> Plan {
        use rand::Rng;
        let seed = std::env::var("SPINDLE_HISTORY_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::rng().random());
        let secs = std::env::var("SPINDLE_HISTORY_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default_secs);
        Plan {
            seed,
            run: Duration::from_secs(secs),
            producers,
        }
    }
}

/// Runs the plan's operations and producers against `world`, lets the system settle, checks
/// every invariant, prints the report, and returns the violations.
pub async fn run(world: World, plan: Plan, name: &str) -> Vec<Violation> {
    let replay = format!(
        "SPINDLE_HISTORY_SEED={} SPINDLE_HISTORY_SECS={} cargo test --test histories {name} -- --nocapture",
        plan.seed,
        plan.run.as_secs()
    );
    println!("histories {name}: seed {} ({replay})", plan.seed);
    world.wait_ready().await;
    let cluster = world.inventory.is_some();
    let world = Arc::new(world);
    let rec = Arc::new(Recorder::default());
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let events = world.control.is_some();
    if events {
        events::subscribe(&world).await;
    }
    let kinds = ops::Kinds {
        cluster,
        events,
        commit_faults: world.proxy.is_some(),
    };
    let ops = ops::schedule(&mut rng, plan.run, kinds);
    println!(
        "histories {name}: {} operations over {} s",
        ops.len(),
        plan.run.as_secs()
    );
    let started = std::time::Instant::now();
    let start = tokio::time::Instant::now();
    let until = start + plan.run;
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..plan.producers {
        tasks.spawn(producers::producer(
            p,
            plan.seed,
            world.clone(),
            rec.clone(),
            until,
        ));
    }
    tasks.spawn(producers::readiness(world.clone(), rec.clone(), until));
    tasks.spawn(parks::sampler(world.clone(), rec.clone(), until));
    let trackers = Arc::new(tokio::sync::Mutex::new(audit::Trackers::new(&world)));
    tasks.spawn(audit::sampler(
        world.clone(),
        rec.clone(),
        until,
        plan.seed,
        trackers.clone(),
    ));
    if events {
        tasks.spawn(events::publisher(
            plan.seed,
            world.clone(),
            rec.clone(),
            until,
        ));
    }
    tasks.spawn(ops::run_schedule(
        world.clone(),
        rec.clone(),
        ops,
        start,
        plan.seed,
    ));
    if cluster {
        tasks.spawn(ops::join_directors(
            world.clone(),
            rec.clone(),
            ops::join_at(plan.run),
            ops::Opening::of(plan.seed),
        ));
    }
    let watch = tokio::spawn(ops::expiry_watch(
        world.clone(),
        rec.clone(),
        until + Duration::from_secs(600),
    ));
    let supervisor = tokio::spawn(ops::supervise(
        world.clone(),
        rec.clone(),
        until + Duration::from_secs(600),
    ));
    while let Some(done) = tasks.join_next().await {
        done.expect("a producer or the schedule failed");
    }

    // Quiet: every lane answers, controls are lifted, every process runs, blocks released.
    rec.op(format!(
        "quiet: lanes answer 200, controls lifted, processes started, {}",
        ops::RELEASES_BLOCKS
    ));
    world.endpoint.all_ok();
    if let Some(proxy) = &world.proxy {
        proxy.disarm();
        proxy.release();
    }
    world
        .consul
        .double
        .as_ref()
        .unwrap()
        .faults()
        .set_latency(Duration::ZERO);
    if events {
        rec.op(events::ENABLES.into());
        events::set_created_enabled(&world, true).await;
    }
    let consul = world.consul.double.as_ref().unwrap().url();
    for lane in ops::LANES {
        let url = world.endpoint.lane_url(lane);
        for verb in [vec!["resume"], vec!["limit"], vec!["unpark"]] {
            let mut args = vec!["endpoints"];
            args.extend(verb);
            args.extend(["--endpoint", &url, "--consul-addr", &consul]);
            crate::common::procs::run_async(&args).await;
        }
    }
    for slot in world.routers.iter().chain(&world.directors) {
        slot.start().await;
    }
    if let Some(manager) = &world.manager {
        // No more retirements: what retired drains, nothing new starts to.
        manager.term().await;
        rec.op("manager stopped".into());
    }
    let latest_expiry = rec
        .log
        .lock()
        .unwrap()
        .accepted
        .values()
        .filter_map(|a| a.expire_at)
        .max()
        .unwrap_or_else(Utc::now);
    let deadline = latest_expiry
        + chrono::Duration::from_std(ops::EXPIRY_BOUND).unwrap()
        + chrono::Duration::seconds(10);
    let settled_at = loop {
        world.on_every_jobdb("DELETE FROM ordering_blocked").await;
        let stored = world.collect().await;
        let open = unsettled(&world, &rec, &stored).await;
        if open == 0 || Utc::now() > deadline {
            println!(
                "histories {name}: {open} jobs or notices unsettled at the end of the quiet period"
            );
            break stored;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    watch.abort();
    let _ = watch.await;
    supervisor.abort();
    let _ = supervisor.await;
    // A last look a little later: a second notice or a late delivery shows too.
    drop(settled_at);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stored = world.collect().await;
    let took = started.elapsed();

    // The checks, over everything.
    let api = api_views(&world, &rec).await;
    let listing = final_listing(&world).await;
    let active: HashSet<String> = world
        .live_jobdbs()
        .await
        .into_iter()
        .filter(|(_, _, s)| *s == JobDbState::Active)
        .map(|(n, _, _)| n)
        .collect();
    let arrivals = world.endpoint.arrivals();
    let listed = world.listed_attempts().await;
    world.tally_remembered().await;
    if cluster {
        // How much of the ordered traffic went without the sequencer (each process's count
        // since its last start).
        let client = reqwest::Client::new();
        let (mut cleared, mut born) = (0.0, 0.0);
        for d in &world.directors {
            if let Ok(r) = client.get(format!("{}/metrics", d.base())).send().await {
                let text = r.text().await.unwrap_or_default();
                cleared +=
                    crate::common::metric_value(&text, "spindle_ordered_cleared_at_intake_total");
                born += crate::common::metric_value(&text, "spindle_ordered_born_total");
            }
        }
        println!(
            "histories {name}: {cleared} sequences cleared at intake, {born} ordered jobs born released (live Directors, since their last start)"
        );
    }
    let remembered = world
        .alone
        .is_some()
        .then(|| *world.remembered.lock().unwrap());
    let kept_ids: Vec<String> = rec
        .log
        .lock()
        .unwrap()
        .kept
        .iter()
        .map(|k| k.2.clone())
        .collect();
    let kept_found = world.kept_events(&kept_ids).await;
    let unexpiring = world.dedup_keys_without_expiry().await;
    let end_audit = audit::audit(&world).await;
    let rounds = audit::rounds_agree(&end_audit, &mut *trackers.lock().await).await;
    let violations = {
        let log = rec.log.lock().unwrap();
        let (mut violations, tally) = check::check(&Inputs {
            log: &log,
            arrivals: &arrivals,
            stored: &stored,
            api: &api,
            listing: &listing,
            active: &active,
            listed: listed.as_ref(),
            remembered,
            directors: world.directors.len(),
            kept_found: &kept_found,
            held_subscription: world
                .subscriptions
                .get()
                .map(|s| s.created.parse().expect("a subscription id")),
        });
        violations.splice(0..0, log.live.iter().cloned());
        violations.extend(audit::agree(&end_audit, &violations));
        violations.extend(rounds);
        violations.extend(dedup_expiry(unexpiring));
        let ledgers: Vec<String> = end_audit
            .ledgers
            .iter()
            .map(|l| format!("{} {}/{}", l["jobdb"], l["accepted"], l["open"]))
            .collect();
        println!("histories {name}: spindle audit at the end (jobdb accepted/open): {ledgers:?}");
        println!(
            "histories {name}: {:.0} s in all; {} requests; {tally:?}",
            took.as_secs_f64(),
            log.requests
        );
        report(name, &replay, &violations, &log, &stored, &arrivals);
        violations
    };
    match Arc::try_unwrap(world) {
        Ok(world) => world.stop().await,
        Err(_) => {
            println!("histories {name}: the world is still shared; processes die with the test")
        }
    }
    violations
}

/// `dedup-expiry`: every key the world's routers wrote in Redis expires (the claim script sets a
/// hash's expiry when it adds an entry); a hash without one would stay forever.
fn dedup_expiry(keys: Result<Vec<String>, String>) -> Option<Violation> {
    let what = match keys {
        Ok(keys) if keys.is_empty() => return None,
        Ok(keys) => format!(
            "{} dedup keys have no expiry, e.g. {:?}",
            keys.len(),
            &keys[..keys.len().min(3)]
        ),
        Err(e) => format!("the dedup keys could not be read: {e}"),
    };
    Some(Violation {
        invariant: "dedup-expiry",
        at: Utc::now(),
        jobs: Vec::new(),
        what,
    })
}

/// Jobs of ours not ended yet, plus ended jobs whose notice has not arrived.
async fn unsettled(world: &World, rec: &Recorder, stored: &HashMap<JobId, Stored>) -> usize {
    let arrivals = world.endpoint.arrivals();
    let told: HashSet<String> = arrivals
        .iter()
        .filter(|a| a.path.starts_with("notice/"))
        .filter_map(|a| a.body.as_ref()?["job_id"].as_str().map(str::to_owned))
        .collect();
    let log = rec.log.lock().unwrap();
    let mut open = log
        .accepted
        .keys()
        .filter(|id| !stored.contains_key(id))
        .count();
    for (id, s) in stored {
        match first_end(s) {
            None => open += 1,
            Some(_) if s.job.on_complete.is_some() && !told.contains(&id.to_string()) => open += 1,
            Some(_) => {}
        }
    }
    open
}

/// Every job `GET /v1/jobs` lists (oldest first, pages of 50: several per JobDB) with its state; a listing that
/// fails is tried again for 10 s (a Director may still be joining the catalog).
async fn final_listing(world: &World) -> check::Listing {
    use spindle_client::{JobFilter, ListOrder};
    let api = spindle_client::Client::new(&world.api_base(), None).map_err(|e| e.to_string())?;
    let filter = JobFilter {
        order: ListOrder::Oldest,
        ..JobFilter::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    'again: loop {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            match api.jobs_page(&filter, after.as_deref(), 50).await {
                Ok(page) => {
                    out.extend(
                        page.jobs
                            .into_iter()
                            .map(|j| (j.id, j.state.as_str().to_owned())),
                    );
                    match page.next_after {
                        Some(next) => after = Some(next),
                        None => return Ok(out),
                    }
                }
                Err(e) if tokio::time::Instant::now() > deadline => return Err(e.to_string()),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue 'again;
                }
            }
        }
    }
}

/// `GET /v1/jobs/{id}` of every acknowledged job.
async fn api_views(world: &World, rec: &Recorder) -> ApiViews {
    let ids: Vec<JobId> = rec.log.lock().unwrap().accepted.keys().copied().collect();
    let base = world.api_base();
    let client = &world.client;
    futures::stream::iter(ids)
        .map(|id| {
            let url = format!("{base}/v1/jobs/{id}");
            async move {
                let answer = match client.get(&url).send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let body: serde_json::Value = r.json().await.unwrap_or_default();
                        (status, body["state"].as_str().map(str::to_owned))
                    }
                    Err(e) => (0, Some(e.to_string())),
                };
                (id, answer)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await
}

/// Prints every violation with the operations before it and its job's histories and
/// arrivals; then a count by invariant and how to replay the run.
fn report(
    name: &str,
    replay: &str,
    violations: &[Violation],
    log: &record::Log,
    stored: &HashMap<JobId, Stored>,
    arrivals: &[endpoint::Arrival],
) {
    let mut by_invariant: std::collections::BTreeMap<&str, usize> = Default::default();
    for (n, v) in violations.iter().enumerate() {
        let count = by_invariant.entry(v.invariant).or_default();
        *count += 1;
        if *count > 5 {
            continue;
        }
        println!(
            "\n=== violation {}: {} at {}",
            n + 1,
            v.invariant,
            v.at.format("%H:%M:%S%.3f")
        );
        println!("{}", v.what);
        let from = v.at - chrono::Duration::seconds(20);
        let to = v.at + chrono::Duration::seconds(1);
        println!("  operations from 20 s before:");
        for (t, op) in log.ops.iter().filter(|(t, _)| *t >= from && *t <= to) {
            println!("    {} {op}", t.format("%H:%M:%S%.3f"));
        }
        for &id in &v.jobs {
            if let Some(s) = stored.get(&id) {
                let o = s
                    .job
                    .ordering
                    .as_ref()
                    .map(|o| {
                        let blocks = if o.blocks { " (block)" } else { "" };
                        format!(" key {}{blocks} at position {}", o.key, o.position)
                    })
                    .unwrap_or_default();
                println!(
                    "  job {id}: {} {}{o}, expires {}{}",
                    s.job.bucket,
                    s.job.endpoint,
                    s.job.expire_at.format("%H:%M:%S%.3f"),
                    if s.job.on_complete.is_some() {
                        ", on_complete"
                    } else {
                        ""
                    }
                );
                for p in &s.places {
                    let steps: Vec<String> = p
                        .history
                        .iter()
                        .map(|t| {
                            format!(
                                "{}{}@{}",
                                t.state,
                                t.error_type
                                    .as_deref()
                                    .map(|e| format!("/{e}"))
                                    .unwrap_or_default(),
                                t.time.format("%H:%M:%S%.3f")
                            )
                        })
                        .collect();
                    println!("    in {}: {}", p.jobdb, steps.join(" "));
                }
            }
            let seen: Vec<String> = arrivals
                .iter()
                .filter(|a| a.job == id.to_string())
                .map(|a| {
                    format!(
                        "#{}→{}@{}",
                        a.attempt,
                        a.status,
                        a.at.format("%H:%M:%S%.3f")
                    )
                })
                .collect();
            println!("    arrivals: {}", seen.join(" "));
        }
    }
    println!(
        "\nhistories {name}: {} violations {by_invariant:?}",
        violations.len()
    );
    if !violations.is_empty() {
        println!("histories {name}: replay with {replay}");
    }
}
