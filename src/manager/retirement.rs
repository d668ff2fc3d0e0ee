//! Retirement: the manager marks active JobDBs past their age or size `retiring` (their
//! Director hands off to a spare), reports retired JobDBs waiting for a drainer, and drops
//! `drained` ones once they are confirmed empty and no other drainer has a move planned into
//! them.

use chrono::Utc;

use super::{Manager, ManagerError};
use crate::jobdb::{self, JobDbUrl};
use crate::registry::inventory::{JobDbRecord, JobDbState, Listed};

impl Manager {
    /// Marks active JobDBs past their age or size `retiring`.
    pub(super) async fn retire_old(&mut self, listed: &[Listed]) {
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

    /// The size of a JobDB's tables, or `None` when it cannot be read now.
    async fn size_of(&mut self, record: &JobDbRecord) -> Option<u64> {
        match self.pool(record).await {
            Ok(db) => db.data_bytes().await.ok(),
            Err(e) => {
                tracing::debug!(jobdb = record.name, error = %e, "size unknown");
                None
            }
        }
    }

    /// Logs, once each, retired JobDBs waiting for a drainer, and the pairing when one takes
    /// them.
    pub(super) fn report_waiting(&mut self, listed: &[Listed]) {
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
    pub(super) async fn drop_drained(&mut self, listed: &[Listed]) {
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

    /// Whether a drained JobDB holds no unfinished job, no moved job without archived
    /// history, and no planned move of another drainer points into it.
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
}
