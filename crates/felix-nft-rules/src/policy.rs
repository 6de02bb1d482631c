//! Policy and profile chains (§9): per-family filtering, match clauses in Felix's order,
//! actions with the mark protocol, and the multi-value fields.
//!
//! Multi-value fields never use anonymous sets: they make a large commit superlinear in the
//! kernel (docs/design.md, cost model). A CIDR list or a port list of more than one entry
//! becomes a **shared, content-addressed named set** (`cali4n-…` / `cali4p-…`): the name is a
//! hash of the canonical (sorted, merged) content, so every rule with the same list uses the same
//! set. Felix's scratch-mark blocks (§9.3) remain only where a field is an OR across different
//! kinds of alternatives — ports *or* named-port sets, or several named-port sets — which no
//! single nftables match can express.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use tracing::warn;

use crate::names::{
    ipset_name, is_staged, kind_short, policy_chain, profile_chain, shared_set_name, ChainBuilder,
    Direction, Layer,
};
use crate::{nflog, Renderer, SetBag};
use felix_api::types::{
    protocol::NumberOrName, rule::Icmp, rule::NotIcmp, Policy, PolicyId, PortRange, Profile,
    Protocol, Rule,
};
use nf_tables::build::{self, Dir, RuleBuilder};
use nf_tables::model::{set_flags, DataType, Family, Set, Verdict};

use nf_tables::build::TextChain;

/// Longest log prefix the kernel accepts (`NF_LOG_PREFIXLEN` − 1).
const MAX_LOG_PREFIX: usize = 127;

/// Whether a Felix IP set (by id) has no member of the family being rendered (an unknown set
/// has none). A rule that must match such a set can never match a packet of that family and is
/// left out of its chain; a negated match on it always holds and a named-port alternative on it
/// never does: both are left out of the rule. The set itself is not in that family's tables. The
/// verdicts are the ones of the rule as written; the caller renders the rule again when the set
/// gains a member of the family.
pub type EmptyIpSet<'a> = &'a dyn Fn(&str) -> bool;

/// No IP set counts as empty: every rule is rendered as written.
pub fn no_empty_ipsets(_: &str) -> bool {
    false
}

/// The chains of one policy or profile in one layer, and the shared sets their rules use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyChains {
    /// One chain per requested direction.
    pub chains: Vec<TextChain>,
    /// Content-addressed sets (`cali4n-…`, `cali4p-…`) the rules reference. Felix IP sets
    /// (`cali40…`) are not included: they come from [`Renderer::ipset`].
    pub sets: Vec<Set>,
}

/// What a `%k/%n/%p/%t` log prefix refers to, and whose rules flow logs name.
#[derive(Clone, Debug)]
pub(crate) struct LogCtx {
    pub kind: String,
    pub name: String,
    pub namespace: String,
    pub tier: String,
    /// With flow logs on (and not in the untracked layer): the owner and its id in NFLOG
    /// prefixes.
    pub flow: Option<(nflog::Owner, String)>,
}

/// IP protocol number of a Calico protocol (name or number). In the IPv6 table the name
/// `icmp` means ICMPv6, as Calico's ICMP fields are per family.
pub fn protocol_number(p: &Protocol, family: Family) -> Option<u8> {
    match p.number_or_name.as_ref()? {
        NumberOrName::Number(n) => u8::try_from(*n).ok(),
        NumberOrName::Name(name) => match name.to_ascii_lowercase().as_str() {
            "tcp" => Some(6),
            "udp" => Some(17),
            "sctp" => Some(132),
            "udplite" => Some(136),
            "icmp" if family == Family::Ip6 => Some(58),
            "icmp" => Some(1),
            "icmpv6" | "ipv6-icmp" => Some(58),
            other => other.parse().ok(),
        },
    }
}

fn is_v6(n: &IpNet) -> bool {
    matches!(n, IpNet::V6(_))
}

fn parse_net(s: &str) -> Option<IpNet> {
    if let Ok(n) = s.parse::<IpNet>() {
        return Some(n.trunc());
    }
    s.parse::<IpAddr>().ok().map(IpNet::from)
}

/// The nets of a rule that apply to one family, or `None` when the rule is skipped for this
/// family (§9.1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FamilyNets {
    pub src: Vec<IpNet>,
    pub dst: Vec<IpNet>,
    pub not_src: Vec<IpNet>,
    pub not_dst: Vec<IpNet>,
}

/// An ICMP type (and code) match; the header is ICMPv6 when `v6`.
fn icmp_clause(v6: bool, t: i32, c: Option<i32>, negated: bool) -> Clause {
    Clause::Icmp(
        v6,
        t.clamp(0, 255) as u8,
        c.map(|c| c.clamp(0, 255) as u8),
        negated,
    )
}

pub(crate) fn family_nets(rule: &Rule, family: Family) -> Option<FamilyNets> {
    let v6 = family == Family::Ip6;
    match rule.ip_version {
        4 if v6 => return None,
        6 if !v6 => return None,
        _ => {}
    }
    let mut out = FamilyNets::default();
    for (list, dest, negated) in [
        (&rule.src_net, &mut out.src, false),
        (&rule.dst_net, &mut out.dst, false),
        (&rule.not_src_net, &mut out.not_src, true),
        (&rule.not_dst_net, &mut out.not_dst, true),
    ] {
        if list.is_empty() {
            continue;
        }
        let mut kept: Vec<IpNet> = list
            .iter()
            .filter_map(|s| {
                let n = parse_net(s);
                if n.is_none() {
                    warn!(net = %s, "ignoring unparsable CIDR in policy rule");
                }
                n
            })
            .filter(|n| is_v6(n) == v6)
            .collect();
        if kept.is_empty() {
            return None;
        }
        // A negated catch-all can never match: drop the rule rather than render a
        // contradiction.
        if negated && kept.iter().any(|n| n.prefix_len() == 0) {
            return None;
        }
        kept.sort();
        kept.dedup();
        *dest = kept;
    }
    Some(out)
}

fn port_ranges(list: &[PortRange]) -> Vec<(u16, u16)> {
    let clamp = |v: i32| u16::try_from(v.clamp(0, 65535)).unwrap_or(0);
    let ranges: Vec<(u128, u128)> = list
        .iter()
        .map(|p| {
            let first = clamp(p.first);
            let last = if p.last == 0 { first } else { clamp(p.last) };
            (u128::from(first.min(last)), u128::from(first.max(last)))
        })
        .collect();
    build::merge_ranges(ranges)
        .into_iter()
        .map(|(a, b)| (a as u16, b as u16))
        .collect()
}

/// Every field of a rule that names Felix IP sets (`*_ip_set_ids`).
fn ipset_fields(rule: &Rule) -> [&Vec<String>; 9] {
    [
        &rule.src_ip_set_ids,
        &rule.src_named_port_ip_set_ids,
        &rule.dst_ip_set_ids,
        &rule.dst_ip_port_set_ids,
        &rule.dst_named_port_ip_set_ids,
        &rule.not_src_ip_set_ids,
        &rule.not_src_named_port_ip_set_ids,
        &rule.not_dst_ip_set_ids,
        &rule.not_dst_named_port_ip_set_ids,
    ]
}

/// Adds the Felix IP sets `rules` reference to `out`.
pub fn rules_ipsets<'a>(rules: impl IntoIterator<Item = &'a Rule>, out: &mut BTreeSet<String>) {
    for rule in rules {
        for list in ipset_fields(rule) {
            out.extend(list.iter().cloned());
        }
    }
}

/// The IP set fields every one of whose sets must match (AND): one with no member of the
/// family rendered makes the rule never match (see [`EmptyIpSet`]).
fn must_match_ipsets(rule: &Rule) -> [&Vec<String>; 3] {
    [
        &rule.src_ip_set_ids,
        &rule.dst_ip_set_ids,
        &rule.dst_ip_port_set_ids,
    ]
}

/// Whether `rule` can match no packet of the family rendered because of its IP sets (see
/// [`EmptyIpSet`]): every positive set match must hold, and one on a set with no member of the
/// family never does; so must one port alternative, and named-port sets alone, none with a
/// member of the family, match nothing.
fn never_in_family(rule: &Rule, empty: EmptyIpSet) -> bool {
    let no_port_matches = |ports: &[PortRange], named: &[String]| {
        port_ranges(ports).is_empty() && !named.is_empty() && named.iter().all(|id| empty(id))
    };
    must_match_ipsets(rule)
        .iter()
        .any(|ids| ids.iter().any(|id| empty(id)))
        || no_port_matches(&rule.src_ports, &rule.src_named_port_ip_set_ids)
        || no_port_matches(&rule.dst_ports, &rule.dst_named_port_ip_set_ids)
}

/// Whether none of `rules` is rendered in `family`: each is of the other family (by its
/// `ip_version` or its nets) or can match nothing there ([`never_in_family`]). A policy chain
/// of such rules would be empty, a jump to it a no-op: neither is rendered (see
/// [`crate::endpoint::NoopPolicy`]).
pub fn renders_nothing(rules: &[Rule], family: Family, empty: EmptyIpSet) -> bool {
    rules
        .iter()
        .all(|r| never_in_family(r, empty) || family_nets(r, family).is_none())
}

/// Whether `rule` matches on Felix IP set `id`: every match on a set is rendered differently
/// when the set has no member of the family (see [`EmptyIpSet`]).
pub fn rule_matches_ipset(rule: &Rule, id: &str) -> bool {
    ipset_fields(rule)
        .iter()
        .any(|ids| ids.iter().any(|i| i == id))
}

/// IDs of a multi-ID field in a canonical order: the field is an AND (IP sets) or an OR
/// (named ports) of its IDs, so the order carries no meaning and must not change the output.
fn sorted(ids: &[String]) -> Vec<&String> {
    let mut v: Vec<&String> = ids.iter().collect();
    v.sort();
    v.dedup();
    v
}

/// One match clause of a rule.
#[derive(Clone, Debug)]
enum Clause {
    Proto(u8, bool),
    Net(Dir, IpNet, bool),
    InSet(Dir, String, bool),
    Port(Dir, u16, u16, bool),
    PortSet(Dir, String, bool),
    NamedPort(Dir, String, bool),
    /// ICMPv6 header?, type, code, negated.
    Icmp(bool, u8, Option<u8>, bool),
}

fn apply(b: RuleBuilder, c: &Clause) -> RuleBuilder {
    match c {
        Clause::Proto(p, neg) => b.l4proto_cmp(*p, *neg),
        Clause::Net(d, n, neg) => b.addr(*d, *n, *neg),
        Clause::InSet(d, s, neg) => b.addr_in_set(*d, s, *neg),
        Clause::Port(d, lo, hi, neg) => b.th_port(*d, *lo, *hi, *neg),
        Clause::PortSet(d, s, neg) => b.th_port_in_set(*d, s, *neg),
        Clause::NamedPort(d, s, neg) => b.addr_proto_port_in_set(*d, s, *neg),
        Clause::Icmp(v6, t, c, neg) => b.icmp(*v6, *t, *c, *neg),
    }
}

impl Renderer {
    /// The clause for a CIDR list: one inline match, or a lookup in a shared interval set.
    fn nets_clause(
        &self,
        family: Family,
        dir: Dir,
        nets: &[IpNet],
        neg: bool,
        sets: &mut SetBag,
    ) -> Option<Clause> {
        match nets {
            [] => None,
            [one] => Some(Clause::Net(dir, *one, neg)),
            many => {
                let v6 = family == Family::Ip6;
                // The set is named after its content: the merged ranges it covers.
                let ranges = build::merge_ranges(many.iter().map(build::cidr_range).collect());
                let canonical = ranges
                    .iter()
                    .map(|(a, b)| format!("{a:x}-{b:x}"))
                    .collect::<Vec<_>>()
                    .join(",");
                let elements = build::interval_elements(&ranges, if v6 { 16 } else { 4 });
                let name = shared_set_name(family, 'n', &canonical);
                let key = if v6 {
                    DataType::Ipv6Addr
                } else {
                    DataType::Ipv4Addr
                };
                let mut set = build::new_set(&name, vec![key], set_flags::INTERVAL, None);
                set.elements = elements;
                sets.insert(name.clone(), set);
                Some(Clause::InSet(dir, name, neg))
            }
        }
    }

    /// The clause for a port list: one inline match, or a lookup in a shared port set.
    fn ports_clause(
        &self,
        family: Family,
        dir: Dir,
        ports: &[PortRange],
        neg: bool,
        sets: &mut SetBag,
    ) -> Option<Clause> {
        let ranges = port_ranges(ports);
        match ranges.as_slice() {
            [] => None,
            [(lo, hi)] => Some(Clause::Port(dir, *lo, *hi, neg)),
            many => {
                let canonical = many
                    .iter()
                    .map(|(a, b)| format!("{a}-{b}"))
                    .collect::<Vec<_>>()
                    .join(",");
                let name = shared_set_name(family, 'p', &canonical);
                let mut set = build::new_set(
                    &name,
                    vec![DataType::InetService],
                    set_flags::INTERVAL,
                    None,
                );
                set.elements = build::port_interval_elements(many);
                sets.insert(name.clone(), set);
                Some(Clause::PortSet(dir, name, neg))
            }
        }
    }

    /// The positive port alternatives of one direction: ports (as one alternative) and each
    /// named-port set with a member of the family. Several alternatives are an OR.
    fn port_alternatives(
        &self,
        family: Family,
        dir: Dir,
        (ports, named): (&[PortRange], &[String]),
        (sets, empty): (&mut SetBag, EmptyIpSet),
    ) -> Vec<Clause> {
        let mut alts = Vec::new();
        if let Some(c) = self.ports_clause(family, dir, ports, false, sets) {
            alts.push(c);
        }
        for id in sorted(named).into_iter().filter(|id| !empty(id)) {
            alts.push(Clause::NamedPort(dir, ipset_name(family, id), false));
        }
        alts
    }

    /// Renders one policy/profile rule into `chain` (§9.2–9.4); `at`: its direction and index
    /// there (flow logs name it by them). Returns false when the rule does not apply to this
    /// family or cannot be rendered.
    pub(crate) fn render_rule(
        &self,
        family: Family,
        layer: Layer,
        rule: &Rule,
        (log, at): (&LogCtx, (Direction, usize)),
        chain: &mut ChainBuilder,
        (sets, empty): (&mut SetBag, EmptyIpSet),
    ) -> bool {
        if never_in_family(rule, empty) {
            return false;
        }
        let Some(nets) = family_nets(rule, family) else {
            return false;
        };
        let proto = match &rule.protocol {
            Some(p) => match protocol_number(p, family) {
                Some(n) => Some(n),
                None => {
                    warn!(?p, "skipping rule with unknown protocol");
                    return false;
                }
            },
            None => None,
        };
        let not_proto = match &rule.not_protocol {
            Some(p) => match protocol_number(p, family) {
                Some(n) => Some(n),
                None => {
                    warn!(?p, "skipping rule with unknown negated protocol");
                    return false;
                }
            },
            None => None,
        };

        // The ICMP header follows the protocol (ICMPv6 for 58), else the family.
        let icmp_v6 = match proto {
            Some(58) => true,
            Some(1) => false,
            _ => family == Family::Ip6,
        };

        let (clauses, blocks) = self.rule_clauses(
            family,
            rule,
            &nets,
            (proto, not_proto),
            icmp_v6,
            (sets, empty),
        );

        let comments: Vec<String> = rule
            .metadata
            .as_ref()
            .map(|m| {
                m.annotations
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect()
            })
            .unwrap_or_default();
        let comment_refs: Vec<&str> = comments.iter().map(String::as_str).collect();

        let action = rule.action.to_ascii_lowercase();
        if !matches!(
            action.as_str(),
            "" | "allow" | "deny" | "pass" | "next-tier" | "log"
        ) {
            warn!(action = %rule.action, "skipping rule with unknown action");
            return false;
        }

        self.push_or_blocks(family, proto, &blocks, chain);
        let mut b = RuleBuilder::new(family);
        for c in &clauses {
            b = apply(b, c);
        }
        if !blocks.is_empty() {
            b = b.mark_has(self.marks.scratch0);
        }
        self.push_verdict(layer, &action, b, (log, at), &comment_refs, chain);
        true
    }

    /// A rule's match clauses, positive then negated, in Felix's order; port alternatives that
    /// need an OR come back as blocks (at most two: source and destination).
    fn rule_clauses(
        &self,
        family: Family,
        rule: &Rule,
        nets: &FamilyNets,
        protos: (Option<u8>, Option<u8>),
        icmp_v6: bool,
        (sets, empty): (&mut SetBag, EmptyIpSet),
    ) -> (Vec<Clause>, Vec<Vec<Clause>>) {
        let (mut clauses, blocks) =
            self.positive_clauses(family, rule, nets, protos.0, icmp_v6, (&mut *sets, empty));
        clauses.extend(self.negated_clauses(family, rule, nets, protos, icmp_v6, (sets, empty)));
        (clauses, blocks)
    }

    /// The positive clauses in Felix's order, and the port alternatives that need an OR as
    /// blocks.
    fn positive_clauses(
        &self,
        family: Family,
        rule: &Rule,
        nets: &FamilyNets,
        proto: Option<u8>,
        icmp_v6: bool,
        (sets, empty): (&mut SetBag, EmptyIpSet),
    ) -> (Vec<Clause>, Vec<Vec<Clause>>) {
        let mut clauses: Vec<Clause> = Vec::new();
        let mut blocks: Vec<Vec<Clause>> = Vec::new();
        if let Some(p) = proto {
            clauses.push(Clause::Proto(p, false));
        }
        // Per direction: nets, IP sets, IP-and-port sets (destination only), then the port
        // alternatives (one is a clause, several an OR block).
        let no_sets = Vec::new();
        let positive = [
            (
                Dir::Src,
                &nets.src,
                &rule.src_ip_set_ids,
                &no_sets,
                (&rule.src_ports, &rule.src_named_port_ip_set_ids),
            ),
            (
                Dir::Dst,
                &nets.dst,
                &rule.dst_ip_set_ids,
                &rule.dst_ip_port_set_ids,
                (&rule.dst_ports, &rule.dst_named_port_ip_set_ids),
            ),
        ];
        for (dir, in_nets, in_sets, ip_port_sets, (ports, named)) in positive {
            clauses.extend(self.nets_clause(family, dir, in_nets, false, sets));
            for id in sorted(in_sets) {
                clauses.push(Clause::InSet(dir, ipset_name(family, id), false));
            }
            for id in sorted(ip_port_sets) {
                clauses.push(Clause::NamedPort(dir, ipset_name(family, id), false));
            }
            let alts = self.port_alternatives(family, dir, (ports, named), (&mut *sets, empty));
            if alts.len() == 1 {
                clauses.extend(alts);
            } else if alts.len() > 1 {
                blocks.push(alts);
            }
        }
        if let Some(icmp) = &rule.icmp {
            let (t, c) = match icmp {
                Icmp::IcmpType(t) => (*t, None),
                Icmp::IcmpTypeCode(tc) => (tc.r#type, Some(tc.code)),
            };
            if proto.is_none() {
                clauses.push(Clause::Proto(
                    if family == Family::Ip6 { 58 } else { 1 },
                    false,
                ));
            }
            clauses.push(icmp_clause(icmp_v6, t, c, false));
        }
        (clauses, blocks)
    }

    /// The negated clauses, in the same order as the positive ones.
    fn negated_clauses(
        &self,
        family: Family,
        rule: &Rule,
        nets: &FamilyNets,
        (proto, not_proto): (Option<u8>, Option<u8>),
        icmp_v6: bool,
        (sets, empty): (&mut SetBag, EmptyIpSet),
    ) -> Vec<Clause> {
        let mut clauses = Vec::new();
        if let Some(p) = not_proto {
            clauses.push(Clause::Proto(p, true));
        }
        // A negated match on a set with no member of this family always holds: left out.
        let negated = [
            (
                Dir::Src,
                &nets.not_src,
                &rule.not_src_ip_set_ids,
                &rule.not_src_ports,
                &rule.not_src_named_port_ip_set_ids,
            ),
            (
                Dir::Dst,
                &nets.not_dst,
                &rule.not_dst_ip_set_ids,
                &rule.not_dst_ports,
                &rule.not_dst_named_port_ip_set_ids,
            ),
        ];
        for (dir, not_nets, not_sets, not_ports, not_named) in negated {
            let present = |ids: &Vec<String>| {
                sorted(ids)
                    .into_iter()
                    .filter(|id| !empty(id))
                    .map(|id| ipset_name(family, id))
                    .collect::<Vec<_>>()
            };
            clauses.extend(self.nets_clause(family, dir, not_nets, true, sets));
            clauses.extend(
                present(not_sets)
                    .into_iter()
                    .map(|s| Clause::InSet(dir, s, true)),
            );
            clauses.extend(self.ports_clause(family, dir, not_ports, true, sets));
            clauses.extend(
                present(not_named)
                    .into_iter()
                    .map(|s| Clause::NamedPort(dir, s, true)),
            );
        }
        if let Some(icmp) = &rule.not_icmp {
            let (t, c) = match icmp {
                NotIcmp::NotIcmpType(t) => (*t, None),
                NotIcmp::NotIcmpTypeCode(tc) => (tc.r#type, Some(tc.code)),
            };
            if proto.is_none() && rule.icmp.is_none() {
                clauses.push(Clause::Proto(
                    if family == Family::Ip6 { 58 } else { 1 },
                    false,
                ));
            }
            clauses.push(icmp_clause(icmp_v6, t, c, true));
        }
        clauses
    }

    /// OR blocks (§9.3): each block's alternatives set a scratch mark the rule then matches on.
    /// scratch0 holds "first block matched"; a second block ANDs via scratch1.
    fn push_or_blocks(
        &self,
        family: Family,
        proto: Option<u8>,
        blocks: &[Vec<Clause>],
        chain: &mut ChainBuilder,
    ) {
        let m = self.marks;
        let proto_clause = proto.map(|p| Clause::Proto(p, false));
        if !blocks.is_empty() {
            chain.push(
                RuleBuilder::new(family)
                    .counter()
                    .mark_clear(m.scratch0 | m.scratch1)
                    .build(),
                &[],
            );
            for (i, block) in blocks.iter().enumerate() {
                let bit = if i == 0 { m.scratch0 } else { m.scratch1 };
                for alt in block {
                    let mut b = RuleBuilder::new(family);
                    if let Some(pc) = &proto_clause {
                        b = apply(b, pc);
                    }
                    b = apply(b, alt);
                    chain.push(b.counter().mark_set_or(bit).build(), &[]);
                }
                if i > 0 {
                    chain.push(
                        RuleBuilder::new(family)
                            .mark_lacks(m.scratch1)
                            .counter()
                            .mark_clear(m.scratch0)
                            .build(),
                        &[],
                    );
                }
            }
        }
    }

    /// The rule's verdict on what matched `b`: a mark and a return for allow and pass, a mark and
    /// a drop (or reject) for deny, a rate-limited log with the configured prefix for log. With
    /// flow logs, allow, pass and deny also log to NFLOG, before their verdict.
    fn push_verdict(
        &self,
        layer: Layer,
        action: &str,
        mut b: RuleBuilder,
        (log, (dir, idx)): (&LogCtx, (Direction, usize)),
        comment_refs: &[&str],
        chain: &mut ChainBuilder,
    ) {
        let m = self.marks;
        let flow = |b: RuleBuilder, a: nflog::Action| match &log.flow {
            Some((owner, id)) => b.nflog(
                nflog::group(dir),
                &nflog::rule_prefix(a, *owner, dir, idx, id),
                nflog::SNAPLEN,
            ),
            None => b,
        };
        // Felix's iptables rules set a bit and then test it in a second rule ("Return if policy
        // accepted", "Drop if policy denied"), because an iptables rule has one target. An
        // nftables rule sets the bit and returns (or drops) in one: the second rule could only
        // match what the first just marked, since the bit is clear on entry to the chain and
        // every earlier setter returned or dropped. One rule in three of a policy chain goes.
        match action {
            "" | "allow" => {
                let b = flow(b.counter().mark_set_or(m.accept), nflog::Action::Allow);
                chain.push(b.ret().build(), comment_refs);
            }
            "pass" | "next-tier" => {
                let b = flow(b.counter().mark_set_or(m.pass), nflog::Action::Pass);
                chain.push(b.ret().build(), comment_refs);
            }
            "deny" => {
                let b = flow(b.counter().mark_set_or(m.drop), nflog::Action::Deny);
                chain.push(self.deny(b, layer).build(), comment_refs);
            }
            _ => {
                if let Some(l) = self.cfg.log_rate_limit {
                    b = b.limit(l.rate, l.unit_secs, l.burst, false);
                }
                let mut prefix = format!("{}: ", self.log_prefix(log));
                // The kernel keeps at most NF_LOG_PREFIXLEN − 1 = 127 bytes and refuses longer
                // prefixes (ERANGE), which would fail the whole transaction: truncate.
                if prefix.len() > MAX_LOG_PREFIX {
                    let mut end = MAX_LOG_PREFIX;
                    while !prefix.is_char_boundary(end) {
                        end -= 1;
                    }
                    prefix.truncate(end);
                }
                chain.push(b.counter().log(&prefix).build(), comment_refs);
            }
        }
    }

    /// `%k`/`%n`/`%p`/`%t` substituted into `LogPrefix` (§3.2).
    fn log_prefix(&self, log: &LogCtx) -> String {
        let ns_name = if log.namespace.is_empty() {
            log.name.clone()
        } else {
            format!("{}/{}", log.namespace, log.name)
        };
        let prefix = self
            .cfg
            .log_prefix
            .replace("%k", &log.kind)
            .replace("%n", &log.name)
            .replace("%p", &ns_name)
            .replace("%t", &log.tier);
        // The kernel keeps a prefix up to its first NUL, so a NUL (or any control character,
        // which would also break the log line) in a name would program something else than
        // what is read back: they become `_`.
        if prefix.chars().any(char::is_control) {
            prefix
                .chars()
                .map(|c| if c.is_control() { '_' } else { c })
                .collect()
        } else {
            prefix
        }
    }

    /// One policy/profile chain from a rule list. An empty chain keeps one no-op rule with the
    /// chain's comment; a trailing `return` is elided.
    fn rules_chain(
        &self,
        family: Family,
        (layer, dir): (Layer, Direction),
        (name, chain_comment): (&str, &str),
        rules: &[Rule],
        log: &LogCtx,
        (sets, empty): (&mut SetBag, EmptyIpSet),
    ) -> TextChain {
        let mut chain = ChainBuilder::new(name);
        for (idx, rule) in rules.iter().enumerate() {
            self.render_rule(
                family,
                layer,
                rule,
                (log, (dir, idx)),
                &mut chain,
                (&mut *sets, empty),
            );
        }
        chain.elide_trailing_return();
        if chain.is_empty() {
            chain.push(
                RuleBuilder::new(family).verdict(Verdict::Continue).build(),
                &[chain_comment],
            );
        }
        chain.finish()
    }

    /// The chains of a policy in one layer (`<layer>-cali-pi-…` / `-po-…`) for the given
    /// directions, plus the shared sets they use. Staged policies render nothing, nor does a
    /// direction none of whose rules is rendered in the family ([`renders_nothing`]).
    pub fn policy_chains(
        &self,
        family: Family,
        layer: Layer,
        id: &PolicyId,
        policy: &Policy,
        dirs: &[Direction],
        empty: EmptyIpSet,
    ) -> PolicyChains {
        if is_staged(id) {
            return PolicyChains::default();
        }
        let log = LogCtx {
            kind: kind_short(id),
            name: id.name.clone(),
            namespace: id.namespace.clone(),
            tier: policy.tier.clone(),
            flow: self
                .flow_logs_in(layer)
                .then(|| (nflog::Owner::Policy, nflog::policy_id(id))),
        };
        let ns_name = if id.namespace.is_empty() {
            id.name.clone()
        } else {
            format!("{}/{}", id.namespace, id.name)
        };
        let chain = |dir: Direction| {
            let rules = match dir {
                Direction::Inbound => &policy.inbound_rules,
                Direction::Outbound => &policy.outbound_rules,
            };
            let comment = format!("{} {} {}", kind_short(id), ns_name, dir.word());
            // No rule in the family: no chain (and no jump to it).
            let skip = renders_nothing(rules, family, empty);
            (!skip).then(|| (rules, policy_chain(layer, dir, id), comment))
        };
        self.owner_chains(family, layer, dirs, &log, empty, chain)
    }

    /// The chains of a profile in one layer (`<layer>-cali-pri-…` / `-pro-…`).
    pub fn profile_chains(
        &self,
        family: Family,
        layer: Layer,
        name: &str,
        profile: &Profile,
        dirs: &[Direction],
        empty: EmptyIpSet,
    ) -> PolicyChains {
        let log = LogCtx {
            kind: "profile".into(),
            name: name.to_string(),
            namespace: String::new(),
            tier: String::new(),
            flow: self
                .flow_logs_in(layer)
                .then(|| (nflog::Owner::Profile, name.to_string())),
        };
        let chain = |dir: Direction| {
            let rules = match dir {
                Direction::Inbound => &profile.inbound_rules,
                Direction::Outbound => &profile.outbound_rules,
            };
            let comment = format!("Profile {name} {}", dir.word());
            Some((rules, profile_chain(layer, dir, name), comment))
        };
        self.owner_chains(family, layer, dirs, &log, empty, chain)
    }

    /// The chains of a policy or profile in the given directions: `chain` gives a direction's
    /// rules, chain name and chain comment, or `None` for no chain.
    fn owner_chains<'r>(
        &self,
        family: Family,
        layer: Layer,
        dirs: &[Direction],
        log: &LogCtx,
        empty: EmptyIpSet,
        chain: impl Fn(Direction) -> Option<(&'r Vec<Rule>, String, String)>,
    ) -> PolicyChains {
        let mut sets = SetBag::new();
        let chains = dirs
            .iter()
            .filter_map(|&dir| Some((dir, chain(dir)?)))
            .map(|(dir, (rules, name, comment))| {
                self.rules_chain(
                    family,
                    (layer, dir),
                    (&name, &comment),
                    rules,
                    log,
                    (&mut sets, empty),
                )
            })
            .collect();
        PolicyChains {
            chains,
            sets: sets.into_values().collect(),
        }
    }

    /// Whether rules in `layer` log to NFLOG for flow logs: not the untracked policies of the
    /// raw layer, as in Felix (every packet reaches them, not only a connection's first).
    pub(crate) fn flow_logs_in(&self, layer: Layer) -> bool {
        self.cfg.flow_logs && layer != Layer::Raw
    }

    /// A stand-in for a policy or profile that an endpoint references but that has not been
    /// received: it denies, so a missing policy fails closed instead of open.
    pub fn missing_chain(&self, family: Family, layer: Layer, name: &str) -> TextChain {
        let mut chain = ChainBuilder::new(name);
        let b = RuleBuilder::new(family).counter();
        chain.push(
            self.deny(b, layer).build(),
            &["Policy or profile not received yet: deny"],
        );
        chain.finish()
    }
}
