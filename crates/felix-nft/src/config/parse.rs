//! Felix's value syntax (§3.1): one parse function per parameter kind, turning a raw
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
    /// An integer in `min..=max`, in Go's base-0 syntax (`42`, `0x2a`, `0o52`, `0b101010`,
    /// `052`), as Felix's `strconv.ParseInt(raw, 0, 64)` reads it.
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
    /// One interface name, `[a-zA-Z0-9:._+-]{1,15}` (Felix's `iface-param`).
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
    /// A listen address: host name or IP, `[a-zA-Z0-9:._+-]{1,64}` (Felix's `host-address`).
    Host,
    /// A host name, `[a-zA-Z0-9_.-]+` (Felix's `hostname`).
    Hostname,
    /// An OpenStack region: a DNS-1123 label of at most 46 characters (Felix's `region`).
    Region,
    /// Comma-separated IPv4 CIDRs or addresses (Felix's `cidr-list` is IPv4-only).
    CidrList,
    /// One of a fixed set of words, matched case-insensitively and canonicalised.
    OneOf(&'static [&'static str]),
    /// `N/second|minute|hour|day`.
    RateLimit,
    /// One `lo-hi` routing-table range within 1–250 (the deprecated `RouteTableRange`).
    RouteTableRange,
    /// Comma-separated `lo-hi` routing-table ranges, 1 ≤ lo ≤ hi ≤ 2³²−1, at most 65535
    /// tables in all; the kernel's reserved tables 253–255 may fall inside and are skipped by
    /// the route manager, as Felix does.
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
pub struct Rule(
    /// What was expected, in words.
    pub String,
);

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
        Kind::Host => matches_chars(
            raw,
            1,
            64,
            ":._+-",
            "a host address ([a-zA-Z0-9:._+-]{1,64})",
        ),
        Kind::Hostname => matches_chars(raw, 1, usize::MAX, "_.-", "a host name ([a-zA-Z0-9_.-]+)"),
        Kind::Region => parse_region(raw).map(Value::Text),
        Kind::CidrList => split_list(raw)
            .map(parse_v4_cidr)
            .collect::<Result<_, _>>()
            .map(Value::Nets),
        Kind::OneOf(words) => parse_one_of(raw, words).map(Value::Word),
        Kind::RateLimit => parse_rate_limit(raw).map(Value::RateLimit),
        Kind::RouteTableRange => match parse_table_range(raw) {
            Ok(r) if r.max <= 250 => Ok(Value::TableRanges(vec![r])),
            _ => Err(rule("must be a range of route table indices within 1-250")),
        },
        Kind::RouteTableRanges => parse_table_ranges(raw).map(Value::TableRanges),
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
        Kind::Text | Kind::Path | Kind::Host | Kind::Hostname | Kind::Region | Kind::Iface => {
            Value::Text(String::new())
        }
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

/// Go's `strconv.ParseUint(raw, 0, 64)`: `0x`/`0o`/`0b` prefixes, a leading `0` = octal.
fn parse_go_uint(raw: &str) -> Option<u64> {
    let lower = raw.to_ascii_lowercase();
    let (digits, radix) = if let Some(h) = lower.strip_prefix("0x") {
        (h, 16)
    } else if let Some(o) = lower.strip_prefix("0o") {
        (o, 8)
    } else if let Some(b) = lower.strip_prefix("0b") {
        (b, 2)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (&lower[1..], 8)
    } else {
        (lower.as_str(), 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fn parse_int(raw: &str, min: u64, max: u64) -> Result<u64, Rule> {
    let n =
        parse_go_uint(raw).ok_or_else(|| rule(format!("expected an integer in {min}..={max}")))?;
    if n < min || n > max {
        return Err(rule(format!("{n} is outside {min}..={max}")));
    }
    Ok(n)
}

/// A mark mask: `0x`-prefixed hex or decimal, 32 bits, at least 2 bits set (§3.1; the
/// stricter "room for the renderer's bits" check is in `super::validate`, §4).
pub fn parse_mark_mask(raw: &str) -> Result<u32, Rule> {
    let mask = parse_go_uint(raw)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| rule("expected a 32-bit mask, hex (0xffff0000) or decimal"))?;
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

/// `^[a-zA-Z0-9_-]{1,15}(,[a-zA-Z0-9_-]{1,15})*$` (§3.1).
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
    if is_iface_name(raw, &[':', '.', '+']) {
        Ok(raw.to_string())
    } else {
        Err(rule(
            "expected one interface name matching [a-zA-Z0-9:._+-]{1,15}",
        ))
    }
}

/// `raw` is `min..=max` characters from `[a-zA-Z0-9]` plus `extra`.
fn matches_chars(
    raw: &str,
    min: usize,
    max: usize,
    extra: &str,
    what: &str,
) -> Result<Value, Rule> {
    let ok = (min..=max).contains(&raw.len())
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(c));
    if ok {
        Ok(Value::Text(raw.to_string()))
    } else {
        Err(rule(format!("expected {what}")))
    }
}

/// A DNS-1123 label short enough to follow `openstack-region-` in a namespace name.
fn parse_region(raw: &str) -> Result<String, Rule> {
    const MAX: usize = 63 - "openstack-region-".len();
    let ok = raw.len() <= MAX
        && raw
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !raw.starts_with('-')
        && !raw.ends_with('-');
    if ok {
        Ok(raw.to_string())
    } else {
        Err(rule(format!(
            "expected a DNS label (lower-case letters, digits, inner '-') of at most {MAX} characters"
        )))
    }
}

/// One `InterfaceExclude` entry: an exact interface name or a `/regex/`.
#[derive(Debug, Clone)]
pub enum IfaceMatch {
    /// Exactly this interface.
    Name(String),
    /// Interfaces whose name matches.
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

/// Felix's `iface-list-regexp`: comma-separated (no spaces) entries, each `/regex/` (no
/// whitespace inside) or an interface name `[a-zA-Z0-9_-]{1,15}`.
fn parse_iface_excludes(raw: &str) -> Result<Vec<IfaceMatch>, Rule> {
    raw.split(',')
        .map(|item| {
            let regex = item
                .strip_prefix('/')
                .and_then(|s| s.strip_suffix('/'))
                .filter(|s| !s.is_empty() && !s.chars().any(char::is_whitespace));
            if let Some(inner) = regex {
                Pattern::new(inner).map(IfaceMatch::Regex)
            } else if is_iface_name(item, &[]) {
                Ok(IfaceMatch::Name(item.to_string()))
            } else {
                Err(rule(format!(
                    "entry {item:?} is neither an interface name ([a-zA-Z0-9_-]{{1,15}}) nor a /regex/"
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
/// `net`) is always allowed, whatever the policy (§7.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct FailsafePort {
    /// tcp or udp.
    pub protocol: PortProtocol,
    /// Restricts the failsafe to this peer network; `None` = any peer.
    #[schemars(with = "Option<String>")]
    pub net: Option<IpNet>,
    /// The host-side port.
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

/// An IPv4 CIDR or address (a /32), normalised to its network as Felix's `net.String()` is.
fn parse_v4_cidr(raw: &str) -> Result<IpNet, Rule> {
    match parse_cidr(raw)? {
        n @ IpNet::V4(_) => Ok(n.trunc()),
        IpNet::V6(_) => Err(rule(format!("{raw:?} is not an IPv4 CIDR or address"))),
    }
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
        let net = parse_cidr(cidr)?.trunc();
        if !matches!(net, IpNet::V6(_)) {
            return Err(rule(format!(
                "entry {item:?}: only IPv6 CIDRs go in brackets"
            )));
        }
        (Some(net), port)
    } else {
        match rest.rsplit_once(':') {
            Some((cidr, port)) => {
                let net = parse_cidr(cidr)?.trunc();
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
    /// First port, inclusive.
    pub first: u16,
    /// Last port, inclusive.
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
    /// Records allowed per unit, 1..=9999.
    pub count: u32,
    /// The unit.
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

/// Felix's `^[1-9]\d{0,3}/(second|minute|hour|day)$`: 1–9999 per lower-case unit.
fn parse_rate_limit(raw: &str) -> Result<RateLimit, Rule> {
    let bad = || rule("expected N/second, N/minute, N/hour or N/day with N in 1..=9999");
    let (n, per) = raw.split_once('/').ok_or_else(bad)?;
    let digits_ok =
        (1..=4).contains(&n.len()) && n.chars().all(|c| c.is_ascii_digit()) && !n.starts_with('0');
    if !digits_ok {
        return Err(bad());
    }
    let count: u32 = n.parse().map_err(|_| bad())?;
    let per = match per {
        "second" => RatePer::Second,
        "minute" => RatePer::Minute,
        "hour" => RatePer::Hour,
        "day" => RatePer::Day,
        _ => return Err(bad()),
    };
    Ok(RateLimit { count, per })
}

/// An inclusive range of routing-table indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RouteTableRange {
    /// First table index, inclusive.
    pub min: u32,
    /// Last table index, inclusive.
    pub max: u32,
}

impl fmt::Display for RouteTableRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

/// `min-max` with 1 ≤ min ≤ max ≤ 2³²−1.
fn parse_table_range(raw: &str) -> Result<RouteTableRange, Rule> {
    let bad = || {
        rule(format!(
            "routing-table range {raw:?}: expected min-max, 1 <= min <= max <= 4294967295"
        ))
    };
    let (lo, hi) = raw.split_once('-').ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if !digits(lo) || !digits(hi) {
        return Err(bad());
    }
    let min: u32 = lo.parse().map_err(|_| bad())?;
    let max: u32 = hi.parse().map_err(|_| bad())?;
    if min == 0 || min > max {
        return Err(bad());
    }
    Ok(RouteTableRange { min, max })
}

/// Felix caps the tables a node may target at 65535 in all.
const MAX_ROUTE_TABLES: u64 = 0xffff;

fn parse_table_ranges(raw: &str) -> Result<Vec<RouteTableRange>, Rule> {
    let ranges: Vec<RouteTableRange> = split_list(raw)
        .map(parse_table_range)
        .collect::<Result<_, _>>()?;
    let total: u64 = ranges.iter().map(|r| u64::from(r.max - r.min) + 1).sum();
    if total > MAX_ROUTE_TABLES {
        return Err(rule(format!(
            "routing-table ranges target {total} tables; at most {MAX_ROUTE_TABLES} are allowed"
        )));
    }
    Ok(ranges)
}

/// One `HealthTimeoutOverrides` entry: a health reporter's name and its timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct KeyDuration {
    /// Health reporter name.
    pub name: String,
    /// Its timeout.
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
            (Kind::Int { min: 0, max: 100 }, "42"),
            (Kind::RouteTableRanges, "1-250,1000-2000"),
            (Kind::MarkMask, "0xffff0000"),
        ] {
            let v = parse(kind, raw).unwrap();
            assert_eq!(v.to_string(), raw);
            assert_eq!(parse(kind, &v.to_string()).unwrap(), v);
        }
    }
}
