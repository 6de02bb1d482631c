//! Privileged tests of the nf_tables engine against the real kernel. Each test runs in its own
//! private network namespace (`common::in_private_netns`); nothing touches the host's ruleset.
//! `nft` is used only as an independent oracle of what the kernel holds.

use crate::nft_fixtures;
use testkit as common;

use std::collections::BTreeMap;
use std::process::Command;

use common::in_private_netns;
use nf_tables::codec::{self, Object};
use nf_tables::diff::{self, canonical_table, Op, Plan};
use nf_tables::dump::TableState;
use nf_tables::model::*;
use nf_tables::reconcile::{self, Nft, NftKernel, SyncOptions, TableOwnership};
use nf_tables::NftError;
use nft_fixtures::{ifname_element, ifname_vmap, ipv4_elements, ipv4_set, load_ip_saddr};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/nft");

/// Runs nft (test oracle) in the calling thread's network namespace.
fn nft(args: &[&str]) -> String {
    String::from_utf8(common::oracle_stdout(
        Command::new("nft").args(args),
        &format!("nft {args:?}"),
    ))
    .unwrap()
}

fn nft_status(args: &[&str]) -> (bool, String) {
    let out = Command::new("nft")
        .args(args)
        .output()
        .expect("running nft");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The table a decoded message belongs to; the fixture batches create it first.
fn table_mut(
    tables: &mut BTreeMap<(Family, String), Table>,
    family: Family,
    name: String,
) -> &mut Table {
    tables.get_mut(&(family, name)).unwrap()
}

/// The tables a captured fixture batch creates, decoded into our model.
fn fixture_tables(name: &str) -> Vec<Table> {
    let text = std::fs::read_to_string(format!("{DIR}/{name}.mnl")).unwrap();
    let mut tables: BTreeMap<(Family, String), Table> = BTreeMap::new();
    let mut order = Vec::new();
    for l in text.lines().filter(|l| !l.is_empty()) {
        let mut it = l.split_whitespace();
        let ty: u16 = it.next().unwrap().parse().unwrap();
        let hex = it.nth(1).unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        match codec::decode_message(ty & 0xff, &bytes).unwrap() {
            Object::Table(t) => {
                order.push((t.family, t.name.clone()));
                let mut tb = Table::new(t.family, t.name);
                tb.flags = t.flags;
                tables.insert((t.family, tb.name.clone()), tb);
            }
            Object::Chain(c) => {
                table_mut(&mut tables, c.family, c.table)
                    .chains
                    .insert(c.chain.name.clone(), c.chain);
            }
            Object::Set(s) => {
                table_mut(&mut tables, s.family, s.table)
                    .sets
                    .insert(s.set.name.clone(), s.set);
            }
            Object::Elems(e) => table_mut(&mut tables, e.family, e.table)
                .sets
                .get_mut(&e.set)
                .unwrap()
                .elements
                .extend(e.elements),
            Object::Rule(r) => {
                let mut rule = diff::canonical_rule(&r.rule);
                rule.comment = r.rule.comment;
                table_mut(&mut tables, r.family, r.table)
                    .chains
                    .get_mut(&r.chain)
                    .unwrap()
                    .rules
                    .push(rule)
            }
        }
    }
    order.iter().map(|k| tables[k].clone()).collect()
}

/// `nft -j list table` of every table without flags: Debian's nft 1.0.6 emits invalid JSON for
/// tables with flags, so those are compared in text form only.
fn json_of_unflagged(tables: &[Table]) -> Vec<String> {
    tables
        .iter()
        .filter(|t| t.flags == 0)
        .map(|t| nft(&["-j", "list", "table", t.family.name(), &t.name]))
        .collect()
}

/// `nft list` text as a sorted list of blocks: every set/map/chain block with its table line.
fn blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut table = "";
    let mut cur: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("table ") {
            table = line;
            out.push(line.to_owned());
        } else if let Some(c) = cur.as_mut() {
            c.push_str(line);
            c.push('\n');
            if line == "\t}" {
                out.extend(cur.take());
            }
        } else if line.starts_with('\t') && !line.starts_with("\t\t") && line.ends_with('{') {
            cur = Some(format!("{table}\n{line}\n"));
        } else if !line.is_empty() && line != "}" {
            out.push(format!("{table}\n{line}"));
        }
    }
    out.sort();
    out
}

fn plain() -> SyncOptions {
    SyncOptions {
        ownership: TableOwnership::Off,
        ..SyncOptions::default()
    }
}

fn read(k: &mut Nft, t: &Table) -> TableState {
    k.read_table(t.family, &t.name)
        .unwrap()
        .expect("table present")
}

/// Every expression, set type and map of the fixtures: committed by us, read back by our
/// decoder equal to what we sent, and listed by `nft` exactly as when nft itself loads the same
/// source (text and JSON, in two separate namespaces).
#[test]
fn fixtures_commit_and_read_back_like_nft_loads_them() {
    for name in ["objects", "rules"] {
        let tables = fixture_tables(name);
        let (ours_text, ours_json) = in_private_netns({
            let tables = tables.clone();
            move || {
                let mut k = Nft::open().unwrap();
                let rep = reconcile::sync(&mut k, &tables, &plain()).unwrap();
                assert!(rep.ops > 0);
                for t in &tables {
                    let got = read(&mut k, t);
                    assert_eq!(
                        canonical_table(&got.table),
                        canonical_table(t),
                        "{name}: table {}",
                        t.name
                    );
                }
                // Nothing left to do: an empty diff sends nothing.
                let again = reconcile::sync(&mut k, &tables, &plain()).unwrap();
                assert_eq!(again.ops, 0, "{:#?}", again.plans);
                (nft(&["list", "ruleset"]), json_of_unflagged(&tables))
            }
        });
        let (nft_text, nft_json) = in_private_netns({
            let tables = tables.clone();
            move || {
                nft(&["-f", &format!("{DIR}/{name}.nft")]);
                (nft(&["list", "ruleset"]), json_of_unflagged(&tables))
            }
        });
        // nft lists objects in creation order; we create them in name order. Compare the
        // blocks (each set, map and chain with its table), order aside.
        assert_eq!(
            blocks(&ours_text),
            blocks(&nft_text),
            "{name}: nft list ruleset differs"
        );
        let strip1 = |j: &str| {
            let mut v: serde_json::Value = serde_json::from_str(j).unwrap();
            fn walk(v: &mut serde_json::Value) {
                match v {
                    serde_json::Value::Object(m) => {
                        m.remove("handle");
                        m.values_mut().for_each(walk);
                    }
                    serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
                    _ => {}
                }
            }
            walk(&mut v);
            let mut items: Vec<String> = v["nftables"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.to_string())
                .collect();
            items.sort();
            items
        };
        let strip = |j: &Vec<String>| {
            let mut v: Vec<String> = j.iter().flat_map(|j| strip1(j)).collect();
            v.sort();
            v
        };
        assert!(!ours_json.is_empty());
        assert_eq!(
            strip(&ours_json),
            strip(&nft_json),
            "{name}: nft -j differs"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Random desired states.

/// A tiny deterministic PRNG (xorshift), so failures reproduce from the printed seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

fn ifname(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.resize(16, 0);
    v
}

/// CIDR → `[start, end)` for interval elements.
fn cidr(a: [u8; 4], len: u32) -> (Vec<u8>, Option<Vec<u8>>) {
    let base = u32::from_be_bytes(a) & if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let size = 1u64 << (32 - len);
    let end = base as u64 + size;
    (
        base.to_be_bytes().to_vec(),
        (end <= u32::MAX as u64).then(|| (end as u32).to_be_bytes().to_vec()),
    )
}

fn random_table(rng: &mut Rng) -> Table {
    let mut t = Table::new(Family::Ip, "calico");
    // Interval set with overlapping/adjacent CIDRs (merged by the diff).
    let mut ranges = Vec::new();
    for _ in 0..rng.below(12) {
        let a = [10, rng.below(4) as u8, rng.below(256) as u8, 0];
        ranges.push(cidr(a, [16, 20, 24, 24, 23][rng.below(5) as usize]));
    }
    t.sets.insert(
        "nets".into(),
        Set {
            counter: false,
            counters: Default::default(),
            name: "nets".into(),
            key: vec![DataType::Ipv4Addr],
            flags: set_flags::INTERVAL,
            data: None,
            size: None,
            elements: diff::interval_elements(ranges),
        },
    );
    let mut ips: Vec<Element> = (0..rng.below(20))
        .map(|_| Element {
            key: [192, 168, rng.below(3) as u8, rng.below(20) as u8][..].into(),
            key_end: None,
            flags: 0,
            data: None,
        })
        .collect();
    ips.dedup();
    t.sets
        .insert("ips".into(), ipv4_set("ips", Some(1024), ips));
    let n_eps = rng.below(6);
    let mut dispatch = Vec::new();
    for i in 0..6 {
        if !rng.chance(60) && i >= n_eps {
            continue;
        }
        let name = format!("filter-cali-tw-cali{i}");
        let mut c = Chain::regular(name.clone());
        for r in 0..rng.below(4) {
            c.rules.push(Rule {
                exprs: vec![
                    load_ip_saddr(),
                    Expr::Lookup {
                        set: if rng.chance(50) { "ips" } else { "nets" }.into(),
                        set_id: None,
                        sreg: Reg::R1,
                        dreg: None,
                        invert: rng.chance(30),
                    },
                    Expr::Counter {
                        packets: 0,
                        bytes: 0,
                    },
                    Expr::Verdict(if rng.chance(50) {
                        Verdict::Accept
                    } else {
                        Verdict::Drop
                    }),
                ]
                .into(),
                comment: Some(format!("cali:{}-{r}", rng.below(3))),
                handle: None,
            });
        }
        if rng.chance(50) {
            let verdict = if rng.chance(50) {
                Verdict::Goto(name.clone())
            } else {
                Verdict::Jump(name.clone())
            };
            dispatch.push(ifname_element(&format!("cali{i}"), verdict));
        }
        t.chains.insert(name, c);
    }
    t.sets.insert(
        "filter-cali-to-wl-dispatch".into(),
        Set {
            elements: dispatch,
            ..ifname_vmap("filter-cali-to-wl-dispatch")
        },
    );
    let mut fwd = Chain {
        name: "filter-FORWARD".into(),
        base: Some(BaseChain {
            chain_type: ChainType::Filter,
            hook: Hook::Forward,
            priority: 0,
            policy: if rng.chance(20) {
                Verdict::Drop
            } else {
                Verdict::Accept
            },
        }),
        rules: vec![],
    };
    fwd.rules.push(Rule {
        exprs: vec![
            Expr::Meta {
                key: MetaKey::OifName,
                dreg: Reg::R1,
            },
            Expr::Lookup {
                set: "filter-cali-to-wl-dispatch".into(),
                set_id: None,
                sreg: Reg::R1,
                dreg: Some(Reg::VERDICT),
                invert: false,
            },
        ]
        .into(),
        comment: Some("cali:dispatch".into()),
        handle: None,
    });
    if rng.chance(50) {
        fwd.rules.push(Rule {
            exprs: vec![
                Expr::Meta {
                    key: MetaKey::Mark,
                    dreg: Reg::R1,
                },
                Expr::Bitwise {
                    sreg: Reg::R1,
                    dreg: Reg::R1,
                    len: 4,
                    mask: 0x10000u32.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                },
                Expr::Cmp {
                    sreg: Reg::R1,
                    op: CmpOp::Neq,
                    data: vec![0; 4],
                },
                Expr::Verdict(Verdict::Accept),
            ]
            .into(),
            comment: Some("cali:accept-mark".into()),
            handle: None,
        });
    }
    t.chains.insert(fwd.name.clone(), fwd);
    t
}

#[test]
fn random_desired_states_converge_and_read_back_equal() {
    in_private_netns(|| {
        let mut k = Nft::open().unwrap();
        let seed = 0x5eed_f00d_u64;
        let mut rng = Rng(seed);
        let mut last_ops = Vec::new();
        for step in 0..25 {
            let desired = random_table(&mut rng);
            let rep = reconcile::sync(&mut k, std::slice::from_ref(&desired), &plain())
                .unwrap_or_else(|e| panic!("seed {seed:#x} step {step}: {e:#}\n{:?}", e));
            last_ops.push(rep.ops);
            if std::env::var("DEBUG_STEP").is_ok_and(|v| v == step.to_string()) {
                for p in &rep.plans {
                    eprintln!("{p}");
                }
                eprintln!("{}", nft(&["list", "ruleset"]));
            }
            let got = read(&mut k, &desired);
            assert_eq!(
                canonical_table(&got.table),
                canonical_table(&desired),
                "seed {seed:#x} step {step}"
            );
            let again = reconcile::sync(&mut k, std::slice::from_ref(&desired), &plain()).unwrap();
            assert_eq!(again.ops, 0, "step {step}: {}", again.plans[0]);
        }
        // Incremental, not rebuilds: most steps touched far fewer operations than a full load.
        assert!(
            last_ops.iter().skip(1).any(|&n| n < last_ops[0]),
            "{last_ops:?}"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Atomicity, error attribution, dry-run.

fn small_table() -> Table {
    let mut t = Table::new(Family::Ip, "calico");
    let mut c = Chain::regular("filter-cali-tw-cali12");
    c.rules.push(Rule {
        exprs: vec![Expr::Verdict(Verdict::Accept)].into(),
        comment: Some("cali:ok".into()),
        handle: None,
    });
    t.chains.insert(c.name.clone(), c);
    t
}

fn bad_plan() -> Plan {
    // A valid chain and set, then a rule jumping to a chain that does not exist.
    let set = ipv4_set("s:new", None, ipv4_elements(0x0102_0304, 1));
    Plan {
        family: Family::Ip,
        table: "calico".into(),
        ops: vec![
            Op::AddSet(Box::new(set.clone())),
            Op::AddElements {
                set: set.name.clone(),
                elements: set.elements.clone(),
            },
            Op::AddChain(Box::new(Chain::regular("filter-cali-fw-cali12"))),
            Op::FlushChain("filter-cali-tw-cali12".into()),
            Op::AddRule {
                chain: "filter-cali-tw-cali12".into(),
                index: 3,
                rule: Rule {
                    exprs: vec![Expr::Verdict(Verdict::Jump("no-such-chain".into()))].into(),
                    comment: Some("cali:bad".into()),
                    handle: None,
                },
            },
        ],
    }
}

#[test]
fn a_batch_with_one_bad_object_changes_nothing_and_names_the_object() {
    in_private_netns(|| {
        let mut k = Nft::open().unwrap();
        reconcile::sync(&mut k, &[small_table()], &plain()).unwrap();
        let before = read(&mut k, &small_table());
        let before_text = nft(&["list", "ruleset"]);
        let err = k.commit(&[bad_plan()], None, false).unwrap_err();
        let msg = err.to_string();
        eprintln!("refusal: {msg}; {err:?}");
        assert!(
            msg.contains("adding rule 3 of chain filter-cali-tw-cali12 in table ip calico"),
            "{msg}"
        );
        assert_eq!(err.errno(), Some(libc::ENOENT), "{err:?}");
        // The object, structured, for the caller to find the input that made it.
        assert_eq!(
            err.target(),
            Some(&nf_tables::error::Target {
                family: Family::Ip,
                table: "calico".into(),
                object: nf_tables::error::ObjectRef::Chain("filter-cali-tw-cali12".into()),
            })
        );
        assert!(err.is_refusal());
        assert_eq!(read(&mut k, &small_table()), before);
        assert_eq!(nft(&["list", "ruleset"]), before_text);
    });
}

#[test]
fn dry_run_reports_the_error_and_keeps_nothing() {
    in_private_netns(|| {
        let mut k = Nft::open().unwrap();
        reconcile::sync(&mut k, &[small_table()], &plain()).unwrap();
        let before = nft(&["list", "ruleset"]);
        let gen = k.generation().unwrap();
        let err = k.commit(&[bad_plan()], Some(gen), true).unwrap_err();
        assert!(err.to_string().contains("adding rule 3"), "{err}");
        assert_eq!(nft(&["list", "ruleset"]), before);
        // A valid dry-run succeeds and still keeps nothing.
        let mut good = bad_plan();
        good.ops.pop();
        k.commit(&[good], Some(gen), true).unwrap();
        assert_eq!(nft(&["list", "ruleset"]), before);
        assert_eq!(k.generation().unwrap(), gen);
        // The reconciler's dry-run mode: reports a would-be change, applies none.
        let mut desired = small_table();
        desired.chains.insert("x".into(), Chain::regular("x"));
        let rep = reconcile::sync(
            &mut k,
            &[desired],
            &SyncOptions {
                dry_run: true,
                ..plain()
            },
        )
        .unwrap();
        assert_eq!(rep.ops, 1);
        assert_eq!(nft(&["list", "ruleset"]), before);
    });
}

/// A kernel wrapper that lets another writer (`nft`) commit between our read and our commit.
struct Interfering {
    inner: Nft,
    interfere: u32,
    restarts_seen: u32,
}

impl NftKernel for Interfering {
    fn generation(&mut self) -> Result<u32, NftError> {
        self.inner.generation()
    }
    fn read_table(&mut self, f: Family, n: &str) -> Result<Option<TableState>, NftError> {
        self.inner.read_table(f, n)
    }
    fn commit(&mut self, plans: &[Plan], genid: Option<u32>, dry: bool) -> Result<(), NftError> {
        if self.interfere > 0 {
            self.interfere -= 1;
            nft(&["add", "table", "ip", &format!("other{}", self.interfere)]);
        }
        let r = self.inner.commit(plans, genid, dry);
        if matches!(&r, Err(e) if e.is_restart()) {
            self.restarts_seen += 1;
        }
        r
    }
    fn owner_id(&self) -> Option<u32> {
        self.inner.owner_id()
    }
    fn supports_owner_persist(&mut self) -> Result<bool, NftError> {
        self.inner.supports_owner_persist()
    }
}

#[test]
fn a_concurrent_writer_triggers_erestart_and_the_retry_converges() {
    in_private_netns(|| {
        let mut k = Interfering {
            inner: Nft::open().unwrap(),
            interfere: 2,
            restarts_seen: 0,
        };
        // A stale generation id is refused as a whole.
        let gen = k.inner.generation().unwrap();
        nft(&["add", "table", "ip", "someone-else"]);
        let err = k
            .inner
            .commit(&[diff::diff(&small_table(), None, false)], Some(gen), false)
            .unwrap_err();
        assert!(err.is_restart(), "{err:?}");
        assert!(k.inner.read_table(Family::Ip, "calico").unwrap().is_none());
        // The reconciler re-reads and retries until it wins.
        let rep = reconcile::sync(&mut k, &[small_table()], &plain()).unwrap();
        assert_eq!(k.restarts_seen, 2);
        assert_eq!(rep.attempts, 3);
        let got = read(&mut k.inner, &small_table());
        assert_eq!(canonical_table(&got.table), canonical_table(&small_table()));
        // The other writers' tables were never read or touched.
        let text = nft(&["list", "tables"]);
        assert!(
            text.contains("other0") && text.contains("other1") && text.contains("someone-else")
        );
    });
}

#[test]
fn read_of_an_absent_table_is_none_and_other_tables_are_not_read() {
    in_private_netns(|| {
        nft(&["add", "table", "ip", "foreign"]);
        nft(&["add", "chain", "ip", "foreign", "c"]);
        nft(&["add", "rule", "ip", "foreign", "c", "counter"]);
        let mut k = Nft::open().unwrap();
        assert!(k.read_table(Family::Ip, "calico").unwrap().is_none());
        reconcile::sync(&mut k, &[small_table()], &plain()).unwrap();
        let got = read(&mut k, &small_table());
        assert_eq!(got.table.chains.len(), 1);
        // The same name in another family is another table.
        assert!(k.read_table(Family::Ip6, "calico").unwrap().is_none());
    });
}

// ---------------------------------------------------------------------------------------------
// Scale and ownership.

/// The `ip calico` table holding only one set of 100k IPv4 addresses, of the given size hint.
fn table_of_a_big_set(size: Option<u32>) -> Table {
    let mut t = Table::new(Family::Ip, "calico");
    t.sets.insert(
        "big".into(),
        ipv4_set("big", size, ipv4_elements(0x0a00_0000, 100_000)),
    );
    t
}

#[test]
fn hundred_thousand_elements_go_in_one_transaction() {
    in_private_netns(|| {
        let mut k = Nft::open().unwrap();
        let t = table_of_a_big_set(Some(131_072));
        let gen = k.generation().unwrap();
        let start = std::time::Instant::now();
        let plan = diff::diff(&t, None, false);
        let planned = start.elapsed();
        k.commit(std::slice::from_ref(&plan), Some(gen), false)
            .unwrap();
        let took = start.elapsed();
        // One commit: the generation moved by exactly one.
        assert_eq!(k.generation().unwrap(), gen + 1);
        let got = read(&mut k, &t);
        assert_eq!(got.table.sets["big"].elements.len(), 100_000);
        assert_eq!(canonical_table(&got.table), canonical_table(&t));
        eprintln!("100k elements: diff {planned:?}, diff + encode + commit {took:?}");
        // Deleting 1% is a small delta.
        let mut t2 = t.clone();
        t2.sets.get_mut("big").unwrap().elements.truncate(99_000);
        let rep = reconcile::sync(&mut k, std::slice::from_ref(&t2), &plain()).unwrap();
        assert_eq!(rep.ops, 1);
        assert_eq!(read(&mut k, &t2).table.sets["big"].elements.len(), 99_000);
    });
}

/// Before 6.9 the same options give plain tables: anyone with CAP_NET_ADMIN may write them, and
/// they outlive our socket as they are (the daemon repairs outside writes from their events).
fn plain_tables_where_the_kernel_cannot_own_them(mut k: Nft, opts: &SyncOptions) {
    reconcile::sync(&mut k, &[small_table()], opts).unwrap();
    let st = read(&mut k, &small_table());
    assert_eq!(st.table.flags, 0, "no owner flags on this kernel");
    assert_eq!(st.owner, None);
    nft(&[
        "add",
        "rule",
        "ip",
        "calico",
        "filter-cali-tw-cali12",
        "counter",
    ]);
    // The outside write is drift: the next sync takes it out again.
    let rep = reconcile::sync(&mut k, &[small_table()], opts).unwrap();
    assert!(rep.ops > 0, "the outside rule was not seen");
    drop(k);
    let mut k = Nft::open().unwrap();
    let again = read(&mut k, &small_table());
    assert_eq!(
        canonical_table(&again.table),
        canonical_table(&st.table),
        "policy survived the restart"
    );
    let rep = reconcile::sync(&mut k, &[small_table()], opts).unwrap();
    assert_eq!(rep.ops, 0, "a restart over plain tables changes nothing");
}

#[test]
fn owned_tables_refuse_other_writers_and_are_readopted_after_restart() {
    in_private_netns(|| {
        let opts = SyncOptions::default(); // OwnerPersist
        let mut k = Nft::open().unwrap();
        assert_eq!(
            k.supports_owner_persist().unwrap(),
            common::kernel_has_owned_tables(),
            "the probe disagrees with the release (owned + persistent tables need 6.9)"
        );
        if !common::kernel_has_owned_tables() {
            return plain_tables_where_the_kernel_cannot_own_them(k, &opts);
        }
        reconcile::sync(&mut k, &[small_table()], &opts).unwrap();
        let st = read(&mut k, &small_table());
        assert_eq!(st.table.flags, table_flags::OWNER | table_flags::PERSIST);
        assert_eq!(st.owner, k.owner_id());
        // Another process may read but not write.
        let outside_write = [
            "add",
            "rule",
            "ip",
            "calico",
            "filter-cali-tw-cali12",
            "counter",
        ];
        let (ok, stderr) = nft_status(&outside_write);
        assert!(!ok, "nft wrote into our owned table");
        assert!(stderr.contains("Operation not permitted"), "{stderr}");
        assert!(nft(&["list", "table", "ip", "calico"]).contains("filter-cali-tw-cali12"));
        // Our process "restarts": the table outlives the socket, orphaned.
        drop(k);
        let mut k = Nft::open().unwrap();
        let orphan = read(&mut k, &small_table());
        assert_eq!(orphan.owner, None);
        // The kernel clears OWNER on an orphan and keeps PERSIST.
        assert_eq!(orphan.table.flags, table_flags::PERSIST);
        let mut orphan_t = orphan.table.clone();
        orphan_t.flags = st.table.flags;
        assert_eq!(
            canonical_table(&orphan_t),
            canonical_table(&st.table),
            "policy survived the restart"
        );
        // Re-adoption: NEWTABLE with the flags again, nothing else.
        let rep = reconcile::sync(&mut k, &[small_table()], &opts).unwrap();
        assert_eq!(rep.plans[0].ops, vec![Op::AddTable { flags: 6 }]);
        assert_eq!(read(&mut k, &small_table()).owner, k.owner_id());
        let (ok, _) = nft_status(&outside_write);
        assert!(!ok, "re-adopted table is owned again");
        // Ownership off: plain tables; changing it is an atomic rebuild.
        let rep = reconcile::sync(&mut k, &[small_table()], &plain()).unwrap();
        assert_eq!(rep.plans[0].ops[0], Op::DelTable);
        nft(&outside_write);
    });
}

/// Defaults the kernel fills in (log level, nat max registers and flags, masq proto max,
/// counter values) are not differences: a second sync sends nothing.
#[test]
fn kernel_filled_defaults_are_not_differences() {
    in_private_netns(|| {
        let mut k = Nft::open().unwrap();
        let mut t = Table::new(Family::Ip, "calico");
        let mut post = Chain {
            name: "nat-POSTROUTING".into(),
            base: Some(BaseChain {
                chain_type: ChainType::Nat,
                hook: Hook::Postrouting,
                priority: 110,
                policy: Verdict::Accept,
            }),
            rules: vec![],
        };
        let imm = |dreg, data: Vec<u8>| Expr::ImmediateData { dreg, data };
        post.rules.push(Rule {
            exprs: vec![
                imm(Reg::R1, vec![1, 2, 3, 4]),
                Expr::Nat {
                    kind: NatType::Snat,
                    family: Family::Ip,
                    addr_min: Some(Reg::R1),
                    addr_max: None,
                    proto_min: None,
                    proto_max: None,
                    flags: 0,
                },
            ]
            .into(),
            comment: Some("cali:snat".into()),
            handle: None,
        });
        post.rules.push(Rule {
            exprs: vec![
                Expr::Meta {
                    key: MetaKey::L4Proto,
                    dreg: Reg::R1,
                },
                Expr::Cmp {
                    sreg: Reg::R1,
                    op: CmpOp::Eq,
                    data: vec![6],
                },
                imm(Reg::R1, 1024u16.to_be_bytes().to_vec()),
                Expr::Masq {
                    flags: nat_flags::PROTO_RANDOM_FULLY,
                    proto_min: Some(Reg::R1),
                    proto_max: None,
                },
            ]
            .into(),
            comment: Some("cali:masq".into()),
            handle: None,
        });
        t.chains.insert(post.name.clone(), post);
        let mut c = Chain::regular("filter-cali-log");
        c.rules.push(Rule {
            exprs: vec![
                Expr::Counter {
                    packets: 0,
                    bytes: 0,
                },
                Expr::Log {
                    prefix: Some("calico-drop: ".into()),
                    level: None,
                    group: None,
                    snaplen: None,
                    flags: None,
                },
                Expr::Verdict(Verdict::Drop),
            ]
            .into(),
            comment: Some("cali:log".into()),
            handle: None,
        });
        t.chains.insert(c.name.clone(), c);
        reconcile::sync(&mut k, std::slice::from_ref(&t), &plain()).unwrap();
        let again = reconcile::sync(&mut k, std::slice::from_ref(&t), &plain()).unwrap();
        assert_eq!(again.ops, 0, "{:#?}", again.plans);
    });
}

/// Without a size hint, a dump right after a 100k insert can repeat and miss elements while the
/// rhashtable resizes. The reader detects duplicates and reads again; it
/// never returns a wrong set.
#[test]
fn large_unhinted_set_reads_back_exactly_or_reports_inconsistency() {
    in_private_netns(|| {
        let mut k = Nft::open().unwrap();
        let t = table_of_a_big_set(None);
        k.commit(&[diff::diff(&t, None, false)], None, false)
            .unwrap();
        match k.read_table(Family::Ip, "calico") {
            Ok(Some(st)) => {
                assert_eq!(canonical_table(&st.table), canonical_table(&t));
            }
            Err(NftError::Read { source, .. })
                if matches!(*source, NftError::Inconsistent { .. }) => {}
            other => panic!("{other:?}"),
        }
    });
}

/// A multi-megabyte batch (10k rules in 1000 chains + a 1000-entry vmap) goes in one sendmsg:
/// the send buffer is sized to the batch, and no per-message ACK floods
/// the receive buffer (gotcha 3).
#[test]
fn ten_thousand_rules_go_in_one_transaction() {
    in_private_netns(|| {
        let mut k = Nft::open().unwrap();
        let mut t = Table::new(Family::Ip, "calico");
        let mut vmap = ifname_vmap("filter-cali-to-wl-dispatch");
        for c in 0..1000 {
            let name = format!("filter-cali-tw-cali{c:08}");
            let mut ch = Chain::regular(name.clone());
            for i in 0..10 {
                ch.rules.push(Rule {
                    exprs: vec![
                        Expr::Meta {
                            key: MetaKey::Mark,
                            dreg: Reg::R1,
                        },
                        Expr::Cmp {
                            sreg: Reg::R1,
                            op: CmpOp::Eq,
                            data: (i as u32).to_ne_bytes().to_vec(),
                        },
                        Expr::Counter {
                            packets: 0,
                            bytes: 0,
                        },
                        Expr::Verdict(Verdict::Accept),
                    ]
                    .into(),
                    comment: Some(format!("cali:{c:08x}{i:08x};")),
                    handle: None,
                });
            }
            t.chains.insert(name.clone(), ch);
            vmap.elements
                .push(ifname_element(&format!("cali{c:08}"), Verdict::Goto(name)));
        }
        t.sets.insert(vmap.name.clone(), vmap);
        let start = std::time::Instant::now();
        let rep = reconcile::sync(&mut k, std::slice::from_ref(&t), &plain()).unwrap();
        eprintln!(
            "10k rules + 1000 vmap elements: sync {:?} ({} ops)",
            start.elapsed(),
            rep.ops
        );
        let start = std::time::Instant::now();
        let got = read(&mut k, &t);
        eprintln!("10k rules: read back {:?}", start.elapsed());
        assert_eq!(canonical_table(&got.table), canonical_table(&t));
        // One endpoint changes: one chain rewritten, nothing else.
        let mut t2 = t.clone();
        t2.chains
            .get_mut("filter-cali-tw-cali00000007")
            .unwrap()
            .rules
            .pop();
        let start = std::time::Instant::now();
        let rep = reconcile::sync(&mut k, std::slice::from_ref(&t2), &plain()).unwrap();
        eprintln!(
            "10k rules: 1-chain change, sync with re-read {:?}",
            start.elapsed()
        );
        assert_eq!(rep.ops, 1 + 9, "flush + 9 rules: {}", rep.plans[0]);
        // The steady-state reconciler trusts what it committed while the generation is its own.
        let mut r = reconcile::Reconciler::new(k, plain());
        r.apply(std::slice::from_ref(&t2)).unwrap();
        let mut t3 = t2.clone();
        t3.chains
            .get_mut("filter-cali-tw-cali00000042")
            .unwrap()
            .rules
            .pop();
        let start = std::time::Instant::now();
        let rep = r.apply(std::slice::from_ref(&t3)).unwrap();
        eprintln!(
            "10k rules: 1-chain change, believed state {:?}",
            start.elapsed()
        );
        assert_eq!(rep.ops, 10);
        let got = read(&mut r.kernel, &t3);
        assert_eq!(canonical_table(&got.table), canonical_table(&t3));
    });
}

/// A verdict map with the `counter` template: the kernel takes it, gives every element its own
/// counter, and counts each element's packets and bytes apart (read back by our dump and by
/// `nft -j`). The template is part of the map's definition: a resync changes nothing, and
/// adding or dropping it rebuilds the table atomically in one batch, after which a resync
/// again changes nothing.
#[test]
fn map_elements_count_their_own_packets_and_bytes() {
    in_private_netns(|| {
        let up = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("running ip");
        assert!(up.success(), "ip link set lo up");
        let mut k = Nft::open().unwrap();
        let table = |counter: bool| {
            let mut t = Table::new(Family::Ip, "calico");
            for name in ["wl-a", "wl-b"] {
                let c = Chain::regular(name);
                t.chains.insert(c.name.clone(), c);
            }
            let elem = |ifn: &str, chain: &str| ifname_element(ifn, Verdict::Jump(chain.into()));
            let map = Set {
                elements: vec![elem("lo", "wl-a"), elem("cali0", "wl-b")],
                counter,
                ..ifname_vmap("to-wl")
            };
            t.sets.insert(map.name.clone(), map);
            let mut out = Chain {
                name: "out".into(),
                base: Some(BaseChain {
                    chain_type: ChainType::Filter,
                    hook: Hook::Output,
                    priority: 0,
                    policy: Verdict::Accept,
                }),
                rules: vec![],
            };
            out.rules.push(Rule {
                exprs: vec![
                    Expr::Meta {
                        key: MetaKey::OifName,
                        dreg: Reg::R1,
                    },
                    Expr::Lookup {
                        set: "to-wl".into(),
                        set_id: None,
                        sreg: Reg::R1,
                        dreg: Some(Reg::VERDICT),
                        invert: false,
                    },
                ]
                .into(),
                comment: None,
                handle: None,
            });
            t.chains.insert(out.name.clone(), out);
            t
        };
        let counted = table(true);
        reconcile::sync(&mut k, std::slice::from_ref(&counted), &plain()).unwrap();
        let again = reconcile::sync(&mut k, std::slice::from_ref(&counted), &plain()).unwrap();
        assert_eq!(again.ops, 0, "{:#?}", again.plans);

        let key = |n: &str| ifname(n);
        let counter = |k: &mut Nft, n: &str| {
            let st = read(k, &counted);
            let m = &st.table.sets["to-wl"];
            assert!(m.counter, "template read back");
            m.counters
                .get(&key(n))
                .map(|c| (c.packets, c.bytes))
                .unwrap_or_else(|| panic!("no counter for {n}: {:?}", m.counters))
        };
        assert_eq!(counter(&mut k, "lo"), (0, 0));
        assert_eq!(counter(&mut k, "cali0"), (0, 0));

        // Three 100-byte UDP datagrams out of lo: 3 packets of 20 + 8 + 100 bytes.
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            tx.send_to(&[7u8; 100], rx.local_addr().unwrap()).unwrap();
        }
        let mut buf = [0u8; 200];
        for _ in 0..3 {
            rx.recv(&mut buf).unwrap();
        }
        assert_eq!(counter(&mut k, "lo"), (3, 3 * 128));
        assert_eq!(counter(&mut k, "cali0"), (0, 0));
        let json = nft(&["-j", "list", "map", "ip", "calico", "to-wl"]);
        assert!(
            json.contains(r#""val": "lo", "counter": {"packets": 3, "bytes": 384}"#),
            "nft sees the same counter: {json}"
        );
        // Counters are state: still no difference to the desired table.
        let again = reconcile::sync(&mut k, std::slice::from_ref(&counted), &plain()).unwrap();
        assert_eq!(again.ops, 0, "{:#?}", again.plans);

        // Dropping the template and adding it back: each a rebuild of the table in one batch
        // (the kernel cannot change a set's expressions in place), then nothing more to do.
        for t in [table(false), table(true)] {
            let r = reconcile::sync(&mut k, std::slice::from_ref(&t), &plain()).unwrap();
            assert!(
                r.plans[0].ops.first() == Some(&Op::DelTable),
                "rebuilt: {}",
                r.plans[0]
            );
            let st = read(&mut k, &t);
            assert_eq!(st.table.sets["to-wl"].counter, t.sets["to-wl"].counter);
            let again = reconcile::sync(&mut k, std::slice::from_ref(&t), &plain()).unwrap();
            assert_eq!(again.ops, 0, "{:#?}", again.plans);
        }
        assert_eq!(counter(&mut k, "lo"), (0, 0), "a new map counts from zero");
    });
}

// ---------------------------------------------------------------------------------------------
// The README's example.

/// The example of `README.md`, verbatim (the test first checks that it still is), run in a
/// private network namespace.
#[test]
fn readme_example_commits_a_table_and_reads_it_back() {
    use nf_tables::build::{Dir, RuleBuilder};
    use nf_tables::diff;
    use nf_tables::model::{BaseChain, Chain, ChainType, Family, Hook, Rule, Table, Verdict};
    use nf_tables::reconcile::{Nft, NftKernel};
    use nf_tables::NftError;

    fn main() -> Result<(), NftError> {
        // `ip demo`: an input base chain with one rule, the expressions nft makes of its text.
        let rule = RuleBuilder::new(Family::Ip)
            .l4proto(6)
            .th_port(Dir::Dst, 22, 22, false)
            .counter()
            .accept()
            .build();
        assert_eq!(rule.text, "meta l4proto tcp th dport 22 counter accept");
        let mut input = Chain::regular("input");
        input.base = Some(BaseChain {
            chain_type: ChainType::Filter,
            hook: Hook::Input,
            priority: 0,
            policy: Verdict::Accept,
        });
        input.rules.push(Rule {
            exprs: rule.exprs.into(),
            ..Rule::default()
        });
        let mut table = Table::new(Family::Ip, "demo");
        table.chains.insert(input.name.clone(), input);

        // One socket, one atomic batch; refused (ERESTART) if anyone committed since `generation`.
        let mut nft = Nft::open()?;
        let generation = nft.generation()?;
        nft.commit(&[diff::diff(&table, None, false)], Some(generation), false)?;

        // Read back (GETTABLE, then dumps): nothing differs from `table`.
        let state = nft.read_table(Family::Ip, "demo")?.unwrap();
        assert!(diff::diff(&table, Some(&state.table), false).is_empty());
        Ok(())
    }

    let readme = include_str!("../../README.md");
    let code = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("README.md has a rust code block");
    let want: Vec<&str> = code.lines().map(str::trim).collect();
    let here: Vec<&str> = include_str!("nft_kernel.rs")
        .lines()
        .map(str::trim)
        .collect();
    assert!(
        here.windows(want.len()).any(|w| w == want.as_slice()),
        "the README's example is not the code of this test"
    );
    in_private_netns(|| main().unwrap());
}
