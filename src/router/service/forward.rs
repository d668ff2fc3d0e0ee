//! Step 2 of a submission through the router: forwarding the claimed jobs to the Directors
//! of their buckets' shards, with the same ids to the next Director after a definite refusal
//! and to the same JobDB after an unknown outcome (see the module documentation of
//! [`super`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::claims::refresh_claims;
use super::{Routed, Sent, Shared};
use crate::job::Job;
use crate::router::dedup::Claim;
use crate::router::directors::DirectorEntry;
use crate::rpc::import::{import_job, ImportRequest};
use crate::telemetry::TraceContext;
use opentelemetry::trace::TraceContextExt;
use spindle_client::KeptEvent;

/// Most forwards of one request in flight at once.
const FORWARDS_IN_FLIGHT: usize = 8;

/// Jobs of a request that go to one Director together: a bucket's unordered jobs, or the
/// jobs of one ordered sequence (indices into the request, in request order).
pub(super) struct Group {
    pub(super) bucket: Arc<str>,
    pub(super) seq: Option<crate::job::Seq>,
    pub(super) members: Vec<usize>,
    /// Directors that refused it.
    pub(super) tried: Vec<String>,
    /// How the last of them refused it (nothing stored): its fate when none is left.
    pub(super) last_refusal: Sent,
    /// When its claims were made or last refreshed.
    pub(super) claimed_at: DateTime<Utc>,
    /// Sent in a forward of its own: a forward it shared was refused for its content, which
    /// may be another group's.
    pub(super) alone: bool,
    /// Events kept without a job that go with it (a publish that matched no subscription).
    pub(super) kept: Vec<Kept>,
}

/// An event kept without a job, with the claim of its idempotency key.
pub(super) type Kept = (KeptEvent, Option<Claim>);

/// Forwards every group of a request until each is settled, in rounds: each group that is not
/// goes to its best Director not tried yet (an ordered sequence's rendezvous choice; for a
/// bucket's unordered jobs, a Director of its shard this round already sends to, or its own
/// choice), the groups bound for one Director share one forward, and at most
/// [`FORWARDS_IN_FLIGHT`] forwards are in flight. A definite refusal sends that forward's
/// groups, with the same ids, to their next Directors in the next round; an unknown outcome
/// settles them all by re-sending to the same JobDB ([`resolve`]). Returns each group's
/// members with how their forward ended.
pub(super) async fn forward(
    shared: &Shared,
    routed: &[Routed],
    mut open: Vec<Group>,
) -> Vec<(Vec<usize>, Sent)> {
    use futures::StreamExt;
    let mut settled = Vec::new();
    while !open.is_empty() {
        // Ordered sequences first: their Director is fixed, the rest may join them.
        open.sort_by_key(|g| g.seq.is_none());
        // Forwards of this round: a Director, its groups, and whether others may join.
        let mut bound: Vec<(DirectorEntry, Vec<Group>, bool)> = Vec::new();
        let shared_with = |bound: &[(DirectorEntry, Vec<Group>, bool)], id: &str| {
            bound.iter().position(|(d, _, open)| *open && d.id == id)
        };
        for group in open.drain(..) {
            let candidates =
                shared
                    .directors
                    .candidates(&group.bucket, group.seq.as_ref(), &group.tried);
            let joined = match (&group.seq, group.alone) {
                (None, false) => candidates.iter().find_map(|c| {
                    let at = shared_with(&bound, &c.id)?;
                    (!shared.directors.is_suspect(&c.id)).then_some(at)
                }),
                _ => None,
            };
            match (joined, candidates.into_iter().next()) {
                (Some(at), _) => bound[at].1.push(group),
                (None, Some(director)) if group.alone => bound.push((director, vec![group], false)),
                (None, Some(director)) => match shared_with(&bound, &director.id) {
                    Some(at) => bound[at].1.push(group),
                    None => bound.push((director, vec![group], true)),
                },
                (None, None) => settled.push((group.members, group.last_refusal)),
            }
        }
        let bound = bound
            .into_iter()
            .map(|(director, groups, _)| (director, groups));
        let mut sent = futures::stream::iter(bound)
            .map(|(director, groups)| async move {
                let sent = forward_to(shared, routed, &director, &groups).await;
                (director, groups, sent)
            })
            .buffer_unordered(FORWARDS_IN_FLIGHT);
        while let Some((director, groups, sent)) = sent.next().await {
            match sent {
                // One group's content may have been refused: each goes again on its own.
                Forwarded::Refused {
                    why,
                    claimed_at,
                    content: Some(_),
                } if groups.len() > 1 => {
                    tracing::debug!(
                        director = director.id,
                        why,
                        "router: forward refused; its groups go again apart"
                    );
                    for mut group in groups {
                        group.alone = true;
                        group.last_refusal = Sent::Refused(why.clone());
                        group.claimed_at = claimed_at;
                        open.push(group);
                    }
                }
                Forwarded::Refused {
                    why,
                    claimed_at,
                    content,
                } => {
                    tracing::debug!(director = director.id, why, "router: forward refused");
                    // A Director that refused one group's content is not at fault: a hostile
                    // request must not make it suspect (another, with larger limits, may
                    // take the group).
                    if content.is_none() {
                        shared.directors.suspect(&director.id);
                    }
                    let refusal = match content {
                        Some(status) => Sent::Invalid(why, status),
                        None => Sent::Refused(why),
                    };
                    for mut group in groups {
                        group.tried.push(director.id.clone());
                        group.last_refusal = refusal.clone();
                        group.claimed_at = claimed_at;
                        open.push(group);
                    }
                }
                Forwarded::Settled(outcome) => settled.extend(
                    groups
                        .into_iter()
                        .map(|group| (group.members, outcome.clone())),
                ),
            }
        }
    }
    settled
}

/// How one forward of some groups to a Director went.
enum Forwarded {
    /// Their fate is known (stored, certainly not stored, or unknown after [`resolve`]).
    Settled(Sent),
    /// The Director stored nothing: they go to their next Directors, with their claims as
    /// refreshed at `claimed_at`; `content` (the status) when it refused the request's
    /// content (perhaps one group's), not the request: that suspects no Director, and a group
    /// no Director is left for ends with it.
    Refused {
        why: String,
        claimed_at: DateTime<Utc>,
        content: Option<u16>,
    },
}

/// One forward of `groups` to `director`: stored, refused by the Director (nothing stored),
/// or, when its outcome is unknown, settled by re-sending to the same JobDB.
async fn forward_to(
    shared: &Shared,
    routed: &[Routed],
    director: &DirectorEntry,
    groups: &[Group],
) -> Forwarded {
    let members = || groups.iter().flat_map(|g| g.members.iter().copied());
    let jobs: Vec<Arc<Job>> = members().map(|i| routed[i].job.clone()).collect();
    let firsts: Vec<DateTime<Utc>> = members().map(|i| routed[i].first_at).collect();
    let kept: Vec<KeptEvent> = groups
        .iter()
        .flat_map(|g| g.kept.iter().map(|(e, _)| e.clone()))
        .collect();
    let claims: Vec<Claim> = members()
        .filter_map(|i| routed[i].claim)
        .chain(
            groups
                .iter()
                .flat_map(|g| g.kept.iter().filter_map(|(_, c)| *c)),
        )
        .collect();
    // The oldest of the groups' claims decides whether they are refreshed first.
    let mut claimed_at = groups
        .iter()
        .map(|g| g.claimed_at)
        .min()
        .unwrap_or_else(Utc::now);
    if !refresh_claims(shared, &claims, &mut claimed_at).await {
        return Forwarded::Settled(Sent::Refused("the dedup store is unavailable".into()));
    }
    match send(
        shared,
        director,
        (&jobs, &firsts, &kept),
        &claims,
        claimed_at,
    )
    .await
    {
        Sent::Stored => Forwarded::Settled(Sent::Stored),
        Sent::Refused(why) => Forwarded::Refused {
            why,
            claimed_at,
            content: None,
        },
        Sent::Invalid(why, status) => Forwarded::Refused {
            why,
            claimed_at,
            content: Some(status),
        },
        Sent::Unknown(why) => {
            tracing::warn!(
                director = director.id,
                jobdb = director.jobdb,
                why,
                "router: forward outcome unknown; re-sending to the same jobdb"
            );
            shared.directors.suspect(&director.id);
            Forwarded::Settled(
                resolve(
                    shared,
                    &director.jobdb,
                    (&jobs, &firsts, &kept),
                    &claims,
                    claimed_at,
                    why,
                )
                .await,
            )
        }
    }
}

/// Re-sends jobs whose forward to `jobdb` had an unknown outcome, to whichever Director owns
/// that JobDB now, until one answers for sure or `resolve_for` passes.
async fn resolve(
    shared: &Shared,
    jobdb: &str,
    jobs: Outbound<'_>,
    claims: &[Claim],
    mut claimed_at: DateTime<Utc>,
    mut why: String,
) -> Sent {
    let started = Instant::now();
    while started.elapsed() < shared.settings.resolve_for {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Err(e) = shared.directors.refresh(&shared.consul).await {
            tracing::debug!(error = %e, "router: catalog read failed while resolving");
        }
        let Some(owner) = shared.directors.owner_of(jobdb) else {
            continue;
        };
        // Keep the claims alive while the JobDB changes hands; a claim that was lost meanwhile
        // cannot be re-sent (its `not_after` would be refused anyway).
        if !refresh_claims(shared, claims, &mut claimed_at).await {
            continue;
        }
        match send(shared, &owner, jobs, claims, claimed_at).await {
            Sent::Stored => return Sent::Stored,
            // Only `Stored` settles it (it counts jobs the first forward stored as present).
            Sent::Refused(r) | Sent::Invalid(r, _) | Sent::Unknown(r) => why = r,
        }
    }
    shared.metrics.forward("unresolved");
    Sent::Unknown(why)
}

/// The jobs of one forward, with when each may first be attempted (side by side), and the
/// events it keeps without a job.
type Outbound<'a> = (&'a [Arc<Job>], &'a [DateTime<Utc>], &'a [KeptEvent]);

/// One forward request to a Director.
async fn send(
    shared: &Shared,
    director: &DirectorEntry,
    jobs: Outbound<'_>,
    claims: &[Claim],
    claimed_at: DateTime<Utc>,
) -> Sent {
    let request = ImportRequest {
        jobdb: director.jobdb.clone(),
        from_jobdb: None,
        not_after: (!claims.is_empty()).then(|| shared.not_after(claimed_at)),
        blocked_keys: Vec::new(),
        events: jobs.2.to_vec(),
        jobs: jobs
            .0
            .iter()
            .zip(jobs.1)
            .map(|(job, first_at)| import_job(job, 0, *first_at))
            .collect(),
    };
    // The forward is a span of the request's trace, and the Director's request its child.
    let span = crate::telemetry::current_child(
        "spindle.forward",
        opentelemetry::trace::SpanKind::Client,
        vec![
            opentelemetry::KeyValue::new("http.request.method", "POST"),
            opentelemetry::KeyValue::new("spindle.director", director.id.clone()),
            opentelemetry::KeyValue::new("spindle.jobdb", director.jobdb.clone()),
            opentelemetry::KeyValue::new(
                "spindle.jobs",
                i64::try_from(jobs.0.len()).unwrap_or(i64::MAX),
            ),
        ],
    );
    let trace = TraceContext::of_span(span.span().span_context());
    let (traceparent, tracestate) = match &trace {
        Some(t) => (Some(&*t.traceparent), t.tracestate.as_deref()),
        None => (None, None),
    };
    let sent = match shared.director_client(director) {
        Err(e) => Sent::Refused(format!("director {}: {e}", director.id)),
        Ok(client) => match client
            .import_traced(&request, traceparent, tracestate)
            .await
        {
            Ok(r) if r.imported + r.already_present == jobs.0.len() => Sent::Stored,
            Ok(r) => Sent::Unknown(format!(
                "director {} stored {} of {} jobs",
                director.id,
                r.imported + r.already_present,
                jobs.0.len()
            )),
            Err(e) if e.is_connect() => {
                Sent::Refused(format!("director {} unreachable", director.id))
            }
            Err(e) if matches!(e.status(), Some(400 | 413 | 422)) => Sent::Invalid(
                format!("director {}: {e}", director.id),
                e.status().unwrap_or(422),
            ),
            // 409, 503 and other 4xx: the Director stored nothing.
            Err(e) if e.stored_nothing() => Sent::Refused(format!("director {}: {e}", director.id)),
            // Timeout, reset, 500, an answer not understood: maybe stored.
            Err(e) => Sent::Unknown(format!("director {}: {e}", director.id)),
        },
    };
    let outcome = match sent {
        Sent::Stored => "stored",
        Sent::Refused(_) | Sent::Invalid(..) => "refused",
        Sent::Unknown(_) => "unknown",
    };
    shared.metrics.forward(outcome);
    span.span()
        .set_attribute(opentelemetry::KeyValue::new("spindle.outcome", outcome));
    crate::telemetry::end_step(
        &span,
        match &sent {
            Sent::Stored => None,
            Sent::Refused(why) | Sent::Invalid(why, _) | Sent::Unknown(why) => Some(why.clone()),
        },
    );
    sent
}
