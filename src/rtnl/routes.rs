//! The route syncer (reference §15): desired routes of one routing table and one IP family,
//! reconciled with the kernel by dump and diff.
//!
//! The caller (a dataplane manager) states what it wants per group (typically per interface) with
//! [`RouteSyncer::set_routes`] and calls [`RouteSyncer::apply`]; nothing touches the kernel before
//! that. Which kernel routes the syncer may change is the caller's [`Ownership`] rule, shaped like
//! §15: routes with one of "our" protocols, or routes on an interface the caller calls a workload
//! interface. Everything else in the table (foreign routes) is never touched.
//!
//! Invariants:
//! - Routes are keyed as the kernel keys them in one table: (destination, metric); TOS is always 0.
//!   A desired route whose key exists with other attributes is replaced in place (NLM_F_REPLACE).
//! - Routes on interfaces that are absent or administratively down are *parked* (the kernel
//!   refuses them with ENETDOWN, and flushes routes of a down interface anyway); they are
//!   programmed by the first apply that sees the interface up. Interfaces are resolved by name on
//!   every apply, so a re-created interface with a new index is followed.
//! - An undesired route on a workload interface that does not carry one of our protocols (e.g. a
//!   CNI plugin was faster than us) is deleted only after it has been seen for the grace period
//!   (default 10 s, §15).
//! - Every apply re-reads the table (a dump costs O(routes in the table)), so every apply is a
//!   full resync; an apply with nothing dirty and nothing pending returns without I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::RouteMessageBuilder;

use super::link::{list_links, LinkState};
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
}

impl RouteTarget {
    /// The interface this target needs, if any.
    pub fn ifname(&self) -> Option<&str> {
        match self {
            RouteTarget::Device(d) => Some(d),
            RouteTarget::Gateway { dev, .. } => dev.as_deref(),
            RouteTarget::Blackhole => None,
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
pub struct Ownership {
    /// Routes with one of these protocols are ours wherever they point.
    pub protocols: BTreeSet<u8>,
    /// True for the names of workload interfaces.
    pub is_workload_iface: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    /// On a workload interface, routes with these protocols are ours; `None` means any protocol
    /// (Felix's RemoveExternalRoutes=true).
    pub workload_protocols: Option<BTreeSet<u8>>,
}

impl Ownership {
    /// Ours = `protocols`, plus any route on an interface whose name starts with one of
    /// `prefixes` (with `workload_protocols` limiting which protocols count there).
    pub fn by_prefixes(
        protocols: impl IntoIterator<Item = u8>,
        prefixes: Vec<String>,
        workload_protocols: Option<BTreeSet<u8>>,
    ) -> Ownership {
        Ownership {
            protocols: protocols.into_iter().collect(),
            is_workload_iface: Arc::new(move |name: &str| {
                prefixes.iter().any(|p| name.starts_with(p.as_str()))
            }),
            workload_protocols,
        }
    }

    fn owns(&self, protocol: u8, ifname: Option<&str>) -> bool {
        if self.protocols.contains(&protocol) {
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

impl fmt::Debug for Ownership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ownership")
            .field("protocols", &self.protocols)
            .field("workload_protocols", &self.workload_protocols)
            .finish_non_exhaustive()
    }
}

/// What one apply did.
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Routes created where the key was free.
    pub added: Vec<RouteKey>,
    /// Routes whose key existed with other attributes and were replaced.
    pub replaced: Vec<RouteKey>,
    /// Routes deleted (undesired and ours).
    pub deleted: Vec<RouteKey>,
    /// Destinations that left an interface (deleted, or now on another interface): the caller
    /// deletes their conntrack entries (§15).
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

impl SyncReport {
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
        if self.target == RouteTarget::Blackhole {
            write!(f, "blackhole ")?;
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
            RouteTarget::Blackhole => {}
        }
        if let Some(src) = self.src {
            write!(f, " src {src}")?;
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
    /// Desired routes already in the kernel as wanted, by (route, interface index).
    in_place: BTreeSet<(RouteKey, u32)>,
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
    msg: RouteMessage,
}

impl KernelRoute {
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
                other => format!("{other:?}").to_lowercase(),
            },
            gateway: self.gateway,
            src: self.src,
        }
    }
}

/// Reconciles one table of one family. Not shared: one owner task drives it.
#[derive(Debug)]
pub struct RouteSyncer {
    family: IpFamily,
    table: u32,
    ownership: Ownership,
    grace: Duration,
    groups: BTreeMap<String, Vec<RouteSpec>>,
    /// First time each unknown (route, interface index) was seen, for the grace period.
    first_seen: BTreeMap<(RouteKey, u32), Instant>,
    /// Desired routes on an interface that the last apply left in the kernel, by (route,
    /// interface index). When one stops being desired it is ours for certain and goes at once:
    /// the grace period is only for routes someone else (a CNI plugin) wrote (§15).
    programmed: BTreeSet<(RouteKey, u32)>,
    dirty: bool,
    pending: bool,
}

impl RouteSyncer {
    /// A syncer for `table` (e.g. [`RT_TABLE_MAIN`]) and `family`.
    pub fn new(family: IpFamily, table: u32, ownership: Ownership) -> RouteSyncer {
        RouteSyncer {
            family,
            table,
            ownership,
            grace: DEFAULT_GRACE,
            groups: BTreeMap::new(),
            first_seen: BTreeMap::new(),
            programmed: BTreeSet::new(),
            dirty: true,
            pending: false,
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
        let changed = if routes.is_empty() {
            self.groups.remove(&group).is_some()
        } else {
            self.groups.insert(group, routes.clone()) != Some(routes)
        };
        self.dirty |= changed;
    }

    /// Asks for a full resync on the next apply (timer, or after an interface event).
    pub fn request_resync(&mut self) {
        self.dirty = true;
    }

    /// True when an apply would do something (dirty, parked routes or grace periods pending).
    pub fn needs_apply(&self) -> bool {
        self.dirty || self.pending
    }

    /// Reconciles the kernel table with the desired routes: dump links and routes, diff, write.
    /// Errors of single routes are collected in the report and leave the syncer dirty; only a
    /// failing dump is returned as `Err`.
    pub async fn apply(&mut self, h: &RtnlHandle) -> Result<SyncReport> {
        if !self.needs_apply() {
            return Ok(SyncReport {
                skipped: true,
                ..SyncReport::default()
            });
        }
        self.dirty = true; // cleared only when the apply completes without errors
        let links = list_links(h).await?;
        let kernel = self.dump(h).await?;
        let now = Instant::now();
        let d = self.decide(&links, &kernel, now);

        let mut report = SyncReport {
            parked: d.parked.clone(),
            in_grace: d.in_grace.clone(),
            ..SyncReport::default()
        };
        let mut programmed = d.in_place.clone();
        for w in &d.writes {
            let msg = match self.build(&w.spec, w.oif) {
                Ok(m) => m,
                Err(e) => {
                    report.errors.push(e);
                    continue;
                }
            };
            let res = h.handle().route().add(msg).replace().execute().await;
            if res.is_ok() {
                programmed.extend(w.oif.map(|i| (w.key, i)));
            }
            match res {
                Ok(()) => match w.existing {
                    Some(k) => {
                        if k.oif.is_some() && w.oif.is_some() && k.oif != w.oif {
                            report.moved_or_gone.push(w.key.dst);
                        }
                        report.replaced.push(w.key);
                    }
                    None => report.added.push(w.key),
                },
                Err(e) => {
                    report
                        .errors
                        .push(RtnlError::kernel("programming route", w.key.to_string(), e))
                }
            }
        }
        for k in &d.deletes {
            match h.handle().route().del(k.msg.clone()).execute().await {
                Ok(()) => {
                    report.deleted.push(k.key);
                    report.moved_or_gone.push(k.key.dst);
                }
                Err(e) => {
                    let err = RtnlError::kernel("deleting route", k.key.to_string(), e);
                    // Gone already (its interface vanished meanwhile): that is the goal.
                    if err.errno() != Some(libc::ESRCH) {
                        let id = (k.key, k.oif.unwrap_or(0));
                        if self.programmed.contains(&id) {
                            programmed.insert(id); // still ours to delete on the retry
                        }
                        report.errors.push(err);
                    }
                }
            }
        }
        for (id, first) in &d.first_seen_new {
            self.first_seen.entry(*id).or_insert(*first);
        }
        self.first_seen.retain(|id, _| d.seen_unknown.contains(id));
        self.programmed = programmed;

        self.pending = !report.parked.is_empty() || !report.in_grace.is_empty();
        self.dirty = !report.errors.is_empty();
        tracing::debug!(
            family = ?self.family,
            table = self.table,
            added = report.added.len(),
            replaced = report.replaced.len(),
            deleted = report.deleted.len(),
            parked = report.parked.len(),
            in_grace = report.in_grace.len(),
            errors = report.errors.len(),
            "route sync"
        );
        Ok(report)
    }

    /// What [`RouteSyncer::apply`] would do now, computed by the same decision code, without
    /// writing anything or advancing grace periods (`felix-nft plan`).
    pub async fn plan(&self, h: &RtnlHandle) -> Result<RoutePlan> {
        let links = list_links(h).await?;
        let kernel = self.dump(h).await?;
        let by_index: BTreeMap<u32, &LinkState> = links.iter().map(|l| (l.index, l)).collect();
        let d = self.decide(&links, &kernel, Instant::now());
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
            if existing.is_some_and(|k| self.matches(k, spec, *oif)) {
                d.in_place.extend(oif.map(|i| (*key, i)));
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
            let ours_before = self.programmed.contains(&id);
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
        let msgs: Vec<RouteMessage> = h
            .handle()
            .route()
            .get(req)
            .execute()
            .try_collect()
            .await
            .map_err(|e| RtnlError::kernel("dumping routes of table", self.table.to_string(), e))?;
        Ok(msgs.into_iter().filter_map(|m| self.parse(m)).collect())
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
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Destination(a) => dst = route_ip(a),
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Priority(p) => metric = *p,
                RouteAttribute::Gateway(a) => gateway = route_ip(a),
                RouteAttribute::PrefSource(a) => src = route_ip(a),
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
            msg,
        })
    }

    fn matches(&self, k: &KernelRoute, spec: &RouteSpec, oif: Option<u32>) -> bool {
        // An IPv6 blackhole is reported on `lo`; a blackhole has no interface of ours.
        let oif_ok = spec.target == RouteTarget::Blackhole || k.oif == oif;
        if k.protocol != spec.protocol || k.src != spec.src || !oif_ok {
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
        }
    }

    fn build(&self, spec: &RouteSpec, oif: Option<u32>) -> Result<RouteMessage> {
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
        }
        if let Some(oif) = oif {
            b = b.output_interface(oif);
        }
        if let Some(src) = spec.src {
            b = b.pref_source(src).map_err(|e| bad(&e))?;
        }
        Ok(b.build())
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
        let own = Ownership::by_prefixes([80], vec!["cali".into()], Some([3, 80].into()));
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
        let any = Ownership::by_prefixes([80], vec!["cali".into()], None);
        assert!(any.owns(186, Some("cali123")));
        assert!(!any.owns(186, Some("eth0")));
    }

    #[test]
    fn set_routes_tracks_dirtiness_and_family() {
        let own = Ownership::by_prefixes([80], vec!["cali".into()], None);
        let mut s = RouteSyncer::new(IpFamily::V4, RT_TABLE_MAIN, own);
        s.dirty = false;
        let r = RouteSpec::device("10.0.0.1/32".parse().unwrap(), "cali1", 80, 1024);
        s.set_routes("cali1", vec![r.clone()]);
        assert!(s.needs_apply());
        s.dirty = false;
        s.set_routes("cali1", vec![r]);
        assert!(!s.needs_apply(), "same routes again is not a change");
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
        assert!(s.groups.is_empty());
    }
}
