//! A fenced JobDB's id index: the ids of every job with an idempotency key or of an event (a
//! back-fill's claim names its job) and every event it ever stored, kept in the archive after
//! the JobDB is dropped, so a router can settle a lapsed claim whose holder could have been
//! stored there (docs/architecture.md, "A router that dies").
//!
//! # Layout
//! - `{prefix}{jobdb}/ids/{minute}.bin`: the ids whose ULID time falls in that minute (minutes
//!   since the Unix epoch, ten digits), 16 bytes each, sorted. A reader asks for one holder's
//!   minute only.
//! - `{prefix}{jobdb}/ids/index.json`: an [`IdIndex`] naming every chunk with its count and
//!   SHA-256, written after the chunks: an index means the whole set, and a minute it does not
//!   name holds no id.
//!
//! The drainer writes it once the JobDB is fenced (no row can be added any more), so the same
//! JobDB always gives the same bytes and a drainer that crashed writes it again.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use super::format::{check_jobdb_name, sha256_hex};
use super::{Archive, ArchiveError};

/// Milliseconds in one chunk of the index.
const MINUTE_MS: u64 = 60_000;

/// The chunks of a JobDB's id index (see the module).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdIndex {
    /// The JobDB.
    pub jobdb: String,
    /// Every chunk, by minute.
    pub chunks: Vec<IdChunk>,
}

/// One minute of a JobDB's id index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdChunk {
    /// Minutes since the Unix epoch of its ids' ULID time.
    pub minute: u64,
    /// How many ids it holds.
    pub ids: u64,
    /// SHA-256 of the chunk object, hex.
    pub sha256: String,
}

impl IdIndex {
    /// The chunk that would hold `id`, if any id of its minute is here.
    pub fn chunk_of(&self, id: Ulid) -> Option<&IdChunk> {
        let minute = id.timestamp_ms() / MINUTE_MS;
        self.chunks
            .binary_search_by_key(&minute, |c| c.minute)
            .ok()
            .map(|i| &self.chunks[i])
    }
}

fn index_key(prefix: &str, jobdb: &str) -> String {
    format!("{prefix}{jobdb}/ids/index.json")
}

fn chunk_key(prefix: &str, jobdb: &str, minute: u64) -> String {
    format!("{prefix}{jobdb}/ids/{minute:010}.bin")
}

impl Archive {
    /// Writes `jobdb`'s id index from all its `ids` (any order, no duplicates needed): the
    /// chunks, then the index, each confirmed stored. Idempotent and deterministic.
    pub async fn put_id_index(&self, jobdb: &str, ids: &[Ulid]) -> Result<IdIndex, ArchiveError> {
        check_jobdb_name(jobdb)?;
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut chunks = Vec::new();
        for minute_ids in
            sorted.chunk_by(|a, b| a.timestamp_ms() / MINUTE_MS == b.timestamp_ms() / MINUTE_MS)
        {
            let minute = minute_ids[0].timestamp_ms() / MINUTE_MS;
            let data: Vec<u8> = minute_ids.iter().flat_map(|id| id.to_bytes()).collect();
            let sha256 = sha256_hex(&data);
            let key = chunk_key(&self.prefix, jobdb, minute);
            self.put_verified(&key, Bytes::from(data), &sha256, "application/octet-stream")
                .await?;
            chunks.push(IdChunk {
                minute,
                ids: minute_ids.len() as u64,
                sha256,
            });
        }
        let index = IdIndex {
            jobdb: jobdb.to_owned(),
            chunks,
        };
        let json = serde_json::to_vec(&index)
            .map_err(|e| ArchiveError::Rejected(format!("id index of {jobdb}: {e}")))?;
        let sha256 = sha256_hex(&json);
        self.put_verified(
            &index_key(&self.prefix, jobdb),
            Bytes::from(json),
            &sha256,
            "application/json",
        )
        .await?;
        Ok(index)
    }

    /// `jobdb`'s id index, or `None` while it is not (wholly) written.
    pub async fn id_index(&self, jobdb: &str) -> Result<Option<IdIndex>, ArchiveError> {
        check_jobdb_name(jobdb)?;
        let key = index_key(&self.prefix, jobdb);
        let Some((data, _)) = self.get(&key).await? else {
            return Ok(None);
        };
        let index: IdIndex = serde_json::from_slice(&data)
            .map_err(|e| ArchiveError::Corrupt(format!("{key}: {e}")))?;
        if index.jobdb != jobdb || !index.chunks.is_sorted_by(|a, b| a.minute < b.minute) {
            return Err(ArchiveError::Corrupt(format!(
                "{key}: not {jobdb}'s, or unsorted"
            )));
        }
        Ok(Some(index))
    }

    /// Which of `ids` the index `index` holds (one answer each, in order): one chunk read per
    /// minute they fall in, each checked against its SHA-256.
    pub async fn id_index_holds(
        &self,
        index: &IdIndex,
        ids: &[Ulid],
    ) -> Result<Vec<bool>, ArchiveError> {
        let mut held = vec![false; ids.len()];
        let mut minutes: Vec<&IdChunk> = ids.iter().filter_map(|id| index.chunk_of(*id)).collect();
        minutes.sort_by_key(|c| c.minute);
        minutes.dedup_by_key(|c| c.minute);
        for chunk in minutes {
            let key = chunk_key(&self.prefix, &index.jobdb, chunk.minute);
            let (data, _) = self.get(&key).await?.ok_or_else(|| {
                ArchiveError::Corrupt(format!("{key}: named by its index, missing"))
            })?;
            if sha256_hex(&data) != chunk.sha256 || data.len() as u64 != chunk.ids * 16 {
                return Err(ArchiveError::Corrupt(format!(
                    "{key}: not the chunk its index names"
                )));
            }
            let stored: Vec<Ulid> = data
                .chunks_exact(16)
                .filter_map(|b| <[u8; 16]>::try_from(b).ok().map(Ulid::from_bytes))
                .collect();
            for (id, held) in ids.iter().zip(held.iter_mut()) {
                if index.chunk_of(*id).map(|c| c.minute) == Some(chunk.minute) {
                    *held = stored.binary_search(id).is_ok();
                }
            }
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_index_holds_exactly_its_ids_by_minute() {
        let dir = tempfile::tempdir().unwrap();
        let archive = Archive::open_dir(&super::super::DirConfig::new(dir.path()))
            .await
            .unwrap();
        let at = |ms: u64, n: u128| Ulid::from_parts(ms, n);
        let stored = [
            at(60_000 * 5 + 1, 7),
            at(60_000 * 5 + 59_999, 3),
            at(60_000 * 9, 1),
        ];
        assert_eq!(archive.id_index("db_1").await.unwrap(), None);
        let index = archive.put_id_index("db_1", &stored).await.unwrap();
        assert_eq!(
            index
                .chunks
                .iter()
                .map(|c| (c.minute, c.ids))
                .collect::<Vec<_>>(),
            [(5, 2), (9, 1)]
        );
        let read = archive.id_index("db_1").await.unwrap().unwrap();
        assert_eq!(read, index);
        let asked = [
            stored[1],
            at(60_000 * 5 + 2, 7),
            stored[2],
            at(60_000 * 7, 1),
            stored[0],
        ];
        assert_eq!(
            archive.id_index_holds(&read, &asked).await.unwrap(),
            [true, false, true, false, true]
        );
        // Written again from the same ids in another order: the same index.
        let mut shuffled = stored.to_vec();
        shuffled.reverse();
        assert_eq!(
            archive.put_id_index("db_1", &shuffled).await.unwrap(),
            index
        );
        // A chunk that is not what the index names is refused, not read as absent.
        let chunk = dir.path().join("spindle-archive/db_1/ids/0000000009.bin");
        std::fs::write(&chunk, [0u8; 16]).unwrap();
        assert!(matches!(
            archive.id_index_holds(&read, &[stored[2]]).await,
            Err(ArchiveError::Corrupt(_))
        ));
    }
}
