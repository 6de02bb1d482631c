//! No external binaries: the daemon runs a whole scenario — start, InSync,
//! rules + routes + static ARP + sysctls programmed, a policy change, an IP set delta, an
//! endpoint removal, exit — under `strace -f` (a test tool), and the trace holds exactly one
//! execve (the daemon binary's own start) and no fork/clone that makes a process. Felix execs
//! `iptables-restore`, `ipset`, `conntrack` and friends (§21); felix-nft must not.

use crate::e2e_common;

use std::net::Ipv4Addr;

use e2e_common::*;
use felix_nft_lab::testbed::probe::{Proto::*, TcpServer, UdpEchoServer, Verdict::*};
use felix_nft_lab::testbed::topology::WorkloadSpec;
use serde_json::json;

#[test]
fn daemon_executes_no_program_through_a_whole_scenario() {
    require_root();
    let workloads = vec![
        WorkloadSpec::v4("a", Ipv4Addr::new(198, 18, 0, 1)),
        WorkloadSpec::v4("b", Ipv4Addr::new(198, 18, 0, 2)),
    ];
    let topo = bed("fnt-e2e-noexec", workloads, UPSTREAM_V4);
    let (a, b) = (topo.workload("a").unwrap(), topo.workload("b").unwrap());
    let _tcp = TcpServer::start(b.ns(), 8080).unwrap();
    let _udp = UdpEchoServer::start(b.ns(), 5353).unwrap();
    let trace = tempfile::NamedTempFile::new().unwrap();
    let mut agent = Agent::start(
        &topo,
        AgentOptions {
            strace_to: Some(trace.path().to_path_buf()),
            ..Default::default()
        },
    );

    // Allow-all, then an IP-set-based ingress policy, then a delta, then a removal: every manager
    // (IP sets, policy, endpoints, routes, neighbours, sysctls) does kernel work.
    agent.send_allow_all(&[a, b]);
    agent.expect_matrix(
        "allow-all",
        &[
            flow(src(a), v4(b), Tcp, 8080, Pass),
            flow(src(a), v4(b), Udp, 5353, Pass),
        ],
    );
    agent.send_all(&[
        ipset("s:clients", "IP", &[]),
        ingress_policy(
            "b-in",
            json!([{"action": "allow", "src_ip_set_ids": ["s:clients"]}]),
        ),
        wep_ingress(b, &["b-in"]),
    ]);
    agent.expect_matrix("empty client set", &[flow(src(a), v4(b), Tcp, 8080, Drop)]);
    let a_ip = a.ipv4.unwrap().to_string();
    agent.send(&ipset_delta("s:clients", &[a_ip], &[]));
    agent.expect_matrix("a joins the set", &[flow(src(a), v4(b), Tcp, 8080, Pass)]);
    agent.send(&wep_remove(a));
    agent.expect_matrix("a removed", &[flow(src(a), v4(b), Tcp, 8080, Drop)]);

    // End of stdin: the daemon finishes what it was told and exits, and strace with it.
    let (status, log) = agent.stop();
    assert!(status.success(), "felix-nft under strace: {status}\n{log}");
    let text = std::fs::read_to_string(trace.path()).unwrap();
    let execs: Vec<&str> = text.lines().filter(|l| l.contains("execve(")).collect();
    let bin = env!("CARGO_BIN_EXE_felix-nft-lab");
    assert_eq!(
        execs.len(),
        1,
        "felix-nft executed programs (strace -f -e trace=execve):\n{}",
        execs.join("\n")
    );
    assert!(
        execs[0].contains(bin) && execs[0].contains("= 0"),
        "the only execve should be the daemon's own start: {}",
        execs[0]
    );
    // The trace did follow the daemon's threads (tokio workers, namespace helpers), and none of
    // its clones made a process (a fork or posix_spawn's CLONE_VFORK would lack CLONE_THREAD).
    let clones: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("clone(") || l.contains("clone3(") || l.contains("fork("))
        .collect();
    assert!(
        clones.iter().any(|l| l.contains("CLONE_THREAD")),
        "strace saw no thread of the daemon:\n{text}"
    );
    let processes: Vec<&&str> = clones
        .iter()
        .filter(|l| !l.contains("CLONE_THREAD"))
        .collect();
    assert!(
        processes.is_empty(),
        "felix-nft made child processes:\n{processes:?}"
    );
}
