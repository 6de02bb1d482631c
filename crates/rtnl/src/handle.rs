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

use super::batch::{self, Batch, Outcome};
use super::{Result, RtnlError};
use crate::netns::NetNs;
use netlink_wire::{messages_with_seq, nl_request, nlmsg_errno, NLMSG_DONE, NLMSG_ERROR};

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

/// SO_RCVBUFFORCE (CAP_NET_ADMIN) so the size is not capped by rmem_max; falls back to SO_RCVBUF.
pub(crate) fn set_rcvbuf_force(sock: &netlink_sys::Socket, size: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with a valid fd and a pointer to a c_int that outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
    }
    Err(std::io::Error::last_os_error())
}

/// SO_RCVTIMEO: how long a blocking receive on `sock` waits before it fails with
/// `WouldBlock` (`None`: for ever).
pub(crate) fn set_read_timeout(
    sock: &netlink_sys::Socket,
    timeout: Option<std::time::Duration>,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let t = timeout.unwrap_or_default();
    let tv = libc::timeval {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::from(t.subsec_micros()),
    };
    // SAFETY: setsockopt on an open socket with a pointer to a timeval that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What one read of a subscriber socket (events, logged packets) brought.
pub(crate) enum Datagram {
    Bytes(Vec<u8>),
    /// The kernel dropped messages: the socket's buffer was full (ENOBUFS).
    Overrun,
    /// Nothing came within the socket's read timeout.
    TimedOut,
}

/// Reads one datagram from a subscriber socket.
pub(crate) fn recv_datagram(sock: &netlink_sys::Socket) -> std::io::Result<Datagram> {
    match sock.recv_from_full() {
        Ok((buf, _)) => Ok(Datagram::Bytes(buf)),
        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(Datagram::Overrun),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Datagram::TimedOut),
        Err(e) => Err(e),
    }
}

/// A request/response rtnetlink connection whose socket lives in one namespace. Cheap to clone;
/// the connection task ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct RtnlHandle {
    handle: rtnetlink::Handle,
    ns: String,
    /// A plain blocking socket in the same namespace for dumps reduced as they arrive
    /// ([`RtnlHandle::dump`]) and pipelined writes ([`RtnlHandle::write_batch`]).
    plain: Arc<Mutex<Plain>>,
}

/// The plain socket of a handle and what its users reuse.
#[derive(Debug)]
struct Plain {
    sock: Socket,
    /// The receive buffer of batch answers, kept between batches.
    rx: Vec<u8>,
    /// Requests per datagram the socket's receive buffer has room to answer.
    per_datagram: usize,
}

/// Sequence numbers of requests on plain sockets ([`RtnlHandle::dump`],
/// [`RtnlHandle::write_batch`]).
static PLAIN_SEQ: AtomicU32 = AtomicU32::new(1);

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
        let label = ns.map(NetNs::label).unwrap_or(CURRENT_NS).to_string();
        let plain = plain_socket(socket_in(ns, NETLINK_ROUTE)?, &label)?;
        let socket = into_tokio(socket, &label, "connecting rtnetlink")?;
        let (conn, handle, _unsolicited) = rtnetlink::from_socket(socket);
        tokio::spawn(conn);
        Ok(RtnlHandle {
            handle,
            ns: label,
            plain: Arc::new(Mutex::new(plain)),
        })
    }

    /// Sends the requests of `batch` pipelined ([`batch::send`]) on the handle's plain socket
    /// and returns one outcome per request, in order. Blocking; `Err` only when the socket
    /// cannot be had.
    pub fn write_batch(&self, batch: &mut Batch) -> Result<Vec<Outcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        blocking(|| {
            let mut plain = self.plain.lock().map_err(|_| RtnlError::Socket {
                op: "writing a batch",
                ns: self.ns.clone(),
                source: std::io::Error::other("plain socket lock poisoned"),
            })?;
            let Plain {
                sock,
                rx,
                per_datagram,
            } = &mut *plain;
            let first = PLAIN_SEQ.fetch_add(batch.len() as u32, Ordering::Relaxed);
            Ok(batch::send(sock, batch, first, *per_datagram, rx))
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
            let plain = self
                .plain
                .lock()
                .map_err(|_| fail(std::io::Error::other("plain socket lock poisoned")))?;
            let seq = PLAIN_SEQ.fetch_add(1, Ordering::Relaxed);
            let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
            let msg = nl_request(request, flags, seq, &[body]);
            let mut out = Vec::new();
            read_dump(&plain.sock, &msg, seq, reply, |payload| {
                out.extend(keep(payload))
            })
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

/// Readies a blocking socket for batches: a receive buffer with room for many answers, and
/// answers without a copy of the request (`NETLINK_CAP_ACK`: the sequence number says which).
fn plain_socket(sock: Socket, ns: &str) -> Result<Plain> {
    let fail = |source| RtnlError::Socket {
        op: "sizing the receive buffer",
        ns: ns.to_string(),
        source,
    };
    sock.set_rx_buf_sz(batch::RCVBUF as libc::c_int)
        .map_err(fail)?;
    sock.set_cap_ack(true).map_err(fail)?;
    let rcvbuf = sock.get_rx_buf_sz().map_err(fail)?;
    Ok(Plain {
        sock,
        rx: Vec::with_capacity(batch::MAX_DATAGRAM),
        per_datagram: batch::requests_per_datagram(rcvbuf),
    })
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
