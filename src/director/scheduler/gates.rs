//! The gates: what may hold a lane or a bucket back. Circuit breakers (an endpoint that mostly
//! fails gets one probe at a time), parks (an endpoint that failed for too long gets a probe
//! now and then, and its jobs go at a growing pace once it is unparked), request-rate limits
//! (governor token buckets), operator controls (pauses, concurrency caps), the jobs set aside
//! behind a paused bucket, and the lane timers that look at a gated lane again when it may go on.
//!
//! [`Gates::limit`] is the one answer the queues need: how many attempts a lane may have under
//! way now, or until when it must wait.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::time::Instant;

use crate::director::breaker::{Allowance, Breaker, BreakerConfig, Change};
use crate::director::parks::ParkPolicy;
use crate::job::JobId;
use crate::registry::controls::{Controls, EndpointControl};
use crate::registry::parks::Park;

/// What a lane may start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Limit {
    /// Up to this many attempts under way.
    Open(usize),
    /// Its breaker is open: one probe, when nothing else of it is under way.
    Probe,
    /// Nothing until this instant (`None`: until the probe in flight ends).
    Wait(Option<Instant>),
    /// An operator paused it.
    Paused,
}

/// What recording an outcome changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Recorded {
    /// Nothing visible.
    Nothing,
    /// The breaker opened: the endpoint is treated as down.
    Opened,
    /// The breaker closed; it had opened at this instant (if known).
    Closed(Option<Instant>),
}

/// A lane's request-rate limit.
struct Rate {
    /// The rate it was built for (a changed control builds a new one).
    per_second: f64,
    /// Paces the attempts the lane begins.
    limiter: DefaultDirectRateLimiter,
    /// Out of tokens until this instant.
    until: Option<Instant>,
    /// Paces the requests the lane sends: attempts begun at their pace whose commit lands
    /// late (a slow or held JobDB) would otherwise all go out at once.
    sends: DefaultDirectRateLimiter,
}

/// What holds a due job set aside: its bucket, paused, or its subscription, waiting.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Aside {
    /// A paused bucket.
    Bucket(Arc<str>),
    /// A subscription that is disabled or not known here.
    Subscription(ulid::Ulid),
}

/// Former places a paused bucket's list may hold beyond its jobs set aside before it is pruned.
pub(super) const PRUNE_AFTER: usize = 64;

/// Breakers, parks, rate limits, controls, jobs set aside and lane timers.
pub(super) struct Gates {
    /// `--endpoint-concurrency`: requests in flight per endpoint unless a control lowers it.
    per_endpoint: usize,
    breaker_config: BreakerConfig,
    /// When a failing lane is parked, how a parked one is probed and an unparked one paced.
    park_policy: ParkPolicy,
    /// When each parked lane may send its next probe (none yet: at once).
    next_probes: HashMap<Arc<str>, Instant>,
    /// Circuit breakers by lane, with when each last saw an outcome; they outlive idle lanes
    /// (a down endpoint's jobs may all be waiting on timers) and are forgotten a while after
    /// their last outcome.
    breakers: HashMap<Arc<str>, (Breaker, Instant)>,
    /// When each open breaker opened.
    opened_at: HashMap<Arc<str>, Instant>,
    /// When breakers were last pruned.
    pruned: Instant,
    /// Request-rate limits of rate-limited lanes.
    rates: HashMap<Arc<str>, Rate>,
    /// Endpoint and bucket controls in force.
    controls: Arc<Controls>,
    /// Subscriptions whose jobs wait (disabled, or not known here): set aside as a paused
    /// bucket's are.
    subscriptions: Arc<crate::events::SubscriptionGate>,
    /// Lanes to look at again at an instant (a breaker's next probe, a rate limit's token).
    timers: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
    /// The instant each lane's timer is set for (one timer per lane and instant).
    wakes: HashMap<Arc<str>, Instant>,
    /// Due jobs of paused buckets and of waiting subscriptions, by what holds them (ids of
    /// jobs that left since are skipped).
    aside: HashMap<Aside, Vec<JobId>>,
    /// Jobs set aside.
    aside_count: usize,
    /// Ids in `aside`, former places included.
    aside_places: usize,
}

impl Gates {
    /// Gates with no controls, every breaker closed.
    pub(super) fn new(
        per_endpoint: usize,
        breaker_config: BreakerConfig,
        park_policy: ParkPolicy,
    ) -> Self {
        Gates {
            per_endpoint,
            breaker_config,
            park_policy,
            next_probes: HashMap::new(),
            breakers: HashMap::new(),
            opened_at: HashMap::new(),
            pruned: Instant::now(),
            rates: HashMap::new(),
            controls: Arc::default(),
            subscriptions: Arc::default(),
            timers: BinaryHeap::new(),
            wakes: HashMap::new(),
            aside: HashMap::new(),
            aside_count: 0,
            aside_places: 0,
        }
    }

    /// Requests an endpoint may have in flight here: `--endpoint-concurrency`, lowered by
    /// its control; 0 while it is paused.
    pub(super) fn concurrency(&self, key: &str) -> usize {
        match self.controls.endpoints.get(key) {
            Some(c) if c.paused => 0,
            Some(c) => c.max_concurrency.map_or(self.per_endpoint, |cap| {
                self.per_endpoint.min(cap.max(1) as usize)
            }),
            None => self.per_endpoint,
        }
    }

    /// What the lane may start at `now`.
    pub(super) fn limit(&self, key: &str, now: Instant) -> Limit {
        let concurrency = self.concurrency(key);
        if concurrency == 0 {
            return Limit::Paused;
        }
        if self.parked(key).is_some() {
            // Its own probe timer, whatever the breaker says: a Director started since the
            // park has no breaker open, and an open one probes far more often.
            return match self.next_probes.get(key) {
                Some(at) if *at > now => Limit::Wait(Some(*at)),
                _ => Limit::Probe,
            };
        }
        let allowance = self
            .breakers
            .get(key)
            .map_or(Allowance::Full, |(b, _)| b.allowance(now));
        let token_at = self
            .rates
            .get(key)
            .and_then(|r| r.until)
            .filter(|at| *at > now);
        match (allowance, token_at) {
            (Allowance::Full | Allowance::Probe, Some(at)) => Limit::Wait(Some(at)),
            (Allowance::Full, None) => Limit::Open(concurrency),
            (Allowance::Probe, None) => Limit::Probe,
            (Allowance::Wait(at), _) => Limit::Wait(at),
        }
    }

    /// Takes a request token of a rate-limited lane for an attempt about to start:
    /// `Err(at)` when there is none before `at` (the lane then waits; see [`Gates::limit`]).
    pub(super) fn take_token(&mut self, key: &Arc<str>, now: Instant) -> Result<(), Instant> {
        let Some(rate) = self.rate_of(key) else {
            return Ok(());
        };
        let taken = token(&rate.limiter, now);
        rate.until = taken.err();
        taken
    }

    /// Takes a request token of a rate-limited lane for a begun attempt about to be sent:
    /// `Err(at)` when there is none before `at` (the attempt waits, begun, until then).
    pub(super) fn take_send_token(&mut self, key: &Arc<str>, now: Instant) -> Result<(), Instant> {
        match self.rate_of(key) {
            Some(rate) => token(&rate.sends, now),
            None => Ok(()),
        }
    }

    /// The lane's rate limit, built on first use from its control and its re-drive pace, and
    /// again when either changes (`None`: not limited).
    fn rate_of(&mut self, key: &Arc<str>) -> Option<&mut Rate> {
        let Some((per_second, quota)) = self.per_second(key).and_then(|r| Some((r, quota(r)?)))
        else {
            // A pace that has ended leaves no limiter (nor its last wait) behind.
            self.rates.remove(key);
            return None;
        };
        let rate = self
            .rates
            .entry(key.clone())
            .and_modify(|rate| {
                if rate.per_second != per_second {
                    *rate = Rate::new(per_second, quota);
                }
            })
            .or_insert_with(|| Rate::new(per_second, quota));
        Some(rate)
    }

    /// The lane's request rate now: its control's cap, lowered by the pace of its re-drive
    /// after an unpark.
    pub(super) fn per_second(&self, key: &str) -> Option<f64> {
        let capped = self
            .controls
            .endpoints
            .get(key)
            .and_then(|c| c.max_per_second)
            .filter(|r| quota(*r).is_some());
        let paced = self.redrive_pace(key);
        match (capped, paced) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The re-drive pace of a lane unparked lately (`None`: not paced).
    pub(super) fn redrive_pace(&self, key: &str) -> Option<f64> {
        let since = self.unparked_since(key)?;
        self.redrive_of(key).per_second(since)
    }

    /// The pace the lane's unpark asked for, else this Director's own.
    fn redrive_of(&self, key: &str) -> crate::director::parks::Redrive {
        self.controls
            .parks
            .get(key)
            .and_then(|p| p.redrive)
            .unwrap_or(self.park_policy.redrive)
    }

    /// How long ago the lane was unparked, if its record says it was.
    pub(super) fn unparked_since(&self, key: &str) -> Option<Duration> {
        let at = self.controls.parks.get(key)?.unparked_at?;
        Some((chrono::Utc::now() - at).to_std().unwrap_or_default())
    }

    /// How long `jobs` of the lane take at its re-drive pace (`None`: not paced).
    pub(super) fn redrive_eta(&self, key: &str, jobs: usize) -> Option<Duration> {
        let since = self.unparked_since(key)?;
        let redrive = self.redrive_of(key);
        redrive.per_second(since)?;
        redrive.eta(since, jobs)
    }

    /// Whether the lane has a rate limit: a request token taken ahead of a job that may not
    /// come would be lost.
    pub(super) fn is_rate_limited(&self, key: &str) -> bool {
        self.per_second(key).is_some()
    }

    /// The lane's park, if it is parked.
    pub(super) fn parked(&self, key: &str) -> Option<&Park> {
        self.controls.parked(key)
    }

    /// Every park record (parked and lately unparked).
    pub(super) fn parks(&self) -> impl Iterator<Item = &Park> {
        self.controls.parks.values()
    }

    /// How long the lane's breaker may stay open before the lane is parked, for jobs of
    /// `buckets`: the shortest of their policies (a bucket's own, else `--park-after-secs`;
    /// 0 or none: never).
    pub(super) fn park_after<'a>(
        &self,
        buckets: impl Iterator<Item = &'a Arc<str>>,
    ) -> Option<Duration> {
        buckets
            .filter_map(|b| match self.controls.park_after_secs(b) {
                Some(0) => None,
                Some(secs) => Some(Duration::from_secs(secs)),
                None => self.park_policy.after,
            })
            .min()
    }

    /// Lanes whose breaker is open, and since when.
    pub(super) fn open_since(&self) -> impl Iterator<Item = (&Arc<str>, Instant)> {
        self.opened_at.iter().map(|(key, at)| (key, *at))
    }

    /// Whether the lane's breaker is open.
    pub(super) fn is_open(&self, key: &str) -> bool {
        self.breakers.get(key).is_some_and(|(b, _)| b.is_open())
    }

    /// The lane's breaker, if it remembers anything.
    pub(super) fn breaker(&self, key: &str) -> Option<&Breaker> {
        self.breakers.get(key).map(|(b, _)| b)
    }

    /// Lanes whose breakers remember outcomes.
    pub(super) fn breaker_keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.breakers.keys()
    }

    /// The endpoint's control, if an operator set one.
    pub(super) fn control(&self, key: &str) -> Option<&EndpointControl> {
        self.controls.endpoints.get(key)
    }

    /// An attempt of the lane is starting: if its breaker is open, it is the probe (returns
    /// whether it is).
    pub(super) fn starting(&mut self, key: &str) -> bool {
        if self.parked(key).is_some() {
            let next = Instant::now() + self.park_policy.probe_every;
            self.next_probes.insert(key.into(), next);
            if let Some((breaker, _)) = self.breakers.get_mut(key) {
                if breaker.is_open() {
                    breaker.probe_started();
                }
            }
            return true;
        }
        match self.breakers.get_mut(key) {
            Some((breaker, _)) if breaker.is_open() => {
                breaker.probe_started();
                true
            }
            _ => false,
        }
    }

    /// The lane's probe will not be sent after all: the breaker may start another.
    pub(super) fn probe_abandoned(&mut self, key: &str) {
        self.next_probes.remove(key);
        if let Some((breaker, _)) = self.breakers.get_mut(key) {
            breaker.probe_abandoned();
        }
    }

    /// Whether attempts of the lane begun but without an HTTP slot yet must not be sent now:
    /// the lane is paused, or its breaker opened since they were picked (only its probe may
    /// go to an endpoint judged down).
    pub(super) fn holds_back(&self, key: &str) -> bool {
        self.concurrency(key) == 0
            || self.parked(key).is_some()
            || self.breakers.get(key).is_some_and(|(b, _)| b.is_open())
    }

    /// Feeds an attempt's outcome (`ok`: the endpoint is up, whatever the job's fate) to the
    /// lane's breaker, with the endpoint's `Retry-After`.
    pub(super) fn record(
        &mut self,
        key: &Arc<str>,
        ok: bool,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> Recorded {
        let (breaker, seen) = self
            .breakers
            .entry(key.clone())
            .or_insert_with(|| (Breaker::default(), now));
        *seen = now;
        let recorded = match breaker.record(ok, now, &self.breaker_config, retry_after) {
            Change::Opened => {
                self.opened_at.insert(key.clone(), now);
                Recorded::Opened
            }
            Change::Closed => Recorded::Closed(self.opened_at.remove(key)),
            Change::None => Recorded::Nothing,
        };
        if now.duration_since(self.pruned) > Duration::from_secs(60) {
            self.pruned = now;
            self.breakers.retain(|_, (b, seen)| {
                b.is_open() || now.duration_since(*seen) < Duration::from_secs(300)
            });
        }
        recorded
    }

    /// Whether the bucket is paused.
    pub(super) fn bucket_paused(&self, bucket: &str) -> bool {
        self.controls.bucket_paused(bucket)
    }

    /// Whether the subscription's jobs wait (it is disabled, or not known here).
    pub(super) fn subscription_waits(&self, subscription: &ulid::Ulid) -> bool {
        self.subscriptions.holds(subscription)
    }

    /// Where a due job waits instead of its queue, if it must: under its bucket while the
    /// bucket is paused, else under its subscription while that waits.
    pub(super) fn aside_key(&self, job: &crate::job::Job) -> Option<Aside> {
        if self.bucket_paused(&job.bucket) {
            return Some(Aside::Bucket(job.bucket.clone()));
        }
        job.event
            .as_ref()
            .filter(|e| self.subscription_waits(&e.subscription))
            .map(|e| Aside::Subscription(e.subscription))
    }

    /// Whether what holds jobs aside still holds them.
    fn holds(&self, aside: &Aside) -> bool {
        match aside {
            Aside::Bucket(bucket) => self.controls.bucket_paused(bucket),
            Aside::Subscription(id) => self.subscription_waits(id),
        }
    }

    /// Replaces whose jobs wait; returns whether the disabled ones changed (those whose
    /// queued jobs must be set aside now).
    pub(super) fn set_gate(&mut self, gate: Arc<crate::events::SubscriptionGate>) -> bool {
        let changed = !self.subscriptions.same_disabled(&gate);
        self.subscriptions = gate;
        changed
    }

    /// Replaces the controls in force. Rate limits whose rate changed start afresh.
    pub(super) fn set_controls(&mut self, controls: Arc<Controls>) {
        self.controls = controls;
        let rates = std::mem::take(&mut self.rates);
        self.rates = rates
            .into_iter()
            .filter(|(key, rate)| self.per_second(key) == Some(rate.per_second))
            .collect();
        let parks = &self.controls;
        self.next_probes
            .retain(|key, _| parks.parked(key).is_some());
    }

    /// Sets aside a due job of a paused bucket or a waiting subscription.
    pub(super) fn set_aside(&mut self, holder: Aside, id: JobId) {
        self.aside_count += 1;
        self.aside_places += 1;
        self.aside.entry(holder).or_default().push(id);
    }

    /// A job set aside left its place (queued again, or gone). Its id stays listed until a
    /// bucket resumes, unless former places outnumber the jobs set aside and [`PRUNE_AFTER`]: then
    /// the lists keep only jobs `still_aside` says are, once each (a job set aside again is
    /// listed again), so a long pause with jobs coming and going stays bounded.
    pub(super) fn left_aside(&mut self, still_aside: impl Fn(JobId) -> bool) {
        self.aside_count = self.aside_count.saturating_sub(1);
        let former = self.aside_places.saturating_sub(self.aside_count);
        if former > self.aside_count.max(PRUNE_AFTER) {
            self.prune_aside(still_aside);
        }
    }

    /// Ids in the lists of jobs set aside, former places included.
    #[cfg(test)]
    pub(super) fn aside_places(&self) -> usize {
        self.aside_places
    }

    /// Jobs set aside now.
    pub(super) fn aside_count(&self) -> usize {
        self.aside_count
    }

    /// Ids set aside under buckets no longer paused and subscriptions no longer waiting (check
    /// each still is), forgotten here.
    pub(super) fn take_resumed(&mut self) -> Vec<JobId> {
        let resumed: Vec<Aside> = self
            .aside
            .keys()
            .filter(|key| !self.holds(key))
            .cloned()
            .collect();
        let ids: Vec<JobId> = resumed
            .into_iter()
            .flat_map(|b| self.aside.remove(&b).unwrap_or_default())
            .collect();
        self.aside_places = self.aside_places.saturating_sub(ids.len());
        ids
    }

    /// Forgets ids no longer set aside, and former places of jobs set aside again.
    pub(super) fn prune_aside(&mut self, still_aside: impl Fn(JobId) -> bool) {
        let mut seen = HashSet::new();
        let mut places = 0;
        self.aside.retain(|_, ids| {
            ids.retain(|id| still_aside(*id) && seen.insert(*id));
            places += ids.len();
            !ids.is_empty()
        });
        self.aside_places = places;
    }

    /// Looks at the lane again at `at` (once per lane and instant).
    pub(super) fn wake_at(&mut self, key: &Arc<str>, at: Instant) {
        if self.wakes.get(key) != Some(&at) {
            self.wakes.insert(key.clone(), at);
            self.timers.push(Reverse((at, key.clone())));
        }
    }

    /// When the next lane timer fires.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// The next lane whose timer fired by `now`.
    pub(super) fn pop_wake(&mut self, now: Instant) -> Option<Arc<str>> {
        let Reverse((at, key)) = self.timers.peek().filter(|Reverse((at, _))| *at <= now)?;
        let (at, key) = (*at, key.clone());
        self.timers.pop();
        if self.wakes.get(&key) == Some(&at) {
            self.wakes.remove(&key);
        }
        Some(key)
    }
}

/// A token of `limiter`, or the instant one is due (never `now`: a lane told to wait for
/// nothing would be picked again at once).
fn token(limiter: &DefaultDirectRateLimiter, now: Instant) -> Result<(), Instant> {
    limiter.check().map_err(|not_until| {
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        now + wait.max(Duration::from_millis(1))
    })
}

/// The quota of a request rate, if it is usable: a burst of at most one second's worth (at
/// least one request). Rates that are not finite and positive, or too small or large to
/// express, mean no limit.
fn quota(per_second: f64) -> Option<Quota> {
    if !(per_second.is_finite() && per_second > 0.0) {
        return None;
    }
    let period = Duration::try_from_secs_f64(1.0 / per_second).ok()?;
    let burst = NonZeroU32::new(per_second.clamp(1.0, f64::from(u32::MAX)) as u32)?;
    Some(Quota::with_period(period)?.allow_burst(burst))
}

impl Rate {
    fn new(per_second: f64, quota: Quota) -> Self {
        Rate {
            per_second,
            limiter: RateLimiter::direct(quota),
            until: None,
            sends: RateLimiter::direct(quota),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(endpoint: &str) -> EndpointControl {
        EndpointControl::unset(endpoint, "test")
    }

    fn gates_with(controls: Vec<EndpointControl>) -> Gates {
        let mut gates = Gates::new(8, BreakerConfig::default(), ParkPolicy::default());
        let mut all = Controls::default();
        for c in controls {
            all.endpoints.insert(c.endpoint.clone(), c);
        }
        gates.set_controls(Arc::new(all));
        gates
    }

    #[test]
    fn an_unknown_lane_is_open_at_full_concurrency() {
        let gates = gates_with(vec![]);
        assert_eq!(gates.limit("http://a/", Instant::now()), Limit::Open(8));
    }

    #[test]
    fn controls_pause_and_cap_a_lane() {
        let mut paused = control("http://a/");
        paused.paused = true;
        let mut capped = control("http://b/");
        capped.max_concurrency = Some(3);
        let mut zero = control("http://c/");
        zero.max_concurrency = Some(0);
        let gates = gates_with(vec![paused, capped, zero]);
        let now = Instant::now();
        assert_eq!(gates.limit("http://a/", now), Limit::Paused);
        assert_eq!(gates.limit("http://b/", now), Limit::Open(3));
        // A cap of 0 is read as 1: pausing is said with `paused`.
        assert_eq!(gates.limit("http://c/", now), Limit::Open(1));
    }

    #[test]
    fn a_failing_endpoint_gets_probes_then_full_speed_back() {
        let mut gates = gates_with(vec![]);
        let key: Arc<str> = "http://a/".into();
        let now = Instant::now();
        let mut opened = false;
        for _ in 0..20 {
            opened |= gates.record(&key, false, None, now) == Recorded::Opened;
        }
        assert!(opened && gates.is_open(&key));
        // No probe before the first interval.
        assert!(matches!(gates.limit(&key, now), Limit::Wait(Some(at)) if at > now));
        let later = now + Duration::from_secs(2);
        assert_eq!(gates.limit(&key, later), Limit::Probe);
        gates.starting(&key);
        assert_eq!(gates.limit(&key, later), Limit::Wait(None));
        assert_eq!(
            gates.record(&key, true, None, later),
            Recorded::Closed(Some(now))
        );
        assert_eq!(gates.limit(&key, later), Limit::Open(8));
    }

    #[test]
    fn begun_attempts_are_held_back_when_the_lane_pauses_or_its_breaker_opens() {
        let mut paused = control("http://p/");
        paused.paused = true;
        let mut gates = gates_with(vec![paused]);
        let key: Arc<str> = "http://a/".into();
        let now = Instant::now();
        assert!(!gates.holds_back(&key));
        assert!(gates.holds_back("http://p/"));
        for _ in 0..20 {
            gates.record(&key, false, None, now);
        }
        assert!(gates.holds_back(&key), "judged down: only its probe goes");
        // A probe picked and never sent leaves the way open for the next.
        let later = now + Duration::from_secs(2);
        assert!(gates.starting(&key), "the attempt started now is the probe");
        assert_eq!(gates.limit(&key, later), Limit::Wait(None));
        gates.probe_abandoned(&key);
        assert_eq!(gates.limit(&key, later), Limit::Probe);
        gates.record(&key, true, None, later);
        assert!(!gates.holds_back(&key));
    }

    #[test]
    fn a_retry_after_delays_the_probe() {
        let mut gates = gates_with(vec![]);
        let key: Arc<str> = "http://a/".into();
        let now = Instant::now();
        for _ in 0..20 {
            gates.record(&key, false, Some(Duration::from_secs(10)), now);
        }
        assert!(matches!(
            gates.limit(&key, now + Duration::from_secs(5)),
            Limit::Wait(Some(_))
        ));
        assert_eq!(
            gates.limit(&key, now + Duration::from_secs(11)),
            Limit::Probe
        );
    }

    #[test]
    fn a_rate_limit_allows_its_burst_then_waits_for_a_token() {
        let mut limited = control("http://a/");
        limited.max_per_second = Some(2.0);
        let mut gates = gates_with(vec![limited]);
        let key: Arc<str> = "http://a/".into();
        let now = Instant::now();
        assert_eq!(gates.take_token(&key, now), Ok(()));
        assert_eq!(gates.take_token(&key, now), Ok(()));
        let at = gates.take_token(&key, now).expect_err("out of tokens");
        assert!(
            at > now && at <= now + Duration::from_millis(600),
            "{:?}",
            at - now
        );
        assert_eq!(gates.limit(&key, now), Limit::Wait(Some(at)));
        // Past the token's time the lane is open again.
        assert_eq!(gates.limit(&key, at), Limit::Open(8));
        // Sends are paced apart: a burst of begun attempts goes out at the same rate.
        assert_eq!(gates.take_send_token(&key, now), Ok(()));
        assert_eq!(gates.take_send_token(&key, now), Ok(()));
        assert!(gates.take_send_token(&key, now).is_err());
        // Unlimited lanes never wait.
        let free: Arc<str> = "http://b/".into();
        assert!(gates.is_rate_limited(&key) && !gates.is_rate_limited(&free));
        for _ in 0..1000 {
            assert_eq!(gates.take_token(&free, now), Ok(()));
            assert_eq!(gates.take_send_token(&free, now), Ok(()));
        }
    }

    #[test]
    fn hostile_rates_mean_no_limit_and_never_panic() {
        for rate in [f64::NAN, f64::INFINITY, -1.0, 0.0, 1e-300, 1e300] {
            let mut c = control("http://a/");
            c.max_per_second = Some(rate);
            let mut gates = gates_with(vec![c]);
            let key: Arc<str> = "http://a/".into();
            let _ = gates.take_token(&key, Instant::now());
        }
    }

    #[test]
    fn a_changed_rate_starts_afresh_and_an_unchanged_one_keeps_its_state() {
        let mut slow = control("http://a/");
        slow.max_per_second = Some(1.0);
        let mut gates = gates_with(vec![slow.clone()]);
        let key: Arc<str> = "http://a/".into();
        let now = Instant::now();
        assert!(gates.take_token(&key, now).is_ok());
        assert!(gates.take_token(&key, now).is_err());
        let mut same = Controls::default();
        same.endpoints.insert(slow.endpoint.clone(), slow.clone());
        gates.set_controls(Arc::new(same));
        assert!(
            gates.take_token(&key, now).is_err(),
            "same rate: still empty"
        );
        let mut faster = slow;
        faster.max_per_second = Some(100.0);
        let mut changed = Controls::default();
        changed.endpoints.insert(faster.endpoint.clone(), faster);
        gates.set_controls(Arc::new(changed));
        assert!(
            gates.take_token(&key, now).is_ok(),
            "new rate: a fresh bucket"
        );
    }

    #[test]
    fn lane_timers_fire_in_order_once_per_instant() {
        let mut gates = gates_with(vec![]);
        let (a, b): (Arc<str>, Arc<str>) = ("http://a/".into(), "http://b/".into());
        let now = Instant::now();
        gates.wake_at(&b, now + Duration::from_millis(20));
        gates.wake_at(&a, now + Duration::from_millis(10));
        gates.wake_at(&a, now + Duration::from_millis(10));
        assert_eq!(gates.next_wake(), Some(now + Duration::from_millis(10)));
        assert_eq!(gates.pop_wake(now), None);
        let later = now + Duration::from_millis(30);
        assert_eq!(gates.pop_wake(later), Some(a));
        assert_eq!(gates.pop_wake(later), Some(b));
        assert_eq!(gates.pop_wake(later), None);
    }

    /// A job of a paused bucket that leaves its place and is set aside again (postponed, then
    /// due again; evicted and read back) is listed again: the bucket's list must not keep
    /// every one of its former places while the pause lasts.
    #[test]
    fn a_paused_bucket_does_not_pile_up_former_places() {
        let mut gates = gates_with(vec![]);
        let mut paused = Controls::default();
        paused.buckets.insert(
            "x".into(),
            crate::registry::controls::BucketControl {
                bucket: "x".into(),
                paused: true,
                park_after_secs: None,
                updated_by: "test".into(),
                updated_at: chrono::Utc::now(),
            },
        );
        gates.set_controls(Arc::new(paused));
        let id = |n: u128| JobId(ulid::Ulid::from(n));
        let mut aside: HashSet<JobId> = HashSet::new();
        for n in 0..10 {
            gates.set_aside(Aside::Bucket("x".into()), id(n));
            aside.insert(id(n));
        }
        for round in 0..100_000u128 {
            let job = id(round % 10);
            aside.remove(&job);
            gates.left_aside(|j| aside.contains(&j));
            gates.set_aside(Aside::Bucket("x".into()), job);
            aside.insert(job);
            assert_eq!(gates.aside_count(), 10);
            assert!(
                gates.aside_places() <= 2 * 10 + PRUNE_AFTER + 1,
                "round {round}: {} places for 10 jobs set aside",
                gates.aside_places()
            );
        }
        gates.set_controls(Arc::new(Controls::default()));
        let mut back = gates.take_resumed();
        back.sort();
        back.dedup();
        assert_eq!(back, (0..10).map(id).collect::<Vec<_>>());
        assert_eq!(gates.aside_places(), 0);
    }

    #[test]
    fn jobs_set_aside_come_back_when_their_bucket_resumes() {
        let mut gates = gates_with(vec![]);
        let mut paused = Controls::default();
        paused.buckets.insert(
            "x".into(),
            crate::registry::controls::BucketControl {
                bucket: "x".into(),
                paused: true,
                park_after_secs: None,
                updated_by: "test".into(),
                updated_at: chrono::Utc::now(),
            },
        );
        gates.set_controls(Arc::new(paused));
        assert!(gates.bucket_paused("x"));
        let id = JobId(ulid::Ulid::from(7u128));
        gates.set_aside(Aside::Bucket("x".into()), id);
        assert_eq!(gates.aside_count(), 1);
        assert!(gates.take_resumed().is_empty());
        gates.set_controls(Arc::new(Controls::default()));
        assert_eq!(gates.take_resumed(), vec![id]);
        gates.left_aside(|_| false);
        assert_eq!(gates.aside_count(), 0);
    }
}
