//! Privileged, end to end: IPv6 pods on two nodes talk over `vxlan-v6.calico`. Each node is a
//! namespace on one IPv6 underlay bridge and runs its own `felix-nft run --source stdin`
//! process; each has one IPv6-only pod laid out as Calico's CNI leaves it (a /128 on the pod's
//! eth0, default route via the host side's link-local `fe80::ecee:eeff:feee:eeee`, which the
//! `cali*` veth holds because its MAC is `ee:ee:ee:ee:ee:ee`). Each daemon gets an IPv6 VXLAN
//! pool, both nodes' VTEPs (IPv6 fields only), its own block as local and the other's as remote.
//! Proves: the IPv6 device as Felix makes it (VNI, port, MTU = parent − 70), its FDB, NDP
//! entries and routes, pod ↔ pod ICMPv6 and TCP across the nodes, VXLAN accepted only from the
//! VTEP set, and a deleted device repaired. `ip`/`bridge` are oracles and set-up tools only.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use felix_nft::netns::{unique_netns_name, NamedNetNs, NetNs};
use felix_nft::testbed::probe::{icmp_echo, tcp_connect, TcpServer, Verdict};
use serde_json::{json, Value};

const NODES: u8 = 2;

fn sh(argv: &[&str]) -> String {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {argv:?}: {e}"));
    assert!(
        out.status.success(),
        "{argv:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn named(prefix: &str) -> NamedNetNs {
    NetNs::create_named(&unique_netns_name(prefix)).unwrap_or_else(|e| {
        panic!("this privileged test needs to create network namespaces ({e}); run as root")
    })
}

struct Node {
    ns: NamedNetNs,
    pod: NamedNetNs,
    daemon: Child,
    stdin: ChildStdin,
    log: tempfile::NamedTempFile,
}

impl Node {
    fn send(&mut self, msgs: &[Value]) {
        for m in msgs {
            writeln!(self.stdin, "{m}").expect("writing to felix-nft");
        }
    }
    fn name(&self) -> &str {
        self.ns.name()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

fn mac_v6(k: u8) -> String {
    format!("66:00:00:00:06:{k:02x}")
}
fn node_ip(k: u8) -> String {
    format!("fd00:31::1{k}")
}
fn tunnel_ip(k: u8) -> String {
    format!("fd00:65:0:{k}::")
}
fn pod_ip(k: u8) -> IpAddr {
    format!("fd00:65:0:{k}::2").parse().unwrap()
}

fn eventually(what: &str, nodes: &[Node], mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => {
                let logs: String = nodes
                    .iter()
                    .map(|n| {
                        let log = std::fs::read_to_string(n.log.path()).unwrap_or_default();
                        format!("--- {}\n{log}", n.name())
                    })
                    .collect();
                panic!("{what}: {e}\n{logs}");
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn vxlan_v6(node: &Node) -> Option<Value> {
    let out = sh(&["ip", "-n", node.name(), "-d", "-j", "link", "show"]);
    let links: Value = serde_json::from_str(&out).ok()?;
    links
        .as_array()?
        .iter()
        .find(|l| l["ifname"] == "vxlan-v6.calico")
        .cloned()
}

#[test]
fn ipv6_pods_on_two_nodes_talk_over_vxlan_v6() {
    let lan = named("cl6-lan");
    let l = lan.name().to_string();
    sh(&["ip", "-n", &l, "link", "add", "br0", "type", "bridge"]);
    sh(&["ip", "-n", &l, "link", "set", "br0", "up"]);
    let bin = env!("CARGO_BIN_EXE_felix-nft");
    let mut nodes: Vec<Node> = Vec::new();
    for k in 0..NODES {
        let ns = named(&format!("cl6-n{k}"));
        let pod = named(&format!("cl6-p{k}"));
        let (n, p) = (ns.name().to_string(), pod.name().to_string());
        let up = format!("u{k}");
        sh(&[
            "ip", "-n", &l, "link", "add", &up, "type", "veth", "peer", "name", "eth0", "netns", &n,
        ]);
        sh(&["ip", "-n", &l, "link", "set", &up, "master", "br0", "up"]);
        sh(&["ip", "-n", &n, "link", "set", "lo", "up"]);
        sh(&["ip", "-n", &n, "link", "set", "eth0", "up"]);
        sh(&[
            "ip",
            "-n",
            &n,
            "-6",
            "addr",
            "add",
            &format!("{}/64", node_ip(k)),
            "dev",
            "eth0",
            "nodad",
        ]);
        // The pod, as Calico's CNI plugin leaves it for IPv6.
        let cali = format!("cali{k}pod6");
        sh(&[
            "ip", "-n", &n, "link", "add", &cali, "type", "veth", "peer", "name", "eth0", "netns",
            &p,
        ]);
        sh(&[
            "ip",
            "-n",
            &n,
            "link",
            "set",
            &cali,
            "address",
            "ee:ee:ee:ee:ee:ee",
        ]);
        sh(&["ip", "-n", &n, "link", "set", &cali, "up"]);
        sh(&["ip", "-n", &p, "link", "set", "lo", "up"]);
        // ICMP probes use unprivileged ping sockets (the IPv4 knob covers ICMPv6 too).
        pod.ns()
            .run(|| std::fs::write("/proc/sys/net/ipv4/ping_group_range", "0 2147483647"))
            .unwrap()
            .unwrap();
        sh(&["ip", "-n", &p, "link", "set", "eth0", "up"]);
        sh(&[
            "ip",
            "-n",
            &p,
            "-6",
            "addr",
            "add",
            &format!("{}/128", pod_ip(k)),
            "dev",
            "eth0",
            "nodad",
        ]);
        sh(&[
            "ip",
            "-n",
            &p,
            "-6",
            "route",
            "add",
            "default",
            "via",
            "fe80::ecee:eeff:feee:eeee",
            "dev",
            "eth0",
        ]);
        let pod_mac: Value =
            serde_json::from_str(&sh(&["ip", "-n", &p, "-j", "link", "show", "eth0"])).unwrap();
        let pod_mac = pod_mac[0]["address"].as_str().unwrap().to_string();

        let log = tempfile::NamedTempFile::new().unwrap();
        let mut daemon = Command::new(bin)
            .args(["run", "--source", "stdin", "--keep-running", "--netns", &n])
            .env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
            .env("FELIX_NFTABLESTABLEOWNER", "false")
            .env("FELIX_REPORTINGINTERVALSECS", "0")
            .env("FELIX_FELIXHOSTNAME", format!("n{k}"))
            .env("FELIX_ROUTEREFRESHINTERVAL", "2")
            .env_remove("FELIX_NFT_LOG_FORMAT")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("spawning felix-nft");
        let stdin = daemon.stdin.take().unwrap();
        let mut node = Node {
            ns,
            pod,
            daemon,
            stdin,
            log,
        };
        let mut msgs = vec![
            json!({"active_profile_update": {"id": {"name": "allow-all"},
                "profile": {"inbound_rules": [{"action": "allow"}],
                            "outbound_rules": [{"action": "allow"}]}}}),
            json!({"ipam_pool_update": {"id": "fd00:65::-48", "pool": {"cidr": "fd00:65::/48",
                "vxlan_mode": "Always"}}}),
        ];
        for j in 0..NODES {
            msgs.push(
                json!({"vtep_update": {"node": format!("n{j}"), "mac_v6": mac_v6(j),
                "ipv6_addr": tunnel_ip(j), "parent_device_ipv6": node_ip(j)}}),
            );
            msgs.push(json!({"route_update": {
                "types": if j == k { "LOCAL_WORKLOAD" } else { "REMOTE_WORKLOAD" },
                "ip_pool_type": "VXLAN", "dst": format!("fd00:65:0:{j}::/122"),
                "dst_node_name": format!("n{j}"), "dst_node_ip": node_ip(j)}}));
        }
        msgs.push(json!({"workload_endpoint_update": {
            "id": {"orchestrator_id": "k8s", "workload_id": format!("default/p{k}"), "endpoint_id": "eth0"},
            "endpoint": {"state": "active", "name": cali, "mac": pod_mac,
                "ipv6_nets": [format!("{}/128", pod_ip(k))], "profile_ids": ["allow-all"]}}}));
        msgs.push(json!({"in_sync": {}}));
        node.send(&msgs);
        nodes.push(node);
    }

    // The IPv6 device as Felix makes it, on every node: no IPv4 device (no IPv4 VXLAN).
    for node in &nodes {
        eventually("vxlan-v6.calico programmed", &nodes, || {
            let dev = vxlan_v6(node).ok_or("no vxlan-v6.calico")?;
            let info = &dev["linkinfo"]["info_data"];
            (info["id"] == 4096 && info["port"] == 4789 && dev["mtu"] == 1430)
                .then_some(())
                .ok_or(format!("{dev}"))
        });
        let links = sh(&["ip", "-n", node.name(), "link", "show"]);
        assert!(!links.contains("vxlan.calico"), "{links}");
    }
    let n0 = nodes[0].name().to_string();
    let dev = vxlan_v6(&nodes[0]).unwrap();
    assert_eq!(dev["address"], mac_v6(0), "{dev}");
    assert_eq!(dev["linkinfo"]["info_data"]["local6"], node_ip(0), "{dev}");
    eventually("route, FDB and NDP entry for n1", &nodes, || {
        let routes = sh(&["ip", "-n", &n0, "-6", "route"]);
        let fdb = sh(&["bridge", "-n", &n0, "fdb", "show", "dev", "vxlan-v6.calico"]);
        let neigh = sh(&[
            "ip",
            "-n",
            &n0,
            "-6",
            "neigh",
            "show",
            "dev",
            "vxlan-v6.calico",
        ]);
        let want_route = format!(
            "fd00:65:0:1::/122 via {} dev vxlan-v6.calico metric 1024 onlink mtu 1430",
            tunnel_ip(1)
        );
        let want_fdb = format!("{} dst {} self permanent", mac_v6(1), node_ip(1));
        let want_neigh = format!("{} lladdr {} PERMANENT", tunnel_ip(1), mac_v6(1));
        for (what, have, want) in [
            ("route", &routes, &want_route),
            ("fdb", &fdb, &want_fdb),
            ("neigh", &neigh, &want_neigh),
        ] {
            if !have.contains(want.as_str()) {
                return Err(format!("{what}: want {want:?} in\n{have}"));
            }
        }
        Ok(())
    });
    let nft = sh(&[
        "ip",
        "netns",
        "exec",
        &n0,
        "nft",
        "list",
        "set",
        "ip6",
        "calico",
        "cali60all-vxlan-net",
    ]);
    assert!(
        nft.contains(&node_ip(1)) && !nft.contains(&node_ip(0)),
        "the VTEP set holds the other node only: {nft}"
    );

    // Pod ↔ pod, both directions, ICMPv6 and TCP.
    let server = TcpServer::start(nodes[1].pod.ns(), 8080).unwrap();
    for (a, b) in [(0u8, 1u8), (1, 0)] {
        eventually(
            &format!("p{a} → p{b} over vxlan-v6"),
            &nodes,
            || match icmp_echo(
                nodes[a as usize].pod.ns(),
                pod_ip(b),
                Duration::from_millis(500),
            ) {
                Ok(Verdict::Pass) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
    }
    let tcp = tcp_connect(
        nodes[0].pod.ns(),
        SocketAddr::new(pod_ip(1), server.port()),
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(tcp, Verdict::Pass);

    // Drift: the device deleted by hand comes back with what lives on it, and traffic recovers.
    sh(&["ip", "-n", &n0, "link", "del", "vxlan-v6.calico"]);
    eventually("vxlan-v6.calico repaired", &nodes, || {
        let routes = sh(&["ip", "-n", &n0, "-6", "route"]);
        match icmp_echo(nodes[0].pod.ns(), pod_ip(1), Duration::from_millis(500)) {
            Ok(Verdict::Pass) if routes.contains("dev vxlan-v6.calico") => Ok(()),
            other => Err(format!("{other:?}\n{routes}")),
        }
    });
}
