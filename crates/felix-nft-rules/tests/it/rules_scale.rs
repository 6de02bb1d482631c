//! Rendering at scale keeps the kernel-cheap shape (docs/design.md, cost model): no anonymous
//! sets, one shared set per distinct port or CIDR list however many rules use it, and a load
//! that the kernel accepts in one `nft -f` inside a private namespace. Prints the timings.
//!
//! Size: `RULES_SCALE_ENDPOINTS` (default 200) workloads, a fifth as many policies.

use testkit as common;

use std::process::Command;
use std::time::Instant;

use felix_api::types::{
    protocol::NumberOrName, IpSetType, Policy, PolicyId, PortRange, Protocol, Rule, TierInfo,
    WorkloadEndpoint, WorkloadEndpointId,
};
use felix_nft_rules::{render, render_nft, Members, Model, RulesConfig};
use nf_tables::model::{set_flags, Family};

fn model(endpoints: usize) -> Model {
    let policies = (endpoints / 5).max(1);
    let mut m = Model::new(RulesConfig::default());
    let port_lists: [&[(i32, i32)]; 3] = [
        &[(80, 80), (443, 443)],
        &[(53, 53), (8000, 8009)],
        &[(22, 22)],
    ];
    for s in 0..policies {
        m.ipsets.insert(
            format!("s:sel{s}"),
            Members::parse(
                IpSetType::Net,
                (0..20)
                    .map(|i| format!("10.{}.{}.0/24", s % 250, i))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str),
            ),
        );
    }
    for p in 0..policies {
        let rules = (0..5)
            .map(|r| Rule {
                action: if r == 4 {
                    "deny".into()
                } else {
                    "allow".into()
                },
                protocol: Some(Protocol {
                    number_or_name: Some(NumberOrName::Name("tcp".into())),
                }),
                src_ip_set_ids: vec![format!("s:sel{}", (p + r) % policies)],
                dst_ports: port_lists[(p + r) % 3]
                    .iter()
                    .map(|&(first, last)| PortRange { first, last })
                    .collect(),
                ..Default::default()
            })
            .collect::<Vec<_>>();
        m.policies.insert(
            PolicyId {
                name: format!("pol{p}"),
                namespace: "ns".into(),
                kind: "NetworkPolicy".into(),
            },
            Policy {
                inbound_rules: rules.clone(),
                outbound_rules: rules,
                ..Default::default()
            },
        );
    }
    m.profiles
        .insert("kns.ns".into(), crate::allow_all_profile());
    for e in 0..endpoints {
        let ids: Vec<PolicyId> = (0..3)
            .map(|k| PolicyId {
                name: format!("pol{}", (e + k) % policies),
                namespace: "ns".into(),
                kind: "NetworkPolicy".into(),
            })
            .collect();
        m.workloads.insert(
            WorkloadEndpointId {
                orchestrator_id: "k8s".into(),
                workload_id: format!("ns/pod{e}"),
                endpoint_id: "eth0".into(),
            },
            WorkloadEndpoint {
                state: "active".into(),
                name: format!("cali{e:011x}"),
                profile_ids: vec!["kns.ns".into()],
                ipv4_nets: vec![format!("10.65.{}.{}/32", e / 250, e % 250)],
                tiers: vec![TierInfo {
                    name: "default".into(),
                    ingress_policies: ids.clone(),
                    egress_policies: ids,
                    default_action: String::new(),
                }],
                ..Default::default()
            },
        );
    }
    m
}

#[test]
fn large_model_has_no_anonymous_sets_and_loads_in_one_transaction() {
    let endpoints: usize = std::env::var("RULES_SCALE_ENDPOINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let m = model(endpoints);

    let t0 = Instant::now();
    let tables = render(&m).unwrap();
    let render_time = t0.elapsed();
    let text = render_nft(&m).unwrap();

    let mut rules = 0;
    for t in tables.iter().filter(|t| t.name == felix_nft_rules::OWNER) {
        rules += t.chains.values().map(|c| c.rules.len()).sum::<usize>();
        assert!(t.sets.values().all(|s| s.flags & set_flags::ANONYMOUS == 0));
        // Three distinct port lists, two of them multi-valued: exactly two shared port sets,
        // however many rules use them.
        let port_sets = t
            .sets
            .keys()
            .filter(|n| n.starts_with("cali4p-") || n.starts_with("cali6p-"))
            .count();
        if t.family == Family::Ip {
            assert_eq!(port_sets, 2);
        }
    }
    // No rule text contains an inline set literal (`{ … }`), i.e. nothing nft would turn into
    // an anonymous set.
    for line in text.lines().filter(|l| l.contains(" comment \"cali:")) {
        assert!(!line.contains('{'), "inline set in {line}");
    }

    let (status, load_time) = common::in_private_netns(move || {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ruleset.nft");
        std::fs::write(&path, &text).expect("writing ruleset");
        let t0 = Instant::now();
        let out = Command::new("nft")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("running nft (installed for tests)");
        (out, t0.elapsed())
    });
    assert!(
        status.status.success(),
        "kernel refused: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    println!(
        "{endpoints} endpoints, {} policies: {rules} rules in {} tables, render {:?}, nft -f load {:?}",
        (endpoints / 5).max(1),
        tables.len(),
        render_time,
        load_time
    );
}
