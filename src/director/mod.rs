//! The Director: owns one JobDB, accepts jobs over RPC, delivers them, records every transition.
//!
//! Start-up, in order: open the JobDB (create and migrate it if needed, refuse a schema this
//! binary does not know), take its lock (MySQL `GET_LOCK` until the Consul registry lands),
//! bump the fencing token, recover every unfinished job, then serve RPC.
//!
//! Running, three tasks cooperate through channels: RPC handlers and the scheduler send work to
//! the [`writer`] (the only JobDB writer, group commit; what they send is [`mailbox`]'s),
//! which hands durable jobs to the [`scheduler`] (cache, lanes, timers), which starts
//! deliveries. Which ordered job may go is the [`ordering`] part's to decide: the writer asks
//! it for each write's plan, and its sequencer task moves what the writer's commits cannot.
//!
//! Shutdown (SIGTERM, or lock loss): stop intake, let RPC requests in progress finish, stop
//! starting attempts and wait for those in flight (bounded), flush their transitions, release
//! the lock. A lost lock does the same but every write is refused, and the Director exits
//! with an error so its supervisor can restart it.

pub mod archiving;
pub mod breaker;
pub mod campaign;
pub mod commands;
pub mod http;
pub mod mailbox;
pub mod ordering;
pub mod parks;
pub mod reads;
pub mod scheduler;
pub mod supervise;
pub mod writer;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::archiver::Archiver;
use crate::delivery::{Deliverer, DeliveryConfig};
use crate::job::{AttemptRecord, State, Transition};
use crate::jobdb::{JobDb, JobDbError, JobDbUrl};
use crate::metrics::Metrics;
use crate::registry::lease::{self, Lease};
use crate::rpc::api::IntakeLimits;
use archiving::ThroughWriter;
use http::RpcState;
use mailbox::WriteOp;
use ordering::book::Book;
use ordering::plan::Mode;
use ordering::{sequencer, survey, Ordering};
use scheduler::{Scheduler, SchedulerLimits};
use writer::{Writer, WriterLimits};

/// How long the scheduler or the sequencer may be in one step of its loop before the watchdog
/// counts it stalled (the Director not ready). A step is milliseconds; one that waits this long
/// waits for the writer (then the JobDB is not writable either) or is stuck.
const STEP_STALL_AFTER: Duration = Duration::from_secs(10);

/// Everything a Director needs to run, validated.
#[derive(Clone, Debug)]
pub struct DirectorConfig {
    /// RPC listen address (port 0 picks a free one).
    pub listen: SocketAddr,
    /// The JobDB this Director owns.
    pub jobdb: JobDbUrl,
    /// Create the database if it does not exist.
    pub create_database: bool,
    /// Name recorded as the JobDB's holder (host and pid by default).
    pub holder: String,
    /// Connections to the JobDB.
    pub db_max_connections: u32,
    /// How often the JobDB lock is confirmed.
    pub lock_check_interval: Duration,
    /// Delivery concurrency and backoff bounds.
    pub scheduler: SchedulerLimits,
    /// Group commit bounds.
    pub writer: WriterLimits,
    /// HTTP client settings.
    pub delivery: DeliveryConfig,
    /// Limits and defaults of submitted jobs.
    pub intake: IntakeLimits,
    /// API tokens; `None` leaves the RPC API open.
    pub auth: Option<Arc<crate::rpc::auth::TokenStore>>,
    /// Where expired jobs are archived; `None` leaves them `archiving` for a drainer.
    pub archive: Option<crate::archive::Archive>,
    /// Where endpoint and bucket controls are read (Consul); `None`: no controls.
    pub controls: Option<crate::registry::consul::ConsulClient>,
    /// The other live JobDBs an ordered job must not overtake (a cluster's inventory);
    /// `None`: this JobDB is the only one (ordering alone).
    pub peers: Option<survey::Peers>,
    /// How far the clocks of a cluster's Directors may disagree: an ordered job accepted at
    /// least this long before a complete read of the other JobDBs goes without reading them
    /// again (see `director::ordering::sequencer`).
    pub max_clock_skew: Duration,
    /// Most ordered jobs the writer's book holds; past it, sequences spill to the store (see
    /// `director::ordering::book`).
    pub book_limit: usize,
    /// The subscriptions events are published to (a cache of the control database); `None`:
    /// `/v1/events` and `/v1/subscriptions` answer 503. Set it with
    /// [`DirectorConfig::publish_to`], which also signs their jobs with their secrets.
    pub subscriptions: Option<Arc<crate::events::Subscriptions>>,
}

/// A Director's defaults, written once: [`DirectorConfig::new`] and the `spindle director`
/// flags both read them (the flags take durations in ms: [`defaults::ms`]).
pub mod defaults {
    use std::time::Duration;

    /// Connections to the JobDB.
    pub const DB_CONNECTIONS: u32 = 8;
    /// Attempts in flight at once.
    pub const MAX_IN_FLIGHT: usize = 1024;
    /// Requests in flight per endpoint.
    pub const ENDPOINT_CONCURRENCY: usize = 64;
    /// Attempts a lane may begin ahead of its commit.
    pub const START_WINDOW: usize = 16;
    /// Longest backoff between two attempts.
    pub const BACKOFF_CAP: Duration = Duration::from_secs(3600);
    /// How long a stopping Director waits for attempts in flight.
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    /// Jobs waiting this long keep only their metadata in memory.
    pub const SPILL_AFTER: Duration = Duration::from_secs(60);
    /// Payload bytes held in memory, in MiB.
    pub const MAX_CACHED_PAYLOAD_MIB: usize = 128;
    /// Jobs held in memory.
    pub const MAX_CACHED_JOBS: usize = 150_000;
    /// Attempts of one job at most.
    pub const MAX_ATTEMPTS: u16 = 1000;
    /// Shortest wait before a retry.
    pub const MIN_RETRY_DELAY: Duration = Duration::from_millis(100);
    /// Rows of one group commit at most.
    pub const WRITE_BATCH_ROWS: usize = 4000;
    /// A job accepted this long ago without a row of its own gets an `open_jobs` entry.
    pub const REST_AFTER: Duration = Duration::from_secs(30);
    /// Longest wait for one group commit.
    pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

    /// A duration in whole ms, for a flag's default.
    pub const fn ms(d: Duration) -> u64 {
        d.as_millis() as u64
    }
}

impl DirectorConfig {
    /// Publishes events to `subscriptions` and signs their jobs with their secrets.
    pub fn publish_to(&mut self, subscriptions: Arc<crate::events::Subscriptions>) {
        self.delivery.subscriptions = Some(subscriptions.clone());
        self.subscriptions = Some(subscriptions);
    }

    /// Defaults for a Director on `jobdb`, listening on `listen`.
    pub fn new(listen: SocketAddr, jobdb: JobDbUrl) -> Self {
        DirectorConfig {
            listen,
            jobdb,
            create_database: true,
            holder: default_holder(),
            db_max_connections: defaults::DB_CONNECTIONS,
            lock_check_interval: Duration::from_secs(1),
            scheduler: SchedulerLimits {
                max_in_flight: defaults::MAX_IN_FLIGHT,
                per_endpoint: defaults::ENDPOINT_CONCURRENCY,
                start_batch: 1024,
                start_window: defaults::START_WINDOW,
                backoff_cap: defaults::BACKOFF_CAP,
                shutdown_grace: defaults::SHUTDOWN_GRACE,
                spill_after: defaults::SPILL_AFTER,
                max_cached_bytes: defaults::MAX_CACHED_PAYLOAD_MIB * 1024 * 1024,
                max_cached_jobs: defaults::MAX_CACHED_JOBS,
                breaker: breaker::BreakerConfig::default(),
                park: parks::ParkPolicy::default(),
                max_attempts: defaults::MAX_ATTEMPTS,
                min_retry_delay: defaults::MIN_RETRY_DELAY,
            },
            writer: WriterLimits {
                max_rows: defaults::WRITE_BATCH_ROWS,
                max_bytes: 8 * 1024 * 1024,
                rest_after: defaults::REST_AFTER,
                write_timeout: defaults::WRITE_TIMEOUT,
            },
            delivery: DeliveryConfig::default(),
            intake: IntakeLimits::default(),
            auth: None,
            archive: None,
            controls: None,
            peers: None,
            max_clock_skew: sequencer::DEFAULT_CLOCK_SKEW,
            book_limit: ordering::DEFAULT_BOOK_LIMIT,
            subscriptions: None,
        }
    }
}

/// `host:pid`, naming this process in the JobDB's owner row.
pub fn default_holder() -> String {
    format!("{}:{}", host_name(), std::process::id())
}

/// This machine's host name (`unknown` if it cannot be read).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Why a Director could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum DirectorError {
    /// The JobDB failed (connect, schema, lock, fence).
    #[error(transparent)]
    JobDb(#[from] JobDbError),
    /// The RPC address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the http client")]
    Client(#[from] reqwest::Error),
    /// Ownership of the JobDB was lost while running.
    #[error("lost ownership of jobdb {0}")]
    LockLost(String),
    /// Recovery could not record the attempts a crash interrupted.
    #[error("recovery could not record interrupted attempts")]
    Recovery,
    /// A task panicked.
    #[error("a director task failed")]
    Task(#[from] tokio::task::JoinError),
    /// A core task (writer, scheduler, server, archiver, a watcher) ended while the Director
    /// was not stopping: it stopped, and must be restarted.
    #[error("the director's {0} task ended unexpectedly")]
    TaskFailed(&'static str),
}

/// A running Director.
pub struct Director {
    addr: SocketAddr,
    stopping: CancellationToken,
    readiness: supervise::Readiness,
    task: JoinHandle<Result<(), DirectorError>>,
}

impl Director {
    /// The RPC address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Asks the Director to stop (as SIGTERM does); [`Director::wait`] returns when it has.
    pub fn shutdown(&self) {
        self.stopping.cancel();
    }

    /// A handle that stops the Director when cancelled (as [`Director::shutdown`] does).
    pub fn stopper(&self) -> CancellationToken {
        self.stopping.clone()
    }

    /// Whether it is ready, and why not (what `/readyz` answers; in a cluster, what its
    /// catalog check says).
    pub fn readiness(&self) -> supervise::Readiness {
        self.readiness.clone()
    }

    /// Waits until the Director has stopped.
    pub async fn wait(self) -> Result<(), DirectorError> {
        self.task.await?
    }

    /// A Director whose [`Director::wait`] was already spawned, put back together.
    pub(crate) fn from_running(
        stopping: CancellationToken,
        readiness: supervise::Readiness,
        waiting: JoinHandle<Result<(), DirectorError>>,
    ) -> Self {
        Director {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            stopping,
            readiness,
            task: tokio::spawn(async move { waiting.await? }),
        }
    }
}

/// Starts a Director on `config.jobdb`, owned through MySQL `GET_LOCK` (single-site, no
/// Consul); returns once it serves RPC.
pub async fn start(config: DirectorConfig) -> Result<Director, DirectorError> {
    let lease = lease::server_lock(&config.jobdb, config.lock_check_interval).await?;
    start_owned(config, lease, Arc::new(Metrics::default()), None).await
}

/// Starts a Director on `config.jobdb` under a lease already taken, exporting `metrics`, on
/// `listener` if given (else it binds `config.listen`). The lease is released when the
/// Director stops, or at once if it cannot start.
pub async fn start_owned(
    config: DirectorConfig,
    lease: Lease,
    metrics: Arc<Metrics>,
    listener: Option<std::net::TcpListener>,
) -> Result<Director, DirectorError> {
    let opened = open_owned(&config, &lease).await;
    match opened {
        Ok((db, token, unfinished)) => {
            serve(config, lease, metrics, listener, db, token, unfinished).await
        }
        Err(e) => {
            lease.release().await;
            Err(e)
        }
    }
}

/// What a new owner must settle first: attempts under way, jobs left `archiving`, jobs
/// without an `open_jobs` entry.
type Unfinished = crate::jobdb::Stranded;

/// Opens the JobDB (creating and migrating it if configured), takes ownership with the
/// lease's token, and reads what recovery needs.
async fn open_owned(
    config: &DirectorConfig,
    lease: &Lease,
) -> Result<(JobDb, u64, Unfinished), DirectorError> {
    // Every lock wait of its connections is bounded, so a write to a JobDB that stopped
    // answering (a global read lock, a long ALTER) fails in time instead of hanging.
    let db = JobDb::open_with_lock_wait(
        &config.jobdb,
        config.create_database,
        config.db_max_connections,
        Some(config.writer.lock_wait()),
    )
    .await?;
    let token = match lease.token {
        Some(token) => loop {
            match db
                .take_ownership_at(token, &config.holder, Duration::from_secs(2))
                .await
            {
                Err(JobDbError::Busy) if !lease.lost.is_cancelled() => {
                    // The lease is ours, so a transaction left open on the fence belongs to a
                    // previous owner that stalled (paused process, frozen VM) mid-commit: end
                    // it, or its row lock would keep this JobDB ownerless until it wakes up.
                    match db.kill_stalled_transactions(Duration::from_secs(2)).await {
                        Ok(killed) => tracing::warn!(
                            jobdb = db.name(),
                            killed,
                            "previous owner has a transaction open on the fence; ended stalled connections"
                        ),
                        Err(e) => tracing::warn!(
                            jobdb = db.name(),
                            error = %e,
                            "previous owner has a transaction open on the fence; waiting (could not end it)"
                        ),
                    }
                }
                other => break other?,
            }
        },
        None => db.take_ownership(&config.holder).await?,
    };
    let unfinished = db.load_stranded().await?;
    tracing::info!(
        jobdb = db.name(),
        fencing_token = token,
        stranded = unfinished.settle.len(),
        unlisted = unfinished.unlisted.len(),
        "jobdb owned"
    );
    Ok((db, token, unfinished))
}

async fn serve(
    config: DirectorConfig,
    lease: Lease,
    metrics: Arc<Metrics>,
    listener: Option<std::net::TcpListener>,
    db: JobDb,
    token: u64,
    unfinished: Unfinished,
) -> Result<Director, DirectorError> {
    let (next_id, floor, book) = take_over(&db, token, &unfinished, config.book_limit).await?;
    let (listener, addr) = bind(config.listen, listener).await?;

    let stopping = CancellationToken::new();
    let lock_lost = lease.lost.clone();
    let readiness = supervise::Readiness::default();
    let supervisor = supervise::Supervisor::new(
        stopping.clone(),
        lock_lost.clone(),
        readiness.clone(),
        metrics.clone(),
    );
    let writer_progress = supervisor.watch(
        "writer",
        config.writer.unwritable_after(),
        "the jobdb cannot be written (no commit succeeded)",
    );
    let (writer_tx, writer_rx) = mpsc::channel(1024);
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (touched_tx, touched_rx) = mpsc::unbounded_channel();
    // Without peers no other live JobDB can hold an older job of a sequence.
    let mode = match config.peers {
        None => Mode::Alone,
        Some(_) => Mode::Cluster,
    };
    let ordering = Ordering::new(mode, book, touched_tx, metrics.clone());

    let writer_task = supervisor.spawn(
        "writer",
        Writer::new(
            db.clone(),
            token,
            next_id,
            config.writer,
            writer_rx,
            events_tx.clone(),
            ordering,
            metrics.clone(),
            lock_lost.clone(),
        )
        .watched(writer_progress.clone())
        .run(),
    );
    supervisor.spawn("watchdog", supervisor.clone().watchdog());

    let archiving = recover(unfinished.settle, &writer_tx).await?;
    let commands_tx = events_tx.clone();
    let mut scheduler = Scheduler::new(
        config.scheduler,
        writer_tx.clone(),
        Deliverer::new(config.delivery.clone())?,
        events_tx,
        events_rx,
        metrics.clone(),
        db.clone(),
    );
    let archiver_stop = CancellationToken::new();
    let archiver = config.archive.clone().map(|archive| Archiver {
        db: db.clone(),
        token,
        archive,
        recorder: ThroughWriter(writer_tx.clone()),
        metrics: metrics.clone(),
    });
    let archiver_task = spawn_archiver(
        &supervisor,
        &mut scheduler,
        archiver,
        archiving,
        &archiver_stop,
    );
    let parks_rx = prepare_scheduler(&mut scheduler, &config, &supervisor);
    let health = scheduler.health();
    let scheduler_stop = CancellationToken::new();
    spawn_watchers(
        &config,
        &supervisor,
        &db,
        commands_tx.clone(),
        &scheduler_stop,
    );
    let sequencer = sequencer::Sequencer::new(
        db.clone(),
        writer_tx.clone(),
        touched_rx,
        config.peers.clone(),
        config.max_clock_skew,
        metrics.clone(),
    );
    let clearance = spawn_ordering(
        &supervisor,
        sequencer,
        &config,
        &db,
        &metrics,
        &scheduler_stop,
    );
    let scheduler_task = supervisor.spawn("scheduler", scheduler.run(scheduler_stop.clone()));

    let state = RpcState {
        writer: writer_tx,
        db: db.clone(),
        metrics,
        limits: Arc::new(config.intake.clone()),
        stopping: stopping.clone(),
        readiness: readiness.clone(),
        wait: http::WriteWait {
            timeout: config.writer.write_timeout,
            writer: writer_progress,
            unwritable_after: config.writer.unwritable_after(),
        },
        ids: Arc::new(Mutex::new(ulid::Generator::new())),
        positions: Arc::new(ordering::Positions::above(floor)),
        auth: config.auth.clone(),
        imports: Arc::default(),
        health,
        subscriptions: config.subscriptions.clone(),
        policy: Arc::new(crate::delivery::guard::AddressPolicy::new(
            config.delivery.allow_subnets.clone(),
        )),
        clearance,
    };
    if config.auth.is_none() {
        tracing::warn!("no --tokens file: the rpc api accepts every caller");
    }
    let park_store = match &config.controls {
        Some(consul) => parks::ParkStore::Consul(consul.clone()),
        None => parks::ParkStore::Local(Default::default()),
    };
    supervisor.spawn(
        "parks",
        parks::run(
            park_store,
            config.holder.clone(),
            config.scheduler.park.redrive,
            parks_rx,
            commands_tx,
            state.clone(),
            scheduler_stop.clone(),
        ),
    );
    let server = spawn_server(&supervisor, listener, state, &stopping, &lock_lost);
    tracing::info!(%addr, jobdb = db.name(), "director serving");

    let task = tokio::spawn(
        Shutdown {
            stopping: stopping.clone(),
            lock_lost,
            scheduler_stop,
            archiver_stop,
            server,
            scheduler_task,
            archiver_task,
            writer_task,
            lease,
            db,
            supervisor,
        }
        .run(),
    );
    Ok(Director {
        addr,
        stopping,
        readiness,
        task,
    })
}

/// The RPC listener: the one handed over (a test's, or a restart's), or a new one on `listen`.
async fn bind(
    listen: SocketAddr,
    listener: Option<std::net::TcpListener>,
) -> Result<(TcpListener, SocketAddr), DirectorError> {
    let bind_error = |source| DirectorError::Bind {
        addr: listen,
        source,
    };
    let listener = match listener {
        Some(std) => TcpListener::from_std(std).map_err(bind_error)?,
        None => TcpListener::bind(listen).await.map_err(bind_error)?,
    };
    let addr = listener.local_addr().map_err(bind_error)?;
    Ok((listener, addr))
}

/// Starts the archiver, if there is an archive, with the jobs recovery found archiving; the
/// scheduler hands it the jobs that expire from then on.
fn spawn_archiver(
    supervisor: &supervise::Supervisor,
    scheduler: &mut Scheduler,
    archiver: Option<Archiver<ThroughWriter>>,
    archiving: Vec<crate::job::JobId>,
    stop: &CancellationToken,
) -> Option<JoinHandle<Option<()>>> {
    let Some(archiver) = archiver else {
        if !archiving.is_empty() {
            tracing::warn!(
                jobs = archiving.len(),
                "no archive configured: expired jobs stay archiving until a drainer takes them"
            );
        }
        return None;
    };
    let (tx, rx) = mpsc::unbounded_channel();
    scheduler.archive_to(tx);
    let task = archiving::run(archiver, rx, archiving, stop.clone());
    Some(supervisor.spawn("archiver", task))
}

/// The scheduler's settings from the config and its watch; returns where it asks for parks.
fn prepare_scheduler(
    scheduler: &mut Scheduler,
    config: &DirectorConfig,
    supervisor: &supervise::Supervisor,
) -> mpsc::UnboundedReceiver<parks::ParkRequest> {
    // A commit that ends an ordered job and releases the next may begin its attempt too; one
    // that does not release it leaves the offer untaken, which costs nothing.
    scheduler.begin_on_release();
    scheduler.applied_by(&config.holder);
    let (parks_tx, parks_rx) = mpsc::unbounded_channel();
    scheduler.park_to(parks_tx);
    if let Some(subscriptions) = &config.subscriptions {
        scheduler.start_gate(subscriptions.gate().borrow().clone());
    }
    scheduler.watched(supervisor.watch(
        "scheduler",
        STEP_STALL_AFTER,
        "stuck in one step of its loop",
    ));
    parks_rx
}

/// Starts the ordering part's tasks: the sequencer, and with peers the clearance that surveys
/// them (returned, for the RPC handlers).
fn spawn_ordering(
    supervisor: &supervise::Supervisor,
    sequencer: sequencer::Sequencer,
    config: &DirectorConfig,
    db: &JobDb,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> Option<survey::Clearance> {
    supervisor.spawn(
        "sequencer",
        sequencer
            .watched(supervisor.watch(
                "sequencer",
                STEP_STALL_AFTER,
                "stuck in one round of releasing ordered jobs",
            ))
            .run(stop.clone()),
    );
    config.peers.clone().map(|peers| {
        let survey = survey::PeerSurvey::new(peers, db.name().to_owned());
        let (clearance, task) = survey::Clearance::start(survey, metrics.clone(), stop.clone());
        supervisor.spawn("clearance", task);
        clearance
    })
}

/// Serves RPC on `listener` until the Director stops or loses its lock.
fn spawn_server(
    supervisor: &supervise::Supervisor,
    listener: TcpListener,
    state: RpcState,
    stopping: &CancellationToken,
    lock_lost: &CancellationToken,
) -> JoinHandle<Option<std::io::Result<()>>> {
    let stop_serving = {
        let (stopping, lock_lost) = (stopping.clone(), lock_lost.clone());
        async move {
            tokio::select! {
                _ = stopping.cancelled() => {}
                _ = lock_lost.cancelled() => {}
            }
        }
    };
    supervisor.spawn(
        "rpc server",
        std::future::IntoFuture::into_future(
            axum::serve(
                listener,
                http::router(state.clone()).merge(reads::routes(state)),
            )
            .with_graceful_shutdown(stop_serving),
        ),
    )
}

/// Reads what a new owner needs from its JobDB before anything runs: the first transition id
/// it may use, the highest position of an open ordered job, and the book of sequences.
async fn take_over(
    db: &JobDb,
    token: u64,
    unfinished: &Unfinished,
    book_limit: usize,
) -> Result<(u64, Option<ulid::Ulid>, Book), DirectorError> {
    // Each owner numbers its rows 2^32 above the last committed one: a paused predecessor's
    // uncommitted rows can then never collide with ours (they are refused by the fence anyway).
    let next_id = db.max_transition_id().await? + crate::jobdb::owner::OWNER_ID_GAP;
    // The previous owner's fresh jobs get their entries before anything else: each ordered
    // one held in its place, so the book below, and every other JobDB's read, sees it.
    let next_id = db
        .enter_unlisted(token, next_id, &unfinished.unlisted)
        .await?;
    // New ordered jobs go after every one the JobDB holds, whatever this clock says.
    let floor = db.max_open_position().await?;
    let book = Book::load(
        book_limit,
        db.ordered_entries().await?,
        db.blocked_sequences().await?,
    );
    Ok((next_id, floor, book))
}

/// Starts the tasks that turn outside changes into scheduler commands: endpoint and bucket
/// controls (Consul), subscriptions and their gates and caps, and operators' SQL commands.
fn spawn_watchers(
    config: &DirectorConfig,
    supervisor: &supervise::Supervisor,
    db: &JobDb,
    commands_tx: mpsc::UnboundedSender<scheduler::Event>,
    stop: &CancellationToken,
) {
    if let Some(consul) = config.controls.clone() {
        supervisor.spawn(
            "controls watcher",
            commands::watch_controls(consul, commands_tx.clone(), stop.clone()),
        );
    }
    if let Some(subscriptions) = config.subscriptions.clone() {
        supervisor.spawn("subscriptions", subscriptions.clone().run(stop.clone()));
        supervisor.spawn(
            "subscription gate watcher",
            commands::watch_gate(subscriptions.gate(), commands_tx.clone(), stop.clone()),
        );
        supervisor.spawn(
            "subscription caps watcher",
            commands::watch_caps(subscriptions.caps(), commands_tx.clone(), stop.clone()),
        );
    }
    supervisor.spawn(
        "commands watcher",
        commands::watch(db.clone(), commands_tx, stop.clone()),
    );
}

/// What a serving Director stops, in order, once it is told to stop or loses its lock.
struct Shutdown {
    stopping: CancellationToken,
    lock_lost: CancellationToken,
    scheduler_stop: CancellationToken,
    archiver_stop: CancellationToken,
    server: JoinHandle<Option<std::io::Result<()>>>,
    scheduler_task: JoinHandle<Option<()>>,
    archiver_task: Option<JoinHandle<Option<()>>>,
    writer_task: JoinHandle<Option<()>>,
    lease: Lease,
    db: JobDb,
    supervisor: supervise::Supervisor,
}

impl Shutdown {
    async fn run(self) -> Result<(), DirectorError> {
        tokio::select! {
            _ = self.stopping.cancelled() => {}
            _ = self.lock_lost.cancelled() => {}
        }
        // Intake closes and no new attempt starts, at once; requests already inside still get
        // their commit, and attempts in flight finish.
        self.stopping.cancel();
        self.scheduler_stop.cancel();
        tracing::info!("director stopping: intake closed, no new attempts");
        // Every step runs whatever the others did, so the lock is always released; a task
        // that failed was already reported by the supervisor.
        if let Ok(Some(Err(e))) = self.server.await {
            tracing::warn!(error = %e, "rpc server ended with an error");
        }
        let _ = self.scheduler_task.await;
        // An upload in progress is abandoned: its plan stays in the JobDB for whoever owns it
        // next.
        self.archiver_stop.cancel();
        if let Some(task) = self.archiver_task {
            let _ = task.await;
        }
        // Every sender is gone now, so the writer drains what is queued and ends.
        let _ = self.writer_task.await;
        let lost = self.lock_lost.is_cancelled();
        self.lease.release().await;
        self.db.close().await;
        if let Some(task) = self.supervisor.failure() {
            return Err(DirectorError::TaskFailed(task));
        }
        if lost {
            return Err(DirectorError::LockLost(self.db.name().to_owned()));
        }
        tracing::info!("director stopped");
        Ok(())
    }
}

/// Settles what the previous owner left mid-way, before serving, in one commit. An attempt
/// that was under way when it stopped has an unknown outcome: it is recorded as interrupted
/// (ending the attempt its commit began) and retried at once (the endpoint may see it twice;
/// receivers deduplicate on `spindle-job-id`). Returns the expired jobs for the archive.
/// Every waiting job then reaches the cache through the scheduler's backlog pass, a page at a
/// time (the jobs it accepted and never rested got their entries before the writer started).
async fn recover(
    stranded: Vec<(crate::job::JobId, crate::job::Progress)>,
    writer: &mpsc::Sender<WriteOp>,
) -> Result<Vec<crate::job::JobId>, DirectorError> {
    let now = Utc::now();
    let mut interrupted = Vec::new();
    let mut archiving = Vec::new();
    for (id, progress) in stranded {
        match progress.state {
            State::Executing => interrupted.push(Transition::awaiting_retry(
                id,
                progress.attempts,
                now,
                now,
                AttemptRecord {
                    error_type: Some(crate::job::ErrorType::Interrupted.into()),
                    started: progress.started,
                    ..AttemptRecord::default()
                },
            )),
            _ => archiving.push(id),
        }
    }
    tracing::info!(
        interrupted = interrupted.len(),
        archiving = archiving.len(),
        "recovery settled stranded jobs"
    );
    if interrupted.is_empty() {
        return Ok(archiving);
    }
    let (done, committed) = oneshot::channel();
    let op = WriteOp::Transitions {
        rows: interrupted,
        done: Some(done),
    };
    if writer.send(op).await.is_err() {
        return Err(DirectorError::Recovery);
    }
    match committed.await {
        Ok(Ok(())) => Ok(archiving),
        _ => Err(DirectorError::Recovery),
    }
}
