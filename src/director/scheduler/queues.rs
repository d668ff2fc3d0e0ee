//! The lanes (Centrifuge's "virtual queues"): ready jobs wait in a FIFO per (endpoint,
//! bucket); each endpoint is a *lane*, and lanes with a ready job and room to start one sit in
//! a ring.
//!
//! Picking takes one job from the lane at the head of the ring, from the lane's next bucket
//! (round-robin), and the lane leaves the ring until it is relisted: endpoints share the
//! Director fairly, and buckets share an endpoint fairly. A hanging endpoint only fills its
//! own slots. A job that leaves its queue other than by being picked leaves its slot behind
//! (a tombstone, recognised by its ticket), skipped when reached: removal from the middle is
//! O(1). A lane that is not picked (paused, gated, down) never reaches its tombstones, so once
//! they outnumber its live slots (and [`COMPACT_AFTER`]) its queues are swept: a lane holds at
//! most about twice as many slots as ready jobs, at amortised O(1) per departure.
//!
//! This part knows nothing of jobs beyond their ids: whether a slot is still live, and how
//! many attempts a lane may have under way, are the caller's to say.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::job::JobId;

/// Dead slots a lane may hold beyond its live ones before its queues are swept (a small lane
/// is not swept for every departure).
pub(super) const COMPACT_AFTER: usize = 64;

/// A queue slot: a job and the ticket it was queued with.
pub(super) type Slot = (JobId, u32);

/// The queues and attempt counts of one endpoint.
#[derive(Default)]
pub(super) struct Lane {
    /// Attempts whose start is being committed.
    starting: usize,
    /// Attempts whose start is durable, waiting for an HTTP slot.
    started: VecDeque<JobId>,
    /// How many attempts may be begun ahead of their HTTP slots now (0: not grown yet, the
    /// lane's concurrency); see [`Lane::adapt`].
    window: usize,
    /// HTTP requests in flight.
    in_flight: usize,
    /// Jobs taken from the head of the queue whose payload is being read back.
    fetching: usize,
    /// Live slots in the queues (slots of jobs that left are not counted).
    ready: usize,
    /// Every slot in the queues, dead ones included.
    slots: usize,
    /// A queue per bucket.
    queues: HashMap<Arc<str>, VecDeque<Slot>>,
    /// Buckets with a queue, in round-robin order.
    buckets: VecDeque<Arc<str>>,
    /// In the ring.
    listed: bool,
}

impl Lane {
    /// Live slots in the queues: jobs ready for an attempt.
    pub(super) fn ready(&self) -> usize {
        self.ready
    }

    /// HTTP requests in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether attempts begun wait for an HTTP slot.
    pub(super) fn has_begun(&self) -> bool {
        !self.started.is_empty()
    }

    /// A job left the head of its queue to have its payload read back.
    pub(super) fn fetch(&mut self) {
        self.fetching += 1;
    }

    /// A payload read back: its job is queued again.
    pub(super) fn fetched(&mut self) {
        self.fetching -= 1;
    }

    /// An attempt's start is being committed.
    pub(super) fn begin(&mut self) {
        self.starting += 1;
    }

    /// An attempt's start is durable (committed now, or found at a takeover): it waits for
    /// an HTTP slot.
    pub(super) fn begun(&mut self, id: JobId) {
        self.starting -= 1;
        self.started.push_back(id);
    }

    /// An attempt's start was found in the JobDB (a takeover): it waits for an HTTP slot.
    pub(super) fn begun_before(&mut self, id: JobId) {
        self.started.push_back(id);
    }

    /// An attempt's start did not commit.
    pub(super) fn not_begun(&mut self) {
        self.starting -= 1;
    }

    /// The attempt begun longest ago, out of the lane's wait for a slot.
    pub(super) fn next_begun(&mut self) -> Option<JobId> {
        self.started.pop_front()
    }

    /// An attempt takes an HTTP slot.
    pub(super) fn send(&mut self) {
        self.in_flight += 1;
    }

    /// An attempt given a slot waits again, first (no send token yet).
    pub(super) fn unsend(&mut self, id: JobId) {
        self.in_flight -= 1;
        self.started.push_front(id);
    }

    /// A request ended.
    pub(super) fn sent(&mut self) {
        self.in_flight -= 1;
    }

    /// The buckets with jobs queued in the lane.
    pub(super) fn buckets(&self) -> impl Iterator<Item = &Arc<str>> {
        self.queues.keys()
    }

    /// The job at the head of each bucket's queue (it may have left since: check it).
    pub(super) fn heads(&self) -> impl Iterator<Item = JobId> + '_ {
        self.queues
            .values()
            .filter_map(|q| q.front().map(|(id, _)| *id))
    }

    /// Slots in the lane's queues, dead ones included.
    #[cfg(test)]
    pub(super) fn slots(&self) -> usize {
        self.slots
    }

    /// Attempts under way that do not hold an HTTP slot yet.
    pub(super) fn pending(&self) -> usize {
        self.starting + self.started.len() + self.fetching
    }

    /// The start window at concurrency `concurrency`: from one concurrency's worth up to
    /// `factor` times that, as [`Lane::adapt`] has grown it.
    pub(super) fn window(&self, concurrency: usize, factor: usize) -> usize {
        self.window
            .clamp(concurrency, concurrency.saturating_mul(factor.max(1)))
    }

    /// A commit of begun attempts was dispatched: if every one found an HTTP slot, the
    /// commit is what limits the lane, and the window doubles (up to `factor` × its
    /// concurrency); if some wait for a slot, the endpoint is what limits it, and the window
    /// halves (down to one concurrency's worth). So a fast endpoint gets many attempts per
    /// commit, while a slow one never has more begun ahead than it can take, which keeps its
    /// buckets' turns fair and its payloads in memory few.
    pub(super) fn adapt(&mut self, concurrency: usize, factor: usize) {
        let window = self.window(concurrency, factor);
        self.window = if self.started.is_empty() {
            window.saturating_mul(2)
        } else {
            window / 2
        }
        .clamp(concurrency, concurrency.saturating_mul(factor.max(1)));
    }
}

/// Every lane, and the ring of lanes that can start something.
#[derive(Default)]
pub(super) struct Queues {
    lanes: HashMap<Arc<str>, Lane>,
    ring: VecDeque<Arc<str>>,
}

impl Queues {
    pub(super) fn lane(&self, key: &str) -> Option<&Lane> {
        self.lanes.get(key)
    }

    /// The lane and its key.
    pub(super) fn lane_entry(&self, key: &str) -> Option<(&Arc<str>, &Lane)> {
        self.lanes.get_key_value(key)
    }

    pub(super) fn lane_mut(&mut self, key: &str) -> Option<&mut Lane> {
        self.lanes.get_mut(key)
    }

    /// The lane of `key`, made if it has none (an attempt is counted on it before its job
    /// is queued).
    pub(super) fn lane_or_new(&mut self, key: &Arc<str>) -> &mut Lane {
        self.lanes.entry(key.clone()).or_default()
    }

    /// Every lane, by endpoint.
    pub(super) fn lanes(&self) -> impl Iterator<Item = (&Arc<str>, &Lane)> {
        self.lanes.iter()
    }

    /// The lane that picks next.
    #[cfg(test)]
    pub(super) fn head(&self) -> Option<&Arc<str>> {
        self.ring.front()
    }

    /// Queues a slot in its lane and bucket: at the back, or at the front (a job that was at
    /// the head already and only waited for its payload or its lane's turn). The caller
    /// relists the lane.
    pub(super) fn push(&mut self, key: &Arc<str>, bucket: &Arc<str>, slot: Slot, front: bool) {
        let lane = self.lane_or_new(key);
        let queue = lane.queues.entry(bucket.clone()).or_default();
        if queue.is_empty() {
            lane.buckets.push_back(bucket.clone());
        }
        if front {
            queue.push_front(slot);
        } else {
            queue.push_back(slot);
        }
        lane.ready += 1;
        lane.slots += 1;
    }

    /// Puts a picked slot back exactly where it was: the head of its bucket's queue, and that
    /// bucket first in its lane's turn (its lane could not start it after all).
    pub(super) fn unpick(&mut self, key: &Arc<str>, bucket: &Arc<str>, slot: Slot) {
        let lane = self.lane_or_new(key);
        let queue = lane.queues.entry(bucket.clone()).or_default();
        if queue.is_empty() {
            lane.buckets.retain(|b| b != bucket);
        } else if let Some(at) = lane.buckets.iter().position(|b| b == bucket) {
            lane.buckets.remove(at);
        }
        lane.buckets.push_front(bucket.clone());
        queue.push_front(slot);
        lane.ready += 1;
        lane.slots += 1;
    }

    /// Moves the slots `first` picks to the front of their buckets' queues (each queue's
    /// order otherwise kept), and the buckets whose queue now starts with one to the front of
    /// the lane's turn: the lane's next pick is such a slot if it has one.
    pub(super) fn bring_forward(&mut self, key: &str, mut first: impl FnMut(Slot) -> bool) {
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        let mut leading = HashSet::new();
        for (bucket, queue) in &mut lane.queues {
            let (front, back): (VecDeque<Slot>, VecDeque<Slot>) =
                queue.drain(..).partition(|slot| first(*slot));
            if !front.is_empty() {
                leading.insert(bucket.clone());
            }
            queue.extend(front);
            queue.extend(back);
        }
        let (mut front, back): (VecDeque<Arc<str>>, VecDeque<Arc<str>>) =
            lane.buckets.drain(..).partition(|b| leading.contains(b));
        front.extend(back);
        lane.buckets = front;
    }

    /// A live slot of the lane was abandoned (its job left the queue without being picked).
    /// When the lane's dead slots outnumber its live ones and [`COMPACT_AFTER`], its queues
    /// are swept, keeping the slots `live` says still stand for a queued job, in order.
    pub(super) fn left(&mut self, key: &str, mut live: impl FnMut(Slot) -> bool) {
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        lane.ready = lane.ready.saturating_sub(1);
        let dead = lane.slots.saturating_sub(lane.ready);
        if dead <= lane.ready.max(COMPACT_AFTER) {
            return;
        }
        let mut slots = 0;
        lane.queues.retain(|_, queue| {
            queue.retain(|slot| live(*slot));
            slots += queue.len();
            !queue.is_empty()
        });
        let queues = &lane.queues;
        lane.buckets.retain(|b| queues.contains_key(b));
        lane.slots = slots;
    }

    /// Takes the next live slot of the head lane (its next bucket, round-robin) and unlists
    /// that lane; the caller relists it once it has counted the attempt, so a lane is never
    /// forgotten while an attempt of it is being started. `live` says whether a slot still
    /// stands for a queued job; dead slots met on the way are dropped (each is passed once).
    /// Returns the job, its lane and bucket.
    pub(super) fn pick(
        &mut self,
        mut live: impl FnMut(Slot) -> bool,
    ) -> Option<(JobId, Arc<str>, Arc<str>)> {
        let key = self.ring.pop_front()?;
        let lane = self.lanes.get_mut(&key)?;
        lane.listed = false;
        while lane.ready > 0 {
            let bucket = lane.buckets.pop_front()?;
            let Some(queue) = lane.queues.get_mut(&bucket) else {
                continue;
            };
            let mut found = None;
            while let Some(slot) = queue.pop_front() {
                lane.slots = lane.slots.saturating_sub(1);
                if live(slot) {
                    found = Some(slot.0);
                    break;
                }
            }
            if queue.is_empty() {
                lane.queues.remove(&bucket);
            } else {
                lane.buckets.push_back(bucket.clone());
            }
            if let Some(id) = found {
                lane.ready -= 1;
                return Some((id, key, bucket));
            }
        }
        None
    }

    /// Puts a lane in the ring if it has a ready job and fewer than `limit` attempts pending
    /// (started but not yet holding an HTTP slot), or forgets it if it is idle.
    pub(super) fn relist(&mut self, key: &Arc<str>, limit: usize) {
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        let pending = lane.pending();
        if lane.ready > 0 && pending < limit {
            if !lane.listed {
                lane.listed = true;
                self.ring.push_back(key.clone());
            }
        } else if lane.ready == 0 && pending == 0 && lane.in_flight == 0 && !lane.listed {
            self.lanes.remove(key);
        }
    }

    /// The newest ready job of the lane holding the most ready jobs, if that lane holds more
    /// than `fewer` + 1 (so taking one from it leaves the two lanes fairer): its slot is taken
    /// out of its bucket's queue (the longest of the lane's), and the caller makes the job
    /// leave the queue as any other (`left`). `live` says whether a slot still stands for a
    /// queued job; dead slots met on the way are dropped.
    pub(super) fn newest_of_largest(
        &mut self,
        fewer: usize,
        mut live: impl FnMut(Slot) -> bool,
    ) -> Option<JobId> {
        let lane = self
            .lanes
            .values_mut()
            .max_by_key(|lane| lane.ready)
            .filter(|lane| lane.ready > fewer.saturating_add(1))?;
        let queue = lane.queues.values_mut().max_by_key(|q| q.len())?;
        while let Some(slot) = queue.pop_back() {
            lane.slots = lane.slots.saturating_sub(1);
            if live(slot) {
                return Some(slot.0);
            }
        }
        None
    }

    /// Buckets that have a queue in some lane.
    pub(super) fn buckets(&self) -> impl Iterator<Item = &Arc<str>> {
        self.lanes.values().flat_map(|lane| lane.queues.keys())
    }

    /// Ids in the queues of these buckets (slots of jobs that left included: check them).
    pub(super) fn queued_in(&self, buckets: &HashSet<Arc<str>>) -> Vec<JobId> {
        self.lanes
            .values()
            .flat_map(|lane| {
                lane.queues
                    .iter()
                    .filter(|(b, _)| buckets.contains(*b))
                    .flat_map(|(_, q)| q.iter().map(|(id, _)| *id))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_window_grows_while_slots_are_free_and_shrinks_when_they_are_not() {
        let mut lane = Lane::default();
        assert_eq!(
            lane.window(8, 16),
            8,
            "one concurrency's worth to begin with"
        );
        // Every begun attempt found a slot: the commit limits the lane, the window doubles.
        for expected in [16, 32, 64, 128, 128] {
            lane.adapt(8, 16);
            assert_eq!(lane.window(8, 16), expected);
        }
        // Attempts wait for slots: the endpoint limits it, the window halves, to 8 at least.
        lane.started.push_back(JobId(ulid::Ulid::from(1u128)));
        for expected in [64, 32, 16, 8, 8] {
            lane.adapt(8, 16);
            assert_eq!(lane.window(8, 16), expected);
        }
        // A lower concurrency (a control's cap) bounds it at once.
        assert_eq!(lane.window(2, 16), 8);
        assert_eq!(lane.window(2, 1), 2);
    }

    fn key(s: &str) -> Arc<str> {
        s.into()
    }

    fn id(n: u128) -> JobId {
        JobId(ulid::Ulid::from(n))
    }

    /// Pushes `n` jobs numbered from `first` into (lane, bucket) and relists the lane.
    fn fill(q: &mut Queues, lane: &str, bucket: &str, first: u128, n: u128) {
        for i in first..first + n {
            q.push(&key(lane), &key(bucket), (id(i), 0), false);
        }
        q.relist(&key(lane), usize::MAX);
    }

    /// Picks until empty, relisting each lane as a caller with unlimited room would.
    fn drain(q: &mut Queues) -> Vec<(JobId, String, String)> {
        let mut out = Vec::new();
        while let Some((job, lane, bucket)) = q.pick(|_| true) {
            out.push((job, lane.to_string(), bucket.to_string()));
            q.relist(&lane, usize::MAX);
        }
        out
    }

    #[test]
    fn lanes_take_turns() {
        let mut q = Queues::default();
        fill(&mut q, "a", "x", 0, 3);
        fill(&mut q, "b", "x", 10, 3);
        let lanes: Vec<String> = drain(&mut q).into_iter().map(|(_, l, _)| l).collect();
        assert_eq!(lanes, ["a", "b", "a", "b", "a", "b"]);
    }

    #[test]
    fn buckets_take_turns_within_a_lane_in_fifo_order() {
        let mut q = Queues::default();
        fill(&mut q, "a", "x", 0, 3);
        fill(&mut q, "a", "y", 10, 1);
        let got: Vec<(JobId, String)> = drain(&mut q).into_iter().map(|(j, _, b)| (j, b)).collect();
        assert_eq!(
            got,
            [
                (id(0), "x".into()),
                (id(10), "y".into()),
                (id(1), "x".into()),
                (id(2), "x".into())
            ]
        );
    }

    #[test]
    fn a_busy_lane_does_not_delay_another() {
        // Lane "a" has a thousand jobs, lane "b" one: b's job is the second picked.
        let mut q = Queues::default();
        fill(&mut q, "a", "x", 0, 1000);
        fill(&mut q, "b", "x", 5000, 1);
        let first_two: Vec<String> = drain(&mut q)
            .into_iter()
            .take(2)
            .map(|(_, l, _)| l)
            .collect();
        assert_eq!(first_two, ["a", "b"]);
    }

    #[test]
    fn dead_slots_are_skipped_and_dropped() {
        let mut q = Queues::default();
        fill(&mut q, "a", "x", 0, 3);
        // Job 1 left its queue: its slot stays behind, the lane counts one fewer ready.
        q.left("a", |(job, _)| job != id(1));
        let picked: Vec<JobId> = std::iter::from_fn(|| {
            let got = q.pick(|(job, _)| job != id(1));
            if let Some((_, lane, _)) = &got {
                q.relist(lane, usize::MAX);
            }
            got.map(|(j, _, _)| j)
        })
        .collect();
        assert_eq!(picked, [id(0), id(2)]);
        // Nothing ready, nothing pending: the lane is forgotten.
        assert!(q.lane("a").is_none());
    }

    /// A paused lane is never picked, so nothing walks its queues: jobs that leave and come
    /// back (expedited, postponed, expired, evicted and reloaded while it is paused) each
    /// leave a dead slot behind. They must not pile up without bound.
    #[test]
    fn a_paused_lane_does_not_pile_up_dead_slots() {
        let mut q = Queues::default();
        let mut tickets: HashMap<JobId, u32> = HashMap::new();
        for i in 0..10 {
            q.push(&key("a"), &key("x"), (id(i), 0), false);
            tickets.insert(id(i), 0);
        }
        // Paused: relisted with no room, never picked.
        q.relist(&key("a"), 0);
        for round in 1..=100_000u32 {
            let job = id(u128::from(round % 10));
            // It leaves (its ticket moves on, so its old slot is dead) and comes back.
            tickets.insert(job, round);
            q.left("a", |(job, ticket)| tickets.get(&job) == Some(&ticket));
            q.push(&key("a"), &key("x"), (job, round), false);
            q.relist(&key("a"), 0);
            let lane = q.lane("a").expect("lane");
            assert_eq!(lane.ready, 10);
            assert!(
                lane.slots() <= 2 * lane.ready + COMPACT_AFTER + 1,
                "round {round}: {} slots for {} ready jobs",
                lane.slots(),
                lane.ready
            );
        }
        // Resumed: each job is picked once, from its latest slot.
        q.relist(&key("a"), usize::MAX);
        let mut picked = Vec::new();
        while let Some((job, lane, _)) = q.pick(|(job, ticket)| tickets.get(&job) == Some(&ticket))
        {
            picked.push(job);
            tickets.remove(&job);
            q.relist(&lane, usize::MAX);
        }
        picked.sort();
        assert_eq!(picked, (0..10).map(id).collect::<Vec<_>>());
    }

    #[test]
    fn a_lane_at_its_limit_leaves_the_ring_until_relisted() {
        let mut q = Queues::default();
        fill(&mut q, "a", "x", 0, 2);
        let (_, lane, _) = q.pick(|_| true).expect("a job");
        q.lane_mut(&lane).expect("lane").starting += 1;
        // One attempt pending and a limit of one: not listed.
        q.relist(&lane, 1);
        assert!(q.head().is_none());
        assert!(q.pick(|_| true).is_none());
        // The attempt got its HTTP slot: room again.
        let l = q.lane_mut(&lane).expect("lane");
        l.starting -= 1;
        l.in_flight += 1;
        q.relist(&lane, 1);
        assert_eq!(q.head().map(|k| k.to_string()), Some("a".into()));
        // A lane with work in flight is kept even when nothing is ready.
        assert!(q.pick(|_| true).is_some());
        q.relist(&lane, 1);
        assert!(q.lane("a").is_some());
    }

    #[test]
    fn unpick_restores_the_exact_order() {
        let mut q = Queues::default();
        fill(&mut q, "a", "x", 0, 2);
        fill(&mut q, "a", "y", 10, 2);
        let (job, lane, bucket) = q.pick(|_| true).expect("a job");
        assert_eq!(job, id(0));
        q.unpick(&lane, &bucket, (job, 0));
        q.relist(&lane, usize::MAX);
        let order: Vec<JobId> = drain(&mut q).into_iter().map(|(j, _, _)| j).collect();
        assert_eq!(order, [id(0), id(10), id(1), id(11)]);
    }

    #[test]
    fn the_largest_lane_gives_up_its_newest_job() {
        let mut q = Queues::default();
        fill(&mut q, "big", "b1", 0, 6);
        fill(&mut q, "big", "b2", 100, 2);
        fill(&mut q, "small", "b1", 200, 2);
        // Not fairer: a lane holding 7 or more gets nothing from a lane of 8.
        assert_eq!(q.newest_of_largest(7, |_| true), None);
        // The newest of the big lane's longest queue; a dead slot on the way is dropped.
        let dead = id(5);
        assert_eq!(q.newest_of_largest(2, |(job, _)| job != dead), Some(id(4)));
        q.left("big", |(job, _)| job != dead && job != id(4));
        assert_eq!(q.lane("big").unwrap().ready, 7);
        assert_eq!(q.newest_of_largest(2, |_| true), Some(id(3)));
    }

    #[test]
    fn front_pushes_go_first() {
        let mut q = Queues::default();
        fill(&mut q, "a", "x", 0, 2);
        q.push(&key("a"), &key("x"), (id(99), 0), true);
        let order: Vec<JobId> = drain(&mut q).into_iter().map(|(j, _, _)| j).collect();
        assert_eq!(order, [id(99), id(0), id(1)]);
    }

    #[test]
    fn slots_brought_forward_are_picked_first_and_the_rest_keep_their_order() {
        let mut q = Queues::default();
        fill(&mut q, "a", "x", 0, 3);
        fill(&mut q, "a", "y", 10, 3);
        // Jobs 11 and 12 (say, tried before) go first, in their order: bucket y leads the
        // lane's turn (it would have started with x).
        q.bring_forward("a", |(job, _)| job == id(11) || job == id(12));
        let order: Vec<JobId> = drain(&mut q).into_iter().map(|(j, _, _)| j).collect();
        assert_eq!(order, [id(11), id(0), id(12), id(1), id(10), id(2)]);
    }
}
