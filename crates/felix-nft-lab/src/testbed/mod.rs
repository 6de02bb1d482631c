//! The traffic test bed: a scratch node in network namespaces, laid out the way Calico's CNI
//! plugin lays out a real one, and probes that tell a passed flow from a dropped one with real
//! sockets. Shared by the end-to-end tests and `felix-nft demo`. [`cluster`] builds several such
//! nodes on one underlay segment, and [`controller`] computes what Felix's calculation graph
//! would send each of them (pure).
//!
//! ```text
//!   [wl ns a] eth0 ──veth── caliXXXXXXXXXXX ┐
//!   [wl ns b] eth0 ──veth── caliYYYYYYYYYYY ┤ [host ns]  ext0 ──veth── eth0 [external ns]
//!        /32 (+/128), default via 169.254.1.1 │  (felix-nft      192.0.2.1/30    192.0.2.2/30
//!        (IPv6: via fe80::ecee:eeff:feee:eeee) │   runs here)    default route → external
//! ```
//!
//! The bed does only what a CNI plugin and the node's own setup do ([`topology`] module doc); the
//! host routes, static ARP, proxy ARP, forwarding and rules that make traffic flow are the job of
//! the dataplane under test. Use:
//!
//! ```no_run
//! # async fn demo() -> Result<(), felix_nft_lab::testbed::TestbedError> {
//! use felix_nft_lab::testbed::{probe, topology::*};
//! use std::time::Duration;
//! let topo = Topology::build(&TopologySpec {
//!     workloads: vec![WorkloadSpec::v4("a", "198.18.0.1".parse().unwrap()),
//!                     WorkloadSpec::v4("b", "198.18.0.2".parse().unwrap())],
//!     external: Some(ExternalSpec { routes_to_workloads: true, ipv6: false }),
//!     ..Default::default()
//! }).await?;
//! // ... program the host namespace (topo.host()), e.g. run felix-nft --netns topo.host_netns_name()
//! let b = topo.workload("b").unwrap();
//! let _srv = probe::TcpServer::start(b.ns(), 8080)?;
//! let v = probe::tcp_connect(topo.workload("a").unwrap().ns(),
//!     (b.ipv4.unwrap(), 8080).into(), Duration::from_millis(400))?;
//! # let _ = v; Ok(()) }
//! ```
//!
//! Everything the bed makes lives in namespaces it created (named `PREFIX-…-PID-N` under
//! `/run/netns`, so `ip -n NAME …` can inspect them) and is deleted when the [`Topology`] is
//! dropped, also on panic. No external program is run: namespaces and veths are made with the
//! syscalls and netlink messages `ip netns` and `ip link` use ([`rtnl::netns`], [`rtnl`]).
//!
//! [`Topology`]: topology::Topology

pub mod cluster;
pub mod controller;
pub mod probe;
pub mod topology;

use rtnl::netns::NetNsError;

/// Errors building the bed or running probes. Each names the operation and the object. (Large
/// sources are boxed so every `Result` of the bed stays small.)
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// Creating, entering or deleting a namespace.
    #[error("test bed namespace")]
    Netns(#[from] NetNsError),
    /// An rtnl-layer operation (link, address, route, sysctl).
    #[error("{op} {object}")]
    Rtnl {
        op: &'static str,
        object: String,
        #[source]
        source: Box<rtnl::RtnlError>,
    },
    /// A raw rtnetlink request the rtnl layer has no function for.
    #[error("{op} {object}")]
    Netlink {
        op: &'static str,
        object: String,
        #[source]
        source: Box<rtnetlink::Error>,
    },
    /// A socket or thread operation.
    #[error("{op}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The spec asks for something the bed cannot build.
    #[error("invalid test bed spec: {0}")]
    Spec(String),
}

/// The workload interfaces an `nft list ruleset` text dispatches to an ingress (`tw`) chain,
/// with that chain's name. Endpoint chains are shared by content, so the dispatch maps, not the
/// chain names, say which chain an interface uses; tests read them this way from the `nft`
/// oracle's output (each table's map: a later table's entry wins).
pub fn dispatched_ingress_chains(ruleset: &str) -> std::collections::BTreeMap<String, String> {
    // An element reads `"cali1a" : goto filter-cali-tw-…`, or with its counter
    // `"cali1a" counter packets 3 bytes 252 : goto filter-cali-tw-…` (`"cali1a" counter : …`
    // from `nft -s`).
    const GOTO: &str = " : goto filter-cali-tw-";
    let mut out = std::collections::BTreeMap::new();
    let mut rest = ruleset;
    while let Some(at) = rest.find(GOTO) {
        let chain_start = at + GOTO.len() - "filter-cali-tw-".len();
        let before = &rest[..at];
        let close = before.rfind('"').unwrap_or(0);
        let between = &before[(close + 1).min(before.len())..];
        if !(between.is_empty()
            || between == " counter"
            || between.starts_with(" counter packets "))
        {
            rest = &rest[chain_start..];
            continue;
        }
        let iface_start = before[..close].rfind('"').map_or(0, |q| q + 1);
        let iface = &before[iface_start..close];
        let chain: String = rest[chain_start..]
            .chars()
            .take_while(|c| !matches!(c, ',' | '}') && !c.is_whitespace())
            .collect();
        out.insert(iface.to_string(), chain);
        rest = &rest[chain_start..];
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn dispatched_ingress_chains_are_read_from_map_elements() {
        let text = r#"
	map filter-cali-to-wl-dispatch {
		type ifname : verdict
		counter
		elements = { "cali1a" counter packets 3 bytes 252 : goto filter-cali-tw-s.AbC,
			     "cali2b" counter : goto filter-cali-tw-s.AbC,
			     "cali3c" : goto filter-cali-tw-cali3c }
	}
	map filter-cali-from-wl-dispatch {
		elements = { "cali1a" : goto filter-cali-fw-s.x }
	}"#;
        let m = super::dispatched_ingress_chains(text);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m["cali1a"], "filter-cali-tw-s.AbC");
        assert_eq!(m["cali3c"], "filter-cali-tw-cali3c");
        assert_eq!(m["cali2b"], "filter-cali-tw-s.AbC");
    }
}
