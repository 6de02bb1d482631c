//! The kernel's numbers for the model's keys and operators (`NFT_META_*`, `NFT_CT_*`,
//! `NFT_CMP_*`, `NFT_PAYLOAD_*_HEADER`), both ways.

use crate::model::{CmpOp, CtKey, MetaKey, PayloadBase};

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

pub(super) fn meta_key_from(n: u32) -> MetaKey {
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

pub(super) fn ct_key_num(k: CtKey) -> u32 {
    match k {
        CtKey::State => 0,
        CtKey::Direction => 1,
        CtKey::Status => 2,
        CtKey::Mark => 3,
        CtKey::Other(n) => n,
    }
}

pub(super) fn ct_key_from(n: u32) -> CtKey {
    match n {
        0 => CtKey::State,
        1 => CtKey::Direction,
        2 => CtKey::Status,
        3 => CtKey::Mark,
        n => CtKey::Other(n),
    }
}

pub(super) fn cmp_op_num(op: CmpOp) -> u32 {
    match op {
        CmpOp::Eq => 0,
        CmpOp::Neq => 1,
        CmpOp::Lt => 2,
        CmpOp::Lte => 3,
        CmpOp::Gt => 4,
        CmpOp::Gte => 5,
    }
}

pub(super) fn cmp_op_from(n: u32) -> Option<CmpOp> {
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

pub(super) fn base_num(b: PayloadBase) -> u32 {
    match b {
        PayloadBase::LinkLayer => 0,
        PayloadBase::Network => 1,
        PayloadBase::Transport => 2,
        PayloadBase::Inner => 3,
    }
}

pub(super) fn base_from(n: u32) -> Option<PayloadBase> {
    Some(match n {
        0 => PayloadBase::LinkLayer,
        1 => PayloadBase::Network,
        2 => PayloadBase::Transport,
        3 => PayloadBase::Inner,
        _ => return None,
    })
}
