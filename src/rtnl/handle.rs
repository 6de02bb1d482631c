//! The rtnetlink request connection, made in a chosen network namespace.
//!
//! A netlink socket belongs to the namespace of the thread that created it, so
//! [`socket_in`] enters the namespace on the current thread, creates the socket, and leaves again
//! before anything async happens. [`RtnlHandle::connect`] then hands that finished socket to the
//! tokio runtime: no tokio worker ever runs while inside a foreign namespace.

use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr, TokioSocket};

use super::{Result, RtnlError};
use crate::netns::NetNs;

/// Label used in errors for "the namespace the thread was already in".
const CURRENT_NS: &str = "current";

/// Creates a netlink socket of `protocol` in `ns` (or in the current thread's namespace when
/// `None`). Synchronous: the thread is back in its own namespace when this returns.
pub fn socket_in(ns: Option<&NetNs>, protocol: isize) -> Result<Socket> {
    let label = ns.map(NetNs::label).unwrap_or(CURRENT_NS).to_string();
    let make = || {
        Socket::new(protocol).map_err(|source| RtnlError::Socket {
            op: "creating",
            ns: label.clone(),
            source,
        })
    };
    match ns {
        Some(ns) => ns.run(make)?,
        None => make(),
    }
}

/// A request/response rtnetlink connection whose socket lives in one namespace. Cheap to clone;
/// the connection task ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct RtnlHandle {
    handle: rtnetlink::Handle,
    ns: String,
    /// A plain socket in the same namespace for dumps reduced as they arrive
    /// ([`RtnlHandle::dump`]).
    dumper: Arc<Mutex<Socket>>,
}

/// Sequence numbers of [`RtnlHandle::dump`] requests.
static DUMP_SEQ: AtomicU32 = AtomicU32::new(1);

/// `struct nlmsghdr`'s size, and the two control message types.
pub(crate) const NLMSG_HDRLEN: usize = 16;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;

/// One netlink request: `struct nlmsghdr` (port id 0: the kernel) followed by `parts`.
pub(crate) fn nl_request(ty: u16, flags: u16, seq: u32, parts: &[&[u8]]) -> Vec<u8> {
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
pub(crate) fn messages_with_seq(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8], u32)> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let ty = u16::from_ne_bytes(buf[4..6].try_into().ok()?);
        let seq = u32::from_ne_bytes(buf[8..12].try_into().ok()?);
        let payload = &buf[NLMSG_HDRLEN..len];
        buf = &buf[((len + 3) & !3).min(buf.len())..];
        Some((ty, payload, seq))
    })
}

/// `nlmsgerr.error` as a positive errno, `None` for an ACK (0).
pub(crate) fn nlmsg_errno(payload: &[u8]) -> Option<i32> {
    let code = i32::from_ne_bytes(payload.get(0..4)?.try_into().ok()?);
    (code != 0).then_some(-code)
}

/// Sends the dump request `request` (sequence number `seq`) on a plain blocking socket and hands
/// the payload of each `reply` message of its answer to `each`, one at a time, until
/// `NLMSG_DONE`; an `NLMSG_ERROR` ends it with its errno. Messages of other sequence numbers
/// (what an earlier request cut short left queued) are skipped.
pub(crate) fn read_dump(
    sock: &Socket,
    request: &[u8],
    seq: u32,
    reply: u16,
    mut each: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    sock.send_to(request, &SocketAddr::new(0, 0), 0)?;
    loop {
        let (buf, _) = sock.recv_from_full()?;
        for (ty, payload, mseq) in messages_with_seq(&buf) {
            if mseq != seq {
                continue;
            }
            match ty {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    if let Some(errno) = nlmsg_errno(payload) {
                        return Err(std::io::Error::from_raw_os_error(errno));
                    }
                }
                t if t == reply => each(payload),
                _ => {}
            }
        }
    }
}

/// Runs blocking kernel work from async code: under `block_in_place` on a multi-threaded
/// runtime, directly elsewhere (a current-thread runtime cannot hand its tasks to another
/// worker, and `block_in_place` would panic there).
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl RtnlHandle {
    /// Opens a connection in `ns` (current namespace when `None`) and spawns its I/O task on the
    /// current tokio runtime.
    pub fn connect(ns: Option<&NetNs>) -> Result<RtnlHandle> {
        let socket = socket_in(ns, NETLINK_ROUTE)?;
        let dumper = Arc::new(Mutex::new(socket_in(ns, NETLINK_ROUTE)?));
        let label = ns.map(NetNs::label).unwrap_or(CURRENT_NS).to_string();
        let socket = into_tokio(socket, &label, "connecting rtnetlink")?;
        let (conn, handle, _unsolicited) = rtnetlink::from_socket(socket);
        tokio::spawn(conn);
        Ok(RtnlHandle {
            handle,
            ns: label,
            dumper,
        })
    }

    /// Dumps with request type `request` (`body`: the family header and attributes) and hands
    /// the payload of each `reply` message to `keep`, collecting what it returns.
    ///
    /// Through the typed handle, `rtnetlink`'s connection task parses a whole dump and queues
    /// it before the caller sees the first message: kilobytes per link, 33 MB at once for 2,000
    /// veth interfaces (measured; the daemon's first sync peaked there). Here one message is
    /// looked at at a time. Blocking, one dump at a time per handle.
    pub fn dump<T>(
        &self,
        request: u16,
        reply: u16,
        body: &[u8],
        op: &'static str,
        mut keep: impl FnMut(&[u8]) -> Option<T>,
    ) -> Result<Vec<T>> {
        let fail = |source: std::io::Error| RtnlError::Socket {
            op,
            ns: self.ns.clone(),
            source,
        };
        blocking(|| {
            let sock = self
                .dumper
                .lock()
                .map_err(|_| fail(std::io::Error::other("dump socket lock poisoned")))?;
            let seq = DUMP_SEQ.fetch_add(1, Ordering::Relaxed);
            let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
            let msg = nl_request(request, flags, seq, &[body]);
            let mut out = Vec::new();
            read_dump(&sock, &msg, seq, reply, |payload| out.extend(keep(payload)))
                .map_err(fail)?;
            Ok(out)
        })
    }

    /// The typed `rtnetlink` handle.
    pub fn handle(&self) -> &rtnetlink::Handle {
        &self.handle
    }

    /// The namespace label (for logs and errors).
    pub fn ns_label(&self) -> &str {
        &self.ns
    }
}

/// Registers a finished blocking socket with the current tokio runtime.
pub(crate) fn into_tokio(socket: Socket, ns: &str, op: &'static str) -> Result<TokioSocket> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(RtnlError::NoRuntime { op });
    }
    socket
        .set_non_blocking(true)
        .map_err(|source| RtnlError::Socket {
            op: "making non-blocking",
            ns: ns.to_string(),
            source,
        })?;
    // SAFETY: the fd comes from `into_raw_fd`, so ownership moves to the TokioSocket. Its
    // `from_raw_fd` registers with the reactor, which exists (checked above).
    Ok(unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) })
}
