//! The ledger as Prometheus metrics (`spindle audit --every`), on its own registry. The
//! alert rules over them are `prometheus/spindle-alerts.yml`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Ledger;

/// A JobDB and one part of its ledger.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartLabels {
    jobdb: String,
    /// `accepted`, `succeeded`, `discarded`, `archived`, `moved` or `open`.
    part: String,
}

/// A JobDB and a kind of finding.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FindingLabels {
    jobdb: String,
    /// A [`super::Kind`]'s name.
    kind: String,
    /// `loss` (wrong at any moment) or `stall` (wrong when it lasts).
    class: String,
}

/// The audit's metrics: the last round's ledgers, and how the rounds go.
pub struct LedgerMetrics {
    registry: Registry,
    jobs: Family<PartLabels, Gauge>,
    findings: Family<FindingLabels, Gauge>,
    unbalanced: Family<PartLabels, Gauge>,
    rounds: Counter,
    last_round: Gauge,
    round_seconds: Gauge<f64, AtomicU64>,
}

impl Default for LedgerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let jobs = Family::<PartLabels, Gauge>::default();
        registry.register(
            "spindle_ledger_jobs",
            "Jobs of a JobDB by ledger part (accepted = succeeded + discarded + archived + moved + open), at the last audit",
            jobs.clone(),
        );
        let findings = Family::<FindingLabels, Gauge>::default();
        registry.register(
            "spindle_ledger_findings",
            "Findings of the last audit of a JobDB, by kind; class loss is never right, class stall is wrong when it lasts",
            findings.clone(),
        );
        let unbalanced = Family::<PartLabels, Gauge>::default();
        registry.register(
            "spindle_ledger_difference",
            "accepted minus ended minus open at the last audit of a JobDB (part=\"accepted\"): 0 when it balances",
            unbalanced.clone(),
        );
        let rounds = Counter::default();
        registry.register(
            "spindle_audit_rounds",
            "Audits of every JobDB",
            rounds.clone(),
        );
        let last_round = Gauge::default();
        registry.register(
            "spindle_audit_last_round_timestamp_seconds",
            "When the last audit of every JobDB finished (Unix time)",
            last_round.clone(),
        );
        let round_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "spindle_audit_round_seconds",
            "How long the last audit of every JobDB took",
            round_seconds.clone(),
        );
        LedgerMetrics {
            registry,
            jobs,
            findings,
            unbalanced,
            rounds,
            last_round,
            round_seconds,
        }
    }
}

impl LedgerMetrics {
    /// Replaces the last round's figures with these ledgers' (a JobDB gone is gone from them).
    pub fn record(&self, ledgers: &[Ledger], took: std::time::Duration) {
        self.jobs.clear();
        self.findings.clear();
        self.unbalanced.clear();
        for l in ledgers {
            for (part, n) in l.parts() {
                let labels = PartLabels {
                    jobdb: l.jobdb.clone(),
                    part: part.into(),
                };
                self.jobs.get_or_create(&labels).set(gauge(n));
            }
            let difference = gauge(l.accepted) - gauge(l.ended()) - gauge(l.open);
            let labels = PartLabels {
                jobdb: l.jobdb.clone(),
                part: "accepted".into(),
            };
            self.unbalanced.get_or_create(&labels).set(difference);
            for (kind, n) in l.counts() {
                let labels = FindingLabels {
                    jobdb: l.jobdb.clone(),
                    kind: kind.as_str().into(),
                    class: kind.class().into(),
                };
                self.findings.get_or_create(&labels).set(gauge(n));
            }
        }
        self.rounds.inc();
        self.last_round.set(chrono::Utc::now().timestamp());
        self.round_seconds.set(took.as_secs_f64());
    }

    /// The classic Prometheus text format, as the Directors serve theirs.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        crate::metrics::to_prometheus_text(&out)
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_shows_every_kind_and_forgets_a_jobdb_gone() {
        let m = LedgerMetrics::default();
        let mut a = Ledger::unreachable("a", "down");
        a.accepted = 3;
        m.record(
            &[a, Ledger::unreachable("b", "down")],
            std::time::Duration::ZERO,
        );
        let text = m.render();
        assert!(text.contains(
            "spindle_ledger_findings{jobdb=\"a\",kind=\"unreachable\",class=\"stall\"} 1"
        ));
        assert!(text
            .contains("spindle_ledger_findings{jobdb=\"a\",kind=\"vanished\",class=\"loss\"} 0"));
        assert!(text.contains("spindle_ledger_difference{jobdb=\"a\",part=\"accepted\"} 3"));
        m.record(
            &[Ledger::unreachable("a", "down")],
            std::time::Duration::ZERO,
        );
        assert!(!m.render().contains("jobdb=\"b\""));
    }
}
