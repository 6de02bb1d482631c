//! A VXLAN device and its forwarding database: the device is created or corrected in place from
//! a [`VxlanSpec`], and permanent FDB entries (MAC → remote underlay address, `NTF_SELF`) are
//! kept on it. Knows VXLAN, not who the peers are: the caller states the device and the entries.
//!
//! Invariants:
//! - Nothing touches the kernel before [`VxlanSyncer::apply`].
//! - A device whose kind, VNI, parent interface, local address, UDP port or MAC differs from the
//!   spec is deleted and created again (those cannot all be changed in place); its MTU, address
//!   and admin state are corrected in place.
//! - The steady state is O(change): an FDB entry added, changed or removed costs one
//!   RTM_NEWNEIGH/RTM_DELNEIGH and no dump. The device is looked at (one RTM_GETLINK, no dump)
//!   only when the spec changed, the caller reports the device changed, or on a resync; a resync
//!   (the refresh timer, after a failure) also dumps the bridge FDB and repairs it: a permanent
//!   entry on the device that is not wanted is deleted (the device is ours, and so are they).
//! - A created or re-created device starts empty: every FDB entry is written again, and the
//!   report says so, so the caller can re-assert what else lives on the device (routes, ARP).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::RouteType;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{LinkUnspec, LinkVxlan};

use super::batch::Batch;
use super::link::{get_link, set_sole_address};
use super::neigh::Mac;
use super::{Result, RtnlError, RtnlHandle};

/// The VXLAN device wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanSpec {
    pub name: String,
    /// VXLAN network identifier.
    pub vni: u32,
    /// Destination UDP port.
    pub port: u16,
    /// The underlay interface (`IFLA_VXLAN_LINK`).
    pub parent: String,
    /// The underlay source address (`IFLA_VXLAN_LOCAL`/`LOCAL6`); its family is the device's.
    pub local: IpAddr,
    /// The device's own MAC.
    pub mac: Mac,
    /// `None`: the kernel's default (the parent's MTU less the encapsulation).
    pub mtu: Option<u32>,
    /// The device's one address of its family (as a /32 or /128); others of that family go.
    pub addr: IpAddr,
}

/// A device's entries as the caller states them: all of them, or only those that changed since
/// it last stated them (`None`: no longer wanted). An update that touches one remote node costs
/// its own entries, not a comparison of every node's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entries<K, V> {
    All(Vec<(K, V)>),
    Changed(Vec<(K, Option<V>)>),
}

impl<K, V> Default for Entries<K, V> {
    fn default() -> Self {
        Entries::All(Vec::new())
    }
}

impl<K, V> Entries<K, V> {
    /// Entries listed (all, or changed).
    pub fn len(&self) -> usize {
        match self {
            Entries::All(v) => v.len(),
            Entries::Changed(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One VXLAN device as the loop wants it: the device (`None`: leave whatever is there alone),
/// its permanent FDB entries (MAC → remote underlay address) and, when only changes are
/// stated, the changes to its permanent neighbours (tunnel address → MAC; stated whole, they
/// are the neighbours phase's, with every other interface's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VxlanWanted {
    pub name: String,
    pub spec: Option<VxlanSpec>,
    pub fdb: Entries<Mac, IpAddr>,
    pub neighbour_changes: Vec<(IpAddr, Option<Mac>)>,
}

/// What one apply did.
#[derive(Debug, Default)]
pub struct VxlanReport {
    /// The device was created (it was missing) or re-created (why, when it was incompatible).
    pub created: bool,
    pub recreated: Option<String>,
    /// The device's MTU, address or admin state was corrected.
    pub corrected: Vec<String>,
    /// FDB entries written and deleted.
    pub fdb_set: usize,
    pub fdb_deleted: usize,
    /// The parent interface does not exist (yet): nothing was done.
    pub parked: bool,
}

/// Counters of the requests a [`VxlanSyncer`] sent, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VxlanSyncStats {
    /// Device lookups (RTM_GETLINK by name).
    pub link_gets: u64,
    /// FDB dumps (one per resync).
    pub fdb_dumps: u64,
    /// FDB writes: RTM_NEWNEIGH and RTM_DELNEIGH.
    pub fdb_writes: u64,
}

impl std::ops::Add for VxlanSyncStats {
    type Output = VxlanSyncStats;
    fn add(self, o: VxlanSyncStats) -> VxlanSyncStats {
        VxlanSyncStats {
            link_gets: self.link_gets + o.link_gets,
            fdb_dumps: self.fdb_dumps + o.fdb_dumps,
            fdb_writes: self.fdb_writes + o.fdb_writes,
        }
    }
}

/// One VXLAN device and its FDB: desired state and the kernel writes to get there.
#[derive(Debug)]
pub struct VxlanSyncer {
    spec: Option<VxlanSpec>,
    device_dirty: bool,
    /// Desired FDB: MAC → remote underlay address.
    fdb: BTreeMap<Mac, IpAddr>,
    /// MACs whose entry must be written or deleted by the next apply.
    fdb_dirty: BTreeSet<Mac>,
    /// The device index of the last apply (`None`: look it up).
    ifindex: Option<u32>,
    resync: bool,
    stats: VxlanSyncStats,
}

impl Default for VxlanSyncer {
    /// An empty syncer; the first apply with a spec is a resync.
    fn default() -> VxlanSyncer {
        VxlanSyncer {
            spec: None,
            device_dirty: false,
            fdb: BTreeMap::new(),
            fdb_dirty: BTreeSet::new(),
            ifindex: None,
            resync: true,
            stats: VxlanSyncStats::default(),
        }
    }
}

impl VxlanSyncer {
    /// An empty syncer; the first apply with a spec is a resync.
    pub fn new() -> VxlanSyncer {
        VxlanSyncer::default()
    }

    /// Sets the device wanted (`None`: leave whatever is there alone). No kernel I/O.
    pub fn set_device(&mut self, spec: Option<VxlanSpec>) {
        if self.spec != spec {
            self.spec = spec;
            self.device_dirty = true;
        }
    }

    /// The device wanted.
    pub fn device(&self) -> Option<&VxlanSpec> {
        self.spec.as_ref()
    }

    /// Sets the permanent FDB entries wanted; only the entries that differ are written by the
    /// next apply. No kernel I/O.
    pub fn set_fdb(&mut self, entries: impl IntoIterator<Item = (Mac, IpAddr)>) {
        let new: BTreeMap<Mac, IpAddr> = entries.into_iter().collect();
        for (mac, ip) in &new {
            if self.fdb.get(mac) != Some(ip) {
                self.fdb_dirty.insert(*mac);
            }
        }
        for mac in self.fdb.keys() {
            if !new.contains_key(mac) {
                self.fdb_dirty.insert(*mac);
            }
        }
        self.fdb = new;
    }

    /// Sets (or with `None` drops) the one FDB entry of `mac`; written by the next apply if it
    /// differs. No kernel I/O.
    pub fn set_fdb_entry(&mut self, mac: Mac, ip: Option<IpAddr>) {
        let old = match ip {
            Some(ip) => self.fdb.insert(mac, ip),
            None => self.fdb.remove(&mac),
        };
        if old != ip {
            self.fdb_dirty.insert(mac);
        }
    }

    /// The device was reported changed (created, deleted, flapped): look at it again.
    pub fn device_changed(&mut self) {
        self.device_dirty = true;
    }

    /// Re-read the device and the FDB on the next apply and repair both.
    pub fn request_resync(&mut self) {
        self.resync = true;
    }

    /// True when an apply has work to do.
    pub fn needs_apply(&self) -> bool {
        self.spec.is_some() && (self.resync || self.device_dirty || !self.fdb_dirty.is_empty())
    }

    /// The requests sent so far.
    pub fn stats(&self) -> VxlanSyncStats {
        self.stats
    }

    /// Brings the device and its FDB to the desired state. On an error the next apply resyncs.
    pub async fn apply(&mut self, h: &RtnlHandle) -> Result<VxlanReport> {
        let mut report = VxlanReport::default();
        let Some(spec) = self.spec.clone() else {
            return Ok(report);
        };
        let res = self.apply_inner(h, &spec, &mut report).await;
        if res.is_err() {
            self.resync = true;
            self.ifindex = None;
        }
        res.map(|()| report)
    }

    async fn apply_inner(
        &mut self,
        h: &RtnlHandle,
        spec: &VxlanSpec,
        report: &mut VxlanReport,
    ) -> Result<()> {
        let resync = self.resync;
        if resync || self.device_dirty || self.ifindex.is_none() {
            self.stats.link_gets += 1;
            match ensure_device(h, spec, report).await? {
                None => {
                    report.parked = true;
                    self.ifindex = None;
                    return Ok(());
                }
                Some(index) => self.ifindex = Some(index),
            }
            self.device_dirty = false;
        }
        let Some(index) = self.ifindex else {
            return Ok(());
        };
        if resync || report.created {
            // Every entry, against what the kernel holds (a new device holds none).
            let kernel = if report.created {
                BTreeMap::new()
            } else {
                self.stats.fdb_dumps += 1;
                dump_fdb(h, index).await?
            };
            let delete: Vec<Mac> = kernel
                .keys()
                .filter(|mac| !self.fdb.contains_key(*mac))
                .copied()
                .collect();
            let set: Vec<(Mac, IpAddr)> = self
                .fdb
                .iter()
                .filter(|(m, d)| kernel.get(*m) != Some(*d))
                .map(|(m, d)| (*m, *d))
                .collect();
            let settled = self.write_fdb(h, &spec.name, index, &set, &delete, report)?;
            if let Some(err) = settled.first_error {
                return Err(err);
            }
            self.fdb_dirty.clear();
            self.resync = false;
            return Ok(());
        }
        let mut set = Vec::new();
        let mut delete = Vec::new();
        for mac in &self.fdb_dirty {
            match self.fdb.get(mac) {
                Some(dst) => set.push((*mac, *dst)),
                None => delete.push(*mac),
            }
        }
        let settled = self.write_fdb(h, &spec.name, index, &set, &delete, report)?;
        for mac in &settled.done {
            self.fdb_dirty.remove(mac);
        }
        match settled.first_error {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Deletes the entries of `delete`, then writes those of `set`, as one pipelined batch;
    /// counts them in the report as they succeed. A deletion of an entry that is already gone
    /// succeeds.
    fn write_fdb(
        &mut self,
        h: &RtnlHandle,
        dev: &str,
        index: u32,
        set: &[(Mac, IpAddr)],
        delete: &[Mac],
        report: &mut VxlanReport,
    ) -> Result<FdbSettled> {
        let mut batch = Batch::new();
        for mac in delete {
            self.stats.fdb_writes += 1;
            batch.push(
                RouteNetlinkMessage::DelNeighbour(fdb_entry(index, *mac, None)),
                0,
            );
        }
        for (mac, dst) in set {
            self.stats.fdb_writes += 1;
            // `bridge fdb replace MAC dev DEV dst DST self permanent`.
            batch.push(
                RouteNetlinkMessage::NewNeighbour(fdb_entry(index, *mac, Some(*dst))),
                NLM_F_CREATE | NLM_F_REPLACE,
            );
        }
        let mut outcomes = h.write_batch(&mut batch)?.into_iter();
        let mut settled = FdbSettled::default();
        for (mac, outcome) in delete.iter().zip(outcomes.by_ref()) {
            let result = outcome.map_err(|f| {
                RtnlError::batch(
                    "deleting FDB entry",
                    format!("{} on {dev}", fmt_mac(mac)),
                    f,
                )
            });
            match result {
                // Already gone (ENOENT) is what was wanted.
                Err(err) if !err.is_vanished_interface() => {
                    settled.first_error.get_or_insert(err);
                }
                _ => {
                    report.fdb_deleted += 1;
                    settled.done.push(*mac);
                }
            }
        }
        for ((mac, dst), outcome) in set.iter().zip(outcomes) {
            match outcome {
                Ok(()) => {
                    report.fdb_set += 1;
                    settled.done.push(*mac);
                }
                Err(f) => {
                    settled.first_error.get_or_insert(RtnlError::batch(
                        "setting FDB entry",
                        format!("{} dst {dst} on {dev}", fmt_mac(mac)),
                        f,
                    ));
                }
            }
        }
        Ok(settled)
    }
}

/// What a batch of FDB writes achieved: the entries done, and the first failure.
#[derive(Debug, Default)]
struct FdbSettled {
    done: Vec<Mac>,
    first_error: Option<RtnlError>,
}

/// A permanent FDB entry on the device `index` (`NTF_SELF`), as the `rtnetlink` handle builds
/// it: with its remote address `dst` to write it, without to delete it.
fn fdb_entry(index: u32, mac: Mac, dst: Option<IpAddr>) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Bridge;
    msg.header.ifindex = index;
    msg.header.flags = NeighbourFlags::Own;
    msg.header.state = NeighbourState::Permanent;
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    if let Some(dst) = dst {
        msg.header.kind = RouteType::Unspec;
        msg.attributes
            .push(NeighbourAttribute::Destination(match dst {
                IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
                IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
            }));
    }
    msg
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(m: &Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The VXLAN attributes of an existing link, as far as the spec compares them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Existing {
    index: u32,
    is_vxlan: bool,
    vni: Option<u32>,
    link: Option<u32>,
    local: Option<IpAddr>,
    port: Option<u16>,
    mac: Vec<u8>,
    mtu: Option<u32>,
    admin_up: bool,
}

fn existing(msg: &LinkMessage) -> Existing {
    let mut e = Existing {
        index: msg.header.index,
        admin_up: msg.header.flags.contains(LinkFlags::Up),
        ..Existing::default()
    };
    for a in &msg.attributes {
        match a {
            LinkAttribute::Address(m) => e.mac = m.clone(),
            LinkAttribute::Mtu(m) => e.mtu = Some(*m),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(InfoKind::Vxlan) => e.is_vxlan = true,
                        LinkInfo::Data(InfoData::Vxlan(vs)) => {
                            for v in vs {
                                match v {
                                    InfoVxlan::Id(x) => e.vni = Some(*x),
                                    InfoVxlan::Link(x) => e.link = Some(*x),
                                    InfoVxlan::Local(x) => e.local = Some(IpAddr::V4(*x)),
                                    InfoVxlan::Local6(x) => e.local = Some(IpAddr::V6(*x)),
                                    InfoVxlan::Port(x) => e.port = Some(*x),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    e
}

/// Why an existing link cannot serve as the device (`None`: it can), in the order Felix checks.
fn incompatible(e: &Existing, spec: &VxlanSpec, parent: u32) -> Option<String> {
    if !e.is_vxlan {
        return Some("not a VXLAN device".into());
    }
    if e.vni != Some(spec.vni) {
        return Some(format!("VNI {:?} ≠ {}", e.vni, spec.vni));
    }
    if e.link != Some(parent) {
        return Some(format!(
            "parent index {:?} ≠ {parent} ({})",
            e.link, spec.parent
        ));
    }
    if e.local != Some(spec.local) {
        return Some(format!("local {:?} ≠ {}", e.local, spec.local));
    }
    if e.port != Some(spec.port) {
        return Some(format!("port {:?} ≠ {}", e.port, spec.port));
    }
    if e.mac != spec.mac {
        return Some(format!("MAC {:02x?} ≠ {}", e.mac, fmt_mac(&spec.mac)));
    }
    None
}

/// Creates or corrects the device; its index, or `None` when the parent is missing.
async fn ensure_device(
    h: &RtnlHandle,
    spec: &VxlanSpec,
    report: &mut VxlanReport,
) -> Result<Option<u32>> {
    let Some(parent) = get_link(h, &spec.parent).await? else {
        return Ok(None);
    };
    let mut current = super::link::get_link_message(h, &spec.name)
        .await?
        .map(|m| existing(&m));
    if let Some(e) = &current {
        if let Some(why) = incompatible(e, spec, parent.index) {
            h.handle()
                .link()
                .del(e.index)
                .execute()
                .await
                .map_err(|err| RtnlError::kernel("deleting incompatible link", &spec.name, err))?;
            report.recreated = Some(why);
            current = None;
        }
    }
    if current.is_none() {
        let mut b = LinkVxlan::new(&spec.name, spec.vni)
            .dev(parent.index)
            .port(spec.port)
            .learning(false)
            .address(spec.mac.to_vec());
        b = match spec.local {
            IpAddr::V4(a) => b.local(a),
            IpAddr::V6(a) => b.local6(a),
        };
        if let Some(mtu) = spec.mtu {
            b = b.mtu(mtu);
        }
        h.handle()
            .link()
            .add(b.build())
            .execute()
            .await
            .map_err(|e| RtnlError::kernel("creating VXLAN device", &spec.name, e))?;
        report.created = true;
        current = super::link::get_link_message(h, &spec.name)
            .await?
            .map(|m| existing(&m));
    }
    let Some(e) = current else {
        return Err(RtnlError::Unexpected {
            op: "creating VXLAN device",
            what: format!("{} is missing right after it was created", spec.name),
        });
    };
    if let Some(mtu) = spec.mtu.filter(|m| e.mtu != Some(*m)) {
        h.handle()
            .link()
            .set(LinkUnspec::new_with_index(e.index).mtu(mtu).build())
            .execute()
            .await
            .map_err(|err| RtnlError::kernel("setting MTU of", &spec.name, err))?;
        report.corrected.push(format!("mtu {mtu}"));
    }
    ensure_address(h, spec, e.index, report).await?;
    if !e.admin_up {
        h.handle()
            .link()
            .set(LinkUnspec::new_with_index(e.index).up().build())
            .execute()
            .await
            .map_err(|err| RtnlError::kernel("setting link up", &spec.name, err))?;
        if !report.created {
            report.corrected.push("up".into());
        }
    }
    Ok(Some(e.index))
}

/// The spec's address is the device's only address of its family (IPv6 link-local stays).
async fn ensure_address(
    h: &RtnlHandle,
    spec: &VxlanSpec,
    index: u32,
    report: &mut VxlanReport,
) -> Result<()> {
    let want = IpNet::from(spec.addr);
    let done = set_sole_address(h, &spec.name, index, want.addr().is_ipv6(), Some(want)).await?;
    report
        .corrected
        .extend(done.removed.iter().map(|a| format!("-{a}")));
    if done.added && !report.created {
        report.corrected.push(format!("+{want}"));
    }
    Ok(())
}

/// The permanent FDB entries on device `index` that carry a MAC and a destination (also what
/// `felix-nft demo --cluster` reads back).
pub async fn dump_fdb(h: &RtnlHandle, index: u32) -> Result<BTreeMap<Mac, IpAddr>> {
    let msgs: Vec<NeighbourMessage> = h
        .handle()
        .neighbours()
        .get()
        .set_address_family(AddressFamily::Bridge)
        .execute()
        .try_collect()
        .await
        .map_err(|e| RtnlError::kernel("dumping", "the bridge FDB", e))?;
    let mut out = BTreeMap::new();
    for m in msgs {
        // The VXLAN driver reports its static entries as NUD_PERMANENT|NUD_NOARP.
        const NUD_PERMANENT: u16 = 0x80;
        if m.header.ifindex != index || u16::from(m.header.state) & NUD_PERMANENT == 0 {
            continue;
        }
        let mut mac = None;
        let mut dst = None;
        for a in &m.attributes {
            match a {
                NeighbourAttribute::LinkLayerAddress(l) => mac = <Mac>::try_from(&l[..]).ok(),
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                    dst = Some(IpAddr::V4(*v4))
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                    dst = Some(IpAddr::V6(*v6))
                }
                // In an AF_BRIDGE message the parser cannot tell the address family: by length.
                NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                    dst = match b.len() {
                        4 => <[u8; 4]>::try_from(&b[..]).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(&b[..]).ok().map(IpAddr::from),
                        _ => None,
                    }
                }
                _ => {}
            }
        }
        if let (Some(mac), Some(dst)) = (mac, dst) {
            out.insert(mac, dst);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FDB requests of a batch are the messages the `rtnetlink` handle built for the same
    /// entries (building one sends nothing).
    #[tokio::test]
    async fn fdb_requests_are_the_handles_messages() {
        let (_conn, handle, _) = rtnetlink::new_connection().unwrap();
        let mac = [0x66, 1, 2, 3, 4, 5];
        for dst in ["172.31.0.7", "fd00::7"] {
            let dst: IpAddr = dst.parse().unwrap();
            let mut req = handle
                .neighbours()
                .add_bridge(9, &mac)
                .destination(dst)
                .flags(NeighbourFlags::Own)
                .state(NeighbourState::Permanent)
                .replace();
            assert_eq!(&fdb_entry(9, mac, Some(dst)), req.message_mut());
        }
        let mut del = NeighbourMessage::default();
        del.header.family = AddressFamily::Bridge;
        del.header.ifindex = 9;
        del.header.flags = NeighbourFlags::Own;
        del.header.state = NeighbourState::Permanent;
        del.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        assert_eq!(fdb_entry(9, mac, None), del);
    }

    fn spec() -> VxlanSpec {
        VxlanSpec {
            name: "vxlan.calico".into(),
            vni: 4096,
            port: 4789,
            parent: "eth0".into(),
            local: "172.31.0.10".parse().unwrap(),
            mac: [0x66, 1, 2, 3, 4, 5],
            mtu: None,
            addr: "10.65.0.0".parse().unwrap(),
        }
    }

    #[test]
    fn an_fdb_change_dirties_only_the_entries_it_touches() {
        let mut s = VxlanSyncer::new();
        let a = [0x66, 0, 0, 0, 0, 1];
        let b = [0x66, 0, 0, 0, 0, 2];
        let c = [0x66, 0, 0, 0, 0, 3];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        s.set_fdb([(a, ip("172.31.0.11")), (b, ip("172.31.0.12"))]);
        s.fdb_dirty.clear();
        s.set_fdb([
            (a, ip("172.31.0.11")),
            (b, ip("172.31.0.13")),
            (c, ip("172.31.0.14")),
        ]);
        assert_eq!(s.fdb_dirty, BTreeSet::from([b, c]));
        s.fdb_dirty.clear();
        s.set_fdb([(b, ip("172.31.0.13")), (c, ip("172.31.0.14"))]);
        assert_eq!(s.fdb_dirty, BTreeSet::from([a]));
        // One entry at a time, the same way.
        s.fdb_dirty.clear();
        s.set_fdb_entry(b, Some(ip("172.31.0.13")));
        assert!(s.fdb_dirty.is_empty(), "unchanged");
        s.set_fdb_entry(b, None);
        s.set_fdb_entry(a, Some(ip("172.31.0.11")));
        assert_eq!(s.fdb_dirty, BTreeSet::from([a, b]));
        assert_eq!(s.fdb.len(), 2);
    }

    #[test]
    fn incompatibility_is_found_field_by_field() {
        let s = spec();
        let good = Existing {
            index: 9,
            is_vxlan: true,
            vni: Some(4096),
            link: Some(2),
            local: Some(s.local),
            port: Some(4789),
            mac: s.mac.to_vec(),
            mtu: Some(1450),
            admin_up: true,
        };
        assert_eq!(incompatible(&good, &s, 2), None);
        assert!(incompatible(&good, &s, 3).is_some(), "parent moved");
        for bad in [
            Existing {
                vni: Some(1),
                ..good.clone()
            },
            Existing {
                port: Some(8472),
                ..good.clone()
            },
            Existing {
                mac: vec![0x66, 0, 0, 0, 0, 0],
                ..good.clone()
            },
            Existing {
                local: Some("172.31.0.99".parse().unwrap()),
                ..good.clone()
            },
            Existing {
                is_vxlan: false,
                ..good.clone()
            },
        ] {
            assert!(incompatible(&bad, &s, 2).is_some(), "{bad:?}");
        }
    }
}
