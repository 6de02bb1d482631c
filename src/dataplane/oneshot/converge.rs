//! `apply` and `plan`: the dataplane built from the document and the interface dump, and the
//! phases run (or planned) once in the loop's order.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::dataplane::kernel::{Kernel, RealKernel, TableMode, TablesInput};
use crate::dataplane::validate::Valid;
use crate::dataplane::{Dataplane, DataplaneConfig, Desired, IfaceConf};
use crate::netns::NetNs;
use crate::proto::ToDataplane;
use crate::rtnl::link::{list_addresses, list_links, LinkState};
use crate::rtnl::monitor::{ExcludeList, IfaceEvent};
use crate::rtnl::neigh::{list_permanent, Mac, NeighSyncer};
use crate::rtnl::routes::{RoutePlan, RouteSpec};
use crate::rtnl::RtnlHandle;

use super::report::{ConvergeReport, SysctlChange, VxlanChange};
use super::{kern, rtnl, validated, Mode, OneShotError};

/// Feeds a link + address dump to the dataplane, as the interface monitor's first sync would.
async fn feed_ifaces(
    dp: &mut Dataplane,
    h: &RtnlHandle,
    cfg: &DataplaneConfig,
) -> Result<Vec<LinkState>, OneShotError> {
    let exclude = ExcludeList::new(&cfg.iface_exclude).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "InterfaceExclude has a bad regex; excluding nothing");
        ExcludeList::new(&[]).unwrap_or_else(|_| unreachable!("an empty list always compiles"))
    });
    let links = list_links(h).await.map_err(rtnl("listing interfaces"))?;
    let addrs = list_addresses(h)
        .await
        .map_err(rtnl("listing interface addresses"))?;
    for l in links.iter().filter(|l| !exclude.matches(&l.name)) {
        dp.on_iface(&IfaceEvent::Link(l.clone()));
        dp.on_iface(&IfaceEvent::Addrs {
            index: l.index,
            name: l.name.clone(),
            addrs: addrs
                .iter()
                .filter(|(i, _)| *i == l.index)
                .map(|(_, a)| *a)
                .collect(),
        });
    }
    dp.on_iface(&IfaceEvent::InSync);
    Ok(links)
}

/// Builds the dataplane from the document and runs (or plans) the phases once. The messages
/// are validated first, as a whole; any error changes nothing.
pub async fn converge(
    ns: Option<&NetNs>,
    cfg: &DataplaneConfig,
    msgs: Vec<ToDataplane>,
    mode: Mode,
) -> Result<ConvergeReport, OneShotError> {
    let msgs = validated(cfg, msgs)?;
    converge_retaining(ns, cfg, msgs, mode)
        .await
        .map(|(changes, _)| changes)
}

/// The big structures [`converge`] built, handed back so that a process about to exit can skip
/// freeing them.
pub struct Retained {
    _desired: Desired,
    _kernel: RealKernel,
}

/// [`converge`] of messages [`super::load_state`] validated.
pub(super) async fn converge_retaining(
    ns: Option<&NetNs>,
    cfg: &DataplaneConfig,
    msgs: Vec<Valid>,
    mode: Mode,
) -> Result<(ConvergeReport, Retained), OneShotError> {
    let mut kernel = RealKernel::open(ns, cfg).map_err(kern("opening the kernel sockets"))?;
    let (mut desired, up_ifaces, links) = desired_state(&kernel, cfg, msgs).await?;
    // Everything is planned against the kernel as it is now, by the code apply uses.
    let mut ch = ConvergeReport {
        route_sync_disabled: cfg.route_sync_disabled,
        sysctls: sysctl_plan(&kernel, cfg, &up_ifaces),
        ..ConvergeReport::default()
    };
    plan_host(&mut kernel, cfg, &desired, &links, &mut ch).await?;
    let out = match mode {
        Mode::Plan => kernel
            .plan_tables(&desired.tables)
            .await
            .map_err(kern("planning nf_tables"))?,
        Mode::DryRun => kernel
            .tables(
                TablesInput::Full(std::mem::take(&mut desired.tables)),
                TableMode::DryRun,
            )
            .await
            .map_err(kern("validating the nf_tables batch (dry run)"))?,
        Mode::Apply => {
            // The fixed order (§10.3): globals → tables → routes → neighbours → interface
            // sysctls.
            kernel
                .globals(cfg.ip_forwarding, cfg.ipv6)
                .await
                .map_err(kern("start-of-day sysctls"))?;
            kernel
                .tables(
                    TablesInput::Full(std::mem::take(&mut desired.tables)),
                    TableMode::Resync,
                )
                .await
                .map_err(kern(
                    "programming nf_tables (one transaction; nothing was changed there)",
                ))?
        }
    };
    ch.table_ops = out.ops;
    ch.tables = out.plans;
    if mode == Mode::Apply {
        if ch.table_ops == 0 {
            tracing::info!("nf_tables already converged: no transaction sent");
        } else {
            tracing::info!(ops = ch.table_ops, "nf_tables transaction committed");
        }
        if !cfg.route_sync_disabled {
            apply_overlay(&mut kernel, &desired, &mut ch).await;
            apply_host(&mut kernel, &desired, &mut ch).await?;
        }
        apply_ifaces(&mut kernel, &up_ifaces, &mut ch).await;
    }
    Ok((
        ch,
        Retained {
            _desired: desired,
            _kernel: kernel,
        },
    ))
}

/// The dataplane fed with the interface dump and the document, rendered: the desired state,
/// the workload interfaces that are up (with their configuration) and the links.
async fn desired_state(
    kernel: &RealKernel,
    cfg: &DataplaneConfig,
    msgs: Vec<Valid>,
) -> Result<(Desired, BTreeMap<String, IfaceConf>, Vec<LinkState>), OneShotError> {
    let default_rp = kernel.procsys().default_rp_filter();
    let mut dp = Dataplane::new(cfg.clone(), default_rp).map_err(OneShotError::Render)?;
    let links = feed_ifaces(&mut dp, kernel.rtnl(), cfg).await?;
    // Validated as a whole by `load_state` (validate_all), message by message in order.
    for v in msgs {
        dp.on_validated_update(v);
    }
    // The model holds what it needs: the document's messages were consumed, before peak
    // memory is reached, in the nf_tables phase.
    dp.set_datastore_in_sync();
    dp.set_ifaces_in_sync();
    let desired = dp.desired().map_err(OneShotError::Render)?;
    let up_ifaces: BTreeMap<String, IfaceConf> = desired
        .iface_conf
        .iter()
        .filter(|(name, _)| dp.ifaces().get(*name).is_some_and(|i| i.oper_up))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    // Everything after works from `desired`; the model and its caches go before the nf_tables
    // phase, where the reconciler copies the tables (peak memory).
    drop(dp);
    Ok((desired, up_ifaces, links))
}

/// Plans routes and neighbours into `ch` (nothing when `RouteSyncDisabled`), loading the
/// kernel's syncers so that their apply makes the planned change.
async fn plan_host(
    kernel: &mut RealKernel,
    cfg: &DataplaneConfig,
    desired: &Desired,
    links: &[LinkState],
    ch: &mut ConvergeReport,
) -> Result<(), OneShotError> {
    if cfg.route_sync_disabled {
        return Ok(());
    }
    ch.vxlan = vxlan_plan(desired, links);
    let (routes, neigh, h) = kernel.host_syncers();
    for s in routes {
        for (group, specs) in &desired.routes {
            s.set_routes(group.clone(), specs.clone());
        }
        let p = s.plan(h).await.map_err(rtnl("planning routes"))?;
        merge_route_plan(&mut ch.routes, p);
    }
    neigh_plan(h, cfg, desired, links, ch, neigh).await
}

/// The VXLAN devices the document wants, from the link dump: a missing one is to be created,
/// one whose parent interface is missing waits for it. A present device is compared with what
/// is wanted (and corrected in place, its FDB too) only by `apply`, which says what it did.
fn vxlan_plan(desired: &Desired, links: &[LinkState]) -> Vec<VxlanChange> {
    let present = |name: &str| links.iter().any(|l| l.name == name);
    desired
        .vxlan
        .iter()
        .filter_map(|w| {
            let spec = w.spec.as_ref()?;
            let parked = !present(&spec.parent);
            let create = !parked && !present(&w.name);
            (parked || create).then(|| VxlanChange::of(spec, create, 0, parked))
        })
        .collect()
}

/// The VXLAN devices and their FDB entries, before the routes and neighbours that live on
/// them (the driver's order); `ch.vxlan` becomes what was done to each.
async fn apply_overlay(kernel: &mut RealKernel, desired: &Desired, ch: &mut ConvergeReport) {
    ch.vxlan.clear();
    for want in &desired.vxlan {
        let Some(spec) = &want.spec else { continue };
        match kernel
            .overlay(std::slice::from_ref(want), &BTreeSet::new(), true)
            .await
        {
            Ok(out) => {
                let changes = out.changes - usize::from(out.created);
                if out.created || changes > 0 || out.parked {
                    ch.vxlan
                        .push(VxlanChange::of(spec, out.created, changes, out.parked));
                }
            }
            Err(e) => ch.errors.push(format!(
                "programming the VXLAN device {}: {}",
                want.name,
                crate::ops::logging::chain(&e)
            )),
        }
    }
}

/// Writes the planned routes and neighbours; `ch` keeps what was written, and the failures.
async fn apply_host(
    kernel: &mut RealKernel,
    desired: &Desired,
    ch: &mut ConvergeReport,
) -> Result<(), OneShotError> {
    let planned = std::mem::take(&mut ch.routes);
    let specs: BTreeMap<_, &RouteSpec> = desired
        .routes
        .values()
        .flatten()
        .map(|r| ((r.dst.trunc(), r.metric), r))
        .collect();
    let (routes, neigh, h) = kernel.host_syncers();
    for s in routes {
        let rep = s.apply(h).await.map_err(rtnl("syncing routes"))?;
        let spec = |k: &crate::rtnl::routes::RouteKey| specs.get(&(k.dst, k.metric)).copied();
        ch.routes
            .add
            .extend(rep.added.iter().filter_map(spec).cloned());
        ch.routes
            .replace
            .extend(rep.replaced.iter().filter_map(spec).cloned());
        ch.routes.delete.extend(
            planned
                .delete
                .iter()
                .filter(|o| rep.deleted.contains(&o.key))
                .cloned(),
        );
        ch.routes.parked.extend(rep.parked);
        ch.routes.in_grace.extend(rep.in_grace);
        ch.errors
            .extend(rep.errors.iter().map(|e| crate::ops::logging::chain(e)));
    }
    let rep = neigh.apply(h).await.map_err(rtnl("syncing neighbours"))?;
    ch.errors
        .extend(rep.errors.iter().map(|e| crate::ops::logging::chain(e)));
    // What was actually written.
    ch.neigh_set
        .retain(|(d, ip, _)| rep.set.iter().any(|(d2, ip2)| d == d2 && ip == ip2));
    ch.neigh_delete.retain(|e| rep.deleted.contains(e));
    Ok(())
}

/// Configures the workload interfaces that are up; `ch` keeps the sysctls that really changed.
async fn apply_ifaces(
    kernel: &mut RealKernel,
    up_ifaces: &BTreeMap<String, IfaceConf>,
    ch: &mut ConvergeReport,
) {
    for (iface, conf) in up_ifaces {
        if let Err(e) = kernel.iface_conf(iface, conf).await {
            if !e.is_vanished_interface() {
                ch.errors.push(format!(
                    "configuring interface {iface}: {}",
                    crate::ops::logging::chain(&e)
                ));
            }
        }
    }
    // Report only what really changed: re-read what the plan said would differ.
    ch.sysctls
        .retain(|c| kernel.procsys().read(&c.path).ok().as_deref() == Some(c.to.as_str()));
}

fn merge_route_plan(into: &mut RoutePlan, p: RoutePlan) {
    into.add.extend(p.add);
    into.replace.extend(p.replace);
    into.delete.extend(p.delete);
    into.parked.extend(p.parked);
    into.in_grace.extend(p.in_grace);
}

/// Compares the desired permanent neighbours with the kernel's and loads `syncer` so that its
/// apply makes exactly that change: desired entries on every workload interface, and our
/// entries on workload interfaces that should have none queued for deletion.
async fn neigh_plan(
    h: &RtnlHandle,
    cfg: &DataplaneConfig,
    desired: &Desired,
    links: &[LinkState],
    ch: &mut ConvergeReport,
    syncer: &mut NeighSyncer,
) -> Result<(), OneShotError> {
    let by_index: BTreeMap<u32, &LinkState> = links.iter().map(|l| (l.index, l)).collect();
    let by_name: BTreeMap<&str, &LinkState> = links.iter().map(|l| (l.name.as_str(), l)).collect();
    // The VXLAN devices' neighbours (tunnel address → remote VTEP MAC, either family) are ours
    // like a workload interface's IPv4 ones; a device the overlay phase creates before the
    // neighbours phase counts as up.
    let vxlan: BTreeSet<&str> = desired.vxlan.iter().map(|w| w.name.as_str()).collect();
    let made: BTreeSet<&str> = desired
        .vxlan
        .iter()
        .filter(|w| w.spec.is_some())
        .map(|w| w.name.as_str())
        .collect();
    let mut kernel: BTreeMap<String, BTreeMap<IpAddr, Option<Mac>>> = BTreeMap::new();
    for n in list_permanent(h)
        .await
        .map_err(rtnl("listing neighbours"))?
    {
        match by_index.get(&n.ifindex) {
            Some(l)
                if (cfg.is_workload_iface(&l.name) && n.ip.is_ipv4())
                    || vxlan.contains(l.name.as_str()) =>
            {
                kernel
                    .entry(l.name.clone())
                    .or_default()
                    .insert(n.ip, n.mac);
            }
            _ => {}
        }
    }
    for (iface, entries) in &desired.neighbours {
        let up = by_name.get(iface.as_str()).is_some_and(|l| l.admin_up)
            || made.contains(iface.as_str());
        if !up {
            ch.neigh_parked.push(iface.clone());
            continue;
        }
        let have = kernel.get(iface);
        for (ip, mac) in entries {
            if have.and_then(|h| h.get(ip)) != Some(&Some(*mac)) {
                ch.neigh_set.push((iface.clone(), *ip, *mac));
            }
        }
    }
    for (iface, have) in &kernel {
        let want = desired.neighbours.get(iface);
        for ip in have.keys() {
            if !want.is_some_and(|w| w.iter().any(|(wip, _)| wip == ip)) {
                ch.neigh_delete.push((iface.clone(), *ip));
            }
        }
    }
    // Only interfaces with a difference go to the syncer, so a converged node sees no
    // neighbour write at all (the syncer re-asserts every entry it is given).
    let changed: BTreeSet<&String> = ch
        .neigh_set
        .iter()
        .map(|(i, _, _)| i)
        .chain(ch.neigh_delete.iter().map(|(i, _)| i))
        .collect();
    for iface in changed {
        match desired.neighbours.get(iface) {
            Some(entries) => syncer.set_neighbours(iface, entries.iter().copied()),
            None => {
                // The syncer deletes only what it was told about: say the entries were wanted,
                // then that they are not.
                let have = kernel.get(iface).into_iter().flatten();
                syncer.set_neighbours(iface, have.map(|(ip, mac)| (*ip, mac.unwrap_or_default())));
                syncer.set_neighbours(iface, []);
            }
        }
    }
    Ok(())
}

/// The sysctls the globals and interface phases write, with the values that differ now.
fn sysctl_plan(
    kernel: &RealKernel,
    cfg: &DataplaneConfig,
    ifaces: &BTreeMap<String, IfaceConf>,
) -> Vec<SysctlChange> {
    let mut want: Vec<(String, String)> = Vec::new();
    if cfg.ip_forwarding {
        want.push(("net/ipv4/ip_forward".into(), "1".into()));
        if cfg.ipv6 {
            want.push(("net/ipv6/conf/all/forwarding".into(), "1".into()));
        }
    }
    want.push(("net/netfilter/nf_conntrack_acct".into(), "1".into()));
    for (iface, conf) in ifaces {
        want.push((format!("net/ipv6/conf/{iface}/accept_ra"), "0".into()));
        for (k, v) in [
            ("route_localnet", 1),
            ("proxy_arp", 1),
            ("forwarding", 1),
            ("rp_filter", conf.rp_filter),
        ] {
            want.push((format!("net/ipv4/conf/{iface}/{k}"), v.to_string()));
        }
        want.push((format!("net/ipv4/neigh/{iface}/proxy_delay"), "0".into()));
        if conf.ipv6 {
            want.push((format!("net/ipv6/conf/{iface}/proxy_ndp"), "1".into()));
            want.push((format!("net/ipv6/conf/{iface}/forwarding"), "1".into()));
        }
    }
    want.into_iter()
        .filter_map(|(path, to)| match kernel.procsys().read(&path) {
            // Absent (no conntrack module, IPv6 off): the phase skips it too.
            Err(_) => None,
            Ok(from) if from == to => None,
            Ok(from) => Some(SysctlChange { path, from, to }),
        })
        .collect()
}
