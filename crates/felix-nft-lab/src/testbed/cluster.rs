//! A cluster in network namespaces: an underlay segment, node namespaces on it, and pods on each
//! node laid out the way Calico's CNI plugin leaves them ([`super::topology`]). What runs on the
//! nodes and what it is told is the caller's (see [`super::controller`] for the messages).
//!
//! ```text
//!                         [lan ns] br0 ── the underlay segment (no address)
//!                 ┌──────────────┼──────────────┐
//!   [node-1] eth0 172.31.0.11/24  [node-2] eth0 .12   …   each: default via 172.31.0.1
//!      cali… ── eth0 [pod]            cali… ── eth0 [pod]          (an address nobody holds)
//! ```
//!
//! With more segments ([`ClusterSpec::routed`], for cross-subnet mode) each gets its own bridge
//! (`br1`, `br2`, … in the same underlay namespace), and the underlay namespace becomes the
//! router between them: every bridge then holds its segment's first address, the nodes'
//! gateway, and the namespace forwards.
//!
//! What the bed does is what the machines and the CNI plugin do, nothing more: the underlay
//! (bridges in their own namespace, one veth per node, renamed `eth0` on the node), the node's
//! address and default route, and per pod the CNI plugin's veth, address and routes. The VXLAN
//! device, routes, ARP, FDB, forwarding on the nodes and rules are the dataplane's job.
//!
//! Facts the bed relies on: a node needs a default route even when nothing answers at the
//! gateway, because proxy ARP for the pods' `169.254.1.1` answers only for an address the node
//! can route out of another interface; pods need `net.ipv4.ping_group_range` for the datagram
//! ICMP probes (set by [`super::topology`] in every namespace it makes, and here in the nodes).
//!
//! Everything lives in namespaces the bed made (`PREFIX-ROLE-PID-N`) and is deleted on drop,
//! also on panic; a node's underlay veth dies with its namespace. No external program is run.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};
use rtnetlink::{LinkBridge, LinkUnspec};

use super::topology::{build_workload, netns_safe, prepare_ns, Workload, WorkloadSpec};
use super::TestbedError;
use rtnl::devconf::ProcSys;
use rtnl::netns::{unique_netns_name, NamedNetNs, NetNs};
use rtnl::{link, RtnlError, RtnlHandle};

/// The bridge of the first underlay segment; segment `i` has `br<i>`.
pub const UNDERLAY_BRIDGE: &str = "br0";
/// A node's underlay interface.
pub const NODE_UPLINK: &str = "eth0";

/// What to build first: the underlay. Nodes are added one by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Prefix of every namespace name (`PREFIX-ROLE-PID-N`).
    pub prefix: String,
    /// The underlay subnet; its first address is every node's gateway and is held by nobody
    /// (unless there are routed segments).
    pub underlay: Ipv4Net,
    /// Further segments, each on its own bridge, routed to the first and to each other by the
    /// underlay namespace (module doc). Empty: one flat segment.
    pub routed: Vec<Ipv4Net>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            prefix: "fnt-cl".to_string(),
            underlay: Ipv4Net::new(Ipv4Addr::new(172, 31, 0, 0), 24)
                .unwrap_or_else(|_| Ipv4Net::default()),
            routed: Vec::new(),
        }
    }
}

/// One node to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Unique in the cluster; also part of its namespace name.
    pub name: String,
    /// Its underlay address, inside [`ClusterSpec::underlay`] or one of the routed segments.
    pub ip: Ipv4Addr,
    pub pods: Vec<WorkloadSpec>,
}

/// A node as built.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub ip: Ipv4Addr,
    /// The prefix length of its segment.
    pub prefix_len: u8,
    /// Its gateway: the first address of its segment.
    pub gateway: Ipv4Addr,
    // Field order is drop order: pods before the node.
    pods: Vec<Workload>,
    ns: NamedNetNs,
}

impl Node {
    /// The node's namespace (where its agent acts).
    pub fn ns(&self) -> &NetNs {
        self.ns.ns()
    }

    /// Its name under `/run/netns` (`felix-nft run --netns NAME`, `ip -n NAME`).
    pub fn netns_name(&self) -> &str {
        self.ns.name()
    }

    /// Its pods, in creation order.
    pub fn pods(&self) -> &[Workload] {
        &self.pods
    }

    /// The pod called `name`.
    pub fn pod(&self, name: &str) -> Option<&Workload> {
        self.pods.iter().find(|p| p.name == name)
    }

    /// Leaves the node's namespaces in place; returns their names, node first.
    fn keep(self) -> Vec<String> {
        let mut names = vec![self.ns.keep()];
        names.extend(self.pods.into_iter().map(Workload::keep));
        names
    }
}

/// A built cluster. Dropping it deletes every namespace it made (pods, nodes, then the underlay).
#[derive(Debug)]
pub struct Cluster {
    // Field order is drop order: nodes before the underlay.
    nodes: Vec<Node>,
    lan: NamedNetNs,
    spec: ClusterSpec,
    /// Underlay ports made so far (names `port<N>` in the underlay namespace).
    ports: u32,
}

impl Cluster {
    /// Builds the underlay: a namespace holding a bridge per segment (and routing between them
    /// when there are several). Needs root and a tokio runtime.
    pub async fn build(spec: &ClusterSpec) -> Result<Cluster, TestbedError> {
        let segments = segments(spec);
        for (i, a) in segments.iter().enumerate() {
            if a.prefix_len() > 29 {
                return Err(TestbedError::Spec(format!(
                    "underlay segment {a} has no room for nodes"
                )));
            }
            if let Some(b) = segments[..i]
                .iter()
                .find(|b| b.contains(&a.network()) || a.contains(&b.network()))
            {
                return Err(TestbedError::Spec(format!(
                    "underlay segments {b} and {a} overlap"
                )));
            }
        }
        let lan = NetNs::create_named(&unique_netns_name(&format!("{}-lan", spec.prefix)))?;
        let lh = RtnlHandle::connect(Some(lan.ns())).map_err(rtnl("connecting to", "underlay"))?;
        let routed = segments.len() > 1;
        for (i, seg) in segments.iter().enumerate() {
            let br = format!("br{i}");
            lh.handle()
                .link()
                .add(LinkBridge::new(&br).build())
                .execute()
                .await
                .map_err(netlink("creating", &br))?;
            link::set_up(&lh, &br, true)
                .await
                .map_err(rtnl("setting up", &br))?;
            if routed {
                let gw = IpNet::new(IpAddr::V4(first_host(*seg)), seg.prefix_len())
                    .map_err(|e| TestbedError::Spec(e.to_string()))?;
                link::add_address(&lh, &br, gw)
                    .await
                    .map_err(rtnl("adding the gateway address to", &br))?;
            }
        }
        if routed {
            let sys = ProcSys::new(Some(lan.ns().try_clone().map_err(|source| {
                TestbedError::Io {
                    op: "cloning the underlay namespace handle",
                    source,
                }
            })?));
            sys.write("net/ipv4/ip_forward", "1")
                .map_err(rtnl("setting", "net.ipv4.ip_forward in the underlay"))?;
        }
        Ok(Cluster {
            nodes: Vec::new(),
            lan,
            spec: spec.clone(),
            ports: 0,
        })
    }

    /// The underlay namespace.
    pub fn lan(&self) -> &NetNs {
        self.lan.ns()
    }

    /// The underlay namespace's name under `/run/netns`.
    pub fn lan_netns_name(&self) -> &str {
        self.lan.name()
    }

    /// The default gateway of the first segment's nodes: its first address (held by nobody
    /// unless the segments are routed).
    pub fn gateway(&self) -> Ipv4Addr {
        first_host(self.spec.underlay)
    }

    /// The segment holding `ip`, with its index (its bridge is `br<index>`).
    pub fn segment_of(&self, ip: Ipv4Addr) -> Option<(usize, Ipv4Net)> {
        segments(&self.spec)
            .into_iter()
            .enumerate()
            .find(|(_, s)| s.contains(&ip))
    }

    /// The nodes, in the order they were added.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Adds a node: its namespace, its underlay interface with its address and default route,
    /// then its pods. On error what was made for it is deleted again.
    pub async fn add_node(&mut self, spec: &NodeSpec) -> Result<&Node, TestbedError> {
        if self.node(&spec.name).is_some() {
            return Err(TestbedError::Spec(format!(
                "node {:?} exists already",
                spec.name
            )));
        }
        let segment = self.segment_of(spec.ip);
        let free = segment.is_some_and(|(_, u)| {
            spec.ip != u.network() && spec.ip != u.broadcast() && spec.ip != first_host(u)
        }) && self.nodes.iter().all(|n| n.ip != spec.ip);
        let Some((seg, u)) = segment.filter(|_| free) else {
            return Err(TestbedError::Spec(format!(
                "node {:?}: address {} is not a free host address of an underlay segment ({}; \
                 each segment's first address is its gateway)",
                spec.name,
                spec.ip,
                segments(&self.spec)
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let ns = NetNs::create_named(&unique_netns_name(&format!(
            "{}-{}",
            self.spec.prefix,
            netns_safe(&spec.name)
        )))?;
        prepare_ns(ns.ns())?;
        let n = self.ports;
        self.ports += 1;
        let port = format!("port{n}");
        let lh =
            RtnlHandle::connect(Some(self.lan.ns())).map_err(rtnl("connecting to", "underlay"))?;
        let nh = RtnlHandle::connect(Some(ns.ns())).map_err(rtnl("connecting to", &spec.name))?;
        let bridge = format!("br{seg}");
        if let Err(e) = self
            .plumb_node(&lh, &nh, &ns, spec, &port, &bridge, u)
            .await
        {
            // The port would stay in the underlay, which lives on; both ends go with it.
            if let Err(del) = link::delete(&lh, &port).await {
                if !del.is_vanished_interface() {
                    tracing::warn!(ifname = %port, error = %del, "test bed: could not remove half-made underlay port");
                }
            }
            return Err(e);
        }
        let mut node = Node {
            name: spec.name.clone(),
            ip: spec.ip,
            prefix_len: u.prefix_len(),
            gateway: first_host(u),
            pods: Vec::new(),
            ns,
        };
        for p in &spec.pods {
            node.pods
                .push(build_workload(&self.spec.prefix, &nh, p).await?);
        }
        self.nodes.push(node);
        Ok(&self.nodes[self.nodes.len() - 1])
    }

    #[allow(clippy::too_many_arguments)]
    async fn plumb_node(
        &self,
        lh: &RtnlHandle,
        nh: &RtnlHandle,
        ns: &NamedNetNs,
        spec: &NodeSpec,
        port: &str,
        bridge_name: &str,
        segment: Ipv4Net,
    ) -> Result<(), TestbedError> {
        let what = |s: &str| format!("{s} of node {}", spec.name);
        let tmp = format!("tmp{port}");
        link::create_veth(lh, port, &tmp)
            .await
            .map_err(rtnl("creating", &what("underlay veth")))?;
        link::move_to_netns(lh, &tmp, ns.ns())
            .await
            .map_err(rtnl("moving", &what("underlay veth end")))?;
        let bridge = link::index_of(lh, "attaching to bridge", bridge_name)
            .await
            .map_err(rtnl("looking up", bridge_name))?;
        let index = link::index_of(lh, "attaching to bridge", port)
            .await
            .map_err(rtnl("looking up", port))?;
        lh.handle()
            .link()
            .set(LinkUnspec::new_with_index(index).controller(bridge).build())
            .execute()
            .await
            .map_err(netlink("attaching to the bridge", port))?;
        link::set_up(lh, port, true)
            .await
            .map_err(rtnl("setting up", port))?;
        link::rename(nh, &tmp, NODE_UPLINK)
            .await
            .map_err(rtnl("renaming", &what("underlay veth end")))?;
        for ifname in ["lo", NODE_UPLINK] {
            link::set_up(nh, ifname, true)
                .await
                .map_err(rtnl("setting up", &what(ifname)))?;
        }
        let addr = IpNet::new(IpAddr::V4(spec.ip), segment.prefix_len())
            .map_err(|e| TestbedError::Spec(e.to_string()))?;
        link::add_address(nh, NODE_UPLINK, addr)
            .await
            .map_err(rtnl("adding", &what("underlay address")))?;
        // Module doc: proxy ARP for the pods' gateway needs a route out of another interface.
        let default = IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
            .map_err(|e| TestbedError::Spec(e.to_string()))?;
        link::add_route(
            nh,
            default,
            Some(NODE_UPLINK),
            Some(IpAddr::V4(first_host(segment))),
        )
        .await
        .map_err(rtnl("adding", &what("default route")))
    }

    /// Starts a pod on `node` the way the CNI plugin does.
    pub async fn add_pod(
        &mut self,
        node: &str,
        spec: &WorkloadSpec,
    ) -> Result<&Workload, TestbedError> {
        let prefix = self.spec.prefix.clone();
        let Some(n) = self.nodes.iter_mut().find(|n| n.name == node) else {
            return Err(TestbedError::Spec(format!("no node {node:?}")));
        };
        if n.pod(&spec.name).is_some() {
            return Err(TestbedError::Spec(format!(
                "pod {:?} exists already on {node}",
                spec.name
            )));
        }
        let nh = RtnlHandle::connect(Some(n.ns())).map_err(rtnl("connecting to", node))?;
        let w = build_workload(&prefix, &nh, spec).await?;
        n.pods.push(w);
        Ok(&n.pods[n.pods.len() - 1])
    }

    /// Removes a node: its pods' namespaces and its own go, and with them its underlay port.
    /// False when there is no such node.
    pub fn remove_node(&mut self, name: &str) -> bool {
        let before = self.nodes.len();
        self.nodes.retain(|n| n.name != name);
        before != self.nodes.len()
    }

    /// Leaves every namespace in place (`--keep`) and returns their names, the underlay first;
    /// delete them with [`NetNs::delete_named`] or `ip netns del`.
    pub fn keep(self) -> Vec<String> {
        let mut names = vec![self.lan.keep()];
        names.extend(self.nodes.into_iter().flat_map(Node::keep));
        names
    }
}

/// Every segment: the first underlay, then the routed ones.
fn segments(spec: &ClusterSpec) -> Vec<Ipv4Net> {
    std::iter::once(spec.underlay)
        .chain(spec.routed.iter().copied())
        .map(|s| s.trunc())
        .collect()
}

/// A segment's first host address: its nodes' gateway.
fn first_host(net: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.network()).saturating_add(1))
}

fn rtnl(op: &'static str, object: &str) -> impl FnOnce(RtnlError) -> TestbedError {
    let object = object.to_string();
    move |source| TestbedError::Rtnl {
        op,
        object,
        source: Box::new(source),
    }
}

fn netlink(op: &'static str, object: &str) -> impl FnOnce(rtnetlink::Error) -> TestbedError {
    let object = object.to_string();
    move |source| TestbedError::Netlink {
        op,
        object,
        source: Box::new(source),
    }
}
