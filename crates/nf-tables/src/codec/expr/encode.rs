//! Expressions → `NFTA_LIST_ELEM { NAME, DATA }`: each expression's attributes in libnftnl's
//! order, one function per expression.

use super::expr_name;
use super::numbers::{base_num, cmp_op_num, ct_key_num, meta_key_num};
use super::verdict::put_verdict;
use crate::codec::attr::MsgWriter;
use crate::consts::*;
use crate::model::*;

/// Appends `NFTA_LIST_ELEM { NAME, DATA { .. } }` for one expression.
pub fn put_expr(w: &mut MsgWriter, e: &Expr) {
    put_expr_in(w, e, &|_| None)
}

/// [`put_expr`], a lookup without a set id taking its id from `set_id(set name)` (sets created
/// in the same batch).
pub(in crate::codec) fn put_expr_in(
    w: &mut MsgWriter,
    e: &Expr,
    set_id: &dyn Fn(&str) -> Option<u32>,
) {
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

/// The attributes inside `NFTA_EXPR_DATA`.
fn put_expr_data(w: &mut MsgWriter, e: &Expr, new_set_id: &dyn Fn(&str) -> Option<u32>) {
    match e {
        Expr::Meta { key, dreg } => put_meta(w, *key, NFTA_META_DREG, *dreg),
        Expr::MetaSet { key, sreg } => put_meta(w, *key, NFTA_META_SREG, *sreg),
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => put_payload(w, (*base, *offset, *len), NFTA_PAYLOAD_DREG, *dreg),
        Expr::PayloadSet {
            base,
            offset,
            len,
            sreg,
            csum_type,
            csum_offset,
            csum_flags,
        } => {
            put_payload(w, (*base, *offset, *len), NFTA_PAYLOAD_SREG, *sreg);
            put_payload_csum(w, *csum_type, *csum_offset, *csum_flags);
        }
        Expr::Cmp { sreg, op, data } => put_cmp(w, *sreg, *op, data),
        Expr::Bitwise {
            sreg,
            dreg,
            len,
            mask,
            xor,
        } => put_bitwise(w, (*sreg, *dreg), *len, mask, xor),
        Expr::Range { sreg, op, from, to } => put_range(w, *sreg, *op, from, to),
        Expr::Lookup {
            set,
            set_id,
            sreg,
            dreg,
            invert,
        } => {
            let id = set_id.or_else(|| new_set_id(set));
            put_lookup(w, set, id, (*sreg, *dreg), *invert);
        }
        Expr::ImmediateData { dreg, data } => {
            put_reg(w, NFTA_IMMEDIATE_DREG, *dreg);
            w.put_data_value(NFTA_IMMEDIATE_DATA, data);
        }
        Expr::Verdict(v) => {
            put_reg(w, NFTA_IMMEDIATE_DREG, Reg::VERDICT);
            put_verdict(w, NFTA_IMMEDIATE_DATA, v);
        }
        Expr::Counter { packets, bytes } => put_counter(w, *packets, *bytes),
        Expr::Ct {
            key,
            dreg,
            direction,
        } => put_ct(w, *key, *dreg, *direction),
        Expr::Log {
            prefix,
            level,
            group,
            snaplen,
            flags,
        } => put_log(w, prefix.as_deref(), *level, *group, *snaplen, *flags),
        Expr::Limit {
            rate,
            unit,
            burst,
            kind,
            over,
        } => put_limit(w, (*rate, *unit), *burst, *kind, *over),
        Expr::Reject { kind, code } => put_reject(w, *kind, *code),
        Expr::Nat {
            kind,
            family,
            addr_min,
            addr_max,
            proto_min,
            proto_max,
            flags,
        } => {
            let regs = [*addr_min, *addr_max, *proto_min, *proto_max];
            put_nat(w, *kind, *family, regs, *flags);
        }
        Expr::Masq {
            flags,
            proto_min,
            proto_max,
        } => put_masq(w, *flags, *proto_min, *proto_max),
        Expr::Fib {
            flags,
            result,
            dreg,
        } => put_fib(w, *flags, *result, *dreg),
        Expr::Connlimit { count, flags } => {
            w.put_be32(NFTA_CONNLIMIT_COUNT, *count);
            w.put_be32(NFTA_CONNLIMIT_FLAGS, *flags);
        }
        Expr::Notrack | Expr::Other { .. } => {}
    }
}

/// `meta`: the key, then the register it loads (`reg_ty` DREG) or sets (SREG).
fn put_meta(w: &mut MsgWriter, key: MetaKey, reg_ty: u16, reg: Reg) {
    w.put_be32(NFTA_META_KEY, meta_key_num(key));
    put_reg(w, reg_ty, reg);
}

/// A `payload` load (`reg_ty` DREG) or store (SREG) and where it is: base header, offset,
/// length.
fn put_payload(
    w: &mut MsgWriter,
    (base, offset, len): (PayloadBase, u32, u32),
    reg_ty: u16,
    reg: Reg,
) {
    put_reg(w, reg_ty, reg);
    w.put_be32(NFTA_PAYLOAD_BASE, base_num(base));
    w.put_be32(NFTA_PAYLOAD_OFFSET, offset);
    w.put_be32(NFTA_PAYLOAD_LEN, len);
}

/// The checksum a `payload` store fixes up.
fn put_payload_csum(w: &mut MsgWriter, csum_type: u32, csum_offset: u32, csum_flags: u32) {
    w.put_be32(NFTA_PAYLOAD_CSUM_TYPE, csum_type);
    w.put_be32(NFTA_PAYLOAD_CSUM_OFFSET, csum_offset);
    if csum_flags != 0 {
        w.put_be32(NFTA_PAYLOAD_CSUM_FLAGS, csum_flags);
    }
}

fn put_cmp(w: &mut MsgWriter, sreg: Reg, op: CmpOp, data: &[u8]) {
    put_reg(w, NFTA_CMP_SREG, sreg);
    w.put_be32(NFTA_CMP_OP, cmp_op_num(op));
    w.put_data_value(NFTA_CMP_DATA, data);
}

/// `bitwise` (boolean): `(sreg, dreg)`, length, mask and xor.
fn put_bitwise(w: &mut MsgWriter, (sreg, dreg): (Reg, Reg), len: u32, mask: &[u8], xor: &[u8]) {
    put_reg(w, NFTA_BITWISE_SREG, sreg);
    put_reg(w, NFTA_BITWISE_DREG, dreg);
    // Sent explicitly (nft omits it for flag matches); the kernel dumps it either way.
    w.put_be32(NFTA_BITWISE_OP, NFT_BITWISE_BOOL);
    w.put_be32(NFTA_BITWISE_LEN, len);
    w.put_data_value(NFTA_BITWISE_MASK, mask);
    w.put_data_value(NFTA_BITWISE_XOR, xor);
}

fn put_range(w: &mut MsgWriter, sreg: Reg, op: CmpOp, from: &[u8], to: &[u8]) {
    put_reg(w, NFTA_RANGE_SREG, sreg);
    w.put_be32(NFTA_RANGE_OP, cmp_op_num(op));
    w.put_data_value(NFTA_RANGE_FROM_DATA, from);
    w.put_data_value(NFTA_RANGE_TO_DATA, to);
}

/// `lookup`: `(sreg, dreg)`; a set id names a set created in the same batch.
fn put_lookup(
    w: &mut MsgWriter,
    set: &str,
    set_id: Option<u32>,
    (sreg, dreg): (Reg, Option<Reg>),
    invert: bool,
) {
    put_reg(w, NFTA_LOOKUP_SREG, sreg);
    if let Some(d) = dreg {
        put_reg(w, NFTA_LOOKUP_DREG, d);
    }
    w.put_str(NFTA_LOOKUP_SET, set);
    if let Some(id) = set_id {
        w.put_be32(NFTA_LOOKUP_SET_ID, id);
    }
    if invert {
        w.put_be32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
    }
}

fn put_counter(w: &mut MsgWriter, packets: u64, bytes: u64) {
    // nft sends an empty counter; values only when restoring them.
    if packets != 0 || bytes != 0 {
        w.put_be64(NFTA_COUNTER_BYTES, bytes);
        w.put_be64(NFTA_COUNTER_PACKETS, packets);
    }
}

fn put_ct(w: &mut MsgWriter, key: CtKey, dreg: Reg, direction: Option<u8>) {
    w.put_be32(NFTA_CT_KEY, ct_key_num(key));
    put_reg(w, NFTA_CT_DREG, dreg);
    if let Some(d) = direction {
        w.put_u8(NFTA_CT_DIRECTION, d);
    }
}

fn put_log(
    w: &mut MsgWriter,
    prefix: Option<&str>,
    level: Option<u32>,
    group: Option<u16>,
    snaplen: Option<u32>,
    flags: Option<u32>,
) {
    if let Some(p) = prefix {
        w.put_str(NFTA_LOG_PREFIX, p);
    }
    if let Some(g) = group {
        w.put_be16(NFTA_LOG_GROUP, g);
    }
    if let Some(s) = snaplen {
        w.put_be32(NFTA_LOG_SNAPLEN, s);
    }
    if let Some(l) = level {
        w.put_be32(NFTA_LOG_LEVEL, l);
    }
    if let Some(f) = flags {
        w.put_be32(NFTA_LOG_FLAGS, f);
    }
}

/// `limit`: `(rate, unit)`, burst, what it counts, and whether it matches over the rate.
fn put_limit(w: &mut MsgWriter, (rate, unit): (u64, u64), burst: u32, kind: LimitType, over: bool) {
    w.put_be64(NFTA_LIMIT_RATE, rate);
    w.put_be64(NFTA_LIMIT_UNIT, unit);
    if burst != 0 {
        w.put_be32(NFTA_LIMIT_BURST, burst);
    }
    let ty = match kind {
        LimitType::Packets => NFT_LIMIT_PKTS,
        LimitType::Bytes => NFT_LIMIT_PKT_BYTES,
    };
    w.put_be32(NFTA_LIMIT_TYPE, ty);
    w.put_be32(NFTA_LIMIT_FLAGS, if over { NFT_LIMIT_F_INV } else { 0 });
}

fn put_reject(w: &mut MsgWriter, kind: RejectType, code: u8) {
    let ty = match kind {
        RejectType::IcmpUnreach => 0,
        RejectType::TcpRst => 1,
        RejectType::IcmpxUnreach => 2,
    };
    w.put_be32(NFTA_REJECT_TYPE, ty);
    w.put_u8(NFTA_REJECT_ICMP_CODE, code);
}

/// `nat`: `regs` are the address min and max, then the port min and max registers.
fn put_nat(w: &mut MsgWriter, kind: NatType, family: Family, regs: [Option<Reg>; 4], flags: u32) {
    let ty = match kind {
        NatType::Snat => 0,
        NatType::Dnat => 1,
    };
    w.put_be32(NFTA_NAT_TYPE, ty);
    w.put_be32(NFTA_NAT_FAMILY, family.nfproto() as u32);
    let types = [
        NFTA_NAT_REG_ADDR_MIN,
        NFTA_NAT_REG_ADDR_MAX,
        NFTA_NAT_REG_PROTO_MIN,
        NFTA_NAT_REG_PROTO_MAX,
    ];
    for (ty, r) in types.into_iter().zip(regs) {
        if let Some(r) = r {
            put_reg(w, ty, r);
        }
    }
    if flags != 0 {
        w.put_be32(NFTA_NAT_FLAGS, flags);
    }
}

fn put_masq(w: &mut MsgWriter, flags: u32, proto_min: Option<Reg>, proto_max: Option<Reg>) {
    if flags != 0 {
        w.put_be32(NFTA_MASQ_FLAGS, flags);
    }
    if let Some(r) = proto_min {
        put_reg(w, NFTA_MASQ_REG_PROTO_MIN, r);
    }
    if let Some(r) = proto_max {
        put_reg(w, NFTA_MASQ_REG_PROTO_MAX, r);
    }
}

fn put_fib(w: &mut MsgWriter, flags: u32, result: FibResult, dreg: Reg) {
    w.put_be32(NFTA_FIB_FLAGS, flags);
    let result = match result {
        FibResult::Oif => 1,
        FibResult::OifName => 2,
        FibResult::AddrType => 3,
    };
    w.put_be32(NFTA_FIB_RESULT, result);
    put_reg(w, NFTA_FIB_DREG, dreg);
}
