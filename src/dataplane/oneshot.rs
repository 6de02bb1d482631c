//! One-shot commands over the same dataplane: `apply STATE [--dry-run]`,
//! `plan STATE`, `dump [--json]`, `cleanup`, each acting in `--netns` or the current namespace.
//!
//! `apply` and `plan` share one input path: configuration → state document (every decode error
//! listed) → [`validate::validate_all`] (every error listed) — all before any kernel socket is
//! opened, so a bad document leaves the kernel untouched — then a [`Dataplane`] fed with a link
//! and address dump, both InSyncs marked, and the desired state rendered. `apply` then runs the
//! phases once in the loop's fixed order (§10.3): globals → tables (one transaction, `Resync`:
//! read, diff, commit) → routes → neighbours → per-interface sysctls of workload interfaces that
//! are up. `plan` computes the same changes with the same decision code and writes nothing.
//!
//! What is ours (and what `dump` shows and `cleanup` removes): the `calico` tables of both
//! families; routes the §15 ownership rule claims ([`RouteSyncer::list_owned`]); permanent IPv4
//! neighbours on workload interfaces (the only ones the neighbour syncer manages).
//!
//! Table flags: one-shot commands create plain tables (no `OWNER|PERSIST`). The owner flag
//! protects the tables of a *running* agent and is released the moment the process that set it
//! exits, so a one-shot owner would only make every later `apply` re-adopt the table (one
//! operation) instead of finding nothing to do. The daemon adds the flags when it starts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{self, ConfigError};
use crate::netns::{NetNs, NetNsError};
use crate::nft::diff::{Op, Plan};
use crate::nft::model::{Family, Table};
use crate::nft::reconcile::{self, Nft, NftKernel, TableOwnership};
use crate::nft::{print, NftError};
use crate::proto::ToDataplane;
use crate::rtnl::link::{list_addresses, list_links, LinkState};
use crate::rtnl::monitor::{ExcludeList, IfaceEvent};
use crate::rtnl::neigh::{list_permanent, Mac, NeighSyncer};
use crate::rtnl::routes::{OwnedRoute, RoutePlan, RouteSpec, RouteSyncer, RT_TABLE_MAIN};
use crate::rtnl::{IpFamily, RtnlError, RtnlHandle};
use crate::rules::RulesError;
use crate::source::state::{self, StateError};

use super::kernel::{Kernel, KernelError, RealKernel, TableMode, TablesInput};
use super::validate::{self, InputError, Valid};
use super::{Dataplane, DataplaneConfig, Desired, IfaceConf};

/// Exit code: converged / nothing went wrong.
pub const EXIT_OK: u8 = 0;
/// Exit code: bad input, or the kernel refused something.
pub const EXIT_FAILED: u8 = 1;

/// Why a one-shot command failed.
#[derive(Debug, thiserror::Error)]
pub enum OneShotError {
    #[error("loading the configuration")]
    Config(#[source] ConfigError),
    #[error("loading the state document {}", path.display())]
    State {
        path: PathBuf,
        #[source]
        source: StateError,
    },
    #[error("the state document {} has {} message(s) that do not decode; nothing was changed{}", path.display(), errors.len(), list_rejected(errors))]
    Undecodable {
        path: PathBuf,
        errors: Vec<crate::source::Rejected>,
    },
    #[error("the state document has {} invalid message(s); nothing was changed{}", .0.len(), list_input_errors(.0))]
    Invalid(Vec<(usize, InputError)>),
    #[error("opening the network namespace")]
    NetNs(#[source] NetNsError),
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("rendering the desired state")]
    Render(#[source] RulesError),
    #[error("{op}")]
    Kernel {
        op: &'static str,
        #[source]
        source: Box<KernelError>,
    },
    #[error("{op}")]
    Rtnl {
        op: &'static str,
        #[source]
        source: Box<RtnlError>,
    },
    #[error("{op}")]
    Nft {
        op: &'static str,
        #[source]
        source: Box<NftError>,
    },
}

fn list_rejected(errors: &[crate::source::Rejected]) -> String {
    let mut s = String::new();
    for r in errors {
        let _ = write!(s, "\n  {}: {}", r.origin, r.reason);
    }
    s
}

fn list_input_errors(errors: &[(usize, InputError)]) -> String {
    let mut s = String::new();
    for (i, e) in errors {
        let _ = write!(s, "\n  message {i}: {e}");
    }
    s
}

impl OneShotError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            OneShotError::Config(_) => config::EXIT_BAD_CONFIG,
            _ => EXIT_FAILED,
        }
    }
}

fn rtnl(op: &'static str) -> impl FnOnce(RtnlError) -> OneShotError {
    move |source| OneShotError::Rtnl {
        op,
        source: Box::new(source),
    }
}

fn kern(op: &'static str) -> impl FnOnce(KernelError) -> OneShotError {
    move |source| OneShotError::Kernel {
        op,
        source: Box::new(source),
    }
}

/// What the one-shot commands share from the command line.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// `--netns`: a name under /run/netns or a path.
    pub netns: Option<String>,
    /// `--config`.
    pub config: Option<PathBuf>,
}

// ---------------------------------------------------------------------------------------------
// Entry points (the CLI arms call these)
// ---------------------------------------------------------------------------------------------

/// What a one-shot command prints on standard output, and its exit code; or why it failed
/// (its exit code is [`OneShotError::exit_code`]). The caller prints and exits.
pub type CommandResult = Result<(String, u8), OneShotError>;

/// `felix-nft apply STATE [--dry-run]`.
pub fn apply_command(
    state: &Path,
    dry_run: bool,
    allow_empty: bool,
    target: &Target,
) -> CommandResult {
    let mode = if dry_run { Mode::DryRun } else { Mode::Apply };
    run_converge(state, mode, allow_empty, target)
}

/// `felix-nft plan STATE`.
pub fn plan_command(state: &Path, allow_empty: bool, target: &Target) -> CommandResult {
    run_converge(state, Mode::Plan, allow_empty, target)
}

/// `felix-nft dump [--json]`. The text form is written to standard output table by table as it
/// is read; the JSON form is returned.
pub fn dump_command(json: bool, target: &Target) -> CommandResult {
    (|| {
        let cfg = load_config(target)?;
        let ns = open_ns(target)?;
        let snap = block_on(snapshot(ns.as_ref(), &cfg))??;
        let text = if json {
            snap.json()
        } else {
            // Table by table straight to stdout: the text of a mid-scale table is 10 MB, and
            // one whole copy of it would be a sixth of the command's peak memory. A closed
            // pipe (`| head`) is not a failure of the command.
            let _ = snap.write_text(&mut std::io::stdout().lock());
            String::new()
        };
        // The process exits next: skip freeing the tables one allocation at a time.
        std::mem::forget(snap);
        Ok((text, EXIT_OK))
    })()
}

/// `felix-nft cleanup`.
pub fn cleanup_command(target: &Target) -> CommandResult {
    (|| {
        let cfg = load_config(target)?;
        let ns = open_ns(target)?;
        let rep = block_on(cleanup(ns.as_ref(), &cfg))??;
        let code = if rep.errors.is_empty() {
            EXIT_OK
        } else {
            EXIT_FAILED
        };
        Ok((rep.text(), code))
    })()
}

fn load_config(target: &Target) -> Result<DataplaneConfig, OneShotError> {
    let resolved = config::load_for_cli(target.config.as_deref()).map_err(OneShotError::Config)?;
    if let Err(e) = crate::ops::init_logging(&resolved.config) {
        eprintln!("felix-nft: logging not set up: {e}");
    }
    resolved.log_warnings();
    let mut cfg = DataplaneConfig::from_config(&resolved.config);
    // See the module documentation: a one-shot process cannot keep ownership.
    cfg.ownership = TableOwnership::Off;
    Ok(cfg)
}

fn open_ns(target: &Target) -> Result<Option<NetNs>, OneShotError> {
    target
        .netns
        .as_deref()
        .map(NetNs::open)
        .transpose()
        .map_err(OneShotError::NetNs)
}

fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, OneShotError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OneShotError::Runtime)?;
    Ok(rt.block_on(f))
}

// ---------------------------------------------------------------------------------------------
// apply / plan
// ---------------------------------------------------------------------------------------------

/// What `apply`/`plan` do with the desired state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Converge the kernel.
    Apply,
    /// Validate the nf_tables batch in the kernel (no END), write nothing else.
    DryRun,
    /// Compute the changes, send nothing.
    Plan,
}

fn run_converge(
    state_path: &Path,
    mode: Mode,
    allow_empty: bool,
    target: &Target,
) -> Result<(String, u8), OneShotError> {
    let cfg = load_config(target)?;
    let msgs = load_state(state_path, &cfg, allow_empty)?;
    let ns = open_ns(target)?;
    let (changes, retained) = block_on(converge_retaining(ns.as_ref(), &cfg, msgs, mode))??;
    // The process exits next: freeing the model, the rendered tables and the reconciler's
    // copies one small allocation at a time took 70 ms of a mid-scale `apply` (measured), and
    // the kernel reclaims the memory at exit anyway.
    std::mem::forget(retained);
    let code = if changes.errors.is_empty() {
        EXIT_OK
    } else {
        EXIT_FAILED
    };
    let text = changes.text(mode);
    // The plans hold every operation sent: as `retained`.
    std::mem::forget(changes);
    Ok((text, code))
}

/// Loads and validates a state document, refusing one that describes nothing or may have been
/// cut short unless `allow_empty` ([`state::check_complete`]). Touches no kernel.
pub fn load_state(
    path: &Path,
    cfg: &DataplaneConfig,
    allow_empty: bool,
) -> Result<Vec<Valid>, OneShotError> {
    let state_error = |source| match source {
        StateError::Invalid(errors) => OneShotError::Undecodable {
            path: path.to_path_buf(),
            errors,
        },
        source => OneShotError::State {
            path: path.to_path_buf(),
            source,
        },
    };
    let (msgs, form) = state::load_with_form(path).map_err(state_error)?;
    state::check_complete(&msgs, form, allow_empty).map_err(state_error)?;
    validated(cfg, msgs)
}

/// `msgs` if they are valid as a sequence (each against the state the ones before it make).
fn validated(cfg: &DataplaneConfig, msgs: Vec<ToDataplane>) -> Result<Vec<Valid>, OneShotError> {
    let base = Dataplane::new(cfg.clone(), 1).map_err(OneShotError::Render)?;
    validate::validate_all(base.model(), msgs).map_err(OneShotError::Invalid)
}

/// A sysctl whose value differs from what we write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlChange {
    /// Relative to /proc/sys (`net/ipv4/conf/cali1/proxy_arp`).
    pub path: String,
    pub from: String,
    pub to: String,
}

/// The changes `apply` makes (or made), as `plan` and `apply` print them.
#[derive(Debug, Default)]
pub struct ConvergeReport {
    /// nf_tables plans (per table) and their operation count.
    pub tables: Vec<Plan>,
    pub table_ops: usize,
    /// Routes (both families). For `apply`, what was written.
    pub routes: RoutePlan,
    /// Whether route and neighbour work was skipped (`RouteSyncDisabled`).
    pub route_sync_disabled: bool,
    /// Permanent neighbours to set: (interface, address, MAC).
    pub neigh_set: Vec<(String, IpAddr, Mac)>,
    /// Permanent neighbours to delete: (interface, address).
    pub neigh_delete: Vec<(String, IpAddr)>,
    /// Interfaces whose neighbours wait for the interface.
    pub neigh_parked: Vec<String>,
    pub sysctls: Vec<SysctlChange>,
    /// Failures (apply only); any makes the exit code non-zero.
    pub errors: Vec<String>,
}

impl ConvergeReport {
    fn is_empty(&self) -> bool {
        self.table_ops == 0
            && self.routes.is_empty()
            && self.neigh_set.is_empty()
            && self.neigh_delete.is_empty()
            && self.sysctls.is_empty()
    }

    /// The report: counts first, then one line per route/neighbour/sysctl change (the same lines
    /// for `plan` and `apply`), then (`plan`, `--dry-run`) the nf_tables operations.
    pub fn text(&self, mode: Mode) -> String {
        let mut s = String::new();
        let (add, repl, del, set) = match mode {
            Mode::Apply => ("added", "replaced", "deleted", "set"),
            _ => ("to add", "to replace", "to delete", "to set"),
        };
        match mode {
            Mode::Apply if self.is_empty() && self.errors.is_empty() => {
                s.push_str("converged: nothing changed\n")
            }
            Mode::Apply => {}
            Mode::DryRun => s.push_str(
                "dry run: the kernel validated the nf_tables batch and kept nothing; no \
                 route, neighbour or sysctl was written\n",
            ),
            Mode::Plan if self.is_empty() => s.push_str("nothing to do\n"),
            Mode::Plan => {}
        }
        let _ = writeln!(
            s,
            "nf_tables: {} operation(s) in {} table(s)",
            self.table_ops,
            self.tables.len()
        );
        if self.route_sync_disabled {
            s.push_str("routes: skipped (RouteSyncDisabled)\nneighbours: skipped\n");
        } else {
            let _ = writeln!(
                s,
                "routes: {} {add}, {} {repl}, {} {del}, {} parked, {} in grace",
                self.routes.add.len(),
                self.routes.replace.len(),
                self.routes.delete.len(),
                self.routes.parked.len(),
                self.routes.in_grace.len()
            );
            let _ = writeln!(
                s,
                "neighbours: {} {set}, {} {del}, {} interface(s) parked",
                self.neigh_set.len(),
                self.neigh_delete.len(),
                self.neigh_parked.len()
            );
        }
        let _ = writeln!(
            s,
            "sysctls: {} {}",
            self.sysctls.len(),
            if mode == Mode::Apply {
                "changed"
            } else {
                "to change"
            }
        );
        if !self.errors.is_empty() {
            let _ = writeln!(s, "errors: {}", self.errors.len());
        }
        for r in &self.routes.add {
            let _ = writeln!(s, "route add {r}");
        }
        for r in &self.routes.replace {
            let _ = writeln!(s, "route replace {r}");
        }
        for r in &self.routes.delete {
            let _ = writeln!(s, "route delete {r}");
        }
        for (k, dev) in &self.routes.parked {
            let _ = writeln!(s, "route parked {k} (interface {dev} absent or down)");
        }
        for k in &self.routes.in_grace {
            let _ = writeln!(
                s,
                "route in-grace {k} (unknown route on a workload interface, kept for now)"
            );
        }
        for (dev, ip, mac) in &self.neigh_set {
            let _ = writeln!(s, "neigh set {ip} lladdr {} dev {dev}", fmt_mac(mac));
        }
        for (dev, ip) in &self.neigh_delete {
            let _ = writeln!(s, "neigh delete {ip} dev {dev}");
        }
        for c in &self.sysctls {
            let _ = writeln!(s, "sysctl {} {} -> {}", c.path, c.from, c.to);
        }
        for e in &self.errors {
            let _ = writeln!(s, "error: {e}");
        }
        if mode != Mode::Apply {
            for p in &self.tables {
                let _ = write!(s, "{p}");
            }
        } else {
            for p in &self.tables {
                let _ = writeln!(
                    s,
                    "table {} {}: {}",
                    p.family.name(),
                    p.table,
                    op_summary(&p.ops)
                );
            }
        }
        s
    }
}

fn op_summary(ops: &[Op]) -> String {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for op in ops {
        let k = match op {
            Op::AddTable { .. } => "add table",
            Op::DelTable => "delete table",
            Op::AddSet(_) => "add set",
            Op::DelSet(_) => "delete set",
            Op::AddElements { .. } => "add elements",
            Op::DelElements { .. } => "delete elements",
            Op::AddChain(_) => "add chain",
            Op::FlushChain(_) => "flush chain",
            Op::DelChain(_) => "delete chain",
            Op::AddRule { .. } => "add rule",
        };
        *n.entry(k).or_default() += 1;
    }
    n.iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn fmt_mac(m: &Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The route syncers of both families with the §15 ownership rule of `cfg`.
fn route_syncers(cfg: &DataplaneConfig, grace: Option<Duration>) -> [RouteSyncer; 2] {
    let own = cfg.route_ownership();
    [IpFamily::V4, IpFamily::V6].map(|f| {
        let s = RouteSyncer::new(f, RT_TABLE_MAIN, own.clone());
        match grace {
            Some(g) => s.with_grace(g),
            None => s,
        }
    })
}

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

/// [`converge`] of messages [`load_state`] validated.
async fn converge_retaining(
    ns: Option<&NetNs>,
    cfg: &DataplaneConfig,
    msgs: Vec<Valid>,
    mode: Mode,
) -> Result<(ConvergeReport, Retained), OneShotError> {
    let mut kernel = RealKernel::open(ns, cfg).map_err(kern("opening the kernel sockets"))?;
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
    let mut desired = dp.desired().map_err(OneShotError::Render)?;
    let up_ifaces: BTreeMap<String, IfaceConf> = desired
        .iface_conf
        .iter()
        .filter(|(name, _)| dp.ifaces().get(*name).is_some_and(|i| i.oper_up))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    // Everything below works from `desired`; the model and its caches go before the nf_tables
    // phase, where the reconciler copies the tables (peak memory).
    drop(dp);

    // Everything is planned against the kernel as it is now, by the code apply uses.
    let mut ch = ConvergeReport {
        route_sync_disabled: cfg.route_sync_disabled,
        ..ConvergeReport::default()
    };
    let mut syncers = route_syncers(cfg, None);
    let mut neigh = NeighSyncer::new();
    ch.sysctls = sysctl_plan(&kernel, cfg, &up_ifaces);
    if !cfg.route_sync_disabled {
        for s in syncers.iter_mut() {
            for (group, specs) in &desired.routes {
                s.set_routes(group.clone(), specs.clone());
            }
            let p = s
                .plan(kernel.rtnl())
                .await
                .map_err(rtnl("planning routes"))?;
            merge_route_plan(&mut ch.routes, p);
        }
        neigh_plan(kernel.rtnl(), cfg, &desired, &links, &mut ch, &mut neigh).await?;
    }

    match mode {
        Mode::Plan => {
            let out = kernel
                .plan_tables(&desired.tables)
                .await
                .map_err(kern("planning nf_tables"))?;
            ch.table_ops = out.ops;
            ch.tables = out.plans;
            return Ok((
                ch,
                Retained {
                    _desired: desired,
                    _kernel: kernel,
                },
            ));
        }
        Mode::DryRun => {
            let out = kernel
                .tables(
                    TablesInput::Full(std::mem::take(&mut desired.tables)),
                    TableMode::DryRun,
                )
                .await
                .map_err(kern("validating the nf_tables batch (dry run)"))?;
            ch.table_ops = out.ops;
            ch.tables = out.plans;
            return Ok((
                ch,
                Retained {
                    _desired: desired,
                    _kernel: kernel,
                },
            ));
        }
        Mode::Apply => {}
    }

    // The fixed order (§10.3): globals → tables → routes → neighbours → interface sysctls.
    kernel
        .globals(cfg.ip_forwarding, cfg.ipv6)
        .await
        .map_err(kern("start-of-day sysctls"))?;
    let out = kernel
        .tables(
            TablesInput::Full(std::mem::take(&mut desired.tables)),
            TableMode::Resync,
        )
        .await
        .map_err(kern(
            "programming nf_tables (one transaction; nothing was changed there)",
        ))?;
    ch.table_ops = out.ops;
    ch.tables = out.plans;
    if ch.table_ops == 0 {
        tracing::info!("nf_tables already converged: no transaction sent");
    } else {
        tracing::info!(ops = ch.table_ops, "nf_tables transaction committed");
    }

    if !cfg.route_sync_disabled {
        let planned = std::mem::take(&mut ch.routes);
        let specs: BTreeMap<_, &RouteSpec> = desired
            .routes
            .values()
            .flatten()
            .map(|r| ((r.dst.trunc(), r.metric), r))
            .collect();
        for s in syncers.iter_mut() {
            let rep = s
                .apply(kernel.rtnl())
                .await
                .map_err(rtnl("syncing routes"))?;
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
        let rep = neigh
            .apply(kernel.rtnl())
            .await
            .map_err(rtnl("syncing neighbours"))?;
        ch.errors
            .extend(rep.errors.iter().map(|e| crate::ops::logging::chain(e)));
        // What was actually written.
        ch.neigh_set
            .retain(|(d, ip, _)| rep.set.iter().any(|(d2, ip2)| d == d2 && ip == ip2));
        ch.neigh_delete.retain(|e| rep.deleted.contains(e));
    }

    for (iface, conf) in &up_ifaces {
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
    Ok((
        ch,
        Retained {
            _desired: desired,
            _kernel: kernel,
        },
    ))
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
    let mut kernel: BTreeMap<String, BTreeMap<IpAddr, Option<Mac>>> = BTreeMap::new();
    for n in list_permanent(h)
        .await
        .map_err(rtnl("listing neighbours"))?
    {
        match by_index.get(&n.ifindex) {
            Some(l) if cfg.is_workload_iface(&l.name) && n.ip.is_ipv4() => {
                kernel
                    .entry(l.name.clone())
                    .or_default()
                    .insert(n.ip, n.mac);
            }
            _ => {}
        }
    }
    for (iface, entries) in &desired.neighbours {
        match by_name.get(iface.as_str()) {
            Some(l) if l.admin_up => {
                let have = kernel.get(iface);
                for (ip, mac) in entries {
                    if have.and_then(|h| h.get(ip)) != Some(&Some(*mac)) {
                        ch.neigh_set.push((iface.clone(), *ip, *mac));
                    }
                }
            }
            _ => ch.neigh_parked.push(iface.clone()),
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

// ---------------------------------------------------------------------------------------------
// dump
// ---------------------------------------------------------------------------------------------

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
fn open_nft(ns: Option<&NetNs>) -> Result<Nft, OneShotError> {
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
const OUR_TABLES: [(Family, &str); 4] = [
    (Family::Ip, crate::OWNER),
    (Family::Ip6, crate::OWNER),
    (Family::Ip, crate::SIDE_TABLE),
    (Family::Ip6, crate::SIDE_TABLE),
];

async fn our_neighbours(
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
            for (iface, d) in crate::rules::Renderer::dispatched_workloads(t) {
                let traffic = |t: Option<crate::rules::Traffic>| {
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
                    "endpoints": crate::rules::Renderer::dispatched_workloads(t)
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

// ---------------------------------------------------------------------------------------------
// cleanup
// ---------------------------------------------------------------------------------------------

/// What `cleanup` removed.
#[derive(Debug, Default)]
pub struct CleanupReport {
    /// Tables deleted (0, 1 or 2).
    pub tables: usize,
    /// Routes deleted, as `dump` prints them.
    pub routes: Vec<String>,
    /// Permanent neighbours deleted: (interface, address).
    pub neighbours: Vec<(String, IpAddr)>,
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
        for e in &self.errors {
            let _ = writeln!(s, "error: {e}");
        }
        s
    }
}

/// Removes our tables (one transaction), our routes (no grace period) and our permanent
/// neighbours on workload interfaces. Idempotent.
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
    Ok(rep)
}
