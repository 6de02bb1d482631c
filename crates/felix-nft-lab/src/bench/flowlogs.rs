//! `felix-nft bench flowlogs`: what flow logs cost a node, measured with the agent itself.
//!
//! One test bed node ([`Topology`]: workloads `a` and `b` behind the host namespace, an upstream
//! namespace as the host's default route) is programmed by the built `felix-nft` binary run as
//! a child (`run --source stdin --keep-running --netns <host>`), fed one state document: the
//! benchmark workload at a scale (default mid: 1,000 endpoints, 500 policies, 100,000 IP set
//! members; [`super::workload`]) plus `a` and `b`, each behind two of those policies and one
//! that allows the measured pair. Each agent life is one mode, flow logs off or on
//! (`FlowLogsLocalReporter`), and the lives alternate (off, on, off, on, … `reps` times), so
//! both modes see the same node, inputs and binary:
//!
//! 1. **Connections**: client threads in `a` open TCP connections to a listener in `b` as fast
//!    as they can (connect, wait for the server's close, close with a reset so no TIME_WAIT
//!    holds ports) for `seconds` after a one-second warm-up; completed connections per second.
//! 2. **Applies**: during that load, an IP set member is added every 250 ms to a set the pair's
//!    policies use (`IPSetDeltaUpdate` on the agent's stdin) and timed until the kernel's ruleset
//!    generation moves (`NFT_MSG_GETGEN`, polled every 200 µs from the bench); the agent's own
//!    `apply` log lines (`since_read_ms`, `duration_ms`) are kept beside it.
//! 3. **Denied flood**: one thread in `a` sends UDP to a port `b` denies through a raw socket,
//!    the source port cycling over 1024–65535 so each packet is a new connection attempt that
//!    is logged (target `flood_pps`, reported as achieved), for `seconds`. The agent's CPU
//!    (utime + stime of `/proc/PID/stat`, per thread too), its peak RSS (`VmHWM`, reset through
//!    `clear_refs` before the flood), what reached the node (the host veth's receive counter),
//!    what the flows counted (`FlowClient`, the reader `felix-nft flows` uses), the drops of the
//!    agent's netlink sockets (`/proc/net/netlink`), the collector's metrics where the agent
//!    serves them, and its warnings about lost batches.
//!
//! Between lives the node is put back as a fresh one finds it: the agent is stopped with
//! SIGTERM, its tables and routes removed (`oneshot::cleanup`), the pair's conntrack entries
//! deleted and `nf_conntrack_acct` (which the collector turns on) restored.
//!
//! Invariants: everything runs in the bed's namespaces (each thread and the agent's spawn check
//! they are not in PID 1's network namespace), and the bed is deleted afterwards, also on error;
//! the agent is the only program run; nothing here is a timed assertion.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::report::median;
use super::run::in_root_netns;
use super::spot::{block_on, tb};
use super::workload::{msg, policy_id, set_id, Scale, Workload, PROFILE};
use super::{create_dir, write, BenchError};
use crate::testbed::topology::{ExternalSpec, Topology, TopologySpec, WorkloadSpec};
use felix_api::to_dataplane::Payload;
use felix_api::types::{
    protocol::NumberOrName, ActivePolicyUpdate, InSync, IpSetDeltaUpdate, IpSetType, IpSetUpdate,
    Policy, PolicyId, PortRange, Protocol, Rule, TierInfo, WorkloadEndpointUpdate,
};
use felix_nft::flows::query::{Filter, Request};
use felix_nft::flows::record::{FlowRecord, Reporter, Verdict};
use felix_nft::flows::serve::{FlowClient, Reply};
use rtnl::devconf::ProcSys;
use rtnl::netns::NetNs;

/// The measured pair's TCP port (no rule of the generated policies allows it).
pub const PAIR_PORT: u16 = 7070;
/// The flood's UDP port: nothing of `b`'s ingress allows UDP.
pub const DENIED_PORT: u16 = 9999;
const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The IP sets and policies of the pair.
const PAIR_SET_A: &str = "s:flowbench-a";
const PAIR_SET_B: &str = "s:flowbench-b";
const PAIR_INGRESS: &str = "flowbench-ingress";
const PAIR_EGRESS: &str = "flowbench-egress";

/// Load before each measured window, not counted.
const WARMUP: Duration = Duration::from_secs(1);
/// After the agent is in sync and the pair connects, before anything is measured.
const SETTLE: Duration = Duration::from_secs(1);
/// The agent's CPU is also read this long after the flood ends (the collector drains).
const DRAIN: Duration = Duration::from_secs(3);
/// One IP set member add per this long during the connection load.
const UPDATE_EVERY: Duration = Duration::from_millis(250);
/// An add not in the kernel after this is counted as timed out.
const UPDATE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the agent may take to be in sync and the pair to connect.
const SYNC_TIMEOUT: Duration = Duration::from_secs(180);
/// A client's connect and its wait for the server's close.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// `FlowLogsFlushInterval` of the agents: the collector polls conntrack's counters every
/// `min(flush, 5 s)`, so this keeps the poll at the period of the default 300 s while records
/// come out soon enough to be read.
pub const FLUSH_SECS: u64 = 5;
/// The agent's Prometheus port inside the bed's host namespace.
const METRICS_PORT: u16 = 9091;
/// Accepting threads of the listener in `b`.
const SERVER_THREADS: usize = 2;

/// Options of one run.
#[derive(Debug, Clone)]
pub struct FlowlogsOptions {
    /// The policy load the agent programs besides the pair.
    pub scale: Scale,
    /// Length of each measured window (connections, then the flood).
    pub seconds: u64,
    /// Agent lives per mode, alternating off and on.
    pub reps: usize,
    /// Client threads opening connections.
    pub threads: usize,
    /// The flood's target rate, packets per second (0: as fast as the sender can).
    pub flood_pps: u64,
    /// Where the JSON, the agents' logs and the state document go.
    pub out_dir: PathBuf,
    /// The agent binary (default: this executable).
    pub felix_exe: Option<PathBuf>,
}

impl FlowlogsOptions {
    /// The defaults: mid scale, 5 s windows, 3 lives per mode, 4 client threads, 100,000 pps.
    pub fn new(out_dir: PathBuf) -> FlowlogsOptions {
        FlowlogsOptions {
            scale: Scale::MID,
            seconds: 5,
            reps: 3,
            threads: 4,
            flood_pps: 100_000,
            out_dir,
            felix_exe: None,
        }
    }
}

/// Flow logs off or on for one agent life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Off,
    On,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::On => "on",
        }
    }
}

/// The machine the numbers were taken on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    pub kernel: String,
    pub kernel_version: String,
    pub arch: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub mem_total_kb: u64,
    pub nf_conntrack_max: Option<u64>,
    pub agent: String,
}

/// One connection-load window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadSample {
    pub seconds: f64,
    pub completed: u64,
    /// Connects or waits that failed or timed out.
    pub failed: u64,
    pub conns_per_sec: f64,
    /// The agent's utime + stime over the window, % of one core.
    pub agent_cpu_pct: f64,
    /// The agent's peak RSS over the window (reset before it), kB.
    pub agent_vmhwm_kb: Option<u64>,
    /// `batches_lost` of the collector's warnings logged in the window (a lower bound: it
    /// warns once a minute per reader).
    pub warned_batches_lost: u64,
    /// `felix_nft_agent_flowlog_*` counters from before the warm-up to the first flush after
    /// the window (flow logs on) or the window's end, where the agent serves them.
    pub collector_metrics: BTreeMap<String, f64>,
}

/// The IP set member adds of one window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UpdateSample {
    /// From writing the update to the agent to the generation moving, ms.
    pub latencies_ms: Vec<f64>,
    pub timeouts: usize,
    /// The agent's `apply` lines of the window that carried an update: `since_read_ms`.
    pub agent_since_read_ms: Vec<f64>,
    /// Their `duration_ms`.
    pub agent_duration_ms: Vec<f64>,
}

/// Connections of the pair made in one life and what the flows counted of them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FlowCoverage {
    /// Readiness probes, warm-up and measured connections, failed attempts included.
    pub connections_made: u64,
    /// `connections_started` of the pair's allowed flows, reported by `a` (egress).
    pub src_started: u64,
    /// The same reported by `b` (ingress).
    pub dst_started: u64,
}

/// One denied flood.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FloodSample {
    pub seconds: f64,
    pub target_pps: u64,
    /// Packets the raw socket took.
    pub sent: u64,
    pub sent_pps: f64,
    pub send_errors: u64,
    /// Packets that reached the host end of `a`'s veth, and those it dropped.
    pub arrived: u64,
    pub arrived_pps: f64,
    pub host_rx_dropped: u64,
    /// The agent's utime + stime over the flood, % of one core.
    pub agent_cpu_pct: f64,
    /// The same over the flood and the [`DRAIN`] after it.
    pub agent_cpu_pct_with_drain: f64,
    /// CPU ms per thread name over the flood and the drain (threads of one name summed).
    pub thread_cpu_ms: BTreeMap<String, f64>,
    /// Peak RSS since the reset just before the flood, through the drain; kB.
    pub agent_vmhwm_kb: Option<u64>,
    pub agent_vmrss_kb: Option<u64>,
    /// Denied packets the dst-reported flows counted (`packets_in`).
    pub denied_counted: Option<u64>,
    /// `connections_started` of the src-reported (allowed by `a`'s egress) flows.
    pub src_started: Option<u64>,
    /// Drops of the agent's `NETLINK_NETFILTER` sockets over the flood (messages the kernel
    /// could not queue: for NFLOG each is a batch of logged packets).
    pub netlink_drops: Option<u64>,
    /// `batches_lost` of the collector's warnings logged from the flood's start through the
    /// drain (a lower bound: it warns once a minute per reader, so a warning during the
    /// connection load silences the flood's).
    pub warned_batches_lost: u64,
    /// `felix_nft_agent_flowlog_*` counters from just before the flood to the first flush
    /// after it (flow logs on) or the drain's end, where the agent serves them.
    pub collector_metrics: BTreeMap<String, f64>,
}

/// One agent life.
#[derive(Debug, Clone, Serialize)]
pub struct Life {
    pub mode: Mode,
    pub rep: usize,
    /// The machine's 1-minute load average as the life started and as it ended
    /// (`/proc/loadavg`): other work on the machine shows here.
    pub loadavg_start: f64,
    pub loadavg_end: f64,
    /// From the start of the agent to the pair connecting.
    pub ready_seconds: f64,
    /// The agent's peak RSS once ready, kB.
    pub agent_vmhwm_ready_kb: Option<u64>,
    pub load: LoadSample,
    pub updates: UpdateSample,
    pub flows: Option<FlowCoverage>,
    pub flood: FloodSample,
}

/// Median with min and max.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Spread {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    fn of(v: Vec<f64>) -> Spread {
        let v: Vec<f64> = v.into_iter().filter(|x| x.is_finite()).collect();
        Spread {
            n: v.len(),
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            median: median(v),
        }
    }
}

/// One mode over its lives.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModeSummary {
    /// Per life.
    pub conns_per_sec: Spread,
    pub load_agent_cpu_pct: Spread,
    /// Every add of every life.
    pub update_latency_ms: Spread,
    pub update_latency_p90_ms: f64,
    pub update_timeouts: usize,
    pub agent_since_read_ms: Spread,
    pub agent_duration_ms: Spread,
    /// Per life: the flows' count of the pair's connections ÷ those made (on only).
    pub flows_src_coverage: Option<Spread>,
    pub flows_dst_coverage: Option<Spread>,
    pub flood_sent_pps: Spread,
    pub flood_arrived_pps: Spread,
    pub flood_agent_cpu_pct: Spread,
    pub flood_agent_cpu_pct_with_drain: Spread,
    /// Largest over the lives, kB.
    pub flood_agent_vmhwm_kb: Option<u64>,
    pub ready_agent_vmhwm_kb: Option<u64>,
    /// Per life: denied packets counted ÷ arrived (on only).
    pub flood_denied_counted_ratio: Option<Spread>,
    pub flood_netlink_drops: Option<Spread>,
    pub flood_warned_batches_lost: u64,
    pub load_warned_batches_lost: u64,
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct FlowlogsReport {
    pub machine: Machine,
    pub scale: Scale,
    pub seconds: u64,
    pub reps: usize,
    pub threads: usize,
    pub flood_target_pps: u64,
    pub flush_interval_secs: u64,
    pub lives: Vec<Life>,
    pub off: ModeSummary,
    pub on: ModeSummary,
    /// Median connections/s on ÷ off.
    pub conns_ratio_on_off: f64,
    pub conns_ratio_target: f64,
    /// Median add latency on ÷ off.
    pub update_latency_ratio_on_off: f64,
    pub update_latency_ratio_target: f64,
    pub notes: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

/// Runs the lives and writes `flowlogs-<scale>.json` into `opts.out_dir`.
pub fn run(opts: &FlowlogsOptions) -> Result<FlowlogsReport, BenchError> {
    create_dir(&opts.out_dir)?;
    let logs = opts.out_dir.join("flowlogs-logs");
    create_dir(&logs)?;
    let exe = match &opts.felix_exe {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|source| BenchError::Io {
            op: "finding the felix-nft executable".into(),
            source,
        })?,
    };
    let mut machine = machine();
    machine.agent = exe.display().to_string();
    let bed = Bed::build()?;
    let state = state_document(opts.scale, &bed.topo);
    write(&opts.out_dir.join("flowlogs-state.jsonl"), &state)?;
    let ctx = Ctx {
        opts,
        exe: &exe,
        logs: &logs,
        state: &state,
    };
    let mut lives = Vec::new();
    for rep in 0..opts.reps.max(1) {
        for mode in [Mode::Off, Mode::On] {
            eprintln!(
                "bench flowlogs: flow logs {}, life {}",
                mode.name(),
                rep + 1
            );
            let life = ctx.life(&bed, mode, rep);
            // Put the node back whatever the life did, then report its error.
            bed.reset()?;
            lives.push(life?);
        }
    }
    let mut report = FlowlogsReport::new(opts, machine, lives);
    report.notes.push(format!(
        "the bed's host namespace had nf_conntrack_acct = {} before the first agent; it is \
         restored after each life (the collector turns it on)",
        bed.acct.as_deref().unwrap_or("(absent)")
    ));
    let stem = scale_stem(opts.scale);
    let json = serde_json::to_string_pretty(&report).unwrap_or_default();
    write(&opts.out_dir.join(format!("flowlogs-{stem}.json")), &json)?;
    Ok(report)
}

fn scale_stem(s: Scale) -> String {
    match s {
        s if s == Scale::SMALL => "small".into(),
        s if s == Scale::MID => "mid".into(),
        s if s == Scale::LARGE => "large".into(),
        s => format!("w{}", s.w),
    }
}

/// What every life shares.
struct Ctx<'a> {
    opts: &'a FlowlogsOptions,
    exe: &'a Path,
    logs: &'a Path,
    state: &'a str,
}

impl Ctx<'_> {
    fn life(&self, bed: &Bed, mode: Mode, rep: usize) -> Result<Life, BenchError> {
        let secs = Duration::from_secs(self.opts.seconds.max(1));
        let sock_dir = std::env::temp_dir().join(format!(
            "fnft-flowbench-{}-{}-{rep}",
            std::process::id(),
            mode.name()
        ));
        let _ = std::fs::remove_dir_all(&sock_dir);
        let flows_sock = sock_dir.join("flows.sock");
        let log = self.logs.join(format!("{}-{}.log", mode.name(), rep + 1));
        let loadavg_start = loadavg();
        let t0 = Instant::now();
        let mut agent = Agent::start(self.exe, bed, mode, &flows_sock, &log)?;
        agent.send(self.state.as_bytes())?;
        agent.wait_log("to be in sync", SYNC_TIMEOUT, |r| {
            Ok(message(r) == Some("dataplane in sync"))
        })?;
        if mode == Mode::On {
            agent.wait_log("to start its flow-log readers", SYNC_TIMEOUT, |r| {
                // The agent's line when the collector runs, and its two ways of running
                // without one (daemon.rs, `start_flow_logs`).
                let m = message(r).unwrap_or_default();
                if m.starts_with("flow logs: reading NFLOG") {
                    Ok(true)
                } else if m.starts_with("flow logs: the readers cannot start")
                    || m.starts_with("flow logs: the local view cannot be served")
                {
                    let cause = r["error"].as_str().unwrap_or_default();
                    Err(format!("{m} ({cause})"))
                } else {
                    Ok(false)
                }
            })?;
        }
        let probes = bed.wait_reachable(&mut agent)?;
        let ready_seconds = t0.elapsed().as_secs_f64();
        let agent_vmhwm_ready_kb = proc_status(agent.pid, "VmHWM:");
        std::thread::sleep(SETTLE);

        let gen = GenWatch::open(bed.topo.host())?;
        let m0 = metrics(bed.topo.host());
        let (mut load, updates, made) = self.load(bed, &mut agent, gen, secs)?;
        let flows = match mode {
            Mode::Off => None,
            Mode::On => {
                let recs = records_after(&flows_sock, unix_now() + 1)?;
                let started = |rep: Reporter| {
                    recs.iter()
                        .filter(|r| {
                            r.key.proto == 6
                                && r.key.dest_port == PAIR_PORT
                                && r.key.reporter == rep
                                && r.key.action == Verdict::Allow
                        })
                        .map(|r| r.connections_started)
                        .sum()
                };
                Some(FlowCoverage {
                    connections_made: made + probes,
                    src_started: started(Reporter::Src),
                    dst_started: started(Reporter::Dst),
                })
            }
        };
        load.collector_metrics = metrics_delta(m0, metrics(bed.topo.host()));
        let flood = self.flood(bed, &agent, mode, &flows_sock, secs)?;
        let (status, text) = agent.stop()?;
        if !status.success() {
            return Err(BenchError::Agent {
                op: format!("exited with {status} when stopped"),
                log_tail: tail(&text),
            });
        }
        let _ = std::fs::remove_dir_all(&sock_dir);
        Ok(Life {
            mode,
            rep,
            loadavg_start,
            loadavg_end: loadavg(),
            ready_seconds,
            agent_vmhwm_ready_kb,
            load,
            updates,
            flows,
            flood,
        })
    }

    /// The connection load with the IP set adds during it; also returns every connection
    /// attempt of the load (warm-up included).
    fn load(
        &self,
        bed: &Bed,
        agent: &mut Agent,
        mut gen: GenWatch,
        secs: Duration,
    ) -> Result<(LoadSample, UpdateSample, u64), BenchError> {
        let a = bed.ns("a")?;
        let dst = SocketAddr::V4(SocketAddrV4::new(B, PAIR_PORT));
        let stop = AtomicBool::new(false);
        let (done, failed) = (AtomicU64::new(0), AtomicU64::new(0));
        let result = std::thread::scope(|s| {
            let clients: Vec<_> = (0..self.opts.threads.max(1))
                .map(|_| s.spawn(|| client_loop(a, dst, &stop, &done, &failed)))
                .collect();
            let measured = (|| {
                std::thread::sleep(WARMUP);
                reset_peak_rss(agent.pid);
                let (applies0, logged0) = (agent.applies().len(), agent.records().len());
                let (c0, f0, cpu0, t0) = (
                    done.load(Ordering::Relaxed),
                    failed.load(Ordering::Relaxed),
                    proc_cpu_ticks(agent.pid),
                    Instant::now(),
                );
                let mut updates = UpdateSample::default();
                let mut i = 0u32;
                while t0.elapsed() + UPDATE_EVERY <= secs {
                    let next = Instant::now() + UPDATE_EVERY;
                    i += 1;
                    match member_add(agent, &mut gen, i)? {
                        Some(ms) => updates.latencies_ms.push(ms),
                        None => updates.timeouts += 1,
                    }
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
                std::thread::sleep(secs.saturating_sub(t0.elapsed()));
                let (c1, f1, cpu1, wall) = (
                    done.load(Ordering::Relaxed),
                    failed.load(Ordering::Relaxed),
                    proc_cpu_ticks(agent.pid),
                    t0.elapsed().as_secs_f64(),
                );
                let warned =
                    warned_batches_lost(agent.records().get(logged0..).unwrap_or_default());
                for r in agent.applies().iter().skip(applies0) {
                    if let Some(ms) = r["since_read_ms"].as_f64() {
                        updates.agent_since_read_ms.push(ms);
                        updates
                            .agent_duration_ms
                            .push(r["duration_ms"].as_f64().unwrap_or(f64::NAN));
                    }
                }
                Ok::<_, BenchError>((
                    LoadSample {
                        seconds: wall,
                        completed: c1 - c0,
                        failed: f1 - f0,
                        conns_per_sec: (c1 - c0) as f64 / wall,
                        agent_cpu_pct: cpu_pct(cpu0, cpu1, wall),
                        agent_vmhwm_kb: proc_status(agent.pid, "VmHWM:"),
                        warned_batches_lost: warned,
                        collector_metrics: BTreeMap::new(),
                    },
                    updates,
                ))
            })();
            stop.store(true, Ordering::Relaxed);
            let mut client_err = None;
            for c in clients {
                match c.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => client_err = Some(e),
                    Err(_) => {
                        client_err = Some(BenchError::Refused("a client thread panicked".into()))
                    }
                }
            }
            match (measured, client_err) {
                (Err(e), _) | (Ok(_), Some(e)) => Err(e),
                (Ok(m), None) => Ok(m),
            }
        })?;
        let made = done.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
        Ok((result.0, result.1, made))
    }

    fn flood(
        &self,
        bed: &Bed,
        agent: &Agent,
        mode: Mode,
        flows_sock: &Path,
        secs: Duration,
    ) -> Result<FloodSample, BenchError> {
        let a = bed.ns("a")?;
        let host = bed.topo.host();
        let host_if = bed.host_ifname("a")?;
        let rx0 = netdev(host, &host_if)?;
        let nl0 = netlink_drops(host, agent.pid);
        let m0 = metrics(host);
        let logged0 = agent.records().len();
        reset_peak_rss(agent.pid);
        let (cpu0, th0) = (proc_cpu_ticks(agent.pid), thread_ticks(agent.pid));
        let start_unix = unix_now();
        let sent = std::thread::scope(|s| {
            s.spawn(|| flood_send(a, A, B, DENIED_PORT, secs, self.opts.flood_pps))
                .join()
                .unwrap_or_else(|_| Err(BenchError::Refused("the flood thread panicked".into())))
        })?;
        let cpu1 = proc_cpu_ticks(agent.pid);
        let rx1 = netdev(host, &host_if)?;
        let t_end = Instant::now();
        std::thread::sleep(DRAIN);
        let (cpu2, th1) = (proc_cpu_ticks(agent.pid), thread_ticks(agent.pid));
        let drained = sent.seconds + t_end.elapsed().as_secs_f64();
        let mut f = FloodSample {
            seconds: sent.seconds,
            target_pps: self.opts.flood_pps,
            sent: sent.packets,
            sent_pps: sent.packets as f64 / sent.seconds,
            send_errors: sent.errors,
            arrived: rx1.rx_packets.saturating_sub(rx0.rx_packets),
            host_rx_dropped: rx1.rx_dropped.saturating_sub(rx0.rx_dropped),
            agent_cpu_pct: cpu_pct(cpu0, cpu1, sent.seconds),
            agent_cpu_pct_with_drain: cpu_pct(cpu0, cpu2, drained),
            thread_cpu_ms: thread_delta_ms(&th0, &th1),
            agent_vmhwm_kb: proc_status(agent.pid, "VmHWM:"),
            agent_vmrss_kb: proc_status(agent.pid, "VmRSS:"),
            ..FloodSample::default()
        };
        f.arrived_pps = f.arrived as f64 / sent.seconds;
        f.netlink_drops = match (nl0, netlink_drops(host, agent.pid)) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        f.warned_batches_lost =
            warned_batches_lost(agent.records().get(logged0..).unwrap_or_default());
        if mode == Mode::On {
            let recs = records_after(flows_sock, unix_now() + 1)?;
            let flood = |r: &&FlowRecord| {
                r.key.proto == 17 && r.key.dest_port == DENIED_PORT && r.end_time >= start_unix
            };
            f.denied_counted = Some(
                recs.iter()
                    .filter(flood)
                    .filter(|r| r.key.reporter == Reporter::Dst && r.key.action == Verdict::Deny)
                    .map(|r| r.packets_in)
                    .sum(),
            );
            f.src_started = Some(
                recs.iter()
                    .filter(flood)
                    .filter(|r| r.key.reporter == Reporter::Src)
                    .map(|r| r.connections_started)
                    .sum(),
            );
        }
        // After the flush that took the flood's last packets (with flow logs on).
        f.collector_metrics = metrics_delta(m0, metrics(host));
        Ok(f)
    }
}

/// Adds member `i` to the first generated set and waits for the kernel's generation to move;
/// the latency in ms, `None` when it did not within [`UPDATE_TIMEOUT`].
fn member_add(agent: &mut Agent, gen: &mut GenWatch, i: u32) -> Result<Option<f64>, BenchError> {
    let g0 = gen.get()?;
    let member = Ipv4Addr::from(0x0AFA_0000u32 + i).to_string();
    let m = msg(Payload::IpsetDeltaUpdate(IpSetDeltaUpdate {
        id: set_id(0),
        added_members: vec![member],
        removed_members: vec![],
    }));
    let line = format!("{}\n", felix_api::json::encode(&m));
    let t0 = Instant::now();
    agent.send(line.as_bytes())?;
    while t0.elapsed() < UPDATE_TIMEOUT {
        if gen.get()? != g0 {
            return Ok(Some(t0.elapsed().as_secs_f64() * 1e3));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(None)
}

// ---------------------------------------------------------------------------------------------
// The node and its inputs
// ---------------------------------------------------------------------------------------------

/// The test bed node, the listener in `b`, and what the host namespace held at the start.
struct Bed {
    /// Declared first: the listener's threads stop before the namespaces go.
    _server: AcceptServer,
    topo: Topology,
    /// `nf_conntrack_acct` of the host namespace before any agent.
    acct: Option<String>,
}

impl Bed {
    fn build() -> Result<Bed, BenchError> {
        let spec = TopologySpec {
            prefix: "fnft-flowbench".into(),
            workloads: vec![WorkloadSpec::v4("a", A), WorkloadSpec::v4("b", B)],
            // The host's default route: proxy ARP answers for 169.254.1.1 only when the host
            // routes it elsewhere.
            external: Some(ExternalSpec {
                routes_to_workloads: false,
                ipv6: false,
            }),
        };
        let topo = block_on(Topology::build(&spec))?.map_err(tb("building the test bed"))?;
        for ns in std::iter::once(topo.host()).chain(topo.workloads().iter().map(|w| w.ns())) {
            if ns.run(in_root_netns).map_err(netns_err)? {
                return Err(BenchError::Refused(
                    "a test bed namespace is the host's own".into(),
                ));
            }
        }
        let b = topo
            .workload("b")
            .ok_or_else(|| BenchError::Refused("no workload b".into()))?;
        let server = AcceptServer::start(b.ns(), PAIR_PORT)?;
        let acct = sys(topo.host())?
            .read("net/netfilter/nf_conntrack_acct")
            .ok()
            .map(|s| s.trim().to_string());
        Ok(Bed {
            _server: server,
            topo,
            acct,
        })
    }

    fn ns(&self, name: &str) -> Result<&NetNs, BenchError> {
        self.topo
            .workload(name)
            .map(|w| w.ns())
            .ok_or_else(|| BenchError::Refused(format!("no workload {name}")))
    }

    fn host_ifname(&self, name: &str) -> Result<String, BenchError> {
        self.topo
            .workload(name)
            .map(|w| w.host_ifname.clone())
            .ok_or_else(|| BenchError::Refused(format!("no workload {name}")))
    }

    /// Probes a → b until a connection completes; the number of attempts.
    fn wait_reachable(&self, agent: &mut Agent) -> Result<u64, BenchError> {
        let a = self.ns("a")?;
        let dst = SocketAddr::V4(SocketAddrV4::new(B, PAIR_PORT));
        let t0 = Instant::now();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let ok = a.run(|| one_connection(dst)).map_err(netns_err)?.is_ok();
            if ok {
                return Ok(attempts);
            }
            agent.check_running()?;
            if t0.elapsed() > SYNC_TIMEOUT {
                return Err(BenchError::Agent {
                    op: format!("did not let a reach b:{PAIR_PORT} in {SYNC_TIMEOUT:?}"),
                    log_tail: tail(&agent.log_text()),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Puts the host namespace back as the first agent found it: no tables or routes of ours,
    /// no conntrack entries of the pair, `nf_conntrack_acct` as it was.
    fn reset(&self) -> Result<(), BenchError> {
        let host = self.topo.host();
        let cfg = super::run::bench_dataplane_config();
        block_on(felix_nft::dataplane::oneshot::cleanup(Some(host), &cfg))?.map_err(|e| {
            BenchError::Cleanup {
                source: Box::new(e),
            }
        })?;
        for ip in [A, B] {
            rtnl::conntrack::delete_by_source(Some(host), IpAddr::V4(ip)).map_err(|source| {
                BenchError::Rtnl {
                    op: format!("deleting the conntrack entries of {ip}"),
                    source: Box::new(source),
                }
            })?;
        }
        if let Some(v) = &self.acct {
            sys(host)?
                .write("net/netfilter/nf_conntrack_acct", v)
                .map_err(|source| BenchError::Rtnl {
                    op: "restoring nf_conntrack_acct".into(),
                    source: Box::new(source),
                })?;
        }
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }
}

fn sys(ns: &NetNs) -> Result<ProcSys, BenchError> {
    let ns = ns.try_clone().map_err(|source| BenchError::Io {
        op: "cloning the host namespace handle".into(),
        source,
    })?;
    Ok(ProcSys::new(Some(ns)))
}

fn netns_err(source: rtnl::netns::NetNsError) -> BenchError {
    BenchError::Netns {
        op: "entering a test bed namespace",
        source,
    }
}

/// The state document: the workload at `scale`, then the pair — sets holding `a` and `b`, a
/// policy allowing `a` → `b`:[`PAIR_PORT`] on `b`'s ingress and one allowing anything to `b` on
/// `a`'s egress, each endpoint behind the policies the first generated endpoint has and then
/// the pair's (tier `default`, default action deny) — and `InSync`.
fn state_document(scale: Scale, topo: &Topology) -> String {
    let w = Workload::generate(scale);
    let mut msgs = w.messages();
    // Everything before `InSync`.
    msgs.pop();
    let pair_id = |name: &str| PolicyId {
        name: name.into(),
        namespace: "bench".into(),
        kind: "NetworkPolicy".into(),
    };
    for (id, ip) in [(PAIR_SET_A, A), (PAIR_SET_B, B)] {
        msgs.push(msg(Payload::IpsetUpdate(IpSetUpdate {
            id: id.into(),
            members: vec![ip.to_string()],
            r#type: IpSetType::Ip as i32,
        })));
    }
    let tcp = Some(Protocol {
        number_or_name: Some(NumberOrName::Name("tcp".into())),
    });
    let ingress = Rule {
        action: "allow".into(),
        protocol: tcp,
        src_ip_set_ids: vec![PAIR_SET_A.into()],
        dst_ports: vec![PortRange {
            first: PAIR_PORT.into(),
            last: PAIR_PORT.into(),
        }],
        ..Default::default()
    };
    let egress = Rule {
        action: "allow".into(),
        dst_ip_set_ids: vec![PAIR_SET_B.into()],
        ..Default::default()
    };
    for (name, policy) in [
        (
            PAIR_INGRESS,
            Policy {
                inbound_rules: vec![ingress],
                ..Default::default()
            },
        ),
        (
            PAIR_EGRESS,
            Policy {
                outbound_rules: vec![egress],
                ..Default::default()
            },
        ),
    ] {
        msgs.push(msg(Payload::ActivePolicyUpdate(ActivePolicyUpdate {
            id: Some(pair_id(name)),
            policy: Some(policy),
        })));
    }
    let first = &w.endpoints[0];
    let ids = |v: &[usize]| v.iter().map(|&p| policy_id(p)).collect::<Vec<_>>();
    for wl in topo.workloads() {
        let (mut ingress, mut egress) = (ids(&first.ingress), ids(&first.egress));
        match wl.name.as_str() {
            "a" => egress.push(pair_id(PAIR_EGRESS)),
            _ => ingress.push(pair_id(PAIR_INGRESS)),
        }
        let mut ep = wl.endpoint(&[PROFILE]);
        ep.tiers = vec![TierInfo {
            name: "default".into(),
            ingress_policies: ingress,
            egress_policies: egress,
            default_action: String::new(),
        }];
        msgs.push(msg(Payload::WorkloadEndpointUpdate(
            WorkloadEndpointUpdate {
                id: Some(wl.endpoint_id()),
                endpoint: Some(ep),
            },
        )));
    }
    msgs.push(msg(Payload::InSync(InSync {})));
    let mut s = String::new();
    for m in &msgs {
        s.push_str(&felix_api::json::encode(m));
        s.push('\n');
    }
    s
}

// ---------------------------------------------------------------------------------------------
// The agent
// ---------------------------------------------------------------------------------------------

/// One life of `felix-nft run --source stdin --keep-running` in the bed's host namespace, its
/// stderr (JSON log lines) in a file. Killed on drop.
struct Agent {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pid: u32,
    log: PathBuf,
}

impl Agent {
    fn start(
        exe: &Path,
        bed: &Bed,
        mode: Mode,
        flows_sock: &Path,
        log: &Path,
    ) -> Result<Agent, BenchError> {
        let io = |op: &str| {
            let op = op.to_string();
            move |source| BenchError::Io { op, source }
        };
        let mut cmd = Command::new(exe);
        cmd.args(["run", "--source", "stdin", "--keep-running", "--netns"])
            .arg(bed.topo.host_netns_name());
        // Hermetic: none of the caller's Felix settings.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("FELIX_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
            .env("FELIX_IPV6SUPPORT", "false")
            .env("FELIX_REPORTINGINTERVALSECS", "0")
            .env("FELIX_LOGSEVERITYSCREEN", "info")
            .env("FELIX_NFT_LOG_FORMAT", "json")
            .env("FELIX_PROMETHEUSMETRICSENABLED", "true")
            .env("FELIX_PROMETHEUSMETRICSPORT", METRICS_PORT.to_string())
            .env("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1")
            .env_remove("RUST_LOG");
        if mode == Mode::On {
            cmd.env("FELIX_FLOWLOGSLOCALREPORTER", "Enabled")
                .env("FELIX_FLOWLOGSFLUSHINTERVAL", FLUSH_SECS.to_string())
                .env("FELIX_FLOWLOGSLOCALSOCKET", flows_sock);
        }
        let err = std::fs::File::create(log).map_err(io("creating the agent's log file"))?;
        cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(err);
        // Spawned from inside the bed's host namespace: the agent and everything it opens
        // without `--netns` (its metrics listener) live there.
        let guard = bed.topo.host().enter().map_err(netns_err)?;
        if in_root_netns() {
            return Err(BenchError::Refused(
                "the agent would start in the host's network namespace".into(),
            ));
        }
        let spawned = cmd.spawn();
        drop(guard);
        let mut child = spawned.map_err(io(&format!("starting {}", exe.display())))?;
        Ok(Agent {
            stdin: child.stdin.take(),
            pid: child.id(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), BenchError> {
        let r = match self.stdin.as_mut() {
            Some(s) => s.write_all(bytes).and_then(|()| s.flush()),
            None => Err(std::io::ErrorKind::BrokenPipe.into()),
        };
        r.map_err(|_| BenchError::Agent {
            op: "stopped reading its input".into(),
            log_tail: tail(&self.log_text()),
        })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's JSON records so far.
    fn records(&self) -> Vec<serde_json::Value> {
        self.log_text()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The `apply` records so far.
    fn applies(&self) -> Vec<serde_json::Value> {
        self.records()
            .into_iter()
            .filter(|r| message(r) == Some("apply"))
            .collect()
    }

    fn check_running(&mut self) -> Result<(), BenchError> {
        if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
            return Err(BenchError::Agent {
                op: format!("exited early ({st})"),
                log_tail: tail(&self.log_text()),
            });
        }
        Ok(())
    }

    /// Polls the log until `done` says yes for a record (or refuses it with a reason).
    fn wait_log(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&serde_json::Value) -> Result<bool, String>,
    ) -> Result<(), BenchError> {
        let t0 = Instant::now();
        loop {
            for r in self.records() {
                match done(&r) {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(why) => {
                        return Err(BenchError::Agent {
                            op: format!("failed waiting {what}: {why}"),
                            log_tail: tail(&self.log_text()),
                        })
                    }
                }
            }
            self.check_running()?;
            if t0.elapsed() > limit {
                return Err(BenchError::Agent {
                    op: format!("took over {limit:?} {what}"),
                    log_tail: tail(&self.log_text()),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, as an operator stops it; its exit status and log.
    fn stop(mut self) -> Result<(std::process::ExitStatus, String), BenchError> {
        self.stdin = None;
        let mut child = self
            .child
            .take()
            .ok_or_else(|| BenchError::Refused("the agent was already stopped".into()))?;
        // SAFETY: signals our own child, which has not been waited for (its pid is still its).
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let t0 = Instant::now();
        let status = loop {
            let waited = child.try_wait().map_err(|source| BenchError::Io {
                op: "waiting for the agent".into(),
                source,
            })?;
            if let Some(st) = waited {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BenchError::Agent {
                    op: "did not stop within 30 s of SIGTERM".into(),
                    log_tail: tail(&self.log_text()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok((status, self.log_text()))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stdin = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The `batches_lost` of the collector's warnings among `records`.
fn warned_batches_lost(records: &[serde_json::Value]) -> u64 {
    records
        .iter()
        .filter(|r| r["level"] == "WARN")
        .filter_map(|r| r["batches_lost"].as_u64())
        .sum()
}

fn message(r: &serde_json::Value) -> Option<&str> {
    r["message"].as_str()
}

/// The last lines of a log, for an error.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The ruleset generation of one namespace (`NFT_MSG_GETGEN`), read over a socket of its own.
struct GenWatch(nf_tables::socket::NfSocket);

impl GenWatch {
    fn open(ns: &NetNs) -> Result<GenWatch, BenchError> {
        let _g = ns.enter().map_err(netns_err)?;
        if in_root_netns() {
            return Err(BenchError::Refused(
                "the generation socket would open in the host's namespace".into(),
            ));
        }
        nf_tables::socket::NfSocket::open()
            .map(GenWatch)
            .map_err(|source| BenchError::Nft {
                op: "opening a socket to read the ruleset generation".into(),
                source,
            })
    }

    fn get(&mut self) -> Result<u32, BenchError> {
        nf_tables::dump::generation(&mut self.0).map_err(|source| BenchError::Nft {
            op: "reading the ruleset generation".into(),
            source,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Traffic
// ---------------------------------------------------------------------------------------------

/// A listener in a namespace that accepts each connection and closes it at once, on a few
/// threads, until dropped. (The test bed's `TcpServer` keeps a thread per connection and every
/// peer's address: right for probes, not for thousands of connections a second.)
struct AcceptServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl AcceptServer {
    fn start(ns: &NetNs, port: u16) -> Result<AcceptServer, BenchError> {
        use socket2::{Domain, Socket, Type};
        let io = |op: &'static str| {
            move |source| BenchError::Io {
                op: op.into(),
                source,
            }
        };
        let listener = ns
            .run(|| -> std::io::Result<Socket> {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
                s.set_reuse_address(true)?;
                s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())?;
                s.listen(4096)?;
                // accept(2) honours SO_RCVTIMEO: the threads look at their stop flag.
                s.set_read_timeout(Some(Duration::from_millis(200)))?;
                Ok(s)
            })
            .map_err(netns_err)?
            .map_err(io("listening in b"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for i in 0..SERVER_THREADS {
            let l = listener.try_clone().map_err(io("sharing the listener"))?;
            let stop = stop.clone();
            let t = std::thread::Builder::new()
                .name(format!("flowbench-accept-{i}"))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match l.accept() {
                            // Closed at once: the client sees the end of the stream.
                            Ok((c, _)) => drop(c),
                            Err(e) if is_timeout(&e) => {}
                            Err(_) => std::thread::sleep(Duration::from_millis(10)),
                        }
                    }
                })
                .map_err(io("starting an accepting thread"))?;
            threads.push(t);
        }
        Ok(AcceptServer { stop, threads })
    }
}

impl Drop for AcceptServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// One connection: connect, wait for the server to close, close with a reset (`SO_LINGER` 0)
/// so that no TIME_WAIT keeps the port.
fn one_connection(dst: SocketAddr) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.set_linger(Some(Duration::ZERO))?;
    s.connect_timeout(&dst.into(), CONNECT_TIMEOUT)?;
    s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    let mut stream = TcpStream::from(s);
    let mut buf = [0u8; 16];
    loop {
        if stream.read(&mut buf)? == 0 {
            return Ok(());
        }
    }
}

/// A client thread: connections from namespace `ns` until `stop`.
fn client_loop(
    ns: &NetNs,
    dst: SocketAddr,
    stop: &AtomicBool,
    done: &AtomicU64,
    failed: &AtomicU64,
) -> Result<(), BenchError> {
    let _g = ns.enter().map_err(netns_err)?;
    if in_root_netns() {
        return Err(BenchError::Refused(
            "a client would run in the host's namespace".into(),
        ));
    }
    while !stop.load(Ordering::Relaxed) {
        match one_connection(dst) {
            Ok(()) => done.fetch_add(1, Ordering::Relaxed),
            Err(_) => failed.fetch_add(1, Ordering::Relaxed),
        };
    }
    Ok(())
}

/// What the flood's sender did.
#[derive(Debug, Clone, Copy)]
struct Sent {
    packets: u64,
    errors: u64,
    seconds: f64,
}

/// IPv4 header (20) + UDP header (8) + 18 bytes: the smallest Ethernet frame.
const FLOOD_PKT: usize = 46;
/// Packets per `sendmmsg`.
const FLOOD_BATCH: usize = 64;

/// One UDP datagram with its IPv4 header, as a raw socket with `IP_HDRINCL` sends it: the
/// kernel fills in the header checksum, the id and the total length (raw(7)); a zero UDP
/// checksum means none (RFC 768).
///
/// ```text
///  0      4      8             16     20           24     28
///  | 4500 | len  | id   | 4000  | 40 11 | csum  | src  | dst  | sport dport | len csum | data
/// ```
fn flood_packet(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> [u8; FLOOD_PKT] {
    let mut p = [0u8; FLOOD_PKT];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(FLOOD_PKT as u16).to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = 64; // TTL
    p[9] = libc::IPPROTO_UDP as u8;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&dport.to_be_bytes());
    p[24..26].copy_from_slice(&((FLOOD_PKT - 20) as u16).to_be_bytes());
    p
}

/// The source ports the flood cycles through.
fn flood_sport(n: u64) -> u16 {
    1024 + (n % (65536 - 1024)) as u16
}

/// Sends UDP from namespace `ns` (`src` → `dst`:`dport`) for `secs` at `pps` (0: as fast as
/// it can) through a raw socket, each packet's source port the next of [`flood_sport`].
fn flood_send(
    ns: &NetNs,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    dport: u16,
    secs: Duration,
    pps: u64,
) -> Result<Sent, BenchError> {
    let _g = ns.enter().map_err(netns_err)?;
    if in_root_netns() {
        return Err(BenchError::Refused(
            "the flood would start in the host's namespace".into(),
        ));
    }
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        return Err(BenchError::Io {
            op: "opening a raw socket in a".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_in is plain old data.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_addr.s_addr = u32::from(dst).to_be();
    // Heap buffers: the iovecs and headers point into them and must not move.
    let mut pkts: Box<[[u8; FLOOD_PKT]; FLOOD_BATCH]> =
        Box::new([flood_packet(src, dst, 0, dport); FLOOD_BATCH]);
    let mut iovs: Vec<libc::iovec> = pkts
        .iter_mut()
        .map(|p| libc::iovec {
            iov_base: p.as_mut_ptr().cast(),
            iov_len: FLOOD_PKT,
        })
        .collect();
    let mut hdrs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: msghdr is plain old data; the fields that matter are set next.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = (&mut addr as *mut libc::sockaddr_in).cast();
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let (mut sent, mut errors, mut n) = (0u64, 0u64, 0u64);
    let t0 = Instant::now();
    while t0.elapsed() < secs {
        for (i, iov) in iovs.iter().enumerate() {
            let sport = flood_sport(n + i as u64).to_be_bytes();
            // SAFETY: writes through the iovec's pointer into the boxed packet it points at,
            // which nothing else borrows while no sendmmsg runs.
            unsafe {
                let p = iov.iov_base.cast::<u8>();
                *p.add(20) = sport[0];
                *p.add(21) = sport[1];
            }
        }
        // SAFETY: hdrs holds FLOOD_BATCH valid headers whose name and iovecs point at live
        // buffers (addr, pkts) for the duration of the call.
        let r = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                FLOOD_BATCH as libc::c_uint,
                0,
            )
        };
        if r < 0 {
            errors += 1;
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        sent += r as u64;
        n += r as u64;
        if pps > 0 {
            let due = Duration::from_secs_f64(sent as f64 / pps as f64);
            if let Some(ahead) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
    Ok(Sent {
        packets: sent,
        errors,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

// ---------------------------------------------------------------------------------------------
// Reading the agent and the kernel
// ---------------------------------------------------------------------------------------------

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The agent's flow records, once one has been flushed at or after `end` (unix seconds), or
/// after two flush intervals.
fn records_after(sock: &Path, end: i64) -> Result<Vec<FlowRecord>, BenchError> {
    let t0 = Instant::now();
    let limit = Duration::from_secs(2 * FLUSH_SECS + 2);
    loop {
        let recs = flow_records(sock)?;
        if recs.iter().any(|r| r.end_time >= end) || t0.elapsed() > limit {
            return Ok(recs);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Every record the agent holds, as `felix-nft flows --json` reads them.
fn flow_records(sock: &Path) -> Result<Vec<FlowRecord>, BenchError> {
    let req = Request {
        follow: false,
        since: None,
        filter: Filter::default(),
    };
    let flows = |source| BenchError::Flows { source };
    let mut c = FlowClient::connect(sock, &req).map_err(flows)?;
    let mut out = Vec::new();
    while let Some(r) = c.next_reply().map_err(flows)? {
        if let Reply::Record(r) = r {
            out.push(*r);
        }
    }
    Ok(out)
}

/// The 1-minute load average.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime (ticks) of a `/proc/…/stat` line, and the name in it.
fn stat_ticks(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    // After ") ": state is field 3; utime and stime are fields 14 and 15 (proc(5)).
    let rest: Vec<&str> = stat.get(close + 2..)?.split(' ').collect();
    let u: u64 = rest.get(11)?.parse().ok()?;
    let s: u64 = rest.get(12)?.parse().ok()?;
    Some((comm, u + s))
}

fn proc_cpu_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_ticks(&s))
        .map_or(0, |(_, t)| t)
}

/// Each thread's (name, ticks) by thread id.
fn thread_ticks(pid: u32) -> BTreeMap<u32, (String, u64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in dir.flatten() {
        let Ok(tid) = t.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some(x) = std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|s| stat_ticks(&s))
        {
            out.insert(tid, x);
        }
    }
    out
}

/// CPU ms per thread name between two snapshots (threads of one name summed).
fn thread_delta_ms(
    a: &BTreeMap<u32, (String, u64)>,
    b: &BTreeMap<u32, (String, u64)>,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let ms = 1000.0 / clk_tck();
    for (tid, (name, t1)) in b {
        let t0 = a.get(tid).map_or(0, |(_, t)| *t);
        let d = t1.saturating_sub(t0);
        if d > 0 {
            *out.entry(name.clone()).or_insert(0.0) += d as f64 * ms;
        }
    }
    out
}

fn cpu_pct(t0: u64, t1: u64, wall: f64) -> f64 {
    t1.saturating_sub(t0) as f64 / clk_tck() / wall * 100.0
}

/// A `kB` field of `/proc/PID/status`.
fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Resets a process's `VmHWM` to its current RSS (proc(5) `clear_refs` 5).
fn reset_peak_rss(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// One interface's counters from `/proc/net/dev`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct NetDev {
    rx_packets: u64,
    rx_dropped: u64,
}

fn parse_netdev(text: &str, ifname: &str) -> Option<NetDev> {
    text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        if name.trim() != ifname {
            return None;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        Some(NetDev {
            rx_packets: *f.get(1)?,
            rx_dropped: *f.get(3)?,
        })
    })
}

/// `ifname`'s counters as namespace `ns` sees them.
fn netdev(ns: &NetNs, ifname: &str) -> Result<NetDev, BenchError> {
    let text = ns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/dev"))
        .map_err(netns_err)?
        .map_err(|source| BenchError::Io {
            op: "reading /proc/net/dev of the host namespace".into(),
            source,
        })?;
    parse_netdev(&text, ifname)
        .ok_or_else(|| BenchError::Refused(format!("{ifname} is not in /proc/net/dev")))
}

/// Summed `Drops` of the `NETLINK_NETFILTER` sockets among `inodes` in `/proc/net/netlink`.
fn parse_netlink_drops(text: &str, inodes: &[u64]) -> u64 {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let proto: u32 = f.get(1)?.parse().ok()?;
            let drops: u64 = f.get(8)?.parse().ok()?;
            let inode: u64 = f.get(9)?.parse().ok()?;
            (proto == libc::NETLINK_NETFILTER as u32 && inodes.contains(&inode)).then_some(drops)
        })
        .sum()
}

/// The drops of process `pid`'s netfilter netlink sockets, as namespace `ns` lists them.
fn netlink_drops(ns: &NetNs, pid: u32) -> Option<u64> {
    let inodes: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let text = ns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/netlink"))
        .ok()?
        .ok()?;
    Some(parse_netlink_drops(&text, &inodes))
}

/// The agent's `felix_nft_agent_flowlog_*` samples (labels kept in the name), scraped inside
/// the bed's host namespace; `None` when it serves none.
fn metrics(ns: &NetNs) -> Option<BTreeMap<String, f64>> {
    let text = ns
        .run(|| -> std::io::Result<String> {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, METRICS_PORT));
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .ok()?
        .ok()?;
    let m = parse_metrics(&text, "felix_nft_agent_flowlog_");
    (!m.is_empty()).then_some(m)
}

/// Each counter's increase from `m0` to `m1`; empty unless both were read.
fn metrics_delta(
    m0: Option<BTreeMap<String, f64>>,
    m1: Option<BTreeMap<String, f64>>,
) -> BTreeMap<String, f64> {
    match (m0, m1) {
        (Some(m0), Some(m1)) => m1
            .iter()
            .map(|(k, v)| (k.clone(), v - m0.get(k).copied().unwrap_or(0.0)))
            .collect(),
        _ => BTreeMap::new(),
    }
}

fn parse_metrics(text: &str, prefix: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn machine() -> Machine {
    // SAFETY: utsname is plain old data that uname fills.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is valid for writes.
    let ok = unsafe { libc::uname(&mut u) } == 0;
    let field = |f: &[libc::c_char]| -> String {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    Machine {
        kernel: if ok { field(&u.release) } else { String::new() },
        kernel_version: if ok { field(&u.version) } else { String::new() },
        arch: if ok { field(&u.machine) } else { String::new() },
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|v| v.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default(),
        mem_total_kb: meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0),
        nf_conntrack_max: std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_max")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        agent: String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

fn p90(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * 0.9).round() as usize]
}

impl ModeSummary {
    fn of(lives: &[&Life]) -> ModeSummary {
        let per = |f: &dyn Fn(&Life) -> f64| Spread::of(lives.iter().map(|l| f(l)).collect());
        let all = |f: &dyn Fn(&Life) -> &Vec<f64>| -> Vec<f64> {
            lives.iter().flat_map(|l| f(l).iter().copied()).collect()
        };
        let lat = all(&|l| &l.updates.latencies_ms);
        let ratio = |n: u64, d: u64| {
            if d == 0 {
                f64::NAN
            } else {
                n as f64 / d as f64
            }
        };
        let opt = |v: Vec<f64>| (!v.is_empty()).then(|| Spread::of(v));
        ModeSummary {
            conns_per_sec: per(&|l| l.load.conns_per_sec),
            load_agent_cpu_pct: per(&|l| l.load.agent_cpu_pct),
            update_latency_p90_ms: p90(lat.clone()),
            update_latency_ms: Spread::of(lat),
            update_timeouts: lives.iter().map(|l| l.updates.timeouts).sum(),
            agent_since_read_ms: Spread::of(all(&|l| &l.updates.agent_since_read_ms)),
            agent_duration_ms: Spread::of(all(&|l| &l.updates.agent_duration_ms)),
            flows_src_coverage: opt(lives
                .iter()
                .filter_map(|l| l.flows.as_ref())
                .map(|f| ratio(f.src_started, f.connections_made))
                .collect()),
            flows_dst_coverage: opt(lives
                .iter()
                .filter_map(|l| l.flows.as_ref())
                .map(|f| ratio(f.dst_started, f.connections_made))
                .collect()),
            flood_sent_pps: per(&|l| l.flood.sent_pps),
            flood_arrived_pps: per(&|l| l.flood.arrived_pps),
            flood_agent_cpu_pct: per(&|l| l.flood.agent_cpu_pct),
            flood_agent_cpu_pct_with_drain: per(&|l| l.flood.agent_cpu_pct_with_drain),
            flood_agent_vmhwm_kb: lives.iter().filter_map(|l| l.flood.agent_vmhwm_kb).max(),
            ready_agent_vmhwm_kb: lives.iter().filter_map(|l| l.agent_vmhwm_ready_kb).max(),
            flood_denied_counted_ratio: opt(lives
                .iter()
                .filter_map(|l| Some(ratio(l.flood.denied_counted?, l.flood.arrived)))
                .collect()),
            flood_netlink_drops: opt(lives
                .iter()
                .filter_map(|l| l.flood.netlink_drops.map(|d| d as f64))
                .collect()),
            flood_warned_batches_lost: lives.iter().map(|l| l.flood.warned_batches_lost).sum(),
            load_warned_batches_lost: lives.iter().map(|l| l.load.warned_batches_lost).sum(),
        }
    }
}

impl FlowlogsReport {
    fn new(opts: &FlowlogsOptions, machine: Machine, lives: Vec<Life>) -> FlowlogsReport {
        let of =
            |m: Mode| ModeSummary::of(&lives.iter().filter(|l| l.mode == m).collect::<Vec<_>>());
        let (off, on) = (of(Mode::Off), of(Mode::On));
        let mut notes = vec![
            format!(
                "connections: {} client threads in a, each connect → wait for b's close → close \
                 with a reset; {} s warm-up before each {} s window; a listener in b accepting on \
                 {SERVER_THREADS} threads",
                opts.threads.max(1),
                WARMUP.as_secs(),
                opts.seconds.max(1)
            ),
            format!(
                "IP set member add: one every {} ms during the load, into a set of b's first \
                 ingress policy; latency = stdin write → NFT_MSG_GETGEN shows a new generation \
                 (polled every 200 µs); the agent's own numbers from its `apply` log lines",
                UPDATE_EVERY.as_millis()
            ),
            format!(
                "flood: raw socket in a, UDP {A} → {B}:{DENIED_PORT}, source port cycling over \
                 1024–65535, sendmmsg batches of {FLOOD_BATCH}; arrived = rx_packets of a's host \
                 veth; agent CPU from /proc/PID/stat utime+stime; VmHWM reset (clear_refs 5) \
                 just before the flood; drain = {} s after it",
                DRAIN.as_secs()
            ),
            format!(
                "flow logs on: FlowLogsLocalReporter=Enabled, FlowLogsFlushInterval={FLUSH_SECS} \
                 (conntrack's counters are polled every min(flush, 5 s), as with the default \
                 300 s); every agent serves Prometheus metrics on 127.0.0.1:{METRICS_PORT} of the \
                 bed's host namespace"
            ),
        ];
        if lives
            .iter()
            .all(|l| l.flood.collector_metrics.is_empty() && l.load.collector_metrics.is_empty())
        {
            notes.push(
                "the agent serves no felix_nft_agent_flowlog_* metrics: collector drops are \
                 read from its warnings, its netlink sockets' drops and the flows' counts"
                    .into(),
            );
        }
        FlowlogsReport {
            machine,
            scale: opts.scale,
            seconds: opts.seconds.max(1),
            reps: opts.reps.max(1),
            threads: opts.threads.max(1),
            flood_target_pps: opts.flood_pps,
            flush_interval_secs: FLUSH_SECS,
            conns_ratio_on_off: on.conns_per_sec.median / off.conns_per_sec.median,
            conns_ratio_target: 0.8,
            update_latency_ratio_on_off: on.update_latency_ms.median / off.update_latency_ms.median,
            update_latency_ratio_target: 1.10,
            lives,
            off,
            on,
            notes,
        }
    }

    /// The table, Markdown.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let m = &self.machine;
        let _ = writeln!(
            s,
            "bench flowlogs: scale {} + 2 workloads (a → b), {} lives per mode alternating off/on, \
             {} s windows, {} client threads.\nMachine: {} CPUs ({}), {:.1} GB; kernel {} {}.\n",
            self.scale,
            self.reps,
            self.seconds,
            self.threads,
            m.cpus,
            m.cpu_model,
            m.mem_total_kb as f64 / 1048576.0,
            m.kernel,
            m.arch
        );
        let (off, on) = (&self.off, &self.on);
        let spread = |x: &Spread, d: usize| {
            if x.n == 0 {
                "–".to_string()
            } else {
                format!("**{:.d$}** ({:.d$}–{:.d$})", x.median, x.min, x.max, d = d)
            }
        };
        let verdict = |ok: bool| if ok { "yes" } else { "NO" };
        let _ = writeln!(
            s,
            "| measure | flow logs off | flow logs on | on ÷ off | target |\n|---|---:|---:|---:|---|"
        );
        let _ = writeln!(
            s,
            "| new TCP connections/s, median of lives (min–max) | {} | {} | {:.2}× | ≥ {:.1}×: {} |",
            spread(&off.conns_per_sec, 0),
            spread(&on.conns_per_sec, 0),
            self.conns_ratio_on_off,
            self.conns_ratio_target,
            verdict(self.conns_ratio_on_off >= self.conns_ratio_target)
        );
        let _ = writeln!(
            s,
            "| agent CPU during the load, % of a core | {} | {} | | |",
            spread(&off.load_agent_cpu_pct, 1),
            spread(&on.load_agent_cpu_pct, 1)
        );
        let _ = writeln!(
            s,
            "| IP set member add → in the kernel, ms, median of all adds (min–max) | {} | {} | {:.2}× | ≤ {:.2}×: {} |",
            spread(&off.update_latency_ms, 2),
            spread(&on.update_latency_ms, 2),
            self.update_latency_ratio_on_off,
            self.update_latency_ratio_target,
            verdict(self.update_latency_ratio_on_off <= self.update_latency_ratio_target)
        );
        let _ = writeln!(
            s,
            "| … p90 ms; adds; timed out | {:.2}; {}; {} | {:.2}; {}; {} | {:.2}× | |",
            off.update_latency_p90_ms,
            off.update_latency_ms.n,
            off.update_timeouts,
            on.update_latency_p90_ms,
            on.update_latency_ms.n,
            on.update_timeouts,
            on.update_latency_p90_ms / off.update_latency_p90_ms
        );
        let _ = writeln!(
            s,
            "| … the agent's apply log: since_read_ms | {} | {} | {:.2}× | |",
            spread(&off.agent_since_read_ms, 2),
            spread(&on.agent_since_read_ms, 2),
            on.agent_since_read_ms.median / off.agent_since_read_ms.median
        );
        let _ = writeln!(
            s,
            "| … the agent's apply log: duration_ms | {} | {} | {:.2}× | |",
            spread(&off.agent_duration_ms, 2),
            spread(&on.agent_duration_ms, 2),
            on.agent_duration_ms.median / off.agent_duration_ms.median
        );
        let pct = |x: &Option<Spread>| {
            x.as_ref().map_or("–".to_string(), |x| {
                format!(
                    "{:.1} % ({:.1}–{:.1})",
                    x.median * 100.0,
                    x.min * 100.0,
                    x.max * 100.0
                )
            })
        };
        let _ = writeln!(
            s,
            "| pair's connections the flows counted, src / dst side | – | {} / {} | | |",
            pct(&on.flows_src_coverage),
            pct(&on.flows_dst_coverage)
        );
        let _ = writeln!(
            s,
            "| collector warnings during the load: batches_lost (sum, lower bound) | {} | {} | | |",
            off.load_warned_batches_lost, on.load_warned_batches_lost
        );
        let _ = writeln!(
            s,
            "\nDenied UDP flood, {} s per life (target {} pps; medians of lives, min–max):\n",
            self.seconds,
            if self.flood_target_pps == 0 {
                "none".to_string()
            } else {
                self.flood_target_pps.to_string()
            }
        );
        let _ = writeln!(
            s,
            "| measure | flow logs off | flow logs on |\n|---|---:|---:|"
        );
        let rows: [(&str, &Spread, &Spread, usize); 4] = [
            (
                "sent, packets/s",
                &off.flood_sent_pps,
                &on.flood_sent_pps,
                0,
            ),
            (
                "reached the node (a's host veth), packets/s",
                &off.flood_arrived_pps,
                &on.flood_arrived_pps,
                0,
            ),
            (
                "agent CPU during the flood, % of a core",
                &off.flood_agent_cpu_pct,
                &on.flood_agent_cpu_pct,
                1,
            ),
            (
                "agent CPU, flood + 3 s after, % of a core",
                &off.flood_agent_cpu_pct_with_drain,
                &on.flood_agent_cpu_pct_with_drain,
                1,
            ),
        ];
        for (label, a, b, d) in rows {
            let _ = writeln!(s, "| {label} | {} | {} |", spread(a, d), spread(b, d));
        }
        let mb = |k: Option<u64>| k.map_or("–".into(), |k| format!("{:.1}", k as f64 / 1024.0));
        let _ = writeln!(
            s,
            "| agent peak RSS MB over the flood (VmHWM reset before; max of lives) | {} | {} |",
            mb(off.flood_agent_vmhwm_kb),
            mb(on.flood_agent_vmhwm_kb)
        );
        let _ = writeln!(
            s,
            "| agent peak RSS MB once in sync (VmHWM since start; max) | {} | {} |",
            mb(off.ready_agent_vmhwm_kb),
            mb(on.ready_agent_vmhwm_kb)
        );
        let _ = writeln!(
            s,
            "| denied packets counted in flows ÷ reached the node | – | {} |",
            pct(&on.flood_denied_counted_ratio)
        );
        let drops = |x: &Option<Spread>| {
            x.as_ref().map_or("–".to_string(), |x| {
                format!("{:.0} ({:.0}–{:.0})", x.median, x.min, x.max)
            })
        };
        let _ = writeln!(
            s,
            "| agent's netfilter netlink sockets: drops (kernel could not queue) | {} | {} |",
            drops(&off.flood_netlink_drops),
            drops(&on.flood_netlink_drops)
        );
        let _ = writeln!(
            s,
            "| collector warnings: batches_lost (sum, lower bound) | {} | {} |",
            off.flood_warned_batches_lost, on.flood_warned_batches_lost
        );
        let _ = writeln!(s, "\nPer life:\n");
        let _ = writeln!(
            s,
            "| life | load avg | conns/s | failed | agent CPU % | adds ms median | flood sent pps | reached pps | agent CPU % flood (+drain) | VmHWM MB flood | counted / reached | nl drops | busiest agent threads, flood + drain (ms) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        for l in &self.lives {
            let f = &l.flood;
            let mut threads: Vec<(&String, &f64)> = f.thread_cpu_ms.iter().collect();
            threads.sort_by(|a, b| b.1.total_cmp(a.1));
            let busiest: Vec<String> = threads
                .iter()
                .take(4)
                .map(|(n, ms)| format!("{n} {ms:.0}"))
                .collect();
            let _ = writeln!(
                s,
                "| {} {} | {:.1}→{:.1} | {:.0} | {} | {:.1} | {:.2} | {:.0} | {:.0} | {:.1} ({:.1}) | {} | {} | {} | {} |",
                l.mode.name(),
                l.rep + 1,
                l.loadavg_start,
                l.loadavg_end,
                l.load.conns_per_sec,
                l.load.failed,
                l.load.agent_cpu_pct,
                median(l.updates.latencies_ms.clone()),
                f.sent_pps,
                f.arrived_pps,
                f.agent_cpu_pct,
                f.agent_cpu_pct_with_drain,
                mb(f.agent_vmhwm_kb),
                f.denied_counted.map_or("–".into(), |c| format!("{c} / {}", f.arrived)),
                f.netlink_drops.map_or("–".into(), |d| d.to_string()),
                busiest.join(", ")
            );
        }
        for l in &self.lives {
            for (window, m) in [
                ("connection load", &l.load.collector_metrics),
                ("flood", &l.flood.collector_metrics),
            ] {
                if m.is_empty() {
                    continue;
                }
                let parts: Vec<String> = m
                    .iter()
                    .filter(|(k, v)| **v != 0.0 && !k.contains("timestamp"))
                    .map(|(k, v)| {
                        format!("{} {v}", k.trim_start_matches("felix_nft_agent_flowlog_"))
                    })
                    .collect();
                let _ = writeln!(
                    s,
                    "- {} {}: collector metrics over the {window}: {}",
                    l.mode.name(),
                    l.rep + 1,
                    if parts.is_empty() {
                        "all 0".into()
                    } else {
                        parts.join(", ")
                    }
                );
            }
        }
        for n in &self.notes {
            let _ = writeln!(s, "- note: {n}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_name_and_cpu() {
        let line = "4242 (flows-nflog) S 1 4242 4242 0 -1 4194560 100 0 0 0 25 17 0 0 20 0 9 0 \
                    123 456 789";
        assert_eq!(stat_ticks(line), Some(("flows-nflog".into(), 42)));
        // A name with spaces and parentheses.
        let line = "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 2 3";
        assert_eq!(stat_ticks(line), Some(("a (b) c".into(), 7)));
        assert_eq!(stat_ticks("garbage"), None);
    }

    #[test]
    fn netdev_and_netlink_are_parsed() {
        let dev = "Inter-|   Receive                                                |  Transmit\n \
                   face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n\
                   \x20 lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n\
                   cali1234567890a: 9000 150 0 7 0 0 0 0 100 2 0 0 0 0 0 0\n";
        assert_eq!(
            parse_netdev(dev, "cali1234567890a"),
            Some(NetDev {
                rx_packets: 150,
                rx_dropped: 7
            })
        );
        assert_eq!(parse_netdev(dev, "eth0"), None);
        let nl = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
                  ffff8a0c0b1c0000 12  4242       00000000 0        0        0     2        17       555\n\
                  ffff8a0c0b1c0800 12  4243       00000006 0        0        0     2        3        556\n\
                  ffff8a0c0b1c1000 0   4242       00000000 0        0        0     2        9        557\n";
        assert_eq!(parse_netlink_drops(nl, &[555, 556, 557]), 20);
        assert_eq!(parse_netlink_drops(nl, &[556]), 3);
    }

    #[test]
    fn metrics_keep_labels_in_the_name() {
        let text = "HTTP/1.0 200 OK\r\n\r\n# HELP x\nfelix_nft_agent_flowlog_queue_drops_total 3\n\
                    felix_nft_agent_flowlog_aggregator_drops_total{reason=\"flow_table_full\"} 2\n\
                    felix_nft_calls 9\n";
        let m = parse_metrics(text, "felix_nft_agent_flowlog_");
        assert_eq!(m.len(), 2);
        assert_eq!(m["felix_nft_agent_flowlog_queue_drops_total"], 3.0);
        assert_eq!(
            m["felix_nft_agent_flowlog_aggregator_drops_total{reason=\"flow_table_full\"}"],
            2.0
        );
    }

    #[test]
    fn flood_packets_are_udp_with_the_given_ports() {
        let p = flood_packet(A, B, 40000, DENIED_PORT);
        assert_eq!(p[0], 0x45);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, FLOOD_PKT);
        assert_eq!(p[9], 17);
        assert_eq!(&p[12..16], &A.octets());
        assert_eq!(&p[16..20], &B.octets());
        assert_eq!(u16::from_be_bytes([p[20], p[21]]), 40000);
        assert_eq!(u16::from_be_bytes([p[22], p[23]]), DENIED_PORT);
        assert_eq!(u16::from_be_bytes([p[24], p[25]]) as usize, FLOOD_PKT - 20);
        // Every source port from 1024 up once before any repeats.
        assert_eq!(flood_sport(0), 1024);
        assert_eq!(flood_sport(64511), 65535);
        assert_eq!(flood_sport(64512), 1024);
    }

    #[test]
    fn spreads_and_percentiles() {
        let s = Spread::of(vec![3.0, 1.0, f64::NAN, 2.0]);
        assert_eq!((s.n, s.median, s.min, s.max), (3, 2.0, 1.0, 3.0));
        assert_eq!(p90((1..=10).map(f64::from).collect()), 9.0);
        assert!(p90(vec![]).is_nan());
    }

    #[test]
    fn the_adds_go_to_a_hash_ip_set_on_the_pair_s_path() {
        // The pair sits behind the first generated endpoint's policies; the adds go to set 0.
        for scale in [super::super::spot::SPOT_SCALE, Scale::SMALL, Scale::MID] {
            let w = Workload::generate(scale);
            let first = &w.endpoints[0];
            assert!(first.ingress.iter().all(|&p| w.policies[p].inbound));
            assert!(!w.sets[0].net, "{scale}: set 0 is hash:ip");
            assert!(
                first
                    .ingress
                    .iter()
                    .any(|&p| w.policies[p].rules.iter().any(|r| r.set == 0)),
                "{scale}: b's ingress policies use set 0"
            );
            // No generated rule allows the pair's port: only the pair's policy decides it.
            assert!(w
                .policies
                .iter()
                .all(|p| p.rules.iter().all(|r| !r.ports.contains(&PAIR_PORT))));
        }
    }
}
