//! Agent services and TTL checks: register/deregister, pass/warn/fail/update, TTL lapse to
//! critical, and the session invalidation a critical or removed check causes. The double
//! has one node; local registrations are visible in health/catalog at once (no
//! anti-entropy delay).

use std::collections::BTreeMap;
use std::time::Duration;

use super::State;
use crate::error::ApiError;

/// Health status of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CheckStatus {
    Passing,
    Warning,
    Critical,
}

impl CheckStatus {
    /// Parses Consul's spelling (`passing`, `warning`, `critical`).
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "passing" => Some(CheckStatus::Passing),
            "warning" => Some(CheckStatus::Warning),
            "critical" => Some(CheckStatus::Critical),
            _ => None,
        }
    }

    /// Consul's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Passing => "passing",
            CheckStatus::Warning => "warning",
            CheckStatus::Critical => "critical",
        }
    }
}

/// A registered service instance.
#[derive(Clone, Debug)]
pub(crate) struct Service {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) tags: Vec<String>,
    pub(crate) address: String,
    pub(crate) port: i64,
    pub(crate) meta: BTreeMap<String, String>,
    pub(crate) weights_passing: i64,
    pub(crate) weights_warning: i64,
    pub(crate) enable_tag_override: bool,
    pub(crate) create_index: u64,
    pub(crate) modify_index: u64,
}

/// A TTL check attached to a service.
#[derive(Clone, Debug)]
pub(crate) struct Check {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) status: CheckStatus,
    pub(crate) notes: String,
    pub(crate) output: String,
    pub(crate) service_id: String,
    pub(crate) service_name: String,
    pub(crate) ttl: Duration,
    /// Virtual time at which the TTL lapses unless updated.
    pub(crate) deadline: Option<Duration>,
    pub(crate) create_index: u64,
    pub(crate) modify_index: u64,
}

/// A check definition from a registration body.
#[derive(Clone, Debug)]
pub(crate) struct CheckSpec {
    pub(crate) id: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) ttl: Duration,
    pub(crate) status: Option<CheckStatus>,
    pub(crate) notes: String,
}

/// A service definition from a registration body.
#[derive(Clone, Debug)]
pub(crate) struct ServiceSpec {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) tags: Vec<String>,
    pub(crate) address: String,
    pub(crate) port: i64,
    pub(crate) meta: BTreeMap<String, String>,
    pub(crate) weights_passing: i64,
    pub(crate) weights_warning: i64,
    pub(crate) enable_tag_override: bool,
    pub(crate) checks: Vec<CheckSpec>,
}

impl State {
    /// Registers (or replaces) a service and its checks. A re-registered check with the
    /// same ID and no explicit `Status` keeps its status, output and TTL clock, as Consul
    /// restores persisted TTL-check state; the service's other checks stay unless
    /// `replace_existing_checks`.
    pub(crate) fn service_register(&mut self, spec: ServiceSpec, replace_existing_checks: bool) {
        let idx = self.next_index();
        let now = self.clock.now();
        let create_index = self.services.get(&spec.id).map_or(idx, |s| s.create_index);
        let n = spec.checks.len();
        let mut new_ids = Vec::with_capacity(n);
        for (i, cs) in spec.checks.iter().enumerate() {
            let id = cs.id.clone().unwrap_or_else(|| {
                if n == 1 {
                    format!("service:{}", spec.id)
                } else {
                    format!("service:{}:{}", spec.id, i + 1)
                }
            });
            let prev = self.checks.get(&id).cloned();
            let (status, output, deadline, check_create) = match (&prev, cs.status) {
                (_, Some(st)) => (
                    st,
                    String::new(),
                    Some(now + cs.ttl),
                    prev.as_ref().map_or(idx, |p| p.create_index),
                ),
                (Some(p), None) => (p.status, p.output.clone(), p.deadline, p.create_index),
                (None, None) => (
                    CheckStatus::Critical,
                    String::new(),
                    Some(now + cs.ttl),
                    idx,
                ),
            };
            let check = Check {
                id: id.clone(),
                name: cs
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("Service '{}' check", spec.name)),
                status,
                notes: cs.notes.clone(),
                output,
                service_id: spec.id.clone(),
                service_name: spec.name.clone(),
                ttl: cs.ttl,
                deadline,
                create_index: check_create,
                modify_index: idx,
            };
            self.checks.insert(id.clone(), check);
            new_ids.push(id);
        }
        let stale: Vec<String> = self
            .checks
            .values()
            .filter(|c| c.service_id == spec.id && !new_ids.contains(&c.id))
            .map(|c| c.id.clone())
            .collect();
        for id in stale {
            if replace_existing_checks {
                self.checks.remove(&id);
                self.invalidate_sessions_on_check(&id);
            } else if let Some(c) = self.checks.get_mut(&id) {
                c.service_name = spec.name.clone();
            }
        }
        self.services.insert(
            spec.id.clone(),
            Service {
                id: spec.id,
                name: spec.name,
                tags: spec.tags,
                address: spec.address,
                port: spec.port,
                meta: spec.meta,
                weights_passing: spec.weights_passing,
                weights_warning: spec.weights_warning,
                enable_tag_override: spec.enable_tag_override,
                create_index,
                modify_index: idx,
            },
        );
        self.health_index = self.index();
        // Checks registered critical invalidate sessions tied to them.
        for id in new_ids {
            if self
                .checks
                .get(&id)
                .is_some_and(|c| c.status == CheckStatus::Critical)
            {
                self.invalidate_sessions_on_check(&id);
            }
        }
    }

    /// Removes a service and its checks; no-op when unknown.
    pub(crate) fn service_deregister(&mut self, id: &str) {
        if self.services.remove(id).is_none() {
            return;
        }
        let idx = self.next_index();
        let checks: Vec<String> = self
            .checks
            .values()
            .filter(|c| c.service_id == id)
            .map(|c| c.id.clone())
            .collect();
        for c in &checks {
            self.checks.remove(c);
        }
        self.health_index = idx;
        for c in checks {
            self.invalidate_sessions_on_check(&c);
        }
    }

    /// `pass`/`warn`/`fail`/`update` on a TTL check: sets status and output and restarts
    /// the TTL clock. Unknown check → Consul's 500 text.
    pub(crate) fn check_update(
        &mut self,
        id: &str,
        status: CheckStatus,
        output: String,
    ) -> Result<(), ApiError> {
        let now = self.clock.now();
        let Some(c) = self.checks.get_mut(id) else {
            return Err(ApiError::Internal(format!(
                "CheckID \"{id}\" does not have associated TTL"
            )));
        };
        c.deadline = Some(now + c.ttl);
        c.output = output;
        if c.status != status {
            self.set_check_status(id, status);
        }
        Ok(())
    }

    /// The TTL of a check ran out: it goes critical.
    pub(crate) fn check_ttl_lapsed(&mut self, id: &str) {
        let Some(c) = self.checks.get_mut(id) else {
            return;
        };
        c.deadline = None;
        c.output = format!(
            "TTL expired (last output before timeout follows): {}",
            c.output
        );
        if c.status != CheckStatus::Critical {
            self.set_check_status(id, CheckStatus::Critical);
        }
    }

    /// Writes a status change (new index) and invalidates dependent sessions on critical.
    fn set_check_status(&mut self, id: &str, status: CheckStatus) {
        let idx = self.next_index();
        if let Some(c) = self.checks.get_mut(id) {
            c.status = status;
            c.modify_index = idx;
        }
        self.health_index = idx;
        if status == CheckStatus::Critical {
            self.invalidate_sessions_on_check(id);
        }
    }

    /// The checks of one service, sorted by ID.
    pub(crate) fn service_checks(&self, service_id: &str) -> Vec<Check> {
        self.checks
            .values()
            .filter(|c| c.service_id == service_id)
            .cloned()
            .collect()
    }
}
