//! State documents: the whole desired state of a node as `ToDataplane` messages in
//! proto3 JSON — either one JSON array, or one message per line. Applying one means: start
//! empty, apply the messages in order, then `InSync`.
//!
//! The loader returns every message or every error at once (with the array index or the line
//! number, and the field path), so one run shows a document's author everything to fix.
//!
//! Because applying a document removes whatever it does not describe, [`check_complete`] refuses
//! the two documents that are almost always accidents: one that describes nothing (an empty
//! file, `[]`, only `config_update`/`in_sync`), which would wipe the node's policy and static ARP
//! entries, and one message per line that does not end with `in_sync`, which cannot be told from
//! a file cut short at a line boundary. (An array cut short does not parse.)

use std::path::{Path, PathBuf};

use super::stream::decode_line;
use super::{Origin, RejectReason, Rejected};
use felix_api::json::{self, JsonError};
use felix_api::ToDataplane;

/// Why a state document could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading state document {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state document is not a JSON array")]
    Syntax(#[source] JsonError),
    #[error("{} message(s) of the state document are invalid: {}", .0.len(), summary(.0))]
    Invalid(Vec<Rejected>),
    #[error("the state document describes nothing ({0}): applying it would remove every policy, endpoint and static ARP entry felix-nft programmed; pass --allow-empty if that is what you mean, or run `felix-nft cleanup` to remove everything felix-nft owns")]
    Empty(&'static str),
    #[error("the state document has one message per line and its last message is {last}, not in_sync: it may have been cut short; end a whole document with {{\"in_sync\":{{}}}} (or pass --allow-empty to apply it as it is)")]
    Unterminated { last: &'static str },
}

/// How a document was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Array,
    Lines,
}

/// Refuses a document that describes nothing, or a line-form one not ending with `in_sync`
/// (see the module's comment); `allow_empty` accepts both as they are.
pub fn check_complete(
    messages: &[ToDataplane],
    form: Form,
    allow_empty: bool,
) -> Result<(), StateError> {
    if allow_empty {
        return Ok(());
    }
    let describes = |m: &&ToDataplane| !matches!(m.kind(), "in_sync" | "config_update");
    if !messages.iter().any(|m| describes(&m)) {
        return Err(StateError::Empty(if messages.is_empty() {
            "no messages"
        } else {
            "only in_sync and config_update messages"
        }));
    }
    match messages.last().map(ToDataplane::kind) {
        Some(last) if form == Form::Lines && last != "in_sync" => {
            Err(StateError::Unterminated { last })
        }
        _ => Ok(()),
    }
}

fn summary(errors: &[Rejected]) -> String {
    errors
        .iter()
        .map(|r| format!("{}: {}", r.origin, r.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Loads a state document from a file.
pub fn load(path: &Path) -> Result<Vec<ToDataplane>, StateError> {
    load_with_form(path).map(|(m, _)| m)
}

/// Loads a state document from a file, and says how it was written.
pub fn load_with_form(path: &Path) -> Result<(Vec<ToDataplane>, Form), StateError> {
    let text = std::fs::read(path).map_err(|source| StateError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let form = form_of(&text);
    parse(&text, &path.display().to_string()).map(|m| (m, form))
}

/// A document whose first non-blank character is `[` is an array.
fn form_of(text: &[u8]) -> Form {
    match text.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => Form::Array,
        _ => Form::Lines,
    }
}

/// Parses a state document. `name` labels line origins (`FILE line N`). A document whose first
/// non-blank character is `[` is an array; anything else is one message per line.
pub fn parse(text: &[u8], name: &str) -> Result<Vec<ToDataplane>, StateError> {
    let results: Vec<Result<ToDataplane, Rejected>> = if form_of(text) == Form::Array {
        let text = std::str::from_utf8(text).map_err(|_| {
            StateError::Syntax(JsonError {
                path: ".".into(),
                message: "the document is not UTF-8".into(),
                line: 0,
                column: 0,
            })
        })?;
        // A valid document decodes in one pass, straight into messages.
        if let Ok(messages) = serde_json::from_str::<Vec<ToDataplane>>(text) {
            return Ok(messages);
        }
        // Else parse the array's syntax first, then each element on its own, so that one bad
        // element does not hide the others (serde_json cannot resume after an error
        // mid-stream).
        let elements: Vec<serde_json::Value> = json::decode(text).map_err(StateError::Syntax)?;
        elements
            .into_iter()
            .enumerate()
            .map(|(index, v)| {
                json::decode_value(v).map_err(|e| Rejected {
                    origin: Origin::Item { index },
                    reason: RejectReason::Json(e),
                })
            })
            .collect()
    } else {
        let stream: std::sync::Arc<str> = std::sync::Arc::from(name);
        text.split(|b| *b == b'\n')
            .enumerate()
            .filter_map(|(i, line)| {
                decode_line(
                    line,
                    Origin::Line {
                        stream: stream.clone(),
                        line: i as u64 + 1,
                    },
                )
            })
            .map(|r| r.map(|u| u.message))
            .collect()
    };
    let mut messages = Vec::with_capacity(results.len());
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(m) => messages.push(m),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(messages)
    } else {
        Err(StateError::Invalid(errors))
    }
}
