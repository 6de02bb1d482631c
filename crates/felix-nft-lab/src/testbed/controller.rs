//! A small stand-in for Felix's calculation graph: from a cluster's nodes, pods, policies,
//! profiles, IP sets and IP pools it computes what each node's dataplane is sent, and after a
//! change only the messages that change it. Pure: no I/O, no kernel, no clock.
//!
//! Per node it keeps a view of what that node was told and diffs the new view against it, so a
//! node joining, a node leaving, a VTEP's MAC changing or a pod appearing are all the same
//! operation: change the model, [`Controller::flush`], send each node its messages. What a node
//! is sent (reference overlay.md §1; felix-dataplane.md §2):
//!
//! - its own workload endpoints; the policies and profiles they use; the IP sets those rules
//!   refer to, with members from the whole cluster (a set may select pods of any node);
//! - every IP pool, and `Encapsulation` derived from the pools;
//! - while a VXLAN pool exists, every node's VTEP (`VXLANTunnelEndpointUpdate`: node, MAC,
//!   tunnel address, node IP), its own included (the agent builds its device from it);
//! - every node's WireGuard key that was published ([`Controller::set_wireguard_key`], as
//!   calico-node writes the key the node's agent reports), with the node's tunnel address as its
//!   WireGuard address, its own included; a withdrawn key is a `WireguardEndpointRemove`;
//! - every node's host metadata (its address in CIDR form, as Felix ≥ 3.33 sends it);
//! - every node's IPAM block as a route: its own `LOCAL_WORKLOAD` (a blackhole on the node), the
//!   others' `REMOTE_WORKLOAD`, with the pool's type, the owner's name and address, and
//!   `same_subnet` when the pool is cross-subnet and the owner is on this node's subnet.
//!
//! Messages go in the order of Felix's event sequencer (`Flush`): IP set adds and deltas,
//! policies, profiles, endpoints, then endpoint/profile/policy/IP set removals, then route
//! removes → VTEP removes → VTEP adds → route adds (no route without its VTEP), host metadata,
//! WireGuard removes and updates, pools, and `Encapsulation` last. A changed VTEP is sent as remove then update, as Felix does.
//! A node's first flush ends with `InSync`, so the agent's first apply is the whole node (the
//! agent programs nothing before `InSync`).
//!
//! Not modelled: host endpoints, service accounts, namespaces, `/32` routes of local workloads
//! and tunnel addresses, borrowed IPs, IPv6, WireGuard host encryption, selectors beyond label
//! equality.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

use felix_api::to_dataplane::Payload;
use felix_api::{
    ActivePolicyRemove, ActivePolicyUpdate, ActiveProfileRemove, ActiveProfileUpdate,
    Encapsulation, HostMetadataRemove, HostMetadataUpdate, InSync, IpPoolType, IpSetDeltaUpdate,
    IpSetRemove, IpSetType, IpSetUpdate, IpamPool, IpamPoolRemove, IpamPoolUpdate, Policy,
    PolicyId, Profile, ProfileId, RouteRemove, RouteType, RouteUpdate, Rule, ToDataplane,
    VxlanTunnelEndpointRemove, VxlanTunnelEndpointUpdate, WireguardEndpointRemove,
    WireguardEndpointUpdate, WorkloadEndpoint, WorkloadEndpointId, WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
};

/// One node as the cluster's datastore knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The node's address (BGP `IPv4Address`): the VTEP's parent address.
    pub ip: Ipv4Addr,
    /// The prefix length of the node's subnet (for host metadata and cross-subnet).
    pub prefix_len: u8,
    /// The VTEP's MAC, `aa:bb:cc:dd:ee:ff`.
    pub vtep_mac: String,
    /// The VTEP's tunnel address (`IPv4VXLANTunnelAddr`), from the node's block.
    pub tunnel_ip: Ipv4Addr,
    /// The node's affine IPAM block.
    pub block: Ipv4Net,
}

impl NodeInfo {
    /// A node with Felix's defaults for what it derives: the VTEP MAC from the name
    /// ([`vtep_mac_for_node`]) and the tunnel address at the start of the block.
    pub fn new(name: impl Into<String>, ip: Ipv4Addr, prefix_len: u8, block: Ipv4Net) -> NodeInfo {
        let name = name.into();
        NodeInfo {
            vtep_mac: vtep_mac_for_node(&name),
            tunnel_ip: block.network(),
            name,
            ip,
            prefix_len,
            block,
        }
    }

    /// Whether `ip` is on this node's subnet.
    fn subnet_contains(&self, ip: Ipv4Addr) -> bool {
        Ipv4Net::new(self.ip, self.prefix_len).is_ok_and(|n| n.trunc().contains(&ip))
    }
}

/// The VTEP MAC Felix derives when the node has none configured: `0x66` (locally administered,
/// unicast) and five bytes of a hash of the node's name (Felix hashes with SHA-1; the MAC only
/// has to be stable and distinct per node).
pub fn vtep_mac_for_node(name: &str) -> String {
    let d = Sha256::digest(name.as_bytes());
    format!(
        "66:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        d[0], d[1], d[2], d[3], d[4]
    )
}

/// One pod: its endpoint as the CNI plugin and Felix describe it, and its labels (what IP set
/// selectors match on).
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    pub id: WorkloadEndpointId,
    pub endpoint: WorkloadEndpoint,
    pub labels: BTreeMap<String, String>,
}

/// The id of the `GlobalNetworkPolicy` `name`.
pub fn global_policy_id(name: &str) -> PolicyId {
    PolicyId {
        name: name.into(),
        kind: "GlobalNetworkPolicy".into(),
        ..PolicyId::default()
    }
}

/// Where an IP set's members come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpSetSource {
    /// Fixed members (CIDRs), as a `NetworkSet` gives them.
    Nets(Vec<String>),
    /// Every pod of the cluster, on any node, whose labels include all of these (a selector
    /// `k == v && …`): its IPv4 addresses.
    Labels(BTreeMap<String, String>),
}

/// What one node has been told (or should be): the state a diff runs on.
#[derive(Debug, Clone, Default, PartialEq)]
struct NodeView {
    ipsets: BTreeMap<String, BTreeSet<String>>,
    policies: BTreeMap<PolicyId, Policy>,
    profiles: BTreeMap<String, Profile>,
    endpoints: BTreeMap<WorkloadEndpointId, WorkloadEndpoint>,
    vteps: BTreeMap<String, VxlanTunnelEndpointUpdate>,
    routes: BTreeMap<String, RouteUpdate>,
    hosts: BTreeMap<String, HostMetadataUpdate>,
    pools: BTreeMap<String, IpamPool>,
    encap: Encapsulation,
    /// Nodes' WireGuard keys and addresses (only nodes that published a key).
    wireguard: BTreeMap<String, WireguardEndpointUpdate>,
}

/// The cluster model and what each node was sent (module doc).
#[derive(Debug, Default)]
pub struct Controller {
    nodes: BTreeMap<String, NodeInfo>,
    pods: BTreeMap<String, BTreeMap<WorkloadEndpointId, PodInfo>>,
    pools: BTreeMap<String, IpamPool>,
    policies: BTreeMap<PolicyId, Policy>,
    profiles: BTreeMap<String, Profile>,
    ipsets: BTreeMap<String, IpSetSource>,
    /// WireGuard public keys the nodes published.
    wg_keys: BTreeMap<String, String>,
    sent: BTreeMap<String, NodeView>,
}

impl Controller {
    pub fn new() -> Controller {
        Controller::default()
    }

    /// Adds or replaces an IP pool; `id` is Felix's (the CIDR with `/` as `-`).
    pub fn set_pool(&mut self, id: impl Into<String>, pool: IpamPool) {
        self.pools.insert(id.into(), pool);
    }

    /// Adds or replaces the IPv4 pool `cidr` (under Felix's id for it) with VXLAN mode
    /// `vxlan_mode` (`"Always"`, `"CrossSubnet"`, or `""` for no encapsulation).
    pub fn set_ipv4_pool(&mut self, cidr: Ipv4Net, vxlan_mode: &str) {
        let cidr = cidr.to_string();
        self.set_pool(
            cidr.replace('/', "-"),
            IpamPool {
                cidr,
                vxlan_mode: vxlan_mode.into(),
                ..IpamPool::default()
            },
        );
    }

    pub fn remove_pool(&mut self, id: &str) {
        self.pools.remove(id);
    }

    pub fn set_policy(&mut self, id: PolicyId, policy: Policy) {
        self.policies.insert(id, policy);
    }

    pub fn remove_policy(&mut self, id: &PolicyId) {
        self.policies.remove(id);
    }

    pub fn set_profile(&mut self, name: impl Into<String>, profile: Profile) {
        self.profiles.insert(name.into(), profile);
    }

    pub fn remove_profile(&mut self, name: &str) {
        self.profiles.remove(name);
    }

    pub fn set_ipset(&mut self, id: impl Into<String>, source: IpSetSource) {
        self.ipsets.insert(id.into(), source);
    }

    pub fn remove_ipset(&mut self, id: &str) {
        self.ipsets.remove(id);
    }

    /// A node joins (or changes: a new MAC, address or block). Its first flush is its snapshot;
    /// every other node learns its VTEP, block and host metadata.
    pub fn add_node(&mut self, node: NodeInfo) {
        self.pods.entry(node.name.clone()).or_default();
        self.nodes.insert(node.name.clone(), node);
    }

    /// A node leaves, with its pods: every other node forgets its VTEP, block, host metadata and
    /// pod addresses. Returns false when there is no such node.
    pub fn remove_node(&mut self, name: &str) -> bool {
        self.pods.remove(name);
        self.wg_keys.remove(name);
        self.nodes.remove(name).is_some()
    }

    /// A node's VTEP MAC changes (e.g. `VXLANTunnelMACAddr` set). False: no such node.
    pub fn set_vtep_mac(&mut self, name: &str, mac: impl Into<String>) -> bool {
        match self.nodes.get_mut(name) {
            Some(n) => {
                n.vtep_mac = mac.into();
                true
            }
            None => false,
        }
    }

    /// A pod starts on `node` (or changes). False: no such node.
    /// Node `name` published WireGuard key `key` (`None`: withdrew it), as calico-node writes
    /// the key a node's agent reports; every node learns it, with the node's tunnel address as
    /// its WireGuard address. False when the node is unknown.
    pub fn set_wireguard_key(&mut self, name: &str, key: Option<String>) -> bool {
        if !self.nodes.contains_key(name) {
            return false;
        }
        match key {
            Some(k) => self.wg_keys.insert(name.to_string(), k),
            None => self.wg_keys.remove(name),
        };
        true
    }

    pub fn add_pod(&mut self, node: &str, pod: PodInfo) -> bool {
        if !self.nodes.contains_key(node) {
            return false;
        }
        self.pods
            .entry(node.to_string())
            .or_default()
            .insert(pod.id.clone(), pod);
        true
    }

    /// A pod goes. False: there was no such pod on `node`.
    pub fn remove_pod(&mut self, node: &str, id: &WorkloadEndpointId) -> bool {
        self.pods
            .get_mut(node)
            .is_some_and(|p| p.remove(id).is_some())
    }

    /// The nodes, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.values()
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.get(name)
    }

    /// The messages each node needs to reach the current model, by node name; nodes with
    /// nothing to learn are absent. A node flushed for the first time gets its whole state and
    /// `InSync`; a node removed since the last flush is forgotten (it is not sent anything).
    pub fn flush(&mut self) -> BTreeMap<String, Vec<ToDataplane>> {
        self.sent.retain(|n, _| self.nodes.contains_key(n));
        let views: Vec<(String, NodeView)> = self
            .nodes
            .keys()
            .map(|n| (n.clone(), self.view_of(n)))
            .collect();
        let mut out = BTreeMap::new();
        for (name, want) in views {
            let msgs = diff(self.sent.get(&name), &want);
            if !msgs.is_empty() {
                out.insert(name.clone(), msgs);
            }
            self.sent.insert(name, want);
        }
        out
    }

    /// Everything node `name` should hold now, from scratch (what a restarted agent is sent).
    pub fn snapshot(&self, name: &str) -> Vec<ToDataplane> {
        if !self.nodes.contains_key(name) {
            return Vec::new();
        }
        diff(None, &self.view_of(name))
    }

    fn view_of(&self, name: &str) -> NodeView {
        let mut v = NodeView::default();
        let Some(me) = self.nodes.get(name) else {
            return v;
        };
        if let Some(pods) = self.pods.get(name) {
            for p in pods.values() {
                v.endpoints.insert(p.id.clone(), p.endpoint.clone());
            }
        }
        let mut rules: Vec<&Rule> = Vec::new();
        for ep in v.endpoints.values() {
            for tier in &ep.tiers {
                for id in tier.ingress_policies.iter().chain(&tier.egress_policies) {
                    if let Some(p) = self.policies.get(id) {
                        if v.policies.insert(id.clone(), p.clone()).is_none() {
                            rules.extend(p.inbound_rules.iter().chain(&p.outbound_rules));
                        }
                    }
                }
            }
            for id in &ep.profile_ids {
                if let Some(p) = self.profiles.get(id) {
                    if v.profiles.insert(id.clone(), p.clone()).is_none() {
                        rules.extend(p.inbound_rules.iter().chain(&p.outbound_rules));
                    }
                }
            }
        }
        for id in rules.into_iter().flat_map(rule_ip_set_ids) {
            if let Some(src) = self.ipsets.get(id) {
                v.ipsets
                    .entry(id.to_string())
                    .or_insert_with(|| self.members(src));
            }
        }
        let mut vxlan = false;
        for (id, pool) in &self.pools {
            v.pools.insert(id.clone(), pool.clone());
            vxlan |= pool.cidr.parse::<Ipv4Net>().is_ok() && mode_on(&pool.vxlan_mode);
            let v4 = pool.cidr.parse::<Ipv4Net>().is_ok();
            if v4 && mode_on(&pool.vxlan_mode) {
                v.encap.vxlan_enabled = true;
            }
            if v4 && mode_on(&pool.ipip_mode) {
                v.encap.ipip_enabled = true;
            }
        }
        for n in self.nodes.values() {
            // Felix's VXLAN resolver sends VTEPs only while a VXLAN pool exists.
            if vxlan {
                v.vteps.insert(
                    n.name.clone(),
                    VxlanTunnelEndpointUpdate {
                        node: n.name.clone(),
                        mac: n.vtep_mac.clone(),
                        ipv4_addr: n.tunnel_ip.to_string(),
                        parent_device_ip: n.ip.to_string(),
                        ..VxlanTunnelEndpointUpdate::default()
                    },
                );
            }
            if let Some(key) = self.wg_keys.get(&n.name) {
                v.wireguard.insert(
                    n.name.clone(),
                    WireguardEndpointUpdate {
                        hostname: n.name.clone(),
                        public_key: key.clone(),
                        interface_ipv4_addr: n.tunnel_ip.to_string(),
                    },
                );
            }
            v.hosts.insert(
                n.name.clone(),
                HostMetadataUpdate {
                    hostname: n.name.clone(),
                    ipv4_addr: format!("{}/{}", n.ip, n.prefix_len),
                    ..HostMetadataUpdate::default()
                },
            );
            let pool = self.pool_of(n.block);
            let local = n.name == me.name;
            let dst = n.block.to_string();
            v.routes.insert(
                dst.clone(),
                RouteUpdate {
                    types: if local {
                        RouteType::LocalWorkload
                    } else {
                        RouteType::RemoteWorkload
                    } as i32,
                    ip_pool_type: pool.map_or(IpPoolType::None, pool_type) as i32,
                    dst,
                    dst_node_name: n.name.clone(),
                    dst_node_ip: n.ip.to_string(),
                    same_subnet: !local
                        && pool.is_some_and(cross_subnet)
                        && me.subnet_contains(n.ip),
                    nat_outgoing: pool.is_some_and(|p| p.masquerade),
                    ..RouteUpdate::default()
                },
            );
        }
        v
    }

    /// The pool whose CIDR holds `block`.
    fn pool_of(&self, block: Ipv4Net) -> Option<&IpamPool> {
        self.pools
            .values()
            .find(|p| p.cidr.parse::<Ipv4Net>().is_ok_and(|c| c.contains(&block)))
    }

    fn members(&self, src: &IpSetSource) -> BTreeSet<String> {
        match src {
            IpSetSource::Nets(nets) => nets.iter().cloned().collect(),
            IpSetSource::Labels(want) => self
                .pods
                .values()
                .flat_map(BTreeMap::values)
                .filter(|p| want.iter().all(|(k, v)| p.labels.get(k) == Some(v)))
                .flat_map(|p| p.endpoint.ipv4_nets.iter().cloned())
                .collect(),
        }
    }
}

/// The IP set ids a rule refers to.
fn rule_ip_set_ids(r: &Rule) -> impl Iterator<Item = &str> {
    [
        &r.src_ip_set_ids,
        &r.dst_ip_set_ids,
        &r.dst_ip_port_set_ids,
        &r.src_named_port_ip_set_ids,
        &r.dst_named_port_ip_set_ids,
        &r.not_src_ip_set_ids,
        &r.not_dst_ip_set_ids,
        &r.not_src_named_port_ip_set_ids,
        &r.not_dst_named_port_ip_set_ids,
    ]
    .into_iter()
    .flatten()
    .map(String::as_str)
}

fn mode_on(m: &str) -> bool {
    !m.is_empty() && !m.eq_ignore_ascii_case("never")
}

fn cross_subnet(p: &IpamPool) -> bool {
    let cs =
        |m: &str| m.eq_ignore_ascii_case("crosssubnet") || m.eq_ignore_ascii_case("cross-subnet");
    cs(&p.vxlan_mode) || (!mode_on(&p.vxlan_mode) && cs(&p.ipip_mode))
}

/// Felix's `poolTypeForPool`: VXLAN wins over IPIP, neither is no-encap.
fn pool_type(p: &IpamPool) -> IpPoolType {
    if mode_on(&p.vxlan_mode) {
        IpPoolType::Vxlan
    } else if mode_on(&p.ipip_mode) {
        IpPoolType::Ipip
    } else {
        IpPoolType::NoEncap
    }
}

fn msg(p: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

/// Keys of `new` that are missing from `old` or differ there.
fn changed<'a, K: Ord, V: PartialEq>(
    old: &'a BTreeMap<K, V>,
    new: &'a BTreeMap<K, V>,
) -> impl Iterator<Item = (&'a K, &'a V)> {
    new.iter().filter(move |(k, v)| old.get(k) != Some(v))
}

/// Keys of `old` that are gone from `new`.
fn gone<'a, K: Ord, V>(
    old: &'a BTreeMap<K, V>,
    new: &'a BTreeMap<K, V>,
) -> impl Iterator<Item = &'a K> {
    old.keys().filter(move |k| !new.contains_key(k))
}

/// The messages that take a node from `old` (`None`: it was told nothing yet) to `new`, in
/// Felix's order (module doc).
fn diff(old: Option<&NodeView>, new: &NodeView) -> Vec<ToDataplane> {
    let empty = NodeView::default();
    let first = old.is_none();
    let old = old.unwrap_or(&empty);
    let mut out = Vec::new();

    for (id, members) in &new.ipsets {
        match old.ipsets.get(id) {
            None => out.push(msg(Payload::IpsetUpdate(IpSetUpdate {
                id: id.clone(),
                members: members.iter().cloned().collect(),
                r#type: IpSetType::Net as i32,
            }))),
            Some(had) if had != members => {
                out.push(msg(Payload::IpsetDeltaUpdate(IpSetDeltaUpdate {
                    id: id.clone(),
                    added_members: members.difference(had).cloned().collect(),
                    removed_members: had.difference(members).cloned().collect(),
                })))
            }
            Some(_) => {}
        }
    }
    for (id, p) in changed(&old.policies, &new.policies) {
        out.push(msg(Payload::ActivePolicyUpdate(ActivePolicyUpdate {
            id: Some(id.clone()),
            policy: Some(p.clone()),
        })));
    }
    for (name, p) in changed(&old.profiles, &new.profiles) {
        out.push(msg(Payload::ActiveProfileUpdate(ActiveProfileUpdate {
            id: Some(ProfileId { name: name.clone() }),
            profile: Some(p.clone()),
        })));
    }
    for (id, ep) in changed(&old.endpoints, &new.endpoints) {
        out.push(msg(Payload::WorkloadEndpointUpdate(
            WorkloadEndpointUpdate {
                id: Some(id.clone()),
                endpoint: Some(ep.clone()),
            },
        )));
    }
    for id in gone(&old.endpoints, &new.endpoints) {
        out.push(msg(Payload::WorkloadEndpointRemove(
            WorkloadEndpointRemove {
                id: Some(id.clone()),
            },
        )));
    }
    for name in gone(&old.profiles, &new.profiles) {
        out.push(msg(Payload::ActiveProfileRemove(ActiveProfileRemove {
            id: Some(ProfileId { name: name.clone() }),
        })));
    }
    for id in gone(&old.policies, &new.policies) {
        out.push(msg(Payload::ActivePolicyRemove(ActivePolicyRemove {
            id: Some(id.clone()),
        })));
    }
    for id in gone(&old.ipsets, &new.ipsets) {
        out.push(msg(Payload::IpsetRemove(IpSetRemove { id: id.clone() })));
    }

    for dst in gone(&old.routes, &new.routes) {
        out.push(msg(Payload::RouteRemove(RouteRemove { dst: dst.clone() })));
    }
    // A changed VTEP is removed and sent again (Felix's vxlan_resolver).
    let vtep_changed: Vec<&String> = changed(&old.vteps, &new.vteps).map(|(k, _)| k).collect();
    for node in gone(&old.vteps, &new.vteps).chain(
        vtep_changed
            .iter()
            .copied()
            .filter(|k| old.vteps.contains_key(*k)),
    ) {
        out.push(msg(Payload::VtepRemove(VxlanTunnelEndpointRemove {
            node: node.clone(),
        })));
    }
    for node in vtep_changed {
        out.push(msg(Payload::VtepUpdate(new.vteps[node].clone())));
    }
    for (_, r) in changed(&old.routes, &new.routes) {
        out.push(msg(Payload::RouteUpdate(r.clone())));
    }

    for host in gone(&old.hosts, &new.hosts) {
        out.push(msg(Payload::HostMetadataRemove(HostMetadataRemove {
            hostname: host.clone(),
            ..HostMetadataRemove::default()
        })));
    }
    for (_, h) in changed(&old.hosts, &new.hosts) {
        out.push(msg(Payload::HostMetadataUpdate(h.clone())));
    }
    for host in gone(&old.wireguard, &new.wireguard) {
        out.push(msg(Payload::WireguardEndpointRemove(
            WireguardEndpointRemove {
                hostname: host.clone(),
            },
        )));
    }
    for (_, w) in changed(&old.wireguard, &new.wireguard) {
        out.push(msg(Payload::WireguardEndpointUpdate(w.clone())));
    }
    for id in gone(&old.pools, &new.pools) {
        out.push(msg(Payload::IpamPoolRemove(IpamPoolRemove {
            id: id.clone(),
        })));
    }
    for (id, p) in changed(&old.pools, &new.pools) {
        out.push(msg(Payload::IpamPoolUpdate(IpamPoolUpdate {
            id: id.clone(),
            pool: Some(p.clone()),
        })));
    }
    if first || old.encap != new.encap {
        out.push(msg(Payload::Encapsulation(new.encap.clone())));
    }
    if first {
        out.push(msg(Payload::InSync(InSync {})));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_api::TierInfo;

    fn block(k: u8) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::new(10, 65, k, 0), 26).unwrap()
    }

    fn node(k: u8) -> NodeInfo {
        NodeInfo::new(
            format!("n{k}"),
            Ipv4Addr::new(172, 31, 0, 10 + k),
            24,
            block(k),
        )
    }

    fn pod(k: u8, name: &str, labels: &[(&str, &str)], tiers: Vec<TierInfo>) -> PodInfo {
        pod_at(k, 2, name, labels, tiers)
    }

    fn pod_at(
        k: u8,
        host: u8,
        name: &str,
        labels: &[(&str, &str)],
        tiers: Vec<TierInfo>,
    ) -> PodInfo {
        PodInfo {
            id: WorkloadEndpointId {
                orchestrator_id: "k8s".into(),
                workload_id: format!("default/{name}"),
                endpoint_id: "eth0".into(),
            },
            endpoint: WorkloadEndpoint {
                state: "active".into(),
                name: format!("cali{name}"),
                profile_ids: vec!["kns.default".into()],
                ipv4_nets: vec![format!("10.65.{k}.{host}/32")],
                tiers,
                ..WorkloadEndpoint::default()
            },
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn allow_clients() -> PolicyId {
        global_policy_id("allow-clients")
    }

    /// Three nodes; a client pod on n1, a server on n2 whose policy admits the IP set of
    /// `role=client` pods, another pod on n3.
    fn cluster() -> Controller {
        let mut c = Controller::new();
        c.set_ipv4_pool("10.65.0.0/16".parse().unwrap(), "Always");
        c.set_profile("kns.default", Profile::default());
        c.set_ipset(
            "s:clients",
            IpSetSource::Labels([("role".to_string(), "client".to_string())].into()),
        );
        c.set_policy(
            allow_clients(),
            Policy {
                inbound_rules: vec![Rule {
                    action: "allow".into(),
                    src_ip_set_ids: vec!["s:clients".into()],
                    ..Rule::default()
                }],
                ..Policy::default()
            },
        );
        for k in 1..=3 {
            c.add_node(node(k));
        }
        let tier = TierInfo {
            name: "default".into(),
            ingress_policies: vec![allow_clients()],
            ..TierInfo::default()
        };
        assert!(c.add_pod("n1", pod(1, "client", &[("role", "client")], vec![])));
        assert!(c.add_pod("n2", pod(2, "server", &[], vec![tier])));
        assert!(c.add_pod("n3", pod(3, "other", &[], vec![])));
        c
    }

    /// The id every update and remove message carries.
    fn id<T>(id: &Option<T>) -> &T {
        id.as_ref().expect("a message with an id")
    }

    /// One line per message: its kind and the key fields.
    fn show(msgs: &[ToDataplane]) -> Vec<String> {
        msgs.iter()
            .map(|m| match m.payload.as_ref().unwrap() {
                Payload::IpsetUpdate(u) => format!("ipset {} {:?}", u.id, u.members),
                Payload::IpsetDeltaUpdate(u) => format!(
                    "ipset-delta {} +{:?} -{:?}",
                    u.id, u.added_members, u.removed_members
                ),
                Payload::IpsetRemove(u) => format!("ipset-remove {}", u.id),
                Payload::ActivePolicyUpdate(u) => format!("policy {}", id(&u.id).name),
                Payload::ActivePolicyRemove(u) => format!("policy-remove {}", id(&u.id).name),
                Payload::ActiveProfileRemove(u) => format!("profile-remove {}", id(&u.id).name),
                Payload::ActiveProfileUpdate(u) => format!("profile {}", id(&u.id).name),
                Payload::WorkloadEndpointUpdate(u) => format!("endpoint {}", id(&u.id).workload_id),
                Payload::WorkloadEndpointRemove(u) => {
                    format!("endpoint-remove {}", id(&u.id).workload_id)
                }
                Payload::VtepUpdate(u) => format!(
                    "vtep {} {} {} {}",
                    u.node, u.mac, u.ipv4_addr, u.parent_device_ip
                ),
                Payload::VtepRemove(u) => format!("vtep-remove {}", u.node),
                Payload::RouteUpdate(u) => format!(
                    "route {} {:?} {:?} {} {}{}",
                    u.dst,
                    RouteType::try_from(u.types).unwrap(),
                    IpPoolType::try_from(u.ip_pool_type).unwrap(),
                    u.dst_node_name,
                    u.dst_node_ip,
                    if u.same_subnet { " same-subnet" } else { "" }
                ),
                Payload::RouteRemove(u) => format!("route-remove {}", u.dst),
                Payload::HostMetadataUpdate(u) => format!("host {} {}", u.hostname, u.ipv4_addr),
                Payload::HostMetadataRemove(u) => format!("host-remove {}", u.hostname),
                Payload::IpamPoolUpdate(u) => format!("pool {}", u.id),
                Payload::Encapsulation(e) => format!("encap vxlan={}", e.vxlan_enabled),
                Payload::InSync(_) => "in-sync".into(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_node_is_sent_its_own_endpoints_every_vtep_and_block_in_felixs_order() {
        let mut c = cluster();
        let out = c.flush();
        assert_eq!(out.len(), 3);
        let mac = |k: u8| vtep_mac_for_node(&format!("n{k}"));
        assert_eq!(
            show(&out["n2"]),
            vec![
                "ipset s:clients [\"10.65.1.2/32\"]".to_string(),
                "policy allow-clients".into(),
                "profile kns.default".into(),
                "endpoint default/server".into(),
                format!("vtep n1 {} 10.65.1.0 172.31.0.11", mac(1)),
                format!("vtep n2 {} 10.65.2.0 172.31.0.12", mac(2)),
                format!("vtep n3 {} 10.65.3.0 172.31.0.13", mac(3)),
                "route 10.65.1.0/26 RemoteWorkload Vxlan n1 172.31.0.11".into(),
                "route 10.65.2.0/26 LocalWorkload Vxlan n2 172.31.0.12".into(),
                "route 10.65.3.0/26 RemoteWorkload Vxlan n3 172.31.0.13".into(),
                "host n1 172.31.0.11/24".into(),
                "host n2 172.31.0.12/24".into(),
                "host n3 172.31.0.13/24".into(),
                "pool 10.65.0.0-16".into(),
                "encap vxlan=true".into(),
                "in-sync".into(),
            ]
        );
        // n1 runs no policy that uses the set: it is not sent the set or the policy.
        let n1 = show(&out["n1"]);
        assert!(n1
            .iter()
            .all(|l| !l.starts_with("ipset") && !l.starts_with("policy")));
        assert!(n1.contains(&"endpoint default/client".to_string()));
        assert!(!n1.iter().any(|l| l.contains("default/server")));
        // Nothing changed: nothing to send; a snapshot is what a fresh agent would get.
        assert!(c.flush().is_empty());
        assert_eq!(c.snapshot("n2"), out["n2"]);
        assert!(c.snapshot("nope").is_empty());
    }

    #[test]
    fn a_node_joining_reaches_every_node_and_its_pods_join_the_cluster_wide_sets() {
        let mut c = cluster();
        c.flush();
        c.add_node(node(4));
        assert!(c.add_pod("n4", pod(4, "client-4", &[("role", "client")], vec![])));
        let out = c.flush();
        let mac4 = vtep_mac_for_node("n4");
        let joined = vec![
            format!("vtep n4 {mac4} 10.65.4.0 172.31.0.14"),
            "route 10.65.4.0/26 RemoteWorkload Vxlan n4 172.31.0.14".into(),
            "host n4 172.31.0.14/24".into(),
        ];
        assert_eq!(show(&out["n1"]), joined);
        assert_eq!(show(&out["n3"]), joined);
        // n2's policy uses the set: it learns the new member first.
        let mut n2 = vec!["ipset-delta s:clients +[\"10.65.4.2/32\"] -[]".to_string()];
        n2.extend(joined.iter().cloned());
        assert_eq!(show(&out["n2"]), n2);
        // The new node gets everything, its own block as local, and InSync last.
        let n4 = show(&out["n4"]);
        assert!(n4.contains(&"route 10.65.4.0/26 LocalWorkload Vxlan n4 172.31.0.14".into()));
        assert_eq!(n4.iter().filter(|l| l.starts_with("vtep ")).count(), 4);
        assert_eq!(n4.last().map(String::as_str), Some("in-sync"));

        // It leaves: its route goes before its VTEP, and its pod leaves the set.
        assert!(c.remove_node("n4"));
        assert!(!c.remove_node("n4"));
        let out = c.flush();
        assert!(!out.contains_key("n4"));
        let left = vec![
            "route-remove 10.65.4.0/26".to_string(),
            "vtep-remove n4".into(),
            "host-remove n4".into(),
        ];
        assert_eq!(show(&out["n1"]), left);
        let mut n2 = vec!["ipset-delta s:clients +[] -[\"10.65.4.2/32\"]".to_string()];
        n2.extend(left.iter().cloned());
        assert_eq!(show(&out["n2"]), n2);
    }

    #[test]
    fn a_changed_vtep_is_removed_then_sent_again_everywhere() {
        let mut c = cluster();
        c.flush();
        assert!(c.set_vtep_mac("n1", "66:00:00:00:00:aa"));
        assert!(!c.set_vtep_mac("n9", "66:00:00:00:00:aa"));
        let out = c.flush();
        assert_eq!(out.len(), 3);
        for msgs in out.values() {
            assert_eq!(
                show(msgs),
                vec![
                    "vtep-remove n1".to_string(),
                    "vtep n1 66:00:00:00:00:aa 10.65.1.0 172.31.0.11".into(),
                ]
            );
        }
    }

    #[test]
    fn pods_coming_and_going_update_the_node_and_the_sets_that_select_them() {
        let mut c = cluster();
        c.flush();
        assert!(c.add_pod(
            "n3",
            pod_at(3, 3, "client-3", &[("role", "client")], vec![])
        ));
        let out = c.flush();
        assert_eq!(show(&out["n3"]), vec!["endpoint default/client-3"]);
        assert_eq!(
            show(&out["n2"]),
            vec!["ipset-delta s:clients +[\"10.65.3.3/32\"] -[]"]
        );
        assert!(!out.contains_key("n1"));
        let server = pod(2, "server", &[], vec![]).id;
        assert!(c.remove_pod("n2", &server));
        assert!(!c.remove_pod("n2", &server));
        // The server's removal makes its profile, policy and set unused on n2: removed, in
        // Felix's order (endpoints, profiles, policies, IP sets).
        assert_eq!(
            show(&c.flush()["n2"]),
            vec![
                "endpoint-remove default/server",
                "profile-remove kns.default",
                "policy-remove allow-clients",
                "ipset-remove s:clients",
            ]
        );
    }

    #[test]
    fn cross_subnet_pools_mark_routes_to_nodes_on_this_nodes_subnet() {
        let mut c = Controller::new();
        c.set_pool(
            "10.65.0.0-16",
            IpamPool {
                cidr: "10.65.0.0/16".into(),
                vxlan_mode: "CrossSubnet".into(),
                masquerade: true,
                ..IpamPool::default()
            },
        );
        c.add_node(node(1));
        c.add_node(node(2));
        c.add_node(NodeInfo::new(
            "far",
            Ipv4Addr::new(172, 31, 1, 20),
            24,
            block(9),
        ));
        let out = c.flush();
        let routes: Vec<String> = show(&out["n1"])
            .into_iter()
            .filter(|l| l.starts_with("route "))
            .collect();
        assert_eq!(
            routes,
            vec![
                "route 10.65.1.0/26 LocalWorkload Vxlan n1 172.31.0.11",
                "route 10.65.2.0/26 RemoteWorkload Vxlan n2 172.31.0.12 same-subnet",
                "route 10.65.9.0/26 RemoteWorkload Vxlan far 172.31.1.20",
            ]
        );
        // The pool masquerades: every route says so.
        assert!(out["n1"].iter().all(|m| match &m.payload {
            Some(Payload::RouteUpdate(r)) => r.nat_outgoing,
            _ => true,
        }));
    }

    #[test]
    fn vtep_macs_have_felixs_shape() {
        let m = vtep_mac_for_node("node-1");
        assert!(m.starts_with("66:"), "{m}");
        assert_eq!(m.len(), 17);
        assert_eq!(m, vtep_mac_for_node("node-1"));
        assert_ne!(m, vtep_mac_for_node("node-2"));
    }
}
