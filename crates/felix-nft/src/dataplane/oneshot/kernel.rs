//! The kernel a one-shot command drives the loop's apply over: the real kernel, with what each
//! phase changes (or, for `plan` and `--dry-run`, would change) recorded for the report.
//!
//! `apply` writes through the real kernel's own phases and records what they wrote; `plan`
//! records what they would write and writes nothing; `--dry-run` hands the nf_tables batch to
//! the kernel without its END and plans the rest. Every phase is planned with the same decision
//! code before it is applied, so `plan` lists exactly what `apply` then changes.
//!
//! One transaction, nothing else changed: when the tables fail, the host phases after them do
//! nothing, and a refusal is not isolated input by input as the daemon does (the command exits
//! with the kernel's error instead).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::dataplane::kernel::{
    IpipOutcome, Kernel, KernelError, OverlayOutcome, RealKernel, RoutesOutcome, TableMode,
    TablesInput, TablesOutcome,
};
use crate::dataplane::{DataplaneConfig, IfaceConf};
use crate::ops::logging::chain;
use nf_tables::model::TablePatch;
use rtnl::ipip::IpipWanted;
use rtnl::link::LinkState;
use rtnl::neigh::{list_permanent, Mac};
use rtnl::routes::{RoutePlan, RouteSpec};
use rtnl::vxlan::VxlanWanted;

use super::report::{ConvergeReport, SysctlChange, VxlanChange};
use super::Mode;

/// The real kernel and the report of what went (or would go) to it.
pub(super) struct OneShotKernel {
    real: RealKernel,
    cfg: DataplaneConfig,
    mode: Mode,
    /// The link dump the dataplane was fed.
    links: Vec<LinkState>,
    /// The VXLAN devices the overlay phase was given: their neighbours are ours.
    vxlan: Vec<(String, bool)>,
    pub(super) report: ConvergeReport,
    /// The tables phase failed: the command reports this and the host phases do nothing.
    pub(super) tables_failed: Option<KernelError>,
    /// Sysctls as they were before the globals phase wrote: turning `ip_forward` (or IPv6's
    /// `all/forwarding`) on also turns every interface's `forwarding` on, which the interface
    /// phase would otherwise find done and `apply` not report, where `plan` lists it.
    before: BTreeMap<String, String>,
}

impl OneShotKernel {
    pub(super) fn new(
        real: RealKernel,
        cfg: &DataplaneConfig,
        mode: Mode,
        links: Vec<LinkState>,
    ) -> OneShotKernel {
        OneShotKernel {
            real,
            cfg: cfg.clone(),
            mode,
            links,
            vxlan: Vec::new(),
            report: ConvergeReport {
                route_sync_disabled: cfg.route_sync_disabled,
                ..ConvergeReport::default()
            },
            tables_failed: None,
            before: BTreeMap::new(),
        }
    }

    fn writes(&self) -> bool {
        self.mode == Mode::Apply
    }

    fn host_skipped(&self) -> bool {
        self.tables_failed.is_some()
    }

    /// The sysctls in `want` whose value differs now (an absent one is skipped, as the phases
    /// skip it).
    fn sysctl_diff(&self, want: Vec<(String, String)>) -> Vec<SysctlChange> {
        let read = |path: &str| match self.before.get(path) {
            Some(v) => Ok(v.clone()),
            None => self.real.procsys().read(path),
        };
        want.into_iter()
            .filter_map(|(path, to)| match read(&path) {
                Err(_) => None,
                Ok(from) if from == to => None,
                Ok(from) => Some(SysctlChange { path, from, to }),
            })
            .collect()
    }

    /// Records `changes`; after a write, only those that really took.
    fn record_sysctls(&mut self, mut changes: Vec<SysctlChange>) {
        if self.writes() {
            let procsys = self.real.procsys();
            changes.retain(|c| procsys.read(&c.path).ok().as_deref() == Some(c.to.as_str()));
        }
        self.report.sysctls.extend(changes);
    }
}

/// The global sysctls the globals phase writes.
fn global_sysctls(ip_forwarding: bool, ipv6: bool) -> Vec<(String, String)> {
    let mut want = Vec::new();
    if ip_forwarding {
        want.push(("net/ipv4/ip_forward".into(), "1".into()));
        if ipv6 {
            want.push(("net/ipv6/conf/all/forwarding".into(), "1".into()));
        }
    }
    want.push(("net/netfilter/nf_conntrack_acct".into(), "1".into()));
    want
}

/// The sysctls the interface phase writes for `iface`.
fn iface_sysctls(iface: &str, conf: &IfaceConf) -> Vec<(String, String)> {
    let mut want = vec![(format!("net/ipv6/conf/{iface}/accept_ra"), "0".into())];
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
    want
}

impl Kernel for OneShotKernel {
    async fn globals(&mut self, ip_forwarding: bool, ipv6: bool) -> Result<(), KernelError> {
        let changes = self.sysctl_diff(global_sysctls(ip_forwarding, ipv6));
        if self.writes() {
            for (global, family) in [
                ("net/ipv4/ip_forward", "ipv4"),
                ("net/ipv6/conf/all/forwarding", "ipv6"),
            ] {
                if !changes.iter().any(|c| c.path == global) {
                    continue;
                }
                for l in &self.links {
                    let path = format!("net/{family}/conf/{}/forwarding", l.name);
                    if let Ok(v) = self.real.procsys().read(&path) {
                        self.before.insert(path, v);
                    }
                }
            }
            self.real.globals(ip_forwarding, ipv6).await?;
        }
        self.record_sysctls(changes);
        Ok(())
    }

    async fn tables(
        &mut self,
        input: TablesInput,
        mode: TableMode,
    ) -> Result<TablesOutcome, KernelError> {
        let out = match self.mode {
            Mode::Apply => self.real.tables(input, mode).await,
            Mode::DryRun => self.real.tables(input, TableMode::DryRun).await,
            Mode::Plan => {
                // A plan diffs the whole desired state against what the kernel holds.
                let full = match input {
                    TablesInput::Full(t) => t,
                    TablesInput::Patch(p) => {
                        let mut store = Vec::new();
                        TablePatch::fold_all(p, &mut store);
                        store
                    }
                };
                self.real
                    .tables(TablesInput::Full(full), TableMode::Plan)
                    .await
            }
        };
        match out {
            Ok(mut out) => {
                // The plans move to the report (a full load's hold every rule); the loop reads
                // them only for metrics, which a one-shot command has none of.
                self.report.table_ops += out.ops;
                self.report.tables.append(&mut out.plans);
                Ok(out)
            }
            Err(e) => {
                // Not a refusal the loop would isolate input by input: the command fails with
                // the kernel's own error, and nothing else is written.
                let text = chain(&e);
                self.tables_failed = Some(e);
                Err(KernelError::Other(text))
            }
        }
    }

    async fn routes(
        &mut self,
        routes: &BTreeMap<String, Vec<RouteSpec>>,
        _only: Option<&BTreeSet<String>>,
        _resync: bool,
    ) -> Result<RoutesOutcome, KernelError> {
        let mut out = RoutesOutcome::default();
        if self.host_skipped() {
            return Ok(out);
        }
        let specs: BTreeMap<_, &RouteSpec> = routes
            .values()
            .flatten()
            .map(|r| ((r.dst.trunc(), r.metric), r))
            .collect();
        let writes = self.writes();
        let (syncers, _, h) = self.real.host_syncers();
        for s in syncers {
            for (group, specs) in routes {
                s.set_routes(group.clone(), specs.clone());
            }
            let plan = s
                .plan(h)
                .await
                .map_err(recorded(&mut self.report, "planning routes"))?;
            if !writes {
                let mut plan = plan;
                // A route through a VXLAN device the overlay phase creates first is added, not
                // parked.
                let created =
                    |dev: &str| self.report.vxlan.iter().any(|v| v.create && v.name == dev);
                let (now, parked): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.parked)
                    .into_iter()
                    .partition(|(_, dev)| created(dev));
                plan.parked = parked;
                plan.add.extend(
                    now.iter()
                        .filter_map(|(k, _)| specs.get(&(k.dst, k.metric)).copied())
                        .cloned(),
                );
                out.parked += plan.parked.len();
                merge_route_plan(&mut self.report.routes, plan);
                continue;
            }
            let rep = s
                .apply(h)
                .await
                .map_err(recorded(&mut self.report, "syncing routes"))?;
            let spec = |k: &rtnl::routes::RouteKey| specs.get(&(k.dst, k.metric)).copied();
            let r = &mut self.report.routes;
            r.add.extend(rep.added.iter().filter_map(spec).cloned());
            r.replace
                .extend(rep.replaced.iter().filter_map(spec).cloned());
            r.delete.extend(
                plan.delete
                    .iter()
                    .filter(|o| rep.deleted.contains(&o.key))
                    .cloned(),
            );
            r.parked.extend(rep.parked.iter().cloned());
            r.in_grace.extend(rep.in_grace.iter().cloned());
            out.changes += rep.changes();
            out.parked += rep.parked.len();
            out.in_grace += rep.in_grace.len();
            out.moved_or_gone
                .extend(rep.moved_or_gone.iter().map(|n| n.addr()));
            let errors: Vec<String> = rep.errors.iter().map(|e| chain(e)).collect();
            self.report.errors.extend(errors.iter().cloned());
            out.errors.extend(errors);
        }
        Ok(out)
    }

    async fn overlay(
        &mut self,
        devices: &[VxlanWanted],
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<OverlayOutcome, KernelError> {
        self.vxlan = devices
            .iter()
            .map(|w| (w.name.clone(), w.spec.is_some()))
            .collect();
        let mut out = OverlayOutcome::default();
        if self.host_skipped() {
            return Ok(out);
        }
        if !self.writes() {
            self.report.vxlan = vxlan_plan(devices, &self.links);
            return Ok(out);
        }
        for want in devices {
            let Some(spec) = &want.spec else { continue };
            match self
                .real
                .overlay(std::slice::from_ref(want), changed, resync)
                .await
            {
                Ok(o) => {
                    let changes = o.changes - usize::from(o.created);
                    if o.created || changes > 0 || o.parked {
                        self.report
                            .vxlan
                            .push(VxlanChange::of(spec, o.created, changes, o.parked));
                    }
                    out.created |= o.created;
                    out.changes += o.changes;
                    out.parked |= o.parked;
                }
                Err(e) => {
                    self.report.errors.push(format!(
                        "programming the VXLAN device {}: {}",
                        want.name,
                        chain(&e)
                    ));
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    async fn ipip(
        &mut self,
        want: &IpipWanted,
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<IpipOutcome, KernelError> {
        // A plan does not show tunl0: it is the kernel's own device, configured in place.
        if self.host_skipped() || !self.writes() {
            return Ok(IpipOutcome::default());
        }
        self.real
            .ipip(want, changed, resync)
            .await
            .inspect_err(|e| {
                self.report
                    .errors
                    .push(format!("programming the IPIP device: {}", chain(e)));
            })
    }

    async fn wireguard(
        &mut self,
        want: Vec<(rtnl::IpFamily, rtnl::wgsync::WgWanted)>,
        src_valid_mark: bool,
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<super::super::kernel::WgOutcome, KernelError> {
        // A plan does not show WireGuard's devices and table: they are read and written over
        // their own sockets, not planned.
        if self.host_skipped() || !self.writes() {
            return Ok(Default::default());
        }
        self.real
            .wireguard(want, src_valid_mark, changed, resync)
            .await
            .inspect_err(|e| {
                self.report
                    .errors
                    .push(format!("programming WireGuard: {}", chain(e)));
            })
    }

    async fn neighbours(
        &mut self,
        neigh: &BTreeMap<String, Vec<(IpAddr, Mac)>>,
        _only: Option<&BTreeSet<String>>,
        _changed: &BTreeSet<String>,
        _resync: bool,
    ) -> Result<(), KernelError> {
        if self.host_skipped() {
            return Ok(());
        }
        self.plan_neighbours(neigh).await?;
        if !self.writes() {
            return Ok(());
        }
        let (_, syncer, h) = self.real.host_syncers();
        let rep = syncer
            .apply(h)
            .await
            .map_err(recorded(&mut self.report, "syncing neighbours"))?;
        let errors: Vec<String> = rep.errors.iter().map(|e| chain(e)).collect();
        // What was actually written.
        let r = &mut self.report;
        r.neigh_set
            .retain(|(d, ip, _)| rep.set.iter().any(|(d2, ip2)| d == d2 && ip == ip2));
        r.neigh_delete.retain(|e| rep.deleted.contains(e));
        r.errors.extend(errors.iter().cloned());
        match errors.first() {
            Some(e) => Err(KernelError::Other(format!(
                "{} neighbour write(s) failed, first: {e}",
                errors.len()
            ))),
            None => Ok(()),
        }
    }

    async fn iface_conf(&mut self, iface: &str, conf: &IfaceConf) -> Result<(), KernelError> {
        if self.host_skipped() {
            return Ok(());
        }
        let changes = self.sysctl_diff(iface_sysctls(iface, conf));
        if self.writes() {
            if let Err(e) = self.real.iface_conf(iface, conf).await {
                if !e.is_vanished_interface() {
                    self.report
                        .errors
                        .push(format!("configuring interface {iface}: {}", chain(&e)));
                }
                return Err(e);
            }
        }
        self.record_sysctls(changes);
        Ok(())
    }

    async fn conntrack_cleanup(&mut self, ips: Vec<IpAddr>) {
        if self.writes() {
            self.real.conntrack_cleanup(ips).await;
        }
    }

    async fn conntrack_settle(&mut self) -> Vec<(IpAddr, String)> {
        self.real.conntrack_settle().await
    }
}

impl OneShotKernel {
    /// Compares the desired permanent neighbours with the kernel's and loads the neighbour
    /// syncer so that its apply makes exactly that change (recorded in the report): desired
    /// entries on every interface that has them, and ours that should go. Ours: the IPv4 entries
    /// of workload interfaces and the entries of the VXLAN devices (tunnel address → remote
    /// VTEP MAC, either family); a device the overlay phase creates before this one counts as up.
    async fn plan_neighbours(
        &mut self,
        desired: &BTreeMap<String, Vec<(IpAddr, Mac)>>,
    ) -> Result<(), KernelError> {
        let links = &self.links;
        let by_index: BTreeMap<u32, &LinkState> = links.iter().map(|l| (l.index, l)).collect();
        let by_name: BTreeMap<&str, &LinkState> =
            links.iter().map(|l| (l.name.as_str(), l)).collect();
        let vxlan: BTreeSet<&str> = self.vxlan.iter().map(|(n, _)| n.as_str()).collect();
        let made: BTreeSet<&str> = self
            .vxlan
            .iter()
            .filter(|(_, spec)| *spec)
            .map(|(n, _)| n.as_str())
            .collect();
        let (_, syncer, h) = self.real.host_syncers();
        let mut kernel: BTreeMap<String, BTreeMap<IpAddr, Option<Mac>>> = BTreeMap::new();
        for n in list_permanent(h)
            .await
            .map_err(recorded(&mut self.report, "listing neighbours"))?
        {
            match by_index.get(&n.ifindex) {
                Some(l)
                    if (self.cfg.is_workload_iface(&l.name) && n.ip.is_ipv4())
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
        let r = &mut self.report;
        for (iface, entries) in desired {
            let up = by_name.get(iface.as_str()).is_some_and(|l| l.admin_up)
                || made.contains(iface.as_str());
            if !up {
                r.neigh_parked.push(iface.clone());
                continue;
            }
            let have = kernel.get(iface);
            for (ip, mac) in entries {
                if have.and_then(|h| h.get(ip)) != Some(&Some(*mac)) {
                    r.neigh_set.push((iface.clone(), *ip, *mac));
                }
            }
        }
        for (iface, have) in &kernel {
            let want = desired.get(iface);
            for ip in have.keys() {
                if !want.is_some_and(|w| w.iter().any(|(wip, _)| wip == ip)) {
                    r.neigh_delete.push((iface.clone(), *ip));
                }
            }
        }
        // Only interfaces with a difference go to the syncer, so a converged node sees no
        // neighbour write at all (the syncer re-asserts every entry it is given).
        let changed: BTreeSet<&String> = r
            .neigh_set
            .iter()
            .map(|(i, _, _)| i)
            .chain(r.neigh_delete.iter().map(|(i, _)| i))
            .collect();
        for iface in changed {
            match desired.get(iface) {
                Some(entries) => syncer.set_neighbours(iface, entries.iter().copied()),
                None => {
                    // The syncer deletes only what it was told about: say the entries were
                    // wanted, then that they are not.
                    let have = kernel.get(iface).into_iter().flatten();
                    syncer.set_neighbours(
                        iface,
                        have.map(|(ip, mac)| (*ip, mac.unwrap_or_default())),
                    );
                    syncer.set_neighbours(iface, []);
                }
            }
        }
        Ok(())
    }
}

/// The VXLAN devices wanted, against the link dump: a missing one is to be created, one whose
/// parent interface is missing waits for it. A present device is compared with what is wanted
/// (and corrected in place, its FDB too) only by `apply`, which says what it did.
fn vxlan_plan(devices: &[VxlanWanted], links: &[LinkState]) -> Vec<VxlanChange> {
    let present = |name: &str| links.iter().any(|l| l.name == name);
    devices
        .iter()
        .filter_map(|w| {
            let spec = w.spec.as_ref()?;
            let parked = !present(&spec.parent);
            let create = !parked && !present(&w.name);
            (parked || create).then(|| VxlanChange::of(spec, create, 0, parked))
        })
        .collect()
}

fn merge_route_plan(into: &mut RoutePlan, p: RoutePlan) {
    into.add.extend(p.add);
    into.replace.extend(p.replace);
    into.delete.extend(p.delete);
    into.parked.extend(p.parked);
    into.in_grace.extend(p.in_grace);
}

/// An rtnetlink failure of `op`, recorded in the report as well as returned to the loop.
fn recorded<'a>(
    report: &'a mut ConvergeReport,
    op: &'a str,
) -> impl FnOnce(rtnl::RtnlError) -> KernelError + 'a {
    move |source| {
        let e = KernelError::Rtnl {
            op: op.to_string(),
            source: Box::new(source),
        };
        report.errors.push(chain(&e));
        e
    }
}
