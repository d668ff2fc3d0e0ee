//! The JobDB inventory in Consul KV.
//!
//! `spindle/jobdbs/<name>` holds a JSON [`JobDbRecord`]: where the JobDB lives and its
//! lifecycle state. `spindle/locks/jobdbs/<name>` is the JobDB's lock key; its holder's session
//! is the owner. Lock keys are never deleted (their `ModifyIndex` is the fencing token). Names
//! are `[a-z0-9_]` so keys are valid on every Consul version.
//!
//! Records hold no passwords: [`Inventory::add`] stores a JobDB's URL without its password, and
//! every reader connects through [`Inventory::jobdb_url`], which fills in the password its
//! [`ConsulClient`] was configured with (`--jobdb-password`). Consul KV is readable by whoever
//! holds a read token; a database password does not belong there.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::consul::{ConsulClient, Put, ReadOptions};
use super::RegistryError;

/// Prefix of the inventory records.
pub const RECORDS: &str = "spindle/jobdbs/";
/// Prefix of the JobDB lock keys.
pub const LOCKS: &str = "spindle/locks/jobdbs/";

/// Where a JobDB is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobDbState {
    /// Migrated and waiting for a Director.
    Spare,
    /// Owned by a Director taking new jobs.
    Active,
    /// Its Director takes no new jobs into it; a drainer will take it.
    Retiring,
    /// A drainer is moving its remaining jobs out.
    Draining,
    /// Every job in it is terminal and moved histories are archived: the manager drops it.
    Drained,
    /// Dropped.
    Dropped,
}

/// One JobDB as the inventory knows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDbRecord {
    /// Database name (also the key segment).
    pub name: String,
    /// Connection URL without a password (`mysql://user@host:port/name`); records written
    /// by earlier releases may still carry one.
    pub url: String,
    /// Lifecycle state.
    pub state: JobDbState,
    /// When the state last changed.
    pub changed_at: DateTime<Utc>,
    /// Who set the state (a Director's holder name, the manager, an operator).
    #[serde(default)]
    pub changed_by: String,
}

impl std::fmt::Debug for JobDbRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobDbRecord")
            .field("name", &self.name)
            .field("url", &crate::secret::redact_url(&self.url))
            .field("state", &self.state)
            .field("changed_at", &self.changed_at)
            .field("changed_by", &self.changed_by)
            .finish()
    }
}

/// A record with its check-and-set index, and the session holding its lock if any.
#[derive(Clone, Debug)]
pub struct Listed {
    /// The record.
    pub record: JobDbRecord,
    /// Its ModifyIndex, for check-and-set updates.
    pub modify_index: u64,
    /// The session holding the JobDB's lock, if any.
    pub holder: Option<String>,
    /// The Director id written in the lock key by its last holder (kept after release).
    pub holder_id: Option<String>,
}

/// The inventory, read and written through Consul KV.
#[derive(Clone, Debug)]
pub struct Inventory {
    client: ConsulClient,
}

/// Whether `name` may be an inventory name.
pub fn valid_name(name: &str) -> bool {
    (1..=48).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl Inventory {
    /// The inventory behind `client`.
    pub fn new(client: ConsulClient) -> Self {
        Inventory { client }
    }

    /// The client underneath.
    pub fn client(&self) -> &ConsulClient {
        &self.client
    }

    /// Where a JobDB of the inventory is, ready to connect to: its record's URL with the
    /// configured JobDB password filled in when the URL names a user but no password.
    pub fn jobdb_url(
        &self,
        record: &JobDbRecord,
    ) -> Result<crate::jobdb::JobDbUrl, crate::jobdb::JobDbError> {
        self.connect_url(record).expose().parse()
    }

    /// [`Inventory::jobdb_url`] as text (it prints without its password).
    pub fn connect_url(&self, record: &JobDbRecord) -> crate::secret::SecretUrl {
        match (url::Url::parse(&record.url), self.client.jobdb_password()) {
            (Ok(mut url), Some(password))
                if url.password().is_none()
                    && !url.username().is_empty()
                    && matches!(url.scheme(), "mysql" | "mariadb") =>
            {
                let _ = url.set_password(Some(password.expose()));
                crate::secret::SecretUrl::new(url.as_str())
            }
            _ => crate::secret::SecretUrl::new(record.url.as_str()),
        }
    }

    /// The lock key of a JobDB.
    pub fn lock_key(name: &str) -> String {
        format!("{LOCKS}{name}")
    }

    /// Adds a JobDB (its URL stored without a password); `false` if one of that name exists
    /// already.
    pub async fn add(&self, record: &JobDbRecord) -> Result<bool, RegistryError> {
        if !valid_name(&record.name) {
            return Err(RegistryError::Config(format!(
                "jobdb name {:?} must be 1 to 48 of [a-z0-9_]",
                record.name
            )));
        }
        let mut record = record.clone();
        record.url = without_password(&record.url);
        let value =
            serde_json::to_vec(&record).map_err(|e| RegistryError::Decode(e.to_string()))?;
        self.client
            .kv_put(&format!("{RECORDS}{}", record.name), &value, Put::Cas(0))
            .await
    }

    /// Every JobDB with its lock holder, sorted by name.
    pub async fn list(&self) -> Result<Vec<Listed>, RegistryError> {
        let records = self
            .client
            .kv_list(RECORDS, ReadOptions::default())
            .await?
            .value;
        let locks = self
            .client
            .kv_list(LOCKS, ReadOptions::default())
            .await?
            .value;
        let mut out = Vec::with_capacity(records.len());
        for entry in records {
            let record: JobDbRecord = serde_json::from_slice(&entry.value)
                .map_err(|e| RegistryError::Decode(format!("{}: {e}", entry.key)))?;
            let lock_key = Self::lock_key(&record.name);
            let lock = locks.iter().find(|l| l.key == lock_key);
            out.push(Listed {
                record,
                modify_index: entry.modify_index,
                holder: lock.and_then(|l| l.session.clone()),
                holder_id: lock
                    .and_then(|l| String::from_utf8(l.value.clone()).ok())
                    .filter(|v| !v.is_empty()),
            });
        }
        Ok(out)
    }

    /// One JobDB with its lock holder, if it is in the inventory.
    pub async fn get(&self, name: &str) -> Result<Option<Listed>, RegistryError> {
        Ok(self
            .list()
            .await?
            .into_iter()
            .find(|l| l.record.name == name))
    }

    /// Moves a JobDB to `state` if its record is still at `modify_index`; `false` if it moved.
    pub async fn set_state(
        &self,
        listed: &Listed,
        state: JobDbState,
        by: &str,
    ) -> Result<bool, RegistryError> {
        let mut record = listed.record.clone();
        record.state = state;
        record.changed_at = Utc::now();
        record.changed_by = by.to_owned();
        let value =
            serde_json::to_vec(&record).map_err(|e| RegistryError::Decode(e.to_string()))?;
        self.client
            .kv_put(
                &format!("{RECORDS}{}", record.name),
                &value,
                Put::Cas(listed.modify_index),
            )
            .await
    }

    /// JobDBs a Director may take, best first: active ones whose owner is gone (their jobs
    /// need a Director now), then spares.
    pub async fn candidates(&self) -> Result<Vec<Listed>, RegistryError> {
        Ok(Self::rank(self.list().await?, ""))
    }

    /// The free JobDBs of `listed`, best first for `director_id`: the one its previous
    /// incarnation held, other orphaned active ones, then spares.
    pub fn rank(listed: Vec<Listed>, director_id: &str) -> Vec<Listed> {
        let mut own = Vec::new();
        let mut orphaned = Vec::new();
        let mut spare = Vec::new();
        for l in listed {
            if l.holder.is_some() {
                continue;
            }
            match l.record.state {
                JobDbState::Active
                    if !director_id.is_empty() && l.holder_id.as_deref() == Some(director_id) =>
                {
                    own.push(l)
                }
                JobDbState::Active => orphaned.push(l),
                JobDbState::Spare => spare.push(l),
                _ => {}
            }
        }
        own.extend(orphaned);
        own.extend(spare);
        own
    }
}

/// `url` without its password (text that is not a URL is kept as is).
fn without_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}
