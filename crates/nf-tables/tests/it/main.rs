//! The integration tests of `nf-tables`, one module per suite, in one binary (a binary per
//! suite would link the crate once each).

// Shared with the codec bench; it allows its own dead code (`#![allow(dead_code)]`).
mod nft_fixtures;

mod nft_codec;
mod nft_diff;
mod nft_dump;
mod nft_kernel;
