//! Property tests: what `config show` prints for a value parses back to the same value, for
//! the structured kinds (port lists, ranges, masks, rate limits, table ranges, durations), and
//! resolution does not depend on the order of the environment apart from "last one wins".

use std::net::{Ipv4Addr, Ipv6Addr};

use felix_nft::config::{
    find, parse_for, resolve, FailsafePort, PortProtocol, PortRange, RateLimit, RatePer, RawValue,
    RouteTableRange, Source, Value,
};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proptest::prelude::*;

fn round_trip(name: &str, v: &Value) {
    let spec = find(name).unwrap();
    let text = v.to_string();
    let back = parse_for(spec, &text).unwrap_or_else(|r| panic!("{name}: {text:?} rejected: {r}"));
    assert_eq!(&back, v, "{name}: {text:?}");
}

fn failsafe_port() -> impl Strategy<Value = FailsafePort> {
    let proto = prop_oneof![Just(PortProtocol::Tcp), Just(PortProtocol::Udp)];
    let net = prop_oneof![
        Just(None),
        (any::<u32>(), 0u8..=32).prop_map(|(a, l)| Some(IpNet::V4(
            Ipv4Net::new(Ipv4Addr::from(a), l).unwrap().trunc()
        ))),
        (any::<u128>(), 0u8..=128).prop_map(|(a, l)| Some(IpNet::V6(
            Ipv6Net::new(Ipv6Addr::from(a), l).unwrap().trunc()
        ))),
    ];
    (proto, net, any::<u16>()).prop_map(|(protocol, net, port)| FailsafePort {
        protocol,
        net,
        port,
    })
}

proptest! {
    #[test]
    fn port_lists_round_trip(ports in proptest::collection::vec(failsafe_port(), 0..6)) {
        round_trip("FailsafeInboundHostPorts", &Value::Ports(ports));
    }

    #[test]
    fn port_ranges_round_trip(a in any::<u16>(), b in any::<u16>()) {
        let r = PortRange { first: a.min(b), last: a.max(b) };
        round_trip("NATPortRange", &Value::PortRange(r));
        round_trip("KubeNodePortRanges", &Value::PortRanges(vec![r, r]));
    }

    #[test]
    fn masks_round_trip_and_need_two_bits(m in any::<u32>()) {
        let spec = find("IptablesMarkMask").unwrap();
        let parsed = parse_for(spec, &format!("{m:#x}"));
        prop_assert_eq!(parsed.is_ok(), m.count_ones() >= 2);
        prop_assert_eq!(parse_for(spec, &m.to_string()).is_ok(), m.count_ones() >= 2);
        if m.count_ones() >= 2 {
            round_trip("IptablesMarkMask", &Value::Mask(m));
        }
    }

    #[test]
    fn rate_limits_round_trip(count in 1u32..=9999, per in 0usize..4) {
        let per = [RatePer::Second, RatePer::Minute, RatePer::Hour, RatePer::Day][per];
        round_trip("LogActionRateLimit", &Value::RateLimit(RateLimit { count, per }));
    }

    #[test]
    fn table_ranges_round_trip(min in 1u32..1_000_000, len in 0u32..30_000) {
        let r = RouteTableRange { min, max: min + len };
        round_trip("RouteTableRanges", &Value::TableRanges(vec![r]));
    }

    #[test]
    fn seconds_round_trip(ms in 0u64..10_000_000) {
        let d = std::time::Duration::from_millis(ms);
        round_trip("RouteRefreshInterval", &Value::Duration(d));
    }

    #[test]
    fn the_last_env_value_wins_whatever_comes_before(
        ports in proptest::collection::vec(1u16..=65535, 1..5)
    ) {
        let raw: Vec<RawValue> = ports
            .iter()
            .map(|p| RawValue {
                key: "HealthPort".into(),
                value: p.to_string(),
                source: Source::Env { var: "FELIX_HEALTHPORT".into() },
            })
            .collect();
        let r = resolve(raw).unwrap();
        prop_assert_eq!(r.config.health_port, *ports.last().unwrap());
    }
}
