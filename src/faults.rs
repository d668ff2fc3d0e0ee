//! Fault injection for tests (feature `fault-injection`; a normal build has none of this).
//!
//! A test names a bucket; the scheduler panics when it accepts a job of that bucket, which is
//! how the tests show that a Director whose core task dies turns non-ready and exits non-zero.
//! Buckets are named per test, so tests running side by side never trip each other's fault.
//! A process of the `spindle` binary built with the feature takes the bucket from
//! `SPINDLE_FAULT_PANIC_BUCKET`.
//!
//! A router built with it ends at once, as a kill -9 would, at a named step of a publish
//! whose idempotency key `SPINDLE_FAULT_CRASH` names (`step:key`), so a test can stop it
//! between claiming a key and storing, or between storing and confirming.

use std::sync::Mutex;

static PANIC_BUCKETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Makes the scheduler of every Director in this process panic when it accepts a job of
/// `bucket`.
pub fn panic_on_bucket(bucket: &str) {
    if let Ok(mut buckets) = PANIC_BUCKETS.lock() {
        buckets.push(bucket.to_owned());
    }
}

/// Panics if a fault was set for `bucket`.
pub(crate) fn on_accepted(bucket: &str) {
    let listed = PANIC_BUCKETS
        .lock()
        .map(|b| b.iter().any(|b| b == bucket))
        .unwrap_or(false);
    let from_env = std::env::var("SPINDLE_FAULT_PANIC_BUCKET").is_ok_and(|b| b == bucket);
    if listed || from_env {
        panic!("injected fault: the scheduler accepted a job of bucket {bucket:?}");
    }
}

/// Ends the process at once (no unwinding, nothing flushed) if `SPINDLE_FAULT_CRASH` is
/// `step:key`.
pub(crate) fn crash_at(step: &str, key: &str) {
    let armed =
        std::env::var("SPINDLE_FAULT_CRASH").is_ok_and(|v| v.split_once(':') == Some((step, key)));
    if armed {
        eprintln!("injected fault: crashing at {step} of key {key:?}");
        std::process::abort();
    }
}
