//! Fuzz target `frame_stream` (see `tests/fuzz_targets`).
#![no_main]

#[path = "../../crates/felix-nft/tests/it/fuzz_targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::frame_stream(data));
