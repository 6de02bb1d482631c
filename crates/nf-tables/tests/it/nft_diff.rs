//! Diff, batch and reconciler tests without privilege: the fake kernel applies plans with the
//! kernel's referential checks, so "applying diff(desired, actual) to actual gives desired" is
//! checked for random pairs of states.

use crate::nft_fixtures;

use std::collections::BTreeMap;

use nf_tables::batch::Batch;
use nf_tables::codec::{self, Object};
use nf_tables::consts::*;
use nf_tables::diff::{self, canonical_table, Op};
use nf_tables::model::*;
use nf_tables::reconcile::{self, FakeNft, NftKernel, SyncOptions, TableOwnership};
use nft_fixtures::{ifname_element, ifname_vmap, ipv4_set, load_ip_saddr};
use proptest::prelude::*;

fn v4(a: u8, b: u8, c: u8, d: u8) -> Vec<u8> {
    vec![a, b, c, d]
}

fn start(k: Vec<u8>) -> Element {
    Element {
        key: k.into(),
        key_end: None,
        flags: 0,
        data: None,
    }
}

fn end(k: Vec<u8>) -> Element {
    Element {
        flags: elem_flags::INTERVAL_END,
        ..start(k)
    }
}

/// Interval elements in order from `FROM-TO` strings of IPv4 addresses: a START element at FROM
/// and an END element at TO, either left out when empty (`FROM-` runs to the top of the space).
fn ipv4_intervals(spec: &[&str]) -> Vec<Element> {
    let key = |a: &str| a.parse::<std::net::Ipv4Addr>().unwrap().octets().to_vec();
    let mut elements = Vec::new();
    for s in spec {
        let (from, to) = s.split_once('-').expect("FROM-TO");
        if !from.is_empty() {
            elements.push(start(key(from)));
        }
        if !to.is_empty() {
            elements.push(end(key(to)));
        }
    }
    elements
}

/// Sync options that claim no table ownership.
fn unowned() -> SyncOptions {
    SyncOptions {
        ownership: TableOwnership::Off,
        ..Default::default()
    }
}

fn interval_set(name: &str, elements: Vec<Element>) -> Set {
    Set {
        counter: false,
        counters: Default::default(),
        name: name.into(),
        key: vec![DataType::Ipv4Addr],
        flags: set_flags::INTERVAL,
        data: None,
        size: None,
        elements,
    }
}

#[test]
fn overlapping_and_adjacent_intervals_are_merged() {
    // 10.0.0.0/8 + 10.1.0.0/16 (contained) + 11.0.0.0/8 (adjacent) + 192.168.0.0/24,
    // plus nft's leading 0.0.0.0 END which bounds nothing.
    let normalized = |name: &str, spec: &[&str]| {
        diff::normalize_elements(&interval_set(name, ipv4_intervals(spec)))
    };
    assert_eq!(
        normalized(
            "s",
            &[
                "-0.0.0.0",
                "10.1.0.0-10.2.0.0",
                "10.0.0.0-11.0.0.0",
                "11.0.0.0-12.0.0.0",
                "192.168.0.0-192.168.1.0",
            ]
        ),
        ipv4_intervals(&["10.0.0.0-12.0.0.0", "192.168.0.0-192.168.1.0"])
    );
    // A range to the top of the space has no END element.
    assert_eq!(
        normalized("t", &["200.0.0.0-", "0.0.0.0-1.0.0.0"]),
        ipv4_intervals(&["0.0.0.0-1.0.0.0", "200.0.0.0-"])
    );
}

#[test]
fn removing_a_contained_cidr_while_its_cover_stays_is_a_no_op() {
    // Felix's interval merge: desired {10/8}; actual {10/8 merged with 10.1/16} = {10/8}.
    let mut t = Table::new(Family::Ip, "calico");
    t.sets.insert(
        "s".into(),
        interval_set(
            "s",
            diff::interval_elements([
                (v4(10, 0, 0, 0), Some(v4(11, 0, 0, 0))),
                (v4(10, 1, 0, 0), Some(v4(10, 2, 0, 0))),
            ]),
        ),
    );
    let mut desired = t.clone();
    desired.sets.get_mut("s").unwrap().elements =
        diff::interval_elements([(v4(10, 0, 0, 0), Some(v4(11, 0, 0, 0)))]);
    assert!(diff::diff(&desired, Some(&t), false).is_empty());
}

#[test]
fn a_changed_interval_is_removed_and_readded_whole() {
    let mut a = Table::new(Family::Ip, "calico");
    a.sets.insert(
        "s".into(),
        interval_set("s", vec![start(v4(10, 0, 0, 0)), end(v4(11, 0, 0, 0))]),
    );
    let mut d = a.clone();
    d.sets.get_mut("s").unwrap().elements = vec![start(v4(10, 0, 0, 0)), end(v4(10, 128, 0, 0))];
    let p = diff::diff(&d, Some(&a), false);
    assert_eq!(
        p.ops,
        vec![
            Op::DelElements {
                set: "s".into(),
                elements: vec![start(v4(10, 0, 0, 0)), end(v4(11, 0, 0, 0))]
            },
            Op::AddElements {
                set: "s".into(),
                elements: vec![start(v4(10, 0, 0, 0)), end(v4(10, 128, 0, 0))]
            },
        ]
    );
}

fn rule(v: Verdict, comment: &str, packets: u64) -> Rule {
    Rule {
        exprs: vec![
            Expr::Counter {
                packets,
                bytes: packets * 60,
            },
            Expr::Verdict(v),
        ]
        .into(),
        comment: Some(comment.into()),
        handle: Some(packets),
    }
}

#[test]
fn counters_and_handles_are_not_differences_and_empty_diff_sends_nothing() {
    let mut d = Table::new(Family::Ip, "calico");
    let mut c = Chain::regular("c");
    c.rules.push(rule(Verdict::Accept, "cali:a", 0));
    d.chains.insert("c".into(), c);
    let mut a = d.clone();
    a.chains.get_mut("c").unwrap().rules[0] = rule(Verdict::Accept, "cali:a", 12345);
    assert!(diff::diff(&d, Some(&a), false).is_empty());
    let mut k = FakeNft::default();
    k.tables.insert((Family::Ip, "calico".into()), a);
    let rep = reconcile::sync(&mut k, &[d], &unowned()).unwrap();
    assert_eq!(rep.ops, 0);
    assert_eq!(k.commits, 0);
}

#[test]
fn a_chain_whose_rules_differ_is_flushed_and_rewritten_and_order_is_references_first() {
    let mut a = Table::new(Family::Ip, "calico");
    let mut old = Chain::regular("old");
    old.rules
        .push(rule(Verdict::Jump("gone".into()), "cali:j", 0));
    a.chains.insert("old".into(), old);
    let mut gone = Chain::regular("gone");
    gone.rules.push(rule(Verdict::Drop, "cali:d", 0));
    a.chains.insert("gone".into(), gone);
    let mut keep = Chain::regular("keep");
    keep.rules
        .push(rule(Verdict::Jump("gone".into()), "cali:k", 0));
    a.chains.insert("keep".into(), keep);
    a.sets
        .insert("unused".into(), interval_set("unused", vec![]));

    let mut d = Table::new(Family::Ip, "calico");
    let mut keep = Chain::regular("keep");
    keep.rules.push(rule(Verdict::Accept, "cali:k2", 0));
    d.chains.insert("keep".into(), keep);
    let p = diff::diff(&d, Some(&a), false);
    let ops: Vec<String> = p
        .ops
        .iter()
        .map(|o| format!("{o:?}").chars().take(40).collect())
        .collect();
    assert!(
        matches!(p.ops[0], Op::FlushChain(ref c) if c == "keep"),
        "{ops:?}"
    );
    assert!(matches!(p.ops[1], Op::AddRule { ref chain, .. } if &**chain == "keep"));
    assert_eq!(
        p.ops[2..],
        [
            Op::FlushChain("gone".into()),
            Op::FlushChain("old".into()),
            Op::DelChain("gone".into()),
            Op::DelChain("old".into()),
            Op::DelSet("unused".into()),
        ]
    );
    let mut tables = BTreeMap::from([((Family::Ip, "calico".to_owned()), a)]);
    diff::apply(&mut tables, &[p]).unwrap();
    assert_eq!(
        canonical_table(&tables[&(Family::Ip, "calico".to_owned())]),
        canonical_table(&d)
    );
}

#[test]
fn unchangeable_definitions_become_one_atomic_rebuild() {
    let mut a = Table::new(Family::Ip, "calico");
    a.sets.insert("s".into(), interval_set("s", vec![]));
    let mut d = a.clone();
    d.sets.get_mut("s").unwrap().size = Some(100);
    let p = diff::diff(&d, Some(&a), false);
    assert_eq!(p.ops[0], Op::DelTable);
    assert!(matches!(p.ops[1], Op::AddTable { .. }));
}

#[test]
fn erestart_is_retried_from_a_fresh_read() {
    let mut k = FakeNft {
        restarts_to_inject: 3,
        ..Default::default()
    };
    let mut d = Table::new(Family::Ip, "calico");
    d.chains.insert("c".into(), Chain::regular("c"));
    let rep = reconcile::sync(&mut k, std::slice::from_ref(&d), &SyncOptions::default()).unwrap();
    assert_eq!(rep.attempts, 4);
    assert_eq!(k.commits, 1);
    // Give up after max_attempts, surfacing the restart.
    k.restarts_to_inject = 5;
    d.chains.insert("c2".into(), Chain::regular("c2"));
    let err = reconcile::sync(
        &mut k,
        &[d],
        &SyncOptions {
            max_attempts: 2,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.is_restart());
}

#[test]
fn ownership_flags_follow_kernel_support() {
    let d = Table::new(Family::Ip, "calico");
    let mut k = FakeNft {
        persist: true,
        ..Default::default()
    };
    let t = reconcile::with_ownership(
        &mut k,
        std::slice::from_ref(&d),
        TableOwnership::OwnerPersist,
    )
    .unwrap();
    assert_eq!(t[0].flags, table_flags::OWNER | table_flags::PERSIST);
    let mut k = FakeNft::default();
    let t = reconcile::with_ownership(
        &mut k,
        std::slice::from_ref(&d),
        TableOwnership::OwnerPersist,
    )
    .unwrap();
    assert_eq!(t[0].flags, 0);
    let mut k = FakeNft {
        persist: true,
        ..Default::default()
    };
    let t = reconcile::with_ownership(&mut k, &[d], TableOwnership::Off).unwrap();
    assert_eq!(t[0].flags, 0);
    assert!(k.supports_owner_persist().unwrap());
}

/// Splits a batch into (type, flags, seq, payload).
fn messages(bytes: &[u8]) -> Vec<(u16, u16, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < bytes.len() {
        let len = u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap()) as usize;
        let ty = u16::from_ne_bytes(bytes[off + 4..off + 6].try_into().unwrap());
        let fl = u16::from_ne_bytes(bytes[off + 6..off + 8].try_into().unwrap());
        let seq = u32::from_ne_bytes(bytes[off + 8..off + 12].try_into().unwrap());
        out.push((ty, fl, seq, bytes[off + 16..off + len].to_vec()));
        off += len.div_ceil(4) * 4;
    }
    out
}

#[test]
fn batch_framing_genid_ack_on_end_only_and_dry_run_without_end() {
    let mut b = Batch::new(100, Some(42));
    b.add_table(Family::Ip, "calico", 0);
    b.flush_chain(Family::Ip, "calico", "filter-cali-tw-cali12");
    let enc = b.finish(true);
    let m = messages(&enc.bytes);
    assert_eq!(m.len(), 4);
    assert_eq!(m[0].0, NFNL_MSG_BATCH_BEGIN);
    // res_id = NFNL_SUBSYS_NFTABLES, big-endian; NFNL_BATCH_GENID = 42.
    assert_eq!(&m[0].3[2..4], &10u16.to_be_bytes());
    assert_eq!(&m[0].3[4..12], &[8, 0, 1, 0, 0, 0, 0, 42]);
    assert_eq!(
        m.iter().map(|x| x.2).collect::<Vec<_>>(),
        vec![100, 101, 102, 103]
    );
    assert!(m[..3].iter().all(|x| x.1 & NLM_F_ACK == 0));
    assert_eq!(m[3].0, NFNL_MSG_BATCH_END);
    assert_ne!(m[3].1 & NLM_F_ACK, 0);
    // The flush names its chain (without NFTA_RULE_CHAIN the kernel flushes the whole table).
    match codec::decode_message(NFT_MSG_DELRULE, &m[2].3).unwrap() {
        Object::Rule(r) => assert_eq!(r.chain, "filter-cali-tw-cali12"),
        o => panic!("{o:?}"),
    }
    assert_eq!(
        enc.describe(102),
        "flushing chain filter-cali-tw-cali12 in table ip calico"
    );
    assert!(enc.describe(100).contains("generation"));

    let mut b = Batch::new(1, None);
    b.add_table(Family::Ip, "calico", 0);
    let dry = b.finish(false);
    let m = messages(&dry.bytes);
    assert_eq!(m.len(), 2);
    assert!(m.iter().all(|x| x.0 != NFNL_MSG_BATCH_END));
    assert_eq!(dry.end_seq, None);
}

#[test]
fn element_lists_are_split_under_64k_and_set_ids_link_new_sets() {
    let elements: Vec<Element> = (0..100_000u32)
        .map(|i| start(i.to_be_bytes().to_vec()))
        .collect();
    let set = ipv4_set("big", None, vec![]);
    let mut b = Batch::new(1, None);
    b.add_set(Family::Ip, "calico", &set);
    b.add_elements(Family::Ip, "calico", "big", &elements)
        .unwrap();
    let enc = b.finish(true);
    let m = messages(&enc.bytes);
    let mut total = 0;
    for (ty, _, _, payload) in &m[2..m.len() - 1] {
        assert_eq!(*ty, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM);
        assert!(payload.len() < 65_536, "{}", payload.len());
        match codec::decode_message(NFT_MSG_NEWSETELEM, payload).unwrap() {
            Object::Elems(e) => {
                // A set the batch creates is named by its ID alone (no walk of the set list).
                assert_eq!((e.set.as_str(), e.set_id), ("", Some(1)));
                total += e.elements.len();
            }
            o => panic!("{o:?}"),
        }
    }
    assert_eq!(total, 100_000);
    assert!(m.len() > 20);
}

/// The batch copies the encoded expressions of a body many rules share instead of
/// encoding them again. The bytes must be exactly those of unshared copies, also in a second
/// table whose sets (created in the same batch) have other ids.
#[test]
fn shared_rule_bodies_encode_as_their_copies_do() {
    let table = |name: &str, shared: bool| {
        let mut t = Table::new(Family::Ip, name);
        for set in ["a", "b"] {
            t.sets.insert(
                set.into(),
                ipv4_set(set, None, vec![start(v4(10, 0, 0, 1))]),
            );
        }
        let body: Exprs = vec![
            load_ip_saddr(),
            Expr::Lookup {
                set: "b".into(),
                set_id: None,
                sreg: Reg::R1,
                dreg: None,
                invert: false,
            },
            Expr::Verdict(Verdict::Accept),
        ]
        .into();
        for c in 0..3 {
            let mut chain = Chain::regular(format!("c{c}"));
            for r in 0..2 {
                chain.rules.push(Rule {
                    exprs: if shared {
                        body.clone()
                    } else {
                        body.to_vec().into()
                    },
                    comment: Some(format!("cali:{c}-{r}")),
                    handle: None,
                });
            }
            t.chains.insert(chain.name.clone(), chain);
        }
        t
    };
    let encode = |shared: bool| {
        let mut b = Batch::new(1, None);
        for name in ["calico", "calico-side"] {
            diff::diff(&table(name, shared), None, false)
                .encode(&mut b)
                .unwrap();
        }
        b.finish(true).bytes
    };
    let shared = encode(true);
    assert_eq!(shared, encode(false));
    // And the second table's lookups name its own set ids.
    let ids: Vec<(String, Option<u32>)> = messages(&shared)
        .iter()
        .filter(|(ty, ..)| *ty == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE)
        .map(
            |(_, _, _, payload)| match codec::decode_message(NFT_MSG_NEWRULE, payload) {
                Ok(Object::Rule(r)) => match &r.rule.exprs[1] {
                    Expr::Lookup { set_id, .. } => (r.table.clone(), *set_id),
                    e => panic!("{e:?}"),
                },
                o => panic!("{o:?}"),
            },
        )
        .collect();
    assert_eq!(ids.len(), 12);
    let first = ids[0].1;
    assert!(ids[..6].iter().all(|(t, id)| t == "calico" && *id == first));
    assert!(ids[6..]
        .iter()
        .all(|(t, id)| t == "calico-side" && id.is_some() && *id != first));
}

// ---------------------------------------------------------------------------------------------

fn arb_table() -> impl Strategy<Value = Table> {
    let chains = proptest::collection::btree_map(
        0u8..6,
        (
            proptest::collection::vec((0u8..4, 0u8..3), 0..4),
            any::<bool>(),
        ),
        0..6,
    );
    let ips = proptest::collection::btree_set((0u8..4, 0u8..30), 0..20);
    let nets =
        proptest::collection::vec((0u8..8, prop_oneof![Just(16u32), Just(20), Just(24)]), 0..8);
    let vmap = proptest::collection::btree_map(0u8..6, any::<bool>(), 0..6);
    (chains, ips, nets, vmap, any::<bool>()).prop_map(|(chains, ips, nets, vmap, with_sets)| {
        let mut t = Table::new(Family::Ip, "calico");
        let names: Vec<String> = chains.keys().map(|i| format!("c{i}")).collect();
        for (i, (rules, _)) in &chains {
            let mut c = Chain::regular(format!("c{i}"));
            for (r, v) in rules {
                let verdict = match v {
                    0 => Verdict::Accept,
                    1 => Verdict::Drop,
                    _ => names
                        .iter()
                        .find(|n| **n > format!("c{i}"))
                        .map(|n| Verdict::Jump(n.clone()))
                        .unwrap_or(Verdict::Return),
                };
                let mut exprs = vec![];
                if with_sets && *r % 2 == 0 {
                    exprs.push(load_ip_saddr());
                    exprs.push(Expr::Lookup {
                        set: if *r == 0 { "ips" } else { "nets" }.into(),
                        set_id: None,
                        sreg: Reg::R1,
                        dreg: None,
                        invert: false,
                    });
                }
                exprs.push(Expr::Counter {
                    packets: 0,
                    bytes: 0,
                });
                exprs.push(Expr::Verdict(verdict));
                c.rules.push(Rule {
                    exprs: exprs.into(),
                    comment: Some(format!("cali:{r}")),
                    handle: None,
                });
            }
            t.chains.insert(c.name.clone(), c);
        }
        if with_sets {
            t.sets.insert(
                "ips".into(),
                ipv4_set(
                    "ips",
                    None,
                    ips.iter().map(|(c, d)| start(v4(10, 0, *c, *d))).collect(),
                ),
            );
            t.sets.insert(
                "nets".into(),
                interval_set(
                    "nets",
                    diff::interval_elements(nets.iter().map(|(b, len)| {
                        let base = u32::from_be_bytes([10, *b, 0, 0]);
                        (
                            base.to_be_bytes().to_vec(),
                            Some((base + (1 << (32 - len))).to_be_bytes().to_vec()),
                        )
                    })),
                ),
            );
        }
        let mut disp = ifname_vmap("dispatch");
        for (i, goto) in vmap {
            let target = format!("c{i}");
            if !t.chains.contains_key(&target) {
                continue;
            }
            let verdict = if goto {
                Verdict::Goto(target)
            } else {
                Verdict::Jump(target)
            };
            disp.elements
                .push(ifname_element(&format!("cali{i}"), verdict));
        }
        t.sets.insert("dispatch".into(), disp);
        t
    })
}

proptest! {
    /// Applying diff(desired, actual) to actual gives desired, with the kernel's reference
    /// checks (ENOENT/EBUSY) enforced by the fake; and a second diff is empty.
    #[test]
    fn applying_the_diff_gives_the_desired_state(a in arb_table(), d in arb_table()) {
        let key = (Family::Ip, "calico".to_owned());
        let mut tables = BTreeMap::from([(key.clone(), a.clone())]);
        let p = diff::diff(&d, Some(&a), false);
        diff::apply(&mut tables, std::slice::from_ref(&p)).map_err(|e| TestCaseError::fail(format!("{e}\n{p}")))?;
        prop_assert_eq!(canonical_table(&tables[&key]), canonical_table(&d));
        prop_assert!(diff::diff(&d, Some(&tables[&key]), false).is_empty());
        // From nothing, too.
        let mut empty = BTreeMap::new();
        diff::apply(&mut empty, &[diff::diff(&d, None, false)]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(canonical_table(&empty[&key]), canonical_table(&d));
    }
}

#[test]
fn reconciler_trusts_its_believed_state_only_while_the_generation_is_its_own() {
    use nf_tables::reconcile::Reconciler;
    let mut r = Reconciler::new(FakeNft::default(), unowned());
    let mut d = Table::new(Family::Ip, "calico");
    d.chains.insert("a".into(), Chain::regular("a"));
    r.apply(std::slice::from_ref(&d)).unwrap();
    assert_eq!(r.kernel.reads, 1);
    d.chains.insert("b".into(), Chain::regular("b"));
    let rep = r.apply(std::slice::from_ref(&d)).unwrap();
    assert_eq!(rep.ops, 1);
    assert_eq!(r.kernel.reads, 1, "steady state: no dump");
    // Another writer moved the generation: read again.
    r.kernel.generation += 1;
    r.kernel
        .tables
        .get_mut(&(Family::Ip, "calico".into()))
        .unwrap()
        .chains
        .remove("a");
    // Nothing changed on our side: nothing is sent, not even a GETGEN (drift is the refresh
    // timer's to find).
    assert_eq!(r.apply(std::slice::from_ref(&d)).unwrap().ops, 0);
    assert_eq!(r.kernel.reads, 1);
    // A change: the batch carries the believed generation, the kernel refuses it (ERESTART),
    // the reconciler reads and diffs everything, and the foreign delete is repaired too.
    d.chains.insert("c".into(), Chain::regular("c"));
    let rep = r.apply(std::slice::from_ref(&d)).unwrap();
    assert_eq!(r.kernel.reads, 2);
    assert_eq!(
        rep.plans[0].ops,
        vec![
            Op::AddChain(Box::new(Chain::regular("a"))),
            Op::AddChain(Box::new(Chain::regular("c")))
        ]
    );
    // Refresh timer.
    r.mark_stale();
    assert_eq!(r.apply(std::slice::from_ref(&d)).unwrap().ops, 0);
    assert_eq!(r.kernel.reads, 3);
    assert_eq!(
        canonical_table(&r.kernel.tables[&(Family::Ip, "calico".to_owned())]),
        canonical_table(&d)
    );
}

#[test]
fn patches_are_diffed_only_where_they_touch_and_fall_back_to_a_read_when_untrusted() {
    use nf_tables::model::TablePatch;
    use nf_tables::reconcile::Reconciler;
    let mut r = Reconciler::new(FakeNft::default(), unowned());
    let key = (Family::Ip, "calico".to_owned());
    let mut first = TablePatch::new(Family::Ip, "calico");
    for n in ["a", "b", "c"] {
        let mut c = Chain::regular(n);
        c.rules.push(rule(Verdict::Accept, n, 0));
        first.chains.insert(n.into(), Some(c));
    }
    let mut s = ipv4_set("s", None, vec![start(v4(10, 0, 0, 1))]);
    first.sets.insert("s".into(), Some(s.clone()));
    // Untrusted start: the kernel is read and everything diffed.
    r.apply_patches(vec![first]).unwrap();
    assert_eq!(r.kernel.reads, 1);
    assert_eq!(r.kernel.tables[&key].chains.len(), 3);

    // A member added and chain b replaced: only those, no read.
    let mut p = TablePatch::new(Family::Ip, "calico");
    s.elements.push(Element {
        key: [10, 0, 0, 2][..].into(),
        key_end: None,
        flags: 0,
        data: None,
    });
    p.sets.insert("s".into(), Some(s.clone()));
    let mut b = Chain::regular("b");
    b.rules.push(rule(Verdict::Drop, "b2", 0));
    p.chains.insert("b".into(), Some(b));
    p.chains.insert("c".into(), None);
    let rep = r.apply_patches(vec![p]).unwrap();
    assert_eq!(r.kernel.reads, 1, "trusted: no dump");
    let ops = &rep.plans[0].ops;
    assert!(
        matches!(&ops[0], Op::AddElements { set, elements } if set == "s" && elements.len() == 1),
        "{ops:?}"
    );
    assert!(ops.contains(&Op::FlushChain("b".into())), "{ops:?}");
    assert!(ops.contains(&Op::DelChain("c".into())), "{ops:?}");
    assert!(
        !ops.iter()
            .any(|o| matches!(o, Op::AddRule { chain, .. } if &**chain == "a")),
        "{ops:?}"
    );
    assert_eq!(
        canonical_table(&r.kernel.tables[&key]),
        canonical_table(&r.desired()[0])
    );

    // The same patch again: nothing to send, no commit.
    let commits = r.kernel.commits;
    let mut again = TablePatch::new(Family::Ip, "calico");
    again.sets.insert("s".into(), Some(s.clone()));
    assert_eq!(r.apply_patches(vec![again]).unwrap().ops, 0);
    assert_eq!(r.kernel.commits, commits);

    // An empty patch while trusted: nothing at all is sent (not even GETGEN).
    let gen = r.kernel.generation;
    assert_eq!(r.apply_patches(vec![]).unwrap().ops, 0);
    assert_eq!((r.kernel.reads, r.kernel.generation), (1, gen));

    // Someone else deleted chain a: a patch that does not name it still repairs it, because
    // the moved generation makes the reconciler read and diff everything.
    r.kernel.generation += 1;
    r.kernel.tables.get_mut(&key).unwrap().chains.remove("a");
    let mut p = TablePatch::new(Family::Ip, "calico");
    p.chains.insert("e".into(), Some(Chain::regular("e")));
    let rep = r.apply_patches(vec![p]).unwrap();
    assert_eq!(r.kernel.reads, 2);
    assert!(rep.plans[0]
        .ops
        .contains(&Op::AddChain(Box::new(Chain::regular("a")))));
    assert_eq!(
        canonical_table(&r.kernel.tables[&key]),
        canonical_table(&r.desired()[0])
    );

    // A failed commit keeps the patch: the next apply (a read) still converges to it.
    r.kernel.restarts_to_inject = 100;
    let mut p = TablePatch::new(Family::Ip, "calico");
    p.chains.insert("d".into(), Some(Chain::regular("d")));
    assert!(r.apply_patches(vec![p]).is_err());
    r.kernel.restarts_to_inject = 0;
    // An empty patch while untrusted still reads and converges.
    r.apply_patches(vec![]).unwrap();
    assert!(r.kernel.tables[&key].chains.contains_key("d"));
}

proptest! {
    /// A full load lends its rules and (normal-form) elements to the plan instead of copying
    /// them; the plan makes the same state as the copying one and the table gets everything
    /// back.
    #[test]
    fn lending_a_create_plan_sends_the_same_and_returns_everything(t in arb_table()) {
        let want = diff::diff(&t, None, false);
        let mut lent = t.clone();
        let mut plan = diff::create_lending(&mut lent);
        prop_assert_eq!(plan.ops.len(), want.ops.len());
        // The same state results (element lists may keep the renderer's form of a set).
        let key = (Family::Ip, "calico".to_owned());
        let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
        diff::apply(&mut a, std::slice::from_ref(&plan)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        diff::apply(&mut b, std::slice::from_ref(&want)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(canonical_table(&a[&key]), canonical_table(&b[&key]));
        diff::return_rules(&mut plan, &mut lent);
        prop_assert_eq!(&lent, &t);
    }
}

#[test]
fn a_rendered_interval_set_is_lent_not_copied() {
    let nets: Vec<ipnet::IpNet> = ["10.0.0.0/24", "10.0.1.0/24", "192.168.0.0/16"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let mut t = Table::new(Family::Ip, "calico");
    let elements = nf_tables::build::cidr_interval_elements(&nets, false);
    assert_eq!(
        elements[0].flags,
        elem_flags::INTERVAL_END,
        "nft's leading end at zero"
    );
    t.sets.insert(
        "n".into(),
        Set {
            counter: false,
            counters: Default::default(),
            name: "n".into(),
            key: vec![DataType::Ipv4Addr],
            flags: set_flags::INTERVAL,
            data: None,
            size: None,
            elements: elements.clone(),
        },
    );
    let orig = t.clone();
    let mut plan = diff::create_lending(&mut t);
    assert!(t.sets["n"].elements.is_empty(), "moved into the plan");
    assert!(plan
        .ops
        .iter()
        .any(|o| matches!(o, Op::AddElements { elements: e, .. } if *e == elements)));
    diff::return_rules(&mut plan, &mut t);
    assert_eq!(t, orig);
}
