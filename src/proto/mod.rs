//! The Felix dataplane API (reference §2): message types, protobuf and proto3-JSON codecs, and the
//! fd 3/4 framing. Knows nothing of nftables.

pub mod types;

pub use types::*;
