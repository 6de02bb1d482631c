//! Property tests: JSON ↔ Rust ↔ protobuf round trips over generated messages.
//!
//! - `json::decode(json::encode(m)) == m` and `prost::decode(prost::encode(m)) == m`;
//! - JSON → Rust → protobuf → Rust → JSON gives back the same JSON text;
//! - the lowerCamelCase spelling of the same JSON (and 64-bit integers as numbers instead of
//!   strings) decodes to the same message.

use std::collections::BTreeMap;

use felix_api::*;
use felix_api::{from_dataplane as fd, json, to_dataplane as td};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use prost::Message;
use serde_json::Value;

fn s() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9:/._-]{0,12}",
        1 => "\\PC{0,6}",
    ]
}

fn strings() -> impl Strategy<Value = Vec<String>> {
    vec(s(), 0..3)
}

fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map(s(), s(), 0..3)
}

/// A known enum value most of the time, any number sometimes (an unknown value must survive).
fn enum_of(known: &'static [i32]) -> impl Strategy<Value = i32> {
    prop_oneof![4 => proptest::sample::select(known), 1 => any::<i32>()]
}

fn protocol() -> impl Strategy<Value = Protocol> {
    option::of(prop_oneof![
        any::<i32>().prop_map(protocol::NumberOrName::Number),
        s().prop_map(protocol::NumberOrName::Name),
    ])
    .prop_map(|number_or_name| Protocol { number_or_name })
}

fn ports() -> impl Strategy<Value = Vec<PortRange>> {
    vec(
        (any::<i32>(), any::<i32>()).prop_map(|(first, last)| PortRange { first, last }),
        0..3,
    )
}

fn icmp_tc() -> impl Strategy<Value = IcmpTypeAndCode> {
    (any::<i32>(), any::<i32>()).prop_map(|(t, code)| IcmpTypeAndCode { r#type: t, code })
}

/// A rule's ICMP match (or its negation): none, a type alone, or a type and code.
fn icmp<T: std::fmt::Debug>(
    by_type: fn(i32) -> T,
    by_type_code: fn(IcmpTypeAndCode) -> T,
) -> impl Strategy<Value = Option<T>> {
    option::of(prop_oneof![
        any::<i32>().prop_map(by_type),
        icmp_tc().prop_map(by_type_code),
    ])
}

fn policy() -> impl Strategy<Value = Policy> {
    let rules = (vec(rule(), 0..3), vec(rule(), 0..3));
    let flags = (any::<bool>(), any::<bool>());
    let text = (s(), s(), strings(), s());
    (rules, flags, text).prop_map(|((i, o), (untracked, pre_dnat), text)| {
        let (namespace, original_selector, perf_hints, tier) = text;
        Policy {
            inbound_rules: i,
            outbound_rules: o,
            untracked,
            pre_dnat,
            namespace,
            original_selector,
            perf_hints,
            tier,
        }
    })
}

fn sa_match() -> impl Strategy<Value = Option<ServiceAccountMatch>> {
    option::of(
        (s(), strings()).prop_map(|(selector, names)| ServiceAccountMatch { selector, names }),
    )
}

fn http_match() -> impl Strategy<Value = Option<HttpMatch>> {
    use http_match::path_match::PathMatch as P;
    let path = option::of(prop_oneof![s().prop_map(P::Exact), s().prop_map(P::Prefix)])
        .prop_map(|path_match| http_match::PathMatch { path_match });
    option::of(
        (strings(), vec(path, 0..3)).prop_map(|(methods, paths)| HttpMatch { methods, paths }),
    )
}

fn rule() -> impl Strategy<Value = Rule> {
    let positive = (
        s(),
        enum_of(&[0, 4, 6]),
        option::of(protocol()),
        strings(),
        ports(),
        strings(),
        strings(),
        ports(),
        strings(),
        icmp(rule::Icmp::IcmpType, rule::Icmp::IcmpTypeCode),
        (strings(), strings(), strings()),
    );
    let negative = (
        option::of(protocol()),
        strings(),
        ports(),
        strings(),
        ports(),
        icmp(rule::NotIcmp::NotIcmpType, rule::NotIcmp::NotIcmpTypeCode),
        (strings(), strings(), strings(), strings()),
    );
    let passthrough = (
        (s(), s(), s(), s(), s(), s()),
        (s(), s(), s(), s()),
        sa_match(),
        sa_match(),
        http_match(),
        option::of(map().prop_map(|annotations| RuleMetadata { annotations })),
        s(),
    );
    (positive, negative, passthrough).prop_map(|(p, n, x)| {
        let (action, ip_version, protocol, src_net, src_ports, src_np, dst_net, dst_ports, dst_np, icmp, sets) = p;
        let (not_protocol, not_src_net, not_src_ports, not_dst_net, not_dst_ports, not_icmp, nsets) = n;
        let (sel, svc, src_sa, dst_sa, http, metadata, rule_id) = x;
        Rule {
            action,
            ip_version,
            protocol,
            src_net,
            src_ports,
            src_named_port_ip_set_ids: src_np,
            dst_net,
            dst_ports,
            dst_named_port_ip_set_ids: dst_np,
            icmp,
            src_ip_set_ids: sets.0,
            dst_ip_set_ids: sets.1,
            dst_ip_port_set_ids: sets.2,
            not_protocol,
            not_src_net,
            not_src_ports,
            not_dst_net,
            not_dst_ports,
            not_icmp,
            not_src_ip_set_ids: nsets.0,
            not_dst_ip_set_ids: nsets.1,
            not_src_named_port_ip_set_ids: nsets.2,
            not_dst_named_port_ip_set_ids: nsets.3,
            original_src_selector: sel.0,
            original_dst_selector: sel.1,
            original_src_namespace_selector: sel.2,
            original_dst_namespace_selector: sel.3,
            original_not_src_selector: sel.4,
            original_not_dst_selector: sel.5,
            src_service_account_match: src_sa,
            dst_service_account_match: dst_sa,
            http_match: http,
            metadata,
            original_dst_service: svc.0,
            original_dst_service_namespace: svc.1,
            original_src_service: svc.2,
            original_src_service_namespace: svc.3,
            rule_id,
        }
    })
}

fn policy_id() -> impl Strategy<Value = PolicyId> {
    (s(), s(), s()).prop_map(|(name, namespace, kind)| PolicyId {
        name,
        namespace,
        kind,
    })
}

fn tiers() -> impl Strategy<Value = Vec<TierInfo>> {
    vec(
        (s(), vec(policy_id(), 0..2), vec(policy_id(), 0..2), s()).prop_map(
            |(name, ingress_policies, egress_policies, default_action)| TierInfo {
                name,
                ingress_policies,
                egress_policies,
                default_action,
            },
        ),
        0..2,
    )
}

fn nat() -> impl Strategy<Value = Vec<NatInfo>> {
    vec(
        (s(), s()).prop_map(|(ext_ip, int_ip)| NatInfo { ext_ip, int_ip }),
        0..2,
    )
}

fn qos_policies() -> impl Strategy<Value = Vec<QoSPolicy>> {
    vec(
        (s(), any::<i32>()).prop_map(|(destination, dscp)| QoSPolicy { destination, dscp }),
        0..2,
    )
}

fn qos_controls() -> impl Strategy<Value = QoSControls> {
    (vec(any::<i64>(), 14..=14)).prop_map(|v| QoSControls {
        ingress_bandwidth: v[0],
        egress_bandwidth: v[1],
        ingress_burst: v[2],
        egress_burst: v[3],
        ingress_packet_rate: v[4],
        egress_packet_rate: v[5],
        ingress_max_connections: v[6],
        egress_max_connections: v[7],
        ingress_peakrate: v[8],
        egress_peakrate: v[9],
        ingress_minburst: v[10],
        egress_minburst: v[11],
        ingress_packet_burst: v[12],
        egress_packet_burst: v[13],
    })
}

fn wep_id() -> impl Strategy<Value = WorkloadEndpointId> {
    (s(), s(), s()).prop_map(
        |(orchestrator_id, workload_id, endpoint_id)| WorkloadEndpointId {
            orchestrator_id,
            workload_id,
            endpoint_id,
        },
    )
}

fn workload_endpoint() -> impl Strategy<Value = WorkloadEndpoint> {
    (
        (s(), s(), s(), strings(), strings(), strings()),
        (tiers(), nat(), nat(), strings(), map()),
        (
            option::of(qos_controls()),
            s(),
            any::<bool>(),
            qos_policies(),
            any::<bool>(),
        ),
        (enum_of(&[0, 1, 2]), s(), s()),
    )
        .prop_map(|(a, b, c, d)| WorkloadEndpoint {
            state: a.0,
            name: a.1,
            mac: a.2,
            profile_ids: a.3,
            ipv4_nets: a.4,
            ipv6_nets: a.5,
            tiers: b.0,
            ipv4_nat: b.1,
            ipv6_nat: b.2,
            allow_spoofed_source_prefixes: b.3,
            annotations: b.4,
            qos_controls: c.0,
            local_bgp_peer: c.1,
            skip_redir: c.2,
            qos_policies: c.3,
            is_istio_ambient: c.4,
            live_migration_role: d.0,
            live_migration_uid: d.1,
            live_migration_vmi_name: d.2,
        })
}

fn host_endpoint() -> impl Strategy<Value = HostEndpoint> {
    (
        s(),
        strings(),
        tiers(),
        strings(),
        strings(),
        tiers(),
        tiers(),
        tiers(),
        qos_policies(),
    )
        .prop_map(
            |(name, profile_ids, t, v4, v6, ut, pt, ft, qos_policies)| HostEndpoint {
                name,
                profile_ids,
                tiers: t,
                expected_ipv4_addrs: v4,
                expected_ipv6_addrs: v6,
                untracked_tiers: ut,
                pre_dnat_tiers: pt,
                forward_tiers: ft,
                qos_policies,
            },
        )
}

fn to_payload() -> impl Strategy<Value = td::Payload> {
    use td::Payload as P;
    let rules = || vec(rule(), 0..3);
    prop_oneof![
        Just(P::InSync(InSync {})),
        (s(), strings(), enum_of(&[0, 1, 2])).prop_map(|(id, members, t)| P::IpsetUpdate(
            IpSetUpdate {
                id,
                members,
                r#type: t
            }
        )),
        (s(), strings(), strings()).prop_map(|(id, added_members, removed_members)| {
            P::IpsetDeltaUpdate(IpSetDeltaUpdate {
                id,
                added_members,
                removed_members,
            })
        }),
        s().prop_map(|id| P::IpsetRemove(IpSetRemove { id })),
        (option::of(policy_id()), option::of(policy()),)
            .prop_map(|(id, policy)| P::ActivePolicyUpdate(ActivePolicyUpdate { id, policy })),
        option::of(policy_id()).prop_map(|id| P::ActivePolicyRemove(ActivePolicyRemove { id })),
        (s(), rules(), rules()).prop_map(|(name, i, o)| {
            P::ActiveProfileUpdate(ActiveProfileUpdate {
                id: Some(ProfileId { name }),
                profile: Some(Profile {
                    inbound_rules: i,
                    outbound_rules: o,
                }),
            })
        }),
        (option::of(wep_id()), option::of(workload_endpoint())).prop_map(|(id, endpoint)| {
            P::WorkloadEndpointUpdate(WorkloadEndpointUpdate { id, endpoint })
        }),
        option::of(wep_id())
            .prop_map(|id| P::WorkloadEndpointRemove(WorkloadEndpointRemove { id })),
        (s(), option::of(host_endpoint())).prop_map(|(endpoint_id, endpoint)| {
            P::HostEndpointUpdate(HostEndpointUpdate {
                id: Some(HostEndpointId { endpoint_id }),
                endpoint,
            })
        }),
        (map(), btree_map(any::<u32>(), (s(), map()), 0..3), s()).prop_map(
            |(config, raw, message)| {
                P::ConfigUpdate(ConfigUpdate {
                    config,
                    source_to_raw_config: raw
                        .into_iter()
                        .map(|(k, (source, config))| (k, RawConfig { source, config }))
                        .collect(),
                    message,
                })
            }
        ),
        (s(), s(), s(), s(), map()).prop_map(
            |(hostname, ipv4_addr, ipv6_addr, asnumber, labels)| {
                P::HostMetadataUpdate(HostMetadataUpdate {
                    hostname,
                    ipv4_addr,
                    ipv6_addr,
                    asnumber,
                    labels,
                })
            }
        ),
        (s(), s(), any::<bool>(), s(), s(), strings()).prop_map(
            |(id, cidr, masquerade, ipip_mode, vxlan_mode, allowed_uses)| {
                P::IpamPoolUpdate(IpamPoolUpdate {
                    id,
                    pool: Some(IpamPool {
                        cidr,
                        masquerade,
                        ipip_mode,
                        vxlan_mode,
                        allowed_uses,
                    }),
                })
            }
        ),
        (
            enum_of(&[0, 1, 2, 4, 8, 16, 32, 5, 3]),
            enum_of(&[0, 1, 2, 3]),
            (s(), s(), s()),
            (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
            option::of((any::<bool>(), any::<bool>(), any::<bool>()))
        )
            .prop_map(
                |(types, ip_pool_type, (dst, dst_node_name, dst_node_ip), b, tt)| {
                    P::RouteUpdate(RouteUpdate {
                        types,
                        ip_pool_type,
                        dst,
                        dst_node_name,
                        dst_node_ip,
                        same_subnet: b.0,
                        nat_outgoing: b.1,
                        local_workload: b.2,
                        borrowed: b.3,
                        tunnel_type: tt.map(|(ipip, vxlan, wireguard)| TunnelType {
                            ipip,
                            vxlan,
                            wireguard,
                        }),
                    })
                }
            ),
        (s(), s(), s(), s(), s(), s(), s()).prop_map(|v| P::VtepUpdate(
            VxlanTunnelEndpointUpdate {
                node: v.0,
                mac: v.1,
                ipv4_addr: v.2,
                parent_device_ip: v.3,
                mac_v6: v.4,
                ipv6_addr: v.5,
                parent_device_ipv6: v.6,
            }
        )),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|b| {
            P::Encapsulation(Encapsulation {
                ipip_enabled: b.0,
                vxlan_enabled: b.1,
                vxlan_enabled_v6: b.2,
                no_encap_enabled: b.3,
            })
        }),
        (s(), s(), s()).prop_map(|(hostname, public_key, interface_ipv4_addr)| {
            P::WireguardEndpointUpdate(WireguardEndpointUpdate {
                hostname,
                public_key,
                interface_ipv4_addr,
            })
        }),
        (strings(), strings(), strings(), s(), s()).prop_map(|v| {
            P::GlobalBgpConfigUpdate(GlobalBgpConfigUpdate {
                service_cluster_cidrs: v.0,
                service_external_cidrs: v.1,
                service_loadbalancer_cidrs: v.2,
                local_workload_peering_ip_v4: v.3,
                local_workload_peering_ip_v6: v.4,
            })
        }),
        (
            (s(), s(), s(), s(), s()),
            (strings(), strings(), strings()),
            vec(
                (s(), any::<i32>(), any::<i32>()).prop_map(|(protocol, port, node_port)| {
                    ServicePort {
                        protocol,
                        port,
                        node_port,
                    }
                }),
                0..2
            )
        )
            .prop_map(|(a, b, ports)| P::ServiceUpdate(ServiceUpdate {
                name: a.0,
                namespace: a.1,
                r#type: a.2,
                cluster_ip: a.3,
                loadbalancer_ip: a.4,
                external_ips: b.0,
                cluster_ips: b.1,
                loadbalancer_ingress_ips: b.2,
                ports,
            })),
    ]
}

fn to_dataplane() -> impl Strategy<Value = ToDataplane> {
    (any::<u64>(), to_payload()).prop_map(|(sequence_number, p)| ToDataplane {
        sequence_number,
        payload: Some(p),
    })
}

fn from_dataplane() -> impl Strategy<Value = FromDataplane> {
    use fd::Payload as P;
    let status = || option::of(s().prop_map(|status| EndpointStatus { status }));
    let payload = prop_oneof![
        (
            s(),
            prop_oneof![Just(0.0), -1e12f64..1e12, proptest::num::f64::NORMAL]
        )
            .prop_map(|(iso_timestamp, uptime)| P::ProcessStatusUpdate(
                ProcessStatusUpdate {
                    iso_timestamp,
                    uptime
                }
            )),
        (s(), status()).prop_map(|(endpoint_id, status)| P::HostEndpointStatusUpdate(
            HostEndpointStatusUpdate {
                id: Some(HostEndpointId { endpoint_id }),
                status,
            }
        )),
        (
            option::of(wep_id()),
            status(),
            option::of(workload_endpoint())
        )
            .prop_map(|(id, status, endpoint)| {
                P::WorkloadEndpointStatusUpdate(WorkloadEndpointStatusUpdate {
                    id,
                    status,
                    endpoint,
                })
            }),
        option::of(wep_id())
            .prop_map(|id| P::WorkloadEndpointStatusRemove(WorkloadEndpointStatusRemove { id })),
        (s(), enum_of(&[0, 4, 6])).prop_map(|(public_key, ip_version)| {
            P::WireguardStatusUpdate(WireguardStatusUpdate {
                public_key,
                ip_version,
            })
        }),
        Just(P::DataplaneInSync(DataplaneInSync {})),
    ];
    (any::<u64>(), payload).prop_map(|(sequence_number, p)| FromDataplane {
        sequence_number,
        payload: Some(p),
    })
}

/// Fields whose object is a map: their keys are data, not field names.
const MAP_FIELDS: &[&str] = &["config", "source_to_raw_config", "labels", "annotations"];

fn camel(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The lowerCamelCase spelling of a message's JSON, with 64-bit integers as JSON numbers.
fn camelize(v: &Value, in_map: bool) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = if in_map { k.clone() } else { camel(k) };
                    let child_is_map = !in_map && MAP_FIELDS.contains(&k.as_str());
                    let v = match v {
                        Value::String(s)
                            if !in_map
                                && (k == "sequence_number"
                                    || k.ends_with("_burst")
                                    || k.ends_with("_bandwidth")) =>
                        {
                            s.parse::<i128>()
                                .map(|n| serde_json::json!(n))
                                .unwrap_or(v.clone())
                        }
                        // A map's values are messages again (RawConfig) or strings.
                        _ if in_map => camelize(v, false),
                        _ => camelize(v, child_is_map),
                    };
                    (key, v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| camelize(v, false)).collect()),
        other => other.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn to_dataplane_round_trips(m in to_dataplane()) {
        let text = json::encode(&m);
        let from_json: ToDataplane = json::decode(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(&from_json, &m);

        let bytes = m.encode_to_vec();
        let from_pb = decode_to_dataplane(&bytes).unwrap();
        prop_assert_eq!(&from_pb, &m);

        // JSON → Rust → protobuf → Rust → JSON.
        let again = json::encode(&decode_to_dataplane(&from_json.encode_to_vec()).unwrap());
        prop_assert_eq!(&again, &text);

        // lowerCamelCase and numeric int64 read the same.
        let camel = camelize(&serde_json::from_str(&text).unwrap(), false).to_string();
        let from_camel: ToDataplane = json::decode(&camel).map_err(|e| TestCaseError::fail(format!("{e}: {camel}")))?;
        prop_assert_eq!(&from_camel, &m);
    }

    #[test]
    fn from_dataplane_round_trips(m in from_dataplane()) {
        let text = json::encode(&m);
        let from_json: FromDataplane = json::decode(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(&from_json, &m);
        prop_assert_eq!(&decode_from_dataplane(&m.encode_to_vec()).unwrap(), &m);
        let again = json::encode(&decode_from_dataplane(&from_json.encode_to_vec()).unwrap());
        prop_assert_eq!(&again, &text);
        let camel = camelize(&serde_json::from_str(&text).unwrap(), false).to_string();
        let from_camel: FromDataplane = json::decode(&camel).map_err(|e| TestCaseError::fail(format!("{e}: {camel}")))?;
        prop_assert_eq!(&from_camel, &m);
    }
}
