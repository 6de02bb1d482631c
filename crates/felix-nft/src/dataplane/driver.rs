//! The event loop (§10.2–10.4): one task owns the dataplane state; the
//! transports and the interface monitor talk to it over bounded channels.
//!
//! - Messages are batched: after one, up to 100 more are drained before an apply is considered.
//! - Nothing touches the kernel before the datastore's `InSync` and the monitor's first sync.
//! - Applies are throttled by a token bucket (10 deep, one token per 100 ms).
//! - An apply runs the phases in a fixed order: start-of-day globals (first apply only) →
//!   nf_tables (one transaction, both families) → routes → neighbours → per-interface sysctls →
//!   conntrack cleanup for moved addresses, started in the background (the next apply and the
//!   loop's end wait for it first) → endpoint status.
//! - Failed work stays dirty and is retried with exponential backoff; after
//!   [`LoopOptions::rebuild_after`] consecutive table failures the tables are rebuilt atomically
//!   (delete + add in one batch); after [`LoopOptions::give_up_after`] the loop returns an error
//!   and the process exits non-zero — the last good rules stay in the kernel (fail closed).
//! - Refresh timers re-read the kernel (tables every `NftablesRefreshInterval`, routes and
//!   neighbours every `RouteRefreshInterval`); a refresh that finds differences repairs them and
//!   counts a drift repair.
//! - Another program's commit that touches our tables (seen on the nf_tables event socket: an
//!   inserted rule, a deleted chain or table, `nft flush ruleset`) starts that refresh at once,
//!   where the kernel cannot keep others out (no owned tables before 6.9, or ownership off);
//!   a writer that keeps changing them is answered later and later ([`super::repair`]).

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant as TokioInstant};

use crate::ops::logging::chain;
use crate::ops::{DataplaneHealth, Ops};
use crate::source::outbox::Outbox;
use crate::source::Received;
use felix_api::from_dataplane::Payload as Out;
use felix_api::to_dataplane::Payload;
use felix_api::{
    DataplaneInSync, FromDataplane, IpVersion, ProcessStatusUpdate, WireguardStatusUpdate,
};
use rtnl::monitor::IfaceEvent;

use super::kernel::{Kernel, KernelError, TableMode, TablesInput, TablesOutcome, WgOutcome};
use super::repair::RepairBackoff;
use super::status::StatusReporter;
use super::Dataplane;

/// The most commits one apply makes to isolate inputs the kernel refuses.
const MAX_ISOLATION_ROUNDS: usize = 64;

/// Loop tuning (Felix's values by default).
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Messages drained after the first before an apply (100).
    pub batch: usize,
    /// Token bucket: depth and refill period (10, 100 ms).
    pub throttle_burst: u32,
    pub throttle_period: Duration,
    /// First retry delay after a failure, doubled each time up to `retry_max`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Consecutive table failures before a rebuild (5, as Felix's sixth attempt recreates).
    pub rebuild_after: u32,
    /// Consecutive table failures before giving up (10).
    pub give_up_after: u32,
    /// Exit once the input ends (after applying what it said) instead of running on.
    pub exit_on_eof: bool,
    /// Delay of the first heartbeat (Felix: 10 s).
    pub first_heartbeat: Duration,
    /// Log every decoded input message at info (`--trace-input`), else at debug.
    pub trace_input: bool,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            batch: 100,
            throttle_burst: 10,
            throttle_period: Duration::from_millis(100),
            retry_base: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            rebuild_after: 5,
            give_up_after: 10,
            exit_on_eof: false,
            first_heartbeat: Duration::from_secs(10),
            trace_input: false,
        }
    }
}

/// Why the loop stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(
        "programming nf_tables failed {failures} times in a row, the atomic rebuild included; \
         exiting with the last good rules left in the kernel (fail closed)"
    )]
    GaveUp {
        failures: u32,
        #[source]
        last: KernelError,
    },
    #[error("start-of-day configuration")]
    Globals(#[source] KernelError),
}

/// What a finished run did.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub messages: u64,
    /// Messages decoded (rejected ones excluded).
    pub decoded: u64,
    pub rejected: u64,
    pub applies: u64,
    pub failures: u64,
    pub drift_repairs: u64,
}

/// A deadline that never comes, for a period of zero (off).
const FAR: Duration = Duration::from_secs(86400 * 365);
/// How often the dataplane reports itself live to the health aggregator.
const HEALTH_PERIOD: Duration = Duration::from_secs(10);

/// A configured period, or never when it is zero.
fn every(d: Duration) -> Duration {
    if d.is_zero() {
        FAR
    } else {
        d
    }
}

/// The loop's own deadlines: the periodic refreshes and heartbeats, the side table's merge after
/// a quiet spell (reset by every apply), and the end of a throttle.
struct Deadlines {
    nft_refresh: TokioInstant,
    route_refresh: TokioInstant,
    heartbeat: TokioInstant,
    health: TokioInstant,
    merge: Option<TokioInstant>,
    throttled_until: Option<TokioInstant>,
    /// A repair of another program's change to our tables, backed off.
    repair: Option<TokioInstant>,
}

impl Deadlines {
    fn new(cfg: &super::DataplaneConfig, first_heartbeat: Duration) -> Deadlines {
        let now = TokioInstant::now();
        Deadlines {
            nft_refresh: now + every(cfg.nft_refresh),
            route_refresh: now + every(cfg.route_refresh),
            heartbeat: now + first_heartbeat.min(every(cfg.reporting_interval)),
            health: now + HEALTH_PERIOD,
            merge: None,
            throttled_until: None,
            repair: None,
        }
    }
}

/// A token bucket for applies (on tokio's clock, so tests can pause time).
struct Throttle {
    tokens: f64,
    burst: f64,
    period: Duration,
    last: TokioInstant,
}

impl Throttle {
    fn new(burst: u32, period: Duration) -> Throttle {
        Throttle {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            period,
            last: TokioInstant::now(),
        }
    }

    fn refill(&mut self) {
        let now = TokioInstant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        if self.period.is_zero() {
            self.tokens = self.burst;
        } else {
            self.tokens = (self.tokens + dt / self.period.as_secs_f64()).min(self.burst);
        }
    }

    /// Takes a token, or says when one will be there.
    fn take(&mut self) -> Result<(), Duration> {
        self.refill();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(self.period.mul_f64(1.0 - self.tokens))
        }
    }
}

/// The loop's state besides the dataplane.
pub struct Driver<K: Kernel> {
    pub dp: Dataplane,
    pub kernel: K,
    opts: LoopOptions,
    out: Option<Outbox>,
    ops: Option<Ops>,
    health: Option<DataplaneHealth>,
    status: StatusReporter,
    first_apply_done: bool,
    table_failures: u32,
    retry_at: Option<TokioInstant>,
    resync_tables: bool,
    resync_routes: bool,
    changed_ifaces: BTreeSet<String>,
    /// The last apply failed somewhere (a retry is due).
    last_failed: bool,
    input_ended: bool,
    /// Unknown routes on workload interfaces are waiting out their grace period.
    grace_pending: bool,
    /// When to look at those routes again (the grace period is over).
    grace_at: Option<TokioInstant>,
    summary: RunSummary,
    started: Instant,
    /// When the oldest update the next apply carries was read (its end-to-end latency).
    pending_since: Option<Instant>,
    /// When to repair after other programs change our tables.
    repair: RepairBackoff,
    /// The WireGuard key last reported per family (`""`: none).
    wg_reported: std::collections::BTreeMap<rtnl::IpFamily, String>,
    /// The first apply's wait was said (see [`Driver::say_what_the_first_apply_waits_for`]).
    wait_said: bool,
    /// The nodes last reported as claiming one key.
    wg_conflicts: Vec<String>,
    /// Where the names flows resolve to go (the flow-log collector), when flow logs are on.
    flow_names: Option<FlowNamesHook>,
    /// An update may have changed those names since they were last handed over.
    names_dirty: bool,
    /// Not before then again: a burst of updates rebuilds them once.
    names_at: Option<TokioInstant>,
}

/// Receives the model's flow names whenever endpoints, routes or tiers may have changed them.
pub type FlowNamesHook = Box<dyn FnMut(crate::flows::names::FlowNames) + Send>;

/// The least time between two rebuilds of the flow names.
const NAMES_EVERY: Duration = Duration::from_secs(1);

impl<K: Kernel> Driver<K> {
    pub fn new(
        dp: Dataplane,
        kernel: K,
        opts: LoopOptions,
        out: Option<Outbox>,
        ops: Option<Ops>,
    ) -> Driver<K> {
        let health = ops.as_ref().map(|o| o.dataplane_health());
        Driver {
            dp,
            kernel,
            opts,
            out,
            ops,
            health,
            status: StatusReporter::default(),
            first_apply_done: false,
            table_failures: 0,
            retry_at: None,
            resync_tables: true,
            resync_routes: true,
            changed_ifaces: BTreeSet::new(),
            last_failed: false,
            input_ended: false,
            grace_pending: false,
            grace_at: None,
            summary: RunSummary::default(),
            started: Instant::now(),
            pending_since: None,
            repair: RepairBackoff::default(),
            wg_reported: Default::default(),
            wg_conflicts: Vec::new(),
            wait_said: false,
            flow_names: None,
            names_dirty: true,
            names_at: None,
        }
    }

    /// Hands `hook` the names flows resolve to (endpoints, routes, tiers), now and after every
    /// change to them, at most once a second.
    pub fn with_flow_names(mut self, hook: FlowNamesHook) -> Self {
        self.flow_names = Some(hook);
        self
    }

    /// Rebuilds and hands over the flow names when they may have changed and the last rebuild
    /// is old enough; otherwise `names_at` says when.
    fn publish_flow_names(&mut self) {
        let Some(hook) = self.flow_names.as_mut() else {
            return;
        };
        let now = TokioInstant::now();
        if !self.names_dirty || self.names_at.is_some_and(|t| now < t) {
            return;
        }
        let dp = &self.dp;
        hook(crate::flows::names::FlowNames::from_model(
            dp.model(),
            dp.route_updates(),
            &dp.cfg().overlay.hostname,
        ));
        self.names_dirty = false;
        self.names_at = Some(now + NAMES_EVERY);
    }

    /// What the run did so far.
    pub fn summary(&self) -> &RunSummary {
        &self.summary
    }

    /// Whether the input channel has closed (its transport ended).
    pub fn input_ended(&self) -> bool {
        self.input_ended
    }

    /// Whether the first apply has succeeded.
    pub fn in_sync(&self) -> bool {
        self.first_apply_done
    }

    fn on_received(&mut self, r: Received) {
        self.summary.messages += 1;
        match r {
            Ok(u) => {
                self.summary.decoded += 1;
                crate::source::log_update(&u, self.opts.trace_input);
                if let Some(ops) = &self.ops {
                    let kind = u
                        .message
                        .payload
                        .as_ref()
                        .map(super::validate::payload_kind)
                        .unwrap_or("empty");
                    ops.metrics.record_message(kind);
                }
                if !matches!(
                    u.message.payload,
                    Some(
                        Payload::IpsetUpdate(_)
                            | Payload::IpsetDeltaUpdate(_)
                            | Payload::IpsetRemove(_)
                    )
                ) {
                    self.names_dirty = true;
                }
                if let Err(e) = self.dp.on_update(&u.message) {
                    self.summary.rejected += 1;
                    tracing::error!(origin = %u.origin, error = %e, "update rejected; the previous state stays programmed");
                } else if self.dp.dirty().any() {
                    // Something to apply: the next apply carries this update.
                    self.pending_since.get_or_insert(u.received);
                }
            }
            Err(rej) => {
                self.summary.rejected += 1;
                tracing::warn!(origin = %rej.origin, error = %chain(&rej), "input rejected");
            }
        }
    }

    fn on_iface(&mut self, ev: IfaceEvent) {
        match &ev {
            IfaceEvent::Link(l) => {
                self.changed_ifaces.insert(l.name.clone());
            }
            IfaceEvent::Renamed { new_name, .. } => {
                self.changed_ifaces.insert(new_name.clone());
            }
            IfaceEvent::InSync => {
                if let Some(h) = &mut self.health {
                    h.set_iface_in_sync();
                }
            }
            _ => {}
        }
        // This host's own addresses name flows too.
        self.names_dirty = true;
        self.dp.on_iface(&ev);
    }

    fn wants_apply(&self) -> bool {
        self.dp.ready() && (self.dp.dirty().any() || self.resync_tables || self.resync_routes)
    }

    /// After the input ended: nothing it asked for is left to do (or it never said `InSync`, so
    /// nothing may be done). Unknown routes waiting out their grace period do not hold us.
    fn input_done(&self) -> bool {
        if !self.dp.datastore_in_sync() {
            return true;
        }
        if !self.dp.ready() || self.last_failed || self.summary.applies == 0 {
            return false;
        }
        let d = self.dp.dirty();
        let only_grace = d.routes()
            && self.grace_pending
            && !d.tables()
            && !d.neighbours()
            && d.ifaces().is_empty();
        !d.any() || only_grace
    }

    /// One apply, all phases. `Err` only for the fatal cases; phase failures are retried.
    pub async fn apply(&mut self) -> Result<(), DriverError> {
        use tracing::Instrument;
        self.apply_phases()
            .instrument(tracing::info_span!("apply"))
            .await
    }

    /// The phases in the kernel's order (§10.3): globals (first apply), nf_tables, then the
    /// host: VXLAN devices and their FDB, routes, neighbours, interface sysctls; conntrack
    /// cleanup in the background; then the outcome and status.
    async fn apply_phases(&mut self) -> Result<(), DriverError> {
        let t0 = Instant::now();
        // The previous apply's conntrack cleanup ends first: an address that went away may come
        // back with this apply, and its new flows must not be deleted.
        self.settle_conntrack().await;
        if !self.first_apply_done && self.summary.applies == 0 {
            self.kernel
                .globals(self.dp.cfg().ip_forwarding, self.dp.cfg().ipv6)
                .await
                .map_err(DriverError::Globals)?;
        }
        self.summary.applies += 1;
        let mut failed: Option<KernelError> = None;
        let (mut table_ops, mut commit_time) = (0, Duration::ZERO);
        if self.dp.dirty().tables() || self.resync_tables {
            let (ops, time, res) = self.apply_tables().await?;
            (table_ops, commit_time) = (ops, time);
            failed = res.err();
        }
        // After the tables: a quarantined endpoint changes what the host phases state.
        let (desired, scope) = self.dp.desired_for_apply(self.resync_routes);
        let mut moved: Vec<IpAddr> = Vec::new();
        if !self.dp.cfg().route_sync_disabled {
            if self.dp.dirty().overlay() || self.resync_routes || desired.overlay_delta {
                self.phase_overlay(&desired, &mut failed).await;
            }
            if self.dp.dirty().routes() || self.resync_routes {
                moved = self
                    .phase_routes(&desired, scope.as_ref(), &mut failed)
                    .await;
            }
            if self.dp.dirty().neighbours() || self.resync_routes {
                self.phase_neighbours(&desired, scope.as_ref(), &mut failed)
                    .await;
            }
        } else {
            self.dp.host_routes_skipped();
        }
        let echo = self.dp.take_wireguard_echo();
        if self.dp.dirty().wireguard() || self.resync_routes || echo {
            self.phase_wireguard(echo, &mut failed).await;
        }
        if self.dp.finish_host_phases() {
            self.resync_routes = false;
        }
        self.phase_iface_conf(&desired, &mut failed).await;
        // Conntrack entries of addresses that moved or went away (§15), in the background:
        // the next apply waits for them before it programs anything.
        self.kernel.conntrack_cleanup(moved).await;
        self.finish_apply(t0.elapsed(), failed, table_ops, commit_time);
        Ok(())
    }

    /// The VXLAN devices and their FDB, and tunl0: before routes and neighbours, which live on
    /// them.
    async fn phase_overlay(&mut self, desired: &super::Desired, failed: &mut Option<KernelError>) {
        match self
            .kernel
            .overlay(&desired.vxlan, &self.changed_ifaces, self.resync_routes)
            .await
        {
            Ok(out) => {
                self.dp.overlay_applied(out.created);
                if out.parked {
                    tracing::debug!("VXLAN device waits for its parent interface");
                }
            }
            Err(e) => {
                tracing::warn!(error = %chain(&e), "VXLAN device sync failed; will retry");
                failed.get_or_insert(e);
            }
        }
        let Some(want) = &desired.ipip else {
            return;
        };
        if let Err(e) = self
            .kernel
            .ipip(want, &self.changed_ifaces, self.resync_routes)
            .await
        {
            tracing::warn!(error = %chain(&e), "IPIP device sync failed; will retry");
            failed.get_or_insert(e);
        }
    }

    /// WireGuard's devices, peers, table and rule; then the keys to Felix. `echo`: Felix
    /// echoed another key for this node than before, so the device is read again and its key
    /// reported even if unchanged (Felix's auto-heal of the node's published key).
    async fn phase_wireguard(&mut self, echo: bool, failed: &mut Option<KernelError>) {
        let want = self.dp.wireguard_desired();
        let cfg = &self.dp.cfg().wireguard;
        let src_valid_mark = cfg.host_encryption && cfg.v4.enabled;
        let conflicts: Vec<String> = [rtnl::IpFamily::V4, rtnl::IpFamily::V6]
            .into_iter()
            .flat_map(|f| self.dp.wireguard().conflicts(f))
            .collect();
        if conflicts != self.wg_conflicts {
            if !conflicts.is_empty() {
                tracing::warn!(nodes = ?conflicts, "WireGuard: nodes claim the same public key; \
                    none of them is a peer until the conflict clears (their traffic is not encrypted)");
            }
            self.wg_conflicts = conflicts;
        }
        match self
            .kernel
            .wireguard(
                want,
                src_valid_mark,
                &self.changed_ifaces,
                self.resync_routes || echo,
            )
            .await
        {
            Ok(out) => {
                self.dp.wireguard_applied();
                self.report_wireguard(&out, echo);
            }
            Err(e) => {
                tracing::warn!(error = %chain(&e), "WireGuard sync failed; will retry");
                failed.get_or_insert(e);
            }
        }
    }

    /// Tells Felix each family's key when it differs from the one last told (the first apply
    /// always tells, `""` for none), or when Felix echoed another one for this node.
    fn report_wireguard(&mut self, out: &WgOutcome, echo: bool) {
        use super::wireguard::format_key;
        for (family, key) in &out.keys {
            let key = key.as_ref().map(format_key).unwrap_or_default();
            let echoed = self.dp.wireguard().own_echo(*family);
            let heal = echo && echoed.as_ref().map(format_key).unwrap_or_default() != key;
            if self.wg_reported.get(family) == Some(&key) && !heal {
                continue;
            }
            let ip_version = match family {
                rtnl::IpFamily::V4 => IpVersion::Ipv4,
                rtnl::IpFamily::V6 => IpVersion::Ipv6,
            };
            tracing::info!(family = ?family, public_key = %key, "WireGuard key reported");
            self.send(FromDataplane {
                sequence_number: 0,
                payload: Some(Out::WireguardStatusUpdate(WireguardStatusUpdate {
                    public_key: key.clone(),
                    ip_version: ip_version as i32,
                })),
            });
            self.wg_reported.insert(*family, key);
        }
    }

    /// Routes; returns the single addresses that moved or went away (their conntrack entries
    /// go).
    async fn phase_routes(
        &mut self,
        desired: &super::Desired,
        scope: Option<&BTreeSet<String>>,
        failed: &mut Option<KernelError>,
    ) -> Vec<IpAddr> {
        let mut moved = Vec::new();
        let t0 = Instant::now();
        // The scope's interfaces, and the route groups of the remote blocks that changed.
        let only = scope.map(|s| {
            let mut only = s.clone();
            only.extend(desired.overlay_groups.iter().cloned());
            only
        });
        let routes = self
            .kernel
            .routes(&desired.routes, only.as_ref(), self.resync_routes)
            .await;
        if let Some(ops) = &self.ops {
            if self.resync_routes {
                ops.metrics.record_route_resync(t0.elapsed());
            } else {
                ops.metrics.record_route_partial_resync(t0.elapsed());
            }
        }
        match routes {
            Ok(out) => {
                if out.parked > 0 {
                    tracing::debug!(parked = out.parked, "routes waiting for their interface");
                }
                moved = out.moved_or_gone;
                if out.errors.is_empty() {
                    self.dp.routes_applied();
                } else {
                    tracing::warn!(errors = ?out.errors, "some routes failed; will retry");
                    failed.get_or_insert(KernelError::Other(format!(
                        "{} route(s) failed",
                        out.errors.len()
                    )));
                }
                self.grace_pending = out.in_grace > 0;
                // Re-check once the grace period of unknown routes is over (§15). This is a
                // wake-up for the routes phase only: it must not hold back applies of other
                // changes meanwhile, as a failure's backoff (`retry_at`) does.
                self.grace_at =
                    (out.in_grace > 0).then(|| TokioInstant::now() + rtnl::routes::DEFAULT_GRACE);
            }
            Err(e) => {
                tracing::warn!(error = %chain(&e), "route sync failed; will retry");
                failed.get_or_insert(e);
            }
        }
        moved
    }

    /// Permanent neighbours (and the routes of interfaces that flapped, re-asserted).
    async fn phase_neighbours(
        &mut self,
        desired: &super::Desired,
        scope: Option<&BTreeSet<String>>,
        failed: &mut Option<KernelError>,
    ) {
        let changed = std::mem::take(&mut self.changed_ifaces);
        match self
            .kernel
            .neighbours(&desired.neighbours, scope, &changed, self.resync_routes)
            .await
        {
            Ok(()) => self.dp.neighbours_applied(),
            Err(e) => {
                tracing::warn!(error = %chain(&e), "neighbour sync failed; will retry");
                self.changed_ifaces.extend(changed);
                failed.get_or_insert(e);
            }
        }
    }

    /// Per-interface configuration of workload interfaces that are up (§14.2).
    async fn phase_iface_conf(
        &mut self,
        desired: &super::Desired,
        failed: &mut Option<KernelError>,
    ) {
        let todo: Vec<String> = self.dp.dirty().ifaces().iter().cloned().collect();
        for iface in todo {
            let Some(conf) = desired.iface_conf.get(&iface) else {
                self.dp.iface_conf_done(&iface);
                continue;
            };
            if !self.dp.ifaces().get(&iface).is_some_and(|i| i.oper_up) {
                // Done when it comes up.
                self.dp.iface_conf_done(&iface);
                continue;
            }
            match self.kernel.iface_conf(&iface, conf).await {
                Ok(()) => {
                    self.dp.iface_conf_done(&iface);
                }
                Err(e) if e.is_vanished_interface() => {
                    tracing::debug!(ifname = %iface, "interface vanished while configuring it");
                    self.dp.iface_conf_done(&iface);
                }
                Err(e) => {
                    tracing::warn!(ifname = %iface, error = %chain(&e), "configuring interface failed; will retry");
                    self.dp.iface_conf_failed(&iface);
                    failed.get_or_insert(e);
                }
            }
        }
    }

    /// Records the apply's outcome (health, retry backoff, `DataplaneInSync` after the first
    /// good one), reports status that may have changed, and logs the apply.
    fn finish_apply(
        &mut self,
        elapsed: Duration,
        failed: Option<KernelError>,
        table_ops: usize,
        commit_time: Duration,
    ) {
        let ok = failed.is_none();
        self.last_failed = !ok;
        if let (Some(ops), Some(health)) = (&self.ops, &mut self.health) {
            let res: Result<(), &dyn std::fmt::Display> = match &failed {
                None => Ok(()),
                Some(e) => Err(e),
            };
            ops.apply_finished(health, elapsed, res);
        }
        match failed {
            None => {
                self.retry_at = self.retry_at.filter(|_| self.dp.dirty().any());
                if !self.first_apply_done {
                    self.first_apply_done = true;
                    if let Some(ops) = &self.ops {
                        ops.metrics.record_initial_resync(self.started.elapsed());
                    }
                    self.send(FromDataplane {
                        sequence_number: 0,
                        payload: Some(Out::DataplaneInSync(DataplaneInSync {})),
                    });
                    tracing::info!("dataplane in sync");
                }
            }
            Some(_) => {
                self.summary.failures += 1;
                let n = self.table_failures.max(1) - 1;
                let delay = self
                    .opts
                    .retry_base
                    .saturating_mul(1u32 << n.min(16))
                    .min(self.opts.retry_max);
                self.retry_at = Some(TokioInstant::now() + delay);
            }
        }
        // 6. Status (after DataplaneInSync on the first apply), when it may have changed.
        if let Some(scope) = self.dp.take_status_dirty() {
            if self.dp.cfg().endpoint_reporting {
                let (w, h) = self.dp.statuses_in(&scope);
                for m in self.status.update_in(&w, &h, &scope) {
                    self.send(m);
                }
            }
        }
        // The nf_tables commit's share is logged here rather than per transaction, so the cost
        // of one apply can be read at info level; so is the time since the oldest
        // update it carries was read (absent when only timers or interfaces asked for it).
        let since_read = self.pending_since.take().map(|t| t.elapsed());
        tracing::info!(
            ok,
            table_ops,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            commit_ms = commit_time.as_secs_f64() * 1000.0,
            since_read_ms = since_read.map(|d| d.as_secs_f64() * 1000.0),
            "apply"
        );
    }

    /// The nf_tables phase: one commit, or — when the kernel refuses what an input rendered
    /// to — the commits that find that input, quarantine it and program everything else
    /// ([`super::quarantine`]). Returns the operations and commit time of the last commit, and
    /// the failure that is not about one input, if any; `Err` when the loop must give up.
    async fn apply_tables(
        &mut self,
    ) -> Result<(usize, Duration, Result<(), KernelError>), DriverError> {
        let mut commit_time = Duration::ZERO;
        // Each round quarantines an input or halves the suspects: bounded by their number's
        // logarithm per input at fault; the cap only guards against a kernel that answers
        // differently each time.
        for _ in 0..MAX_ISOLATION_ROUNDS {
            let mode = if self.table_failures >= self.opts.rebuild_after {
                TableMode::Rebuild
            } else if self.resync_tables {
                TableMode::Resync
            } else {
                TableMode::Incremental
            };
            let model_changed = self.dp.dirty().tables();
            // Only what changed goes to the kernel side, which keeps the rest.
            let patch = TablesInput::Patch(self.dp.tables_patch());
            match self.kernel.tables(patch, mode).await {
                Ok(out) => {
                    commit_time += out.commit_time;
                    self.record_tables(&out, true);
                    self.report_table_commit(&out, mode, model_changed);
                    self.dp.tables_applied();
                    self.resync_tables = false;
                    self.table_failures = 0;
                    let found = self.dp.tables_committed();
                    self.quarantine_changed(found.is_some());
                    if self.dp.dirty().tables() {
                        // Inputs held back while bisecting came back, or one was quarantined:
                        // another commit.
                        continue;
                    }
                    return Ok((out.ops, commit_time, Ok(())));
                }
                Err(e) => {
                    if let Some(ops) = &self.ops {
                        ops.metrics.record_nft_call(false);
                    }
                    // Re-read before the next attempt: what we believe may be wrong.
                    self.resync_tables = true;
                    if self.isolate_refusal(&e) {
                        continue;
                    }
                    self.table_failures += 1;
                    tracing::error!(failures = self.table_failures, mode = ?mode, error = %chain(&e), "programming nf_tables failed; will retry");
                    if self.table_failures >= self.opts.give_up_after {
                        return Err(DriverError::GaveUp {
                            failures: self.table_failures,
                            last: e,
                        });
                    }
                    return Ok((0, commit_time, Err(e)));
                }
            }
        }
        self.dp.abandon_isolation();
        self.table_failures += 1;
        Ok((
            0,
            commit_time,
            Err(KernelError::Other(format!(
                "the kernel kept refusing after {MAX_ISOLATION_ROUNDS} attempts to isolate the input at fault"
            ))),
        ))
    }

    /// Says what a successful commit repaired or rebuilt, in the log and the metrics.
    fn report_table_commit(&mut self, out: &TablesOutcome, mode: TableMode, model_changed: bool) {
        if mode == TableMode::Resync && !model_changed && out.ops > 0 && self.first_apply_done {
            self.summary.drift_repairs += 1;
            if let Some(ops) = &self.ops {
                ops.metrics.record_drift_repairs("nftables", out.ops as u64);
            }
            tracing::warn!(
                ops = out.ops,
                "nf_tables drifted from the desired state (changed from outside); repaired"
            );
        } else if out.repaired > 0 && self.first_apply_done {
            // Another process wrote under an update's batch: the read-back that
            // followed put its change right along with the update.
            self.summary.drift_repairs += 1;
            if let Some(ops) = &self.ops {
                ops.metrics
                    .record_drift_repairs("nftables", out.repaired as u64);
            }
            tracing::warn!(
                ops = out.repaired,
                update_ops = out.ops - out.repaired,
                "nf_tables changed from outside under an update; repaired with it"
            );
        }
        if mode == TableMode::Rebuild {
            if let Some(ops) = &self.ops {
                ops.metrics.record_table_rebuild();
            }
            tracing::warn!("tables rebuilt atomically after repeated failures");
        }
        if let Some(ops) = &self.ops {
            ops.metrics.record_nft_call(true);
        }
    }

    /// Takes a refused commit to the input at fault: quarantines it, or narrows the suspects.
    /// True when the tables are to be committed again at once.
    fn isolate_refusal(&mut self, e: &KernelError) -> bool {
        let refusal = match e {
            KernelError::Nft(n) if n.is_refusal() => Some(n.target().cloned()),
            _ => None,
        };
        if let Some(target) = refusal {
            let reason = chain(e);
            match self.dp.isolate(target.as_ref(), &reason) {
                super::quarantine::Isolation::Quarantined(keys) => {
                    self.quarantine_changed(true);
                    tracing::warn!(
                        inputs = keys.len(),
                        "committing again without the quarantined inputs"
                    );
                    return true;
                }
                super::quarantine::Isolation::Bisecting { .. } => return true,
                super::quarantine::Isolation::NotAboutAnInput => {}
            }
        }
        false
    }

    /// The quarantine changed (`grew`) or may have: the metrics follow.
    /// The table phase's metrics: batches, read-backs, IP set transactions, object counts.
    fn record_tables(&self, out: &super::kernel::TablesOutcome, ok: bool) {
        let Some(ops) = &self.ops else {
            return;
        };
        let m = &ops.metrics;
        for &(bytes, messages) in &out.stats.batches {
            m.record_batch(bytes, messages);
        }
        for _ in 0..out.stats.read_backs {
            m.record_nft_list(ok);
        }
        let touches_sets = out.plans.iter().any(|p| {
            p.ops.iter().any(|o| {
                matches!(
                    o,
                    nf_tables::diff::Op::AddElements { .. }
                        | nf_tables::diff::Op::DelElements { .. }
                )
            })
        });
        if touches_sets {
            m.record_nft_set_call(ok);
        }
        for t in &out.objects {
            m.set_nft_objects(
                t.ip_version,
                &t.table,
                crate::ops::metrics::NftObjectCounts {
                    chains: t.chains,
                    rules: t.rules,
                    sets: t.sets,
                    maps: t.maps,
                },
            );
        }
    }

    fn quarantine_changed(&mut self, grew: bool) {
        if let Some(ops) = &self.ops {
            if grew {
                ops.metrics.record_quarantine();
            }
            ops.metrics
                .set_quarantined(self.dp.quarantined().len() as u64);
        }
    }

    /// Queues a message for Felix; never waits (the outbox coalesces statuses while Felix is
    /// slow to read).
    fn send(&mut self, mut m: FromDataplane) {
        if let Some(out) = &self.out {
            m.sequence_number = 0;
            out.push(m);
        }
    }

    fn heartbeat(&mut self) {
        let m = FromDataplane {
            sequence_number: 0,
            payload: Some(Out::ProcessStatusUpdate(ProcessStatusUpdate {
                iso_timestamp: rfc3339_utc(SystemTime::now()),
                uptime: self.started.elapsed().as_secs_f64(),
            })),
        };
        self.send(m);
    }

    /// Waits for the background conntrack cleanup and logs what failed.
    async fn settle_conntrack(&mut self) {
        for (ip, e) in self.kernel.conntrack_settle().await {
            tracing::warn!(%ip, error = %e, "conntrack cleanup failed");
        }
    }

    /// Runs until the input ends (with `exit_on_eof`, or from Felix), `shutdown` completes, or
    /// the tables cannot be programmed any more. A conntrack cleanup still running is finished
    /// first.
    pub async fn run(
        &mut self,
        updates: mpsc::Receiver<Received>,
        ifaces: mpsc::Receiver<IfaceEvent>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), DriverError> {
        let r = self.run_loop(updates, ifaces, shutdown).await;
        self.settle_conntrack().await;
        r
    }

    async fn run_loop(
        &mut self,
        mut updates: mpsc::Receiver<Received>,
        mut ifaces: mpsc::Receiver<IfaceEvent>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), DriverError> {
        tokio::pin!(shutdown);
        let mut throttle = Throttle::new(self.opts.throttle_burst, self.opts.throttle_period);
        let mut at = Deadlines::new(self.dp.cfg(), self.opts.first_heartbeat);
        let mut updates_open = true;
        let mut ifaces_open = true;
        let tables_watch = self.kernel.tables_watch().and_then(|fd| {
            // SAFETY: an `OwnedFd` is open and stays the same descriptor until it is dropped
            // with the `AsyncFd`.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()
        });
        loop {
            // Apply when allowed.
            let now = TokioInstant::now();
            let due = self.retry_at.is_none_or(|t| t <= now);
            if self.wants_apply() && due && at.throttled_until.is_none_or(|t| t <= now) {
                match throttle.take() {
                    Ok(()) => {
                        at.throttled_until = None;
                        // The first apply lets traffic through: the names must be whole by then,
                        // or the first connections are named from a model still arriving.
                        if !self.first_apply_done {
                            self.names_at = None;
                        }
                        self.publish_flow_names();
                        self.apply().await?;
                        at.merge = (self.dp.side_pending())
                            .then(|| TokioInstant::now() + self.dp.cfg().side_merge_after);
                    }
                    Err(wait) => at.throttled_until = Some(TokioInstant::now() + wait),
                }
            }
            self.publish_flow_names();
            if !updates_open && self.opts.exit_on_eof && self.input_done() {
                return Ok(());
            }
            let wake = self.next_wake(&at);
            tokio::select! {
                biased;
                _ = &mut shutdown => {
                    tracing::info!("shutting down; the kernel state stays in place");
                    return Ok(());
                }
                r = updates.recv(), if updates_open => match r {
                    Some(r) => self.on_updates(r, &mut updates),
                    None => {
                        updates_open = false;
                        self.on_end_of_input();
                    }
                },
                ev = ifaces.recv(), if ifaces_open => match ev {
                    Some(ev) => {
                        self.on_iface(ev);
                        while let Ok(ev) = ifaces.try_recv() {
                            self.on_iface(ev);
                        }
                    }
                    None => {
                        ifaces_open = false;
                        tracing::error!("interface monitor stopped");
                    }
                },
                () = readable(tables_watch.as_ref()) => self.on_tables_event(&mut at).await,
                _ = sleep_until(wake) => self.on_deadlines(&mut at),
            }
        }
    }

    /// The earliest deadline: a refresh, a heartbeat, a retry or throttle that holds back a
    /// wanted apply, the end of a route's grace period, or the side table's merge.
    fn next_wake(&self, at: &Deadlines) -> TokioInstant {
        [
            Some(at.nft_refresh),
            Some(at.route_refresh),
            Some(at.heartbeat),
            Some(at.health),
            self.retry_at.filter(|_| self.wants_apply()),
            self.grace_at,
            at.merge,
            at.repair,
            at.throttled_until.filter(|_| self.wants_apply()),
            self.names_at
                .filter(|_| self.names_dirty && self.flow_names.is_some()),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_else(|| TokioInstant::now() + FAR)
    }

    /// The nf_tables event socket has events: if another program's commit touched our tables,
    /// repair them (a resync reads them back and puts back what differs), at once or, while it
    /// keeps happening, after a growing delay.
    async fn on_tables_event(&mut self, at: &mut Deadlines) {
        if !self.kernel.tables_touched().await {
            return;
        }
        let now = TokioInstant::now();
        let r = self.repair.on_touch(now);
        if let Some(ops) = &self.ops {
            ops.metrics.record_table_touch();
            ops.metrics.set_repair_backoff(r.delay);
        }
        if r.delay.is_zero() {
            tracing::info!("another program changed our nf_tables tables: repairing now");
            self.resync_tables = true;
            at.repair = None;
        } else {
            // Every doubling is said once: a fight is visible in the log without flooding it.
            if r.streak == super::repair::FREE_REPAIRS + 1
                || r.streak.is_power_of_two()
                || r.delay >= super::repair::MAX_BACKOFF
            {
                tracing::warn!(
                    changes_in_a_row = r.streak,
                    repair_in_ms = r.delay.as_millis() as u64,
                    "another program keeps changing our nf_tables tables: backing off the repair"
                );
            }
            let due = now + r.delay;
            at.repair = Some(at.repair.map_or(due, |d| d.min(due)));
        }
    }

    /// `first`, and what else is already waiting in the channel (up to the batch size).
    fn on_updates(&mut self, first: Received, updates: &mut mpsc::Receiver<Received>) {
        self.on_received(first);
        for _ in 0..self.opts.batch {
            match updates.try_recv() {
                Ok(r) => self.on_received(r),
                Err(_) => break,
            }
        }
        if let Some(ops) = &self.ops {
            ops.metrics.record_msg_batch(1);
        }
    }

    fn on_end_of_input(&mut self) {
        self.input_ended = true;
        tracing::info!(
            decoded = self.summary.decoded,
            rejected = self.summary.rejected,
            "end of input"
        );
        if !self.opts.exit_on_eof {
            tracing::info!("input ended; staying up to keep the dataplane in sync");
        }
    }

    /// Does what each passed deadline calls for, and sets the periodic ones again.
    fn on_deadlines(&mut self, at: &mut Deadlines) {
        let t = TokioInstant::now();
        if t >= at.nft_refresh {
            at.nft_refresh = t + every(self.dp.cfg().nft_refresh);
            self.resync_tables = true;
        }
        if at.repair.is_some_and(|r| t >= r) {
            at.repair = None;
            self.resync_tables = true;
        }
        if at.merge.is_some_and(|m| t >= m) {
            at.merge = None;
            self.dp.request_side_merge();
        }
        if self.grace_at.is_some_and(|g| t >= g) {
            self.grace_at = None;
            self.dp.recheck_routes();
        }
        if t >= at.route_refresh {
            at.route_refresh = t + every(self.dp.cfg().route_refresh);
            self.resync_routes = true;
        }
        if t >= at.heartbeat {
            at.heartbeat = t + every(self.dp.cfg().reporting_interval);
            if !self.dp.cfg().reporting_interval.is_zero() {
                self.heartbeat();
            }
        }
        if t >= at.health {
            at.health = t + HEALTH_PERIOD;
            if let Some(h) = &mut self.health {
                h.heartbeat();
            }
            self.say_what_the_first_apply_waits_for();
        }
    }

    /// Once, when nothing has been programmed a while after the start: what the first apply
    /// still waits for (Felix's `InSync`, the interface monitor's first listing, the retry of a
    /// failed apply), so that a node that stays unprogrammed says why.
    fn say_what_the_first_apply_waits_for(&mut self) {
        if self.first_apply_done || self.wait_said || self.started.elapsed() < HEALTH_PERIOD {
            return;
        }
        self.wait_said = true;
        let waits: Vec<&str> = [
            (!self.dp.datastore_in_sync(), "Felix's InSync"),
            (
                !self.dp.ifaces_in_sync(),
                "the interface monitor's first listing",
            ),
            (self.last_failed, "the retry of a failed apply"),
        ]
        .into_iter()
        .filter_map(|(w, what)| w.then_some(what))
        .collect();
        tracing::info!(
            secs = self.started.elapsed().as_secs(),
            waiting_for = ?waits,
            "nothing programmed yet"
        );
    }
}

/// Resolves when `fd` has something to read (never without one). Readiness is cleared first, so
/// events that arrive while the caller drains the socket wake the loop again.
async fn readable(fd: Option<&AsyncFd<std::os::fd::OwnedFd>>) {
    match fd {
        Some(fd) => match fd.readable().await {
            Ok(mut guard) => guard.clear_ready(),
            Err(e) => {
                tracing::warn!(error = %e, "waiting on the nf_tables event socket");
                std::future::pending::<()>().await
            }
        },
        None => std::future::pending().await,
    }
}

/// `2026-12-02T14:24:09Z` (RFC 3339, UTC), as Felix's heartbeat carries.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}
