//! Fault injection for tests (feature `fault-injection`; a normal build has none of this).
//!
//! A test names a bucket; the scheduler panics when it accepts a job of that bucket, which is
//! how the tests show that a Director whose core task dies turns non-ready and exits non-zero.
//! Buckets are named per test, so tests running side by side never trip each other's fault.
//! A process of the `spindle` binary built with the feature takes the bucket from
//! `SPINDLE_FAULT_PANIC_BUCKET`.

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
