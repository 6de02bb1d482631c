//! End-to-end scenarios: a test bed node laid out as Calico's CNI lays one out,
//! ONE running `felix-nft run --source stdin --netns <host>` per daemon life, a sequence of updates
//! streamed to it, and after each step the connectivity matrix measured with real TCP/UDP/ICMP
//! flows. Every step flips at least one flow against the step before, so a matching matrix proves
//! the step was applied (one atomic nf_tables transaction), not that nothing happened yet.
//!
//! Each step's comment names the Felix behaviour it checks.
//! One topology per test function; steps share it.

use crate::e2e_common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use e2e_common::*;
use felix_nft_lab::testbed::probe::{Proto::*, TcpServer, Verdict::*};
use felix_nft_lab::testbed::topology::{
    ExternalSpec, Topology, WorkloadSpec, EXTERNAL_V4, HOST_EXT_V4,
};
use serde_json::json;

const A4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const C4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
const A6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2);
/// A floating IP (TEST-NET-3): never routed anywhere real.
const FLOAT4: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
const WEB: u16 = 8080;
const OTHER: u16 = 9090;
const DNS: u16 = 5353;

/// Listeners on every workload: TCP `WEB` and `OTHER`, UDP `DNS`.
fn servers(topo: &Topology) -> Servers {
    serve(topo, &[WEB, OTHER], &[DNS])
}

fn ip4(name: &str, ip: Ipv4Addr) -> (&str, IpAddr) {
    (name, IpAddr::V4(ip))
}

/// Profiles, default deny, ingress/egress policy by port, protocol, CIDR and IP set, IP set
/// deltas, negations and ICMP types — one daemon, three workloads, ten steps.
#[test]
fn policy_rules_decide_traffic() {
    let (topo, _srv, mut agent) = three_v4_with_agent("fnt-e2e-pol", [A4, B4, C4], servers);
    let (a, b, c) = abc(&topo);
    let no_tiers = json!([]);

    // 1. Profile allow-all (§8.1 item 10: profile chains after the tiers; the profile's allow
    //    rule accepts), with routes, proxy ARP and static ARP programmed by felix-nft (§14.2, §15).
    agent.send_all(&[
        allow_all_profile(),
        wep(a, &["allow-all"], no_tiers.clone()),
        wep(b, &["allow-all"], no_tiers.clone()),
        wep(c, &["allow-all"], no_tiers.clone()),
        in_sync(),
    ]);
    agent.expect_matrix(
        "profile allow-all",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Udp, DNS, Pass),
            flow(src(a), v4(b), Icmp, 0, Pass),
            flow(src(b), v4(a), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, WEB, Pass),
            flow(src(c), v4(a), Tcp, WEB, Pass),
        ],
    );

    // 2. Default deny: an endpoint with no profile and no tier drops everything in and out
    //    (§8.1 item 10: "DROP if no profiles matched").
    agent.send(&wep(c, &[], no_tiers.clone()));
    agent.expect_matrix(
        "default deny (no profile, no policy)",
        &[
            flow(src(a), v4(c), Tcp, WEB, Drop),
            flow(src(a), v4(c), Icmp, 0, Drop),
            flow(src(c), v4(a), Tcp, WEB, Drop),
            flow(src(c), v4(a), Udp, DNS, Drop),
            flow(src(a), v4(b), Tcp, WEB, Pass),
        ],
    );

    // 3. Ingress policy by protocol and port (§9.2 protocol + `tcp dport`; §8.1 item 8c: end of
    //    tier drops what no policy accepted; a tier with no egress policy is skipped for egress,
    //    so b's egress still falls to its profile).
    agent.send_all(&[
        ingress_policy(
            "b-in",
            json!([{"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB])}]),
        ),
        wep_ingress(b, &["b-in"]),
        wep(c, &["allow-all"], no_tiers.clone()),
    ]);
    agent.expect_matrix(
        "ingress by port and protocol",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
            flow(src(a), v4(b), Udp, DNS, Drop),
            flow(src(a), v4(b), Icmp, 0, Drop),
            flow(src(c), v4(b), Tcp, WEB, Pass),
            flow(src(b), v4(a), Tcp, OTHER, Pass),
            flow(src(a), v4(c), Tcp, WEB, Pass),
        ],
    );

    // 4. Ingress by source CIDR and by IP set (§9.2 `ip saddr <cidr>`, `ip saddr @set`; §2.4 IP
    //    set ids and members).
    agent.send_all(&[
        ipset("s:udp-clients", "IP", &[C4.to_string()]),
        ingress_policy(
            "b-in",
            json!([
                {"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB]),
                 "src_net": [cidr4(a)]},
                {"action": "allow", "protocol": proto("udp"), "src_ip_set_ids": ["s:udp-clients"]},
            ]),
        ),
    ]);
    agent.expect_matrix(
        "ingress by CIDR and IP set",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(c), v4(b), Tcp, WEB, Drop),
            flow(src(c), v4(b), Udp, DNS, Pass),
            flow(src(a), v4(b), Udp, DNS, Drop),
        ],
    );

    // 5–6. IP set deltas take effect with no rule change (§13: members added/removed in place;
    //      DESIGN §3: element add/delete in the transaction, no set or rule rewritten).
    let host_ns = topo.host_netns_name();
    let handles = nft_handles(host_ns);
    assert!(handles.len() > 50, "{handles:?}");
    agent.send(&ipset_delta("s:udp-clients", &[A4.to_string()], &[]));
    agent.expect_matrix(
        "IP set delta adds a member",
        &[
            flow(src(a), v4(b), Udp, DNS, Pass),
            flow(src(c), v4(b), Udp, DNS, Pass),
            flow(src(c), v4(b), Tcp, WEB, Drop),
        ],
    );
    agent.send(&ipset_delta("s:udp-clients", &[], &[C4.to_string()]));
    agent.expect_matrix(
        "IP set delta removes a member",
        &[
            flow(src(c), v4(b), Udp, DNS, Drop),
            flow(src(a), v4(b), Udp, DNS, Pass),
        ],
    );
    assert_eq!(
        nft_handles(host_ns),
        handles,
        "an IP set delta changed a table, chain, set or rule"
    );

    // 7. Egress policy by destination CIDR, protocol and IP set (§8.2 `cali-fw-` chain is the
    //    workload's egress; §9.2 `ip daddr`, `meta l4proto`, `ip daddr @set`). a's ingress
    //    keeps its profile.
    agent.send_all(&[
        ipset("s:udp-servers", "NET", &[cidr4(c)]),
        policy(
            "default",
            "a-out",
            json!([]),
            json!([
                {"action": "allow", "protocol": proto("tcp"), "dst_net": [cidr4(b)]},
                {"action": "allow", "ip_version": 4, "protocol": proto("icmp")},
                {"action": "allow", "protocol": proto("udp"), "dst_ip_set_ids": ["s:udp-servers"]},
            ]),
        ),
        wep(
            a,
            &["allow-all"],
            json!([tier("default", &[], &["a-out"], "Deny")]),
        ),
    ]);
    agent.expect_matrix(
        "egress by CIDR, protocol and IP set",
        &[
            flow(src(a), v4(c), Udp, DNS, Pass),
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, WEB, Drop),
            flow(src(a), v4(c), Icmp, 0, Pass),
            flow(src(a), v4(b), Udp, DNS, Drop),
            flow(src(b), v4(a), Tcp, WEB, Pass),
        ],
    );

    // 8. Negations: not_dst_ports, not_protocol, not_src_net (§9.2 negated clauses `!=`).
    agent.send_all(&[
        wep(a, &["allow-all"], no_tiers.clone()),
        ingress_policy(
            "b-in",
            json!([
                {"action": "allow", "protocol": proto("tcp"), "not_dst_ports": ports(&[OTHER])},
                {"action": "allow", "not_protocol": proto("tcp"), "not_src_net": [cidr4(a)]},
            ]),
        ),
    ]);
    agent.expect_matrix(
        "negations",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(c), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
            flow(src(c), v4(b), Tcp, OTHER, Drop),
            flow(src(c), v4(b), Udp, DNS, Pass),
            flow(src(c), v4(b), Icmp, 0, Pass),
            flow(src(a), v4(b), Udp, DNS, Drop),
            flow(src(a), v4(b), Icmp, 0, Drop),
        ],
    );

    // 9–10. ICMP type rules (§9.2 `icmp type T`): echo-request (8) allowed → ping passes; only
    //       timestamp (13) allowed → ping drops. The reply comes back as established (§8.1 item 3).
    let icmp_only = |ty: i32| {
        ingress_policy(
            "b-in",
            json!([
                {"action": "allow", "ip_version": 4, "protocol": proto("icmp"), "icmp_type": ty},
                {"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB])},
            ]),
        )
    };
    agent.send(&icmp_only(8));
    agent.expect_matrix(
        "ICMP echo-request allowed",
        &[
            flow(src(a), v4(b), Icmp, 0, Pass),
            flow(src(c), v4(b), Icmp, 0, Pass),
            flow(src(c), v4(b), Udp, DNS, Drop),
            flow(src(a), v4(b), Tcp, WEB, Pass),
        ],
    );
    agent.send(&icmp_only(13));
    agent.expect_matrix(
        "only ICMP timestamp allowed",
        &[
            flow(src(a), v4(b), Icmp, 0, Drop),
            flow(src(c), v4(b), Icmp, 0, Drop),
            flow(src(a), v4(b), Tcp, WEB, Pass),
        ],
    );

    agent.stop_cleanly();
}

/// Tiers with a Pass rule, a tier whose default action is Pass, a log rule that continues, and
/// named-port (IP_AND_PORT) sets with deltas.
#[test]
fn tiers_log_rules_and_named_ports() {
    let (topo, _srv, mut agent) = three_v4_with_agent("fnt-e2e-tier", [A4, B4, C4], servers);
    let (a, b, c) = abc(&topo);

    // 1. Two tiers: "security" passes tcp/WEB to the next tier and denies the rest; "app" allows
    //    tcp/WEB from a only (§9.4 `pass`: set pass bit, return; §8.1 item 8a: the next tier
    //    starts by clearing it; item 8c: end of tier drops).
    agent.send_all(&[
        allow_all_profile(),
        policy(
            "security",
            "sec",
            json!([
                {"action": "pass", "protocol": proto("tcp"), "dst_ports": ports(&[WEB])},
                {"action": "deny"},
            ]),
            json!([]),
        ),
        policy(
            "app",
            "app",
            json!([{"action": "allow", "protocol": proto("tcp"), "src_net": [cidr4(a)]}]),
            json!([]),
        ),
        wep(a, &["allow-all"], json!([])),
        wep(
            b,
            &["allow-all"],
            json!([
                tier("security", &["sec"], &[], "Deny"),
                tier("app", &["app"], &[], "Deny"),
            ]),
        ),
        wep(c, &["allow-all"], json!([])),
        in_sync(),
    ]);
    agent.expect_matrix(
        "tier Pass rule hands over to the next tier",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(c), v4(b), Tcp, WEB, Drop),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
            flow(src(a), v4(b), Udp, DNS, Drop),
            flow(src(a), v4(c), Tcp, WEB, Pass),
        ],
    );

    // 2–3. A tier whose default action is Pass lets what its policies did not decide fall
    //      through to the profiles (§8.1 item 8c: no end-of-tier DROP when the default action is
    //      Pass); the same tier with default Deny drops it.
    let sec_deny_other = policy(
        "security",
        "sec",
        json!([{"action": "deny", "protocol": proto("tcp"), "dst_ports": ports(&[OTHER])}]),
        json!([]),
    );
    agent.send_all(&[
        sec_deny_other,
        wep(
            b,
            &["allow-all"],
            json!([tier("security", &["sec"], &[], "Pass")]),
        ),
    ]);
    agent.expect_matrix(
        "tier default action Pass",
        &[
            flow(src(c), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Udp, DNS, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
        ],
    );
    agent.send(&wep(
        b,
        &["allow-all"],
        json!([tier("security", &["sec"], &[], "Deny")]),
    ));
    agent.expect_matrix(
        "the same tier with default action Deny",
        &[
            flow(src(c), v4(b), Tcp, WEB, Drop),
            flow(src(a), v4(b), Udp, DNS, Drop),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
        ],
    );

    // 4. A log rule logs and continues: the packet is decided by the next rule (§9.4 `log`).
    agent.send_all(&[
        ingress_policy(
            "logged",
            json!([
                {"action": "log", "protocol": proto("tcp")},
                {"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB])},
            ]),
        ),
        wep_ingress(b, &["logged"]),
    ]);
    agent.expect_matrix(
        "log rule continues",
        &[
            flow(src(c), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
            flow(src(a), v4(b), Udp, DNS, Drop),
        ],
    );
    let ruleset = nft_ruleset(topo.host_netns_name());
    assert!(
        ruleset.contains("log prefix \"calico-packet"),
        "no log statement with the default LogPrefix (§3.2) in:\n{ruleset}"
    );

    // 5. Named ports: an IP_AND_PORT set matched as `ip daddr . meta l4proto . th dport @set`
    //    (§2.4 member form `ip,proto:port`; §9.2 named-port sets).
    let b_port = |p: &str| format!("{B4},{p}");
    agent.send_all(&[
        ipset(
            "n:web-ports",
            "IP_AND_PORT",
            &[b_port("tcp:8080"), b_port("udp:5353")],
        ),
        ingress_policy(
            "named",
            json!([{"action": "allow", "dst_named_port_ip_set_ids": ["n:web-ports"]}]),
        ),
        wep_ingress(b, &["named"]),
    ]);
    agent.expect_matrix(
        "named-port set",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Udp, DNS, Pass),
            flow(src(c), v4(b), Udp, DNS, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
            flow(src(a), v4(b), Icmp, 0, Drop),
        ],
    );

    // 6. A named-port set delta (§13): tcp/OTHER added, udp/DNS removed, no rule change.
    agent.send(&ipset_delta(
        "n:web-ports",
        &[b_port("tcp:9090")],
        &[b_port("udp:5353")],
    ));
    agent.expect_matrix(
        "named-port set delta",
        &[
            flow(src(a), v4(b), Tcp, OTHER, Pass),
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Udp, DNS, Drop),
        ],
    );

    agent.stop_cleanly();
}

/// `DefaultEndpointToHostAction` DROP vs ACCEPT (one daemon life per value) and a host endpoint
/// with a deny-all policy whose failsafe port still passes.
#[test]
fn host_traffic_endpoint_to_host_action_and_failsafes() {
    require_root();
    let upstream = ExternalSpec {
        routes_to_workloads: true,
        ..UPSTREAM_V4
    };
    let topo = bed("fnt-e2e-host", vec![WorkloadSpec::v4("a", A4)], upstream);
    let a = topo.workload("a").unwrap();
    let ext = topo.external().unwrap();
    let _a_srv = TcpServer::start(a.ns(), WEB).unwrap();
    let _ext_srv = TcpServer::start(ext.ns(), WEB).unwrap();
    let _host_ssh = TcpServer::start(topo.host(), 22).unwrap();
    let _host_web = TcpServer::start(topo.host(), WEB).unwrap();
    let host = ip4("host", HOST_EXT_V4);
    let _ext_bgp = TcpServer::start(ext.ns(), 179).unwrap();
    let external = ("ext", ext.ns());
    let from_host = ("host", topo.host());
    let hep_deny = [
        ingress_policy("hep-deny", json!([{"action": "deny"}])),
        hep(
            "host-ext0",
            "ext0",
            &[],
            json!([tier("default", &["hep-deny"], &[], "Deny")]),
        ),
    ];

    // 1. Default DefaultEndpointToHostAction=DROP: a workload reaches other hosts but not its own
    //    host (§7.3 item 4, §3.2 default DROP).
    let mut agent = Agent::start(&topo, AgentOptions::default());
    agent.send_all(&[
        allow_all_profile(),
        wep(a, &["allow-all"], json!([])),
        in_sync(),
    ]);
    agent.expect_matrix(
        "DefaultEndpointToHostAction DROP",
        &[
            flow(src(a), host, Tcp, WEB, Drop),
            flow(src(a), host, Icmp, 0, Drop),
            flow(src(a), ip4("ext", EXTERNAL_V4), Tcp, WEB, Pass),
            flow(external, host, Tcp, WEB, Pass),
            flow(external, v4(a), Tcp, WEB, Pass),
            flow(from_host, ip4("ext", EXTERNAL_V4), Tcp, WEB, Pass),
        ],
    );

    // 2. A host endpoint on ext0 with a deny-all ingress policy: the failsafe tcp:22 still passes
    //    (§7.5 `cali-failsafe-in`, jumped to from `cali-fh-<if>` before policy, §8.1 item 5;
    //    §3.2 FailsafeInboundHostPorts default includes tcp:22); any other port drops. Forwarded
    //    traffic is not host-endpoint policy's business without apply-on-forward (§8.2). The
    //    HEP has no egress policy and no profile, so the host's own new outbound flows drop
    //    (§8.1 item 10) except the outbound failsafes (§7.5 `cali-failsafe-out`, tcp:179 among
    //    the §3.2 defaults).
    agent.send_all(&hep_deny);
    agent.expect_matrix(
        "host endpoint deny-all with failsafe",
        &[
            flow(external, host, Tcp, 22, Pass),
            flow(external, host, Tcp, WEB, Drop),
            flow(external, host, Icmp, 0, Drop),
            flow(external, v4(a), Tcp, WEB, Pass),
            flow(src(a), ip4("ext", EXTERNAL_V4), Tcp, WEB, Pass),
            flow(from_host, ip4("ext", EXTERNAL_V4), Tcp, WEB, Drop),
            flow(from_host, ip4("ext", EXTERNAL_V4), Tcp, 179, Pass),
        ],
    );
    agent.stop_cleanly();

    // 3. A second daemon life with DefaultEndpointToHostAction=ACCEPT: the workload reaches its
    //    host (§7.3 item 4); the restarted agent converges the tables the first one left.
    let mut agent = Agent::start(
        &topo,
        AgentOptions {
            env: vec![("FELIX_DEFAULTENDPOINTTOHOSTACTION".into(), "ACCEPT".into())],
            ..Default::default()
        },
    );
    agent.send_all(&[allow_all_profile(), wep(a, &["allow-all"], json!([]))]);
    agent.send_all(&hep_deny);
    agent.send(&in_sync());
    agent.expect_matrix(
        "DefaultEndpointToHostAction ACCEPT",
        &[
            flow(src(a), host, Tcp, WEB, Pass),
            flow(src(a), host, Icmp, 0, Pass),
            flow(external, host, Tcp, 22, Pass),
            flow(external, host, Tcp, WEB, Drop),
        ],
    );
    agent.stop_cleanly();
}

/// NAT outgoing for a masquerading pool, and a floating IP.
#[test]
fn nat_outgoing_and_floating_ip() {
    require_root();
    // The external side has no route to the workloads: it can only ever answer the host's
    // address (what NAT outgoing is for) or the floating IP routed to the host.
    let workloads = vec![WorkloadSpec::v4("a", A4), WorkloadSpec::v4("b", B4)];
    let topo = bed("fnt-e2e-nat", workloads, UPSTREAM_V4);
    let (a, b) = (topo.workload("a").unwrap(), topo.workload("b").unwrap());
    let ext = topo.external().unwrap();
    // The network routes the floating IP to this node (test setup, not felix-nft's job).
    block_on(async {
        let h = rtnl::RtnlHandle::connect(Some(ext.ns())).unwrap();
        rtnl::link::add_route(
            &h,
            ipnet::IpNet::new(IpAddr::V4(FLOAT4), 32).unwrap(),
            Some("eth0"),
            Some(IpAddr::V4(HOST_EXT_V4)),
        )
        .await
        .unwrap();
    });
    let ext_srv = TcpServer::start(ext.ns(), WEB).unwrap();
    let a_srv = TcpServer::start(a.ns(), WEB).unwrap();
    let _b_srv = TcpServer::start(b.ns(), WEB).unwrap();
    let external = ("ext", ext.ns());
    let ext_addr = ip4("ext", EXTERNAL_V4);

    let mut agent = Agent::start(
        &topo,
        AgentOptions {
            env: vec![("FELIX_FLOATINGIPS".into(), "Enabled".into())],
            ..Default::default()
        },
    );
    let a_with_fip = wep_with(
        a,
        "active",
        &["allow-all"],
        json!([]),
        json!({"ipv4_nat": [{"ext_ip": FLOAT4.to_string(), "int_ip": A4.to_string()}]}),
    );

    // 1. NAT outgoing: the pool masquerades, so traffic leaving the pool for the outside has the
    //    host's address (§7.11 `cali-nat-outgoing`: src in masq pools, dst not in any pool →
    //    masquerade); traffic inside the pool keeps its source. Floating IP: traffic to the
    //    external IP is DNATed to the workload (§7.11 `cali-fip-dnat`, §17 FloatingIPs=Enabled).
    agent.send_all(&[
        allow_all_profile(),
        pool("pool-1", "198.18.0.0/24", true),
        a_with_fip.clone(),
        wep(b, &["allow-all"], json!([])),
        in_sync(),
    ]);
    agent.expect_matrix(
        "NAT outgoing and floating IP",
        &[
            flow(src(a), ext_addr, Tcp, WEB, Pass),
            flow(src(b), ext_addr, Tcp, WEB, Pass),
            flow(src(b), v4(a), Tcp, WEB, Pass),
            flow(external, ip4("a-fip", FLOAT4), Tcp, WEB, Pass),
        ],
    );
    let ext_peers = ext_srv.wait_peers(2, Duration::from_secs(1));
    assert!(
        !ext_peers.is_empty() && ext_peers.iter().all(|p| p.ip() == IpAddr::V4(HOST_EXT_V4)),
        "the external side must see only the host's address, saw {ext_peers:?}"
    );
    let a_peers = a_srv.wait_peers_from(
        &[IpAddr::V4(B4), IpAddr::V4(EXTERNAL_V4)],
        Duration::from_secs(1),
    );
    assert!(
        a_peers.iter().any(|p| p.ip() == IpAddr::V4(B4)),
        "traffic inside the pool must keep its source, a saw {a_peers:?}"
    );
    assert!(
        a_peers.iter().any(|p| p.ip() == IpAddr::V4(EXTERNAL_V4)),
        "the floating-IP flow must reach a with the external source, a saw {a_peers:?}"
    );

    // 2. Masquerade off: the outside cannot answer the workload's own address any more (what
    //    proves step 1's reachability was NAT's doing); the floating IP is independent of it.
    agent.send(&pool("pool-1", "198.18.0.0/24", false));
    agent.expect_matrix(
        "pool without masquerade",
        &[
            flow(src(a), ext_addr, Tcp, WEB, Drop),
            flow(src(b), v4(a), Tcp, WEB, Pass),
            flow(external, ip4("a-fip", FLOAT4), Tcp, WEB, Pass),
        ],
    );

    // 3. The floating IP removed from the endpoint: its DNAT goes (§17).
    agent.send(&wep(a, &["allow-all"], json!([])));
    agent.expect_matrix(
        "floating IP removed",
        &[
            flow(external, ip4("a-fip", FLOAT4), Tcp, WEB, Drop),
            flow(src(b), v4(a), Tcp, WEB, Pass),
        ],
    );

    agent.stop_cleanly();
}

/// Admin-down and removed endpoints pass nothing (fail closed), and come back.
#[test]
fn admin_down_and_removed_endpoints_fail_closed() {
    let (topo, _srv, mut agent) = three_v4_with_agent("fnt-e2e-life", [A4, B4, C4], servers);
    let (a, b, c) = abc(&topo);
    agent.send_allow_all(&[a, b, c]);
    agent.expect_matrix(
        "all endpoints up",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(b), v4(a), Tcp, WEB, Pass),
            flow(src(c), v4(a), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, WEB, Pass),
        ],
    );

    // 1. Admin down (state ≠ "active"): the endpoint's chains are a single DENY and it gets no
    //    routes (§8.1 item 1, §14.1). Its interface passes nothing out; traffic to it finds no
    //    host route and leaves by the default route, whose far side cannot answer: a drop.
    agent.send(&wep_with(
        c,
        "inactive",
        &["allow-all"],
        json!([]),
        json!({}),
    ));
    agent.expect_matrix(
        "admin-down endpoint",
        &[
            flow(src(c), v4(a), Tcp, WEB, Drop),
            flow(src(c), v4(a), Icmp, 0, Drop),
            flow(src(a), v4(c), Tcp, WEB, Drop),
            flow(src(a), v4(b), Tcp, WEB, Pass),
        ],
    );
    let host_ns = topo.host_netns_name();
    eventually("admin-down endpoint keeps no route", || {
        let routes = ip_in(host_ns, &["route", "show", "dev", &c.host_ifname]);
        routes.trim().is_empty().then_some(()).ok_or(routes)
    });
    let ruleset = nft_ruleset(host_ns);
    assert!(
        felix_nft_lab::testbed::dispatched_ingress_chains(&ruleset)
            .get(&c.host_ifname)
            .is_some_and(|tw| ruleset.contains(&format!("chain {tw} "))),
        "admin-down endpoint lost its (deny) chains:\n{ruleset}"
    );

    // 2. Endpoint removed while its `cali` interface stays: the dispatch maps no longer know the
    //    interface and their final rule drops (§8.4 "Unknown interface", DESIGN §3 fail closed);
    //    its route and static ARP entry go (§14.1 remove); its chains go.
    agent.send(&wep_remove(b));
    agent.expect_matrix(
        "endpoint removed, interface left",
        &[
            flow(src(b), v4(a), Tcp, WEB, Drop),
            flow(src(b), v4(a), Udp, DNS, Drop),
            flow(src(b), v4(a), Icmp, 0, Drop),
            flow(src(a), v4(b), Tcp, WEB, Drop),
        ],
    );
    let ruleset = nft_ruleset(host_ns);
    assert!(
        !ruleset.contains(&b.host_ifname),
        "chains or map elements of the removed endpoint are left:\n{ruleset}"
    );
    eventually("removed endpoint keeps no route and no static ARP", || {
        let routes = ip_in(host_ns, &["route", "show", "dev", &b.host_ifname]);
        let neigh = ip_in(
            host_ns,
            &["neigh", "show", "nud", "permanent", "dev", &b.host_ifname],
        );
        (routes.trim().is_empty() && neigh.trim().is_empty())
            .then_some(())
            .ok_or(format!("routes: {routes:?}, neighbours: {neigh:?}"))
    });

    // 3. Both come back.
    agent.send_all(&[
        wep(b, &["allow-all"], json!([])),
        wep(c, &["allow-all"], json!([])),
    ]);
    agent.expect_matrix(
        "endpoints back",
        &[
            flow(src(b), v4(a), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(c), v4(a), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, WEB, Pass),
        ],
    );

    agent.stop_cleanly();
}

/// Endpoint chains shared by content: endpoints whose chains would have the same body use one
/// chain, and sharing changes no verdict — not when the IP set their policy reads changes, not
/// when one of them moves to another body (only its dispatch element moves; the others stay),
/// and a QoS-limited endpoint keeps a chain of its own (a limiter is per endpoint).
#[test]
fn endpoints_sharing_a_chain_keep_their_own_verdicts() {
    let (topo, _srv, mut agent) = three_v4_with_agent("fnt-e2e-share", [A4, B4, C4], servers);
    let (a, b, c) = abc(&topo);
    let host_ns = topo.host_netns_name();
    let tw = |w: &felix_nft_lab::testbed::topology::Workload| {
        felix_nft_lab::testbed::dispatched_ingress_chains(&nft_ruleset(host_ns))
            .remove(&w.host_ifname)
            .unwrap_or_default()
    };
    let web_from_clients = || json!([tier("default", &["web-from-clients"], &[], "Deny")]);
    agent.send_all(&[
        allow_all_profile(),
        ipset("s:clients", "IP", &[A4.to_string()]),
        ingress_policy(
            "web-from-clients",
            json!([{"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB]),
                "src_ip_set_ids": ["s:clients"]}]),
        ),
        ingress_policy(
            "other-from-all",
            json!([{"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[OTHER])}]),
        ),
        wep(a, &["allow-all"], json!([])),
        wep_ingress(b, &["web-from-clients"]),
        wep_ingress(c, &["web-from-clients"]),
        in_sync(),
    ]);
    agent.expect_matrix(
        "b and c share one ingress chain",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
            flow(src(c), v4(b), Tcp, WEB, Drop),
            flow(src(b), v4(c), Tcp, WEB, Drop),
        ],
    );
    let shared = tw(b);
    assert!(shared.starts_with("filter-cali-tw-s."), "{shared}");
    assert_eq!(tw(c), shared);

    // 1. The set their policy reads changes: both see it, as before.
    agent.send(&ipset_delta("s:clients", &[C4.to_string()], &[]));
    agent.expect_matrix(
        "c joins the clients",
        &[
            flow(src(c), v4(b), Tcp, WEB, Pass),
            flow(src(b), v4(c), Tcp, WEB, Drop),
            flow(src(a), v4(c), Tcp, WEB, Pass),
        ],
    );

    // 2. b moves to another body: its element moves to a new chain; c stays where it was.
    agent.send(&wep_ingress(b, &["other-from-all"]));
    agent.expect_matrix(
        "b on a body of its own",
        &[
            flow(src(a), v4(b), Tcp, WEB, Drop),
            flow(src(a), v4(b), Tcp, OTHER, Pass),
            flow(src(a), v4(c), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, OTHER, Drop),
            flow(src(c), v4(b), Tcp, OTHER, Pass),
        ],
    );
    assert_eq!(tw(c), shared);
    assert_ne!(tw(b), shared);

    // 3. c gets a QoS connection limit: a chain of its own, named after its interface; b moves
    //    back to the first body, which nobody else uses now.
    agent.send_all(&[
        wep_with(
            c,
            "active",
            &["allow-all"],
            web_from_clients(),
            json!({"qos_controls": {"ingress_max_connections": 100}}),
        ),
        wep_ingress(b, &["web-from-clients"]),
    ]);
    agent.expect_matrix(
        "c limited, b back",
        &[
            flow(src(a), v4(c), Tcp, WEB, Pass),
            flow(src(a), v4(c), Tcp, OTHER, Drop),
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
        ],
    );
    assert_eq!(tw(c), format!("filter-cali-tw-{}", c.host_ifname));
    // Changed endpoints are policed from the side table (their chains there hand back to main)
    // until the idle merge brings them home: then b is on the first body's chain again.
    eventually("b back on the shared chain after the merge", || {
        let ruleset = nft_ruleset(host_ns);
        let endpoint_chains = ruleset
            .lines()
            .filter(|l| l.trim_start().starts_with("chain filter-cali-tw-"))
            .count();
        (tw(b) == shared && endpoint_chains == 2 * 3)
            .then_some(())
            .ok_or(format!(
                "a's, the shared one, c's own, per family:\n{ruleset}"
            ))
    });

    agent.stop_cleanly();
}

/// `felix-nft dump --json` of the topology's host namespace, as an operator runs it.
fn dump_json(host_ns: &str) -> serde_json::Value {
    let out = oracle_stdout(
        std::process::Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
            .args(["dump", "--json", "--netns", host_ns])
            .env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg"),
        "felix-nft dump",
    );
    serde_json::from_slice(&out).expect("dump JSON")
}

/// What `iface`'s IPv4 dispatch elements counted, (to, from) as (packets, bytes), with the
/// ingress chain it is dispatched to: from whichever IPv4 table holds its elements.
fn endpoint_traffic(dump: &serde_json::Value, iface: &str) -> Option<(String, [(u64, u64); 2])> {
    let count = |v: &serde_json::Value| Some((v["packets"].as_u64()?, v["bytes"].as_u64()?));
    dump["tables"].as_array()?.iter().find_map(|t| {
        let e = t["endpoints"].get(iface).filter(|_| t["family"] == "ip")?;
        Some((
            e["to"].as_str()?.to_string(),
            [count(&e["to_traffic"])?, count(&e["from_traffic"])?],
        ))
    })
}

/// Endpoints on one shared ingress chain still show their own traffic: each interface's
/// dispatch elements count its packets and bytes, and `felix-nft dump` reports them per
/// interface (the shared chain's rule counters add up both).
#[test]
fn endpoints_sharing_a_chain_count_their_own_traffic() {
    require_root();
    let topo = three_v4_workloads("fnt-e2e-count", [A4, B4, C4]);
    let (a, b, c) = abc(&topo);
    let host_ns = topo.host_netns_name();
    let mut agent = Agent::start(&topo, AgentOptions::default());
    agent.send_all(&[
        allow_all_profile(),
        ingress_policy(
            "web",
            json!([{"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB])}]),
        ),
        wep(a, &["allow-all"], json!([])),
        wep_ingress(b, &["web"]),
        wep_ingress(c, &["web"]),
        in_sync(),
    ]);
    let mut before = None;
    eventually(
        "b and c dispatched to one shared chain, a dispatched",
        || {
            let d = dump_json(host_ns);
            let (tb, b0) = endpoint_traffic(&d, &b.host_ifname).ok_or("b not dispatched")?;
            let (tc, c0) = endpoint_traffic(&d, &c.host_ifname).ok_or("c not dispatched")?;
            let (_, a0) = endpoint_traffic(&d, &a.host_ifname).ok_or("a not dispatched")?;
            if tb != tc || !tb.starts_with("filter-cali-tw-s.") {
                return Err(format!("b on {tb}, c on {tc}"));
            }
            before = Some((a0, b0, c0));
            Ok(())
        },
    );
    let (a0, b0, c0) = before.unwrap();

    // From a: 3 UDP datagrams to b, 5 to c, 100 bytes of payload each (128 bytes of IPv4). The
    // shared chain drops them (only TCP WEB is allowed); the dispatch elements count them first.
    let (nb, nc, len) = (3u64, 5u64, 128u64);
    a.ns()
        .run(|| {
            let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            for (dst, n) in [(v4(b).1, nb), (v4(c).1, nc)] {
                for _ in 0..n {
                    sock.send_to(&[0u8; 100], (dst, DNS)).unwrap();
                }
            }
        })
        .unwrap();
    let grown = |(p, by): (u64, u64), (p0, by0): (u64, u64)| (p - p0, by - by0);
    eventually("each interface counted its own traffic", || {
        let d = dump_json(host_ns);
        let (_, [b_to, _]) = endpoint_traffic(&d, &b.host_ifname).ok_or("b gone")?;
        let (_, [c_to, _]) = endpoint_traffic(&d, &c.host_ifname).ok_or("c gone")?;
        let (_, [_, a_from]) = endpoint_traffic(&d, &a.host_ifname).ok_or("a gone")?;
        let got = (grown(b_to, b0[0]), grown(c_to, c0[0]), grown(a_from, a0[1]));
        let want = ((nb, nb * len), (nc, nc * len), (nb + nc, (nb + nc) * len));
        (got == want).then_some(()).ok_or(format!(
            "(b to, c to, a from) grew by {got:?}, want {want:?}"
        ))
    });

    // The text form shows the same per interface.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
        .args(["dump", "--netns", host_ns])
        .env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
        .output()
        .expect("running felix-nft dump");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("endpoint {} (ip ", c.host_ifname)))
        .unwrap_or_else(|| panic!("no endpoint line for c:\n{text}"));
    let want = format!("({} packets, {} bytes)", c0[0].0 + nc, c0[0].1 + nc * len);
    assert!(line.contains(&want), "{line} lacks {want}");

    agent.stop_cleanly();
}

/// Dual-stack workloads: IPv6 flows allowed and denied by the same policies (ip6 table).
#[test]
fn ipv6_dual_stack_workloads() {
    require_root();
    let workloads = vec![
        WorkloadSpec::dual("a", A4, A6),
        WorkloadSpec::dual("b", B4, B6),
    ];
    let upstream = ExternalSpec {
        ipv6: true,
        ..UPSTREAM_V4
    };
    let topo = bed("fnt-e2e-v6", workloads, upstream);
    let _srv = servers(&topo);
    let (a, b) = (topo.workload("a").unwrap(), topo.workload("b").unwrap());
    let mut agent = Agent::start(&topo, AgentOptions::default());

    // 1. Allow-all: v6 routes (/128 on the cali interface, §15), proxy NDP and forwarding
    //    (§14.2) and the ip6 table's rules let every v6 flow through, and v4 alike.
    agent.send_allow_all(&[a, b]);
    agent.expect_matrix(
        "dual-stack allow-all",
        &[
            flow(src(a), v6(b), Tcp, WEB, Pass),
            flow(src(a), v6(b), Udp, DNS, Pass),
            flow(src(a), v6(b), Icmp, 0, Pass),
            flow(src(b), v6(a), Tcp, OTHER, Pass),
            flow(src(a), v4(b), Tcp, WEB, Pass),
        ],
    );

    // 2. A policy with per-family rules (§9.1: ip_version and the family of the nets select the
    //    table a rule lands in; §9.2 `ip6 saddr`, `icmpv6`): v6 allows tcp/WEB from a's /128 and
    //    ICMPv6 echo; v4 allows everything.
    let b_in = |icmp6: bool| {
        let mut rules = vec![
            json!({"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB]),
                   "src_net": [format!("{A6}/128")]}),
            json!({"action": "allow", "ip_version": 4}),
        ];
        if icmp6 {
            rules.push(json!({"action": "allow", "ip_version": 6,
                "protocol": proto("icmpv6"), "icmp_type": 128}));
        }
        ingress_policy("b-in6", json!(rules))
    };
    agent.send_all(&[b_in(true), wep_ingress(b, &["b-in6"])]);
    agent.expect_matrix(
        "IPv6 policy",
        &[
            flow(src(a), v6(b), Tcp, WEB, Pass),
            flow(src(a), v6(b), Tcp, OTHER, Drop),
            flow(src(a), v6(b), Udp, DNS, Drop),
            flow(src(a), v6(b), Icmp, 0, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Pass),
            flow(src(a), v4(b), Udp, DNS, Pass),
            flow(src(b), v6(a), Tcp, OTHER, Pass),
        ],
    );

    // 3. ICMPv6 echo no longer allowed: v6 ping drops, v4 ping still passes.
    agent.send(&b_in(false));
    agent.expect_matrix(
        "ICMPv6 echo denied",
        &[
            flow(src(a), v6(b), Icmp, 0, Drop),
            flow(src(a), v4(b), Icmp, 0, Pass),
            flow(src(a), v6(b), Tcp, WEB, Pass),
        ],
    );

    // 4. IP sets with members of one family only (a rule that must match a set with no member
    //    of the packet's family never matches, and a negation of it always holds): b allows
    //    TCP/WEB from set "s:a", which holds a's IPv4 address only, and UDP/DNS from anything
    //    not in set "s:none", which is empty.
    let b_sets = ingress_policy(
        "b-sets",
        json!([
            {"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB]),
             "src_ip_set_ids": ["s:a"]},
            {"action": "allow", "protocol": proto("udp"), "dst_ports": ports(&[DNS]),
             "not_src_ip_set_ids": ["s:none"]},
        ]),
    );
    agent.send_all(&[
        ipset("s:a", "IP", &[A4.to_string()]),
        ipset("s:none", "IP", &[]),
        b_sets,
        wep_ingress(b, &["b-sets"]),
    ]);
    agent.expect_matrix(
        "a set with IPv4 members only",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v6(b), Tcp, WEB, Drop),
            flow(src(a), v6(b), Udp, DNS, Pass),
            flow(src(a), v4(b), Udp, DNS, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
        ],
    );
    // The sets of steps 4 and 5 after gaining members of the other family: both TCP/WEB flows
    // pass, and of the UDP/DNS flows only the IPv4 one, now excluded, drops.
    let gained = |agent: &mut Agent, step: &str| {
        agent.expect_matrix(
            step,
            &[
                flow(src(a), v6(b), Tcp, WEB, Pass),
                flow(src(a), v4(b), Tcp, WEB, Pass),
                flow(src(a), v4(b), Udp, DNS, Drop),
                flow(src(a), v6(b), Udp, DNS, Pass),
            ],
        );
    };
    // The set gains a's IPv6 address: v6 TCP/WEB from a passes; "none" gains a's IPv4 address:
    // v4 UDP/DNS from a drops, v6 still passes.
    agent.send_all(&[
        ipset_delta("s:a", &[A6.to_string()], &[]),
        ipset_delta("s:none", &[A4.to_string()], &[]),
    ]);
    gained(&mut agent, "the sets gain members of the other family");
    // And lose them again.
    agent.send_all(&[
        ipset_delta("s:a", &[], &[A6.to_string()]),
        ipset_delta("s:none", &[], &[A4.to_string()]),
    ]);
    agent.expect_matrix(
        "the sets lose them",
        &[
            flow(src(a), v6(b), Tcp, WEB, Drop),
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Udp, DNS, Pass),
        ],
    );

    // 5. Named ports of one family: b allows TCP/WEB to its named-port set, which holds its
    //    IPv4 address only (no IPv6 packet matches it), and UDP/DNS unless to a named-port set
    //    that is empty (every packet is not in it).
    agent.send_all(&[
        ipset("n:b-web", "IP_AND_PORT", &[format!("{B4},tcp:{WEB}")]),
        ipset("n:none", "IP_AND_PORT", &[]),
        ingress_policy(
            "b-named",
            json!([
                {"action": "allow", "dst_named_port_ip_set_ids": ["n:b-web"]},
                {"action": "allow", "protocol": proto("udp"), "dst_ports": ports(&[DNS]),
                 "not_dst_named_port_ip_set_ids": ["n:none"]},
            ]),
        ),
        wep_ingress(b, &["b-named"]),
    ]);
    agent.expect_matrix(
        "a named-port set with IPv4 members only",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v6(b), Tcp, WEB, Drop),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
            flow(src(a), v6(b), Udp, DNS, Pass),
            flow(src(a), v4(b), Udp, DNS, Pass),
        ],
    );
    // b's IPv6 address joins the first set, its IPv4 DNS the second.
    agent.send_all(&[
        ipset_delta("n:b-web", &[format!("{B6},tcp:{WEB}")], &[]),
        ipset_delta("n:none", &[format!("{B4},udp:{DNS}")], &[]),
    ]);
    gained(&mut agent, "the named-port sets gain members");

    // 6. A policy none of whose rules is of IPv6 (it allows from "s:a", IPv4 members only
    //    again): its tier still ends in a deny for IPv6, and the policy comes into IPv6 when
    //    the set gains a's IPv6 address.
    agent.send_all(&[
        ipset_delta("s:a", &[], &[A6.to_string()]),
        ingress_policy(
            "b-v4",
            json!([{"action": "allow", "src_ip_set_ids": ["s:a"]}]),
        ),
        wep_ingress(b, &["b-v4"]),
    ]);
    agent.expect_matrix(
        "a policy with nothing for IPv6",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v6(b), Tcp, WEB, Drop),
            flow(src(a), v6(b), Udp, DNS, Drop),
        ],
    );
    agent.send_all(&[ipset_delta("s:a", &[A6.to_string()], &[])]);
    agent.expect_matrix(
        "the policy comes into IPv6",
        &[
            flow(src(a), v6(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, WEB, Pass),
        ],
    );

    agent.stop_cleanly();
}
