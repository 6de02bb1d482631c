//! felix-nft, the agent: Calico Felix's Linux dataplane on native nftables over raw netlink.
//!
//! The layers below it are crates of their own ([`nf_tables`], [`rtnl`], [`felix_api`],
//! [`felix_nft_rules`], [`netlink_wire`]); this crate is what runs them as a node agent. The map
//! of the whole workspace, its invariants and where to start a change: `ARCHITECTURE.md`.
//!
//! - [`config`]: Felix's parameters, their sources and validation; never touches the kernel.
//! - [`source`]: transports (Felix pipes, JSON stream, state document) into one bounded channel,
//!   and the fd 4 outbox that coalesces statuses; does not interpret messages.
//! - [`dataplane`]: managers (record desired state, no kernel I/O in `on_update`), the apply
//!   loop, status; never encodes netlink bytes itself.
//! - [`flows`]: flow logs: NFLOG hits and conntrack events joined into flows keyed as
//!   Goldmane keys them, names from the model, and the local view's socket and filters; no
//!   netlink.
//! - [`goldmane`]: flow records streamed to Calico's Goldmane over gRPC from a bounded queue that
//!   never blocks the collector; reconnects with back-off; no netlink.
//! - [`collector`]: the agent's flow-log readers (NFLOG, conntrack events) on threads of their
//!   own, feeding [`flows`]; never blocks the apply loop.
//! - [`ops`]: health, metrics, systemd notify, logging; owns no dataplane state.
//! - [`daemon`]: the running agent: transport + interface monitor + loop + ops surface.
//! - [`alloc`]: the allocator's settings, shared by the binaries that run the agent.
//! - [`cli`]: the subcommands; `main.rs` stays a few lines.
//! - [`unixsock`]: a unix socket only its owner can reach (the JSON stream's and the flows').
//!
//! Comments cite what Felix does by section, `§N`: the sections of `docs/felix.md`.
// A `pub` item no other crate can reach is `pub(crate)` or narrower: the public surface says
// what the binary, the tests and the benches use.
#![warn(unreachable_pub)]

pub mod alloc;
pub mod cli;
pub mod collector;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod flows;
pub mod goldmane;
pub mod ops;
pub mod source;
pub mod unixsock;
