//! `felix-nft bench compare --scale cluster[:N]`: one node of a VXLAN cluster learning N remote
//! nodes (a VTEP and a /26 block each) at its first sync, then one node joining, one leaving and
//! one VTEP MAC changing — felix-nft through the agent's own loop ([`Driver`] over
//! [`RealKernel`], fed the messages Felix's calculation graph sends), and the same device,
//! neighbours, routes and FDB entries written by `ip -batch` + `bridge -batch`.
//!
//! Every repetition runs in a fresh namespace with an underlay veth (`eth0`, 172.16.0.1/16) as the
//! VXLAN parent. After each first sync and at the end, what the kernel holds on `vxlan.calico` is
//! read with `ip -j` / `bridge -j` (oracles, not timed) and compared entry by entry with what the
//! generator expects. felix-nft's netlink requests per operation come from the syncers' counters.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde_json::{json, Value};

use super::report::{finish_all, fmt_ms, wall_cell, wall_median, Results};
use super::run::{self, Sample, Tool};
use super::{create_dir, fresh_ns, output, which, write, BenchError, BenchNs};
use felix_api::ToDataplane;
use felix_nft::dataplane::driver::{Driver, LoopOptions};
use felix_nft::dataplane::kernel::RealKernel;
use felix_nft::dataplane::Dataplane;
use rtnl::monitor::{self, IfaceEvent, MonitorConfig};
use rtnl::netns::NetNs;
use rtnl::RtnlHandle;

/// The backends of the cluster scale, in table order.
pub const BACKENDS: [&str; 2] = ["felix-nft", "ip-batch"];

/// Rows of the table, in order.
pub const ROWS: [&str; 4] = ["full", "add_vtep", "del_vtep", "mac_vtep"];

fn row_label(op: &str) -> &'static str {
    match op {
        "full" => "first sync: device + N neighbours, FDB entries, routes",
        "add_vtep" => "one node joins (VTEP + block)",
        "del_vtep" => "one node leaves (block + VTEP)",
        "mac_vtep" => "one VTEP's MAC changes",
        _ => "?",
    }
}

/// The device Felix names and this node's place in the cluster.
const DEVICE: &str = "vxlan.calico";
const UNDERLAY: &str = "eth0";
const LOCAL: usize = 0;
const VNI: u32 = 4096;
const PORT: u16 = 4789;
const POOL: &str = "10.128.0.0/14";

/// Options of the cluster comparison.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Remote nodes at the first sync.
    pub nodes: usize,
    /// First syncs (fresh namespaces) per backend.
    pub reps: usize,
    /// Rounds of the three updates per repetition.
    pub inc: usize,
    pub out_dir: PathBuf,
    /// Only these backends (default: both).
    pub only: Option<Vec<String>>,
}

impl ClusterOptions {
    /// 1,000 remote nodes unless `spec` is `cluster:N`; `None` when `spec` is not a cluster scale.
    pub fn parse(spec: &str, out_dir: PathBuf) -> Option<Result<ClusterOptions, String>> {
        let rest = spec.strip_prefix("cluster")?;
        let nodes = match rest.strip_prefix(':') {
            None if rest.is_empty() => Ok(1000),
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=60_000).contains(n))
                .ok_or_else(|| format!("cluster scale: {n:?} is not a node count in 1..=60000")),
            None => return None,
        };
        Some(nodes.map(|nodes| ClusterOptions {
            nodes,
            reps: 5,
            inc: 5,
            out_dir,
            only: None,
        }))
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// The node's underlay address: 172.16.0.1 upwards.
pub(super) fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 1)) + i as u32)
}

/// The node's IPAM block (/26) and VTEP tunnel address (the block's first address).
fn block(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + 64 * i as u32)
}

/// A locally administered unicast MAC, unique per node and generation.
fn mac(i: usize, gen: u8) -> String {
    format!(
        "66:{gen:02x}:{:02x}:{:02x}:{:02x}:01",
        (i >> 16) as u8,
        (i >> 8) as u8,
        i as u8
    )
}

/// What `vxlan.calico` must hold: remote node → its current MAC.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Held {
    remotes: BTreeMap<usize, String>,
}

/// The entries on the device as sets of comparable strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entries {
    /// "dst via gateway".
    routes: BTreeSet<String>,
    /// "ip mac".
    neigh: BTreeSet<String>,
    /// "mac dst".
    fdb: BTreeSet<String>,
    blackhole: bool,
    device: bool,
}

impl Held {
    fn expected(&self) -> Entries {
        let mut e = Entries {
            blackhole: true,
            device: true,
            ..Entries::default()
        };
        for (&i, m) in &self.remotes {
            e.routes.insert(format!("{}/26 via {}", block(i), block(i)));
            e.neigh.insert(format!("{} {m}", block(i)));
            e.fdb.insert(format!("{m} {}", node_ip(i)));
        }
        e
    }
}

fn vtep(i: usize, m: &str) -> Value {
    json!({"vtep_update": {"node": node_name(i), "mac": m,
        "ipv4_addr": block(i).to_string(), "parent_device_ip": node_ip(i).to_string()}})
}

fn route(i: usize) -> Value {
    json!({"route_update": {
        "types": if i == LOCAL { "LOCAL_WORKLOAD" } else { "REMOTE_WORKLOAD" },
        "ip_pool_type": "VXLAN", "dst": format!("{}/26", block(i)),
        "dst_node_name": node_name(i), "dst_node_ip": node_ip(i).to_string()}})
}

fn decode(vs: Vec<Value>) -> Result<Vec<ToDataplane>, BenchError> {
    vs.into_iter()
        .map(|v| {
            felix_api::json::decode_value::<ToDataplane>(v)
                .map_err(|e| BenchError::Refused(format!("generated message: {e}")))
        })
        .collect()
}

/// One update, for both backends.
#[derive(Debug, Clone)]
struct Step {
    op: &'static str,
    msgs: Vec<ToDataplane>,
    ip: PathBuf,
    bridge: PathBuf,
    /// Lines in the two batch files (the baseline's requests).
    lines: usize,
}

struct Inputs {
    full_msgs: Vec<ToDataplane>,
    full_ip: PathBuf,
    full_bridge: PathBuf,
    full_lines: usize,
    after_full: Entries,
    rounds: Vec<Vec<Step>>,
    after_rounds: Entries,
}

fn neigh_line(i: usize, m: &str) -> String {
    format!(
        "neigh replace {} lladdr {m} dev {DEVICE} nud permanent",
        block(i)
    )
}
fn route_line(i: usize) -> String {
    format!(
        "route replace {}/26 via {} dev {DEVICE} onlink",
        block(i),
        block(i)
    )
}
fn fdb_line(i: usize, m: &str) -> String {
    format!(
        "fdb replace {m} dev {DEVICE} dst {} self permanent",
        node_ip(i)
    )
}

fn build_inputs(opts: &ClusterOptions) -> Result<Inputs, BenchError> {
    let dir = opts.out_dir.join("inputs");
    create_dir(&dir)?;
    let n = opts.nodes;
    let mut held = Held::default();
    // What Felix sends a node at start: the pool, every VTEP (its own included), then the
    // blocks (VTEP adds before route adds, as its event sequencer orders them).
    let mut msgs = vec![json!({"ipam_pool_update": {"id": "bench-pool",
        "pool": {"cidr": POOL, "masquerade": true, "vxlan_mode": "Always"}}})];
    for i in 0..=n {
        msgs.push(vtep(i, &mac(i, 0)));
    }
    for i in 0..=n {
        msgs.push(route(i));
    }
    msgs.push(json!({"in_sync": {}}));
    let mut ip = vec![
        format!(
            "link add {DEVICE} address {} type vxlan id {VNI} dev {UNDERLAY} local {} dstport {PORT} nolearning",
            mac(LOCAL, 0),
            node_ip(LOCAL)
        ),
        format!("link set {DEVICE} up"),
        format!("addr add {}/32 dev {DEVICE}", block(LOCAL)),
    ];
    let mut bridge = Vec::new();
    for i in 1..=n {
        let m = mac(i, 0);
        ip.push(neigh_line(i, &m));
        bridge.push(fdb_line(i, &m));
        held.remotes.insert(i, m);
    }
    for i in 1..=n {
        ip.push(route_line(i));
    }
    ip.push(format!(
        "route replace blackhole {}/26 proto 80",
        block(LOCAL)
    ));
    let full_ip = dir.join("cluster-full.ip");
    let full_bridge = dir.join("cluster-full.bridge");
    write(&full_ip, &(ip.join("\n") + "\n"))?;
    write(&full_bridge, &(bridge.join("\n") + "\n"))?;
    let full_lines = ip.len() + bridge.len();
    let after_full = held.expected();

    let mut rounds = Vec::new();
    for r in 0..=opts.inc {
        let mut steps = Vec::new();
        // A new node beyond the first N joins.
        let j = n + 1 + r;
        let m = mac(j, 0);
        steps.push((
            "add_vtep",
            vec![vtep(j, &m), route(j)],
            vec![neigh_line(j, &m), route_line(j)],
            vec![fdb_line(j, &m)],
        ));
        held.remotes.insert(j, m);
        // One of the first N leaves (RouteRemoves before VTEPRemoves).
        let k = 1 + r;
        let old = held.remotes.remove(&k).unwrap_or_default();
        steps.push((
            "del_vtep",
            vec![
                json!({"route_remove": {"dst": format!("{}/26", block(k))}}),
                json!({"vtep_remove": {"node": node_name(k)}}),
            ],
            vec![
                format!("route del {}/26 via {} dev {DEVICE}", block(k), block(k)),
                format!("neigh del {} dev {DEVICE}", block(k)),
            ],
            vec![format!("fdb del {old} dev {DEVICE} self")],
        ));
        // Another one's MAC changes: Felix sends Remove then Update.
        let c = n - r;
        let old = held.remotes.get(&c).cloned().unwrap_or_default();
        let new = mac(c, 1 + r as u8);
        steps.push((
            "mac_vtep",
            vec![
                json!({"vtep_remove": {"node": node_name(c)}}),
                vtep(c, &new),
            ],
            vec![neigh_line(c, &new)],
            vec![
                format!("fdb del {old} dev {DEVICE} self"),
                fdb_line(c, &new),
            ],
        ));
        held.remotes.insert(c, new);
        let mut out = Vec::new();
        for (op, msgs, ip, bridge) in steps {
            let stem = format!("cluster-r{r}-{op}");
            let s = Step {
                op,
                msgs: decode(msgs)?,
                ip: dir.join(format!("{stem}.ip")),
                bridge: dir.join(format!("{stem}.bridge")),
                lines: ip.len() + bridge.len(),
            };
            write(&s.ip, &(ip.join("\n") + "\n"))?;
            write(&s.bridge, &(bridge.join("\n") + "\n"))?;
            out.push(s);
        }
        rounds.push(out);
    }
    Ok(Inputs {
        full_msgs: decode(msgs)?,
        full_ip,
        full_bridge,
        full_lines,
        after_full,
        rounds,
        after_rounds: held.expected(),
    })
}

/// The scratch node's underlay: a veth whose `eth0` end holds the node's address, both ends up.
pub(super) async fn underlay(ns: &NetNs) -> Result<(), BenchError> {
    let rtnl = |op: &'static str| {
        move |source| BenchError::Rtnl {
            op: op.into(),
            source: Box::new(source),
        }
    };
    let h = RtnlHandle::connect(Some(ns)).map_err(rtnl("connecting to rtnetlink"))?;
    use rtnl::link;
    link::create_veth(&h, UNDERLAY, "eth0p")
        .await
        .map_err(rtnl("creating the underlay veth"))?;
    for l in ["lo", UNDERLAY, "eth0p"] {
        link::set_up(&h, l, true)
            .await
            .map_err(rtnl("setting the underlay up"))?;
    }
    let addr = IpNet::new(node_ip(LOCAL).into(), 16)
        .map_err(|e| BenchError::Refused(format!("underlay address: {e}")))?;
    link::add_address(&h, UNDERLAY, addr)
        .await
        .map_err(rtnl("adding the underlay address"))?;
    Ok(())
}

/// Reads what `vxlan.calico` holds with `ip -j` and `bridge -j` (the oracles).
fn read_entries(ns: &str) -> Result<Entries, BenchError> {
    let json = |argv: &[&str]| -> Result<Value, BenchError> {
        let out = output(argv)?;
        if !out.status.success() {
            // No device: nothing on it.
            return Ok(Value::Array(Vec::new()));
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(Vec::new())))
    };
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let mut e = Entries::default();
    let links = json(&["ip", "-n", ns, "-j", "link", "show", DEVICE])?;
    e.device = !list(&links).is_empty();
    for r in list(&json(&[
        "ip", "-n", ns, "-j", "-4", "route", "show", "dev", DEVICE,
    ])?) {
        e.routes
            .insert(format!("{} via {}", s(&r["dst"]), s(&r["gateway"])));
    }
    let main = json(&[
        "ip",
        "-n",
        ns,
        "-j",
        "-4",
        "route",
        "show",
        "type",
        "blackhole",
    ])?;
    e.blackhole = list(&main)
        .iter()
        .any(|r| s(&r["dst"]) == format!("{}/26", block(LOCAL)));
    for n in list(&json(&[
        "ip", "-n", ns, "-j", "-4", "neigh", "show", "dev", DEVICE,
    ])?) {
        let permanent = list(&n["state"]).iter().any(|x| x == "PERMANENT");
        if permanent {
            e.neigh
                .insert(format!("{} {}", s(&n["dst"]), s(&n["lladdr"])));
        }
    }
    for f in list(&json(&[
        "bridge", "-n", ns, "-j", "fdb", "show", "dev", DEVICE,
    ])?) {
        let permanent = s(&f["state"]) == "permanent";
        if permanent && f.get("dst").is_some() {
            e.fdb.insert(format!("{} {}", s(&f["mac"]), s(&f["dst"])));
        }
    }
    Ok(e)
}

/// Compares what a backend holds with what the generator expects; one check line per kind.
fn compare_entries(who: &str, when: &str, got: &Entries, want: &Entries) -> Vec<(String, bool)> {
    let diff = |a: &BTreeSet<String>, b: &BTreeSet<String>| {
        let missing = b.difference(a).count();
        let extra = a.difference(b).count();
        (missing, extra)
    };
    let mut out = vec![(
        format!("{who} {when}: {DEVICE} present, blackhole for the local block"),
        got.device == want.device && got.blackhole == want.blackhole,
    )];
    for (what, a, b) in [
        ("routes via the device", &got.routes, &want.routes),
        ("permanent neighbours", &got.neigh, &want.neigh),
        ("FDB entries", &got.fdb, &want.fdb),
    ] {
        let (missing, extra) = diff(a, b);
        out.push((
            format!(
                "{who} {when}: {} {what}, expected {} (missing {missing}, unexpected {extra})",
                a.len(),
                b.len()
            ),
            missing == 0 && extra == 0,
        ));
    }
    out
}

/// Netlink requests felix-nft sent for one operation, from the syncers' counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Requests {
    /// Route, neighbour and FDB writes (RTM_NEWROUTE/DELROUTE, RTM_NEWNEIGH/DELNEIGH).
    pub writes: u64,
    /// Single-link lookups (RTM_GETLINK by name).
    pub link_gets: u64,
    /// Dumps: route + link dumps, neighbour dumps, FDB dumps.
    pub dumps: u64,
}

fn requests(k: &RealKernel) -> Requests {
    let [r4, r6] = k.route_stats();
    let n = k.neigh_stats();
    let v = k.vxlan_stats();
    Requests {
        writes: r4.writes + r6.writes + n.writes + v.fdb_writes,
        link_gets: r4.link_gets + r6.link_gets + n.link_gets + v.link_gets,
        dumps: r4.dumps + r6.dumps + n.dumps + v.fdb_dumps,
    }
}

impl Requests {
    fn since(self, before: Requests) -> Requests {
        Requests {
            writes: self.writes - before.writes,
            link_gets: self.link_gets - before.link_gets,
            dumps: self.dumps - before.dumps,
        }
    }
}

/// Wall time and the process's CPU (the loop's and rtnetlink's threads) around `f`.
pub(super) async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, Sample) {
    let cpu = || {
        // SAFETY: plain old data filled by getrusage for this process.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: ru is valid for writes.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let ms = |tv: libc::timeval| tv.tv_sec as f64 * 1e3 + tv.tv_usec as f64 / 1e3;
        (ms(ru.ru_utime), ms(ru.ru_stime))
    };
    let (u0, s0) = cpu();
    let t0 = Instant::now();
    let out = f.await;
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (u1, s1) = cpu();
    (
        out,
        Sample {
            wall_ms,
            user_ms: u1 - u0,
            sys_ms: s1 - s0,
            ..Sample::default()
        },
    )
}

/// What one felix-nft repetition measured.
#[derive(Default)]
struct FelixRep {
    samples: Vec<(&'static str, Sample, Requests)>,
    /// The apply the daemon runs when the monitor reports the new device (not in `full`).
    echo: Option<Sample>,
    after_full: Entries,
    after_rounds: Entries,
}

/// Feeds the monitor's pending events to the dataplane, as the loop does between applies, and
/// applies what they made dirty (not timed as an operation).
pub(super) async fn settle(
    d: &mut Driver<RealKernel>,
    mon: &mut monitor::EventReceiver,
) -> Result<Option<Sample>, BenchError> {
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(30), mon.recv()).await {
        d.dp.on_iface(&ev);
    }
    if !d.dp.dirty().any() {
        return Ok(None);
    }
    let (r, s) = timed(d.apply()).await;
    r.map_err(|e| BenchError::Refused(format!("apply: {e}")))?;
    Ok(Some(s))
}

/// Feeds `msgs` to the dataplane, then applies what they made dirty (one batch of the loop).
pub(super) async fn update_and_apply(
    d: &mut Driver<RealKernel>,
    msgs: &[ToDataplane],
) -> Result<(), BenchError> {
    for m in msgs {
        d.dp.on_update(m)
            .map_err(|e| BenchError::Refused(format!("update rejected: {e}")))?;
    }
    d.apply()
        .await
        .map_err(|e| BenchError::Refused(format!("apply: {}", felix_nft::ops::logging::chain(&e))))
}

/// The agent's loop in `ns` (kernel sockets, dataplane, interface monitor), once the monitor's
/// first sync is in, as the daemon starts it; the monitor's events and handle come with it.
pub(super) async fn start_agent(
    ns: &NetNs,
    cfg: felix_nft::dataplane::DataplaneConfig,
) -> Result<
    (
        Driver<RealKernel>,
        monitor::EventReceiver,
        monitor::MonitorHandle,
    ),
    BenchError,
> {
    let kernel = RealKernel::open(Some(ns), &cfg)
        .map_err(|e| BenchError::Refused(format!("opening the kernel sockets: {e}")))?;
    let dp = Dataplane::new(cfg.clone(), kernel.procsys().default_rp_filter())
        .map_err(|e| BenchError::Refused(e.to_string()))?;
    let (mut mon, handle) = monitor::start(
        Some(ns),
        MonitorConfig {
            exclude: cfg.iface_exclude.clone(),
            resync_interval: Duration::ZERO,
            ..MonitorConfig::default()
        },
    )
    .map_err(|source| BenchError::Rtnl {
        op: "starting the interface monitor".into(),
        source: Box::new(source),
    })?;
    let mut d = Driver::new(dp, kernel, LoopOptions::default(), None, None);
    // The loop touches nothing before the monitor's first sync.
    loop {
        match mon.recv().await {
            Some(ev) => {
                d.dp.on_iface(&ev);
                if matches!(ev, IfaceEvent::InSync) {
                    break;
                }
            }
            None => return Err(BenchError::Refused("the interface monitor stopped".into())),
        }
    }
    Ok((d, mon, handle))
}

async fn felix_rep(
    ns: NetNs,
    ns_name: String,
    inputs: std::sync::Arc<Inputs>,
    inc: usize,
) -> Result<FelixRep, BenchError> {
    underlay(&ns).await?;
    let mut cfg = run::bench_dataplane_config();
    cfg.overlay.hostname = node_name(LOCAL);
    let (mut d, mut mon, _mon) = start_agent(&ns, cfg).await?;
    let mut out = FelixRep::default();
    // The first sync: every message decoded into the dataplane, then one apply (all phases).
    let before = requests(&d.kernel);
    let (r, s) = timed(update_and_apply(&mut d, &inputs.full_msgs)).await;
    r?;
    out.samples
        .push(("full", s, requests(&d.kernel).since(before)));
    out.after_full = read_entries(&ns_name)?;
    out.echo = settle(&mut d, &mut mon).await?;
    for round in inputs.rounds.iter().take(inc) {
        for st in round {
            let before = requests(&d.kernel);
            let (r, s) = timed(update_and_apply(&mut d, &st.msgs)).await;
            r?;
            let req = requests(&d.kernel).since(before);
            out.samples.push((st.op, s, req));
            settle(&mut d, &mut mon).await?;
        }
    }
    // The untimed last round, so both backends end in the same state.
    for st in inputs.rounds.get(inc).into_iter().flatten() {
        update_and_apply(&mut d, &st.msgs).await?;
    }
    out.after_rounds = read_entries(&ns_name)?;
    Ok(out)
}

/// What one `ip -batch` + `bridge -batch` repetition measured.
#[derive(Default)]
struct BatchRep {
    samples: Vec<(&'static str, Sample)>,
    after_full: Entries,
    after_rounds: Entries,
}

fn batch_rep(
    ns: &BenchNs,
    rt: &tokio::runtime::Runtime,
    inputs: &Inputs,
    tools: &[PathBuf; 2],
    inc: usize,
    scratch: &Path,
) -> Result<BatchRep, BenchError> {
    rt.block_on(underlay(ns.ns()))?;
    let [ip, bridge] = tools.each_ref().map(|t| t.display().to_string());
    let batch = |tool: &str, file: &Path| {
        let tool = Tool::new(&[tool, "-batch", &file.display().to_string()]);
        run::spawn_in(ns.ns(), &tool, false, scratch)
    };
    let run_pair = |ipf: &Path, brf: &Path| -> Result<Sample, BenchError> {
        Ok(batch(&ip, ipf)?.plus(batch(&bridge, brf)?))
    };
    let mut out = BatchRep::default();
    out.samples
        .push(("full", run_pair(&inputs.full_ip, &inputs.full_bridge)?));
    out.after_full = read_entries(&ns.name())?;
    // `inc` timed rounds, then the last one untimed, so both backends end in the same state.
    for (i, round) in inputs.rounds.iter().enumerate().take(inc + 1) {
        for st in round {
            let s = run_pair(&st.ip, &st.bridge)?;
            if i < inc {
                out.samples.push((st.op, s));
            }
        }
    }
    out.after_rounds = read_entries(&ns.name())?;
    Ok(out)
}

/// The cluster comparison's results.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ClusterReport {
    /// Remote nodes at the first sync.
    pub nodes: usize,
    pub reps: usize,
    pub inc: usize,
    /// Lines of the baseline's batch files for the first sync (its netlink requests).
    pub baseline_full_lines: usize,
    /// backend → operation → stats.
    pub results: Results,
    /// felix-nft's netlink requests per operation (the largest over its samples).
    pub requests: BTreeMap<String, Requests>,
    /// The baseline's requests per operation (lines of its batch files).
    pub baseline_lines: BTreeMap<String, usize>,
    /// The apply the daemon runs when the monitor reports the device it created, median ms.
    pub echo_median_ms: Option<f64>,
    /// op → ip-batch median ÷ felix-nft median.
    pub ratios: BTreeMap<String, f64>,
    pub checks: Vec<String>,
    pub checks_ok: bool,
    /// The targets, each with whether it was met.
    pub targets: Vec<String>,
    pub notes: Vec<String>,
}

impl ClusterReport {
    fn median(&self, backend: &str, op: &str) -> Option<f64> {
        wall_median(&self.results, backend, op)
    }

    /// An empty report for `opts`, with the baseline's batch lines per operation.
    fn new(opts: &ClusterOptions, inputs: &Inputs) -> Self {
        let mut report = ClusterReport {
            nodes: opts.nodes,
            reps: opts.reps,
            inc: opts.inc,
            baseline_full_lines: inputs.full_lines,
            checks_ok: true,
            ..ClusterReport::default()
        };
        report
            .baseline_lines
            .insert("full".into(), inputs.full_lines);
        if let Some(r) = inputs.rounds.first() {
            for st in r {
                report.baseline_lines.insert(st.op.into(), st.lines);
            }
        }
        report
    }

    /// Adds one felix-nft repetition's samples, and keeps the most requests seen per operation.
    fn add_felix_rep(&mut self, r: &FelixRep) {
        let res = self.results.entry("felix-nft".into()).or_default();
        for (op, s, req) in &r.samples {
            res.entry(op.to_string()).or_default().samples.push(*s);
            let e = self.requests.entry(op.to_string()).or_default();
            *e = Requests {
                writes: e.writes.max(req.writes),
                link_gets: e.link_gets.max(req.link_gets),
                dumps: e.dumps.max(req.dumps),
            };
        }
    }

    /// Checks what backend `who` left after the first sync and after the updates against the
    /// inputs' expectations.
    fn check_end_state(
        &mut self,
        who: &str,
        after_full: &Entries,
        after_rounds: &Entries,
        inputs: &Inputs,
    ) {
        self.check(compare_entries(
            who,
            "after the first sync",
            after_full,
            &inputs.after_full,
        ));
        self.check(compare_entries(
            who,
            "after the updates",
            after_rounds,
            &inputs.after_rounds,
        ));
    }

    fn check(&mut self, lines: Vec<(String, bool)>) {
        for (what, good) in lines {
            self.checks_ok &= good;
            self.checks
                .push(format!("{} {what}", if good { "ok  " } else { "FAIL" }));
        }
    }

    fn finish(&mut self) {
        finish_all(&mut self.results);
        for op in ROWS {
            if let (Some(ours), Some(theirs)) =
                (self.median("felix-nft", op), self.median("ip-batch", op))
            {
                self.ratios.insert(op.to_string(), theirs / ours);
            }
        }
        if let Some(r) = self.ratios.get("full") {
            self.targets.push(format!(
                "{} first sync ≤ 0.5× ip -batch + bridge -batch: {:.2}×",
                if 1.0 / r <= 0.5 { "met   " } else { "MISSED" },
                1.0 / r
            ));
        }
        for op in ["add_vtep", "del_vtep"] {
            if let Some(m) = self.median("felix-nft", op) {
                self.targets.push(format!(
                    "{} {} ≤ 1 ms: {} ms",
                    if m <= 1.0 { "met   " } else { "MISSED" },
                    row_label(op),
                    fmt_ms(m)
                ));
            }
        }
        let dumps: u64 = ["add_vtep", "del_vtep", "mac_vtep"]
            .iter()
            .filter_map(|o| self.requests.get(*o))
            .map(|r| r.dumps)
            .sum();
        if self.results.contains_key("felix-nft") {
            self.targets.push(format!(
                "{} no dump in the update path: {dumps} dumps",
                if dumps == 0 { "met   " } else { "MISSED" }
            ));
        }
    }

    /// The table as Markdown.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let bs: Vec<&str> = BACKENDS
            .into_iter()
            .filter(|b| self.results.contains_key(*b))
            .collect();
        let _ = writeln!(
            s,
            "cluster: {} remote nodes (VTEP + /26 block each) on `{DEVICE}`; {} reps × {} rounds.\n",
            self.nodes, self.reps, self.inc
        );
        let _ = writeln!(s, "Wall ms, median (min–max):\n");
        let _ = writeln!(
            s,
            "| operation | {} | felix-nft netlink requests (writes / link gets / dumps) | ip + bridge batch lines |",
            bs.join(" | ")
        );
        let _ = writeln!(s, "|---|{}---:|---:|", "---:|".repeat(bs.len()));
        for op in ROWS {
            let cells: Vec<String> = bs
                .iter()
                .map(|b| wall_cell(self.results.get(*b).and_then(|o| o.get(op))))
                .collect();
            let req = self.requests.get(op).map_or("–".into(), |r| {
                format!("{} / {} / {}", r.writes, r.link_gets, r.dumps)
            });
            let lines = self
                .baseline_lines
                .get(op)
                .map_or("–".into(), |l| l.to_string());
            let _ = writeln!(
                s,
                "| {} | {} | {req} | {lines} |",
                row_label(op),
                cells.join(" | ")
            );
        }
        if !self.ratios.is_empty() {
            let r: Vec<String> = ROWS
                .iter()
                .filter_map(|o| Some(format!("{o} {:.1}×", self.ratios.get(*o)?)))
                .collect();
            let _ = writeln!(
                s,
                "\nip-batch median ÷ felix-nft median (× faster): {}",
                r.join(", ")
            );
        }
        if let Some(e) = self.echo_median_ms {
            let _ = writeln!(
                s,
                "\nfelix-nft, after the first sync: the apply the monitor's report of the new `{DEVICE}` causes (not in the row above), median {} ms",
                fmt_ms(e)
            );
        }
        let _ = writeln!(s, "\nBackends: felix-nft = the agent's loop in-process (`Driver::apply` over `RealKernel`: nf_tables, VXLAN device + FDB, routes, neighbours), fed Felix's messages; ip-batch = `ip -batch` (device, address, neighbours, routes, blackhole) + `bridge -batch` (FDB), spawned in the namespace.");
        for t in &self.targets {
            let _ = writeln!(s, "- target: {t}");
        }
        for c in &self.checks {
            let _ = writeln!(s, "- check: {c}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "- note: {n}");
        }
        s
    }

    /// Writes `bench-cluster.json` at 1,000 nodes, `bench-cluster-N.json` at any other N.
    pub fn write_file(&self, dir: &Path) -> Result<PathBuf, BenchError> {
        let stem = if self.nodes == 1000 {
            "bench-cluster".to_string()
        } else {
            format!("bench-cluster-{}", self.nodes)
        };
        let p = dir.join(format!("{stem}.json"));
        write(&p, &serde_json::to_string_pretty(self).unwrap_or_default())?;
        Ok(p)
    }
}

/// Runs the cluster comparison and writes its JSON into `opts.out_dir`.
pub fn compare(opts: &ClusterOptions) -> Result<ClusterReport, BenchError> {
    let wanted = |b: &str| opts.only.as_ref().is_none_or(|o| o.iter().any(|x| x == b));
    let run = ClusterRun {
        opts,
        inputs: std::sync::Arc::new(build_inputs(opts)?),
        rt: daemon_runtime()?,
    };
    let mut report = ClusterReport::new(opts, &run.inputs);
    if wanted("felix-nft") {
        run.felix_nft(&mut report)?;
    }
    if wanted("ip-batch") {
        run.ip_batch(&mut report)?;
    }
    run.rt.shutdown_timeout(Duration::from_millis(200));
    report.finish();
    report.write_file(&opts.out_dir)?;
    Ok(report)
}

/// The daemon's runtime: two workers, the loop a task on one of them.
pub(super) fn daemon_runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| BenchError::Io {
            op: "starting the async runtime".into(),
            source,
        })
}

/// What every backend's repetitions share: the options, the inputs and the runtime.
struct ClusterRun<'a> {
    opts: &'a ClusterOptions,
    inputs: std::sync::Arc<Inputs>,
    rt: tokio::runtime::Runtime,
}

impl ClusterRun<'_> {
    /// felix-nft's repetitions, each in a fresh namespace; the last one's end state checked.
    fn felix_nft(&self, report: &mut ClusterReport) -> Result<(), BenchError> {
        let opts = self.opts;
        eprintln!(
            "bench: cluster felix-nft ({} nodes, {} reps × {} rounds)",
            opts.nodes, opts.reps, opts.inc
        );
        let mut echoes = Vec::new();
        for rep in 0..opts.reps {
            let ns = fresh_ns()?;
            let handle = ns.ns().try_clone().map_err(|source| BenchError::Io {
                op: "duplicating the namespace handle".into(),
                source,
            })?;
            let name = ns.name();
            let inp = self.inputs.clone();
            let inc = opts.inc;
            let r = self
                .rt
                .block_on(async move { tokio::spawn(felix_rep(handle, name, inp, inc)).await })
                .map_err(|e| BenchError::Refused(format!("the felix-nft task failed: {e}")))??;
            report.add_felix_rep(&r);
            echoes.extend(r.echo.map(|s| s.wall_ms));
            if rep + 1 == opts.reps {
                report.check_end_state("felix-nft", &r.after_full, &r.after_rounds, &self.inputs);
            }
            drop(ns);
        }
        if !echoes.is_empty() {
            report.echo_median_ms = Some(super::report::median(echoes));
        }
        Ok(())
    }

    /// The `ip -batch` + `bridge -batch` repetitions, or a note when either tool is missing.
    fn ip_batch(&self, report: &mut ClusterReport) -> Result<(), BenchError> {
        let opts = self.opts;
        let (Some(ip), Some(bridge)) = (which("ip"), which("bridge")) else {
            report
                .notes
                .push("ip-batch: skipped, `ip` or `bridge` not installed".into());
            return Ok(());
        };
        eprintln!(
            "bench: cluster ip-batch ({} reps × {} rounds)",
            opts.reps, opts.inc
        );
        let tools = [ip, bridge];
        for rep in 0..opts.reps {
            let ns = fresh_ns()?;
            let r = batch_rep(&ns, &self.rt, &self.inputs, &tools, opts.inc, &opts.out_dir)?;
            let res = report.results.entry("ip-batch".into()).or_default();
            for (op, s) in &r.samples {
                res.entry(op.to_string()).or_default().samples.push(*s);
            }
            if rep + 1 == opts.reps {
                report.check_end_state("ip-batch", &r.after_full, &r.after_rounds, &self.inputs);
            }
        }
        Ok(())
    }
}
