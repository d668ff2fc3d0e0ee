//! The sequencer: ordered delivery per key. Jobs of one (bucket, endpoint, ordering key), a
//! *sequence*, go one at a time in the order they were accepted.
//!
//! **Order.** A job's *position* ([`crate::job::OrderedKey::position`]) is a ULID the Director
//! that accepts it mints when it accepts it ([`Positions`]); a router's forward gets its
//! position here, not from the router, so routers whose clocks disagree cannot reorder a
//! producer's sequential submissions. A drainer's move keeps the position.
//!
//! **Turns.** The order is kept in the JobDB, not here: every ordered job enters `open_jobs`
//! *held*, invisible to backlog pages, and the scheduler never sees it until it is released.
//! This task releases, for each sequence whose turn may have moved (the writer says which: a
//! job of it arrived or left), its held job of the lowest position when none of its jobs is
//! under way and no failure blocks it. The release itself is a writer commit that checks the
//! head again in its transaction and hands the job to the scheduler, so a crash anywhere leaves
//! the JobDB saying what to do next: a restarted Director sweeps every sequence at start. A job
//! leaves its sequence when it ends (succeeded, discarded) or moves to `archiving` (expired,
//! flushed): expiry is an end, so the next job goes at once, archive or not. A held job whose
//! expiry passes is released to the scheduler, which ends it without trying it, within
//! [`EXPIRY_SWEEP_EVERY`].
//!
//! **Across JobDBs** (a cluster cycles them, and a failover sends a key's jobs to another
//! Director for a while), a head is released only when no other live JobDB holds an open job
//! of its sequence at a lower position or blocks it: retiring and draining JobDBs are read
//! before active ones, so a job (or block) a drainer moves meanwhile (it lands in an active
//! JobDB before it leaves the retired one) is seen in one or the other (see
//! [`Sequencer::survey`]). A sequence held back so is looked at again every [`RECHECK_EVERY`].
//!
//! **Cleared at intake.** The intake asks [`Clearance`] about the sequences of its new
//! ordered jobs: one survey of the other live JobDBs (the same reads, [`PeerSurvey`]) begun
//! after the jobs got their positions; a job whose sequence none of them holds or blocks is
//! *cleared*, and the writer releases it in its own commits (born released, or as the head
//! once the job before it ends here) without this task.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::writer::WriteOp;
use crate::job::{JobId, Seq};
use crate::jobdb::Head;
use crate::jobdb::{JobDb, JobDbError, JobDbUrl};
use crate::metrics::Metrics;
use crate::registry::inventory::FreshMark;

/// The schema at which a JobDB orders its sequences by position (9; 8 ordered by id, and
/// before 8 a JobDB holds no ordered job).
const POSITIONS_SCHEMA: i64 = 9;

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
/// How long a read of another JobDB may take before it counts as unreadable (its heads wait;
/// the ones cleared earlier do not wait for it).
const PEER_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Most sequences read in one statement.
const SEQS_PER_READ: usize = 500;
/// Most sequences whose clearance is remembered (beyond it the memory starts over: a
/// forgotten clearance costs one more read of the other JobDBs, never a wrong release).
const MAX_CLEARANCES: usize = 200_000;

/// Mints positions: ULIDs of this process's clock, strictly increasing, and above every
/// position its JobDB already holds (a new owner whose clock is behind the last one's still
/// places new jobs after the old).
#[derive(Debug)]
pub struct Positions {
    last: Mutex<Ulid>,
}

impl Positions {
    /// A minter whose positions are all above `floor` (the JobDB's highest open position).
    pub fn above(floor: Option<Ulid>) -> Self {
        Positions {
            last: Mutex::new(floor.unwrap_or(Ulid::nil())),
        }
    }

    /// The next position.
    pub fn next(&self) -> Ulid {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Ulid::new();
        let next = match now > *last {
            true => now,
            // The clock is behind the last position (or in the same millisecond): one above.
            false => last.increment().unwrap_or(now),
        };
        *last = next;
        next
    }

    /// Gives the ordered jobs of a batch their positions, in request order (jobs just made,
    /// so each is ours alone; one shared elsewhere keeps the position it has).
    pub fn place(&self, jobs: &mut [Arc<crate::job::Job>]) {
        for job in jobs.iter_mut() {
            if job.ordering.is_some() {
                let position = self.next();
                if let Some(ordering) = Arc::get_mut(job).and_then(|j| j.ordering.as_mut()) {
                    ordering.position = position;
                }
            }
        }
    }
}

/// Another JobDB that may hold older jobs of a sequence.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Its database name.
    pub name: String,
    /// Retiring or draining: read before the active ones.
    pub leaving: bool,
    /// Where to read it.
    pub url: JobDbUrl,
    /// Its fresh mark, if set: its ordered jobs may be fresh, and a read of its sequences
    /// reads its fresh jobs too.
    pub fresh_mark: Option<FreshMark>,
}

/// A change to a JobDB's fresh mark.
#[derive(Clone, Copy, Debug)]
pub enum MarkChange {
    /// Set it for the writer of this fencing token.
    Set(u64),
    /// Delete it if it is still the one listed.
    Clear(FreshMark),
}

type ListPeers = dyn Fn() -> BoxFuture<'static, Result<Vec<Peer>, String>> + Send + Sync;
type ChangeMark = dyn Fn(MarkChange) -> BoxFuture<'static, Result<bool, String>> + Send + Sync;

/// The other live JobDBs of a cluster (active, retiring, draining), listed on demand, and
/// this JobDB's fresh mark.
#[derive(Clone)]
pub struct Peers {
    list: Arc<ListPeers>,
    mark: Option<Arc<ChangeMark>>,
}

impl Peers {
    /// Peers listed by `list`, without a fresh mark (births keep their entries).
    pub fn new(
        list: impl Fn() -> BoxFuture<'static, Result<Vec<Peer>, String>> + Send + Sync + 'static,
    ) -> Self {
        Peers {
            list: Arc::new(list),
            mark: None,
        }
    }

    /// The same, with this JobDB's fresh mark changed by `mark` (answering whether it
    /// changed).
    pub fn with_mark(
        mut self,
        mark: impl Fn(MarkChange) -> BoxFuture<'static, Result<bool, String>> + Send + Sync + 'static,
    ) -> Self {
        self.mark = Some(Arc::new(mark));
        self
    }

    /// The live JobDBs (this one among them), listed now.
    pub async fn list(&self) -> Result<Vec<Peer>, String> {
        (self.list)().await
    }

    /// Changes this JobDB's fresh mark; `Ok(false)` if it did not change (or there is none).
    pub async fn change_mark(&self, change: MarkChange) -> Result<bool, String> {
        match &self.mark {
            Some(mark) => mark(change).await,
            None => Ok(false),
        }
    }
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Peers")
    }
}

/// Heads to release: each sequence with the job at its head.
type Releases = Vec<(Seq, JobId)>;

/// What a read of the other live JobDBs found of some sequences.
#[derive(Debug, Default)]
struct Survey {
    /// The lowest position of an open job of each sequence elsewhere.
    oldest: HashMap<Seq, Ulid>,
    /// Sequences blocked elsewhere.
    blocked: BTreeSet<Seq>,
}

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
    progress: super::supervise::Progress,
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
    pub fn watched(mut self, progress: super::supervise::Progress) -> Self {
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
            None => Ok(Survey::default()),
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

/// Reads of the other live JobDBs of a cluster: what they hold of some sequences. The
/// sequencer's, before it releases a head; the intake's, to clear new ordered jobs
/// ([`Clearance`]).
pub struct PeerSurvey {
    peers: Peers,
    /// This JobDB's name (not read).
    own: String,
    /// Readers of the peers, by name, with their schema versions.
    readers: HashMap<String, (JobDb, i64)>,
}

impl PeerSurvey {
    /// Reads of the JobDBs `peers` lists, other than `own`.
    pub fn new(peers: Peers, own: String) -> Self {
        PeerSurvey {
            peers,
            own,
            readers: HashMap::new(),
        }
    }

    /// Opens every reader again at its next use (a peer may have been upgraded or moved).
    pub fn forget_readers(&mut self) {
        self.readers.clear();
    }

    /// What the other live JobDBs hold of `seqs`: leaving ones first, then, from a second
    /// list, every other. A job a drainer moved out of a leaving JobDB before it was read
    /// landed in a JobDB that was active (in the inventory) before the move began, so the
    /// second list names it. A JobDB is active in the inventory before its Director serves
    /// anything (`campaign::start_on`), so no job, whether through a router, a drainer or
    /// straight from a producer, reaches a JobDB a fresh list does not name. An error: some
    /// JobDB (or the inventory) could not be read.
    async fn survey(&mut self, seqs: &[Seq]) -> Result<Survey, String> {
        let mut found = Survey::default();
        let mut read: BTreeSet<String> = BTreeSet::new();
        let first = self.peers().await?;
        let leaving: Vec<Peer> = first.into_iter().filter(|p| p.leaving).collect();
        for peer in &leaving {
            self.read_peer(peer, seqs, &mut found).await?;
            read.insert(peer.name.clone());
        }
        // Leaving ones first again: one may have begun to leave since the first list.
        let mut second = self.peers().await?;
        second.sort_by_key(|p| !p.leaving);
        for peer in second.iter().filter(|p| !read.contains(&p.name)) {
            self.read_peer(peer, seqs, &mut found).await?;
        }
        self.readers
            .retain(|name, _| second.iter().any(|p| &p.name == name) || read.contains(name));
        Ok(found)
    }

    /// Folds what `peer` holds of `seqs` into `found`.
    async fn read_peer(
        &mut self,
        peer: &Peer,
        seqs: &[Seq],
        found: &mut Survey,
    ) -> Result<(), String> {
        let (reader, schema) =
            match tokio::time::timeout(PEER_READ_TIMEOUT, self.reader(peer)).await {
                Ok(Ok(reader)) => reader,
                Ok(Err(e)) => return Err(format!("jobdb {}: {e}", peer.name)),
                Err(_) => {
                    return Err(format!(
                        "jobdb {}: no connection within {PEER_READ_TIMEOUT:?}",
                        peer.name
                    ))
                }
            };
        for chunk in seqs.chunks(SEQS_PER_READ) {
            let elsewhere = self
                .answer(peer, "", reader.sequences_elsewhere(chunk, schema))
                .await?;
            merge_oldest(&mut found.oldest, elsewhere.oldest);
            found.blocked.extend(elsewhere.blocked);
        }
        if peer.fresh_mark.is_some() {
            // Its fresh ordered jobs have no entry: read where their commits list them.
            let fresh = self
                .answer(peer, " (fresh jobs)", reader.fresh_oldest(seqs, schema))
                .await?;
            merge_oldest(&mut found.oldest, fresh);
        }
        Ok(())
    }

    /// `read`'s answer from `peer` within [`PEER_READ_TIMEOUT`]; on an error or none in
    /// time its reader is dropped (opened again at the next read).
    async fn answer<T>(
        &mut self,
        peer: &Peer,
        what: &str,
        read: impl std::future::Future<Output = Result<T, JobDbError>>,
    ) -> Result<T, String> {
        let failed = match tokio::time::timeout(PEER_READ_TIMEOUT, read).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) => format!("jobdb {}{what}: {e}", peer.name),
            Err(_) => format!(
                "jobdb {}{what}: no answer within {PEER_READ_TIMEOUT:?}",
                peer.name
            ),
        };
        self.readers.remove(&peer.name);
        Err(failed)
    }

    /// The other live JobDBs, listed now, without this one.
    async fn peers(&self) -> Result<Vec<Peer>, String> {
        let mut peers = self.peers.list().await?;
        peers.retain(|p| p.name != self.own);
        Ok(peers)
    }

    async fn reader(&mut self, peer: &Peer) -> Result<(JobDb, i64), JobDbError> {
        if let Some((db, schema)) = self.readers.get_mut(&peer.name) {
            // A JobDB below the schema of positions (a spare its new Director is still
            // migrating, an older version's in a rolling upgrade) is asked again each time,
            // so it is never taken for holding no ordered job once it can hold some.
            if *schema < POSITIONS_SCHEMA {
                *schema = db.schema_version().await?;
            }
            return Ok((db.clone(), *schema));
        }
        let reader = JobDb::open_peer(&peer.url, 2).await?;
        self.readers.insert(peer.name.clone(), reader.clone());
        Ok(reader)
    }
}

/// How long an intake waits for its clearance before it stores its jobs held.
const CLEARANCE_WAIT: Duration = Duration::from_millis(250);

/// A question to the clearance task: these sequences, cleared ones answered.
type ClearanceAsk = (Vec<Seq>, tokio::sync::oneshot::Sender<BTreeSet<Seq>>);

/// The intake's clearance of new ordered jobs in a cluster. A job whose sequence no other
/// live JobDB holds an open job of (or blocks) in a complete survey begun after the job got
/// its position is *cleared*: it may go whenever it heads its sequence in this JobDB, and the
/// writer releases it in the commit that stores it or that ends the job before it, with no
/// sequencer round trip. Sound for the reason a writer alone is (docs/architecture.md,
/// *alone*), per sequence: a job that must go before it was accepted before it got its
/// position, so the survey saw it where it was stored or where a drainer moved it; a job
/// stored elsewhere later was accepted after it. A survey serves every question asked
/// before it began; a question not answered within [`CLEARANCE_WAIT`] clears nothing.
#[derive(Clone)]
pub struct Clearance {
    asks: mpsc::UnboundedSender<ClearanceAsk>,
    /// The writer's last listing found no other live JobDB: its commits release every job
    /// themselves, and a survey would find no one to read.
    writer_alone: Arc<AtomicBool>,
}

impl Clearance {
    /// A clearance reading the peers through `survey`, and the task that answers it (runs
    /// until `stop`).
    pub fn start(
        survey: PeerSurvey,
        writer_alone: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> (Self, BoxFuture<'static, ()>) {
        let (asks, rx) = mpsc::unbounded_channel();
        (
            Clearance { asks, writer_alone },
            Box::pin(answer_clearances(survey, rx, metrics, stop)),
        )
    }

    /// The ordered jobs of `jobs` (positions placed) that are cleared.
    pub async fn cleared(&self, jobs: &[Arc<crate::job::Job>]) -> Vec<JobId> {
        let seqs: BTreeSet<Seq> = jobs.iter().filter_map(|j| j.seq()).collect();
        // Alone, nothing is cleared: a commit that finds it still alone releases them all,
        // and one that does not leaves them to the sequencer (as an uncleared job goes).
        if seqs.is_empty() || self.writer_alone.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.asks.send((seqs.into_iter().collect(), reply)).is_err() {
            return Vec::new();
        }
        match tokio::time::timeout(CLEARANCE_WAIT, answer).await {
            Ok(Ok(cleared)) => jobs
                .iter()
                .filter(|j| j.seq().is_some_and(|seq| cleared.contains(&seq)))
                .map(|j| j.id)
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The clearance task: each round takes every question asked so far, surveys their
/// sequences once, and answers each.
async fn answer_clearances(
    mut survey: PeerSurvey,
    mut asks: mpsc::UnboundedReceiver<ClearanceAsk>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut readers_opened = Instant::now();
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return,
            ask = asks.recv() => match ask {
                Some(ask) => ask,
                None => return stop.cancelled().await,
            },
        };
        let mut round = vec![first];
        while let Ok(ask) = asks.try_recv() {
            round.push(ask);
        }
        // A peer may have been upgraded or moved since: its reader is opened again, as the
        // sequencer's are at each sweep.
        if readers_opened.elapsed() >= SWEEP_EVERY {
            survey.forget_readers();
            readers_opened = Instant::now();
        }
        let seqs: Vec<Seq> = round
            .iter()
            .flat_map(|(seqs, _)| seqs.iter().copied())
            .collect::<BTreeSet<Seq>>()
            .into_iter()
            .collect();
        let found = survey.survey(&seqs).await;
        if found.is_err() {
            metrics.ordered_survey_failures.inc();
        }
        for (asked, reply) in round {
            let cleared: BTreeSet<Seq> = match &found {
                Ok(found) => asked
                    .into_iter()
                    .filter(|seq| !found.oldest.contains_key(seq) && !found.blocked.contains(seq))
                    .collect(),
                Err(_) => BTreeSet::new(),
            };
            metrics
                .ordered_cleared_at_intake
                .inc_by(cleared.len() as u64);
            let _ = reply.send(cleared);
        }
    }
}

/// Folds the lowest positions `from` into `into`, keeping the lower of each sequence.
fn merge_oldest(into: &mut HashMap<Seq, Ulid>, from: HashMap<Seq, Ulid>) {
    for (seq, position) in from {
        crate::jobdb::ordering::keep_oldest(into, seq, position);
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
    fn positions_rise_above_their_floor_and_each_other() {
        // A floor an hour ahead of this clock (the last owner's clock was ahead).
        let ahead = Ulid::from_parts(
            u64::try_from((Utc::now() + chrono::Duration::hours(1)).timestamp_millis()).unwrap(),
            7,
        );
        let positions = Positions::above(Some(ahead));
        let mut last = ahead;
        for _ in 0..1000 {
            let p = positions.next();
            assert!(p > last);
            last = p;
        }
        let fresh = Positions::above(None);
        let (a, b) = (fresh.next(), fresh.next());
        assert!(b > a);
        assert!(a.timestamp_ms() + 1000 > u64::try_from(Utc::now().timestamp_millis()).unwrap());
    }

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
