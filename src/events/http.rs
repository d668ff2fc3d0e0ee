//! The subscription API, served alike by Directors and routers: `GET`/`POST
//! /v1/subscriptions`, `GET`/`PATCH`/`DELETE /v1/subscriptions/{id}`. A token sees and manages
//! the subscriptions of the buckets it was given to manage (`manages` in the token file; an
//! admin token, all of them): using a bucket is not enough, since a subscription decides where
//! the bucket's events go and may carry credentials in its headers. A change is
//! committed to the control database and in this process's cache before the answer; other
//! processes see it within about a second. A `PATCH` changes only the fields it names, on the
//! subscription as it is in the control database, and with `If-Match` only if it is still at
//! the version the client read.

use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use spindle_client::api::MAX_SUBSCRIPTIONS_PER_PAGE;
use spindle_client::{NewSubscription, SubscriptionList, SubscriptionPatch, SubscriptionView};
use ulid::Ulid;

use super::subscription::{MAX_SUBSCRIPTIONS_PER_BUCKET, MAX_SUBSCRIPTION_BYTES};
use super::{EditError, Edited, StoreError, Subscription, Subscriptions};
use crate::delivery::guard::AddressPolicy;
use crate::rpc::api::{FieldError, IntakeLimits};
use crate::rpc::auth::{Caller, TokenStore};
use crate::rpc::error::ApiError;

/// What the subscription handlers share.
#[derive(Clone)]
pub struct SubscriptionApi {
    /// The cache (and through it the control database); `None` answers 503.
    pub subscriptions: Option<Arc<Subscriptions>>,
    /// Known API tokens; `None` leaves the API open.
    pub auth: Option<Arc<TokenStore>>,
    /// Intake limits: a subscription's jobs must pass them.
    pub limits: Arc<IntakeLimits>,
    /// The delivery address guard: a URL it blocks is refused.
    pub policy: Arc<AddressPolicy>,
}

/// The routes of the subscription API.
pub fn routes(api: SubscriptionApi) -> Router {
    let body_limit = body_limit(&api);
    Router::new()
        .route("/v1/subscriptions", get(list).post(add))
        .route(
            "/v1/subscriptions/{id}",
            get(show).patch(update).delete(remove),
        )
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(api)
}

impl SubscriptionApi {
    fn cache(&self) -> Result<&Arc<Subscriptions>, ApiError> {
        super::configured(&self.subscriptions)
    }

    fn caller(&self, headers: &HeaderMap) -> Result<Option<Caller>, ApiError> {
        crate::rpc::caller_of(self.auth.as_deref(), headers)
    }
}

/// Refuses (403) a caller that may not manage `bucket`'s subscriptions.
pub fn check_manager(caller: Option<&Caller>, bucket: &str) -> Result<(), ApiError> {
    match caller {
        Some(c) if !c.may_manage(bucket) => Err(ApiError::Forbidden {
            message: format!(
                "token {:?} may not manage subscriptions of bucket {bucket:?}; nothing was changed",
                c.name
            ),
            field: Some("bucket".to_owned()),
        }),
        _ => Ok(()),
    }
}

/// The subscription `id` names (404 if none) that `caller` may manage (else 403): what a
/// back-fill delivers to.
pub fn to_backfill(
    subscriptions: &Option<Arc<super::Subscriptions>>,
    id: &str,
    caller: Option<&Caller>,
) -> Result<Arc<super::Subscription>, ApiError> {
    let subscriptions = super::configured(subscriptions)?;
    let id: Ulid = id
        .parse()
        .map_err(|_| ApiError::NotFound(format!("no subscription {id:?}")))?;
    let subscription = subscriptions
        .index()
        .get(&id)
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no subscription {id}")))?;
    check_manager(caller, subscription.bucket())?;
    Ok(subscription)
}

fn parse_id(id: &str) -> Result<Ulid, ApiError> {
    id.parse::<Ulid>().map_err(|_| {
        ApiError::InvalidField(FieldError::new("id", "is not a subscription id (a ULID)"))
    })
}

/// A write the control database did not take: refused for good (4xx, naming the field), or
/// unavailable (503, retry).
fn refused(e: StoreError) -> ApiError {
    match e {
        StoreError::TooLarge(why) => ApiError::InvalidField(FieldError::too_large(
            "body",
            format!("was refused by the control database as too long ({why}); nothing was changed"),
        )),
        e @ StoreError::BucketFull { .. } => ApiError::InvalidField(FieldError::new(
            "bucket",
            format!("{e}; nothing was changed"),
        )),
        e => {
            tracing::warn!(error = %e, "control database write failed");
            ApiError::Unavailable("the control database is unavailable; nothing was changed".into())
        }
    }
}

/// A subscription's request body: at most [`MAX_SUBSCRIPTION_BYTES`] (and the API's limit).
fn body_of(body: Result<Bytes, BytesRejection>, api: &SubscriptionApi) -> Result<Bytes, ApiError> {
    crate::rpc::request_body_within(body, body_limit(api))
}

/// The body limit of the subscription routes.
fn body_limit(api: &SubscriptionApi) -> usize {
    api.limits.max_request_bytes.min(MAX_SUBSCRIPTION_BYTES)
}

/// The version an `If-Match` names (`"12"`, `W/"12"` or `12`); `*` names none.
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get(axum::http::header::IF_MATCH) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    if text == "*" {
        return Ok(None);
    }
    let tag = text.strip_prefix("W/").unwrap_or(text).trim_matches('"');
    tag.parse::<u64>().map(Some).map_err(|_| {
        ApiError::InvalidField(FieldError::new(
            "If-Match",
            "must name a subscription's version (its `version`, or the ETag of an answer)",
        ))
    })
}

/// A subscription with its version as the answer's `ETag`.
fn tagged(
    s: &Subscription,
) -> (
    [(axum::http::HeaderName, String); 1],
    Json<SubscriptionView>,
) {
    (
        [(axum::http::header::ETAG, format!("\"{}\"", s.version))],
        Json(s.view(false)),
    )
}

/// The subscription `id`, if the caller may see it (else 404, as if it did not exist).
fn visible(
    cache: &Subscriptions,
    caller: Option<&Caller>,
    id: &str,
) -> Result<Arc<Subscription>, ApiError> {
    let id = parse_id(id)?;
    cache
        .index()
        .get(&id)
        .filter(|s| caller.is_none_or(|c| c.may_manage(s.bucket())))
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no subscription {id}")))
}

/// `?bucket=&after=&limit=` of a listing.
#[derive(Debug, Default)]
struct ListQuery {
    bucket: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

impl ListQuery {
    /// Parsed by hand, so that a bad query is answered as every bad field is (422, naming
    /// it); other parameters are ignored.
    fn parse(query: Option<&str>) -> Result<ListQuery, FieldError> {
        let mut parsed = ListQuery::default();
        for (name, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let slot = match &*name {
                "bucket" => &mut parsed.bucket,
                "after" => &mut parsed.after,
                "limit" => &mut parsed.limit,
                _ => continue,
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(FieldError::new(
                    name.into_owned(),
                    "is given more than once",
                ));
            }
        }
        Ok(parsed)
    }
}

/// A page of listing when `?limit=` is not given.
const DEFAULT_PAGE: usize = 100;

async fn list(
    State(api): State<SubscriptionApi>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<SubscriptionList>, ApiError> {
    let caller = api.caller(&headers)?;
    let cache = api.cache()?;
    let query = ListQuery::parse(query.as_deref())?;
    let after = query
        .after
        .as_deref()
        .map(|a| a.parse::<Ulid>())
        .transpose()
        .map_err(|_| FieldError::new("after", "must be a subscription id (a ULID)"))?;
    let limit = match query.limit.as_deref() {
        None => DEFAULT_PAGE,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_SUBSCRIPTIONS_PER_PAGE).contains(n))
            .ok_or_else(|| {
                FieldError::new(
                    "limit",
                    format!("must be 1 to {MAX_SUBSCRIPTIONS_PER_PAGE}"),
                )
            })?,
    };
    let index = cache.index();
    let mut page: Vec<SubscriptionView> = index
        .after(after)
        .filter(|s| query.bucket.as_deref().is_none_or(|b| s.bucket() == b))
        .filter(|s| caller.as_ref().is_none_or(|c| c.may_manage(s.bucket())))
        .take(limit + 1)
        .map(|s| s.view(false))
        .collect();
    let next_after = (page.len() > limit).then(|| {
        page.truncate(limit);
        page.last().map(|s| s.id.clone()).unwrap_or_default()
    });
    Ok(Json(SubscriptionList {
        subscriptions: page,
        next_after,
    }))
}

async fn show(
    State(api): State<SubscriptionApi>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    let caller = api.caller(&headers)?;
    let s = visible(api.cache()?, caller.as_ref(), &id)?;
    Ok(tagged(&s))
}

async fn add(
    State(api): State<SubscriptionApi>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    let caller = api.caller(&headers)?;
    let cache = api.cache()?;
    let body = body_of(body, &api)?;
    let given: NewSubscription = crate::rpc::parse_json(&body)?;
    check_manager(caller.as_ref(), &given.bucket)?;
    let mut s = Subscription::check(Ulid::new(), given, &api.limits, &api.policy, Utc::now())?;
    // The answer carries the stored version, so an edit can name it in `If-Match`.
    s.version = cache
        .db()
        .insert(s.id, &s.spec, MAX_SUBSCRIPTIONS_PER_BUCKET)
        .await
        .map_err(refused)?;
    refresh(cache).await;
    tracing::info!(subscription = %s.id, bucket = s.bucket(), "subscription added");
    let etag = [(axum::http::header::ETAG, format!("\"{}\"", s.version))];
    Ok((StatusCode::CREATED, etag, Json(s.view(true))))
}

async fn update(
    State(api): State<SubscriptionApi>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    let caller = api.caller(&headers)?;
    let cache = api.cache()?;
    let expected = if_match(&headers)?;
    let body = body_of(body, &api)?;
    let patch: SubscriptionPatch = crate::rpc::parse_json(&body)?;
    // Told apart from a subscription it may not see only after this (a 412 would say it
    // exists).
    let id = visible(cache, caller.as_ref(), &id)?.id;
    let not_found = || ApiError::NotFound(format!("no subscription {id}"));
    let edited = cache
        .edit(id, expected, |current| {
            if caller
                .as_ref()
                .is_some_and(|c| !c.may_manage(current.bucket()))
            {
                return Err(not_found());
            }
            let mut given = current.spec.given.clone();
            if let Some(enabled) = patch.enabled {
                given.enabled = Some(enabled);
            }
            if let Some(url) = &patch.url {
                given.url = url.clone();
            }
            if let Some(types) = &patch.event_types {
                given.event_types = types.clone();
            }
            let mut s = Subscription::check(id, given, &api.limits, &api.policy, Utc::now())?;
            s.spec.created_at = current.spec.created_at;
            Ok(s)
        })
        .await;
    let s = match edited {
        Ok(Edited::Done(s)) => s,
        Ok(Edited::Missing) => return Err(not_found()),
        Ok(Edited::Stale { current }) => {
            return Err(ApiError::PreconditionFailed(format!(
                "subscription {id} is at version {current}, not the one If-Match names; \
                 nothing was changed: read it again"
            )))
        }
        Err(EditError::Refused(e)) => return Err(e),
        Err(EditError::Store(e)) => return Err(refused(e)),
        Err(e @ EditError::Unreadable(_)) => {
            return Err(ApiError::Conflict {
                message: format!("{e}; nothing was changed"),
                field: None,
            })
        }
        Err(e @ EditError::Contended) => {
            return Err(ApiError::Conflict {
                message: format!("{e}; nothing was changed: try again"),
                field: None,
            })
        }
    };
    tracing::info!(subscription = %s.id, enabled = s.enabled(), "subscription changed");
    Ok(tagged(&s))
}

async fn remove(
    State(api): State<SubscriptionApi>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let caller = api.caller(&headers)?;
    let cache = api.cache()?;
    let current = visible(cache, caller.as_ref(), &id)?;
    match cache
        .db()
        .remove(current.id, Utc::now())
        .await
        .map_err(refused)?
    {
        Some(_) => {}
        None => {
            return Err(ApiError::NotFound(format!(
                "no subscription {}",
                current.id
            )))
        }
    }
    refresh(cache).await;
    tracing::info!(subscription = %current.id, "subscription removed");
    Ok(Json(current.view(false)))
}

/// Reads the change just committed into this process's cache (the answer then shows what
/// publishing here will use); a failed read is caught up by the refresher.
async fn refresh(cache: &Subscriptions) {
    if let Err(e) = cache.refresh().await {
        tracing::warn!(error = %e, "reading subscriptions back failed; the refresher will");
    }
}
