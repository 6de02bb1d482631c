//! Every input the agent accepts renders to objects the kernel accepts. Random ids of any length
//! and any characters UTF-8 allows (NUL, `/`, spaces, non-ASCII, hundreds of bytes, long common
//! prefixes) and random rule contents go through validation, the incremental renderer and our
//! codec into a real kernel, in a private network namespace: the kernel refuses nothing, a
//! read-back finds nothing to repair, and a second round of changes (deletions included) commits
//! too. Invalid inputs among them are refused by validation, never by the kernel.
//!
//! And kernel names are one-to-one: distinct IP set ids, policy ids, profile names never share a
//! set or chain, and two IP sets whose ids share a long prefix hold their own members.

use testkit as common;

use std::collections::BTreeMap;

use felix_api::types::{
    protocol::NumberOrName, rule::Icmp, to_dataplane::Payload, ActivePolicyRemove,
    ActivePolicyUpdate, ActiveProfileRemove, ActiveProfileUpdate, IcmpTypeAndCode, IpSetRemove,
    IpSetType, IpSetUpdate, Policy, PolicyId, PortRange, Profile, ProfileId, Protocol, Rule,
    RuleMetadata, TierInfo, ToDataplane, WorkloadEndpoint, WorkloadEndpointId,
    WorkloadEndpointRemove, WorkloadEndpointUpdate,
};
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft_rules::names::{
    ipset_name, policy_chain, profile_chain, Direction, Layer, MAX_NAME_LEN,
};
use nf_tables::model::{Family, Table};
use nf_tables::reconcile::{plan, Nft, Reconciler, SyncOptions, TableOwnership};
use proptest::prelude::*;

fn msg(p: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

/// Strings an id may be: plain, long, with NUL, `/` or spaces, non-ASCII, or one of a family
/// sharing a 40-character prefix.
fn id_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9][a-z0-9.-]{0,20}",
        "[a-z]{200,320}",
        // Around the kernel's limit once a chain prefix is added.
        "[a-z]{232,242}",
        "\\PC{1,40}",
        "[a-z]{0,6}\u{0}[a-z]{0,6}",
        "[a-z]{1,6}/[a-z]{1,6}",
        "[a-z]{1,6} [a-z]{1,6}",
        "x{40}[ab][0-9]",
        Just("_leading-underscore".to_string()),
    ]
}

fn ipset_id() -> impl Strategy<Value = String> {
    prop_oneof![
        "s:[A-Za-z0-9_-]{28}",
        "s:x{30}[ab][0-9]",
        "n:[A-Za-z0-9_-]{10}",
        "s-[a-z]{3}",
        id_string(),
    ]
}

fn policy_id() -> impl Strategy<Value = PolicyId> {
    (
        prop_oneof![
            Just(""),
            Just("GlobalNetworkPolicy"),
            Just("NetworkPolicy"),
            Just("KubernetesNetworkPolicy"),
            Just("ClusterNetworkPolicy"),
            Just("SomethingNew"),
        ],
        prop_oneof![Just(String::new()), id_string()],
        id_string(),
    )
        .prop_map(|(kind, namespace, name)| PolicyId {
            kind: kind.to_string(),
            namespace,
            name,
        })
}

/// A rule with random contents referencing the sets `sets[i]`; some invalid on purpose
/// (protocol 300, ICMP type 300), which validation must refuse.
fn rule(nsets: usize) -> impl Strategy<Value = Rule> {
    let proto = prop_oneof![
        Just(None),
        Just(Some(NumberOrName::Name("tcp".into()))),
        Just(Some(NumberOrName::Name("udp".into()))),
        Just(Some(NumberOrName::Name("icmp".into()))),
        (0i32..=255).prop_map(|n| Some(NumberOrName::Number(n))),
        Just(Some(NumberOrName::Number(300))),
        Just(Some(NumberOrName::Name("tcpx".into()))),
    ];
    (
        prop_oneof![Just("allow"), Just("deny"), Just("log"), Just("pass")],
        proto,
        proptest::collection::vec((0u16..1000, 0u16..3), 0..3),
        proptest::option::of((0i32..300, proptest::option::of(0i32..260))),
        proptest::collection::vec(
            prop_oneof![
                Just("10.0.0.0/8".to_string()),
                Just("192.168.1.1".to_string()),
                Just("fd00::/64".to_string()),
            ],
            0..3,
        ),
        proptest::collection::vec(0..nsets.max(1), 0..3),
        proptest::collection::btree_map(id_string(), id_string(), 0..3),
    )
        .prop_map(move |(action, proto, ports, icmp, nets, sets, notes)| {
            let is_l4 = matches!(&proto, Some(NumberOrName::Name(n)) if n == "tcp" || n == "udp");
            let is_icmp = matches!(&proto, Some(NumberOrName::Name(n)) if n == "icmp");
            Rule {
                action: action.to_string(),
                protocol: proto.map(|p| Protocol {
                    number_or_name: Some(p),
                }),
                dst_ports: if is_l4 {
                    ports
                        .iter()
                        .map(|(f, w)| PortRange {
                            first: i32::from(*f),
                            last: i32::from(f + w),
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                icmp: icmp.filter(|_| is_icmp).map(|(t, c)| match c {
                    None => Icmp::IcmpType(t),
                    Some(c) => Icmp::IcmpTypeCode(IcmpTypeAndCode { r#type: t, code: c }),
                }),
                src_net: nets,
                src_ip_set_ids: if nsets == 0 {
                    Vec::new()
                } else {
                    sets.iter().map(|i| format!("#{i}")).collect()
                },
                metadata: Some(RuleMetadata { annotations: notes }),
                ..Default::default()
            }
        })
}

/// One random node: IP sets, policies and profiles with hostile names and random rules, tiers
/// with hostile names, and workloads using them.
#[derive(Debug, Clone)]
struct Node {
    sets: Vec<String>,
    policies: Vec<(PolicyId, Vec<Rule>, Vec<Rule>)>,
    profiles: Vec<(String, Vec<Rule>)>,
    tiers: Vec<String>,
}

fn node() -> impl Strategy<Value = Node> {
    (
        proptest::collection::vec(ipset_id(), 1..6),
        proptest::collection::vec(
            (
                policy_id(),
                proptest::collection::vec(rule(6), 0..4),
                proptest::collection::vec(rule(6), 0..3),
            ),
            1..6,
        ),
        proptest::collection::btree_map(
            id_string(),
            proptest::collection::vec(rule(6), 0..3),
            1..4,
        ),
        proptest::collection::btree_set(id_string(), 1..3),
    )
        .prop_map(|(sets, policies, profiles, tiers)| {
            // One entry per policy: two spellings of one id are one policy.
            let mut seen = std::collections::BTreeSet::new();
            let policies = policies
                .into_iter()
                .filter(|(id, _, _)| {
                    seen.insert(
                        felix_nft_rules::names::canonical_policy_id(id)
                            .unwrap_or_else(|| id.clone()),
                    )
                })
                .collect();
            Node {
                sets,
                policies,
                profiles: profiles.into_iter().collect(),
                tiers: tiers.into_iter().collect(),
            }
        })
}

/// Whether validation must refuse a rule: the generator's invalid protocols and ICMP values.
fn invalid(r: &Rule) -> bool {
    let bad_proto = matches!(
        r.protocol.as_ref().and_then(|p| p.number_or_name.as_ref()),
        Some(NumberOrName::Number(300))
    ) || matches!(
        r.protocol.as_ref().and_then(|p| p.number_or_name.as_ref()),
        Some(NumberOrName::Name(n)) if n == "tcpx"
    );
    let bad_icmp = match &r.icmp {
        Some(Icmp::IcmpType(t)) => *t > 255,
        Some(Icmp::IcmpTypeCode(tc)) => tc.r#type > 255 || tc.code > 255,
        None => false,
    };
    bad_proto || bad_icmp
}

/// How many of the first round's messages validation must refuse.
fn expected_refusals(n: &Node) -> usize {
    let policies = n
        .policies
        .iter()
        .filter(|(_, i, o)| i.iter().chain(o).any(invalid))
        .count();
    let profiles = n
        .profiles
        .iter()
        .filter(|(_, r)| r.iter().any(invalid))
        .count();
    policies + profiles
}

/// Replaces the `#i` placeholders with the node's set ids.
fn bind(rules: &[Rule], sets: &[String]) -> Vec<Rule> {
    rules
        .iter()
        .cloned()
        .map(|mut r| {
            for id in r.src_ip_set_ids.iter_mut() {
                let i: usize = id[1..].parse().unwrap_or(0);
                *id = sets[i % sets.len()].clone();
            }
            r
        })
        .collect()
}

fn wep_id(i: usize) -> WorkloadEndpointId {
    WorkloadEndpointId {
        orchestrator_id: "k8s".into(),
        workload_id: format!("ns/w{i}"),
        endpoint_id: "eth0".into(),
    }
}

/// The node's messages: sets, then policies and profiles, then three workloads using them.
fn messages(n: &Node) -> Vec<ToDataplane> {
    let mut out = Vec::new();
    for (i, id) in n.sets.iter().enumerate() {
        out.push(msg(Payload::IpsetUpdate(IpSetUpdate {
            id: id.clone(),
            members: vec![format!("10.9.{i}.1"), format!("10.9.{i}.2")],
            r#type: IpSetType::Ip as i32,
        })));
    }
    for (id, inbound, outbound) in &n.policies {
        out.push(msg(Payload::ActivePolicyUpdate(ActivePolicyUpdate {
            id: Some(id.clone()),
            policy: Some(Policy {
                inbound_rules: bind(inbound, &n.sets),
                outbound_rules: bind(outbound, &n.sets),
                ..Default::default()
            }),
        })));
    }
    for (name, rules) in &n.profiles {
        out.push(msg(Payload::ActiveProfileUpdate(ActiveProfileUpdate {
            id: Some(ProfileId { name: name.clone() }),
            profile: Some(Profile {
                inbound_rules: bind(rules, &n.sets),
                outbound_rules: bind(rules, &n.sets),
            }),
        })));
    }
    let ids: Vec<PolicyId> = n.policies.iter().map(|p| p.0.clone()).collect();
    for w in 0..3 {
        let tiers = n
            .tiers
            .iter()
            .enumerate()
            .map(|(t, name)| TierInfo {
                name: name.clone(),
                ingress_policies: ids.iter().skip(t + w).step_by(2).cloned().collect(),
                egress_policies: ids.iter().skip(w).take(2).cloned().collect(),
                default_action: if t % 2 == 0 { "Deny" } else { "Pass" }.into(),
            })
            .collect();
        out.push(msg(Payload::WorkloadEndpointUpdate(
            WorkloadEndpointUpdate {
                id: Some(wep_id(w)),
                endpoint: Some(WorkloadEndpoint {
                    state: "active".into(),
                    name: format!("cali{w:011x}"),
                    mac: format!("ee:ee:ee:ee:ee:{w:02x}"),
                    ipv4_nets: vec![format!("10.65.0.{}/32", w + 1)],
                    profile_ids: n.profiles.iter().map(|p| p.0.clone()).take(2).collect(),
                    tiers,
                    ..Default::default()
                }),
            },
        )));
    }
    out
}

/// The second round: a policy, a profile and an IP set go (after their users), a workload goes,
/// and every other policy is re-sent with its rules reversed.
fn second_round(n: &Node) -> Vec<ToDataplane> {
    let mut out = vec![msg(Payload::WorkloadEndpointRemove(
        WorkloadEndpointRemove {
            id: Some(wep_id(0)),
        },
    ))];
    for (i, (id, inbound, outbound)) in n.policies.iter().enumerate() {
        if i == 0 {
            out.push(msg(Payload::ActivePolicyRemove(ActivePolicyRemove {
                id: Some(id.clone()),
            })));
        } else {
            let mut inbound = bind(inbound, &n.sets);
            inbound.reverse();
            out.push(msg(Payload::ActivePolicyUpdate(ActivePolicyUpdate {
                id: Some(id.clone()),
                policy: Some(Policy {
                    inbound_rules: inbound,
                    outbound_rules: bind(outbound, &n.sets),
                    ..Default::default()
                }),
            })));
        }
    }
    if let Some((name, _)) = n.profiles.last() {
        out.push(msg(Payload::ActiveProfileRemove(ActiveProfileRemove {
            id: Some(ProfileId { name: name.clone() }),
        })));
    }
    // Refused while a policy still uses it; otherwise it goes.
    if let Some(id) = n.sets.last() {
        out.push(msg(Payload::IpsetRemove(IpSetRemove { id: id.clone() })));
    }
    out
}

fn dataplane() -> Dataplane {
    let mut cfg = DataplaneConfig::default();
    // Names reach the kernel in log prefixes too.
    cfg.rules.log_prefix = "%t %k %n %p".into();
    cfg.rules.side_table_size = 4;
    Dataplane::new(cfg, 1).expect("the default configuration renders")
}

/// Feeds `msgs`; returns how many validation refused.
fn feed(dp: &mut Dataplane, msgs: &[ToDataplane]) -> usize {
    msgs.iter().filter(|m| dp.on_update(m).is_err()).count()
}

/// Commits what `dp` changed since its last patch; the error names `step`.
fn commit(rec: &mut Reconciler<Nft>, dp: &mut Dataplane, step: &str) -> Result<(), String> {
    rec.apply_patches(dp.tables_patch())
        .map(drop)
        .map_err(|e| format!("{step}: {e}"))
}

/// Fails unless reading our tables back after `step` plans no operation: the kernel holds what
/// `rec` wants.
fn nothing_left(rec: &mut Reconciler<Nft>, step: &str) -> Result<(), String> {
    let desired = rec.desired().to_vec();
    let (_, plans) = plan(&mut rec.kernel, &desired, false).expect("reading our tables back");
    match plans.iter().map(|p| p.ops.len()).sum::<usize>() {
        0 => Ok(()),
        left => Err(format!("{left} operations left after {step}")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_kernel_refuses_nothing_the_agent_accepts(n in node()) {
        let node = n.clone();
        let result = common::in_private_netns(move || -> Result<(usize, usize), String> {
            let nft = Nft::open().map_err(|e| format!("nf_tables socket: {e}"))?;
            let mut rec = Reconciler::new(
                nft,
                SyncOptions {
                    ownership: TableOwnership::Off,
                    ..SyncOptions::default()
                },
            );
            let mut dp = dataplane();
            let refused = feed(&mut dp, &messages(&n));
            commit(&mut rec, &mut dp, "first commit")?;
            nothing_left(&mut rec, "the first commit")?;
            let refused2 = feed(&mut dp, &second_round(&n));
            commit(&mut rec, &mut dp, "second commit")?;
            // The side table merged back, as the idle daemon does.
            dp.request_side_merge();
            commit(&mut rec, &mut dp, "merge")?;
            dp.request_side_merge();
            commit(&mut rec, &mut dp, "merge, second step")?;
            nothing_left(&mut rec, "the second round")?;
            let desired = rec.desired().to_vec();
            // The incremental state equals a full render of the same model.
            let full = dp.render_tables().map_err(|e| e.to_string())?;
            let main = |ts: &[Table]| -> Vec<Table> {
                ts.iter().filter(|t| t.name == felix_nft_rules::OWNER).cloned().collect()
            };
            if main(&full).iter().map(|t| t.chains.len()).sum::<usize>()
                != main(&desired).iter().map(|t| t.chains.len()).sum::<usize>()
            {
                return Err("the committed tables and a full render differ".into());
            }
            Ok((refused, refused2))
        });
        prop_assert!(result.is_ok(), "{:?} for {:#?}", result, node);
        // Hostile names are accepted; only the invalid rule contents are refused.
        let (refused, _) = result.unwrap_or_default();
        prop_assert_eq!(refused, expected_refusals(&node), "{:#?}", node);
    }

    /// Distinct ids never share a kernel name; every name fits the kernel and holds no NUL.
    #[test]
    fn kernel_names_are_one_to_one(
        sets in proptest::collection::btree_set(ipset_id(), 1..40),
        policies in proptest::collection::btree_set(policy_id(), 1..40),
        profiles in proptest::collection::btree_set(id_string(), 1..40),
    ) {
        let ok = |n: &str| n.len() <= MAX_NAME_LEN && !n.contains('\0');
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        let mut claim = |name: String, what: String| -> Result<(), TestCaseError> {
            prop_assert!(ok(&name), "{what} → {name:?}");
            if let Some(other) = seen.insert(name.clone(), what.clone()) {
                prop_assert!(false, "{other} and {what} both map to {name:?}");
            }
            Ok(())
        };
        for f in [Family::Ip, Family::Ip6] {
            for s in &sets {
                claim(ipset_name(f, s), format!("set {s:?} ({f:?})"))?;
            }
        }
        // Older spellings of a kind are folded into one id before naming.
        let canonical: std::collections::BTreeSet<PolicyId> = policies
            .iter()
            .map(|p| felix_nft_rules::names::canonical_policy_id(p).unwrap_or_else(|| p.clone()))
            .collect();
        for d in [Direction::Inbound, Direction::Outbound] {
            for p in &canonical {
                claim(policy_chain(Layer::Filter, d, p), format!("policy {p:?} {d:?}"))?;
            }
            for p in &profiles {
                claim(profile_chain(Layer::Filter, d, p), format!("profile {p:?} {d:?}"))?;
            }
        }
    }
}
