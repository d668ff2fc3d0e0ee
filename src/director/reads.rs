//! The Director's read API over its JobDB: a job and its trace, a job's attempts, an event,
//! and pages of jobs and events (a router merges the pages of every Director into one).

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};

use super::http::RpcState;
use crate::job::{Job, Transition};
use crate::jobdb::JobDbError;
use crate::rpc::api::{self, AttemptList, EventList, JobList, JobView};
use crate::rpc::auth::Caller;
use crate::rpc::error::ApiError;
use crate::rpc::{listing, parse_job_id};

/// The read routes of a Director (merged with [`super::http::router`]'s).
pub fn routes(state: RpcState) -> Router {
    Router::new()
        .route("/v1/jobs", get(list_jobs))
        .route("/v1/events", get(list_events))
        .route("/v1/events/{id}", get(get_event))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/jobs/{id}/attempts", get(job_attempts))
        .with_state(state)
}

fn unavailable(e: JobDbError) -> ApiError {
    tracing::warn!(error = %e, "jobdb read failed");
    ApiError::Unavailable("the jobdb is unavailable".into())
}

/// Whether `caller` may read `what` (jobs, events) of `bucket`.
fn check_reader(caller: Option<&Caller>, bucket: &str, what: &str) -> Result<(), ApiError> {
    match caller {
        Some(caller) if !caller.may_use(bucket) => Err(ApiError::Forbidden {
            message: format!(
                "token {:?} may not read {what} of bucket {bucket:?}",
                caller.name
            ),
            field: None,
        }),
        _ => Ok(()),
    }
}

/// The job `id` and its history, if the caller may read it.
async fn job_and_history(
    state: &RpcState,
    headers: &HeaderMap,
    id: &str,
) -> Result<(Job, Vec<(u64, Transition)>), ApiError> {
    let caller = state.caller(headers)?;
    let id = parse_job_id(id)?;
    let job = state
        .db
        .get_jobs(&[id])
        .await
        .map_err(unavailable)?
        .pop()
        .ok_or_else(|| ApiError::NotFound(format!("no job {id} in this director's jobdb")))?;
    check_reader(caller.as_ref(), &job.bucket, "jobs")?;
    let trace = state.db.get_transitions(id).await.map_err(unavailable)?;
    Ok((job, trace))
}

/// A job with its current state and full transition trace.
async fn get_job(
    State(state): State<RpcState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let (job, trace) = job_and_history(&state, &headers, &id).await?;
    Ok(Json(api::job_view(&job, &trace)))
}

/// A job's attempts, first first.
async fn job_attempts(
    State(state): State<RpcState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<AttemptList>, ApiError> {
    let (job, trace) = job_and_history(&state, &headers, &id).await?;
    Ok(Json(AttemptList {
        job_id: job.id.to_string(),
        attempts: listing::attempts_of(&trace),
    }))
}

/// A page of this JobDB's jobs.
async fn list_jobs(
    State(state): State<RpcState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<JobList>, ApiError> {
    let caller = state.caller(&headers)?;
    let query = listing::parse_job_query(query.as_deref())?;
    listing::check_lister(caller.as_ref(), query.filter.bucket.as_deref())?;
    let page = state
        .db
        .list_jobs(&query.filter, query.after.map(|a| a.0), query.limit)
        .await
        .map_err(unavailable)?;
    Ok(Json(JobList {
        jobs: page
            .jobs
            .iter()
            .map(|(job, history)| api::describe(job, history))
            .collect(),
        next_after: page.next_after.map(|id| id.to_string()),
    }))
}

/// A page of this JobDB's events.
async fn list_events(
    State(state): State<RpcState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<EventList>, ApiError> {
    let caller = state.caller(&headers)?;
    let query = listing::parse_event_query(query.as_deref())?;
    listing::check_lister(caller.as_ref(), query.filter.bucket.as_deref())?;
    let page = state
        .db
        .list_events(&query.filter, query.after, query.limit)
        .await
        .map_err(unavailable)?;
    Ok(Json(EventList {
        events: page
            .events
            .iter()
            .map(crate::events::publish::event_view)
            .collect(),
        next_after: page.next_after.map(|id| id.to_string()),
    }))
}

/// An event and its jobs, as this Director's JobDB holds them.
async fn get_event(
    State(state): State<RpcState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<api::EventView>, ApiError> {
    let caller = state.caller(&headers)?;
    let id = parse_job_id(&id)?.0;
    let event = state
        .db
        .event(id)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| ApiError::NotFound(format!("no event {id} in this director's jobdb")))?;
    check_reader(caller.as_ref(), &event.bucket, "events")?;
    Ok(Json(crate::events::publish::event_view(&event)))
}
