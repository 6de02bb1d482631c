//! Privileged, end to end: the cluster bed ([`testbed::cluster`]) with one `felix-nft run
//! --source stdin` process per node, fed the JSON lines of what the controller
//! ([`testbed::controller`]) computes — the same bed and controller `felix-nft demo --cluster`
//! runs in-process. Proves across processes and the JSON transport: a policy on node 2 admits
//! an IP set of pods on other nodes; a node joining later reaches everyone; a pod relabelled on
//! one node changes what another node admits; a node leaving is withdrawn everywhere (its FDB
//! entry gone, traffic to it fails). And cross-subnet: with a second underlay segment behind the
//! bed's router, a CrossSubnet pool sends same-subnet traffic straight over the underlay (the
//! tunnel's transmit counter does not move) and traffic across the router through the tunnel.
//! `ip` and `bridge` are oracles only.
//!
//! [`testbed::cluster`]: felix_nft::testbed::cluster
//! [`testbed::controller`]: felix_nft::testbed::controller

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

mod route_oracle;

use felix_nft::netns::NetNs;
use felix_nft::proto::protocol::NumberOrName;
use felix_nft::proto::{
    IpamPool, Policy, PolicyId, PortRange, Profile, Protocol, Rule, TierInfo, ToDataplane,
};
use felix_nft::testbed::cluster::{Cluster, ClusterSpec, NodeSpec};
use felix_nft::testbed::controller::{Controller, IpSetSource, NodeInfo, PodInfo};
use felix_nft::testbed::probe::{icmp_echo, tcp_connect, TcpServer, Verdict};
use felix_nft::testbed::topology::WorkloadSpec;

const PORT: u16 = 8080;

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this privileged test creates network namespaces and runs felix-nft in them; run as root"
    );
}

struct Daemon {
    child: Child,
    stdin: ChildStdin,
    log: tempfile::NamedTempFile,
}

impl Daemon {
    /// Starts `felix-nft run` in `netns` as node `hostname`, with extra environment.
    fn start(netns: &str, hostname: &str, env: &[(&str, &str)]) -> Daemon {
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_felix-nft"))
            .args([
                "run",
                "--source",
                "stdin",
                "--keep-running",
                "--netns",
                netns,
            ])
            .env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
            .env("FELIX_REPORTINGINTERVALSECS", "0")
            .env("FELIX_FELIXHOSTNAME", hostname)
            .env_remove("FELIX_NFT_LOG_FORMAT")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("reopening the log"))
            .spawn()
            .expect("spawning felix-nft run");
        let stdin = child.stdin.take().expect("the daemon's stdin");
        Daemon { child, stdin, log }
    }

    fn send(&mut self, msgs: &[ToDataplane]) {
        for m in msgs {
            let line = serde_json::to_string(m).expect("a message as JSON");
            writeln!(self.stdin, "{line}").expect("writing to felix-nft");
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the underlay of `spec`, or fails saying why.
fn build_cluster(spec: ClusterSpec) -> Cluster {
    block_on(Cluster::build(&spec))
        .expect("building the underlay (this privileged test needs root)")
}

fn pod_ip(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 65, k, 2)
}

fn clients() -> PolicyId {
    PolicyId {
        name: "allow-clients".into(),
        kind: "GlobalNetworkPolicy".into(),
        ..PolicyId::default()
    }
}

fn model() -> Controller {
    let mut c = Controller::new();
    c.set_pool(
        "10.65.0.0-16",
        IpamPool {
            cidr: "10.65.0.0/16".into(),
            vxlan_mode: "Always".into(),
            ..IpamPool::default()
        },
    );
    let allow = || Rule {
        action: "allow".into(),
        ..Rule::default()
    };
    c.set_profile(
        "allow-all",
        Profile {
            inbound_rules: vec![allow()],
            outbound_rules: vec![allow()],
        },
    );
    c.set_ipset(
        "s:clients",
        IpSetSource::Labels([("role".to_string(), "client".to_string())].into()),
    );
    c.set_policy(
        clients(),
        Policy {
            inbound_rules: vec![Rule {
                action: "allow".into(),
                protocol: Some(Protocol {
                    number_or_name: Some(NumberOrName::Name("tcp".into())),
                }),
                dst_ports: vec![PortRange {
                    first: i32::from(PORT),
                    last: i32::from(PORT),
                }],
                src_ip_set_ids: vec!["s:clients".into()],
                ..Rule::default()
            }],
            ..Policy::default()
        },
    );
    c
}

/// Builds node `k` with one pod, registers both with the controller, starts its daemon.
fn join(
    cluster: &mut Cluster,
    ctl: &mut Controller,
    daemons: &mut BTreeMap<String, Daemon>,
    k: u8,
    role: &str,
) -> (PodInfo, NetNs) {
    join_at(
        cluster,
        ctl,
        daemons,
        k,
        role,
        Ipv4Addr::new(172, 31, 0, 10 + k),
    )
}

/// [`join`] with the node's underlay address given.
fn join_at(
    cluster: &mut Cluster,
    ctl: &mut Controller,
    daemons: &mut BTreeMap<String, Daemon>,
    k: u8,
    role: &str,
    ip: Ipv4Addr,
) -> (PodInfo, NetNs) {
    join_with(cluster, ctl, daemons, k, role, ip, &[])
}

/// [`join_at`] with extra environment for the node's daemon.
fn join_with(
    cluster: &mut Cluster,
    ctl: &mut Controller,
    daemons: &mut BTreeMap<String, Daemon>,
    k: u8,
    role: &str,
    ip: Ipv4Addr,
    env: &[(&str, &str)],
) -> (PodInfo, NetNs) {
    let name = format!("n{k}");
    let node = block_on(cluster.add_node(&NodeSpec {
        name: name.clone(),
        ip,
        pods: vec![WorkloadSpec::v4(format!("p{k}"), pod_ip(k))],
    }))
    .unwrap_or_else(|e| panic!("adding {name}: {e:?} (this privileged test needs root)"));
    let w = &node.pods()[0];
    let pod_ns = w.ns().try_clone().expect("a namespace handle");
    let mut endpoint = w.endpoint(&["allow-all"]);
    if role == "server" {
        endpoint.tiers = vec![TierInfo {
            name: "default".into(),
            ingress_policies: vec![clients()],
            ..TierInfo::default()
        }];
    }
    let pod = PodInfo {
        id: w.endpoint_id(),
        endpoint,
        labels: [("role".to_string(), role.to_string())].into(),
    };
    let netns = node.netns_name().to_string();
    ctl.add_node(NodeInfo::new(
        &name,
        ip,
        24,
        format!("10.65.{k}.0/26").parse().expect("a block"),
    ));
    assert!(ctl.add_pod(&name, pod.clone()));
    daemons.insert(name.clone(), Daemon::start(&netns, &name, env));
    (pod, pod_ns)
}

fn flush(ctl: &mut Controller, daemons: &mut BTreeMap<String, Daemon>) {
    for (node, msgs) in ctl.flush() {
        if let Some(d) = daemons.get_mut(&node) {
            d.send(&msgs);
        }
    }
}

fn eventually(what: &str, daemons: &BTreeMap<String, Daemon>, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        if Instant::now() > deadline {
            let logs: String = daemons
                .iter()
                .map(|(n, d)| {
                    format!(
                        "--- {n}\n{}",
                        std::fs::read_to_string(d.log.path()).unwrap_or_default()
                    )
                })
                .collect();
            panic!("{what} did not happen\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn controller_messages_carry_a_cluster_through_felix_nft_processes() {
    require_root();
    let mut cluster = build_cluster(ClusterSpec {
        prefix: "fnt-t-clctl".into(),
        ..ClusterSpec::default()
    });
    let mut ctl = model();
    let mut daemons = BTreeMap::new();
    let mut pods = BTreeMap::new();
    pods.insert(1, join(&mut cluster, &mut ctl, &mut daemons, 1, "client").1);
    pods.insert(2, join(&mut cluster, &mut ctl, &mut daemons, 2, "server").1);
    flush(&mut ctl, &mut daemons);
    let server = TcpServer::start(&pods[&2], PORT).expect("a listener");
    let to_server = SocketAddr::new(IpAddr::V4(pod_ip(2)), server.port());
    let tcp = |pods: &BTreeMap<u8, NetNs>, k: u8| {
        tcp_connect(&pods[&k], to_server, Duration::from_millis(500)).expect("probe")
    };
    let ping = |pods: &BTreeMap<u8, NetNs>, a: u8, b: u8| {
        icmp_echo(&pods[&a], IpAddr::V4(pod_ip(b)), Duration::from_millis(500)).expect("probe")
    };
    eventually(
        "p1 → p2 tcp admitted (p1 is in s:clients)",
        &daemons,
        || tcp(&pods, 1) == Verdict::Pass,
    );

    // n3 joins later; its pod is not a client: it reaches others, but not the server's port.
    let (p3, ns3) = join(&mut cluster, &mut ctl, &mut daemons, 3, "batch");
    pods.insert(3, ns3);
    flush(&mut ctl, &mut daemons);
    eventually("p3 ↔ p1 over the tunnel", &daemons, || {
        ping(&pods, 3, 1) == Verdict::Pass && ping(&pods, 1, 3) == Verdict::Pass
    });
    assert_eq!(ping(&pods, 2, 3), Verdict::Pass, "p2 → p3");
    assert_eq!(tcp(&pods, 3), Verdict::Drop, "p3 is not in s:clients");

    // p3 is relabelled a client on n3: n2's set gains it, and n2 admits it.
    let mut relabelled = p3.clone();
    relabelled.labels.insert("role".into(), "client".into());
    assert!(ctl.add_pod("n3", relabelled));
    flush(&mut ctl, &mut daemons);
    eventually("p3 → p2 tcp admitted after relabelling", &daemons, || {
        tcp(&pods, 3) == Verdict::Pass
    });

    // n3 leaves: withdrawn everywhere; its FDB entry goes from n1 and p1 no longer reaches p3.
    let mac3 = ctl.node("n3").expect("n3").vtep_mac.clone();
    assert!(ctl.remove_node("n3"));
    flush(&mut ctl, &mut daemons);
    let n1 = cluster.node("n1").expect("n1").netns_name().to_string();
    eventually("n3 gone from n1's FDB", &daemons, || {
        let out = Command::new("bridge")
            .args(["-n", &n1, "fdb", "show", "dev", "vxlan.calico"])
            .output()
            .expect("bridge (oracle)");
        let fdb = String::from_utf8_lossy(&out.stdout);
        !fdb.contains(&mac3) && fdb.contains("dst 172.31.0.12")
    });
    assert_ne!(ping(&pods, 1, 3), Verdict::Pass, "p1 → p3 after n3 left");
    assert_eq!(tcp(&pods, 1), Verdict::Pass, "p1 → p2 unaffected");

    for (n, d) in daemons.iter_mut() {
        assert!(
            d.child.try_wait().map(|s| s.is_none()).unwrap_or(false),
            "{n}'s daemon exited:\n{}",
            std::fs::read_to_string(d.log.path()).unwrap_or_default()
        );
    }
    drop(server);
    drop(daemons);
    drop(cluster);
}

/// `ip -s -j link show vxlan.calico` in `netns` (oracle): packets the device has sent.
fn vxlan_tx_packets(netns: &str) -> u64 {
    let out = Command::new("ip")
        .args(["-n", netns, "-s", "-j", "link", "show", "vxlan.calico"])
        .output()
        .expect("ip (oracle)");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v[0]["stats64"]["tx"]["packets"].as_u64().unwrap_or(0)
}

#[test]
fn cross_subnet_pools_go_direct_on_the_subnet_and_through_the_tunnel_across_the_router() {
    require_root();
    let mut cluster = build_cluster(ClusterSpec {
        prefix: "fnt-t-clxs".into(),
        routed: vec!["172.31.1.0/24".parse().expect("a subnet")],
        ..ClusterSpec::default()
    });
    let mut ctl = model();
    ctl.set_pool(
        "10.65.0.0-16",
        IpamPool {
            cidr: "10.65.0.0/16".into(),
            vxlan_mode: "CrossSubnet".into(),
            ..IpamPool::default()
        },
    );
    let mut daemons = BTreeMap::new();
    let mut pods = BTreeMap::new();
    pods.insert(1, join(&mut cluster, &mut ctl, &mut daemons, 1, "client").1);
    pods.insert(2, join(&mut cluster, &mut ctl, &mut daemons, 2, "batch").1);
    let far = Ipv4Addr::new(172, 31, 1, 13);
    pods.insert(
        3,
        join_at(&mut cluster, &mut ctl, &mut daemons, 3, "batch", far).1,
    );
    flush(&mut ctl, &mut daemons);
    let ping = |a: u8, b: u8| {
        icmp_echo(&pods[&a], IpAddr::V4(pod_ip(b)), Duration::from_millis(500)).expect("probe")
    };
    for (a, b) in [(1, 2), (2, 1), (1, 3), (3, 1), (2, 3)] {
        eventually(&format!("p{a} → p{b}"), &daemons, || {
            ping(a, b) == Verdict::Pass
        });
    }
    // On n1: n2's block straight via n2 on the shared subnet, n3's through the tunnel.
    let n1 = cluster.node("n1").expect("n1").netns_name().to_string();
    let routes = route_oracle::routes(&n1, &[]);
    assert!(
        routes
            .lines()
            .any(|l| l.starts_with("10.65.2.0/26 via 172.31.0.12 dev eth0") && l.contains("onlink")),
        "{routes}"
    );
    assert!(
        routes
            .lines()
            .any(|l| l.starts_with("10.65.3.0/26 via 10.65.3.0 dev vxlan.calico")),
        "{routes}"
    );
    // No VXLAN on the wire for the same-subnet peer; VXLAN for the one across the router.
    let before = vxlan_tx_packets(&n1);
    for _ in 0..5 {
        assert_eq!(ping(1, 2), Verdict::Pass);
    }
    assert_eq!(
        vxlan_tx_packets(&n1),
        before,
        "same-subnet traffic went into the tunnel"
    );
    for _ in 0..5 {
        assert_eq!(ping(1, 3), Verdict::Pass);
    }
    assert!(
        vxlan_tx_packets(&n1) >= before + 5,
        "cross-router traffic did not use the tunnel"
    );
    drop(pods);
    drop(daemons);
    drop(cluster);
}

/// A pool without encapsulation, with Felix (not BIRD) programming cluster routes
/// (`ProgramClusterRoutes=Enabled`): each node routes the others' blocks straight via their
/// node address on the underlay, `proto 80 onlink`; no VXLAN device is made; pods talk.
#[test]
fn noencap_pools_are_routed_via_the_nodes_when_felix_programs_cluster_routes() {
    require_root();
    let mut cluster = build_cluster(ClusterSpec {
        prefix: "fnt-t-clne".into(),
        ..ClusterSpec::default()
    });
    let mut ctl = model();
    ctl.set_pool(
        "10.65.0.0-16",
        IpamPool {
            cidr: "10.65.0.0/16".into(),
            ..IpamPool::default()
        },
    );
    let env = [("FELIX_PROGRAMCLUSTERROUTES", "Enabled")];
    let mut daemons = BTreeMap::new();
    let mut pods = BTreeMap::new();
    for (k, role) in [(1, "client"), (2, "batch")] {
        let ip = Ipv4Addr::new(172, 31, 0, 10 + k);
        let (_, ns) = join_with(&mut cluster, &mut ctl, &mut daemons, k, role, ip, &env);
        pods.insert(k, ns);
    }
    flush(&mut ctl, &mut daemons);
    let ping = |a: u8, b: u8| {
        icmp_echo(&pods[&a], IpAddr::V4(pod_ip(b)), Duration::from_millis(500)).expect("probe")
    };
    for (a, b) in [(1, 2), (2, 1)] {
        eventually(
            &format!("p{a} → p{b} without encapsulation"),
            &daemons,
            || ping(a, b) == Verdict::Pass,
        );
    }
    let n1 = cluster.node("n1").expect("n1").netns_name().to_string();
    let show = |args: &[&str]| {
        let out = Command::new("ip")
            .args(["-n", &n1])
            .args(args)
            .output()
            .expect("ip (oracle)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let routes = route_oracle::routes(&n1, &[]);
    assert!(
        routes.lines().any(
            |l| l.starts_with("10.65.2.0/26 via 172.31.0.12 dev eth0 proto 80")
                && l.contains("onlink")
        ),
        "{routes}"
    );
    assert!(
        !show(&["link", "show"]).contains("vxlan.calico"),
        "no tunnel for a pool without encapsulation"
    );
    drop(pods);
    drop(daemons);
    drop(cluster);
}
