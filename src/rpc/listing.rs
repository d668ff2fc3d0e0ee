//! What every front shares to list jobs and events (`GET /v1/jobs`, `GET /v1/events`): the
//! query string read into a typed filter (a bad parameter is a `422` naming it), who may list
//! what, a job's attempts from its trace, and pages of several JobDBs merged into one (the
//! router asks every Director and answers one page, in id order, with one cursor).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use ulid::Ulid;

use super::api::{
    AttemptView, EventFilter, JobDescription, JobFilter, JobList, ListOrder, MAX_LISTED_PER_PAGE,
};
use super::auth::{Caller, Scope};
use super::error::ApiError;
use super::rules::FieldError;
use crate::job::{JobId, State, Transition};
use spindle_client::api::DEFAULT_PAGE;

/// A parsed `GET /v1/jobs` query.
#[derive(Clone, Debug, PartialEq)]
pub struct JobQuery {
    /// Which jobs.
    pub filter: JobFilter,
    /// Where the page starts: after this id, in the listing's order.
    pub after: Option<JobId>,
    /// At most this many.
    pub limit: usize,
}

/// A parsed `GET /v1/events` query.
#[derive(Clone, Debug, PartialEq)]
pub struct EventQuery {
    /// Which events.
    pub filter: EventFilter,
    /// Where the page starts: after this id, in the listing's order.
    pub after: Option<Ulid>,
    /// At most this many.
    pub limit: usize,
}

/// Longest text a filter may name (a bucket is shorter, but a longer one matches nothing).
const MAX_FILTER_TEXT: usize = 2048;

/// The query's parameters by name: each at most once, none outside `names` (a misspelt filter
/// would otherwise list everything).
pub fn query_params(
    query: Option<&str>,
    names: &[&'static str],
) -> Result<HashMap<&'static str, String>, FieldError> {
    let mut out = HashMap::new();
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let Some(known) = names.iter().find(|n| **n == name) else {
            return Err(FieldError::new(
                name.into_owned(),
                format!("is not a parameter here (these are: {})", names.join(", ")),
            ));
        };
        if value.len() > MAX_FILTER_TEXT {
            return Err(FieldError::too_large(
                *known,
                format!("is over {MAX_FILTER_TEXT} bytes"),
            ));
        }
        if out.insert(*known, value.into_owned()).is_some() {
            return Err(FieldError::new(*known, "is given more than once"));
        }
    }
    Ok(out)
}

const JOB_PARAMS: &[&str] = &[
    "bucket",
    "endpoint",
    "state",
    "ordering_key",
    "created_after",
    "created_before",
    "order",
    "after",
    "limit",
];

const EVENT_PARAMS: &[&str] = &[
    "bucket",
    "event_type",
    "created_after",
    "created_before",
    "order",
    "after",
    "limit",
];

/// Reads a `GET /v1/jobs` query.
pub fn parse_job_query(query: Option<&str>) -> Result<JobQuery, FieldError> {
    let mut p = query_params(query, JOB_PARAMS)?;
    let state = p
        .remove("state")
        .map(|s| {
            s.parse::<State>().map_err(|_| {
                let all: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
                FieldError::new("state", format!("must be one of {}", all.join(", ")))
            })
        })
        .transpose()?;
    let after = p
        .remove("after")
        .map(|a| {
            a.parse::<JobId>()
                .map_err(|_| FieldError::new("after", "must be a job id (a ULID)"))
        })
        .transpose()?;
    Ok(JobQuery {
        filter: JobFilter {
            bucket: p.remove("bucket"),
            endpoint: p.remove("endpoint"),
            state,
            ordering_key: p.remove("ordering_key"),
            created_after: time(&mut p, "created_after")?,
            created_before: time(&mut p, "created_before")?,
            order: order(&mut p)?,
        },
        after,
        limit: limit(&mut p)?,
    })
}

/// Reads a `GET /v1/events` query.
pub fn parse_event_query(query: Option<&str>) -> Result<EventQuery, FieldError> {
    let mut p = query_params(query, EVENT_PARAMS)?;
    let filter = EventFilter {
        bucket: p.remove("bucket"),
        event_type: p.remove("event_type"),
        created_after: time(&mut p, "created_after")?,
        created_before: time(&mut p, "created_before")?,
        order: order(&mut p)?,
    };
    if filter.event_type.is_some() && filter.bucket.is_none() {
        return Err(FieldError::new(
            "event_type",
            "needs bucket (event types are listed within a bucket)",
        ));
    }
    let after = p
        .remove("after")
        .map(|a| {
            a.parse::<Ulid>()
                .map_err(|_| FieldError::new("after", "must be an event id (a ULID)"))
        })
        .transpose()?;
    Ok(EventQuery {
        filter,
        after,
        limit: limit(&mut p)?,
    })
}

fn time(
    p: &mut HashMap<&'static str, String>,
    name: &'static str,
) -> Result<Option<DateTime<Utc>>, FieldError> {
    p.remove(name)
        .map(|t| {
            DateTime::parse_from_rfc3339(&t)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| FieldError::new(name, "must be an RFC 3339 time"))
        })
        .transpose()
}

fn order(p: &mut HashMap<&'static str, String>) -> Result<ListOrder, FieldError> {
    match p.remove("order").as_deref() {
        None | Some("newest") => Ok(ListOrder::Newest),
        Some("oldest") => Ok(ListOrder::Oldest),
        Some(_) => Err(FieldError::new("order", "must be newest or oldest")),
    }
}

fn limit(p: &mut HashMap<&'static str, String>) -> Result<usize, FieldError> {
    match p.remove("limit") {
        None => Ok(DEFAULT_PAGE),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LISTED_PER_PAGE).contains(n))
            .ok_or_else(|| FieldError::new("limit", format!("must be 1 to {MAX_LISTED_PER_PAGE}"))),
    }
}

/// Whether `caller` may list `bucket` (`None`: every bucket): a token limited to some buckets
/// must name one of them.
pub fn check_lister(caller: Option<&Caller>, bucket: Option<&str>) -> Result<(), ApiError> {
    let Some(caller) = caller else {
        return Ok(());
    };
    let allowed = match bucket {
        Some(bucket) => caller.may_use(bucket),
        None => match &caller.scope {
            Scope::Admin => true,
            Scope::Buckets(buckets) => buckets.contains("*"),
        },
    };
    if allowed {
        return Ok(());
    }
    Err(ApiError::Forbidden {
        message: match bucket {
            Some(bucket) => format!("token {:?} may not read bucket {bucket:?}", caller.name),
            None => format!(
                "token {:?} may read only some buckets: name one with ?bucket=",
                caller.name
            ),
        },
        field: Some("bucket".to_owned()),
    })
}

/// A job's attempts from its history ([`crate::job::history`], oldest first): each
/// `executing` step with the row that ended it, if one did.
pub fn attempts_of(history: &[(u64, Transition)]) -> Vec<AttemptView> {
    let mut out: Vec<AttemptView> = Vec::new();
    for (_, t) in history {
        if t.state == State::Executing {
            out.push(AttemptView {
                attempt: t.attempts,
                started_at: t.time,
                ended_at: None,
                outcome: None,
                response_status: None,
                error_type: None,
                error_response: None,
                error_response_encoding: None,
                duration_ms: None,
                retry_at: None,
            });
            continue;
        }
        let Some(open) = out.last_mut().filter(|a| a.ended_at.is_none()) else {
            continue;
        };
        let row = super::views::transition_view(0, t);
        open.ended_at = Some(t.time);
        open.outcome = Some(t.state);
        open.response_status = row.response_status;
        open.error_type = row.error_type;
        open.error_response = row.error_response;
        open.error_response_encoding = row.error_response_encoding;
        open.duration_ms = row.duration_ms;
        open.retry_at = row.retry_at;
    }
    out
}

/// One front's page, as the router merges it.
#[derive(Debug)]
pub struct Page<T> {
    /// Its items, in the listing's order.
    pub items: Vec<T>,
    /// Where it stopped (`None`: it holds every match after the cursor).
    pub next_after: Option<Ulid>,
}

/// Pages of several JobDBs, each listing the same query after the same cursor, merged into
/// one page of at most `limit` items in the listing's order, with its own cursor.
///
/// Each page holds every match of its JobDB between the cursor and its own `next_after`; the
/// merged page may only hold items up to the nearest of those (an item past it could be
/// preceded by one a page did not reach), so nothing is skipped or listed twice. An id seen
/// twice (a job in a JobDB it was moved out of, and in the one it moved to) is listed once:
/// `keep_second` says whether the second copy is the one to show.
pub fn merge_pages<T>(
    pages: Vec<Page<T>>,
    order: ListOrder,
    limit: usize,
    id_of: impl Fn(&T) -> Ulid,
    keep_second: impl Fn(&T, &T) -> bool,
) -> (Vec<T>, Option<Ulid>) {
    // Ranks run in the listing's order whichever way it goes.
    let rank = |id: Ulid| match order {
        ListOrder::Oldest => u128::from(id),
        ListOrder::Newest => !u128::from(id),
    };
    let bound = pages.iter().filter_map(|p| p.next_after.map(rank)).min();
    let mut items: Vec<(u128, T)> = pages
        .into_iter()
        .flat_map(|p| p.items)
        .map(|item| (rank(id_of(&item)), item))
        .filter(|(r, _)| bound.is_none_or(|b| *r <= b))
        .collect();
    items.sort_by_key(|(r, _)| *r);
    let mut merged: Vec<(u128, T)> = Vec::with_capacity(items.len().min(limit + 1));
    for (r, item) in items {
        match merged.last_mut() {
            Some((last, kept)) if *last == r => {
                if keep_second(kept, &item) {
                    *kept = item;
                }
            }
            _ => merged.push((r, item)),
        }
    }
    let unrank = |r: u128| match order {
        ListOrder::Oldest => Ulid::from(r),
        ListOrder::Newest => Ulid::from(!r),
    };
    if merged.len() > limit {
        merged.truncate(limit);
        let next = merged.last().map(|(r, _)| unrank(*r));
        return (merged.into_iter().map(|(_, t)| t).collect(), next);
    }
    let next = match (merged.len() == limit, bound) {
        (true, _) => merged.last().map(|(r, _)| unrank(*r)),
        (false, b) => b.map(unrank),
    };
    // A full page that reached every page's end has nothing after it.
    let next = next.filter(|_| bound.is_some() || merged.len() < limit);
    (merged.into_iter().map(|(_, t)| t).collect(), next)
}

/// [`merge_pages`] of jobs: a job a drain moved is shown as the JobDB it moved to has it.
pub fn merge_job_pages(
    pages: Vec<Page<JobDescription>>,
    order: ListOrder,
    limit: usize,
) -> JobList {
    let (jobs, next_after) = merge_pages(
        pages,
        order,
        limit,
        |j| j.id.parse().unwrap_or_default(),
        |kept, _| kept.state == State::Moved,
    );
    JobList {
        jobs,
        next_after: next_after.map(|id| id.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(ids: &[u128], next: Option<u128>) -> Page<u128> {
        Page {
            items: ids.to_vec(),
            next_after: next.map(Ulid::from),
        }
    }

    fn merge(pages: Vec<Page<u128>>, order: ListOrder, limit: usize) -> (Vec<u128>, Option<u128>) {
        let (items, next) = merge_pages(pages, order, limit, |i| Ulid::from(*i), |_, _| false);
        (items, next.map(u128::from))
    }

    #[test]
    fn merged_pages_stop_at_the_nearest_unfinished_page() {
        // The first JobDB stopped at 5: 7 and 9 may come after its 6.
        let pages = vec![page(&[1, 3, 5], Some(5)), page(&[2, 7, 9], None)];
        assert_eq!(
            merge(pages, ListOrder::Oldest, 10),
            (vec![1, 2, 3, 5], Some(5))
        );
        let pages = vec![page(&[1, 3], None), page(&[2, 7], None)];
        assert_eq!(
            merge(pages, ListOrder::Oldest, 10),
            (vec![1, 2, 3, 7], None)
        );
        let pages = vec![page(&[1, 3], None), page(&[2, 7], None)];
        assert_eq!(merge(pages, ListOrder::Oldest, 2), (vec![1, 2], Some(2)));
        let pages = vec![page(&[9, 4], Some(4)), page(&[8, 1], None)];
        assert_eq!(
            merge(pages, ListOrder::Newest, 10),
            (vec![9, 8, 4], Some(4))
        );
    }

    #[test]
    fn a_job_in_two_jobdbs_is_listed_once() {
        let pages = vec![page(&[1, 2], None), page(&[2, 3], None)];
        assert_eq!(merge(pages, ListOrder::Oldest, 10), (vec![1, 2, 3], None));
    }

    #[test]
    fn bad_parameters_name_themselves() {
        let field = |q: &str| parse_job_query(Some(q)).unwrap_err().field;
        assert_eq!(field("bukket=a"), "bukket");
        assert_eq!(field("state=done"), "state");
        assert_eq!(field("limit=0"), "limit");
        assert_eq!(field("limit=501"), "limit");
        assert_eq!(field("after=xyz"), "after");
        assert_eq!(field("bucket=a&bucket=b"), "bucket");
        assert_eq!(field("created_after=yesterday"), "created_after");
        assert_eq!(field("order=up"), "order");
        let q = parse_job_query(Some("bucket=a&state=awaiting-retry&order=oldest&limit=7"))
            .expect("valid");
        assert_eq!(q.filter.state, Some(State::AwaitingRetry));
        assert_eq!((q.limit, q.filter.order), (7, ListOrder::Oldest));
        assert_eq!(
            parse_event_query(Some("event_type=x")).unwrap_err().field,
            "event_type"
        );
    }
}
