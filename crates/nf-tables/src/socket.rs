//! The blocking `NETLINK_NETFILTER` socket (on `netlink-sys`) and reply parsing.
//!
//! One long-lived socket per agent: closing one after deletions blocks 10–45 ms, and an owned
//! table belongs to the socket that created it.
//! A batch is processed by the kernel inside `sendmsg`, so every reply is queued when `send`
//! returns; we then drain with `MSG_DONTWAIT` (gotcha 3, §4 "Done detection").

use std::io;
use std::os::fd::AsRawFd;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::consts::*;
use super::error::NftError;

/// One reply message from the kernel.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `nlmsg_type`: `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_*`, or `NLMSG_ERROR` / `NLMSG_DONE`.
    pub ty: u16,
    /// `nlmsg_flags` (`NLM_F_MULTI`, `NLM_F_DUMP_INTR`, `NLM_F_ACK_TLVS`, ...).
    pub flags: u16,
    /// `nlmsg_seq`: the sequence number of the request it answers.
    pub seq: u32,
    /// Everything after the 16-byte nlmsghdr.
    pub payload: Vec<u8>,
}

/// A decoded `NLMSG_ERROR`: errno 0 is an ACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// Sequence number of the message it answers.
    pub seq: u32,
    /// Positive errno; 0 for an ACK.
    pub errno: i32,
    /// The kernel's extended-ACK text (`NLMSGERR_ATTR_MSG`).
    pub ext_ack: Option<String>,
    /// Byte offset of the offending attribute in the request (`NLMSGERR_ATTR_OFFS`).
    pub attr_offset: Option<u32>,
}

impl Reply {
    /// Parses an `NLMSG_ERROR` payload: `struct nlmsgerr` + extended-ACK TLVs.
    pub fn as_error(&self) -> Option<ErrorReply> {
        self.borrow().as_error()
    }

    /// The same message, borrowed.
    pub fn borrow(&self) -> Msg<'_> {
        Msg {
            ty: self.ty,
            flags: self.flags,
            seq: self.seq,
            payload: &self.payload,
        }
    }
}

/// One reply message borrowed from the receive buffer: dumps decode from here without copying.
#[derive(Debug, Clone, Copy)]
pub struct Msg<'a> {
    /// `nlmsg_type`: `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_*`, or `NLMSG_ERROR` / `NLMSG_DONE`.
    pub ty: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`: the sequence number of the request it answers.
    pub seq: u32,
    /// Everything after the 16-byte nlmsghdr.
    pub payload: &'a [u8],
}

impl Msg<'_> {
    /// Parses an `NLMSG_ERROR` payload: `struct nlmsgerr` + extended-ACK TLVs.
    pub fn as_error(&self) -> Option<ErrorReply> {
        if self.ty != NLMSG_ERROR || self.payload.len() < 4 {
            return None;
        }
        let err = i32::from_ne_bytes(self.payload[..4].try_into().ok()?);
        // The echoed request header: its seq is the message this answers.
        let hdr = self.payload.get(4..20)?;
        let seq = u32::from_ne_bytes(hdr[8..12].try_into().ok()?);
        let mut out = ErrorReply {
            seq,
            errno: -err,
            ext_ack: None,
            attr_offset: None,
        };
        if self.flags & NLM_F_ACK_TLVS != 0 {
            let orig_len = u32::from_ne_bytes(hdr[0..4].try_into().ok()?) as usize;
            // With NETLINK_CAP_ACK the request is capped to its header.
            let skip = if self.flags & NLM_F_CAPPED != 0 {
                16
            } else {
                orig_len.div_ceil(4) * 4
            };
            if let Some(tlvs) = self.payload.get(4 + skip..) {
                for a in super::codec::Attrs::new(tlvs).flatten() {
                    match a.ty {
                        NLMSGERR_ATTR_MSG => out.ext_ack = a.str("extack").ok(),
                        NLMSGERR_ATTR_OFFS => {
                            out.attr_offset = a.data.try_into().ok().map(u32::from_ne_bytes);
                        }
                        _ => {}
                    }
                }
            }
        }
        Some(out)
    }
}

/// Calls `f` with every netlink message of a receive buffer, borrowed.
pub fn for_each_msg(
    buf: &[u8],
    mut f: impl FnMut(Msg<'_>) -> Result<(), NftError>,
) -> Result<(), NftError> {
    let mut off = 0;
    while off + 16 <= buf.len() {
        let h = &buf[off..off + 16];
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len < 16 || off + len > buf.len() {
            return Err(NftError::Protocol(format!(
                "netlink message of length {len} at offset {off} in a {}-byte read",
                buf.len()
            )));
        }
        f(Msg {
            ty: u16::from_ne_bytes([h[4], h[5]]),
            flags: u16::from_ne_bytes([h[6], h[7]]),
            seq: u32::from_ne_bytes([h[8], h[9], h[10], h[11]]),
            payload: &buf[off + 16..off + len],
        })?;
        off += len.div_ceil(4) * 4;
    }
    Ok(())
}

/// How one dump of [`NfSocket::dump`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpEnd {
    /// `NLMSG_DONE`; `interrupted` if any part carried `NLM_F_DUMP_INTR` (the dumped objects
    /// changed while the kernel was producing the dump).
    Done {
        /// Some part carried `NLM_F_DUMP_INTR`.
        interrupted: bool,
    },
    /// The kernel refused the request (ENOENT: the object is gone), or the dump failed midway
    /// (the errno `NLMSG_DONE` carried).
    Failed(ErrorReply),
}

/// The nf_tables socket.
pub struct NfSocket {
    sock: Socket,
    port: u32,
    seq: u32,
    sndbuf: usize,
    buf: Vec<u8>,
}

const RCVBUF: usize = 4 << 20;
/// How often [`NfSocket::dump`] asks again while another dump holds the socket.
const MAX_BUSY_RETRIES: u32 = 64;

/// The errno a failed dump reports in its `NLMSG_DONE` (payload: an `int`, negative on error).
fn done_errno(payload: &[u8]) -> Option<i32> {
    let b: [u8; 4] = payload.get(..4)?.try_into().ok()?;
    let err = i32::from_ne_bytes(b);
    (err < 0).then_some(-err)
}
const RECV_CHUNK: usize = 256 << 10;

/// `setsockopt(fd, SOL_SOCKET, opt, val)` with an `int` value (`val` capped at `INT_MAX`).
pub(super) fn sockopt(fd: i32, opt: libc::c_int, val: usize) -> io::Result<()> {
    let v: libc::c_int = val.min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: setsockopt reads exactly size_of::<c_int>() bytes from a valid pointer.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl NfSocket {
    /// Opens and binds the socket in the current network namespace, with extended ACKs, capped
    /// ACKs and a large receive buffer.
    pub fn open() -> Result<NfSocket, NftError> {
        let e = |op| move |source| NftError::Socket { op, source };
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(e("socket(NETLINK_NETFILTER)"))?;
        let addr = sock.bind_auto().map_err(e("bind"))?;
        sock.set_ext_ack(true).map_err(e("NETLINK_EXT_ACK"))?;
        sock.set_cap_ack(true).map_err(e("NETLINK_CAP_ACK"))?;
        // FORCE needs CAP_NET_ADMIN, which nf_tables writes need anyway; fall back to the capped
        // variant so a read-only user still gets a socket.
        let fd = sock.as_raw_fd();
        if sockopt(fd, libc::SO_RCVBUFFORCE, RCVBUF).is_err() {
            sockopt(fd, libc::SO_RCVBUF, RCVBUF).map_err(e("SO_RCVBUF"))?;
        }
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(NfSocket {
            sock,
            port: addr.port_number(),
            seq,
            sndbuf: 0,
            buf: Vec::with_capacity(RECV_CHUNK),
        })
    }

    /// The netlink port id: the owner id the kernel records for tables we own.
    pub fn port(&self) -> u32 {
        self.port
    }

    /// Reserves `n` consecutive sequence numbers; returns the first.
    pub fn take_seq(&mut self, n: u32) -> u32 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(n.max(1));
        s
    }

    /// Sends `bytes` (whole messages) in ONE `sendmsg` (gotcha 1), growing `SO_SNDBUF` to fit.
    pub fn send_all(&mut self, bytes: &[u8]) -> Result<(), NftError> {
        let need = bytes.len() + 4096;
        if need > self.sndbuf {
            let fd = self.sock.as_raw_fd();
            if sockopt(fd, libc::SO_SNDBUFFORCE, need).is_err() {
                sockopt(fd, libc::SO_SNDBUF, need).map_err(|source| NftError::Socket {
                    op: "SO_SNDBUF",
                    source,
                })?;
            }
            self.sndbuf = need;
        }
        let kernel = SocketAddr::new(0, 0);
        let n = self
            .sock
            .send_to(bytes, &kernel, 0)
            .map_err(|source| NftError::Socket {
                op: "sendmsg",
                source,
            })?;
        if n != bytes.len() {
            return Err(NftError::Protocol(format!(
                "sendmsg took {n} of {} bytes",
                bytes.len()
            )));
        }
        Ok(())
    }

    /// One receive; `Ok(false)` when nothing is queued and `wait` is false.
    pub fn recv_into(&mut self, out: &mut Vec<Reply>, wait: bool) -> Result<bool, NftError> {
        self.recv_with(wait, |m| {
            out.push(Reply {
                ty: m.ty,
                flags: m.flags,
                seq: m.seq,
                payload: m.payload.to_vec(),
            });
            Ok(())
        })
    }

    /// One receive, each message handed to `f` borrowed from the receive buffer; `Ok(false)`
    /// when nothing is queued and `wait` is false.
    pub fn recv_with(
        &mut self,
        wait: bool,
        f: impl FnMut(Msg<'_>) -> Result<(), NftError>,
    ) -> Result<bool, NftError> {
        let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
        self.buf.clear();
        match self.sock.recv(&mut self.buf, flags) {
            Ok(_) => {
                for_each_msg(&self.buf, f)?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(source) => Err(NftError::Socket {
                op: "recvmsg",
                source,
            }),
        }
    }

    /// Sends one dump request (encoded with sequence number `seq`) and hands every reply to
    /// `on_msg` straight from the receive buffer; `NLMSG_DONE` and errors are not passed on.
    /// Returns how the dump ended.
    ///
    /// One dump at a time: the kernel keeps one open dump per socket (`netlink_dump_start`),
    /// and nf_tables sends `NLMSG_DONE` only when the reply before it has been read, so a
    /// second request in the same `sendmsg` is always refused with `EBUSY` (measured on 6.18).
    pub fn dump(
        &mut self,
        request: &[u8],
        seq: u32,
        mut on_msg: impl FnMut(Msg<'_>) -> Result<(), NftError>,
    ) -> Result<DumpEnd, NftError> {
        // EBUSY: a dump an earlier caller abandoned is still open; every read below advances
        // it (its replies are skipped by seq), so asking again soon succeeds.
        for _ in 0..MAX_BUSY_RETRIES {
            match self.dump_once(request, seq, &mut on_msg)? {
                DumpEnd::Failed(e) if e.errno == libc::EBUSY => continue,
                end => return Ok(end),
            }
        }
        Err(NftError::Protocol(format!(
            "the kernel stayed busy with another dump on this socket after {MAX_BUSY_RETRIES} tries"
        )))
    }

    fn dump_once(
        &mut self,
        request: &[u8],
        seq: u32,
        on_msg: &mut impl FnMut(Msg<'_>) -> Result<(), NftError>,
    ) -> Result<DumpEnd, NftError> {
        self.send_all(request)?;
        let mut interrupted = false;
        let mut end = None;
        // A failure of `on_msg` is returned only after the dump is read to its end: an open
        // dump would make every later request on this socket fail with EBUSY.
        let mut failed = None;
        while end.is_none() {
            self.recv_with(true, |m| {
                if m.seq != seq || end.is_some() {
                    // A late reply to an earlier request: not ours to read.
                    return Ok(());
                }
                interrupted |= m.flags & NLM_F_DUMP_INTR != 0;
                match m.ty {
                    NLMSG_ERROR => {
                        end = Some(match m.as_error() {
                            Some(e) if e.errno != 0 => DumpEnd::Failed(e),
                            _ => DumpEnd::Done { interrupted },
                        })
                    }
                    NLMSG_DONE => {
                        end = Some(match done_errno(m.payload) {
                            Some(errno) => DumpEnd::Failed(ErrorReply {
                                seq,
                                errno,
                                ext_ack: None,
                                attr_offset: None,
                            }),
                            None => DumpEnd::Done { interrupted },
                        })
                    }
                    _ if failed.is_some() => {}
                    _ => failed = on_msg(m).err(),
                }
                Ok(())
            })?;
        }
        match (failed, end) {
            (Some(e), _) => Err(e),
            (None, Some(end)) => Ok(end),
            (None, None) => Err(NftError::Protocol("a dump ended without an answer".into())),
        }
    }

    /// Reads every reply already queued (after a batch: all of them, see module doc).
    pub fn drain(&mut self) -> Result<Vec<Reply>, NftError> {
        let mut out = Vec::new();
        while self.recv_into(&mut out, false)? {}
        Ok(out)
    }

    /// Sends one request and collects replies until `NLMSG_DONE` (dumps) or the error/ACK or
    /// data reply answering `seq`.
    pub fn request(&mut self, msg: &[u8], seq: u32, dump: bool) -> Result<Vec<Reply>, NftError> {
        self.send_all(msg)?;
        let mut out = Vec::new();
        loop {
            let before = out.len();
            self.recv_into(&mut out, true)?;
            let mut done = false;
            for r in &out[before..] {
                if r.seq != seq {
                    continue;
                }
                if r.ty == NLMSG_DONE
                    || r.ty == NLMSG_ERROR
                    || (!dump && r.flags & NLM_F_MULTI == 0)
                {
                    done = true;
                }
            }
            out.retain(|r| r.seq == seq);
            if done {
                return Ok(out);
            }
        }
    }
}
