//! Where raw values come from (§3.1): the INI config file, `FELIX_*` environment
//! variables and Felix's `ConfigUpdate`. Each raw value carries its [`Source`], so every effective
//! value and every error can say where it came from.
//!
//! The process environment is never read here: callers pass it in, so tests are hermetic.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use ini::{Ini, ParseOption};
use serde::Serialize;

use super::ConfigError;

/// Prefix of environment variables that set parameters (matched case-insensitively).
pub const ENV_PREFIX: &str = "FELIX_";
/// Prefix of felix-nft's own process settings (`FELIX_NFT_LOG_FORMAT`): not parameters, so not
/// read as `FELIX_*` config. Felix parameter names have no `_`, so none is shadowed.
pub const OWN_ENV_PREFIX: &str = "FELIX_NFT_";
/// The config file used when neither `--config` nor `FELIX_CONFIGFILE` names one.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/calico/felix.cfg";
/// The environment variable naming the config file.
pub const CONFIG_FILE_ENV: &str = "FELIX_CONFIGFILE";

/// Where a value came from. Ordered lowest to highest precedence by [`Source::rank`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Source {
    /// The built-in default of the parameter table.
    Default,
    /// A line of the INI config file; `section` is `""` for lines before any section header.
    File { path: PathBuf, section: String },
    /// An environment variable, named as it was spelled.
    Env { var: String },
    /// Felix's `ConfigUpdate` message (§2.3).
    ConfigUpdate,
    /// A command-line flag (`--config` sets `ConfigFile`); beats every other source.
    CommandLine { flag: String },
}

impl Source {
    /// Precedence: a higher rank overrides a lower one.
    pub fn rank(&self) -> u8 {
        match self {
            Source::Default => 0,
            Source::File { .. } => 1,
            Source::Env { .. } => 2,
            Source::ConfigUpdate => 3,
            Source::CommandLine { .. } => 4,
        }
    }

    /// A short stable label: `default`, `file`, `env`, `config-update`.
    pub fn label(&self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::File { .. } => "file",
            Source::Env { .. } => "env",
            Source::ConfigUpdate => "config-update",
            Source::CommandLine { .. } => "command-line",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File { path, section } if section.is_empty() => {
                write!(f, "file {}", path.display())
            }
            Source::File { path, section } => write!(f, "file {} [{section}]", path.display()),
            Source::Env { var } => write!(f, "env {var}"),
            Source::ConfigUpdate => f.write_str("ConfigUpdate"),
            Source::CommandLine { flag } => write!(f, "command line {flag}"),
        }
    }
}

/// One raw `key = value` from one source, before parsing. `key` is as spelled at the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawValue {
    pub key: String,
    pub value: String,
    pub source: Source,
}

/// Case-insensitive environment lookup; the last match wins, as the environment is scanned in
/// order.
fn env_lookup<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The config file to read: `--config`, else `FELIX_CONFIGFILE` (any case, non-empty), else
/// [`DEFAULT_CONFIG_FILE`].
pub fn config_file_path(explicit: Option<&Path>, env: &[(String, String)]) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    match env_lookup(env, CONFIG_FILE_ENV).map(str::trim) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_CONFIG_FILE),
    }
}

/// Every `FELIX_<NAME>` variable as a raw value named `<NAME>` (prefix matched in any case),
/// except felix-nft's own `FELIX_NFT_*` settings.
pub fn env_values(env: &[(String, String)]) -> Vec<RawValue> {
    env.iter()
        .filter_map(|(k, v)| {
            if k.get(..OWN_ENV_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(OWN_ENV_PREFIX))
            {
                return None;
            }
            let prefix = k.get(..ENV_PREFIX.len())?;
            let name = k.get(ENV_PREFIX.len()..)?;
            (prefix.eq_ignore_ascii_case(ENV_PREFIX) && !name.is_empty()).then(|| RawValue {
                key: name.to_string(),
                value: v.clone(),
                source: Source::Env { var: k.clone() },
            })
        })
        .collect()
}

/// Parses INI text, flattening `[global]` and every other section into one list in file order
/// (a later line overrides an earlier one). Values follow go-ini, which Felix uses: a value
/// in `"…"` or `` `…` `` is taken verbatim; otherwise `#` or `;` starts a comment. Backslashes
/// are kept (regexes need them).
pub fn parse_ini(path: &Path, text: &str) -> Result<Vec<RawValue>, ini::ParseError> {
    let opt = ParseOption {
        enabled_quote: false,
        enabled_escape: false,
        ..ParseOption::default()
    };
    let ini = Ini::load_from_str_opt(text, opt)?;
    let mut out = Vec::new();
    for (section, props) in ini.iter() {
        for (k, v) in props.iter() {
            out.push(RawValue {
                key: k.trim().to_string(),
                value: ini_value(v),
                source: Source::File {
                    path: path.to_path_buf(),
                    section: section.unwrap_or("").to_string(),
                },
            });
        }
    }
    Ok(out)
}

/// go-ini's value rules: quoted = verbatim between the quotes; unquoted = up to the first
/// `#` or `;`, trimmed.
fn ini_value(raw: &str) -> String {
    let v = raw.trim();
    for q in ['"', '`'] {
        if let Some(inner) = v.strip_prefix(q) {
            if let Some(end) = inner.find(q) {
                return inner[..end].to_string();
            }
        }
    }
    let end = v.find(['#', ';']).unwrap_or(v.len());
    v[..end].trim().to_string()
}

/// Keys given more than once in the file (case-insensitively), which go-ini resolves by
/// "last wins" and Felix warns about.
pub fn duplicate_file_keys(raw: &[RawValue]) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for r in raw
        .iter()
        .filter(|r| matches!(r.source, Source::File { .. }))
    {
        *seen.entry(r.key.to_ascii_lowercase()).or_default() += 1;
    }
    raw.iter()
        .filter(|r| matches!(r.source, Source::File { .. }))
        .filter(|r| {
            seen.remove(&r.key.to_ascii_lowercase())
                .is_some_and(|n| n > 1)
        })
        .map(|r| r.key.clone())
        .collect()
}

/// Reads and parses the config file. `Ok(None)` when it does not exist (that is fine, §3.1).
pub fn read_file(path: &Path) -> Result<Option<Vec<RawValue>>, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ConfigError::ReadFile {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    parse_ini(path, &text)
        .map(Some)
        .map_err(|source| ConfigError::ParseFile {
            path: path.to_path_buf(),
            source,
        })
}

/// The `config` map of a `ConfigUpdate` as raw values.
pub fn update_values(update: &BTreeMap<String, String>) -> Vec<RawValue> {
    update
        .iter()
        .map(|(k, v)| RawValue {
            key: k.clone(),
            value: v.clone(),
            source: Source::ConfigUpdate,
        })
        .collect()
}
