//! Privileged, end to end: clusters of nodes in network namespaces, built by the test bed's
//! cluster builder ([`testbed::cluster`]). Each node is a namespace on an underlay bridge, runs
//! its own `felix-nft run --source stdin` process, and has one pod laid out as Calico's CNI
//! leaves it (a /32 on the pod's eth0, gateway 169.254.1.1, the host side a `cali*` veth); on a
//! dual-stack cluster this file adds the nodes' IPv6 underlay addresses. A small controller in this file sends each daemon what Felix's calculation
//! graph would send that node: the pool, every node's VTEP, its own block as local and the
//! others' as remote, its pod, and the policies and IP sets that pod's endpoint uses.
//!
//! Proves with real packets:
//! - pod ↔ pod ICMP and TCP across three nodes over `vxlan.calico`; VXLAN admitted only from
//!   known VTEPs; a VTEP's MAC change (traffic recovers); a node's removal; drift (the device, an FDB entry, a route or a
//!   neighbour deleted by hand) repaired without a restart;
//! - policy across nodes: an ingress rule whose IP set holds another node's pod, an ingress deny
//!   from a set holding a third node's pod, an egress deny towards it, and IP set deltas that
//!   take the admitted pod out and back and lift the denies;
//! - a node that joins later (every node's routes, neighbours, FDB and VTEP set converge) and
//!   leaves again (nothing of it stays anywhere);
//! - cross-subnet: same-subnet pods talk directly over the parent interface (no VXLAN on the
//!   wire), pods behind a router through the tunnel;
//! - a 1 MB TCP transfer between pods on two nodes;
//! - IPv6 beside IPv4: pods talk over `vxlan-v6.calico`, and a leaving node's IPv6 state goes;
//! - flow logs: each node reports its side of a flow between pods on two nodes, naming its own
//!   pod and the other end by address and node.
//!
//! `ip`, `bridge` and `nft` are oracles and set-up tools only.
//!
//! [`testbed::cluster`]: felix_nft_lab::testbed::cluster

use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::route_oracle;
use crate::testbed_common;

use felix_nft_lab::testbed::cluster::{Cluster as Underlay, ClusterSpec, NodeSpec};
use felix_nft_lab::testbed::probe::{icmp_echo, tcp_connect, TcpServer, Verdict};
use felix_nft_lab::testbed::topology::WorkloadSpec;
use rtnl::netns::NetNs;
use serde_json::{json, Value};
use testbed_common::{
    block_on, ip_n as ip, nft_n as nft, patient, require_root, sh, try_sh, NodeDaemon,
};

/// How long the cluster gets to converge after a change.
const CONVERGE: Duration = Duration::from_secs(20);
/// How long a probe waits for an answer: what an expected drop costs, and ample for an answer
/// on a busy machine.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The port pods' TCP servers listen on.
const PORT: u16 = 8080;

/// Whether an nft set element list (`nft -j` form) holds the address `ip` (either family).
fn in_set(elems: &[Value], ip: &str) -> bool {
    // Both families as 128-bit numbers, IPv4 mapped, so one comparison serves both.
    let num = |a: IpAddr| match a {
        IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
        IpAddr::V6(a) => u128::from(a),
    };
    let ip: IpAddr = ip.parse().unwrap();
    let width = if ip.is_ipv4() { 32 } else { 128 };
    let x = num(ip);
    let addr = |v: &Value| {
        v.as_str()
            .and_then(|s| s.parse::<IpAddr>().ok())
            .filter(|a| a.is_ipv4() == ip.is_ipv4())
            .map(num)
    };
    elems.iter().any(|e| {
        let e = e.get("elem").map(|e| &e["val"]).unwrap_or(e);
        if let Some(a) = addr(e) {
            return a == x;
        }
        if let Some([lo, hi]) = e.get("range").and_then(Value::as_array).map(Vec::as_slice) {
            return matches!((addr(lo), addr(hi)), (Some(lo), Some(hi)) if lo <= x && x <= hi);
        }
        if let Some(p) = e.get("prefix") {
            let (Some(a), Some(len)) = (addr(&p["addr"]), p["len"].as_u64()) else {
                return false;
            };
            let mask = u128::MAX.checked_shl(width - len as u32).unwrap_or(0);
            return a & mask == x & mask;
        }
        false
    })
}

/// What differs between the IPv4 and the IPv6 overlay.
#[derive(Debug, Clone, Copy)]
struct Fam {
    v6: bool,
}
const V4: Fam = Fam { v6: false };
const V6: Fam = Fam { v6: true };

impl Fam {
    fn dev(self) -> &'static str {
        if self.v6 {
            "vxlan-v6.calico"
        } else {
            "vxlan.calico"
        }
    }
    fn flag(self) -> &'static str {
        if self.v6 {
            "-6"
        } else {
            "-4"
        }
    }
    /// The parent's 1500 less the encapsulation: 50 bytes over IPv4, 70 over IPv6.
    fn mtu(self) -> u32 {
        if self.v6 {
            1430
        } else {
            1450
        }
    }
    fn mac(self, k: u8) -> String {
        format!("66:00:00:00:0{}:{k:02x}", u8::from(self.v6))
    }
    /// Text every address of node k's block starts with. IPv6 blocks are numbered from 10 so
    /// that no address has a zero group `ip` would compress.
    fn pool_part(self, k: u8) -> String {
        if self.v6 {
            format!("fd65::1{k}:")
        } else {
            format!("10.65.{k}.")
        }
    }
    fn tunnel_ip(self, k: u8) -> String {
        format!("{}0", self.pool_part(k))
    }
    /// Calico's IPv4 blocks are /26, its IPv6 blocks /122.
    fn block(self, k: u8) -> String {
        format!("{}/{}", self.tunnel_ip(k), if self.v6 { 122 } else { 26 })
    }
    fn pod_ip(self, k: u8) -> IpAddr {
        format!("{}2", self.pool_part(k)).parse().unwrap()
    }
    fn host_ip(self, m: &Member) -> String {
        if self.v6 {
            m.ip6()
        } else {
            m.ip()
        }
    }
}

/// A node as the controller knows it: its index and which underlay subnet it sits on.
#[derive(Debug, Clone, Copy)]
struct Member {
    k: u8,
    subnet: u8,
}

impl Member {
    fn ip(&self) -> String {
        format!("172.31.{}.1{}", self.subnet, self.k)
    }
    fn ipv4(&self) -> Ipv4Addr {
        self.ip().parse().unwrap()
    }
    /// In `ip`'s canonical form (`fd00:31::10` for subnet 0).
    fn ip6(&self) -> String {
        let a: std::net::Ipv6Addr = format!("fd00:31:{}::1{}", self.subnet, self.k)
            .parse()
            .unwrap();
        a.to_string()
    }
}

/// What the controller sends only to the node hosting a pod: the policies and IP sets its
/// endpoint uses, and the endpoint's tiers.
#[derive(Default)]
struct Local {
    msgs: Vec<Value>,
    tiers: Vec<Value>,
}

fn ipset(id: &str, members: &[IpAddr]) -> Value {
    json!({"ipset_update": {"id": id, "type": "IP", "members": members}})
}

fn ipset_delta(id: &str, added: &[IpAddr], removed: &[IpAddr]) -> Value {
    json!({"ipset_delta_update": {"id": id, "added_members": added, "removed_members": removed}})
}

fn policy(name: &str, inbound: Value, outbound: Value) -> Value {
    json!({"active_policy_update": {"id": {"name": name, "kind": "GlobalNetworkPolicy"},
        "policy": {"tier": "default", "inbound_rules": inbound, "outbound_rules": outbound}}})
}

fn tier(ingress: &[&str], egress: &[&str]) -> Value {
    let ids = |v: &[&str]| -> Vec<Value> {
        v.iter()
            .map(|n| json!({"name": n, "kind": "GlobalNetworkPolicy"}))
            .collect()
    };
    json!({"name": "default", "ingress_policies": ids(ingress), "egress_policies": ids(egress),
        "default_action": "Deny"})
}

/// A running node: its daemon, and handles on the namespaces the underlay bed made for it.
struct Node {
    member: Member,
    /// The node's namespace under `/run/netns`.
    netns: String,
    pod: NetNs,
    pod_netns: String,
    daemon: NodeDaemon,
}

impl Node {
    fn send(&mut self, msgs: &[Value]) {
        self.daemon.send(msgs);
    }
    fn name(&self) -> &str {
        &self.netns
    }
    fn log(&self) -> String {
        self.daemon.log()
    }
}

/// The underlay, the nodes and the controller's view of the cluster. Dropping it stops every
/// daemon and deletes every namespace.
struct Cluster {
    /// Field order is drop order: daemons and node namespaces first, the underlay last.
    nodes: Vec<Node>,
    /// Every node the controller knows, running or about to start.
    members: Vec<Member>,
    /// The pool's `vxlan_mode`: `Always` or `CrossSubnet`.
    mode: &'static str,
    /// Dual stack: IPv6 on the underlay and the pods, an IPv6 pool, IPv6 VTEPs.
    v6: bool,
    /// The namespaces: the underlay (`br0` for 172.31.0.0/24 and, when some node sits on
    /// subnet 1, `br1` for 172.31.1.0/24 with the underlay namespace routing between them),
    /// the nodes on it and their pods, laid out as Calico's CNI plugin leaves them.
    bed: Underlay,
    /// With flow logs on: where each node's flow socket is (`n<k>.sock`), flushed every second.
    flows: Option<tempfile::TempDir>,
}

impl Cluster {
    /// An underlay with the given nodes (`subnets[k]` = node k's subnet), each started with
    /// its `local(k)` state.
    fn build(mode: &'static str, subnets: &[u8], local: impl Fn(u8) -> Local) -> Cluster {
        Self::build_with(mode, subnets, false, false, local)
    }

    /// [`Self::build`] with flow logs on every node.
    fn build_with_flows(mode: &'static str, subnets: &[u8]) -> Cluster {
        Self::build_with(mode, subnets, false, true, |_| Local::default())
    }

    /// [`Self::build`], dual stack (one subnet only: the router has no IPv6).
    fn build_dual_stack(mode: &'static str, subnets: &[u8]) -> Cluster {
        assert!(!subnets.contains(&1), "the router speaks IPv4 only");
        Self::build_with(mode, subnets, true, false, |_| Local::default())
    }

    fn build_with(
        mode: &'static str,
        subnets: &[u8],
        v6: bool,
        flows: bool,
        local: impl Fn(u8) -> Local,
    ) -> Cluster {
        require_root();
        let routed = if subnets.contains(&1) {
            vec!["172.31.1.0/24".parse().unwrap()]
        } else {
            Vec::new()
        };
        let bed = block_on(Underlay::build(&ClusterSpec {
            prefix: "fnt-t-clvx".into(),
            routed,
            ..ClusterSpec::default()
        }))
        .unwrap_or_else(|e| panic!("building the underlay ({e}); this privileged test needs root"));
        let mut c = Cluster {
            nodes: Vec::new(),
            members: subnets
                .iter()
                .enumerate()
                .map(|(k, &subnet)| Member { k: k as u8, subnet })
                .collect(),
            mode,
            v6,
            bed,
            flows: flows.then(|| tempfile::tempdir().expect("a directory for the flow sockets")),
        };
        for k in 0..subnets.len() as u8 {
            c.start(k, local(k));
        }
        c
    }

    fn member(&self, k: u8) -> Member {
        *self
            .members
            .iter()
            .find(|m| m.k == k)
            .unwrap_or_else(|| panic!("no member n{k}"))
    }

    fn node(&self, k: u8) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.member.k == k)
            .unwrap_or_else(|| panic!("no node n{k}"))
    }

    fn node_mut(&mut self, k: u8) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.member.k == k)
            .unwrap_or_else(|| panic!("no node n{k}"))
    }

    fn ns(&self, k: u8) -> String {
        self.node(k).name().to_string()
    }

    /// Node k's VTEP as Felix sends it.
    fn vtep(&self, k: u8, mac: &str) -> Value {
        let mut v = json!({"node": format!("n{k}"), "mac": mac,
            "ipv4_addr": V4.tunnel_ip(k), "parent_device_ip": self.member(k).ip()});
        if self.v6 {
            v["mac_v6"] = json!(V6.mac(k));
            v["ipv6_addr"] = json!(V6.tunnel_ip(k));
            v["parent_device_ipv6"] = json!(self.member(k).ip6());
        }
        json!({ "vtep_update": v })
    }

    /// Node k's host metadata as Felix sends it: the node's BGP address in CIDR form.
    fn host(&self, k: u8) -> Value {
        let mut h = json!({"hostname": format!("n{k}"),
            "ipv4_addr": format!("{}/24", self.member(k).ip())});
        if self.v6 {
            h["ipv6_addr"] = json!(format!("{}/64", self.member(k).ip6()));
        }
        json!({ "host_metadata_update": h })
    }

    /// Node k's blocks (one per family) as Felix sends them to node `own`: `same_subnet` when
    /// the pool is cross-subnet and both node IPs share a subnet.
    fn blocks(&self, own: u8, k: u8) -> Vec<Value> {
        let local = k == own;
        let same_subnet = !local
            && self.mode == "CrossSubnet"
            && self.member(own).subnet == self.member(k).subnet;
        let route = |dst: String, node_ip: String| {
            json!({"route_update": {"types": if local { "LOCAL_WORKLOAD" } else { "REMOTE_WORKLOAD" },
                "ip_pool_type": "VXLAN", "dst": dst, "same_subnet": same_subnet,
                "dst_node_name": format!("n{k}"), "dst_node_ip": node_ip}})
        };
        let mut v = vec![route(V4.block(k), self.member(k).ip())];
        if self.v6 {
            v.push(route(V6.block(k), self.member(k).ip6()));
        }
        v
    }

    /// What node k's leaving costs the others: its blocks, VTEP and host (in Felix's order).
    fn removals(&self, k: u8) -> Vec<Value> {
        let mut v = vec![json!({"route_remove": {"dst": V4.block(k)}})];
        if self.v6 {
            v.push(json!({"route_remove": {"dst": V6.block(k)}}));
        }
        v.push(json!({"vtep_remove": {"node": format!("n{k}")}}));
        v.push(json!({"host_metadata_remove": {"hostname": format!("n{k}")}}));
        v
    }

    /// Creates node k (a known member) with its pod and daemon, and sends it its first sync:
    /// every known member's VTEP and block, its local state, its pod's endpoint, in-sync.
    fn start(&mut self, k: u8, local: Local) {
        let member = self.member(k);
        let (IpAddr::V4(v4), IpAddr::V6(v6)) = (V4.pod_ip(k), V6.pod_ip(k)) else {
            unreachable!("one address of each family")
        };
        let pod = if self.v6 {
            WorkloadSpec::dual(format!("p{k}"), v4, v6)
        } else {
            WorkloadSpec::v4(format!("p{k}"), v4)
        };
        let node = block_on(self.bed.add_node(&NodeSpec {
            name: format!("n{k}"),
            ip: member.ipv4(),
            pods: vec![pod],
        }))
        .unwrap_or_else(|e| panic!("adding n{k}: {e}"));
        let n = node.netns_name().to_string();
        if self.v6 {
            let addr = format!("{}/64", member.ip6());
            ip(&n, &["addr", "add", &addr, "dev", "eth0"]);
        }
        let w = &node.pods()[0];
        let (cali, pod_mac) = (w.host_ifname.clone(), w.mac_string());
        let pod = w.ns().try_clone().expect("a namespace handle");
        let pod_netns = w.netns_name().to_string();

        let socket = self.flow_socket(k);
        let mut env = vec![
            ("FELIX_NFTABLESTABLEOWNER", "false"),
            // Drift is repaired at these intervals: short, so that tests can wait for it.
            ("FELIX_ROUTEREFRESHINTERVAL", "2"),
            ("FELIX_NFTABLESREFRESHINTERVAL", "2"),
        ];
        if let Some(socket) = &socket {
            env.extend([
                ("FELIX_FLOWLOGSLOCALREPORTER", "Enabled"),
                ("FELIX_FLOWLOGSFLUSHINTERVAL", "1"),
                ("FELIX_FLOWLOGSLOCALSOCKET", socket.as_str()),
            ]);
        }
        let daemon = NodeDaemon::start(&n, &format!("n{k}"), &env);
        let mut node = Node {
            member,
            netns: n.clone(),
            pod,
            pod_netns,
            daemon,
        };
        let mut msgs = vec![
            json!({"active_profile_update": {"id": {"name": "allow-all"},
                "profile": {"inbound_rules": [{"action": "allow"}],
                            "outbound_rules": [{"action": "allow"}]}}}),
            json!({"ipam_pool_update": {"id": "10.65.0.0-16", "pool": {"cidr": "10.65.0.0/16",
                "masquerade": false, "vxlan_mode": self.mode}}}),
        ];
        if self.v6 {
            msgs.push(
                json!({"ipam_pool_update": {"id": "fd65::-64", "pool": {"cidr": "fd65::/64",
                "masquerade": false, "vxlan_mode": self.mode}}}),
            );
        }
        for m in &self.members {
            msgs.push(self.vtep(m.k, &V4.mac(m.k)));
            msgs.extend(self.blocks(k, m.k));
            msgs.push(self.host(m.k));
        }
        msgs.push(json!({"encapsulation": {"vxlan_enabled": true, "vxlan_enabled_v6": self.v6}}));
        msgs.extend(local.msgs);
        let v6_nets: Vec<String> = self
            .v6
            .then(|| format!("{}/128", V6.pod_ip(k)))
            .into_iter()
            .collect();
        msgs.push(json!({"workload_endpoint_update": {
            "id": {"orchestrator_id": "k8s", "workload_id": format!("default/p{k}"), "endpoint_id": "eth0"},
            "endpoint": {"state": "active", "name": cali, "mac": pod_mac,
                "ipv4_nets": [format!("{}/32", V4.pod_ip(k))], "ipv6_nets": v6_nets,
                "profile_ids": ["allow-all"], "tiers": local.tiers}}}));
        msgs.push(json!({"in_sync": {}}));
        node.send(&msgs);
        self.nodes.push(node);
    }

    /// Node k joins the running cluster on `subnet`: it starts with the whole cluster in its
    /// first sync, then every other node learns its VTEP, blocks and host.
    fn join(&mut self, k: u8, subnet: u8) {
        self.members.push(Member { k, subnet });
        self.start(k, Local::default());
        self.announce(k);
    }

    fn announce(&mut self, k: u8) {
        let others: Vec<u8> = self
            .nodes
            .iter()
            .map(|n| n.member.k)
            .filter(|&j| j != k)
            .collect();
        for j in others {
            let mut msgs = vec![self.vtep(k, &V4.mac(k))];
            msgs.extend(self.blocks(j, k));
            msgs.push(self.host(k));
            self.node_mut(j).send(&msgs);
        }
    }

    /// Node k leaves: every other node gets its RouteRemoves, VTEPRemove and
    /// HostMetadataRemove (in Felix's order); the node itself is handed back, still running,
    /// for the caller to drop.
    fn leave(&mut self, k: u8) -> Node {
        let removals = self.removals(k);
        self.members.retain(|m| m.k != k);
        let i = self
            .nodes
            .iter()
            .position(|n| n.member.k == k)
            .unwrap_or_else(|| panic!("no node n{k}"));
        let gone = self.nodes.remove(i);
        for node in &mut self.nodes {
            node.send(&removals);
        }
        gone
    }

    /// [`Self::leave`], then waits until every remaining node's overlay has forgotten node k.
    fn leave_and_forget(&mut self, k: u8) -> Node {
        let gone = self.member(k);
        let node = self.leave(k);
        for j in self.nodes.iter().map(|n| n.member.k) {
            self.eventually(&format!("n{k} gone from n{j}"), || {
                self.overlay_state(j, &[gone])
            });
        }
        node
    }

    /// Stops a node handed back by [`Self::leave`] and deletes its namespaces.
    fn forget(&mut self, node: Node) {
        let name = format!("n{}", node.member.k);
        drop(node);
        assert!(self.bed.remove_node(&name), "{name} was on the underlay");
    }

    /// Node k's flow socket, when flow logs are on.
    fn flow_socket(&self, k: u8) -> Option<String> {
        (self.flows.as_ref()).map(|d| d.path().join(format!("n{k}.sock")).display().to_string())
    }

    /// Node k's flow records, as `felix-nft flows --json` prints them.
    fn flow_records(&self, k: u8) -> Vec<Value> {
        let socket = self.flow_socket(k).expect("flow logs are on");
        let out = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
            .args(["flows", "--json", "--socket", &socket])
            .output()
            .expect("running felix-nft flows");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// A TCP server on [`PORT`] in every running node's pod.
    fn servers(&self) -> Vec<TcpServer> {
        self.nodes
            .iter()
            .map(|n| TcpServer::start(&n.pod, PORT).unwrap())
            .collect()
    }

    /// Polls `check` until it passes; panics after [`CONVERGE`] ([`patient`]) with the last complaint and
    /// every daemon's log.
    fn eventually(&self, what: &str, mut check: impl FnMut() -> Result<(), String>) {
        let deadline = Instant::now() + patient(CONVERGE);
        loop {
            match check() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => {
                    let logs: String = self
                        .nodes
                        .iter()
                        .map(|n| format!("--- {}\n{}", n.name(), n.log()))
                        .collect();
                    panic!("{what}: {e}\n{logs}");
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    fn ping(&self, from: u8, to: u8) -> Verdict {
        self.ping_in(from, to, V4)
    }

    /// ICMP (ICMPv6) echo from pod `from` to pod `to`'s address of the family.
    fn ping_in(&self, from: u8, to: u8, f: Fam) -> Verdict {
        let dst = f.pod_ip(to);
        icmp_echo(&self.node(from).pod, dst, PROBE_TIMEOUT)
            .unwrap_or_else(|e| panic!("ICMP probe p{from} → p{to} {dst}: {e}"))
    }

    /// TCP connect from pod `from` to pod `to`'s [`PORT`].
    fn tcp(&self, from: u8, to: u8) -> Verdict {
        self.tcp_in(from, to, V4)
    }

    fn tcp_in(&self, from: u8, to: u8, f: Fam) -> Verdict {
        let dst = SocketAddr::new(f.pod_ip(to), PORT);
        tcp_connect(&self.node(from).pod, dst, PROBE_TIMEOUT)
            .unwrap_or_else(|e| panic!("TCP probe p{from} → {dst}: {e}"))
    }

    fn wait_ping(&self, from: u8, to: u8, expect: Verdict) {
        self.wait_ping_in(from, to, expect, V4)
    }

    fn wait_ping_in(&self, from: u8, to: u8, expect: Verdict, f: Fam) {
        let dst = f.pod_ip(to);
        self.eventually(&format!("ping p{from} → p{to} {dst} {expect}"), || {
            let v = self.ping_in(from, to, f);
            (v == expect).then_some(()).ok_or(format!("{v}"))
        });
    }

    fn wait_tcp(&self, from: u8, to: u8, expect: Verdict) {
        self.eventually(&format!("TCP p{from} → p{to} {expect}"), || {
            let v = self.tcp(from, to);
            (v == expect).then_some(()).ok_or(format!("{v}"))
        });
    }

    /// Waits until the family's VXLAN device on node k is up with Felix's VNI and port, and
    /// the parent's MTU less the encapsulation.
    fn wait_device(&self, k: u8, f: Fam) {
        let n = self.ns(k);
        self.eventually(&format!("{} programmed on n{k}", f.dev()), || {
            let links: Value =
                serde_json::from_str(&ip(&n, &["-d", "-j", "link", "show"])).unwrap();
            let dev = links
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["ifname"] == f.dev())
                .ok_or(format!("no {}", f.dev()))?;
            let info = &dev["linkinfo"]["info_data"];
            (info["id"] == 4096 && info["port"] == 4789 && dev["mtu"] == f.mtu())
                .then_some(())
                .ok_or(format!("{dev}"))
        });
    }

    fn fdb(&self, k: u8, f: Fam) -> Result<String, String> {
        try_sh(&["bridge", "-n", &self.ns(k), "fdb", "show", "dev", f.dev()])
    }

    fn neigh(&self, k: u8, f: Fam) -> Result<String, String> {
        let ns = self.ns(k);
        try_sh(&["ip", "-n", &ns, f.flag(), "neigh", "show", "dev", f.dev()])
    }

    fn routes(&self, k: u8, f: Fam) -> String {
        route_oracle::routes(&self.ns(k), &[f.flag()])
    }

    /// The elements of the internal IP set `name` (`all-vxlan-net`, `all-hosts-net`) of the
    /// family on node k, read from the kernel (`nft -j` shows an address, a prefix or a range
    /// per element).
    fn internal_set(&self, k: u8, f: Fam, name: &str) -> Result<Vec<Value>, String> {
        let (table, set) = if f.v6 {
            ("ip6", format!("cali60{name}"))
        } else {
            ("ip", format!("cali40{name}"))
        };
        let ns = self.ns(k);
        let argv = [
            "ip", "netns", "exec", &ns, "nft", "-j", "list", "set", table, "calico",
        ];
        let out = try_sh(&[&argv[..], &[set.as_str()]].concat())?;
        let v: Value = serde_json::from_str(&out).unwrap();
        Ok(v["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o.get("set"))
            .flat_map(|s| s["elem"].as_array().cloned().unwrap_or_default())
            .collect())
    }

    /// Node k's route to node j's block, as `ip route` prints it.
    fn route_to(&self, k: u8, j: u8, f: Fam) -> Option<String> {
        let dst = format!("{} ", f.block(j));
        self.routes(k, f)
            .lines()
            .find(|l| l.starts_with(&dst))
            .map(String::from)
    }

    /// Node k routes node j's block through the tunnel, with the tunnel's MTU:
    /// `via <j's tunnel IP> dev vxlan.calico onlink mtu 1450` (`vxlan-v6.calico`, 1430).
    fn tunnel_route(&self, k: u8, j: u8, f: Fam) -> Result<(), String> {
        let l = self.route_to(k, j, f);
        let via = format!("{} via {} dev {} ", f.block(j), f.tunnel_ip(j), f.dev());
        let mtu = format!(" mtu {}", f.mtu());
        l.as_deref()
            .filter(|l| l.starts_with(&via) && l.contains(" onlink") && l.contains(&mtu))
            .map(|_| ())
            .ok_or(format!("n{k}'s route to n{j}: {l:?}"))
    }

    /// Node k routes node j's block straight to j over the parent, as Felix does for a
    /// cross-subnet pool within one subnet: `via <j's IP> dev eth0 proto 80 onlink`.
    fn direct_route(&self, k: u8, j: u8) -> Result<(), String> {
        let l = self.route_to(k, j, V4);
        let via = format!(
            "{} via {} dev eth0 proto 80 ",
            V4.block(j),
            self.member(j).ip()
        );
        l.as_deref()
            .filter(|l| l.starts_with(&via) && l.contains(" onlink"))
            .map(|_| ())
            .ok_or(format!("n{k}'s route to n{j}: {l:?}"))
    }

    /// Checks that node k holds what Felix programs for the other members — a route through
    /// the tunnel, a permanent neighbour and FDB entry, an `all-vxlan-net` and an
    /// `all-hosts-net` member per remote node — and nothing at all for `gone` (nodes that left),
    /// in each family the cluster has.
    fn overlay_state(&self, k: u8, gone: &[Member]) -> Result<(), String> {
        self.overlay_family(k, gone, V4)?;
        if self.v6 {
            self.overlay_family(k, gone, V6)?;
        }
        Ok(())
    }

    /// [`Self::overlay_state`] for one family. `all-vxlan-net` leaves out k's own address,
    /// `all-hosts-net` holds it (§5.1).
    fn overlay_family(&self, k: u8, gone: &[Member], fam: Fam) -> Result<(), String> {
        let (r, a, f) = (self.routes(k, fam), self.neigh(k, fam)?, self.fdb(k, fam)?);
        let vteps = self.internal_set(k, fam, "all-vxlan-net")?;
        let hosts = self.internal_set(k, fam, "all-hosts-net")?;
        // The routes' nexthop objects on the device: one per other node, none stray.
        let objects: Vec<String> = try_sh(&["ip", "-n", &self.ns(k), "nexthop", "show"])?
            .lines()
            .filter(|l| l.contains(&format!(" dev {} ", fam.dev())))
            .map(String::from)
            .collect();
        let dump = || {
            format!(
                "on n{k}:\n{r}\n{a}\n{f}\nvteps {vteps:?}\nhosts {hosts:?}\nobjects {objects:?}"
            )
        };
        let others = self.members.iter().filter(|m| m.k != k).count();
        if objects.len() != others {
            return Err(format!(
                "{} nexthop objects for {others} nodes {}",
                objects.len(),
                dump()
            ));
        }
        let own = fam.host_ip(&self.member(k));
        if in_set(&vteps, &own) || !in_set(&hosts, &own) {
            return Err(format!("n{k}'s own address {}", dump()));
        }
        for m in self.members.iter().filter(|m| m.k != k) {
            let (j, host) = (m.k, fam.host_ip(m));
            let neigh = format!("{} lladdr {} PERMANENT", fam.tunnel_ip(j), fam.mac(j));
            let fdb = format!("{} dst {host} self permanent", fam.mac(j));
            if !(self.tunnel_route(k, j, fam).is_ok()
                && a.contains(&neigh)
                && f.contains(&fdb)
                && in_set(&vteps, &host)
                && in_set(&hosts, &host))
            {
                return Err(format!("n{j} incomplete {}", dump()));
            }
        }
        for m in gone {
            let (j, host) = (m.k, fam.host_ip(m));
            let via = format!("via {} ", fam.tunnel_ip(j));
            if r.contains(&fam.pool_part(j))
                || objects.iter().any(|o| o.contains(&via))
                || a.contains(&fam.tunnel_ip(j))
                || f.contains(&fam.mac(j))
                || f.contains(&host)
                || in_set(&vteps, &host)
                || in_set(&hosts, &host)
            {
                return Err(format!("n{j} still there {}", dump()));
            }
        }
        Ok(())
    }

    /// A named counter of VXLAN frames entering the underlay bridges from a port (our own table
    /// in the underlay namespace; the nodes' daemons never see it). Counted where frames come
    /// in, because between subnets the underlay namespace routes: those frames are not
    /// bridged from port to port.
    fn count_vxlan_on_the_wire(&self) {
        let l = self.bed.lan_netns_name();
        nft(l, &["add", "table", "bridge", "wire"]);
        nft(l, &["add", "counter", "bridge", "wire", "vxlan"]);
        nft(
            l,
            &[
                "add",
                "chain",
                "bridge",
                "wire",
                "frames",
                "{",
                "type",
                "filter",
                "hook",
                "prerouting",
                "priority",
                "0",
                ";",
                "}",
            ],
        );
        nft(
            l,
            &[
                "add", "rule", "bridge", "wire", "frames", "udp", "dport", "4789", "counter",
                "name", "vxlan",
            ],
        );
    }

    fn vxlan_frames_on_the_wire(&self) -> u64 {
        let out = nft(
            self.bed.lan_netns_name(),
            &["-j", "list", "counter", "bridge", "wire", "vxlan"],
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        v["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|o| o["counter"]["packets"].as_u64())
            .unwrap_or_else(|| panic!("no counter in {out}"))
    }

    /// Packets node k sent into `vxlan.calico`.
    fn tunnel_tx(&self, k: u8) -> u64 {
        let ns = self.ns(k);
        let out = sh(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "cat",
            "/sys/class/net/vxlan.calico/statistics/tx_packets",
        ]);
        out.trim().parse().unwrap()
    }

    /// Asserts no daemon has exited.
    fn daemons_alive(&mut self) {
        for node in self.nodes.iter_mut() {
            let status = node.daemon.child.try_wait().unwrap();
            assert!(status.is_none(), "{} exited: {}", node.name(), node.log());
        }
    }
}

#[test]
fn pods_on_three_nodes_talk_over_vxlan_and_the_overlay_heals() {
    let mut c = Cluster::build("Always", &[0, 0, 0], |_| Local::default());

    // The device as Felix makes it, and a route, neighbour, FDB entry and set member per
    // remote node, on every node.
    for k in 0..3 {
        c.wait_device(k, V4);
        c.eventually(&format!("n{k}'s overlay"), || c.overlay_state(k, &[]));
    }
    let n0 = c.ns(0);
    let routes = c.routes(0, V4);
    assert!(
        routes.contains("10.65.1.0/26 via 10.65.1.0 dev vxlan.calico"),
        "{routes}"
    );
    assert!(
        routes.contains("blackhole 10.65.0.0/26 proto 80"),
        "{routes}"
    );
    let f = c.fdb(0, V4).unwrap();
    assert!(
        f.contains(&format!("{} dst 172.31.0.11 self permanent", V4.mac(1))),
        "{f}"
    );
    let neigh = c.neigh(0, V4).unwrap();
    assert!(
        neigh.contains(&format!("10.65.2.0 lladdr {} PERMANENT", V4.mac(2))),
        "{neigh}"
    );

    // Pod ↔ pod, every ordered pair, ICMP.
    for (a, b) in pairs(3) {
        c.wait_ping(a, b, Verdict::Pass);
    }
    // TCP across nodes.
    let _server = TcpServer::start(&c.node(0).pod, PORT).unwrap();
    for from in 1..3 {
        assert_eq!(c.tcp(from, 0), Verdict::Pass, "TCP p{from} → p0");
    }

    // n0 admits VXLAN only from known VTEPs (§5.2; Calico's FV does the same): with
    // n0's daemon paused and n2's address taken out of n0's all-vxlan-net by hand, p2 → p0 is
    // dropped while p1 → p0 still passes. Resumed, the daemon puts the address back at its
    // next table refresh.
    let daemon = c.node(0).daemon.child.id() as libc::pid_t;
    // SAFETY: signals a child this test spawned and still owns.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGSTOP) }, 0);
    let set = ["ip", "calico", "cali40all-vxlan-net"];
    nft(&n0, &[&["flush", "set"][..], &set].concat());
    nft(
        &n0,
        &[&["add", "element"][..], &set, &["{ 172.31.0.11 }"]].concat(),
    );
    assert_eq!(
        c.ping(1, 0),
        Verdict::Pass,
        "ping p1 → p0, n1 still a known VTEP"
    );
    assert_eq!(
        c.tcp(2, 0),
        Verdict::Drop,
        "TCP p2 → p0, n2 no longer a known VTEP"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGCONT) }, 0);
    c.eventually("n2 back in n0's all-vxlan-net", || c.overlay_state(0, &[]));
    c.wait_tcp(2, 0, Verdict::Pass);

    // n1's VTEP MAC changes (Felix sends Remove then Update to every node): n1's device is
    // re-created with the new MAC, the others' ARP and FDB entries follow, traffic recovers.
    let new_mac = "66:00:00:00:00:aa";
    let update = [json!({"vtep_remove": {"node": "n1"}}), c.vtep(1, new_mac)];
    for node in c.nodes.iter_mut() {
        node.send(&update);
    }
    c.eventually("n1's new MAC in n0's FDB", || {
        let f = c.fdb(0, V4)?;
        (f.contains(&format!("{new_mac} dst 172.31.0.11")) && !f.contains(&V4.mac(1)))
            .then_some(())
            .ok_or(f)
    });
    c.eventually("n1's device has the new MAC", || {
        // Re-created: for a moment it does not exist.
        let out = Command::new("ip")
            .args(["-n", &c.ns(1), "link", "show", "vxlan.calico"])
            .output()
            .map_err(|e| e.to_string())?;
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        out.contains(new_mac).then_some(()).ok_or(out)
    });
    c.wait_ping(0, 1, Verdict::Pass);

    // Drift on n0: the device deleted by hand comes back with its routes, ARP and FDB.
    ip(&n0, &["link", "del", "vxlan.calico"]);
    c.wait_ping(0, 2, Verdict::Pass);
    let routes = c.routes(0, V4);
    assert!(
        routes.contains("10.65.2.0/26 via 10.65.2.0 dev vxlan.calico"),
        "{routes}"
    );
    // An FDB entry deleted by hand is back within the route refresh interval (2 s here).
    sh(&[
        "bridge",
        "-n",
        &n0,
        "fdb",
        "del",
        &V4.mac(2),
        "dev",
        "vxlan.calico",
        "self",
    ]);
    c.eventually("n2's FDB entry repaired", || {
        let f = c.fdb(0, V4)?;
        f.contains(&format!("{} dst 172.31.0.12", V4.mac(2)))
            .then_some(())
            .ok_or(f)
    });
    // So are a route and a neighbour entry.
    ip(&n0, &["route", "del", "10.65.2.0/26"]);
    ip(&n0, &["neigh", "del", "10.65.2.0", "dev", "vxlan.calico"]);
    c.eventually("n2's route and neighbour repaired", || {
        let (r, a) = (c.routes(0, V4), c.neigh(0, V4)?);
        let neigh = format!("10.65.2.0 lladdr {} PERMANENT", V4.mac(2));
        (r.contains("10.65.2.0/26 via 10.65.2.0 dev vxlan.calico") && a.contains(&neigh))
            .then_some(())
            .ok_or(format!("{r}\n{a}"))
    });
    c.wait_ping(0, 2, Verdict::Pass);

    // n2 leaves n0's view: its block route and VTEP go (RouteRemove first, as Felix orders
    // them); its FDB entry, ARP entry and route vanish and p0 can no longer reach p2.
    c.node_mut(0).send(&[
        json!({"route_remove": {"dst": "10.65.2.0/26"}}),
        json!({"vtep_remove": {"node": "n2"}}),
    ]);
    c.eventually("n2 gone from n0", || {
        let (f, r, a) = (c.fdb(0, V4)?, c.routes(0, V4), c.neigh(0, V4)?);
        (!f.contains(&V4.mac(2)) && !r.contains("10.65.2.0/26") && !a.contains("10.65.2.0"))
            .then_some(())
            .ok_or(format!("{f}\n{r}\n{a}"))
    });
    assert_ne!(c.ping(0, 2), Verdict::Pass, "p0 → p2 after n2 left");
    assert_eq!(c.ping(0, 1), Verdict::Pass, "p0 → p1 unaffected");

    c.daemons_alive();
}

#[test]
fn policy_holds_across_nodes_and_follows_ip_set_deltas() {
    // p1 admits only what is in `s:pods-n0` (p0) and may not send to `s:pods-n2` (p2); p0
    // denies what is in `s:pods-n2` (p2) and admits the rest. The sets and policies go only to
    // the node hosting the endpoint that uses them, as Felix sends them.
    let ingress = "default.ingress-from-n0";
    let egress = "default.egress-not-n2";
    let deny = "default.ingress-deny-n2";
    let mut c = Cluster::build("Always", &[0, 0, 0], |k| match k {
        0 => Local {
            msgs: vec![
                ipset("s:pods-n2", &[V4.pod_ip(2)]),
                policy(
                    deny,
                    json!([{"action": "deny", "src_ip_set_ids": ["s:pods-n2"]},
                           {"action": "allow"}]),
                    json!([]),
                ),
            ],
            tiers: vec![tier(&[deny], &[])],
        },
        1 => Local {
            msgs: vec![
                ipset("s:pods-n0", &[V4.pod_ip(0)]),
                ipset("s:pods-n2", &[V4.pod_ip(2)]),
                policy(
                    ingress,
                    json!([{"action": "allow", "src_ip_set_ids": ["s:pods-n0"]}]),
                    json!([]),
                ),
                policy(
                    egress,
                    json!([]),
                    json!([{"action": "deny", "dst_ip_set_ids": ["s:pods-n2"]},
                           {"action": "allow"}]),
                ),
            ],
            tiers: vec![tier(&[ingress], &[egress])],
        },
        _ => Local::default(),
    });
    let _servers = c.servers();
    // The overlay is complete everywhere, so what fails below fails by policy.
    for k in 0..3 {
        c.eventually(&format!("n{k}'s overlay"), || c.overlay_state(k, &[]));
    }
    c.wait_ping(0, 2, Verdict::Pass);

    // Ingress on n0: n1's pod is admitted, n2's pod denied.
    c.wait_tcp(1, 0, Verdict::Pass);
    assert_eq!(c.ping(2, 0), Verdict::Drop, "ping p2 → p0");
    assert_eq!(c.tcp(2, 0), Verdict::Drop, "TCP p2 → p0");
    // Ingress on n1: the pod of n0 is admitted, the pod of n2 is not.
    c.wait_ping(0, 1, Verdict::Pass);
    c.wait_tcp(0, 1, Verdict::Pass);
    assert_eq!(c.ping(2, 1), Verdict::Drop, "ping p2 → p1");
    assert_eq!(c.tcp(2, 1), Verdict::Drop, "TCP p2 → p1");
    // Egress from n1: towards n0's pod allowed, towards n2's pod denied.
    assert_eq!(c.ping(1, 0), Verdict::Pass, "ping p1 → p0");
    assert_eq!(c.tcp(1, 0), Verdict::Pass, "TCP p1 → p0");
    assert_eq!(c.ping(1, 2), Verdict::Drop, "ping p1 → p2");
    assert_eq!(c.tcp(1, 2), Verdict::Drop, "TCP p1 → p2");

    // p0 leaves the admitted set by delta: new connections from it are dropped; back in, they
    // pass again. (TCP: every probe is a new connection, which conntrack cannot let through.)
    c.node_mut(1)
        .send(&[ipset_delta("s:pods-n0", &[], &[V4.pod_ip(0)])]);
    c.wait_tcp(0, 1, Verdict::Drop);
    c.node_mut(1)
        .send(&[ipset_delta("s:pods-n0", &[V4.pod_ip(0)], &[])]);
    c.wait_tcp(0, 1, Verdict::Pass);

    // p2 joins the admitted set and leaves the denied one: both of its directions open, which
    // also shows the drops above were the policy's and not the path's.
    c.node_mut(1).send(&[
        ipset_delta("s:pods-n0", &[V4.pod_ip(2)], &[]),
        ipset_delta("s:pods-n2", &[], &[V4.pod_ip(2)]),
    ]);
    c.wait_tcp(2, 1, Verdict::Pass);
    c.wait_tcp(1, 2, Verdict::Pass);
    assert_eq!(c.tcp(0, 1), Verdict::Pass, "TCP p0 → p1 still admitted");
    // And n0 stops denying it.
    c.node_mut(0)
        .send(&[ipset_delta("s:pods-n2", &[], &[V4.pod_ip(2)])]);
    c.wait_tcp(2, 0, Verdict::Pass);

    c.daemons_alive();
}

#[test]
fn a_node_joins_later_and_leaves_without_a_trace() {
    let mut c = Cluster::build("Always", &[0, 0], |_| Local::default());
    for k in 0..2 {
        c.eventually(&format!("n{k}'s overlay"), || c.overlay_state(k, &[]));
    }
    c.wait_ping(0, 1, Verdict::Pass);

    // n2 joins: its own first sync holds the whole cluster, the others learn of it by update.
    c.join(2, 0);
    c.wait_device(2, V4);
    for k in 0..3 {
        c.eventually(&format!("n{k}'s overlay after n2 joined"), || {
            c.overlay_state(k, &[])
        });
    }
    let r = c.routes(2, V4);
    assert!(r.contains("blackhole 10.65.2.0/26 proto 80"), "{r}");
    let _servers = c.servers();
    for (a, b) in [(0, 2), (2, 0), (1, 2), (2, 1)] {
        c.wait_ping(a, b, Verdict::Pass);
        assert_eq!(c.tcp(a, b), Verdict::Pass, "TCP p{a} → p{b}");
    }

    // n2 leaves: every other node drops its route, neighbour, FDB entry and set members, and
    // its pod (still running, its node still believing in the cluster) is cut off both ways.
    let n2 = c.leave_and_forget(2);
    for k in 0..2 {
        assert_ne!(c.ping(k, 2), Verdict::Pass, "ping p{k} → p2 after n2 left");
        assert_ne!(c.tcp(k, 2), Verdict::Pass, "TCP p{k} → p2 after n2 left");
        let v = icmp_echo(&n2.pod, V4.pod_ip(k), PROBE_TIMEOUT).unwrap();
        assert_ne!(v, Verdict::Pass, "ping p2 → p{k} after n2 left");
    }
    c.forget(n2);
    c.wait_ping(0, 1, Verdict::Pass);
    c.wait_ping(1, 0, Verdict::Pass);

    c.daemons_alive();
}

#[test]
fn cross_subnet_goes_direct_on_the_subnet_and_through_the_tunnel_across_the_router() {
    // n0 and n1 on 172.31.0.0/24, n2 on 172.31.1.0/24 behind the router.
    let c = Cluster::build("CrossSubnet", &[0, 0, 1], |_| Local::default());
    c.count_vxlan_on_the_wire();
    for k in 0..3 {
        c.wait_device(k, V4);
    }
    // Same subnet: straight to the node over the parent; across the router: the tunnel.
    for (k, j) in [(0, 1), (1, 0)] {
        c.eventually(&format!("n{k}'s direct route to n{j}"), || {
            c.direct_route(k, j)
        });
    }
    for (k, j) in [(0, 2), (1, 2), (2, 0), (2, 1)] {
        c.eventually(&format!("n{k}'s tunnel route to n{j}"), || {
            c.tunnel_route(k, j, V4)
        });
    }
    let _servers = c.servers();
    for (a, b) in pairs(3) {
        c.wait_ping(a, b, Verdict::Pass);
    }

    // Same-subnet traffic: no VXLAN frame on the wire, nothing into either tunnel device.
    let (wire, tx0, tx1) = (c.vxlan_frames_on_the_wire(), c.tunnel_tx(0), c.tunnel_tx(1));
    for _ in 0..10 {
        assert_eq!(c.ping(0, 1), Verdict::Pass, "ping p0 → p1");
        assert_eq!(c.ping(1, 0), Verdict::Pass, "ping p1 → p0");
        assert_eq!(c.tcp(0, 1), Verdict::Pass, "TCP p0 → p1");
    }
    assert_eq!(
        c.vxlan_frames_on_the_wire(),
        wire,
        "VXLAN on the wire p0 ↔ p1"
    );
    assert_eq!(c.tunnel_tx(0), tx0, "n0's vxlan.calico TX during p0 ↔ p1");
    assert_eq!(c.tunnel_tx(1), tx1, "n1's vxlan.calico TX during p0 ↔ p1");

    // Across the router: every packet is encapsulated, both ways.
    let (tx0, tx2) = (c.tunnel_tx(0), c.tunnel_tx(2));
    for _ in 0..10 {
        assert_eq!(c.ping(0, 2), Verdict::Pass, "ping p0 → p2");
        assert_eq!(c.tcp(2, 0), Verdict::Pass, "TCP p2 → p0");
    }
    // Each echo and each handshake crosses both bridges, one way and back.
    let frames = c.vxlan_frames_on_the_wire() - wire;
    assert!(
        frames >= 20,
        "{frames} VXLAN frames on the wire for p0 ↔ p2"
    );
    assert!(
        c.tunnel_tx(0) >= tx0 + 20,
        "n0's vxlan.calico TX for p0 ↔ p2"
    );
    assert!(
        c.tunnel_tx(2) >= tx2 + 20,
        "n2's vxlan.calico TX for p0 ↔ p2"
    );
}

/// Every ordered pair of distinct nodes among `0..n`.
fn pairs(n: u8) -> Vec<(u8, u8)> {
    (0..n)
        .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect()
}

/// One TCP connection from pod `from` to a sink in pod `to` carrying `data`; returns what the
/// sink read before the sender closed.
fn bulk_transfer(c: &Cluster, from: u8, to: u8, data: &[u8]) -> io::Result<Vec<u8>> {
    let listener = c
        .node(to)
        .pod
        .run(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap()?;
    let port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    let sink = std::thread::spawn(move || -> io::Result<Vec<u8>> {
        let deadline = Instant::now() + patient(Duration::from_secs(30));
        let mut conn = loop {
            match listener.accept() {
                Ok((conn, _)) => break conn,
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(e),
            }
        };
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(patient(Duration::from_secs(20))))?;
        let mut got = Vec::new();
        conn.read_to_end(&mut got)?;
        Ok(got)
    });
    let dst = SocketAddr::new(V4.pod_ip(to), port);
    let sent = (|| -> io::Result<()> {
        let mut conn = c
            .node(from)
            .pod
            .run(|| TcpStream::connect_timeout(&dst, patient(Duration::from_secs(5))))
            .unwrap()?;
        conn.set_write_timeout(Some(patient(Duration::from_secs(20))))?;
        conn.write_all(data)?;
        conn.shutdown(Shutdown::Write)
    })();
    let got = sink.join().expect("sink thread panicked");
    sent?;
    got
}

#[test]
fn a_megabyte_crosses_the_tunnel_in_one_tcp_connection() {
    let c = Cluster::build("Always", &[0, 0], |_| Local::default());
    c.wait_ping(0, 1, Verdict::Pass);
    c.wait_ping(1, 0, Verdict::Pass);
    // Not compressible, not periodic: a corrupted or reordered segment would show.
    let mut x: u32 = 0x1234_5678;
    let data: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    for (a, b) in [(0, 1), (1, 0)] {
        // The pods' links have the veth default MTU (1500), the tunnel 1450: the sender learns
        // the path MTU from the node's "fragmentation needed", which must reach it through the
        // node's rules. Forgetting what the receiver learnt in the other direction makes it
        // advertise a full-size MSS again, so each direction finds the tunnel MTU itself.
        ip(c.node(b).pod_netns.as_str(), &["route", "flush", "cache"]);
        let got = bulk_transfer(&c, a, b, &data).unwrap_or_else(|e| {
            panic!(
                "1 MB p{a} → p{b}: {e}\nroutes on n{a}:\n{}",
                c.routes(a, V4)
            )
        });
        assert_eq!(got.len(), data.len(), "bytes received p{a} → p{b}");
        assert!(
            got == data,
            "the bytes p{b} received differ from those p{a} sent"
        );
        // The sender did meet the tunnel's MTU on the way, and learnt it.
        let learnt = ip(
            c.node(a).pod_netns.as_str(),
            &["route", "get", &V4.pod_ip(b).to_string()],
        );
        assert!(
            learnt.contains(" mtu 1450"),
            "p{a}'s path to p{b}: {learnt}"
        );
    }
}

#[test]
fn ipv6_pods_talk_over_vxlan_v6_beside_ipv4() {
    let mut c = Cluster::build_dual_stack("Always", &[0, 0, 0]);
    // Both devices, and per remote node a route, neighbour, FDB entry and set member in each
    // family; a blackhole for the node's own IPv6 block.
    for k in 0..3 {
        c.wait_device(k, V4);
        c.wait_device(k, V6);
        c.eventually(&format!("n{k}'s overlay"), || c.overlay_state(k, &[]));
        let r = c.routes(k, V6);
        let blackhole = format!("blackhole {} ", V6.block(k));
        assert!(
            r.lines()
                .any(|l| l.starts_with(&blackhole) && l.contains(" proto 80 ")),
            "n{k}:\n{r}"
        );
    }
    let _servers = c.servers();
    for (a, b) in pairs(3) {
        c.wait_ping_in(a, b, Verdict::Pass, V6);
        assert_eq!(c.tcp_in(a, b, V6), Verdict::Pass, "TCP6 p{a} → p{b}");
        assert_eq!(c.ping(a, b), Verdict::Pass, "ping p{a} → p{b}");
    }

    // n2 leaves: both families of it go from the others, and its pod is out of reach.
    let n2 = c.leave_and_forget(2);
    for k in 0..2 {
        assert_ne!(c.ping_in(k, 2, V6), Verdict::Pass, "ping6 p{k} → p2");
        assert_ne!(c.tcp_in(k, 2, V6), Verdict::Pass, "TCP6 p{k} → p2");
    }
    c.forget(n2);
    c.wait_ping_in(0, 1, Verdict::Pass, V6);
    c.wait_ping_in(1, 0, Verdict::Pass, V6);

    c.daemons_alive();
}

#[test]
fn each_node_reports_its_side_of_a_flow_between_pods_on_two_nodes() {
    let c = Cluster::build_with_flows("Always", &[0, 0]);
    let _servers = c.servers();
    c.wait_tcp(0, 1, Verdict::Pass);
    // Both nodes' records of p0 → p1: n0 by p0's egress (the source), n1 by p1's ingress (the
    // destination). Each names its own pod, and the other end by address and node (the
    // driver protocol names no other node's pods; this node's routes say whose block it is).
    let (p0, p1) = (V4.pod_ip(0).to_string(), V4.pod_ip(1).to_string());
    c.eventually("both nodes report p0 → p1", || {
        let src = c.flow_records(0);
        let dst = c.flow_records(1);
        let find = |all: &[Value], reporter: &str| -> Option<Value> {
            all.iter()
                .find(|r| r["key"]["reporter"] == reporter && r["key"]["dest_port"] == PORT)
                .cloned()
        };
        let (Some(s), Some(d)) = (find(&src, "src"), find(&dst, "dst")) else {
            return Err(format!("n0: {src:?}\nn1: {dst:?}"));
        };
        let want_src = json!({"kind": "workload", "name": "p0", "namespace": "default"});
        let want_dst_remote = json!({"kind": "network", "name": p1, "node": "n1"});
        let want_src_remote = json!({"kind": "network", "name": p0, "node": "n0"});
        let want_dst = json!({"kind": "workload", "name": "p1", "namespace": "default"});
        if s["key"]["src"] != want_src || s["key"]["dst"] != want_dst_remote {
            return Err(format!("n0's record names the ends wrong: {s:#}"));
        }
        if d["key"]["src"] != want_src_remote || d["key"]["dst"] != want_dst {
            return Err(format!("n1's record names the ends wrong: {d:#}"));
        }
        for r in [&s, &d] {
            if r["key"]["action"] != "allow" || r["key"]["trace"][0]["name"] != "allow-all" {
                return Err(format!("not allowed by allow-all: {r:#}"));
            }
        }
        Ok(())
    });
}
