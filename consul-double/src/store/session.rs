//! Session operations: create with Consul's validation, renew (not a write), and
//! invalidation (destroy / TTL expiry / check failure) applying the session's behavior and
//! lock-delay to the keys it holds.

use std::time::Duration;

use super::{CheckStatus, State};
use crate::duration::parse_go_duration_ns;
use crate::error::ApiError;

/// The node check every agent has; always passing in the double.
pub(crate) const SERF_CHECK_ID: &str = "serfHealth";

/// Longest TTL Consul accepts (`SessionTTLMax`).
pub(crate) const SESSION_TTL_MAX: Duration = Duration::from_secs(24 * 3600);

/// What happens to held keys when the session is invalidated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Behavior {
    /// Keys keep their value; the lock is cleared.
    Release,
    /// Keys are deleted.
    Delete,
}

impl Behavior {
    /// The JSON spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Behavior::Release => "release",
            Behavior::Delete => "delete",
        }
    }
}

/// A service check a session is tied to (`ServiceChecks` entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServiceCheckRef {
    /// Check ID.
    pub(crate) id: String,
    /// Namespace (enterprise; kept as given).
    pub(crate) namespace: String,
}

/// A session request after body decoding, before validation.
#[derive(Clone, Debug)]
pub(crate) struct SessionSpec {
    pub(crate) name: String,
    pub(crate) node: String,
    /// Nanoseconds, after the "< 1000 means seconds" fix-up.
    pub(crate) lock_delay_ns: i64,
    pub(crate) behavior: String,
    pub(crate) ttl: String,
    pub(crate) node_checks: Vec<String>,
    pub(crate) checks: Option<Vec<String>>,
    pub(crate) service_checks: Option<Vec<ServiceCheckRef>>,
}

/// A live session.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) node: String,
    pub(crate) lock_delay_ns: i64,
    pub(crate) behavior: Behavior,
    /// TTL string as given (`""` if none).
    pub(crate) ttl: String,
    pub(crate) node_checks: Vec<String>,
    pub(crate) checks: Option<Vec<String>>,
    pub(crate) service_checks: Option<Vec<ServiceCheckRef>>,
    pub(crate) create_index: u64,
    pub(crate) modify_index: u64,
    /// Parsed TTL, if the session has one.
    pub(crate) ttl_dur: Option<Duration>,
    /// Virtual time at which the TTL timer fires (TTL × multiplier after create/renew).
    pub(crate) deadline: Option<Duration>,
}

impl Session {
    /// Every check ID the session depends on.
    pub(crate) fn check_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.node_checks
            .iter()
            .chain(self.checks.iter().flatten())
            .map(String::as_str)
            .chain(self.service_checks.iter().flatten().map(|c| c.id.as_str()))
    }
}

impl State {
    /// Validates and creates a session; returns its ID. Errors are Consul's 500s.
    pub(crate) fn session_create(&mut self, spec: SessionSpec) -> Result<String, ApiError> {
        if spec.node.is_empty() {
            return Err(ApiError::Internal("Must provide Node".into()));
        }
        let behavior = match spec.behavior.as_str() {
            "" | "release" => Behavior::Release,
            "delete" => Behavior::Delete,
            other => {
                return Err(ApiError::Internal(format!(
                    "Invalid Behavior setting '{other}'"
                )))
            }
        };
        let mut ttl_dur = None;
        if !spec.ttl.is_empty() {
            let ns = parse_go_duration_ns(&spec.ttl).map_err(|e| {
                ApiError::Internal(format!("Session TTL '{}' invalid: {e}", spec.ttl))
            })?;
            if ns != 0 {
                let min = self.config.session_ttl_min;
                let ok = u64::try_from(ns)
                    .map(Duration::from_nanos)
                    .is_ok_and(|d| d >= min && d <= SESSION_TTL_MAX);
                if !ok {
                    return Err(ApiError::Internal(format!(
                        "Invalid Session TTL '{ns}', must be between [{min:?}={SESSION_TTL_MAX:?}]"
                    )));
                }
                ttl_dur = Some(Duration::from_nanos(ns as u64));
            }
        }
        if spec.node != self.config.node_name {
            return Err(ApiError::Internal("Missing node registration".into()));
        }
        let all_checks = spec
            .node_checks
            .iter()
            .chain(spec.checks.iter().flatten())
            .chain(spec.service_checks.iter().flatten().map(|c| &c.id));
        for id in all_checks {
            if id == SERF_CHECK_ID {
                continue;
            }
            match self.checks.get(id) {
                None => {
                    return Err(ApiError::Internal(format!(
                        "Missing check '{id}' registration"
                    )))
                }
                Some(c) if c.status == CheckStatus::Critical => {
                    return Err(ApiError::Internal(format!(
                        "Check '{id}' is in critical state"
                    )))
                }
                Some(_) => {}
            }
        }
        let mut id = uuid::Uuid::new_v4().to_string();
        while self.sessions.contains_key(&id) {
            id = uuid::Uuid::new_v4().to_string();
        }
        let idx = self.next_index();
        let deadline = ttl_dur.map(|t| self.clock.now() + self.ttl_timer(t));
        self.sessions.insert(
            id.clone(),
            Session {
                id: id.clone(),
                name: spec.name,
                node: spec.node,
                lock_delay_ns: spec.lock_delay_ns,
                behavior,
                ttl: spec.ttl,
                node_checks: spec.node_checks,
                checks: spec.checks,
                service_checks: spec.service_checks,
                create_index: idx,
                modify_index: idx,
                ttl_dur,
                deadline,
            },
        );
        self.sessions_index = idx;
        Ok(id)
    }

    /// How long after create/renew a TTL session is invalidated.
    fn ttl_timer(&self, ttl: Duration) -> Duration {
        ttl.saturating_mul(self.config.session_ttl_multiplier.max(1))
    }

    /// Resets a session's TTL timer; `None` when the session does not exist. Not a write.
    pub(crate) fn session_renew(&mut self, id: &str) -> Option<Session> {
        let now = self.clock.now();
        let timer = self.sessions.get(id)?.ttl_dur.map(|t| self.ttl_timer(t));
        let s = self.sessions.get_mut(id)?;
        s.deadline = timer.map(|t| now + t);
        Some(s.clone())
    }

    /// Invalidates a session as destroy or TTL expiry does: held keys are released or
    /// deleted per its behavior and get a lock-delay. False when it did not exist.
    pub(crate) fn session_invalidate(&mut self, id: &str) -> bool {
        let Some(sess) = self.sessions.remove(id) else {
            return false;
        };
        let idx = self.next_index();
        self.sessions_index = idx;
        let held: Vec<String> = self
            .kv
            .values()
            .filter(|e| e.session.as_deref() == Some(id))
            .map(|e| e.key.clone())
            .collect();
        let delay = u64::try_from(sess.lock_delay_ns)
            .map(Duration::from_nanos)
            .unwrap_or(Duration::ZERO)
            .min(self.config.max_lock_delay);
        let now = self.clock.now();
        for key in held {
            match sess.behavior {
                Behavior::Release => {
                    if let Some(e) = self.kv.get_mut(&key) {
                        e.session = None;
                        e.modify_index = idx;
                        self.kv_index = idx;
                    }
                }
                Behavior::Delete => self.kv_remove(&key, idx),
            }
            if delay > Duration::ZERO {
                self.lock_delays.insert(key, now + delay);
            }
        }
        true
    }

    /// Invalidates every session that depends on `check_id` (it went critical or away).
    pub(crate) fn invalidate_sessions_on_check(&mut self, check_id: &str) {
        let ids: Vec<String> = self
            .sessions
            .values()
            .filter(|s| s.check_ids().any(|c| c == check_id))
            .map(|s| s.id.clone())
            .collect();
        for id in ids {
            self.session_invalidate(&id);
        }
    }
}
