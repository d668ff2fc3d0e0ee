//! Listing stored jobs and events (`GET /v1/jobs`, `GET /v1/events`) and a job's attempts
//! (`GET /v1/jobs/{id}/attempts`): the filters as a query string, and the pages answered.
//!
//! A page lists in id order (ids are ULIDs, so creation order), newest first unless
//! `order=oldest`. `next_after` names where the next page starts; a page may hold fewer than
//! `limit` items and still have a `next_after` (a filter checked within a bounded window of
//! rows found nothing more there): keep asking until it is absent.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::{EventView, JobDescription, JobState};

/// Items on a page when `?limit=` is not given.
pub const DEFAULT_PAGE: usize = 100;

/// Most items on one page of `GET /v1/jobs` or `GET /v1/events`.
pub const MAX_LISTED_PER_PAGE: usize = 500;

/// Which way a listing runs through ids (creation order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ListOrder {
    /// Newest first (the default).
    #[default]
    Newest,
    /// Oldest first.
    Oldest,
}

impl ListOrder {
    /// The spelling of `?order=`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ListOrder::Newest => "newest",
            ListOrder::Oldest => "oldest",
        }
    }
}

/// Which jobs `GET /v1/jobs` lists; every filter given must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobFilter {
    /// Only this bucket's.
    pub bucket: Option<String>,
    /// Only those sent to this URL (exactly as submitted).
    pub endpoint: Option<String>,
    /// Only those in this state now.
    pub state: Option<JobState>,
    /// Only those of this ordering key.
    pub ordering_key: Option<String>,
    /// Only those created at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Only those created before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Newest or oldest first.
    pub order: ListOrder,
}

impl JobFilter {
    /// The filter as query parameters (without `after` and `limit`).
    pub fn query_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        let texts = [
            ("bucket", &self.bucket),
            ("endpoint", &self.endpoint),
            ("ordering_key", &self.ordering_key),
        ];
        for (name, value) in texts {
            if let Some(value) = value {
                pairs.push((name, value.clone()));
            }
        }
        if let Some(state) = self.state {
            pairs.push(("state", state.as_str().to_owned()));
        }
        times(&mut pairs, self.created_after, self.created_before);
        if self.order != ListOrder::default() {
            pairs.push(("order", self.order.as_str().to_owned()));
        }
        pairs
    }
}

/// Which events `GET /v1/events` lists.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventFilter {
    /// Only this bucket's.
    pub bucket: Option<String>,
    /// Only this type (needs `bucket`).
    pub event_type: Option<String>,
    /// Only those published at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Only those published before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Newest or oldest first.
    pub order: ListOrder,
}

impl EventFilter {
    /// The filter as query parameters (without `after` and `limit`).
    pub fn query_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        if let Some(bucket) = &self.bucket {
            pairs.push(("bucket", bucket.clone()));
        }
        if let Some(event_type) = &self.event_type {
            pairs.push(("event_type", event_type.clone()));
        }
        times(&mut pairs, self.created_after, self.created_before);
        if self.order != ListOrder::default() {
            pairs.push(("order", self.order.as_str().to_owned()));
        }
        pairs
    }
}

fn times(
    pairs: &mut Vec<(&'static str, String)>,
    after: Option<DateTime<Utc>>,
    before: Option<DateTime<Utc>>,
) {
    for (name, time) in [("created_after", after), ("created_before", before)] {
        if let Some(time) = time {
            pairs.push((name, time.to_rfc3339_opts(SecondsFormat::Micros, true)));
        }
    }
}

/// `GET /v1/jobs` answer: a page of jobs, each with its trace.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobList {
    /// The jobs, in the order asked.
    pub jobs: Vec<JobDescription>,
    /// More may follow: ask again with `?after=` this (and the same filters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// `GET /v1/events` answer: a page of events, each with its jobs in the JobDB that holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventList {
    /// The events, in the order asked.
    pub events: Vec<EventView>,
    /// More may follow: ask again with `?after=` this (and the same filters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// One delivery attempt of a job: when it started, and how it ended (absent while under way).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    /// Its number (1 for the first).
    pub attempt: u16,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it ended; absent while it is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    /// The state it left the job in (`succeeded`, `awaiting-retry`, `discarded`); absent while
    /// under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, example = "awaiting-retry")
    )]
    pub outcome: Option<JobState>,
    /// The endpoint's status code, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    /// The failure kind, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// Start of the failed answer (text, or base64 when `error_response_encoding` is `base64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_response: Option<String>,
    /// `utf-8` or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_response_encoding: Option<String>,
    /// How long it took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u32>,
    /// When the next attempt is due, when this one left the job awaiting a retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
}

/// `GET /v1/jobs/{id}/attempts` answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptList {
    /// The job.
    pub job_id: String,
    /// Its attempts, first first.
    pub attempts: Vec<AttemptView>,
}
