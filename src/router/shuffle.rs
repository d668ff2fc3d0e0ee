//! Shuffle sharding of buckets onto Directors, after Cortex's subring.
//!
//! Each bucket (tenant) is confined to a small subset of the healthy Directors, its *shard*, so a
//! noisy or poisonous tenant can only hurt the few Directors it shares with others, and two
//! tenants rarely share all of theirs (with 20 Directors and shards of 4 there are 4,845
//! possible shards).
//!
//! The algorithm is Cortex's (`seeds/cortex-shuffle-sharding.txt`): every member places
//! [`TOKENS_PER_MEMBER`] tokens on a 64-bit hash ring; the bucket's name seeds a sequence of
//! hashes, each hash is a point on the ring, and the point's owner, or the next member clockwise
//! not chosen yet, joins the shard. The properties follow from that construction:
//! - **Deterministic**: the result depends only on the bucket, the size and the *set* of members
//!   (their order does not matter), so every router computes the same shard.
//! - **Growing a shard only adds members**: the sequence of points does not depend on the size,
//!   so the shard of size `k + 1` is the shard of size `k` plus one member.
//! - **Removing a member outside a shard changes nothing in it**: no walk that built the shard
//!   stopped at (or passed) that member, or the member would have been chosen.
//! - **Balance**: many tokens per member give each member close to `1/n` of the ring.
//!
//! The hash is XXH3 (`xxhash-rust`): specified, stable across versions and platforms (unlike
//! `std`'s `DefaultHasher`), and fast. Nothing here is secret, so a non-cryptographic hash is
//! enough. A [`Ring`] is cheap to query but costs a sort to build: build it once per catalog
//! change and share it.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Tokens each member places on the ring. More tokens mean a more even share per member (the
/// spread of shares falls like `1/sqrt(tokens)`) at the cost of a bigger ring.
pub const TOKENS_PER_MEMBER: u64 = 512;

/// The shard size used for buckets without an override.
pub const DEFAULT_SHARD_SIZE: usize = 3;

/// Seed of the hash that steps from one point of a bucket's sequence to the next. Any constant
/// works; changing it reshuffles every bucket.
const STEP_SEED: u64 = 0x5350_494e_444c_4531; // "SPINDLE1"

/// The members (Directors) on a hash ring, ready to compute shards.
#[derive(Clone, Debug)]
pub struct Ring {
    /// Member names, sorted and distinct.
    members: Vec<String>,
    /// `(token, index into members)`, sorted.
    tokens: Vec<(u64, u32)>,
}

impl Ring {
    /// A ring over `members` (duplicates are ignored; order does not matter).
    pub fn new<S: AsRef<str>>(members: &[S]) -> Ring {
        let members: Vec<String> = members
            .iter()
            .map(|m| m.as_ref().to_owned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut tokens = Vec::with_capacity(members.len() * TOKENS_PER_MEMBER as usize);
        for (index, member) in members.iter().enumerate() {
            for t in 0..TOKENS_PER_MEMBER {
                tokens.push((xxh3_64_with_seed(member.as_bytes(), t), index as u32));
            }
        }
        // Ties between tokens (vanishingly rare) are broken by member order, so the ring is a
        // function of the member set alone.
        tokens.sort_unstable();
        Ring { members, tokens }
    }

    /// The members, sorted.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the ring has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The shard of `bucket`: `size` distinct members in the order they were chosen (the first
    /// is the bucket's primary). A size of 0, or one at least the number of members, means every
    /// member (Cortex's convention: 0 turns shuffle sharding off), still in chosen order.
    pub fn shard(&self, bucket: &str, size: usize) -> Vec<String> {
        let n = self.members.len();
        let want = if size == 0 { n } else { size.min(n) };
        let mut chosen = vec![false; n];
        let mut out = Vec::with_capacity(want);
        let mut point = xxh3_64(bucket.as_bytes());
        while out.len() < want {
            point = xxh3_64_with_seed(&point.to_le_bytes(), STEP_SEED);
            let start = self.tokens.partition_point(|&(token, _)| token < point);
            // Walk clockwise to the first member not chosen yet. There is one (out.len() < n),
            // so every turn of the outer loop adds a member and the loop ends whatever the
            // hash sequence does.
            for step in 0..self.tokens.len() {
                let (_, member) = self.tokens[(start + step) % self.tokens.len()];
                let member = member as usize;
                if !chosen[member] {
                    chosen[member] = true;
                    out.push(self.members[member].clone());
                    break;
                }
            }
        }
        out
    }
}

/// The shard of `bucket` among `members` (see [`Ring::shard`]). Builds a ring each call: keep a
/// [`Ring`] when computing many shards over the same members.
pub fn shard<S: AsRef<str>>(bucket: &str, size: usize, members: &[S]) -> Vec<String> {
    Ring::new(members).shard(bucket, size)
}

/// Shard sizes: a default and per-bucket overrides (for a big tenant that needs more Directors,
/// or a troublesome one to confine further).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardSizes {
    /// Size of buckets without an override (0: every Director).
    #[serde(default = "ShardSizes::default_size")]
    pub default: usize,
    /// Per-bucket sizes.
    #[serde(default)]
    pub overrides: HashMap<String, usize>,
}

impl ShardSizes {
    /// The default shard size, [`DEFAULT_SHARD_SIZE`].
    pub const fn default_size() -> usize {
        DEFAULT_SHARD_SIZE
    }

    /// The shard size of `bucket`.
    pub fn size_for(&self, bucket: &str) -> usize {
        self.overrides.get(bucket).copied().unwrap_or(self.default)
    }
}

impl Default for ShardSizes {
    fn default() -> Self {
        ShardSizes {
            default: DEFAULT_SHARD_SIZE,
            overrides: HashMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Property tests: deterministic (seeded) random buckets and member sets, many of them.

    use super::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("director-{i:03}")).collect()
    }

    fn random_bucket(rng: &mut StdRng) -> String {
        let len = rng.random_range(1..24);
        (0..len)
            .map(|_| char::from(rng.random_range(b'a'..=b'z')))
            .collect()
    }

    #[test]
    fn stable_for_the_same_inputs_whatever_the_member_order() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..500 {
            let n = rng.random_range(1..40);
            let mut m = members(n);
            let bucket = random_bucket(&mut rng);
            let size = rng.random_range(0..=n + 2);
            let first = shard(&bucket, size, &m);
            m.shuffle(&mut rng);
            assert_eq!(shard(&bucket, size, &m), first, "order of members matters");
            assert_eq!(Ring::new(&m).shard(&bucket, size), first, "not repeatable");
            let expected = if size == 0 { n } else { size.min(n) };
            assert_eq!(first.len(), expected);
            assert_eq!(
                first.iter().collect::<BTreeSet<_>>().len(),
                expected,
                "members repeat: {first:?}"
            );
        }
    }

    #[test]
    fn growing_a_shard_only_adds_members() {
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..300 {
            let n = rng.random_range(2..30);
            let ring = Ring::new(&members(n));
            let bucket = random_bucket(&mut rng);
            let mut previous = Vec::new();
            for size in 1..=n {
                let current = ring.shard(&bucket, size);
                assert_eq!(&current[..size - 1], &previous[..], "size {size} of {n}");
                previous = current;
            }
        }
    }

    #[test]
    fn removing_a_member_outside_the_shard_changes_nothing() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..500 {
            let n = rng.random_range(3..30);
            let all = members(n);
            let bucket = random_bucket(&mut rng);
            let size = rng.random_range(1..n);
            let before = shard(&bucket, size, &all);
            let outsiders: Vec<&String> = all.iter().filter(|m| !before.contains(m)).collect();
            let gone = outsiders[rng.random_range(0..outsiders.len())];
            let rest: Vec<&String> = all.iter().filter(|m| *m != gone).collect();
            assert_eq!(shard(&bucket, size, &rest), before, "removed {gone}");
        }
    }

    #[test]
    fn adding_a_member_moves_little() {
        let mut rng = StdRng::seed_from_u64(4);
        let (n, size, buckets) = (20, 4, 5_000);
        let before = Ring::new(&members(n));
        let mut grown = members(n);
        grown.push("director-new".to_owned());
        let after = Ring::new(&grown);
        let mut changed = 0usize;
        for _ in 0..buckets {
            let bucket = random_bucket(&mut rng);
            let a: BTreeSet<String> = before.shard(&bucket, size).into_iter().collect();
            let b: BTreeSet<String> = after.shard(&bucket, size).into_iter().collect();
            changed += a.difference(&b).count();
        }
        // A perfect scheme moves size/(n+1) members per shard on average (the newcomer's share).
        let ideal = size as f64 / (n + 1) as f64;
        let mean = changed as f64 / buckets as f64;
        assert!(mean < 2.0 * ideal, "mean moved {mean:.3}, ideal {ideal:.3}");
    }

    #[test]
    fn every_member_gets_roughly_its_share() {
        let mut rng = StdRng::seed_from_u64(5);
        for (n, size) in [(10, 3), (20, 4), (50, 5)] {
            let ring = Ring::new(&members(n));
            let buckets = 20_000;
            let mut counts: HashMap<String, usize> = HashMap::new();
            for _ in 0..buckets {
                for m in ring.shard(&random_bucket(&mut rng), size) {
                    *counts.entry(m).or_default() += 1;
                }
            }
            let expected = (buckets * size) as f64 / n as f64;
            assert_eq!(counts.len(), n, "some member never chosen");
            for (member, count) in counts {
                let ratio = count as f64 / expected;
                assert!(
                    (0.75..1.25).contains(&ratio),
                    "{member} has {count} shards, expected about {expected:.0} (n={n})"
                );
            }
        }
    }

    #[test]
    fn two_buckets_rarely_share_their_whole_shard() {
        let mut rng = StdRng::seed_from_u64(6);
        let (n, size, buckets) = (20, 4, 3_000);
        let ring = Ring::new(&members(n));
        let mut seen: HashMap<Vec<String>, usize> = HashMap::new();
        let mut names = BTreeSet::new();
        while names.len() < buckets {
            names.insert(random_bucket(&mut rng));
        }
        for bucket in &names {
            let mut s = ring.shard(bucket, size);
            s.sort();
            *seen.entry(s).or_default() += 1;
        }
        let identical_pairs: usize = seen.values().map(|c| c * (c - 1) / 2).sum();
        // Uniformly random shards: each pair is identical with probability 1 / C(20, 4).
        let pairs = (buckets * (buckets - 1) / 2) as f64;
        let expected = pairs / 4845.0;
        assert!(
            (identical_pairs as f64) < 2.0 * expected,
            "{identical_pairs} identical pairs, about {expected:.0} expected"
        );
    }

    #[test]
    fn sizes_default_and_overrides() {
        let sizes: ShardSizes =
            serde_json::from_str(r#"{"default": 2, "overrides": {"big": 6}}"#).unwrap();
        assert_eq!(sizes.size_for("big"), 6);
        assert_eq!(sizes.size_for("small"), 2);
        let defaulted: ShardSizes = serde_json::from_str("{}").unwrap();
        assert_eq!(defaulted, ShardSizes::default());
        assert_eq!(defaulted.size_for("any"), DEFAULT_SHARD_SIZE);
        assert!(shard("b", 3, &Vec::<String>::new()).is_empty());
    }
}
