//! The renderer's configuration: the subset of Felix's parameters (§3.2) that shapes
//! the rules, as a plain struct with Felix's defaults. Parsing raw Felix config is the `config`
//! module's job; the dataplane fills this struct from it.

use std::net::Ipv4Addr;

use ipnet::IpNet;

/// What an "allow" does where Calico would `-j ACCEPT` (`*AllowAction`, §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllowAction {
    /// Accept in this table (the default).
    Accept,
    /// Return to the caller and let later rules decide.
    Return,
}

/// What a "deny" does in the filter layer (`FilterDenyAction`, §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DenyAction {
    Drop,
    /// ICMP port unreachable.
    Reject,
}

/// `DefaultEndpointToHostAction` (§7.3): what happens to workload → host traffic that workload
/// egress policy did not drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointToHostAction {
    Drop,
    Return,
    Accept,
}

/// `ServiceLoopPrevention` (§7.11): traffic to service CIDRs that leaves the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceLoopPrevention {
    Drop,
    Reject,
    Disabled,
}

/// `NATOutgoingExclusions` (§7.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NatOutgoingExclusions {
    IpPoolsOnly,
    IpPoolsAndHostIps,
}

/// One failsafe port (`FailsafeInboundHostPorts` / `FailsafeOutboundHostPorts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtoPort {
    /// IP protocol number (6 tcp, 17 udp).
    pub proto: u8,
    /// Destination port (source port for return traffic in the raw copies).
    pub port: u16,
    /// Optional peer CIDR (`proto:cidr:port`); skipped in the other family's table.
    pub net: Option<IpNet>,
}

impl ProtoPort {
    /// `tcp:<port>`.
    pub const fn tcp(port: u16) -> ProtoPort {
        ProtoPort {
            proto: 6,
            port,
            net: None,
        }
    }

    /// `udp:<port>`.
    pub const fn udp(port: u16) -> ProtoPort {
        ProtoPort {
            proto: 17,
            port,
            net: None,
        }
    }
}

/// A log rate limit (`LogActionRateLimit` + `LogActionRateLimitBurst`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RateLimit {
    /// Packets per unit.
    pub rate: u64,
    /// Seconds per unit: 1, 60, 3600 or 86400.
    pub unit_secs: u64,
    /// Burst in packets.
    pub burst: u32,
}

/// Everything configurable that changes what the renderer emits. `Default` is Felix's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulesConfig {
    /// `NftablesMarkMask` (default 0xffff0000); see [`crate::MarkBits::allocate`].
    pub mark_mask: u32,
    /// `NftablesFilterAllowAction` (ACCEPT).
    pub filter_allow_action: AllowAction,
    /// `NftablesMangleAllowAction` (ACCEPT).
    pub mangle_allow_action: AllowAction,
    /// `NftablesFilterDenyAction` (DROP).
    pub filter_deny_action: DenyAction,
    /// `DefaultEndpointToHostAction` (DROP).
    pub endpoint_to_host_action: EndpointToHostAction,
    /// `InterfacePrefix` (default `cali`), each matched as `<prefix>*`.
    pub workload_iface_prefixes: Vec<String>,
    /// `FailsafeInboundHostPorts`.
    pub failsafe_inbound: Vec<ProtoPort>,
    /// `FailsafeOutboundHostPorts`.
    pub failsafe_outbound: Vec<ProtoPort>,
    /// `NATPortRange`.
    pub nat_port_range: Option<(u16, u16)>,
    /// `NATOutgoingAddress` (IPv4 only): SNAT to it instead of masquerading.
    pub nat_outgoing_address: Option<Ipv4Addr>,
    /// `NATOutgoingExclusions`.
    pub nat_outgoing_exclusions: NatOutgoingExclusions,
    /// `IptablesNATOutgoingInterfaceFilter` (`+` wildcards become `*`).
    pub nat_outgoing_iface_filter: Option<String>,
    /// Add `fully-random` to masquerade (Felix's feature detection says the kernel supports it).
    pub masq_fully_random: bool,
    /// IPIP in use (IPv4 only): allow IPIP between Calico hosts.
    pub ipip_enabled: bool,
    /// VXLAN (IPv4) in use: allow VXLAN from known VTEPs, untrack it in raw.
    pub vxlan_enabled: bool,
    /// VXLAN over IPv6 in use.
    pub vxlan_enabled_v6: bool,
    /// This node's name (`FelixHostname`): its own VTEP is not a remote host.
    pub hostname: String,
    /// `ExternalNodesCIDRList`: non-Calico nodes allowed to send IPIP and VXLAN here (members
    /// of `all-hosts-net` and `all-vxlan-net`).
    pub external_nodes: Vec<String>,
    /// `VXLANPort` (4789).
    pub vxlan_port: u16,
    /// `MaxIpsetSize` (1,048,576): an IP set update or delta that would leave a set with more
    /// members is refused by validation (nf_tables sets have no such limit; Felix's ipsets do,
    /// and an unbounded set costs the whole node memory and refresh time). Not rendered.
    pub max_ipset_size: usize,
    /// `WireguardEnabled` with `WireguardListeningPort` (51820): allow the tunnel's UDP to and
    /// from this host.
    pub wireguard_port: Option<u16>,
    /// `WireguardEnabledV6` with `WireguardListeningPortV6` (51821).
    pub wireguard_port_v6: Option<u16>,
    /// `WireguardInterfaceName` and `WireguardInterfaceNameV6`: packets arriving on them are
    /// not marked as host traffic to encrypt.
    pub wireguard_ifaces: Vec<String>,
    /// `WireguardHostEncryptionEnabled`: host traffic arriving unencrypted is marked so that
    /// its reverse-path check and replies skip WireGuard's table.
    pub wireguard_host_encryption: bool,
    /// `AllowVXLANPacketsFromWorkloads`.
    pub allow_vxlan_from_workloads: bool,
    /// `AllowIPIPPacketsFromWorkloads`.
    pub allow_ipip_from_workloads: bool,
    /// Tunnel devices present with a tunnel address (`tunl0`, `vxlan.calico`, ...): host traffic
    /// leaving them with a non-tunnel local source is masqueraded (§7.11).
    pub tunnel_ifaces_v4: Vec<String>,
    /// The IPv6 tunnel devices (`vxlan-v6.calico`, ...).
    pub tunnel_ifaces_v6: Vec<String>,
    /// `LogPrefix` (`calico-packet`; `%k` kind, `%n` name, `%p` namespace/name, `%t` tier).
    pub log_prefix: String,
    /// `LogActionRateLimit` / `LogActionRateLimitBurst`.
    pub log_rate_limit: Option<RateLimit>,
    /// Flow logs are on (`FlowLogsGoldmaneServer` set or `FlowLogsLocalReporter` enabled): every
    /// policy and profile rule, each tier's end and the no-profile drop log to NFLOG with
    /// Felix's groups and prefixes ([`crate::nflog`]).
    pub flow_logs: bool,
    /// `DisableConntrackInvalidCheck`.
    pub disable_conntrack_invalid_check: bool,
    /// `ServiceLoopPrevention` (Drop).
    pub service_loop_prevention: ServiceLoopPrevention,
    /// `Ipv6Support`: render the `ip6` table too.
    pub ipv6_enabled: bool,
    /// `FloatingIPs` = Enabled (OpenStack endpoints get them regardless).
    pub floating_ips_enabled: bool,
    /// felix-nft's `NftablesSideTableSize`: workload endpoints the side table may hold (0 = no
    /// side table; see [`crate::side`]).
    pub side_table_size: usize,
}

impl Default for RulesConfig {
    fn default() -> RulesConfig {
        RulesConfig {
            mark_mask: 0xffff_0000,
            filter_allow_action: AllowAction::Accept,
            mangle_allow_action: AllowAction::Accept,
            filter_deny_action: DenyAction::Drop,
            endpoint_to_host_action: EndpointToHostAction::Drop,
            workload_iface_prefixes: vec!["cali".to_string()],
            failsafe_inbound: vec![
                ProtoPort::tcp(22),
                ProtoPort::udp(68),
                ProtoPort::tcp(179),
                ProtoPort::tcp(2379),
                ProtoPort::tcp(2380),
                ProtoPort::tcp(5473),
                ProtoPort::tcp(6443),
                ProtoPort::tcp(6666),
                ProtoPort::tcp(6667),
            ],
            failsafe_outbound: vec![
                ProtoPort::udp(53),
                ProtoPort::udp(67),
                ProtoPort::tcp(179),
                ProtoPort::tcp(2379),
                ProtoPort::tcp(2380),
                ProtoPort::tcp(5473),
                ProtoPort::tcp(6443),
                ProtoPort::tcp(6666),
                ProtoPort::tcp(6667),
            ],
            nat_port_range: None,
            nat_outgoing_address: None,
            nat_outgoing_exclusions: NatOutgoingExclusions::IpPoolsOnly,
            nat_outgoing_iface_filter: None,
            masq_fully_random: false,
            ipip_enabled: false,
            vxlan_enabled: false,
            vxlan_enabled_v6: false,
            hostname: String::new(),
            external_nodes: Vec::new(),
            vxlan_port: 4789,
            max_ipset_size: 1 << 20,
            wireguard_port: None,
            wireguard_port_v6: None,
            wireguard_ifaces: Vec::new(),
            wireguard_host_encryption: false,
            allow_vxlan_from_workloads: false,
            allow_ipip_from_workloads: false,
            tunnel_ifaces_v4: Vec::new(),
            tunnel_ifaces_v6: Vec::new(),
            log_prefix: "calico-packet".to_string(),
            log_rate_limit: None,
            flow_logs: false,
            disable_conntrack_invalid_check: false,
            service_loop_prevention: ServiceLoopPrevention::Drop,
            ipv6_enabled: true,
            floating_ips_enabled: false,
            side_table_size: 256,
        }
    }
}
