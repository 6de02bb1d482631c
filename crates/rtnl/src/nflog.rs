//! NFLOG over nfnetlink_log: a socket bound to some log groups, and the packets the kernel
//! logs to them, decoded: the group, the prefix, the interfaces, the first bytes of the packet
//! (its headers) and the connection it belongs to. Knows nfnetlink_log, not Calico.
//!
//! Binding a group is `NFULNL_MSG_CONFIG` messages (`res_id` = the group): the bind command,
//! the copy mode (packet, `copy_range` bytes), a flush timeout of 100 ms (the kernel batches a
//! group's packets until then, or until 100 have come) and the conntrack flag, which makes the kernel add
//! the entry's tuples (`NFULA_CT`, ctnetlink attributes) and state. A kernel built without
//! `NETFILTER_NETLINK_GLUE_CT` refuses the flag (EOPNOTSUPP): the groups are bound without it
//! and [`NflogSocket::with_conntrack`] says so. A group has one listener per namespace: binding
//! one that another socket holds is refused (EBUSY).
//!
//! The socket is a plain blocking `NETLINK_NETFILTER` socket made in the target namespace; read
//! it from a thread of its own. When the reader falls behind, the kernel drops messages and the
//! next read says so ([`Received::Overrun`]): the count is the caller's to keep.
//!
//! ```text
//!  nlmsghdr (16) | nfgenmsg {family u8, version u8 = 0, res_id be16 = group} | attributes...
//!  NFULA_PACKET_HDR {hw_protocol be16, hook u8, pad u8}   NFULA_PREFIX "…\0"
//!  NFULA_IFINDEX_INDEV be32   NFULA_IFINDEX_OUTDEV be32   NFULA_PAYLOAD bytes
//!  NFULA_CT { CTA_TUPLE_ORIG {…}, CTA_TUPLE_REPLY {…}, CTA_ID, … }   NFULA_CT_INFO be32
//! ```

use std::io;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::handle::{recv_datagram, set_rcvbuf_force, socket_in, Datagram};
use super::{Result, RtnlError};
use crate::netns::NetNs;
use netlink_wire::{attrs, messages_with_seq, nl_request, nlmsg_errno, put_attr, NLMSG_ERROR};
use netlink_wire::{NLM_F_ACK, NLM_F_REQUEST};

const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;

const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULA_CFG_FLAGS: u16 = 6;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULNL_CFG_F_CONNTRACK: u16 = 0x0004;
/// How long the kernel may hold logged packets before it sends them, in hundredths of a
/// second: its default (1 s, or 100 packets) would delay a quiet group's packets by a second.
const FLUSH_TIMEOUT: u32 = 10;

const NFULA_PACKET_HDR: u16 = 1;
const NFULA_MARK: u16 = 2;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_IFINDEX_OUTDEV: u16 = 5;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFULA_CT: u16 = 18;
const NFULA_CT_INFO: u16 = 19;

const NFGENMSG_LEN: usize = 4;

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedPacket {
    /// The log group it was sent to.
    pub group: u16,
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// The rule's prefix (without its NUL).
    pub prefix: Vec<u8>,
    /// The netfilter hook it was logged in.
    pub hook: u8,
    /// The interface it came in on, or is leaving by (index).
    pub indev: Option<u32>,
    pub outdev: Option<u32>,
    pub mark: Option<u32>,
    /// The first bytes of the packet, from its network header.
    pub payload: Vec<u8>,
    /// The connection's ctnetlink attributes (`CTA_TUPLE_ORIG`, `CTA_TUPLE_REPLY`, …), when the
    /// packet has one.
    pub ct: Option<Vec<u8>>,
    /// The packet's conntrack state (`IP_CT_NEW` = 2, `IP_CT_ESTABLISHED` = 0, …).
    pub ct_info: Option<u32>,
}

/// The addresses, protocol and ports of a packet, read from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FiveTuple {
    pub src: std::net::IpAddr,
    pub dst: std::net::IpAddr,
    /// IP protocol number (for IPv6, of the header after the extension headers skipped).
    pub proto: u8,
    /// Ports for TCP, UDP, UDP-Lite, SCTP and DCCP; for ICMP and ICMPv6, type and code in
    /// `sport` and the echo id in `dport` (0 for other messages); 0 otherwise.
    pub sport: u16,
    pub dport: u16,
}

impl LoggedPacket {
    /// The packet's five-tuple, from the copied headers; `None` when they are cut short or are
    /// not IPv4 or IPv6.
    pub fn five_tuple(&self) -> Option<FiveTuple> {
        five_tuple(&self.payload)
    }
}

/// Reads the five-tuple from a packet starting at its network header.
pub fn five_tuple(p: &[u8]) -> Option<FiveTuple> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let (src, dst, mut proto, mut l4) = match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p.first()? & 0x0f) * 4;
            let frag = u16::from_be_bytes([*p.get(6)?, *p.get(7)?]) & 0x1fff;
            let src = IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(p.get(12..16)?).ok()?));
            let dst = IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(p.get(16..20)?).ok()?));
            // A later fragment has no transport header.
            let l4 = if frag == 0 { p.get(ihl..)? } else { &[][..] };
            (src, dst, *p.get(9)?, l4)
        }
        6 => {
            let src = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(p.get(8..24)?).ok()?));
            let dst = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(p.get(24..40)?).ok()?));
            (src, dst, *p.get(6)?, p.get(40..)?)
        }
        _ => return None,
    };
    // IPv6 extension headers: hop-by-hop, routing, destination options (8-byte units after
    // the first 8), fragment (8 bytes; a later fragment has no transport header).
    if src.is_ipv6() {
        for _ in 0..8 {
            match proto {
                0 | 43 | 60 => {
                    let len = (usize::from(*l4.get(1)?) + 1) * 8;
                    proto = *l4.first()?;
                    l4 = l4.get(len..)?;
                }
                44 => {
                    let offset = u16::from_be_bytes([*l4.get(2)?, *l4.get(3)?]) >> 3;
                    proto = *l4.first()?;
                    l4 = if offset == 0 { l4.get(8..)? } else { &[][..] };
                }
                _ => break,
            }
        }
    }
    let port = |at: usize| Some(u16::from_be_bytes([*l4.get(at)?, *l4.get(at + 1)?]));
    let (sport, dport) = match proto {
        6 | 17 | 33 | 132 | 136 => (port(0).unwrap_or(0), port(2).unwrap_or(0)),
        1 | 58 => {
            let (ty, code) = (l4.first().copied(), l4.get(1).copied());
            let echo = matches!((proto, ty), (1, Some(0 | 8)) | (58, Some(128 | 129)));
            let id = if echo { port(4).unwrap_or(0) } else { 0 };
            (u16::from_be_bytes([ty.unwrap_or(0), code.unwrap_or(0)]), id)
        }
        _ => (0, 0),
    };
    Some(FiveTuple {
        src,
        dst,
        proto,
        sport,
        dport,
    })
}

/// What one read brought.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// This many packets were appended.
    Packets(usize),
    /// The kernel dropped messages since the last read (the socket's buffer was full).
    Overrun,
}

/// A socket bound to NFLOG groups in one namespace.
#[derive(Debug)]
pub struct NflogSocket {
    sock: Socket,
    seq: u32,
    conntrack: bool,
}

impl NflogSocket {
    /// Binds `groups` in `ns` (the current namespace with `None`), copying the first
    /// `copy_range` bytes of each packet and its connection; `rcvbuf` bytes of receive buffer
    /// (forced past `rmem_max` where the process may).
    pub fn open(
        ns: Option<&NetNs>,
        groups: &[u16],
        copy_range: u32,
        rcvbuf: usize,
    ) -> Result<NflogSocket> {
        let mut sock = socket_in(ns, NETLINK_NETFILTER)?;
        sock.bind_auto()
            .map_err(|e| err("binding", "the NFLOG socket", e))?;
        set_rcvbuf_force(&sock, rcvbuf)
            .map_err(|e| err("sizing", "the NFLOG socket's buffer", e))?;
        let mut s = NflogSocket {
            sock,
            seq: 0,
            conntrack: true,
        };
        for &g in groups {
            s.bind_group(g, copy_range)?;
        }
        Ok(s)
    }

    /// Whether logged packets carry their connection (the kernel has the conntrack glue).
    pub fn with_conntrack(&self) -> bool {
        self.conntrack
    }

    fn bind_group(&mut self, group: u16, copy_range: u32) -> Result<()> {
        let what = format!("NFLOG group {group}");
        let mut a = Vec::new();
        put_attr(&mut a, NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]);
        self.config(group, &a, &what)?;
        let mut a = Vec::new();
        let mut mode = copy_range.to_be_bytes().to_vec();
        mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
        put_attr(&mut a, NFULA_CFG_MODE, &mode);
        put_attr(&mut a, NFULA_CFG_TIMEOUT, &FLUSH_TIMEOUT.to_be_bytes());
        self.config(group, &a, &what)?;
        if !self.conntrack {
            return Ok(());
        }
        let mut a = Vec::new();
        put_attr(
            &mut a,
            NFULA_CFG_FLAGS,
            &NFULNL_CFG_F_CONNTRACK.to_be_bytes(),
        );
        match self.config(group, &a, &what) {
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => {
                self.conntrack = false;
                Ok(())
            }
            r => r,
        }
    }

    /// One config message for `group`, acknowledged.
    fn config(&mut self, group: u16, attrs: &[u8], what: &str) -> Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let g = group.to_be_bytes();
        let nfgenmsg = [libc::AF_UNSPEC as u8, 0, g[0], g[1]];
        let msg = nl_request(
            NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_CONFIG,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            &[&nfgenmsg, attrs],
        );
        self.sock
            .send_to(&msg, &SocketAddr::new(0, 0), 0)
            .map_err(|e| err("configuring", what, e))?;
        loop {
            let (buf, _) = self
                .sock
                .recv_from_full()
                .map_err(|e| err("configuring", what, e))?;
            for (ty, payload, msg_seq) in messages_with_seq(&buf) {
                if ty == NLMSG_ERROR && msg_seq == seq {
                    return match nlmsg_errno(payload).unwrap_or(0) {
                        0 => Ok(()),
                        errno => Err(err("binding", what, io::Error::from_raw_os_error(errno))),
                    };
                }
            }
        }
    }

    /// With `on`, [`NflogSocket::recv`] returns at once with nothing when no batch is queued,
    /// instead of waiting: for a reader that drains what has queued up after a wait.
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.sock
            .set_non_blocking(on)
            .map_err(|e| err("setting", "the NFLOG socket's blocking mode", e))
    }

    /// How long [`NflogSocket::recv`] waits before it returns with nothing (`None`: for ever),
    /// so that a reading thread can look up between packets.
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> Result<()> {
        super::handle::set_read_timeout(&self.sock, timeout)
            .map_err(|e| err("setting", "the NFLOG socket's timeout", e))
    }

    /// Waits for the next batch of logged packets and appends them to `out`. Blocking, up to
    /// the read timeout.
    pub fn recv(&mut self, out: &mut Vec<LoggedPacket>) -> Result<Received> {
        let read = recv_datagram(&self.sock).map_err(|e| err("reading", "NFLOG packets", e))?;
        let buf = match read {
            Datagram::Bytes(buf) => buf,
            Datagram::Overrun => return Ok(Received::Overrun),
            Datagram::TimedOut => return Ok(Received::Packets(0)),
        };
        let before = out.len();
        for (ty, payload, _) in messages_with_seq(&buf) {
            if ty == NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_PACKET {
                if let Some(p) = decode(payload) {
                    out.push(p);
                }
            }
        }
        Ok(Received::Packets(out.len() - before))
    }
}

fn err(op: &'static str, object: &str, source: io::Error) -> RtnlError {
    RtnlError::nfnetlink(op, object, source)
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// One `NFULNL_MSG_PACKET` (after its netlink header); `None` when it is too short to be one.
fn decode(payload: &[u8]) -> Option<LoggedPacket> {
    let nfgen = payload.get(..NFGENMSG_LEN)?;
    let mut p = LoggedPacket {
        group: u16::from_be_bytes([nfgen[2], nfgen[3]]),
        family: nfgen[0],
        prefix: Vec::new(),
        hook: 0,
        indev: None,
        outdev: None,
        mark: None,
        payload: Vec::new(),
        ct: None,
        ct_info: None,
    };
    for (ty, v) in attrs(&payload[NFGENMSG_LEN..]) {
        match ty {
            NFULA_PACKET_HDR => p.hook = *v.get(2)?,
            NFULA_MARK => p.mark = be32(v),
            NFULA_IFINDEX_INDEV => p.indev = be32(v),
            NFULA_IFINDEX_OUTDEV => p.outdev = be32(v),
            NFULA_PAYLOAD => p.payload = v.to_vec(),
            NFULA_PREFIX => {
                let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
                p.prefix = v[..end].to_vec();
            }
            NFULA_CT => p.ct = Some(v.to_vec()),
            NFULA_CT_INFO => p.ct_info = be32(v),
            _ => {}
        }
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv4 UDP and ICMP echo, IPv6 TCP behind a hop-by-hop header, a later IPv4 fragment,
    /// and headers cut short.
    #[test]
    fn five_tuples_come_from_the_headers() {
        let v4 = |proto: u8, frag: u16, l4: &[u8]| {
            let mut p = vec![0x45, 0, 0, 0, 0, 0];
            p.extend_from_slice(&frag.to_be_bytes());
            p.extend_from_slice(&[64, proto, 0, 0, 10, 65, 0, 2, 10, 65, 1, 7]);
            p.extend_from_slice(l4);
            p
        };
        let t = five_tuple(&v4(17, 0, &[0x9c, 0x40, 0x00, 0x35])).expect("UDP");
        assert_eq!(t.src, "10.65.0.2".parse::<std::net::IpAddr>().unwrap());
        assert_eq!((t.proto, t.sport, t.dport), (17, 40000, 53));
        let t = five_tuple(&v4(1, 0, &[8, 0, 0, 0, 0x12, 0x34])).expect("ICMP");
        assert_eq!((t.proto, t.sport, t.dport), (1, 0x0800, 0x1234));
        let t = five_tuple(&v4(6, 0x00b9, &[0x9c, 0x40])).expect("a later fragment");
        assert_eq!((t.sport, t.dport), (0, 0));
        let mut v6 = vec![0x60, 0, 0, 0, 0, 0, 0, 64];
        v6.extend_from_slice(&[0xfd; 16]);
        v6.extend_from_slice(&[0xfe; 16]);
        v6.extend_from_slice(&[6, 0, 0, 0, 0, 0, 0, 0]);
        v6.extend_from_slice(&[0x1f, 0x90, 0x01, 0xbb]);
        let t = five_tuple(&v6).expect("TCP over IPv6");
        assert_eq!((t.proto, t.sport, t.dport), (6, 8080, 443));
        assert!(five_tuple(&v6[..30]).is_none());
        assert!(five_tuple(&[0x45, 0, 0]).is_none());
        assert!(five_tuple(&[]).is_none());
    }

    #[test]
    fn a_packet_message_decodes() {
        let mut a = Vec::new();
        put_attr(&mut a, NFULA_PACKET_HDR, &[0x08, 0x00, 3, 0]);
        put_attr(&mut a, NFULA_PREFIX, b"API0|np/ns/web\0");
        put_attr(&mut a, NFULA_IFINDEX_OUTDEV, &7u32.to_be_bytes());
        put_attr(&mut a, NFULA_PAYLOAD, &[0x45, 0, 0, 28]);
        put_attr(&mut a, NFULA_CT_INFO, &2u32.to_be_bytes());
        let mut msg = vec![libc::AF_INET as u8, 0, 0, 2];
        msg.extend_from_slice(&a);
        let p = decode(&msg).expect("a packet");
        assert_eq!(p.group, 2);
        assert_eq!(p.family, libc::AF_INET as u8);
        assert_eq!(p.prefix, b"API0|np/ns/web");
        assert_eq!((p.hook, p.indev, p.outdev), (3, None, Some(7)));
        assert_eq!(p.payload, [0x45, 0, 0, 28]);
        assert_eq!((p.ct, p.ct_info), (None, Some(2)));
        assert!(decode(&[2, 0]).is_none());
    }
}
