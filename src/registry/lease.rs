//! Leases: exclusive ownership of one JobDB, with a fencing token and a loss signal.
//!
//! A lease is only as good as the storage's check of its token (see `docs/architecture.md`,
//! "Fencing"): a holder can be paused past its expiry and never know. So a lease promises two
//! things only: its token is higher than any earlier holder's, and `lost` fires as soon as this
//! process cannot be sure it still holds the lock (renew refused, no successful renew within
//! the TTL, the lock key changed hands, the lock connection broke).

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::consul::{Behavior, ConsulClient, Put, ReadOptions, SessionSpec};
use super::RegistryError;
use crate::jobdb::lock::ServerLock;
use crate::jobdb::{JobDbError, JobDbUrl};

/// How a lease is held, and what stopping it involves.
enum Holder {
    /// MySQL `GET_LOCK`; the watcher returns the lock when asked to stop.
    Server(JoinHandle<Option<ServerLock>>),
    /// A Consul session lock; the keeper renews and watches until asked to stop.
    Consul {
        client: ConsulClient,
        key: String,
        session: String,
        value: Vec<u8>,
        keeper: JoinHandle<()>,
    },
}

/// Exclusive ownership of one JobDB.
pub struct Lease {
    /// Fencing token to store in the JobDB: `None` asks the JobDB to bump its own counter
    /// (`GET_LOCK` mode, where the lock has no token of its own).
    pub token: Option<u64>,
    /// Fires when ownership is lost or in doubt; every write must stop.
    pub lost: CancellationToken,
    stop: CancellationToken,
    holder: Holder,
}

impl Lease {
    /// Gives the lock back (release, then destroy the session, so no lock-delay is left).
    pub async fn release(self) {
        self.stop.cancel();
        match self.holder {
            Holder::Server(watcher) => {
                if let Ok(Some(lock)) = watcher.await {
                    if let Err(e) = lock.release().await {
                        tracing::warn!(error = %e, "releasing the jobdb lock failed; it ends with its connection");
                    }
                }
            }
            Holder::Consul {
                client,
                key,
                session,
                value,
                keeper,
            } => {
                let _ = keeper.await;
                // Bounded: when Consul itself is failing, the session expires on its own, and a
                // stopping Director must not hang on it.
                let limit = Duration::from_secs(2);
                if !self.lost.is_cancelled() {
                    let released = tokio::time::timeout(
                        limit,
                        client.kv_put(&key, &value, Put::Release(&session)),
                    )
                    .await;
                    if !matches!(released, Ok(Ok(true))) {
                        tracing::warn!(key, "releasing the lock failed; it ends with the session");
                    }
                }
                if !matches!(
                    tokio::time::timeout(limit, client.session_destroy(&session)).await,
                    Ok(Ok(()))
                ) {
                    tracing::warn!("destroying the session failed; it expires with its ttl");
                }
            }
        }
    }
}

/// Takes the JobDB's MySQL `GET_LOCK` (fails with `Held` at once if another process has it)
/// and checks it every `every`.
pub async fn server_lock(url: &JobDbUrl, every: Duration) -> Result<Lease, JobDbError> {
    let lock = ServerLock::try_acquire(url).await?;
    let lost = CancellationToken::new();
    let stop = CancellationToken::new();
    let watcher = tokio::spawn(watch_server_lock(lock, every, lost.clone(), stop.clone()));
    Ok(Lease {
        token: None,
        lost,
        stop,
        holder: Holder::Server(watcher),
    })
}

async fn watch_server_lock(
    mut lock: ServerLock,
    every: Duration,
    lost: CancellationToken,
    stop: CancellationToken,
) -> Option<ServerLock> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Some(lock),
            _ = tokio::time::sleep(every) => {}
        }
        if let Err(e) = lock.check(every).await {
            tracing::error!(error = %e, "jobdb lock lost: stopping all writes");
            lost.cancel();
            return None;
        }
    }
}

/// Timing of a Consul lock.
#[derive(Clone, Copy, Debug)]
pub struct LockTiming {
    /// Session TTL (Consul invalidates after up to twice this; its minimum is 10 s).
    pub ttl: Duration,
    /// After an invalidation, the key cannot be acquired for this long.
    pub lock_delay: Duration,
}

/// Tries once to take the Consul lock `key` for a new session, storing `value` in the key.
/// `Ok(None)`: someone else holds it (or its lock-delay runs). On success the token is the
/// key's `ModifyIndex` read back consistently: a raft index, so it rises with every grant and
/// survives deletes, unlike `LockIndex` (see the Consul reference, 4.3).
pub async fn consul_lock(
    client: &ConsulClient,
    key: &str,
    value: &[u8],
    name: &str,
    timing: LockTiming,
) -> Result<Option<Lease>, RegistryError> {
    let session = client
        .session_create(&SessionSpec {
            name: name.to_owned(),
            ttl: timing.ttl,
            lock_delay: timing.lock_delay,
            behavior: Behavior::Release,
        })
        .await?;
    let acquired = match client.kv_put(key, value, Put::Acquire(&session)).await {
        Ok(acquired) => acquired,
        Err(e) => {
            let _ = client.session_destroy(&session).await;
            return Err(e);
        }
    };
    let entry = if acquired {
        client
            .kv_get(
                key,
                ReadOptions {
                    consistent: true,
                    ..ReadOptions::default()
                },
            )
            .await
            .map(|v| v.value)
    } else {
        Ok(None)
    };
    let entry = match entry {
        Ok(Some(entry)) if entry.session.as_deref() == Some(session.as_str()) => entry,
        Ok(_) => {
            let _ = client.session_destroy(&session).await;
            return Ok(None);
        }
        Err(e) => {
            let _ = client.session_destroy(&session).await;
            return Err(e);
        }
    };
    let lost = CancellationToken::new();
    let stop = CancellationToken::new();
    let keeper = tokio::spawn(keep_consul_lock(
        client.clone(),
        key.to_owned(),
        session.clone(),
        entry.modify_index,
        timing.ttl,
        lost.clone(),
        stop.clone(),
    ));
    Ok(Some(Lease {
        token: Some(entry.modify_index),
        lost,
        stop,
        holder: Holder::Consul {
            client: client.clone(),
            key: key.to_owned(),
            session,
            value: value.to_vec(),
            keeper,
        },
    }))
}

/// Renews every TTL/2 and watches the key; declares the lock lost on a refused renew, on no
/// successful renew within the TTL (this process cannot see the server's clock), or when the
/// key no longer names our session.
async fn keep_consul_lock(
    client: ConsulClient,
    key: String,
    session: String,
    mut index: u64,
    ttl: Duration,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let mut last_renewed = Instant::now();
    let renew_every = ttl / 2;
    let mut next_renew = Instant::now() + renew_every;
    let watch_stop = stop.child_token();
    let watcher = {
        let (client, key, session, lost, watch_stop) = (
            client.clone(),
            key.clone(),
            session.clone(),
            lost.clone(),
            watch_stop.clone(),
        );
        tokio::spawn(async move {
            loop {
                let read = client.kv_get(
                    &key,
                    ReadOptions {
                        index,
                        wait: Some(ttl),
                        consistent: true,
                    },
                );
                let result = tokio::select! {
                    _ = watch_stop.cancelled() => return,
                    r = read => r,
                };
                match result {
                    Ok(v) => {
                        let ours = v.value.as_ref().and_then(|e| e.session.as_deref())
                            == Some(session.as_str());
                        if !ours {
                            tracing::error!(key, "lock key no longer held by our session");
                            lost.cancel();
                            return;
                        }
                        // An index that goes backwards (snapshot restore) restarts the watch.
                        index = if v.index < index { 1 } else { v.index };
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "watching the lock key failed");
                        // The renew loop decides about loss; just do not spin.
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        })
    };
    loop {
        // Wake at least every 100 ms so that a process resumed after a long pause (SIGSTOP,
        // VM freeze) notices at once that its last renew is older than the TTL.
        let tick = next_renew.min(Instant::now() + Duration::from_millis(100));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = lost.cancelled() => break,
            _ = tokio::time::sleep_until(tick) => {}
        }
        if last_renewed.elapsed() >= ttl {
            tracing::error!(
                key,
                "no successful renew within the ttl: lock treated as lost"
            );
            lost.cancel();
            break;
        }
        if Instant::now() < next_renew {
            continue;
        }
        let renew = tokio::time::timeout(
            ttl.saturating_sub(last_renewed.elapsed()),
            client.session_renew(&session),
        );
        match renew.await {
            Ok(Ok(_server_ttl)) => {
                // The server may answer with a larger TTL to ask for fewer renewals. We keep
                // renewing every TTL/2 of our own TTL: our loss deadline is that TTL, so a
                // slower cadence would declare the lock lost before renewing it.
                last_renewed = Instant::now();
                next_renew = last_renewed + renew_every;
            }
            Ok(Err(RegistryError::SessionGone(_))) => {
                tracing::error!(key, "session renew refused: lock lost");
                lost.cancel();
                break;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "session renew failed; retrying");
                next_renew = Instant::now() + Duration::from_millis(200);
            }
            Err(_) => {
                tracing::warn!("session renew timed out");
                next_renew = Instant::now();
            }
        }
    }
    watch_stop.cancel();
    let _ = watcher.await;
}
