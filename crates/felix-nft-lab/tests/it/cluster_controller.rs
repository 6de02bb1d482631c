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
//! [`testbed::cluster`]: felix_nft_lab::testbed::cluster
//! [`testbed::controller`]: felix_nft_lab::testbed::controller

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::route_oracle;
use crate::testbed_common;

use felix_api::protocol::NumberOrName;
use felix_api::{Policy, PolicyId, PortRange, Profile, Protocol, Rule, TierInfo};
use felix_nft_lab::testbed::cluster::{Cluster, ClusterSpec, NodeSpec};
use felix_nft_lab::testbed::controller::{
    global_policy_id, Controller, IpSetSource, NodeInfo, PodInfo,
};
use felix_nft_lab::testbed::probe::{icmp_echo, tcp_connect, TcpServer, Verdict};
use felix_nft_lab::testbed::topology::WorkloadSpec;
use rtnl::netns::NetNs;
use testbed_common::{block_on, patient, require_root, NodeDaemon};

const PORT: u16 = 8080;

/// Builds the underlay of `spec`, or fails saying why.
fn build_cluster(spec: ClusterSpec) -> Cluster {
    block_on(Cluster::build(&spec))
        .expect("building the underlay (this privileged test needs root)")
}

fn pod_ip(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 65, k, 2)
}

fn clients() -> PolicyId {
    global_policy_id("allow-clients")
}

/// The pool 10.65.0.0/16 in `vxlan_mode`, the allow-all profile every pod has, the IP set of
/// `role=client` pods and the policy admitting them to tcp/[`PORT`].
fn model(vxlan_mode: &str) -> Controller {
    let mut c = Controller::new();
    c.set_ipv4_pool("10.65.0.0/16".parse().expect("a CIDR"), vxlan_mode);
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

/// One test's cluster: the underlay, the controller's model, a daemon per node and each node's
/// pod namespace by node number. Dropped in that order from the pods on: daemons stop before
/// their namespaces go.
struct Bed {
    pods: BTreeMap<u8, NetNs>,
    daemons: BTreeMap<String, NodeDaemon>,
    ctl: Controller,
    cluster: Cluster,
}

impl Bed {
    /// The underlay named `prefix` with the extra `routed` segments (as root), the [`model`]
    /// with its pool in `vxlan_mode`, and no nodes yet.
    fn start(prefix: &str, routed: &[&str], vxlan_mode: &str) -> Bed {
        require_root();
        let spec = ClusterSpec {
            prefix: prefix.into(),
            routed: routed
                .iter()
                .map(|r| r.parse().expect("a subnet"))
                .collect(),
            ..ClusterSpec::default()
        };
        Bed {
            cluster: build_cluster(spec),
            ctl: model(vxlan_mode),
            daemons: BTreeMap::new(),
            pods: BTreeMap::new(),
        }
    }

    /// [`Bed::join_at`] on the bed's own segment, without extra environment.
    fn join(&mut self, k: u8, role: &str) -> PodInfo {
        self.join_at(k, role, Ipv4Addr::new(172, 31, 0, 10 + k), &[])
    }

    /// Builds node `k` at underlay address `ip` with one pod, registers both with the
    /// controller, starts its daemon with extra environment `env`.
    fn join_at(&mut self, k: u8, role: &str, ip: Ipv4Addr, env: &[(&str, &str)]) -> PodInfo {
        let name = format!("n{k}");
        let node = block_on(self.cluster.add_node(&NodeSpec {
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
        self.ctl.add_node(NodeInfo::new(
            &name,
            ip,
            24,
            format!("10.65.{k}.0/26").parse().expect("a block"),
        ));
        assert!(self.ctl.add_pod(&name, pod.clone()));
        self.daemons
            .insert(name.clone(), NodeDaemon::start(&netns, &name, env));
        self.pods.insert(k, pod_ns);
        pod
    }

    /// Sends each daemon what the controller computed for its node.
    fn flush(&mut self) {
        for (node, msgs) in self.ctl.flush() {
            if let Some(d) = self.daemons.get_mut(&node) {
                d.send(&msgs);
            }
        }
    }

    /// Polls `check` for up to 20 s ([`patient`]); fails with every daemon's log.
    fn eventually(&self, what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + patient(Duration::from_secs(20));
        while !check() {
            if Instant::now() > deadline {
                let logs: String = self
                    .daemons
                    .iter()
                    .map(|(n, d)| format!("--- {n}\n{}", d.log()))
                    .collect();
                panic!("{what} did not happen\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// An ICMP echo from pod `a` to pod `b`.
    fn ping(&self, a: u8, b: u8) -> Verdict {
        icmp_echo(
            &self.pods[&a],
            IpAddr::V4(pod_ip(b)),
            Duration::from_millis(500),
        )
        .expect("probe")
    }

    /// The name of node `name`'s namespace.
    fn netns_of(&self, name: &str) -> String {
        self.cluster
            .node(name)
            .expect("a node")
            .netns_name()
            .to_string()
    }
}

#[test]
fn controller_messages_carry_a_cluster_through_felix_nft_processes() {
    let mut bed = Bed::start("fnt-t-clctl", &[], "Always");
    bed.join(1, "client");
    bed.join(2, "server");
    bed.flush();
    let server = TcpServer::start(&bed.pods[&2], PORT).expect("a listener");
    let to_server = SocketAddr::new(IpAddr::V4(pod_ip(2)), server.port());
    let tcp = |bed: &Bed, k: u8| {
        tcp_connect(&bed.pods[&k], to_server, Duration::from_millis(500)).expect("probe")
    };
    bed.eventually("p1 → p2 tcp admitted (p1 is in s:clients)", || {
        tcp(&bed, 1) == Verdict::Pass
    });

    // n3 joins later; its pod is not a client: it reaches others, but not the server's port.
    let p3 = bed.join(3, "batch");
    bed.flush();
    bed.eventually("p3 ↔ p1 over the tunnel", || {
        bed.ping(3, 1) == Verdict::Pass && bed.ping(1, 3) == Verdict::Pass
    });
    assert_eq!(bed.ping(2, 3), Verdict::Pass, "p2 → p3");
    assert_eq!(tcp(&bed, 3), Verdict::Drop, "p3 is not in s:clients");

    // p3 is relabelled a client on n3: n2's set gains it, and n2 admits it.
    let mut relabelled = p3.clone();
    relabelled.labels.insert("role".into(), "client".into());
    assert!(bed.ctl.add_pod("n3", relabelled));
    bed.flush();
    bed.eventually("p3 → p2 tcp admitted after relabelling", || {
        tcp(&bed, 3) == Verdict::Pass
    });

    // n3 leaves: withdrawn everywhere; its FDB entry goes from n1 and p1 no longer reaches p3.
    let mac3 = bed.ctl.node("n3").expect("n3").vtep_mac.clone();
    assert!(bed.ctl.remove_node("n3"));
    bed.flush();
    let n1 = bed.netns_of("n1");
    bed.eventually("n3 gone from n1's FDB", || {
        let out = Command::new("bridge")
            .args(["-n", &n1, "fdb", "show", "dev", "vxlan.calico"])
            .output()
            .expect("bridge (oracle)");
        let fdb = String::from_utf8_lossy(&out.stdout);
        !fdb.contains(&mac3) && fdb.contains("dst 172.31.0.12")
    });
    assert_ne!(bed.ping(1, 3), Verdict::Pass, "p1 → p3 after n3 left");
    assert_eq!(tcp(&bed, 1), Verdict::Pass, "p1 → p2 unaffected");

    for (n, d) in bed.daemons.iter_mut() {
        assert!(
            d.child.try_wait().map(|s| s.is_none()).unwrap_or(false),
            "{n}'s daemon exited:\n{}",
            d.log()
        );
    }
    drop(server);
    drop(bed);
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
    let mut bed = Bed::start("fnt-t-clxs", &["172.31.1.0/24"], "CrossSubnet");
    bed.join(1, "client");
    bed.join(2, "batch");
    bed.join_at(3, "batch", Ipv4Addr::new(172, 31, 1, 13), &[]);
    bed.flush();
    for (a, b) in [(1, 2), (2, 1), (1, 3), (3, 1), (2, 3)] {
        bed.eventually(&format!("p{a} → p{b}"), || {
            bed.ping(a, b) == Verdict::Pass
        });
    }
    // On n1: n2's block straight via n2 on the shared subnet, n3's through the tunnel.
    let n1 = bed.netns_of("n1");
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
        assert_eq!(bed.ping(1, 2), Verdict::Pass);
    }
    assert_eq!(
        vxlan_tx_packets(&n1),
        before,
        "same-subnet traffic went into the tunnel"
    );
    for _ in 0..5 {
        assert_eq!(bed.ping(1, 3), Verdict::Pass);
    }
    assert!(
        vxlan_tx_packets(&n1) >= before + 5,
        "cross-router traffic did not use the tunnel"
    );
    drop(bed);
}

/// A pool without encapsulation, with Felix (not BIRD) programming cluster routes
/// (`ProgramClusterRoutes=Enabled`): each node routes the others' blocks straight via their
/// node address on the underlay, `proto 80 onlink`; no VXLAN device is made; pods talk.
#[test]
fn noencap_pools_are_routed_via_the_nodes_when_felix_programs_cluster_routes() {
    let mut bed = Bed::start("fnt-t-clne", &[], "");
    let env = [("FELIX_PROGRAMCLUSTERROUTES", "Enabled")];
    for (k, role) in [(1, "client"), (2, "batch")] {
        bed.join_at(k, role, Ipv4Addr::new(172, 31, 0, 10 + k), &env);
    }
    bed.flush();
    for (a, b) in [(1, 2), (2, 1)] {
        bed.eventually(&format!("p{a} → p{b} without encapsulation"), || {
            bed.ping(a, b) == Verdict::Pass
        });
    }
    let n1 = bed.netns_of("n1");
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
    drop(bed);
}
