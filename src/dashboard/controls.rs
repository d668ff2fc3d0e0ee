//! The dashboard's endpoint controls: the same Consul records `spindle endpoints` writes
//! (pause and resume an endpoint or a bucket, cap an endpoint), read and written over the
//! dashboard's API; enabling and disabling subscriptions (the control database, as `spindle
//! subscriptions enable|disable` does); and its token check.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::{AppState, QueryError};
use crate::registry::controls::{self, BucketControl, EndpointControl};
use crate::rpc::auth::Scope;

/// `GET /api/controls` answer.
#[derive(Debug, Serialize)]
pub struct ControlsView {
    /// Whether controls can be set here (the dashboard runs with `--registry consul`).
    pub available: bool,
    /// Endpoint controls in force, by endpoint.
    pub endpoints: Vec<EndpointControl>,
    /// Bucket controls in force, by bucket.
    pub buckets: Vec<BucketControl>,
    /// Parked endpoints, and those unparked whose record is kept (their re-drive's pace), by
    /// endpoint.
    #[serde(default)]
    pub parks: Vec<crate::registry::parks::Park>,
}

/// `POST /api/controls` body: one change.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlChange {
    /// `pause`, `resume` or `limit` (limit: endpoints only).
    pub action: String,
    /// The endpoint URL (query ignored).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The bucket.
    #[serde(default)]
    pub bucket: Option<String>,
    /// For `limit`: most requests in flight per Director (absent: no cap).
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// For `limit`: most requests started per second per Director (absent: no cap).
    #[serde(default)]
    pub per_second: Option<f64>,
}

/// Who is calling the API (a token's name, or `dashboard` without tokens), as checked by the
/// API's middleware.
#[derive(Clone, Debug)]
pub(super) struct ApiCaller(pub(super) String);

/// Lets the request through when the dashboard has no tokens, or its bearer token is an
/// admin token (the dashboard shows every bucket and changes controls).
pub(super) fn check_admin(state: &AppState, headers: &HeaderMap) -> Result<String, QueryError> {
    let caller = crate::rpc::caller_of(state.auth.as_deref(), headers)
        .map_err(|_| QueryError::Unauthenticated)?;
    match caller {
        None => Ok("dashboard".to_owned()),
        Some(c) if matches!(c.scope, Scope::Admin) => Ok(c.name),
        Some(c) => Err(QueryError::Forbidden(format!(
            "token {:?} is not an admin token",
            c.name
        ))),
    }
}

/// `GET /api/controls`.
pub(super) async fn get_controls(
    State(state): State<AppState>,
) -> Result<Json<ControlsView>, QueryError> {
    let Some(consul) = &state.consul else {
        return Ok(Json(ControlsView {
            available: false,
            endpoints: Vec::new(),
            buckets: Vec::new(),
            parks: Vec::new(),
        }));
    };
    let (read, _) = controls::read(consul, 0, std::time::Duration::from_secs(1))
        .await
        .map_err(|e| QueryError::Unavailable(format!("reading controls from consul: {e}")))?;
    let mut endpoints: Vec<_> = read.endpoints.into_values().collect();
    endpoints.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    let mut buckets: Vec<_> = read.buckets.into_values().collect();
    buckets.sort_by(|a, b| a.bucket.cmp(&b.bucket));
    let mut parks: Vec<_> = read.parks.into_values().collect();
    parks.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    Ok(Json(ControlsView {
        available: true,
        endpoints,
        buckets,
        parks,
    }))
}

/// `POST /api/controls`: applies one change, recorded as made by the token's name.
pub(super) async fn post_controls(
    State(state): State<AppState>,
    Extension(ApiCaller(caller)): Extension<ApiCaller>,
    body: Result<Json<ControlChange>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<ControlsView>, QueryError> {
    let by = format!("{caller} (dashboard)");
    let Json(change) = body.map_err(|e| QueryError::BadParameter {
        field: "body",
        message: e.body_text(),
    })?;
    let Some(consul) = &state.consul else {
        return Err(QueryError::Unavailable(
            "endpoint controls need the dashboard to run with --registry consul".into(),
        ));
    };
    let failed = |e: crate::registry::RegistryError| {
        QueryError::Unavailable(format!("writing controls to consul: {e}"))
    };
    let endpoint = change
        .endpoint
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(crate::job::lane);
    if let Some(e) = endpoint {
        if !(e.starts_with("http://") || e.starts_with("https://")) || e.len() > 2048 {
            return Err(QueryError::BadParameter {
                field: "endpoint",
                message: format!(
                    "endpoint must be an http(s) URL of at most 2048 bytes, not {e:?}"
                ),
            });
        }
    }
    let bucket = change
        .bucket
        .as_deref()
        .map(str::trim)
        .filter(|b| !b.is_empty());
    match (change.action.as_str(), endpoint, bucket) {
        ("pause" | "resume", Some(endpoint), None) => {
            let paused = change.action == "pause";
            controls::update_endpoint(consul, endpoint, &by, |c| c.paused = paused)
                .await
                .map_err(failed)?;
        }
        ("pause" | "resume", None, Some(bucket)) => {
            let paused = change.action == "pause";
            controls::update_bucket(consul, bucket, &by, |c| c.paused = paused)
                .await
                .map_err(failed)?;
        }
        ("limit", Some(endpoint), None) => {
            if change.concurrency == Some(0) {
                return Err(QueryError::BadParameter {
                    field: "concurrency",
                    message: "concurrency must be at least 1 (pause to stop)".into(),
                });
            }
            if change
                .per_second
                .is_some_and(|r| !(r.is_finite() && r > 0.0))
            {
                return Err(QueryError::BadParameter {
                    field: "per_second",
                    message: "per_second must be a positive number".into(),
                });
            }
            controls::update_endpoint(consul, endpoint, &by, |c| {
                c.max_concurrency = change.concurrency;
                c.max_per_second = change.per_second;
            })
            .await
            .map_err(failed)?;
        }
        ("park" | "unpark", Some(endpoint), None) => {
            use crate::registry::parks::{self, Change, Redrive};
            let change = match change.action.as_str() {
                "park" => Change::Park {
                    reason: "parked from the dashboard".into(),
                },
                _ => Change::Unpark {
                    redrive: Redrive::default(),
                },
            };
            parks::update(consul, endpoint, &by, &change)
                .await
                .map_err(failed)?;
        }
        ("park" | "unpark", _, _) => {
            return Err(QueryError::BadParameter {
                field: "endpoint",
                message: "park and unpark apply to an endpoint: give it, and no bucket".into(),
            })
        }
        ("pause" | "resume" | "limit", None, None)
        | ("pause" | "resume" | "limit", Some(_), Some(_)) => {
            return Err(QueryError::BadParameter {
                field: "endpoint",
                message: "give exactly one of endpoint and bucket".into(),
            })
        }
        ("limit", None, Some(_)) => {
            return Err(QueryError::BadParameter {
                field: "endpoint",
                message: "limit applies to an endpoint, not a bucket".into(),
            })
        }
        (other, _, _) => {
            return Err(QueryError::BadParameter {
                field: "action",
                message: format!(
                    "action must be pause, resume, limit, park or unpark, not {other:?}"
                ),
            })
        }
    }
    get_controls(State(state)).await
}

/// `POST /api/subscriptions` body: enable or disable one subscription.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionChange {
    /// The subscription's id.
    pub id: String,
    /// Whether it receives events (disabled: its jobs wait).
    pub enabled: bool,
}

/// `POST /api/subscriptions`: enables or disables a subscription; answers the panel again.
pub(super) async fn post_subscription(
    State(state): State<AppState>,
    Extension(ApiCaller(caller)): Extension<ApiCaller>,
    body: Result<Json<SubscriptionChange>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<super::views::SubscriptionsView>, QueryError> {
    let Json(change) = body.map_err(|e| QueryError::BadParameter {
        field: "body",
        message: e.body_text(),
    })?;
    let Some(cache) = state.subscriptions.clone() else {
        return Err(QueryError::Unavailable(
            "subscriptions need the dashboard to run with --control-db".into(),
        ));
    };
    let id: ulid::Ulid = change.id.parse().map_err(|_| QueryError::BadParameter {
        field: "id",
        message: format!("id must be a subscription id (a ULID), not {:?}", change.id),
    })?;
    match cache.set_enabled(id, change.enabled).await {
        Ok(crate::events::Edited::Done(_)) => {
            tracing::info!(subscription = %id, enabled = change.enabled, by = %caller, "subscription changed from the dashboard");
        }
        Ok(crate::events::Edited::Missing | crate::events::Edited::Stale { .. }) => {
            return Err(QueryError::NotFound(format!("no subscription {id}")))
        }
        Err(e) => {
            return Err(QueryError::Unavailable(format!(
                "writing the control database: {e}"
            )))
        }
    }
    Ok(super::subscriptions(State(state)).await)
}
