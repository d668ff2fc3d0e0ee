//! Fuzzes `POST /v1/jobs` parsing and validation (`spindle::rpc::check_submission`): it must
//! never panic, and whatever it accepts must be deliverable as-is.
#![no_main]

#[path = "../../tests/common/fuzz_checks.rs"]
mod fuzz_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::check(data));
