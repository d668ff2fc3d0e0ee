//! The id index of a drained JobDB: before anything moves, the ids of its keyed jobs and its
//! events go to the archive ([`crate::archive::IdIndex`]), so a router can tell whether a
//! lapsed claim's holder was stored here long after the JobDB is dropped. The JobDB is fenced
//! by then (no row can be added), so the index is final; it is written once and skipped when
//! a drain resumes.

use ulid::Ulid;

use super::{Drain, DrainerError, Owned};

/// Ids read per statement.
const IDS_PER_READ: usize = 10_000;

impl Drain {
    /// Writes `o`'s id index unless the archive has it.
    pub(super) async fn index_ids(&self, o: &Owned) -> Result<(), DrainerError> {
        let name = o.db.name();
        if self.archive.id_index(name).await?.is_some() {
            return Ok(());
        }
        let mut ids: Vec<Ulid> = Vec::new();
        loop {
            let page = o.db.keyed_ids(ids.last().copied(), IDS_PER_READ).await?;
            let done = page.len() < IDS_PER_READ;
            ids.extend(page);
            if done {
                break;
            }
        }
        let index = self.archive.put_id_index(name, &ids).await?;
        tracing::info!(
            jobdb = name,
            ids = ids.len(),
            chunks = index.chunks.len(),
            "id index archived"
        );
        Ok(())
    }
}
