//! Flow logs: NFLOG hits and conntrack events joined into flows keyed as Calico's Goldmane keys
//! them, aggregated per flush interval, and the node's local view of them.
//!
//! - [`aggregate`], [`names`], [`record`], [`query`]: pure. The collector (`crate::collector`)
//!   hands the aggregator messages its readers decoded (`rtnl::nflog`, `rtnl::ctevents`), the
//!   loop hands it the model's names; no I/O, no netlink.
//! - [`serve`]: the root-only unix socket the agent serves each flush's records on.
//! - [`show`]: `felix-nft flows`, the socket's client.

pub mod aggregate;
pub mod names;
pub mod query;
pub mod record;
pub mod serve;
pub mod show;

pub use aggregate::{Aggregator, Limits, Names, NflogHit, Stats};
pub use record::{
    Endpoint, EndpointKind, FlowKey, FlowRecord, PolicyHit, PolicyKind, Reporter, Verdict,
};
