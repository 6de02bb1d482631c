//! Prometheus metrics (§11).
//!
//! Names are Felix's wherever Felix has the metric, with Felix's labels, so existing dashboards
//! work: the internal dataplane (`felix_int_dataplane_*`), the nftables table and set
//! reconcilers (`felix_nft_*`) and the route table (`felix_route_table_*`). Felix exports some
//! of these as summaries; the client we use has no summaries, so they are histograms here (the
//! `_sum` and `_count` series are the same). Metrics Felix does not have are ours and named
//! `felix_nft_agent_*`.
//!
//! Flow logs' metrics keep Calico Enterprise's names and labels where it has the metric:
//! `cnx_policy_rule_packets`, `cnx_policy_rule_bytes`, `cnx_policy_rule_connections` per policy
//! rule, and `calico_denied_packets`, `calico_denied_bytes` per denying rule — the last without
//! Calico's `srcIP` label, so that their series are bounded by the rules, not by the addresses
//! that send. The collector's own counts are ours, `felix_nft_agent_flowlog_*`.
//!
//! Recording is cheap (atomics) and never blocks the scrape; the registry is per [`Metrics`]
//! value, not global, so tests can make as many as they like.

use std::collections::HashMap;
use std::time::Duration;

use prometheus::{
    Encoder as _, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// What can go wrong building or encoding the registry.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("registering metric {name}")]
    Register {
        name: &'static str,
        #[source]
        source: prometheus::Error,
    },
    #[error("encoding metrics in the Prometheus text format")]
    Encode(#[source] prometheus::Error),
}

/// The content type of [`Metrics::encode`]'s output.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Object counts of one of our nf_tables tables, for the `felix_nft_*` gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NftObjectCounts {
    pub chains: u64,
    pub rules: u64,
    pub sets: u64,
    pub maps: u64,
}

/// The metrics registry and every metric the agent records. Cheap to clone (handles share
/// the same atomics).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    apply_time: Histogram,
    initial_resync_time: Gauge,
    failures: IntCounter,
    messages: IntCounterVec,
    msg_batch_size: Histogram,
    nft_calls: IntCounter,
    nft_errors: IntCounter,
    nft_list_calls: IntCounter,
    nft_list_errors: IntCounter,
    nft_chains: IntGaugeVec,
    nft_rules: IntGaugeVec,
    nft_sets: IntGaugeVec,
    nft_maps: IntGaugeVec,
    nft_set_calls: IntCounter,
    nft_set_errors: IntCounter,
    route_resync: Histogram,
    route_partial_resync: Histogram,
    drift_repairs: IntCounterVec,
    table_touches: IntCounter,
    repair_backoff: Gauge,
    kernel_features: IntGaugeVec,
    batch_bytes: Histogram,
    batch_messages: Histogram,
    table_rebuilds: IntCounter,
    quarantines: IntCounter,
    quarantined: IntGauge,
    last_apply: Gauge,
    flows: FlowFamilies,
    process: ProcessGauges,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Exponential buckets from `start`, `count` of them, each `factor` times the last.
fn exp_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    std::iter::successors(Some(start), |b| Some(b * factor))
        .take(count)
        .collect()
}

/// Registers as it builds, so a metric cannot be made and forgotten.
struct Builder {
    registry: Registry,
}

impl Builder {
    fn add<C: prometheus::core::Collector + Clone + 'static>(
        &self,
        name: &'static str,
        made: Result<C, prometheus::Error>,
    ) -> Result<C, MetricsError> {
        let c = made.map_err(|source| MetricsError::Register { name, source })?;
        self.registry
            .register(Box::new(c.clone()))
            .map_err(|source| MetricsError::Register { name, source })?;
        Ok(c)
    }

    fn counter(&self, name: &'static str, help: &str) -> Result<IntCounter, MetricsError> {
        self.add(name, IntCounter::new(name, help))
    }

    fn counter_vec(
        &self,
        name: &'static str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, MetricsError> {
        self.add(name, IntCounterVec::new(Opts::new(name, help), labels))
    }

    fn gauge(&self, name: &'static str, help: &str) -> Result<Gauge, MetricsError> {
        self.add(name, Gauge::new(name, help))
    }

    fn int_gauge(&self, name: &'static str, help: &str) -> Result<IntGauge, MetricsError> {
        self.add(name, IntGauge::new(name, help))
    }

    fn table_gauge(&self, name: &'static str, help: &str) -> Result<IntGaugeVec, MetricsError> {
        self.add(
            name,
            IntGaugeVec::new(Opts::new(name, help), &["ip_version", "table"]),
        )
    }

    fn histogram(
        &self,
        name: &'static str,
        help: &str,
        buckets: Vec<f64>,
    ) -> Result<Histogram, MetricsError> {
        self.add(
            name,
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)),
        )
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero. `process_metrics` adds the standard
    /// `process_*` gauges (Felix's `PrometheusProcessMetricsEnabled`).
    pub fn new(process_metrics: bool) -> Result<Self, MetricsError> {
        let b = Builder {
            registry: Registry::new(),
        };
        let seconds = exp_buckets(0.001, 2.5, 12); // 1 ms … ~24 s
        let m = Metrics {
            apply_time: b.histogram(
                "felix_int_dataplane_apply_time_seconds",
                "Time in seconds that it took to apply a dataplane update.",
                seconds.clone(),
            )?,
            initial_resync_time: b.gauge(
                "felix_int_dataplane_initial_resync_time_seconds",
                "Time in seconds that it took to do the initial resync with the dataplane and \
                 bring the dataplane into sync for the first time.",
            )?,
            failures: b.counter(
                "felix_int_dataplane_failures",
                "Number of times dataplane updates failed and will be retried.",
            )?,
            messages: b.counter_vec(
                "felix_int_dataplane_messages",
                "Number dataplane messages by type.",
                &["type"],
            )?,
            msg_batch_size: b.histogram(
                "felix_int_dataplane_msg_batch_size",
                "Number of messages processed in each batch. Higher values indicate we're \
                 doing more batching to try to keep up.",
                vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0],
            )?,
            nft_calls: b.counter("felix_nft_calls", "Number of nft calls.")?,
            nft_errors: b.counter("felix_nft_errors", "Number of nft errors.")?,
            nft_list_calls: b.counter("felix_nft_list_calls", "Number of nft list calls.")?,
            nft_list_errors: b.counter("felix_nft_list_errors", "Number of nft list errors.")?,
            nft_chains: b.table_gauge("felix_nft_chains", "Number of active nft chains.")?,
            nft_rules: b.table_gauge("felix_nft_rules", "Number of active nftables rules.")?,
            nft_sets: b.table_gauge("felix_nft_sets", "Number of active nftables sets.")?,
            nft_maps: b.table_gauge("felix_nft_maps", "Number of active nftables maps.")?,
            nft_set_calls: b.counter(
                "felix_nft_set_calls",
                "Number of nftables transactions that changed IP set members.",
            )?,
            nft_set_errors: b.counter(
                "felix_nft_set_errors",
                "Number of failed nftables set update transactions.",
            )?,
            route_resync: b.histogram(
                "felix_route_table_resync_seconds",
                "Time taken to list all the routes during a resync.",
                seconds.clone(),
            )?,
            route_partial_resync: b.histogram(
                "felix_route_table_partial_resync_seconds",
                "Time taken to sync the routes of the interfaces that changed.",
                seconds,
            )?,
            drift_repairs: b.counter_vec(
                "felix_nft_agent_drift_repairs_total",
                "Kernel objects a refresh found changed by someone else and put back, by kind.",
                &["object"],
            )?,
            table_touches: b.counter(
                "felix_nft_agent_table_touches_total",
                "Commits of other programs that changed our tables (each repaired from its event).",
            )?,
            repair_backoff: b.gauge(
                "felix_nft_agent_table_repair_backoff_seconds",
                "Delay before repairing our tables after another program's change: 0 normally, \
                 growing while another program keeps changing them.",
            )?,
            kernel_features: b.add(
                "felix_nft_agent_kernel_feature",
                IntGaugeVec::new(
                    Opts::new(
                        "felix_nft_agent_kernel_feature",
                        "What felix-nft decided about this kernel at start (1 = on), by feature, \
                         kernel release and how it was decided (probed, release, override).",
                    ),
                    &["feature", "kernel", "source"],
                ),
            )?,
            batch_bytes: b.histogram(
                "felix_nft_agent_batch_bytes",
                "Size in bytes of each nf_tables netlink batch sent to the kernel.",
                exp_buckets(256.0, 4.0, 10), // 256 B … 64 MiB
            )?,
            batch_messages: b.histogram(
                "felix_nft_agent_batch_messages",
                "Netlink messages in each nf_tables batch sent to the kernel.",
                exp_buckets(1.0, 4.0, 10), // 1 … 262144
            )?,
            table_rebuilds: b.counter(
                "felix_nft_agent_table_rebuilds_total",
                "Atomic rebuilds of our tables after repeated apply failures.",
            )?,
            quarantines: b.counter(
                "felix_nft_agent_quarantines_total",
                "Updates set aside because the kernel refused what they render to.",
            )?,
            quarantined: b.int_gauge(
                "felix_nft_agent_quarantined_updates",
                "Updates set aside now (their objects keep their last good version).",
            )?,
            last_apply: b.gauge(
                "felix_nft_agent_last_apply_success_timestamp_seconds",
                "Unix time of the last successful dataplane apply.",
            )?,
            flows: FlowFamilies::new(&b)?,
            process: if process_metrics {
                ProcessGauges::new(&b)?
            } else {
                ProcessGauges::default()
            },
            registry: b.registry,
        };
        Ok(m)
    }

    /// One dataplane apply finished (Felix's `felix_int_dataplane_apply_time_seconds` and
    /// `felix_int_dataplane_failures`).
    pub fn record_apply(&self, duration: Duration, ok: bool) {
        self.apply_time.observe(duration.as_secs_f64());
        if ok {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            self.last_apply.set(now.as_secs_f64());
        } else {
            self.failures.inc();
        }
    }

    /// Time from start to the first successful apply.
    pub fn record_initial_resync(&self, duration: Duration) {
        self.initial_resync_time.set(duration.as_secs_f64());
    }

    /// One message from Felix, by its message type name (`WorkloadEndpointUpdate`). The label
    /// is spelled as Felix spells it: the Go type, `*proto.WorkloadEndpointUpdate`.
    pub fn record_message(&self, type_name: &str) {
        self.messages
            .with_label_values(&[&format!("*proto.{type_name}")])
            .inc();
    }

    /// The loop handled a batch of `n` messages before applying.
    pub fn record_msg_batch(&self, n: usize) {
        self.msg_batch_size.observe(n as f64);
    }

    /// One nf_tables rule transaction was sent (`felix_nft_calls`, `felix_nft_errors`).
    pub fn record_nft_call(&self, ok: bool) {
        self.nft_calls.inc();
        if !ok {
            self.nft_errors.inc();
        }
    }

    /// One read-back of our tables (`felix_nft_list_calls`, `felix_nft_list_errors`).
    pub fn record_nft_list(&self, ok: bool) {
        self.nft_list_calls.inc();
        if !ok {
            self.nft_list_errors.inc();
        }
    }

    /// One transaction that changed IP set members (`felix_nft_set_calls`,
    /// `felix_nft_set_errors`).
    pub fn record_nft_set_call(&self, ok: bool) {
        self.nft_set_calls.inc();
        if !ok {
            self.nft_set_errors.inc();
        }
    }

    /// What one of our tables now holds. `ip_version` is 4 or 6, `table` the table name.
    pub fn set_nft_objects(&self, ip_version: u8, table: &str, counts: NftObjectCounts) {
        let v = ip_version.to_string();
        let labels = [v.as_str(), table];
        let set = |g: &IntGaugeVec, n: u64| {
            g.with_label_values(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX))
        };
        set(&self.nft_chains, counts.chains);
        set(&self.nft_rules, counts.rules);
        set(&self.nft_sets, counts.sets);
        set(&self.nft_maps, counts.maps);
    }

    /// A full route resync took `duration`.
    pub fn record_route_resync(&self, duration: Duration) {
        self.route_resync.observe(duration.as_secs_f64());
    }

    /// A sync of the routes of the interfaces that changed took `duration`.
    pub fn record_route_partial_resync(&self, duration: Duration) {
        self.route_partial_resync.observe(duration.as_secs_f64());
    }

    /// A refresh found `count` objects of kind `object` (`chain`, `set`, `table`, `route`,
    /// `neighbour`, …) changed from outside and repaired them.
    pub fn record_drift_repairs(&self, object: &str, count: u64) {
        self.drift_repairs
            .with_label_values(&[object])
            .inc_by(count);
    }

    /// Another program's commit changed our tables.
    pub fn record_table_touch(&self) {
        self.table_touches.inc();
    }

    /// The delay now applied before repairing another program's change.
    pub fn set_repair_backoff(&self, delay: Duration) {
        self.repair_backoff.set(delay.as_secs_f64());
    }

    /// One kernel feature decision (see `nft::features`).
    pub fn set_kernel_feature(&self, feature: &str, kernel: &str, source: &str, on: bool) {
        self.kernel_features
            .with_label_values(&[feature, kernel, source])
            .set(i64::from(on));
    }

    /// One nf_tables batch of `bytes` bytes and `messages` netlink messages was sent.
    pub fn record_batch(&self, bytes: usize, messages: usize) {
        self.batch_bytes.observe(bytes as f64);
        self.batch_messages.observe(messages as f64);
    }

    /// Our tables were rebuilt atomically after repeated failures.
    pub fn record_table_rebuild(&self) {
        self.table_rebuilds.inc();
    }

    /// An update was quarantined.
    pub fn record_quarantine(&self) {
        self.quarantines.inc();
    }

    /// How many updates are quarantined now.
    pub fn set_quarantined(&self, n: u64) {
        self.quarantined.set(n as i64);
    }

    /// The flow-log collector's recorder. `instance` is the node's name (Calico's `instance`
    /// label); a policy rule's series that no flush has fed for `retain` are removed, so rules
    /// of deleted policies do not stay forever.
    pub fn flow_logs(&self, instance: &str, retain: Duration) -> FlowLogMetrics {
        FlowLogMetrics {
            f: self.flows.clone(),
            instance: instance.to_string(),
            retain_secs: i64::try_from(retain.as_secs()).unwrap_or(i64::MAX),
            last: FlowLogCounts::default(),
            rules: HashMap::new(),
            denied: HashMap::new(),
        }
    }

    /// The registry, for callers that add their own collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything, in the Prometheus text exposition format ([`TEXT_CONTENT_TYPE`]).
    pub fn encode(&self) -> Result<String, MetricsError> {
        self.process.refresh();
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .map_err(MetricsError::Encode)?;
        // The encoder writes only UTF-8 names, label values and numbers.
        String::from_utf8(buf).map_err(|e| {
            MetricsError::Encode(prometheus::Error::Msg(format!("non-UTF-8 output: {e}")))
        })
    }
}

/// What a policy rule did, as Calico's labels spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleAction {
    Allow,
    Deny,
    Pass,
}

impl RuleAction {
    fn as_str(self) -> &'static str {
        match self {
            RuleAction::Allow => "allow",
            RuleAction::Deny => "deny",
            RuleAction::Pass => "pass",
        }
    }
}

/// Which of its endpoint's directions a rule is in: ingress rules are reported by a flow's
/// destination, egress rules by its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleDirection {
    Ingress,
    Egress,
}

impl RuleDirection {
    fn as_str(self) -> &'static str {
        match self {
            RuleDirection::Ingress => "ingress",
            RuleDirection::Egress => "egress",
        }
    }

    /// Calico's `traffic_direction` of a rule's connections: inbound for ingress rules.
    fn traffic(self) -> &'static str {
        match self {
            RuleDirection::Ingress => INBOUND,
            RuleDirection::Egress => OUTBOUND,
        }
    }
}

const INBOUND: &str = "inbound";
const OUTBOUND: &str = "outbound";

/// One policy rule, as Calico Enterprise's `cnx_policy_rule_*` metrics label it. Empty fields
/// are labelled as Calico labels them (`RuleID.TierString` and friends in Felix's
/// `calc/policy_lookup_cache.go`): no tier (a profile, no profile) as `__PROFILE__`, no
/// namespace as `__GLOBAL__`, no name (an end of tier, no profile) as `__NO_MATCH__`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RuleId {
    pub action: RuleAction,
    pub tier: String,
    pub namespace: String,
    /// The policy's or profile's name.
    pub name: String,
    /// Calico's kind of the policy (`GlobalNetworkPolicy`, `NetworkPolicy`,
    /// `KubernetesNetworkPolicy`, …); empty for a profile, an end of tier and no profile, as
    /// Calico leaves it.
    pub kind: String,
    pub direction: RuleDirection,
    /// The rule's index in its direction; -1 for an end of tier or no profile.
    pub index: i64,
}

impl RuleId {
    fn tier_label(&self) -> &str {
        if self.tier.is_empty() {
            "__PROFILE__"
        } else {
            &self.tier
        }
    }

    fn namespace_label(&self) -> &str {
        if self.namespace.is_empty() {
            "__GLOBAL__"
        } else {
            &self.namespace
        }
    }

    fn name_label(&self) -> &str {
        if self.name.is_empty() {
            "__NO_MATCH__"
        } else {
            &self.name
        }
    }

    /// The `policy` label of `calico_denied_*`: `TIER|NAME|INDEX|ACTION`, the name as
    /// `NAMESPACE/NAME` when namespaced (Calico Enterprise's `GetDeniedPacketRuleName`).
    fn denied_label(&self) -> String {
        let (tier, name, index, action) = (
            self.tier_label(),
            self.name_label(),
            self.index,
            self.action.as_str(),
        );
        if self.namespace.is_empty() {
            format!("{tier}|{name}|{index}|{action}")
        } else {
            format!("{tier}|{}/{name}|{index}|{action}", self.namespace)
        }
    }
}

/// What one flow record counted, attributed to one hit of its policy trace. `in`/`out` are
/// from the reporter's side, as in the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleTraffic {
    pub rule: RuleId,
    /// The trace's last hit: the rule that allowed or denied the flow.
    pub deciding: bool,
    pub packets_in: u64,
    pub packets_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Connections the flow started in the interval.
    pub connections: u64,
}

/// The flow-log collector's counts since it started, each a counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowLogCounts {
    /// Logged packets read from NFLOG.
    pub nflog_packets: u64,
    /// Conntrack events read.
    pub conntrack_events: u64,
    /// Times a socket's receive buffer overflowed in the kernel.
    pub kernel_overruns: u64,
    /// Batches the readers dropped because the aggregator's queue was full.
    pub queue_drops: u64,
    /// Flow records published.
    pub records: u64,
    /// Records dropped for local followers that did not read them in time.
    pub local_lost: u64,
    /// Logged packets whose prefix is not one we write (another program's, or unresolved).
    pub foreign_prefixes: u64,
    /// Logged packets whose headers could not be read.
    pub unreadable_packets: u64,
    /// Traces dropped because the table of unfinished ones was full or the trace too long.
    pub pending_dropped: u64,
    /// Unfinished traces discarded for waiting too long for their final hit.
    pub pending_expired: u64,
    /// Connections dropped because their flow key was new and the flow table full.
    pub flows_dropped: u64,
    /// Connections evicted from the full connection table to make room for a new one.
    pub connections_evicted: u64,
}

/// Calico Enterprise's labels of `cnx_policy_rule_packets` and `_bytes`, in its order.
const RULE_LABELS: [&str; 9] = [
    "action",
    "tier",
    "namespace",
    "policy",
    "kind",
    "rule_direction",
    "rule_index",
    "traffic_direction",
    "instance",
];

/// The flow-log metric families, registered with the rest.
#[derive(Clone)]
struct FlowFamilies {
    rule_packets: IntCounterVec,
    rule_bytes: IntCounterVec,
    rule_connections: IntCounterVec,
    denied_packets: IntCounterVec,
    denied_bytes: IntCounterVec,
    nflog_packets: IntCounter,
    conntrack_events: IntCounter,
    kernel_overruns: IntCounter,
    queue_drops: IntCounter,
    records: IntCounter,
    local_lost: IntCounter,
    foreign_prefixes: IntCounter,
    evictions: IntCounter,
    aggregator_drops: IntCounterVec,
    last_flush: Gauge,
}

impl FlowFamilies {
    fn new(b: &Builder) -> Result<Self, MetricsError> {
        Ok(FlowFamilies {
            rule_packets: b.counter_vec(
                "cnx_policy_rule_packets",
                "Total number of packets handled by Calico policy rules.",
                &RULE_LABELS,
            )?,
            rule_bytes: b.counter_vec(
                "cnx_policy_rule_bytes",
                "Total number of bytes handled by Calico policy rules.",
                &RULE_LABELS,
            )?,
            rule_connections: b.counter_vec(
                "cnx_policy_rule_connections",
                "Total number of connections handled by Calico policy rules.",
                &RULE_LABELS[1..],
            )?,
            denied_packets: b.counter_vec(
                "calico_denied_packets",
                "Total number of packets denied by calico policies.",
                &["policy", "instance"],
            )?,
            denied_bytes: b.counter_vec(
                "calico_denied_bytes",
                "Total number of bytes denied by calico policies.",
                &["policy", "instance"],
            )?,
            nflog_packets: b.counter(
                "felix_nft_agent_flowlog_nflog_packets_total",
                "Packets logged by policy rules (NFLOG groups 1 and 2) read by the flow-log collector.",
            )?,
            conntrack_events: b.counter(
                "felix_nft_agent_flowlog_conntrack_events_total",
                "Conntrack events read by the flow-log collector.",
            )?,
            kernel_overruns: b.counter(
                "felix_nft_agent_flowlog_kernel_overruns_total",
                "Times a flow-log socket's receive buffer overflowed: messages lost in the kernel \
                 before they were read.",
            )?,
            queue_drops: b.counter(
                "felix_nft_agent_flowlog_queue_drops_total",
                "Batches of logged packets or conntrack events dropped because the aggregator's \
                 queue was full.",
            )?,
            records: b.counter(
                "felix_nft_agent_flowlog_records_total",
                "Flow records published.",
            )?,
            local_lost: b.counter(
                "felix_nft_agent_flowlog_local_lost_total",
                "Flow records dropped for local followers (felix-nft flows --follow) that did not \
                 read them in time.",
            )?,
            foreign_prefixes: b.counter(
                "felix_nft_agent_flowlog_foreign_prefixes_total",
                "Logged packets whose prefix is not one felix-nft writes (another program's, \
                 damaged, or hashed and unknown).",
            )?,
            evictions: b.counter(
                "felix_nft_agent_flowlog_evictions_total",
                "Connections evicted from the aggregator's full connection table to make room.",
            )?,
            aggregator_drops: b.counter_vec(
                "felix_nft_agent_flowlog_aggregator_drops_total",
                "What the aggregator dropped, by reason: unreadable packets, traces that did not \
                 fit (pending_full) or waited too long for their final hit (pending_expired), \
                 connections of new flows when the flow table was full (flow_table_full).",
                &["reason"],
            )?,
            last_flush: b.gauge(
                "felix_nft_agent_flowlog_last_flush_timestamp_seconds",
                "Unix time of the flow-log collector's last flush.",
            )?,
        })
    }
}

/// What one flush counted for one rule.
#[derive(Debug, Default)]
struct RuleSums {
    packets_in: u64,
    packets_out: u64,
    bytes_in: u64,
    bytes_out: u64,
    connections: u64,
    /// Packets and bytes of the flows it denied, when it decided any.
    denied: Option<(u64, u64)>,
}

impl RuleSums {
    fn add(&mut self, t: &RuleTraffic) {
        let add = |sum: &mut u64, n: u64| *sum = sum.saturating_add(n);
        add(&mut self.packets_in, t.packets_in);
        add(&mut self.packets_out, t.packets_out);
        add(&mut self.bytes_in, t.bytes_in);
        add(&mut self.bytes_out, t.bytes_out);
        add(&mut self.connections, t.connections);
        if t.deciding && t.rule.action == RuleAction::Deny {
            // Calico counts the direction the rule looks at: what the destination received
            // for an ingress rule, what the source sent for an egress one.
            let (packets, bytes) = match t.rule.direction {
                RuleDirection::Ingress => (t.packets_in, t.bytes_in),
                RuleDirection::Egress => (t.packets_out, t.bytes_out),
            };
            let (p, b) = self.denied.get_or_insert((0, 0));
            add(p, packets);
            add(b, bytes);
        }
    }
}

/// The flow-log collector's recorder, from [`Metrics::flow_logs`]. One thread records through
/// it (the collector's aggregator), so it keeps, without a lock, the last counts it saw (its
/// inputs are cumulative; counters take increments) and when each policy rule's series was last
/// fed. A call adds to atomics; it waits on a scrape only where it makes or removes a series,
/// for as long as the scrape takes to copy that family.
pub struct FlowLogMetrics {
    f: FlowFamilies,
    instance: String,
    retain_secs: i64,
    last: FlowLogCounts,
    /// Each rule's series, and when a flush last fed them (Unix seconds).
    rules: HashMap<RuleId, i64>,
    /// Each `calico_denied_*` policy label, and when a flush last fed it.
    denied: HashMap<String, i64>,
}

impl std::fmt::Debug for FlowLogMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowLogMetrics")
            .field("instance", &self.instance)
            .field("rules", &self.rules.len())
            .finish_non_exhaustive()
    }
}

impl FlowLogMetrics {
    /// One flush at `now` (Unix seconds): every hit of every record's trace counts the
    /// record's packets and bytes against its rule, as Calico Enterprise counts each rule of a
    /// flow's trace; the deciding hit of a denied flow also counts in `calico_denied_*`. Then
    /// the series no flush has fed for the retention time are removed.
    pub fn record_flush(&mut self, now: i64, traffic: &[RuleTraffic]) {
        // Summed per rule first: one update of each series per flush, however many flows.
        let mut per_rule: HashMap<&RuleId, RuleSums> = HashMap::new();
        for t in traffic {
            per_rule.entry(&t.rule).or_default().add(t);
        }
        for (rule, sums) in per_rule {
            self.record_rule(now, rule, &sums);
        }
        self.f.last_flush.set(now as f64);
        self.expire(now);
    }

    fn record_rule(&mut self, now: i64, r: &RuleId, s: &RuleSums) {
        let index = r.index.to_string();
        let labels = |traffic: &'static str| {
            [
                r.action.as_str(),
                r.tier_label(),
                r.namespace_label(),
                r.name_label(),
                r.kind.as_str(),
                r.direction.as_str(),
                index.as_str(),
                traffic,
                self.instance.as_str(),
            ]
        };
        // Both directions' series exist once the rule is seen, as in Calico.
        for (traffic, packets, bytes) in [
            (INBOUND, s.packets_in, s.bytes_in),
            (OUTBOUND, s.packets_out, s.bytes_out),
        ] {
            let l = labels(traffic);
            self.f.rule_packets.with_label_values(&l).inc_by(packets);
            self.f.rule_bytes.with_label_values(&l).inc_by(bytes);
        }
        // Calico counts no connections for a pass (the connection is someone else's to decide)
        // and a denied packet makes none (it never gets a confirmed conntrack entry).
        if r.action == RuleAction::Allow {
            let l = labels(r.direction.traffic());
            self.f
                .rule_connections
                .with_label_values(&l[1..])
                .inc_by(s.connections);
        }
        self.rules.insert(r.clone(), now);
        if let Some((packets, bytes)) = s.denied {
            let policy = r.denied_label();
            let l = [policy.as_str(), self.instance.as_str()];
            self.f.denied_packets.with_label_values(&l).inc_by(packets);
            self.f.denied_bytes.with_label_values(&l).inc_by(bytes);
            self.denied.insert(policy, now);
        }
    }

    /// Removes the series of rules and denied policies no flush has fed since `now` minus
    /// the retention time.
    fn expire(&mut self, now: i64) {
        let horizon = now.saturating_sub(self.retain_secs);
        let instance = self.instance.clone();
        let f = &self.f;
        self.rules.retain(|r, seen| {
            if *seen >= horizon {
                return true;
            }
            let index = r.index.to_string();
            for traffic in [INBOUND, OUTBOUND] {
                let l = [
                    r.action.as_str(),
                    r.tier_label(),
                    r.namespace_label(),
                    r.name_label(),
                    r.kind.as_str(),
                    r.direction.as_str(),
                    index.as_str(),
                    traffic,
                    instance.as_str(),
                ];
                // A series that is not there (never made) is what removal wants anyway.
                let _ = f.rule_packets.remove_label_values(&l);
                let _ = f.rule_bytes.remove_label_values(&l);
                let _ = f.rule_connections.remove_label_values(&l[1..]);
            }
            false
        });
        self.denied.retain(|policy, seen| {
            if *seen >= horizon {
                return true;
            }
            let l = [policy.as_str(), instance.as_str()];
            let _ = f.denied_packets.remove_label_values(&l);
            let _ = f.denied_bytes.remove_label_values(&l);
            false
        });
    }

    /// The collector's cumulative counts as they are now; each counter goes up by what they
    /// grew since the last call.
    pub fn record_counts(&mut self, now: &FlowLogCounts) {
        let (f, last) = (&self.f, &self.last);
        let add = |c: &IntCounter, new: u64, old: u64| c.inc_by(new.saturating_sub(old));
        add(&f.nflog_packets, now.nflog_packets, last.nflog_packets);
        add(
            &f.conntrack_events,
            now.conntrack_events,
            last.conntrack_events,
        );
        add(
            &f.kernel_overruns,
            now.kernel_overruns,
            last.kernel_overruns,
        );
        add(&f.queue_drops, now.queue_drops, last.queue_drops);
        add(&f.records, now.records, last.records);
        add(&f.local_lost, now.local_lost, last.local_lost);
        add(
            &f.foreign_prefixes,
            now.foreign_prefixes,
            last.foreign_prefixes,
        );
        add(
            &f.evictions,
            now.connections_evicted,
            last.connections_evicted,
        );
        for (reason, new, old) in [
            (
                "unreadable",
                now.unreadable_packets,
                last.unreadable_packets,
            ),
            ("pending_full", now.pending_dropped, last.pending_dropped),
            ("pending_expired", now.pending_expired, last.pending_expired),
            ("flow_table_full", now.flows_dropped, last.flows_dropped),
        ] {
            add(&f.aggregator_drops.with_label_values(&[reason]), new, old);
        }
        self.last = *now;
    }
}

/// The standard `process_*` metrics, read from /proc/self when scraped.
#[derive(Clone, Default)]
struct ProcessGauges(Option<ProcessInner>);

#[derive(Clone)]
struct ProcessInner {
    cpu_seconds: Gauge,
    resident_bytes: IntGauge,
    virtual_bytes: IntGauge,
    open_fds: IntGauge,
    max_fds: IntGauge,
    threads: IntGauge,
    start_time: Gauge,
}

impl ProcessGauges {
    fn new(b: &Builder) -> Result<Self, MetricsError> {
        let inner = ProcessInner {
            cpu_seconds: b.gauge(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
            )?,
            resident_bytes: b.int_gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
            )?,
            virtual_bytes: b.int_gauge(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
            )?,
            open_fds: b.int_gauge("process_open_fds", "Number of open file descriptors.")?,
            max_fds: b.int_gauge(
                "process_max_fds",
                "Maximum number of open file descriptors.",
            )?,
            threads: b.int_gauge("process_threads", "Number of OS threads in the process.")?,
            start_time: b.gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
            )?,
        };
        let g = ProcessGauges(Some(inner));
        g.refresh();
        Ok(g)
    }

    /// Best effort: a field that cannot be read keeps its last value.
    fn refresh(&self) {
        let Some(p) = &self.0 else { return };
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if let Some(stat) = read_stat() {
            // proc(5): fields after the command, counted from `state` (field 3) as index 0.
            let field = |n: usize| stat.get(n - 3).and_then(|s| s.parse::<u64>().ok());
            if let (Some(utime), Some(stime)) = (field(14), field(15)) {
                if ticks > 0 {
                    p.cpu_seconds.set((utime + stime) as f64 / ticks as f64);
                }
            }
            if let Some(n) = field(20) {
                p.threads.set(n as i64);
            }
            if let Some(v) = field(23) {
                p.virtual_bytes.set(v as i64);
            }
            if let Some(rss) = field(24) {
                p.resident_bytes.set(rss as i64 * page.max(0));
            }
            if let (Some(start), Some(boot)) = (field(22), boot_time()) {
                if ticks > 0 {
                    p.start_time.set(boot + start as f64 / ticks as f64);
                }
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            p.open_fds.set(dir.count() as i64);
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            p.max_fds
                .set(i64::try_from(lim.rlim_cur).unwrap_or(i64::MAX));
        }
    }
}

/// `/proc/self/stat` split after the command name (which may contain spaces).
fn read_stat() -> Option<Vec<String>> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Boot time in seconds since the epoch (`btime` in /proc/stat).
fn boot_time() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn felix_names_are_exported_as_given() {
        let m = Metrics::new(false).unwrap();
        m.record_message("InSync");
        m.set_nft_objects(4, "calico", NftObjectCounts::default());
        let text = m.encode().unwrap();
        for name in [
            "felix_int_dataplane_apply_time_seconds_count 0",
            "felix_int_dataplane_failures 0",
            "felix_nft_calls 0",
            "felix_nft_errors 0",
            "felix_nft_list_calls 0",
            "felix_nft_list_errors 0",
            "felix_nft_set_calls 0",
            "felix_nft_set_errors 0",
            "felix_int_dataplane_messages{type=\"*proto.InSync\"} 1",
            "felix_nft_chains{ip_version=\"4\",table=\"calico\"} 0",
        ] {
            assert!(text.contains(name), "missing {name:?} in\n{text}");
        }
        assert!(!text.contains("felix_nft_calls_total"));
        assert!(!text.contains("process_"));
    }

    fn rule(
        action: RuleAction,
        (tier, name, kind): (&str, &str, &str),
        direction: RuleDirection,
        index: i64,
    ) -> RuleId {
        RuleId {
            action,
            tier: tier.into(),
            namespace: String::new(),
            name: name.into(),
            kind: kind.into(),
            direction,
            index,
        }
    }

    fn hit(rule: RuleId, deciding: bool, (packets, bytes): (u64, u64)) -> RuleTraffic {
        RuleTraffic {
            rule,
            deciding,
            packets_in: packets,
            packets_out: 0,
            bytes_in: bytes,
            bytes_out: 0,
            connections: 0,
        }
    }

    fn value(text: &str, series: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn a_flush_counts_each_rule_of_each_trace_and_the_deciding_deny() {
        use RuleAction::*;
        use RuleDirection::*;
        let m = Metrics::new(false).unwrap();
        let mut rec = m.flow_logs("node-1", Duration::from_secs(3600));
        let pass = rule(Pass, ("sec", "pass-web", "GlobalNetworkPolicy"), Ingress, 0);
        let deny = rule(Deny, ("", "deny-web", ""), Ingress, 0);
        let end_of_tier = rule(Deny, ("sec", "", ""), Ingress, -1);
        let mut allowed = hit(
            rule(Allow, ("", "allow-all", ""), Egress, 0),
            true,
            (50, 2600),
        );
        allowed.packets_out = 52;
        allowed.bytes_out = 2704;
        allowed.connections = 1;
        // a -> c:8080 passed on by tier sec and denied by c's profile (3 SYNs), b -> c:8080
        // denied by it too (1 SYN); a -> c:9090 denied at the end of sec (1 SYN); a -> b allowed
        // by a's egress profile.
        rec.record_flush(
            1000,
            &[
                hit(pass, false, (3, 180)),
                hit(deny.clone(), true, (3, 180)),
                hit(deny, true, (1, 60)),
                hit(end_of_tier, true, (1, 60)),
                allowed,
            ],
        );
        let text = m.encode().unwrap();
        // The encoder writes labels sorted by name.
        let series_of =
            |metric: &str, [action, kind, policy, dir, index, tier, traffic]: [&str; 7]| {
                format!(
                    "{metric}{{action=\"{action}\",instance=\"node-1\",kind=\"{kind}\",\
                 namespace=\"__GLOBAL__\",policy=\"{policy}\",rule_direction=\"{dir}\",\
                 rule_index=\"{index}\",tier=\"{tier}\",traffic_direction=\"{traffic}\"}}"
                )
            };
        let denied = |metric: &str, policy: &str| {
            format!("{metric}{{instance=\"node-1\",policy=\"{policy}\"}}")
        };
        let packets = "cnx_policy_rule_packets";
        let profile = "__PROFILE__";
        for (series, want) in [
            (
                series_of(
                    packets,
                    ["pass", "GlobalNetworkPolicy", "pass-web", "ingress", "0", "sec", "inbound"],
                ),
                3,
            ),
            (
                series_of(packets, ["deny", "", "deny-web", "ingress", "0", profile, "inbound"]),
                4,
            ),
            (
                series_of(packets, ["deny", "", "deny-web", "ingress", "0", profile, "outbound"]),
                0,
            ),
            (
                series_of(
                    "cnx_policy_rule_bytes",
                    ["deny", "", "__NO_MATCH__", "ingress", "-1", "sec", "inbound"],
                ),
                60,
            ),
            (
                series_of(packets, ["allow", "", "allow-all", "egress", "0", profile, "outbound"]),
                52,
            ),
            (
                series_of(packets, ["allow", "", "allow-all", "egress", "0", profile, "inbound"]),
                50,
            ),
            (
                "cnx_policy_rule_connections{instance=\"node-1\",kind=\"\",namespace=\"__GLOBAL__\",\
                 policy=\"allow-all\",rule_direction=\"egress\",rule_index=\"0\",\
                 tier=\"__PROFILE__\",traffic_direction=\"outbound\"}"
                    .to_string(),
                1,
            ),
            (denied("calico_denied_packets", "__PROFILE__|deny-web|0|deny"), 4),
            (denied("calico_denied_bytes", "__PROFILE__|deny-web|0|deny"), 240),
            (denied("calico_denied_packets", "sec|__NO_MATCH__|-1|deny"), 1),
            ("felix_nft_agent_flowlog_last_flush_timestamp_seconds".to_string(), 1000),
        ] {
            assert_eq!(value(&text, &series), Some(want), "{series} in\n{text}");
        }
        // A pass decides nothing: not a denial, and no connections.
        assert!(!text.contains("sec|pass-web"), "{text}");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("cnx_policy_rule_connections") && l.contains("pass-web")),
            "{text}"
        );
        assert!(!text.contains("srcIP"), "{text}");

        // The next flush adds to the same series.
        rec.record_flush(
            1010,
            &[hit(
                rule(Deny, ("", "deny-web", ""), Ingress, 0),
                true,
                (2, 120),
            )],
        );
        let text = m.encode().unwrap();
        assert_eq!(
            value(
                &text,
                &denied("calico_denied_packets", "__PROFILE__|deny-web|0|deny")
            ),
            Some(6),
            "{text}"
        );
    }

    #[test]
    fn rule_series_no_flush_fed_for_the_retention_time_go() {
        let m = Metrics::new(false).unwrap();
        let mut rec = m.flow_logs("n", Duration::from_secs(60));
        let mut old = rule(
            RuleAction::Deny,
            ("t", "old", "NetworkPolicy"),
            RuleDirection::Ingress,
            2,
        );
        old.namespace = "prod".into();
        rec.record_flush(1000, &[hit(old, true, (1, 40))]);
        let text = m.encode().unwrap();
        assert!(text.contains(r#"policy="t|prod/old|2|deny""#), "{text}");
        assert!(text.contains(r#"namespace="prod",policy="old""#), "{text}");
        let new = rule(RuleAction::Allow, ("", "p", ""), RuleDirection::Egress, 0);
        rec.record_flush(1050, &[hit(new.clone(), true, (1, 40))]);
        // Fed 50 s ago: kept.
        assert!(m.encode().unwrap().contains(r#"policy="old""#));
        rec.record_flush(1061, &[hit(new, true, (1, 40))]);
        let text = m.encode().unwrap();
        assert!(!text.contains(r#"policy="old""#), "{text}");
        assert!(!text.contains("prod/old"), "{text}");
        assert!(text.contains(r#"policy="p""#), "{text}");
    }

    #[test]
    fn the_collector_s_cumulative_counts_become_counters() {
        let m = Metrics::new(false).unwrap();
        let mut rec = m.flow_logs("n", Duration::from_secs(60));
        let mut counts = FlowLogCounts {
            nflog_packets: 10,
            conntrack_events: 4,
            kernel_overruns: 1,
            local_lost: 2,
            pending_expired: 3,
            ..FlowLogCounts::default()
        };
        rec.record_counts(&counts);
        counts.nflog_packets = 15;
        counts.flows_dropped = 7;
        rec.record_counts(&counts);
        let text = m.encode().unwrap();
        for (series, want) in [
            ("felix_nft_agent_flowlog_nflog_packets_total", 15),
            ("felix_nft_agent_flowlog_conntrack_events_total", 4),
            ("felix_nft_agent_flowlog_kernel_overruns_total", 1),
            ("felix_nft_agent_flowlog_queue_drops_total", 0),
            ("felix_nft_agent_flowlog_local_lost_total", 2),
            ("felix_nft_agent_flowlog_evictions_total", 0),
            (
                "felix_nft_agent_flowlog_aggregator_drops_total{reason=\"pending_expired\"}",
                3,
            ),
            (
                "felix_nft_agent_flowlog_aggregator_drops_total{reason=\"flow_table_full\"}",
                7,
            ),
        ] {
            assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
        }
    }

    #[test]
    fn process_metrics_read_proc() {
        let m = Metrics::new(true).unwrap();
        let text = m.encode().unwrap();
        let fds = text
            .lines()
            .find_map(|l| l.strip_prefix("process_open_fds "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap();
        assert!(fds >= 3.0, "{text}");
        let rss = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap();
        assert!(rss > 1_000_000.0, "{text}");
    }
}
