//! The read-back path (`nft::dump`, `NfSocket::dump`): per-chain rule dumps and per-set element
//! dumps, decoded from the receive buffer, give back exactly what was committed — also for
//! chains and sets whose dump spans several 32 KiB reply buffers, empty ones, and on a socket
//! that an earlier reader left with an unfinished dump. Privileged tests run in their own
//! network namespace; `nft` is the independent oracle of the object counts.

use crate::nft_fixtures;
use testkit as common;

use std::process::Command;

use common::in_private_netns;
use nf_tables::codec::{self, MsgWriter, Object, RuleMsg};
use nf_tables::consts::*;
use nf_tables::diff::{self, canonical_table};
use nf_tables::model::*;
use nf_tables::reconcile::{Nft, NftKernel};
use nf_tables::socket::{DumpEnd, NfSocket};
use nf_tables::NftError;
use nft_fixtures::{ifname_element, ifname_vmap, ipv4_elements, ipv4_set, load_ip_saddr};

fn rule(i: u32, comment: bool) -> Rule {
    Rule {
        exprs: vec![
            load_ip_saddr(),
            Expr::Cmp {
                sreg: Reg::R1,
                op: CmpOp::Eq,
                data: (0x0a00_0000 + i).to_be_bytes().to_vec(),
            },
            Expr::Counter {
                packets: 0,
                bytes: 0,
            },
            Expr::Verdict(Verdict::Accept),
        ]
        .into(),
        comment: comment.then(|| format!("cali:{i:016x};")),
        handle: None,
    }
}

/// 401 chains (a base chain; one of 600 rules: several reply buffers on its own; one empty),
/// 147 sets (one of 20k members: many reply buffers; one empty) and a 400-entry verdict map.
/// Interval sets and every expression kind are covered by `nft_kernel`'s fixtures.
fn many_objects() -> Table {
    let mut t = Table::new(Family::Ip, "calico");
    for c in 0..400u32 {
        let name = format!("filter-cali-pi-{c:05}");
        let mut ch = Chain::regular(name.clone());
        let n = match c {
            7 => 600,
            9 => 0,
            c => c % 13,
        };
        for i in 0..n {
            ch.rules.push(rule(c * 1000 + i, i % 3 != 0));
        }
        t.chains.insert(name, ch);
    }
    for s in 0..147u32 {
        let n = match s {
            3 => 20_000,
            4 => 0,
            s => s % 50,
        };
        let set = ipv4_set(
            &format!("cali40s-{s:05}"),
            Some(n.max(1)),
            ipv4_elements(0x0b00_0000, n),
        );
        t.sets.insert(set.name.clone(), set);
    }
    let mut vmap = ifname_vmap("filter-cali-from-wl-dispatch");
    for c in 0..400u32 {
        vmap.elements.push(ifname_element(
            &format!("cali{c:011}"),
            Verdict::Goto(format!("filter-cali-pi-{c:05}")),
        ));
    }
    t.sets.insert(vmap.name.clone(), vmap);
    let mut base = Chain::regular("filter-FORWARD");
    base.base = Some(BaseChain {
        chain_type: ChainType::Filter,
        hook: Hook::Forward,
        priority: 0,
        policy: Verdict::Accept,
    });
    base.rules.push(rule(1, true));
    t.chains.insert(base.name.clone(), base);
    t
}

/// A rule dump request in the `ip` family, its selector (table or chain) written by `select`;
/// returns the request and its sequence number.
fn rule_dump_request(sock: &mut NfSocket, select: impl FnOnce(&mut MsgWriter)) -> (Vec<u8>, u32) {
    let seq = sock.take_seq(1);
    let mut w = MsgWriter::new();
    let m = w.begin_msg(
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETRULE,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        Family::Ip.nfproto(),
        0,
    );
    select(&mut w);
    w.end_msg(m).unwrap();
    (w.buf, seq)
}

/// A socket on which `many_objects` has been committed, and that table.
fn many_objects_committed() -> (Nft, Table) {
    let mut k = Nft::open().unwrap();
    let t = many_objects();
    k.commit(&[diff::diff(&t, None, false)], None, false)
        .unwrap();
    (k, t)
}

fn nft_count(args: &[&str], needle: &str) -> usize {
    let out = Command::new("nft")
        .args(args)
        .output()
        .expect("nft runs (test oracle)");
    assert!(out.status.success(), "nft {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).matches(needle).count()
}

#[test]
fn a_table_of_many_chains_and_sets_reads_back_as_committed() {
    in_private_netns(|| {
        let (mut k, t) = many_objects_committed();
        let got = k
            .read_table(Family::Ip, "calico")
            .unwrap()
            .expect("the table exists");
        assert_eq!(canonical_table(&got.table), canonical_table(&t));
        // Handles came back with every rule (the reconciler deletes by handle).
        assert!(got
            .table
            .chains
            .values()
            .flat_map(|c| &c.rules)
            .all(|r| r.handle.is_some()));
        // The oracle agrees on the counts.
        let rules: usize = t.chains.values().map(|c| c.rules.len()).sum();
        // `-a` prints a handle for the table, every chain, set and rule.
        assert_eq!(
            nft_count(&["-a", "list", "table", "ip", "calico"], "# handle"),
            1 + t.chains.len() + t.sets.len() + rules
        );
        let listed =
            ["\tset ", "\tmap "].map(|kind| nft_count(&["list", "table", "ip", "calico"], kind));
        assert_eq!(listed, [t.sets.len() - 1, 1]);
    });
}

#[test]
fn a_read_on_a_socket_with_an_unfinished_dump_still_succeeds() {
    in_private_netns(|| {
        let (mut k, t) = many_objects_committed();
        // Start a table-wide rule dump (hundreds of KiB) and read none of it: the kernel keeps
        // it open on this socket and refuses every other dump with EBUSY until it is read.
        let sock = k.socket();
        let (req, _) = rule_dump_request(sock, |w| w.put_str(NFTA_RULE_TABLE, "calico"));
        sock.send_all(&req).unwrap();
        let got = k
            .read_table(Family::Ip, "calico")
            .unwrap()
            .expect("the table exists");
        assert_eq!(canonical_table(&got.table), canonical_table(&t));
    });
}

#[test]
fn a_failing_consumer_leaves_the_socket_usable() {
    in_private_netns(|| {
        let (mut k, _) = many_objects_committed();
        let sock = k.socket();
        let big_chain = |sock: &mut NfSocket| {
            rule_dump_request(sock, |w| {
                codec::put_rule_chain_ref(w, "calico", "filter-cali-pi-00007")
            })
        };
        // The consumer fails on the first of 600 rules: the error comes back, after the dump
        // was read to its end.
        let (req, seq) = big_chain(sock);
        let err = sock
            .dump(&req, seq, |_| {
                Err(NftError::Protocol("consumer gave up".into()))
            })
            .unwrap_err();
        assert!(err.to_string().contains("consumer gave up"), "{err}");
        // The next dump on the same socket is not refused with EBUSY, and sees every rule.
        let (req, seq) = big_chain(sock);
        let mut n = 0;
        let end = sock
            .dump(&req, seq, |m| {
                codec::decode_rule_ref(m.payload).unwrap();
                n += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(end, DumpEnd::Done { interrupted: false });
        assert_eq!(n, 600);
    });
}

/// The kernel answers a rule dump of a chain that does not exist with an empty dump, not
/// ENOENT (`nf_tables_dump_rules`: no chain found → done). So a chain deleted between the chain
/// dump and its rule dump would read as empty: `read_table` relies on the generation id read
/// before and after, which every commit changes.
#[test]
fn a_rule_dump_of_a_missing_chain_is_empty_not_enoent() {
    in_private_netns(|| {
        let (mut k, _) = many_objects_committed();
        let sock = k.socket();
        let (req, seq) = rule_dump_request(sock, |w| {
            codec::put_rule_chain_ref(w, "calico", "no-such-chain")
        });
        let mut n = 0;
        let end = sock
            .dump(&req, seq, |_| {
                n += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!((end, n), (DumpEnd::Done { interrupted: false }, 0));
    });
}

/// The borrowed decoders give what the owning ones give.
#[test]
fn borrowed_decoders_agree_with_decode_message() {
    let t = many_objects();
    for (name, c) in &t.chains {
        for r in &c.rules {
            let obj = Object::Rule(RuleMsg {
                family: Family::Ip,
                table: "calico".into(),
                chain: name.clone(),
                rule: r.clone(),
            });
            let payload = codec::encode_object(&obj).unwrap();
            let got = codec::decode_rule_ref(&payload).unwrap();
            assert_eq!((got.table, got.chain), ("calico", name.as_str()));
            assert_eq!(
                codec::decode_message(NFT_MSG_NEWRULE, &payload).unwrap(),
                Object::Rule(RuleMsg {
                    family: got.family,
                    table: got.table.into(),
                    chain: got.chain.into(),
                    rule: got.rule,
                })
            );
        }
    }
    let set = &t.sets["cali40s-00010"];
    let obj = Object::Elems(codec::ElemsMsg {
        counters: Default::default(),
        family: Family::Ip,
        table: "calico".into(),
        set: set.name.clone(),
        set_id: None,
        elements: set.elements.clone(),
    });
    let payload = codec::encode_object(&obj).unwrap();
    let mut out = vec![Element {
        key: [1][..].into(),
        key_end: None,
        flags: 0,
        data: None,
    }];
    let mut counters = ElemCounters::default();
    let r = codec::decode_elems_into(&payload, &mut out, &mut counters).unwrap();
    assert_eq!((r.table, r.set), ("calico", set.name.as_str()));
    assert_eq!(out.len(), 1 + set.elements.len(), "appended, not replaced");
    assert_eq!(&out[1..], &set.elements[..]);
}
