//! A flow as it is reported: its key (who talked to whom, how, and which policies decided) and
//! what was counted for it over one interval. Field for field what Goldmane's `FlowKey`, `Flow`
//! and `PolicyHit` carry (`goldmane/proto/api.proto`), in serde form for the local view.

use serde::{Deserialize, Serialize};

/// What kind of thing an end of a flow is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointKind {
    /// A workload endpoint of this node (a pod's interface).
    Workload,
    /// A host endpoint of this node.
    Host,
    /// Anything else: a remote workload, another node, the internet. The driver protocol
    /// names only this node's endpoints.
    Network,
}

/// One end of a flow.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    pub kind: EndpointKind,
    /// A workload's pod name, a host endpoint's name, or a network end's address.
    pub name: String,
    /// A workload's namespace; empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The node a network end's address routes to, where this node's routes say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Which side of the flow reported it: the source's egress policy (NFLOG group 2) or the
/// destination's ingress policy (group 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reporter {
    Src,
    Dst,
}

/// What a flow's policy decided, or what one hit of its trace did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Deny,
    Pass,
}

/// Whose rule a hit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// A Calico network policy (namespaced).
    CalicoNetworkPolicy,
    /// A Calico global network policy.
    GlobalNetworkPolicy,
    /// A Kubernetes network policy.
    NetworkPolicy,
    /// A staged policy of any of the above kinds.
    Staged,
    /// A profile (Kubernetes namespace or service account defaults).
    Profile,
    /// The end of a tier, where no policy of it decided.
    EndOfTier,
    /// No profile matched: the endpoint's final drop.
    NoProfile,
}

/// One step of a flow's policy trace, in order of evaluation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PolicyHit {
    pub kind: PolicyKind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The policy's or profile's name; empty for an end of tier or no profile.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The tier; empty for profiles.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tier: String,
    pub action: Verdict,
    /// The policy's position among those of its tier that apply to the endpoint, from 0;
    /// -1 where unknown (the prefix does not carry it).
    pub policy_index: i64,
    /// The rule's index in its direction, from 0; -1 for an end of tier or no profile.
    pub rule_index: i64,
}

/// What identifies a flow: every field of Goldmane's `FlowKey` felix-nft can fill (services are
/// not: the driver protocol carries none).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FlowKey {
    pub src: Endpoint,
    pub dst: Endpoint,
    /// IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6, …).
    pub proto: u8,
    /// The destination port (0 for protocols without ports).
    pub dest_port: u16,
    pub reporter: Reporter,
    /// The final verdict of the trace: allow or deny.
    pub action: Verdict,
    /// The enforced policy trace.
    pub trace: Vec<PolicyHit>,
}

/// A flow's counts over one interval, `[start, end)` in seconds since the Unix epoch.
/// `in`/`out` are from the reporter's side: for the source, out is what it sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    pub key: FlowKey,
    pub start_time: i64,
    pub end_time: i64,
    pub packets_in: u64,
    pub packets_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub connections_started: u64,
    pub connections_completed: u64,
    pub connections_live: u64,
}
