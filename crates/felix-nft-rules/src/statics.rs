//! Base chains (§6.2–6.3) and the static chains of §7 for one family, plus the
//! chains built from pools, floating IPs, service CIDRs and spoofing allow-lists (§7.8, §7.11).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::{
    DenyAction, EndpointToHostAction, NatOutgoingExclusions, ProtoPort, ServiceLoopPrevention,
};
use crate::endpoint::allow_verdict;
use crate::names::{ipset_name, logical, ChainBuilder, Layer};
use crate::Renderer;
use felix_api::types::{IpamPool, NatInfo, WorkloadEndpoint};
use nf_tables::build::{self, BuiltRule, Dir, Iface, RuleBuilder, TextChain};
use nf_tables::model::{
    ct_state, set_flags, BaseChain, ChainType, DataType, Family, Hook, Set, Verdict,
};

/// Felix-internal IP set IDs the static chains reference (§2.4).
pub mod internal_sets {
    pub const ALL_HOSTS_NET: &str = "all-hosts-net";
    pub const ALL_VXLAN_NET: &str = "all-vxlan-net";
    pub const MASQ_IPAM_POOLS: &str = "masq-ipam-pools";
    pub const NETWORK_IP_POOLS: &str = "network-ip-pools";
    /// Addresses of this host's non-workload interfaces (type IP; the hostIP manager, §17).
    pub const THIS_HOST: &str = "this-host";
}

/// The base chains of §6.2 with their hook rules (§6.3), in a fixed order.
const BASE_CHAINS: &[(&str, ChainType, Hook, i32)] = &[
    ("raw-PREROUTING", ChainType::Filter, Hook::Prerouting, -300),
    ("raw-OUTPUT", ChainType::Filter, Hook::Output, -300),
    (
        "mangle-PREROUTING",
        ChainType::Filter,
        Hook::Prerouting,
        -150,
    ),
    ("mangle-INPUT", ChainType::Filter, Hook::Input, -150),
    ("mangle-FORWARD", ChainType::Filter, Hook::Forward, -150),
    ("mangle-OUTPUT", ChainType::Route, Hook::Output, -150),
    (
        "mangle-POSTROUTING",
        ChainType::Filter,
        Hook::Postrouting,
        -150,
    ),
    ("nat-PREROUTING", ChainType::Nat, Hook::Prerouting, -100),
    ("nat-INPUT", ChainType::Nat, Hook::Input, -100),
    ("nat-OUTPUT", ChainType::Nat, Hook::Output, 110),
    ("nat-POSTROUTING", ChainType::Nat, Hook::Postrouting, 110),
    ("filter-INPUT", ChainType::Filter, Hook::Input, 0),
    ("filter-FORWARD", ChainType::Filter, Hook::Forward, 0),
    ("filter-OUTPUT", ChainType::Filter, Hook::Output, 0),
];

fn fam_v6(family: Family) -> bool {
    family == Family::Ip6
}

/// The tunnels whose packets between Calico hosts the filter chains allow.
#[derive(Clone, Copy)]
enum Tunnel {
    Ipip,
    Vxlan,
    /// WireGuard on its UDP port.
    Wireguard(u16),
}

/// What every static chain of one family is built from.
struct Statics {
    family: Family,
    v6: bool,
    /// Workload interface patterns (`cali*`).
    prefixes: Vec<String>,
    hosts_set: String,
    vxlan_set: String,
    vxlan: bool,
    ipip: bool,
    wg_port: Option<u16>,
}

impl Statics {
    fn new(rd: &Renderer, family: Family) -> Statics {
        let cfg = &rd.cfg;
        let v6 = fam_v6(family);
        Statics {
            family,
            v6,
            prefixes: cfg
                .workload_iface_prefixes
                .iter()
                .map(|p| format!("{p}*"))
                .collect(),
            hosts_set: ipset_name(family, internal_sets::ALL_HOSTS_NET),
            vxlan_set: ipset_name(family, internal_sets::ALL_VXLAN_NET),
            vxlan: rd.vxlan_on(family),
            ipip: cfg.ipip_enabled && !v6,
            wg_port: if v6 {
                cfg.wireguard_port_v6
            } else {
                cfg.wireguard_port
            },
        }
    }

    fn rule(&self) -> RuleBuilder {
        RuleBuilder::new(self.family)
    }

    /// `meta l4proto udp th dport <port>`: the tunnels' UDP (VXLAN, WireGuard).
    fn udp_dport(&self, port: u16) -> RuleBuilder {
        self.rule().l4proto(17).th_port(Dir::Dst, port, port, false)
    }
}

impl Renderer {
    /// The configured filter deny (drop or reject) in the filter layer; drop elsewhere (raw
    /// and mangle run before the hooks where `reject` is meaningful).
    pub(crate) fn deny(&self, b: RuleBuilder, layer: Layer) -> RuleBuilder {
        match (layer, self.cfg.filter_deny_action) {
            (Layer::Filter, DenyAction::Reject) => b.reject(),
            _ => b.drop_(),
        }
    }

    fn filter_allow(&self) -> Verdict {
        allow_verdict(self.cfg.filter_allow_action)
    }

    fn mangle_allow(&self) -> Verdict {
        allow_verdict(self.cfg.mangle_allow_action)
    }

    /// `meta mark & ACCEPT == ACCEPT counter <then>`: a packet that policy (or an earlier chain)
    /// marked as accepted leaves with `then`.
    fn accept_mark(&self, s: &Statics, then: Verdict) -> BuiltRule {
        s.rule()
            .mark_has(self.marks.accept)
            .counter()
            .verdict(then)
            .build()
    }

    /// Jumps to the host endpoint chain `chain` (after `b`'s matches), then lets a packet the
    /// host endpoint's policy accepted leave with `then`.
    fn host_endpoint_policy(
        &self,
        s: &Statics,
        c: &mut ChainBuilder,
        b: RuleBuilder,
        chain: &str,
        then: Verdict,
    ) {
        c.push(b.counter().jump(chain).build(), &[]);
        c.push(
            self.accept_mark(s, then),
            &["Host endpoint policy accepted packet."],
        );
    }

    /// Allows `tunnel`'s packets between this host and a peer: `peer` is the peer's side of the
    /// packet (`Src` coming in, `Dst` going out), in the tunnel's set of peers when it has one;
    /// the other side must be one of this host's addresses.
    fn tunnel_allow(&self, s: &Statics, tunnel: Tunnel, peer: Dir) -> BuiltRule {
        let (b, set) = match tunnel {
            Tunnel::Ipip => (s.rule().l4proto(4), Some(&s.hosts_set)),
            Tunnel::Vxlan => (s.udp_dport(self.cfg.vxlan_port), Some(&s.vxlan_set)),
            Tunnel::Wireguard(port) => (s.udp_dport(port), None),
        };
        let local = match peer {
            Dir::Src => Dir::Dst,
            Dir::Dst => Dir::Src,
        };
        let b = match set {
            Some(set) => b.addr_in_set(peer, set, false),
            None => b,
        };
        b.fib_addr_type_local(local, false)
            .counter()
            .verdict(self.filter_allow())
            .build()
    }

    /// The 14 base chains with their hook rules (§6.2–6.3). Every base chain exists, even
    /// when empty, with policy accept.
    pub fn base_chains(&self, family: Family) -> Vec<TextChain> {
        let r = || RuleBuilder::new(family);
        BASE_CHAINS
            .iter()
            .map(|&(name, chain_type, hook, priority)| {
                let mut c = ChainBuilder::base(
                    name,
                    BaseChain {
                        chain_type,
                        hook,
                        priority,
                        policy: Verdict::Accept,
                    },
                );
                let target = match name {
                    "raw-PREROUTING" | "mangle-PREROUTING" | "nat-PREROUTING" => Some(format!(
                        "{}-cali-PREROUTING",
                        &name[..name.find('-').unwrap_or(0)]
                    )),
                    "raw-OUTPUT" | "nat-OUTPUT" | "filter-OUTPUT" => Some(format!(
                        "{}-cali-OUTPUT",
                        &name[..name.find('-').unwrap_or(0)]
                    )),
                    "mangle-POSTROUTING" => Some(Layer::Mangle.chain(logical::POSTROUTING)),
                    "filter-INPUT" => Some(Layer::Filter.chain(logical::INPUT)),
                    "filter-FORWARD" => Some(Layer::Filter.chain(logical::FORWARD)),
                    _ => None,
                };
                if let Some(t) = target {
                    c.push(r().counter().jump(&t).build(), &[]);
                }
                match name {
                    "filter-FORWARD" => {
                        c.start_appends();
                        self.forward_tail(family, &mut c);
                    }
                    "nat-POSTROUTING" => {
                        c.start_appends();
                        c.push(
                            r().counter()
                                .jump(&Layer::Nat.chain(logical::POSTROUTING))
                                .build(),
                            &[],
                        );
                    }
                    _ => {}
                }
                c.finish()
            })
            .collect()
    }

    /// `cali-FORWARD`'s jump to a workload dispatch chain for interfaces `prefix` (`cali*`).
    pub(crate) fn wl_dispatch_jump(
        &self,
        family: Family,
        which: Iface,
        prefix: &str,
    ) -> build::BuiltRule {
        let (b, chain) = match which {
            Iface::In => (
                RuleBuilder::new(family).iifname(prefix),
                logical::FROM_WL_DISPATCH,
            ),
            Iface::Out => (
                RuleBuilder::new(family).oifname(prefix),
                logical::TO_WL_DISPATCH,
            ),
        };
        b.counter().jump(&Layer::Filter.chain(chain)).build()
    }

    /// `cali-FORWARD`'s rules after the workload dispatch (§7.1): host-endpoint forward policy
    /// of the outgoing interface, then the CIDR block.
    pub(crate) fn forward_after_workloads(&self, family: Family, c: &mut ChainBuilder) {
        let r = || RuleBuilder::new(family);
        let f = |n: &str| Layer::Filter.chain(n);
        c.push(r().counter().jump(&f(logical::TO_HEP_FORWARD)).build(), &[]);
        c.push(r().counter().jump(&f(logical::CIDR_BLOCK)).build(), &[]);
    }

    /// `filter-FORWARD`'s rules after `cali-FORWARD` (§6.3): accept what policy accepted, mark
    /// the rest as forwarded for mangle POSTROUTING.
    pub(crate) fn forward_tail(&self, family: Family, c: &mut ChainBuilder) {
        let m = self.marks;
        let r = || RuleBuilder::new(family);
        c.push(
            r().mark_has(m.accept)
                .counter()
                .verdict(self.filter_allow())
                .build(),
            &["Policy explicitly accepted packet."],
        );
        c.push(
            r().counter().mark_set_or(m.accept).build(),
            &["Mark packet as forwarded for mangle POSTROUTING"],
        );
    }

    /// `cali-wl-to-host`'s last rule: the configured `DefaultEndpointToHostAction` (§7.3).
    pub(crate) fn endpoint_to_host_rule(&self, family: Family) -> build::BuiltRule {
        let b = RuleBuilder::new(family).counter();
        match self.cfg.endpoint_to_host_action {
            EndpointToHostAction::Drop => self.deny(b, Layer::Filter),
            EndpointToHostAction::Accept => b.accept(),
            EndpointToHostAction::Return => b.ret(),
        }
        .build()
    }

    /// Whether internal set `id` of `family` holds single addresses (a plain set, changed by
    /// element as hosts and VTEPs come and go) rather than intervals: `all-hosts-net` and
    /// `all-vxlan-net` do unless `ExternalNodesCIDRList` adds networks of the family.
    pub fn internal_set_by_address(&self, family: Family, id: &str) -> bool {
        let v6 = fam_v6(family);
        matches!(
            id,
            internal_sets::ALL_HOSTS_NET | internal_sets::ALL_VXLAN_NET
        ) && !self
            .cfg
            .external_nodes
            .iter()
            .any(|c| c.contains(':') == v6)
    }

    /// The Felix-internal sets the static chains reference, empty: `all-hosts-net` and
    /// `all-vxlan-net` (addresses, see [`Renderer::internal_set_by_address`], or intervals),
    /// `masq-ipam-pools`, `network-ip-pools` (intervals: fill them with
    /// [`Renderer::net_set_elements`]).
    pub fn internal_sets(&self, family: Family) -> Vec<Set> {
        let key = if fam_v6(family) {
            DataType::Ipv6Addr
        } else {
            DataType::Ipv4Addr
        };
        [
            internal_sets::ALL_HOSTS_NET,
            internal_sets::ALL_VXLAN_NET,
            internal_sets::MASQ_IPAM_POOLS,
            internal_sets::NETWORK_IP_POOLS,
        ]
        .iter()
        .map(|id| {
            let flags = if self.internal_set_by_address(family, id) {
                0
            } else {
                set_flags::INTERVAL
            };
            build::new_set(&ipset_name(family, id), vec![key], flags, None)
        })
        .collect()
    }

    /// The workload dispatch maps (`ifname : verdict`, empty; elements come from
    /// [`Renderer::workload_dispatch_elements`]) and the host-endpoint dispatch maps, each
    /// element with its own packet and byte counter.
    pub fn dispatch_maps(&self) -> Vec<Set> {
        [
            Layer::Filter.chain(logical::FROM_WL_DISPATCH),
            Layer::Filter.chain(logical::TO_WL_DISPATCH),
            Layer::Filter.chain(logical::FROM_HOST_ENDPOINT),
            Layer::Filter.chain(logical::TO_HOST_ENDPOINT),
            Layer::Filter.chain(logical::FROM_HEP_FORWARD),
            Layer::Filter.chain(logical::TO_HEP_FORWARD),
            Layer::Mangle.chain(logical::FROM_HOST_ENDPOINT),
            Layer::Mangle.chain(logical::TO_HOST_ENDPOINT),
            Layer::Raw.chain(logical::FROM_HOST_ENDPOINT),
            Layer::Raw.chain(logical::TO_HOST_ENDPOINT),
        ]
        .iter()
        .map(|n| {
            // Endpoints with equal bodies share one chain, whose rule counters then add up
            // their traffic: each interface's element counts its own packets and bytes.
            let mut m = build::new_set(n, vec![DataType::IfName], 0, Some(DataType::Verdict));
            m.counter = true;
            m
        })
        .collect()
    }

    fn failsafe_rule(
        &self,
        family: Family,
        pp: &ProtoPort,
        port_dir: Dir,
        net_dir: Dir,
    ) -> Option<RuleBuilder> {
        let mut b = RuleBuilder::new(family)
            .l4proto(pp.proto)
            .th_port(port_dir, pp.port, pp.port, false);
        if let Some(net) = pp.net {
            if matches!(net, IpNet::V6(_)) != fam_v6(family) {
                return None;
            }
            b = b.addr(net_dir, net, false);
        }
        Some(b.counter().accept())
    }

    /// `cali-failsafe-in` / `cali-failsafe-out` in one layer (§7.5); the raw copies also let
    /// the return traffic of the other direction through (before conntrack exists).
    fn failsafe_chains(&self, family: Family, layer: Layer) -> Vec<TextChain> {
        let mut fin = ChainBuilder::new(&layer.chain(logical::FAILSAFE_IN));
        for pp in &self.cfg.failsafe_inbound {
            if let Some(b) = self.failsafe_rule(family, pp, Dir::Dst, Dir::Src) {
                fin.push(b.build(), &["Failsafe host port"]);
            }
        }
        if layer == Layer::Raw {
            for pp in &self.cfg.failsafe_outbound {
                if let Some(b) = self.failsafe_rule(family, pp, Dir::Src, Dir::Src) {
                    fin.push(b.build(), &["Failsafe return traffic"]);
                }
            }
        }
        let mut fout = ChainBuilder::new(&layer.chain(logical::FAILSAFE_OUT));
        for pp in &self.cfg.failsafe_outbound {
            if let Some(b) = self.failsafe_rule(family, pp, Dir::Dst, Dir::Dst) {
                fout.push(b.build(), &["Failsafe host port"]);
            }
        }
        if layer == Layer::Raw {
            for pp in &self.cfg.failsafe_inbound {
                if let Some(b) = self.failsafe_rule(family, pp, Dir::Src, Dir::Dst) {
                    fout.push(b.build(), &["Failsafe return traffic"]);
                }
            }
        }
        vec![fin.finish(), fout.finish()]
    }

    fn vxlan_on(&self, family: Family) -> bool {
        if fam_v6(family) {
            self.cfg.vxlan_enabled_v6
        } else {
            self.cfg.vxlan_enabled
        }
    }

    /// Every static chain of §7 for one family (and the workload dispatch chains of §6.5).
    /// Chains whose content comes from the model — `raw-cali-rpf-skip`, `nat-cali-nat-outgoing`,
    /// `nat-cali-fip-dnat`/`-snat`, `filter-cali-cidr-block` and the host-endpoint dispatch
    /// chains — have their own functions.
    pub fn static_chains(&self, family: Family) -> Vec<TextChain> {
        let s = Statics::new(self, family);
        let mut out = vec![
            self.filter_forward(&s),
            self.filter_input(&s),
            self.filter_wl_to_host(&s),
            self.filter_output(&s),
        ];
        out.extend(self.failsafes(&s));
        out.extend(self.workload_dispatch(&s));
        out.push(self.mangle_prerouting(&s));
        out.push(self.mangle_postrouting(&s));
        out.push(self.raw_prerouting(&s));
        out.push(self.raw_output(&s));
        out.extend(self.raw_wireguard_incoming_mark(&s));
        out.extend(self.nat(&s));
        out
    }

    /// filter cali-FORWARD (§7.1)
    fn filter_forward(&self, s: &Statics) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Filter.chain(logical::FORWARD));
        c.push(
            s.rule()
                .counter()
                .mark_clear(self.marks.pass | self.marks.scratch0 | self.marks.scratch1)
                .build(),
            &[],
        );
        c.push(
            s.rule()
                .mark_lacks(self.marks.accept)
                .counter()
                .jump(&Layer::Filter.chain(logical::FROM_HEP_FORWARD))
                .build(),
            &[],
        );
        for p in &s.prefixes {
            c.push(self.wl_dispatch_jump(s.family, Iface::In, p), &[]);
            c.push(self.wl_dispatch_jump(s.family, Iface::Out, p), &[]);
        }
        self.forward_after_workloads(s.family, &mut c);
        c.finish()
    }

    /// filter cali-INPUT (§7.2)
    fn filter_input(&self, s: &Statics) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Filter.chain(logical::INPUT));
        if s.ipip {
            c.push(
                self.tunnel_allow(s, Tunnel::Ipip, Dir::Src),
                &["Allow IPIP packets from Calico hosts"],
            );
            c.push(
                self.deny(s.rule().l4proto(4).counter(), Layer::Filter)
                    .build(),
                &["Drop IPIP packets from non-Calico hosts"],
            );
        }
        if s.vxlan {
            c.push(
                self.tunnel_allow(s, Tunnel::Vxlan, Dir::Src),
                &["Allow VXLAN packets from allowed hosts"],
            );
            let b = s
                .udp_dport(self.cfg.vxlan_port)
                .fib_addr_type_local(Dir::Dst, false)
                .counter();
            let b = if s.v6 {
                self.deny(b, Layer::Filter)
            } else {
                b.drop_()
            };
            c.push(b.build(), &["Drop VXLAN packets from non-allowed hosts"]);
        }
        if let Some(port) = s.wg_port {
            c.push(
                self.tunnel_allow(s, Tunnel::Wireguard(port), Dir::Src),
                &["Allow incoming Wireguard packets"],
            );
        }
        for p in &s.prefixes {
            c.push(
                s.rule()
                    .iifname(p)
                    .counter()
                    .goto(&Layer::Filter.chain(logical::WL_TO_HOST))
                    .build(),
                &[],
            );
        }
        c.push(self.accept_mark(s, self.filter_allow()), &[]);
        c.push(s.rule().counter().mark_clear(self.marks.all()).build(), &[]);
        self.host_endpoint_policy(
            s,
            &mut c,
            s.rule(),
            &Layer::Filter.chain(logical::FROM_HOST_ENDPOINT),
            self.filter_allow(),
        );
        c.finish()
    }

    /// filter cali-wl-to-host (§7.3)
    fn filter_wl_to_host(&self, s: &Statics) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Filter.chain(logical::WL_TO_HOST));
        if s.v6 {
            for t in [130u8, 131, 132, 133, 135, 136] {
                c.push(
                    s.rule()
                        .l4proto(58)
                        .icmp(true, t, None, false)
                        .counter()
                        .verdict(self.filter_allow())
                        .build(),
                    &[],
                );
            }
        }
        c.push(
            s.rule()
                .counter()
                .jump(&Layer::Filter.chain(logical::FROM_WL_DISPATCH))
                .build(),
            &[],
        );
        c.push(
            self.endpoint_to_host_rule(s.family),
            &["Configured DefaultEndpointToHostAction"],
        );
        c.finish()
    }

    /// filter cali-OUTPUT (§7.4)
    fn filter_output(&self, s: &Statics) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Filter.chain(logical::OUTPUT));
        c.push(self.accept_mark(s, self.filter_allow()), &[]);
        for p in &s.prefixes {
            c.push(s.rule().oifname(p).counter().ret().build(), &[]);
        }
        let tunnels = [
            (
                s.ipip.then_some(Tunnel::Ipip),
                "Allow IPIP packets to other Calico hosts",
            ),
            (
                s.vxlan.then_some(Tunnel::Vxlan),
                "Allow VXLAN packets to other Calico hosts",
            ),
            (
                s.wg_port.map(Tunnel::Wireguard),
                "Allow outgoing Wireguard packets",
            ),
        ];
        for (tunnel, comment) in tunnels {
            if let Some(tunnel) = tunnel {
                c.push(self.tunnel_allow(s, tunnel, Dir::Dst), &[comment]);
            }
        }
        c.push(s.rule().counter().mark_clear(self.marks.all()).build(), &[]);
        self.host_endpoint_policy(
            s,
            &mut c,
            s.rule().ct_status_dnat(false),
            &Layer::Filter.chain(logical::TO_HOST_ENDPOINT),
            self.filter_allow(),
        );
        c.finish()
    }

    /// failsafes (§7.5)
    fn failsafes(&self, s: &Statics) -> Vec<TextChain> {
        let mut out = Vec::new();
        for layer in [Layer::Filter, Layer::Mangle, Layer::Raw] {
            out.extend(self.failsafe_chains(s.family, layer));
        }
        out
    }

    /// workload dispatch (§6.5): one vmap lookup, then fail closed.
    fn workload_dispatch(&self, s: &Statics) -> Vec<TextChain> {
        let mut out = Vec::new();
        for (name, which) in [
            (Layer::Filter.chain(logical::FROM_WL_DISPATCH), Iface::In),
            (Layer::Filter.chain(logical::TO_WL_DISPATCH), Iface::Out),
        ] {
            let mut c = ChainBuilder::new(&name);
            if self.side_table_on() {
                self.side_handoff(s.family, which, &mut c);
            }
            c.push(s.rule().ifname_vmap(which, &name).build(), &[]);
            c.push(
                self.deny(s.rule().counter(), Layer::Filter).build(),
                &["Unknown interface"],
            );
            out.push(c.finish());
        }
        out
    }

    /// mangle cali-PREROUTING (§7.6)
    fn mangle_prerouting(&self, s: &Statics) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Mangle.chain(logical::PREROUTING));
        c.push(
            s.rule()
                .ct_state(ct_state::ESTABLISHED | ct_state::RELATED)
                .counter()
                .verdict(self.mangle_allow())
                .build(),
            &[],
        );
        c.push(self.accept_mark(s, self.mangle_allow()), &[]);
        self.host_endpoint_policy(
            s,
            &mut c,
            s.rule(),
            &Layer::Mangle.chain(logical::FROM_HOST_ENDPOINT),
            self.mangle_allow(),
        );
        c.finish()
    }

    /// mangle cali-POSTROUTING (§7.7)
    fn mangle_postrouting(&self, s: &Statics) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Mangle.chain(logical::POSTROUTING));
        c.push(self.accept_mark(s, Verdict::Return), &[]);
        c.push(s.rule().counter().mark_clear(self.marks.all()).build(), &[]);
        self.host_endpoint_policy(
            s,
            &mut c,
            s.rule().ct_status_dnat(true),
            &Layer::Mangle.chain(logical::TO_HOST_ENDPOINT),
            Verdict::Return,
        );
        c.finish()
    }

    /// raw cali-PREROUTING (§7.8)
    fn raw_prerouting(&self, s: &Statics) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Raw.chain(logical::PREROUTING));
        c.push(s.rule().counter().mark_clear(self.marks.all()).build(), &[]);
        if self.cfg.wireguard_host_encryption && self.marks.wireguard != 0 {
            c.push(
                s.rule()
                    .counter()
                    .jump(&Layer::Raw.chain(logical::WIREGUARD_INCOMING_MARK))
                    .build(),
                &[],
            );
        }
        self.untrack_vxlan(s, &mut c);
        for p in &s.prefixes {
            c.push(
                s.rule()
                    .iifname(p)
                    .counter()
                    .mark_set_or(self.marks.scratch0)
                    .build(),
                &[],
            );
        }
        c.push(
            s.rule()
                .mark_has(self.marks.scratch0)
                .counter()
                .jump(&Layer::Raw.chain(logical::RPF_SKIP))
                .build(),
            &[],
        );
        c.push(
            self.deny(
                s.rule()
                    .mark_has(self.marks.scratch0)
                    .fib_rpf_missing()
                    .counter(),
                Layer::Raw,
            )
            .build(),
            &["Strict reverse-path check for workloads"],
        );
        c.push(
            s.rule()
                .mark_lacks(self.marks.scratch0)
                .counter()
                .jump(&Layer::Raw.chain(logical::FROM_HOST_ENDPOINT))
                .build(),
            &[],
        );
        c.push(self.accept_mark(s, Verdict::Accept), &[]);
        c.finish()
    }

    /// raw cali-wireguard-incoming-mark (wireguard.md §2.11), while WireGuard is on: packets
    /// that did not come through WireGuard, from a workload or from this host get WireGuard's
    /// mark, so that (with `src_valid_mark`) their reverse-path check skips WireGuard's table.
    fn raw_wireguard_incoming_mark(&self, s: &Statics) -> Option<TextChain> {
        if self.marks.wireguard == 0 {
            return None;
        }
        let mut c = ChainBuilder::new(&Layer::Raw.chain(logical::WIREGUARD_INCOMING_MARK));
        let skip = std::iter::once("lo")
            .chain(self.cfg.wireguard_ifaces.iter().map(String::as_str))
            .chain(s.prefixes.iter().map(String::as_str));
        for iface in skip {
            c.push(s.rule().iifname(iface).counter().ret().build(), &[]);
        }
        c.push(
            s.rule().counter().mark_set_or(self.marks.wireguard).build(),
            &[],
        );
        Some(c.finish())
    }

    /// VXLAN uses other source ports each way, so tracking it would only make unreplied flows
    /// (§7.8, §7.9): untracked when VXLAN is on.
    fn untrack_vxlan(&self, s: &Statics, c: &mut ChainBuilder) {
        if s.vxlan {
            c.push(
                s.udp_dport(self.cfg.vxlan_port).counter().notrack().build(),
                &[],
            );
        }
    }

    /// raw cali-OUTPUT (§7.9)
    fn raw_output(&self, s: &Statics) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Raw.chain(logical::OUTPUT));
        c.push(s.rule().counter().mark_clear(self.marks.all()).build(), &[]);
        c.push(
            s.rule()
                .counter()
                .jump(&Layer::Raw.chain(logical::TO_HOST_ENDPOINT))
                .build(),
            &[],
        );
        self.untrack_vxlan(s, &mut c);
        c.push(self.accept_mark(s, Verdict::Accept), &[]);
        c.finish()
    }

    /// nat cali-PREROUTING / cali-OUTPUT / cali-POSTROUTING (§7.11)
    fn nat(&self, s: &Statics) -> Vec<TextChain> {
        let mut out = Vec::new();
        for name in [logical::PREROUTING, logical::OUTPUT] {
            let mut c = ChainBuilder::new(&Layer::Nat.chain(name));
            c.push(
                s.rule()
                    .counter()
                    .jump(&Layer::Nat.chain(logical::FIP_DNAT))
                    .build(),
                &[],
            );
            out.push(c.finish());
        }
        let mut c = ChainBuilder::new(&Layer::Nat.chain(logical::POSTROUTING));
        c.push(
            s.rule()
                .counter()
                .jump(&Layer::Nat.chain(logical::FIP_SNAT))
                .build(),
            &[],
        );
        c.push(
            s.rule()
                .counter()
                .jump(&Layer::Nat.chain(logical::NAT_OUTGOING))
                .build(),
            &[],
        );
        let tunnels = if s.v6 {
            &self.cfg.tunnel_ifaces_v6
        } else {
            &self.cfg.tunnel_ifaces_v4
        };
        for t in tunnels {
            let src_local = |b: RuleBuilder| {
                b.fib_saddr_oif_type_local(true)
                    .fib_addr_type_local(Dir::Src, false)
            };
            let wireguard = self.cfg.wireguard_ifaces.contains(t);
            if t.starts_with("vxlan") || (wireguard && s.vxlan) {
                // Keep the source port off the VXLAN port (calico#12244): the wider side of
                // [1024, 65535] around it.
                let p = self.cfg.vxlan_port;
                let range = if u32::from(p).saturating_sub(1024) > 65535 - u32::from(p) {
                    (1024, p.saturating_sub(1))
                } else {
                    (p.saturating_add(1), 65535)
                };
                c.push(
                    src_local(s.rule().oifname(t).l4proto(17))
                        .counter()
                        .masquerade(Some(range), self.cfg.masq_fully_random)
                        .build(),
                    &["Masquerade non-tunnel sources leaving the tunnel"],
                );
            }
            c.push(
                src_local(s.rule().oifname(t))
                    .counter()
                    .masquerade(None, self.cfg.masq_fully_random)
                    .build(),
                &["Masquerade non-tunnel sources leaving the tunnel"],
            );
        }
        out.push(c.finish());
        out
    }

    /// `raw-cali-rpf-skip`: per workload, the source prefixes it may spoof (§7.8, §14.1).
    pub fn rpf_skip_chain<'a>(
        &self,
        family: Family,
        workloads: impl IntoIterator<Item = &'a WorkloadEndpoint>,
    ) -> TextChain {
        let mut c = ChainBuilder::new(&Layer::Raw.chain(logical::RPF_SKIP));
        let v6 = fam_v6(family);
        for wep in workloads {
            let mut nets: Vec<IpNet> = wep
                .allow_spoofed_source_prefixes
                .iter()
                .filter_map(|s| s.parse::<IpNet>().ok().map(|n| n.trunc()))
                .filter(|n| matches!(n, IpNet::V6(_)) == v6)
                .collect();
            nets.sort();
            nets.dedup();
            for n in nets {
                c.push(
                    RuleBuilder::new(family)
                        .iifname(&wep.name)
                        .addr(Dir::Src, n, false)
                        .counter()
                        .accept()
                        .build(),
                    &[],
                );
            }
        }
        c.finish()
    }

    /// `nat-cali-nat-outgoing` (§7.11): empty unless a pool of this family masquerades.
    pub fn nat_outgoing_chain<'a>(
        &self,
        family: Family,
        pools: impl IntoIterator<Item = &'a IpamPool>,
    ) -> TextChain {
        let cfg = &self.cfg;
        let v6 = fam_v6(family);
        let mut c = ChainBuilder::new(&Layer::Nat.chain(logical::NAT_OUTGOING));
        let any_masq = pools.into_iter().any(|p| {
            p.masquerade
                && p.cidr
                    .parse::<IpNet>()
                    .is_ok_and(|n| matches!(n, IpNet::V6(_)) == v6)
        });
        if !any_masq {
            return c.finish();
        }
        let base = || {
            let mut b = RuleBuilder::new(family)
                .saddr_in_set(&ipset_name(family, internal_sets::MASQ_IPAM_POOLS))
                .addr_in_set(
                    Dir::Dst,
                    &ipset_name(family, internal_sets::NETWORK_IP_POOLS),
                    true,
                );
            if cfg.nat_outgoing_exclusions == NatOutgoingExclusions::IpPoolsAndHostIps {
                b = b.addr_in_set(
                    Dir::Dst,
                    &ipset_name(family, internal_sets::ALL_HOSTS_NET),
                    true,
                );
            }
            if let Some(i) = &cfg.nat_outgoing_iface_filter {
                b = b.oifname(&i.replace('+', "*"));
            }
            b
        };
        let snat_addr = if v6 {
            None
        } else {
            cfg.nat_outgoing_address.map(IpAddr::V4)
        };
        let nat = |b: RuleBuilder, ports: Option<(u16, u16)>| match snat_addr {
            Some(a) => b.snat(a, ports),
            None => b.masquerade(ports, cfg.masq_fully_random),
        };
        let comment = ["Masquerade traffic leaving the IP pools"];
        match cfg.nat_port_range {
            Some(range) => {
                for proto in [6u8, 17] {
                    c.push(
                        nat(base().l4proto(proto).counter(), Some(range)).build(),
                        &comment,
                    );
                    c.push(base().l4proto(proto).counter().ret().build(), &[]);
                }
                c.push(nat(base().counter(), None).build(), &comment);
            }
            None => c.push(nat(base().counter(), None).build(), &comment),
        }
        c.finish()
    }

    /// `nat-cali-fip-dnat` and `nat-cali-fip-snat` from the endpoints' NAT infos (§7.11):
    /// per external IP (sorted) DNAT to the lowest internal IP claiming it; per internal IP a
    /// hairpin SNAT back to its external IP.
    pub fn floating_ip_chains(&self, family: Family, nats: &[NatInfo]) -> Vec<TextChain> {
        let v6 = fam_v6(family);
        let mut pairs: Vec<(IpAddr, IpAddr)> = nats
            .iter()
            .filter_map(|n| {
                let ext = n.ext_ip.parse::<IpAddr>().ok()?;
                let int = n.int_ip.parse::<IpAddr>().ok()?;
                (ext.is_ipv6() == v6 && int.is_ipv6() == v6).then_some((ext, int))
            })
            .collect();
        pairs.sort();
        pairs.dedup_by(|b, a| a.0 == b.0); // lowest internal IP wins for each external IP
        let mut dnat = ChainBuilder::new(&Layer::Nat.chain(logical::FIP_DNAT));
        for (ext, int) in &pairs {
            dnat.push(
                RuleBuilder::new(family)
                    .addr(Dir::Dst, IpNet::from(*ext), false)
                    .counter()
                    .dnat(*int)
                    .build(),
                &[],
            );
        }
        let mut by_int: Vec<(IpAddr, IpAddr)> = pairs.iter().map(|(e, i)| (*i, *e)).collect();
        by_int.sort();
        by_int.dedup_by(|b, a| a.0 == b.0);
        let mut snat = ChainBuilder::new(&Layer::Nat.chain(logical::FIP_SNAT));
        for (int, ext) in &by_int {
            snat.push(
                RuleBuilder::new(family)
                    .addr(Dir::Src, IpNet::from(*int), false)
                    .addr(Dir::Dst, IpNet::from(*int), false)
                    .counter()
                    .snat(*ext, None)
                    .build(),
                &[],
            );
        }
        vec![dnat.finish(), snat.finish()]
    }

    /// `filter-cali-cidr-block` (§7.11): traffic to service CIDRs of this family is dropped
    /// or rejected per `ServiceLoopPrevention`; empty when disabled.
    pub fn cidr_block_chain(&self, family: Family, service_cidrs: &[String]) -> TextChain {
        let v6 = fam_v6(family);
        let mut c = ChainBuilder::new(&Layer::Filter.chain(logical::CIDR_BLOCK));
        if self.cfg.service_loop_prevention == ServiceLoopPrevention::Disabled {
            return c.finish();
        }
        let mut nets: Vec<IpNet> = service_cidrs
            .iter()
            .filter_map(|s| s.parse::<IpNet>().ok().map(|n| n.trunc()))
            .filter(|n| matches!(n, IpNet::V6(_)) == v6)
            .collect();
        nets.sort();
        nets.dedup();
        for n in nets {
            let b = RuleBuilder::new(family).addr(Dir::Dst, n, false).counter();
            let b = match self.cfg.service_loop_prevention {
                ServiceLoopPrevention::Reject => b.reject(),
                _ => b.drop_(),
            };
            c.push(
                b.build(),
                &["Block traffic to service CIDR that would loop"],
            );
        }
        c.finish()
    }
}
