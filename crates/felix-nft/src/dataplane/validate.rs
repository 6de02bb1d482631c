//! Input validation: an update that would make the desired state wrong is rejected here, before
//! anything is recorded, so the last good state stays programmed and the stream goes on.
//!
//! Every error names the message (its kind and object id), the field and the value at fault. The
//! checks are those a kernel transaction would otherwise fail on, or that would silently program
//! something other than what was asked: malformed CIDRs and addresses, interface names the kernel
//! cannot hold, references to IP sets that do not exist, an IP set removed while still referenced,
//! and duplicate ids inside one message.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use felix_api::clip::{Clipped, ClippedQuoted};
use felix_api::to_dataplane::Payload;
use felix_api::{
    HostEndpointUpdate, IpSetDeltaUpdate, IpSetType, IpSetUpdate, Policy, PolicyId, RouteUpdate,
    Rule, TierInfo, ToDataplane, VxlanTunnelEndpointUpdate, WorkloadEndpointUpdate,
};
use felix_nft_rules::{Members, Model};

/// Linux `IFNAMSIZ` − 1.
pub const MAX_IFNAME_LEN: usize = 15;

/// A rejected update.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rejected {message} {}: field `{}` = {}: {}",
    Clipped(id),
    Clipped(field),
    ClippedQuoted(value),
    Clipped(reason)
)]
pub struct InputError {
    /// The message kind (`workload_endpoint_update`, ...).
    pub message: &'static str,
    /// The object the message is about.
    pub id: String,
    /// The field path at fault (`endpoint.ipv4_nets[1]`).
    pub field: String,
    /// The offending value.
    pub value: String,
    /// Which rule it broke.
    pub reason: String,
}

/// The name of a payload kind as it appears in the JSON form.
pub fn payload_kind(p: &Payload) -> &'static str {
    match p {
        Payload::InSync(_) => "in_sync",
        Payload::IpsetUpdate(_) => "ipset_update",
        Payload::IpsetDeltaUpdate(_) => "ipset_delta_update",
        Payload::IpsetRemove(_) => "ipset_remove",
        Payload::ActiveProfileUpdate(_) => "active_profile_update",
        Payload::ActiveProfileRemove(_) => "active_profile_remove",
        Payload::ActivePolicyUpdate(_) => "active_policy_update",
        Payload::ActivePolicyRemove(_) => "active_policy_remove",
        Payload::HostEndpointUpdate(_) => "host_endpoint_update",
        Payload::HostEndpointRemove(_) => "host_endpoint_remove",
        Payload::WorkloadEndpointUpdate(_) => "workload_endpoint_update",
        Payload::WorkloadEndpointRemove(_) => "workload_endpoint_remove",
        Payload::ConfigUpdate(_) => "config_update",
        Payload::HostMetadataUpdate(_) => "host_metadata_update",
        Payload::HostMetadataRemove(_) => "host_metadata_remove",
        Payload::IpamPoolUpdate(_) => "ipam_pool_update",
        Payload::IpamPoolRemove(_) => "ipam_pool_remove",
        Payload::ServiceAccountUpdate(_) => "service_account_update",
        Payload::ServiceAccountRemove(_) => "service_account_remove",
        Payload::NamespaceUpdate(_) => "namespace_update",
        Payload::NamespaceRemove(_) => "namespace_remove",
        Payload::RouteUpdate(_) => "route_update",
        Payload::RouteRemove(_) => "route_remove",
        Payload::VtepUpdate(_) => "vtep_update",
        Payload::VtepRemove(_) => "vtep_remove",
        Payload::WireguardEndpointUpdate(_) => "wireguard_endpoint_update",
        Payload::WireguardEndpointRemove(_) => "wireguard_endpoint_remove",
        Payload::GlobalBgpConfigUpdate(_) => "global_bgp_config_update",
        Payload::Encapsulation(_) => "encapsulation",
        Payload::ServiceUpdate(_) => "service_update",
        Payload::ServiceRemove(_) => "service_remove",
        Payload::WireguardEndpointV6Update(_) => "wireguard_endpoint_v6_update",
        Payload::WireguardEndpointV6Remove(_) => "wireguard_endpoint_v6_remove",
        Payload::HostMetadataV6Update(_) => "host_metadata_v6_update",
        Payload::HostMetadataV6Remove(_) => "host_metadata_v6_remove",
        Payload::HostMetadataV4v6Update(_) => "host_metadata_v4v6_update",
        Payload::HostMetadataV4v6Remove(_) => "host_metadata_v4v6_remove",
    }
}

/// Human-readable id of a policy (`knp/default/allow-web`-like).
pub fn policy_label(id: &PolicyId) -> String {
    let mut s = String::new();
    if !id.kind.is_empty() {
        s.push_str(&id.kind);
        s.push(':');
    }
    if !id.namespace.is_empty() {
        s.push_str(&id.namespace);
        s.push('/');
    }
    s.push_str(&id.name);
    s
}

/// A field's path, formatted only when an error names it (validation runs for every rule of
/// every message): `base` followed by `suffix` (`.src_net`).
struct Sub<'a>(&'a dyn fmt::Display, &'a str);

impl fmt::Display for Sub<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.0, self.1)
    }
}

/// `base[index]`, formatted only when an error names it.
struct Idx<'a>(&'a dyn fmt::Display, usize);

impl fmt::Display for Idx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// What a rule field needs of the IP sets it names.
#[derive(Clone, Copy)]
enum SetUse {
    /// Addresses or networks (`IP` or `NET`): the set is looked up with an address.
    Addresses,
    /// `IP_AND_PORT`: looked up with address, protocol and port.
    IpAndPort,
}

impl SetUse {
    fn takes(self, kind: IpSetType) -> bool {
        match self {
            SetUse::Addresses => kind != IpSetType::IpAndPort,
            SetUse::IpAndPort => kind == IpSetType::IpAndPort,
        }
    }
}

impl fmt::Display for SetUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SetUse::Addresses => "IP or NET",
            SetUse::IpAndPort => "IP_AND_PORT",
        })
    }
}

/// A protocol as the JSON form writes it, for an error message.
fn protocol_text(p: &felix_api::Protocol) -> String {
    use felix_api::types::protocol::NumberOrName;
    match &p.number_or_name {
        Some(NumberOrName::Number(n)) => n.to_string(),
        Some(NumberOrName::Name(s)) => s.clone(),
        None => String::new(),
    }
}

struct Ctx<'a> {
    message: &'static str,
    id: String,
    model: &'a Model,
}

impl Ctx<'_> {
    fn err(&self, field: impl Into<String>, value: impl Into<String>, reason: &str) -> InputError {
        InputError {
            message: self.message,
            id: self.id.clone(),
            field: field.into(),
            value: value.into(),
            reason: reason.to_string(),
        }
    }

    /// Refuses an IP set of `members` over `MaxIpsetSize`.
    fn size(&self, members: usize) -> Result<(), InputError> {
        let max = self.model.config.max_ipset_size;
        if members <= max {
            return Ok(());
        }
        Err(self.err(
            "members",
            format!("{members} members"),
            &format!(
                "the IP set would hold {members} members, more than MaxIpsetSize ({max}); \
                 raise MaxIpsetSize or split the set"
            ),
        ))
    }

    fn cidrs(&self, field: &dyn fmt::Display, vs: &[String]) -> Result<(), InputError> {
        for (i, v) in vs.iter().enumerate() {
            if v.parse::<IpNet>().is_err() && v.parse::<IpAddr>().is_err() {
                return Err(self.err(format!("{field}[{i}]"), v, "not an IP address or CIDR"));
            }
        }
        Ok(())
    }

    fn addr(&self, field: &str, v: &str) -> Result<(), InputError> {
        if v.is_empty() {
            return Ok(());
        }
        let host = v.split('/').next().unwrap_or(v);
        if host.parse::<IpAddr>().is_ok() && (v == host || v.parse::<IpNet>().is_ok()) {
            Ok(())
        } else {
            Err(self.err(field, v, "not an IP address"))
        }
    }

    /// An optional address of one family (a bare IP; a `/32` or `/128` is tolerated, as Felix
    /// does).
    /// A route to another node must not take a local workload's own address: it would hide
    /// (or fight over) the workload's route on its `cali` interface. A block that merely
    /// contains a local workload's address is normal (an address borrowed from another node's
    /// block): the workload's host route is more specific and wins. Only host routes can hide
    /// one, so only they are looked up.
    fn no_local_workload_hidden(&self, u: &felix_api::RouteUpdate) -> Result<(), InputError> {
        use felix_api::RouteType as T;
        let remote = T::RemoteWorkload as i32 | T::RemoteHost as i32 | T::RemoteTunnel as i32;
        let local = T::LocalWorkload as i32 | T::LocalHost as i32 | T::LocalTunnel as i32;
        if u.types & remote == 0 || u.types & local != 0 {
            return Ok(());
        }
        let Ok(dst) = u.dst.parse::<IpNet>() else {
            return Ok(());
        };
        if dst.prefix_len() != dst.max_prefix_len() {
            return Ok(());
        }
        for (id, w) in &self.model.workloads {
            let hit = w
                .ipv4_nets
                .iter()
                .chain(&w.ipv6_nets)
                .filter_map(|n| n.parse::<IpNet>().ok())
                .find(|n| n.contains(&dst.addr()));
            if let Some(n) = hit {
                return Err(self.err(
                    "dst",
                    u.dst.as_str(),
                    &format!(
                        "a route to node {:?} would hide the route of local workload {}/{}/{} ({n})",
                        u.dst_node_name, id.orchestrator_id, id.workload_id, id.endpoint_id
                    ),
                ));
            }
        }
        Ok(())
    }

    fn family_addr(&self, field: &str, v: &str, v6: bool) -> Result<(), InputError> {
        if v.is_empty() {
            return Ok(());
        }
        let (host, len) = match v.split_once('/') {
            Some((h, l)) => (h, Some(l)),
            None => (v, None),
        };
        let full = if v6 { "128" } else { "32" };
        match host.parse::<IpAddr>() {
            Ok(ip) if ip.is_ipv6() == v6 && len.is_none_or(|l| l == full) => Ok(()),
            _ => Err(self.err(
                field,
                v,
                if v6 {
                    "not an IPv6 address"
                } else {
                    "not an IPv4 address"
                },
            )),
        }
    }

    fn ifname(&self, field: &str, v: &str, allow_star: bool) -> Result<(), InputError> {
        if allow_star && (v == "*" || v.is_empty()) {
            return Ok(());
        }
        if v.is_empty() {
            return Err(self.err(field, v, "an interface name is required"));
        }
        if v.len() > MAX_IFNAME_LEN {
            return Err(self.err(
                field,
                v,
                "interface name longer than 15 bytes (the kernel's IFNAMSIZ)",
            ));
        }
        if v == "."
            || v == ".."
            || v.bytes()
                .any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace() || b == b':')
        {
            return Err(self.err(field, v, "not a valid interface name"));
        }
        Ok(())
    }

    fn sets_exist(
        &self,
        field: &dyn fmt::Display,
        ids: &[String],
        want: SetUse,
    ) -> Result<(), InputError> {
        for (i, id) in ids.iter().enumerate() {
            match self.model.ipsets.get(id) {
                None => {
                    return Err(self.err(
                        format!("{field}[{i}]"),
                        id,
                        "references an IP set that has not been sent (IPSetUpdate must come first)",
                    ))
                }
                Some(members) => {
                    let kind = members.kind();
                    if !want.takes(kind) {
                        return Err(self.err(
                            format!("{field}[{i}]"),
                            id,
                            &format!("references an IP set of type {kind:?}, needs {want}"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn no_duplicates<T: Ord + std::fmt::Debug>(
        &self,
        field: &str,
        items: impl IntoIterator<Item = T>,
    ) -> Result<(), InputError> {
        let mut seen = BTreeSet::new();
        for item in items {
            if seen.contains(&item) {
                return Err(self.err(field, format!("{item:?}"), "duplicate id"));
            }
            seen.insert(item);
        }
        Ok(())
    }

    fn ports(
        &self,
        field: &dyn fmt::Display,
        ports: &[felix_api::PortRange],
    ) -> Result<(), InputError> {
        for (i, p) in ports.iter().enumerate() {
            if !(0..=65535).contains(&p.first) || !(0..=65535).contains(&p.last) || p.first > p.last
            {
                return Err(self.err(
                    format!("{field}[{i}]"),
                    format!("{}-{}", p.first, p.last),
                    "port range must satisfy 0 <= first <= last <= 65535",
                ));
            }
        }
        Ok(())
    }

    fn rule(&self, field: &dyn fmt::Display, r: &Rule) -> Result<(), InputError> {
        match r.action.to_ascii_lowercase().as_str() {
            "" | "allow" | "deny" | "pass" | "next-tier" | "log" => {}
            other => {
                return Err(self.err(
                    format!("{field}.action"),
                    other,
                    "action must be allow, deny, pass, next-tier or log",
                ))
            }
        }
        if !matches!(r.ip_version, 0 | 4 | 6) {
            return Err(self.err(
                format!("{field}.ip_version"),
                r.ip_version.to_string(),
                "IP version must be 4, 6 or unset",
            ));
        }
        // A rule the renderer could not express exactly would have to be left out, and a
        // deny or log left out lets through what the policy stops: refused here instead.
        let mut icmp_proto = true;
        for (name, p) in [("protocol", &r.protocol), ("not_protocol", &r.not_protocol)] {
            let Some(p) = p else { continue };
            match felix_nft_rules::policy::protocol_number(p, nf_tables::model::Family::Ip) {
                Some(n) => {
                    if name == "protocol" {
                        icmp_proto = matches!(n, 1 | 58);
                    }
                }
                None => {
                    return Err(self.err(
                        format!("{field}.{name}"),
                        protocol_text(p),
                        "protocol must be a number from 0 to 255 or one of tcp, udp, sctp, \
                         udplite, icmp, icmpv6",
                    ))
                }
            }
        }
        use felix_api::types::rule::{Icmp, NotIcmp};
        let icmp = r.icmp.as_ref().map(|i| match i {
            Icmp::IcmpType(t) => ("icmp", *t, None),
            Icmp::IcmpTypeCode(tc) => ("icmp", tc.r#type, Some(tc.code)),
        });
        let not_icmp = r.not_icmp.as_ref().map(|i| match i {
            NotIcmp::NotIcmpType(t) => ("not_icmp", *t, None),
            NotIcmp::NotIcmpTypeCode(tc) => ("not_icmp", tc.r#type, Some(tc.code)),
        });
        for (name, t, c) in icmp.into_iter().chain(not_icmp) {
            if !(0..=255).contains(&t) {
                return Err(self.err(
                    format!("{field}.{name}.type"),
                    t.to_string(),
                    "ICMP type must be from 0 to 255",
                ));
            }
            if let Some(c) = c.filter(|c| !(0..=255).contains(c)) {
                return Err(self.err(
                    format!("{field}.{name}.code"),
                    c.to_string(),
                    "ICMP code must be from 0 to 255",
                ));
            }
            if !icmp_proto {
                return Err(self.err(
                    format!("{field}.{name}"),
                    t.to_string(),
                    "an ICMP type needs protocol icmp or icmpv6 (or none)",
                ));
            }
        }
        self.cidrs(&Sub(field, ".src_net"), &r.src_net)?;
        self.cidrs(&Sub(field, ".dst_net"), &r.dst_net)?;
        self.cidrs(&Sub(field, ".not_src_net"), &r.not_src_net)?;
        self.cidrs(&Sub(field, ".not_dst_net"), &r.not_dst_net)?;
        self.ports(&Sub(field, ".src_ports"), &r.src_ports)?;
        self.ports(&Sub(field, ".dst_ports"), &r.dst_ports)?;
        self.ports(&Sub(field, ".not_src_ports"), &r.not_src_ports)?;
        self.ports(&Sub(field, ".not_dst_ports"), &r.not_dst_ports)?;
        let addrs = SetUse::Addresses;
        self.sets_exist(&Sub(field, ".src_ip_set_ids"), &r.src_ip_set_ids, addrs)?;
        self.sets_exist(&Sub(field, ".dst_ip_set_ids"), &r.dst_ip_set_ids, addrs)?;
        self.sets_exist(
            &Sub(field, ".not_src_ip_set_ids"),
            &r.not_src_ip_set_ids,
            addrs,
        )?;
        self.sets_exist(
            &Sub(field, ".not_dst_ip_set_ids"),
            &r.not_dst_ip_set_ids,
            addrs,
        )?;
        let ipp = SetUse::IpAndPort;
        self.sets_exist(
            &Sub(field, ".src_named_port_ip_set_ids"),
            &r.src_named_port_ip_set_ids,
            ipp,
        )?;
        self.sets_exist(
            &Sub(field, ".dst_named_port_ip_set_ids"),
            &r.dst_named_port_ip_set_ids,
            ipp,
        )?;
        self.sets_exist(
            &Sub(field, ".not_src_named_port_ip_set_ids"),
            &r.not_src_named_port_ip_set_ids,
            ipp,
        )?;
        self.sets_exist(
            &Sub(field, ".not_dst_named_port_ip_set_ids"),
            &r.not_dst_named_port_ip_set_ids,
            ipp,
        )?;
        self.sets_exist(
            &Sub(field, ".dst_ip_port_set_ids"),
            &r.dst_ip_port_set_ids,
            ipp,
        )?;
        Ok(())
    }

    fn rules(&self, field: &str, rules: &[Rule]) -> Result<(), InputError> {
        for (i, r) in rules.iter().enumerate() {
            self.rule(&Idx(&field, i), r)?;
        }
        Ok(())
    }

    fn tiers(&self, field: &str, tiers: &[TierInfo]) -> Result<(), InputError> {
        self.no_duplicates(field, tiers.iter().map(|t| t.name.as_str()))?;
        for (i, t) in tiers.iter().enumerate() {
            match t.default_action.to_ascii_lowercase().as_str() {
                "" | "deny" | "pass" => {}
                other => {
                    return Err(self.err(
                        format!("{field}[{i}].default_action"),
                        other,
                        "tier default action must be Deny or Pass",
                    ))
                }
            }
            self.no_duplicates(
                &format!("{field}[{i}].ingress_policies"),
                t.ingress_policies.iter().map(policy_label),
            )?;
            self.no_duplicates(
                &format!("{field}[{i}].egress_policies"),
                t.egress_policies.iter().map(policy_label),
            )?;
        }
        Ok(())
    }
}

/// Checks one update against the current desired model. `Ok` means it may be recorded, and
/// carries what was parsed on the way: an `ipset_update`'s members, for the model to keep
/// ([`Model::apply_parsed`]) rather than parse again. Of the model it reads the IP sets, the
/// policies and the profiles only: [`validate_all`]'s shadow model records nothing else.
pub fn validate(model: &Model, msg: &ToDataplane) -> Result<Option<Members>, InputError> {
    let Some(p) = &msg.payload else {
        return Ok(None);
    };
    let message = payload_kind(p);
    let mut c = Ctx {
        message,
        id: String::new(),
        model,
    };
    match p {
        Payload::IpsetUpdate(u) => return ipset_update(&mut c, u),
        Payload::IpsetDeltaUpdate(d) => ipset_delta_update(&mut c, d)?,
        Payload::IpsetRemove(r) => {
            c.id = r.id.clone();
            if let Some(user) = ipset_users(model, &r.id).into_iter().next() {
                return Err(c.err(
                    "id",
                    &r.id,
                    &format!("IP set is still referenced by {user}; remove that first"),
                ));
            }
        }
        Payload::ActivePolicyUpdate(u) => {
            let Some(id) = &u.id else {
                return Err(c.err("id", "", "a policy id is required"));
            };
            c.id = policy_label(id);
            if id.name.is_empty() {
                return Err(c.err("id.name", "", "a policy name is required"));
            }
            // Read in place: a copy of every policy of a full load was 1 % of a fresh `apply`.
            if let Some(policy) = &u.policy {
                c.rules("policy.inbound_rules", &policy.inbound_rules)?;
                c.rules("policy.outbound_rules", &policy.outbound_rules)?;
            }
        }
        Payload::ActiveProfileUpdate(u) => {
            let Some(id) = &u.id else {
                return Err(c.err("id", "", "a profile id is required"));
            };
            c.id = id.name.clone();
            if id.name.is_empty() {
                return Err(c.err("id.name", "", "a profile name is required"));
            }
            if let Some(profile) = &u.profile {
                c.rules("profile.inbound_rules", &profile.inbound_rules)?;
                c.rules("profile.outbound_rules", &profile.outbound_rules)?;
            }
        }
        Payload::WorkloadEndpointUpdate(u) => workload_endpoint_update(&mut c, u)?,
        Payload::HostEndpointUpdate(u) => host_endpoint_update(&mut c, u)?,
        Payload::HostMetadataUpdate(u) | Payload::HostMetadataV4v6Update(u) => {
            c.id = u.hostname.clone();
            c.addr("ipv4_addr", &u.ipv4_addr)?;
            c.addr("ipv6_addr", &u.ipv6_addr)?;
        }
        Payload::HostMetadataV6Update(u) => {
            c.id = u.hostname.clone();
            c.family_addr("ipv6_addr", &u.ipv6_addr, true)?;
        }
        Payload::VtepUpdate(u) => vtep_update(&mut c, u)?,
        Payload::VtepRemove(r) => {
            c.id = r.node.clone();
            if r.node.is_empty() {
                return Err(c.err("node", "", "a node name is required"));
            }
        }
        Payload::RouteUpdate(u) => route_update(&mut c, u)?,
        Payload::RouteRemove(r) => {
            c.id = r.dst.clone();
            if r.dst.parse::<IpNet>().is_err() {
                return Err(c.err("dst", r.dst.as_str(), "not a CIDR"));
            }
        }
        Payload::IpamPoolUpdate(u) => {
            c.id = u.id.clone();
            let cidr = u.pool.as_ref().map_or("", |p| p.cidr.as_str());
            if cidr.parse::<IpNet>().is_err() {
                return Err(c.err("pool.cidr", cidr, "not a CIDR"));
            }
        }
        Payload::WireguardEndpointUpdate(u) => {
            wireguard_endpoint(&mut c, &u.hostname, "public_key", &u.public_key)?;
            c.family_addr("interface_ipv4_addr", &u.interface_ipv4_addr, false)?;
        }
        Payload::WireguardEndpointV6Update(u) => {
            wireguard_endpoint(&mut c, &u.hostname, "public_key_v6", &u.public_key_v6)?;
            c.family_addr("interface_ipv6_addr", &u.interface_ipv6_addr, true)?;
        }
        Payload::WireguardEndpointRemove(felix_api::WireguardEndpointRemove { hostname })
        | Payload::WireguardEndpointV6Remove(felix_api::WireguardEndpointV6Remove { hostname }) => {
            c.id = hostname.clone();
            if hostname.is_empty() {
                return Err(c.err("hostname", "", "a node name is required"));
            }
        }
        Payload::GlobalBgpConfigUpdate(u) => {
            c.id = "global".into();
            c.cidrs(&"service_cluster_cidrs", &u.service_cluster_cidrs)?;
            c.cidrs(&"service_external_cidrs", &u.service_external_cidrs)?;
            c.cidrs(&"service_loadbalancer_cidrs", &u.service_loadbalancer_cidrs)?;
        }
        _ => {}
    }
    Ok(None)
}

/// A node's WireGuard key: a node name, and a key that is empty (none) or 32 bytes of
/// standard base64.
fn wireguard_endpoint(
    c: &mut Ctx<'_>,
    hostname: &str,
    field: &str,
    key: &str,
) -> Result<(), InputError> {
    c.id = hostname.to_string();
    if hostname.is_empty() {
        return Err(c.err("hostname", "", "a node name is required"));
    }
    super::wireguard::parse_key(key)
        .map(|_| ())
        .map_err(|why| c.err(field, key, why))
}

/// An IP set's whole membership: a known type, members of that type, the size bound; a set still
/// referenced keeps its type.
fn ipset_update(c: &mut Ctx<'_>, u: &IpSetUpdate) -> Result<Option<Members>, InputError> {
    c.id = u.id.clone();
    if u.id.is_empty() {
        return Err(c.err("id", "", "an IP set id is required"));
    }
    let kind = IpSetType::try_from(u.r#type)
        .map_err(|_| c.err("type", u.r#type.to_string(), "unknown IP set type"))?;
    if let Some(before) = c.model.ipsets.get(&u.id).map(Members::kind) {
        if before != kind {
            if let Some(user) = ipset_users(c.model, &u.id).into_iter().next() {
                return Err(c.err(
                    "type",
                    format!("{kind:?}"),
                    &format!(
                        "the IP set is of type {before:?} and still referenced by {user}; \
                         a set changes type only when nothing uses it"
                    ),
                ));
            }
        }
    }
    let parsed = Members::try_parse(kind, &u.members)
        .map_err(|i| not_member(c, "members", i, kind, &u.members[i]))?;
    c.size(parsed.len())?;
    Ok(Some(parsed))
}

/// Members added to and removed from a set already sent; the size bound on the result.
fn ipset_delta_update(c: &mut Ctx<'_>, d: &IpSetDeltaUpdate) -> Result<(), InputError> {
    c.id = d.id.clone();
    let Some(kind) = c.model.ipsets.get(&d.id).map(Members::kind) else {
        return Err(c.err(
            "id",
            &d.id,
            "delta for an IP set that has not been sent (IPSetUpdate must come first)",
        ));
    };
    members(c, "added_members", kind, &d.added_members)?;
    members(c, "removed_members", kind, &d.removed_members)?;
    if let Some(current) = c.model.ipsets.get(&d.id) {
        // Counted exactly only when a bound says it might be over.
        if current.len() + d.added_members.len() > c.model.config.max_ipset_size {
            let mut after = current.clone();
            for m in &d.removed_members {
                after.remove(m);
            }
            for m in &d.added_members {
                after.insert(m);
            }
            c.size(after.len())?;
        }
    }
    Ok(())
}

/// A workload endpoint: its interface name, MAC, addresses of the right family, NAT addresses,
/// profiles and tiers.
fn workload_endpoint_update(c: &mut Ctx<'_>, u: &WorkloadEndpointUpdate) -> Result<(), InputError> {
    let Some(id) = &u.id else {
        return Err(c.err("id", "", "a workload endpoint id is required"));
    };
    c.id = format!(
        "{}/{}/{}",
        id.orchestrator_id, id.workload_id, id.endpoint_id
    );
    let Some(e) = &u.endpoint else {
        return Err(c.err("endpoint", "", "the endpoint is required"));
    };
    c.ifname("endpoint.name", &e.name, false)?;
    if !e.mac.is_empty() && parse_mac(&e.mac).is_none() {
        return Err(c.err("endpoint.mac", &e.mac, "not a MAC address"));
    }
    c.cidrs(&"endpoint.ipv4_nets", &e.ipv4_nets)?;
    c.cidrs(&"endpoint.ipv6_nets", &e.ipv6_nets)?;
    for (i, n) in e.ipv4_nets.iter().enumerate() {
        if n.parse::<IpNet>()
            .map(|n| !matches!(n, IpNet::V4(_)))
            .unwrap_or(false)
        {
            return Err(c.err(format!("endpoint.ipv4_nets[{i}]"), n, "not an IPv4 CIDR"));
        }
    }
    for (i, n) in e.ipv6_nets.iter().enumerate() {
        if n.parse::<IpNet>()
            .map(|n| !matches!(n, IpNet::V6(_)))
            .unwrap_or(false)
        {
            return Err(c.err(format!("endpoint.ipv6_nets[{i}]"), n, "not an IPv6 CIDR"));
        }
    }
    c.cidrs(
        &"endpoint.allow_spoofed_source_prefixes",
        &e.allow_spoofed_source_prefixes,
    )?;
    for (i, nat) in e.ipv4_nat.iter().chain(&e.ipv6_nat).enumerate() {
        c.addr(&format!("endpoint.ip_nat[{i}].ext_ip"), &nat.ext_ip)?;
        c.addr(&format!("endpoint.ip_nat[{i}].int_ip"), &nat.int_ip)?;
    }
    c.no_duplicates("endpoint.profile_ids", e.profile_ids.iter())?;
    c.tiers("endpoint.tiers", &e.tiers)?;
    Ok(())
}

/// A host endpoint: its interface name (or `*`), expected addresses, profiles and tiers.
fn host_endpoint_update(c: &mut Ctx<'_>, u: &HostEndpointUpdate) -> Result<(), InputError> {
    let Some(id) = &u.id else {
        return Err(c.err("id", "", "a host endpoint id is required"));
    };
    c.id = id.endpoint_id.clone();
    let Some(e) = &u.endpoint else {
        return Err(c.err("endpoint", "", "the endpoint is required"));
    };
    c.ifname("endpoint.name", &e.name, true)?;
    c.cidrs(&"endpoint.expected_ipv4_addrs", &e.expected_ipv4_addrs)?;
    c.cidrs(&"endpoint.expected_ipv6_addrs", &e.expected_ipv6_addrs)?;
    c.no_duplicates("endpoint.profile_ids", e.profile_ids.iter())?;
    c.tiers("endpoint.tiers", &e.tiers)?;
    c.tiers("endpoint.untracked_tiers", &e.untracked_tiers)?;
    c.tiers("endpoint.pre_dnat_tiers", &e.pre_dnat_tiers)?;
    c.tiers("endpoint.forward_tiers", &e.forward_tiers)?;
    Ok(())
}

/// A VTEP: its node, addresses of the right family, and a unicast MAC for each family it has an
/// address in.
fn vtep_update(c: &mut Ctx<'_>, u: &VxlanTunnelEndpointUpdate) -> Result<(), InputError> {
    c.id = u.node.clone();
    if u.node.is_empty() {
        return Err(c.err("node", "", "a node name is required"));
    }
    c.family_addr("ipv4_addr", &u.ipv4_addr, false)?;
    c.family_addr("parent_device_ip", &u.parent_device_ip, false)?;
    c.family_addr("ipv6_addr", &u.ipv6_addr, true)?;
    c.family_addr("parent_device_ipv6", &u.parent_device_ipv6, true)?;
    for (field, mac, addr, parent) in [
        ("mac", &u.mac, &u.ipv4_addr, &u.parent_device_ip),
        ("mac_v6", &u.mac_v6, &u.ipv6_addr, &u.parent_device_ipv6),
    ] {
        if mac.is_empty() && addr.is_empty() {
            continue;
        }
        if !addr.is_empty() && parent.is_empty() {
            let pf = if field == "mac" {
                "parent_device_ip"
            } else {
                "parent_device_ipv6"
            };
            return Err(c.err(
                pf,
                "",
                "a VTEP with a tunnel address needs its node's address",
            ));
        }
        match parse_mac(mac) {
            Some(m) if m[0] & 1 == 0 && m != [0; 6] => {}
            Some(_) => {
                return Err(c.err(field, mac.as_str(), "not a unicast MAC address"));
            }
            None => {
                return Err(c.err(field, mac.as_str(), "not a MAC address (aa:bb:cc:dd:ee:ff)"));
            }
        }
    }
    Ok(())
}

/// A route: its CIDR, known type bits and pool type, the node's address.
fn route_update(c: &mut Ctx<'_>, u: &RouteUpdate) -> Result<(), InputError> {
    c.id = u.dst.clone();
    if u.dst.parse::<IpNet>().is_err() {
        return Err(c.err("dst", u.dst.as_str(), "not a CIDR"));
    }
    const KNOWN_TYPES: i32 = 1 | 2 | 4 | 8 | 16 | 32;
    if u.types & !KNOWN_TYPES != 0 {
        return Err(c.err(
            "types",
            u.types.to_string(),
            "unknown route type bits (known: REMOTE_WORKLOAD 1, REMOTE_HOST 2, LOCAL_WORKLOAD 4, LOCAL_HOST 8, REMOTE_TUNNEL 16, LOCAL_TUNNEL 32)",
        ));
    }
    if felix_api::IpPoolType::try_from(u.ip_pool_type).is_err() {
        return Err(c.err(
            "ip_pool_type",
            u.ip_pool_type.to_string(),
            "unknown IP pool type (known: NONE 0, NO_ENCAP 1, VXLAN 2, IPIP 3)",
        ));
    }
    c.addr("dst_node_ip", &u.dst_node_ip)?;
    c.no_local_workload_hidden(u)?;
    Ok(())
}

fn members(
    c: &Ctx<'_>,
    field: &str,
    kind: IpSetType,
    members: &[String],
) -> Result<(), InputError> {
    for (i, m) in members.iter().enumerate() {
        if !felix_nft_rules::sets::is_member(kind, m) {
            return Err(not_member(c, field, i, kind, m));
        }
    }
    Ok(())
}

fn not_member(c: &Ctx<'_>, field: &str, i: usize, kind: IpSetType, m: &str) -> InputError {
    let want = match kind {
        IpSetType::Ip => "an IP address",
        IpSetType::Net => "a CIDR",
        IpSetType::IpAndPort => "`addr,proto:port` with proto tcp, udp or sctp",
    };
    c.err(format!("{field}[{i}]"), m, &format!("member is not {want}"))
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in out.iter_mut() {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// Which policies or profiles reference the IP set `id` (for the remove check).
pub fn ipset_users(model: &Model, id: &str) -> Vec<String> {
    let mut out = Vec::new();
    let uses = |r: &Rule| {
        [
            &r.src_ip_set_ids,
            &r.dst_ip_set_ids,
            &r.not_src_ip_set_ids,
            &r.not_dst_ip_set_ids,
            &r.src_named_port_ip_set_ids,
            &r.dst_named_port_ip_set_ids,
            &r.not_src_named_port_ip_set_ids,
            &r.not_dst_named_port_ip_set_ids,
            &r.dst_ip_port_set_ids,
        ]
        .iter()
        .any(|ids| ids.iter().any(|x| x == id))
    };
    let policy_uses = |p: &Policy| p.inbound_rules.iter().chain(&p.outbound_rules).any(uses);
    for (pid, p) in &model.policies {
        if policy_uses(p) {
            out.push(format!("policy {}", policy_label(pid)));
        }
    }
    for (name, p) in &model.profiles {
        if p.inbound_rules.iter().chain(&p.outbound_rules).any(uses) {
            out.push(format!("profile {name}"));
        }
    }
    out
}

/// A message of a state document that passed validation in its place in the sequence. An
/// `ipset_update` carries its members parsed (its member strings are dropped then: they are
/// not needed again, and a full load's are megabytes).
#[derive(Debug)]
pub struct Valid {
    pub(crate) msg: ToDataplane,
    pub(crate) members: Option<Members>,
}

/// Checks a whole state document: every message against the model as it would be after the
/// ones before it. Returns every error (with the message index), not just the first.
pub fn validate_all(
    base: &Model,
    msgs: Vec<ToDataplane>,
) -> Result<Vec<Valid>, Vec<(usize, InputError)>> {
    let mut model = base.clone();
    let mut errors = Vec::new();
    let mut valid = Vec::with_capacity(msgs.len());
    let mut seen: BTreeMap<(&'static str, String), usize> = BTreeMap::new();
    for (i, mut m) in msgs.into_iter().enumerate() {
        felix_nft_rules::canonicalise_policy_ids(&mut m);
        let members = match validate(&model, &m) {
            Ok(members) => members,
            Err(e) => {
                errors.push((i, e));
                continue;
            }
        };
        if let Some(p) = &m.payload {
            let kind = payload_kind(p);
            if let Some(id) = object_id(p) {
                if let Some(prev) = seen.insert((kind, id.clone()), i) {
                    errors.push((
                        i,
                        InputError {
                            message: kind,
                            id: id.clone(),
                            field: "id".into(),
                            value: id,
                            reason: format!(
                                "duplicate id: message {prev} of this document already sets it"
                            ),
                        },
                    ));
                    continue;
                }
            }
        }
        match &mut m.payload {
            // What follows is validated against the set's existence and type only: its
            // members (parsed above, for the dataplane's model) are not needed in this one.
            Some(Payload::IpsetUpdate(u)) => {
                let kind = IpSetType::try_from(u.r#type).unwrap_or(IpSetType::Ip);
                model.ipsets.insert(u.id.clone(), Members::new(kind));
                u.members = Vec::new();
            }
            // The rest of the shadow is what `validate` reads: IP set kinds, and the policies
            // and profiles that may still use a set being removed. Endpoints, routes and the
            // rest are not copied into it (a full load's 1,000 endpoints at mid).
            Some(
                Payload::IpsetRemove(_)
                | Payload::ActivePolicyUpdate(_)
                | Payload::ActivePolicyRemove(_)
                | Payload::ActiveProfileUpdate(_)
                | Payload::ActiveProfileRemove(_),
            ) => {
                model.apply(&m);
            }
            _ => {}
        }
        valid.push(Valid { msg: m, members });
    }
    if errors.is_empty() {
        Ok(valid)
    } else {
        Err(errors)
    }
}

/// The id of an update message, for duplicate detection in state documents.
fn object_id(p: &Payload) -> Option<String> {
    Some(match p {
        Payload::IpsetUpdate(u) => u.id.clone(),
        Payload::ActivePolicyUpdate(u) => policy_label(u.id.as_ref()?),
        Payload::ActiveProfileUpdate(u) => u.id.as_ref()?.name.clone(),
        Payload::WorkloadEndpointUpdate(u) => {
            let id = u.id.as_ref()?;
            format!(
                "{}/{}/{}",
                id.orchestrator_id, id.workload_id, id.endpoint_id
            )
        }
        Payload::HostEndpointUpdate(u) => u.id.as_ref()?.endpoint_id.clone(),
        Payload::IpamPoolUpdate(u) => u.id.clone(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(lines: &[&str]) -> Vec<ToDataplane> {
        lines
            .iter()
            .map(|l| felix_api::json::decode(l).expect("a test message decodes"))
            .collect()
    }

    fn errors(lines: &[&str]) -> Vec<(usize, String, String)> {
        match validate_all(&Model::default(), doc(lines)) {
            Ok(_) => Vec::new(),
            Err(es) => es.into_iter().map(|(i, e)| (i, e.field, e.value)).collect(),
        }
    }

    const SET: &str = r#"{"ipset_update":{"id":"s:a","members":["10.0.0.1"]}}"#;
    const DELTA: &str = r#"{"ipset_delta_update":{"id":"s:a","added_members":["10.0.0.2"]}}"#;
    const SET_GONE: &str = r#"{"ipset_remove":{"id":"s:a"}}"#;
    const POLICY: &str = r#"{"active_policy_update":{"id":{"name":"p"},"policy":{"inbound_rules":[{"action":"allow","src_ip_set_ids":["s:a"]}]}}}"#;
    const POLICY_GONE: &str = r#"{"active_policy_remove":{"id":{"name":"p"}}}"#;
    const PROFILE: &str = r#"{"active_profile_update":{"id":{"name":"pr"},"profile":{"outbound_rules":[{"action":"allow","dst_ip_set_ids":["s:a"]}]}}}"#;
    const PROFILE_GONE: &str = r#"{"active_profile_remove":{"id":{"name":"pr"}}}"#;
    const WEP: &str = r#"{"workload_endpoint_update":{"id":{"orchestrator_id":"k8s","workload_id":"w","endpoint_id":"eth0"},"endpoint":{"state":"active","name":"cali1","ipv4_nets":["10.0.0.9/32"],"profile_ids":["pr"]}}}"#;

    #[test]
    fn an_ip_set_over_max_ipset_size_is_refused_naming_the_set() {
        let mut model = Model::default();
        model.config.max_ipset_size = 3;
        let m = |l: &str| doc(&[l]).remove(0);
        let four = m(
            r#"{"ipset_update":{"id":"s:big","members":["10.0.0.1","10.0.0.2","10.0.0.3","10.0.0.4"]}}"#,
        );
        let e = validate(&model, &four).unwrap_err();
        assert_eq!((e.id.as_str(), e.field.as_str()), ("s:big", "members"));
        assert!(e.reason.contains("more than MaxIpsetSize (3)"), "{e}");
        let three =
            m(r#"{"ipset_update":{"id":"s:big","members":["10.0.0.1","10.0.0.2","10.0.0.3"]}}"#);
        assert!(validate(&model, &three).is_ok());
        model.apply(&three);
        // A delta is judged by the size it leaves: one more is too many, one swapped is not.
        let grow = m(r#"{"ipset_delta_update":{"id":"s:big","added_members":["10.0.0.9"]}}"#);
        let e = validate(&model, &grow).unwrap_err();
        assert!(e.to_string().contains("would hold 4 members"), "{e}");
        let swap = m(
            r#"{"ipset_delta_update":{"id":"s:big","added_members":["10.0.0.9","10.0.0.1"],"removed_members":["10.0.0.2"]}}"#,
        );
        assert!(validate(&model, &swap).is_ok());
    }

    /// Each message is checked against the document before it, through the shadow model that
    /// records only IP set kinds, policies and profiles.
    #[test]
    fn a_document_is_validated_in_order_against_what_comes_before() {
        assert_eq!(errors(&[SET, DELTA, POLICY, PROFILE, WEP]), Vec::new());
        // A set's delta and a rule's reference need the set earlier in the document.
        assert_eq!(
            errors(&[DELTA, POLICY, SET]),
            vec![
                (0, "id".to_string(), "s:a".to_string()),
                (
                    1,
                    "policy.inbound_rules[0].src_ip_set_ids[0]".to_string(),
                    "s:a".to_string()
                ),
            ]
        );
        // A removed set is gone for what follows.
        assert_eq!(
            errors(&[SET, SET_GONE, POLICY]),
            vec![(
                2,
                "policy.inbound_rules[0].src_ip_set_ids[0]".to_string(),
                "s:a".to_string()
            )]
        );
        // A set still used by a policy or profile of the document cannot be removed ...
        assert_eq!(
            errors(&[SET, POLICY, WEP, SET_GONE]),
            vec![(3, "id".to_string(), "s:a".to_string())]
        );
        assert_eq!(
            errors(&[SET, PROFILE, SET_GONE]),
            vec![(2, "id".to_string(), "s:a".to_string())]
        );
        // ... until they are removed first.
        assert_eq!(
            errors(&[SET, POLICY, PROFILE, POLICY_GONE, PROFILE_GONE, SET_GONE]),
            Vec::new()
        );
    }

    /// The errors of a stream of updates, each checked against the model the ones before it
    /// left (as the daemon does).
    fn stream(lines: &[&str]) -> Vec<(usize, String, String)> {
        let mut model = Model::default();
        let mut out = Vec::new();
        for (i, m) in doc(lines).into_iter().enumerate() {
            match validate(&model, &m) {
                Ok(members) => {
                    model.apply_parsed(&m, members);
                }
                Err(e) => out.push((i, e.field, e.value)),
            }
        }
        out
    }

    fn policy_with(rule: &str) -> String {
        format!(
            r#"{{"active_policy_update":{{"id":{{"name":"p"}},"policy":{{"inbound_rules":[{rule}]}}}}}}"#
        )
    }

    /// Values the renderer could not express exactly are refused, naming the field and the
    /// value: a rule left out would let through what a deny or log in it stops.
    #[test]
    fn rules_the_renderer_cannot_express_exactly_are_refused() {
        let field = "policy.inbound_rules[0]";
        let cases: &[(&str, &str, &str)] = &[
            (
                r#"{"action":"deny","protocol":{"number":300}}"#,
                "protocol",
                "300",
            ),
            (
                r#"{"action":"deny","protocol":{"number":-1}}"#,
                "protocol",
                "-1",
            ),
            (
                r#"{"action":"deny","protocol":{"name":"tcpx"}}"#,
                "protocol",
                "tcpx",
            ),
            (
                r#"{"action":"deny","protocol":{"name":"256"}}"#,
                "protocol",
                "256",
            ),
            (
                r#"{"action":"log","not_protocol":{"name":"bogus"}}"#,
                "not_protocol",
                "bogus",
            ),
            (
                r#"{"action":"deny","protocol":{"name":"icmp"},"icmp_type":300}"#,
                "icmp.type",
                "300",
            ),
            (
                r#"{"action":"deny","protocol":{"name":"icmp"},"icmp_type_code":{"type":3,"code":256}}"#,
                "icmp.code",
                "256",
            ),
            (
                r#"{"action":"deny","not_icmp_type":-5}"#,
                "not_icmp.type",
                "-5",
            ),
            (
                r#"{"action":"deny","protocol":{"name":"tcp"},"icmp_type":8}"#,
                "icmp",
                "8",
            ),
        ];
        for (rule, f, value) in cases {
            let errs = errors(&[&policy_with(rule)]);
            assert_eq!(
                errs,
                vec![(0, format!("{field}.{f}"), value.to_string())],
                "{rule}"
            );
        }
        // What Felix sends stays accepted.
        for rule in [
            r#"{"action":"deny","protocol":{"name":"TCP"}}"#,
            r#"{"action":"deny","protocol":{"number":47}}"#,
            r#"{"action":"deny","protocol":{"name":"ICMPv6"},"icmp_type_code":{"type":1,"code":4}}"#,
            r#"{"action":"allow","protocol":{"name":"udplite"}}"#,
            r#"{"action":"deny","not_icmp_type":8}"#,
        ] {
            assert_eq!(errors(&[&policy_with(rule)]), Vec::new(), "{rule}");
        }
    }

    #[test]
    fn ip_set_deltas_and_types_are_checked_both_ways() {
        let ip = r#"{"ipset_update":{"id":"s:a","type":"IP","members":["10.0.0.1"]}}"#;
        let del = |m: &str| {
            format!(r#"{{"ipset_delta_update":{{"id":"s:a","removed_members":["{m}"]}}}}"#)
        };
        assert_eq!(
            errors(&[ip, &del("garbage!!")]),
            vec![(1, "removed_members[0]".into(), "garbage!!".into())]
        );
        assert_eq!(
            errors(&[ip, &del("10.0.0.1,tcp:80")]),
            vec![(1, "removed_members[0]".into(), "10.0.0.1,tcp:80".into())]
        );
        assert_eq!(errors(&[ip, &del("10.0.0.1")]), Vec::new());
        // A set referenced for addresses cannot become a set of address/port pairs...
        let retyped =
            r#"{"ipset_update":{"id":"s:a","type":"IP_AND_PORT","members":["10.0.0.1,tcp:80"]}}"#;
        assert_eq!(
            stream(&[ip, POLICY, retyped]),
            vec![(2, "type".into(), "IpAndPort".into())]
        );
        // ... but may while nothing uses it.
        assert_eq!(stream(&[ip, retyped]), Vec::new());
        // Address fields need address sets; named ports need address/port sets.
        let ipp =
            r#"{"ipset_update":{"id":"s:a","type":"IP_AND_PORT","members":["10.0.0.1,tcp:80"]}}"#;
        assert_eq!(
            errors(&[ipp, POLICY]),
            vec![(
                1,
                "policy.inbound_rules[0].src_ip_set_ids[0]".into(),
                "s:a".into()
            )]
        );
    }

    /// Overlay messages: a VTEP or route that would program something other than what Felix
    /// meant is rejected with the message, field and value.
    #[test]
    fn vteps_and_routes_are_checked_field_by_field() {
        let vtep = |mac: &str, ip: &str, parent: &str| {
            format!(
                r#"{{"vtep_update":{{"node":"n1","mac":"{mac}","ipv4_addr":"{ip}","parent_device_ip":"{parent}"}}}}"#
            )
        };
        assert_eq!(
            errors(&[&vtep("66:aa:bb:cc:dd:ee", "10.65.1.0", "172.31.0.11")]),
            Vec::new()
        );
        // Felix tolerates a /32 on the tunnel address.
        assert_eq!(
            errors(&[&vtep("66:aa:bb:cc:dd:ee", "10.65.1.0/32", "172.31.0.11")]),
            Vec::new()
        );
        for (line, field, value) in [
            (
                vtep("66:aa:bb:cc:dd", "10.65.1.0", "172.31.0.11"),
                "mac",
                "66:aa:bb:cc:dd",
            ),
            (
                vtep("zz:aa:bb:cc:dd:ee", "10.65.1.0", "172.31.0.11"),
                "mac",
                "zz:aa:bb:cc:dd:ee",
            ),
            (
                vtep("01:00:5e:00:00:01", "10.65.1.0", "172.31.0.11"),
                "mac",
                "01:00:5e:00:00:01",
            ),
            (
                vtep("66:aa:bb:cc:dd:ee", "10.65.1.300", "172.31.0.11"),
                "ipv4_addr",
                "10.65.1.300",
            ),
            (
                vtep("66:aa:bb:cc:dd:ee", "fd00::1", "172.31.0.11"),
                "ipv4_addr",
                "fd00::1",
            ),
            (
                vtep("66:aa:bb:cc:dd:ee", "10.65.1.0/26", "172.31.0.11"),
                "ipv4_addr",
                "10.65.1.0/26",
            ),
            (
                vtep("66:aa:bb:cc:dd:ee", "10.65.1.0", "nope"),
                "parent_device_ip",
                "nope",
            ),
            (
                vtep("66:aa:bb:cc:dd:ee", "10.65.1.0", ""),
                "parent_device_ip",
                "",
            ),
        ] {
            assert_eq!(
                errors(&[&line]),
                vec![(0, field.to_string(), value.to_string())],
                "{line}"
            );
        }
        let route = |body: &str| format!(r#"{{"route_update":{{{body}}}}}"#);
        assert_eq!(
            errors(&[&route(
                r#""types":"REMOTE_WORKLOAD","ip_pool_type":"VXLAN","dst":"10.65.1.0/26","dst_node_name":"n1","dst_node_ip":"172.31.0.11""#
            )]),
            Vec::new()
        );
        for (body, field, value) in [
            (
                r#""types":"REMOTE_WORKLOAD","dst":"10.65.1.0/33""#,
                "dst",
                "10.65.1.0/33",
            ),
            (r#""types":"REMOTE_WORKLOAD","dst":"""#, "dst", ""),
            (r#""types":64,"dst":"10.65.1.0/26""#, "types", "64"),
            (
                r#""types":"REMOTE_WORKLOAD","ip_pool_type":7,"dst":"10.65.1.0/26""#,
                "ip_pool_type",
                "7",
            ),
            (
                r#""types":"REMOTE_WORKLOAD","dst":"10.65.1.0/26","dst_node_ip":"172.31.0.x""#,
                "dst_node_ip",
                "172.31.0.x",
            ),
        ] {
            assert_eq!(
                errors(&[&route(body)]),
                vec![(0, field.to_string(), value.to_string())],
                "{body}"
            );
        }
        // A remote host route onto a local workload's address is refused; a block holding it
        // (a borrowed address) is not.
        let onto_wep = route(
            r#""types":"REMOTE_WORKLOAD","ip_pool_type":"VXLAN","dst":"10.0.0.9/32","dst_node_name":"n1""#,
        );
        let mut model = Model::default();
        model.apply(&doc(&[WEP]).remove(0));
        let e = validate(&model, &doc(&[&onto_wep]).remove(0)).unwrap_err();
        assert_eq!(
            (e.message, e.field.as_str(), e.value.as_str()),
            ("route_update", "dst", "10.0.0.9/32")
        );
        assert!(e.reason.contains("k8s/w/eth0"), "{}", e.reason);
        let block = route(
            r#""types":"REMOTE_WORKLOAD","ip_pool_type":"VXLAN","dst":"10.0.0.0/26","dst_node_name":"n1""#,
        );
        assert!(validate(&model, &doc(&[&block]).remove(0)).is_ok());
        assert_eq!(
            errors(&[r#"{"route_remove":{"dst":"not-a-cidr"}}"#]),
            vec![(0, "dst".to_string(), "not-a-cidr".to_string())]
        );
        assert_eq!(
            errors(&[r#"{"vtep_remove":{"node":""}}"#]),
            vec![(0, "node".to_string(), String::new())]
        );
    }

    /// WireGuard endpoints: a node name, a key that is empty or 32 bytes of base64, a bare
    /// address of the message's family; anything else is refused with the field and value.
    #[test]
    fn wireguard_endpoints_are_checked() {
        let key = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
        let good = [
            format!(
                r#"{{"wireguard_endpoint_update":{{"hostname":"n1","public_key":"{key}","interface_ipv4_addr":"10.65.1.1"}}}}"#
            ),
            r#"{"wireguard_endpoint_update":{"hostname":"n1"}}"#.to_string(),
            format!(
                r#"{{"wireguard_endpoint_v6_update":{{"hostname":"n1","public_key_v6":"{key}","interface_ipv6_addr":"fd00::1"}}}}"#
            ),
            r#"{"wireguard_endpoint_remove":{"hostname":"n1"}}"#.to_string(),
        ];
        let good: Vec<&str> = good.iter().map(String::as_str).collect();
        assert_eq!(errors(&good), Vec::new());
        let bad = [
            (
                r#"{"wireguard_endpoint_update":{"hostname":"n1","public_key":"not-a-key"}}"#,
                "public_key",
                "not-a-key",
            ),
            (
                r#"{"wireguard_endpoint_update":{"hostname":"n1","public_key":"AAAA"}}"#,
                "public_key",
                "AAAA",
            ),
            (
                r#"{"wireguard_endpoint_update":{"hostname":"n1","interface_ipv4_addr":"fd00::1"}}"#,
                "interface_ipv4_addr",
                "fd00::1",
            ),
            (
                r#"{"wireguard_endpoint_update":{"hostname":"n1","interface_ipv4_addr":"nope"}}"#,
                "interface_ipv4_addr",
                "nope",
            ),
            (
                r#"{"wireguard_endpoint_v6_update":{"hostname":"n1","interface_ipv6_addr":"10.0.0.1"}}"#,
                "interface_ipv6_addr",
                "10.0.0.1",
            ),
            (
                r#"{"wireguard_endpoint_update":{"public_key":""}}"#,
                "hostname",
                "",
            ),
            (r#"{"wireguard_endpoint_remove":{}}"#, "hostname", ""),
        ];
        for (line, field, value) in bad {
            assert_eq!(
                errors(&[line]),
                vec![(0, field.to_string(), value.to_string())],
                "{line}"
            );
        }
    }
}
