//! Parking endpoints: when a failing endpoint is parked, how it is probed, how fast its jobs
//! go again once it is unparked, and the task that records parks and tells buckets of them.
//!
//! The scheduler decides (a lane whose breaker has been open for the policy's time asks for a
//! park; a parked lane whose probe succeeds asks for an unpark) and asks this task, which
//! writes the shared record ([`crate::registry::parks`]) and, for every bucket with jobs of a
//! parked or unparked endpoint here, publishes a `spindle.endpoint.parked` or
//! `spindle.endpoint.unparked` event to the bucket's subscriptions. The scheduler sees the
//! record come back with the other controls and holds or paces the lane by it.
//!
//! Without Consul the records live in this process only: a park then holds this Director's
//! jobs alone and ends with it (a restart parks the endpoint again after the policy's time).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::mailbox::Event;
use crate::registry::consul::ConsulClient;
use crate::registry::controls::Controls;
pub use crate::registry::parks::Redrive;
use crate::registry::parks::{self, Change, Park};

/// The event type of a park.
pub const PARKED: &str = "spindle.endpoint.parked";
/// The event type of an unpark.
pub const UNPARKED: &str = "spindle.endpoint.unparked";

/// Most characters of a park's reason told in its event.
const MAX_REASON_CHARS: usize = 512;

/// When a failing endpoint is parked, and how a parked one is probed.
#[derive(Clone, Copy, Debug)]
pub struct ParkPolicy {
    /// How long an endpoint's breaker stays open (no success) before it is parked; `None`:
    /// never (a bucket's own policy may still park it).
    pub after: Option<Duration>,
    /// Wait between two probes of a parked endpoint (per Director).
    pub probe_every: Duration,
    /// How an unparked endpoint's jobs go again.
    pub redrive: Redrive,
}

/// By default an endpoint is parked after its breaker stays open this long.
pub const PARK_AFTER: Duration = Duration::from_secs(3600);
/// By default a parked endpoint is probed this often.
pub const PROBE_EVERY: Duration = Duration::from_secs(60);

impl Default for ParkPolicy {
    fn default() -> Self {
        ParkPolicy {
            after: Some(PARK_AFTER),
            probe_every: PROBE_EVERY,
            redrive: Redrive::default(),
        }
    }
}

/// What the scheduler asks of the park task.
#[derive(Debug)]
pub enum ParkRequest {
    /// Park the endpoint, for `reason`.
    Park {
        /// The endpoint.
        endpoint: Arc<str>,
        /// Why.
        reason: String,
    },
    /// Unpark the endpoint (a probe succeeded).
    Unpark {
        /// The endpoint.
        endpoint: Arc<str>,
    },
    /// Tell `bucket` of the park's last change.
    Announce {
        /// The record as the scheduler saw it.
        park: Park,
        /// The bucket with jobs of the endpoint here.
        bucket: Arc<str>,
    },
}

/// Where park records are kept.
pub enum ParkStore {
    /// Shared in Consul: the controls watch hands them to the scheduler.
    Consul(ConsulClient),
    /// In this process: handed to the scheduler after each change.
    Local(HashMap<String, Park>),
}

impl ParkStore {
    async fn change(
        &mut self,
        endpoint: &str,
        by: &str,
        change: &Change,
        scheduler: &mpsc::UnboundedSender<Event>,
    ) -> Result<Option<Park>, crate::registry::RegistryError> {
        match self {
            ParkStore::Consul(client) => parks::update(client, endpoint, by, change).await,
            ParkStore::Local(records) => {
                let Some(next) =
                    parks::apply(records.get(endpoint), endpoint, change, by, Utc::now())
                else {
                    return Ok(None);
                };
                records.insert(endpoint.to_owned(), next.clone());
                let controls = Controls {
                    parks: records.clone(),
                    ..Controls::default()
                };
                let _ = scheduler.send(Event::Controls(Arc::new(controls)));
                Ok(Some(next))
            }
        }
    }
}

/// Publishes a park's event to a bucket's subscriptions (the Director's RPC state).
pub trait Announcer: Send + Sync + 'static {
    /// Stores the event's jobs: `Ok(true)` once they are committed (or match no
    /// subscription), `Ok(false)` when this Director publishes no events (another must tell).
    fn announce(
        &self,
        event: spindle_client::NewEvent,
        event_id: Ulid,
    ) -> impl std::future::Future<Output = Result<bool, String>> + Send;
}

/// Serves the scheduler's requests until `stop`, as `by` (the Director's holder name); an
/// unpark it makes paces the endpoint by `redrive` on every Director. A request that fails is
/// logged and dropped: the scheduler asks again while it still holds.
pub async fn run(
    mut store: ParkStore,
    by: String,
    redrive: Redrive,
    mut requests: mpsc::UnboundedReceiver<ParkRequest>,
    scheduler: mpsc::UnboundedSender<Event>,
    announcer: impl Announcer,
    stop: CancellationToken,
) {
    loop {
        let request = tokio::select! {
            _ = stop.cancelled() => return,
            request = requests.recv() => match request {
                Some(request) => request,
                None => return,
            },
        };
        match request {
            ParkRequest::Park { endpoint, reason } => {
                let change = Change::Park { reason };
                match store.change(&endpoint, &by, &change, &scheduler).await {
                    Ok(Some(park)) => {
                        tracing::warn!(%endpoint, reason = %park.reason, "endpoint parked: its jobs wait, probed now and then")
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(%endpoint, error = %e, "parking failed"),
                }
            }
            ParkRequest::Unpark { endpoint } => {
                let change = Change::Unpark { redrive };
                match store.change(&endpoint, &by, &change, &scheduler).await {
                    Ok(Some(_)) => {
                        tracing::info!(%endpoint, "endpoint unparked: a probe succeeded")
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(%endpoint, error = %e, "unparking failed"),
                }
            }
            ParkRequest::Announce { park, bucket } => {
                let (event, id) = event_of(&park, &bucket);
                match announcer.announce(event, id).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        tracing::warn!(endpoint = %park.endpoint, %bucket, error = %e, "telling a bucket of a park failed");
                        continue;
                    }
                }
                let told = Change::Announced {
                    at: park.changed_at(),
                    bucket: bucket.to_string(),
                };
                if let Err(e) = store.change(&park.endpoint, &by, &told, &scheduler).await {
                    tracing::warn!(endpoint = %park.endpoint, %bucket, error = %e, "recording that a bucket was told of a park failed");
                }
            }
        }
    }
}

/// The event telling `bucket` of the park's last change, and its id: the same for every
/// Director and every try (a ULID of the change's time and a hash of what it tells), so a
/// subscriber that gets it twice can tell.
pub fn event_of(park: &Park, bucket: &str) -> (spindle_client::NewEvent, Ulid) {
    let kind = if park.is_parked() { PARKED } else { UNPARKED };
    let at = park.changed_at();
    let mut hash = Sha256::new();
    for part in [kind, &park.endpoint, bucket] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut random = [0u8; 16];
    random.copy_from_slice(&digest[..16]);
    let id = Ulid::from_parts(
        u64::try_from(at.timestamp_millis()).unwrap_or(0),
        u128::from_be_bytes(random),
    );
    let time = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
    let data = serde_json::json!({
        "endpoint": park.endpoint,
        "parked_at": time(park.parked_at),
        // A record is anyone's write to Consul: its free text is cut to fit any event.
        "reason": park.reason.chars().take(MAX_REASON_CHARS).collect::<String>(),
        "parked_by": park.parked_by,
        "unparked_at": park.unparked_at.map(time),
        "unparked_by": park.unparked_by,
    });
    let payload = serde_json::value::to_raw_value(&data)
        .unwrap_or_else(|_| serde_json::value::RawValue::from_string("{}".into()).expect("{}"));
    let event = spindle_client::NewEvent {
        bucket: bucket.to_owned(),
        event_type: kind.to_owned(),
        payload,
        idempotency_key: None,
        deliver_at: None,
        on_complete: None,
        traceparent: None,
        tracestate: None,
    };
    (event, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_id_is_the_same_for_every_try_and_differs_per_bucket_and_change() {
        let parked = parks::apply(
            None,
            "http://e/",
            &Change::Park { reason: "r".into() },
            "d",
            Utc::now(),
        )
        .unwrap();
        let (event, id) = event_of(&parked, "b");
        assert_eq!(event.event_type, PARKED);
        assert_eq!(event_of(&parked, "b").1, id);
        assert_ne!(event_of(&parked, "c").1, id);
        let unpark = Change::Unpark {
            redrive: Redrive::default(),
        };
        let unparked = parks::apply(Some(&parked), "http://e/", &unpark, "d", Utc::now()).unwrap();
        let (event, other) = event_of(&unparked, "b");
        assert_eq!(event.event_type, UNPARKED);
        assert_ne!(other, id);
        assert!(event.payload.get().contains("\"unparked_by\":\"d\""));
        let long = parks::Park {
            reason: "x".repeat(1 << 20),
            ..unparked
        };
        assert!(event_of(&long, "b").0.payload.get().len() < 2048);
    }
}
