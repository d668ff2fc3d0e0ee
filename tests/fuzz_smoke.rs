//! A short, deterministic version of the fuzz target (`fuzz/`): the seed corpus and 30,000
//! mutations of it (bit flips, cuts, duplicated spans, spliced JSON tokens) through the intake
//! parser and validator, which must never panic nor accept anything undeliverable.

#[path = "common/fuzz_checks.rs"]
mod fuzz_checks;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOKENS: [&[u8]; 14] = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"null",
    b"1e999",
    b"-0",
    b"\"\\u0000\"",
    b"\"\\r\\n\"",
    b"\"http://[::1]:0/\"",
    b"1.5",
];

#[test]
fn intake_survives_mutated_submissions() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/submit");
    // Only the committed seeds: a local fuzzing run leaves its own (ignored) corpus beside them.
    let seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("seed corpus")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        })
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert!(!seeds.is_empty());
    let mut rng = StdRng::seed_from_u64(20261121);
    for seed in &seeds {
        fuzz_checks::check(seed);
    }
    for _ in 0..30_000 {
        let mut data = seeds[rng.random_range(0..seeds.len())].clone();
        for _ in 0..rng.random_range(1..4) {
            if data.is_empty() {
                break;
            }
            let at = rng.random_range(0..data.len());
            match rng.random_range(0..4) {
                0 => data[at] ^= 1 << rng.random_range(0..8),
                1 => data.truncate(at),
                2 => {
                    let end = (at + rng.random_range(1..16)).min(data.len());
                    let span = data[at..end].to_vec();
                    data.splice(at..at, span);
                }
                _ => {
                    let token = TOKENS[rng.random_range(0..TOKENS.len())];
                    data.splice(at..at, token.iter().copied());
                }
            }
        }
        fuzz_checks::check(&data);
    }
}
