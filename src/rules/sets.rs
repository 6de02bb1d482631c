//! Felix IP sets as nftables sets (reference §6.4, §13): types mapped, members split by family,
//! `NET` members de-overlapped, `IP_AND_PORT` members parsed.

use std::net::IpAddr;

use ipnet::IpNet;
use tracing::warn;

use crate::nft::build;
use crate::nft::model::{set_flags, DataType, Element, Family, Set};
use crate::proto::types::IpSetType;
use crate::rules::names::ipset_name;
use crate::rules::Renderer;

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

fn parse_net(s: &str) -> Option<IpNet> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
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

    /// A Felix IP set (`IpSetUpdate` id, type and members) as the set in one family's table.
    /// Members of the other family are dropped; the result does not depend on member order.
    pub fn ipset(&self, family: Family, id: &str, kind: IpSetType, members: &[String]) -> Set {
        let v6 = family == Family::Ip6;
        let addr_type = if v6 {
            DataType::Ipv6Addr
        } else {
            DataType::Ipv4Addr
        };
        let name = ipset_name(family, id);
        match kind {
            IpSetType::Ip => {
                let addrs = members.iter().filter_map(|m| {
                    let n = parse_net(m)?;
                    // IP sets hold addresses; a /32 or /128 is stripped to its address.
                    (n.prefix_len() == n.max_prefix_len() && n.addr().is_ipv6() == v6)
                        .then_some(n.addr())
                });
                let mut set = build::new_set(&name, vec![addr_type], 0, None);
                set.elements = build::addr_elements(addrs);
                set
            }
            IpSetType::Net => {
                let mut set = build::new_set(&name, vec![addr_type], set_flags::INTERVAL, None);
                set.elements = self.net_set_elements(family, members.iter().map(String::as_str));
                set
            }
            IpSetType::IpAndPort => {
                let mut set = build::new_set(
                    &name,
                    vec![addr_type, DataType::InetProto, DataType::InetService],
                    0,
                    None,
                );
                let mut elements: Vec<Element> = members
                    .iter()
                    .filter_map(|m| {
                        let p = parse_ip_and_port(m);
                        if p.is_none() {
                            warn!(member = %m, "ignoring unparsable IP_AND_PORT member");
                        }
                        p
                    })
                    .filter(|(a, _, _)| a.is_ipv6() == v6)
                    .map(|(a, proto, port)| build::addr_proto_port_element(a, proto, port))
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
    use super::*;
    use crate::rules::{Renderer, RulesConfig};

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
    fn mixed_family_members_split() {
        let members: Vec<String> = ["10.0.0.1/32", "fd00::1/128", "10.0.0.2", "fd00::2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let v4 = r().ipset(Family::Ip, "s:x", IpSetType::Ip, &members);
        let v6 = r().ipset(Family::Ip6, "s:x", IpSetType::Ip, &members);
        assert_eq!(v4.name, "cali40s-x");
        assert_eq!(v6.name, "cali60s-x");
        assert_eq!(v4.elements.len(), 2);
        assert_eq!(v6.elements.len(), 2);
        assert!(v4.elements.iter().all(|e| e.key.len() == 4));
        assert!(v6.elements.iter().all(|e| e.key.len() == 16));
        let ipp: Vec<String> = vec!["10.0.0.5,tcp:80".into(), "fd00::5,udp:53".into()];
        let s4 = r().ipset(Family::Ip, "n:x", IpSetType::IpAndPort, &ipp);
        assert_eq!(s4.elements.len(), 1);
        assert_eq!(
            s4.elements[0].key,
            vec![10, 0, 0, 5, 6, 0, 0, 0, 0, 80, 0, 0]
        );
    }

    #[test]
    fn net_members_are_de_overlapped() {
        let members: Vec<String> = ["10.0.0.0/16", "10.0.5.0/24", "10.0.0.7/32", "10.1.0.0/16"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let s = r().ipset(Family::Ip, "s:y", IpSetType::Net, &members);
        // 10.0/16 swallows the /24 and the /32, and touches 10.1/16: one range 10.0.0.0–10.1.255.255.
        assert_eq!(s.elements.len(), 3);
        assert_eq!(s.elements[1].key, vec![10, 0, 0, 0]);
        assert_eq!(s.elements[2].key, vec![10, 2, 0, 0]);
    }
}
