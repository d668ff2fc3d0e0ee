//! `POST /v1/events` through the router, one event or a batch: each event is fanned out here
//! (from this router's cache of the subscriptions), its idempotency key is claimed once for the
//! whole event (owner: the event's id), and every new event's jobs (and the events kept without
//! a job) go to one Director in one forward, so they are committed in one transaction there, as
//! a publish straight to a Director is. The claims are confirmed when the events are stored and
//! released when they certainly are not. A batch's events make at most 1,000 jobs between them
//! (one forward); an event whose key was published before is answered `duplicate` with that
//! event's jobs, and one whose key is being stored elsewhere makes the whole request wait (503,
//! nothing stored).
//!
//! `POST /v1/subscriptions/{id}/backfill` takes the same steps: each (subscription, event)
//! claims its back-fill key (owner: the job), so a back-fill sent again or through several
//! routers makes one job per event within the dedup window.
//!
//! A router that dies between claiming and confirming leaves a pending claim; the producer's
//! retry (any router) waits for it to lapse, then asks the Directors for the event
//! (`GET /v1/events/{id}`): stored, the key is confirmed for it and the retry answered
//! `duplicate` with its id and jobs; absent from every live JobDB, the retry takes the key
//! over and publishes anew.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use spindle_client::{EventView, PublishReply};

use spindle_client::api::MAX_IMPORT_JOBS;

use super::claims::{claim, settle_claims, Holds, Keyed};
use super::forward::{forward, Group, Kept};
use super::{Routed, Sent, Shared};
use crate::events::publish::{Fanned, Published, Publishing};
use crate::job::JobId;
use crate::router::dedup::{Claim, DedupKey};
use crate::rpc::error::ApiError;
use crate::rpc::rules::FieldError;

/// One event of a publish, fanned out here, with its key's claim if it has a key.
struct Made {
    bucket: String,
    key: Option<String>,
    published: Published,
    claim: Option<Claim>,
}

/// Publish an event, or a batch of them, through the router: fan each out, claim the keys,
/// forward the new events' jobs (and those kept without a job) in one forward, settle the
/// claims by the outcome, and answer each event.
pub(super) async fn publish_event(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (caller, body) = shared.intake(&headers, body)?;
    let subscriptions = crate::events::configured(&shared.settings.subscriptions)?;
    let trace = crate::telemetry::from_headers(&headers);
    let publishing = Publishing::read(&body, trace.as_ref())?;
    for event in publishing.events() {
        crate::rpc::check_publisher(caller.as_ref(), &event.bucket)?;
    }
    let batch = matches!(publishing, Publishing::Batch(_));
    let now = Utc::now();
    let made = fan_out(&shared, publishing, &subscriptions.index(), now)?;
    let (fates, taken) = claim_events(&shared, &made).await?;
    let (routed, kept) = outbound(&made, &fates)?;
    let sent = match (routed.is_empty() && kept.is_empty(), made.first()) {
        (false, Some(first)) => forward_alone(&shared, &first.bucket, &routed, kept, now).await,
        // Every event is a duplicate: nothing to store.
        _ => Sent::Stored,
    };
    settle_sent(&shared, sent, &made, &fates, &taken, batch).await?;
    let mut replies = replies_of(&shared, &made, &fates).await;
    if !batch {
        if let Some(one) = replies.pop() {
            return Ok((StatusCode::ACCEPTED, Json(one)).into_response());
        }
    }
    let reply = spindle_client::PublishBatchReply {
        transaction_id: None,
        events: replies,
    };
    Ok((StatusCode::ACCEPTED, Json(reply)).into_response())
}

/// Each event of `publishing` fanned out to its subscriptions, with its key's claim (owner: the
/// event's id). The request's jobs go in one forward: at most what one import takes.
fn fan_out(
    shared: &Shared,
    publishing: Publishing,
    index: &crate::events::Index,
    now: DateTime<Utc>,
) -> Result<Vec<Made>, ApiError> {
    let skew = chrono::Duration::from_std(shared.dedup.config().max_skew)
        .unwrap_or(chrono::Duration::zero());
    Ok(publishing
        .fan_out_each(
            index,
            &shared.settings.intake,
            now,
            skew,
            MAX_IMPORT_JOBS,
            || shared.next_id().0,
            || shared.next_id(),
        )?
        .into_iter()
        .map(
            |Fanned {
                 bucket,
                 key,
                 published,
             }| Made {
                claim: key.as_deref().map(|key| Claim {
                    key: DedupKey::event(&bucket, key),
                    at: now,
                    owner: JobId(published.event_id),
                }),
                bucket,
                key,
                published,
            },
        )
        .collect())
}

/// Claims every key at once: each event's fate, and the claims taken (those of the free
/// events). One still being stored elsewhere makes the whole request wait: the claims taken
/// are given back, nothing is stored.
async fn claim_events(
    shared: &Shared,
    made: &[Made],
) -> Result<(Vec<Keyed>, Vec<Claim>), ApiError> {
    let asked: Vec<Claim> = made.iter().filter_map(|m| m.claim).collect();
    let mut keyed = match asked.is_empty() {
        true => Vec::new(),
        false => claim(shared, &asked, Holds::Events).await?,
    }
    .into_iter();
    let fates: Vec<Keyed> = made
        .iter()
        .map(|m| match m.claim {
            Some(_) => keyed.next().unwrap_or(Keyed::Free),
            None => Keyed::Free,
        })
        .collect();
    let taken: Vec<Claim> = free(made, &fates).filter_map(|m| m.claim).collect();
    if let Some(Keyed::Pending(_, why)) = fates.iter().find(|f| matches!(f, Keyed::Pending(..))) {
        settle_claims(shared, &[], &taken).await;
        return Err(ApiError::Unavailable(why.clone()));
    }
    for m in free(made, &fates) {
        crash_at("claimed", m.key.as_deref());
    }
    Ok((fates, taken))
}

/// The events of `made` whose keys were free (or that have none): the ones to store.
fn free<'a>(made: &'a [Made], fates: &'a [Keyed]) -> impl Iterator<Item = &'a Made> + 'a {
    made.iter()
        .zip(fates)
        .filter(|(_, f)| matches!(f, Keyed::Free))
        .map(|(m, _)| m)
}

/// The free events' jobs, and those kept without a job, for one group sent alone: one
/// forward and so one commit. Each key's claim rides on its event's first job (which keeps it
/// alive and bounds the forward's `not_after`), or on the kept event.
fn outbound(made: &[Made], fates: &[Keyed]) -> Result<(Vec<Routed>, Vec<Kept>), ApiError> {
    let mut routed: Vec<Routed> = Vec::new();
    let mut kept = Vec::new();
    for m in free(made, fates) {
        let scheduled: HashMap<JobId, DateTime<Utc>> =
            m.published.scheduled.iter().copied().collect();
        for (i, job) in m.published.jobs.iter().enumerate() {
            routed.push(Routed {
                first_at: scheduled.get(&job.id).copied().unwrap_or(job.created_at),
                claim: m.claim.filter(|_| i == 0),
                job: job.clone(),
                result: None,
            });
        }
        if let Some(event) = &m.published.kept {
            let wire = event
                .to_wire()
                .ok_or_else(|| ApiError::InvalidField(FieldError::new("payload", "is not JSON")))?;
            kept.push((wire, m.claim));
        }
    }
    Ok((routed, kept))
}

/// Settles the claims taken by how the forward went: confirmed when stored, given back when
/// certainly not (the request's error says why), kept pending when unknown.
async fn settle_sent(
    shared: &Shared,
    sent: Sent,
    made: &[Made],
    fates: &[Keyed],
    taken: &[Claim],
    batch: bool,
) -> Result<(), ApiError> {
    let stored = free(made, fates);
    match sent {
        Sent::Stored => {
            for m in stored {
                crash_at("stored", m.key.as_deref());
                shared.metrics.event("stored", m.published.jobs.len());
            }
            settle_claims(shared, taken, &[]).await;
            Ok(())
        }
        Sent::Refused(why) => {
            stored.for_each(|_| shared.metrics.event("refused", 0));
            settle_claims(shared, &[], taken).await;
            Err(ApiError::Unavailable(format!("nothing was stored: {why}")))
        }
        Sent::Invalid(why, status) => {
            // The last Director tried refused the events' jobs for their content (a limit of
            // its own below the router's; the others refused too): a retry cannot help.
            stored.for_each(|_| shared.metrics.event("invalid", 0));
            settle_claims(shared, &[], taken).await;
            let field = if batch { "events" } else { "event" };
            let message = format!("was refused for its content, nothing was stored: {why}");
            Err(ApiError::InvalidField(match status {
                413 => FieldError::too_large(field, message),
                _ => FieldError::new(field, message),
            }))
        }
        Sent::Unknown(why) => {
            stored.for_each(|_| shared.metrics.event("unknown", 0));
            Err(ApiError::OutcomeUnknown(format!(
                "the events' jobs may or may not be stored ({why}); publish again with the \
                 same idempotency keys"
            )))
        }
    }
}

/// Each event's answer: its own jobs, or those of the event that holds its key (one of this
/// request's, or a stored one a Director tells).
async fn replies_of(shared: &Shared, made: &[Made], fates: &[Keyed]) -> Vec<PublishReply> {
    let ours: HashMap<JobId, usize> = made
        .iter()
        .enumerate()
        .map(|(i, m)| (JobId(m.published.event_id), i))
        .collect();
    let mut replies = Vec::with_capacity(made.len());
    for (m, fate) in made.iter().zip(fates) {
        let reply = match fate {
            Keyed::Duplicate(owner) => {
                shared.metrics.event("duplicate", 0);
                let deliveries = match ours.get(owner) {
                    Some(&i) => made[i].published.deliveries.clone(),
                    None => find_event(shared, *owner)
                        .await
                        .map(|e| e.deliveries)
                        .unwrap_or_default(),
                };
                answer(Some(owner.to_string()), deliveries, true)
            }
            _ => answer(
                Some(m.published.event_id.to_string()),
                m.published.deliveries.clone(),
                false,
            ),
        };
        replies.push(reply);
    }
    replies
}

/// Deliver past events to a subscription through the router (`POST
/// /v1/subscriptions/{id}/backfill`): the subscription's types and filter decide here, each
/// (subscription, event) claims its back-fill key once, and the new jobs go to one Director in
/// one forward. So a back-fill sent again, or through several routers at once, makes one job
/// per event within the dedup window, whichever Directors store them; an event already given
/// its job is counted in `skipped`.
pub(super) async fn backfill(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (caller, body) = shared.intake(&headers, body)?;
    let subscription =
        crate::events::http::to_backfill(&shared.settings.subscriptions, &id, caller.as_ref())?;
    let id = subscription.id;
    let request: spindle_client::BackfillRequest = crate::rpc::parse_json(&body)?;
    let total = request.events.len();
    let now = Utc::now();
    let made = crate::events::publish::backfill(
        &subscription,
        request.events,
        &shared.settings.intake,
        now,
        || shared.next_id(),
    )?;
    let claims: Vec<Claim> = made
        .jobs
        .iter()
        .filter_map(|job| {
            let event = job.event.as_ref()?.event_id;
            Some(Claim {
                key: DedupKey::backfill(subscription.bucket(), id, event),
                at: now,
                owner: job.id,
            })
        })
        .collect();
    let fates = match claims.is_empty() {
        true => Vec::new(),
        false => claim(&shared, &claims, Holds::Jobs).await?,
    };
    let free: Vec<usize> = (0..claims.len())
        .filter(|&i| matches!(fates.get(i), Some(Keyed::Free)))
        .collect();
    let taken: Vec<Claim> = free.iter().map(|&i| claims[i]).collect();
    if let Some(Keyed::Pending(_, why)) = fates.iter().find(|f| matches!(f, Keyed::Pending(..))) {
        settle_claims(&shared, &[], &taken).await;
        return Err(ApiError::Unavailable(why.clone()));
    }
    let routed: Vec<Routed> = free
        .iter()
        .map(|&i| Routed {
            first_at: made.jobs[i].created_at,
            claim: Some(claims[i]),
            job: made.jobs[i].clone(),
            result: None,
        })
        .collect();
    if !routed.is_empty() {
        match forward_alone(&shared, subscription.bucket(), &routed, Vec::new(), now).await {
            Sent::Stored => settle_claims(&shared, &taken, &[]).await,
            Sent::Refused(why) => {
                settle_claims(&shared, &[], &taken).await;
                return Err(ApiError::Unavailable(format!("nothing was stored: {why}")));
            }
            Sent::Invalid(why, _) => {
                settle_claims(&shared, &[], &taken).await;
                return Err(ApiError::InvalidField(FieldError::new(
                    "events",
                    format!("was refused for its content, nothing was stored: {why}"),
                )));
            }
            Sent::Unknown(why) => {
                return Err(ApiError::OutcomeUnknown(format!(
                    "the back-fill's jobs may or may not be stored ({why}); send it again"
                )))
            }
        }
    }
    let deliveries: Vec<spindle_client::BackfilledEvent> = routed
        .iter()
        .filter_map(|r| {
            let e = r.job.event.as_ref()?;
            Some(spindle_client::BackfilledEvent {
                event_id: e.event_id.to_string(),
                job_id: r.job.id.to_string(),
            })
        })
        .collect();
    let reply = spindle_client::BackfillReply {
        skipped: total - deliveries.len(),
        deliveries,
    };
    Ok((StatusCode::ACCEPTED, Json(reply)).into_response())
}

/// Forwards `routed` (and `kept` events) to one Director in one forward of their own, so they
/// are committed together; the claims they carry were made at `claimed_at`.
async fn forward_alone(
    shared: &Shared,
    bucket: &str,
    routed: &[Routed],
    kept: Vec<Kept>,
    claimed_at: DateTime<Utc>,
) -> Sent {
    let group = Group {
        bucket: bucket.into(),
        seq: routed.iter().find_map(|r| r.job.seq()),
        members: (0..routed.len()).collect(),
        tried: Vec::new(),
        last_refusal: Sent::Refused(String::from("no healthy director")),
        claimed_at,
        alone: true,
        kept,
    };
    forward(shared, routed, vec![group])
        .await
        .pop()
        .map(|(_, sent)| sent)
        .unwrap_or_else(|| Sent::Refused("not forwarded".into()))
}

/// One event's answer, naming it and its jobs.
fn answer(
    event_id: Option<String>,
    deliveries: Vec<spindle_client::EventDelivery>,
    duplicate: bool,
) -> PublishReply {
    PublishReply {
        event_id,
        transaction_id: None,
        deliveries,
        duplicate,
    }
}

/// The event `id` as the first healthy Director's JobDB that has it tells.
async fn find_event(shared: &Shared, id: JobId) -> Option<EventView> {
    let id = id.to_string();
    shared
        .ask_directors(|client| {
            let id = id.clone();
            async move { client.event(&id).await }
        })
        .await
        .into_iter()
        .find_map(Result::ok)
}

/// A test's crash point (feature `fault-injection`); nothing otherwise.
#[allow(unused_variables)]
fn crash_at(step: &str, key: Option<&str>) {
    #[cfg(feature = "fault-injection")]
    if let Some(key) = key {
        crate::faults::crash_at(step, key);
    }
}
