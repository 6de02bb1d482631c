//! Logging setup (STYLE.md "Errors and logs"): `tracing` records to stderr, one line each, as
//! text by default or as JSON when `FELIX_NFT_LOG_FORMAT=json`. When felix-nft runs as Felix's
//! driver, Felix copies our stderr into its own log (reference §1.1).
//!
//! The level filter comes from `FELIX_NFT_LOG` (tracing `EnvFilter` syntax, e.g.
//! `info,felix_nft::nft=debug`), else from Felix's own `FELIX_LOGSEVERITYSCREEN`
//! (`Debug`/`Info`/`Warning`/`Error`/`Fatal`/`Panic`), which a driver inherits with Felix's
//! environment, else `info`.

use std::error::Error;
use std::fmt::Write as _;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Environment variable choosing the output format: `text` (default) or `json`.
pub const FORMAT_ENV: &str = "FELIX_NFT_LOG_FORMAT";
/// Environment variable holding an `EnvFilter` directive.
pub const FILTER_ENV: &str = "FELIX_NFT_LOG";

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The format named by [`FORMAT_ENV`]; an unknown value falls back to text and is returned as
/// the second element so the caller can warn once logging is up.
pub fn format_from_env() -> (LogFormat, Option<String>) {
    match std::env::var(FORMAT_ENV) {
        Ok(v) if v.eq_ignore_ascii_case("json") => (LogFormat::Json, None),
        Ok(v) if v.eq_ignore_ascii_case("text") || v.is_empty() => (LogFormat::Text, None),
        Ok(v) => (LogFormat::Text, Some(v)),
        Err(_) => (LogFormat::Text, None),
    }
}

/// Maps Felix's `LogSeverityScreen` values to a tracing level name.
pub fn felix_severity_to_level(severity: &str) -> Option<&'static str> {
    match severity.to_ascii_lowercase().as_str() {
        "debug" => Some("debug"),
        "info" => Some("info"),
        "warning" | "warn" => Some("warn"),
        "error" | "fatal" | "panic" => Some("error"),
        _ => None,
    }
}

fn filter_from_env() -> EnvFilter {
    if let Ok(directive) = std::env::var(FILTER_ENV) {
        if let Ok(f) = EnvFilter::try_new(&directive) {
            return f;
        }
    }
    let level = std::env::var("FELIX_LOGSEVERITYSCREEN")
        .ok()
        .and_then(|s| felix_severity_to_level(&s))
        .unwrap_or("info");
    EnvFilter::new(level)
}

/// Installs the global subscriber from the environment. Safe to call more than once (later calls
/// do nothing).
pub fn init() {
    let (format, bad_format) = format_from_env();
    init_with(format);
    if let Some(v) = bad_format {
        tracing::warn!(value = %v, "unknown {FORMAT_ENV}; expected `text` or `json`, using text");
    }
    if let Ok(directive) = std::env::var(FILTER_ENV) {
        if let Err(e) = EnvFilter::try_new(&directive) {
            tracing::warn!(value = %directive, error = %e, "ignoring invalid {FILTER_ENV}");
        }
    }
}

/// Installs the global subscriber with an explicit format.
pub fn init_with(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter_from_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

/// An error and its chain of causes on one line: `outer: cause: root cause`.
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let _ = write!(out, ": {s}");
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn felix_severities() {
        assert_eq!(felix_severity_to_level("Warning"), Some("warn"));
        assert_eq!(felix_severity_to_level("INFO"), Some("info"));
        assert_eq!(felix_severity_to_level("Fatal"), Some("error"));
        assert_eq!(felix_severity_to_level("verbose"), None);
    }

    #[test]
    fn chain_joins_causes() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(chain(&e), "outer: inner");
    }
}
