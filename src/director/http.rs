//! The Director's HTTP API: submit, import, job traces, endpoint health, readiness, metrics
//! and the OpenAPI document. The handlers are the Director's; what they share with the router
//! (authentication, request parsing and validation, error bodies, the OpenAPI document in
//! [`crate::rpc::openapi`]) is the intake toolkit in [`crate::rpc`], which imports nothing of
//! the Director.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::mailbox::{Accepted, Repeats, Ticket, WriteOp, WriteRejected};
use super::supervise::{Progress, Readiness};
use crate::events::http::SubscriptionApi;
use crate::job::{JobId, Recovered};
use crate::jobdb::JobDb;
use crate::metrics::Metrics;
use crate::rpc::api::{self, FieldError, IntakeLimits, SubmitReply};
use crate::rpc::auth::{self, Scope};
use crate::rpc::error::ApiError;
use crate::rpc::import::{self, job_of, ImportRequest, ImportResponse, MAX_IMPORT_JOBS};
use crate::rpc::{
    self, caller_of, check_buckets, check_submission, exposition, next_id, request_body,
};

/// What the handlers share.
#[derive(Clone)]
pub struct RpcState {
    /// The Director's writer.
    pub writer: mpsc::Sender<WriteOp>,
    /// For reads (job traces).
    pub db: JobDb,
    /// Exported at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Intake limits and defaults.
    pub limits: Arc<IntakeLimits>,
    /// Cancelled when the Director stops taking work.
    pub stopping: CancellationToken,
    /// Whether the Director is ready, and why not (`/readyz`).
    pub readiness: Readiness,
    /// How a producer's request waits for the writer.
    pub wait: WriteWait,
    /// Job id generator: monotonic within a millisecond, so ids keep submission order.
    pub ids: Arc<Mutex<ulid::Generator>>,
    /// Positions of the ordered jobs this Director accepts (a key's order).
    pub positions: Arc<crate::director::ordering::Positions>,
    /// Known API tokens; `None` leaves the API open (a warning is logged at start).
    pub auth: Option<Arc<auth::TokenStore>>,
    /// Job ids of the imports in progress (requests sharing an id run one at a time).
    pub imports: Arc<import::InFlight>,
    /// The scheduler's endpoint health, refreshed once a second.
    pub health: Arc<Mutex<Vec<api::EndpointHealth>>>,
    /// The subscriptions events are published to; `None`: events and subscriptions are off.
    pub subscriptions: Option<Arc<crate::events::Subscriptions>>,
    /// The delivery address guard (a subscription's URL it blocks is refused).
    pub policy: Arc<crate::delivery::guard::AddressPolicy>,
    /// In a cluster, the intake's clearance of new ordered jobs against the other live JobDBs.
    pub clearance: Option<crate::director::ordering::survey::Clearance>,
}

/// How long a producer's request waits for the writer, and how the handler knows the JobDB
/// cannot be written at the moment.
#[derive(Clone, Debug)]
pub struct WriteWait {
    /// The most a request waits for its outcome (`--write-timeout-ms`): then it is answered
    /// 503 if the writer had not taken it (it never will), 504 if it was being written.
    pub timeout: Duration,
    /// The writer's progress: busy from a try to commit until one succeeds.
    pub writer: Progress,
    /// Busy for longer than this, the JobDB counts as not writable: requests are answered 503
    /// at once instead of waiting.
    pub unwritable_after: Duration,
}

impl WriteWait {
    /// Whether the JobDB cannot be written at the moment (no commit succeeded for a while).
    fn unwritable(&self) -> bool {
        self.writer.stalled(self.unwritable_after)
    }
}

impl RpcState {
    /// Hands a producer's request to the writer and waits for its outcome until `deadline`.
    /// If the wait ends first: a request the writer had not taken is withdrawn, so it is never
    /// written (503, nothing stored); one it had taken is being written and its outcome is
    /// unknown (504; the writer leaves it out of any later try).
    async fn write<T>(
        &self,
        kind: &'static str,
        op: WriteOp,
        ticket: &Ticket,
        outcome: oneshot::Receiver<Result<T, WriteRejected>>,
        deadline: Instant,
    ) -> Result<T, ApiError> {
        let commit = crate::telemetry::current_child(
            "spindle.commit",
            opentelemetry::trace::SpanKind::Internal,
            vec![
                opentelemetry::KeyValue::new("spindle.request", kind),
                opentelemetry::KeyValue::new("spindle.jobdb", self.db.name().to_owned()),
            ],
        );
        let result = self.write_in(kind, op, ticket, outcome, deadline).await;
        crate::telemetry::end_step(&commit, result.as_ref().err().map(|e| e.to_string()));
        result
    }

    async fn write_in<T>(
        &self,
        kind: &'static str,
        op: WriteOp,
        ticket: &Ticket,
        mut outcome: oneshot::Receiver<Result<T, WriteRejected>>,
        deadline: Instant,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout_at(deadline, self.writer.send(op)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ApiError::ShuttingDown),
            // Never queued.
            Err(_) => return Err(self.not_stored(kind, "withdrawn")),
        }
        // `true`: the wait ran out; `false`: the writer stopped without an answer.
        let timed_out = match tokio::time::timeout_at(deadline, &mut outcome).await {
            Ok(Ok(answer)) => return answer.map_err(ApiError::from),
            Ok(Err(_)) => false,
            Err(_) => true,
        };
        if ticket.withdraw() {
            return Err(match timed_out {
                true => self.not_stored(kind, "withdrawn"),
                false => ApiError::ShuttingDown,
            });
        }
        // Taken: the answer may have come just now; else nobody can tell yet.
        if let Ok(answer) = outcome.try_recv() {
            return answer.map_err(ApiError::from);
        }
        self.metrics.write_rejected(kind, "outcome-unknown");
        tracing::warn!(
            request = kind,
            timed_out,
            "answered 504: the request was being written, its outcome is unknown"
        );
        Err(ApiError::OutcomeUnknown(
            crate::rpc::error::OUTCOME_UNKNOWN.into(),
        ))
    }

    /// A 503 for a request the writer never took (`reason`, counted), or refused because the
    /// JobDB cannot be written now.
    fn not_stored(&self, kind: &'static str, reason: &'static str) -> ApiError {
        self.metrics.write_rejected(kind, reason);
        ApiError::Unavailable(
            "the jobdb cannot be written at the moment; nothing was stored".into(),
        )
    }

    /// Refuses a producer's request at once (503) while the JobDB cannot be written.
    fn check_writable(&self, kind: &'static str) -> Result<(), ApiError> {
        match self.wait.unwritable() {
            true => Err(self.not_stored(kind, "not-writable")),
            false => Ok(()),
        }
    }

    /// A producer's request begins: its deadline and its caller (refused while stopping).
    fn intake(&self, headers: &HeaderMap) -> Result<(Instant, Option<auth::Caller>), ApiError> {
        let deadline = Instant::now() + self.wait.timeout;
        if self.stopping.is_cancelled() {
            return Err(ApiError::ShuttingDown);
        }
        Ok((deadline, self.caller(headers)?))
    }

    /// Stores new jobs as one submission (they get their positions first), with the events
    /// `kept` without a job, and waits for the commit (`repeats`: which jobs it skips as
    /// stored already).
    #[allow(clippy::too_many_arguments)]
    async fn store(
        &self,
        kind: &'static str,
        jobs: &mut [Arc<crate::job::Job>],
        kept: Vec<crate::job::EventRecord>,
        scheduled: &crate::job::Scheduled,
        repeats: Repeats,
        deadline: Instant,
    ) -> Result<Accepted, ApiError> {
        self.positions.place(jobs);
        self.check_writable(kind)?;
        let (reply, outcome) = oneshot::channel();
        let ticket = Ticket::new();
        let op = WriteOp::Submit {
            cleared: self.cleared(jobs).await,
            jobs: jobs.to_vec(),
            events: kept,
            scheduled: scheduled.clone(),
            not_after: None,
            repeats,
            reply,
            ticket: ticket.clone(),
        };
        self.write(kind, op, &ticket, outcome, deadline).await
    }

    /// Which of `jobs` (positions placed) the intake's survey of the other live JobDBs
    /// cleared: none without peers (a writer alone releases every job in its commits).
    async fn cleared(&self, jobs: &[Arc<crate::job::Job>]) -> Vec<JobId> {
        match &self.clearance {
            Some(clearance) => clearance.cleared(jobs).await,
            None => Vec::new(),
        }
    }

    /// The caller behind the request's bearer token (`None` when authentication is off).
    pub(super) fn caller(&self, headers: &HeaderMap) -> Result<Option<auth::Caller>, ApiError> {
        caller_of(self.auth.as_deref(), headers)
    }

    fn next_id(&self) -> JobId {
        next_id(&self.ids)
    }
}

impl crate::director::parks::Announcer for RpcState {
    /// Stores a park's event as `POST /v1/events` would, skipping a subscription that has a
    /// job of the event here already (the same change told again after a crash).
    async fn announce(
        &self,
        event: spindle_client::NewEvent,
        event_id: ulid::Ulid,
    ) -> Result<bool, String> {
        let Some(subscriptions) = &self.subscriptions else {
            return Ok(false);
        };
        let made = crate::events::publish::fan_out(
            event,
            &subscriptions.index(),
            &self.limits,
            Utc::now(),
            chrono::Duration::zero(),
            event_id,
            || self.next_id(),
        )
        .map_err(|e| format!("{}: {}", e.field, e.message))?;
        let mut jobs = made.jobs;
        let deadline = Instant::now() + self.wait.timeout;
        self.store(
            "announce",
            &mut jobs,
            made.kept.into_iter().collect(),
            &made.scheduled,
            Repeats::SameDeliveries,
            deadline,
        )
        .await
        .map(|_| true)
        .map_err(|e| e.to_string())
    }
}

/// The routes of a Director that take work or report on it; its reads are
/// [`super::reads::routes`].
pub fn router(state: RpcState) -> Router {
    let body_limit = state.limits.max_request_bytes;
    let subscriptions = crate::events::http::routes(SubscriptionApi {
        subscriptions: state.subscriptions.clone(),
        auth: state.auth.clone(),
        limits: state.limits.clone(),
        policy: state.policy.clone(),
    });
    // The routes that take work run in a span each, in the caller's trace.
    let traced = || axum::middleware::from_fn(crate::telemetry::trace_request);
    Router::new()
        .route("/v1/jobs", post(submit_jobs).layer(traced()))
        .route("/v1/events", post(publish_event).layer(traced()))
        .route("/v1/import", post(import_jobs).layer(traced()))
        .route("/v1/subscriptions/{id}/backfill", post(backfill))
        .route("/v1/endpoints", get(endpoints))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
        .merge(subscriptions)
}

/// Publish an event, or a batch of them (`{"events": [...]}`): one job per matching
/// subscription of each, all persisted in one transaction before the answer (none when the
/// transaction fails).
async fn publish_event(
    State(state): State<RpcState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    let (deadline, caller) = state.intake(&headers)?;
    let subscriptions = crate::events::configured(&state.subscriptions)?;
    let body = request_body(body, &state.limits)?;
    let trace = crate::telemetry::from_headers(&headers);
    let publishing = crate::events::publish::Publishing::read(&body, trace.as_ref())?;
    for event in publishing.events() {
        rpc::check_publisher(caller.as_ref(), &event.bucket)?;
    }
    let batch = matches!(publishing, crate::events::publish::Publishing::Batch(_));
    let mut made = publishing.fan_out(
        &subscriptions.index(),
        &state.limits,
        Utc::now(),
        || state.next_id().0,
        || state.next_id(),
    )?;
    for (_, deliveries) in &made.events {
        state.metrics.events_published(deliveries.len());
    }
    let transaction = state
        .store(
            "publish",
            &mut made.jobs,
            made.kept,
            &made.scheduled,
            Repeats::Impossible,
            deadline,
        )
        .await?
        .transaction
        .to_string();
    let mut replies: Vec<api::PublishReply> = made
        .events
        .into_iter()
        .map(|(event_id, deliveries)| api::PublishReply {
            transaction_id: Some(transaction.clone()),
            event_id: Some(event_id.to_string()),
            deliveries,
            duplicate: false,
        })
        .collect();
    if !batch {
        if let Some(one) = replies.pop() {
            return Ok((StatusCode::ACCEPTED, Json(one)).into_response());
        }
    }
    let reply = api::PublishBatchReply {
        transaction_id: Some(transaction),
        events: replies,
    };
    Ok((StatusCode::ACCEPTED, Json(reply)).into_response())
}

/// Submit jobs. The whole batch is persisted in one transaction before the answer.
async fn submit_jobs(
    State(state): State<RpcState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let (deadline, caller) = state.intake(&headers)?;
    let body = request_body(body, &state.limits)?;
    let trace = crate::telemetry::from_headers(&headers);
    let (mut jobs, scheduled) =
        check_submission(&body, &state.limits, trace.as_ref(), || state.next_id())?;
    check_buckets(caller.as_ref(), &jobs)?;
    let transaction = state
        .store(
            "submit",
            &mut jobs,
            Vec::new(),
            &scheduled,
            Repeats::Impossible,
            deadline,
        )
        .await?
        .transaction;
    let response = SubmitReply {
        transaction_id: transaction.to_string(),
        jobs: api::accepted_jobs(&jobs, &scheduled),
    };
    Ok((StatusCode::ACCEPTED, Json(response)))
}

/// The health of the endpoints this Director works for (admin): queue, requests in flight,
/// circuit breaker, controls.
async fn endpoints(
    State(state): State<RpcState>,
    headers: HeaderMap,
) -> Result<Json<api::EndpointsView>, ApiError> {
    if let Some(caller) = state.caller(&headers)? {
        if !matches!(caller.scope, auth::Scope::Admin) {
            return Err(ApiError::Forbidden {
                message: format!("token {:?} is not an admin token", caller.name),
                field: None,
            });
        }
    }
    let endpoints = state
        .health
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|poisoned| poisoned.into_inner().clone());
    Ok(Json(api::EndpointsView { endpoints }))
}

/// Deliver past events to a subscription (one added after them): one job per event it wants
/// and has no job for in this JobDB, all committed together.
async fn backfill(
    State(state): State<RpcState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let (deadline, caller) = state.intake(&headers)?;
    let subscription =
        crate::events::http::to_backfill(&state.subscriptions, &id, caller.as_ref())?;
    let body = request_body(body, &state.limits)?;
    let request: api::BackfillRequest = rpc::parse_json(&body)?;
    let total = request.events.len();
    let made = crate::events::publish::backfill(
        &subscription,
        request.events,
        &state.limits,
        Utc::now(),
        || state.next_id(),
    )?;
    // The writer skips an event that has a job of the subscription by the time of its commit
    // (it alone stores jobs in this JobDB): a back-fill sent again makes nothing twice.
    let mut jobs = made.jobs;
    if !jobs.is_empty() {
        let accepted = state
            .store(
                "backfill",
                &mut jobs,
                Vec::new(),
                &Default::default(),
                Repeats::SameDeliveries,
                deadline,
            )
            .await?;
        if accepted.already_present > 0 {
            let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
            let stored = state.db.existing_jobs(&ids).await.map_err(|e| {
                tracing::warn!(error = %e, "backfill: reading which jobs were stored failed");
                ApiError::Unavailable(
                    "the jobdb is unavailable after the back-fill was stored; send it again \
                     to learn its jobs"
                        .into(),
                )
            })?;
            jobs.retain(|j| stored.contains(&j.id));
        }
    }
    let deliveries: Vec<api::BackfilledEvent> = jobs
        .iter()
        .filter_map(|j| {
            let e = j.event.as_ref()?;
            Some(api::BackfilledEvent {
                event_id: e.event_id.to_string(),
                job_id: j.id.to_string(),
            })
        })
        .collect();
    Ok((
        StatusCode::ACCEPTED,
        Json(api::BackfillReply {
            skipped: total - deliveries.len(),
            deliveries,
        }),
    ))
}

/// Liveness: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: the JobDB is owned and can be written, recovery is done, every core task runs
/// and makes progress, and the Director takes jobs. A 503 says why not.
async fn readyz(State(state): State<RpcState>) -> impl IntoResponse {
    match state.readiness.why_not() {
        _ if state.stopping.is_cancelled() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: stopping\n".to_owned(),
        ),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
        None => (StatusCode::OK, "ready\n".to_owned()),
    }
}

/// Prometheus metrics: OpenMetrics when the scraper asks for it, else the classic text format.
async fn metrics(State(state): State<RpcState>, headers: HeaderMap) -> impl IntoResponse {
    let queued = state.writer.max_capacity() - state.writer.capacity();
    state.metrics.write_queue.set(queued as i64);
    exposition(&state.metrics, &headers)
}

/// Import jobs (admin): a drainer's move from a retired JobDB, or a router's forward of new
/// jobs whose ids it chose. The steps: the request's shape, its parts, the ids held, the jobs
/// already present (moves only), then one write.
async fn import_jobs(
    State(state): State<RpcState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<ImportResponse>), ApiError> {
    let deadline = Instant::now() + state.wait.timeout;
    if state.stopping.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    require_admin(&state, &headers)?;
    let body = rpc::request_body(body, &state.limits)?;
    let mut request: ImportRequest = rpc::parse_json(&body)?;
    check_import(&state, &request)?;
    let parts = ImportParts::of(&mut request, &state.limits)?;
    // Requests sharing an id are written one after the other: the check for jobs already
    // present and their insert must not interleave with another request's. A drainer's import
    // reads which are present first; a router's forward (new jobs) does not: the writer finds
    // them only when the JobDB refuses a duplicate (a retry of a forward whose answer was
    // lost), so a forward costs what a submit costs.
    state.check_writable("import")?;
    let ids: Vec<JobId> = parts.jobs.iter().map(|(job, _, _)| job.id).collect();
    let Ok(held) = tokio::time::timeout_at(deadline, state.imports.hold(&ids)).await else {
        return Err(state.not_stored("import", "withdrawn"));
    };
    let present = match request.from_jobdb {
        Some(_) => present_of(&state, &ids, deadline).await?,
        None => Default::default(),
    };
    let ImportParts { jobs, blocks, kept } = parts;
    let mut fresh: Vec<Recovered> = jobs
        .into_iter()
        .filter(|(job, _, _)| !present.contains(&job.id))
        .map(|(job, attempts, retry_at)| Recovered {
            job: Arc::new(job),
            attempts,
            retry_at: Some(retry_at),
        })
        .collect();
    if request.from_jobdb.is_none() {
        // A router's new jobs take their place in their keys' order here, when accepted: the
        // router's clock may disagree with the Directors'. A move keeps the place it had.
        for r in &mut fresh {
            state.positions.place(std::slice::from_mut(&mut r.job));
        }
    }
    let mut imported = fresh.len();
    let mut already_present = present.len();
    // Checked again now that the request may have waited (for the ids, for the JobDB): a job
    // must never be stored after `not_after`, or a lapsed claim could be taken over with it.
    if request.not_after.is_some_and(|t| Utc::now() > t) {
        return Err(ApiError::Conflict {
            message: "not_after passed while the request waited; nothing was stored".into(),
            field: Some("not_after".to_owned()),
        });
    }
    if imported > 0 || !blocks.is_empty() || !kept.is_empty() {
        let parts = ImportParts {
            jobs: fresh,
            blocks,
            kept,
        };
        let n = write_import(&state, &request, parts, held, deadline).await?;
        imported -= n;
        already_present += n;
    }
    tracing::debug!(
        from = request.from_jobdb.as_deref().unwrap_or("router"),
        imported,
        already_present,
        "jobs imported"
    );
    Ok((
        StatusCode::OK,
        Json(ImportResponse {
            jobdb: state.db.name().to_owned(),
            imported,
            already_present,
        }),
    ))
}

/// Refuses a caller whose token is not an admin token (an open API lets everyone through).
fn require_admin(state: &RpcState, headers: &HeaderMap) -> Result<(), ApiError> {
    match state.caller(headers)? {
        Some(caller) if !matches!(caller.scope, Scope::Admin) => Err(ApiError::Forbidden {
            message: format!(
                "token {:?} is not an admin token; nothing was stored",
                caller.name
            ),
            field: None,
        }),
        _ => Ok(()),
    }
}

/// The rules of an import request as a whole: the JobDB it names is this Director's, and
/// which fields go with a move (`from_jobdb`) or with new jobs, and how many of each.
fn check_import(state: &RpcState, request: &ImportRequest) -> Result<(), ApiError> {
    if request.jobdb != state.db.name() {
        return Err(ApiError::Conflict {
            message: format!(
                "this director owns jobdb {:?}, not {:?}; nothing was stored",
                state.db.name(),
                request.jobdb
            ),
            field: Some("jobdb".to_owned()),
        });
    }
    let moving = request.from_jobdb.is_some();
    if let Some(from) = &request.from_jobdb {
        if !crate::registry::inventory::valid_name(from) {
            return Err(FieldError::new("from_jobdb", "must be 1 to 48 of [a-z0-9_]").into());
        }
    }
    if let Some(not_after) = request.not_after {
        if moving {
            return Err(
                FieldError::new("not_after", "is only for new jobs (without from_jobdb)").into(),
            );
        }
        if Utc::now() > not_after {
            return Err(ApiError::Conflict {
                message: format!(
                    "not_after ({not_after}) has passed: the claim may have been taken over; \
                     nothing was stored"
                ),
                field: Some("not_after".to_owned()),
            });
        }
    }
    let carries_blocks = moving && !request.blocked_keys.is_empty();
    let carries_events = !moving && !request.events.is_empty();
    if (request.jobs.is_empty() && !carries_blocks && !carries_events)
        || request.jobs.len() > MAX_IMPORT_JOBS
    {
        return Err(
            FieldError::new("jobs", format!("must hold 1 to {MAX_IMPORT_JOBS} jobs")).into(),
        );
    }
    if !moving && !request.blocked_keys.is_empty() {
        return Err(FieldError::new("blocked_keys", "is only for moves (with from_jobdb)").into());
    }
    if moving && !request.events.is_empty() {
        return Err(FieldError::new("events", "is only for new jobs (without from_jobdb)").into());
    }
    for (name, n, what) in [
        ("events", request.events.len(), "events"),
        ("blocked_keys", request.blocked_keys.len(), "keys"),
    ] {
        if n > MAX_IMPORT_JOBS {
            let why = format!("must hold at most {MAX_IMPORT_JOBS} {what}");
            return Err(FieldError::new(name, why).into());
        }
    }
    Ok(())
}

/// What an import stores: its jobs (each with its attempts so far and next attempt), the keys
/// a move carries blocked, and the events a router keeps without a job.
struct ImportParts<J> {
    jobs: Vec<J>,
    blocks: Vec<crate::jobdb::BlockedKey>,
    kept: Vec<crate::job::EventRecord>,
}

impl ImportParts<(crate::job::Job, u16, chrono::DateTime<Utc>)> {
    /// The parts of `request`, each checked by the rules of its kind (its events taken out).
    fn of(request: &mut ImportRequest, limits: &IntakeLimits) -> Result<Self, ApiError> {
        let kept = std::mem::take(&mut request.events)
            .into_iter()
            .enumerate()
            .map(|(i, e)| crate::events::publish::kept_of_wire(e, i, limits))
            .collect::<Result<Vec<_>, _>>()?;
        let blocks = request
            .blocked_keys
            .iter()
            .enumerate()
            .map(|(i, key)| import::blocked_key_of(key, i))
            .collect::<Result<Vec<_>, _>>()?;
        let mut jobs = Vec::with_capacity(request.jobs.len());
        let mut endpoints = crate::rpc::rules::CheckedEndpoints::default();
        for (i, spec) in request.jobs.iter().enumerate() {
            if request.from_jobdb.is_none() && spec.attempts != 0 {
                return Err(FieldError::new(
                    format!("jobs[{i}].attempts"),
                    "must be 0 for new jobs (without from_jobdb)",
                )
                .into());
            }
            jobs.push((
                job_of(spec, i, limits, &mut endpoints)?,
                spec.attempts,
                spec.retry_at,
            ));
        }
        Ok(ImportParts { jobs, blocks, kept })
    }
}

/// Which of a move's `ids` this JobDB holds already (a drainer's batch sent again).
async fn present_of(
    state: &RpcState,
    ids: &[JobId],
    deadline: Instant,
) -> Result<std::collections::HashSet<JobId>, ApiError> {
    match tokio::time::timeout_at(deadline, state.db.existing_jobs(ids)).await {
        Ok(Ok(present)) => Ok(present),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "import: reading existing jobs failed");
            Err(ApiError::Unavailable(
                "the jobdb is unavailable; nothing was stored".into(),
            ))
        }
        Err(_) => Err(state.not_stored("import", "withdrawn")),
    }
}

/// Writes an import's new parts in one write, keeping its ids `held` until the writer is
/// done with them; returns how many of its jobs the writer found already present.
async fn write_import(
    state: &RpcState,
    request: &ImportRequest,
    parts: ImportParts<Recovered>,
    held: import::Held,
    deadline: Instant,
) -> Result<usize, ApiError> {
    let ImportParts {
        jobs: fresh,
        blocks,
        kept,
    } = parts;
    let ticket = Ticket::new();
    let (op, outcome) = match &request.from_jobdb {
        Some(from) => {
            let (reply, outcome) = oneshot::channel();
            let op = WriteOp::Import {
                jobs: fresh,
                from_jobdb: from.clone(),
                blocks,
                reply,
                ticket: ticket.clone(),
            };
            (op, Outcome::Imported(outcome))
        }
        None => {
            let (reply, outcome) = oneshot::channel();
            let scheduled = scheduled_of(&fresh);
            // The deadline travels with the write: checked when its batch is assembled and
            // again just before every COMMIT that carries the jobs.
            let jobs: Vec<Arc<crate::job::Job>> = fresh.into_iter().map(|r| r.job).collect();
            let op = WriteOp::Submit {
                cleared: state.cleared(&jobs).await,
                jobs,
                events: kept,
                scheduled,
                not_after: request.not_after,
                repeats: Repeats::SameIds,
                reply,
                ticket: ticket.clone(),
            };
            (op, Outcome::Submitted(outcome))
        }
    };
    // The outcome's channel is answered once, whichever kind of write this is.
    let (answer, answered) = oneshot::channel();
    tokio::spawn(async move {
        let n = match outcome {
            Outcome::Imported(rx) => rx.await.map(|r| r.map(|()| 0)),
            Outcome::Submitted(rx) => rx.await.map(|r| r.map(|a| a.already_present)),
        };
        // A request answered 504 keeps its ids until the writer is done with it, so a retry
        // of the same jobs waits for that, as any other request sharing them.
        drop(held);
        if let Ok(n) = n {
            let _ = answer.send(n);
        }
    });
    state.write("import", op, &ticket, answered, deadline).await
}

/// A router's new jobs whose first attempt differs from their acceptance: they were submitted
/// with `deliver_at` or `delay_ms` (a router sends the two equal otherwise), and are judged by
/// this clock, never sooner than asked: the time as given, or as far from now as it was from
/// the router's acceptance, whichever is later (a router's clock ahead cannot make one early,
/// one behind only later).
fn scheduled_of(fresh: &[Recovered]) -> crate::job::Scheduled {
    let now = Utc::now();
    fresh
        .iter()
        .filter_map(|r| {
            let at = r.retry_at.filter(|at| *at != r.job.created_at)?;
            let from_now = now.checked_add_signed(at - r.job.created_at)?;
            let at = at.max(from_now);
            (at > now).then_some((r.job.id, at))
        })
        .collect()
}

/// Where a write's outcome arrives: imports are acknowledged, submissions get a transaction id.
enum Outcome {
    Imported(oneshot::Receiver<Result<(), WriteRejected>>),
    Submitted(oneshot::Receiver<Result<Accepted, WriteRejected>>),
}

async fn openapi() -> impl IntoResponse {
    match rpc::openapi::director_document() {
        Ok(doc) => ([(header::CONTENT_TYPE, "application/json")], doc).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "openapi document failed to render");
            ApiError::Internal.into_response()
        }
    }
}

/// The routes of a Director process that owns no JobDB at the moment (campaigning): alive,
/// not ready, metrics, and a 503 for everything else so producers go elsewhere.
pub fn idle_router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/readyz",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: no jobdb owned\n",
                )
            }),
        )
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let metrics = metrics.clone();
                async move { exposition(&metrics, &headers) }
            }),
        )
        .route("/openapi.json", get(openapi))
        .fallback(|| async {
            ApiError::Unavailable(
                "this director owns no jobdb right now; nothing was stored".into(),
            )
        })
}
