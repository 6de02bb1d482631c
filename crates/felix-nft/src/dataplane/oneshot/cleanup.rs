//! `cleanup`: removes our tables, routes, permanent neighbours, VXLAN devices, and WireGuard's
//! devices with their rules and table routes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

use crate::dataplane::overlay::{VXLAN_IFACE_V4, VXLAN_IFACE_V6};
use crate::dataplane::DataplaneConfig;
use nf_tables::reconcile;
use rtnl::link;
use rtnl::neigh::{Mac, NeighSyncer};
use rtnl::netns::NetNs;
use rtnl::wgsync::{WgSyncer, WgWanted};
use rtnl::{IpFamily, RtnlHandle};

use super::dump::{open_nft, our_neighbours, OUR_TABLES};
use super::{route_syncers, rtnl, OneShotError};

/// What `cleanup` removed.
#[derive(Debug, Default)]
pub struct CleanupReport {
    /// Tables deleted (0, 1 or 2).
    pub tables: usize,
    /// Routes deleted, as `dump` prints them.
    pub routes: Vec<String>,
    /// Permanent neighbours deleted: (interface, address).
    pub neighbours: Vec<(String, IpAddr)>,
    /// VXLAN and WireGuard devices deleted (with their FDB, neighbours and routes).
    pub devices: Vec<String>,
    /// Policy-routing rules deleted (WireGuard's: the ones that look up its table).
    pub rules: usize,
    /// Routes deleted from WireGuard's table (those not on a deleted device).
    pub table_routes: usize,
    /// Route and neighbour work was skipped (`RouteSyncDisabled`).
    pub route_sync_disabled: bool,
    /// Failures of single routes or neighbours; any makes the exit code non-zero.
    pub errors: Vec<String>,
}

impl CleanupReport {
    /// Counts first, then one line per object removed.
    pub fn text(&self) -> String {
        let mut s = String::new();
        if self.tables == 0
            && self.routes.is_empty()
            && self.neighbours.is_empty()
            && self.devices.is_empty()
            && self.rules == 0
            && self.table_routes == 0
            && self.errors.is_empty()
        {
            s.push_str("nothing to do\n");
        }
        let _ = writeln!(
            s,
            "removed: {} table(s), {} route(s), {} neighbour(s)",
            self.tables,
            self.routes.len(),
            self.neighbours.len()
        );
        if self.route_sync_disabled {
            s.push_str("routes and neighbours: skipped (RouteSyncDisabled)\n");
        }
        for r in &self.routes {
            let _ = writeln!(s, "route delete {r}");
        }
        for (dev, ip) in &self.neighbours {
            let _ = writeln!(s, "neigh delete {ip} dev {dev}");
        }
        for d in &self.devices {
            let _ = writeln!(s, "link delete {d}");
        }
        if self.rules > 0 || self.table_routes > 0 {
            let _ = writeln!(
                s,
                "WireGuard: {} rule(s) and {} route(s) of its table deleted",
                self.rules, self.table_routes
            );
        }
        for e in &self.errors {
            let _ = writeln!(s, "error: {e}");
        }
        s
    }
}

/// Removes our tables (one transaction), our routes (no grace period), our permanent
/// neighbours on workload interfaces, our VXLAN devices and WireGuard's devices, rules and table
/// routes. Idempotent.
pub async fn cleanup(
    ns: Option<&NetNs>,
    cfg: &DataplaneConfig,
) -> Result<CleanupReport, OneShotError> {
    let mut rep = CleanupReport::default();
    let mut nft = open_nft(ns)?;
    rep.tables =
        reconcile::remove_tables(&mut nft, &OUR_TABLES).map_err(|source| OneShotError::Nft {
            op: "deleting our tables",
            source: Box::new(source),
        })?;
    if cfg.route_sync_disabled {
        // Routes and neighbours belong to whoever syncs them then (§15).
        rep.route_sync_disabled = true;
        return Ok(rep);
    }
    let h = RtnlHandle::connect(ns).map_err(rtnl("connecting to rtnetlink"))?;
    for mut s in route_syncers(cfg, Some(Duration::ZERO)) {
        let before = s.list_owned(&h).await.map_err(rtnl("listing routes"))?;
        let r = s.apply(&h).await.map_err(rtnl("deleting routes"))?;
        rep.routes.extend(
            before
                .iter()
                .filter(|o| r.deleted.contains(&o.key))
                .map(|o| o.to_string()),
        );
        rep.errors
            .extend(r.errors.iter().map(|e| crate::ops::logging::chain(e)));
    }
    let mut neigh = NeighSyncer::new();
    let mut by_iface: BTreeMap<String, Vec<(IpAddr, Mac)>> = BTreeMap::new();
    for (dev, ip, mac) in our_neighbours(&h, cfg).await? {
        by_iface
            .entry(dev)
            .or_default()
            .push((ip, mac.unwrap_or_default()));
    }
    for (dev, entries) in &by_iface {
        // Known first, then unwanted: the syncer deletes what it was told about.
        neigh.set_neighbours(dev, entries.iter().copied());
        neigh.set_neighbours(dev, []);
    }
    let r = neigh.apply(&h).await.map_err(rtnl("deleting neighbours"))?;
    rep.neighbours = r.deleted;
    rep.errors
        .extend(r.errors.iter().map(|e| crate::ops::logging::chain(e)));
    // The devices go last: what lives on them (FDB, neighbours) goes with them.
    for name in [VXLAN_IFACE_V4, VXLAN_IFACE_V6] {
        let gone = match link::get_link(&h, name).await {
            Ok(None) => continue,
            Ok(Some(_)) => link::delete(&h, name).await,
            Err(e) => Err(e),
        };
        match gone {
            Ok(()) => rep.devices.push(name.to_string()),
            Err(e) => rep.errors.push(crate::ops::logging::chain(&e)),
        }
    }
    // WireGuard's devices, the rules that send traffic to its table and our routes in it, as a
    // disabled WireGuard leaves them: whatever the configuration says now.
    let wg = &cfg.wireguard;
    let mut families = vec![(IpFamily::V4, wg.v4.iface.clone())];
    if wg.ipv6 {
        families.push((IpFamily::V6, wg.v6.iface.clone()));
    }
    for (family, name) in families {
        let mut syncer = WgSyncer::new(family);
        syncer.set(WgWanted::Disabled {
            name: name.clone(),
            table: wg.table,
        });
        match syncer.apply(&h, ns).await {
            Ok(r) => {
                if r.deleted {
                    rep.devices.push(name);
                }
                rep.rules += r.corrected.iter().filter(|c| *c == "-rule").count();
                rep.table_routes += r.route_changes;
            }
            Err(e) => rep.errors.push(crate::ops::logging::chain(&e)),
        }
    }
    Ok(rep)
}
