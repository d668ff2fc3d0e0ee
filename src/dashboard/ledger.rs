//! The ledger of every JobDB of a fleet ([`Rounds`]): what `spindle audit` prints and serves,
//! and the dashboard's Ledger panel (`/api/ledger`, a round at most every `--ledger-every-secs`,
//! kept between requests).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::fleet::Fleet;
use crate::ledger::{Ledger, Tracker};
use crate::registry::inventory::JobDbState;

/// The longest one JobDB's round may take before it is given up (and named unreachable).
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

/// Each JobDB's tracker, from round to round.
pub struct Rounds {
    trackers: HashMap<String, Tracker>,
    list_open_every: u64,
}

impl Default for Rounds {
    fn default() -> Self {
        Rounds::listing_open_every(crate::ledger::LIST_OPEN_EVERY)
    }
}

impl Rounds {
    /// Rounds whose trackers list the open work whole every `rounds` rounds (1: each round).
    pub fn listing_open_every(rounds: u64) -> Self {
        Rounds {
            trackers: HashMap::new(),
            list_open_every: rounds.max(1),
        }
    }

    /// One round over every JobDB of `fleet` that holds jobs (not `spare`, not `dropped`), one
    /// after another; a JobDB gone from the fleet takes its tracker with it, and an unreadable
    /// inventory is a ledger of its own (`registry`, unreachable).
    pub async fn round(&mut self, fleet: &Fleet, margin: chrono::Duration) -> Vec<Ledger> {
        fleet.refresh().await;
        let members = fleet.members();
        self.trackers
            .retain(|name, _| members.iter().any(|m| m.name == *name));
        let mut ledgers = Vec::new();
        for m in members {
            let owned = match &m.inventory {
                Some(i) if matches!(i.state, JobDbState::Spare | JobDbState::Dropped) => continue,
                // Drained: every job ended; its lock is nobody's business any more.
                Some(i) if i.state == JobDbState::Drained => None,
                Some(i) => Some(i.lock_holder.is_some()),
                None => None,
            };
            ledgers.push(match &m.db {
                Some(db) => {
                    let tracker = self.trackers.entry(m.name.clone()).or_insert_with(|| {
                        Tracker::new(&m.name).listing_open_every(self.list_open_every)
                    });
                    // A round that cannot finish leaves its tracker as it was.
                    match tokio::time::timeout(ROUND_TIMEOUT, tracker.round(db, owned, margin))
                        .await
                    {
                        Ok(ledger) => ledger,
                        Err(_) => Ledger::unreachable(&m.name, "its round took longer than 60 s"),
                    }
                }
                None => Ledger::unreachable(&m.name, m.error.as_deref().unwrap_or("not opened")),
            });
        }
        if let Some(e) = fleet.registry_error() {
            ledgers.push(Ledger::unreachable("registry", &e));
        }
        ledgers
    }
}

/// The dashboard's ledger: the trackers and the last round.
pub(super) struct Panel {
    rounds: Rounds,
    last: Option<(Instant, LedgerView)>,
    every: Duration,
}

impl Panel {
    /// A panel that runs a round at most every `every`.
    pub(super) fn new(every: Duration) -> Panel {
        Panel {
            rounds: Rounds::default(),
            last: None,
            every,
        }
    }
}

/// `/api/ledger`: each JobDB's ledger at the last round, and their sum.
#[derive(Clone, Debug, Serialize)]
pub struct LedgerView {
    /// When the round finished.
    pub at: DateTime<Utc>,
    /// How long it took, in ms.
    pub took_ms: u64,
    /// Each JobDB's.
    pub jobdbs: Vec<Ledger>,
    /// Their sum (findings left out).
    pub total: Ledger,
}

/// `GET /api/ledger`: the last round's ledgers, after a new round when the last is older
/// than the panel's period (one round at a time; requests meanwhile wait for it).
pub(super) async fn ledger(State(app): State<super::AppState>) -> Json<LedgerView> {
    let mut panel = app.ledger.lock().await;
    if let Some((at, view)) = &panel.last {
        if at.elapsed() < panel.every {
            return Json(view.clone());
        }
    }
    let began = Instant::now();
    let jobdbs = panel
        .rounds
        .round(
            &app.fleet,
            chrono::Duration::seconds(i64::from(crate::ledger::MARGIN_SECS)),
        )
        .await;
    let view = LedgerView {
        at: Utc::now(),
        took_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
        total: Ledger::total(&jobdbs),
        jobdbs,
    };
    panel.last = Some((Instant::now(), view.clone()));
    Json(view)
}

/// The panel behind a lock, as the app state holds it.
pub(super) type Shared = Arc<tokio::sync::Mutex<Panel>>;
