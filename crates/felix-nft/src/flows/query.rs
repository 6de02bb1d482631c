//! What a reader of the local flow view asks for: the request line a client of the flow socket
//! ([`super::serve`]) sends, and the [`Filter`] the server applies to each record before it goes
//! out. Shared by the server and `felix-nft flows`; pure.
//!
//! The request is one line of JSON; every field may be left out:
//!
//! ```text
//! {"follow": true, "since": 1714564800, "filter": {"namespace": "prod", "verdict": "deny"}}
//! ```
//!
//! Unknown fields are refused, not ignored: a filter the server does not know, silently
//! dropped, would show flows the reader asked not to see as if they had matched.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::record::{Endpoint, EndpointKind, FlowRecord, PolicyHit, Reporter, Verdict};
use felix_api::clip::ClippedQuoted;
use felix_api::json::JsonError;

/// One client's request: which records, and whether to keep sending new ones.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// After the records held, send new ones as they are published, until the client goes
    /// away.
    #[serde(default)]
    pub follow: bool,
    /// Only records whose interval ended after this, in seconds since the Unix epoch (a record
    /// covers `[start, end)`: one ending exactly here saw nothing after it).
    #[serde(default)]
    pub since: Option<i64>,
    #[serde(default)]
    pub filter: Filter,
}

/// Which records a client wants. Every field set must match; none set matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// A workload (pod) name at either end. With [`Filter::namespace`], both must match the
    /// same end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// A workload's namespace at either end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A policy or profile named by any hit of the trace, not only the deciding one: `NAME`,
    /// `TIER.NAME`, `NAMESPACE/NAME` or `NAMESPACE/TIER.NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The final verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<FinalVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// The destination port; 0 matches the flows of protocols without ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Which side reported the flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporter: Option<Reporter>,
}

/// A flow's final verdict as a filter asks for it: a trace ends in allow or deny, never pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalVerdict {
    Allow,
    Deny,
}

/// An IP protocol as a filter asks for it. On the wire a name (`"icmp"`) or a number (`6`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// ICMP of either family (1 or 58): a reader asking for ICMP rarely means only IPv4's.
    Icmp,
    /// Exactly this protocol number; the names `tcp`, `udp`, `sctp` and `icmpv6` parse to theirs.
    Number(u8),
}

/// Why a request line was refused; the text goes back to the client in its error line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request is not valid: {0}")]
    Json(#[from] JsonError),
    #[error("the request is not valid: an empty value (at `filter.{field}`)")]
    Empty { field: &'static str },
}

impl Request {
    /// Decodes and checks one request line (without its newline).
    pub fn parse(line: &str) -> Result<Request, RequestError> {
        let request: Request = felix_api::json::decode(line)?;
        request.filter.check()?;
        Ok(request)
    }

    /// Whether `record` is one this request asks for.
    pub fn matches(&self, record: &FlowRecord) -> bool {
        self.since.is_none_or(|t| record.end_time > t) && self.filter.matches(record)
    }
}

impl Filter {
    /// Refuses values that could never match, which are more likely a mistake than a question.
    fn check(&self) -> Result<(), RequestError> {
        let fields = [
            ("pod", &self.pod),
            ("namespace", &self.namespace),
            ("policy", &self.policy),
        ];
        match fields.iter().find(|(_, v)| v.as_deref() == Some("")) {
            Some((field, _)) => Err(RequestError::Empty { field }),
            None => Ok(()),
        }
    }

    /// Whether `record` passes every condition set.
    pub fn matches(&self, record: &FlowRecord) -> bool {
        let k = &record.key;
        let by_endpoint = self.pod.is_none() && self.namespace.is_none();
        (by_endpoint || self.endpoint_matches(&k.src) || self.endpoint_matches(&k.dst))
            && self
                .policy
                .as_deref()
                .is_none_or(|p| k.trace.iter().any(|h| policy_matches(h, p)))
            && self.verdict.is_none_or(|v| v.verdict() == k.action)
            && self.protocol.is_none_or(|p| p.matches(k.proto))
            && self.port.is_none_or(|p| p == k.dest_port)
            && self.reporter.is_none_or(|r| r == k.reporter)
    }

    fn endpoint_matches(&self, end: &Endpoint) -> bool {
        end.kind == EndpointKind::Workload
            && self.pod.as_deref().is_none_or(|p| p == end.name)
            && self.namespace.as_deref().is_none_or(|n| n == end.namespace)
    }
}

/// `pattern` is `[NAMESPACE/][TIER.]NAME` of this hit.
fn policy_matches(hit: &PolicyHit, pattern: &str) -> bool {
    let rest = match pattern.split_once('/') {
        Some((ns, rest)) if ns == hit.namespace => rest,
        Some(_) => return false,
        None => pattern,
    };
    if hit.name.is_empty() {
        return false;
    }
    rest == hit.name
        || rest
            .strip_prefix(hit.tier.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .is_some_and(|name| !hit.tier.is_empty() && name == hit.name)
}

impl FinalVerdict {
    /// The record's verdict this one is.
    pub fn verdict(self) -> Verdict {
        match self {
            FinalVerdict::Allow => Verdict::Allow,
            FinalVerdict::Deny => Verdict::Deny,
        }
    }
}

/// `allow`/`allowed`, `deny`/`denied`, any case (the CLI prints ALLOWED and DENIED, so either
/// spelling is what a reader copies).
impl FromStr for FinalVerdict {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "allow" | "allowed" => Ok(FinalVerdict::Allow),
            "deny" | "denied" => Ok(FinalVerdict::Deny),
            _ => Err(format!(
                "{}: not a verdict (allowed or denied)",
                ClippedQuoted(s)
            )),
        }
    }
}

impl Protocol {
    /// Whether a flow of IP protocol `proto` is of this protocol.
    pub fn matches(self, proto: u8) -> bool {
        match self {
            Protocol::Icmp => {
                proto == libc::IPPROTO_ICMP as u8 || proto == libc::IPPROTO_ICMPV6 as u8
            }
            Protocol::Number(n) => n == proto,
        }
    }
}

const PROTOCOL_EXPECTED: &str = "tcp, udp, sctp, icmp, icmpv6 or a protocol number 0-255";

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let n = match s.to_ascii_lowercase().as_str() {
            "icmp" => return Ok(Protocol::Icmp),
            "tcp" => libc::IPPROTO_TCP,
            "udp" => libc::IPPROTO_UDP,
            "sctp" => libc::IPPROTO_SCTP,
            "icmpv6" => libc::IPPROTO_ICMPV6,
            other => match other.parse::<u8>() {
                Ok(n) => return Ok(Protocol::Number(n)),
                Err(_) => {
                    return Err(format!(
                        "{}: not a protocol ({PROTOCOL_EXPECTED})",
                        ClippedQuoted(s)
                    ))
                }
            },
        };
        Ok(Protocol::Number(n as u8))
    }
}

impl Serialize for Protocol {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Protocol::Icmp => s.serialize_str("icmp"),
            Protocol::Number(n) => s.serialize_u8(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ProtocolVisitor;
        impl Visitor<'_> for ProtocolVisitor {
            type Value = Protocol;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(PROTOCOL_EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Protocol, E> {
                u8::try_from(v)
                    .map(Protocol::Number)
                    .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Protocol, E> {
                u8::try_from(v)
                    .map(Protocol::Number)
                    .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Protocol, E> {
                v.parse()
                    .map_err(|_| E::invalid_value(Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(ProtocolVisitor)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::flows::record::{FlowKey, PolicyKind};

    pub(crate) fn workload(ns: &str, name: &str) -> Endpoint {
        Endpoint {
            kind: EndpointKind::Workload,
            name: name.into(),
            namespace: ns.into(),
            node: None,
        }
    }

    pub(crate) fn network(addr: &str, node: Option<&str>) -> Endpoint {
        Endpoint {
            kind: EndpointKind::Network,
            name: addr.into(),
            namespace: String::new(),
            node: node.map(Into::into),
        }
    }

    pub(crate) fn hit(
        kind: PolicyKind,
        ns: &str,
        name: &str,
        tier: &str,
        action: Verdict,
        rule: i64,
    ) -> PolicyHit {
        PolicyHit {
            kind,
            namespace: ns.into(),
            name: name.into(),
            tier: tier.into(),
            action,
            policy_index: 0,
            rule_index: rule,
        }
    }

    pub(crate) fn record(
        src: Endpoint,
        dst: Endpoint,
        proto: u8,
        port: u16,
        trace: Vec<PolicyHit>,
    ) -> FlowRecord {
        let action = trace.last().map_or(Verdict::Deny, |h| h.action);
        FlowRecord {
            key: FlowKey {
                src,
                dst,
                proto,
                dest_port: port,
                reporter: Reporter::Dst,
                action,
                trace,
            },
            start_time: 1_714_564_800,
            end_time: 1_714_564_805,
            packets_in: 12,
            packets_out: 10,
            bytes_in: 1_500,
            bytes_out: 900,
            connections_started: 1,
            connections_completed: 0,
            connections_live: 1,
        }
    }

    /// prod/web → prod/db:5432 over TCP, passed by a global policy of tier security, then
    /// allowed by the namespace's profile.
    fn web_to_db() -> FlowRecord {
        record(
            workload("prod", "web"),
            workload("prod", "db"),
            6,
            5432,
            vec![
                hit(
                    PolicyKind::GlobalNetworkPolicy,
                    "",
                    "pass-prod",
                    "security",
                    Verdict::Pass,
                    0,
                ),
                hit(PolicyKind::Profile, "", "kns.prod", "", Verdict::Allow, 0),
            ],
        )
    }

    fn filter(json: &str) -> Filter {
        Request::parse(&format!("{{\"filter\":{json}}}"))
            .unwrap()
            .filter
    }

    #[test]
    fn an_empty_filter_matches_everything() {
        assert!(Filter::default().matches(&web_to_db()));
        assert_eq!(Request::parse("{}").unwrap(), Request::default());
    }

    #[test]
    fn pod_and_namespace_must_match_the_same_end() {
        let r = web_to_db();
        assert!(filter(r#"{"pod":"db"}"#).matches(&r));
        assert!(filter(r#"{"pod":"web","namespace":"prod"}"#).matches(&r));
        assert!(!filter(r#"{"pod":"web","namespace":"staging"}"#).matches(&r));
        assert!(!filter(r#"{"namespace":"staging"}"#).matches(&r));
        let cross = record(
            workload("staging", "web"),
            workload("prod", "db"),
            6,
            5432,
            vec![],
        );
        assert!(!filter(r#"{"pod":"web","namespace":"prod"}"#).matches(&cross));
        assert!(filter(r#"{"pod":"db","namespace":"prod"}"#).matches(&cross));
        // A network end's address is not a pod name.
        let from_net = record(
            network("10.0.0.5", None),
            workload("prod", "db"),
            6,
            5432,
            vec![],
        );
        assert!(!filter(r#"{"pod":"10.0.0.5"}"#).matches(&from_net));
    }

    #[test]
    fn a_policy_matches_any_hit_of_the_trace_in_any_of_its_spellings() {
        let r = web_to_db();
        for p in ["pass-prod", "security.pass-prod", "kns.prod"] {
            assert!(filter(&format!(r#"{{"policy":"{p}"}}"#)).matches(&r), "{p}");
        }
        for p in ["default.pass-prod", "prod/pass-prod", "security", "pass"] {
            assert!(
                !filter(&format!(r#"{{"policy":"{p}"}}"#)).matches(&r),
                "{p}"
            );
        }
        let np = record(
            workload("prod", "web"),
            workload("prod", "db"),
            6,
            5432,
            vec![hit(
                PolicyKind::CalicoNetworkPolicy,
                "prod",
                "allow-db",
                "default",
                Verdict::Allow,
                2,
            )],
        );
        for p in [
            "allow-db",
            "prod/allow-db",
            "prod/default.allow-db",
            "default.allow-db",
        ] {
            assert!(
                filter(&format!(r#"{{"policy":"{p}"}}"#)).matches(&np),
                "{p}"
            );
        }
        assert!(!filter(r#"{"policy":"staging/allow-db"}"#).matches(&np));
    }

    #[test]
    fn verdict_protocol_port_reporter_and_since() {
        let r = web_to_db();
        assert!(filter(r#"{"verdict":"allow"}"#).matches(&r));
        assert!(!filter(r#"{"verdict":"deny"}"#).matches(&r));
        assert!(filter(r#"{"protocol":"tcp","port":5432}"#).matches(&r));
        assert!(filter(r#"{"protocol":6}"#).matches(&r));
        assert!(!filter(r#"{"protocol":"udp"}"#).matches(&r));
        assert!(!filter(r#"{"port":80}"#).matches(&r));
        assert!(filter(r#"{"reporter":"dst"}"#).matches(&r));
        assert!(!filter(r#"{"reporter":"src"}"#).matches(&r));
        let ping6 = record(
            network("fd00::1", None),
            workload("prod", "db"),
            58,
            0,
            vec![],
        );
        assert!(filter(r#"{"protocol":"icmp","port":0}"#).matches(&ping6));
        assert!(!filter(r#"{"protocol":1}"#).matches(&ping6));
        let since = |t: i64| Request {
            since: Some(t),
            ..Request::default()
        };
        assert!(since(r.end_time - 1).matches(&r));
        assert!(!since(r.end_time).matches(&r));
    }

    #[test]
    fn a_request_round_trips_through_its_json() {
        let request = Request {
            follow: true,
            since: Some(1_714_564_800),
            filter: Filter {
                pod: Some("web".into()),
                namespace: Some("prod".into()),
                policy: Some("kns.prod".into()),
                verdict: Some(FinalVerdict::Deny),
                protocol: Some(Protocol::Icmp),
                port: Some(0),
                reporter: Some(Reporter::Src),
            },
        };
        let line = serde_json::to_string(&request).unwrap();
        assert_eq!(Request::parse(&line).unwrap(), request);
        let line = serde_json::to_string(&Filter {
            protocol: Some(Protocol::Number(132)),
            ..Filter::default()
        })
        .unwrap();
        assert_eq!(line, r#"{"protocol":132}"#);
    }

    /// Each refusal names the field and the value at fault.
    #[test]
    fn a_bad_request_is_refused_naming_field_and_value() {
        let cases = [
            ("{\"folow\":true}", ["`folow`", "`follow`"]),
            (
                r#"{"filter":{"verdict":"pass"}}"#,
                ["`pass`", "`filter.verdict`"],
            ),
            (r#"{"filter":{"port":70000}}"#, ["70000", "`filter.port`"]),
            (
                r#"{"filter":{"port":"http"}}"#,
                ["\"http\"", "`filter.port`"],
            ),
            (
                r#"{"filter":{"protocol":"sctpx"}}"#,
                ["\"sctpx\"", "`filter.protocol`"],
            ),
            (
                r#"{"filter":{"protocol":300}}"#,
                ["300", "`filter.protocol`"],
            ),
            (
                r#"{"filter":{"reporter":"both"}}"#,
                ["`both`", "`filter.reporter`"],
            ),
            (r#"{"since":"5m"}"#, ["\"5m\"", "`since`"]),
            (r#"{"filter":{"pod":""}}"#, ["empty", "`filter.pod`"]),
            ("not json", ["expected", "`.`"]),
        ];
        for (line, wanted) in cases {
            let e = Request::parse(line).unwrap_err().to_string();
            for w in wanted {
                assert!(e.contains(w), "{line}: {e} lacks {w}");
            }
        }
    }

    #[test]
    fn cli_spellings() {
        assert_eq!("DENIED".parse(), Ok(FinalVerdict::Deny));
        assert_eq!("allow".parse(), Ok(FinalVerdict::Allow));
        assert!("pass".parse::<FinalVerdict>().is_err());
        assert_eq!("TCP".parse(), Ok(Protocol::Number(6)));
        assert_eq!("icmpv6".parse(), Ok(Protocol::Number(58)));
        assert_eq!("47".parse(), Ok(Protocol::Number(47)));
        assert!("256".parse::<Protocol>().is_err());
    }
}
