//! The baselines' inputs, rendered from one [`Workload`]: Felix's iptables shape (an
//! `iptables-restore` file plus an `ipset restore` file, §7–9) and the nftables shape
//! of Calico's and kube-proxy's nft modes (one `inet` table, named sets, verdict-map dispatch,
//! anonymous port sets as `nft -f` writes `tcp dport { 80, 443 }`).
//!
//! Each shape is first a state (chains → rules, sets → members, maps → elements); a full load is
//! that state as text, and a delta is the diff of two states written the way each tool's users
//! write it: Felix's `--noflush` restore of only the dirty chains (`:chain - [0:0]` flushes,
//! `-X` deletes) and `ipset add`; knftables' `add chain`/`flush chain`/`add rule`,
//! `add|delete element`, `delete chain`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::workload::{policy_name, Endpoint, PolicySpec, Workload};

/// Felix's accept mark and pass mark (§6.3 defaults).
const MARK_ACCEPT: &str = "0x10000";
const MARK_PASS: &str = "0x20000";

fn comment(chain: &str, i: usize, body: &str) -> String {
    // Felix's `cali:<hash>` rule comment; FNV-1a is enough for a distinct, stable tag.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in chain.bytes().chain(i.to_le_bytes()).chain(body.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("cali:{h:016x}")
}

fn ipset_name(s: usize) -> String {
    format!("cali40s:b{s}")
}

fn nft_set_name(s: usize) -> String {
    format!("cali40s-b{s}")
}

fn ports_ipt(ports: &[u16]) -> String {
    match ports {
        [p] => format!("-m tcp --dport {p}"),
        ps => format!(
            "-m multiport --dports {}",
            ps.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
        ),
    }
}

fn ports_nft(ports: &[u16]) -> String {
    match ports {
        [p] => format!("tcp dport {p}"),
        ps => format!(
            "tcp dport {{ {} }}",
            ps.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Felix's iptables shape: the `filter` table's chains, plus the ipsets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IptState {
    /// Our chains (all regular chains), rules without `-A chain`.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Jumps from the built-in chains into ours (`-A FORWARD -j cali-FORWARD`); never change.
    pub hooks: Vec<String>,
    /// ipsets: name → (hash:net?, members).
    pub sets: BTreeMap<String, (bool, BTreeSet<String>)>,
    /// The IPv6 table's state (`ip6tables`, ipsets of family inet6).
    pub ipv6: bool,
}

/// Calico's nft shape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftState {
    /// Regular chains → rules.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Base chains: name → (`type … hook … priority …;` line, rules). Never change.
    pub base: BTreeMap<String, (String, Vec<String>)>,
    /// Named sets: name → (interval?, members).
    pub sets: BTreeMap<String, (bool, BTreeSet<String>)>,
    /// Verdict maps: name → ifname → verdict.
    pub maps: BTreeMap<String, BTreeMap<String, String>>,
}

/// The nft table the baseline writes.
pub const NFT_TABLE: &str = "inet calico";

fn with_comments(chain: &str, rules: Vec<String>, ipt: bool) -> Vec<String> {
    rules
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let c = comment(chain, i, &r);
            if ipt {
                format!("-m comment --comment \"{c}\" {r}")
            } else {
                format!("{r} comment \"{c}\"")
            }
        })
        .collect()
}

fn ipt_policy(inbound: bool, pol: &PolicySpec) -> Vec<String> {
    let dir = if inbound { "src" } else { "dst" };
    let mut out = Vec::new();
    for r in &pol.rules {
        out.push(format!(
            "-p tcp -m set --match-set {} {dir} {} -j MARK --set-xmark {MARK_ACCEPT}/{MARK_ACCEPT}",
            ipset_name(r.set),
            ports_ipt(&r.ports)
        ));
        out.push(format!(
            "-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j RETURN"
        ));
    }
    out
}

fn nft_set6_name(s: usize) -> String {
    format!("cali60s-b{s}")
}

/// A policy's rules in the `inet` table; with `dual_stack`, each set match also for the set's
/// IPv6 twin (one table holds both families, the accept-mark check is shared).
fn nft_policy(inbound: bool, pol: &PolicySpec, dual_stack: bool) -> Vec<String> {
    let dir = if inbound { "saddr" } else { "daddr" };
    let mut out = Vec::new();
    for r in &pol.rules {
        out.push(format!(
            "ip protocol tcp ip {dir} @{} {} meta mark set mark | {MARK_ACCEPT}",
            nft_set_name(r.set),
            ports_nft(&r.ports)
        ));
        if dual_stack {
            out.push(format!(
                "meta l4proto tcp ip6 {dir} @{} {} meta mark set mark | {MARK_ACCEPT}",
                nft_set6_name(r.set),
                ports_nft(&r.ports)
            ));
        }
        out.push(format!("mark and {MARK_ACCEPT} == {MARK_ACCEPT} return"));
    }
    out
}

/// The endpoint chain body shared by both shapes (Felix's `cali-tw-`/`cali-fw-`, §8.2).
fn ep_chain(ep: &Endpoint, to_wl: bool, ipt: bool) -> Vec<String> {
    let pols = if to_wl { &ep.ingress } else { &ep.egress };
    let (pfx, prof) = if to_wl {
        ("cali-pi-", "cali-pri-kns.bench")
    } else {
        ("cali-po-", "cali-pro-kns.bench")
    };
    let mut r = Vec::new();
    if ipt {
        r.push("-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".to_string());
        r.push("-m conntrack --ctstate INVALID -j DROP".to_string());
        if !to_wl {
            r.push("-p udp -m udp --dport 4789 -j DROP".to_string());
            r.push("-p ipencap -j DROP".to_string());
        }
        r.push(format!("-j MARK --set-xmark 0x0/{MARK_ACCEPT}"));
        r.push(format!("-j MARK --set-xmark 0x0/{MARK_PASS}"));
        for &p in pols {
            r.push(format!(
                "-m mark --mark 0x0/{MARK_PASS} -j {pfx}{}",
                policy_name(p)
            ));
            r.push(format!(
                "-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j RETURN"
            ));
        }
        r.push(format!("-m mark --mark 0x0/{MARK_PASS} -j DROP"));
        r.push(format!("-j {prof}"));
        r.push(format!(
            "-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j RETURN"
        ));
        r.push("-j DROP".to_string());
    } else {
        r.push("ct state related,established accept".to_string());
        r.push("ct state invalid drop".to_string());
        if !to_wl {
            r.push("udp dport 4789 drop".to_string());
            r.push("ip protocol ipencap drop".to_string());
        }
        r.push("meta mark set mark and 0xfffcffff".to_string());
        for &p in pols {
            r.push(format!(
                "mark and {MARK_PASS} == 0 jump {pfx}{}",
                policy_name(p)
            ));
            r.push(format!("mark and {MARK_ACCEPT} == {MARK_ACCEPT} return"));
        }
        r.push(format!("mark and {MARK_PASS} == 0 drop"));
        r.push(format!("jump {prof}"));
        r.push(format!("mark and {MARK_ACCEPT} == {MARK_ACCEPT} return"));
        r.push("drop".to_string());
    }
    r
}

impl IptState {
    /// Felix's iptables rendering of the workload.
    pub fn render(w: &Workload) -> IptState {
        let mut chains: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut raw: Vec<(String, Vec<String>)> = vec![
            (
                "cali-FORWARD".into(),
                vec![
                    "-i cali+ -j cali-from-wl-dispatch".into(),
                    "-o cali+ -j cali-to-wl-dispatch".into(),
                    "-i cali+ -j ACCEPT".into(),
                    "-o cali+ -j ACCEPT".into(),
                ],
            ),
            (
                "cali-INPUT".into(),
                vec!["-i cali+ -g cali-wl-to-host".into()],
            ),
            ("cali-OUTPUT".into(), vec!["-o cali+ -j RETURN".into()]),
            (
                "cali-wl-to-host".into(),
                vec!["-j cali-from-wl-dispatch".into(), "-j ACCEPT".into()],
            ),
            (
                "cali-pri-kns.bench".into(),
                vec![
                    format!("-j MARK --set-xmark {MARK_ACCEPT}/{MARK_ACCEPT}"),
                    format!("-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j RETURN"),
                ],
            ),
            (
                "cali-pro-kns.bench".into(),
                vec![
                    format!("-j MARK --set-xmark {MARK_ACCEPT}/{MARK_ACCEPT}"),
                    format!("-m mark --mark {MARK_ACCEPT}/{MARK_ACCEPT} -j RETURN"),
                ],
            ),
        ];
        for (p, pol) in w.policies.iter().enumerate() {
            let pfx = if pol.inbound { "cali-pi-" } else { "cali-po-" };
            raw.push((
                format!("{pfx}{}", policy_name(p)),
                ipt_policy(pol.inbound, pol),
            ));
        }
        // Dispatch: a one-level trie on the character after `cali` (felix/rules/dispatch.go).
        let mut by_char: BTreeMap<char, Vec<&Endpoint>> = BTreeMap::new();
        for ep in &w.endpoints {
            raw.push((format!("cali-tw-{}", ep.iface), ep_chain(ep, true, true)));
            raw.push((format!("cali-fw-{}", ep.iface), ep_chain(ep, false, true)));
            let c = ep.iface[4..].chars().next().unwrap_or('0');
            by_char.entry(c).or_default().push(ep);
        }
        for (root, flag, target) in [
            ("cali-from-wl-dispatch", "-i", "cali-fw-"),
            ("cali-to-wl-dispatch", "-o", "cali-tw-"),
        ] {
            let mut top = Vec::new();
            for (c, eps) in &by_char {
                top.push(format!("{flag} cali{c}+ -g {root}-{c}"));
                let mut child: Vec<String> = eps
                    .iter()
                    .map(|e| format!("{flag} {} -g {target}{}", e.iface, e.iface))
                    .collect();
                child.push("-j DROP".into());
                raw.push((format!("{root}-{c}"), child));
            }
            top.push("-j DROP".into());
            raw.push((root.to_string(), top));
        }
        for (name, rules) in raw {
            let rules = with_comments(&name, rules, true);
            chains.insert(name, rules);
        }
        let sets = w
            .sets
            .iter()
            .enumerate()
            .map(|(s, set)| {
                (
                    ipset_name(s),
                    (set.net, set.members.iter().cloned().collect()),
                )
            })
            .collect();
        IptState {
            chains,
            hooks: vec![
                "-A FORWARD -j cali-FORWARD".into(),
                "-A INPUT -j cali-INPUT".into(),
                "-A OUTPUT -j cali-OUTPUT".into(),
            ],
            sets,
            ipv6: false,
        }
    }

    /// Rules in the filter table, hooks included (what `iptables-save` will list).
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(Vec::len).sum::<usize>() + self.hooks.len()
    }

    /// The IPv6 copy Felix writes beside it when IPv6 is on: the same chains with each IP set's
    /// IPv6 twin (`cali60s:`), whose members are the set's IPv6 members — none in this workload.
    pub fn ipv6_copy(&self) -> IptState {
        let v6 = |s: &String| s.replace("cali40s:", "cali60s:");
        IptState {
            chains: self
                .chains
                .iter()
                .map(|(n, rules)| (n.clone(), rules.iter().map(v6).collect()))
                .collect(),
            hooks: self.hooks.clone(),
            sets: self
                .sets
                .iter()
                .map(|(n, (net, _))| (v6(n), (*net, BTreeSet::new())))
                .collect(),
            ipv6: true,
        }
    }

    /// Total ipset members.
    pub fn member_count(&self) -> usize {
        self.sets.values().map(|(_, m)| m.len()).sum()
    }

    /// The `ipset restore` file of a full load.
    pub fn ipset_restore(&self) -> String {
        let mut s = String::new();
        let family = if self.ipv6 { "inet6" } else { "inet" };
        for (name, (net, members)) in &self.sets {
            let kind = if *net { "hash:net" } else { "hash:ip" };
            let _ = writeln!(
                s,
                "create {name} {kind} family {family} hashsize 1024 maxelem 1048576"
            );
            for m in members {
                let _ = writeln!(s, "add {name} {m}");
            }
        }
        s
    }

    /// The `iptables-restore --noflush` file of a full load.
    pub fn restore(&self) -> String {
        let mut s = String::from("*filter\n");
        for name in self.chains.keys() {
            let _ = writeln!(s, ":{name} - [0:0]");
        }
        for (name, rules) in &self.chains {
            for r in rules {
                let _ = writeln!(s, "-A {name} {r}");
            }
        }
        for h in &self.hooks {
            let _ = writeln!(s, "{h}");
        }
        s.push_str("COMMIT\n");
        s
    }

    /// Felix's incremental restore from `self` to `new`: only dirty chains, deleted ones last.
    pub fn delta_restore(&self, new: &IptState) -> String {
        let mut s = String::from("*filter\n");
        let (dirty, gone) = chain_diff(&self.chains, &new.chains);
        for n in dirty.iter().chain(&gone) {
            let _ = writeln!(s, ":{n} - [0:0]");
        }
        for n in dirty {
            for r in &new.chains[n] {
                let _ = writeln!(s, "-A {n} {r}");
            }
        }
        for n in gone {
            let _ = writeln!(s, "-X {n}");
        }
        s.push_str("COMMIT\n");
        s
    }

    /// Set members added from `self` to `new`: `(set, member)` for `ipset add`.
    pub fn added_members(&self, new: &IptState) -> Vec<(String, String)> {
        set_diff(&self.sets, &new.sets).0
    }
}

type Sets = BTreeMap<String, (bool, BTreeSet<String>)>;
/// `(set, member)` pairs.
type Members = Vec<(String, String)>;

/// Chains whose rules differ from `old` (new or changed) and chains `new` no longer has.
fn chain_diff<'a>(
    old: &'a BTreeMap<String, Vec<String>>,
    new: &'a BTreeMap<String, Vec<String>>,
) -> (Vec<&'a String>, Vec<&'a String>) {
    let dirty = new
        .iter()
        .filter(|(n, r)| old.get(*n) != Some(r))
        .map(|(n, _)| n)
        .collect();
    let gone = old.keys().filter(|n| !new.contains_key(*n)).collect();
    (dirty, gone)
}

/// (added, removed) members between two set maps.
fn set_diff(old: &Sets, new: &Sets) -> (Members, Members) {
    let empty = BTreeSet::new();
    let mut add = Vec::new();
    let mut del = Vec::new();
    for (name, (_, members)) in new {
        let before = old.get(name).map(|(_, m)| m).unwrap_or(&empty);
        add.extend(
            members
                .difference(before)
                .map(|m| (name.clone(), m.clone())),
        );
        del.extend(
            before
                .difference(members)
                .map(|m| (name.clone(), m.clone())),
        );
    }
    (add, del)
}

impl NftState {
    /// Calico's nft-mode rendering of the workload; with `dual_stack`, IPv6 too.
    pub fn render(w: &Workload, dual_stack: bool) -> NftState {
        let mut raw: Vec<(String, Vec<String>)> = vec![
            (
                "cali-FORWARD".into(),
                vec![
                    "iifname \"cali*\" jump cali-from-wl-dispatch".into(),
                    "oifname \"cali*\" jump cali-to-wl-dispatch".into(),
                    "iifname \"cali*\" accept".into(),
                    "oifname \"cali*\" accept".into(),
                ],
            ),
            (
                "cali-INPUT".into(),
                vec!["iifname \"cali*\" goto cali-wl-to-host".into()],
            ),
            (
                "cali-OUTPUT".into(),
                vec!["oifname \"cali*\" return".into()],
            ),
            (
                "cali-wl-to-host".into(),
                vec!["jump cali-from-wl-dispatch".into(), "accept".into()],
            ),
            (
                "cali-from-wl-dispatch".into(),
                vec!["iifname vmap @cali-fw-dispatch".into(), "drop".into()],
            ),
            (
                "cali-to-wl-dispatch".into(),
                vec!["oifname vmap @cali-tw-dispatch".into(), "drop".into()],
            ),
        ];
        for prof in ["cali-pri-kns.bench", "cali-pro-kns.bench"] {
            raw.push((
                prof.into(),
                vec![
                    format!("meta mark set mark | {MARK_ACCEPT}"),
                    format!("mark and {MARK_ACCEPT} == {MARK_ACCEPT} return"),
                ],
            ));
        }
        for (p, pol) in w.policies.iter().enumerate() {
            let pfx = if pol.inbound { "cali-pi-" } else { "cali-po-" };
            raw.push((
                format!("{pfx}{}", policy_name(p)),
                nft_policy(pol.inbound, pol, dual_stack),
            ));
        }
        let mut fw = BTreeMap::new();
        let mut tw = BTreeMap::new();
        for ep in &w.endpoints {
            raw.push((format!("cali-tw-{}", ep.iface), ep_chain(ep, true, false)));
            raw.push((format!("cali-fw-{}", ep.iface), ep_chain(ep, false, false)));
            fw.insert(ep.iface.clone(), format!("goto cali-fw-{}", ep.iface));
            tw.insert(ep.iface.clone(), format!("goto cali-tw-{}", ep.iface));
        }
        let chains = raw
            .into_iter()
            .map(|(n, r)| {
                let r = with_comments(&n, r, false);
                (n, r)
            })
            .collect();
        let base = [
            ("filter-FORWARD", "forward", "cali-FORWARD"),
            ("filter-INPUT", "input", "cali-INPUT"),
            ("filter-OUTPUT", "output", "cali-OUTPUT"),
        ]
        .into_iter()
        .map(|(n, hook, target)| {
            (
                n.to_string(),
                (
                    format!("type filter hook {hook} priority filter; policy accept;"),
                    vec![format!("jump {target}")],
                ),
            )
        })
        .collect();
        let mut sets: Sets = w
            .sets
            .iter()
            .enumerate()
            .map(|(s, set)| {
                (
                    nft_set_name(s),
                    (set.net, set.members.iter().cloned().collect()),
                )
            })
            .collect();
        if dual_stack {
            // The IPv6 twins: no IPv6 members in this workload.
            sets.extend(
                w.sets
                    .iter()
                    .enumerate()
                    .map(|(s, set)| (nft_set6_name(s), (set.net, BTreeSet::new()))),
            );
        }
        NftState {
            chains,
            base,
            sets,
            maps: [
                ("cali-fw-dispatch".to_string(), fw),
                ("cali-tw-dispatch".to_string(), tw),
            ]
            .into_iter()
            .collect(),
        }
    }

    /// Rules in the table, base chains included.
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(Vec::len).sum::<usize>()
            + self.base.values().map(|(_, r)| r.len()).sum::<usize>()
    }

    /// Set members plus map elements.
    pub fn element_count(&self) -> usize {
        self.sets.values().map(|(_, m)| m.len()).sum::<usize>()
            + self.maps.values().map(BTreeMap::len).sum::<usize>()
    }

    /// Chains, base chains included.
    pub fn chain_count(&self) -> usize {
        self.chains.len() + self.base.len()
    }

    /// The `nft -f` file of a full load.
    pub fn full(&self) -> String {
        let mut s = format!("table {NFT_TABLE} {{\n");
        for (name, (interval, members)) in &self.sets {
            let flags = if *interval { " flags interval;" } else { "" };
            let ty = if name.starts_with("cali60s-") {
                "ipv6_addr"
            } else {
                "ipv4_addr"
            };
            let _ = write!(s, "\tset {name} {{ type {ty};{flags}");
            if !members.is_empty() {
                s.push_str(" elements = { ");
                join_into(&mut s, members.iter().map(String::as_str));
                s.push_str(" }");
            }
            s.push_str(" }\n");
        }
        // Regular chains are declared before anything jumps to them.
        for name in self.chains.keys() {
            let _ = writeln!(s, "\tchain {name} {{ }}");
        }
        for (name, elems) in &self.maps {
            // Counted per element, as felix-nft's dispatch maps are.
            let _ = write!(s, "\tmap {name} {{ type ifname : verdict; counter;");
            if !elems.is_empty() {
                s.push_str(" elements = { ");
                let items: Vec<String> = elems
                    .iter()
                    .map(|(k, v)| format!("\"{k}\" : {v}"))
                    .collect();
                join_into(&mut s, items.iter().map(String::as_str));
                s.push_str(" }");
            }
            s.push_str(" }\n");
        }
        for (name, rules) in &self.chains {
            let _ = writeln!(s, "\tchain {name} {{");
            for r in rules {
                let _ = writeln!(s, "\t\t{r}");
            }
            s.push_str("\t}\n");
        }
        for (name, (hook, rules)) in &self.base {
            let _ = writeln!(s, "\tchain {name} {{\n\t\t{hook}");
            for r in rules {
                let _ = writeln!(s, "\t\t{r}");
            }
            s.push_str("\t}\n");
        }
        s.push_str("}\n");
        s
    }

    /// knftables-style incremental input from `self` to `new`.
    pub fn delta(&self, new: &NftState) -> String {
        let t = NFT_TABLE;
        let mut s = String::new();
        let (dirty, gone) = chain_diff(&self.chains, &new.chains);
        let (add, del) = set_diff(&self.sets, &new.sets);
        for (set, m) in add {
            let _ = writeln!(s, "add element {t} {set} {{ {m} }}");
        }
        for (set, m) in del {
            let _ = writeln!(s, "delete element {t} {set} {{ {m} }}");
        }
        for n in &dirty {
            let _ = writeln!(s, "add chain {t} {n}");
            let _ = writeln!(s, "flush chain {t} {n}");
        }
        for n in &dirty {
            for r in &new.chains[*n] {
                let _ = writeln!(s, "add rule {t} {n} {r}");
            }
        }
        for (map, elems) in &new.maps {
            let old = self.maps.get(map);
            for (k, v) in elems {
                if old.and_then(|o| o.get(k)) != Some(v) {
                    let _ = writeln!(s, "add element {t} {map} {{ \"{k}\" : {v} }}");
                }
            }
            for k in old.into_iter().flat_map(|o| o.keys()) {
                if !elems.contains_key(k) {
                    let _ = writeln!(s, "delete element {t} {map} {{ \"{k}\" }}");
                }
            }
        }
        for n in &gone {
            let _ = writeln!(s, "flush chain {t} {n}");
        }
        for n in &gone {
            let _ = writeln!(s, "delete chain {t} {n}");
        }
        s
    }
}

fn join_into<'a>(s: &mut String, items: impl Iterator<Item = &'a str>) {
    for (i, m) in items.enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(m);
    }
}

#[cfg(test)]
mod tests {
    use super::super::workload::{Scale, OPS};
    use super::*;

    fn tiny() -> Workload {
        Workload::generate("6,4,2,4,3,1".parse().unwrap())
    }

    #[test]
    fn both_shapes_express_the_same_policy() {
        let w = tiny();
        let ipt = IptState::render(&w);
        let nft = NftState::render(&w, false);
        assert_eq!(ipt.member_count(), 12);
        assert_eq!(nft.element_count(), 12 + 2 * 6);
        // Same policy chains with the same rule counts in both.
        for (name, rules) in nft.chains.iter().filter(|(n, _)| n.starts_with("cali-p")) {
            assert_eq!(ipt.chains[name].len(), rules.len(), "{name}");
        }
        // Endpoint chains: iptables clears the two marks in two rules, nft in one.
        for ep in &w.endpoints {
            let tw = format!("cali-tw-{}", ep.iface);
            assert_eq!(ipt.chains[&tw].len(), nft.chains[&tw].len() + 1);
        }
    }

    #[test]
    fn deltas_touch_only_what_changed() {
        let mut w = tiny();
        let ipt0 = IptState::render(&w);
        let nft0 = NftState::render(&w, false);
        w.mutate(OPS[0], 0);
        let (ipt1, nft1) = (IptState::render(&w), NftState::render(&w, false));
        let d = ipt0.delta_restore(&ipt1);
        // Two endpoint chains, one child of each dispatch trie (plus the roots when the new
        // interface opened a new branch).
        let decls = d.lines().filter(|l| l.starts_with(':')).count();
        assert!((4..=6).contains(&decls), "{d}");
        let n = nft0.delta(&nft1);
        assert_eq!(
            n.lines().filter(|l| l.starts_with("add element")).count(),
            2
        );
        assert_eq!(ipt1.delta_restore(&ipt1), "*filter\nCOMMIT\n");
        assert!(nft1.delta(&nft1).is_empty());
        w.mutate(OPS[1], 0);
        let ipt2 = IptState::render(&w);
        assert_eq!(ipt1.added_members(&ipt2).len(), 1);
        let _ = Scale::SMALL;
    }
}
