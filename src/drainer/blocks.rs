//! Carrying blocked keys: a key stopped in a retired JobDB (`ordering_blocked`: a job that
//! asked to block its key ended without success) stays stopped after the JobDB is dropped.
//! Before its JobDB is drained, its blocks are sent to a live Director with an import that
//! holds no jobs (`blocked_keys`), which stores them in its JobDB; only then are they deleted
//! here. While the retired JobDB is live (draining), the Directors' sequencers read its blocks
//! as any other JobDB's, so a key's moved jobs wait from the moment they land.

use std::time::Duration;

use rand::seq::IndexedRandom;
use tokio_util::sync::CancellationToken;

use super::{Drain, DrainerError, Owned};
use crate::rpc::import::{blocked_key, ImportRequest, MAX_IMPORT_JOBS};

impl Drain {
    /// Sends every key blocked in `o` to a live JobDB, then forgets them here. Sent again
    /// after a crash before the delete (a key blocked there already keeps its block).
    pub(super) async fn carry_blocks(
        &self,
        o: &Owned,
        stop: &CancellationToken,
    ) -> Result<(), DrainerError> {
        let keys = o.db.blocked_keys().await?;
        if keys.is_empty() {
            return Ok(());
        }
        for chunk in keys.chunks(MAX_IMPORT_JOBS) {
            let mut pause = Duration::from_millis(200);
            loop {
                let targets = self.live_targets(o.db.name()).await;
                let Some((jobdb, base)) = targets.choose(&mut rand::rng()).cloned() else {
                    tracing::warn!(
                        jobdb = o.db.name(),
                        "no live director to carry blocked keys to; waiting"
                    );
                    self.pause(stop, pause).await?;
                    pause = (pause * 2).min(Duration::from_secs(5));
                    continue;
                };
                let request = ImportRequest {
                    jobdb: jobdb.clone(),
                    from_jobdb: Some(o.db.name().to_owned()),
                    not_after: None,
                    jobs: Vec::new(),
                    blocked_keys: chunk.iter().map(blocked_key).collect(),
                    events: Vec::new(),
                };
                let token = self
                    .config
                    .import_token
                    .as_ref()
                    .map(|t| t.expose().to_owned());
                let sent =
                    match spindle_client::Client::from_reqwest(self.http.clone(), &base, token) {
                        Ok(client) => client
                            .import(&request)
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                match sent {
                    Ok(()) => {
                        tracing::info!(
                            from = o.db.name(),
                            to = jobdb,
                            keys = chunk.len(),
                            "blocked ordered keys carried to a live jobdb"
                        );
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(from = o.db.name(), to = jobdb, error = %e, "carrying blocked keys failed; trying again");
                        self.pause(stop, pause).await?;
                        pause = (pause * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
        o.db.forget_blocks(o.token, &keys).await?;
        Ok(())
    }
}
