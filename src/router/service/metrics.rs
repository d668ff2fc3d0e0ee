//! The router's metrics (`spindle_router_*`), served at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::rpc::api::JobStatus;

/// Label set of a per-job result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

/// Label set of a forward's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForwardLabels {
    outcome: &'static str,
}

/// Label set of a published event's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The router's metrics (`spindle_router_*`).
pub(super) struct RouterMetrics {
    registry: Registry,
    jobs: Family<StatusLabels, Counter>,
    events: Family<ResultLabels, Counter>,
    event_jobs: Counter,
    forwards: Family<ForwardLabels, Counter>,
    pub(super) claim_seconds: Histogram,
    pub(super) dedup_lost: Counter,
    pub(super) confirm_failures: Counter,
    pub(super) directors: Gauge,
}

impl RouterMetrics {
    pub(super) fn new() -> Self {
        let mut registry = Registry::with_prefix("spindle_router");
        let jobs = Family::<StatusLabels, Counter>::default();
        registry.register("jobs", "Submitted jobs by result", jobs.clone());
        let events = Family::<ResultLabels, Counter>::default();
        registry.register(
            "events",
            "Published events by result (stored, duplicate, refused, invalid, \
             unknown); their jobs are not counted in jobs",
            events.clone(),
        );
        let event_jobs = Counter::default();
        registry.register(
            "event_jobs",
            "Jobs of published events that were stored (one per matching subscription)",
            event_jobs.clone(),
        );
        let forwards = Family::<ForwardLabels, Counter>::default();
        registry.register(
            "forwards",
            "Forward requests to Directors by outcome",
            forwards.clone(),
        );
        let claim_seconds = Histogram::new(exponential_buckets(0.0002, 2.0, 16));
        registry.register(
            "dedup_claim_duration_seconds",
            "Duration of one request's dedup claim",
            claim_seconds.clone(),
        );
        let dedup_lost = Counter::default();
        registry.register(
            "dedup_lost",
            "Stored jobs whose claim another job held at confirmation (duplicates let through)",
            dedup_lost.clone(),
        );
        let confirm_failures = Counter::default();
        registry.register(
            "dedup_confirm_failures",
            "Stored jobs whose claim could not be confirmed (left pending)",
            confirm_failures.clone(),
        );
        let directors = Gauge::default();
        registry.register(
            "directors",
            "Healthy Directors in the catalog",
            directors.clone(),
        );
        RouterMetrics {
            registry,
            jobs,
            events,
            event_jobs,
            forwards,
            claim_seconds,
            dedup_lost,
            confirm_failures,
            directors,
        }
    }

    pub(super) fn count(&self, status: JobStatus) {
        let status = match status {
            JobStatus::Accepted => "accepted",
            JobStatus::Duplicate => "duplicate",
            JobStatus::Pending => "pending",
            JobStatus::Failed => "failed",
        };
        self.jobs.get_or_create(&StatusLabels { status }).inc();
    }

    /// A published event's result, and how many jobs it stored.
    pub(super) fn event(&self, result: &'static str, jobs: usize) {
        self.events.get_or_create(&ResultLabels { result }).inc();
        self.event_jobs.inc_by(jobs as u64);
    }

    pub(super) fn forward(&self, outcome: &'static str) {
        self.forwards
            .get_or_create(&ForwardLabels { outcome })
            .inc();
    }

    pub(super) fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        crate::metrics::to_prometheus_text(&out)
    }
}
