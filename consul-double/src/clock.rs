//! The double's virtual clock. Session TTLs, check TTLs and lock-delays are measured on it,
//! so tests can freeze it or move it forward; blocking-query timeouts use real time.

use std::time::{Duration, Instant};

/// A monotonic clock that follows real time unless frozen, and can be advanced by hand.
/// Readings are durations since the clock was created.
#[derive(Debug)]
pub(crate) struct Clock {
    start: Instant,
    /// Signed nanoseconds added to real elapsed time (advances, and the gap left by a freeze).
    skew_ns: i128,
    /// The reading at which the clock is frozen, if it is.
    frozen: Option<Duration>,
}

impl Clock {
    /// A running clock reading zero now.
    pub(crate) fn new() -> Self {
        Clock {
            start: Instant::now(),
            skew_ns: 0,
            frozen: None,
        }
    }

    /// The current virtual time.
    pub(crate) fn now(&self) -> Duration {
        if let Some(at) = self.frozen {
            return at;
        }
        let ns = self.start.elapsed().as_nanos() as i128 + self.skew_ns;
        Duration::from_nanos(ns.clamp(0, u64::MAX as i128) as u64)
    }

    /// Stops the clock at its current reading.
    pub(crate) fn freeze(&mut self) {
        if self.frozen.is_none() {
            self.frozen = Some(self.now());
        }
    }

    /// Lets a frozen clock run again from the reading it was frozen at.
    pub(crate) fn resume(&mut self) {
        if let Some(at) = self.frozen.take() {
            self.skew_ns = at.as_nanos() as i128 - self.start.elapsed().as_nanos() as i128;
        }
    }

    /// Moves the clock forward by `d` (frozen or not).
    pub(crate) fn advance(&mut self, d: Duration) {
        match self.frozen.as_mut() {
            Some(at) => *at += d,
            None => self.skew_ns += d.as_nanos() as i128,
        }
    }

    /// Real time to wait until the virtual `deadline`, or `None` when frozen (only a manual
    /// advance can then reach it).
    pub(crate) fn real_wait_until(&self, deadline: Duration) -> Option<Duration> {
        if self.frozen.is_some() {
            return None;
        }
        Some(deadline.saturating_sub(self.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freeze_advance_resume() {
        let mut c = Clock::new();
        c.freeze();
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(10));
        assert_eq!(c.now(), t0 + Duration::from_secs(10));
        assert_eq!(c.real_wait_until(t0), None);
        c.resume();
        assert!(c.now() >= t0 + Duration::from_secs(10));
        assert!(c.now() < t0 + Duration::from_secs(11));
        c.advance(Duration::from_secs(5));
        assert!(c.now() >= t0 + Duration::from_secs(15));
    }
}
