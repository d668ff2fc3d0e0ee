//! Steps 1 and 3 of a submission through the router: claiming the jobs' keys (waiting for
//! another submission's pending claim, finishing the work of a router that died), keeping the
//! claims alive while a forward takes long, and confirming or releasing them once the
//! forwards have settled (see the module documentation of [`super`]).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{Routed, Shared};
use crate::job::JobId;
use crate::router::dedup::{Claim, ClaimOutcome, ConfirmOutcome};
use crate::rpc::api::JobStatus;
use crate::rpc::error::ApiError;

/// Claims the keys of `routed`, filling in the result of every job that is not to be
/// forwarded (a duplicate, or a key still pending elsewhere after `pending_wait`).
pub(super) async fn claim_keys(shared: &Shared, routed: &mut [Routed]) -> Result<(), ApiError> {
    let keyed: Vec<usize> = (0..routed.len())
        .filter(|&i| routed[i].claim.is_some())
        .collect();
    let claims: Vec<Claim> = keyed.iter().filter_map(|&i| routed[i].claim).collect();
    let outcomes = claim(shared, &claims, Holds::Jobs).await?;
    for (i, outcome) in keyed.into_iter().zip(outcomes) {
        let r = &mut routed[i];
        r.result = match outcome {
            Keyed::Free => None,
            Keyed::Duplicate(owner) => Some(r.answer(JobStatus::Duplicate, owner, None)),
            Keyed::Pending(owner, why) => Some(r.answer(JobStatus::Pending, owner, Some(why))),
        };
    }
    Ok(())
}

/// What became of a claimed key.
pub(super) enum Keyed {
    /// This request holds it now: forward.
    Free,
    /// A stored job or event holds it (or another job of this very request, settled with
    /// it): the holder.
    Duplicate(JobId),
    /// Another submission of it is being stored, or one that cannot be checked now: retry
    /// later (the holder, why).
    Pending(JobId, String),
}

/// What the owners of claims are: jobs (looked up by job id) or events (by event id).
#[derive(Clone, Copy, Debug)]
pub(super) enum Holds {
    Jobs,
    Events,
}

/// Claims `claims` (whose owners are this request's jobs or events), waiting up to
/// `pending_wait` for another submission's pending claim of the same key and finishing the
/// work of a router that died (a lapsed claim). One answer per claim, in order.
pub(super) async fn claim(
    shared: &Shared,
    claims: &[Claim],
    holds: Holds,
) -> Result<Vec<Keyed>, ApiError> {
    let ours: HashSet<JobId> = claims.iter().map(|c| c.owner).collect();
    let mut answers: Vec<Option<Keyed>> = claims.iter().map(|_| None).collect();
    let mut open: Vec<usize> = (0..claims.len()).collect();
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    while !open.is_empty() {
        let asked: Vec<Claim> = open.iter().map(|&i| claims[i]).collect();
        let outcomes = shared.dedup.claim(&asked).await.map_err(|e| {
            tracing::warn!(error = %e, "router: dedup claim failed");
            ApiError::Unavailable("the dedup store is unavailable; nothing was stored".into())
        })?;
        shared
            .metrics
            .claim_seconds
            .observe(started.elapsed().as_secs_f64());
        let waited_enough = started.elapsed() >= shared.settings.pending_wait;
        let mut still = Vec::new();
        let mut lapsed: Vec<(usize, JobId)> = Vec::new();
        for (&i, outcome) in open.iter().zip(outcomes) {
            answers[i] = match outcome {
                ClaimOutcome::Lapsed { owner } => {
                    lapsed.push((i, owner));
                    None
                }
                ClaimOutcome::Claimed | ClaimOutcome::Mine => Some(Keyed::Free),
                ClaimOutcome::Duplicate {
                    owner,
                    confirmed: true,
                } => Some(Keyed::Duplicate(owner)),
                // Held by another job of this very request: settled once that one is.
                ClaimOutcome::Duplicate { owner, .. } if ours.contains(&owner) => {
                    Some(Keyed::Duplicate(owner))
                }
                ClaimOutcome::Duplicate { owner, .. } if waited_enough => Some(Keyed::Pending(
                    owner,
                    "another submission of this key is being stored; submit again later with \
                     the same key"
                        .into(),
                )),
                ClaimOutcome::Duplicate { .. } => {
                    still.push(i);
                    None
                }
            };
        }
        // Lapsed claims: their router stopped before confirming, perhaps after storing.
        let holders: Vec<JobId> = lapsed.iter().map(|&(_, holder)| holder).collect();
        let found = holders_stored(shared, &holders, holds).await;
        for ((i, holder), found) in lapsed.into_iter().zip(found) {
            let claim = claims[i];
            match found {
                Holder::Stored => {
                    // Finish the dead router's work: the key is the stored holder's.
                    let holder_claim = Claim {
                        owner: holder,
                        ..claim
                    };
                    match shared.dedup.confirm(&[holder_claim]).await {
                        Ok(_) => answers[i] = Some(Keyed::Duplicate(holder)),
                        Err(_) => still.push(i),
                    }
                }
                Holder::Absent => match shared.dedup.take_over(&[claim]).await {
                    Ok(o) if matches!(o[..], [ClaimOutcome::Claimed | ClaimOutcome::Mine]) => {
                        answers[i] = Some(Keyed::Free)
                    }
                    Ok(_) | Err(_) => still.push(i),
                },
                Holder::Unknown(why) if waited_enough => {
                    answers[i] = Some(Keyed::Pending(
                        holder,
                        format!(
                            "an earlier submission of this key ({holder}) may have been \
                             stored and cannot be checked now ({why}); submit again later"
                        ),
                    ))
                }
                Holder::Unknown(_) => still.push(i),
            }
        }
        open = still;
        if !open.is_empty() {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }
    Ok(answers
        .into_iter()
        .map(|a| a.unwrap_or(Keyed::Free))
        .collect())
}

/// Whether the job holding a lapsed claim was stored.
enum Holder {
    Stored,
    Absent,
    Unknown(String),
}

/// How long a direct read of a JobDB no Director serves may take.
const DIRECT_SEARCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Looks for each of `holders` (jobs, or events' rows) in every JobDB that could hold it,
/// one answer per holder. A JobDB a healthy Director serves is asked through it; one that no
/// Director serves but still exists (active without its Director, retiring, draining or
/// drained: a drain moves and archives jobs but deletes no rows) is read directly. A holder
/// is absent only if every one of them was searched; a JobDB dropped since the holder was
/// made leaves it unknown (it could have been stored there and delivered since).
async fn holders_stored(shared: &Shared, holders: &[JobId], holds: Holds) -> Vec<Holder> {
    if holders.is_empty() {
        return Vec::new();
    }
    let inventory = crate::registry::inventory::Inventory::new(shared.consul.clone());
    let records = match inventory.list().await {
        Ok(records) => records,
        Err(e) => {
            return holders
                .iter()
                .map(|_| Holder::Unknown(format!("inventory unreadable: {e}")))
                .collect()
        }
    };
    let made = |holder: &JobId| {
        DateTime::<Utc>::from_timestamp_millis(holder.0.timestamp_ms() as i64)
            .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
            - chrono::Duration::seconds(60)
    };
    let earliest = holders
        .iter()
        .map(made)
        .min()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
    let directors = shared.directors.all();
    let mut answers: Vec<Option<Holder>> = holders.iter().map(|_| None).collect();
    for listed in &records {
        use crate::registry::inventory::JobDbState as S;
        let record = &listed.record;
        let direct = match record.state {
            S::Active => !directors.iter().any(|d| d.jobdb == record.name),
            S::Retiring | S::Draining | S::Drained => record.changed_at >= earliest,
            S::Dropped => {
                for (answer, holder) in answers.iter_mut().zip(holders) {
                    if answer.is_none() && record.changed_at >= made(holder) {
                        *answer = Some(Holder::Unknown(format!(
                            "jobdb {} was dropped since",
                            record.name
                        )));
                    }
                }
                false
            }
            S::Spare => false,
        };
        if !direct {
            continue;
        }
        let searched = tokio::time::timeout(
            DIRECT_SEARCH_TIMEOUT,
            search_directly(&inventory, record, holders, holds),
        )
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
        match searched {
            Ok(found) => {
                for (answer, found) in answers.iter_mut().zip(found) {
                    if found {
                        *answer = Some(Holder::Stored);
                    }
                }
            }
            Err(why) => {
                for answer in answers.iter_mut().filter(|a| a.is_none()) {
                    *answer = Some(Holder::Unknown(format!(
                        "jobdb {} cannot be searched: {why}",
                        record.name
                    )));
                }
            }
        }
    }
    let asked = holders.iter().zip(&answers).map(|(holder, answer)| {
        let holder = holder.to_string();
        async move {
            if answer.is_some() {
                return None;
            }
            let replies = shared
                .ask_directors(|client| {
                    let holder = holder.clone();
                    async move {
                        match holds {
                            Holds::Jobs => client.job(&holder).await.map(drop),
                            Holds::Events => client.event(&holder).await.map(drop),
                        }
                    }
                })
                .await;
            let mut absent = true;
            for reply in replies {
                match reply {
                    Ok(()) => return Some(Holder::Stored),
                    Err(e) if e.status() == Some(404) => {}
                    Err(_) => absent = false,
                }
            }
            Some(if absent {
                Holder::Absent
            } else {
                Holder::Unknown("a director did not answer".into())
            })
        }
    });
    let asked = futures::future::join_all(asked).await;
    answers
        .into_iter()
        .zip(asked)
        .map(|(known, asked)| known.or(asked).unwrap_or(Holder::Absent))
        .collect()
}

/// Which of `holders` the JobDB of `record` holds, read directly (no Director serves it).
async fn search_directly(
    inventory: &crate::registry::inventory::Inventory,
    record: &crate::registry::inventory::JobDbRecord,
    holders: &[JobId],
    holds: Holds,
) -> Result<Vec<bool>, String> {
    let url = inventory.jobdb_url(record).map_err(|e| e.to_string())?;
    let (db, _) = crate::jobdb::JobDb::open_peer(&url, 1)
        .await
        .map_err(|e| e.to_string())?;
    let found = match holds {
        Holds::Jobs => db
            .existing_jobs(holders)
            .await
            .map(|have| holders.iter().map(|h| have.contains(h)).collect()),
        Holds::Events => {
            let mut found = Vec::with_capacity(holders.len());
            let mut failed = None;
            for holder in holders {
                match db.event(holder.0).await {
                    Ok(event) => found.push(event.is_some()),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            failed.map_or(Ok(found), Err)
        }
    };
    db.close().await;
    found.map_err(|e| e.to_string())
}

/// Confirms the claims of stored jobs and releases those of jobs certainly not stored.
pub(super) async fn settle_claims(shared: &Shared, confirm: &[Claim], release: &[Claim]) {
    if !confirm.is_empty() {
        let mut attempt = 0;
        loop {
            match shared.dedup.confirm(confirm).await {
                Ok(outcomes) => {
                    for (claim, outcome) in confirm.iter().zip(outcomes) {
                        if let ConfirmOutcome::Lost { owner } = outcome {
                            shared.metrics.dedup_lost.inc();
                            tracing::error!(
                                job = %claim.owner, holder = %owner,
                                "router: stored job's key is held by another job (pending_ttl too short?)"
                            );
                        }
                    }
                    break;
                }
                Err(e) if attempt < 5 => {
                    attempt += 1;
                    tracing::warn!(error = %e, attempt, "router: confirming claims failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(e) => {
                    shared.metrics.confirm_failures.inc_by(confirm.len() as u64);
                    tracing::error!(error = %e, jobs = confirm.len(),
                        "router: could not confirm claims of stored jobs; they stay pending");
                    break;
                }
            }
        }
    }
    if !release.is_empty() {
        if let Err(e) = shared.dedup.release(release).await {
            // They lapse after pending_ttl anyway.
            tracing::warn!(error = %e, "router: releasing claims failed");
        }
    }
}

/// Re-claims (which refreshes the deadline of) claims older than a quarter of `pending_ttl`.
/// `false` when the store cannot be reached or a claim was taken by another job.
pub(super) async fn refresh_claims(
    shared: &Shared,
    claims: &[Claim],
    claimed_at: &mut DateTime<Utc>,
) -> bool {
    if claims.is_empty() {
        *claimed_at = Utc::now();
        return true;
    }
    let quarter = shared.dedup.config().pending_ttl / 4;
    let age = (Utc::now() - *claimed_at).to_std().unwrap_or_default();
    if age < quarter {
        return true;
    }
    let now = Utc::now();
    match shared.dedup.refresh(claims).await {
        Ok(outcomes) => {
            if outcomes
                .iter()
                .all(|o| matches!(o, ClaimOutcome::Claimed | ClaimOutcome::Mine))
            {
                *claimed_at = now;
                true
            } else {
                tracing::warn!("router: a claim lapsed and was taken before its job was stored");
                false
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "router: refreshing claims failed");
            false
        }
    }
}
