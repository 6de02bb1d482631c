//! The checked-in JSON Schemas of the message form and the state document match what the Rust
//! types generate. To regenerate after changing the types:
//!
//! ```text
//! FELIX_NFT_UPDATE_SCHEMAS=1 cargo test -p felix-api --test it proto_schema
//! ```

use std::path::PathBuf;

use felix_api::json::{message_schema, state_schema};

const UPDATE_ENV: &str = "FELIX_NFT_UPDATE_SCHEMAS";

fn check(file: &str, schema: schemars::Schema) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join("schemas")
        .join(file);
    let generated = serde_json::to_string_pretty(&schema).unwrap() + "\n";
    if std::env::var_os(UPDATE_ENV).is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "schemas/{file} is stale (or missing): it no longer matches the Rust types. Regenerate \
         it with `{UPDATE_ENV}=1 cargo test -p felix-api --test it proto_schema` and commit the result."
    );
    serde_json::from_str(&generated).unwrap()
}

/// Fails unless `object` has every one of `keys`.
fn assert_has_keys(object: &serde_json::Map<String, serde_json::Value>, keys: &[&str]) {
    for key in keys {
        assert!(object.contains_key(*key), "no {key} in {:?}", object.keys());
    }
}

#[test]
fn message_schema_is_current() {
    let schema = check("message.schema.json", message_schema());
    // Every payload kind and the sequence number are described; unknown names are refused.
    let props = schema["properties"].as_object().unwrap();
    assert_eq!(props.len(), 38, "{:?}", props.keys().collect::<Vec<_>>());
    assert_has_keys(
        props,
        &["sequence_number", "ipset_update", "vtep_update", "in_sync"],
    );
    assert_eq!(schema["additionalProperties"], false);
    let defs = schema["$defs"].as_object().unwrap();
    // Oneof members appear as fields of their message, as in proto3 JSON.
    let rule = defs["Rule"]["properties"].as_object().unwrap();
    assert_has_keys(
        rule,
        &[
            "icmp_type",
            "icmp_type_code",
            "not_icmp_type",
            "not_icmp_type_code",
        ],
    );
    // Enums by name or number; 64-bit integers as number or string.
    let t = serde_json::to_string(&defs["IpSetUpdate"]["properties"]["type"]).unwrap();
    assert!(t.contains("IP_AND_PORT") && t.contains("integer"), "{t}");
    let seq = serde_json::to_string(&props["sequence_number"]).unwrap();
    assert!(seq.contains("string") && seq.contains("integer"), "{seq}");
}

#[test]
fn state_schema_is_current() {
    let schema = check("state.schema.json", state_schema());
    assert_eq!(schema["type"], "array");
}
