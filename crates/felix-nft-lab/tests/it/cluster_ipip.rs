//! Privileged, end to end: IPIP clusters of nodes in network namespaces, built by the test bed's
//! cluster builder ([`testbed::cluster`]), each node running its own `felix-nft run --source
//! stdin` and told what Felix's calculation graph would tell it for an IPIP pool: every node's
//! block (its own as local, the others' as remote, `ip_pool_type` IPIP) and host metadata, the
//! pool, `Encapsulation{ipip_enabled}`, its pod; `IpInIpTunnelAddr` is the first address of the
//! node's block, and `ProgramClusterRoutes` keeps Felix's default (`EnabledIPIPOnly`: Felix, not
//! BIRD, programs the IPIP routes).
//!
//! What is proved depends on the kernel, which the test probes first (`modprobe ipip`, then
//! `/sys/module/ipip`):
//! - with the module: `tunl0` configured as Felix does (MTU 1480, the tunnel address as its one
//!   IPv4 address, up), remote blocks `via <node> dev tunl0 onlink proto 80 mtu 1480`; pod ↔ pod
//!   both ways across three nodes with IPIP (and no pod address) on the wire; a deny that holds
//!   across nodes; IPIP from a host that is not a node reaches no pod, and does once the host
//!   is in `all-hosts-net`; tunl0 repaired after drift; a node joining and leaving; cross-subnet
//!   direct within a subnet and through tunl0 across the router;
//! - without it (our build machines): the agent says once that the kernel has no ipip module,
//!   everything else keeps working: the firewall, and in cross-subnet mode the direct routes
//!   and traffic between nodes of one subnet.
//!
//! `ip` and `nft` are oracles and set-up tools only.
//!
//! [`testbed::cluster`]: felix_nft_lab::testbed::cluster

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
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

const CONVERGE: Duration = Duration::from_secs(20);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const PORT: u16 = 8080;
/// The parent's 1500 less IPIP's 20.
const MTU: u32 = 1480;
/// An address on the underlay that no node holds: the host that is not a node.
const OUTSIDER: &str = "172.31.0.99";

/// Whether this kernel can make IPIP devices: the module loaded (as a distribution's boot
/// would load it; felix-nft itself never loads modules).
fn kernel_has_ipip() -> bool {
    let _ = Command::new("modprobe").args(["-q", "ipip"]).status();
    let have = Path::new("/sys/module/ipip").exists();
    eprintln!("this kernel has the ipip module: {have}");
    have
}

fn block(k: u8) -> String {
    format!("10.65.{k}.0/26")
}
fn tunnel_ip(k: u8) -> String {
    format!("10.65.{k}.1")
}
fn pod_ip(k: u8) -> Ipv4Addr {
    format!("10.65.{k}.2").parse().unwrap()
}

#[derive(Debug, Clone, Copy)]
struct Member {
    k: u8,
    subnet: u8,
}

impl Member {
    fn ip(&self) -> String {
        format!("172.31.{}.1{}", self.subnet, self.k)
    }
}

/// What only the node hosting a pod is sent: its policies and IP sets, the endpoint's tiers.
#[derive(Default)]
struct Local {
    msgs: Vec<Value>,
    tiers: Vec<Value>,
}

struct Node {
    member: Member,
    netns: String,
    pod: NetNs,
    daemon: NodeDaemon,
}

struct Cluster {
    nodes: Vec<Node>,
    members: Vec<Member>,
    /// The pool's `ipip_mode`: `Always` or `CrossSubnet`.
    mode: &'static str,
    bed: Underlay,
}

impl Cluster {
    fn build(mode: &'static str, subnets: &[u8], local: impl Fn(u8) -> Local) -> Cluster {
        require_root();
        let routed = if subnets.contains(&1) {
            vec!["172.31.1.0/24".parse().unwrap()]
        } else {
            Vec::new()
        };
        let bed = block_on(Underlay::build(&ClusterSpec {
            prefix: "fnt-t-clip".into(),
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
            bed,
        };
        for k in 0..subnets.len() as u8 {
            c.start(k, local(k));
        }
        c
    }

    fn member(&self, k: u8) -> Member {
        *self.members.iter().find(|m| m.k == k).expect("a member")
    }

    fn node(&self, k: u8) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.member.k == k)
            .unwrap_or_else(|| panic!("no node n{k}"))
    }

    fn ns(&self, k: u8) -> String {
        self.node(k).netns.clone()
    }

    fn host(&self, k: u8) -> Value {
        json!({"host_metadata_update": {"hostname": format!("n{k}"),
            "ipv4_addr": format!("{}/24", self.member(k).ip())}})
    }

    /// Node k's block as Felix sends it to node `own`.
    fn route(&self, own: u8, k: u8) -> Value {
        let local = k == own;
        let same_subnet = !local
            && self.mode == "CrossSubnet"
            && self.member(own).subnet == self.member(k).subnet;
        json!({"route_update": {"types": if local { "LOCAL_WORKLOAD" } else { "REMOTE_WORKLOAD" },
            "ip_pool_type": "IPIP", "dst": block(k), "same_subnet": same_subnet,
            "dst_node_name": format!("n{k}"), "dst_node_ip": self.member(k).ip()}})
    }

    fn start(&mut self, k: u8, local: Local) {
        let member = self.member(k);
        let node = block_on(self.bed.add_node(&NodeSpec {
            name: format!("n{k}"),
            ip: member.ip().parse().unwrap(),
            pods: vec![WorkloadSpec::v4(format!("p{k}"), pod_ip(k))],
        }))
        .unwrap_or_else(|e| panic!("adding n{k}: {e}"));
        let netns = node.netns_name().to_string();
        let w = &node.pods()[0];
        let (cali, pod_mac) = (w.host_ifname.clone(), w.mac_string());
        let pod = w.ns().try_clone().expect("a namespace handle");
        let addr = tunnel_ip(k);
        let daemon = NodeDaemon::start(
            &netns,
            &format!("n{k}"),
            &[
                ("FELIX_NFTABLESTABLEOWNER", "false"),
                ("FELIX_IPINIPTUNNELADDR", addr.as_str()),
                ("FELIX_ROUTEREFRESHINTERVAL", "2"),
                ("FELIX_NFTABLESREFRESHINTERVAL", "2"),
            ],
        );
        let mut msgs = vec![
            json!({"active_profile_update": {"id": {"name": "allow-all"},
                "profile": {"inbound_rules": [{"action": "allow"}],
                            "outbound_rules": [{"action": "allow"}]}}}),
            json!({"ipam_pool_update": {"id": "10.65.0.0-16", "pool": {"cidr": "10.65.0.0/16",
                "masquerade": false, "ipip_mode": self.mode}}}),
        ];
        for m in &self.members {
            msgs.push(self.route(k, m.k));
            msgs.push(self.host(m.k));
        }
        msgs.push(json!({"encapsulation": {"ipip_enabled": true}}));
        msgs.extend(local.msgs);
        msgs.push(json!({"workload_endpoint_update": {
            "id": {"orchestrator_id": "k8s", "workload_id": format!("default/p{k}"), "endpoint_id": "eth0"},
            "endpoint": {"state": "active", "name": cali, "mac": pod_mac,
                "ipv4_nets": [format!("{}/32", pod_ip(k))],
                "profile_ids": ["allow-all"], "tiers": local.tiers}}}));
        msgs.push(json!({"in_sync": {}}));
        let mut node = Node {
            member,
            netns,
            pod,
            daemon,
        };
        node.daemon.send(&msgs);
        self.nodes.push(node);
    }

    /// Node k joins the running cluster: its first sync holds the whole cluster, every other
    /// node learns its block and host.
    fn join(&mut self, k: u8, subnet: u8) {
        self.members.push(Member { k, subnet });
        self.start(k, Local::default());
        let others: Vec<u8> = self
            .members
            .iter()
            .map(|m| m.k)
            .filter(|&j| j != k)
            .collect();
        for j in others {
            let msgs = [self.route(j, k), self.host(k)];
            self.nodes
                .iter_mut()
                .find(|n| n.member.k == j)
                .expect("a running node")
                .daemon
                .send(&msgs);
        }
    }

    /// Node k leaves: every other node gets its RouteRemove and HostMetadataRemove; the node is
    /// handed back, still running.
    fn leave(&mut self, k: u8) -> Node {
        let removals = [
            json!({"route_remove": {"dst": block(k)}}),
            json!({"host_metadata_remove": {"hostname": format!("n{k}")}}),
        ];
        self.members.retain(|m| m.k != k);
        let i = self
            .nodes
            .iter()
            .position(|n| n.member.k == k)
            .expect("a running node");
        let gone = self.nodes.remove(i);
        for node in &mut self.nodes {
            node.daemon.send(&removals);
        }
        gone
    }

    fn eventually(&self, what: &str, mut check: impl FnMut() -> Result<(), String>) {
        let deadline = Instant::now() + patient(CONVERGE);
        loop {
            match check() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => {
                    let logs: String = self
                        .nodes
                        .iter()
                        .map(|n| format!("--- {}\n{}", n.netns, n.daemon.log()))
                        .collect();
                    panic!("{what}: {e}\n{logs}");
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    fn ping(&self, from: u8, to: u8) -> Verdict {
        icmp_echo(&self.node(from).pod, IpAddr::V4(pod_ip(to)), PROBE_TIMEOUT)
            .unwrap_or_else(|e| panic!("ICMP probe p{from} → p{to}: {e}"))
    }

    fn tcp(&self, from: u8, to: u8) -> Verdict {
        let dst = SocketAddr::new(IpAddr::V4(pod_ip(to)), PORT);
        tcp_connect(&self.node(from).pod, dst, PROBE_TIMEOUT)
            .unwrap_or_else(|e| panic!("TCP probe p{from} → {dst}: {e}"))
    }

    fn wait_ping(&self, from: u8, to: u8, expect: Verdict) {
        self.eventually(&format!("ping p{from} → p{to} {expect}"), || {
            let v = self.ping(from, to);
            (v == expect).then_some(()).ok_or(format!("{v}"))
        });
    }

    fn wait_tcp(&self, from: u8, to: u8, expect: Verdict) {
        self.eventually(&format!("TCP p{from} → p{to} {expect}"), || {
            let v = self.tcp(from, to);
            (v == expect).then_some(()).ok_or(format!("{v}"))
        });
    }

    fn servers(&self) -> Vec<TcpServer> {
        self.nodes
            .iter()
            .map(|n| TcpServer::start(&n.pod, PORT).unwrap())
            .collect()
    }

    fn routes(&self, k: u8) -> String {
        route_oracle::routes(&self.ns(k), &["-4"])
    }

    fn route_to(&self, k: u8, j: u8) -> Option<String> {
        let dst = format!("{} ", block(j));
        self.routes(k)
            .lines()
            .find(|l| l.starts_with(&dst))
            .map(String::from)
    }

    /// `via <j's IP> dev tunl0 proto 80 onlink mtu 1480`.
    fn tunnel_route(&self, k: u8, j: u8) -> Result<(), String> {
        let l = self.route_to(k, j);
        let via = format!(
            "{} via {} dev tunl0 proto 80 ",
            block(j),
            self.member(j).ip()
        );
        l.as_deref()
            .filter(|l| {
                l.starts_with(&via) && l.contains(" onlink") && l.contains(&format!(" mtu {MTU}"))
            })
            .map(|_| ())
            .ok_or(format!("n{k}'s route to n{j}: {l:?}"))
    }

    /// `via <j's IP> dev eth0 proto 80 onlink`, no MTU: same subnet, no tunnel.
    fn direct_route(&self, k: u8, j: u8) -> Result<(), String> {
        let l = self.route_to(k, j);
        let via = format!(
            "{} via {} dev eth0 proto 80 ",
            block(j),
            self.member(j).ip()
        );
        l.as_deref()
            .filter(|l| l.starts_with(&via) && l.contains(" onlink") && !l.contains(" mtu "))
            .map(|_| ())
            .ok_or(format!("n{k}'s route to n{j}: {l:?}"))
    }

    /// tunl0 on node k as Felix leaves it: up, MTU 1480, the tunnel address its one IPv4
    /// address.
    fn device(&self, k: u8) -> Result<(), String> {
        let ns = self.ns(k);
        let out = try_sh(&["ip", "-n", &ns, "-j", "-d", "addr", "show", "dev", "tunl0"])?;
        let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let dev = &v[0];
        let v4: Vec<String> = dev["addr_info"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|i| i["family"] == "inet")
                    .map(|i| format!("{}/{}", i["local"].as_str().unwrap_or(""), i["prefixlen"]))
                    .collect()
            })
            .unwrap_or_default();
        let up = dev["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "UP"));
        let ok = dev["linkinfo"]["info_kind"] == "ipip"
            && dev["mtu"] == MTU
            && up
            && v4 == [format!("{}/32", tunnel_ip(k))];
        ok.then_some(()).ok_or(format!("tunl0 on n{k}: {dev}"))
    }

    /// The members of node k's `all-hosts-net`.
    fn all_hosts(&self, k: u8) -> Result<Vec<Value>, String> {
        let ns = self.ns(k);
        let out = try_sh(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "nft",
            "-j",
            "list",
            "set",
            "ip",
            "calico",
            "cali40all-hosts-net",
        ])?;
        let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        Ok(v["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o.get("set"))
            .flat_map(|s| s["elem"].as_array().cloned().unwrap_or_default())
            .collect())
    }

    /// Node k holds, for every other member, a route through tunl0 and an `all-hosts-net`
    /// member, and nothing of the nodes in `gone`.
    fn ipip_state(&self, k: u8, gone: &[Member]) -> Result<(), String> {
        self.device(k)?;
        let hosts = self.all_hosts(k)?;
        let has = |ip: &str| hosts.iter().any(|e| e.to_string().contains(ip));
        let r = self.routes(k);
        for m in self.members.iter().filter(|m| m.k != k) {
            self.tunnel_route(k, m.k)?;
            if !has(&m.ip()) {
                return Err(format!("n{} not in n{k}'s all-hosts-net: {hosts:?}", m.k));
            }
        }
        for m in gone {
            if r.contains(&format!("10.65.{}.", m.k)) || has(&m.ip()) {
                return Err(format!("n{} still on n{k}: {r}\n{hosts:?}", m.k));
            }
        }
        Ok(())
    }

    /// Counters of IPIP packets, and of packets with a pod address in the outer header,
    /// entering the underlay bridges (a table of the test's in the underlay namespace).
    fn count_on_the_wire(&self) {
        let l = self.bed.lan_netns_name();
        nft(l, &["add", "table", "bridge", "wire"]);
        for c in ["ipip", "plain"] {
            nft(l, &["add", "counter", "bridge", "wire", c]);
        }
        let chain = "{ type filter hook prerouting priority 0 ; }";
        nft(l, &["add", "chain", "bridge", "wire", "frames", chain]);
        nft(
            l,
            &[
                "add", "rule", "bridge", "wire", "frames", "ip", "protocol", "4", "counter",
                "name", "ipip",
            ],
        );
        nft(
            l,
            &[
                "add",
                "rule",
                "bridge",
                "wire",
                "frames",
                "ip",
                "saddr",
                "10.65.0.0/16",
                "counter",
                "name",
                "plain",
            ],
        );
    }

    fn on_the_wire(&self, counter: &str) -> u64 {
        let out = nft(
            self.bed.lan_netns_name(),
            &["-j", "list", "counter", "bridge", "wire", counter],
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        v["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|o| o["counter"]["packets"].as_u64())
            .unwrap_or_else(|| panic!("no counter in {out}"))
    }

    fn daemons_alive(&mut self) {
        for node in self.nodes.iter_mut() {
            let status = node.daemon.child.try_wait().unwrap();
            assert!(
                status.is_none(),
                "{} exited: {}",
                node.netns,
                node.daemon.log()
            );
        }
    }
}

fn pairs(n: u8) -> Vec<(u8, u8)> {
    (0..n)
        .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect()
}

/// The message a kernel without the module makes the agent log.
const NO_MODULE: &str = "this kernel has no ipip module";

#[test]
fn pods_on_three_nodes_talk_over_ipip_and_outsiders_do_not() {
    if !kernel_has_ipip() {
        return without_the_module();
    }
    // p1 denies p0 by policy (an IP set holding p0's address); the rest is allowed.
    let deny = "default.ingress-deny-n0";
    let mut c = Cluster::build("Always", &[0, 0, 0], |k| match k {
        1 => Local {
            msgs: vec![
                json!({"ipset_update": {"id": "s:pods-n0", "type": "IP", "members": [pod_ip(0)]}}),
                json!({"active_policy_update": {"id": {"name": deny, "kind": "GlobalNetworkPolicy"},
                    "policy": {"tier": "default", "inbound_rules": [
                        {"action": "deny", "src_ip_set_ids": ["s:pods-n0"]}, {"action": "allow"}],
                        "outbound_rules": []}}}),
            ],
            tiers: vec![json!({"name": "default", "default_action": "Deny",
                "ingress_policies": [{"name": deny, "kind": "GlobalNetworkPolicy"}],
                "egress_policies": []})],
        },
        _ => Local::default(),
    });
    c.count_on_the_wire();
    for k in 0..3 {
        c.eventually(&format!("n{k}'s IPIP state"), || c.ipip_state(k, &[]));
    }
    let r = c.routes(0);
    assert!(r.contains("blackhole 10.65.0.0/26 proto 80"), "{r}");

    // Pod ↔ pod across nodes, every ordered pair but the denied one: IPIP on the wire, never
    // a pod address in an outer header.
    let _servers = c.servers();
    for (a, b) in pairs(3).into_iter().filter(|&p| p != (0, 1)) {
        c.wait_ping(a, b, Verdict::Pass);
        assert_eq!(c.tcp(a, b), Verdict::Pass, "TCP p{a} → p{b}");
    }
    assert!(c.on_the_wire("ipip") > 0, "no IPIP packet on the wire");
    assert_eq!(c.on_the_wire("plain"), 0, "pod addresses on the wire");
    // The deny holds across nodes, and only for p0.
    assert_eq!(
        c.ping(0, 1),
        Verdict::Drop,
        "ping p0 → p1, denied by n1's policy"
    );
    assert_eq!(
        c.tcp(0, 1),
        Verdict::Drop,
        "TCP p0 → p1, denied by n1's policy"
    );
    c.wait_tcp(2, 1, Verdict::Pass);

    // A host that is not a node sends IPIP to n0: dropped, as Felix drops IPIP from outside
    // all-hosts-net. With n0's daemon paused and the host's address put into n0's set by hand,
    // the same packets reach p0: the drop was that rule's. Resumed, the daemon takes it out
    // again at its next table refresh.
    let l = c.bed.lan_netns_name().to_string();
    ip(
        &l,
        &["addr", "add", &format!("{OUTSIDER}/24"), "dev", "br0"],
    );
    ip(
        &l,
        &[
            "link",
            "add",
            "evil",
            "type",
            "ipip",
            "local",
            OUTSIDER,
            "remote",
            &c.member(0).ip(),
        ],
    );
    ip(&l, &["link", "set", "evil", "up"]);
    ip(
        &l,
        &[
            "route",
            "add",
            &format!("{}/32", pod_ip(0)),
            "dev",
            "evil",
            "src",
            OUTSIDER,
        ],
    );
    sh(&[
        "ip",
        "netns",
        "exec",
        &l,
        "sysctl",
        "-qw",
        "net.ipv4.ping_group_range=0 2147483647",
    ]);
    let outsider_ping = || icmp_echo(c.bed.lan(), IpAddr::V4(pod_ip(0)), PROBE_TIMEOUT).unwrap();
    assert_eq!(
        outsider_ping(),
        Verdict::Drop,
        "IPIP from a host that is not a node"
    );
    let daemon = c.node(0).daemon.child.id() as libc::pid_t;
    let n0 = c.ns(0);
    // SAFETY: signals a child this test spawned and still owns.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGSTOP) }, 0);
    nft(
        &n0,
        &[
            "add",
            "element",
            "ip",
            "calico",
            "cali40all-hosts-net",
            &format!("{{ {OUTSIDER} }}"),
        ],
    );
    let admitted = outsider_ping();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGCONT) }, 0);
    assert_eq!(admitted, Verdict::Pass, "IPIP from a host in all-hosts-net");
    c.eventually("the outsider out of n0's all-hosts-net", || {
        let hosts = c.all_hosts(0)?;
        (!hosts.iter().any(|e| e.to_string().contains(OUTSIDER)))
            .then_some(())
            .ok_or(format!("{hosts:?}"))
    });
    assert_eq!(outsider_ping(), Verdict::Drop, "IPIP from outside again");

    // Drift: a route through tunl0 deleted by hand returns; so do tunl0's address, MTU and
    // up state, with the routes the kernel drops when the device goes down.
    ip(&n0, &["route", "del", &block(2)]);
    c.eventually("n0's route to n2 repaired", || c.tunnel_route(0, 2));
    ip(&n0, &["addr", "flush", "dev", "tunl0"]);
    ip(&n0, &["link", "set", "tunl0", "mtu", "1400", "down"]);
    c.eventually("n0's tunl0 and routes repaired", || c.ipip_state(0, &[]));
    c.wait_ping(0, 2, Verdict::Pass);

    c.daemons_alive();
}

#[test]
fn an_ipip_node_joins_later_and_leaves_without_a_trace() {
    if !kernel_has_ipip() {
        return without_the_module();
    }
    let mut c = Cluster::build("Always", &[0, 0], |_| Local::default());
    for k in 0..2 {
        c.eventually(&format!("n{k}'s IPIP state"), || c.ipip_state(k, &[]));
    }
    c.join(2, 0);
    for k in 0..3 {
        c.eventually(&format!("n{k}'s IPIP state after n2 joined"), || {
            c.ipip_state(k, &[])
        });
    }
    for (a, b) in [(0, 2), (2, 0), (1, 2), (2, 1)] {
        c.wait_ping(a, b, Verdict::Pass);
    }
    let gone = c.member(2);
    let n2 = c.leave(2);
    for k in 0..2 {
        c.eventually(&format!("n2 gone from n{k}"), || c.ipip_state(k, &[gone]));
        assert_ne!(c.ping(k, 2), Verdict::Pass, "ping p{k} → p2 after n2 left");
    }
    drop(n2);
    assert!(c.bed.remove_node("n2"), "n2 was on the underlay");
    c.wait_ping(0, 1, Verdict::Pass);
    c.daemons_alive();
}

#[test]
fn ipip_cross_subnet_goes_direct_on_the_subnet_and_through_tunl0_across_the_router() {
    let have = kernel_has_ipip();
    // n0 and n1 on 172.31.0.0/24, n2 on 172.31.1.0/24 behind the router.
    let mut c = Cluster::build("CrossSubnet", &[0, 0, 1], |_| Local::default());
    c.count_on_the_wire();
    for (k, j) in [(0, 1), (1, 0)] {
        c.eventually(&format!("n{k} → n{j} direct"), || c.direct_route(k, j));
    }
    c.wait_ping(0, 1, Verdict::Pass);
    c.wait_ping(1, 0, Verdict::Pass);
    assert_eq!(c.on_the_wire("ipip"), 0, "IPIP within one subnet");
    if !have {
        // Without the module, the tunnel's routes cannot exist; the direct ones work, and the
        // agent said why the others are missing, once.
        c.eventually("the agent's word on the missing module", || {
            let log = c.node(0).daemon.log();
            (log.matches(NO_MODULE).count() == 1)
                .then_some(())
                .ok_or(log)
        });
        assert!(c.route_to(0, 2).is_none(), "{}", c.routes(0));
        c.daemons_alive();
        return;
    }
    for (k, j) in [(0, 2), (2, 0), (1, 2), (2, 1)] {
        c.eventually(&format!("n{k} → n{j} through tunl0"), || {
            c.tunnel_route(k, j)
        });
    }
    c.wait_ping(0, 2, Verdict::Pass);
    c.wait_ping(2, 1, Verdict::Pass);
    assert!(c.on_the_wire("ipip") > 0, "IPIP across the router");
    c.daemons_alive();
}

/// On a kernel without the ipip module: the agent says so once, keeps running, and the rest
/// of the node is programmed (the firewall with its IPIP rules, the blackhole of its block).
fn without_the_module() {
    let mut c = Cluster::build("Always", &[0, 0], |_| Local::default());
    c.eventually("the agent's word on the missing module", || {
        let log = c.node(0).daemon.log();
        (log.matches(NO_MODULE).count() == 1)
            .then_some(())
            .ok_or(log)
    });
    let n0 = c.ns(0);
    c.eventually("n0's firewall and blackhole", || {
        let rules = try_sh(&[
            "ip", "netns", "exec", &n0, "nft", "list", "table", "ip", "calico",
        ])?;
        let r = c.routes(0);
        (rules.contains("Drop IPIP packets from non-Calico hosts")
            && r.contains("blackhole 10.65.0.0/26 proto 80"))
        .then_some(())
        .ok_or(format!("{r}\n{rules}"))
    });
    // Repeated applies do not repeat the warning.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(c.node(0).daemon.log().matches(NO_MODULE).count(), 1);
    c.daemons_alive();
}
