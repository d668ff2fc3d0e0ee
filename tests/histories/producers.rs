//! The producers: sequential, each owning a few ordered keys, submitting mixes of jobs to every
//! front and recording every answer; and the readiness sampler, which submits a probe job to
//! each Director every second.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use chrono::Utc;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use spindle_client::JobStatus;

use super::endpoint::{FAIL_FIRST, WANT};
use super::ops::{BUCKETS, LANES};
use super::record::{Outcome, ReadySample, Recorder, SeqKey, Spec};
use super::world::World;

/// One producer's ordered key: a new generation starts when a submission's fate is unknown.
struct KeyState {
    name: String,
    gen: u32,
    bucket: &'static str,
    lane: &'static str,
}

/// A producer repeats an idempotency key only among its last this many jobs, and only one
/// accepted less than [`REPEAT_WITHIN`] ago: well inside the routers' 120 s dedup window,
/// which the `dedup` invariant assumes (a key sent again after the window is a new job by
/// design; a run slowed by faults once stretched 32 jobs over 124–131 s).
const RECENT_REPEATS: usize = 32;
/// How long after its acceptance a job may be repeated.
const REPEAT_WITHIN: Duration = Duration::from_secs(60);

/// A producer: one request at a time, so every key it owns is submitted sequentially and its
/// acknowledged order is its expected order.
pub async fn producer(
    p: usize,
    seed: u64,
    world: Arc<World>,
    rec: Arc<Recorder>,
    until: tokio::time::Instant,
) {
    let mut rng = StdRng::seed_from_u64(
        seed.wrapping_add(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(p as u64 + 1)),
    );
    let fronts = world.fronts();
    let mut keys: Vec<KeyState> = (0..3)
        .map(|i| KeyState {
            name: format!("p{p}k{i}"),
            gen: 0,
            bucket: BUCKETS[(p + i) % BUCKETS.len()],
            lane: LANES[i % 2],
        })
        .collect();
    let mut mine: Vec<(tokio::time::Instant, Spec)> = Vec::new();
    let mut owed: Vec<Spec> = Vec::new();
    let mut n = 0usize;
    while tokio::time::Instant::now() < until {
        let mut batch: Vec<Spec> = std::mem::take(&mut owed);
        let fresh = rng.random_range(1..=3usize);
        let mut used: Vec<usize> = batch
            .iter()
            .filter_map(|s| s.seq.as_ref())
            .filter_map(|q| {
                keys.iter()
                    .position(|k| q.key.starts_with(&format!("{}.", k.name)))
            })
            .collect();
        for _ in 0..fresh {
            mine.retain(|(at, _)| at.elapsed() < REPEAT_WITHIN);
            if rng.random_range(0..100) < 8 && !mine.is_empty() {
                // A repeated idempotency key: the same job submitted again, one of the
                // producer's last few (well inside the routers' 120 s dedup window: a key
                // sent again after the window is a new job by design).
                let recent = mine.len().saturating_sub(RECENT_REPEATS);
                let again = mine[rng.random_range(recent..mine.len())].1.clone();
                if again.seq.is_none() && !batch.iter().any(|s| s.key == again.key) {
                    batch.push(again);
                }
                continue;
            }
            n += 1;
            let key = format!("{}-p{p}-{n}", world.tag);
            let ordered = rng.random_range(0..100) < 45;
            let k = rng.random_range(0..keys.len());
            if ordered && used.contains(&k) {
                continue;
            }
            let spec = job(&mut rng, &world, key, ordered.then(|| &keys[k]));
            if ordered {
                used.push(k);
            }
            batch.push(spec);
        }
        if batch.is_empty() {
            continue;
        }
        // Jobs sent again go to the same kind of front (a router's dedup must see them).
        let through_router = batch.iter().any(|s| {
            rec.log
                .lock()
                .unwrap()
                .outcomes
                .get(&s.key)
                .is_some_and(|o| o.iter().any(|(via, _)| via.starts_with("router")))
        });
        let candidates: Vec<&(String, String)> = fronts
            .iter()
            .filter(|(name, _)| !through_router || name.starts_with("router"))
            .collect();
        // Mostly through routers when there are any.
        let routers = candidates
            .iter()
            .filter(|(n, _)| n.starts_with("router"))
            .count();
        let pick = if routers > 0 && rng.random_range(0..100) < 75 {
            rng.random_range(0..routers)
        } else {
            rng.random_range(0..candidates.len())
        };
        let (via, base) = candidates[pick].clone();
        for s in &batch {
            rec.spec(s);
        }
        rec.request();
        let answer = submit(&world.client, &base, &batch).await;
        match answer {
            Ok(reply) => {
                for (spec, job) in batch.iter().zip(&reply.jobs) {
                    let outcome = match job.status {
                        JobStatus::Accepted => Outcome::Accepted(job.id.clone()),
                        JobStatus::Duplicate => Outcome::Duplicate(job.id.clone()),
                        JobStatus::Pending | JobStatus::Failed => {
                            owed.push(spec.clone());
                            Outcome::NotStored(format!(
                                "{}: {}",
                                job.status,
                                job.error.clone().unwrap_or_default()
                            ))
                        }
                    };
                    rec.outcome(spec, &via, outcome, Some(job));
                    if job.status == JobStatus::Accepted && spec.seq.is_none() {
                        mine.push((tokio::time::Instant::now(), spec.clone()));
                    }
                }
            }
            Err(Failure::NotStored(why)) => {
                for spec in &batch {
                    rec.outcome(spec, &via, Outcome::NotStored(why.clone()), None);
                    owed.push(spec.clone());
                }
            }
            Err(Failure::Unknown(why)) => {
                for spec in &batch {
                    rec.outcome(spec, &via, Outcome::Unknown(why.clone()), None);
                    if via.starts_with("router") {
                        // The router's dedup settles it: the same key again.
                        owed.push(spec.clone());
                    } else if let Some(seq) = &spec.seq {
                        // Its place in its key is unknown: the key ends here, a new one starts.
                        if let Some(k) = keys
                            .iter_mut()
                            .find(|k| seq.key.starts_with(&format!("{}.", k.name)))
                        {
                            k.gen += 1;
                        }
                    }
                }
            }
        }
        // A job that does not settle within a while is given up (its key with it).
        owed.retain(|s| {
            let tries = rec
                .log
                .lock()
                .unwrap()
                .outcomes
                .get(&s.key)
                .map_or(0, Vec::len);
            if tries > 40 {
                rec.log
                    .lock()
                    .unwrap()
                    .gave_up
                    .push((s.key.clone(), chrono::Utc::now()));
                if let Some(seq) = &s.seq {
                    if let Some(k) = keys
                        .iter_mut()
                        .find(|k| seq.key.starts_with(&format!("{}.", k.name)))
                    {
                        k.gen += 1;
                    }
                }
                return false;
            }
            true
        });
        let pause = if owed.is_empty() {
            rng.random_range(20..150)
        } else {
            250
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// A new job, ordered on `key` when given.
fn job(rng: &mut StdRng, world: &World, key: String, ordered: Option<&KeyState>) -> Spec {
    let (bucket, lane) = match ordered {
        Some(k) => (k.bucket, k.lane),
        None => (
            BUCKETS[rng.random_range(0..BUCKETS.len())],
            LANES[rng.random_range(0..LANES.len())],
        ),
    };
    let endpoint = world.endpoint.lane_url(lane);
    let mut job = json!({
        "bucket": bucket,
        "endpoint": endpoint,
        "idempotency_key": key,
        "payload": {"key": key},
        "execution_timeout_ms": 1000,
        "backoff_min_delay_ms": 100,
        "backoff_coefficient": 1.5,
        "ttl_ms": rng.random_range(15_000..30_000),
    });
    let o = job.as_object_mut().unwrap();
    // Payloads of every form cross forwards and moves byte for byte: most are small JSON, some
    // JSON with escapes and numbers a re-encoding could change, some bytes that are not JSON.
    match rng.random_range(0..100) {
        0..15 => {
            let bytes: Vec<u8> = (0..rng.random_range(0..48)).map(|_| rng.random()).collect();
            o.remove("payload");
            o.insert("payload_base64".into(), json!(STANDARD.encode(bytes)));
        }
        15..30 => {
            o.insert(
                "payload".into(),
                json!({"key": key, "text": "caf\u{e9} \"q\" \\ \u{1} \u{1f600}",
                       "n": [1, -0.5, 1e300, 12345678901234567890u64], "none": null}),
            );
        }
        _ => {}
    }
    let mut headers = serde_json::Map::new();
    let roll = rng.random_range(0..100);
    if roll < 5 {
        headers.insert(WANT.into(), json!("400"));
    } else if roll < 9 {
        headers.insert(WANT.into(), json!("503"));
    } else if roll < 25 {
        headers.insert(FAIL_FIRST.into(), json!(rng.random_range(1..4).to_string()));
    }
    if !headers.is_empty() {
        o.insert("headers".into(), Value::Object(headers));
    }
    if rng.random_range(0..100) < 12 {
        o.insert("ttl_ms".into(), json!(rng.random_range(2_000..6_000)));
    }
    let mut deliver_at = None;
    if ordered.is_none() && rng.random_range(0..100) < 15 {
        let at = Utc::now() + chrono::Duration::milliseconds(rng.random_range(500..6_000));
        o.insert("deliver_at".into(), json!(at));
        deliver_at = Some(at);
    }
    // A third of the jobs are made in a trace of their own (the producer's span).
    if rng.random_range(0..100) < 33 {
        let trace: u128 = rng.random_range(1..=u128::MAX);
        let span: u64 = rng.random_range(1..=u64::MAX);
        o.insert(
            "traceparent".into(),
            json!(format!("00-{trace:032x}-{span:016x}-01")),
        );
    }
    let notice = rng.random_range(0..100) < 25;
    if notice {
        o.insert(
            "on_complete".into(),
            json!(world.endpoint.notice_url(bucket)),
        );
    }
    let mut seq = None;
    if let Some(k) = ordered {
        let name = format!("{}.{}", k.name, k.gen);
        o.insert("ordering_key".into(), json!(name));
        if rng.random_range(0..100) < 10 {
            o.insert("ordering_failure".into(), json!("block"));
        }
        seq = Some(SeqKey {
            bucket: bucket.into(),
            endpoint,
            key: name,
        });
    }
    Spec {
        key,
        json: job,
        seq,
        deliver_at,
    }
}

pub enum Failure {
    NotStored(String),
    Unknown(String),
}

/// `POST /v1/jobs` of `specs` to `base`.
pub async fn submit(
    client: &reqwest::Client,
    base: &str,
    specs: &[Spec],
) -> Result<spindle_client::SubmitReply, Failure> {
    let jobs: Vec<&Value> = specs.iter().map(|s| &s.json).collect();
    let sent = client
        .post(format!("{base}/v1/jobs"))
        .json(&json!({ "jobs": jobs }))
        .send()
        .await;
    match sent {
        Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => r
            .json::<spindle_client::SubmitReply>()
            .await
            .map_err(|e| Failure::Unknown(format!("202 without a body: {e}"))),
        Ok(r) => {
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            if status.is_client_error() && status != reqwest::StatusCode::TOO_MANY_REQUESTS {
                panic!("submission refused: {status} {text}");
            }
            let why = format!("{status}: {}", text.chars().take(120).collect::<String>());
            // 504: the jobs were being written when the answer's time ran out (a commit that
            // lost its answer, say): they may be stored.
            match status == reqwest::StatusCode::GATEWAY_TIMEOUT {
                true => Err(Failure::Unknown(why)),
                false => Err(Failure::NotStored(why)),
            }
        }
        // A connection that could not be made stored nothing; anything else may have.
        Err(e) if e.is_connect() => Err(Failure::NotStored(format!("connect: {e}"))),
        Err(e) => Err(Failure::Unknown(format!("{e}"))),
    }
}

/// Samples each Director's readiness once a second: `/readyz`, a probe job, `/readyz` again.
pub async fn readiness(world: Arc<World>, rec: Arc<Recorder>, until: tokio::time::Instant) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let mut n = 0;
    while tokio::time::Instant::now() < until {
        for d in &world.directors {
            let base = d.base();
            let ready = || async {
                matches!(client.get(format!("{base}/readyz")).send().await,
                         Ok(r) if r.status().is_success())
            };
            let at = Utc::now();
            let before = ready().await;
            n += 1;
            let key = format!("{}-probe-{}-{n}", world.tag, d.name);
            let spec = Spec {
                key: key.clone(),
                json: json!({"bucket": "probe", "endpoint": world.endpoint.probe_url(),
                             "idempotency_key": key, "ttl_ms": 60_000}),
                seq: None,
                deliver_at: None,
            };
            rec.spec(&spec);
            let accepted = match submit(&client, &base, std::slice::from_ref(&spec)).await {
                Ok(reply) => {
                    let job = &reply.jobs[0];
                    rec.outcome(&spec, &d.name, Outcome::Accepted(job.id.clone()), Some(job));
                    Some(true)
                }
                Err(Failure::NotStored(why)) => {
                    rec.outcome(&spec, &d.name, Outcome::NotStored(why), None);
                    Some(false)
                }
                Err(Failure::Unknown(why)) => {
                    rec.outcome(&spec, &d.name, Outcome::Unknown(why), None);
                    None
                }
            };
            let after = ready().await;
            rec.ready(ReadySample {
                director: d.name.clone(),
                at,
                ready_before: before,
                accepted,
                ready_after: after,
            });
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}
