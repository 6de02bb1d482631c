//! The Felix dataplane API (§2): message types, the protobuf and proto3-JSON codecs,
//! and the fd 3/4 framing (§1.2). Knows nothing of nftables or of the kernel.
//!
//! - [`types`]: every `ToDataplane`/`FromDataplane` message, prost derives by hand.
//! - [`json`]: proto3 JSON with the proto's field names (lowerCamelCase accepted on input).
//! - [`clip`]: user-supplied text cut to a bounded length for messages and logs.
//! - [`frame`]: 8-byte little-endian length + protobuf envelope, in both directions.
// A `pub` item no other crate can reach is `pub(crate)` or narrower: the public surface says
// what the crates above use.
#![warn(unreachable_pub)]

pub mod clip;
pub mod frame;
pub mod json;
pub mod types;

pub use types::*;

use prost::Message;

/// A protobuf message that could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("decoding a {what} from {len} bytes of protobuf")]
pub struct DecodeError {
    /// The message type being decoded (`felix.ToDataplane`, …).
    pub what: &'static str,
    /// How many bytes were offered.
    pub len: usize,
    #[source]
    pub source: prost::DecodeError,
}

/// Decodes a `felix.ToDataplane` envelope. Unknown fields are skipped, as proto3 requires: a
/// newer Felix may send fields (or whole payload kinds) this build does not know.
pub fn decode_to_dataplane(bytes: &[u8]) -> Result<ToDataplane, DecodeError> {
    ToDataplane::decode(bytes).map_err(|source| DecodeError {
        what: "felix.ToDataplane",
        len: bytes.len(),
        source,
    })
}

/// Decodes a `felix.FromDataplane` envelope (what a driver sends Felix; used by tests and tools).
pub fn decode_from_dataplane(bytes: &[u8]) -> Result<FromDataplane, DecodeError> {
    FromDataplane::decode(bytes).map_err(|source| DecodeError {
        what: "felix.FromDataplane",
        len: bytes.len(),
        source,
    })
}

/// Encodes any API message as protobuf bytes.
pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    msg.encode_to_vec()
}
