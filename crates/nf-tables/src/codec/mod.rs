//! The nf_tables netlink codec: our own, pure Rust. Encodes the object model of
//! [`crate::model`] into nfnetlink messages and decodes the kernel's messages (dumps, echoes)
//! back into the same model, so that `decode(encode(x)) == x`.
//!
//! Wire layout of one message (linux/netlink.h, linux/netfilter/nfnetlink.h):
//!
//! ```text
//! +----------+----------+----------+----------+----------------------------+
//! | nlmsghdr (16 bytes: len, type = SUBSYS<<8|MSG, flags, seq, pid)        |
//! +----------+----------+----------+----------+----------------------------+
//! | nfgenmsg: family u8 | version u8 | res_id be16                          |
//! +-----------------------------------------------------------------------+
//! | attributes: len u16 | type u16 (NESTED 0x8000) | value, padded to 4     |
//! +-----------------------------------------------------------------------+
//! ```
//!
//! Integer attributes are big-endian; register data is kept exactly as the kernel holds it
//! (host order for most, network order for addresses). This module knows netlink, not Calico, and does no I/O.

pub mod attr;
mod expr;
mod object;

pub use attr::{Attr, Attrs, MsgWriter};
pub use expr::{decode_expr, expr_name, put_expr};

/// `NFT_META_*` number of a meta key (for printers).
pub fn meta_key_num_pub(k: crate::model::MetaKey) -> u32 {
    expr::meta_key_num(k)
}
pub use object::{
    decode_elems_into, decode_message, decode_rule_ref, elem_size_hint, encode_object, key_type_of,
    put_chain, put_chain_ref, put_elems, put_rule, put_rule_chain_ref, put_rule_ref,
    put_rule_reusing, put_set, put_set_ref, put_table, put_table_ref, set_udata, ChainMsg,
    ElemsMsg, ElemsOf, ElemsRef, Object, RuleMsg, RuleRef, SetMsg, TableMsg,
};

/// Errors of encoding or decoding nf_tables messages.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// A message or attribute ended before its declared length.
    #[error("truncated {what}")]
    Truncated {
        /// What was being read ("attribute", "nfgenmsg").
        what: &'static str,
    },
    /// A required attribute is absent.
    #[error("{what}: missing attribute {attr}")]
    Missing {
        /// The object being decoded ("table", "rule", "set element", ...).
        what: &'static str,
        /// The absent attribute's type (`NFTA_*`).
        attr: u16,
    },
    /// An attribute has a length its type does not allow.
    #[error("{what}: attribute {attr} has bad length {len}")]
    BadLength {
        /// The object being decoded.
        what: &'static str,
        /// The attribute's type (`NFTA_*`, flags masked off).
        attr: u16,
        /// Its payload length in bytes.
        len: usize,
    },
    /// A string attribute is not UTF-8.
    #[error("{what}: attribute {attr} is not UTF-8")]
    Utf8 {
        /// The object being decoded.
        what: &'static str,
        /// The attribute's type (`NFTA_*`).
        attr: u16,
    },
    /// `nfgenmsg.nfgen_family` is not a family we model.
    #[error("unknown nfproto family {0}")]
    UnknownFamily(u8),
    /// A message type this decoder does not handle.
    #[error("unexpected nf_tables message type {0}")]
    UnexpectedType(u16),
    /// An attribute would exceed 64 KiB (`nla_len` is a u16).
    #[error("{what} is {len} bytes, over the 64 KiB netlink attribute limit")]
    TooLarge {
        /// The attribute ("attribute 4"), by its type number.
        what: String,
        /// The length it would have had, header included.
        len: usize,
    },
    /// A value the kernel would refuse (e.g. a rule comment over 253 bytes).
    #[error("{0}")]
    Invalid(String),
}
