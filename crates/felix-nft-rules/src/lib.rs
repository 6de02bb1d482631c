//! Calico's rule semantics (§4–9, §17–18) rendered as nftables objects: mark bits,
//! names, base and static chains, endpoint/policy/profile chains, dispatch maps, NAT and IP
//! sets. Pure: model in, [`nf_tables::model`] objects out; no I/O, no netlink.
//!
//! Everything goes into one table per family (`ip calico`, `ip6 calico`; [`crate::OWNER`]),
//! with Felix's iptables tables folded in as chain-name prefixes (`filter-cali-FORWARD`, §6.1),
//! except the workload endpoints placed in the small side table ([`side`]).
//! The API is granular so the dataplane managers can re-render only what changed:
//!
//! | what | function |
//! |---|---|
//! | base chains + hooks | [`Renderer::base_chains`] |
//! | static chains (§7) | [`Renderer::static_chains`], [`Renderer::rpf_skip_chain`], [`Renderer::nat_outgoing_chain`], [`Renderer::floating_ip_chains`], [`Renderer::cidr_block_chain`], [`Renderer::host_dispatch_chains`] |
//! | sets and maps | [`Renderer::internal_sets`], [`Renderer::dispatch_maps`], [`Renderer::ipset`], [`Renderer::net_set_elements`] |
//! | workload | [`Renderer::workload_chains`], [`Renderer::workload_dispatch_elements`]; [`Renderer::workload_chains_shared`] renders each distinct body once per pass |
//! | host endpoint | [`Renderer::host_endpoint_chains`], [`Renderer::host_dispatch_elements`] |
//! | policy / profile | [`Renderer::policy_chains`], [`Renderer::profile_chains`] (with their shared sets) |
//! | side table | [`Renderer::side_base`], [`Renderer::side_resume_chains`], [`Renderer::side_ifaces_set`], [`Renderer::workload_chains_in`] |
//! | everything | [`render`], [`render_text`], [`render_nft`] over a [`Model`]; [`render_text_placed`] with a side-table placement |
//! | what changed | [`incremental::Incremental`]: patches per update; equals [`render_text_placed`] |
//!
//! Chains come as [`TextChain`]s: the object-model chain plus the `nft` text of each rule,
//! built in lockstep by [`nf_tables::build`]. [`TextChain::chain`] is what the codec commits.
//!
//! Deliberate differences from Felix, all with the same packet semantics:
//! - policy groups (§8.3) are not formed: endpoint chains jump straight to each policy chain
//!   (Felix inlines single-policy groups the same way);
//! - multi-value CIDR and port fields use shared content-addressed named sets instead of
//!   scratch-mark blocks (see [`policy`]);
//! - host-endpoint dispatch uses `ifname : verdict` maps like workload dispatch, with the `*`
//!   endpoint as the fallback;
//! - a negated ICMP type+code matches "not (type T and code C)" (see
//!   [`nf_tables::build::RuleBuilder::icmp`]);
//! - in raw and mangle the deny action is always `drop`; `reject` applies in filter.
//!
//! Not rendered (yet): flow-log NFLOG rules, Wireguard host encryption
//! (`cali-wireguard-incoming-mark`), OpenStack special cases, DSCP, Istio, flowtables, IPVS
//! endpoint marks, policy groups, the ARP table.
// A `pub` item no other crate can reach is `pub(crate)` or narrower: the public surface says
// what the crates above use.
#![warn(unreachable_pub)]

/// One name for everything felix-nft owns in the kernel: our nf_tables tables, and the prefix
/// that `cleanup` and the resync key off.
pub const OWNER: &str = "calico";

/// The side table of each family: workload endpoints added or changed since the last merge,
/// so that a commit validates a small table instead of the whole ruleset ([`side`]).
pub const SIDE_TABLE: &str = "calico-side";

pub mod config;
pub mod endpoint;
pub mod incremental;
pub mod marks;
pub mod names;
pub mod nflog;
pub mod policy;
pub mod sets;
pub mod side;
pub mod statics;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use felix_api::types::{
    to_dataplane::Payload, GlobalBgpConfigUpdate, HostEndpoint, HostEndpointId, HostMetadataUpdate,
    IpSetDeltaUpdate, IpSetType, IpamPool, Policy, PolicyId, Profile, ToDataplane,
    VxlanTunnelEndpointUpdate, WorkloadEndpoint, WorkloadEndpointId,
};
use nf_tables::build::TextTable;
use nf_tables::model::{Element, Family, Set, Table};

pub use config::{
    AllowAction, DenyAction, EndpointToHostAction, NatOutgoingExclusions, ProtoPort, RateLimit,
    RulesConfig, ServiceLoopPrevention,
};
pub use endpoint::{Dispatched, EndpointChainSpec, EndpointKind, Traffic};
pub use marks::MarkBits;
pub use names::{Direction, Dirs, Layer};
pub use nf_tables::build::TextChain;
pub use policy::{no_empty_ipsets, EmptyIpSet, PolicyChains};
pub use sets::Members;
use statics::internal_sets;

/// Errors of the renderer: only configuration can be wrong; a model is always renderable.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error(
        "mark mask {mask:#010x} has {bits} bits, too few to allocate the {what} mark bit \
         (Calico needs 5: accept, pass, drop, scratch0, scratch1)"
    )]
    /// The mark mask cannot hold Calico's five mark bits.
    MarkMaskTooSmall {
        /// The configured mask.
        mask: u32,
        /// How many bits it has.
        bits: u32,
        /// The first mark bit that did not fit.
        what: &'static str,
    },
}

/// Sets collected while rendering, by name (deduplicates shared sets).
pub(crate) type SetBag = BTreeMap<String, Set>;

/// The renderer: the configuration and the mark bits allocated from it.
#[derive(Clone, Debug)]
pub struct Renderer {
    /// The configuration rendered against.
    pub cfg: RulesConfig,
    /// The mark bits allocated from `cfg.mark_mask`.
    pub marks: MarkBits,
}

impl Renderer {
    /// Allocates the mark bits; fails when the mark mask is too small.
    pub fn new(cfg: RulesConfig) -> Result<Renderer, RulesError> {
        let marks = MarkBits::allocate(
            cfg.mark_mask,
            cfg.wireguard_port.is_some() || cfg.wireguard_port_v6.is_some(),
        )?;
        Ok(Renderer { cfg, marks })
    }

    /// The families rendered: `ip`, and `ip6` when IPv6 is on.
    pub fn families(&self) -> Vec<Family> {
        if self.cfg.ipv6_enabled {
            vec![Family::Ip, Family::Ip6]
        } else {
            vec![Family::Ip]
        }
    }
}

/// The tiers of an update's endpoint (every kind of tier a host endpoint has).
fn tiers_mut(p: &mut Payload) -> Vec<&mut felix_api::TierInfo> {
    match p {
        Payload::WorkloadEndpointUpdate(u) => u
            .endpoint
            .as_mut()
            .map(|e| e.tiers.iter_mut().collect())
            .unwrap_or_default(),
        Payload::HostEndpointUpdate(u) => u
            .endpoint
            .as_mut()
            .map(|e| {
                e.tiers
                    .iter_mut()
                    .chain(e.untracked_tiers.iter_mut())
                    .chain(e.pre_dnat_tiers.iter_mut())
                    .chain(e.forward_tiers.iter_mut())
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Whether `msg` names a policy in an older spelling ([`names::canonical_policy_id`]).
pub fn has_noncanonical_policy_ids(msg: &ToDataplane) -> bool {
    let odd = |id: &PolicyId| names::canonical_policy_id(id).is_some();
    let tiers = |ts: &[felix_api::TierInfo]| {
        ts.iter()
            .any(|t| t.ingress_policies.iter().chain(&t.egress_policies).any(odd))
    };
    match &msg.payload {
        Some(Payload::ActivePolicyUpdate(u)) => u.id.as_ref().is_some_and(odd),
        Some(Payload::ActivePolicyRemove(r)) => r.id.as_ref().is_some_and(odd),
        Some(Payload::WorkloadEndpointUpdate(u)) => {
            u.endpoint.as_ref().is_some_and(|e| tiers(&e.tiers))
        }
        Some(Payload::HostEndpointUpdate(u)) => u.endpoint.as_ref().is_some_and(|e| {
            tiers(&e.tiers)
                || tiers(&e.untracked_tiers)
                || tiers(&e.pre_dnat_tiers)
                || tiers(&e.forward_tiers)
        }),
        _ => false,
    }
}

/// Rewrites every policy id of `msg` into the form Felix sends today, so that one policy has
/// one id in the model whichever spelling an update used (and so one chain).
pub fn canonicalise_policy_ids(msg: &mut ToDataplane) {
    let fix = |id: &mut PolicyId| {
        if let Some(c) = names::canonical_policy_id(id) {
            *id = c;
        }
    };
    let Some(p) = &mut msg.payload else { return };
    match p {
        Payload::ActivePolicyUpdate(u) => u.id.iter_mut().for_each(fix),
        Payload::ActivePolicyRemove(r) => r.id.iter_mut().for_each(fix),
        _ => {
            for t in tiers_mut(p) {
                t.ingress_policies.iter_mut().for_each(fix);
                t.egress_policies.iter_mut().for_each(fix);
            }
        }
    }
}

/// What one update changed in the [`Model`], as much as the dataplane needs to mark what to
/// re-render and restate. The model's one match over the messages decides it; a value an update
/// replaced or removed is handed back where the dataplane reads it (moved out, not copied).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Not a model input.
    None,
    /// An IP set replaced, removed, or changed in a way rendered whole (a delta of a `NET` set
    /// or of a set the model does not hold).
    IpSet(String),
    /// A delta of a set rendered element by element: the members it touched.
    IpSetMembers {
        id: String,
        touched: Vec<String>,
    },
    Policy(Option<PolicyId>),
    /// A profile, by name.
    Profile(Option<String>),
    /// A workload endpoint updated or removed: the interface it had and the one it has, and
    /// whether an update repeated it unchanged.
    Workload {
        id: Option<WorkloadEndpointId>,
        old_iface: Option<String>,
        new_iface: Option<String>,
        unchanged: bool,
    },
    HostEndpoint,
    /// A Calico host (`node`): the addresses that may have joined or left the hosts set.
    Hosts {
        node: String,
        addrs: Vec<IpAddr>,
    },
    /// An IPAM pool; `updated` names the pool the model now holds, when the update set one.
    Pool {
        updated: Option<String>,
    },
    /// A VTEP; `old` is the one the update replaced or removed.
    Vtep {
        node: String,
        old: Option<VxlanTunnelEndpointUpdate>,
    },
    ServiceCidrs,
}

/// A whole node's desired state, in the Felix API's own types, kept in ordered maps so that
/// rendering does not depend on the order updates arrived in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    /// The renderer's configuration.
    pub config: RulesConfig,
    /// Workload endpoints by ID (the smaller ID wins an interface name).
    pub workloads: BTreeMap<WorkloadEndpointId, WorkloadEndpoint>,
    /// Host endpoints by ID; resolved to interfaces by name (`*` = all interfaces). Endpoints
    /// without a name (matched by expected IPs) need the interface monitor and are skipped.
    pub host_endpoints: BTreeMap<HostEndpointId, HostEndpoint>,
    /// Active policies.
    pub policies: BTreeMap<PolicyId, Policy>,
    /// Active profiles by name.
    pub profiles: BTreeMap<String, Profile>,
    /// IP sets by ID: type and members (member order does not matter).
    pub ipsets: BTreeMap<String, Members>,
    /// IPAM pools by ID (fill `masq-ipam-pools`, `network-ip-pools`, NAT outgoing).
    pub pools: BTreeMap<String, IpamPool>,
    /// Calico hosts by name (fill `all-hosts-net`).
    pub hosts: BTreeMap<String, HostMetadataUpdate>,
    /// VXLAN tunnel endpoints by node (fill `all-vxlan-net`).
    pub vteps: BTreeMap<String, VxlanTunnelEndpointUpdate>,
    /// Service cluster/external/load-balancer CIDRs (`GlobalBGPConfigUpdate`).
    pub service_cidrs: Vec<String>,
    /// Addresses of this host's non-workload interfaces (from the interface monitor), for the
    /// `this-host` set (§17).
    pub this_host: BTreeSet<std::net::IpAddr>,
}

impl Model {
    /// An empty model with this configuration.
    pub fn new(config: RulesConfig) -> Model {
        Model {
            config,
            ..Model::default()
        }
    }

    /// [`Model::apply`], with an `ipset_update`'s members already parsed (by validation:
    /// [`Members::try_parse`]). `None` parses them here.
    pub fn apply_parsed(&mut self, msg: &ToDataplane, members: Option<Members>) -> Change {
        match (&msg.payload, members) {
            (Some(Payload::IpsetUpdate(u)), Some(members)) => {
                self.ipsets.insert(u.id.clone(), members);
                Change::IpSet(u.id.clone())
            }
            _ => self.apply(msg),
        }
    }

    /// [`Model::apply_parsed`] taking the message: the big payloads (policies, profiles,
    /// endpoints, IP sets) move into the model instead of being copied (a state document).
    pub fn apply_owned(&mut self, msg: ToDataplane, members: Option<Members>) -> Change {
        match (msg.payload, members) {
            (Some(Payload::IpsetUpdate(u)), Some(members)) => {
                self.ipsets.insert(u.id.clone(), members);
                Change::IpSet(u.id)
            }
            (Some(Payload::ActivePolicyUpdate(u)), _) => {
                if let (Some(id), Some(p)) = (&u.id, u.policy) {
                    self.policies.insert(id.clone(), p);
                }
                Change::Policy(u.id)
            }
            (Some(Payload::ActiveProfileUpdate(u)), _) => {
                let name = u.id.map(|i| i.name);
                if let (Some(n), Some(p)) = (&name, u.profile) {
                    self.profiles.insert(n.clone(), p);
                }
                Change::Profile(name)
            }
            (Some(Payload::WorkloadEndpointUpdate(u)), _) => self.set_workload(u.id, u.endpoint),
            (Some(Payload::HostEndpointUpdate(u)), _) => {
                if let (Some(id), Some(e)) = (u.id, u.endpoint) {
                    self.host_endpoints.insert(id, e);
                }
                Change::HostEndpoint
            }
            (payload, _) => self.apply(&ToDataplane {
                sequence_number: msg.sequence_number,
                payload,
            }),
        }
    }

    /// Records one Felix update and says what it changed. Messages the renderer does not use
    /// are ignored ([`Change::None`]).
    pub fn apply(&mut self, msg: &ToDataplane) -> Change {
        let Some(p) = &msg.payload else {
            return Change::None;
        };
        match p {
            Payload::IpsetUpdate(u) => {
                let kind = IpSetType::try_from(u.r#type).unwrap_or(IpSetType::Ip);
                let members = Members::parse(kind, u.members.iter().map(String::as_str));
                self.ipsets.insert(u.id.clone(), members);
                Change::IpSet(u.id.clone())
            }
            Payload::IpsetDeltaUpdate(d) => self.apply_ipset_delta(d),
            Payload::IpsetRemove(r) => {
                self.ipsets.remove(&r.id);
                Change::IpSet(r.id.clone())
            }
            Payload::ActivePolicyUpdate(u) => {
                if let (Some(id), Some(p)) = (&u.id, &u.policy) {
                    self.policies.insert(id.clone(), p.clone());
                }
                Change::Policy(u.id.clone())
            }
            Payload::ActivePolicyRemove(r) => {
                if let Some(id) = &r.id {
                    self.policies.remove(id);
                }
                Change::Policy(r.id.clone())
            }
            Payload::ActiveProfileUpdate(u) => {
                if let (Some(id), Some(p)) = (&u.id, &u.profile) {
                    self.profiles.insert(id.name.clone(), p.clone());
                }
                Change::Profile(u.id.as_ref().map(|i| i.name.clone()))
            }
            Payload::ActiveProfileRemove(r) => {
                if let Some(id) = &r.id {
                    self.profiles.remove(&id.name);
                }
                Change::Profile(r.id.as_ref().map(|i| i.name.clone()))
            }
            Payload::WorkloadEndpointUpdate(u) => {
                self.set_workload(u.id.clone(), u.endpoint.clone())
            }
            Payload::WorkloadEndpointRemove(r) => {
                let old = r.id.as_ref().and_then(|id| self.workloads.remove(id));
                Change::Workload {
                    id: r.id.clone(),
                    old_iface: old.map(|e| e.name),
                    new_iface: None,
                    unchanged: false,
                }
            }
            Payload::HostEndpointUpdate(u) => {
                if let (Some(id), Some(e)) = (&u.id, &u.endpoint) {
                    self.host_endpoints.insert(id.clone(), e.clone());
                }
                Change::HostEndpoint
            }
            Payload::HostEndpointRemove(r) => {
                if let Some(id) = &r.id {
                    self.host_endpoints.remove(id);
                }
                Change::HostEndpoint
            }
            Payload::HostMetadataUpdate(u) | Payload::HostMetadataV4v6Update(u) => {
                let touched = self.host_touched(&u.hostname, [&u.ipv4_addr, &u.ipv6_addr]);
                self.hosts.insert(u.hostname.clone(), u.clone());
                touched
            }
            Payload::HostMetadataRemove(r) | Payload::HostMetadataV4v6Remove(r) => {
                let touched = self.host_touched(&r.hostname, [&r.ipv4_addr]);
                self.hosts.remove(&r.hostname);
                touched
            }
            // The IPv6 half of a host (Felix 3.31/3.32): folded into the host's one record.
            Payload::HostMetadataV6Update(u) => {
                let touched = self.host_touched(&u.hostname, [&u.ipv6_addr]);
                let h = self.hosts.entry(u.hostname.clone()).or_default();
                h.hostname.clone_from(&u.hostname);
                h.ipv6_addr.clone_from(&u.ipv6_addr);
                touched
            }
            Payload::HostMetadataV6Remove(r) => {
                let touched = self.host_touched(&r.hostname, []);
                if let Some(h) = self.hosts.get_mut(&r.hostname) {
                    h.ipv6_addr.clear();
                    if h.ipv4_addr.is_empty() {
                        self.hosts.remove(&r.hostname);
                    }
                }
                touched
            }
            Payload::IpamPoolUpdate(u) => {
                let updated = u.pool.as_ref().map(|p| {
                    self.pools.insert(u.id.clone(), p.clone());
                    u.id.clone()
                });
                Change::Pool { updated }
            }
            Payload::IpamPoolRemove(r) => {
                self.pools.remove(&r.id);
                Change::Pool { updated: None }
            }
            Payload::VtepUpdate(u) => Change::Vtep {
                node: u.node.clone(),
                old: self.vteps.insert(u.node.clone(), u.clone()),
            },
            Payload::VtepRemove(r) => Change::Vtep {
                node: r.node.clone(),
                old: self.vteps.remove(&r.node),
            },
            Payload::GlobalBgpConfigUpdate(u) => self.set_service_cidrs(u),
            _ => Change::None,
        }
    }

    /// Adds and removes an IP set's members.
    fn apply_ipset_delta(&mut self, d: &IpSetDeltaUpdate) -> Change {
        let Some(members) = self.ipsets.get_mut(&d.id) else {
            return Change::IpSet(d.id.clone());
        };
        // A hash set changes by the elements of the members touched; a NET set's
        // members are merged into intervals, so it is rendered whole.
        let by_element = matches!(members.kind(), IpSetType::Ip | IpSetType::IpAndPort);
        for m in &d.removed_members {
            members.remove(m);
        }
        for m in &d.added_members {
            members.insert(m);
        }
        if by_element {
            Change::IpSetMembers {
                id: d.id.clone(),
                touched: d
                    .removed_members
                    .iter()
                    .chain(&d.added_members)
                    .cloned()
                    .collect(),
            }
        } else {
            Change::IpSet(d.id.clone())
        }
    }

    /// The service CIDRs Felix's BGP configuration lists, sorted and without repeats.
    fn set_service_cidrs(&mut self, u: &GlobalBgpConfigUpdate) -> Change {
        let mut cidrs: Vec<String> = u
            .service_cluster_cidrs
            .iter()
            .chain(&u.service_external_cidrs)
            .chain(&u.service_loadbalancer_cidrs)
            .cloned()
            .collect();
        cidrs.sort();
        cidrs.dedup();
        self.service_cidrs = cidrs;
        Change::ServiceCidrs
    }

    /// Sets (or, without an endpoint, leaves) a workload endpoint.
    fn set_workload(
        &mut self,
        id: Option<WorkloadEndpointId>,
        endpoint: Option<WorkloadEndpoint>,
    ) -> Change {
        let new_iface = endpoint.as_ref().map(|e| e.name.clone());
        let (old, unchanged) = match (&id, endpoint) {
            (Some(id), Some(e)) => {
                let old = self.workloads.insert(id.clone(), e);
                let unchanged = old.is_some() && old.as_ref() == self.workloads.get(id);
                (old.map(|e| e.name), unchanged)
            }
            (Some(id), None) => (self.workloads.get(id).map(|e| e.name.clone()), false),
            (None, _) => (None, false),
        };
        Change::Workload {
            id,
            old_iface: old,
            new_iface,
            unchanged,
        }
    }

    /// The addresses a host update may add to or remove from the hosts set: the host's
    /// addresses before it, and those the message names.
    fn host_touched<const N: usize>(&self, host: &str, named: [&String; N]) -> Change {
        let before = self
            .hosts
            .get(host)
            .map(|h| [h.ipv4_addr.as_str(), h.ipv6_addr.as_str()]);
        let addrs = before
            .into_iter()
            .flatten()
            .chain(named.into_iter().map(String::as_str))
            .filter_map(host_ip)
            .collect();
        Change::Hosts {
            node: host.to_string(),
            addrs,
        }
    }

    /// Workloads by interface name; when two claim one interface the smaller ID wins (§14.1).
    pub fn workloads_by_iface(&self) -> BTreeMap<&str, &WorkloadEndpoint> {
        let mut out = BTreeMap::new();
        for wep in self.workloads.values() {
            out.entry(wep.name.as_str()).or_insert(wep);
        }
        out
    }

    /// Host endpoints by interface name (`*` for all interfaces); the smaller ID wins (§14.4).
    pub fn host_endpoints_by_iface(&self) -> BTreeMap<&str, &HostEndpoint> {
        let mut out = BTreeMap::new();
        for hep in self.host_endpoints.values() {
            if !hep.name.is_empty() {
                out.entry(hep.name.as_str()).or_insert(hep);
            }
        }
        out
    }
}

fn host_addr(s: &str) -> Option<String> {
    let addr = s.split('/').next()?.trim();
    (!addr.is_empty()).then(|| addr.to_string())
}

/// A host's or VTEP's address as the internal sets hold it (a prefix length, if sent, dropped).
pub fn host_ip(s: &str) -> Option<IpAddr> {
    s.split('/').next()?.trim().parse().ok()
}

/// Which policy/profile chains endpoints reference, per layer and direction.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refs {
    pub(crate) policies: BTreeMap<(Layer, PolicyId), Dirs>,
    pub(crate) profiles: BTreeMap<(Layer, String), Dirs>,
}

impl Refs {
    fn tiers(&mut self, layer: Layer, tiers: &[felix_api::types::TierInfo], dirs: &[Direction]) {
        for t in tiers {
            for &d in dirs {
                for id in endpoint::tier_policies(t, d) {
                    self.policies
                        .entry((layer, id.clone()))
                        .or_default()
                        .insert(d);
                }
            }
        }
    }

    fn profiles(&mut self, layer: Layer, names: &[String], dirs: &[Direction]) {
        for n in names {
            for &d in dirs {
                self.profiles
                    .entry((layer, n.clone()))
                    .or_default()
                    .insert(d);
            }
        }
    }

    /// What a workload endpoint references (only an active one jumps to policy).
    pub(crate) fn workload(&mut self, wep: &WorkloadEndpoint) {
        if wep.state == "active" {
            self.tiers(Layer::Filter, &wep.tiers, &BOTH);
            self.profiles(Layer::Filter, &wep.profile_ids, &BOTH);
        }
    }

    /// Adds the Felix IP sets the referenced policies and profiles use (both directions;
    /// ones the model does not have yet included) to `out`.
    pub(crate) fn ipsets(&self, model: &Model, out: &mut BTreeSet<String>) {
        for (_, id) in self.policies.keys() {
            if let Some(p) = model.policies.get(id) {
                policy::rules_ipsets(p.inbound_rules.iter().chain(&p.outbound_rules), out);
            }
        }
        for (_, name) in self.profiles.keys() {
            if let Some(p) = model.profiles.get(name) {
                policy::rules_ipsets(p.inbound_rules.iter().chain(&p.outbound_rules), out);
            }
        }
    }

    /// What a host endpoint references, in every layer it has chains in.
    pub(crate) fn host_endpoint(&mut self, iface: &str, hep: &HostEndpoint) {
        self.tiers(Layer::Filter, &hep.tiers, &BOTH);
        self.tiers(Layer::Filter, &hep.forward_tiers, &BOTH);
        self.profiles(Layer::Filter, &hep.profile_ids, &BOTH);
        self.tiers(Layer::Mangle, &hep.tiers, &[Direction::Outbound]);
        self.profiles(Layer::Mangle, &hep.profile_ids, &[Direction::Outbound]);
        self.tiers(Layer::Mangle, &hep.pre_dnat_tiers, &[Direction::Inbound]);
        if iface != "*" {
            self.tiers(Layer::Raw, &hep.untracked_tiers, &BOTH);
        }
    }
}

const BOTH: [Direction; 2] = [Direction::Inbound, Direction::Outbound];

/// The objects every table has whatever the endpoints (first part): base chains, static
/// chains, the internal sets filled from pools, hosts and VTEPs, and `this-host`.
pub(crate) fn render_base_head(r: &Renderer, family: Family, model: &Model, t: &mut TextTable) {
    for c in r.base_chains(family) {
        t.add_chain(c);
    }
    for c in r.static_chains(family) {
        t.add_chain(c);
    }
    if r.side_table_on() {
        for c in r.side_resume_chains(family) {
            t.add_chain(c);
        }
    }

    for set in render_internal_sets(r, family, model, None) {
        t.add_set(set);
    }

    // `this-host`: the addresses of this host's own interfaces.
    let this_host = Members::addresses(model.this_host.iter().copied());
    t.add_set(r.ipset(family, internal_sets::THIS_HOST, &this_host));
}

/// The internal sets filled from pools, hosts and VTEPs (all of them, or those in `only`, by
/// id), with their elements.
pub(crate) fn render_internal_sets(
    r: &Renderer,
    family: Family,
    model: &Model,
    only: Option<&BTreeSet<&'static str>>,
) -> Vec<Set> {
    let wanted = |id: &str| only.is_none_or(|o| o.contains(id));
    let v6 = family == Family::Ip6;
    let of_family = |s: &str| s.contains(':') == v6;
    let mut internal: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut add = |id: &'static str, member: String| {
        if wanted(id) {
            internal.entry(id).or_default().push(member);
        }
    };
    for pool in model.pools.values() {
        if !of_family(&pool.cidr) {
            continue;
        }
        if pool.masquerade {
            add(internal_sets::MASQ_IPAM_POOLS, pool.cidr.clone());
        }
        let lb_only =
            !pool.allowed_uses.is_empty() && pool.allowed_uses.iter().all(|u| u == "LoadBalancer");
        if !lb_only {
            add(internal_sets::NETWORK_IP_POOLS, pool.cidr.clone());
        }
    }
    for h in model.hosts.values() {
        let a = if v6 { &h.ipv6_addr } else { &h.ipv4_addr };
        if let Some(a) = host_addr(a) {
            add(internal_sets::ALL_HOSTS_NET, a);
        }
    }
    // Remote VTEPs only: VXLAN from this node's own address is not another host's (§17).
    for v in model.vteps.values().filter(|v| v.node != r.cfg.hostname) {
        let a = if v6 {
            &v.parent_device_ipv6
        } else {
            &v.parent_device_ip
        };
        if let Some(a) = host_addr(a) {
            add(internal_sets::ALL_VXLAN_NET, a);
        }
    }
    // Non-Calico nodes allowed to send tunnelled traffic (`ExternalNodesCIDRList`).
    for cidr in r.cfg.external_nodes.iter().filter(|c| of_family(c)) {
        add(internal_sets::ALL_HOSTS_NET, cidr.clone());
        add(internal_sets::ALL_VXLAN_NET, cidr.clone());
    }
    r.internal_sets(family)
        .into_iter()
        .filter(|set| wanted(&set.name[6..]))
        .map(|mut set| {
            if let Some(members) = internal.get(&set.name[6..]) {
                set.elements = if r.internal_set_by_address(family, &set.name[6..]) {
                    let addrs: BTreeSet<IpAddr> =
                        members.iter().filter_map(|m| m.parse().ok()).collect();
                    addrs
                        .into_iter()
                        .map(nf_tables::build::addr_element)
                        .collect()
                } else {
                    r.net_set_elements(family, members.iter().map(String::as_str))
                };
            }
            set
        })
        .collect()
}

/// Whether address `a` is a member of internal set `id` (`all-hosts-net` or `all-vxlan-net`)
/// by the model, as [`render_internal_sets`] fills it: the element a host or VTEP change adds
/// or deletes.
pub(crate) fn internal_set_has(r: &Renderer, model: &Model, id: &str, a: IpAddr) -> bool {
    let is = |s: &str| host_ip(s) == Some(a);
    let v6 = a.is_ipv6();
    match id {
        internal_sets::ALL_HOSTS_NET => model
            .hosts
            .values()
            .any(|h| is(if v6 { &h.ipv6_addr } else { &h.ipv4_addr })),
        internal_sets::ALL_VXLAN_NET => model
            .vteps
            .values()
            .filter(|v| v.node != r.cfg.hostname)
            .any(|v| {
                is(if v6 {
                    &v.parent_device_ipv6
                } else {
                    &v.parent_device_ip
                })
            }),
        _ => false,
    }
}

/// The dispatch maps with the workload elements given ((from, to) per interface) and those of
/// the host endpoints.
pub(crate) fn render_dispatch_maps(
    r: &Renderer,
    wl_elements: impl IntoIterator<Item = (Element, Element)>,
    heps: &BTreeMap<&str, &HostEndpoint>,
) -> Vec<Set> {
    let mut maps: BTreeMap<String, Set> = r
        .dispatch_maps()
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
    let from_wl = Layer::Filter.chain(names::logical::FROM_WL_DISPATCH);
    let to_wl = Layer::Filter.chain(names::logical::TO_WL_DISPATCH);
    for (from, to) in wl_elements {
        if let Some(m) = maps.get_mut(&from_wl) {
            m.elements.push(from);
        }
        if let Some(m) = maps.get_mut(&to_wl) {
            m.elements.push(to);
        }
    }
    for (iface, hep) in heps {
        for (map, el) in r.host_dispatch_elements(iface, hep) {
            if let Some(m) = maps.get_mut(&map) {
                m.elements.push(el);
            }
        }
    }
    maps.into_values()
        .map(|mut m| {
            m.elements.sort();
            m
        })
        .collect()
}

/// Chains that depend on the host endpoints and global inputs, not on workloads: host
/// dispatch, NAT-outgoing, CIDR block.
pub(crate) fn render_hep_statics(
    r: &Renderer,
    family: Family,
    model: &Model,
    heps: &BTreeMap<&str, &HostEndpoint>,
    t: &mut TextTable,
) {
    for c in r.host_dispatch_chains(family, heps.get("*").copied()) {
        t.add_chain(c);
    }
    t.add_chain(r.nat_outgoing_chain(family, model.pools.values()));
    t.add_chain(r.cidr_block_chain(family, &model.service_cidrs));
}

/// Chains that depend on the workloads as a whole: RPF skip (spoofing workloads), floating IPs.
pub(crate) fn render_workload_derived<'a>(
    r: &Renderer,
    family: Family,
    model: &Model,
    weps: impl IntoIterator<Item = &'a WorkloadEndpoint>,
    t: &mut TextTable,
) {
    t.add_chain(r.rpf_skip_chain(family, weps));
    let mut nats = Vec::new();
    for (id, wep) in &model.workloads {
        if r.cfg.floating_ips_enabled || id.orchestrator_id == "openstack" {
            nats.extend(wep.ipv4_nat.iter().cloned());
            nats.extend(wep.ipv6_nat.iter().cloned());
        }
    }
    for c in r.floating_ip_chains(family, &nats) {
        t.add_chain(c);
    }
}

/// Which policies have no rule in `family` and a direction (see [`endpoint::NoopPolicy`]),
/// decided once per policy and direction.
pub(crate) fn noop_policies(
    model: &Model,
    family: Family,
) -> impl Fn(&PolicyId, Direction) -> bool + '_ {
    let empty = empty_ipsets(model, family);
    let seen: std::cell::RefCell<BTreeMap<(&PolicyId, Direction), bool>> = Default::default();
    move |id: &PolicyId, dir: Direction| {
        let Some((id, p)) = model.policies.get_key_value(id) else {
            return false;
        };
        if let Some(&noop) = seen.borrow().get(&(id, dir)) {
            return noop;
        }
        let rules = match dir {
            Direction::Inbound => &p.inbound_rules,
            Direction::Outbound => &p.outbound_rules,
        };
        let noop = policy::renders_nothing(rules, family, &empty);
        seen.borrow_mut().insert((id, dir), noop);
        noop
    }
}

/// Which Felix IP sets have no member of `family` in `model` (unknown ones have none).
fn empty_ipsets(model: &Model, family: Family) -> impl Fn(&str) -> bool + '_ {
    let v6 = family == Family::Ip6;
    move |id: &str| model.ipsets.get(id).is_none_or(|m| !m.has_family(v6))
}

/// What owns a group of rule chains, borrowed: a policy or a profile.
#[derive(Clone, Copy)]
pub(crate) enum OwnerRef<'a> {
    Policy(&'a PolicyId),
    Profile(&'a str),
}

/// The chains (and their shared sets) of one referenced policy or profile, in the directions
/// used; one Felix has not sent (yet) gets chains that drop (fail closed).
pub(crate) fn render_owner(
    r: &Renderer,
    family: Family,
    model: &Model,
    (layer, owner): (Layer, OwnerRef),
    dirs: &[Direction],
) -> (Vec<TextChain>, Vec<Set>) {
    let empty = empty_ipsets(model, family);
    let rendered = match owner {
        OwnerRef::Policy(id) => {
            (model.policies.get(id)).map(|p| r.policy_chains(family, layer, id, p, dirs, &empty))
        }
        OwnerRef::Profile(name) => (model.profiles.get(name))
            .map(|p| r.profile_chains(family, layer, name, p, dirs, &empty)),
    };
    if let Some(pc) = rendered {
        return (pc.chains, pc.sets);
    }
    let chain_name = |d: Direction| match owner {
        OwnerRef::Policy(id) => names::policy_chain(layer, d, id),
        OwnerRef::Profile(name) => names::profile_chain(layer, d, name),
    };
    let chains = dirs
        .iter()
        .map(|d| r.missing_chain(family, layer, &chain_name(*d)))
        .collect();
    (chains, Vec::new())
}

/// Renders the whole model as tables with the `nft` text of every rule, every workload in the
/// main table (the side table, when on, is empty).
pub fn render_text(model: &Model) -> Result<Vec<TextTable>, RulesError> {
    render_text_placed(model, &BTreeSet::new(), &BTreeSet::new())
}

/// Renders the whole model with the workload interfaces in `side` living in the side table
/// ([`side`]) and those in `lingering` in both tables (main active, the side copy about to
/// go: the first half of a merge). The oracle for [`incremental::Incremental`]'s placement.
pub fn render_text_placed(
    model: &Model,
    side: &BTreeSet<String>,
    lingering: &BTreeSet<String>,
) -> Result<Vec<TextTable>, RulesError> {
    let r = Renderer::new(model.config.clone())?;
    let side_on = r.side_table_on();
    let weps = model.workloads_by_iface();
    let in_side = |i: &str| side_on && (side.contains(i) || lingering.contains(i));
    let in_main = |i: &str| !side_on || !side.contains(i);
    let main_weps: BTreeMap<&str, &WorkloadEndpoint> = weps
        .iter()
        .filter(|(i, _)| in_main(i))
        .map(|(i, w)| (*i, *w))
        .collect();
    let side_weps: BTreeMap<&str, &WorkloadEndpoint> = weps
        .iter()
        .filter(|(i, _)| in_side(i))
        .map(|(i, w)| (*i, *w))
        .collect();
    let heps = model.host_endpoints_by_iface();
    let mut refs = Refs::default();
    for wep in main_weps.values() {
        refs.workload(wep);
    }
    for (iface, hep) in &heps {
        refs.host_endpoint(iface, hep);
    }
    let mut side_refs = Refs::default();
    for wep in side_weps.values() {
        side_refs.workload(wep);
    }
    let (mut tables, mut side_tables) = (Vec::new(), Vec::new());
    for family in r.families() {
        let mut t = TextTable::new(family, crate::OWNER);
        render_base_head(&r, family, model, &mut t);

        // Felix IP sets, in the families they have members of.
        for (id, members) in &model.ipsets {
            if r.ipset_in_family(family, members) {
                t.add_set(r.ipset(family, id, members));
            }
        }

        // Endpoints.
        let noop = noop_policies(model, family);
        for wep in main_weps.values() {
            for c in r.workload_chains(family, wep, &noop) {
                t.add_chain(c);
            }
        }
        for (iface, hep) in &heps {
            for c in r.host_endpoint_chains(family, iface, hep, &noop) {
                t.add_chain(c);
            }
        }
        let wl_elements = main_weps
            .iter()
            .map(|(i, w)| r.workload_dispatch_elements(i, w, (false, &noop)));
        for m in render_dispatch_maps(&r, wl_elements, &heps) {
            t.add_set(m);
        }
        if side_on {
            let mut set = r.side_ifaces_set();
            set.elements = weps
                .keys()
                .filter(|i| side.contains(**i))
                .map(|i| side::side_iface_element(i))
                .collect();
            t.add_set(set);
        }
        render_hep_statics(&r, family, model, &heps, &mut t);
        render_workload_derived(&r, family, model, weps.values().copied(), &mut t);
        render_refs(&r, family, model, &refs, &mut t);
        tables.push(t);

        if side_on {
            let mut t = TextTable::new(family, crate::SIDE_TABLE);
            let wl_elements = side_weps
                .iter()
                .map(|(i, w)| r.workload_dispatch_elements(i, w, (true, &noop)));
            let (chains, maps) = r.side_base(family, wl_elements);
            chains.into_iter().for_each(|c| t.add_chain(c));
            maps.into_iter().for_each(|m| t.add_set(m));
            for wep in side_weps.values() {
                for c in r.workload_chains_in(family, wep, true, &noop) {
                    t.add_chain(c);
                }
            }
            render_refs(&r, family, model, &side_refs, &mut t);
            let mut ids = BTreeSet::new();
            side_refs.ipsets(model, &mut ids);
            for id in ids {
                if let Some(members) = model.ipsets.get(&id) {
                    if r.ipset_in_family(family, members) {
                        t.add_set(r.ipset(family, &id, members));
                    }
                }
            }
            side_tables.push(t);
        }
    }
    tables.extend(side_tables);
    Ok(tables)
}

/// The referenced policies and profiles, in the layers and directions they are used.
fn render_refs(r: &Renderer, family: Family, model: &Model, refs: &Refs, t: &mut TextTable) {
    let owners = (refs.policies.iter())
        .map(|((layer, id), dirs)| (*layer, OwnerRef::Policy(id), dirs))
        .chain(
            (refs.profiles.iter())
                .map(|((layer, name), dirs)| (*layer, OwnerRef::Profile(name), dirs)),
        );
    for (layer, owner, dirs) in owners {
        let dirs: Vec<Direction> = dirs.iter().collect();
        let (chains, sets) = render_owner(r, family, model, (layer, owner), &dirs);
        chains.into_iter().for_each(|c| t.add_chain(c));
        sets.into_iter().for_each(|s| t.add_set(s));
    }
}

/// Renders the whole model as object-model tables (`ip`, then `ip6` when enabled; then the
/// empty side tables when they are on).
pub fn render(model: &Model) -> Result<Vec<Table>, RulesError> {
    Ok(render_text(model)?.into_iter().map(|t| t.table).collect())
}

/// [`render_text_placed`] as object-model tables: main `ip` (and `ip6`), then the side tables.
pub fn render_placed(
    model: &Model,
    side: &BTreeSet<String>,
    lingering: &BTreeSet<String>,
) -> Result<Vec<Table>, RulesError> {
    Ok(render_text_placed(model, side, lingering)?
        .into_iter()
        .map(|t| t.table)
        .collect())
}

/// Renders the whole model as `nft -f` text.
pub fn render_nft(model: &Model) -> Result<String, RulesError> {
    Ok(render_text(model)?
        .iter()
        .map(TextTable::to_nft)
        .collect::<Vec<_>>()
        .join("\n"))
}
