//! The JobDB side of events: one event's row and jobs (`GET /v1/events/{id}`, and a router
//! finding out whether a publish it lost track of was stored), and the events a back-fill
//! replays to a subscription, a page at a time (every event kept here, with jobs or without).

use chrono::{DateTime, Utc};
use ulid::Ulid;

use super::{with_pool, JobDb, JobDbError};
use crate::job::{EventRecord, JobId};

/// An event's row.
const EVENT: &str = "SELECT bucket, event_type, created_at FROM events WHERE id = ?";

/// An event's jobs, with their subscriptions.
const EVENT_JOBS: &str =
    "SELECT id, subscription_id FROM jobs WHERE event_id = ? ORDER BY subscription_id, id";

/// Unfinished jobs per subscription (the dashboard's "waiting" column): the open work
/// (`open_jobs`, and `jobs_fresh` for a job fresh in its Director's cache), each job's
/// subscription read by its key. It reads what is open, never the JobDB's ended jobs
/// (docs/operations.md has its plan).
const WAITING_BY_SUBSCRIPTION: &str = "SELECT j.subscription_id, COUNT(*) AS n FROM \
     (SELECT job_id FROM open_jobs UNION ALL SELECT job_id FROM jobs_fresh) o \
     JOIN jobs j ON j.id = o.job_id WHERE j.subscription_id IS NOT NULL \
     GROUP BY j.subscription_id";

/// Events with a job of a subscription: the caller binds the subscription, then adds
/// ` AND event_id IN (…)`.
const EVENTS_OF_SUBSCRIPTION: &str = "SELECT event_id FROM jobs WHERE subscription_id = ";

/// Events of a bucket published at or after a time, after an id (event id order), not erased,
/// that have no job of a subscription here, each with its envelope (its own, or its first
/// job's): the caller binds bucket, since, after, the subscription and a limit.
const EVENT_SOURCES: &str = concat!(
    "SELECT e.id, COALESCE(e.payload, (SELECT j.payload FROM jobs j WHERE j.event_id = e.id ",
    "ORDER BY j.id LIMIT 1)) AS payload FROM events e WHERE e.bucket = ? ",
    "AND e.created_at >= ? AND e.id > ? AND e.erased_at IS NULL ",
    "AND NOT EXISTS (SELECT 1 FROM jobs m WHERE m.event_id = e.id AND m.subscription_id = ?) ",
    "ORDER BY e.id LIMIT ?"
);

/// Events kept without a job (with their envelope), after an id, in id order: the caller binds
/// the id and a limit.
const KEPT_EVENTS: &str = "SELECT id, bucket, event_type, created_at, payload FROM events \
     WHERE payload IS NOT NULL AND id > ? ORDER BY id LIMIT ?";

/// An event as this JobDB has it: its row and the jobs of it stored here.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredEvent {
    /// The event's id.
    pub id: Ulid,
    /// Its bucket.
    pub bucket: String,
    /// Its type.
    pub event_type: String,
    /// When it was published.
    pub created_at: DateTime<Utc>,
    /// Its jobs here: (job, subscription), by subscription.
    pub jobs: Vec<(JobId, Ulid)>,
}

impl JobDb {
    /// The event `id`, if this JobDB has its row.
    pub async fn event(&self, id: Ulid) -> Result<Option<StoredEvent>, JobDbError> {
        let key = id.to_bytes().to_vec();
        with_pool!(self, |p, q| {
            let Some(row) = sqlx::query(EVENT)
                .bind(key.clone())
                .fetch_optional(p)
                .await?
            else {
                return Ok(None);
            };
            let jobs = sqlx::query(EVENT_JOBS)
                .bind(key)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    Ok((
                        q::job_id_of(row, "id")?,
                        q::ulid_of(row, "subscription_id")?,
                    ))
                })
                .collect::<Result<Vec<_>, JobDbError>>()?;
            Ok(Some(StoredEvent {
                id,
                bucket: q::text(&row, "bucket")?,
                event_type: q::text(&row, "event_type")?,
                created_at: q::time_of(&row, "created_at")?,
                jobs,
            }))
        })
    }

    /// Up to `limit` events kept here without a job, after the event `after`, in id order (a
    /// drainer archives them before the JobDB is dropped).
    pub async fn kept_events(
        &self,
        after: Option<Ulid>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, JobDbError> {
        let after = after.map_or_else(|| vec![0u8; 16], |id| id.to_bytes().to_vec());
        with_pool!(self, |p, q| {
            sqlx::query(KEPT_EVENTS)
                .bind(after)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    let envelope: Vec<u8> = sqlx::Row::try_get(row, "payload")?;
                    Ok(EventRecord {
                        id: q::ulid_of(row, "id")?,
                        bucket: q::text(row, "bucket")?.into(),
                        event_type: q::text(row, "event_type")?.into(),
                        created_at: q::time_of(row, "created_at")?,
                        envelope: envelope.into(),
                    })
                })
                .collect()
        })
    }

    /// How many jobs of each subscription are unfinished here (waiting, retrying, under way).
    pub async fn waiting_by_subscription(
        &self,
    ) -> Result<std::collections::HashMap<Ulid, u64>, JobDbError> {
        with_pool!(self, |p, q| {
            sqlx::query(WAITING_BY_SUBSCRIPTION)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| Ok((q::ulid_of(row, "subscription_id")?, q::count_of(row, "n")?)))
                .collect()
        })
    }

    /// Which of `events` already have a job of `subscription` in this JobDB (a back-fill
    /// skips them).
    pub async fn events_delivered_to(
        &self,
        subscription: Ulid,
        events: &[Ulid],
    ) -> Result<std::collections::HashSet<Ulid>, JobDbError> {
        let mut out = std::collections::HashSet::new();
        for chunk in events.chunks(super::MAX_IDS_PER_SELECT) {
            with_pool!(self, |p, q| {
                let mut query = sqlx::QueryBuilder::<q::Db>::new(EVENTS_OF_SUBSCRIPTION);
                query.push_bind(subscription.to_bytes().to_vec());
                query.push(" AND event_id IN (");
                let mut ids = query.separated(", ");
                for id in chunk {
                    ids.push_bind(id.to_bytes().to_vec());
                }
                query.push(")");
                for row in query.build().fetch_all(p).await? {
                    out.insert(q::ulid_of(&row, "event_id")?);
                }
            });
        }
        Ok(out)
    }

    /// Up to `limit` events of `bucket` published at or after `since` that have no job of
    /// `subscription` in this JobDB, after the event `after` in id order: each event's id and
    /// envelope (`{"type", "timestamp", "data"}`; `None` if this JobDB lost it), whether it
    /// made jobs or was kept without one.
    pub async fn event_sources(
        &self,
        bucket: &str,
        since: DateTime<Utc>,
        subscription: Ulid,
        after: Option<Ulid>,
        limit: usize,
    ) -> Result<Vec<(Ulid, Option<Vec<u8>>)>, JobDbError> {
        let after = after.map_or_else(|| vec![0u8; 16], |id| id.to_bytes().to_vec());
        with_pool!(self, |p, q| {
            sqlx::query(EVENT_SOURCES)
                .bind(bucket)
                .bind(since.naive_utc())
                .bind(after)
                .bind(subscription.to_bytes().to_vec())
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    let payload: Option<Vec<u8>> = sqlx::Row::try_get(row, "payload")?;
                    Ok((q::ulid_of(row, "id")?, payload))
                })
                .collect()
        })
    }
}
