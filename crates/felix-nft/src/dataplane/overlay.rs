//! Cross-node networking (§15/§17): from this node's and the other
//! nodes' VXLAN tunnel endpoints, Felix's route updates (IPAM blocks), the IP pools and the host's
//! interfaces, the VXLAN devices, their FDB, their ARP/NDP entries and the cluster routes wanted.
//! Pure: no I/O; the loop hands the result to the kernel seam.
//!
//! One device per family, `vxlan.calico` (IPv4) and `vxlan-v6.calico` (IPv6), each built the same
//! way from its family's half of the VTEPs:
//! - the device exists once VXLAN of its family is on (config `VXLANEnabled`/`VXLANEnabledV6`,
//!   else Felix's `Encapsulation` once one came, else a pool of the family with VXLAN, else a VTEP
//!   of the family has arrived: Encapsulation may follow InSync) and this node's VTEP and the
//!   interface holding its address are known;
//! - its MTU is `VXLANMTU`/`VXLANMTUV6`, or the parent's less the encapsulation (50, 70), and the
//!   routes through it carry the same MTU;
//! - per remote VTEP: a permanent neighbour entry (tunnel IP → VTEP MAC) on the device and an FDB
//!   entry (VTEP MAC → node IP);
//! - per remote VXLAN block: `via <VTEP tunnel IP> dev <device> onlink`, or in cross-subnet mode
//!   `via <node IP> dev <parent> onlink proto 80`; a remote tunnel address in its own block (or
//!   borrowed) goes straight onto the device. No VTEP yet: no route until it comes.
//!
//! IPIP (IPv4 only) is Felix's `tunl0`, the kernel's fallback tunnel, configured once this
//! node's address is found on an interface (the parent): its MTU is `IpInIpMtu` or the parent's
//! less 20, its one IPv4 address `IpInIpTunnelAddr`, and it is up. When Felix programs IPIP
//! routes (`ProgramClusterRoutes` `Enabled` or `EnabledIPIPOnly`), each remote block of an IPIP
//! pool goes `via <node's host IP> dev tunl0 onlink proto 80 mtu …`, or in cross-subnet mode
//! straight via the parent as VXLAN's do. IPIP off without `IpInIpEnabled` set strips tunl0's
//! IPv4 addresses (the kernel owns the device).
//!
//! WireGuard's table and peers are [`super::wireguard`]'s: the main table's routes here are the
//! fallback for nodes WireGuard does not encrypt to.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use felix_api::{Encapsulation, IpPoolType, IpamPool, RouteType, RouteUpdate};
use felix_api::{HostMetadataUpdate, VxlanTunnelEndpointUpdate};
use rtnl::ipip::{IpipSpec, IpipWanted, IPIP_IFACE};
use rtnl::neigh::Mac;
use rtnl::routes::{RouteSpec, RouteTarget};
use rtnl::vxlan::{Entries, VxlanSpec, VxlanWanted};

use super::validate::parse_mac;
use super::{IfaceInfo, RouteParams};

/// Felix's IPv4 VXLAN device.
pub const VXLAN_IFACE_V4: &str = "vxlan.calico";
/// Felix's IPv6 VXLAN device.
pub const VXLAN_IFACE_V6: &str = "vxlan-v6.calico";
/// The route group of one remote block (tunnel or same-subnet, either family): one group per
/// destination, so a block or VTEP that changes restates its own route only.
pub fn block_group(dst: &IpNet) -> String {
    format!("overlay {dst}")
}

/// Whether `name` is one of the tunnel devices the overlay keeps (their state, addresses
/// and routes are ours to restore).
pub fn is_tunnel_iface(name: &str) -> bool {
    name == VXLAN_IFACE_V4 || name == VXLAN_IFACE_V6 || name == IPIP_IFACE
}

/// The route group of no-encap cluster routes (remote blocks of pools without encapsulation).
pub const NOENCAP_GROUP: &str = "noencap";

/// What IPIP adds to the header: the device's MTU is the parent's less this.
const IPIP_OVERHEAD: u32 = 20;

/// The overlay's configuration.
#[derive(Debug, Clone)]
pub struct OverlayConfig {
    /// This node's name (`FelixHostname`): the VTEP with this name is the local one.
    pub hostname: String,
    /// `VXLANEnabled`; `None`: derived.
    pub vxlan_enabled: Option<bool>,
    /// `VXLANEnabledV6`; `None`: derived.
    pub vxlan_enabled_v6: Option<bool>,
    /// `VXLANVNI` (4096).
    pub vni: u32,
    /// `VXLANPort` (4789).
    pub port: u16,
    /// `VXLANMTU`; `None` (0): the parent's MTU less 50.
    pub mtu: Option<u32>,
    /// `VXLANMTUV6`; `None` (0): the parent's MTU less 70.
    pub mtu_v6: Option<u32>,
    /// `ProgramClusterRoutes` is `Enabled` or `EnabledNoEncapOnly`: Felix, not BIRD, routes
    /// the blocks of pools without encapsulation.
    pub noencap_routes: bool,
    /// `IpInIpEnabled`; `None`: derived (and tunl0's addresses are stripped while IPIP is off).
    pub ipip_enabled: Option<bool>,
    /// `IpInIpMtu`; `None` (0): the parent's MTU less 20.
    pub ipip_mtu: Option<u32>,
    /// `IpInIpTunnelAddr`: tunl0's address; `None`: tunl0 is not configured.
    pub ipip_addr: Option<Ipv4Addr>,
    /// `ProgramClusterRoutes` is `Enabled` or `EnabledIPIPOnly`: Felix, not BIRD, routes the
    /// remote blocks of IPIP pools.
    pub ipip_routes: bool,
}

impl Default for OverlayConfig {
    fn default() -> Self {
        OverlayConfig {
            hostname: String::new(),
            vxlan_enabled: None,
            vxlan_enabled_v6: None,
            vni: 4096,
            port: 4789,
            mtu: None,
            mtu_v6: None,
            noencap_routes: false,
            ipip_enabled: None,
            ipip_mtu: None,
            ipip_addr: None,
            ipip_routes: false,
        }
    }
}

/// What the overlay wants in the kernel for one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceDesired {
    /// `vxlan.calico` or `vxlan-v6.calico`.
    pub name: &'static str,
    /// The device (`None`: this node's VTEP or its parent not known yet; leave it alone).
    pub spec: Option<VxlanSpec>,
    /// MAC → remote node IP.
    pub fdb: Vec<(Mac, IpAddr)>,
    /// Tunnel IP → MAC, on the device.
    pub neighbours: Vec<(IpAddr, Mac)>,
    /// Routes via the device.
    pub tunnel_routes: Vec<RouteSpec>,
    /// Same-subnet routes via the parent interface.
    pub same_subnet_routes: Vec<RouteSpec>,
}

/// What the overlay wants in the kernel: one entry per family whose VXLAN is on, the no-encap
/// cluster routes (both families), tunl0 and the IPIP cluster routes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlayDesired {
    pub devices: Vec<DeviceDesired>,
    pub noencap_routes: Vec<RouteSpec>,
    pub ipip: IpipWanted,
    pub ipip_routes: Vec<RouteSpec>,
}

impl OverlayDesired {
    /// The device of this name, if its family is on.
    pub fn device(&self, name: &str) -> Option<&DeviceDesired> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// Overlay state that is not in the rules model.
/// Whether the VTEP has a tunnel address of each family (IPv4, IPv6): what turns VXLAN on
/// when nothing else decides.
pub fn vtep_families(v: &VxlanTunnelEndpointUpdate) -> [bool; 2] {
    [V4, V6].map(|f| !f.tunnel_addr(v).is_empty())
}

/// A VTEP's entries of each family (IPv4, IPv6): tunnel address, MAC, node address.
pub type VtepEntries = [Option<(IpAddr, Mac, IpAddr)>; 2];

/// The entries of `v` (none when absent or malformed).
pub fn vtep_entries(v: Option<&VxlanTunnelEndpointUpdate>) -> VtepEntries {
    [V4, V6].map(|f| v.and_then(|v| f.vtep(v)))
}

/// What changed since the overlay was last stated, when nothing global did (pools,
/// encapsulation, this node's VTEP and address, the host's interfaces): remote nodes whose VTEP
/// changed, with its entries as they were before the first of those changes; remote nodes
/// whose host address changed (the gateway of their IPIP routes); and the destinations of the
/// VXLAN and IPIP routes that changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlayKeys {
    pub nodes: BTreeMap<String, VtepEntries>,
    pub hosts: BTreeSet<String>,
    pub dsts: BTreeSet<String>,
}

impl OverlayKeys {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.hosts.is_empty() && self.dsts.is_empty()
    }
}

/// The overlay's changes for [`OverlayKeys`]: each device with the FDB and neighbour entries
/// that changed, and the route group of each destination touched (empty: the route goes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlayDelta {
    pub devices: Vec<VxlanWanted>,
    pub routes: BTreeMap<String, Vec<RouteSpec>>,
}

/// What a device's routes depend on besides the route itself.
struct DeviceCtx {
    spec: Option<VxlanSpec>,
    parent: Option<String>,
    mtu: Option<u32>,
}

/// Which remote nodes want each FDB MAC and each neighbour address, per family (IPv4, IPv6).
/// Two nodes claiming one key is a misconfiguration; the last node in name order wins it, as
/// when every VTEP is stated, so a delta names the same winner as the whole overlay would.
#[derive(Debug, Default)]
struct Claims {
    fdb: [BTreeMap<Mac, BTreeSet<String>>; 2],
    neigh: [BTreeMap<IpAddr, BTreeSet<String>>; 2],
}

impl Claims {
    fn fdb_winner(&self, i: usize, mac: &Mac) -> Option<&str> {
        self.fdb[i].get(mac)?.last().map(String::as_str)
    }

    fn neigh_winner(&self, i: usize, ip: &IpAddr) -> Option<&str> {
        self.neigh[i].get(ip)?.last().map(String::as_str)
    }
}

#[derive(Debug, Default)]
pub struct Overlay {
    pub cfg: OverlayConfig,
    /// Felix's last `Encapsulation`.
    pub encap: Option<Encapsulation>,
    /// The remote VTEPs' FDB and neighbour keys, for deltas.
    claims: Claims,
    /// What was already reported as unsupported (each said once).
    warned: BTreeSet<String>,
}

/// One family's view of the VTEPs and the device.
#[derive(Clone, Copy)]
struct Fam {
    v6: bool,
    device: &'static str,
    /// The encapsulation's overhead: the device's MTU is the parent's less this.
    overhead: u32,
}

const V4: Fam = Fam {
    v6: false,
    device: VXLAN_IFACE_V4,
    overhead: 50,
};
const V6: Fam = Fam {
    v6: true,
    device: VXLAN_IFACE_V6,
    overhead: 70,
};

impl Fam {
    /// A VTEP's (tunnel IP, MAC, node IP) of this family.
    fn vtep(self, v: &VxlanTunnelEndpointUpdate) -> Option<(IpAddr, Mac, IpAddr)> {
        let (tip, mac, host) = if self.v6 {
            (&v.ipv6_addr, &v.mac_v6, &v.parent_device_ipv6)
        } else {
            (&v.ipv4_addr, &v.mac, &v.parent_device_ip)
        };
        let (tip, host) = (strip(tip)?, strip(host)?);
        (tip.is_ipv6() == self.v6 && host.is_ipv6() == self.v6).then_some((
            tip,
            parse_mac(mac)?,
            host,
        ))
    }

    /// The VTEP's tunnel address of this family, as sent.
    fn tunnel_addr(self, v: &VxlanTunnelEndpointUpdate) -> &str {
        if self.v6 {
            &v.ipv6_addr
        } else {
            &v.ipv4_addr
        }
    }

    fn of(self, net: &IpNet) -> bool {
        net.addr().is_ipv6() == self.v6
    }
}

/// The host interface that holds this node's address `own` (§2.3): the underlay parent of the
/// tunnel, or of the routes that go straight to other nodes.
/// Drops `node`'s claim on `key`.
fn release<K: Ord>(claims: &mut BTreeMap<K, BTreeSet<String>>, key: &K, node: &str) {
    if let Some(nodes) = claims.get_mut(key) {
        nodes.remove(node);
        if nodes.is_empty() {
            claims.remove(key);
        }
    }
}

fn parent_iface<'i>(
    ifaces: &'i BTreeMap<String, IfaceInfo>,
    own: IpAddr,
    is_workload_iface: &impl Fn(&str) -> bool,
) -> Option<(&'i String, &'i IfaceInfo)> {
    ifaces.iter().find(|(name, i)| {
        !is_workload_iface(name)
            && name.as_str() != VXLAN_IFACE_V4
            && name.as_str() != VXLAN_IFACE_V6
            && name.as_str() != IPIP_IFACE
            && i.addrs.iter().any(|a| a.addr() == own)
    })
}

fn strip(s: &str) -> Option<IpAddr> {
    s.split('/').next()?.parse().ok()
}

/// The route of one remote IPIP block (Felix's route manager with the IPIP manager's tunnel
/// route): a remote workload block, or a remote tunnel address in its own block or borrowed.
/// Same subnet with the parent known: straight via the node's address on the parent.
/// Otherwise through tunl0 to the node's host address, once its host metadata is known.
fn ipip_route(
    r: &RouteUpdate,
    hosts: &BTreeMap<String, HostMetadataUpdate>,
    parent: Option<&str>,
    mtu: Option<u32>,
    p: RouteParams,
) -> Option<RouteSpec> {
    if r.ip_pool_type != IpPoolType::Ipip as i32 {
        return None;
    }
    let dst = r
        .dst
        .parse::<IpNet>()
        .ok()
        .filter(|d| d.addr().is_ipv4())?
        .trunc();
    let remote_workload = r.types & RouteType::RemoteWorkload as i32 != 0;
    let borrowed_tunnel = r.types & RouteType::RemoteTunnel as i32 != 0 && r.borrowed;
    if !remote_workload && !borrowed_tunnel {
        return None;
    }
    let node_ip = strip(&r.dst_node_ip).filter(IpAddr::is_ipv4);
    let (via, dev, mtu) = match (r.same_subnet, parent, node_ip) {
        (true, Some(parent), Some(gw)) => (gw, parent, None),
        _ => {
            let gw = hosts
                .get(&r.dst_node_name)
                .and_then(|h| strip(&h.ipv4_addr))
                .filter(IpAddr::is_ipv4)?;
            (gw, IPIP_IFACE, mtu)
        }
    };
    Some(RouteSpec {
        dst,
        target: RouteTarget::Gateway {
            via,
            dev: Some(dev.to_string()),
            onlink: true,
        },
        protocol: p.felix_protocol(),
        metric: p.metric(false),
        src: None,
        mtu,
    })
}

fn mode_on(m: &str) -> bool {
    !m.is_empty() && !m.eq_ignore_ascii_case("never")
}

impl Overlay {
    pub fn new(cfg: OverlayConfig) -> Overlay {
        Overlay {
            cfg,
            ..Overlay::default()
        }
    }

    /// Whether IPv4 VXLAN is on.
    pub fn vxlan_enabled(
        &self,
        pools: &BTreeMap<String, IpamPool>,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
    ) -> bool {
        self.enabled(V4, pools, vteps)
    }

    /// Whether IPv6 VXLAN is on.
    pub fn vxlan_enabled_v6(
        &self,
        pools: &BTreeMap<String, IpamPool>,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
    ) -> bool {
        self.enabled(V6, pools, vteps)
    }

    /// Whether VXLAN of each family (IPv4, IPv6) is on, when the caller knows whether any VTEP
    /// has an address of each: no pass over the VTEPs, which a thousand VTEP messages at start
    /// of day would each make.
    pub fn vxlan_on(
        &self,
        pools: &BTreeMap<String, IpamPool>,
        vteps_with: [bool; 2],
    ) -> (bool, bool) {
        (
            self.enabled_by(V4, pools, || vteps_with[0]),
            self.enabled_by(V6, pools, || vteps_with[1]),
        )
    }

    fn enabled(
        &self,
        f: Fam,
        pools: &BTreeMap<String, IpamPool>,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
    ) -> bool {
        self.enabled_by(f, pools, || {
            vteps.values().any(|v| !f.tunnel_addr(v).is_empty())
        })
    }

    /// Configuration, else Felix's `Encapsulation`, else the pools, else `any_vtep`.
    fn enabled_by(
        &self,
        f: Fam,
        pools: &BTreeMap<String, IpamPool>,
        any_vtep: impl FnOnce() -> bool,
    ) -> bool {
        let cfg = if f.v6 {
            self.cfg.vxlan_enabled_v6
        } else {
            self.cfg.vxlan_enabled
        };
        if let Some(v) = cfg {
            return v;
        }
        // Felix's own verdict, from the pools, once it has sent one.
        if let Some(e) = &self.encap {
            return if f.v6 {
                e.vxlan_enabled_v6
            } else {
                e.vxlan_enabled
            };
        }
        pools
            .values()
            .any(|p| mode_on(&p.vxlan_mode) && p.cidr.parse::<IpNet>().is_ok_and(|n| f.of(&n)))
            || any_vtep()
    }

    /// The tunnel devices, of the families whose VXLAN is on (`on`: IPv4, IPv6), that carry
    /// this node's tunnel address: host traffic leaving them from another local address is
    /// masqueraded (§7.11).
    pub fn tunnel_ifaces(
        &self,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
        on: (bool, bool),
    ) -> (Vec<String>, Vec<String>) {
        let local = vteps.get(&self.cfg.hostname);
        let of = |f: Fam, on: bool| {
            (on && local.and_then(|v| f.vtep(v)).is_some())
                .then(|| f.device.to_string())
                .into_iter()
                .collect()
        };
        (of(V4, on.0), of(V6, on.1))
    }

    /// Records that remote node `node`'s VTEP entries went from `was` to `now` (before the
    /// model records the VTEP).
    pub fn vtep_changed(&mut self, node: &str, was: &VtepEntries, now: &VtepEntries) {
        if node == self.cfg.hostname {
            return;
        }
        for i in 0..2 {
            if let Some((tip, mac, _)) = was[i] {
                release(&mut self.claims.fdb[i], &mac, node);
                release(&mut self.claims.neigh[i], &tip, node);
            }
            if let Some((tip, mac, _)) = now[i] {
                self.claims.fdb[i]
                    .entry(mac)
                    .or_default()
                    .insert(node.to_string());
                self.claims.neigh[i]
                    .entry(tip)
                    .or_default()
                    .insert(node.to_string());
            }
        }
    }

    /// Reports, once, IPIP on without `IpInIpTunnelAddr`: tunl0 cannot be configured, and the
    /// routes through it wait for it.
    pub fn warn_ipip(&mut self, pools: &BTreeMap<String, IpamPool>) {
        if self.ipip_on(pools) && self.cfg.ipip_addr.is_none() {
            self.warn_once("ipip address".into(), || {
                tracing::warn!(
                    "IPIP is on but IpInIpTunnelAddr is not set: tunl0 is not configured, \
                     and the IPIP routes through it wait for it"
                );
            });
        }
    }

    /// Whether IPIP is on: `IpInIpEnabled`, else Felix's `Encapsulation`, else an IPv4 pool
    /// with IPIP.
    pub fn ipip_on(&self, pools: &BTreeMap<String, IpamPool>) -> bool {
        if let Some(v) = self.cfg.ipip_enabled {
            return v;
        }
        if let Some(e) = &self.encap {
            return e.ipip_enabled;
        }
        pools.values().any(|p| {
            mode_on(&p.ipip_mode) && p.cidr.parse::<IpNet>().is_ok_and(|n| n.addr().is_ipv4())
        })
    }

    /// tunl0 when it carries this node's tunnel address: host traffic leaving it from another
    /// local address is masqueraded (§7.11).
    pub fn ipip_tunnel_iface(&self, pools: &BTreeMap<String, IpamPool>) -> Option<String> {
        (self.ipip_on(pools) && self.cfg.ipip_addr.is_some()).then(|| IPIP_IFACE.to_string())
    }

    /// tunl0 and the IPIP cluster routes (Felix's IPIP manager, reference overlay §3).
    fn ipip_desired(
        &self,
        pools: &BTreeMap<String, IpamPool>,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        routes: &BTreeMap<String, RouteUpdate>,
        ifaces: &BTreeMap<String, IfaceInfo>,
        is_workload_iface: &impl Fn(&str) -> bool,
        p: RouteParams,
    ) -> (IpipWanted, Vec<RouteSpec>) {
        if !self.ipip_on(pools) {
            let want = if self.cfg.ipip_enabled.is_none() {
                IpipWanted::Strip
            } else {
                IpipWanted::Leave
            };
            return (want, Vec::new());
        }
        let (parent, mtu) = self.ipip_ctx(hosts, ifaces, is_workload_iface);
        let want = match (parent, mtu, self.cfg.ipip_addr) {
            (Some(_), Some(mtu), Some(addr)) => IpipWanted::Configure(IpipSpec { mtu, addr }),
            _ => IpipWanted::Leave,
        };
        if !self.cfg.ipip_routes {
            return (want, Vec::new());
        }
        let routes = routes
            .values()
            .filter_map(|r| ipip_route(r, hosts, parent, mtu, p))
            .collect();
        (want, routes)
    }

    /// What IPIP routes depend on besides the route and its node: the parent (the interface
    /// holding this node's IPv4 address) and tunl0's MTU.
    fn ipip_ctx<'i>(
        &self,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        ifaces: &'i BTreeMap<String, IfaceInfo>,
        is_workload_iface: &impl Fn(&str) -> bool,
    ) -> (Option<&'i str>, Option<u32>) {
        let own = hosts
            .get(&self.cfg.hostname)
            .and_then(|h| strip(&h.ipv4_addr))
            .filter(IpAddr::is_ipv4);
        let parent = own.and_then(|a| parent_iface(ifaces, a, is_workload_iface));
        let mtu = self.cfg.ipip_mtu.or_else(|| {
            parent
                .map(|(_, i)| i.mtu)
                .filter(|&m| m > IPIP_OVERHEAD)
                .map(|m| m - IPIP_OVERHEAD)
        });
        (parent.map(|(name, _)| name.as_str()), mtu)
    }

    fn warn_once(&mut self, key: String, f: impl FnOnce()) {
        if self.warned.insert(key) {
            f();
        }
    }

    /// The desired overlay state.
    #[allow(clippy::too_many_arguments)]
    pub fn desired(
        &self,
        pools: &BTreeMap<String, IpamPool>,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        routes: &BTreeMap<String, RouteUpdate>,
        ifaces: &BTreeMap<String, IfaceInfo>,
        is_workload_iface: impl Fn(&str) -> bool,
        p: RouteParams,
    ) -> OverlayDesired {
        let devices = [V4, V6]
            .into_iter()
            .filter(|&f| self.enabled(f, pools, vteps))
            .map(|f| self.device_desired(f, vteps, routes, ifaces, &is_workload_iface, p))
            .collect();
        let (ipip, ipip_routes) =
            self.ipip_desired(pools, hosts, routes, ifaces, &is_workload_iface, p);
        OverlayDesired {
            devices,
            noencap_routes: self.noencap_routes(
                pools,
                hosts,
                routes,
                ifaces,
                &is_workload_iface,
                p,
            ),
            ipip,
            ipip_routes,
        }
    }

    /// Felix's no-encap manager (reference overlay §4): with `ProgramClusterRoutes` giving it
    /// the job and a pool without encapsulation in use, each remote block of such a pool goes
    /// `via <node IP> dev <parent> onlink proto 80`; the parent is the interface that holds this
    /// node's own address (from its host metadata). No parent known: no route (there is no
    /// tunnel to fall back on).
    fn noencap_routes(
        &self,
        pools: &BTreeMap<String, IpamPool>,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        routes: &BTreeMap<String, RouteUpdate>,
        ifaces: &BTreeMap<String, IfaceInfo>,
        is_workload_iface: &impl Fn(&str) -> bool,
        p: RouteParams,
    ) -> Vec<RouteSpec> {
        let needed = self.encap.as_ref().is_some_and(|e| e.no_encap_enabled)
            || pools
                .values()
                .any(|p| !mode_on(&p.ipip_mode) && !mode_on(&p.vxlan_mode));
        if !self.cfg.noencap_routes || !needed {
            return Vec::new();
        }
        let me = hosts.get(&self.cfg.hostname);
        let parent_of = |v6: bool| {
            let own = strip(me.map(|h| if v6 { &h.ipv6_addr } else { &h.ipv4_addr })?)?;
            parent_iface(ifaces, own, is_workload_iface).map(|(name, _)| name.clone())
        };
        let parents = [parent_of(false), parent_of(true)];
        let remote_workload = RouteType::RemoteWorkload as i32;
        routes
            .values()
            .filter(|r| {
                r.ip_pool_type == IpPoolType::NoEncap as i32 && r.types & remote_workload != 0
            })
            .filter_map(|r| {
                let dst = r.dst.parse::<IpNet>().ok()?.trunc();
                let v6 = dst.addr().is_ipv6();
                let gw = strip(&r.dst_node_ip).filter(|a| a.is_ipv6() == v6)?;
                let parent = parents[usize::from(v6)].clone()?;
                Some(RouteSpec {
                    dst,
                    target: RouteTarget::Gateway {
                        via: gw,
                        dev: Some(parent),
                        onlink: true,
                    },
                    protocol: p.felix_protocol(),
                    metric: p.metric(v6),
                    src: None,
                    mtu: None,
                })
            })
            .collect()
    }

    fn device_desired(
        &self,
        f: Fam,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
        routes: &BTreeMap<String, RouteUpdate>,
        ifaces: &BTreeMap<String, IfaceInfo>,
        is_workload_iface: &impl Fn(&str) -> bool,
        p: RouteParams,
    ) -> DeviceDesired {
        let ctx = self.device_ctx(f, vteps, ifaces, is_workload_iface);
        let mut d = DeviceDesired {
            name: f.device,
            spec: ctx.spec.clone(),
            fdb: Vec::new(),
            neighbours: Vec::new(),
            tunnel_routes: Vec::new(),
            same_subnet_routes: Vec::new(),
        };
        // Remote VTEPs (this family's part): tunnel IP, MAC, node IP.
        let mut remote: BTreeMap<&str, IpAddr> = BTreeMap::new();
        for (node, v) in vteps.iter().filter(|(n, _)| **n != self.cfg.hostname) {
            if let Some((tip, mac, host)) = f.vtep(v) {
                remote.insert(node.as_str(), tip);
                d.fdb.push((mac, host));
                d.neighbours.push((tip, mac));
            }
        }
        for r in routes.values() {
            match self.block_route(f, r, &ctx, |n| remote.get(n).copied(), p) {
                Some((true, spec)) => d.same_subnet_routes.push(spec),
                Some((false, spec)) => d.tunnel_routes.push(spec),
                None => {}
            }
        }
        d
    }

    /// The device of family `f` (this node's VTEP and the interface holding its address) and
    /// the MTU of its routes.
    fn device_ctx(
        &self,
        f: Fam,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
        ifaces: &BTreeMap<String, IfaceInfo>,
        is_workload_iface: &impl Fn(&str) -> bool,
    ) -> DeviceCtx {
        let local = vteps.get(&self.cfg.hostname).and_then(|v| f.vtep(v));
        // The parent: the host interface that holds this node's address (§2.3).
        let parent = local.and_then(|(_, _, host)| parent_iface(ifaces, host, is_workload_iface));
        let cfg_mtu = if f.v6 { self.cfg.mtu_v6 } else { self.cfg.mtu };
        // Felix's auto MTU: the host's less the encapsulation; the routes carry it too, so a
        // pod's packets are cut to fit before they reach the device.
        let mtu = cfg_mtu.or_else(|| {
            parent
                .map(|(_, i)| i.mtu)
                .filter(|&m| m > f.overhead)
                .map(|m| m - f.overhead)
        });
        let parent = parent.map(|(name, _)| name.clone());
        let spec = match (local, &parent) {
            (Some((tip, mac, host)), Some(parent)) => Some(VxlanSpec {
                name: f.device.into(),
                vni: self.cfg.vni,
                port: self.cfg.port,
                parent: parent.clone(),
                local: host,
                mac,
                mtu,
                addr: tip,
            }),
            _ => None,
        };
        DeviceCtx { spec, parent, mtu }
    }

    /// The route of one remote VXLAN block of family `f`: `(true, …)` straight via the node
    /// in cross-subnet mode, `(false, …)` through the tunnel; `None` when `r` is not one (or
    /// its node's VTEP, found by `remote_tip`, has not come yet).
    fn block_route(
        &self,
        f: Fam,
        r: &RouteUpdate,
        ctx: &DeviceCtx,
        remote_tip: impl Fn(&str) -> Option<IpAddr>,
        p: RouteParams,
    ) -> Option<(bool, RouteSpec)> {
        if r.ip_pool_type != IpPoolType::Vxlan as i32 {
            return None;
        }
        let dst = r.dst.parse::<IpNet>().ok().filter(|d| f.of(d))?.trunc();
        let metric = p.metric(f.v6);
        let remote_workload = RouteType::RemoteWorkload as i32;
        let remote_tunnel = RouteType::RemoteTunnel as i32;
        let tunnel_own_block = r.types & remote_tunnel != 0 && r.types & remote_workload != 0;
        let borrowed_tunnel = r.types & remote_tunnel != 0 && r.borrowed;
        if r.types & remote_workload == 0 && !borrowed_tunnel {
            return None;
        }
        let node_ip = strip(&r.dst_node_ip).filter(|a| a.is_ipv6() == f.v6);
        if let (true, Some(parent), Some(gw)) = (r.same_subnet, &ctx.parent, node_ip) {
            return Some((
                true,
                RouteSpec {
                    dst,
                    target: RouteTarget::Gateway {
                        via: gw,
                        dev: Some(parent.clone()),
                        onlink: true,
                    },
                    protocol: p.felix_protocol(),
                    metric,
                    src: None,
                    mtu: None,
                },
            ));
        }
        let target = if tunnel_own_block || borrowed_tunnel {
            RouteTarget::Device(f.device.into())
        } else {
            // Programmed once the node's VTEP arrives.
            let tip = remote_tip(r.dst_node_name.as_str())?;
            RouteTarget::Gateway {
                via: tip,
                dev: Some(f.device.into()),
                onlink: true,
            }
        };
        Some((
            false,
            RouteSpec {
                dst,
                target,
                protocol: p.protocol,
                metric,
                src: None,
                mtu: ctx.mtu,
            },
        ))
    }

    /// The changes [`OverlayKeys`] name, as [`Overlay::desired`] would state them: per device
    /// of a family whose VXLAN is on, the FDB and neighbour entries of the nodes named (the old
    /// ones dropped where they changed), and the route group of every destination named or
    /// routed to a node named (VXLAN or IPIP). The caller asks for it only when nothing global
    /// changed: this node's own VTEP and address, the pools, the encapsulation and the
    /// interfaces are as last stated. `on`: whether each family's VXLAN is on
    /// ([`Overlay::vxlan_on`]; no pass over the VTEPs); `ipip`: whether IPIP is
    /// ([`Overlay::ipip_on`]).
    #[allow(clippy::too_many_arguments)]
    pub fn delta(
        &self,
        on: [bool; 2],
        ipip: bool,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        routes: &BTreeMap<String, RouteUpdate>,
        ifaces: &BTreeMap<String, IfaceInfo>,
        is_workload_iface: impl Fn(&str) -> bool,
        p: RouteParams,
        keys: &OverlayKeys,
    ) -> OverlayDelta {
        let mut out = OverlayDelta::default();
        // The destinations whose route may change: those named, and those of the nodes named
        // (their gateway is the node's tunnel or host address). One pass of string comparisons.
        let mut dsts: BTreeSet<&str> = keys.dsts.iter().map(String::as_str).collect();
        if !keys.nodes.is_empty() || !keys.hosts.is_empty() {
            dsts.extend(
                routes
                    .iter()
                    .filter(|(_, r)| {
                        keys.nodes.contains_key(&r.dst_node_name)
                            || keys.hosts.contains(&r.dst_node_name)
                    })
                    .map(|(k, _)| k.as_str()),
            );
        }
        let ipip = (ipip && self.cfg.ipip_routes)
            .then(|| self.ipip_ctx(hosts, ifaces, &is_workload_iface));
        let remote = |f: Fam| {
            move |node: &str| {
                (node != self.cfg.hostname)
                    .then(|| vteps.get(node).and_then(|v| f.vtep(v)))
                    .flatten()
                    .map(|(tip, _, _)| tip)
            }
        };
        for (i, f) in [V4, V6].into_iter().enumerate() {
            let ctx = on[i].then(|| self.device_ctx(f, vteps, ifaces, &is_workload_iface));
            for dst in &dsts {
                let Ok(net) = dst.parse::<IpNet>() else {
                    continue;
                };
                if !f.of(&net) {
                    continue;
                }
                let r = routes.get(*dst);
                let vxlan = ctx.as_ref().and_then(|ctx| {
                    self.block_route(f, r?, ctx, remote(f), p)
                        .map(|(_, spec)| spec)
                });
                let spec = vxlan.or_else(|| {
                    let (parent, mtu) = ipip?;
                    ipip_route(r?, hosts, parent, mtu, p)
                });
                out.routes
                    .insert(block_group(&net.trunc()), spec.into_iter().collect());
            }
            let Some(ctx) = ctx else {
                continue;
            };
            // Every key the nodes named had or have, with the entry of the node that now wins
            // it (none: the entry goes).
            let (mut macs, mut tips) = (BTreeSet::new(), BTreeSet::new());
            for (node, was) in keys.nodes.iter().filter(|(n, _)| **n != self.cfg.hostname) {
                let now = vteps.get(node).and_then(|v| f.vtep(v));
                for (tip, mac, _) in was[i].into_iter().chain(now) {
                    macs.insert(mac);
                    tips.insert(tip);
                }
            }
            let entry_of =
                |node: Option<&str>| node.and_then(|n| vteps.get(n)).and_then(|v| f.vtep(v));
            let fdb = macs
                .into_iter()
                .map(|mac| {
                    let host = entry_of(self.claims.fdb_winner(i, &mac)).map(|(_, _, h)| h);
                    (mac, host)
                })
                .collect();
            let neighbours = tips
                .into_iter()
                .map(|tip| {
                    let mac = entry_of(self.claims.neigh_winner(i, &tip)).map(|(_, m, _)| m);
                    (tip, mac)
                })
                .collect();
            out.devices.push(VxlanWanted {
                name: f.device.into(),
                spec: ctx.spec,
                fdb: Entries::Changed(fdb),
                neighbour_changes: neighbours,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vtep(node: &str, n: u8) -> VxlanTunnelEndpointUpdate {
        VxlanTunnelEndpointUpdate {
            node: node.into(),
            mac: format!("66:00:00:00:00:{n:02x}"),
            ipv4_addr: format!("10.65.{n}.0"),
            parent_device_ip: format!("172.31.0.1{n}"),
            ..Default::default()
        }
    }

    fn block(node: &str, n: u8, types: RouteType, same_subnet: bool) -> RouteUpdate {
        RouteUpdate {
            types: types as i32,
            ip_pool_type: IpPoolType::Vxlan as i32,
            dst: format!("10.65.{n}.0/26"),
            dst_node_name: node.into(),
            dst_node_ip: format!("172.31.0.1{n}"),
            same_subnet,
            ..Default::default()
        }
    }

    const P: RouteParams = RouteParams {
        protocol: 3,
        metric_v4: 1024,
        metric_v6: 1024,
        src_v4: None,
        src_v6: None,
    };

    fn eth0(ip: &str) -> BTreeMap<String, IfaceInfo> {
        BTreeMap::from([(
            "eth0".to_string(),
            IfaceInfo {
                index: 2,
                oper_up: true,
                admin_up: true,
                mtu: 1500,
                addrs: [format!("{ip}/24").parse().unwrap()].into(),
            },
        )])
    }

    #[test]
    fn remote_blocks_go_through_the_tunnel_and_same_subnet_ones_direct() {
        let o = Overlay::new(OverlayConfig {
            hostname: "n0".into(),
            ..OverlayConfig::default()
        });
        let vteps: BTreeMap<_, _> = [vtep("n0", 0), vtep("n1", 1), vtep("n2", 2)]
            .into_iter()
            .map(|v| (v.node.clone(), v))
            .collect();
        let routes: BTreeMap<_, _> = [
            block("n1", 1, RouteType::RemoteWorkload, false),
            block("n2", 2, RouteType::RemoteWorkload, true),
            block("n3", 3, RouteType::RemoteWorkload, false),
            block("n0", 0, RouteType::LocalWorkload, false),
        ]
        .into_iter()
        .map(|r| (r.dst.clone(), r))
        .collect();
        let d = o.desired(
            &BTreeMap::new(),
            &vteps,
            &BTreeMap::new(),
            &routes,
            &eth0("172.31.0.10"),
            |n| n.starts_with("cali"),
            P,
        );
        assert_eq!(d.devices.len(), 1, "IPv4 only: {d:?}");
        let d = d.devices.into_iter().next().unwrap();
        let dev = d.spec.expect("local VTEP and parent known");
        assert_eq!(dev.mtu, Some(1450), "auto: the parent's 1500 less 50");
        assert_eq!(
            (dev.parent.as_str(), dev.local, dev.addr),
            (
                "eth0",
                "172.31.0.10".parse().unwrap(),
                "10.65.0.0".parse().unwrap()
            )
        );
        assert_eq!(d.fdb.len(), 2, "remote VTEPs only");
        assert_eq!(d.neighbours.len(), 2);
        // n1 via its VTEP; n3 has no VTEP yet: no route.
        assert_eq!(d.tunnel_routes.len(), 1);
        assert_eq!(
            d.tunnel_routes[0].to_string(),
            "10.65.1.0/26 metric 1024 via 10.65.1.0 dev vxlan.calico onlink mtu 1450 proto 3"
        );
        assert_eq!(
            d.same_subnet_routes[0].to_string(),
            "10.65.2.0/26 metric 1024 via 172.31.0.12 dev eth0 onlink proto 80"
        );
    }

    #[test]
    fn vxlan_is_on_by_config_encapsulation_pool_or_vtep() {
        let mut o = Overlay::default();
        let none = BTreeMap::new();
        assert!(!o.vxlan_enabled(&none, &none_vteps()));
        let pools = BTreeMap::from([(
            "10.65.0.0-16".to_string(),
            IpamPool {
                cidr: "10.65.0.0/16".into(),
                vxlan_mode: "Always".into(),
                ..Default::default()
            },
        )]);
        assert!(o.vxlan_enabled(&pools, &none_vteps()));
        o.encap = Some(Encapsulation {
            vxlan_enabled: true,
            ..Default::default()
        });
        assert!(o.vxlan_enabled(&none, &none_vteps()));
        // Felix's Encapsulation, once sent, outweighs the pools and VTEPs seen here.
        let vteps = BTreeMap::from([("n1".to_string(), vtep("n1", 1))]);
        o.encap = Some(Encapsulation::default());
        assert!(!o.vxlan_enabled(&pools, &vteps));
        o.cfg.vxlan_enabled = Some(true);
        assert!(o.vxlan_enabled(&none, &none_vteps()));
        o.cfg.vxlan_enabled = Some(false);
        assert!(!o.vxlan_enabled(&pools, &none_vteps()));
    }

    #[test]
    fn ipv6_vteps_make_the_v6_device_with_its_own_fdb_neighbours_and_routes() {
        let o = Overlay::new(OverlayConfig {
            hostname: "n0".into(),
            mtu: Some(1400),
            ..OverlayConfig::default()
        });
        let v6 = |node: &str, n: u8| VxlanTunnelEndpointUpdate {
            mac_v6: format!("66:00:00:00:01:{n:02x}"),
            ipv6_addr: format!("fd00:65::{n}:0"),
            parent_device_ipv6: format!("fd00:31::1{n}"),
            ..vtep(node, n)
        };
        let vteps: BTreeMap<_, _> = [v6("n0", 0), v6("n1", 1)]
            .into_iter()
            .map(|v| (v.node.clone(), v))
            .collect();
        let routes: BTreeMap<_, _> = [
            RouteUpdate {
                dst: "fd00:65::1:0/122".into(),
                dst_node_ip: "fd00:31::11".into(),
                ..block("n1", 1, RouteType::RemoteWorkload, false)
            },
            block("n1", 1, RouteType::RemoteWorkload, false),
        ]
        .into_iter()
        .map(|r| (r.dst.clone(), r))
        .collect();
        let mut ifaces = eth0("172.31.0.10");
        ifaces
            .get_mut("eth0")
            .unwrap()
            .addrs
            .insert("fd00:31::10/64".parse().unwrap());
        let d = o.desired(
            &BTreeMap::new(),
            &vteps,
            &BTreeMap::new(),
            &routes,
            &ifaces,
            |n| n.starts_with("cali"),
            P,
        );
        let names: Vec<_> = d.devices.iter().map(|d| d.name).collect();
        assert_eq!(names, [VXLAN_IFACE_V4, VXLAN_IFACE_V6]);
        let (d4, d6) = (&d.devices[0], &d.devices[1]);
        assert_eq!(d4.spec.as_ref().unwrap().mtu, Some(1400), "VXLANMTU wins");
        let s6 = d6.spec.as_ref().expect("v6 device");
        assert_eq!(
            (s6.parent.as_str(), s6.local, s6.addr, s6.mtu),
            (
                "eth0",
                "fd00:31::10".parse().unwrap(),
                "fd00:65::0:0".parse().unwrap(),
                Some(1430)
            ),
            "auto MTU for IPv6: 1500 less 70"
        );
        assert_eq!(
            d6.fdb,
            [(
                parse_mac("66:00:00:00:01:01").unwrap(),
                "fd00:31::11".parse().unwrap()
            )]
        );
        assert_eq!(d6.neighbours.len(), 1);
        assert_eq!(
            d6.tunnel_routes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["fd00:65::1:0/122 metric 1024 via fd00:65::1:0 dev vxlan-v6.calico onlink mtu 1430 proto 3"]
        );
        assert_eq!(
            d4.tunnel_routes.len(),
            1,
            "the v4 block stays on vxlan.calico"
        );
    }

    #[test]
    fn tunnel_devices_masquerade_only_with_a_local_tunnel_address() {
        let o = Overlay::new(OverlayConfig {
            hostname: "n0".into(),
            ..OverlayConfig::default()
        });
        let mut vteps: BTreeMap<_, _> = [("n1".to_string(), vtep("n1", 1))].into();
        assert_eq!(
            o.tunnel_ifaces(&vteps, (true, true)),
            (vec![], vec![]),
            "no local VTEP"
        );
        vteps.insert("n0".into(), vtep("n0", 0));
        assert_eq!(
            o.tunnel_ifaces(&vteps, (true, true)),
            (vec![VXLAN_IFACE_V4.to_string()], vec![]),
            "its IPv4 half only"
        );
        assert_eq!(o.tunnel_ifaces(&vteps, (false, true)), (vec![], vec![]));
    }

    #[test]
    fn noencap_blocks_route_via_the_node_when_felix_programs_cluster_routes() {
        let mut o = Overlay::new(OverlayConfig {
            hostname: "n0".into(),
            noencap_routes: true,
            ..OverlayConfig::default()
        });
        let pools = BTreeMap::from([(
            "10.66.0.0-16".to_string(),
            IpamPool {
                cidr: "10.66.0.0/16".into(),
                ..Default::default()
            },
        )]);
        let hosts = BTreeMap::from([(
            "n0".to_string(),
            HostMetadataUpdate {
                hostname: "n0".into(),
                ipv4_addr: "172.31.0.10/24".into(),
                ..Default::default()
            },
        )]);
        let routes: BTreeMap<_, _> = [
            RouteUpdate {
                ip_pool_type: IpPoolType::NoEncap as i32,
                dst: "10.66.1.0/26".into(),
                ..block("n1", 1, RouteType::RemoteWorkload, false)
            },
            RouteUpdate {
                ip_pool_type: IpPoolType::NoEncap as i32,
                dst: "10.66.0.0/26".into(),
                ..block("n0", 0, RouteType::LocalWorkload, false)
            },
        ]
        .into_iter()
        .map(|r| (r.dst.clone(), r))
        .collect();
        let ifaces = eth0("172.31.0.10");
        let want = |o: &Overlay, hosts: &BTreeMap<String, HostMetadataUpdate>| {
            o.desired(&pools, &none_vteps(), hosts, &routes, &ifaces, |_| false, P)
                .noencap_routes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            want(&o, &hosts),
            ["10.66.1.0/26 metric 1024 via 172.31.0.11 dev eth0 onlink proto 80"]
        );
        // This node's address unknown: no parent, no route (no tunnel to fall back on).
        assert!(want(&o, &BTreeMap::new()).is_empty());
        // BIRD's job unless ProgramClusterRoutes says otherwise.
        o.cfg.noencap_routes = false;
        assert!(want(&o, &hosts).is_empty());
    }

    fn host(name: &str, ip: &str) -> (String, HostMetadataUpdate) {
        (
            name.to_string(),
            HostMetadataUpdate {
                hostname: name.into(),
                ipv4_addr: ip.into(),
                ..Default::default()
            },
        )
    }

    fn ipip_pool() -> BTreeMap<String, IpamPool> {
        BTreeMap::from([(
            "10.65.0.0-16".to_string(),
            IpamPool {
                cidr: "10.65.0.0/16".into(),
                ipip_mode: "Always".into(),
                ..Default::default()
            },
        )])
    }

    #[test]
    fn ipip_configures_tunl0_once_the_parent_is_found_and_routes_via_the_nodes() {
        let mut o = Overlay::new(OverlayConfig {
            hostname: "n0".into(),
            ipip_addr: Some("10.65.0.1".parse().unwrap()),
            ipip_routes: true,
            ..OverlayConfig::default()
        });
        let pools = ipip_pool();
        let mut hosts: BTreeMap<_, _> =
            [host("n0", "172.31.0.10/24"), host("n1", "172.31.0.11")].into();
        let ipip = |n: &str, i: u8, types: RouteType, same_subnet: bool| RouteUpdate {
            ip_pool_type: IpPoolType::Ipip as i32,
            ..block(n, i, types, same_subnet)
        };
        let routes: BTreeMap<_, _> = [
            ipip("n1", 1, RouteType::RemoteWorkload, false),
            ipip("n2", 2, RouteType::RemoteWorkload, true),
            // No host metadata for n3: no route.
            ipip("n3", 3, RouteType::RemoteWorkload, false),
            ipip("n0", 0, RouteType::LocalWorkload, false),
            // Another pool type is not IPIP's.
            block("n1", 9, RouteType::RemoteWorkload, false),
        ]
        .into_iter()
        .map(|r| (r.dst.clone(), r))
        .collect();
        let want = |o: &Overlay, hosts: &BTreeMap<String, HostMetadataUpdate>| {
            let d = o.desired(
                &pools,
                &none_vteps(),
                hosts,
                &routes,
                &eth0("172.31.0.10"),
                |n| n.starts_with("cali"),
                P,
            );
            let routes: Vec<String> = d.ipip_routes.iter().map(ToString::to_string).collect();
            (d.ipip, routes)
        };
        let (dev, routes_now) = want(&o, &hosts);
        assert_eq!(
            dev,
            IpipWanted::Configure(IpipSpec {
                mtu: 1480,
                addr: "10.65.0.1".parse().unwrap()
            }),
            "the parent's 1500 less 20"
        );
        assert_eq!(
            routes_now,
            [
                "10.65.1.0/26 metric 1024 via 172.31.0.11 dev tunl0 onlink mtu 1480 proto 80",
                "10.65.2.0/26 metric 1024 via 172.31.0.12 dev eth0 onlink proto 80",
            ]
        );
        // This node's address not on an interface: tunl0 waits; same-subnet routes fall back
        // to the tunnel (with the node's host IP unknown, none).
        hosts.insert("n0".into(), host("n0", "172.31.9.9").1);
        hosts.insert("n2".into(), host("n2", "172.31.0.12").1);
        let (dev, routes_now) = want(&o, &hosts);
        assert_eq!(dev, IpipWanted::Leave);
        assert_eq!(
            routes_now,
            [
                "10.65.1.0/26 metric 1024 via 172.31.0.11 dev tunl0 onlink proto 80",
                "10.65.2.0/26 metric 1024 via 172.31.0.12 dev tunl0 onlink proto 80",
            ]
        );
        // BIRD's routes unless ProgramClusterRoutes gives them to Felix.
        o.cfg.ipip_routes = false;
        assert!(want(&o, &hosts).1.is_empty());
        // IPIP off: tunl0's addresses go unless IpInIpEnabled says off.
        o.encap = Some(Encapsulation::default());
        assert_eq!(want(&o, &hosts).0, IpipWanted::Strip);
        o.cfg.ipip_enabled = Some(false);
        assert_eq!(want(&o, &hosts).0, IpipWanted::Leave);
        // Configured on, without a tunnel address: tunl0 is left alone.
        o.cfg.ipip_enabled = Some(true);
        o.cfg.ipip_addr = None;
        hosts.insert("n0".into(), host("n0", "172.31.0.10").1);
        assert_eq!(want(&o, &hosts).0, IpipWanted::Leave);
        o.cfg.ipip_addr = Some("10.65.0.1".parse().unwrap());
        o.cfg.ipip_mtu = Some(1400);
        assert!(matches!(
            want(&o, &hosts).0,
            IpipWanted::Configure(IpipSpec { mtu: 1400, .. })
        ));
    }

    #[test]
    fn ipip_is_on_by_config_encapsulation_or_an_ipv4_pool() {
        let mut o = Overlay::default();
        assert!(!o.ipip_on(&BTreeMap::new()));
        assert!(o.ipip_on(&ipip_pool()));
        let v6_pool = BTreeMap::from([(
            "fd00-48".to_string(),
            IpamPool {
                cidr: "fd00::/48".into(),
                ipip_mode: "Always".into(),
                ..Default::default()
            },
        )]);
        assert!(!o.ipip_on(&v6_pool), "IPIP is IPv4 only");
        o.encap = Some(Encapsulation {
            ipip_enabled: true,
            ..Default::default()
        });
        assert!(o.ipip_on(&BTreeMap::new()));
        o.cfg.ipip_enabled = Some(false);
        assert!(!o.ipip_on(&ipip_pool()));
        assert_eq!(o.ipip_tunnel_iface(&ipip_pool()), None);
        o.cfg.ipip_enabled = Some(true);
        assert_eq!(o.ipip_tunnel_iface(&ipip_pool()), None, "no tunnel address");
        o.cfg.ipip_addr = Some("10.65.0.1".parse().unwrap());
        assert_eq!(
            o.ipip_tunnel_iface(&ipip_pool()).as_deref(),
            Some(IPIP_IFACE)
        );
    }

    fn none_vteps() -> BTreeMap<String, VxlanTunnelEndpointUpdate> {
        BTreeMap::new()
    }
}
