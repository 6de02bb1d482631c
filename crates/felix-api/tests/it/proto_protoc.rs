//! Our hand-written prost types checked against an encoder nobody here wrote: `protoc` with a
//! `.proto` written from the reference's field numbers (tests/fixtures/felixbackend.proto).
//!
//! For every payload kind of `ToDataplane` and `FromDataplane`, a fixture message with every field
//! set (tests/fixtures/*.jsonl) is turned into protobuf text format by a converter in this file
//! (independent of our codecs), and:
//! - protoc → us: `protoc --encode` of that text, decoded by prost, equals what our JSON codec
//!   makes of the fixture;
//! - us → protoc: prost's encoding of that value, `protoc --decode`d, reads exactly as protoc's
//!   own encoding of the text does, with no unknown fields.
//!
//! Needs `protoc` (Debian `protobuf-compiler`); without it the tests fail and say so.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use felix_api::{self as proto, json, FromDataplane, ToDataplane};
use prost::Message;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Runs protoc on the fixture .proto with `mode` (`--encode=…` / `--decode=…`).
fn protoc(mode: &str, input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("protoc")
        .arg(format!("--proto_path={}", fixtures().display()))
        .arg(mode)
        .arg("felixbackend.proto")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("running protoc ({e}); install Debian's protobuf-compiler to run these tests")
        });
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "protoc {mode} failed: {}\ninput:\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(input)
    );
    out.stdout
}

/// Fields whose JSON object is a proto map (written as repeated `{key value}` entries).
const MAP_FIELDS: &[&str] = &["config", "source_to_raw_config", "labels", "annotations"];

/// JSON (proto field names, enums as numbers) → protobuf text format.
fn to_text(v: &Value) -> String {
    let mut out = String::new();
    let Value::Object(fields) = v else {
        panic!("not an object: {v}")
    };
    for (k, v) in fields {
        field_text(&mut out, k, v);
    }
    out
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => {
            assert!(
                !s.contains(['"', '\\']) && s.is_ascii(),
                "keep fixture strings plain: {s}"
            );
            format!("\"{s}\"")
        }
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("not a scalar: {other}"),
    }
}

fn field_text(out: &mut String, k: &str, v: &Value) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| field_text(out, k, i)),
        Value::Object(entries) if MAP_FIELDS.contains(&k) => {
            for (mk, mv) in entries {
                let key = if k == "source_to_raw_config" {
                    mk.clone()
                } else {
                    format!("\"{mk}\"")
                };
                let value = match mv {
                    Value::Object(_) => format!("{{ {} }}", to_text(mv)),
                    other => format!(": {}", scalar_text(other)),
                };
                out.push_str(&format!("{k} {{ key: {key} value {value} }}\n"));
            }
        }
        Value::Object(_) => out.push_str(&format!("{k} {{ {} }}\n", to_text(v))),
        other => out.push_str(&format!("{k}: {}\n", scalar_text(other))),
    }
}

fn lines(file: &str) -> Vec<String> {
    std::fs::read_to_string(fixtures().join(file))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// The payload names of `message NAME`'s `oneof payload` in the fixture .proto.
fn oneof_members(message: &str) -> Vec<String> {
    let text = std::fs::read_to_string(fixtures().join("felixbackend.proto")).unwrap();
    let start = text.find(&format!("message {message} {{")).unwrap();
    let body = &text[start..];
    let oneof = &body[body.find("oneof payload {").unwrap()..];
    let oneof = &oneof[..oneof.find('}').unwrap()];
    oneof
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect()
}

fn assert_no_unknown_fields(text: &str, context: &str) {
    for line in text.lines() {
        let first = line.trim_start().split([':', ' ']).next().unwrap_or("");
        assert!(
            first.parse::<u64>().is_err(),
            "protoc sees an unknown field ({line}) in {context}:\n{text}"
        );
    }
}

fn check_both_directions<M: Message + Default + PartialEq + std::fmt::Debug>(
    fixture: &str,
    protoc_name: &str,
    ours: M,
) {
    let value: Value = serde_json::from_str(fixture).unwrap();
    let text = to_text(&value);
    let protoc_bytes = protoc(&format!("--encode={protoc_name}"), text.as_bytes());

    // protoc → us.
    let decoded = M::decode(&protoc_bytes[..]).unwrap();
    assert_eq!(
        decoded, ours,
        "prost reads protoc's bytes differently:\n{text}"
    );

    // us → protoc.
    let protoc_view_of_ours = protoc(&format!("--decode={protoc_name}"), &ours.encode_to_vec());
    let protoc_view_of_own = protoc(&format!("--decode={protoc_name}"), &protoc_bytes);
    let ours_text = String::from_utf8(protoc_view_of_ours).unwrap();
    assert_no_unknown_fields(&ours_text, fixture);
    assert_eq!(
        ours_text,
        String::from_utf8(protoc_view_of_own).unwrap(),
        "protoc reads our bytes differently from its own"
    );
}

/// Checks every line of `file` (JSON of `message`) against protoc in both directions, and that
/// the lines cover every payload of the message's oneof; `kind` names a line's payload.
fn check_every_payload<M>(file: &str, message: &str, kind: impl Fn(&M) -> &'static str)
where
    M: Message + Default + PartialEq + std::fmt::Debug + DeserializeOwned,
{
    let mut seen = Vec::new();
    for line in lines(file) {
        let ours: M = json::decode(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        seen.push(kind(&ours).to_string());
        check_both_directions(&line, &format!("felix.{message}"), ours);
    }
    let mut want = oneof_members(message);
    want.sort();
    seen.sort();
    assert_eq!(
        seen, want,
        "the fixtures must cover every {message} payload"
    );
}

#[test]
fn every_to_dataplane_payload_against_protoc() {
    check_every_payload("to_dataplane.jsonl", "ToDataplane", ToDataplane::kind);
}

#[test]
fn every_from_dataplane_payload_against_protoc() {
    check_every_payload("from_dataplane.jsonl", "FromDataplane", FromDataplane::kind);
}

#[test]
fn unknown_fields_are_skipped() {
    // A newer Felix: an unknown top-level field (99, varint), an unknown field inside a known
    // payload (IPSetRemove field 7, bytes), and the known data around them.
    let known = ToDataplane {
        sequence_number: 5,
        payload: Some(proto::to_dataplane::Payload::IpsetRemove(
            proto::IpSetRemove { id: "a".into() },
        )),
    };
    let mut bytes = Vec::new();
    bytes.extend([0x98, 0x06, 0x01]); // field 99, varint 1
    bytes.extend([0x22, 0x08, 0x0a, 0x01, b'a', 0x3a, 0x03, b'z', b'z', b'z']); // ipset_remove
    bytes.extend([0x78, 0x05]); // sequence_number (15) = 5
    assert_eq!(proto::decode_to_dataplane(&bytes).unwrap(), known);

    // A payload kind from the future (field 40) leaves the payload empty, not an error.
    let future = [0xc2, 0x02, 0x02, 0x08, 0x01, 0x78, 0x09];
    let m = proto::decode_to_dataplane(&future).unwrap();
    assert_eq!(m.sequence_number, 9);
    assert_eq!(m.payload, None);

    // Unknown data after a complete message.
    let mut with_unknown = known.encode_to_vec();
    with_unknown.extend([0xa0, 0x06, 0x2a]); // field 100, varint 42
    assert_eq!(proto::decode_to_dataplane(&with_unknown).unwrap(), known);
}

#[test]
fn malformed_protobuf_is_an_error_naming_the_type() {
    let err = proto::decode_to_dataplane(&[0x12, 0x7f]).unwrap_err();
    assert_eq!(err.what, "felix.ToDataplane");
    assert!(err.to_string().contains("2 bytes"), "{err}");
}
