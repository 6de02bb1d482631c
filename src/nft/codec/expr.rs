//! Encoding and decoding of the expressions of [`Expr`]. Attribute order follows libnftnl
//! (`src/expr/*.c`, `*_build`), so our bytes equal `nft --debug=mnl`'s; decoding accepts any order.
//! An expression whose attributes we do not fully model decodes to [`Expr::Other`], raw, so
//! nothing read back is silently changed.

use super::attr::{Attr, Attrs, MsgWriter};
use super::CodecError;
use crate::nft::consts::*;
use crate::nft::model::*;

/// The kernel name of an expression (`NFTA_EXPR_NAME`).
pub fn expr_name(e: &Expr) -> &str {
    match e {
        Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
        Expr::Payload { .. } | Expr::PayloadSet { .. } => "payload",
        Expr::Cmp { .. } => "cmp",
        Expr::Bitwise { .. } => "bitwise",
        Expr::Range { .. } => "range",
        Expr::Lookup { .. } => "lookup",
        Expr::ImmediateData { .. } | Expr::Verdict(_) => "immediate",
        Expr::Counter { .. } => "counter",
        Expr::Ct { .. } => "ct",
        Expr::Log { .. } => "log",
        Expr::Limit { .. } => "limit",
        Expr::Reject { .. } => "reject",
        Expr::Nat { .. } => "nat",
        Expr::Masq { .. } => "masq",
        Expr::Notrack => "notrack",
        Expr::Fib { .. } => "fib",
        Expr::Connlimit { .. } => "connlimit",
        Expr::Other { name, .. } => name,
    }
}

pub(crate) fn meta_key_num(k: MetaKey) -> u32 {
    match k {
        MetaKey::Len => 0,
        MetaKey::Protocol => 1,
        MetaKey::Mark => 3,
        MetaKey::Iif => 4,
        MetaKey::Oif => 5,
        MetaKey::IifName => 6,
        MetaKey::OifName => 7,
        MetaKey::IifType => 8,
        MetaKey::OifType => 9,
        MetaKey::NfProto => 15,
        MetaKey::L4Proto => 16,
        MetaKey::PktType => 19,
        MetaKey::Other(n) => n,
    }
}

pub(crate) fn meta_key_from(n: u32) -> MetaKey {
    match n {
        0 => MetaKey::Len,
        1 => MetaKey::Protocol,
        3 => MetaKey::Mark,
        4 => MetaKey::Iif,
        5 => MetaKey::Oif,
        6 => MetaKey::IifName,
        7 => MetaKey::OifName,
        8 => MetaKey::IifType,
        9 => MetaKey::OifType,
        15 => MetaKey::NfProto,
        16 => MetaKey::L4Proto,
        19 => MetaKey::PktType,
        n => MetaKey::Other(n),
    }
}

pub(crate) fn ct_key_num(k: CtKey) -> u32 {
    match k {
        CtKey::State => 0,
        CtKey::Direction => 1,
        CtKey::Status => 2,
        CtKey::Mark => 3,
        CtKey::Other(n) => n,
    }
}

fn ct_key_from(n: u32) -> CtKey {
    match n {
        0 => CtKey::State,
        1 => CtKey::Direction,
        2 => CtKey::Status,
        3 => CtKey::Mark,
        n => CtKey::Other(n),
    }
}

pub(crate) fn cmp_op_num(op: CmpOp) -> u32 {
    match op {
        CmpOp::Eq => 0,
        CmpOp::Neq => 1,
        CmpOp::Lt => 2,
        CmpOp::Lte => 3,
        CmpOp::Gt => 4,
        CmpOp::Gte => 5,
    }
}

fn cmp_op_from(n: u32) -> Option<CmpOp> {
    Some(match n {
        0 => CmpOp::Eq,
        1 => CmpOp::Neq,
        2 => CmpOp::Lt,
        3 => CmpOp::Lte,
        4 => CmpOp::Gt,
        5 => CmpOp::Gte,
        _ => return None,
    })
}

pub(crate) fn base_num(b: PayloadBase) -> u32 {
    match b {
        PayloadBase::LinkLayer => 0,
        PayloadBase::Network => 1,
        PayloadBase::Transport => 2,
        PayloadBase::Inner => 3,
    }
}

fn base_from(n: u32) -> Option<PayloadBase> {
    Some(match n {
        0 => PayloadBase::LinkLayer,
        1 => PayloadBase::Network,
        2 => PayloadBase::Transport,
        3 => PayloadBase::Inner,
        _ => return None,
    })
}

/// Verdict code (`NF_*`/`NFT_*`) and target chain.
pub(crate) fn verdict_code(v: &Verdict) -> (i32, Option<&str>) {
    match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Continue => (NFT_CONTINUE, None),
        Verdict::Break => (NFT_BREAK, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Other(n) => (*n, None),
    }
}

/// `ty { NFTA_DATA_VERDICT { CODE, [CHAIN] } }`.
pub(crate) fn put_verdict(w: &mut MsgWriter, ty: u16, v: &Verdict) {
    let (code, chain) = verdict_code(v);
    let outer = w.begin_nest(ty);
    let inner = w.begin_nest(NFTA_DATA_VERDICT);
    w.put_be32(NFTA_VERDICT_CODE, code as u32);
    if let Some(c) = chain {
        w.put_str(NFTA_VERDICT_CHAIN, c);
    }
    w.end_nest(inner);
    w.end_nest(outer);
}

/// Decodes `NFTA_DATA_VERDICT { CODE, [CHAIN] }` (the inner nest).
pub(crate) fn decode_verdict(a: &Attr<'_>) -> Result<Verdict, CodecError> {
    let mut code = None;
    let mut chain = None;
    for x in a.nested() {
        let x = x?;
        match x.ty {
            NFTA_VERDICT_CODE => code = Some(x.be32("verdict")? as i32),
            NFTA_VERDICT_CHAIN => chain = Some(x.str("verdict")?),
            _ => {}
        }
    }
    let code = code.ok_or(CodecError::Missing {
        what: "verdict",
        attr: NFTA_VERDICT_CODE,
    })?;
    Ok(match (code, chain) {
        (NF_ACCEPT, None) => Verdict::Accept,
        (NF_DROP, None) => Verdict::Drop,
        (NFT_CONTINUE, None) => Verdict::Continue,
        (NFT_BREAK, None) => Verdict::Break,
        (NFT_RETURN, None) => Verdict::Return,
        (NFT_JUMP, Some(c)) => Verdict::Jump(c),
        (NFT_GOTO, Some(c)) => Verdict::Goto(c),
        (n, _) => Verdict::Other(n),
    })
}

/// Appends `NFTA_LIST_ELEM { NAME, DATA { .. } }` for one expression.
pub fn put_expr(w: &mut MsgWriter, e: &Expr) {
    put_expr_in(w, e, &|_| None)
}

/// [`put_expr`], a lookup without a set id taking its id from `set_id(set name)` (sets created
/// in the same batch).
pub(super) fn put_expr_in(w: &mut MsgWriter, e: &Expr, set_id: &dyn Fn(&str) -> Option<u32>) {
    let elem = w.begin_nest(NFTA_LIST_ELEM);
    w.put_str(NFTA_EXPR_NAME, expr_name(e));
    if let Expr::Other { data, .. } = e {
        // Raw NFTA_EXPR_DATA payload, nested flag kept as libnftnl sends it.
        w.put(NFTA_EXPR_DATA | NLA_F_NESTED, data);
        w.end_nest(elem);
        return;
    }
    if matches!(e, Expr::Notrack) {
        // libnftnl sends notrack without an NFTA_EXPR_DATA nest.
        w.end_nest(elem);
        return;
    }
    let d = w.begin_nest(NFTA_EXPR_DATA);
    put_expr_data(w, e, set_id);
    w.end_nest(d);
    w.end_nest(elem);
}

fn put_reg(w: &mut MsgWriter, ty: u16, r: Reg) {
    w.put_be32(ty, r.0);
}

fn put_expr_data(w: &mut MsgWriter, e: &Expr, new_set_id: &dyn Fn(&str) -> Option<u32>) {
    match e {
        Expr::Meta { key, dreg } => {
            w.put_be32(NFTA_META_KEY, meta_key_num(*key));
            put_reg(w, NFTA_META_DREG, *dreg);
        }
        Expr::MetaSet { key, sreg } => {
            w.put_be32(NFTA_META_KEY, meta_key_num(*key));
            put_reg(w, NFTA_META_SREG, *sreg);
        }
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => {
            put_reg(w, NFTA_PAYLOAD_DREG, *dreg);
            w.put_be32(NFTA_PAYLOAD_BASE, base_num(*base));
            w.put_be32(NFTA_PAYLOAD_OFFSET, *offset);
            w.put_be32(NFTA_PAYLOAD_LEN, *len);
        }
        Expr::PayloadSet {
            base,
            offset,
            len,
            sreg,
            csum_type,
            csum_offset,
            csum_flags,
        } => {
            put_reg(w, NFTA_PAYLOAD_SREG, *sreg);
            w.put_be32(NFTA_PAYLOAD_BASE, base_num(*base));
            w.put_be32(NFTA_PAYLOAD_OFFSET, *offset);
            w.put_be32(NFTA_PAYLOAD_LEN, *len);
            w.put_be32(NFTA_PAYLOAD_CSUM_TYPE, *csum_type);
            w.put_be32(NFTA_PAYLOAD_CSUM_OFFSET, *csum_offset);
            if *csum_flags != 0 {
                w.put_be32(NFTA_PAYLOAD_CSUM_FLAGS, *csum_flags);
            }
        }
        Expr::Cmp { sreg, op, data } => {
            put_reg(w, NFTA_CMP_SREG, *sreg);
            w.put_be32(NFTA_CMP_OP, cmp_op_num(*op));
            w.put_data_value(NFTA_CMP_DATA, data);
        }
        Expr::Bitwise {
            sreg,
            dreg,
            len,
            mask,
            xor,
        } => {
            put_reg(w, NFTA_BITWISE_SREG, *sreg);
            put_reg(w, NFTA_BITWISE_DREG, *dreg);
            // Sent explicitly (nft omits it for flag matches); the kernel dumps it either way.
            w.put_be32(NFTA_BITWISE_OP, NFT_BITWISE_BOOL);
            w.put_be32(NFTA_BITWISE_LEN, *len);
            w.put_data_value(NFTA_BITWISE_MASK, mask);
            w.put_data_value(NFTA_BITWISE_XOR, xor);
        }
        Expr::Range { sreg, op, from, to } => {
            put_reg(w, NFTA_RANGE_SREG, *sreg);
            w.put_be32(NFTA_RANGE_OP, cmp_op_num(*op));
            w.put_data_value(NFTA_RANGE_FROM_DATA, from);
            w.put_data_value(NFTA_RANGE_TO_DATA, to);
        }
        Expr::Lookup {
            set,
            set_id,
            sreg,
            dreg,
            invert,
        } => {
            put_reg(w, NFTA_LOOKUP_SREG, *sreg);
            if let Some(d) = dreg {
                put_reg(w, NFTA_LOOKUP_DREG, *d);
            }
            w.put_str(NFTA_LOOKUP_SET, set);
            if let Some(id) = set_id.or_else(|| new_set_id(set)) {
                w.put_be32(NFTA_LOOKUP_SET_ID, id);
            }
            if *invert {
                w.put_be32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
            }
        }
        Expr::ImmediateData { dreg, data } => {
            put_reg(w, NFTA_IMMEDIATE_DREG, *dreg);
            w.put_data_value(NFTA_IMMEDIATE_DATA, data);
        }
        Expr::Verdict(v) => {
            put_reg(w, NFTA_IMMEDIATE_DREG, Reg::VERDICT);
            put_verdict(w, NFTA_IMMEDIATE_DATA, v);
        }
        Expr::Counter { packets, bytes } => {
            // nft sends an empty counter; values only when restoring them.
            if *packets != 0 || *bytes != 0 {
                w.put_be64(NFTA_COUNTER_BYTES, *bytes);
                w.put_be64(NFTA_COUNTER_PACKETS, *packets);
            }
        }
        Expr::Ct {
            key,
            dreg,
            direction,
        } => {
            w.put_be32(NFTA_CT_KEY, ct_key_num(*key));
            put_reg(w, NFTA_CT_DREG, *dreg);
            if let Some(d) = direction {
                w.put_u8(NFTA_CT_DIRECTION, *d);
            }
        }
        Expr::Log {
            prefix,
            level,
            group,
            snaplen,
            flags,
        } => {
            if let Some(p) = prefix {
                w.put_str(NFTA_LOG_PREFIX, p);
            }
            if let Some(g) = group {
                w.put_be16(NFTA_LOG_GROUP, *g);
            }
            if let Some(s) = snaplen {
                w.put_be32(NFTA_LOG_SNAPLEN, *s);
            }
            if let Some(l) = level {
                w.put_be32(NFTA_LOG_LEVEL, *l);
            }
            if let Some(f) = flags {
                w.put_be32(NFTA_LOG_FLAGS, *f);
            }
        }
        Expr::Limit {
            rate,
            unit,
            burst,
            kind,
            over,
        } => {
            w.put_be64(NFTA_LIMIT_RATE, *rate);
            w.put_be64(NFTA_LIMIT_UNIT, *unit);
            if *burst != 0 {
                w.put_be32(NFTA_LIMIT_BURST, *burst);
            }
            w.put_be32(
                NFTA_LIMIT_TYPE,
                match kind {
                    LimitType::Packets => NFT_LIMIT_PKTS,
                    LimitType::Bytes => NFT_LIMIT_PKT_BYTES,
                },
            );
            w.put_be32(NFTA_LIMIT_FLAGS, if *over { NFT_LIMIT_F_INV } else { 0 });
        }
        Expr::Reject { kind, code } => {
            w.put_be32(
                NFTA_REJECT_TYPE,
                match kind {
                    RejectType::IcmpUnreach => 0,
                    RejectType::TcpRst => 1,
                    RejectType::IcmpxUnreach => 2,
                },
            );
            w.put_u8(NFTA_REJECT_ICMP_CODE, *code);
        }
        Expr::Nat {
            kind,
            family,
            addr_min,
            addr_max,
            proto_min,
            proto_max,
            flags,
        } => {
            w.put_be32(
                NFTA_NAT_TYPE,
                match kind {
                    NatType::Snat => 0,
                    NatType::Dnat => 1,
                },
            );
            w.put_be32(NFTA_NAT_FAMILY, family.nfproto() as u32);
            for (ty, r) in [
                (NFTA_NAT_REG_ADDR_MIN, addr_min),
                (NFTA_NAT_REG_ADDR_MAX, addr_max),
                (NFTA_NAT_REG_PROTO_MIN, proto_min),
                (NFTA_NAT_REG_PROTO_MAX, proto_max),
            ] {
                if let Some(r) = r {
                    put_reg(w, ty, *r);
                }
            }
            if *flags != 0 {
                w.put_be32(NFTA_NAT_FLAGS, *flags);
            }
        }
        Expr::Masq {
            flags,
            proto_min,
            proto_max,
        } => {
            if *flags != 0 {
                w.put_be32(NFTA_MASQ_FLAGS, *flags);
            }
            if let Some(r) = proto_min {
                put_reg(w, NFTA_MASQ_REG_PROTO_MIN, *r);
            }
            if let Some(r) = proto_max {
                put_reg(w, NFTA_MASQ_REG_PROTO_MAX, *r);
            }
        }
        Expr::Notrack => {}
        Expr::Fib {
            flags,
            result,
            dreg,
        } => {
            w.put_be32(NFTA_FIB_FLAGS, *flags);
            w.put_be32(
                NFTA_FIB_RESULT,
                match result {
                    FibResult::Oif => 1,
                    FibResult::OifName => 2,
                    FibResult::AddrType => 3,
                },
            );
            put_reg(w, NFTA_FIB_DREG, *dreg);
        }
        Expr::Connlimit { count, flags } => {
            w.put_be32(NFTA_CONNLIMIT_COUNT, *count);
            w.put_be32(NFTA_CONNLIMIT_FLAGS, *flags);
        }
        Expr::Other { .. } => {}
    }
}

/// Decodes one `NFTA_LIST_ELEM` of `NFTA_RULE_EXPRESSIONS`.
pub fn decode_expr(elem: &[u8]) -> Result<Expr, CodecError> {
    let mut name = None;
    let mut data: &[u8] = &[];
    for a in Attrs::new(elem) {
        let a = a?;
        match a.ty {
            NFTA_EXPR_NAME => name = Some(a.str_ref("expression")?),
            NFTA_EXPR_DATA => data = a.data,
            _ => {}
        }
    }
    let name = name.ok_or(CodecError::Missing {
        what: "expression",
        attr: NFTA_EXPR_NAME,
    })?;
    let known = decode_known(name, data)?;
    Ok(known.unwrap_or_else(|| Expr::Other {
        name: name.to_owned(),
        data: data.to_vec(),
    }))
}

/// Attribute table of one expression: `get(ty)` finds an attribute; `all_in` checks that nothing
/// outside the modelled set is present (else the expression is kept raw). Up to
/// [`Tb::INLINE`] attributes are indexed on the stack: a dump decodes ~10⁵ expressions, and a
/// heap table per expression was a visible share of the read-back's user time.
struct Tb<'a> {
    inline: [Option<Attr<'a>>; Tb::INLINE],
    more: Vec<Attr<'a>>,
}

impl<'a> Tb<'a> {
    /// More attributes than any expression we model has (payload set: 7).
    const INLINE: usize = 8;

    fn parse(data: &'a [u8]) -> Result<Tb<'a>, CodecError> {
        let mut t = Tb {
            inline: [None; Tb::INLINE],
            more: Vec::new(),
        };
        for (i, a) in Attrs::new(data).enumerate() {
            match t.inline.get_mut(i) {
                Some(slot) => *slot = Some(a?),
                None => t.more.push(a?),
            }
        }
        Ok(t)
    }
    fn iter(&self) -> impl Iterator<Item = &Attr<'a>> {
        self.inline
            .iter()
            .map_while(Option::as_ref)
            .chain(&self.more)
    }
    fn get(&self, ty: u16) -> Option<&Attr<'a>> {
        self.iter().find(|a| a.ty == ty)
    }
    fn all_in(&self, allowed: &[u16]) -> bool {
        self.iter().all(|a| allowed.contains(&a.ty))
    }
    fn u32(&self, ty: u16, what: &'static str) -> Result<Option<u32>, CodecError> {
        self.get(ty).map(|a| a.be32(what)).transpose()
    }
    fn reg(&self, ty: u16, what: &'static str) -> Result<Option<Reg>, CodecError> {
        Ok(self.u32(ty, what)?.map(Reg))
    }
    fn value(&self, ty: u16, what: &'static str) -> Result<Option<Vec<u8>>, CodecError> {
        self.get(ty).map(|a| a.data_value(what)).transpose()
    }
}

/// `Ok(None)` = known name but not fully modelled: the caller keeps it as `Expr::Other`.
fn decode_known(name: &str, data: &[u8]) -> Result<Option<Expr>, CodecError> {
    let t = Tb::parse(data)?;
    let what = "expression";
    Ok(match name {
        "meta" => {
            if !t.all_in(&[NFTA_META_KEY, NFTA_META_DREG, NFTA_META_SREG]) {
                return Ok(None);
            }
            let Some(key) = t.u32(NFTA_META_KEY, what)?.map(meta_key_from) else {
                return Ok(None);
            };
            match (t.reg(NFTA_META_DREG, what)?, t.reg(NFTA_META_SREG, what)?) {
                (Some(dreg), None) => Some(Expr::Meta { key, dreg }),
                (None, Some(sreg)) => Some(Expr::MetaSet { key, sreg }),
                _ => None,
            }
        }
        "payload" => {
            let (Some(base), Some(offset), Some(len)) = (
                t.u32(NFTA_PAYLOAD_BASE, what)?.and_then(base_from),
                t.u32(NFTA_PAYLOAD_OFFSET, what)?,
                t.u32(NFTA_PAYLOAD_LEN, what)?,
            ) else {
                return Ok(None);
            };
            if let Some(dreg) = t.reg(NFTA_PAYLOAD_DREG, what)? {
                if !t.all_in(&[
                    NFTA_PAYLOAD_DREG,
                    NFTA_PAYLOAD_BASE,
                    NFTA_PAYLOAD_OFFSET,
                    NFTA_PAYLOAD_LEN,
                ]) {
                    return Ok(None);
                }
                Some(Expr::Payload {
                    base,
                    offset,
                    len,
                    dreg,
                })
            } else if let Some(sreg) = t.reg(NFTA_PAYLOAD_SREG, what)? {
                if !t.all_in(&[
                    NFTA_PAYLOAD_SREG,
                    NFTA_PAYLOAD_BASE,
                    NFTA_PAYLOAD_OFFSET,
                    NFTA_PAYLOAD_LEN,
                    NFTA_PAYLOAD_CSUM_TYPE,
                    NFTA_PAYLOAD_CSUM_OFFSET,
                    NFTA_PAYLOAD_CSUM_FLAGS,
                ]) {
                    return Ok(None);
                }
                Some(Expr::PayloadSet {
                    base,
                    offset,
                    len,
                    sreg,
                    csum_type: t.u32(NFTA_PAYLOAD_CSUM_TYPE, what)?.unwrap_or(0),
                    csum_offset: t.u32(NFTA_PAYLOAD_CSUM_OFFSET, what)?.unwrap_or(0),
                    csum_flags: t.u32(NFTA_PAYLOAD_CSUM_FLAGS, what)?.unwrap_or(0),
                })
            } else {
                None
            }
        }
        "cmp" => {
            let (Some(sreg), Some(op), Some(data)) = (
                t.reg(NFTA_CMP_SREG, what)?,
                t.u32(NFTA_CMP_OP, what)?.and_then(cmp_op_from),
                t.value(NFTA_CMP_DATA, what)?,
            ) else {
                return Ok(None);
            };
            Some(Expr::Cmp { sreg, op, data })
        }
        "bitwise" => {
            if t.u32(NFTA_BITWISE_OP, what)?.unwrap_or(NFT_BITWISE_BOOL) != NFT_BITWISE_BOOL
                || !t.all_in(&[
                    NFTA_BITWISE_SREG,
                    NFTA_BITWISE_DREG,
                    NFTA_BITWISE_LEN,
                    NFTA_BITWISE_MASK,
                    NFTA_BITWISE_XOR,
                    NFTA_BITWISE_OP,
                ])
            {
                return Ok(None);
            }
            let (Some(sreg), Some(dreg), Some(len), Some(mask), Some(xor)) = (
                t.reg(NFTA_BITWISE_SREG, what)?,
                t.reg(NFTA_BITWISE_DREG, what)?,
                t.u32(NFTA_BITWISE_LEN, what)?,
                t.value(NFTA_BITWISE_MASK, what)?,
                t.value(NFTA_BITWISE_XOR, what)?,
            ) else {
                return Ok(None);
            };
            Some(Expr::Bitwise {
                sreg,
                dreg,
                len,
                mask,
                xor,
            })
        }
        "range" => {
            let (Some(sreg), Some(op), Some(from), Some(to)) = (
                t.reg(NFTA_RANGE_SREG, what)?,
                t.u32(NFTA_RANGE_OP, what)?.and_then(cmp_op_from),
                t.value(NFTA_RANGE_FROM_DATA, what)?,
                t.value(NFTA_RANGE_TO_DATA, what)?,
            ) else {
                return Ok(None);
            };
            Some(Expr::Range { sreg, op, from, to })
        }
        "lookup" => {
            let (Some(set), Some(sreg)) = (
                t.get(NFTA_LOOKUP_SET).map(|a| a.str(what)).transpose()?,
                t.reg(NFTA_LOOKUP_SREG, what)?,
            ) else {
                return Ok(None);
            };
            let flags = t.u32(NFTA_LOOKUP_FLAGS, what)?.unwrap_or(0);
            if flags & !NFT_LOOKUP_F_INV != 0 {
                return Ok(None);
            }
            Some(Expr::Lookup {
                set,
                set_id: t.u32(NFTA_LOOKUP_SET_ID, what)?,
                sreg,
                dreg: t.reg(NFTA_LOOKUP_DREG, what)?,
                invert: flags & NFT_LOOKUP_F_INV != 0,
            })
        }
        "immediate" => {
            let (Some(dreg), Some(d)) = (
                t.reg(NFTA_IMMEDIATE_DREG, what)?,
                t.get(NFTA_IMMEDIATE_DATA),
            ) else {
                return Ok(None);
            };
            let mut out = None;
            for a in d.nested() {
                let a = a?;
                match (a.ty, dreg == Reg::VERDICT) {
                    (NFTA_DATA_VERDICT, true) => out = Some(Expr::Verdict(decode_verdict(&a)?)),
                    (NFTA_DATA_VALUE, false) => {
                        out = Some(Expr::ImmediateData {
                            dreg,
                            data: a.data.to_vec(),
                        })
                    }
                    _ => {}
                }
            }
            out
        }
        "counter" => Some(Expr::Counter {
            packets: t
                .get(NFTA_COUNTER_PACKETS)
                .map(|a| a.be64(what))
                .transpose()?
                .unwrap_or(0),
            bytes: t
                .get(NFTA_COUNTER_BYTES)
                .map(|a| a.be64(what))
                .transpose()?
                .unwrap_or(0),
        }),
        "ct" => {
            let (Some(key), Some(dreg)) = (
                t.u32(NFTA_CT_KEY, what)?.map(ct_key_from),
                t.reg(NFTA_CT_DREG, what)?,
            ) else {
                return Ok(None);
            };
            if !t.all_in(&[NFTA_CT_KEY, NFTA_CT_DREG, NFTA_CT_DIRECTION]) {
                return Ok(None);
            }
            Some(Expr::Ct {
                key,
                dreg,
                direction: t.get(NFTA_CT_DIRECTION).map(|a| a.u8(what)).transpose()?,
            })
        }
        "log" => {
            // A non-zero queue threshold is not modelled: keep the expression raw.
            let qt = t
                .get(NFTA_LOG_QTHRESHOLD)
                .map(|a| a.be16(what))
                .transpose()?;
            if qt.unwrap_or(0) != 0 {
                return Ok(None);
            }
            Some(Expr::Log {
                prefix: t.get(NFTA_LOG_PREFIX).map(|a| a.str(what)).transpose()?,
                level: t.u32(NFTA_LOG_LEVEL, what)?,
                group: t.get(NFTA_LOG_GROUP).map(|a| a.be16(what)).transpose()?,
                snaplen: t.u32(NFTA_LOG_SNAPLEN, what)?,
                flags: t.u32(NFTA_LOG_FLAGS, what)?,
            })
        }
        "limit" => {
            let (Some(rate), Some(unit)) = (
                t.get(NFTA_LIMIT_RATE).map(|a| a.be64(what)).transpose()?,
                t.get(NFTA_LIMIT_UNIT).map(|a| a.be64(what)).transpose()?,
            ) else {
                return Ok(None);
            };
            let kind = match t.u32(NFTA_LIMIT_TYPE, what)?.unwrap_or(NFT_LIMIT_PKTS) {
                NFT_LIMIT_PKTS => LimitType::Packets,
                NFT_LIMIT_PKT_BYTES => LimitType::Bytes,
                _ => return Ok(None),
            };
            let flags = t.u32(NFTA_LIMIT_FLAGS, what)?.unwrap_or(0);
            if flags & !NFT_LIMIT_F_INV != 0 {
                return Ok(None);
            }
            Some(Expr::Limit {
                rate,
                unit,
                burst: t.u32(NFTA_LIMIT_BURST, what)?.unwrap_or(0),
                kind,
                over: flags & NFT_LIMIT_F_INV != 0,
            })
        }
        "reject" => {
            let kind = match t.u32(NFTA_REJECT_TYPE, what)? {
                Some(0) => RejectType::IcmpUnreach,
                Some(1) => RejectType::TcpRst,
                Some(2) => RejectType::IcmpxUnreach,
                _ => return Ok(None),
            };
            Some(Expr::Reject {
                kind,
                code: t
                    .get(NFTA_REJECT_ICMP_CODE)
                    .map(|a| a.u8(what))
                    .transpose()?
                    .unwrap_or(0),
            })
        }
        "nat" => {
            let kind = match t.u32(NFTA_NAT_TYPE, what)? {
                Some(0) => NatType::Snat,
                Some(1) => NatType::Dnat,
                _ => return Ok(None),
            };
            let Some(family) = t
                .u32(NFTA_NAT_FAMILY, what)?
                .and_then(|f| u8::try_from(f).ok())
                .and_then(Family::from_nfproto)
            else {
                return Ok(None);
            };
            Some(Expr::Nat {
                kind,
                family,
                addr_min: t.reg(NFTA_NAT_REG_ADDR_MIN, what)?,
                addr_max: t.reg(NFTA_NAT_REG_ADDR_MAX, what)?,
                proto_min: t.reg(NFTA_NAT_REG_PROTO_MIN, what)?,
                proto_max: t.reg(NFTA_NAT_REG_PROTO_MAX, what)?,
                flags: t.u32(NFTA_NAT_FLAGS, what)?.unwrap_or(0),
            })
        }
        "masq" => Some(Expr::Masq {
            flags: t.u32(NFTA_MASQ_FLAGS, what)?.unwrap_or(0),
            proto_min: t.reg(NFTA_MASQ_REG_PROTO_MIN, what)?,
            proto_max: t.reg(NFTA_MASQ_REG_PROTO_MAX, what)?,
        }),
        "notrack" => Some(Expr::Notrack),
        "fib" => {
            let result = match t.u32(NFTA_FIB_RESULT, what)? {
                Some(1) => FibResult::Oif,
                Some(2) => FibResult::OifName,
                Some(3) => FibResult::AddrType,
                _ => return Ok(None),
            };
            let (Some(flags), Some(dreg)) =
                (t.u32(NFTA_FIB_FLAGS, what)?, t.reg(NFTA_FIB_DREG, what)?)
            else {
                return Ok(None);
            };
            Some(Expr::Fib {
                flags,
                result,
                dreg,
            })
        }
        "connlimit" => {
            let Some(count) = t.u32(NFTA_CONNLIMIT_COUNT, what)? else {
                return Ok(None);
            };
            Some(Expr::Connlimit {
                count,
                flags: t.u32(NFTA_CONNLIMIT_FLAGS, what)?.unwrap_or(0),
            })
        }
        _ => None,
    })
}
