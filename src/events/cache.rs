//! Each process's copy of the subscriptions ([`Subscriptions`]): publishing matches from
//! memory, never from the control database. A refresher reads the rows changed since the
//! version it holds every [`REFRESH_EVERY`] (every change takes a version, an operator's SQL
//! too: the control schema's triggers), so an edit reaches every router and Director within
//! about a second. Edits ([`Subscriptions::edit`]) read the row as it is and write it only if
//! it is still so.

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
/// How many times an edit reads the row again after another change overtook it.
const EDIT_TRIES: usize = 5;

/// The subscriptions a process knows, and the control database they come from.
pub struct Subscriptions {
    db: ControlDb,
    limits: IntakeLimits,
    index: RwLock<Arc<Index>>,
    state: Mutex<State>,
    gate: watch::Sender<Arc<SubscriptionGate>>,
    caps: watch::Sender<Arc<EndpointCaps>>,
}

/// The subscription gate: whose jobs wait instead of being sent. A subscription's that is
/// disabled, or that this process does not know (made elsewhere and not read here yet; none,
/// without a control database). Waiting for a subscription is not failing its endpoint: such
/// a job uses no attempt and tells its URL's breaker nothing; it goes once the subscription
/// is known and enabled, or ends at its expiry.
#[derive(Clone, Debug, Default)]
pub struct SubscriptionGate {
    disabled: HashSet<Ulid>,
    known: Arc<Index>,
}

impl SubscriptionGate {
    /// Whether the jobs of `subscription` wait.
    pub fn holds(&self, subscription: &Ulid) -> bool {
        self.disabled.contains(subscription)
            || (self.known.get(subscription).is_none()
                && self.known.removed(subscription).is_none())
    }

    /// Whether the two hold back the jobs of the same known subscriptions (those newly
    /// known aside).
    pub fn same_disabled(&self, other: &SubscriptionGate) -> bool {
        self.disabled == other.disabled
    }

    /// How many subscriptions are disabled.
    pub fn disabled(&self) -> usize {
        self.disabled.len()
    }
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

/// The subscriptions' caps by endpoint (`job::lane` of their URLs), the tightest when
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
}

/// What [`Subscriptions::edit`] did.
#[derive(Debug)]
pub enum Edited {
    /// Written: the subscription as it is now.
    Done(Arc<Subscription>),
    /// There is no such live subscription.
    Missing,
    /// The row is at another version than the one the editor read (`If-Match`): nothing
    /// was written.
    Stale {
        /// The row's version now.
        current: u64,
    },
}

/// Why an edit was not written.
#[derive(Debug, thiserror::Error)]
pub enum EditError<E> {
    /// The control database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The edit refused the subscription as it is (or what it would make of it).
    #[error("the edit was refused")]
    Refused(E),
    /// The stored row cannot be read as a subscription (an operator's SQL): fix it in SQL.
    #[error("the stored subscription is not valid: {0}")]
    Unreadable(String),
    /// Other changes overtook this one every time it was tried.
    #[error("the subscription kept changing while this edit was written")]
    Contended,
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
        let (gate, _) = watch::channel(Arc::default());
        let (caps, _) = watch::channel(Arc::default());
        let cache = Arc::new(Subscriptions {
            db,
            limits,
            index: RwLock::new(Arc::default()),
            state: Mutex::new(State::default()),
            gate,
            caps,
        });
        cache.refresh().await?;
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

    /// Follows the subscription gate: whose jobs wait (a Director's scheduler sets them aside).
    pub fn gate(&self) -> watch::Receiver<Arc<SubscriptionGate>> {
        self.gate.subscribe()
    }

    /// Follows the caps subscriptions put on their URLs (a Director's scheduler applies them
    /// with the endpoint controls, the tighter of the two).
    pub fn caps(&self) -> watch::Receiver<Arc<EndpointCaps>> {
        self.caps.subscribe()
    }

    /// Enables or disables the subscription `id` (its other fields as they are now in the
    /// control database), committed there and read back here.
    pub async fn set_enabled(
        &self,
        id: Ulid,
        enabled: bool,
    ) -> Result<Edited, EditError<std::convert::Infallible>> {
        self.edit(id, None, |current| {
            let mut next = current.clone();
            next.spec.given.enabled = Some(enabled);
            next.spec.updated_at = chrono::Utc::now();
            Ok(next)
        })
        .await
    }

    /// Edits the subscription `id` as its row is now, not as this cache last read it:
    /// `change` gets the current subscription and returns what to write (or refuses). The
    /// write holds only if nobody changed the row since it was read; otherwise the row is read
    /// again and `change` applied again, so concurrent edits of different fields both hold.
    /// With `expected` (the version the caller read, `If-Match`), a row at another version
    /// is left alone ([`Edited::Stale`]).
    pub async fn edit<E>(
        &self,
        id: Ulid,
        expected: Option<u64>,
        change: impl Fn(&Subscription) -> Result<Subscription, E>,
    ) -> Result<Edited, EditError<E>> {
        for _ in 0..EDIT_TRIES {
            let Some(row) = self.db.read(id).await? else {
                return Ok(Edited::Missing);
            };
            if let Some(v) = expected.filter(|v| *v != row.version) {
                tracing::debug!(subscription = %id, expected = v, current = row.version, "edit of an older version refused");
                return Ok(Edited::Stale {
                    current: row.version,
                });
            }
            let current = self.subscription_of(&row).map_err(EditError::Unreadable)?;
            let mut next = change(&current).map_err(EditError::Refused)?;
            if let Some(version) = self.db.update(id, &next.spec, row.version).await? {
                next.version = version;
                if let Err(e) = self.refresh().await {
                    tracing::warn!(error = %e, "reading subscriptions back failed; the refresher will");
                }
                let now = self.index().get(&id).cloned();
                return Ok(Edited::Done(
                    now.filter(|s| s.version >= version)
                        .unwrap_or_else(|| Arc::new(next)),
                ));
            }
        }
        Err(EditError::Contended)
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
                    .is_some_and(|held| held.subscription.version > row.version)
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

    /// Refreshes every [`REFRESH_EVERY`] until `stop`. A failed read keeps what is known and
    /// tries again.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
            }
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "reading subscriptions failed; keeping the ones known");
            }
        }
    }

    /// A row as the subscription it holds, checked again (the `enabled` column wins over the
    /// spec's), or what is wrong with it.
    fn subscription_of(&self, row: &ChangedRow) -> Result<Subscription, String> {
        let stored: Stored =
            serde_json::from_str(&row.spec).map_err(|e| format!("spec is not readable: {e}"))?;
        let mut s = Subscription::from_stored(row.id, stored, &self.limits)
            .map_err(|e| format!("{} {}", e.field, e.message))?;
        s.spec.given.enabled = Some(row.enabled);
        s.version = row.version;
        Ok(s)
    }

    /// A changed row as a subscription, or `None` when it cannot be read (an operator's bad
    /// row is left out, with a warning; it stops nothing else).
    fn checked(&self, row: &ChangedRow) -> Option<Row> {
        match self.subscription_of(row) {
            Ok(s) => Some(Row {
                subscription: Arc::new(s),
                removed: row.removed,
            }),
            Err(e) => {
                tracing::warn!(subscription = %row.id, error = %e, "stored subscription is not valid; left out");
                None
            }
        }
    }

    /// Builds the index from the rows held, and tells who follows whose jobs wait or the
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
                    let endpoint = crate::job::lane(&s.spec.given.url).to_owned();
                    let held = caps.entry(endpoint).or_insert(cap);
                    *held = held.tighter(cap);
                }
            }
            (index, disabled, caps)
        };
        let index = Arc::new(index);
        *self
            .index
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = index.clone();
        // Every change may make a subscription known: its waiting jobs go.
        self.gate.send_replace(Arc::new(SubscriptionGate {
            disabled,
            known: index,
        }));
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

    fn sends_traceparent(&self, id: &Ulid) -> bool {
        let index = self.index();
        index
            .get(id)
            .or_else(|| index.removed(id))
            .is_none_or(|s| s.spec.given.send_traceparent != Some(false))
    }
}
