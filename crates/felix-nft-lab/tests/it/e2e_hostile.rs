//! Hostile inputs against the running daemon, proven with traffic: ids the kernel could not hold
//! as names are programmed all the same (and traffic follows the policy), two IP sets whose ids
//! share a long prefix stay two sets, and a deny rule the renderer could not express is refused
//! whole instead of being left out (which would let through what it denies).

use crate::e2e_common;

use std::net::Ipv4Addr;

use e2e_common::*;
use felix_nft_lab::testbed::probe::{Proto::*, Verdict::*};
use felix_nft_lab::testbed::topology::Topology;
use serde_json::json;

const A: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 2);
const C: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 3);
const WEB: u16 = 8080;
const OTHER: u16 = 9090;

fn listen(topo: &Topology) -> Servers {
    serve(topo, &[WEB, OTHER], &[])
}

/// A policy with a namespace, any kind, by JSON id.
fn policy_id(id: serde_json::Value, inbound: serde_json::Value) -> serde_json::Value {
    json!({"active_policy_update": {"id": id, "policy": {"inbound_rules": inbound, "outbound_rules": [{"action": "allow"}]}}})
}

fn tier_of(name: &str, ids: &[serde_json::Value]) -> serde_json::Value {
    json!({"name": name, "ingress_policies": ids, "egress_policies": ids, "default_action": "Deny"})
}

#[test]
fn ip_sets_sharing_a_long_prefix_stay_apart() {
    // Felix cuts set names to 31 characters; two ids with a common prefix then named one set,
    // and a policy allowing one matched the other's members.
    let (topo, _srv, mut agent) = three_v4_with_agent("fnt-hx-sets", [A, B, C], listen);
    let (a, b, c) = abc(&topo);
    let common = format!("s:{}", "x".repeat(40));
    let (s1, s2) = (format!("{common}a1"), format!("{common}a2"));
    agent.send_all(&[
        allow_all_profile(),
        ipset(&s1, "IP", &[A.to_string()]),
        ipset(&s2, "IP", &[C.to_string()]),
        policy_id(
            json!({"name": "from-s1", "kind": "GlobalNetworkPolicy"}),
            json!([{"action": "allow", "src_ip_set_ids": [s1]}]),
        ),
        policy_id(
            json!({"name": "from-s2", "kind": "GlobalNetworkPolicy"}),
            json!([{"action": "allow", "src_ip_set_ids": [s2]}]),
        ),
        wep(a, &["allow-all"], json!([])),
        wep(c, &["allow-all"], json!([])),
        wep_ingress(b, &["from-s1"]),
        in_sync(),
    ]);
    agent.expect_matrix(
        "b admits the members of s1 only",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(c), v4(b), Tcp, WEB, Drop),
        ],
    );
    // The other set, the other way round.
    agent.send(&wep_ingress(b, &["from-s2"]));
    agent.expect_matrix(
        "b admits the members of s2 only",
        &[
            flow(src(a), v4(b), Tcp, WEB, Drop),
            flow(src(c), v4(b), Tcp, WEB, Pass),
        ],
    );
    // A member moves between the sets by delta: each set changes alone.
    agent.send(&ipset_delta(&s2, &[A.to_string()], &[C.to_string()]));
    agent.expect_matrix(
        "a moved into s2",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(c), v4(b), Tcp, WEB, Drop),
        ],
    );
    let ruleset = nft_ruleset(topo.host_netns_name());
    for s in [&s1, &s2] {
        let name = felix_nft_rules::names::ipset_name(nf_tables::model::Family::Ip, s);
        assert!(ruleset.contains(&name), "set {name} is not in the ruleset");
    }
    agent.stop_cleanly();
}

#[test]
fn names_the_kernel_could_not_hold_are_programmed_and_enforced() {
    // A profile id of 240 characters, a policy name of 237 and a tier of 300 made chain names
    // over the kernel's limit; a NUL inside an id made the kernel store another name. Each
    // wedged every later apply. Now each is named within the limits and enforced.
    let (topo, _srv, mut agent) = three_v4_with_agent("fnt-hx-names", [A, B, C], listen);
    let (a, b, c) = abc(&topo);
    let long_profile = "p".repeat(240);
    let nul_profile = "web\u{0}evil";
    let long_policy = json!({"name": "q".repeat(237), "kind": "GlobalNetworkPolicy"});
    let nul_policy = json!({"name": "a\u{0}b", "namespace": "ns/x", "kind": "NetworkPolicy"});
    let long_tier = "t".repeat(300);
    agent.send_all(&[
        profile(
            &long_profile,
            json!([{"action": "allow"}]),
            json!([{"action": "allow"}]),
        ),
        profile(
            nul_profile,
            json!([{"action": "allow", "protocol": proto("tcp"), "dst_ports": ports(&[WEB])}]),
            json!([{"action": "allow"}]),
        ),
        policy_id(
            long_policy.clone(),
            json!([{"action": "deny", "protocol": proto("tcp"), "dst_ports": ports(&[OTHER])},
                   {"action": "log"}, {"action": "pass"}]),
        ),
        policy_id(
            nul_policy.clone(),
            json!([{"action": "allow", "src_net": [format!("{A}/32")]}]),
        ),
        wep(a, &[&long_profile], json!([])),
        // b: tier with the long policy (denies OTHER, passes the rest) then its NUL profile.
        wep(
            b,
            &[nul_profile],
            json!([tier_of(&long_tier, &[long_policy])]),
        ),
        // c: the NUL policy admits a only.
        wep(c, &[], json!([tier_of("default", &[nul_policy])])),
        in_sync(),
    ]);
    agent.expect_matrix(
        "hostile names enforced",
        &[
            flow(src(a), v4(b), Tcp, WEB, Pass),
            flow(src(a), v4(b), Tcp, OTHER, Drop),
            flow(src(b), v4(a), Tcp, OTHER, Pass),
            flow(src(a), v4(c), Tcp, WEB, Pass),
            flow(src(b), v4(c), Tcp, WEB, Drop),
        ],
    );
    // Updates and removals of the same objects go through too (a NUL once made deletes fail).
    agent.send_all(&[
        wep(b, &[&long_profile], json!([])),
        json!({"active_profile_remove": {"id": {"name": nul_profile}}}),
        wep(c, &[&long_profile], json!([])),
    ]);
    agent.expect_matrix(
        "hostile names replaced and removed",
        &[
            flow(src(a), v4(b), Tcp, OTHER, Pass),
            flow(src(b), v4(c), Tcp, WEB, Pass),
        ],
    );
    assert!(
        !agent.log_text().contains("the kernel refused"),
        "{}",
        agent.log_text()
    );
    agent.stop_cleanly();
}

#[test]
fn a_deny_the_renderer_cannot_express_is_refused_not_skipped() {
    // A deny with protocol 300 or an unknown name used to be skipped with a warning: the policy
    // then let through exactly what it denied. It is refused whole, and the policy in force stays.
    let (topo, _srv, mut agent) = three_v4_with_agent("fnt-hx-deny", [A, B, C], listen);
    let (a, b) = (topo.workload("a").unwrap(), topo.workload("b").unwrap());
    let deny_other = |p: serde_json::Value| {
        ingress_policy(
            "deny-other",
            json!([{"action": "deny", "protocol": p, "dst_ports": ports(&[OTHER])},
                   {"action": "allow"}]),
        )
    };
    agent.send_all(&[
        allow_all_profile(),
        deny_other(proto("tcp")),
        wep(a, &["allow-all"], json!([])),
        wep_ingress(b, &["deny-other"]),
        in_sync(),
    ]);
    let flows = [
        flow(src(a), v4(b), Tcp, WEB, Pass),
        flow(src(a), v4(b), Tcp, OTHER, Drop),
    ];
    agent.expect_matrix("deny tcp/9090", &flows);
    agent.send_all(&[
        deny_other(json!({"number": 300})),
        deny_other(json!({"name": "tcpx"})),
        ingress_policy("deny-other", json!([{"action": "deny", "protocol": proto("icmp"), "icmp_type": 300}, {"action": "allow"}])),
    ]);
    eventually("three refusals logged", || {
        let n = agent
            .log_text()
            .matches("rejected active_policy_update")
            .count();
        if n >= 3 {
            Ok(())
        } else {
            Err(format!("{n} refusals so far:\n{}", agent.log_text()))
        }
    });
    // Still in force.
    agent.expect_matrix("deny tcp/9090 still in force", &flows);
    let log = agent.log_text();
    for needle in [
        "field `policy.inbound_rules[0].protocol` = \"300\"",
        "\"tcpx\"",
        "icmp.type",
    ] {
        assert!(log.contains(needle), "no `{needle}` in the log:\n{log}");
    }
    agent.stop_cleanly();
}
