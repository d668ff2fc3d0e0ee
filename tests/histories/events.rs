//! The events side of a run: the bucket's two subscriptions, the operations that change or
//! back-fill them, and the publisher (one event a request, in a cluster through the routers;
//! alone, now and then a batch). Its invariants are in [`super::check`]'s `events.rs`.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use spindle_client::JobStatus;

use super::record::{Outcome, Recorder, Spec, Violation};
use super::world::World;

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
/// to subscription `all` twice at once and once more 300 ms later: alone to the Director, in
/// a cluster through the routers (the two at once through two of them). Every event must get
/// one job (`event-atomic` counts them); each answer's jobs are its acknowledged ones.
pub async fn backfill(world: &World, rec: &Recorder, n: usize) {
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
    let fronts = world.event_fronts();
    let send = |delay: u64, front: usize| {
        let (client, request) = (&world.client, &request);
        let (via, base) = &fronts[front % fronts.len()];
        let url = format!("{base}/v1/subscriptions/{}/backfill", subscribed.all);
        async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            rec.request();
            (via.as_str(), client.post(url).json(request).send().await)
        }
    };
    let answers = futures::future::join3(send(0, 0), send(0, 1), send(300, 0)).await;
    let mut told = Vec::new();
    for (via, sent) in [answers.0, answers.1, answers.2] {
        let status = match sent {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                match r.json::<spindle_client::BackfillReply>().await {
                    Ok(reply) => {
                        for d in &reply.deliveries {
                            let Some(spec) = specs.get(&d.event_id) else {
                                continue;
                            };
                            let answer = event_job(&d.job_id, spec);
                            let o = Outcome::Accepted(d.job_id.clone());
                            rec.outcome(spec, via, o, Some(&answer));
                        }
                        format!("{} made, {} skipped", reply.deliveries.len(), reply.skipped)
                    }
                    Err(e) => {
                        unknown(rec, &specs, via, format!("202 without a body: {e}"));
                        "202 unread".into()
                    }
                }
            }
            // The writer may have taken it: whether its jobs were stored is unknown.
            Ok(r) if r.status() == reqwest::StatusCode::GATEWAY_TIMEOUT => {
                unknown(rec, &specs, via, "504".into());
                "504".into()
            }
            Ok(r) => format!("{}", r.status()),
            Err(e) if e.is_connect() => "not connected".into(),
            Err(e) => {
                unknown(rec, &specs, via, e.to_string());
                "no answer".into()
            }
        };
        told.push(status);
    }
    rec.op(format!(
        "back-fill of {n} unpublished events to subscription all, twice at once and again \
         (through {}): {}",
        fronts.len().min(2),
        told.join("; ")
    ));
}

/// Every spec of a back-fill whose answer was lost has an unknown outcome.
fn unknown(
    rec: &Recorder,
    specs: &std::collections::HashMap<String, Spec>,
    via: &str,
    why: String,
) {
    for spec in specs.values() {
        rec.outcome(spec, via, Outcome::Unknown(why.clone()), None);
    }
}

/// Publishes `specs` as one batch: every event's jobs are stored together or none are; each
/// event's jobs are acknowledged jobs of its spec. Straight to a Director, once; through the
/// routers (`retries`), again with the same keys until an answer settles it (a repeat is
/// answered `duplicate` with the first event's jobs).
async fn publish_batch(
    world: &World,
    rec: &Recorder,
    fronts: &[(String, String)],
    retries: bool,
    specs: &[Spec],
) {
    for spec in specs {
        rec.spec(spec);
    }
    let events: Vec<&serde_json::Value> = specs.iter().map(|s| &s.json).collect();
    for attempt in 0..40usize {
        let (via, base) = &fronts[attempt % fronts.len()];
        rec.request();
        let sent = world
            .client
            .post(format!("{base}/v1/events"))
            .json(&json!({ "events": events }))
            .send()
            .await;
        let each = |o: &dyn Fn() -> Outcome| {
            for spec in specs {
                for _ in 0..fan_out(spec.json["event_type"].as_str().unwrap_or_default()) {
                    rec.outcome(spec, via, o(), None);
                }
            }
        };
        match sent {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                let reply = match r.json::<spindle_client::PublishBatchReply>().await {
                    Ok(reply) => reply,
                    Err(e) => {
                        each(&|| Outcome::Unknown(format!("202 without a body: {e}")));
                        if retries {
                            continue;
                        }
                        return;
                    }
                };
                return batch_answered(rec, via, specs, &reply);
            }
            Ok(r) if r.status() == reqwest::StatusCode::GATEWAY_TIMEOUT => {
                each(&|| Outcome::Unknown("504".into()))
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                if status.is_client_error() {
                    panic!("batch publish refused: {status} {text}");
                }
                each(&|| Outcome::NotStored(format!("{status}")))
            }
            Err(e) if e.is_connect() => each(&|| Outcome::NotStored(format!("connect: {e}"))),
            Err(e) => each(&|| Outcome::Unknown(format!("{e}"))),
        }
        if !retries {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Records a batch's answer: each event's jobs (accepted, or a repeat's `duplicate`), and
/// its fan-out checked.
fn batch_answered(
    rec: &Recorder,
    via: &str,
    specs: &[Spec],
    reply: &spindle_client::PublishBatchReply,
) {
    for (spec, answer) in specs.iter().zip(&reply.events) {
        let expected = fan_out(spec.json["event_type"].as_str().unwrap_or_default());
        // A duplicate's jobs are listed only while a live JobDB holds its event (as for one
        // event published alone): its id is what `event-once` checks.
        let listed = answer.duplicate || answer.deliveries.len() == expected;
        if !listed || reply.events.len() != specs.len() {
            rec.violation(Violation {
                invariant: "event-fan-out",
                at: Utc::now(),
                jobs: Vec::new(),
                what: format!(
                    "{via} answered event {} of a batch of {} with {} jobs; it fans out to \
                     {expected}",
                    spec.key,
                    specs.len(),
                    answer.deliveries.len()
                ),
            });
        }
        if expected == 0 {
            kept(rec, &spec.key, via, answer.event_id.as_deref());
        }
        for d in &answer.deliveries {
            let accepted = event_job(&d.job_id, spec);
            let o = match answer.duplicate {
                true => Outcome::Duplicate(d.job_id.clone()),
                false => Outcome::Accepted(d.job_id.clone()),
            };
            rec.outcome(spec, via, o, Some(&accepted));
        }
    }
}

/// Records an acknowledged event no subscription wants: it must have an id (it is kept).
fn kept(rec: &Recorder, key: &str, via: &str, event_id: Option<&str>) {
    match event_id {
        Some(id) => rec.kept(key, via, id),
        None => rec.violation(Violation {
            invariant: "event-kept",
            at: Utc::now(),
            jobs: Vec::new(),
            what: format!(
                "{via} acknowledged event {key}, which no subscription wants, without an id"
            ),
        }),
    }
}

/// The acknowledgement of an event's job, as the publisher records it.
fn event_job(id: &str, spec: &Spec) -> spindle_client::AcceptedJob {
    spindle_client::AcceptedJob {
        id: id.to_owned(),
        status: JobStatus::Accepted,
        bucket: EVENT_BUCKET.into(),
        created_at: None,
        expire_at: None,
        deliver_at: None,
        idempotency_key: Some(spec.key.clone()),
        error: None,
    }
}

/// How many jobs an event of this type makes (both subscriptions exist for the whole run).
pub fn fan_out(event_type: &str) -> usize {
    match event_type {
        "hist.created" => 2,
        UNWANTED => 0,
        _ => 1,
    }
}

/// A type no subscription wants: its events make no job and are kept all the same.
pub const UNWANTED: &str = "other.unwanted";

/// A random event type: created, updated, or now and then one nobody wants.
fn any_type(rng: &mut StdRng) -> &'static str {
    match rng.random_range(0..20) {
        0 => UNWANTED,
        n if n % 2 == 0 => "hist.created",
        _ => "hist.updated",
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
    let fronts = world.event_fronts();
    let retries = fronts.len() > 1;
    let mut settled: Vec<Spec> = Vec::new();
    let mut n = 0usize;
    while tokio::time::Instant::now() < until {
        // Now and then a batch of events in one request.
        if rng.random_range(0..100) < 15 {
            let specs: Vec<Spec> = (0..rng.random_range(2..30))
                .map(|_| {
                    n += 1;
                    let event_type = any_type(&mut rng);
                    let key = format!("{}-ev-{n}", world.tag);
                    Spec {
                        json: json!({"bucket": EVENT_BUCKET, "event_type": event_type,
                                     "payload": {"n": n}, "idempotency_key": key}),
                        key,
                        seq: None,
                        deliver_at: None,
                    }
                })
                .collect();
            let from = n % fronts.len();
            let order: Vec<(String, String)> = fronts[from..]
                .iter()
                .chain(&fronts[..from])
                .cloned()
                .collect();
            publish_batch(&world, &rec, &order, retries, &specs).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(80..300))).await;
            continue;
        }
        let again = retries && rng.random_range(0..100) < 10 && !settled.is_empty();
        let spec = match again {
            true => {
                settled[rng.random_range(settled.len().saturating_sub(5)..settled.len())].clone()
            }
            false => {
                n += 1;
                let event_type = any_type(&mut rng);
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
                                let answer = event_job(&d.job_id, &spec);
                                let o = match reply.duplicate {
                                    true => Outcome::Duplicate(d.job_id.clone()),
                                    false => Outcome::Accepted(d.job_id.clone()),
                                };
                                rec.outcome(&spec, via, o, Some(&answer));
                            }
                            if reply.duplicate && reply.deliveries.is_empty() {
                                outcome(Outcome::Duplicate(String::new()));
                            }
                            if expected == 0 {
                                kept(&rec, &spec.key, via, reply.event_id.as_deref());
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
