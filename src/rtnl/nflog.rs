//! NFLOG over nfnetlink_log: a socket bound to some log groups, and the packets the kernel
//! logs to them, decoded: the group, the prefix, the interfaces, the first bytes of the packet
//! (its headers) and the connection it belongs to. Knows nfnetlink_log, not Calico.
//!
//! Binding a group is `NFULNL_MSG_CONFIG` messages (`res_id` = the group): the bind command,
//! the copy mode (packet, `copy_range` bytes) and the conntrack flag, which makes the kernel add
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

use super::handle::{set_rcvbuf_force, socket_in};
use super::{Result, RtnlError};
use crate::netns::NetNs;
use crate::wire::{attrs, messages_with_seq, nl_request, nlmsg_errno, put_attr, NLMSG_ERROR};
use crate::wire::{NLA_TYPE_MASK, NLM_F_ACK, NLM_F_REQUEST};

const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;

const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_FLAGS: u16 = 6;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULNL_CFG_F_CONNTRACK: u16 = 0x0004;

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

    /// How long [`NflogSocket::recv`] waits before it returns with nothing (`None`: for ever),
    /// so that a reading thread can look up between packets.
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> Result<()> {
        super::handle::set_read_timeout(&self.sock, timeout)
            .map_err(|e| err("setting", "the NFLOG socket's timeout", e))
    }

    /// Waits for the next batch of logged packets and appends them to `out`. Blocking, up to
    /// the read timeout.
    pub fn recv(&mut self, out: &mut Vec<LoggedPacket>) -> Result<Received> {
        let buf = match self.sock.recv_from_full() {
            Ok((buf, _)) => buf,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(Received::Overrun),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Received::Packets(0)),
            Err(e) => return Err(err("reading", "NFLOG packets", e)),
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
    RtnlError::Nfnetlink {
        op,
        object: object.to_string(),
        source,
    }
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
        match ty & NLA_TYPE_MASK {
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
