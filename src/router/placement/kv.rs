//! Where layout and placement records live: Consul's KV, or a map in this process with the
//! same check-and-set semantics (embedded mode, unit tests).

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::PlacementError;
use crate::registry::consul::{ConsulClient, Put, ReadOptions};

/// Where layout and placement records live.
pub(super) enum Backend {
    Consul(ConsulClient),
    Memory(Mutex<MemoryKv>),
}

/// A process-local KV with Consul's check-and-set semantics.
#[derive(Default)]
pub(super) struct MemoryKv {
    index: u64,
    entries: BTreeMap<String, (Vec<u8>, u64)>,
}

impl Backend {
    /// The value and ModifyIndex at `key`.
    pub(super) async fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u64)>, PlacementError> {
        match self {
            Backend::Consul(client) => {
                let read = client
                    .kv_get(
                        key,
                        ReadOptions {
                            consistent: true,
                            ..ReadOptions::default()
                        },
                    )
                    .await?;
                Ok(read.value.map(|e| (e.value, e.modify_index)))
            }
            Backend::Memory(kv) => Ok(lock(kv).entries.get(key).cloned()),
        }
    }

    /// Writes `value` if the key's ModifyIndex is `index` (0: only if absent).
    pub(super) async fn put_cas(
        &self,
        key: &str,
        value: &[u8],
        index: u64,
    ) -> Result<bool, PlacementError> {
        match self {
            Backend::Consul(client) => Ok(client.kv_put(key, value, Put::Cas(index)).await?),
            Backend::Memory(kv) => {
                let mut kv = lock(kv);
                let current = kv.entries.get(key).map(|(_, i)| *i).unwrap_or(0);
                if current != index {
                    return Ok(false);
                }
                kv.index += 1;
                let next = kv.index;
                kv.entries.insert(key.to_owned(), (value.to_vec(), next));
                Ok(true)
            }
        }
    }

    /// Every key under `prefix`.
    pub(super) async fn keys(&self, prefix: &str) -> Result<Vec<String>, PlacementError> {
        match self {
            Backend::Consul(client) => Ok(client
                .kv_list(prefix, ReadOptions::default())
                .await?
                .value
                .into_iter()
                .map(|e| e.key)
                .collect()),
            Backend::Memory(kv) => Ok(lock(kv)
                .entries
                .keys()
                .filter(|k| k.starts_with(prefix))
                .cloned()
                .collect()),
        }
    }

    pub(super) async fn delete(&self, key: &str) -> Result<(), PlacementError> {
        match self {
            Backend::Consul(client) => {
                client.kv_delete(key, None).await?;
            }
            Backend::Memory(kv) => {
                lock(kv).entries.remove(key);
            }
        }
        Ok(())
    }
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves the data consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
