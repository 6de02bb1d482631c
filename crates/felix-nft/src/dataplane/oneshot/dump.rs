//! `dump`: our tables, routes and neighbours as the kernel holds them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::dataplane::DataplaneConfig;
use nf_tables::model::{Family, Table};
use nf_tables::print;
use nf_tables::reconcile::{Nft, NftKernel};
use rtnl::link::{list_links, LinkState};
use rtnl::neigh::{list_permanent, Mac};
use rtnl::netns::NetNs;
use rtnl::routes::OwnedRoute;
use rtnl::RtnlHandle;

use super::report::fmt_mac;
use super::{route_syncers, rtnl, OneShotError};

/// Our objects as the kernel holds them.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Our tables (`ip calico`, `ip6 calico`) that exist.
    pub tables: Vec<Table>,
    /// Routes the §15 ownership rule makes ours (none when `RouteSyncDisabled`).
    pub routes: Vec<OwnedRoute>,
    /// Permanent IPv4 neighbours on workload interfaces: (interface, address, MAC).
    pub neighbours: Vec<(String, IpAddr, Option<Mac>)>,
}

/// Opens an nf_tables socket in `ns` (the socket stays in the namespace it was made in).
pub(super) fn open_nft(ns: Option<&NetNs>) -> Result<Nft, OneShotError> {
    let op = "opening the nf_tables socket";
    match ns {
        Some(ns) => ns.run(Nft::open).map_err(OneShotError::NetNs)?,
        None => Nft::open(),
    }
    .map_err(|source| OneShotError::Nft {
        op,
        source: Box::new(source),
    })
}

/// Every table felix-nft may own: the main and side tables of both families.
pub(super) const OUR_TABLES: [(Family, &str); 4] = [
    (Family::Ip, felix_nft_rules::OWNER),
    (Family::Ip6, felix_nft_rules::OWNER),
    (Family::Ip, felix_nft_rules::SIDE_TABLE),
    (Family::Ip6, felix_nft_rules::SIDE_TABLE),
];

pub(super) async fn our_neighbours(
    h: &RtnlHandle,
    cfg: &DataplaneConfig,
) -> Result<Vec<(String, IpAddr, Option<Mac>)>, OneShotError> {
    let links = list_links(h).await.map_err(rtnl("listing interfaces"))?;
    let by_index: BTreeMap<u32, &LinkState> = links.iter().map(|l| (l.index, l)).collect();
    Ok(list_permanent(h)
        .await
        .map_err(rtnl("listing neighbours"))?
        .into_iter()
        .filter(|n| n.ip.is_ipv4())
        .filter_map(|n| {
            let l = by_index.get(&n.ifindex)?;
            cfg.is_workload_iface(&l.name)
                .then(|| (l.name.clone(), n.ip, n.mac))
        })
        .collect())
}

/// Reads our tables, routes and neighbours.
pub async fn snapshot(ns: Option<&NetNs>, cfg: &DataplaneConfig) -> Result<Snapshot, OneShotError> {
    let mut nft = open_nft(ns)?;
    let mut snap = Snapshot::default();
    for (f, name) in OUR_TABLES {
        if let Some(t) = nft
            .read_table(f, name)
            .map_err(|source| OneShotError::Nft {
                op: "reading our tables",
                source: Box::new(source),
            })?
        {
            snap.tables.push(t.table);
        }
    }
    if cfg.route_sync_disabled {
        // Someone else manages routes and neighbours then; none of them is ours.
        return Ok(snap);
    }
    let h = RtnlHandle::connect(ns).map_err(rtnl("connecting to rtnetlink"))?;
    for s in route_syncers(cfg, None) {
        snap.routes
            .extend(s.list_owned(&h).await.map_err(rtnl("listing routes"))?);
    }
    snap.neighbours = our_neighbours(&h, cfg).await?;
    // Stable output: the kernel's dump order follows its hash tables.
    snap.routes
        .sort_by(|a, b| (&a.ifname, a.key).cmp(&(&b.ifname, b.key)));
    snap.neighbours.sort();
    Ok(snap)
}

fn table_counts(t: &Table) -> (usize, usize, usize, usize) {
    (
        t.chains.len(),
        t.chains.values().map(|c| c.rules.len()).sum(),
        t.sets.len(),
        t.sets.values().map(|s| s.elements.len()).sum(),
    )
}

impl Snapshot {
    /// Human form: counts, then the tables in nft syntax, routes and neighbours.
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail, and every piece written is a String.
        let _ = self.write_text(&mut out);
        String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into())
    }

    /// [`Snapshot::text`], written to `out` one table at a time.
    pub fn write_text(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "tables: {}, routes: {}, neighbours: {}",
            self.tables.len(),
            self.routes.len(),
            self.neighbours.len()
        );
        for t in &self.tables {
            let (c, r, st, e) = table_counts(t);
            let _ = writeln!(
                s,
                "table {} {}: {c} chains, {r} rules, {st} sets, {e} elements",
                t.family.name(),
                t.name
            );
        }
        for t in &self.tables {
            // Endpoint chains are shared by content: say which one each interface uses, and
            // what its own dispatch elements counted (the chains' counters add up all users').
            for (iface, d) in felix_nft_rules::Renderer::dispatched_workloads(t) {
                let traffic = |t: Option<felix_nft_rules::Traffic>| {
                    t.map(|t| format!(" ({} packets, {} bytes)", t.packets, t.bytes))
                        .unwrap_or_default()
                };
                let _ = writeln!(
                    s,
                    "endpoint {iface} ({} {}): to {}{} from {}{}",
                    t.family.name(),
                    t.name,
                    d.to.unwrap_or("-"),
                    traffic(d.to_traffic),
                    d.from.unwrap_or("-"),
                    traffic(d.from_traffic),
                );
            }
        }
        for r in &self.routes {
            let _ = writeln!(s, "route {r}");
        }
        for (dev, ip, mac) in &self.neighbours {
            let mac = mac.as_ref().map(fmt_mac).unwrap_or_else(|| "-".into());
            let _ = writeln!(s, "neigh {ip} lladdr {mac} dev {dev}");
        }
        out.write_all(s.as_bytes())?;
        for t in &self.tables {
            out.write_all(print::table(t).as_bytes())?;
        }
        out.flush()
    }

    /// JSON form: a summary per table (counts, and each chain's rules in debug form), routes and
    /// neighbours.
    pub fn json(&self) -> String {
        let tables: Vec<serde_json::Value> = self
            .tables
            .iter()
            .map(|t| {
                let (c, r, st, e) = table_counts(t);
                let chains: serde_json::Map<String, serde_json::Value> = t
                    .chains
                    .iter()
                    .map(|(name, ch)| {
                        (
                            name.clone(),
                            ch.rules
                                .iter()
                                .map(|r| print::rule(r).trim_end().to_string())
                                .collect::<Vec<_>>()
                                .into(),
                        )
                    })
                    .collect();
                let sets: serde_json::Map<String, serde_json::Value> = t
                    .sets
                    .iter()
                    .map(|(name, set)| (name.clone(), set.elements.len().into()))
                    .collect();
                serde_json::json!({
                    "family": t.family.name(),
                    "name": t.name,
                    "flags": t.flags,
                    "chains": c,
                    "rules": r,
                    "sets": st,
                    "elements": e,
                    "chain_rules": chains,
                    "set_elements": sets,
                    "endpoints": felix_nft_rules::Renderer::dispatched_workloads(t)
                        .into_iter()
                        .map(|(iface, d)| {
                            let v = serde_json::json!({
                                "to": d.to,
                                "from": d.from,
                                "to_traffic": d.to_traffic,
                                "from_traffic": d.from_traffic,
                            });
                            (iface, v)
                        })
                        .collect::<serde_json::Map<String, serde_json::Value>>(),
                })
            })
            .collect();
        let routes: Vec<serde_json::Value> = self
            .routes
            .iter()
            .map(|r| {
                serde_json::json!({
                    "dst": r.key.dst.to_string(),
                    "metric": r.key.metric,
                    "dev": r.ifname,
                    "protocol": r.protocol,
                    "type": r.kind,
                    "gateway": r.gateway.map(|g| g.to_string()),
                    "src": r.src.map(|g| g.to_string()),
                })
            })
            .collect();
        let neighbours: Vec<serde_json::Value> = self
            .neighbours
            .iter()
            .map(|(dev, ip, mac)| {
                serde_json::json!({
                    "dev": dev,
                    "dst": ip.to_string(),
                    "lladdr": mac.as_ref().map(fmt_mac),
                })
            })
            .collect();
        let mut s = serde_json::json!({
            "tables": tables,
            "routes": routes,
            "neighbours": neighbours,
        })
        .to_string();
        s.push('\n');
        s
    }
}
