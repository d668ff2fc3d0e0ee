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

/// Looks for each of `holders` (jobs, or events' rows) wherever it could have been stored,
/// one answer per holder. A holder can only be in a JobDB that took writes after it was made
/// (the `not_after` of its forward has passed by the time its claim lapses, so it is stored by
/// now or never will be), and its row stays there until the JobDB is dropped:
/// - a JobDB a healthy Director serves (active, or retiring while no spare is free) is asked
///   through it;
/// - one no Director serves and no drainer has fenced (active without its Director, retiring
///   and released) cannot be read: unknown until a Director or a drainer takes it;
/// - a draining, drained or dropped one is read in its id index in the archive, which its
///   drainer wrote once it was fenced; one drained or dropped before the holder was made
///   (less the clock skew) is passed over: it was fenced earlier still.
///
/// Stored anywhere wins; absent needs every candidate searched.
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
    let skew =
        chrono::Duration::from_std(shared.dedup.config().max_skew).unwrap_or(chrono::Duration::MAX);
    let made = |holder: &JobId| {
        DateTime::<Utc>::from_timestamp_millis(holder.0.timestamp_ms() as i64)
            .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
            .checked_sub_signed(skew)
            .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
    };
    let directors = shared.directors.all();
    let mut stored = vec![false; holders.len()];
    let mut unknown: Vec<Option<String>> = vec![None; holders.len()];
    for listed in &records {
        use crate::registry::inventory::JobDbState as S;
        let record = &listed.record;
        let could: Vec<usize> = match record.state {
            S::Spare => continue,
            S::Active | S::Retiring if directors.iter().any(|d| d.jobdb == record.name) => continue,
            S::Active | S::Retiring => {
                for why in unknown.iter_mut() {
                    why.get_or_insert_with(|| {
                        format!("jobdb {} has no director or drainer now", record.name)
                    });
                }
                continue;
            }
            // Marked draining before its drainer fenced it: any holder may be there.
            S::Draining => (0..holders.len()).collect(),
            S::Drained | S::Dropped => (0..holders.len())
                .filter(|&i| record.changed_at >= made(&holders[i]))
                .collect(),
        };
        if could.is_empty() {
            continue;
        }
        let ids: Vec<ulid::Ulid> = could.iter().map(|&i| holders[i].0).collect();
        match indexed(shared, &record.name, &ids).await {
            Ok(held) => {
                for (&i, held) in could.iter().zip(held) {
                    stored[i] |= held;
                }
            }
            Err(why) => {
                for &i in &could {
                    unknown[i].get_or_insert_with(|| format!("jobdb {}: {why}", record.name));
                }
            }
        }
    }
    let asked = holders.iter().zip(&stored).map(|(holder, &found)| {
        let holder = holder.to_string();
        async move {
            if found {
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
            let mut missing = None;
            for reply in replies {
                match reply {
                    Ok(()) => return Some(Holder::Stored),
                    Err(e) if e.status() == Some(404) => {}
                    Err(_) => missing = Some(Holder::Unknown("a director did not answer".into())),
                }
            }
            missing
        }
    });
    let asked = futures::future::join_all(asked).await;
    stored
        .into_iter()
        .zip(unknown)
        .zip(asked)
        .map(
            |((stored, unknown), asked)| match (stored, asked, unknown) {
                (true, _, _) | (_, Some(Holder::Stored), _) => Holder::Stored,
                (_, Some(unanswered), _) => unanswered,
                (_, None, Some(why)) => Holder::Unknown(why),
                (_, None, None) => Holder::Absent,
            },
        )
        .collect()
}

/// Which of `ids` the id index of `jobdb` holds, or why that cannot be told yet.
async fn indexed(shared: &Shared, jobdb: &str, ids: &[ulid::Ulid]) -> Result<Vec<bool>, String> {
    let archive = shared
        .settings
        .archive
        .as_ref()
        .ok_or("no archive configured to read its id index")?;
    let index = archive
        .id_index(jobdb)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("its drainer has not archived its id index yet")?;
    archive
        .id_index_holds(&index, ids)
        .await
        .map_err(|e| e.to_string())
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
