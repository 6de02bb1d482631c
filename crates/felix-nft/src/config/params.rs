//! The parameter table (§3.2): every parameter felix-nft knows, with its canonical
//! Felix name, kind, raw default, flags and a one-line description — and, generated from the
//! same rows, the typed [`Config`] the rest of the agent reads. One macro invocation keeps the
//! two from drifting apart: adding a row adds both the table entry and the field.
//!
//! Parameters that are felix-nft's own (not Felix's) carry the [`flags::OURS`] flag.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::IpNet;
use schemars::JsonSchema;
use serde::Serialize;

use super::parse::{
    secs_f64, FailsafePort, IfaceMatch, KeyDuration, Kind, Pattern, PortRange, RateLimit,
    RouteTableRange, Value,
};

/// Flag bits of a [`ParamSpec`].
pub mod flags {
    /// A bad value stops the load (Felix's `die-on-fail`); otherwise the default is used.
    pub const DIE_ON_FAIL: u8 = 1;
    /// The zero value (`none`, `0`, empty list) is refused (Felix's `non-zero`).
    pub const NON_ZERO: u8 = 2;
    /// Ignored from datastore sources (Felix's `local`); felix-nft has no datastore source, so
    /// this only documents the parameter.
    pub const LOCAL: u8 = 4;
    /// felix-nft's own parameter, not one of Felix's.
    pub const OURS: u8 = 8;
    /// Accepted for compatibility (iptables mode, BPF, Felix process) and not acted on by
    /// felix-nft, which always runs the nftables dataplane.
    pub const INERT: u8 = 16;
}
use flags::{DIE_ON_FAIL as DIE, INERT, LOCAL, NON_ZERO as NZ, OURS};

/// One row of the parameter table.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    /// Canonical Felix name (`NftablesMarkMask`); matching is case-insensitive.
    pub name: &'static str,
    /// The [`Config`] field it fills.
    pub field: &'static str,
    /// How its raw value is parsed.
    pub kind: Kind,
    /// The default in Felix's raw syntax; empty = unset.
    pub default: &'static str,
    /// Bits from [`flags`].
    pub flags: u8,
    /// One line for `config show` and the schema.
    pub description: &'static str,
}

impl ParamSpec {
    /// A bad value stops the load.
    pub fn die_on_fail(&self) -> bool {
        self.flags & flags::DIE_ON_FAIL != 0
    }
    /// The zero value (`none`) is refused.
    pub fn non_zero(&self) -> bool {
        self.flags & flags::NON_ZERO != 0
    }
    /// Felix ignores it from datastore sources.
    pub fn local(&self) -> bool {
        self.flags & flags::LOCAL != 0
    }
    /// felix-nft's own parameter.
    pub fn ours(&self) -> bool {
        self.flags & flags::OURS != 0
    }
    /// Accepted for compatibility; felix-nft does not act on it.
    pub fn inert(&self) -> bool {
        self.flags & flags::INERT != 0
    }
}

/// Looks a parameter up by name, case-insensitively (Felix lower-cases every source's keys).
pub fn find(name: &str) -> Option<&'static ParamSpec> {
    PARAMS.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// Converts a parsed [`Value`] into a [`Config`] field type. `None` means the table pairs a
/// kind with a field type that cannot hold it: a bug in the table, caught by the tests that
/// parse every default and sample value.
pub trait FromValue: Sized {
    /// `None` if `v` is not a value of this type.
    fn from_value(v: Value) -> Option<Self>;
}

macro_rules! from_value {
    ($ty:ty, $($pat:pat $(if $guard:expr)? => $e:expr),+ $(,)?) => {
        impl FromValue for $ty {
            fn from_value(v: Value) -> Option<Self> {
                #[allow(unreachable_patterns)]
                match v { $($pat $(if $guard)? => $e,)+ _ => None }
            }
        }
    };
}
from_value!(bool, Value::Bool(b) => Some(b));
from_value!(Option<bool>, Value::Unset => Some(None), Value::Bool(b) => Some(Some(b)));
from_value!(Duration, Value::Duration(d) => Some(d));
from_value!(u32, Value::UInt(n) => u32::try_from(n).ok(), Value::Mask(m) => Some(m));
from_value!(u16, Value::UInt(n) => u16::try_from(n).ok());
from_value!(u8, Value::UInt(n) => u8::try_from(n).ok());
from_value!(String, Value::Text(s) => Some(s));
from_value!(Option<String>, Value::Unset => Some(None),
    Value::Text(s) => Some(if s.is_empty() { None } else { Some(s) }));
from_value!(Vec<String>, Value::Strings(v) => Some(v));
from_value!(Vec<IfaceMatch>, Value::Excludes(v) => Some(v));
from_value!(Vec<FailsafePort>, Value::Ports(v) => Some(v));
from_value!(Option<PortRange>, Value::Unset => Some(None), Value::PortRange(r) => Some(Some(r)));
from_value!(Vec<PortRange>, Value::PortRanges(v) => Some(v));
from_value!(Option<Ipv4Addr>, Value::Unset => Some(None),
    Value::Ip(std::net::IpAddr::V4(ip)) => Some(Some(ip)));
from_value!(Option<Ipv6Addr>, Value::Unset => Some(None),
    Value::Ip(std::net::IpAddr::V6(ip)) => Some(Some(ip)));
from_value!(Vec<IpNet>, Value::Nets(v) => Some(v));
from_value!(Option<RateLimit>, Value::Unset => Some(None), Value::RateLimit(r) => Some(Some(r)));
from_value!(Vec<RouteTableRange>, Value::TableRanges(v) => Some(v));
from_value!(Option<RouteTableRange>, Value::Unset => Some(None),
    Value::TableRanges(v) if v.len() == 1 => Some(v.first().copied()));
from_value!(Vec<KeyDuration>, Value::KeyDurations(v) => Some(v));
from_value!(Option<Pattern>, Value::Unset => Some(None), Value::Pattern(p) => Some(Some(p)));

/// Declares a Felix `oneof` as a Rust enum whose variants serialise as Felix's canonical words.
macro_rules! oneof {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $word:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
        pub enum $name { $( $(#[$vm])* #[serde(rename = $word)] $var ),+ }
        impl $name {
            /// The canonical spellings, in Felix's order.
            pub const WORDS: &'static [&'static str] = &[$($word),+];
            /// The canonical spelling of this value.
            pub fn as_str(self) -> &'static str { match self { $(Self::$var => $word),+ } }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromValue for $name {
            fn from_value(v: Value) -> Option<Self> {
                match v { $(Value::Word($word) => Some(Self::$var),)+ _ => None }
            }
        }
    };
}

oneof!(
    /// `NFTablesMode`: which dataplane Felix programs. felix-nft is always nftables; `Disabled`
    /// is accepted but makes no difference.
    NftablesMode { Enabled = "Enabled", Disabled = "Disabled", Auto = "Auto" }
);
oneof!(
    /// `NFTablesFlowTableOffload`.
    FlowTableOffload { All = "All", Disabled = "Disabled" }
);
oneof!(
    /// `IptablesBackend` (iptables mode only).
    IptablesBackend { Legacy = "legacy", Nft = "nft", Auto = "auto" }
);
oneof!(
    /// What an allow verdict does in filter/mangle chains: accept now, or return to the caller.
    AllowAction { Accept = "ACCEPT", Return = "RETURN" }
);
oneof!(
    /// What a deny verdict does in the filter table.
    DenyAction { Drop = "DROP", Reject = "REJECT" }
);
oneof!(
    /// `DefaultEndpointToHostAction`: workload → host traffic not otherwise allowed.
    EndpointToHostAction { Drop = "DROP", Return = "RETURN", Accept = "ACCEPT" }
);
oneof!(
    /// `ChainInsertMode` (iptables only).
    ChainInsertMode { Insert = "insert", Append = "append" }
);
oneof!(
    /// `NATOutgoingExclusions`: which destinations are never masqueraded.
    NatOutgoingExclusions { IpPoolsOnly = "IPPoolsOnly", IpPoolsAndHostIps = "IPPoolsAndHostIPs" }
);
oneof!(
    /// A plain on/off switch spelled `Enabled|Disabled`.
    EnabledDisabled { Enabled = "Enabled", Disabled = "Disabled" }
);
oneof!(
    /// `ServiceLoopPrevention`: what happens to traffic to an unallocated service IP.
    ServiceLoopPrevention { Drop = "Drop", Reject = "Reject", Disabled = "Disabled" }
);
oneof!(
    /// `RouteSource`: which IPs get routes.
    RouteSource { WorkloadIps = "WorkloadIPs", CalicoIpam = "CalicoIPAM" }
);
oneof!(
    /// `ProgramClusterRoutes`.
    ProgramClusterRoutes {
        Enabled = "Enabled",
        Disabled = "Disabled",
        EnabledIpipOnly = "EnabledIPIPOnly",
        EnabledNoEncapOnly = "EnabledNoEncapOnly",
    }
);
oneof!(
    /// `WorkloadSourceSpoofing`: whether a workload may send from addresses it does not own.
    WorkloadSourceSpoofing { Disabled = "Disabled", Any = "Any" }
);
oneof!(
    /// A log severity.
    LogLevel {
        Trace = "TRACE",
        Debug = "DEBUG",
        Info = "INFO",
        Warning = "WARNING",
        Error = "ERROR",
        Fatal = "FATAL",
    }
);

const ONOFF: Kind = Kind::OneOf(EnabledDisabled::WORDS);
const LOGLEVEL: Kind = Kind::OneOf(LogLevel::WORDS);
const PORT: Kind = Kind::Int { min: 0, max: 65535 };
const U32: Kind = Kind::Int {
    min: 0,
    max: u32::MAX as u64,
};
/// Route metrics: Felix's `int(1:2147483646)`.
const PRIORITY: Kind = Kind::Int {
    min: 1,
    max: 2_147_483_646,
};
const MTU: Kind = Kind::Int { min: 0, max: 65535 };

/// Declares the table rows and the matching [`Config`] fields in one place.
macro_rules! params {
    ($( $(#[$attr:meta])* $field:ident : $ty:ty = $name:literal, $kind:expr, $default:literal, $flags:expr, $desc:literal; )*) => {
        /// The effective configuration, typed. Built by [`super::load`] from defaults < config
        /// file < environment < `ConfigUpdate`; serialised with Felix's canonical names.
        #[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
        #[schemars(title = "felix-nft configuration")]
        pub struct Config {
            $(
                #[schemars(description = $desc)]
                #[schemars(extend("x-felix-default" = $default))]
                #[serde(rename = $name)]
                $(#[$attr])*
                pub $field: $ty,
            )*
        }

        /// Every parameter, in table order.
        pub static PARAMS: &[ParamSpec] = &[$(
            ParamSpec {
                name: $name,
                field: stringify!($field),
                kind: $kind,
                default: $default,
                flags: $flags,
                description: $desc,
            },
        )*];

        impl Config {
            /// Builds the struct from one value per parameter (index = position in
            /// [`PARAMS`]). `Err(name)` names a parameter whose value does not fit its field.
            pub(super) fn from_values(values: Vec<Value>) -> Result<Config, &'static str> {
                let mut it = values.into_iter();
                Ok(Config {$(
                    $field: it.next().and_then(<$ty as FromValue>::from_value).ok_or($name)?,
                )*})
            }
        }
    };
}

params! {
    // --- Driver / process (§1, §3.2) ---
    use_internal_dataplane_driver: bool = "UseInternalDataplaneDriver", Kind::Bool, "true", INERT,
        "Felix: use its built-in dataplane instead of an external driver such as felix-nft.";
    dataplane_driver: String = "DataplaneDriver", Kind::Path, "calico-iptables-plugin", NZ | DIE | INERT,
        "Felix: path of the external dataplane driver it spawns.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    dataplane_watchdog_timeout: Duration = "DataplaneWatchdogTimeout", Kind::Seconds, "90", 0,
        "Seconds the apply loop may go without progress before liveness fails.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    reporting_interval_secs: Duration = "ReportingIntervalSecs", Kind::Seconds, "30", 0,
        "Seconds between ProcessStatusUpdate heartbeats to Felix; 0 disables them.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    reporting_ttl_secs: Duration = "ReportingTTLSecs", Kind::Seconds, "90", 0,
        "Felix: time-to-live of the status it writes to the datastore.";
    endpoint_reporting_enabled: bool = "EndpointReportingEnabled", Kind::Bool, "false", 0,
        "Send per-endpoint status (up/down/error) to Felix.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    endpoint_reporting_delay_secs: Duration = "EndpointReportingDelaySecs", Kind::Seconds, "1", 0,
        "Seconds to coalesce endpoint status changes before reporting them.";
    endpoint_status_path_prefix: Option<String> = "EndpointStatusPathPrefix", Kind::Path, "/var/run/calico", 0,
        "Directory under which per-endpoint status files are written; `none` = no status files.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    netlink_timeout_secs: Duration = "NetlinkTimeoutSecs", Kind::Seconds, "10", 0,
        "Seconds to wait for a netlink reply before giving up on the request.";
    felix_hostname: Option<String> = "FelixHostname", Kind::Hostname, "", LOCAL,
        "This node's name; unset = the kernel host name.";
    variant: String = "Variant", Kind::Text, "Calico", 0,
        "Product variant reported in status.";
    config_file: String = "ConfigFile", Kind::Path, "/etc/calico/felix.cfg", LOCAL | OURS,
        "felix-nft: the INI config file read (set by --config or FELIX_CONFIGFILE; a file cannot name itself).";

    // --- Backend selection ---
    nftables_mode: NftablesMode = "NFTablesMode", Kind::OneOf(NftablesMode::WORDS), "Auto", 0,
        "Felix's dataplane choice; felix-nft always programs nftables.";
    nftables_flow_table_offload: FlowTableOffload = "NFTablesFlowTableOffload",
        Kind::OneOf(FlowTableOffload::WORDS), "Disabled", 0,
        "Offload established flows to an nftables flowtable (All) or not.";
    nftables_flow_table_data_iface_pattern: Option<Pattern> = "NFTablesFlowTableDataIfacePattern",
        Kind::Regex, "", 0,
        "Host interfaces added to the flowtable besides workload interfaces; unset = none.";
    iptables_backend: IptablesBackend = "IptablesBackend", Kind::OneOf(IptablesBackend::WORDS), "auto", INERT,
        "iptables mode: legacy or nft iptables binaries.";
    bpf_enabled: bool = "BPFEnabled", Kind::Bool, "false", INERT,
        "Felix: use the eBPF dataplane (felix-nft does not).";

    // --- Marks and actions (§4; Iptables* = iptables mode, Nftables* = ours) ---
    iptables_mark_mask: u32 = "IptablesMarkMask", Kind::MarkMask, "0xffff0000", NZ | DIE | INERT,
        "iptables mode: packet-mark bits Calico may use.";
    nftables_mark_mask: u32 = "NftablesMarkMask", Kind::MarkMask, "0xffff0000", NZ | DIE,
        "Packet-mark bits felix-nft may use; needs room for accept, pass, drop, scratch0, scratch1 (+ wireguard).";
    iptables_filter_allow_action: AllowAction = "IptablesFilterAllowAction",
        Kind::OneOf(AllowAction::WORDS), "ACCEPT", NZ | DIE | INERT,
        "iptables mode: verdict of an allow in the filter table.";
    nftables_filter_allow_action: AllowAction = "NftablesFilterAllowAction",
        Kind::OneOf(AllowAction::WORDS), "ACCEPT", NZ | DIE,
        "Verdict of an allow in the filter chains: ACCEPT, or RETURN to let later chains decide.";
    iptables_mangle_allow_action: AllowAction = "IptablesMangleAllowAction",
        Kind::OneOf(AllowAction::WORDS), "ACCEPT", NZ | DIE | INERT,
        "iptables mode: verdict of an allow in the mangle table.";
    nftables_mangle_allow_action: AllowAction = "NftablesMangleAllowAction",
        Kind::OneOf(AllowAction::WORDS), "ACCEPT", NZ | DIE,
        "Verdict of an allow in the mangle chains (pre-DNAT policy).";
    iptables_filter_deny_action: DenyAction = "IptablesFilterDenyAction",
        Kind::OneOf(DenyAction::WORDS), "DROP", NZ | DIE | INERT,
        "iptables mode: verdict of a deny.";
    nftables_filter_deny_action: DenyAction = "NftablesFilterDenyAction",
        Kind::OneOf(DenyAction::WORDS), "DROP", NZ | DIE,
        "Verdict of a deny in the filter chains: DROP or REJECT.";
    default_endpoint_to_host_action: EndpointToHostAction = "DefaultEndpointToHostAction",
        Kind::OneOf(EndpointToHostAction::WORDS), "DROP", NZ | DIE,
        "Workload-to-host traffic not allowed by policy: DROP, RETURN (to INPUT rules) or ACCEPT.";
    chain_insert_mode: ChainInsertMode = "ChainInsertMode", Kind::OneOf(ChainInsertMode::WORDS),
        "insert", NZ | DIE | INERT,
        "iptables mode: insert or append Calico's jumps in the kernel's chains.";
    disable_conntrack_invalid_check: bool = "DisableConntrackInvalidCheck", Kind::Bool, "false", 0,
        "Do not drop packets conntrack marks invalid.";
    log_prefix: String = "LogPrefix", Kind::Text, "calico-packet", 0,
        "Prefix of policy log rules (%k kind, %n name, %p ns/name, %t tier).";
    log_action_rate_limit: Option<RateLimit> = "LogActionRateLimit", Kind::RateLimit, "", 0,
        "Rate limit of policy log rules, N/second|minute|hour|day; unset = no limit.";
    log_action_rate_limit_burst: u16 = "LogActionRateLimitBurst", Kind::Int { min: 0, max: 9999 }, "5", 0,
        "Burst allowed above LogActionRateLimit.";

    // --- Refresh intervals / timers ---
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    iptables_refresh_interval: Duration = "IptablesRefreshInterval", Kind::Seconds, "180", INERT,
        "iptables mode: seconds between full re-reads of the tables.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    nftables_refresh_interval: Duration = "NftablesRefreshInterval", Kind::Seconds, "180", 0,
        "Seconds between re-reads of our nftables tables to repair drift; 0 disables.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    route_refresh_interval: Duration = "RouteRefreshInterval", Kind::Seconds, "90", 0,
        "Seconds between route and neighbour resyncs; 0 disables.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    interface_refresh_interval: Duration = "InterfaceRefreshInterval", Kind::Seconds, "90", 0,
        "Seconds between full interface/address re-listings besides netlink events; 0 disables.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    ipsets_refresh_interval: Duration = "IpsetsRefreshInterval", Kind::Seconds, "90", 0,
        "Seconds between IP-set resyncs; 0 disables.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    xdp_refresh_interval: Duration = "XDPRefreshInterval", Kind::Seconds, "90", INERT,
        "Felix XDP acceleration resync period.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    iptables_post_write_check_interval_secs: Duration = "IptablesPostWriteCheckIntervalSecs",
        Kind::Seconds, "5", INERT,
        "iptables mode: re-check delay after a write.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    iptables_lock_probe_interval_millis: Duration = "IptablesLockProbeIntervalMillis",
        Kind::Millis, "50", INERT,
        "iptables mode: xtables lock probe interval (milliseconds).";

    // --- Interfaces ---
    interface_prefix: Vec<String> = "InterfacePrefix", Kind::IfaceList, "cali", NZ | DIE,
        "Comma-separated name prefixes of workload interfaces.";
    interface_exclude: Vec<IfaceMatch> = "InterfaceExclude", Kind::IfaceExcludeList, "kube-ipvs0", 0,
        "Interfaces to ignore: names, or /regex/ entries.";
    mtu_iface_pattern: Option<Pattern> = "MTUIfacePattern", Kind::Regex,
        "^((en|wl|ww|sl|ib)[Pcopsvx].*|(eth|wlan|wwan).*)", 0,
        "Host interfaces whose MTU is used to work out tunnel MTUs.";

    // --- IP sets ---
    max_ipset_size: u32 = "MaxIpsetSize", U32, "1048576", NZ,
        "Maximum IP-set size: an IP set update or delta that would leave a set bigger is rejected, naming the set.";
    ipv6_support: bool = "Ipv6Support", Kind::Bool, "true", 0,
        "Program the IPv6 dataplane too.";

    // --- Failsafes (§7.5) ---
    failsafe_inbound_host_ports: Vec<FailsafePort> = "FailsafeInboundHostPorts", Kind::PortList,
        "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667", DIE,
        "Inbound host ports always allowed, whatever the policy: proto:port or proto:cidr:port.";
    failsafe_outbound_host_ports: Vec<FailsafePort> = "FailsafeOutboundHostPorts", Kind::PortList,
        "udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667", DIE,
        "Outbound host ports always allowed, whatever the policy.";

    // --- NAT ---
    nat_port_range: Option<PortRange> = "NATPortRange", Kind::PortRange, "", 0,
        "Source-port range for masquerade (lo:hi); unset = the kernel's choice.";
    nat_outgoing_address: Option<Ipv4Addr> = "NATOutgoingAddress", Kind::Ipv4, "", 0,
        "SNAT to this address instead of masquerading; unset = masquerade.";
    nat_outgoing_exclusions: NatOutgoingExclusions = "NATOutgoingExclusions",
        Kind::OneOf(NatOutgoingExclusions::WORDS), "IPPoolsOnly", 0,
        "Destinations never masqueraded: IP pools only, or pools and host IPs.";
    iptables_nat_outgoing_interface_filter: Option<String> = "IptablesNATOutgoingInterfaceFilter",
        Kind::Iface, "", 0,
        "Masquerade only traffic leaving through this interface; unset = any.";
    floating_ips: EnabledDisabled = "FloatingIPs", ONOFF, "Disabled", 0,
        "Program Calico floating IPs (OpenStack floating-IP NAT is always programmed).";
    service_loop_prevention: ServiceLoopPrevention = "ServiceLoopPrevention",
        Kind::OneOf(ServiceLoopPrevention::WORDS), "Drop", 0,
        "Traffic to a service CIDR with no service: Drop, Reject or Disabled.";
    kube_node_port_ranges: Vec<PortRange> = "KubeNodePortRanges", Kind::PortRangeList, "30000:32767", 0,
        "Kubernetes NodePort ranges (lo:hi, comma-separated).";

    // --- Routes ---
    route_sync_disabled: bool = "RouteSyncDisabled", Kind::Bool, "false", 0,
        "Do not program routes at all.";
    device_route_protocol: u8 = "DeviceRouteProtocol", Kind::Int { min: 0, max: 255 }, "3", 0,
        "Protocol number of the routes we program (3 = RTPROT_BOOT).";
    device_route_source_address: Option<Ipv4Addr> = "DeviceRouteSourceAddress", Kind::Ipv4, "", 0,
        "Preferred source of IPv4 workload routes; unset = none.";
    device_route_source_address_ipv6: Option<Ipv6Addr> = "DeviceRouteSourceAddressIPv6", Kind::Ipv6, "", 0,
        "Preferred source of IPv6 workload routes; unset = none.";
    remove_external_routes: bool = "RemoveExternalRoutes", Kind::Bool, "true", 0,
        "Remove routes to workload interfaces that we did not program.";
    route_source: RouteSource = "RouteSource", Kind::OneOf(RouteSource::WORDS), "CalicoIPAM", 0,
        "Where remote routes come from: CalicoIPAM blocks or WorkloadIPs.";
    route_table_ranges: Vec<RouteTableRange> = "RouteTableRanges", Kind::RouteTableRanges, "", DIE,
        "Routing tables we may use (min-max,...; 253-255 inside a range are skipped); unset = RouteTableRange.";
    route_table_range: Option<RouteTableRange> = "RouteTableRange", Kind::RouteTableRange, "", DIE,
        "Deprecated single routing-table range (within 1-250), used when RouteTableRanges is unset; both unset = 1-250.";
    program_cluster_routes: ProgramClusterRoutes = "ProgramClusterRoutes",
        Kind::OneOf(ProgramClusterRoutes::WORDS), "EnabledIPIPOnly", 0,
        "Which cluster routes we program (instead of BIRD).";
    ipv4_normal_route_priority: u32 = "IPv4NormalRoutePriority", PRIORITY, "1024", 0,
        "Metric of ordinary IPv4 routes.";
    ipv6_normal_route_priority: u32 = "IPv6NormalRoutePriority", PRIORITY, "1024", 0,
        "Metric of ordinary IPv6 routes.";
    ipv4_elevated_route_priority: u32 = "IPv4ElevatedRoutePriority", PRIORITY, "512", 0,
        "Metric of IPv4 routes that must win over normal ones.";
    ipv6_elevated_route_priority: u32 = "IPv6ElevatedRoutePriority", PRIORITY, "512", 0,
        "Metric of IPv6 routes that must win over normal ones.";
    ip_forwarding: EnabledDisabled = "IPForwarding", ONOFF, "Enabled", 0,
        "Enable IP forwarding (net.ipv4.ip_forward / ipv6 forwarding).";

    // --- Encapsulation ---
    vxlan_enabled: Option<bool> = "VXLANEnabled", Kind::OptionalBool, "", 0,
        "VXLAN on; unset = derived from the IP pools.";
    vxlan_enabled_v6: Option<bool> = "VXLANEnabledV6", Kind::OptionalBool, "", 0,
        "IPv6 VXLAN on; unset = derived from the IP pools.";
    vxlan_port: u16 = "VXLANPort", PORT, "4789", 0,
        "UDP port of VXLAN.";
    vxlan_vni: u32 = "VXLANVNI", Kind::Int { min: 0, max: 16_777_215 }, "4096", 0,
        "VXLAN network identifier.";
    vxlan_mtu: u16 = "VXLANMTU", MTU, "0", 0,
        "MTU of the IPv4 VXLAN device; 0 = auto.";
    vxlan_mtu_v6: u16 = "VXLANMTUV6", MTU, "0", 0,
        "MTU of the IPv6 VXLAN device; 0 = auto.";
    ipip_enabled: Option<bool> = "IpInIpEnabled", Kind::OptionalBool, "", 0,
        "IP-in-IP on; unset = derived from the IP pools.";
    ipip_mtu: u16 = "IpInIpMtu", MTU, "0", 0,
        "MTU of the IP-in-IP device; 0 = auto.";
    ipip_tunnel_addr: Option<Ipv4Addr> = "IpInIpTunnelAddr", Kind::Ipv4, "", 0,
        "This node's IP-in-IP tunnel address, given to tunl0 as a /32.";
    allow_vxlan_packets_from_workloads: bool = "AllowVXLANPacketsFromWorkloads", Kind::Bool, "false", 0,
        "Let workloads send VXLAN packets.";
    allow_ipip_packets_from_workloads: bool = "AllowIPIPPacketsFromWorkloads", Kind::Bool, "false", 0,
        "Let workloads send IP-in-IP packets.";
    #[schemars(with = "Vec<String>")]
    external_nodes_cidr_list: Vec<IpNet> = "ExternalNodesCIDRList", Kind::CidrList, "", DIE,
        "IPv4 CIDRs of non-Calico nodes allowed to send IP-in-IP/VXLAN to this node.";

    // --- Wireguard ---
    wireguard_enabled: bool = "WireguardEnabled", Kind::Bool, "false", 0,
        "IPv4 Wireguard encryption between nodes.";
    wireguard_enabled_v6: bool = "WireguardEnabledV6", Kind::Bool, "false", 0,
        "IPv6 Wireguard encryption between nodes.";
    wireguard_listening_port: u16 = "WireguardListeningPort", PORT, "51820", 0,
        "UDP port of IPv4 Wireguard.";
    wireguard_listening_port_v6: u16 = "WireguardListeningPortV6", PORT, "51821", 0,
        "UDP port of IPv6 Wireguard.";
    wireguard_interface_name: String = "WireguardInterfaceName", Kind::Iface, "wireguard.cali", NZ,
        "Name of the IPv4 Wireguard device.";
    wireguard_interface_name_v6: String = "WireguardInterfaceNameV6", Kind::Iface, "wg-v6.cali", NZ,
        "Name of the IPv6 Wireguard device.";
    wireguard_routing_rule_priority: u32 = "WireguardRoutingRulePriority", U32, "99", 0,
        "Priority of the Wireguard routing rule.";
    wireguard_host_encryption_enabled: bool = "WireguardHostEncryptionEnabled", Kind::Bool, "false", 0,
        "Encrypt host-to-host traffic too.";
    wireguard_mtu: u16 = "WireguardMTU", MTU, "0", 0,
        "MTU of the IPv4 Wireguard device; 0 = the host's MTU less 60.";
    wireguard_mtu_v6: u16 = "WireguardMTUV6", MTU, "0", 0,
        "MTU of the IPv6 Wireguard device; 0 = the host's MTU less 80.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    wireguard_persistent_keep_alive: Duration = "WireguardPersistentKeepAlive", Kind::Seconds, "0", 0,
        "Seconds between keepalives sent to each Wireguard peer; 0 = none.";
    wireguard_threading_enabled: bool = "WireguardThreadingEnabled", Kind::Bool, "false", 0,
        "Threaded NAPI on the Wireguard devices.";

    // --- Flow logs ---
    flow_logs_goldmane_server: Option<String> = "FlowLogsGoldmaneServer", Kind::Text, "", 0,
        "Goldmane's address (host:port); set = flow logs on: every policy and profile rule, each tier's end and the no-profile drop log to NFLOG groups 1 (ingress) and 2 (egress) with Felix's prefixes, and each flush's flows stream to Goldmane over gRPC with TLS (TyphaCAFile, TyphaCertFile, TyphaKeyFile); http://host:port = plaintext.";
    flow_logs_local_reporter: EnabledDisabled = "FlowLogsLocalReporter", ONOFF, "Disabled", 0,
        "Enabled = flow logs on, as with FlowLogsGoldmaneServer.";
    #[serde(with = "secs_f64")] #[schemars(with = "f64")]
    flow_logs_flush_interval: Duration = "FlowLogsFlushInterval", Kind::Seconds, "300", NZ,
        "Seconds each flow record covers: flows are counted over this interval, then reported.";
    flow_logs_local_socket: String = "FlowLogsLocalSocket", Kind::Path, "/run/felix-nft/flows.sock", OURS,
        "The unix socket `felix-nft flows` reads the running agent's flows from (root only).";
    // Felix authenticates to Goldmane with its Typha client certificate (`dpstatshelper.go`).
    typha_ca_file: Option<String> = "TyphaCAFile", Kind::Path, "", LOCAL,
        "The CA Goldmane's server certificate must chain to (named for Typha, Felix's first TLS peer); set with TyphaCertFile and TyphaKeyFile = TLS to Goldmane.";
    typha_cert_file: Option<String> = "TyphaCertFile", Kind::Path, "", LOCAL,
        "The client certificate presented to Goldmane (PEM).";
    typha_key_file: Option<String> = "TyphaKeyFile", Kind::Path, "", LOCAL,
        "The key of TyphaCertFile (PEM).";

    // --- Workloads / OpenStack / Istio ---
    workload_source_spoofing: WorkloadSourceSpoofing = "WorkloadSourceSpoofing",
        Kind::OneOf(WorkloadSourceSpoofing::WORDS), "Disabled", 0,
        "Whether workloads may be allowed (per annotation) to spoof source addresses.";
    openstack_region: Option<String> = "OpenstackRegion", Kind::Region, "", DIE,
        "OpenStack region; unset = none.";
    metadata_addr: String = "MetadataAddr", Kind::Hostname, "127.0.0.1", DIE,
        "OpenStack metadata server address (workloads reach it via DNAT).";
    metadata_port: u16 = "MetadataPort", PORT, "8775", DIE,
        "OpenStack metadata server port.";
    istio_ambient_mode: EnabledDisabled = "IstioAmbientMode", ONOFF, "Disabled", 0,
        "Istio ambient-mode support.";
    istio_dscp_mark: u8 = "IstioDSCPMark", Kind::Int { min: 0, max: 63 }, "23", 0,
        "DSCP value Istio ambient mode marks with.";

    // --- Health / metrics / logging ---
    health_enabled: bool = "HealthEnabled", Kind::Bool, "false", 0,
        "Serve /liveness and /readiness.";
    health_port: u16 = "HealthPort", PORT, "9099", 0,
        "Port of the health endpoints.";
    health_host: String = "HealthHost", Kind::Host, "localhost", 0,
        "Address the health endpoints listen on.";
    health_timeout_overrides: Vec<KeyDuration> = "HealthTimeoutOverrides", Kind::KeyDurationList, "", 0,
        "Per-reporter health timeouts, name=duration,... (Go durations: 30s, 1m).";
    prometheus_metrics_enabled: bool = "PrometheusMetricsEnabled", Kind::Bool, "false", 0,
        "Serve Prometheus metrics.";
    prometheus_metrics_port: u16 = "PrometheusMetricsPort", PORT, "9091", 0,
        "Port of the metrics endpoint.";
    prometheus_metrics_host: Option<String> = "PrometheusMetricsHost", Kind::Host, "", 0,
        "Address the metrics endpoint listens on; unset = all addresses. The endpoint has no authentication (as Felix's): bind it to 127.0.0.1 or firewall the port where that matters.";
    prometheus_go_metrics_enabled: bool = "PrometheusGoMetricsEnabled", Kind::Bool, "true", 0,
        "Felix: Go runtime metrics (felix-nft exports runtime metrics under this switch).";
    prometheus_process_metrics_enabled: bool = "PrometheusProcessMetricsEnabled", Kind::Bool, "true", 0,
        "Process metrics (CPU, memory, fds).";
    log_severity_screen: LogLevel = "LogSeverityScreen", LOGLEVEL, "INFO", 0,
        "Minimum level logged to stderr.";
    log_severity_file: LogLevel = "LogSeverityFile", LOGLEVEL, "INFO", 0,
        "Minimum level logged to LogFilePath.";
    log_severity_sys: LogLevel = "LogSeveritySys", LOGLEVEL, "INFO", 0,
        "Minimum level logged to syslog.";
    log_file_path: Option<String> = "LogFilePath", Kind::Path, "/var/log/calico/felix.log", DIE,
        "Log file; `none` = no file logging.";

    feature_detect_override: Option<String> = "FeatureDetectOverride", Kind::Text, "", 0,
        "Felix: overrides of the kernel feature detection, `Name=true|false|` comma-separated (empty = detect). felix-nft decides OwnerPersistTables, SetElementsByID and EveryTableValidated (see `felix-nft version`); Felix's other names are accepted and not used.";

    // --- felix-nft's own ---
    nftables_table_owner: bool = "NftablesTableOwner", Kind::Bool, "true", OURS,
        "felix-nft: create our tables with the owner+persist flags (kernel 6.9+) so no other process can change them and they outlive us; false = plain tables.";
    nftables_side_table_size: u32 = "NftablesSideTableSize", Kind::Int { min: 0, max: 4096 }, "256", OURS,
        "felix-nft: how many workload endpoints the small side table holds: endpoints added or changed after the first sync go there, so a commit validates only that table; 0 = one table.";
    input_max_message_bytes: u32 = "InputMaxMessageBytes", Kind::Int { min: 4096, max: 1 << 30 }, "67108864", OURS,
        "felix-nft: the largest input message, in bytes: a longer JSON line is rejected and skipped without being held in memory; a longer fd 3 frame ends the run (Felix's stream cannot be resynchronised past it). The default (64 MiB) holds an IP set update of 1,000,000 IPv6 members with ports.";
}

/// Felix parameters felix-nft recognises but does not model (datastore, Typha, BPF, usage
/// reporting, debug). A key from this list is kept and shown as "not used", not warned about
/// as unknown: Felix sends every parameter it resolved in `ConfigUpdate` (§2.3).
pub const FELIX_PARAMS_NOT_USED: &[&str] = &[
    "DatastoreType",
    "EtcdAddr",
    "EtcdScheme",
    "EtcdKeyFile",
    "EtcdCertFile",
    "EtcdCaFile",
    "EtcdEndpoints",
    "TyphaAddr",
    "TyphaK8sServiceName",
    "TyphaK8sNamespace",
    "TyphaReadTimeout",
    "TyphaWriteTimeout",
    "TyphaCN",
    "TyphaURISAN",
    "CalicoVersion",
    "ClusterGUID",
    "ClusterType",
    "UsageReportingEnabled",
    "UsageReportingInitialDelaySecs",
    "UsageReportingIntervalSecs",
    "IptablesLockFilePath",
    "IptablesLockTimeoutSecs",
    "FeatureGates",
    "PolicySyncPathPrefix",
    "VXLANTunnelMACAddr",
    "VXLANTunnelMACAddrV6",
    "WireguardRoutingTableIndex",
    "XDPEnabled",
    "GenericXDPEnabled",
    "BPFLogLevel",
    "BPFDataIfacePattern",
    "BPFConnectTimeLoadBalancingEnabled",
    "BPFExternalServiceMode",
    "BPFKubeProxyIptablesCleanupEnabled",
    "BPFDisableUnprivileged",
    "DebugMemoryProfilePath",
    "DebugDisableLogDropping",
    "DebugSimulateCalcGraphHangAfter",
    "DebugSimulateDataplaneHangAfter",
    "StatsDumpFilePrefix",
    "PrometheusReporterEnabled",
    "PrometheusReporterPort",
    "FlowLogsFileEnabled",
    "SidecarAccelerationEnabled",
    "AWSSrcDstCheck",
];
