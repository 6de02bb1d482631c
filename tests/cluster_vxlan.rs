//! Privileged, end to end: a three-node cluster in network namespaces. Each node is a namespace
//! on one underlay bridge, runs its own `felix-nft run --source stdin` process, and has one pod
//! laid out as Calico's CNI leaves it (a /32 on the pod's eth0, gateway 169.254.1.1, the host
//! side a `cali*` veth). Each daemon gets what Felix's calculation graph would send that node:
//! the pool, every node's VTEP, its own block as local and the others' as remote, its pod.
//! Proves with real packets: pod ↔ pod ICMP and TCP across nodes over `vxlan.calico`; a VTEP's
//! MAC change (traffic recovers); a node's removal (its FDB entry and route go, traffic to it
//! fails); drift (the device or an FDB entry deleted by hand) repaired without a restart.
//! `ip`/`bridge` are oracles and set-up tools only.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use felix_nft::netns::{unique_netns_name, NamedNetNs, NetNs};
use felix_nft::testbed::probe::{icmp_echo, tcp_connect, TcpServer, Verdict};
use serde_json::{json, Value};

const NODES: u8 = 3;

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
    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

fn mac(k: u8) -> String {
    format!("66:00:00:00:00:{k:02x}")
}
fn node_ip(k: u8) -> String {
    format!("172.31.0.1{k}")
}
fn pod_ip(k: u8) -> IpAddr {
    format!("10.65.{k}.2").parse().unwrap()
}

fn vtep(k: u8, mac: &str) -> Value {
    json!({"vtep_update": {"node": format!("n{k}"), "mac": mac,
        "ipv4_addr": format!("10.65.{k}.0"), "parent_device_ip": node_ip(k)}})
}

fn block(own: u8, k: u8) -> Value {
    json!({"route_update": {"types": if k == own { "LOCAL_WORKLOAD" } else { "REMOTE_WORKLOAD" },
        "ip_pool_type": "VXLAN", "dst": format!("10.65.{k}.0/26"),
        "dst_node_name": format!("n{k}"), "dst_node_ip": node_ip(k)}})
}

fn eventually(what: &str, nodes: &[Node], mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => {
                let logs: String = nodes
                    .iter()
                    .map(|n| format!("--- {}\n{}", n.name(), n.log()))
                    .collect();
                panic!("{what}: {e}\n{logs}");
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn ping(nodes: &[Node], from: u8, to: u8) -> Verdict {
    icmp_echo(
        nodes[from as usize].pod.ns(),
        pod_ip(to),
        Duration::from_millis(500),
    )
    .unwrap_or_else(|e| panic!("ICMP probe p{from} → p{to}: {e}"))
}

fn fdb(node: &Node) -> String {
    sh(&[
        "bridge",
        "-n",
        node.name(),
        "fdb",
        "show",
        "dev",
        "vxlan.calico",
    ])
}

#[test]
fn pods_on_three_nodes_talk_over_vxlan_and_the_overlay_heals() {
    let lan = named("cl-lan");
    let l = lan.name().to_string();
    sh(&["ip", "-n", &l, "link", "add", "br0", "type", "bridge"]);
    sh(&["ip", "-n", &l, "link", "set", "br0", "up"]);
    let bin = env!("CARGO_BIN_EXE_felix-nft");
    let mut nodes: Vec<Node> = Vec::new();
    for k in 0..NODES {
        let ns = named(&format!("cl-n{k}"));
        let pod = named(&format!("cl-p{k}"));
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
            "addr",
            "add",
            &format!("{}/24", node_ip(k)),
            "dev",
            "eth0",
        ]);
        // A default route, as every node has: proxy ARP for the pods' 169.254.1.1 answers only
        // for an address the node can route elsewhere.
        sh(&[
            "ip",
            "-n",
            &n,
            "route",
            "add",
            "default",
            "via",
            "172.31.0.1",
            "dev",
            "eth0",
        ]);
        // The pod, as Calico's CNI plugin leaves it.
        let cali = format!("cali{k}pod");
        sh(&[
            "ip", "-n", &n, "link", "add", &cali, "type", "veth", "peer", "name", "eth0", "netns",
            &p,
        ]);
        sh(&["ip", "-n", &n, "link", "set", &cali, "up"]);
        sh(&["ip", "-n", &p, "link", "set", "lo", "up"]);
        // ICMP probes use unprivileged ping sockets.
        pod.ns()
            .run(|| std::fs::write("/proc/sys/net/ipv4/ping_group_range", "0 2147483647"))
            .unwrap()
            .unwrap();
        sh(&["ip", "-n", &p, "link", "set", "eth0", "up"]);
        sh(&[
            "ip",
            "-n",
            &p,
            "addr",
            "add",
            &format!("{}/32", pod_ip(k)),
            "dev",
            "eth0",
        ]);
        sh(&[
            "ip",
            "-n",
            &p,
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ]);
        sh(&[
            "ip",
            "-n",
            &p,
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
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
            json!({"ipam_pool_update": {"id": "10.65.0.0-16", "pool": {"cidr": "10.65.0.0/16",
                "masquerade": false, "vxlan_mode": "Always"}}}),
        ];
        for j in 0..NODES {
            msgs.push(vtep(j, &mac(j)));
            msgs.push(block(k, j));
        }
        msgs.push(json!({"workload_endpoint_update": {
            "id": {"orchestrator_id": "k8s", "workload_id": format!("default/p{k}"), "endpoint_id": "eth0"},
            "endpoint": {"state": "active", "name": cali, "mac": pod_mac,
                "ipv4_nets": [format!("{}/32", pod_ip(k))], "profile_ids": ["allow-all"]}}}));
        msgs.push(json!({"in_sync": {}}));
        node.send(&msgs);
        nodes.push(node);
    }

    // The device as Felix makes it, on every node.
    for node in &nodes {
        eventually("vxlan.calico programmed", &nodes, || {
            let out = sh(&["ip", "-n", node.name(), "-d", "-j", "link", "show"]);
            let links: Value = serde_json::from_str(&out).unwrap();
            let dev = links
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["ifname"] == "vxlan.calico")
                .ok_or("no vxlan.calico")?;
            let info = &dev["linkinfo"]["info_data"];
            (info["id"] == 4096 && info["port"] == 4789 && dev["mtu"] == 1450)
                .then_some(())
                .ok_or(format!("{dev}"))
        });
    }
    let n0 = nodes[0].name().to_string();
    let routes = sh(&["ip", "-n", &n0, "route"]);
    assert!(
        routes.contains("10.65.1.0/26 via 10.65.1.0 dev vxlan.calico"),
        "{routes}"
    );
    assert!(
        routes.contains("blackhole 10.65.0.0/26 proto 80"),
        "{routes}"
    );
    let f = fdb(&nodes[0]);
    assert!(
        f.contains(&format!("{} dst 172.31.0.11 self permanent", mac(1))),
        "{f}"
    );
    let neigh = sh(&["ip", "-n", &n0, "neigh", "show", "dev", "vxlan.calico"]);
    assert!(
        neigh.contains(&format!("10.65.2.0 lladdr {} PERMANENT", mac(2))),
        "{neigh}"
    );

    // Pod ↔ pod, every ordered pair, ICMP.
    for a in 0..NODES {
        for b in 0..NODES {
            if a != b {
                eventually(&format!("ping p{a} → p{b}"), &nodes, || {
                    match ping(&nodes, a, b) {
                        Verdict::Pass => Ok(()),
                        v => Err(format!("{v:?}")),
                    }
                });
            }
        }
    }
    // TCP across nodes.
    let server = TcpServer::start(nodes[0].pod.ns(), 8080).unwrap();
    let dst = SocketAddr::new(pod_ip(0), server.port());
    for from in 1..NODES {
        let v = tcp_connect(nodes[from as usize].pod.ns(), dst, Duration::from_secs(2)).unwrap();
        assert_eq!(v, Verdict::Pass, "TCP p{from} → p0");
    }

    // n1's VTEP MAC changes (Felix sends Remove then Update to every node): n1's device is
    // re-created with the new MAC, the others' ARP and FDB entries follow, traffic recovers.
    let new_mac = "66:00:00:00:00:aa";
    for node in nodes.iter_mut() {
        node.send(&[json!({"vtep_remove": {"node": "n1"}}), vtep(1, new_mac)]);
    }
    eventually("n1's new MAC in n0's FDB", &nodes, || {
        let f = fdb(&nodes[0]);
        (f.contains(&format!("{new_mac} dst 172.31.0.11")) && !f.contains(&mac(1)))
            .then_some(())
            .ok_or(f)
    });
    eventually("n1's device has the new MAC", &nodes, || {
        // Re-created: for a moment it does not exist.
        let out = Command::new("ip")
            .args(["-n", nodes[1].name(), "link", "show", "vxlan.calico"])
            .output()
            .map_err(|e| e.to_string())?;
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        out.contains(new_mac).then_some(()).ok_or(out)
    });
    eventually("p0 → p1 after the MAC change", &nodes, || {
        match ping(&nodes, 0, 1) {
            Verdict::Pass => Ok(()),
            v => Err(format!("{v:?}")),
        }
    });

    // Drift on n0: the device deleted by hand comes back with its routes, ARP and FDB.
    sh(&["ip", "-n", &n0, "link", "del", "vxlan.calico"]);
    eventually(
        "p0 → p2 after vxlan.calico was deleted",
        &nodes,
        || match ping(&nodes, 0, 2) {
            Verdict::Pass => Ok(()),
            v => Err(format!("{v:?}")),
        },
    );
    let routes = sh(&["ip", "-n", &n0, "route"]);
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
        &mac(2),
        "dev",
        "vxlan.calico",
        "self",
    ]);
    eventually("n2's FDB entry repaired", &nodes, || {
        let f = fdb(&nodes[0]);
        f.contains(&format!("{} dst 172.31.0.12", mac(2)))
            .then_some(())
            .ok_or(f)
    });

    // n2 leaves: its block route and VTEP go from n0 (RouteRemove first, as Felix orders
    // them); its FDB entry, ARP entry and route vanish and p0 can no longer reach p2.
    nodes[0].send(&[
        json!({"route_remove": {"dst": "10.65.2.0/26"}}),
        json!({"vtep_remove": {"node": "n2"}}),
    ]);
    eventually("n2 gone from n0", &nodes, || {
        let f = fdb(&nodes[0]);
        let r = sh(&["ip", "-n", &n0, "route"]);
        let a = sh(&["ip", "-n", &n0, "neigh", "show", "dev", "vxlan.calico"]);
        (!f.contains(&mac(2)) && !r.contains("10.65.2.0/26") && !a.contains("10.65.2.0"))
            .then_some(())
            .ok_or(format!("{f}\n{r}\n{a}"))
    });
    assert_ne!(ping(&nodes, 0, 2), Verdict::Pass, "p0 → p2 after n2 left");
    assert_eq!(ping(&nodes, 0, 1), Verdict::Pass, "p0 → p1 unaffected");

    for node in nodes.iter_mut() {
        let _ = node.daemon.try_wait().map(|s| {
            assert!(s.is_none(), "{} exited: {}", node.ns.name(), node.log());
        });
    }
    drop(nodes);
    drop(lan);
}
