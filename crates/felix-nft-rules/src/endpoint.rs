//! Endpoint chains (§8.1–8.2) and their dispatch (§6.5): workload `tw`/`fw`, host
//! endpoint `th`/`fh` in filter, mangle (pre-DNAT and DNAT'ed egress) and raw (untracked),
//! apply-on-forward `thfw`/`fhfw`; the `ifname : verdict` map elements that reach them.

use std::collections::HashMap;

use crate::config::AllowAction;
use crate::names::{
    endpoint_chain, is_staged, logical, policy_chain, profile_chain, rename_chain,
    shared_endpoint_chain, ChainBuilder, Direction, EndpointChain, Layer,
};
use crate::{nflog, Renderer};
use felix_api::types::{HostEndpoint, PolicyId, TierInfo, WorkloadEndpoint};
use nf_tables::build::{ifname_verdict_element, Iface, RuleBuilder, TextChain};
use nf_tables::model::{ct_state, Chain, Element, Family, Verdict};

/// Whether a policy has no rule in the family being rendered, in a direction (see
/// [`crate::policy::renders_nothing`]). Its chain is not rendered, and a jump to it
/// would change nothing (it sets no mark bit, and the accept bit is clear wherever a jump
/// stands), so an endpoint chain leaves the jump and its returns out; the tier around it stays,
/// with its end-of-tier deny. A policy not received yet is never one: its stand-in denies.
pub type NoopPolicy<'a> = &'a dyn Fn(&PolicyId, Direction) -> bool;

/// Every policy has rules: every jump is rendered.
pub fn no_noop_policies(_: &PolicyId, _: Direction) -> bool {
    false
}

/// How an endpoint chain is used (Felix's chain types, §8.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointKind {
    /// filter (and mangle egress): conntrack prologue, end-of-tier deny, profiles, final deny.
    Normal,
    /// raw: no conntrack; accepted packets are also `notrack`ed; no end-of-tier deny.
    Untracked,
    /// mangle PREROUTING: no end-of-tier deny, no profiles.
    PreDnat,
    /// apply-on-forward: end-of-tier deny, no profiles, allow when there are no tiers.
    Forward,
}

/// Everything the endpoint chain template needs.
#[derive(Clone, Debug)]
pub struct EndpointChainSpec<'a> {
    /// Full chain name (`filter-cali-tw-s.<content hash>` for a shared workload chain,
    /// `filter-cali-tw-cali123` for one per interface).
    pub name: String,
    /// The layer the chain and the policy/profile chains it jumps to live in.
    pub layer: Layer,
    /// How the chain is used.
    pub kind: EndpointKind,
    /// Which policies of each tier apply, and which profile chain (`pri`/`pro`).
    pub dir: Direction,
    /// The endpoint's tiers, in order.
    pub tiers: &'a [TierInfo],
    /// The endpoint's profiles, in order (normal chains only).
    pub profiles: &'a [String],
    /// The failsafe chain to jump to first (host endpoints only).
    pub failsafe: Option<String>,
    /// Admin state; a down endpoint's chain is one deny.
    pub admin_up: bool,
    /// What the conntrack prologue does with established traffic.
    pub allow: AllowAction,
    /// Workload egress: drop VXLAN/IPIP from the workload unless configured otherwise.
    pub workload_egress: bool,
    /// QoS packet-rate limit (packets per second, burst); excess is dropped.
    pub packet_rate: Option<(u64, u32)>,
    /// QoS connection limit; TCP connections beyond it are reset.
    pub max_connections: Option<u32>,
    /// Mark bits the terminal established-accept clears: the side table's hand-off bits for a
    /// workload chain in the side table (so main does not resume after it), else 0.
    pub side_exit: u32,
}

/// The (interface key, chain) pairs of a workload dispatch map of `table`.
/// Where a workload interface is dispatched in a table, and what its dispatch elements counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dispatched<'t> {
    /// Its `tw` chain (traffic to the workload).
    pub to: Option<&'t str>,
    /// Its `fw` chain (traffic from the workload).
    pub from: Option<&'t str>,
    /// What its `filter-cali-to-wl-dispatch` element counted (none without per-element counters).
    pub to_traffic: Option<Traffic>,
    /// What its `filter-cali-from-wl-dispatch` element counted.
    pub from_traffic: Option<Traffic>,
}

/// Packets and bytes a dispatch-map element counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
}

/// The workload dispatch map of one direction (`to`: traffic to the workloads).
fn dispatch_map(table: &nf_tables::model::Table, to: bool) -> Option<&nf_tables::model::Set> {
    let map = Layer::Filter.chain(if to {
        logical::TO_WL_DISPATCH
    } else {
        logical::FROM_WL_DISPATCH
    });
    table.sets.get(&map)
}

fn dispatch_targets(
    table: &nf_tables::model::Table,
    to: bool,
) -> impl Iterator<Item = (&nf_tables::model::ElemKey, &str)> {
    dispatch_map(table, to)
        .into_iter()
        .flat_map(|s| &s.elements)
        .filter_map(|e| match e.data.as_deref() {
            Some(nf_tables::model::ElemData::Verdict(Verdict::Goto(c) | Verdict::Jump(c))) => {
                Some((&e.key, c.as_str()))
            }
            _ => None,
        })
}

/// The policies of a tier in one direction, staged ones left out.
pub fn tier_policies(tier: &TierInfo, dir: Direction) -> impl Iterator<Item = &PolicyId> {
    let list = match dir {
        Direction::Inbound => &tier.ingress_policies,
        Direction::Outbound => &tier.egress_policies,
    };
    list.iter().filter(|p| !is_staged(p))
}

pub(crate) fn allow_verdict(a: AllowAction) -> Verdict {
    match a {
        AllowAction::Accept => Verdict::Accept,
        AllowAction::Return => Verdict::Return,
    }
}

/// Endpoint chain bodies rendered in one pass of the renderer, by everything that shapes them
/// ([`Body`], per family). At 1,000 endpoints the bench's 2,000 workload chains have 250
/// distinct bodies.
#[derive(Default)]
pub struct ChainBodies<'a>(HashMap<(Family, Body<'a>), TextChain, foldhash::fast::RandomState>);

/// All of an [`EndpointChainSpec`] but the chain's name: what makes two endpoint chains differ
/// only in their name and rule ids. Of each tier, what the body reads in the spec's direction
/// (the other direction's policies do not make two bodies differ), without the policies that
/// have no rule in the family ([`NoopPolicy`]): bodies that differ only in those are one.
#[derive(PartialEq, Eq)]
pub struct Body<'a> {
    layer: Layer,
    kind: EndpointKind,
    dir: Direction,
    tiers: Vec<(&'a str, &'a str, Vec<&'a PolicyId>)>,
    /// The tiers whose every policy in the direction has no rule in the family: rendered (their
    /// end-of-tier deny stands), unlike a tier without policies in the direction.
    emptied: Vec<usize>,
    profiles: &'a [String],
    failsafe: Option<String>,
    admin_up: bool,
    allow: AllowAction,
    workload_egress: bool,
    packet_rate: Option<(u64, u32)>,
    max_connections: Option<u32>,
    side_exit: u32,
}

/// As `derive(Hash)` would, but `emptied` only when a tier was emptied: the digest, and so the
/// shared chain's name, of a body without such tiers does not depend on that field existing.
impl std::hash::Hash for Body<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let Body {
            layer,
            kind,
            dir,
            tiers,
            emptied,
            profiles,
            failsafe,
            admin_up,
            allow,
            workload_egress,
            packet_rate,
            max_connections,
            side_exit,
        } = self;
        layer.hash(h);
        kind.hash(h);
        dir.hash(h);
        tiers.hash(h);
        profiles.hash(h);
        failsafe.hash(h);
        admin_up.hash(h);
        allow.hash(h);
        workload_egress.hash(h);
        packet_rate.hash(h);
        max_connections.hash(h);
        side_exit.hash(h);
        if !emptied.is_empty() {
            emptied.hash(h);
        }
    }
}

impl<'a> Body<'a> {
    fn of(spec: &EndpointChainSpec<'a>, noop: NoopPolicy) -> Body<'a> {
        // Every field named: a field added to the spec must be placed here or ignored here.
        let EndpointChainSpec {
            name: _,
            layer,
            kind,
            dir,
            tiers,
            profiles,
            failsafe,
            admin_up,
            allow,
            workload_egress,
            packet_rate,
            max_connections,
            side_exit,
        } = spec;
        let mut emptied = Vec::new();
        let tiers = tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut policies: Vec<&PolicyId> = tier_policies(t, *dir).collect();
                let had = !policies.is_empty();
                // A down endpoint's chain is one deny: its body (and name) does not follow its
                // policies' rules, nor does it reference them.
                if *admin_up {
                    policies.retain(|id| !noop(id, *dir));
                }
                if had && policies.is_empty() {
                    emptied.push(i);
                }
                (t.name.as_str(), t.default_action.as_str(), policies)
            })
            .collect();
        Body {
            layer: *layer,
            kind: *kind,
            dir: *dir,
            tiers,
            emptied,
            profiles,
            failsafe: failsafe.clone(),
            admin_up: *admin_up,
            allow: *allow,
            workload_egress: *workload_egress,
            packet_rate: *packet_rate,
            max_connections: *max_connections,
            side_exit: *side_exit,
        }
    }

    /// A digest of the body, the same in every process of this build: the name of the chain
    /// every endpoint with this body shares. Fed through `Hash` (lengths before lists, a
    /// terminator after strings), so two different bodies never feed the same bytes.
    fn digest(&self) -> [u8; 28] {
        use sha2::Digest;
        use std::hash::{Hash, Hasher};
        struct Feed(sha2::Sha224);
        impl Hasher for Feed {
            fn write(&mut self, bytes: &[u8]) {
                self.0.update(bytes);
            }
            fn finish(&self) -> u64 {
                0
            }
        }
        let mut f = Feed(sha2::Sha224::new());
        self.hash(&mut f);
        f.0.finalize().into()
    }
}

impl Renderer {
    /// Felix's one endpoint-chain template (§8.1): its parts in order, each pushed by the
    /// function named after it.
    pub fn endpoint_chain(
        &self,
        family: Family,
        spec: &EndpointChainSpec,
        noop: NoopPolicy,
    ) -> TextChain {
        let mut c = ChainBuilder::new(&spec.name);
        if !spec.admin_up {
            self.admin_down(family, spec, &mut c);
            return c.finish();
        }
        self.packet_rate_limit(family, spec, &mut c);
        if spec.kind != EndpointKind::Untracked {
            self.conntrack_prologue(family, spec, &mut c);
        }
        self.connection_limit(family, spec, &mut c);
        self.failsafe_jump(family, spec, &mut c);
        self.clean_verdict(family, &mut c);
        if spec.workload_egress {
            self.workload_encap_drops(family, spec, &mut c);
        }
        let any_tier = self.tiers(family, spec, noop, &mut c);
        if spec.kind == EndpointKind::Forward && !any_tier {
            self.forward_default_allow(family, &mut c);
        }
        if spec.kind == EndpointKind::Normal {
            self.profiles_then_deny(family, spec, &mut c);
        }
        c.finish()
    }

    /// Admin down: the chain is a single deny.
    fn admin_down(&self, family: Family, spec: &EndpointChainSpec, c: &mut ChainBuilder) {
        c.push(
            self.deny(RuleBuilder::new(family).counter(), spec.layer)
                .build(),
            &["Endpoint admin disabled"],
        );
    }

    /// The QoS packet-rate limit, if any.
    fn packet_rate_limit(&self, family: Family, spec: &EndpointChainSpec, c: &mut ChainBuilder) {
        if let Some((rate, burst)) = spec.packet_rate {
            c.push(
                RuleBuilder::new(family)
                    .limit(rate, 1, burst, true)
                    .counter()
                    .drop_()
                    .build(),
                &["Drop packets over the QoS packet rate"],
            );
        }
    }

    /// The conntrack prologue of a tracked chain: established traffic allowed, invalid denied.
    fn conntrack_prologue(&self, family: Family, spec: &EndpointChainSpec, c: &mut ChainBuilder) {
        let r = || RuleBuilder::new(family);
        let est = ct_state::ESTABLISHED | ct_state::RELATED;
        if spec.allow != AllowAction::Accept {
            c.push(
                r().ct_state(est)
                    .counter()
                    .mark_set_or(self.marks.accept)
                    .build(),
                &[],
            );
        }
        let b = r().ct_state(est).counter();
        let b = if spec.side_exit != 0 && spec.allow == AllowAction::Accept {
            b.mark_clear(spec.side_exit)
        } else {
            b
        };
        c.push(b.verdict(allow_verdict(spec.allow)).build(), &[]);
        if !self.cfg.disable_conntrack_invalid_check {
            c.push(
                self.deny(r().ct_state(ct_state::INVALID).counter(), spec.layer)
                    .build(),
                &[],
            );
        }
    }

    /// The QoS connection limit, if any.
    fn connection_limit(&self, family: Family, spec: &EndpointChainSpec, c: &mut ChainBuilder) {
        if let Some(n) = spec.max_connections {
            c.push(
                RuleBuilder::new(family)
                    .l4proto(6)
                    .ct_count_over(n)
                    .counter()
                    .reject_tcp_reset()
                    .build(),
                &["Reject connections over the QoS connection limit"],
            );
        }
    }

    /// The jump to the failsafe chain (host endpoints).
    fn failsafe_jump(&self, family: Family, spec: &EndpointChainSpec, c: &mut ChainBuilder) {
        if let Some(fs) = &spec.failsafe {
            c.push(RuleBuilder::new(family).counter().jump(fs).build(), &[]);
        }
    }

    /// Policy starts from a clean verdict: the accept and pass bits cleared.
    fn clean_verdict(&self, family: Family, c: &mut ChainBuilder) {
        c.push(
            RuleBuilder::new(family)
                .counter()
                .mark_clear(self.marks.accept | self.marks.pass)
                .build(),
            &[],
        );
    }

    /// Encapsulated traffic from workloads, denied unless configured otherwise.
    fn workload_encap_drops(&self, family: Family, spec: &EndpointChainSpec, c: &mut ChainBuilder) {
        let r = || RuleBuilder::new(family);
        if !self.cfg.allow_vxlan_from_workloads {
            let port = self.cfg.vxlan_port;
            let vxlan = r()
                .l4proto(17)
                .th_port(nf_tables::build::Dir::Dst, port, port, false)
                .counter();
            c.push(
                self.deny(vxlan, spec.layer).build(),
                &["Drop VXLAN encapped packets originating in workloads"],
            );
        }
        if !self.cfg.allow_ipip_from_workloads {
            c.push(
                self.deny(r().l4proto(4).counter(), spec.layer).build(),
                &["Drop IPinIP encapped packets originating in workloads"],
            );
        }
    }

    /// The tiers in order, each with its policies in the spec's direction; whether any tier
    /// had a policy.
    fn tiers(
        &self,
        family: Family,
        spec: &EndpointChainSpec,
        noop: NoopPolicy,
        c: &mut ChainBuilder,
    ) -> bool {
        let mut any_tier = false;
        for tier in spec.tiers {
            let mut policies: Vec<&PolicyId> = tier_policies(tier, spec.dir).collect();
            if policies.is_empty() {
                continue;
            }
            any_tier = true;
            policies.retain(|id| !noop(id, spec.dir));
            self.tier(family, spec, tier, &policies, c);
        }
        any_tier
    }

    /// One tier: a clean pass bit, a jump to each policy (returning once one accepts), and the
    /// end-of-tier deny where the chain kind and the tier's default action call for it.
    fn tier(
        &self,
        family: Family,
        spec: &EndpointChainSpec,
        tier: &TierInfo,
        policies: &[&PolicyId],
        c: &mut ChainBuilder,
    ) {
        let m = self.marks;
        let r = || RuleBuilder::new(family);
        let start = format!("Start of tier {}", tier.name);
        c.push(r().counter().mark_clear(m.pass).build(), &[&start]);
        for id in policies {
            let target = policy_chain(spec.layer, spec.dir, id);
            c.push(r().mark_lacks(m.pass).counter().jump(&target).build(), &[]);
            if spec.kind == EndpointKind::Untracked {
                c.push(r().mark_has(m.accept).counter().notrack().build(), &[]);
            }
            c.push(
                r().mark_has(m.accept).counter().ret().build(),
                &["Return if policy accepted"],
            );
        }
        let pass_default = tier.default_action.eq_ignore_ascii_case("pass");
        if !matches!(spec.kind, EndpointKind::Normal | EndpointKind::Forward) {
            return;
        }
        // Flow logs see the tier's end: the drop, or with a passing tier what goes on to the next.
        let flow = |b: RuleBuilder, a: nflog::Action| {
            if !self.flow_logs_in(spec.layer) {
                return b;
            }
            let prefix = nflog::end_of_tier(a, spec.dir, &tier.name);
            b.nflog(nflog::group(spec.dir), &prefix, nflog::SNAPLEN)
        };
        if !pass_default {
            let end = format!(
                "End of tier {}. Drop if no policies passed packet",
                tier.name
            );
            let b = flow(r().mark_lacks(m.pass).counter(), nflog::Action::Deny);
            c.push(self.deny(b, spec.layer).build(), &[&end]);
        } else if self.flow_logs_in(spec.layer) {
            let b = flow(r().mark_lacks(m.pass).counter(), nflog::Action::Pass);
            c.push(b.build(), &[&format!("End of tier {}: pass", tier.name)]);
        }
    }

    /// An apply-on-forward chain with no tiers allows by default.
    fn forward_default_allow(&self, family: Family, c: &mut ChainBuilder) {
        c.push(
            RuleBuilder::new(family)
                .counter()
                .mark_set_or(self.marks.accept)
                .ret()
                .build(),
            &["Allow forwarded traffic by default"],
        );
    }

    /// A jump to each profile (returning once one accepts), then the final deny.
    fn profiles_then_deny(&self, family: Family, spec: &EndpointChainSpec, c: &mut ChainBuilder) {
        let r = || RuleBuilder::new(family);
        for p in spec.profiles {
            let target = profile_chain(spec.layer, spec.dir, p);
            c.push(r().counter().jump(&target).build(), &[]);
            c.push(
                r().mark_has(self.marks.accept).counter().ret().build(),
                &["Return if profile accepted"],
            );
        }
        let mut b = r().counter();
        if self.flow_logs_in(spec.layer) {
            let prefix = nflog::no_profile_matched(spec.dir);
            b = b.nflog(nflog::group(spec.dir), &prefix, nflog::SNAPLEN);
        }
        c.push(
            self.deny(b, spec.layer).build(),
            &["Drop if no profiles matched"],
        );
    }

    /// The two filter chains of a workload endpoint: `filter-cali-tw-…` (ingress policy) and
    /// `filter-cali-fw-…` (egress policy), named by their content unless the endpoint has a
    /// QoS limit (then by its interface).
    pub fn workload_chains(
        &self,
        family: Family,
        wep: &WorkloadEndpoint,
        noop: NoopPolicy,
    ) -> Vec<TextChain> {
        self.workload_chains_in(family, wep, false, noop)
    }

    /// [`Renderer::workload_chains`] for the main table (`side` false) or the side table.
    pub fn workload_chains_in(
        &self,
        family: Family,
        wep: &WorkloadEndpoint,
        side: bool,
        noop: NoopPolicy,
    ) -> Vec<TextChain> {
        self.workload_specs(wep, side, noop)
            .iter()
            .map(|s| self.endpoint_chain(family, s, noop))
            .collect()
    }

    /// [`Renderer::workload_chains_in`] without the rule texts, rendering each distinct body
    /// once per `bodies` (one pass of the renderer): an endpoint whose chain would have a body
    /// already rendered under another name gets that body renamed ([`rename_chain`]). `share`
    /// sees each body once, as it is first rendered; the renamed copies hold its expressions.
    pub fn workload_chains_shared<'a>(
        &self,
        family: Family,
        wep: &'a WorkloadEndpoint,
        (side, noop): (bool, NoopPolicy),
        bodies: &mut ChainBodies<'a>,
        share: &mut dyn FnMut(&mut Chain),
    ) -> Vec<Chain> {
        self.workload_specs(wep, side, noop)
            .into_iter()
            .map(|spec| {
                let key = (family, Body::of(&spec, noop));
                match bodies.0.get(&key) {
                    Some(t) => rename_chain(t, &spec.name),
                    None => {
                        let mut t = self.endpoint_chain(family, &spec, noop);
                        share(&mut t.chain);
                        let chain = t.chain.clone();
                        bodies.0.insert(key, t);
                        chain
                    }
                }
            })
            .collect()
    }

    /// The specs of a workload's `tw` and `fw` chains in the family `noop` is of.
    fn workload_specs<'a>(
        &self,
        wep: &'a WorkloadEndpoint,
        side: bool,
        noop: NoopPolicy,
    ) -> [EndpointChainSpec<'a>; 2] {
        let admin_up = wep.state == "active";
        let qos = wep.qos_controls.clone().unwrap_or_default();
        // Rate 0–10000 packets/s, burst 1–10000 (Felix's bounds); 0 means "no limit".
        let rate = |rate: i64, burst: i64| {
            (rate > 0).then(|| {
                let burst = if burst > 0 { burst.min(10_000) } else { 5 };
                (rate.min(10_000) as u64, burst as u32)
            })
        };
        let conns = |n: i64| (n > 0).then(|| n.min(i64::from(u32::MAX)) as u32);
        let mk = |kind: EndpointChain, dir: Direction| EndpointChainSpec {
            name: endpoint_chain(Layer::Filter, kind, &wep.name),
            layer: Layer::Filter,
            kind: EndpointKind::Normal,
            dir,
            tiers: &wep.tiers,
            profiles: &wep.profile_ids,
            failsafe: None,
            admin_up,
            allow: self.cfg.filter_allow_action,
            workload_egress: kind == EndpointChain::FromWorkload,
            packet_rate: match dir {
                Direction::Inbound => rate(qos.ingress_packet_rate, qos.ingress_packet_burst),
                Direction::Outbound => rate(qos.egress_packet_rate, qos.egress_packet_burst),
            },
            max_connections: match dir {
                Direction::Inbound => conns(qos.ingress_max_connections),
                Direction::Outbound => conns(qos.egress_max_connections),
            },
            side_exit: if side {
                self.marks.side_from | self.marks.side_to
            } else {
                0
            },
        };
        [
            mk(EndpointChain::ToWorkload, Direction::Inbound),
            mk(EndpointChain::FromWorkload, Direction::Outbound),
        ]
        .map(|mut spec| {
            // Equal bodies are one chain, named by its content; a body with per-endpoint state
            // (a QoS rate or connection limit) stays the endpoint's own: sharing a limiter would
            // change what it limits.
            if spec.packet_rate.is_none() && spec.max_connections.is_none() {
                let kind = if spec.workload_egress {
                    EndpointChain::FromWorkload
                } else {
                    EndpointChain::ToWorkload
                };
                let digest = Body::of(&spec, noop).digest();
                spec.name = shared_endpoint_chain(spec.layer, kind, &digest);
            }
            spec
        })
    }

    /// The dispatch-map elements of a workload interface: (`filter-cali-from-wl-dispatch`
    /// element, `filter-cali-to-wl-dispatch` element), each a goto to the endpoint's chain in the
    /// main table (`side` false) or the side table of the family `noop` is of (a shared chain's
    /// name depends on the family when a policy has no rule in it).
    pub fn workload_dispatch_elements(
        &self,
        iface: &str,
        wep: &WorkloadEndpoint,
        (side, noop): (bool, NoopPolicy),
    ) -> (Element, Element) {
        let [to, from] = self.workload_specs(wep, side, noop);
        (
            ifname_verdict_element(iface, Verdict::Goto(from.name)),
            ifname_verdict_element(iface, Verdict::Goto(to.name)),
        )
    }

    /// The chain a workload interface is dispatched to in `table` (its `tw` chain with `to`,
    /// else its `fw` chain), read from the table's dispatch map: endpoint chains are shared by
    /// content, so an interface's chain is found through the map, not by its name.
    pub fn workload_chain_of<'t>(
        table: &'t nf_tables::model::Table,
        iface: &str,
        to: bool,
    ) -> Option<&'t str> {
        let key = nf_tables::build::ifname_key(iface);
        dispatch_targets(table, to)
            .find(|(k, _)| **k == key)
            .map(|(_, c)| c)
    }

    /// Every workload interface dispatched in `table`: its `tw` and `fw` chains, and what its
    /// dispatch elements counted (the chains may be shared; the elements are its own).
    pub fn dispatched_workloads(
        table: &nf_tables::model::Table,
    ) -> std::collections::BTreeMap<String, Dispatched<'_>> {
        let mut out = std::collections::BTreeMap::<String, Dispatched<'_>>::new();
        for to in [true, false] {
            let counters: std::collections::HashMap<&[u8], Traffic> = dispatch_map(table, to)
                .into_iter()
                .flat_map(|s| &s.counters.0)
                .filter(|c| c.flags == 0)
                .map(|c| {
                    let t = Traffic {
                        packets: c.packets,
                        bytes: c.bytes,
                    };
                    (c.key.as_slice(), t)
                })
                .collect();
            for (key, chain) in dispatch_targets(table, to) {
                let end = key.iter().position(|&b| b == 0).unwrap_or(key.len());
                let iface = String::from_utf8_lossy(&key[..end]).into_owned();
                let e = out.entry(iface).or_default();
                let counted = counters.get(key.as_slice()).copied();
                if to {
                    (e.to, e.to_traffic) = (Some(chain), counted);
                } else {
                    (e.from, e.from_traffic) = (Some(chain), counted);
                }
            }
        }
        out
    }

    /// All chains of a host endpoint resolved to `iface` (`*` for the all-interfaces one):
    /// filter `th`/`fh`/`thfw`/`fhfw`, mangle `th` (and `fh` with pre-DNAT tiers), raw
    /// `th`/`fh` with untracked tiers (never for `*`).
    pub fn host_endpoint_chains(
        &self,
        family: Family,
        iface: &str,
        hep: &HostEndpoint,
        noop: NoopPolicy,
    ) -> Vec<TextChain> {
        // Each chain's direction and failsafe follow from which chain it is, and its policies
        // from its kind.
        let spec = |layer: Layer, kind: EndpointKind, which: EndpointChain, allow| {
            let (dir, failsafe) = match which {
                EndpointChain::ToHost
                | EndpointChain::ToHostForward
                | EndpointChain::FromWorkload => (Direction::Outbound, logical::FAILSAFE_OUT),
                EndpointChain::FromHost
                | EndpointChain::FromHostForward
                | EndpointChain::ToWorkload => (Direction::Inbound, logical::FAILSAFE_IN),
            };
            let none: &[String] = &[];
            let (tiers, profiles) = match kind {
                EndpointKind::Normal => (&hep.tiers[..], &hep.profile_ids[..]),
                EndpointKind::Forward => (&hep.forward_tiers[..], none),
                EndpointKind::PreDnat => (&hep.pre_dnat_tiers[..], none),
                EndpointKind::Untracked => (&hep.untracked_tiers[..], none),
            };
            EndpointChainSpec {
                name: endpoint_chain(layer, which, iface),
                layer,
                kind,
                dir,
                tiers,
                profiles,
                failsafe: (kind != EndpointKind::Forward).then(|| layer.chain(failsafe)),
                admin_up: true,
                allow,
                workload_egress: false,
                packet_rate: None,
                max_connections: None,
                side_exit: 0,
            }
        };
        let fa = self.cfg.filter_allow_action;
        let mut specs = vec![
            spec(
                Layer::Filter,
                EndpointKind::Normal,
                EndpointChain::ToHost,
                fa,
            ),
            spec(
                Layer::Filter,
                EndpointKind::Normal,
                EndpointChain::FromHost,
                fa,
            ),
            spec(
                Layer::Filter,
                EndpointKind::Forward,
                EndpointChain::ToHostForward,
                fa,
            ),
            spec(
                Layer::Filter,
                EndpointKind::Forward,
                EndpointChain::FromHostForward,
                fa,
            ),
            spec(
                Layer::Mangle,
                EndpointKind::Normal,
                EndpointChain::ToHost,
                AllowAction::Return,
            ),
        ];
        if !hep.pre_dnat_tiers.is_empty() {
            specs.push(spec(
                Layer::Mangle,
                EndpointKind::PreDnat,
                EndpointChain::FromHost,
                self.cfg.mangle_allow_action,
            ));
        }
        if !hep.untracked_tiers.is_empty() && iface != "*" {
            for which in [EndpointChain::ToHost, EndpointChain::FromHost] {
                specs.push(spec(
                    Layer::Raw,
                    EndpointKind::Untracked,
                    which,
                    AllowAction::Accept,
                ));
            }
        }
        specs
            .iter()
            .map(|s| self.endpoint_chain(family, s, noop))
            .collect()
    }

    /// The dispatch-map elements of a host endpoint on a real interface: `(map name, element)`
    /// pairs. The `*` endpoint has none: it is the fallback of [`Renderer::host_dispatch_chains`].
    pub fn host_dispatch_elements(
        &self,
        iface: &str,
        hep: &HostEndpoint,
    ) -> Vec<(String, Element)> {
        if iface == "*" {
            return Vec::new();
        }
        let el = |layer: Layer, kind| {
            ifname_verdict_element(iface, Verdict::Goto(endpoint_chain(layer, kind, iface)))
        };
        let mut out = vec![
            (
                Layer::Filter.chain(logical::FROM_HOST_ENDPOINT),
                el(Layer::Filter, EndpointChain::FromHost),
            ),
            (
                Layer::Filter.chain(logical::TO_HOST_ENDPOINT),
                el(Layer::Filter, EndpointChain::ToHost),
            ),
            (
                Layer::Filter.chain(logical::FROM_HEP_FORWARD),
                el(Layer::Filter, EndpointChain::FromHostForward),
            ),
            (
                Layer::Filter.chain(logical::TO_HEP_FORWARD),
                el(Layer::Filter, EndpointChain::ToHostForward),
            ),
            (
                Layer::Mangle.chain(logical::TO_HOST_ENDPOINT),
                el(Layer::Mangle, EndpointChain::ToHost),
            ),
        ];
        if !hep.pre_dnat_tiers.is_empty() {
            out.push((
                Layer::Mangle.chain(logical::FROM_HOST_ENDPOINT),
                el(Layer::Mangle, EndpointChain::FromHost),
            ));
        }
        if !hep.untracked_tiers.is_empty() {
            out.push((
                Layer::Raw.chain(logical::FROM_HOST_ENDPOINT),
                el(Layer::Raw, EndpointChain::FromHost),
            ));
            out.push((
                Layer::Raw.chain(logical::TO_HOST_ENDPOINT),
                el(Layer::Raw, EndpointChain::ToHost),
            ));
        }
        out
    }

    /// The host-endpoint dispatch chains: one `iifname|oifname vmap @<same name>` lookup each,
    /// then, when an all-interfaces (`*`) endpoint exists, a `goto` to its chain as the
    /// fallback (egress first skipping traffic to local workloads). Without `*`, unmatched
    /// traffic returns: it is not a host endpoint's.
    pub fn host_dispatch_chains(
        &self,
        family: Family,
        all_interfaces: Option<&HostEndpoint>,
    ) -> Vec<TextChain> {
        let r = || RuleBuilder::new(family);
        let entries = [
            (
                Layer::Filter,
                logical::FROM_HOST_ENDPOINT,
                Iface::In,
                Some(EndpointChain::FromHost),
                false,
            ),
            (
                Layer::Filter,
                logical::TO_HOST_ENDPOINT,
                Iface::Out,
                Some(EndpointChain::ToHost),
                true,
            ),
            (
                Layer::Filter,
                logical::FROM_HEP_FORWARD,
                Iface::In,
                Some(EndpointChain::FromHostForward),
                false,
            ),
            (
                Layer::Filter,
                logical::TO_HEP_FORWARD,
                Iface::Out,
                Some(EndpointChain::ToHostForward),
                false,
            ),
            (
                Layer::Mangle,
                logical::FROM_HOST_ENDPOINT,
                Iface::In,
                all_interfaces
                    .filter(|h| !h.pre_dnat_tiers.is_empty())
                    .map(|_| EndpointChain::FromHost),
                false,
            ),
            (
                Layer::Mangle,
                logical::TO_HOST_ENDPOINT,
                Iface::Out,
                Some(EndpointChain::ToHost),
                true,
            ),
            (
                Layer::Raw,
                logical::FROM_HOST_ENDPOINT,
                Iface::In,
                None,
                false,
            ),
            (
                Layer::Raw,
                logical::TO_HOST_ENDPOINT,
                Iface::Out,
                None,
                false,
            ),
        ];
        let mut out = Vec::new();
        for (layer, name, which, fallback, skip_workloads) in entries {
            let full = layer.chain(name);
            let mut c = ChainBuilder::new(&full);
            c.push(r().ifname_vmap(which, &full).build(), &[]);
            if let (Some(_), Some(kind)) = (all_interfaces, fallback) {
                if skip_workloads {
                    for p in &self.cfg.workload_iface_prefixes {
                        c.push(
                            r().oifname(&format!("{p}*")).counter().ret().build(),
                            &["Skip egress WHEP policy for traffic to local workload"],
                        );
                    }
                }
                c.push(
                    r().counter()
                        .goto(&endpoint_chain(layer, kind, "*"))
                        .build(),
                    &["Default host endpoint"],
                );
            }
            out.push(c.finish());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RulesConfig;
    use felix_api::types::{QoSControls, TierInfo};

    fn pid(name: &str) -> PolicyId {
        PolicyId {
            name: name.into(),
            ..PolicyId::default()
        }
    }

    fn tiers() -> Vec<TierInfo> {
        vec![
            TierInfo {
                name: "platform".into(),
                ingress_policies: vec![pid("a"), pid("b")],
                egress_policies: vec![pid("c")],
                default_action: "Pass".into(),
            },
            TierInfo {
                name: "app".into(),
                ingress_policies: vec![pid("d")],
                egress_policies: Vec::new(),
                default_action: String::new(),
            },
        ]
    }

    /// A workload's normal filter chain in `dir` with these tiers and profiles.
    fn normal_filter_chain<'a>(
        tiers: &'a [TierInfo],
        profiles: &'a [String],
        dir: Direction,
    ) -> EndpointChainSpec<'a> {
        EndpointChainSpec {
            name: "filter-cali-tw-cali0".into(),
            layer: Layer::Filter,
            kind: EndpointKind::Normal,
            dir,
            tiers,
            profiles,
            failsafe: None,
            admin_up: true,
            allow: AllowAction::Accept,
            workload_egress: false,
            packet_rate: None,
            max_connections: None,
            side_exit: 0,
        }
    }

    /// With flow logs on, each tier's end logs to the direction's NFLOG group: the drop of a
    /// tier that drops, what goes on from a tier that passes; so does the drop after the
    /// profiles. Off, nothing logs to a group.
    #[test]
    fn flow_logs_log_each_tier_s_end_and_the_no_profile_drop() {
        let tiers = tiers();
        let profiles = ["default".to_string()];
        let spec = |dir| normal_filter_chain(&tiers, &profiles, dir);
        let texts = |flow_logs: bool, dir| {
            let r = Renderer::new(RulesConfig {
                flow_logs,
                ..RulesConfig::default()
            })
            .expect("config");
            let c = r.endpoint_chain(Family::Ip, &spec(dir), &no_noop_policies);
            c.texts
                .iter()
                .filter(|t| t.contains(" group "))
                .map(|t| t.split(" comment ").next().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        };
        let ingress = texts(true, Direction::Inbound);
        assert_eq!(ingress.len(), 3, "{ingress:#?}");
        assert!(ingress[0].contains(r#"log prefix "PPI|platform" group 1 snaplen 80"#));
        assert!(!ingress[0].contains("drop"), "{ingress:#?}");
        assert!(ingress[1].ends_with(r#"log prefix "DPI|app" group 1 snaplen 80 drop"#));
        assert!(ingress[2].ends_with(r#"counter log prefix "DRI" group 1 snaplen 80 drop"#));
        let egress = texts(true, Direction::Outbound);
        assert_eq!(egress.len(), 2, "{egress:#?}");
        assert!(egress[0].contains(r#"log prefix "PPE|platform" group 2 snaplen 80"#));
        assert!(egress[1].contains(r#"log prefix "DRE" group 2 snaplen 80 drop"#));
        assert!(texts(false, Direction::Inbound).is_empty());
    }

    /// A policy with no rule in the family loses its jump and its return; its tier keeps its
    /// start and its end-of-tier deny, also when every policy of the tier is such a one.
    #[test]
    fn a_noop_policy_loses_its_jump_and_its_tier_stays() {
        let r = Renderer::new(RulesConfig::default()).expect("default config");
        let tiers = tiers();
        let spec = normal_filter_chain(&tiers, &[], Direction::Inbound);
        let texts = |noop: NoopPolicy| -> Vec<String> {
            let c = r.endpoint_chain(Family::Ip, &spec, noop);
            let comment = |r: &nf_tables::model::Rule| r.comment.clone().unwrap_or_default();
            c.texts
                .iter()
                .zip(&c.chain.rules)
                .map(|(t, r)| format!("{t} # {}", comment(r)))
                .collect()
        };
        let all = texts(&no_noop_policies);
        // "b" (tier platform) and "d" (all of tier app) have no rule.
        let some = texts(&|id: &PolicyId, _| id.name == "b" || id.name == "d");
        let count = |v: &[String], s: &str| v.iter().filter(|t| t.contains(s)).count();
        for (name, want_all, want_some) in [("-pi-", 3, 1), ("Return if policy accepted", 3, 1)] {
            assert_eq!(count(&all, name), want_all, "{all:#?}");
            assert_eq!(count(&some, name), want_some, "{some:#?}");
        }
        let a = policy_chain(Layer::Filter, Direction::Inbound, &pid("a"));
        assert_eq!(count(&some, &a), 1, "{some:#?}");
        for tier in [
            "Start of tier platform",
            "Start of tier app",
            "End of tier app",
        ] {
            assert_eq!(count(&all, tier), 1, "{all:#?}");
            assert_eq!(count(&some, tier), 1, "{some:#?}");
        }
        assert_eq!(all.len() - some.len(), 4);
    }

    /// A body rendered under one name and renamed is exactly the body rendered under the other
    /// name: the same rules and human comments, the rule ids of the new name.
    #[test]
    fn a_renamed_body_is_the_body_rendered_under_that_name() {
        let r = Renderer::new(RulesConfig::default()).expect("default config");
        let (tiers, profiles) = (tiers(), vec!["kns.a".to_string(), "kns.b".to_string()]);
        let base = EndpointChainSpec {
            name: "filter-cali-tw-cali0".into(),
            layer: Layer::Filter,
            kind: EndpointKind::Normal,
            dir: Direction::Inbound,
            tiers: &tiers,
            profiles: &profiles,
            failsafe: None,
            admin_up: true,
            allow: AllowAction::Accept,
            workload_egress: false,
            packet_rate: None,
            max_connections: None,
            side_exit: 0,
        };
        let variants = [
            base.clone(),
            EndpointChainSpec {
                admin_up: false,
                ..base.clone()
            },
            EndpointChainSpec {
                dir: Direction::Outbound,
                workload_egress: true,
                packet_rate: Some((100, 5)),
                max_connections: Some(10),
                side_exit: 0x30,
                ..base.clone()
            },
            EndpointChainSpec {
                layer: Layer::Raw,
                kind: EndpointKind::Untracked,
                failsafe: Some("raw-cali-failsafe-in".into()),
                ..base.clone()
            },
            EndpointChainSpec {
                kind: EndpointKind::Forward,
                tiers: &[],
                allow: AllowAction::Return,
                ..base.clone()
            },
        ];
        for family in [Family::Ip, Family::Ip6] {
            for spec in &variants {
                let other = EndpointChainSpec {
                    name: "filter-cali-tw-cali1".into(),
                    ..spec.clone()
                };
                let want = r.endpoint_chain(family, &other, &no_noop_policies).chain;
                let got = rename_chain(
                    &r.endpoint_chain(family, spec, &no_noop_policies),
                    &other.name,
                );
                assert_eq!(got, want, "{spec:?}");
                assert!(!got.rules.is_empty());
            }
        }
    }

    /// The shared-body path gives what rendering each chain gives, whether a body was already
    /// rendered in the pass or not, and only equal specs share.
    #[test]
    fn shared_bodies_render_what_each_chain_renders() {
        let r = Renderer::new(RulesConfig::default()).expect("default config");
        let wep = |name: &str, tiers: Vec<TierInfo>, state: &str| WorkloadEndpoint {
            name: name.into(),
            state: state.into(),
            tiers,
            profile_ids: vec!["kns.a".into()],
            ..WorkloadEndpoint::default()
        };
        let mut limited = wep("cali3", tiers(), "active");
        limited.qos_controls = Some(QoSControls {
            ingress_packet_rate: 1000,
            ..QoSControls::default()
        });
        let weps = [
            wep("cali0", tiers(), "active"),
            wep("cali1", tiers(), "active"),
            wep("cali2", tiers()[1..].to_vec(), "active"),
            limited,
            wep("cali4", tiers(), "inactive"),
            wep("cali5", tiers(), "active"),
        ];
        let mut bodies = ChainBodies::default();
        for side in [false, true] {
            for w in &weps {
                let want: Vec<Chain> = r
                    .workload_chains_in(Family::Ip, w, side, &no_noop_policies)
                    .into_iter()
                    .map(|c| c.chain)
                    .collect();
                let got = r.workload_chains_shared(
                    Family::Ip,
                    w,
                    (side, &no_noop_policies),
                    &mut bodies,
                    &mut |_| {},
                );
                assert_eq!(got, want);
            }
        }
        // Per table: cali0, 1 and 5 share both bodies; cali2 (one tier) and cali4 (down) have
        // two of their own; cali3's rate limit changes its ingress body only.
        assert_eq!(bodies.0.len(), 2 * (2 + 2 + 2 + 1));
    }
}
