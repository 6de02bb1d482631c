//! Privileged, end to end: WireGuard clusters of nodes in network namespaces, built by the
//! test bed's cluster builder, each node running its own `felix-nft run --source stdin` with
//! `WireguardEnabled`, and told what Felix's calculation graph would tell it: every node's
//! block of a pool without encapsulation (its own as local, the others' as remote; Felix
//! programs the cluster routes), each node's WireGuard tunnel address (the block's first
//! address) as a tunnel route, the host metadata, its pod.
//!
//! The test then plays calico-node and the calculation graph: it reads each agent's
//! `WireguardStatusUpdate` from its standard output and sends every node every node's key and
//! interface address (`WireguardEndpointUpdate`), itself included.
//!
//! What is proved depends on the kernel, which the test probes first (`modprobe wireguard`,
//! then `/sys/module/wireguard`):
//! - with the module: each device as Felix makes it (kind wireguard, MTU 1440, its tunnel
//!   address alone, port 51820, fwmark 0x200000, the reported key), its peers, table 1 and the
//!   rule at priority 99; pod ↔ pod on the wire only as WireGuard's UDP; a deny across nodes;
//!   a key withdrawn, claimed twice, changed; a node without WireGuard reached unencrypted;
//!   drift repaired (rule, peer, port and fwmark, table flushed, a foreign route, the device
//!   deleted: a new key, reported); a restart keeps the key; disabled, everything removed and
//!   an empty key reported;
//! - without it (our build machines): the agent says once that the kernel has no wireguard
//!   module, reports an empty key, and the rest of the node is programmed; pods still talk,
//!   unencrypted.
//!
//! `ip`, `wg` and `nft` are oracles and set-up tools only.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;

use crate::testbed_common;

use felix_nft_lab::testbed::cluster::{Cluster as Underlay, ClusterSpec, NodeSpec};
use felix_nft_lab::testbed::probe::{icmp_echo, tcp_connect, TcpServer, Verdict};
use felix_nft_lab::testbed::topology::WorkloadSpec;
use rtnl::netns::NetNs;
use serde_json::{json, Value};
use testbed_common::{
    block_on, ip_n as ip, nft_n as nft, patient, require_root, try_sh, NodeDaemon,
};

const CONVERGE: Duration = Duration::from_secs(30);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const PORT: u16 = 8080;
const DEV: &str = "wireguard.cali";
/// The parent's 1500 less WireGuard's 60.
const MTU: u64 = 1440;
/// The sixth bit of the default mark mask.
const MARK: &str = "0x200000";

/// Whether this kernel has WireGuard: the module loaded (as a distribution's boot would load
/// it; felix-nft itself never loads modules).
fn kernel_has_wireguard() -> bool {
    let _ = Command::new("modprobe").args(["-q", "wireguard"]).status();
    let have = Path::new("/sys/module/wireguard").exists();
    eprintln!("this kernel has the wireguard module: {have}");
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
fn host_ip(k: u8) -> String {
    format!("172.31.0.1{k}")
}

struct Node {
    netns: String,
    /// The pod's host-side interface and MAC, for a restarted agent's first sync.
    cali: String,
    mac: String,
    pod: NetNs,
    daemon: NodeDaemon,
}

struct Cluster {
    nodes: Vec<Node>,
    bed: Underlay,
}

/// What only the node hosting a pod is sent: its policies and IP sets, the endpoint's tiers.
#[derive(Default)]
struct Local {
    msgs: Vec<Value>,
    tiers: Vec<Value>,
}

impl Cluster {
    fn build(
        n: u8,
        env: impl Fn(u8) -> Vec<(&'static str, String)>,
        local: impl Fn(u8) -> Local,
    ) -> Cluster {
        require_root();
        let bed = block_on(Underlay::build(&ClusterSpec {
            prefix: "fnt-t-clwg".into(),
            ..ClusterSpec::default()
        }))
        .unwrap_or_else(|e| panic!("building the underlay ({e}); this privileged test needs root"));
        let mut c = Cluster {
            nodes: Vec::new(),
            bed,
        };
        for k in 0..n {
            let node = block_on(c.bed.add_node(&NodeSpec {
                name: format!("n{k}"),
                ip: host_ip(k).parse().unwrap(),
                pods: vec![WorkloadSpec::v4(format!("p{k}"), pod_ip(k))],
            }))
            .unwrap_or_else(|e| panic!("adding n{k}: {e}"));
            let netns = node.netns_name().to_string();
            let w = &node.pods()[0];
            let (cali, mac) = (w.host_ifname.clone(), w.mac_string());
            let pod = w.ns().try_clone().expect("a namespace handle");
            let daemon = start_daemon(&netns, k, &env(k));
            let mut node = Node {
                netns,
                cali,
                mac,
                pod,
                daemon,
            };
            node.daemon
                .send(&sync(k, n, &node.cali, &node.mac, local(k)));
            c.nodes.push(node);
        }
        c
    }

    fn node(&self, k: u8) -> &Node {
        &self.nodes[usize::from(k)]
    }

    fn node_mut(&mut self, k: u8) -> &mut Node {
        &mut self.nodes[usize::from(k)]
    }

    fn ns(&self, k: u8) -> String {
        self.node(k).netns.clone()
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

    /// The last key node k reported for IPv4 (`""`: none), once it reported one.
    fn reported_key(&self, k: u8) -> Option<String> {
        reported(&self.node(k).daemon, "IPV4").last().cloned()
    }

    /// Waits for node k's first non-empty key of `version` (`IPV4`, `IPV6`).
    fn key(&self, k: u8, version: &str) -> String {
        let mut key = String::new();
        self.eventually(&format!("n{k}'s {version} key"), || {
            key = reported(&self.node(k).daemon, version)
                .last()
                .filter(|k| !k.is_empty())
                .cloned()
                .ok_or("none yet")?;
            Ok(())
        });
        key
    }

    /// Waits for every node's first non-empty IPv4 key.
    fn keys(&self) -> Vec<String> {
        (0..self.nodes.len() as u8)
            .map(|k| self.key(k, "IPV4"))
            .collect()
    }

    /// Tells node `to` node k's key and interface address, as the calculation graph would.
    fn tell(&mut self, to: u8, k: u8, key: &str) {
        let m = json!({"wireguard_endpoint_update": {"hostname": format!("n{k}"),
            "public_key": key, "interface_ipv4_addr": tunnel_ip(k)}});
        self.node_mut(to).daemon.send(&[m]);
    }

    fn withdraw(&mut self, to: u8, k: u8) {
        let m = json!({"wireguard_endpoint_remove": {"hostname": format!("n{k}")}});
        self.node_mut(to).daemon.send(&[m]);
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

    /// `wg show <dev> dump` on node k: the device line and one line per peer.
    fn wg(&self, k: u8) -> Result<(Vec<String>, Vec<Vec<String>>), String> {
        let out = try_sh(&[
            "ip",
            "netns",
            "exec",
            &self.ns(k),
            "wg",
            "show",
            DEV,
            "dump",
        ])?;
        let mut lines = out
            .lines()
            .map(|l| l.split('\t').map(String::from).collect::<Vec<_>>());
        let dev = lines.next().ok_or("no device line")?;
        Ok((dev, lines.collect()))
    }

    /// The device of node k as Felix leaves it: kind wireguard, up, MTU 1440, its tunnel
    /// address alone; port 51820, fwmark 0x200000, the key it reported.
    fn device(&self, k: u8) -> Result<(), String> {
        let out = try_sh(&[
            "ip",
            "-n",
            &self.ns(k),
            "-j",
            "-d",
            "addr",
            "show",
            "dev",
            DEV,
        ])?;
        let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let d = &v[0];
        let v4: Vec<String> = d["addr_info"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["family"] == "inet")
            .map(|i| format!("{}/{}", i["local"].as_str().unwrap_or(""), i["prefixlen"]))
            .collect();
        let up = d["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "UP"));
        if d["linkinfo"]["info_kind"] != "wireguard"
            || d["mtu"] != MTU
            || !up
            || v4 != [format!("{}/32", tunnel_ip(k))]
        {
            return Err(format!("{DEV} on n{k}: {d}"));
        }
        let (dev, _) = self.wg(k)?;
        // private key, public key, listen port, fwmark
        let want = self.reported_key(k).unwrap_or_default();
        if dev.get(1) != Some(&want)
            || dev.get(2).map(String::as_str) != Some("51820")
            || dev.get(3).map(String::as_str) != Some(MARK)
        {
            return Err(format!("wg show on n{k}: {dev:?}, reported {want}"));
        }
        Ok(())
    }

    /// Node k's peers: for each of `peers` (node, key), the endpoint and allowed IPs Felix
    /// gives it, and no other peer.
    fn peers(&self, k: u8, peers: &[(u8, &str)]) -> Result<(), String> {
        let (_, have) = self.wg(k)?;
        let mut got: Vec<(String, String, String)> = have
            .iter()
            .map(|p| {
                let ips: Vec<&str> = p.get(3).map_or(Vec::new(), |s| s.split(',').collect());
                let mut ips: Vec<String> = ips.into_iter().map(String::from).collect();
                ips.sort();
                (
                    p[0].clone(),
                    p.get(2).cloned().unwrap_or_default(),
                    ips.join(","),
                )
            })
            .collect();
        got.sort();
        let mut want: Vec<(String, String, String)> = peers
            .iter()
            .map(|(j, key)| {
                (
                    key.to_string(),
                    format!("{}:51820", host_ip(*j)),
                    format!("{},{}/32", block(*j), tunnel_ip(*j)),
                )
            })
            .collect();
        want.sort();
        (got == want)
            .then_some(())
            .ok_or(format!("n{k}'s peers: {got:?}, want {want:?}"))
    }

    /// Node k's table 1: a device route for each of `peers`' block and tunnel address, a throw
    /// for its own block and for each of `thrown`'s, nothing else.
    fn table(&self, k: u8, peers: &[u8], thrown: &[u8]) -> Result<(), String> {
        let out = try_sh(&["ip", "-n", &self.ns(k), "-4", "route", "show", "table", "1"])?;
        let mut got: Vec<String> = out.lines().map(|l| l.trim().to_string()).collect();
        got.sort();
        let mut want = vec![format!("throw {}", block(k))];
        for &j in peers {
            want.push(format!("{} dev {DEV} scope link", block(j)));
            want.push(format!("{} dev {DEV} scope link", tunnel_ip(j)));
        }
        for &j in thrown {
            want.push(format!("throw {}", block(j)));
            want.push(format!("throw {}", tunnel_ip(j)));
        }
        want.sort();
        (got == want)
            .then_some(())
            .ok_or(format!("n{k}'s table 1: {got:?}, want {want:?}"))
    }

    fn rule(&self, k: u8) -> Result<(), String> {
        let out = try_sh(&["ip", "-n", &self.ns(k), "-4", "rule", "show", "pref", "99"])?;
        // Felix's rule carries protocol boot, which iproute2 prints.
        let want = format!("99:\tnot from all fwmark {MARK}/{MARK} lookup 1 proto boot");
        (out.trim() == want)
            .then_some(())
            .ok_or(format!("n{k}'s rule: {out:?}"))
    }

    /// Node k with every other node of `all` as a peer, whose keys are `keys`.
    fn encrypted(&self, k: u8, all: &[u8], keys: &[String]) -> Result<(), String> {
        self.device(k)?;
        let others: Vec<u8> = all.iter().copied().filter(|&j| j != k).collect();
        let peers: Vec<(u8, &str)> = others
            .iter()
            .map(|&j| (j, keys[usize::from(j)].as_str()))
            .collect();
        self.peers(k, &peers)?;
        self.table(k, &others, &[])?;
        self.rule(k)
    }

    /// Counters on the underlay's bridge: WireGuard's UDP, and packets with a pod address in
    /// the outer header.
    fn count_on_the_wire(&self) {
        let l = self.bed.lan_netns_name();
        nft(l, &["add", "table", "bridge", "wire"]);
        for c in ["wg", "plain"] {
            nft(l, &["add", "counter", "bridge", "wire", c]);
        }
        let chain = "{ type filter hook prerouting priority 0 ; }";
        nft(l, &["add", "chain", "bridge", "wire", "frames", chain]);
        let rule = |m: &[&str], c: &str| {
            let mut a = vec!["add", "rule", "bridge", "wire", "frames"];
            a.extend_from_slice(m);
            a.extend(["counter", "name", c]);
            nft(l, &a);
        };
        rule(&["udp", "dport", "51820"], "wg");
        rule(&["ip", "saddr", "10.65.0.0/16"], "plain");
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

fn start_daemon(netns: &str, k: u8, extra: &[(&'static str, String)]) -> NodeDaemon {
    let mut env: Vec<(&str, &str)> = vec![
        ("FELIX_NFTABLESTABLEOWNER", "false"),
        ("FELIX_ROUTEREFRESHINTERVAL", "2"),
        ("FELIX_NFTABLESREFRESHINTERVAL", "2"),
        ("FELIX_PROGRAMCLUSTERROUTES", "Enabled"),
        ("FELIX_IPV6SUPPORT", "false"),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
    NodeDaemon::start(netns, &format!("n{k}"), &env)
}

/// Node k's first sync in a cluster of n: the pool, every node's block, tunnel address and
/// host, its pod, InSync.
fn sync(k: u8, n: u8, cali: &str, mac: &str, local: Local) -> Vec<Value> {
    let mut msgs = vec![
        json!({"active_profile_update": {"id": {"name": "allow-all"},
            "profile": {"inbound_rules": [{"action": "allow"}],
                        "outbound_rules": [{"action": "allow"}]}}}),
        json!({"ipam_pool_update": {"id": "10.65.0.0-16", "pool": {"cidr": "10.65.0.0/16",
            "masquerade": false}}}),
    ];
    for j in 0..n {
        let me = j == k;
        msgs.push(json!({"route_update": {
            "types": if me { "LOCAL_WORKLOAD" } else { "REMOTE_WORKLOAD" },
            "ip_pool_type": "NO_ENCAP", "dst": block(j), "same_subnet": true,
            "dst_node_name": format!("n{j}"), "dst_node_ip": host_ip(j)}}));
        msgs.push(json!({"route_update": {
            "types": if me { "LOCAL_TUNNEL" } else { "REMOTE_TUNNEL" },
            "ip_pool_type": "NO_ENCAP", "dst": format!("{}/32", tunnel_ip(j)),
            "tunnel_type": {"wireguard": true},
            "dst_node_name": format!("n{j}"), "dst_node_ip": host_ip(j)}}));
        msgs.push(json!({"host_metadata_update": {"hostname": format!("n{j}"),
            "ipv4_addr": format!("{}/24", host_ip(j))}}));
    }
    msgs.extend(local.msgs);
    msgs.push(json!({"workload_endpoint_update": {
        "id": {"orchestrator_id": "k8s", "workload_id": format!("default/p{k}"), "endpoint_id": "eth0"},
        "endpoint": {"state": "active", "name": cali, "mac": mac,
            "ipv4_nets": [format!("{}/32", pod_ip(k))],
            "profile_ids": ["allow-all"], "tiers": local.tiers}}}));
    msgs.push(json!({"in_sync": {}}));
    msgs
}

/// Every `WireguardStatusUpdate` key a daemon reported for `version`, in order.
fn reported(d: &NodeDaemon, version: &str) -> Vec<String> {
    d.replies()
        .iter()
        .filter_map(|r| r.get("wireguard_status_update"))
        .filter(|u| u["ip_version"] == version)
        .map(|u| u["public_key"].as_str().unwrap_or("").to_string())
        .collect()
}

fn wg_on() -> Vec<(&'static str, String)> {
    vec![("FELIX_WIREGUARDENABLED", "true".into())]
}

const NO_MODULE: &str = "this kernel has no wireguard module";

#[test]
fn pods_on_three_nodes_talk_only_through_wireguard() {
    if !kernel_has_wireguard() {
        return without_the_module();
    }
    // p1 denies p0 by policy; the rest is allowed.
    let deny = "default.ingress-deny-n0";
    let mut c = Cluster::build(
        3,
        |_| wg_on(),
        |k| match k {
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
        },
    );
    c.count_on_the_wire();
    let keys = c.keys();
    for to in 0..3 {
        for k in 0..3 {
            c.tell(to, k, &keys[usize::from(k)]);
        }
    }
    let all = [0, 1, 2];
    for k in 0..3 {
        c.eventually(&format!("n{k} encrypted to the others"), || {
            c.encrypted(k, &all, &keys)
        });
    }

    // Pod ↔ pod: only WireGuard's UDP on the wire, never a pod address.
    let _servers: Vec<TcpServer> = c
        .nodes
        .iter()
        .map(|n| TcpServer::start(&n.pod, PORT).unwrap())
        .collect();
    for (a, b) in [(0, 2), (2, 0), (1, 0), (1, 2), (2, 1)] {
        c.wait_ping(a, b, Verdict::Pass);
        assert_eq!(c.tcp(a, b), Verdict::Pass, "TCP p{a} → p{b}");
    }
    assert!(
        c.on_the_wire("wg") >= 10,
        "WireGuard packets on the wire: {}",
        c.on_the_wire("wg")
    );
    assert_eq!(c.on_the_wire("plain"), 0, "pod addresses on the wire");
    // A deny holds across nodes.
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

    // Felix echoes another key for n0 (someone overwrote the node's status): n0 reports its
    // own again, unchanged.
    let before = reported(&c.node(0).daemon, "IPV4").len();
    let stale = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    c.tell(0, 0, &stale);
    c.eventually("n0 re-reports its key", || {
        let r = reported(&c.node(0).daemon, "IPV4");
        (r.len() > before && r.last() == Some(&keys[0]))
            .then_some(())
            .ok_or(format!("{r:?}"))
    });
    c.tell(0, 0, &keys[0]);

    // n2's key withdrawn on n0: n2 is no peer of n0, its CIDRs are thrown to the main table.
    c.withdraw(0, 2);
    c.eventually("n2 thrown on n0", || {
        c.peers(0, &[(1, &keys[1])])?;
        c.table(0, &[1], &[2])
    });
    // n1 and n2 claim one key on n0: neither is a peer.
    c.tell(0, 2, &keys[1]);
    c.eventually("n1 and n2 in conflict on n0", || {
        c.peers(0, &[])?;
        c.table(0, &[], &[1, 2])
    });
    c.eventually("the conflict in n0's log", || {
        let log = c.node(0).daemon.log();
        log.contains("nodes claim the same public key")
            .then_some(())
            .ok_or(log)
    });
    c.tell(0, 2, &keys[2]);
    c.eventually("n0 encrypted again", || c.encrypted(0, &all, &keys));
    c.wait_ping(0, 2, Verdict::Pass);

    // Drift, repaired within the refresh (2 s): the rule, a peer, port and fwmark, the
    // table, a foreign route in it.
    let n0 = c.ns(0);
    ip(&n0, &["rule", "del", "pref", "99"]);
    let wg = |args: &[&str]| {
        let mut a = vec!["ip", "netns", "exec", n0.as_str(), "wg", "set", DEV];
        a.extend_from_slice(args);
        testbed_common::sh(&a);
    };
    wg(&["peer", &keys[1], "remove"]);
    wg(&["listen-port", "1", "fwmark", "0"]);
    ip(&n0, &["route", "flush", "table", "1"]);
    c.eventually("n0 repaired", || c.encrypted(0, &all, &keys));
    ip(&n0, &["route", "add", "throw", "1.2.3.4", "table", "1"]);
    c.eventually("the foreign route gone from table 1", || {
        c.table(0, &[1, 2], &[])
    });
    c.wait_ping(0, 2, Verdict::Pass);

    // The device deleted: made again with a new key, which is reported.
    ip(&n0, &["link", "del", DEV]);
    let mut new_key = String::new();
    c.eventually("n0's new key reported", || {
        new_key = c
            .reported_key(0)
            .filter(|k| !k.is_empty() && k != &keys[0])
            .ok_or("not yet")?;
        Ok(())
    });
    for to in 0..3 {
        c.tell(to, 0, &new_key);
    }
    let mut keys = keys;
    keys[0] = new_key;
    for k in 0..3 {
        c.eventually(&format!("n{k} with n0's new key"), || {
            c.encrypted(k, &all, &keys)
        });
    }
    c.wait_ping(0, 2, Verdict::Pass);
    c.wait_ping(2, 0, Verdict::Pass);
    assert_eq!(c.on_the_wire("plain"), 0, "pod addresses on the wire");

    // A restart keeps the key; a restart with WireGuard off removes device, rule and table
    // routes, and reports an empty key.
    let netns = c.ns(2);
    let restart = |c: &mut Cluster, env: Vec<(&'static str, String)>| {
        let node = c.node_mut(2);
        let _ = node.daemon.child.kill();
        let _ = node.daemon.child.wait();
        node.daemon = start_daemon(&netns, 2, &env);
        let first = sync(2, 3, &node.cali, &node.mac, Local::default());
        node.daemon.send(&first);
    };
    restart(&mut c, wg_on());
    c.eventually("n2's key after a restart", || {
        (c.reported_key(2).as_ref() == Some(&keys[2]))
            .then_some(())
            .ok_or(format!("{:?}", c.reported_key(2)))
    });
    restart(&mut c, Vec::new());
    c.eventually("n2 without WireGuard", || {
        if c.reported_key(2).as_deref() != Some("") {
            return Err(format!("reported {:?}", c.reported_key(2)));
        }
        let links = try_sh(&["ip", "-n", &netns, "link", "show"])?;
        let rules = try_sh(&["ip", "-n", &netns, "rule", "show", "pref", "99"])?;
        let table = try_sh(&["ip", "-n", &netns, "route", "show", "table", "1"])?;
        (!links.contains(DEV) && rules.trim().is_empty() && table.trim().is_empty())
            .then_some(())
            .ok_or(format!("{links}\n{rules}\n{table}"))
    });
    c.daemons_alive();
}

#[test]
fn a_node_without_wireguard_is_reached_unencrypted() {
    if !kernel_has_wireguard() {
        return without_the_module();
    }
    // n2 runs without WireGuard: it reports no key, so n0 and n1 throw its CIDRs to the main
    // table, and reach it directly.
    let mut c = Cluster::build(
        3,
        |k| if k == 2 { Vec::new() } else { wg_on() },
        |_| Local::default(),
    );
    c.count_on_the_wire();
    let keys: Vec<String> = [0, 1].iter().map(|&k| c.key(k, "IPV4")).collect();
    c.eventually("n2 reports no key", || {
        (c.reported_key(2).as_deref() == Some(""))
            .then_some(())
            .ok_or(format!("{:?}", c.reported_key(2)))
    });
    for to in 0..3 {
        for k in 0..2 {
            c.tell(to, k, &keys[usize::from(k)]);
        }
    }
    for k in 0..2u8 {
        let j = 1 - k;
        c.eventually(&format!("n{k}: n{j} a peer, n2 thrown"), || {
            c.device(k)?;
            c.peers(k, &[(j, &keys[usize::from(j)])])?;
            c.table(k, &[j], &[2])?;
            c.rule(k)
        });
    }
    c.wait_ping(0, 1, Verdict::Pass);
    assert_eq!(c.on_the_wire("plain"), 0, "p0 ↔ p1 is encrypted");
    c.wait_ping(0, 2, Verdict::Pass);
    c.wait_ping(2, 1, Verdict::Pass);
    assert!(c.on_the_wire("plain") > 0, "p0 ↔ p2 goes unencrypted");
    c.daemons_alive();

    // `felix-nft cleanup` on a stopped node removes WireGuard's device, rule and table routes.
    let n0 = c.ns(0);
    let d = &mut c.node_mut(0).daemon;
    let _ = d.child.kill();
    let _ = d.child.wait();
    let out = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
        .args(["cleanup", "--netns", &n0])
        .env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
        .output()
        .expect("running felix-nft cleanup");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("link delete {DEV}")), "{text}");
    let links = ip(&n0, &["link", "show"]);
    let rules = ip(&n0, &["rule", "show", "pref", "99"]);
    let table = ip(&n0, &["route", "show", "table", "1"]);
    assert!(
        !links.contains(DEV) && rules.trim().is_empty() && table.trim().is_empty(),
        "{links}\n{rules}\n{table}"
    );
}

fn host_ip6(k: u8) -> String {
    format!("fd00:31::1{k}")
}

/// Node k's IPv6 block, as `ip` prints it.
fn block6(k: u8) -> String {
    let net: ipnet::Ipv6Net = format!("fd00:65:{k}::/122").parse().unwrap();
    net.to_string()
}

#[test]
fn host_encryption_and_ipv6_as_felix_does_them() {
    if !kernel_has_wireguard() {
        return without_the_module();
    }
    // Two nodes with WireGuard of both families and host encryption. Felix allocates no
    // WireGuard address in host-encryption mode: the devices carry the host's own address.
    // The underlay gets IPv6 addresses by hand; the IPv6 blocks hold no pods (their routes and
    // peers are what is checked), the hosts talk over both families.
    let env = |_| {
        vec![
            ("FELIX_WIREGUARDENABLED", "true".to_string()),
            ("FELIX_WIREGUARDENABLEDV6", "true".to_string()),
            ("FELIX_WIREGUARDHOSTENCRYPTIONENABLED", "true".to_string()),
            ("FELIX_IPV6SUPPORT", "true".to_string()),
        ]
    };
    let mut c = Cluster::build(2, env, |k| Local {
        msgs: (0..2u8)
            .flat_map(|j| {
                let me = j == k;
                [
                    json!({"route_update": {"types": if me { "LOCAL_HOST" } else { "REMOTE_HOST" },
                        "dst": format!("{}/32", host_ip(j)), "dst_node_name": format!("n{j}")}}),
                    json!({"route_update": {"types": if me { "LOCAL_HOST" } else { "REMOTE_HOST" },
                        "dst": format!("{}/128", host_ip6(j)), "dst_node_name": format!("n{j}")}}),
                    json!({"route_update": {
                        "types": if me { "LOCAL_WORKLOAD" } else { "REMOTE_WORKLOAD" },
                        "ip_pool_type": "NO_ENCAP", "dst": block6(j),
                        "dst_node_name": format!("n{j}")}}),
                    json!({"host_metadata_v4v6_update": {"hostname": format!("n{j}"),
                        "ipv4_addr": format!("{}/24", host_ip(j)),
                        "ipv6_addr": format!("{}/64", host_ip6(j))}}),
                ]
            })
            .collect(),
        tiers: Vec::new(),
    });
    for k in 0..2u8 {
        let ns = c.ns(k);
        ip(
            &ns,
            &[
                "addr",
                "add",
                &format!("{}/64", host_ip6(k)),
                "dev",
                "eth0",
                "nodad",
            ],
        );
        testbed_common::sh(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-qw",
            "net.ipv4.ping_group_range=0 2147483647",
        ]);
    }
    c.count_on_the_wire();
    let l = c.bed.lan_netns_name().to_string();
    for (counter, m) in [
        ("wg6", vec!["udp", "dport", "51821"]),
        ("hosts", vec!["ip", "protocol", "icmp"]),
        ("hosts6", vec!["icmpv6", "type", "echo-request"]),
    ] {
        nft(&l, &["add", "counter", "bridge", "wire", counter]);
        let mut a = vec!["add", "rule", "bridge", "wire", "frames"];
        a.extend(m);
        a.extend(["counter", "name", counter]);
        nft(&l, &a);
    }
    let keys = |version: &str| -> Vec<String> { (0..2u8).map(|k| c.key(k, version)).collect() };
    let (k4, k6) = (keys("IPV4"), keys("IPV6"));
    for to in 0..2u8 {
        for k in 0..2u8 {
            let m = [
                json!({"wireguard_endpoint_update": {"hostname": format!("n{k}"),
                    "public_key": k4[usize::from(k)]}}),
                json!({"wireguard_endpoint_v6_update": {"hostname": format!("n{k}"),
                    "public_key_v6": k6[usize::from(k)]}}),
            ];
            c.node_mut(to).daemon.send(&m);
        }
    }
    for k in 0..2u8 {
        let j = 1 - k;
        let ns = c.ns(k);
        c.eventually(&format!("n{k}'s devices, peers, tables and rules"), || {
            let sh = |a: &[&str]| try_sh(a);
            // IPv4: the host's address on the device, its host route among the peer's.
            let a4 = sh(&["ip", "-n", &ns, "-4", "-o", "addr", "show", "dev", DEV])?;
            if !a4.contains(&format!("inet {}/32", host_ip(k))) {
                return Err(format!("{DEV}: {a4}"));
            }
            let t4 = sh(&["ip", "-n", &ns, "-4", "route", "show", "table", "1"])?;
            for want in [
                format!("{} dev {DEV} scope link", host_ip(j)),
                format!("{} dev {DEV} scope link", block(j)),
                format!("throw {}", block(k)),
            ] {
                if !t4.lines().any(|l| l.trim() == want) {
                    return Err(format!("table 1 (v4) lacks {want:?}: {t4}"));
                }
            }
            // IPv6: its own device, port, MTU, metric 1024 routes, a rule of its own family.
            let d6 = sh(&[
                "ip",
                "-n",
                &ns,
                "-j",
                "-d",
                "link",
                "show",
                "dev",
                "wg-v6.cali",
            ])?;
            let d6: Value = serde_json::from_str(&d6).map_err(|e| e.to_string())?;
            if d6[0]["mtu"] != 1420 || d6[0]["linkinfo"]["info_kind"] != "wireguard" {
                return Err(format!("wg-v6.cali: {d6}"));
            }
            let w6 = sh(&[
                "ip",
                "netns",
                "exec",
                &ns,
                "wg",
                "show",
                "wg-v6.cali",
                "dump",
            ])?;
            let endpoint = format!("[{}]:51821", host_ip6(j));
            if !w6
                .lines()
                .next()
                .is_some_and(|l| l.contains("\t51821\t0x200000"))
                || !w6.contains(&endpoint)
                || !w6.contains(&k6[usize::from(j)])
            {
                return Err(format!("wg show wg-v6.cali: {w6}"));
            }
            let t6 = sh(&["ip", "-n", &ns, "-6", "route", "show", "table", "1"])?;
            for want in [
                format!("{} dev wg-v6.cali metric 1024 pref medium", host_ip6(j)),
                format!("{} dev wg-v6.cali metric 1024 pref medium", block6(j)),
            ] {
                if !t6.lines().any(|l| l.trim() == want) {
                    return Err(format!("table 1 (v6) lacks {want:?}: {t6}"));
                }
            }
            let r6 = sh(&["ip", "-n", &ns, "-6", "rule", "show", "pref", "99"])?;
            if !r6.contains(&format!("not from all fwmark {MARK}/{MARK} lookup 1")) {
                return Err(format!("IPv6 rule: {r6}"));
            }
            // Host encryption: src_valid_mark, and raw PREROUTING marks host traffic.
            let svm = sh(&[
                "ip",
                "netns",
                "exec",
                &ns,
                "cat",
                "/proc/sys/net/ipv4/conf/all/src_valid_mark",
            ])?;
            let raw = sh(&[
                "ip",
                "netns",
                "exec",
                &ns,
                "nft",
                "list",
                "chain",
                "ip",
                "calico",
                "raw-cali-PREROUTING",
            ])?;
            (svm.trim() == "1" && raw.contains("jump raw-cali-wireguard-incoming-mark"))
                .then_some(())
                .ok_or(format!("src_valid_mark {svm}, {raw}"))
        });
    }
    // Host ↔ host over both families, encrypted: WireGuard's UDP on the wire, no plain echo;
    // a strict reverse-path filter on the underlay does not drop WireGuard's own packets,
    // though their source is routed through WireGuard: raw PREROUTING marks them, and the
    // marked lookup skips table 1. (ARP is not marked, and strict RPF would refuse a peer's
    // ARP requests for the same reason: the hosts get each other's MAC as a permanent entry,
    // as they must in a cluster that runs host encryption with strict RPF.)
    let mac = |k: u8| {
        let v: Value =
            serde_json::from_str(&ip(&c.ns(k), &["-j", "link", "show", "eth0"])).unwrap();
        v[0]["address"].as_str().unwrap().to_string()
    };
    for k in 0..2u8 {
        let (ns, j) = (c.ns(k), 1 - k);
        ip(
            &ns,
            &[
                "neigh",
                "replace",
                &host_ip(j),
                "lladdr",
                &mac(j),
                "dev",
                "eth0",
                "nud",
                "permanent",
            ],
        );
        testbed_common::sh(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-qw",
            "net.ipv4.conf.all.rp_filter=1",
            "net.ipv4.conf.eth0.rp_filter=1",
        ]);
    }
    let n0 = NetNs::open(&c.ns(0)).expect("n0's namespace");
    for dst in [host_ip(1), host_ip6(1)] {
        let dst: IpAddr = dst.parse().unwrap();
        c.eventually(&format!("n0 → {dst}"), || {
            let v = icmp_echo(&n0, dst, PROBE_TIMEOUT).map_err(|e| e.to_string())?;
            (v == Verdict::Pass).then_some(()).ok_or_else(|| {
                let mut why = format!("{v}");
                for k in 0..2u8 {
                    let ns = c.ns(k);
                    for cmd in [
                        vec!["ip", "netns", "exec", &ns, "wg", "show", "all"],
                        vec!["ip", "-n", &ns, "route", "get", "172.31.0.11"],
                        vec!["ip", "-n", &ns, "route", "get", "172.31.0.10"],
                        vec!["ip", "-n", &ns, "-s", "link", "show"],
                        vec![
                            "ip", "netns", "exec", &ns, "nft", "list", "table", "ip", "calico",
                        ],
                    ] {
                        why.push_str(&format!(
                            "\n$ {}\n{}",
                            cmd.join(" "),
                            try_sh(&cmd).unwrap_or_else(|e| e)
                        ));
                    }
                }
                why
            })
        });
    }
    assert!(
        c.on_the_wire("wg") > 0 && c.on_the_wire("wg6") > 0,
        "WireGuard on the wire"
    );
    assert_eq!(c.on_the_wire("hosts"), 0, "a plain ICMP echo between hosts");
    assert_eq!(
        c.on_the_wire("hosts6"),
        0,
        "a plain ICMPv6 echo between hosts"
    );
    c.daemons_alive();
}

/// On a kernel without the module: the agent says so once, reports an empty key, keeps
/// running, and the rest of the node is programmed: pods still talk, unencrypted.
fn without_the_module() {
    let mut c = Cluster::build(2, |_| wg_on(), |_| Local::default());
    c.eventually("the agent's word on the missing module", || {
        let log = c.node(0).daemon.log();
        (log.matches(NO_MODULE).count() == 1)
            .then_some(())
            .ok_or(log)
    });
    c.eventually("an empty key reported", || {
        (c.reported_key(0).as_deref() == Some(""))
            .then_some(())
            .ok_or(format!("{:?}", c.reported_key(0)))
    });
    c.wait_ping(0, 1, Verdict::Pass);
    c.wait_ping(1, 0, Verdict::Pass);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(c.node(0).daemon.log().matches(NO_MODULE).count(), 1);
    c.daemons_alive();
}
