//! The probes tell pass from drop from refused, with real packets through a test bed whose host
//! namespace the test programs itself with `rtnl` functions, the way felix-nft will (reference
//! §14–15: a scope-link route per workload address on its `cali` interface, proxy ARP with
//! proxy_delay 0, forwarding). Then an `nft` drop rule loaded by the test in the host namespace
//! (test-only oracle use) turns exactly the flows it matches into quick `Drop` verdicts, and a
//! long-lived TCP flow stalls under the rule and resumes once it is gone.

use crate::testbed_common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use felix_nft_lab::testbed::probe::{
    icmp_echo, run_matrix, tcp_connect, Flow, LongFlow, Proto, TcpServer, UdpEchoServer, Verdict,
    DEFAULT_TIMEOUT,
};
use felix_nft_lab::testbed::topology::{ExternalSpec, Topology, TopologySpec, WorkloadSpec};
use rtnl::netns::NetNs;
use testbed_common::{block_on, nft_in, patient, program_host, require_root};

const A4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const A6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2);
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;

fn build() -> Topology {
    block_on(Topology::build(&TopologySpec {
        prefix: "fnt-t-traffic".into(),
        workloads: vec![
            WorkloadSpec::dual("a", A4, A6),
            WorkloadSpec::dual("b", B4, B6),
        ],
        external: Some(ExternalSpec {
            routes_to_workloads: true,
            ipv6: true,
        }),
    }))
    .unwrap()
}

fn flow<'a>(
    from: &str,
    ns: &'a NetNs,
    to: &str,
    dst: impl Into<IpAddr>,
    proto: Proto,
    port: u16,
    expect: Verdict,
) -> Flow<'a> {
    Flow {
        from: from.into(),
        ns,
        to: to.into(),
        dst: dst.into(),
        proto,
        port,
        expect,
    }
}

#[test]
fn probes_tell_pass_from_refused_from_drop() {
    require_root();
    let topo = build();
    program_host(&topo);
    let a = topo.workload("a").unwrap();
    let b = topo.workload("b").unwrap();
    let ext = topo.external().unwrap();
    let ext4 = ext.ipv4;
    let ext6 = ext.ipv6.unwrap();

    let _servers = [a.ns(), b.ns(), ext.ns()].map(|ns| {
        (
            TcpServer::start(ns, TCP_PORT).unwrap(),
            UdpEchoServer::start(ns, UDP_PORT).unwrap(),
        )
    });
    let (an, bn, en) = (a.ns(), b.ns(), ext.ns());
    use Proto::*;
    use Verdict::*;

    // 1. Everything routed, nothing filtered.
    let open = vec![
        flow("a", an, "b", B4, Tcp, TCP_PORT, Pass),
        flow("a", an, "b", B4, Udp, UDP_PORT, Pass),
        flow("a", an, "b", B4, Icmp, 0, Pass),
        flow("a", an, "b", B4, Tcp, TCP_PORT + 1, Refused),
        flow("a", an, "b", B4, Udp, UDP_PORT + 1, Refused),
        flow("b", bn, "a", A4, Tcp, TCP_PORT, Pass),
        flow("b", bn, "a", A4, Icmp, 0, Pass),
        flow("a", an, "ext", ext4, Tcp, TCP_PORT, Pass),
        flow("a", an, "ext", ext4, Udp, UDP_PORT, Pass),
        flow("a", an, "ext", ext4, Icmp, 0, Pass),
        flow("ext", en, "a", A4, Tcp, TCP_PORT, Pass),
        flow("a", an, "b", B6, Tcp, TCP_PORT, Pass),
        flow("a", an, "b", B6, Udp, UDP_PORT, Pass),
        flow("a", an, "b", B6, Icmp, 0, Pass),
        flow("a", an, "b", B6, Tcp, TCP_PORT + 1, Refused),
        flow("a", an, "ext", ext6, Tcp, TCP_PORT, Pass),
        flow("a", an, "ext", ext6, Icmp, 0, Pass),
    ];
    // The first packets of a path wait for neighbour discovery on both hops (IPv6 especially,
    // on a loaded machine): the open network gets a few seconds to converge before it is judged.
    let t0 = Instant::now();
    let report = loop {
        let r = run_matrix(&open, DEFAULT_TIMEOUT);
        if r.all_match() || t0.elapsed() > patient(Duration::from_secs(5)) {
            break r;
        }
    };
    println!("{report}");
    assert!(report.all_match(), "open network:\n{report}");

    // The external side saw the workload's own address (no NAT anywhere yet).
    let ext_tcp_peers = _servers[2]
        .0
        .wait_peers_from(&[IpAddr::V4(A4)], DEFAULT_TIMEOUT);
    assert!(
        ext_tcp_peers.iter().any(|p| p.ip() == IpAddr::V4(A4)),
        "{ext_tcp_peers:?}"
    );

    // A long-lived flow, opened while the path is open.
    let mut long =
        LongFlow::open(an, SocketAddr::new(B4.into(), TCP_PORT), DEFAULT_TIMEOUT).unwrap();
    assert_eq!(long.check(DEFAULT_TIMEOUT).unwrap(), Pass);

    // 2. A drop rule in the host's forward hook for traffic to b (test-only oracle).
    nft_in(
        topo.host_netns_name(),
        &format!(
            "table inet testbed_oracle {{
               chain oracle_forward {{
                 type filter hook forward priority 0; policy accept;
                 ip daddr {B4} tcp dport {TCP_PORT} drop
                 ip daddr {B4} udp dport {UDP_PORT} drop
                 ip daddr {B4} icmp type echo-request drop
                 ip6 daddr {B6} tcp dport {TCP_PORT} drop
               }}
             }}"
        ),
    );
    let filtered = vec![
        flow("a", an, "b", B4, Tcp, TCP_PORT, Drop),
        flow("a", an, "b", B4, Udp, UDP_PORT, Drop),
        flow("a", an, "b", B4, Icmp, 0, Drop),
        flow("a", an, "b", B6, Tcp, TCP_PORT, Drop),
        // Not matched by the rule: still answered.
        flow("a", an, "b", B4, Tcp, TCP_PORT + 1, Refused),
        flow("a", an, "b", B6, Icmp, 0, Pass),
        flow("b", bn, "a", A4, Tcp, TCP_PORT, Pass),
        flow("a", an, "ext", ext4, Tcp, TCP_PORT, Pass),
    ];
    let report = run_matrix(&filtered, DEFAULT_TIMEOUT);
    println!("{report}");
    assert!(report.all_match(), "with drop rule:\n{report}");
    assert!(
        report.elapsed < patient(Duration::from_millis(1500)),
        "a matrix with drops should take about one timeout, took {:?}",
        report.elapsed
    );
    // A single dropped probe reports Drop within its timeout, not the kernel's seconds.
    let t = Instant::now();
    assert_eq!(
        tcp_connect(an, SocketAddr::new(B4.into(), TCP_PORT), DEFAULT_TIMEOUT).unwrap(),
        Drop
    );
    assert!(
        t.elapsed() < DEFAULT_TIMEOUT + patient(Duration::from_millis(200)),
        "{:?}",
        t.elapsed()
    );
    // The established flow is cut by the same rule (it matches every packet to the port)...
    assert_eq!(long.check(DEFAULT_TIMEOUT).unwrap(), Drop);

    // 3. Rule gone: fresh flows pass again, and the long-lived one resumes (TCP retransmits).
    nft_in(topo.host_netns_name(), "delete table inet testbed_oracle");
    assert_eq!(long.check(patient(Duration::from_secs(5))).unwrap(), Pass);
    assert_eq!(icmp_echo(an, B4.into(), DEFAULT_TIMEOUT).unwrap(), Pass);
    let report = run_matrix(&open, DEFAULT_TIMEOUT);
    assert!(report.all_match(), "after removing the rule:\n{report}");
}

#[test]
fn without_host_programming_nothing_passes() {
    // The bed alone is not a working network: felix-nft's routes/proxy ARP are what make it one.
    require_root();
    let topo = build();
    let a = topo.workload("a").unwrap();
    let b = topo.workload("b").unwrap();
    let _srv = TcpServer::start(b.ns(), TCP_PORT).unwrap();
    let v = tcp_connect(
        a.ns(),
        SocketAddr::new(B4.into(), TCP_PORT),
        DEFAULT_TIMEOUT,
    )
    .unwrap();
    assert_ne!(v, Verdict::Pass);
    assert!(_srv.peers().is_empty());
}
