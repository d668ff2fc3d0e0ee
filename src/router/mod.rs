//! The router's core: the sharded dedup front stage and the choice of Directors per bucket.
//!
//! A router accepts a producer's jobs, drops those whose idempotency key was already used within
//! the dedup window (answering with the original job's id), and forwards the rest to Directors.
//! This module is the library underneath; the router's RPC service is built on it.
//!
//! - [`dedup`]: the dedup store, Tapjoy's layout on Redis: 16-byte key ids, time-slotted hashes
//!   with a bounded number of fields, one Lua script per (store, batch) that checks and claims
//!   many keys and returns only the ones that were not new, owner ids, pending and confirmed
//!   claims, and several Redis stores as shards.
//! - [`placement`]: logical shards (1,024 by default) to Redis stores through versioned,
//!   time-bounded, immutable placements, got-or-created atomically in Consul KV and cached, so
//!   adding, excluding or rebalancing stores never lets a duplicate through.
//! - [`shuffle`]: Cortex shuffle sharding: each bucket's stable, small subset of the healthy
//!   Directors, with a default size and per-bucket overrides.
//!
//! How they fit: the router asks [`dedup::DedupStore::claim`] for a batch (each claim's own time
//! selects its slot, the slot's start selects the placement, the key's logical shard selects the
//! store), forwards the `Claimed` jobs to a Director of the bucket's [`shuffle::Ring::shard`],
//! and then confirms ([`dedup::DedupStore::confirm`]) or releases
//! ([`dedup::DedupStore::release`]) the claims depending on whether the Director persisted them.

pub mod dedup;
pub mod directors;
pub mod placement;
pub mod service;
pub mod shuffle;
