//! Directors in the Consul catalog: register with a TTL health check that a heartbeat keeps
//! passing while the Director is ready and fails while it is not (so routers stop sending to it
//! and come back when it is ready again), deregister on shutdown, and list the healthy ones.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::consul::{ConsulClient, ReadOptions, ServiceInstance, ServiceRegistration, TtlCheck};
use super::RegistryError;

/// The service name Directors register under.
pub const DIRECTOR_SERVICE: &str = "spindle-director";

/// A registered service instance, kept healthy until deregistered.
pub struct Registration {
    client: ConsulClient,
    id: String,
    stop: CancellationToken,
    heartbeat: JoinHandle<()>,
}

/// Registers a Director serving `address:port` for `jobdb`, and keeps its TTL check passing
/// while `ready` says it is ready (`None`) and critical, with the reason as its note, while
/// not: on every change at once, and every TTL/3 (a refused update re-registers, as Consul
/// forgets checks across agent restarts).
pub async fn register_director(
    client: &ConsulClient,
    id: &str,
    address: &str,
    port: u16,
    jobdb: &str,
    ttl: Duration,
    mut ready: watch::Receiver<Option<String>>,
) -> Result<Registration, RegistryError> {
    let check_id = format!("service:{id}");
    let mut registration = ServiceRegistration {
        id: id.to_owned(),
        name: DIRECTOR_SERVICE.to_owned(),
        tags: vec![format!("jobdb-{jobdb}")],
        address: address.to_owned(),
        port,
        meta: HashMap::from([("jobdb".to_owned(), jobdb.to_owned())]),
        check: TtlCheck {
            check_id: check_id.clone(),
            name: "director ttl".to_owned(),
            ttl: super::consul::consul_seconds(ttl),
            status: status_of(ready.borrow_and_update().as_ref()).to_owned(),
            deregister_critical_service_after: "1m".to_owned(),
        },
    };
    client.service_register(&registration).await?;
    let stop = CancellationToken::new();
    let heartbeat = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            // Off once the Director's readiness is gone (it stopped): the check then keeps
            // saying what it said last, until deregistered.
            let mut watching = true;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(ttl / 3) => {}
                    changed = ready.changed(), if watching => watching = changed.is_ok(),
                }
                let why_not = ready.borrow_and_update().clone();
                let told = tokio::select! {
                    _ = stop.cancelled() => return,
                    told = async {
                        match &why_not {
                            None => client.check_pass(&check_id).await,
                            Some(why) => client.check_fail(&check_id, why).await,
                        }
                    } => told,
                };
                if let Err(e) = told {
                    tracing::warn!(error = %e, "ttl check update failed; registering again");
                    registration.check.status = status_of(why_not.as_ref()).to_owned();
                    if let Err(e) = client.service_register(&registration).await {
                        tracing::warn!(error = %e, "service registration failed");
                    }
                }
            }
        })
    };
    Ok(Registration {
        client: client.clone(),
        id: id.to_owned(),
        stop,
        heartbeat,
    })
}

/// The check's status for a readiness: `passing` when ready, else `critical`.
fn status_of(why_not: Option<&String>) -> &'static str {
    match why_not {
        None => "passing",
        Some(_) => "critical",
    }
}

impl Registration {
    /// Stops the heartbeat but leaves the service registered: for registering the same id
    /// again with new metadata (a Director that moved to a new JobDB), without a gap.
    pub async fn forget(self) {
        self.stop.cancel();
        let _ = self.heartbeat.await;
    }

    /// Stops the heartbeat and removes the instance from the catalog.
    pub async fn deregister(self) {
        self.stop.cancel();
        let _ = self.heartbeat.await;
        if let Err(e) = self.client.service_deregister(&self.id).await {
            tracing::warn!(error = %e, id = self.id, "deregistration failed; the check will go critical");
        }
    }
}

/// Directors whose checks all pass.
pub async fn healthy_directors(
    client: &ConsulClient,
) -> Result<Vec<ServiceInstance>, RegistryError> {
    Ok(client
        .healthy(DIRECTOR_SERVICE, ReadOptions::default())
        .await?
        .value)
}
