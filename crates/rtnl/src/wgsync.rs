//! One WireGuard device brought to a spec: the link (kind `wireguard`, MTU, up), its address,
//! its private key (made once in the kernel, never rotated), listen port and fwmark, its peers,
//! the routes of its routing table and the rule that sends unmarked traffic there, added last;
//! or, disabled, all of that removed. Knows WireGuard devices, tables and rules, not Calico.
//!
//! Invariants:
//! - Nothing touches the kernel before [`WgSyncer::apply`].
//! - The steady state is O(change): the caller states the device whole once, then only the
//!   peers and route groups that changed ([`WgWanted::Changed`]); the peers the device holds are
//!   believed, and a change is written as the difference (a peer added, removed, or its allowed
//!   IPs, endpoint or keepalive changed), with no read of the device. A resync (the first apply,
//!   the refresh timer, any failure, the device reported changed or re-created) reads the device
//!   and repairs what differs: key, port, fwmark, peers, address, table and rule.
//! - The private key lives only in the device: a device with none gets one; a device that was
//!   deleted comes back with a new one, and the report says so.
//! - The rule is written only after the device, its peers and the table routes are in place, so
//!   traffic is never sent to a half-built table.
//! - A kernel without the module: the report says `unsupported`, and nothing is retried before
//!   the next resync.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use ipnet::IpNet;
use netlink_packet_route::link::InfoKind;

use super::link::{get_link_message, set_sole_address, DeviceState};
use super::routes::{RouteOwnership, RouteSpec, RouteSyncer};
use super::rule::{sync_table_rules, RuleSpec};
use super::wireguard::{
    create_device, generate_private_key, Key, PeerUpdate, WgDevice, WgSocket, WgUpdate,
};
use super::{IpFamily, Result, RtnlError, RtnlHandle};
use crate::netns::NetNs;

/// One peer as wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub endpoint: SocketAddr,
    pub allowed_ips: BTreeSet<IpNet>,
    /// Seconds between keepalives; 0 is off.
    pub keepalive: u16,
}

/// A device as wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgSpec {
    pub name: String,
    pub mtu: u32,
    pub port: u16,
    pub fwmark: u32,
    /// The device's one address of its family (`None`: none).
    pub addr: Option<IpNet>,
    pub peers: BTreeMap<Key, PeerSpec>,
    /// The routes of the table (`rule.table`), on the device or throw, in groups (one per
    /// node): a group's routes are restated together.
    pub routes: BTreeMap<String, Vec<RouteSpec>>,
    pub rule: RuleSpec,
}

/// Peers and route groups that changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WgChanges {
    /// A peer as now wanted; `None`: not wanted.
    pub peers: BTreeMap<Key, Option<PeerSpec>>,
    /// A route group as now wanted; empty: the group goes.
    pub routes: BTreeMap<String, Vec<RouteSpec>>,
}

/// What the caller wants of one family's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WgWanted {
    /// No device: remove `name`, the rules to `table` and our routes in it.
    Disabled { name: String, table: u32 },
    /// The whole device: peers and route groups not named are not wanted.
    Enabled(WgSpec),
    /// The device as `head` says (its `peers` and `routes` are not read), and the peers and
    /// route groups that changed since the last `Enabled` or `Changed`. Without an `Enabled`
    /// before it, it is taken whole.
    Changed { head: WgSpec, changes: WgChanges },
}

impl WgWanted {
    /// The device's name.
    pub fn name(&self) -> &str {
        match self {
            WgWanted::Disabled { name, .. } => name,
            WgWanted::Enabled(s) | WgWanted::Changed { head: s, .. } => &s.name,
        }
    }
}

/// What one apply did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WgReport {
    /// The device was created (at start, or after it was deleted).
    pub created: bool,
    /// The device was deleted (disabled).
    pub deleted: bool,
    /// A private key was generated.
    pub new_key: bool,
    /// Corrections: `mtu 1440`, `up`, `port 51820`, `fwmark 0x200000`, `+peer …`, `rule`, …
    pub corrected: Vec<String>,
    /// Peer changes written.
    pub peer_changes: usize,
    /// Table routes added, replaced or deleted.
    pub route_changes: usize,
    /// The kernel has no WireGuard.
    pub unsupported: bool,
}

/// One family's WireGuard device: what is wanted, what is believed, and the kernel writes.
#[derive(Debug)]
pub struct WgSyncer {
    family: IpFamily,
    want: Option<WgWanted>,
    sock: Option<WgSocket>,
    /// Read everything back and repair on the next apply.
    resync: bool,
    /// The peers the device holds, when not resyncing and not `believed_is_want`.
    believed: BTreeMap<Key, PeerSpec>,
    /// The device holds the wanted peers but for those in `touched` (kept so instead of a copy
    /// of them).
    believed_is_want: bool,
    /// With `believed_is_want`: each peer changed since the device was last written, as it
    /// was wanted then (and is held).
    touched: BTreeMap<Key, Option<PeerSpec>>,
    /// Route groups changed since they were last handed to the route syncer.
    groups_changed: BTreeSet<String>,
    /// The route syncer holds every wanted group but those in `groups_changed`.
    groups_fed: bool,
    /// The device's address, rule and link as last written (`None`: unknown).
    believed_addr: Option<Option<IpNet>>,
    believed_rule: Option<RuleSpec>,
    /// The link's index when it was last seen right (its spec unchanged since).
    link: Option<u32>,
    routes: Option<RouteSyncer>,
    public_key: Option<Key>,
    /// The disabled state was reached (nothing to do until a resync).
    disabled_done: bool,
    unsupported: bool,
}

impl WgSyncer {
    /// A syncer for `family`'s device.
    pub fn new(family: IpFamily) -> WgSyncer {
        WgSyncer {
            family,
            want: None,
            sock: None,
            resync: true,
            believed: BTreeMap::new(),
            believed_is_want: false,
            touched: BTreeMap::new(),
            groups_changed: BTreeSet::new(),
            groups_fed: false,
            believed_addr: None,
            believed_rule: None,
            link: None,
            routes: None,
            public_key: None,
            disabled_done: false,
            unsupported: false,
        }
    }

    /// Sets what is wanted. No kernel I/O.
    pub fn set(&mut self, want: WgWanted) {
        match want {
            WgWanted::Changed { head, changes } => self.change(head, changes),
            whole => self.set_whole(whole),
        }
    }

    fn set_whole(&mut self, want: WgWanted) {
        if self.want.as_ref() == Some(&want) {
            return;
        }
        let spec_of = |w: Option<&WgWanted>| match w {
            Some(WgWanted::Enabled(s)) => Some((s.name.clone(), s.mtu, s.rule.table)),
            _ => None,
        };
        let (was, now) = (spec_of(self.want.as_ref()), spec_of(Some(&want)));
        if was.as_ref().map(|w| (&w.0, w.1)) != now.as_ref().map(|n| (&n.0, n.1)) {
            // Another device or MTU: look at the link again.
            self.link = None;
        }
        if was.map(|w| w.2) != now.map(|n| n.2) || matches!(want, WgWanted::Disabled { .. }) {
            self.routes = None;
            self.resync = true;
        }
        if let (true, Some(WgWanted::Enabled(old))) = (self.believed_is_want, self.want.take()) {
            // What the device holds is what was wanted until now, but for the peers touched
            // since it was last written.
            self.believed = old.peers;
            for (k, held) in std::mem::take(&mut self.touched) {
                match held {
                    Some(p) => self.believed.insert(k, p),
                    None => self.believed.remove(&k),
                };
            }
        }
        self.believed_is_want = false;
        self.touched.clear();
        self.groups_fed = false;
        self.groups_changed.clear();
        self.want = Some(want);
        self.disabled_done = false;
    }

    /// Takes in what changed: the head whole, the peers and route groups named.
    fn change(&mut self, head: WgSpec, changes: WgChanges) {
        let Some(WgWanted::Enabled(spec)) = &mut self.want else {
            // Nothing to change: the head with the changes is the whole device.
            let mut spec = head;
            spec.peers = (changes.peers.into_iter())
                .filter_map(|(k, p)| Some((k, p?)))
                .collect();
            spec.routes = (changes.routes.into_iter())
                .filter(|(_, r)| !r.is_empty())
                .collect();
            return self.set_whole(WgWanted::Enabled(spec));
        };
        if (&spec.name, spec.mtu) != (&head.name, head.mtu) {
            self.link = None;
        }
        if spec.rule.table != head.rule.table {
            self.routes = None;
            self.resync = true;
        }
        let (peers, routes) = (
            std::mem::take(&mut spec.peers),
            std::mem::take(&mut spec.routes),
        );
        *spec = WgSpec {
            peers,
            routes,
            ..head
        };
        for (k, p) in changes.peers {
            let old = match &p {
                Some(p) => spec.peers.insert(k, p.clone()),
                None => spec.peers.remove(&k),
            };
            if old != p && self.believed_is_want {
                self.touched.entry(k).or_insert(old);
            }
        }
        for (g, r) in changes.routes {
            if r.is_empty() {
                spec.routes.remove(&g);
            } else {
                spec.routes.insert(g.clone(), r);
            }
            self.groups_changed.insert(g);
        }
        self.disabled_done = false;
    }

    /// The device was reported changed (appeared, vanished, went down): look at it again.
    pub fn device_changed(&mut self) {
        self.link = None;
        self.resync = true;
    }

    /// Read the device back and repair it on the next apply.
    pub fn request_resync(&mut self) {
        self.resync = true;
        self.unsupported = false;
        self.disabled_done = false;
    }

    /// The device's public key, as last read or made (`None`: no device, or disabled).
    pub fn public_key(&self) -> Option<Key> {
        self.public_key
    }

    /// Whether the kernel was found without WireGuard (until the next resync).
    pub fn unsupported(&self) -> bool {
        self.unsupported
    }

    /// Brings the kernel to what is wanted (`ns`: where `h` is, for the generic-netlink
    /// socket). On an error the next apply resyncs.
    pub async fn apply(&mut self, h: &RtnlHandle, ns: Option<&NetNs>) -> Result<WgReport> {
        let Some(want) = self.want.take() else {
            return Ok(WgReport::default());
        };
        let res = self.apply_wanted(h, ns, &want).await;
        self.want = Some(want);
        res
    }

    async fn apply_wanted(
        &mut self,
        h: &RtnlHandle,
        ns: Option<&NetNs>,
        want: &WgWanted,
    ) -> Result<WgReport> {
        let mut report = WgReport::default();
        let res = match want {
            WgWanted::Disabled { name, table } => {
                if self.disabled_done {
                    return Ok(report);
                }
                self.disable(h, name, *table, &mut report).await
            }
            // Never held: `set` folds changes into the whole device.
            WgWanted::Changed { .. } => return Ok(report),
            WgWanted::Enabled(spec) => {
                if self.unsupported {
                    report.unsupported = true;
                    return Ok(report);
                }
                self.enable(h, ns, spec, &mut report).await
            }
        };
        if let Err(e) = res {
            self.resync = true;
            self.link = None;
            if e.is_unsupported() {
                self.unsupported = true;
                self.public_key = None;
                report.unsupported = true;
                return Ok(report);
            }
            return Err(e);
        }
        Ok(report)
    }

    async fn disable(
        &mut self,
        h: &RtnlHandle,
        name: &str,
        table: u32,
        report: &mut WgReport,
    ) -> Result<()> {
        report.corrected.extend(
            (0..sync_table_rules(h, self.family, table, None).await?.deleted)
                .map(|_| "-rule".to_string()),
        );
        if let Some(msg) = get_link_message(h, name).await? {
            h.handle()
                .link()
                .del(msg.header.index)
                .execute()
                .await
                .or_else(|e| {
                    let e = RtnlError::kernel("deleting WireGuard device", name, e);
                    if e.is_vanished_interface() {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })?;
            report.deleted = true;
        }
        let routes = self.routes_for(name, table);
        let groups: Vec<String> = routes.groups().map(str::to_string).collect();
        for g in groups {
            routes.set_routes(g, Vec::new());
        }
        routes.request_resync();
        let rep = routes.apply(h).await?;
        report.route_changes += rep.changes();
        if let Some(e) = rep.errors.into_iter().next() {
            return Err(e);
        }
        self.public_key = None;
        self.believed.clear();
        self.believed_is_want = false;
        self.touched.clear();
        self.groups_fed = false;
        self.believed_addr = None;
        self.believed_rule = None;
        self.link = None;
        self.disabled_done = true;
        self.resync = false;
        Ok(())
    }

    fn routes_for(&mut self, name: &str, table: u32) -> &mut RouteSyncer {
        let family = self.family;
        self.routes.get_or_insert_with(|| {
            // The kernel reports an IPv6 throw route on `lo`.
            let ifaces = [name.to_string(), "lo".to_string()];
            RouteSyncer::new(family, table, RouteOwnership::exclusive(ifaces))
        })
    }

    fn socket(&mut self) -> Result<&mut WgSocket> {
        self.sock.as_mut().ok_or(RtnlError::Unexpected {
            op: "opening WireGuard socket",
            what: "no socket".into(),
        })
    }

    async fn enable(
        &mut self,
        h: &RtnlHandle,
        ns: Option<&NetNs>,
        spec: &WgSpec,
        report: &mut WgReport,
    ) -> Result<()> {
        let index = self.ensure_link(h, spec, report).await?;
        if self.sock.is_none() {
            self.sock = Some(WgSocket::open(ns)?);
        }
        let resync = self.resync;
        // Peers, key, port and fwmark over generic netlink.
        let res = if resync {
            self.resync_device(spec, report)
        } else {
            self.delta_device(spec, report)
        };
        if let Err(e) = res {
            self.sock = None;
            return Err(e);
        }
        if resync || self.believed_addr != Some(spec.addr) {
            let v6 = self.family == IpFamily::V6;
            let done = set_sole_address(h, &spec.name, index, v6, spec.addr).await?;
            report
                .corrected
                .extend(done.removed.iter().map(|a| format!("-{a}")));
            if done.added {
                report.corrected.extend(spec.addr.map(|a| format!("+{a}")));
            }
            self.believed_addr = Some(spec.addr);
        }
        let fed = self.groups_fed && self.routes.is_some();
        let changed = std::mem::take(&mut self.groups_changed);
        let routes = self.routes_for(&spec.name, spec.rule.table);
        if fed {
            for g in &changed {
                routes.update_routes(g, spec.routes.get(g).map_or(&[][..], Vec::as_slice));
            }
        } else {
            let gone: Vec<String> = (routes.groups())
                .filter(|g| !spec.routes.contains_key(*g))
                .map(str::to_string)
                .collect();
            for g in gone {
                routes.set_routes(g, Vec::new());
            }
            for (g, r) in &spec.routes {
                routes.update_routes(g, r);
            }
        }
        self.groups_fed = true;
        let routes = self.routes_for(&spec.name, spec.rule.table);
        if resync {
            routes.request_resync();
        }
        if report.created {
            routes.iface_changed(&spec.name);
        }
        let rep = routes.apply(h).await?;
        report.route_changes += rep.changes();
        if let Some(e) = rep.errors.into_iter().next() {
            return Err(e);
        }
        // Last: only now may traffic be sent to the table.
        if resync || self.believed_rule != Some(spec.rule) {
            let r = sync_table_rules(h, self.family, spec.rule.table, Some(&spec.rule)).await?;
            if r.added {
                report.corrected.push(format!("rule {}", spec.rule));
            }
            report
                .corrected
                .extend((0..r.deleted).map(|_| "-rule".to_string()));
            self.believed_rule = Some(spec.rule);
        }
        self.resync = false;
        Ok(())
    }

    /// Creates the link if it is missing, corrects its MTU and brings it up; its index.
    async fn ensure_link(
        &mut self,
        h: &RtnlHandle,
        spec: &WgSpec,
        report: &mut WgReport,
    ) -> Result<u32> {
        if let (Some(index), false) = (self.link, self.resync) {
            return Ok(index);
        }
        let mut msg = get_link_message(h, &spec.name).await?;
        if msg.is_none() {
            create_device(h, &spec.name).await?;
            report.created = true;
            report.corrected.push("created".into());
            msg = get_link_message(h, &spec.name).await?;
        }
        let Some(msg) = msg else {
            return Err(RtnlError::Unexpected {
                op: "creating WireGuard device",
                what: format!("{} is missing right after it was created", spec.name),
            });
        };
        let e = DeviceState::of(&msg);
        if e.kind != Some(InfoKind::Wireguard) {
            return Err(RtnlError::Unexpected {
                op: "configuring WireGuard device",
                what: format!("{} exists and is not a wireguard device", spec.name),
            });
        }
        if self.link.is_some_and(|i| i != e.index) {
            // Re-created behind our back: a new device, a new key.
            report.created = true;
        }
        if report.created {
            self.resync = true;
            self.believed.clear();
            self.believed_is_want = false;
            self.touched.clear();
            self.believed_addr = None;
        }
        let fixed = e.correct_mtu_and_up(h, &spec.name, spec.mtu).await?;
        report.corrected.extend(fixed);
        self.link = Some(e.index);
        Ok(e.index)
    }

    /// Reads the device and makes it the spec: key (made if missing), port, fwmark, peers.
    fn resync_device(&mut self, spec: &WgSpec, report: &mut WgReport) -> Result<()> {
        let dev = self.socket()?.get_device(&spec.name)?;
        let mut update = WgUpdate::default();
        if dev.listen_port != spec.port {
            update.listen_port = Some(spec.port);
            report.corrected.push(format!("port {}", spec.port));
        }
        if dev.fwmark != spec.fwmark {
            update.fwmark = Some(spec.fwmark);
            report.corrected.push(format!("fwmark {:#x}", spec.fwmark));
        }
        self.public_key = dev.public_key;
        if dev.private_key.is_none() || dev.public_key.is_none() {
            // A device without a key (a new one): the key first, alone with port and fwmark,
            // and the public key the kernel derived read back before any peer is there to be
            // read with it.
            update.private_key =
                Some(generate_private_key().map_err(|source| RtnlError::Genl {
                    op: "generating a private key for",
                    object: spec.name.clone(),
                    source,
                })?);
            report.new_key = true;
            self.socket()?.set_device(&spec.name, &update)?;
            update = WgUpdate::default();
            self.public_key = self.socket()?.get_device(&spec.name)?.public_key;
        }
        let have = device_peers(&dev);
        update.peers = peer_changes(&have, &spec.peers);
        report.peer_changes += update.peers.len();
        if update != WgUpdate::default() {
            self.socket()?.set_device(&spec.name, &update)?;
        }
        self.believed.clear();
        self.believed_is_want = true;
        self.touched.clear();
        Ok(())
    }

    /// Writes the difference between the believed peers and the wanted ones: of the touched
    /// peers alone when the device held the wanted ones before them.
    fn delta_device(&mut self, spec: &WgSpec, report: &mut WgReport) -> Result<()> {
        let peers = if self.believed_is_want {
            let have: BTreeMap<Key, PeerSpec> = (self.touched.iter())
                .filter_map(|(k, p)| Some((*k, p.clone()?)))
                .collect();
            let want: BTreeMap<Key, PeerSpec> = (self.touched.keys())
                .filter_map(|k| Some((*k, spec.peers.get(k)?.clone())))
                .collect();
            peer_changes(&have, &want)
        } else {
            peer_changes(&self.believed, &spec.peers)
        };
        if !peers.is_empty() {
            report.peer_changes += peers.len();
            let update = WgUpdate {
                peers,
                ..WgUpdate::default()
            };
            self.socket()?.set_device(&spec.name, &update)?;
        }
        self.believed.clear();
        self.believed_is_want = true;
        self.touched.clear();
        Ok(())
    }
}

/// The device's peers in the shape of the spec's.
fn device_peers(dev: &WgDevice) -> BTreeMap<Key, Option<PeerSpec>> {
    dev.peers
        .iter()
        .map(|p| {
            let spec = p.endpoint.map(|endpoint| PeerSpec {
                endpoint,
                allowed_ips: p.allowed_ips.iter().copied().collect(),
                keepalive: p.keepalive,
            });
            (p.public_key, spec)
        })
        .collect()
}

/// The peer changes from `have` to `want`, as Felix makes them: a peer not wanted is removed;
/// a wanted one missing is added whole; one whose allowed IPs lost an entry gets its list
/// replaced, one that only gained entries gets them appended; a changed endpoint or keepalive
/// is set. (`have` entries without an endpoint are peers the kernel holds with none.)
fn peer_changes<P: AsPeer>(
    have: &BTreeMap<Key, P>,
    want: &BTreeMap<Key, PeerSpec>,
) -> Vec<PeerUpdate> {
    let mut out: Vec<PeerUpdate> = have
        .keys()
        .filter(|k| !want.contains_key(*k))
        .map(|k| PeerUpdate::remove(*k))
        .collect();
    for (key, w) in want {
        let Some(h) = have.get(key) else {
            out.push(PeerUpdate {
                endpoint: Some(w.endpoint),
                keepalive: Some(w.keepalive),
                allowed_ips: w.allowed_ips.iter().copied().collect(),
                ..PeerUpdate::new(*key)
            });
            continue;
        };
        let mut u = PeerUpdate {
            update_only: true,
            ..PeerUpdate::new(*key)
        };
        let have_ips = h.allowed_ips();
        if !have_ips.is_subset(&w.allowed_ips) {
            u.replace_allowed_ips = true;
            u.allowed_ips = w.allowed_ips.iter().copied().collect();
        } else {
            u.allowed_ips = w.allowed_ips.difference(have_ips).copied().collect();
        }
        if h.endpoint() != Some(w.endpoint) {
            u.endpoint = Some(w.endpoint);
        }
        if h.keepalive() != w.keepalive {
            u.keepalive = Some(w.keepalive);
        }
        if u.replace_allowed_ips
            || !u.allowed_ips.is_empty()
            || u.endpoint.is_some()
            || u.keepalive.is_some()
        {
            out.push(u);
        }
    }
    out
}

/// A peer as held (believed, or read from the device).
trait AsPeer {
    fn allowed_ips(&self) -> &BTreeSet<IpNet>;
    fn endpoint(&self) -> Option<SocketAddr>;
    fn keepalive(&self) -> u16;
}

impl AsPeer for PeerSpec {
    fn allowed_ips(&self) -> &BTreeSet<IpNet> {
        &self.allowed_ips
    }
    fn endpoint(&self) -> Option<SocketAddr> {
        Some(self.endpoint)
    }
    fn keepalive(&self) -> u16 {
        self.keepalive
    }
}

/// The allowed IPs of a peer the kernel holds without an endpoint.
static NO_IPS: BTreeSet<IpNet> = BTreeSet::new();

impl AsPeer for Option<PeerSpec> {
    fn allowed_ips(&self) -> &BTreeSet<IpNet> {
        self.as_ref().map_or(&NO_IPS, |p| &p.allowed_ips)
    }
    fn endpoint(&self) -> Option<SocketAddr> {
        self.as_ref().map(|p| p.endpoint)
    }
    fn keepalive(&self) -> u16 {
        self.as_ref().map_or(0, |p| p.keepalive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(ips: &[&str], port: u16) -> PeerSpec {
        PeerSpec {
            endpoint: format!("172.31.0.11:{port}").parse().unwrap(),
            allowed_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            keepalive: 0,
        }
    }

    #[test]
    fn peer_changes_are_felix_deltas() {
        let (a, b, c) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let have = BTreeMap::from([
            (a, peer(&["10.65.1.0/26"], 51820)),
            (b, peer(&["10.65.2.0/26", "10.65.2.1/32"], 51820)),
        ]);
        // Unchanged: nothing.
        assert!(peer_changes(&have, &have).is_empty());
        let want = BTreeMap::from([
            // Gained an address: appended, update-only.
            (a, peer(&["10.65.1.0/26", "10.65.1.1/32"], 51820)),
            // Lost one (and moved port): the list replaced, the endpoint set.
            (b, peer(&["10.65.2.0/26"], 1)),
            // New: whole.
            (c, peer(&["10.65.3.0/26"], 51820)),
        ]);
        let ch = peer_changes(&have, &want);
        assert_eq!(ch.len(), 3, "{ch:?}");
        let of = |k: Key| ch.iter().find(|u| u.public_key == k).unwrap();
        let ua = of(a);
        assert!(ua.update_only && !ua.replace_allowed_ips && ua.endpoint.is_none());
        assert_eq!(
            ua.allowed_ips,
            vec!["10.65.1.1/32".parse::<IpNet>().unwrap()]
        );
        let ub = of(b);
        assert!(ub.update_only && ub.replace_allowed_ips);
        assert_eq!(
            ub.allowed_ips,
            vec!["10.65.2.0/26".parse::<IpNet>().unwrap()]
        );
        assert_eq!(ub.endpoint, Some("172.31.0.11:1".parse().unwrap()));
        let uc = of(c);
        assert!(!uc.update_only && !uc.remove && uc.keepalive == Some(0));
        // Gone: removed.
        let ch = peer_changes(&have, &BTreeMap::from([(a, have[&a].clone())]));
        assert_eq!(ch, vec![PeerUpdate::remove(b)]);
    }
}
