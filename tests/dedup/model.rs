//! The scripts answer as the in-process store does: the same random histories of claims,
//! take-overs, refreshes, confirmations and releases, run on Redis and on a memory store, get
//! the same outcome at every step. The memory store replays the scripts' steps plainly (every
//! operation reads the whole slot range), so a shortcut in a script that changes an answer in
//! any state these histories reach shows here as the first step where the two differ.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// One operation of a history, on a batch of (key, time offset, owner) picks.
#[derive(Clone, Copy, Debug)]
enum Step {
    Claim,
    TakeOver,
    Refresh,
    Confirm,
    Release,
}

/// The outcome of a step, comparable across stores.
#[derive(Debug, PartialEq)]
enum Answer {
    Claims(Vec<ClaimOutcome>),
    Confirms(Vec<ConfirmOutcome>),
    Releases(Vec<bool>),
}

async fn apply(store: &DedupStore, step: Step, claims: &[Claim]) -> Answer {
    match step {
        Step::Claim => Answer::Claims(store.claim(claims).await.unwrap()),
        Step::TakeOver => Answer::Claims(store.take_over(claims).await.unwrap()),
        Step::Refresh => Answer::Claims(store.refresh(claims).await.unwrap()),
        Step::Confirm => Answer::Confirms(store.confirm(claims).await.unwrap()),
        Step::Release => Answer::Releases(store.release(claims).await.unwrap()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_answer_as_the_memory_store_does() {
    let seed: u64 = std::env::var("SPINDLE_DEDUP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let prefix = unique_prefix("model");
    // Pending claims lapse after 400 ms; a pause is either none or long enough that every
    // deadline of the bursts before it has passed by a wide margin, so the two stores, which
    // are asked a few milliseconds apart, never disagree about a deadline.
    let mut cfg = config(&prefix);
    cfg.pending_ttl = Duration::from_millis(400);
    let (redis, _) = shared_store(Kind::Redis, cfg.clone()).await;
    let (memory, _) = shared_store(Kind::Memory, cfg).await;
    let keys = new_keys("model", 4);
    let owners: Vec<Vec<JobId>> = keys.iter().map(|_| owners(3)).collect();
    // Times over five 1 s slots around now: pairs of claims inside, across and beyond the
    // 2 s window.
    let base = slot_aligned(0);
    let mut steps = 0;
    for _burst in 0..20 {
        let burst = Instant::now();
        for _ in 0..8 {
            let step = match rng.random_range(0..10) {
                0..=3 => Step::Claim,
                4 => Step::TakeOver,
                5 => Step::Refresh,
                6..=8 => Step::Confirm,
                _ => Step::Release,
            };
            let claims: Vec<Claim> = (0..rng.random_range(1..=3))
                .map(|_| {
                    let k = rng.random_range(0..keys.len());
                    let offset = rng.random_range(-2_500..=2_500);
                    claim(
                        keys[k],
                        base + chrono::Duration::milliseconds(offset),
                        owners[k][rng.random_range(0..3)],
                    )
                })
                .collect();
            let on_redis = apply(&redis, step, &claims).await;
            let in_memory = apply(&memory, step, &claims).await;
            assert_eq!(
                on_redis, in_memory,
                "seed {seed}, step {steps}: {step:?} of {claims:?}"
            );
            steps += 1;
        }
        assert!(
            burst.elapsed() < Duration::from_millis(150),
            "a burst must stay well inside the pending TTL"
        );
        if rng.random_bool(0.5) {
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
    }
    cleanup(&shared_redis(), &prefix).await;
}
