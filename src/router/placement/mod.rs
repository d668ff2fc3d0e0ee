//! Logical shards to physical dedup stores, through versioned, time-bounded placements.
//!
//! A dedup key belongs to one of `logical_shards` logical shards (1,024 by default, Mussel's
//! number), a function of its id alone. Which Redis store holds a logical shard is decided by a
//! **placement**: a record valid for one fixed time range, the *epoch* (`valid_from` inclusive
//! to `valid_until` exclusive, `period` long), that lists the stores and the store of every
//! logical shard. Dedup data for an instant is always read and written under the placement of
//! that instant's epoch (the dedup store passes the start of a key's time slot), so the
//! placement a datum was written under is the one it is found under, whatever changed since.
//!
//! Placements are **immutable once issued** (Husky's time-bounded shard placements,
//! `seeds/husky-exactly-once-ingestion.txt`): every router gets or creates the placement of an
//! epoch with a Consul check-and-set create (`cas=0`), so the first writer wins and everyone
//! else reads back the same record; they are then cached in memory for good.
//!
//! # What a placement is built from: the layout
//! The operator's wish, the **layout** (stores, excluded stores, salt, number of logical
//! shards), lives in one record with its predecessor (Tapjoy's "previous" and "current"
//! configurations). A new layout is *proposed*: it gets the next generation and takes effect at
//! `effective_from`, the first epoch boundary at least `lead` in the future. The placement of an
//! epoch is built from the layout in effect at the epoch's start, so it is a pure function of
//! the layout record and every router that creates it builds the same one; a change can never
//! apply to an epoch that has started (nor to one within `lead` of now), and an issued
//! placement is never rewritten, even if a later proposal would have built it differently. A
//! router that read a stale layout can at worst issue an epoch after `effective_from` under the
//! previous layout: the change then starts one epoch later; nothing is inconsistent.
//!
//! # Assignment
//! Rendezvous (highest random weight) hashing: logical shard `i` goes to the non-excluded store
//! with the highest `xxh3(store, i)` seeded by the salt. Adding a store moves only the shards it
//! wins (about `1/(n+1)` of them), excluding one moves only its own shards, and changing the
//! salt reshuffles everything (Husky's rebalancing lever). The assignment is written out in
//! full in each placement, so a placement keeps meaning the same even if this code changes.
//!
//! # Consul keys
//! Under a prefix (default [`DEFAULT_PREFIX`]):
//! - `<prefix>/layout`: the JSON [`LayoutRecord`] (`period_ms`, `current`, `previous`).
//! - `<prefix>/epochs/<epoch, 12 digits>`: the JSON [`Placement`] of one epoch; zero-padded so
//!   a listing is in time order.
//!
//! The period is fixed when the layout is bootstrapped and read back from Consul, never from
//! local settings: two routers configured with different periods would otherwise compute
//! different epoch numbers for the same instant.
//!
//! Without Consul (embedded mode, unit tests), [`PlacementManager::in_memory`] runs the same
//! logic over a process-local map.
//!
//! # Files
//! `layout.rs` (layouts, the assignment and placements: pure), `kv.rs` (Consul's KV or the
//! process-local map), this file (the [`PlacementManager`]: bootstrap, proposals, getting or
//! creating each epoch's placement, the cache, pruning).

mod kv;
mod layout;

pub use layout::{assign, valid_store_id, Layout, LayoutRecord, Placement};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::registry::consul::ConsulClient;
use crate::registry::RegistryError;
use kv::Backend;
use layout::epoch_range;

/// Default number of logical shards.
pub const DEFAULT_LOGICAL_SHARDS: u32 = 1024;

/// Default Consul key prefix of the dedup placements.
pub const DEFAULT_PREFIX: &str = "spindle/placements/dedup";

/// How many times a layout write retries a lost check-and-set before giving up.
const PROPOSE_ATTEMPTS: usize = 16;

/// Errors of placements.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// Consul failed.
    #[error("placement registry failed")]
    Registry(#[from] RegistryError),
    /// A stored record could not be decoded, or is inconsistent.
    #[error("placement record {key}: {reason}")]
    Decode {
        /// The Consul key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A layout or setting is invalid.
    #[error("invalid placement layout: {0}")]
    Invalid(String),
    /// No layout has been bootstrapped under the prefix.
    #[error("no placement layout under {0}: bootstrap one first")]
    NoLayout(String),
    /// Concurrent proposals kept winning the check-and-set.
    #[error("layout under {0} is changing too fast to propose a new one")]
    Contended(String),
    /// The placement of an epoch was neither created nor readable (deleted meanwhile).
    #[error("placement of epoch {0} vanished while being created")]
    Vanished(i64),
}

/// Settings of a [`PlacementManager`].
#[derive(Clone, Debug)]
pub struct PlacementSettings {
    /// Consul key prefix (no trailing slash).
    pub prefix: String,
    /// Epoch length, used only when bootstrapping the layout (afterwards the stored one rules).
    pub period: Duration,
    /// How far ahead a proposed layout takes effect, at least: long enough for every router to
    /// notice, and so that no epoch already in use, or about to be, changes layout. The dedup
    /// store looks placements up to `2 × max_skew` ahead, so the lead must exceed that.
    pub lead: Duration,
    /// Cached placements whose range ended longer ago than this are dropped from memory.
    pub cache_retention: Duration,
}

impl Default for PlacementSettings {
    fn default() -> Self {
        PlacementSettings {
            prefix: DEFAULT_PREFIX.to_owned(),
            period: Duration::from_secs(3600),
            lead: Duration::from_secs(600),
            cache_retention: Duration::from_secs(3 * 24 * 3600),
        }
    }
}

/// Gets or creates placements, and caches them.
pub struct PlacementManager {
    backend: Backend,
    settings: PlacementSettings,
    /// The stored period, read once (it never changes).
    period_ms: OnceLock<u64>,
    cache: RwLock<BTreeMap<i64, Arc<Placement>>>,
}

impl std::fmt::Debug for PlacementManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementManager")
            .field("prefix", &self.settings.prefix)
            .field(
                "backend",
                &match self.backend {
                    Backend::Consul(_) => "consul",
                    Backend::Memory(_) => "memory",
                },
            )
            .finish()
    }
}

impl PlacementManager {
    /// Placements in Consul KV.
    pub fn consul(client: ConsulClient, settings: PlacementSettings) -> Self {
        Self::with_backend(Backend::Consul(client), settings)
    }

    /// Placements in process memory: for the embedded mode (one router) and tests.
    pub fn in_memory(settings: PlacementSettings) -> Self {
        Self::with_backend(Backend::Memory(Mutex::default()), settings)
    }

    fn with_backend(backend: Backend, mut settings: PlacementSettings) -> Self {
        settings.prefix = settings.prefix.trim_end_matches('/').to_owned();
        PlacementManager {
            backend,
            settings,
            period_ms: OnceLock::new(),
            cache: RwLock::new(BTreeMap::new()),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &PlacementSettings {
        &self.settings
    }

    fn layout_key(&self) -> String {
        format!("{}/layout", self.settings.prefix)
    }

    fn epoch_prefix(&self) -> String {
        format!("{}/epochs/", self.settings.prefix)
    }

    /// The Consul key of an epoch's placement.
    pub fn epoch_key(&self, epoch: i64) -> String {
        format!("{}{epoch:012}", self.epoch_prefix())
    }

    /// The layout record with its ModifyIndex, if bootstrapped.
    async fn read_layout(&self) -> Result<Option<(LayoutRecord, u64)>, PlacementError> {
        let key = self.layout_key();
        let Some((bytes, index)) = self.backend.get(&key).await? else {
            return Ok(None);
        };
        let record: LayoutRecord =
            serde_json::from_slice(&bytes).map_err(|e| PlacementError::Decode {
                key: key.clone(),
                reason: e.to_string(),
            })?;
        if record.period_ms == 0 {
            return Err(PlacementError::Decode {
                key,
                reason: "period_ms is 0".to_owned(),
            });
        }
        let _ = self.period_ms.set(record.period_ms);
        Ok(Some((record, index)))
    }

    /// The layout record, if bootstrapped.
    pub async fn layout(&self) -> Result<Option<LayoutRecord>, PlacementError> {
        Ok(self.read_layout().await?.map(|(record, _)| record))
    }

    /// Gets or creates the first layout: `stores` in effect from the beginning of time, with the
    /// settings' period. An existing layout is returned unchanged (use [`Self::propose`]).
    pub async fn bootstrap(
        &self,
        stores: Vec<String>,
        logical_shards: u32,
    ) -> Result<LayoutRecord, PlacementError> {
        let period_ms = u64::try_from(self.settings.period.as_millis()).unwrap_or(u64::MAX);
        if period_ms == 0 {
            return Err(PlacementError::Invalid(
                "period must be positive".to_owned(),
            ));
        }
        let current = Layout {
            generation: 1,
            effective_from: DateTime::<Utc>::UNIX_EPOCH,
            logical_shards,
            stores,
            excluded: Vec::new(),
            salt: String::new(),
        };
        current.active_stores()?;
        let record = LayoutRecord {
            period_ms,
            current,
            previous: None,
        };
        for _ in 0..PROPOSE_ATTEMPTS {
            if let Some((existing, _)) = self.read_layout().await? {
                return Ok(existing);
            }
            if self
                .backend
                .put_cas(&self.layout_key(), &encode(&record)?, 0)
                .await?
            {
                let _ = self.period_ms.set(record.period_ms);
                return Ok(record);
            }
            // Someone else bootstrapped first: read theirs.
        }
        Err(PlacementError::Contended(self.settings.prefix.clone()))
    }

    /// Proposes a new layout: `stores` minus `excluded`, same logical shards and salt, taking
    /// effect at the first epoch boundary at least `lead` from now. A proposal not yet in
    /// effect is replaced (its issued epochs, if any, stay as they are).
    pub async fn propose(
        &self,
        stores: Vec<String>,
        excluded: Vec<String>,
    ) -> Result<Layout, PlacementError> {
        for _ in 0..PROPOSE_ATTEMPTS {
            let Some((record, index)) = self.read_layout().await? else {
                return Err(PlacementError::NoLayout(self.settings.prefix.clone()));
            };
            let now = Utc::now();
            let lead = chrono::Duration::from_std(self.settings.lead)
                .map_err(|_| PlacementError::Invalid("lead out of range".to_owned()))?;
            let earliest = (now + lead).timestamp_millis();
            let period = record.period_ms as i64;
            let boundary =
                earliest.div_euclid(period) + i64::from(earliest.rem_euclid(period) != 0);
            let (effective_from, _) = epoch_range(boundary, record.period_ms)?;
            let current = Layout {
                generation: record.current.generation + 1,
                effective_from,
                logical_shards: record.current.logical_shards,
                stores: stores.clone(),
                excluded: excluded.clone(),
                salt: record.current.salt.clone(),
            };
            current.active_stores()?;
            // The outgoing layout becomes `previous` only if it has taken effect; a pending one
            // is simply superseded.
            let previous = if record.current.effective_from <= now {
                Some(record.current.clone())
            } else {
                record.previous.clone()
            };
            let next = LayoutRecord {
                period_ms: record.period_ms,
                current: current.clone(),
                previous,
            };
            if self
                .backend
                .put_cas(&self.layout_key(), &encode(&next)?, index)
                .await?
            {
                return Ok(current);
            }
        }
        Err(PlacementError::Contended(self.settings.prefix.clone()))
    }

    /// The epoch length in milliseconds (read from the layout once).
    pub async fn period_ms(&self) -> Result<u64, PlacementError> {
        if let Some(period) = self.period_ms.get() {
            return Ok(*period);
        }
        match self.read_layout().await? {
            Some((record, _)) => Ok(record.period_ms),
            None => Err(PlacementError::NoLayout(self.settings.prefix.clone())),
        }
    }

    /// The epoch of the instant `at_ms` (milliseconds since the Unix epoch).
    pub async fn epoch_of_ms(&self, at_ms: i64) -> Result<i64, PlacementError> {
        Ok(at_ms.div_euclid(self.period_ms().await? as i64))
    }

    /// The placement that applies at `at`, created if it does not exist yet.
    pub async fn placement_at(&self, at: DateTime<Utc>) -> Result<Arc<Placement>, PlacementError> {
        let epoch = self.epoch_of_ms(at.timestamp_millis()).await?;
        self.placement_of_epoch(epoch).await
    }

    /// The placement of `epoch`: from the cache, else from the registry, else created from the
    /// layout in effect at the epoch's start.
    pub async fn placement_of_epoch(&self, epoch: i64) -> Result<Arc<Placement>, PlacementError> {
        if let Some(found) = self.cached(epoch) {
            return Ok(found);
        }
        let period_ms = self.period_ms().await?;
        if let Some(found) = self.fetch(epoch, period_ms).await? {
            return Ok(self.remember(found));
        }
        let Some((record, _)) = self.read_layout().await? else {
            return Err(PlacementError::NoLayout(self.settings.prefix.clone()));
        };
        let (valid_from, _) = epoch_range(epoch, record.period_ms)?;
        let candidate = Placement::build(epoch, record.period_ms, record.layout_for(valid_from))?;
        self.issue(candidate).await
    }

    /// Issues `candidate` unless its epoch already has a placement; either way returns the
    /// placement that now stands for the epoch (the candidate, or the one issued first). This
    /// is the check-and-set at the heart of the agreement between routers.
    pub async fn issue(&self, candidate: Placement) -> Result<Arc<Placement>, PlacementError> {
        let epoch = candidate.epoch;
        let period_ms = self.period_ms().await?;
        candidate
            .check(epoch, period_ms)
            .map_err(PlacementError::Invalid)?;
        if self
            .backend
            .put_cas(&self.epoch_key(epoch), &encode(&candidate)?, 0)
            .await?
        {
            return Ok(self.remember(candidate));
        }
        match self.fetch(epoch, period_ms).await? {
            Some(existing) => Ok(self.remember(existing)),
            None => Err(PlacementError::Vanished(epoch)),
        }
    }

    /// Creates (or loads) the placements of every epoch from `now` to `now + lead`, so that the
    /// claim path rarely waits for Consul. Returns how many epochs are covered.
    pub async fn ensure_ahead(&self, now: DateTime<Utc>) -> Result<usize, PlacementError> {
        let period = self.period_ms().await? as i64;
        let lead = i64::try_from(self.settings.lead.as_millis()).unwrap_or(i64::MAX / 2);
        let first = now.timestamp_millis().div_euclid(period);
        let last = now
            .timestamp_millis()
            .saturating_add(lead)
            .div_euclid(period);
        for epoch in first..=last {
            self.placement_of_epoch(epoch).await?;
        }
        Ok((last - first + 1) as usize)
    }

    /// Deletes the placements whose range ended before `before` (from the registry and the
    /// cache). Only safe for epochs no dedup lookup can reach any more: older than the dedup
    /// window, slot and clock skews (see `DedupConfig::horizon`).
    pub async fn prune(&self, before: DateTime<Utc>) -> Result<usize, PlacementError> {
        let period_ms = self.period_ms().await?;
        let prefix = self.epoch_prefix();
        let mut deleted = 0;
        for key in self.backend.keys(&prefix).await? {
            let Ok(epoch) = key[prefix.len()..].parse::<i64>() else {
                continue;
            };
            let (_, until) = epoch_range(epoch, period_ms)?;
            if until <= before {
                self.backend.delete(&key).await?;
                deleted += 1;
            }
        }
        let cutoff = before;
        self.cache
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, p| p.valid_until > cutoff);
        Ok(deleted)
    }

    fn cached(&self, epoch: i64) -> Option<Arc<Placement>> {
        self.cache
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&epoch)
            .cloned()
    }

    async fn fetch(&self, epoch: i64, period_ms: u64) -> Result<Option<Placement>, PlacementError> {
        let key = self.epoch_key(epoch);
        let Some((bytes, _)) = self.backend.get(&key).await? else {
            return Ok(None);
        };
        let placement: Placement =
            serde_json::from_slice(&bytes).map_err(|e| PlacementError::Decode {
                key: key.clone(),
                reason: e.to_string(),
            })?;
        placement
            .check(epoch, period_ms)
            .map_err(|reason| PlacementError::Decode { key, reason })?;
        Ok(Some(placement))
    }

    /// Caches a placement (keeping the first one cached for its epoch: they are equal anyway)
    /// and drops those past the retention.
    fn remember(&self, placement: Placement) -> Arc<Placement> {
        let retention = chrono::Duration::from_std(self.settings.cache_retention)
            .unwrap_or(chrono::Duration::MAX);
        let cutoff = Utc::now()
            .checked_sub_signed(retention)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        let placement = cache
            .entry(placement.epoch)
            .or_insert_with(|| Arc::new(placement))
            .clone();
        cache.retain(|_, p| p.valid_until > cutoff || Arc::ptr_eq(p, &placement));
        placement
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, PlacementError> {
    serde_json::to_vec(value).map_err(|e| PlacementError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn settings(period_ms: u64, lead_ms: u64) -> PlacementSettings {
        PlacementSettings {
            prefix: "t".to_owned(),
            period: Duration::from_millis(period_ms),
            lead: Duration::from_millis(lead_ms),
            ..PlacementSettings::default()
        }
    }

    #[tokio::test]
    async fn layouts_take_effect_only_from_a_future_epoch() {
        let m = PlacementManager::in_memory(settings(1000, 2500));
        m.bootstrap(ids(&["a"]), 64).await.unwrap();
        let now = Utc::now();
        let before = m.placement_at(now).await.unwrap();
        assert_eq!(before.stores, ids(&["a"]));
        assert!(before.covers(now));

        let proposed = m.propose(ids(&["a", "b"]), vec![]).await.unwrap();
        assert_eq!(proposed.generation, 2);
        assert!(proposed.effective_from >= now + chrono::Duration::milliseconds(2500));
        assert_eq!(proposed.effective_from.timestamp_millis() % 1000, 0);

        // The epoch in use is unchanged, as is every epoch before the effective instant.
        assert_eq!(m.placement_at(now).await.unwrap(), before);
        let just_before = proposed.effective_from - chrono::Duration::milliseconds(1);
        assert_eq!(
            m.placement_at(just_before).await.unwrap().stores,
            ids(&["a"])
        );
        let after = m.placement_at(proposed.effective_from).await.unwrap();
        assert_eq!(after.stores, ids(&["a", "b"]));
        assert_eq!(after.layout_generation, 2);

        // A later proposal never rewrites an issued placement.
        let excluded = m.propose(ids(&["a", "b"]), ids(&["a"])).await.unwrap();
        assert_eq!(
            m.placement_at(proposed.effective_from).await.unwrap(),
            after
        );
        let fresh = PlacementManager::in_memory(settings(1000, 2500));
        assert!(fresh.placement_at(now).await.is_err(), "separate memory");
        // The superseded generation 2 may have been issued for an epoch or two: those stand.
        // Epochs first created after them follow generation 3.
        let later = excluded.effective_from + chrono::Duration::seconds(5);
        let far = m.placement_at(later).await.unwrap();
        assert_eq!(far.stores, ids(&["b"]));
        assert_eq!(far.layout_generation, 3);
    }

    #[tokio::test]
    async fn issue_keeps_the_first_placement() {
        let m = PlacementManager::in_memory(settings(1000, 0));
        m.bootstrap(ids(&["a", "b"]), 16).await.unwrap();
        let layout_a = Layout {
            generation: 7,
            effective_from: DateTime::<Utc>::UNIX_EPOCH,
            logical_shards: 16,
            stores: ids(&["a"]),
            excluded: vec![],
            salt: String::new(),
        };
        let layout_b = Layout {
            stores: ids(&["b"]),
            ..layout_a.clone()
        };
        let first = m
            .issue(Placement::build(42, 1000, &layout_a).unwrap())
            .await
            .unwrap();
        let second = m
            .issue(Placement::build(42, 1000, &layout_b).unwrap())
            .await
            .unwrap();
        assert_eq!(first, second);
        assert_eq!(second.stores, ids(&["a"]));
        assert!(m
            .issue(Placement::build(43, 999, &layout_a).unwrap())
            .await
            .is_err());
    }

    #[tokio::test]
    async fn prune_drops_old_epochs() {
        let m = PlacementManager::in_memory(settings(1000, 0));
        m.bootstrap(ids(&["a"]), 8).await.unwrap();
        let now = Utc::now();
        for back in 0..5 {
            m.placement_at(now - chrono::Duration::seconds(back))
                .await
                .unwrap();
        }
        let deleted = m.prune(now - chrono::Duration::seconds(2)).await.unwrap();
        assert!((2..=3).contains(&deleted), "{deleted}");
    }
}
