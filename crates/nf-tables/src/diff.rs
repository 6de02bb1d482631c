//! Desired vs actual → the minimal ordered list of operations for one atomic batch, as Calico's
//! table reconciler computes it:
//!
//! 1. table (create, flag update, or re-adoption of an orphaned persistent table);
//! 2. new sets and maps, then element deltas of plain sets (deletions before additions);
//! 3. new chains (and base-chain policy updates);
//! 4. rules: a chain whose rules differ is rewritten — flush + add in the same batch. Rule
//!    identity is the userdata comment plus the expressions, compared in canonical form
//!    (counter values, set ids and handles never count as a difference);
//! 5. map element deltas (after the chains their verdicts point to exist);
//! 6. deletions: unwanted chains are flushed first, then deleted, then unwanted sets, so every
//!    reference is gone before the object it points to.
//!
//! A change the kernel cannot make in place (set key/flags/size, base-chain hook/type/priority,
//! the owner flag) becomes a full rebuild: delete + add table inside the same batch. An empty
//! diff has no operations and sends nothing. Interval sets are normalised first: overlapping
//! and adjacent ranges merged, so an update never fails on EEXIST.
//!
//! Anonymous sets are encoded and decoded but the diff treats them as named sets; renderers
//! should use named sets (docs/design.md, cost model).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use super::batch::Batch;
use super::codec::CodecError;
use super::model::*;
use super::print;

/// One operation on one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// NEWTABLE: create, update flags, or re-adopt.
    AddTable {
        /// `NFTA_TABLE_FLAGS` to set (`NFT_TABLE_F_*`).
        flags: u32,
    },
    /// DELTABLE: the table and everything in it.
    DelTable,
    /// NEWSET without elements. (Boxed, as is `AddChain`'s chain: an `Op` is as big as its
    /// biggest variant, and a full load is mostly `AddRule`s.)
    AddSet(Box<Set>),
    /// DELSET of the named set or map (no rule may still look it up).
    DelSet(String),
    /// NEWSETELEM: elements added to a set or map.
    AddElements {
        /// The set or map, by name.
        set: String,
        /// The elements, in kernel form.
        elements: Vec<Element>,
    },
    /// DELSETELEM: elements deleted from a set or map (each must be there).
    DelElements {
        /// The set or map, by name.
        set: String,
        /// The elements, in kernel form.
        elements: Vec<Element>,
    },
    /// NEWCHAIN without rules (also updates a base chain's policy).
    AddChain(Box<Chain>),
    /// DELRULE with table and chain only: deletes every rule of the named chain.
    FlushChain(String),
    /// DELCHAIN of the named chain (empty, and no longer jumped to).
    DelChain(String),
    /// NEWRULE appended to `chain`; `index` is its position, for messages. The chain's name
    /// is shared by all its rules' operations.
    AddRule {
        /// The chain the rule is appended to.
        chain: Arc<str>,
        /// The rule's position in the chain, from 0.
        index: usize,
        /// The rule to append.
        rule: Rule,
    },
}

/// The operations for one table, in batch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Family of the table.
    pub family: Family,
    /// Name of the table.
    pub table: String,
    /// The operations, in the order the batch carries them.
    pub ops: Vec<Op>,
}

impl Plan {
    /// True when there is nothing to do: an empty plan sends nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// A generous estimate of the encoded size, so the batch buffer is allocated once instead
    /// of being copied as it doubles (a full load is tens of MB).
    pub fn size_hint(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::AddRule { rule, .. } => {
                    128 + rule.exprs.len() * 80 + rule.comment.as_ref().map_or(0, |c| c.len() + 8)
                }
                Op::AddElements { elements, .. } | Op::DelElements { elements, .. } => {
                    64 + elements
                        .iter()
                        .map(|e| {
                            48 + e.key.len()
                                + e.key_end.as_ref().map_or(0, |k| k.len() + 8)
                                + e.data.as_ref().map_or(0, |_| 64)
                        })
                        .sum::<usize>()
                }
                _ => 256,
            })
            .sum()
    }

    /// Appends this plan's messages to a batch.
    pub fn encode(&self, b: &mut Batch) -> Result<(), CodecError> {
        let (f, t) = (self.family, self.table.as_str());
        for op in &self.ops {
            match op {
                Op::AddTable { flags } => b.add_table(f, t, *flags),
                Op::DelTable => b.del_table(f, t),
                Op::AddSet(s) => b.add_set(f, t, s),
                Op::DelSet(s) => b.del_set(f, t, s),
                Op::AddElements { set, elements } => b.add_elements(f, t, set, elements)?,
                Op::DelElements { set, elements } => b.del_elements(f, t, set, elements)?,
                Op::AddChain(c) => b.add_chain(f, t, c),
                Op::FlushChain(c) => b.flush_chain(f, t, c),
                Op::DelChain(c) => b.del_chain(f, t, c),
                Op::AddRule { chain, index, rule } => b.add_rule(f, t, chain, *index, rule)?,
            }
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    /// `plan` output: one line per operation, rules in debug form.
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tn = format!("{} {}", self.family.name(), self.table);
        for op in &self.ops {
            match op {
                Op::AddTable { flags } => writeln!(out, "add table {tn} flags 0x{flags:x}")?,
                Op::DelTable => writeln!(out, "delete table {tn}")?,
                Op::AddSet(s) => writeln!(out, "add set {tn} {}", s.name)?,
                Op::DelSet(s) => writeln!(out, "delete set {tn} {s}")?,
                Op::AddElements { set, elements } => {
                    writeln!(out, "add {} elements to {tn} {set}", elements.len())?;
                    for e in elements {
                        writeln!(out, "  + {}", print::element(e))?;
                    }
                }
                Op::DelElements { set, elements } => {
                    writeln!(out, "delete {} elements from {tn} {set}", elements.len())?;
                    for e in elements {
                        writeln!(out, "  - {}", print::element(e))?;
                    }
                }
                Op::AddChain(c) => writeln!(out, "add chain {tn} {}", c.name)?,
                Op::FlushChain(c) => writeln!(out, "flush chain {tn} {c}")?,
                Op::DelChain(c) => writeln!(out, "delete chain {tn} {c}")?,
                Op::AddRule { chain, index, rule } => {
                    writeln!(out, "add rule {tn} {chain} #{index}")?;
                    write!(out, "{}", print::rule(rule))?;
                }
            }
        }
        Ok(())
    }
}

/// A rule as compared: no handle, zero counters, no batch-local set ids, and the defaults the
/// kernel fills in made explicit (so desired and read-back forms are equal).
pub fn canonical_rule(r: &Rule) -> Rule {
    let exprs = r
        .exprs
        .iter()
        .map(|e| match e.clone() {
            Expr::Counter { .. } => Expr::Counter {
                packets: 0,
                bytes: 0,
            },
            Expr::Lookup {
                set,
                sreg,
                dreg,
                invert,
                ..
            } => Expr::Lookup {
                set,
                set_id: None,
                sreg,
                dreg,
                invert,
            },
            Expr::Nat {
                kind,
                family,
                addr_min,
                addr_max,
                proto_min,
                proto_max,
                mut flags,
            } => {
                // nft_nat_init: a missing max defaults to the min; MAP_IPS / PROTO_SPECIFIED
                // are set by the kernel when registers are given.
                if addr_min.is_some() {
                    flags |= nat_flags::MAP_IPS;
                }
                if proto_min.is_some() {
                    flags |= nat_flags::PROTO_SPECIFIED;
                }
                Expr::Nat {
                    kind,
                    family,
                    addr_min,
                    addr_max: addr_max.or(addr_min),
                    proto_min,
                    proto_max: proto_max.or(proto_min),
                    flags,
                }
            }
            Expr::Masq {
                flags,
                proto_min,
                proto_max,
            } => Expr::Masq {
                flags,
                proto_min,
                proto_max: proto_max.or(proto_min),
            },
            Expr::Log {
                prefix,
                level,
                group,
                snaplen,
                flags,
            } => Expr::Log {
                prefix,
                // nft_log_dump always reports the level of a non-group log (default 4, warn).
                level: if group.is_none() {
                    level.or(Some(4))
                } else {
                    level
                },
                group,
                snaplen,
                flags: flags.filter(|f| *f != 0),
            },
            other => other,
        })
        .collect();
    Rule {
        exprs,
        comment: r.comment.clone(),
        handle: None,
    }
}

/// Rule identity: equal after [`canonical_rule`], without cloning in the common case.
pub fn rule_eq(a: &Rule, b: &Rule) -> bool {
    if a.comment != b.comment || a.exprs.len() != b.exprs.len() {
        return false;
    }
    a.exprs
        .iter()
        .zip(b.exprs.iter())
        .all(|(x, y)| match (x, y) {
            (Expr::Counter { .. }, Expr::Counter { .. }) => true,
            (
                Expr::Lookup {
                    set,
                    sreg,
                    dreg,
                    invert,
                    ..
                },
                Expr::Lookup {
                    set: s2,
                    sreg: r2,
                    dreg: d2,
                    invert: i2,
                    ..
                },
            ) => set == s2 && sreg == r2 && dreg == d2 && invert == i2,
            (Expr::Nat { .. } | Expr::Masq { .. } | Expr::Log { .. }, _) => {
                let one = |e: &Expr| {
                    canonical_rule(&Rule {
                        exprs: [e.clone()].into(),
                        comment: None,
                        handle: None,
                    })
                };
                one(x) == one(y)
            }
            _ => x == y,
        })
}

/// `[start, end)` of an interval set, with the value of an interval map's range.
type KeyRange = (ElemKey, Option<ElemKey>, Option<Box<ElemData>>);

fn is_interval(s: &Set) -> bool {
    s.flags & set_flags::INTERVAL != 0 && s.key.len() == 1
}

/// `[start, end)` ranges of an interval set's kernel-form elements (start element, then an
/// `INTERVAL_END` element at the first key after the range). `end == None`: to the top.
fn ranges(elems: &[Element]) -> Vec<KeyRange> {
    let mut sorted: Vec<&Element> = elems.iter().collect();
    // At equal keys an END sorts first: it closes the previous range before a new one opens.
    sorted.sort_by(|a, b| {
        a.key.cmp(&b.key).then_with(|| {
            let ae = a.flags & elem_flags::INTERVAL_END != 0;
            let be = b.flags & elem_flags::INTERVAL_END != 0;
            be.cmp(&ae)
        })
    });
    // The elements are read as start/end pairs whose union is the set: count nesting depth, so
    // overlapping pairs (10.0.0.0/8 with 10.1.0.0/16 inside) give their union.
    let mut out = Vec::new();
    let mut open: Option<(ElemKey, Option<Box<ElemData>>)> = None;
    let mut depth = 0usize;
    for e in sorted {
        if e.flags & elem_flags::INTERVAL_END != 0 {
            // An END with nothing open (nft's leading 0.0.0.0 END) bounds nothing.
            if depth > 0 {
                depth -= 1;
                if depth == 0 {
                    if let Some((s, d)) = open.take() {
                        out.push((s, Some(e.key.clone()), d));
                    }
                }
            }
        } else {
            if depth == 0 {
                open = Some((e.key.clone(), e.data.clone()));
            }
            depth += 1;
        }
    }
    if let Some((s, d)) = open {
        out.push((s, None, d));
    }
    out
}

/// Sorted, merged ranges back to kernel-form elements.
fn merge_ranges(mut rs: Vec<KeyRange>) -> Vec<Element> {
    rs.sort();
    let mut merged: Vec<KeyRange> = Vec::new();
    for (s, e, d) in rs {
        if let Some(last) = merged.last_mut() {
            let touches = match &last.1 {
                None => true,
                Some(end) => s <= *end,
            };
            if touches && last.2 == d {
                last.1 = match (&last.1, e) {
                    (None, _) | (_, None) => None,
                    (Some(a), Some(b)) => Some(if *a >= b { a.clone() } else { b }),
                };
                continue;
            }
        }
        merged.push((s, e, d));
    }
    range_elems(merged)
}

/// A set's elements in canonical form: interval ranges merged (overlapping and adjacent), and
/// every set sorted and de-duplicated.
pub fn normalize_elements(s: &Set) -> Vec<Element> {
    if is_interval(s) {
        return merge_ranges(ranges(&s.elements));
    }
    let mut v = s.elements.clone();
    v.sort_unstable();
    v.dedup();
    v
}

/// Interval helper for renderers: CIDR-style `[start, end)` key ranges (network order, `end`
/// `None` for "to the top") → kernel-form elements, merged.
pub fn interval_elements(
    ranges_: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
) -> Vec<Element> {
    merge_ranges(
        ranges_
            .into_iter()
            .map(|(s, e)| (s.into(), e.map(ElemKey::from), None))
            .collect(),
    )
}

/// The set's definition, without elements.
fn def(s: &Set) -> Set {
    Set {
        name: s.name.clone(),
        key: s.key.clone(),
        flags: s.flags,
        data: s.data,
        size: s.size,
        elements: Vec::new(),
        counter: s.counter,
        counters: ElemCounters::default(),
    }
}

/// The chain's definition, without rules.
fn chain_def(c: &Chain) -> Chain {
    Chain {
        name: c.name.clone(),
        base: c.base.clone(),
        rules: Vec::new(),
    }
}

/// Same definition (everything but the elements), without copying.
fn same_def(a: &Set, b: &Set) -> bool {
    a.name == b.name
        && a.key == b.key
        && a.flags == b.flags
        && a.data == b.data
        && a.size == b.size
        && a.counter == b.counter
}

/// A table in canonical form: rules canonical, elements normalised. Two tables are the same
/// state iff their canonical forms are equal.
pub fn canonical_table(t: &Table) -> Table {
    let mut t = t.clone();
    for c in t.chains.values_mut() {
        c.rules = c.rules.iter().map(canonical_rule).collect();
    }
    for s in t.sets.values_mut() {
        s.elements = normalize_elements(s);
    }
    t
}

/// Element delta of one set: (to delete, to add).
fn element_delta(desired: &Set, actual: &Set) -> (Vec<Element>, Vec<Element>) {
    if !is_interval(desired) {
        // Identity is the whole element (key, key_end, flags, value): a changed map value is
        // delete + add. Hash sets of references: no copy of unchanged elements.
        let ds: HashSet<&Element> = desired.elements.iter().collect();
        let as_: HashSet<&Element> = actual.elements.iter().collect();
        let mut del: Vec<Element> = as_
            .iter()
            .filter(|e| !ds.contains(*e))
            .map(|e| (*e).clone())
            .collect();
        let mut add: Vec<Element> = ds
            .iter()
            .filter(|e| !as_.contains(*e))
            .map(|e| (*e).clone())
            .collect();
        del.sort();
        add.sort();
        return (del, add);
    }
    // Interval sets: compare whole merged ranges; a range that changed is removed and re-added.
    let dr: BTreeSet<_> = ranges(&normalize_elements(desired)).into_iter().collect();
    let ar: BTreeSet<_> = ranges(&normalize_elements(actual)).into_iter().collect();
    let del: Vec<_> = ar.difference(&dr).cloned().collect();
    let add: Vec<_> = dr.difference(&ar).cloned().collect();
    (range_elems(del), range_elems(add))
}

/// Ranges to kernel-form elements: a start, and an interval end unless the range is open.
fn range_elems(rs: Vec<KeyRange>) -> Vec<Element> {
    let mut out = Vec::with_capacity(rs.len() * 2);
    for (s, e, d) in rs {
        out.push(Element {
            key: s,
            key_end: None,
            flags: 0,
            data: d,
        });
        if let Some(end) = e {
            out.push(Element {
                key: end,
                key_end: None,
                flags: elem_flags::INTERVAL_END,
                data: None,
            });
        }
    }
    out
}

/// Flags the kernel will not change on an existing table.
const FIXED_TABLE_FLAGS: u32 = table_flags::OWNER | table_flags::PERSIST;

fn needs_rebuild(desired: &Table, actual: &Table) -> Option<String> {
    // An orphaned persistent table reads back as PERSIST without OWNER; NEWTABLE with
    // OWNER|PERSIST re-adopts it, so that is no rebuild.
    let adoptable = actual.flags & FIXED_TABLE_FLAGS == table_flags::PERSIST
        && desired.flags & FIXED_TABLE_FLAGS == FIXED_TABLE_FLAGS;
    if !adoptable && (desired.flags ^ actual.flags) & FIXED_TABLE_FLAGS != 0 {
        return Some("owner/persist flags changed".into());
    }
    for (name, ds) in &desired.sets {
        if let Some(as_) = actual.sets.get(name) {
            if !same_def(ds, as_) {
                return Some(format!("definition of set {name} changed"));
            }
        }
    }
    for (name, dc) in &desired.chains {
        if let Some(ac) = actual.chains.get(name) {
            let same_hook = match (&dc.base, &ac.base) {
                (None, None) => true,
                (Some(d), Some(a)) => {
                    d.chain_type == a.chain_type && d.hook == a.hook && d.priority == a.priority
                }
                _ => false,
            };
            if !same_hook {
                return Some(format!("hook of chain {name} changed"));
            }
        }
    }
    None
}

/// Everything to create `t` from nothing (after an optional delete).
fn create_all(t: &Table, ops: &mut Vec<Op>) {
    create_ops(t, ops, |c| c.rules.clone(), normalize_elements);
}

/// The operations that create `t`, in the order the kernel binds cheapest: table, sets (plain
/// sets with their elements; the most looked-up first, see [`by_lookups`]), chains, rules, then
/// map elements (their verdicts point at the chains). `rules` and `elements` give what goes into
/// the plan for a chain and a set (an empty list sends nothing).
fn create_ops(
    t: &Table,
    ops: &mut Vec<Op>,
    mut rules: impl FnMut(&Chain) -> Vec<Rule>,
    mut elements: impl FnMut(&Set) -> Vec<Element>,
) {
    let mut add_elements = |ops: &mut Vec<Op>, s: &Set| {
        let elements = elements(s);
        if !elements.is_empty() {
            ops.push(Op::AddElements {
                set: s.name.clone(),
                elements,
            });
        }
    };
    let rules: Vec<(Arc<str>, Vec<Rule>)> = t
        .chains
        .values()
        .map(|c| (c.name.as_str().into(), rules(c)))
        .collect();
    ops.push(Op::AddTable { flags: t.flags });
    for s in by_lookups(t, rules.iter().flat_map(|(_, r)| r)) {
        ops.push(Op::AddSet(Box::new(def(s))));
        if s.data.is_none() {
            add_elements(ops, s);
        }
    }
    for c in t.chains.values() {
        ops.push(Op::AddChain(Box::new(chain_def(c))));
    }
    for (name, rules) in rules {
        for (i, r) in rules.into_iter().enumerate() {
            ops.push(Op::AddRule {
                chain: name.clone(),
                index: i,
                rule: r,
            });
        }
    }
    for s in t.sets.values() {
        if s.data.is_some() {
            add_elements(ops, s);
        }
    }
}

/// `t`'s sets in the order to create them: the ones most `rules` look up first, then by name.
/// The kernel finds the set a new rule looks up by walking the table's set list from the first
/// set created, so a set that thousands of rules name would otherwise cost each of them a walk
/// past every set created before it (a port set shared by every policy, behind thousands of
/// IP sets).
fn by_lookups<'t, 'r>(t: &'t Table, rules: impl Iterator<Item = &'r Rule>) -> Vec<&'t Set> {
    let mut lookups: HashMap<&str, usize> = HashMap::new();
    for r in rules {
        for e in r.exprs.iter() {
            if let Expr::Lookup { set, .. } = e {
                *lookups.entry(set.as_str()).or_default() += 1;
            }
        }
    }
    let mut sets: Vec<&Set> = t.sets.values().collect();
    // Stable: sets looked up equally often stay in name order.
    sets.sort_by_key(|s| std::cmp::Reverse(lookups.get(s.name.as_str()).copied().unwrap_or(0)));
    sets
}

/// The plan that creates `t` from nothing, with its rules *moved* into the plan instead of
/// copied (a full load's rules are most of its memory). Give them back with
/// [`return_rules`] once the batch is encoded; until then `t`'s chains are empty.
pub fn create_lending(t: &mut Table) -> Plan {
    let mut rules: BTreeMap<String, Vec<Rule>> = t
        .chains
        .values_mut()
        .map(|c| (c.name.clone(), std::mem::take(&mut c.rules)))
        .collect();
    let mut elements: BTreeMap<String, Vec<Element>> = t
        .sets
        .values_mut()
        .map(|s| (s.name.clone(), lend_elements(s)))
        .collect();
    let n: usize = rules.values().map(Vec::len).sum();
    let mut ops = Vec::with_capacity(1 + 2 * t.sets.len() + t.chains.len() + n);
    create_ops(
        t,
        &mut ops,
        |c| rules.remove(&c.name).unwrap_or_default(),
        |s| elements.remove(&s.name).unwrap_or_default(),
    );
    Plan {
        family: t.family,
        table: t.name.clone(),
        ops,
    }
}

/// The elements to send for `s`: moved out of it when they are already in normal form (the
/// renderer's output is), so [`return_rules`] can give them back; a normalised copy otherwise.
fn lend_elements(s: &mut Set) -> Vec<Element> {
    if !is_interval(s) && s.elements.windows(2).all(|w| w[0] < w[1]) {
        // Strictly sorted is the normal form of a plain set: nothing to copy or compare.
        return std::mem::take(&mut s.elements);
    }
    // Interval sets as nft (and our renderer) write them open with an `INTERVAL_END` at zero
    // marking the gap below the first range; that is the same set.
    let body = match s.elements.first() {
        Some(e)
            if is_interval(s)
                && e.flags & elem_flags::INTERVAL_END != 0
                && e.key.iter().all(|b| *b == 0) =>
        {
            &s.elements[1..]
        }
        _ => &s.elements[..],
    };
    if is_interval(s) && s.data.is_none() && is_merged_ranges(body) {
        // Already what normalising would make of it (the renderer's are): no copy to compare.
        return std::mem::take(&mut s.elements);
    }
    let norm = normalize_elements(s);
    if norm == body {
        drop(norm);
        std::mem::take(&mut s.elements)
    } else {
        norm
    }
}

/// Whether dataless interval elements are exactly what [`merge_ranges`] makes of them:
/// start/end pairs, each range non-empty, ranges ascending with a gap between each two (touching
/// ones would have been merged), only the last one possibly open to the top.
fn is_merged_ranges(body: &[Element]) -> bool {
    let plain =
        |e: &Element, flags: u32| e.flags == flags && e.key_end.is_none() && e.data.is_none();
    let mut prev_end: Option<&[u8]> = None;
    for pair in body.chunks(2) {
        let start = &pair[0];
        if !plain(start, 0) || prev_end.is_some_and(|p| *start.key <= *p) {
            return false;
        }
        if let Some(end) = pair.get(1) {
            if !plain(end, elem_flags::INTERVAL_END) || end.key <= start.key {
                return false;
            }
            prev_end = Some(&end.key);
        }
    }
    true
}

/// Moves the rules and elements [`create_lending`] took back into `t`; the plan keeps its
/// operations (for counting) with empty rules and element lists.
pub fn return_rules(plan: &mut Plan, t: &mut Table) {
    // A chain's rules follow each other in the plan: one lookup per chain, not per rule.
    let mut cur: Option<(Arc<str>, &mut Chain)> = None;
    for op in &mut plan.ops {
        match op {
            Op::AddRule { chain, rule, .. } => {
                if cur.as_ref().is_none_or(|(n, _)| **n != **chain) {
                    cur = t.chains.get_mut(&**chain).map(|c| (chain.clone(), c));
                }
                if let Some((_, c)) = &mut cur {
                    c.rules.push(std::mem::take(rule));
                }
            }
            Op::AddElements { set, elements } => {
                if let Some(s) = t.sets.get_mut(set.as_str()) {
                    if s.elements.is_empty() {
                        s.elements = std::mem::take(elements);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The plan that turns `actual` into `desired`. `readopt` forces a NEWTABLE with the desired
/// flags (re-adopting an orphaned OWNER|PERSIST table).
pub fn diff(desired: &Table, actual: Option<&Table>, readopt: bool) -> Plan {
    let mut ops = Vec::new();
    let plan = |ops| Plan {
        family: desired.family,
        table: desired.name.clone(),
        ops,
    };
    let Some(actual) = actual else {
        create_all(desired, &mut ops);
        return plan(ops);
    };
    if let Some(why) = needs_rebuild(desired, actual) {
        tracing::info!(table = %desired.name, family = desired.family.name(), why, "rebuilding table atomically");
        return rebuild(desired);
    }
    if desired.flags != actual.flags || readopt {
        ops.push(Op::AddTable {
            flags: desired.flags,
        });
    }
    // 2. sets, plain-set elements.
    for (name, ds) in &desired.sets {
        match actual.sets.get(name) {
            None => ops.push(Op::AddSet(Box::new(def(ds)))),
            Some(as_) if ds.data.is_none() => push_delta(&mut ops, name, element_delta(ds, as_)),
            Some(_) => {}
        }
        if ds.data.is_none() && !actual.sets.contains_key(name) && !ds.elements.is_empty() {
            ops.push(Op::AddElements {
                set: name.clone(),
                elements: normalize_elements(ds),
            });
        }
    }
    // 3. chains.
    for (name, dc) in &desired.chains {
        let changed = match actual.chains.get(name) {
            None => true,
            Some(ac) => dc.base.as_ref().map(|b| &b.policy) != ac.base.as_ref().map(|b| &b.policy),
        };
        if changed {
            ops.push(Op::AddChain(Box::new(chain_def(dc))));
        }
    }
    // 4. rules: wholesale rewrite of chains whose rules differ.
    for (name, dc) in &desired.chains {
        let actual_rules = actual.chains.get(name).map(|c| &c.rules);
        let same = actual_rules.is_some_and(|ar| {
            ar.len() == dc.rules.len() && ar.iter().zip(&dc.rules).all(|(a, d)| rule_eq(a, d))
        });
        if same {
            continue;
        }
        if actual_rules.is_some_and(|ar| !ar.is_empty()) {
            ops.push(Op::FlushChain(name.clone()));
        }
        let chain: Arc<str> = name.as_str().into();
        for (i, r) in dc.rules.iter().enumerate() {
            ops.push(Op::AddRule {
                chain: chain.clone(),
                index: i,
                rule: r.clone(),
            });
        }
    }
    // 5. map elements.
    for (name, ds) in &desired.sets {
        if ds.data.is_none() {
            continue;
        }
        match actual.sets.get(name) {
            Some(as_) => push_delta(&mut ops, name, element_delta(ds, as_)),
            None if !ds.elements.is_empty() => ops.push(Op::AddElements {
                set: name.clone(),
                elements: normalize_elements(ds),
            }),
            None => {}
        }
    }
    // 6. deletions, references first.
    let gone: Vec<&Chain> = actual
        .chains
        .values()
        .filter(|c| !desired.chains.contains_key(&c.name))
        .collect();
    for c in &gone {
        if !c.rules.is_empty() {
            ops.push(Op::FlushChain(c.name.clone()));
        }
    }
    for c in &gone {
        ops.push(Op::DelChain(c.name.clone()));
    }
    for name in actual.sets.keys() {
        if !desired.sets.contains_key(name) {
            ops.push(Op::DelSet(name.clone()));
        }
    }
    plan(ops)
}

fn push_delta(ops: &mut Vec<Op>, set: &str, (del, add): (Vec<Element>, Vec<Element>)) {
    if !del.is_empty() {
        ops.push(Op::DelElements {
            set: set.to_owned(),
            elements: del,
        });
    }
    if !add.is_empty() {
        ops.push(Op::AddElements {
            set: set.to_owned(),
            elements: add,
        });
    }
}

/// Full rebuild inside one batch: delete the table and create it again (the hooks never
/// disappear in between: the batch is atomic).
pub fn rebuild(desired: &Table) -> Plan {
    let mut ops = vec![Op::DelTable];
    create_all(desired, &mut ops);
    Plan {
        family: desired.family,
        table: desired.name.clone(),
        ops,
    }
}

/// Deleting a whole table (cleanup).
pub fn delete(family: Family, table: &str) -> Plan {
    Plan {
        family,
        table: table.to_owned(),
        ops: vec![Op::DelTable],
    }
}

/// Kernel-like errors of [`apply`] (errno names as the kernel would answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{errno}: {what}")]
pub struct ApplyError {
    /// The errno name the kernel would answer with (`"ENOENT"`, `"EEXIST"`, `"EBUSY"`, ...).
    pub errno: &'static str,
    /// The refused operation and its object.
    pub what: String,
}

fn err(errno: &'static str, what: String) -> ApplyError {
    ApplyError { errno, what }
}

fn references_chain(t: &Table, chain: &str) -> bool {
    let jumps = |v: &Verdict| matches!(v, Verdict::Jump(c) | Verdict::Goto(c) if c == chain);
    t.chains.values().any(|c| {
        c.rules.iter().any(|r| {
            r.exprs
                .iter()
                .any(|e| matches!(e, Expr::Verdict(v) if jumps(v)))
        })
    }) || t.sets.values().any(|s| {
        s.elements
            .iter()
            .any(|e| matches!(e.data.as_deref(), Some(ElemData::Verdict(v)) if jumps(v)))
    })
}

fn references_set(t: &Table, set: &str) -> bool {
    t.chains.values().any(|c| {
        c.rules.iter().any(|r| {
            r.exprs
                .iter()
                .any(|e| matches!(e, Expr::Lookup { set: s, .. } if s == set))
        })
    })
}

/// Applies plans to an in-memory ruleset with the kernel's referential checks, all or nothing.
/// This is the fake kernel of [`crate::reconcile::FakeNft`] and the oracle of the diff
/// property tests.
pub fn apply(
    tables: &mut BTreeMap<(Family, String), Table>,
    plans: &[Plan],
) -> Result<(), ApplyError> {
    let mut next = tables.clone();
    for p in plans {
        let key = (p.family, p.table.clone());
        for op in &p.ops {
            if let Op::AddTable { flags } = op {
                next.entry(key.clone())
                    .or_insert_with(|| Table::new(p.family, p.table.clone()))
                    .flags = *flags;
                continue;
            }
            if let Op::DelTable = op {
                next.remove(&key)
                    .ok_or_else(|| err("ENOENT", format!("table {}", p.table)))?;
                continue;
            }
            let t = next
                .get_mut(&key)
                .ok_or_else(|| err("ENOENT", format!("table {}", p.table)))?;
            apply_op(t, op)?;
        }
    }
    *tables = next;
    Ok(())
}

fn apply_op(t: &mut Table, op: &Op) -> Result<(), ApplyError> {
    match op {
        Op::AddTable { .. } | Op::DelTable => {}
        Op::AddSet(s) => match t.sets.get(&s.name) {
            Some(old) if !same_def(old, s) => {
                return Err(err(
                    "EEXIST",
                    format!("set {} with another definition", s.name),
                ))
            }
            Some(_) => {}
            None => {
                t.sets.insert(s.name.clone(), def(s));
            }
        },
        Op::DelSet(name) => {
            if references_set(t, name) {
                return Err(err("EBUSY", format!("set {name} is referenced")));
            }
            t.sets
                .remove(name)
                .ok_or_else(|| err("ENOENT", format!("set {name}")))?;
        }
        Op::AddElements { set, elements } => add_elements(t, set, elements)?,
        Op::DelElements { set, elements } => del_elements(t, set, elements)?,
        Op::AddChain(c) => {
            let entry = t
                .chains
                .entry(c.name.clone())
                .or_insert_with(|| Chain::regular(c.name.clone()));
            entry.base = c.base.clone();
        }
        Op::FlushChain(name) => {
            t.chains
                .get_mut(name)
                .ok_or_else(|| err("ENOENT", format!("chain {name}")))?
                .rules
                .clear();
        }
        Op::DelChain(name) => {
            let c = t
                .chains
                .get(name)
                .ok_or_else(|| err("ENOENT", format!("chain {name}")))?;
            if !c.rules.is_empty() {
                return Err(err("EBUSY", format!("chain {name} has rules")));
            }
            if references_chain(t, name) {
                return Err(err("EBUSY", format!("chain {name} is referenced")));
            }
            t.chains.remove(name);
        }
        Op::AddRule { chain, rule, .. } => add_rule(t, chain, rule)?,
    }
    Ok(())
}

/// Adds elements as the kernel would: an interval set refuses one it has, a hash set one it has
/// with other data.
fn add_elements(t: &mut Table, set: &str, elements: &[Element]) -> Result<(), ApplyError> {
    let s = set_mut(t, set)?;
    for e in elements {
        if s.flags & set_flags::INTERVAL != 0
            && s.elements
                .iter()
                .any(|x| x.key == e.key && x.flags == e.flags)
        {
            return Err(err(
                "EEXIST",
                format!("element {} of set {set}", print::element(e)),
            ));
        }
        if !s.elements.contains(e) {
            if s.flags & set_flags::INTERVAL == 0
                && s.elements
                    .iter()
                    .any(|x| x.key == e.key && x.key_end == e.key_end)
            {
                return Err(err(
                    "EEXIST",
                    format!("element {} of set {set} with other data", print::element(e)),
                ));
            }
            s.elements.push(e.clone());
        }
    }
    Ok(())
}

/// The set named `set`, which an element op needs to exist.
fn set_mut<'a>(t: &'a mut Table, set: &str) -> Result<&'a mut Set, ApplyError> {
    t.sets
        .get_mut(set)
        .ok_or_else(|| err("ENOENT", format!("set {set}")))
}

/// Deletes elements as the kernel would: each must be there.
fn del_elements(t: &mut Table, set: &str, elements: &[Element]) -> Result<(), ApplyError> {
    let s = set_mut(t, set)?;
    for e in elements {
        let i = s
            .elements
            .iter()
            .position(|x| x.key == e.key && x.flags == e.flags && x.key_end == e.key_end)
            .ok_or_else(|| {
                err(
                    "ENOENT",
                    format!("element {} of set {set}", print::element(e)),
                )
            })?;
        s.elements.remove(i);
    }
    Ok(())
}

/// Appends a rule as the kernel would: the sets it looks up and the chains it jumps to must exist.
fn add_rule(t: &mut Table, chain: &str, rule: &Rule) -> Result<(), ApplyError> {
    for e in rule.exprs.iter() {
        match e {
            Expr::Lookup { set, .. } if !t.sets.contains_key(set) => {
                return Err(err("ENOENT", format!("set {set} in a rule of {chain}")))
            }
            Expr::Verdict(Verdict::Jump(c) | Verdict::Goto(c)) if !t.chains.contains_key(c) => {
                return Err(err("ENOENT", format!("chain {c} in a rule of {chain}")))
            }
            _ => {}
        }
    }
    let mut r = rule.clone();
    r.handle = None;
    t.chains
        .get_mut(chain)
        .ok_or_else(|| err("ENOENT", format!("chain {chain}")))?
        .rules
        .push(r);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elem(key: [u8; 4], flags: u32) -> Element {
        Element {
            key: ElemKey::from_slice(&key),
            key_end: None,
            flags,
            data: None,
        }
    }

    #[test]
    fn a_new_table_creates_its_most_looked_up_sets_first() {
        let mut t = Table::new(Family::Ip, "t");
        for name in ["a", "b", "c", "d"] {
            let s = crate::build::new_set(name, vec![DataType::Ipv4Addr], 0, None);
            t.sets.insert(name.into(), s);
        }
        let looks_up = |set: &str| Rule {
            exprs: vec![Expr::Lookup {
                set: set.into(),
                set_id: None,
                sreg: Reg::R1,
                dreg: None,
                invert: false,
            }]
            .into(),
            comment: None,
            handle: None,
        };
        let mut c = Chain::regular("c1");
        c.rules = ["c", "b", "c", "d", "c", "b"].map(looks_up).to_vec();
        t.chains.insert(c.name.clone(), c);
        let order = |plan: &Plan| -> Vec<String> {
            plan.ops
                .iter()
                .filter_map(|op| match op {
                    Op::AddSet(s) => Some(s.name.clone()),
                    _ => None,
                })
                .collect()
        };
        // Most lookups first; equally many (none, for "a") in name order.
        assert_eq!(order(&diff(&t, None, false)), ["c", "b", "d", "a"]);
        let mut lent = t.clone();
        let plan = create_lending(&mut lent);
        assert_eq!(order(&plan), ["c", "b", "d", "a"]);
    }

    #[test]
    fn merged_ranges_are_recognised_exactly() {
        let end = elem_flags::INTERVAL_END;
        let cases: Vec<Vec<Element>> = vec![
            // 10.0.0.0/24 and 10.0.2.0/24: canonical.
            vec![
                elem([10, 0, 0, 0], 0),
                elem([10, 0, 1, 0], end),
                elem([10, 0, 2, 0], 0),
                elem([10, 0, 3, 0], end),
            ],
            // Touching ranges: normalising merges them.
            vec![
                elem([10, 0, 0, 0], 0),
                elem([10, 0, 1, 0], end),
                elem([10, 0, 1, 0], 0),
                elem([10, 0, 2, 0], end),
            ],
            // Overlapping.
            vec![
                elem([10, 0, 0, 0], 0),
                elem([10, 0, 4, 0], end),
                elem([10, 0, 1, 0], 0),
                elem([10, 0, 2, 0], end),
            ],
            // Out of order.
            vec![
                elem([10, 0, 2, 0], 0),
                elem([10, 0, 3, 0], end),
                elem([10, 0, 0, 0], 0),
                elem([10, 0, 1, 0], end),
            ],
            // Open to the top, last: canonical.
            vec![
                elem([10, 0, 0, 0], 0),
                elem([10, 0, 1, 0], end),
                elem([200, 0, 0, 0], 0),
            ],
            // Two starts in a row.
            vec![elem([10, 0, 0, 0], 0), elem([10, 0, 1, 0], 0)],
            // An empty range.
            vec![elem([10, 0, 0, 0], 0), elem([10, 0, 0, 0], end)],
        ];
        for body in cases {
            let set = Set {
                counter: false,
                counters: Default::default(),
                name: "s".into(),
                key: vec![DataType::Ipv4Addr],
                flags: set_flags::INTERVAL,
                data: None,
                size: None,
                elements: body.clone(),
            };
            let canonical = merge_ranges(ranges(&body)) == body;
            assert_eq!(is_merged_ranges(&body), canonical, "{body:?}");
            assert_eq!(normalize_elements(&set) == body, canonical, "{body:?}");
        }
    }
}
