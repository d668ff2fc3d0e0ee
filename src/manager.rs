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

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use crate::jobdb::{self, JobDb, JobDbError, JobDbUrl};
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::{Inventory, JobDbRecord, JobDbState, Listed};
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

struct Manager {
    config: ManagerConfig,
    inventory: Inventory,
    /// Small pools to active and drained JobDBs, for sizes and checks.
    pools: HashMap<String, JobDb>,
    /// JobDBs already reported as waiting for a drainer (logged once).
    waiting_logged: HashMap<String, ()>,
}

impl Manager {
    async fn close(&mut self) {
        for (_, db) in self.pools.drain() {
            db.close().await;
        }
    }

    async fn pool(&mut self, record: &JobDbRecord) -> Result<JobDb, ManagerError> {
        if let Some(db) = self.pools.get(&record.name) {
            return Ok(db.clone());
        }
        let url: JobDbUrl = self.inventory.jobdb_url(record)?;
        let db = JobDb::open(&url, false, 1).await?;
        self.pools.insert(record.name.clone(), db.clone());
        Ok(db)
    }

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

    /// Marks active JobDBs past their age or size `retiring`.
    async fn retire_old(&mut self, listed: &[Listed]) {
        let now = Utc::now();
        for l in listed
            .iter()
            .filter(|l| l.record.state == JobDbState::Active)
        {
            let age = (now - l.record.changed_at).to_std().unwrap_or_default();
            let reason = if age >= self.config.max_age {
                Some(format!(
                    "age {} s ≥ {} s",
                    age.as_secs(),
                    self.config.max_age.as_secs()
                ))
            } else {
                match self.size_of(&l.record).await {
                    Some(bytes) if bytes >= self.config.max_bytes => {
                        Some(format!("size {bytes} B ≥ {} B", self.config.max_bytes))
                    }
                    _ => None,
                }
            };
            let Some(reason) = reason else { continue };
            match self
                .inventory
                .set_state(l, JobDbState::Retiring, &self.by())
                .await
            {
                Ok(true) => {
                    self.config.metrics.manager_action("retire");
                    tracing::info!(jobdb = l.record.name, reason, "retiring jobdb")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(jobdb = l.record.name, error = %e, "could not retire"),
            }
        }
    }

    async fn size_of(&mut self, record: &JobDbRecord) -> Option<u64> {
        match self.pool(record).await {
            Ok(db) => db.data_bytes().await.ok(),
            Err(e) => {
                tracing::debug!(jobdb = record.name, error = %e, "size unknown");
                None
            }
        }
    }

    /// Creates spares up to the target, or drops surplus ones.
    async fn keep_spares(&mut self, listed: &[Listed]) -> Result<(), ManagerError> {
        let free: Vec<&Listed> = listed
            .iter()
            .filter(|l| l.record.state == JobDbState::Spare && l.holder.is_none())
            .collect();
        if free.len() < self.config.spares {
            for _ in free.len()..self.config.spares {
                self.create_spare(listed).await?;
            }
        } else if free.len() > self.config.spares {
            // Newest first: they are the least likely to be taken right now.
            let mut surplus = free;
            surplus.sort_by_key(|l| std::cmp::Reverse(l.record.changed_at));
            for l in surplus
                .into_iter()
                .take(free_len_minus(listed, self.config.spares))
            {
                self.drop_spare(l).await;
            }
        }
        Ok(())
    }

    async fn create_spare(&mut self, listed: &[Listed]) -> Result<(), ManagerError> {
        // The server holding the fewest live JobDBs takes the new one.
        let mut load: Vec<(usize, &SecretUrl)> = self
            .config
            .servers
            .iter()
            .map(|server| {
                let host = host_of(server.expose());
                let n = listed
                    .iter()
                    .filter(|l| l.record.state != JobDbState::Dropped)
                    .filter(|l| host_of(&l.record.url) == host)
                    .count();
                (n, server)
            })
            .collect();
        load.sort_by_key(|(n, _)| *n);
        let server = load[0].1.clone();
        let name = format!(
            "{}_{}",
            self.config.prefix,
            ulid::Ulid::new().to_string().to_lowercase()
        );
        let (text, url) = server_jobdb_url(server.expose(), &name)?;
        let db = JobDb::open(&url, true, 1).await?;
        db.close().await;
        let record = JobDbRecord {
            name: name.clone(),
            url: text,
            state: JobDbState::Spare,
            changed_at: Utc::now(),
            changed_by: self.by(),
        };
        if self.inventory.add(&record).await? {
            self.config.metrics.manager_action("create_spare");
            tracing::info!(
                jobdb = name,
                server = host_of(server.expose()),
                "spare jobdb created"
            );
        }
        Ok(())
    }

    async fn drop_spare(&mut self, l: &Listed) {
        let key = Inventory::lock_key(&l.record.name);
        let lease = match consul_lock(
            &self.config.consul,
            &key,
            self.config.manager_id.as_bytes(),
            "spindle-manager-drop",
            self.config.timing,
        )
        .await
        {
            Ok(Some(lease)) => lease,
            _ => return,
        };
        // Under its lock nobody can be starting on it; a spare was never written to.
        if let Ok(true) = self
            .inventory
            .set_state(l, JobDbState::Dropped, &self.by())
            .await
        {
            match self.inventory.jobdb_url(&l.record) {
                Ok(url) => match jobdb::drop_database(&url).await {
                    Ok(()) => {
                        self.config.metrics.manager_action("drop_spare");
                        tracing::info!(jobdb = l.record.name, "surplus spare dropped")
                    }
                    Err(e) => tracing::warn!(jobdb = l.record.name, error = %e, "drop failed"),
                },
                Err(e) => tracing::warn!(jobdb = l.record.name, error = %e, "bad url"),
            }
        }
        lease.release().await;
    }

    fn report_waiting(&mut self, listed: &[Listed]) {
        for l in listed {
            let waiting = l.record.state == JobDbState::Retiring && l.holder.is_none();
            if waiting
                && self
                    .waiting_logged
                    .insert(l.record.name.clone(), ())
                    .is_none()
            {
                tracing::info!(
                    jobdb = l.record.name,
                    "retired jobdb released by its director: waiting for a drainer"
                );
            }
            if l.record.state == JobDbState::Draining && l.holder.is_some() {
                if let Some(()) = self.waiting_logged.remove(&l.record.name) {
                    tracing::info!(
                        jobdb = l.record.name,
                        drainer = l.holder_id.as_deref().unwrap_or("?"),
                        "drainer paired with jobdb"
                    );
                }
            }
        }
    }

    /// Drops drained JobDBs that are confirmed empty of unfinished work.
    async fn drop_drained(&mut self, listed: &[Listed]) {
        for l in listed
            .iter()
            .filter(|l| l.record.state == JobDbState::Drained && l.holder.is_none())
        {
            match self.safe_to_drop(l, listed).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(jobdb = l.record.name, error = %e, "cannot check a drained jobdb");
                    continue;
                }
            }
            if let Some(db) = self.pools.remove(&l.record.name) {
                db.close().await;
            }
            let url: JobDbUrl = match self.inventory.jobdb_url(&l.record) {
                Ok(url) => url,
                Err(e) => {
                    tracing::warn!(jobdb = l.record.name, error = %e, "bad url");
                    continue;
                }
            };
            let started = std::time::Instant::now();
            match jobdb::drop_database(&url).await {
                Ok(()) => {
                    let took_ms = started.elapsed().as_millis() as u64;
                    match self
                        .inventory
                        .set_state(l, JobDbState::Dropped, &self.by())
                        .await
                    {
                        Ok(_) => {
                            self.config.metrics.manager_action("drop_drained");
                            tracing::info!(jobdb = l.record.name, took_ms, "drained jobdb dropped")
                        }
                        Err(e) => {
                            tracing::warn!(jobdb = l.record.name, error = %e, "dropped, but the inventory was not updated")
                        }
                    }
                }
                Err(e) => tracing::warn!(jobdb = l.record.name, error = %e, "drop failed"),
            }
        }
    }

    async fn safe_to_drop(&mut self, l: &Listed, listed: &[Listed]) -> Result<bool, ManagerError> {
        let db = self.pool(&l.record).await?;
        let open = db.unfinished_count().await?;
        let untraced = db.without_archived_history().await?.len();
        if open > 0 || untraced > 0 {
            tracing::error!(
                jobdb = l.record.name,
                unfinished = open,
                moved_without_history = untraced,
                "jobdb marked drained but not empty: not dropping it"
            );
            return Ok(false);
        }
        // A drainer elsewhere may still be resolving a move into this JobDB: it must be able
        // to look here to learn whether the jobs arrived.
        for other in listed.iter().filter(|o| {
            o.record.name != l.record.name
                && matches!(o.record.state, JobDbState::Draining | JobDbState::Retiring)
        }) {
            let Ok(db) = self.pool(&other.record).await else {
                return Ok(false);
            };
            let plans = db.planned_moves().await?;
            if plans.iter().any(|p| p.to_jobdb == l.record.name) {
                tracing::info!(
                    jobdb = l.record.name,
                    by = other.record.name,
                    "drop waits for a planned move into it"
                );
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn by(&self) -> String {
        format!("manager:{}", self.config.manager_id)
    }
}

fn free_len_minus(listed: &[Listed], target: usize) -> usize {
    listed
        .iter()
        .filter(|l| l.record.state == JobDbState::Spare && l.holder.is_none())
        .count()
        .saturating_sub(target)
}

/// `host:port` of a MySQL URL, for spreading JobDBs over servers.
fn host_of(url: &str) -> String {
    // A SQLite JobDB's "server" is its directory.
    if let Ok(parsed) = url.parse::<JobDbUrl>() {
        if let crate::jobdb::Server::Sqlite(dir) = &parsed.server {
            return dir.display().to_string();
        }
    }
    url::Url::parse(url)
        .map(|u| {
            format!(
                "{}:{}",
                u.host_str().unwrap_or(""),
                u.port().unwrap_or(3306)
            )
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
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
