//! Sources and resolution (§3.1): defaults < config file < environment <
//! ConfigUpdate; every value remembers its source; every bad value is reported at once;
//! die-on-fail stops the load, the rest fall back; unknown keys are kept and warned about.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use felix_nft::config::{
    load, resolve, ConfigError, LoadInputs, LogLevel, Resolved, Source, MARK_BITS_NEEDED,
};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn cfg_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn load_with(
    file: Option<&tempfile::NamedTempFile>,
    env_pairs: &[(&str, &str)],
) -> Result<Resolved, ConfigError> {
    load(&LoadInputs {
        // A path that cannot exist when no file is wanted: never the host's /etc/calico.
        config_file: Some(file.map_or_else(
            || PathBuf::from("/nonexistent/felix.cfg"),
            |f| f.path().to_path_buf(),
        )),
        env: env(env_pairs),
    })
}

fn update(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn each_source_overrides_the_one_below() {
    let file = cfg_file(
        "[global]\nLogSeverityScreen = Warning\nHealthPort = 9100\nRouteRefreshInterval = 10\nNftablesRefreshInterval = 20\n",
    );
    let r = load_with(
        Some(&file),
        &[
            ("FELIX_HEALTHPORT", "9200"),
            ("FELIX_ROUTEREFRESHINTERVAL", "11"),
        ],
    )
    .unwrap();
    // default only
    assert_eq!(r.config.ipsets_refresh_interval, Duration::from_secs(90));
    assert_eq!(
        r.entry("IpsetsRefreshInterval").unwrap().source,
        Source::Default
    );
    // file over default
    assert_eq!(r.config.log_severity_screen, LogLevel::Warning);
    assert_eq!(r.config.nftables_refresh_interval, Duration::from_secs(20));
    assert_eq!(
        r.entry("LogSeverityScreen").unwrap().source,
        Source::File {
            path: file.path().to_path_buf(),
            section: "global".into()
        }
    );
    // env over file
    assert_eq!(r.config.health_port, 9200);
    assert_eq!(
        r.entry("HealthPort").unwrap().source,
        Source::Env {
            var: "FELIX_HEALTHPORT".into()
        }
    );
    // ConfigUpdate over env (and over file, and over default)
    let u = r
        .with_update(&update(&[
            ("HealthPort", "9300"),
            ("NftablesRefreshInterval", "30"),
            ("IpsetsRefreshInterval", "40"),
        ]))
        .unwrap();
    assert_eq!(u.config.health_port, 9300);
    assert_eq!(u.config.nftables_refresh_interval, Duration::from_secs(30));
    assert_eq!(u.config.ipsets_refresh_interval, Duration::from_secs(40));
    assert_eq!(u.entry("HealthPort").unwrap().source, Source::ConfigUpdate);
    // untouched by the update: still env / file
    assert_eq!(u.config.route_refresh_interval, Duration::from_secs(11));
    assert_eq!(u.config.log_severity_screen, LogLevel::Warning);
    let mut changed = u.changed(&r);
    changed.sort();
    assert_eq!(
        changed,
        [
            "HealthPort",
            "IpsetsRefreshInterval",
            "NftablesRefreshInterval"
        ]
    );
    // A later ConfigUpdate replaces the earlier one: HealthPort drops back to env.
    let u2 = u
        .with_update(&update(&[("IpsetsRefreshInterval", "40")]))
        .unwrap();
    assert_eq!(u2.config.health_port, 9200);
    assert_eq!(u2.config.nftables_refresh_interval, Duration::from_secs(20));
}

#[test]
fn env_names_are_case_insensitive_prefix_and_all() {
    let r = load_with(
        None,
        &[
            ("felix_healthport", "9101"),
            ("Felix_LogSeverityScreen", "error"),
            ("FELIX_prometheusMETRICSenabled", "true"),
            ("FELIXHEALTHHOST", "ignored-no-underscore"),
            ("PATH", "/usr/bin"),
        ],
    )
    .unwrap();
    assert_eq!(r.config.health_port, 9101);
    assert_eq!(r.config.log_severity_screen, LogLevel::Error);
    assert!(r.config.prometheus_metrics_enabled);
    assert_eq!(r.config.health_host, "localhost");
    assert!(r.unknown.is_empty(), "{:?}", r.unknown);
}

#[test]
fn ini_sections_are_flattened_and_later_lines_win() {
    let file = cfg_file(
        "LogPrefix = top-level\n\
         ; a comment\n\
         [global]\n\
         HealthPort = 9102\n\
         [anything]\n\
         ipv6support = false\n\
         MTUIfacePattern = \"^eth\\d+$\"\n\
         [later]\n\
         HealthPort = 9103\n",
    );
    let r = load_with(Some(&file), &[]).unwrap();
    assert_eq!(r.config.log_prefix, "top-level");
    assert!(!r.config.ipv6_support);
    assert_eq!(r.config.health_port, 9103);
    assert_eq!(
        r.entry("HealthPort").unwrap().source,
        Source::File {
            path: file.path().to_path_buf(),
            section: "later".into()
        }
    );
    // Quotes are removed, backslashes kept (regexes need them).
    let pat = r.config.mtu_iface_pattern.as_ref().unwrap();
    assert_eq!(pat.as_str(), r"^eth\d+$");
    assert!(pat.regex().is_match("eth12"));
}

#[test]
fn ini_values_follow_go_ini_quotes_and_comments() {
    let file = cfg_file(
        "LogPrefix = calico ; trailing comment\n\
         HealthHost = \"host;with#chars\" # comment after quotes\n\
         EndpointStatusPathPrefix = `/run/x;y`\n\
         InterfacePrefix = cali#tap\n\
         InterfacePrefix = tap\n",
    );
    let r = load_with(Some(&file), &[]).unwrap();
    assert_eq!(r.config.log_prefix, "calico");
    assert_eq!(r.bad_values.len(), 1, "{:?}", r.bad_values); // HealthHost: ';' and '#' not allowed
    assert_eq!(r.bad_values[0].value, "host;with#chars");
    assert_eq!(
        r.config.endpoint_status_path_prefix.as_deref(),
        Some("/run/x;y")
    );
    assert_eq!(r.config.interface_prefix, ["tap"]);
    assert!(r
        .warnings()
        .iter()
        .any(|w| w.contains("InterfacePrefix is set more than once")));
}

#[test]
fn config_file_path_comes_from_flag_then_env_then_default() {
    let a = cfg_file("HealthPort = 1111\n");
    let b = cfg_file("HealthPort = 2222\n");
    let b_path = b.path().display().to_string();
    // FELIX_CONFIGFILE (any case) when there is no --config.
    let r = load(&LoadInputs {
        config_file: None,
        env: env(&[("felix_configfile", &b_path)]),
    })
    .unwrap();
    assert_eq!(r.config.health_port, 2222);
    assert_eq!(r.file.as_ref().unwrap().path, b.path());
    assert_eq!(r.config.config_file, b_path);
    // --config beats FELIX_CONFIGFILE, and shows as the ConfigFile parameter's source.
    let r = load(&LoadInputs {
        config_file: Some(a.path().to_path_buf()),
        env: env(&[("FELIX_CONFIGFILE", &b_path)]),
    })
    .unwrap();
    assert_eq!(r.config.health_port, 1111);
    assert_eq!(
        r.entry("ConfigFile").unwrap().source.label(),
        "command-line"
    );
    // Neither: the default path (whatever the host has there, only the path is checked).
    let path = felix_nft::config::sources::config_file_path(None, &[]);
    assert_eq!(path, PathBuf::from("/etc/calico/felix.cfg"));
}

#[test]
fn an_absent_file_is_fine_a_broken_one_is_not() {
    let r = load_with(None, &[]).unwrap();
    let f = r.file.as_ref().unwrap();
    assert!(!f.present);
    assert!(r.warnings().iter().any(|w| w.contains("does not exist")));

    let bad = cfg_file("[global\nHealthPort = 1\n");
    match load_with(Some(&bad), &[]) {
        Err(ConfigError::ParseFile { path, .. }) => assert_eq!(path, bad.path()),
        other => panic!("expected ParseFile, got {other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    match load(&LoadInputs {
        config_file: Some(dir.path().to_path_buf()),
        env: vec![],
    }) {
        Err(e @ ConfigError::ReadFile { .. }) => {
            assert!(e.to_string().contains(&dir.path().display().to_string()))
        }
        other => panic!("expected ReadFile, got {other:?}"),
    }
}

#[test]
fn unknown_keys_are_kept_and_warned_about() {
    let file = cfg_file("[global]\nNoSuchThing = 1\nEtcdEndpoints = http://x:2379\n");
    let r = load_with(
        Some(&file),
        &[("FELIX_ALSOUNKNOWN", "x"), ("FELIX_nosuchthing", "2")],
    )
    .unwrap();
    let keys: Vec<(&str, &str, &str, bool)> = r
        .unknown
        .iter()
        .map(|u| {
            (
                u.key.as_str(),
                u.value.as_str(),
                u.source.label(),
                u.felix_param,
            )
        })
        .collect();
    // One entry per key (case-insensitively), the highest source's value.
    assert_eq!(
        keys,
        [
            ("ALSOUNKNOWN", "x", "env", false),
            ("EtcdEndpoints", "http://x:2379", "file", true),
            ("nosuchthing", "2", "env", false),
        ]
    );
    let warnings = r.warnings();
    assert!(warnings
        .iter()
        .any(|w| w.contains("unknown parameter ALSOUNKNOWN")));
    assert!(warnings
        .iter()
        .any(|w| w.contains("unknown parameter nosuchthing")));
    // A Felix parameter felix-nft does not model is kept but not warned about.
    assert!(!warnings.iter().any(|w| w.contains("EtcdEndpoints")));
    // ConfigUpdate's unknown keys are kept too.
    let u = r.with_update(&update(&[("FromFelixOnly", "v")])).unwrap();
    assert!(u
        .unknown
        .iter()
        .any(|k| k.key == "FromFelixOnly" && k.source == Source::ConfigUpdate));
}

#[test]
fn non_fatal_bad_values_fall_back_to_the_default_with_a_warning() {
    // Bad in env over a good file value: Felix falls back to the default, not the file.
    let file = cfg_file("HealthPort = 9500\n");
    let r = load_with(
        Some(&file),
        &[
            ("FELIX_HEALTHPORT", "99999"),
            ("FELIX_HEALTHENABLED", "maybe"),
        ],
    )
    .unwrap();
    assert_eq!(r.config.health_port, 9099);
    assert!(!r.config.health_enabled);
    let e = r.entry("HealthPort").unwrap();
    assert_eq!(e.source, Source::Default);
    let rej = e.rejected.as_ref().unwrap();
    assert_eq!(rej.value, "99999");
    assert_eq!(
        rej.source,
        Source::Env {
            var: "FELIX_HEALTHPORT".into()
        }
    );
    assert!(!rej.fatal);
    assert_eq!(r.bad_values.len(), 2);
    let w = r.warnings().join("\n");
    assert!(
        w.contains("HealthPort = \"99999\" (from env FELIX_HEALTHPORT)"),
        "{w}"
    );
    assert!(w.contains("using the default"), "{w}");
    assert!(w.contains("HealthEnabled = \"maybe\""), "{w}");
}

#[test]
fn die_on_fail_stops_the_load_and_every_bad_value_is_reported_at_once() {
    let file = cfg_file(
        "[global]\nFailsafeInboundHostPorts = tcp:22,icmp:0\nInterfacePrefix = cali,\nHealthPort = x\n",
    );
    let err = load_with(
        Some(&file),
        &[
            ("FELIX_NFTABLESFILTERDENYACTION", "maybe"),
            ("FELIX_LOGSEVERITYSCREEN", "LOUD"),
            ("FELIX_NFTABLESMARKMASK", "0x1"),
        ],
    )
    .unwrap_err();
    let ConfigError::Invalid { bad } = &err else {
        panic!("expected Invalid, got {err:?}");
    };
    let mut names: Vec<(&str, bool)> = bad.iter().map(|b| (b.name, b.fatal)).collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("FailsafeInboundHostPorts", true),
            ("HealthPort", false),
            ("InterfacePrefix", true),
            ("LogSeverityScreen", false),
            ("NftablesFilterDenyAction", true),
            ("NftablesMarkMask", true),
        ]
    );
    // Each line names key, value, source and the rule.
    let text = err.to_string();
    assert!(
        text.starts_with("invalid configuration: 6 bad value(s), 4 of them fatal"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
        "FailsafeInboundHostPorts = \"tcp:22,icmp:0\" (from file {} [global]): entry \"icmp:0\"",
        file.path().display()
    )),
        "{text}"
    );
    assert!(text.contains("NftablesMarkMask = \"0x1\" (from env FELIX_NFTABLESMARKMASK): mark mask 0x1 has 1 bit(s) set; at least 2"), "{text}");
    assert!(text.contains("NftablesFilterDenyAction = \"maybe\" (from env FELIX_NFTABLESFILTERDENYACTION): expected one of DROP|REJECT"), "{text}");
    assert!(text.contains("HealthPort = \"x\""), "{text}");
}

#[test]
fn bad_values_in_overridden_sources_are_still_checked_as_felix_does() {
    // The file's bad values are overridden by good env values, but Felix parses every
    // source: a die-on-fail one still stops the load, a fall-back one is reported.
    let file = cfg_file("InterfacePrefix = bad prefix\nHealthPort = x\n");
    let err = load_with(
        Some(&file),
        &[
            ("FELIX_INTERFACEPREFIX", "cali"),
            ("FELIX_HEALTHPORT", "9100"),
        ],
    )
    .unwrap_err();
    let ConfigError::Invalid { bad } = &err else {
        panic!("expected Invalid, got {err:?}")
    };
    assert_eq!(bad.len(), 2);
    assert!(bad.iter().all(|b| b.shadowed));
    assert!(
        err.to_string()
            .contains("fatal, even though a higher source overrides it"),
        "{err}"
    );

    let file = cfg_file("HealthPort = x\n");
    let r = load_with(Some(&file), &[("FELIX_HEALTHPORT", "9100")]).unwrap();
    assert_eq!(r.config.health_port, 9100);
    assert!(r.entry("HealthPort").unwrap().rejected.is_none());
    assert_eq!(r.bad_values.len(), 1);
    assert!(
        r.warnings()
            .iter()
            .any(|w| w.contains("ignored, a higher source overrides it")),
        "{:?}",
        r.warnings()
    );
}

#[test]
fn none_on_a_non_zero_parameter_is_fatal_even_without_die_on_fail() {
    // MaxIpsetSize is non-zero but not die-on-fail: a bad number falls back...
    let r = load_with(None, &[("FELIX_MAXIPSETSIZE", "lots")]).unwrap();
    assert_eq!(r.config.max_ipset_size, 1_048_576);
    // ...but `none` stops the load, as in Felix.
    let err = load_with(None, &[("FELIX_MAXIPSETSIZE", "none")]).unwrap_err();
    assert!(err.to_string().contains("MaxIpsetSize = \"none\""), "{err}");
    // `none` on a parameter that allows zero is fine.
    let r = load_with(None, &[("FELIX_FAILSAFEINBOUNDHOSTPORTS", "none")]).unwrap();
    assert!(r.config.failsafe_inbound_host_ports.is_empty());
}

#[test]
fn a_bad_value_in_configupdate_is_reported_too() {
    let r = load_with(None, &[]).unwrap();
    let err = r
        .with_update(&update(&[
            ("DefaultEndpointToHostAction", "PERMIT"),
            ("HealthPort", "-1"),
        ]))
        .unwrap_err();
    let ConfigError::Invalid { bad } = err else {
        panic!()
    };
    assert_eq!(bad.len(), 2);
    assert!(bad.iter().all(|b| b.source == Source::ConfigUpdate));
}

#[test]
fn mark_mask_must_hold_the_renderers_bits() {
    // Felix's own rule (≥ 2 bits) passes, ours (§4: accept, pass, drop, scratch0,
    // scratch1) does not.
    assert_eq!(MARK_BITS_NEEDED, 5);
    let err = load_with(None, &[("FELIX_NFTABLESMARKMASK", "0xf0000")]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("mark mask 0xf0000 has 4 bit(s); felix-nft needs 5 (accept, pass, drop, scratch0, scratch1)"), "{text}");
    assert!(load_with(None, &[("FELIX_NFTABLESMARKMASK", "0x1f0000")]).is_ok());
    // Wireguard takes one more bit.
    let err = load_with(
        None,
        &[
            ("FELIX_NFTABLESMARKMASK", "0x1f0000"),
            ("FELIX_WIREGUARDENABLED", "true"),
        ],
    )
    .unwrap_err();
    assert!(err.to_string().contains("needs 6"), "{err}");
    assert!(load_with(
        None,
        &[
            ("FELIX_NFTABLESMARKMASK", "0x3f0000"),
            ("FELIX_WIREGUARDENABLED", "true")
        ]
    )
    .is_ok());
    // The iptables-mode mask is not ours: Felix's 2-bit rule only.
    assert!(load_with(None, &[("FELIX_IPTABLESMARKMASK", "0x3")]).is_ok());
}

#[test]
fn resolve_is_hermetic_and_reports_sources() {
    // No file, no env: everything is a default.
    let r = resolve(Vec::new()).unwrap();
    assert!(r.entries.iter().all(|e| e.source == Source::Default));
    assert!(r.file.is_none());
}
