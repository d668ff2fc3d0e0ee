//! The JobDB's pages of jobs and events (`GET /v1/jobs`, `GET /v1/events`).
//!
//! A page reads one bounded window of ids in id order from the narrowest index the filter
//! allows (`jobs_ordering_key`, `jobs_bucket`, the primary key; `events_type`,
//! `events_bucket`), so its cost is bounded by the window, never by the table. Filters no
//! index orders by id (the endpoint, the state: it is not a column but the job's latest step,
//! [`crate::job::history`]) are checked on the window's rows: a page may then hold fewer jobs
//! than asked, and names where its window ended so the next page goes on from there.
//! `docs/operations.md` shows each query's `EXPLAIN`.

use std::collections::HashMap;

use ulid::Ulid;

use super::events::StoredEvent;
use super::{with_pool, JobDb, JobDbError};
use crate::job::{Job, JobId, Transition};
use spindle_client::api::{EventFilter, JobFilter, ListOrder};

/// Rows a page of jobs reads from its index when a filter is checked on them.
pub const SCAN_WINDOW: usize = 1000;

/// Jobs whose history is read at once while a state filter is checked.
const STATE_CHUNK: usize = 250;

/// A page of jobs, with the history of each (oldest step first).
#[derive(Debug, Default)]
pub struct JobPage {
    /// The jobs (without payload and headers), in the listing's order.
    pub jobs: Vec<(Job, Vec<(u64, Transition)>)>,
    /// Where the next page starts; `None` when nothing more matches.
    pub next_after: Option<Ulid>,
}

/// A page of events, with their jobs here.
#[derive(Debug, Default)]
pub struct EventPage {
    /// The events, in the listing's order.
    pub events: Vec<StoredEvent>,
    /// Where the next page starts; `None` when nothing more matches.
    pub next_after: Option<Ulid>,
}

/// The ids a page may hold: strictly between `low` and `high`, from the cursor and the
/// creation times (an id is made when its job or event is, to the millisecond).
fn id_range(
    order: ListOrder,
    after: Option<Ulid>,
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    created_before: Option<chrono::DateTime<chrono::Utc>>,
) -> (Vec<u8>, Vec<u8>) {
    let ms = |t: chrono::DateTime<chrono::Utc>| u64::try_from(t.timestamp_millis()).unwrap_or(0);
    let mut low = created_after.map_or(0, |t| {
        u128::from(Ulid::from_parts(ms(t), 0)).saturating_sub(1)
    });
    let mut high = created_before.map_or(u128::MAX, |t| u128::from(Ulid::from_parts(ms(t), 0)));
    if let Some(after) = after.map(u128::from) {
        match order {
            ListOrder::Oldest => low = low.max(after),
            ListOrder::Newest => high = high.min(after),
        }
    }
    (low.to_be_bytes().to_vec(), high.to_be_bytes().to_vec())
}

/// `query` with `params` bound in order (a macro: each engine's query type differs).
macro_rules! bound {
    ($query:expr, $params:expr) => {{
        let mut query = $query;
        for param in $params {
            query = match param {
                Param::Id(v) => query.bind(v),
                Param::Text(v) => query.bind(v),
                Param::Count(v) => query.bind(v),
            };
        }
        query
    }};
}

/// A value bound to a listing statement, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    /// An id (16 bytes).
    Id(Vec<u8>),
    /// A text filter.
    Text(String),
    /// A row count.
    Count(i64),
}

/// The statement reading a window of `window` jobs of `filter` after `after`: each row's id
/// and whether it has the endpoint asked (`hit`). Its text depends only on which filters are
/// given; values are bound (`docs/operations.md` shows its `EXPLAIN`). It names the index
/// of its filter (`use_index`: the engine's hint): over a small table an optimizer may prefer
/// another index and sort, a plan that grows with the table.
pub fn jobs_window(
    filter: &JobFilter,
    after: Option<Ulid>,
    window: usize,
    use_index: fn(&str) -> String,
) -> (String, Vec<Param>) {
    let (low, high) = id_range(
        filter.order,
        after,
        filter.created_after,
        filter.created_before,
    );
    let mut sql = String::from("SELECT id, ");
    let mut params = Vec::new();
    match &filter.endpoint {
        Some(endpoint) => {
            sql.push_str("CASE WHEN endpoint = ? THEN 1 ELSE 0 END");
            params.push(Param::Text(endpoint.clone()));
        }
        None => sql.push('1'),
    }
    sql.push_str(" AS hit FROM jobs");
    if filter.ordering_key.is_some() {
        sql.push_str(&use_index("jobs_ordering_key"));
    } else if filter.bucket.is_some() {
        sql.push_str(&use_index("jobs_bucket"));
    }
    sql.push_str(" WHERE id > ? AND id < ?");
    params.extend([Param::Id(low), Param::Id(high)]);
    if let Some(bucket) = &filter.bucket {
        sql.push_str(" AND bucket = ?");
        params.push(Param::Text(bucket.clone()));
    }
    if let Some(key) = &filter.ordering_key {
        sql.push_str(" AND ordering_key = ?");
        params.push(Param::Text(key.clone()));
    }
    order_and_limit(&mut sql, &mut params, filter.order, window);
    (sql, params)
}

/// The statement reading up to `window` events of `filter` after `after`.
pub fn events_window(
    filter: &EventFilter,
    after: Option<Ulid>,
    window: usize,
    use_index: fn(&str) -> String,
) -> (String, Vec<Param>) {
    let (low, high) = id_range(
        filter.order,
        after,
        filter.created_after,
        filter.created_before,
    );
    let mut sql = String::from("SELECT id, bucket, event_type, created_at FROM events");
    match (&filter.bucket, &filter.event_type) {
        (Some(_), Some(_)) => sql.push_str(&use_index("events_type")),
        (Some(_), None) => sql.push_str(&use_index("events_bucket")),
        _ => {}
    }
    sql.push_str(" WHERE id > ? AND id < ?");
    let mut params = vec![Param::Id(low), Param::Id(high)];
    if let Some(bucket) = &filter.bucket {
        sql.push_str(" AND bucket = ?");
        params.push(Param::Text(bucket.clone()));
    }
    if let Some(event_type) = &filter.event_type {
        sql.push_str(" AND event_type = ?");
        params.push(Param::Text(event_type.clone()));
    }
    order_and_limit(&mut sql, &mut params, filter.order, window);
    (sql, params)
}

fn order_and_limit(sql: &mut String, params: &mut Vec<Param>, order: ListOrder, window: usize) {
    sql.push_str(match order {
        ListOrder::Oldest => " ORDER BY id LIMIT ?",
        ListOrder::Newest => " ORDER BY id DESC LIMIT ?",
    });
    params.push(Param::Count(i64::try_from(window).unwrap_or(i64::MAX)));
}

impl JobDb {
    /// Up to `limit` jobs matching `filter` after `after` (in the filter's order).
    pub async fn list_jobs(
        &self,
        filter: &JobFilter,
        after: Option<Ulid>,
        limit: usize,
    ) -> Result<JobPage, JobDbError> {
        let checked = filter.endpoint.is_some() || filter.state.is_some();
        let window = if checked {
            SCAN_WINDOW.max(limit)
        } else {
            limit + 1
        };
        let rows: Vec<(JobId, bool)> = with_pool!(self, |p, q| {
            let (sql, params) = jobs_window(filter, after, window, q::use_index);
            bound!(sqlx::query(&sql), params)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    let hit: i64 = sqlx::Row::try_get(row, "hit")?;
                    Ok((q::job_id_of(row, "id")?, hit == 1))
                })
                .collect::<Result<_, JobDbError>>()?
        });
        let window_full = rows.len() == window;
        let window_end = rows.last().map(|(id, _)| id.0);
        let candidates: Vec<JobId> = rows
            .iter()
            .filter(|(_, hit)| *hit)
            .map(|(id, _)| *id)
            .collect();
        let mut picked: Vec<(JobId, Vec<(u64, Transition)>)> = Vec::new();
        'chunks: for chunk in candidates.chunks(STATE_CHUNK.max(limit)) {
            let mut histories = self.histories_of(chunk).await?;
            for id in chunk {
                let Some(history) = histories.remove(id) else {
                    continue;
                };
                let state = history.last().map(|(_, t)| t.state);
                if filter.state.is_some_and(|wanted| state != Some(wanted)) {
                    continue;
                }
                picked.push((*id, history));
                if picked.len() == limit {
                    break 'chunks;
                }
            }
        }
        let next_after = match picked.last() {
            Some((last, _)) if picked.len() == limit => {
                (window_full || window_end != Some(last.0)).then_some(last.0)
            }
            _ => window_end.filter(|_| window_full),
        };
        let ids: Vec<JobId> = picked.iter().map(|(id, _)| *id).collect();
        let mut jobs: HashMap<JobId, Job> = self
            .select_jobs(&ids, false)
            .await?
            .into_iter()
            .map(|job| (job.id, job))
            .collect();
        Ok(JobPage {
            jobs: picked
                .into_iter()
                .filter_map(|(id, history)| jobs.remove(&id).map(|job| (job, history)))
                .collect(),
            next_after,
        })
    }

    /// Up to `limit` events matching `filter` after `after` (in the filter's order), each with
    /// its jobs here.
    pub async fn list_events(
        &self,
        filter: &EventFilter,
        after: Option<Ulid>,
        limit: usize,
    ) -> Result<EventPage, JobDbError> {
        let window = limit + 1;
        let mut events: Vec<StoredEvent> = with_pool!(self, |p, q| {
            let (sql, params) = events_window(filter, after, window, q::use_index);
            bound!(sqlx::query(&sql), params)
                .fetch_all(p)
                .await?
                .iter()
                .map(|row| {
                    Ok(StoredEvent {
                        id: q::ulid_of(row, "id")?,
                        bucket: q::text(row, "bucket")?,
                        event_type: q::text(row, "event_type")?,
                        created_at: q::time_of(row, "created_at")?,
                        jobs: Vec::new(),
                    })
                })
                .collect::<Result<_, JobDbError>>()?
        });
        let next_after = (events.len() > limit).then(|| {
            events.truncate(limit);
            events.last().map(|e| e.id)
        });
        let ids: Vec<JobId> = events.iter().map(|e| JobId(e.id)).collect();
        let mut jobs: HashMap<Ulid, Vec<(JobId, Ulid)>> = HashMap::new();
        if !ids.is_empty() {
            with_pool!(self, |p, q| {
                for row in &q::ids_query(
                    "SELECT event_id, id, subscription_id FROM jobs WHERE event_id IN (",
                    &ids,
                    ") ORDER BY event_id, subscription_id, id",
                )
                .build()
                .fetch_all(p)
                .await?
                {
                    jobs.entry(q::ulid_of(row, "event_id")?).or_default().push((
                        q::job_id_of(row, "id")?,
                        q::ulid_of(row, "subscription_id")?,
                    ));
                }
            });
        }
        for event in &mut events {
            event.jobs = jobs.remove(&event.id).unwrap_or_default();
        }
        Ok(EventPage {
            events,
            next_after: next_after.flatten(),
        })
    }
}
