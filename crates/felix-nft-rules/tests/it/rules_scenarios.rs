//! Rendered rulesets for the rule scenarios, as `nft -f` text: snapshot tests (insta) and a
//! privileged test that loads every scenario into the kernel in a private network namespace and
//! reads it back (every chain with the same rules, identified by their `cali:` comments, and
//! every set present).

use testkit as common;

use std::collections::BTreeMap;
use std::process::Command;

use felix_api::types::{
    protocol::NumberOrName, rule::Icmp, rule::NotIcmp, GlobalBgpConfigUpdate, HostEndpoint,
    HostEndpointId, HostMetadataUpdate, IcmpTypeAndCode, IpSetType, IpamPool, NatInfo, Policy,
    PolicyId, PortRange, Profile, Protocol, Rule, RuleMetadata, TierInfo, ToDataplane,
    VxlanTunnelEndpointUpdate, WorkloadEndpoint, WorkloadEndpointId,
};
use felix_nft_rules::{
    render, render_nft, DenyAction, Members, Model, NatOutgoingExclusions, RateLimit, RulesConfig,
};
use nf_tables::model::Table;

fn proto(name: &str) -> Option<Protocol> {
    Some(Protocol {
        number_or_name: Some(NumberOrName::Name(name.into())),
    })
}

fn ports(list: &[(i32, i32)]) -> Vec<PortRange> {
    list.iter()
        .map(|&(first, last)| PortRange { first, last })
        .collect()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn gnp(name: &str) -> PolicyId {
    PolicyId {
        name: name.into(),
        namespace: String::new(),
        kind: "GlobalNetworkPolicy".into(),
    }
}

fn knp(ns: &str, name: &str) -> PolicyId {
    PolicyId {
        name: name.into(),
        namespace: ns.into(),
        kind: "KubernetesNetworkPolicy".into(),
    }
}

fn tier(name: &str, ingress: &[PolicyId], egress: &[PolicyId], default_action: &str) -> TierInfo {
    TierInfo {
        name: name.into(),
        ingress_policies: ingress.to_vec(),
        egress_policies: egress.to_vec(),
        default_action: default_action.into(),
    }
}

fn wep_id(name: &str) -> WorkloadEndpointId {
    WorkloadEndpointId {
        orchestrator_id: "k8s".into(),
        workload_id: format!("default/{name}"),
        endpoint_id: "eth0".into(),
    }
}

fn workload(iface: &str, v4: &[&str], v6: &[&str]) -> WorkloadEndpoint {
    WorkloadEndpoint {
        state: "active".into(),
        name: iface.into(),
        mac: "ee:ee:ee:ee:ee:ee".into(),
        profile_ids: strings(&["kns.default"]),
        ipv4_nets: strings(v4),
        ipv6_nets: strings(v6),
        ..Default::default()
    }
}

/// A rule with `action` alone: it applies to every packet.
fn bare(action: &str) -> Rule {
    Rule {
        action: action.into(),
        ..Default::default()
    }
}

/// Allows `protocol` traffic to the port ranges `dst`.
fn allow_to(protocol: &str, dst: &[(i32, i32)]) -> Rule {
    Rule {
        action: "allow".into(),
        protocol: proto(protocol),
        dst_ports: ports(dst),
        ..Default::default()
    }
}

fn allow_all_profile() -> Profile {
    Profile {
        inbound_rules: vec![bare("allow")],
        outbound_rules: vec![bare("allow")],
    }
}

fn v4_only() -> RulesConfig {
    RulesConfig {
        ipv6_enabled: false,
        ..RulesConfig::default()
    }
}

/// §18: an IPv4 workload `cali123` with one ingress GNP `allow-tcp-80` in tier `default` and the
/// profile `kns.default`, default configuration.
fn worked_example() -> Model {
    let mut m = Model::new(v4_only());
    let mut w = workload("cali123", &["10.65.0.2/32"], &[]);
    w.tiers = vec![tier("default", &[gnp("allow-tcp-80")], &[], "Deny")];
    m.workloads.insert(wep_id("pod-a"), w);
    m.policies.insert(
        gnp("allow-tcp-80"),
        Policy {
            inbound_rules: vec![allow_to("tcp", &[(80, 80)])],
            tier: "default".into(),
            ..Default::default()
        },
    );
    m.profiles.insert("kns.default".into(), allow_all_profile());
    m
}

/// A workload with two tiers: `security` ends in Pass, `default` ends in the default deny; a
/// staged policy is never programmed. It also has QoS packet-rate and connection limits.
fn two_tiers() -> Model {
    two_tiers_with(v4_only())
}

/// [`two_tiers`] with flow logs on: every allow, pass and deny, each tier's end and the drop
/// after the profiles log to NFLOG groups 1 and 2 with Felix's prefixes.
fn flow_logs() -> Model {
    two_tiers_with(RulesConfig {
        flow_logs: true,
        ..v4_only()
    })
}

fn two_tiers_with(cfg: RulesConfig) -> Model {
    let mut m = Model::new(cfg);
    let mut w = workload("cali-two", &["10.65.0.3/32"], &[]);
    w.qos_controls = Some(felix_api::types::QoSControls {
        ingress_packet_rate: 1000,
        ingress_packet_burst: 20,
        egress_max_connections: 100,
        ..Default::default()
    });
    let staged = PolicyId {
        name: "try-this".into(),
        namespace: String::new(),
        kind: "StagedGlobalNetworkPolicy".into(),
    };
    w.tiers = vec![
        tier(
            "security",
            &[gnp("security.block-bad"), staged.clone()],
            &[gnp("security.block-bad")],
            "Pass",
        ),
        tier(
            "default",
            &[knp("default", "allow-web")],
            &[knp("default", "allow-web")],
            "",
        ),
    ];
    m.workloads.insert(wep_id("two"), w);
    m.policies.insert(
        gnp("security.block-bad"),
        Policy {
            inbound_rules: vec![
                Rule {
                    action: "deny".into(),
                    src_net: strings(&["192.0.2.0/24"]),
                    ..Default::default()
                },
                bare("pass"),
            ],
            outbound_rules: vec![bare("next-tier")],
            tier: "security".into(),
            ..Default::default()
        },
    );
    m.policies.insert(
        staged,
        Policy {
            inbound_rules: vec![bare("deny")],
            ..Default::default()
        },
    );
    m.policies.insert(
        knp("default", "allow-web"),
        Policy {
            inbound_rules: vec![allow_to("tcp", &[(80, 80), (443, 443)])],
            outbound_rules: vec![bare("allow")],
            tier: "default".into(),
            ..Default::default()
        },
    );
    m.profiles.insert("kns.default".into(), allow_all_profile());
    m
}

/// A host endpoint `eth0` with normal, pre-DNAT, untracked and forward tiers, default failsafes,
/// plus the all-interfaces endpoint `*` with a profile.
fn host_endpoint() -> Model {
    let mut m = Model::new(v4_only());
    m.host_endpoints.insert(
        HostEndpointId {
            endpoint_id: "node1-eth0".into(),
        },
        HostEndpoint {
            name: "eth0".into(),
            profile_ids: strings(&["host-profile"]),
            tiers: vec![tier("default", &[gnp("host-ssh")], &[gnp("host-out")], "")],
            pre_dnat_tiers: vec![tier("default", &[gnp("prednat-block")], &[], "")],
            untracked_tiers: vec![tier(
                "default",
                &[gnp("untracked-dns")],
                &[gnp("untracked-dns")],
                "",
            )],
            forward_tiers: vec![tier("default", &[gnp("fwd-allow")], &[], "")],
            expected_ipv4_addrs: strings(&["192.0.2.10"]),
            ..Default::default()
        },
    );
    m.host_endpoints.insert(
        HostEndpointId {
            endpoint_id: "node1-all".into(),
        },
        HostEndpoint {
            name: "*".into(),
            profile_ids: strings(&["host-profile"]),
            ..Default::default()
        },
    );
    m.policies.insert(
        gnp("host-ssh"),
        Policy {
            inbound_rules: vec![allow_to("tcp", &[(22, 22)])],
            ..Default::default()
        },
    );
    m.policies.insert(
        gnp("host-out"),
        Policy {
            outbound_rules: vec![bare("allow")],
            ..Default::default()
        },
    );
    m.policies.insert(
        gnp("prednat-block"),
        Policy {
            inbound_rules: vec![Rule {
                action: "deny".into(),
                protocol: proto("tcp"),
                dst_ports: ports(&[(30000, 32767)]),
                not_src_net: strings(&["10.0.0.0/8"]),
                ..Default::default()
            }],
            pre_dnat: true,
            ..Default::default()
        },
    );
    m.policies.insert(
        gnp("untracked-dns"),
        Policy {
            inbound_rules: vec![Rule {
                action: "allow".into(),
                protocol: proto("udp"),
                src_ports: ports(&[(53, 53)]),
                ..Default::default()
            }],
            outbound_rules: vec![allow_to("udp", &[(53, 53)])],
            untracked: true,
            ..Default::default()
        },
    );
    m.policies.insert(
        gnp("fwd-allow"),
        Policy {
            inbound_rules: vec![Rule {
                action: "allow".into(),
                dst_net: strings(&["10.65.0.0/16"]),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    m.profiles
        .insert("host-profile".into(), allow_all_profile());
    m
}

/// NAT outgoing with a port range, IPIP, VXLAN and Wireguard tunnels, exclusions of host IPs
/// and an outgoing interface filter, both families.
fn nat_outgoing() -> Model {
    let mut m = Model::new(RulesConfig {
        nat_port_range: Some((32768, 60999)),
        masq_fully_random: true,
        nat_outgoing_exclusions: NatOutgoingExclusions::IpPoolsAndHostIps,
        nat_outgoing_iface_filter: Some("eth+".into()),
        ipip_enabled: true,
        vxlan_enabled: true,
        tunnel_ifaces_v4: strings(&["tunl0", "vxlan.calico", "wireguard.cali"]),
        wireguard_port: Some(51820),
        wireguard_port_v6: Some(51821),
        tunnel_ifaces_v6: strings(&["wg-v6.cali"]),
        ..RulesConfig::default()
    });
    let pool = |cidr: &str, masq: bool| IpamPool {
        cidr: cidr.into(),
        masquerade: masq,
        ipip_mode: "Always".into(),
        vxlan_mode: "Never".into(),
        allowed_uses: strings(&["Workload", "Tunnel"]),
    };
    m.pools.insert("pool-a".into(), pool("10.65.0.0/16", true));
    m.pools.insert("pool-b".into(), pool("10.66.0.0/16", false));
    m.pools
        .insert("pool-c".into(), pool("10.65.128.0/17", true));
    m.pools.insert("pool-v6".into(), pool("fd00:65::/48", true));
    m.hosts.insert(
        "node1".into(),
        HostMetadataUpdate {
            hostname: "node1".into(),
            ipv4_addr: "192.0.2.10/24".into(),
            ipv6_addr: "2001:db8::10".into(),
            ..Default::default()
        },
    );
    m.hosts.insert(
        "node2".into(),
        HostMetadataUpdate {
            hostname: "node2".into(),
            ipv4_addr: "192.0.2.11".into(),
            ..Default::default()
        },
    );
    m.vteps.insert(
        "node2".into(),
        VxlanTunnelEndpointUpdate {
            node: "node2".into(),
            mac: "66:00:00:00:00:02".into(),
            ipv4_addr: "10.65.1.0".into(),
            parent_device_ip: "192.0.2.11".into(),
            ..Default::default()
        },
    );
    m
}

/// Floating IPs (v4 and v6), with two workloads claiming one external IP.
fn floating_ips() -> Model {
    let mut m = Model::new(RulesConfig {
        floating_ips_enabled: true,
        ..RulesConfig::default()
    });
    let nat = |e: &str, i: &str| NatInfo {
        ext_ip: e.into(),
        int_ip: i.into(),
    };
    let mut a = workload("calia", &["10.65.0.10/32"], &["fd00:65::10/128"]);
    a.ipv4_nat = vec![nat("172.16.0.10", "10.65.0.10")];
    a.ipv6_nat = vec![nat("2001:db8:f::10", "fd00:65::10")];
    let mut b = workload("calib", &["10.65.0.11/32"], &[]);
    b.ipv4_nat = vec![
        nat("172.16.0.11", "10.65.0.11"),
        nat("172.16.0.10", "10.65.0.11"),
    ];
    m.workloads.insert(wep_id("a"), a);
    m.workloads.insert(wep_id("b"), b);
    m.profiles.insert("kns.default".into(), allow_all_profile());
    m
}

/// One policy using every match field, each negation, several CIDRs and ports (shared named
/// sets), ports OR named ports (a scratch-mark block), every action, a log rate limit, rule
/// annotations, and the IP sets it references.
fn every_match() -> Model {
    let mut m = Model::new(RulesConfig {
        log_rate_limit: Some(RateLimit {
            rate: 10,
            unit_secs: 60,
            burst: 5,
        }),
        ..RulesConfig::default()
    });
    let mut w = workload("cali-every", &["10.65.0.20/32"], &["fd00:65::20/128"]);
    w.tiers = vec![tier("default", &[gnp("every")], &[gnp("every")], "")];
    w.allow_spoofed_source_prefixes = strings(&["10.99.0.0/16"]);
    m.workloads.insert(wep_id("every"), w);
    for (id, kind, members) in [
        (
            "s:src",
            IpSetType::Net,
            vec!["10.1.0.0/16", "10.1.2.0/24", "fd00:1::/64"],
        ),
        ("s:dst", IpSetType::Ip, vec!["10.2.0.1", "fd00:2::1"]),
        ("s:notsrc", IpSetType::Net, vec!["10.3.0.0/16"]),
        (
            "s:notdst",
            IpSetType::Net,
            vec!["10.4.0.0/16", "fd00:4::/64"],
        ),
        (
            "n:web",
            IpSetType::IpAndPort,
            vec!["10.5.0.1,tcp:8080", "fd00:5::1,tcp:8080"],
        ),
        ("n:api", IpSetType::IpAndPort, vec!["10.5.0.2,tcp:9090"]),
        ("n:notsrc", IpSetType::IpAndPort, vec!["10.6.0.1,tcp:1234"]),
        ("svc:abc", IpSetType::IpAndPort, vec!["10.96.0.10,udp:53"]),
    ] {
        m.ipsets.insert(id.into(), Members::parse(kind, members));
    }
    let every = Rule {
        action: "allow".into(),
        protocol: proto("tcp"),
        src_net: strings(&[
            "10.10.0.0/16",
            "10.11.0.0/16",
            "10.10.5.0/24",
            "fd00:10::/64",
        ]),
        src_ports: ports(&[(1024, 65535)]),
        src_ip_set_ids: strings(&["s:src"]),
        dst_net: strings(&["10.20.0.0/16"]),
        dst_ports: ports(&[(80, 80), (443, 443), (8000, 8080)]),
        dst_named_port_ip_set_ids: strings(&["n:web", "n:api"]),
        dst_ip_set_ids: strings(&["s:dst"]),
        dst_ip_port_set_ids: strings(&["svc:abc"]),
        not_protocol: None,
        not_src_net: strings(&["10.10.99.0/24"]),
        not_src_ports: ports(&[(1, 1023)]),
        not_src_named_port_ip_set_ids: strings(&["n:notsrc"]),
        not_dst_net: strings(&["10.20.99.0/24", "10.20.98.0/24"]),
        not_dst_ports: ports(&[(8081, 8081), (8443, 8443)]),
        not_src_ip_set_ids: strings(&["s:notsrc"]),
        not_dst_ip_set_ids: strings(&["s:notdst"]),
        metadata: Some(RuleMetadata {
            annotations: [("owner".to_string(), "team-a".to_string())].into(),
        }),
        ..Default::default()
    };
    let icmp = Rule {
        action: "deny".into(),
        protocol: proto("icmp"),
        icmp: Some(Icmp::IcmpTypeCode(IcmpTypeAndCode { r#type: 3, code: 4 })),
        ..Default::default()
    };
    let not_icmp = Rule {
        action: "allow".into(),
        protocol: proto("icmp"),
        not_icmp: Some(NotIcmp::NotIcmpTypeCode(IcmpTypeAndCode {
            r#type: 8,
            code: 0,
        })),
        ..Default::default()
    };
    let icmp_type = Rule {
        action: "pass".into(),
        protocol: proto("icmp"),
        icmp: Some(Icmp::IcmpType(8)),
        ..Default::default()
    };
    let not_proto = Rule {
        action: "log".into(),
        not_protocol: proto("udp"),
        ip_version: 4,
        ..Default::default()
    };
    let numeric_proto = Rule {
        action: "deny".into(),
        protocol: Some(Protocol {
            number_or_name: Some(NumberOrName::Number(47)),
        }),
        src_named_port_ip_set_ids: Vec::new(),
        ..Default::default()
    };
    let src_block = Rule {
        action: "allow".into(),
        protocol: proto("udp"),
        src_ports: ports(&[(53, 53)]),
        src_named_port_ip_set_ids: strings(&["n:api"]),
        ..Default::default()
    };
    m.policies.insert(
        gnp("every"),
        Policy {
            inbound_rules: vec![
                every.clone(),
                icmp,
                not_icmp,
                icmp_type,
                not_proto,
                numeric_proto,
            ],
            outbound_rules: vec![src_block, every],
            ..Default::default()
        },
    );
    m.profiles.insert("kns.default".into(), allow_all_profile());
    m
}

/// An admin-down workload: both chains are a single deny, and it still gets dispatch entries.
fn admin_down() -> Model {
    let mut m = Model::new(v4_only());
    let mut w = workload("cali-down", &["10.65.0.30/32"], &[]);
    w.state = "down".into();
    w.tiers = vec![tier("default", &[gnp("allow-tcp-80")], &[], "")];
    m.workloads.insert(wep_id("down"), w);
    m.profiles.insert("kns.default".into(), allow_all_profile());
    m
}

/// IPv6: a dual-stack workload, v6 CIDRs and ICMPv6 in policy, mixed-family IP sets, v6 service
/// CIDRs, VXLAN v6, reject as the deny action and DefaultEndpointToHostAction=Return.
fn ipv6() -> Model {
    let mut m = Model::new(RulesConfig {
        filter_deny_action: DenyAction::Reject,
        endpoint_to_host_action: felix_nft_rules::EndpointToHostAction::Return,
        vxlan_enabled_v6: true,
        ..RulesConfig::default()
    });
    let mut w = workload("cali-six", &["10.65.0.40/32"], &["fd00:65::40/128"]);
    w.tiers = vec![tier(
        "default",
        &[gnp("v6-policy")],
        &[gnp("v6-policy")],
        "",
    )];
    m.workloads.insert(wep_id("six"), w);
    m.ipsets.insert(
        "s:mixed".into(),
        Members::parse(
            IpSetType::Net,
            ["10.7.0.0/16", "fd00:7::/64", "fd00:7::/48"],
        ),
    );
    m.policies.insert(
        gnp("v6-policy"),
        Policy {
            inbound_rules: vec![
                Rule {
                    action: "allow".into(),
                    protocol: proto("icmpv6"),
                    icmp: Some(Icmp::IcmpType(128)),
                    ..Default::default()
                },
                Rule {
                    action: "allow".into(),
                    src_net: strings(&["fd00:65::/48", "10.65.0.0/16"]),
                    src_ip_set_ids: strings(&["s:mixed"]),
                    ..Default::default()
                },
                Rule {
                    action: "deny".into(),
                    ip_version: 6,
                    not_dst_net: strings(&["fd00:66::/48"]),
                    ..Default::default()
                },
            ],
            outbound_rules: vec![bare("allow")],
            ..Default::default()
        },
    );
    m.profiles.insert("kns.default".into(), allow_all_profile());
    let bgp = GlobalBgpConfigUpdate {
        service_cluster_cidrs: strings(&["10.96.0.0/12", "fd00:96::/108"]),
        service_external_cidrs: strings(&["203.0.113.0/24"]),
        ..Default::default()
    };
    m.apply(&ToDataplane {
        sequence_number: 0,
        payload: Some(felix_api::types::to_dataplane::Payload::GlobalBgpConfigUpdate(bgp)),
    });
    m
}

fn scenarios() -> BTreeMap<&'static str, Model> {
    BTreeMap::from([
        ("worked_example", worked_example()),
        ("two_tiers", two_tiers()),
        ("flow_logs", flow_logs()),
        ("host_endpoint", host_endpoint()),
        ("nat_outgoing", nat_outgoing()),
        ("floating_ips", floating_ips()),
        ("every_match", every_match()),
        ("admin_down", admin_down()),
        ("ipv6", ipv6()),
    ])
}

/// One test per scenario, `NAME: SCENARIO`: its rendered ruleset matches the snapshot named after
/// the test.
macro_rules! snapshot_tests {
    ($($name:ident: $scenario:ident,)*) => {$(
        #[test]
        fn $name() {
            insta::assert_snapshot!(render_nft(&$scenario()).unwrap());
        }
    )*};
}

snapshot_tests! {
    snapshot_worked_example: worked_example,
    snapshot_two_tiers: two_tiers,
    snapshot_flow_logs: flow_logs,
    snapshot_host_endpoint: host_endpoint,
    snapshot_nat_outgoing: nat_outgoing,
    snapshot_floating_ips: floating_ips,
    snapshot_every_match: every_match,
    snapshot_admin_down: admin_down,
    snapshot_ipv6: ipv6,
}

/// What the kernel holds, read with `nft -j` (a test-only oracle): per chain, the rule comments
/// in order; and the set names.
fn kernel_view(json: &serde_json::Value) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    let mut chains: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut sets = Vec::new();
    for item in json["nftables"].as_array().into_iter().flatten() {
        if let Some(c) = item.get("chain") {
            chains
                .entry(c["name"].as_str().unwrap_or_default().to_string())
                .or_default();
        }
        if let Some(r) = item.get("rule") {
            chains
                .entry(r["chain"].as_str().unwrap_or_default().to_string())
                .or_default()
                .push(r["comment"].as_str().unwrap_or_default().to_string());
        }
        for k in ["set", "map"] {
            if let Some(s) = item.get(k) {
                sets.push(s["name"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    sets.sort();
    (chains, sets)
}

fn our_view(t: &Table) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    let chains = t
        .chains
        .values()
        .map(|c| {
            (
                c.name.clone(),
                c.rules
                    .iter()
                    .map(|r| r.comment.clone().unwrap_or_default())
                    .collect(),
            )
        })
        .collect();
    (chains, t.sets.keys().cloned().collect())
}

/// Writes `text` to a file and loads it with `nft -f` (installed for tests) in the calling
/// thread's network namespace.
fn nft_load(text: &str) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ruleset.nft");
    std::fs::write(&path, text).expect("writing ruleset");
    Command::new("nft")
        .arg("-f")
        .arg(&path)
        .output()
        .expect("running nft -f")
}

/// Every scenario's text is accepted by the kernel (`nft -f` in a private netns), and what the
/// kernel then holds has exactly our chains, rules (by identity comment, in order) and sets.
#[test]
fn kernel_accepts_every_scenario() {
    for (name, model) in scenarios() {
        let text = render_nft(&model).unwrap();
        let tables = render(&model).unwrap();
        let result = common::in_private_netns(move || {
            let load = nft_load(&text);
            let mut views = Vec::new();
            for t in &tables {
                let out = Command::new("nft")
                    .args(["-j", "list", "table", t.family.name(), &t.name])
                    .output()
                    .expect("running nft -j");
                views.push(String::from_utf8_lossy(&out.stdout).to_string());
            }
            (load, views)
        });
        let (load, views) = result;
        assert!(
            load.status.success(),
            "scenario {name}: the kernel refused the ruleset:\n{}",
            String::from_utf8_lossy(&load.stderr)
        );
        for (t, json) in render(&model).unwrap().iter().zip(views) {
            let json: serde_json::Value = serde_json::from_str(&json)
                .unwrap_or_else(|e| panic!("scenario {name}: nft -j output: {e}"));
            let (kchains, ksets) = kernel_view(&json);
            let (ochains, osets) = our_view(t);
            assert_eq!(ksets, osets, "scenario {name} {}: sets", t.family.name());
            assert_eq!(
                kchains.keys().collect::<Vec<_>>(),
                ochains.keys().collect::<Vec<_>>(),
                "scenario {name} {}: chains",
                t.family.name()
            );
            for (chain, rules) in &ochains {
                assert_eq!(
                    &kchains[chain],
                    rules,
                    "scenario {name} {}: rules of {chain}",
                    t.family.name()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lockstep of text and expressions: what nft compiles our text into == our expressions.
// ---------------------------------------------------------------------------------------------

use nf_tables::print;

/// One set element in `nft --debug=netlink` notation.
fn debug_element(e: &nf_tables::model::Element) -> String {
    let data = match e.data.as_deref() {
        Some(nf_tables::model::ElemData::Verdict(v)) => format!("{} ", print::verdict(v)),
        Some(nf_tables::model::ElemData::Value(b)) => format!("{} ", print::data(b)),
        None => String::new(),
    };
    format!(
        "element {}  : {data}{} [end]",
        print::data(&e.key).replace("0x", ""),
        e.flags
    )
}

/// Set elements by set name from `nft --debug=netlink` output (the line after the set's
/// second header line).
fn parse_debug_elements(out: &str) -> BTreeMap<String, Vec<String>> {
    let mut sets = BTreeMap::new();
    let mut last_header: Option<String> = None;
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix('\t') {
            if let Some(name) = &last_header {
                let elems: Vec<String> = rest
                    .split("\telement ")
                    .map(|e| {
                        let e = e.trim_end();
                        if e.starts_with("element ") {
                            e.to_string()
                        } else {
                            format!("element {e}")
                        }
                    })
                    .collect();
                sets.insert(name.clone(), elems);
            }
            continue;
        }
        let parts: Vec<&str> = line.split(' ').collect();
        last_header = (parts.len() == 3 && parts[1] == "calico").then(|| parts[0].to_string());
    }
    sets
}

/// Rules per chain (each a list of expression lines) from `nft --debug=netlink` output, keyed by
/// (family, "table chain").
fn parse_debug(out: &str) -> BTreeMap<(String, String), Vec<Vec<String>>> {
    let mut chains: BTreeMap<(String, String), Vec<Vec<String>>> = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in out.lines() {
        if let Some(e) = line.strip_prefix("  [ ") {
            if let Some(key) = &current {
                if let Some(rule) = chains.get_mut(key).and_then(|r| r.last_mut()) {
                    rule.push(format!("[ {}", e.trim_end()));
                }
            }
            continue;
        }
        let parts: Vec<&str> = line.split(' ').collect();
        let ours = parts.len() == 3
            && [felix_nft_rules::OWNER, felix_nft_rules::SIDE_TABLE].contains(&parts[1]);
        if ours && (parts[0] == "ip" || parts[0] == "ip6") {
            let key = (parts[0].to_string(), format!("{} {}", parts[1], parts[2]));
            chains.entry(key.clone()).or_default().push(Vec::new());
            current = Some(key);
        } else if !line.starts_with("  userdata") {
            current = None;
        }
    }
    chains
}

/// For every rule of every scenario, the expressions `nft` 1.0.6 compiles our text into are
/// exactly the expressions we built (printed in libnftnl's notation by `nft::print`): text and
/// object model are in lockstep, so committing either gives the same kernel state.
#[test]
fn text_and_expressions_are_in_lockstep() {
    for (name, model) in scenarios() {
        let text = render_nft(&model).unwrap();
        let out = common::in_private_netns(move || {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("ruleset.nft");
            std::fs::write(&path, &text).expect("writing ruleset");
            Command::new("nft")
                .args(["--debug=netlink", "-c", "-f"])
                .arg(&path)
                .output()
                .expect("running nft (installed for tests)")
        });
        assert!(
            out.status.success(),
            "scenario {name}: nft -c refused:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let theirs = parse_debug(&stdout);
        let mut compared = 0;
        // Set elements. nft's debug lines do not name the family; set names differ per family
        // (cali4…/cali6…) and the dispatch maps, which share names, hold the same elements in
        // both tables. The side tables' maps share those names too; they are empty here (every
        // endpoint is in the main table) and are left out of this comparison.
        let their_sets = parse_debug_elements(&stdout);
        for t in render(&model).unwrap() {
            if t.name == felix_nft_rules::SIDE_TABLE {
                continue;
            }
            for set in t.sets.values() {
                let ours: Vec<String> = set.elements.iter().map(debug_element).collect();
                let empty = Vec::new();
                let got = their_sets.get(&set.name).unwrap_or(&empty);
                assert_eq!(&ours, got, "scenario {name}: elements of {}", set.name);
            }
        }
        for t in render(&model).unwrap() {
            for c in t.chains.values() {
                let ours: Vec<Vec<String>> = c
                    .rules
                    .iter()
                    .map(|r| r.exprs.iter().map(print::expr).collect())
                    .collect();
                let key = (
                    t.family.name().to_string(),
                    format!("{} {}", t.name, c.name),
                );
                let empty = Vec::new();
                let got = theirs.get(&key).unwrap_or(&empty);
                for (i, (o, g)) in ours.iter().zip(got).enumerate() {
                    assert_eq!(o, g, "scenario {name}: {} {} rule {i}", key.0, key.1);
                }
                assert_eq!(
                    ours.len(),
                    got.len(),
                    "scenario {name}: rule count of {key:?}"
                );
                compared += ours.len();
            }
        }
        assert!(
            compared > 100,
            "scenario {name}: only {compared} rules compared"
        );
    }
}

#[test]
fn every_scenario_commits_through_our_codec_and_reads_back_unchanged() {
    // The same rendered tables, this time through our own nf_tables codec (one batch), read back
    // with our decoder: nothing left to change. Then the kernel's own view of what we committed
    // (`nft -s list ruleset`) must equal its view of `nft -f` on the rendered text: expressions
    // and text were built in lockstep, so both paths program the same ruleset.
    use nf_tables::reconcile::{plan, sync, Nft, SyncOptions, TableOwnership};
    for (name, model) in scenarios() {
        let tables = render(&model).unwrap();
        let text = render_nft(&model).unwrap();
        let (ours, leftover, theirs) = common::in_private_netns(move || {
            let mut nft = Nft::open().expect("nf_tables socket in the private namespace");
            let opts = SyncOptions {
                ownership: TableOwnership::Off,
                ..SyncOptions::default()
            };
            sync(&mut nft, &tables, &opts).expect("committing the rendered tables");
            let (_, plans) = plan(&mut nft, &tables, false).expect("reading back");
            let leftover: usize = plans.iter().map(|p| p.ops.len()).sum();
            let nft_oracle = |args: &[&str]| {
                let out =
                    common::oracle_stdout(Command::new("nft").args(args), &format!("nft {args:?}"));
                String::from_utf8_lossy(&out).into_owned()
            };
            let list = || nft_oracle(&["-s", "list", "ruleset"]);
            let ours = list();
            nft_oracle(&["flush", "ruleset"]);
            let load = nft_load(&text);
            assert!(
                load.status.success(),
                "nft -f: {}",
                String::from_utf8_lossy(&load.stderr)
            );
            (ours, leftover, list())
        });
        assert_eq!(
            leftover, 0,
            "scenario {name}: read-back differs from what we committed"
        );
        assert!(
            in_name_order(&ours) == in_name_order(&theirs),
            "scenario {name}: our batch and `nft -f` of the same text program different rulesets"
        );
    }
}

/// A `nft list ruleset` text with each table's sets, maps and chains in name order: the
/// listing follows the order they were created in, which is not part of what a ruleset is (we
/// create the sets most rules look up first).
fn in_name_order(listing: &str) -> String {
    let mut out = String::new();
    let mut blocks: Vec<String> = Vec::new();
    let mut block = String::new();
    for line in listing.lines() {
        if line.starts_with("table ") || line == "}" {
            if !block.is_empty() {
                blocks.push(std::mem::take(&mut block));
            }
            blocks.sort();
            out.extend(blocks.drain(..));
            out.push_str(line);
            out.push('\n');
        } else if line.is_empty() {
            if !block.is_empty() {
                blocks.push(std::mem::take(&mut block));
            }
        } else {
            block.push_str(line);
            block.push('\n');
        }
    }
    out
}
