//! The invariants of events and subscriptions: every stored event has exactly one job per
//! matching subscription (`event-atomic`), a key published through the routers stores one
//! event (`event-once`), a disabled subscription's jobs wait (`subscription-held`), and a
//! subscription's cap holds (`subscription-cap`), and an event no subscription wants is kept
//! under one id (`event-kept`).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use spindle::job::JobId;

use super::{v, Inputs, Tally};
use crate::histories::events;
use crate::histories::record::{Outcome, Violation};

/// Events: every stored event has exactly the jobs its type fans out to, one per
/// subscription, whatever was killed in between (`event-atomic`); through the routers, a key
/// stores one event and every answer names its jobs (`event-once`); the disabled
/// subscription's jobs reach no endpoint while it is disabled (`subscription-held`, two
/// seconds after the disable answered, for attempts begun before it).
pub(super) fn events(i: &Inputs, out: &mut Vec<Violation>, tally: &mut Tally) {
    let mut by_event: HashMap<ulid::Ulid, Vec<(JobId, &spindle::job::EventLink)>> = HashMap::new();
    for (id, s) in i.stored {
        if let Some(e) = &s.job.event {
            by_event.entry(e.event_id).or_default().push((*id, e));
        }
    }
    tally.events = by_event.len();
    tally.event_jobs = by_event.values().map(Vec::len).sum();
    for (event, jobs) in &by_event {
        let expected = events::fan_out(&jobs[0].1.event_type);
        let subscriptions: HashSet<ulid::Ulid> = jobs.iter().map(|(_, e)| e.subscription).collect();
        if jobs.len() != expected || subscriptions.len() != expected {
            v(
                out,
                "event-atomic",
                event.datetime().into(),
                jobs.iter().map(|(id, _)| *id),
                format!(
                    "event {event} ({}) stored {} jobs for {} subscriptions; it fans out to {expected}",
                    jobs[0].1.event_type,
                    jobs.len(),
                    subscriptions.len()
                ),
            );
        }
    }
    // Through the routers, one event per key, and every answer names its jobs.
    let mut by_key: HashMap<&str, (HashSet<ulid::Ulid>, HashSet<String>)> = HashMap::new();
    for (id, s) in i.stored {
        if let (Some(e), Some(key)) = (&s.job.event, s.job.idempotency_key.as_deref()) {
            let entry = by_key.entry(key).or_default();
            entry.0.insert(e.event_id);
            entry.1.insert(id.to_string());
        }
    }
    for (key, (events, jobs)) in &by_key {
        let outcomes = i.log.outcomes.get(*key).map(Vec::as_slice).unwrap_or(&[]);
        if outcomes.is_empty() || !outcomes.iter().all(|(via, _)| via.starts_with("router")) {
            continue;
        }
        let strays: Vec<&str> = outcomes
            .iter()
            .filter_map(|(_, o)| match o {
                Outcome::Accepted(id) | Outcome::Duplicate(id) if !id.is_empty() => {
                    (!jobs.contains(id)).then_some(id.as_str())
                }
                _ => None,
            })
            .collect();
        if events.len() > 1 || !strays.is_empty() {
            v(
                out,
                "event-once",
                Utc::now(),
                None,
                format!(
                    "key {key}: {} events stored through the routers ({events:?}); answers \
                     naming jobs of none of them: {strays:?}",
                    events.len()
                ),
            );
        }
    }
    kept(i, out);
    let Some(held) = i.held_subscription else {
        return;
    };
    capped(i, out);
    // The disabled windows, from the log: (disabled, enabled again).
    let mut windows: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    let mut from: Option<DateTime<Utc>> = None;
    for (t, op) in &i.log.ops {
        if op == events::DISABLES {
            from = Some(*t);
        } else if op == events::ENABLES {
            if let Some(f) = from.take() {
                windows.push((f, *t));
            }
        }
    }
    for a in i.arrivals {
        let Ok(id) = a.job.parse::<JobId>() else {
            continue;
        };
        let Some(s) = i.stored.get(&id) else {
            continue;
        };
        if s.job.event.as_ref().map(|e| e.subscription) != Some(held) {
            continue;
        }
        // A JobDB that could not be written for a while (an outage, a commit fault) delays an
        // attempt begun before the disable reached the Director: it is sent once its commit
        // is made.
        let written_late = |from: DateTime<Utc>| {
            i.log.outages.iter().any(|(start, until)| {
                *start <= a.at && until.is_none_or(|u| u + Duration::seconds(2) >= from)
            })
        };
        if let Some((f, t)) = windows
            .iter()
            .find(|(f, t)| a.at > *f + Duration::seconds(2) && a.at < *t && !written_late(*f))
        {
            v(
                out,
                "subscription-held",
                a.at,
                [id],
                format!(
                    "job {id} of the disabled subscription arrived at {} (disabled {f} until {t})",
                    a.at
                ),
            );
        }
    }
}

/// The `created` subscription caps its URL (lane b) at [`events::CREATED_PER_SECOND`]
/// requests a second per Director: no second holds more than a burst and a second's worth per
/// Director, away from the times a Director was down (a new limiter starts with a full burst)
/// (`subscription-cap`).
/// Every acknowledged event no subscription wants is held by a JobDB at the end, and every
/// answer for its key names one event (`event-kept`).
fn kept(i: &Inputs, out: &mut Vec<Violation>) {
    let mut by_key: HashMap<&str, HashSet<&str>> = HashMap::new();
    for (key, _, id) in &i.log.kept {
        by_key.entry(key).or_default().insert(id);
        if !i.kept_found.contains(id) {
            v(
                out,
                "event-kept",
                Utc::now(),
                None,
                format!(
                    "event {id} (key {key}) was acknowledged, and no JobDB or archive holds it"
                ),
            );
        }
    }
    for (key, ids) in by_key {
        if ids.len() > 1 {
            v(
                out,
                "event-kept",
                Utc::now(),
                None,
                format!("key {key}: answers name {} events: {ids:?}", ids.len()),
            );
        }
    }
}

fn capped(i: &Inputs, out: &mut Vec<Violation>) {
    let rate = events::CREATED_PER_SECOND;
    let allowed = (2.0 * rate * i.directors as f64).ceil() as usize;
    let mut at: Vec<DateTime<Utc>> = i
        .arrivals
        .iter()
        .filter(|a| a.path == "lane/b")
        .map(|a| a.at)
        .collect();
    at.sort();
    // A Director down (killed, stopped to join again, or exited and restarted) starts a new
    // limiter when it comes back, however long it was down.
    let restarted = |from: DateTime<Utc>, to: DateTime<Utc>| {
        i.log.downs.iter().any(|(_, down, until)| {
            *down <= to + Duration::seconds(1)
                && until.is_none_or(|up| up >= from - Duration::seconds(3))
        })
    };
    let mut start = 0;
    for end in 0..at.len() {
        while at[end] - at[start] >= Duration::seconds(1) {
            start += 1;
        }
        let n = end - start + 1;
        if n > allowed && !restarted(at[start], at[end]) {
            v(
                out,
                "subscription-cap",
                at[end],
                None,
                format!(
                    "{n} requests reached lane b within a second ({} to {}); its subscription \
                     caps it at {rate}/s per Director, {allowed} a second with a burst",
                    at[start], at[end]
                ),
            );
            return;
        }
    }
}
