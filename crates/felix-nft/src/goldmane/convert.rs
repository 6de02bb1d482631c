//! A [`FlowRecord`] as Goldmane's [`Flow`]: pure, field for field as Felix's Goldmane reporter
//! fills it (`felix/collector/goldmane/client.go` `ConvertFlowlogToGoldmane`, with the names of
//! `felix/collector/types/endpoint/endpoint.go` and the policy hits of
//! `felix/calc/policy_lookup_cache.go` as `goldmane/proto/methods.go` reads them back).

use std::net::IpAddr;

use super::api::{self, Action, EndpointType, Flow, FlowKey, PolicyTrace};
use crate::flows::record::{
    Endpoint, EndpointKind, FlowRecord, PolicyHit, PolicyKind, Reporter, Verdict,
};

/// What Felix writes in a name or namespace it does not fill (`flowlog.FieldNotIncluded`): the
/// namespace of host endpoints and network ends, and a flow's service fields when it has none.
pub const NOT_INCLUDED: &str = "-";

/// The name Felix gives an end of a flow Calico knows nothing of: `pvt` for an RFC 1918 IPv4
/// address, `pub` for anything else.
pub const PRIVATE_NET: &str = "pvt";
/// See [`PRIVATE_NET`].
pub const PUBLIC_NET: &str = "pub";

/// The profile name Felix's "no profile matched" drop reports (`calc.NoMatchNameStr`).
pub const NO_MATCH: &str = "__NO_MATCH__";

/// Converts one record. `node_name` is this node's name: Felix names every host endpoint by its
/// node (`endpoint.GetMetadata`: the aggregated name of a `HostEndpointKey` is its hostname),
/// and the driver protocol gives a node only its own host endpoints.
///
/// Filled as Felix fills them:
/// - names and namespaces: a workload by its pod and namespace; a host endpoint by the node's
///   name, namespace `-`; a network end `pvt` when its address is in 10/8, 172.16/12 or 192.168/16
///   (IPv4, or IPv4-mapped IPv6) and `pub` otherwise, namespace `-` (`getSubnetType`: IPv6
///   private ranges count as public there too);
/// - types: Workload → `WorkloadEndpoint`, Host → `HostEndpoint`, Network → `Network`;
/// - `proto` spelled as `utils.ProtoToString` does (`tcp`, `udp`, `icmp`, `icmp6`, `sctp`,
///   `ipip`, `esp`, else the number); `dest_port`; reporter; action;
/// - the enforced trace, one hit per step in evaluation order, `policy_index` its position among
///   the enforced hits (Felix's index in the reported path, not the policy's place in its tier;
///   staged hits are left out and not counted, as Felix leaves them out of the enforced set);
///   policies with their kind, namespace, name, tier, action and rule index; a profile as kind
///   `Profile` with no tier (Felix's `__PROFILE__` tier, which Goldmane reads back as none); an
///   end of tier as kind `EndOfTier` with its tier and action and rule index -1; the no-profile
///   drop as the profile `__NO_MATCH__`, action deny, rule index 0 (Felix's rule id for it);
/// - start and end time, packets and bytes in and out, connections started, completed and
///   live (counts above `i64::MAX` saturate).
///
/// Not filled, because felix-nft does not have them:
/// - `source_labels`, `dest_labels`: the driver protocol carries no endpoint labels;
/// - a workload's aggregated name: Felix names a pod by its `generateName` plus `*`, so that a
///   ReplicaSet's pods share one flow; the driver protocol does not carry `generateName`, so a
///   pod is named by its own name;
/// - the destination service (name, namespace, port name: `-`; port: 0, as Felix sends for a flow
///   to no service): a record has no pre-DNAT destination to match to a service;
/// - `pending_policies`: felix-nft evaluates no staged policies (Felix's
///   `FlowLogsPolicyEvaluationMode`), so only the enforced trace is sent;
/// - an end of tier's `trigger`: Felix names the last enforced policy of the tier that selected
///   the endpoint; the end-of-tier NFLOG prefix names only the tier, so the trigger carries the
///   tier alone. It is sent anyway because Goldmane reads an end of tier's trigger without a
///   nil check (`goldmane/pkg/storage/stats.go`);
/// - `NetworkSet` ends: the driver protocol carries no network sets' names, so their addresses
///   are network ends.
///
/// Felix sends a flow's start time as its end time too; felix-nft sends the record's end, as
/// `api.proto` defines `end_time`.
pub fn to_flow(record: &FlowRecord, node_name: &str) -> Flow {
    let key = &record.key;
    let (source_name, source_namespace, source_type) = end(&key.src, node_name);
    let (dest_name, dest_namespace, dest_type) = end(&key.dst, node_name);
    Flow {
        key: Some(FlowKey {
            source_name,
            source_namespace,
            source_type: source_type as i32,
            dest_name,
            dest_namespace,
            dest_type: dest_type as i32,
            dest_port: i64::from(key.dest_port),
            dest_service_name: NOT_INCLUDED.into(),
            dest_service_namespace: NOT_INCLUDED.into(),
            dest_service_port_name: NOT_INCLUDED.into(),
            dest_service_port: 0,
            proto: proto_name(key.proto),
            reporter: match key.reporter {
                Reporter::Src => api::Reporter::Src,
                Reporter::Dst => api::Reporter::Dst,
            } as i32,
            action: action(key.action) as i32,
            policies: Some(PolicyTrace {
                enforced_policies: enforced(&key.trace),
                pending_policies: Vec::new(),
            }),
        }),
        start_time: record.start_time,
        end_time: record.end_time,
        source_labels: Vec::new(),
        dest_labels: Vec::new(),
        packets_in: count(record.packets_in),
        packets_out: count(record.packets_out),
        bytes_in: count(record.bytes_in),
        bytes_out: count(record.bytes_out),
        num_connections_started: count(record.connections_started),
        num_connections_completed: count(record.connections_completed),
        num_connections_live: count(record.connections_live),
    }
}

/// An end's name, namespace and type.
fn end(e: &Endpoint, node_name: &str) -> (String, String, EndpointType) {
    match e.kind {
        EndpointKind::Workload => (
            e.name.clone(),
            e.namespace.clone(),
            EndpointType::WorkloadEndpoint,
        ),
        EndpointKind::Host => (
            node_name.to_string(),
            NOT_INCLUDED.into(),
            EndpointType::HostEndpoint,
        ),
        EndpointKind::Network => {
            // A network end's name is its address; one that is not an address is no private one.
            let private = e.name.parse::<IpAddr>().is_ok_and(is_private);
            let name = if private { PRIVATE_NET } else { PUBLIC_NET };
            (name.into(), NOT_INCLUDED.into(), EndpointType::Network)
        }
    }
}

/// RFC 1918, as Felix's `getSubnetType` checks it: IPv4 only (an IPv4-mapped IPv6 address
/// counts as its IPv4 address, as Go's `IPNet.Contains` reads it).
fn is_private(ip: IpAddr) -> bool {
    let v4 = match ip {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4,
            None => return false,
        },
    };
    let [a, b, ..] = v4.octets();
    a == 10 || (a == 172 && (16..32).contains(&b)) || (a == 192 && b == 168)
}

/// `utils.ProtoToString`.
fn proto_name(proto: u8) -> String {
    match proto {
        1 => "icmp".into(),
        4 => "ipip".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        50 => "esp".into(),
        58 => "icmp6".into(),
        132 => "sctp".into(),
        other => other.to_string(),
    }
}

fn action(v: Verdict) -> Action {
    match v {
        Verdict::Allow => Action::Allow,
        Verdict::Deny => Action::Deny,
        Verdict::Pass => Action::Pass,
    }
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The enforced hits, numbered as Felix's `newPolicySet(…, includeStaged = false)` numbers them.
fn enforced(trace: &[PolicyHit]) -> Vec<api::PolicyHit> {
    trace
        .iter()
        .filter(|h| h.kind != PolicyKind::Staged)
        .enumerate()
        .map(|(i, h)| hit(h, i64::try_from(i).unwrap_or(i64::MAX)))
        .collect()
}

fn hit(h: &PolicyHit, policy_index: i64) -> api::PolicyHit {
    let with = |kind: api::PolicyKind, namespace: &str, name: &str, tier: &str, rule_index| {
        api::PolicyHit {
            kind: kind as i32,
            namespace: namespace.to_string(),
            name: name.to_string(),
            tier: tier.to_string(),
            action: action(h.action) as i32,
            policy_index,
            rule_index,
            trigger: None,
        }
    };
    match h.kind {
        PolicyKind::CalicoNetworkPolicy => with(
            api::PolicyKind::CalicoNetworkPolicy,
            &h.namespace,
            &h.name,
            &h.tier,
            h.rule_index,
        ),
        PolicyKind::GlobalNetworkPolicy => with(
            api::PolicyKind::GlobalNetworkPolicy,
            "",
            &h.name,
            &h.tier,
            h.rule_index,
        ),
        PolicyKind::NetworkPolicy => with(
            api::PolicyKind::NetworkPolicy,
            &h.namespace,
            &h.name,
            &h.tier,
            h.rule_index,
        ),
        // Not in an enforced trace ([`enforced`] leaves them out); namespaced or not is all the
        // record says of a staged policy's kind.
        PolicyKind::Staged if h.namespace.is_empty() => with(
            api::PolicyKind::StagedGlobalNetworkPolicy,
            "",
            &h.name,
            &h.tier,
            h.rule_index,
        ),
        PolicyKind::Staged => with(
            api::PolicyKind::StagedNetworkPolicy,
            &h.namespace,
            &h.name,
            &h.tier,
            h.rule_index,
        ),
        PolicyKind::Profile => with(api::PolicyKind::Profile, "", &h.name, "", h.rule_index),
        PolicyKind::EndOfTier => api::PolicyHit {
            trigger: Some(Box::new(api::PolicyHit {
                tier: h.tier.clone(),
                ..Default::default()
            })),
            ..with(api::PolicyKind::EndOfTier, "", "", &h.tier, -1)
        },
        PolicyKind::NoProfile => api::PolicyHit {
            action: Action::Deny as i32,
            ..with(api::PolicyKind::Profile, "", NO_MATCH, "", 0)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::record::FlowKey as RecordKey;

    fn ep(kind: EndpointKind, name: &str, namespace: &str) -> Endpoint {
        Endpoint {
            kind,
            name: name.into(),
            namespace: namespace.into(),
            node: None,
        }
    }

    fn ph(
        kind: PolicyKind,
        ns: &str,
        name: &str,
        tier: &str,
        action: Verdict,
        rule: i64,
    ) -> PolicyHit {
        PolicyHit {
            kind,
            namespace: ns.into(),
            name: name.into(),
            tier: tier.into(),
            action,
            policy_index: 7,
            rule_index: rule,
        }
    }

    fn record(src: Endpoint, dst: Endpoint, proto: u8, trace: Vec<PolicyHit>) -> FlowRecord {
        FlowRecord {
            key: RecordKey {
                src,
                dst,
                proto,
                dest_port: 8080,
                reporter: Reporter::Dst,
                action: Verdict::Allow,
                trace,
            },
            start_time: 1_700_000_000,
            end_time: 1_700_000_015,
            packets_in: 10,
            packets_out: 9,
            bytes_in: 1000,
            bytes_out: 900,
            connections_started: 2,
            connections_completed: 1,
            connections_live: 1,
        }
    }

    #[test]
    fn workload_to_workload_carries_every_field() {
        let r = record(
            ep(EndpointKind::Workload, "client-1", "prod"),
            ep(EndpointKind::Workload, "server-1", "web"),
            6,
            vec![
                ph(
                    PolicyKind::GlobalNetworkPolicy,
                    "",
                    "platform",
                    "platform",
                    Verdict::Pass,
                    0,
                ),
                ph(
                    PolicyKind::CalicoNetworkPolicy,
                    "web",
                    "allow-web",
                    "default",
                    Verdict::Allow,
                    2,
                ),
            ],
        );
        let f = to_flow(&r, "node-a");
        let k = f.key.clone().unwrap_or_default();
        assert_eq!(
            (
                k.source_name.as_str(),
                k.source_namespace.as_str(),
                k.source_type()
            ),
            ("client-1", "prod", EndpointType::WorkloadEndpoint)
        );
        assert_eq!(
            (
                k.dest_name.as_str(),
                k.dest_namespace.as_str(),
                k.dest_type()
            ),
            ("server-1", "web", EndpointType::WorkloadEndpoint)
        );
        assert_eq!((k.proto.as_str(), k.dest_port), ("tcp", 8080));
        assert_eq!(k.reporter(), api::Reporter::Dst);
        assert_eq!(k.action(), Action::Allow);
        assert_eq!(
            (
                k.dest_service_name.as_str(),
                k.dest_service_namespace.as_str()
            ),
            ("-", "-")
        );
        assert_eq!(
            (k.dest_service_port_name.as_str(), k.dest_service_port),
            ("-", 0)
        );
        let p = k.policies.unwrap_or_default();
        assert!(p.pending_policies.is_empty());
        assert_eq!(
            p.enforced_policies,
            vec![
                api::PolicyHit {
                    kind: api::PolicyKind::GlobalNetworkPolicy as i32,
                    namespace: String::new(),
                    name: "platform".into(),
                    tier: "platform".into(),
                    action: Action::Pass as i32,
                    policy_index: 0,
                    rule_index: 0,
                    trigger: None,
                },
                api::PolicyHit {
                    kind: api::PolicyKind::CalicoNetworkPolicy as i32,
                    namespace: "web".into(),
                    name: "allow-web".into(),
                    tier: "default".into(),
                    action: Action::Allow as i32,
                    policy_index: 1,
                    rule_index: 2,
                    trigger: None,
                },
            ]
        );
        assert_eq!((f.start_time, f.end_time), (1_700_000_000, 1_700_000_015));
        assert_eq!(
            (f.packets_in, f.packets_out, f.bytes_in, f.bytes_out),
            (10, 9, 1000, 900)
        );
        assert_eq!(
            (
                f.num_connections_started,
                f.num_connections_completed,
                f.num_connections_live
            ),
            (2, 1, 1)
        );
        assert!(f.source_labels.is_empty() && f.dest_labels.is_empty());
    }

    #[test]
    fn host_ends_are_named_by_the_node_and_network_ends_pub_or_pvt() {
        let cases = [
            ("10.1.2.3", "pvt"),
            ("172.16.0.1", "pvt"),
            ("172.31.255.255", "pvt"),
            ("172.32.0.1", "pub"),
            ("172.15.0.1", "pub"),
            ("192.168.7.7", "pvt"),
            ("192.169.0.1", "pub"),
            ("8.8.8.8", "pub"),
            ("::ffff:10.0.0.1", "pvt"),
            // Felix checks IPv4 blocks only: a ULA is "public" to it.
            ("fd00::1", "pub"),
            ("2001:db8::1", "pub"),
            ("not-an-address", "pub"),
        ];
        for (addr, want) in cases {
            let r = record(
                ep(EndpointKind::Host, "eth0-hep", ""),
                ep(EndpointKind::Network, addr, ""),
                17,
                vec![],
            );
            let k = to_flow(&r, "node-a").key.unwrap_or_default();
            assert_eq!(
                (
                    k.source_name.as_str(),
                    k.source_namespace.as_str(),
                    k.source_type()
                ),
                ("node-a", "-", EndpointType::HostEndpoint)
            );
            assert_eq!(
                (
                    k.dest_name.as_str(),
                    k.dest_namespace.as_str(),
                    k.dest_type()
                ),
                (want, "-", EndpointType::Network),
                "{addr}"
            );
            assert_eq!(k.proto, "udp");
        }
    }

    #[test]
    fn protocols_are_spelled_as_felix_spells_them() {
        for (n, s) in [
            (1, "icmp"),
            (4, "ipip"),
            (6, "tcp"),
            (17, "udp"),
            (50, "esp"),
            (58, "icmp6"),
            (132, "sctp"),
            (47, "47"),
        ] {
            assert_eq!(proto_name(n), s);
        }
    }

    #[test]
    fn profiles_ends_of_tier_and_no_profile_are_hit_as_felix_reports_them() {
        let trace = vec![
            ph(PolicyKind::EndOfTier, "", "", "security", Verdict::Pass, -1),
            ph(
                PolicyKind::NetworkPolicy,
                "prod",
                "knp.default.web",
                "default",
                Verdict::Pass,
                1,
            ),
            ph(
                PolicyKind::Staged,
                "prod",
                "staged-x",
                "default",
                Verdict::Deny,
                0,
            ),
            ph(PolicyKind::Profile, "", "kns.prod", "", Verdict::Allow, 0),
            ph(PolicyKind::NoProfile, "", "", "", Verdict::Deny, -1),
        ];
        let r = record(
            ep(EndpointKind::Workload, "a", "prod"),
            ep(EndpointKind::Workload, "b", "prod"),
            6,
            trace,
        );
        let hits = to_flow(&r, "n")
            .key
            .and_then(|k| k.policies)
            .unwrap_or_default()
            .enforced_policies;
        let eot = api::PolicyHit {
            kind: api::PolicyKind::EndOfTier as i32,
            tier: "security".into(),
            action: Action::Pass as i32,
            policy_index: 0,
            rule_index: -1,
            trigger: Some(Box::new(api::PolicyHit {
                tier: "security".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let knp = api::PolicyHit {
            kind: api::PolicyKind::NetworkPolicy as i32,
            namespace: "prod".into(),
            name: "knp.default.web".into(),
            tier: "default".into(),
            action: Action::Pass as i32,
            policy_index: 1,
            rule_index: 1,
            trigger: None,
        };
        let profile = api::PolicyHit {
            kind: api::PolicyKind::Profile as i32,
            name: "kns.prod".into(),
            action: Action::Allow as i32,
            policy_index: 2,
            rule_index: 0,
            ..Default::default()
        };
        let no_match = api::PolicyHit {
            kind: api::PolicyKind::Profile as i32,
            name: "__NO_MATCH__".into(),
            action: Action::Deny as i32,
            policy_index: 3,
            rule_index: 0,
            ..Default::default()
        };
        assert_eq!(hits, vec![eot, knp, profile, no_match]);
    }

    #[test]
    fn counts_beyond_i64_saturate() {
        let mut r = record(
            ep(EndpointKind::Workload, "a", "x"),
            ep(EndpointKind::Workload, "b", "x"),
            6,
            vec![],
        );
        r.bytes_in = u64::MAX;
        assert_eq!(to_flow(&r, "n").bytes_in, i64::MAX);
    }

    #[test]
    fn staged_kinds_map_by_namespace() {
        let g = hit(&ph(PolicyKind::Staged, "", "s", "t", Verdict::Deny, 0), 0);
        let n = hit(&ph(PolicyKind::Staged, "ns", "s", "t", Verdict::Deny, 0), 0);
        assert_eq!(g.kind(), api::PolicyKind::StagedGlobalNetworkPolicy);
        assert_eq!(n.kind(), api::PolicyKind::StagedNetworkPolicy);
    }
}
