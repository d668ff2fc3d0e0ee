//! The scheduler's side of parking: it asks the park task ([`crate::director::parks`]) to
//! park a lane whose breaker has been open for its policy's time, to unpark a parked lane
//! whose probe succeeded, and to tell each bucket with jobs here of a park's last change.
//! The gates hold or pace the lane by the record that comes back with the controls.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::Scheduler;
use crate::director::parks::ParkRequest;

/// A request sent is sent again after this long if the record has not caught up by then (a
/// write that failed, a Consul that was away).
pub(super) const ASK_AGAIN: Duration = Duration::from_secs(30);

/// How often failing and parked lanes are looked at when nothing else wakes the scheduler.
pub(super) const REVIEW_EVERY: Duration = Duration::from_secs(5);

/// How long after an unpark a bucket whose jobs appear is still told of it.
const TELL_UNPARK_FOR: Duration = Duration::from_secs(3600);

/// What was asked, to ask it once per [`ASK_AGAIN`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Ask {
    /// Park the lane.
    Park(Arc<str>),
    /// Unpark the lane.
    Unpark(Arc<str>),
    /// Tell the bucket of the lane's change made at that time.
    Announce(Arc<str>, Arc<str>, DateTime<Utc>),
}

impl Scheduler {
    /// Sends `request` unless the same was asked within [`ASK_AGAIN`].
    fn ask(&mut self, ask: Ask, request: ParkRequest, now: Instant) {
        let Some(tx) = &self.parks_tx else { return };
        if self
            .asked
            .get(&ask)
            .is_some_and(|at| now.duration_since(*at) < ASK_AGAIN)
        {
            return;
        }
        if tx.send(request).is_ok() {
            self.asked.insert(ask, now);
        }
    }

    /// Whether some lane is failing or parked (or lately unparked), so parks need a look.
    pub(super) fn parks_to_review(&self) -> bool {
        self.parks_tx.is_some()
            && (self.gates.open_since().next().is_some() || self.gates.parks().next().is_some())
    }

    /// A probe of the parked lane succeeded: ask for the unpark.
    pub(super) fn probe_succeeded(&mut self, key: &Arc<str>) {
        if self.gates.parked(key).is_some() {
            let request = ParkRequest::Unpark {
                endpoint: key.clone(),
            };
            self.ask(Ask::Unpark(key.clone()), request, Instant::now());
        }
    }

    /// Parks the lanes failing for longer than their policy allows, and tells the buckets
    /// with jobs here of the parks they have not been told of (once a second, with the
    /// gauges: it walks the open breakers and the park records, both few).
    pub(super) fn review_parks(&mut self) {
        if self.parks_tx.is_none() {
            return;
        }
        let now = Instant::now();
        // A request the record already shows is done: the same may be asked again at once
        // (an endpoint unparked while still failing parks again after the policy's time).
        let gates = &self.gates;
        self.asked.retain(|ask, at| {
            now.duration_since(*at) < ASK_AGAIN
                && match ask {
                    Ask::Park(key) => gates.parked(key).is_none(),
                    Ask::Unpark(key) => gates.parked(key).is_some(),
                    Ask::Announce(..) => true,
                }
        });
        let mut asks = Vec::new();
        for (key, opened) in self.gates.open_since() {
            if self.gates.parked(key).is_some() {
                continue;
            }
            let Some(lane) = self.queues.lane(key) else {
                continue;
            };
            let Some(after) = self.gates.park_after(lane.buckets()) else {
                continue;
            };
            // An endpoint unparked while still failing (an operator's unpark) gets the
            // policy's whole time again from the unpark, not from when its breaker opened.
            let failing = match self.gates.unparked_since(key) {
                Some(ago) => now.duration_since(opened).min(ago),
                None => now.duration_since(opened),
            };
            if failing >= after {
                let reason = format!(
                    "every attempt failed for {} s with its circuit breaker open",
                    after.as_secs()
                );
                let request = ParkRequest::Park {
                    endpoint: key.clone(),
                    reason,
                };
                asks.push((Ask::Park(key.clone()), request));
            }
        }
        let wall = Utc::now();
        for park in self.gates.parks() {
            let recent = park.is_parked()
                || (wall - park.changed_at())
                    .to_std()
                    .is_ok_and(|d| d < TELL_UNPARK_FOR);
            if !recent {
                continue;
            }
            let Some((key, lane)) = self.queues.lane_entry(&park.endpoint) else {
                continue;
            };
            for bucket in lane.buckets() {
                if park.announced.contains(&**bucket) {
                    continue;
                }
                let ask = Ask::Announce(key.clone(), bucket.clone(), park.changed_at());
                let request = ParkRequest::Announce {
                    park: park.clone(),
                    bucket: bucket.clone(),
                };
                asks.push((ask, request));
            }
        }
        for (ask, request) in asks {
            self.ask(ask, request, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::gates::{Gates, Limit};
    use crate::director::breaker::BreakerConfig;
    use crate::director::parks::ParkPolicy;
    use crate::registry::controls::Controls;

    /// Controls holding one park record.
    fn parked_as(park: crate::registry::parks::Park) -> Arc<Controls> {
        let mut controls = Controls::default();
        controls.parks.insert(park.endpoint.clone(), park);
        Arc::new(controls)
    }

    #[test]
    fn a_parked_lane_sends_one_probe_per_interval_and_paces_once_unparked() {
        use crate::registry::parks::{apply, Change, Redrive};
        let policy = ParkPolicy {
            probe_every: Duration::from_secs(60),
            ..ParkPolicy::default()
        };
        let mut gates = Gates::new(8, BreakerConfig::default(), policy);
        let key: Arc<str> = "http://a/".into();
        let now = Instant::now();
        let reason = Change::Park { reason: "r".into() };
        let parked = apply(None, &key, &reason, "d", chrono::Utc::now()).unwrap();
        gates.set_controls(parked_as(parked.clone()));
        // A Director that never saw the endpoint fail probes at once, then waits.
        assert!(gates.holds_back(&key));
        assert_eq!(gates.limit(&key, now), Limit::Probe);
        assert!(
            gates.starting(&key),
            "the attempt of a parked lane is its probe"
        );
        assert!(
            matches!(gates.limit(&key, now), Limit::Wait(Some(at)) if at >= now + Duration::from_secs(59))
        );
        gates.probe_abandoned(&key);
        assert_eq!(
            gates.limit(&key, now),
            Limit::Probe,
            "an abandoned probe is not waited for"
        );
        // A probe's success does not lift the park by itself: the record does.
        gates.starting(&key);
        gates.record(&key, true, None, now);
        assert!(matches!(gates.limit(&key, now), Limit::Wait(Some(_))));
        assert_eq!(gates.redrive_pace(&key), None);
        let redrive = Redrive {
            start: 5.0,
            double_every: Duration::from_secs(3600),
            until: 100.0,
        };
        let unpark = Change::Unpark { redrive };
        let unparked = apply(Some(&parked), &key, &unpark, "d", chrono::Utc::now()).unwrap();
        gates.set_controls(parked_as(unparked));
        assert!(!gates.holds_back(&key));
        assert_eq!(gates.per_second(&key), Some(5.0));
        assert!(gates.is_rate_limited(&key));
        for _ in 0..5 {
            assert_eq!(
                gates.take_token(&key, now),
                Ok(()),
                "a burst of one second's worth"
            );
        }
        assert!(gates.take_token(&key, now).is_err(), "then the pace");
        let eta = gates.redrive_eta(&key, 50).unwrap().as_secs_f64();
        assert!((9.0..11.0).contains(&eta), "50 jobs at 5/s: {eta}");
    }

    #[test]
    fn the_shortest_bucket_policy_parks_a_lane_and_never_means_never() {
        let mut controls = Controls::default();
        for (bucket, after) in [("quick", Some(60)), ("never", Some(0)), ("plain", None)] {
            controls.buckets.insert(
                bucket.into(),
                crate::registry::controls::BucketControl {
                    bucket: bucket.into(),
                    paused: false,
                    park_after_secs: after,
                    updated_by: "test".into(),
                    updated_at: chrono::Utc::now(),
                },
            );
        }
        let mut gates = Gates::new(8, BreakerConfig::default(), ParkPolicy::default());
        gates.set_controls(Arc::new(controls));
        let b = |names: &[&str]| {
            names
                .iter()
                .map(|n| Arc::<str>::from(*n))
                .collect::<Vec<_>>()
        };
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(gates.park_after(b(&["plain"]).iter()), hour);
        assert_eq!(
            gates.park_after(b(&["plain", "quick"]).iter()),
            Some(Duration::from_secs(60))
        );
        assert_eq!(gates.park_after(b(&["never"]).iter()), None);
        assert_eq!(gates.park_after(b(&["never", "plain"]).iter()), hour);
    }
}
