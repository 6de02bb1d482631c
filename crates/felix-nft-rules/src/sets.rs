//! Felix IP sets as nftables sets (§6.4, §13): members parsed once when recorded and
//! split by family, types mapped, `NET` members de-overlapped.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use tracing::warn;

use crate::names::ipset_name;
use crate::Renderer;
use felix_api::types::IpSetType;
use nf_tables::build;
use nf_tables::model::{set_flags, DataType, Element, Family, Set};

/// Parses an `IP_AND_PORT` member `addr,proto:port` (`10.0.0.5,tcp:8080`, `fd00::5,udp:53`).
pub fn parse_ip_and_port(member: &str) -> Option<(IpAddr, u8, u16)> {
    let (addr, rest) = member.rsplit_once(',')?;
    let (proto, port) = rest.split_once(':')?;
    let addr: IpAddr = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    let proto = match proto.to_ascii_lowercase().as_str() {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        other => other.parse().ok()?,
    };
    Some((addr, proto, port.parse().ok()?))
}

/// An address: dotted-quad IPv4 the common way ([`dotted_quad`]), anything else by the standard
/// library.
fn parse_addr(s: &str) -> Option<IpAddr> {
    match dotted_quad(s.as_bytes()) {
        Some(a) => Some(IpAddr::V4(a)),
        None => s.parse().ok(),
    }
}

/// `a.b.c.d` with each part 0–255 in decimal, without leading zeros: a subset of what the
/// standard library's parser accepts, read in one pass with about half its instructions (a
/// mid-scale full load reads 100,000 members). `None` for anything else, which then goes to the
/// standard library's parser to be accepted or refused there.
fn dotted_quad(s: &[u8]) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let (mut i, mut v, mut digits) = (0, 0u32, 0);
    for &b in s {
        match b {
            b'0'..=b'9' => {
                // A leading zero, or a value over 255 (which also bounds the digits to 3).
                if digits == 1 && v == 0 {
                    return None;
                }
                v = v * 10 + u32::from(b - b'0');
                if v > 255 {
                    return None;
                }
                digits += 1;
            }
            b'.' if digits > 0 && i < 3 => {
                octets[i] = v as u8;
                (i, v, digits) = (i + 1, 0, 0);
            }
            _ => return None,
        }
    }
    if digits == 0 || i != 3 {
        return None;
    }
    octets[3] = v as u8;
    Some(Ipv4Addr::from(octets))
}

/// A member as a network (host bits cleared); a bare address is its host network. An IPv4
/// member is read in one pass over its bytes ([`dotted_quad_net`]); anything else is split at
/// `/`, its address and prefix length parsed apart (a third of the time of `IpNet`'s own
/// parser, for 100,000 members of a full load).
fn parse_net(s: &str) -> Option<IpNet> {
    match dotted_quad_net(s.as_bytes()) {
        Some(n) => Some(IpNet::V4(n)),
        None => parse_net_split(s),
    }
}

fn parse_net_split(s: &str) -> Option<IpNet> {
    match s.split_once('/') {
        Some((addr, len)) => {
            let addr = parse_addr(addr)?;
            // Digits only (`u8`'s parser would also take a sign).
            if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let len: u8 = len.parse().ok()?;
            IpNet::new(addr, len).ok().map(|n| n.trunc())
        }
        None => parse_addr(s).map(IpNet::from),
    }
}

/// `a.b.c.d` or `a.b.c.d/N` with N of one or two digits, host bits cleared; `None` for anything
/// else ([`parse_net_split`] decides then).
fn dotted_quad_net(s: &[u8]) -> Option<Ipv4Net> {
    let (addr, len) = match s.iter().position(|&b| b == b'/') {
        None => (s, 32),
        Some(i) => {
            let len = match s[i + 1..] {
                [d] if d.is_ascii_digit() => d - b'0',
                [d, e] if d.is_ascii_digit() && e.is_ascii_digit() => (d - b'0') * 10 + (e - b'0'),
                _ => return None,
            };
            (&s[..i], len)
        }
    };
    Ipv4Net::new(dotted_quad(addr)?, len)
        .ok()
        .map(|n| n.trunc())
}

/// What one member string is in a set of type `kind`; `None` when it is not one.
fn parse_member(kind: IpSetType, m: &str) -> Option<Parsed> {
    match kind {
        IpSetType::Ip => parse_net(m)
            .filter(|n| n.prefix_len() == n.max_prefix_len())
            .map(|n| Parsed::Addr(n.addr())),
        IpSetType::Net => parse_net(m).map(Parsed::Net),
        IpSetType::IpAndPort => parse_ip_and_port(m).map(|(a, p, n)| Parsed::AddrPort(a, p, n)),
    }
}

/// [`parse_member`], logging what is left out (the input is validated before it is recorded).
fn parsed(kind: IpSetType, m: &str) -> Option<Parsed> {
    let p = parse_member(kind, m);
    if p.is_none() {
        warn!(member = %m, ?kind, "ignoring unparsable IP set member");
    }
    p
}

/// Whether `m` is a member of a set of type `kind` as [`Members`] records it (what validation
/// accepts, so that a validated member is never dropped).
pub fn is_member(kind: IpSetType, m: &str) -> bool {
    parse_member(kind, m).is_some()
}

/// One IP set's members as the model keeps them: parsed when recorded, by family, in sets (so
/// sorted and without duplicates). As strings, a mid-scale node's 100,000 members were about
/// 5 MB of the daemon's memory; as addresses they are a fifth of that, and rendering them
/// parses nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Members {
    /// `IP`: addresses; a `/32` or `/128` member is its address.
    Ip {
        v4: BTreeSet<Ipv4Addr>,
        v6: BTreeSet<Ipv6Addr>,
    },
    /// `NET`: networks with their host bits cleared; a bare address is its host network.
    Net {
        v4: BTreeSet<Ipv4Net>,
        v6: BTreeSet<Ipv6Net>,
    },
    /// `IP_AND_PORT`: (address, IP protocol, port).
    IpAndPort(BTreeSet<(IpAddr, u8, u16)>),
}

/// What one member string is in a set of some type.
enum Parsed {
    Addr(IpAddr),
    Net(IpNet),
    AddrPort(IpAddr, u8, u16),
}

impl Members {
    /// No members.
    pub fn new(kind: IpSetType) -> Members {
        match kind {
            IpSetType::Ip => Members::Ip {
                v4: BTreeSet::new(),
                v6: BTreeSet::new(),
            },
            IpSetType::Net => Members::Net {
                v4: BTreeSet::new(),
                v6: BTreeSet::new(),
            },
            IpSetType::IpAndPort => Members::IpAndPort(BTreeSet::new()),
        }
    }

    /// A set of type `kind` holding `members`; members that do not parse as that type are
    /// logged and left out (the input is validated before it is recorded).
    pub fn parse<'a>(kind: IpSetType, members: impl IntoIterator<Item = &'a str>) -> Members {
        Members::collect(kind, members.into_iter().filter_map(|m| parsed(kind, m)))
    }

    /// A set of type `kind` holding `members`, or the index of the first member that is not
    /// one (validation parses a set's members once, and hands them to the model).
    pub fn try_parse(kind: IpSetType, members: &[String]) -> Result<Members, usize> {
        let mut bad = None;
        let parsed = members.iter().enumerate().map_while(|(i, m)| {
            let p = parse_member(kind, m);
            if p.is_none() {
                bad = Some(i);
            }
            p
        });
        let out = Members::collect(kind, parsed);
        match bad {
            Some(i) => Err(i),
            None => Ok(out),
        }
    }

    fn collect(kind: IpSetType, parsed: impl Iterator<Item = Parsed>) -> Members {
        // Collected first: a set built from a list is sorted once and filled in bulk, not
        // searched member by member.
        match kind {
            IpSetType::Ip => {
                let (mut v4, mut v6) = (Vec::new(), Vec::new());
                for p in parsed {
                    match p {
                        Parsed::Addr(IpAddr::V4(a)) => v4.push(a),
                        Parsed::Addr(IpAddr::V6(a)) => v6.push(a),
                        _ => {}
                    }
                }
                Members::Ip {
                    v4: v4.into_iter().collect(),
                    v6: v6.into_iter().collect(),
                }
            }
            IpSetType::Net => {
                let (mut v4, mut v6) = (Vec::new(), Vec::new());
                for p in parsed {
                    match p {
                        Parsed::Net(IpNet::V4(n)) => v4.push(n),
                        Parsed::Net(IpNet::V6(n)) => v6.push(n),
                        _ => {}
                    }
                }
                Members::Net {
                    v4: v4.into_iter().collect(),
                    v6: v6.into_iter().collect(),
                }
            }
            IpSetType::IpAndPort => Members::IpAndPort(
                parsed
                    .filter_map(|p| match p {
                        Parsed::AddrPort(a, p, n) => Some((a, p, n)),
                        _ => None,
                    })
                    .collect(),
            ),
        }
    }

    /// An `IP` set of these addresses.
    pub fn addresses(addrs: impl IntoIterator<Item = IpAddr>) -> Members {
        let (mut v4, mut v6) = (BTreeSet::new(), BTreeSet::new());
        for a in addrs {
            match a {
                IpAddr::V4(a) => v4.insert(a),
                IpAddr::V6(a) => v6.insert(a),
            };
        }
        Members::Ip { v4, v6 }
    }

    /// The set's type.
    pub fn kind(&self) -> IpSetType {
        match self {
            Members::Ip { .. } => IpSetType::Ip,
            Members::Net { .. } => IpSetType::Net,
            Members::IpAndPort(_) => IpSetType::IpAndPort,
        }
    }

    /// How many members.
    pub fn len(&self) -> usize {
        match self {
            Members::Ip { v4, v6 } => v4.len() + v6.len(),
            Members::Net { v4, v6 } => v4.len() + v6.len(),
            Members::IpAndPort(m) => m.len(),
        }
    }

    /// No members.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the set has a member of one family (`v6`): its set in that family's table is
    /// empty otherwise.
    pub fn has_family(&self, v6: bool) -> bool {
        match self {
            Members::Ip { v4, v6: six } => !if v6 { six.is_empty() } else { v4.is_empty() },
            Members::Net { v4, v6: six } => !if v6 { six.is_empty() } else { v4.is_empty() },
            Members::IpAndPort(m) => m.iter().any(|(a, _, _)| a.is_ipv6() == v6),
        }
    }

    /// Adds a member given as Felix sends it.
    pub fn insert(&mut self, m: &str) {
        match (parsed(self.kind(), m), self) {
            (Some(Parsed::Addr(IpAddr::V4(a))), Members::Ip { v4, .. }) => drop(v4.insert(a)),
            (Some(Parsed::Addr(IpAddr::V6(a))), Members::Ip { v6, .. }) => drop(v6.insert(a)),
            (Some(Parsed::Net(IpNet::V4(n))), Members::Net { v4, .. }) => drop(v4.insert(n)),
            (Some(Parsed::Net(IpNet::V6(n))), Members::Net { v6, .. }) => drop(v6.insert(n)),
            (Some(Parsed::AddrPort(a, p, n)), Members::IpAndPort(s)) => drop(s.insert((a, p, n))),
            _ => {}
        }
    }

    /// Whether `m`, given as Felix sends it, is a member now.
    pub fn contains(&self, m: &str) -> bool {
        match (parse_member(self.kind(), m), self) {
            (Some(Parsed::Addr(IpAddr::V4(a))), Members::Ip { v4, .. }) => v4.contains(&a),
            (Some(Parsed::Addr(IpAddr::V6(a))), Members::Ip { v6, .. }) => v6.contains(&a),
            (Some(Parsed::Net(IpNet::V4(n))), Members::Net { v4, .. }) => v4.contains(&n),
            (Some(Parsed::Net(IpNet::V6(n))), Members::Net { v6, .. }) => v6.contains(&n),
            (Some(Parsed::AddrPort(a, p, n)), Members::IpAndPort(s)) => s.contains(&(a, p, n)),
            _ => false,
        }
    }

    /// Removes a member given as Felix sends it.
    pub fn remove(&mut self, m: &str) {
        match (parsed(self.kind(), m), self) {
            (Some(Parsed::Addr(IpAddr::V4(a))), Members::Ip { v4, .. }) => drop(v4.remove(&a)),
            (Some(Parsed::Addr(IpAddr::V6(a))), Members::Ip { v6, .. }) => drop(v6.remove(&a)),
            (Some(Parsed::Net(IpNet::V4(n))), Members::Net { v4, .. }) => drop(v4.remove(&n)),
            (Some(Parsed::Net(IpNet::V6(n))), Members::Net { v6, .. }) => drop(v6.remove(&n)),
            (Some(Parsed::AddrPort(a, p, n)), Members::IpAndPort(s)) => drop(s.remove(&(a, p, n))),
            _ => {}
        }
    }
}

impl Renderer {
    /// The elements of a `NET` set for one family, overlaps merged (never fails on overlap:
    /// a covering CIDR absorbs what it contains, §23.1).
    pub fn net_set_elements<'a>(
        &self,
        family: Family,
        members: impl IntoIterator<Item = &'a str>,
    ) -> Vec<Element> {
        let nets: Vec<IpNet> = members
            .into_iter()
            .filter_map(|m| {
                let n = parse_net(m);
                if n.is_none() {
                    warn!(member = %m, "ignoring unparsable IP set member");
                }
                n
            })
            .collect();
        build::cidr_interval_elements(&nets, family == Family::Ip6)
    }

    /// The one element member `m` (as Felix sends it) is in one family's set of an IP set of
    /// type `kind`, as [`Renderer::ipset`] renders it: what an `IpSetDeltaUpdate` adds or
    /// deletes. `None` for a member of the other family, and for every member of a `NET` set,
    /// whose members are merged into intervals (no element is one member's).
    pub fn ipset_member_element(
        &self,
        family: Family,
        kind: IpSetType,
        m: &str,
    ) -> Option<Element> {
        let v6 = family == Family::Ip6;
        match parse_member(kind, m)? {
            Parsed::Addr(a) if a.is_ipv6() == v6 => Some(build::addr_element(a)),
            Parsed::AddrPort(a, proto, port) if a.is_ipv6() == v6 => {
                Some(build::addr_proto_port_element(a, proto, port))
            }
            _ => None,
        }
    }

    /// Whether a Felix IP set is in `family`'s tables: only while it has a member of the family.
    /// An empty one could never match, so no rule of the family looks it up (see
    /// [`crate::EmptyIpSet`]), and every set in a table lengthens the kernel's walk by
    /// name that each new set and each rule's set lookup makes.
    pub fn ipset_in_family(&self, family: Family, members: &Members) -> bool {
        members.has_family(family == Family::Ip6)
    }

    /// The rendered families whose tables hold a Felix IP set (see [`Self::ipset_in_family`]).
    pub fn ipset_families(&self, members: &Members) -> Vec<Family> {
        let mut fs = self.families();
        fs.retain(|&f| self.ipset_in_family(f, members));
        fs
    }

    /// A Felix IP set (`IpSetUpdate` id and members) as the set in one family's table.
    /// Members of the other family are left out; the result does not depend on member order.
    pub fn ipset(&self, family: Family, id: &str, members: &Members) -> Set {
        let v6 = family == Family::Ip6;
        let addr_type = if v6 {
            DataType::Ipv6Addr
        } else {
            DataType::Ipv4Addr
        };
        let name = ipset_name(family, id);
        match members {
            Members::Ip { v4, v6: six } => {
                let mut set = build::new_set(&name, vec![addr_type], 0, None);
                // A set iterates in ascending order, and an address orders as its network-order
                // bytes do: the elements come out strictly sorted, as a plain set's must be,
                // without collecting, sorting and deduplicating the keys (a full load's 100,000).
                set.elements = if v6 {
                    six.iter()
                        .map(|a| build::addr_element(IpAddr::V6(*a)))
                        .collect()
                } else {
                    v4.iter()
                        .map(|a| build::addr_element(IpAddr::V4(*a)))
                        .collect()
                };
                set
            }
            Members::Net { v4, v6: six } => {
                let mut set = build::new_set(&name, vec![addr_type], set_flags::INTERVAL, None);
                let nets: Vec<IpNet> = if v6 {
                    six.iter().map(|n| IpNet::V6(*n)).collect()
                } else {
                    v4.iter().map(|n| IpNet::V4(*n)).collect()
                };
                set.elements = build::cidr_interval_elements(&nets, v6);
                set
            }
            Members::IpAndPort(m) => {
                let mut set = build::new_set(
                    &name,
                    vec![addr_type, DataType::InetProto, DataType::InetService],
                    0,
                    None,
                );
                let mut elements: Vec<Element> = m
                    .iter()
                    .filter(|(a, _, _)| a.is_ipv6() == v6)
                    .map(|&(a, proto, port)| build::addr_proto_port_element(a, proto, port))
                    .collect();
                elements.sort();
                elements.dedup();
                set.elements = elements;
                set
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dotted_quad_takes_only_what_the_standard_parser_takes() {
        let mut cases: Vec<String> = [
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "1.2.3.04",
            "1.2.3.0",
            "1..2.3",
            ".1.2.3",
            "1.2.3.",
            "1.2.3.4 ",
            "+1.2.3.4",
            "1.2.3.-4",
            "1000.1.1.1",
            "",
            "::1",
            "1.2.3.4/32",
            "١.2.3.4",
            "10.0.0.1",
            "99.099.1.1",
            "0.00.0.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Random dotted strings: 3 to 5 parts of 0 to 4 characters, mostly digits.
        let alphabet = b"01259/-x";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..100_000 {
            let parts: Vec<String> = (0..3 + next(3))
                .map(|_| {
                    (0..next(5))
                        .map(|_| {
                            let i = if next(8) == 0 { next(8) } else { next(5) };
                            char::from(alphabet[i as usize])
                        })
                        .collect()
                })
                .collect();
            cases.push(parts.join("."));
        }
        let mut accepted = 0;
        for s in &cases {
            let std = s.parse::<std::net::Ipv4Addr>().ok();
            if let Some(fast) = super::dotted_quad(s.as_bytes()) {
                accepted += 1;
                assert_eq!(Some(fast), std, "{s:?}");
            }
            assert_eq!(super::parse_addr(s), s.parse().ok(), "{s:?}");
            for net in [
                format!("{s}/24"),
                format!("{s}/8"),
                format!("{s}/032"),
                format!("{s}/33"),
            ] {
                assert_eq!(
                    super::parse_net(&net),
                    super::parse_net_split(&net),
                    "{net:?}"
                );
            }
            assert_eq!(super::parse_net(s), super::parse_net_split(s), "{s:?}");
        }
        assert!(accepted > 500, "only {accepted} addresses in the sample");
    }

    use super::*;
    use crate::{Renderer, RulesConfig};

    fn r() -> Renderer {
        Renderer::new(RulesConfig::default()).unwrap()
    }

    #[test]
    fn ip_and_port_members_parse() {
        assert_eq!(
            parse_ip_and_port("10.0.0.5,tcp:8080"),
            Some(("10.0.0.5".parse().unwrap(), 6, 8080))
        );
        assert_eq!(
            parse_ip_and_port("fd00::5,udp:53"),
            Some(("fd00::5".parse().unwrap(), 17, 53))
        );
        assert_eq!(parse_ip_and_port("10.0.0.5"), None);
    }

    #[test]
    fn members_are_kept_parsed_and_compared_as_addresses() {
        let mut ip = Members::parse(IpSetType::Ip, ["10.0.0.1", "10.0.0.2/32", "fd00::1", "x"]);
        assert_eq!(ip.kind(), IpSetType::Ip);
        // "x" and a network are not addresses: left out.
        ip.insert("10.1.0.0/16");
        assert_eq!(ip.len(), 3);
        // The same address however it is written.
        ip.insert("10.0.0.1/32");
        assert_eq!(ip.len(), 3);
        ip.remove("10.0.0.2");
        ip.remove("fd00::1/128");
        assert_eq!(
            ip,
            Members::Ip {
                v4: ["10.0.0.1".parse().unwrap()].into(),
                v6: BTreeSet::new()
            }
        );

        let mut net = Members::parse(IpSetType::Net, ["10.0.0.5/24", "10.2.0.1"]);
        assert_eq!(net.len(), 2);
        net.remove("10.0.0.0/24");
        assert_eq!(
            net,
            Members::Net {
                v4: ["10.2.0.1/32".parse().unwrap()].into(),
                v6: BTreeSet::new()
            }
        );

        let mut ipp = Members::parse(IpSetType::IpAndPort, ["10.0.0.5,tcp:80", "10.0.0.5,udp:80"]);
        ipp.remove("10.0.0.5,TCP:80");
        assert_eq!(ipp.len(), 1);
        assert_eq!(ipp.kind(), IpSetType::IpAndPort);
        assert!(!ipp.is_empty());

        // Validation accepts exactly what is recorded.
        assert!(is_member(IpSetType::Ip, "10.0.0.1/32"));
        assert!(!is_member(IpSetType::Ip, "10.0.0.0/24"));
        assert!(is_member(IpSetType::Net, "fd00::/64"));
        assert!(!is_member(IpSetType::Net, "10.0.0.0/+8"));
        assert!(!is_member(IpSetType::Net, "10.0.0.0/33"));
        assert!(!is_member(IpSetType::IpAndPort, "10.0.0.5"));
    }

    #[test]
    fn mixed_family_members_split() {
        let members = Members::parse(
            IpSetType::Ip,
            ["10.0.0.1/32", "fd00::1/128", "10.0.0.2", "fd00::2"],
        );
        let v4 = r().ipset(Family::Ip, "s:x", &members);
        let v6 = r().ipset(Family::Ip6, "s:x", &members);
        assert_eq!(v4.name, "cali40s-x");
        assert_eq!(v6.name, "cali60s-x");
        assert_eq!(v4.elements.len(), 2);
        assert_eq!(v6.elements.len(), 2);
        assert!(v4.elements.iter().all(|e| e.key.len() == 4));
        assert!(v6.elements.iter().all(|e| e.key.len() == 16));
        let ipp = Members::parse(IpSetType::IpAndPort, ["10.0.0.5,tcp:80", "fd00::5,udp:53"]);
        let s4 = r().ipset(Family::Ip, "n:x", &ipp);
        assert_eq!(s4.elements.len(), 1);
        assert_eq!(
            s4.elements[0].key[..],
            [10, 0, 0, 5, 6, 0, 0, 0, 0, 80, 0, 0]
        );
    }

    proptest::proptest! {
        /// An `IP` set's elements are built straight from its ordered members: they must be
        /// what sorting and deduplicating the addresses' keys makes.
        #[test]
        fn address_set_elements_are_sorted_and_unique(
            v4 in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..64),
            v6 in proptest::collection::vec(proptest::prelude::any::<u128>(), 0..64),
        ) {
            let addrs: Vec<IpAddr> = v4
                .iter()
                .map(|a| IpAddr::V4(Ipv4Addr::from(*a)))
                .chain(v6.iter().map(|a| IpAddr::V6(Ipv6Addr::from(*a))))
                .collect();
            let members = Members::addresses(addrs.iter().copied());
            for (family, v6) in [(Family::Ip, false), (Family::Ip6, true)] {
                let mut want: Vec<Element> = addrs
                    .iter()
                    .filter(|a| a.is_ipv6() == v6)
                    .map(|a| build::addr_element(*a))
                    .collect();
                want.sort();
                want.dedup();
                proptest::prop_assert_eq!(r().ipset(family, "s:p", &members).elements, want);
            }
        }
    }

    #[test]
    fn net_members_are_de_overlapped() {
        let members = Members::parse(
            IpSetType::Net,
            ["10.0.0.0/16", "10.0.5.0/24", "10.0.0.7/32", "10.1.0.0/16"],
        );
        let s = r().ipset(Family::Ip, "s:y", &members);
        // 10.0/16 swallows the /24 and the /32, and touches 10.1/16: one range 10.0.0.0–10.1.255.255.
        assert_eq!(s.elements.len(), 3);
        assert_eq!(s.elements[1].key[..], [10, 0, 0, 0]);
        assert_eq!(s.elements[2].key[..], [10, 2, 0, 0]);
    }
}
