//! Back-fill: delivers a bucket's past events to a subscription added after them, read from a
//! JobDB or from the archive, through `POST /v1/subscriptions/{id}/backfill` of a router or a
//! Director.
//!
//! A JobDB keeps every event published to it (with the envelope, `{"type", "timestamp",
//! "data"}`, in its `events` row or in its jobs' bodies), so a bucket's first subscription can
//! be back-filled too; the archive holds the events that made jobs (each job's body is the
//! envelope, its event link names the event) and, in `events` objects, those that made none.
//! An event that already has a job of the subscription in the source is left out; a Director
//! leaves out those its own JobDB has given one, a router those back-filled through any router
//! within its dedup window. The subscription's types and filter decide there which events it
//! wants. The subscriber sees the event's own id (`spindle-event-id`) and timestamp.

use std::collections::{BTreeMap, HashSet};

use crate::events::publish::Envelope;
use chrono::{DateTime, Utc};
use spindle_client::{BackfillRequest, PastEvent};
use ulid::Ulid;

use super::replay::{ReplayError, ReplaySource};
use crate::archive::BatchKind;

/// Events sent per request.
const BATCH: usize = 500;

/// What to back-fill.
#[derive(Clone, Debug)]
pub struct BackfillOptions {
    /// The subscription.
    pub subscription: Ulid,
    /// Its bucket (events of other buckets are never read).
    pub bucket: String,
    /// Only events published at or after this instant.
    pub since: DateTime<Utc>,
    /// The Director's RPC API.
    pub to: String,
    /// Its API token, if it needs one.
    pub token: Option<String>,
    /// Select and count, send nothing.
    pub dry_run: bool,
    /// At most this many events.
    pub limit: usize,
}

/// What a back-fill did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackfillReport {
    /// Events read that have no job of the subscription in the source.
    pub selected: usize,
    /// Jobs made for the subscription.
    pub delivered: usize,
    /// Events the Director skipped (not wanted, or already given a job there).
    pub skipped: usize,
    /// Events whose envelope cannot be read (left out).
    pub unreadable: usize,
}

/// The event `id` whose envelope is `envelope`, if it is one.
fn past_event(id: Ulid, envelope: &[u8]) -> Option<PastEvent> {
    let envelope: Envelope = serde_json::from_slice(envelope).ok()?;
    Some(PastEvent {
        event_id: id.to_string(),
        event_type: envelope.event_type.into_owned(),
        timestamp: envelope.timestamp?,
        data: envelope.data.to_owned(),
    })
}

/// Queues the event `id` with its envelope, or counts it unreadable.
fn take(
    id: Ulid,
    envelope: Option<&[u8]>,
    report: &mut BackfillReport,
    pending: &mut Vec<PastEvent>,
) {
    match envelope.and_then(|e| past_event(id, e)) {
        Some(event) => {
            report.selected += 1;
            pending.push(event);
        }
        None => report.unreadable += 1,
    }
}

/// Reads the events and sends them a batch at a time.
pub async fn backfill(
    source: &ReplaySource,
    options: &BackfillOptions,
) -> Result<BackfillReport, ReplayError> {
    let client = spindle_client::Client::builder(&options.to)
        .token(options.token.clone())
        .no_timeout()
        .build()
        .map_err(|e| ReplayError::submitting(&options.to, e))?;
    let mut report = BackfillReport::default();
    let mut pending: Vec<PastEvent> = Vec::new();
    match source {
        ReplaySource::JobDb(db) => {
            let mut after = None;
            while report.selected < options.limit {
                let page = db
                    .event_sources(
                        &options.bucket,
                        options.since,
                        options.subscription,
                        after,
                        BATCH.min(options.limit - report.selected),
                    )
                    .await?;
                let Some(last) = page.last() else { break };
                after = Some(last.0);
                for (id, envelope) in &page {
                    take(*id, envelope.as_deref(), &mut report, &mut pending);
                }
                send(&client, options, &mut pending, &mut report).await?;
            }
        }
        ReplaySource::Archive { archive, jobdb } => {
            // Every job of the bucket's events since then: one per event to send, unless one
            // of them is already the subscription's; and the events kept without a job.
            let mut events: BTreeMap<Ulid, bytes::Bytes> = BTreeMap::new();
            let mut delivered: HashSet<Ulid> = HashSet::new();
            for manifest in archive.manifests(jobdb.as_deref()).await? {
                for archived in archive.read_batch(&manifest.object_key).await? {
                    // A drained JobDB's history batch also holds jobs that went on elsewhere.
                    if manifest.kind == BatchKind::History && archived.moved_to.is_some() {
                        continue;
                    }
                    let job = archived.to_job()?;
                    let Some(link) = job.event.clone() else {
                        continue;
                    };
                    if *job.bucket != *options.bucket || job.created_at < options.since {
                        continue;
                    }
                    if link.subscription == options.subscription {
                        delivered.insert(link.event_id);
                    } else {
                        events.entry(link.event_id).or_insert(job.payload);
                    }
                }
            }
            for key in archive.event_objects(jobdb.as_deref()).await? {
                for kept in archive.read_events(&key).await? {
                    let Ok(id) = kept.event_id.parse::<Ulid>() else {
                        report.unreadable += 1;
                        continue;
                    };
                    if kept.bucket != options.bucket || kept.created_at < options.since {
                        continue;
                    }
                    let envelope = crate::rpc::json_bytes(kept.envelope);
                    events.entry(id).or_insert(envelope);
                }
            }
            for (event, envelope) in &events {
                if report.selected >= options.limit {
                    break;
                }
                if delivered.contains(event) {
                    continue;
                }
                take(*event, Some(envelope), &mut report, &mut pending);
                if pending.len() >= BATCH {
                    send(&client, options, &mut pending, &mut report).await?;
                }
            }
        }
    }
    send(&client, options, &mut pending, &mut report).await?;
    Ok(report)
}

/// Sends the pending events (nothing on a dry run).
async fn send(
    client: &spindle_client::Client,
    options: &BackfillOptions,
    pending: &mut Vec<PastEvent>,
    report: &mut BackfillReport,
) -> Result<(), ReplayError> {
    if pending.is_empty() || options.dry_run {
        pending.clear();
        return Ok(());
    }
    let request = BackfillRequest {
        events: std::mem::take(pending),
    };
    let reply = client
        .backfill(&options.subscription.to_string(), &request)
        .await
        .map_err(|e| ReplayError::submitting(&options.to, e))?;
    report.delivered += reply.deliveries.len();
    report.skipped += reply.skipped;
    Ok(())
}
