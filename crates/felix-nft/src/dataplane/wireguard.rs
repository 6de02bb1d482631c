//! WireGuard between nodes (wireguard.md §1–2), per IP family: from the other nodes' public
//! keys and interface addresses (`WireguardEndpoint(V6)Update`), their host addresses
//! (HostMetadata) and the CIDRs Felix routes to each node (RouteUpdate), the device, peers,
//! routing table and rule wanted. Pure: no I/O; the loop hands the result to the kernel seam.
//!
//! - A remote node is a peer when it has a host address of the family, a key, and a key no
//!   other node claims; its allowed IPs are every CIDR routed to it (workload blocks and
//!   addresses, tunnel addresses; host addresses too in host-encryption mode).
//! - The table holds `CIDR dev <device>` for each peer's CIDRs and `throw CIDR` for this
//!   node's own CIDRs (a /32 inside one of its blocks is left out) and for nodes that are not
//!   peers, whose traffic then takes the main table (VXLAN, IPIP or direct) unencrypted.
//! - The rule `not fwmark M/M lookup <table>` sends everything else there; WireGuard's own UDP
//!   carries M and skips it.
//! - This node's device address is its own `interface_ipv*_addr`, or in host-encryption mode
//!   its host address. Its key is the kernel's; when Felix echoes back another key for this
//!   node, the key is read and reported again.
//! - After the first statement of a family's device (whole), the loop is told only what
//!   changed: the peers and the route groups (one per node) of the nodes an update touched,
//!   and the nodes whose key one of those shared or shares. A node joining or leaving costs
//!   O(that node), not O(nodes).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use base64::Engine;
use ipnet::IpNet;

use felix_api::to_dataplane::Payload;
use felix_api::{HostMetadataRemove, HostMetadataUpdate, HostMetadataV6, RouteType, ToDataplane};
use rtnl::routes::{RouteSpec, RouteTarget};
use rtnl::rule::RuleSpec;
use rtnl::wgsync::{PeerSpec, WgChanges, WgSpec, WgWanted};
use rtnl::wireguard::Key;
use rtnl::IpFamily;

/// What WireGuard adds to a packet: the device's MTU is the host's less this (IPv4, IPv6).
const OVERHEAD: [u32; 2] = [60, 80];

/// One family's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgFamilyConfig {
    /// `WireguardEnabled` / `WireguardEnabledV6`.
    pub enabled: bool,
    /// `WireguardInterfaceName(V6)`.
    pub iface: String,
    /// `WireguardListeningPort(V6)`: the device's port and every peer's.
    pub port: u16,
    /// `WireguardMTU(V6)`; `None` (0): the host's MTU less 60 (80).
    pub mtu: Option<u32>,
}

/// WireGuard's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgConfig {
    /// This node's name.
    pub hostname: String,
    pub v4: WgFamilyConfig,
    pub v6: WgFamilyConfig,
    /// `Ipv6Support`: whether the IPv6 device is managed at all (removed while disabled).
    pub ipv6: bool,
    /// `WireguardRoutingRulePriority` (99).
    pub priority: u32,
    /// The table: the lowest of `RouteTableRanges` (both families use it, as in Felix).
    pub table: u32,
    /// The mark bit of WireGuard's own traffic (0 when WireGuard is off).
    pub mark: u32,
    /// `DeviceRouteProtocol` of the table's routes.
    pub protocol: u8,
    /// `WireguardHostEncryptionEnabled`.
    pub host_encryption: bool,
    /// `WireguardPersistentKeepAlive`, whole seconds.
    pub keepalive: u16,
}

impl Default for WgConfig {
    fn default() -> Self {
        let fam = |iface: &str, port| WgFamilyConfig {
            enabled: false,
            iface: iface.into(),
            port,
            mtu: None,
        };
        WgConfig {
            hostname: String::new(),
            v4: fam("wireguard.cali", 51820),
            v6: fam("wg-v6.cali", 51821),
            ipv6: true,
            priority: 99,
            table: 1,
            mark: 0,
            protocol: 3,
            host_encryption: false,
            keepalive: 0,
        }
    }
}

impl WgConfig {
    fn family(&self, f: IpFamily) -> &WgFamilyConfig {
        match f {
            IpFamily::V4 => &self.v4,
            IpFamily::V6 => &self.v6,
        }
    }

    /// Whether either family is on.
    pub fn any_enabled(&self) -> bool {
        self.v4.enabled || (self.ipv6 && self.v6.enabled)
    }
}

/// What is known of one node, for one family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    key: Option<Key>,
    /// Its `interface_ipv*_addr` (used for this node only).
    iface_addr: Option<IpAddr>,
    cidrs: BTreeSet<IpNet>,
}

/// One family's nodes, and what the loop was last told of them.
#[derive(Debug, Clone, Default)]
struct Family {
    nodes: BTreeMap<String, Node>,
    /// Which node each CIDR is routed to.
    owner: BTreeMap<IpNet, String>,
    /// The nodes claiming each key.
    claims: BTreeMap<Key, BTreeSet<String>>,
    /// The key Felix last echoed for this node (`None`: none yet or withdrawn).
    own_echo: Option<Key>,
    /// The configuration the device was last stated whole with (`None`: not stated, or stated
    /// disabled): the next statement is whole.
    stated: Option<WgConfig>,
    /// The peer key each node was last stated with.
    told: BTreeMap<String, Key>,
    /// Nodes whose peer or routes may differ from what was last stated.
    changed: BTreeSet<String>,
}

impl Family {
    fn add_cidr(&mut self, node: &str, cidr: IpNet) -> bool {
        if self.owner.get(&cidr).is_some_and(|n| n == node) {
            return false;
        }
        self.remove_cidr(&cidr);
        self.owner.insert(cidr, node.to_string());
        self.nodes
            .entry(node.to_string())
            .or_default()
            .cidrs
            .insert(cidr);
        self.changed.insert(node.to_string());
        true
    }

    fn remove_cidr(&mut self, cidr: &IpNet) -> bool {
        let Some(node) = self.owner.remove(cidr) else {
            return false;
        };
        if let Some(n) = self.nodes.get_mut(&node) {
            n.cidrs.remove(cidr);
            if *n == Node::default() {
                self.nodes.remove(&node);
            }
        }
        self.changed.insert(node);
        true
    }

    fn set_endpoint(&mut self, node: &str, key: Option<Key>, iface_addr: Option<IpAddr>) -> bool {
        let n = self.nodes.entry(node.to_string()).or_default();
        let changed = n.key != key || n.iface_addr != iface_addr;
        let old = std::mem::replace(&mut n.key, key);
        n.iface_addr = iface_addr;
        if *n == Node::default() {
            self.nodes.remove(node);
        }
        if old != key {
            // Whether a key is usable depends on who else claims it: everyone who claimed the
            // old key or claims the new one is looked at again.
            if let Some(k) = old {
                if let Some(c) = self.claims.get_mut(&k) {
                    c.remove(node);
                    self.changed.extend(c.iter().cloned());
                    if c.is_empty() {
                        self.claims.remove(&k);
                    }
                }
            }
            if let Some(k) = key {
                let c = self.claims.entry(k).or_default();
                c.insert(node.to_string());
                self.changed.extend(c.iter().cloned());
            }
        }
        if changed {
            self.changed.insert(node.to_string());
        }
        changed
    }
}

/// One node's part of its family's device: its peer and its routes in the table.
struct NodeWant {
    peer: Option<(Key, PeerSpec)>,
    routes: Vec<RouteSpec>,
}

/// Decodes a WireGuard key: 32 bytes in standard base64 (44 characters with padding); the
/// empty string is no key.
pub fn parse_key(s: &str) -> Result<Option<Key>, &'static str> {
    if s.is_empty() {
        return Ok(None);
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| "not base64")?;
    let key: Key = bytes
        .try_into()
        .map_err(|_| "not a 32-byte WireGuard key")?;
    Ok((key != [0; 32]).then_some(key))
}

/// A key as Felix writes it.
pub fn format_key(k: &Key) -> String {
    base64::engine::general_purpose::STANDARD.encode(k)
}

fn bare_ip(s: &str) -> Option<IpAddr> {
    s.split('/').next()?.trim().parse().ok()
}

/// A node's host address of family `f`.
fn host_ip(
    hosts: &BTreeMap<String, HostMetadataUpdate>,
    f: IpFamily,
    node: &str,
) -> Option<IpAddr> {
    let h = hosts.get(node)?;
    let s = match f {
        IpFamily::V4 => &h.ipv4_addr,
        IpFamily::V6 => &h.ipv6_addr,
    };
    bare_ip(s).filter(|a| IpFamily::of(a) == f)
}

/// WireGuard's state: both families.
#[derive(Debug, Clone)]
pub struct Wireguard {
    pub cfg: WgConfig,
    fams: [Family; 2],
    /// Felix echoed a key for this node other than the one it had echoed: the key is read
    /// and reported again.
    echo_changed: bool,
}

fn idx(f: IpFamily) -> usize {
    match f {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
    }
}

impl Wireguard {
    pub fn new(cfg: WgConfig) -> Wireguard {
        Wireguard {
            cfg,
            fams: [Family::default(), Family::default()],
            echo_changed: false,
        }
    }

    /// Records a message WireGuard follows; true when what it wants may have changed. Host
    /// metadata is read from the model when wanted, so it only marks.
    pub fn on_message(&mut self, msg: &ToDataplane) -> bool {
        let Some(p) = &msg.payload else {
            return false;
        };
        match p {
            Payload::WireguardEndpointUpdate(u) => self.endpoint(
                IpFamily::V4,
                &u.hostname,
                &u.public_key,
                &u.interface_ipv4_addr,
            ),
            Payload::WireguardEndpointV6Update(u) => self.endpoint(
                IpFamily::V6,
                &u.hostname,
                &u.public_key_v6,
                &u.interface_ipv6_addr,
            ),
            Payload::WireguardEndpointRemove(r) => self.endpoint(IpFamily::V4, &r.hostname, "", ""),
            Payload::WireguardEndpointV6Remove(r) => {
                self.endpoint(IpFamily::V6, &r.hostname, "", "")
            }
            Payload::RouteUpdate(u) => {
                let Ok(dst) = u.dst.parse::<IpNet>() else {
                    return false;
                };
                let dst = dst.trunc();
                let fam = &mut self.fams[idx(IpFamily::of(&dst.addr()))];
                let has = |t: RouteType| u.types & t as i32 != 0;
                if has(RouteType::RemoteHost) {
                    // Host addresses are encrypted only in host-encryption mode; otherwise
                    // the update is not WireGuard's at all (not a removal).
                    return self.cfg.host_encryption && fam.add_cidr(&u.dst_node_name, dst);
                }
                let carried = has(RouteType::LocalWorkload)
                    || has(RouteType::RemoteWorkload)
                    || has(RouteType::LocalTunnel)
                    || has(RouteType::RemoteTunnel)
                    || u.local_workload;
                if carried && !u.dst_node_name.is_empty() {
                    fam.add_cidr(&u.dst_node_name, dst)
                } else {
                    fam.remove_cidr(&dst)
                }
            }
            Payload::RouteRemove(r) => match r.dst.parse::<IpNet>() {
                Ok(dst) => {
                    let dst = dst.trunc();
                    self.fams[idx(IpFamily::of(&dst.addr()))].remove_cidr(&dst)
                }
                Err(_) => false,
            },
            Payload::HostMetadataUpdate(HostMetadataUpdate { hostname, .. })
            | Payload::HostMetadataV4v6Update(HostMetadataUpdate { hostname, .. })
            | Payload::HostMetadataV6Update(HostMetadataV6 { hostname, .. })
            | Payload::HostMetadataV6Remove(HostMetadataV6 { hostname, .. })
            | Payload::HostMetadataRemove(HostMetadataRemove { hostname, .. })
            | Payload::HostMetadataV4v6Remove(HostMetadataRemove { hostname, .. }) => {
                // The node's endpoint (or, for this node, the device's address in
                // host-encryption mode).
                for fam in &mut self.fams {
                    fam.changed.insert(hostname.clone());
                }
                true
            }
            _ => false,
        }
    }

    fn endpoint(&mut self, f: IpFamily, node: &str, key: &str, addr: &str) -> bool {
        // Validation refused malformed keys before this; an all-zero key is no key.
        let key = parse_key(key).ok().flatten();
        let fam = &mut self.fams[idx(f)];
        if node == self.cfg.hostname && fam.own_echo != key {
            fam.own_echo = key;
            self.echo_changed = true;
        }
        fam.set_endpoint(node, key, bare_ip(addr))
    }

    /// Takes "Felix echoed another key for this node" (then the device is read again and its
    /// key reported).
    pub fn take_echo_changed(&mut self) -> bool {
        std::mem::take(&mut self.echo_changed)
    }

    /// The key Felix last echoed for this node, per family.
    pub fn own_echo(&self, f: IpFamily) -> Option<Key> {
        self.fams[idx(f)].own_echo
    }

    /// What each managed family wants (IPv4 always; IPv6 with `Ipv6Support`), from the
    /// recorded state, the hosts' addresses and the host's MTU: the whole device.
    pub fn desired(
        &self,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        host_mtu: u32,
    ) -> Vec<(IpFamily, WgWanted)> {
        self.families()
            .map(|f| (f, self.whole(f, hosts, host_mtu)))
            .collect()
    }

    /// Like [`Wireguard::desired`], as the loop needs it: a family's device whole the first
    /// time (and after it was disabled or the configuration changed), then only what changed
    /// since the last call ([`WgWanted::Changed`]).
    pub fn take_desired(
        &mut self,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        host_mtu: u32,
    ) -> Vec<(IpFamily, WgWanted)> {
        let fams: Vec<IpFamily> = self.families().collect();
        fams.into_iter()
            .map(|f| (f, self.take_family(f, hosts, host_mtu)))
            .collect()
    }

    fn families(&self) -> impl Iterator<Item = IpFamily> {
        let v6 = self.cfg.ipv6;
        [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(move |&f| f == IpFamily::V4 || v6)
    }

    fn take_family(
        &mut self,
        f: IpFamily,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        host_mtu: u32,
    ) -> WgWanted {
        let whole = self.fams[idx(f)].stated.as_ref() != Some(&self.cfg);
        let want = if whole {
            self.whole(f, hosts, host_mtu)
        } else {
            self.changes(f, hosts, host_mtu)
        };
        let fam = &mut self.fams[idx(f)];
        fam.changed.clear();
        match &want {
            WgWanted::Disabled { .. } => {
                fam.stated = None;
                fam.told.clear();
            }
            WgWanted::Enabled(spec) => {
                fam.stated = Some(self.cfg.clone());
                fam.told = (spec.peers.keys())
                    .filter_map(|k| Some((fam.claims.get(k)?.first()?.clone(), *k)))
                    .collect();
            }
            WgWanted::Changed { .. } => {}
        }
        want
    }

    /// The family's whole device.
    fn whole(
        &self,
        f: IpFamily,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        host_mtu: u32,
    ) -> WgWanted {
        let Some(mut spec) = self.head(f, hosts, host_mtu) else {
            return self.disabled(f);
        };
        for name in self.fams[idx(f)].nodes.keys() {
            let n = self.node_want(f, name, hosts);
            if let Some((k, p)) = n.peer {
                spec.peers.insert(k, p);
            }
            if !n.routes.is_empty() {
                spec.routes.insert(name.clone(), n.routes);
            }
        }
        WgWanted::Enabled(spec)
    }

    /// What changed in the family's device since it was last stated: the nodes marked, and
    /// the peers they were stated with.
    fn changes(
        &mut self,
        f: IpFamily,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        host_mtu: u32,
    ) -> WgWanted {
        let Some(head) = self.head(f, hosts, host_mtu) else {
            return self.disabled(f);
        };
        let mut changes = WgChanges::default();
        let marked = std::mem::take(&mut self.fams[idx(f)].changed);
        let wants: Vec<(String, NodeWant)> = marked
            .into_iter()
            .map(|name| {
                let n = self.node_want(f, &name, hosts);
                (name, n)
            })
            .collect();
        let fam = &mut self.fams[idx(f)];
        // Removals first, so that a key another node now holds stays set.
        for (name, n) in &wants {
            let now = n.peer.as_ref().map(|(k, _)| *k);
            if let Some(old) = fam.told.get(name).filter(|&&k| Some(k) != now) {
                changes.peers.entry(*old).or_insert(None);
            }
        }
        for (name, n) in wants {
            match n.peer {
                Some((k, p)) => {
                    changes.peers.insert(k, Some(p));
                    fam.told.insert(name.clone(), k);
                }
                None => {
                    fam.told.remove(&name);
                }
            }
            changes.routes.insert(name, n.routes);
        }
        WgWanted::Changed { head, changes }
    }

    fn disabled(&self, f: IpFamily) -> WgWanted {
        WgWanted::Disabled {
            name: self.cfg.family(f).iface.clone(),
            table: self.cfg.table,
        }
    }

    /// The device without peers and routes (`None`: the family is disabled).
    fn head(
        &self,
        f: IpFamily,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
        host_mtu: u32,
    ) -> Option<WgSpec> {
        let fc = self.cfg.family(f);
        if !fc.enabled {
            return None;
        }
        let me = &self.cfg.hostname;
        let own = self.fams[idx(f)].nodes.get(me);
        let addr = own.and_then(|n| n.iface_addr).or_else(|| {
            self.cfg
                .host_encryption
                .then(|| host_ip(hosts, f, me))
                .flatten()
        });
        Some(WgSpec {
            name: fc.iface.clone(),
            mtu: fc.mtu.unwrap_or(host_mtu.saturating_sub(OVERHEAD[idx(f)])),
            port: fc.port,
            fwmark: self.cfg.mark,
            addr: addr.filter(|a| IpFamily::of(a) == f).map(IpNet::from),
            peers: BTreeMap::new(),
            routes: BTreeMap::new(),
            rule: RuleSpec {
                family: f,
                priority: self.cfg.priority,
                mark: self.cfg.mark,
                mask: self.cfg.mark,
                invert: true,
                table: self.cfg.table,
            },
        })
    }

    /// One node's peer and table routes: this node's own CIDRs throw (a /32 inside one of its
    /// blocks is left out); a node with a host address and a key no other node claims is a
    /// peer whose CIDRs go to the device; any other node's CIDRs throw.
    fn node_want(
        &self,
        f: IpFamily,
        name: &str,
        hosts: &BTreeMap<String, HostMetadataUpdate>,
    ) -> NodeWant {
        let fam = &self.fams[idx(f)];
        let fc = self.cfg.family(f);
        let Some(n) = fam.nodes.get(name) else {
            return NodeWant {
                peer: None,
                routes: Vec::new(),
            };
        };
        let metric = match f {
            IpFamily::V4 => 0,
            IpFamily::V6 => 1024,
        };
        let route = |dst: IpNet, target: RouteTarget| RouteSpec {
            dst,
            target,
            protocol: self.cfg.protocol,
            metric,
            src: None,
            mtu: None,
        };
        if name == self.cfg.hostname {
            let blocks: Vec<&IpNet> = n
                .cidrs
                .iter()
                .filter(|c| c.prefix_len() < c.max_prefix_len())
                .collect();
            let routes = n
                .cidrs
                .iter()
                .filter(|c| {
                    !(c.prefix_len() == c.max_prefix_len()
                        && blocks.iter().any(|b| b.contains(&c.addr())))
                })
                .map(|c| route(*c, RouteTarget::Throw))
                .collect();
            return NodeWant { peer: None, routes };
        }
        let sole = |k: &Key| fam.claims.get(k).is_some_and(|c| c.len() == 1);
        let peer = match (n.key, host_ip(hosts, f, name)) {
            (Some(k), Some(ip)) if sole(&k) => Some((
                k,
                PeerSpec {
                    endpoint: SocketAddr::new(ip, fc.port),
                    allowed_ips: n.cidrs.clone(),
                    keepalive: self.cfg.keepalive,
                },
            )),
            _ => None,
        };
        let target = match peer {
            Some(_) => RouteTarget::Device(fc.iface.clone()),
            None => RouteTarget::Throw,
        };
        let routes = n.cidrs.iter().map(|c| route(*c, target.clone())).collect();
        NodeWant { peer, routes }
    }

    /// Nodes (other than this one) whose key another node claims too, per family: neither is
    /// programmed, as in Felix.
    pub fn conflicts(&self, f: IpFamily) -> Vec<String> {
        self.fams[idx(f)]
            .claims
            .values()
            .filter(|c| c.len() > 1)
            .flatten()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_api::{
        RouteRemove, RouteUpdate, TunnelType, WireguardEndpointRemove, WireguardEndpointUpdate,
    };
    use proptest::prelude::*;

    fn msg(p: Payload) -> ToDataplane {
        ToDataplane {
            sequence_number: 0,
            payload: Some(p),
        }
    }

    fn key(n: u8) -> String {
        format_key(&[n; 32])
    }

    fn ep(node: &str, k: &str, addr: &str) -> ToDataplane {
        msg(Payload::WireguardEndpointUpdate(WireguardEndpointUpdate {
            hostname: node.into(),
            public_key: k.into(),
            interface_ipv4_addr: addr.into(),
        }))
    }

    fn route(dst: &str, node: &str, t: RouteType) -> ToDataplane {
        msg(Payload::RouteUpdate(RouteUpdate {
            dst: dst.into(),
            dst_node_name: node.into(),
            types: t as i32,
            tunnel_type: (t == RouteType::RemoteTunnel).then(|| TunnelType {
                wireguard: true,
                ..TunnelType::default()
            }),
            ..RouteUpdate::default()
        }))
    }

    fn hosts() -> BTreeMap<String, HostMetadataUpdate> {
        (0..3)
            .map(|i| {
                let h = HostMetadataUpdate {
                    hostname: format!("n{i}"),
                    ipv4_addr: format!("172.31.0.1{i}/24"),
                    ..HostMetadataUpdate::default()
                };
                (h.hostname.clone(), h)
            })
            .collect()
    }

    fn cluster() -> Wireguard {
        let mut cfg = WgConfig {
            hostname: "n0".into(),
            mark: 0x200000,
            ..WgConfig::default()
        };
        cfg.v4.enabled = true;
        let mut wg = Wireguard::new(cfg);
        for i in 0..3u8 {
            let t = if i == 0 {
                RouteType::LocalWorkload
            } else {
                RouteType::RemoteWorkload
            };
            wg.on_message(&route(&format!("10.65.{i}.0/26"), &format!("n{i}"), t));
            let tt = if i == 0 {
                RouteType::LocalTunnel
            } else {
                RouteType::RemoteTunnel
            };
            wg.on_message(&route(&format!("10.65.{i}.1/32"), &format!("n{i}"), tt));
            wg.on_message(&ep(&format!("n{i}"), &key(i + 1), &format!("10.65.{i}.1")));
        }
        wg
    }

    fn spec(wg: &Wireguard) -> WgSpec {
        match wg.desired(&hosts(), 1500).remove(0).1 {
            WgWanted::Enabled(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn table(s: &WgSpec) -> Vec<String> {
        s.routes.values().flatten().map(|r| r.to_string()).collect()
    }

    #[test]
    fn peers_routes_and_rule_follow_felix() {
        let wg = cluster();
        let s = spec(&wg);
        assert_eq!(
            (s.name.as_str(), s.mtu, s.port),
            ("wireguard.cali", 1440, 51820)
        );
        assert_eq!(s.addr, Some("10.65.0.1/32".parse().unwrap()));
        assert_eq!(s.peers.len(), 2);
        let p = &s.peers[&[2; 32]];
        assert_eq!(p.endpoint, "172.31.0.11:51820".parse().unwrap());
        let ips: Vec<String> = p.allowed_ips.iter().map(|n| n.to_string()).collect();
        assert_eq!(ips, ["10.65.1.0/26", "10.65.1.1/32"]);
        assert_eq!(
            table(&s),
            [
                "throw 10.65.0.0/26 metric 0 proto 3",
                "10.65.1.0/26 metric 0 dev wireguard.cali proto 3",
                "10.65.1.1/32 metric 0 dev wireguard.cali proto 3",
                "10.65.2.0/26 metric 0 dev wireguard.cali proto 3",
                "10.65.2.1/32 metric 0 dev wireguard.cali proto 3",
            ]
        );
        assert_eq!(
            s.rule.to_string(),
            "99: not fwmark 0x200000/0x200000 lookup 1"
        );
    }

    #[test]
    fn nodes_without_a_usable_key_are_thrown_to_the_main_table() {
        let mut wg = cluster();
        // Withdrawn key: n1 is no peer, its CIDRs throw.
        wg.on_message(&msg(Payload::WireguardEndpointRemove(
            WireguardEndpointRemove {
                hostname: "n1".into(),
            },
        )));
        let s = spec(&wg);
        assert!(!s.peers.contains_key(&[2; 32]));
        assert!(table(&s).contains(&"throw 10.65.1.0/26 metric 0 proto 3".to_string()));
        // n1 and n2 claim one key: neither is a peer.
        wg.on_message(&ep("n1", &key(3), "10.65.1.1"));
        assert_eq!(wg.conflicts(IpFamily::V4), ["n1", "n2"]);
        let s = spec(&wg);
        assert!(s.peers.is_empty(), "{:?}", s.peers);
        // Fixed: both again.
        wg.on_message(&ep("n1", &key(2), "10.65.1.1"));
        assert_eq!(spec(&wg).peers.len(), 2);
        // A node with a key but no host address is no peer either.
        let mut h = hosts();
        h.remove("n2");
        let WgWanted::Enabled(s) = wg.desired(&h, 1500).remove(0).1 else {
            panic!()
        };
        assert_eq!(s.peers.len(), 1);
    }

    #[test]
    fn cidrs_move_between_nodes_and_go() {
        let mut wg = cluster();
        // A borrowed address: routed to n2 now.
        assert!(wg.on_message(&route("10.65.1.1/32", "n2", RouteType::RemoteTunnel)));
        let s = spec(&wg);
        assert!(!s.peers[&[2; 32]]
            .allowed_ips
            .contains(&"10.65.1.1/32".parse().unwrap()));
        assert!(s.peers[&[3; 32]]
            .allowed_ips
            .contains(&"10.65.1.1/32".parse().unwrap()));
        // Removed.
        wg.on_message(&msg(Payload::RouteRemove(RouteRemove {
            dst: "10.65.2.0/26".into(),
        })));
        assert!(!table(&spec(&wg)).iter().any(|r| r.contains("10.65.2.0/26")));
        // A host route is WireGuard's only in host-encryption mode.
        assert!(!wg.on_message(&route("172.31.0.11/32", "n1", RouteType::RemoteHost)));
        wg.cfg.host_encryption = true;
        assert!(wg.on_message(&route("172.31.0.11/32", "n1", RouteType::RemoteHost)));
        assert!(spec(&wg).peers[&[2; 32]]
            .allowed_ips
            .contains(&"172.31.0.11/32".parse().unwrap()));
        // A local address inside a local block is not listed on its own.
        wg.on_message(&route("10.65.0.7/32", "n0", RouteType::LocalWorkload));
        assert!(!table(&spec(&wg)).iter().any(|r| r.contains("10.65.0.7")));
    }

    #[test]
    fn own_key_echo_and_disable() {
        let mut wg = cluster();
        assert!(wg.take_echo_changed());
        assert!(!wg.take_echo_changed());
        wg.on_message(&ep("n0", &key(1), "10.65.0.1"));
        assert!(!wg.take_echo_changed(), "the same key again");
        wg.on_message(&ep("n0", &key(9), "10.65.0.1"));
        assert!(wg.take_echo_changed());
        wg.cfg.v4.enabled = false;
        let d = wg.desired(&hosts(), 1500);
        assert_eq!(
            d[0].1,
            WgWanted::Disabled {
                name: "wireguard.cali".into(),
                table: 1
            }
        );
        assert_eq!(d.len(), 2, "IPv6 is managed (removed) too");
    }

    /// Events of the delta property: a node's key (0: none) and interface address, its host
    /// address (generation `gen`; none), a block routed to a node or gone.
    #[derive(Clone, Debug)]
    enum Ev {
        Key(u8, u8),
        Host(u8, u8),
        HostGone(u8),
        Block(u8, u8),
        BlockGone(u8),
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            (0u8..5, 0u8..4).prop_map(|(n, k)| Ev::Key(n, k)),
            (0u8..5, 0u8..2).prop_map(|(n, g)| Ev::Host(n, g)),
            (0u8..5).prop_map(Ev::HostGone),
            (0u8..6, 0u8..5).prop_map(|(b, n)| Ev::Block(b, n)),
            (0u8..6).prop_map(Ev::BlockGone),
        ]
    }

    /// Folds a statement into the device as the syncer holds it.
    fn fold(dev: &mut Option<WgSpec>, w: WgWanted) {
        match w {
            WgWanted::Enabled(s) => *dev = Some(s),
            WgWanted::Changed { head, changes } => {
                let d = dev.as_mut().expect("a change after a whole statement");
                let (peers, routes) = (std::mem::take(&mut d.peers), std::mem::take(&mut d.routes));
                *d = WgSpec {
                    peers,
                    routes,
                    ..head
                };
                for (k, p) in changes.peers {
                    match p {
                        Some(p) => d.peers.insert(k, p),
                        None => d.peers.remove(&k),
                    };
                }
                for (g, r) in changes.routes {
                    if r.is_empty() {
                        d.routes.remove(&g);
                    } else {
                        d.routes.insert(g, r);
                    }
                }
            }
            WgWanted::Disabled { .. } => *dev = None,
        }
    }

    proptest! {
        /// Keys claimed, shared and withdrawn, hosts and blocks coming and going: the changes
        /// stated after each batch add up to the whole device stated again.
        #[test]
        fn changes_add_up_to_the_whole_device(
            batches in prop::collection::vec(prop::collection::vec(ev(), 1..5), 1..10),
        ) {
            let mut cfg = WgConfig {
                hostname: "n0".into(),
                mark: 0x200000,
                ipv6: false,
                ..WgConfig::default()
            };
            cfg.v4.enabled = true;
            let mut wg = Wireguard::new(cfg);
            let mut hosts: BTreeMap<String, HostMetadataUpdate> = BTreeMap::new();
            let mut dev = None;
            for batch in &batches {
                for e in batch {
                    let m = match *e {
                        Ev::Key(n, k) => {
                            let k = if k == 0 { String::new() } else { key(k) };
                            ep(&format!("n{n}"), &k, &format!("10.65.{n}.1"))
                        }
                        Ev::Host(n, g) => {
                            let h = HostMetadataUpdate {
                                hostname: format!("n{n}"),
                                ipv4_addr: format!("172.31.{g}.1{n}"),
                                ..HostMetadataUpdate::default()
                            };
                            hosts.insert(h.hostname.clone(), h.clone());
                            msg(Payload::HostMetadataUpdate(h))
                        }
                        Ev::HostGone(n) => {
                            hosts.remove(&format!("n{n}"));
                            msg(Payload::HostMetadataRemove(HostMetadataRemove {
                                hostname: format!("n{n}"),
                                ..HostMetadataRemove::default()
                            }))
                        }
                        Ev::Block(b, n) => {
                            let t = if n == 0 {
                                RouteType::LocalWorkload
                            } else {
                                RouteType::RemoteWorkload
                            };
                            route(&format!("10.65.{b}.0/26"), &format!("n{n}"), t)
                        }
                        Ev::BlockGone(b) => msg(Payload::RouteRemove(RouteRemove {
                            dst: format!("10.65.{b}.0/26"),
                        })),
                    };
                    wg.on_message(&m);
                }
                for (_, w) in wg.take_desired(&hosts, 1500) {
                    fold(&mut dev, w);
                }
                let whole = wg.desired(&hosts, 1500).remove(0).1;
                prop_assert_eq!(dev.clone().map(WgWanted::Enabled), Some(whole), "after {:?}", batch);
            }
        }
    }

    #[test]
    fn keys_parse_as_felix_writes_them() {
        assert_eq!(parse_key(""), Ok(None));
        assert_eq!(parse_key(&format_key(&[0; 32])), Ok(None));
        assert_eq!(parse_key(&key(7)), Ok(Some([7; 32])));
        assert!(parse_key("not-a-key").is_err());
        assert!(parse_key("AAAA").is_err());
    }
}
