//! The router's view of the Directors: the healthy ones from the catalog (each with the JobDB
//! it owns), the shuffle-sharding ring over them, and the ones that just failed a forward.
//!
//! The catalog is re-read every `refresh` (a Director whose TTL check lapses leaves it within
//! its service TTL). Between reads, a Director that refused a forward or could not be reached
//! is *suspect* for `suspect_for` and skipped while its bucket's shard has another member, so a
//! dying Director stops receiving work at once rather than at its next missed TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use tokio_util::sync::CancellationToken;

use super::shuffle::{Ring, ShardSizes};
use crate::registry::catalog;
use crate::registry::consul::ConsulClient;

/// A healthy Director as the catalog shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectorEntry {
    /// Catalog service id (the ring's member name).
    pub id: String,
    /// `http://address:port`.
    pub base: String,
    /// The JobDB it owns.
    pub jobdb: String,
}

/// One catalog read, with its ring.
struct Snapshot {
    by_id: HashMap<String, DirectorEntry>,
    ring: Ring,
}

/// The Directors a router forwards to.
pub struct Directors {
    snapshot: RwLock<Arc<Snapshot>>,
    suspects: Mutex<HashMap<String, Instant>>,
    sizes: ShardSizes,
    suspect_for: Duration,
}

impl Directors {
    /// A view with no Directors yet (see [`Directors::set`] and [`Directors::follow`]).
    pub fn new(sizes: ShardSizes, suspect_for: Duration) -> Self {
        Directors {
            snapshot: RwLock::new(Arc::new(Snapshot {
                by_id: HashMap::new(),
                ring: Ring::new::<&str>(&[]),
            })),
            suspects: Mutex::new(HashMap::new()),
            sizes,
            suspect_for,
        }
    }

    /// Replaces the healthy Directors (the ring is rebuilt only when the set changed).
    pub fn set(&self, entries: Vec<DirectorEntry>) {
        let by_id: HashMap<String, DirectorEntry> =
            entries.into_iter().map(|e| (e.id.clone(), e)).collect();
        let current = self.current();
        if current.by_id == by_id {
            return;
        }
        let ids: Vec<&String> = by_id.keys().collect();
        let ring = Ring::new(&ids);
        tracing::info!(directors = by_id.len(), "router: directors changed");
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) =
            Arc::new(Snapshot { by_id, ring });
    }

    fn current(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many healthy Directors there are.
    pub fn len(&self) -> usize {
        self.current().by_id.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks a Director suspect: skipped for a while when its shard has others.
    pub fn suspect(&self, id: &str) {
        self.suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned(), Instant::now() + self.suspect_for);
    }

    /// Whether a Director failed a forward within `suspect_for`.
    pub fn is_suspect(&self, id: &str) -> bool {
        let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        match suspects.get(id) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                suspects.remove(id);
                false
            }
            None => false,
        }
    }

    /// The bucket's shard (its size from the overrides or the default), in ring order.
    pub fn shard(&self, bucket: &str) -> Vec<DirectorEntry> {
        let snapshot = self.current();
        snapshot
            .ring
            .shard(bucket, self.sizes.size_for(bucket))
            .into_iter()
            .filter_map(|id| snapshot.by_id.get(&id).cloned())
            .collect()
    }

    /// Directors to try for `bucket`, best first: a random member of its shard that is not
    /// suspect (for an ordered sequence `seq`, the member it hashes to: rendezvous hashing of
    /// the sequence over the shard, so its jobs all go to one Director while it is healthy,
    /// and most sequences stay put when the shard changes), then the shard's other members,
    /// then (only when the whole shard is suspect or gone) the rest of the healthy Directors,
    /// so a bucket is never refused while any Director is up. `exclude` lists Directors
    /// already tried.
    pub fn candidates(
        &self,
        bucket: &str,
        seq: Option<&crate::job::Seq>,
        exclude: &[String],
    ) -> Vec<DirectorEntry> {
        let snapshot = self.current();
        let shard: Vec<DirectorEntry> = snapshot
            .ring
            .shard(bucket, self.sizes.size_for(bucket))
            .into_iter()
            .filter_map(|id| snapshot.by_id.get(&id).cloned())
            .filter(|e| !exclude.contains(&e.id))
            .collect();
        let (mut good, mut suspect): (Vec<_>, Vec<_>) =
            shard.into_iter().partition(|e| !self.is_suspect(&e.id));
        match seq {
            Some(seq) => {
                let rank = |e: &DirectorEntry| std::cmp::Reverse(rendezvous(seq, &e.id));
                good.sort_by_key(rank);
                suspect.sort_by_key(rank);
            }
            None => {
                if let Some(first) = good.choose(&mut rand::rng()).cloned() {
                    good.retain(|e| e.id != first.id);
                    good.insert(0, first);
                }
            }
        }
        let mut out = good;
        out.extend(suspect);
        if out.is_empty() {
            // The whole shard is gone: spill over to the next members of the ring (the same
            // walk with a larger size), so the choice stays deterministic.
            out = snapshot
                .ring
                .shard(bucket, snapshot.by_id.len())
                .into_iter()
                .filter_map(|id| snapshot.by_id.get(&id).cloned())
                .filter(|e| !exclude.contains(&e.id))
                .collect();
        }
        out
    }

    /// The healthy Director that owns `jobdb` now, if any.
    pub fn owner_of(&self, jobdb: &str) -> Option<DirectorEntry> {
        self.current()
            .by_id
            .values()
            .find(|e| e.jobdb == jobdb)
            .cloned()
    }

    /// Every healthy Director.
    pub fn all(&self) -> Vec<DirectorEntry> {
        self.current().by_id.values().cloned().collect()
    }

    /// Reads the catalog now.
    pub async fn refresh(
        &self,
        consul: &ConsulClient,
    ) -> Result<(), crate::registry::RegistryError> {
        let instances = catalog::healthy_directors(consul).await?;
        self.set(
            instances
                .into_iter()
                .filter_map(|i| {
                    let jobdb = i.meta.get("jobdb")?.clone();
                    Some(DirectorEntry {
                        base: format!("http://{}:{}", i.address, i.port),
                        id: i.id,
                        jobdb,
                    })
                })
                .collect(),
        );
        Ok(())
    }

    /// Re-reads the catalog every `every` until `stop`.
    pub async fn follow(
        self: Arc<Self>,
        consul: ConsulClient,
        every: Duration,
        stop: CancellationToken,
    ) {
        loop {
            if let Err(e) = self.refresh(&consul).await {
                tracing::warn!(error = %e, "router: reading the catalog failed");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}

/// The rendezvous weight of a sequence on a Director: the highest wins.
fn rendezvous(seq: &crate::job::Seq, director: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(seq)
        .chain_update(director.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::rendezvous;

    /// A sequence keeps its Director while the others come and go, and sequences spread.
    #[test]
    fn a_sequence_stays_on_its_director_and_sequences_spread() {
        let directors: Vec<String> = (0..5).map(|i| format!("spindle-director-d{i}")).collect();
        let top = |seq: &crate::job::Seq, among: &[String]| {
            among
                .iter()
                .max_by_key(|d| rendezvous(seq, d))
                .cloned()
                .unwrap()
        };
        let mut share = std::collections::HashMap::new();
        for k in 0..1000 {
            let seq = crate::job::seq_of("b", "https://x.example/", &format!("key-{k}"));
            let first = top(&seq, &directors);
            assert_eq!(top(&seq, &directors), first, "stable");
            let others: Vec<String> = directors.iter().filter(|d| **d != first).cloned().collect();
            // Removing a Director other than its own leaves the sequence where it was.
            let without_one: Vec<String> = directors
                .iter()
                .filter(|d| **d != others[0])
                .cloned()
                .collect();
            assert_eq!(top(&seq, &without_one), first);
            *share.entry(first).or_insert(0) += 1;
        }
        assert_eq!(share.len(), 5);
        assert!(share.values().all(|n| (120..=280).contains(n)), "{share:?}");
    }
}
