//! The Redis backend of the dedup store: one Redis server reached through a connection
//! manager, and the two Lua scripts that claim, confirm and release its entries
//! (`claim.lua`, `release.lua`; see the layout and the script's steps in [`super`]).
//!
//! [`super::DedupStore`] decides which claims go to which store, in which order; this file
//! only turns one batch for one store into one `EVALSHA` and its reply back into outcomes, as
//! [`super::memory::MemoryStore`] does for an in-process store.

use std::collections::HashMap;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{DedupConfig, DedupError, Found, Mode, Op, Timing};

/// The claim (and confirm) script; see the module documentation of [`super`].
const CLAIM_LUA: &str = include_str!("claim.lua");

/// The release script: deletes a key's entries only where the given owner holds them.
const RELEASE_LUA: &str = include_str!("release.lua");

/// One Redis store: its id (for errors), its connection and its scripts.
pub(super) struct RedisStore {
    id: String,
    conn: ConnectionManager,
    claim_script: redis::Script,
    release_script: redis::Script,
}

impl RedisStore {
    /// Connects to the store `id` at `url`, with the configuration's timeouts.
    pub(super) async fn connect(
        id: &str,
        url: &str,
        config: &DedupConfig,
    ) -> Result<Self, DedupError> {
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout));
        let redis_err = |source| DedupError::Redis {
            store: id.to_owned(),
            source,
        };
        let client = redis::Client::open(url).map_err(redis_err)?;
        let conn = ConnectionManager::new_with_config(client, manager_config)
            .await
            .map_err(redis_err)?;
        Ok(RedisStore {
            id: id.to_owned(),
            conn,
            claim_script: redis::Script::new(CLAIM_LUA),
            release_script: redis::Script::new(RELEASE_LUA),
        })
    }

    fn redis_error(&self, source: redis::RedisError) -> DedupError {
        DedupError::Redis {
            store: self.id.clone(),
            source,
        }
    }

    fn protocol_error(&self, reason: String) -> DedupError {
        DedupError::Protocol {
            store: self.id.clone(),
            reason,
        }
    }

    /// One claim-script call for `ops`: what the store reported for the claims that were not
    /// newly claimed, as (position in `ops`, what was found).
    pub(super) async fn claim(
        &self,
        prefix: &str,
        mode: Mode,
        timing: &Timing,
        hash_bits: u8,
        ops: &[Op],
    ) -> Result<Vec<(usize, Found)>, DedupError> {
        let (ranges, range_of) = distinct(ops.iter().map(|op| (op.slot, op.first, op.last)));
        let mut call = self.claim_script.prepare_invoke();
        call.arg(prefix)
            .arg(match mode {
                Mode::Claim => "c",
                Mode::TakeOver => "t",
                Mode::Confirm => "f",
            })
            .arg(timing.pending_ttl_ms)
            .arg(timing.slot_ms)
            .arg(timing.keep_ms)
            .arg(ranges.len());
        for (slot, first, last) in &ranges {
            call.arg(*slot).arg(*first).arg(*last);
        }
        for (op, range) in ops.iter().zip(range_of) {
            call.arg(op.key.field(hash_bits))
                .arg(&op.owner[..])
                .arg(op.key.hash_index(hash_bits))
                .arg(range);
        }
        let mut conn = self.conn.clone();
        let reply: redis::Value = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.redis_error(e))?;
        let redis::Value::Array(items) = reply else {
            return Err(self.protocol_error(format!("not an array: {reply:?}")));
        };
        if items.len() % 3 != 0 {
            return Err(self.protocol_error(format!("{} items", items.len())));
        }
        let mut out = Vec::with_capacity(items.len() / 3);
        for triple in items.chunks(3) {
            let (
                redis::Value::Int(position),
                redis::Value::Int(kind),
                redis::Value::BulkString(owner),
            ) = (&triple[0], &triple[1], &triple[2])
            else {
                return Err(self.protocol_error(format!("bad entry {triple:?}")));
            };
            let position = usize::try_from(*position)
                .ok()
                .and_then(|p| p.checked_sub(1))
                .filter(|p| *p < ops.len())
                .ok_or_else(|| self.protocol_error(format!("position {position}")))?;
            let owner: [u8; 16] = owner
                .as_slice()
                .try_into()
                .map_err(|_| self.protocol_error("owner is not 16 bytes".to_owned()))?;
            let found = match kind {
                1 => Found::Mine,
                2..=4 => Found::Other {
                    owner,
                    pending: *kind != 2,
                    lapsed: *kind == 4,
                },
                other => return Err(self.protocol_error(format!("kind {other}"))),
            };
            out.push((position, found));
        }
        Ok(out)
    }

    /// One release-script call for `ops` (each checked over its `first ..= last` slots);
    /// returns the positions in `ops` of the claims that had an entry of their owner.
    pub(super) async fn release(
        &self,
        prefix: &str,
        hash_bits: u8,
        ops: &[Op],
    ) -> Result<Vec<usize>, DedupError> {
        let (ranges, range_of) = distinct(ops.iter().map(|op| (op.first, op.last)));
        let mut call = self.release_script.prepare_invoke();
        call.arg(prefix).arg(ranges.len());
        for (first, last) in &ranges {
            call.arg(*first).arg(*last);
        }
        for (op, range) in ops.iter().zip(range_of) {
            call.arg(op.key.field(hash_bits))
                .arg(&op.owner[..])
                .arg(op.key.hash_index(hash_bits))
                .arg(range);
        }
        let mut conn = self.conn.clone();
        let positions: Vec<i64> = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.redis_error(e))?;
        positions
            .into_iter()
            .map(|p| {
                usize::try_from(p)
                    .ok()
                    .and_then(|p| p.checked_sub(1))
                    .filter(|p| *p < ops.len())
                    .ok_or_else(|| self.protocol_error(format!("position {p}")))
            })
            .collect()
    }
}

/// The distinct values of `items` in first-seen order, and each item's 1-based number among
/// them (the scripts' range numbers: a batch's claims share a handful of slot ranges).
fn distinct<T: Copy + Eq + std::hash::Hash>(
    items: impl Iterator<Item = T>,
) -> (Vec<T>, Vec<usize>) {
    let mut seen: HashMap<T, usize> = HashMap::new();
    let mut values = Vec::new();
    let numbers = items
        .map(|item| {
            *seen.entry(item).or_insert_with(|| {
                values.push(item);
                values.len()
            })
        })
        .collect();
    (values, numbers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_numbered_in_first_seen_order() {
        let (values, numbers) = distinct([(1, 2), (3, 4), (1, 2), (5, 6)].into_iter());
        assert_eq!(values, vec![(1, 2), (3, 4), (5, 6)]);
        assert_eq!(numbers, vec![1, 2, 1, 3]);
    }

    #[test]
    fn the_scripts_keep_their_sha1() {
        // Pinned: EVALSHA names a script by the SHA-1 of its exact text, so an edit to a `.lua`
        // file (even whitespace) is a new script; make such a change on purpose, here too.
        assert_eq!(
            redis::Script::new(CLAIM_LUA).get_hash(),
            "81902959c5bb02beee26c8bbdacc28c045490867"
        );
        assert_eq!(
            redis::Script::new(RELEASE_LUA).get_hash(),
            "3e27f8ee022828a32cd52d1de78d4a7dffbbd5ba"
        );
    }
}
