//! The dedup store: idempotency keys claimed in sharded Redis, the Tapjoy way
//! (`seeds/tapjoy-real-time-dedup.txt`).
//!
//! # Files
//! `key.rs` (the key and the parts of it that place an entry), `config.rs` (settings and store
//! specs), this file (the store: claims routed to stores by placement, in one global store
//! order, and their outcomes), `redis.rs` with the scripts `claim.lua` and `release.lua` (a
//! Redis store), `memory.rs` (a store in this process).
//!
//! # Ids and owners
//! A key is the 16-byte [`DedupKey`]: SHA-256 of (bucket, idempotency key), truncated to 128
//! bits. A claim is made by an *owner*, the ULID of the job the router is about to create
//! ([`JobId`], 16 bytes), so that a claim retried by the same submission is recognised as itself
//! ([`ClaimOutcome::Mine`]) and a repeat by another submission learns which job holds the key
//! ([`ClaimOutcome::Duplicate`]).
//!
//! Why SHA-256 and not XXH3-128: idempotency keys are chosen by producers, and with a
//! non-cryptographic hash a tenant who knows (or guesses) another tenant's key can manufacture
//! a colliding key of its own and have the other tenant's job refused as a "duplicate" of its
//! own job. Truncated SHA-256 makes that a 2^128 second-preimage search. It costs about 0.2 µs
//! per key on this machine's SHA-extensions (`sha2` is already a dependency); the placement and
//! shuffle hashes, which see no adversarial input, use XXH3.
//!
//! # Time slots and the window
//! Every claim carries the key's own time `at` (given by the caller: the submission's arrival
//! time, or a time the producer attached to the key). Time is cut into *slots* of
//! `slot = window / slots_per_window` (`k = slots_per_window`); a claim is written into the slot
//! of its own time, `s = floor(at / slot)`. Two claims of the same key are duplicates when their
//! times are at most `window` apart, in either order, so a claim checks the slots
//! `s - k ..= s + k`: two times at most `window = k · slot` apart are at most `k` slots apart.
//! Keys are therefore found if within `window` of each other and never if more than
//! `window + slot` apart. Checking *later* slots too is what makes this hold when own times
//! arrive out of order (producer clocks, two routers racing across a slot boundary).
//!
//! Claims are only accepted within `max_skew` of the router's clock, so no entry can exist in a
//! slot after `now + 2·max_skew` (router clocks are assumed to agree within `max_skew`): the
//! forward check stops there, which keeps the typical claim at `k + 1` or `k + 2` slots and
//! means placements are never needed more than `2·max_skew` ahead (a layout change must
//! therefore be proposed with a lead of at least that; [`DedupStore::connect`] checks it).
//!
//! The trade-off is set by `k`. Each claim reads up to `2k + 1` slots; a slot's hashes expire
//! (`PEXPIREAT`, Redis' clock) at the end of the slot plus `window + 2·max_skew`, so an entry
//! lives between `window` and `window + slot` (plus skew) after its own time, on average
//! `window · (1 + 1/(2k))`. `k = 1` (slots as long as the window) reads 2 to 3 hashes per claim
//! and keeps entries 1.5 windows on average; `k = 4` reads 5 to 6 and keeps 1.125 windows.
//! Tapjoy reads one hash because its messages carry their own timestamp, so a duplicate lands
//! in the very same bucket; we cannot assume producers do.
//!
//! # Redis layout
//! The hash of key `id` in slot `s` is `<prefix><s>:<h>`, where `h` is the top `hash_bits` bits
//! of the id (decimal), and the field is the id without the whole bytes `h` already fixes
//! (`id[hash_bits / 8 ..]`). Choose `hash_bits` so that the keys of one slot spread to fewer
//! than `hash-max-listpack-entries` (default 128) fields per hash, about 30 on average with
//! `2^hash_bits = keys per slot / 30`: the hash then stays a listpack (one compact allocation;
//! a few bytes of overhead per entry) instead of a hash table. Values are at most 29 bytes,
//! well below `hash-max-listpack-value` (64). A listpack is searched field by field, so fewer
//! fields are cheaper to read and write: measured under callgrind, 30 fields per hash against
//! 60 cost 21% fewer Redis instructions per claim and 15% fewer per confirmation, for 4% more
//! memory per key (42.3 against 40.8 bytes; 46.5 at 15 fields).
//!
//! The value is the owner's 16 bytes when *confirmed*, or the owner followed by a deadline
//! (decimal milliseconds, Redis clock) while *pending*.
//!
//! # Pending and confirmed claims
//! A claim is pending until the router has persisted the job: it calls [`DedupStore::confirm`]
//! after the Director accepted the job, and [`DedupStore::release`] if it knows the job was not
//! persisted. A pending claim whose deadline (`pending_ttl` after it was made or last
//! re-claimed by its owner) has passed counts as absent, and the next script that meets it
//! deletes it: a router that died between claim and persist blocks the key for at most
//! `pending_ttl`. `pending_ttl` must exceed the longest submission to a Director, or a slow
//! persist could let a second submission in (confirm then reports [`ConfirmOutcome::Lost`]).
//! Confirm also restores a claim that expired and was taken by nobody
//! ([`ConfirmOutcome::Restored`]). A repeat that meets another owner's *pending* claim gets
//! `Duplicate { confirmed: false }`: the original may still fail, so the router should ask the
//! producer to retry later rather than promise the original job exists.
//!
//! # The script
//! One `EVALSHA` per (store, batch of up to `max_batch` claims). The router sorts a store's
//! claims by hash before cutting them into script calls, and the script handles each run of
//! claims sharing a hash (and slot range) together, as Tapjoy does per bucket: one `HMGET` of
//! all their fields per slot of the range, then, claim by claim in order, it ignores (and will
//! delete) expired pending entries, refreshes or confirms the owner's own entry, reports another
//! owner's, or records a new entry in the claim's own slot; then one `HDEL`, one `HSET` and one
//! `PEXPIREAT` per hash apply the run. A call from Lua costs about a microsecond, as much as the
//! work itself, so batching per hash is what makes big batches fast; the batch's distinct slot
//! ranges are likewise sent once and their key prefixes formatted once. The script returns
//! `(position, kind, owner)` only for claims that were *not* newly claimed, so the usual
//! all-new batch gets an empty reply. A run of one key, the usual run when a batch's keys spread
//! over many hashes, takes a shorter path: an `HGET` per slot and its writes at once, without
//! the tables a longer run gathers its reads and writes in (under callgrind, 27% fewer Redis
//! instructions per claim and per confirmation than the same keys through the general path).
//! A script runs atomically, so two claims of the same key on one store (even in one batch) are
//! serialised: exactly one is `Claimed`.
//!
//! A confirmation reads the claim's own slot first, and an owner's live entry there (confirmed,
//! or pending before its deadline) settles it as `Confirmed`: while that entry exists no other
//! owner's entry can lie in its range, because every claim of the key whose range holds another
//! entry's slot also scans that slot (the ranges are symmetric, cut only where no entry can be
//! yet), so it would have met the entry and not written, and the one way past a lapsed entry
//! (take-over) deletes it. Only a key whose entry lapsed or vanished reads the whole range, and
//! only a run that adds an entry sets its hash's expiry (an existing entry means the script that
//! made its hash set it). A confirmation is then one `HMGET` and one `HSET` per key, where a
//! claim reads `k + 1` or `k + 2` slots.
//!
//! # Shards and placements
//! The key's logical shard (top bits of the id, see [`DedupKey::logical_shard`]) and the
//! placement of each slot's start instant pick the store that holds the slot's entries, so a
//! slot's data is always found where it was written, whatever placements came later (see
//! [`super::placement`]). Around a placement change, a claim's slot range can span two stores
//! (or more). Such a claim runs the script on each of its stores *in one global order* (by
//! store id), writing its entry into its own slot on each, and stops at the first store that
//! reports another owner, releasing what it wrote on the earlier ones. Two racing claims of the
//! same key within the window share at least one store (the one holding the earlier claim's
//! slot lies in both ranges), so the first shared store in that order serialises them: one of
//! them sees the other there. Outside transitions every range maps to one store and a batch is
//! one script call per store.
//!
//! # In-process stores
//! A store whose URL is `memory:` (or `memory:NAME`) lives in this process instead of Redis
//! ([`memory::MemoryStore`]): the same operations with the same outcomes (the scripts' steps,
//! the same slots, expiries and pending deadlines, a batch atomic under the store's locks),
//! for a single process (`spindle dev`). Its entries are lost when the process ends, and other
//! processes cannot see them, so it never serves more than one router process. Stores of both
//! kinds can be mixed in placements.
//!
//! Errors leave a batch in an unknown state (some claims may be written, as pending): the
//! caller retries with the same owners, which yields `Mine` for what was written, or lets the
//! pending claims expire.

mod config;
mod key;
pub mod memory;
mod redis;

pub use config::{DedupConfig, StoreSpec};
pub use key::DedupKey;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};

use self::redis::RedisStore;
use super::placement::{PlacementError, PlacementManager};
use crate::job::JobId;

/// One claim: a key, its own time, and the job that would own it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The key.
    pub key: DedupKey,
    /// The key's own time: selects its slot (and through it, its placement).
    pub at: DateTime<Utc>,
    /// The job that claims the key.
    pub owner: JobId,
}

/// What a claim found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key was free: it is now claimed (pending) by this owner.
    Claimed,
    /// The key was already claimed by this owner: a retry of the same submission.
    Mine,
    /// The key is claimed by another job within the window.
    Duplicate {
        /// The job holding the key.
        owner: JobId,
        /// Whether its claim is confirmed (its job persisted) or still pending.
        confirmed: bool,
    },
    /// Another job's claim is pending past its deadline: the router that made it did not
    /// confirm in time (it died, or its forward is unresolved). Its job may exist.
    Lapsed {
        /// The job holding the lapsed claim.
        owner: JobId,
    },
}

/// What a confirmation found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// The owner's pending claim is now confirmed (or was already).
    Confirmed,
    /// The owner's claim had expired and nobody took the key: it is claimed again, confirmed.
    Restored,
    /// Another job holds the key: the owner's job is a duplicate that got through (its claim
    /// expired before the confirmation; `pending_ttl` is too short).
    Lost {
        /// The job holding the key.
        owner: JobId,
    },
}

/// Errors of the dedup store.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// A Redis store failed (connection, timeout, script error).
    #[error("dedup store {store} failed")]
    Redis {
        /// Store id.
        store: String,
        /// The cause.
        #[source]
        source: ::redis::RedisError,
    },
    /// A placement names a store this router has no URL for.
    #[error("placement names dedup store {0}, which this router is not configured with")]
    UnknownStore(String),
    /// A placement could not be read or created.
    #[error("dedup placement unavailable")]
    Placement(#[from] PlacementError),
    /// A claim's time is further than `max_skew` from the router's clock.
    #[error("claim {index}: time {at} is more than max_skew from now")]
    Skewed {
        /// Position of the claim in the batch.
        index: usize,
        /// Its time.
        at: DateTime<Utc>,
    },
    /// The configuration is invalid.
    #[error("invalid dedup configuration: {0}")]
    Config(String),
    /// A store answered something the script never returns.
    #[error("dedup store {store} answered unexpectedly: {reason}")]
    Protocol {
        /// Store id.
        store: String,
        /// What was wrong.
        reason: String,
    },
}

/// One claim sent to a store: the key, its owner, its own slot and the slots it checks.
struct Op {
    /// The key.
    pub key: DedupKey,
    /// The owner's 16 bytes.
    pub owner: [u8; 16],
    /// The claim's own slot.
    pub slot: i64,
    /// First slot checked.
    pub first: i64,
    /// Last slot checked.
    pub last: i64,
}

/// The timing of one batch of claims (the claim script's arguments).
struct Timing {
    /// How long a pending claim holds its key, in ms.
    pub pending_ttl_ms: i64,
    /// The slot length, in ms.
    pub slot_ms: i64,
    /// How long a slot is kept after its end, in ms.
    pub keep_ms: i64,
}

/// One store: its id and how to reach it.
struct Shard {
    id: String,
    backend: Backend,
}

/// Where a store's entries are.
enum Backend {
    /// A Redis server, through the scripts.
    Redis(RedisStore),
    /// This process's memory.
    Memory(Arc<memory::MemoryStore>),
}

/// A placement as store indexes: for each logical shard, an index into `Inner::shards`.
struct Route {
    logical_shards: u32,
    store_of: Vec<u16>,
}

impl Route {
    fn store(&self, key: &DedupKey) -> u16 {
        self.store_of[key.logical_shard(self.logical_shards) as usize]
    }
}

/// Where one claim's entries live: computed per call from its time and the placements.
struct Plan {
    hash: u32,
    slot: i64,
    first: i64,
    last: i64,
    /// Store indexes, ascending: the global order multi-store claims follow.
    stores: Vec<u16>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Claim,
    TakeOver,
    Confirm,
}

/// What one store reported for one claim.
#[derive(Clone, Copy)]
enum Found {
    Mine,
    Other {
        owner: [u8; 16],
        pending: bool,
        lapsed: bool,
    },
}

/// One script call's result: the store, the claims sent (indexes) and what it reported.
type ScriptResult = (u16, Vec<usize>, Vec<(usize, Found)>);

/// Progress of one claim through its stores.
#[derive(Default)]
struct Progress {
    next: usize,
    written_on: Vec<u16>,
    mine: bool,
    done: bool,
    /// Another owner, whether its claim is pending, whether it lapsed.
    other: Option<(JobId, bool, bool)>,
}

struct Inner {
    config: DedupConfig,
    slot_ms: i64,
    /// Sorted by id: index order is the global store order.
    shards: Vec<Shard>,
    index: HashMap<String, u16>,
    placements: Arc<PlacementManager>,
    routes: RwLock<BTreeMap<i64, Arc<Route>>>,
}

/// The dedup store: claims, confirms and releases keys across Redis stores, routed by
/// placement. Cheap to clone.
#[derive(Clone)]
pub struct DedupStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for DedupStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedupStore")
            .field("stores", &self.store_ids())
            .field("config", &self.inner.config)
            .finish()
    }
}

impl DedupStore {
    /// Connects to every store (failing if one is unreachable) and checks the configuration.
    pub async fn connect(
        config: DedupConfig,
        stores: Vec<StoreSpec>,
        placements: Arc<PlacementManager>,
    ) -> Result<Self, DedupError> {
        config.validate()?;
        // The claim path creates placements up to 2·max_skew ahead (its forward check). A
        // proposal must take effect later than that, or epochs it was meant for would already
        // be issued under the old layout (harmless, but the change would come late).
        if placements.settings().lead < 2 * config.max_skew {
            return Err(DedupError::Config(format!(
                "placement lead ({:?}) must be at least 2 × max_skew ({:?})",
                placements.settings().lead,
                config.max_skew
            )));
        }
        let mut specs = stores;
        specs.sort_by(|a, b| a.id.cmp(&b.id));
        if specs.windows(2).any(|w| w[0].id == w[1].id) {
            return Err(DedupError::Config("store ids must be distinct".to_owned()));
        }
        if specs.len() > usize::from(u16::MAX) {
            return Err(DedupError::Config("too many stores".to_owned()));
        }
        let mut shards = Vec::with_capacity(specs.len());
        for spec in specs {
            if let Some(store) = memory::from_url(&spec.id, &spec.url)? {
                shards.push(Shard {
                    id: spec.id,
                    backend: Backend::Memory(store),
                });
                continue;
            }
            let store = RedisStore::connect(&spec.id, &spec.url, &config).await?;
            shards.push(Shard {
                id: spec.id,
                backend: Backend::Redis(store),
            });
        }
        let index = shards
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.clone(), i as u16))
            .collect();
        let slot_ms = DedupConfig::ms(config.slot());
        Ok(DedupStore {
            inner: Arc::new(Inner {
                config,
                slot_ms,
                shards,
                index,
                placements,
                routes: RwLock::new(BTreeMap::new()),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DedupConfig {
        &self.inner.config
    }

    /// The store ids, sorted.
    pub fn store_ids(&self) -> Vec<String> {
        self.inner.shards.iter().map(|s| s.id.clone()).collect()
    }

    /// The in-process store behind store `id`, if it is one (for inspection).
    pub fn memory_store(&self, id: &str) -> Option<Arc<memory::MemoryStore>> {
        let shard = &self.inner.shards[usize::from(*self.inner.index.get(id)?)];
        match &shard.backend {
            Backend::Memory(store) => Some(store.clone()),
            Backend::Redis(_) => None,
        }
    }

    /// The placements this store routes by.
    pub fn placements(&self) -> &Arc<PlacementManager> {
        &self.inner.placements
    }

    /// Claims each key for its owner; one outcome per claim, in order. If a batch holds the
    /// same key twice, exactly one is `Claimed` (the first, when both fall in one script call).
    ///
    /// Another job's claim that lapsed (pending past its deadline) is reported as
    /// [`ClaimOutcome::Lapsed`] and left in place: its job may have been stored by a router
    /// that died before confirming. Check that it was not, then call [`DedupStore::take_over`].
    pub async fn claim(&self, claims: &[Claim]) -> Result<Vec<ClaimOutcome>, DedupError> {
        self.claim_in(claims, Mode::Claim, true).await
    }

    /// [`DedupStore::claim`], treating lapsed claims of other jobs as absent (and deleting them):
    /// for keys whose lapsed holder is known not to have been stored.
    pub async fn take_over(&self, claims: &[Claim]) -> Result<Vec<ClaimOutcome>, DedupError> {
        self.claim_in(claims, Mode::TakeOver, true).await
    }

    /// Claims again what these owners claimed earlier, however long ago (within the window):
    /// it refreshes the deadline of a pending claim, or restores one that lapsed if nobody took
    /// it. Unlike [`DedupStore::claim`], the claims' times are not checked against the clock,
    /// because they were when first claimed.
    pub async fn refresh(&self, claims: &[Claim]) -> Result<Vec<ClaimOutcome>, DedupError> {
        self.claim_in(claims, Mode::Claim, false).await
    }

    async fn claim_in(
        &self,
        claims: &[Claim],
        mode: Mode,
        check_clock: bool,
    ) -> Result<Vec<ClaimOutcome>, DedupError> {
        let progress = self.run(claims, mode, check_clock).await?;
        Ok(progress
            .into_iter()
            .map(|p| match p.other {
                Some((owner, _, true)) => ClaimOutcome::Lapsed { owner },
                Some((owner, pending, false)) => ClaimOutcome::Duplicate {
                    owner,
                    confirmed: !pending,
                },
                None if p.mine => ClaimOutcome::Mine,
                None => ClaimOutcome::Claimed,
            })
            .collect())
    }

    /// Confirms claims whose jobs are persisted: they no longer expire before the window does.
    /// Pass the same key, time and owner as the claim.
    pub async fn confirm(&self, claims: &[Claim]) -> Result<Vec<ConfirmOutcome>, DedupError> {
        let progress = self.run(claims, Mode::Confirm, false).await?;
        Ok(progress
            .into_iter()
            .map(|p| match p.other {
                Some((owner, _, _)) => ConfirmOutcome::Lost { owner },
                None if p.mine => ConfirmOutcome::Confirmed,
                None => ConfirmOutcome::Restored,
            })
            .collect())
    }

    /// Deletes each claim if (and only if) its owner still holds it: for a job that was never
    /// persisted. `true` where something was deleted. Times are not checked against the clock.
    pub async fn release(&self, claims: &[Claim]) -> Result<Vec<bool>, DedupError> {
        let plans = self.plan(claims, false).await?;
        let mut calls: Vec<(u16, Vec<usize>)> = Vec::new();
        let mut by_store: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, plan) in plans.iter().enumerate() {
            for &store in &plan.stores {
                by_store.entry(store).or_default().push(i);
            }
        }
        for (store, members) in by_store {
            for chunk in members.chunks(self.inner.config.max_batch) {
                calls.push((store, chunk.to_vec()));
            }
        }
        let results: Vec<Vec<usize>> = futures::stream::iter(calls)
            .map(|(store, members)| {
                let plans = &plans;
                async move {
                    let triples: Vec<(usize, i64, i64)> = members
                        .iter()
                        .map(|&i| (i, plans[i].first, plans[i].last))
                        .collect();
                    self.release_on(store, claims, plans, &triples).await
                }
            })
            .buffer_unordered(self.inner.config.max_in_flight)
            .try_collect()
            .await?;
        let mut released = vec![false; claims.len()];
        for i in results.into_iter().flatten() {
            released[i] = true;
        }
        Ok(released)
    }

    /// Runs claims (or confirmations) through their stores in global store order, in rounds.
    async fn run(
        &self,
        claims: &[Claim],
        mode: Mode,
        check_clock: bool,
    ) -> Result<Vec<Progress>, DedupError> {
        // Only a new claim's time is checked against the clock: a confirmation comes as late as
        // the persist took, for a time that was checked when it was claimed.
        let plans = self
            .plan(claims, check_clock && mode != Mode::Confirm)
            .await?;
        let mut progress: Vec<Progress> = claims.iter().map(|_| Progress::default()).collect();
        loop {
            let mut by_store: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
            for (i, p) in progress.iter().enumerate() {
                if !p.done {
                    by_store.entry(plans[i].stores[p.next]).or_default().push(i);
                }
            }
            if by_store.is_empty() {
                break;
            }
            let mut calls = Vec::new();
            for (store, mut members) in by_store {
                // Runs of claims sharing a hash become one HMGET/HSET in the script. The index
                // breaks ties, so repeats of a key keep their order.
                members.sort_unstable_by_key(|&i| {
                    let plan = &plans[i];
                    (plan.hash, plan.slot, plan.first, plan.last, i)
                });
                for chunk in members.chunks(self.inner.config.max_batch) {
                    calls.push((store, chunk.to_vec()));
                }
            }
            let results: Vec<ScriptResult> = futures::stream::iter(calls)
                .map(|(store, members)| {
                    let plans = &plans;
                    async move {
                        let found = self.script_on(store, mode, claims, plans, &members).await?;
                        Ok::<_, DedupError>((store, members, found))
                    }
                })
                .buffer_unordered(self.inner.config.max_in_flight)
                .try_collect()
                .await?;
            for (store, members, found) in results {
                let mut reported: HashMap<usize, Found> = found.into_iter().collect();
                for i in members {
                    let p = &mut progress[i];
                    match reported.remove(&i) {
                        Some(Found::Other {
                            owner,
                            pending,
                            lapsed,
                        }) => {
                            p.other = Some((JobId::from_bytes(owner), pending, lapsed));
                            p.done = true;
                            continue;
                        }
                        Some(Found::Mine) => p.mine = true,
                        None => p.written_on.push(store),
                    }
                    p.next += 1;
                    p.done = p.next == plans[i].stores.len();
                }
            }
        }
        if mode != Mode::Confirm {
            self.roll_back(claims, &plans, &progress).await;
        }
        Ok(progress)
    }

    /// Releases what a claim wrote on its earlier stores before a later one reported another
    /// owner. Best effort: what is left behind is pending and expires by itself.
    async fn roll_back(&self, claims: &[Claim], plans: &[Plan], progress: &[Progress]) {
        let mut by_store: BTreeMap<u16, Vec<(usize, i64, i64)>> = BTreeMap::new();
        for (i, p) in progress.iter().enumerate() {
            if p.other.is_some() {
                for &store in &p.written_on {
                    let slot = plans[i].slot;
                    by_store.entry(store).or_default().push((i, slot, slot));
                }
            }
        }
        for (store, triples) in by_store {
            if let Err(error) = self.release_on(store, claims, plans, &triples).await {
                tracing::warn!(
                    store = %self.inner.shards[usize::from(store)].id,
                    claims = triples.len(),
                    error = %error,
                    "rolling back partial dedup claims failed; they expire as pending"
                );
            }
        }
    }

    /// Computes each claim's slot range and stores. `check_skew` refuses times too far from now.
    async fn plan(&self, claims: &[Claim], check_skew: bool) -> Result<Vec<Plan>, DedupError> {
        let config = &self.inner.config;
        let slot_ms = self.inner.slot_ms;
        let k = i64::from(config.slots_per_window);
        let skew_ms = DedupConfig::ms(config.max_skew);
        let now_ms = Utc::now().timestamp_millis();
        let horizon = (now_ms + 2 * skew_ms).div_euclid(slot_ms);
        let period = self.inner.placements.period_ms().await? as i64;

        let mut ranges = Vec::with_capacity(claims.len());
        let mut epochs = BTreeSet::new();
        for (index, claim) in claims.iter().enumerate() {
            let at = claim.at.timestamp_millis();
            if check_skew && (at - now_ms).abs() > skew_ms {
                return Err(DedupError::Skewed {
                    index,
                    at: claim.at,
                });
            }
            let slot = at.div_euclid(slot_ms);
            let first = slot - k;
            let last = (slot + k).min(horizon).max(slot);
            for s in first..=last {
                epochs.insert((s * slot_ms).div_euclid(period));
            }
            ranges.push((slot, first, last));
        }
        let mut routes = HashMap::with_capacity(epochs.len());
        for epoch in epochs {
            routes.insert(epoch, self.route(epoch).await?);
        }
        Ok(claims
            .iter()
            .zip(ranges)
            .map(|(claim, (slot, first, last))| {
                let mut stores: Vec<u16> = Vec::with_capacity(2);
                for s in first..=last {
                    let store = routes[&(s * slot_ms).div_euclid(period)].store(&claim.key);
                    if !stores.contains(&store) {
                        stores.push(store);
                    }
                }
                stores.sort_unstable();
                Plan {
                    hash: claim.key.hash_index(config.hash_bits),
                    slot,
                    first,
                    last,
                    stores,
                }
            })
            .collect())
    }

    /// The placement of `epoch` as store indexes (cached).
    async fn route(&self, epoch: i64) -> Result<Arc<Route>, DedupError> {
        if let Some(route) = self
            .inner
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&epoch)
        {
            return Ok(route.clone());
        }
        let placement = self.inner.placements.placement_of_epoch(epoch).await?;
        let mut by_position = Vec::with_capacity(placement.stores.len());
        for id in &placement.stores {
            match self.inner.index.get(id) {
                Some(&i) => by_position.push(i),
                None => return Err(DedupError::UnknownStore(id.clone())),
            }
        }
        let route = Arc::new(Route {
            logical_shards: placement.logical_shards,
            store_of: placement
                .shards
                .iter()
                .map(|&s| by_position[usize::from(s)])
                .collect(),
        });
        let mut routes = self.inner.routes.write().unwrap_or_else(|p| p.into_inner());
        routes.insert(epoch, route.clone());
        // Keep the routes of the last few thousand epochs: far more than any window needs.
        while routes.len() > 4096 {
            routes.pop_first();
        }
        Ok(route)
    }

    /// One claim-script call on `store` for the claims at `members` (indexes into `claims`).
    async fn script_on(
        &self,
        store: u16,
        mode: Mode,
        claims: &[Claim],
        plans: &[Plan],
        members: &[usize],
    ) -> Result<Vec<(usize, Found)>, DedupError> {
        let config = &self.inner.config;
        let ops: Vec<Op> = members
            .iter()
            .map(|&i| Op {
                key: claims[i].key,
                owner: claims[i].owner.to_bytes(),
                slot: plans[i].slot,
                first: plans[i].first,
                last: plans[i].last,
            })
            .collect();
        let timing = Timing {
            pending_ttl_ms: DedupConfig::ms(config.pending_ttl),
            slot_ms: self.inner.slot_ms,
            keep_ms: DedupConfig::ms(config.window) + 2 * DedupConfig::ms(config.max_skew),
        };
        let found = match &self.inner.shards[usize::from(store)].backend {
            Backend::Redis(redis) => {
                redis
                    .claim(&config.key_prefix, mode, &timing, config.hash_bits, &ops)
                    .await?
            }
            Backend::Memory(memory) => memory.claim(&config.key_prefix, mode, &timing, &ops),
        };
        Ok(found
            .into_iter()
            .map(|(position, found)| (members[position], found))
            .collect())
    }

    /// One release-script call on `store` for `(claim index, first slot, last slot)` triples;
    /// returns the claim indexes that had an entry of their owner.
    async fn release_on(
        &self,
        store: u16,
        claims: &[Claim],
        plans: &[Plan],
        triples: &[(usize, i64, i64)],
    ) -> Result<Vec<usize>, DedupError> {
        let config = &self.inner.config;
        let ops: Vec<Op> = triples
            .iter()
            .map(|&(i, first, last)| Op {
                key: claims[i].key,
                owner: claims[i].owner.to_bytes(),
                slot: plans[i].slot,
                first,
                last,
            })
            .collect();
        let released = match &self.inner.shards[usize::from(store)].backend {
            Backend::Redis(redis) => {
                redis
                    .release(&config.key_prefix, config.hash_bits, &ops)
                    .await?
            }
            Backend::Memory(memory) => memory.release(&config.key_prefix, &ops),
        };
        Ok(released
            .into_iter()
            .map(|position| triples[position].0)
            .collect())
    }
}
