//! Felix's value syntax (§3.1), rule by rule: each kind accepts Felix's spellings,
//! refuses the rest with a rule an operator can act on, and the typed `Config` gets the value.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use felix_nft::config::{
    self, find, parse_for, resolve, AllowAction, Config, EndpointToHostAction, FailsafePort,
    IfaceMatch, LogLevel, NftablesMode, PortProtocol, PortRange, RateLimit, RatePer, RawValue,
    RouteTableRange, Source, Value, PARAMS,
};

/// Parses `raw` for the parameter `name`, as any source would.
fn p(name: &str, raw: &str) -> Result<Value, String> {
    let spec = find(name).unwrap_or_else(|| panic!("no parameter {name}"));
    parse_for(spec, raw).map_err(|r| r.0)
}

/// The typed config with one environment value set.
fn with(name: &str, raw: &str) -> Config {
    resolve(vec![RawValue {
        key: name.into(),
        value: raw.into(),
        source: Source::Env {
            var: format!("FELIX_{name}"),
        },
    }])
    .unwrap_or_else(|e| panic!("{name}={raw:?}: {e}"))
    .config
}

fn assert_bad(name: &str, raw: &str, rule_contains: &str) {
    match p(name, raw) {
        Ok(v) => panic!("{name}={raw:?} accepted as {v:?}"),
        Err(rule) => assert!(
            rule.contains(rule_contains),
            "{name}={raw:?}: rule {rule:?} does not mention {rule_contains:?}"
        ),
    }
}

#[test]
fn every_default_parses_and_fills_its_field() {
    for spec in PARAMS {
        if !spec.default.is_empty() {
            parse_for(spec, spec.default)
                .unwrap_or_else(|r| panic!("default of {} does not parse: {r}", spec.name));
        }
    }
    // Every row lands in a typed field: building the Config from all defaults succeeds.
    let r = resolve(Vec::new()).expect("defaults resolve");
    assert_eq!(r.entries.len(), PARAMS.len());
    assert!(r.bad_values.is_empty());
    assert_eq!(r.config, Config::default());
}

#[test]
fn table_names_are_unique_and_described() {
    for (i, a) in PARAMS.iter().enumerate() {
        assert!(!a.description.is_empty(), "{} has no description", a.name);
        for b in &PARAMS[i + 1..] {
            assert!(
                !a.name.eq_ignore_ascii_case(b.name),
                "{} listed twice",
                a.name
            );
        }
        assert!(
            !config::FELIX_PARAMS_NOT_USED
                .iter()
                .any(|n| n.eq_ignore_ascii_case(a.name)),
            "{} is both modelled and listed as not used",
            a.name
        );
    }
    // The parameters of §3.2 the brief calls out by group.
    for name in [
        "IptablesMarkMask",
        "NftablesMarkMask",
        "IptablesFilterAllowAction",
        "NftablesFilterAllowAction",
        "IptablesMangleAllowAction",
        "NftablesMangleAllowAction",
        "IptablesFilterDenyAction",
        "NftablesFilterDenyAction",
        "IptablesRefreshInterval",
        "NftablesRefreshInterval",
        "InterfacePrefix",
        "InterfaceExclude",
        "FailsafeInboundHostPorts",
        "FailsafeOutboundHostPorts",
        "NATPortRange",
        "NATOutgoingAddress",
        "RouteTableRanges",
        "VXLANEnabled",
        "WireguardEnabled",
        "HealthPort",
        "PrometheusMetricsPort",
        "LogSeverityScreen",
        "LogActionRateLimit",
    ] {
        assert!(find(name).is_some(), "{name} missing from the table");
    }
    let owner = find("NftablesTableOwner").expect("our own parameter");
    assert!(owner.ours());
    assert!(Config::default().nftables_table_owner);
}

#[test]
fn defaults_are_felixs() {
    let c = Config::default();
    assert_eq!(c.nftables_mark_mask, 0xffff_0000);
    assert_eq!(c.nftables_mode, NftablesMode::Auto);
    assert_eq!(
        c.default_endpoint_to_host_action,
        EndpointToHostAction::Drop
    );
    assert_eq!(c.nftables_refresh_interval, Duration::from_secs(180));
    assert_eq!(c.route_refresh_interval, Duration::from_secs(90));
    assert_eq!(c.interface_prefix, vec!["cali".to_string()]);
    assert_eq!(
        c.interface_exclude,
        vec![IfaceMatch::Name("kube-ipvs0".into())]
    );
    assert_eq!(c.failsafe_inbound_host_ports.len(), 9);
    assert_eq!(
        c.failsafe_outbound_host_ports[0],
        FailsafePort {
            protocol: PortProtocol::Udp,
            net: None,
            port: 53
        }
    );
    assert_eq!(
        c.kube_node_port_ranges,
        vec![PortRange {
            first: 30000,
            last: 32767
        }]
    );
    assert_eq!(c.device_route_protocol, 3);
    assert_eq!(c.ipv4_normal_route_priority, 1024);
    assert_eq!(c.health_port, 9099);
    assert_eq!(c.prometheus_metrics_port, 9091);
    assert_eq!(c.log_action_rate_limit_burst, 5);
    assert_eq!(c.vxlan_enabled, None);
    assert_eq!(c.nat_port_range, None);
    assert_eq!(c.felix_hostname, None);
    assert_eq!(c.route_table_range, None);
    assert_eq!(
        c.route_table_indices(),
        [RouteTableRange { min: 1, max: 250 }]
    );
    assert!(c
        .mtu_iface_pattern
        .as_ref()
        .is_some_and(|p| p.regex().is_match("eth0")));
}

#[test]
fn bools_take_felixs_spellings_in_any_case() {
    for raw in ["true", "TRUE", "1", "yes", "Yes", "y", "Y", "t", "T"] {
        assert_eq!(p("HealthEnabled", raw), Ok(Value::Bool(true)), "{raw}");
    }
    for raw in ["false", "False", "0", "no", "NO", "n", "f", "F"] {
        assert_eq!(p("HealthEnabled", raw), Ok(Value::Bool(false)), "{raw}");
    }
    for raw in ["2", "on", "off", "enabled", "truee"] {
        assert_bad("HealthEnabled", raw, "expected a bool");
    }
    assert!(with("HealthEnabled", "yes").health_enabled);
    assert_eq!(with("VXLANEnabled", "n").vxlan_enabled, Some(false));
}

#[test]
fn durations_are_float_seconds() {
    assert_eq!(
        with("RouteRefreshInterval", "1.5").route_refresh_interval,
        Duration::from_millis(1500)
    );
    assert_eq!(
        with("NftablesRefreshInterval", "0").nftables_refresh_interval,
        Duration::ZERO
    );
    assert_eq!(
        with("IptablesLockProbeIntervalMillis", "250").iptables_lock_probe_interval_millis,
        Duration::from_millis(250)
    );
    for raw in ["10s", "-1", "abc", "inf", "NaN"] {
        assert_bad("RouteRefreshInterval", raw, "number");
    }
}

#[test]
fn mark_masks_are_hex_or_decimal_with_two_bits() {
    assert_eq!(
        p("IptablesMarkMask", "0xffff0000"),
        Ok(Value::Mask(0xffff_0000))
    );
    assert_eq!(p("IptablesMarkMask", "0XF0"), Ok(Value::Mask(0xf0)));
    assert_eq!(
        p("IptablesMarkMask", "4294901760"),
        Ok(Value::Mask(0xffff_0000))
    );
    assert_eq!(p("IptablesMarkMask", "3"), Ok(Value::Mask(3)));
    assert_bad("IptablesMarkMask", "0x10000", "at least 2");
    for raw in ["0x1ffffffff", "0xfoo", "-1"] {
        assert_bad("IptablesMarkMask", raw, "32-bit mask");
    }
    assert_eq!(
        with("NftablesMarkMask", "0x1f00").nftables_mark_mask,
        0x1f00
    );
}

#[test]
fn interface_lists_follow_felixs_regex() {
    assert_eq!(
        p("InterfacePrefix", "cali,tap,veth_x-1"),
        Ok(Value::Strings(vec![
            "cali".into(),
            "tap".into(),
            "veth_x-1".into()
        ]))
    );
    for raw in ["cali, tap", "cali,", "a234567890123456", "cali.x"] {
        assert_bad("InterfacePrefix", raw, "[a-zA-Z0-9_-]{1,15}");
    }
}

#[test]
fn interface_exclude_takes_names_and_regexes() {
    let c = with("InterfaceExclude", "kube-ipvs0,/^veth.*/,docker0");
    assert_eq!(c.interface_exclude.len(), 3);
    assert!(c.interface_exclude[1].matches("veth1234"));
    assert!(!c.interface_exclude[1].matches("cali1234"));
    assert!(c.interface_exclude[0].matches("kube-ipvs0"));
    assert!(!c.interface_exclude[0].matches("kube-ipvs01"));
    assert_bad(
        "InterfaceExclude",
        "/(unclosed/",
        "invalid regular expression",
    );
    assert_bad("InterfaceExclude", "has space", "neither an interface name");
    // Felix splits on commas without trimming: no spaces, no empty entries, no dots in names.
    assert_bad(
        "InterfaceExclude",
        "kube-ipvs0, docker0",
        "neither an interface name",
    );
    assert_bad(
        "InterfaceExclude",
        "kube-ipvs0,",
        "neither an interface name",
    );
    assert_bad("InterfaceExclude", "eth0.100", "neither an interface name");
    assert_bad("InterfaceExclude", "/a b/", "neither an interface name");
}

#[test]
fn port_lists_take_every_felix_form() {
    let c = with(
        "FailsafeInboundHostPorts",
        "tcp:22, UDP:68,tcp:10.0.0.0/8:80,tcp:[fd00::/64]:443,8080",
    );
    let want = vec![
        FailsafePort {
            protocol: PortProtocol::Tcp,
            net: None,
            port: 22,
        },
        FailsafePort {
            protocol: PortProtocol::Udp,
            net: None,
            port: 68,
        },
        FailsafePort {
            protocol: PortProtocol::Tcp,
            net: Some("10.0.0.0/8".parse().unwrap()),
            port: 80,
        },
        FailsafePort {
            protocol: PortProtocol::Tcp,
            net: Some("fd00::/64".parse().unwrap()),
            port: 443,
        },
        FailsafePort {
            protocol: PortProtocol::Tcp,
            net: None,
            port: 8080,
        },
    ];
    assert_eq!(c.failsafe_inbound_host_ports, want);
    // Networks are normalised, as Felix's `net.String()` does.
    assert_eq!(
        with("FailsafeInboundHostPorts", "udp:10.1.2.3/8:53").failsafe_inbound_host_ports[0].net,
        Some("10.0.0.0/8".parse().unwrap())
    );
    assert_bad("FailsafeInboundHostPorts", "sctp:22", "proto tcp|udp");
    assert_bad("FailsafeInboundHostPorts", "tcp:70000", "0..=65535");
    assert_bad(
        "FailsafeInboundHostPorts",
        "tcp:fd00::/64:80",
        "must be in brackets",
    );
    assert_bad(
        "FailsafeInboundHostPorts",
        "tcp:[10.0.0.0/8]:80",
        "only IPv6",
    );
    assert_bad(
        "FailsafeInboundHostPorts",
        "tcp:10.0.0.0/33:80",
        "not a CIDR",
    );
    assert_bad(
        "FailsafeInboundHostPorts",
        "tcp:[fd00::/64]80",
        "expected port",
    );
    // `none` = no failsafe ports at all (the param is not non-zero).
    assert!(with("FailsafeOutboundHostPorts", "none")
        .failsafe_outbound_host_ports
        .is_empty());
}

#[test]
fn oneofs_are_case_insensitive_and_canonicalised() {
    assert_eq!(p("NFTablesMode", "enabled"), Ok(Value::Word("Enabled")));
    assert_eq!(
        with("nftablesmode", "AUTO").nftables_mode,
        NftablesMode::Auto
    );
    assert_eq!(
        with("NftablesFilterAllowAction", "return").nftables_filter_allow_action,
        AllowAction::Return
    );
    assert_eq!(
        with("LogSeverityScreen", "debug").log_severity_screen,
        LogLevel::Debug
    );
    assert_bad("NftablesFilterDenyAction", "ACCEPT", "DROP|REJECT");
    assert_bad("NFTablesMode", "on", "Enabled|Disabled|Auto");
}

#[test]
fn integers_use_gos_base_prefixes() {
    // Felix reads ints with strconv.ParseInt(raw, 0, 64).
    assert_eq!(p("HealthPort", "9099"), Ok(Value::UInt(9099)));
    assert_eq!(p("HealthPort", "0x2383"), Ok(Value::UInt(9091)));
    assert_eq!(p("HealthPort", "0o17"), Ok(Value::UInt(15)));
    assert_eq!(p("HealthPort", "017"), Ok(Value::UInt(15)));
    assert_eq!(p("HealthPort", "0b101"), Ok(Value::UInt(5)));
    assert_eq!(p("HealthPort", "0"), Ok(Value::UInt(0)));
    for raw in ["9x", "0x", "08", "-1", "1.5", "1e3"] {
        assert_bad("HealthPort", raw, "expected an integer");
    }
    assert_eq!(p("NftablesMarkMask", "0o77"), Ok(Value::Mask(0o77)));
}

#[test]
fn port_ranges() {
    assert_eq!(
        with("NATPortRange", "32768:65535").nat_port_range,
        Some(PortRange {
            first: 32768,
            last: 65535
        })
    );
    assert_eq!(
        with("NATPortRange", "1000").nat_port_range,
        Some(PortRange {
            first: 1000,
            last: 1000
        })
    );
    assert_eq!(
        with("KubeNodePortRanges", "30000:32767,40000:40100").kube_node_port_ranges,
        vec![
            PortRange {
                first: 30000,
                last: 32767
            },
            PortRange {
                first: 40000,
                last: 40100
            }
        ]
    );
    assert_bad("NATPortRange", "200:100", "first port is above last");
    assert_bad("NATPortRange", "1:70000", "0..=65535");
    assert_bad("NATPortRange", "a:b", "0..=65535");
}

#[test]
fn log_action_rate_limit() {
    assert_eq!(
        with("LogActionRateLimit", "10/minute").log_action_rate_limit,
        Some(RateLimit {
            count: 10,
            per: RatePer::Minute
        })
    );
    assert_eq!(
        with("LogActionRateLimit", "9999/day").log_action_rate_limit,
        Some(RateLimit {
            count: 9999,
            per: RatePer::Day
        })
    );
    // Felix's regex: ^[1-9]\d{0,3}/(second|minute|hour|day)$ — lower-case units, 1..=9999.
    for raw in [
        "10",
        "10/week",
        "x/second",
        "0/day",
        "/hour",
        "3/Second",
        "10000/hour",
        "01/day",
        "5/s",
    ] {
        assert_bad("LogActionRateLimit", raw, "N/second");
    }
    assert_eq!(
        with("LogActionRateLimitBurst", "9999").log_action_rate_limit_burst,
        9999
    );
    assert_bad("LogActionRateLimitBurst", "10000", "outside 0..=9999");
}

#[test]
fn addresses_cidrs_hosts_tables_regexes() {
    assert_eq!(
        with("NATOutgoingAddress", "192.0.2.7").nat_outgoing_address,
        Some(Ipv4Addr::new(192, 0, 2, 7))
    );
    assert_bad("NATOutgoingAddress", "fd00::1", "IPv4 address");
    assert_eq!(
        with("DeviceRouteSourceAddressIPv6", "fd00::1").device_route_source_address_ipv6,
        Some("fd00::1".parse::<Ipv6Addr>().unwrap())
    );
    // Felix's cidr-list is IPv4-only; addresses become /32; networks are normalised.
    assert_eq!(
        with("ExternalNodesCIDRList", "10.1.2.3/16, 192.0.2.9").external_nodes_cidr_list,
        vec![
            "10.1.0.0/16".parse().unwrap(),
            "192.0.2.9/32".parse().unwrap()
        ]
    );
    assert_bad("ExternalNodesCIDRList", "10.1.0.0/16,bogus", "not a CIDR");
    assert_bad("ExternalNodesCIDRList", "fd00::/48", "not an IPv4 CIDR");
    // host-address: [a-zA-Z0-9:._+-]{1,64}
    assert_eq!(with("HealthHost", "0.0.0.0").health_host, "0.0.0.0");
    assert_eq!(with("HealthHost", "::1").health_host, "::1");
    assert_eq!(
        with("HealthHost", "node-1.example").health_host,
        "node-1.example"
    );
    assert_bad("HealthHost", "bad_host!", "host address");
    assert_bad("HealthHost", &"a".repeat(65), "host address");
    // hostname: [a-zA-Z0-9_.-]+
    assert_eq!(
        with("FelixHostname", "node_1.x").felix_hostname.as_deref(),
        Some("node_1.x")
    );
    assert_bad("FelixHostname", "node:1", "host name");
    // region: a DNS label of at most 46 characters
    assert_eq!(
        with("OpenstackRegion", "region-one")
            .openstack_region
            .as_deref(),
        Some("region-one")
    );
    assert_bad("OpenstackRegion", "Region", "DNS label");
    assert_bad("OpenstackRegion", &"r".repeat(47), "DNS label");
    // RouteTableRanges: reserved 253-255 may be inside (skipped later, as Felix does); at most
    // 65535 tables in all.
    assert_eq!(
        with("RouteTableRanges", "1-250,1000-2000").route_table_ranges,
        vec![
            RouteTableRange { min: 1, max: 250 },
            RouteTableRange {
                min: 1000,
                max: 2000
            }
        ]
    );
    assert_eq!(
        with("RouteTableRanges", "1-300").route_table_ranges.len(),
        1
    );
    assert_bad("RouteTableRanges", "1-65536", "at most 65535");
    for raw in ["0-10", "20-10", "1-x"] {
        assert_bad("RouteTableRanges", raw, "1 <= min <= max");
    }
    // The deprecated single range stays within 1-250.
    assert_eq!(
        with("RouteTableRange", "10-20").route_table_range,
        Some(RouteTableRange { min: 10, max: 20 })
    );
    assert_bad("RouteTableRange", "1-251", "within 1-250");
    assert_bad("MTUIfacePattern", "(", "invalid regular expression");
    assert_bad("HealthPort", "65536", "outside 0..=65535");
    assert_bad("IPv4NormalRoutePriority", "0", "outside 1..=2147483646");
    assert_bad("VXLANVNI", "16777216", "outside");
    assert_bad("WireguardInterfaceName", "a name", "interface name");
    let c = with(
        "HealthTimeoutOverrides",
        "InternalDataplaneMainLoop=1m30s,CalcGraph=10s",
    );
    assert_eq!(
        c.health_timeout_overrides[0].timeout,
        Duration::from_secs(90)
    );
    assert_bad("HealthTimeoutOverrides", "CalcGraph=10", "not a duration");
}

#[test]
fn none_forces_the_zero_value_and_is_refused_on_non_zero_params() {
    let c = with("FelixHostname", "none");
    assert_eq!(c.felix_hostname, None);
    assert!(!with("HealthEnabled", "None").health_enabled);
    assert_eq!(
        with("RouteRefreshInterval", "NONE").route_refresh_interval,
        Duration::ZERO
    );
    assert_eq!(with("LogFilePath", "none").log_file_path, None);
    assert!(with("InterfaceExclude", "none")
        .interface_exclude
        .is_empty());
    for (name, zero) in [
        ("InterfacePrefix", "none"),
        ("MaxIpsetSize", "0"),
        ("NftablesMarkMask", "none"),
    ] {
        assert_bad(name, zero, "must not be zero");
    }
    assert_bad("NFTablesMode", "none", "no zero value");
}

#[test]
fn empty_means_unset_so_the_lower_source_stands() {
    let r = resolve(vec![
        RawValue {
            key: "LogPrefix".into(),
            value: "from-file".into(),
            source: Source::File {
                path: "/f".into(),
                section: "global".into(),
            },
        },
        RawValue {
            key: "LogPrefix".into(),
            value: "  ".into(),
            source: Source::Env {
                var: "FELIX_LOGPREFIX".into(),
            },
        },
    ])
    .unwrap();
    assert_eq!(r.config.log_prefix, "from-file");
    assert_eq!(r.entry("logprefix").unwrap().source.label(), "file");
}

#[test]
fn values_render_back_in_felix_syntax() {
    // What `config show` prints can be pasted back into felix.cfg and means the same.
    let samples = [
        (
            "FailsafeInboundHostPorts",
            "tcp:22,udp:68,tcp:10.0.0.0/8:80,tcp:[fd00::/64]:80",
        ),
        ("InterfaceExclude", "kube-ipvs0,/^veth/"),
        ("NftablesMarkMask", "0xff00"),
        ("NATPortRange", "1000:2000"),
        ("LogActionRateLimit", "5/hour"),
        ("RouteRefreshInterval", "1.5"),
        ("RouteTableRanges", "1-250,1000-2000"),
    ];
    for (name, raw) in samples {
        let v = p(name, raw).unwrap();
        assert_eq!(v.to_string(), raw, "{name}");
        assert_eq!(p(name, &v.to_string()).unwrap(), v, "{name}");
    }
}

#[test]
fn interface_and_route_table_helpers() {
    let c = with("InterfacePrefix", "cali,tap");
    assert!(c.is_workload_iface("cali123") && c.is_workload_iface("tap0"));
    assert!(!c.is_workload_iface("eth0"));
    let c = with("InterfaceExclude", "kube-ipvs0,/^dummy[0-9]+$/");
    assert!(c.is_excluded_iface("dummy12") && c.is_excluded_iface("kube-ipvs0"));
    assert!(!c.is_excluded_iface("dummy") && !c.is_excluded_iface("kube-ipvs"));

    assert_eq!(
        Config::default().route_table_indices(),
        [RouteTableRange { min: 1, max: 250 }]
    );
    assert_eq!(
        with("RouteTableRange", "5-9").route_table_indices(),
        [RouteTableRange { min: 5, max: 9 }]
    );
    assert_eq!(
        with("RouteTableRanges", "1000-1999").route_table_indices(),
        [RouteTableRange {
            min: 1000,
            max: 1999
        }]
    );
    // `none` on the deprecated range leaves Felix's built-in 1-250.
    assert_eq!(
        with("RouteTableRange", "none").route_table_indices(),
        [RouteTableRange { min: 1, max: 250 }]
    );
}
