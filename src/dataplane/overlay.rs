//! Cross-node networking (reference §15/§17): from this node's and the other
//! nodes' VXLAN tunnel endpoints, Felix's route updates (IPAM blocks), the IP pools and the host's
//! interfaces, the VXLAN device, its FDB, its ARP entries and the cluster routes wanted. Pure: no
//! I/O; the loop hands the result to the kernel seam.
//!
//! - `vxlan.calico` exists once VXLAN is on (config `VXLANEnabled`, else Felix's `Encapsulation`,
//!   else a pool with VXLAN, else a VTEP has arrived: Encapsulation may follow InSync) and this
//!   node's VTEP and the interface holding its address are known.
//! - Per remote VTEP: a permanent ARP entry (tunnel IP → VTEP MAC) on the device and an FDB
//!   entry (VTEP MAC → node IP).
//! - Per remote VXLAN block: `via <VTEP tunnel IP> dev vxlan.calico onlink` (with `VXLANMTU`
//!   when set), or in cross-subnet mode `via <node IP> dev <parent> onlink proto 80`; a remote
//!   tunnel address in its own /32 block (or borrowed) goes straight onto the device. No VTEP
//!   yet: no route until it comes.
//! - IPv6 VXLAN, IPIP and WireGuard are not built here: their pools and routes are reported once
//!   as unsupported and otherwise ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::proto::VxlanTunnelEndpointUpdate;
use crate::proto::{Encapsulation, IpPoolType, IpamPool, RouteType, RouteUpdate};
use crate::rtnl::neigh::Mac;
use crate::rtnl::routes::{RouteSpec, RouteTarget};
use crate::rtnl::vxlan::VxlanSpec;

use super::validate::parse_mac;
use super::IfaceInfo;

/// Felix's IPv4 VXLAN device.
pub const VXLAN_IFACE_V4: &str = "vxlan.calico";
/// The route group of same-subnet (cross-subnet mode) routes via the parent interface.
pub const SAME_SUBNET_GROUP: &str = "vxlan-same-subnet";

/// The overlay's configuration.
#[derive(Debug, Clone)]
pub struct OverlayConfig {
    /// This node's name (`FelixHostname`): the VTEP with this name is the local one.
    pub hostname: String,
    /// `VXLANEnabled`; `None`: derived.
    pub vxlan_enabled: Option<bool>,
    /// `VXLANVNI` (4096).
    pub vni: u32,
    /// `VXLANPort` (4789).
    pub port: u16,
    /// `VXLANMTU`; `None` (0): the kernel's default, the parent's MTU less 50.
    pub mtu: Option<u32>,
}

impl Default for OverlayConfig {
    fn default() -> Self {
        OverlayConfig {
            hostname: String::new(),
            vxlan_enabled: None,
            vni: 4096,
            port: 4789,
            mtu: None,
        }
    }
}

/// What the overlay wants in the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlayDesired {
    /// The device (`None`: VXLAN off, or this node's VTEP or its parent not known yet).
    pub device: Option<VxlanSpec>,
    /// MAC → remote node IP.
    pub fdb: Vec<(Mac, IpAddr)>,
    /// Tunnel IP → MAC, on the device.
    pub neighbours: Vec<(IpAddr, Mac)>,
    /// Routes via the device.
    pub tunnel_routes: Vec<RouteSpec>,
    /// Same-subnet routes via the parent interface.
    pub same_subnet_routes: Vec<RouteSpec>,
}

/// Overlay state that is not in the rules model.
#[derive(Debug, Default)]
pub struct Overlay {
    pub cfg: OverlayConfig,
    /// Felix's last `Encapsulation`.
    pub encap: Option<Encapsulation>,
    /// What was already reported as unsupported (each said once).
    warned: BTreeSet<String>,
}

/// Route parameters owned by the dataplane configuration.
#[derive(Debug, Clone, Copy)]
pub struct RouteParams {
    /// `DeviceRouteProtocol`: routes on the VXLAN device carry it.
    pub device_protocol: u8,
    /// Felix's protocol for its other routes (80 while the device protocol is boot).
    pub felix_protocol: u8,
    pub metric_v4: u32,
}

fn strip(s: &str) -> Option<IpAddr> {
    s.split('/').next()?.parse().ok()
}

fn mode_on(m: &str) -> bool {
    !m.is_empty() && !m.eq_ignore_ascii_case("never")
}

impl Overlay {
    pub fn new(cfg: OverlayConfig) -> Overlay {
        Overlay {
            cfg,
            ..Overlay::default()
        }
    }

    /// Whether IPv4 VXLAN is on.
    pub fn vxlan_enabled(
        &self,
        pools: &BTreeMap<String, IpamPool>,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
    ) -> bool {
        if let Some(v) = self.cfg.vxlan_enabled {
            return v;
        }
        if self.encap.as_ref().is_some_and(|e| e.vxlan_enabled) {
            return true;
        }
        pools.values().any(|p| {
            mode_on(&p.vxlan_mode) && p.cidr.parse::<IpNet>().is_ok_and(|n| n.addr().is_ipv4())
        }) || vteps.values().any(|v| !v.ipv4_addr.is_empty())
    }

    /// Reports, once, a pool this build cannot program: IPIP, or VXLAN over IPv6.
    pub fn warn_pool(&mut self, id: &str, p: &IpamPool) {
        if mode_on(&p.ipip_mode) && !mode_on(&p.vxlan_mode) {
            self.warn_once(format!("pool {id}"), || {
                tracing::warn!(pool = %id, cidr = %p.cidr, ipip_mode = %p.ipip_mode,
                    "IPIP is not supported by this build (no ipip kernel module): the pool's routes are not programmed");
            });
        }
        if mode_on(&p.vxlan_mode) && p.cidr.parse::<IpNet>().is_ok_and(|n| n.addr().is_ipv6()) {
            self.warn_once(format!("pool {id}"), || {
                tracing::warn!(pool = %id, cidr = %p.cidr,
                    "IPv6 VXLAN (vxlan-v6.calico) is not supported by this build: the pool's routes are not programmed");
            });
        }
    }

    /// Reports, once, a route this build cannot program: one through WireGuard or IPIP.
    pub fn warn_route(&mut self, r: &RouteUpdate) {
        let wg = r.tunnel_type.as_ref().is_some_and(|t| t.wireguard);
        let ipip = r.ip_pool_type == IpPoolType::Ipip as i32
            && r.types & (RouteType::RemoteWorkload as i32) != 0;
        if wg || ipip {
            let what = if wg { "WireGuard" } else { "IPIP" };
            self.warn_once(format!("route {what} {}", r.dst), || {
                tracing::warn!(dst = %r.dst, node = %r.dst_node_name,
                    "a route needs {what}, which this build does not support: not programmed");
            });
        }
    }

    fn warn_once(&mut self, key: String, f: impl FnOnce()) {
        if self.warned.insert(key) {
            f();
        }
    }

    /// The desired overlay state.
    pub fn desired(
        &self,
        pools: &BTreeMap<String, IpamPool>,
        vteps: &BTreeMap<String, VxlanTunnelEndpointUpdate>,
        routes: &BTreeMap<String, RouteUpdate>,
        ifaces: &BTreeMap<String, IfaceInfo>,
        is_workload_iface: impl Fn(&str) -> bool,
        p: RouteParams,
    ) -> OverlayDesired {
        let mut d = OverlayDesired::default();
        if !self.vxlan_enabled(pools, vteps) {
            return d;
        }
        // Remote VTEPs (IPv4 part): tunnel IP, MAC, node IP.
        let mut remote: BTreeMap<&str, (IpAddr, Mac, IpAddr)> = BTreeMap::new();
        let mut local = None;
        for (node, v) in vteps {
            let (Some(tip), Some(mac), Some(host)) = (
                strip(&v.ipv4_addr),
                parse_mac(&v.mac),
                strip(&v.parent_device_ip),
            ) else {
                continue;
            };
            if *node == self.cfg.hostname {
                local = Some((tip, mac, host));
            } else {
                remote.insert(node.as_str(), (tip, mac, host));
                d.fdb.push((mac, host));
                d.neighbours.push((tip, mac));
            }
        }
        // The parent: the host interface that holds this node's address (§2.3).
        let parent = local.and_then(|(_, _, host)| {
            ifaces
                .iter()
                .find(|(name, i)| {
                    !is_workload_iface(name)
                        && name.as_str() != VXLAN_IFACE_V4
                        && i.addrs.iter().any(|a| a.addr() == host)
                })
                .map(|(name, _)| name.clone())
        });
        if let (Some((tip, mac, host)), Some(parent)) = (local, &parent) {
            d.device = Some(VxlanSpec {
                name: VXLAN_IFACE_V4.into(),
                vni: self.cfg.vni,
                port: self.cfg.port,
                parent: parent.clone(),
                local: host,
                mac,
                mtu: self.cfg.mtu,
                addr: tip,
            });
        }
        let vxlan = IpPoolType::Vxlan as i32;
        let remote_workload = RouteType::RemoteWorkload as i32;
        let remote_tunnel = RouteType::RemoteTunnel as i32;
        for r in routes.values() {
            if r.ip_pool_type != vxlan {
                continue;
            }
            let Ok(dst) = r.dst.parse::<IpNet>() else {
                continue;
            };
            if !dst.addr().is_ipv4() {
                continue;
            }
            let dst = dst.trunc();
            let tunnel_own_block = r.types & remote_tunnel != 0 && r.types & remote_workload != 0;
            let borrowed_tunnel = r.types & remote_tunnel != 0 && r.borrowed;
            if r.types & remote_workload == 0 && !borrowed_tunnel {
                continue;
            }
            let node_ip = strip(&r.dst_node_ip);
            if let (true, Some(parent), Some(gw)) = (r.same_subnet, &parent, node_ip) {
                d.same_subnet_routes.push(RouteSpec {
                    dst,
                    target: RouteTarget::Gateway {
                        via: gw,
                        dev: Some(parent.clone()),
                        onlink: true,
                    },
                    protocol: p.felix_protocol,
                    metric: p.metric_v4,
                    src: None,
                    mtu: None,
                });
                continue;
            }
            let target = if tunnel_own_block || borrowed_tunnel {
                RouteTarget::Device(VXLAN_IFACE_V4.into())
            } else {
                let Some((tip, _, _)) = remote.get(r.dst_node_name.as_str()) else {
                    // Programmed once the node's VTEP arrives.
                    continue;
                };
                RouteTarget::Gateway {
                    via: *tip,
                    dev: Some(VXLAN_IFACE_V4.into()),
                    onlink: true,
                }
            };
            d.tunnel_routes.push(RouteSpec {
                dst,
                target,
                protocol: p.device_protocol,
                metric: p.metric_v4,
                src: None,
                mtu: self.cfg.mtu,
            });
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vtep(node: &str, n: u8) -> VxlanTunnelEndpointUpdate {
        VxlanTunnelEndpointUpdate {
            node: node.into(),
            mac: format!("66:00:00:00:00:{n:02x}"),
            ipv4_addr: format!("10.65.{n}.0"),
            parent_device_ip: format!("172.31.0.1{n}"),
            ..Default::default()
        }
    }

    fn block(node: &str, n: u8, types: RouteType, same_subnet: bool) -> RouteUpdate {
        RouteUpdate {
            types: types as i32,
            ip_pool_type: IpPoolType::Vxlan as i32,
            dst: format!("10.65.{n}.0/26"),
            dst_node_name: node.into(),
            dst_node_ip: format!("172.31.0.1{n}"),
            same_subnet,
            ..Default::default()
        }
    }

    const P: RouteParams = RouteParams {
        device_protocol: 3,
        felix_protocol: 80,
        metric_v4: 1024,
    };

    fn eth0(ip: &str) -> BTreeMap<String, IfaceInfo> {
        BTreeMap::from([(
            "eth0".to_string(),
            IfaceInfo {
                index: 2,
                oper_up: true,
                admin_up: true,
                addrs: [format!("{ip}/24").parse().unwrap()].into(),
            },
        )])
    }

    #[test]
    fn remote_blocks_go_through_the_tunnel_and_same_subnet_ones_direct() {
        let o = Overlay::new(OverlayConfig {
            hostname: "n0".into(),
            ..OverlayConfig::default()
        });
        let vteps: BTreeMap<_, _> = [vtep("n0", 0), vtep("n1", 1), vtep("n2", 2)]
            .into_iter()
            .map(|v| (v.node.clone(), v))
            .collect();
        let routes: BTreeMap<_, _> = [
            block("n1", 1, RouteType::RemoteWorkload, false),
            block("n2", 2, RouteType::RemoteWorkload, true),
            block("n3", 3, RouteType::RemoteWorkload, false),
            block("n0", 0, RouteType::LocalWorkload, false),
        ]
        .into_iter()
        .map(|r| (r.dst.clone(), r))
        .collect();
        let d = o.desired(
            &BTreeMap::new(),
            &vteps,
            &routes,
            &eth0("172.31.0.10"),
            |n| n.starts_with("cali"),
            P,
        );
        let dev = d.device.expect("local VTEP and parent known");
        assert_eq!(
            (dev.parent.as_str(), dev.local, dev.addr),
            (
                "eth0",
                "172.31.0.10".parse().unwrap(),
                "10.65.0.0".parse().unwrap()
            )
        );
        assert_eq!(d.fdb.len(), 2, "remote VTEPs only");
        assert_eq!(d.neighbours.len(), 2);
        // n1 via its VTEP; n3 has no VTEP yet: no route.
        assert_eq!(d.tunnel_routes.len(), 1);
        assert_eq!(
            d.tunnel_routes[0].to_string(),
            "10.65.1.0/26 metric 1024 via 10.65.1.0 dev vxlan.calico onlink proto 3"
        );
        assert_eq!(
            d.same_subnet_routes[0].to_string(),
            "10.65.2.0/26 metric 1024 via 172.31.0.12 dev eth0 onlink proto 80"
        );
    }

    #[test]
    fn vxlan_is_on_by_config_encapsulation_pool_or_vtep() {
        let mut o = Overlay::default();
        let none = BTreeMap::new();
        assert!(!o.vxlan_enabled(&none, &none_vteps()));
        let pools = BTreeMap::from([(
            "10.65.0.0-16".to_string(),
            IpamPool {
                cidr: "10.65.0.0/16".into(),
                vxlan_mode: "Always".into(),
                ..Default::default()
            },
        )]);
        assert!(o.vxlan_enabled(&pools, &none_vteps()));
        o.encap = Some(Encapsulation {
            vxlan_enabled: true,
            ..Default::default()
        });
        assert!(o.vxlan_enabled(&none, &none_vteps()));
        o.cfg.vxlan_enabled = Some(false);
        assert!(!o.vxlan_enabled(&pools, &none_vteps()));
    }

    fn none_vteps() -> BTreeMap<String, VxlanTunnelEndpointUpdate> {
        BTreeMap::new()
    }
}
