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
//!    have been taken over.
//!    - A definite refusal (connection refused, 409, 503, 4xx) stored nothing: the router tries
//!      the shard's next Director with the same ids.
//!    - An unknown outcome (timeout, reset, 5xx) may have stored the jobs in that JobDB: the
//!      router re-sends to *the same JobDB* (whichever Director owns it now, after a failover),
//!      refreshing its claims meanwhile, until it gets an answer or `resolve_for` passes. Ids
//!      make the re-send idempotent.
//! 3. **Confirm** the claims of stored jobs (they then last the whole window), and release the
//!    claims of jobs that were definitely not stored so the producer's retry is not blocked.
//!
//! A router that dies after claiming leaves pending claims that lapse after `pending_ttl`; the
//! producer's retry (same key, any router) waits for that and is then accepted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::dedup::{Claim, ClaimOutcome, ConfirmOutcome, DedupKey, DedupStore};
use super::directors::{DirectorEntry, Directors};
use crate::job::{Job, JobId};
use crate::registry::consul::ConsulClient;
use crate::rpc::api::{AcceptedJob, IntakeLimits, JobStatus, SubmitReply};
use crate::rpc::auth::TokenStore;
use crate::rpc::error::ApiError;
use crate::rpc::import::{import_job, ImportRequest};

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
        }
    }
}

/// Label set of a per-job result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

/// Label set of a forward's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForwardLabels {
    outcome: &'static str,
}

/// The router's metrics (`spindle_router_*`).
struct RouterMetrics {
    registry: Registry,
    jobs: Family<StatusLabels, Counter>,
    forwards: Family<ForwardLabels, Counter>,
    claim_seconds: Histogram,
    dedup_lost: Counter,
    confirm_failures: Counter,
    directors: Gauge,
}

impl RouterMetrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("spindle_router");
        let jobs = Family::<StatusLabels, Counter>::default();
        registry.register("jobs", "Submitted jobs by result", jobs.clone());
        let forwards = Family::<ForwardLabels, Counter>::default();
        registry.register(
            "forwards",
            "Forward requests to Directors by outcome",
            forwards.clone(),
        );
        let claim_seconds = Histogram::new(exponential_buckets(0.0002, 2.0, 16));
        registry.register(
            "dedup_claim_duration_seconds",
            "Duration of one request's dedup claim",
            claim_seconds.clone(),
        );
        let dedup_lost = Counter::default();
        registry.register(
            "dedup_lost",
            "Stored jobs whose claim another job held at confirmation (duplicates let through)",
            dedup_lost.clone(),
        );
        let confirm_failures = Counter::default();
        registry.register(
            "dedup_confirm_failures",
            "Stored jobs whose claim could not be confirmed (left pending)",
            confirm_failures.clone(),
        );
        let directors = Gauge::default();
        registry.register(
            "directors",
            "Healthy Directors in the catalog",
            directors.clone(),
        );
        RouterMetrics {
            registry,
            jobs,
            forwards,
            claim_seconds,
            dedup_lost,
            confirm_failures,
            directors,
        }
    }

    fn count(&self, status: JobStatus) {
        let status = match status {
            JobStatus::Accepted => "accepted",
            JobStatus::Duplicate => "duplicate",
            JobStatus::Pending => "pending",
            JobStatus::Failed => "failed",
        };
        self.jobs.get_or_create(&StatusLabels { status }).inc();
    }

    fn forward(&self, outcome: &'static str) {
        self.forwards
            .get_or_create(&ForwardLabels { outcome })
            .inc();
    }

    fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        crate::metrics::to_prometheus_text(&out)
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
        let app = axum::Router::new()
            .route("/v1/jobs", post(submit_jobs))
            .route("/v1/jobs/{id}", get(get_job))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .route("/openapi.json", get(openapi))
            .layer(DefaultBodyLimit::max(body_limit))
            .with_state(shared.clone());
        let mut tasks = JoinSet::new();
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
enum Sent {
    /// Every job is in this JobDB.
    Stored,
    /// Nothing was stored (the reason, for the log and a final `failed`).
    Refused(String),
    /// The jobs may or may not be stored in the JobDB.
    Unknown(String),
}

/// Submit jobs through the router.
async fn submit_jobs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if shared.stopping.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    let caller = crate::rpc::caller_of(shared.settings.auth.as_deref(), &headers)?;
    let body = crate::rpc::request_body(body, &shared.settings.intake)?;
    let (jobs, scheduled) =
        crate::rpc::check_submission(&body, &shared.settings.intake, || shared.next_id())?;
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

    // Forward what was claimed (or has no key), one forward per bucket (and per ordered
    // sequence, which has a Director of its own in the bucket's shard), concurrently.
    let mut by_bucket: HashMap<(Arc<str>, Option<crate::job::Seq>), Vec<usize>> = HashMap::new();
    for (i, r) in routed.iter().enumerate() {
        if r.result.is_none() {
            by_bucket
                .entry((r.job.bucket.clone(), r.job.seq()))
                .or_default()
                .push(i);
        }
    }
    let outcomes = futures::future::join_all(by_bucket.into_values().map(|members| {
        let shared = shared.clone();
        let jobs: Vec<Arc<Job>> = members.iter().map(|&i| routed[i].job.clone()).collect();
        let firsts: Vec<DateTime<Utc>> = members.iter().map(|&i| routed[i].first_at).collect();
        let claims: Vec<Claim> = members.iter().filter_map(|&i| routed[i].claim).collect();
        async move {
            let sent = forward(&shared, (&jobs, &firsts), &claims, claimed_at).await;
            (members, sent)
        }
    }))
    .await;

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
                Sent::Refused(why) => {
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

/// Claims the keys of `routed`, filling in the result of every job that is not to be
/// forwarded (a duplicate, or a key still pending elsewhere after `pending_wait`).
async fn claim_keys(shared: &Shared, routed: &mut [Routed]) -> Result<(), ApiError> {
    let batch_ids: std::collections::HashSet<JobId> = routed.iter().map(|r| r.job.id).collect();
    let mut open: Vec<usize> = (0..routed.len())
        .filter(|&i| routed[i].claim.is_some())
        .collect();
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    while !open.is_empty() {
        let claims: Vec<Claim> = open.iter().filter_map(|&i| routed[i].claim).collect();
        let outcomes = shared.dedup.claim(&claims).await.map_err(|e| {
            tracing::warn!(error = %e, "router: dedup claim failed");
            ApiError::Unavailable("the dedup store is unavailable; nothing was stored".into())
        })?;
        shared
            .metrics
            .claim_seconds
            .observe(started.elapsed().as_secs_f64());
        let waited_enough = started.elapsed() >= shared.settings.pending_wait;
        let mut still = Vec::new();
        let mut lapsed: Vec<(usize, JobId)> = Vec::new();
        for (&i, outcome) in open.iter().zip(outcomes) {
            let r = &mut routed[i];
            match outcome {
                ClaimOutcome::Lapsed { owner } => lapsed.push((i, owner)),
                ClaimOutcome::Claimed | ClaimOutcome::Mine => {}
                ClaimOutcome::Duplicate {
                    owner,
                    confirmed: true,
                } => r.result = Some(r.answer(JobStatus::Duplicate, owner, None)),
                // Held by another job of this very request: settled once that one is.
                ClaimOutcome::Duplicate { owner, .. } if batch_ids.contains(&owner) => {
                    r.result = Some(r.answer(JobStatus::Duplicate, owner, None))
                }
                ClaimOutcome::Duplicate { owner, .. } if waited_enough => {
                    r.result = Some(
                        r.answer(
                            JobStatus::Pending,
                            owner,
                            Some(
                                "another submission of this key is being stored; submit again \
                             later with the same key"
                                    .into(),
                            ),
                        ),
                    )
                }
                ClaimOutcome::Duplicate { .. } => still.push(i),
            }
        }
        // Lapsed claims: their router stopped before confirming, perhaps after storing the job.
        for (i, holder) in lapsed {
            let r = &mut routed[i];
            let Some(claim) = r.claim else { continue };
            match holder_stored(shared, holder).await {
                Holder::Stored => {
                    // Finish the dead router's work: the key is the stored job's.
                    let holder_claim = Claim {
                        owner: holder,
                        ..claim
                    };
                    match shared.dedup.confirm(&[holder_claim]).await {
                        Ok(_) => r.result = Some(r.answer(JobStatus::Duplicate, holder, None)),
                        Err(_) => still.push(i),
                    }
                }
                Holder::Absent => match shared.dedup.take_over(&[claim]).await {
                    Ok(o) if matches!(o[..], [ClaimOutcome::Claimed | ClaimOutcome::Mine]) => {}
                    Ok(_) | Err(_) => still.push(i),
                },
                Holder::Unknown(why) if waited_enough => {
                    r.result = Some(r.answer(
                        JobStatus::Pending,
                        holder,
                        Some(format!(
                            "an earlier submission of this key (job {holder}) may have been \
                             stored and cannot be checked now ({why}); submit again later"
                        )),
                    ))
                }
                Holder::Unknown(_) => still.push(i),
            }
        }
        open = still;
        if !open.is_empty() {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }
    Ok(())
}

/// Whether the job holding a lapsed claim was stored.
enum Holder {
    Stored,
    Absent,
    Unknown(String),
}

/// Looks for `holder` in every live JobDB. It is absent only if every healthy Director answers
/// 404, every active JobDB has one of them, and no JobDB left service since the job was made
/// (it could have been stored there, and delivered or moved since).
async fn holder_stored(shared: &Shared, holder: JobId) -> Holder {
    let records = match crate::registry::inventory::Inventory::new(shared.consul.clone())
        .list()
        .await
    {
        Ok(records) => records,
        Err(e) => return Holder::Unknown(format!("inventory unreadable: {e}")),
    };
    let made = DateTime::<Utc>::from_timestamp_millis(holder.0.timestamp_ms() as i64)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
        - chrono::Duration::seconds(60);
    let directors = shared.directors.all();
    for listed in &records {
        use crate::registry::inventory::JobDbState as S;
        let record = &listed.record;
        let unseen = match record.state {
            S::Active => !directors.iter().any(|d| d.jobdb == record.name),
            S::Retiring | S::Draining | S::Drained | S::Dropped => record.changed_at >= made,
            S::Spare => false,
        };
        if unseen {
            return Holder::Unknown(format!("jobdb {} cannot be searched", record.name));
        }
    }
    let holder = holder.to_string();
    let lookups = directors.iter().map(|d| {
        let holder = &holder;
        async move { shared.director_client(d)?.job(holder).await }
    });
    let mut absent = true;
    for answer in futures::future::join_all(lookups).await {
        match answer {
            Ok(_) => return Holder::Stored,
            Err(e) if e.status() == Some(404) => {}
            Err(_) => absent = false,
        }
    }
    if absent {
        Holder::Absent
    } else {
        Holder::Unknown("a director did not answer".into())
    }
}

/// Confirms the claims of stored jobs and releases those of jobs certainly not stored.
async fn settle_claims(shared: &Shared, confirm: &[Claim], release: &[Claim]) {
    if !confirm.is_empty() {
        let mut attempt = 0;
        loop {
            match shared.dedup.confirm(confirm).await {
                Ok(outcomes) => {
                    for (claim, outcome) in confirm.iter().zip(outcomes) {
                        if let ConfirmOutcome::Lost { owner } = outcome {
                            shared.metrics.dedup_lost.inc();
                            tracing::error!(
                                job = %claim.owner, holder = %owner,
                                "router: stored job's key is held by another job (pending_ttl too short?)"
                            );
                        }
                    }
                    break;
                }
                Err(e) if attempt < 5 => {
                    attempt += 1;
                    tracing::warn!(error = %e, attempt, "router: confirming claims failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(e) => {
                    shared.metrics.confirm_failures.inc_by(confirm.len() as u64);
                    tracing::error!(error = %e, jobs = confirm.len(),
                        "router: could not confirm claims of stored jobs; they stay pending");
                    break;
                }
            }
        }
    }
    if !release.is_empty() {
        if let Err(e) = shared.dedup.release(release).await {
            // They lapse after pending_ttl anyway.
            tracing::warn!(error = %e, "router: releasing claims failed");
        }
    }
}

/// Forwards one bucket's jobs (of one ordered sequence, or unordered): to its shard's
/// Directors in turn until one stores them, or, when an outcome is unknown, to the same JobDB
/// until it answers.
async fn forward(
    shared: &Shared,
    jobs: Outbound<'_>,
    claims: &[Claim],
    claimed_at: DateTime<Utc>,
) -> Sent {
    let bucket = &jobs.0[0].bucket;
    let seq = jobs.0[0].seq();
    let mut claimed_at = claimed_at;
    let mut tried: Vec<String> = Vec::new();
    let mut last_refusal = String::from("no healthy director");
    loop {
        let Some(director) = shared
            .directors
            .candidates(bucket, seq.as_ref(), &tried)
            .into_iter()
            .next()
        else {
            return Sent::Refused(last_refusal);
        };
        if !refresh_claims(shared, claims, &mut claimed_at).await {
            return Sent::Refused("the dedup store is unavailable".into());
        }
        match send(shared, &director, jobs, claims, claimed_at).await {
            Sent::Stored => return Sent::Stored,
            Sent::Refused(why) => {
                tracing::debug!(director = director.id, why, "router: forward refused");
                shared.directors.suspect(&director.id);
                tried.push(director.id);
                last_refusal = why;
            }
            Sent::Unknown(why) => {
                tracing::warn!(
                    director = director.id,
                    jobdb = director.jobdb,
                    why,
                    "router: forward outcome unknown; re-sending to the same jobdb"
                );
                shared.directors.suspect(&director.id);
                return resolve(shared, &director.jobdb, jobs, claims, claimed_at, why).await;
            }
        }
    }
}

/// Re-sends jobs whose forward to `jobdb` had an unknown outcome, to whichever Director owns
/// that JobDB now, until one answers for sure or `resolve_for` passes.
async fn resolve(
    shared: &Shared,
    jobdb: &str,
    jobs: Outbound<'_>,
    claims: &[Claim],
    mut claimed_at: DateTime<Utc>,
    mut why: String,
) -> Sent {
    let started = Instant::now();
    while started.elapsed() < shared.settings.resolve_for {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Err(e) = shared.directors.refresh(&shared.consul).await {
            tracing::debug!(error = %e, "router: catalog read failed while resolving");
        }
        let Some(owner) = shared.directors.owner_of(jobdb) else {
            continue;
        };
        // Keep the claims alive while the JobDB changes hands; a claim that was lost meanwhile
        // cannot be re-sent (its `not_after` would be refused anyway).
        if !refresh_claims(shared, claims, &mut claimed_at).await {
            continue;
        }
        match send(shared, &owner, jobs, claims, claimed_at).await {
            Sent::Stored => return Sent::Stored,
            // Only `Stored` settles it (it counts jobs the first forward stored as present).
            Sent::Refused(r) | Sent::Unknown(r) => why = r,
        }
    }
    shared.metrics.forward("unresolved");
    Sent::Unknown(why)
}

/// Re-claims (which refreshes the deadline of) claims older than a quarter of `pending_ttl`.
/// `false` when the store cannot be reached or a claim was taken by another job.
async fn refresh_claims(shared: &Shared, claims: &[Claim], claimed_at: &mut DateTime<Utc>) -> bool {
    if claims.is_empty() {
        *claimed_at = Utc::now();
        return true;
    }
    let quarter = shared.dedup.config().pending_ttl / 4;
    let age = (Utc::now() - *claimed_at).to_std().unwrap_or_default();
    if age < quarter {
        return true;
    }
    let now = Utc::now();
    match shared.dedup.refresh(claims).await {
        Ok(outcomes) => {
            if outcomes
                .iter()
                .all(|o| matches!(o, ClaimOutcome::Claimed | ClaimOutcome::Mine))
            {
                *claimed_at = now;
                true
            } else {
                tracing::warn!("router: a claim lapsed and was taken before its job was stored");
                false
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "router: refreshing claims failed");
            false
        }
    }
}

/// The jobs of one forward, with when each may first be attempted (side by side).
type Outbound<'a> = (&'a [Arc<Job>], &'a [DateTime<Utc>]);

/// One forward request to a Director.
async fn send(
    shared: &Shared,
    director: &DirectorEntry,
    jobs: Outbound<'_>,
    claims: &[Claim],
    claimed_at: DateTime<Utc>,
) -> Sent {
    let request = ImportRequest {
        jobdb: director.jobdb.clone(),
        from_jobdb: None,
        not_after: (!claims.is_empty()).then(|| shared.not_after(claimed_at)),
        jobs: jobs
            .0
            .iter()
            .zip(jobs.1)
            .map(|(job, first_at)| import_job(job, 0, *first_at))
            .collect(),
    };
    let sent = match shared.director_client(director) {
        Err(e) => Sent::Refused(format!("director {}: {e}", director.id)),
        Ok(client) => match client.import(&request).await {
            Ok(r) if r.imported + r.already_present == jobs.0.len() => Sent::Stored,
            Ok(r) => Sent::Unknown(format!(
                "director {} stored {} of {} jobs",
                director.id,
                r.imported + r.already_present,
                jobs.0.len()
            )),
            Err(e) if e.is_connect() => {
                Sent::Refused(format!("director {} unreachable", director.id))
            }
            // 409, 503 and other 4xx: the Director stored nothing.
            Err(e) if e.stored_nothing() => Sent::Refused(format!("director {}: {e}", director.id)),
            // Timeout, reset, 500, an answer not understood: maybe stored.
            Err(e) => Sent::Unknown(format!("director {}: {e}", director.id)),
        },
    };
    shared.metrics.forward(match sent {
        Sent::Stored => "stored",
        Sent::Refused(_) => "refused",
        Sent::Unknown(_) => "unknown",
    });
    sent
}

/// A job's trace, from whichever Director's JobDB holds it.
async fn get_job(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    crate::rpc::caller_of(shared.settings.auth.as_deref(), &headers)?;
    let id = crate::rpc::parse_job_id(&id)?;
    let directors = shared.directors.all();
    let lookups = directors.iter().map(|d| {
        let mut call = shared.http.get(format!("{}/v1/jobs/{id}", d.base));
        if let Some(auth) = headers.get(header::AUTHORIZATION) {
            call = call.header(header::AUTHORIZATION, auth.clone());
        }
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

/// The Director's document without what only Directors serve (`/v1/import`, and
/// `/v1/endpoints`: each Director's own view of its endpoints).
pub fn openapi_document() -> Result<String, serde_json::Error> {
    let mut doc: serde_json::Value =
        serde_json::from_str(&crate::director::http::openapi_document()?)?;
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        paths.remove("/v1/import");
        paths.remove("/v1/endpoints");
    }
    doc["info"]["description"] = serde_json::Value::String(
        "Database-as-a-queue HTTP delivery engine: router RPC API (dedup by idempotency key, \
         forwarding to Directors)"
            .into(),
    );
    serde_json::to_string(&doc)
}

async fn openapi() -> Response {
    match openapi_document() {
        Ok(doc) => ([(header::CONTENT_TYPE, "application/json")], doc).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
