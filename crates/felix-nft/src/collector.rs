//! The flow-log collector of the running agent: reads NFLOG groups 1 and 2 and conntrack's
//! destroy events in the agent's namespace, joins them into flows
//! ([`crate::flows::aggregate`]) and publishes each flush interval's records to the local view.
//!
//! Each socket has a reader thread of its own that only decodes and hands on through a bounded
//! queue, so a burst is absorbed by the queue and, past it, dropped and counted rather than
//! left to overflow the kernel's socket buffer unseen. One more thread aggregates. None of them
//! shares a lock with the apply loop: the loop hands over endpoint names by swapping an `Arc`,
//! and the loop never waits for the collector nor the collector for the loop.
//!
//! With metrics, the aggregating thread also records each flush's records per policy rule and,
//! about once a second, the counts below (`ops::metrics::FlowLogMetrics`): atomics only, so a
//! scrape never holds it up.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::flows::aggregate::{Aggregator, Limits, Stats};
use crate::flows::names::FlowNames;
use crate::flows::record::{FlowRecord, PolicyKind, Reporter, Verdict};
use crate::flows::serve::FlowSink;
use crate::goldmane::export::GoldmaneSink;
use crate::ops::metrics::{FlowLogCounts, Metrics, RuleAction, RuleDirection, RuleId, RuleTraffic};
use felix_nft_rules::nflog::{GROUP_EGRESS, GROUP_INGRESS, SNAPLEN};
use rtnl::conntrack::Conntrack;
use rtnl::ctevents::{CtEvent, CtEventSocket, CtGroups};
use rtnl::devconf::ProcSys;
use rtnl::netns::NetNs;
use rtnl::nflog::{LoggedPacket, NflogSocket, Received};
use rtnl::RtnlError;

/// How the collector runs.
#[derive(Clone)]
pub struct CollectorConfig {
    /// How often the flows are flushed (`FlowLogsFlushInterval`).
    pub flush_interval: Duration,
    /// Batches the readers may have queued for the aggregator before they drop (each at most
    /// [`MAX_BATCH`] socket reads).
    pub queue: usize,
    /// Each socket's receive buffer.
    pub rcvbuf: usize,
    /// Where the flows and the collector's counts are recorded, if anywhere.
    pub metrics: Option<Metrics>,
    /// The node's name, as the metrics' `instance` label.
    pub instance: String,
    /// Where each flush's records are also streamed: Goldmane, when `FlowLogsGoldmaneServer`
    /// is set. Its publish only queues (bounded), so a slow or absent Goldmane costs the
    /// collector nothing.
    pub goldmane: Option<GoldmaneSink>,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        CollectorConfig {
            flush_interval: Duration::from_secs(15),
            queue: 64,
            rcvbuf: 4 << 20,
            metrics: None,
            instance: String::new(),
            goldmane: None,
        }
    }
}

/// What the collector has counted since it started.
#[derive(Debug, Default)]
pub struct CollectorStats {
    /// Logged packets read.
    pub nflog_packets: AtomicU64,
    /// Conntrack events read.
    pub ct_events: AtomicU64,
    /// Times the kernel said a socket's buffer overflowed (messages lost before we read them).
    pub kernel_overruns: AtomicU64,
    /// Reader batches (up to [`MAX_BATCH`] socket reads each) dropped because the aggregator's
    /// queue was full.
    pub queue_drops: AtomicU64,
    /// Flow records published.
    pub records: AtomicU64,
}

/// What the readers hand the aggregator.
enum Input {
    Packets(Vec<LoggedPacket>),
    Events(Vec<CtEvent>),
}

/// How long a blocked read waits before the reader looks at the stop flag.
const READ_TIMEOUT: Duration = Duration::from_millis(200);
/// Socket reads in one batch at most: after a wait, a reader reads what has queued up without
/// waiting, up to this many datagrams, and hands it over as one batch.
pub const MAX_BATCH: usize = 256;
/// How long a reader that has emptied its socket lets messages queue up before it reads again.
/// A conntrack event is a datagram of its own: read as they come, each would wake the reader
/// and then the aggregator, and the wake-ups, not the decoding, were most of the collector's
/// cost. The socket's buffer holds far more than this long's messages at any rate measured.
const COALESCE: Duration = Duration::from_millis(5);
/// How long the aggregator holds logged packets before it reads them, so that the conntrack
/// events read meanwhile go first. A connection whose addresses and ports a new one reuses is
/// destroyed by the new one's first packet, before that packet is logged; applied after the
/// new hit, the destroy would make the new connection read as a retransmit of the old and end
/// it. The two readers coalesce separately, so the events can trail by a few [`COALESCE`]s.
const HOLD_PACKETS: Duration = Duration::from_millis(20);
/// How often the counters of open connections are read from a dump of the conntrack table
/// (as often as Felix polls it): conntrack's update events carry no counters.
const POLL_EVERY: Duration = Duration::from_secs(5);
/// At most one warning about lost messages per this long.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// How often the counts are handed to the metrics between flushes.
const METRICS_EVERY: Duration = Duration::from_secs(1);
/// A policy rule's metric series that no flush has fed for this long (or two flush intervals,
/// if longer) is removed: the rules of deleted policies must not stay forever.
const RULE_SERIES_RETAIN: Duration = Duration::from_secs(3600);

/// The running collector; stops its threads when dropped.
pub struct Collector {
    names: Arc<Mutex<Arc<FlowNames>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Collector {
    /// Opens the sockets in `ns` and starts the threads; `sink` receives every flush's records.
    /// Fails when a socket cannot be had (another program holds group 1 or 2, or no
    /// privilege): the agent then runs without flow logs and says so.
    pub fn start(
        ns: Option<&NetNs>,
        cfg: CollectorConfig,
        sink: FlowSink,
    ) -> Result<Collector, RtnlError> {
        let mut nflog = NflogSocket::open(ns, &[GROUP_INGRESS, GROUP_EGRESS], SNAPLEN, cfg.rcvbuf)?;
        if !nflog.with_conntrack() {
            tracing::info!(
                "flow logs: this kernel's NFLOG carries no connection (no NETFILTER_NETLINK_GLUE_CT): \
                 packets are matched to connections by their addresses and ports"
            );
        }
        // Destroys only: the kernel puts counters in a destroy event alone (the open connections'
        // come from the poll), and a subscribed group makes it build a message in the packet
        // path for every change of a connection's state, about five per TCP connection.
        let groups = CtGroups {
            new: false,
            update: false,
            destroy: true,
        };
        let mut ct = CtEventSocket::open(ns, groups, cfg.rcvbuf)?;
        let mut table = Conntrack::open(ns)?;
        nflog.set_read_timeout(Some(READ_TIMEOUT))?;
        ct.set_read_timeout(Some(READ_TIMEOUT))?;
        enable_conntrack_accounting(ns);

        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(CollectorStats::default());
        let names = Arc::new(Mutex::new(Arc::new(FlowNames::default())));
        let (tx, rx) = mpsc::sync_channel::<Input>(cfg.queue);
        // Built first, so that a thread that cannot be started stops the ones that were.
        let mut c = Collector {
            names: names.clone(),
            stop: stop.clone(),
            threads: Vec::new(),
        };
        c.threads.push(spawn("flows-nflog", {
            let (tx, stop, stats) = (tx.clone(), stop.clone(), stats.clone());
            move || read_loop(&stop, &stats, &tx, &mut nflog)
        })?);
        c.threads.push(spawn("flows-conntrack", {
            let (stop, stats) = (stop.clone(), stats.clone());
            move || read_loop(&stop, &stats, &tx, &mut ct)
        })?);
        c.threads.push(spawn("flows", {
            let (stop, stats, names) = (stop.clone(), stats.clone(), names.clone());
            move || aggregate_loop(&stop, &stats, &names, &rx, &cfg, &sink, &mut table)
        })?);
        Ok(c)
    }

    /// Hands the collector the names of the model as it is now. Never waits for more than the
    /// swap of a pointer.
    pub fn set_names(&self, names: FlowNames) {
        if let Ok(mut n) = self.names.lock() {
            *n = Arc::new(names);
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, RtnlError> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .map_err(|e| RtnlError::Nfnetlink {
            op: "starting",
            object: format!("the {name} thread"),
            source: e,
        })
}

/// A reader's socket.
trait Source {
    type Item;
    /// What it reads, for the log.
    const WHAT: &'static str;
    /// Appends the next datagram's messages to `out`; with nothing queued, waits up to the read
    /// timeout, or, set non-blocking, returns at once.
    fn recv(&mut self, out: &mut Vec<Self::Item>) -> Result<Received, RtnlError>;
    fn set_nonblocking(&self, on: bool) -> Result<(), RtnlError>;
    /// Where its count of messages read is kept.
    fn count(stats: &CollectorStats) -> &AtomicU64;
    fn input(items: Vec<Self::Item>) -> Input;
}

impl Source for NflogSocket {
    type Item = LoggedPacket;
    const WHAT: &'static str = "NFLOG";
    fn recv(&mut self, out: &mut Vec<LoggedPacket>) -> Result<Received, RtnlError> {
        NflogSocket::recv(self, out)
    }
    fn set_nonblocking(&self, on: bool) -> Result<(), RtnlError> {
        NflogSocket::set_nonblocking(self, on)
    }
    fn count(stats: &CollectorStats) -> &AtomicU64 {
        &stats.nflog_packets
    }
    fn input(items: Vec<LoggedPacket>) -> Input {
        Input::Packets(items)
    }
}

impl Source for CtEventSocket {
    type Item = CtEvent;
    const WHAT: &'static str = "conntrack event";
    fn recv(&mut self, out: &mut Vec<CtEvent>) -> Result<Received, RtnlError> {
        CtEventSocket::recv(self, out)
    }
    fn set_nonblocking(&self, on: bool) -> Result<(), RtnlError> {
        CtEventSocket::set_nonblocking(self, on)
    }
    fn count(stats: &CollectorStats) -> &AtomicU64 {
        &stats.ct_events
    }
    fn input(items: Vec<CtEvent>) -> Input {
        Input::Events(items)
    }
}

/// A reader thread: waits for a datagram, reads what else has queued without waiting (up to
/// [`MAX_BATCH`] datagrams), hands the batch over, and, when the socket was emptied, lets the
/// next messages queue up for [`COALESCE`]. It never blocks on the aggregator: when the queue
/// is full the batch is dropped and counted. Ends on a read error (said at warn) or at stop.
fn read_loop<S: Source>(
    stop: &AtomicBool,
    stats: &CollectorStats,
    tx: &SyncSender<Input>,
    src: &mut S,
) {
    let what = S::WHAT;
    let mut warned: Option<Instant> = None;
    let mut lost = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut items = Vec::new();
        let read = src.recv(&mut items).and_then(|first| {
            let mut overruns = u64::from(matches!(first, Received::Overrun));
            let mut emptied = true;
            if !items.is_empty() {
                src.set_nonblocking(true)?;
                let drained = drain(src, &mut items, &mut overruns);
                src.set_nonblocking(false)?;
                emptied = drained?;
            }
            Ok((overruns, emptied))
        });
        let (overruns, emptied) = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %crate::ops::logging::chain(&e), "flow logs: reading {what}s failed; the reader stops");
                return;
            }
        };
        if overruns > 0 {
            stats.kernel_overruns.fetch_add(overruns, Ordering::Relaxed);
            lost += overruns;
        }
        if !items.is_empty() {
            S::count(stats).fetch_add(items.len() as u64, Ordering::Relaxed);
            match tx.try_send(S::input(items)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                    lost += 1;
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
            if emptied {
                std::thread::sleep(COALESCE);
            }
        }
        if lost > 0 && warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            tracing::warn!(
                batches_lost = lost,
                "flow logs: {what}s are coming faster than they are read; some were dropped (counted)"
            );
            warned = Some(Instant::now());
            lost = 0;
        }
    }
}

/// Reads, without waiting, up to [`MAX_BATCH`] datagrams in all; true when the socket had no
/// more.
fn drain<S: Source>(
    src: &mut S,
    items: &mut Vec<S::Item>,
    overruns: &mut u64,
) -> Result<bool, RtnlError> {
    for _ in 1..MAX_BATCH {
        match src.recv(items)? {
            Received::Packets(0) => return Ok(true),
            Received::Packets(_) => {}
            Received::Overrun => *overruns += 1,
        }
    }
    Ok(false)
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Feeds the aggregator until stopped and publishes its records every flush interval.
fn aggregate_loop(
    stop: &AtomicBool,
    stats: &CollectorStats,
    names: &Mutex<Arc<FlowNames>>,
    rx: &mpsc::Receiver<Input>,
    cfg: &CollectorConfig,
    sink: &FlowSink,
    table: &mut Conntrack,
) {
    let mut agg = Aggregator::new(Limits::default());
    let mut next_flush = Instant::now() + cfg.flush_interval;
    let poll_every = cfg.flush_interval.min(POLL_EVERY);
    let mut next_poll = Instant::now() + poll_every;
    let mut metrics = cfg.metrics.as_ref().map(|m| {
        m.flow_logs(
            &cfg.instance,
            RULE_SERIES_RETAIN.max(cfg.flush_interval.saturating_mul(2)),
        )
    });
    let mut next_metrics = Instant::now();
    // Batches of logged packets by when they came, each read once HOLD_PACKETS old (at most
    // `cfg.queue` held: past that, the oldest is read at once).
    let mut held: VecDeque<(Instant, Vec<LoggedPacket>)> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let due = held.front().map(|(at, _)| *at + HOLD_PACKETS);
        let wait = next_flush
            .min(next_poll)
            .min(due.unwrap_or(next_poll))
            .saturating_duration_since(Instant::now())
            .min(READ_TIMEOUT);
        match rx.recv_timeout(wait) {
            Ok(Input::Packets(ps)) => held.push_back((Instant::now(), ps)),
            Ok(Input::Events(evs)) => {
                let now = unix_now();
                for ev in &evs {
                    agg.on_ct(now, ev);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let mut current = None;
        while held
            .front()
            .is_some_and(|(at, _)| at.elapsed() >= HOLD_PACKETS || held.len() > cfg.queue)
        {
            let Some((_, ps)) = held.pop_front() else {
                break;
            };
            let names: &Arc<FlowNames> =
                current.get_or_insert_with(|| names.lock().map(|n| n.clone()).unwrap_or_default());
            let now = unix_now();
            for p in &ps {
                agg.on_packet(now, p, names.as_ref());
            }
        }
        if Instant::now() >= next_poll {
            next_poll = Instant::now() + poll_every;
            if agg.connections() > 0 {
                let now = unix_now();
                if let Err(e) = table.dump(|entry| agg.on_ct_polled(now, &entry)) {
                    tracing::debug!(error = %crate::ops::logging::chain(&e), "flow logs: polling conntrack's counters");
                }
            }
        }
        let flush = Instant::now() >= next_flush;
        if flush {
            next_flush += cfg.flush_interval;
            let now = unix_now();
            let records = agg.flush(now);
            stats
                .records
                .fetch_add(records.len() as u64, Ordering::Relaxed);
            // Before publishing: whoever sees a record can already scrape what it counted.
            if let Some(m) = metrics.as_mut() {
                m.record_flush(now, &rule_traffic(&records));
            }
            if !records.is_empty() {
                if let Some(g) = &cfg.goldmane {
                    g.publish(&records);
                }
                sink.publish(records);
            }
        }
        if let Some(m) = metrics.as_mut() {
            if flush || Instant::now() >= next_metrics {
                next_metrics = Instant::now() + METRICS_EVERY;
                m.record_counts(&counts(stats, &agg.stats(), sink.lost()));
            }
        }
    }
}

/// The collector's counts as the metrics take them.
fn counts(stats: &CollectorStats, agg: &Stats, local_lost: u64) -> FlowLogCounts {
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    FlowLogCounts {
        nflog_packets: load(&stats.nflog_packets),
        conntrack_events: load(&stats.ct_events),
        kernel_overruns: load(&stats.kernel_overruns),
        queue_drops: load(&stats.queue_drops),
        records: load(&stats.records),
        local_lost,
        foreign_prefixes: agg.foreign_prefixes,
        unreadable_packets: agg.unreadable_packets,
        pending_dropped: agg.pending_dropped,
        pending_expired: agg.pending_expired,
        flows_dropped: agg.flows_dropped,
        connections_evicted: agg.conns_evicted,
    }
}

/// Each hit of each record's trace with the record's counts, for the policy-rule metrics.
fn rule_traffic(records: &[FlowRecord]) -> Vec<RuleTraffic> {
    let mut out = Vec::new();
    for r in records {
        let direction = match r.key.reporter {
            Reporter::Dst => RuleDirection::Ingress,
            Reporter::Src => RuleDirection::Egress,
        };
        let last = r.key.trace.len().saturating_sub(1);
        for (i, hit) in r.key.trace.iter().enumerate() {
            out.push(RuleTraffic {
                rule: RuleId {
                    action: match hit.action {
                        Verdict::Allow => RuleAction::Allow,
                        Verdict::Deny => RuleAction::Deny,
                        Verdict::Pass => RuleAction::Pass,
                    },
                    tier: hit.tier.clone(),
                    namespace: hit.namespace.clone(),
                    name: hit.name.clone(),
                    kind: calico_kind(hit.kind, &hit.namespace).to_string(),
                    direction,
                    index: hit.rule_index,
                },
                deciding: i == last,
                packets_in: r.packets_in,
                packets_out: r.packets_out,
                bytes_in: r.bytes_in,
                bytes_out: r.bytes_out,
                connections: r.connections_started,
            });
        }
    }
    out
}

/// Calico's name of a policy kind (its v3 resource kinds), empty where Calico leaves it empty:
/// profiles, ends of tiers and no profile. A staged hit does not say which staged kind it was;
/// a namespaced one is named as a staged Calico policy.
fn calico_kind(kind: PolicyKind, namespace: &str) -> &'static str {
    match kind {
        PolicyKind::CalicoNetworkPolicy => "NetworkPolicy",
        PolicyKind::GlobalNetworkPolicy => "GlobalNetworkPolicy",
        PolicyKind::NetworkPolicy => "KubernetesNetworkPolicy",
        PolicyKind::Staged if namespace.is_empty() => "StagedGlobalNetworkPolicy",
        PolicyKind::Staged => "StagedNetworkPolicy",
        PolicyKind::Profile | PolicyKind::EndOfTier | PolicyKind::NoProfile => "",
    }
}

/// Conntrack counts packets and bytes per connection only with `nf_conntrack_acct` on, and
/// only for connections made after it is; flows without it carry no counts. Set in the
/// agent's namespace (it is per namespace); where conntrack is not loaded yet the file is
/// missing and the counts start once a later start finds it.
fn enable_conntrack_accounting(ns: Option<&NetNs>) {
    let r = ns
        .map(NetNs::try_clone)
        .transpose()
        .map_err(|e| e.to_string())
        .and_then(|ns| {
            ProcSys::new(ns)
                .write("net/netfilter/nf_conntrack_acct", "1")
                .map_err(|e| crate::ops::logging::chain(&e))
        });
    if let Err(e) = r {
        tracing::warn!(error = %e, "flow logs: conntrack accounting could not be turned on; flows will carry no packet or byte counts");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::record::{Endpoint, EndpointKind, FlowKey, PolicyHit};

    fn hit(kind: PolicyKind, name: &str, tier: &str, action: Verdict, rule: i64) -> PolicyHit {
        PolicyHit {
            kind,
            namespace: String::new(),
            name: name.into(),
            tier: tier.into(),
            action,
            policy_index: -1,
            rule_index: rule,
        }
    }

    #[test]
    fn each_hit_of_a_trace_counts_the_record_and_the_last_decides() {
        let end = |name: &str| Endpoint {
            kind: EndpointKind::Workload,
            name: name.into(),
            namespace: "demo".into(),
            node: None,
        };
        let record = FlowRecord {
            key: FlowKey {
                src: end("a"),
                dst: end("c"),
                proto: 6,
                dest_port: 8080,
                reporter: Reporter::Dst,
                action: Verdict::Deny,
                trace: vec![
                    hit(
                        PolicyKind::GlobalNetworkPolicy,
                        "pass-web",
                        "sec",
                        Verdict::Pass,
                        0,
                    ),
                    hit(PolicyKind::Profile, "deny-web", "", Verdict::Deny, 0),
                ],
            },
            start_time: 100,
            end_time: 101,
            packets_in: 3,
            packets_out: 0,
            bytes_in: 180,
            bytes_out: 0,
            connections_started: 1,
            connections_completed: 0,
            connections_live: 0,
        };
        let t = rule_traffic(&[record]);
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].rule.action, t[0].rule.kind.as_str(), t[0].deciding),
            (RuleAction::Pass, "GlobalNetworkPolicy", false)
        );
        assert_eq!(
            (t[1].rule.action, t[1].rule.kind.as_str(), t[1].deciding),
            (RuleAction::Deny, "", true)
        );
        for h in &t {
            assert_eq!(h.rule.direction, RuleDirection::Ingress);
            assert_eq!((h.packets_in, h.bytes_in), (3, 180));
        }
    }
}
