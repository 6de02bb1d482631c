//! `felix-nft flows`: reads the agent's flow socket ([`super::serve::FlowClient`]) and prints
//! one line per flow record, as `hubble observe` does, or the records' JSON. The command takes
//! its output streams as arguments so tests can drive it; `cli.rs` only forwards its arguments.
//!
//! A line reads:
//!
//! ```text
//! 2024-05-01T12:00:05Z prod/web -> prod/db:5432 TCP ingress ALLOWED by profile kns.prod rule 0 | in 12 pkt 1.5kB, out 10 pkt 900B, conns 1 new 0 done 1 live
//! ```
//!
//! - the end of the record's interval, UTC;
//! - each end: a workload as `NAMESPACE/POD`, a host endpoint as `NAME (host)`, anything else as
//!   its address, with `(node NODE)` where the node's routes say; the destination port after the
//!   destination when the protocol has ports;
//! - the protocol; which side reported it (`egress`: the source's policy, `ingress`: the
//!   destination's); the final verdict;
//! - the deciding hit (the last of the trace): `cnp` a Calico network policy, `gnp` a global one,
//!   `knp` a Kubernetes one, `staged`, `profile`, `end of tier T`, `no profile`; a policy as
//!   `[NAMESPACE/]TIER.NAME` (Calico's own spelling) and the index of its rule;
//! - the counts from the reporter's side.
//!
//! With `-v` the whole trace follows, one hit per indented line. Text from the records is
//! printed with control characters escaped: it reaches a terminal.

use std::fmt::{self, Write as _};
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::query::{Filter, Request};
use super::record::{Endpoint, EndpointKind, FlowRecord, PolicyHit, PolicyKind, Reporter, Verdict};
use super::serve::{FlowClient, Reply};

/// What `felix-nft flows` was asked.
#[derive(Clone, Debug)]
pub struct FlowsOptions {
    /// The agent's flow socket.
    pub socket: PathBuf,
    /// Keep printing new records until the agent stops or the process is interrupted.
    pub follow: bool,
    /// Only records of the last this long.
    pub since: Option<Duration>,
    /// Applied by the server.
    pub filter: Filter,
    /// Print the records' JSON, one per line, instead of text.
    pub json: bool,
    /// Print each record's whole policy trace.
    pub verbose: bool,
}

/// Runs `felix-nft flows`: 0 when the listing was read to its end (or the output was closed,
/// as by `| head`), 1 on any failure, said on `err`; following ends only with a failure (the
/// agent stopping) or the process being interrupted.
pub fn flows_command(opts: &FlowsOptions, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let request = Request {
        follow: opts.follow,
        since: opts
            .since
            .map(|d| i64::try_from(now.saturating_sub(d.as_secs())).unwrap_or(i64::MAX)),
        filter: opts.filter.clone(),
    };
    let fail = |err: &mut dyn Write, message: &dyn fmt::Display| {
        let _ = writeln!(err, "felix-nft: {message}");
        1
    };
    let client = match FlowClient::connect(&opts.socket, &request) {
        Ok(c) => c,
        Err(e) => return fail(err, &crate::ops::logging::chain(&e)),
    };
    for reply in client {
        let written = match reply {
            Ok(Reply::Record(record)) => {
                let line = if opts.json {
                    serde_json::to_string(&record).unwrap_or_default()
                } else {
                    format_record(&record, opts.verbose)
                };
                // Following, each line goes out as it comes; a listing is flushed at its end.
                writeln!(out, "{line}").and_then(
                    |()| {
                        if opts.follow {
                            out.flush()
                        } else {
                            Ok(())
                        }
                    },
                )
            }
            Ok(Reply::Lost(n)) => {
                let _ = writeln!(
                    err,
                    "felix-nft: {n} flows were dropped: this reader did not keep up"
                );
                Ok(())
            }
            Err(e) => return fail(err, &crate::ops::logging::chain(&e)),
        };
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return 0,
            Err(e) => return fail(err, &format_args!("writing the flows: {e}")),
        }
    }
    if let Err(e) = out.flush() {
        if e.kind() != io::ErrorKind::BrokenPipe {
            return fail(err, &format_args!("writing the flows: {e}"));
        }
    }
    if opts.follow {
        return fail(
            err,
            &format_args!(
                "the agent closed the flow socket {} (stopped or restarting?)",
                opts.socket.display()
            ),
        );
    }
    0
}

/// `5m`, `30s`, `1h`, `2d`, or a sum of them (`1h30m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{}: not a duration (like 30s, 5m, 1h, 2d or 1h30m)",
            felix_api::clip::ClippedQuoted(s)
        )
    };
    let mut total = 0u64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let mut units = rest[digits..].chars();
        let unit = match units.next() {
            Some('s') => 1,
            Some('m') => 60,
            Some('h') => 3600,
            Some('d') => 86_400,
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(unit)
            .and_then(|t| t.checked_add(total))
            .ok_or_else(bad)?;
        rest = units.as_str();
    }
    Ok(Duration::from_secs(total))
}

/// `src` or `dst` (also `egress` and `ingress`, as the lines say it).
pub fn parse_reporter(s: &str) -> Result<Reporter, String> {
    match s.to_ascii_lowercase().as_str() {
        "src" | "egress" => Ok(Reporter::Src),
        "dst" | "ingress" => Ok(Reporter::Dst),
        _ => Err(format!(
            "{}: not a reporter (src or dst)",
            felix_api::clip::ClippedQuoted(s)
        )),
    }
}

/// One record as text: one line, and with `verbose` one more per hit of the trace. No final
/// newline.
pub fn format_record(record: &FlowRecord, verbose: bool) -> String {
    let k = &record.key;
    let mut s = String::with_capacity(160);
    let port = has_ports(k.proto).then_some(k.dest_port);
    let _ = write!(
        s,
        "{} {} -> {} {} {} {}",
        Utc(record.end_time),
        End(&k.src, None),
        End(&k.dst, port),
        Proto(k.proto),
        match k.reporter {
            Reporter::Src => "egress",
            Reporter::Dst => "ingress",
        },
        match k.action {
            Verdict::Allow => "ALLOWED",
            Verdict::Deny => "DENIED",
            Verdict::Pass => "PASSED",
        },
    );
    match k.trace.last() {
        Some(hit) => {
            let _ = write!(s, " by {}", Hit(hit));
        }
        None => s.push_str(" (no trace)"),
    }
    let _ = write!(
        s,
        " | in {} pkt {}, out {} pkt {}, conns {} new {} done {} live",
        record.packets_in,
        Bytes(record.bytes_in),
        record.packets_out,
        Bytes(record.bytes_out),
        record.connections_started,
        record.connections_completed,
        record.connections_live,
    );
    if verbose {
        for (i, hit) in k.trace.iter().enumerate() {
            let action = match hit.action {
                Verdict::Allow => "allow",
                Verdict::Deny => "deny",
                Verdict::Pass => "pass",
            };
            let _ = write!(s, "\n    {}. {action:<5} {}", i + 1, Hit(hit));
        }
    }
    s
}

/// TCP, UDP and SCTP have ports; a port of another protocol is 0 and says nothing.
fn has_ports(proto: u8) -> bool {
    [libc::IPPROTO_TCP, libc::IPPROTO_UDP, libc::IPPROTO_SCTP].contains(&i32::from(proto))
}

/// Text from a record, control characters escaped.
struct Clean<'a>(&'a str);

impl fmt::Display for Clean<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// One end of a flow, with the destination port when there is one.
struct End<'a>(&'a Endpoint, Option<u16>);

impl fmt::Display for End<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let End(e, port) = *self;
        match e.kind {
            EndpointKind::Workload if !e.namespace.is_empty() => {
                write!(f, "{}/{}", Clean(&e.namespace), Clean(&e.name))?
            }
            // An IPv6 address takes brackets before a port, as in a URL.
            EndpointKind::Network if port.is_some() && e.name.contains(':') => {
                write!(f, "[{}]", Clean(&e.name))?
            }
            _ => write!(f, "{}", Clean(&e.name))?,
        }
        if let Some(p) = port {
            write!(f, ":{p}")?;
        }
        match (&e.kind, &e.node) {
            (EndpointKind::Host, _) => f.write_str(" (host)"),
            (EndpointKind::Network, Some(node)) => write!(f, " (node {})", Clean(node)),
            _ => Ok(()),
        }
    }
}

/// One hit of a trace, without its action.
struct Hit<'a>(&'a PolicyHit);

impl fmt::Display for Hit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = self.0;
        let kind = match h.kind {
            PolicyKind::EndOfTier => return write!(f, "end of tier {}", Clean(&h.tier)),
            PolicyKind::NoProfile => return f.write_str("no profile"),
            PolicyKind::Profile => "profile",
            PolicyKind::CalicoNetworkPolicy => "cnp",
            PolicyKind::GlobalNetworkPolicy => "gnp",
            PolicyKind::NetworkPolicy => "knp",
            PolicyKind::Staged => "staged",
        };
        write!(f, "{kind} ")?;
        if !h.namespace.is_empty() {
            write!(f, "{}/", Clean(&h.namespace))?;
        }
        let prefixed = h
            .name
            .strip_prefix(h.tier.as_str())
            .is_some_and(|r| r.starts_with('.'));
        if !h.tier.is_empty() && !prefixed {
            write!(f, "{}.", Clean(&h.tier))?;
        }
        write!(f, "{}", Clean(&h.name))?;
        if h.rule_index >= 0 {
            write!(f, " rule {}", h.rule_index)?;
        }
        Ok(())
    }
}

/// An IP protocol by its usual name, or its number.
struct Proto(u8);

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match i32::from(self.0) {
            libc::IPPROTO_TCP => f.write_str("TCP"),
            libc::IPPROTO_UDP => f.write_str("UDP"),
            libc::IPPROTO_ICMP => f.write_str("ICMP"),
            libc::IPPROTO_ICMPV6 => f.write_str("ICMPv6"),
            libc::IPPROTO_SCTP => f.write_str("SCTP"),
            n => write!(f, "proto {n}"),
        }
    }
}

/// A byte count in decimal units with one (truncated) decimal: `900B`, `1.5kB`, `2.0GB`.
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["kB", "MB", "GB", "TB", "PB", "EB"];
        if self.0 < 1000 {
            return write!(f, "{}B", self.0);
        }
        let mut scale = 1000u64;
        let mut unit = 0;
        while unit + 1 < UNITS.len() && self.0 / scale >= 1000 {
            scale *= 1000;
            unit += 1;
        }
        let tenths = u128::from(self.0) * 10 / u128::from(scale);
        write!(f, "{}.{}{}", tenths / 10, tenths % 10, UNITS[unit])
    }
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
struct Utc(i64);

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = self.0.div_euclid(86_400);
        let secs = self.0.rem_euclid(86_400);
        // Howard Hinnant's civil_from_days: the proleptic Gregorian date of a day count.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::query::tests::{hit, network, record, workload};

    fn with_reporter(mut r: FlowRecord, reporter: Reporter) -> FlowRecord {
        r.key.reporter = reporter;
        r
    }

    #[test]
    fn workload_to_workload_allowed_by_a_profile() {
        let r = record(
            workload("prod", "web"),
            workload("prod", "db"),
            6,
            5432,
            vec![hit(
                PolicyKind::Profile,
                "",
                "kns.prod",
                "",
                Verdict::Allow,
                0,
            )],
        );
        assert_eq!(
            format_record(&r, false),
            "2024-05-01T12:00:05Z prod/web -> prod/db:5432 TCP ingress ALLOWED by profile \
             kns.prod rule 0 | in 12 pkt 1.5kB, out 10 pkt 900B, conns 1 new 0 done 1 live"
        );
    }

    #[test]
    fn denied_at_the_end_of_a_tier_with_the_trace() {
        let r = with_reporter(
            record(
                workload("prod", "web"),
                network("10.0.0.9", None),
                17,
                53,
                vec![
                    hit(
                        PolicyKind::GlobalNetworkPolicy,
                        "",
                        "pass-dns",
                        "platform",
                        Verdict::Pass,
                        1,
                    ),
                    hit(
                        PolicyKind::CalicoNetworkPolicy,
                        "prod",
                        "security.audit",
                        "security",
                        Verdict::Pass,
                        0,
                    ),
                    hit(PolicyKind::EndOfTier, "", "", "security", Verdict::Deny, -1),
                ],
            ),
            Reporter::Src,
        );
        let head = "2024-05-01T12:00:05Z prod/web -> 10.0.0.9:53 UDP egress DENIED by end of tier \
                    security | in 12 pkt 1.5kB, out 10 pkt 900B, conns 1 new 0 done 1 live";
        assert_eq!(format_record(&r, false), head);
        assert_eq!(
            format_record(&r, true),
            format!(
                "{head}\n    1. pass  gnp platform.pass-dns rule 1\
                 \n    2. pass  cnp prod/security.audit rule 0\
                 \n    3. deny  end of tier security"
            )
        );
    }

    #[test]
    fn network_ends_with_their_node() {
        let r = record(
            network("10.65.1.7", Some("node-b")),
            network("fd00:10::7", Some("node-c")),
            6,
            443,
            vec![hit(
                PolicyKind::NetworkPolicy,
                "prod",
                "knp.default.allow-https",
                "default",
                Verdict::Allow,
                3,
            )],
        );
        assert_eq!(
            format_record(&r, false),
            "2024-05-01T12:00:05Z 10.65.1.7 (node node-b) -> [fd00:10::7]:443 (node node-c) TCP \
             ingress ALLOWED by knp prod/default.knp.default.allow-https rule 3 | in 12 pkt \
             1.5kB, out 10 pkt 900B, conns 1 new 0 done 1 live"
        );
    }

    #[test]
    fn icmp_has_no_port_and_a_host_endpoint_says_so() {
        let mut r = with_reporter(
            record(
                Endpoint {
                    kind: EndpointKind::Host,
                    name: "eth0-hep".into(),
                    namespace: String::new(),
                    node: None,
                },
                network("8.8.8.8", None),
                1,
                0,
                vec![hit(PolicyKind::NoProfile, "", "", "", Verdict::Deny, -1)],
            ),
            Reporter::Src,
        );
        (r.bytes_in, r.bytes_out) = (0, 2_345_678_901);
        assert_eq!(
            format_record(&r, false),
            "2024-05-01T12:00:05Z eth0-hep (host) -> 8.8.8.8 ICMP egress DENIED by no profile \
             | in 12 pkt 0B, out 10 pkt 2.3GB, conns 1 new 0 done 1 live"
        );
    }

    #[test]
    fn control_characters_from_a_record_are_escaped() {
        let r = record(
            workload("prod", "web\u{1b}[2J"),
            workload("prod", "db"),
            132,
            9,
            vec![],
        );
        assert_eq!(
            format_record(&r, false),
            "2024-05-01T12:00:05Z prod/web\\u{1b}[2J -> prod/db:9 SCTP ingress DENIED (no trace) \
             | in 12 pkt 1.5kB, out 10 pkt 900B, conns 1 new 0 done 1 live"
        );
    }

    #[test]
    fn times_bytes_and_protocols() {
        let utc = |t| Utc(t).to_string();
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(-86_401), "1969-12-30T23:59:59Z");
        let bytes = |n| Bytes(n).to_string();
        assert_eq!(bytes(999), "999B");
        assert_eq!(bytes(1000), "1.0kB");
        assert_eq!(bytes(999_999), "999.9kB");
        assert_eq!(bytes(u64::MAX), "18.4EB");
        assert_eq!(Proto(47).to_string(), "proto 47");
    }

    #[test]
    fn durations() {
        let secs = |s| parse_duration(s).map(|d| d.as_secs());
        assert_eq!(secs("30s"), Ok(30));
        assert_eq!(secs("5m"), Ok(300));
        assert_eq!(secs("1h30m"), Ok(5400));
        assert_eq!(secs("2d"), Ok(172_800));
        for bad in ["", "5", "m", "5x", "-5m", "1.5h", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    /// The command as the CLI runs it, against a live server: text, verbose, JSON, a filter.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_command_prints_what_the_server_holds() {
        use crate::flows::serve::{FlowServer, FlowServerConfig};
        let dir = tempfile::tempdir().unwrap();
        let cfg = FlowServerConfig {
            path: dir.path().join("flows.sock"),
            ..FlowServerConfig::default()
        };
        let (sink, _task) = FlowServer::start(&cfg, std::future::pending()).unwrap();
        let allowed = record(
            workload("prod", "web"),
            workload("prod", "db"),
            6,
            5432,
            vec![hit(
                PolicyKind::Profile,
                "",
                "kns.prod",
                "",
                Verdict::Allow,
                0,
            )],
        );
        let denied = record(
            workload("staging", "web"),
            workload("prod", "db"),
            6,
            5432,
            vec![hit(
                PolicyKind::EndOfTier,
                "",
                "",
                "default",
                Verdict::Deny,
                -1,
            )],
        );
        sink.publish(vec![allowed.clone(), denied.clone()]);
        let opts = FlowsOptions {
            socket: cfg.path.clone(),
            follow: false,
            since: None,
            filter: Filter::default(),
            json: false,
            verbose: false,
        };
        let run = |opts: FlowsOptions| {
            tokio::task::spawn_blocking(move || {
                let (mut out, mut err) = (Vec::new(), Vec::new());
                let code = flows_command(&opts, &mut out, &mut err);
                let text = |b| String::from_utf8(b).unwrap();
                (code, text(out), text(err))
            })
        };
        let (code, out, err) = run(opts.clone()).await.unwrap();
        assert_eq!((code, err.as_str()), (0, ""));
        assert_eq!(
            out,
            format!(
                "{}\n{}\n",
                format_record(&allowed, false),
                format_record(&denied, false)
            )
        );
        let verbose = FlowsOptions {
            verbose: true,
            filter: Filter {
                verdict: Some(crate::flows::query::FinalVerdict::Deny),
                ..Filter::default()
            },
            ..opts.clone()
        };
        let (code, out, _) = run(verbose).await.unwrap();
        assert_eq!(
            (code, out),
            (0, format!("{}\n", format_record(&denied, true)))
        );
        let json = FlowsOptions { json: true, ..opts };
        let (code, out, _) = run(json).await.unwrap();
        assert_eq!(code, 0);
        let got: Vec<FlowRecord> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(got, [allowed, denied]);
    }

    #[test]
    fn a_missing_socket_says_what_it_means() {
        let dir = tempfile::tempdir().unwrap();
        let opts = FlowsOptions {
            socket: dir.path().join("flows.sock"),
            follow: false,
            since: None,
            filter: Filter::default(),
            json: false,
            verbose: false,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(flows_command(&opts, &mut out, &mut err), 1);
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains(&opts.socket.display().to_string()), "{err}");
        assert!(err.contains("FlowLogsLocalReporter=Enabled"), "{err}");
        assert!(out.is_empty());
    }
}
