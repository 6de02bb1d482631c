//! Flow logs' rules through the running agent, with real traffic. With `FlowLogsLocalReporter`
//! enabled, a connection a profile allows is logged once on each side (the source's egress,
//! group 2, and the destination's ingress, group 1, each with Felix's prefix), however many
//! packets it carries: only a connection's first packet reaches policy. A profile's deny logs
//! its rule; a port no rule of the profile matches logs the drop after the profiles. An
//! `NflogSocket` in the host namespace reads what the kernel logs.

mod e2e_common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use e2e_common::*;
use felix_nft::netns::NetNs;
use felix_nft::rtnl::nflog::{FiveTuple, LoggedPacket, NflogSocket};
use felix_nft::testbed::probe::{Proto::*, Verdict::*};
use serde_json::json;

const A4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const C4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
const WEB: u16 = 8080;
const OTHER: u16 = 9090;

/// What is logged until `seen` holds for it (at most ten seconds), and then for `more`: the
/// kernel sends a group's packets in batches, each group on its own.
fn read_until(
    sock: &mut NflogSocket,
    seen: impl Fn(&[LoggedPacket]) -> bool,
    more: Duration,
) -> Vec<LoggedPacket> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    while !seen(&out) && t0.elapsed() < Duration::from_secs(10) {
        sock.recv(&mut out).expect("reading NFLOG");
    }
    let t1 = Instant::now();
    while t1.elapsed() < more {
        sock.recv(&mut out).expect("reading NFLOG");
    }
    out
}

/// Whether `got` has a packet of `tuple` with `prefix` in `group`.
fn has(got: &[LoggedPacket], tuple: FiveTuple, group: u16, prefix: &str) -> bool {
    hits(got, tuple).contains(&(group, prefix.to_string()))
}

/// (group, prefix) of each packet of `tuple`, in arrival order.
fn hits(got: &[LoggedPacket], tuple: FiveTuple) -> Vec<(u16, String)> {
    got.iter()
        .filter(|p| p.five_tuple() == Some(tuple))
        .map(|p| (p.group, String::from_utf8_lossy(&p.prefix).into_owned()))
        .collect()
}

fn tcp(src: SocketAddr, dst: IpAddr, dport: u16) -> FiveTuple {
    FiveTuple {
        src: src.ip(),
        dst,
        proto: 6,
        sport: src.port(),
        dport,
    }
}

/// Connects from `ns`, bound to `from`, to `dst:port` (one second at most); the local address
/// either way.
fn connect(
    ns: &NetNs,
    from: Ipv4Addr,
    dst: Ipv4Addr,
    port: u16,
) -> (SocketAddr, Option<TcpStream>) {
    let sock = ns
        .run(|| socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None))
        .expect("entering the workload")
        .expect("a TCP socket");
    let bind: SocketAddr = (from, 0).into();
    sock.bind(&bind.into()).expect("binding");
    let local = sock
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("the local address");
    let to: SocketAddr = (dst, port).into();
    let stream = sock
        .connect_timeout(&to.into(), Duration::from_secs(1))
        .ok()
        .map(|()| TcpStream::from(sock));
    (local, stream)
}

#[test]
fn each_connection_s_verdict_is_logged_once_per_side_with_felix_s_prefix() {
    require_root();
    let topo = three_v4_workloads("fnt-e2e-flow", [A4, B4, C4]);
    let _srv = serve(&topo, &[WEB, OTHER], &[]);
    let env = vec![("FELIX_FLOWLOGSLOCALREPORTER".into(), "Enabled".into())];
    let mut agent = Agent::start(
        &topo,
        AgentOptions {
            env,
            ..AgentOptions::default()
        },
    );
    let (a, b, c) = abc(&topo);
    let host = NetNs::open(topo.host_netns_name()).expect("the host namespace");
    let mut nflog = NflogSocket::open(Some(&host), &[1, 2], 80, 1 << 20).expect("groups 1, 2");
    nflog
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("a read timeout");

    // c's profile denies WEB and allows nothing else in.
    let deny_web = json!([{"action": "deny", "protocol": {"name": "tcp"},
        "dst_ports": [{"first": WEB, "last": WEB}]}]);
    agent.send_all(&[
        allow_all_profile(),
        profile("deny-web", deny_web, json!([{"action": "allow"}])),
        wep(a, &["allow-all"], json!([])),
        wep(b, &["allow-all"], json!([])),
        wep(c, &["deny-web"], json!([])),
        in_sync(),
    ]);
    agent.expect_matrix(
        "programmed",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, WEB, Drop),
            flow(src(a), v4(c), Tcp, OTHER, Drop),
        ],
    );

    // One connection, 50 round trips: logged once by each side, on its first packet.
    let (local, stream) = connect(a.ns(), A4, B4, WEB);
    let mut stream = stream.expect("a reaches b");
    for _ in 0..50 {
        stream.write_all(b"x").expect("sending");
        let mut one = [0u8; 1];
        stream.read_exact(&mut one).expect("the echo");
    }
    drop(stream);
    let t = tcp(local, IpAddr::V4(B4), WEB);
    // Both sides' logs, then long enough for any other to come too.
    let got = read_until(
        &mut nflog,
        |got| has(got, t, 1, "ARI0|allow-all") && has(got, t, 2, "ARE0|allow-all"),
        Duration::from_secs(2),
    );
    let mut seen = hits(&got, t);
    seen.sort();
    assert_eq!(
        seen,
        [(1, "ARI0|allow-all".into()), (2, "ARE0|allow-all".into())],
        "{got:#?}"
    );

    // Denied by c's profile rule: its ingress logs the rule's deny (each SYN a new attempt).
    let (local, stream) = connect(a.ns(), A4, C4, WEB);
    assert!(stream.is_none(), "c denies WEB");
    let t = tcp(local, IpAddr::V4(C4), WEB);
    let got = read_until(
        &mut nflog,
        |got| has(got, t, 1, "DRI0|deny-web"),
        Duration::ZERO,
    );
    assert!(has(&got, t, 1, "DRI0|deny-web"), "{got:#?}");
    // No rule of c's profile matches OTHER: the drop after the profiles logs.
    let (local, stream) = connect(a.ns(), A4, C4, OTHER);
    assert!(stream.is_none(), "nothing allows OTHER into c");
    let t = tcp(local, IpAddr::V4(C4), OTHER);
    let got = read_until(&mut nflog, |got| has(got, t, 1, "DRI"), Duration::ZERO);
    assert!(has(&got, t, 1, "DRI"), "{got:#?}");

    agent.stop_cleanly();
}
