//! Flow logs through the running agent, with real traffic.
//!
//! - The rules: with `FlowLogsLocalReporter` enabled, a connection a profile allows is logged
//!   once on each side (the source's egress, group 2, and the destination's ingress, group 1,
//!   each with Felix's prefix), however many packets it carries: only a connection's first
//!   packet reaches policy. A profile's deny logs its rule; a port no rule of the profile
//!   matches logs the drop after the profiles. The test's own `NflogSocket` holds groups 1 and
//!   2 first, so the agent's readers cannot have them: it runs on without flows and says so.
//! - The flows: the agent's records, read with `felix-nft flows`, name each side's verdict and
//!   trace (allowed by a policy rule, by a profile; passed by one tier then denied by a profile;
//!   denied at a tier's end), count the packets sent (conntrack's counters), and survive NAT
//!   outgoing.
//! - Goldmane: with `FlowLogsGoldmaneServer` set to a stand-in in the test process (the agent's
//!   own connections are made from the root namespace; only its netlink sockets are in the
//!   bed's), the flows of an allowed and a denied connection arrive as `FlowUpdate`s that
//!   `protoc` reads as Goldmane would: workloads, port, reporter, action and the profile that
//!   decided.

use crate::e2e_common;
use crate::goldmane_common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use e2e_common::*;
use felix_nft_lab::testbed::probe::{Proto::*, TcpServer, Verdict::*};
use felix_nft_lab::testbed::topology::EXTERNAL_V4;
use rtnl::netns::NetNs;
use rtnl::nflog::{FiveTuple, LoggedPacket, NflogSocket};
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
    let (t0, limit) = (Instant::now(), patient(Duration::from_secs(10)));
    while !seen(&out) && t0.elapsed() < limit {
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
    // The test holds groups 1 and 2 before the agent starts: the agent's own readers cannot
    // have them, and it runs on, programming the log rules, without flows.
    let host = NetNs::open(topo.host_netns_name()).expect("the host namespace");
    let mut nflog = NflogSocket::open(Some(&host), &[1, 2], 80, 1 << 20).expect("groups 1, 2");
    nflog
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("a read timeout");
    let env = vec![("FELIX_FLOWLOGSLOCALREPORTER".into(), "Enabled".into())];
    let mut agent = Agent::start(
        &topo,
        AgentOptions {
            env,
            ..AgentOptions::default()
        },
    );
    let (a, b, c) = abc(&topo);

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

    let log = agent.log_text();
    assert!(
        log.contains("flow logs: the readers cannot start"),
        "the agent says it runs without flows:\n{log}"
    );
    agent.stop_cleanly();
}

/// The agent's flow records, as `felix-nft flows --json` prints them.
fn flow_records(socket: &std::path::Path) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
        .args(["flows", "--json", "--socket"])
        .arg(socket)
        .output()
        .expect("running felix-nft flows");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The records of flows from `src` to `dst:port` reported by `reporter`.
fn records_of<'a>(
    all: &'a [serde_json::Value],
    src: &str,
    dst: &str,
    port: u16,
    reporter: &str,
) -> Vec<&'a serde_json::Value> {
    all.iter()
        .filter(|r| {
            let k = &r["key"];
            k["src"]["name"] == src
                && k["dst"]["name"] == dst
                && k["dest_port"] == port
                && k["reporter"] == reporter
        })
        .collect()
}

/// Each hit of a record's trace as `kind name tier action rule`.
fn trace(r: &serde_json::Value) -> Vec<String> {
    r["key"]["trace"]
        .as_array()
        .map(|hits| {
            hits.iter()
                .map(|h| {
                    format!(
                        "{} {} {} {} {}",
                        h["kind"].as_str().unwrap_or("?"),
                        h["name"].as_str().unwrap_or(""),
                        h["tier"].as_str().unwrap_or(""),
                        h["action"].as_str().unwrap_or("?"),
                        h["rule_index"]
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A TCP port free on the loopback now, for the agent's metrics.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The agent's metrics, in the Prometheus text format.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("the metrics port");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("a request");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("a response");
    body
}

/// The value of the first sample of `metric` whose labels include each of `labels`
/// (`name="value"`); 0 when there is none.
fn sample(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_agent_joins_logged_verdicts_and_conntrack_into_flows_felix_nft_flows_shows() {
    require_root();
    let topo = three_v4_workloads("fnt-e2e-flows", [A4, B4, C4]);
    let _srv = serve(&topo, &[WEB, OTHER], &[]);
    let dir = tempfile::tempdir().expect("a directory for the flow socket");
    let socket = dir.path().join("flows.sock");
    let metrics_port = free_port();
    let env = vec![
        ("FELIX_FLOWLOGSLOCALREPORTER".into(), "Enabled".into()),
        ("FELIX_FLOWLOGSFLUSHINTERVAL".into(), "1".into()),
        (
            "FELIX_FLOWLOGSLOCALSOCKET".into(),
            socket.display().to_string(),
        ),
        ("FELIX_PROMETHEUSMETRICSENABLED".into(), "true".into()),
        ("FELIX_PROMETHEUSMETRICSHOST".into(), "127.0.0.1".into()),
        (
            "FELIX_PROMETHEUSMETRICSPORT".into(),
            metrics_port.to_string(),
        ),
    ];
    let mut agent = Agent::start(
        &topo,
        AgentOptions {
            env,
            ..AgentOptions::default()
        },
    );
    let (a, b, c) = abc(&topo);
    let ext = topo.external().expect("the bed's external side");
    let _ext_srv = TcpServer::start(ext.ns(), WEB).expect("a server outside");
    // a: tier `sec` allows its TCP out by a policy rule. c: tier `sec` passes WEB on and denies
    // the rest at its end; c's profile denies WEB. The pool masquerades what leaves it.
    let deny_web = json!([{"action": "deny", "protocol": {"name": "tcp"},
        "dst_ports": [{"first": WEB, "last": WEB}]}]);
    let pass_web = json!([{"action": "pass", "protocol": {"name": "tcp"},
        "dst_ports": [{"first": WEB, "last": WEB}]}]);
    let allow_tcp = json!([{"action": "allow", "protocol": {"name": "tcp"}}]);
    agent.send_all(&[
        allow_all_profile(),
        profile("deny-web", deny_web, json!([{"action": "allow"}])),
        policy("sec", "pass-web", pass_web, json!([])),
        policy("sec", "allow-tcp-out", json!([]), allow_tcp),
        pool("pool-1", "198.18.0.0/24", true),
        wep(
            a,
            &["allow-all"],
            json!([tier("sec", &[], &["allow-tcp-out"], "Deny")]),
        ),
        wep(b, &["allow-all"], json!([])),
        wep(
            c,
            &["deny-web"],
            json!([tier("sec", &["pass-web"], &[], "Deny")]),
        ),
        in_sync(),
    ]);
    agent.expect_matrix(
        "programmed",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, WEB, Drop),
            flow(src(a), v4(c), Tcp, OTHER, Drop),
            flow(src(a), ("ext", IpAddr::V4(EXTERNAL_V4)), Tcp, WEB, Pass),
        ],
    );

    // One connection a → b with 50 round trips, closed.
    let (_, stream) = connect(a.ns(), A4, B4, WEB);
    let mut stream = stream.expect("a reaches b");
    for _ in 0..50 {
        stream.write_all(b"x").expect("sending");
        let mut one = [0u8; 1];
        stream.read_exact(&mut one).expect("the echo");
    }
    drop(stream);

    // Each side's record: a's allowed by its policy's rule, b's by its profile; the round trips
    // counted (conntrack's counters, polled while the connection is open, given by its end).
    let t0 = Instant::now();
    let (src_side, dst_side) = loop {
        let all = flow_records(&socket);
        let sum = |reporter: &str, field: &str| -> u64 {
            records_of(&all, "a", "b", WEB, reporter)
                .iter()
                .filter_map(|r| r[field].as_u64())
                .sum()
        };
        let (s, d) = (sum("src", "packets_out"), sum("dst", "packets_in"));
        if s >= 50 && d >= 50 {
            break (
                records_of(&all, "a", "b", WEB, "src")
                    .into_iter()
                    .cloned()
                    .collect::<Vec<_>>(),
                records_of(&all, "a", "b", WEB, "dst")
                    .into_iter()
                    .cloned()
                    .collect::<Vec<_>>(),
            );
        }
        assert!(
            t0.elapsed() < step_deadline(),
            "no records of a → b with 50 packets each side (src {s}, dst {d}):\n{all:#?}\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    for (side, recs) in [("src", &src_side), ("dst", &dst_side)] {
        let started: u64 = recs
            .iter()
            .filter_map(|r| r["connections_started"].as_u64())
            .sum();
        // The matrix's probes are connections of the same flow too.
        assert!(started >= 1, "{side}: a connection\n{recs:#?}");
        for r in recs.iter() {
            assert_eq!(r["key"]["action"], "allow", "{side}: {r:#}");
            assert_eq!(r["key"]["proto"], 6);
            assert_eq!(r["key"]["src"]["kind"], "workload");
            let want = match side {
                "src" => "global_network_policy allow-tcp-out sec allow 0",
                _ => "profile allow-all  allow 0",
            };
            assert_eq!(trace(r), [want], "{side}: {r:#}");
        }
    }

    // a → c:WEB: passed on by `sec`, denied by c's profile. a → c:OTHER: denied at the end
    // of `sec`. Each reported by c's side alone (a's egress allows).
    let (_, s) = connect(a.ns(), A4, C4, WEB);
    assert!(s.is_none(), "c denies WEB");
    let (_, s) = connect(a.ns(), A4, C4, OTHER);
    assert!(s.is_none(), "c denies OTHER");
    let t0 = Instant::now();
    loop {
        let all = flow_records(&socket);
        let web = records_of(&all, "a", "c", WEB, "dst");
        let other = records_of(&all, "a", "c", OTHER, "dst");
        if !web.is_empty() && !other.is_empty() {
            for r in &web {
                assert_eq!(r["key"]["action"], "deny", "{r:#}");
                assert_eq!(
                    trace(r),
                    [
                        "global_network_policy pass-web sec pass 0",
                        "profile deny-web  deny 0"
                    ],
                    "{r:#}"
                );
            }
            for r in &other {
                assert_eq!(r["key"]["action"], "deny", "{r:#}");
                assert_eq!(trace(r), ["end_of_tier  sec deny -1"], "{r:#}");
            }
            break;
        }
        assert!(
            t0.elapsed() < step_deadline(),
            "no denied records of a → c:\n{all:#?}\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // NAT outgoing: a's connection out leaves with the host's address; its record still names
    // a and the server, and counts its round trips (conntrack's original tuple is a's).
    let (_, stream) = connect(a.ns(), A4, EXTERNAL_V4, WEB);
    let mut stream = stream.expect("a reaches the outside");
    for _ in 0..20 {
        stream.write_all(b"x").expect("sending");
        let mut one = [0u8; 1];
        stream.read_exact(&mut one).expect("the echo");
    }
    drop(stream);
    let outside = EXTERNAL_V4.to_string();
    let t0 = Instant::now();
    loop {
        let all = flow_records(&socket);
        let recs = records_of(&all, "a", &outside, WEB, "src");
        let sent: u64 = recs.iter().filter_map(|r| r["packets_out"].as_u64()).sum();
        if sent >= 20 {
            for r in &recs {
                assert_eq!(r["key"]["dst"]["kind"], "network", "{r:#}");
                assert_eq!(
                    trace(r),
                    ["global_network_policy allow-tcp-out sec allow 0"],
                    "{r:#}"
                );
            }
            break;
        }
        assert!(
            t0.elapsed() < step_deadline(),
            "no record of a → {outside} with 20 packets out:\n{all:#?}\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // The text view names the verdict and the deciding rule.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
        .args(["flows", "--verdict", "denied", "--socket"])
        .arg(&socket)
        .output()
        .expect("running felix-nft flows");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("DENIED"), "{text}");
    assert!(!text.contains("ALLOWED"), "only denied flows:\n{text}");

    // The metrics count what the records counted (recorded before each flush is published),
    // per rule, and the denials per denying rule, by policy and not by address.
    let m = scrape(metrics_port);
    let rule = |labels: &[&str]| sample(&m, "cnx_policy_rule_packets", labels);
    let denied = |policy: &str| sample(&m, "calico_denied_packets", &[policy]);
    assert!(
        denied(r#"policy="__PROFILE__|deny-web|0|deny""#) > 0.0,
        "c's profile denied WEB:\n{m}"
    );
    assert!(
        denied(r#"policy="sec|__NO_MATCH__|-1|deny""#) > 0.0,
        "the end of `sec` denied OTHER:\n{m}"
    );
    assert!(
        rule(&[
            r#"action="pass""#,
            r#"policy="pass-web""#,
            r#"traffic_direction="inbound""#
        ]) > 0.0,
        "{m}"
    );
    // a → b (50 round trips) and a → outside (20), both allowed by a's policy's rule.
    assert!(
        rule(&[
            r#"action="allow""#,
            r#"kind="GlobalNetworkPolicy""#,
            r#"policy="allow-tcp-out""#,
            r#"rule_direction="egress""#,
            r#"tier="sec""#,
            r#"traffic_direction="outbound""#
        ]) >= 70.0,
        "{m}"
    );
    assert!(!m.contains("srcIP"), "{m}");
    for counter in [
        "felix_nft_agent_flowlog_nflog_packets_total",
        "felix_nft_agent_flowlog_records_total",
    ] {
        assert!(sample(&m, counter, &[]) > 0.0, "{counter}:\n{m}");
    }
    assert_eq!(
        sample(&m, "felix_nft_agent_flowlog_kernel_overruns_total", &[]),
        0.0,
        "{m}"
    );

    agent.stop_cleanly();
    assert!(
        !socket.exists(),
        "the agent removes its socket when it stops"
    );
}

/// The value of the first line of protoc's text `flow` that is `field: value` (`name: ` is a
/// policy hit's name: a key's names are `source_name`/`dest_name`), quotes stripped.
fn field<'a>(flow: &'a str, field: &str) -> Option<&'a str> {
    let prefix = format!("{field}: ");
    flow.lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .map(|v| v.trim_matches('"'))
}

/// Whether protoc's text `flow` is a flow from `src` to `dst:port`, reported by `reporter`
/// (`Src`, `Dst`), with `action` (`Allow`, `Deny`).
fn is_flow(flow: &str, src: &str, dst: &str, port: u16, reporter: &str, action: &str) -> bool {
    let port = port.to_string();
    field(flow, "source_name") == Some(src)
        && field(flow, "dest_name") == Some(dst)
        && field(flow, "dest_port") == Some(port.as_str())
        && field(flow, "reporter") == Some(reporter)
        && field(flow, "action") == Some(action)
}

#[test]
fn the_agent_streams_allowed_and_denied_flows_to_goldmane() {
    require_root();
    // The stand-in runs on a runtime of its own, in the test process, on the root namespace's
    // loopback: where the agent's Goldmane connection is made.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the Goldmane stand-in");
    let mut goldmane = rt.block_on(goldmane_common::stand_in(
        goldmane_common::Mode::Ack,
        None,
        None,
    ));
    let topo = three_v4_workloads("fnt-e2e-gm", [A4, B4, C4]);
    let _srv = serve(&topo, &[WEB], &[]);
    let dir = tempfile::tempdir().expect("a directory for the flow socket");
    let env = vec![
        (
            "FELIX_FLOWLOGSGOLDMANESERVER".into(),
            format!("http://{}", goldmane.addr),
        ),
        ("FELIX_FLOWLOGSFLUSHINTERVAL".into(), "1".into()),
        (
            "FELIX_FLOWLOGSLOCALSOCKET".into(),
            dir.path().join("flows.sock").display().to_string(),
        ),
    ];
    let mut agent = Agent::start(
        &topo,
        AgentOptions {
            env,
            ..AgentOptions::default()
        },
    );
    let (a, b, c) = abc(&topo);
    // b's profile allows everything; c's denies WEB by its rule.
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
        ],
    );

    // One connection a → b with 20 round trips, closed; one a → c:WEB, refused.
    let (_, stream) = connect(a.ns(), A4, B4, WEB);
    let mut stream = stream.expect("a reaches b");
    for _ in 0..20 {
        stream.write_all(b"x").expect("sending");
        let mut one = [0u8; 1];
        stream.read_exact(&mut one).expect("the echo");
    }
    drop(stream);
    let (_, s) = connect(a.ns(), A4, C4, WEB);
    assert!(s.is_none(), "c denies WEB");

    // What Goldmane is sent, as protoc reads it: each side of a → b allowed by its profile, a's
    // side counting the round trips (conntrack's counters; the matrix's probes add to them); c's
    // side of a → c denied by c's profile's rule.
    let a_b = |f: &String| is_flow(f, "a", "b", WEB, "Src", "Allow");
    let b_side = |f: &String| is_flow(f, "a", "b", WEB, "Dst", "Allow");
    let a_c = |f: &String| is_flow(f, "a", "c", WEB, "Dst", "Deny");
    let sent_a_b = |got: &[String]| -> u64 {
        got.iter()
            .filter(|f| a_b(f))
            .filter_map(|f| field(f, "packets_out")?.parse::<u64>().ok())
            .sum()
    };
    let mut got: Vec<String> = Vec::new();
    let t0 = Instant::now();
    // Checked after every flow: decoding one runs protoc, which under the VM bed's emulator is
    // about as slow as the agent's stream, so the queue may never be seen empty.
    while sent_a_b(&got) < 20 || !got.iter().any(b_side) || !got.iter().any(a_c) {
        assert!(
            t0.elapsed() < step_deadline(),
            "Goldmane was not sent a → b allowed on both sides, 20 packets out (got {}), and a → c denied:\n{}\n{}",
            sent_a_b(&got),
            got.join("\n"),
            agent.log_text()
        );
        match goldmane.got.try_recv() {
            Ok(bytes) => got.push(goldmane_common::protoc_decode(&bytes)),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    for f in got.iter().filter(|f| a_b(f) || b_side(f)) {
        assert_eq!(field(f, "proto"), Some("tcp"), "{f}");
        assert_eq!(field(f, "source_type"), Some("WorkloadEndpoint"), "{f}");
        assert_eq!(field(f, "dest_type"), Some("WorkloadEndpoint"), "{f}");
        assert_eq!(field(f, "kind"), Some("Profile"), "{f}");
        assert_eq!(field(f, "name"), Some("allow-all"), "{f}");
    }
    for f in got.iter().filter(|f| a_c(f)) {
        assert_eq!(field(f, "proto"), Some("tcp"), "{f}");
        assert_eq!(field(f, "kind"), Some("Profile"), "{f}");
        assert_eq!(field(f, "name"), Some("deny-web"), "{f}");
    }
    let log = agent.log_text();
    assert!(
        log.contains("flow logs: streaming flows to Goldmane"),
        "{log}"
    );
    agent.stop_cleanly();
}
