//! The Felix dataplane API (`felix/proto/felixbackend.proto`, package `felix`) as Rust types.
//!
//! Field names and numbers are exactly those of `felixbackend.proto` (a copy is in
//! `tests/fixtures/`, checked with `protoc` by the codec tests), so
//! that the protobuf bytes Felix writes on fd 3 decode here unchanged. The prost derives are
//! written by hand: the build needs no `protoc`. Messages the nftables dataplane ignores (services,
//! service accounts, namespaces, wireguard, QoS) are still modelled so that they round-trip.
//!
//! Enum-typed fields are stored as `i32` (prost's convention: an unknown value survives a round
//! trip); use the generated `*()` getters or `TryFrom<i32>` to read them.
//!
//! The same types carry the proto3 JSON form (serde attributes: proto field names, lowerCamelCase
//! aliases, defaults omitted on output, unknown names refused) and its JSON Schema (schemars);
//! the helpers they name and the wire-side mirrors of the messages with a `oneof` live in
//! [`super::json`]. The serde attributes were derived mechanically from the prost ones: keep
//! them in step when adding a field (the round-trip and protoc tests catch a mismatch).

use std::collections::BTreeMap;

/// Felix → driver envelope (§2.1).
#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(
    try_from = "crate::json::wire::ToDataplaneJson",
    into = "crate::json::wire::ToDataplaneJson"
)]
pub struct ToDataplane {
    /// Incremented by one per message; for log correlation only.
    #[prost(uint64, tag = "15")]
    pub sequence_number: u64,
    #[prost(
        oneof = "to_dataplane::Payload",
        tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 18, 16, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38"
    )]
    pub payload: Option<to_dataplane::Payload>,
}

pub mod to_dataplane {
    /// The `oneof payload` of [`super::ToDataplane`].
    // Boxing the big variants would change the shape every consumer matches on, for one move
    // per message; prost-generated code keeps them inline too.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Payload {
        #[prost(message, tag = "1")]
        InSync(super::InSync),
        #[prost(message, tag = "2")]
        IpsetUpdate(super::IpSetUpdate),
        #[prost(message, tag = "3")]
        IpsetDeltaUpdate(super::IpSetDeltaUpdate),
        #[prost(message, tag = "4")]
        IpsetRemove(super::IpSetRemove),
        #[prost(message, tag = "5")]
        ActiveProfileUpdate(super::ActiveProfileUpdate),
        #[prost(message, tag = "6")]
        ActiveProfileRemove(super::ActiveProfileRemove),
        #[prost(message, tag = "7")]
        ActivePolicyUpdate(super::ActivePolicyUpdate),
        #[prost(message, tag = "8")]
        ActivePolicyRemove(super::ActivePolicyRemove),
        #[prost(message, tag = "9")]
        HostEndpointUpdate(super::HostEndpointUpdate),
        #[prost(message, tag = "10")]
        HostEndpointRemove(super::HostEndpointRemove),
        #[prost(message, tag = "11")]
        WorkloadEndpointUpdate(super::WorkloadEndpointUpdate),
        #[prost(message, tag = "12")]
        WorkloadEndpointRemove(super::WorkloadEndpointRemove),
        #[prost(message, tag = "13")]
        ConfigUpdate(super::ConfigUpdate),
        #[prost(message, tag = "14")]
        HostMetadataUpdate(super::HostMetadataUpdate),
        #[prost(message, tag = "18")]
        HostMetadataRemove(super::HostMetadataRemove),
        #[prost(message, tag = "16")]
        IpamPoolUpdate(super::IpamPoolUpdate),
        #[prost(message, tag = "17")]
        IpamPoolRemove(super::IpamPoolRemove),
        #[prost(message, tag = "19")]
        ServiceAccountUpdate(super::ServiceAccountUpdate),
        #[prost(message, tag = "20")]
        ServiceAccountRemove(super::ServiceAccountRemove),
        #[prost(message, tag = "21")]
        NamespaceUpdate(super::NamespaceUpdate),
        #[prost(message, tag = "22")]
        NamespaceRemove(super::NamespaceRemove),
        #[prost(message, tag = "23")]
        RouteUpdate(super::RouteUpdate),
        #[prost(message, tag = "24")]
        RouteRemove(super::RouteRemove),
        #[prost(message, tag = "25")]
        VtepUpdate(super::VxlanTunnelEndpointUpdate),
        #[prost(message, tag = "26")]
        VtepRemove(super::VxlanTunnelEndpointRemove),
        #[prost(message, tag = "27")]
        WireguardEndpointUpdate(super::WireguardEndpointUpdate),
        #[prost(message, tag = "28")]
        WireguardEndpointRemove(super::WireguardEndpointRemove),
        #[prost(message, tag = "29")]
        GlobalBgpConfigUpdate(super::GlobalBgpConfigUpdate),
        #[prost(message, tag = "30")]
        Encapsulation(super::Encapsulation),
        #[prost(message, tag = "31")]
        ServiceUpdate(super::ServiceUpdate),
        #[prost(message, tag = "32")]
        ServiceRemove(super::ServiceRemove),
        #[prost(message, tag = "33")]
        WireguardEndpointV6Update(super::WireguardEndpointV6Update),
        #[prost(message, tag = "34")]
        WireguardEndpointV6Remove(super::WireguardEndpointV6Remove),
        /// Felix 3.31 and 3.32 send a host's IPv6 address apart, and both addresses again in
        /// `HostMetadataV4V6Update`; 3.33 folded them into `HostMetadataUpdate`.
        #[prost(message, tag = "35")]
        HostMetadataV6Update(super::HostMetadataV6),
        #[prost(message, tag = "36")]
        HostMetadataV6Remove(super::HostMetadataV6),
        #[prost(message, tag = "37")]
        HostMetadataV4v6Update(super::HostMetadataUpdate),
        #[prost(message, tag = "38")]
        HostMetadataV4v6Remove(super::HostMetadataRemove),
    }
}

/// Driver → Felix envelope (§2.2).
#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(
    try_from = "crate::json::wire::FromDataplaneJson",
    into = "crate::json::wire::FromDataplaneJson"
)]
pub struct FromDataplane {
    /// Ignored by Felix.
    #[prost(uint64, tag = "8")]
    pub sequence_number: u64,
    #[prost(oneof = "from_dataplane::Payload", tags = "3, 4, 5, 6, 7, 9, 10")]
    pub payload: Option<from_dataplane::Payload>,
}

pub mod from_dataplane {
    /// The `oneof payload` of [`super::FromDataplane`].
    // Boxing the big variants would change the shape every consumer matches on, for one move
    // per message; prost-generated code keeps them inline too.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Payload {
        #[prost(message, tag = "3")]
        ProcessStatusUpdate(super::ProcessStatusUpdate),
        #[prost(message, tag = "4")]
        HostEndpointStatusUpdate(super::HostEndpointStatusUpdate),
        #[prost(message, tag = "5")]
        HostEndpointStatusRemove(super::HostEndpointStatusRemove),
        #[prost(message, tag = "6")]
        WorkloadEndpointStatusUpdate(super::WorkloadEndpointStatusUpdate),
        #[prost(message, tag = "7")]
        WorkloadEndpointStatusRemove(super::WorkloadEndpointStatusRemove),
        #[prost(message, tag = "9")]
        WireguardStatusUpdate(super::WireguardStatusUpdate),
        #[prost(message, tag = "10")]
        DataplaneInSync(super::DataplaneInSync),
    }
}

// ---------------------------------------------------------------------------------------------
// ToDataplane payloads
// ---------------------------------------------------------------------------------------------

/// Sent once when the datastore snapshot has been fully processed.
#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct InSync {}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigUpdate {
    /// Resolved raw value of every parameter, keyed by canonical Felix name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[prost(btree_map = "string, string", tag = "1")]
    pub config: BTreeMap<String, String>,
    #[serde(
        alias = "sourceToRawConfig",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[prost(btree_map = "uint32, message", tag = "2")]
    pub source_to_raw_config: BTreeMap<u32, RawConfig>,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub message: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct RawConfig {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub source: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[prost(btree_map = "string, string", tag = "2")]
    pub config: BTreeMap<String, String>,
}

/// `IPSetUpdate.IPSetType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum IpSetType {
    /// Each member is an IP address.
    Ip = 0,
    /// Each member is `<IP>,(tcp|udp|sctp):port`.
    IpAndPort = 1,
    /// Each member is a CIDR.
    Net = 2,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct IpSetUpdate {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub id: String,
    /// Complete membership.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "2")]
    pub members: Vec<String>,
    #[serde(
        skip_serializing_if = "crate::json::is_default",
        serialize_with = "crate::json::ser_enum::<IpSetType, _>",
        deserialize_with = "crate::json::de_enum::<IpSetType, _>"
    )]
    #[schemars(schema_with = "crate::json::enum_schema::<IpSetType>")]
    #[prost(enumeration = "IpSetType", tag = "3")]
    pub r#type: i32,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct IpSetDeltaUpdate {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub id: String,
    #[serde(alias = "addedMembers", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "2")]
    pub added_members: Vec<String>,
    #[serde(alias = "removedMembers", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "3")]
    pub removed_members: Vec<String>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct IpSetRemove {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub id: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ActiveProfileUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<ProfileId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "2")]
    pub profile: Option<Profile>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ActiveProfileRemove {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<ProfileId>,
}

#[derive(
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ProfileId {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct Profile {
    #[serde(alias = "inboundRules", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "1")]
    pub inbound_rules: Vec<Rule>,
    #[serde(alias = "outboundRules", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "2")]
    pub outbound_rules: Vec<Rule>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ActivePolicyUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<PolicyId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "2")]
    pub policy: Option<Policy>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ActivePolicyRemove {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<PolicyId>,
}

/// Field 1 (`tier`) was removed upstream.
#[derive(
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyId {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "4")]
    pub kind: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    #[serde(alias = "inboundRules", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "1")]
    pub inbound_rules: Vec<Rule>,
    #[serde(alias = "outboundRules", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "2")]
    pub outbound_rules: Vec<Rule>,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "3")]
    pub untracked: bool,
    #[serde(alias = "preDnat", skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "4")]
    pub pre_dnat: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "5")]
    pub namespace: String,
    #[serde(alias = "originalSelector", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "6")]
    pub original_selector: String,
    #[serde(alias = "perfHints", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "7")]
    pub perf_hints: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "8")]
    pub tier: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum IpVersion {
    Any = 0,
    Ipv4 = 4,
    Ipv6 = 6,
}

/// One policy or profile rule (§2.3, rendered per §9).
#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(
    try_from = "crate::json::wire::RuleJson",
    into = "crate::json::wire::RuleJson"
)]
pub struct Rule {
    /// `""`/`allow`, `deny`, `pass`/`next-tier`, `log`.
    #[prost(string, tag = "1")]
    pub action: String,
    #[prost(enumeration = "IpVersion", tag = "2")]
    pub ip_version: i32,
    #[prost(message, optional, tag = "3")]
    pub protocol: Option<Protocol>,
    #[prost(string, repeated, tag = "4")]
    pub src_net: Vec<String>,
    #[prost(message, repeated, tag = "5")]
    pub src_ports: Vec<PortRange>,
    #[prost(string, repeated, tag = "12")]
    pub src_named_port_ip_set_ids: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    pub dst_net: Vec<String>,
    #[prost(message, repeated, tag = "7")]
    pub dst_ports: Vec<PortRange>,
    #[prost(string, repeated, tag = "13")]
    pub dst_named_port_ip_set_ids: Vec<String>,
    #[prost(oneof = "rule::Icmp", tags = "8, 9")]
    pub icmp: Option<rule::Icmp>,
    #[prost(string, repeated, tag = "10")]
    pub src_ip_set_ids: Vec<String>,
    #[prost(string, repeated, tag = "11")]
    pub dst_ip_set_ids: Vec<String>,
    /// IP sets on which both IP and port are matched.
    #[prost(string, repeated, tag = "15")]
    pub dst_ip_port_set_ids: Vec<String>,

    #[prost(message, optional, tag = "102")]
    pub not_protocol: Option<Protocol>,
    #[prost(string, repeated, tag = "103")]
    pub not_src_net: Vec<String>,
    #[prost(message, repeated, tag = "104")]
    pub not_src_ports: Vec<PortRange>,
    #[prost(string, repeated, tag = "105")]
    pub not_dst_net: Vec<String>,
    #[prost(message, repeated, tag = "106")]
    pub not_dst_ports: Vec<PortRange>,
    #[prost(oneof = "rule::NotIcmp", tags = "107, 108")]
    pub not_icmp: Option<rule::NotIcmp>,
    #[prost(string, repeated, tag = "109")]
    pub not_src_ip_set_ids: Vec<String>,
    #[prost(string, repeated, tag = "110")]
    pub not_dst_ip_set_ids: Vec<String>,
    #[prost(string, repeated, tag = "112")]
    pub not_src_named_port_ip_set_ids: Vec<String>,
    #[prost(string, repeated, tag = "113")]
    pub not_dst_named_port_ip_set_ids: Vec<String>,

    // Pass-through fields: ignored by the renderer, kept so they round-trip.
    #[prost(string, tag = "114")]
    pub original_src_selector: String,
    #[prost(string, tag = "115")]
    pub original_dst_selector: String,
    #[prost(string, tag = "116")]
    pub original_src_namespace_selector: String,
    #[prost(string, tag = "117")]
    pub original_dst_namespace_selector: String,
    #[prost(string, tag = "118")]
    pub original_not_src_selector: String,
    #[prost(string, tag = "119")]
    pub original_not_dst_selector: String,
    #[prost(message, optional, tag = "120")]
    pub src_service_account_match: Option<ServiceAccountMatch>,
    #[prost(message, optional, tag = "121")]
    pub dst_service_account_match: Option<ServiceAccountMatch>,
    #[prost(message, optional, tag = "122")]
    pub http_match: Option<HttpMatch>,
    /// Annotations are rendered as extra rule comments `k=v`.
    #[prost(message, optional, tag = "123")]
    pub metadata: Option<RuleMetadata>,
    #[prost(string, tag = "130")]
    pub original_dst_service: String,
    #[prost(string, tag = "131")]
    pub original_dst_service_namespace: String,
    #[prost(string, tag = "132")]
    pub original_src_service: String,
    #[prost(string, tag = "133")]
    pub original_src_service_namespace: String,
    /// An opaque ID/hash for the rule.
    #[prost(string, tag = "201")]
    pub rule_id: String,
}

pub mod rule {
    /// `oneof icmp`: a match on type only, or on type and code.
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Icmp {
        #[prost(int32, tag = "8")]
        IcmpType(i32),
        #[prost(message, tag = "9")]
        IcmpTypeCode(super::IcmpTypeAndCode),
    }

    /// `oneof not_icmp`.
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum NotIcmp {
        #[prost(int32, tag = "107")]
        NotIcmpType(i32),
        #[prost(message, tag = "108")]
        NotIcmpTypeCode(super::IcmpTypeAndCode),
    }
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceAccountMatch {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub selector: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "2")]
    pub names: Vec<String>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HttpMatch {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "1")]
    pub methods: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "2")]
    pub paths: Vec<http_match::PathMatch>,
}

pub mod http_match {
    #[derive(
        Clone,
        PartialEq,
        ::prost::Message,
        serde::Serialize,
        serde::Deserialize,
        schemars::JsonSchema,
    )]
    #[serde(
        try_from = "crate::json::wire::PathMatchJson",
        into = "crate::json::wire::PathMatchJson"
    )]
    pub struct PathMatch {
        #[prost(oneof = "path_match::PathMatch", tags = "1, 2")]
        pub path_match: Option<path_match::PathMatch>,
    }

    pub mod path_match {
        #[derive(Clone, PartialEq, ::prost::Oneof)]
        pub enum PathMatch {
            #[prost(string, tag = "1")]
            Exact(String),
            #[prost(string, tag = "2")]
            Prefix(String),
        }
    }
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct RuleMetadata {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[prost(btree_map = "string, string", tag = "1")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(
    Clone,
    PartialEq,
    Eq,
    Hash,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct IcmpTypeAndCode {
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(int32, tag = "2")]
    pub code: i32,
}

#[derive(
    Clone,
    PartialEq,
    Eq,
    Hash,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(
    try_from = "crate::json::wire::ProtocolJson",
    into = "crate::json::wire::ProtocolJson"
)]
pub struct Protocol {
    #[prost(oneof = "protocol::NumberOrName", tags = "1, 2")]
    pub number_or_name: Option<protocol::NumberOrName>,
}

pub mod protocol {
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Oneof)]
    pub enum NumberOrName {
        #[prost(int32, tag = "1")]
        Number(i32),
        #[prost(string, tag = "2")]
        Name(String),
    }
}

/// A port range; a single port has `first == last`.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct PortRange {
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(int32, tag = "1")]
    pub first: i32,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(int32, tag = "2")]
    pub last: i32,
}

#[derive(
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadEndpointId {
    #[serde(alias = "orchestratorId", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub orchestrator_id: String,
    #[serde(alias = "workloadId", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub workload_id: String,
    #[serde(alias = "endpointId", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "4")]
    pub endpoint_id: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadEndpointUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<WorkloadEndpointId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "5")]
    pub endpoint: Option<WorkloadEndpoint>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadEndpointRemove {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<WorkloadEndpointId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum LiveMigrationRole {
    NoRole = 0,
    Source = 1,
    Target = 2,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadEndpoint {
    /// `active` = admin up; anything else = admin down.
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub state: String,
    /// Host-side interface name, e.g. `cali1a2b3c4d5e6`.
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub mac: String,
    #[serde(alias = "profileIds", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "4")]
    pub profile_ids: Vec<String>,
    #[serde(alias = "ipv4Nets", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "5")]
    pub ipv4_nets: Vec<String>,
    #[serde(alias = "ipv6Nets", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "6")]
    pub ipv6_nets: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "7")]
    pub tiers: Vec<TierInfo>,
    #[serde(alias = "ipv4Nat", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "8")]
    pub ipv4_nat: Vec<NatInfo>,
    #[serde(alias = "ipv6Nat", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "9")]
    pub ipv6_nat: Vec<NatInfo>,
    #[serde(
        alias = "allowSpoofedSourcePrefixes",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[prost(string, repeated, tag = "10")]
    pub allow_spoofed_source_prefixes: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[prost(btree_map = "string, string", tag = "11")]
    pub annotations: BTreeMap<String, String>,
    #[serde(alias = "qosControls", skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "12")]
    pub qos_controls: Option<QoSControls>,
    #[serde(alias = "localBgpPeer", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "13")]
    pub local_bgp_peer: String,
    #[serde(alias = "skipRedir", skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "14")]
    pub skip_redir: bool,
    #[serde(alias = "qosPolicies", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "15")]
    pub qos_policies: Vec<QoSPolicy>,
    #[serde(
        alias = "isIstioAmbient",
        skip_serializing_if = "crate::json::is_default"
    )]
    #[prost(bool, tag = "16")]
    pub is_istio_ambient: bool,
    #[serde(
        alias = "liveMigrationRole",
        skip_serializing_if = "crate::json::is_default",
        serialize_with = "crate::json::ser_enum::<LiveMigrationRole, _>",
        deserialize_with = "crate::json::de_enum::<LiveMigrationRole, _>"
    )]
    #[schemars(schema_with = "crate::json::enum_schema::<LiveMigrationRole>")]
    #[prost(enumeration = "LiveMigrationRole", tag = "17")]
    pub live_migration_role: i32,
    #[serde(alias = "liveMigrationUid", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "18")]
    pub live_migration_uid: String,
    #[serde(
        alias = "liveMigrationVmiName",
        skip_serializing_if = "String::is_empty"
    )]
    #[prost(string, tag = "19")]
    pub live_migration_vmi_name: String,
}

#[derive(
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostEndpointId {
    #[serde(alias = "endpointId", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub endpoint_id: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostEndpointUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<HostEndpointId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "3")]
    pub endpoint: Option<HostEndpoint>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostEndpointRemove {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<HostEndpointId>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostEndpoint {
    /// Interface name, or `*` for all interfaces, or empty (resolve by expected addresses).
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub name: String,
    #[serde(alias = "profileIds", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "2")]
    pub profile_ids: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "3")]
    pub tiers: Vec<TierInfo>,
    #[serde(alias = "expectedIpv4Addrs", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "4")]
    pub expected_ipv4_addrs: Vec<String>,
    #[serde(alias = "expectedIpv6Addrs", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "5")]
    pub expected_ipv6_addrs: Vec<String>,
    #[serde(alias = "untrackedTiers", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "6")]
    pub untracked_tiers: Vec<TierInfo>,
    #[serde(alias = "preDnatTiers", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "7")]
    pub pre_dnat_tiers: Vec<TierInfo>,
    #[serde(alias = "forwardTiers", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "8")]
    pub forward_tiers: Vec<TierInfo>,
    #[serde(alias = "qosPolicies", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "9")]
    pub qos_policies: Vec<QoSPolicy>,
}

#[derive(
    Clone,
    PartialEq,
    Eq,
    Hash,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct TierInfo {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub name: String,
    #[serde(alias = "ingressPolicies", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "2")]
    pub ingress_policies: Vec<PolicyId>,
    #[serde(alias = "egressPolicies", skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "3")]
    pub egress_policies: Vec<PolicyId>,
    /// `Deny` (default when empty) or `Pass`.
    #[serde(alias = "defaultAction", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "4")]
    pub default_action: String,
}

#[derive(
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    ::prost::Message,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct NatInfo {
    #[serde(alias = "extIp", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub ext_ip: String,
    #[serde(alias = "intIp", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub int_ip: String,
}

/// QoS limits (fields 1–14). Not verified against upstream field-by-field; the nftables
/// dataplane uses only the packet-rate and connection limits.
#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct QoSControls {
    #[serde(
        alias = "ingressBandwidth",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "1")]
    pub ingress_bandwidth: i64,
    #[serde(
        alias = "egressBandwidth",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "2")]
    pub egress_bandwidth: i64,
    #[serde(
        alias = "ingressBurst",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "3")]
    pub ingress_burst: i64,
    #[serde(
        alias = "egressBurst",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "4")]
    pub egress_burst: i64,
    #[serde(
        alias = "ingressPacketRate",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "5")]
    pub ingress_packet_rate: i64,
    #[serde(
        alias = "egressPacketRate",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "6")]
    pub egress_packet_rate: i64,
    #[serde(
        alias = "ingressMaxConnections",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "7")]
    pub ingress_max_connections: i64,
    #[serde(
        alias = "egressMaxConnections",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "8")]
    pub egress_max_connections: i64,
    #[serde(
        alias = "ingressPeakrate",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "9")]
    pub ingress_peakrate: i64,
    #[serde(
        alias = "egressPeakrate",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "10")]
    pub egress_peakrate: i64,
    #[serde(
        alias = "ingressMinburst",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "11")]
    pub ingress_minburst: i64,
    #[serde(
        alias = "egressMinburst",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "12")]
    pub egress_minburst: i64,
    #[serde(
        alias = "ingressPacketBurst",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "13")]
    pub ingress_packet_burst: i64,
    #[serde(
        alias = "egressPacketBurst",
        skip_serializing_if = "crate::json::is_default",
        with = "crate::json::int64"
    )]
    #[schemars(schema_with = "crate::json::int64_schema")]
    #[prost(int64, tag = "14")]
    pub egress_packet_burst: i64,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct QoSPolicy {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub destination: String,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(int32, tag = "2")]
    pub dscp: i32,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostMetadataUpdate {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub hostname: String,
    /// May carry a /prefix.
    #[serde(alias = "ipv4Addr", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub ipv4_addr: String,
    #[serde(alias = "ipv6Addr", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub ipv6_addr: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "4")]
    pub asnumber: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[prost(btree_map = "string, string", tag = "5")]
    pub labels: BTreeMap<String, String>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostMetadataRemove {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub hostname: String,
    #[serde(alias = "ipv4Addr", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub ipv4_addr: String,
}

/// A host's IPv6 address alone (Felix 3.31 and 3.32; `ipv6_addr` is a bare address): the body
/// of both `HostMetadataV6Update` and `HostMetadataV6Remove`, which have the same fields.
#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostMetadataV6 {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub hostname: String,
    #[serde(alias = "ipv6Addr", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub ipv6_addr: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct IpamPoolUpdate {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "2")]
    pub pool: Option<IpamPool>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct IpamPoolRemove {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub id: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct IpamPool {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub cidr: String,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "2")]
    pub masquerade: bool,
    /// `Never` / `CrossSubnet` / `Always`.
    #[serde(alias = "ipipMode", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub ipip_mode: String,
    #[serde(alias = "vxlanMode", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "4")]
    pub vxlan_mode: String,
    /// `Workload`, `Tunnel`, `LoadBalancer`.
    #[serde(alias = "allowedUses", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "5")]
    pub allowed_uses: Vec<String>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct Encapsulation {
    #[serde(alias = "ipipEnabled", skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "1")]
    pub ipip_enabled: bool,
    #[serde(
        alias = "vxlanEnabled",
        skip_serializing_if = "crate::json::is_default"
    )]
    #[prost(bool, tag = "2")]
    pub vxlan_enabled: bool,
    #[serde(
        alias = "vxlanEnabledV6",
        skip_serializing_if = "crate::json::is_default"
    )]
    #[prost(bool, tag = "3")]
    pub vxlan_enabled_v6: bool,
    /// Really "a no-encap pool exists".
    #[serde(
        alias = "noEncapEnabled",
        skip_serializing_if = "crate::json::is_default"
    )]
    #[prost(bool, tag = "4")]
    pub no_encap_enabled: bool,
}

/// Bits of `RouteUpdate.types`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum RouteType {
    CidrInfo = 0,
    RemoteWorkload = 1,
    RemoteHost = 2,
    LocalWorkload = 4,
    LocalHost = 8,
    RemoteTunnel = 16,
    LocalTunnel = 32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum IpPoolType {
    None = 0,
    NoEncap = 1,
    Vxlan = 2,
    Ipip = 3,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct TunnelType {
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "1")]
    pub ipip: bool,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "2")]
    pub vxlan: bool,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "3")]
    pub wireguard: bool,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct RouteUpdate {
    #[serde(
        alias = "ipPoolType",
        skip_serializing_if = "crate::json::is_default",
        serialize_with = "crate::json::ser_enum::<IpPoolType, _>",
        deserialize_with = "crate::json::de_enum::<IpPoolType, _>"
    )]
    #[schemars(schema_with = "crate::json::enum_schema::<IpPoolType>")]
    #[prost(enumeration = "IpPoolType", tag = "2")]
    pub ip_pool_type: i32,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub dst: String,
    #[serde(alias = "dstNodeName", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "4")]
    pub dst_node_name: String,
    #[serde(alias = "dstNodeIp", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "5")]
    pub dst_node_ip: String,
    #[serde(alias = "sameSubnet", skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "7")]
    pub same_subnet: bool,
    #[serde(alias = "natOutgoing", skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "8")]
    pub nat_outgoing: bool,
    #[serde(
        alias = "localWorkload",
        skip_serializing_if = "crate::json::is_default"
    )]
    #[prost(bool, tag = "9")]
    pub local_workload: bool,
    #[serde(alias = "tunnelType", skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "10")]
    pub tunnel_type: Option<TunnelType>,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(bool, tag = "11")]
    pub borrowed: bool,
    /// Bitmap of [`RouteType`] values. On the wire an enum field (`RouteType types = 12`); in
    /// JSON a single known value is written by name, any other bitmap as a number.
    #[serde(
        skip_serializing_if = "crate::json::is_default",
        serialize_with = "crate::json::ser_enum::<RouteType, _>",
        deserialize_with = "crate::json::de_enum::<RouteType, _>"
    )]
    #[schemars(schema_with = "crate::json::enum_schema::<RouteType>")]
    #[prost(int32, tag = "12")]
    pub types: i32,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct RouteRemove {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub dst: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct VxlanTunnelEndpointUpdate {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub node: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub mac: String,
    #[serde(alias = "ipv4Addr", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub ipv4_addr: String,
    #[serde(alias = "parentDeviceIp", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "4")]
    pub parent_device_ip: String,
    #[serde(alias = "macV6", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "5")]
    pub mac_v6: String,
    #[serde(alias = "ipv6Addr", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "6")]
    pub ipv6_addr: String,
    #[serde(alias = "parentDeviceIpv6", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "7")]
    pub parent_device_ipv6: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct VxlanTunnelEndpointRemove {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub node: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WireguardEndpointUpdate {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub hostname: String,
    #[serde(alias = "publicKey", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub public_key: String,
    #[serde(alias = "interfaceIpv4Addr", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub interface_ipv4_addr: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WireguardEndpointRemove {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub hostname: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WireguardEndpointV6Update {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub hostname: String,
    #[serde(alias = "publicKeyV6", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub public_key_v6: String,
    #[serde(alias = "interfaceIpv6Addr", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub interface_ipv6_addr: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WireguardEndpointV6Remove {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub hostname: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct GlobalBgpConfigUpdate {
    #[serde(alias = "serviceClusterCidrs", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "1")]
    pub service_cluster_cidrs: Vec<String>,
    #[serde(alias = "serviceExternalCidrs", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "2")]
    pub service_external_cidrs: Vec<String>,
    #[serde(
        alias = "serviceLoadbalancerCidrs",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[prost(string, repeated, tag = "3")]
    pub service_loadbalancer_cidrs: Vec<String>,
    #[serde(
        alias = "localWorkloadPeeringIpV4",
        skip_serializing_if = "String::is_empty"
    )]
    #[prost(string, tag = "4")]
    pub local_workload_peering_ip_v4: String,
    #[serde(
        alias = "localWorkloadPeeringIpV6",
        skip_serializing_if = "String::is_empty"
    )]
    #[prost(string, tag = "5")]
    pub local_workload_peering_ip_v6: String,
}

/// Used by BPF mode only; the nftables dataplane ignores services. Field numbers past 6 are
/// not verified against upstream.
#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceUpdate {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "3")]
    pub r#type: String,
    #[serde(alias = "clusterIp", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "4")]
    pub cluster_ip: String,
    #[serde(alias = "loadbalancerIp", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "5")]
    pub loadbalancer_ip: String,
    #[serde(alias = "externalIps", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "6")]
    pub external_ips: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[prost(message, repeated, tag = "7")]
    pub ports: Vec<ServicePort>,
    #[serde(alias = "clusterIps", skip_serializing_if = "Vec::is_empty")]
    #[prost(string, repeated, tag = "8")]
    pub cluster_ips: Vec<String>,
    #[serde(
        alias = "loadbalancerIngressIps",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[prost(string, repeated, tag = "9")]
    pub loadbalancer_ingress_ips: Vec<String>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ServicePort {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub protocol: String,
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(int32, tag = "2")]
    pub port: i32,
    #[serde(alias = "nodePort", skip_serializing_if = "crate::json::is_default")]
    #[prost(int32, tag = "3")]
    pub node_port: i32,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceRemove {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub namespace: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceAccountId {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "2")]
    pub name: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceAccountUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<ServiceAccountId>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[prost(btree_map = "string, string", tag = "2")]
    pub labels: BTreeMap<String, String>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceAccountRemove {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<ServiceAccountId>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceId {
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<NamespaceId>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[prost(btree_map = "string, string", tag = "2")]
    pub labels: BTreeMap<String, String>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceRemove {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<NamespaceId>,
}

// ---------------------------------------------------------------------------------------------
// FromDataplane payloads
// ---------------------------------------------------------------------------------------------

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessStatusUpdate {
    /// RFC 3339, UTC.
    #[serde(alias = "isoTimestamp", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub iso_timestamp: String,
    /// Seconds since process start.
    #[serde(skip_serializing_if = "crate::json::is_default")]
    #[prost(double, tag = "2")]
    pub uptime: f64,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointStatus {
    /// `up`, `down` or `error`.
    #[serde(skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub status: String,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostEndpointStatusUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<HostEndpointId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "2")]
    pub status: Option<EndpointStatus>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct HostEndpointStatusRemove {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<HostEndpointId>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadEndpointStatusUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<WorkloadEndpointId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "2")]
    pub status: Option<EndpointStatus>,
    /// Filled in: Felix's status-file writer uses it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "3")]
    pub endpoint: Option<WorkloadEndpoint>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadEndpointStatusRemove {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[prost(message, optional, tag = "1")]
    pub id: Option<WorkloadEndpointId>,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct WireguardStatusUpdate {
    #[serde(alias = "publicKey", skip_serializing_if = "String::is_empty")]
    #[prost(string, tag = "1")]
    pub public_key: String,
    #[serde(
        alias = "ipVersion",
        skip_serializing_if = "crate::json::is_default",
        serialize_with = "crate::json::ser_enum::<IpVersion, _>",
        deserialize_with = "crate::json::de_enum::<IpVersion, _>"
    )]
    #[schemars(schema_with = "crate::json::enum_schema::<IpVersion>")]
    #[prost(enumeration = "IpVersion", tag = "2")]
    pub ip_version: i32,
}

#[derive(
    Clone, PartialEq, ::prost::Message, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct DataplaneInSync {}
