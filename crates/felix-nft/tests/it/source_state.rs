//! State documents: a JSON array of `ToDataplane` messages, or one per line. The loader returns
//! every message, or every error at once with its index or line and the field path.

use felix_nft::source::state::{self, StateError};
use felix_nft::source::{Origin, RejectReason};

fn fixture() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../felix-api/tests/fixtures/to_dataplane.jsonl"
    ))
    .unwrap()
}

#[test]
fn lines_and_array_forms_load_the_same_messages() {
    let text = fixture();
    let from_lines = state::parse(text.as_bytes(), "fixture").unwrap();
    assert_eq!(from_lines.len(), 37);
    assert_eq!(from_lines.last().unwrap().kind(), "in_sync");

    let array = format!(
        "  [\n{}\n]\n",
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join(",\n")
    );
    let from_array = state::parse(array.as_bytes(), "fixture").unwrap();
    assert_eq!(from_array, from_lines);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    std::fs::write(&path, &array).unwrap();
    assert_eq!(state::load(&path).unwrap(), from_lines);
}

#[test]
fn empty_documents_hold_no_messages() {
    assert!(state::parse(b"", "x").unwrap().is_empty());
    assert!(state::parse(b"\n  \n", "x").unwrap().is_empty());
    assert!(state::parse(b"[]", "x").unwrap().is_empty());
}

#[test]
fn every_bad_array_element_is_reported_with_index_and_path() {
    let doc = br#"[
        {"ipset_update":{"id":"a","type":"NET"}},
        {"ipset_update":{"id":"b","type":"NOPE"}},
        {"in_sync":{}},
        {"workload_endpoint_update":{"endpoint":{"ipv4_nets":"10.0.0.1/32"}}},
        {"sequence_number":1}
    ]"#;
    let Err(StateError::Invalid(errors)) = state::parse(doc, "doc") else {
        panic!("expected errors")
    };
    let got: Vec<(Origin, String)> = errors
        .iter()
        .map(|r| {
            let RejectReason::Json(e) = &r.reason else {
                panic!("{r:?}")
            };
            (r.origin.clone(), e.path.clone())
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (Origin::Item { index: 1 }, "ipset_update.type".to_string()),
            (
                Origin::Item { index: 3 },
                "workload_endpoint_update.endpoint.ipv4_nets".to_string()
            ),
            (Origin::Item { index: 4 }, ".".to_string()),
        ]
    );
    let text = StateError::Invalid(errors).to_string();
    assert!(text.starts_with("3 message(s)"), "{text}");
    assert!(text.contains("message 1: "), "{text}");
}

#[test]
fn every_bad_line_is_reported_with_its_number() {
    let doc = b"{\"in_sync\":{}}\n\n{\"ipset_remove\":{\"id\":7}}\nnot json\n{\"in_sync\":{}}\n";
    let Err(StateError::Invalid(errors)) = state::parse(doc, "state.jsonl") else {
        panic!("expected errors")
    };
    let where_: Vec<String> = errors.iter().map(|r| r.origin.to_string()).collect();
    assert_eq!(where_, ["state.jsonl line 3", "state.jsonl line 4"]);
    assert!(format!("{:?}", errors[0].reason).contains("ipset_remove.id"));
}

#[test]
fn array_syntax_errors_say_where() {
    let err = state::parse(b"[\n {\"in_sync\":{}},\n {\"in_sync\":{}\n]", "x").unwrap_err();
    let StateError::Syntax(e) = err else {
        panic!("{err}")
    };
    assert_eq!(e.line, 4, "{e}");
}

#[test]
fn missing_file_names_the_path() {
    let err = state::load(std::path::Path::new("/nonexistent/state.json")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/state.json"), "{err}");
}
