//! The test bed runs no external program (what `felix-nft demo` promises): a whole cycle —
//! named namespaces, veths, addresses, routes, host programming through `rtnl`, listeners,
//! a TCP/UDP/ICMP matrix, teardown — is run again under `strace -f -e trace=execve` (test tool
//! only), and the trace must hold exactly one execve: the test binary's own start.

use crate::testbed_common;

use std::net::Ipv4Addr;
use std::process::Command;

use felix_nft_lab::testbed::probe::{
    run_matrix, Flow, Proto, TcpServer, UdpEchoServer, Verdict, DEFAULT_TIMEOUT,
};
use felix_nft_lab::testbed::topology::{ExternalSpec, Topology, TopologySpec, WorkloadSpec};
use testbed_common::{block_on, program_host, require_root};

/// A full bed cycle with no oracle calls at all. Also a test by itself.
#[test]
fn bed_cycle() {
    require_root();
    let topo = block_on(Topology::build(&TopologySpec {
        prefix: "fnt-t-noexec".into(),
        workloads: vec![
            WorkloadSpec::v4("a", Ipv4Addr::new(198, 18, 0, 1)),
            WorkloadSpec::v4("b", Ipv4Addr::new(198, 18, 0, 2)),
        ],
        external: Some(ExternalSpec {
            routes_to_workloads: true,
            ipv6: false,
        }),
    }))
    .unwrap();
    program_host(&topo);
    let a = topo.workload("a").unwrap();
    let b = topo.workload("b").unwrap();
    let _tcp = TcpServer::start(b.ns(), 80).unwrap();
    let _udp = UdpEchoServer::start(b.ns(), 53).unwrap();
    let flows: Vec<Flow> = [
        (Proto::Tcp, 80, Verdict::Pass),
        (Proto::Udp, 53, Verdict::Pass),
        (Proto::Icmp, 0, Verdict::Pass),
        (Proto::Tcp, 81, Verdict::Refused),
    ]
    .into_iter()
    .map(|(proto, port, expect)| Flow {
        from: "a".into(),
        ns: a.ns(),
        to: "b".into(),
        dst: b.ipv4.unwrap().into(),
        proto,
        port,
        expect,
    })
    .collect();
    let report = run_matrix(&flows, DEFAULT_TIMEOUT);
    assert!(report.all_match(), "{report}");
}

#[test]
fn bed_cycle_executes_no_program() {
    require_root();
    let trace = tempfile::NamedTempFile::new().unwrap();
    let me = std::env::current_exe().unwrap();
    let out = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=execve", "-o"])
        .arg(trace.path())
        .arg(&me)
        .args(["--exact", "testbed_noexec::bed_cycle", "--test-threads=1"])
        .output()
        .expect("running strace (test tool)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "bed_cycle under strace failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(trace.path()).unwrap();
    let execs: Vec<&str> = text.lines().filter(|l| l.contains("execve(")).collect();
    assert_eq!(
        execs.len(),
        1,
        "the bed executed programs:\n{}",
        execs.join("\n")
    );
    assert!(
        execs[0].contains(&*me.to_string_lossy()),
        "the only execve should be the test binary itself: {}",
        execs[0]
    );
}
