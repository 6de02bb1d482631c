//! Felix's configuration (§3): the parameter table, its sources (defaults < config file
//! < environment < ConfigUpdate) and Felix's parsing rules. Never touches the kernel.
//!
//! - [`params`]: the one table of parameters and the typed [`Config`] generated from it.
//! - [`parse`]: Felix's value syntax, kind by kind.
//! - [`sources`]: reading the INI file, the `FELIX_*` environment and `ConfigUpdate` into raw
//!   values that remember their [`Source`].
//! - [`show`]: `felix-nft config show|schema`.
//!
//! Resolution (this file) picks, for every parameter, the highest-precedence non-empty raw value,
//! parses it, and collects **every** bad value before deciding: any die-on-fail parameter with a
//! bad value fails the load with one error listing all of them; other bad values fall back to the
//! default and are returned as warnings. Unknown keys are kept and warned about.
//!
//! Felix restarts the driver whenever a resolved value changes (§1.4), so the agent
//! may treat the [`Config`] it started with as fixed; [`Resolved::with_update`] exists to apply
//! a `ConfigUpdate` and [`Resolved::changed`] to tell whether it changes anything.

pub mod params;
pub mod parse;
pub mod show;
pub mod sources;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use params::{
    find, AllowAction, ChainInsertMode, Config, DenyAction, EnabledDisabled, EndpointToHostAction,
    FlowTableOffload, IptablesBackend, LogLevel, NatOutgoingExclusions, NftablesMode, ParamSpec,
    ProgramClusterRoutes, RouteSource, ServiceLoopPrevention, WorkloadSourceSpoofing,
    FELIX_PARAMS_NOT_USED, PARAMS,
};
pub use parse::{
    FailsafePort, IfaceMatch, KeyDuration, Kind, Pattern, PortProtocol, PortRange, RateLimit,
    RatePer, RouteTableRange, Rule, Value,
};
pub use sources::{RawValue, Source};

/// Exit code of the binary when the configuration has a bad die-on-fail value.
pub const EXIT_BAD_CONFIG: u8 = 2;

/// Mark bits the nftables renderer allocates from `NftablesMarkMask` (§4): accept,
/// pass, drop, scratch0, scratch1.
pub const MARK_BITS_NEEDED: u32 = 5;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file exists but could not be read.
    #[error("reading config file {}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid INI.
    #[error("parsing config file {} as INI", path.display())]
    ParseFile {
        path: PathBuf,
        #[source]
        source: ini::ParseError,
    },
    /// At least one die-on-fail parameter has a bad value. Lists every bad value of the load,
    /// fatal or not.
    #[error("{}", BadValueList(bad))]
    Invalid { bad: Vec<BadValue> },
}

struct BadValueList<'a>(&'a [BadValue]);

impl fmt::Display for BadValueList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fatal = self.0.iter().filter(|b| b.fatal).count();
        write!(
            f,
            "invalid configuration: {} bad value(s), {fatal} of them fatal",
            self.0.len()
        )?;
        for b in self.0 {
            write!(f, "\n  - {b}")?;
        }
        Ok(())
    }
}

/// A raw value that broke its parameter's rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadValue {
    /// Canonical parameter name.
    pub name: &'static str,
    /// The raw value as given.
    pub value: String,
    pub source: Source,
    /// What the value should have been.
    pub rule: String,
    /// Whether this stops the load: a die-on-fail parameter, or `none` on a non-zero one
    /// (Felix refuses that whatever the flags). Otherwise the default is used.
    pub fatal: bool,
    /// A higher source set this parameter too, so this value would not have been used anyway.
    /// Felix still parses it, and a fatal one still stops the load.
    pub shadowed: bool,
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {:?} (from {}): {}; {}",
            self.name,
            self.value,
            self.source,
            self.rule,
            match (self.fatal, self.shadowed) {
                (true, false) => "fatal",
                (true, true) => "fatal, even though a higher source overrides it",
                (false, false) => "using the default",
                (false, true) => "ignored, a higher source overrides it",
            }
        )
    }
}

/// A key that names no parameter in the table. Kept, so `config show` can list it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnknownKey {
    pub key: String,
    pub value: String,
    pub source: Source,
    /// A Felix parameter felix-nft does not use ([`FELIX_PARAMS_NOT_USED`]): not warned about.
    pub felix_param: bool,
}

/// One parameter's effective value and where it came from.
#[derive(Debug, Clone)]
pub struct Entry {
    pub spec: &'static ParamSpec,
    pub value: Value,
    pub source: Source,
    /// The value this one replaced because it was bad (non-fatal parameters only).
    pub rejected: Option<BadValue>,
}

/// The result of a successful load: the typed config plus, per parameter, its source.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub config: Config,
    /// One per [`PARAMS`] row, same order.
    pub entries: Vec<Entry>,
    /// Unknown keys, one per key (case-insensitively), highest source first wins.
    pub unknown: Vec<UnknownKey>,
    /// Non-fatal bad values: the effective value fell back to the default, or (`shadowed`) a
    /// higher source overrode the bad value anyway.
    pub bad_values: Vec<BadValue>,
    /// The config file consulted (set by [`load`]).
    pub file: Option<ConfigFileInfo>,
    /// Every raw input, so a `ConfigUpdate` can be layered on top.
    raw: Vec<RawValue>,
}

/// The config file [`load`] consulted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigFileInfo {
    pub path: PathBuf,
    /// Whether it existed (an absent file is fine, §3.1).
    pub present: bool,
    /// Named by `--config` (so its absence is worth a warning).
    pub explicit: bool,
}

/// What [`load`] reads: the explicit `--config` path and the environment, passed in.
#[derive(Debug, Clone, Default)]
pub struct LoadInputs {
    /// `--config FILE`, if given.
    pub config_file: Option<PathBuf>,
    /// The environment as (name, value) pairs, in order.
    pub env: Vec<(String, String)>,
}

impl LoadInputs {
    /// Inputs from this process's environment (the only place the process env is read).
    pub fn from_process(config_file: Option<PathBuf>) -> Self {
        let env = std::env::vars_os()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect();
        LoadInputs { config_file, env }
    }
}

/// Loads defaults < config file < environment. An absent config file is fine.
pub fn load(inputs: &LoadInputs) -> Result<Resolved, ConfigError> {
    let path = sources::config_file_path(inputs.config_file.as_deref(), &inputs.env);
    let file_values = sources::read_file(&path)?;
    let present = file_values.is_some();
    let mut raw = file_values.unwrap_or_default();
    raw.extend(sources::env_values(&inputs.env));
    if let Some(explicit) = &inputs.config_file {
        raw.push(RawValue {
            key: "ConfigFile".into(),
            value: explicit.display().to_string(),
            source: Source::CommandLine {
                flag: "--config".into(),
            },
        });
    }
    let mut resolved = resolve(raw)?;
    resolved.file = Some(ConfigFileInfo {
        path,
        present,
        explicit: inputs.config_file.is_some(),
    });
    Ok(resolved)
}

/// Resolves raw values from any sources (the hermetic core of [`load`]).
pub fn resolve(raw: Vec<RawValue>) -> Result<Resolved, ConfigError> {
    let mut bad = Vec::new();
    let mut entries = Vec::with_capacity(PARAMS.len());
    for spec in PARAMS {
        entries.push(resolve_one(spec, &raw, &mut bad));
    }
    check_mark_mask(&mut entries, &mut bad);

    if bad.iter().any(|b| b.fatal) {
        return Err(ConfigError::Invalid { bad });
    }
    let values = entries.iter().map(|e| e.value.clone()).collect();
    let config = Config::from_values(values).map_err(|name| ConfigError::Invalid {
        bad: vec![BadValue {
            name,
            value: String::new(),
            source: Source::Default,
            rule: "internal error: the parameter table pairs this kind with a field type that cannot hold it".into(),
            fatal: true,
            shadowed: false,
        }],
    })?;
    Ok(Resolved {
        config,
        entries,
        unknown: unknown_keys(&raw),
        bad_values: bad,
        file: None,
        raw,
    })
}

/// The raw values given for `spec`, lowest precedence first (within one source, file/env
/// order). Empty values are ignored (§3.1: "use `none` to force the zero value").
fn candidates<'a>(spec: &ParamSpec, raw: &'a [RawValue]) -> Vec<&'a RawValue> {
    let mut c: Vec<&RawValue> = raw
        .iter()
        .filter(|r| r.key.eq_ignore_ascii_case(spec.name) && !r.value.trim().is_empty())
        .collect();
    // Stable: equal ranks keep their order, so the last is the later line of the top source.
    c.sort_by_key(|r| r.source.rank());
    c
}

/// Parses one raw value for `spec`, applying `none` and the non-zero rule.
pub fn parse_for(spec: &ParamSpec, raw: &str) -> Result<Value, Rule> {
    let t = raw.trim();
    let value = if t.eq_ignore_ascii_case("none") {
        parse::zero_value(spec.kind).ok_or_else(|| {
            Rule("`none` forces the zero value, and this parameter has no zero value".into())
        })?
    } else {
        parse::parse(spec.kind, t)?
    };
    if spec.non_zero() && value.is_zero() {
        return Err(Rule(format!(
            "{} must not be zero or empty (`none` is not allowed)",
            spec.name
        )));
    }
    Ok(value)
}

/// The parsed built-in default of `spec`. The table's defaults are tested to parse.
fn default_value(spec: &ParamSpec) -> Value {
    if spec.default.is_empty() {
        parse::zero_value(spec.kind).unwrap_or(Value::Unset)
    } else {
        parse::parse(spec.kind, spec.default).unwrap_or(Value::Unset)
    }
}

/// Every given value of `spec` is parsed, as Felix does, so a bad value is reported even when
/// a higher source overrides it; the highest-precedence value wins if it parses, otherwise the
/// default stands.
fn resolve_one(spec: &'static ParamSpec, raw: &[RawValue], bad: &mut Vec<BadValue>) -> Entry {
    let candidates = candidates(spec, raw);
    let mut entry = Entry {
        spec,
        value: default_value(spec),
        source: Source::Default,
        rejected: None,
    };
    for (i, r) in candidates.iter().enumerate() {
        let winner = i + 1 == candidates.len();
        match parse_for(spec, &r.value) {
            Ok(value) if winner => {
                entry.value = value;
                entry.source = r.source.clone();
            }
            Ok(_) => {}
            Err(rule) => {
                let b = BadValue {
                    name: spec.name,
                    value: r.value.clone(),
                    source: r.source.clone(),
                    rule: rule.0,
                    fatal: spec.die_on_fail() || is_none_on_non_zero(spec, &r.value),
                    shadowed: !winner,
                };
                if winner {
                    entry.rejected = Some(b.clone());
                }
                bad.push(b);
            }
        }
    }
    entry
}

/// Felix refuses `none` on a non-zero parameter outright, die-on-fail or not.
fn is_none_on_non_zero(spec: &ParamSpec, raw: &str) -> bool {
    spec.non_zero() && raw.trim().eq_ignore_ascii_case("none")
}

/// Reference §4: the renderer allocates accept, pass, drop, scratch0, scratch1 (and a
/// wireguard bit when Wireguard is on) from `NftablesMarkMask`. Felix only demands 2 bits at
/// parse time; a mask that cannot hold ours is a die-on-fail error here rather than a failure
/// at the first apply.
fn check_mark_mask(entries: &mut [Entry], bad: &mut Vec<BadValue>) {
    let is_true = |entries: &[Entry], name: &str| {
        entries
            .iter()
            .any(|e| e.spec.name == name && e.value == Value::Bool(true))
    };
    let wireguard = is_true(entries, "WireguardEnabled") || is_true(entries, "WireguardEnabledV6");
    let needed = MARK_BITS_NEEDED + u32::from(wireguard);
    let Some(entry) = entries
        .iter_mut()
        .find(|e| e.spec.name == "NftablesMarkMask")
    else {
        return;
    };
    let Value::Mask(mask) = entry.value else {
        return;
    };
    if mask.count_ones() < needed {
        bad.push(BadValue {
            name: entry.spec.name,
            value: entry.value.to_string(),
            source: entry.source.clone(),
            rule: format!(
                "mark mask {mask:#x} has {} bit(s); felix-nft needs {needed} (accept, pass, drop, scratch0, scratch1{})",
                mask.count_ones(),
                if wireguard { ", wireguard" } else { "" }
            ),
            fatal: true,
            shadowed: false,
        });
    }
}

fn unknown_keys(raw: &[RawValue]) -> Vec<UnknownKey> {
    let mut by_key: BTreeMap<String, &RawValue> = BTreeMap::new();
    for r in raw.iter().filter(|r| find(&r.key).is_none()) {
        let lower = r.key.to_ascii_lowercase();
        match by_key.get(&lower) {
            Some(prev) if prev.source.rank() > r.source.rank() => {}
            _ => {
                by_key.insert(lower, r);
            }
        }
    }
    by_key
        .into_values()
        .map(|r| UnknownKey {
            key: r.key.clone(),
            value: r.value.clone(),
            source: r.source.clone(),
            felix_param: FELIX_PARAMS_NOT_USED
                .iter()
                .any(|n| n.eq_ignore_ascii_case(&r.key)),
        })
        .collect()
}

impl Resolved {
    /// Layers a `ConfigUpdate`'s `config` map (Felix's resolved raw values, §2.3) on
    /// top of the file and environment, replacing any earlier update: each `ConfigUpdate`
    /// carries Felix's complete resolved config. `source_to_raw_config` is not needed: `config`
    /// already holds the winning value of every source Felix has.
    pub fn with_update(&self, update: &BTreeMap<String, String>) -> Result<Resolved, ConfigError> {
        let mut raw: Vec<RawValue> = self
            .raw
            .iter()
            .filter(|r| r.source != Source::ConfigUpdate)
            .cloned()
            .collect();
        raw.extend(sources::update_values(update));
        let mut resolved = resolve(raw)?;
        resolved.file.clone_from(&self.file);
        Ok(resolved)
    }

    /// The entry of a parameter, by name (any case).
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.spec.name.eq_ignore_ascii_case(name))
    }

    /// Names of the parameters whose effective value differs between `self` and `other`.
    pub fn changed(&self, other: &Resolved) -> Vec<&'static str> {
        self.entries
            .iter()
            .zip(&other.entries)
            .filter(|(a, b)| a.value != b.value)
            .map(|(a, _)| a.spec.name)
            .collect()
    }

    /// Human-readable warnings: bad values that fell back, unknown keys, a missing `--config`.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        if let Some(f) = self.file.as_ref().filter(|f| f.explicit && !f.present) {
            out.push(format!(
                "config file {} (from --config) does not exist; using defaults and environment",
                f.path.display()
            ));
        }
        out.extend(self.bad_values.iter().map(|b| b.to_string()));
        for key in sources::duplicate_file_keys(&self.raw) {
            out.push(format!(
                "{key} is set more than once in the config file; the last line wins"
            ));
        }
        // Values of unknown keys are not repeated here: they may be credentials (Felix does
        // not log environment values either); `config show` lists them on request.
        for u in self.unknown.iter().filter(|u| !u.felix_param) {
            out.push(format!(
                "unknown parameter {} (from {}): kept but not used",
                u.key, u.source
            ));
        }
        out
    }

    /// Emits [`Resolved::warnings`] through `tracing`.
    pub fn log_warnings(&self) {
        for b in &self.bad_values {
            tracing::warn!(param = b.name, value = %b.value, source = %b.source, rule = %b.rule,
                shadowed = b.shadowed, "invalid config value, using the default");
        }
        for u in &self.unknown {
            if u.felix_param {
                tracing::debug!(param = %u.key, source = %u.source, "Felix parameter not used by felix-nft");
            } else {
                tracing::warn!(param = %u.key, source = %u.source,
                    "unknown config parameter, ignored");
            }
        }
    }
}

impl Config {
    /// Whether `ifname` is a workload interface: it starts with one of `InterfacePrefix`.
    pub fn is_workload_iface(&self, ifname: &str) -> bool {
        self.interface_prefix.iter().any(|p| ifname.starts_with(p))
    }

    /// Whether `ifname` is ignored by the agent (`InterfaceExclude`).
    pub fn is_excluded_iface(&self, ifname: &str) -> bool {
        self.interface_exclude.iter().any(|m| m.matches(ifname))
    }

    /// The routing tables the agent may use, as Felix's `RouteTableIndices`: `RouteTableRanges`
    /// if set, else the deprecated `RouteTableRange`, else 1–250. Callers skip the kernel's
    /// reserved tables 253–255 inside a range.
    pub fn route_table_indices(&self) -> Vec<RouteTableRange> {
        if !self.route_table_ranges.is_empty() {
            return self.route_table_ranges.clone();
        }
        vec![self
            .route_table_range
            .unwrap_or(RouteTableRange { min: 1, max: 250 })]
    }
}

impl Default for Config {
    /// Every parameter at its built-in default.
    fn default() -> Self {
        // The table's defaults all parse (tested by `every_default_parses`); failing here is a
        // bug in the table, not bad input.
        resolve(Vec::new())
            .map(|r| r.config)
            .expect("built-in defaults are valid")
    }
}

/// Loads for the CLI: `--config` (or `FELIX_CONFIGFILE`, or the default path) plus this
/// process's environment.
pub fn load_for_cli(config_file: Option<&Path>) -> Result<Resolved, ConfigError> {
    load(&LoadInputs::from_process(
        config_file.map(Path::to_path_buf),
    ))
}
