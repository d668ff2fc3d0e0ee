//! The dedup store's settings ([`DedupConfig`], checked before a store connects) and how a
//! store is reached ([`StoreSpec`]: a Redis URL, or `memory:` for one in this process).

use std::fmt;
use std::time::Duration;

use super::{memory, DedupError};

/// Settings of the dedup store. Every router of a deployment must use the same `window`,
/// `slots_per_window`, `hash_bits` and `key_prefix`: they define where entries live.
#[derive(Clone, Debug)]
pub struct DedupConfig {
    /// Claims of the same key whose own times are at most this far apart are duplicates.
    pub window: Duration,
    /// `k`: slots per window (see the module documentation for the trade-off).
    pub slots_per_window: u32,
    /// Hashes per slot are `2^hash_bits` (0 to 24): size it to the keys of a slot.
    pub hash_bits: u8,
    /// How long a claim stays pending without being confirmed before it counts as absent.
    pub pending_ttl: Duration,
    /// Largest accepted distance between a claim's time and the router's clock (and between
    /// router clocks).
    pub max_skew: Duration,
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// Claims per script call (at most 3,000).
    pub max_batch: usize,
    /// Script calls in flight per `claim`/`confirm`/`release` call.
    pub max_in_flight: usize,
    /// Timeout of a connection attempt.
    pub connect_timeout: Duration,
    /// Timeout of one script call.
    pub response_timeout: Duration,
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            window: Duration::from_secs(24 * 3600),
            slots_per_window: 2,
            hash_bits: 16,
            pending_ttl: Duration::from_secs(60),
            max_skew: Duration::from_secs(30),
            key_prefix: "sd:".to_owned(),
            max_batch: 1000,
            max_in_flight: 8,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
        }
    }
}

impl DedupConfig {
    pub(super) fn ms(d: Duration) -> i64 {
        i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
    }

    /// The slot length.
    pub fn slot(&self) -> Duration {
        self.window / self.slots_per_window.max(1)
    }

    /// How long after an instant its entries may still be looked up: placements (and stores)
    /// serving an instant must outlive it by this much.
    pub fn horizon(&self) -> Duration {
        self.window + self.slot() + 2 * self.max_skew
    }

    pub(super) fn validate(&self) -> Result<(), DedupError> {
        let window = Self::ms(self.window);
        let k = i64::from(self.slots_per_window);
        if k == 0 || window < k || window % k != 0 {
            return Err(DedupError::Config(format!(
                "window ({window} ms) must be a positive multiple of slots_per_window ({k}) ms"
            )));
        }
        if self.hash_bits > 24 {
            return Err(DedupError::Config("hash_bits must be 0 to 24".to_owned()));
        }
        // The script passes up to 2 × max_batch values to one Redis call through Lua's
        // `unpack`, which is limited by Lua's C stack (8,000 slots).
        if !(1..=3000).contains(&self.max_batch) || self.max_in_flight == 0 {
            return Err(DedupError::Config(
                "max_batch must be 1 to 3000 and max_in_flight positive".to_owned(),
            ));
        }
        if self.pending_ttl.is_zero() {
            return Err(DedupError::Config(
                "pending_ttl must be positive".to_owned(),
            ));
        }
        Ok(())
    }
}

/// A dedup store: an id (as placements name it) and its URL, a Redis server or a store in this
/// process.
#[derive(Clone)]
pub struct StoreSpec {
    /// Store id.
    pub id: String,
    /// `redis://[:password@]host:port[/db]`; or `memory:` for the in-process store named after
    /// the id, `memory:NAME` for the one named NAME (see [`memory`]).
    pub url: String,
}

impl StoreSpec {
    /// The in-process store `id` (URL `memory:`).
    pub fn memory(id: impl Into<String>) -> Self {
        StoreSpec {
            id: id.into(),
            url: memory::MemoryStore::SCHEME.to_owned(),
        }
    }

    /// Whether the URL names an in-process store.
    pub fn is_memory(&self) -> bool {
        self.url.starts_with(memory::MemoryStore::SCHEME)
    }
}

impl fmt::Debug for StoreSpec {
    /// Hides the URL's credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = match url::Url::parse(&self.url) {
            // Nothing secret in an in-process store's URL.
            _ if self.is_memory() => self.url.clone(),
            Ok(mut u) => {
                if u.password().is_some() {
                    let _ = u.set_password(Some("***"));
                }
                u.to_string()
            }
            Err(_) => "<unparsable url>".to_owned(),
        };
        f.debug_struct("StoreSpec")
            .field("id", &self.id)
            .field("url", &shown)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_checks() {
        let mut config = DedupConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!(config.slot(), Duration::from_secs(12 * 3600));
        config.window = Duration::from_millis(1001);
        config.slots_per_window = 2;
        assert!(config.validate().is_err());
        config.window = Duration::from_secs(2);
        config.hash_bits = 25;
        assert!(config.validate().is_err());
    }

    #[test]
    fn store_spec_hides_passwords() {
        let spec = StoreSpec {
            id: "a".to_owned(),
            url: "redis://:hunter2@127.0.0.1:6379/0".to_owned(),
        };
        assert!(!format!("{spec:?}").contains("hunter2"));
        let memory = StoreSpec::memory("m");
        assert!(memory.is_memory() && format!("{memory:?}").contains("memory:"));
    }
}
