//! Netlink framing shared by the nf_tables codec and the rtnetlink code: the header and flag
//! constants of `linux/netlink.h`, a request's header, the messages of a datagram, an answer's
//! errno, and attribute runs. Uses nothing else in the crate.
// A `pub` item no other crate can reach is `pub(crate)` or narrower: the public surface says
// what the crates above use.
#![warn(unreachable_pub)]

// linux/netlink.h
/// `struct nlmsghdr`'s size.
pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_ECHO: u16 = 0x8;
pub const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_ROOT: u16 = 0x100;
pub const NLM_F_MATCH: u16 = 0x200;
pub const NLM_F_DUMP: u16 = NLM_F_ROOT | NLM_F_MATCH;
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
/// In an NLMSG_ERROR: the error message carries extended-ACK TLVs.
pub const NLM_F_ACK_TLVS: u16 = 0x200;
/// In an NLMSG_ERROR: the original request is truncated to its header (NETLINK_CAP_ACK).
pub const NLM_F_CAPPED: u16 = 0x100;
pub const NLMSGERR_ATTR_MSG: u16 = 1;
pub const NLMSGERR_ATTR_OFFS: u16 = 2;
pub const NLA_F_NESTED: u16 = 0x8000;
pub const NLA_F_NET_BYTEORDER: u16 = 0x4000;
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

/// One netlink request: `struct nlmsghdr` (port id 0: the kernel) followed by `parts`.
pub fn nl_request(ty: u16, flags: u16, seq: u32, parts: &[&[u8]]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    for p in parts {
        msg.extend_from_slice(p);
    }
    msg
}

/// The messages of one netlink datagram: (type, payload, sequence number). Stops at the first
/// malformed header.
pub fn messages_with_seq(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8], u32)> {
    messages(buf).map(|m| (m.ty, m.payload, m.seq))
}

/// One netlink message's header fields and payload.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// The messages of one netlink datagram. Stops at the first malformed header.
pub fn messages(mut buf: &[u8]) -> impl Iterator<Item = Message<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let m = Message {
            ty: u16::from_ne_bytes(buf[4..6].try_into().ok()?),
            flags: u16::from_ne_bytes(buf[6..8].try_into().ok()?),
            seq: u32::from_ne_bytes(buf[8..12].try_into().ok()?),
            payload: &buf[NLMSG_HDRLEN..len],
        };
        buf = &buf[((len + 3) & !3).min(buf.len())..];
        Some(m)
    })
}

/// `nlmsgerr.error` as a positive errno, `None` for an ACK (0).
pub fn nlmsg_errno(payload: &[u8]) -> Option<i32> {
    let code = i32::from_ne_bytes(payload.get(0..4)?.try_into().ok()?);
    (code != 0).then_some(-code)
}

/// Iterates (type without flags, value) over a run of netlink attributes.
pub fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let value = &buf[4..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((ty, value))
    })
}

pub fn align4(n: usize) -> usize {
    (n + 3) & !3
}

pub fn put_attr(out: &mut Vec<u8>, ty: u16, value: &[u8]) {
    out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(align4(out.len()), 0);
}
