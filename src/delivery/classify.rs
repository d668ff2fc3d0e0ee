//! Classification of an attempt's result into a typed verdict, separate from the backoff policy.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::job::ErrorType;

/// What to do with a job after an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered (2xx).
    Succeeded,
    /// A permanent failure: retrying cannot help.
    Discard {
        /// The failure kind recorded on the transition.
        error_type: ErrorType,
    },
    /// A transient failure: retry after the job's backoff, or later if the endpoint asked.
    Retry {
        /// The failure kind recorded on the transition.
        error_type: ErrorType,
        /// The endpoint's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
}

/// Classifies an HTTP status (redirects are never followed, so 3xx arrive here).
///
/// 2xx succeed. 408, 425 and 429 and every 5xx are retried, as are 3xx other than the permanent
/// 301/308 (a temporary redirect is usually maintenance). Every other 4xx, and 301/308, is
/// discarded: the endpoint will give the same answer to the same request.
pub fn classify_status(status: u16, retry_after: Option<Duration>) -> Verdict {
    match status {
        200..=299 => Verdict::Succeeded,
        301 | 308 => Verdict::Discard {
            error_type: ErrorType::Redirect,
        },
        300..=399 => Verdict::Retry {
            error_type: ErrorType::Redirect,
            retry_after,
        },
        408 => Verdict::Retry {
            error_type: ErrorType::RequestTimeout,
            retry_after,
        },
        425 | 429 => Verdict::Retry {
            error_type: ErrorType::RateLimited,
            retry_after,
        },
        400..=499 => Verdict::Discard {
            error_type: ErrorType::ClientError,
        },
        _ => Verdict::Retry {
            error_type: ErrorType::ServerError,
            retry_after,
        },
    }
}

/// The longest `Retry-After` taken from an endpoint, whatever it says: a week. The scheduler
/// clamps further (to the backoff cap and the job's expiry); this bound keeps every later
/// computation far from overflow.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// Parses `Retry-After`: delay-seconds or an HTTP-date (relative to `now`), at most
/// [`MAX_RETRY_AFTER`]. An endpoint's header is hostile input: any number of digits, any date
/// `httpdate` accepts, and nothing here can overflow or panic.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "a very long time".
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs.min(MAX_RETRY_AFTER.as_secs())));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let now = std::time::SystemTime::from(now);
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_verdicts() {
        assert_eq!(classify_status(200, None), Verdict::Succeeded);
        assert_eq!(classify_status(204, None), Verdict::Succeeded);
        for discard in [400, 401, 403, 404, 410, 422, 301, 308] {
            assert!(
                matches!(classify_status(discard, None), Verdict::Discard { .. }),
                "{discard}"
            );
        }
        for retry in [302, 307, 408, 425, 429, 500, 502, 503, 504] {
            assert!(
                matches!(classify_status(retry, None), Verdict::Retry { .. }),
                "{retry}"
            );
        }
        let ra = Some(Duration::from_secs(3));
        assert_eq!(
            classify_status(429, ra),
            Verdict::Retry {
                error_type: ErrorType::RateLimited,
                retry_after: ra
            }
        );
    }

    #[test]
    fn retry_after_accepts_seconds_and_dates() {
        let now = Utc::now();
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        let later = now + chrono::Duration::seconds(30);
        let text = httpdate::fmt_http_date(later.into());
        let got = parse_retry_after(&text, now).unwrap();
        assert!(
            got <= Duration::from_secs(30) && got >= Duration::from_secs(28),
            "{got:?}"
        );
        let past = httpdate::fmt_http_date((now - chrono::Duration::seconds(30)).into());
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn hostile_retry_after_is_clamped() {
        let now = Utc::now();
        for huge in [
            "99999999999999",
            "18446744073709551615",
            "99999999999999999999999999",
        ] {
            assert_eq!(
                parse_retry_after(huge, now),
                Some(MAX_RETRY_AFTER),
                "{huge}"
            );
        }
        let far = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now);
        assert_eq!(far, Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("", now), None);
    }
}
