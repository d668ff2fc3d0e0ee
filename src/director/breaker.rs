//! The per-endpoint circuit breaker: an endpoint whose recent attempts mostly fail gets one
//! probe at a time, at growing intervals, instead of its full concurrency, so an outage cannot
//! turn into a retry storm; the first success restores full speed.
//!
//! Jobs held back by an open breaker wait in their queue without using an attempt, so an
//! outage does not burn their retry schedule either.
//!
//! "Failing" is the endpoint telling us it cannot take the request now: no answer, a server
//! error, a timeout, and also 429/425 (too many requests). A job's own `Retry-After` only
//! delays that job; an endpoint that answers 429 to everything would otherwise be hammered by
//! its other jobs, so a mostly-429 endpoint is probed like a down one, no sooner than it asked.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// When a breaker opens and how it probes.
#[derive(Clone, Copy, Debug)]
pub struct BreakerConfig {
    /// Outcomes remembered per endpoint.
    pub window: usize,
    /// Fewest outcomes in the window before the breaker may open.
    pub min_attempts: usize,
    /// Share of failures in the window that opens it (`0.0..=1.0`; above 1 never opens).
    pub failure_ratio: f64,
    /// Wait before the first probe; doubled after each failed probe.
    pub probe_min: Duration,
    /// Longest wait between probes.
    pub probe_max: Duration,
}

/// The default share of failures that opens a breaker.
pub const FAILURE_RATIO: f64 = 0.8;
/// The default wait before a first probe.
pub const PROBE_MIN: Duration = Duration::from_secs(1);
/// The default longest wait between probes.
pub const PROBE_MAX: Duration = Duration::from_secs(30);

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            window: 20,
            min_attempts: 10,
            failure_ratio: FAILURE_RATIO,
            probe_min: PROBE_MIN,
            probe_max: PROBE_MAX,
        }
    }
}

/// What an endpoint may start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allowance {
    /// Its full concurrency.
    Full,
    /// One probe.
    Probe,
    /// Nothing until this instant (`None`: until the probe in flight ends).
    Wait(Option<Instant>),
}

/// What recording an outcome changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing visible.
    None,
    /// The endpoint is considered down: probes only.
    Opened,
    /// The endpoint answered again: full speed.
    Closed,
}

#[derive(Clone, Copy, Debug)]
struct Open {
    next_probe: Instant,
    interval: Duration,
    probing: bool,
}

/// One endpoint's breaker.
#[derive(Clone, Debug, Default)]
pub struct Breaker {
    recent: VecDeque<bool>,
    failures: usize,
    open: Option<Open>,
}

impl Breaker {
    /// Whether it is open (the endpoint is treated as down).
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Whether it remembers nothing worth keeping (closed, no outcomes).
    pub fn is_idle(&self) -> bool {
        self.open.is_none() && self.recent.is_empty()
    }

    /// Outcomes remembered while closed: (attempts, failures).
    pub fn recent(&self) -> (usize, usize) {
        (self.recent.len(), self.failures)
    }

    /// What may start at `now`.
    pub fn allowance(&self, now: Instant) -> Allowance {
        match self.open {
            None => Allowance::Full,
            Some(Open { probing: true, .. }) => Allowance::Wait(None),
            Some(Open { next_probe, .. }) if now >= next_probe => Allowance::Probe,
            Some(Open { next_probe, .. }) => Allowance::Wait(Some(next_probe)),
        }
    }

    /// A probe was started.
    pub fn probe_started(&mut self) {
        if let Some(open) = &mut self.open {
            open.probing = true;
        }
    }

    /// The probe started was never sent (its lane paused, or its start could not be
    /// committed): another may go at once, as if it had not been started.
    pub fn probe_abandoned(&mut self) {
        if let Some(open) = &mut self.open {
            open.probing = false;
        }
    }

    /// Records an attempt's outcome (`ok`: the endpoint is up, whatever the job's fate), with
    /// the endpoint's `Retry-After` (no probe before it, up to `probe_max`).
    pub fn record(
        &mut self,
        ok: bool,
        now: Instant,
        config: &BreakerConfig,
        retry_after: Option<Duration>,
    ) -> Change {
        let asked = retry_after.unwrap_or_default().min(config.probe_max);
        if let Some(open) = &mut self.open {
            if ok {
                self.open = None;
                self.recent.clear();
                self.failures = 0;
                return Change::Closed;
            }
            if open.probing {
                open.probing = false;
                open.interval = (open.interval * 2).min(config.probe_max);
                open.next_probe = now + open.interval.max(asked);
            }
            return Change::None;
        }
        self.recent.push_back(ok);
        if !ok {
            self.failures += 1;
        }
        while self.recent.len() > config.window.max(1) {
            if self.recent.pop_front() == Some(false) {
                self.failures -= 1;
            }
        }
        let seen = self.recent.len();
        if seen >= config.min_attempts && self.failures as f64 >= config.failure_ratio * seen as f64
        {
            self.open = Some(Open {
                next_probe: now + config.probe_min.max(asked),
                interval: config.probe_min,
                probing: false,
            });
            return Change::Opened;
        }
        Change::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_mostly_failures_probes_with_backoff_and_closes_on_success() {
        let config = BreakerConfig::default();
        let mut b = Breaker::default();
        let t0 = Instant::now();
        for _ in 0..9 {
            assert_eq!(b.record(false, t0, &config, None), Change::None);
        }
        assert_eq!(
            b.allowance(t0),
            Allowance::Full,
            "too few outcomes to judge"
        );
        assert_eq!(b.record(false, t0, &config, None), Change::Opened);
        assert_eq!(
            b.allowance(t0),
            Allowance::Wait(Some(t0 + config.probe_min))
        );
        let t1 = t0 + config.probe_min;
        assert_eq!(b.allowance(t1), Allowance::Probe);
        b.probe_started();
        assert_eq!(b.allowance(t1), Allowance::Wait(None));
        // A probe never sent leaves the way open for the next one, without a longer wait.
        b.probe_abandoned();
        assert_eq!(b.allowance(t1), Allowance::Probe);
        b.probe_started();
        // A failed probe doubles the wait.
        assert_eq!(b.record(false, t1, &config, None), Change::None);
        assert_eq!(
            b.allowance(t1),
            Allowance::Wait(Some(t1 + 2 * config.probe_min))
        );
        // The interval stops growing at probe_max.
        let mut t = t1;
        for _ in 0..10 {
            t += config.probe_max;
            b.probe_started();
            b.record(false, t, &config, None);
        }
        assert_eq!(b.allowance(t), Allowance::Wait(Some(t + config.probe_max)));
        assert_eq!(b.record(true, t, &config, None), Change::Closed);
        assert_eq!(b.allowance(t), Allowance::Full);
        assert!(b.is_idle());
    }

    #[test]
    fn probes_wait_for_what_the_endpoint_asked_up_to_the_max() {
        let config = BreakerConfig::default();
        let mut b = Breaker::default();
        let t0 = Instant::now();
        let asked = Some(Duration::from_secs(7));
        for _ in 0..10 {
            b.record(false, t0, &config, asked);
        }
        assert_eq!(
            b.allowance(t0),
            Allowance::Wait(Some(t0 + Duration::from_secs(7)))
        );
        let t1 = t0 + Duration::from_secs(7);
        b.probe_started();
        b.record(
            false,
            t1,
            &config,
            Some(Duration::from_secs(u32::MAX.into())),
        );
        assert_eq!(
            b.allowance(t1),
            Allowance::Wait(Some(t1 + config.probe_max)),
            "an endpoint cannot push its probes past probe_max"
        );
    }

    #[test]
    fn a_mostly_healthy_endpoint_stays_closed() {
        let config = BreakerConfig::default();
        let mut b = Breaker::default();
        let now = Instant::now();
        for i in 0..200 {
            // 75% failures stay under the 80% threshold.
            assert_eq!(b.record(i % 4 == 0, now, &config, None), Change::None);
        }
        assert!(!b.is_open());
    }
}
