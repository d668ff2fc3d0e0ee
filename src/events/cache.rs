//! Each process's copy of the subscriptions ([`Subscriptions`]): publishing matches from
//! memory, never from the control database. A refresher reads the rows changed since the
//! version it holds every [`REFRESH_EVERY`] (and everything every [`RELOAD_EVERY`], for an
//! operator's SQL that did not take a version), so an edit reaches every router and Director
//! within about a second.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::store::{ChangedRow, ControlDb, StoreError};
use super::subscription::{Stored, Subscription};
use super::Index;
use crate::delivery::signing::{SigningSecret, SubscriptionSecrets};
use crate::rpc::api::IntakeLimits;

/// How often the control database is asked for changes.
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);
/// How often everything is read again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(30);

/// The subscriptions a process knows, and the control database they come from.
pub struct Subscriptions {
    db: ControlDb,
    limits: IntakeLimits,
    index: RwLock<Arc<Index>>,
    state: Mutex<State>,
    disabled: watch::Sender<Arc<HashSet<Ulid>>>,
    caps: watch::Sender<Arc<EndpointCaps>>,
}

/// Caps on an endpoint's requests, per Director.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cap {
    /// Most requests in flight.
    pub max_concurrency: Option<u32>,
    /// Most requests started per second.
    pub max_per_second: Option<f64>,
}

impl Cap {
    /// The tighter of each of the two caps.
    pub fn tighter(self, other: Cap) -> Cap {
        fn least<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        Cap {
            max_concurrency: least(self.max_concurrency, other.max_concurrency),
            max_per_second: least(self.max_per_second, other.max_per_second),
        }
    }
}

/// The subscriptions' caps by endpoint (`job::endpoint_key` of their URLs), the tightest when
/// several subscriptions share one.
pub type EndpointCaps = HashMap<String, Cap>;

#[derive(Default)]
struct State {
    version: u64,
    /// By id, removed ones included (their jobs already made are still signed with their
    /// secret).
    rows: HashMap<Ulid, Row>,
}

/// A subscription read from the store.
struct Row {
    subscription: Arc<Subscription>,
    removed: bool,
    /// The change it was read at.
    version: u64,
    /// What it was made from (its stored columns, hashed): a reload that reads the same keeps
    /// it instead of checking it again.
    read: u64,
}

/// The stored columns a row is made from, hashed.
fn read_of(row: &ChangedRow) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(row.spec.as_bytes());
    h.update(&[u8::from(row.enabled), u8::from(row.removed)]);
    h.update(&row.version.to_le_bytes());
    h.digest()
}

impl std::fmt::Debug for Subscriptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriptions")
            .field("known", &self.index().len())
            .finish()
    }
}

impl Subscriptions {
    /// A cache of `db`, read whole before it is returned. `limits` checks stored rows as
    /// intake checks a job.
    pub async fn load(
        db: ControlDb,
        limits: IntakeLimits,
    ) -> Result<Arc<Subscriptions>, StoreError> {
        let (disabled, _) = watch::channel(Arc::default());
        let (caps, _) = watch::channel(Arc::default());
        let cache = Arc::new(Subscriptions {
            db,
            limits,
            index: RwLock::new(Arc::default()),
            state: Mutex::new(State::default()),
            disabled,
            caps,
        });
        cache.reload().await?;
        Ok(cache)
    }

    /// The control database.
    pub fn db(&self) -> &ControlDb {
        &self.db
    }

    /// The index as of the last refresh.
    pub fn index(&self) -> Arc<Index> {
        self.index
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The subscription's signing key, if it is known here (removed ones included).
    pub fn secret(&self, id: &Ulid) -> Option<SigningSecret> {
        <Self as SubscriptionSecrets>::secret(self, id)
    }

    /// Follows the set of disabled subscriptions (a Director's scheduler parks their jobs).
    pub fn disabled(&self) -> watch::Receiver<Arc<HashSet<Ulid>>> {
        self.disabled.subscribe()
    }

    /// Follows the caps subscriptions put on their URLs (a Director's scheduler applies them
    /// with the endpoint controls, the tighter of the two).
    pub fn caps(&self) -> watch::Receiver<Arc<EndpointCaps>> {
        self.caps.subscribe()
    }

    /// Enables or disables the subscription `id` (its other fields as they are), committed to
    /// the control database and read back here; `Ok(None)` when there is no such live
    /// subscription.
    pub async fn set_enabled(
        &self,
        id: Ulid,
        enabled: bool,
    ) -> Result<Option<Arc<Subscription>>, StoreError> {
        let Some(current) = self.index().get(&id).cloned() else {
            return Ok(None);
        };
        let mut spec = current.spec.clone();
        spec.given.enabled = Some(enabled);
        spec.updated_at = chrono::Utc::now();
        if self.db.update(id, &spec).await?.is_none() {
            return Ok(None);
        }
        self.refresh().await?;
        Ok(self.index().get(&id).cloned())
    }

    /// Reads the changes since the version held, and applies them. Returns whether anything
    /// changed.
    pub async fn refresh(&self) -> Result<bool, StoreError> {
        let mut after = self.lock().version;
        let mut changed = Vec::new();
        loop {
            let page = self.db.changes(after).await?;
            let Some(last) = page.last() else { break };
            after = last.version;
            changed.extend(page);
        }
        if changed.is_empty() {
            return Ok(false);
        }
        {
            let mut state = self.lock();
            for row in changed {
                state.version = state.version.max(row.version);
                // Two refreshes at once (the refresher's, a handler's after its write) may
                // apply in either order: a row read at an older change never replaces newer.
                if state
                    .rows
                    .get(&row.id)
                    .is_some_and(|held| held.version > row.version)
                {
                    continue;
                }
                match self.checked(&row) {
                    Some(s) => state.rows.insert(row.id, s),
                    None => state.rows.remove(&row.id),
                };
            }
        }
        self.publish();
        Ok(true)
    }

    /// Reads everything again (an operator's SQL may have changed rows without a version).
    /// Rows read as they were are kept as they are: only what changed is checked again, and
    /// the index is rebuilt only if anything did.
    pub async fn reload(&self) -> Result<(), StoreError> {
        let mut read = Vec::new();
        let mut after = 0;
        loop {
            let page = self.db.changes(after).await?;
            let Some(last) = page.last() else { break };
            after = last.version;
            read.extend(page);
        }
        let changed = {
            let mut state = self.lock();
            let mut rows = HashMap::with_capacity(read.len());
            let mut changed = read.len() != state.rows.len();
            for row in read {
                let same = read_of(&row);
                match state.rows.remove(&row.id) {
                    Some(held) if held.read == same => {
                        rows.insert(row.id, held);
                    }
                    _ => {
                        changed = true;
                        if let Some(s) = self.checked(&row) {
                            rows.insert(row.id, s);
                        }
                    }
                }
            }
            changed |= !state.rows.is_empty();
            state.version = after;
            state.rows = rows;
            changed
        };
        if changed {
            self.publish();
        }
        Ok(())
    }

    /// Refreshes every [`REFRESH_EVERY`] and reloads every [`RELOAD_EVERY`] until `stop`. A
    /// failed read keeps what is known and tries again.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut last_reload = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
            }
            let read = if last_reload.elapsed() >= RELOAD_EVERY {
                last_reload = tokio::time::Instant::now();
                self.reload().await.map(|_| true)
            } else {
                self.refresh().await
            };
            if let Err(e) = read {
                tracing::warn!(error = %e, "reading subscriptions failed; keeping the ones known");
            }
        }
    }

    /// A changed row as a subscription, or `None` when it cannot be read (an operator's bad
    /// row is left out, with a warning; it stops nothing else).
    fn checked(&self, row: &ChangedRow) -> Option<Row> {
        let stored: Stored = match serde_json::from_str(&row.spec) {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(subscription = %row.id, error = %e, "subscription spec is not readable; left out");
                return None;
            }
        };
        match Subscription::from_stored(row.id, stored, &self.limits) {
            Ok(mut s) => {
                s.spec.given.enabled = Some(row.enabled);
                Some(Row {
                    subscription: Arc::new(s),
                    removed: row.removed,
                    version: row.version,
                    read: read_of(row),
                })
            }
            Err(e) => {
                tracing::warn!(subscription = %row.id, field = %e.field, error = %e.message, "stored subscription is not valid; left out");
                None
            }
        }
    }

    /// Builds the index from the rows held, and tells who follows the disabled set or the
    /// caps.
    fn publish(&self) {
        let (index, disabled, caps) = {
            let state = self.lock();
            let (removed, live): (Vec<&Row>, Vec<&Row>) =
                state.rows.values().partition(|r| r.removed);
            let index = Index::new(live.iter().map(|r| r.subscription.clone()))
                .with_removed(removed.iter().map(|r| r.subscription.clone()));
            let disabled: HashSet<Ulid> = live
                .iter()
                .filter(|r| !r.subscription.enabled())
                .map(|r| r.subscription.id)
                .collect();
            let mut caps = EndpointCaps::new();
            for s in live.iter().map(|r| &r.subscription) {
                if let Some((max_concurrency, max_per_second)) = s.caps() {
                    let cap = Cap {
                        max_concurrency,
                        max_per_second,
                    };
                    let endpoint = crate::job::endpoint_key(&s.spec.given.url).to_owned();
                    let held = caps.entry(endpoint).or_insert(cap);
                    *held = held.tighter(cap);
                }
            }
            (index, disabled, caps)
        };
        *self
            .index
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(index);
        self.disabled.send_if_modified(|current| {
            let changed = **current != disabled;
            if changed {
                *current = Arc::new(disabled);
            }
            changed
        });
        self.caps.send_if_modified(|current| {
            let changed = **current != caps;
            if changed {
                *current = Arc::new(caps);
            }
            changed
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl SubscriptionSecrets for Subscriptions {
    fn secret(&self, id: &Ulid) -> Option<SigningSecret> {
        let index = self.index();
        index
            .get(id)
            .or_else(|| index.removed(id))
            .map(|s| s.secret.clone())
    }
}
