//! The seam between the loop and the kernel: one trait with a phase per kind of kernel object,
//! called in the fixed apply order (§10.3). [`RealKernel`] is nf_tables over one long-lived socket,
//! committed from the loop's own thread (a batch runs synchronously inside `sendmsg`; see
//! `NftSide`), plus rtnetlink on tokio; [`FakeKernel`] records calls and injects failures for
//! loop tests.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use nf_tables::features::Features;
use nf_tables::model::{Family, Set, Table, TablePatch};
use nf_tables::reconcile::{Nft, Reconciler, SyncOptions, TableSyncReport};
use nf_tables::NftError;
use rtnl::conntrack::Conntrack;
use rtnl::devconf::{self, Ipv4Conf, Ipv6Conf, ProcSys};
use rtnl::handle::blocking;
use rtnl::ipip::{IpipSyncer, IpipWanted, IPIP_IFACE};
use rtnl::neigh::{Mac, NeighSyncer};
use rtnl::netns::NetNs;
use rtnl::routes::{RouteSpec, RouteSyncer, RT_TABLE_MAIN};
use rtnl::vxlan::{Entries, VxlanSyncer, VxlanWanted};
use rtnl::wgsync::{WgSyncer, WgWanted};
use rtnl::wireguard::Key;
use rtnl::{IpFamily, RtnlError, RtnlHandle};

use super::{DataplaneConfig, IfaceConf};

/// How to program the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableMode {
    /// Diff against what we last committed (re-read only if someone else wrote since).
    Incremental,
    /// Re-read the kernel first (refresh timer, after an error): repairs drift. Skipped when
    /// the ruleset generation shows no commit since ours (nothing can have drifted).
    Resync,
    /// Delete and re-add every table in one transaction (after repeated failures).
    Rebuild,
    /// Send the batch without END: the kernel validates and keeps nothing.
    DryRun,
    /// Read and diff only; send nothing (`plan`).
    Plan,
}

/// What the tables phase is given.
#[derive(Debug, Clone)]
pub enum TablesInput {
    /// The whole desired state (one-shot commands).
    Full(Vec<Table>),
    /// What changed since the last call (the daemon: the kernel side keeps the rest).
    Patch(Vec<TablePatch>),
}

/// The most objects an incremental apply may carry and still run on the calling worker (see
/// [`NftSide`]); an endpoint is about ten, a full load tens of thousands.
const INLINE_OBJECTS: usize = 256;

impl TablesInput {
    /// How many chains, sets and set elements this input names.
    pub fn objects(&self) -> usize {
        match self {
            TablesInput::Full(ts) => ts
                .iter()
                .map(|t| {
                    t.chains.len() + t.sets.values().map(|s| 1 + s.elements.len()).sum::<usize>()
                })
                .sum(),
            TablesInput::Patch(ps) => ps
                .iter()
                .map(|p| {
                    let sets: usize = p
                        .sets
                        .values()
                        .map(|s| 1 + s.as_ref().map_or(0, |s| s.elements.len()))
                        .sum();
                    let elements: usize =
                        p.elements.values().map(|d| d.add.len() + d.del.len()).sum();
                    p.chains.len() + sets + elements
                })
                .sum(),
        }
    }

    /// Folds this input into `store` (the desired tables kept by the kernel side).
    pub fn fold_into(self, store: &mut Vec<Table>) {
        match self {
            TablesInput::Full(t) => *store = t,
            TablesInput::Patch(ps) => TablePatch::fold_all(ps, store),
        }
    }
}

/// What programming the tables did.
#[derive(Debug, Clone, Default)]
pub struct TablesOutcome {
    /// Operations in the committed batch (0: nothing differed, nothing was sent).
    pub ops: usize,
    /// ERESTART retries + 1.
    pub attempts: u32,
    /// The plans, printable (for `plan` and logs).
    pub plans: Vec<nf_tables::diff::Plan>,
    /// Time in the kernel's hands: encoding and sending the batch, the commit, the ACK.
    pub commit_time: Duration,
    /// Of `ops`, those that repaired another process's change found while committing an update.
    pub repaired: usize,
    /// Batches sent and read-backs done.
    pub stats: nf_tables::reconcile::KernelStats,
    /// What each of our tables holds now (after a commit; empty when nothing was committed).
    pub objects: Vec<TableObjects>,
}

/// What one of our tables holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableObjects {
    /// 4 or 6 (an `inet` table counts as 4).
    pub ip_version: u8,
    pub table: String,
    pub chains: u64,
    pub rules: u64,
    pub sets: u64,
    pub maps: u64,
}

impl TableObjects {
    fn of(t: &Table) -> TableObjects {
        let maps = t.sets.values().filter(|s| s.data.is_some()).count() as u64;
        TableObjects {
            ip_version: if t.family == nf_tables::model::Family::Ip6 {
                6
            } else {
                4
            },
            table: t.name.clone(),
            chains: t.chains.len() as u64,
            rules: t.chains.values().map(|c| c.rules.len() as u64).sum(),
            sets: t.sets.len() as u64 - maps,
            maps,
        }
    }
}

/// A table's chains, rules, sets and maps, or the change a patch makes to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counted {
    chains: i64,
    rules: i64,
    sets: i64,
    maps: i64,
}

impl Counted {
    /// What folding `p` into `desired` changes in its table's counts: each chain or set the
    /// patch names, less the one it replaces or deletes.
    fn delta(desired: &[Table], p: &TablePatch) -> Counted {
        let table = desired
            .iter()
            .find(|t| t.family == p.family && t.name == p.name);
        let mut d = Counted::default();
        for (name, new) in &p.chains {
            let old = table.and_then(|t| t.chains.get(name));
            d.chains += i64::from(new.is_some()) - i64::from(old.is_some());
            d.rules += new.as_ref().map_or(0, |c| c.rules.len() as i64)
                - old.map_or(0, |c| c.rules.len() as i64);
        }
        for (name, new) in &p.sets {
            let old = table.and_then(|t| t.sets.get(name));
            let kind = |s: Option<&Set>| match s {
                Some(s) if s.data.is_some() => (0, 1),
                Some(_) => (1, 0),
                None => (0, 0),
            };
            let (ns, nm) = kind(new.as_ref());
            let (os, om) = kind(old);
            d.sets += ns - os;
            d.maps += nm - om;
        }
        d
    }
}

/// `counts` after the patches whose `deltas` were taken: a table not counted before (new, or
/// its counts unknown) is counted whole from `desired`; an empty result means "count all".
fn follow(
    mut counts: Vec<(Family, TableObjects)>,
    deltas: Vec<(Family, String, Counted)>,
    desired: &[Table],
) -> Vec<(Family, TableObjects)> {
    if counts.is_empty() {
        return counts;
    }
    for (family, name, d) in deltas {
        let add = |n: u64, by: i64| n.saturating_add_signed(by);
        match counts
            .iter_mut()
            .find(|(f, c)| *f == family && c.table == name)
        {
            Some((_, c)) => {
                c.chains = add(c.chains, d.chains);
                c.rules = add(c.rules, d.rules);
                c.sets = add(c.sets, d.sets);
                c.maps = add(c.maps, d.maps);
            }
            None => match desired
                .iter()
                .find(|t| t.family == family && t.name == name)
            {
                Some(t) => counts.push((family, TableObjects::of(t))),
                None => return Vec::new(),
            },
        }
    }
    counts
}

impl From<TableSyncReport> for TablesOutcome {
    fn from(r: TableSyncReport) -> Self {
        TablesOutcome {
            ops: r.ops,
            attempts: r.attempts,
            plans: r.plans,
            commit_time: Duration::ZERO,
            repaired: r.repaired,
            stats: Default::default(),
            objects: Vec::new(),
        }
    }
}

/// What the route phase did.
#[derive(Debug, Clone, Default)]
pub struct RoutesOutcome {
    pub changes: usize,
    /// Routes waiting for their interface (absent or down).
    pub parked: usize,
    /// Destinations that moved to another interface or went away (conntrack cleanup).
    pub moved_or_gone: Vec<IpAddr>,
    /// Per-route failures; the phase is retried.
    pub errors: Vec<String>,
    /// Unknown routes on workload interfaces still inside their grace period.
    pub in_grace: usize,
}

/// What the overlay phase did.
#[derive(Debug, Clone, Default)]
pub struct OverlayOutcome {
    /// The VXLAN device was created or re-created: what lives on it must be written again.
    pub created: bool,
    /// Device corrections and FDB writes.
    pub changes: usize,
    /// The device's parent interface is missing: nothing was done.
    pub parked: bool,
}

/// What the IPIP phase did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpipOutcome {
    /// tunl0 appeared: the routes through it are written again.
    pub created: bool,
    /// Corrections made to it (MTU, addresses, up).
    pub changes: usize,
    /// The kernel has no ipip module: nothing was done.
    pub unsupported: bool,
}

/// What the WireGuard phase did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WgOutcome {
    /// Each managed family's device key after the phase (`None`: no device, or disabled).
    pub keys: Vec<(IpFamily, Option<Key>)>,
    /// Device, peer, route and rule changes made.
    pub changes: usize,
    /// The kernel has no WireGuard: nothing was done.
    pub unsupported: bool,
}

/// A kernel failure in one phase.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("programming nf_tables")]
    Nft(#[source] NftError),
    #[error("{op}")]
    Rtnl {
        op: String,
        #[source]
        source: Box<RtnlError>,
    },
    #[error("{0}")]
    Other(String),
}

impl KernelError {
    /// Failures about an interface that vanished meanwhile are benign (§23.8).
    pub fn is_vanished_interface(&self) -> bool {
        matches!(self, KernelError::Rtnl { source, .. } if source.is_vanished_interface())
    }
}

/// What the loop asks of the kernel, phase by phase.
#[allow(async_fn_in_trait)]
pub trait Kernel {
    /// Global sysctls at start of day (§10.4): ip_forward, IPv6 forwarding, conntrack acct.
    async fn globals(&mut self, ip_forwarding: bool, ipv6: bool) -> Result<(), KernelError>;
    /// Our nf_tables tables, in one transaction.
    async fn tables(
        &mut self,
        input: TablesInput,
        mode: TableMode,
    ) -> Result<TablesOutcome, KernelError>;
    /// Routes (both families), grouped by owner. With `only`, the groups named there are
    /// restated (absent from `routes`: none) and every other group stays as it is; without,
    /// `routes` is the whole desired state.
    async fn routes(
        &mut self,
        routes: &BTreeMap<String, Vec<RouteSpec>>,
        only: Option<&BTreeSet<String>>,
        resync: bool,
    ) -> Result<RoutesOutcome, KernelError>;
    /// The VXLAN devices and their permanent FDB entries; before the routes and neighbours,
    /// which live on the devices. A device not listed is left as it is. `changed`: interfaces
    /// reported changed (a device or its parent there is looked at again); otherwise only a
    /// changed spec, an FDB change or a resync costs kernel I/O.
    async fn overlay(
        &mut self,
        devices: &[VxlanWanted],
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<OverlayOutcome, KernelError>;
    /// tunl0, before the routes through it. `changed`: interfaces reported changed (tunl0
    /// there is looked at again); otherwise only a change of what is wanted or a resync costs
    /// kernel I/O.
    async fn ipip(
        &mut self,
        want: &IpipWanted,
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<IpipOutcome, KernelError>;
    /// The WireGuard devices of each managed family, their peers, table and rule (the rule
    /// last), and `src_valid_mark` when host encryption needs it. `changed`: interfaces
    /// reported changed (a device there is read again); otherwise only a change of what is
    /// wanted or a resync costs kernel I/O.
    async fn wireguard(
        &mut self,
        want: Vec<(IpFamily, WgWanted)>,
        src_valid_mark: bool,
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<WgOutcome, KernelError>;
    /// Permanent neighbours per interface (`only` as for routes); `changed` lists interfaces
    /// that flapped.
    async fn neighbours(
        &mut self,
        neigh: &BTreeMap<String, Vec<(IpAddr, Mac)>>,
        only: Option<&BTreeSet<String>>,
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<(), KernelError>;
    /// Per-interface configuration of one workload interface.
    async fn iface_conf(&mut self, iface: &str, conf: &IfaceConf) -> Result<(), KernelError>;
    /// Starts deleting the conntrack entries from or to each of `ips` (addresses that moved or
    /// went away) in the background, as Felix does (§15), once any cleanup still running is
    /// done. Returns at once.
    async fn conntrack_cleanup(&mut self, ips: Vec<IpAddr>);
    /// Waits for the background cleanup, if one runs; its failures: (address, error chain).
    async fn conntrack_settle(&mut self) -> Vec<(IpAddr, String)>;
    /// A descriptor that becomes readable when another program commits to nf_tables, for the
    /// loop to wait on (then [`Kernel::tables_touched`] says whether it was about our tables);
    /// `None` when this kernel seam has no such watch.
    fn tables_watch(&self) -> Option<std::os::fd::OwnedFd> {
        None
    }
    /// Whether another program's commit touched our tables since the last call (an inserted
    /// rule, a deleted chain or table, a flushed ruleset): then a resync repairs them.
    async fn tables_touched(&mut self) -> bool {
        false
    }
}

/// A background conntrack cleanup: gives the socket back, with the failures.
type ConntrackJob = tokio::task::JoinHandle<(Option<Conntrack>, Vec<(IpAddr, String)>)>;

// ---------------------------------------------------------------------------------------------
// The real kernel
// ---------------------------------------------------------------------------------------------

/// Decides what the kernel offers (probing owner + persist tables), applies Felix's
/// `FeatureDetectOverride`, and makes `nft` and the renderer follow the result: where every
/// commit validates every table, the side table is off (it would make no commit cheaper and
/// still cost its merge). Also returns the override names felix-nft does not decide (Felix's
/// own features).
pub fn follow_features(
    nft: &mut Nft,
    overrides: Option<&str>,
    rules: &mut felix_nft_rules::RulesConfig,
) -> Result<(Features, Vec<String>), KernelError> {
    let mut f = nft.features().map_err(KernelError::Nft)?;
    let ignored = match overrides {
        Some(spec) => super::features::apply_overrides(&mut f, spec).map_err(KernelError::Other)?,
        None => Vec::new(),
    };
    nft.use_features(&f);
    if f.every_table_validated.on {
        rules.side_table_size = 0;
    }
    Ok((f, ignored))
}

type NftReply = Result<TablesOutcome, NftError>;

/// The nf_tables side: one long-lived socket and the reconciler's believed state, driven from
/// the loop's own thread.
///
/// An IP set member's commit takes 0.1–1 ms; handing it to a worker thread and waiting
/// for the answer cost two wake-ups of an idle CPU (0.05–0.1 ms each, measured with
/// `scripts/daemon-latency`), so the batch is sent from the calling thread instead. A batch
/// runs synchronously inside `sendmsg` (a full load: seconds), so on a multi-threaded runtime
/// a big input runs under [`tokio::task::block_in_place`] (the runtime's other tasks go on
/// elsewhere); an update of a few objects ([`INLINE_OBJECTS`]) just blocks the worker for its
/// sub-millisecond commit, since `block_in_place` would first wake a thread to take the
/// worker's other tasks. (A small update that finds the kernel changed by someone else re-reads
/// our tables on the worker too: that is the rare case.) On a current-thread runtime (one-shot
/// commands, tests) it simply blocks, as nothing else there can make progress before the tables
/// are done anyway.
struct NftSide {
    rec: Reconciler<Nft>,
    /// What each desired table holds, kept up to date from the patches (each changed chain or
    /// set against the one it replaces), so that an update does not walk every chain of a large
    /// table to count them again.
    counts: Vec<(Family, TableObjects)>,
}

impl NftSide {
    fn open(ns: Option<&NetNs>, opts: SyncOptions) -> Result<NftSide, KernelError> {
        // The socket belongs to the namespace of the thread that opens it: open it inside the
        // target namespace; it can be used from any thread afterwards.
        let nft = match ns {
            Some(ns) => ns
                .run(Nft::open)
                .map_err(|e| KernelError::Other(format!("entering {}: {e}", ns.label())))?,
            None => Nft::open(),
        }
        .map_err(KernelError::Nft)?;
        Ok(NftSide {
            rec: Reconciler::new(nft, opts),
            counts: Vec::new(),
        })
    }

    fn apply(&mut self, tables: TablesInput, mode: TableMode) -> NftReply {
        if mode == TableMode::Incremental && tables.objects() <= INLINE_OBJECTS {
            // An update's few objects: handing this worker's other tasks to another thread
            // first (`block_in_place` wakes one) would cost more than the commit blocks them.
            self.apply_now(tables, mode)
        } else {
            blocking(|| self.apply_now(tables, mode))
        }
    }

    fn apply_now(&mut self, tables: TablesInput, mode: TableMode) -> NftReply {
        let rec = &mut self.rec;
        let base = rec.opts.clone();
        match mode {
            TableMode::Incremental => {}
            TableMode::Resync => {
                if rec.revalidate() {
                    tracing::debug!(
                        "nf_tables refresh: no commit touched our tables since ours, nothing to read back"
                    );
                }
            }
            TableMode::Rebuild => {
                rec.mark_stale();
                rec.opts.rebuild = true;
            }
            TableMode::DryRun => {
                rec.mark_stale();
                rec.opts.dry_run = true;
            }
            TableMode::Plan => rec.mark_stale(),
        }
        // Element deltas alone leave the object counts (chains, rules, sets) as they were: an
        // IP set member does not pay a walk over every chain of the table to count them again.
        let counts_unchanged = matches!(&tables, TablesInput::Patch(ps)
            if ps.iter().all(|p| p.chains.is_empty() && p.sets.is_empty()));
        // The patches are folded into the desired tables whatever the commit's outcome:
        // the counts follow them by difference, read before the fold.
        let deltas: Option<Vec<(Family, String, Counted)>> = match (&tables, mode) {
            (TablesInput::Patch(ps), TableMode::Incremental) => Some(
                ps.iter()
                    .map(|p| (p.family, p.name.clone(), Counted::delta(rec.desired(), p)))
                    .collect(),
            ),
            _ => None,
        };
        let out = match (mode, tables) {
            (TableMode::Plan, TablesInput::Full(t)) => plan_only(rec, &t),
            (TableMode::Plan, TablesInput::Patch(_)) => Err(NftError::Protocol(
                "a plan needs the whole desired state, not a patch".into(),
            )),
            (_, TablesInput::Full(t)) => rec.apply_owned(t).map(TablesOutcome::from),
            (_, TablesInput::Patch(p)) => rec.apply_patches(p).map(TablesOutcome::from),
        };
        if out.is_err() || matches!(mode, TableMode::DryRun | TableMode::Plan) {
            rec.mark_stale();
        }
        rec.opts = base;
        if mode != TableMode::Plan {
            self.counts = match deltas {
                Some(d) => follow(std::mem::take(&mut self.counts), d, rec.desired()),
                None => Vec::new(),
            };
            if self.counts.is_empty() {
                self.counts = rec
                    .desired()
                    .iter()
                    .map(|t| (t.family, TableObjects::of(t)))
                    .collect();
            }
        }
        let commit_time = rec.take_commit_time();
        let stats = rec.take_stats();
        let objects = match &out {
            Ok(o)
                if o.ops > 0
                    && !counts_unchanged
                    && !matches!(mode, TableMode::DryRun | TableMode::Plan) =>
            {
                self.counts.iter().map(|(_, c)| c.clone()).collect()
            }
            _ => Vec::new(),
        };
        out.map(|o| TablesOutcome {
            commit_time,
            stats,
            objects,
            ..o
        })
    }
}

/// Reads our tables and diffs them against `desired` (with the ownership flags the kernel and
/// options allow); sends nothing.
fn plan_only(rec: &mut Reconciler<Nft>, desired: &[Table]) -> NftReply {
    let ownership = rec.opts.ownership;
    let desired = nf_tables::reconcile::with_ownership(&mut rec.kernel, desired, ownership)?;
    let (_, plans) = nf_tables::reconcile::plan(&mut rec.kernel, &desired, false)?;
    Ok(TablesOutcome {
        ops: plans.iter().map(|p| p.ops.len()).sum(),
        attempts: 1,
        plans,
        commit_time: Duration::ZERO,
        repaired: 0,
        stats: Default::default(),
        objects: Vec::new(),
    })
}

/// nf_tables + rtnetlink + /proc/sys of one network namespace.
pub struct RealKernel {
    nft: NftSide,
    rtnl: RtnlHandle,
    ns: Option<NetNs>,
    routes_v4: RouteSyncer,
    routes_v6: RouteSyncer,
    neigh: NeighSyncer,
    /// One syncer per VXLAN device, by name.
    vxlan: BTreeMap<String, VxlanSyncer>,
    ipip: IpipSyncer,
    /// The kernel was found without the ipip module (said once).
    ipip_unsupported: bool,
    /// WireGuard's devices, IPv4 and IPv6.
    wg: [WgSyncer; 2],
    /// The kernel was found without WireGuard (said once).
    wg_unsupported: bool,
    procsys: ProcSys,
    /// The ctnetlink socket, opened at the first cleanup and kept (closing one costs an RCU
    /// grace period; see [`Conntrack`]). Lent to the blocking thread during a cleanup.
    conntrack: Option<Conntrack>,
    /// The cleanup running in the background. Its dump walks every bucket of the conntrack
    /// table (~4 ms with no entries at all), which an endpoint removal would otherwise wait for.
    conntrack_job: Option<ConntrackJob>,
}

impl RealKernel {
    /// Opens every socket in `ns` (or the current namespace). Needs a tokio runtime.
    pub fn open(ns: Option<&NetNs>, cfg: &DataplaneConfig) -> Result<RealKernel, KernelError> {
        let nft = NftSide::open(
            ns,
            SyncOptions {
                ownership: cfg.ownership,
                ..SyncOptions::default()
            },
        )?;
        let rtnl = RtnlHandle::connect(ns).map_err(rtnl_err("connecting to rtnetlink"))?;
        let ownership = cfg.route_ownership();
        let ns_owned =
            match ns {
                Some(n) => Some(n.try_clone().map_err(|e| {
                    KernelError::Other(format!("duplicating the netns handle: {e}"))
                })?),
                None => None,
            };
        let procsys_ns =
            match ns {
                Some(n) => Some(n.try_clone().map_err(|e| {
                    KernelError::Other(format!("duplicating the netns handle: {e}"))
                })?),
                None => None,
            };
        Ok(RealKernel {
            nft,
            rtnl,
            ns: ns_owned,
            routes_v4: RouteSyncer::new(IpFamily::V4, RT_TABLE_MAIN, ownership.clone()),
            routes_v6: RouteSyncer::new(IpFamily::V6, RT_TABLE_MAIN, ownership),
            neigh: NeighSyncer::new(),
            vxlan: BTreeMap::new(),
            ipip: IpipSyncer::default(),
            ipip_unsupported: false,
            wg: [WgSyncer::new(IpFamily::V4), WgSyncer::new(IpFamily::V6)],
            wg_unsupported: false,
            procsys: ProcSys::new(procsys_ns),
            conntrack: None,
            conntrack_job: None,
        })
    }

    /// [`follow_features`] for this kernel's nf_tables socket.
    pub fn decide_features(
        &mut self,
        overrides: Option<&str>,
        rules: &mut felix_nft_rules::RulesConfig,
    ) -> Result<(Features, Vec<String>), KernelError> {
        follow_features(self.nft.rec.kernel_mut(), overrides, rules)
    }

    /// The rtnetlink handle (for dumps in one-shot commands).
    pub fn rtnl(&self) -> &RtnlHandle {
        &self.rtnl
    }

    /// Requests the route syncers sent so far, IPv4 and IPv6 (tests, metrics).
    pub fn route_stats(&self) -> [rtnl::routes::RouteSyncStats; 2] {
        [self.routes_v4.stats(), self.routes_v6.stats()]
    }

    /// Requests the neighbour syncer sent so far.
    pub fn neigh_stats(&self) -> rtnl::neigh::NeighSyncStats {
        self.neigh.stats()
    }

    /// Requests the VXLAN syncers sent so far (all devices).
    pub fn vxlan_stats(&self) -> rtnl::vxlan::VxlanSyncStats {
        self.vxlan
            .values()
            .map(VxlanSyncer::stats)
            .fold(Default::default(), |a, b| a + b)
    }

    /// `/proc/sys` of the target namespace.
    pub fn procsys(&self) -> &ProcSys {
        &self.procsys
    }

    /// The route syncers (IPv4, IPv6) and the neighbour syncer, with the handle they use: a
    /// one-shot command loads them with the whole desired state and plans or applies once, with
    /// the same ownership rule and grace period as the loop's phases.
    pub fn host_syncers(&mut self) -> ([&mut RouteSyncer; 2], &mut NeighSyncer, &RtnlHandle) {
        (
            [&mut self.routes_v4, &mut self.routes_v6],
            &mut self.neigh,
            &self.rtnl,
        )
    }
}

fn rtnl_err(op: &str) -> impl FnOnce(RtnlError) -> KernelError + '_ {
    move |source| KernelError::Rtnl {
        op: op.to_string(),
        source: Box::new(source),
    }
}

impl Kernel for RealKernel {
    fn tables_watch(&self) -> Option<std::os::fd::OwnedFd> {
        let fd = self.nft.rec.watch_fd()?;
        // SAFETY: the watch's socket is open for as long as `self`; the duplicate is the
        // caller's own descriptor of the same socket, used only to wait for readability.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        borrowed
            .try_clone_to_owned()
            .inspect_err(|e| tracing::warn!(error = %e, "duplicating the nf_tables event socket: outside changes wait for the refresh"))
            .ok()
    }

    async fn tables_touched(&mut self) -> bool {
        self.nft.rec.tables_touched()
    }

    async fn globals(&mut self, ip_forwarding: bool, ipv6: bool) -> Result<(), KernelError> {
        if ip_forwarding {
            self.procsys
                .write("net/ipv4/ip_forward", "1")
                .map_err(rtnl_err("enabling net.ipv4.ip_forward"))?;
            if ipv6 {
                self.procsys
                    .write("net/ipv6/conf/all/forwarding", "1")
                    .map_err(rtnl_err("enabling net.ipv6.conf.all.forwarding"))?;
            }
        }
        // Conntrack accounting (§10.4). The file exists only once nf_conntrack is loaded in the
        // namespace; its absence is not an error.
        if let Err(e) = self.procsys.write("net/netfilter/nf_conntrack_acct", "1") {
            tracing::debug!(error = %e, "nf_conntrack_acct not set");
        }
        Ok(())
    }

    async fn tables(
        &mut self,
        input: TablesInput,
        mode: TableMode,
    ) -> Result<TablesOutcome, KernelError> {
        self.nft.apply(input, mode).map_err(KernelError::Nft)
    }

    async fn routes(
        &mut self,
        routes: &BTreeMap<String, Vec<RouteSpec>>,
        only: Option<&BTreeSet<String>>,
        resync: bool,
    ) -> Result<RoutesOutcome, KernelError> {
        // Restating a group costs a comparison, no copy unless it changed; the syncers then
        // write only what changed (or dump and repair everything on a resync).
        for syncer in [&mut self.routes_v4, &mut self.routes_v6] {
            match only {
                Some(groups) => {
                    for g in groups {
                        syncer.update_routes(g, routes.get(g).map_or(&[][..], Vec::as_slice));
                    }
                }
                None => {
                    let gone: Vec<String> = syncer
                        .groups()
                        .filter(|g| !routes.contains_key(*g))
                        .map(str::to_string)
                        .collect();
                    for g in gone {
                        syncer.set_routes(g, Vec::new());
                    }
                    for (group, specs) in routes {
                        syncer.update_routes(group, specs);
                    }
                }
            }
            if resync {
                syncer.request_resync();
            }
        }
        let mut out = RoutesOutcome::default();
        for syncer in [&mut self.routes_v4, &mut self.routes_v6] {
            let rep = syncer
                .apply(&self.rtnl)
                .await
                .map_err(rtnl_err("syncing routes"))?;
            out.changes += rep.changes();
            out.parked += rep.parked.len();
            out.moved_or_gone
                .extend(rep.moved_or_gone.iter().map(|n| n.addr()));
            out.in_grace += rep.in_grace.len();
            out.errors
                .extend(rep.errors.iter().map(|e| crate::ops::logging::chain(e)));
        }
        Ok(out)
    }

    async fn overlay(
        &mut self,
        devices: &[VxlanWanted],
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<OverlayOutcome, KernelError> {
        let mut out = OverlayOutcome::default();
        for want in devices {
            let syncer = self.vxlan.entry(want.name.clone()).or_default();
            if syncer.device() != want.spec.as_ref() {
                syncer.set_device(want.spec.clone());
            } else if want
                .spec
                .as_ref()
                .is_some_and(|d| changed.contains(&d.name) || changed.contains(&d.parent))
            {
                syncer.device_changed();
            }
            match &want.fdb {
                Entries::All(all) => syncer.set_fdb(all.iter().copied()),
                Entries::Changed(changed) => {
                    for &(mac, ip) in changed {
                        syncer.set_fdb_entry(mac, ip);
                    }
                }
            }
            // The neighbours phase writes them.
            for &(ip, mac) in &want.neighbour_changes {
                self.neigh.set_entry(&want.name, ip, mac);
            }
            if resync {
                syncer.request_resync();
            }
            if !syncer.needs_apply() {
                continue;
            }
            let rep = syncer
                .apply(&self.rtnl)
                .await
                .map_err(rtnl_err("syncing the VXLAN device"))?;
            if rep.created {
                // A new device holds no routes or neighbours: write them again.
                self.routes_v4.iface_changed(&want.name);
                self.routes_v6.iface_changed(&want.name);
                self.neigh.iface_changed(&want.name);
            }
            if rep.created || rep.recreated.is_some() || !rep.corrected.is_empty() {
                tracing::info!(
                    device = %want.name,
                    created = rep.created,
                    recreated = ?rep.recreated,
                    corrected = ?rep.corrected,
                    "VXLAN device programmed"
                );
            }
            out.created |= rep.created;
            out.changes +=
                rep.corrected.len() + rep.fdb_set + rep.fdb_deleted + usize::from(rep.created);
            out.parked |= rep.parked;
        }
        Ok(out)
    }

    async fn ipip(
        &mut self,
        want: &IpipWanted,
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<IpipOutcome, KernelError> {
        self.ipip.set(want.clone());
        if changed.contains(IPIP_IFACE) {
            self.ipip.device_changed();
        }
        if resync {
            self.ipip.request_resync();
        }
        let rep = self
            .ipip
            .apply(&self.rtnl)
            .await
            .map_err(rtnl_err("syncing the IPIP device"))?;
        if rep.unsupported && !self.ipip_unsupported {
            tracing::warn!(
                "IPIP is on, but this kernel has no ipip module: {IPIP_IFACE} is not configured \
                 and the routes through it are not programmed (load the module: modprobe ipip)"
            );
        }
        self.ipip_unsupported = rep.unsupported;
        if rep.created {
            // A new device holds no routes: write them again.
            self.routes_v4.iface_changed(IPIP_IFACE);
        }
        if rep.created || !rep.corrected.is_empty() {
            tracing::info!(device = IPIP_IFACE, created = rep.created, corrected = ?rep.corrected,
                "IPIP device programmed");
        }
        Ok(IpipOutcome {
            created: rep.created,
            changes: rep.corrected.len(),
            unsupported: rep.unsupported,
        })
    }

    async fn wireguard(
        &mut self,
        want: Vec<(IpFamily, WgWanted)>,
        src_valid_mark: bool,
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<WgOutcome, KernelError> {
        let mut out = WgOutcome::default();
        if src_valid_mark {
            // Host encryption: the reverse-path check of a marked packet uses its mark, so it
            // skips WireGuard's table.
            self.procsys
                .write("net/ipv4/conf/all/src_valid_mark", "1")
                .map_err(rtnl_err("enabling net.ipv4.conf.all.src_valid_mark"))?;
        }
        let mut unsupported = false;
        for (family, w) in want {
            let syncer = &mut self.wg[usize::from(family == IpFamily::V6)];
            let name = w.name().to_string();
            syncer.set(w);
            if changed.contains(&name) {
                syncer.device_changed();
            }
            if resync {
                syncer.request_resync();
            }
            let rep = syncer
                .apply(&self.rtnl, self.ns.as_ref())
                .await
                .map_err(rtnl_err("syncing the WireGuard device"))?;
            unsupported |= rep.unsupported;
            if rep.new_key || rep.deleted || !rep.corrected.is_empty() {
                tracing::info!(device = %name, created = rep.created, deleted = rep.deleted,
                    new_key = rep.new_key, corrected = ?rep.corrected, "WireGuard device programmed");
            }
            out.changes += rep.corrected.len() + rep.peer_changes + rep.route_changes;
            out.keys.push((family, syncer.public_key()));
        }
        if unsupported && !self.wg_unsupported {
            tracing::warn!(
                "WireGuard is on, but this kernel has no wireguard module: no device, peers, \
                 table or rule are programmed, traffic between nodes is not encrypted, and the \
                 key reported is empty (load the module: modprobe wireguard)"
            );
        }
        self.wg_unsupported = unsupported;
        out.unsupported = unsupported;
        Ok(out)
    }

    async fn neighbours(
        &mut self,
        neigh: &BTreeMap<String, Vec<(IpAddr, Mac)>>,
        only: Option<&BTreeSet<String>>,
        changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<(), KernelError> {
        // Interfaces that flapped since the last apply. The loop hands them to this phase only,
        // after the routes phase; their routes (an admin down flushes them, §15) are re-asserted
        // here, incrementally, so the routes phase never needs a dump to notice a flap.
        if !changed.is_empty() {
            for syncer in [&mut self.routes_v4, &mut self.routes_v6] {
                for iface in changed {
                    syncer.iface_changed(iface);
                }
                let rep = syncer
                    .apply(&self.rtnl)
                    .await
                    .map_err(rtnl_err("re-asserting routes of changed interfaces"))?;
                if let Some(e) = rep.errors.first() {
                    // The syncer is stale now: the next routes phase dumps and repairs.
                    return Err(KernelError::Other(format!(
                        "{} route write(s) for changed interfaces failed, first: {}",
                        rep.errors.len(),
                        crate::ops::logging::chain(e)
                    )));
                }
                tracing::debug!(
                    changes = rep.changes(),
                    moved_or_gone = rep.moved_or_gone.len(),
                    "routes of changed interfaces re-asserted"
                );
            }
        }
        match only {
            Some(ifaces) => {
                for iface in ifaces {
                    let entries = neigh.get(iface).map_or(&[][..], Vec::as_slice);
                    self.neigh.update_neighbours(iface, entries);
                }
            }
            None => {
                let gone: Vec<String> = self
                    .neigh
                    .managed_ifaces()
                    .filter(|i| !neigh.contains_key(*i))
                    .map(str::to_string)
                    .collect();
                for iface in gone {
                    self.neigh.set_neighbours(&iface, Vec::new());
                }
                for (iface, entries) in neigh {
                    self.neigh.update_neighbours(iface, entries);
                }
            }
        }
        for iface in changed {
            self.neigh.iface_changed(iface);
        }
        if resync {
            self.neigh.request_resync();
        }
        let rep = self
            .neigh
            .apply(&self.rtnl)
            .await
            .map_err(rtnl_err("syncing neighbours"))?;
        let real: Vec<&RtnlError> = rep
            .errors
            .iter()
            .filter(|e| !e.is_vanished_interface())
            .collect();
        match real.first() {
            Some(e) => Err(KernelError::Other(format!(
                "{} neighbour write(s) failed, first: {e}",
                real.len()
            ))),
            None => Ok(()),
        }
    }

    async fn iface_conf(&mut self, iface: &str, conf: &IfaceConf) -> Result<(), KernelError> {
        // §14.2, in Felix's order. accept_ra=0 applies even without IPv6 "for safety"; only a
        // vanished interface is tolerated there.
        match self.procsys.set_ipv6_iface(iface, Ipv6Conf::AcceptRa, 0) {
            Err(e) if e.is_vanished_interface() => {
                return Err(rtnl_err("configuring interface")(e));
            }
            Err(e) => tracing::debug!(ifname = iface, error = %e, "accept_ra not set"),
            Ok(()) => {}
        }
        self.procsys
            .set_ipv4_iface(
                iface,
                &[
                    (Ipv4Conf::RouteLocalnet, 1),
                    (Ipv4Conf::ProxyArp, 1),
                    (Ipv4Conf::Forwarding, 1),
                    (Ipv4Conf::RpFilter, conf.rp_filter),
                ],
            )
            .map_err(rtnl_err("setting IPv4 interface configuration"))?;
        if let Err(e) = devconf::set_proxy_delay(&self.rtnl, iface, 0).await {
            if e.is_vanished_interface() {
                return Err(rtnl_err("setting proxy_delay")(e));
            }
            tracing::warn!(ifname = iface, error = %e, "could not set proxy_delay to 0");
        }
        if conf.ipv6 {
            self.procsys
                .set_ipv6_iface(iface, Ipv6Conf::ProxyNdp, 1)
                .map_err(rtnl_err("setting proxy_ndp"))?;
            self.procsys
                .set_ipv6_iface(iface, Ipv6Conf::Forwarding, 1)
                .map_err(rtnl_err("setting IPv6 forwarding"))?;
        }
        Ok(())
    }

    async fn conntrack_cleanup(&mut self, ips: Vec<IpAddr>) {
        if ips.is_empty() {
            return;
        }
        // One cleanup at a time, in order: an address cleaned up and then reused is cleaned
        // up before the next apply (which may program its new owner) begins.
        for (ip, e) in self.conntrack_settle().await {
            tracing::warn!(%ip, error = %e, "conntrack cleanup failed");
        }
        let ns = match self.ns.as_ref().map(NetNs::try_clone).transpose() {
            Ok(ns) => ns,
            Err(e) => {
                tracing::warn!(error = %e, "conntrack cleanup skipped: duplicating the netns handle");
                return;
            }
        };
        let mut ct = self.conntrack.take();
        self.conntrack_job = Some(tokio::task::spawn_blocking(move || {
            let mut failed = Vec::new();
            for ip in ips {
                // Felix retries conntrack deletion three times (§15).
                let mut last = None;
                for attempt in 0..3 {
                    if attempt > 0 {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let opened = match ct.take() {
                        Some(c) => Ok(c),
                        None => Conntrack::open(ns.as_ref()),
                    };
                    match opened.and_then(|mut c| c.delete_by_source(ip).map(|_| c)) {
                        Ok(c) => {
                            ct = Some(c);
                            last = None;
                            break;
                        }
                        // A socket that failed is not trusted again: the next try opens another.
                        Err(e) => last = Some(e),
                    }
                }
                if let Some(e) = last {
                    let e = rtnl_err("deleting conntrack entries")(e);
                    failed.push((ip, crate::ops::logging::chain(&e)));
                }
            }
            (ct, failed)
        }));
    }

    async fn conntrack_settle(&mut self) -> Vec<(IpAddr, String)> {
        let Some(job) = self.conntrack_job.take() else {
            return Vec::new();
        };
        match job.await {
            Ok((ct, failed)) => {
                self.conntrack = ct;
                failed
            }
            Err(e) => {
                tracing::warn!(error = %e, "conntrack cleanup task failed");
                Vec::new()
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The fake kernel
// ---------------------------------------------------------------------------------------------

/// One call the loop made, as the fake recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Globals,
    Tables {
        mode: TableMode,
        tables: usize,
    },
    Routes {
        groups: usize,
        resync: bool,
    },
    Overlay {
        device: bool,
        /// FDB entries stated (all, or the changed ones).
        fdb: usize,
        neighbour_changes: usize,
        resync: bool,
    },
    Ipip(IpipWanted),
    Wireguard(Vec<WgWanted>),
    Neighbours {
        ifaces: usize,
        resync: bool,
    },
    IfaceConf(String),
    Conntrack(IpAddr),
}

/// An in-memory kernel for loop tests: records calls, can fail the tables phase.
#[derive(Debug, Default)]
pub struct FakeKernel {
    pub calls: Vec<Call>,
    /// The next `n` table calls fail.
    pub fail_tables: usize,
    /// Fail every `Rebuild` too.
    pub fail_rebuild: bool,
    /// The tables of the last successful commit.
    pub committed: Vec<Table>,
    /// The desired tables as given (patches folded in).
    pub desired: Vec<Table>,
    /// Incremental commits that sent something.
    pub commits: usize,
    /// Every routes call reports this many unknown routes still in their grace period (§15).
    pub routes_in_grace: usize,
    /// Refuse every commit whose tables hold a rule whose comment contains this text, as the
    /// kernel refuses an object it cannot take.
    pub refuse_comment: Option<String>,
    /// Name the refused chain in the error (the kernel's extended ACK does); else name nothing.
    pub name_refused: bool,
    /// The key an enabled WireGuard device reports.
    pub wg_key: Key,
}

impl FakeKernel {
    /// The first chain of `tables` holding a rule the fake refuses.
    fn refused(&self) -> Option<nf_tables::error::Target> {
        let marker = self.refuse_comment.as_deref()?;
        self.desired.iter().find_map(|t| {
            t.chains
                .values()
                .find(|c| {
                    c.rules
                        .iter()
                        .any(|r| r.comment.as_deref().is_some_and(|x| x.contains(marker)))
                })
                .map(|c| nf_tables::error::Target {
                    family: t.family,
                    table: t.name.clone(),
                    object: nf_tables::error::ObjectRef::Chain(c.name.clone()),
                })
        })
    }
}

impl Kernel for FakeKernel {
    async fn globals(&mut self, _ip_forwarding: bool, _ipv6: bool) -> Result<(), KernelError> {
        self.calls.push(Call::Globals);
        Ok(())
    }

    async fn tables(
        &mut self,
        input: TablesInput,
        mode: TableMode,
    ) -> Result<TablesOutcome, KernelError> {
        input.fold_into(&mut self.desired);
        let desired = &self.desired;
        self.calls.push(Call::Tables {
            mode,
            tables: desired.len(),
        });
        if self.fail_tables > 0 || (mode == TableMode::Rebuild && self.fail_rebuild) {
            self.fail_tables = self.fail_tables.saturating_sub(1);
            return Err(KernelError::Other("injected nf_tables failure".into()));
        }
        if let Some(t) = self.refused() {
            let what = format!("{:?}", t.object);
            return Err(KernelError::Nft(NftError::Rejected {
                object: format!("adding {what} (injected refusal)"),
                errno: libc::EINVAL,
                ext_ack: None,
                attr_offset: None,
                more: 0,
                target: self.name_refused.then(|| Box::new(t)),
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            }));
        }
        let changed = &self.committed != desired;
        if mode != TableMode::DryRun && changed {
            self.commits += 1;
            self.committed = desired.clone();
        }
        Ok(TablesOutcome {
            ops: usize::from(changed),
            attempts: 1,
            plans: Vec::new(),
            commit_time: Duration::ZERO,
            repaired: 0,
            stats: Default::default(),
            objects: Vec::new(),
        })
    }

    async fn routes(
        &mut self,
        routes: &BTreeMap<String, Vec<RouteSpec>>,
        only: Option<&BTreeSet<String>>,
        resync: bool,
    ) -> Result<RoutesOutcome, KernelError> {
        self.calls.push(Call::Routes {
            groups: only.map_or(routes.len(), BTreeSet::len),
            resync,
        });
        Ok(RoutesOutcome {
            in_grace: self.routes_in_grace,
            ..RoutesOutcome::default()
        })
    }

    async fn overlay(
        &mut self,
        devices: &[VxlanWanted],
        _changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<OverlayOutcome, KernelError> {
        self.calls.push(Call::Overlay {
            device: devices.iter().any(|d| d.spec.is_some()),
            fdb: devices.iter().map(|d| d.fdb.len()).sum(),
            neighbour_changes: devices.iter().map(|d| d.neighbour_changes.len()).sum(),
            resync,
        });
        Ok(OverlayOutcome::default())
    }

    async fn ipip(
        &mut self,
        want: &IpipWanted,
        _changed: &BTreeSet<String>,
        _resync: bool,
    ) -> Result<IpipOutcome, KernelError> {
        self.calls.push(Call::Ipip(want.clone()));
        Ok(IpipOutcome::default())
    }

    async fn wireguard(
        &mut self,
        want: Vec<(IpFamily, WgWanted)>,
        _src_valid_mark: bool,
        _changed: &BTreeSet<String>,
        _resync: bool,
    ) -> Result<WgOutcome, KernelError> {
        let keys = want
            .iter()
            .map(|(f, w)| {
                let on = !matches!(w, WgWanted::Disabled { .. });
                (*f, on.then_some(self.wg_key))
            })
            .collect();
        self.calls
            .push(Call::Wireguard(want.into_iter().map(|(_, w)| w).collect()));
        Ok(WgOutcome {
            keys,
            ..WgOutcome::default()
        })
    }

    async fn neighbours(
        &mut self,
        neigh: &BTreeMap<String, Vec<(IpAddr, Mac)>>,
        only: Option<&BTreeSet<String>>,
        _changed: &BTreeSet<String>,
        resync: bool,
    ) -> Result<(), KernelError> {
        self.calls.push(Call::Neighbours {
            ifaces: only.map_or(neigh.len(), BTreeSet::len),
            resync,
        });
        Ok(())
    }

    async fn iface_conf(&mut self, iface: &str, _conf: &IfaceConf) -> Result<(), KernelError> {
        self.calls.push(Call::IfaceConf(iface.to_string()));
        Ok(())
    }

    async fn conntrack_cleanup(&mut self, ips: Vec<IpAddr>) {
        self.calls.extend(ips.into_iter().map(Call::Conntrack));
    }

    async fn conntrack_settle(&mut self) -> Vec<(IpAddr, String)> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nf_tables::build::{addr_element, new_set};
    use nf_tables::model::{Chain, DataType, ElementDelta, Family};

    /// What decides whether an apply may block the loop's worker: objects named, not bytes.
    #[test]
    fn objects_counts_chains_sets_and_elements() {
        let mut set = new_set("s", vec![DataType::Ipv4Addr], 0, None);
        set.elements = (1..=3u8)
            .map(|i| addr_element(std::net::IpAddr::from([10, 0, 0, i])))
            .collect();
        let mut t = Table::new(Family::Ip, "calico");
        t.chains.insert("c".into(), Chain::regular("c"));
        t.sets.insert("s".into(), set.clone());
        assert_eq!(TablesInput::Full(vec![t]).objects(), 1 + 1 + 3);

        let mut p = TablePatch::new(Family::Ip, "calico");
        p.elements.insert(
            "s".into(),
            ElementDelta {
                add: set.elements[..1].to_vec(),
                del: set.elements[1..].to_vec(),
            },
        );
        p.chains.insert("gone".into(), None);
        p.sets.insert("gone".into(), None);
        assert_eq!(TablesInput::Patch(vec![p]).objects(), 3 + 1 + 1);
    }

    /// The object counts kept from the patches equal a count of the folded tables: chains and
    /// sets added, replaced (with more or fewer rules) and deleted, a map, and a new table.
    #[test]
    fn counts_follow_the_patches() {
        use nf_tables::model::{Expr, Rule, Verdict};
        let chain = |name: &str, rules: usize| {
            let mut c = Chain::regular(name);
            c.rules = (0..rules)
                .map(|_| Rule {
                    exprs: vec![Expr::Verdict(Verdict::Accept)].into(),
                    comment: None,
                    handle: None,
                })
                .collect();
            c
        };
        let mut t = Table::new(Family::Ip, "calico");
        for (n, r) in [("a", 3), ("b", 2), ("c", 1)] {
            t.chains.insert(n.into(), chain(n, r));
        }
        t.sets
            .insert("s".into(), new_set("s", vec![DataType::Ipv4Addr], 0, None));
        let mut desired = vec![t];
        let counts: Vec<(Family, TableObjects)> = desired
            .iter()
            .map(|t| (t.family, TableObjects::of(t)))
            .collect();

        let mut p = TablePatch::new(Family::Ip, "calico");
        p.chains.insert("a".into(), Some(chain("a", 5)));
        p.chains.insert("b".into(), None);
        p.chains.insert("d".into(), Some(chain("d", 4)));
        p.sets.insert("s".into(), None);
        let map = new_set("m", vec![DataType::IfName], 0, Some(DataType::Verdict));
        p.sets.insert("m".into(), Some(map));
        let mut side = TablePatch::new(Family::Ip, "calico-side");
        side.chains.insert("x".into(), Some(chain("x", 2)));
        let deltas = [&p, &side]
            .iter()
            .map(|p| (p.family, p.name.clone(), Counted::delta(&desired, p)))
            .collect();
        TablePatch::fold_all(vec![p, side], &mut desired);

        let kept = follow(counts, deltas, &desired);
        let counted: Vec<(Family, TableObjects)> = desired
            .iter()
            .map(|t| (t.family, TableObjects::of(t)))
            .collect();
        assert_eq!(kept, counted);
        assert_eq!((kept[0].1.chains, kept[0].1.rules), (3, 10));
        assert_eq!((kept[0].1.sets, kept[0].1.maps), (0, 1));
    }
}
