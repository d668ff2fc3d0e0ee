//! The sequencer: ordered delivery per key. Jobs of one (bucket, endpoint, ordering key), a
//! *sequence*, go one at a time in id order (the order they were accepted).
//!
//! The order is kept in the JobDB, not here (schema 8): every ordered job enters `open_jobs`
//! *held*, invisible to backlog pages, and the scheduler never sees it until it is released.
//! This task releases, for each sequence whose turn may have moved (the writer says which: a
//! job of it arrived or ended), its oldest held job when none of its jobs is under way and no
//! failure blocks it. The release itself is a writer commit that checks the head again in its
//! transaction and hands the job to the scheduler, so a crash anywhere leaves the JobDB saying
//! what to do next: a restarted Director sweeps every sequence at start.
//!
//! Across JobDBs (a cluster cycles them, and a failover sends a key's jobs to another
//! Director for a while), a head is released only when no other live JobDB holds an older open
//! job of its sequence: retiring and draining JobDBs are read before active ones, so a job a
//! drainer moves meanwhile (it lands in an active JobDB before it leaves the retired one) is
//! seen in one or the other (see [`Sequencer::not_overtaking`]). A sequence held back so is
//! looked at again every [`RECHECK_EVERY`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::job::{JobId, Seq};
use crate::jobdb::{JobDb, JobDbError, JobDbUrl, WriteOp};
use crate::metrics::Metrics;

/// How often every sequence is looked at, whatever the writer said: an operator's SQL (a
/// deleted `ordering_blocked` row) or a commit whose answer was lost reaches it so.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How soon a sequence whose older jobs sit in another JobDB is looked at again.
pub const RECHECK_EVERY: Duration = Duration::from_millis(250);
/// Most sequences read in one statement.
const SEQS_PER_READ: usize = 500;

/// Another JobDB that may hold older jobs of a sequence.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Its database name.
    pub name: String,
    /// Retiring or draining: read before the active ones.
    pub leaving: bool,
    /// Where to read it.
    pub url: JobDbUrl,
}

/// The other live JobDBs of a cluster (active, retiring, draining), listed on demand.
#[derive(Clone)]
pub struct Peers(Arc<dyn Fn() -> BoxFuture<'static, Result<Vec<Peer>, String>> + Send + Sync>);

impl Peers {
    /// Peers listed by `list`.
    pub fn new(
        list: impl Fn() -> BoxFuture<'static, Result<Vec<Peer>, String>> + Send + Sync + 'static,
    ) -> Self {
        Peers(Arc::new(list))
    }
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Peers")
    }
}

/// The sequencer task's state.
pub struct Sequencer {
    db: JobDb,
    writer: mpsc::Sender<WriteOp>,
    touched: mpsc::UnboundedReceiver<Vec<Seq>>,
    peers: Option<Peers>,
    metrics: Arc<Metrics>,
    /// Readers of the peers, by name.
    readers: HashMap<String, JobDb>,
    /// Sequences held back by an older job elsewhere, and when to look again.
    rechecks: BTreeMap<Seq, Instant>,
}

impl Sequencer {
    /// A sequencer of `db`'s sequences, releasing through `writer`, told by the writer of
    /// sequences whose turn may have moved, checking `peers` in a cluster.
    pub fn new(
        db: JobDb,
        writer: mpsc::Sender<WriteOp>,
        touched: mpsc::UnboundedReceiver<Vec<Seq>>,
        peers: Option<Peers>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Sequencer {
            db,
            writer,
            touched,
            peers,
            metrics,
            readers: HashMap::new(),
            rechecks: BTreeMap::new(),
        }
    }

    /// Runs until `stop`; sweeps every sequence first (a restart resumes every sequence).
    pub async fn run(mut self, stop: CancellationToken) {
        let mut next_sweep = Instant::now();
        let mut pending: BTreeSet<Seq> = BTreeSet::new();
        loop {
            let next_recheck = self.rechecks.values().min().copied();
            let wake = next_recheck.map_or(next_sweep, |r| r.min(next_sweep));
            tokio::select! {
                _ = stop.cancelled() => return,
                seqs = self.touched.recv() => match seqs {
                    Some(seqs) => pending.extend(seqs),
                    // The writer is gone: the Director is stopping.
                    None => return stop.cancelled().await,
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
            while let Ok(seqs) = self.touched.try_recv() {
                pending.extend(seqs);
            }
            let now = Instant::now();
            let due: Vec<Seq> = self
                .rechecks
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(seq, _)| *seq)
                .collect();
            for seq in due {
                self.rechecks.remove(&seq);
                pending.insert(seq);
            }
            let heads = if now >= next_sweep {
                next_sweep = now + SWEEP_EVERY;
                pending.clear();
                self.db.sequence_heads(None).await
            } else {
                let seqs: Vec<Seq> = std::mem::take(&mut pending).into_iter().collect();
                self.heads_of(&seqs).await
            };
            let heads = match heads {
                Ok(heads) => heads,
                Err(e) => {
                    tracing::warn!(error = %e, "jobdb unreachable while reading ordered sequences; sweeping again soon");
                    next_sweep = Instant::now() + RECHECK_EVERY;
                    continue;
                }
            };
            if heads.is_empty() {
                continue;
            }
            let heads = self.not_overtaking(heads).await;
            if heads.is_empty() {
                continue;
            }
            // A commit releases at most a page of jobs (each read whole into the scheduler):
            // a sweep after a restart may find every sequence waiting.
            for page in heads.chunks(SEQS_PER_READ) {
                let heads = page.to_vec();
                if self.writer.send(WriteOp::Release { heads }).await.is_err() {
                    return stop.cancelled().await;
                }
            }
        }
    }

    async fn heads_of(&self, seqs: &[Seq]) -> Result<HashMap<Seq, JobId>, JobDbError> {
        let mut heads = HashMap::new();
        for chunk in seqs.chunks(SEQS_PER_READ) {
            heads.extend(self.db.sequence_heads(Some(chunk)).await?);
        }
        Ok(heads)
    }

    /// The heads no older open job of their sequence in another live JobDB would overtake;
    /// the others are looked at again soon (as are all when a peer cannot be read or listed).
    ///
    /// The inventory is listed at every check, and again after the leaving JobDBs are read:
    /// a job a drainer moved out of one before it was read landed in a JobDB that was active
    /// (in the inventory) before the move began, so the second list names it. A JobDB is
    /// active in the inventory before it is in the catalog, where routers and drainers find
    /// Directors, so no job reaches a JobDB a fresh list does not name.
    async fn not_overtaking(&mut self, heads: HashMap<Seq, JobId>) -> Vec<(Seq, JobId)> {
        let mut heads: Vec<(Seq, JobId)> = heads.into_iter().collect();
        heads.sort_unstable();
        if self.peers.is_none() {
            return heads;
        }
        let seqs: Vec<Seq> = heads.iter().map(|(seq, _)| *seq).collect();
        match self.oldest_elsewhere(&seqs).await {
            Ok(oldest) => {
                let held_back: BTreeSet<Seq> = heads
                    .iter()
                    .filter(|(seq, head)| oldest.get(seq).is_some_and(|older| older < head))
                    .map(|(seq, _)| *seq)
                    .collect();
                if !held_back.is_empty() {
                    tracing::debug!(
                        sequences = held_back.len(),
                        "ordered jobs wait for older jobs of their sequence in another jobdb"
                    );
                }
                self.metrics
                    .ordered_waiting_elsewhere
                    .set(i64::try_from(held_back.len()).unwrap_or(i64::MAX));
                self.recheck(held_back.iter().copied());
                heads.retain(|(seq, _)| !held_back.contains(seq));
                heads
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the other jobdbs; their sequences' ordered jobs wait");
                self.recheck(seqs.into_iter());
                Vec::new()
            }
        }
    }

    /// The oldest open job of each of `seqs` in the other live JobDBs: leaving ones first,
    /// then, from a second list, every other (see [`Sequencer::not_overtaking`]).
    async fn oldest_elsewhere(&mut self, seqs: &[Seq]) -> Result<HashMap<Seq, JobId>, String> {
        let mut oldest: HashMap<Seq, JobId> = HashMap::new();
        let mut read: BTreeSet<String> = BTreeSet::new();
        let first = self.peers().await?;
        let leaving: Vec<Peer> = first.into_iter().filter(|p| p.leaving).collect();
        for peer in &leaving {
            self.read_oldest(peer, seqs, &mut oldest).await?;
            read.insert(peer.name.clone());
        }
        // Leaving ones first again: one may have begun to leave since the first list.
        let mut second = self.peers().await?;
        second.sort_by_key(|p| !p.leaving);
        for peer in second.iter().filter(|p| !read.contains(&p.name)) {
            self.read_oldest(peer, seqs, &mut oldest).await?;
        }
        self.readers
            .retain(|name, _| second.iter().any(|p| &p.name == name) || read.contains(name));
        Ok(oldest)
    }

    /// Folds the oldest open job of each of `seqs` in `peer` into `oldest`.
    async fn read_oldest(
        &mut self,
        peer: &Peer,
        seqs: &[Seq],
        oldest: &mut HashMap<Seq, JobId>,
    ) -> Result<(), String> {
        let reader = self
            .reader(peer)
            .await
            .map_err(|e| format!("jobdb {}: {e}", peer.name))?;
        for chunk in seqs.chunks(SEQS_PER_READ) {
            let found = match reader.sequence_oldest(chunk).await {
                Ok(found) => found,
                Err(e) => {
                    self.readers.remove(&peer.name);
                    return Err(format!("jobdb {}: {e}", peer.name));
                }
            };
            for (seq, id) in found {
                let entry = oldest.entry(seq).or_insert(id);
                *entry = (*entry).min(id);
            }
        }
        Ok(())
    }

    fn recheck(&mut self, seqs: impl Iterator<Item = Seq>) {
        let at = Instant::now() + RECHECK_EVERY;
        for seq in seqs {
            self.rechecks.entry(seq).or_insert(at);
        }
    }

    /// The other live JobDBs, listed now, without this one.
    async fn peers(&self) -> Result<Vec<Peer>, String> {
        let Some(list) = &self.peers else {
            return Ok(Vec::new());
        };
        let mut peers = (list.0)().await?;
        peers.retain(|p| p.name != self.db.name());
        Ok(peers)
    }

    async fn reader(&mut self, peer: &Peer) -> Result<JobDb, JobDbError> {
        if let Some(reader) = self.readers.get(&peer.name) {
            return Ok(reader.clone());
        }
        let reader = JobDb::open_reader(&peer.url, 2).await?;
        self.readers.insert(peer.name.clone(), reader.clone());
        Ok(reader)
    }
}
