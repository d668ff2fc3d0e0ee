//! The Director's archiving: its expired jobs go to the archive through the shared
//! [`crate::archiver`], their `archived` rows through its writer ([`ThroughWriter`]), which
//! numbers every row of its JobDB.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::mailbox::WriteOp;
use crate::archive::BatchKind;
use crate::archiver::{Archiver, ArchiverError, Recorder, MAX_BATCH_JOBS};
use crate::job::{JobId, State, Transition};
use crate::jobdb::JobDb;

/// `archived` rows go through the Director's writer (it numbers rows); the batch is confirmed
/// first, on its own.
#[derive(Clone, Debug)]
pub struct ThroughWriter(pub mpsc::Sender<WriteOp>);

impl Recorder for ThroughWriter {
    async fn confirm(
        &self,
        db: &JobDb,
        token: u64,
        batch: Ulid,
        sha256: &str,
        rows: Vec<Transition>,
    ) -> Result<(), ArchiverError> {
        db.confirm_archive_batch(token, batch, sha256, &[]).await?;
        if !rows.is_empty() {
            let (done, committed) = oneshot::channel();
            self.0
                .send(WriteOp::Transitions {
                    rows,
                    done: Some(done),
                })
                .await
                .map_err(|_| ArchiverError::WriterGone)?;
            match committed.await {
                Ok(Ok(())) => {}
                _ => return Err(ArchiverError::WriterGone),
            }
        }
        Ok(())
    }
}

/// The Director's archiving task: receives ids of jobs it moved to `archiving`, waits until
/// those rows are durable, and archives them in batches, until `stop`.
pub async fn run(
    archiver: Archiver<ThroughWriter>,
    mut expired: mpsc::UnboundedReceiver<Vec<JobId>>,
    mut pending: Vec<JobId>,
    stop: CancellationToken,
) {
    let tick = Duration::from_millis(500);
    let mut open = true;
    loop {
        if !pending.is_empty() {
            match archiver.db.latest_of(&pending).await {
                Ok(latest) => {
                    let ready: Vec<JobId> = pending
                        .iter()
                        .filter(|id| latest.get(id).is_some_and(|t| t.state == State::Archiving))
                        .copied()
                        .collect();
                    // Rows not yet committed stay pending; archived ones are done.
                    pending.retain(|id| {
                        latest
                            .get(id)
                            .is_none_or(|t| !t.state.is_terminal() && t.state != State::Archiving)
                    });
                    for chunk in ready.chunks(MAX_BATCH_JOBS) {
                        match archiver.archive(BatchKind::Expired, chunk, &stop).await {
                            Ok(_) => {}
                            Err(ArchiverError::Stopped) => return,
                            Err(e) => {
                                tracing::warn!(error = %e, "archiving expired jobs failed; trying again");
                                pending.extend_from_slice(chunk);
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading expired jobs failed; trying again"),
            }
        }
        if !open && pending.is_empty() {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            more = expired.recv(), if open => match more {
                Some(ids) => pending.extend(ids),
                None => open = false,
            },
            _ = tokio::time::sleep(tick), if !pending.is_empty() || !open => {}
        }
        while let Ok(ids) = expired.try_recv() {
            pending.extend(ids);
        }
    }
}
