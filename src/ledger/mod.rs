//! The conservation ledger: proof, from a JobDB's own rows, that no accepted job was lost.
//!
//! For each JobDB, at one moment (one snapshot, [`crate::jobdb::JobDb::ledger_round`]):
//!
//! ```text
//! accepted = succeeded + discarded + archived + moved + open
//! ```
//!
//! where *accepted* counts `jobs` rows, each ended state counts the jobs that have that row,
//! and *open* is the open work (`open_jobs` entries and `jobs_fresh`: what a new owner, a
//! drainer and an operator read as unfinished).
//! Every difference is named by job: one **vanished** (neither ended nor open), one **ended
//! twice**, one both **ended and open**, one **open twice**, rows **without a job**. The
//! ledger also names what is alive but wrong: two attempts of one job that **overlap** (one
//! began before the other ended, within one owner's tenure), an attempt that **overran** its
//! execution timeout by more than a margin, an open job **overdue** (past its expiry by more
//! than the margin: an expiry ends a job whatever gates its lane), and open jobs in a JobDB
//! that **no owner** holds.
//!
//! The first kinds are *losses*: they never happen in a healthy JobDB at any moment, kill -9
//! and outages included. The last two are *stalls*: they happen for a while after a crash,
//! until a new owner takes the JobDB over, so an alert on them waits (`for:` in the rules
//! file) where one on a loss does not. `spindle audit` prints this per JobDB and for the
//! cluster, and with `--every-secs` serves it as metrics (`prometheus/spindle-alerts.yml`).
//!
//! A [`Tracker`] keeps one JobDB's ledger from round to round: its first round reads the whole
//! JobDB, later ones what is new since and what is open ([`crate::jobdb::ledger`] says what
//! each round reads). [`Ledger::of`] turns what it knows into the ledger, with no I/O.

pub mod metrics;
mod tracker;

pub use tracker::{Tracker, LIST_OPEN_EVERY};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::job::JobId;

/// What kind of wrong a finding names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Accepted, with no row that ends it and not in the open work.
    Vanished,
    /// More than one row ends it.
    EndedTwice,
    /// Ended, and still in the open work.
    EndedAndOpen,
    /// Listed twice as open (two `commit_log` rows accepted it).
    OpenTwice,
    /// Transitions or an `open_jobs` entry with no `jobs` row.
    WithoutJob,
    /// The counts differ by more than the named jobs explain (a finding list was cut at its
    /// limit).
    Unbalanced,
    /// An attempt began before an earlier attempt of the same job ended.
    Overlap,
    /// An attempt under way past its execution timeout plus the margin.
    Overrun,
    /// An open job past its expiry plus the margin (an expiry ends a job whatever gates its
    /// lane: one still open is stuck).
    Overdue,
    /// Open jobs in a JobDB whose lock nobody holds.
    Unowned,
    /// The JobDB could not be read.
    Unreachable,
}

impl Kind {
    /// Every kind, for metrics that show a zero for each.
    pub const ALL: [Kind; 11] = [
        Kind::Vanished,
        Kind::EndedTwice,
        Kind::EndedAndOpen,
        Kind::OpenTwice,
        Kind::WithoutJob,
        Kind::Unbalanced,
        Kind::Overlap,
        Kind::Overrun,
        Kind::Overdue,
        Kind::Unowned,
        Kind::Unreachable,
    ];

    /// Its name in reports and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Vanished => "vanished",
            Kind::EndedTwice => "ended-twice",
            Kind::EndedAndOpen => "ended-and-open",
            Kind::OpenTwice => "open-twice",
            Kind::WithoutJob => "without-job",
            Kind::Unbalanced => "unbalanced",
            Kind::Overlap => "overlap",
            Kind::Overrun => "overrun",
            Kind::Overdue => "overdue",
            Kind::Unowned => "unowned",
            Kind::Unreachable => "unreachable",
        }
    }

    /// Its class: `loss` or `stall` ([`Kind::is_loss`]), as metric labels name it.
    pub fn class(self) -> &'static str {
        if self.is_loss() {
            "loss"
        } else {
            "stall"
        }
    }

    /// Whether it is a loss (wrong at every moment) rather than a stall (wrong when it lasts).
    pub fn is_loss(self) -> bool {
        !matches!(
            self,
            Kind::Overrun | Kind::Overdue | Kind::Unowned | Kind::Unreachable
        )
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing the ledger found wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What is wrong.
    pub kind: Kind,
    /// The job, when it is about one.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "job_text")]
    pub job: Option<JobId>,
    /// Since when: the job's acceptance, or the attempt's start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// The rest, in words.
    pub detail: String,
}

fn job_text<S: serde::Serializer>(job: &Option<JobId>, s: S) -> Result<S::Ok, S::Error> {
    match job {
        Some(id) => s.collect_str(id),
        None => s.serialize_none(),
    }
}

/// One JobDB's ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Ledger {
    /// The JobDB's name.
    pub jobdb: String,
    /// Jobs accepted.
    pub accepted: u64,
    /// Jobs that ended `succeeded`.
    pub succeeded: u64,
    /// Jobs that ended `discarded`.
    pub discarded: u64,
    /// Jobs that ended `archived`.
    pub archived: u64,
    /// Jobs moved to another JobDB (they go on there).
    pub moved: u64,
    /// Jobs open: waiting, or with an attempt under way.
    pub open: u64,
    /// What is wrong, losses first.
    pub findings: Vec<Finding>,
}

/// What a JobDB's ledger is made of at one moment: its counts, and the rows that explain them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// Jobs accepted.
    pub accepted: u64,
    /// Jobs ended, by the state that ended them (succeeded, discarded, archived, moved).
    pub ended: Ends,
    /// Jobs with no row that ends them, with when they were made: the open ones, and any
    /// that vanished.
    pub not_ended: HashMap<JobId, DateTime<Utc>>,
    /// the open work's jobs (a job listed twice appears twice).
    pub open: Vec<JobId>,
    /// Jobs ended more than once, with how many times.
    pub ended_twice: Vec<(JobId, u64)>,
    /// Jobs with transitions and no `jobs` row.
    pub without_job: Vec<JobId>,
    /// Attempts under way, with when each began.
    pub under_way: Vec<(JobId, DateTime<Utc>)>,
    /// Attempts that began before an earlier attempt of their job ended, with when.
    pub overlaps: Vec<(JobId, DateTime<Utc>)>,
    /// Open jobs past their expiry plus the margin, with their expiry.
    pub overdue: Vec<(JobId, DateTime<Utc>)>,
}

/// Jobs ended, by the state that ended them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ends {
    /// `succeeded`.
    pub succeeded: u64,
    /// `discarded`.
    pub discarded: u64,
    /// `archived`.
    pub archived: u64,
    /// `moved` (to another JobDB).
    pub moved: u64,
}

impl Ends {
    /// Counts `n` jobs ended in `state` (a state that ends nothing counts as moved: the reads
    /// only return the four).
    pub fn add(&mut self, state: crate::job::State, n: u64) {
        use crate::job::State;
        let slot = match state {
            State::Succeeded => &mut self.succeeded,
            State::Discarded => &mut self.discarded,
            State::Archived => &mut self.archived,
            _ => &mut self.moved,
        };
        *slot = slot.saturating_add(n);
    }

    /// All of them.
    pub fn total(&self) -> u64 {
        self.succeeded + self.discarded + self.archived + self.moved
    }
}

/// What the ledger needs besides the rows: the time, and what the inventory says.
#[derive(Clone, Debug)]
pub struct Context {
    /// Now.
    pub now: DateTime<Utc>,
    /// How long past its execution timeout an attempt may run before it is an overrun.
    pub margin: Duration,
    /// Each attempt's execution timeout, by job (the jobs of the attempts under way).
    pub timeouts: HashMap<JobId, Duration>,
    /// Whether someone holds the JobDB's lock, when the inventory is known.
    pub owned: Option<bool>,
}

impl Ledger {
    /// The ledger of `jobdb` from what was read of it.
    pub fn of(jobdb: &str, read: &Counted, cx: &Context) -> Ledger {
        let mut l = Ledger {
            jobdb: jobdb.to_owned(),
            accepted: read.accepted,
            succeeded: read.ended.succeeded,
            discarded: read.ended.discarded,
            archived: read.ended.archived,
            moved: read.ended.moved,
            ..Ledger::default()
        };
        let not_ended = &read.not_ended;
        let mut open = HashSet::new();
        for id in &read.open {
            if !open.insert(*id) {
                l.push(
                    Kind::OpenTwice,
                    Some(*id),
                    None,
                    "listed twice as open (accepted by two commits?)",
                );
            }
        }
        l.open = open.len() as u64;
        let without_job: HashSet<JobId> = read.without_job.iter().copied().collect();
        let mut vanished: Vec<(JobId, DateTime<Utc>)> = not_ended
            .iter()
            .filter(|(id, _)| !open.contains(id))
            .map(|(id, t)| (*id, *t))
            .collect();
        vanished.sort();
        for (id, since) in vanished {
            l.push(
                Kind::Vanished,
                Some(id),
                Some(since),
                "neither ended nor open",
            );
        }
        let mut ended_open: Vec<JobId> = open
            .iter()
            .filter(|id| !not_ended.contains_key(id) && !without_job.contains(id))
            .copied()
            .collect();
        ended_open.sort();
        for id in ended_open {
            l.push(
                Kind::EndedAndOpen,
                Some(id),
                None,
                "a row ended it; it is listed as open",
            );
        }
        for (id, n) in &read.ended_twice {
            l.push(
                Kind::EndedTwice,
                Some(*id),
                None,
                &format!("{n} rows end it"),
            );
        }
        for id in &read.without_job {
            l.push(Kind::WithoutJob, Some(*id), None, "rows of it, no jobs row");
        }
        for (id, at) in &read.overlaps {
            let detail = "an attempt began before an earlier one ended";
            l.push(Kind::Overlap, Some(*id), Some(*at), detail);
        }
        let explained = l
            .findings
            .iter()
            .filter(|f| f.kind == Kind::Vanished)
            .count() as u64;
        let ended = l.succeeded + l.discarded + l.archived + l.moved;
        let expected = ended.saturating_add(l.open).saturating_add(explained);
        let named_extra = l.findings.iter().any(|f| f.kind.is_loss());
        if l.accepted != expected && !named_extra {
            let detail = format!(
                "accepted {} but ended {ended} + open {} + vanished {explained}",
                l.accepted, l.open
            );
            l.push(Kind::Unbalanced, None, None, &detail);
        }
        for (id, started) in &read.under_way {
            let timeout = cx.timeouts.get(id).copied().unwrap_or(Duration::zero());
            // A timeout too long to add (from a row written by hand) is never overrun.
            let late = started
                .checked_add_signed(timeout)
                .and_then(|t| t.checked_add_signed(cx.margin));
            if late.is_some_and(|late| late < cx.now) {
                let over = (cx.now - *started - timeout).num_seconds();
                let detail = format!("under way {over} s past its execution timeout");
                l.push(Kind::Overrun, Some(*id), Some(*started), &detail);
            }
        }
        for (id, expiry) in &read.overdue {
            let late = (cx.now - *expiry).num_seconds();
            let detail = format!("open {late} s past its expiry");
            l.push(Kind::Overdue, Some(*id), Some(*expiry), &detail);
        }
        if cx.owned == Some(false) && l.open > 0 {
            let detail = format!("{} open jobs and no owner holds the JobDB", l.open);
            l.push(Kind::Unowned, None, None, &detail);
        }
        l
    }

    /// The ledger of a JobDB that could not be read.
    pub fn unreachable(jobdb: &str, why: &str) -> Ledger {
        let mut l = Ledger {
            jobdb: jobdb.to_owned(),
            ..Ledger::default()
        };
        l.push(Kind::Unreachable, None, None, why);
        l
    }

    fn push(&mut self, kind: Kind, job: Option<JobId>, since: Option<DateTime<Utc>>, d: &str) {
        self.findings.push(Finding {
            kind,
            job,
            since,
            detail: d.to_owned(),
        });
    }

    /// Its parts by name, as metrics and reports name them.
    pub fn parts(&self) -> [(&'static str, u64); 6] {
        [
            ("accepted", self.accepted),
            ("succeeded", self.succeeded),
            ("discarded", self.discarded),
            ("archived", self.archived),
            ("moved", self.moved),
            ("open", self.open),
        ]
    }

    /// Jobs ended here.
    pub fn ended(&self) -> u64 {
        self.succeeded + self.discarded + self.archived + self.moved
    }

    /// Whether nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// How many findings of each kind (every kind, zeros included).
    pub fn counts(&self) -> BTreeMap<Kind, u64> {
        let mut out: BTreeMap<Kind, u64> = Kind::ALL.iter().map(|k| (*k, 0)).collect();
        for f in &self.findings {
            *out.entry(f.kind).or_default() += 1;
        }
        out
    }

    /// The sum of several JobDBs' counts, named `cluster`, without their findings.
    pub fn total(ledgers: &[Ledger]) -> Ledger {
        let mut t = Ledger {
            jobdb: "cluster".into(),
            ..Ledger::default()
        };
        for l in ledgers {
            t.accepted += l.accepted;
            t.succeeded += l.succeeded;
            t.discarded += l.discarded;
            t.archived += l.archived;
            t.moved += l.moved;
            t.open += l.open;
        }
        t
    }
}

/// How long past its execution timeout an attempt may run, and past its expiry a job may stay
/// open, before it is named, by default (`spindle audit --margin-secs`, the dashboard's panel).
pub const MARGIN_SECS: u32 = 60;

/// At most this many rows of each kind that should not exist are read and named.
pub const LIMIT: u32 = 100;

impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.is_clean() {
            "ok".to_owned()
        } else {
            format!("{} findings", self.findings.len())
        };
        writeln!(
            f,
            "{}: accepted {} = succeeded {} + discarded {} + archived {} + moved {} + open {}: {verdict}",
            self.jobdb, self.accepted, self.succeeded, self.discarded, self.archived, self.moved,
            self.open
        )?;
        for x in &self.findings {
            write!(f, "  {}", x.kind)?;
            if let Some(job) = x.job {
                write!(f, " {job}")?;
            }
            if let Some(since) = x.since {
                write!(f, " since {}", since.to_rfc3339())?;
            }
            writeln!(f, ": {}", x.detail)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> JobId {
        JobId::from_bytes([n; 16])
    }

    fn cx() -> Context {
        Context {
            now: Utc::now(),
            margin: Duration::seconds(60),
            timeouts: HashMap::new(),
            owned: Some(true),
        }
    }

    fn healthy() -> Counted {
        let t = Utc::now();
        Counted {
            accepted: 5,
            ended: Ends {
                succeeded: 2,
                discarded: 1,
                ..Ends::default()
            },
            not_ended: [(id(1), t), (id(2), t)].into_iter().collect(),
            open: vec![id(1), id(2)],
            ..Counted::default()
        }
    }

    #[test]
    fn every_kind_is_spelled_alike_in_reports_labels_and_json() {
        for kind in Kind::ALL {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.as_str());
            assert_eq!(serde_json::from_value::<Kind>(json).unwrap(), kind);
        }
    }

    #[test]
    fn a_healthy_jobdb_balances_with_nothing_named() {
        let l = Ledger::of("a", &healthy(), &cx());
        assert!(l.is_clean(), "{l}");
        assert_eq!((l.accepted, l.ended(), l.open), (5, 3, 2));
    }

    #[test]
    fn a_job_neither_ended_nor_open_is_named_with_its_age() {
        let mut read = healthy();
        read.open.pop();
        let l = Ledger::of("a", &read, &cx());
        assert_eq!(l.findings.len(), 1, "{l}");
        assert_eq!(l.findings[0].kind, Kind::Vanished);
        assert_eq!(l.findings[0].job, Some(id(2)));
        assert!(l.findings[0].since.is_some());
    }

    #[test]
    fn a_count_off_with_nobody_named_is_unbalanced() {
        let mut read = healthy();
        read.accepted = 6;
        let l = Ledger::of("a", &read, &cx());
        assert_eq!(l.counts()[&Kind::Unbalanced], 1, "{l}");
    }

    #[test]
    fn open_and_ended_jobs_and_repeats_are_named() {
        let mut read = healthy();
        read.open.push(id(3));
        read.open.push(id(1));
        read.ended_twice.push((id(4), 2));
        let l = Ledger::of("a", &read, &cx());
        let counts = l.counts();
        assert_eq!(counts[&Kind::EndedAndOpen], 1, "{l}");
        assert_eq!(counts[&Kind::OpenTwice], 1, "{l}");
        assert_eq!(counts[&Kind::EndedTwice], 1, "{l}");
        assert_eq!(counts[&Kind::Unbalanced], 0, "{l}");
    }

    #[test]
    fn an_attempt_is_an_overrun_only_past_timeout_and_margin() {
        let mut read = healthy();
        let mut c = cx();
        c.timeouts.insert(id(1), Duration::seconds(30));
        read.under_way = vec![(id(1), c.now - Duration::seconds(80))];
        assert!(Ledger::of("a", &read, &c).is_clean());
        read.under_way = vec![(id(1), c.now - Duration::seconds(100))];
        let l = Ledger::of("a", &read, &c);
        assert_eq!(l.counts()[&Kind::Overrun], 1, "{l}");
        c.timeouts.insert(id(1), Duration::MAX);
        assert!(Ledger::of("a", &read, &c).is_clean());
        assert!(!Kind::Overrun.is_loss());
    }

    #[test]
    fn open_jobs_without_an_owner_are_a_stall() {
        let mut c = cx();
        c.owned = Some(false);
        let l = Ledger::of("a", &healthy(), &c);
        assert_eq!(l.counts()[&Kind::Unowned], 1, "{l}");
        c.owned = None;
        assert!(Ledger::of("a", &healthy(), &c).is_clean());
    }
}
