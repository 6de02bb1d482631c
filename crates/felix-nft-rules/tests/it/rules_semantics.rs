//! Semantic tests for the parts of the renderer that are easy to get subtly wrong: per-family
//! filtering, negated ICMP type+code, the trailing-return elision, overlapping CIDRs, shared
//! sets instead of anonymous ones, OR blocks, fail-closed dispatch, and determinism under any
//! arrival order of updates (proptest).

use felix_api::types::{
    protocol::NumberOrName, rule::NotIcmp, to_dataplane::Payload, ActivePolicyUpdate,
    ActiveProfileUpdate, IcmpTypeAndCode, IpSetType, IpSetUpdate, IpamPool, IpamPoolUpdate, Policy,
    PolicyId, PortRange, Profile, ProfileId, Protocol, Rule, TierInfo, ToDataplane,
    WorkloadEndpoint, WorkloadEndpointId, WorkloadEndpointUpdate,
};
use felix_nft_rules::{
    no_empty_ipsets, render, render_nft, Direction, Layer, Model, PolicyChains, Renderer,
    RulesConfig, RulesError,
};
use nf_tables::model::{set_flags, Expr, Family, Set, Verdict};
use proptest::prelude::*;

fn renderer() -> Renderer {
    Renderer::new(RulesConfig::default()).unwrap()
}

fn gnp(name: &str) -> PolicyId {
    PolicyId {
        name: name.into(),
        namespace: String::new(),
        kind: "GlobalNetworkPolicy".into(),
    }
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A rule with `action`, then changed by `set`.
fn rule(action: &str, set: impl FnOnce(&mut Rule)) -> Rule {
    let mut r = Rule {
        action: action.into(),
        ..Default::default()
    };
    set(&mut r);
    r
}

fn tcp() -> Option<Protocol> {
    Some(Protocol {
        number_or_name: Some(NumberOrName::Name("tcp".into())),
    })
}

fn inbound(family: Family, rules: Vec<Rule>) -> PolicyChains {
    let policy = Policy {
        inbound_rules: rules,
        ..Default::default()
    };
    renderer().policy_chains(
        family,
        Layer::Filter,
        &gnp("p"),
        &policy,
        &[Direction::Inbound],
        &no_empty_ipsets,
    )
}

fn texts(pc: &PolicyChains) -> Vec<String> {
    pc.chains[0]
        .texts
        .iter()
        .map(|t| t.split(" comment ").next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_too_small_mark_mask_is_a_config_error() {
    let cfg = RulesConfig {
        mark_mask: 0x0000_f000,
        ..RulesConfig::default()
    };
    let err = Renderer::new(cfg.clone()).unwrap_err();
    assert!(matches!(err, RulesError::MarkMaskTooSmall { .. }));
    assert!(err.to_string().contains("0x0000f000"), "{err}");
    assert!(render(&Model::new(cfg)).is_err());
}

#[test]
fn odd_mark_mask_changes_every_mark_rule() {
    // Bits 1, 4, 9, 12, 17: accept=0x2, pass=0x10, drop=0x200, scratch0=0x1000, scratch1=0x20000.
    let mask = 0x2 | 0x10 | 0x200 | 0x1000 | 0x20000;
    let r = Renderer::new(RulesConfig {
        mark_mask: mask,
        ..RulesConfig::default()
    })
    .unwrap();
    assert_eq!(
        (
            r.marks.accept,
            r.marks.pass,
            r.marks.drop,
            r.marks.scratch0,
            r.marks.scratch1
        ),
        (0x2, 0x10, 0x200, 0x1000, 0x20000)
    );
    let text = render_nft(&Model::new(RulesConfig {
        mark_mask: mask,
        ..RulesConfig::default()
    }))
    .unwrap();
    assert!(text.contains("meta mark & 0x00000002 == 0x00000002 counter accept"));
    // "Clear all" in raw PREROUTING clears exactly accept|pass|scratch0|scratch1.
    let all = 0x2 | 0x10 | 0x1000 | 0x20000u32;
    assert!(text.contains(&format!("meta mark set mark and 0x{:08x}", !all)));
}

#[test]
fn negated_icmp_type_and_code_is_not_the_pair() {
    // Decision (§9.2, §23.9): `notICMP {type 8, code 0}` excludes exactly echo-request code 0,
    // like iptables' `! --icmp-type 8/0`; it does NOT exclude every type-8 or every code-0
    // packet. One 16-bit compare of type and code together says that.
    // Allow `proto` unless it is ICMP type `ty` with code 0.
    let allow_unless_code_0 = |family, proto: &str, ty| {
        inbound(
            family,
            vec![Rule {
                action: "allow".into(),
                protocol: Some(Protocol {
                    number_or_name: Some(NumberOrName::Name(proto.into())),
                }),
                not_icmp: Some(NotIcmp::NotIcmpTypeCode(IcmpTypeAndCode {
                    r#type: ty,
                    code: 0,
                })),
                ..Default::default()
            }],
        )
    };
    let pc = allow_unless_code_0(Family::Ip, "icmp", 8);
    let t = texts(&pc);
    assert!(
        t[0].starts_with("meta l4proto icmp @th,0,16 != 0x0800 "),
        "{t:?}"
    );
    let exprs = &pc.chains[0].chain.rules[0].exprs;
    assert!(exprs.iter().any(|e| matches!(e,
        Expr::Cmp { op: nf_tables::model::CmpOp::Neq, data, .. } if data == &vec![8, 0])));
    // In the IPv6 table the same field is ICMPv6's.
    let pc = allow_unless_code_0(Family::Ip6, "icmpv6", 128);
    assert!(texts(&pc)[0].starts_with("meta l4proto ipv6-icmp @th,0,16 != 0x8000 "));
}

#[test]
fn mixed_family_rules_are_filtered_per_family() {
    let rules = vec![
        // Both families: each keeps its own CIDRs.
        rule("allow", |r| {
            r.src_net = strings(&["10.0.0.0/8", "fd00::/8"])
        }),
        // Only v6 nets: skipped in the v4 table.
        rule("deny", |r| r.dst_net = strings(&["fd00:1::/64"])),
        // A negated list with only the other family's nets also skips the rule (§9.1).
        rule("deny", |r| r.not_dst_net = strings(&["fd00:2::/64"])),
        // A negated catch-all can never match: skipped.
        rule("deny", |r| r.not_src_net = strings(&["0.0.0.0/0"])),
        // ip_version pins the family.
        rule("deny", |r| r.ip_version = 6),
    ];
    let v4 = texts(&inbound(Family::Ip, rules.clone()));
    assert_eq!(
        v4,
        vec!["ip saddr 10.0.0.0/8 counter meta mark set mark or 0x00010000"],
        "v4: the first rule only, trailing return elided"
    );
    let v6 = texts(&inbound(Family::Ip6, rules));
    assert_eq!(
        v6,
        vec![
            "ip6 saddr fd00::/8 counter meta mark set mark or 0x00010000 return",
            "ip6 daddr fd00:1::/64 counter meta mark set mark or 0x00040000 drop",
            "ip6 daddr != fd00:2::/64 counter meta mark set mark or 0x00040000 drop",
            "counter meta mark set mark or 0x00040000 drop",
        ]
    );
}

#[test]
fn trailing_return_is_elided_only_at_the_end() {
    let allow = Rule {
        action: "allow".into(),
        protocol: tcp(),
        ..Default::default()
    };
    let deny = Rule {
        action: "deny".into(),
        ..Default::default()
    };
    // allow, allow: one rule each (the mark and the return in one); the first keeps its
    // return, the last loses it and keeps its mark.
    let t = texts(&inbound(Family::Ip, vec![allow.clone(), allow.clone()]));
    assert_eq!(t.len(), 2);
    assert!(t[0].ends_with("mark or 0x00010000 return"), "{t:?}");
    assert!(t[1].ends_with("mark or 0x00010000"), "{t:?}");
    // allow, deny: the deny's drop ends the chain; nothing is elided.
    let t = texts(&inbound(Family::Ip, vec![allow.clone(), deny]));
    assert_eq!(t.len(), 2);
    assert!(t[1].ends_with("mark or 0x00040000 drop"), "{t:?}");
    // pass at the end: its return is elided too.
    let t = texts(&inbound(
        Family::Ip,
        vec![Rule {
            action: "pass".into(),
            ..Default::default()
        }],
    ));
    assert_eq!(t, vec!["counter meta mark set mark or 0x00020000"]);
    // An empty policy has no chain: a jump to it would change nothing, and endpoint chains
    // leave it out. An empty profile keeps one no-op rule carrying the chain comment.
    assert!(inbound(Family::Ip, vec![]).chains.is_empty());
    let pc = renderer().profile_chains(
        Family::Ip,
        Layer::Filter,
        "kns.p",
        &Profile::default(),
        &[Direction::Inbound],
        &no_empty_ipsets,
    );
    assert_eq!(texts(&pc), vec!["continue"]);
    let comment = pc.chains[0].chain.rules[0].comment.clone().unwrap();
    assert!(comment.ends_with("; Profile kns.p ingress"), "{comment}");
}

fn shared_sets(pc: &PolicyChains) -> Vec<&Set> {
    pc.sets.iter().collect()
}

#[test]
fn overlapping_cidrs_in_a_rule_become_one_merged_shared_set() {
    let pc = inbound(
        Family::Ip,
        vec![Rule {
            action: "allow".into(),
            src_net: strings(&[
                "10.0.0.0/16",
                "10.0.1.0/24",
                "10.0.0.7/32",
                "10.1.0.0/16",
                "192.168.0.0/24",
            ]),
            ..Default::default()
        }],
    );
    let sets = shared_sets(&pc);
    assert_eq!(sets.len(), 1);
    let s = sets[0];
    assert!(s.name.starts_with("cali4n-"));
    assert_eq!(s.flags, set_flags::INTERVAL);
    // 10.0/16 covers the /24 and the /32 and touches 10.1/16: two ranges, four elements after
    // nft's leading end element at 0.0.0.0.
    let keys: Vec<Vec<u8>> = s.elements.iter().map(|e| e.key.to_vec()).collect();
    assert_eq!(
        keys,
        vec![
            vec![0, 0, 0, 0],
            vec![10, 0, 0, 0],
            vec![10, 2, 0, 0],
            vec![192, 168, 0, 0],
            vec![192, 168, 1, 0]
        ]
    );
    assert!(texts(&pc)[0].starts_with(&format!("ip saddr @{} ", s.name)));
}

#[test]
fn equal_lists_share_one_set_and_no_set_is_anonymous() {
    let r = |ports: &[(i32, i32)], nets: &[&str]| Rule {
        action: "allow".into(),
        protocol: tcp(),
        dst_ports: ports
            .iter()
            .map(|&(first, last)| PortRange { first, last })
            .collect(),
        dst_net: strings(nets),
        ..Default::default()
    };
    let mut model = Model::new(RulesConfig::default());
    // Two policies, the same lists in a different order: one port set, one net set.
    model.policies.insert(
        gnp("a"),
        Policy {
            inbound_rules: vec![r(&[(443, 443), (80, 80)], &["10.1.0.0/16", "10.2.0.0/16"])],
            ..Default::default()
        },
    );
    model.policies.insert(
        gnp("b"),
        Policy {
            inbound_rules: vec![r(
                &[(80, 80), (443, 443), (80, 80)],
                &["10.2.0.0/16", "10.1.0.0/16"],
            )],
            ..Default::default()
        },
    );
    let mut w = WorkloadEndpoint {
        state: "active".into(),
        name: "cali1".into(),
        ..Default::default()
    };
    w.tiers = vec![TierInfo {
        name: "default".into(),
        ingress_policies: vec![gnp("a"), gnp("b")],
        ..Default::default()
    }];
    model.workloads.insert(WorkloadEndpointId::default(), w);
    let tables = render(&model).unwrap();
    for t in tables.iter().filter(|t| t.name == felix_nft_rules::OWNER) {
        let shared: Vec<&Set> = t
            .sets
            .values()
            .filter(|s| s.name.starts_with("cali4p-") || s.name.starts_with("cali4n-"))
            .collect();
        if t.family == Family::Ip {
            assert_eq!(
                shared.len(),
                2,
                "{:?}",
                shared.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
        }
        assert!(t.sets.values().all(|s| s.flags & set_flags::ANONYMOUS == 0));
        // Every lookup names a set of the table.
        for c in t.chains.values() {
            for rule in &c.rules {
                for e in &rule.exprs {
                    if let Expr::Lookup { set, .. } = e {
                        assert!(
                            t.sets.contains_key(set),
                            "{} uses missing set {set}",
                            c.name
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn ports_or_named_ports_use_a_scratch_block() {
    let pc = inbound(
        Family::Ip,
        vec![Rule {
            action: "allow".into(),
            protocol: tcp(),
            dst_ports: vec![PortRange {
                first: 80,
                last: 80,
            }],
            dst_named_port_ip_set_ids: strings(&["n:web"]),
            ..Default::default()
        }],
    );
    assert_eq!(
        texts(&pc),
        vec![
            "counter meta mark set mark and 0xffe7ffff",
            "meta l4proto tcp th dport 80 counter meta mark set mark or 0x00080000",
            "meta l4proto tcp ip daddr . meta l4proto . th dport @cali40n-web counter meta mark set mark or 0x00080000",
            "meta l4proto tcp meta mark & 0x00080000 == 0x00080000 counter meta mark set mark or 0x00010000",
        ]
    );
}

#[test]
fn workload_dispatch_fails_closed_in_both_directions() {
    let tables = render(&Model::new(RulesConfig::default())).unwrap();
    for t in tables.iter().filter(|t| t.name == felix_nft_rules::OWNER) {
        for name in ["filter-cali-from-wl-dispatch", "filter-cali-to-wl-dispatch"] {
            let c = &t.chains[name];
            // Hand-off to the side table (an accept with a mark), the map, then drop.
            assert_eq!(c.rules.len(), 3);
            assert!(
                matches!(&c.rules[0].exprs[1], Expr::Lookup { set, dreg: None, .. }
                if set == "filter-cali-wl-side")
            );
            assert!(
                matches!(&c.rules[1].exprs[1], Expr::Lookup { set, dreg: Some(r), .. }
                if set == name && *r == nf_tables::model::Reg::VERDICT)
            );
            assert_eq!(c.rules[2].exprs.last(), Some(&Expr::Verdict(Verdict::Drop)));
        }
    }
    // The side table's dispatch base chains end in drop too: a handed-off interface it does
    // not know is not let through.
    let sides: Vec<_> = tables
        .iter()
        .filter(|t| t.name == felix_nft_rules::SIDE_TABLE)
        .collect();
    assert_eq!(sides.len(), 2, "ip and ip6");
    for t in sides {
        for name in [
            "filter-FORWARD-from-wl",
            "filter-FORWARD-to-wl",
            "filter-INPUT-from-wl",
        ] {
            let c = &t.chains[name];
            assert!(c.base.is_some(), "{name} is a base chain");
            assert_eq!(
                c.rules.last().and_then(|r| r.exprs.last()),
                Some(&Expr::Verdict(Verdict::Drop)),
                "{name}"
            );
        }
    }
    // With the side table off (no room in the mark mask, or size 0) the dispatch is Felix's.
    let tables = render(&Model::new(RulesConfig {
        side_table_size: 0,
        ..RulesConfig::default()
    }))
    .unwrap();
    assert_eq!(tables.len(), 2);
    for t in &tables {
        assert_eq!(t.chains["filter-cali-from-wl-dispatch"].rules.len(), 2);
        assert!(!t.sets.contains_key("filter-cali-wl-side"));
    }
}

// ---------------------------------------------------------------------------------------------
// Determinism
// ---------------------------------------------------------------------------------------------

fn msg(p: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

/// A fixed population of updates, each about a different object, with multi-value fields
/// whose order carries no meaning.
fn updates(members: Vec<String>, ports: Vec<(i32, i32)>, nets: Vec<String>) -> Vec<ToDataplane> {
    let mut out = vec![
        msg(Payload::IpsetUpdate(IpSetUpdate {
            id: "s:net".into(),
            members: members.clone(),
            r#type: IpSetType::Net as i32,
        })),
        msg(Payload::IpsetUpdate(IpSetUpdate {
            id: "s:ip".into(),
            members: members
                .iter()
                .map(|m| m.split('/').next().unwrap_or_default().to_string())
                .collect(),
            r#type: IpSetType::Ip as i32,
        })),
        msg(Payload::IpamPoolUpdate(IpamPoolUpdate {
            id: "p1".into(),
            pool: Some(IpamPool {
                cidr: "10.65.0.0/16".into(),
                masquerade: true,
                ..Default::default()
            }),
        })),
        msg(Payload::ActiveProfileUpdate(ActiveProfileUpdate {
            id: Some(ProfileId {
                name: "kns.default".into(),
            }),
            profile: Some(Profile {
                inbound_rules: vec![Rule::default()],
                outbound_rules: vec![Rule::default()],
            }),
        })),
        msg(Payload::ActivePolicyUpdate(ActivePolicyUpdate {
            id: Some(gnp("p")),
            policy: Some(Policy {
                inbound_rules: vec![
                    Rule {
                        action: "allow".into(),
                        protocol: tcp(),
                        src_ip_set_ids: strings(&["s:net", "s:ip"]),
                        dst_ports: ports
                            .iter()
                            .map(|&(first, last)| PortRange { first, last })
                            .collect(),
                        src_net: nets.clone(),
                        ..Default::default()
                    },
                    Rule {
                        action: "deny".into(),
                        not_dst_net: nets,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
        })),
    ];
    for i in 0..3 {
        out.push(msg(Payload::WorkloadEndpointUpdate(
            WorkloadEndpointUpdate {
                id: Some(WorkloadEndpointId {
                    orchestrator_id: "k8s".into(),
                    workload_id: format!("ns/pod{i}"),
                    endpoint_id: "eth0".into(),
                }),
                endpoint: Some(WorkloadEndpoint {
                    state: "active".into(),
                    name: format!("cali{i}"),
                    profile_ids: strings(&["kns.default"]),
                    ipv4_nets: vec![format!("10.65.0.{i}/32")],
                    tiers: vec![TierInfo {
                        name: "default".into(),
                        ingress_policies: vec![gnp("p")],
                        egress_policies: vec![gnp("p")],
                        default_action: String::new(),
                    }],
                    ..Default::default()
                }),
            },
        )));
    }
    out
}

fn render_updates(msgs: &[ToDataplane]) -> String {
    let mut m = Model::new(RulesConfig::default());
    for u in msgs {
        m.apply(u);
    }
    render_nft(&m).unwrap()
}

fn cidr() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u8..4, 0u8..255, 8u8..=32).prop_map(|(a, b, p)| format!("10.{a}.{b}.0/{p}")),
        (0u16..4, 48u8..=128).prop_map(|(a, p)| format!("fd00:{a}::/{p}")),
    ]
}

/// A deterministic Fisher–Yates shuffle driven by `seed`.
fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut x = seed | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Same updates in any order, with set members, port lists and CIDR lists in any order
    /// and with duplicates: byte-identical output.
    #[test]
    fn rendering_does_not_depend_on_arrival_order(
        members in proptest::collection::vec(cidr(), 1..8),
        ports in proptest::collection::vec((1i32..2000, 0i32..40), 1..6),
        nets in proptest::collection::vec(cidr(), 1..5),
        seed in any::<u64>(),
    ) {
        let ports: Vec<(i32, i32)> = ports.into_iter().map(|(a, w)| (a, a + w)).collect();
        let base = render_updates(&updates(members.clone(), ports.clone(), nets.clone()));

        // A deterministic shuffle of everything whose order is meaningless.
        let mut members2 = members.clone();
        members2.push(members[0].clone());
        shuffle(&mut members2, seed ^ 1);
        let mut ports2 = ports.clone();
        shuffle(&mut ports2, seed ^ 2);
        let mut nets2 = nets.clone();
        shuffle(&mut nets2, seed ^ 3);
        let mut msgs = updates(members2, ports2, nets2);
        shuffle(&mut msgs, seed ^ 4);
        prop_assert_eq!(base, render_updates(&msgs));
    }
}

#[test]
fn ip_set_deltas_equal_a_full_update() {
    let full = updates(
        strings(&["10.0.0.0/24", "10.0.1.0/24"]),
        vec![(80, 80)],
        strings(&["10.9.0.0/16"]),
    );
    let mut partial = updates(
        strings(&["10.0.0.0/24", "10.5.0.0/24"]),
        vec![(80, 80)],
        strings(&["10.9.0.0/16"]),
    );
    {
        partial.push(msg(Payload::IpsetDeltaUpdate(
            felix_api::types::IpSetDeltaUpdate {
                id: "s:net".into(),
                added_members: strings(&["10.0.1.0/24"]),
                removed_members: strings(&["10.5.0.0/24"]),
            },
        )));
    }
    partial.push(msg(Payload::IpsetUpdate(IpSetUpdate {
        id: "s:ip".into(),
        members: strings(&["10.0.0.0", "10.0.1.0"]),
        r#type: IpSetType::Ip as i32,
    })));
    assert_eq!(render_updates(&full), render_updates(&partial));
}

#[test]
fn log_prefixes_are_truncated_to_what_the_kernel_accepts() {
    // The kernel refuses log prefixes over 127 bytes with ERANGE, which would fail the whole
    // transaction; `%n` can make LogPrefix arbitrarily long.
    let r = Renderer::new(RulesConfig {
        log_prefix: "calico-packet-%n".into(),
        ..RulesConfig::default()
    })
    .unwrap();
    let long = "n".repeat(300);
    let policy = Policy {
        inbound_rules: vec![Rule {
            action: "log".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let pc = r.policy_chains(
        Family::Ip,
        Layer::Filter,
        &gnp(&long),
        &policy,
        &[Direction::Inbound],
        &no_empty_ipsets,
    );
    let prefix = pc.chains[0]
        .chain
        .rules
        .iter()
        .flat_map(|r| &r.exprs)
        .find_map(|e| match e {
            Expr::Log { prefix, .. } => prefix.clone(),
            _ => None,
        })
        .expect("a log expression");
    assert_eq!(prefix.len(), 127);
    assert!(prefix.starts_with("calico-packet-nnn"));
}

/// Each NFLOG statement of a chain: (group, prefix, snaplen).
fn nflogs(chain: &nf_tables::build::TextChain) -> Vec<(u16, String, u32)> {
    chain
        .chain
        .rules
        .iter()
        .flat_map(|r| &r.exprs)
        .filter_map(|e| match e {
            Expr::Log {
                prefix: Some(p),
                group: Some(g),
                snaplen,
                ..
            } => Some((*g, p.clone(), snaplen.unwrap_or(0))),
            _ => None,
        })
        .collect()
}

/// With flow logs on, every allow, pass and deny rule of a policy or profile logs to NFLOG
/// (group 1 ingress, 2 egress, 80 bytes) with Felix's prefix: action, owner, direction and the
/// rule's index, then the policy's id or the profile's name. A log rule does not, nor do the
/// untracked policies of the raw layer; with flow logs off nothing logs to a group.
#[test]
fn flow_logs_log_every_verdict_with_felix_s_prefix() {
    let r = |flow_logs| {
        Renderer::new(RulesConfig {
            flow_logs,
            ..RulesConfig::default()
        })
        .unwrap()
    };
    let policy = Policy {
        inbound_rules: vec![
            rule("allow", |r| r.protocol = tcp()),
            rule("deny", |_| {}),
            rule("log", |_| {}),
            rule("next-tier", |_| {}),
        ],
        outbound_rules: vec![rule("", |_| {})],
        ..Default::default()
    };
    let id = PolicyId {
        name: "web".into(),
        namespace: "prod".into(),
        kind: "NetworkPolicy".into(),
    };
    let both = [Direction::Inbound, Direction::Outbound];
    let chains = |flow_logs, layer| {
        r(flow_logs).policy_chains(Family::Ip, layer, &id, &policy, &both, &no_empty_ipsets)
    };
    let pc = chains(true, Layer::Filter);
    let owned = |v: &[(u16, &str)]| -> Vec<(u16, String, u32)> {
        v.iter().map(|(g, p)| (*g, p.to_string(), 80)).collect()
    };
    assert_eq!(
        nflogs(&pc.chains[0]),
        owned(&[
            (1, "API0|np/prod/web"),
            (1, "DPI1|np/prod/web"),
            (1, "PPI3|np/prod/web")
        ])
    );
    assert_eq!(nflogs(&pc.chains[1]), owned(&[(2, "APE0|np/prod/web")]));
    // The log sits between the mark and the verdict, in the rule of the verdict.
    let allow = texts(&pc)[0].clone();
    assert!(
        allow.ends_with(r#"log prefix "API0|np/prod/web" group 1 snaplen 80 return"#),
        "{allow}"
    );
    // Pre-DNAT policies log too; untracked ones do not.
    assert_eq!(nflogs(&chains(true, Layer::Mangle).chains[0]).len(), 3);
    assert!(nflogs(&chains(true, Layer::Raw).chains[0]).is_empty());
    assert!(nflogs(&chains(false, Layer::Filter).chains[0]).is_empty());
    // A profile's rules are named by the profile.
    let profile = Profile {
        inbound_rules: vec![rule("allow", |_| {})],
        outbound_rules: vec![rule("deny", |_| {})],
    };
    let pc = r(true).profile_chains(
        Family::Ip6,
        Layer::Filter,
        "kns.prod",
        &profile,
        &both,
        &no_empty_ipsets,
    );
    assert_eq!(nflogs(&pc.chains[0]), owned(&[(1, "ARI0|kns.prod")]));
    assert_eq!(nflogs(&pc.chains[1]), owned(&[(2, "DRE0|kns.prod")]));
}

// ---------------------------------------------------------------------------------------------
// WireGuard
// ---------------------------------------------------------------------------------------------

/// With WireGuard on, its port is accepted, host traffic leaving the device is masqueraded,
/// and in host-encryption mode raw PREROUTING marks host traffic that did not come through
/// WireGuard with the sixth mark bit (wireguard.md §2.11).
#[test]
fn wireguard_firewall_follows_felix() {
    let cfg = |host_encryption| RulesConfig {
        wireguard_port: Some(51820),
        wireguard_ifaces: vec!["wireguard.cali".into(), "wg-v6.cali".into()],
        wireguard_host_encryption: host_encryption,
        tunnel_ifaces_v4: vec!["wireguard.cali".into()],
        ..RulesConfig::default()
    };
    let ip = |tables: Vec<nf_tables::build::TextTable>| {
        tables
            .into_iter()
            .find(|t| t.table.family == Family::Ip && t.table.name == felix_nft_rules::OWNER)
            .expect("the ip table")
            .texts
    };
    let texts = ip(felix_nft_rules::render_text(&Model::new(cfg(true))).unwrap());
    let mark = &texts["raw-cali-wireguard-incoming-mark"];
    assert_eq!(mark.len(), 5, "{mark:#?}");
    for (rule, iface) in mark
        .iter()
        .zip(["lo", "wireguard.cali", "wg-v6.cali", "cali*"])
    {
        assert!(
            rule.contains(&format!("iifname \"{iface}\"")) && rule.ends_with("return"),
            "{rule}"
        );
    }
    assert!(mark[4].contains("0x00200000"), "{}", mark[4]);
    let pre = &texts["raw-cali-PREROUTING"];
    assert!(
        pre[1].ends_with("jump raw-cali-wireguard-incoming-mark"),
        "{pre:#?}"
    );
    let input = texts["filter-cali-INPUT"].join("\n");
    assert!(input.contains("l4proto udp th dport 51820"), "{input}");
    let post = texts["nat-cali-POSTROUTING"].join("\n");
    assert!(
        post.contains("oifname \"wireguard.cali\"") && post.contains("masquerade"),
        "{post}"
    );
    // Without host encryption the chain is there, not jumped to.
    let texts = ip(felix_nft_rules::render_text(&Model::new(cfg(false))).unwrap());
    assert!(texts.contains_key("raw-cali-wireguard-incoming-mark"));
    assert!(!texts["raw-cali-PREROUTING"]
        .iter()
        .any(|r| r.contains("wireguard")));
}
