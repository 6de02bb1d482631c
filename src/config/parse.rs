//! Felix's value syntax (reference §3.1): one parse function per parameter kind, turning a raw
//! string from any source into a typed [`Value`], or into the [`Rule`] it broke.
//!
//! Pure functions, no I/O. Every value type here renders back to the syntax it was parsed from
//! (`Display`), so `config show` prints values an operator can paste into `felix.cfg`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::IpNet;
use regex::Regex;
use schemars::JsonSchema;
use serde::{Serialize, Serializer};

/// How a parameter's raw string is read. Each kind is one of Felix's `config:"…"` types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `true/1/yes/y/t`, `false/0/no/n/f`, any case.
    Bool,
    /// A bool that may be left unset (Felix's `*bool`: "derive it from something else").
    OptionalBool,
    /// Float seconds (`1.5`).
    Seconds,
    /// Float milliseconds.
    Millis,
    /// A decimal integer in `min..=max`.
    Int { min: u64, max: u64 },
    /// A 32-bit mark mask, hex (`0xffff0000`) or decimal, with at least 2 bits set.
    MarkMask,
    /// Free text.
    Text,
    /// A filesystem path.
    Path,
    /// A regular expression (Go RE2 syntax; the `regex` crate is RE2-compatible).
    Regex,
    /// Comma-separated interface names or prefixes, each `[a-zA-Z0-9_-]{1,15}`.
    IfaceList,
    /// One interface name, `[a-zA-Z0-9_.-]{1,15}` (Felix's `iface-param`).
    Iface,
    /// Comma-separated interface names or `/regex/` entries.
    IfaceExcludeList,
    /// Comma-separated `proto:port`, `proto:cidr:port` or bare `port` entries.
    PortList,
    /// `lo:hi` (or a single port).
    PortRange,
    /// Comma-separated `lo:hi` ranges.
    PortRangeList,
    /// An IPv4 address.
    Ipv4,
    /// An IPv6 address.
    Ipv6,
    /// A host name or IP address.
    Host,
    /// Comma-separated CIDRs (IPv4 or IPv6).
    CidrList,
    /// One of a fixed set of words, matched case-insensitively and canonicalised.
    OneOf(&'static [&'static str]),
    /// `N/second|minute|hour|day`.
    RateLimit,
    /// One `lo-hi` routing-table range.
    RouteTableRange,
    /// Comma-separated `lo-hi` routing-table ranges.
    RouteTableRanges,
    /// Comma-separated `name=duration` pairs (Go duration syntax: `30s`, `1m30s`).
    KeyDurationList,
}

/// A parsed parameter value. The variant is fixed by the parameter's [`Kind`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Left unset (an optional parameter with no value).
    Unset,
    Bool(bool),
    Duration(Duration),
    UInt(u64),
    /// A mark mask (shown in hex).
    Mask(u32),
    Text(String),
    Strings(Vec<String>),
    Excludes(Vec<IfaceMatch>),
    Ports(Vec<FailsafePort>),
    PortRange(PortRange),
    PortRanges(Vec<PortRange>),
    Ip(IpAddr),
    Nets(Vec<IpNet>),
    /// The canonical spelling of a `oneof` word.
    Word(&'static str),
    RateLimit(RateLimit),
    TableRanges(Vec<RouteTableRange>),
    KeyDurations(Vec<KeyDuration>),
    Pattern(Pattern),
}

impl Value {
    /// Whether this is the kind's zero value (what `none` forces); `non-zero` params refuse it.
    pub fn is_zero(&self) -> bool {
        match self {
            Value::Unset => true,
            Value::Bool(b) => !b,
            Value::Duration(d) => d.is_zero(),
            Value::UInt(n) => *n == 0,
            Value::Mask(m) => *m == 0,
            Value::Text(s) => s.is_empty(),
            Value::Strings(v) => v.is_empty(),
            Value::Excludes(v) => v.is_empty(),
            Value::Ports(v) => v.is_empty(),
            Value::PortRanges(v) => v.is_empty(),
            Value::Nets(v) => v.is_empty(),
            Value::TableRanges(v) => v.is_empty(),
            Value::KeyDurations(v) => v.is_empty(),
            Value::PortRange(_)
            | Value::Ip(_)
            | Value::Word(_)
            | Value::RateLimit(_)
            | Value::Pattern(_) => false,
        }
    }
}

/// Renders a value back in Felix's syntax (what an operator would write in `felix.cfg`).
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn join<T: fmt::Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{item}")?;
            }
            Ok(())
        }
        match self {
            Value::Unset => Ok(()),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Duration(d) => write!(f, "{}", d.as_secs_f64()),
            Value::UInt(n) => write!(f, "{n}"),
            Value::Mask(m) => write!(f, "{m:#x}"),
            Value::Text(s) => f.write_str(s),
            Value::Strings(v) => join(f, v),
            Value::Excludes(v) => join(f, v),
            Value::Ports(v) => join(f, v),
            Value::PortRange(r) => write!(f, "{r}"),
            Value::PortRanges(v) => join(f, v),
            Value::Ip(ip) => write!(f, "{ip}"),
            Value::Nets(v) => join(f, v),
            Value::Word(w) => f.write_str(w),
            Value::RateLimit(r) => write!(f, "{r}"),
            Value::TableRanges(v) => join(f, v),
            Value::KeyDurations(v) => join(f, v),
            Value::Pattern(p) => f.write_str(p.as_str()),
        }
    }
}

/// The rule a raw value broke: the text says what was expected, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule(pub String);

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn rule(msg: impl Into<String>) -> Rule {
    Rule(msg.into())
}

/// Parses `raw` (already known to be non-empty and not `none`) as `kind`.
pub fn parse(kind: Kind, raw: &str) -> Result<Value, Rule> {
    let raw = raw.trim();
    match kind {
        Kind::Bool | Kind::OptionalBool => parse_bool(raw).map(Value::Bool),
        Kind::Seconds => parse_float_duration(raw, 1.0).map(Value::Duration),
        Kind::Millis => parse_float_duration(raw, 1e-3).map(Value::Duration),
        Kind::Int { min, max } => parse_int(raw, min, max).map(Value::UInt),
        Kind::MarkMask => parse_mark_mask(raw).map(Value::Mask),
        Kind::Text | Kind::Path => Ok(Value::Text(raw.to_string())),
        Kind::Regex => Pattern::new(raw).map(Value::Pattern),
        Kind::IfaceList => parse_iface_list(raw).map(Value::Strings),
        Kind::Iface => parse_iface(raw).map(Value::Text),
        Kind::IfaceExcludeList => parse_iface_excludes(raw).map(Value::Excludes),
        Kind::PortList => parse_port_list(raw).map(Value::Ports),
        Kind::PortRange => parse_port_range(raw).map(Value::PortRange),
        Kind::PortRangeList => split_list(raw)
            .map(parse_port_range)
            .collect::<Result<_, _>>()
            .map(Value::PortRanges),
        Kind::Ipv4 => raw
            .parse::<Ipv4Addr>()
            .map(|ip| Value::Ip(ip.into()))
            .map_err(|_| rule("expected an IPv4 address, e.g. 10.0.0.1")),
        Kind::Ipv6 => raw
            .parse::<Ipv6Addr>()
            .map(|ip| Value::Ip(ip.into()))
            .map_err(|_| rule("expected an IPv6 address, e.g. fd00::1")),
        Kind::Host => parse_host(raw).map(Value::Text),
        Kind::CidrList => split_list(raw)
            .map(parse_cidr)
            .collect::<Result<_, _>>()
            .map(Value::Nets),
        Kind::OneOf(words) => parse_one_of(raw, words).map(Value::Word),
        Kind::RateLimit => parse_rate_limit(raw).map(Value::RateLimit),
        Kind::RouteTableRange => parse_table_range(raw).map(|r| Value::TableRanges(vec![r])),
        Kind::RouteTableRanges => split_list(raw)
            .map(parse_table_range)
            .collect::<Result<_, _>>()
            .map(Value::TableRanges),
        Kind::KeyDurationList => split_list(raw)
            .map(parse_key_duration)
            .collect::<Result<_, _>>()
            .map(Value::KeyDurations),
    }
}

/// The value `none` forces, or `None` if the kind has no zero value (a `oneof`, a range, an
/// address-that-must-be-set): `none` is then an error.
pub fn zero_value(kind: Kind) -> Option<Value> {
    Some(match kind {
        Kind::Bool => Value::Bool(false),
        Kind::OptionalBool
        | Kind::PortRange
        | Kind::Ipv4
        | Kind::Ipv6
        | Kind::RateLimit
        | Kind::Regex
        | Kind::RouteTableRange => Value::Unset,
        Kind::Seconds | Kind::Millis => Value::Duration(Duration::ZERO),
        Kind::Int { min: 0, .. } => Value::UInt(0),
        Kind::MarkMask => Value::Mask(0),
        Kind::Text | Kind::Path | Kind::Host | Kind::Iface => Value::Text(String::new()),
        Kind::IfaceList => Value::Strings(Vec::new()),
        Kind::IfaceExcludeList => Value::Excludes(Vec::new()),
        Kind::PortList => Value::Ports(Vec::new()),
        Kind::PortRangeList => Value::PortRanges(Vec::new()),
        Kind::CidrList => Value::Nets(Vec::new()),
        Kind::RouteTableRanges => Value::TableRanges(Vec::new()),
        Kind::KeyDurationList => Value::KeyDurations(Vec::new()),
        Kind::Int { .. } | Kind::OneOf(_) => return None,
    })
}

/// Splits a comma-separated list, trimming entries; an empty list is allowed.
fn split_list(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Felix's bool spellings (`strconv`-like, plus yes/no/y/n), any case.
pub fn parse_bool(raw: &str) -> Result<bool, Rule> {
    match raw.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "t" => Ok(true),
        "false" | "0" | "no" | "n" | "f" => Ok(false),
        _ => Err(rule(
            "expected a bool: true/1/yes/y/t or false/0/no/n/f (any case)",
        )),
    }
}

fn parse_float_duration(raw: &str, unit_secs: f64) -> Result<Duration, Rule> {
    let n: f64 = raw
        .parse()
        .map_err(|_| rule("expected a number (float allowed), e.g. 1.5"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(rule("expected a finite, non-negative number"));
    }
    Duration::try_from_secs_f64(n * unit_secs).map_err(|_| rule("duration out of range"))
}

fn parse_int(raw: &str, min: u64, max: u64) -> Result<u64, Rule> {
    let n: u64 = raw
        .parse()
        .map_err(|_| rule(format!("expected an integer in {min}..={max}")))?;
    if n < min || n > max {
        return Err(rule(format!("{n} is outside {min}..={max}")));
    }
    Ok(n)
}

/// A mark mask: `0x`-prefixed hex or decimal, 32 bits, at least 2 bits set (reference §3.1; the
/// stricter "room for the renderer's bits" check is in `super::validate`, reference §4).
pub fn parse_mark_mask(raw: &str) -> Result<u32, Rule> {
    let parsed = match raw.strip_prefix("0x").or_else(|| raw.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => raw.parse::<u32>(),
    };
    let mask = parsed.map_err(|_| rule("expected a 32-bit mask, hex (0xffff0000) or decimal"))?;
    if mask.count_ones() < 2 {
        return Err(rule(format!(
            "mark mask {mask:#x} has {} bit(s) set; at least 2 are needed",
            mask.count_ones()
        )));
    }
    Ok(mask)
}

fn is_iface_name(s: &str, extra: &[char]) -> bool {
    (1..=15).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || extra.contains(&c))
}

/// `^[a-zA-Z0-9_-]{1,15}(,[a-zA-Z0-9_-]{1,15})*$` (reference §3.1).
pub fn parse_iface_list(raw: &str) -> Result<Vec<String>, Rule> {
    let items: Vec<&str> = raw.split(',').collect();
    if items.iter().all(|s| is_iface_name(s, &[])) {
        Ok(items.into_iter().map(str::to_string).collect())
    } else {
        Err(rule(
            "expected comma-separated interface names/prefixes matching [a-zA-Z0-9_-]{1,15}, no spaces",
        ))
    }
}

fn parse_iface(raw: &str) -> Result<String, Rule> {
    if is_iface_name(raw, &['.']) {
        Ok(raw.to_string())
    } else {
        Err(rule(
            "expected one interface name matching [a-zA-Z0-9_.-]{1,15}",
        ))
    }
}

/// One `InterfaceExclude` entry: an exact interface name or a `/regex/`.
#[derive(Debug, Clone)]
pub enum IfaceMatch {
    Name(String),
    Regex(Pattern),
}

impl IfaceMatch {
    /// Whether `ifname` is excluded by this entry.
    pub fn matches(&self, ifname: &str) -> bool {
        match self {
            IfaceMatch::Name(n) => n == ifname,
            IfaceMatch::Regex(p) => p.regex().is_match(ifname),
        }
    }
}

impl PartialEq for IfaceMatch {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl fmt::Display for IfaceMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IfaceMatch::Name(n) => f.write_str(n),
            IfaceMatch::Regex(p) => write!(f, "/{}/", p.as_str()),
        }
    }
}

fn parse_iface_excludes(raw: &str) -> Result<Vec<IfaceMatch>, Rule> {
    split_list(raw)
        .map(|item| {
            if let Some(inner) = item.strip_prefix('/').and_then(|s| s.strip_suffix('/')) {
                Pattern::new(inner).map(IfaceMatch::Regex)
            } else if is_iface_name(item, &['.']) {
                Ok(IfaceMatch::Name(item.to_string()))
            } else {
                Err(rule(format!(
                    "entry {item:?} is neither an interface name ([a-zA-Z0-9_.-]{{1,15}}) nor a /regex/"
                )))
            }
        })
        .collect()
}

/// A compiled regular expression that remembers its source text.
#[derive(Debug, Clone)]
pub struct Pattern {
    re: Regex,
}

impl Pattern {
    /// Compiles `src`.
    pub fn new(src: &str) -> Result<Self, Rule> {
        Regex::new(src)
            .map(|re| Pattern { re })
            .map_err(|e| rule(format!("invalid regular expression: {e}")))
    }
    /// The compiled expression.
    pub fn regex(&self) -> &Regex {
        &self.re
    }
    /// The source text.
    pub fn as_str(&self) -> &str {
        self.re.as_str()
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Serialize for Pattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl JsonSchema for Pattern {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Regex".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "regex" })
    }
}

impl Serialize for IfaceMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for IfaceMatch {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "InterfaceMatch".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "An interface name, or a regular expression between slashes (`/^veth/`)."
        })
    }
}

/// The transport protocol of a failsafe port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PortProtocol {
    Tcp,
    Udp,
}

impl fmt::Display for PortProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortProtocol::Tcp => "tcp",
            PortProtocol::Udp => "udp",
        })
    }
}

/// One failsafe port: traffic to/from `port` over `protocol` (optionally only for peers in
/// `net`) is always allowed, whatever the policy (reference §7.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct FailsafePort {
    pub protocol: PortProtocol,
    /// Restricts the failsafe to this peer network; `None` = any peer.
    #[schemars(with = "Option<String>")]
    pub net: Option<IpNet>,
    pub port: u16,
}

impl fmt::Display for FailsafePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.net {
            None => write!(f, "{}:{}", self.protocol, self.port),
            Some(IpNet::V4(n)) => write!(f, "{}:{}:{}", self.protocol, n, self.port),
            Some(IpNet::V6(n)) => write!(f, "{}:[{}]:{}", self.protocol, n, self.port),
        }
    }
}

fn parse_port(raw: &str) -> Result<u16, Rule> {
    raw.parse::<u16>()
        .map_err(|_| rule(format!("port {raw:?} is not an integer in 0..=65535")))
}

fn parse_cidr(raw: &str) -> Result<IpNet, Rule> {
    raw.parse::<IpNet>()
        .or_else(|_| raw.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| {
            rule(format!(
                "{raw:?} is not a CIDR (10.0.0.0/8, fd00::/64) or an address"
            ))
        })
}

/// One port-list entry: `port` (tcp), `proto:port`, `proto:cidr:port`, `proto:[v6cidr]:port`.
pub fn parse_failsafe_port(item: &str) -> Result<FailsafePort, Rule> {
    let bad = || {
        rule(format!(
            "entry {item:?}: expected port, proto:port, proto:cidr:port or proto:[ipv6-cidr]:port, proto tcp|udp"
        ))
    };
    let (proto, rest) = match item.split_once(':') {
        None => {
            return Ok(FailsafePort {
                protocol: PortProtocol::Tcp,
                net: None,
                port: parse_port(item)?,
            })
        }
        Some(pair) => pair,
    };
    let protocol = match proto.to_ascii_lowercase().as_str() {
        "tcp" => PortProtocol::Tcp,
        "udp" => PortProtocol::Udp,
        _ => return Err(bad()),
    };
    let (net, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (cidr, port) = v6.split_once("]:").ok_or_else(bad)?;
        let net = parse_cidr(cidr)?;
        if !matches!(net, IpNet::V6(_)) {
            return Err(rule(format!(
                "entry {item:?}: only IPv6 CIDRs go in brackets"
            )));
        }
        (Some(net), port)
    } else {
        match rest.rsplit_once(':') {
            Some((cidr, port)) => {
                let net = parse_cidr(cidr)?;
                if matches!(net, IpNet::V6(_)) {
                    return Err(rule(format!(
                        "entry {item:?}: an IPv6 CIDR must be in brackets, e.g. tcp:[fd00::/64]:80"
                    )));
                }
                (Some(net), port)
            }
            None => (None, rest),
        }
    };
    Ok(FailsafePort {
        protocol,
        net,
        port: parse_port(port)?,
    })
}

fn parse_port_list(raw: &str) -> Result<Vec<FailsafePort>, Rule> {
    split_list(raw).map(parse_failsafe_port).collect()
}

/// An inclusive port range, `first <= last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.first, self.last)
    }
}

/// `lo:hi` or a single port.
pub fn parse_port_range(raw: &str) -> Result<PortRange, Rule> {
    let (lo, hi) = raw.split_once(':').unwrap_or((raw, raw));
    let first = parse_port(lo.trim())?;
    let last = parse_port(hi.trim())?;
    if first > last {
        return Err(rule(format!(
            "port range {raw:?}: first port is above last"
        )));
    }
    Ok(PortRange { first, last })
}

fn parse_host(raw: &str) -> Result<String, Rule> {
    if raw.parse::<IpAddr>().is_ok() {
        return Ok(raw.to_string());
    }
    // RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens.
    let ok = raw.len() <= 253
        && raw.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if ok {
        Ok(raw.to_string())
    } else {
        Err(rule("expected a host name (RFC 1123) or an IP address"))
    }
}

fn parse_one_of(raw: &str, words: &'static [&'static str]) -> Result<&'static str, Rule> {
    words
        .iter()
        .copied()
        .find(|w| w.eq_ignore_ascii_case(raw))
        .ok_or_else(|| rule(format!("expected one of {} (any case)", words.join("|"))))
}

/// The time unit of a [`RateLimit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RatePer {
    Second,
    Minute,
    Hour,
    Day,
}

/// `LogActionRateLimit`: at most `count` log records per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RateLimit {
    pub count: u32,
    pub per: RatePer,
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = match self.per {
            RatePer::Second => "second",
            RatePer::Minute => "minute",
            RatePer::Hour => "hour",
            RatePer::Day => "day",
        };
        write!(f, "{}/{per}", self.count)
    }
}

fn parse_rate_limit(raw: &str) -> Result<RateLimit, Rule> {
    let bad = || rule("expected N/second, N/minute, N/hour or N/day with N a positive integer");
    let (n, per) = raw.split_once('/').ok_or_else(bad)?;
    let count: u32 = n.trim().parse().map_err(|_| bad())?;
    if count == 0 {
        return Err(bad());
    }
    let per = match per.trim().to_ascii_lowercase().as_str() {
        "second" | "s" => RatePer::Second,
        "minute" | "m" => RatePer::Minute,
        "hour" | "h" => RatePer::Hour,
        "day" | "d" => RatePer::Day,
        _ => return Err(bad()),
    };
    Ok(RateLimit { count, per })
}

/// An inclusive range of routing-table indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RouteTableRange {
    pub min: u32,
    pub max: u32,
}

impl fmt::Display for RouteTableRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

/// `min-max`, 1 ≤ min ≤ max; the kernel's reserved tables 253–255 (default, main, local) may not
/// fall inside.
fn parse_table_range(raw: &str) -> Result<RouteTableRange, Rule> {
    let bad = || {
        rule(format!(
            "routing-table range {raw:?}: expected min-max, 1 <= min <= max <= 4294967295"
        ))
    };
    let (lo, hi) = raw.split_once('-').ok_or_else(bad)?;
    let min: u32 = lo.trim().parse().map_err(|_| bad())?;
    let max: u32 = hi.trim().parse().map_err(|_| bad())?;
    if min == 0 || min > max {
        return Err(bad());
    }
    if min <= 255 && max >= 253 {
        return Err(rule(format!(
            "routing-table range {raw:?} includes the kernel's reserved tables 253-255"
        )));
    }
    Ok(RouteTableRange { min, max })
}

/// One `HealthTimeoutOverrides` entry: a health reporter's name and its timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct KeyDuration {
    pub name: String,
    #[serde(with = "secs_f64")]
    #[schemars(with = "f64")]
    pub timeout: Duration,
}

impl fmt::Display for KeyDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}s", self.name, self.timeout.as_secs_f64())
    }
}

fn parse_key_duration(raw: &str) -> Result<KeyDuration, Rule> {
    let (name, d) = raw.split_once('=').ok_or_else(|| {
        rule(format!(
            "entry {raw:?}: expected name=duration, e.g. InternalDataplaneMainLoop=30s"
        ))
    })?;
    Ok(KeyDuration {
        name: name.trim().to_string(),
        timeout: parse_go_duration(d.trim())?,
    })
}

/// Go's `time.ParseDuration` syntax: a sequence of decimal numbers with units
/// `ns|us|µs|ms|s|m|h` (`1h30m`, `1.5s`); a bare `0` is allowed.
pub fn parse_go_duration(raw: &str) -> Result<Duration, Rule> {
    let bad = || rule(format!("{raw:?} is not a duration like 30s, 1m30s, 250ms"));
    if raw == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = raw;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Serde helper: a `Duration` as float seconds, the unit Felix's own config uses.
pub mod secs_f64 {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "30", "s", "1x", "-1s", "1..5s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn display_round_trips() {
        for (kind, raw) in [
            (
                Kind::PortList,
                "tcp:22,udp:68,tcp:10.0.0.0/8:80,tcp:[fd00::/64]:80",
            ),
            (Kind::IfaceExcludeList, "kube-ipvs0,/^veth.*/"),
            (Kind::PortRangeList, "30000:32767,80:80"),
            (Kind::RateLimit, "10/minute"),
            (Kind::RouteTableRanges, "1-250,1000-2000"),
            (Kind::MarkMask, "0xffff0000"),
        ] {
            let v = parse(kind, raw).unwrap();
            assert_eq!(v.to_string(), raw);
            assert_eq!(parse(kind, &v.to_string()).unwrap(), v);
        }
    }
}
