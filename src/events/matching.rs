//! The index that finds an event's subscriptions: by bucket, then by the event's exact type,
//! then by each of its dotted prefixes (`invoice.line.added` looks up `invoice.*` and
//! `invoice.line.*`), then `*`. A lookup costs the type's depth, not the number of
//! subscriptions.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{Pattern, Subscription};

/// Every subscription a process knows, indexed for matching. Built whole by the cache after
/// each change; never changed in place.
#[derive(Debug, Default)]
pub struct Index {
    by_id: BTreeMap<ulid::Ulid, Arc<Subscription>>,
    /// Removed subscriptions: matched by nothing, kept for their jobs' signatures.
    removed: HashMap<ulid::Ulid, Arc<Subscription>>,
    buckets: HashMap<String, BucketIndex>,
}

#[derive(Debug, Default)]
struct BucketIndex {
    exact: HashMap<String, Vec<Arc<Subscription>>>,
    prefix: HashMap<String, Vec<Arc<Subscription>>>,
    all: Vec<Arc<Subscription>>,
}

impl Index {
    /// The index of `subscriptions`.
    pub fn new(subscriptions: impl IntoIterator<Item = Arc<Subscription>>) -> Index {
        let mut index = Index::default();
        for s in subscriptions {
            let bucket = index.buckets.entry(s.bucket().to_owned()).or_default();
            for pattern in &s.patterns {
                let list = match pattern {
                    Pattern::Exact(t) => bucket.exact.entry(t.clone()).or_default(),
                    Pattern::Prefix(p) => bucket.prefix.entry(p.clone()).or_default(),
                    Pattern::All => &mut bucket.all,
                };
                // A subscription naming overlapping patterns is listed once per pattern;
                // `matching` drops the repeats.
                list.push(s.clone());
            }
            index.by_id.insert(s.id, s);
        }
        index
    }

    /// The index with these removed subscriptions known by id.
    pub fn with_removed(mut self, removed: impl IntoIterator<Item = Arc<Subscription>>) -> Index {
        self.removed = removed.into_iter().map(|s| (s.id, s)).collect();
        self
    }

    /// A removed subscription with this id.
    pub fn removed(&self, id: &ulid::Ulid) -> Option<&Arc<Subscription>> {
        self.removed.get(id)
    }

    /// The subscription with this id.
    pub fn get(&self, id: &ulid::Ulid) -> Option<&Arc<Subscription>> {
        self.by_id.get(id)
    }

    /// Every subscription, in id order (creation order).
    pub fn all(&self) -> Vec<Arc<Subscription>> {
        self.by_id.values().cloned().collect()
    }

    /// The subscriptions after the id `after` (all without it), in id order.
    pub fn after(&self, after: Option<ulid::Ulid>) -> impl Iterator<Item = &Arc<Subscription>> {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = after.map_or(Unbounded, Excluded);
        self.by_id.range((from, Unbounded)).map(|(_, s)| s)
    }

    /// How many subscriptions it holds.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The subscriptions of `bucket` whose event types take `event_type`, each once, in id
    /// order; payload filters are the caller's (they need the payload parsed).
    pub fn matching(&self, bucket: &str, event_type: &str) -> Vec<Arc<Subscription>> {
        let Some(b) = self.buckets.get(bucket) else {
            return Vec::new();
        };
        let mut found: Vec<Arc<Subscription>> = Vec::new();
        if let Some(list) = b.exact.get(event_type) {
            found.extend(list.iter().cloned());
        }
        for (i, _) in event_type.match_indices('.') {
            if let Some(list) = b.prefix.get(&event_type[..=i]) {
                found.extend(list.iter().cloned());
            }
        }
        found.extend(b.all.iter().cloned());
        found.sort_by_key(|s| s.id);
        found.dedup_by_key(|s| s.id);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_client::NewSubscription;

    fn sub(bucket: &str, types: &[&str]) -> Arc<Subscription> {
        let given = NewSubscription::new(bucket, "https://example.com/", types.iter().copied());
        Arc::new(crate::events::subscription::check(given).unwrap())
    }

    #[test]
    fn finds_exact_prefix_and_all_within_the_bucket_once_each() {
        let exact = sub("t1", &["invoice.paid"]);
        let prefix = sub("t1", &["invoice.*"]);
        let deep = sub("t1", &["invoice.line.*", "invoice.line.added"]);
        let all = sub("t1", &["*"]);
        let other_bucket = sub("t2", &["*"]);
        let other_type = sub("t1", &["customer.*"]);
        let index = Index::new(
            [&exact, &prefix, &deep, &all, &other_bucket, &other_type]
                .into_iter()
                .cloned(),
        );
        let ids = |bucket, t| -> Vec<ulid::Ulid> {
            index.matching(bucket, t).iter().map(|s| s.id).collect()
        };
        // Ids made in one millisecond need not ascend: matching answers in id order.
        let sorted = |mut v: Vec<ulid::Ulid>| {
            v.sort();
            v
        };
        assert_eq!(
            ids("t1", "invoice.paid"),
            sorted(vec![exact.id, prefix.id, all.id])
        );
        assert_eq!(
            ids("t1", "invoice.line.added"),
            sorted(vec![prefix.id, deep.id, all.id])
        );
        assert_eq!(ids("t1", "invoice"), vec![all.id]);
        assert_eq!(ids("t2", "invoice.paid"), vec![other_bucket.id]);
        assert!(ids("t3", "invoice.paid").is_empty());
        assert_eq!(index.len(), 6);
    }

    #[test]
    fn many_buckets_keep_apart() {
        let subs: Vec<_> = (0..2_000)
            .map(|i| sub(&format!("b{}", i % 100), &[&format!("type{}.x", i % 10)]))
            .collect();
        let index = Index::new(subs.clone());
        let found = index.matching("b7", "type7.x");
        let expected: Vec<_> = subs
            .iter()
            .filter(|s| s.bucket() == "b7" && s.spec.given.event_types[0] == "type7.x")
            .map(|s| s.id)
            .collect();
        assert_eq!(found.iter().map(|s| s.id).collect::<Vec<_>>(), expected);
        assert_eq!(expected.len(), 20);
    }
}
