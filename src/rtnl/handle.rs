//! The rtnetlink request connection, made in a chosen network namespace.
//!
//! A netlink socket belongs to the namespace of the thread that created it (netlink.md §5), so
//! [`socket_in`] enters the namespace on the current thread, creates the socket, and leaves again
//! before anything async happens. [`RtnlHandle::connect`] then hands that finished socket to the
//! tokio runtime: no tokio worker ever runs while inside a foreign namespace.

use std::os::fd::{FromRawFd, IntoRawFd};

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, TokioSocket};

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
}

impl RtnlHandle {
    /// Opens a connection in `ns` (current namespace when `None`) and spawns its I/O task on the
    /// current tokio runtime.
    pub fn connect(ns: Option<&NetNs>) -> Result<RtnlHandle> {
        let socket = socket_in(ns, NETLINK_ROUTE)?;
        let label = ns.map(NetNs::label).unwrap_or(CURRENT_NS).to_string();
        let socket = into_tokio(socket, &label, "connecting rtnetlink")?;
        let (conn, handle, _unsolicited) = rtnetlink::from_socket(socket);
        tokio::spawn(conn);
        Ok(RtnlHandle { handle, ns: label })
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
