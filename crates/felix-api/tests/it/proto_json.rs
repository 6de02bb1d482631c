//! proto3 JSON: the proto's field names on output, lowerCamelCase accepted, enums by name and by
//! number, 64-bit integers as number or string, oneofs as their member's field name, and errors
//! that name the field path at fault.

use felix_api::json::{self, JsonError};
use felix_api::*;

fn decode(text: &str) -> ToDataplane {
    json::decode(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn decode_err(text: &str) -> JsonError {
    match json::decode::<ToDataplane>(text) {
        Ok(m) => panic!("{text} decoded to {m:?}"),
        Err(e) => e,
    }
}

#[test]
fn ipset_update_in_the_design_example_form() {
    let m = decode(r#"{"ipset_update":{"id":"s:abc","type":"NET","members":["10.0.0.0/24"]}}"#);
    assert_eq!(
        m,
        ToDataplane {
            sequence_number: 0,
            payload: Some(to_dataplane::Payload::IpsetUpdate(IpSetUpdate {
                id: "s:abc".into(),
                members: vec!["10.0.0.0/24".into()],
                r#type: IpSetType::Net as i32,
            })),
        }
    );
    assert_eq!(
        json::encode(&m),
        r#"{"ipset_update":{"id":"s:abc","members":["10.0.0.0/24"],"type":"NET"}}"#
    );
}

#[test]
fn lower_camel_case_names_are_accepted_and_output_uses_proto_names() {
    let m = decode(
        r#"{"sequenceNumber":"7","ipsetDeltaUpdate":{"id":"s:x","addedMembers":["10.0.0.1/32"],"removedMembers":["10.0.0.2/32"]}}"#,
    );
    assert_eq!(m.sequence_number, 7);
    assert_eq!(
        json::encode(&m),
        r#"{"sequence_number":"7","ipset_delta_update":{"id":"s:x","added_members":["10.0.0.1/32"],"removed_members":["10.0.0.2/32"]}}"#
    );
    let w = decode(
        r#"{"workloadEndpointUpdate":{"id":{"orchestratorId":"k8s","workloadId":"ns/pod","endpointId":"eth0"},"endpoint":{"name":"cali1","ipv4Nets":["10.0.0.1/32"],"liveMigrationRole":"TARGET"}}}"#,
    );
    let Some(to_dataplane::Payload::WorkloadEndpointUpdate(u)) = w.payload else {
        panic!("{w:?}")
    };
    assert_eq!(u.id.unwrap().orchestrator_id, "k8s");
    let ep = u.endpoint.unwrap();
    assert_eq!(ep.ipv4_nets, ["10.0.0.1/32"]);
    assert_eq!(ep.live_migration_role, LiveMigrationRole::Target as i32);
}

#[test]
fn enums_by_name_and_by_number() {
    for (text, want) in [
        (r#""IP""#, IpSetType::Ip),
        (r#""IP_AND_PORT""#, IpSetType::IpAndPort),
        ("2", IpSetType::Net),
        ("1", IpSetType::IpAndPort),
    ] {
        let m = decode(&format!(r#"{{"ipset_update":{{"id":"a","type":{text}}}}}"#));
        let Some(to_dataplane::Payload::IpsetUpdate(u)) = m.payload else {
            panic!()
        };
        assert_eq!(u.r#type, want as i32, "{text}");
    }
    // RouteType is a bitmap: a single known bit by name, several bits by number.
    let m = decode(
        r#"{"route_update":{"dst":"10.0.0.0/26","types":"REMOTE_WORKLOAD","ip_pool_type":"VXLAN"}}"#,
    );
    let Some(to_dataplane::Payload::RouteUpdate(r)) = &m.payload else {
        panic!()
    };
    assert_eq!(r.types, RouteType::RemoteWorkload as i32);
    assert_eq!(r.ip_pool_type, IpPoolType::Vxlan as i32);
    let m = decode(r#"{"route_update":{"dst":"10.0.0.0/26","types":5}}"#);
    assert_eq!(
        json::encode(&m),
        r#"{"route_update":{"dst":"10.0.0.0/26","types":5}}"#
    );
}

#[test]
fn int64_as_number_or_string_and_written_as_string() {
    let a = decode(r#"{"sequence_number":18446744073709551615,"in_sync":{}}"#);
    let b = decode(r#"{"sequence_number":"18446744073709551615","in_sync":{}}"#);
    assert_eq!(a, b);
    assert_eq!(a.sequence_number, u64::MAX);
    assert_eq!(
        json::encode(&a),
        r#"{"sequence_number":"18446744073709551615","in_sync":{}}"#
    );
    let q = decode(
        r#"{"workload_endpoint_update":{"endpoint":{"qos_controls":{"ingress_bandwidth":"-5","egress_burst":9007199254740993}}}}"#,
    );
    let Some(to_dataplane::Payload::WorkloadEndpointUpdate(u)) = q.payload else {
        panic!()
    };
    let qos = u.endpoint.unwrap().qos_controls.unwrap();
    assert_eq!(qos.ingress_bandwidth, -5);
    assert_eq!(qos.egress_burst, 9007199254740993);
}

#[test]
fn protocol_ports_and_icmp_oneofs() {
    let m = decode(
        r#"{"active_policy_update":{"id":{"name":"default.p"},"policy":{"inbound_rules":[
            {"action":"allow","protocol":{"name":"tcp"},"dst_ports":[{"first":80,"last":80},{"first":8000,"last":8080}]},
            {"action":"deny","protocol":{"number":1},"icmp_type_code":{"type":3,"code":4},"not_icmp_type":8}
        ]}}}"#,
    );
    let Some(to_dataplane::Payload::ActivePolicyUpdate(u)) = &m.payload else {
        panic!()
    };
    let rules = &u.policy.as_ref().unwrap().inbound_rules;
    assert_eq!(
        rules[0].protocol,
        Some(Protocol {
            number_or_name: Some(protocol::NumberOrName::Name("tcp".into()))
        })
    );
    assert_eq!(
        rules[0].dst_ports[1],
        PortRange {
            first: 8000,
            last: 8080
        }
    );
    assert_eq!(
        rules[1].icmp,
        Some(rule::Icmp::IcmpTypeCode(IcmpTypeAndCode {
            r#type: 3,
            code: 4
        }))
    );
    assert_eq!(rules[1].not_icmp, Some(rule::NotIcmp::NotIcmpType(8)));
    let again = decode(&json::encode(&m));
    assert_eq!(again, m);
}

#[test]
fn maps_are_objects_with_string_keys() {
    let m = decode(
        r#"{"config_update":{"config":{"LogSeverityScreen":"Info"},"source_to_raw_config":{"4":{"source":"config file","config":{"a":"b"}}}}}"#,
    );
    let Some(to_dataplane::Payload::ConfigUpdate(c)) = &m.payload else {
        panic!()
    };
    assert_eq!(c.config["LogSeverityScreen"], "Info");
    assert_eq!(c.source_to_raw_config[&4].config["a"], "b");
    assert_eq!(decode(&json::encode(&m)), m);
}

#[test]
fn errors_name_the_field_path() {
    let e = decode_err(r#"{"ipset_update":{"id":"s:abc","type":"NETT"}}"#);
    assert_eq!(e.path, "ipset_update.type");
    assert!(e.message.contains("IP_AND_PORT"), "{e}");
    assert_eq!(e.line, 1);

    let e = decode_err(
        r#"{"active_policy_update":{"policy":{"inbound_rules":[{},{"dst_ports":[{"first":"x"}]}]}}}"#,
    );
    assert_eq!(
        e.path,
        "active_policy_update.policy.inbound_rules[1].dst_ports[0].first"
    );

    let e = decode_err(r#"{"ipset_update":{"id":"a","memberz":[]}}"#);
    assert_eq!(e.path, "ipset_update.memberz");
    assert!(e.message.contains("unknown field `memberz`"), "{e}");

    let e = decode_err(r#"{"ipset_updat":{"id":"a"}}"#);
    assert!(e.message.contains("unknown field `ipset_updat`"), "{e}");

    let e = decode_err(r#"{"in_sync":{},"ipset_remove":{"id":"a"}}"#);
    assert!(e.message.contains("`in_sync` and `ipset_remove`"), "{e}");

    let e = decode_err(r#"{"sequence_number":3}"#);
    assert!(e.message.contains("no payload"), "{e}");

    let e = decode_err(
        r#"{"active_policy_update":{"policy":{"inbound_rules":[{"icmp_type":1,"icmp_type_code":{"type":1}}]}}}"#,
    );
    assert_eq!(e.path, "active_policy_update.policy.inbound_rules[0]");
    assert!(e.message.contains("oneof `icmp`"), "{e}");

    let e = decode_err(r#"{"sequence_number":"12x","in_sync":{}}"#);
    assert_eq!(e.path, "sequence_number");

    let e = decode_err(r#"{"in_sync":{}} trailing"#);
    assert!(e.message.contains("trailing"), "{e}");
}

#[test]
fn from_dataplane_messages_round_trip() {
    let m: FromDataplane = json::decode(
        r#"{"sequence_number":"3","process_status_update":{"iso_timestamp":"2026-01-01T00:00:00Z","uptime":12.5}}"#,
    )
    .unwrap();
    assert_eq!(m.kind(), "process_status_update");
    assert_eq!(json::decode::<FromDataplane>(&json::encode(&m)).unwrap(), m);
}
