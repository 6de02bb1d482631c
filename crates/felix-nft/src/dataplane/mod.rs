//! The dataplane driver (§10–14): what the node should look like, kept up to date from
//! Felix's updates and the interface monitor, and turned into kernel objects in a fixed order.
//!
//! Layer: uses `rules` (Calico semantics → nft objects), `nft`/`rtnl` only through the
//! [`kernel::Kernel`] seam, `proto`, `config`. It never encodes netlink itself.
//!
//! - [`Dataplane`] (this file): the desired state. `on_update` validates and records — no kernel
//!   I/O — and marks what became dirty; [`Dataplane::tables_patch`] renders only what changed
//!   since the last call (the daemon's path), [`Dataplane::desired_host`] the routes,
//!   neighbours and interface settings, and [`Dataplane::desired`] everything from scratch
//!   (one-shot commands).
//! - [`validate`]: rejects updates that would make the desired state wrong.
//! - [`dirty`]: what changed since the last apply. The model says what an update changed
//!   ([`rules::Change`]); this file marks from that, and the driver clears what it applied,
//!   both through methods named for what happened.
//! - [`overlay`]: cross-node networking: the VXLAN device, its FDB and ARP entries, cluster
//!   routes, from VTEPs, route updates, pools and the host's interfaces.
//! - [`wireguard`]: WireGuard between nodes: devices, peers, their routing table and rule, from
//!   the nodes' keys, addresses and routes.
//! - [`features`]: the kernels felix-nft supports and Felix's `FeatureDetectOverride`.
//! - [`kernel`]: the seam to the kernel, its real implementation and a fake for tests.
//! - [`driver`]: the event loop — batching, InSync gating, throttling, the apply order, retries,
//!   refresh timers, rebuild and fail-closed exit, status back to Felix.
//! - [`status`]: endpoint status reporting.
//! - [`oneshot`]: `apply`, `plan`, `dump`, `cleanup` for the CLI.
//!
//! Invariants: nothing touches the kernel before the datastore's `InSync` and the interface
//! monitor's first sync; a rejected update changes nothing; stopping never removes policy.

mod dirty;
pub mod driver;
pub mod features;
pub mod kernel;
pub mod oneshot;
pub mod overlay;
pub mod quarantine;
pub mod repair;
pub mod status;
pub mod validate;
pub mod wireguard;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::config::Config;
use felix_api::to_dataplane::Payload;
use felix_api::{
    HostEndpoint, HostEndpointId, IpPoolType, LiveMigrationRole, RouteType, RouteUpdate,
    ToDataplane, VxlanTunnelEndpointUpdate, WorkloadEndpoint, WorkloadEndpointId,
};
use felix_nft_rules::incremental::{Changes, Incremental, Inputs};
use felix_nft_rules::{self as rules, Change, Members, Model, RulesConfig, RulesError};
use nf_tables::model::{Table, TablePatch};
use nf_tables::reconcile::TableOwnership;
use rtnl::neigh::Mac;
use rtnl::routes::{RouteOwnership, RouteSpec};

pub use dirty::Dirty;
pub use status::Status;
pub use validate::InputError;

/// Route protocol Felix uses for its non-device routes when `DeviceRouteProtocol` is boot (3).
pub const RTPROT_FELIX: u8 = 80;
/// `RTPROT_BOOT`.
pub const RTPROT_BOOT: u8 = 3;

/// What the routes Felix writes carry (§15).
#[derive(Debug, Clone, Copy)]
pub struct RouteParams {
    /// `DeviceRouteProtocol` (3): workload routes and routes on a tunnel device carry it.
    pub protocol: u8,
    /// `IPv4NormalRoutePriority` / `IPv6NormalRoutePriority` (1024).
    pub metric_v4: u32,
    pub metric_v6: u32,
    /// `DeviceRouteSourceAddress(IPv6)`.
    pub src_v4: Option<IpAddr>,
    pub src_v6: Option<IpAddr>,
}

impl RouteParams {
    /// Felix's protocol for its routes other than those on a workload or tunnel device: 80
    /// while the device protocol is boot (3), else the device protocol.
    pub fn felix_protocol(&self) -> u8 {
        if self.protocol == RTPROT_BOOT {
            RTPROT_FELIX
        } else {
            self.protocol
        }
    }

    /// The route priority of the family.
    pub fn metric(&self, v6: bool) -> u32 {
        if v6 {
            self.metric_v6
        } else {
            self.metric_v4
        }
    }

    /// The preferred source address of the family's device routes.
    pub fn src(&self, v6: bool) -> Option<IpAddr> {
        if v6 {
            self.src_v6
        } else {
            self.src_v4
        }
    }
}

/// Everything the dataplane needs from the configuration, in its own terms.
#[derive(Debug, Clone)]
pub struct DataplaneConfig {
    pub rules: RulesConfig,
    /// Owner+persist flags on our tables (`NftablesTableOwner`).
    pub ownership: TableOwnership,
    /// What the routes Felix writes carry.
    pub routes: RouteParams,
    /// `RouteSyncDisabled`: no route or neighbour work at all.
    pub route_sync_disabled: bool,
    /// `RemoveExternalRoutes`: any route on a workload interface is ours.
    pub remove_external_routes: bool,
    /// `InterfacePrefix`.
    pub workload_prefixes: Vec<String>,
    /// `InterfaceExclude`, as the monitor takes it (names and `/regex/`).
    pub iface_exclude: Vec<String>,
    /// `IPForwarding` = Enabled.
    pub ip_forwarding: bool,
    /// `Ipv6Support`.
    pub ipv6: bool,
    /// `NftablesRefreshInterval` (180 s): re-read the tables and repair drift.
    pub nft_refresh: Duration,
    /// `RouteRefreshInterval` (90 s).
    pub route_refresh: Duration,
    /// `InterfaceRefreshInterval` (90 s).
    pub iface_refresh: Duration,
    /// `ReportingIntervalSecs` (30 s; zero disables the heartbeat).
    pub reporting_interval: Duration,
    /// `EndpointReportingEnabled`: send per-endpoint status to Felix.
    pub endpoint_reporting: bool,
    /// How long the daemon waits without an apply before it merges the side table back into
    /// the main one (one validation of the big table, paid when nothing else is waiting).
    pub side_merge_after: Duration,
    /// Cross-node networking: this node's name and the VXLAN parameters.
    pub overlay: overlay::OverlayConfig,
    /// WireGuard between nodes.
    pub wireguard: wireguard::WgConfig,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            rules: RulesConfig::default(),
            ownership: TableOwnership::OwnerPersist,
            routes: RouteParams {
                protocol: RTPROT_BOOT,
                metric_v4: 1024,
                metric_v6: 1024,
                src_v4: None,
                src_v6: None,
            },
            route_sync_disabled: false,
            remove_external_routes: true,
            workload_prefixes: vec!["cali".into()],
            iface_exclude: vec!["kube-ipvs0".into()],
            ip_forwarding: true,
            ipv6: true,
            nft_refresh: Duration::from_secs(180),
            route_refresh: Duration::from_secs(90),
            iface_refresh: Duration::from_secs(90),
            reporting_interval: Duration::from_secs(30),
            endpoint_reporting: true,
            side_merge_after: Duration::from_secs(2),
            overlay: overlay::OverlayConfig::default(),
            wireguard: wireguard::WgConfig::default(),
        }
    }
}

/// Felix's parameter values → the renderer's: the same choices, each type in its own layer
/// (`rules` knows no configuration).
macro_rules! same_choices {
    ($($from:ident => $to:ident { $($v:ident),+ })+) => {$(
        impl From<crate::config::$from> for rules::$to {
            fn from(v: crate::config::$from) -> Self {
                match v {
                    $(crate::config::$from::$v => rules::$to::$v,)+
                }
            }
        }
    )+};
}

same_choices! {
    AllowAction => AllowAction { Accept, Return }
    DenyAction => DenyAction { Drop, Reject }
    EndpointToHostAction => EndpointToHostAction { Drop, Return, Accept }
    NatOutgoingExclusions => NatOutgoingExclusions { IpPoolsOnly, IpPoolsAndHostIps }
    ServiceLoopPrevention => ServiceLoopPrevention { Drop, Reject, Disabled }
}

impl DataplaneConfig {
    /// Maps Felix's parameters (§3.2) onto the dataplane's.
    pub fn from_config(c: &Config) -> DataplaneConfig {
        use crate::config as cfg;
        let hostname = c.felix_hostname.clone().unwrap_or_else(os_hostname);
        let wireguard = wireguard_config(c, &hostname);
        let rules = RulesConfig {
            mark_mask: c.nftables_mark_mask,
            filter_allow_action: c.nftables_filter_allow_action.into(),
            mangle_allow_action: c.nftables_mangle_allow_action.into(),
            filter_deny_action: c.nftables_filter_deny_action.into(),
            endpoint_to_host_action: c.default_endpoint_to_host_action.into(),
            workload_iface_prefixes: c.interface_prefix.clone(),
            failsafe_inbound: c
                .failsafe_inbound_host_ports
                .iter()
                .map(proto_port)
                .collect(),
            failsafe_outbound: c
                .failsafe_outbound_host_ports
                .iter()
                .map(proto_port)
                .collect(),
            nat_port_range: c.nat_port_range.map(|r| (r.first, r.last)),
            nat_outgoing_address: c.nat_outgoing_address,
            nat_outgoing_exclusions: c.nat_outgoing_exclusions.into(),
            nat_outgoing_iface_filter: c.iptables_nat_outgoing_interface_filter.clone(),
            masq_fully_random: true,
            ipip_enabled: c.ipip_enabled.unwrap_or(false),
            vxlan_enabled: c.vxlan_enabled.unwrap_or(false),
            vxlan_enabled_v6: c.vxlan_enabled_v6.unwrap_or(false),
            hostname: hostname.clone(),
            external_nodes: c
                .external_nodes_cidr_list
                .iter()
                .map(|n| n.to_string())
                .collect(),
            vxlan_port: c.vxlan_port,
            max_ipset_size: c.max_ipset_size as usize,
            wireguard_port: c.wireguard_enabled.then_some(c.wireguard_listening_port),
            wireguard_port_v6: c
                .wireguard_enabled_v6
                .then_some(c.wireguard_listening_port_v6),
            wireguard_ifaces: vec![
                c.wireguard_interface_name.clone(),
                c.wireguard_interface_name_v6.clone(),
            ],
            wireguard_host_encryption: c.wireguard_host_encryption_enabled,
            allow_vxlan_from_workloads: c.allow_vxlan_packets_from_workloads,
            allow_ipip_from_workloads: c.allow_ipip_packets_from_workloads,
            tunnel_ifaces_v4: wireguard
                .v4
                .enabled
                .then(|| wireguard.v4.iface.clone())
                .into_iter()
                .collect(),
            tunnel_ifaces_v6: (wireguard.ipv6 && wireguard.v6.enabled)
                .then(|| wireguard.v6.iface.clone())
                .into_iter()
                .collect(),
            log_prefix: c.log_prefix.clone(),
            log_rate_limit: c.log_action_rate_limit.map(|r| rules::RateLimit {
                rate: u64::from(r.count),
                unit_secs: match r.per {
                    cfg::RatePer::Second => 1,
                    cfg::RatePer::Minute => 60,
                    cfg::RatePer::Hour => 3600,
                    cfg::RatePer::Day => 86400,
                },
                burst: u32::from(c.log_action_rate_limit_burst),
            }),
            flow_logs: c.flow_logs_goldmane_server.is_some()
                || c.flow_logs_local_reporter == cfg::EnabledDisabled::Enabled,
            disable_conntrack_invalid_check: c.disable_conntrack_invalid_check,
            service_loop_prevention: c.service_loop_prevention.into(),
            ipv6_enabled: c.ipv6_support,
            floating_ips_enabled: c.floating_ips == cfg::EnabledDisabled::Enabled,
            side_table_size: c.nftables_side_table_size as usize,
        };
        DataplaneConfig {
            rules,
            ownership: if c.nftables_table_owner {
                TableOwnership::OwnerPersist
            } else {
                TableOwnership::Off
            },
            routes: RouteParams {
                protocol: c.device_route_protocol,
                metric_v4: c.ipv4_normal_route_priority,
                metric_v6: c.ipv6_normal_route_priority,
                src_v4: c.device_route_source_address.map(IpAddr::V4),
                src_v6: c.device_route_source_address_ipv6.map(IpAddr::V6),
            },
            route_sync_disabled: c.route_sync_disabled,
            remove_external_routes: c.remove_external_routes,
            workload_prefixes: c.interface_prefix.clone(),
            iface_exclude: c
                .interface_exclude
                .iter()
                .map(|m| match m {
                    cfg::IfaceMatch::Name(n) => n.clone(),
                    cfg::IfaceMatch::Regex(p) => format!("/{}/", p.as_str()),
                })
                .collect(),
            ip_forwarding: c.ip_forwarding == cfg::EnabledDisabled::Enabled,
            ipv6: c.ipv6_support,
            nft_refresh: c.nftables_refresh_interval,
            route_refresh: c.route_refresh_interval,
            iface_refresh: c.interface_refresh_interval,
            reporting_interval: c.reporting_interval_secs,
            endpoint_reporting: true,
            side_merge_after: Duration::from_secs(2),
            overlay: overlay::OverlayConfig {
                hostname,
                vxlan_enabled: c.vxlan_enabled,
                vxlan_enabled_v6: c.vxlan_enabled_v6,
                vni: c.vxlan_vni,
                port: c.vxlan_port,
                mtu: (c.vxlan_mtu != 0).then_some(u32::from(c.vxlan_mtu)),
                mtu_v6: (c.vxlan_mtu_v6 != 0).then_some(u32::from(c.vxlan_mtu_v6)),
                noencap_routes: matches!(
                    c.program_cluster_routes,
                    cfg::ProgramClusterRoutes::Enabled
                        | cfg::ProgramClusterRoutes::EnabledNoEncapOnly
                ),
                ipip_enabled: c.ipip_enabled,
                ipip_mtu: (c.ipip_mtu != 0).then_some(u32::from(c.ipip_mtu)),
                ipip_addr: c.ipip_tunnel_addr,
                ipip_routes: matches!(
                    c.program_cluster_routes,
                    cfg::ProgramClusterRoutes::Enabled | cfg::ProgramClusterRoutes::EnabledIpipOnly
                ),
            },
            wireguard,
        }
    }

    /// The protocols whose routes are ours wherever they are (§15): 80, and the configured
    /// device protocol unless it is boot (3), which other tools use too.
    pub fn owned_route_protocols(&self) -> BTreeSet<u8> {
        let mut p = BTreeSet::from([RTPROT_FELIX]);
        if self.routes.protocol != RTPROT_BOOT {
            p.insert(self.routes.protocol);
        }
        p
    }

    /// Which main-table routes (and their nexthop objects) are ours (§15): our protocols
    /// anywhere, workload routes by `workload_route_protocols`, and anything on the VXLAN
    /// devices we own.
    pub fn route_ownership(&self) -> RouteOwnership {
        RouteOwnership::by_prefixes(
            self.owned_route_protocols(),
            self.workload_prefixes.clone(),
            self.workload_route_protocols(),
        )
        .with_device_ifaces([
            overlay::VXLAN_IFACE_V4.to_string(),
            overlay::VXLAN_IFACE_V6.to_string(),
        ])
    }

    /// Which protocols make a route on a workload interface ours: any when
    /// `RemoveExternalRoutes`, else boot and 80 (§15).
    pub fn workload_route_protocols(&self) -> Option<BTreeSet<u8>> {
        if self.remove_external_routes {
            None
        } else {
            let mut p = BTreeSet::from([RTPROT_BOOT, RTPROT_FELIX]);
            p.insert(self.routes.protocol);
            Some(p)
        }
    }

    /// Whether `ifname` is a workload interface (`InterfacePrefix`).
    pub fn is_workload_iface(&self, ifname: &str) -> bool {
        self.workload_prefixes
            .iter()
            .any(|p| ifname.starts_with(p.as_str()))
    }
}

/// WireGuard's settings: the table is the lowest index of `RouteTableRanges` outside the
/// kernel's reserved 253–255 (both families use it, as Felix does); the mark is the bit the
/// renderer allocates after Calico's own.
fn wireguard_config(c: &Config, hostname: &str) -> wireguard::WgConfig {
    let fam = |enabled, iface: &str, port, mtu: u16| wireguard::WgFamilyConfig {
        enabled,
        iface: iface.to_string(),
        port,
        mtu: (mtu != 0).then_some(u32::from(mtu)),
    };
    let on = c.wireguard_enabled || c.wireguard_enabled_v6;
    let table = c
        .route_table_indices()
        .iter()
        .flat_map(|r| r.min..=r.max)
        .find(|t| !(253..=255).contains(t))
        .unwrap_or(1);
    wireguard::WgConfig {
        hostname: hostname.to_string(),
        v4: fam(
            c.wireguard_enabled,
            &c.wireguard_interface_name,
            c.wireguard_listening_port,
            c.wireguard_mtu,
        ),
        v6: fam(
            c.wireguard_enabled_v6,
            &c.wireguard_interface_name_v6,
            c.wireguard_listening_port_v6,
            c.wireguard_mtu_v6,
        ),
        ipv6: c.ipv6_support,
        priority: c.wireguard_routing_rule_priority,
        table,
        mark: rules::MarkBits::allocate(c.nftables_mark_mask, on)
            .map(|m| m.wireguard)
            .unwrap_or(0),
        protocol: c.device_route_protocol,
        host_encryption: c.wireguard_host_encryption_enabled,
        keepalive: c.wireguard_persistent_keep_alive.as_secs().min(65535) as u16,
    }
}

/// The kernel's host name (Felix's default for `FelixHostname`).
fn os_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn proto_port(p: &crate::config::FailsafePort) -> rules::ProtoPort {
    rules::ProtoPort {
        proto: match p.protocol {
            crate::config::PortProtocol::Tcp => 6,
            crate::config::PortProtocol::Udp => 17,
        },
        port: p.port,
        net: p.net,
    }
}

/// What the interface monitor has told us about one interface.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IfaceInfo {
    pub index: u32,
    pub oper_up: bool,
    pub admin_up: bool,
    pub mtu: u32,
    pub addrs: BTreeSet<IpNet>,
}

/// Per-interface kernel configuration for a workload interface (§14.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfaceConf {
    /// `net.ipv4.conf.<if>.rp_filter`: the default read at start, or 0 when the workload may
    /// spoof source addresses.
    pub rp_filter: u32,
    /// Also configure IPv6 (`proxy_ndp`, `forwarding`).
    pub ipv6: bool,
}

/// The whole desired kernel state, rendered from the model.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    /// Our nf_tables tables (`ip calico`, `ip6 calico`).
    pub tables: Vec<Table>,
    /// Routes, both families, grouped by owner (an interface name, or `blackhole`).
    pub routes: BTreeMap<String, Vec<RouteSpec>>,
    /// Permanent IPv4 neighbours per workload interface.
    pub neighbours: BTreeMap<String, Vec<(IpAddr, Mac)>>,
    /// Per-interface configuration of every known workload interface.
    pub iface_conf: BTreeMap<String, IfaceConf>,
    /// The VXLAN devices of the families whose VXLAN is on, with their FDB entries (all, or
    /// when only remote nodes changed, the changed ones).
    pub vxlan: Vec<rtnl::vxlan::VxlanWanted>,
    /// tunl0, when the whole overlay is stated (`None`: as it was).
    pub ipip: Option<rtnl::ipip::IpipWanted>,
    /// When only remote nodes and blocks changed: the route groups (in `routes`) they touch,
    /// to restate besides the scope's interfaces.
    pub overlay_groups: BTreeSet<String>,
    /// `vxlan` and `overlay_groups` state only what changed (see [`Dirty::overlay_keys`]).
    pub overlay_delta: bool,
}

/// The desired state of the node and what is dirty. Pure: no I/O.
pub struct Dataplane {
    cfg: DataplaneConfig,
    model: Model,
    /// The incremental renderer and the model changes it has not rendered yet.
    inc: Incremental,
    changes: Changes,
    /// Workload endpoint ids per interface name (the smallest id wins, §14.1).
    workload_ids: BTreeMap<String, BTreeSet<WorkloadEndpointId>>,
    /// Host endpoints with interface-less ones resolved (§14.4), as last rendered.
    heps_resolved: BTreeMap<HostEndpointId, HostEndpoint>,
    /// Endpoints whose status may have changed since it was last computed.
    status_dirty: status::StatusScope,
    /// Felix's route updates by destination (blackholes for local IPAM blocks, cluster routes).
    routes: BTreeMap<String, RouteUpdate>,
    /// Cross-node networking state besides the model's VTEPs, pools and routes.
    overlay: overlay::Overlay,
    /// WireGuard's nodes, keys and CIDRs.
    wg: wireguard::Wireguard,
    /// How many VTEPs have a tunnel address of each family (IPv4, IPv6).
    vteps_with: [usize; 2],
    ifaces: BTreeMap<String, IfaceInfo>,
    datastore_in_sync: bool,
    ifaces_in_sync: bool,
    /// `net.ipv4.conf.default.rp_filter` read at start (§14.2).
    default_rp_filter: u32,
    dirty: Dirty,
    /// Workload interfaces whose configuration failed (their endpoint reports `down`).
    conf_failed: BTreeSet<String>,
    /// The undo log since the last good commit, and the updates the kernel refused.
    book: quarantine::Book,
}

impl Dataplane {
    /// An empty desired state. Fails only when the configuration cannot be rendered (a mark mask
    /// too small for Calico's bits).
    pub fn new(cfg: DataplaneConfig, default_rp_filter: u32) -> Result<Dataplane, RulesError> {
        let renderer = rules::Renderer::new(cfg.rules.clone())?;
        Ok(Dataplane {
            model: Model::new(cfg.rules.clone()),
            inc: Incremental::new(renderer),
            changes: Changes {
                all: true,
                ..Changes::default()
            },
            workload_ids: BTreeMap::new(),
            heps_resolved: BTreeMap::new(),
            status_dirty: status::StatusScope::everything(),
            overlay: overlay::Overlay::new(cfg.overlay.clone()),
            wg: wireguard::Wireguard::new(cfg.wireguard.clone()),
            vteps_with: [0; 2],
            cfg,
            routes: BTreeMap::new(),
            ifaces: BTreeMap::new(),
            datastore_in_sync: false,
            ifaces_in_sync: false,
            default_rp_filter,
            dirty: Dirty::all(),
            conf_failed: BTreeSet::new(),
            book: quarantine::Book::default(),
        })
    }

    /// The recorded model (read-only).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Felix's route updates by destination, as last received.
    pub fn route_updates(&self) -> &BTreeMap<String, RouteUpdate> {
        &self.routes
    }

    /// Validates and records one update; marks what it affects dirty. No kernel I/O. A rejected
    /// update changes nothing.
    pub fn on_update(&mut self, msg: &ToDataplane) -> Result<(), InputError> {
        if rules::has_noncanonical_policy_ids(msg) {
            let mut owned = msg.clone();
            rules::canonicalise_policy_ids(&mut owned);
            return self.on_update(&owned);
        }
        let members = validate::validate(&self.model, msg)?;
        if let Some(p) = &msg.payload {
            self.unquarantine_for(p);
            self.remember(p);
        }
        if self.wg.on_message(msg) {
            self.dirty.wireguard_changed();
        }
        if self.record(msg, members) {
            self.sync_rules_encap();
        }
        self.tables_follow_changes();
        Ok(())
    }

    /// [`Dataplane::on_update`] for a message already validated in its place in a sequence
    /// ([`validate::validate_all`], as `apply` does before it touches anything): a state
    /// document is not validated twice, nor its IP set members parsed twice, and the message
    /// moves into the model instead of being copied.
    pub fn on_validated_update(&mut self, valid: validate::Valid) {
        if let Some(p) = &valid.msg.payload {
            self.remember(p);
        }
        if self.wg.on_message(&valid.msg) {
            self.dirty.wireguard_changed();
        }
        let encap = match self.note_own(&valid.msg) {
            Some(encap) => encap,
            None => {
                let change = self.model.apply_owned(valid.msg, valid.members);
                self.note(change)
            }
        };
        if encap {
            self.sync_rules_encap();
        }
        self.tables_follow_changes();
    }

    /// Records a valid message: the dataplane's own inputs here, the rest through the model,
    /// marking what it changed. True when the encapsulations in use may have changed.
    fn record(&mut self, msg: &ToDataplane, members: Option<Members>) -> bool {
        match self.note_own(msg) {
            Some(encap) => encap,
            None => {
                let change = self.model.apply_parsed(msg, members);
                self.note(change)
            }
        }
    }

    /// Records a message the model does not hold (routes, the encapsulation, `InSync`);
    /// `None` for the model's inputs. `Some(true)` when the encapsulations in use may have
    /// changed.
    fn note_own(&mut self, msg: &ToDataplane) -> Option<bool> {
        match &msg.payload {
            Some(Payload::InSync(_)) => self.datastore_in_sync = true,
            Some(Payload::ConfigUpdate(_)) => {
                // Felix restarts its driver whenever a resolved value changes (§1.4), so the
                // configuration the agent started with stays in force.
            }
            Some(Payload::RouteUpdate(u)) => {
                let old = self.routes.insert(u.dst.clone(), u.clone());
                self.route_changed(old.as_ref(), Some(u));
            }
            Some(Payload::Encapsulation(e)) => {
                self.overlay.encap = Some(e.clone());
                self.overlay.warn_ipip(&self.model.pools);
                self.dirty.overlay_changed();
                return Some(true);
            }
            Some(Payload::RouteRemove(r)) => {
                if let Some(old) = self.routes.remove(&r.dst) {
                    self.route_changed(Some(&old), None);
                }
            }
            _ => return None,
        }
        Some(false)
    }

    /// Marks what the model's `change` affects: what to re-render, the routes, neighbours and
    /// interfaces it names, status, the overlay. True when the encapsulations in use may have
    /// changed.
    fn note(&mut self, change: Change) -> bool {
        match change {
            Change::None => {}
            Change::IpSet(id) => self.changes.ipset_whole(&id),
            Change::IpSetMembers { id, touched } => self.changes.ipset_delta(&id, &touched),
            Change::Policy(id) => self.changes.policies.extend(id),
            Change::Profile(name) => self.changes.profiles.extend(name),
            Change::Workload {
                id,
                old_iface,
                new_iface,
                unchanged,
            } => {
                if let Some(id) = &id {
                    if let Some(o) = &old_iface {
                        self.forget_workload_iface(o, id);
                    }
                    if let Some(n) = &new_iface {
                        self.workload_ids
                            .entry(n.clone())
                            .or_default()
                            .insert(id.clone());
                    }
                }
                let ifaces: Vec<String> = old_iface.into_iter().chain(new_iface).collect();
                // Felix repeats endpoints unchanged (resyncs): nothing to render then, and the
                // endpoint must not move to the side table. The host side is still re-asserted.
                if !unchanged {
                    self.changes.workloads.extend(ifaces.iter().cloned());
                }
                self.status_dirty.workloads.extend(id);
                self.mark_endpoint(ifaces);
            }
            Change::HostEndpoint => {
                self.changes.host_endpoints = true;
                self.status_dirty.hosts = true;
            }
            Change::Hosts { node, addrs } => {
                // The hosts set changes by element.
                for a in addrs {
                    self.changes
                        .internal_member(rules::statics::internal_sets::ALL_HOSTS_NET, a);
                }
                let ipip = self.overlay.ipip_on(&self.model.pools);
                if node == self.overlay.cfg.hostname {
                    // This node's own address finds the parent of the no-encap routes and of
                    // tunl0.
                    if self.overlay.cfg.noencap_routes || ipip {
                        self.dirty.overlay_changed();
                    }
                } else if ipip && self.overlay.cfg.ipip_routes {
                    // Another node's address is its IPIP routes' gateway: its blocks alone.
                    self.dirty.remote_host_changed(&node);
                }
            }
            Change::Pool { .. } => {
                self.overlay.warn_ipip(&self.model.pools);
                self.changes.base = true;
                self.dirty.overlay_changed();
                return true;
            }
            Change::Vtep { node, old } => {
                self.vtep_changed(&node, old.as_ref());
                return true;
            }
            Change::ServiceCidrs => self.changes.base = true,
        }
        false
    }

    /// A VTEP changed from `old` to what the model now holds. The VTEP set changes by element;
    /// the rules that use it stay.
    fn vtep_changed(&mut self, node: &str, old: Option<&VxlanTunnelEndpointUpdate>) {
        let new = self.model.vteps.get(node);
        for (v, sign) in [(old, -1), (new, 1)] {
            let fams = v.map(overlay::vtep_families).unwrap_or_default();
            for (n, has) in self.vteps_with.iter_mut().zip(fams) {
                if has {
                    *n = n.saturating_add_signed(sign);
                }
            }
        }
        for v in old.into_iter().chain(new) {
            for a in [&v.parent_device_ip, &v.parent_device_ipv6] {
                if let Some(a) = rules::host_ip(a) {
                    self.changes
                        .internal_member(rules::statics::internal_sets::ALL_VXLAN_NET, a);
                }
            }
        }
        if node == self.overlay.cfg.hostname {
            // This node's device, and its tunnel address among the host's.
            self.dirty.overlay_changed();
            self.refresh_this_host();
        } else {
            let was = overlay::vtep_entries(old);
            let now = overlay::vtep_entries(new);
            self.overlay.vtep_changed(node, &was, &now);
            self.dirty.remote_node_changed(node, was);
        }
    }

    /// Whether VXLAN of either family is on.
    fn vxlan_on(&self) -> bool {
        let (v4, v6) = self.vxlan_families();
        v4 || v6
    }

    /// Whether VXLAN of each family (IPv4, IPv6) is on.
    fn vxlan_families(&self) -> (bool, bool) {
        self.overlay
            .vxlan_on(&self.model.pools, self.vteps_with.map(|n| n > 0))
    }

    /// The firewall follows the encapsulations in use (VXLAN accepted from known VTEPs and
    /// untracked, masquerade on the tunnel devices), which follow the pools, VTEPs and Felix's
    /// `Encapsulation` when the configuration does not set them. A change re-renders the base.
    fn sync_rules_encap(&mut self) {
        let (v4, v6) = self.vxlan_families();
        let ipip = self.overlay.ipip_on(&self.model.pools);
        let (mut t4, mut t6) = self.overlay.tunnel_ifaces(&self.model.vteps, (v4, v6));
        t4.extend(self.overlay.ipip_tunnel_iface(&self.model.pools));
        let wg = &self.cfg.wireguard;
        t4.extend(wg.v4.enabled.then(|| wg.v4.iface.clone()));
        t6.extend((wg.ipv6 && wg.v6.enabled).then(|| wg.v6.iface.clone()));
        let c = self.inc.config();
        if (c.vxlan_enabled, c.vxlan_enabled_v6, c.ipip_enabled) == (v4, v6, ipip)
            && c.tunnel_ifaces_v4 == t4
            && c.tunnel_ifaces_v6 == t6
        {
            return;
        }
        let mut cfg = c.clone();
        cfg.vxlan_enabled = v4;
        cfg.vxlan_enabled_v6 = v6;
        cfg.ipip_enabled = ipip;
        cfg.tunnel_ifaces_v4 = t4;
        cfg.tunnel_ifaces_v6 = t6;
        self.model.config = cfg.clone();
        self.inc.set_config(cfg);
        self.changes.base = true;
        // A device comes or goes, with its tunnel address.
        self.dirty.overlay_changed();
        self.refresh_this_host();
    }

    /// A route from Felix changed (`old` → `new`). A remote VXLAN block (before and after)
    /// touches its own route group only; anything else (a local block's blackhole, a no-encap
    /// route) restates all routes.
    fn route_changed(&mut self, old: Option<&RouteUpdate>, new: Option<&RouteUpdate>) {
        let remote_block = |r: &RouteUpdate| {
            (r.ip_pool_type == IpPoolType::Vxlan as i32
                || r.ip_pool_type == IpPoolType::Ipip as i32)
                && r.types & RouteType::LocalWorkload as i32 == 0
                && !r.local_workload
        };
        if old.into_iter().chain(new).all(remote_block) {
            self.dirty
                .remote_block_changed(new.or(old).map(|r| r.dst.clone()));
        } else {
            self.dirty.all_routes_changed();
        }
    }

    /// The tables are dirty while the renderer has changes to render.
    fn tables_follow_changes(&mut self) {
        if self.changes.any() {
            self.dirty.tables_changed();
        }
    }

    fn forget_workload_iface(&mut self, iface: &str, id: &WorkloadEndpointId) {
        if let Some(ids) = self.workload_ids.get_mut(iface) {
            ids.remove(id);
            if ids.is_empty() {
                self.workload_ids.remove(iface);
            }
        }
    }

    fn mark_endpoint(&mut self, ifaces: Vec<String>) {
        for i in &ifaces {
            self.status_of_iface(i);
            self.conf_failed.remove(i);
        }
        self.dirty.endpoints_changed(ifaces);
    }

    /// Records what the interface monitor reported.
    pub fn on_iface(&mut self, ev: &rtnl::monitor::IfaceEvent) {
        use rtnl::monitor::IfaceEvent as E;
        // Host endpoints resolve by interface names and addresses; they are few.
        self.status_dirty.hosts = true;
        if self.wg.cfg.any_enabled() {
            let name = match ev {
                E::Link(l) => Some(&l.name),
                E::Renamed { new_name, .. } => Some(new_name),
                E::Removed { name, .. } | E::Addrs { name, .. } => Some(name),
                E::InSync => None,
            };
            // The device itself, or the host's MTU and address WireGuard follows.
            if name.is_some_and(|n| !self.cfg.is_workload_iface(n)) {
                self.dirty.wireguard_changed();
            }
        }
        match ev {
            E::InSync => {
                self.ifaces_in_sync = true;
                self.status_dirty.all = true;
            }
            E::Link(l) => {
                let e = self.ifaces.entry(l.name.clone()).or_default();
                let came_up = l.oper_up && !e.oper_up;
                let changed =
                    e.index != l.index || e.oper_up != l.oper_up || e.admin_up != l.admin_up;
                let mtu_changed = e.mtu != l.mtu;
                e.index = l.index;
                e.oper_up = l.oper_up;
                e.admin_up = l.admin_up;
                e.mtu = l.mtu;
                if changed {
                    self.iface_changed(&l.name, came_up);
                } else if mtu_changed
                    && !self.cfg.is_workload_iface(&l.name)
                    && (self.vxlan_on() || self.overlay.ipip_on(&self.model.pools))
                {
                    // The tunnels' MTU follows their parent's.
                    self.dirty.overlay_changed();
                }
            }
            E::Renamed {
                old_name, new_name, ..
            } => {
                if let Some(info) = self.ifaces.remove(old_name) {
                    self.ifaces.insert(new_name.clone(), info);
                }
                self.iface_changed(old_name, false);
                self.iface_changed(new_name, true);
                self.host_addrs_changed();
            }
            E::Removed { name, .. } => {
                if let Some(info) = self.ifaces.remove(name) {
                    if !info.addrs.is_empty() && !self.cfg.is_workload_iface(name) {
                        self.host_addrs_changed();
                    }
                }
                self.iface_changed(name, false);
            }
            E::Addrs { name, addrs, .. } => {
                let e = self.ifaces.entry(name.clone()).or_default();
                if &e.addrs != addrs {
                    e.addrs = addrs.clone();
                    if overlay::is_tunnel_iface(name) {
                        // Our device's address is ours to keep: look at the device again.
                        self.dirty.overlay_changed();
                    }
                    if !self.cfg.is_workload_iface(name) {
                        // `this-host` and host-endpoint resolution depend on host addresses.
                        self.host_addrs_changed();
                    }
                }
            }
        }
    }

    /// Recomputes `this-host` from the host's interfaces; host endpoints without a name may
    /// resolve differently now.
    fn host_addrs_changed(&mut self) {
        // The tunnels' parent is the interface that holds this node's address.
        if self.refresh_this_host() && (self.vxlan_on() || self.overlay.ipip_on(&self.model.pools))
        {
            self.dirty.overlay_changed();
        }
        if !self.model.host_endpoints.is_empty() {
            self.changes.host_endpoints = true;
        }
        self.tables_follow_changes();
    }

    /// This host's addresses (`this-host`): those of its interfaces that are not workloads',
    /// and the tunnel addresses its VXLAN devices are given. The overlay phase, after the
    /// tables, puts those on the devices; counting them from the VTEP spares the tables a
    /// second commit when the address appears.
    fn this_host(&self) -> BTreeSet<IpAddr> {
        let (v4, v6) = self.vxlan_families();
        let tunnel = self
            .model
            .vteps
            .get(&self.overlay.cfg.hostname)
            .into_iter()
            .flat_map(|v| [(v4, &v.ipv4_addr), (v6, &v.ipv6_addr)])
            .filter_map(|(on, a)| on.then(|| rules::host_ip(a)).flatten());
        self.ifaces
            .iter()
            .filter(|(name, _)| !self.cfg.is_workload_iface(name))
            .flat_map(|(_, i)| i.addrs.iter().map(|a| a.addr()))
            // IPv6 link-local addresses exist on every interface and are not the host's
            // addresses for policy; they would make every new veth rewrite the set.
            .filter(|a| !matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
            .chain(tunnel)
            .collect()
    }

    /// Recomputes `this-host`; true when it changed (the base tables are rendered again).
    fn refresh_this_host(&mut self) -> bool {
        let this_host = self.this_host();
        if this_host == self.model.this_host {
            return false;
        }
        self.model.this_host = this_host;
        self.changes.base = true;
        true
    }

    fn iface_changed(&mut self, name: &str, came_up: bool) {
        self.status_of_iface(name);
        if overlay::is_tunnel_iface(name) {
            // Created, deleted or flapped: look at the device, re-assert what lives on it.
            self.dirty.overlay_changed();
        } else if self.cfg.is_workload_iface(name) {
            // Routes and ARP entries of a workload interface are (re)asserted when it flaps
            // (§15); sysctls are applied when it comes up (§14.2). Status may change.
            self.dirty.workload_iface_changed(name, came_up);
            if came_up {
                self.conf_failed.remove(name);
            }
        } else if !self.model.host_endpoints.is_empty() {
            // Host endpoint resolution may change.
            self.changes.host_endpoints = true;
            self.dirty.tables_changed();
        }
    }

    /// Both InSyncs seen: the kernel may be touched (§10.2, §22.2).
    pub fn ready(&self) -> bool {
        self.datastore_in_sync && self.ifaces_in_sync
    }

    /// Whether Felix's `InSync` has been seen.
    pub fn datastore_in_sync(&self) -> bool {
        self.datastore_in_sync
    }

    /// Marks the datastore in sync without a message (state documents, `apply`).
    pub fn set_datastore_in_sync(&mut self) {
        self.datastore_in_sync = true;
    }

    /// Whether the interface monitor's first listing has been seen.
    pub fn ifaces_in_sync(&self) -> bool {
        self.ifaces_in_sync
    }

    /// Marks the interface view complete (one-shot commands read it with a dump).
    pub fn set_ifaces_in_sync(&mut self) {
        self.ifaces_in_sync = true;
    }

    /// The configuration the dataplane runs with.
    pub fn cfg(&self) -> &DataplaneConfig {
        &self.cfg
    }

    /// What changed since the last apply.
    pub fn dirty(&self) -> &Dirty {
        &self.dirty
    }

    /// The nf_tables phase committed what was rendered.
    pub fn tables_applied(&mut self) {
        self.dirty.tables_applied();
    }

    /// What WireGuard wants of each family it manages: whole the first time, then what
    /// changed since the last call (each call's result must reach the kernel side).
    pub fn wireguard_desired(&mut self) -> Vec<(rtnl::IpFamily, rtnl::wgsync::WgWanted)> {
        let mtu = self.host_mtu();
        self.wg.take_desired(&self.model.hosts, mtu)
    }

    /// WireGuard's state (keys, conflicts).
    pub fn wireguard(&self) -> &wireguard::Wireguard {
        &self.wg
    }

    /// Takes "Felix echoed another key for this node": the device is read again and its key
    /// reported.
    pub fn take_wireguard_echo(&mut self) -> bool {
        self.wg.take_echo_changed()
    }

    /// The WireGuard phase completed.
    pub fn wireguard_applied(&mut self) {
        self.dirty.wireguard_applied();
    }

    /// The MTU of the interface holding this node's address (1500 while none does): the
    /// tunnels' MTU is derived from it.
    fn host_mtu(&self) -> u32 {
        let me = self.model.hosts.get(&self.cfg.overlay.hostname);
        let mine: Vec<IpAddr> = me
            .into_iter()
            .flat_map(|h| [&h.ipv4_addr, &h.ipv6_addr])
            .filter_map(|a| rules::host_ip(a))
            .collect();
        self.ifaces
            .values()
            .find(|i| i.addrs.iter().any(|a| mine.contains(&a.addr())))
            .map_or(1500, |i| i.mtu)
    }

    /// The VXLAN devices are as desired; `created`: one was just created, and its routes and
    /// neighbours are to be restated.
    pub fn overlay_applied(&mut self, created: bool) {
        self.dirty.overlay_applied(created);
    }

    /// The routes phase completed without errors.
    pub fn routes_applied(&mut self) {
        self.dirty.routes_applied();
    }

    /// The neighbours phase completed.
    pub fn neighbours_applied(&mut self) {
        self.dirty.neighbours_applied();
    }

    /// Routes, neighbours and the overlay are someone else's (`RouteSyncDisabled`): nothing of
    /// them stays dirty.
    pub fn host_routes_skipped(&mut self) {
        self.dirty.host_routes_skipped();
    }

    /// Ends the host phases if routes, neighbours and the overlay are all applied (the scope
    /// resets to what changes from now on); returns whether they were.
    pub fn finish_host_phases(&mut self) -> bool {
        self.dirty.finish_host_phases()
    }

    /// `iface` needs no more configuring: done, down (it is configured when it comes up), or
    /// gone.
    pub fn iface_conf_done(&mut self, iface: &str) {
        self.dirty.iface_done(iface);
    }

    /// All routes are to be looked at again (unknown routes' grace period ended).
    pub fn recheck_routes(&mut self) {
        self.dirty.all_routes_changed();
    }

    /// What the host phases state, and the workload interfaces they are scoped to (`None`:
    /// all), for an apply that resyncs routes when `resync_routes`. Only when one of those
    /// phases has work: an IP set member must not cost a pass over every workload.
    pub fn desired_for_apply(&self, resync_routes: bool) -> (Desired, Option<BTreeSet<String>>) {
        let d = &self.dirty;
        let host_work = !d.ifaces().is_empty()
            || (!self.cfg.route_sync_disabled
                && (d.routes() || d.neighbours() || d.overlay() || resync_routes));
        // Only the workload interfaces that changed (and those to configure), unless a resync
        // or something global asks for all of them.
        let scope: Option<BTreeSet<String>> = if resync_routes || d.overlay() {
            None
        } else {
            d.host_scope().map(|s| {
                let mut s = s.clone();
                s.extend(d.ifaces().iter().cloned());
                s
            })
        };
        let desired = if host_work {
            self.desired_host_in(scope.as_ref())
        } else {
            Desired::default()
        };
        (desired, scope)
    }

    /// Records that configuring `iface` failed (its endpoint goes `down` until it succeeds).
    pub fn iface_conf_failed(&mut self, iface: &str) {
        self.status_of_iface(iface);
        self.conf_failed.insert(iface.to_string());
    }

    /// The status of the workload endpoints on `iface` may have changed.
    fn status_of_iface(&mut self, iface: &str) {
        if let Some(ids) = self.workload_ids.get(iface) {
            self.status_dirty.workloads.extend(ids.iter().cloned());
        }
    }

    /// Known interfaces.
    pub fn ifaces(&self) -> &BTreeMap<String, IfaceInfo> {
        &self.ifaces
    }

    /// The winning workload endpoint per interface name (§14.1: smallest id wins).
    fn workloads_by_iface(&self) -> BTreeMap<&str, (&WorkloadEndpointId, &WorkloadEndpoint)> {
        self.workload_ids
            .iter()
            .filter_map(|(iface, ids)| {
                let id = ids.iter().next()?;
                Some((iface.as_str(), (id, self.model.workloads.get(id)?)))
            })
            .collect()
    }

    /// The model the renderer sees: host addresses filled in, and host endpoints without a name
    /// resolved to the interfaces whose addresses they expect (§14.4).
    pub fn render_model(&self) -> Model {
        let mut m = self.model.clone();
        m.host_endpoints = self.resolve_heps();
        m
    }

    /// Host endpoints with those without a name resolved to the interfaces whose addresses
    /// they expect (§14.4).
    fn resolve_heps(&self) -> BTreeMap<HostEndpointId, HostEndpoint> {
        let mut out = BTreeMap::new();
        for (id, hep) in &self.model.host_endpoints {
            if !hep.name.is_empty() {
                out.insert(id.clone(), hep.clone());
                continue;
            }
            for iface in self.hep_ifaces(hep) {
                let mut h = hep.clone();
                h.name = iface.clone();
                // Keeps the original id's sort position, so the smallest id still wins.
                let synth = HostEndpointId {
                    endpoint_id: format!("{}\u{0}{iface}", id.endpoint_id),
                };
                out.insert(synth, h);
            }
        }
        out
    }

    /// Renders what changed since the last call, as patches to the tables (an
    /// update costs what it touches). The first call renders everything.
    pub fn tables_patch(&mut self) -> Vec<TablePatch> {
        let changes = std::mem::take(&mut self.changes);
        if changes.all || changes.host_endpoints {
            self.heps_resolved = self.resolve_heps();
        }
        self.inc.update(
            &Inputs {
                model: &self.model,
                workload_ids: &self.workload_ids,
                host_endpoints: &self.heps_resolved,
            },
            &changes,
        )
    }

    /// Whether the side table holds endpoints (or copies) that a merge would move.
    pub fn side_pending(&self) -> bool {
        self.inc.side_pending()
    }

    /// Where the workload interfaces live: (in the side table, in both tables while a merge is
    /// half done). Everything else is in the main table.
    pub fn side_placement(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let (side, lingering) = self.inc.placement();
        (side.clone(), lingering.clone())
    }

    /// Asks the next [`Dataplane::tables_patch`] for one step of merging the side table back
    /// into the main one (see [`rules::incremental`]).
    pub fn request_side_merge(&mut self) {
        if self.inc.side_pending() {
            self.changes.merge_side = true;
            self.dirty.tables_changed();
        }
    }

    /// The endpoints whose status may have changed since the last call; `None` when none.
    pub fn take_status_dirty(&mut self) -> Option<status::StatusScope> {
        let scope = std::mem::take(&mut self.status_dirty);
        (!scope.is_empty()).then_some(scope)
    }

    /// Interfaces a host endpoint without a name resolves to: non-workload interfaces holding one
    /// of its expected addresses.
    fn hep_ifaces(&self, hep: &HostEndpoint) -> Vec<String> {
        let expected: BTreeSet<IpAddr> = hep
            .expected_ipv4_addrs
            .iter()
            .chain(&hep.expected_ipv6_addrs)
            .filter_map(|a| {
                a.parse::<IpAddr>()
                    .ok()
                    .or_else(|| a.parse::<IpNet>().ok().map(|n| n.addr()))
            })
            .collect();
        self.ifaces
            .iter()
            .filter(|(name, i)| {
                !self.cfg.is_workload_iface(name)
                    && i.addrs.iter().any(|a| expected.contains(&a.addr()))
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Renders the whole desired kernel state.
    pub fn desired(&self) -> Result<Desired, RulesError> {
        Ok(Desired {
            tables: self.render_tables()?,
            ..self.desired_host()
        })
    }

    /// Renders all tables from scratch (what `rules::render` gives for
    /// [`Dataplane::render_model`], without copying the model).
    pub fn render_tables(&self) -> Result<Vec<Table>, RulesError> {
        rules::incremental::render_all(&Inputs {
            model: &self.model,
            workload_ids: &self.workload_ids,
            host_endpoints: &self.resolve_heps(),
        })
    }

    /// The desired routes, neighbours and per-interface configuration (no tables).
    pub fn desired_host(&self) -> Desired {
        self.desired_host_in(None)
    }

    /// [`Dataplane::desired_host`] for the workload interfaces in `scope` only (no blackhole
    /// routes); `None`: everything.
    pub fn desired_host_in(&self, scope: Option<&BTreeSet<String>>) -> Desired {
        let mut d = Desired::default();
        let weps: BTreeMap<&str, (&WorkloadEndpointId, &WorkloadEndpoint)> = match scope {
            None => self.workloads_by_iface(),
            Some(ifaces) => ifaces
                .iter()
                .filter_map(|iface| {
                    let id = self.workload_ids.get(iface)?.iter().next()?;
                    Some((iface.as_str(), (id, self.model.workloads.get(id)?)))
                })
                .collect(),
        };
        for (iface, (id, wep)) in &weps {
            self.desired_workload(iface, id, wep, &mut d);
        }
        if !self.cfg.route_sync_disabled && scope.is_none() {
            let blackholes = self.blackholes();
            if !blackholes.is_empty() {
                d.routes.insert("blackhole".into(), blackholes);
            }
            self.desired_overlay(&mut d);
        } else if let (false, Some(keys)) = (
            self.cfg.route_sync_disabled,
            self.dirty.overlay_delta_keys(),
        ) {
            // Only remote nodes and blocks changed: their entries and route groups alone.
            let (v4, v6) = self.vxlan_families();
            let delta = self.overlay.delta(
                [v4, v6],
                self.overlay.ipip_on(&self.model.pools),
                &self.model.vteps,
                &self.model.hosts,
                &self.routes,
                &self.ifaces,
                |n| self.cfg.is_workload_iface(n),
                self.cfg.routes,
                keys,
            );
            d.overlay_delta = true;
            d.overlay_groups = delta.routes.keys().cloned().collect();
            d.routes.extend(delta.routes);
            d.vxlan = delta.devices;
        }
        d
    }

    /// One workload interface's configuration, routes and permanent neighbours.
    fn desired_workload(
        &self,
        iface: &str,
        id: &WorkloadEndpointId,
        wep: &WorkloadEndpoint,
        d: &mut Desired,
    ) {
        let spoofing = !wep.allow_spoofed_source_prefixes.is_empty();
        d.iface_conf.insert(
            iface.to_string(),
            IfaceConf {
                rp_filter: if spoofing { 0 } else { self.default_rp_filter },
                ipv6: self.cfg.ipv6,
            },
        );
        if wep.state != "active" || self.cfg.route_sync_disabled {
            return;
        }
        if wep.live_migration_role == LiveMigrationRole::Target as i32 {
            return;
        }
        let mut routes = Vec::new();
        let mut neigh = Vec::new();
        let mac = validate::parse_mac(&wep.mac);
        let floating = self.cfg.rules.floating_ips_enabled || id.orchestrator_id == "openstack";
        let nat_ext = wep
            .ipv4_nat
            .iter()
            .chain(&wep.ipv6_nat)
            .filter(|_| floating)
            .map(|n| n.ext_ip.as_str());
        for net in wep
            .ipv4_nets
            .iter()
            .chain(&wep.ipv6_nets)
            .map(String::as_str)
            .chain(nat_ext)
        {
            let Some(net) = parse_host_net(net) else {
                continue;
            };
            let v6 = net.addr().is_ipv6();
            if v6 && !self.cfg.ipv6 {
                continue;
            }
            let p = &self.cfg.routes;
            let mut r = RouteSpec::device(net, iface.to_string(), p.protocol, p.metric(v6));
            r.src = p.src(v6);
            routes.push(r);
            if let (false, Some(mac)) = (v6, mac) {
                if wep.ipv4_nets.iter().any(|n| parse_host_net(n) == Some(net)) {
                    neigh.push((net.addr(), mac));
                }
            }
        }
        if !routes.is_empty() {
            d.routes.insert(iface.to_string(), routes);
        }
        if !neigh.is_empty() {
            d.neighbours.insert(iface.to_string(), neigh);
        }
    }

    /// Blackhole routes for this node's own blocks (never a single address).
    fn blackholes(&self) -> Vec<RouteSpec> {
        self.routes
            .values()
            .filter(|r| r.types & (RouteType::LocalWorkload as i32) != 0 && !r.local_workload)
            .filter_map(|r| {
                let net = r.dst.parse::<IpNet>().ok()?;
                let v6 = net.addr().is_ipv6();
                (net.prefix_len() < net.max_prefix_len() && (!v6 || self.cfg.ipv6)).then(|| {
                    let p = &self.cfg.routes;
                    RouteSpec::blackhole(net.trunc(), p.felix_protocol(), p.metric(v6))
                })
            })
            .collect()
    }

    /// The whole overlay: VXLAN devices with every FDB entry, neighbours and route groups.
    fn desired_overlay(&self, d: &mut Desired) {
        let o = self.overlay.desired(
            &self.model.pools,
            &self.model.vteps,
            &self.model.hosts,
            &self.routes,
            &self.ifaces,
            |n| self.cfg.is_workload_iface(n),
            self.cfg.routes,
        );
        if !o.noencap_routes.is_empty() {
            d.routes
                .insert(overlay::NOENCAP_GROUP.into(), o.noencap_routes);
        }
        d.ipip = Some(o.ipip);
        // A remote block's route, VXLAN or IPIP, is a group of its own, so that a node joining
        // or leaving restates only its blocks' groups (see `Overlay::delta`).
        for r in o.ipip_routes {
            d.routes
                .entry(overlay::block_group(&r.dst))
                .or_default()
                .push(r);
        }
        for dev in o.devices {
            for r in dev.tunnel_routes.into_iter().chain(dev.same_subnet_routes) {
                d.routes
                    .entry(overlay::block_group(&r.dst))
                    .or_default()
                    .push(r);
            }
            if !dev.neighbours.is_empty() {
                d.neighbours.insert(dev.name.into(), dev.neighbours);
            }
            d.vxlan.push(rtnl::vxlan::VxlanWanted {
                name: dev.name.into(),
                spec: dev.spec,
                fdb: rtnl::vxlan::Entries::All(dev.fdb),
                neighbour_changes: Vec::new(),
            });
        }
    }

    /// Endpoint status as the kernel state now implies (§14.1, §14.4). Workload endpoints are
    /// borrowed: only those whose status changed are copied, into the report to Felix.
    pub fn statuses(
        &self,
    ) -> (
        status::WorkloadStatuses<'_>,
        BTreeMap<HostEndpointId, Status>,
    ) {
        self.statuses_in(&status::StatusScope::everything())
    }

    /// [`Dataplane::statuses`] of the endpoints in `scope` only (workloads of `scope` that no
    /// longer exist are left out; host endpoints: all or none).
    pub fn statuses_in(
        &self,
        scope: &status::StatusScope,
    ) -> (
        status::WorkloadStatuses<'_>,
        BTreeMap<HostEndpointId, Status>,
    ) {
        let status = |id: &WorkloadEndpointId, wep: &WorkloadEndpoint| {
            if self.quarantine_touches(&quarantine::ObjKey::Workload(id.clone()), Some(wep)) {
                // What is programmed for it is not what was asked (§1.3: `error`).
                return Status::Error;
            }
            let up = wep.state == "active"
                && self.ifaces.get(&wep.name).is_some_and(|i| i.oper_up)
                && !self.conf_failed.contains(&wep.name);
            if up {
                Status::Up
            } else {
                Status::Down
            }
        };
        // A quarantined endpoint that had no good version is not in the model: it reports
        // `error` as it was sent.
        let set_aside = self.book.quarantined.iter().filter_map(|(k, q)| match k {
            quarantine::ObjKey::Workload(id) if !self.model.workloads.contains_key(id) => {
                q.workload().map(|w| (id, (Status::Error, w)))
            }
            _ => None,
        });
        let mut w: status::WorkloadStatuses<'_> = if scope.all {
            self.model
                .workloads
                .iter()
                .map(|(id, wep)| (id, (status(id, wep), wep)))
                .collect()
        } else {
            scope
                .workloads
                .iter()
                .filter_map(|id| self.model.workloads.get_key_value(id))
                .map(|(id, wep)| (id, (status(id, wep), wep)))
                .collect()
        };
        for (id, st) in set_aside {
            if scope.all || scope.workloads.contains(id) {
                w.insert(id, st);
            }
        }
        let mut h = BTreeMap::new();
        if !(scope.all || scope.hosts) {
            return (w, h);
        }
        for (id, hep) in &self.model.host_endpoints {
            let st = if hep.name == "*" {
                Status::Up
            } else {
                let ifaces = if hep.name.is_empty() {
                    self.hep_ifaces(hep)
                } else if self.ifaces.contains_key(&hep.name) {
                    vec![hep.name.clone()]
                } else {
                    Vec::new()
                };
                if ifaces.is_empty() {
                    Status::Error
                } else if ifaces
                    .iter()
                    .all(|i| self.ifaces.get(i).is_some_and(|i| i.oper_up))
                {
                    Status::Up
                } else {
                    Status::Down
                }
            };
            h.insert(id.clone(), st);
        }
        (w, h)
    }
}

/// `10.0.0.5`, `10.0.0.5/32` → a host network; anything wider is not a workload address route.
fn parse_host_net(s: &str) -> Option<IpNet> {
    let net = s
        .parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))?;
    Some(net.trunc())
}

#[cfg(test)]
mod tests;
