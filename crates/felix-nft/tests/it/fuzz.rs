//! Fuzzing inside the test suite: each fuzz target (`tests/fuzz_targets`) on bounded runs of
//! random and mutated inputs (proptest: `FELIX_NFT_FUZZ_CASES` per target, 256 by default), and
//! a replay of the kept corpus and of every input a fuzzer ever found failing
//! (`tests/fuzz/corpus/<target>/`, `tests/fuzz/crashes/<target>/`). The coverage-guided runs
//! are `scripts/fuzz` (cargo-fuzz, `fuzz/`), which grow that corpus.

use crate::fuzz_targets;

use std::path::Path;

use felix_api::{json, ToDataplane};
use proptest::prelude::*;
use prost::Message as _;

fn cases() -> u32 {
    std::env::var("FELIX_NFT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The valid messages of the fixtures: the seeds mutations start from.
fn seed_lines() -> Vec<String> {
    include_str!("../../../felix-api/tests/fixtures/to_dataplane.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

fn seed_envelopes() -> Vec<Vec<u8>> {
    seed_lines()
        .iter()
        .map(|l| {
            json::decode::<ToDataplane>(l)
                .expect("fixture decodes")
                .encode_to_vec()
        })
        .collect()
}

/// One mutation of a byte string.
#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (
            any::<usize>(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 1..8),
                Just(b"\\u0000".to_vec()),
                Just(b"99999999999999999999".to_vec()),
                Just(b"-1".to_vec()),
                Just(b"\"".to_vec()),
                Just(b"{\"".to_vec()),
                Just("ü€\u{1F600}".as_bytes().to_vec()),
            ]
        )
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..32).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut v: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let len = v.len().max(1);
        match m {
            Mutation::Set(i, b) => {
                if !v.is_empty() {
                    let i = i % v.len();
                    v[i] = *b;
                }
            }
            Mutation::Insert(i, bytes) => {
                let i = i % (v.len() + 1);
                v.splice(i..i, bytes.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let i = i % len;
                let end = (i + n).min(v.len());
                if i < end {
                    v.drain(i..end);
                }
            }
            Mutation::Duplicate(i, n) => {
                let i = i % len;
                let end = (i + n).min(v.len());
                if i < end {
                    let part = v[i..end].to_vec();
                    v.splice(end..end, part);
                }
            }
            Mutation::Truncate(i) => v.truncate(i % len),
        }
    }
    v
}

/// Frames: seed envelopes with their true length, a wrong one, or a huge one; some cut short.
fn frames() -> impl Strategy<Value = Vec<u8>> {
    let seeds = seed_envelopes();
    proptest::collection::vec(
        (
            0..seeds.len(),
            prop_oneof![
                4 => Just(None),
                1 => any::<u64>().prop_map(Some),
                1 => (0u64..2048).prop_map(Some),
            ],
            proptest::collection::vec(mutation(), 0..3),
        ),
        0..8,
    )
    .prop_flat_map(move |fs| {
        let mut out = Vec::new();
        for (i, len, ms) in fs {
            let body = mutate(seeds[i].clone(), &ms);
            let l = len.unwrap_or(body.len() as u64);
            out.extend_from_slice(&l.to_le_bytes());
            out.extend_from_slice(&body);
        }
        let n = out.len();
        (Just(out), 0..=n)
    })
    .prop_map(|(mut v, cut)| {
        // Every other stream ends where it was cut.
        if cut % 2 == 1 {
            v.truncate(cut);
        }
        v
    })
}

/// Random bytes of up to 512.
fn random_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..512)
}

/// One of `seeds` with one to five mutations.
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(seeds),
        proptest::collection::vec(mutation(), 1..6),
    )
        .prop_map(|(seed, ms)| mutate(seed, &ms))
}

/// One proptest per `NAME: INPUTS => TARGET`: the fuzz target on `cases()` inputs drawn from
/// the strategy INPUTS.
macro_rules! fuzz_tests {
    ($($name:ident: $inputs:expr => $target:path,)*) => {
        proptest! {
            #![proptest_config(ProptestConfig {
                cases: cases(),
                failure_persistence: None,
                ..ProptestConfig::default()
            })]
            $(
                #[test]
                fn $name(data in $inputs) {
                    $target(&data);
                }
            )*
        }
    };
}

fuzz_tests! {
    json_line_random_bytes: random_bytes() => fuzz_targets::json_line,
    json_line_mutated: mutated(seed_lines().into_iter().map(String::into_bytes).collect())
        => fuzz_targets::json_line,
    proto_envelope_random_bytes: random_bytes() => fuzz_targets::proto_envelope,
    proto_envelope_mutated: mutated(seed_envelopes()) => fuzz_targets::proto_envelope,
    frame_stream_random_bytes: random_bytes() => fuzz_targets::frame_stream,
    frame_stream_of_frames: frames() => fuzz_targets::frame_stream,
}

/// Every kept input: the corpus the coverage-guided fuzzer grew, and every input it ever
/// found failing (fixed since, and kept as regression tests).
#[test]
fn the_kept_corpus_and_past_crashes_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    type Target = fn(&[u8]);
    let targets: [(&str, Target); 3] = [
        ("json_line", fuzz_targets::json_line),
        ("proto_envelope", fuzz_targets::proto_envelope),
        ("frame_stream", fuzz_targets::frame_stream),
    ];
    let mut n = 0;
    for (name, target) in targets {
        for kind in ["corpus", "crashes"] {
            let dir = root.join(kind).join(name);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries {
                let path = e.expect("a corpus entry").path();
                let data = std::fs::read(&path).expect("reading a corpus file");
                let r = std::panic::catch_unwind(|| target(&data));
                assert!(r.is_ok(), "{name} fails on {}", path.display());
                n += 1;
            }
        }
    }
    assert!(n >= 30, "only {n} kept inputs: the corpus is missing");
}
