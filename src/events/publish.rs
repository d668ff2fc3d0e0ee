//! Publishing: an event becomes one job per matching subscription ([`fan_out`]). The jobs go
//! to the writer as one submission, so they are committed together or not at all.
//!
//! Each job's body is the event's envelope, `{"type", "timestamp", "data"}` (Standard
//! Webhooks' shape); delivery adds `spindle-event-id` and `spindle-event-type` headers and
//! signs with the subscription's own secret. A subscription with an `ordering_key` pointer
//! orders its events by the value found there; its id is part of the job's ordering key, so
//! two subscriptions never share a sequence (disabling one holds only its own).

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use spindle_client::api::{MAX_EVENTS_PER_REQUEST, MAX_JOBS_PER_EVENT_BATCH};
use spindle_client::{EventBatch, EventDelivery, NewEvent, PastEvent};
use ulid::Ulid;

use super::{check_event_type, Index, Subscription};
use crate::job::{EventLink, EventRecord, Job, JobId, Scheduled};
use crate::rpc::api::{FieldError, IntakeLimits, MAX_ORDERING_KEY_BYTES};
use crate::rpc::error::ApiError;
use crate::rpc::rules;

/// Most subscriptions one event reaches (its jobs are one submission).
pub const MAX_FAN_OUT: usize = spindle_client::api::MAX_JOBS_PER_REQUEST;

/// An event's jobs, ready for the writer.
#[derive(Debug)]
pub struct Published {
    /// The event's id.
    pub event_id: Ulid,
    /// One job per matching subscription, in subscription id order.
    pub jobs: Vec<Arc<Job>>,
    /// Their first attempt times, when `deliver_at` is ahead.
    pub scheduled: Scheduled,
    /// Which job is whose.
    pub deliveries: Vec<EventDelivery>,
    /// The event itself when it made no job (it matched no subscription): kept all the same.
    pub kept: Option<EventRecord>,
}

/// Checks `event` and makes its jobs from the subscriptions `index` matches. Fields are named
/// as the event's body names them; a subscription whose job intake refuses names itself.
/// `skew`: how far this clock may run ahead of the Director that stores the jobs (a router's
/// `--dedup-max-skew-ms`; zero on the Director): a `deliver_at` passed by less is kept for the
/// Director to judge, as for jobs through a router.
#[allow(clippy::too_many_arguments)]
pub fn fan_out(
    event: NewEvent,
    index: &Index,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    skew: chrono::Duration,
    event_id: Ulid,
    mut next_id: impl FnMut() -> JobId,
) -> Result<Published, FieldError> {
    rules::check_bucket(&event.bucket, "bucket")?;
    check_event_type(&event.event_type, "event_type")?;
    if let Some(key) = &event.idempotency_key {
        rules::check_idempotency_key(key, "idempotency_key")?;
    }
    if let Some(url) = &event.on_complete {
        rules::check_endpoint(url, "on_complete")?;
    }
    let trace = rules::check_trace(
        event.traceparent.as_deref(),
        event.tracestate.as_deref(),
        str::to_owned,
    )?;
    rules::check_payload(event.payload.get().len(), limits, "payload")?;
    let candidates = index.matching(&event.bucket, &event.event_type);
    // Parsed once, and only when a candidate filters or orders by the payload.
    let needs_tree = candidates
        .iter()
        .any(|s| s.spec.given.filter.is_some() || s.spec.given.ordering_key.is_some());
    let tree: serde_json::Value = match needs_tree {
        true => serde_json::from_str(event.payload.get())
            .map_err(|e| FieldError::new("payload", e.to_string()))?,
        false => serde_json::Value::Null,
    };
    let matched: Vec<Arc<Subscription>> =
        candidates.into_iter().filter(|s| s.passes(&tree)).collect();
    if matched.len() > MAX_FAN_OUT {
        return Err(FieldError::new(
            "event_type",
            format!(
                "matches {} subscriptions of the bucket; at most {MAX_FAN_OUT} may share an event",
                matched.len()
            ),
        ));
    }
    let body = envelope(&event.event_type, now, &event.payload);
    if matched.is_empty() {
        return Ok(Published {
            event_id,
            jobs: Vec::new(),
            scheduled: Scheduled::new(),
            deliveries: Vec::new(),
            kept: Some(EventRecord {
                id: event_id,
                bucket: event.bucket.as_str().into(),
                event_type: event.event_type.as_str().into(),
                created_at: now,
                envelope: body,
            }),
        });
    }
    // The jobs' body is the envelope: it is what the payload limit holds.
    rules::check_payload(body.len(), limits, "payload")?;
    // A time already passed means now: the job is delivered like any other.
    let passed_since = now.checked_sub_signed(skew).unwrap_or(now);
    let event_type: Arc<str> = event.event_type.as_str().into();
    let on_complete: Option<Arc<str>> = event.on_complete.map(Into::into);
    let mut jobs = Vec::with_capacity(matched.len());
    let mut scheduled = Scheduled::new();
    let mut deliveries = Vec::with_capacity(matched.len());
    for s in &matched {
        let key = ordering_key(s, &tree);
        let (mut job, deliver_at) = s
            .template
            .make(
                next_id(),
                body.clone(),
                key.as_deref(),
                event.deliver_at,
                limits,
                now,
            )
            .map_err(|e| name_field(e, s))?;
        if let Some(at) = deliver_at.filter(|at| *at > passed_since) {
            scheduled.push((job.id, at));
        }
        job.idempotency_key = event.idempotency_key.clone();
        job.on_complete = on_complete.clone();
        job.trace = trace.clone();
        job.event = Some(EventLink {
            event_id,
            event_type: event_type.clone(),
            subscription: s.id,
        });
        deliveries.push(EventDelivery {
            subscription_id: s.id.to_string(),
            job_id: job.id.to_string(),
        });
        jobs.push(Arc::new(job));
    }
    Ok(Published {
        event_id,
        jobs,
        scheduled,
        deliveries,
        kept: None,
    })
}

/// What a `POST /v1/events` body carries.
#[derive(Debug)]
pub enum Publishing {
    /// One event (the body is the event).
    One(NewEvent),
    /// A batch (`{"events": [...]}`): 1 to [`MAX_EVENTS_PER_REQUEST`] events.
    Batch(Vec<NewEvent>),
}

impl Publishing {
    /// Reads a `POST /v1/events` body, naming a bad field as the body does (`events[3].bucket`
    /// in a batch). An event that names no trace of its own is in `trace` (the request's
    /// `traceparent` header).
    pub fn read(
        body: &[u8],
        trace: Option<&crate::telemetry::TraceContext>,
    ) -> Result<Publishing, ApiError> {
        let mut publishing = Publishing::read_body(body)?;
        if let Some(trace) = trace {
            let events = match &mut publishing {
                Publishing::One(event) => std::slice::from_mut(event),
                Publishing::Batch(events) => events,
            };
            let own = |e: &NewEvent| e.traceparent.is_some() || e.tracestate.is_some();
            for event in events.iter_mut().filter(|e| !own(e)) {
                event.traceparent = Some(trace.traceparent.to_string());
                event.tracestate = trace.tracestate.as_deref().map(str::to_owned);
            }
        }
        Ok(publishing)
    }

    fn read_body(body: &[u8]) -> Result<Publishing, ApiError> {
        // Only the top level is looked at here: whether it has `events`.
        #[derive(Deserialize)]
        struct Shape<'a> {
            #[serde(borrow, default)]
            events: Option<&'a RawValue>,
        }
        let batch = serde_json::from_slice::<Shape>(body).is_ok_and(|s| s.events.is_some());
        if !batch {
            return Ok(Publishing::One(crate::rpc::parse_json(body)?));
        }
        let EventBatch { events } = crate::rpc::parse_json(body)?;
        if events.is_empty() || events.len() > MAX_EVENTS_PER_REQUEST {
            return Err(ApiError::InvalidField(FieldError::new(
                "events",
                format!(
                    "holds {} events; a batch holds 1 to {MAX_EVENTS_PER_REQUEST}",
                    events.len()
                ),
            )));
        }
        Ok(Publishing::Batch(events))
    }

    /// Its events, in order.
    pub fn events(&self) -> &[NewEvent] {
        match self {
            Publishing::One(event) => std::slice::from_ref(event),
            Publishing::Batch(events) => events,
        }
    }

    /// Makes each event's jobs ([`fan_out`]), in order, each with its bucket and idempotency
    /// key: a bad event refuses the whole request (a field of a batch's event `i` is named
    /// `events[i].…`), and so do events that make more than `max_jobs` jobs between them.
    /// `event_id` mints each event's id.
    #[allow(clippy::too_many_arguments)]
    pub fn fan_out_each(
        self,
        index: &Index,
        limits: &IntakeLimits,
        now: DateTime<Utc>,
        skew: chrono::Duration,
        max_jobs: usize,
        mut event_id: impl FnMut() -> Ulid,
        mut next_id: impl FnMut() -> JobId,
    ) -> Result<Vec<Fanned>, FieldError> {
        let (events, batch) = match self {
            Publishing::One(event) => (vec![event], false),
            Publishing::Batch(events) => (events, true),
        };
        let mut out = Vec::with_capacity(events.len());
        let mut jobs = 0usize;
        for (i, event) in events.into_iter().enumerate() {
            let (bucket, key) = (event.bucket.clone(), event.idempotency_key.clone());
            let published = fan_out(event, index, limits, now, skew, event_id(), &mut next_id)
                .map_err(|mut e| {
                    if batch {
                        e.field = format!("events[{i}].{}", e.field);
                    }
                    e
                })?;
            jobs += published.jobs.len();
            if jobs > max_jobs {
                return Err(FieldError::too_large(
                    "events",
                    format!(
                        "its events make more than {max_jobs} jobs between them; send fewer at \
                         a time"
                    ),
                ));
            }
            out.push(Fanned {
                bucket,
                key,
                published,
            });
        }
        Ok(out)
    }

    /// Makes each event's jobs ([`Publishing::fan_out_each`]), all of them one submission: at
    /// most [`MAX_JOBS_PER_EVENT_BATCH`] between them.
    pub fn fan_out(
        self,
        index: &Index,
        limits: &IntakeLimits,
        now: DateTime<Utc>,
        event_id: impl FnMut() -> Ulid,
        next_id: impl FnMut() -> JobId,
    ) -> Result<PublishedBatch, FieldError> {
        let skew = chrono::Duration::zero();
        let each = self.fan_out_each(
            index,
            limits,
            now,
            skew,
            MAX_JOBS_PER_EVENT_BATCH,
            event_id,
            next_id,
        )?;
        let mut out = PublishedBatch::default();
        for Fanned { published, .. } in each {
            out.jobs.extend(published.jobs);
            out.scheduled.extend(published.scheduled);
            out.kept.extend(published.kept);
            out.events.push((published.event_id, published.deliveries));
        }
        Ok(out)
    }
}

/// One event of a publish, fanned out: its bucket, its idempotency key and its jobs.
#[derive(Debug)]
pub struct Fanned {
    /// The event's bucket.
    pub bucket: String,
    /// Its idempotency key, if it has one.
    pub key: Option<String>,
    /// Its jobs (or itself, kept).
    pub published: Published,
}

/// An envelope read back (what a job of the event, or its kept row, carries): its type, time
/// and data.
#[derive(Deserialize)]
pub struct Envelope<'a> {
    /// The event's type.
    #[serde(rename = "type", borrow)]
    pub event_type: std::borrow::Cow<'a, str>,
    /// When it was published.
    #[serde(default)]
    pub timestamp: Option<DateTime<Utc>>,
    /// Its data.
    #[serde(borrow)]
    pub data: &'a RawValue,
}

/// A forwarded kept event (`events[i]` of an import), checked as a publish checks its event.
pub fn kept_of_wire(
    event: spindle_client::KeptEvent,
    i: usize,
    limits: &IntakeLimits,
) -> Result<EventRecord, FieldError> {
    let field = |name: &str| format!("events[{i}].{name}");
    let id: Ulid = event
        .event_id
        .parse()
        .map_err(|_| FieldError::new(field("event_id"), "must be a ULID"))?;
    rules::check_bucket(&event.bucket, &field("bucket"))?;
    check_event_type(&event.event_type, &field("event_type"))?;
    // The envelope's data is the event's payload: held to this Director's limit, as a publish
    // straight to it is.
    let envelope: Envelope = serde_json::from_str(event.envelope.get())
        .map_err(|e| FieldError::new(field("envelope"), e.to_string()))?;
    if envelope.event_type != event.event_type {
        return Err(FieldError::new(
            field("envelope"),
            "names another type than event_type",
        ));
    }
    rules::check_payload(envelope.data.get().len(), limits, &field("envelope.data"))?;
    Ok(EventRecord {
        id,
        bucket: event.bucket.as_str().into(),
        event_type: event.event_type.as_str().into(),
        created_at: event.created_at,
        envelope: crate::rpc::json_bytes(event.envelope),
    })
}

/// A publish's events made into jobs: one submission, so committed together or not at all.
#[derive(Debug, Default)]
pub struct PublishedBatch {
    /// Every event's jobs, event after event.
    pub jobs: Vec<Arc<Job>>,
    /// Their first attempt times, when `deliver_at` is ahead (in the order of `jobs`).
    pub scheduled: Scheduled,
    /// The events that made no job, kept all the same (in the same transaction).
    pub kept: Vec<EventRecord>,
    /// Per event, in order: its id and its jobs.
    pub events: Vec<(Ulid, Vec<EventDelivery>)>,
}

/// A back-fill's jobs for one subscription, ready for the writer (after the JobDB's own
/// jobs of it are left out).
#[derive(Debug)]
pub struct Backfilled {
    /// One job per wanted event, in request order.
    pub jobs: Vec<Arc<Job>>,
    /// How many events the subscription does not want (type or filter).
    pub unwanted: usize,
}

/// Checks past events (a back-fill of `subscription`) and makes a job of each it wants: the
/// envelope as it was published (type, time, data), linked to the event's own id, with the
/// idempotency key `backfill:<event id>`. Fields are named `events[i].…`.
pub fn backfill(
    subscription: &Subscription,
    events: Vec<PastEvent>,
    limits: &IntakeLimits,
    now: DateTime<Utc>,
    mut next_id: impl FnMut() -> JobId,
) -> Result<Backfilled, FieldError> {
    if events.is_empty() || events.len() > MAX_FAN_OUT {
        return Err(FieldError::new(
            "events",
            format!("must hold 1 to {MAX_FAN_OUT} events"),
        ));
    }
    let mut jobs = Vec::with_capacity(events.len());
    let mut unwanted = 0;
    for (i, event) in events.iter().enumerate() {
        let field = |name: &str| format!("events[{i}].{name}");
        let event_id: Ulid = event
            .event_id
            .parse()
            .map_err(|_| FieldError::new(field("event_id"), "must be a ULID"))?;
        check_event_type(&event.event_type, &field("event_type"))?;
        rules::check_payload(event.data.get().len(), limits, &field("data"))?;
        let tree: serde_json::Value = serde_json::from_str(event.data.get())
            .map_err(|e| FieldError::new(field("data"), e.to_string()))?;
        if !subscription.wants(&event.event_type) || !subscription.passes(&tree) {
            unwanted += 1;
            continue;
        }
        let body = envelope(&event.event_type, event.timestamp, &event.data);
        rules::check_payload(body.len(), limits, &field("data"))?;
        let key = ordering_key(subscription, &tree);
        let (mut job, _) = subscription
            .template
            .make(next_id(), body, key.as_deref(), None, limits, now)
            .map_err(|e| {
                FieldError::new(
                    "events",
                    format!(
                        "subscription {}: {} {}",
                        subscription.id, e.field, e.message
                    ),
                )
            })?;
        job.idempotency_key = Some(format!("backfill:{event_id}"));
        job.event = Some(EventLink {
            event_id,
            event_type: event.event_type.as_str().into(),
            subscription: subscription.id,
        });
        jobs.push(Arc::new(job));
    }
    Ok(Backfilled { jobs, unwanted })
}

/// The wire form of an event a JobDB holds.
pub fn event_view(event: &crate::jobdb::events::StoredEvent) -> spindle_client::EventView {
    spindle_client::EventView {
        event_id: event.id.to_string(),
        bucket: event.bucket.clone(),
        event_type: event.event_type.clone(),
        created_at: event.created_at,
        deliveries: event
            .jobs
            .iter()
            .map(|(job, subscription)| EventDelivery {
                subscription_id: subscription.to_string(),
                job_id: job.to_string(),
            })
            .collect(),
    }
}

/// The body every subscriber of the event gets. Valid JSON by construction: `payload` is
/// JSON already, and the type is written by serde.
fn envelope(event_type: &str, now: DateTime<Utc>, payload: &RawValue) -> bytes::Bytes {
    let text = format!(
        "{{\"type\":{},\"timestamp\":\"{}\",\"data\":{}}}",
        serde_json::Value::from(event_type),
        now.to_rfc3339_opts(SecondsFormat::Micros, true),
        payload.get()
    );
    bytes::Bytes::from(text)
}

/// The job's ordering key: the subscription's id and the value its pointer finds (a string,
/// or a number's text); hashed when too long. No value there: the event goes unordered.
fn ordering_key(s: &Subscription, payload: &serde_json::Value) -> Option<String> {
    let pointer = s.spec.given.ordering_key.as_deref()?;
    let value = match payload.pointer(pointer)? {
        serde_json::Value::String(text) if !text.is_empty() => text.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let key = format!("{}:{value}", s.id);
    if key.len() <= MAX_ORDERING_KEY_BYTES && !key.chars().any(char::is_control) {
        return Some(key);
    }
    let digest = Sha256::digest(value.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{}:sha256:{hex}", s.id))
}

/// An error of one subscription's job, named for the event: its ordering key comes from the
/// event's payload and its first attempt time is the event's; anything else is the
/// subscription's.
fn name_field(mut e: FieldError, s: &Subscription) -> FieldError {
    match e.field.as_str() {
        "ordering_key" => e.field = "payload".to_owned(),
        "deliver_at" => {}
        field => {
            e.message = format!("subscription {}: {field} {}", s.id, e.message);
            e.field = "event_type".to_owned();
        }
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_client::{NewSubscription, PayloadFilter};

    fn sub(given: NewSubscription) -> Arc<Subscription> {
        Arc::new(crate::events::subscription::check(given).unwrap())
    }

    fn event(event_type: &str, payload: &str) -> NewEvent {
        NewEvent {
            bucket: "t1".into(),
            event_type: event_type.into(),
            payload: RawValue::from_string(payload.into()).unwrap(),
            idempotency_key: None,
            deliver_at: None,
            on_complete: None,
            traceparent: None,
            tracestate: None,
        }
    }

    fn publish(index: &Index, e: NewEvent) -> Result<Published, FieldError> {
        fan_out(
            e,
            index,
            &IntakeLimits::default(),
            Utc::now(),
            chrono::Duration::zero(),
            Ulid::new(),
            || JobId(Ulid::new()),
        )
    }

    #[test]
    fn one_job_per_matching_subscription_with_the_envelope_and_link() {
        let all = sub(NewSubscription::new("t1", "https://a.example/", ["*"]));
        let gold = sub(NewSubscription {
            filter: Some(PayloadFilter {
                pointer: "/tier".into(),
                equals: "gold".into(),
            }),
            ..NewSubscription::new("t1", "https://b.example/", ["invoice.*"])
        });
        let other = sub(NewSubscription::new(
            "t1",
            "https://c.example/",
            ["customer.*"],
        ));
        let index = Index::new([all.clone(), gold.clone(), other]);

        let p = publish(&index, event("invoice.paid", r#"{"tier":"gold","n":1}"#)).unwrap();
        let subs: Vec<Ulid> = p
            .jobs
            .iter()
            .map(|j| j.event.as_ref().unwrap().subscription)
            .collect();
        let mut expected = vec![all.id, gold.id];
        expected.sort();
        assert_eq!(subs, expected);
        for (job, d) in p.jobs.iter().zip(&p.deliveries) {
            assert_eq!(d.job_id, job.id.to_string());
            let link = job.event.as_ref().unwrap();
            assert_eq!(link.event_id, p.event_id);
            assert_eq!(&*link.event_type, "invoice.paid");
            let body: serde_json::Value = serde_json::from_slice(&job.payload).unwrap();
            assert_eq!(body["type"], "invoice.paid");
            assert_eq!(body["data"]["n"], 1);
            assert_eq!(job.expire_at - job.created_at, chrono::Duration::hours(4));
            assert!(job
                .headers
                .iter()
                .any(|(n, v)| n == "content-type" && v == "application/json"));
        }
        assert_eq!(
            p.jobs[0].payload.as_ptr(),
            p.jobs[1].payload.as_ptr(),
            "an event's jobs share its one envelope"
        );
        let p = publish(&index, event("invoice.paid", r#"{"tier":"silver"}"#)).unwrap();
        assert_eq!(
            p.jobs.len(),
            1,
            "the filter leaves out the gold subscription"
        );
        let p = publish(&index, event("invoice.paid", r#"{"tier":"gold"}"#)).unwrap();
        assert_eq!(p.jobs.len(), 2);
        let p = publish(
            &index,
            NewEvent {
                bucket: "t2".into(),
                ..event("invoice.paid", "1")
            },
        )
        .unwrap();
        assert!(p.jobs.is_empty(), "no subscription in another bucket");
    }

    #[test]
    fn ordered_subscriptions_key_by_their_id_and_the_payload_value() {
        let ordered = sub(NewSubscription {
            ordering_key: Some("/customer".into()),
            ..NewSubscription::new("t1", "https://a.example/", ["*"])
        });
        let index = Index::new([ordered.clone()]);
        let key = |payload: &str| {
            let p = publish(&index, event("x", payload)).unwrap();
            p.jobs[0].ordering.as_ref().map(|o| o.key.to_string())
        };
        assert_eq!(
            key(r#"{"customer":"c1"}"#),
            Some(format!("{}:c1", ordered.id))
        );
        assert_eq!(
            key(r#"{"customer":42}"#),
            Some(format!("{}:42", ordered.id))
        );
        assert_eq!(key(r#"{"other":1}"#), None, "no value: unordered");
        let long = key(&format!(r#"{{"customer":"{}"}}"#, "c".repeat(300))).unwrap();
        assert!(long.len() <= MAX_ORDERING_KEY_BYTES && long.contains(":sha256:"));
    }

    #[test]
    fn bad_events_name_their_field() {
        let index = Index::default();
        let cases = [
            (
                NewEvent {
                    bucket: String::new(),
                    ..event("x", "1")
                },
                "bucket",
            ),
            (event("bad type", "1"), "event_type"),
            (event("a.*", "1"), "event_type"),
            (
                NewEvent {
                    on_complete: Some("ftp://x".into()),
                    ..event("x", "1")
                },
                "on_complete",
            ),
            (
                NewEvent {
                    idempotency_key: Some(String::new()),
                    ..event("x", "1")
                },
                "idempotency_key",
            ),
            (
                NewEvent {
                    traceparent: Some("00-nope".into()),
                    ..event("x", "1")
                },
                "traceparent",
            ),
            (
                NewEvent {
                    tracestate: Some("a=b".into()),
                    ..event("x", "1")
                },
                "tracestate",
            ),
        ];
        for (e, field) in cases {
            assert_eq!(publish(&index, e).unwrap_err().field, field);
        }
        let big = format!(
            "\"{}\"",
            "x".repeat(IntakeLimits::default().max_payload_bytes + 1)
        );
        let e = publish(&index, event("x", &big)).unwrap_err();
        assert_eq!((e.field.as_str(), e.too_large), ("payload", true));

        // What a subscription's jobs refuse of the event names the event's field.
        let index = Index::new([sub(NewSubscription::new("t1", "https://a.example/", ["*"]))]);
        let far = NewEvent {
            deliver_at: Some(Utc::now() + chrono::Duration::days(400)),
            ..event("x", "1")
        };
        assert_eq!(publish(&index, far).unwrap_err().field, "deliver_at");
        let limit = IntakeLimits::default().max_payload_bytes;
        let near = format!("\"{}\"", "x".repeat(limit - 10));
        assert!(
            publish(&Index::default(), event("x", &near)).is_ok(),
            "kept: the payload fits"
        );
        let e = publish(&index, event("x", &near)).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.too_large),
            ("payload", true),
            "its jobs' envelope does not"
        );
    }
}
