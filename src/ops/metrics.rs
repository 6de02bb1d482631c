//! Prometheus metrics (§11).
//!
//! Names are Felix's wherever Felix has the metric, with Felix's labels, so existing dashboards
//! work: the internal dataplane (`felix_int_dataplane_*`), the nftables table and set
//! reconcilers (`felix_nft_*`) and the route table (`felix_route_table_*`). Felix exports some
//! of these as summaries; the client we use has no summaries, so they are histograms here (the
//! `_sum` and `_count` series are the same). Metrics Felix does not have are ours and named
//! `felix_nft_agent_*`.
//!
//! Recording is cheap (atomics) and never blocks the scrape; the registry is per [`Metrics`]
//! value, not global, so tests can make as many as they like.

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
