//! Reads of the other live JobDBs of a cluster: what they hold of some sequences
//! ([`PeerSurvey`]), the sequencer's before it releases a head and the intake's to clear new
//! ordered jobs ([`Clearance`]). Retiring and draining JobDBs are read before active ones, so a
//! job (or block) a drainer moves meanwhile (it lands in an active JobDB before it leaves the
//! retired one) is seen in one or the other. Other JobDBs are read by their entries: in a
//! cluster every ordered job has one from the commit that stores it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::job::{JobId, Seq};
use crate::jobdb::{JobDb, JobDbError, JobDbUrl};
use crate::metrics::Metrics;

/// The schema at which a JobDB orders its sequences by position (9; 8 ordered by id, and
/// before 8 a JobDB holds no ordered job).
const POSITIONS_SCHEMA: i64 = 9;
/// How long a read of another JobDB may take before it counts as unreadable (its heads wait;
/// the ones cleared earlier do not wait for it).
const PEER_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Most sequences read in one statement.
pub(super) const SEQS_PER_READ: usize = 500;
/// How long the clearance task keeps its readers of the other JobDBs before it opens them
/// again (a peer may have been upgraded or moved since), as the sequencer does at each sweep.
const READERS_KEPT_FOR: Duration = Duration::from_secs(5);

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

type ListPeers = dyn Fn() -> BoxFuture<'static, Result<Vec<Peer>, String>> + Send + Sync;

/// The live JobDBs of a cluster (active, retiring, draining), listed on demand.
#[derive(Clone)]
pub struct Peers {
    list: Arc<ListPeers>,
}

impl Peers {
    /// Peers listed by `list`.
    pub fn new(
        list: impl Fn() -> BoxFuture<'static, Result<Vec<Peer>, String>> + Send + Sync + 'static,
    ) -> Self {
        Peers {
            list: Arc::new(list),
        }
    }

    /// The live JobDBs (this one among them), listed now.
    pub async fn list(&self) -> Result<Vec<Peer>, String> {
        (self.list)().await
    }
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Peers")
    }
}

/// What a read of the other live JobDBs found of some sequences.
#[derive(Debug, Default)]
pub(super) struct Survey {
    /// The lowest position of an open job of each sequence elsewhere.
    pub(super) oldest: HashMap<Seq, Ulid>,
    /// Sequences blocked elsewhere.
    pub(super) blocked: BTreeSet<Seq>,
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
    /// second list names it. A third list after the reads finds a JobDB read as active that
    /// began to leave meanwhile (moves out of it may have passed the reads): then the survey
    /// is an error, read again later. A JobDB is active in the inventory before its Director
    /// serves anything (`campaign::start_on`), so no job, whether through a router, a drainer
    /// or straight from a producer, reaches a JobDB a fresh list does not name. An error:
    /// some JobDB (or the inventory) could not be read, or one began to leave.
    pub(super) async fn survey(&mut self, seqs: &[Seq]) -> Result<Survey, String> {
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
        // A JobDB read as active that began to leave meanwhile may have had jobs moved out of
        // it after it was read, into one read before them: this survey proves nothing (found
        // by the history checker, seed 501: a key's job moved twice in 4 s was in neither
        // read).
        let third = self.peers().await?;
        if let Some(left) = third
            .iter()
            .find(|p| p.leaving && second.iter().any(|q| q.name == p.name && !q.leaving))
        {
            return Err(format!(
                "jobdb {} began to leave while the survey read it; read again",
                left.name
            ));
        }
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
/// sequencer round trip. Sound per sequence: a job that must go before it was accepted before it got its
/// position, so the survey saw it where it was stored or where a drainer moved it; a job
/// stored elsewhere later was accepted after it. A survey serves every question asked
/// before it began; a question not answered within `CLEARANCE_WAIT` clears nothing.
#[derive(Clone)]
pub struct Clearance {
    asks: mpsc::UnboundedSender<ClearanceAsk>,
}

impl Clearance {
    /// A clearance reading the peers through `survey`, and the task that answers it (runs
    /// until `stop`).
    pub fn start(
        survey: PeerSurvey,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> (Self, BoxFuture<'static, ()>) {
        let (asks, rx) = mpsc::unbounded_channel();
        (
            Clearance { asks },
            Box::pin(answer_clearances(survey, rx, metrics, stop)),
        )
    }

    /// The ordered jobs of `jobs` (positions placed) that are cleared.
    pub async fn cleared(&self, jobs: &[Arc<crate::job::Job>]) -> Vec<JobId> {
        let seqs: BTreeSet<Seq> = jobs.iter().filter_map(|j| j.seq()).collect();
        if seqs.is_empty() {
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
        if readers_opened.elapsed() >= READERS_KEPT_FOR {
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
