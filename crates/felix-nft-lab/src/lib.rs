//! felix-nft's lab: what shows and measures the agent rather than runs it. Nothing in the agent
//! (`felix-nft`) depends on this crate, so the binary operators ship carries none of it.
//!
//! - [`testbed`]: a scratch node in namespaces (Calico CNI's layout), a cluster of such nodes on
//!   one underlay, a controller computing each node's messages as Felix's calculation graph would
//!   (pure), and traffic probes, shared by the end-to-end tests and `felix-nft-lab demo`; reaches
//!   the kernel only through [`rtnl`] (plus plain sockets), and describes its workloads as
//!   [`felix_api`] endpoints.
//! - [`demo`]: `felix-nft-lab demo [--cluster]`: a scratch node (or a three-node cluster, an
//!   agent per node) from the test bed, the real loop, and a traffic matrix; acts only in
//!   namespaces it made.
//! - [`bench`]: `bench compare` — the same workload through felix-nft and the stock tools
//!   (iptables-restore + ipset, `nft -f`; for the cluster scale `ip -batch` + `bridge -batch`) in
//!   private namespaces; `bench flowlogs` — what flow logs cost, the agent on a test bed node
//!   with flow logs off and on. The only code in the workspace that runs external programs, and
//!   only those baselines, the agent itself and `ip`/`bridge`/`nft` as read-back oracles.
//! - [`cli`]: the `felix-nft-lab` binary's commands: `demo`, `bench`, and every `felix-nft`
//!   command, so the lab's tests and benchmarks run the agent from this binary.
#![warn(unreachable_pub)]

pub mod bench;
pub mod cli;
pub mod demo;
pub mod testbed;
