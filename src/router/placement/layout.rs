//! What a placement is built from and what it says: the operator's [`Layout`] (and the
//! [`LayoutRecord`] that keeps it with its predecessor), the rendezvous [`assign`]ment of
//! logical shards to stores, and the [`Placement`] of one epoch. Pure: no Consul, no clock
//! (see [`super`], "What a placement is built from" and "Assignment").

use std::collections::HashSet;

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::PlacementError;

/// One layout: the stores an operator wants and from when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Increases by one with each proposal.
    pub generation: u64,
    /// Epochs starting at or after this instant are built from this layout.
    pub effective_from: DateTime<Utc>,
    /// Number of logical shards.
    pub logical_shards: u32,
    /// Store ids (the dedup store maps them to Redis URLs), including excluded ones.
    pub stores: Vec<String>,
    /// Stores that get no logical shard (draining, overloaded, being removed).
    #[serde(default)]
    pub excluded: Vec<String>,
    /// Salt of the rendezvous hash; changing it reshuffles every logical shard.
    #[serde(default)]
    pub salt: String,
}

impl Layout {
    /// Checks ids and counts; the stores that get logical shards, sorted.
    pub fn active_stores(&self) -> Result<Vec<String>, PlacementError> {
        if self.logical_shards == 0 || self.logical_shards > 65_536 {
            return Err(PlacementError::Invalid(format!(
                "logical_shards must be 1 to 65536, not {}",
                self.logical_shards
            )));
        }
        for id in self.stores.iter().chain(&self.excluded) {
            if !valid_store_id(id) {
                return Err(PlacementError::Invalid(format!(
                    "store id {id:?} must be 1 to 64 of [A-Za-z0-9_.-]"
                )));
            }
        }
        let excluded: HashSet<&String> = self.excluded.iter().collect();
        let mut active: Vec<String> = self
            .stores
            .iter()
            .filter(|s| !excluded.contains(s))
            .cloned()
            .collect();
        active.sort();
        active.dedup();
        if active.is_empty() {
            return Err(PlacementError::Invalid(
                "every store is excluded: at least one must take logical shards".to_owned(),
            ));
        }
        if active.len() > usize::from(u16::MAX) {
            return Err(PlacementError::Invalid("too many stores".to_owned()));
        }
        Ok(active)
    }
}

/// Whether `id` may name a store.
pub fn valid_store_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The layout record: the period of epochs, the current layout and the one before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutRecord {
    /// Length of an epoch in milliseconds (fixed at bootstrap).
    pub period_ms: u64,
    /// The newest layout (perhaps not in effect yet).
    pub current: Layout,
    /// The layout before it, used for epochs that start before `current.effective_from`.
    #[serde(default)]
    pub previous: Option<Layout>,
}

impl LayoutRecord {
    /// The layout that epochs starting at `at` are built from.
    pub fn layout_for(&self, at: DateTime<Utc>) -> &Layout {
        match &self.previous {
            Some(previous) if at < self.current.effective_from => previous,
            _ => &self.current,
        }
    }
}

/// The placement of one epoch: which store holds each logical shard. Immutable once issued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The epoch: `valid_from / period`.
    pub epoch: i64,
    /// First instant it applies to.
    pub valid_from: DateTime<Utc>,
    /// First instant it no longer applies to.
    pub valid_until: DateTime<Utc>,
    /// Generation of the layout it was built from.
    pub layout_generation: u64,
    /// Number of logical shards.
    pub logical_shards: u32,
    /// The stores holding logical shards, sorted.
    pub stores: Vec<String>,
    /// For each logical shard, an index into `stores`.
    pub shards: Vec<u16>,
}

impl Placement {
    /// The placement of `epoch` built from `layout`.
    pub fn build(epoch: i64, period_ms: u64, layout: &Layout) -> Result<Placement, PlacementError> {
        let stores = layout.active_stores()?;
        let shards = assign(layout.logical_shards, &stores, &layout.salt);
        let (valid_from, valid_until) = epoch_range(epoch, period_ms)?;
        Ok(Placement {
            epoch,
            valid_from,
            valid_until,
            layout_generation: layout.generation,
            logical_shards: layout.logical_shards,
            stores,
            shards,
        })
    }

    /// The store holding `logical_shard` (taken modulo the number of logical shards).
    pub fn store_of(&self, logical_shard: u32) -> &str {
        let index = self.shards[(logical_shard % self.logical_shards) as usize];
        &self.stores[usize::from(index)]
    }

    /// Whether `at` falls in this placement's time range.
    pub fn covers(&self, at: DateTime<Utc>) -> bool {
        self.valid_from <= at && at < self.valid_until
    }

    /// Checks a decoded record's internal consistency.
    pub(super) fn check(&self, epoch: i64, period_ms: u64) -> Result<(), String> {
        if self.epoch != epoch {
            return Err(format!("holds epoch {}, expected {epoch}", self.epoch));
        }
        let (from, until) = epoch_range(epoch, period_ms).map_err(|e| e.to_string())?;
        if self.valid_from != from || self.valid_until != until {
            return Err("time range does not match the layout's period".to_owned());
        }
        if self.shards.len() != self.logical_shards as usize || self.logical_shards == 0 {
            return Err("shard table length differs from logical_shards".to_owned());
        }
        if self
            .shards
            .iter()
            .any(|&s| usize::from(s) >= self.stores.len())
        {
            return Err("shard table names a store out of range".to_owned());
        }
        Ok(())
    }
}

/// Rendezvous assignment of `logical_shards` shards to `stores` (sorted, distinct): for each
/// shard, the index of the store with the highest salted hash.
pub fn assign(logical_shards: u32, stores: &[String], salt: &str) -> Vec<u16> {
    let seed = xxh3_64(salt.as_bytes());
    let mut key = Vec::with_capacity(72);
    (0..logical_shards)
        .map(|shard| {
            let mut best = (0u64, 0u16);
            for (index, store) in stores.iter().enumerate() {
                key.clear();
                key.extend_from_slice(store.as_bytes());
                key.push(0);
                key.extend_from_slice(&shard.to_be_bytes());
                let score = xxh3_64_with_seed(&key, seed);
                // `>` keeps the first (smallest id) store on a tie: deterministic.
                if index == 0 || score > best.0 {
                    best = (score, index as u16);
                }
            }
            best.1
        })
        .collect()
}

/// The instants epoch `epoch` spans: `[from, until)`.
pub(super) fn epoch_range(
    epoch: i64,
    period_ms: u64,
) -> Result<(DateTime<Utc>, DateTime<Utc>), PlacementError> {
    let period = i64::try_from(period_ms)
        .map_err(|_| PlacementError::Invalid("period out of range".to_owned()))?;
    let from = epoch
        .checked_mul(period)
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
    let until = epoch
        .checked_add(1)
        .and_then(|e| e.checked_mul(period))
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
    match (from, until) {
        (Some(from), Some(until)) => Ok((from, until)),
        _ => Err(PlacementError::Invalid(format!(
            "epoch {epoch} is out of range"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn adding_a_store_moves_only_what_it_wins() {
        let three = ids(&["a", "b", "c"]);
        let four = ids(&["a", "b", "c", "d"]);
        let before = assign(1024, &three, "");
        let after = assign(1024, &four, "");
        let mut moved = 0;
        for (old, new) in before.iter().zip(&after) {
            if three[*old as usize] != four[*new as usize] {
                assert_eq!(four[*new as usize], "d", "a shard moved between old stores");
                moved += 1;
            }
        }
        // About a quarter; generous bounds for the hash's randomness.
        assert!((180..340).contains(&moved), "{moved} of 1024 moved");
    }

    #[test]
    fn excluding_a_store_moves_only_its_shards() {
        let all = ids(&["a", "b", "c", "d"]);
        let without_b = ids(&["a", "c", "d"]);
        let before = assign(1024, &all, "salt");
        let after = assign(1024, &without_b, "salt");
        for (old, new) in before.iter().zip(&after) {
            let (old, new) = (&all[*old as usize], &without_b[*new as usize]);
            if old != "b" {
                assert_eq!(old, new, "a shard not on b moved");
            }
        }
        let counts = |table: &[u16], n: usize| {
            let mut c = vec![0; n];
            table.iter().for_each(|&i| c[i as usize] += 1);
            c
        };
        for c in counts(&before, 4) {
            assert!((190..330).contains(&c), "unbalanced: {c}");
        }
        assert_ne!(
            assign(1024, &all, "salt"),
            assign(1024, &all, "other salt"),
            "salt has no effect"
        );
    }

    #[test]
    fn rejects_bad_layouts() {
        let mut layout = Layout {
            generation: 1,
            effective_from: Utc::now(),
            logical_shards: 1024,
            stores: ids(&["a"]),
            excluded: ids(&["a"]),
            salt: String::new(),
        };
        assert!(layout.active_stores().is_err());
        layout.excluded.clear();
        layout.stores = ids(&["bad id"]);
        assert!(layout.active_stores().is_err());
        layout.stores = ids(&["ok"]);
        layout.logical_shards = 0;
        assert!(layout.active_stores().is_err());
    }
}
