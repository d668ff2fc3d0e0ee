//! Spares: the manager keeps `spares` free JobDBs ready, creating each on the server that
//! holds the fewest live JobDBs, and drops surplus ones (under their lock, so no Director can be
//! starting on one).

use chrono::Utc;

use super::{server_jobdb_url, Manager, ManagerError};
use crate::jobdb::{self, JobDb, JobDbUrl};
use crate::registry::inventory::{Inventory, JobDbRecord, JobDbState, Listed};
use crate::registry::lease::consul_lock;
use crate::secret::SecretUrl;

impl Manager {
    /// Creates spares up to the target, or drops surplus ones.
    pub(super) async fn keep_spares(&mut self, listed: &[Listed]) -> Result<(), ManagerError> {
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

    /// Creates and migrates one spare JobDB and adds it to the inventory.
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

    /// Drops a surplus spare, under its lock.
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
}

/// How many free spares `listed` holds beyond `target`.
fn free_len_minus(listed: &[Listed], target: usize) -> usize {
    listed
        .iter()
        .filter(|l| l.record.state == JobDbState::Spare && l.holder.is_none())
        .count()
        .saturating_sub(target)
}

/// `host:port` of a MySQL URL, for spreading JobDBs over servers.
pub(super) fn host_of(url: &str) -> String {
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
