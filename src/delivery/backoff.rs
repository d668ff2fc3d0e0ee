//! The backoff formula: a pure function of (policy, attempt, a random draw).

use std::time::Duration;

use crate::job::RetryPolicy;

/// Share of the nominal delay that jitter may remove: a delay lies in `[(1 − J)·d, d]`.
///
/// Jitter spreads retries of jobs that failed together (an outage) so they do not return in
/// lock-step; taking it only *below* the nominal delay keeps successive delays growing for any
/// coefficient ≥ 1.25 and never waits longer than the policy promises.
pub const JITTER: f64 = 0.2;

/// Delay before attempt `failed_attempt + 1`, given that attempt `failed_attempt` (1-based) failed.
///
/// `min_delay × coefficient^(failed_attempt − 1)`, capped at `cap`, then scaled by
/// `1 − JITTER × unit` where `unit` is a uniform draw in `[0, 1)`.
pub fn delay(policy: &RetryPolicy, failed_attempt: u16, cap: Duration, unit: f64) -> Duration {
    let exponent = i32::from(failed_attempt.max(1)) - 1;
    let nominal = policy.min_delay.as_secs_f64() * policy.coefficient.powi(exponent);
    let capped = if nominal.is_finite() {
        nominal.min(cap.as_secs_f64())
    } else {
        cap.as_secs_f64()
    };
    let unit = unit.clamp(0.0, 1.0);
    Duration::from_secs_f64(capped * (1.0 - JITTER * unit))
}

/// How long a job waits after failed attempt `failed_attempt`: its jittered backoff, at least
/// `floor`, and at least what the endpoint asked for in `Retry-After` (that request clamped to
/// `cap`: an endpoint cannot park a job beyond the longest backoff). Never above
/// `max(cap, floor)`.
pub fn next_delay(
    policy: &RetryPolicy,
    failed_attempt: u16,
    cap: Duration,
    floor: Duration,
    retry_after: Option<Duration>,
    unit: f64,
) -> Duration {
    let own = delay(policy, failed_attempt, cap, unit).max(floor);
    match retry_after {
        Some(asked) => own.max(asked.min(cap)),
        None => own,
    }
}

/// The un-jittered delay, for tests and documentation: the upper bound of [`delay`].
pub fn nominal(policy: &RetryPolicy, failed_attempt: u16, cap: Duration) -> Duration {
    delay(policy, failed_attempt, cap, 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(ms: u64, coefficient: f64) -> RetryPolicy {
        RetryPolicy {
            min_delay: Duration::from_millis(ms),
            coefficient,
        }
    }

    #[test]
    fn grows_geometrically_until_the_cap() {
        let p = policy(100, 2.0);
        let cap = Duration::from_secs(1);
        let got: Vec<u128> = (1..=6).map(|a| nominal(&p, a, cap).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn jitter_stays_within_bounds_and_below_nominal() {
        let p = policy(1000, 2.0);
        let cap = Duration::from_secs(3600);
        for unit in [0.0, 0.25, 0.5, 0.999] {
            let d = delay(&p, 3, cap, unit);
            assert!(d <= Duration::from_millis(4000), "{d:?}");
            assert!(d >= Duration::from_millis(3200), "{d:?}");
        }
        assert!(delay(&p, 3, cap, 0.5) < delay(&p, 3, cap, 0.0));
    }

    #[test]
    fn the_next_delay_has_a_floor_and_clamps_retry_after() {
        let cap = Duration::from_secs(3600);
        let floor = Duration::from_millis(100);
        let hasty = policy(1, 1.0);
        assert_eq!(next_delay(&hasty, 9, cap, floor, None, 0.0), floor);
        let asked = Some(Duration::from_secs(u32::MAX.into()));
        assert_eq!(next_delay(&hasty, 1, cap, floor, asked, 0.0), cap);
        let small = Some(Duration::from_secs(2));
        assert_eq!(
            next_delay(&hasty, 1, cap, floor, small, 0.0),
            Duration::from_secs(2)
        );
        let slow = policy(10_000, 2.0);
        assert_eq!(
            next_delay(&slow, 1, cap, floor, small, 0.0),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn huge_exponents_do_not_overflow() {
        let p = policy(1000, 10.0);
        let cap = Duration::from_secs(3600);
        assert_eq!(nominal(&p, u16::MAX, cap), cap);
    }
}
