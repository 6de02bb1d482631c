//! State documents (DESIGN.md §1): the whole desired state of a node as `ToDataplane` messages in
//! proto3 JSON — either one JSON array, or one message per line. Applying one means: start
//! empty, apply the messages in order, then `InSync`.
//!
//! The loader returns every message or every error at once (with the array index or the line
//! number, and the field path), so one run shows a document's author everything to fix.

use std::path::{Path, PathBuf};

use super::stream::decode_line;
use super::{Origin, RejectReason, Rejected};
use crate::proto::json::{self, JsonError};
use crate::proto::ToDataplane;

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
    let text = std::fs::read(path).map_err(|source| StateError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses a state document. `name` labels line origins (`FILE line N`). A document whose first
/// non-blank character is `[` is an array; anything else is one message per line.
pub fn parse(text: &[u8], name: &str) -> Result<Vec<ToDataplane>, StateError> {
    let first = text.iter().find(|b| !b.is_ascii_whitespace());
    let results: Vec<Result<ToDataplane, Rejected>> = if first == Some(&b'[') {
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
