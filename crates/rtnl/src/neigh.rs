//! Static neighbour entries (§15): a permanent IPv4 → MAC entry per workload address on
//! its interface, so the host needs no ARP round trip (and VMs with `arp_ignore=2` work).
//!
//! Entries are written with "neigh set" semantics (NLM_F_CREATE|NLM_F_REPLACE, NUD_PERMANENT) and
//! re-asserted whenever the caller says the interface changed (an admin down flushes even
//! permanent entries) and on every resync, because other agents (dnsmasq) overwrite them. On a
//! resync, permanent entries on a managed interface that are not desired are deleted; entries on
//! other interfaces are never touched.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use futures::TryStreamExt;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::RouteType;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::batch::{Batch, Outcome};
use super::link::get_link;
use super::{Result, RtnlError, RtnlHandle};

/// A MAC address.
pub type Mac = [u8; 6];

/// What one apply did.
#[derive(Debug, Default)]
pub struct NeighReport {
    /// Entries written (created or re-asserted): (interface, address).
    pub set: Vec<(String, IpAddr)>,
    /// Entries deleted.
    pub deleted: Vec<(String, IpAddr)>,
    /// Interfaces absent or down; their entries are written when the caller reports them up.
    pub parked: Vec<String>,
    /// Failures (one per request that failed); the interface stays dirty and the next apply
    /// retries.
    pub errors: Vec<RtnlError>,
}

/// Desired permanent neighbours per interface, and the kernel writes to get there.
#[derive(Debug, Default)]
pub struct NeighSyncer {
    desired: BTreeMap<String, BTreeMap<IpAddr, Mac>>,
    /// Entries to delete: interface → addresses no longer wanted.
    to_delete: BTreeMap<String, BTreeSet<IpAddr>>,
    /// Interfaces whose every entry must be written (they flapped, or a write failed).
    dirty: BTreeSet<String>,
    /// Entries added or changed since the last apply, per interface: an apply writes only these
    /// (a VTEP more on a device with a thousand costs one write).
    dirty_entries: BTreeMap<String, BTreeSet<IpAddr>>,
    resync: bool,
    stats: NeighSyncStats,
}

/// Counters of the requests a [`NeighSyncer`] sent, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NeighSyncStats {
    /// Neighbour dumps (one per resync).
    pub dumps: u64,
    /// Single-link lookups (RTM_GETLINK by name), one per interface an apply looks at.
    pub link_gets: u64,
    /// Writes sent: RTM_NEWNEIGH and RTM_DELNEIGH.
    pub writes: u64,
}

impl NeighSyncer {
    /// An empty syncer; the first apply is a resync.
    pub fn new() -> NeighSyncer {
        NeighSyncer {
            resync: true,
            ..NeighSyncer::default()
        }
    }

    /// Sets the permanent neighbours wanted on `ifname`, replacing the previous set. Addresses
    /// dropped from the set are deleted by the next apply. No kernel I/O.
    pub fn set_neighbours(
        &mut self,
        ifname: &str,
        entries: impl IntoIterator<Item = (IpAddr, Mac)>,
    ) {
        let new: BTreeMap<IpAddr, Mac> = entries.into_iter().collect();
        let old = self.desired.remove(ifname).unwrap_or_default();
        let gone: BTreeSet<IpAddr> = old
            .keys()
            .filter(|ip| !new.contains_key(ip))
            .copied()
            .collect();
        if !gone.is_empty() {
            self.to_delete
                .entry(ifname.to_string())
                .or_default()
                .extend(gone);
        }
        if let Some(pending) = self.to_delete.get_mut(ifname) {
            pending.retain(|ip| !new.contains_key(ip));
        }
        let changed: BTreeSet<IpAddr> = new
            .iter()
            .filter(|(ip, mac)| old.get(ip) != Some(mac))
            .map(|(ip, _)| *ip)
            .collect();
        if !changed.is_empty() {
            self.dirty_entries
                .entry(ifname.to_string())
                .or_default()
                .extend(changed);
        }
        if !new.is_empty() {
            self.desired.insert(ifname.to_string(), new);
        }
    }

    /// Like [`NeighSyncer::set_neighbours`], without copying anything when the entries of
    /// `ifname` are unchanged (the daemon restates every interface on every apply).
    pub fn update_neighbours(&mut self, ifname: &str, entries: &[(IpAddr, Mac)]) {
        let current = self.desired.get(ifname);
        let unchanged = match current {
            None => entries.is_empty(),
            // Duplicate addresses collapse in the map (last wins), so compare as a map would.
            Some(cur) => {
                cur.len() == entries.len()
                    && entries.iter().all(|(ip, mac)| cur.get(ip) == Some(mac))
            }
        };
        if !unchanged {
            self.set_neighbours(ifname, entries.iter().copied());
        }
    }

    /// Sets (or with `None` drops) the one entry of `ip` on `ifname`, leaving the interface's
    /// other entries as they are; written (or deleted) by the next apply if it differs. No
    /// kernel I/O.
    pub fn set_entry(&mut self, ifname: &str, ip: IpAddr, mac: Option<Mac>) {
        let entries = self.desired.get_mut(ifname);
        let old = match (entries, mac) {
            (Some(e), Some(m)) => e.insert(ip, m),
            (None, Some(m)) => {
                self.desired
                    .insert(ifname.to_string(), BTreeMap::from([(ip, m)]));
                None
            }
            (Some(e), None) => {
                let old = e.remove(&ip);
                if e.is_empty() {
                    self.desired.remove(ifname);
                }
                old
            }
            (None, None) => None,
        };
        if old == mac {
            return;
        }
        match mac {
            Some(_) => {
                if let Some(pending) = self.to_delete.get_mut(ifname) {
                    pending.remove(&ip);
                    if pending.is_empty() {
                        self.to_delete.remove(ifname);
                    }
                }
                self.dirty_entries
                    .entry(ifname.to_string())
                    .or_default()
                    .insert(ip);
            }
            None => {
                self.to_delete
                    .entry(ifname.to_string())
                    .or_default()
                    .insert(ip);
            }
        }
    }

    /// Interfaces that currently have desired entries.
    pub fn managed_ifaces(&self) -> impl Iterator<Item = &str> {
        self.desired.keys().map(String::as_str)
    }

    /// The requests sent so far.
    pub fn stats(&self) -> NeighSyncStats {
        self.stats
    }

    /// The interface went down/up or was re-created: re-assert its entries on the next apply.
    pub fn iface_changed(&mut self, ifname: &str) {
        if self.desired.contains_key(ifname) {
            self.dirty.insert(ifname.to_string());
        }
    }

    /// Re-assert everything and delete undesired permanent entries on managed interfaces.
    pub fn request_resync(&mut self) {
        self.resync = true;
    }

    /// True when an apply has work to do.
    pub fn needs_apply(&self) -> bool {
        self.resync
            || !self.dirty.is_empty()
            || !self.dirty_entries.is_empty()
            || !self.to_delete.is_empty()
    }

    /// Writes what is dirty (or everything, on resync).
    pub async fn apply(&mut self, h: &RtnlHandle) -> Result<NeighReport> {
        let mut report = NeighReport::default();
        let resync = std::mem::take(&mut self.resync);
        let ifaces: BTreeSet<String> = if resync {
            self.desired
                .keys()
                .chain(self.to_delete.keys())
                .cloned()
                .collect()
        } else {
            self.dirty
                .iter()
                .chain(self.dirty_entries.keys())
                .chain(self.to_delete.keys())
                .cloned()
                .collect()
        };
        let kernel = if resync {
            self.stats.dumps += 1;
            Some(dump_permanent(h).await?)
        } else {
            None
        };
        let whole = std::mem::take(&mut self.dirty);
        let mut entries = std::mem::take(&mut self.dirty_entries);
        for ifname in ifaces {
            // Outside a resync or a flap only the entries that changed are written: an
            // interface here only for a deletion writes none.
            let only = if resync || whole.contains(&ifname) {
                None
            } else {
                Some(entries.remove(&ifname).unwrap_or_default())
            };
            if let Err(e) = self
                .apply_iface(h, &ifname, kernel.as_ref(), only.as_ref(), &mut report)
                .await
            {
                self.dirty.insert(ifname.clone());
                report.errors.push(e);
            }
        }
        if !report.errors.is_empty() {
            self.resync = true;
        }
        Ok(report)
    }

    async fn apply_iface(
        &mut self,
        h: &RtnlHandle,
        ifname: &str,
        kernel: Option<&Vec<(u32, IpAddr)>>,
        only: Option<&BTreeSet<IpAddr>>,
        report: &mut NeighReport,
    ) -> Result<()> {
        self.stats.link_gets += 1;
        let link = match get_link(h, ifname).await? {
            Some(l) => l,
            None => {
                // Gone: its entries went with it; nothing left to delete.
                self.to_delete.remove(ifname);
                report.parked.push(ifname.to_string());
                return Ok(());
            }
        };
        let empty = BTreeMap::new();
        let desired = self.desired.get(ifname).unwrap_or(&empty);
        // Only the entries asked for are copied out: one changed entry on a device with a
        // thousand costs one lookup.
        let wanted: Vec<(IpAddr, Mac)> = match only {
            Some(o) => o
                .iter()
                .filter_map(|ip| desired.get(ip).map(|m| (*ip, *m)))
                .collect(),
            None => desired.iter().map(|(ip, m)| (*ip, *m)).collect(),
        };
        let mut delete: BTreeSet<IpAddr> = kernel
            .map(|kernel| {
                kernel
                    .iter()
                    .filter(|(idx, ip)| {
                        *idx == link.index && ip.is_ipv4() && !desired.contains_key(ip)
                    })
                    .map(|(_, ip)| *ip)
                    .collect()
            })
            .unwrap_or_default();
        delete.extend(self.to_delete.remove(ifname).unwrap_or_default());
        // The deletions and then the writes, as one pipelined batch.
        let mut batch = Batch::new();
        let delete: Vec<IpAddr> = delete.into_iter().collect();
        for ip in &delete {
            let mut msg = NeighbourMessage::default();
            msg.header.family = family(ip);
            msg.header.ifindex = link.index;
            msg.attributes
                .push(NeighbourAttribute::Destination(neigh_addr(*ip)));
            self.stats.writes += 1;
            batch.push(RouteNetlinkMessage::DelNeighbour(msg), 0);
        }
        let mut set = Vec::new();
        if link.admin_up {
            for (ip, mac) in wanted {
                self.stats.writes += 1;
                batch.push(
                    RouteNetlinkMessage::NewNeighbour(permanent_entry(link.index, ip, &mac)),
                    NLM_F_CREATE | NLM_F_REPLACE,
                );
                set.push(ip);
            }
        } else if !wanted.is_empty() {
            report.parked.push(ifname.to_string());
        }
        let outcomes = match h.write_batch(&mut batch) {
            Ok(o) => o.into_iter(),
            Err(e) => {
                // Nothing was sent: the deletions are still to do.
                if !delete.is_empty() {
                    self.to_delete
                        .entry(ifname.to_string())
                        .or_default()
                        .extend(delete);
                }
                return Err(e);
            }
        };
        if !self.settle(ifname, (delete, set), outcomes, report) {
            self.dirty.insert(ifname.to_string());
        }
        Ok(())
    }

    /// Takes each write's outcome into the report; a failed delete stays to do. False when a
    /// write failed (the interface is then looked at again).
    fn settle(
        &mut self,
        ifname: &str,
        (delete, set): (Vec<IpAddr>, Vec<IpAddr>),
        mut outcomes: impl Iterator<Item = Outcome>,
        report: &mut NeighReport,
    ) -> bool {
        let mut failed = false;
        for (ip, outcome) in delete.into_iter().zip(outcomes.by_ref()) {
            match outcome {
                Ok(()) => report.deleted.push((ifname.to_string(), ip)),
                Err(f) => {
                    let err =
                        RtnlError::batch("deleting neighbour", format!("{ip} on {ifname}"), f);
                    if !err.is_vanished_interface() {
                        self.to_delete
                            .entry(ifname.to_string())
                            .or_default()
                            .insert(ip);
                        report.errors.push(err);
                        failed = true;
                    }
                }
            }
        }
        for (ip, outcome) in set.into_iter().zip(outcomes) {
            match outcome {
                Ok(()) => report.set.push((ifname.to_string(), ip)),
                Err(f) => {
                    report.errors.push(RtnlError::batch(
                        "setting permanent neighbour",
                        format!("{ip} on {ifname}"),
                        f,
                    ));
                    failed = true;
                }
            }
        }
        !failed
    }
}

/// `ip neigh replace IP lladdr MAC dev IFINDEX nud permanent`, as the `rtnetlink` handle builds it.
fn permanent_entry(ifindex: u32, ip: IpAddr, mac: &Mac) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = family(&ip);
    msg.header.ifindex = ifindex;
    msg.header.state = NeighbourState::Permanent;
    msg.header.kind = RouteType::Unspec;
    msg.attributes
        .push(NeighbourAttribute::Destination(neigh_addr(ip)));
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    msg
}

/// One permanent neighbour entry as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermanentNeighbour {
    pub ifindex: u32,
    pub ip: IpAddr,
    /// The link-layer address, when the entry carries one of 6 bytes.
    pub mac: Option<Mac>,
}

/// Every permanent neighbour entry of the handle's namespace, both families (`felix-nft dump`,
/// `plan`, `cleanup`: the caller keeps those on its workload interfaces).
pub async fn list_permanent(h: &RtnlHandle) -> Result<Vec<PermanentNeighbour>> {
    h.handle()
        .neighbours()
        .get()
        .execute()
        .try_filter_map(|m| std::future::ready(Ok(permanent(&m))))
        .try_collect()
        .await
        .map_err(|e| RtnlError::kernel("dumping", "neighbours", e))
}

/// A permanent entry, reduced (`None` for any other state). Dumps reduce each message as it
/// arrives instead of collecting them parsed first.
fn permanent(m: &NeighbourMessage) -> Option<PermanentNeighbour> {
    // A dump of every family also lists bridge FDB entries (a VXLAN device's are permanent and
    // carry the remote node's address): those are not neighbours.
    if m.header.state != NeighbourState::Permanent
        || !matches!(m.header.family, AddressFamily::Inet | AddressFamily::Inet6)
    {
        return None;
    }
    let mut ip = None;
    let mut mac = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                ip = Some(IpAddr::V4(*v4))
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                ip = Some(IpAddr::V6(*v6))
            }
            NeighbourAttribute::LinkLayerAddress(l) => mac = <Mac>::try_from(&l[..]).ok(),
            _ => {}
        }
    }
    Some(PermanentNeighbour {
        ifindex: m.header.ifindex,
        ip: ip?,
        mac,
    })
}

/// All permanent neighbour entries: (interface index, address).
async fn dump_permanent(h: &RtnlHandle) -> Result<Vec<(u32, IpAddr)>> {
    Ok(list_permanent(h)
        .await?
        .into_iter()
        .map(|n| (n.ifindex, n.ip))
        .collect())
}

fn family(ip: &IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn neigh_addr(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's neighbour write is the message the `rtnetlink` handle built for the same entry
    /// (building one sends nothing).
    #[tokio::test]
    async fn permanent_entries_are_the_handles_messages() {
        let (_conn, handle, _) = rtnetlink::new_connection().unwrap();
        let mac = [2, 0, 0, 0, 0, 1];
        for ip in ["10.65.0.1", "fd00::1"] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut req = handle
                .neighbours()
                .add(4, ip)
                .link_layer_address(&mac)
                .state(NeighbourState::Permanent)
                .replace();
            assert_eq!(&permanent_entry(4, ip, &mac), req.message_mut());
        }
    }

    #[test]
    fn dropping_an_address_queues_its_deletion() {
        let mut s = NeighSyncer::new();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        s.set_neighbours("cali1", [(a, [2, 0, 0, 0, 0, 1]), (b, [2, 0, 0, 0, 0, 2])]);
        s.set_neighbours("cali1", [(a, [2, 0, 0, 0, 0, 1])]);
        assert_eq!(s.to_delete["cali1"], BTreeSet::from([b]));
        // Re-adding cancels the deletion.
        s.set_neighbours("cali1", [(a, [2, 0, 0, 0, 0, 1]), (b, [2, 0, 0, 0, 0, 3])]);
        assert!(s.to_delete["cali1"].is_empty());
        s.set_neighbours("cali1", []);
        assert!(!s.desired.contains_key("cali1"));
        assert_eq!(s.to_delete["cali1"].len(), 2);
    }

    #[test]
    fn a_changed_entry_dirties_only_itself() {
        let mut s = NeighSyncer::new();
        let ip = |n: u8| IpAddr::from([10, 65, n, 0]);
        let entries: Vec<(IpAddr, Mac)> =
            (0..100).map(|n| (ip(n), [0x66, 0, 0, 0, 0, n])).collect();
        s.update_neighbours("vxlan.calico", &entries);
        s.dirty_entries.clear();
        let mut more = entries.clone();
        more.push((ip(200), [0x66, 0, 0, 0, 0, 200]));
        more[3].1 = [0x66, 0, 0, 0, 0, 0xaa];
        s.update_neighbours("vxlan.calico", &more);
        assert_eq!(
            s.dirty_entries["vxlan.calico"],
            BTreeSet::from([ip(3), ip(200)])
        );
        assert!(
            s.dirty.is_empty(),
            "the interface as a whole is not rewritten"
        );
    }

    #[test]
    fn one_entry_is_set_and_dropped_alone() {
        let mut s = NeighSyncer::new();
        let ip = |n: u8| IpAddr::from([10, 65, n, 0]);
        let dev = "vxlan.calico";
        s.update_neighbours(dev, &[(ip(1), [0x66, 0, 0, 0, 0, 1])]);
        s.dirty_entries.clear();
        // The same entry again: nothing to write.
        s.set_entry(dev, ip(1), Some([0x66, 0, 0, 0, 0, 1]));
        assert!(s.dirty_entries.is_empty());
        s.set_entry(dev, ip(2), Some([0x66, 0, 0, 0, 0, 2]));
        assert_eq!(s.dirty_entries[dev], BTreeSet::from([ip(2)]));
        s.set_entry(dev, ip(1), None);
        assert_eq!(s.to_delete[dev], BTreeSet::from([ip(1)]));
        // Wanted again before the apply: written, not deleted.
        s.set_entry(dev, ip(1), Some([0x66, 0, 0, 0, 0, 3]));
        assert!(!s.to_delete.contains_key(dev));
        assert_eq!(s.desired[dev].len(), 2);
        // Dropping what was never wanted does nothing.
        s.set_entry(dev, ip(9), None);
        assert!(!s.to_delete.contains_key(dev));
    }
}
