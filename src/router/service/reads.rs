//! The router's reads: a job (and its attempts) from whichever Director's JobDB holds it, and
//! pages of jobs and events merged from every Director's page ([`listing::merge_pages`]).
//!
//! A listing asks every Director in the catalog for the same page and answers only when all
//! did: a page without one JobDB's jobs would look complete and not be, so a Director that
//! does not answer makes the listing a `503` to retry.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use ulid::Ulid;

use super::Shared;
use crate::rpc::api::{EventList, JobList};
use crate::rpc::error::ApiError;
use crate::rpc::listing::{self, Page};

/// A job's trace, from whichever Director's JobDB holds it.
pub(super) async fn get_job(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    from_holder(&shared, &headers, &id, "").await
}

/// A job's attempts, from whichever Director's JobDB holds it.
pub(super) async fn job_attempts(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    from_holder(&shared, &headers, &id, "/attempts").await
}

/// `GET /v1/jobs/{id}{suffix}` answered by the first Director whose JobDB has the job.
async fn from_holder(
    shared: &Shared,
    headers: &HeaderMap,
    id: &str,
    suffix: &str,
) -> Result<Response, ApiError> {
    crate::rpc::caller_of(shared.settings.auth.as_deref(), headers)?;
    let id = crate::rpc::parse_job_id(id)?;
    let directors = shared.directors.all();
    let lookups = directors.iter().map(|d| {
        let call = with_auth(
            shared.http.get(format!("{}/v1/jobs/{id}{suffix}", d.base)),
            headers,
        );
        async move {
            let response = call.send().await.ok()?;
            if response.status() == StatusCode::NOT_FOUND {
                return None;
            }
            let status = response.status();
            let body = response.bytes().await.ok()?;
            Some((status, body))
        }
    });
    if let Some((status, body)) = futures::future::join_all(lookups)
        .await
        .into_iter()
        .flatten()
        .next()
    {
        return Ok((status, [(header::CONTENT_TYPE, "application/json")], body).into_response());
    }
    Err(ApiError::NotFound(format!(
        "no job {id} in the jobdb of any healthy director"
    )))
}

fn with_auth(call: reqwest::RequestBuilder, headers: &HeaderMap) -> reqwest::RequestBuilder {
    match headers.get(header::AUTHORIZATION) {
        Some(auth) => call.header(header::AUTHORIZATION, auth.clone()),
        None => call,
    }
}

/// A page of jobs of every live JobDB.
pub(super) async fn list_jobs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<JobList>, ApiError> {
    let caller = crate::rpc::caller_of(shared.settings.auth.as_deref(), &headers)?;
    let query = listing::parse_job_query(query.as_deref())?;
    listing::check_lister(caller.as_ref(), query.filter.bucket.as_deref())?;
    let pairs = query.filter.query_pairs();
    let after = query.after.map(|a| a.to_string());
    let pages = pages_of(
        &shared,
        &headers,
        "/v1/jobs",
        pairs,
        after,
        query.limit,
        |p: JobList| (p.jobs, p.next_after),
    )
    .await?;
    Ok(Json(listing::merge_job_pages(
        pages,
        query.filter.order,
        query.limit,
    )))
}

/// A page of events of every live JobDB.
pub(super) async fn list_events(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<EventList>, ApiError> {
    let caller = crate::rpc::caller_of(shared.settings.auth.as_deref(), &headers)?;
    let query = listing::parse_event_query(query.as_deref())?;
    listing::check_lister(caller.as_ref(), query.filter.bucket.as_deref())?;
    let pairs = query.filter.query_pairs();
    let after = query.after.map(|a| a.to_string());
    let pages = pages_of(
        &shared,
        &headers,
        "/v1/events",
        pairs,
        after,
        query.limit,
        |p: EventList| (p.events, p.next_after),
    )
    .await?;
    let (events, next_after) = listing::merge_pages(
        pages,
        query.filter.order,
        query.limit,
        |e| e.event_id.parse().unwrap_or_default(),
        |_, _| false,
    );
    Ok(Json(EventList {
        events,
        next_after: next_after.map(|id| id.to_string()),
    }))
}

/// Every Director's page of `path` with the filter `pairs`, the cursor and the limit, each
/// answer (`T`) split into its items and cursor.
async fn pages_of<T: DeserializeOwned, I>(
    shared: &Shared,
    headers: &HeaderMap,
    path: &str,
    mut pairs: Vec<(&'static str, String)>,
    after: Option<String>,
    limit: usize,
    split: impl Fn(T) -> (Vec<I>, Option<String>),
) -> Result<Vec<Page<I>>, ApiError> {
    if let Some(after) = after {
        pairs.push(("after", after));
    }
    pairs.push(("limit", limit.to_string()));
    ask_every_director(shared, headers, path, &pairs)
        .await?
        .into_iter()
        .map(|answer| {
            let (items, next) = split(answer);
            Ok(Page {
                items,
                next_after: ulid_of(next.as_deref())?,
            })
        })
        .collect()
}

fn ulid_of(text: Option<&str>) -> Result<Option<Ulid>, ApiError> {
    text.map(|t| {
        t.parse::<Ulid>().map_err(|_| {
            ApiError::Unavailable(format!(
                "a director answered a cursor that is not an id: {t:?}"
            ))
        })
    })
    .transpose()
}

/// `GET path?pairs` of every Director in the catalog, each answer read as `T`; any other answer
/// (the router checked the query and the token already) makes the listing a `503`.
async fn ask_every_director<T: DeserializeOwned>(
    shared: &Shared,
    headers: &HeaderMap,
    path: &str,
    pairs: &[(&'static str, String)],
) -> Result<Vec<T>, ApiError> {
    let directors = shared.directors.all();
    if directors.is_empty() {
        return Err(ApiError::Unavailable(
            "no healthy director in the catalog".into(),
        ));
    }
    let calls = directors.iter().map(|d| {
        let call = with_auth(
            shared.http.get(format!("{}{path}", d.base)).query(pairs),
            headers,
        );
        async move {
            let failed = |why: String| {
                ApiError::Unavailable(format!(
                    "director {} did not list its jobdb ({why}); a page without it would be \
                     incomplete",
                    d.id
                ))
            };
            let response = call.send().await.map_err(|e| failed(e.to_string()))?;
            let status = response.status();
            let body = response.bytes().await.map_err(|e| failed(e.to_string()))?;
            if !status.is_success() {
                let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
                return Err(failed(format!("status {status}: {text}")));
            }
            serde_json::from_slice::<T>(&body).map_err(|e| failed(e.to_string()))
        }
    });
    futures::future::join_all(calls).await.into_iter().collect()
}
