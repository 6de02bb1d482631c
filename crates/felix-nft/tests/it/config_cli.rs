//! `felix-nft config show|schema`, driven through the binary the way an operator would: a temp
//! config file, `FELIX_*` variables, JSON out; exit code 2 on a bad die-on-fail value; and the
//! checked-in schema is current.

use testkit as common;

use std::io::Write;
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_felix-nft"));
    // Hermetic: nothing from the developer's or CI's environment leaks in.
    c.env_clear();
    c
}

fn cfg_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn run(cmd: &mut Command) -> (Output, String, String) {
    let out = cmd.output().expect("running felix-nft");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

fn param<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["params"]
        .as_array()
        .expect("params array")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in config show --json"))
}

#[test]
fn config_show_json_prints_every_value_with_its_source() {
    let file = cfg_file(
        "[global]\nLogSeverityScreen = debug\nHealthPort = 9100\nFailsafeInboundHostPorts = tcp:22,tcp:[fd00::/64]:80\n\
         [other]\nMysteryKnob = 7\n",
    );
    let (out, stdout, stderr) = run(bin()
        .args(["config", "show", "--json", "--config"])
        .arg(file.path())
        .env("felix_healthport", "9200")
        .env("FELIX_NFTABLESMARKMASK", "0xff000000")
        .env("FELIX_HEALTHENABLED", "perhaps"));
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is JSON");

    assert_eq!(
        doc["params"].as_array().unwrap().len(),
        felix_nft::config::PARAMS.len()
    );
    assert_eq!(
        doc["config_file"]["path"],
        file.path().display().to_string()
    );
    assert_eq!(doc["config_file"]["present"], true);

    let p = param(&doc, "LogSeverityScreen");
    assert_eq!(p["value"], "DEBUG");
    assert_eq!(p["source"]["kind"], "file");
    assert_eq!(p["source"]["section"], "global");

    let p = param(&doc, "HealthPort");
    assert_eq!(p["value"], 9200);
    assert_eq!(p["source"]["kind"], "env");
    assert_eq!(p["source"]["var"], "felix_healthport");

    let p = param(&doc, "NftablesMarkMask");
    assert_eq!(p["value"], 0xff00_0000u32);
    assert_eq!(p["raw"], "0xff000000");

    let p = param(&doc, "FailsafeInboundHostPorts");
    assert_eq!(
        p["value"],
        serde_json::json!([
            {"protocol": "tcp", "net": null, "port": 22},
            {"protocol": "tcp", "net": "fd00::/64", "port": 80}
        ])
    );
    assert_eq!(p["die_on_fail"], true);

    let p = param(&doc, "NftablesRefreshInterval");
    assert_eq!(p["value"], 180.0);
    assert_eq!(p["source"]["kind"], "default");

    // A bad non-fatal value: default used, the rejected value shown, a warning on stderr.
    let p = param(&doc, "HealthEnabled");
    assert_eq!(p["value"], false);
    assert_eq!(p["rejected"]["value"], "perhaps");
    assert!(
        stderr.contains("warning: HealthEnabled = \"perhaps\""),
        "{stderr}"
    );

    assert_eq!(param(&doc, "NftablesTableOwner")["ours"], true);

    // The unknown key is listed and warned about.
    assert_eq!(doc["unknown"][0]["key"], "MysteryKnob");
    assert_eq!(doc["unknown"][0]["source"]["section"], "other");
    assert!(stderr.contains("unknown parameter MysteryKnob"), "{stderr}");
}

#[test]
fn config_show_text_lists_values_and_sources() {
    let (out, stdout, _) = run(bin()
        .args(["config", "show", "--config", "/nonexistent/felix.cfg"])
        .env("FELIX_LOGPREFIX", "x-pkt"));
    assert!(out.status.success());
    let line = stdout
        .lines()
        .find(|l| l.starts_with("LogPrefix "))
        .expect("LogPrefix line");
    assert!(
        line.contains("x-pkt") && line.contains("(env FELIX_LOGPREFIX)"),
        "{line}"
    );
    assert!(
        stdout.starts_with("# config file: /nonexistent/felix.cfg (absent)"),
        "{stdout}"
    );
}

#[test]
fn a_bad_die_on_fail_value_exits_2_and_lists_every_bad_value() {
    let file = cfg_file("InterfacePrefix = none\nHealthPort = big\n");
    let (out, stdout, stderr) = run(bin()
        .args(["config", "show", "--json", "--config"])
        .arg(file.path())
        .env("FELIX_DEFAULTENDPOINTTOHOSTACTION", "allow"));
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stdout.is_empty(),
        "nothing is shown for a config that does not load: {stdout}"
    );
    common::assert_contains_all(
        &stderr,
        &[
            "invalid configuration: 3 bad value(s), 2 of them fatal",
            "InterfacePrefix = \"none\"",
            "DefaultEndpointToHostAction = \"allow\" (from env FELIX_DEFAULTENDPOINTTOHOSTACTION)",
            "HealthPort = \"big\"",
        ],
    );
}

#[test]
fn an_unparseable_file_is_an_error_naming_the_file() {
    let file = cfg_file("[global\n");
    let (out, _, stderr) = run(bin().args(["config", "show", "--config"]).arg(file.path()));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains(&format!(
            "parsing config file {} as INI",
            file.path().display()
        )),
        "{stderr}"
    );
}

#[test]
fn config_schema_matches_the_checked_in_copy() {
    let (out, stdout, _) = run(bin().args(["config", "schema"]));
    assert!(out.status.success());
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../schemas/config.schema.json"
    );
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        stdout == checked_in,
        "schemas/config.schema.json is stale; regenerate it with:\n    \
         cargo run -q -p felix-nft -- config schema > schemas/config.schema.json"
    );
    // The schema describes every parameter, with its description and raw default.
    let schema: Value = serde_json::from_str(&stdout).unwrap();
    for spec in felix_nft::config::PARAMS {
        let prop = &schema["properties"][spec.name];
        assert!(prop.is_object(), "{} missing from the schema", spec.name);
        assert_eq!(prop["description"], spec.description, "{}", spec.name);
        assert_eq!(prop["x-felix-default"], spec.default, "{}", spec.name);
    }
}

#[test]
fn show_json_values_validate_against_the_schema_types() {
    // Each shown value has the JSON type the schema declares for it (a light check without a
    // validator crate: scalar types only).
    let (_, stdout, _) =
        run(bin().args(["config", "show", "--json", "--config", "/nonexistent/x"]));
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    let schema = felix_nft::config::show::schema();
    for p in doc["params"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let decl = &schema["properties"][name]["type"];
        let v = &p["value"];
        let ty = match v {
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_f64() => "number",
            Value::Number(_) => "integer",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
            Value::Null => "null",
        };
        let ok = match decl {
            Value::String(s) => s == ty || (s == "number" && ty == "integer"),
            Value::Array(a) => a
                .iter()
                .any(|s| s == ty || (s == "number" && ty == "integer")),
            _ => true, // $ref / anyOf: not checked here
        };
        assert!(ok, "{name}: value {v} is {ty}, schema says {decl}");
    }
}
