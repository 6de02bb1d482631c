//! The incremental renderer against the full renderer, the oracle: after every step of
//! random update sequences (endpoints coming and going and sharing interfaces, policies and
//! profiles changing and disappearing while referenced, IP set deltas, host endpoints named,
//! `*` and resolved by address, pools, hosts, VTEPs turning VXLAN on, host addresses), the tables obtained by folding every
//! patch so far must equal `rules::render` of the same model, object for object. And an update
//! touches only what it changes: a member delta patches one set, nothing else.

use std::collections::BTreeSet;

use felix_api::types::{
    protocol::NumberOrName, to_dataplane::Payload, ActivePolicyRemove, ActivePolicyUpdate,
    ActiveProfileRemove, ActiveProfileUpdate, HostEndpoint, HostEndpointId, HostEndpointRemove,
    HostEndpointUpdate, HostMetadataUpdate, IpSetDeltaUpdate, IpSetRemove, IpSetType, IpSetUpdate,
    IpamPool, IpamPoolRemove, IpamPoolUpdate, Policy, PolicyId, PortRange, Profile, ProfileId,
    Protocol, Rule, TierInfo, ToDataplane, VxlanTunnelEndpointRemove, VxlanTunnelEndpointUpdate,
    WorkloadEndpoint, WorkloadEndpointId, WorkloadEndpointRemove, WorkloadEndpointUpdate,
};
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft_rules::Renderer;
use nf_tables::model::{Expr, Table, TablePatch, Verdict};
use proptest::prelude::*;
use rtnl::monitor::IfaceEvent;

fn msg(p: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

fn pid(i: u8) -> PolicyId {
    PolicyId {
        name: format!("pol-{i}"),
        namespace: String::new(),
        kind: "GlobalNetworkPolicy".into(),
    }
}

fn rules(variant: u8) -> Vec<Rule> {
    let tcp = Some(Protocol {
        number_or_name: Some(NumberOrName::Name("tcp".into())),
    });
    match variant % 5 {
        0 => vec![Rule {
            action: "allow".into(),
            protocol: tcp,
            dst_ports: vec![
                PortRange {
                    first: 80,
                    last: 80,
                },
                PortRange {
                    first: 443,
                    last: 443,
                },
            ],
            ..Default::default()
        }],
        1 => vec![Rule {
            action: "deny".into(),
            src_net: vec!["10.1.0.0/16".into(), "10.2.0.0/16".into()],
            ..Default::default()
        }],
        2 => vec![Rule {
            action: "allow".into(),
            src_ip_set_ids: vec!["s:0".into()],
            not_dst_ip_set_ids: vec!["s:1".into()],
            ..Default::default()
        }],
        4 => vec![
            // Port 8080 or a named port of s:2 (an OR), and named ports of s:2 alone, negated
            // too: what an IP_AND_PORT set with no member of a family changes.
            Rule {
                action: "allow".into(),
                protocol: tcp,
                dst_ports: vec![PortRange {
                    first: 8080,
                    last: 8080,
                }],
                dst_named_port_ip_set_ids: vec!["s:2".into()],
                ..Default::default()
            },
            Rule {
                action: "deny".into(),
                dst_named_port_ip_set_ids: vec!["s:2".into()],
                ..Default::default()
            },
            Rule {
                action: "log".into(),
                not_src_named_port_ip_set_ids: vec!["s:2".into()],
                ..Default::default()
            },
        ],
        _ => vec![
            Rule {
                action: "pass".into(),
                ..Default::default()
            },
            Rule {
                action: "allow".into(),
                protocol: tcp,
                dst_ports: vec![PortRange {
                    first: 80,
                    last: 80,
                }],
                ..Default::default()
            },
        ],
    }
}

fn tiers(ingress: u8, egress: u8) -> Vec<TierInfo> {
    let pick = |mask: u8| (0..4).filter(|i| mask & (1 << i) != 0).map(pid).collect();
    vec![TierInfo {
        name: "default".into(),
        ingress_policies: pick(ingress),
        egress_policies: pick(egress),
        ..Default::default()
    }]
}

fn profiles(mask: u8) -> Vec<String> {
    (0..3)
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| format!("prof-{i}"))
        .collect()
}

const MEMBERS: [&str; 6] = [
    "10.0.0.1",
    "10.0.0.2",
    "10.0.1.0/24",
    "fd00::1",
    "10.0.0.0/30",
    "192.168.0.1",
];

/// Members of set `s:2`, an `IP_AND_PORT` set.
const PORT_MEMBERS: [&str; 6] = [
    "10.0.0.1,tcp:80",
    "10.0.0.1,udp:53",
    "10.0.0.2,tcp:80",
    "fd00::1,tcp:443",
    "fd00::2,sctp:9",
    "192.168.0.1,tcp:8080",
];

/// Members of set `s:<set>` picked by `mask`: set 1 is a `NET` set, set 2 an `IP_AND_PORT` set,
/// the others `IP` sets (members that do not fit the type are rejected by validation).
fn members(set: u8, mask: u8) -> Vec<String> {
    let all = if set == 2 { PORT_MEMBERS } else { MEMBERS };
    (0..all.len())
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| all[i].to_string())
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Wep {
        id: u8,
        iface: u8,
        active: bool,
        ing: u8,
        eg: u8,
        prof: u8,
        spoof: bool,
    },
    WepRemove(u8),
    Hep {
        id: u8,
        name: u8,
        ing: u8,
        untracked: u8,
        pre_dnat: u8,
        forward: u8,
        prof: u8,
    },
    HepRemove(u8),
    Policy(u8, u8),
    PolicyRemove(u8),
    Profile(u8, u8),
    ProfileRemove(u8),
    IpSet(u8, u8),
    IpSetDelta(u8, u8, u8),
    IpSetRemove(u8),
    Pool(u8, bool),
    PoolRemove(u8),
    HostMeta(u8, u8),
    /// A VTEP of node i (node-0 is this node) with underlay address a; the first turns the
    /// VXLAN rules on.
    Vtep(u8, u8),
    VtepRemove(u8),
    Addrs(u8, u8),
    /// One step of merging the side table back into the main one.
    Merge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 0u8..4, any::<bool>(), 0u8..16, 0u8..16, 0u8..8, any::<bool>()).prop_map(
            |(id, iface, active, ing, eg, prof, spoof)| Op::Wep { id, iface, active, ing, eg, prof, spoof }
        ),
        2 => (0u8..6).prop_map(Op::WepRemove),
        2 => (0u8..3, 0u8..4, 0u8..16, 0u8..16, 0u8..16, 0u8..16, 0u8..8).prop_map(
            |(id, name, ing, untracked, pre_dnat, forward, prof)| Op::Hep { id, name, ing, untracked, pre_dnat, forward, prof }
        ),
        1 => (0u8..3).prop_map(Op::HepRemove),
        3 => (0u8..4, 0u8..5).prop_map(|(i, v)| Op::Policy(i, v)),
        1 => (0u8..4).prop_map(Op::PolicyRemove),
        2 => (0u8..3, 0u8..4).prop_map(|(i, v)| Op::Profile(i, v)),
        1 => (0u8..3).prop_map(Op::ProfileRemove),
        2 => (0u8..3, 0u8..64).prop_map(|(i, m)| Op::IpSet(i, m)),
        2 => (0u8..3, 0u8..64, 0u8..64).prop_map(|(i, a, r)| Op::IpSetDelta(i, a, r)),
        1 => (0u8..3).prop_map(Op::IpSetRemove),
        1 => (0u8..2, any::<bool>()).prop_map(|(i, m)| Op::Pool(i, m)),
        1 => (0u8..2).prop_map(Op::PoolRemove),
        1 => (0u8..2, 0u8..3).prop_map(|(i, a)| Op::HostMeta(i, a)),
        1 => (0u8..3, 0u8..3).prop_map(|(i, a)| Op::Vtep(i, a)),
        1 => (0u8..3).prop_map(Op::VtepRemove),
        1 => (0u8..2, 0u8..3).prop_map(|(i, a)| Op::Addrs(i, a)),
        2 => Just(Op::Merge),
    ]
}

fn wep_id(i: u8) -> WorkloadEndpointId {
    WorkloadEndpointId {
        orchestrator_id: "k8s".into(),
        workload_id: format!("ns/pod-{i}"),
        endpoint_id: "eth0".into(),
    }
}

const HEP_NAMES: [&str; 4] = ["eth0", "eth1", "*", ""];
const HOST_ADDRS: [&str; 3] = ["10.9.0.1/24", "10.9.0.2/24", "fd09::1/64"];

fn apply(dp: &mut Dataplane, op: &Op) {
    let m = match op.clone() {
        Op::Wep {
            id,
            iface,
            active,
            ing,
            eg,
            prof,
            spoof,
        } => Payload::WorkloadEndpointUpdate(WorkloadEndpointUpdate {
            id: Some(wep_id(id)),
            endpoint: Some(WorkloadEndpoint {
                state: if active { "active" } else { "inactive" }.into(),
                name: format!("cali{iface}"),
                mac: "ee:ee:ee:ee:ee:ee".into(),
                profile_ids: profiles(prof),
                ipv4_nets: vec![format!("10.65.0.{}/32", id + 1)],
                ipv6_nets: vec![format!("fd65::{}/128", id + 1)],
                tiers: tiers(ing, eg),
                allow_spoofed_source_prefixes: if spoof {
                    vec!["10.66.0.0/16".into()]
                } else {
                    Vec::new()
                },
                ..Default::default()
            }),
        }),
        Op::WepRemove(id) => Payload::WorkloadEndpointRemove(WorkloadEndpointRemove {
            id: Some(wep_id(id)),
        }),
        Op::Hep {
            id,
            name,
            ing,
            untracked,
            pre_dnat,
            forward,
            prof,
        } => Payload::HostEndpointUpdate(HostEndpointUpdate {
            id: Some(HostEndpointId {
                endpoint_id: format!("hep-{id}"),
            }),
            endpoint: Some(HostEndpoint {
                name: HEP_NAMES[name as usize].into(),
                profile_ids: profiles(prof),
                tiers: tiers(ing, 0),
                untracked_tiers: tiers(untracked, untracked),
                pre_dnat_tiers: tiers(pre_dnat, 0),
                forward_tiers: tiers(forward, forward),
                expected_ipv4_addrs: vec!["10.9.0.1".into()],
                ..Default::default()
            }),
        }),
        Op::HepRemove(id) => Payload::HostEndpointRemove(HostEndpointRemove {
            id: Some(HostEndpointId {
                endpoint_id: format!("hep-{id}"),
            }),
        }),
        Op::Policy(i, v) => Payload::ActivePolicyUpdate(ActivePolicyUpdate {
            id: Some(pid(i)),
            policy: Some(Policy {
                inbound_rules: rules(v),
                outbound_rules: rules(v + 1),
                ..Default::default()
            }),
        }),
        Op::PolicyRemove(i) => Payload::ActivePolicyRemove(ActivePolicyRemove { id: Some(pid(i)) }),
        Op::Profile(i, v) => Payload::ActiveProfileUpdate(ActiveProfileUpdate {
            id: Some(ProfileId {
                name: format!("prof-{i}"),
            }),
            profile: Some(Profile {
                inbound_rules: rules(v),
                outbound_rules: rules(v + 2),
            }),
        }),
        Op::ProfileRemove(i) => Payload::ActiveProfileRemove(ActiveProfileRemove {
            id: Some(ProfileId {
                name: format!("prof-{i}"),
            }),
        }),
        Op::IpSet(i, mask) => Payload::IpsetUpdate(IpSetUpdate {
            id: format!("s:{i}"),
            members: members(i, mask),
            r#type: match i {
                1 => IpSetType::Net as i32,
                2 => IpSetType::IpAndPort as i32,
                _ => IpSetType::Ip as i32,
            },
        }),
        Op::IpSetDelta(i, add, remove) => Payload::IpsetDeltaUpdate(IpSetDeltaUpdate {
            id: format!("s:{i}"),
            added_members: members(i, add),
            removed_members: members(i, remove),
        }),
        Op::IpSetRemove(i) => Payload::IpsetRemove(IpSetRemove {
            id: format!("s:{i}"),
        }),
        Op::Pool(i, masq) => Payload::IpamPoolUpdate(IpamPoolUpdate {
            id: format!("pool-{i}"),
            pool: Some(IpamPool {
                cidr: ["10.65.0.0/16", "fd65::/64"][i as usize].into(),
                masquerade: masq,
                ..Default::default()
            }),
        }),
        Op::PoolRemove(i) => Payload::IpamPoolRemove(IpamPoolRemove {
            id: format!("pool-{i}"),
        }),
        Op::HostMeta(i, a) => Payload::HostMetadataUpdate(HostMetadataUpdate {
            hostname: format!("node-{i}"),
            ipv4_addr: format!("192.168.1.{}", a + 1),
            ..Default::default()
        }),
        Op::Vtep(i, a) => Payload::VtepUpdate(VxlanTunnelEndpointUpdate {
            node: format!("node-{i}"),
            mac: format!("66:00:00:00:00:{i:02x}"),
            ipv4_addr: format!("10.65.{i}.0"),
            parent_device_ip: format!("192.168.2.{}", 2 * a + 1),
            ..Default::default()
        }),
        Op::VtepRemove(i) => Payload::VtepRemove(VxlanTunnelEndpointRemove {
            node: format!("node-{i}"),
        }),
        Op::Merge => {
            dp.request_side_merge();
            return;
        }
        Op::Addrs(i, a) => {
            let addrs: BTreeSet<ipnet::IpNet> = HOST_ADDRS[..=a as usize]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
            dp.on_iface(&IfaceEvent::Addrs {
                index: u32::from(i) + 2,
                name: format!("eth{i}"),
                addrs,
            });
            return;
        }
    };
    // A rejected update changes nothing; the comparison below holds either way.
    let _ = dp.on_update(&msg(m));
}

fn differences(got: &[Table], want: &[Table]) -> Vec<String> {
    let mut out = Vec::new();
    if got.len() != want.len() {
        out.push(format!("{} tables, want {}", got.len(), want.len()));
    }
    for (g, w) in got.iter().zip(want) {
        let names = |t: &Table| -> BTreeSet<String> {
            t.chains
                .keys()
                .map(|c| format!("chain {c}"))
                .chain(t.sets.keys().map(|s| format!("set {s}")))
                .collect()
        };
        for n in names(g).union(&names(w)) {
            let same = match n.split_once(' ') {
                Some(("chain", c)) => g.chains.get(c) == w.chains.get(c),
                Some((_, s)) => g.sets.get(s) == w.sets.get(s),
                None => true,
            };
            if !same {
                out.push(format!("{} {}: {n}", g.family.name(), g.name));
            }
        }
    }
    out
}

/// The full render of the dataplane's model with the incremental renderer's placement.
fn oracle(dp: &Dataplane) -> Vec<Table> {
    let (side, lingering) = dp.side_placement();
    felix_nft_rules::render_placed(&dp.render_model(), &side, &lingering).unwrap()
}

fn check(dp: &mut Dataplane, store: &mut Vec<Table>) -> Result<(), TestCaseError> {
    let patches = dp.tables_patch();
    TablePatch::fold_all(patches, store);
    let diffs = differences(store, &oracle(dp));
    prop_assert!(diffs.is_empty(), "incremental != full render: {diffs:#?}");
    let dangling = dangling_refs(store);
    prop_assert!(
        dangling.is_empty(),
        "rules name absent sets or chains: {dangling:#?}"
    );
    Ok(())
}

/// The `table/chain → set or chain` references of rules (lookups, jumps and gotos) whose
/// target is not in their table (the kernel would refuse the transaction).
fn dangling_refs(tables: &[Table]) -> Vec<String> {
    let mut out = Vec::new();
    for t in tables {
        for c in t.chains.values() {
            for r in &c.rules {
                for e in r.exprs.iter() {
                    let missing = match e {
                        Expr::Lookup { set, .. } => (!t.sets.contains_key(set)).then_some(set),
                        Expr::Verdict(Verdict::Jump(to) | Verdict::Goto(to)) => {
                            (!t.chains.contains_key(to)).then_some(to)
                        }
                        _ => None,
                    };
                    if let Some(to) = missing {
                        out.push(format!("{} {}/{} → {to}", t.family.name(), t.name, c.name));
                    }
                }
            }
        }
    }
    out
}

/// Applies `ops` to `dp` in order.
fn apply_all(dp: &mut Dataplane, ops: &[Op]) {
    for op in ops {
        apply(dp, op);
    }
}

/// A dataplane without a side table after `ops`.
fn dataplane_after(ops: &[Op]) -> Dataplane {
    let mut dp = dataplane(0);
    apply_all(&mut dp, ops);
    dp
}

/// A dataplane whose side table holds at most `side` endpoints (0: no side table).
fn dataplane(side: usize) -> Dataplane {
    let mut cfg = DataplaneConfig::default();
    cfg.rules.side_table_size = side;
    cfg.rules.hostname = "node-0".into();
    cfg.overlay.hostname = "node-0".into();
    Dataplane::new(cfg, 1).unwrap()
}

fn side_size() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), Just(2), Just(256)]
}

/// A run of updates: one to `max_ops` operations, applied so many at a time, on a dataplane
/// with a side table of this size.
fn runs(max_ops: usize) -> impl Strategy<Value = (Vec<Op>, usize, usize)> {
    (
        proptest::collection::vec(op(), 1..max_ops),
        1usize..4,
        side_size(),
    )
}

/// Applies `ops` to `dp` `batch` at a time (the loop records several updates before one
/// apply) and calls `after` after each batch.
fn in_batches(
    dp: &mut Dataplane,
    ops: &[Op],
    batch: usize,
    mut after: impl FnMut(&mut Dataplane) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    for chunk in ops.chunks(batch) {
        for op in chunk {
            apply(dp, op);
        }
        after(dp)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn incremental_equals_full_render_after_every_step((ops, batch, side) in runs(40)) {
        let mut dp = dataplane(side);
        let mut store = Vec::new();
        check(&mut dp, &mut store)?;
        in_batches(&mut dp, &ops, batch, |dp| check(dp, &mut store))?;
        // Nothing changed: nothing to patch.
        prop_assert!(dp.tables_patch().is_empty());
    }
}

#[test]
fn a_member_delta_patches_only_its_set() {
    let mut dp = dataplane_after(&[
        Op::Policy(0, 2),
        Op::IpSet(0, 0b11),
        wep_with_profile(0, 1, 1, 1),
    ]);
    let first = dp.tables_patch();
    assert!(first.iter().map(|p| p.chains.len()).sum::<usize>() > 20);
    // Adds 192.168.0.1 and fd00::1, removes 10.0.0.1: both families change.
    apply(&mut dp, &Op::IpSetDelta(0, 0b10_1000, 0b1));
    let p = dp.tables_patch();
    assert_eq!(p.len(), 2, "{p:?}");
    for t in &p {
        assert!(t.chains.is_empty(), "{t:?}");
        if t.family.name() == "ip" {
            // The set's elements change, one each: the set is not re-sent whole.
            assert!(t.sets.is_empty(), "{t:?}");
            assert_eq!(t.elements.len(), 1, "{t:?}");
            let d = t.elements.values().next().expect("one delta");
            assert_eq!((d.add.len(), d.del.len()), (1, 1), "{t:?}");
        } else {
            // Its first IPv6 member: the set comes into the IPv6 table, with that member.
            assert!(t.elements.is_empty(), "{t:?}");
            let s = t.sets.get("cali60s-0").and_then(|s| s.as_ref());
            assert_eq!(s.map(|s| s.elements.len()), Some(1), "{t:?}");
        }
    }
    // A member added and removed again before an apply: a delete of what is not there,
    // which the reconciler drops.
    apply(&mut dp, &Op::IpSetDelta(0, 0b1, 0));
    apply(&mut dp, &Op::IpSetDelta(0, 0, 0b1));
    let p = dp.tables_patch();
    assert!(
        p.iter().all(|t| t.chains.is_empty() && t.sets.is_empty()),
        "{p:?}"
    );
    assert!(
        p.iter()
            .flat_map(|t| t.elements.values())
            .all(|d| d.add.is_empty()),
        "{p:?}"
    );
    // An endpoint whose policy list is unchanged re-renders its own chains and the base only.
    apply(&mut dp, &wep_with_profile(1, 1, 1, 1));
    let p = dp.tables_patch();
    for t in &p {
        assert!(
            t.chains.keys().all(|c| !c.contains("pol-")),
            "policy chains re-rendered: {:?}",
            t.chains.keys().collect::<Vec<_>>()
        );
        // The dispatch maps change by one element each, not whole.
        assert!(
            t.sets.keys().all(|s| !s.contains("dispatch")),
            "{:?}",
            t.sets.keys().collect::<Vec<_>>()
        );
        assert_eq!(t.elements.len(), 2, "{:?}", t.elements);
        assert!(t
            .elements
            .values()
            .all(|d| d.add.len() == 1 && d.del.is_empty()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The same sequences through the reconciler into the fake kernel (which checks references
    /// like the kernel: no chain deleted while a map element or rule points at it, no element
    /// for a missing set): each batch of patches commits, and the kernel then holds exactly
    /// the full render — while the reconciler only ever diffed what the patches named.
    #[test]
    fn patches_through_the_reconciler_converge_the_kernel((ops, batch, side) in runs(30)) {
        use nf_tables::diff::canonical_table;
        use nf_tables::reconcile::{FakeNft, TableOwnership, Reconciler, SyncOptions};
        let mut dp = dataplane(side);
        let mut rec = Reconciler::new(
            FakeNft::default(),
            SyncOptions { ownership: TableOwnership::Off, ..SyncOptions::default() },
        );
        rec.apply_patches(dp.tables_patch()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        in_batches(&mut dp, &ops, batch, |dp| {
            rec.apply_patches(dp.tables_patch()).map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
            let want = oracle(dp);
            for w in &want {
                let got = &rec.kernel.tables[&(w.family, w.name.clone())];
                let (g, w) = (canonical_table(got), canonical_table(w));
                prop_assert!(g == w, "kernel differs: {:#?}", differences(std::slice::from_ref(&g), std::slice::from_ref(&w)));
            }
            Ok(())
        })?;
        let tables = if side > 0 { 4 } else { 2 };
        prop_assert_eq!(rec.kernel.reads, tables, "one read at the start (one per table), none after");
    }
}

fn wep(id: u8, ing: u8, eg: u8) -> Op {
    wep_with_profile(id, ing, eg, 0)
}

/// An active endpoint `id` on interface `id` with ingress, egress and profile variants `ing`,
/// `eg` and `prof`.
fn wep_with_profile(id: u8, ing: u8, eg: u8, prof: u8) -> Op {
    Op::Wep {
        id,
        iface: id,
        active: true,
        ing,
        eg,
        prof,
        spoof: false,
    }
}

fn names(ifaces: &[u8]) -> BTreeSet<String> {
    ifaces.iter().map(|i| format!("cali{i}")).collect()
}

/// Checks that the main tables of `after` only lost objects or elements relative to `before`
/// (the hand-off set may grow): no chain, rule, set or element added or changed, so the commit
/// that made the change did not re-validate them.
fn main_only_lost(before: &[Table], after: &[Table]) {
    for a in after.iter().filter(|t| t.name == felix_nft_rules::OWNER) {
        let b = before
            .iter()
            .find(|b| b.family == a.family && b.name == a.name)
            .expect("main table before");
        for (name, c) in &a.chains {
            assert_eq!(
                Some(c),
                b.chains.get(name),
                "main chain {name} added or changed"
            );
        }
        for (name, s) in &a.sets {
            if name == "filter-cali-wl-side" {
                continue;
            }
            let old = b.sets.get(name).expect("main set added");
            assert!(
                s.elements.iter().all(|e| old.elements.contains(e)),
                "main set {name} gained elements"
            );
        }
    }
}

/// The side table's whole life: after the first render the main table only loses objects and
/// lists hand-offs (no rule or verdict-map element is ever added to it, so no commit
/// re-validates it); a changed policy moves its main-table users out; a merge brings
/// everything back in two steps, main first.
#[test]
fn main_only_loses_objects_until_a_merge_brings_them_back() {
    let mut dp = dataplane(256);
    let mut store = Vec::new();
    let is_main = |p: &&TablePatch| p.name == felix_nft_rules::OWNER;
    let is_side = |p: &&TablePatch| p.name == felix_nft_rules::SIDE_TABLE;
    // Policy 0 (variant 2) uses IP sets s:0 and s:1; three endpoints use it or policy 1.
    apply_all(
        &mut dp,
        &[
            Op::IpSet(0, 0b11),
            Op::IpSet(1, 0b100),
            Op::IpSet(2, 0b1),
            Op::Policy(0, 2),
            Op::Policy(1, 0),
            wep(0, 0b01, 0b10),
            wep(1, 0b01, 0b01),
            wep(2, 0b10, 0b10),
        ],
    );
    check(&mut dp, &mut store).unwrap();
    assert!(!dp.side_pending());

    // A new endpoint: main gets one element of its hand-off set, nothing else.
    apply(&mut dp, &wep(3, 0b01, 0b01));
    let p = dp.tables_patch();
    for t in p.iter().filter(is_main) {
        assert!(t.sets.is_empty(), "{t:#?}");
        let keys: Vec<&String> = t.elements.keys().collect();
        assert_eq!(keys, ["filter-cali-wl-side"], "{t:#?}");
        assert_eq!(t.elements["filter-cali-wl-side"].add.len(), 1);
    }
    // The side table gets the endpoint's chains, policy 0's chain and the IP sets it uses
    // (not s:2, which no side policy uses), in the family they have members of (IPv4).
    for t in p.iter().filter(is_side) {
        let chains: Vec<&String> = t.chains.keys().collect();
        assert!(chains.iter().any(|c| c.contains("-cali-tw-")), "{chains:?}");
        assert!(chains.iter().any(|c| c.contains("pol-0")), "{chains:?}");
        let sets: Vec<&String> = t.sets.keys().collect();
        let v4 = t.family.name() == "ip";
        assert_eq!(sets.iter().any(|s| s.ends_with("s-0")), v4, "{sets:?}");
        assert_eq!(sets.iter().any(|s| s.ends_with("s-1")), v4, "{sets:?}");
        assert!(!sets.iter().any(|s| s.ends_with("s-2")), "{sets:?}");
    }
    let before = store.clone();
    TablePatch::fold_all(p, &mut store);
    main_only_lost(&before, &store);
    assert!(differences(&store, &oracle(&dp)).is_empty());
    assert_eq!(dp.side_placement().0, names(&[3]));

    // Policy 0 changes: its main users (0 and 1) move out; main only loses and lists.
    apply(&mut dp, &Op::Policy(0, 1));
    let before = store.clone();
    TablePatch::fold_all(dp.tables_patch(), &mut store);
    main_only_lost(&before, &store);
    assert!(differences(&store, &oracle(&dp)).is_empty());
    assert_eq!(dp.side_placement().0, names(&[0, 1, 3]));
    let main_ip = |s: &[Table]| s.iter().find(|t| t.name == felix_nft_rules::OWNER).cloned();
    let listed = main_ip(&store).unwrap().sets["filter-cali-wl-side"]
        .elements
        .len();
    assert_eq!(listed, 3);

    // Merge, step 1: main gets them back; the side copies stay (nothing leaves the side table).
    let sides = |s: &[Table]| -> Vec<Table> {
        s.iter()
            .filter(|t| t.name == felix_nft_rules::SIDE_TABLE)
            .cloned()
            .collect()
    };
    dp.request_side_merge();
    let before = store.clone();
    TablePatch::fold_all(dp.tables_patch(), &mut store);
    assert_eq!(
        sides(&before),
        sides(&store),
        "step 1 leaves the side table alone"
    );
    assert!(differences(&store, &oracle(&dp)).is_empty());
    assert_eq!(dp.side_placement(), (BTreeSet::new(), names(&[0, 1, 3])));
    let listed = main_ip(&store).unwrap().sets["filter-cali-wl-side"]
        .elements
        .len();
    assert_eq!(listed, 0, "nothing handed off any more");
    // Step 2: the copies go; main is untouched.
    dp.request_side_merge();
    let p = dp.tables_patch();
    let before = store.clone();
    for t in p.iter().filter(is_side) {
        assert!(
            t.chains.values().all(Option::is_none),
            "{:?}",
            t.chains.keys()
        );
    }
    TablePatch::fold_all(p, &mut store);
    let mains = |s: &[Table]| -> Vec<Table> {
        s.iter()
            .filter(|t| t.name == felix_nft_rules::OWNER)
            .cloned()
            .collect()
    };
    assert_eq!(mains(&before), mains(&store), "step 2 leaves main alone");
    assert!(differences(&store, &oracle(&dp)).is_empty());
    assert!(!dp.side_pending());
    // Nothing to merge: nothing to patch.
    dp.request_side_merge();
    assert!(dp.tables_patch().is_empty());
}

/// An endpoint whose policies name more IP set members than the main table has workload
/// interfaces goes straight to main: copying the members into the side table would cost the
/// kernel more than validating main once. The same endpoint with a small set goes to the side
/// table.
#[test]
fn an_endpoint_whose_sets_outweigh_main_goes_to_main() {
    for (size, to_side) in [(2usize, true), (300, false)] {
        let mut dp = dataplane(256);
        let mut store = Vec::new();
        // Policy 0 (variant 2) uses IP sets s:0 and s:1.
        let big = IpSetUpdate {
            id: "s:0".into(),
            members: (0..size)
                .map(|i| format!("10.77.{}.{}", i / 250, i % 250 + 1))
                .collect(),
            r#type: IpSetType::Ip as i32,
        };
        dp.on_update(&msg(Payload::IpsetUpdate(big))).unwrap();
        apply_all(
            &mut dp,
            &[
                Op::IpSet(1, 0b100),
                Op::Policy(0, 2),
                wep(0, 0b01, 0),
                wep(1, 0b01, 0),
            ],
        );
        check(&mut dp, &mut store).unwrap();

        apply(&mut dp, &wep(2, 0b01, 0));
        let p = dp.tables_patch();
        let main_dispatch = p
            .iter()
            .filter(|t| t.name == felix_nft_rules::OWNER)
            .any(|t| t.elements.keys().any(|k| k.contains("wl-dispatch")));
        let side_sets = p
            .iter()
            .filter(|t| t.name == felix_nft_rules::SIDE_TABLE)
            .any(|t| !t.sets.is_empty());
        assert_eq!(
            dp.side_placement().0 == names(&[2]),
            to_side,
            "{size} members"
        );
        assert_eq!(main_dispatch, !to_side, "{size} members: {p:#?}");
        assert_eq!(side_sets, to_side, "{size} members");
        TablePatch::fold_all(p, &mut store);
        assert!(differences(&store, &oracle(&dp)).is_empty());
    }
}

/// An endpoint whose policies would copy more IP set members into the side table than one
/// validation of the main table costs goes to the main table instead.
#[test]
fn an_endpoint_that_would_copy_big_sets_goes_to_main() {
    let mut dp = dataplane(256);
    let mut store = Vec::new();
    let big: Vec<String> = (0..9000u32)
        .map(|i| std::net::Ipv4Addr::from(0x0a40_0000 + i).to_string())
        .collect();
    dp.on_update(&msg(Payload::IpsetUpdate(IpSetUpdate {
        id: "s:0".into(),
        members: big,
        r#type: IpSetType::Ip as i32,
    })))
    .unwrap();
    apply_all(
        &mut dp,
        &[
            Op::IpSet(1, 0b1),
            Op::Policy(0, 2),
            Op::Policy(1, 0),
            wep(0, 0b01, 0),
        ],
    );
    check(&mut dp, &mut store).unwrap();
    apply(&mut dp, &wep(1, 0b01, 0));
    check(&mut dp, &mut store).unwrap();
    assert!(!dp.side_pending(), "{:?}", dp.side_placement());
    let main = store
        .iter()
        .find(|t| t.name == felix_nft_rules::OWNER)
        .unwrap();
    let tw = Renderer::workload_chain_of(main, "cali1", true).expect("cali1 dispatched in main");
    assert!(main.chains.contains_key(tw));
    // One whose policy uses no big set still goes to the side table.
    apply(&mut dp, &wep(2, 0, 0b10));
    check(&mut dp, &mut store).unwrap();
    assert_eq!(dp.side_placement().0, names(&[2]));
}

/// Endpoints whose chains would have the same body share one chain (named by its content),
/// whether they arrive in one render or one at a time; a body that changes for one endpoint
/// moves only that endpoint to another chain, and a chain nobody uses any more goes.
#[test]
fn endpoints_with_the_same_policies_share_one_chain() {
    let mut dp = dataplane_after(&[Op::Policy(0, 2), Op::Policy(1, 0), wep(0, 0b01, 0b10)]);
    let mut store = Vec::new();
    check(&mut dp, &mut store).unwrap();
    apply(&mut dp, &wep(1, 0b01, 0b10));
    check(&mut dp, &mut store).unwrap();
    let chain_of = |tables: &[Table], i: &str, to: bool| {
        let main = tables
            .iter()
            .find(|t| t.name == felix_nft_rules::OWNER)
            .unwrap();
        let c = Renderer::workload_chain_of(main, i, to)
            .unwrap()
            .to_string();
        assert!(main.chains.contains_key(&c), "{c}");
        c
    };
    let endpoint_chains = |tables: &[Table]| {
        let main = tables
            .iter()
            .find(|t| t.name == felix_nft_rules::OWNER)
            .unwrap();
        main.chains
            .keys()
            .filter(|c| c.contains("-cali-tw-") || c.contains("-cali-fw-"))
            .count()
    };
    for tables in [store.clone(), dp.render_tables().unwrap()] {
        for to in [true, false] {
            assert_eq!(
                chain_of(&tables, "cali0", to),
                chain_of(&tables, "cali1", to)
            );
        }
        assert_eq!(
            endpoint_chains(&tables),
            2,
            "one tw and one fw chain for both"
        );
    }
    // cali1's ingress policy changes: it moves to a chain of its own; cali0 stays.
    let shared_tw = chain_of(&store, "cali0", true);
    apply(&mut dp, &wep(1, 0b10, 0b10));
    check(&mut dp, &mut store).unwrap();
    assert_eq!(chain_of(&store, "cali0", true), shared_tw);
    assert_ne!(chain_of(&store, "cali1", true), shared_tw);
    assert_eq!(
        chain_of(&store, "cali0", false),
        chain_of(&store, "cali1", false)
    );
    assert_eq!(endpoint_chains(&store), 3);
    // cali0 goes: its chain, used by nobody now, goes too.
    apply(&mut dp, &Op::WepRemove(0));
    check(&mut dp, &mut store).unwrap();
    let main = store
        .iter()
        .find(|t| t.name == felix_nft_rules::OWNER)
        .unwrap();
    assert!(!main.chains.contains_key(&shared_tw));
    assert_eq!(endpoint_chains(&store), 2);
}

/// A state document's messages move into the model (`Model::apply_owned`, the one-shot path):
/// the model is the one copying them gives (`Model::apply_parsed`, the daemon's path).
#[test]
fn moving_messages_into_the_model_equals_copying_them() {
    use felix_nft_rules::{Members, Model, RulesConfig};
    let text = include_str!("../../../felix-api/tests/fixtures/to_dataplane.jsonl");
    let (mut copied, mut moved) = (
        Model::new(RulesConfig::default()),
        Model::new(RulesConfig::default()),
    );
    let mut kinds = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let m: ToDataplane = felix_api::json::decode(line).expect("fixture decodes");
        // IP set members as validation hands them over, for one path and the other.
        let members = match &m.payload {
            Some(Payload::IpsetUpdate(u)) => IpSetType::try_from(u.r#type)
                .ok()
                .and_then(|k| Members::try_parse(k, &u.members).ok()),
            _ => None,
        };
        if let Some(p) = &m.payload {
            kinds.insert(format!("{p:?}").split('(').next().unwrap_or("").to_string());
        }
        copied.apply_parsed(&m, members.clone());
        moved.apply_owned(m, members);
        assert_eq!(moved, copied, "after {line}");
    }
    for k in [
        "ActivePolicyUpdate",
        "WorkloadEndpointUpdate",
        "IpsetUpdate",
        "HostEndpointUpdate",
    ] {
        assert!(kinds.contains(k), "the fixture has no {k}: {kinds:?}");
    }
}

/// The rules of policy `pol-0`'s inbound chain in the table of `family`, as text; `None`
/// when the table has no such chain (none of its rules is rendered in the family).
fn pol0_inbound(tables: &[Table], family: &str) -> Option<Vec<String>> {
    let t = main_table(tables, family);
    let c = t
        .chains
        .values()
        .find(|c| c.name.starts_with("filter-cali-pi-") && c.name.contains("pol-0"))?;
    Some(c.rules.iter().map(|r| format!("{:?}", r.exprs)).collect())
}

/// Whether a chain of the main table of `family` jumps to one of policy `pol-0`'s chains.
fn jumps_to_pol0(tables: &[Table], family: &str) -> bool {
    main_table(tables, family).chains.values().any(|c| {
        c.rules.iter().any(|r| {
            r.exprs
                .iter()
                .any(|e| matches!(e, Expr::Verdict(Verdict::Jump(to)) if to.contains("pol-0")))
        })
    })
}

fn main_table<'t>(tables: &'t [Table], family: &str) -> &'t Table {
    tables
        .iter()
        .find(|t| t.family.name() == family && t.name == felix_nft_rules::OWNER)
        .expect("main table")
}

#[test]
fn a_set_gaining_its_first_member_of_a_family_brings_its_rules_into_that_family() {
    // pol-0 inbound: allow from s:0 unless to s:1. s:0 holds IPv4 addresses only, s:1 nothing.
    // The sets come first: a policy naming a set Felix has not sent is refused.
    let mut dp = dataplane_after(&[
        Op::IpSet(0, 0b11),
        Op::IpSet(1, 0),
        Op::Policy(0, 2),
        wep(0, 1, 0),
    ]);
    let mut store = Vec::new();
    check(&mut dp, &mut store).unwrap();
    let has = |rules: &[String], set: &str| rules.iter().any(|r| r.contains(set));
    // IPv4: the rule, with s:1's negation left out (nothing is in an empty set). IPv6: no
    // packet is in s:0, so no rule.
    let v4 = pol0_inbound(&store, "ip").expect("pol-0 in IPv4");
    assert!(has(&v4, "cali40s-0") && !has(&v4, "cali40s-1"), "{v4:#?}");
    // IPv6: no chain, and no jump to one from the endpoint's chain.
    assert_eq!(pol0_inbound(&store, "ip6"), None);
    assert!(jumps_to_pol0(&store, "ip") && !jumps_to_pol0(&store, "ip6"));
    // A set is in the tables of the families it has members of, and only there.
    let sets_of = |store: &[Table], family: &str| -> Vec<String> {
        store
            .iter()
            .filter(|t| t.family.name() == family && t.name == felix_nft_rules::OWNER)
            .flat_map(|t| t.sets.keys().filter(|n| n.contains("0s-")).cloned())
            .collect()
    };
    assert_eq!(sets_of(&store, "ip"), ["cali40s-0"]);
    assert!(sets_of(&store, "ip6").is_empty());

    // s:0 gains an IPv6 member: the rule comes into the IPv6 chain in the same patch.
    apply(&mut dp, &Op::IpSetDelta(0, 0b1000, 0));
    check(&mut dp, &mut store).unwrap();
    let v6 = pol0_inbound(&store, "ip6").expect("pol-0 in IPv6");
    assert!(has(&v6, "cali60s-0"), "{v6:#?}");
    assert!(jumps_to_pol0(&store, "ip6"));
    assert_eq!(sets_of(&store, "ip6"), ["cali60s-0"]);
    // s:1 gains an IPv4 member: its negation comes into the IPv4 rule.
    apply(&mut dp, &Op::IpSet(1, 0b100));
    check(&mut dp, &mut store).unwrap();
    assert!(has(
        &pol0_inbound(&store, "ip").unwrap_or_default(),
        "cali40s-1"
    ));
    assert_eq!(sets_of(&store, "ip"), ["cali40s-0", "cali40s-1"]);
    // And they go again when the sets lose those members.
    apply(&mut dp, &Op::IpSetDelta(0, 0, 0b1000));
    apply(&mut dp, &Op::IpSet(1, 0));
    check(&mut dp, &mut store).unwrap();
    assert_eq!(pol0_inbound(&store, "ip6"), None);
    assert!(!jumps_to_pol0(&store, "ip6"));
    assert!(!has(
        &pol0_inbound(&store, "ip").unwrap_or_default(),
        "cali40s-1"
    ));
    assert_eq!(sets_of(&store, "ip"), ["cali40s-0"]);
    assert!(sets_of(&store, "ip6").is_empty());
}

/// An endpoint's chain in a family leaves out the jumps to policies with no rule there (here
/// pol-0's egress: IPv4 nets only), and follows a policy arriving, changing and going; a down
/// endpoint's chain (one deny) references no policy and keeps its name whatever they hold.
#[test]
fn endpoint_chains_follow_which_policies_have_rules_in_a_family() {
    for active in [true, false] {
        let mut dp = dataplane(0);
        let mut store = Vec::new();
        let wep = Op::Wep {
            id: 0,
            iface: 0,
            active,
            ing: 0,
            eg: 0b101,
            prof: 0,
            spoof: false,
        };
        // A policy not received yet is jumped to in both families: its stand-in denies.
        let steps = [
            (wep, active, active),
            (Op::IpSet(2, 0b1), active, active),
            (Op::Policy(0, 0), active, false),
            (Op::Policy(2, 0), active, false),
            // Egress rules of both families now (variant 3's outbound is variant 4's rules).
            (Op::Policy(0, 3), active, active),
            (Op::Policy(0, 0), active, false),
            (Op::PolicyRemove(0), active, active),
        ];
        for (op, v4, v6) in steps {
            apply(&mut dp, &op);
            check(&mut dp, &mut store).unwrap_or_else(|e| panic!("after {op:?}: {e}"));
            let jumps = (jumps_to_pol0(&store, "ip"), jumps_to_pol0(&store, "ip6"));
            assert_eq!(jumps, (v4, v6), "active {active}, after {op:?}");
        }
    }
}
