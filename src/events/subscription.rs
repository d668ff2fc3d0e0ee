//! A subscription: which events of a bucket go to which URL, and how. [`Subscription::check`]
//! turns what an operator gives ([`NewSubscription`]) into one, or a [`FieldError`] naming the
//! field; [`Subscription::view`] is how the API shows it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use spindle_client::{NewJob, NewSubscription, OrderingFailure, PayloadFilter, SubscriptionView};
use ulid::Ulid;

use super::{check_pointer, Pattern};
use crate::delivery::guard::AddressPolicy;
use crate::delivery::signing::SigningSecret;
use crate::rpc::api::{FieldError, IntakeLimits, JobTemplate};

/// Most event types one subscription names.
pub const MAX_EVENT_TYPES: usize = 64;
/// Longest description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 256;
/// Highest `max_concurrency` of a subscription.
pub const MAX_CONCURRENCY: u32 = 10_000;
/// Highest `max_per_second` of a subscription.
pub const MAX_PER_SECOND: f64 = 1_000_000.0;
/// Largest `filter.equals`, as JSON text: an event's payload is at most 1 MiB, and a filter
/// compares one value in it.
pub const MAX_FILTER_VALUE_BYTES: usize = 1024;
/// Largest subscription, as the JSON of the request that makes or changes it.
pub const MAX_SUBSCRIPTION_BYTES: usize = 64 * 1024;
/// Most live subscriptions of one bucket (every publish to it matches against them all).
pub const MAX_SUBSCRIPTIONS_PER_BUCKET: u64 = 1000;

/// A checked subscription, as the cache and publishing use it.
#[derive(Clone, Debug)]
pub struct Subscription {
    /// Its id.
    pub id: Ulid,
    /// What was given (and stored), secret included.
    pub spec: Stored,
    /// `spec.event_types`, parsed.
    pub patterns: Vec<Pattern>,
    /// Its signing key.
    pub secret: SigningSecret,
    /// The control database's version of its last change (0 until it is stored): what an
    /// editor names in `If-Match`.
    pub version: u64,
    /// Its event jobs' common part, checked with it: an event's job is
    /// [`JobTemplate::make`] with the event's envelope, ordering key and `deliver_at`.
    pub template: JobTemplate,
}

/// A subscription as the control database keeps it (`subscriptions.spec`, JSON): everything
/// given, with the secret and the times. Read back, it is checked again: an operator's SQL
/// may have written it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stored {
    /// What was given, with `secret` and `enabled` always set.
    pub given: NewSubscription,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl Subscription {
    /// Checks what an operator gives. `policy` is the delivery address guard: a URL whose
    /// host is an IP address it blocks is refused now, not at the first attempt. A missing
    /// secret is made here.
    pub fn check(
        id: Ulid,
        mut given: NewSubscription,
        limits: &IntakeLimits,
        policy: &AddressPolicy,
        now: DateTime<Utc>,
    ) -> Result<Subscription, FieldError> {
        crate::rpc::rules::check_bucket(&given.bucket, "bucket")?;
        check_url(&given.url, policy)?;
        let patterns = patterns_of(&given.event_types)?;
        if let Some(filter) = &given.filter {
            check_pointer(&filter.pointer, "filter.pointer")?;
            let bytes = serde_json::to_string(&filter.equals).map_or(usize::MAX, |t| t.len());
            if bytes > MAX_FILTER_VALUE_BYTES {
                return Err(FieldError::too_large(
                    "filter.equals",
                    format!(
                        "is {bytes} bytes as JSON; at most {MAX_FILTER_VALUE_BYTES} are allowed"
                    ),
                ));
            }
        }
        if let Some(pointer) = &given.ordering_key {
            check_pointer(pointer, "ordering_key")?;
        }
        if given.ordering_failure.is_some() && given.ordering_key.is_none() {
            return Err(FieldError::new(
                "ordering_failure",
                "is only allowed with ordering_key",
            ));
        }
        if let Some(text) = &given.description {
            if text.chars().count() > MAX_DESCRIPTION_CHARS || text.chars().any(char::is_control) {
                return Err(FieldError::new(
                    "description",
                    format!(
                        "must be at most {MAX_DESCRIPTION_CHARS} characters, no control characters"
                    ),
                ));
            }
        }
        if given
            .max_concurrency
            .is_some_and(|n| !(1..=MAX_CONCURRENCY).contains(&n))
        {
            return Err(FieldError::new(
                "max_concurrency",
                format!("must be 1 to {MAX_CONCURRENCY}"),
            ));
        }
        if given
            .max_per_second
            .is_some_and(|r| !(r.is_finite() && r > 0.0 && r <= MAX_PER_SECOND))
        {
            return Err(FieldError::new(
                "max_per_second",
                format!("must be above 0 and at most {MAX_PER_SECOND}"),
            ));
        }
        let secret = match &given.secret {
            Some(text) => text
                .parse::<SigningSecret>()
                .map_err(|e| FieldError::new("secret", e.to_string()))?,
            None => {
                let key: [u8; 32] = rand::random();
                let text = format!(
                    "whsec_{}",
                    base64::engine::general_purpose::STANDARD.encode(key)
                );
                given.secret = Some(text.clone());
                text.parse::<SigningSecret>()
                    .map_err(|e| FieldError::new("secret", e.to_string()))?
            }
        };
        given.enabled = Some(given.enabled.unwrap_or(true));
        // The jobs it will make must pass intake: check one now, naming our fields.
        let template = JobTemplate::check(sample_job(&given), limits, now).map_err(|mut e| {
            if e.field == "endpoint" {
                e.field = "url".to_owned();
            }
            e
        })?;
        Ok(Subscription {
            id,
            spec: Stored {
                given,
                created_at: now,
                updated_at: now,
            },
            patterns,
            secret,
            version: 0,
            template,
        })
    }

    /// A subscription read back from the control database, checked again (without the
    /// address guard, which publishing's deliveries apply anyway).
    pub fn from_stored(
        id: Ulid,
        stored: Stored,
        limits: &IntakeLimits,
    ) -> Result<Subscription, FieldError> {
        let (created_at, updated_at) = (stored.created_at, stored.updated_at);
        // Checked before `check`, which would make a new one: each process its own.
        if stored.given.secret.is_none() {
            return Err(FieldError::new("secret", "is missing"));
        }
        let mut checked =
            Subscription::check(id, stored.given, limits, &any_address(), updated_at)?;
        checked.spec.created_at = created_at;
        checked.spec.updated_at = updated_at;
        Ok(checked)
    }

    /// Its bucket.
    pub fn bucket(&self) -> &str {
        &self.spec.given.bucket
    }

    /// Whether its jobs are delivered now.
    pub fn enabled(&self) -> bool {
        self.spec.given.enabled.unwrap_or(true)
    }

    /// Whether it wants events of `event_type` (one of its patterns matches).
    pub fn wants(&self, event_type: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(event_type))
    }

    /// Its caps on its URL's requests, per Director, if it has any.
    pub fn caps(&self) -> Option<(Option<u32>, Option<f64>)> {
        let given = &self.spec.given;
        (given.max_concurrency.is_some() || given.max_per_second.is_some())
            .then_some((given.max_concurrency, given.max_per_second))
    }

    /// Whether an event's payload passes its filter (`payload` parsed once per event, and
    /// only when some matching subscription has a filter).
    pub fn passes(&self, payload: &serde_json::Value) -> bool {
        match &self.spec.given.filter {
            None => true,
            Some(PayloadFilter { pointer, equals }) => payload.pointer(pointer) == Some(equals),
        }
    }

    /// How the API shows it; `with_secret` only in the answer that made it.
    pub fn view(&self, with_secret: bool) -> SubscriptionView {
        let given = &self.spec.given;
        SubscriptionView {
            id: self.id.to_string(),
            bucket: given.bucket.clone(),
            url: given.url.clone(),
            event_types: given.event_types.clone(),
            filter: given.filter.clone(),
            headers: given.headers.clone().unwrap_or_default(),
            secret: given.secret.clone().filter(|_| with_secret),
            ordering_key: given.ordering_key.clone(),
            enabled: self.enabled(),
            description: given.description.clone(),
            max_concurrency: given.max_concurrency,
            max_per_second: given.max_per_second,
            send_traceparent: given.send_traceparent != Some(false),
            created_at: self.spec.created_at,
            updated_at: self.spec.updated_at,
            version: self.version,
        }
    }
}

/// A policy that admits every address: stored subscriptions were checked when they were
/// given, and every delivery passes the guard anyway.
fn any_address() -> AddressPolicy {
    let all = [
        ipnet::IpNet::V4(ipnet::Ipv4Net::default()),
        ipnet::IpNet::V6(ipnet::Ipv6Net::default()),
    ];
    AddressPolicy::new(all.to_vec())
}

/// The parsed `event_types`: 1 to [`MAX_EVENT_TYPES`], each a valid pattern.
fn patterns_of(event_types: &[String]) -> Result<Vec<Pattern>, FieldError> {
    if event_types.is_empty() || event_types.len() > MAX_EVENT_TYPES {
        return Err(FieldError::new(
            "event_types",
            format!("must name 1 to {MAX_EVENT_TYPES} event types"),
        ));
    }
    event_types
        .iter()
        .enumerate()
        .map(|(i, t)| Pattern::parse(t, &format!("event_types[{i}]")))
        .collect()
}

/// The URL: as a job's endpoint, and not an IP literal the address guard blocks.
fn check_url(url: &str, policy: &AddressPolicy) -> Result<(), FieldError> {
    crate::rpc::rules::check_endpoint(url, "url")?;
    let parsed = url::Url::parse(url).map_err(|e| FieldError::new("url", e.to_string()))?;
    let literal: Option<IpAddr> = match parsed.host() {
        Some(url::Host::Ipv4(ip)) => Some(ip.into()),
        Some(url::Host::Ipv6(ip)) => Some(ip.into()),
        _ => None,
    };
    match literal.map(|ip| policy.check(ip)) {
        Some(Err(blocked)) => Err(FieldError::new("url", blocked.to_string())),
        _ => Ok(()),
    }
}

/// A job as the subscription makes them, with an empty body (and a stand-in ordering key
/// when it orders: the real one comes from each event).
fn sample_job(given: &NewSubscription) -> NewJob {
    let mut headers: BTreeMap<String, String> = given.headers.clone().unwrap_or_default();
    headers
        .entry("content-type".to_owned())
        .or_insert_with(|| "application/json".to_owned());
    NewJob {
        headers: Some(headers),
        execution_timeout_ms: given.execution_timeout_ms,
        backoff_min_delay_ms: given.backoff_min_delay_ms,
        backoff_coefficient: given.backoff_coefficient,
        ttl_ms: given.ttl_ms,
        ordering_key: given.ordering_key.as_ref().map(|_| "key".to_owned()),
        ordering_failure: given
            .ordering_key
            .as_ref()
            .map(|_| given.ordering_failure.unwrap_or(OrderingFailure::Release)),
        ..NewJob::new(given.bucket.clone(), given.url.clone())
    }
}

/// A subscription checked with the default limits and address guard (the unit tests').
#[cfg(test)]
pub(crate) fn check(given: NewSubscription) -> Result<Subscription, FieldError> {
    Subscription::check(
        Ulid::new(),
        given,
        &IntakeLimits::default(),
        &AddressPolicy::default(),
        Utc::now(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> NewSubscription {
        NewSubscription::new("tenant-1", "https://example.com/hook", ["invoice.*"])
    }

    #[test]
    fn a_valid_subscription_gets_a_secret_and_is_enabled() {
        let s = check(valid()).unwrap();
        assert!(s.enabled());
        let secret = s.spec.given.secret.clone().unwrap();
        assert!(secret.starts_with("whsec_"));
        assert_eq!(s.view(true).secret.as_deref(), Some(secret.as_str()));
        assert_eq!(s.view(false).secret, None);
        assert_eq!(s.patterns, vec![Pattern::Prefix("invoice.".into())]);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: Vec<(NewSubscription, &str)> = vec![
            (
                NewSubscription {
                    bucket: String::new(),
                    ..valid()
                },
                "bucket",
            ),
            (
                NewSubscription {
                    url: "ftp://x/".into(),
                    ..valid()
                },
                "url",
            ),
            (
                NewSubscription {
                    url: "http://127.0.0.1:9/x".into(),
                    ..valid()
                },
                "url",
            ),
            (
                NewSubscription {
                    url: "http://[::1]/x".into(),
                    ..valid()
                },
                "url",
            ),
            (
                NewSubscription {
                    url: "http://169.254.169.254/".into(),
                    ..valid()
                },
                "url",
            ),
            (
                NewSubscription {
                    event_types: vec![],
                    ..valid()
                },
                "event_types",
            ),
            (
                NewSubscription {
                    event_types: vec!["a".into(), "b c".into()],
                    ..valid()
                },
                "event_types[1]",
            ),
            (
                NewSubscription {
                    filter: Some(PayloadFilter {
                        pointer: "tier".into(),
                        equals: 1.into(),
                    }),
                    ..valid()
                },
                "filter.pointer",
            ),
            (
                NewSubscription {
                    ordering_key: Some("x".into()),
                    ..valid()
                },
                "ordering_key",
            ),
            (
                NewSubscription {
                    ordering_failure: Some(OrderingFailure::Block),
                    ..valid()
                },
                "ordering_failure",
            ),
            (
                NewSubscription {
                    secret: Some("nope".into()),
                    ..valid()
                },
                "secret",
            ),
            (
                NewSubscription {
                    execution_timeout_ms: Some(1),
                    ..valid()
                },
                "execution_timeout_ms",
            ),
            (
                NewSubscription {
                    headers: Some([("host".to_owned(), "x".to_owned())].into()),
                    ..valid()
                },
                "headers.host",
            ),
        ];
        for (given, field) in cases {
            let e = check(given).unwrap_err();
            assert_eq!(e.field, field, "{}", e.message);
        }
    }

    #[test]
    fn a_stored_row_keeps_its_secret_and_one_without_is_refused() {
        let made = check(valid()).unwrap();
        let again = Subscription::from_stored(made.id, made.spec.clone(), &IntakeLimits::default())
            .unwrap();
        assert_eq!(again.spec.given.secret, made.spec.given.secret);
        let mut lost = made.spec.clone();
        lost.given.secret = None;
        let e = Subscription::from_stored(made.id, lost, &IntakeLimits::default()).unwrap_err();
        assert_eq!(e.field, "secret");
    }

    #[test]
    fn an_allowed_subnet_admits_its_literals() {
        let policy = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]);
        let given = NewSubscription {
            url: "http://127.0.0.1:9/x".into(),
            ..valid()
        };
        assert!(Subscription::check(
            Ulid::new(),
            given,
            &IntakeLimits::default(),
            &policy,
            Utc::now()
        )
        .is_ok());
    }

    #[test]
    fn filters_compare_the_value_at_the_pointer() {
        let s = check(NewSubscription {
            filter: Some(PayloadFilter {
                pointer: "/customer/tier".into(),
                equals: "gold".into(),
            }),
            ..valid()
        })
        .unwrap();
        assert!(s.passes(&serde_json::json!({"customer": {"tier": "gold"}})));
        assert!(!s.passes(&serde_json::json!({"customer": {"tier": "silver"}})));
        assert!(!s.passes(&serde_json::json!({"customer": 3})));
        assert!(check(valid()).unwrap().passes(&serde_json::json!(null)));
    }
}
