//! The route syncer (§15): desired routes of one routing table and one IP family,
//! reconciled with the kernel by dump and diff.
//!
//! The caller (a dataplane manager) states what it wants per group (typically per interface) with
//! [`RouteSyncer::set_routes`] and calls [`RouteSyncer::apply`]; nothing touches the kernel before
//! that. Which kernel routes the syncer may change is the caller's [`RouteOwnership`] rule, shaped like
//! §15: routes with one of "our" protocols, or routes on an interface the caller calls a workload
//! interface. Everything else in the table (foreign routes) is never touched.
//!
//! Invariants:
//! - Routes are keyed as the kernel keys them in one table: (destination, metric); TOS is always 0.
//!   A desired route whose key exists with other attributes is replaced in place (NLM_F_REPLACE).
//! - Routes on interfaces that are absent or administratively down are *parked* (the kernel
//!   refuses them with ENETDOWN, and flushes routes of a down interface anyway); they are
//!   programmed by the first apply after their interface is reported changed
//!   ([`RouteSyncer::iface_changed`], which the interface monitor's events become) or by the next
//!   full apply. Until then no apply looks at them: thousands of parked routes cost nothing per
//!   update. Interfaces are resolved by name on every apply that looks at their routes, so a
//!   re-created interface with a new index is followed.
//! - An undesired route on a workload interface that does not carry one of our protocols (e.g. a
//!   CNI plugin was faster than us) is deleted only after it has been seen for the grace period
//!   (default 10 s, §15).
//! - The steady state is O(change): the syncer keeps the routes it believes it programmed, and an
//!   apply without a resync writes only the difference for keys whose desired route changed and
//!   for routes (believed, desired or parked) on interfaces reported changed
//!   ([`RouteSyncer::iface_changed`]) — one RTM_NEWROUTE for a new endpoint, no dump. A dump
//!   (O(routes + links)) happens on the first apply, on [`RouteSyncer::request_resync`] (the
//!   refresh timer), after any failed write and when a grace period ends; it repairs drift from
//!   outside, which an incremental apply does not see. An apply with nothing changed and nothing
//!   pending returns without I/O.
//! - A gateway route on an interface points at a nexthop object ([`super::nexthop`]) shared by
//!   every route through that gateway, instead of carrying the gateway itself: the kernel adds
//!   thousands of those in linear time, and thousands of plain gateway routes on one device in
//!   quadratic time. An object no believed route uses is deleted after the routes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteMetric, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::RouteMessageBuilder;

use netlink_wire::NLM_F_EXCL;

use super::batch::{Batch, Outcome};
use super::link::{get_link, list_links, LinkState};
use super::nexthop::{self, KernelNexthop, NexthopKey, Nexthops, RTM_DELNEXTHOP, RTM_NEWNEXTHOP};
use super::{IpFamily, Result, RtnlError, RtnlHandle};

/// `RTPROT_KERNEL` (uapi linux/rtnetlink.h): routes the kernel made from an address.
const RTPROT_KERNEL: u8 = 2;

/// The main routing table.
pub const RT_TABLE_MAIN: u32 = 254;
/// Felix's default grace period for unknown routes on workload interfaces (§15).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// Where a route sends packets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteTarget {
    /// Directly on an interface, scope link (workload routes: `DST dev IF scope link`).
    Device(String),
    /// Via a gateway, optionally pinned to an interface and marked onlink.
    Gateway {
        via: IpAddr,
        dev: Option<String>,
        onlink: bool,
    },
    /// `blackhole DST` (local IPAM blocks).
    Blackhole,
    /// `throw DST`: the lookup leaves this table and goes on with the next rule (WireGuard's
    /// table, for destinations it does not encrypt).
    Throw,
}

impl RouteTarget {
    /// The interface this target needs, if any.
    pub fn ifname(&self) -> Option<&str> {
        match self {
            RouteTarget::Device(d) => Some(d),
            RouteTarget::Gateway { dev, .. } => dev.as_deref(),
            RouteTarget::Blackhole | RouteTarget::Throw => None,
        }
    }
}

/// One desired route.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteSpec {
    pub dst: IpNet,
    pub target: RouteTarget,
    /// `rtm_protocol` (e.g. Felix's DeviceRouteProtocol, 3 or 80).
    pub protocol: u8,
    /// `RTA_PRIORITY` (Felix: route priority, 1024 by default).
    pub metric: u32,
    /// Preferred source address (`RTA_PREFSRC`), Felix's DeviceRouteSourceAddress.
    pub src: Option<IpAddr>,
    /// Path MTU (`RTA_METRICS` / `RTAX_MTU`): tunnel routes carry the tunnel's MTU.
    pub mtu: Option<u32>,
}

impl RouteSpec {
    /// A workload route: `dst dev ifname scope link proto protocol metric metric`.
    pub fn device(dst: IpNet, ifname: impl Into<String>, protocol: u8, metric: u32) -> RouteSpec {
        RouteSpec {
            dst,
            target: RouteTarget::Device(ifname.into()),
            protocol,
            metric,
            src: None,
            mtu: None,
        }
    }

    /// A blackhole route.
    pub fn blackhole(dst: IpNet, protocol: u8, metric: u32) -> RouteSpec {
        RouteSpec {
            dst,
            target: RouteTarget::Blackhole,
            protocol,
            metric,
            src: None,
            mtu: None,
        }
    }

    fn key(&self) -> RouteKey {
        RouteKey {
            dst: self.dst.trunc(),
            metric: self.metric,
        }
    }
}

/// How the kernel identifies a route inside one table (TOS is always 0 here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKey {
    pub dst: IpNet,
    pub metric: u32,
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} metric {}", self.dst, self.metric)
    }
}

/// Which kernel routes the syncer owns (may replace or delete), in the shape of §15.
#[derive(Clone)]
pub struct RouteOwnership {
    /// Routes with one of these protocols are ours wherever they point.
    pub protocols: BTreeSet<u8>,
    /// True for the names of workload interfaces.
    pub is_workload_iface: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    /// On a workload interface, routes with these protocols are ours; `None` means any protocol
    /// (Felix's RemoveExternalRoutes=true).
    pub workload_protocols: Option<BTreeSet<u8>>,
    /// Interfaces every route on which is ours, whatever its protocol and at once (no grace
    /// period): the caller's own devices, such as a tunnel device it creates.
    pub device_ifaces: BTreeSet<String>,
    /// Routes without an interface (throw, blackhole, unreachable) are ours whatever their
    /// protocol: a table the caller owns outright.
    pub no_iface: bool,
}

impl RouteOwnership {
    /// Ours = `protocols`, plus any route on an interface whose name starts with one of
    /// `prefixes` (with `workload_protocols` limiting which protocols count there).
    pub fn by_prefixes(
        protocols: impl IntoIterator<Item = u8>,
        prefixes: Vec<String>,
        workload_protocols: Option<BTreeSet<u8>>,
    ) -> RouteOwnership {
        RouteOwnership {
            protocols: protocols.into_iter().collect(),
            is_workload_iface: Arc::new(move |name: &str| {
                prefixes.iter().any(|p| name.starts_with(p.as_str()))
            }),
            workload_protocols,
            device_ifaces: BTreeSet::new(),
            no_iface: false,
        }
    }

    /// A table owned outright: every route on `ifaces` and every route without an interface.
    pub fn exclusive(ifaces: impl IntoIterator<Item = String>) -> RouteOwnership {
        RouteOwnership {
            protocols: BTreeSet::new(),
            is_workload_iface: Arc::new(|_: &str| false),
            workload_protocols: None,
            device_ifaces: ifaces.into_iter().collect(),
            no_iface: true,
        }
    }

    /// Adds interfaces every route on which is ours (see [`RouteOwnership::device_ifaces`]).
    pub fn with_device_ifaces(mut self, names: impl IntoIterator<Item = String>) -> RouteOwnership {
        self.device_ifaces.extend(names);
        self
    }

    fn owns(&self, protocol: u8, ifname: Option<&str>) -> bool {
        if self.protocols.contains(&protocol) {
            return true;
        }
        if ifname.is_some_and(|n| self.device_ifaces.contains(n)) {
            return true;
        }
        if ifname.is_none() && self.no_iface {
            return true;
        }
        match ifname {
            Some(name) if (self.is_workload_iface)(name) => self
                .workload_protocols
                .as_ref()
                .is_none_or(|p| p.contains(&protocol)),
            _ => false,
        }
    }
}

impl fmt::Debug for RouteOwnership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteOwnership")
            .field("protocols", &self.protocols)
            .field("workload_protocols", &self.workload_protocols)
            .field("device_ifaces", &self.device_ifaces)
            .finish_non_exhaustive()
    }
}

/// What one apply did.
#[derive(Debug, Default)]
pub struct RouteSyncReport {
    /// Routes created where the key was free.
    pub added: Vec<RouteKey>,
    /// Routes whose key existed with other attributes and were replaced.
    pub replaced: Vec<RouteKey>,
    /// Routes deleted (undesired and ours).
    pub deleted: Vec<RouteKey>,
    /// Single addresses (/32, /128) that left an interface (deleted, or now on another
    /// interface): the caller deletes their conntrack entries (§15). A wider route (an IPAM
    /// block) is never listed: conntrack is keyed by address, and the block's first address may
    /// be a live workload's (as in Felix, which cleans up single addresses only).
    pub moved_or_gone: Vec<IpNet>,
    /// Desired routes waiting for their interface (absent or down): (route, interface).
    pub parked: Vec<(RouteKey, String)>,
    /// Unknown routes on workload interfaces still inside their grace period.
    pub in_grace: Vec<RouteKey>,
    /// Failures; the next apply retries (the syncer stays dirty).
    pub errors: Vec<RtnlError>,
    /// True when the apply skipped all I/O (nothing dirty or pending).
    pub skipped: bool,
}

impl RouteSyncReport {
    /// Records that `dst` left its interface (see [`RouteSyncReport::moved_or_gone`]).
    fn left(&mut self, dst: IpNet) {
        if dst.prefix_len() == dst.max_prefix_len() {
            self.moved_or_gone.push(dst);
        }
    }

    /// Count of kernel writes made.
    pub fn changes(&self) -> usize {
        self.added.len() + self.replaced.len() + self.deleted.len()
    }
}

/// What an apply would do, as [`RouteSyncer::plan`] computes it.
#[derive(Debug, Default, Clone)]
pub struct RoutePlan {
    /// Desired routes whose key is free.
    pub add: Vec<RouteSpec>,
    /// Desired routes whose key exists with other attributes.
    pub replace: Vec<RouteSpec>,
    /// Owned routes that are not desired.
    pub delete: Vec<OwnedRoute>,
    /// Desired routes waiting for their interface: (route, interface).
    pub parked: Vec<(RouteKey, String)>,
    /// Unknown routes on workload interfaces inside their grace period (kept for now).
    pub in_grace: Vec<RouteKey>,
}

impl RoutePlan {
    /// True when an apply would write nothing.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.replace.is_empty() && self.delete.is_empty()
    }
}

/// A kernel route as `dump` and `plan` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRoute {
    pub key: RouteKey,
    /// The output interface's name (`None`: no interface, or one that is gone).
    pub ifname: Option<String>,
    pub protocol: u8,
    /// `unicast`, `blackhole`, ...
    pub kind: String,
    pub gateway: Option<IpAddr>,
    pub src: Option<IpAddr>,
}

impl fmt::Display for OwnedRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind != "unicast" {
            write!(f, "{} ", self.kind)?;
        }
        write!(f, "{} metric {}", self.key.dst, self.key.metric)?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(dev) = &self.ifname {
            write!(f, " dev {dev}")?;
        }
        if let Some(src) = self.src {
            write!(f, " src {src}")?;
        }
        write!(f, " proto {}", self.protocol)
    }
}

impl fmt::Display for RouteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.target {
            RouteTarget::Blackhole => write!(f, "blackhole ")?,
            RouteTarget::Throw => write!(f, "throw ")?,
            _ => {}
        }
        write!(f, "{} metric {}", self.dst, self.metric)?;
        match &self.target {
            RouteTarget::Device(d) => write!(f, " dev {d}")?,
            RouteTarget::Gateway { via, dev, onlink } => {
                write!(f, " via {via}")?;
                if let Some(d) = dev {
                    write!(f, " dev {d}")?;
                }
                if *onlink {
                    write!(f, " onlink")?;
                }
            }
            RouteTarget::Blackhole | RouteTarget::Throw => {}
        }
        if let Some(src) = self.src {
            write!(f, " src {src}")?;
        }
        if let Some(mtu) = self.mtu {
            write!(f, " mtu {mtu}")?;
        }
        write!(f, " proto {}", self.protocol)
    }
}

/// One desired route to write.
#[derive(Debug)]
struct Write<'k> {
    key: RouteKey,
    spec: RouteSpec,
    oif: Option<u32>,
    existing: Option<&'k KernelRoute>,
}

/// A request of an incremental apply's batch, waiting for its outcome.
#[derive(Debug)]
enum Pending {
    /// A desired route written (`existing`: the interface of the believed route it replaces).
    Write {
        key: RouteKey,
        spec: RouteSpec,
        oif: Option<u32>,
        nh: Option<u32>,
        existing: Option<Option<u32>>,
    },
    /// A believed route deleted.
    Delete { key: RouteKey, believed: Believed },
    /// A nexthop object created or written again.
    Nexthop(NexthopKey),
}

/// A request of a full apply's batch.
#[derive(Debug)]
enum FullRequest<'w, 'k> {
    Nexthop(NexthopKey),
    Write(&'w Write<'k>, Option<u32>),
    Delete(&'k KernelRoute),
}

/// The outcome of [`RouteSyncer::decide`].
#[derive(Debug, Default)]
struct Decision<'k> {
    writes: Vec<Write<'k>>,
    deletes: Vec<&'k KernelRoute>,
    parked: Vec<(RouteKey, String)>,
    in_grace: Vec<RouteKey>,
    /// Unknown routes on workload interfaces seen this time (grace bookkeeping).
    seen_unknown: BTreeSet<(RouteKey, u32)>,
    /// Those seen for the first time, with the time to record.
    first_seen_new: Vec<((RouteKey, u32), Instant)>,
    /// Desired routes already in the kernel as wanted.
    in_place: BTreeMap<RouteKey, Believed>,
}

/// A route as read back from the kernel, reduced to what the syncer compares.
#[derive(Debug, Clone)]
struct KernelRoute {
    key: RouteKey,
    oif: Option<u32>,
    protocol: u8,
    kind: RouteType,
    scope: RouteScope,
    gateway: Option<IpAddr>,
    src: Option<IpAddr>,
    onlink: bool,
    mtu: Option<u32>,
    /// The nexthop object it points at (`RTA_NH_ID`).
    nh: Option<u32>,
    msg: RouteMessage,
}

impl KernelRoute {
    /// The request deleting it: the dumped message, less the gateway and interface the kernel
    /// reports for a route through a nexthop object (a request may name the object or a
    /// gateway, not both).
    fn delete_msg(&self) -> RouteMessage {
        let mut msg = self.msg.clone();
        if self.nh.is_some() {
            msg.attributes.retain(|a| {
                !matches!(
                    a,
                    RouteAttribute::Gateway(_)
                        | RouteAttribute::Oif(_)
                        | RouteAttribute::MultiPath(_)
                        | RouteAttribute::Via(_)
                )
            });
            msg.header.flags.remove(RouteFlags::Onlink);
        }
        msg
    }

    fn owned(&self, by_index: &BTreeMap<u32, &LinkState>) -> OwnedRoute {
        OwnedRoute {
            key: self.key,
            ifname: self
                .oif
                .and_then(|i| by_index.get(&i))
                .map(|l| l.name.clone()),
            protocol: self.protocol,
            kind: match self.kind {
                RouteType::Unicast => "unicast".to_string(),
                RouteType::BlackHole => "blackhole".to_string(),
                RouteType::Unreachable => "unreachable".to_string(),
                RouteType::Prohibit => "prohibit".to_string(),
                RouteType::Throw => "throw".to_string(),
                other => format!("{other:?}").to_lowercase(),
            },
            gateway: self.gateway,
            src: self.src,
        }
    }
}

/// A desired route the syncer wrote (or found in place) and believes is in the kernel as wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Believed {
    spec: RouteSpec,
    /// The interface index it was resolved to (`None` for a blackhole or a gateway without dev).
    oif: Option<u32>,
    /// The nexthop object it points at.
    nh: Option<u32>,
}

/// Counters of the requests a syncer sent, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteSyncStats {
    /// Full applies: a route dump, a nexthop dump and a link dump each.
    pub dumps: u64,
    /// Incremental applies (no dump).
    pub incremental: u64,
    /// Single-link lookups (RTM_GETLINK by name) of incremental applies.
    pub link_gets: u64,
    /// Writes sent: RTM_NEWROUTE (create or replace) and RTM_DELROUTE, and the same for nexthop
    /// objects.
    pub writes: u64,
}

/// More interfaces than this are resolved with one link dump instead of one lookup each.
const LINK_LOOKUP_LIMIT: usize = 32;

/// Reconciles one table of one family. Not shared: one owner task drives it.
///
/// It keeps the *believed* state — the desired routes it last wrote or found in place — so an
/// apply without a resync diffs desired against believed for the keys that changed and writes
/// only those (one RTM_NEWROUTE for a new endpoint), like `nft::reconcile::Reconciler` does for
/// tables. A *full* apply (start of day, [`RouteSyncer::request_resync`], after any failure, when
/// a grace period is due) dumps links and routes and repairs drift.
#[derive(Debug)]
pub struct RouteSyncer {
    family: IpFamily,
    table: u32,
    ownership: RouteOwnership,
    grace: Duration,
    groups: BTreeMap<String, Vec<RouteSpec>>,
    /// Which groups want each key (first group in order wins it).
    key_groups: BTreeMap<RouteKey, BTreeSet<String>>,
    /// First time each unknown (route, interface index) was seen, for the grace period.
    first_seen: BTreeMap<(RouteKey, u32), Instant>,
    /// Desired routes the kernel holds as wanted, as far as we know. A believed route that stops
    /// being desired is ours for certain and goes at once: the grace period is only for routes
    /// someone else (a CNI plugin) wrote (§15).
    believed: BTreeMap<RouteKey, Believed>,
    /// Desired routes waiting for their interface (absent or down): key → interface name.
    parked: BTreeMap<RouteKey, String>,
    /// Keys whose desired route changed since the last apply.
    changed_keys: BTreeSet<RouteKey>,
    /// Interfaces reported changed (flapped, re-created) since the last apply.
    changed_ifaces: BTreeSet<String>,
    /// The nexthop objects of believed gateway routes.
    nexthops: Nexthops,
    /// The believed state cannot be trusted: the next apply is a full one.
    stale: bool,
    stats: RouteSyncStats,
}

/// The nexthop object a route to `oif` needs: gateway routes on an interface have one.
fn nexthop_key(spec: &RouteSpec, oif: Option<u32>) -> Option<NexthopKey> {
    match (&spec.target, oif) {
        (RouteTarget::Gateway { via, onlink, .. }, Some(oif)) => Some(NexthopKey {
            via: *via,
            oif,
            onlink: *onlink,
            protocol: spec.protocol,
        }),
        _ => None,
    }
}

/// Gives dumped routes that point at an object the gateway, interface and onlink flag of that
/// object, where the kernel did not report them (`nexthop_compat_mode` off).
fn fill_from_nexthops(kernel: &mut [KernelRoute], objects: &[KernelNexthop]) {
    if !kernel.iter().any(|k| k.nh.is_some() && k.gateway.is_none()) {
        return;
    }
    let by_id: BTreeMap<u32, NexthopKey> = objects
        .iter()
        .filter_map(|n| Some((n.id, n.key?)))
        .collect();
    for k in kernel.iter_mut().filter(|k| k.gateway.is_none()) {
        if let Some(key) = k.nh.and_then(|id| by_id.get(&id)) {
            k.gateway = Some(key.via);
            k.oif = Some(key.oif);
            k.onlink = key.onlink;
        }
    }
}

/// Each key's first route in `routes` (the one a group wants for it).
fn first_specs(routes: &[RouteSpec]) -> BTreeMap<RouteKey, &RouteSpec> {
    let mut m = BTreeMap::new();
    for r in routes {
        m.entry(r.key()).or_insert(r);
    }
    m
}

impl RouteSyncer {
    /// A syncer for `table` (e.g. [`RT_TABLE_MAIN`]) and `family`. Its first apply is full.
    pub fn new(family: IpFamily, table: u32, ownership: RouteOwnership) -> RouteSyncer {
        RouteSyncer {
            family,
            table,
            ownership,
            grace: DEFAULT_GRACE,
            groups: BTreeMap::new(),
            key_groups: BTreeMap::new(),
            first_seen: BTreeMap::new(),
            believed: BTreeMap::new(),
            parked: BTreeMap::new(),
            changed_keys: BTreeSet::new(),
            changed_ifaces: BTreeSet::new(),
            nexthops: Nexthops::new(family),
            stale: true,
            stats: RouteSyncStats::default(),
        }
    }

    /// Changes the grace period for unknown routes on workload interfaces.
    pub fn with_grace(mut self, grace: Duration) -> RouteSyncer {
        self.grace = grace;
        self
    }

    /// Sets the desired routes of one group (e.g. an interface name, or "blackholes"), replacing
    /// what the group wanted before. An empty list removes the group. Routes of the wrong family
    /// are ignored. No kernel I/O.
    pub fn set_routes(&mut self, group: impl Into<String>, routes: Vec<RouteSpec>) {
        let group = group.into();
        let routes: Vec<RouteSpec> = routes
            .into_iter()
            .filter(|r| IpFamily::of(&r.dst.addr()) == self.family)
            .collect();
        if self.groups.get(&group).map_or(&[][..], Vec::as_slice) == routes.as_slice() {
            return;
        }
        let old = if routes.is_empty() {
            self.groups.remove(&group)
        } else {
            self.groups.insert(group.clone(), routes.clone())
        }
        .unwrap_or_default();
        // Only the keys whose route in this group differs are changed: a route more in a group
        // of a thousand (a remote node joining) makes the next apply look at one key, not all.
        let (before, after) = (first_specs(&old), first_specs(&routes));
        for (key, spec) in &before {
            if after.get(key) != Some(spec) {
                self.changed_keys.insert(*key);
            }
            if !after.contains_key(key) {
                if let Some(g) = self.key_groups.get_mut(key) {
                    g.remove(&group);
                    if g.is_empty() {
                        self.key_groups.remove(key);
                    }
                }
            }
        }
        for (key, spec) in &after {
            if before.get(key) != Some(spec) {
                self.changed_keys.insert(*key);
            }
            if !before.contains_key(key) {
                self.key_groups
                    .entry(*key)
                    .or_default()
                    .insert(group.clone());
            }
        }
    }

    /// Like [`RouteSyncer::set_routes`], without copying anything when the group is unchanged
    /// (the daemon restates every group on every apply).
    pub fn update_routes(&mut self, group: &str, routes: &[RouteSpec]) {
        let current = self.groups.get(group).map_or(&[][..], Vec::as_slice);
        let mut same = current.iter();
        let unchanged = routes
            .iter()
            .filter(|r| IpFamily::of(&r.dst.addr()) == self.family)
            .all(|r| same.next() == Some(r))
            && same.next().is_none();
        if !unchanged {
            self.set_routes(group, routes.to_vec());
        }
    }

    /// The groups that have desired routes.
    pub fn groups(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(String::as_str)
    }

    /// Asks for a full resync on the next apply (timer, start of day).
    pub fn request_resync(&mut self) {
        self.stale = true;
    }

    /// The interface `ifname` flapped, appeared, vanished or was re-created: the next apply
    /// re-resolves it and re-asserts its routes (an admin down flushes them, §15).
    pub fn iface_changed(&mut self, ifname: &str) {
        self.changed_ifaces.insert(ifname.to_string());
    }

    /// True when an apply would do something (a change, a resync, a changed interface or grace
    /// periods pending). Parked routes alone wait for their interface's change.
    pub fn needs_apply(&self) -> bool {
        self.stale
            || !self.changed_keys.is_empty()
            || !self.changed_ifaces.is_empty()
            || !self.first_seen.is_empty()
    }

    /// The requests sent so far.
    pub fn stats(&self) -> RouteSyncStats {
        self.stats
    }

    /// Reconciles the kernel table with the desired routes. Full (dump links and routes, diff
    /// everything, repair drift) when a resync was asked for, after a failure, or when a grace
    /// period is due; otherwise incremental: only changed keys and the routes (parked ones
    /// included) on changed interfaces are looked at, against the believed state, with no dump.
    /// Per-route failures are in the report (and make the next apply full); a failing dump is
    /// returned as `Err`.
    pub async fn apply(&mut self, h: &RtnlHandle) -> Result<RouteSyncReport> {
        if !self.needs_apply() {
            return Ok(RouteSyncReport {
                skipped: true,
                ..RouteSyncReport::default()
            });
        }
        let now = Instant::now();
        let grace_due = self.next_deadline().is_some_and(|t| t <= now);
        if self.stale || grace_due {
            self.apply_full(h, now).await
        } else {
            self.apply_incremental(h).await
        }
    }

    async fn apply_full(&mut self, h: &RtnlHandle, now: Instant) -> Result<RouteSyncReport> {
        self.stale = true; // cleared only when the apply completes without errors
        self.stats.dumps += 1;
        let links = list_links(h).await?;
        let objects = nexthop::dump(h)?;
        self.nexthops = self.owned_nexthops(&objects, &links);
        let mut kernel = self.dump(h).await?;
        fill_from_nexthops(&mut kernel, &objects);
        let d = self.decide(&links, &kernel, now, &self.nexthops);
        // Everything desired is looked at now: nothing is left over from before.
        self.changed_keys.clear();
        self.changed_ifaces.clear();

        let mut report = RouteSyncReport {
            parked: d.parked.clone(),
            in_grace: d.in_grace.clone(),
            ..RouteSyncReport::default()
        };
        let mut believed = d.in_place.clone();
        // Every write and delete in one pipelined batch, in the order they were decided; a new
        // nexthop object goes just before the first route that needs it.
        let mut batch = Batch::new();
        let mut sent: Vec<FullRequest> = Vec::with_capacity(d.writes.len() + d.deletes.len());
        for w in &d.writes {
            let (nh, created) = self.push_nexthop(&mut batch, &w.spec, w.oif, false);
            sent.extend(created.map(FullRequest::Nexthop));
            if self.push_write(&mut batch, &w.spec, w.oif, nh, &mut report) {
                sent.push(FullRequest::Write(w, nh));
            }
        }
        for k in &d.deletes {
            self.stats.writes += 1;
            batch.push(RouteNetlinkMessage::DelRoute(k.delete_msg()), 0);
            sent.push(FullRequest::Delete(k));
        }
        let outcomes = h.write_batch(&mut batch)?;
        for (request, outcome) in sent.into_iter().zip(outcomes) {
            match request {
                FullRequest::Nexthop(key) => self.nexthop_written(key, outcome, &mut report),
                FullRequest::Write(w, nh) => {
                    let existing = w.existing.map(|k| k.oif);
                    if Self::wrote(&w.spec, w.oif, existing, outcome, &mut report) {
                        let (spec, oif) = (w.spec.clone(), w.oif);
                        believed.insert(w.key, Believed { spec, oif, nh });
                    }
                }
                FullRequest::Delete(k) => match outcome {
                    Ok(()) => {
                        report.deleted.push(k.key);
                        report.left(k.key.dst);
                    }
                    Err(f) => {
                        let err = RtnlError::batch("deleting route", k.key.to_string(), f);
                        // Gone already (its interface vanished meanwhile): that is the goal.
                        if err.errno() != Some(libc::ESRCH) {
                            if let Some(b) = self.believed.get(&k.key).filter(|b| b.oif == k.oif) {
                                believed.insert(k.key, b.clone()); // still ours to delete on the retry
                            }
                            report.errors.push(err);
                        }
                    }
                },
            }
        }
        for (id, first) in &d.first_seen_new {
            self.first_seen.entry(*id).or_insert(*first);
        }
        self.first_seen.retain(|id, _| d.seen_unknown.contains(id));
        self.believed = believed;
        self.nexthops.clear_refs();
        for id in self.believed.values().filter_map(|b| b.nh) {
            self.nexthops.hold(id);
        }
        self.delete_unused_nexthops(h, &mut report)?;
        self.parked = d.parked.iter().map(|(k, i)| (*k, i.clone())).collect();
        self.stale = !report.errors.is_empty();
        self.log(&report, true);
        Ok(report)
    }

    /// The nexthop objects of a dump that are ours: an id in our range, and a protocol and
    /// interface the ownership rule would make a route ours for.
    fn owned_nexthops(&self, objects: &[KernelNexthop], links: &[LinkState]) -> Nexthops {
        let ids: Vec<u32> = objects.iter().map(|n| n.id).collect();
        let by_index: BTreeMap<u32, &str> =
            links.iter().map(|l| (l.index, l.name.as_str())).collect();
        let mut out = Nexthops::new(self.family);
        let ours: Vec<(NexthopKey, u32)> = objects
            .iter()
            .filter(|n| out.in_range(n.id))
            .filter_map(|n| Some((n.key?, n.id)))
            .filter(|(k, _)| {
                let ifname = by_index.get(&k.oif).copied();
                self.ownership.owns(k.protocol, ifname)
            })
            .collect();
        out.reset(ours, &ids);
        out
    }

    /// The nexthop object a route through `spec` on `oif` points at, with a request creating it
    /// added to `batch` when we have none. With `reassert` an object we have is written again
    /// (its interface changed, and taking an interface down deletes the objects on it). Returns
    /// the id and, when a request was added, the object's key.
    fn push_nexthop(
        &mut self,
        batch: &mut Batch,
        spec: &RouteSpec,
        oif: Option<u32>,
        reassert: bool,
    ) -> (Option<u32>, Option<NexthopKey>) {
        let Some(key) = nexthop_key(spec, oif) else {
            return (None, None);
        };
        let (id, flags) = match self.nexthops.id(&key) {
            Some(id) if !reassert => return (Some(id), None),
            Some(id) => (id, NLM_F_CREATE | NLM_F_REPLACE),
            None => (self.nexthops.allocate(key), NLM_F_CREATE | NLM_F_EXCL),
        };
        self.stats.writes += 1;
        batch.push_raw(RTM_NEWNEXTHOP, flags, &nexthop::new_body(id, &key));
        (Some(id), Some(key))
    }

    /// Records the outcome of writing a nexthop object: one that failed is forgotten (the routes
    /// that needed it failed with it, and the full apply that follows starts over).
    fn nexthop_written(&mut self, key: NexthopKey, outcome: Outcome, report: &mut RouteSyncReport) {
        if let Err(f) = outcome {
            let what = format!("via {} oif {}", key.via, key.oif);
            report
                .errors
                .push(RtnlError::batch("programming nexthop object", what, f));
            self.nexthops.forget(&key);
        }
    }

    /// Deletes our nexthop objects that no believed route uses.
    fn delete_unused_nexthops(
        &mut self,
        h: &RtnlHandle,
        report: &mut RouteSyncReport,
    ) -> Result<()> {
        let unused = self.nexthops.unused();
        if unused.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new();
        for (_, id) in &unused {
            self.stats.writes += 1;
            batch.push_raw(RTM_DELNEXTHOP, 0, &nexthop::del_body(*id));
        }
        let outcomes = h.write_batch(&mut batch)?;
        for ((key, id), outcome) in unused.iter().zip(outcomes) {
            let failed = outcome
                .err()
                .map(|f| RtnlError::batch("deleting nexthop object", id.to_string(), f))
                .filter(|e| !matches!(e.errno(), Some(libc::ENOENT | libc::ESRCH)));
            match failed {
                // Gone (or never made): that is the goal.
                None => self.nexthops.forget(key),
                Some(err) => report.errors.push(err),
            }
        }
        Ok(())
    }

    /// Believes `b` under `key`, keeping the nexthop objects' counts.
    fn believe(&mut self, key: RouteKey, b: Believed) {
        if let Some(id) = b.nh {
            self.nexthops.hold(id);
        }
        if let Some(id) = self.believed.insert(key, b).and_then(|old| old.nh) {
            self.nexthops.release(id);
        }
    }

    /// Stops believing the route of `key`, keeping the nexthop objects' counts.
    fn unbelieve(&mut self, key: &RouteKey) -> Option<Believed> {
        let b = self.believed.remove(key)?;
        if let Some(id) = b.nh {
            self.nexthops.release(id);
        }
        Some(b)
    }

    /// The O(change) apply: desired against believed for the keys that may differ.
    async fn apply_incremental(&mut self, h: &RtnlHandle) -> Result<RouteSyncReport> {
        self.stats.incremental += 1;
        let (keys, changed_ifaces) = self.take_changes();

        // The interfaces the affected routes need, looked up by name (a re-created interface has
        // a new index).
        let wanted: Vec<(RouteKey, RouteSpec)> = keys
            .iter()
            .filter_map(|k| self.desired_for(k).map(|s| (*k, s.clone())))
            .collect();
        let names: BTreeSet<&str> = wanted
            .iter()
            .filter_map(|(_, s)| s.target.ifname())
            .collect();
        let links = match self.resolve(h, &names).await {
            Ok(l) => l,
            Err(e) => {
                // Nothing was written; look at everything again next time.
                self.changed_keys.extend(keys);
                self.changed_ifaces.extend(changed_ifaces);
                return Err(e);
            }
        };

        let mut report = RouteSyncReport::default();
        // What to write is decided per key first; the writes then go as one pipelined batch.
        let mut batch = Batch::new();
        let mut pending: Vec<Pending> = Vec::new();
        // Nexthop objects on changed interfaces written again this apply.
        let mut reasserted: BTreeSet<NexthopKey> = BTreeSet::new();
        let mut wanted = wanted.into_iter().peekable();
        for key in keys {
            let spec = match wanted.peek() {
                Some((k, _)) if *k == key => wanted.next().map(|(_, s)| s),
                _ => None,
            };
            let have = self.believed.get(&key).cloned();
            let Some(spec) = spec else {
                // No longer desired: ours for certain, delete at once.
                self.parked.remove(&key);
                if let Some(b) = self.unbelieve(&key) {
                    self.push_delete(&mut batch, &mut pending, key, b, &mut report);
                }
                continue;
            };
            let oif = match spec.target.ifname() {
                None => None,
                Some(name) => match links.get(name) {
                    Some(l) if l.admin_up => Some(l.index),
                    _ => {
                        // Absent or down: the kernel refuses the route (ENETDOWN), and it
                        // flushed any it had there (an admin down flushes routes of both
                        // families; a deleted link takes its routes). One believed on another
                        // interface is still in the kernel and leaves now.
                        self.parked.insert(key, name.to_string());
                        if let Some(b) = self.unbelieve(&key) {
                            if b.spec.target.ifname() != Some(name) {
                                self.push_delete(&mut batch, &mut pending, key, b, &mut report);
                            }
                        }
                        continue;
                    }
                },
            };
            self.parked.remove(&key);
            let iface_changed = spec
                .target
                .ifname()
                .is_some_and(|i| changed_ifaces.contains(i));
            if !iface_changed
                && have
                    .as_ref()
                    .is_some_and(|b| b.spec == spec && b.oif == oif)
            {
                continue;
            }
            let existing = have.map(|b| b.oif);
            let reassert =
                iface_changed && nexthop_key(&spec, oif).is_some_and(|k| reasserted.insert(k));
            let (nh, created) = self.push_nexthop(&mut batch, &spec, oif, reassert);
            pending.extend(created.map(Pending::Nexthop));
            if self.push_write(&mut batch, &spec, oif, nh, &mut report) {
                pending.push(Pending::Write {
                    key,
                    spec,
                    oif,
                    nh,
                    existing,
                });
            } else {
                self.unbelieve(&key);
            }
        }
        let outcomes = match h.write_batch(&mut batch) {
            Ok(o) => o,
            Err(e) => {
                // Nothing was written; the full apply that follows looks at everything.
                self.stale = true;
                return Err(e);
            }
        };
        self.settle(pending, outcomes, &mut report);
        if self.nexthops.take_released() {
            if let Err(e) = self.delete_unused_nexthops(h, &mut report) {
                self.stale = true;
                return Err(e);
            }
        }
        report.parked = self.parked.iter().map(|(k, i)| (*k, i.clone())).collect();
        report.in_grace = self.first_seen.keys().map(|(k, _)| *k).collect();
        if !report.errors.is_empty() {
            self.stale = true;
        }
        self.log(&report, false);
        Ok(report)
    }

    /// The keys an incremental apply looks at, and the interfaces that changed: the keys whose
    /// desired route changed, and every route parked on, believed on or wanted on a changed
    /// interface.
    fn take_changes(&mut self) -> (BTreeSet<RouteKey>, BTreeSet<String>) {
        let changed_ifaces = std::mem::take(&mut self.changed_ifaces);
        let mut keys = std::mem::take(&mut self.changed_keys);
        if !changed_ifaces.is_empty() {
            keys.extend(
                self.parked
                    .iter()
                    .filter(|(_, i)| changed_ifaces.contains(*i))
                    .map(|(k, _)| *k),
            );
            keys.extend(
                self.believed
                    .iter()
                    .filter(|(_, b)| {
                        b.spec
                            .target
                            .ifname()
                            .is_some_and(|i| changed_ifaces.contains(i))
                    })
                    .map(|(k, _)| *k),
            );
            for name in &changed_ifaces {
                keys.extend(
                    self.groups
                        .get(name)
                        .into_iter()
                        .flatten()
                        .map(RouteSpec::key),
                );
            }
        }
        (keys, changed_ifaces)
    }

    /// Takes each batched write's outcome into the believed state and the report.
    fn settle(
        &mut self,
        pending: Vec<Pending>,
        outcomes: Vec<Outcome>,
        report: &mut RouteSyncReport,
    ) {
        for (p, outcome) in pending.into_iter().zip(outcomes) {
            match p {
                Pending::Nexthop(k) => self.nexthop_written(k, outcome, report),
                Pending::Write {
                    key,
                    spec,
                    oif,
                    nh,
                    existing,
                } => {
                    if Self::wrote(&spec, oif, existing, outcome, report) {
                        self.believe(key, Believed { spec, oif, nh });
                    } else {
                        self.unbelieve(&key);
                    }
                }
                Pending::Delete { key, believed } => match outcome {
                    Ok(()) => {
                        report.deleted.push(key);
                        report.left(key.dst);
                    }
                    Err(f) => {
                        let err = RtnlError::batch("deleting route", key.to_string(), f);
                        // Gone already: its interface went down or away and took it.
                        if !matches!(err.errno(), Some(libc::ESRCH | libc::ENODEV)) {
                            report.errors.push(err);
                            // Still ours: the full apply that follows deletes it without a
                            // grace period.
                            self.believe(key, believed);
                        }
                    }
                },
            }
        }
    }

    /// The desired route of `key`: the first group (in order) that wants it, its first spec.
    fn desired_for(&self, key: &RouteKey) -> Option<&RouteSpec> {
        let group = self.key_groups.get(key)?.first()?;
        self.groups.get(group)?.iter().find(|s| s.key() == *key)
    }

    /// Current state of the named interfaces: one lookup each, or one dump for many.
    async fn resolve(
        &mut self,
        h: &RtnlHandle,
        names: &BTreeSet<&str>,
    ) -> Result<BTreeMap<String, LinkState>> {
        if names.len() > LINK_LOOKUP_LIMIT {
            self.stats.link_gets += 1;
            return Ok(list_links(h)
                .await?
                .into_iter()
                .filter(|l| names.contains(l.name.as_str()))
                .map(|l| (l.name.clone(), l))
                .collect());
        }
        let mut out = BTreeMap::new();
        for name in names {
            self.stats.link_gets += 1;
            if let Some(l) = get_link(h, name).await? {
                out.insert(l.name.clone(), l);
            }
        }
        Ok(out)
    }

    /// Adds the write of one route (create or replace) to `batch`. False when its message cannot
    /// be built (the error is in the report, nothing is sent).
    fn push_write(
        &mut self,
        batch: &mut Batch,
        spec: &RouteSpec,
        oif: Option<u32>,
        nh: Option<u32>,
        report: &mut RouteSyncReport,
    ) -> bool {
        match self.build(spec, oif, nh) {
            Ok(msg) => {
                self.stats.writes += 1;
                batch.push(
                    RouteNetlinkMessage::NewRoute(msg),
                    NLM_F_CREATE | NLM_F_REPLACE,
                );
                true
            }
            Err(e) => {
                report.errors.push(e);
                false
            }
        }
    }

    /// Records the outcome of a route write; `existing` is the interface of the route the kernel
    /// held under that key, when there was one. True on success.
    fn wrote(
        spec: &RouteSpec,
        oif: Option<u32>,
        existing: Option<Option<u32>>,
        outcome: Outcome,
        report: &mut RouteSyncReport,
    ) -> bool {
        let key = spec.key();
        match outcome {
            Ok(()) => {
                match existing {
                    Some(old) => {
                        if old.is_some() && oif.is_some() && old != oif {
                            report.left(key.dst);
                        }
                        report.replaced.push(key);
                    }
                    None => report.added.push(key),
                }
                true
            }
            Err(f) => {
                report
                    .errors
                    .push(RtnlError::batch("programming route", key.to_string(), f));
                false
            }
        }
    }

    /// Adds the deletion of a route we believe we programmed to `batch`. When its message cannot
    /// be built the error is in the report and the route stays believed (the full apply that
    /// follows deletes it).
    fn push_delete(
        &mut self,
        batch: &mut Batch,
        pending: &mut Vec<Pending>,
        key: RouteKey,
        b: Believed,
        report: &mut RouteSyncReport,
    ) {
        match self.build(&b.spec, b.oif, b.nh) {
            Ok(msg) => {
                self.stats.writes += 1;
                batch.push(RouteNetlinkMessage::DelRoute(msg), 0);
                pending.push(Pending::Delete { key, believed: b });
            }
            Err(e) => {
                report.errors.push(e);
                self.believe(key, b);
            }
        }
    }

    fn log(&self, report: &RouteSyncReport, full: bool) {
        tracing::debug!(
            family = ?self.family,
            table = self.table,
            full,
            added = report.added.len(),
            replaced = report.replaced.len(),
            deleted = report.deleted.len(),
            parked = report.parked.len(),
            in_grace = report.in_grace.len(),
            errors = report.errors.len(),
            "route sync"
        );
    }

    /// What [`RouteSyncer::apply`] would do now, computed by the same decision code, without
    /// writing anything or advancing grace periods (`felix-nft plan`).
    pub async fn plan(&self, h: &RtnlHandle) -> Result<RoutePlan> {
        let links = list_links(h).await?;
        let objects = nexthop::dump(h)?;
        let mut kernel = self.dump(h).await?;
        fill_from_nexthops(&mut kernel, &objects);
        let by_index: BTreeMap<u32, &LinkState> = links.iter().map(|l| (l.index, l)).collect();
        let d = self.decide(
            &links,
            &kernel,
            Instant::now(),
            &self.owned_nexthops(&objects, &links),
        );
        let mut plan = RoutePlan {
            parked: d.parked.clone(),
            in_grace: d.in_grace.clone(),
            ..RoutePlan::default()
        };
        for w in &d.writes {
            match w.existing {
                Some(_) => plan.replace.push(w.spec.clone()),
                None => plan.add.push(w.spec.clone()),
            }
        }
        plan.delete = d.deletes.iter().map(|k| k.owned(&by_index)).collect();
        Ok(plan)
    }

    /// The kernel routes of this table and family that the ownership rule makes ours (§15),
    /// whatever is desired (`felix-nft dump`).
    pub async fn list_owned(&self, h: &RtnlHandle) -> Result<Vec<OwnedRoute>> {
        let links = list_links(h).await?;
        let by_index: BTreeMap<u32, &LinkState> = links.iter().map(|l| (l.index, l)).collect();
        let kernel = self.dump(h).await?;
        Ok(kernel
            .iter()
            .map(|k| k.owned(&by_index))
            .filter(|o| self.ownership.owns(o.protocol, o.ifname.as_deref()))
            .collect())
    }

    /// The decision shared by [`RouteSyncer::apply`] and [`RouteSyncer::plan`]: which desired
    /// routes to write, which owned routes to delete, which are parked or in their grace period.
    /// Pure: reads `self` and the dumps only.
    fn decide<'k>(
        &self,
        links: &[LinkState],
        kernel: &'k [KernelRoute],
        now: Instant,
        nexthops: &Nexthops,
    ) -> Decision<'k> {
        let by_name: BTreeMap<&str, &LinkState> =
            links.iter().map(|l| (l.name.as_str(), l)).collect();
        let by_index: BTreeMap<u32, &LinkState> = links.iter().map(|l| (l.index, l)).collect();
        let mut d = Decision::default();

        // Desired routes resolved against the current interfaces; first group wins a key.
        let mut desired: BTreeMap<RouteKey, (RouteSpec, Option<u32>)> = BTreeMap::new();
        for spec in self.groups.values().flatten() {
            let key = spec.key();
            if desired.contains_key(&key) {
                continue;
            }
            match spec.target.ifname() {
                Some(ifname) => match by_name.get(ifname) {
                    Some(link) if link.admin_up => {
                        desired.insert(key, (spec.clone(), Some(link.index)));
                    }
                    _ => d.parked.push((key, ifname.to_string())),
                },
                None => {
                    desired.insert(key, (spec.clone(), None));
                }
            }
        }

        let kernel_by_key: BTreeMap<RouteKey, &KernelRoute> =
            kernel.iter().map(|r| (r.key, r)).collect();

        for (key, (spec, oif)) in desired.iter() {
            let existing = kernel_by_key.get(key).copied();
            let nh = nexthop_key(spec, *oif).and_then(|k| nexthops.id(&k));
            if existing.is_some_and(|k| self.matches(k, spec, *oif, nh)) {
                let (spec, oif) = (spec.clone(), *oif);
                d.in_place.insert(*key, Believed { spec, oif, nh });
                continue;
            }
            d.writes.push(Write {
                key: *key,
                spec: spec.clone(),
                oif: *oif,
                existing,
            });
        }

        for k in kernel {
            if desired.contains_key(&k.key) {
                continue;
            }
            let ifname = k
                .oif
                .and_then(|i| by_index.get(&i))
                .map(|l| l.name.as_str());
            if !self.ownership.owns(k.protocol, ifname) {
                continue;
            }
            let on_workload = ifname.is_some_and(|n| (self.ownership.is_workload_iface)(n));
            let id = (k.key, k.oif.unwrap_or(0));
            let ours_before = self.believed.get(&k.key).is_some_and(|b| b.oif == k.oif);
            if on_workload && !ours_before && !self.ownership.protocols.contains(&k.protocol) {
                d.seen_unknown.insert(id);
                let first = match self.first_seen.get(&id) {
                    Some(t) => *t,
                    None => {
                        d.first_seen_new.push((id, now));
                        now
                    }
                };
                if now.duration_since(first) < self.grace {
                    d.in_grace.push(k.key);
                    continue;
                }
            }
            d.deletes.push(k);
        }
        d
    }

    /// When the earliest grace period ends (the caller should apply again then).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.first_seen.values().min().map(|t| *t + self.grace)
    }

    async fn dump(&self, h: &RtnlHandle) -> Result<Vec<KernelRoute>> {
        let req = match self.family {
            IpFamily::V4 => RouteMessageBuilder::<Ipv4Addr>::new().build(),
            IpFamily::V6 => RouteMessageBuilder::<Ipv6Addr>::new().build(),
        };
        h.handle()
            .route()
            .get(req)
            .execute()
            .try_filter_map(|m| std::future::ready(Ok(self.parse(m))))
            .try_collect()
            .await
            .map_err(|e| RtnlError::kernel("dumping routes of table", self.table.to_string(), e))
    }

    /// Reduces a dumped route; `None` for routes outside our table or that no one may own
    /// (multicast, IPv6 link-local prefixes the kernel keeps on every interface, TOS routes,
    /// routes the kernel derives from addresses).
    fn parse(&self, msg: RouteMessage) -> Option<KernelRoute> {
        let mut table = u32::from(msg.header.table);
        let mut dst = None;
        let mut oif = None;
        let mut metric = 0;
        let mut gateway = None;
        let mut src = None;
        let mut mtu = None;
        let mut nh = None;
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Destination(a) => dst = route_ip(a),
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Priority(p) => metric = *p,
                RouteAttribute::Gateway(a) => gateway = route_ip(a),
                RouteAttribute::PrefSource(a) => src = route_ip(a),
                RouteAttribute::NhId(id) => nh = Some(*id),
                RouteAttribute::Metrics(ms) => {
                    mtu = ms.iter().find_map(|m| match m {
                        RouteMetric::Mtu(v) => Some(*v),
                        _ => None,
                    })
                }
                _ => {}
            }
        }
        if table != self.table || msg.header.tos != 0 {
            return None;
        }
        let dst = match dst {
            Some(ip) => IpNet::new(ip, msg.header.destination_prefix_length).ok()?,
            None => match self.family {
                IpFamily::V4 => IpNet::new(Ipv4Addr::UNSPECIFIED.into(), 0).ok()?,
                IpFamily::V6 => IpNet::new(Ipv6Addr::UNSPECIFIED.into(), 0).ok()?,
            },
        };
        let special = match dst.addr() {
            IpAddr::V4(a) => a.is_multicast(),
            IpAddr::V6(a) => a.is_multicast() || a.is_unicast_link_local(),
        };
        // Routes the kernel derives from addresses (RTPROT_KERNEL) come back with the address;
        // deleting them would fight the kernel, so no ownership rule can claim them.
        if special || u8::from(msg.header.protocol) == RTPROT_KERNEL {
            return None;
        }
        Some(KernelRoute {
            key: RouteKey { dst, metric },
            oif,
            protocol: u8::from(msg.header.protocol),
            kind: msg.header.kind,
            scope: msg.header.scope,
            gateway,
            src,
            onlink: msg.header.flags.contains(RouteFlags::Onlink),
            mtu,
            nh,
            msg,
        })
    }

    /// Whether the kernel's route `k` is `spec` on `oif`, pointing at nexthop object `nh` (a
    /// gateway route with our object for it; `None`: no object, or none of ours yet).
    fn matches(
        &self,
        k: &KernelRoute,
        spec: &RouteSpec,
        oif: Option<u32>,
        nh: Option<u32>,
    ) -> bool {
        // An IPv6 blackhole or throw is reported on `lo`; neither has an interface of ours.
        let oif_ok = spec.target.ifname().is_none() || k.oif == oif;
        if k.protocol != spec.protocol || k.src != spec.src || k.mtu != spec.mtu || !oif_ok {
            return false;
        }
        if k.nh != nh || (nh.is_none() && nexthop_key(spec, oif).is_some()) {
            return false;
        }
        match &spec.target {
            RouteTarget::Device(_) => {
                // IPv6 has no route scopes: the kernel reports every v6 route as universe.
                let scope_ok = self.family == IpFamily::V6 || k.scope == RouteScope::Link;
                k.kind == RouteType::Unicast && scope_ok && k.gateway.is_none()
            }
            RouteTarget::Gateway { via, onlink, .. } => {
                k.kind == RouteType::Unicast && k.gateway == Some(*via) && k.onlink == *onlink
            }
            RouteTarget::Blackhole => k.kind == RouteType::BlackHole,
            RouteTarget::Throw => k.kind == RouteType::Throw,
        }
    }

    /// The message for `spec` on `oif`; with `nh`, it points at that object in place of the
    /// gateway, interface and onlink flag (the kernel refuses both at once).
    fn build(&self, spec: &RouteSpec, oif: Option<u32>, nh: Option<u32>) -> Result<RouteMessage> {
        let bad = |e: &dyn std::fmt::Display| RtnlError::Unexpected {
            op: "building route",
            what: format!("{}: {e}", spec.dst),
        };
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(spec.dst.addr(), spec.dst.prefix_len())
            .map_err(|e| bad(&e))?
            .table_id(self.table)
            .protocol(RouteProtocol::from(spec.protocol))
            .priority(spec.metric);
        match &spec.target {
            RouteTarget::Device(_) => {
                b = b.scope(RouteScope::Link).kind(RouteType::Unicast);
            }
            RouteTarget::Gateway { .. } if nh.is_some() => {
                b = b.scope(RouteScope::Universe).kind(RouteType::Unicast);
            }
            RouteTarget::Gateway { via, onlink, .. } => {
                b = b
                    .gateway(*via)
                    .map_err(|e| bad(&e))?
                    .scope(RouteScope::Universe)
                    .kind(RouteType::Unicast);
                if *onlink {
                    b = b.onlink();
                }
            }
            RouteTarget::Blackhole => {
                b = b.scope(RouteScope::Universe).kind(RouteType::BlackHole);
            }
            RouteTarget::Throw => {
                b = b.scope(RouteScope::Universe).kind(RouteType::Throw);
            }
        }
        if let (Some(oif), None) = (oif, nh) {
            b = b.output_interface(oif);
        }
        if let Some(src) = spec.src {
            b = b.pref_source(src).map_err(|e| bad(&e))?;
        }
        let mut msg = b.build();
        if let Some(id) = nh {
            msg.attributes.push(RouteAttribute::NhId(id));
        }
        if let Some(mtu) = spec.mtu {
            msg.attributes
                .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
        }
        Ok(msg)
    }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_follows_section_15() {
        let own = RouteOwnership::by_prefixes([80], vec!["cali".into()], Some([3, 80].into()));
        assert!(own.owns(80, None), "our protocol anywhere");
        assert!(own.owns(80, Some("eth0")));
        assert!(
            own.owns(3, Some("cali123")),
            "boot protocol on a workload interface"
        );
        assert!(
            !own.owns(3, Some("eth0")),
            "boot protocol elsewhere is foreign"
        );
        assert!(
            !own.owns(186, Some("cali123")),
            "BIRD on a workload iface without RemoveExternalRoutes"
        );
        let any = RouteOwnership::by_prefixes([80], vec!["cali".into()], None);
        assert!(any.owns(186, Some("cali123")));
        assert!(!any.owns(186, Some("eth0")));
    }

    #[test]
    fn set_routes_tracks_dirtiness_and_family() {
        let own = RouteOwnership::by_prefixes([80], vec!["cali".into()], None);
        let mut s = RouteSyncer::new(IpFamily::V4, RT_TABLE_MAIN, own);
        s.stale = false;
        let r = RouteSpec::device("10.0.0.1/32".parse().unwrap(), "cali1", 80, 1024);
        s.set_routes("cali1", vec![r.clone()]);
        assert!(s.needs_apply());
        s.changed_keys.clear();
        s.set_routes("cali1", vec![r.clone()]);
        assert!(!s.needs_apply(), "same routes again is not a change");
        s.update_routes("cali1", &[r]);
        assert!(!s.needs_apply(), "nor through update_routes");
        s.set_routes(
            "cali2",
            vec![RouteSpec::device(
                "fd00::1/128".parse().unwrap(),
                "cali2",
                80,
                1024,
            )],
        );
        assert!(!s.needs_apply(), "IPv6 route ignored by an IPv4 syncer");
        s.set_routes("cali1", vec![]);
        assert!(s.needs_apply());
        assert!(s.groups.is_empty() && s.key_groups.is_empty());
    }

    #[test]
    fn a_route_more_in_a_large_group_changes_one_key() {
        let own = RouteOwnership::by_prefixes([80], vec!["cali".into()], None);
        let mut s = RouteSyncer::new(IpFamily::V4, RT_TABLE_MAIN, own);
        let block = |i: u32| {
            let dst = IpNet::new(std::net::Ipv4Addr::from(0x0a80_0000 + 64 * i).into(), 26)
                .unwrap_or_else(|e| panic!("{e}"));
            RouteSpec::device(dst, "vxlan.calico", 3, 0)
        };
        let mut routes: Vec<RouteSpec> = (0..1000).map(block).collect();
        s.set_routes("vxlan.calico", routes.clone());
        assert_eq!(s.changed_keys.len(), 1000);
        s.changed_keys.clear();
        routes.push(block(1000));
        s.update_routes("vxlan.calico", &routes);
        assert_eq!(s.changed_keys, BTreeSet::from([block(1000).key()]));
        s.changed_keys.clear();
        let mut moved = block(7);
        moved.metric = 0;
        moved.protocol = 80;
        routes.remove(0);
        routes[6] = moved.clone();
        s.update_routes("vxlan.calico", &routes);
        assert_eq!(
            s.changed_keys,
            BTreeSet::from([block(0).key(), moved.key()]),
            "a removed route and a changed one"
        );
        assert!(!s.key_groups.contains_key(&block(0).key()));
        assert_eq!(s.desired_for(&moved.key()), Some(&moved));
    }

    #[test]
    fn first_group_wins_a_key_and_the_index_follows_changes() {
        let own = RouteOwnership::by_prefixes([80], vec!["cali".into()], None);
        let mut s = RouteSyncer::new(IpFamily::V4, RT_TABLE_MAIN, own);
        let dst: IpNet = "10.0.0.1/32".parse().unwrap();
        let a = RouteSpec::device(dst, "cali1", 80, 1024);
        let b = RouteSpec::device(dst, "cali2", 80, 1024);
        s.set_routes("cali2", vec![b.clone()]);
        s.update_routes("cali1", std::slice::from_ref(&a));
        assert_eq!(s.desired_for(&a.key()), Some(&a), "cali1 sorts first");
        assert_eq!(s.changed_keys, BTreeSet::from([a.key()]));
        s.set_routes("cali1", vec![]);
        assert_eq!(s.desired_for(&a.key()), Some(&b));
        s.set_routes("cali2", vec![]);
        assert_eq!(s.desired_for(&a.key()), None);
        assert!(s.key_groups.is_empty());
    }
}
