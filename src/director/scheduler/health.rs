//! What the scheduler shows of its lanes: queue depth by class (running, breaker open,
//! paused, parked) and each endpoint's health for `GET /v1/endpoints`. Read-only over the
//! queues and the gates, published at most once a second.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::director::breaker::Breaker;
use crate::rpc::api::EndpointHealth;

use super::cache::Cache;
use super::gates::Gates;
use super::queues::Queues;
use super::Scheduler;

/// Ready jobs by what holds their lane: (running, breaker open, paused, parked).
pub(super) fn depths(queues: &Queues, gates: &Gates) -> (usize, usize, usize, usize) {
    let (mut running, mut open, mut paused, mut parked) = (0, 0, 0, 0);
    for (key, lane) in queues.lanes() {
        if gates.concurrency(key) == 0 {
            paused += lane.ready();
        } else if gates.parked(key).is_some() {
            parked += lane.ready();
        } else if gates.is_open(key) {
            open += lane.ready();
        } else {
            running += lane.ready();
        }
    }
    (running, open, paused, parked)
}

/// Every known endpoint's health (lanes with work, and breakers that remember outcomes), by
/// endpoint.
pub(super) fn endpoints(queues: &Queues, gates: &Gates, cache: &Cache) -> Vec<EndpointHealth> {
    let keys: HashSet<&Arc<str>> = queues
        .lanes()
        .map(|(key, _)| key)
        .chain(gates.breaker_keys())
        .collect();
    let mut health: Vec<EndpointHealth> = keys
        .into_iter()
        .map(|key| {
            let lane = queues.lane(key);
            let breaker = gates.breaker(key);
            let (recent_attempts, recent_failures) = breaker.map_or((0, 0), Breaker::recent);
            let control = gates.control(key);
            let park = gates.parked(key);
            let ready = lane.map_or(0, |l| l.ready());
            let oldest_created_at = lane.and_then(|l| {
                l.heads()
                    .filter_map(|id| cache.get(&id).map(|e| e.job.created_at))
                    .min()
            });
            EndpointHealth {
                endpoint: key.to_string(),
                ready: lane.map_or(0, |l| l.ready()),
                in_flight: lane.map_or(0, |l| l.in_flight()),
                breaker: if breaker.is_some_and(Breaker::is_open) {
                    "open"
                } else {
                    "closed"
                }
                .to_owned(),
                recent_attempts,
                recent_failures,
                paused: control.is_some_and(|c| c.paused),
                concurrency: gates.concurrency(key),
                max_per_second: control.and_then(|c| c.max_per_second),
                parked_since: park.map(|p| p.parked_at),
                park_reason: park.map(|p| p.reason.clone()),
                oldest_created_at,
                redrive_per_second: gates.redrive_pace(key),
                redrive_eta_secs: gates.redrive_eta(key, ready).map(|d| d.as_secs_f64()),
            }
        })
        .collect();
    health.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    health
}

impl Scheduler {
    /// Queue depth by endpoint class, at most once a second (it walks the lanes, not the jobs).
    pub(super) fn update_gauges(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.gauges_at) < Duration::from_secs(1) {
            self.gauges_stale = true;
            return;
        }
        self.gauges_at = now;
        self.gauges_stale = false;
        self.review_parks();
        let (running, open, paused, endpoint_parked) = depths(&self.queues, &self.gates);
        let aside = self.gates.aside_count();
        let waiting = self
            .cache
            .len()
            .saturating_sub(running + open + paused + endpoint_parked + aside + self.in_flight);
        if let Ok(mut published) = self.health.lock() {
            *published = endpoints(&self.queues, &self.gates, &self.cache);
        }
        for (class, n) in [
            ("running", running),
            ("breaker_open", open),
            ("paused", paused),
            ("endpoint_parked", endpoint_parked),
            ("bucket_paused", aside),
            ("waiting", waiting),
        ] {
            self.metrics
                .queued
                .get_or_create(&crate::metrics::QueueLabels { class })
                .set(n as i64);
        }
    }
}
