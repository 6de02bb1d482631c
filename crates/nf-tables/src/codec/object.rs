//! Encoding and decoding of tables, chains, rules, sets and set elements (attribute order as
//! libnftnl's `*_nlmsg_build_payload`, so the bytes equal nft's).

use super::attr::{Attrs, MsgWriter};
use super::expr::{decode_expr, decode_verdict, put_expr_in, put_verdict};
use super::CodecError;
use crate::consts::*;
use crate::model::*;

/// `NFTA_TABLE_NAME`, `NFTA_TABLE_FLAGS` (NEWTABLE).
pub fn put_table(w: &mut MsgWriter, name: &str, flags: u32) {
    w.put_str(NFTA_TABLE_NAME, name);
    w.put_be32(NFTA_TABLE_FLAGS, flags);
}

/// `NFTA_TABLE_NAME` only (DELTABLE, GETTABLE).
pub fn put_table_ref(w: &mut MsgWriter, name: &str) {
    w.put_str(NFTA_TABLE_NAME, name);
}

fn policy_code(v: &Verdict) -> u32 {
    super::expr::verdict_code(v).0 as u32
}

/// A chain without its rules (NEWCHAIN). Base chains always carry their policy.
pub fn put_chain(w: &mut MsgWriter, table: &str, c: &Chain) {
    w.put_str(NFTA_CHAIN_TABLE, table);
    w.put_str(NFTA_CHAIN_NAME, &c.name);
    if let Some(b) = &c.base {
        w.put_str(NFTA_CHAIN_TYPE, b.chain_type.name());
        w.put_be32(NFTA_CHAIN_POLICY, policy_code(&b.policy));
        let n = w.begin_nest(NFTA_CHAIN_HOOK);
        w.put_be32(NFTA_HOOK_HOOKNUM, b.hook.number());
        w.put_be32(NFTA_HOOK_PRIORITY, b.priority as u32);
        w.end_nest(n);
    }
}

/// Table + chain as rule attributes: DELRULE without a handle flushes that chain. (Without
/// `NFTA_RULE_CHAIN` the kernel would flush every chain of the table.)
pub fn put_rule_chain_ref(w: &mut MsgWriter, table: &str, chain: &str) {
    w.put_str(NFTA_RULE_TABLE, table);
    w.put_str(NFTA_RULE_CHAIN, chain);
}

/// Table + chain name (DELCHAIN).
pub fn put_chain_ref(w: &mut MsgWriter, table: &str, chain: &str) {
    w.put_str(NFTA_CHAIN_TABLE, table);
    w.put_str(NFTA_CHAIN_NAME, chain);
}

/// Rule userdata: libnftnl TLV `NFTNL_UDATA_RULE_COMMENT`, NUL-terminated,
/// written straight into the message.
fn put_rule_udata(w: &mut MsgWriter, comment: &str) -> Result<(), CodecError> {
    let len = comment.len() + 1;
    if len > u8::MAX as usize || 2 + len > NFT_USERDATA_MAXLEN {
        return Err(CodecError::Invalid(format!(
            "rule comment of {} bytes is over the kernel's 256-byte userdata limit",
            comment.len()
        )));
    }
    w.put_parts(
        NFTA_RULE_USERDATA,
        &[
            &[NFTNL_UDATA_RULE_COMMENT, len as u8],
            comment.as_bytes(),
            &[0],
        ],
    );
    Ok(())
}

/// A rule (NEWRULE; with its handle when it has one, for REPLACE).
pub fn put_rule(w: &mut MsgWriter, table: &str, chain: &str, r: &Rule) -> Result<(), CodecError> {
    put_rule_reusing(w, table, chain, r, &|_| None, None).map(|_| ())
}

/// [`put_rule`], lookups without a set id taking it from `set_id(set name)` (sets created in
/// the same batch, as nft sends them), and the `NFTA_RULE_EXPRESSIONS` attribute copied from
/// `w.buf[from]` when given: the same expressions, encoded earlier in this buffer for the same
/// table (set ids are per table). Returns where this rule's attribute is, for the next rule
/// with the same expressions.
pub fn put_rule_reusing(
    w: &mut MsgWriter,
    table: &str,
    chain: &str,
    r: &Rule,
    set_id: &dyn Fn(&str) -> Option<u32>,
    from: Option<std::ops::Range<usize>>,
) -> Result<std::ops::Range<usize>, CodecError> {
    w.put_str(NFTA_RULE_TABLE, table);
    w.put_str(NFTA_RULE_CHAIN, chain);
    if let Some(h) = r.handle {
        w.put_be64(NFTA_RULE_HANDLE, h);
    }
    let start = w.buf.len();
    match from {
        // An attribute is position independent: lengths only, 4-byte aligned.
        Some(from) => w.buf.extend_from_within(from),
        None => {
            let n = w.begin_nest(NFTA_RULE_EXPRESSIONS);
            for e in r.exprs.iter() {
                put_expr_in(w, e, set_id);
            }
            w.end_nest(n);
        }
    }
    let at = start..w.buf.len();
    if let Some(c) = &r.comment {
        put_rule_udata(w, c)?;
    }
    Ok(at)
}

/// Table, chain and handle (DELRULE of one rule).
pub fn put_rule_ref(w: &mut MsgWriter, table: &str, chain: &str, handle: u64) {
    w.put_str(NFTA_RULE_TABLE, table);
    w.put_str(NFTA_RULE_CHAIN, chain);
    w.put_be64(NFTA_RULE_HANDLE, handle);
}

/// Key type id and key length of a set key: one datatype, or a concatenation (type ids shifted
/// by nft's `TYPE_BITS`, each component padded to a 4-byte register).
pub fn key_type_of(key: &[DataType]) -> (u32, u32) {
    match key {
        [one] => (one.id(), one.len()),
        many => many.iter().fold((0, 0), |(id, len), t| {
            ((id << TYPE_BITS) | t.id(), len + t.len().div_ceil(4) * 4)
        }),
    }
}

/// nft's byte order of a datatype (`BYTEORDER_*`), stored in set userdata so that `nft list`
/// prints keys right.
fn byteorder(t: DataType) -> u32 {
    match t {
        DataType::Ipv4Addr
        | DataType::Ipv6Addr
        | DataType::EtherAddr
        | DataType::InetProto
        | DataType::InetService => BYTEORDER_BIG_ENDIAN,
        DataType::Mark | DataType::IfName => BYTEORDER_HOST_ENDIAN,
        DataType::Verdict | DataType::Other { .. } => BYTEORDER_INVALID,
    }
}

fn udata_u32(u: &mut Vec<u8>, ty: u8, v: u32) {
    u.extend_from_slice(&[ty, 4]);
    u.extend_from_slice(&v.to_ne_bytes());
}

/// The set userdata nft 1.0.6 writes: key byte order; for a concatenation the (empty) `typeof`
/// description nft attaches; for maps the data byte order and the data-interval flag.
pub fn set_udata(s: &Set) -> Vec<u8> {
    let mut u = Vec::with_capacity(32);
    match s.key.as_slice() {
        [one] => udata_u32(&mut u, NFTNL_UDATA_SET_KEYBYTEORDER, byteorder(*one)),
        _ => {
            udata_u32(&mut u, NFTNL_UDATA_SET_KEYBYTEORDER, BYTEORDER_INVALID);
            // NFTNL_UDATA_SET_KEY_TYPEOF { expr type 13 (concat), no sub-expressions }.
            u.extend_from_slice(&[NFTNL_UDATA_SET_KEY_TYPEOF, 8, 0, 4, 13, 0, 0, 0, 1, 0]);
        }
    }
    if let Some(d) = s.data {
        udata_u32(&mut u, NFTNL_UDATA_SET_DATABYTEORDER, byteorder(d));
        udata_u32(&mut u, NFTNL_UDATA_SET_DATA_INTERVAL, 0);
    }
    u
}

/// A set without its elements (NEWSET). `id` is the batch-local `NFTA_SET_ID`.
pub fn put_set(w: &mut MsgWriter, table: &str, s: &Set, id: Option<u32>) {
    let (key_type, key_len) = key_type_of(&s.key);
    let mut flags = s.flags;
    if s.data.is_some() {
        flags |= set_flags::MAP;
    }
    w.put_str(NFTA_SET_TABLE, table);
    w.put_str(NFTA_SET_NAME, &s.name);
    w.put_be32(NFTA_SET_FLAGS, flags);
    w.put_be32(NFTA_SET_KEY_TYPE, key_type);
    w.put_be32(NFTA_SET_KEY_LEN, key_len);
    if let Some(d) = s.data {
        match d {
            DataType::Verdict => {
                w.put_be32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
                w.put_be32(NFTA_SET_DATA_LEN, 0);
            }
            d => {
                w.put_be32(NFTA_SET_DATA_TYPE, d.id());
                w.put_be32(NFTA_SET_DATA_LEN, d.len());
            }
        }
    }
    if let Some(id) = id {
        w.put_be32(NFTA_SET_ID, id);
    }
    let concat = s.key.len() > 1 && s.flags & set_flags::INTERVAL != 0;
    if s.size.is_some() || concat {
        let n = w.begin_nest(NFTA_SET_DESC);
        if let Some(sz) = s.size {
            w.put_be32(NFTA_SET_DESC_SIZE, sz);
        }
        if concat {
            // Field lengths of a concatenated interval set (pipapo), one per component.
            let c = w.begin_nest(NFTA_SET_DESC_CONCAT);
            for t in &s.key {
                let e = w.begin_nest(NFTA_LIST_ELEM);
                w.put_be32(NFTA_SET_FIELD_LEN, t.len());
                w.end_nest(e);
            }
            w.end_nest(c);
        }
        w.end_nest(n);
    }
    w.put(NFTA_SET_USERDATA, &set_udata(s));
    if s.counter {
        // As nft sends `counter` in a set declaration: one NFTA_SET_EXPR, an empty counter
        // (no values), and no NFT_SET_EXPR flag.
        let e = w.begin_nest(NFTA_SET_EXPR);
        w.put_str(NFTA_EXPR_NAME, "counter");
        let d = w.begin_nest(NFTA_EXPR_DATA);
        w.end_nest(d);
        w.end_nest(e);
    }
}

/// Table + set name (DELSET).
pub fn put_set_ref(w: &mut MsgWriter, table: &str, set: &str) {
    w.put_str(NFTA_SET_TABLE, table);
    w.put_str(NFTA_SET_NAME, set);
}

/// One element's encoded size, for splitting element lists under 64 KiB.
pub fn elem_size_hint(e: &Element) -> usize {
    4 + 12
        + e.key.len().div_ceil(4) * 4
        + 12
        + e.key_end
            .as_ref()
            .map_or(0, |k| 12 + k.len().div_ceil(4) * 4)
        + match e.data.as_deref() {
            None => 0,
            Some(ElemData::Value(v)) => 12 + v.len().div_ceil(4) * 4,
            Some(ElemData::Verdict(Verdict::Jump(c) | Verdict::Goto(c))) => {
                28 + c.len().div_ceil(4) * 4
            }
            Some(ElemData::Verdict(_)) => 20,
        }
}

/// How an element list names its set.
#[derive(Clone, Copy, Debug)]
pub enum ElemsOf<'a> {
    /// By name, and by ID too when the set is created in the same batch (as nft does).
    Name(&'a str, Option<u32>),
    /// By the ID of a set the same batch creates, alone. The kernel looks a name up by walking
    /// the table's set list from its oldest set (a new set is at its end), an ID among the
    /// batch's new sets from the newest.
    Id(u32),
}

/// A list of elements (NEWSETELEM / DELSETELEM). The caller keeps it under 64 KiB.
pub fn put_elems(w: &mut MsgWriter, table: &str, set: ElemsOf<'_>, elems: &[Element]) {
    w.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
    match set {
        ElemsOf::Name(name, id) => {
            w.put_str(NFTA_SET_ELEM_LIST_SET, name);
            if let Some(id) = id {
                w.put_be32(NFTA_SET_ELEM_LIST_SET_ID, id);
            }
        }
        ElemsOf::Id(id) => w.put_be32(NFTA_SET_ELEM_LIST_SET_ID, id),
    }
    let list = w.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
    for (i, e) in elems.iter().enumerate() {
        // libnftnl numbers the element nests 1, 2, 3, ... (the kernel ignores the type).
        let ty = ((i + 1) as u16) & NLA_TYPE_MASK;
        if e.key_end.is_none() && e.data.is_none() && e.key.len() <= PLAIN_KEY_MAX {
            put_plain_elem(w, ty, e.flags, &e.key);
        } else {
            put_elem(w, ty, e);
        }
    }
    w.end_nest(list);
}

/// One element nest `ty`: flags, key, range end, value.
fn put_elem(w: &mut MsgWriter, ty: u16, e: &Element) {
    let n = w.begin_nest(ty);
    if e.flags != 0 {
        w.put_be32(NFTA_SET_ELEM_FLAGS, e.flags);
    }
    w.put_data_value(NFTA_SET_ELEM_KEY, &e.key);
    if let Some(k) = &e.key_end {
        w.put_data_value(NFTA_SET_ELEM_KEY_END, k);
    }
    match e.data.as_deref() {
        None => {}
        Some(ElemData::Value(v)) => w.put_data_value(NFTA_SET_ELEM_DATA, v),
        Some(ElemData::Verdict(v)) => put_verdict(w, NFTA_SET_ELEM_DATA, v),
    }
    w.end_nest(n);
}

/// The longest key [`put_plain_elem`] writes (an IPv6 address).
const PLAIN_KEY_MAX: usize = 16;

/// [`put_elem`] for an element with only flags and a key of at most [`PLAIN_KEY_MAX`] bytes,
/// nearly every element of a full load: the same bytes, built on the stack and appended at once
/// instead of attribute by attribute. Like every attribute it starts 4-byte aligned,
/// so its padding is that of the key alone.
fn put_plain_elem(w: &mut MsgWriter, ty: u16, flags: u32, key: &[u8]) {
    fn head(b: &mut [u8], len: usize, ty: u16) {
        b[..2].copy_from_slice(&(len as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&ty.to_ne_bytes());
    }
    let padded = (key.len() + 3) & !3;
    // Element nest, flags attribute, key nest, value attribute, key; zeros pad the key.
    let mut b = [0u8; 4 + 8 + 4 + 4 + PLAIN_KEY_MAX];
    let mut at = 4;
    if flags != 0 {
        head(&mut b[at..], 8, NFTA_SET_ELEM_FLAGS);
        b[at + 4..at + 8].copy_from_slice(&flags.to_be_bytes());
        at += 8;
    }
    head(&mut b[at..], 8 + padded, NFTA_SET_ELEM_KEY | NLA_F_NESTED);
    head(&mut b[at + 4..], 4 + key.len(), NFTA_DATA_VALUE);
    b[at + 8..at + 8 + key.len()].copy_from_slice(key);
    at += 8 + padded;
    head(&mut b, at, ty | NLA_F_NESTED);
    w.buf.extend_from_slice(&b[..at]);
}

/// A decoded table message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMsg {
    /// Address family (`nfgenmsg.nfgen_family`).
    pub family: Family,
    /// `NFTA_TABLE_NAME`.
    pub name: String,
    /// `NFTA_TABLE_FLAGS` (`NFT_TABLE_F_*`); 0 when absent.
    pub flags: u32,
    /// `NFTA_TABLE_HANDLE`: the kernel's id of the table (in dumps, not in requests).
    pub handle: Option<u64>,
    /// `NFTA_TABLE_OWNER`: netlink port id of the owning socket, when owned.
    pub owner: Option<u32>,
}

/// A decoded chain message (rules empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainMsg {
    /// Address family (`nfgenmsg.nfgen_family`).
    pub family: Family,
    /// `NFTA_CHAIN_TABLE`.
    pub table: String,
    /// The chain: name, and type, hook, priority and policy for a base chain.
    pub chain: Chain,
    /// `NFTA_CHAIN_HANDLE`: the kernel's id of the chain (in dumps).
    pub handle: Option<u64>,
}

/// A decoded rule message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleMsg {
    /// Address family (`nfgenmsg.nfgen_family`).
    pub family: Family,
    /// `NFTA_RULE_TABLE`.
    pub table: String,
    /// `NFTA_RULE_CHAIN`.
    pub chain: String,
    /// Expressions, userdata comment and handle (`NFTA_RULE_HANDLE`, in dumps).
    pub rule: Rule,
}

/// A decoded set message (elements empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetMsg {
    /// Address family (`nfgenmsg.nfgen_family`).
    pub family: Family,
    /// `NFTA_SET_TABLE`.
    pub table: String,
    /// The set's definition (no elements).
    pub set: Set,
    /// `NFTA_SET_ID`: the batch-local id a request gave the set.
    pub id: Option<u32>,
    /// `NFTA_SET_HANDLE`: the kernel's id of the set (in dumps).
    pub handle: Option<u64>,
}

/// A decoded element-list message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElemsMsg {
    /// Address family (`nfgenmsg.nfgen_family`).
    pub family: Family,
    /// `NFTA_SET_ELEM_LIST_TABLE`.
    pub table: String,
    /// Empty when the message names its set by `set_id` alone (a set the same batch creates).
    pub set: String,
    /// `NFTA_SET_ELEM_LIST_SET_ID`: the batch-local id of a set the same batch creates.
    pub set_id: Option<u32>,
    /// The elements of `NFTA_SET_ELEM_LIST_ELEMENTS`, in message order.
    pub elements: Vec<Element>,
    /// The elements' counters, for a set with the `counter` template (never compared).
    pub counters: ElemCounters,
}

/// Any decoded nf_tables object message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    /// `NFT_MSG_NEWTABLE` / `NFT_MSG_DELTABLE`.
    Table(TableMsg),
    /// `NFT_MSG_NEWCHAIN` / `NFT_MSG_DELCHAIN`.
    Chain(ChainMsg),
    /// `NFT_MSG_NEWRULE` / `NFT_MSG_DELRULE`.
    Rule(RuleMsg),
    /// `NFT_MSG_NEWSET` / `NFT_MSG_DELSET`.
    Set(SetMsg),
    /// `NFT_MSG_NEWSETELEM` / `NFT_MSG_DELSETELEM`.
    Elems(ElemsMsg),
}

/// Decodes the payload (nfgenmsg + attributes) of a NEW*/DEL* message of type `msg`
/// (`NFT_MSG_*`, without the subsystem byte).
pub fn decode_message(msg: u16, payload: &[u8]) -> Result<Object, CodecError> {
    let (family, attrs) = split_nfgenmsg(payload)?;
    match msg {
        NFT_MSG_NEWTABLE | NFT_MSG_DELTABLE => decode_table(family, attrs).map(Object::Table),
        NFT_MSG_NEWCHAIN | NFT_MSG_DELCHAIN => decode_chain(family, attrs).map(Object::Chain),
        NFT_MSG_NEWRULE | NFT_MSG_DELRULE => decode_rule(family, attrs).map(Object::Rule),
        NFT_MSG_NEWSET | NFT_MSG_DELSET => decode_set(family, attrs).map(Object::Set),
        NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM => decode_elems(family, attrs).map(Object::Elems),
        other => Err(CodecError::UnexpectedType(other)),
    }
}

fn decode_table(family: Family, attrs: &[u8]) -> Result<TableMsg, CodecError> {
    let what = "table";
    let mut t = TableMsg {
        family,
        name: String::new(),
        flags: 0,
        handle: None,
        owner: None,
    };
    let mut named = false;
    for a in Attrs::new(attrs) {
        let a = a?;
        match a.ty {
            NFTA_TABLE_NAME => {
                t.name = a.str(what)?;
                named = true;
            }
            NFTA_TABLE_FLAGS => t.flags = a.be32(what)?,
            NFTA_TABLE_HANDLE => t.handle = Some(a.be64(what)?),
            NFTA_TABLE_OWNER => t.owner = Some(a.be32(what)?),
            _ => {}
        }
    }
    if !named {
        return Err(CodecError::Missing {
            what,
            attr: NFTA_TABLE_NAME,
        });
    }
    Ok(t)
}

fn verdict_from_code(code: i32) -> Verdict {
    match code {
        NF_ACCEPT => Verdict::Accept,
        NF_DROP => Verdict::Drop,
        n => Verdict::Other(n),
    }
}

fn decode_chain(family: Family, attrs: &[u8]) -> Result<ChainMsg, CodecError> {
    let what = "chain";
    let (mut table, mut name, mut handle) = (None, None, None);
    let (mut ty, mut policy, mut hook, mut prio) = (None, None, None, None);
    for a in Attrs::new(attrs) {
        let a = a?;
        match a.ty {
            NFTA_CHAIN_TABLE => table = Some(a.str(what)?),
            NFTA_CHAIN_NAME => name = Some(a.str(what)?),
            NFTA_CHAIN_HANDLE => handle = Some(a.be64(what)?),
            NFTA_CHAIN_TYPE => ty = Some(a.str(what)?),
            NFTA_CHAIN_POLICY => policy = Some(verdict_from_code(a.be32(what)? as i32)),
            NFTA_CHAIN_HOOK => {
                for h in a.nested() {
                    let h = h?;
                    match h.ty {
                        NFTA_HOOK_HOOKNUM => hook = Some(a_hook(h.be32(what)?)),
                        NFTA_HOOK_PRIORITY => prio = Some(h.be32(what)? as i32),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let base = match (hook, ty) {
        (Some(hook), Some(ty)) => Some(BaseChain {
            chain_type: match ty.as_str() {
                "filter" => ChainType::Filter,
                "nat" => ChainType::Nat,
                "route" => ChainType::Route,
                _ => return Err(CodecError::Invalid(format!("unknown chain type {ty:?}"))),
            },
            hook,
            priority: prio.unwrap_or(0),
            policy: policy.unwrap_or(Verdict::Accept),
        }),
        _ => None,
    };
    Ok(ChainMsg {
        family,
        table: table.ok_or(CodecError::Missing {
            what,
            attr: NFTA_CHAIN_TABLE,
        })?,
        chain: Chain {
            name: name.ok_or(CodecError::Missing {
                what,
                attr: NFTA_CHAIN_NAME,
            })?,
            base,
            rules: Vec::new(),
        },
        handle,
    })
}

fn a_hook(n: u32) -> Hook {
    match n {
        0 => Hook::Prerouting,
        1 => Hook::Input,
        2 => Hook::Forward,
        3 => Hook::Output,
        4 => Hook::Postrouting,
        n => Hook::Other(n),
    }
}

/// The comment TLV of rule userdata, if any.
fn decode_rule_udata(u: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 2 <= u.len() {
        let (ty, len) = (u[i], u[i + 1] as usize);
        let v = u.get(i + 2..i + 2 + len)?;
        if ty == NFTNL_UDATA_RULE_COMMENT {
            let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
            return std::str::from_utf8(&v[..end]).ok().map(str::to_owned);
        }
        i += 2 + len;
    }
    None
}

fn decode_rule(family: Family, attrs: &[u8]) -> Result<RuleMsg, CodecError> {
    let r = decode_rule_attrs(family, attrs)?;
    Ok(RuleMsg {
        family,
        table: r.table.to_owned(),
        chain: r.chain.to_owned(),
        rule: r.rule,
    })
}

/// A rule message whose table and chain names are borrowed from the reply: a dump checks them
/// in place instead of allocating two strings per rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef<'a> {
    /// Address family (`nfgenmsg.nfgen_family`).
    pub family: Family,
    /// `NFTA_RULE_TABLE`, borrowed.
    pub table: &'a str,
    /// `NFTA_RULE_CHAIN`, borrowed.
    pub chain: &'a str,
    /// Expressions, userdata comment and handle.
    pub rule: Rule,
}

/// Decodes the payload (nfgenmsg + attributes) of a NEWRULE message, names borrowed.
pub fn decode_rule_ref(payload: &[u8]) -> Result<RuleRef<'_>, CodecError> {
    let (family, attrs) = split_nfgenmsg(payload)?;
    decode_rule_attrs(family, attrs)
}

fn split_nfgenmsg(payload: &[u8]) -> Result<(Family, &[u8]), CodecError> {
    if payload.len() < 4 {
        return Err(CodecError::Truncated { what: "nfgenmsg" });
    }
    let family = Family::from_nfproto(payload[0]).ok_or(CodecError::UnknownFamily(payload[0]))?;
    Ok((family, &payload[4..]))
}

fn decode_rule_attrs(family: Family, attrs: &[u8]) -> Result<RuleRef<'_>, CodecError> {
    let what = "rule";
    let (mut table, mut chain) = (None, None);
    let mut rule = Rule::default();
    for a in Attrs::new(attrs) {
        let a = a?;
        match a.ty {
            NFTA_RULE_TABLE => table = Some(a.str_ref(what)?),
            NFTA_RULE_CHAIN => chain = Some(a.str_ref(what)?),
            NFTA_RULE_HANDLE => rule.handle = Some(a.be64(what)?),
            NFTA_RULE_USERDATA => rule.comment = decode_rule_udata(a.data),
            NFTA_RULE_EXPRESSIONS => {
                // Sized once: growing by doubling cost 3–4 reallocations per rule.
                let mut exprs = Vec::with_capacity(a.nested().count());
                for e in a.nested() {
                    let e = e?;
                    if e.ty == NFTA_LIST_ELEM {
                        exprs.push(decode_expr(e.data)?);
                    }
                }
                rule.exprs = exprs.into();
            }
            _ => {}
        }
    }
    Ok(RuleRef {
        family,
        table: table.ok_or(CodecError::Missing {
            what,
            attr: NFTA_RULE_TABLE,
        })?,
        chain: chain.ok_or(CodecError::Missing {
            what,
            attr: NFTA_RULE_CHAIN,
        })?,
        rule,
    })
}

fn known_len(id: u32) -> Option<u32> {
    match datatype_from(id, u32::MAX) {
        DataType::Other { .. } if id != 0 => [0u32, 1, 2, 4, 6, 16]
            .into_iter()
            .find(|&l| !matches!(datatype_from(id, l), DataType::Other { .. })),
        _ => None,
    }
}

fn datatype_from(id: u32, len: u32) -> DataType {
    let known = match id {
        1 => DataType::Verdict,
        7 => DataType::Ipv4Addr,
        8 => DataType::Ipv6Addr,
        9 => DataType::EtherAddr,
        12 => DataType::InetProto,
        13 => DataType::InetService,
        19 => DataType::Mark,
        41 => DataType::IfName,
        _ => return DataType::Other { id, len },
    };
    if known.len() == len {
        known
    } else {
        DataType::Other { id, len }
    }
}

/// Splits a key type back into its components (inverse of [`key_type_of`]).
fn key_from(key_type: u32, key_len: u32, field_lens: &[u32]) -> Vec<DataType> {
    if key_type < (1 << TYPE_BITS) {
        return vec![datatype_from(key_type, key_len)];
    }
    let mut ids = Vec::new();
    let mut t = key_type;
    while t != 0 {
        ids.push(t & ((1 << TYPE_BITS) - 1));
        t >>= TYPE_BITS;
    }
    ids.reverse();
    let comps: Vec<DataType> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let len = field_lens
                .get(i)
                .copied()
                .unwrap_or_else(|| known_len(id).unwrap_or(0));
            let dt = datatype_from(id, len);
            match dt {
                DataType::Other { id, len: 0 } => {
                    // Unknown component without a DESC_CONCAT length: guess one register.
                    DataType::Other { id, len: 4 }
                }
                dt => dt,
            }
        })
        .collect();
    let (_, len) = key_type_of(&comps);
    if len == key_len {
        comps
    } else {
        vec![DataType::Other {
            id: key_type,
            len: key_len,
        }]
    }
}

fn decode_set(family: Family, attrs: &[u8]) -> Result<SetMsg, CodecError> {
    let what = "set";
    let (mut table, mut name, mut id, mut handle) = (None, None, None, None);
    let (mut flags, mut key_type, mut key_len) = (0, None, None);
    let (mut data_type, mut data_len, mut size) = (None, 0, None);
    let mut field_lens = Vec::new();
    let mut counter = false;
    for a in Attrs::new(attrs) {
        let a = a?;
        match a.ty {
            NFTA_SET_TABLE => table = Some(a.str(what)?),
            NFTA_SET_NAME => name = Some(a.str(what)?),
            NFTA_SET_FLAGS => flags = a.be32(what)?,
            NFTA_SET_KEY_TYPE => key_type = Some(a.be32(what)?),
            NFTA_SET_KEY_LEN => key_len = Some(a.be32(what)?),
            NFTA_SET_DATA_TYPE => data_type = Some(a.be32(what)?),
            NFTA_SET_DATA_LEN => data_len = a.be32(what)?,
            NFTA_SET_ID => id = Some(a.be32(what)?),
            NFTA_SET_HANDLE => handle = Some(a.be64(what)?),
            NFTA_SET_EXPR => counter |= is_counter(a.data)?,
            NFTA_SET_EXPRESSIONS => {
                for e in a.nested() {
                    counter |= is_counter(e?.data)?;
                }
            }
            NFTA_SET_DESC => {
                for d in a.nested() {
                    let d = d?;
                    match d.ty {
                        NFTA_SET_DESC_SIZE => size = Some(d.be32(what)?),
                        NFTA_SET_DESC_CONCAT => {
                            for f in d.nested() {
                                for l in f?.nested() {
                                    let l = l?;
                                    if l.ty == NFTA_SET_FIELD_LEN {
                                        field_lens.push(l.be32(what)?);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let (Some(key_type), Some(key_len)) = (key_type, key_len) else {
        return Err(CodecError::Missing {
            what,
            attr: NFTA_SET_KEY_TYPE,
        });
    };
    let data = match data_type {
        Some(NFT_DATA_VERDICT) => Some(DataType::Verdict),
        Some(t) => Some(datatype_from(t, data_len)),
        None => None,
    };
    if data.is_some() {
        // MAP is implied by `data` in the model.
        flags &= !set_flags::MAP;
    }
    // The expression template is `counter` in the model; the flag, should a kernel report it,
    // says nothing more.
    flags &= !set_flags::EXPR;
    Ok(SetMsg {
        family,
        table: table.ok_or(CodecError::Missing {
            what,
            attr: NFTA_SET_TABLE,
        })?,
        set: Set {
            name: name.ok_or(CodecError::Missing {
                what,
                attr: NFTA_SET_NAME,
            })?,
            key: key_from(key_type, key_len, &field_lens),
            flags,
            data,
            size,
            elements: Vec::new(),
            counter,
            counters: ElemCounters::default(),
        },
        id,
        handle,
    })
}

/// Whether one expression nest (`NFTA_EXPR_NAME`, `NFTA_EXPR_DATA`) is a counter.
fn is_counter(expr: &[u8]) -> Result<bool, CodecError> {
    Ok(matches!(decode_expr(expr)?, Expr::Counter { .. }))
}

/// The packets and bytes of the counter among an element's expressions, if one is.
fn elem_counter(expr: &[u8]) -> Result<Option<(u64, u64)>, CodecError> {
    Ok(match decode_expr(expr)? {
        Expr::Counter { packets, bytes } => Some((packets, bytes)),
        _ => None,
    })
}

fn decode_elems(family: Family, attrs: &[u8]) -> Result<ElemsMsg, CodecError> {
    let mut elements = Vec::new();
    let mut counters = ElemCounters::default();
    let r = decode_elems_attrs(family, attrs, &mut elements, &mut counters)?;
    Ok(ElemsMsg {
        family,
        table: r.table.to_owned(),
        set: r.set.to_owned(),
        set_id: r.set_id,
        elements,
        counters,
    })
}

/// The header of an element-list message, names borrowed from the reply; the elements went to
/// the caller's vector ([`decode_elems_into`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElemsRef<'a> {
    /// Address family (`nfgenmsg.nfgen_family`).
    pub family: Family,
    /// `NFTA_SET_ELEM_LIST_TABLE`, borrowed.
    pub table: &'a str,
    /// Empty when the message names its set by `set_id` alone (a set the same batch creates).
    pub set: &'a str,
    /// `NFTA_SET_ELEM_LIST_SET_ID`: the batch-local id of a set the same batch creates.
    pub set_id: Option<u32>,
}

/// Decodes the payload of a NEWSETELEM message, appending its elements to `out` and the
/// counters of those that carry one to `counters` (a dump of a large set arrives in many
/// messages: no intermediate vector per message).
pub fn decode_elems_into<'a>(
    payload: &'a [u8],
    out: &mut Vec<Element>,
    counters: &mut ElemCounters,
) -> Result<ElemsRef<'a>, CodecError> {
    let (family, attrs) = split_nfgenmsg(payload)?;
    decode_elems_attrs(family, attrs, out, counters)
}

fn decode_elems_attrs<'a>(
    family: Family,
    attrs: &'a [u8],
    out: &mut Vec<Element>,
    counters: &mut ElemCounters,
) -> Result<ElemsRef<'a>, CodecError> {
    let what = "set element";
    let (mut table, mut set, mut set_id) = (None, None, None);
    for a in Attrs::new(attrs) {
        let a = a?;
        match a.ty {
            NFTA_SET_ELEM_LIST_TABLE => table = Some(a.str_ref(what)?),
            NFTA_SET_ELEM_LIST_SET => set = Some(a.str_ref(what)?),
            NFTA_SET_ELEM_LIST_SET_ID => set_id = Some(a.be32(what)?),
            NFTA_SET_ELEM_LIST_ELEMENTS => {
                out.reserve(a.nested().count());
                for e in a.nested() {
                    let (el, counter) = decode_elem(e?.data)?;
                    if let Some((packets, bytes)) = counter {
                        counters.0.push(ElemCounter {
                            key: el.key.clone(),
                            flags: el.flags,
                            packets,
                            bytes,
                        });
                    }
                    out.push(el);
                }
            }
            _ => {}
        }
    }
    Ok(ElemsRef {
        family,
        table: table.ok_or(CodecError::Missing {
            what,
            attr: NFTA_SET_ELEM_LIST_TABLE,
        })?,
        // A set created in the same batch may be named by its ID alone.
        set: match (set, set_id) {
            (Some(name), _) => name,
            (None, Some(_)) => "",
            (None, None) => {
                return Err(CodecError::Missing {
                    what,
                    attr: NFTA_SET_ELEM_LIST_SET,
                })
            }
        },
        set_id,
    })
}

/// One element, and its counter's packets and bytes when it carries one.
fn decode_elem(attrs: &[u8]) -> Result<(Element, Option<(u64, u64)>), CodecError> {
    let what = "set element";
    let mut el = Element {
        key: ElemKey::new(),
        key_end: None,
        flags: 0,
        data: None,
    };
    let mut counter = None;
    for x in Attrs::new(attrs) {
        let x = x?;
        match x.ty {
            NFTA_SET_ELEM_KEY => el.key = ElemKey::from_slice(x.data_value_ref(what)?),
            NFTA_SET_ELEM_KEY_END => el.key_end = Some(x.data_value(what)?.into_boxed_slice()),
            NFTA_SET_ELEM_FLAGS => el.flags = x.be32(what)?,
            NFTA_SET_ELEM_DATA => {
                for d in x.nested() {
                    let d = d?;
                    match d.ty {
                        NFTA_DATA_VALUE => {
                            el.data = Some(Box::new(ElemData::Value(d.data.to_vec())))
                        }
                        NFTA_DATA_VERDICT => {
                            el.data = Some(Box::new(ElemData::Verdict(decode_verdict(&d)?)))
                        }
                        _ => {}
                    }
                }
            }
            NFTA_SET_ELEM_EXPR => counter = counter.or(elem_counter(x.data)?),
            NFTA_SET_ELEM_EXPRESSIONS => {
                for e in x.nested() {
                    counter = counter.or(elem_counter(e?.data)?);
                }
            }
            _ => {}
        }
    }
    Ok((el, counter))
}

/// The payload (nfgenmsg + attributes) of the NEW* message that creates `obj`: the inverse of
/// [`decode_message`] for NEW messages.
pub fn encode_object(obj: &Object) -> Result<Vec<u8>, CodecError> {
    let mut w = MsgWriter::new();
    let (family, ty) = match obj {
        Object::Table(t) => (t.family, NFT_MSG_NEWTABLE),
        Object::Chain(c) => (c.family, NFT_MSG_NEWCHAIN),
        Object::Rule(r) => (r.family, NFT_MSG_NEWRULE),
        Object::Set(s) => (s.family, NFT_MSG_NEWSET),
        Object::Elems(e) => (e.family, NFT_MSG_NEWSETELEM),
    };
    let m = w.begin_msg(ty, 0, 0, family.nfproto(), 0);
    match obj {
        Object::Table(t) => put_table(&mut w, &t.name, t.flags),
        Object::Chain(c) => put_chain(&mut w, &c.table, &c.chain),
        Object::Rule(r) => put_rule(&mut w, &r.table, &r.chain, &r.rule)?,
        Object::Set(s) => put_set(&mut w, &s.table, &s.set, s.id),
        Object::Elems(e) => put_elems(
            &mut w,
            &e.table,
            ElemsOf::Name(&e.set, e.set_id),
            &e.elements,
        ),
    }
    w.end_msg(m)?;
    Ok(w.buf.split_off(16))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The element written at once is byte for byte the one written attribute by attribute.
        #[test]
        fn a_plain_element_is_encoded_as_the_general_path_does(
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..=PLAIN_KEY_MAX),
            flags in proptest::prop_oneof![
                proptest::strategy::Just(0u32),
                proptest::strategy::Just(elem_flags::INTERVAL_END),
                proptest::prelude::any::<u32>(),
            ],
            ty in 1u16..=NLA_TYPE_MASK,
        ) {
            let e = Element {
                key: ElemKey::from_slice(&key),
                key_end: None,
                flags,
                data: None,
            };
            let (mut fast, mut general) = (MsgWriter::with_capacity(64), MsgWriter::with_capacity(64));
            // An attribute starts 4-byte aligned (the message header and every attribute
            // before it are padded); the general path pads to the buffer's alignment.
            fast.buf.extend_from_slice(&[7, 7, 7, 7]);
            general.buf.extend_from_slice(&[7, 7, 7, 7]);
            put_plain_elem(&mut fast, ty, e.flags, &e.key);
            put_elem(&mut general, ty, &e);
            proptest::prop_assert_eq!(fast.buf, general.buf);
        }
    }
}
