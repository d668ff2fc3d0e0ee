//! The in-process dedup store: the claim and release scripts' semantics over a map in this
//! process, for a single-process setup (`spindle dev`) with no Redis to run.
//!
//! A store is named by its spec's URL, `memory:` (named after the store id) or `memory:NAME`;
//! every [`super::DedupStore`] of this process that names the same store shares its entries,
//! as routers naming the same Redis URL do, and entries are namespaced by the key prefix as
//! Redis keys are. The entries live as long as some `DedupStore` (or a handle from
//! [`MemoryStore::named`]) holds the store, and are lost with the process: a restart forgets
//! every claim, and two processes never see each other's.
//!
//! # Same semantics as the scripts
//! Entries are kept per (key prefix, slot), each slot with the expiry instant the claim script
//! gives its Redis hashes (the end of the slot plus `window + 2·max_skew`, set whenever a claim
//! writes into its own slot), so a claim checks the same slots and finds the same entries:
//! within `window` a repeat is a duplicate, beyond `window + slot` it is not. Values are the
//! owner and, while pending, its deadline. Each claim, confirmation and release goes through
//! the same steps as in the scripts (lapsed entries reported in claim mode and deleted in the
//! others; the owner's own entry refreshed, confirmed or restored; another owner's reported; a
//! new entry written into the claim's own slot), with this process's clock in place of Redis'.
//!
//! # Atomicity and memory
//! Entries are spread over [`LOCK_SHARDS`] mutexes by the key's top bits, so all of a key's
//! slots are under one lock. A batch (one "script call") takes the locks of every shard it
//! touches in ascending order and holds them to its end: like a script, it runs atomically,
//! and two batches touching disjoint shards run in parallel. Slots whose expiry has passed are
//! invisible at once and dropped by a sweep that runs at most every [`SWEEP_EVERY_MS`] at the
//! start of a batch, so memory is bounded by the claims of one window (plus a slot, the skew
//! and a second).

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use chrono::Utc;

use super::{DedupError, DedupKey, Found, Mode, Op, Timing};
use crate::job::JobId;

/// Locks per store. Keys spread evenly (they are hashes), so a small batch takes few locks.
pub const LOCK_SHARDS: usize = 64;

/// Most time between two sweeps of expired slots, in ms.
pub const SWEEP_EVERY_MS: i64 = 1_000;

/// One stored claim, as [`MemoryStore::entry`] shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEntry {
    /// The job holding the key.
    pub owner: JobId,
    /// While pending, the instant (ms since the epoch) after which the claim counts as absent;
    /// `None` once confirmed.
    pub deadline_ms: Option<i64>,
}

/// A stored value: the owner and, while pending, its deadline.
#[derive(Clone, Copy)]
struct Value {
    owner: [u8; 16],
    deadline_ms: Option<i64>,
}

/// One slot's entries under one key prefix (a Redis hash per hash index, merged).
struct Slot {
    /// Instant (ms) from which the slot is gone.
    expire_at_ms: i64,
    entries: HashMap<DedupKey, Value>,
}

impl Slot {
    fn live(&self, now_ms: i64) -> bool {
        now_ms < self.expire_at_ms
    }
}

/// The slots of one key prefix, by slot number.
type Space = BTreeMap<i64, Slot>;

/// The entries under one lock: by key prefix.
#[derive(Default)]
struct Shard {
    spaces: HashMap<String, Space>,
}

impl Shard {
    /// Drops the slots that have expired, and the prefixes left empty.
    fn sweep(&mut self, now_ms: i64) {
        self.spaces.retain(|_, space| {
            space.retain(|_, slot| slot.live(now_ms) && !slot.entries.is_empty());
            !space.is_empty()
        });
    }
}

/// An in-process dedup store; see the module documentation. Shared through [`Arc`].
pub struct MemoryStore {
    name: String,
    shards: Box<[Mutex<Shard>]>,
    next_sweep_ms: AtomicI64,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The stores of this process by name, held weakly: a store lives while someone uses it.
fn registry() -> &'static Mutex<HashMap<String, Weak<MemoryStore>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<MemoryStore>>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// Locks, ignoring poisoning: every critical section leaves the maps consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `name` can name a store: 1 to 64 of `[A-Za-z0-9_.-]` (as store ids).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The store a spec URL names, if it is a memory URL: `memory:` (the store `id`) or
/// `memory:NAME`. `Ok(None)` for any other URL.
pub(super) fn from_url(id: &str, url: &str) -> Result<Option<Arc<MemoryStore>>, DedupError> {
    let Some(rest) = url.strip_prefix(MemoryStore::SCHEME) else {
        return Ok(None);
    };
    let name = if rest.is_empty() { id } else { rest };
    if !valid_name(name) {
        return Err(DedupError::Config(format!(
            "store {id}: {url:?} is not memory: or memory:NAME (NAME 1 to 64 of [A-Za-z0-9_.-])"
        )));
    }
    Ok(Some(MemoryStore::named(name)))
}

impl MemoryStore {
    /// The URL scheme of memory stores in a [`super::StoreSpec`].
    pub const SCHEME: &'static str = "memory:";

    /// The store of this process called `name`, created empty if no one holds it.
    pub fn named(name: &str) -> Arc<MemoryStore> {
        let mut stores = lock(registry());
        if let Some(store) = stores.get(name).and_then(Weak::upgrade) {
            return store;
        }
        stores.retain(|_, weak| weak.strong_count() > 0);
        let store = Arc::new(MemoryStore {
            name: name.to_owned(),
            shards: (0..LOCK_SHARDS).map(|_| Mutex::default()).collect(),
            next_sweep_ms: AtomicI64::new(0),
        });
        stores.insert(name.to_owned(), Arc::downgrade(&store));
        store
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store's clock (ms since the epoch): what deadlines and expiries are compared with.
    pub fn now_ms() -> i64 {
        Utc::now().timestamp_millis()
    }

    fn shard_of(key: &DedupKey) -> usize {
        usize::from(key.as_bytes()[0]) * LOCK_SHARDS / 256
    }

    /// Drops every expired slot now (batches do it by themselves every [`SWEEP_EVERY_MS`]).
    pub fn sweep(&self) {
        let now = Self::now_ms();
        for shard in self.shards.iter() {
            lock(shard).sweep(now);
        }
    }

    /// Sweeps if the last sweep is older than [`SWEEP_EVERY_MS`] (one caller does it).
    fn maybe_sweep(&self, now_ms: i64) {
        let due = self.next_sweep_ms.load(Ordering::Relaxed);
        if now_ms >= due
            && self
                .next_sweep_ms
                .compare_exchange(
                    due,
                    now_ms + SWEEP_EVERY_MS,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            self.sweep();
        }
    }

    /// Locks the shards of `keys`, in ascending order (so batches never deadlock).
    fn lock_for<'a>(
        &'a self,
        keys: impl Iterator<Item = &'a DedupKey>,
    ) -> Vec<Option<MutexGuard<'a, Shard>>> {
        let mut needed = [false; LOCK_SHARDS];
        for key in keys {
            needed[Self::shard_of(key)] = true;
        }
        needed
            .iter()
            .zip(self.shards.iter())
            .map(|(&needed, shard)| needed.then(|| lock(shard)))
            .collect()
    }

    /// The claim script over this store: runs `ops` in order, atomically, and returns
    /// `(position in ops, what was found)` for every claim not newly claimed.
    pub(super) fn claim(
        &self,
        prefix: &str,
        mode: Mode,
        timing: &Timing,
        ops: &[Op],
    ) -> Vec<(usize, Found)> {
        let now = Self::now_ms();
        self.maybe_sweep(now);
        let careful = mode == Mode::Claim;
        let deadline = match mode {
            Mode::Confirm => None,
            Mode::Claim | Mode::TakeOver => Some(now.saturating_add(timing.pending_ttl_ms)),
        };
        let mut guards = self.lock_for(ops.iter().map(|op| &op.key));
        let mut out = Vec::new();
        for (position, op) in ops.iter().enumerate() {
            let Some(shard) = guards[Self::shard_of(&op.key)].as_mut() else {
                continue; // every op's shard is locked above
            };
            if !shard.spaces.contains_key(prefix) {
                shard.spaces.insert(prefix.to_owned(), Space::new());
            }
            let Some(space) = shard.spaces.get_mut(prefix) else {
                continue; // inserted just above
            };
            // The owner's own entry (the last one in slot order), another owner's (the first).
            let mut mine: Option<(i64, bool)> = None;
            let mut other: Option<([u8; 16], bool, bool)> = None;
            for (&number, slot) in space.range_mut(op.first..=op.last) {
                if !slot.live(now) {
                    continue;
                }
                let MapEntry::Occupied(found) = slot.entries.entry(op.key) else {
                    continue;
                };
                let value = *found.get();
                let lapsed = value.deadline_ms.is_some_and(|d| d <= now);
                if lapsed {
                    if careful && value.owner != op.owner {
                        if other.is_none() {
                            other = Some((value.owner, true, true));
                        }
                    } else {
                        found.remove();
                    }
                } else if value.owner == op.owner {
                    mine = Some((number, value.deadline_ms.is_some()));
                } else if other.is_none() {
                    other = Some((value.owner, value.deadline_ms.is_some(), false));
                }
            }
            let value = Value {
                owner: op.owner,
                deadline_ms: deadline,
            };
            let own_expiry = (op.slot + 1)
                .saturating_mul(timing.slot_ms)
                .saturating_add(timing.keep_ms);
            if let Some((number, pending)) = mine {
                if pending {
                    if let Some(slot) = space.get_mut(&number) {
                        slot.entries.insert(op.key, value);
                        if number == op.slot {
                            slot.expire_at_ms = own_expiry;
                        }
                    }
                }
                out.push((position, Found::Mine));
            } else if let Some((owner, pending, lapsed)) = other {
                out.push((
                    position,
                    Found::Other {
                        owner,
                        pending,
                        lapsed,
                    },
                ));
            } else {
                let slot = space.entry(op.slot).or_insert_with(|| Slot {
                    expire_at_ms: own_expiry,
                    entries: HashMap::new(),
                });
                if !slot.live(now) {
                    // An expired hash is gone: this write starts a new one.
                    slot.entries.clear();
                }
                slot.expire_at_ms = own_expiry;
                slot.entries.insert(op.key, value);
            }
        }
        out
    }

    /// The release script over this store: deletes each op's entries in its slots where its
    /// owner holds them, atomically; returns the positions of the ops that deleted something.
    pub(super) fn release(&self, prefix: &str, ops: &[Op]) -> Vec<usize> {
        let now = Self::now_ms();
        self.maybe_sweep(now);
        let mut guards = self.lock_for(ops.iter().map(|op| &op.key));
        let mut out = Vec::new();
        for (position, op) in ops.iter().enumerate() {
            let Some(shard) = guards[Self::shard_of(&op.key)].as_mut() else {
                continue;
            };
            let Some(space) = shard.spaces.get_mut(prefix) else {
                continue;
            };
            let mut released = false;
            for (_, slot) in space.range_mut(op.first..=op.last) {
                if !slot.live(now) {
                    continue;
                }
                if let MapEntry::Occupied(found) = slot.entries.entry(op.key) {
                    if found.get().owner == op.owner {
                        found.remove();
                        released = true;
                    }
                }
            }
            if released {
                out.push(position);
            }
        }
        out
    }

    /// The live entry of `key` in slot `slot` under `prefix`, if any (pending ones past their
    /// deadline included, as the scripts leave them until a claim meets them).
    pub fn entry(&self, prefix: &str, slot: i64, key: &DedupKey) -> Option<MemoryEntry> {
        let now = Self::now_ms();
        let shard = lock(&self.shards[Self::shard_of(key)]);
        let slot = shard.spaces.get(prefix)?.get(&slot)?;
        if !slot.live(now) {
            return None;
        }
        slot.entries.get(key).map(|v| MemoryEntry {
            owner: JobId::from_bytes(v.owner),
            deadline_ms: v.deadline_ms,
        })
    }

    /// Live entries under `prefix` (in slots that have not expired).
    pub fn live_entries(&self, prefix: &str) -> usize {
        let now = Self::now_ms();
        self.fold(prefix, |slot| {
            if slot.live(now) {
                slot.entries.len()
            } else {
                0
            }
        })
    }

    /// Entries held in memory under `prefix`, those of expired slots not yet swept included.
    pub fn held_entries(&self, prefix: &str) -> usize {
        self.fold(prefix, |slot| slot.entries.len())
    }

    /// The live slots holding entries under `prefix`: `(slot number, expiry in ms since the
    /// epoch)`, by slot.
    pub fn live_slots(&self, prefix: &str) -> Vec<(i64, i64)> {
        let now = Self::now_ms();
        let mut expiries: BTreeMap<i64, i64> = BTreeMap::new();
        for shard in self.shards.iter() {
            if let Some(space) = lock(shard).spaces.get(prefix) {
                for (&number, slot) in space {
                    if slot.live(now) && !slot.entries.is_empty() {
                        expiries.insert(number, slot.expire_at_ms);
                    }
                }
            }
        }
        expiries.into_iter().collect()
    }

    fn fold(&self, prefix: &str, count: impl Fn(&Slot) -> usize) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                lock(shard)
                    .spaces
                    .get(prefix)
                    .map_or(0, |space| space.values().map(&count).sum())
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: u8, owner: u8, slot: i64) -> Op {
        let mut k = [0u8; 16];
        k[0] = key;
        k[15] = key;
        Op {
            key: DedupKey::from_bytes(k),
            owner: [owner; 16],
            slot,
            first: slot - 1,
            last: slot + 1,
        }
    }

    fn timing() -> Timing {
        Timing {
            pending_ttl_ms: 60_000,
            slot_ms: 1_000,
            keep_ms: 10_000,
        }
    }

    fn now_slot() -> i64 {
        MemoryStore::now_ms().div_euclid(1_000)
    }

    #[test]
    fn urls_name_shared_stores() {
        let a = from_url("mt-a", "memory:").unwrap().unwrap();
        let again = from_url("other-id", "memory:mt-a").unwrap().unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        assert!(from_url("x", "redis://127.0.0.1:6379").unwrap().is_none());
        assert!(from_url("x", "memory://host").is_err());
        let name = a.name().to_owned();
        drop((a, again));
        // Nobody holds it any more: the next one starts empty.
        let fresh = MemoryStore::named(&name);
        assert_eq!(fresh.held_entries("p:"), 0);
    }

    #[test]
    fn a_batch_serialises_repeats_of_a_key_and_sweeps_what_expired() {
        let store = MemoryStore::named("mt-batch");
        let s = now_slot();
        let ops = [op(1, 7, s), op(1, 8, s), op(1, 7, s), op(200, 8, s)];
        let found = store.claim("p:", Mode::Claim, &timing(), &ops);
        assert!(matches!(
            found[0],
            (1, Found::Other { owner, pending: true, lapsed: false }) if owner == [7; 16]
        ));
        assert!(matches!(found[1], (2, Found::Mine)));
        assert_eq!(found.len(), 2);
        assert_eq!(store.live_entries("p:"), 2);
        assert_eq!(store.live_entries("other:"), 0);
        assert_eq!(store.release("p:", &[op(1, 8, s), op(1, 7, s)]), vec![1]);
        // Slots far in the past have expired: invisible at once, dropped by a sweep.
        let old = s - 100;
        store.claim("p:", Mode::Claim, &timing(), &[op(3, 7, old)]);
        assert_eq!(store.held_entries("p:"), 2);
        assert_eq!(store.live_entries("p:"), 1);
        assert_eq!(store.entry("p:", old, &op(3, 7, old).key), None);
        store.sweep();
        assert_eq!(store.held_entries("p:"), 1);
    }
}
