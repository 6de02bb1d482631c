//! proto3 JSON for the Felix API types.
//!
//! The JSON form uses the proto's own field names (`ipset_update`, `added_members`) and accepts
//! the lowerCamelCase names a proto3 JSON parser also accepts (`ipsetUpdate`, `addedMembers`).
//! Enums are written by name and read by name or number; 64-bit integers are written as strings
//! (proto3 JSON) and read from a number or a string; a oneof is written as its member's field
//! name (`{"protocol":{"name":"tcp"}}`, `{"icmp_type_code":{"type":3,"code":4}}`); maps are
//! objects. Fields holding their default value are omitted on output, as proto3 JSON does.
//!
//! Unlike Go's protojson default we also reject unknown field names: this form is written by
//! people and tools, and a misspelt `dst_ports` silently dropped would widen a policy.
//!
//! The Rust types of [`super::types`] stay the one model: they carry serde attributes, and the
//! few messages with a oneof go through the small wire-side mirrors of [`wire`].

use std::fmt;
use std::marker::PhantomData;

use schemars::{json_schema, Schema, SchemaGenerator};
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::{Serialize, Serializer};

use super::types::*;

/// A JSON message that could not be decoded: where (the field path), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (at `{path}`{})", position_suffix(*.line, *.column))]
pub struct JsonError {
    /// The path of the field at fault, e.g. `active_policy_update.policy.inbound_rules[0].action`;
    /// `.` for the message itself.
    pub path: String,
    /// What was wrong, as serde_json reports it.
    pub message: String,
    /// 1-based line within the decoded text, 0 when unknown (decoding from a parsed value).
    pub line: usize,
    /// 1-based column within that line, 0 when unknown.
    pub column: usize,
}

fn position_suffix(line: usize, column: usize) -> String {
    match line {
        0 => String::new(),
        // A one-line message (the JSON stream's case): the line is known to the caller.
        1 => format!(", column {column}"),
        _ => format!(", line {line} column {column}"),
    }
}

impl JsonError {
    fn from_path_error(e: serde_path_to_error::Error<serde_json::Error>) -> Self {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // serde_json appends " at line L column C" to the message; we keep them as fields.
        let mut message = inner.to_string();
        if inner.line() != 0 {
            if let Some(cut) = message.rfind(" at line ") {
                message.truncate(cut);
            }
        }
        JsonError {
            path: crate::clip::clip(path),
            message: crate::clip::clip(message),
            line: inner.line(),
            column: inner.column(),
        }
    }
}

/// Decodes one message (any of the API types) from JSON text.
///
/// The text is decoded once without tracking field paths; only a failed decode runs again with
/// `serde_path_to_error` to say where. Both accept exactly the same documents, and the path
/// tracking (a segment pushed per field) doubled the time of loading a state document.
pub fn decode<T: DeserializeOwned>(text: &str) -> Result<T, JsonError> {
    if let Ok(v) = serde_json::from_str(text) {
        return Ok(v);
    }
    decode_tracked(text)
}

fn decode_tracked<T: DeserializeOwned>(text: &str) -> Result<T, JsonError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(JsonError::from_path_error)?;
    de.end().map_err(|e| JsonError {
        path: ".".to_string(),
        message: crate::clip::clip(strip_position(&e)),
        line: e.line(),
        column: e.column(),
    })?;
    Ok(value)
}

/// Decodes one message from an already parsed JSON value (positions are then unknown). As
/// [`decode`], paths are tracked only when the fast decode failed.
pub fn decode_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, JsonError> {
    if let Ok(v) = T::deserialize(&value) {
        return Ok(v);
    }
    serde_path_to_error::deserialize(value).map_err(JsonError::from_path_error)
}

fn strip_position(e: &serde_json::Error) -> String {
    let mut message = e.to_string();
    if let Some(cut) = message.rfind(" at line ") {
        message.truncate(cut);
    }
    message
}

/// Encodes a message as one line of proto3 JSON with the proto's field names.
pub fn encode<T: Serialize>(msg: &T) -> String {
    // Serialising these types cannot fail: every map key is a string or an integer, and the one
    // float (`ProcessStatusUpdate.uptime`) is written as null should it ever be non-finite.
    serde_json::to_string(msg).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Encodes a message as indented proto3 JSON.
pub fn encode_pretty<T: Serialize>(msg: &T) -> String {
    serde_json::to_string_pretty(msg).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Whether a value is its type's default (proto3 JSON omits such fields on output).
pub fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

// ---------------------------------------------------------------------------------------------
// Enums: stored as i32 (prost), written by name, read by name or number.
// ---------------------------------------------------------------------------------------------

/// A proto enum's value names, as the `.proto` spells them.
pub trait ProtoEnum: 'static {
    /// The enum's proto name, for error messages and the schema.
    const PROTO_NAME: &'static str;
    /// Every (number, name) pair.
    const VALUES: &'static [(i32, &'static str)];

    /// The name of a known value.
    fn name_of(value: i32) -> Option<&'static str> {
        Self::VALUES
            .iter()
            .find(|(n, _)| *n == value)
            .map(|(_, s)| *s)
    }

    /// The number of a value name.
    fn number_of(name: &str) -> Option<i32> {
        Self::VALUES
            .iter()
            .find(|(_, s)| *s == name)
            .map(|(n, _)| *n)
    }
}

macro_rules! proto_enum {
    ($ty:ty, $proto:literal, [$(($n:expr, $s:literal)),* $(,)?]) => {
        impl ProtoEnum for $ty {
            const PROTO_NAME: &'static str = $proto;
            const VALUES: &'static [(i32, &'static str)] = &[$(($n, $s)),*];
        }
    };
}

proto_enum!(
    IpSetType,
    "IPSetUpdate.IPSetType",
    [(0, "IP"), (1, "IP_AND_PORT"), (2, "NET")]
);
proto_enum!(
    IpVersion,
    "IPVersion",
    [(0, "ANY"), (4, "IPV4"), (6, "IPV6")]
);
proto_enum!(
    RouteType,
    "RouteType",
    [
        (0, "CIDR_INFO"),
        (1, "REMOTE_WORKLOAD"),
        (2, "REMOTE_HOST"),
        (4, "LOCAL_WORKLOAD"),
        (8, "LOCAL_HOST"),
        (16, "REMOTE_TUNNEL"),
        (32, "LOCAL_TUNNEL"),
    ]
);
proto_enum!(
    IpPoolType,
    "IPPoolType",
    [(0, "NONE"), (1, "NO_ENCAP"), (2, "VXLAN"), (3, "IPIP")]
);
proto_enum!(
    LiveMigrationRole,
    "LiveMigrationRole",
    [(0, "NO_ROLE"), (1, "SOURCE"), (2, "TARGET")]
);

/// Writes an enum field by name, or by number when the value has no name (an unknown value or a
/// `RouteType` bitmap of several bits), as proto3 JSON does.
pub fn ser_enum<E: ProtoEnum, S: Serializer>(value: &i32, s: S) -> Result<S::Ok, S::Error> {
    match E::name_of(*value) {
        Some(name) => s.serialize_str(name),
        None => s.serialize_i32(*value),
    }
}

/// Reads an enum field from its name or its number; `null` is the default (0).
pub fn de_enum<'de, E: ProtoEnum, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    struct V<E>(PhantomData<E>);
    impl<E: ProtoEnum> Visitor<'_> for V<E> {
        type Value = i32;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "{} by name (", E::PROTO_NAME)?;
            for (i, (_, s)) in E::VALUES.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                f.write_str(s)?;
            }
            f.write_str(") or number")
        }
        fn visit_str<Er: de::Error>(self, v: &str) -> Result<i32, Er> {
            E::number_of(v).ok_or_else(|| Er::invalid_value(de::Unexpected::Str(v), &self))
        }
        fn visit_i64<Er: de::Error>(self, v: i64) -> Result<i32, Er> {
            i32::try_from(v).map_err(|_| Er::invalid_value(de::Unexpected::Signed(v), &self))
        }
        fn visit_u64<Er: de::Error>(self, v: u64) -> Result<i32, Er> {
            i32::try_from(v).map_err(|_| Er::invalid_value(de::Unexpected::Unsigned(v), &self))
        }
        fn visit_unit<Er: de::Error>(self) -> Result<i32, Er> {
            Ok(0)
        }
    }
    d.deserialize_any(V::<E>(PhantomData))
}

/// The schema of an enum field: one of the names, or an integer.
pub fn enum_schema<E: ProtoEnum>(_gen: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = E::VALUES.iter().map(|(_, s)| *s).collect();
    json_schema!({
        "description": format!("{} by name, or by number", E::PROTO_NAME),
        "anyOf": [
            { "type": "string", "enum": names },
            { "type": "integer", "format": "int32" }
        ]
    })
}

// ---------------------------------------------------------------------------------------------
// 64-bit integers: written as strings, read from a number or a string (proto3 JSON).
// ---------------------------------------------------------------------------------------------

/// `#[serde(with)]` module for `int64`/`uint64` fields.
pub mod int64 {
    use std::fmt;
    use std::marker::PhantomData;
    use std::str::FromStr;

    use serde::de::{self, Deserializer, Visitor};
    use serde::Serializer;

    /// Writes the value as a decimal string.
    pub fn serialize<T: fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    /// Reads the value from a JSON number or a decimal string; `null` is 0.
    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr + TryFrom<i64> + TryFrom<u64> + Default,
        D: Deserializer<'de>,
    {
        struct V<T>(PhantomData<T>);
        impl<T: FromStr + TryFrom<i64> + TryFrom<u64> + Default> Visitor<'_> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a 64-bit integer, as a number or a decimal string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
                T::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
                T::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
                v.trim()
                    .parse()
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
            }
            fn visit_unit<E: de::Error>(self) -> Result<T, E> {
                Ok(T::default())
            }
        }
        d.deserialize_any(V::<T>(PhantomData))
    }
}

/// The schema of a 64-bit integer field: a number, or a decimal string.
pub fn int64_schema(_gen: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "64-bit integer, as a number or a decimal string",
        "anyOf": [
            { "type": "integer" },
            { "type": "string", "pattern": "^-?[0-9]+$" }
        ]
    })
}

// ---------------------------------------------------------------------------------------------
// Oneofs: the wire-side mirrors of the messages that hold one.
// ---------------------------------------------------------------------------------------------

/// Wire-side JSON forms of the messages that contain a `oneof`: in proto3 JSON a oneof's member
/// appears as an ordinary field of the containing object, which serde cannot express on the
/// prost field itself. Each mirror converts to and from its model type; nothing else uses them.
pub mod wire {
    use std::fmt;

    use serde::{Deserialize, Serialize};

    use crate::types::*;

    /// A JSON object that sets more than one member of a oneof, or (for the envelopes) none.
    #[derive(Debug)]
    pub struct OneofError(String);

    impl fmt::Display for OneofError {
        fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    fn one_of<T>(oneof: &str, members: Vec<(&str, Option<T>)>) -> Result<Option<T>, OneofError> {
        let mut set = members.into_iter().filter_map(|(n, v)| v.map(|v| (n, v)));
        let first = set.next();
        if let Some((second, _)) = set.next() {
            let first_name = first.as_ref().map(|(n, _)| *n).unwrap_or_default();
            return Err(OneofError(format!(
                "`{first_name}` and `{second}` both set, but they are members of oneof `{oneof}`"
            )));
        }
        Ok(first.map(|(_, v)| v))
    }

    macro_rules! envelope {
        ($json:ident, $msg:ident, $module:ident, $doc:literal;
         $($variant:ident: $ty:ty = $field:ident / $camel:literal),* $(,)?) => {
            #[doc = $doc]
            #[derive(Default, Serialize, Deserialize, schemars::JsonSchema)]
            #[serde(default, deny_unknown_fields)]
            #[schemars(title = stringify!($msg))]
            pub struct $json {
                /// Log correlation only.
                #[serde(
                    alias = "sequenceNumber",
                    skip_serializing_if = "crate::json::is_default",
                    with = "crate::json::int64"
                )]
                #[schemars(schema_with = "crate::json::int64_schema")]
                pub sequence_number: u64,
                $(
                    #[serde(alias = $camel, skip_serializing_if = "Option::is_none")]
                    pub $field: Option<$ty>,
                )*
            }

            impl TryFrom<$json> for $msg {
                type Error = OneofError;
                fn try_from(j: $json) -> Result<Self, OneofError> {
                    use $module::Payload;
                    let payload = one_of(
                        "payload",
                        vec![$((stringify!($field), j.$field.map(Payload::$variant))),*],
                    )?;
                    if payload.is_none() {
                        return Err(OneofError(format!(
                            "no payload: a {} sets exactly one of {}",
                            stringify!($msg),
                            [$(stringify!($field)),*].join(", ")
                        )));
                    }
                    Ok($msg { sequence_number: j.sequence_number, payload })
                }
            }

            impl From<$msg> for $json {
                fn from(m: $msg) -> Self {
                    use $module::Payload;
                    let mut j = $json { sequence_number: m.sequence_number, ..Default::default() };
                    match m.payload {
                        $(Some(Payload::$variant(p)) => j.$field = Some(p),)*
                        None => {}
                    }
                    j
                }
            }

            impl $msg {
                /// The payload's proto field name (`ipset_update`, …), or `none`.
                pub fn kind(&self) -> &'static str {
                    use $module::Payload;
                    match &self.payload {
                        $(Some(Payload::$variant(_)) => stringify!($field),)*
                        None => "none",
                    }
                }
            }
        };
    }

    envelope! {
        ToDataplaneJson, ToDataplane, to_dataplane,
        "`ToDataplane` in proto3 JSON: `sequence_number` and exactly one payload field.";
        InSync: InSync = in_sync / "inSync",
        IpsetUpdate: IpSetUpdate = ipset_update / "ipsetUpdate",
        IpsetDeltaUpdate: IpSetDeltaUpdate = ipset_delta_update / "ipsetDeltaUpdate",
        IpsetRemove: IpSetRemove = ipset_remove / "ipsetRemove",
        ActiveProfileUpdate: ActiveProfileUpdate = active_profile_update / "activeProfileUpdate",
        ActiveProfileRemove: ActiveProfileRemove = active_profile_remove / "activeProfileRemove",
        ActivePolicyUpdate: ActivePolicyUpdate = active_policy_update / "activePolicyUpdate",
        ActivePolicyRemove: ActivePolicyRemove = active_policy_remove / "activePolicyRemove",
        HostEndpointUpdate: HostEndpointUpdate = host_endpoint_update / "hostEndpointUpdate",
        HostEndpointRemove: HostEndpointRemove = host_endpoint_remove / "hostEndpointRemove",
        WorkloadEndpointUpdate: WorkloadEndpointUpdate = workload_endpoint_update / "workloadEndpointUpdate",
        WorkloadEndpointRemove: WorkloadEndpointRemove = workload_endpoint_remove / "workloadEndpointRemove",
        ConfigUpdate: ConfigUpdate = config_update / "configUpdate",
        HostMetadataUpdate: HostMetadataUpdate = host_metadata_update / "hostMetadataUpdate",
        HostMetadataRemove: HostMetadataRemove = host_metadata_remove / "hostMetadataRemove",
        IpamPoolUpdate: IpamPoolUpdate = ipam_pool_update / "ipamPoolUpdate",
        IpamPoolRemove: IpamPoolRemove = ipam_pool_remove / "ipamPoolRemove",
        ServiceAccountUpdate: ServiceAccountUpdate = service_account_update / "serviceAccountUpdate",
        ServiceAccountRemove: ServiceAccountRemove = service_account_remove / "serviceAccountRemove",
        NamespaceUpdate: NamespaceUpdate = namespace_update / "namespaceUpdate",
        NamespaceRemove: NamespaceRemove = namespace_remove / "namespaceRemove",
        RouteUpdate: RouteUpdate = route_update / "routeUpdate",
        RouteRemove: RouteRemove = route_remove / "routeRemove",
        VtepUpdate: VxlanTunnelEndpointUpdate = vtep_update / "vtepUpdate",
        VtepRemove: VxlanTunnelEndpointRemove = vtep_remove / "vtepRemove",
        WireguardEndpointUpdate: WireguardEndpointUpdate = wireguard_endpoint_update / "wireguardEndpointUpdate",
        WireguardEndpointRemove: WireguardEndpointRemove = wireguard_endpoint_remove / "wireguardEndpointRemove",
        GlobalBgpConfigUpdate: GlobalBgpConfigUpdate = global_bgp_config_update / "globalBgpConfigUpdate",
        Encapsulation: Encapsulation = encapsulation / "encapsulation",
        ServiceUpdate: ServiceUpdate = service_update / "serviceUpdate",
        ServiceRemove: ServiceRemove = service_remove / "serviceRemove",
        WireguardEndpointV6Update: WireguardEndpointV6Update = wireguard_endpoint_v6_update / "wireguardEndpointV6Update",
        WireguardEndpointV6Remove: WireguardEndpointV6Remove = wireguard_endpoint_v6_remove / "wireguardEndpointV6Remove",
        HostMetadataV6Update: HostMetadataV6 = host_metadata_v6_update / "hostMetadataV6Update",
        HostMetadataV6Remove: HostMetadataV6 = host_metadata_v6_remove / "hostMetadataV6Remove",
        HostMetadataV4v6Update: HostMetadataUpdate = host_metadata_v4v6_update / "hostMetadataV4v6Update",
        HostMetadataV4v6Remove: HostMetadataRemove = host_metadata_v4v6_remove / "hostMetadataV4v6Remove"
    }

    envelope! {
        FromDataplaneJson, FromDataplane, from_dataplane,
        "`FromDataplane` in proto3 JSON: `sequence_number` and exactly one payload field.";
        ProcessStatusUpdate: ProcessStatusUpdate = process_status_update / "processStatusUpdate",
        HostEndpointStatusUpdate: HostEndpointStatusUpdate = host_endpoint_status_update / "hostEndpointStatusUpdate",
        HostEndpointStatusRemove: HostEndpointStatusRemove = host_endpoint_status_remove / "hostEndpointStatusRemove",
        WorkloadEndpointStatusUpdate: WorkloadEndpointStatusUpdate = workload_endpoint_status_update / "workloadEndpointStatusUpdate",
        WorkloadEndpointStatusRemove: WorkloadEndpointStatusRemove = workload_endpoint_status_remove / "workloadEndpointStatusRemove",
        WireguardStatusUpdate: WireguardStatusUpdate = wireguard_status_update / "wireguardStatusUpdate",
        DataplaneInSync: DataplaneInSync = dataplane_in_sync / "dataplaneInSync"
    }

    /// `Rule` in proto3 JSON: the `icmp` and `not_icmp` oneofs appear as their member fields.
    #[derive(Default, Serialize, Deserialize, schemars::JsonSchema)]
    #[serde(default, deny_unknown_fields)]
    #[schemars(title = "Rule")]
    pub struct RuleJson {
        /// `""`/`allow`, `deny`, `pass`/`next-tier`, `log`.
        #[serde(skip_serializing_if = "String::is_empty")]
        pub action: String,
        #[serde(
            alias = "ipVersion",
            skip_serializing_if = "crate::json::is_default",
            serialize_with = "crate::json::ser_enum::<IpVersion, _>",
            deserialize_with = "crate::json::de_enum::<IpVersion, _>"
        )]
        #[schemars(schema_with = "crate::json::enum_schema::<IpVersion>")]
        pub ip_version: i32,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub protocol: Option<Protocol>,
        #[serde(alias = "srcNet", skip_serializing_if = "Vec::is_empty")]
        pub src_net: Vec<String>,
        #[serde(alias = "srcPorts", skip_serializing_if = "Vec::is_empty")]
        pub src_ports: Vec<PortRange>,
        #[serde(alias = "srcNamedPortIpSetIds", skip_serializing_if = "Vec::is_empty")]
        pub src_named_port_ip_set_ids: Vec<String>,
        #[serde(alias = "dstNet", skip_serializing_if = "Vec::is_empty")]
        pub dst_net: Vec<String>,
        #[serde(alias = "dstPorts", skip_serializing_if = "Vec::is_empty")]
        pub dst_ports: Vec<PortRange>,
        #[serde(alias = "dstNamedPortIpSetIds", skip_serializing_if = "Vec::is_empty")]
        pub dst_named_port_ip_set_ids: Vec<String>,
        #[serde(alias = "icmpType", skip_serializing_if = "Option::is_none")]
        pub icmp_type: Option<i32>,
        #[serde(alias = "icmpTypeCode", skip_serializing_if = "Option::is_none")]
        pub icmp_type_code: Option<IcmpTypeAndCode>,
        #[serde(alias = "srcIpSetIds", skip_serializing_if = "Vec::is_empty")]
        pub src_ip_set_ids: Vec<String>,
        #[serde(alias = "dstIpSetIds", skip_serializing_if = "Vec::is_empty")]
        pub dst_ip_set_ids: Vec<String>,
        /// IP sets on which both IP and port are matched.
        #[serde(alias = "dstIpPortSetIds", skip_serializing_if = "Vec::is_empty")]
        pub dst_ip_port_set_ids: Vec<String>,

        #[serde(alias = "notProtocol", skip_serializing_if = "Option::is_none")]
        pub not_protocol: Option<Protocol>,
        #[serde(alias = "notSrcNet", skip_serializing_if = "Vec::is_empty")]
        pub not_src_net: Vec<String>,
        #[serde(alias = "notSrcPorts", skip_serializing_if = "Vec::is_empty")]
        pub not_src_ports: Vec<PortRange>,
        #[serde(alias = "notDstNet", skip_serializing_if = "Vec::is_empty")]
        pub not_dst_net: Vec<String>,
        #[serde(alias = "notDstPorts", skip_serializing_if = "Vec::is_empty")]
        pub not_dst_ports: Vec<PortRange>,
        #[serde(alias = "notIcmpType", skip_serializing_if = "Option::is_none")]
        pub not_icmp_type: Option<i32>,
        #[serde(alias = "notIcmpTypeCode", skip_serializing_if = "Option::is_none")]
        pub not_icmp_type_code: Option<IcmpTypeAndCode>,
        #[serde(alias = "notSrcIpSetIds", skip_serializing_if = "Vec::is_empty")]
        pub not_src_ip_set_ids: Vec<String>,
        #[serde(alias = "notDstIpSetIds", skip_serializing_if = "Vec::is_empty")]
        pub not_dst_ip_set_ids: Vec<String>,
        #[serde(
            alias = "notSrcNamedPortIpSetIds",
            skip_serializing_if = "Vec::is_empty"
        )]
        pub not_src_named_port_ip_set_ids: Vec<String>,
        #[serde(
            alias = "notDstNamedPortIpSetIds",
            skip_serializing_if = "Vec::is_empty"
        )]
        pub not_dst_named_port_ip_set_ids: Vec<String>,

        // Pass-through fields: ignored by the renderer, kept so they round-trip.
        #[serde(
            alias = "originalSrcSelector",
            skip_serializing_if = "String::is_empty"
        )]
        pub original_src_selector: String,
        #[serde(
            alias = "originalDstSelector",
            skip_serializing_if = "String::is_empty"
        )]
        pub original_dst_selector: String,
        #[serde(
            alias = "originalSrcNamespaceSelector",
            skip_serializing_if = "String::is_empty"
        )]
        pub original_src_namespace_selector: String,
        #[serde(
            alias = "originalDstNamespaceSelector",
            skip_serializing_if = "String::is_empty"
        )]
        pub original_dst_namespace_selector: String,
        #[serde(
            alias = "originalNotSrcSelector",
            skip_serializing_if = "String::is_empty"
        )]
        pub original_not_src_selector: String,
        #[serde(
            alias = "originalNotDstSelector",
            skip_serializing_if = "String::is_empty"
        )]
        pub original_not_dst_selector: String,
        #[serde(
            alias = "srcServiceAccountMatch",
            skip_serializing_if = "Option::is_none"
        )]
        pub src_service_account_match: Option<ServiceAccountMatch>,
        #[serde(
            alias = "dstServiceAccountMatch",
            skip_serializing_if = "Option::is_none"
        )]
        pub dst_service_account_match: Option<ServiceAccountMatch>,
        #[serde(alias = "httpMatch", skip_serializing_if = "Option::is_none")]
        pub http_match: Option<HttpMatch>,
        /// Annotations are rendered as extra rule comments `k=v`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub metadata: Option<RuleMetadata>,
        #[serde(alias = "originalDstService", skip_serializing_if = "String::is_empty")]
        pub original_dst_service: String,
        #[serde(
            alias = "originalDstServiceNamespace",
            skip_serializing_if = "String::is_empty"
        )]
        pub original_dst_service_namespace: String,
        #[serde(alias = "originalSrcService", skip_serializing_if = "String::is_empty")]
        pub original_src_service: String,
        #[serde(
            alias = "originalSrcServiceNamespace",
            skip_serializing_if = "String::is_empty"
        )]
        pub original_src_service_namespace: String,
        /// An opaque ID/hash for the rule.
        #[serde(alias = "ruleId", skip_serializing_if = "String::is_empty")]
        pub rule_id: String,
    }

    impl TryFrom<RuleJson> for Rule {
        type Error = OneofError;
        fn try_from(j: RuleJson) -> Result<Self, OneofError> {
            use crate::types::rule::{Icmp, NotIcmp};
            let icmp = one_of(
                "icmp",
                vec![
                    ("icmp_type", j.icmp_type.map(Icmp::IcmpType)),
                    ("icmp_type_code", j.icmp_type_code.map(Icmp::IcmpTypeCode)),
                ],
            )?;
            let not_icmp = one_of(
                "not_icmp",
                vec![
                    ("not_icmp_type", j.not_icmp_type.map(NotIcmp::NotIcmpType)),
                    (
                        "not_icmp_type_code",
                        j.not_icmp_type_code.map(NotIcmp::NotIcmpTypeCode),
                    ),
                ],
            )?;
            Ok(Rule {
                action: j.action,
                ip_version: j.ip_version,
                protocol: j.protocol,
                src_net: j.src_net,
                src_ports: j.src_ports,
                src_named_port_ip_set_ids: j.src_named_port_ip_set_ids,
                dst_net: j.dst_net,
                dst_ports: j.dst_ports,
                dst_named_port_ip_set_ids: j.dst_named_port_ip_set_ids,
                src_ip_set_ids: j.src_ip_set_ids,
                dst_ip_set_ids: j.dst_ip_set_ids,
                dst_ip_port_set_ids: j.dst_ip_port_set_ids,
                not_protocol: j.not_protocol,
                not_src_net: j.not_src_net,
                not_src_ports: j.not_src_ports,
                not_dst_net: j.not_dst_net,
                not_dst_ports: j.not_dst_ports,
                not_src_ip_set_ids: j.not_src_ip_set_ids,
                not_dst_ip_set_ids: j.not_dst_ip_set_ids,
                not_src_named_port_ip_set_ids: j.not_src_named_port_ip_set_ids,
                not_dst_named_port_ip_set_ids: j.not_dst_named_port_ip_set_ids,
                original_src_selector: j.original_src_selector,
                original_dst_selector: j.original_dst_selector,
                original_src_namespace_selector: j.original_src_namespace_selector,
                original_dst_namespace_selector: j.original_dst_namespace_selector,
                original_not_src_selector: j.original_not_src_selector,
                original_not_dst_selector: j.original_not_dst_selector,
                src_service_account_match: j.src_service_account_match,
                dst_service_account_match: j.dst_service_account_match,
                http_match: j.http_match,
                metadata: j.metadata,
                original_dst_service: j.original_dst_service,
                original_dst_service_namespace: j.original_dst_service_namespace,
                original_src_service: j.original_src_service,
                original_src_service_namespace: j.original_src_service_namespace,
                rule_id: j.rule_id,
                icmp,
                not_icmp,
            })
        }
    }

    impl From<Rule> for RuleJson {
        fn from(r: Rule) -> Self {
            use crate::types::rule::{Icmp, NotIcmp};
            let (icmp_type, icmp_type_code) = match r.icmp {
                Some(Icmp::IcmpType(t)) => (Some(t), None),
                Some(Icmp::IcmpTypeCode(tc)) => (None, Some(tc)),
                None => (None, None),
            };
            let (not_icmp_type, not_icmp_type_code) = match r.not_icmp {
                Some(NotIcmp::NotIcmpType(t)) => (Some(t), None),
                Some(NotIcmp::NotIcmpTypeCode(tc)) => (None, Some(tc)),
                None => (None, None),
            };
            RuleJson {
                action: r.action,
                ip_version: r.ip_version,
                protocol: r.protocol,
                src_net: r.src_net,
                src_ports: r.src_ports,
                src_named_port_ip_set_ids: r.src_named_port_ip_set_ids,
                dst_net: r.dst_net,
                dst_ports: r.dst_ports,
                dst_named_port_ip_set_ids: r.dst_named_port_ip_set_ids,
                src_ip_set_ids: r.src_ip_set_ids,
                dst_ip_set_ids: r.dst_ip_set_ids,
                dst_ip_port_set_ids: r.dst_ip_port_set_ids,
                not_protocol: r.not_protocol,
                not_src_net: r.not_src_net,
                not_src_ports: r.not_src_ports,
                not_dst_net: r.not_dst_net,
                not_dst_ports: r.not_dst_ports,
                not_src_ip_set_ids: r.not_src_ip_set_ids,
                not_dst_ip_set_ids: r.not_dst_ip_set_ids,
                not_src_named_port_ip_set_ids: r.not_src_named_port_ip_set_ids,
                not_dst_named_port_ip_set_ids: r.not_dst_named_port_ip_set_ids,
                original_src_selector: r.original_src_selector,
                original_dst_selector: r.original_dst_selector,
                original_src_namespace_selector: r.original_src_namespace_selector,
                original_dst_namespace_selector: r.original_dst_namespace_selector,
                original_not_src_selector: r.original_not_src_selector,
                original_not_dst_selector: r.original_not_dst_selector,
                src_service_account_match: r.src_service_account_match,
                dst_service_account_match: r.dst_service_account_match,
                http_match: r.http_match,
                metadata: r.metadata,
                original_dst_service: r.original_dst_service,
                original_dst_service_namespace: r.original_dst_service_namespace,
                original_src_service: r.original_src_service,
                original_src_service_namespace: r.original_src_service_namespace,
                rule_id: r.rule_id,
                icmp_type,
                icmp_type_code,
                not_icmp_type,
                not_icmp_type_code,
            }
        }
    }

    /// `Protocol` in proto3 JSON: `{"name":"tcp"}` or `{"number":6}`.
    #[derive(Default, Serialize, Deserialize, schemars::JsonSchema)]
    #[serde(default, deny_unknown_fields)]
    #[schemars(title = "Protocol")]
    pub struct ProtocolJson {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub number: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub name: Option<String>,
    }

    impl TryFrom<ProtocolJson> for Protocol {
        type Error = OneofError;
        fn try_from(j: ProtocolJson) -> Result<Self, OneofError> {
            use crate::types::protocol::NumberOrName;
            Ok(Protocol {
                number_or_name: one_of(
                    "number_or_name",
                    vec![
                        ("number", j.number.map(NumberOrName::Number)),
                        ("name", j.name.map(NumberOrName::Name)),
                    ],
                )?,
            })
        }
    }

    impl From<Protocol> for ProtocolJson {
        fn from(p: Protocol) -> Self {
            use crate::types::protocol::NumberOrName;
            match p.number_or_name {
                Some(NumberOrName::Number(n)) => ProtocolJson {
                    number: Some(n),
                    name: None,
                },
                Some(NumberOrName::Name(s)) => ProtocolJson {
                    number: None,
                    name: Some(s),
                },
                None => ProtocolJson::default(),
            }
        }
    }

    /// `HTTPMatch.PathMatch` in proto3 JSON: `{"exact":"/x"}` or `{"prefix":"/x"}`.
    #[derive(Default, Serialize, Deserialize, schemars::JsonSchema)]
    #[serde(default, deny_unknown_fields)]
    #[schemars(title = "PathMatch")]
    pub struct PathMatchJson {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub exact: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub prefix: Option<String>,
    }

    impl TryFrom<PathMatchJson> for crate::types::http_match::PathMatch {
        type Error = OneofError;
        fn try_from(j: PathMatchJson) -> Result<Self, OneofError> {
            use crate::types::http_match::path_match::PathMatch as P;
            Ok(Self {
                path_match: one_of(
                    "path_match",
                    vec![
                        ("exact", j.exact.map(P::Exact)),
                        ("prefix", j.prefix.map(P::Prefix)),
                    ],
                )?,
            })
        }
    }

    impl From<crate::types::http_match::PathMatch> for PathMatchJson {
        fn from(p: crate::types::http_match::PathMatch) -> Self {
            use crate::types::http_match::path_match::PathMatch as P;
            match p.path_match {
                Some(P::Exact(s)) => PathMatchJson {
                    exact: Some(s),
                    prefix: None,
                },
                Some(P::Prefix(s)) => PathMatchJson {
                    exact: None,
                    prefix: Some(s),
                },
                None => PathMatchJson::default(),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// JSON Schemas (checked in under schemas/, kept current by crates/felix-api/tests/it/proto_schema.rs).
// ---------------------------------------------------------------------------------------------

/// The JSON Schema of one message in the JSON stream: a `ToDataplane`.
pub fn message_schema() -> Schema {
    let mut schema = schemars::schema_for!(ToDataplane);
    schema.insert(
        "description".into(),
        "One Felix `ToDataplane` message in proto3 JSON with the proto's field names: \
         `sequence_number` and exactly one payload field. felix-nft \
         also accepts the lowerCamelCase spelling of every field name, which this schema does \
         not list."
            .into(),
    );
    schema
}

/// The JSON Schema of a state document in its array form. (The other form, one message per
/// line, is a sequence of documents each matching [`message_schema`].)
pub fn state_schema() -> Schema {
    let mut schema = schemars::schema_for!(Vec<ToDataplane>);
    schema.insert("title".into(), "felix-nft state document".into());
    schema.insert(
        "description".into(),
        "The whole desired state of a node: `ToDataplane` messages applied in order to an \
         empty dataplane, then `in_sync`. Also accepted: the same messages one per line."
            .into(),
    );
    schema
}
