//! KV table operations: get/list/keys with Consul's index rules, plain/CAS/acquire/release
//! writes, and plain/recursive/CAS deletes that leave tombstones.

use super::State;
use crate::error::ApiError;

/// One KV entry as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KvEntry {
    /// Full key.
    pub(crate) key: String,
    /// Stored bytes; `None` when the PUT body was empty (rendered as `"Value": null`).
    pub(crate) value: Option<Vec<u8>>,
    /// Opaque client flags.
    pub(crate) flags: u64,
    /// Index at creation.
    pub(crate) create_index: u64,
    /// Index of the last change.
    pub(crate) modify_index: u64,
    /// Number of successful acquisitions.
    pub(crate) lock_index: u64,
    /// Holder session, if locked.
    pub(crate) session: Option<String>,
}

/// How a `PUT /v1/kv/:key` is applied.
#[derive(Clone, Debug)]
pub(crate) enum PutMode {
    /// Unconditional set (keeps any lock holder).
    Plain,
    /// Check-and-set against ModifyIndex (0 = must not exist).
    Cas(u64),
    /// Lock acquisition by a session.
    Acquire(String),
    /// Lock release by the holder session.
    Release(String),
}

/// How a `DELETE /v1/kv/:key` is applied.
#[derive(Clone, Copy, Debug)]
pub(crate) enum DeleteMode {
    /// Delete one key.
    Plain,
    /// Delete every key under the prefix.
    Recurse,
    /// Delete only if ModifyIndex matches.
    Cas(u64),
}

impl State {
    /// Single-key read: (index, entry). Index is the entry's ModifyIndex, or the KV table
    /// index when the key is missing.
    pub(crate) fn kv_get(&self, key: &str) -> (u64, Option<KvEntry>) {
        match self.kv.get(key) {
            Some(e) => (e.modify_index, Some(e.clone())),
            None => (self.kv_index, None),
        }
    }

    /// Highest index under `prefix` among entries (given) and tombstones; the table index
    /// when the prefix is empty or nothing matched.
    fn kv_prefix_index(&self, prefix: &str, entries_max: u64) -> u64 {
        if prefix.is_empty() {
            return self.kv_index;
        }
        let graves = self
            .tombstones
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, i)| *i)
            .max()
            .unwrap_or(0);
        let idx = entries_max.max(graves);
        if idx == 0 {
            self.kv_index
        } else {
            idx
        }
    }

    fn kv_under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a KvEntry> + 'a {
        self.kv
            .range(prefix.to_string()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, e)| e)
    }

    /// Recursive read: (index, entries sorted by key).
    pub(crate) fn kv_list(&self, prefix: &str) -> (u64, Vec<KvEntry>) {
        let entries: Vec<KvEntry> = self.kv_under(prefix).cloned().collect();
        let max = entries.iter().map(|e| e.modify_index).max().unwrap_or(0);
        (self.kv_prefix_index(prefix, max), entries)
    }

    /// Key listing with an optional separator: (index, keys).
    pub(crate) fn kv_keys(&self, prefix: &str, sep: &str) -> (u64, Vec<String>) {
        let mut keys: Vec<String> = Vec::new();
        let mut max = 0;
        for e in self.kv_under(prefix) {
            max = max.max(e.modify_index);
            if sep.is_empty() {
                keys.push(e.key.clone());
                continue;
            }
            let after = &e.key[prefix.len()..];
            match after.find(sep) {
                Some(i) => {
                    let cut = &e.key[..prefix.len() + i + sep.len()];
                    if keys.last().map(String::as_str) != Some(cut) {
                        keys.push(cut.to_string());
                    }
                }
                None => keys.push(e.key.clone()),
            }
        }
        (self.kv_prefix_index(prefix, max), keys)
    }

    /// Applies a PUT. `Ok(bool)` is the response body; `Err` is the 500 Consul raises for
    /// an acquire with an unknown session.
    pub(crate) fn kv_put(
        &mut self,
        key: &str,
        value: Option<Vec<u8>>,
        flags: u64,
        mode: PutMode,
    ) -> Result<bool, ApiError> {
        match mode {
            PutMode::Plain => {
                self.kv_set(key, value, flags);
                Ok(true)
            }
            PutMode::Cas(cas) => {
                let ok = match self.kv.get(key) {
                    None => cas == 0,
                    Some(e) => e.modify_index == cas,
                };
                if ok {
                    self.kv_set(key, value, flags);
                }
                Ok(ok)
            }
            PutMode::Acquire(session) => {
                // The leader checks lock-delay before the raft write, so it wins over an
                // invalid session.
                let now = self.clock.now();
                if self.lock_delays.get(key).is_some_and(|until| *until > now) {
                    return Ok(false);
                }
                if !self.sessions.contains_key(&session) {
                    return Err(ApiError::Internal(format!("invalid session \"{session}\"")));
                }
                let (create_index, lock_index) = match self.kv.get(key) {
                    Some(e) => match &e.session {
                        Some(holder) if *holder == session => (Some(e.create_index), e.lock_index),
                        Some(_) => return Ok(false),
                        None => (Some(e.create_index), e.lock_index + 1),
                    },
                    None => (None, 1),
                };
                let idx = self.next_index();
                self.kv.insert(
                    key.to_string(),
                    KvEntry {
                        key: key.to_string(),
                        value,
                        flags,
                        create_index: create_index.unwrap_or(idx),
                        modify_index: idx,
                        lock_index,
                        session: Some(session),
                    },
                );
                self.kv_index = idx;
                Ok(true)
            }
            PutMode::Release(session) => {
                let Some(e) = self.kv.get(key) else {
                    return Ok(false);
                };
                if e.session.as_deref() != Some(session.as_str()) {
                    return Ok(false);
                }
                let (create_index, lock_index) = (e.create_index, e.lock_index);
                let idx = self.next_index();
                self.kv.insert(
                    key.to_string(),
                    KvEntry {
                        key: key.to_string(),
                        value,
                        flags,
                        create_index,
                        modify_index: idx,
                        lock_index,
                        session: None,
                    },
                );
                self.kv_index = idx;
                Ok(true)
            }
        }
    }

    /// Plain set: keeps CreateIndex, LockIndex and the holder; skips identical writes.
    fn kv_set(&mut self, key: &str, value: Option<Vec<u8>>, flags: u64) {
        if let Some(e) = self.kv.get(key) {
            if e.value == value && e.flags == flags {
                return;
            }
        }
        let idx = self.next_index();
        let entry = match self.kv.get(key) {
            Some(e) => KvEntry {
                value,
                flags,
                modify_index: idx,
                ..e.clone()
            },
            None => KvEntry {
                key: key.to_string(),
                value,
                flags,
                create_index: idx,
                modify_index: idx,
                lock_index: 0,
                session: None,
            },
        };
        self.kv.insert(key.to_string(), entry);
        self.kv_index = idx;
    }

    /// Applies a DELETE; the result is the response body.
    pub(crate) fn kv_delete(&mut self, key: &str, mode: DeleteMode) -> bool {
        match mode {
            DeleteMode::Plain => {
                if self.kv.contains_key(key) {
                    let idx = self.next_index();
                    self.kv_remove(key, idx);
                }
                true
            }
            DeleteMode::Recurse => {
                let keys: Vec<String> = self.kv_under(key).map(|e| e.key.clone()).collect();
                if !keys.is_empty() {
                    let idx = self.next_index();
                    for k in keys {
                        self.kv_remove(&k, idx);
                    }
                }
                true
            }
            DeleteMode::Cas(cas) => match self.kv.get(key) {
                None => true,
                Some(e) if e.modify_index != cas => false,
                Some(_) => {
                    let idx = self.next_index();
                    self.kv_remove(key, idx);
                    true
                }
            },
        }
    }

    /// Removes a key at `idx`, leaving a tombstone.
    pub(crate) fn kv_remove(&mut self, key: &str, idx: u64) {
        if self.kv.remove(key).is_some() {
            self.tombstones.insert(key.to_string(), idx);
            self.kv_index = idx;
        }
    }
}
