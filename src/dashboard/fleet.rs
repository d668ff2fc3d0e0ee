//! Which JobDBs the dashboard reads, and a small connection pool to each.
//!
//! JobDBs come from the `--jobdb` list and, with a registry, from the Consul inventory (every
//! JobDB whose state is not `dropped`). [`Fleet::refresh`] re-reads the inventory, opens the
//! JobDBs it has not opened yet, tries again the ones it could not open, and closes the ones
//! that left. A JobDB that cannot be opened stays in the fleet as unreachable, with the
//! reason, so the page shows it instead of failing.

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::delivery::error_chain;
use crate::jobdb::{JobDb, JobDbUrl};
use crate::registry::inventory::{Inventory, JobDbState, Listed};
use crate::secret::redact_url;

/// What the inventory says about a JobDB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryInfo {
    /// Lifecycle state.
    pub state: JobDbState,
    /// When the state last changed.
    pub changed_at: DateTime<Utc>,
    /// Who changed it.
    pub changed_by: String,
    /// The id the holder of its lock wrote there (a Director or a drainer), while held.
    pub lock_holder: Option<String>,
}

/// One JobDB of the fleet. Its `Debug` leaves out the URL as given (it may hold a password).
#[derive(Clone)]
pub struct Member {
    /// Database name (the inventory's name).
    pub name: String,
    /// Its URL with any password replaced by `***`, for display.
    pub url: String,
    /// Its URL as given, to open it.
    open_url: String,
    /// The inventory's record, when it came from the inventory.
    pub inventory: Option<InventoryInfo>,
    /// The open pool, if the JobDB could be opened.
    pub db: Option<JobDb>,
    /// Why it could not be opened.
    pub error: Option<String>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("inventory", &self.inventory)
            .field("open", &self.db.is_some())
            .field("error", &self.error)
            .finish()
    }
}

/// A JobDB the fleet should hold: from `--jobdb` or the inventory.
struct Wanted {
    url: String,
    inventory: Option<InventoryInfo>,
}

/// The JobDBs the dashboard reads.
pub struct Fleet {
    /// `--jobdb`, by database name.
    configured: BTreeMap<String, String>,
    inventory: Option<Inventory>,
    pool_size: u32,
    open_timeout: Duration,
    members: RwLock<BTreeMap<String, Member>>,
    registry_error: RwLock<Option<String>>,
}

/// Errors in the list of JobDBs given.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A `--jobdb` is not a JobDB URL.
    #[error("--jobdb {url}: {source}")]
    InvalidUrl {
        /// The URL as given (password redacted).
        url: String,
        /// What is wrong with it.
        #[source]
        source: crate::jobdb::JobDbError,
    },
    /// Two `--jobdb` name databases of the same name: the dashboard tells JobDBs by name.
    #[error("--jobdb: two jobdbs are named {0}")]
    DuplicateName(String),
}

impl Fleet {
    /// A fleet of the JobDBs at `urls`, plus the inventory's if given; nothing is opened until
    /// [`Fleet::refresh`].
    pub fn new(
        urls: &[String],
        inventory: Option<Inventory>,
        pool_size: u32,
        open_timeout: Duration,
    ) -> Result<Self, FleetError> {
        let mut configured = BTreeMap::new();
        for url in urls {
            let parsed: JobDbUrl = url.parse().map_err(|source| FleetError::InvalidUrl {
                url: redact_url(url),
                source,
            })?;
            if configured
                .insert(parsed.database.clone(), url.clone())
                .is_some()
            {
                return Err(FleetError::DuplicateName(parsed.database));
            }
        }
        Ok(Fleet {
            configured,
            inventory,
            pool_size: pool_size.max(1),
            open_timeout,
            members: RwLock::new(BTreeMap::new()),
            registry_error: RwLock::new(None),
        })
    }

    /// Whether JobDBs also come from the Consul inventory.
    pub fn uses_registry(&self) -> bool {
        self.inventory.is_some()
    }

    /// The JobDBs now, sorted by name.
    pub fn members(&self) -> Vec<Member> {
        self.members
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Why the inventory could not be read in the last round, if it could not.
    pub fn registry_error(&self) -> Option<String> {
        self.registry_error
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// One round of discovery: re-read the inventory, open new and previously unreachable
    /// JobDBs (all at once, each within the open timeout), close those that left. While the
    /// inventory cannot be read, the JobDBs found before are kept.
    pub async fn refresh(&self) {
        let current = self.members();
        let wanted = self.wanted(&current).await;
        let to_open: Vec<(String, String)> = wanted
            .iter()
            .filter(|(name, w)| {
                !current
                    .iter()
                    .any(|m| &m.name == *name && m.db.is_some() && m.open_url == w.url)
            })
            .map(|(name, w)| (name.clone(), w.url.clone()))
            .collect();
        let opened = futures::future::join_all(
            to_open
                .into_iter()
                .map(|(name, url)| async move { (name, self.open(&url).await) }),
        )
        .await;
        let mut opened: BTreeMap<String, Result<JobDb, String>> = opened.into_iter().collect();

        let mut next = BTreeMap::new();
        for (name, w) in wanted {
            let previous = current.iter().find(|m| m.name == name);
            let (db, error) = match opened.remove(&name) {
                Some(Ok(db)) => {
                    if previous.is_some_and(|m| m.db.is_none()) {
                        tracing::info!(jobdb = %name, "jobdb reachable again");
                    }
                    (Some(db), None)
                }
                Some(Err(error)) => {
                    if previous.is_none_or(|m| m.error.as_ref() != Some(&error)) {
                        tracing::warn!(jobdb = %name, %error, "jobdb unreachable; trying again later");
                    }
                    (None, Some(error))
                }
                None => (previous.and_then(|m| m.db.clone()), None),
            };
            next.insert(
                name.clone(),
                Member {
                    name,
                    url: redact_url(&w.url),
                    open_url: w.url,
                    inventory: w.inventory,
                    db,
                    error,
                },
            );
        }
        // Pools of JobDBs that left, or whose URL changed (a new pool was opened).
        let gone: Vec<Member> = current
            .into_iter()
            .filter(|m| next.get(&m.name).is_none_or(|n| n.open_url != m.open_url))
            .collect();
        *self
            .members
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = next;
        for member in gone {
            if let Some(db) = member.db {
                tracing::info!(jobdb = %member.name, "jobdb left the dashboard");
                db.close().await;
            }
        }
    }

    /// Closes every pool.
    pub async fn close(&self) {
        let members = std::mem::take(
            &mut *self
                .members
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for db in members.into_values().filter_map(|m| m.db) {
            db.close().await;
        }
    }

    /// The JobDBs this round should hold, by name: `--jobdb` first, the inventory's records
    /// on top (the inventory knows the state). Keeps `current` when the inventory fails.
    async fn wanted(&self, current: &[Member]) -> BTreeMap<String, Wanted> {
        let mut wanted: BTreeMap<String, Wanted> = self
            .configured
            .iter()
            .map(|(name, url)| {
                (
                    name.clone(),
                    Wanted {
                        url: url.clone(),
                        inventory: None,
                    },
                )
            })
            .collect();
        let Some(inventory) = &self.inventory else {
            return wanted;
        };
        let listed = inventory.list().await;
        let error = listed.as_ref().err().map(|e| error_chain(e));
        *self
            .registry_error
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = error;
        match listed {
            Ok(listed) => {
                for l in listed {
                    if l.record.state != JobDbState::Dropped {
                        let url = inventory.connect_url(&l.record).expose().to_owned();
                        wanted.insert(l.record.name.clone(), wanted_of(l, url));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "inventory unreadable; keeping the jobdbs found before");
                for m in current.iter().filter(|m| m.inventory.is_some()) {
                    wanted.entry(m.name.clone()).or_insert_with(|| Wanted {
                        url: m.open_url.clone(),
                        inventory: m.inventory.clone(),
                    });
                }
            }
        }
        wanted
    }

    /// Opens one JobDB with a small pool, or says why it could not.
    async fn open(&self, url: &str) -> Result<JobDb, String> {
        let parsed: JobDbUrl = url.parse().map_err(|e| error_chain(&e))?;
        let open = async {
            crate::jobdb::probe(&parsed).await?;
            JobDb::open_reader(&parsed, self.pool_size).await
        };
        match tokio::time::timeout(self.open_timeout, open).await {
            Ok(Ok(db)) => Ok(db),
            Ok(Err(e)) => Err(error_chain(&e)),
            Err(_) => Err(format!(
                "no answer within {} ms",
                self.open_timeout.as_millis()
            )),
        }
    }
}

fn wanted_of(l: Listed, url: String) -> Wanted {
    Wanted {
        url,
        inventory: Some(InventoryInfo {
            state: l.record.state,
            changed_at: l.record.changed_at,
            changed_by: l.record.changed_by,
            lock_holder: l.holder.and(l.holder_id),
        }),
    }
}
