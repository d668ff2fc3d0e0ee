//! `spindle dashboard`: a web page on localhost, and the JSON API behind it, over every live
//! JobDB.
//!
//! - [`fleet`]: which JobDBs to read (`--jobdb`, and the Consul inventory), re-discovered
//!   periodically, each with a small pool; one that cannot be reached is shown as such.
//! - [`views`]: the JSON answers and how each is folded from every JobDB's rows.
//! - [`ledger`]: the conservation ledger of every JobDB of the fleet, by rounds
//!   (`spindle audit` uses the same), and its panel.
//! - `page.html`: the page, one self-contained file (vanilla JS drawing its own SVG charts;
//!   nothing is fetched from the internet), embedded at build time.
//!
//! Every panel asks every JobDB at once, each within the query timeout; a JobDB that fails or
//! is slow is listed in the answer's `unreachable`, and the others' numbers are still shown.
//! The SQL lives in [`crate::jobdb::stats`]. There is no authentication: the dashboard listens
//! on localhost by default, and shows no payloads or headers.

pub mod controls;
pub mod fleet;
pub mod ledger;
pub mod views;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::Utc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::delivery::error_chain;
use crate::job::JobId;
use crate::jobdb::{JobDb, JobDbError};
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::Inventory;
use crate::rpc::api::{ErrorBody, ErrorDetail};
use fleet::{Fleet, FleetError, Member};
use views::{
    Attempts, Endpoints, JobDbView, JobDbs, JobTrace, JobsListed, LaneRows, Overview, Traces,
    Unreachable, Window,
};

/// The page, embedded at build time.
const PAGE: &str = include_str!("page.html");
/// Most jobs a search by idempotency key returns per JobDB (a key is meant to be unique per
/// bucket; more than this means a producer reuses keys).
const MAX_JOBS_PER_KEY: u32 = 50;

/// What the dashboard reads and where it listens. Its `Debug` shows the JobDB URLs without
/// passwords.
#[derive(Clone)]
pub struct DashboardConfig {
    /// Address of the page and the API.
    pub listen: SocketAddr,
    /// JobDB URLs to read (`mysql://user[:password]@host[:port]/database`).
    pub jobdbs: Vec<String>,
    /// Also read every JobDB of this Consul's inventory whose state is not `dropped`.
    pub consul: Option<ConsulClient>,
    /// How often the inventory is re-read and unreachable JobDBs are tried again.
    pub discover_every: Duration,
    /// Deadline of one JobDB's queries for one answer (and of opening it).
    pub query_timeout: Duration,
    /// Connections per JobDB.
    pub db_connections: u32,
    /// API tokens; with them the JSON API needs an admin token. `None`: open.
    pub auth: Option<Arc<crate::rpc::auth::TokenStore>>,
    /// The subscriptions (a control database), shown with their waiting jobs.
    pub subscriptions: Option<Arc<crate::events::Subscriptions>>,
    /// The Ledger panel's period: a round of every JobDB's ledger at most this often.
    pub ledger_every: Duration,
}

impl std::fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let jobdbs: Vec<String> = self
            .jobdbs
            .iter()
            .map(|u| crate::secret::redact_url(u))
            .collect();
        f.debug_struct("DashboardConfig")
            .field("listen", &self.listen)
            .field("jobdbs", &jobdbs)
            .field("consul", &self.consul)
            .field("discover_every", &self.discover_every)
            .field("query_timeout", &self.query_timeout)
            .field("db_connections", &self.db_connections)
            .finish()
    }
}

impl DashboardConfig {
    /// The defaults (`--discover-every-ms` 10 000, `--query-timeout-ms` 5 000, 2
    /// connections per JobDB, `--ledger-every-secs` 30), listening on `listen`, reading
    /// `jobdbs`.
    pub fn new(listen: SocketAddr, jobdbs: Vec<String>) -> Self {
        DashboardConfig {
            listen,
            jobdbs,
            consul: None,
            discover_every: Duration::from_secs(10),
            query_timeout: Duration::from_secs(5),
            db_connections: 2,
            auth: None,
            subscriptions: None,
            ledger_every: Duration::from_secs(30),
        }
    }
}

/// Why the dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// Neither `--jobdb` nor a registry: nothing to show.
    #[error("no jobdbs to show: give --jobdb (repeatable) or --registry consul")]
    NothingToShow,
    /// The list of JobDBs is wrong.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A running dashboard.
pub struct Dashboard {
    addr: SocketAddr,
    stop: CancellationToken,
    server: JoinHandle<()>,
    discovery: JoinHandle<()>,
    fleet: Arc<Fleet>,
}

impl Dashboard {
    /// The bound address (the port is chosen by the OS when the config said 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and discovering, waits for both, and closes every JobDB pool.
    pub async fn stop(self) {
        self.stop.cancel();
        if let Err(e) = self.server.await {
            tracing::warn!(error = %e, "dashboard server task failed");
        }
        if let Err(e) = self.discovery.await {
            tracing::warn!(error = %e, "dashboard discovery task failed");
        }
        self.fleet.close().await;
    }
}

/// Starts the dashboard: binds, discovers the JobDBs once (so the first request sees them),
/// then serves and re-discovers every `discover_every` until [`Dashboard::stop`].
pub async fn serve(config: DashboardConfig) -> Result<Dashboard, DashboardError> {
    if config.jobdbs.is_empty() && config.consul.is_none() {
        return Err(DashboardError::NothingToShow);
    }
    let consul = config.consul.clone();
    let fleet = Arc::new(Fleet::new(
        &config.jobdbs,
        config.consul.map(Inventory::new),
        config.db_connections,
        config.query_timeout,
    )?);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| DashboardError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| DashboardError::Bind {
            addr: config.listen,
            source,
        })?;
    fleet.refresh().await;

    let stop = CancellationToken::new();
    let metrics = Arc::new(crate::metrics::Metrics::default());
    count_jobdbs(&fleet, &metrics);
    let discovery = tokio::spawn(discover(
        fleet.clone(),
        metrics.clone(),
        config.discover_every,
        stop.clone(),
    ));
    let app = router(AppState {
        metrics: metrics.clone(),
        fleet: fleet.clone(),
        query_timeout: config.query_timeout,
        consul,
        auth: config.auth.clone(),
        subscriptions: config.subscriptions.clone(),
        ledger: Arc::new(tokio::sync::Mutex::new(ledger::Panel::new(
            config.ledger_every,
        ))),
    });
    let shutdown = stop.clone();
    let server = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "dashboard server failed");
        }
    });
    tracing::info!(addr = %addr, jobdbs = fleet.members().len(), "dashboard at http://{addr}/");
    Ok(Dashboard {
        addr,
        stop,
        server,
        discovery,
        fleet,
    })
}

/// The discovery task: a round every `every` until `stop`.
async fn discover(
    fleet: Arc<Fleet>,
    metrics: Arc<crate::metrics::Metrics>,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {
                fleet.refresh().await;
                count_jobdbs(&fleet, &metrics);
            }
        }
    }
}

/// Sets the JobDB gauges from the fleet's last round.
fn count_jobdbs(fleet: &Fleet, metrics: &crate::metrics::Metrics) {
    let members = fleet.members();
    let reachable = members.iter().filter(|m| m.db.is_some()).count();
    for (label, n) in [("true", reachable), ("false", members.len() - reachable)] {
        metrics
            .dashboard_jobdbs
            .get_or_create(&crate::metrics::ReachLabels { reachable: label })
            .set(n as i64);
    }
}

/// What the handlers share.
#[derive(Clone)]
struct AppState {
    /// The dashboard's own metrics (`/metrics`).
    metrics: Arc<crate::metrics::Metrics>,
    fleet: Arc<Fleet>,
    query_timeout: Duration,
    /// Where endpoint controls live (`None`: they cannot be set here).
    consul: Option<ConsulClient>,
    /// API tokens; `None`: the API is open.
    auth: Option<Arc<crate::rpc::auth::TokenStore>>,
    /// The subscriptions, when a control database is given.
    subscriptions: Option<Arc<crate::events::Subscriptions>>,
    /// The Ledger panel's trackers and last round.
    ledger: ledger::Shared,
}

/// The page and its API; with tokens, every API route needs an admin token (the page itself
/// holds no data).
fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/overview", get(overview))
        .route("/api/endpoints", get(endpoints))
        .route("/api/attempts", get(attempts))
        .route("/api/jobdbs", get(jobdbs))
        .route("/api/ledger", get(ledger::ledger))
        .route(
            "/api/subscriptions",
            get(subscriptions).post(controls::post_subscription),
        )
        .route("/api/jobs", get(jobs_by_key))
        .route("/api/jobs/{id}", get(job_by_id))
        .route("/api/list", get(list_jobs))
        .route(
            "/api/controls",
            get(controls::get_controls).post(controls::post_controls),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_admin,
        ))
        .route("/", get(page))
        .with_state(state.clone())
        .merge(crate::rpc::metrics_router(state.metrics.clone()))
        .fallback(|| async { QueryError::NotFound("no such page or api".into()) })
}

/// The API's token check (see [`controls::check_admin`]).
async fn require_admin(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match controls::check_admin(&state, request.headers()) {
        Ok(caller) => {
            state.metrics.dashboard_requests.inc();
            // Handlers that record who acted read it here: the token is checked (and its
            // rate limit charged) once per request.
            let mut request = request;
            request.extensions_mut().insert(controls::ApiCaller(caller));
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

/// An API request that cannot be answered: `{"error": {"code", "message", "field"}}`, as the
/// Director's RPC answers.
#[derive(Debug, thiserror::Error)]
enum QueryError {
    /// A query parameter or path segment is missing or malformed (400, naming it).
    #[error("{message}")]
    BadParameter {
        /// The parameter.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A listing's parameter is invalid (422, naming it).
    #[error("{}: {}", .0.field, .0.message)]
    BadFilter(crate::rpc::api::FieldError),
    /// Nothing found (404).
    #[error("{0}")]
    NotFound(String),
    /// No valid bearer token (401).
    #[error("a valid api token is required (Authorization: Bearer <token>)")]
    Unauthenticated,
    /// The token may not do this (403).
    #[error("{0}")]
    Forbidden(String),
    /// A service behind the dashboard is missing or failing (503).
    #[error("{0}")]
    Unavailable(String),
}

impl IntoResponse for QueryError {
    fn into_response(self) -> Response {
        let (status, code, field) = match &self {
            QueryError::BadParameter { field, .. } => {
                (StatusCode::BAD_REQUEST, "invalid_parameter", Some(*field))
            }
            QueryError::BadFilter(e) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_field",
                Some(e.field.as_str()),
            ),
            QueryError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", None),
            QueryError::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated", None),
            QueryError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", None),
            QueryError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", None),
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_owned(),
                message: self.to_string(),
                field: field.map(str::to_owned),
            },
        };
        (status, Json(body)).into_response()
    }
}

/// `GET /`: the page. Never cached, so a new binary's page shows at once.
async fn page() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Html(PAGE))
}

/// The value of query parameter `name`, if given.
fn param(query: &Option<String>, name: &str) -> Option<String> {
    let query = query.as_deref()?;
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// `?minutes=` (1 to a day), if given.
fn minutes(query: &Option<String>) -> Result<Option<u32>, QueryError> {
    let Some(value) = param(query, "minutes") else {
        return Ok(None);
    };
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|m| (1..=views::MAX_MINUTES).contains(m))
        .map(Some)
        .ok_or_else(|| QueryError::BadParameter {
            field: "minutes",
            message: format!(
                "minutes must be a whole number from 1 to {}, not {value:?}",
                views::MAX_MINUTES
            ),
        })
}

/// The charts' window: `?minutes=`, or when absent the one that fits the data of the JobDBs
/// that answer ([`views::fitted_minutes`]; the panels name the others).
async fn window(app: &AppState, query: &Option<String>) -> Result<Window, QueryError> {
    let now = Utc::now();
    if let Some(m) = minutes(query)? {
        return Ok(Window::ending_at(now, m));
    }
    let (firsts, _) = across(&app.fleet.members(), app.query_timeout, |db| async move {
        db.first_job_at().await
    })
    .await;
    let first = firsts.into_iter().filter_map(|(_, f)| f).min();
    Ok(Window::ending_at(now, views::fitted_minutes(now, first)))
}

/// Runs `query` on every reachable JobDB at once, each within `timeout`: the answers with their
/// JobDB's name, and the JobDBs that could not answer (unreachable ones included).
async fn across<T, F, Fut>(
    members: &[Member],
    timeout: Duration,
    query: F,
) -> (Vec<(String, T)>, Vec<Unreachable>)
where
    F: Fn(JobDb) -> Fut,
    Fut: Future<Output = Result<T, JobDbError>>,
{
    let mut unreachable = Vec::new();
    let mut asked = Vec::new();
    for m in members {
        match &m.db {
            Some(db) => asked.push((
                m.name.clone(),
                tokio::time::timeout(timeout, query(db.clone())),
            )),
            None => unreachable.push(Unreachable {
                name: m.name.clone(),
                error: m.error.clone().unwrap_or_else(|| "not opened yet".into()),
            }),
        }
    }
    let answers = futures::future::join_all(
        asked
            .into_iter()
            .map(|(name, answer)| async move { (name, answer.await) }),
    )
    .await;
    let mut out = Vec::with_capacity(answers.len());
    for (name, answer) in answers {
        let error = match answer {
            Ok(Ok(value)) => {
                out.push((name, value));
                continue;
            }
            Ok(Err(e)) => error_chain(&e),
            Err(_) => format!("no answer within {} ms", timeout.as_millis()),
        };
        tracing::warn!(jobdb = %name, %error, "jobdb query failed");
        unreachable.push(Unreachable { name, error });
    }
    (out, unreachable)
}

/// `GET /api/overview?minutes=N`: transitions by state over time, and jobs by current state.
async fn overview(
    State(app): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Overview>, QueryError> {
    let window = window(&app, &query).await?;
    let (answers, unreachable) = across(&app.fleet.members(), app.query_timeout, |db| async move {
        tokio::try_join!(
            db.transitions_per_slot(window.start, window.slot_s),
            db.count_by_state()
        )
    })
    .await;
    let jobdbs = answers.len();
    let (per_slot, current): (Vec<_>, Vec<_>) = answers.into_iter().map(|(_, a)| a).unzip();
    Ok(Json(Overview::fold(
        &window,
        per_slot.into_iter().flatten(),
        current,
        jobdbs,
        unreachable,
    )))
}

/// `GET /api/endpoints?minutes=N`: per lane, backlog, outcomes, latency and last error.
async fn endpoints(
    State(app): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Endpoints>, QueryError> {
    let window = window(&app, &query).await?;
    let (answers, unreachable) = across(&app.fleet.members(), app.query_timeout, |db| async move {
        let (backlog, attempts, slots, errors) = tokio::try_join!(
            db.lane_backlog(),
            db.lane_attempts(window.start),
            db.lane_slots(window.start, window.slot_s),
            db.lane_errors(window.start)
        )?;
        Ok(LaneRows {
            backlog,
            attempts,
            slots,
            errors,
        })
    })
    .await;
    let jobdbs = answers.len();
    Ok(Json(Endpoints::fold(
        &window,
        answers.into_iter().map(|(_, rows)| rows),
        jobdbs,
        unreachable,
    )))
}

/// `GET /api/attempts`: succeeded jobs by the attempts they took.
async fn attempts(State(app): State<AppState>) -> Json<Attempts> {
    let (answers, unreachable) = across(&app.fleet.members(), app.query_timeout, |db| async move {
        db.succeeded_by_attempts().await
    })
    .await;
    let jobdbs = answers.len();
    Json(Attempts::fold(
        answers.into_iter().flat_map(|(_, rows)| rows),
        jobdbs,
        unreachable,
    ))
}

/// `GET /api/subscriptions`: every subscription (no secrets) with its unfinished jobs over the
/// reachable JobDBs.
async fn subscriptions(State(app): State<AppState>) -> Json<views::SubscriptionsView> {
    let Some(cache) = app.subscriptions.clone() else {
        return Json(views::SubscriptionsView::default());
    };
    let members = app.fleet.members();
    let (answers, unreachable) = across(&members, app.query_timeout, |db| async move {
        db.waiting_by_subscription().await
    })
    .await;
    let mut waiting: std::collections::HashMap<ulid::Ulid, u64> = Default::default();
    for (_, counts) in answers {
        for (id, n) in counts {
            *waiting.entry(id).or_default() += n;
        }
    }
    let subscriptions = cache
        .index()
        .all()
        .iter()
        .map(|s| views::SubscriptionRow {
            waiting: waiting.get(&s.id).copied().unwrap_or(0),
            subscription: s.view(false),
        })
        .collect();
    Json(views::SubscriptionsView {
        configured: true,
        subscriptions,
        unreachable,
    })
}

/// `GET /api/jobdbs`: every JobDB with its inventory state, age, size, owner and whether it
/// answers.
async fn jobdbs(State(app): State<AppState>) -> Json<JobDbs> {
    let members = app.fleet.members();
    let (answers, unreachable) = across(&members, app.query_timeout, |db| async move {
        tokio::try_join!(
            db.size(),
            db.created_at(),
            db.owner_record(),
            db.ordering_counts(),
            db.notices_owed()
        )
    })
    .await;
    let now = Utc::now();
    let jobdbs = members
        .iter()
        .map(|m| {
            let mut view = JobDbView {
                name: m.name.clone(),
                url: m.url.clone(),
                state: m.inventory.as_ref().map(|i| i.state),
                state_since: m.inventory.as_ref().map(|i| i.changed_at),
                state_changed_by: m.inventory.as_ref().map(|i| i.changed_by.clone()),
                lock_holder: m.inventory.as_ref().and_then(|i| i.lock_holder.clone()),
                ..JobDbView::default()
            };
            if let Some((_, (size, created_at, owner, ordering, owed))) =
                answers.iter().find(|(n, _)| *n == m.name)
            {
                view.ordered_waiting = Some(ordering.held);
                view.ordering_blocked = Some(ordering.blocked);
                view.ordered_behind_scheduled = Some(ordering.behind_scheduled);
                view.notices_owed = Some(*owed);
                view.reachable = true;
                view.created_at = *created_at;
                view.age_s = created_at.map(|at| (now - at).num_seconds());
                view.rows = Some(size.rows);
                view.bytes = Some(size.bytes);
                view.owner = Some(owner.holder.clone());
                view.fencing_token = Some(owner.fencing_token);
                view.owner_since = owner.acquired_at;
            } else {
                view.error = unreachable
                    .iter()
                    .find(|u| u.name == m.name)
                    .map(|u| u.error.clone());
            }
            view
        })
        .collect();
    Json(JobDbs {
        discovery: if app.fleet.uses_registry() {
            "consul"
        } else {
            "static"
        }
        .to_owned(),
        registry_error: app.fleet.registry_error(),
        jobdbs,
    })
}

/// `GET /api/jobs/{id}`: the job (ULID or 32 hex digits) in every JobDB that holds it.
async fn job_by_id(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Traces>, QueryError> {
    let job_id: JobId =
        id.trim()
            .parse()
            .map_err(|e: crate::job::InvalidJobId| QueryError::BadParameter {
                field: "id",
                message: format!("{e}, not {id:?}"),
            })?;
    let traces = search(&app, "id", job_id.to_string(), move |db| async move {
        traces_of(&db, &[job_id]).await
    })
    .await;
    if traces.traces.is_empty() {
        let mut message = format!("no job {job_id} in the {} jobdbs searched", traces.jobdbs);
        if !traces.unreachable.is_empty() {
            let names: Vec<&str> = traces.unreachable.iter().map(|u| u.name.as_str()).collect();
            message.push_str(&format!(
                " ({} could not be searched: {})",
                names.len(),
                names.join(", ")
            ));
        }
        return Err(QueryError::NotFound(message));
    }
    Ok(Json(traces))
}

/// `GET /api/jobs?idempotency_key=K`: the jobs submitted with that key, in every JobDB.
async fn jobs_by_key(
    State(app): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Traces>, QueryError> {
    let key = param(&query, "idempotency_key")
        .filter(|k| !k.is_empty())
        .ok_or(QueryError::BadParameter {
            field: "idempotency_key",
            message: "give ?idempotency_key= (or search by id at /api/jobs/{id})".into(),
        })?;
    let searched = key.clone();
    Ok(Json(
        search(&app, "idempotency_key", key, move |db| {
            let key = searched.clone();
            async move {
                let ids = db.jobs_with_idempotency_key(&key, MAX_JOBS_PER_KEY).await?;
                traces_of(&db, &ids).await
            }
        })
        .await,
    ))
}

/// `GET /api/list?…`: a page of jobs of every JobDB, with the filters and cursor of
/// `GET /v1/jobs` ([`crate::rpc::listing`]), naming the JobDBs that did not answer (the page
/// goes on without their jobs).
async fn list_jobs(
    State(app): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<JobsListed>, QueryError> {
    use crate::rpc::listing::{self, Page};
    let query = listing::parse_job_query(query.as_deref()).map_err(QueryError::BadFilter)?;
    let filter = query.filter.clone();
    let (answers, unreachable) = across(&app.fleet.members(), app.query_timeout, |db| {
        let filter = filter.clone();
        async move {
            db.list_jobs(&filter, query.after.map(|a| a.0), query.limit)
                .await
        }
    })
    .await;
    let pages = answers
        .into_iter()
        .map(|(_, page)| Page {
            items: page
                .jobs
                .iter()
                .map(|(job, history)| crate::rpc::api::describe(job, history))
                .collect(),
            next_after: page.next_after,
        })
        .collect();
    Ok(Json(JobsListed {
        list: listing::merge_job_pages(pages, query.filter.order, query.limit),
        unreachable,
    }))
}

/// Runs a job search on every JobDB and gathers the traces, oldest job first.
async fn search<F, Fut>(app: &AppState, by: &str, value: String, find: F) -> Traces
where
    F: Fn(JobDb) -> Fut,
    Fut: Future<Output = Result<Vec<JobTraceParts>, JobDbError>>,
{
    let (answers, unreachable) = across(&app.fleet.members(), app.query_timeout, find).await;
    let jobdbs = answers.len();
    let mut traces: Vec<JobTrace> = answers
        .into_iter()
        .flat_map(|(jobdb, found)| {
            found
                .into_iter()
                .map(move |(summary, history)| JobTrace::new(&jobdb, &summary, &history))
        })
        .collect();
    traces.sort_by(|a, b| {
        let (a, b) = (&a.job, &b.job);
        (a.created_at, &a.id, a.transitions.first().map(|t| t.time)).cmp(&(
            b.created_at,
            &b.id,
            b.transitions.first().map(|t| t.time),
        ))
    });
    Traces {
        by: by.to_owned(),
        value,
        traces,
        jobdbs,
        unreachable,
    }
}

/// A job's row and its history in one JobDB.
type JobTraceParts = (
    crate::jobdb::stats::JobSummary,
    Vec<(u64, crate::job::Transition)>,
);

/// The rows and histories of these jobs in `db` (those it holds).
async fn traces_of(db: &JobDb, ids: &[JobId]) -> Result<Vec<JobTraceParts>, JobDbError> {
    let summaries = db.job_summaries(ids).await?;
    if summaries.is_empty() {
        return Ok(Vec::new());
    }
    let found: Vec<JobId> = summaries.iter().map(|s| s.job.id).collect();
    let mut histories = db.histories_of(&found).await?;
    Ok(summaries
        .into_iter()
        .map(|s| {
            let history = histories.remove(&s.job.id).unwrap_or_default();
            (s, history)
        })
        .collect())
}
