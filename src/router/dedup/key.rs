//! The dedup key: 16 bytes of SHA-256 over (bucket, idempotency key), and the parts of it
//! that place an entry: its logical shard, its Redis hash and its field (see [`super`],
//! "Ids and owners" and "Redis layout").

use std::fmt;

use sha2::{Digest, Sha256};

/// Domain separation of the key hash (and its version: changing it forgets every claim).
const KEY_DOMAIN: &[u8] = b"spindle/dedup/v1\0";

/// Domain separation of an event's key hash.
const EVENT_DOMAIN: &[u8] = b"spindle/dedup/event/v1\0";

/// Domain separation of a back-fill's key hash (one per subscription and event).
const BACKFILL_DOMAIN: &[u8] = b"spindle/dedup/backfill/v1\0";

/// A dedup key: 128 bits of SHA-256 over (bucket, idempotency key).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupKey([u8; 16]);

impl DedupKey {
    /// The key of `idempotency_key` in `bucket` (the bucket is length-prefixed, so
    /// `("ab", "c")` and `("a", "bc")` differ).
    pub fn new(bucket: &str, idempotency_key: &str) -> Self {
        Self::derive(KEY_DOMAIN, bucket, idempotency_key)
    }

    /// The key of an event's `idempotency_key` in `bucket`: apart from every job's key (its
    /// own domain), so an event and a job may use the same idempotency key.
    pub fn event(bucket: &str, idempotency_key: &str) -> Self {
        Self::derive(EVENT_DOMAIN, bucket, idempotency_key)
    }

    /// The key of a back-fill of `event` to `subscription` in `bucket`: one job per
    /// (subscription, event) however often, and through whichever routers, it is back-filled.
    /// Its own domain, so no producer's key can take it.
    pub fn backfill(bucket: &str, subscription: ulid::Ulid, event: ulid::Ulid) -> Self {
        Self::derive(BACKFILL_DOMAIN, bucket, &format!("{subscription}:{event}"))
    }

    fn derive(domain: &[u8], bucket: &str, idempotency_key: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(domain);
        hasher.update((bucket.len() as u64).to_be_bytes());
        hasher.update(bucket.as_bytes());
        hasher.update(idempotency_key.as_bytes());
        let digest = hasher.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        DedupKey(id)
    }

    /// A key from its 16 bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        DedupKey(bytes)
    }

    /// The 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    fn top32(&self) -> u32 {
        u32::from_be_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }

    /// The key's logical shard among `logical_shards`: the top bits of the id (multiply-shift,
    /// so any count works; with a power of two it is exactly the top `log2` bits, the same
    /// bits that start the hash index, so one Redis hash never spans two logical shards).
    pub fn logical_shard(&self, logical_shards: u32) -> u32 {
        ((u64::from(self.top32()) * u64::from(logical_shards)) >> 32) as u32
    }

    /// The hash index: the top `bits` bits (0 to 24).
    pub(super) fn hash_index(&self, bits: u8) -> u32 {
        if bits == 0 {
            0
        } else {
            self.top32() >> (32 - u32::from(bits))
        }
    }

    /// The field: the id without the whole bytes the hash index fixes.
    pub(super) fn field(&self, bits: u8) -> &[u8] {
        &self.0[usize::from(bits / 8)..]
    }
}

impl fmt::Debug for DedupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DedupKey({:032x})", u128::from_be_bytes(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_length_prefixed_and_stable() {
        assert_ne!(DedupKey::new("ab", "c"), DedupKey::new("a", "bc"));
        assert_ne!(DedupKey::new("b", "k"), DedupKey::event("b", "k"));
        assert_eq!(DedupKey::new("b", "k"), DedupKey::new("b", "k"));
        // Pinned: changing the derivation silently forgets every stored claim.
        assert_eq!(
            format!("{:?}", DedupKey::new("bucket", "key-1")),
            "DedupKey(3cdf3436054252cb56127a70aff2adcd)"
        );
    }

    #[test]
    fn hash_index_and_logical_shard_share_the_top_bits() {
        let key = DedupKey::from_bytes([
            0b1010_1100,
            0b0101_0011,
            0xff,
            0,
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            8,
            9,
            10,
            11,
            12,
        ]);
        assert_eq!(key.logical_shard(1024), 0b10_1011_0001);
        assert_eq!(key.hash_index(16), 0b1010_1100_0101_0011);
        assert_eq!(key.hash_index(16) >> 6, key.logical_shard(1024));
        assert_eq!(key.hash_index(0), 0);
        assert_eq!(key.field(16).len(), 14);
        assert_eq!(key.field(15).len(), 15);
        assert_eq!(key.logical_shard(3), ((0xac53ff00u64 * 3) >> 32) as u32);
    }
}
