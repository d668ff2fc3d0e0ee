//! A Director in a cluster: campaign for a JobDB through the registry, serve it, and campaign
//! again when ownership is lost.
//!
//! The loop: list the inventory's candidates (orphaned active JobDBs first, then spares), take
//! the first lock that is free, mark the JobDB active, start a Director on it with the lock's
//! fencing token, and register in the catalog. When the lease is lost, the Director stops
//! (intake closed, no new attempts, its cache dropped with it), the registration goes, and the
//! loop starts over. The RPC listener stays bound throughout; between Directors it answers
//! `/readyz` with 503 and refuses submissions, so producers route elsewhere.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::ordering::survey::{Peer, Peers};
use super::{start_owned, Director, DirectorConfig, DirectorError};
use crate::metrics::Metrics;
use crate::registry::catalog;
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::{Inventory, JobDbState, Listed};
use crate::registry::lease::{consul_lock, Lease, LockTiming};

/// How a Director takes part in a cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The Consul agent.
    pub consul: ConsulClient,
    /// Lock session TTL and lock-delay.
    pub timing: LockTiming,
    /// Address published in the catalog (default: the bound listen address).
    pub advertise: Option<SocketAddr>,
    /// TTL of the catalog health check.
    pub service_ttl: Duration,
    /// Pause between two campaign rounds that found nothing free.
    pub retry_every: Duration,
    /// This Director's stable identity (survives restarts), stored as its locks' value.
    pub director_id: String,
}

/// Runs a Director in the cluster until `shutdown`; returns after a clean stop.
pub async fn run(
    config: DirectorConfig,
    cluster: ClusterConfig,
    shutdown: CancellationToken,
) -> Result<(), DirectorError> {
    let bind_error = |source| DirectorError::Bind {
        addr: config.listen,
        source,
    };
    let listener = std::net::TcpListener::bind(config.listen).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    let advertise = cluster.advertise.unwrap_or(bound);
    let metrics = Arc::new(Metrics::default());
    let inventory = Inventory::new(cluster.consul.clone());
    let service_id = format!(
        "spindle-director-{}",
        cluster.director_id.replace([':', '.', '/'], "-")
    );
    tracing::info!(addr = %bound, "director campaigning for a jobdb");

    let start = |listed: Listed, lease: Lease| {
        start_on(&config, &inventory, &listener, &metrics, listed, lease)
    };
    let mut registered: Option<catalog::Registration> = None;
    // Directors of retired JobDBs finishing their attempts in flight.
    let mut retiring = tokio::task::JoinSet::new();
    'campaign: loop {
        let idle = IdleServer::start(&listener, metrics.clone())?;
        // The listener answers "not ready" before anything else, since deregistering may be
        // slow when Consul is what failed; deregistration then ends (or is given up) before
        // this Director registers again under the same id, so it cannot remove the new one.
        if let Some(registration) = registered.take() {
            if tokio::time::timeout(Duration::from_secs(2), registration.deregister())
                .await
                .is_err()
            {
                tracing::warn!("deregistration timed out; the check will go critical");
            }
        }
        let acquired = tokio::select! {
            _ = shutdown.cancelled() => None,
            taken = campaign(&inventory, &cluster.director_id, cluster.timing, cluster.retry_every) => Some(taken),
        };
        idle.stop().await;
        let Some((listed, lease)) = acquired else {
            finish_retiring(&mut retiring).await;
            return Ok(());
        };
        let Some(mut director) = start(listed.clone(), lease).await else {
            tokio::time::sleep(cluster.retry_every).await;
            continue;
        };
        let mut name = listed.record.name.clone();
        registered = register(&cluster, &service_id, advertise, &name, &director).await;
        loop {
            let stopper = director.stopper();
            let readiness = director.readiness();
            let mut running = tokio::spawn(director.wait());
            let event = tokio::select! {
                _ = shutdown.cancelled() => Serving::Shutdown,
                joined = &mut running => Serving::Ended(joined),
                _ = retire_requested(&inventory, &name, cluster.retry_every) => Serving::Retiring,
            };
            // `None`: shutting down.
            let joined = match event {
                Serving::Shutdown => None,
                Serving::Ended(joined) => Some(joined),
                Serving::Retiring => {
                    // Hand-off: the old Director keeps taking jobs until a new JobDB is
                    // owned and served, so intake never pauses.
                    tracing::info!(
                        jobdb = name,
                        "jobdb retiring: taking a new one for new work"
                    );
                    let taken = tokio::select! {
                        _ = shutdown.cancelled() => None,
                        joined = &mut running => {
                            log_end(&name, &metrics, joined, false);
                            continue 'campaign;
                        }
                        taken = campaign(&inventory, &cluster.director_id, cluster.timing, cluster.retry_every) => Some(taken),
                    };
                    match taken {
                        None => None,
                        Some((listed, lease)) => {
                            let next = start(listed.clone(), lease).await;
                            let Some(next) = next else {
                                // Keep serving the retiring JobDB; the next round tries again.
                                director = Director::from_running(stopper, readiness, running);
                                continue;
                            };
                            // The old Director stops taking jobs now, finishes its attempts in
                            // flight, writes their outcomes and releases the JobDB to a drainer.
                            stopper.cancel();
                            let old = std::mem::replace(&mut name, listed.record.name.clone());
                            let metrics_of_old = metrics.clone();
                            retiring.spawn(async move {
                                let joined = running.await;
                                log_end(&old, &metrics_of_old, joined, true);
                                tracing::info!(
                                    jobdb = old,
                                    "retired jobdb released to the drainers"
                                );
                            });
                            if let Some(registration) = registered.take() {
                                registration.forget().await;
                            }
                            registered =
                                register(&cluster, &service_id, advertise, &name, &next).await;
                            director = next;
                            continue;
                        }
                    }
                }
            };
            let Some(joined) = joined else {
                stopper.cancel();
                let joined = running.await;
                if let Some(registration) = registered.take() {
                    registration.deregister().await;
                }
                log_end(&name, &metrics, joined, true);
                finish_retiring(&mut retiring).await;
                return Ok(());
            };
            if let Ok(Err(DirectorError::TaskFailed(task))) = &joined {
                // A bug, not a lost lock: stop the process so its supervisor restarts it
                // (re-campaigning in a process in this state could hit it again).
                let task = *task;
                if let Some(registration) = registered.take() {
                    registration.deregister().await;
                }
                finish_retiring(&mut retiring).await;
                return Err(DirectorError::TaskFailed(task));
            }
            log_end(&name, &metrics, joined, false);
            if shutdown.is_cancelled() {
                finish_retiring(&mut retiring).await;
                return Ok(());
            }
            continue 'campaign;
        }
    }
}

enum Serving {
    Shutdown,
    Ended(Result<Result<(), DirectorError>, tokio::task::JoinError>),
    Retiring,
}

/// Waits for the Directors of retired JobDBs to finish.
async fn finish_retiring(retiring: &mut tokio::task::JoinSet<()>) {
    while retiring.join_next().await.is_some() {}
}

fn log_end(
    name: &str,
    metrics: &Metrics,
    joined: Result<Result<(), DirectorError>, tokio::task::JoinError>,
    stopped_by_us: bool,
) {
    match joined.map_err(DirectorError::Task).and_then(|r| r) {
        Ok(()) if stopped_by_us => tracing::info!(jobdb = name, "director stopped"),
        Ok(()) => tracing::warn!(jobdb = name, "director stopped; campaigning again"),
        Err(DirectorError::LockLost(_)) => tracing::error!(
            jobdb = name,
            fence_rejections = metrics.fence_rejections.get(),
            "lost the jobdb; campaigning again"
        ),
        Err(e) => tracing::error!(jobdb = name, error = %e, "director failed; campaigning again"),
    }
}

/// Returns once the manager has marked `name` retiring (polling the inventory).
async fn retire_requested(inventory: &Inventory, name: &str, every: Duration) {
    let every = every.min(Duration::from_secs(1));
    loop {
        match inventory.get(name).await {
            Ok(Some(listed)) if listed.record.state == JobDbState::Retiring => return,
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "reading the inventory failed"),
        }
        tokio::time::sleep(every).await;
    }
}

/// The live JobDBs of the inventory (active, retiring, draining): where older jobs of an
/// ordered sequence may sit.
fn peers_of(inventory: Inventory) -> Peers {
    Peers::new(move || {
        let inventory = inventory.clone();
        Box::pin(async move {
            let listed = inventory.list().await.map_err(|e| e.to_string())?;
            let mut peers = Vec::new();
            for l in listed {
                let leaving = match l.record.state {
                    JobDbState::Active => false,
                    JobDbState::Retiring | JobDbState::Draining => true,
                    _ => continue,
                };
                let url = inventory.jobdb_url(&l.record).map_err(|e| e.to_string())?;
                peers.push(Peer {
                    name: l.record.name,
                    leaving,
                    url,
                });
            }
            Ok(peers)
        })
    })
}

/// Marks a spare active, then starts a Director on the JobDB whose lock was just taken.
async fn start_on(
    config: &DirectorConfig,
    inventory: &Inventory,
    listener: &std::net::TcpListener,
    metrics: &Arc<Metrics>,
    listed: Listed,
    lease: Lease,
) -> Option<Director> {
    let name = listed.record.name.clone();
    let mut instance = config.clone();
    instance.jobdb = match inventory.jobdb_url(&listed.record) {
        Ok(url) => url,
        Err(e) => {
            tracing::error!(jobdb = name, error = %e, "inventory record has a bad url; skipping it");
            lease.release().await;
            return None;
        }
    };
    instance.create_database = false;
    instance.controls = Some(inventory.client().clone());
    instance.peers = Some(peers_of(inventory.clone()));
    let std_listener = match listener.try_clone() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot share the rpc listener");
            lease.release().await;
            return None;
        }
    };
    // Active before it serves: the listener is this process's one address, so a producer
    // that submits straight to it reaches the new JobDB at once, and other Directors'
    // sequencers look for a key's older jobs only in JobDBs the inventory lists as live. A
    // start that fails leaves an active JobDB without an owner, which campaigns take first.
    if listed.record.state == JobDbState::Spare {
        match inventory
            .set_state(&listed, JobDbState::Active, &config.holder)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    jobdb = name,
                    "inventory record changed while taking it; campaigning again"
                );
                lease.release().await;
                return None;
            }
            Err(e) => {
                tracing::warn!(jobdb = name, error = %e, "could not mark the jobdb active; campaigning again");
                lease.release().await;
                return None;
            }
        }
    }
    let director = match start_owned(instance, lease, metrics.clone(), Some(std_listener)).await {
        Ok(director) => director,
        Err(e) => {
            tracing::error!(jobdb = name, error = %e, "could not start on the jobdb; campaigning again");
            return None;
        }
    };
    Some(director)
}

/// Registers `director` in the catalog, its check passing while it is ready and critical
/// while not (so routers send it nothing while its JobDB cannot be written).
async fn register(
    cluster: &ClusterConfig,
    id: &str,
    advertise: SocketAddr,
    jobdb: &str,
    director: &Director,
) -> Option<catalog::Registration> {
    for _ in 0..5 {
        match catalog::register_director(
            &cluster.consul,
            id,
            &advertise.ip().to_string(),
            advertise.port(),
            jobdb,
            cluster.service_ttl,
            director.readiness().subscribe(),
        )
        .await
        {
            Ok(registration) => return Some(registration),
            Err(e) => {
                tracing::warn!(error = %e, "catalog registration failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    tracing::error!("not registered in the catalog; routers will not find this director");
    None
}

/// Loops until a JobDB's lock is ours.
///
/// Preference: the JobDB this Director's previous incarnation held, then other active JobDBs
/// whose owner is gone (their jobs need a Director now), then spares. Two waits keep that
/// preference from being defeated by timing:
/// - a Director restarted after a crash usually finds its JobDB still locked by the dead
///   session (Consul expires it within 2×TTL); for that long it waits for it;
/// - a freed orphan refuses every acquire during its lock-delay; while one does, spares are
///   left alone for up to the lock-delay plus two campaign pauses.
pub async fn campaign(
    inventory: &Inventory,
    director_id: &str,
    timing: LockTiming,
    retry_every: Duration,
) -> (Listed, Lease) {
    use tokio::time::Instant;
    let own_window = Instant::now() + timing.ttl * 2 + timing.lock_delay + retry_every * 2;
    let mut orphan_window: Option<Instant> = None;
    loop {
        match inventory.list().await {
            Ok(all) => {
                let now = Instant::now();
                let mine = |l: &Listed| {
                    l.record.state == JobDbState::Active
                        && l.holder_id.as_deref() == Some(director_id)
                };
                let only_mine = now < own_window && all.iter().any(mine);
                let mut orphan_refused = false;
                for listed in Inventory::rank(all, director_id) {
                    let active = listed.record.state == JobDbState::Active;
                    if only_mine && !mine(&listed) {
                        continue;
                    }
                    if !active && (orphan_refused || orphan_window.is_some_and(|w| now < w)) {
                        continue;
                    }
                    let key = Inventory::lock_key(&listed.record.name);
                    match consul_lock(
                        inventory.client(),
                        &key,
                        director_id.as_bytes(),
                        "spindle-director",
                        timing,
                    )
                    .await
                    {
                        Ok(Some(lease)) => {
                            tracing::info!(jobdb = listed.record.name, token = ?lease.token, "jobdb lock acquired");
                            return (listed, lease);
                        }
                        Ok(None) if active => orphan_refused = true,
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "lock attempt failed");
                            break;
                        }
                    }
                }
                orphan_window = if orphan_refused {
                    Some(orphan_window.unwrap_or(now + timing.lock_delay + retry_every * 2))
                } else {
                    None
                };
            }
            Err(e) => tracing::warn!(error = %e, "reading the jobdb inventory failed"),
        }
        // Jitter keeps Directors that boot together from retrying in lock-step.
        let pause = retry_every.mul_f64(rand::rng().random_range(0.5..1.5));
        tokio::time::sleep(pause).await;
    }
}

/// The listener's answer while no JobDB is owned: alive, not ready, no intake.
struct IdleServer {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl IdleServer {
    fn start(
        listener: &std::net::TcpListener,
        metrics: Arc<Metrics>,
    ) -> Result<Self, DirectorError> {
        let addr = listener
            .local_addr()
            .map_err(|source| DirectorError::Bind {
                addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })?;
        let bind_error = |source| DirectorError::Bind { addr, source };
        let listener = tokio::net::TcpListener::from_std(listener.try_clone().map_err(bind_error)?)
            .map_err(bind_error)?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, super::http::idle_router(metrics))
                .with_graceful_shutdown(stopped.cancelled_owned());
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "idle server failed");
            }
        });
        Ok(IdleServer { stop, task })
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}
