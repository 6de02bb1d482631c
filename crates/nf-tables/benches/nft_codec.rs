//! CPU cost of the nf_tables engine at the sizes that matter (criterion): encoding
//! 100k set elements and 10k rules into one batch, decoding a 10k-rule dump, and diffing a big
//! table against a 1%-churned copy. Kernel time is not measured here.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use nf_tables::batch::Batch;
use nf_tables::codec;
use nf_tables::diff;
use nf_tables::model::*;

// The tests build the same sets and maps.
#[path = "../tests/it/nft_fixtures.rs"]
mod nft_fixtures;
use nft_fixtures::{ifname_element, ifname_vmap, ipv4_elements, ipv4_set, load_ip_saddr};

fn rule(chain: usize, i: usize) -> Rule {
    Rule {
        exprs: vec![
            Expr::Meta {
                key: MetaKey::IifName,
                dreg: Reg::R1,
            },
            Expr::Cmp {
                sreg: Reg::R1,
                op: CmpOp::Eq,
                data: format!("cali{chain:08}\0").into_bytes(),
            },
            load_ip_saddr(),
            Expr::Lookup {
                set: format!("s:{}", i % 50),
                set_id: None,
                sreg: Reg::R1,
                dreg: None,
                invert: false,
            },
            Expr::Counter {
                packets: 0,
                bytes: 0,
            },
            Expr::Verdict(Verdict::Jump(format!("filter-cali-pi-{}", i % 100))),
        ]
        .into(),
        comment: Some(format!("cali:{chain:08x}{i:08x};")),
        handle: None,
    }
}

/// 1000 chains × 10 rules, a 100k-element set, a 1000-entry vmap.
fn big_table() -> Table {
    let mut t = Table::new(Family::Ip, "calico");
    for c in 0..1000 {
        let mut ch = Chain::regular(format!("filter-cali-tw-cali{c:08}"));
        ch.rules = (0..10).map(|i| rule(c, i)).collect();
        t.chains.insert(ch.name.clone(), ch);
    }
    t.sets.insert(
        "big".into(),
        ipv4_set("big", Some(131_072), ipv4_elements(0x0a00_0000, 100_000)),
    );
    let mut vmap = ifname_vmap("filter-cali-to-wl-dispatch");
    for c in 0..1000 {
        vmap.elements.push(ifname_element(
            &format!("cali{c:08}"),
            Verdict::Goto(format!("filter-cali-tw-cali{c:08}")),
        ));
    }
    t.sets.insert(vmap.name.clone(), vmap);
    t
}

fn encode_rules(n_chains: usize) -> Vec<u8> {
    let mut b = Batch::new(1, Some(1));
    for c in 0..n_chains {
        let chain = format!("filter-cali-tw-cali{c:08}");
        for i in 0..10 {
            b.add_rule(Family::Ip, "calico", &chain, i, &rule(c, i))
                .unwrap();
        }
    }
    b.finish(true).bytes
}

fn benches(c: &mut Criterion) {
    let els = ipv4_elements(0x0a00_0000, 100_000);
    let set = ipv4_set("big", Some(131_072), vec![]);
    c.bench_function("encode 100k set elements", |b| {
        b.iter(|| {
            let mut batch = Batch::new(1, Some(1));
            batch.add_set(Family::Ip, "calico", &set);
            batch
                .add_elements(Family::Ip, "calico", "big", black_box(&els))
                .unwrap();
            black_box(batch.finish(true).bytes.len())
        })
    });

    c.bench_function("encode 10k rules", |b| {
        b.iter(|| black_box(encode_rules(1000).len()))
    });

    // A dump is the same message stream the kernel returns: NEWRULE messages back to back.
    let dump = encode_rules(1000);
    c.bench_function("decode 10k-rule dump", |b| {
        b.iter(|| {
            let mut off = 0;
            let mut n = 0;
            while off < dump.len() {
                let len = u32::from_ne_bytes(dump[off..off + 4].try_into().unwrap()) as usize;
                let ty = u16::from_ne_bytes(dump[off + 4..off + 6].try_into().unwrap());
                if ty >> 8 == 10 {
                    let obj = codec::decode_message(ty & 0xff, &dump[off + 16..off + len]).unwrap();
                    black_box(obj);
                    n += 1;
                }
                off += len.div_ceil(4) * 4;
            }
            assert_eq!(n, 10_000);
        })
    });

    let desired = big_table();
    let mut actual = desired.clone();
    // 1% churn: 10 of 1000 chains have a changed rule, 1000 of 100k elements differ.
    for (i, ch) in actual.chains.values_mut().enumerate() {
        if i % 100 == 0 {
            ch.rules[3].comment = Some("cali:stale;".into());
        }
    }
    let big = actual.sets.get_mut("big").unwrap();
    big.elements.truncate(99_000);
    big.elements
        .extend(ipv4_elements(0x0a00_0000 + 200_000, 1000));
    c.bench_function("diff 10k rules + 100k elements, 1% churn", |b| {
        b.iter(|| {
            let p = diff::diff(black_box(&desired), Some(black_box(&actual)), false);
            black_box(p.ops.len())
        })
    });
}

criterion_group! {
    name = nft;
    config = Criterion::default().sample_size(20);
    targets = benches
}
criterion_main!(nft);
