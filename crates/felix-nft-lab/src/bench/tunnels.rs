//! `felix-nft bench compare --scale cluster-ipip[:N]` and `--scale cluster-wireguard[:N]`: one
//! node of an IPIP or a WireGuard cluster learning N remote nodes at its first sync, then one
//! node joining and one leaving — felix-nft through the agent's own loop (`Driver` over
//! `RealKernel`, fed the messages Felix's calculation graph sends), and the same kernel state
//! written in the same run by `ip -batch` (IPIP: tunl0 and the routes through it) or by
//! `ip -batch` and `wg set` (WireGuard: the device, its peers, table 1 and the rule).
//!
//! Every repetition runs in a fresh namespace with an underlay veth (`eth0`, 172.16.0.1/16).
//! After each first sync and at the end, the kernel is read with `ip -j` / `wg show` (oracles,
//! not timed) and compared entry by entry with what the generator expects. Both need the kernel
//! module (`ipip`, `wireguard`): where it is missing the comparison says so and fails.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use super::cluster::{
    daemon_runtime, node_ip, settle, start_agent, timed, underlay, update_and_apply,
};
use super::report::{finish_all, fmt_ms, wall_cell, wall_median, Results};
use super::run::{self, Sample, Tool};
use super::{create_dir, fresh_ns, output, which, write, BenchError, BenchNs};
use felix_api::ToDataplane;
use felix_nft::dataplane::DataplaneConfig;
use rtnl::netns::NetNs;

/// The cross-node mode under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Tunnel {
    Ipip,
    Wireguard,
}

impl Tunnel {
    fn name(self) -> &'static str {
        match self {
            Tunnel::Ipip => "ipip",
            Tunnel::Wireguard => "wireguard",
        }
    }

    fn device(self) -> &'static str {
        match self {
            Tunnel::Ipip => "tunl0",
            Tunnel::Wireguard => WG_DEVICE,
        }
    }

    /// The baseline's name in the table.
    fn baseline(self) -> &'static str {
        match self {
            Tunnel::Ipip => "ip-batch",
            Tunnel::Wireguard => "ip-batch+wg",
        }
    }
}

/// Rows of the table, in order.
const ROWS: [&str; 3] = ["full", "join", "leave"];

fn row_label(t: Tunnel, op: &str) -> &'static str {
    match (t, op) {
        (Tunnel::Ipip, "full") => "first sync: tunl0 + N routes through it",
        (Tunnel::Wireguard, "full") => "first sync: device, key, N peers, N table routes, the rule",
        (_, "join") => "one node joins",
        (_, "leave") => "one node leaves",
        _ => "?",
    }
}

const LOCAL: usize = 0;
const POOL: &str = "10.128.0.0/14";
const WG_DEVICE: &str = "wireguard.cali";
const WG_PORT: u16 = 51820;
const WG_MARK: &str = "0x200000";
const IPIP_MTU: u32 = 1480;
const WG_MTU: u32 = 1440;

/// Options of the comparison.
#[derive(Debug, Clone)]
pub struct TunnelOptions {
    pub tunnel: Tunnel,
    /// Remote nodes at the first sync.
    pub nodes: usize,
    /// First syncs (fresh namespaces) per backend.
    pub reps: usize,
    /// Rounds of join + leave per repetition.
    pub inc: usize,
    pub out_dir: PathBuf,
    /// Only these backends (default: both).
    pub only: Option<Vec<String>>,
}

impl TunnelOptions {
    /// `cluster-ipip[:N]` or `cluster-wireguard[:N]` (1,000 remote nodes by default); `None`
    /// for any other scale.
    pub fn parse(spec: &str, out_dir: PathBuf) -> Option<Result<TunnelOptions, String>> {
        let (name, count) = match spec.split_once(':') {
            Some((n, c)) => (n, Some(c)),
            None => (spec, None),
        };
        let tunnel = match name {
            "cluster-ipip" => Tunnel::Ipip,
            "cluster-wireguard" => Tunnel::Wireguard,
            _ => return None,
        };
        let nodes = match count {
            None => Ok(1000),
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=60_000).contains(n))
                .ok_or_else(|| format!("{name} scale: {n:?} is not a node count in 1..=60000")),
        };
        Some(nodes.map(|nodes| TunnelOptions {
            tunnel,
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

/// The node's /26 block.
fn block(i: usize) -> String {
    let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + 64 * i as u32);
    format!("{a}/26")
}

/// The node's tunnel address: its block's first address.
fn tunnel_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + 64 * i as u32)
}

/// Node i's public key (any 32 bytes are a key the kernel takes).
fn key(i: usize) -> String {
    let mut k = [0x5au8; 32];
    k[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
    base64::engine::general_purpose::STANDARD.encode(k)
}

/// What the node must hold: the remote nodes.
#[derive(Debug, Clone, Default)]
struct Held {
    remotes: BTreeSet<usize>,
}

/// What the kernel holds, as comparable strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entries {
    device: bool,
    /// IPIP: `dst via gw`; WireGuard: the table's `dst` (device routes) and `throw dst`.
    routes: BTreeSet<String>,
    /// WireGuard: `key endpoint allowed-ips`.
    peers: BTreeSet<String>,
    /// WireGuard: the rule at priority 99.
    rule: bool,
}

impl Held {
    fn expected(&self, t: Tunnel) -> Entries {
        let mut e = Entries {
            device: true,
            rule: t == Tunnel::Wireguard,
            ..Entries::default()
        };
        if t == Tunnel::Wireguard {
            e.routes.insert(format!("throw {}", block(LOCAL)));
        }
        for &i in &self.remotes {
            match t {
                Tunnel::Ipip => {
                    e.routes.insert(format!("{} via {}", block(i), node_ip(i)));
                }
                Tunnel::Wireguard => {
                    e.routes.insert(block(i));
                    e.peers
                        .insert(format!("{} {}:{WG_PORT} {}", key(i), node_ip(i), block(i)));
                }
            }
        }
        e
    }
}

fn decode(vs: Vec<Value>) -> Result<Vec<ToDataplane>, BenchError> {
    vs.into_iter()
        .map(|v| {
            felix_api::json::decode_value::<ToDataplane>(v)
                .map_err(|e| BenchError::Refused(format!("generated message: {e}")))
        })
        .collect()
}

/// What Felix sends about node i joining: its host, its block, (its key).
fn node_msgs(t: Tunnel, i: usize) -> Vec<Value> {
    let mut v = vec![
        json!({"host_metadata_update": {"hostname": node_name(i),
            "ipv4_addr": format!("{}/16", node_ip(i))}}),
        json!({"route_update": {
            "types": if i == LOCAL { "LOCAL_WORKLOAD" } else { "REMOTE_WORKLOAD" },
            "ip_pool_type": if t == Tunnel::Ipip { "IPIP" } else { "NO_ENCAP" },
            "dst": block(i), "dst_node_name": node_name(i), "dst_node_ip": node_ip(i).to_string()}}),
    ];
    if t == Tunnel::Wireguard && i != LOCAL {
        v.push(
            json!({"wireguard_endpoint_update": {"hostname": node_name(i),
            "public_key": key(i), "interface_ipv4_addr": tunnel_addr(i).to_string()}}),
        );
    }
    v
}

/// What Felix sends about node i leaving.
fn leave_msgs(t: Tunnel, i: usize) -> Vec<Value> {
    let mut v = vec![
        json!({"route_remove": {"dst": block(i)}}),
        json!({"host_metadata_remove": {"hostname": node_name(i)}}),
    ];
    if t == Tunnel::Wireguard {
        v.push(json!({"wireguard_endpoint_remove": {"hostname": node_name(i)}}));
    }
    v
}

/// The baseline's commands for one step: `ip -batch` lines before and after an optional
/// `wg set` argument list.
#[derive(Debug, Clone, Default)]
struct Commands {
    ip_before: Vec<String>,
    wg: Vec<String>,
    ip_after: Vec<String>,
}

impl Commands {
    fn requests(&self) -> usize {
        self.ip_before.len() + self.ip_after.len() + usize::from(!self.wg.is_empty())
    }
}

fn route_line(t: Tunnel, i: usize, verb: &str) -> String {
    match t {
        Tunnel::Ipip => format!(
            "route {verb} {} via {} dev tunl0 onlink proto 80 mtu {IPIP_MTU}",
            block(i),
            node_ip(i)
        ),
        Tunnel::Wireguard => format!(
            "route {verb} {} dev {WG_DEVICE} table 1 proto boot scope link",
            block(i)
        ),
    }
}

fn peer_args(i: usize) -> Vec<String> {
    vec![
        "peer".into(),
        key(i),
        "endpoint".into(),
        format!("{}:{WG_PORT}", node_ip(i)),
        "allowed-ips".into(),
        block(i),
        "persistent-keepalive".into(),
        "0".into(),
    ]
}

/// One update, for both backends.
#[derive(Debug, Clone)]
struct Step {
    op: &'static str,
    msgs: Vec<ToDataplane>,
    cmds: Commands,
}

struct Inputs {
    full_msgs: Vec<ToDataplane>,
    full_cmds: Commands,
    after_full: Entries,
    rounds: Vec<Vec<Step>>,
    after_rounds: Entries,
}

fn build_inputs(opts: &TunnelOptions, key_file: &Path) -> Result<Inputs, BenchError> {
    let t = opts.tunnel;
    let n = opts.nodes;
    let mut held = Held::default();
    let pool = match t {
        Tunnel::Ipip => json!({"cidr": POOL, "masquerade": true, "ipip_mode": "Always"}),
        Tunnel::Wireguard => json!({"cidr": POOL, "masquerade": true}),
    };
    let mut msgs = vec![json!({"ipam_pool_update": {"id": "bench-pool", "pool": pool}})];
    for i in 0..=n {
        msgs.extend(node_msgs(t, i));
    }
    if t == Tunnel::Ipip {
        msgs.push(json!({"encapsulation": {"ipip_enabled": true}}));
    }
    msgs.push(json!({"in_sync": {}}));
    let mut full = Commands::default();
    match t {
        Tunnel::Ipip => {
            full.ip_before = vec![
                format!("link set tunl0 mtu {IPIP_MTU}"),
                format!("addr add {}/32 dev tunl0", tunnel_addr(LOCAL)),
                "link set tunl0 up".into(),
            ];
        }
        Tunnel::Wireguard => {
            full.ip_before = vec![
                format!("link add {WG_DEVICE} type wireguard"),
                format!("link set {WG_DEVICE} mtu {WG_MTU} up"),
            ];
            full.wg = vec![
                "listen-port".into(),
                WG_PORT.to_string(),
                "fwmark".into(),
                WG_MARK.into(),
                "private-key".into(),
                key_file.display().to_string(),
            ];
        }
    }
    for i in 1..=n {
        if t == Tunnel::Wireguard {
            full.wg.extend(peer_args(i));
        }
        full.ip_after.push(route_line(t, i, "replace"));
        held.remotes.insert(i);
    }
    full.ip_after
        .push(format!("route replace blackhole {} proto 80", block(LOCAL)));
    if t == Tunnel::Wireguard {
        full.ip_after.push(format!(
            "route replace throw {} table 1 proto boot",
            block(LOCAL)
        ));
        full.ip_after.push(format!(
            "rule add not fwmark {WG_MARK}/{WG_MARK} table 1 priority 99"
        ));
    }
    let after_full = held.expected(t);
    let mut rounds = Vec::new();
    for r in 0..=opts.inc {
        let j = n + 1 + r;
        let mut join = Commands {
            ip_after: vec![route_line(t, j, "replace")],
            ..Commands::default()
        };
        if t == Tunnel::Wireguard {
            join.wg = peer_args(j);
        }
        held.remotes.insert(j);
        let k = 1 + r;
        let mut leave = Commands {
            ip_before: vec![route_line(t, k, "del")],
            ..Commands::default()
        };
        if t == Tunnel::Wireguard {
            leave.wg = vec!["peer".into(), key(k), "remove".into()];
        }
        held.remotes.remove(&k);
        rounds.push(vec![
            Step {
                op: "join",
                msgs: decode(node_msgs(t, j))?,
                cmds: join,
            },
            Step {
                op: "leave",
                msgs: decode(leave_msgs(t, k))?,
                cmds: leave,
            },
        ]);
    }
    Ok(Inputs {
        full_msgs: decode(msgs)?,
        full_cmds: full,
        after_full,
        rounds,
        after_rounds: held.expected(t),
    })
}

/// Reads what the node holds with `ip -j` and `wg show` (the oracles).
fn read_entries(t: Tunnel, ns: &str) -> Result<Entries, BenchError> {
    let json = |argv: &[&str]| -> Result<Value, BenchError> {
        let out = output(argv)?;
        if !out.status.success() {
            return Ok(Value::Array(Vec::new()));
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(Vec::new())))
    };
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let mut e = Entries::default();
    let links = json(&["ip", "-n", ns, "-j", "link", "show", t.device()])?;
    e.device = list(&links)
        .first()
        .is_some_and(|l| list(&l["flags"]).iter().any(|f| f == "UP"));
    match t {
        Tunnel::Ipip => {
            for r in list(&json(&[
                "ip", "-n", ns, "-j", "-4", "route", "show", "dev", "tunl0",
            ])?) {
                if r.get("gateway").is_some() {
                    e.routes
                        .insert(format!("{} via {}", s(&r["dst"]), s(&r["gateway"])));
                }
            }
        }
        Tunnel::Wireguard => {
            for r in list(&json(&[
                "ip", "-n", ns, "-j", "-4", "route", "show", "table", "1",
            ])?) {
                let kind = s(&r["type"]);
                e.routes.insert(if kind == "throw" {
                    format!("throw {}", s(&r["dst"]))
                } else {
                    s(&r["dst"])
                });
            }
            let dump = output(&["ip", "netns", "exec", ns, "wg", "show", WG_DEVICE, "dump"])?;
            for l in String::from_utf8_lossy(&dump.stdout).lines().skip(1) {
                let f: Vec<&str> = l.split('\t').collect();
                if f.len() > 3 {
                    e.peers.insert(format!("{} {} {}", f[0], f[2], f[3]));
                }
            }
            let rules = output(&["ip", "-n", ns, "-4", "rule", "show", "pref", "99"])?;
            e.rule = String::from_utf8_lossy(&rules.stdout)
                .contains(&format!("not from all fwmark {WG_MARK}/{WG_MARK} lookup 1"));
        }
    }
    Ok(e)
}

fn compare_entries(who: &str, when: &str, got: &Entries, want: &Entries) -> Vec<(String, bool)> {
    let diff = |a: &BTreeSet<String>, b: &BTreeSet<String>| {
        (b.difference(a).count(), a.difference(b).count())
    };
    let mut out = vec![(
        format!("{who} {when}: the device up, the rule as wanted"),
        got.device == want.device && got.rule == want.rule,
    )];
    for (what, a, b) in [
        ("routes", &got.routes, &want.routes),
        ("peers", &got.peers, &want.peers),
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

/// felix-nft's configuration: this node's name, and the mode's own keys, as Felix would set
/// them.
fn felix_config(t: Tunnel) -> Result<DataplaneConfig, BenchError> {
    use felix_nft::config::{resolve, RawValue, Source};
    let mut raw = vec![
        ("FelixHostname", node_name(LOCAL)),
        ("Ipv6Support", "false".to_string()),
    ];
    match t {
        Tunnel::Ipip => raw.push(("IpInIpTunnelAddr", tunnel_addr(LOCAL).to_string())),
        Tunnel::Wireguard => raw.push(("WireguardEnabled", "true".to_string())),
    }
    let raw = raw
        .into_iter()
        .map(|(key, value)| RawValue {
            key: key.to_string(),
            value,
            source: Source::ConfigUpdate,
        })
        .collect();
    let config = resolve(raw)
        .map_err(|e| BenchError::Refused(felix_nft::ops::logging::chain(&e)))?
        .config;
    Ok(DataplaneConfig::from_config(&config))
}

/// What one felix-nft repetition measured.
#[derive(Default)]
struct FelixRep {
    samples: Vec<(&'static str, Sample)>,
    after_full: Entries,
    after_rounds: Entries,
}

async fn felix_rep(
    t: Tunnel,
    ns: NetNs,
    ns_name: String,
    inputs: std::sync::Arc<Inputs>,
    inc: usize,
) -> Result<FelixRep, BenchError> {
    underlay(&ns).await?;
    let (mut d, mut mon, _mon) = start_agent(&ns, felix_config(t)?).await?;
    let mut out = FelixRep::default();
    let (r, s) = timed(update_and_apply(&mut d, &inputs.full_msgs)).await;
    r?;
    out.samples.push(("full", s));
    // The device's own events (it appeared, its address, its routes) are applied before the
    // first state is read, as the running loop would.
    settle(&mut d, &mut mon).await?;
    out.after_full = read_entries(t, &ns_name)?;
    for round in inputs.rounds.iter().take(inc) {
        for st in round {
            let (r, s) = timed(update_and_apply(&mut d, &st.msgs)).await;
            r?;
            out.samples.push((st.op, s));
            settle(&mut d, &mut mon).await?;
        }
    }
    for st in inputs.rounds.get(inc).into_iter().flatten() {
        update_and_apply(&mut d, &st.msgs).await?;
    }
    settle(&mut d, &mut mon).await?;
    out.after_rounds = read_entries(t, &ns_name)?;
    Ok(out)
}

/// The baseline's tools.
struct Baseline {
    ip: String,
    wg: Option<String>,
}

impl Baseline {
    /// Runs one step's commands: `ip -batch` (before), `wg set`, `ip -batch` (after).
    fn run(
        &self,
        ns: &BenchNs,
        cmds: &Commands,
        dir: &Path,
        stem: &str,
    ) -> Result<Sample, BenchError> {
        let mut total = Sample::default();
        let batch = |lines: &[String], name: &str| -> Result<Option<Sample>, BenchError> {
            if lines.is_empty() {
                return Ok(None);
            }
            let f = dir.join(format!("{stem}-{name}.ip"));
            write(&f, &(lines.join("\n") + "\n"))?;
            let tool = Tool::new(&[&self.ip, "-batch", &f.display().to_string()]);
            run::spawn_in(ns.ns(), &tool, false, dir).map(Some)
        };
        if let Some(s) = batch(&cmds.ip_before, "before")? {
            total = total.plus(s);
        }
        if !cmds.wg.is_empty() {
            let wg = self
                .wg
                .as_deref()
                .ok_or_else(|| BenchError::Refused("`wg` is not installed".into()))?;
            let mut argv = vec![wg, "set", WG_DEVICE];
            argv.extend(cmds.wg.iter().map(String::as_str));
            total = total.plus(run::spawn_in(ns.ns(), &Tool::new(&argv), false, dir)?);
        }
        if let Some(s) = batch(&cmds.ip_after, "after")? {
            total = total.plus(s);
        }
        Ok(total)
    }
}

/// What one baseline repetition measured.
#[derive(Default)]
struct BaselineRep {
    samples: Vec<(&'static str, Sample)>,
    after_full: Entries,
    after_rounds: Entries,
}

fn baseline_rep(
    t: Tunnel,
    ns: &BenchNs,
    rt: &tokio::runtime::Runtime,
    inputs: &Inputs,
    tools: &Baseline,
    inc: usize,
    dir: &Path,
) -> Result<BaselineRep, BenchError> {
    rt.block_on(underlay(ns.ns()))?;
    let mut out = BaselineRep::default();
    out.samples
        .push(("full", tools.run(ns, &inputs.full_cmds, dir, "full")?));
    out.after_full = read_entries(t, &ns.name())?;
    for (i, round) in inputs.rounds.iter().enumerate().take(inc + 1) {
        for st in round {
            let s = tools.run(ns, &st.cmds, dir, &format!("r{i}-{}", st.op))?;
            if i < inc {
                out.samples.push((st.op, s));
            }
        }
    }
    out.after_rounds = read_entries(t, &ns.name())?;
    Ok(out)
}

/// The comparison's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TunnelReport {
    pub tunnel: Tunnel,
    pub nodes: usize,
    pub reps: usize,
    pub inc: usize,
    /// backend → operation → stats.
    pub results: Results,
    /// The baseline's requests per operation (batch lines, one per `wg set`).
    pub baseline_requests: BTreeMap<String, usize>,
    /// op → baseline median ÷ felix-nft median.
    pub ratios: BTreeMap<String, f64>,
    pub checks: Vec<String>,
    pub checks_ok: bool,
    pub targets: Vec<String>,
    pub notes: Vec<String>,
}

impl TunnelReport {
    fn new(opts: &TunnelOptions, inputs: &Inputs) -> TunnelReport {
        let mut baseline_requests = BTreeMap::new();
        baseline_requests.insert("full".to_string(), inputs.full_cmds.requests());
        for st in inputs.rounds.first().into_iter().flatten() {
            baseline_requests.insert(st.op.to_string(), st.cmds.requests());
        }
        TunnelReport {
            tunnel: opts.tunnel,
            nodes: opts.nodes,
            reps: opts.reps,
            inc: opts.inc,
            results: Results::new(),
            baseline_requests,
            ratios: BTreeMap::new(),
            checks: Vec::new(),
            checks_ok: true,
            targets: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn add(&mut self, backend: &str, samples: &[(&'static str, Sample)]) {
        let res = self.results.entry(backend.to_string()).or_default();
        for (op, s) in samples {
            res.entry(op.to_string()).or_default().samples.push(*s);
        }
    }

    fn check(&mut self, who: &str, after_full: &Entries, after_rounds: &Entries, inputs: &Inputs) {
        let lines = compare_entries(who, "after the first sync", after_full, &inputs.after_full)
            .into_iter()
            .chain(compare_entries(
                who,
                "after the updates",
                after_rounds,
                &inputs.after_rounds,
            ));
        for (what, good) in lines {
            self.checks_ok &= good;
            self.checks
                .push(format!("{} {what}", if good { "ok  " } else { "FAIL" }));
        }
    }

    fn finish(&mut self) {
        finish_all(&mut self.results);
        let base = self.tunnel.baseline();
        for op in ROWS {
            if let (Some(ours), Some(theirs)) = (
                wall_median(&self.results, "felix-nft", op),
                wall_median(&self.results, base, op),
            ) {
                self.ratios.insert(op.to_string(), theirs / ours);
            }
        }
        if let Some(r) = self.ratios.get("full") {
            self.targets.push(format!(
                "{} first sync ≤ 0.5× {base}: {:.2}×",
                if 1.0 / r <= 0.5 { "met   " } else { "MISSED" },
                1.0 / r
            ));
        }
        for op in ["join", "leave"] {
            if let Some(m) = wall_median(&self.results, "felix-nft", op) {
                self.targets.push(format!(
                    "{} {} ≤ 1 ms: {} ms",
                    if m <= 1.0 { "met   " } else { "MISSED" },
                    row_label(self.tunnel, op),
                    fmt_ms(m)
                ));
            }
        }
    }

    /// The table as Markdown.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let t = self.tunnel;
        let bs: Vec<&str> = ["felix-nft", t.baseline()]
            .into_iter()
            .filter(|b| self.results.contains_key(*b))
            .collect();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "cluster-{}: {} remote nodes on `{}`; {} reps × {} rounds.\n",
            t.name(),
            self.nodes,
            t.device(),
            self.reps,
            self.inc
        );
        let _ = writeln!(s, "Wall ms, median (min–max):\n");
        let _ = writeln!(s, "| operation | {} | baseline requests |", bs.join(" | "));
        let _ = writeln!(s, "|---|{}---:|", "---:|".repeat(bs.len()));
        for op in ROWS {
            let cells: Vec<String> = bs
                .iter()
                .map(|b| wall_cell(self.results.get(*b).and_then(|o| o.get(op))))
                .collect();
            let req = self
                .baseline_requests
                .get(op)
                .map_or("–".into(), |n| n.to_string());
            let _ = writeln!(
                s,
                "| {} | {} | {req} |",
                row_label(t, op),
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
                "\n{} median ÷ felix-nft median (× faster): {}",
                t.baseline(),
                r.join(", ")
            );
        }
        let base = match t {
            Tunnel::Ipip => {
                "`ip -batch` (tunl0's MTU, address and state, the routes, the blackhole)"
            }
            Tunnel::Wireguard => {
                "`ip -batch` (device, MTU, table 1's routes, the rule) and one `wg set` (port, \
                 fwmark, key, every peer), each spawned in the namespace"
            }
        };
        let _ = writeln!(
            s,
            "\nBackends: felix-nft = the agent's loop in-process (`Driver::apply` over `RealKernel`, \
             nf_tables included), fed Felix's messages; {} = {base}.",
            t.baseline()
        );
        for x in &self.targets {
            let _ = writeln!(s, "- target: {x}");
        }
        for c in &self.checks {
            let _ = writeln!(s, "- check: {c}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "- note: {n}");
        }
        s
    }

    /// Writes `bench-cluster-<tunnel>[-N].json`.
    pub fn write_file(&self, dir: &Path) -> Result<PathBuf, BenchError> {
        let mut stem = format!("bench-cluster-{}", self.tunnel.name());
        if self.nodes != 1000 {
            stem.push_str(&format!("-{}", self.nodes));
        }
        let p = dir.join(format!("{stem}.json"));
        write(&p, &serde_json::to_string_pretty(self).unwrap_or_default())?;
        Ok(p)
    }
}

/// Whether the kernel has the mode's module (a device of its kind can be made); felix-nft
/// loads no module itself.
fn kernel_has(t: Tunnel) -> bool {
    let m = t.name();
    std::path::Path::new("/sys/module").join(m).exists()
}

/// Runs the comparison and writes its JSON into `opts.out_dir`.
pub fn compare(opts: &TunnelOptions) -> Result<TunnelReport, BenchError> {
    let t = opts.tunnel;
    if !kernel_has(t) {
        return Err(BenchError::Refused(format!(
            "this kernel has no {} module (load it: modprobe {})",
            t.name(),
            t.name()
        )));
    }
    let wanted = |b: &str| opts.only.as_ref().is_none_or(|o| o.iter().any(|x| x == b));
    let dir = opts.out_dir.join("inputs");
    create_dir(&dir)?;
    let key_file = dir.join("wg-private.key");
    write(&key_file, &(key(usize::MAX / 2) + "\n"))?;
    let inputs = std::sync::Arc::new(build_inputs(opts, &key_file)?);
    let rt = daemon_runtime()?;
    let mut report = TunnelReport::new(opts, &inputs);
    if wanted("felix-nft") {
        eprintln!(
            "bench: cluster-{} felix-nft ({} nodes, {} reps × {} rounds)",
            t.name(),
            opts.nodes,
            opts.reps,
            opts.inc
        );
        for rep in 0..opts.reps {
            let ns = fresh_ns()?;
            let handle = ns.ns().try_clone().map_err(|source| BenchError::Io {
                op: "duplicating the namespace handle".into(),
                source,
            })?;
            let (name, inp, inc) = (ns.name(), inputs.clone(), opts.inc);
            let r = rt
                .block_on(async move { tokio::spawn(felix_rep(t, handle, name, inp, inc)).await })
                .map_err(|e| BenchError::Refused(format!("the felix-nft task failed: {e}")))??;
            report.add("felix-nft", &r.samples);
            if rep + 1 == opts.reps {
                report.check("felix-nft", &r.after_full, &r.after_rounds, &inputs);
            }
        }
    }
    let base = t.baseline();
    if wanted(base) {
        match (which("ip"), which("wg")) {
            (Some(ip), wg) if t == Tunnel::Ipip || wg.is_some() => {
                eprintln!(
                    "bench: cluster-{} {base} ({} reps × {} rounds)",
                    t.name(),
                    opts.reps,
                    opts.inc
                );
                let tools = Baseline {
                    ip: ip.display().to_string(),
                    wg: wg.map(|w| w.display().to_string()),
                };
                for rep in 0..opts.reps {
                    let ns = fresh_ns()?;
                    let r = baseline_rep(t, &ns, &rt, &inputs, &tools, opts.inc, &dir)?;
                    report.add(base, &r.samples);
                    if rep + 1 == opts.reps {
                        report.check(base, &r.after_full, &r.after_rounds, &inputs);
                    }
                }
            }
            _ => report
                .notes
                .push(format!("{base}: skipped, `ip` or `wg` not installed")),
        }
    }
    rt.shutdown_timeout(Duration::from_millis(200));
    report.finish();
    report.write_file(&opts.out_dir)?;
    Ok(report)
}
