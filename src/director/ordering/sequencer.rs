//! The sequencer: the task that moves ordered keys whose turn the writer's commits cannot
//! decide alone. It releases a sequence's head (through a writer commit, which checks it
//! against the book) when the head must first be compared with the other live JobDBs (a
//! cluster, the job not cleared at intake), or when the store alone holds the sequence
//! (spilled); every [`EXPIRY_SWEEP_EVERY`] it releases held jobs past their expiry, for the
//! scheduler to end untried; and every [`SWEEP_EVERY`] it reads every head of the store
//! (what a restart, a lost answer or an operator's SQL left) and tells the writer which blocks
//! are left, so a block an operator deleted lets its key go.
//!
//! **Across JobDBs** (a cluster cycles them, and a failover sends a key's jobs to another
//! Director for a while), a head is released only when no other live JobDB holds an open job
//! of its sequence at a lower position or blocks it ([`PeerSurvey`]). A sequence held back so
//! is looked at again every [`RECHECK_EVERY`].
//!
//! **Clearance: what an unreadable JobDB cannot hold.** A complete read of every other live
//! JobDB that starts at `T` and finds the lowest position elsewhere of a sequence at `m` (or
//! none) *clears* the sequence below `min(m, T − skew)`: any job of it that could appear
//! elsewhere later with a lower position existed at `T` (its position was minted before
//! `T − skew` by a clock within `skew` of ours), so the read saw it where it was or where a
//! drainer moved it. A head below its sequence's clearance goes without reading the other
//! JobDBs again, so a JobDB that cannot be read (down, or at an older schema) or an inventory
//! that cannot be listed stops only the sequences with jobs accepted since the last complete
//! read (less `skew`), not every key; those wait until it can be read. A JobDB at a schema
//! before ordered keys (7) holds no ordered job and is read as holding none.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::survey::{PeerSurvey, Peers, SEQS_PER_READ};
use crate::director::mailbox::WriteOp;
use crate::job::{JobId, Seq};
use crate::jobdb::Head;
use crate::jobdb::{JobDb, JobDbError};
use crate::metrics::Metrics;

/// How often every sequence is looked at, whatever the writer said: an operator's SQL (a
/// deleted `ordering_blocked` row) or a commit whose answer was lost reaches it so.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How often held jobs past their expiry are looked for (the bound on how late a job that
/// expires while it waits for its turn ends).
pub const EXPIRY_SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How soon a sequence whose older jobs sit in another JobDB is looked at again.
pub const RECHECK_EVERY: Duration = Duration::from_millis(250);
/// The default bound on how far the clocks of the Directors (which mint positions) disagree.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(10);
/// Most sequences whose clearance is remembered (beyond it the memory starts over: a
/// forgotten clearance costs one more read of the other JobDBs, never a wrong release).
const MAX_CLEARANCES: usize = 200_000;

/// Heads to release: each sequence with the job at its head.
type Releases = Vec<(Seq, JobId)>;

/// The sequencer task's state.
pub struct Sequencer {
    db: JobDb,
    writer: mpsc::Sender<WriteOp>,
    touched: mpsc::UnboundedReceiver<Vec<Seq>>,
    /// Reads of the other live JobDBs (`None`: there are none, no registry).
    survey: Option<PeerSurvey>,
    metrics: Arc<Metrics>,
    /// How far the Directors' clocks may disagree.
    skew: Duration,
    /// Sequences held back by an older job elsewhere, and when to look again.
    rechecks: BTreeMap<Seq, Instant>,
    /// Per sequence, the position below which no other JobDB can hold a job of it.
    clearance: HashMap<Seq, Ulid>,
    /// Busy during each round: the watchdog's view of it.
    progress: crate::director::supervise::Progress,
}

impl Sequencer {
    /// A sequencer of `db`'s sequences, releasing through `writer`, told by the writer of
    /// sequences whose turn may have moved, checking `peers` in a cluster, whose Directors'
    /// clocks disagree by at most `skew`.
    pub fn new(
        db: JobDb,
        writer: mpsc::Sender<WriteOp>,
        touched: mpsc::UnboundedReceiver<Vec<Seq>>,
        peers: Option<Peers>,
        skew: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let own = db.name().to_owned();
        Sequencer {
            db,
            writer,
            touched,
            survey: peers.map(|peers| PeerSurvey::new(peers, own)),
            metrics,
            skew,
            rechecks: BTreeMap::new(),
            clearance: HashMap::new(),
            progress: Default::default(),
        }
    }

    /// Reports each round to `progress` (the watchdog's handle).
    pub fn watched(mut self, progress: crate::director::supervise::Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Runs until `stop`; sweeps every sequence first (a restart resumes every sequence).
    pub async fn run(mut self, stop: CancellationToken) {
        let mut next_sweep = Instant::now();
        let mut next_expiry = Instant::now();
        let mut pending: BTreeSet<Seq> = BTreeSet::new();
        let progress = self.progress.clone();
        loop {
            let next_recheck = self.rechecks.values().min().copied();
            let wake = [Some(next_sweep), Some(next_expiry), next_recheck]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(next_sweep);
            tokio::select! {
                _ = stop.cancelled() => return,
                seqs = self.touched.recv() => match seqs {
                    Some(seqs) => pending.extend(seqs),
                    // The writer is gone: the Director is stopping.
                    None => return stop.cancelled().await,
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
            let _round = progress.step();
            while let Ok(seqs) = self.touched.try_recv() {
                pending.extend(seqs);
            }
            let now = Instant::now();
            if now >= next_expiry {
                next_expiry = now + EXPIRY_SWEEP_EVERY;
                if !self.end_expired_held().await {
                    return stop.cancelled().await;
                }
            }
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
                // A peer may have been upgraded or moved since: its reader is opened again.
                if let Some(survey) = &mut self.survey {
                    survey.forget_readers();
                }
                if !self.blocks_left().await {
                    return stop.cancelled().await;
                }
                self.db.sequence_heads(None).await
            } else if pending.is_empty() {
                continue;
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
            // Heads cleared by an earlier read go at once: a slow or unreadable JobDB
            // delays only the heads that must read it.
            let (cleared, unclear) = self.cleared(heads);
            if !self.release(cleared).await {
                return stop.cancelled().await;
            }
            let go = self.not_overtaking(unclear).await;
            if !self.release(go).await {
                return stop.cancelled().await;
            }
        }
    }

    /// Tells the writer which blocks are left (an operator deletes a block to let its key go):
    /// read after a barrier, so every block written before it is seen if it is still there.
    /// False when the writer is gone.
    async fn blocks_left(&self) -> bool {
        let (reply, barrier) = oneshot::channel();
        if self.writer.send(WriteOp::Barrier(reply)).await.is_err() {
            return false;
        }
        let Ok(as_of) = barrier.await else {
            return false;
        };
        match self.db.blocked_sequences().await {
            Ok(left) => {
                let op = WriteOp::BlocksLeft {
                    as_of,
                    left: left.into_iter().collect(),
                };
                self.writer.send(op).await.is_ok()
            }
            Err(e) => {
                tracing::warn!(error = %e, "jobdb unreachable while reading blocked keys; reading again at the next sweep");
                true
            }
        }
    }

    /// Releases `heads` through the writer; false when the writer is gone. A commit releases
    /// at most a page of jobs (each read whole into the scheduler): a sweep after a restart
    /// may find every sequence waiting.
    async fn release(&self, heads: Vec<(Seq, JobId)>) -> bool {
        for page in heads.chunks(SEQS_PER_READ) {
            let op = WriteOp::Release {
                heads: page.to_vec(),
                expired: Vec::new(),
            };
            if self.writer.send(op).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Releases held jobs past their expiry, for the scheduler to end them untried (a job
    /// that expires while it waits for its turn ends at its expiry, not at its turn). False
    /// when the writer is gone.
    async fn end_expired_held(&mut self) -> bool {
        let expired = match self.db.expired_held(Utc::now(), SEQS_PER_READ as u32).await {
            Ok(expired) => expired,
            Err(e) => {
                tracing::warn!(error = %e, "jobdb unreachable while looking for expired ordered jobs; trying again soon");
                return true;
            }
        };
        if expired.is_empty() {
            return true;
        }
        tracing::debug!(
            jobs = expired.len(),
            "ordered jobs expired while waiting for their turn"
        );
        let op = WriteOp::Release {
            heads: Vec::new(),
            expired,
        };
        self.writer.send(op).await.is_ok()
    }

    async fn heads_of(&self, seqs: &[Seq]) -> Result<HashMap<Seq, Head>, JobDbError> {
        let mut heads = HashMap::new();
        for chunk in seqs.chunks(SEQS_PER_READ) {
            heads.extend(self.db.sequence_heads(Some(chunk)).await?);
        }
        Ok(heads)
    }

    /// The heads that may go without reading the other JobDBs (all of them where there are
    /// none; else those below their sequence's clearance), and the others.
    fn cleared(&self, heads: HashMap<Seq, Head>) -> (Releases, Vec<(Seq, Head)>) {
        let mut heads: Vec<(Seq, Head)> = heads.into_iter().collect();
        heads.sort_unstable_by_key(|(seq, _)| *seq);
        if self.survey.is_none() {
            return (
                heads.into_iter().map(|(s, h)| (s, h.job)).collect(),
                Vec::new(),
            );
        }
        let (cleared, unclear): (Vec<_>, Vec<_>) = heads.into_iter().partition(|(seq, head)| {
            self.clearance
                .get(seq)
                .is_some_and(|below| head.position < *below)
        });
        self.metrics.ordered_cleared.inc_by(cleared.len() as u64);
        (
            cleared.into_iter().map(|(s, h)| (s, h.job)).collect(),
            unclear,
        )
    }

    /// The heads (not cleared) no open job of their sequence at a lower position in another
    /// live JobDB would be overtaken by, and that no other JobDB blocks; the others are looked
    /// at again soon, as all are while any other JobDB (or the inventory) cannot be read.
    async fn not_overtaking(&mut self, unclear: Vec<(Seq, Head)>) -> Vec<(Seq, JobId)> {
        let mut go = Vec::new();
        if unclear.is_empty() {
            return go;
        }
        let seqs: Vec<Seq> = unclear.iter().map(|(seq, _)| *seq).collect();
        let started = Utc::now();
        let surveyed = match &mut self.survey {
            Some(survey) => survey.survey(&seqs).await,
            None => Ok(super::survey::Survey::default()),
        };
        match surveyed {
            Ok(found) => {
                let floor = floor_of(started, self.skew);
                let mut held_back = Vec::new();
                for (seq, head) in unclear {
                    let older = found.oldest.get(&seq).copied();
                    if found.blocked.contains(&seq) {
                        self.clearance.remove(&seq);
                        held_back.push(seq);
                        continue;
                    }
                    self.clear(seq, older.map_or(floor, |m| m.min(floor)));
                    match older {
                        Some(older) if older < head.position => held_back.push(seq),
                        _ => go.push((seq, head.job)),
                    }
                }
                if !held_back.is_empty() {
                    tracing::debug!(
                        sequences = held_back.len(),
                        "ordered jobs wait for older jobs (or a block) of their sequence in another jobdb"
                    );
                }
                self.metrics
                    .ordered_waiting_elsewhere
                    .set(i64::try_from(held_back.len()).unwrap_or(i64::MAX));
                self.recheck(held_back.into_iter());
            }
            Err(e) => {
                self.metrics.ordered_survey_failures.inc();
                tracing::warn!(
                    error = %e,
                    waiting = seqs.len(),
                    "cannot read every other jobdb: ordered jobs accepted since the last complete read wait (older ones go)"
                );
                self.recheck(seqs.into_iter());
            }
        }
        go
    }

    fn clear(&mut self, seq: Seq, below: Ulid) {
        if self.clearance.len() >= MAX_CLEARANCES && !self.clearance.contains_key(&seq) {
            self.clearance.clear();
        }
        self.clearance.insert(seq, below);
    }

    fn recheck(&mut self, seqs: impl Iterator<Item = Seq>) {
        let at = Instant::now() + RECHECK_EVERY;
        for seq in seqs {
            self.rechecks.entry(seq).or_insert(at);
        }
    }
}

/// The lowest position minted at or after `at − skew`: every position below it was minted
/// before then.
fn floor_of(at: DateTime<Utc>, skew: Duration) -> Ulid {
    let skew = chrono::Duration::from_std(skew).unwrap_or(chrono::Duration::MAX);
    let then = at
        .checked_sub_signed(skew)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
    let ms = u64::try_from(then.timestamp_millis()).unwrap_or(0);
    Ulid::from_parts(ms, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_below_every_position_minted_since() {
        let now = Utc::now();
        let floor = floor_of(now, Duration::from_secs(10));
        let since = Ulid::from_parts(
            u64::try_from((now - chrono::Duration::seconds(10)).timestamp_millis()).unwrap(),
            0,
        );
        assert!(since >= floor);
        let before = Ulid::from_parts(since.timestamp_ms() - 1, u128::MAX >> 48);
        assert!(before < floor);
        assert_eq!(
            floor_of(DateTime::<Utc>::UNIX_EPOCH, Duration::from_secs(10)),
            Ulid::nil()
        );
    }
}
