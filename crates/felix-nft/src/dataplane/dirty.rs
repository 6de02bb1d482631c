//! What changed since the last apply: which phases have work, and how little of the host they
//! need to restate. The fields are this module's; the dataplane marks through what happened
//! (an endpoint, a route, a remote node changed) and the driver reads and clears through what
//! it applied, so the incremental overlay bookkeeping stays in one place.

use std::collections::BTreeSet;

use super::overlay::{OverlayKeys, VtepEntries};

/// What changed since the last apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dirty {
    tables: bool,
    /// The VXLAN devices, their FDB, neighbours and routes: all of them.
    overlay: bool,
    /// Only these remote nodes and blocks changed (with `overlay` false): the host phases
    /// restate their entries and route groups alone.
    overlay_keys: OverlayKeys,
    routes: bool,
    neighbours: bool,
    /// The WireGuard devices, peers, table and rule.
    wireguard: bool,
    /// Interfaces to (re)configure.
    ifaces: BTreeSet<String>,
    /// The workload interfaces whose routes and neighbours may have changed since the host
    /// phases last completed; `None`: all of them (start of day, routes from Felix, a retry).
    /// An endpoint update then costs the host phases its own interfaces, not every workload's.
    host_scope: Option<BTreeSet<String>>,
}

impl Dirty {
    /// Everything to check against the kernel (start of day).
    pub(super) fn all() -> Dirty {
        Dirty {
            tables: true,
            overlay: true,
            overlay_keys: OverlayKeys::default(),
            routes: true,
            neighbours: true,
            wireguard: true,
            ifaces: BTreeSet::new(),
            host_scope: None,
        }
    }

    /// Nothing to do, as right after the host phases completed.
    #[cfg(test)]
    pub(super) fn clean() -> Dirty {
        let mut d = Dirty::default();
        d.host_synced();
        d
    }

    /// Whether any phase has work.
    pub fn any(&self) -> bool {
        self.tables
            || self.overlay
            || !self.overlay_keys.is_empty()
            || self.routes
            || self.neighbours
            || self.wireguard
            || !self.ifaces.is_empty()
    }

    /// The nf_tables phase has work.
    pub fn tables(&self) -> bool {
        self.tables
    }

    /// The whole overlay is to be restated.
    pub fn overlay(&self) -> bool {
        self.overlay
    }

    /// The routes phase has work.
    pub fn routes(&self) -> bool {
        self.routes
    }

    /// The neighbours phase has work.
    pub fn neighbours(&self) -> bool {
        self.neighbours
    }

    /// The WireGuard phase has work.
    pub fn wireguard(&self) -> bool {
        self.wireguard
    }

    /// The interfaces to (re)configure.
    pub fn ifaces(&self) -> &BTreeSet<String> {
        &self.ifaces
    }

    /// The workload interfaces the host phases are scoped to (`None`: all).
    pub fn host_scope(&self) -> Option<&BTreeSet<String>> {
        self.host_scope.as_ref()
    }

    /// The remote nodes and blocks to restate, when they are all of the overlay's work.
    pub fn overlay_delta_keys(&self) -> Option<&OverlayKeys> {
        (!self.overlay && !self.overlay_keys.is_empty()).then_some(&self.overlay_keys)
    }

    // What happened (the dataplane's records).

    /// The tables are to be re-rendered.
    pub(super) fn tables_changed(&mut self) {
        self.tables = true;
    }

    /// What WireGuard wants may have changed.
    pub(super) fn wireguard_changed(&mut self) {
        self.wireguard = true;
    }

    pub(super) fn wireguard_applied(&mut self) {
        self.wireguard = false;
    }

    /// The VXLAN device, its FDB, ARP entries and routes may have changed.
    pub(super) fn overlay_changed(&mut self) {
        self.overlay = true;
        self.routes = true;
        self.neighbours = true;
        self.host_scope = None;
    }

    /// A route that is not a remote VXLAN block changed (a local block's blackhole, a
    /// no-encap route), or routes must be looked at again: all routes are restated.
    pub(super) fn all_routes_changed(&mut self) {
        self.routes = true;
        self.host_scope = None;
    }

    /// A remote VXLAN or IPIP block's route changed: its own route group is restated (unless
    /// the whole overlay is anyway).
    pub(super) fn remote_block_changed(&mut self, dst: Option<String>) {
        self.routes = true;
        if let Some(dst) = dst {
            if !self.overlay_all_pending() {
                self.overlay_keys.dsts.insert(dst);
            }
        }
    }

    /// A remote node's VTEP changed; `was` are its entries before the first change since the
    /// host phases last completed.
    pub(super) fn remote_node_changed(&mut self, node: &str, was: VtepEntries) {
        if !self.overlay_all_pending() {
            self.overlay_keys
                .nodes
                .entry(node.to_string())
                .or_insert(was);
        }
        self.routes = true;
        self.neighbours = true;
    }

    /// A remote node's host address changed: the route groups of its blocks are restated (the
    /// address is their IPIP gateway).
    pub(super) fn remote_host_changed(&mut self, node: &str) {
        if !self.overlay_all_pending() {
            self.overlay_keys.hosts.insert(node.to_string());
        }
        self.routes = true;
    }

    /// Workload endpoints on these interfaces changed: their routes, neighbours and
    /// configuration.
    pub(super) fn endpoints_changed(&mut self, ifaces: impl IntoIterator<Item = String>) {
        self.routes = true;
        self.neighbours = true;
        for i in ifaces {
            self.scope(&i);
            self.ifaces.insert(i);
        }
    }

    /// A workload interface flapped: its routes and neighbours are re-asserted, and it is
    /// configured when it came up.
    pub(super) fn workload_iface_changed(&mut self, iface: &str, came_up: bool) {
        self.routes = true;
        self.neighbours = true;
        self.scope(iface);
        if came_up {
            self.ifaces.insert(iface.to_string());
        }
    }

    // What was applied (the driver's records, through the dataplane).

    pub(super) fn tables_applied(&mut self) {
        self.tables = false;
    }

    /// The VXLAN devices are as desired; a device just created needs its routes and
    /// neighbours.
    pub(super) fn overlay_applied(&mut self, created: bool) {
        self.overlay = false;
        if created {
            self.routes = true;
            self.neighbours = true;
        }
    }

    pub(super) fn routes_applied(&mut self) {
        self.routes = false;
    }

    pub(super) fn neighbours_applied(&mut self) {
        self.neighbours = false;
    }

    /// Route and neighbour work is someone else's (`RouteSyncDisabled`).
    pub(super) fn host_routes_skipped(&mut self) {
        self.routes = false;
        self.neighbours = false;
        self.overlay = false;
    }

    /// Ends the host phases when routes, neighbours and the overlay are all applied: from now
    /// on only what changes (no interface, no remote node or block in scope). Returns whether
    /// they were.
    pub(super) fn finish_host_phases(&mut self) -> bool {
        let done = !self.routes && !self.neighbours && !self.overlay;
        if done {
            self.host_synced();
        }
        done
    }

    /// `iface` needs no (more) configuring.
    pub(super) fn iface_done(&mut self, iface: &str) {
        self.ifaces.remove(iface);
    }

    /// The host phases completed: no interface, remote node or block in scope.
    fn host_synced(&mut self) {
        self.host_scope = Some(BTreeSet::new());
        self.overlay_keys = OverlayKeys::default();
    }

    /// Adds a workload interface to the host phases' scope (a no-op when the scope is all).
    fn scope(&mut self, iface: &str) {
        if let Some(s) = &mut self.host_scope {
            s.insert(iface.to_string());
        }
    }

    /// Whether the next host phases state the whole overlay anyway (no key to record then).
    fn overlay_all_pending(&self) -> bool {
        self.overlay || self.host_scope.is_none()
    }
}
