//! felix-nft: Calico Felix's Linux dataplane on native nftables over raw netlink.
//!
//! Data flows one way — source → model → managers → renderer → desired kernel objects →
//! reconcilers → netlink — and each module uses only the ones below it:
//!
//! - [`config`]: Felix's parameters, their sources and validation; never touches the kernel.
//! - [`proto`]: the Felix dataplane API types, protobuf and JSON codecs, fd 3/4 framing; knows
//!   nothing of nftables.
//! - [`source`]: transports (Felix pipes, JSON stream, state document) into one bounded channel,
//!   and the fd 4 outbox that coalesces statuses; does not interpret messages.
//! - [`rules`]: Calico's rule semantics as pure functions from the model to nft objects; no I/O.
//!   `rules::incremental` re-renders only what an update touched and emits table patches, and
//!   decides which workloads live in the small side table (`rules::side`).
//! - [`nft`]: the nf_tables object model, netlink codec, transactions, dumps, diff and the watch
//!   of other programs' commits; knows nothing of Calico.
//! - [`rtnl`]: routes, neighbours, links, per-interface sysctls, the interface monitor,
//!   conntrack; knows nothing of Calico.
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
//! - [`netns`]: entering the network namespace the agent acts in; named namespaces.
//! - [`testbed`] (lab): a scratch node in namespaces (Calico CNI's layout), a cluster of such
//!   nodes on one underlay, a controller computing each node's messages as Felix's calculation
//!   graph would (pure), and traffic probes, shared by the end-to-end tests and `felix-nft demo`;
//!   reaches the kernel only through [`netns`] and [`rtnl`] (plus plain sockets), and describes
//!   its workloads as [`proto`] endpoints.
//! - [`demo`] (lab): `felix-nft demo [--cluster]`: a scratch node (or a three-node cluster, an
//!   agent per node) from the test bed, the real loop, and a traffic matrix; acts only in
//!   namespaces it made.
//! - [`bench`] (lab): `bench compare` — the same workload through felix-nft and the stock tools
//!   (iptables-restore + ipset, `nft -f`; for the cluster scale `ip -batch` + `bridge -batch`) in
//!   private namespaces; `bench flowlogs` — what flow logs cost, the agent binary on a test bed
//!   node with flow logs off and on. The only code that runs external programs, and only those
//!   baselines, the agent itself and `ip`/`bridge`/`nft` as read-back oracles.
//! - [`cli`]: the subcommands; `main.rs` stays a few lines.
//! - [`clip`]: user-supplied text cut to a bounded length for messages and logs.
//! - [`unixsock`]: a unix socket only its owner can reach (the JSON stream's and the flows').
//! - [`wire`]: netlink framing (header and flag constants, requests, a datagram's messages,
//!   answers, attribute runs) shared by [`nft`] and [`rtnl`]; uses nothing else.
//!
//! The lab modules ([`testbed`], [`demo`], [`bench`]) and their subcommands exist only with the
//! `lab` feature (on by default). They show and measure the agent rather than run it, and they
//! bring crates the agent does not need (the SVG chart), so the binary operators ship is built
//! with `--no-default-features` and its dependency tree is the agent's. Nothing outside the lab
//! uses it; tests that build on it declare `required-features = ["lab"]`.
//!
//! Comments cite what Felix does by section, `§N`: the sections of `docs/felix.md`.
// A `pub` item no other crate can reach is `pub(crate)` or narrower: the public surface says
// what the binary, the tests and the benches use.
#![warn(unreachable_pub)]

#[cfg(feature = "lab")]
pub mod bench;
pub mod cli;
pub mod clip;
pub mod collector;
pub mod config;
pub mod daemon;
pub mod dataplane;
#[cfg(feature = "lab")]
pub mod demo;
pub mod flows;
pub mod goldmane;
pub mod netns;
pub mod nft;
pub mod ops;
pub mod proto;
pub mod rtnl;
pub mod rules;
pub mod source;
#[cfg(feature = "lab")]
pub mod testbed;
pub mod unixsock;
pub mod wire;

/// One name for everything felix-nft owns in the kernel: our nf_tables tables, and the prefix
/// that `cleanup` and the resync key off.
pub const OWNER: &str = "calico";

/// The side table of each family: workload endpoints added or changed since the last merge,
/// so that a commit validates a small table instead of the whole ruleset
/// ([`rules::side`]).
pub const SIDE_TABLE: &str = "calico-side";
