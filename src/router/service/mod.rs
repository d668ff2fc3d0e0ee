//! `spindle router`: the front door. The same `POST /v1/jobs` as a Director, with per-job
//! results (`accepted`, `duplicate`, `pending`, `failed`); duplicates filtered by idempotency
//! key across the cluster within the dedup window; the rest forwarded to the Directors of each
//! bucket's shuffle shard.
//!
//! # Exactly-once acceptance (see `docs/architecture.md`, "The router")
//! 1. **Claim**: the router gives each job its id (a ULID) and claims the job's key in the dedup
//!    store with that id as owner. The claim is *pending*: it counts for `pending_ttl` unless
//!    confirmed. A key claimed by another job answers `duplicate` (confirmed claim) or, after
//!    waiting up to `pending_wait` for it to settle, `pending` (retry later).
//! 2. **Forward** the claimed jobs, with their ids, to a Director of the bucket's shard through
//!    `POST /v1/import` naming the Director's JobDB and a `not_after` instant (the claim's
//!    deadline less the clock skew bound). The Director skips ids it already has, and stores
//!    nothing once `not_after` has passed, so a forward can never persist a job whose claim may
//!    have been taken over. A bucket's unordered jobs go to one Director, each ordered
//!    sequence's to the Director it hashes to; the jobs of a request bound for one Director
//!    share one forward, and at most eight forwards of a request are in flight.
//!    - A definite refusal (connection refused, 409, 503, 4xx) stored nothing: the router tries
//!      the shard's next Director with the same ids (after a refusal of the content, 400, 413
//!      or 422, each bucket's or sequence's jobs first go again on their own, so one job's
//!      fault stays its group's).
//!    - An unknown outcome (timeout, reset, 5xx) may have stored the jobs in that JobDB: the
//!      router re-sends to *the same JobDB* (whichever Director owns it now, after a failover),
//!      refreshing its claims meanwhile, until it gets an answer or `resolve_for` passes. Ids
//!      make the re-send idempotent.
//! 3. **Confirm** the claims of stored jobs (they then last the whole window), and release the
//!    claims of jobs that were definitely not stored so the producer's retry is not blocked.
//!
//! A router that dies after claiming leaves pending claims that lapse after `pending_ttl`; the
//! producer's retry (same key, any router) waits for that and is then accepted.
//!
//! # Files
//! This file: the settings, starting and stopping, `POST /v1/jobs` from request to answer, and
//! the other routes. `claims.rs`: steps 1 and 3 (claim, keep alive, confirm or release).
//! `forward.rs`: step 2. `reads.rs`: a job and its attempts from the Director that holds it,
//! and pages of jobs and events merged from every Director. `events.rs`: `POST /v1/events`, the same three steps for events (a
//! claim per event, one forward per request), and back-fills (a claim per subscription and
//! event). `metrics.rs`: the `spindle_router_*` metrics.
//!
//! With a control database the router also serves the subscription API
//! (`/v1/subscriptions`, [`crate::events::http`]) and publishes events from its own cache of
//! the subscriptions.

mod claims;
mod events;
mod forward;
mod metrics;
mod reads;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::dedup::{Claim, DedupKey, DedupStore};
use super::directors::{DirectorEntry, Directors};
use crate::job::{Job, JobId};
use crate::registry::consul::ConsulClient;
use crate::rpc::api::{AcceptedJob, IntakeLimits, JobStatus, SubmitReply};
use crate::rpc::auth::TokenStore;
use crate::rpc::error::ApiError;
use claims::{claim_keys, settle_claims};
use forward::{forward, Group};
use metrics::RouterMetrics;

/// Settings of a router.
#[derive(Clone, Debug)]
pub struct RouterSettings {
    /// RPC listen address.
    pub listen: SocketAddr,
    /// Intake limits (the same checks as a Director's).
    pub intake: IntakeLimits,
    /// API tokens of producers; `None` leaves the API open.
    pub auth: Option<Arc<TokenStore>>,
    /// Admin token the router presents to the Directors' import RPC.
    pub director_token: Option<crate::secret::Secret>,
    /// How often the catalog is re-read.
    pub catalog_every: Duration,
    /// How long a Director that failed a forward is skipped.
    pub suspect_for: Duration,
    /// How long a request waits for another submission's pending claim of the same key.
    pub pending_wait: Duration,
    /// Deadline of one forward request.
    pub forward_timeout: Duration,
    /// How long a forward whose outcome is unknown is re-sent to its JobDB.
    pub resolve_for: Duration,
    /// The subscriptions events are published to; `None`: events and subscriptions are off.
    pub subscriptions: Option<Arc<crate::events::Subscriptions>>,
    /// The delivery address guard of the Directors: a subscription URL it blocks is refused.
    pub policy: Arc<crate::delivery::guard::AddressPolicy>,
    /// The archive, read for drained JobDBs' id indexes (settling lapsed claims); `None`:
    /// a claim whose holder may be in one stays `pending`.
    pub archive: Option<crate::archive::Archive>,
}

impl RouterSettings {
    /// Defaults around `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        RouterSettings {
            listen,
            intake: IntakeLimits::default(),
            auth: None,
            director_token: None,
            catalog_every: Duration::from_millis(500),
            suspect_for: Duration::from_secs(3),
            pending_wait: Duration::from_secs(5),
            forward_timeout: Duration::from_secs(10),
            resolve_for: Duration::from_secs(30),
            subscriptions: None,
            policy: Arc::new(crate::delivery::guard::AddressPolicy::new(Vec::new())),
            archive: None,
        }
    }
}

/// What the handlers share.
struct Shared {
    settings: RouterSettings,
    dedup: DedupStore,
    directors: Arc<Directors>,
    consul: ConsulClient,
    http: reqwest::Client,
    ids: Mutex<ulid::Generator>,
    metrics: RouterMetrics,
    stopping: CancellationToken,
    ready: AtomicBool,
}

/// A running router.
pub struct Router {
    addr: SocketAddr,
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Router {
    /// Binds, reads the catalog once, and starts serving.
    pub async fn start(
        settings: RouterSettings,
        dedup: DedupStore,
        directors: Arc<Directors>,
        consul: ConsulClient,
    ) -> std::io::Result<Router> {
        let listener = tokio::net::TcpListener::bind(settings.listen).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let http = reqwest::Client::builder()
            .timeout(settings.forward_timeout)
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(std::io::Error::other)?;
        if let Err(e) = directors.refresh(&consul).await {
            tracing::warn!(error = %e, "router: first catalog read failed; retrying");
        }
        let body_limit = settings.intake.max_request_bytes;
        let shared = Arc::new(Shared {
            settings,
            dedup,
            directors: directors.clone(),
            consul: consul.clone(),
            http,
            ids: Mutex::new(ulid::Generator::new()),
            metrics: RouterMetrics::new(),
            stopping: stop.clone(),
            ready: AtomicBool::new(true),
        });
        let subscriptions = crate::events::http::routes(crate::events::http::SubscriptionApi {
            subscriptions: shared.settings.subscriptions.clone(),
            auth: shared.settings.auth.clone(),
            limits: Arc::new(shared.settings.intake.clone()),
            policy: shared.settings.policy.clone(),
        });
        // The routes that take work run in a span each, in the caller's trace.
        let traced = || axum::middleware::from_fn(crate::telemetry::trace_request);
        let app = axum::Router::new()
            .route(
                "/v1/jobs",
                post(submit_jobs).layer(traced()).get(reads::list_jobs),
            )
            .route(
                "/v1/events",
                post(events::publish_event)
                    .layer(traced())
                    .get(reads::list_events),
            )
            .route("/v1/subscriptions/{id}/backfill", post(events::backfill))
            .route("/v1/jobs/{id}", get(reads::get_job))
            .route("/v1/jobs/{id}/attempts", get(reads::job_attempts))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .route("/openapi.json", get(openapi))
            .layer(DefaultBodyLimit::max(body_limit))
            .with_state(shared.clone())
            .merge(subscriptions);
        let mut tasks = JoinSet::new();
        if let Some(cache) = shared.settings.subscriptions.clone() {
            // Edits made through other routers and Directors reach this one's index.
            tasks.spawn(cache.run(stop.clone()));
        }
        tasks.spawn(
            directors
                .clone()
                .follow(consul, shared.settings.catalog_every, stop.clone()),
        );
        let placements_stop = stop.clone();
        let placements = shared.dedup.placements().clone();
        tasks.spawn(async move {
            // Placements are created on demand by claims too; creating them ahead keeps that
            // off the request path, and pruning keeps Consul's KV bounded.
            loop {
                if let Err(e) = placements.ensure_ahead(Utc::now()).await {
                    tracing::warn!(error = %e, "router: creating placements ahead failed");
                }
                tokio::select! {
                    _ = placements_stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        });
        let serve_stop = stop.clone();
        tasks.spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(serve_stop.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "router: server failed");
            }
        });
        tracing::info!(%addr, "router listening");
        Ok(Router { addr, stop, tasks })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops taking requests, lets those in progress finish, and returns.
    pub async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

impl Shared {
    /// A producer's request begins (refused while stopping): its caller and its body.
    fn intake(
        &self,
        headers: &HeaderMap,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<(Option<crate::rpc::auth::Caller>, Bytes), ApiError> {
        if self.stopping.is_cancelled() {
            return Err(ApiError::ShuttingDown);
        }
        let caller = crate::rpc::caller_of(self.settings.auth.as_deref(), headers)?;
        Ok((
            caller,
            crate::rpc::request_body(body, &self.settings.intake)?,
        ))
    }

    fn next_id(&self) -> JobId {
        crate::rpc::next_id(&self.ids)
    }

    /// The API of `director`, over the router's connection pool (its `forward_timeout`),
    /// with the router's admin token.
    fn director_client(
        &self,
        director: &DirectorEntry,
    ) -> Result<spindle_client::Client, spindle_client::Error> {
        spindle_client::Client::from_reqwest(
            self.http.clone(),
            &director.base,
            self.settings
                .director_token
                .as_ref()
                .map(|t| t.expose().to_owned()),
        )
    }

    /// Asks every healthy Director the same question (`ask`, given its API), all at once:
    /// their answers, in no particular order (a Director whose client cannot be built
    /// answers that error).
    async fn ask_directors<T, F, Fut>(&self, ask: F) -> Vec<Result<T, spindle_client::Error>>
    where
        F: Fn(spindle_client::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, spindle_client::Error>>,
    {
        let asked = self.directors.all().into_iter().map(|d| {
            let client = self.director_client(&d);
            let ask = &ask;
            async move { ask(client?).await }
        });
        futures::future::join_all(asked).await
    }

    /// The latest instant a Director may store a job whose claim was made or refreshed at
    /// `claimed`: the claim's deadline less the clock skew bound (between the router's clock,
    /// Redis' and the Director's).
    fn not_after(&self, claimed: DateTime<Utc>) -> DateTime<Utc> {
        let config = self.dedup.config();
        let margin = config.pending_ttl.saturating_sub(config.max_skew);
        claimed + chrono::Duration::from_std(margin).unwrap_or(chrono::Duration::zero())
    }
}

/// A job of the request on its way.
struct Routed {
    job: Arc<Job>,
    /// When its first attempt may start: its acceptance, or its `deliver_at`.
    first_at: DateTime<Utc>,
    claim: Option<Claim>,
    result: Option<AcceptedJob>,
}

impl Routed {
    /// The job's answer, `id` its own or the job that holds its key.
    fn answer(&self, status: JobStatus, id: JobId, error: Option<String>) -> AcceptedJob {
        let (job, first_at) = (&*self.job, self.first_at);
        let mut out = AcceptedJob::from(job);
        out.id = id.to_string();
        out.status = status;
        if status != JobStatus::Accepted {
            out.created_at = None;
            out.expire_at = None;
        } else if first_at > job.created_at {
            out.deliver_at = Some(first_at);
        }
        out.error = error;
        out
    }
}

/// How one forward request ended.
#[derive(Clone)]
enum Sent {
    /// Every job is in this JobDB.
    Stored,
    /// Nothing was stored (the reason, for the log and a final `failed`).
    Refused(String),
    /// Nothing was stored: the Director refused the request's content (400, 413, 422: the
    /// status), which may be one job's.
    Invalid(String, u16),
    /// The jobs may or may not be stored in the JobDB.
    Unknown(String),
}

/// Submit jobs through the router.
async fn submit_jobs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (caller, body) = shared.intake(&headers, body)?;
    let trace = crate::telemetry::from_headers(&headers);
    let (jobs, scheduled) = crate::rpc::check_forward(
        &body,
        &shared.settings.intake,
        shared.dedup.config().max_skew,
        trace.as_ref(),
        || shared.next_id(),
    )?;
    crate::rpc::check_buckets(caller.as_ref(), &jobs)?;
    let scheduled: HashMap<JobId, DateTime<Utc>> = scheduled.into_iter().collect();

    let mut routed: Vec<Routed> = jobs
        .into_iter()
        .map(|job| Routed {
            first_at: scheduled.get(&job.id).copied().unwrap_or(job.created_at),
            claim: job.idempotency_key.as_deref().map(|key| Claim {
                key: DedupKey::new(&job.bucket, key),
                at: job.created_at,
                owner: job.id,
            }),
            job,
            result: None,
        })
        .collect();
    let claimed_at = Utc::now();
    claim_keys(&shared, &mut routed).await?;

    // Forward what was claimed (or has no key): a bucket's jobs (those of each ordered
    // sequence apart, which has a Director of its own in the bucket's shard) go to one
    // Director, and the groups bound for one Director share a forward.
    let mut groups: HashMap<(Arc<str>, Option<crate::job::Seq>), Vec<usize>> = HashMap::new();
    for (i, r) in routed.iter().enumerate() {
        if r.result.is_none() {
            groups
                .entry((r.job.bucket.clone(), r.job.seq()))
                .or_default()
                .push(i);
        }
    }
    let groups = groups
        .into_iter()
        .map(|((bucket, seq), members)| Group {
            bucket,
            seq,
            members,
            tried: Vec::new(),
            last_refusal: Sent::Refused(String::from("no healthy director")),
            claimed_at,
            alone: false,
            kept: Vec::new(),
        })
        .collect();
    let outcomes = forward(&shared, &routed, groups).await;

    let mut confirm = Vec::new();
    let mut release = Vec::new();
    for (members, sent) in outcomes {
        for i in members {
            let r = &mut routed[i];
            let (status, error) = match &sent {
                Sent::Stored => {
                    confirm.extend(r.claim);
                    (JobStatus::Accepted, None)
                }
                Sent::Refused(why) | Sent::Invalid(why, _) => {
                    release.extend(r.claim);
                    (JobStatus::Failed, Some(format!("not stored: {why}")))
                }
                Sent::Unknown(why) => (
                    JobStatus::Failed,
                    Some(format!(
                        "outcome unknown ({why}); submit again with the same idempotency key"
                    )),
                ),
            };
            r.result = Some(r.answer(status, r.job.id, error));
        }
    }
    settle_claims(&shared, &confirm, &release).await;

    // A job whose key another job of this same request claimed shares that job's fate.
    let owners: HashMap<JobId, (JobStatus, Option<String>)> = routed
        .iter()
        .filter_map(|r| {
            r.result
                .as_ref()
                .map(|a| (r.job.id, (a.status, a.error.clone())))
        })
        .collect();
    for r in &mut routed {
        if let Some(a) = &mut r.result {
            if a.status == JobStatus::Duplicate {
                if let Some((status, error)) = a.id.parse().ok().and_then(|id| owners.get(&id)) {
                    if *status != JobStatus::Accepted {
                        a.status = JobStatus::Failed;
                        a.error = Some(format!(
                            "the job holding the same key in this request was not stored: {}",
                            error.as_deref().unwrap_or("unknown")
                        ));
                    }
                }
            }
        }
    }

    let answers: Vec<AcceptedJob> = routed.into_iter().filter_map(|r| r.result).collect();
    for a in &answers {
        shared.metrics.count(a.status);
    }
    if answers
        .iter()
        .all(|a| matches!(a.status, JobStatus::Failed | JobStatus::Pending))
    {
        let why = answers
            .iter()
            .find_map(|a| a.error.clone())
            .unwrap_or_default();
        return Err(ApiError::Unavailable(format!("nothing was stored: {why}")));
    }
    let response = SubmitReply {
        transaction_id: ulid::Ulid::new().to_string(),
        jobs: answers,
    };
    Ok((StatusCode::ACCEPTED, Json(response)).into_response())
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let directors = shared.directors.len();
    shared.metrics.directors.set(directors as i64);
    if directors > 0 && shared.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, format!("ready: {directors} directors\n")).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no healthy director in the catalog\n",
        )
            .into_response()
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    shared.metrics.directors.set(shared.directors.len() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        shared.metrics.render(),
    )
        .into_response()
}

async fn openapi() -> Response {
    match crate::rpc::openapi::router_document() {
        Ok(doc) => ([(header::CONTENT_TYPE, "application/json")], doc).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
