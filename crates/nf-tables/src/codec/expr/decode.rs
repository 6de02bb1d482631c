//! `NFTA_LIST_ELEM { NAME, DATA }` → expressions: the attributes indexed once per expression,
//! then one function per expression we model; anything else stays raw.

use super::numbers::{base_from, cmp_op_from, ct_key_from, meta_key_from};
use super::verdict::decode_verdict;
use crate::codec::attr::{Attr, Attrs};
use crate::codec::CodecError;
use crate::consts::*;
use crate::model::*;

/// What a malformed attribute's error names.
const WHAT: &str = "expression";

/// Decodes one `NFTA_LIST_ELEM` of `NFTA_RULE_EXPRESSIONS`.
pub fn decode_expr(elem: &[u8]) -> Result<Expr, CodecError> {
    let mut name = None;
    let mut data: &[u8] = &[];
    for a in Attrs::new(elem) {
        let a = a?;
        match a.ty {
            NFTA_EXPR_NAME => name = Some(a.str_ref(WHAT)?),
            NFTA_EXPR_DATA => data = a.data,
            _ => {}
        }
    }
    let name = name.ok_or(CodecError::Missing {
        what: WHAT,
        attr: NFTA_EXPR_NAME,
    })?;
    let known = decode_known(name, data)?;
    Ok(known.unwrap_or_else(|| Expr::Other {
        name: name.to_owned(),
        data: data.to_vec(),
    }))
}

/// Attribute table of one expression: `get(ty)` finds an attribute, `u32(ty)` and the like read
/// one (an error names the expression); `all_in` checks that nothing outside the modelled set is
/// present (else the expression is kept raw). Up to [`Tb::INLINE`] attributes are indexed on the
/// stack: a dump decodes every expression of every rule, so the table allocates nothing for the
/// expressions we model.
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
    fn u32(&self, ty: u16) -> Result<Option<u32>, CodecError> {
        self.get(ty).map(|a| a.be32(WHAT)).transpose()
    }
    fn u64(&self, ty: u16) -> Result<Option<u64>, CodecError> {
        self.get(ty).map(|a| a.be64(WHAT)).transpose()
    }
    fn u16(&self, ty: u16) -> Result<Option<u16>, CodecError> {
        self.get(ty).map(|a| a.be16(WHAT)).transpose()
    }
    fn u8(&self, ty: u16) -> Result<Option<u8>, CodecError> {
        self.get(ty).map(|a| a.u8(WHAT)).transpose()
    }
    fn string(&self, ty: u16) -> Result<Option<String>, CodecError> {
        self.get(ty).map(|a| a.str(WHAT)).transpose()
    }
    fn reg(&self, ty: u16) -> Result<Option<Reg>, CodecError> {
        Ok(self.u32(ty)?.map(Reg))
    }
    fn value(&self, ty: u16) -> Result<Option<Vec<u8>>, CodecError> {
        self.get(ty).map(|a| a.data_value(WHAT)).transpose()
    }
}

/// `Ok(None)` = known name but not fully modelled: the caller keeps it as `Expr::Other`.
fn decode_known(name: &str, data: &[u8]) -> Decoded {
    let t = Tb::parse(data)?;
    match name {
        "meta" => meta(&t),
        "payload" => payload(&t),
        "cmp" => cmp(&t),
        "bitwise" => bitwise(&t),
        "range" => range(&t),
        "lookup" => lookup(&t),
        "immediate" => immediate(&t),
        "counter" => counter(&t),
        "ct" => ct(&t),
        "log" => log(&t),
        "limit" => limit(&t),
        "reject" => reject(&t),
        "nat" => nat(&t),
        "masq" => masq(&t),
        "notrack" => Ok(Some(Expr::Notrack)),
        "fib" => fib(&t),
        "connlimit" => connlimit(&t),
        _ => Ok(None),
    }
}

/// A decoded expression, `None` where its attributes are more than we model.
type Decoded = Result<Option<Expr>, CodecError>;

fn meta(t: &Tb) -> Decoded {
    if !t.all_in(&[NFTA_META_KEY, NFTA_META_DREG, NFTA_META_SREG]) {
        return Ok(None);
    }
    let Some(key) = t.u32(NFTA_META_KEY)?.map(meta_key_from) else {
        return Ok(None);
    };
    Ok(match (t.reg(NFTA_META_DREG)?, t.reg(NFTA_META_SREG)?) {
        (Some(dreg), None) => Some(Expr::Meta { key, dreg }),
        (None, Some(sreg)) => Some(Expr::MetaSet { key, sreg }),
        _ => None,
    })
}

/// A payload load (with a DREG) or store (with an SREG and its checksum fix-up).
fn payload(t: &Tb) -> Decoded {
    let (Some(base), Some(offset), Some(len)) = (
        t.u32(NFTA_PAYLOAD_BASE)?.and_then(base_from),
        t.u32(NFTA_PAYLOAD_OFFSET)?,
        t.u32(NFTA_PAYLOAD_LEN)?,
    ) else {
        return Ok(None);
    };
    if let Some(dreg) = t.reg(NFTA_PAYLOAD_DREG)? {
        if !t.all_in(&[
            NFTA_PAYLOAD_DREG,
            NFTA_PAYLOAD_BASE,
            NFTA_PAYLOAD_OFFSET,
            NFTA_PAYLOAD_LEN,
        ]) {
            return Ok(None);
        }
        Ok(Some(Expr::Payload {
            base,
            offset,
            len,
            dreg,
        }))
    } else if let Some(sreg) = t.reg(NFTA_PAYLOAD_SREG)? {
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
        Ok(Some(Expr::PayloadSet {
            base,
            offset,
            len,
            sreg,
            csum_type: t.u32(NFTA_PAYLOAD_CSUM_TYPE)?.unwrap_or(0),
            csum_offset: t.u32(NFTA_PAYLOAD_CSUM_OFFSET)?.unwrap_or(0),
            csum_flags: t.u32(NFTA_PAYLOAD_CSUM_FLAGS)?.unwrap_or(0),
        }))
    } else {
        Ok(None)
    }
}

fn cmp(t: &Tb) -> Decoded {
    let (Some(sreg), Some(op), Some(data)) = (
        t.reg(NFTA_CMP_SREG)?,
        t.u32(NFTA_CMP_OP)?.and_then(cmp_op_from),
        t.value(NFTA_CMP_DATA)?,
    ) else {
        return Ok(None);
    };
    Ok(Some(Expr::Cmp { sreg, op, data }))
}

/// Boolean bitwise only (no shifts).
fn bitwise(t: &Tb) -> Decoded {
    if t.u32(NFTA_BITWISE_OP)?.unwrap_or(NFT_BITWISE_BOOL) != NFT_BITWISE_BOOL
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
        t.reg(NFTA_BITWISE_SREG)?,
        t.reg(NFTA_BITWISE_DREG)?,
        t.u32(NFTA_BITWISE_LEN)?,
        t.value(NFTA_BITWISE_MASK)?,
        t.value(NFTA_BITWISE_XOR)?,
    ) else {
        return Ok(None);
    };
    Ok(Some(Expr::Bitwise {
        sreg,
        dreg,
        len,
        mask,
        xor,
    }))
}

fn range(t: &Tb) -> Decoded {
    let (Some(sreg), Some(op), Some(from), Some(to)) = (
        t.reg(NFTA_RANGE_SREG)?,
        t.u32(NFTA_RANGE_OP)?.and_then(cmp_op_from),
        t.value(NFTA_RANGE_FROM_DATA)?,
        t.value(NFTA_RANGE_TO_DATA)?,
    ) else {
        return Ok(None);
    };
    Ok(Some(Expr::Range { sreg, op, from, to }))
}

fn lookup(t: &Tb) -> Decoded {
    let (Some(set), Some(sreg)) = (t.string(NFTA_LOOKUP_SET)?, t.reg(NFTA_LOOKUP_SREG)?) else {
        return Ok(None);
    };
    let flags = t.u32(NFTA_LOOKUP_FLAGS)?.unwrap_or(0);
    if flags & !NFT_LOOKUP_F_INV != 0 {
        return Ok(None);
    }
    Ok(Some(Expr::Lookup {
        set,
        set_id: t.u32(NFTA_LOOKUP_SET_ID)?,
        sreg,
        dreg: t.reg(NFTA_LOOKUP_DREG)?,
        invert: flags & NFT_LOOKUP_F_INV != 0,
    }))
}

/// An immediate: a verdict into the verdict register, else data into a data register.
fn immediate(t: &Tb) -> Decoded {
    let (Some(dreg), Some(d)) = (t.reg(NFTA_IMMEDIATE_DREG)?, t.get(NFTA_IMMEDIATE_DATA)) else {
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
    Ok(out)
}

fn counter(t: &Tb) -> Decoded {
    Ok(Some(Expr::Counter {
        packets: t.u64(NFTA_COUNTER_PACKETS)?.unwrap_or(0),
        bytes: t.u64(NFTA_COUNTER_BYTES)?.unwrap_or(0),
    }))
}

fn ct(t: &Tb) -> Decoded {
    let (Some(key), Some(dreg)) = (t.u32(NFTA_CT_KEY)?.map(ct_key_from), t.reg(NFTA_CT_DREG)?)
    else {
        return Ok(None);
    };
    if !t.all_in(&[NFTA_CT_KEY, NFTA_CT_DREG, NFTA_CT_DIRECTION]) {
        return Ok(None);
    }
    Ok(Some(Expr::Ct {
        key,
        dreg,
        direction: t.u8(NFTA_CT_DIRECTION)?,
    }))
}

fn log(t: &Tb) -> Decoded {
    // A non-zero queue threshold is not modelled: keep the expression raw.
    let qt = t.u16(NFTA_LOG_QTHRESHOLD)?;
    if qt.unwrap_or(0) != 0 {
        return Ok(None);
    }
    Ok(Some(Expr::Log {
        prefix: t.string(NFTA_LOG_PREFIX)?,
        level: t.u32(NFTA_LOG_LEVEL)?,
        group: t.u16(NFTA_LOG_GROUP)?,
        snaplen: t.u32(NFTA_LOG_SNAPLEN)?,
        flags: t.u32(NFTA_LOG_FLAGS)?,
    }))
}

fn limit(t: &Tb) -> Decoded {
    let (Some(rate), Some(unit)) = (t.u64(NFTA_LIMIT_RATE)?, t.u64(NFTA_LIMIT_UNIT)?) else {
        return Ok(None);
    };
    let kind = match t.u32(NFTA_LIMIT_TYPE)?.unwrap_or(NFT_LIMIT_PKTS) {
        NFT_LIMIT_PKTS => LimitType::Packets,
        NFT_LIMIT_PKT_BYTES => LimitType::Bytes,
        _ => return Ok(None),
    };
    let flags = t.u32(NFTA_LIMIT_FLAGS)?.unwrap_or(0);
    if flags & !NFT_LIMIT_F_INV != 0 {
        return Ok(None);
    }
    Ok(Some(Expr::Limit {
        rate,
        unit,
        burst: t.u32(NFTA_LIMIT_BURST)?.unwrap_or(0),
        kind,
        over: flags & NFT_LIMIT_F_INV != 0,
    }))
}

fn reject(t: &Tb) -> Decoded {
    let kind = match t.u32(NFTA_REJECT_TYPE)? {
        Some(0) => RejectType::IcmpUnreach,
        Some(1) => RejectType::TcpRst,
        Some(2) => RejectType::IcmpxUnreach,
        _ => return Ok(None),
    };
    Ok(Some(Expr::Reject {
        kind,
        code: t.u8(NFTA_REJECT_ICMP_CODE)?.unwrap_or(0),
    }))
}

fn nat(t: &Tb) -> Decoded {
    let kind = match t.u32(NFTA_NAT_TYPE)? {
        Some(0) => NatType::Snat,
        Some(1) => NatType::Dnat,
        _ => return Ok(None),
    };
    let Some(family) = t
        .u32(NFTA_NAT_FAMILY)?
        .and_then(|f| u8::try_from(f).ok())
        .and_then(Family::from_nfproto)
    else {
        return Ok(None);
    };
    Ok(Some(Expr::Nat {
        kind,
        family,
        addr_min: t.reg(NFTA_NAT_REG_ADDR_MIN)?,
        addr_max: t.reg(NFTA_NAT_REG_ADDR_MAX)?,
        proto_min: t.reg(NFTA_NAT_REG_PROTO_MIN)?,
        proto_max: t.reg(NFTA_NAT_REG_PROTO_MAX)?,
        flags: t.u32(NFTA_NAT_FLAGS)?.unwrap_or(0),
    }))
}

fn masq(t: &Tb) -> Decoded {
    Ok(Some(Expr::Masq {
        flags: t.u32(NFTA_MASQ_FLAGS)?.unwrap_or(0),
        proto_min: t.reg(NFTA_MASQ_REG_PROTO_MIN)?,
        proto_max: t.reg(NFTA_MASQ_REG_PROTO_MAX)?,
    }))
}

fn fib(t: &Tb) -> Decoded {
    let result = match t.u32(NFTA_FIB_RESULT)? {
        Some(1) => FibResult::Oif,
        Some(2) => FibResult::OifName,
        Some(3) => FibResult::AddrType,
        _ => return Ok(None),
    };
    let (Some(flags), Some(dreg)) = (t.u32(NFTA_FIB_FLAGS)?, t.reg(NFTA_FIB_DREG)?) else {
        return Ok(None);
    };
    Ok(Some(Expr::Fib {
        flags,
        result,
        dreg,
    }))
}

fn connlimit(t: &Tb) -> Decoded {
    let Some(count) = t.u32(NFTA_CONNLIMIT_COUNT)? else {
        return Ok(None);
    };
    Ok(Some(Expr::Connlimit {
        count,
        flags: t.u32(NFTA_CONNLIMIT_FLAGS)?.unwrap_or(0),
    }))
}
