//! Classification of an attempt's result into a typed verdict, separate from the backoff policy.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// What to do with a job after an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered (2xx).
    Succeeded,
    /// A permanent failure: retrying cannot help.
    Discard {
        /// Short failure kind recorded on the transition.
        error_type: &'static str,
    },
    /// A transient failure: retry after the job's backoff, or later if the endpoint asked.
    Retry {
        /// Short failure kind recorded on the transition.
        error_type: &'static str,
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
            error_type: "redirect",
        },
        300..=399 => Verdict::Retry {
            error_type: "redirect",
            retry_after,
        },
        408 => Verdict::Retry {
            error_type: "request-timeout",
            retry_after,
        },
        425 | 429 => Verdict::Retry {
            error_type: "rate-limited",
            retry_after,
        },
        400..=499 => Verdict::Discard {
            error_type: "client-error",
        },
        _ => Verdict::Retry {
            error_type: "server-error",
            retry_after,
        },
    }
}

/// Parses `Retry-After`: delay-seconds or an HTTP-date (relative to `now`).
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let at: DateTime<Utc> = at.into();
    Some((at - now).to_std().unwrap_or(Duration::ZERO))
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
                error_type: "rate-limited",
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
}
