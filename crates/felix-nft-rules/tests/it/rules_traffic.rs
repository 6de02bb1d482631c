//! Real packets through a rendered ruleset: the §18 worked example, loaded with `nft -f` into a
//! private "host" namespace with workload namespaces joined by `cali…` veths the way a CNI plugin
//! makes them. TCP to the allowed port passes, to another port it is dropped at the end of the
//! tier, a `cali…` interface with no endpoint passes nothing (fail-closed dispatch), an
//! admin-down endpoint passes nothing, and the profiles let the reverse direction through.
//!
//! The same flows are then measured with the workloads spread over the main and the side table
//! in every way the daemon can place them: the verdicts must not change.
//!
//! Every namespace is made by the test: the host one by `common::in_private_netns`, the
//! workload ones by `unshare -n sleep` children that the test kills when done.

use testkit as common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use felix_api::types::{
    protocol::NumberOrName, Policy, PolicyId, PortRange, Protocol, Rule, TierInfo,
    WorkloadEndpoint, WorkloadEndpointId,
};
use felix_nft_rules::{render_nft, render_text_placed, Model, RulesConfig};
use rtnl::netns::NetNs;

/// Runs a command (in the calling thread's namespace) and fails the test if it fails.
fn run(args: &[&str]) {
    common::oracle_stdout(Command::new(args[0]).args(&args[1..]), &format!("{args:?}"));
}

/// Runs a command line (words split on white space) like [`run`].
fn sh(line: &str) {
    run(&line.split_whitespace().collect::<Vec<_>>());
}

/// A workload namespace held by an `unshare -n sleep` child; killed on drop (also on panic).
struct Pod {
    child: Child,
}

impl Pod {
    fn new() -> Pod {
        let mine = std::fs::read_link("/proc/thread-self/ns/net").expect("reading own netns");
        let child = Command::new("unshare")
            .args(["-n", "sleep", "300"])
            .spawn()
            .expect("spawning unshare -n sleep");
        let pod = Pod { child };
        // Wait until the child has its own namespace.
        let deadline = Instant::now() + testkit::patient(Duration::from_secs(5));
        loop {
            let theirs = std::fs::read_link(format!("/proc/{}/ns/net", pod.pid()));
            if matches!(&theirs, Ok(t) if *t != mine) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "workload namespace did not appear"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        pod
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn ns(&self) -> NetNs {
        NetNs::open(&format!("/proc/{}/ns/net", self.pid())).expect("opening pod netns")
    }

    /// Runs a command line (words split on white space) inside the pod's namespace.
    fn sh(&self, line: &str) {
        sh(&format!("nsenter -t {} -n {line}", self.pid()));
    }

    /// Wires the pod like a CNI plugin: host side `iface` (MAC ee:…), pod side `eth0` with `ip`
    /// /32, default route via 169.254.1.1, static neighbours both ways, host route to `ip`.
    fn wire(&self, iface: &str, ip: &str, pod_mac: &str) {
        let pid = self.pid();
        sh(&format!(
            "ip link add {iface} address ee:ee:ee:ee:ee:ee type veth \
             peer name eth0 address {pod_mac} netns {pid}"
        ));
        sh(&format!("ip link set {iface} up"));
        sh(&format!("ip route add {ip}/32 dev {iface}"));
        sh(&format!(
            "ip neigh replace {ip} lladdr {pod_mac} dev {iface} nud permanent"
        ));
        self.sh("ip link set lo up");
        self.sh("ip link set eth0 up");
        self.sh(&format!("ip addr add {ip}/32 dev eth0"));
        self.sh("ip route add 169.254.1.1 dev eth0");
        self.sh("ip route add default via 169.254.1.1 dev eth0");
        self.sh("ip neigh replace 169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev eth0 nud permanent");
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tcp() -> Option<Protocol> {
    Some(Protocol {
        number_or_name: Some(NumberOrName::Name("tcp".into())),
    })
}

/// §18: workload `cali-a` (10.65.0.2) admits only TCP 80 through policy `allow-tcp-80`; workload
/// `cali-b` (10.65.0.3) only has the allow-all profile. `cali-c` is not an endpoint; `cali-d`
/// is an admin-down endpoint.
fn model() -> Model {
    let mut m = Model::new(RulesConfig {
        ipv6_enabled: false,
        ..RulesConfig::default()
    });
    let id = PolicyId {
        name: "allow-tcp-80".into(),
        namespace: String::new(),
        kind: "GlobalNetworkPolicy".into(),
    };
    m.policies.insert(
        id.clone(),
        Policy {
            inbound_rules: vec![Rule {
                action: "allow".into(),
                protocol: tcp(),
                dst_ports: vec![PortRange {
                    first: 80,
                    last: 80,
                }],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    m.profiles
        .insert("kns.default".into(), crate::allow_all_profile());
    for (name, ip, tiers) in [
        (
            "cali-a",
            "10.65.0.2/32",
            vec![TierInfo {
                name: "default".into(),
                ingress_policies: vec![id.clone()],
                ..Default::default()
            }],
        ),
        ("cali-b", "10.65.0.3/32", vec![]),
        ("cali-d", "10.65.0.5/32", vec![]),
    ] {
        m.workloads.insert(
            WorkloadEndpointId {
                orchestrator_id: "k8s".into(),
                workload_id: format!("default/{name}"),
                endpoint_id: "eth0".into(),
            },
            WorkloadEndpoint {
                // cali-d is administratively down: its chains are a single deny.
                state: if name == "cali-d" { "down" } else { "active" }.into(),
                name: name.into(),
                profile_ids: vec!["kns.default".into()],
                ipv4_nets: vec![ip.into()],
                tiers,
                ..Default::default()
            },
        );
    }
    m
}

/// Tries a TCP connection from inside `from`'s namespace.
fn connects(from: &Pod, to: SocketAddr) -> bool {
    let ns = from.ns();
    std::thread::spawn(move || {
        let _in = ns.enter().expect("entering client netns");
        TcpStream::connect_timeout(&to, Duration::from_millis(1500)).is_ok()
    })
    .join()
    .expect("client thread")
}

/// The ruleset with the workloads in `side` living in the side table and those in `lingering`
/// in both tables (a half-done merge), as `nft -f` text.
fn placed(side: &[&str], lingering: &[&str]) -> String {
    let set = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    render_text_placed(&model(), &set(side), &set(lingering))
        .unwrap()
        .iter()
        .map(|t| t.to_nft())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn worked_example_passes_port_80_only_and_unknown_interfaces_nothing() {
    let text = render_nft(&model()).unwrap();
    assert!(
        text.contains("table ip calico-side"),
        "the side table is on by default"
    );
    // Every placement of the three endpoints the daemon can produce: each alone in the side
    // table, all of them, a half-done merge.
    let placements: Vec<(String, String)> = vec![
        ("all in main".into(), text),
        ("A in side".into(), placed(&["cali-a"], &[])),
        ("B in side".into(), placed(&["cali-b"], &[])),
        ("D in side".into(), placed(&["cali-d"], &[])),
        (
            "all in side".into(),
            placed(&["cali-a", "cali-b", "cali-d"], &[]),
        ),
        (
            "A lingering, B in side".into(),
            placed(&["cali-b"], &["cali-a", "cali-d"]),
        ),
    ];
    common::in_private_netns(move || {
        // This thread's namespace is the test's own "host": nothing here touches the real host.
        run(&["ip", "link", "set", "lo", "up"]);
        run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let a = Pod::new();
        let b = Pod::new();
        let c = Pod::new();
        a.wire("cali-a", "10.65.0.2", "02:00:00:00:00:0a");
        b.wire("cali-b", "10.65.0.3", "02:00:00:00:00:0b");
        c.wire("cali-c", "10.65.0.4", "02:00:00:00:00:0c");
        let d = Pod::new();
        d.wire("cali-d", "10.65.0.5", "02:00:00:00:00:0d");

        // A listener in workload B, for the reverse direction.
        let b_server = {
            let ns = b.ns();
            std::thread::spawn(move || {
                let _in = ns.enter().expect("entering B netns");
                let l = TcpListener::bind(("10.65.0.3", 8080)).expect("bind");
                l.set_nonblocking(true).expect("nonblocking");
                l
            })
            .join()
            .expect("B listener")
        };

        // Listeners on 80 and 81 in workload A.
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let server = {
            let ns = a.ns();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let _in = ns.enter().expect("entering server netns");
                let listeners: Vec<TcpListener> = [80, 81]
                    .iter()
                    .map(|p| {
                        let l = TcpListener::bind(("10.65.0.2", *p)).expect("bind");
                        l.set_nonblocking(true).expect("nonblocking");
                        l
                    })
                    .collect();
                ready_tx.send(()).expect("ready");
                while !stop.load(Ordering::Relaxed) {
                    for l in &listeners {
                        let _ = l.accept();
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        ready_rx
            .recv_timeout(testkit::patient(Duration::from_secs(5)))
            .expect("server ready");

        let p80: SocketAddr = "10.65.0.2:80".parse().unwrap();
        let p81: SocketAddr = "10.65.0.2:81".parse().unwrap();
        // Without our rules the network itself works (so a failure below is the policy's).
        assert!(
            connects(&b, p81),
            "topology: B cannot reach A:81 with no ruleset"
        );
        assert!(
            connects(&c, p80),
            "topology: C cannot reach A:80 with no ruleset"
        );
        assert!(
            connects(&d, p80),
            "topology: D cannot reach A:80 with no ruleset"
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ruleset.nft");
        let b8080: SocketAddr = "10.65.0.3:8080".parse().unwrap();
        for (label, text) in &placements {
            // The test's own namespace: flushing it touches nothing else.
            run(&["nft", "flush", "ruleset"]);
            std::fs::write(&path, text).expect("writing ruleset");
            run(&["nft", "-f", path.to_str().unwrap_or_default()]);

            assert!(
                connects(&b, p80),
                "{label}: policy allows TCP 80 from B to A"
            );
            assert!(
                !connects(&b, p81),
                "{label}: end of tier drops TCP 81 from B to A"
            );
            assert!(
                !connects(&c, p80),
                "{label}: cali-c has no endpoint: dispatch must drop"
            );
            assert!(
                !connects(&d, p80),
                "{label}: cali-d is admin down: its egress chain drops"
            );
            assert!(
                connects(&a, b8080),
                "{label}: profiles allow A to B in both chains"
            );
        }
        drop(b_server);

        stop.store(true, Ordering::Relaxed);
        server.join().expect("server thread");
    });
}
