//! Per-interface and global kernel configuration (§14.2).
//!
//! Where the kernel offers it, netlink:
//! - IPv4 per-interface conf (`forwarding`, `proxy_arp`, `rp_filter`, `route_localnet`, …):
//!   RTM_SETLINK with `IFLA_AF_SPEC { AF_INET { IFLA_INET_CONF { <devconf id>: u32 } } }`
//!   ([`set_ipv4_conf`]). The nested attribute is built by hand ([`inet_conf_nla`]) because the
//!   typed builder (`AfSpecInet::DevConfRequest`) silently drops every field equal to 0, so
//!   `rp_filter=0` would be acknowledged and not applied. The
//!   agent itself writes these through `/proc/sys` ([`ProcSys::set_ipv4_iface`]): each SETLINK
//!   makes IPv6 walk its whole routing table, O(interfaces) per interface configured.
//! - `proxy_delay`: RTM_SETNEIGHTBL on table `arp_cache` with
//!   `NDTA_PARMS { NDTPA_IFINDEX, NDTPA_PROXY_DELAY (ms, u64) }`.
//!
//! Everything else through `/proc/sys` **of the target namespace** ([`ProcSys`]): IPv6
//! per-interface conf (the kernel answers IFLA_INET6_CONF with EINVAL), `conf/all`,
//! `conf/default` (no ifindex to address; RTM_NEWNETCONF is EOPNOTSUPP) and globals. A
//! `/proc/sys/net` file belongs to the namespace of the thread that opens it, so each access
//! enters the namespace, opens, and leaves. Note: netlink devconf writes skip the proc handlers'
//! side effects (no RTM_NEWNETCONF, no LRO disable on forwarding) — harmless on veths.
//!
//! An interface that vanished under us is reported as [`RtnlError::NoSuchInterface`] (benign,
//! see [`RtnlError::is_vanished_interface`]); any other failure is for the caller to retry.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use futures::StreamExt;
use netlink_packet_core::{
    DefaultNla, NetlinkMessage, NetlinkPayload, NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST,
};
use netlink_packet_route::link::{AfSpecInet, AfSpecUnspec, LinkAttribute, LinkMessage};
use netlink_packet_route::neighbour_table::{
    NeighbourTableAttribute, NeighbourTableMessage, NeighbourTableParameter,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::link::index_of;
use super::{Result, RtnlError, RtnlHandle};
use crate::netns::NetNs;

/// `IFLA_INET_CONF` inside `IFLA_AF_SPEC/AF_INET` (uapi linux/if_link.h).
const IFLA_INET_CONF: u16 = 1;

/// IPv4 per-interface settings reachable over netlink: `IPV4_DEVCONF_*` ids (uapi linux/ip.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ipv4Conf {
    /// `IPV4_DEVCONF_FORWARDING`
    Forwarding,
    /// `IPV4_DEVCONF_PROXY_ARP`
    ProxyArp,
    /// `IPV4_DEVCONF_RP_FILTER`
    RpFilter,
    /// `IPV4_DEVCONF_ROUTE_LOCALNET`
    RouteLocalnet,
    /// Any other `IPV4_DEVCONF_*` id (1..=IPV4_DEVCONF_MAX; the kernel rejects others).
    Other(u16),
}

impl Ipv4Conf {
    /// The uapi id.
    pub fn id(self) -> u16 {
        match self {
            Ipv4Conf::Forwarding => 1,
            Ipv4Conf::ProxyArp => 3,
            Ipv4Conf::RpFilter => 8,
            Ipv4Conf::RouteLocalnet => 26,
            Ipv4Conf::Other(id) => id,
        }
    }

    /// The file under `/proc/sys/net/ipv4/conf/<ifname>/` (`None` for [`Ipv4Conf::Other`]).
    pub fn file(self) -> Option<&'static str> {
        match self {
            Ipv4Conf::Forwarding => Some("forwarding"),
            Ipv4Conf::ProxyArp => Some("proxy_arp"),
            Ipv4Conf::RpFilter => Some("rp_filter"),
            Ipv4Conf::RouteLocalnet => Some("route_localnet"),
            Ipv4Conf::Other(_) => None,
        }
    }
}

/// Encodes the payload of `IFLA_INET_CONF`: one `{len=8, type=id, u32 value (host order)}`
/// attribute per setting, zero values included.
///
/// ```text
///   +--------+--------+----------------+ ...
///   | len=8  | id     | value (u32 ne) |
///   +--------+--------+----------------+
/// ```
pub fn inet_conf_nla(settings: &[(Ipv4Conf, u32)]) -> DefaultNla {
    let mut buf = Vec::with_capacity(settings.len() * 8);
    for (conf, value) in settings {
        buf.extend_from_slice(&8u16.to_ne_bytes());
        buf.extend_from_slice(&conf.id().to_ne_bytes());
        buf.extend_from_slice(&value.to_ne_bytes());
    }
    DefaultNla::new(IFLA_INET_CONF | NLA_F_NESTED, buf)
}

/// Sets IPv4 per-interface conf values on `ifname` in one RTM_SETLINK.
pub async fn set_ipv4_conf(
    h: &RtnlHandle,
    ifname: &str,
    settings: &[(Ipv4Conf, u32)],
) -> Result<()> {
    let index = index_of(h, "setting IPv4 devconf", ifname).await?;
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.attributes
        .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
            AfSpecInet::Other(inet_conf_nla(settings)),
        ])]));
    h.handle().link().set(msg).execute().await.map_err(|e| {
        vanished_or(
            RtnlError::kernel(
                "setting IPv4 devconf",
                format!("{settings:?} on {ifname}"),
                e,
            ),
            ifname,
        )
    })
}

/// Sets `net.ipv4.neigh.<ifname>.proxy_delay` (milliseconds; the kernel keeps jiffies) over
/// RTM_SETNEIGHTBL.
pub async fn set_proxy_delay(h: &RtnlHandle, ifname: &str, millis: u64) -> Result<()> {
    let index = index_of(h, "setting proxy_delay", ifname).await?;
    let mut msg = NeighbourTableMessage::default();
    msg.header.family = AddressFamily::Inet;
    msg.attributes
        .push(NeighbourTableAttribute::Name("arp_cache".to_string()));
    msg.attributes.push(NeighbourTableAttribute::Parms(vec![
        NeighbourTableParameter::Ifindex(index),
        NeighbourTableParameter::ProxyDelay(millis),
    ]));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::SetNeighbourTable(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut handle = h.handle().clone();
    let op = "setting proxy_delay";
    let mut resp = handle
        .request(req)
        .map_err(|e| RtnlError::kernel(op, ifname, e))?;
    while let Some(m) = resp.next().await {
        if let NetlinkPayload::Error(err) = m.payload {
            if err.code.is_some() {
                let e = RtnlError::kernel(op, ifname, rtnetlink::Error::NetlinkError(err));
                return Err(vanished_or(e, ifname));
            }
        }
    }
    Ok(())
}

fn vanished_or(e: RtnlError, ifname: &str) -> RtnlError {
    if e.is_vanished_interface() {
        RtnlError::NoSuchInterface {
            op: "configuring interface",
            ifname: ifname.to_string(),
        }
    } else {
        e
    }
}

/// IPv6 per-interface settings, only reachable through /proc/sys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Conf {
    AcceptRa,
    ProxyNdp,
    Forwarding,
}

impl Ipv6Conf {
    fn file(self) -> &'static str {
        match self {
            Ipv6Conf::AcceptRa => "accept_ra",
            Ipv6Conf::ProxyNdp => "proxy_ndp",
            Ipv6Conf::Forwarding => "forwarding",
        }
    }
}

/// `/proc/sys` of one network namespace (or of the caller's, with `None`).
#[derive(Debug)]
pub struct ProcSys {
    ns: Option<NetNs>,
    root: PathBuf,
}

impl ProcSys {
    /// Accesses `/proc/sys` as seen from `ns`.
    pub fn new(ns: Option<NetNs>) -> ProcSys {
        ProcSys {
            ns,
            root: PathBuf::from("/proc/sys"),
        }
    }

    fn in_ns<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        match &self.ns {
            Some(ns) => Ok(ns.run(f)?),
            None => Ok(f()),
        }
    }

    /// Writes `value` to `/proc/sys/<rel>` (e.g. `net/ipv4/ip_forward`) with one write(2); a
    /// short write is an error, as in Felix.
    pub fn write(&self, rel: &str, value: &str) -> Result<()> {
        let path = self.root.join(rel);
        self.in_ns(|| write_once(&path, value.as_bytes()))?
            .map_err(|source| RtnlError::Sysctl {
                op: "writing",
                path,
                source,
            })
    }

    /// Reads `/proc/sys/<rel>`, trimmed.
    pub fn read(&self, rel: &str) -> Result<String> {
        let path = self.root.join(rel);
        self.in_ns(|| std::fs::read_to_string(&path))?
            .map(|s| s.trim().to_string())
            .map_err(|source| RtnlError::Sysctl {
                op: "reading",
                path,
                source,
            })
    }

    /// Writes a per-interface file (`net/<family>/conf/<ifname>/<key>`); a missing interface
    /// directory is [`RtnlError::NoSuchInterface`].
    pub fn write_iface(&self, family: &str, ifname: &str, key: &str, value: &str) -> Result<()> {
        self.write_iface_files(family, ifname, &[(key, value.to_string())])
    }

    /// Writes several files of one interface's `net/<family>/conf/<ifname>/`, in order, with one
    /// entry into the namespace; stops at the first failure.
    fn write_iface_files(
        &self,
        family: &str,
        ifname: &str,
        files: &[(&str, String)],
    ) -> Result<()> {
        let gone = || RtnlError::NoSuchInterface {
            op: "writing interface sysctl",
            ifname: ifname.to_string(),
        };
        if ifname.contains('/') || ifname == "." || ifname == ".." {
            return Err(gone());
        }
        let dir = self.root.join(format!("net/{family}/conf/{ifname}"));
        let res = self.in_ns(|| {
            for (key, value) in files {
                let path = dir.join(key);
                write_once(&path, value.as_bytes()).map_err(|e| (path, e))?;
            }
            Ok(())
        })?;
        match res {
            Ok(()) => Ok(()),
            Err((_, source))
                if source.kind() == io::ErrorKind::NotFound && !self.iface_exists(ifname)? =>
            {
                Err(gone())
            }
            Err((path, source)) => Err(RtnlError::Sysctl {
                op: "writing",
                path,
                source,
            }),
        }
    }

    /// True when the namespace has an interface of that name (its IPv4 conf directory exists).
    fn iface_exists(&self, ifname: &str) -> Result<bool> {
        let dir = self.root.join("net/ipv4/conf").join(ifname);
        self.in_ns(|| Path::new(&dir).exists())
    }

    /// Sets IPv4 per-interface settings through `/proc/sys/net/ipv4/conf/<ifname>/`, entering
    /// the namespace once for all of them. This is what the agent uses: the netlink way
    /// ([`set_ipv4_conf`]) makes the kernel announce a link change (NETDEV_CHANGE), and IPv6
    /// answers that by walking its whole routing table (`rt6_sync_up` → `fib6_ifup`), so
    /// configuring n interfaces cost O(n²): 39 s for the first sync of 5,000 endpoints with
    /// their interfaces present (`perf`). The proc handlers do what Felix's writes do
    /// (RTM_NEWNETCONF, LRO off on forwarding) and no walk.
    pub fn set_ipv4_iface(&self, ifname: &str, settings: &[(Ipv4Conf, u32)]) -> Result<()> {
        let files = settings
            .iter()
            .map(|(conf, value)| {
                let file = conf.file().ok_or_else(|| RtnlError::Sysctl {
                    op: "naming",
                    path: PathBuf::from(format!("net/ipv4/conf/{ifname}/<devconf {}>", conf.id())),
                    source: io::Error::new(io::ErrorKind::InvalidInput, "no /proc/sys file for it"),
                })?;
                Ok((file, value.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        self.write_iface_files("ipv4", ifname, &files)
    }

    /// Sets an IPv6 per-interface setting (`net.ipv6.conf.<ifname>.<key>`).
    pub fn set_ipv6_iface(&self, ifname: &str, conf: Ipv6Conf, value: u32) -> Result<()> {
        self.write_iface("ipv6", ifname, conf.file(), &value.to_string())
    }

    /// Reads `net.ipv4.conf.default.rp_filter`, the value Felix gives workload interfaces; "1"
    /// when unreadable or not a number (§14.2). Read once at start.
    pub fn default_rp_filter(&self) -> u32 {
        match self
            .read("net/ipv4/conf/default/rp_filter")
            .map(|s| s.parse::<u32>())
        {
            Ok(Ok(v)) => v,
            other => {
                tracing::warn!(result = ?other.map(|r| r.ok()), "conf/default/rp_filter unreadable, using 1");
                1
            }
        }
    }
}

fn write_once(path: &Path, value: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(path)?;
    let n = f.write(value)?;
    if n != value.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write: {n} of {} bytes", value.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::Emitable;

    #[test]
    fn inet_conf_keeps_zero_values() {
        let nla = inet_conf_nla(&[(Ipv4Conf::RpFilter, 0), (Ipv4Conf::RouteLocalnet, 1)]);
        let mut v = vec![0u8; nla.buffer_len()];
        nla.emit(&mut v);
        let mut want = Vec::new();
        want.extend_from_slice(&20u16.to_ne_bytes());
        want.extend_from_slice(&(IFLA_INET_CONF | NLA_F_NESTED).to_ne_bytes());
        for (id, val) in [(8u16, 0u32), (26, 1)] {
            want.extend_from_slice(&8u16.to_ne_bytes());
            want.extend_from_slice(&id.to_ne_bytes());
            want.extend_from_slice(&val.to_ne_bytes());
        }
        assert_eq!(v, want, "rp_filter=0 is on the wire");
    }
}
