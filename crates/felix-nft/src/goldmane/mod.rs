//! Flow export to Calico's Goldmane: each flush's [`FlowRecord`](crate::flows::FlowRecord)s as
//! `FlowUpdate`s on Goldmane's `FlowCollector.Connect` gRPC stream, as Felix's Goldmane reporter
//! sends them.
//!
//! - [`api`]: the messages, prost types written by hand from `goldmane/proto/api.proto`.
//! - [`convert`]: record → `Flow`, pure; what felix-nft cannot fill and why.
//! - [`export`]: the bounded queue the collector fills from its thread without waiting, and the
//!   tokio task that connects (TLS with Felix's Typha client certificate), streams, counts
//!   receipts and reconnects with back-off. Uses [`flows`](crate::flows) and
//!   [`config`](crate::config) only; no netlink, no external program.

pub mod api;
pub mod convert;
pub mod export;

pub use convert::to_flow;
pub use export::{ExportError, GoldmaneConfig, GoldmaneExporter, GoldmaneSink, Timing};
