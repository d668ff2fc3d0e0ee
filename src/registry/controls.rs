//! Endpoint and bucket controls in Consul KV, shared by every Director: pause and resume an
//! endpoint or a bucket, cap an endpoint's concurrency and request rate, set how long a
//! bucket's endpoints may fail before they are parked, and the parks themselves
//! ([`super::parks`]). Operators set them with `spindle endpoints ...`; each Director watches
//! the prefix with a blocking query and applies a change within a second or two.
//!
//! Keys: `spindle/controls/endpoints/<endpoint as base64url>` and
//! `spindle/controls/buckets/<bucket as base64url>` (encoded because endpoints are URLs and
//! buckets are free text); the value is JSON that repeats the name in clear.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::consul::{ConsulClient, Put, ReadOptions};
use super::parks::{self, Park};
use super::RegistryError;

const PREFIX: &str = "spindle/controls/";
const ENDPOINTS: &str = "spindle/controls/endpoints/";
const BUCKETS: &str = "spindle/controls/buckets/";

/// What operators set for one endpoint (its URL without query, as Directors group it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointControl {
    /// The endpoint (scheme, host, port and path; no query).
    pub endpoint: String,
    /// No new attempts while set; jobs wait in their queue.
    #[serde(default)]
    pub paused: bool,
    /// Most requests in flight per Director (below `--endpoint-concurrency`).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Most requests started per second per Director.
    #[serde(default)]
    pub max_per_second: Option<f64>,
    /// Who set it.
    #[serde(default)]
    pub updated_by: String,
    /// When.
    pub updated_at: DateTime<Utc>,
}

impl EndpointControl {
    /// No control yet on `endpoint`: running, no caps, set by `by` now.
    pub fn unset(endpoint: &str, by: &str) -> Self {
        EndpointControl {
            endpoint: endpoint.to_owned(),
            paused: false,
            max_concurrency: None,
            max_per_second: None,
            updated_by: by.to_owned(),
            updated_at: Utc::now(),
        }
    }
}

/// What operators set for one bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketControl {
    /// The bucket.
    pub bucket: String,
    /// No new attempts for its jobs while set.
    #[serde(default)]
    pub paused: bool,
    /// How long an endpoint with jobs of this bucket may fail (breaker open, no success)
    /// before it is parked, in seconds, instead of the Directors' `--park-after-secs`; 0:
    /// never parked for this bucket's sake.
    #[serde(default)]
    pub park_after_secs: Option<u64>,
    /// Who set it.
    #[serde(default)]
    pub updated_by: String,
    /// When.
    pub updated_at: DateTime<Utc>,
}

/// Every control in force, by endpoint and by bucket.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Controls {
    /// By endpoint.
    pub endpoints: HashMap<String, EndpointControl>,
    /// By bucket.
    pub buckets: HashMap<String, BucketControl>,
    /// Parked endpoints (and those unparked whose re-drive may still be paced), by endpoint.
    pub parks: HashMap<String, Park>,
}

impl Controls {
    /// Whether the bucket is paused.
    pub fn bucket_paused(&self, bucket: &str) -> bool {
        self.buckets.get(bucket).is_some_and(|c| c.paused)
    }

    /// The bucket's own park policy, if it sets one (0: never).
    pub fn park_after_secs(&self, bucket: &str) -> Option<u64> {
        self.buckets.get(bucket).and_then(|c| c.park_after_secs)
    }

    /// The endpoint's park, if it is parked now.
    pub fn parked(&self, endpoint: &str) -> Option<&Park> {
        self.parks.get(endpoint).filter(|p| p.is_parked())
    }
}

fn key_part(name: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(name)
}

/// Sets (or replaces) an endpoint's controls.
pub async fn set_endpoint(
    client: &ConsulClient,
    control: &EndpointControl,
) -> Result<(), RegistryError> {
    let value = serde_json::to_vec(control).map_err(|e| RegistryError::Decode(e.to_string()))?;
    let key = format!("{ENDPOINTS}{}", key_part(&control.endpoint));
    client.kv_put(&key, &value, Put::Set).await?;
    Ok(())
}

/// Sets (or replaces) a bucket's controls.
pub async fn set_bucket(
    client: &ConsulClient,
    control: &BucketControl,
) -> Result<(), RegistryError> {
    let value = serde_json::to_vec(control).map_err(|e| RegistryError::Decode(e.to_string()))?;
    let key = format!("{BUCKETS}{}", key_part(&control.bucket));
    client.kv_put(&key, &value, Put::Set).await?;
    Ok(())
}

/// Changes an endpoint's controls with `change` (starting from none if it has none), stamps
/// them with `by` and now, and stores them, or removes them when nothing is left in force.
pub async fn update_endpoint(
    client: &ConsulClient,
    endpoint: &str,
    by: &str,
    change: impl FnOnce(&mut EndpointControl),
) -> Result<EndpointControl, RegistryError> {
    let (controls, _) = read(client, 0, Duration::from_secs(1)).await?;
    let mut control = controls
        .endpoints
        .get(endpoint)
        .cloned()
        .unwrap_or_else(|| EndpointControl::unset(endpoint, by));
    change(&mut control);
    control.updated_by = by.to_owned();
    control.updated_at = Utc::now();
    if control.paused || control.max_concurrency.is_some() || control.max_per_second.is_some() {
        set_endpoint(client, &control).await?;
    } else {
        clear_endpoint(client, endpoint).await?;
    }
    Ok(control)
}

/// Changes a bucket's controls with `change` (starting from none if it has none), stamps them
/// with `by` and now, and stores them, or removes them when nothing is left in force.
pub async fn update_bucket(
    client: &ConsulClient,
    bucket: &str,
    by: &str,
    change: impl FnOnce(&mut BucketControl),
) -> Result<BucketControl, RegistryError> {
    let (controls, _) = read(client, 0, Duration::from_secs(1)).await?;
    let mut control = controls
        .buckets
        .get(bucket)
        .cloned()
        .unwrap_or_else(|| BucketControl {
            bucket: bucket.to_owned(),
            paused: false,
            park_after_secs: None,
            updated_by: by.to_owned(),
            updated_at: Utc::now(),
        });
    change(&mut control);
    control.updated_by = by.to_owned();
    control.updated_at = Utc::now();
    if control.paused || control.park_after_secs.is_some() {
        set_bucket(client, &control).await?;
    } else {
        clear_bucket(client, bucket).await?;
    }
    Ok(control)
}

/// Removes an endpoint's controls (back to the defaults).
pub async fn clear_endpoint(client: &ConsulClient, endpoint: &str) -> Result<(), RegistryError> {
    client
        .kv_delete(&format!("{ENDPOINTS}{}", key_part(endpoint)), None)
        .await?;
    Ok(())
}

/// Removes a bucket's controls.
pub async fn clear_bucket(client: &ConsulClient, bucket: &str) -> Result<(), RegistryError> {
    client
        .kv_delete(&format!("{BUCKETS}{}", key_part(bucket)), None)
        .await?;
    Ok(())
}

/// The current controls, and the index to block on for the next change (`index` 0: at once;
/// otherwise waits up to `wait` for a change past `index`). An entry that does not decode is
/// skipped with a warning rather than failing every control.
pub async fn read(
    client: &ConsulClient,
    index: u64,
    wait: Duration,
) -> Result<(Controls, u64), RegistryError> {
    let listed = client
        .kv_list(
            PREFIX,
            ReadOptions {
                index,
                wait: Some(wait),
                consistent: false,
            },
        )
        .await?;
    let mut controls = Controls::default();
    for entry in listed.value {
        if entry.key.starts_with(ENDPOINTS) {
            match serde_json::from_slice::<EndpointControl>(&entry.value) {
                Ok(c) => {
                    controls.endpoints.insert(c.endpoint.clone(), c);
                }
                Err(e) => {
                    tracing::warn!(key = %entry.key, error = %e, "ignoring a control that does not decode")
                }
            }
        } else if entry.key.starts_with(parks::PARKS) {
            if let Some(park) = parks::decode(&entry.key, &entry.value) {
                controls.parks.insert(park.endpoint.clone(), park);
            }
        } else if entry.key.starts_with(BUCKETS) {
            match serde_json::from_slice::<BucketControl>(&entry.value) {
                Ok(c) => {
                    controls.buckets.insert(c.bucket.clone(), c);
                }
                Err(e) => {
                    tracing::warn!(key = %entry.key, error = %e, "ignoring a control that does not decode")
                }
            }
        }
    }
    Ok((controls, listed.index))
}
