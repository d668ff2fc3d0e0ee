//! The JSON answers of the dashboard's API, and how each is folded together from the rows of
//! every JobDB (no I/O here).
//!
//! Every answer that sums over JobDBs lists in `unreachable` those it could not read, so a
//! partial picture says it is one.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::job::{self, State};
use crate::jobdb::stats::{self, JobSummary, LaneAttempts, LaneBacklog, LaneError, LaneSlot};
use crate::registry::inventory::JobDbState;
use crate::rpc::api::JobDescription;

/// Slot widths the charts use, in seconds: the smallest that keeps a window within
/// [`MAX_SLOTS`] slots.
const SLOT_WIDTHS_S: [u32; 11] = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
/// Most slots in a chart: enough to see a shape, few enough for bars a few pixels wide.
const MAX_SLOTS: u32 = 90;
/// The longest window, in minutes (a day).
pub const MAX_MINUTES: u32 = 24 * 60;

/// The windows a default may fit to the data, shortest first; the last is the default of a
/// cluster older than it.
pub const FITTED_MINUTES: [u32; 3] = [5, 15, 30];

/// The default window for data that began at `first` (none yet: the shortest): the shortest
/// of [`FITTED_MINUTES`] that holds it, so a new cluster's chart is not one bar at the edge.
pub fn fitted_minutes(now: DateTime<Utc>, first: Option<DateTime<Utc>>) -> u32 {
    let age = first.map_or(0, |f| (now - f).num_seconds().max(0));
    FITTED_MINUTES
        .into_iter()
        .find(|m| age <= i64::from(*m) * 60)
        .unwrap_or(FITTED_MINUTES[FITTED_MINUTES.len() - 1])
}

/// A time window cut into equal slots: the last `minutes`, rounded out to whole slots so
/// that slot edges stay put from one refresh to the next (the last slot holds now).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The minutes asked for.
    pub minutes: u32,
    /// Width of a slot, in seconds.
    pub slot_s: u32,
    /// How many slots.
    pub slots: usize,
    /// Start of the first slot.
    pub start: DateTime<Utc>,
}

impl Window {
    /// The window of the last `minutes` (1 to [`MAX_MINUTES`]) at `now`.
    pub fn ending_at(now: DateTime<Utc>, minutes: u32) -> Window {
        let minutes = minutes.clamp(1, MAX_MINUTES);
        let span = minutes * 60;
        let slot_s = SLOT_WIDTHS_S
            .into_iter()
            .find(|w| span.div_ceil(*w) <= MAX_SLOTS)
            .unwrap_or(3600);
        let slots = span.div_ceil(slot_s);
        let width = i64::from(slot_s);
        let end = (now.timestamp().div_euclid(width) + 1) * width;
        let start = DateTime::from_timestamp(end - i64::from(slots) * width, 0).unwrap_or(now);
        Window {
            minutes,
            slot_s,
            slots: slots as usize,
            start,
        }
    }

    /// The start of every slot.
    pub fn slot_starts(&self) -> Vec<DateTime<Utc>> {
        (0..self.slots)
            .map(|i| self.start + TimeDelta::seconds(i as i64 * i64::from(self.slot_s)))
            .collect()
    }

    /// The slot index of a row's slot number, if it lies in the window.
    fn index(&self, slot: i64) -> Option<usize> {
        usize::try_from(slot).ok().filter(|i| *i < self.slots)
    }
}

/// A JobDB whose part is missing from an answer, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreachable {
    /// The JobDB.
    pub name: String,
    /// Why it could not be read (the error and its causes).
    pub error: String,
}

/// `GET /api/list`: a page of jobs of the JobDBs that answered ([`crate::rpc::api::JobList`]),
/// and those that did not (their jobs are missing from the page).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobsListed {
    /// The page.
    #[serde(flatten)]
    pub list: crate::rpc::api::JobList,
    /// JobDBs not listed.
    pub unreachable: Vec<Unreachable>,
}

/// `GET /api/overview`: transitions by state over time, and jobs by current state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Overview {
    /// The window asked for, in minutes.
    pub minutes: u32,
    /// Width of each slot, in seconds.
    pub slot_s: u32,
    /// Start of each slot (the last one holds now).
    pub slots: Vec<DateTime<Utc>>,
    /// For every state (in state-machine order): transitions into it per slot, summed over
    /// the JobDBs, and their total.
    pub series: Vec<StateSeries>,
    /// Jobs by their current state, over the JobDBs read.
    pub current: Vec<StateTotal>,
    /// JobDBs read.
    pub jobdbs: usize,
    /// JobDBs that could not be read.
    pub unreachable: Vec<Unreachable>,
}

/// Transitions into one state, per slot.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateSeries {
    /// The state.
    pub state: State,
    /// Transitions in the whole window.
    pub total: u64,
    /// Transitions per slot.
    pub counts: Vec<u64>,
}

/// How many jobs are in one state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateTotal {
    /// The state.
    pub state: State,
    /// How many jobs.
    pub jobs: u64,
}

impl Overview {
    /// Sums each JobDB's transitions per slot (`per_slot`) and current states (`current`).
    pub fn fold(
        window: &Window,
        per_slot: impl IntoIterator<Item = stats::SlotCount>,
        current: impl IntoIterator<Item = HashMap<State, u64>>,
        jobdbs: usize,
        unreachable: Vec<Unreachable>,
    ) -> Overview {
        let mut counts: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for row in per_slot {
            let Some(i) = window.index(row.slot) else {
                continue;
            };
            let state_index = state_index(row.state);
            counts
                .entry(state_index)
                .or_insert_with(|| vec![0; window.slots])[i] += row.count;
        }
        let series = State::ALL
            .iter()
            .enumerate()
            .map(|(k, state)| {
                let counts = counts.remove(&k).unwrap_or_else(|| vec![0; window.slots]);
                StateSeries {
                    state: *state,
                    total: counts.iter().sum(),
                    counts,
                }
            })
            .collect();
        let mut totals = [0u64; State::ALL.len()];
        for map in current {
            for (state, n) in map {
                totals[state_index(state)] += n;
            }
        }
        Overview {
            minutes: window.minutes,
            slot_s: window.slot_s,
            slots: window.slot_starts(),
            series,
            current: State::ALL
                .iter()
                .zip(totals)
                .map(|(state, jobs)| StateTotal {
                    state: *state,
                    jobs,
                })
                .collect(),
            jobdbs,
            unreachable,
        }
    }
}

fn state_index(state: State) -> usize {
    State::ALL.iter().position(|s| *s == state).unwrap_or(0)
}

/// `GET /api/endpoints`: each lane's backlog, outcomes, latency and last error.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Endpoints {
    /// The window asked for, in minutes.
    pub minutes: u32,
    /// Width of each slot of the `activity` series, in seconds.
    pub slot_s: u32,
    /// Start of the window (outcomes and latencies count from here).
    pub since: DateTime<Utc>,
    /// The lanes, most backlog first, then most failures.
    pub endpoints: Vec<EndpointView>,
    /// JobDBs read.
    pub jobdbs: usize,
    /// JobDBs that could not be read.
    pub unreachable: Vec<Unreachable>,
}

/// One lane: an endpoint without query or fragment, as the Director queues its jobs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EndpointView {
    /// The lane.
    pub endpoint: String,
    /// Jobs waiting now: awaiting scheduling, awaiting a retry or executing.
    pub backlog: u64,
    /// Of the backlog: jobs not attempted yet.
    pub awaiting_scheduling: u64,
    /// Of the backlog: jobs waiting for a retry.
    pub awaiting_retry: u64,
    /// Of the backlog: jobs waiting for a first attempt at a later time (scheduled).
    pub scheduled: u64,
    /// Of the backlog: attempts in flight.
    pub executing: u64,
    /// Attempts that succeeded in the window.
    pub succeeded: u64,
    /// Attempts that failed and will be retried, in the window.
    pub retried: u64,
    /// Attempts that failed for good (the job discarded), in the window.
    pub discarded: u64,
    /// `retried + discarded`.
    pub failed: u64,
    /// `succeeded / (succeeded + failed)`; absent without attempts.
    pub success_rate: Option<f64>,
    /// Median attempt duration in the window, in ms (exact below 64 ms, else within 2.2%).
    pub p50_ms: Option<f64>,
    /// 95th percentile attempt duration in the window, in ms.
    pub p95_ms: Option<f64>,
    /// The most recent failure in the window.
    pub last_error: Option<LastError>,
    /// Attempts per slot of the window: succeeded and failed.
    pub activity: Activity,
}

/// Attempts of a lane per slot.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Activity {
    /// Successful attempts per slot.
    pub succeeded: Vec<u64>,
    /// Failed attempts per slot.
    pub failed: Vec<u64>,
}

/// A lane's most recent failure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LastError {
    /// Its kind as stored (`server-error`, `client-error`, `request-timeout`, `connect`, ...: an
    /// [`crate::job::ErrorType`] for rows spindle wrote).
    pub error_type: String,
    /// The HTTP status, when the endpoint answered.
    pub response_status: Option<u16>,
    /// When it happened.
    pub at: DateTime<Utc>,
}

/// What one JobDB contributes to [`Endpoints`].
#[derive(Clone, Debug, Default)]
pub struct LaneRows {
    /// Its backlog rows.
    pub backlog: Vec<LaneBacklog>,
    /// Its attempt rows.
    pub attempts: Vec<LaneAttempts>,
    /// Its attempts per slot.
    pub slots: Vec<LaneSlot>,
    /// Its failure kinds.
    pub errors: Vec<LaneError>,
}

impl Endpoints {
    /// Folds every JobDB's lane rows into one view per lane.
    pub fn fold(
        window: &Window,
        rows: impl IntoIterator<Item = LaneRows>,
        jobdbs: usize,
        unreachable: Vec<Unreachable>,
    ) -> Endpoints {
        let mut lanes: BTreeMap<String, EndpointView> = BTreeMap::new();
        let mut latencies: HashMap<String, BTreeMap<i64, u64>> = HashMap::new();
        for jobdb in rows {
            for row in jobdb.backlog {
                let view = lane_view(&mut lanes, &row.lane, window.slots);
                match row.state {
                    State::AwaitingScheduling => view.awaiting_scheduling += row.jobs,
                    State::AwaitingRetry if row.scheduled => view.scheduled += row.jobs,
                    State::AwaitingRetry => view.awaiting_retry += row.jobs,
                    _ => view.executing += row.jobs,
                }
                view.backlog += row.jobs;
            }
            for row in jobdb.attempts {
                let view = lane_view(&mut lanes, &row.lane, window.slots);
                match row.state {
                    State::Succeeded => view.succeeded += row.attempts,
                    State::Discarded => view.discarded += row.attempts,
                    _ => view.retried += row.attempts,
                }
                *latencies
                    .entry(view.endpoint.clone())
                    .or_default()
                    .entry(row.latency_key)
                    .or_default() += row.attempts;
            }
            for row in jobdb.slots {
                let view = lane_view(&mut lanes, &row.lane, window.slots);
                if let Some(i) = window.index(row.slot) {
                    view.activity.succeeded[i] += row.succeeded;
                    view.activity.failed[i] += row.failed;
                }
            }
            for row in jobdb.errors {
                let view = lane_view(&mut lanes, &row.lane, window.slots);
                if view.last_error.as_ref().is_none_or(|e| e.at < row.last_at) {
                    view.last_error = Some(LastError {
                        error_type: row.error_type,
                        response_status: row.response_status,
                        at: row.last_at,
                    });
                }
            }
        }
        let mut endpoints: Vec<EndpointView> = lanes
            .into_values()
            .map(|mut view| {
                view.failed = view.retried + view.discarded;
                let attempts = view.succeeded + view.failed;
                view.success_rate = (attempts > 0).then(|| view.succeeded as f64 / attempts as f64);
                if let Some(histogram) = latencies.get(&view.endpoint) {
                    view.p50_ms = percentile(histogram, 0.50);
                    view.p95_ms = percentile(histogram, 0.95);
                }
                view
            })
            .collect();
        endpoints.sort_by(|a, b| {
            b.backlog
                .cmp(&a.backlog)
                .then(b.failed.cmp(&a.failed))
                .then(a.endpoint.cmp(&b.endpoint))
        });
        Endpoints {
            minutes: window.minutes,
            slot_s: window.slot_s,
            since: window.start,
            endpoints,
            jobdbs,
            unreachable,
        }
    }
}

/// The view of `lane` in `lanes`, made empty (with `slots` zeros of activity) on first use.
/// The SQL already cut the query off; cutting again changes nothing there, and keeps the fold
/// right for rows that come with a query still on.
fn lane_view<'a>(
    lanes: &'a mut BTreeMap<String, EndpointView>,
    lane: &str,
    slots: usize,
) -> &'a mut EndpointView {
    let key = job::lane(lane);
    lanes.entry(key.to_owned()).or_insert_with(|| EndpointView {
        endpoint: key.to_owned(),
        activity: Activity {
            succeeded: vec![0; slots],
            failed: vec![0; slots],
        },
        ..EndpointView::default()
    })
}

/// The nearest-rank percentile `p` (0 to 1) of a latency histogram (bucket → count), in ms.
pub fn percentile(histogram: &BTreeMap<i64, u64>, p: f64) -> Option<f64> {
    let total: u64 = histogram.values().sum();
    if total == 0 {
        return None;
    }
    let rank = ((p * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (key, n) in histogram {
        seen += n;
        if seen >= rank {
            return Some((stats::latency_ms(*key) * 10.0).round() / 10.0);
        }
    }
    None
}

/// `GET /api/attempts`: succeeded jobs by the attempts they took.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Attempts {
    /// One bar per attempt count from 1 to the highest seen (zeros included).
    pub succeeded: Vec<AttemptsBar>,
    /// Succeeded jobs in all.
    pub total: u64,
    /// JobDBs read.
    pub jobdbs: usize,
    /// JobDBs that could not be read.
    pub unreachable: Vec<Unreachable>,
}

/// Succeeded jobs that took a given number of attempts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AttemptsBar {
    /// Attempts the job took (1: first time).
    pub attempts: u16,
    /// How many jobs.
    pub jobs: u64,
}

impl Attempts {
    /// Sums every JobDB's (attempts, jobs) rows into dense bars.
    pub fn fold(
        rows: impl IntoIterator<Item = (u16, u64)>,
        jobdbs: usize,
        unreachable: Vec<Unreachable>,
    ) -> Attempts {
        let mut by_attempts: BTreeMap<u16, u64> = BTreeMap::new();
        for (attempts, jobs) in rows {
            *by_attempts.entry(attempts).or_default() += jobs;
        }
        let highest = by_attempts.keys().next_back().copied().unwrap_or(0);
        Attempts {
            succeeded: (1..=highest)
                .map(|attempts| AttemptsBar {
                    attempts,
                    jobs: by_attempts.get(&attempts).copied().unwrap_or(0),
                })
                .collect(),
            total: by_attempts.values().sum(),
            jobdbs,
            unreachable,
        }
    }
}

/// `GET /api/subscriptions`: the control database's subscriptions, each with its jobs not
/// yet finished over the JobDBs read.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SubscriptionsView {
    /// Whether the dashboard has a control database (`--control-db`).
    pub configured: bool,
    /// Every subscription, by id.
    pub subscriptions: Vec<SubscriptionRow>,
    /// JobDBs whose waiting jobs are not counted.
    pub unreachable: Vec<Unreachable>,
}

/// One subscription and its waiting jobs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SubscriptionRow {
    /// The subscription (no secret).
    #[serde(flatten)]
    pub subscription: spindle_client::SubscriptionView,
    /// Its jobs not finished yet (waiting, retrying, under way; parked while it is disabled).
    pub waiting: u64,
}

/// `GET /api/jobdbs`: the inventory as the dashboard sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobDbs {
    /// `consul` when JobDBs come from the inventory too, else `static` (`--jobdb` only).
    pub discovery: String,
    /// Why the inventory could not be read last time, if it could not.
    pub registry_error: Option<String>,
    /// Every JobDB, by name.
    pub jobdbs: Vec<JobDbView>,
}

/// One JobDB.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct JobDbView {
    /// Database name.
    pub name: String,
    /// URL (password replaced by `***`).
    pub url: String,
    /// Lifecycle state in the inventory (absent for a `--jobdb` the inventory does not know).
    pub state: Option<JobDbState>,
    /// When the inventory state last changed.
    pub state_since: Option<DateTime<Utc>>,
    /// Who changed it.
    pub state_changed_by: Option<String>,
    /// Who holds its lock in Consul (a Director's or drainer's id).
    pub lock_holder: Option<String>,
    /// Whether its queries answer.
    pub reachable: bool,
    /// Why not.
    pub error: Option<String>,
    /// When it was created (its first migration).
    pub created_at: Option<DateTime<Utc>>,
    /// Seconds since it was created.
    pub age_s: Option<i64>,
    /// Rows of its tables (InnoDB's estimate).
    pub rows: Option<u64>,
    /// Data and index bytes of its tables.
    pub bytes: Option<u64>,
    /// The `jobdb_owner` row: its holder.
    pub owner: Option<String>,
    /// The `jobdb_owner` row: the holder's fencing token.
    pub fencing_token: Option<u64>,
    /// The `jobdb_owner` row: when the holder took it.
    pub owner_since: Option<DateTime<Utc>>,
    /// Ordered jobs waiting for their turn (held behind an earlier job of their key).
    pub ordered_waiting: Option<u64>,
    /// Ordered keys stopped by a failed job that asked to block (`ordering_blocked`).
    pub ordering_blocked: Option<u64>,
    /// Of `ordered_waiting`, jobs whose key waits for a job scheduled for later (it holds
    /// the key until its time).
    pub ordered_behind_scheduled: Option<u64>,
    /// Completion notices owed: jobs naming an `on_complete` URL that have not ended here.
    pub notices_owed: Option<u64>,
}

/// `GET /api/jobs/{id}` and `GET /api/jobs?idempotency_key=`: every JobDB's trace of the
/// job(s) found.
#[derive(Debug, Serialize, Deserialize)]
pub struct Traces {
    /// What was looked for: `id` or `idempotency_key`.
    pub by: String,
    /// The id or key.
    pub value: String,
    /// Each job found, in each JobDB holding it (a moved job is in two), oldest first.
    pub traces: Vec<JobTrace>,
    /// JobDBs searched.
    pub jobdbs: usize,
    /// JobDBs that could not be searched.
    pub unreachable: Vec<Unreachable>,
}

/// A job in one JobDB: what it is and its full history there (the same description as the
/// Director's `GET /v1/jobs/{id}`), without payload or headers.
#[derive(Debug, Serialize, Deserialize)]
pub struct JobTrace {
    /// The JobDB holding this part of its history.
    pub jobdb: String,
    /// The job, its state in this JobDB now and its transitions here (oldest first).
    #[serde(flatten)]
    pub job: JobDescription,
    /// Size of the payload, in bytes (the payload itself is not shown).
    pub payload_bytes: u64,
}

impl JobTrace {
    /// The trace of `summary` in `jobdb` with its transitions (oldest first).
    pub fn new(
        jobdb: &str,
        summary: &JobSummary,
        transitions: &[(u64, crate::job::Transition)],
    ) -> JobTrace {
        JobTrace {
            jobdb: jobdb.to_owned(),
            job: crate::rpc::api::describe(&summary.job, transitions),
            payload_bytes: summary.payload_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dashboard's trace and the Director's `GET /v1/jobs/{id}` describe a job alike: the
    /// same fields (the trace leaves out headers and payload, and adds its JobDB and the
    /// payload's size), ordered key and notice URL included.
    #[test]
    fn a_trace_describes_a_job_as_the_directors_view_does() {
        use std::sync::Arc;
        let created = Utc::now();
        let job = crate::job::Job {
            id: crate::job::JobId(ulid::Ulid::new()),
            bucket: "t1".into(),
            endpoint: "https://example.test/hook".into(),
            method: "POST".into(),
            headers: vec![("x-a".into(), "b".into())],
            payload: bytes::Bytes::from_static(b"{}"),
            execution_timeout: std::time::Duration::from_secs(2),
            retry: crate::job::RetryPolicy {
                min_delay: std::time::Duration::from_millis(250),
                coefficient: 2.0,
            },
            created_at: created,
            expire_at: created + TimeDelta::hours(1),
            idempotency_key: Some("k".into()),
            on_complete: Some(Arc::from("https://example.test/done")),
            ordering: Some(crate::job::OrderedKey {
                key: "customer-7".into(),
                blocks: true,
                position: ulid::Ulid::new(),
            }),
            event: None,
            trace: None,
        };
        let summary = JobSummary {
            job: job.clone(),
            payload_bytes: 2,
        };
        let trace = serde_json::to_value(JobTrace::new("db1", &summary, &[])).unwrap();
        let view = serde_json::to_value(crate::rpc::api::job_view(&job, &[])).unwrap();
        assert_eq!(trace["ordering_key"], "customer-7");
        assert_eq!(trace["ordering_failure"], "block");
        assert_eq!(trace["on_complete"], "https://example.test/done");
        let keys = |v: &serde_json::Value| -> std::collections::BTreeSet<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        let mut expected = keys(&view);
        expected.remove("headers");
        expected.remove("payload_base64");
        expected.insert("jobdb".into());
        expected.insert("payload_bytes".into());
        assert_eq!(keys(&trace), expected);
    }

    #[test]
    fn windows_round_out_to_whole_slots_that_hold_now() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T12:00:07Z")
            .unwrap()
            .with_timezone(&Utc);
        let w = Window::ending_at(now, 30);
        assert_eq!((w.slot_s, w.slots), (30, 60));
        assert_eq!(w.start.to_rfc3339(), "2026-01-01T11:30:30+00:00");
        let last = *w.slot_starts().last().unwrap();
        assert!(last <= now && now < last + TimeDelta::seconds(30));
        assert_eq!(Window::ending_at(now, 5).slot_s, 5);
        assert_eq!(Window::ending_at(now, 15).slot_s, 10);
        assert_eq!(Window::ending_at(now, 24 * 60).slots, 48);
        let ago = |m: i64| Some(now - TimeDelta::minutes(m));
        assert_eq!(fitted_minutes(now, None), 5, "no data yet");
        assert_eq!(fitted_minutes(now, ago(4)), 5);
        assert_eq!(fitted_minutes(now, ago(6)), 15);
        assert_eq!(fitted_minutes(now, ago(29)), 30);
        assert_eq!(
            fitted_minutes(now, ago(600)),
            30,
            "an older cluster keeps 30"
        );
        assert!(Window::ending_at(now, 0).slots >= 1);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let mut h = BTreeMap::new();
        for ms in 1..=100u32 {
            *h.entry(stats::latency_key(ms)).or_insert(0) += 1;
        }
        assert_eq!(percentile(&h, 0.5), Some(50.0));
        let p95 = percentile(&h, 0.95).unwrap();
        assert!((93.0..=97.0).contains(&p95), "{p95}");
        assert_eq!(percentile(&BTreeMap::new(), 0.5), None);
    }

    #[test]
    fn attempts_bars_are_dense() {
        let a = Attempts::fold([(1, 5), (3, 2), (1, 1)], 2, vec![]);
        let bars: Vec<(u16, u64)> = a.succeeded.iter().map(|b| (b.attempts, b.jobs)).collect();
        assert_eq!(bars, vec![(1, 6), (2, 0), (3, 2)]);
        assert_eq!(a.total, 8);
    }
}
