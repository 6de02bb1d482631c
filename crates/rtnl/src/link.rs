//! Links and addresses: the messages `ip link` / `ip addr` / `ip route add` send, so nothing in
//! felix-nft (demo, tests) has to exec `ip`. Also the link/address dumps the route syncer and the
//! interface monitor read.
//!
//! Links are addressed by name (what the caller knows); each call resolves the name to the current
//! index, so a re-created interface is found again.

use std::net::IpAddr;
use std::os::fd::AsRawFd;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_core::Parseable;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::RouteScope;
use rtnetlink::{LinkUnspec, LinkVeth, RouteMessageBuilder};

use super::{Result, RtnlError, RtnlHandle};
use crate::netns::NetNs;

/// One interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    pub index: u32,
    pub name: String,
    /// IFF_UP: administratively up.
    pub admin_up: bool,
    /// Operationally up, as Felix's interface monitor judges it (§16): IFF_RUNNING, or
    /// IFF_UP together with IFF_LOWER_UP.
    pub oper_up: bool,
    /// Hardware address (6 bytes for Ethernet/veth), empty when the link has none.
    pub mac: Vec<u8>,
    /// `IFLA_MTU` (0 when the message carries none).
    pub mtu: u32,
}

impl LinkState {
    /// Reads a link message (RTM_NEWLINK answer or notification). `None` when it carries no name.
    pub fn from_message(msg: &LinkMessage) -> Option<LinkState> {
        let mut name = None;
        let mut mac = Vec::new();
        let mut mtu = 0;
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => name = Some(n.clone()),
                LinkAttribute::Address(a) => mac = a.clone(),
                LinkAttribute::Mtu(m) => mtu = *m,
                _ => {}
            }
        }
        let flags = msg.header.flags;
        let admin_up = flags.contains(LinkFlags::Up);
        let oper_up =
            flags.contains(LinkFlags::Running) || (admin_up && flags.contains(LinkFlags::LowerUp));
        Some(LinkState {
            index: msg.header.index,
            name: name?,
            admin_up,
            oper_up,
            mac,
            mtu,
        })
    }
}

/// Dumps every link in the handle's namespace (without statistics), each reduced to a
/// [`LinkState`] as it is read ([`RtnlHandle::dump`]).
pub async fn list_links(h: &RtnlHandle) -> Result<Vec<LinkState>> {
    const RTM_NEWLINK: u16 = 16;
    const RTM_GETLINK: u16 = 18;
    const IFLA_EXT_MASK: u16 = 29;
    const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;
    // struct ifinfomsg (any family, any link), then IFLA_EXT_MASK.
    let mut body = vec![0u8; 16];
    body.extend_from_slice(&8u16.to_ne_bytes());
    body.extend_from_slice(&IFLA_EXT_MASK.to_ne_bytes());
    body.extend_from_slice(&RTEXT_FILTER_SKIP_STATS.to_ne_bytes());
    h.dump(
        RTM_GETLINK,
        RTM_NEWLINK,
        &body,
        "dumping links",
        |payload| {
            LinkMessage::parse(payload)
                .ok()
                .and_then(|m| LinkState::from_message(&m))
        },
    )
}

/// Looks up one link by name; `Ok(None)` when it does not exist.
pub async fn get_link(h: &RtnlHandle, name: &str) -> Result<Option<LinkState>> {
    Ok(get_link_message(h, name)
        .await?
        .as_ref()
        .and_then(LinkState::from_message))
}

/// The kernel's message for the link `name`; `Ok(None)` when it does not exist.
/// The parts of a device its syncer compares with a spec: index, kind, admin state, MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceState {
    pub(crate) index: u32,
    pub(crate) kind: Option<InfoKind>,
    pub(crate) admin_up: bool,
    pub(crate) mtu: Option<u32>,
}

impl DeviceState {
    pub(crate) fn of(msg: &LinkMessage) -> DeviceState {
        let mut d = DeviceState {
            index: msg.header.index,
            kind: None,
            admin_up: msg.header.flags.contains(LinkFlags::Up),
            mtu: None,
        };
        for a in &msg.attributes {
            match a {
                LinkAttribute::Mtu(m) => d.mtu = Some(*m),
                LinkAttribute::LinkInfo(infos) => {
                    d.kind = infos.iter().find_map(|i| match i {
                        LinkInfo::Kind(k) => Some(k.clone()),
                        _ => None,
                    });
                }
                _ => {}
            }
        }
        d
    }

    /// Gives the device `mtu` and brings it up where it differs; the corrections made
    /// (`mtu N`, `up`). `name` names it in errors.
    pub(crate) async fn correct_mtu_and_up(
        &self,
        h: &RtnlHandle,
        name: &str,
        mtu: u32,
    ) -> Result<Vec<String>> {
        let mut done = Vec::new();
        if self.mtu != Some(mtu) {
            h.handle()
                .link()
                .set(LinkUnspec::new_with_index(self.index).mtu(mtu).build())
                .execute()
                .await
                .map_err(|err| RtnlError::kernel("setting MTU of", name, err))?;
            done.push(format!("mtu {mtu}"));
        }
        if !self.admin_up {
            h.handle()
                .link()
                .set(LinkUnspec::new_with_index(self.index).up().build())
                .execute()
                .await
                .map_err(|err| RtnlError::kernel("setting link up", name, err))?;
            done.push("up".into());
        }
        Ok(done)
    }
}

/// The link named `name` as the kernel reports it, attributes and all (`None`: no such link).
pub async fn get_link_message(h: &RtnlHandle, name: &str) -> Result<Option<LinkMessage>> {
    let res: std::result::Result<Vec<LinkMessage>, _> = h
        .handle()
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_collect()
        .await;
    match res {
        Ok(mut msgs) => Ok(msgs.pop()),
        Err(e) => {
            let err = RtnlError::kernel("looking up link", name, e);
            if err.is_vanished_interface() {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}

/// The current index of `name`, or [`RtnlError::NoSuchInterface`].
pub async fn index_of(h: &RtnlHandle, op: &'static str, name: &str) -> Result<u32> {
    match get_link(h, name).await? {
        Some(l) => Ok(l.index),
        None => Err(RtnlError::NoSuchInterface {
            op,
            ifname: name.to_string(),
        }),
    }
}

/// Creates a veth pair `name` ↔ `peer` (both down, in the handle's namespace).
pub async fn create_veth(h: &RtnlHandle, name: &str, peer: &str) -> Result<()> {
    h.handle()
        .link()
        .add(LinkVeth::new(name, peer).build())
        .execute()
        .await
        .map_err(|e| RtnlError::kernel("creating veth pair", format!("{name}/{peer}"), e))
}

/// Moves link `name` into namespace `target` (IFLA_NET_NS_FD). It arrives there down.
pub async fn move_to_netns(h: &RtnlHandle, name: &str, target: &NetNs) -> Result<()> {
    let index = index_of(h, "moving link to another namespace", name).await?;
    let fd = target.as_fd_owned().map_err(|source| RtnlError::Socket {
        op: "duplicating namespace handle",
        ns: target.label().to_string(),
        source,
    })?;
    let msg = LinkUnspec::new_with_index(index)
        .setns_by_fd(fd.as_raw_fd())
        .build();
    let res = h.handle().link().set(msg).execute().await;
    drop(fd); // kept open until the kernel has answered
    res.map_err(|e| {
        RtnlError::kernel(
            "moving link to namespace",
            format!("{name} → {}", target.label()),
            e,
        )
    })
}

/// Renames link `name` to `new_name` (the kernel refuses while the link is up: EBUSY).
pub async fn rename(h: &RtnlHandle, name: &str, new_name: &str) -> Result<()> {
    let index = index_of(h, "renaming link", name).await?;
    let msg = LinkUnspec::new_with_index(index).name(new_name).build();
    h.handle()
        .link()
        .set(msg)
        .execute()
        .await
        .map_err(|e| RtnlError::kernel("renaming link", format!("{name} → {new_name}"), e))
}

/// Sets link `name` administratively up or down.
pub async fn set_up(h: &RtnlHandle, name: &str, up: bool) -> Result<()> {
    let index = index_of(h, "setting link up/down", name).await?;
    let b = LinkUnspec::new_with_index(index);
    let msg = if up { b.up() } else { b.down() }.build();
    h.handle().link().set(msg).execute().await.map_err(|e| {
        RtnlError::kernel(
            if up {
                "setting link up"
            } else {
                "setting link down"
            },
            name,
            e,
        )
    })
}

/// Deletes link `name` (for a veth, both ends go).
pub async fn delete(h: &RtnlHandle, name: &str) -> Result<()> {
    let index = index_of(h, "deleting link", name).await?;
    h.handle()
        .link()
        .del(index)
        .execute()
        .await
        .map_err(|e| RtnlError::kernel("deleting link", name, e))
}

/// Adds `addr` (with its prefix length) to link `name`. IPv6 addresses are added with
/// IFA_F_NODAD so they are usable at once (no duplicate address detection wait).
pub async fn add_address(h: &RtnlHandle, name: &str, addr: IpNet) -> Result<()> {
    let index = index_of(h, "adding address", name).await?;
    let mut req = h
        .handle()
        .address()
        .add(index, addr.addr(), addr.prefix_len());
    if addr.addr().is_ipv6() {
        req.message_mut()
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    req.execute()
        .await
        .map_err(|e| RtnlError::kernel("adding address", format!("{addr} on {name}"), e))
}

/// Removes `addr` from link `name`.
pub async fn delete_address(h: &RtnlHandle, name: &str, addr: IpNet) -> Result<()> {
    let msgs: Vec<AddressMessage> = h
        .handle()
        .address()
        .get()
        .set_link_index_filter(index_of(h, "deleting address", name).await?)
        .execute()
        .try_collect()
        .await
        .map_err(|e| RtnlError::kernel("dumping addresses of", name, e))?;
    for msg in msgs {
        if address_of(&msg) == Some(addr) {
            return h.handle().address().del(msg).execute().await.map_err(|e| {
                RtnlError::kernel("deleting address", format!("{addr} on {name}"), e)
            });
        }
    }
    Ok(())
}

/// What [`set_sole_address`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SoleAddress {
    /// Addresses of the family deleted.
    pub removed: Vec<IpNet>,
    /// The wanted address was missing and added.
    pub added: bool,
}

/// Makes `want` the only address of its family on the link `index` (called `name` in errors),
/// or with `want` `None` removes every address of the family `v6` says; IPv6 link-local
/// addresses stay. One address dump, then a request per change.
pub async fn set_sole_address(
    h: &RtnlHandle,
    name: &str,
    index: u32,
    v6: bool,
    want: Option<IpNet>,
) -> Result<SoleAddress> {
    let msgs: Vec<AddressMessage> = h
        .handle()
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(|e| RtnlError::kernel("dumping addresses of", name, e))?;
    let mut out = SoleAddress::default();
    let mut present = false;
    for msg in msgs {
        let Some(a) = address_of(&msg) else { continue };
        if a.addr().is_ipv6() != v6 {
            continue;
        }
        if Some(a) == want {
            present = true;
            continue;
        }
        if matches!(a.addr(), IpAddr::V6(v6) if v6.is_unicast_link_local()) {
            continue;
        }
        h.handle()
            .address()
            .del(msg)
            .execute()
            .await
            .map_err(|e| RtnlError::kernel("deleting address", format!("{a} on {name}"), e))?;
        out.removed.push(a);
    }
    if let (Some(want), false) = (want, present) {
        let mut req = h
            .handle()
            .address()
            .add(index, want.addr(), want.prefix_len());
        if want.addr().is_ipv6() {
            req.message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        req.execute()
            .await
            .map_err(|e| RtnlError::kernel("adding address", format!("{want} on {name}"), e))?;
        out.added = true;
    }
    Ok(out)
}

/// The address (with prefix length) an address message describes. IFA_LOCAL is the interface's
/// own address on point-to-point links; IFA_ADDRESS otherwise.
pub fn address_of(msg: &AddressMessage) -> Option<IpNet> {
    let mut address = None;
    let mut local = None;
    for attr in &msg.attributes {
        match attr {
            AddressAttribute::Address(a) => address = Some(*a),
            AddressAttribute::Local(a) => local = Some(*a),
            _ => {}
        }
    }
    let ip: IpAddr = local.or(address)?;
    IpNet::new(ip, msg.header.prefix_len).ok()
}

/// Dumps all addresses of both families: (interface index, address).
pub async fn list_addresses(h: &RtnlHandle) -> Result<Vec<(u32, IpNet)>> {
    h.handle()
        .address()
        .get()
        .execute()
        .try_filter_map(|m| std::future::ready(Ok(address_of(&m).map(|a| (m.header.index, a)))))
        .try_collect()
        .await
        .map_err(|e| RtnlError::kernel("dumping", "addresses", e))
}

/// Adds a route to `dst` in the main table: through `via` when given, else directly on `dev`
/// (scope link), like `ip route add DST [via GW] [dev DEV]`.
pub async fn add_route(
    h: &RtnlHandle,
    dst: IpNet,
    dev: Option<&str>,
    via: Option<IpAddr>,
) -> Result<()> {
    let object = format!("{dst}");
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.addr(), dst.prefix_len())
        .map_err(|e| RtnlError::Unexpected {
            op: "building route",
            what: e.to_string(),
        })?;
    if let Some(gw) = via {
        b = b.gateway(gw).map_err(|e| RtnlError::Unexpected {
            op: "building route",
            what: e.to_string(),
        })?;
    } else {
        b = b.scope(RouteScope::Link);
    }
    if let Some(dev) = dev {
        b = b.output_interface(index_of(h, "adding route", dev).await?);
    }
    h.handle()
        .route()
        .add(b.build())
        .execute()
        .await
        .map_err(|e| RtnlError::kernel("adding route", object, e))
}
