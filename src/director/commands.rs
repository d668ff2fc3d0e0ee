//! Operator intent, watched for the scheduler: commands appended to the JobDB's
//! `operator_commands` (plain SQL, see docs/operations.md), handed over in order and applied
//! once each; the endpoint and bucket controls in the registry, handed over whole on every
//! change; and the set of disabled subscriptions and the caps subscriptions put on their
//! URLs, likewise.

use std::collections::HashSet;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::mailbox::Event;
use crate::jobdb::JobDb;
use crate::registry::consul::ConsulClient;
use crate::registry::controls;

/// How often the JobDB is asked for new commands: operators see an effect within about this
/// long plus one commit.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Polls for commands that have no result yet (so a new owner applies what its predecessor
/// did not finish, and a command committed after a later-numbered one is still seen) until
/// `stop`, handing each to the scheduler once. A failed read waits for the next poll.
pub async fn watch(db: JobDb, scheduler: mpsc::UnboundedSender<Event>, stop: CancellationToken) {
    // Handed over, result not yet seen: not handed again.
    let mut handed: HashSet<u64> = HashSet::new();
    loop {
        match db.unapplied_commands().await {
            Ok(commands) => {
                let unapplied: HashSet<u64> = commands.iter().map(|c| c.id).collect();
                handed.retain(|id| unapplied.contains(id));
                for command in commands {
                    if !handed.insert(command.id) {
                        continue;
                    }
                    if scheduler.send(Event::Command(Box::new(command))).is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading operator commands failed; trying again"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL_EVERY) => {}
        }
    }
}

/// Follows the registry's controls with blocking queries until `stop`, handing each new set to
/// the scheduler. While Consul is unreachable the last set stays in force.
pub async fn watch_controls(
    consul: ConsulClient,
    scheduler: mpsc::UnboundedSender<Event>,
    stop: CancellationToken,
) {
    let mut index = 0;
    let mut last = None;
    loop {
        let read = tokio::select! {
            _ = stop.cancelled() => return,
            read = controls::read(&consul, index, Duration::from_secs(30)) => read,
        };
        match read {
            Ok((now, next)) => {
                // An index going backwards (a restored cluster) means: start over.
                index = if next < index { 0 } else { next };
                if last.as_ref() != Some(&now) {
                    last = Some(now.clone());
                    if scheduler
                        .send(Event::Controls(std::sync::Arc::new(now)))
                        .is_err()
                    {
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading endpoint controls failed; keeping the last ones");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(POLL_EVERY) => {}
                }
            }
        }
    }
}

/// Hands the scheduler every new subscription gate (the first at once) until `stop`: the
/// jobs of subscriptions it holds wait until they are known and enabled.
pub async fn watch_gate(
    gate: tokio::sync::watch::Receiver<std::sync::Arc<crate::events::SubscriptionGate>>,
    scheduler: mpsc::UnboundedSender<Event>,
    stop: CancellationToken,
) {
    follow(gate, Event::SubscriptionGate, scheduler, stop).await
}

/// Hands the scheduler every new set of subscription caps (the first at once) until `stop`.
pub async fn watch_caps(
    caps: tokio::sync::watch::Receiver<std::sync::Arc<crate::events::EndpointCaps>>,
    scheduler: mpsc::UnboundedSender<Event>,
    stop: CancellationToken,
) {
    follow(caps, Event::SubscriptionCaps, scheduler, stop).await
}

/// Hands the scheduler each value `watched` takes (the current one at once), as `event`,
/// until `stop`.
async fn follow<T: Clone>(
    mut watched: tokio::sync::watch::Receiver<T>,
    event: fn(T) -> Event,
    scheduler: mpsc::UnboundedSender<Event>,
    stop: CancellationToken,
) {
    loop {
        let now = watched.borrow_and_update().clone();
        if scheduler.send(event(now)).is_err() {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = watched.changed() => {
                if changed.is_err() {
                    // The cache is gone: nothing will change any more.
                    stop.cancelled().await;
                    return;
                }
            }
        }
    }
}
