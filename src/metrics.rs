//! Prometheus metrics of a Director, on an explicit registry (no globals).

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

use crate::delivery::classify::Verdict;

/// Label set naming an attempt's outcome class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `succeeded`, `discarded` or `retried`.
    pub outcome: String,
}

/// Label set naming a JobDB lifecycle state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `spare`, `active`, `retiring`, `draining`, `drained` or `dropped`.
    pub state: String,
}

/// Label set naming a manager decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `create_spare`, `retire`, `drop_spare` or `drop_drained`.
    pub action: String,
}

/// Label set naming what holds a queue of ready jobs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// `running` (the endpoint takes requests), `breaker_open` (probes only), `paused`
    /// (an endpoint control), `bucket_paused` (set aside by a bucket control),
    /// `endpoint_parked` (ready jobs of a parked endpoint) or `waiting` (cached, waiting for a
    /// retry or for its payload).
    pub class: &'static str,
}

/// Label set naming a kind of write to the JobDB.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `submit`, `import` or `transitions`.
    pub op: &'static str,
    /// Why it was not written: `refused` (the server refused its data, or a row is larger
    /// than it accepts), `expired` (a router's `not_after` passed before its COMMIT),
    /// `withdrawn` (its wait ended before the writer took it: 503, never written),
    /// `outcome-unknown` (its wait ended while it was being written: 504) or `not-writable`
    /// (refused at once, 503, while the JobDB cannot be written).
    pub reason: &'static str,
}

/// Label set naming a watched core task of a Director.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    /// `writer`, `scheduler` or `sequencer`.
    pub task: &'static str,
}

/// Label set naming what a control applies to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControlLabels {
    /// `endpoint` or `bucket`.
    pub target: &'static str,
}

/// Label set saying whether a JobDB could be reached.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReachLabels {
    /// `true` or `false`.
    pub reachable: &'static str,
}

/// Label set naming why a live Director's refusal of a drainer's import was taken as it was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `target_limit` (a 413: the target's size limits or its JobDB server's packet size;
    /// the job waits for a target that takes it), `target_refused` (another 4xx for a job this
    /// version's checks accept: an older version, another configuration; it waits too) or
    /// `invalid` (no Director of this version can import it: discarded `import-refused`).
    pub reason: &'static str,
}

/// Label set naming a JobDB.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobDbLabels {
    /// Its database name.
    pub jobdb: String,
}

/// Every metric a spindle process exports (a Director's, a manager's or a drainer's; each
/// fills in its own).
pub struct Metrics {
    registry: Registry,
    /// Jobs durable in the JobDB and acknowledged.
    pub jobs_accepted: Counter,
    /// Attempts by outcome class.
    pub attempts: Family<OutcomeLabels, Counter>,
    /// Attempt durations by outcome class.
    pub attempt_seconds: Family<OutcomeLabels, Histogram>,
    /// Jobs moved to `archiving` on expiry.
    pub jobs_expired: Counter,
    /// Jobs imported from retired JobDBs.
    pub jobs_imported: Counter,
    /// Jobs accepted to wait for a later first attempt (`deliver_at`, `delay_ms`).
    pub jobs_scheduled: Counter,
    /// Completion notices written (jobs to an ended job's `on_complete` URL).
    pub notices_written: Counter,
    /// Ordered jobs released: their turn in their sequence came.
    pub ordered_released: Counter,
    /// Of those, jobs released in the commit that stored them (their sequence had nothing
    /// before them).
    pub ordered_born: Counter,
    /// Ordered jobs kept: stored waiting for their turn in the writer's book, without an
    /// `open_jobs` entry.
    pub ordered_kept: Counter,
    /// Of those, jobs whose attempt began in the commit that released them (offered by the
    /// scheduler when the job before them ended).
    pub ordered_begun_on_release: Counter,
    /// Ordered jobs the writer's book holds (waiting or under way).
    pub ordered_booked: Gauge,
    /// Sequences spilled to the store: the book had no room for them.
    pub ordered_spilled: Counter,
    /// Events published here (`POST /v1/events`), whether or not a subscription matched.
    pub events_published: Counter,
    /// Jobs those events made (one per matching subscription).
    pub event_jobs: Counter,
    /// Heads the book held waiting that the JobDB did not (something changed its entries
    /// behind the writer: expect 0).
    pub ordered_heads_misremembered: Counter,
    /// Ordered jobs whose release waits for an older job of their sequence in another JobDB.
    pub ordered_waiting_elsewhere: Gauge,
    /// Sequences of new ordered jobs the intake's survey of the other JobDBs cleared.
    pub ordered_cleared_at_intake: Counter,
    /// Ordered heads released without reading the other JobDBs: an earlier complete read
    /// cleared their position (see `director::sequencer`).
    pub ordered_cleared: Counter,
    /// Checks of the other live JobDBs that could not read every one of them (or the
    /// inventory): heads not cleared before wait.
    pub ordered_survey_failures: Counter,
    /// Jobs recorded `archived` after their archive object was confirmed.
    pub jobs_archived: Counter,
    /// Archive uploads that failed (retried).
    pub archive_failures: Counter,
    /// Rows per JobDB transaction.
    pub write_batch_rows: Histogram,
    /// Duration of JobDB transactions.
    pub write_seconds: Histogram,
    /// Transactions rejected by the fence.
    pub fence_rejections: Counter,
    /// Write requests queued for the writer (read when metrics are scraped).
    pub write_queue: Gauge,
    /// Write requests not written, by kind and reason (the rest of their batch was).
    pub write_rejections: Family<WriteLabels, Counter>,
    /// Jobs discarded because they used up `--max-attempts`.
    pub jobs_out_of_attempts: Counter,
    /// Jobs that rested without a row of their own (their `open_jobs` entry written because
    /// they waited long, or the cache had no room).
    pub jobs_rested: Counter,
    /// Jobs accepted that have neither a row of their own nor an `open_jobs` entry yet.
    pub jobs_fresh: Gauge,
    /// Attempts begun (listed by a commit) and not ended.
    pub attempts_under_way: Gauge,
    /// Attempts begun and not sent: their endpoint paused or was judged down first.
    pub attempts_held_back: Counter,
    /// 1 while every core task of the Director runs; 0 once one ended unexpectedly.
    pub core_tasks_up: Gauge,
    /// 1 while the Director's JobDB can be written; 0 while the writer has had work without a
    /// commit succeeding for longer than its bound (the Director is then not ready).
    pub jobdb_writable: Gauge,
    /// When the writer's last commit succeeded (Unix seconds).
    pub jobdb_last_commit: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// 1 while a watched core task has had work without progress past its bound.
    pub tasks_stalled: Family<TaskLabels, Gauge>,
    /// Jobs in the Director's cache.
    pub jobs_cached: Gauge,
    /// Attempts in flight.
    pub in_flight: Gauge,
    /// Attempts whose HTTP request was started.
    pub attempts_started: Counter,
    /// Unfinished jobs whose payload is not held in memory (read back when due).
    pub jobs_spilled: Gauge,
    /// When the last attempt started (Unix seconds): shows when a fenced-out Director stopped.
    pub last_attempt_started: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Payload and header bytes of the cached jobs held in memory.
    pub cached_payload_bytes: Gauge,
    /// Jobs read into the cache by backlog passes (they had waited in the JobDB only).
    pub jobs_backlog_loaded: Counter,
    /// Waiting jobs evicted from a full cache, to be read back shortly before they are due.
    pub jobs_evicted: Counter,
    /// Operator commands applied and recorded.
    pub operator_commands: Counter,
    /// Endpoint circuit breakers that opened (an endpoint judged down).
    pub breaker_opened: Counter,
    /// Endpoints whose circuit breaker is open now (probes only).
    pub breakers_open: Gauge,
    /// Cached jobs by what they wait for (queue depth by endpoint class).
    pub queued: Family<QueueLabels, Gauge>,
    /// Endpoint and bucket controls in force on this Director, by what they name.
    pub controls: Family<ControlLabels, Gauge>,
    /// Dashboard: JobDBs it reads, by whether they could be reached.
    pub dashboard_jobdbs: Family<ReachLabels, Gauge>,
    /// Dashboard: API requests answered.
    pub dashboard_requests: Counter,
    /// Drainer: jobs moved out of retired JobDBs into live ones.
    pub jobs_moved: Counter,
    /// Drainer: retired JobDBs drained.
    pub jobdbs_drained: Counter,
    /// Drainer: jobs a live Director refused to import for good (ended `import-refused`).
    pub jobs_import_refused: Counter,
    /// Drainer: refusals of a job by a live Director's import, by how they were taken.
    pub import_refusals: Family<RefusalLabels, Counter>,
    /// Drainer: jobs of a retired JobDB that a live Director refused and a Director of this
    /// version could take, waiting for a target that does (the drain does not end meanwhile).
    pub jobs_waiting_for_target: Family<JobDbLabels, Gauge>,
    /// Manager: JobDBs in the inventory by state (set every round by the active manager).
    pub jobdbs: Family<StateLabels, Gauge>,
    /// Manager: decisions taken, by kind.
    pub manager_actions: Family<ActionLabels, Counter>,
    /// Manager: 1 while this manager holds the manager lock.
    pub manager_active: Gauge,
}

fn attempt_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("spindle");
        let r = &mut registry;
        Metrics {
            jobs_accepted: metric(r, "jobs_accepted", "Jobs persisted and acknowledged"),
            attempts: metric(r, "attempts", "Delivery attempts by outcome"),
            attempt_seconds: registered(
                r,
                "attempt_duration_seconds",
                "Delivery attempt duration",
                Family::<OutcomeLabels, Histogram>::new_with_constructor(
                    attempt_histogram as fn() -> Histogram,
                ),
            ),
            jobs_expired: metric(
                r,
                "jobs_expired",
                "Jobs that expired undelivered and went to archiving",
            ),
            jobs_imported: metric(r, "jobs_imported", "Jobs imported from retired JobDBs"),
            jobs_scheduled: metric(
                r,
                "jobs_scheduled",
                "Jobs accepted to wait for a later first attempt",
            ),
            notices_written: metric(
                r,
                "notices_written",
                "Completion notices written, each a job to an ended job's on_complete URL",
            ),
            ordered_released: metric(
                r,
                "ordered_released",
                "Ordered jobs released: their turn in their sequence came",
            ),
            ordered_born: metric(
                r,
                "ordered_born",
                "Ordered jobs released in the commit that stored them: their sequence had no open \
                 job and no block here (and, in a cluster, the intake cleared them)",
            ),
            ordered_kept: metric(
                r,
                "ordered_kept",
                "Ordered jobs kept: stored to wait for their turn in the writer's book (a \
                 Director without peers), with no open_jobs entry unless they rest",
            ),
            ordered_begun_on_release: metric(
                r,
                "ordered_begun_on_release",
                "Ordered jobs whose attempt began in the commit that released them, the one that \
                 ended the job before them (no commit of their own to begin it)",
            ),
            events_published: metric(
                r,
                "events_published",
                "Events published (POST /v1/events), whether or not a subscription matched",
            ),
            event_jobs: metric(
                r,
                "event_jobs",
                "Jobs made by published events: one per matching subscription",
            ),
            ordered_booked: metric(
                r,
                "ordered_booked",
                "Ordered jobs the writer's book of sequences holds, waiting or under way",
            ),
            ordered_spilled: metric(
                r,
                "ordered_spilled",
                "Sequences spilled to the store: the writer's book had no room for them \
                 (--ordered-book-jobs), so the sequencer moves them",
            ),
            ordered_heads_misremembered: metric(
                r,
                "ordered_heads_misremembered",
                "Heads the writer's book held waiting that the JobDB did not: the book let them \
                 go (something changed the JobDB's entries behind the writer; expect 0)",
            ),
            ordered_waiting_elsewhere: metric(
                r,
                "ordered_waiting_elsewhere",
                "Sequences whose next job waits for an older job of theirs in another JobDB",
            ),
            ordered_cleared_at_intake: metric(
                r,
                "ordered_cleared_at_intake",
                "Sequences of new ordered jobs an intake's survey found held and blocked nowhere \
                 else: their jobs go in the writer's commits (see director::sequencer::Clearance)",
            ),
            ordered_cleared: metric(
                r,
                "ordered_cleared",
                "Ordered heads released without reading the other JobDBs, cleared by an earlier \
                 complete read",
            ),
            ordered_survey_failures: metric(
                r,
                "ordered_survey_failures",
                "Checks of the other live JobDBs that could not read them all; uncleared heads \
                 wait",
            ),
            jobs_archived: metric(
                r,
                "jobs_archived",
                "Jobs recorded archived after their archive object was confirmed",
            ),
            archive_failures: metric(
                r,
                "archive_upload_failures",
                "Archive uploads that failed and will be retried",
            ),
            write_batch_rows: registered(
                r,
                "jobdb_write_batch_rows",
                "Rows per JobDB transaction",
                Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            ),
            write_seconds: registered(
                r,
                "jobdb_write_duration_seconds",
                "JobDB transaction duration",
                Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            ),
            fence_rejections: metric(
                r,
                "jobdb_fence_rejections",
                "Transactions rejected by the fencing token",
            ),
            write_queue: metric(
                r,
                "jobdb_write_queue",
                "Write requests (submissions, transitions) queued for the JobDB writer",
            ),
            write_rejections: metric(
                r,
                "jobdb_write_rejections",
                "Write requests refused alone (their data, or a router deadline), the rest of \
                 their batch written",
            ),
            jobs_out_of_attempts: metric(
                r,
                "jobs_out_of_attempts",
                "Jobs discarded after using up their attempts (error_type max-attempts)",
            ),
            jobs_rested: metric(
                r,
                "jobs_rested",
                "Jobs given an open_jobs entry without a row of their own (waited long, or no \
                 room in the cache)",
            ),
            jobs_fresh: metric(
                r,
                "jobs_fresh",
                "Jobs accepted with neither a row of their own nor an open_jobs entry yet",
            ),
            attempts_under_way: metric(
                r,
                "attempts_under_way",
                "Attempts begun by a commit and not ended",
            ),
            attempts_held_back: metric(
                r,
                "attempts_held_back",
                "Attempts begun and not sent: their endpoint paused or was judged down first \
                 (error_type held-back)",
            ),
            core_tasks_up: metric(
                r,
                "director_core_tasks_up",
                "1 while the Director's writer, scheduler and watchers all run",
            ),
            jobdb_writable: metric(
                r,
                "jobdb_writable",
                "1 while the JobDB can be written; 0 while no commit has succeeded for longer \
                 than the writer's bound (not ready)",
            ),
            jobdb_last_commit: metric(
                r,
                "jobdb_last_commit",
                "When the writer's last commit succeeded (Unix seconds)",
            ),
            tasks_stalled: metric(
                r,
                "director_task_stalled",
                "1 while a core task (writer, scheduler, sequencer) has had work without progress \
                 past its bound (not ready)",
            ),
            jobs_cached: metric(r, "jobs_cached", "Unfinished jobs held in memory"),
            in_flight: metric(r, "attempts_in_flight", "Delivery attempts in flight"),
            jobs_spilled: metric(
                r,
                "jobs_spilled",
                "Unfinished jobs whose payload waits in the JobDB, not in memory",
            ),
            attempts_started: metric(
                r,
                "attempts_started",
                "Delivery attempts whose request was started",
            ),
            last_attempt_started: metric(
                r,
                "attempt_last_started_timestamp_seconds",
                "Unix time at which the last delivery attempt started",
            ),
            cached_payload_bytes: metric(
                r,
                "jobs_cached_payload_bytes",
                "Payload and header bytes of cached jobs held in memory",
            ),
            jobs_backlog_loaded: metric(
                r,
                "jobs_backlog_loaded",
                "Jobs read into the cache from the JobDB after waiting there for room",
            ),
            jobs_evicted: metric(
                r,
                "jobs_evicted",
                "Waiting jobs evicted from a full cache until shortly before they are due",
            ),
            operator_commands: metric(
                r,
                "operator_commands_applied",
                "Operator commands (expedite, postpone, flush, discard) applied and recorded",
            ),
            breaker_opened: metric(
                r,
                "endpoint_breaker_opened",
                "Endpoint circuit breakers opened (most recent attempts failed)",
            ),
            breakers_open: metric(
                r,
                "endpoint_breakers_open",
                "Endpoints whose circuit breaker is open (one probe at a time)",
            ),
            queued: metric(
                r,
                "jobs_queued",
                "Cached jobs by what they wait for: endpoint running, breaker open, endpoint or \
                 bucket paused, or a retry",
            ),
            controls: metric(
                r,
                "controls",
                "Endpoint and bucket controls (pauses, caps) this Director has in force",
            ),
            dashboard_jobdbs: metric(
                r,
                "dashboard_jobdbs",
                "JobDBs the dashboard reads, by whether they could be reached",
            ),
            dashboard_requests: metric(
                r,
                "dashboard_api_requests",
                "Dashboard API requests answered",
            ),
            jobs_moved: metric(
                r,
                "jobs_moved",
                "Jobs a drainer moved out of retired JobDBs into live ones",
            ),
            jobdbs_drained: metric(r, "jobdbs_drained", "Retired JobDBs a drainer drained"),
            jobs_import_refused: metric(
                r,
                "jobs_import_refused",
                "Jobs a live Director refused to import for good, ended discarded \
                 (import-refused)",
            ),
            import_refusals: metric(
                r,
                "import_refusals",
                "Refusals of a drainer's import of a job by a live Director, by how they were \
                 taken",
            ),
            jobs_waiting_for_target: metric(
                r,
                "jobs_waiting_for_target",
                "Jobs of a retired JobDB that live Directors refused and that wait for one that \
                 takes them",
            ),
            jobdbs: metric(
                r,
                "jobdbs",
                "JobDBs in the inventory by lifecycle state (manager)",
            ),
            manager_actions: metric(r, "manager_actions", "Manager decisions by kind"),
            manager_active: metric(
                r,
                "manager_active",
                "1 while this manager holds the manager lock",
            ),
            registry,
        }
    }
}

/// A new metric of the field's type, registered as `name` with its help text.
fn metric<M: Metric + Clone + Default>(registry: &mut Registry, name: &str, help: &str) -> M {
    registered(registry, name, help, M::default())
}

/// `metric`, registered as `name` with its help text.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Counts a manager decision.
    pub fn manager_action(&self, action: &str) {
        self.manager_actions
            .get_or_create(&ActionLabels {
                action: action.to_owned(),
            })
            .inc();
    }

    /// Counts a published event and the jobs it made (before they are written: a failed
    /// write is counted by `write_rejected`).
    pub fn events_published(&self, jobs: usize) {
        self.events_published.inc();
        self.event_jobs.inc_by(jobs as u64);
    }

    /// Counts a write request refused alone.
    pub fn write_rejected(&self, op: &'static str, reason: &'static str) {
        self.write_rejections
            .get_or_create(&WriteLabels { op, reason })
            .inc();
    }

    /// Records one committed JobDB transaction.
    pub fn observe_write(&self, rows: usize, took: Duration) {
        self.write_batch_rows.observe(rows as f64);
        self.write_seconds.observe(took.as_secs_f64());
        self.observe_commit();
    }

    /// Records that a commit of the writer succeeded now.
    pub fn observe_commit(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.jobdb_last_commit.set(now.as_secs_f64());
    }

    /// The stall gauge of a watched core task.
    pub fn task_stalled(&self, task: &'static str) -> Gauge {
        self.tasks_stalled
            .get_or_create(&TaskLabels { task })
            .clone()
    }

    /// Records that an attempt's request starts now.
    pub fn observe_start(&self) {
        self.attempts_started.inc();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_attempt_started.set(now.as_secs_f64());
    }

    /// Records one finished attempt.
    pub fn observe_attempt(&self, verdict: &Verdict, took: Duration) {
        let outcome = match verdict {
            Verdict::Succeeded => "succeeded",
            Verdict::Discard { .. } => "discarded",
            Verdict::Retry { .. } => "retried",
        };
        let labels = OutcomeLabels {
            outcome: outcome.to_owned(),
        };
        self.attempts.get_or_create(&labels).inc();
        self.attempt_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// The classic Prometheus text format (0.0.4); see [`to_prometheus_text`].
    pub fn render_prometheus(&self) -> String {
        to_prometheus_text(&self.render())
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The classic Prometheus text format (0.0.4), which every Prometheus and `promtool` read, of an
/// OpenMetrics rendering: counter families named by their `_total` samples, no `# EOF` trailer.
pub fn to_prometheus_text(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}
