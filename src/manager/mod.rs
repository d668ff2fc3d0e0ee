//! The JobDB manager: keeps spare JobDBs ready, retires old or large ones, drops drained ones.
//!
//! One manager is active at a time: each candidate campaigns for the Consul lock
//! `spindle/locks/manager`; the holder manages until its session is lost, the others stand by
//! and take over within the lock's TTL bound. Every decision is logged and lands in the
//! inventory (`spindle/jobdbs/<name>`: state, when, by whom), which `spindle jobdbs list` shows.
//!
//! One round, every `interval`:
//! - spares: create and migrate JobDBs until `spares` are free, on the server holding the
//!   fewest live JobDBs; drop surplus ones (taking their lock first, so no Director can be
//!   starting on one);
//! - retire: an active JobDB older than `max_age`, or whose tables outgrow `max_bytes`, is
//!   marked `retiring`; its Director hands off to a spare and releases it;
//! - drainers take `retiring` JobDBs by their lock (the pairing is the lock holder, shown in the
//!   inventory); the manager reports those that wait for one;
//! - drop: a `drained` JobDB is dropped (one DROP DATABASE) once it is confirmed to hold no
//!   unfinished job and no other JobDB's drainer still has a move planned into it.
//!
//! # Files
//! - `mod.rs`: the configuration, the campaign for the manager lock, one round, and the
//!   JobDB URLs it builds on its servers.
//! - `spares.rs`: keeping `spares` free JobDBs, spread over the servers; dropping surplus ones.
//! - `retirement.rs`: retiring old or large JobDBs, reporting those waiting for a drainer, and
//!   dropping drained ones once it is safe.

mod retirement;
mod spares;

use std::collections::HashMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::jobdb::{JobDb, JobDbError, JobDbUrl};
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::{Inventory, JobDbRecord, JobDbState};
use crate::registry::lease::{consul_lock, LockTiming};
use crate::registry::RegistryError;
use crate::secret::SecretUrl;

/// The manager's lock key.
pub const LOCK_KEY: &str = "spindle/locks/manager";

/// Errors of a manager round.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Consul failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A JobDB failed.
    #[error(transparent)]
    JobDb(#[from] JobDbError),
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
}

/// How the manager runs.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// The Consul agent.
    pub consul: ConsulClient,
    /// MySQL servers that host JobDBs: `mysql://user[:password]@host[:port]` (no database).
    pub servers: Vec<SecretUrl>,
    /// Name prefix of the JobDBs it creates (`[a-z0-9_]`, up to 20 characters).
    pub prefix: String,
    /// Spare JobDBs to keep ready.
    pub spares: usize,
    /// Retire an active JobDB this long after it became active.
    pub max_age: Duration,
    /// Retire an active JobDB whose tables (data and indexes) pass this many bytes.
    pub max_bytes: u64,
    /// Pause between two rounds.
    pub interval: Duration,
    /// The manager lock's session TTL and lock-delay.
    pub timing: LockTiming,
    /// This manager's identity (stored in the lock key, shown as `changed_by`).
    pub manager_id: String,
    /// Where its decisions and the inventory are counted.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
}

/// Runs the manager until `shutdown`: campaigns for the manager lock, manages while it holds
/// it, and campaigns again if it loses it.
pub async fn run(config: ManagerConfig, shutdown: CancellationToken) -> Result<(), ManagerError> {
    if config.servers.is_empty() {
        return Err(ManagerError::Config(
            "give at least one --mysql server".into(),
        ));
    }
    if config.prefix.is_empty() || config.prefix.len() > 20 || !inventory_name_ok(&config.prefix) {
        return Err(ManagerError::Config(
            "--prefix must be 1 to 20 of [a-z0-9_]".into(),
        ));
    }
    for server in &config.servers {
        server_jobdb_url(server.expose(), "probe")?;
    }
    let inventory = Inventory::new(config.consul.clone());
    let mut manager = Manager {
        config: config.clone(),
        inventory,
        pools: HashMap::new(),
        waiting_logged: HashMap::new(),
    };
    loop {
        let lease = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            lease = campaign(&config) => lease,
        };
        tracing::info!(
            manager = config.manager_id,
            "manager lock acquired: managing"
        );
        config.metrics.manager_active.set(1);
        loop {
            if let Err(e) = manager.round().await {
                tracing::warn!(error = %e, "manager round failed; trying again");
            }
            tokio::select! {
                _ = shutdown.cancelled() => {
                    config.metrics.manager_active.set(0);
                    lease.release().await;
                    manager.close().await;
                    tracing::info!("manager stopped");
                    return Ok(());
                }
                _ = lease.lost.cancelled() => break,
                _ = tokio::time::sleep(config.interval) => {}
            }
            if lease.lost.is_cancelled() {
                break;
            }
        }
        tracing::error!("manager lock lost: standing by");
        config.metrics.manager_active.set(0);
        lease.release().await;
    }
}

/// Campaigns for the manager lock until it holds it.
async fn campaign(config: &ManagerConfig) -> crate::registry::lease::Lease {
    loop {
        match consul_lock(
            &config.consul,
            LOCK_KEY,
            config.manager_id.as_bytes(),
            "spindle-manager",
            config.timing,
        )
        .await
        {
            Ok(Some(lease)) => return lease,
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "manager lock attempt failed"),
        }
        // A standby retries often enough to take over within the lock-delay after a loss.
        tokio::time::sleep(config.timing.ttl.min(Duration::from_secs(1))).await;
    }
}

/// Whether `s` is only `[a-z0-9_]`, as JobDB names must be.
fn inventory_name_ok(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The URL of JobDB `name` on `server` (a server URL without database, or a SQLite
/// directory `sqlite:///dir`).
pub fn server_jobdb_url(server: &str, name: &str) -> Result<(String, JobDbUrl), ManagerError> {
    JobDbUrl::on_server(server, name).map_err(|e| {
        ManagerError::Config(format!(
            "--mysql {}: {e}",
            crate::secret::redact_url(server)
        ))
    })
}

/// The active manager: its configuration and the pools it keeps between rounds.
struct Manager {
    config: ManagerConfig,
    inventory: Inventory,
    /// Small pools to active and drained JobDBs, for sizes and checks.
    pools: HashMap<String, JobDb>,
    /// JobDBs already reported as waiting for a drainer (logged once).
    waiting_logged: HashMap<String, ()>,
}

impl Manager {
    /// Closes every pool it holds.
    async fn close(&mut self) {
        for (_, db) in self.pools.drain() {
            db.close().await;
        }
    }

    /// A small pool to the JobDB `record` names, opened once and kept.
    async fn pool(&mut self, record: &JobDbRecord) -> Result<JobDb, ManagerError> {
        if let Some(db) = self.pools.get(&record.name) {
            return Ok(db.clone());
        }
        let url: JobDbUrl = self.inventory.jobdb_url(record)?;
        let db = JobDb::open(&url, false, 1).await?;
        self.pools.insert(record.name.clone(), db.clone());
        Ok(db)
    }

    /// One round: counts the inventory by state, retires, keeps spares, reports JobDBs
    /// waiting for a drainer, drops drained ones, and closes pools to JobDBs gone.
    async fn round(&mut self) -> Result<(), ManagerError> {
        let listed = self.inventory.list().await?;
        for state in [
            JobDbState::Spare,
            JobDbState::Active,
            JobDbState::Retiring,
            JobDbState::Draining,
            JobDbState::Drained,
            JobDbState::Dropped,
        ] {
            let count = listed.iter().filter(|l| l.record.state == state).count();
            self.config
                .metrics
                .jobdbs
                .get_or_create(&crate::metrics::StateLabels {
                    state: format!("{state:?}").to_lowercase(),
                })
                .set(count as i64);
        }
        self.retire_old(&listed).await;
        self.keep_spares(&listed).await?;
        self.report_waiting(&listed);
        self.drop_drained(&listed).await;
        let live: std::collections::HashSet<&str> = listed
            .iter()
            .filter(|l| l.record.state != JobDbState::Dropped)
            .map(|l| l.record.name.as_str())
            .collect();
        let gone: Vec<String> = self
            .pools
            .keys()
            .filter(|n| !live.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some(db) = self.pools.remove(&name) {
                db.close().await;
            }
        }
        Ok(())
    }

    /// Who the inventory records as having made a change.
    fn by(&self) -> String {
        format!("manager:{}", self.config.manager_id)
    }
}

#[cfg(test)]
mod tests {
    use super::spares::host_of;
    use super::*;

    #[test]
    fn jobdb_urls_are_built_from_server_urls() {
        let (text, url) = server_jobdb_url("mysql://root@127.0.0.1:3306", "spindle_a").unwrap();
        assert_eq!(text, "mysql://root@127.0.0.1:3306/spindle_a");
        assert_eq!(url.database, "spindle_a");
        let (text, _) = server_jobdb_url("mysql://u:p@db:3307/ignored", "x").unwrap();
        assert_eq!(text, "mysql://u:p@db:3307/x");
        assert!(server_jobdb_url("not a url", "x").is_err());
        assert_eq!(host_of("mysql://root@h:3307/x"), "h:3307");
        assert_eq!(host_of("mysql://root@h/x"), "h:3306");
        assert_eq!(host_of("sqlite:///var/lib/spindle/j1"), "/var/lib/spindle");
    }
}
