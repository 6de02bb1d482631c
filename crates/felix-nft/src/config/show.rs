//! `felix-nft config show [--json]` and `config schema`: rendering a [`Resolved`] configuration
//! for people (a table) and for tools (JSON), and the JSON Schema of [`Config`].
//!
//! The command functions take their output streams as arguments so tests can drive them;
//! `cli.rs` only forwards its arguments here.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Map, Value as Json};

use super::{load_for_cli, Config, ConfigError, Resolved, EXIT_BAD_CONFIG};

/// The checked-in copy of [`schema`], relative to the crate root.
pub const SCHEMA_PATH: &str = "schemas/config.schema.json";

/// The JSON Schema of the effective configuration (`Config`, as `config show --json` prints
/// each value), generated from the parameter table by schemars.
pub fn schema() -> Json {
    serde_json::to_value(schemars::schema_for!(Config)).unwrap_or(Json::Null)
}

/// [`schema`] as pretty-printed text with a final newline, exactly as checked in.
pub fn schema_text() -> String {
    let mut s = serde_json::to_string_pretty(&schema()).unwrap_or_default();
    s.push('\n');
    s
}

/// Every parameter with its typed value, its value in Felix syntax, its source and flags;
/// unknown keys; warnings.
pub fn to_json(r: &Resolved) -> Json {
    let typed = match serde_json::to_value(&r.config) {
        Ok(Json::Object(m)) => m,
        _ => Map::new(),
    };
    let params: Vec<Json> = r
        .entries
        .iter()
        .map(|e| {
            let mut o = json!({
                "name": e.spec.name,
                "value": typed.get(e.spec.name).cloned().unwrap_or(Json::Null),
                "raw": e.value.to_string(),
                "source": e.source,
                "die_on_fail": e.spec.die_on_fail(),
                "ours": e.spec.ours(),
                "inert": e.spec.inert(),
            });
            if let (Some(rej), Json::Object(m)) = (&e.rejected, &mut o) {
                m.insert("rejected".into(), json!(rej));
            }
            o
        })
        .collect();
    json!({
        "config_file": r.file,
        "params": params,
        "unknown": r.unknown,
        "warnings": r.warnings(),
    })
}

/// A plain table: name, value in Felix syntax, source; then unknown keys and warnings.
pub fn to_text(r: &Resolved) -> String {
    let mut s = String::new();
    if let Some(f) = &r.file {
        s.push_str(&format!(
            "# config file: {}{}\n",
            f.path.display(),
            if f.present { "" } else { " (absent)" }
        ));
    }
    let width = r
        .entries
        .iter()
        .map(|e| e.spec.name.len())
        .max()
        .unwrap_or(0);
    let shown = |v: String| if v.is_empty() { "-".to_string() } else { v };
    let vwidth = r
        .entries
        .iter()
        .map(|e| shown(e.value.to_string()).len())
        .filter(|&n| n <= 40)
        .max()
        .unwrap_or(0);
    for e in &r.entries {
        let mut note = String::new();
        if e.spec.ours() {
            note.push_str(" [felix-nft]");
        }
        if e.spec.inert() {
            note.push_str(" [not used by felix-nft]");
        }
        if let Some(rej) = &e.rejected {
            note.push_str(&format!(" [rejected {:?} from {}]", rej.value, rej.source));
        }
        s.push_str(&format!(
            "{:width$}  {:vwidth$}  ({}){note}\n",
            e.spec.name,
            shown(e.value.to_string()),
            e.source
        ));
    }
    for u in &r.unknown {
        s.push_str(&format!(
            "{:width$}  {:vwidth$}  ({}) [{}]\n",
            u.key,
            u.value,
            u.source,
            if u.felix_param {
                "Felix parameter, not used by felix-nft"
            } else {
                "unknown"
            }
        ));
    }
    s
}

/// `config show`: loads from `--config`/environment and prints. Returns the exit code: 0, or
/// [`EXIT_BAD_CONFIG`] when a die-on-fail value is bad, or 1 when the file cannot be read.
pub fn show_command(
    config_file: Option<&Path>,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let resolved = match load_for_cli(config_file) {
        Ok(r) => r,
        Err(e) => return report_error(&e, err),
    };
    for w in resolved.warnings() {
        let _ = writeln!(err, "warning: {w}");
    }
    let text = if json {
        serde_json::to_string_pretty(&to_json(&resolved)).unwrap_or_default() + "\n"
    } else {
        to_text(&resolved)
    };
    match out.write_all(text.as_bytes()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// `config schema`: prints [`schema_text`].
pub fn schema_command(out: &mut dyn Write) -> u8 {
    match out.write_all(schema_text().as_bytes()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Prints a load error with its cause chain; returns the exit code it calls for.
pub fn report_error(e: &ConfigError, err: &mut dyn Write) -> u8 {
    let _ = write!(err, "felix-nft: {e}");
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let _ = write!(err, ": {c}");
        cause = c.source();
    }
    let _ = writeln!(err);
    match e {
        ConfigError::Invalid { .. } => EXIT_BAD_CONFIG,
        ConfigError::ReadFile { .. } | ConfigError::ParseFile { .. } => 1,
    }
}
