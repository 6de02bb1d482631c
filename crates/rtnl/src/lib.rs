//! Kernel networking over rtnetlink (§14–16, §21): routes, static ARP, per-interface
//! sysctls, the interface monitor, conntrack. Knows interfaces, addresses, routes and neighbours,
//! not Calico: the caller passes protocol numbers, metrics, interface names and ownership rules.
//!
//! Every socket this layer makes (rtnetlink request connection, multicast monitor, ctnetlink) and
//! every `/proc/sys` file it opens can target a namespace given as [`crate::netns::NetNs`]: the
//! current thread enters it, creates the socket or opens the file, and leaves again
//! ([`handle::socket_in`]). A socket stays in the namespace it was made in, so the async parts
//! (tokio) only ever see finished sockets.
//!
//! - [`handle`]: the rtnetlink request connection in a namespace.
//! - [`batch`]: pipelined writes: many requests to a datagram, answers matched by sequence number.
//! - [`link`]: veth pairs, moves between namespaces, rename, up/down, addresses, link dumps.
//! - [`routes`]: the route syncer (desired routes per table and family → kernel by dump and diff).
//! - [`neigh`]: permanent (static ARP) neighbour entries.
//! - [`devconf`]: per-interface and global sysctls (netlink where the kernel allows, /proc/sys).
//! - [`monitor`]: the interface monitor with a bounded, coalescing event channel.
//! - [`vxlan`]: a VXLAN device created or corrected from a spec, and its permanent FDB entries.
//! - [`ipip`]: `tunl0`, the IPIP device: made to appear, configured, or stripped of addresses.
//! - [`wireguard`]: WireGuard devices over generic netlink: keys, port, fwmark, peers.
//! - [`wgsync`]: one WireGuard device brought to a spec, with its routing table and rule.
//! - [`rule`]: the policy-routing rules that point at a table the caller owns.
//! - [`conntrack`]: deleting conntrack entries by source address over ctnetlink.
//! - [`netns`]: entering a network namespace; named namespaces (`/run/netns`).
// A `pub` item no other crate can reach is `pub(crate)` or narrower: the public surface says
// what the crates above use.
#![warn(unreachable_pub)]

pub mod batch;
pub mod conntrack;
pub mod ctevents;
pub mod devconf;
pub mod handle;
pub mod ipip;
pub mod link;
pub mod monitor;
pub mod neigh;
pub mod netns;
pub mod nexthop;
pub mod nflog;
pub mod routes;
pub mod rule;
pub mod vxlan;
pub mod wgsync;
pub mod wireguard;

use std::io;
use std::path::PathBuf;

use crate::netns::NetNsError;

pub use handle::RtnlHandle;

/// `ENODEV`/`ENXIO`-style answers that mean "the interface is gone", not "the kernel refused".
const VANISHED_ERRNOS: [i32; 3] = [libc::ENODEV, libc::ENXIO, libc::ENOENT];

/// Errors of the rtnl layer. Each names the operation and the object; the kernel's errno is kept
/// (`rtnetlink` 0.24 does not parse the extended-ACK attributes, so no ACK text is available).
#[derive(Debug, thiserror::Error)]
pub enum RtnlError {
    /// The namespace could not be entered (needs CAP_SYS_ADMIN) or opened.
    #[error("acting in network namespace")]
    Netns(#[from] NetNsError),
    /// A socket could not be created or configured.
    #[error("{op} (netlink socket in namespace {ns})")]
    Socket {
        op: &'static str,
        ns: String,
        #[source]
        source: io::Error,
    },
    /// The kernel answered a request with an error.
    #[error("{op} {object}: errno {errno}")]
    Kernel {
        op: &'static str,
        object: String,
        /// Positive errno (`libc::E*`), 0 when the failure was not a kernel NACK.
        errno: i32,
        #[source]
        source: rtnetlink::Error,
    },
    /// A pipelined request got no answer: the socket failed before it (the request may or may
    /// not have been applied).
    #[error("{op} {object}: no answer")]
    Unanswered {
        op: &'static str,
        object: String,
        #[source]
        source: io::Error,
    },
    /// The named interface does not exist (or vanished while we worked on it). Benign for a
    /// caller that configures interfaces as they come and go.
    #[error("{op}: interface {ifname} does not exist")]
    NoSuchInterface { op: &'static str, ifname: String },
    /// A `/proc/sys` file could not be read or written.
    #[error("{op} {path}")]
    Sysctl {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A generic-netlink request (WireGuard's family) failed.
    #[error("{op} {object}")]
    Genl {
        op: &'static str,
        object: String,
        #[source]
        source: io::Error,
    },
    /// The kernel lacks what a request needs (a generic-netlink family whose module is not
    /// loaded).
    #[error("{op}: this kernel has no {what}")]
    Unsupported {
        op: &'static str,
        what: &'static str,
    },
    /// A ctnetlink request failed.
    #[error("{op} {object}")]
    Conntrack {
        op: &'static str,
        object: String,
        #[source]
        source: io::Error,
    },
    /// An nfnetlink request or read failed (NFLOG, conntrack events).
    #[error("{op} {object}")]
    Nfnetlink {
        op: &'static str,
        object: String,
        #[source]
        source: io::Error,
    },
    /// Something in a kernel answer did not parse as documented.
    #[error("{op}: unexpected kernel answer: {what}")]
    Unexpected { op: &'static str, what: String },
    /// The function needs a tokio runtime (it spawns the connection task).
    #[error("{op} needs to run inside a tokio runtime")]
    NoRuntime { op: &'static str },
}

impl RtnlError {
    /// The kernel errno behind this error, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RtnlError::Kernel { errno, .. } if *errno != 0 => Some(*errno),
            RtnlError::Sysctl { source, .. }
            | RtnlError::Socket { source, .. }
            | RtnlError::Conntrack { source, .. }
            | RtnlError::Nfnetlink { source, .. }
            | RtnlError::Genl { source, .. }
            | RtnlError::Unanswered { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// An nfnetlink request or read that failed.
    pub fn nfnetlink(op: &'static str, object: &str, source: io::Error) -> RtnlError {
        RtnlError::Nfnetlink {
            op,
            object: object.to_string(),
            source,
        }
    }

    /// True when the error means the interface vanished (a benign race for interface
    /// configuration, §14.2): the caller should drop the work, not retry it.
    pub fn is_vanished_interface(&self) -> bool {
        match self {
            RtnlError::NoSuchInterface { .. } => true,
            RtnlError::Kernel { errno, .. } => VANISHED_ERRNOS.contains(errno),
            _ => false,
        }
    }

    /// True when the kernel lacks the module a request needs.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, RtnlError::Unsupported { .. })
    }

    /// Wraps an `rtnetlink` error with the operation and object it belongs to.
    pub fn kernel(op: &'static str, object: impl Into<String>, source: rtnetlink::Error) -> Self {
        let errno = match &source {
            rtnetlink::Error::NetlinkError(msg) => msg.code.map(|c| -c.get()).unwrap_or(0),
            _ => 0,
        };
        RtnlError::Kernel {
            op,
            object: object.into(),
            errno,
            source,
        }
    }

    /// The error of a pipelined request that did not succeed ([`batch::Failure`]), named as
    /// [`RtnlError::kernel`] names it.
    pub(crate) fn batch(
        op: &'static str,
        object: impl Into<String>,
        failure: batch::Failure,
    ) -> Self {
        match failure {
            batch::Failure::Nack(msg) => {
                RtnlError::kernel(op, object, rtnetlink::Error::NetlinkError(msg))
            }
            batch::Failure::Io(source) => RtnlError::Unanswered {
                op,
                object: object.into(),
                source,
            },
        }
    }
}

/// Result of this layer.
pub type Result<T, E = RtnlError> = std::result::Result<T, E>;

/// IP family of a route, neighbour or sysctl.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(addr: &std::net::IpAddr) -> IpFamily {
        match addr {
            std::net::IpAddr::V4(_) => IpFamily::V4,
            std::net::IpAddr::V6(_) => IpFamily::V6,
        }
    }
}
