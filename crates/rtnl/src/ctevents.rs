//! Conntrack events over ctnetlink: a socket subscribed to the new, update and destroy groups,
//! and each entry they carry decoded: its original and reply tuples (the reply differs from the
//! original under NAT), its id, status and mark, and its packet and byte counters. The same
//! decoder reads the connection an NFLOG packet carries (`NFULA_CT`). Knows ctnetlink, not
//! Calico.
//!
//! Counters are in the events only where `net.netfilter.nf_conntrack_acct` is 1 in the
//! namespace; a destroy event carries the connection's final counts. The socket is a plain
//! blocking `NETLINK_NETFILTER` socket made in the target namespace; read it from a thread of its
//! own. A reader that falls behind loses events, and the next read says so
//! ([`Received::Overrun`]).
//!
//! ```text
//!  nlmsghdr {type = CTNETLINK << 8 | CT_NEW (new, update) or CT_DELETE (destroy)}
//!  nfgenmsg {family, version 0, res_id 0}
//!  CTA_TUPLE_ORIG { CTA_TUPLE_IP { V4_SRC, V4_DST | V6_SRC, V6_DST },
//!                   CTA_TUPLE_PROTO { PROTO_NUM u8, SRC_PORT be16, DST_PORT be16 } }
//!  CTA_TUPLE_REPLY { … }  CTA_STATUS be32  CTA_MARK be32  CTA_ID be32
//!  CTA_COUNTERS_ORIG { PACKETS be64, BYTES be64 }  CTA_COUNTERS_REPLY { … }
//! ```

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::handle::{recv_datagram, set_rcvbuf_force, socket_in, Datagram};
use super::nflog::Received;
use super::{Result, RtnlError};
use crate::netns::NetNs;
use netlink_wire::{attrs, messages};

pub(super) const NFNL_SUBSYS_CTNETLINK: u16 = 1;
pub(super) const IPCTNL_MSG_CT_NEW: u16 = 0;
pub(super) const IPCTNL_MSG_CT_DELETE: u16 = 2;
/// `NLM_F_CREATE`: a new-entry message is a creation, not an update.
const NLM_F_CREATE: u16 = 0x400;

const NFNLGRP_CONNTRACK_NEW: u32 = 1;
const NFNLGRP_CONNTRACK_UPDATE: u32 = 2;
const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;

pub(super) const CTA_TUPLE_ORIG: u16 = 1;
pub(super) const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_MARK: u16 = 8;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_ID: u16 = 12;

pub(super) const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
pub(super) const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
pub(super) const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;

pub(super) const NFGENMSG_LEN: usize = 4;

/// One direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtTuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IP protocol number.
    pub proto: u8,
    /// Ports (0 for protocols without them).
    pub sport: u16,
    pub dport: u16,
}

/// Packets and bytes of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtCounters {
    pub packets: u64,
    pub bytes: u64,
}

/// A connection as ctnetlink describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CtEntry {
    pub orig: Option<CtTuple>,
    pub reply: Option<CtTuple>,
    pub id: Option<u32>,
    /// `IPS_*` bits (`IPS_SEEN_REPLY` = 2, `IPS_ASSURED` = 4, `IPS_SRC_NAT` = 16, …).
    pub status: Option<u32>,
    pub mark: Option<u32>,
    /// Present where accounting is on.
    pub counters_orig: Option<CtCounters>,
    pub counters_reply: Option<CtCounters>,
}

/// What happened to a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtEvent {
    New(CtEntry),
    Update(CtEntry),
    Destroy(CtEntry),
}

impl CtEvent {
    /// The connection the event is about.
    pub fn entry(&self) -> &CtEntry {
        match self {
            CtEvent::New(e) | CtEvent::Update(e) | CtEvent::Destroy(e) => e,
        }
    }
}

fn be16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?))
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

fn be64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

/// A `CTA_IP_*` value.
pub(super) fn addr(v: &[u8]) -> Option<IpAddr> {
    match v.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(v).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(v).ok()?))),
        _ => None,
    }
}

/// A `CTA_TUPLE_*` value.
fn tuple(v: &[u8]) -> Option<CtTuple> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, 0, 0);
    for (ty, a) in attrs(v) {
        match ty {
            CTA_TUPLE_IP => {
                for (t, ip) in attrs(a) {
                    match t {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = addr(ip),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = addr(ip),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (t, p) in attrs(a) {
                    match t {
                        CTA_PROTO_NUM => proto = p.first().copied(),
                        CTA_PROTO_SRC_PORT => sport = be16(p).unwrap_or(0),
                        CTA_PROTO_DST_PORT => dport = be16(p).unwrap_or(0),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(CtTuple {
        src: src?,
        dst: dst?,
        proto: proto?,
        sport,
        dport,
    })
}

fn counters(v: &[u8]) -> CtCounters {
    let mut c = CtCounters::default();
    for (ty, a) in attrs(v) {
        match ty {
            CTA_COUNTERS_PACKETS => c.packets = be64(a).unwrap_or(0),
            CTA_COUNTERS_BYTES => c.bytes = be64(a).unwrap_or(0),
            _ => {}
        }
    }
    c
}

/// A connection's ctnetlink attributes (after the `nfgenmsg`, or an NFLOG packet's `NFULA_CT`).
pub fn decode_entry(v: &[u8]) -> CtEntry {
    let mut e = CtEntry::default();
    for (ty, a) in attrs(v) {
        match ty {
            CTA_TUPLE_ORIG => e.orig = tuple(a),
            CTA_TUPLE_REPLY => e.reply = tuple(a),
            CTA_STATUS => e.status = be32(a),
            CTA_MARK => e.mark = be32(a),
            CTA_ID => e.id = be32(a),
            CTA_COUNTERS_ORIG => e.counters_orig = Some(counters(a)),
            CTA_COUNTERS_REPLY => e.counters_reply = Some(counters(a)),
            _ => {}
        }
    }
    e
}

/// Which events to follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtGroups {
    pub new: bool,
    pub update: bool,
    pub destroy: bool,
}

/// A socket subscribed to conntrack events in one namespace.
#[derive(Debug)]
pub struct CtEventSocket {
    sock: Socket,
}

impl CtEventSocket {
    /// Subscribes in `ns` (the current namespace with `None`) to `groups`, with `rcvbuf` bytes
    /// of receive buffer (forced past `rmem_max` where the process may).
    pub fn open(ns: Option<&NetNs>, groups: CtGroups, rcvbuf: usize) -> Result<CtEventSocket> {
        let mut sock = socket_in(ns, NETLINK_NETFILTER)?;
        let mask = [
            (groups.new, NFNLGRP_CONNTRACK_NEW),
            (groups.update, NFNLGRP_CONNTRACK_UPDATE),
            (groups.destroy, NFNLGRP_CONNTRACK_DESTROY),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .fold(0u32, |m, (_, g)| m | 1 << (g - 1));
        sock.bind(&SocketAddr::new(0, mask))
            .map_err(|e| err("subscribing to", "conntrack events", e))?;
        set_rcvbuf_force(&sock, rcvbuf)
            .map_err(|e| err("sizing", "the conntrack event socket's buffer", e))?;
        Ok(CtEventSocket { sock })
    }

    /// With `on`, [`CtEventSocket::recv`] returns at once with nothing when no batch is queued,
    /// instead of waiting: for a reader that drains what has queued up after a wait.
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.sock
            .set_non_blocking(on)
            .map_err(|e| err("setting", "the conntrack event socket's blocking mode", e))
    }

    /// How long [`CtEventSocket::recv`] waits before it returns with nothing (`None`: for
    /// ever).
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> Result<()> {
        super::handle::set_read_timeout(&self.sock, timeout)
            .map_err(|e| err("setting", "the conntrack event socket's timeout", e))
    }

    /// Waits for the next batch of events and appends them to `out`. Blocking, up to the read
    /// timeout.
    pub fn recv(&mut self, out: &mut Vec<CtEvent>) -> Result<Received> {
        let read = recv_datagram(&self.sock).map_err(|e| err("reading", "conntrack events", e))?;
        let buf = match read {
            Datagram::Bytes(buf) => buf,
            Datagram::Overrun => return Ok(Received::Overrun),
            Datagram::TimedOut => return Ok(Received::Packets(0)),
        };
        let before = out.len();
        for m in messages(&buf) {
            let Some(body) = m.payload.get(NFGENMSG_LEN..) else {
                continue;
            };
            let entry = decode_entry(body);
            out.push(match m.ty {
                t if t == NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW => {
                    if m.flags & NLM_F_CREATE != 0 {
                        CtEvent::New(entry)
                    } else {
                        CtEvent::Update(entry)
                    }
                }
                t if t == NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE => {
                    CtEvent::Destroy(entry)
                }
                _ => continue,
            });
        }
        Ok(Received::Packets(out.len() - before))
    }
}

fn err(op: &'static str, object: &str, source: io::Error) -> RtnlError {
    RtnlError::nfnetlink(op, object, source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_wire::{put_attr, NLA_F_NESTED};

    fn nested(ty: u16, inner: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        put_attr(&mut v, ty | NLA_F_NESTED, inner);
        v
    }

    fn tuple_attrs(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut ip = Vec::new();
        put_attr(&mut ip, CTA_IP_V4_SRC, &src);
        put_attr(&mut ip, CTA_IP_V4_DST, &dst);
        let mut proto = Vec::new();
        put_attr(&mut proto, CTA_PROTO_NUM, &[6]);
        put_attr(&mut proto, CTA_PROTO_SRC_PORT, &sport.to_be_bytes());
        put_attr(&mut proto, CTA_PROTO_DST_PORT, &dport.to_be_bytes());
        let mut t = nested(CTA_TUPLE_IP, &ip);
        t.extend(nested(CTA_TUPLE_PROTO, &proto));
        t
    }

    /// A NATed connection: the reply tuple names the translated address; counters per
    /// direction.
    #[test]
    fn entries_decode_with_both_tuples_and_counters() {
        let mut v = nested(
            CTA_TUPLE_ORIG,
            &tuple_attrs([10, 65, 0, 2], [10, 96, 0, 10], 40000, 80),
        );
        v.extend(nested(
            CTA_TUPLE_REPLY,
            &tuple_attrs([10, 65, 1, 7], [10, 65, 0, 2], 8080, 40000),
        ));
        put_attr(&mut v, CTA_ID, &77u32.to_be_bytes());
        let mut c = Vec::new();
        put_attr(&mut c, CTA_COUNTERS_PACKETS, &3u64.to_be_bytes());
        put_attr(&mut c, CTA_COUNTERS_BYTES, &180u64.to_be_bytes());
        v.extend(nested(CTA_COUNTERS_ORIG, &c));
        let e = decode_entry(&v);
        let orig = e.orig.expect("the original tuple");
        assert_eq!(orig.dst, "10.96.0.10".parse::<IpAddr>().unwrap());
        assert_eq!((orig.proto, orig.sport, orig.dport), (6, 40000, 80));
        let reply = e.reply.expect("the reply tuple");
        assert_eq!(reply.src, "10.65.1.7".parse::<IpAddr>().unwrap());
        assert_eq!(e.id, Some(77));
        assert_eq!(
            e.counters_orig,
            Some(CtCounters {
                packets: 3,
                bytes: 180
            })
        );
        assert_eq!(e.counters_reply, None);
        assert_eq!(decode_entry(&[1, 2, 3]), CtEntry::default());
    }
}
