//! Parked endpoints in Consul KV, shared by every Director: an endpoint that failed for longer
//! than its policy allows is *parked* (its jobs wait, nothing is discarded, one probe now and
//! then), and *unparked* by a probe's success or an operator; its jobs then go at a paced rate
//! that doubles until it is unpaced.
//!
//! One record per endpoint, `spindle/controls/parks/<endpoint as base64url>`, under the
//! controls' prefix so a Director's controls watch sees it. The record outlives the unpark
//! (the re-drive is paced from its `unparked_at`) and keeps which buckets were told of its
//! last change, so that a bucket is told once even across Directors and restarts. Every
//! change is a check-and-set on the record's `ModifyIndex`: two Directors that both see an
//! endpoint fail park it once.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::consul::{ConsulClient, Put, ReadOptions};
use super::RegistryError;

/// The key prefix of park records.
pub(super) const PARKS: &str = "spindle/controls/parks/";

/// Most tries of a check-and-set that keeps losing to other writers.
const CAS_TRIES: usize = 8;

/// One endpoint's park: in force while `unparked_at` is `None`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Park {
    /// The endpoint (scheme, host, port and path; no query).
    pub endpoint: String,
    /// When it was parked.
    pub parked_at: DateTime<Utc>,
    /// Why (a policy's words, or the operator's).
    #[serde(default)]
    pub reason: String,
    /// Who parked it (a Director's holder name, or an operator).
    #[serde(default)]
    pub parked_by: String,
    /// When it was unparked: its jobs go again, paced from this instant.
    #[serde(default)]
    pub unparked_at: Option<DateTime<Utc>>,
    /// Who unparked it (a Director whose probe succeeded, or an operator).
    #[serde(default)]
    pub unparked_by: Option<String>,
    /// Buckets told of the last change (parked, or unparked once `unparked_at` is set).
    #[serde(default)]
    pub announced: BTreeSet<String>,
    /// The pace of the re-drive the unpark asked for (none: each Director's own).
    #[serde(default)]
    pub redrive: Option<Redrive>,
}

impl Park {
    /// Whether the park is in force.
    pub fn is_parked(&self) -> bool {
        self.unparked_at.is_none()
    }

    /// When the last change (park or unpark) happened.
    pub fn changed_at(&self) -> DateTime<Utc> {
        self.unparked_at.unwrap_or(self.parked_at)
    }
}

/// The pace of an unparked endpoint's jobs, per Director: `start` requests per second,
/// doubled every `double_every`, until the pace reaches `until` (then the endpoint's own
/// limits alone apply).
///
/// The unpark records the pace it asks for, so every Director paces the endpoint alike and
/// the dashboard can tell when its jobs will have gone.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Redrive {
    /// Requests per second just after the unpark.
    pub start: f64,
    /// How often the pace doubles (whole seconds on the wire: `double_every_secs`).
    #[serde(rename = "double_every_secs", with = "whole_secs")]
    pub double_every: Duration,
    /// The pace at which pacing ends.
    pub until: f64,
}

/// A duration as whole seconds.
mod whole_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

impl Redrive {
    /// The default pace: 10 jobs a second, doubled every 30 s up to 10,000.
    pub const DEFAULT: Redrive = Redrive {
        start: 10.0,
        double_every: Duration::from_secs(30),
        until: 10_000.0,
    };
}

impl Default for Redrive {
    fn default() -> Self {
        Redrive::DEFAULT
    }
}

impl Redrive {
    /// The pace `since` after an unpark (`None`: no longer paced). It doubles in steps, so a
    /// rate limiter built for one step serves the whole step.
    pub fn per_second(&self, since: Duration) -> Option<f64> {
        if !(self.start.is_finite() && self.start > 0.0) {
            return None;
        }
        let step = self.double_every.as_secs_f64();
        let doublings = if step > 0.0 {
            (since.as_secs_f64() / step).floor().min(64.0)
        } else {
            64.0
        };
        let pace = self.start * doublings.exp2();
        (pace < self.until).then_some(pace)
    }

    /// How long `jobs` take to go at this pace from `since` after the unpark, if the endpoint
    /// keeps up (the doubling taken as smooth: `start·2^(t/step)` integrated).
    pub fn eta(&self, since: Duration, jobs: usize) -> Option<Duration> {
        let step = self.double_every.as_secs_f64();
        if !(self.start.is_finite() && self.start > 0.0 && step > 0.0) {
            return None;
        }
        let t = since.as_secs_f64() / step;
        let grown = t.exp2() + jobs as f64 * std::f64::consts::LN_2 / (self.start * step);
        Duration::try_from_secs_f64((grown.log2() - t) * step).ok()
    }
}

/// A change to an endpoint's park.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Park it (nothing if it is parked already).
    Park {
        /// Why.
        reason: String,
    },
    /// Unpark it (nothing if it is not parked); its jobs go again at this pace.
    Unpark {
        /// The re-drive's pace.
        redrive: Redrive,
    },
    /// `bucket` was told of the change made at `at` (nothing if the record has changed since).
    Announced {
        /// The change told of.
        at: DateTime<Utc>,
        /// The bucket told.
        bucket: String,
    },
}

/// The record after `change` by `by` at `now`, or `None` when the change changes nothing.
pub fn apply(
    current: Option<&Park>,
    endpoint: &str,
    change: &Change,
    by: &str,
    now: DateTime<Utc>,
) -> Option<Park> {
    match change {
        Change::Park { reason } => match current {
            Some(park) if park.is_parked() => None,
            _ => Some(Park {
                endpoint: endpoint.to_owned(),
                parked_at: now,
                reason: reason.clone(),
                parked_by: by.to_owned(),
                unparked_at: None,
                unparked_by: None,
                announced: BTreeSet::new(),
                redrive: None,
            }),
        },
        Change::Unpark { redrive } => {
            let park = current.filter(|p| p.is_parked())?;
            Some(Park {
                unparked_at: Some(now.max(park.parked_at)),
                unparked_by: Some(by.to_owned()),
                announced: BTreeSet::new(),
                redrive: Some(*redrive),
                ..park.clone()
            })
        }
        Change::Announced { at, bucket } => {
            let park =
                current.filter(|p| p.changed_at() == *at && !p.announced.contains(bucket))?;
            let mut park = park.clone();
            park.announced.insert(bucket.clone());
            Some(park)
        }
    }
}

fn key_of(endpoint: &str) -> String {
    use base64::Engine;
    format!(
        "{PARKS}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(endpoint)
    )
}

/// Applies `change` to the endpoint's record with a check-and-set, trying again while other
/// writers win. Returns the record written, or `None` when the change changed nothing.
pub async fn update(
    client: &ConsulClient,
    endpoint: &str,
    by: &str,
    change: &Change,
) -> Result<Option<Park>, RegistryError> {
    let key = key_of(endpoint);
    for _ in 0..CAS_TRIES {
        let read = client.kv_get(&key, ReadOptions::default()).await?;
        let (current, index) = match &read.value {
            Some(entry) => (
                serde_json::from_slice::<Park>(&entry.value).ok(),
                entry.modify_index,
            ),
            None => (None, 0),
        };
        let Some(next) = apply(current.as_ref(), endpoint, change, by, Utc::now()) else {
            return Ok(None);
        };
        let value = serde_json::to_vec(&next).map_err(|e| RegistryError::Decode(e.to_string()))?;
        if client.kv_put(&key, &value, Put::Cas(index)).await? {
            return Ok(Some(next));
        }
    }
    Err(RegistryError::Decode(format!(
        "the park record of {endpoint} kept changing under {CAS_TRIES} check-and-sets"
    )))
}

/// Removes the endpoint's record (its park and its pacing).
pub async fn clear(client: &ConsulClient, endpoint: &str) -> Result<(), RegistryError> {
    client.kv_delete(&key_of(endpoint), None).await?;
    Ok(())
}

/// Decodes a park record read under [`PARKS`] (`None`, with a warning, when it does not).
pub(super) fn decode(key: &str, value: &[u8]) -> Option<Park> {
    match serde_json::from_slice::<Park>(value) {
        Ok(park) => Some(park),
        Err(e) => {
            tracing::warn!(%key, error = %e, "ignoring a park record that does not decode");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNPARK: Change = Change::Unpark {
        redrive: Redrive {
            start: 10.0,
            double_every: Duration::from_secs(30),
            until: 100.0,
        },
    };

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn a_park_is_made_once_unparked_once_and_told_once_per_bucket() {
        let park = Change::Park {
            reason: "failing".into(),
        };
        let parked = apply(None, "http://e/", &park, "d1", at(0)).unwrap();
        assert!(parked.is_parked());
        assert_eq!(apply(Some(&parked), "http://e/", &park, "d2", at(1)), None);
        let told = Change::Announced {
            at: at(0),
            bucket: "b".into(),
        };
        let parked = apply(Some(&parked), "http://e/", &told, "d2", at(1)).unwrap();
        assert_eq!(apply(Some(&parked), "http://e/", &told, "d1", at(2)), None);
        let unparked = apply(Some(&parked), "http://e/", &UNPARK, "op", at(5)).unwrap();
        assert!(!unparked.is_parked());
        assert!(
            unparked.announced.is_empty(),
            "the unpark is news to every bucket"
        );
        assert_eq!(unparked.changed_at(), at(5));
        assert_eq!(
            apply(Some(&unparked), "http://e/", &told, "d1", at(6)),
            None,
            "telling of the park after the unpark changes nothing"
        );
        assert_eq!(
            apply(Some(&unparked), "http://e/", &UNPARK, "d", at(6)),
            None
        );
        let again = apply(Some(&unparked), "http://e/", &park, "d1", at(9)).unwrap();
        assert!(again.is_parked());
        assert_eq!(again.parked_at, at(9));
    }

    #[test]
    fn the_redrive_doubles_in_steps_until_it_ends() {
        let r = Redrive {
            start: 10.0,
            double_every: Duration::from_secs(30),
            until: 100.0,
        };
        assert_eq!(r.per_second(Duration::ZERO), Some(10.0));
        assert_eq!(r.per_second(Duration::from_secs(29)), Some(10.0));
        assert_eq!(r.per_second(Duration::from_secs(30)), Some(20.0));
        assert_eq!(r.per_second(Duration::from_secs(95)), Some(80.0));
        assert_eq!(r.per_second(Duration::from_secs(120)), None);
        assert_eq!(r.per_second(Duration::from_secs(u64::MAX / 4)), None);
        let hostile = Redrive {
            start: f64::NAN,
            ..r
        };
        assert_eq!(hostile.per_second(Duration::ZERO), None);
    }

    #[test]
    fn the_eta_is_the_time_the_pace_takes_to_send_the_jobs() {
        let r = Redrive {
            start: 10.0,
            double_every: Duration::from_secs(30),
            until: 1e9,
        };
        // 30 s at 10·2^(t/30) sends 10·30/ln 2 = 432.8 jobs.
        let eta = r.eta(Duration::ZERO, 433).unwrap().as_secs_f64();
        assert!((eta - 30.0).abs() < 0.1, "{eta}");
        let later = r.eta(Duration::from_secs(60), 433).unwrap().as_secs_f64();
        assert!(later < 10.0, "the pace has grown: {later}");
        assert_eq!(r.eta(Duration::ZERO, 0), Some(Duration::ZERO));
    }

    #[test]
    fn a_record_keeps_its_pace_in_whole_seconds() {
        let parked = apply(
            None,
            "http://e/",
            &Change::Park { reason: "x".into() },
            "d",
            at(0),
        );
        let unparked = apply(parked.as_ref(), "http://e/", &UNPARK, "d", at(1)).unwrap();
        let json = serde_json::to_string(&unparked).unwrap();
        assert!(json.contains("\"double_every_secs\":30"), "{json}");
        assert_eq!(serde_json::from_str::<Park>(&json).unwrap(), unparked);
        let old = r#"{"endpoint":"http://e/","parked_at":"2027-01-15T08:00:00Z"}"#;
        assert!(serde_json::from_str::<Park>(old).unwrap().redrive.is_none());
    }

    #[test]
    fn an_unpark_never_predates_its_park() {
        let parked = apply(
            None,
            "http://e/",
            &Change::Park { reason: "x".into() },
            "d",
            at(10),
        )
        .unwrap();
        let unparked = apply(Some(&parked), "http://e/", &UNPARK, "d", at(3)).unwrap();
        assert_eq!(unparked.unparked_at, Some(at(10)));
    }
}
