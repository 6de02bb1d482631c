//! The end-to-end harness: a test bed node (`felix_nft_lab::testbed`), one `felix-nft run --source
//! stdin --keep-running --netns <host>` per daemon life, updates streamed to it as JSON lines, and
//! connectivity matrices polled until they hold (each scenario step flips at least one flow, so a
//! matching matrix means the step's transaction is in — nf_tables applies it atomically).
//!
//! `ip`/`nft` are used here as test oracles only, and only in namespaces the bed made.
#![allow(dead_code)]

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use felix_nft_lab::testbed::probe::{
    run_matrix, Flow, MatrixReport, Proto, TcpServer, UdpEchoServer, Verdict,
};
use felix_nft_lab::testbed::topology::{
    ExternalSpec, Topology, TopologySpec, Workload, WorkloadSpec,
};
use rtnl::netns::NetNs;
use serde_json::{json, Value};

/// Per-probe timeout for an expected drop: short, well above a real answer on veths.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(400);
/// How long a step may take to show up in traffic (apply throttle + transaction + routes),
/// stretched in the VM bed.
pub fn step_deadline() -> Duration {
    patient(Duration::from_secs(20))
}

pub use common::{block_on, oracle_stdout, patient, require_root};
use testkit as common;

/// Builds a topology or panics with the error chain.
pub fn build(spec: TopologySpec) -> Topology {
    match block_on(Topology::build(&spec)) {
        Ok(t) => t,
        Err(e) => panic!("building the test bed: {}", chain(&e)),
    }
}

/// An external namespace as the host's default route, IPv4 only, with no routes to the
/// workloads (a real node has one, and proxy ARP answers for 169.254.1.1 only when the host
/// routes that address elsewhere).
pub const UPSTREAM_V4: ExternalSpec = ExternalSpec {
    routes_to_workloads: false,
    ipv6: false,
};

/// A bed named after `prefix` of `workloads` and the `external` namespace.
pub fn bed(prefix: &str, workloads: Vec<WorkloadSpec>, external: ExternalSpec) -> Topology {
    build(TopologySpec {
        prefix: prefix.into(),
        workloads,
        external: Some(external),
    })
}

/// A bed of three IPv4 workloads `a`, `b` and `c` at `addrs` behind [`UPSTREAM_V4`].
pub fn three_v4_workloads(prefix: &str, [a, b, c]: [Ipv4Addr; 3]) -> Topology {
    let workloads = vec![
        WorkloadSpec::v4("a", a),
        WorkloadSpec::v4("b", b),
        WorkloadSpec::v4("c", c),
    ];
    bed(prefix, workloads, UPSTREAM_V4)
}

/// Servers in every workload of a bed, listening until dropped.
pub struct Servers {
    _tcp: Vec<TcpServer>,
    _udp: Vec<UdpEchoServer>,
}

/// Starts a TCP server on each of `tcp` and a UDP echo server on each of `udp` in every workload
/// of `topo`.
pub fn serve(topo: &Topology, tcp: &[u16], udp: &[u16]) -> Servers {
    let mut servers = Servers {
        _tcp: Vec::new(),
        _udp: Vec::new(),
    };
    for w in topo.workloads() {
        for &port in tcp {
            servers._tcp.push(TcpServer::start(w.ns(), port).unwrap());
        }
        for &port in udp {
            servers
                ._udp
                .push(UdpEchoServer::start(w.ns(), port).unwrap());
        }
    }
    servers
}

/// The opening of most scenarios, as root: [`three_v4_workloads`], `servers` started in it, then
/// an agent with the default options.
pub fn three_v4_with_agent<S>(
    prefix: &str,
    addrs: [Ipv4Addr; 3],
    servers: impl FnOnce(&Topology) -> S,
) -> (Topology, S, Agent) {
    require_root();
    let topo = three_v4_workloads(prefix, addrs);
    let servers = servers(&topo);
    let agent = Agent::start(&topo, AgentOptions::default());
    (topo, servers, agent)
}

/// The workloads `a`, `b` and `c` of [`three_v4_workloads`].
pub fn abc(topo: &Topology) -> (&Workload, &Workload, &Workload) {
    let w = |name| {
        topo.workload(name)
            .unwrap_or_else(|| panic!("no workload {name}"))
    };
    (w("a"), w("b"), w("c"))
}

/// `e: cause: cause…`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

/// How the daemon process is started.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    /// Extra `FELIX_*` environment (the daemon's config source).
    pub env: Vec<(String, String)>,
    /// Run under `strace -f -e trace=execve,fork,vfork,clone,clone3 -o FILE` (a test tool) and
    /// without `--keep-running`:
    /// the daemon then ends when stdin closes, and strace with it.
    pub strace_to: Option<std::path::PathBuf>,
}

/// One life of `felix-nft run --source stdin` in the topology's host namespace. Killed on drop.
pub struct Agent {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    log: tempfile::NamedTempFile,
    under_strace: bool,
    /// The namespace the agent programs, where its netlink sockets live.
    netns: String,
}

impl Agent {
    /// Starts the daemon on `topo`'s host namespace with hermetic config: no config file, no
    /// status reporting, plain tables (Debian's `nft` cannot print owner+persist ones, and the tests read the ruleset as an oracle).
    pub fn start(topo: &Topology, opts: AgentOptions) -> Agent {
        let bin = env!("CARGO_BIN_EXE_felix-nft-lab");
        let mut cmd = match &opts.strace_to {
            Some(trace) => {
                let mut c = Command::new("strace");
                c.args([
                    "-f",
                    "-qq",
                    "-e",
                    "trace=execve,fork,vfork,clone,clone3",
                    "-o",
                ])
                .arg(trace)
                .arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.args([
            "run",
            "--source",
            "stdin",
            "--netns",
            topo.host_netns_name(),
        ]);
        if opts.strace_to.is_none() {
            cmd.arg("--keep-running");
        }
        let log = tempfile::NamedTempFile::new().expect("a log file");
        cmd.env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
            .env("FELIX_NFTABLESTABLEOWNER", "false")
            .env("FELIX_REPORTINGINTERVALSECS", "0")
            .env_remove("FELIX_NFT_LOG_FORMAT");
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("reopening the log file"))
            .spawn()
            .expect("spawning felix-nft");
        let stdin = child.stdin.take();
        Agent {
            child: Some(child),
            stdin,
            log,
            under_strace: opts.strace_to.is_some(),
            netns: topo.host_netns_name().to_string(),
        }
    }

    /// Sends one `ToDataplane` message (a JSON value in the proto's field names).
    pub fn send(&mut self, msg: &Value) {
        let line = serde_json::to_string(msg).expect("JSON");
        let stdin = self.stdin.as_mut().expect("the agent's stdin is open");
        if let Err(e) = writeln!(stdin, "{line}") {
            panic!("writing to felix-nft ({e}); its log:\n{}", self.log_text());
        }
    }

    /// Sends several messages in order.
    pub fn send_all(&mut self, msgs: &[Value]) {
        for m in msgs {
            self.send(m);
        }
    }

    /// Sends the allow-all profile, each of `workloads` as an endpoint with that profile and no
    /// tiers, and InSync: the opening of a scenario where every flow passes.
    pub fn send_allow_all(&mut self, workloads: &[&Workload]) {
        self.send(&allow_all_profile());
        for w in workloads {
            self.send(&wep(w, &["allow-all"], json!([])));
        }
        self.send(&in_sync());
    }

    /// What the daemon has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Panics (with the log) if the daemon has already exited.
    pub fn assert_running(&mut self) {
        let child = self.child.as_mut().expect("agent child");
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "felix-nft exited early ({st}); its log:\n{}",
                self.log_text()
            );
        }
    }

    /// Polls `flows` until every verdict is the expected one; panics after [`step_deadline`] with
    /// the last matrix and the daemon's log. Returns the matching report.
    pub fn expect_matrix(&mut self, step: &str, flows: &[Flow<'_>]) -> MatrixReport {
        let t0 = Instant::now();
        loop {
            let report = run_matrix(flows, PROBE_TIMEOUT);
            if report.all_match() {
                eprintln!("step {step:?} converged after {:?}\n{report}", t0.elapsed());
                return report;
            }
            if t0.elapsed() > step_deadline() {
                let log = self.log_text();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                let threads = self
                    .child
                    .as_ref()
                    .map(|c| threads_of(c.id(), &self.netns))
                    .unwrap_or_default();
                panic!(
                    "step {step:?}: the matrix did not converge in {:?}:\n{report}\n\
                     --- felix-nft log (last 40 lines) ---\n{}\n\
                     --- felix-nft threads (what each waits in) ---\n{threads}",
                    step_deadline(),
                    tail.join("\n")
                );
            }
            self.assert_running();
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the agent and checks that it exited cleanly.
    pub fn stop_cleanly(self) {
        let (status, log) = self.stop();
        assert!(status.success(), "felix-nft exited with {status}:\n{log}");
    }

    /// Stops the daemon the way an operator does: SIGTERM (or end of stdin under strace); waits
    /// and returns its exit status and log.
    pub fn stop(mut self) -> (ExitStatus, String) {
        self.stdin = None;
        let mut child = self.child.take().expect("agent child");
        if !self.under_strace {
            // SAFETY: signalling our own child process.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
        }
        let status = wait_for(&mut child, patient(Duration::from_secs(30)));
        (status, self.log_text())
    }
}

/// Each thread of process `pid` as the kernel sees it: name, state, the kernel function it
/// sleeps in, its system call and the kernel stack (root may read it), so that a daemon that
/// stopped making progress says where it waits.
fn threads_of(pid: u32, netns: &str) -> String {
    let read = |p: &std::path::Path, f: &str| {
        std::fs::read_to_string(p.join(f))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("({f}: {e})"))
    };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("(no /proc/{pid}/task)");
    };
    let mut out = String::new();
    for t in tasks.flatten() {
        let p = t.path();
        let stat = read(&p, "stat");
        // After the parenthesised name: state (field 3), ..., utime and stime (fields 14, 15).
        let rest: Vec<&str> = stat.rsplit(") ").next().unwrap_or("").split(' ').collect();
        let state = rest.first().copied().unwrap_or("?");
        out.push_str(&format!(
            "{} {:?} state {} user {} sys {} (ticks) wchan {} syscall [{}]\n",
            t.file_name().to_string_lossy(),
            read(&p, "comm"),
            state,
            rest.get(11).unwrap_or(&"?"),
            rest.get(12).unwrap_or(&"?"),
            read(&p, "wchan"),
            read(&p, "syscall"),
        ));
        // A running thread has no stack to show while it is on a CPU: sample until it is not.
        let mut stack = read(&p, "stack");
        for _ in 0..40 {
            if state != "R" || !stack.trim().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
            stack = read(&p, "stack");
        }
        for l in stack.lines().take(16) {
            out.push_str(&format!("    {l}\n"));
        }
    }
    // Where each thread is in user space, when a debugger is at hand.
    if let Ok(bt) = Command::new("timeout")
        .args(["60", "gdb", "-batch", "-nx", "-p", &pid.to_string()])
        .args(["-ex", "thread apply all bt 30"])
        .output()
    {
        let text = String::from_utf8_lossy(&bt.stdout);
        for l in text
            .lines()
            .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
        {
            out.push_str(&format!("  {l}\n"));
        }
    }
    // Its netlink sockets (protocol, queued bytes, drops), from its own namespace's view.
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let netlink = Command::new("ip")
        .args(["netns", "exec", netns, "cat", "/proc/net/netlink"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for (i, l) in netlink.lines().enumerate() {
        let inode = l.split_whitespace().last().unwrap_or_default();
        if i == 0 || inodes.iter().any(|n| n == inode) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

fn wait_for(child: &mut Child, limit: Duration) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let st = child.wait().expect("waiting for felix-nft");
            panic!("felix-nft did not stop within {limit:?} ({st})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // End of stdin first: under strace the daemon then exits by itself.
        self.stdin = None;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A flow from `from` (label, namespace) to `to` (label, address).
pub fn flow<'a>(
    from: (&str, &'a NetNs),
    to: (&str, IpAddr),
    proto: Proto,
    port: u16,
    expect: Verdict,
) -> Flow<'a> {
    Flow {
        from: from.0.into(),
        ns: from.1,
        to: to.0.into(),
        dst: to.1,
        proto,
        port,
        expect,
    }
}

/// `(name, ns)` of a workload, the source half of a [`flow`].
pub fn src(w: &Workload) -> (&str, &NetNs) {
    (w.name.as_str(), w.ns())
}

/// `(name, IPv4)` of a workload, the destination half of a [`flow`].
pub fn v4(w: &Workload) -> (&str, IpAddr) {
    (
        w.name.as_str(),
        IpAddr::V4(w.ipv4.expect("an IPv4 workload")),
    )
}

/// `(name, IPv6)` of a workload.
pub fn v6(w: &Workload) -> (&str, IpAddr) {
    (
        w.name.as_str(),
        IpAddr::V6(w.ipv6.expect("a dual-stack workload")),
    )
}

/// `a.b.c.d/32` of a workload.
pub fn cidr4(w: &Workload) -> String {
    format!("{}/32", w.ipv4.expect("an IPv4 workload"))
}

// ---- messages (proto3 JSON, the proto's own field names) ----

pub fn in_sync() -> Value {
    json!({"in_sync": {}})
}

/// `ActiveProfileUpdate` with the given inbound and outbound rules.
pub fn profile(name: &str, inbound: Value, outbound: Value) -> Value {
    json!({"active_profile_update": {"id": {"name": name},
        "profile": {"inbound_rules": inbound, "outbound_rules": outbound}}})
}

/// The profile every scenario starts from: allow everything both ways.
pub fn allow_all_profile() -> Value {
    profile(
        "allow-all",
        json!([{"action": "allow"}]),
        json!([{"action": "allow"}]),
    )
}

/// `ActivePolicyUpdate` for policy `name` in `tier`.
pub fn policy(tier: &str, name: &str, inbound: Value, outbound: Value) -> Value {
    json!({"active_policy_update": {"id": {"name": name, "kind": "GlobalNetworkPolicy"},
        "policy": {"tier": tier, "inbound_rules": inbound, "outbound_rules": outbound}}})
}

/// A policy in tier `default` with `inbound` rules and no outbound ones.
pub fn ingress_policy(name: &str, inbound: Value) -> Value {
    policy("default", name, inbound, json!([]))
}

/// One tier of an endpoint: `(name, ingress policy names, egress policy names, default action)`.
pub fn tier(name: &str, ingress: &[&str], egress: &[&str], default_action: &str) -> Value {
    let ids = |v: &[&str]| -> Vec<Value> {
        v.iter()
            .map(|n| json!({"name": n, "kind": "GlobalNetworkPolicy"}))
            .collect()
    };
    json!({"name": name, "ingress_policies": ids(ingress), "egress_policies": ids(egress),
        "default_action": default_action})
}

/// `WorkloadEndpointUpdate` for a bed workload: its `cali` name, MAC and addresses (from the
/// bed), the profiles and tiers given, and `state` (`active` = admin up).
pub fn wep_with(w: &Workload, state: &str, profiles: &[&str], tiers: Value, extra: Value) -> Value {
    let mut ep = serde_json::to_value(w.endpoint(profiles)).expect("endpoint JSON");
    ep["state"] = json!(state);
    ep["tiers"] = tiers;
    if let (Value::Object(ep), Value::Object(extra)) = (&mut ep, extra) {
        ep.extend(extra);
    }
    json!({"workload_endpoint_update": {"id": serde_json::to_value(w.endpoint_id())
        .expect("id JSON"), "endpoint": ep}})
}

/// An active workload endpoint with profiles and tiers.
pub fn wep(w: &Workload, profiles: &[&str], tiers: Value) -> Value {
    wep_with(w, "active", profiles, tiers, json!({}))
}

/// `w` with the allow-all profile behind tier `default` of the ingress policies `ingress`
/// (default action Deny, no egress policies).
pub fn wep_ingress(w: &Workload, ingress: &[&str]) -> Value {
    wep(
        w,
        &["allow-all"],
        json!([tier("default", ingress, &[], "Deny")]),
    )
}

/// `WorkloadEndpointRemove` for a bed workload.
pub fn wep_remove(w: &Workload) -> Value {
    json!({"workload_endpoint_remove": {"id": serde_json::to_value(w.endpoint_id())
        .expect("id JSON")}})
}

/// `IPSetUpdate` (`type` by name: `IP`, `NET`, `IP_AND_PORT`).
pub fn ipset(id: &str, ty: &str, members: &[String]) -> Value {
    json!({"ipset_update": {"id": id, "type": ty, "members": members}})
}

/// `IPSetDeltaUpdate`.
pub fn ipset_delta(id: &str, added: &[String], removed: &[String]) -> Value {
    json!({"ipset_delta_update": {"id": id, "added_members": added, "removed_members": removed}})
}

/// `IPAMPoolUpdate`.
pub fn pool(id: &str, cidr: &str, masquerade: bool) -> Value {
    json!({"ipam_pool_update": {"id": id, "pool": {"cidr": cidr, "masquerade": masquerade,
        "ipip_mode": "Never", "vxlan_mode": "Never"}}})
}

/// `HostEndpointUpdate` for interface `iface`.
pub fn hep(id: &str, iface: &str, profiles: &[&str], tiers: Value) -> Value {
    json!({"host_endpoint_update": {"id": {"endpoint_id": id},
        "endpoint": {"name": iface, "profile_ids": profiles, "tiers": tiers}}})
}

/// `tcp`/`udp`/… as the proto's `Protocol` JSON.
pub fn proto(name: &str) -> Value {
    json!({"name": name})
}

/// A single-port `PortRange` list.
pub fn ports(p: &[u16]) -> Value {
    Value::Array(p.iter().map(|p| json!({"first": p, "last": p})).collect())
}

/// Polls `check` (which returns `Err(what is wrong)`) until it passes; panics after
/// [`step_deadline`] with the last complaint. For kernel state written after the tables in the
/// same apply (routes, neighbours: §10.3 order).
pub fn eventually(what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let t0 = Instant::now();
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if t0.elapsed() > step_deadline() => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Runs `ip ARGS` (a test oracle; `ip netns exec …` for `nft`) and returns its stdout; panics
/// naming `what` with its stderr when it fails.
fn ip_oracle(args: &[&str], what: &str) -> String {
    String::from_utf8_lossy(&oracle_stdout(Command::new("ip").args(args), what)).into_owned()
}

/// `nft -s list ruleset` in `ns` (test oracle).
pub fn nft_ruleset(netns_name: &str) -> String {
    ip_oracle(
        &["netns", "exec", netns_name, "nft", "-s", "list", "ruleset"],
        "nft list ruleset",
    )
}

/// Every object line of `nft -a -s list ruleset` that carries a kernel handle (tables, chains,
/// sets, rules; set elements have none). Equal before and after an update = no rule, chain or
/// set was added, replaced or deleted (a rewritten rule gets a new handle).
pub fn nft_handles(netns_name: &str) -> Vec<String> {
    ip_oracle(
        &[
            "netns", "exec", netns_name, "nft", "-a", "-s", "list", "ruleset",
        ],
        "nft -a list ruleset",
    )
    .lines()
    .filter(|l| l.contains("# handle"))
    .map(|l| l.trim().to_string())
    .collect()
}

/// `ip -n NS ARGS` (test oracle), stdout.
pub fn ip_in(netns_name: &str, args: &[&str]) -> String {
    let argv: Vec<&str> = ["-n", netns_name].iter().chain(args).copied().collect();
    ip_oracle(&argv, &format!("ip {args:?}"))
}
