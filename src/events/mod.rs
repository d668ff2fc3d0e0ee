//! Events and subscriptions: a producer publishes one event of a bucket; every subscription
//! of that bucket whose event types (and payload filter) match gets a job of its own, and all
//! of those jobs are written in one transaction (the writer's `Submit`), so a subscriber never
//! gets an event that another matching subscriber will never get.
//!
//! - [`subscription`]: what a subscription is, and checking one an operator gives.
//! - [`matching`]: the in-memory index that finds an event's subscriptions (by bucket, then
//!   exact type, then each dotted prefix of the type; never a scan of every subscription).
//! - [`store`]: the control database that keeps subscriptions (they outlive JobDB cycling).
//! - [`cache`]: each process's copy of the store, refreshed within a second of a change.
//! - [`publish`]: an event becomes its jobs.
//! - [`http`]: the subscription API (`/v1/subscriptions`), served by Directors.
//!
//! Event types are dot-separated names (`invoice.paid`); a subscription names exact types,
//! prefix wildcards (`invoice.*`: `invoice.paid`, `invoice.line.added`) or `*`.

pub mod cache;
pub mod http;
pub mod matching;
pub mod publish;
pub mod store;
pub mod subscription;

use crate::rpc::api::FieldError;

pub use cache::{Cap, EditError, Edited, EndpointCaps, SubscriptionGate, Subscriptions};
pub use matching::Index;
pub use store::{ControlDb, StoreError};
pub use subscription::Subscription;

pub use crate::job::MAX_EVENT_TYPE_BYTES;

/// Checks an event type: dot-separated names of ASCII letters, digits, `_` and `-`, at most
/// [`MAX_EVENT_TYPE_BYTES`].
pub fn check_event_type(event_type: &str, field: &str) -> Result<(), FieldError> {
    if event_type.is_empty() || event_type.len() > MAX_EVENT_TYPE_BYTES {
        return Err(FieldError::new(
            field,
            format!("must be 1 to {MAX_EVENT_TYPE_BYTES} bytes"),
        ));
    }
    if !crate::job::valid_event_type(event_type) {
        return Err(FieldError::new(
            field,
            "must be dot-separated names of letters, digits, '_' and '-' (e.g. invoice.paid)",
        ));
    }
    Ok(())
}

/// Which event types a subscription wants: one of its `event_types`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Exactly this type.
    Exact(String),
    /// Every type that starts with this text, which ends with a dot (`invoice.*` is
    /// `Prefix("invoice.")`).
    Prefix(String),
    /// Every type (`*`).
    All,
}

impl Pattern {
    /// Parses one of a subscription's `event_types`; `field` names it in the error.
    pub fn parse(text: &str, field: &str) -> Result<Pattern, FieldError> {
        if text == "*" {
            return Ok(Pattern::All);
        }
        if let Some(stem) = text.strip_suffix(".*") {
            check_event_type(stem, field).map_err(|e| {
                FieldError::new(
                    e.field,
                    "a wildcard is an event type followed by .* (e.g. invoice.*), or *",
                )
            })?;
            return Ok(Pattern::Prefix(format!("{stem}.")));
        }
        check_event_type(text, field)?;
        Ok(Pattern::Exact(text.to_owned()))
    }

    /// Whether `event_type` is one this pattern wants.
    pub fn matches(&self, event_type: &str) -> bool {
        match self {
            Pattern::Exact(t) => t == event_type,
            Pattern::Prefix(p) => event_type.starts_with(p.as_str()),
            Pattern::All => true,
        }
    }
}

/// A process's subscriptions, or the `503` every events and subscriptions route answers when
/// it runs without a control database.
pub fn configured(
    subscriptions: &Option<std::sync::Arc<Subscriptions>>,
) -> Result<&std::sync::Arc<Subscriptions>, crate::rpc::error::ApiError> {
    subscriptions.as_ref().ok_or_else(|| {
        crate::rpc::error::ApiError::Unavailable(
            "no control database is configured (--control-db): events and subscriptions are off"
                .into(),
        )
    })
}

/// Checks a JSON pointer (RFC 6901): empty, or `/`-separated tokens where `~` is only ever
/// `~0` or `~1`.
pub fn check_pointer(pointer: &str, field: &str) -> Result<(), FieldError> {
    let bad = || {
        FieldError::new(
            field,
            "must be a JSON pointer: empty, or starting with '/' (e.g. /customer/id), \
             '~' only as ~0 or ~1",
        )
    };
    if pointer.len() > 1024 {
        return Err(FieldError::new(field, "is longer than 1024 bytes"));
    }
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err(bad());
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(bad());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_are_dotted_names() {
        for good in ["invoice", "invoice.paid", "a-b.c_d.E9"] {
            assert!(check_event_type(good, "t").is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "invoice.",
            ".paid",
            "invoice..paid",
            "in voice",
            "é",
            "a.*",
        ] {
            let e = check_event_type(bad, "event_type").unwrap_err();
            assert_eq!(e.field, "event_type", "{bad}");
        }
        assert!(check_event_type(&"a".repeat(256), "t").is_err());
    }

    #[test]
    fn patterns_match_exact_prefix_and_all() {
        let p = |t| Pattern::parse(t, "event_types[0]").unwrap();
        assert!(p("invoice.paid").matches("invoice.paid"));
        assert!(!p("invoice.paid").matches("invoice.paid.late"));
        assert!(p("invoice.*").matches("invoice.paid"));
        assert!(p("invoice.*").matches("invoice.line.added"));
        assert!(!p("invoice.*").matches("invoice"));
        assert!(!p("invoice.*").matches("invoices.paid"));
        assert!(p("*").matches("anything.at.all"));
        for bad in ["invoice*", "*.paid", "invoice.*.x", ".*", "**"] {
            assert_eq!(
                Pattern::parse(bad, "event_types[2]").unwrap_err().field,
                "event_types[2]",
                "{bad}"
            );
        }
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        for good in ["", "/", "/a", "/a/0", "/a~0b/c~1d"] {
            assert!(check_pointer(good, "p").is_ok(), "{good}");
        }
        for bad in ["a", "a/b", "/a~", "/a~2", "#/a"] {
            assert_eq!(
                check_pointer(bad, "filter.pointer").unwrap_err().field,
                "filter.pointer"
            );
        }
    }
}
