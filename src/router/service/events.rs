//! `POST /v1/events` through the router: the event is fanned out here (from this router's
//! cache of the subscriptions), its idempotency key is claimed once for the whole event (owner:
//! the event's id), and all its jobs go to one Director in one forward, so they are committed
//! in one transaction there, as a publish straight to a Director is. The claim is confirmed
//! when they are stored and released when they certainly are not.
//!
//! A router that dies between claiming and confirming leaves a pending claim; the producer's
//! retry (any router) waits for it to lapse, then asks the Directors for the event
//! (`GET /v1/events/{id}`): stored, the key is confirmed for it and the retry answered
//! `duplicate` with its id and jobs; absent from every live JobDB, the retry takes the key
//! over and publishes anew.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use spindle_client::{EventView, PublishReply};

use super::claims::{claim, settle_claims, Holds, Keyed};
use super::forward::{forward, Group};
use super::{Routed, Sent, Shared};
use crate::job::JobId;
use crate::router::dedup::{Claim, DedupKey};
use crate::rpc::error::ApiError;
use crate::rpc::validate::FieldError;

/// Publish an event through the router.
pub(super) async fn publish_event(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (caller, body) = shared.intake(&headers, body)?;
    let subscriptions = crate::events::configured(&shared.settings.subscriptions)?;
    let event = match crate::events::publish::Publishing::read(&body)? {
        crate::events::publish::Publishing::One(event) => event,
        crate::events::publish::Publishing::Batch(_) => {
            return Err(ApiError::InvalidField(FieldError::new(
                "events",
                "a router publishes one event per request (each claims its own key); send \
                 batches of events straight to a Director",
            )))
        }
    };
    crate::rpc::check_publisher(caller.as_ref(), &event.bucket)?;
    let (bucket, key) = (event.bucket.clone(), event.idempotency_key.clone());
    let event_id = shared.next_id().0;
    let now = Utc::now();
    let published = crate::events::publish::fan_out(
        event,
        &subscriptions.index(),
        &shared.settings.intake,
        now,
        chrono::Duration::from_std(shared.dedup.config().max_skew)
            .unwrap_or(chrono::Duration::zero()),
        event_id,
        || shared.next_id(),
    )?;
    if published.jobs.is_empty() {
        shared.metrics.event("unmatched", 0);
        return Ok(reply(None, Vec::new(), false));
    }

    let claim_of = key.as_deref().map(|key| Claim {
        key: DedupKey::event(&bucket, key),
        at: now,
        owner: JobId(event_id),
    });
    if let Some(c) = claim_of {
        match claim(&shared, &[c], Holds::Events).await?.pop() {
            Some(Keyed::Duplicate(owner)) => {
                shared.metrics.event("duplicate", 0);
                let deliveries = find_event(&shared, owner)
                    .await
                    .map(|e| e.deliveries)
                    .unwrap_or_default();
                return Ok(reply(Some(owner.to_string()), deliveries, true));
            }
            Some(Keyed::Pending(_, why)) => return Err(ApiError::Unavailable(why)),
            Some(Keyed::Free) | None => {}
        }
    }
    crash_at("claimed", key.as_deref());

    // One group, sent alone: the event's jobs share one forward and so one commit. The claim
    // rides on the first job, which keeps it alive and bounds the forward's `not_after`.
    let scheduled: HashMap<JobId, DateTime<Utc>> = published.scheduled.into_iter().collect();
    let routed: Vec<Routed> = published
        .jobs
        .into_iter()
        .enumerate()
        .map(|(i, job)| Routed {
            first_at: scheduled.get(&job.id).copied().unwrap_or(job.created_at),
            claim: claim_of.filter(|_| i == 0),
            job,
            result: None,
        })
        .collect();
    let group = Group {
        bucket: bucket.as_str().into(),
        seq: routed.iter().find_map(|r| r.job.seq()),
        members: (0..routed.len()).collect(),
        tried: Vec::new(),
        last_refusal: Sent::Refused(String::from("no healthy director")),
        claimed_at: now,
        alone: true,
    };
    let sent = forward(&shared, &routed, vec![group])
        .await
        .pop()
        .map(|(_, sent)| sent)
        .unwrap_or_else(|| Sent::Refused("not forwarded".into()));
    let claims: Vec<Claim> = claim_of.into_iter().collect();
    match sent {
        Sent::Stored => {
            crash_at("stored", key.as_deref());
            shared.metrics.event("stored", published.deliveries.len());
            settle_claims(&shared, &claims, &[]).await;
            Ok(reply(
                Some(event_id.to_string()),
                published.deliveries,
                false,
            ))
        }
        Sent::Refused(why) => {
            shared.metrics.event("refused", 0);
            settle_claims(&shared, &[], &claims).await;
            Err(ApiError::Unavailable(format!("nothing was stored: {why}")))
        }
        Sent::Invalid(why, status) => {
            // The last Director tried refused the event's jobs for their content (a limit of
            // its own below the router's; the others refused too): a retry cannot help.
            shared.metrics.event("invalid", 0);
            settle_claims(&shared, &[], &claims).await;
            let message = format!("was refused for its content, nothing was stored: {why}");
            Err(ApiError::InvalidField(match status {
                413 => FieldError::too_large("event", message),
                _ => FieldError::new("event", message),
            }))
        }
        Sent::Unknown(why) => {
            shared.metrics.event("unknown", 0);
            Err(ApiError::OutcomeUnknown(format!(
                "the event's jobs may or may not be stored ({why}); publish again with the same \
             idempotency key"
            )))
        }
    }
}

/// A `202` naming the event and its jobs.
fn reply(
    event_id: Option<String>,
    deliveries: Vec<spindle_client::EventDelivery>,
    duplicate: bool,
) -> Response {
    let reply = PublishReply {
        event_id,
        transaction_id: None,
        deliveries,
        duplicate,
    };
    (StatusCode::ACCEPTED, Json(reply)).into_response()
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
