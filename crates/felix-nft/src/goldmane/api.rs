//! Goldmane's flow API (`goldmane/proto/api.proto`, package `goldmane`) as Rust types: the
//! messages of the `FlowCollector.Connect` stream and the enums they use, nothing else of
//! Goldmane's query API.
//!
//! Field names and numbers are exactly those of `api.proto` (the messages we use are copied to
//! `tests/fixtures/goldmane.proto`, and `crates/felix-nft/tests/it/goldmane_export.rs` decodes what the exporter sent
//! with `protoc` against it). The prost derives are written by hand, as in [`felix_api`]: the
//! build needs no `protoc`. Enum-typed fields are `i32` (prost's convention: an unknown value
//! survives a round trip).

/// The gRPC method the exporter calls: `service FlowCollector { rpc Connect(stream FlowUpdate)
/// returns (stream FlowReceipt); }`.
pub const CONNECT_PATH: &str = "/goldmane.FlowCollector/Connect";

/// `FlowUpdate`: one flow, as the client streams them.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct FlowUpdate {
    #[prost(message, optional, tag = "1")]
    pub flow: Option<Flow>,
}

/// `FlowReceipt`: Goldmane's answer to each `FlowUpdate`, empty.
#[derive(Clone, Copy, PartialEq, ::prost::Message)]
pub struct FlowReceipt {}

/// `Flow`: a flow's key and what was counted for it over `[start_time, end_time]`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Flow {
    /// `Key` (capitalised in `api.proto`).
    #[prost(message, optional, tag = "1")]
    pub key: Option<FlowKey>,
    /// Seconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub start_time: i64,
    #[prost(int64, tag = "3")]
    pub end_time: i64,
    /// `key=value` labels common to every source pod of the flow.
    #[prost(string, repeated, tag = "4")]
    pub source_labels: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub dest_labels: Vec<String>,
    #[prost(int64, tag = "6")]
    pub packets_in: i64,
    #[prost(int64, tag = "7")]
    pub packets_out: i64,
    #[prost(int64, tag = "8")]
    pub bytes_in: i64,
    #[prost(int64, tag = "9")]
    pub bytes_out: i64,
    #[prost(int64, tag = "10")]
    pub num_connections_started: i64,
    #[prost(int64, tag = "11")]
    pub num_connections_completed: i64,
    #[prost(int64, tag = "12")]
    pub num_connections_live: i64,
}

/// `FlowKey`: what identifies a flow.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct FlowKey {
    #[prost(string, tag = "1")]
    pub source_name: String,
    #[prost(string, tag = "2")]
    pub source_namespace: String,
    #[prost(enumeration = "EndpointType", tag = "3")]
    pub source_type: i32,
    #[prost(string, tag = "4")]
    pub dest_name: String,
    #[prost(string, tag = "5")]
    pub dest_namespace: String,
    #[prost(enumeration = "EndpointType", tag = "6")]
    pub dest_type: i32,
    #[prost(int64, tag = "7")]
    pub dest_port: i64,
    #[prost(string, tag = "8")]
    pub dest_service_name: String,
    #[prost(string, tag = "9")]
    pub dest_service_namespace: String,
    #[prost(string, tag = "10")]
    pub dest_service_port_name: String,
    #[prost(int64, tag = "11")]
    pub dest_service_port: i64,
    /// The L4 protocol by name (`tcp`, `udp`, …) or number.
    #[prost(string, tag = "12")]
    pub proto: String,
    #[prost(enumeration = "Reporter", tag = "13")]
    pub reporter: i32,
    #[prost(enumeration = "Action", tag = "14")]
    pub action: i32,
    #[prost(message, optional, tag = "15")]
    pub policies: Option<PolicyTrace>,
}

/// `PolicyTrace`: the policy rules a flow went through.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct PolicyTrace {
    /// The rules the dataplane enforced, in order of evaluation.
    #[prost(message, repeated, tag = "1")]
    pub enforced_policies: Vec<PolicyHit>,
    /// The rules the flow would go through with staged policies enforced.
    #[prost(message, repeated, tag = "2")]
    pub pending_policies: Vec<PolicyHit>,
}

/// `PolicyHit`: one policy rule (or end of tier) a flow went through.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct PolicyHit {
    #[prost(enumeration = "PolicyKind", tag = "1")]
    pub kind: i32,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub tier: String,
    #[prost(enumeration = "Action", tag = "5")]
    pub action: i32,
    /// The hit's position among all the hits of the trace.
    #[prost(int64, tag = "6")]
    pub policy_index: i64,
    /// The rule's index in its policy; -1 for an end of tier.
    #[prost(int64, tag = "7")]
    pub rule_index: i64,
    /// For an end of tier only: the policy of the tier that selected the endpoint, whose tier's
    /// default action applied.
    #[prost(message, optional, boxed, tag = "8")]
    pub trigger: Option<Box<PolicyHit>>,
}

/// `Action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum Action {
    ActionUnspecified = 0,
    Allow = 1,
    Deny = 2,
    Pass = 3,
}

/// `EndpointType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum EndpointType {
    EndpointTypeUnspecified = 0,
    /// A pod (or other workload with its own network identity).
    WorkloadEndpoint = 1,
    HostEndpoint = 2,
    /// An address of a (global) network set.
    NetworkSet = 3,
    /// An address Calico knows nothing of, named `pub` or `pvt`.
    Network = 4,
}

/// `Reporter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum Reporter {
    ReporterUnspecified = 0,
    Src = 1,
    Dst = 2,
}

/// `PolicyKind` (7 and 8, the admin network policies, are reserved in `api.proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum PolicyKind {
    KindUnspecified = 0,
    CalicoNetworkPolicy = 1,
    GlobalNetworkPolicy = 2,
    StagedNetworkPolicy = 3,
    StagedGlobalNetworkPolicy = 4,
    StagedKubernetesNetworkPolicy = 5,
    NetworkPolicy = 6,
    Profile = 9,
    EndOfTier = 10,
    ClusterNetworkPolicy = 11,
}
