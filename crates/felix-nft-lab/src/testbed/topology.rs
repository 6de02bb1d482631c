//! The scratch node: a "host" namespace, workload namespaces joined to it by `cali…` veths the way
//! Calico's CNI plugin leaves them, and an optional "external" namespace that is the host's
//! default route.
//!
//! What the bed does is exactly what a CNI plugin (and a node's own network setup) does, nothing
//! more (Calico `cni-plugin/internal/pkg/dataplane/linux`):
//! - per workload: a veth pair; the host end `cali<11 hex>` with MAC `ee:ee:ee:ee:ee:ee`, left up;
//!   the workload end renamed `eth0`, with a /32 (and /128) address, `lo` up, and the routes
//!   `169.254.1.1 dev eth0 scope link` + `default via 169.254.1.1 dev eth0` (IPv6:
//!   `default via fe80::ecee:eeff:feee:eeee dev eth0`, the host end's link-local address);
//! - **no** host routes, proxy_arp, forwarding, static ARP or rules in the host namespace: those
//!   are felix-nft's job (§14–15).
//!
//! Two settings go beyond a CNI plugin, both only in namespaces the bed made, so probes work at
//! once: `net.ipv4.ping_group_range = 0 2147483647` (datagram ICMP sockets, [`super::probe`]) and
//! `net.ipv6.conf.default.accept_dad = 0` (link-local addresses, among them the IPv6 gateway,
//! are usable at once instead of after ~1 s of duplicate address detection).
//!
//! Everything is torn down on drop, also on panic: each namespace is a
//! [`NamedNetNs`](rtnl::netns::NamedNetNs) guard, and veths die with their namespace.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use rtnetlink::LinkUnspec;
use sha2::{Digest, Sha256};

use super::TestbedError;
use felix_api::types::{WorkloadEndpoint, WorkloadEndpointId};
use rtnl::devconf::ProcSys;
use rtnl::netns::{unique_netns_name, NamedNetNs, NetNs};
use rtnl::{link, RtnlHandle};

/// The workload's gateway: a link-local address nobody owns; the host answers ARP for it by
/// proxy ARP (Calico FAQ "Why does my container have a route to 169.254.1.1?").
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The MAC Calico's CNI gives every host-side veth.
pub const HOST_VETH_MAC: [u8; 6] = [0xee; 6];
/// The IPv6 gateway: the EUI-64 link-local address of [`HOST_VETH_MAC`] (on the host end).
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);
/// Name of the workload end inside its namespace.
pub const WORKLOAD_IFNAME: &str = "eth0";
/// Host end of the external link.
pub const HOST_EXT_IFNAME: &str = "ext0";
/// Host address on the external link (TEST-NET-1, RFC 5737: never routed anywhere real).
pub const HOST_EXT_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// External namespace's address on that link.
pub const EXTERNAL_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// Prefix length of the external transit link (a /30).
pub const EXT_PREFIX_V4: u8 = 30;
/// Host IPv6 address on the external link (documentation range, RFC 3849).
pub const HOST_EXT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);
/// External namespace's IPv6 address.
pub const EXTERNAL_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 2);
/// Prefix length of the external IPv6 transit link.
pub const EXT_PREFIX_V6: u8 = 64;

/// The host-side interface name for a workload: `cali` + 11 hex characters of a hash of its
/// name, the shape of Calico's CNI (`VethNameForWorkload`, which hashes `namespace.pod` with
/// SHA-1; we use SHA-256 — the name only has to be stable, unique and 15 bytes long).
pub fn veth_name_for_workload(workload: &str) -> String {
    let digest = Sha256::digest(workload.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("cali{}", &hex[..11])
}

/// One workload to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// Unique within the topology; also names its namespace and `cali` interface.
    pub name: String,
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
}

impl WorkloadSpec {
    /// An IPv4-only workload.
    pub fn v4(name: impl Into<String>, ip: Ipv4Addr) -> WorkloadSpec {
        WorkloadSpec {
            name: name.into(),
            ipv4: Some(ip),
            ipv6: None,
        }
    }

    /// A dual-stack workload.
    pub fn dual(name: impl Into<String>, v4: Ipv4Addr, v6: Ipv6Addr) -> WorkloadSpec {
        WorkloadSpec {
            name: name.into(),
            ipv4: Some(v4),
            ipv6: Some(v6),
        }
    }
}

/// The optional external namespace ("the rest of the network").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalSpec {
    /// Give the external namespace a route to every workload address via the host, as a flat
    /// routed network (BGP) would. Off for NAT-outgoing scenarios, where the external side must
    /// only ever see (and be able to answer) the host's address.
    pub routes_to_workloads: bool,
    /// Also configure the IPv6 transit link and default route.
    pub ipv6: bool,
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologySpec {
    /// Prefix of every namespace name (`PREFIX-PID-N-ROLE`), so `ip netns` shows whose they are.
    pub prefix: String,
    pub workloads: Vec<WorkloadSpec>,
    pub external: Option<ExternalSpec>,
}

impl Default for TopologySpec {
    fn default() -> Self {
        TopologySpec {
            prefix: "fnt".to_string(),
            workloads: Vec::new(),
            external: None,
        }
    }
}

/// A workload as built: everything a test needs to write its `WorkloadEndpointUpdate`
/// (`name` = host interface, `mac`, `ipv4_nets`/`ipv6_nets`) and to probe from or to it.
#[derive(Debug)]
pub struct Workload {
    pub name: String,
    netns: NamedNetNs,
    /// `cali…` in the host namespace.
    pub host_ifname: String,
    /// `eth0` in the workload namespace.
    pub ifname: String,
    /// MAC of the workload's `eth0`.
    pub mac: [u8; 6],
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
}

impl Workload {
    /// The workload's namespace.
    pub fn ns(&self) -> &NetNs {
        self.netns.ns()
    }

    /// Its name under `/run/netns`.
    pub fn netns_name(&self) -> &str {
        self.netns.name()
    }

    /// Leaves the workload's namespace in place; returns its name.
    pub(super) fn keep(self) -> String {
        self.netns.keep()
    }

    /// `aa:bb:cc:dd:ee:ff`, the form of the endpoint's `mac` field.
    pub fn mac_string(&self) -> String {
        format_mac(&self.mac)
    }

    /// The workload's addresses as host prefixes (/32, /128), the form of `ipv4_nets`/`ipv6_nets`.
    pub fn nets(&self) -> Vec<IpNet> {
        let v4 = self.ipv4.map(|a| IpNet::new(IpAddr::V4(a), 32));
        let v6 = self.ipv6.map(|a| IpNet::new(IpAddr::V6(a), 128));
        v4.into_iter().chain(v6).filter_map(Result::ok).collect()
    }

    /// The endpoint id a Kubernetes-orchestrated Felix would use: (`k8s`, workload name, `eth0`).
    pub fn endpoint_id(&self) -> WorkloadEndpointId {
        WorkloadEndpointId {
            orchestrator_id: "k8s".to_string(),
            workload_id: self.name.clone(),
            endpoint_id: self.ifname.clone(),
        }
    }

    /// The `WorkloadEndpoint` that describes this workload (active, its `cali` name, MAC and
    /// addresses) with the given profiles; policy tiers are for the caller to add.
    pub fn endpoint(&self, profile_ids: &[&str]) -> WorkloadEndpoint {
        WorkloadEndpoint {
            state: "active".to_string(),
            name: self.host_ifname.clone(),
            mac: self.mac_string(),
            profile_ids: profile_ids.iter().map(|p| p.to_string()).collect(),
            ipv4_nets: self.ipv4.map(|a| format!("{a}/32")).into_iter().collect(),
            ipv6_nets: self.ipv6.map(|a| format!("{a}/128")).into_iter().collect(),
            ..WorkloadEndpoint::default()
        }
    }
}

/// The external namespace as built.
#[derive(Debug)]
pub struct External {
    netns: NamedNetNs,
    /// `ext0` in the host namespace.
    pub host_ifname: String,
    /// `eth0` in the external namespace.
    pub ifname: String,
    pub ipv4: Ipv4Addr,
    pub host_ipv4: Ipv4Addr,
    pub ipv6: Option<Ipv6Addr>,
    pub host_ipv6: Option<Ipv6Addr>,
}

impl External {
    /// The external namespace.
    pub fn ns(&self) -> &NetNs {
        self.netns.ns()
    }

    /// Its name under `/run/netns`.
    pub fn netns_name(&self) -> &str {
        self.netns.name()
    }
}

/// A built node. Dropping it deletes every namespace it made (workloads and external first, then
/// the host).
#[derive(Debug)]
pub struct Topology {
    // Field order is drop order: workloads and external before the host.
    workloads: Vec<Workload>,
    external: Option<External>,
    host: NamedNetNs,
    prefix: String,
    routes_to_workloads: bool,
}

impl Topology {
    /// Builds the node. Needs root and a tokio runtime (rtnetlink connections are spawned on
    /// it). On error everything made so far is deleted again.
    pub async fn build(spec: &TopologySpec) -> Result<Topology, TestbedError> {
        let host = NetNs::create_named(&unique_netns_name(&format!("{}-host", spec.prefix)))?;
        prepare_ns(host.ns())?;
        let hh = RtnlHandle::connect(Some(host.ns())).map_err(rtnl("connecting to", "host"))?;
        link::set_up(&hh, "lo", true)
            .await
            .map_err(rtnl("setting up", "lo in host"))?;
        let mut topo = Topology {
            workloads: Vec::new(),
            external: None,
            host,
            prefix: spec.prefix.clone(),
            routes_to_workloads: false,
        };
        if let Some(ext) = &spec.external {
            topo.external = Some(build_external(&topo.prefix, &hh, ext).await?);
            topo.routes_to_workloads = ext.routes_to_workloads;
        }
        for w in &spec.workloads {
            topo.add_workload(w).await?;
        }
        Ok(topo)
    }

    /// The host namespace (where felix-nft runs).
    pub fn host(&self) -> &NetNs {
        self.host.ns()
    }

    /// The host namespace's name under `/run/netns` (for `felix-nft --netns NAME`, `ip -n NAME`).
    pub fn host_netns_name(&self) -> &str {
        self.host.name()
    }

    /// All workloads, in creation order.
    pub fn workloads(&self) -> &[Workload] {
        &self.workloads
    }

    /// The workload called `name`.
    pub fn workload(&self, name: &str) -> Option<&Workload> {
        self.workloads.iter().find(|w| w.name == name)
    }

    /// The external namespace, when the spec asked for one.
    pub fn external(&self) -> Option<&External> {
        self.external.as_ref()
    }

    /// Adds a workload the way the CNI plugin does on pod creation (see the module doc).
    pub async fn add_workload(&mut self, spec: &WorkloadSpec) -> Result<&Workload, TestbedError> {
        if self.workload(&spec.name).is_some() {
            return Err(TestbedError::Spec(format!(
                "workload {:?} exists already",
                spec.name
            )));
        }
        let hh =
            RtnlHandle::connect(Some(self.host.ns())).map_err(rtnl("connecting to", "host"))?;
        let w = build_workload(&self.prefix, &hh, spec).await?;
        if let (true, Some(ext)) = (self.routes_to_workloads, &self.external) {
            let eh = RtnlHandle::connect(Some(ext.ns())).map_err(rtnl("connecting to", "ext"))?;
            if let Some(v4) = w.ipv4 {
                let dst = IpNet::new(IpAddr::V4(v4), 32).map_err(spec_err)?;
                link::add_route(&eh, dst, Some("eth0"), Some(IpAddr::V4(ext.host_ipv4)))
                    .await
                    .map_err(rtnl("adding external route to", &w.name))?;
            }
            if let (Some(v6), Some(gw)) = (w.ipv6, ext.host_ipv6) {
                let dst = IpNet::new(IpAddr::V6(v6), 128).map_err(spec_err)?;
                link::add_route(&eh, dst, Some("eth0"), Some(IpAddr::V6(gw)))
                    .await
                    .map_err(rtnl("adding external route to", &w.name))?;
            }
        }
        self.workloads.push(w);
        Ok(&self.workloads[self.workloads.len() - 1])
    }

    /// Leaves every namespace in place (for inspection, `felix-nft demo --keep`) and returns
    /// their names, host first; delete them with [`NetNs::delete_named`] or `ip netns del`.
    pub fn keep(self) -> Vec<String> {
        let mut names = vec![self.host.keep()];
        names.extend(self.external.map(|e| e.netns.keep()));
        names.extend(self.workloads.into_iter().map(Workload::keep));
        names
    }

    /// Removes a workload the way the CNI plugin does on pod deletion: its namespace goes, and
    /// with it both ends of the veth. Returns false when there is no such workload. (The
    /// external namespace's route to it, if any, is left: it is harmless and a real network's
    /// would also lag.)
    pub fn remove_workload(&mut self, name: &str) -> bool {
        let before = self.workloads.len();
        self.workloads.retain(|w| w.name != name);
        before != self.workloads.len()
    }
}

/// Makes one workload the way the CNI plugin does, joined to the namespace `hh` acts in (the
/// module doc); shared with [`super::cluster`], whose nodes are hosts too.
pub(super) async fn build_workload(
    prefix: &str,
    hh: &RtnlHandle,
    spec: &WorkloadSpec,
) -> Result<Workload, TestbedError> {
    if spec.ipv4.is_none() && spec.ipv6.is_none() {
        return Err(TestbedError::Spec(format!(
            "workload {:?} has no address",
            spec.name
        )));
    }
    let netns = NetNs::create_named(&unique_netns_name(&format!(
        "{prefix}-wl-{}",
        netns_safe(&spec.name)
    )))?;
    prepare_ns(netns.ns())?;
    let wh = RtnlHandle::connect(Some(netns.ns())).map_err(rtnl("connecting to", &spec.name))?;
    let host_ifname = veth_name_for_workload(&spec.name);
    // The peer gets a temporary name unique in the host namespace; it is renamed to eth0 once it
    // is in the workload's namespace (where eth0 is free).
    let tmp = format!("tmp{}", &host_ifname[4..]);
    let what = |s: &str| format!("{s} of workload {}", spec.name);

    // A workload removed a moment ago under the same name may still hold the name: its
    // namespace is freed asynchronously by the kernel (cleanup_net), veths included. Wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match link::create_veth(hh, &host_ifname, &tmp).await {
            Ok(()) => break,
            Err(e) if e.errno() == Some(libc::EEXIST) && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => return Err(rtnl("creating", &what("veth"))(e)),
        }
    }
    // A failure from here on would leave the host end behind in a host namespace that lives on:
    // delete it (both ends go) before reporting the error.
    let mac = match plumb_workload(hh, &wh, &netns, spec, &host_ifname, &tmp).await {
        Ok(mac) => mac,
        Err(e) => {
            if let Err(del) = link::delete(hh, &host_ifname).await {
                tracing::warn!(ifname = %host_ifname, error = %del, "test bed: could not remove half-made veth");
            }
            return Err(e);
        }
    };
    Ok(Workload {
        name: spec.name.clone(),
        netns,
        host_ifname,
        ifname: WORKLOAD_IFNAME.to_string(),
        mac,
        ipv4: spec.ipv4,
        ipv6: spec.ipv6,
    })
}

/// Everything after the veth exists: MAC of the host end, move and rename of the workload end,
/// its addresses and routes, host end up. Returns the MAC of the workload's `eth0`.
async fn plumb_workload(
    hh: &RtnlHandle,
    wh: &RtnlHandle,
    netns: &NamedNetNs,
    spec: &WorkloadSpec,
    host_ifname: &str,
    tmp: &str,
) -> Result<[u8; 6], TestbedError> {
    let what = |s: &str| format!("{s} of workload {}", spec.name);
    set_mac(hh, host_ifname, HOST_VETH_MAC).await?;
    link::move_to_netns(hh, tmp, netns.ns())
        .await
        .map_err(rtnl("moving", &what("veth end")))?;

    link::rename(wh, tmp, WORKLOAD_IFNAME)
        .await
        .map_err(rtnl("renaming", &what("veth end")))?;
    link::set_up(wh, "lo", true)
        .await
        .map_err(rtnl("setting up", &what("lo")))?;
    link::set_up(wh, WORKLOAD_IFNAME, true)
        .await
        .map_err(rtnl("setting up", &what("eth0")))?;
    if let Some(v4) = spec.ipv4 {
        let addr = IpNet::new(IpAddr::V4(v4), 32).map_err(spec_err)?;
        link::add_address(wh, WORKLOAD_IFNAME, addr)
            .await
            .map_err(rtnl("adding", &what("IPv4 address")))?;
        // Calico CNI: a scope-link route to the gateway, then the default route via it.
        let gw = IpNet::new(IpAddr::V4(GATEWAY_V4), 32).map_err(spec_err)?;
        link::add_route(wh, gw, Some(WORKLOAD_IFNAME), None)
            .await
            .map_err(rtnl("adding", &what("gateway route")))?;
        let default = IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0).map_err(spec_err)?;
        link::add_route(
            wh,
            default,
            Some(WORKLOAD_IFNAME),
            Some(IpAddr::V4(GATEWAY_V4)),
        )
        .await
        .map_err(rtnl("adding", &what("default route")))?;
    }
    if let Some(v6) = spec.ipv6 {
        let addr = IpNet::new(IpAddr::V6(v6), 128).map_err(spec_err)?;
        link::add_address(wh, WORKLOAD_IFNAME, addr)
            .await
            .map_err(rtnl("adding", &what("IPv6 address")))?;
        let default = IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0).map_err(spec_err)?;
        link::add_route(
            wh,
            default,
            Some(WORKLOAD_IFNAME),
            Some(IpAddr::V6(GATEWAY_V6)),
        )
        .await
        .map_err(rtnl("adding", &what("IPv6 default route")))?;
    }
    link::set_up(hh, host_ifname, true)
        .await
        .map_err(rtnl("setting up", host_ifname))?;

    let state = link::get_link(wh, WORKLOAD_IFNAME)
        .await
        .map_err(rtnl("reading", &what("eth0")))?
        .ok_or_else(|| TestbedError::Spec(what("eth0 vanished")))?;
    let mac: [u8; 6] = state
        .mac
        .as_slice()
        .try_into()
        .map_err(|_| TestbedError::Spec(format!("{}: MAC {:?}", what("eth0"), state.mac)))?;
    Ok(mac)
}

async fn build_external(
    prefix: &str,
    hh: &RtnlHandle,
    spec: &ExternalSpec,
) -> Result<External, TestbedError> {
    let netns = NetNs::create_named(&unique_netns_name(&format!("{prefix}-ext")))?;
    prepare_ns(netns.ns())?;
    let eh = RtnlHandle::connect(Some(netns.ns())).map_err(rtnl("connecting to", "external"))?;
    let tmp = "tmpext0";
    link::create_veth(hh, HOST_EXT_IFNAME, tmp)
        .await
        .map_err(rtnl("creating", "external veth"))?;
    link::move_to_netns(hh, tmp, netns.ns())
        .await
        .map_err(rtnl("moving", "external veth end"))?;
    link::rename(&eh, tmp, "eth0")
        .await
        .map_err(rtnl("renaming", "external veth end"))?;
    for (h, ifname) in [(&eh, "lo"), (&eh, "eth0"), (hh, HOST_EXT_IFNAME)] {
        link::set_up(h, ifname, true)
            .await
            .map_err(rtnl("setting up", ifname))?;
    }
    external_family(
        hh,
        &eh,
        HOST_EXT_V4.into(),
        EXTERNAL_V4.into(),
        EXT_PREFIX_V4,
        "",
    )
    .await?;
    let (mut ipv6, mut host_ipv6) = (None, None);
    if spec.ipv6 {
        let (host, ext) = (HOST_EXT_V6, EXTERNAL_V6);
        external_family(hh, &eh, host.into(), ext.into(), EXT_PREFIX_V6, "IPv6 ").await?;
        ipv6 = Some(ext);
        host_ipv6 = Some(host);
    }
    Ok(External {
        netns,
        host_ifname: HOST_EXT_IFNAME.to_string(),
        ifname: "eth0".to_string(),
        ipv4: EXTERNAL_V4,
        host_ipv4: HOST_EXT_V4,
        ipv6,
        host_ipv6,
    })
}

/// One family of the external link: `host` on the host's end, `external` on the external
/// namespace's `eth0`, and the host's default route through `external` (`fam` names the family
/// in errors: "" or "IPv6 ").
async fn external_family(
    hh: &RtnlHandle,
    eh: &RtnlHandle,
    host: IpAddr,
    external: IpAddr,
    prefix: u8,
    fam: &str,
) -> Result<(), TestbedError> {
    let net = |a: IpAddr, len| IpNet::new(a, len).map_err(spec_err);
    link::add_address(hh, HOST_EXT_IFNAME, net(host, prefix)?)
        .await
        .map_err(rtnl("adding", &format!("host external {fam}address")))?;
    link::add_address(eh, "eth0", net(external, prefix)?)
        .await
        .map_err(rtnl("adding", &format!("external {fam}address")))?;
    // A real node's default route points at its uplink; proxy ARP for 169.254.1.1 relies on it
    // (the kernel only proxies for destinations routed out of another interface).
    let any = match host {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    link::add_route(hh, net(any, 0)?, Some(HOST_EXT_IFNAME), Some(external))
        .await
        .map_err(rtnl("adding", &format!("host {fam}default route")))
}

/// `ip link set IFNAME address MAC`.
async fn set_mac(h: &RtnlHandle, ifname: &str, mac: [u8; 6]) -> Result<(), TestbedError> {
    let index = link::index_of(h, "setting MAC", ifname)
        .await
        .map_err(rtnl("looking up", ifname))?;
    let msg = LinkUnspec::new_with_index(index)
        .address(mac.to_vec())
        .build();
    h.handle()
        .link()
        .set(msg)
        .execute()
        .await
        .map_err(|e| TestbedError::Netlink {
            op: "setting MAC of",
            object: ifname.to_string(),
            source: Box::new(e),
        })
}

/// Settings for a namespace the bed just made (module doc): every group may open datagram ICMP
/// sockets (the default `1 0` allows nobody, root included), and interfaces made or moved here
/// later skip IPv6 duplicate address detection. Without the latter a host interface's
/// link-local address stays tentative for about a second, and the kernel sends no neighbour
/// solicitation for forwarded packets until it is usable (it is their source, `ndisc_solicit`).
pub(super) fn prepare_ns(ns: &NetNs) -> Result<(), TestbedError> {
    let sys = ProcSys::new(Some(ns.try_clone().map_err(io_err("cloning ns handle"))?));
    sys.write("net/ipv4/ping_group_range", "0 2147483647")
        .map_err(rtnl("setting", "net.ipv4.ping_group_range"))?;
    sys.write("net/ipv6/conf/default/accept_dad", "0")
        .map_err(rtnl("setting", "net.ipv6.conf.default.accept_dad"))
}

/// A workload name as part of a namespace name: `[A-Za-z0-9_.-]` kept, anything else `_`, at
/// most 32 characters (the namespace name also carries the prefix, pid and counter).
pub(super) fn netns_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect()
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn rtnl(op: &'static str, object: &str) -> impl FnOnce(rtnl::RtnlError) -> TestbedError {
    let object = object.to_string();
    move |source| TestbedError::Rtnl {
        op,
        object,
        source: Box::new(source),
    }
}

fn io_err(op: &'static str) -> impl FnOnce(std::io::Error) -> TestbedError {
    move |source| TestbedError::Io { op, source }
}

fn spec_err(e: ipnet::PrefixLenError) -> TestbedError {
    TestbedError::Spec(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_names_have_calico_shape_and_are_stable() {
        let a = veth_name_for_workload("default.pod-a");
        assert_eq!(a.len(), 15, "IFNAMSIZ-1");
        assert!(a.starts_with("cali"));
        assert!(a[4..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, veth_name_for_workload("default.pod-a"));
        assert_ne!(a, veth_name_for_workload("default.pod-b"));
    }

    #[test]
    fn workload_names_are_made_safe_for_namespace_names() {
        assert_eq!(netns_safe("ns1.pod-a"), "ns1.pod-a");
        assert_eq!(netns_safe("a/b c"), "a_b_c");
        assert_eq!(netns_safe(&"x".repeat(100)).len(), 32);
    }

    #[test]
    fn ipv6_gateway_is_the_eui64_address_of_the_host_mac() {
        // EUI-64: flip the U/L bit of the first byte (ee → ec), insert ff:fe in the middle.
        let m = HOST_VETH_MAC;
        let eui = [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]];
        let mut b = [0u8; 16];
        b[0] = 0xfe;
        b[1] = 0x80;
        b[8..].copy_from_slice(&eui);
        assert_eq!(Ipv6Addr::from(b), GATEWAY_V6);
        assert_eq!(format_mac(&m), "ee:ee:ee:ee:ee:ee");
    }
}
