//! `felix-nft demo --cluster [--encap vxlan|ipip|wireguard]`: three nodes on one underlay
//! segment, a felix-nft agent on each, pods on each node, and a policy that matters across
//! nodes; then a fourth node joins and leaves. It shows what each agent programmed for the
//! overlay (read back from the kernel) and which cross-node flows pass, measured with real
//! connections, and removes every namespace it made (unless `--keep`).
//!
//! The encapsulation decides the pool and what is read back: VXLAN (a pool with VXLAN always:
//! `vxlan.calico`, its FDB and ARP entries, the routes through it), IPIP (IPIP always: `tunl0`
//! and the routes through it) or WireGuard (a pool without encapsulation whose routes Felix
//! programs, and WireGuard on: each agent reports its key, the controller hands every node
//! every key as calico-node and the calculation graph would, and `wireguard.cali`, its peers
//! and table 1 are read back). A kernel without the module IPIP or WireGuard needs is said at
//! once, and the demo fails.
//!
//! The nodes come from [`testbed::cluster`](crate::testbed::cluster), their messages from
//! [`testbed::controller`](crate::testbed::controller) (what Felix's calculation graph would send
//! each node). Each agent is the real loop in-process ([`super::agent`]), one per node namespace,
//! so the demo needs no binary on the path and finishes in seconds; `crates/felix-nft-lab/tests/it/cluster_vxlan.rs`
//! runs the same kind of cluster with one `felix-nft run` process per node.
//!
//! Layering as the single-node demo: a tool on top of the stack, acting only in namespaces it
//! created, running no external program.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};
use netlink_packet_route::link::{InfoData, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};

use super::agent::Agent;
use super::{
    ipv4_routes, print_matrix, settled_matrix, DemoError, DemoOptions, APPLY_TIMEOUT, NETNS_PREFIX,
    PROBE_TIMEOUT,
};
use crate::testbed::cluster::{Cluster, ClusterSpec, NodeSpec};
use crate::testbed::controller::{Controller, IpSetSource, NodeInfo, PodInfo};
use crate::testbed::probe::{run_matrix, Flow, MatrixReport, Proto, TcpServer, Verdict};
use crate::testbed::topology::WorkloadSpec;
use crate::testbed::TestbedError;
use felix_api::protocol::NumberOrName;
use felix_api::{
    IpamPool, Policy, PolicyId, PortRange, Profile, Protocol, Rule, TierInfo, ToDataplane,
};
use felix_nft::config::Config;
use felix_nft::dataplane::overlay::VXLAN_IFACE_V4;
use felix_nft::dataplane::DataplaneConfig;
use rtnl::ipip::IPIP_IFACE;
use rtnl::neigh::{list_permanent, Mac};
use rtnl::netns::NetNs;
use rtnl::vxlan::{dump_fdb, fmt_mac};
use rtnl::wireguard::WgSocket;
use rtnl::{link, RtnlHandle};

const POOL: &str = "10.65.0.0/16";
const POOL_ID: &str = "10.65.0.0-16";
const CLIENTS_SET: &str = "s:clients";
const PROFILE: &str = "kns.default";
const PORT: u16 = 8080;
const UNDERLAY_PREFIX: u8 = 24;
/// Felix's WireGuard device and table.
const WG_IFACE: &str = "wireguard.cali";
const WG_TABLE: u32 = 1;

/// How the demo's nodes carry pod traffic between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Encap {
    #[default]
    Vxlan,
    Ipip,
    Wireguard,
}

impl Encap {
    fn name(self) -> &'static str {
        match self {
            Encap::Vxlan => "vxlan",
            Encap::Ipip => "ipip",
            Encap::Wireguard => "wireguard",
        }
    }

    /// The device pod traffic between nodes goes through.
    fn device(self) -> &'static str {
        match self {
            Encap::Vxlan => VXLAN_IFACE_V4,
            Encap::Ipip => IPIP_IFACE,
            Encap::Wireguard => WG_IFACE,
        }
    }

    /// The routing table the routes through it are in.
    fn table(self) -> u32 {
        match self {
            Encap::Wireguard => WG_TABLE,
            _ => rtnl::routes::RT_TABLE_MAIN,
        }
    }

    fn pool(self) -> IpamPool {
        let (vxlan, ipip) = match self {
            Encap::Vxlan => ("Always", "Never"),
            Encap::Ipip => ("Never", "Always"),
            Encap::Wireguard => ("Never", "Never"),
        };
        IpamPool {
            cidr: POOL.to_string(),
            vxlan_mode: vxlan.to_string(),
            ipip_mode: ipip.to_string(),
            ..IpamPool::default()
        }
    }

    /// What every node learns of each node, besides its pods' business.
    fn node_news(self) -> &'static str {
        match self {
            Encap::Vxlan => "VTEP, block and host address",
            Encap::Ipip => "block and host address",
            Encap::Wireguard => "block and host address (and, once published, its WireGuard key)",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Encap::Vxlan => "VXLAN always",
            Encap::Ipip => "IPIP always",
            Encap::Wireguard => {
                "no encapsulation (Felix programs the routes), WireGuard between the nodes"
            }
        }
    }
}

/// One node of the demo: its name, index (its address is `172.31.0.1<k>`, its block
/// `10.65.<k>.0/26`) and its one pod (name, role label).
struct Plan {
    node: &'static str,
    k: u8,
    pod: &'static str,
    role: &'static str,
}

const PLAN: [Plan; 4] = [
    Plan {
        node: "node-1",
        k: 1,
        pod: "client",
        role: "client",
    },
    Plan {
        node: "node-2",
        k: 2,
        pod: "server",
        role: "server",
    },
    Plan {
        node: "node-3",
        k: 3,
        pod: "batch",
        role: "batch",
    },
    Plan {
        node: "node-4",
        k: 4,
        pod: "client-4",
        role: "client",
    },
];

impl Plan {
    fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(172, 31, 0, 10 + self.k)
    }
    fn block(&self) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::new(10, 65, self.k, 0), 26).unwrap_or_default()
    }
    fn pod_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 65, self.k, 2)
    }
}

/// What the cluster demo found.
#[derive(Debug, Clone)]
pub struct ClusterOutcome {
    /// The matrices: three nodes, after the fourth joined, after it left.
    pub matrices: Vec<MatrixReport>,
    /// Every read-back check held (every node converged; nothing of the leaver stayed).
    pub converged: bool,
    /// Namespace names left in place (`--keep`), the underlay first; empty otherwise.
    pub kept: Vec<String>,
}

impl ClusterOutcome {
    /// True when every flow did what the policy says and every node held what it should.
    pub fn all_match(&self) -> bool {
        self.converged && self.matrices.iter().all(MatrixReport::all_match)
    }
}

/// The overlay of one node, read back from its kernel.
#[derive(Debug, Clone, Default)]
struct OverlayState {
    encap: Encap,
    /// The device: what sets it apart (`vni 4096`, `port 51820`), its MTU, its address.
    device: Option<(String, u32, Option<IpNet>)>,
    /// VXLAN: the FDB and permanent ARP entries.
    fdb: BTreeMap<Mac, IpAddr>,
    arp: Vec<(IpAddr, Option<Mac>)>,
    /// WireGuard: each peer's endpoint and allowed IPs.
    peers: Vec<(Option<std::net::SocketAddr>, Vec<IpNet>)>,
    /// Routes to blocks through the device (`dst via gw`; WireGuard's in its table).
    tunnel_routes: Vec<(IpNet, Option<IpAddr>)>,
    blackholes: Vec<IpNet>,
}

impl OverlayState {
    /// Whether this node holds exactly the overlay for `peers` (the other nodes).
    fn holds(&self, peers: &[&NodeInfo]) -> bool {
        let routes_ok = self.tunnel_routes.len() == peers.len()
            && peers.iter().all(|p| {
                self.tunnel_routes.iter().any(|(dst, gw)| {
                    *dst == IpNet::V4(p.block)
                        && (self.encap != Encap::Ipip || *gw == Some(IpAddr::V4(p.ip)))
                })
            });
        let extra_ok = match self.encap {
            Encap::Vxlan => {
                self.fdb.len() == peers.len()
                    && peers.iter().all(|p| {
                        parse_mac(&p.vtep_mac)
                            .is_some_and(|m| self.fdb.get(&m) == Some(&IpAddr::V4(p.ip)))
                    })
                    && self.arp.len() == peers.len()
                    && peers.iter().all(|p| {
                        self.arp
                            .iter()
                            .any(|(ip, _)| *ip == IpAddr::V4(p.tunnel_ip))
                    })
            }
            Encap::Ipip => true,
            Encap::Wireguard => {
                self.peers.len() == peers.len()
                    && peers.iter().all(|p| {
                        self.peers.iter().any(|(ep, ips)| {
                            ep.is_some_and(|e| e.ip() == IpAddr::V4(p.ip))
                                && ips.contains(&IpNet::V4(p.block))
                        })
                    })
            }
        };
        self.device.is_some() && routes_ok && extra_ok
    }

    /// Whether anything of `gone` is still here.
    fn remembers(&self, gone: &NodeInfo) -> bool {
        let mac = parse_mac(&gone.vtep_mac);
        let ip = IpAddr::V4(gone.ip);
        mac.is_some_and(|m| self.fdb.contains_key(&m))
            || self.fdb.values().any(|i| *i == ip)
            || self
                .arp
                .iter()
                .any(|(a, _)| *a == IpAddr::V4(gone.tunnel_ip))
            || self
                .tunnel_routes
                .iter()
                .any(|(dst, gw)| *dst == IpNet::V4(gone.block) || *gw == Some(ip))
            || self
                .peers
                .iter()
                .any(|(ep, _)| ep.is_some_and(|e| e.ip() == ip))
    }
}

fn parse_mac(s: &str) -> Option<Mac> {
    let v: Vec<u8> = s
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}

/// Runs the cluster demo, printing to `out`. `Ok` means it ran to the end; whether every flow
/// and every node did what it should is in the outcome.
pub fn run(opts: &DemoOptions, out: &mut dyn Write) -> Result<ClusterOutcome, DemoError> {
    if !super::is_root() {
        return Err(DemoError::NotRoot);
    }
    let t0 = Instant::now();
    let rt = super::runtime()?;
    say!(
        out,
        "felix-nft demo --cluster --encap {}: nodes and pods in network namespaces, one felix-nft \
         agent per node; nothing on this host is changed",
        opts.encap.name()
    );
    say!(out);
    let mut lab = Lab::build(rt, opts.encap, out)?;
    let mut converged = lab.sync_three_nodes(out)?;
    lab.show_overlay(out)?;
    let m1 = lab.measure_across_nodes(out)?;
    let (joined, m2) = lab.join_fourth_node(out)?;
    converged &= joined;
    let (left, m3) = lab.withdraw_fourth_node(out, &m2)?;
    converged &= left;
    let (kept, applies) = lab.remove_or_keep(out, opts.keep)?;
    let matrices = vec![m1, m2, m3];
    print_verdict(out, &matrices, converged, t0, applies)?;
    Ok(ClusterOutcome {
        matrices,
        converged,
        kept,
    })
}

/// The cluster while the demo runs. Fields drop in declaration order, so on an early error the
/// listeners close and the agents stop before the namespaces they act in are deleted, and the
/// runtime goes last.
struct Lab {
    servers: Vec<TcpServer>,
    agents: BTreeMap<&'static str, Agent>,
    ctl: Controller,
    cluster: Cluster,
    encap: Encap,
    rt: tokio::runtime::Runtime,
}

impl Lab {
    /// Builds the underlay and the first three nodes, each with its pod and a listener in it, and
    /// shows them.
    fn build(
        rt: tokio::runtime::Runtime,
        encap: Encap,
        out: &mut dyn Write,
    ) -> Result<Lab, DemoError> {
        let bed = |op| move |source| DemoError::Testbed { op, source };
        let spec = ClusterSpec {
            prefix: NETNS_PREFIX.to_string(),
            ..ClusterSpec::default()
        };
        let mut cluster = rt
            .block_on(Cluster::build(&spec))
            .map_err(bed("building the underlay"))?;
        rt.block_on(kernel_has(cluster.lan(), encap))?;
        let mut ctl = controller(encap);
        let mut servers = Vec::new();
        for p in &PLAN[..3] {
            add_node(&rt, &mut cluster, &mut ctl, p)?;
            servers.push(listener(&cluster, p)?);
        }
        say!(
            out,
            "cluster: underlay {} on a bridge (namespace {}); IP pool {POOL}, {}; one /26 block \
             per node",
            spec.underlay,
            cluster.lan_netns_name(),
            encap.describe()
        );
        for p in &PLAN[..3] {
            print_node(out, &ctl, p, encap)?;
        }
        say!(out);
        Ok(Lab {
            servers,
            agents: BTreeMap::new(),
            ctl,
            cluster,
            encap,
            rt,
        })
    }

    /// Step 1: what the controller sends each of the three nodes, and how long their agents
    /// took to reach `DataplaneInSync`. `Ok(false)` when the overlay then did not converge.
    fn sync_three_nodes(&mut self, out: &mut dyn Write) -> Result<bool, DemoError> {
        let first = self.ctl.flush();
        let clients = clients_sent(&first);
        say!(
            out,
            "1. the controller computes each node's messages as Felix's calculation graph would: \
             its own pod, the policy, profile and IP set that pod uses; the pool; every node's \
             {}",
            self.encap.node_news()
        );
        say!(
            out,
            "   {}",
            first
                .iter()
                .map(|(n, m)| format!("{n}: {} messages", m.len()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        say!(
            out,
            "   server's policy: allow tcp/{PORT} from IP set {CLIENTS_SET} = pods labelled \
             role=client on any node (now {clients}); anything else ends the tier: drop"
        );
        let t_sync = Instant::now();
        for p in &PLAN[..3] {
            let agent = start_agent(&self.cluster, p, self.encap)?;
            agent.send(first.get(p.node).cloned().unwrap_or_default())?;
            self.agents.insert(p.node, agent);
        }
        let mut keys = Vec::new();
        for (node, a) in &self.agents {
            if let Some(key) = a.wait_in_sync(APPLY_TIMEOUT)? {
                keys.push((*node, key));
            }
        }
        say!(
            out,
            "   all three agents in sync after {} ms (each its DataplaneInSync)",
            t_sync.elapsed().as_millis()
        );
        if self.encap == Encap::Wireguard {
            self.publish_keys(out, &keys)?;
        }
        let converged = wait_converged(&self.rt, &self.cluster, &self.ctl, self.encap)?;
        say!(out);
        Ok(converged)
    }

    /// WireGuard: each agent reported its public key with its first apply; the controller
    /// publishes them (calico-node writes a node's key to its Node, the calculation graph sends
    /// every node every key), and every agent is sent its news.
    fn publish_keys(
        &mut self,
        out: &mut dyn Write,
        keys: &[(&'static str, String)],
    ) -> Result<(), DemoError> {
        say!(
            out,
            "   each agent made a private key in its kernel and reported the public one (as \
             WireguardStatusUpdate):"
        );
        for (node, key) in keys {
            say!(out, "     {node}: {key}");
            self.ctl.set_wireguard_key(node, Some(key.clone()));
        }
        let news = self.ctl.flush();
        for (n, msgs) in &news {
            if let Some(a) = self.agents.get(n.as_str()) {
                a.send(msgs.clone())?;
            }
        }
        say!(
            out,
            "   the controller publishes them: every node is sent every node's \
             wireguard_endpoint_update (key and WireGuard address), its own included"
        );
        Ok(())
    }

    /// Step 2: what each agent programmed for the overlay, read back from its kernel.
    fn show_overlay(&self, out: &mut dyn Write) -> Result<(), DemoError> {
        say!(
            out,
            "2. what each agent programmed for the overlay (read back from its kernel):"
        );
        print_overlay(out, &self.rt, &self.cluster, &self.ctl, self.encap)?;
        say!(out);
        Ok(())
    }

    /// Step 3: the traffic matrix across the three nodes.
    fn measure_across_nodes(&self, out: &mut dyn Write) -> Result<MatrixReport, DemoError> {
        let (flows, why) = flows_three(&self.cluster);
        let m1 = settled_matrix(&flows);
        say!(
            out,
            "3. traffic across nodes, real TCP/ICMP pod to pod over {} ({} ms timeout):",
            self.encap.device(),
            PROBE_TIMEOUT.as_millis()
        );
        print_matrix(out, &flows, &why, &m1, None)?;
        say!(out);
        Ok(m1)
    }

    /// Step 4: a node joins. Its pod is a client, so node-2's set gains a member; shows what
    /// the others are sent, how long they took to converge, and the flows to and from the new
    /// pod. The bool is `false` when the overlay did not converge.
    fn join_fourth_node(&mut self, out: &mut dyn Write) -> Result<(bool, MatrixReport), DemoError> {
        let p4 = &PLAN[3];
        add_node(&self.rt, &mut self.cluster, &mut self.ctl, p4)?;
        self.servers.push(listener(&self.cluster, p4)?);
        let join = self.ctl.flush();
        say!(
            out,
            "4. {} joins with pod {} (role=client, {}): the controller sends it its snapshot, and \
             every other node its {}",
            p4.node,
            p4.pod,
            p4.pod_ip(),
            self.encap.node_news()
        );
        for (n, msgs) in join.iter().filter(|(n, _)| *n != p4.node) {
            say!(out, "   {n}: {}", kinds(msgs));
        }
        let t_join = Instant::now();
        let agent4 = start_agent(&self.cluster, p4, self.encap)?;
        agent4.send(join.get(p4.node).cloned().unwrap_or_default())?;
        let mut join: BTreeMap<String, Vec<ToDataplane>> =
            join.into_iter().filter(|(n, _)| n != p4.node).collect();
        if self.encap == Encap::Wireguard {
            // Its key comes with its first apply; then every node learns it, node-4 included.
            if let Some(key) = agent4.wait_in_sync(APPLY_TIMEOUT)? {
                say!(out, "   {} reported its key {key}", p4.node);
                self.ctl.set_wireguard_key(p4.node, Some(key));
            }
            for (n, msgs) in self.ctl.flush() {
                say!(out, "   then {n}: {}", kinds(&msgs));
                join.entry(n).or_default().extend(msgs);
            }
        }
        self.agents.insert(p4.node, agent4);
        let at = (&self.cluster, &self.ctl, self.encap);
        let converged = deliver(out, &self.rt, at, &self.agents, join.iter(), t_join)?;
        let (flows, why) = flows_joined(&self.cluster, true, self.encap);
        let m2 = settled_matrix(&flows);
        print_matrix(out, &flows, &why, &m2, None)?;
        say!(out);
        Ok((converged, m2))
    }

    /// Step 5: the fourth node leaves. The controller withdraws it everywhere while its pod still
    /// runs, so what stops the traffic is the withdrawal; then its agent stops and its namespaces
    /// go. Flips are marked against `joined`, the matrix while it was a member. The bool is
    /// `false` when the overlay did not converge or something of the node stayed.
    fn withdraw_fourth_node(
        &mut self,
        out: &mut dyn Write,
        joined: &MatrixReport,
    ) -> Result<(bool, MatrixReport), DemoError> {
        let p4 = &PLAN[3];
        let gone = self.ctl.node(p4.node).cloned();
        self.ctl.remove_node(p4.node);
        let leave = self.ctl.flush();
        say!(
            out,
            "5. {} leaves: the controller withdraws it from every node{}",
            p4.node,
            match self.encap {
                Encap::Vxlan => " (route before VTEP, as Felix orders them)",
                _ => ", in Felix's order",
            }
        );
        for (n, msgs) in &leave {
            say!(out, "   {n}: {}", kinds(msgs));
        }
        let t_leave = Instant::now();
        let at = (&self.cluster, &self.ctl, self.encap);
        let mut converged = deliver(out, &self.rt, at, &self.agents, leave.iter(), t_leave)?;
        if let Some(gone) = &gone {
            converged &= self.nothing_left_of(out, gone)?;
        }
        // One round, no warm-up: a warm-up towards the leaver would only prime a failed ARP.
        let (flows, why) = flows_joined(&self.cluster, false, self.encap);
        let m3 = run_matrix(&flows, PROBE_TIMEOUT);
        print_matrix(out, &flows, &why, &m3, Some(joined))?;
        if let Some(a) = self.agents.remove(p4.node) {
            a.stop()?;
        }
        self.servers.pop();
        self.cluster.remove_node(p4.node);
        say!(
            out,
            "   {}'s agent stopped and its namespaces are deleted",
            p4.node
        );
        say!(out);
        Ok((converged, m3))
    }

    /// Reads back the first three nodes' overlays and says whether anything of `gone` is still
    /// in one of them. `Ok(false)` when something is.
    fn nothing_left_of(&self, out: &mut dyn Write, gone: &NodeInfo) -> Result<bool, DemoError> {
        let mut stray = Vec::new();
        for p in &PLAN[..3] {
            let Some(node) = self.cluster.node(p.node) else {
                continue;
            };
            if self
                .rt
                .block_on(read_overlay(node.ns(), self.encap))?
                .remembers(gone)
            {
                stray.push(p.node);
            }
        }
        if stray.is_empty() {
            let what = match self.encap {
                Encap::Vxlan => format!(
                    "its MAC in no FDB, {} in no ARP table, {} in no route",
                    gone.tunnel_ip, gone.block
                ),
                Encap::Ipip => format!("{} in no route", gone.block),
                Encap::Wireguard => format!("no peer, {} in no route", gone.block),
            };
            say!(out, "   nothing of {} is left anywhere: {what}", gone.name);
        } else {
            say!(
                out,
                "   ✗ {} still hold something of {}",
                stray.join(", "),
                gone.name
            );
        }
        Ok(stray.is_empty())
    }

    /// Step 6: stops the agents, closes the listeners, and deletes the namespaces or, with
    /// `keep`, leaves them and says how to look and remove them. Returns the namespaces kept and
    /// the agents' applies, summed.
    fn remove_or_keep(
        self,
        out: &mut dyn Write,
        keep: bool,
    ) -> Result<(Vec<String>, u64), DemoError> {
        let mut applies = 0;
        for (_, a) in self.agents {
            applies += a.stop()?.applies;
        }
        drop(self.servers);
        let mut kept = Vec::new();
        if keep {
            kept = self.cluster.keep();
            say!(
                out,
                "6. kept for inspection (the agents have stopped; what they programmed stays). \
                 Look with"
            );
            let node = kept.get(1).map_or("NODE", String::as_str);
            let dev = self.encap.device();
            say!(out, "     ip -n {node} -d link show {dev}");
            match self.encap {
                Encap::Vxlan => say!(out, "     bridge -n {node} fdb show dev {dev}"),
                Encap::Ipip => say!(out, "     ip -n {node} route show dev {dev}"),
                Encap::Wireguard => {
                    say!(out, "     ip netns exec {node} wg show {dev}");
                    say!(out, "     ip -n {node} route show table {WG_TABLE}");
                    say!(out, "     ip -n {node} rule show");
                }
            }
            say!(out, "     ip netns exec {node} nft list ruleset");
            say!(out, "   and remove them with");
            for n in &kept {
                say!(out, "     ip netns del {n}");
            }
        } else {
            drop(self.cluster);
            say!(
                out,
                "6. removed everything: the agents stopped, and every namespace the demo made is \
                 deleted"
            );
        }
        Ok((kept, applies))
    }
}

/// The last line: whether every flow did what the policy says and every node held what it
/// should, and how long the demo took.
fn print_verdict(
    out: &mut dyn Write,
    matrices: &[MatrixReport],
    converged: bool,
    t0: Instant,
    applies: u64,
) -> Result<(), DemoError> {
    let mismatches: usize = matrices.iter().map(|m| m.mismatches().len()).sum();
    say!(
        out,
        "{} in {:.1} s ({applies} applies by the agents)",
        match (mismatches, converged) {
            (0, true) => "every flow did what the policy says, and every node held what it should"
                .to_string(),
            (0, false) => "✗ a node did NOT hold what it should".to_string(),
            (n, _) => format!("✗ {n} flows did NOT do what the policy says"),
        },
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The cluster-wide model: the pool, the profile every pod has, the IP set of clients and the
/// server's policy.
fn controller(encap: Encap) -> Controller {
    let mut c = Controller::new();
    c.set_pool(POOL_ID, encap.pool());
    let allow = || Rule {
        action: "allow".to_string(),
        ..Rule::default()
    };
    c.set_profile(
        PROFILE,
        Profile {
            inbound_rules: vec![allow()],
            outbound_rules: vec![allow()],
        },
    );
    c.set_ipset(
        CLIENTS_SET,
        IpSetSource::Labels([("role".to_string(), "client".to_string())].into()),
    );
    c.set_policy(
        server_policy(),
        Policy {
            inbound_rules: vec![Rule {
                action: "allow".to_string(),
                protocol: Some(Protocol {
                    number_or_name: Some(NumberOrName::Name("tcp".to_string())),
                }),
                dst_ports: vec![PortRange {
                    first: i32::from(PORT),
                    last: i32::from(PORT),
                }],
                src_ip_set_ids: vec![CLIENTS_SET.to_string()],
                ..Rule::default()
            }],
            ..Policy::default()
        },
    );
    c
}

fn server_policy() -> PolicyId {
    PolicyId {
        name: "server.allow-clients".to_string(),
        kind: "GlobalNetworkPolicy".to_string(),
        ..PolicyId::default()
    }
}

/// Builds a node and its pod, and tells the controller about both.
fn add_node(
    rt: &tokio::runtime::Runtime,
    cluster: &mut Cluster,
    ctl: &mut Controller,
    p: &Plan,
) -> Result<(), DemoError> {
    let node = rt
        .block_on(cluster.add_node(&NodeSpec {
            name: p.node.to_string(),
            ip: p.ip(),
            pods: vec![WorkloadSpec::v4(p.pod, p.pod_ip())],
        }))
        .map_err(|source| DemoError::Testbed {
            op: "adding a node",
            source,
        })?;
    ctl.add_node(NodeInfo::new(p.node, p.ip(), UNDERLAY_PREFIX, p.block()));
    for w in node.pods() {
        let mut endpoint = w.endpoint(&[PROFILE]);
        if p.role == "server" {
            endpoint.tiers = vec![TierInfo {
                name: "default".to_string(),
                ingress_policies: vec![server_policy()],
                ..TierInfo::default()
            }];
        }
        ctl.add_pod(
            p.node,
            PodInfo {
                id: w.endpoint_id(),
                endpoint,
                labels: [("role".to_string(), p.role.to_string())].into(),
            },
        );
    }
    Ok(())
}

fn listener(cluster: &Cluster, p: &Plan) -> Result<TcpServer, DemoError> {
    let pod = cluster
        .node(p.node)
        .and_then(|n| n.pod(p.pod))
        .ok_or_else(|| DemoError::Testbed {
            op: "finding a pod",
            source: TestbedError::Spec(format!("no pod {} on {}", p.pod, p.node)),
        })?;
    TcpServer::start(pod.ns(), PORT).map_err(|source| DemoError::Testbed {
        op: "starting a listener",
        source,
    })
}

/// The agent for node `p`, on defaults (hermetic: no config file, no environment) but for the
/// node's name as `FelixHostname` (which tells it which VTEP and key are its own) and what the
/// encapsulation needs: for IPIP the node's tunnel address (`IpInIpTunnelAddr`), for WireGuard
/// `WireguardEnabled` and `ProgramClusterRoutes=Enabled` (the routes of a pool without
/// encapsulation, which a node without a key is reached through).
fn start_agent(cluster: &Cluster, p: &Plan, encap: Encap) -> Result<Agent, DemoError> {
    use felix_nft::config::{resolve, RawValue, Source};
    let node = cluster.node(p.node).ok_or_else(|| DemoError::Testbed {
        op: "finding a node",
        source: TestbedError::Spec(format!("no node {}", p.node)),
    })?;
    let mut raw = vec![("FelixHostname", p.node.to_string())];
    match encap {
        Encap::Vxlan => {}
        Encap::Ipip => raw.push(("IpInIpTunnelAddr", p.block().network().to_string())),
        Encap::Wireguard => {
            raw.push(("WireguardEnabled", "true".to_string()));
            raw.push(("ProgramClusterRoutes", "Enabled".to_string()));
        }
    }
    let raw = raw
        .into_iter()
        .map(|(key, value)| RawValue {
            key: key.to_string(),
            value,
            source: Source::ConfigUpdate,
        })
        .collect();
    let config: Config = resolve(raw)
        .map_err(|e| DemoError::Config(felix_nft::ops::logging::chain(&e)))?
        .config;
    Agent::start(node.ns(), DataplaneConfig::from_config(&config), None)
}

/// Whether this kernel can make the encapsulation's device: a link of its kind is made in the
/// underlay's namespace and deleted (the kernel loads the module on demand if it has one, as
/// for the agents' own devices). A kernel that cannot is [`DemoError::MissingModule`].
async fn kernel_has(ns: &NetNs, encap: Encap) -> Result<(), DemoError> {
    let h = RtnlHandle::connect(Some(ns)).map_err(DemoError::Rtnl)?;
    const PROBE: &str = "fnt-probe";
    let made = match encap {
        Encap::Vxlan => return Ok(()),
        Encap::Ipip => h
            .handle()
            .link()
            .add(rtnetlink::LinkIpIp::new(PROBE).build())
            .execute()
            .await
            .map_err(|e| rtnl::RtnlError::kernel("creating", PROBE, e)),
        Encap::Wireguard => rtnl::wireguard::create_device(&h, PROBE).await,
    };
    match made {
        Ok(()) => {
            if let Some(m) = link::get_link_message(&h, PROBE)
                .await
                .map_err(DemoError::Rtnl)?
            {
                let _ = h.handle().link().del(m.header.index).execute().await;
            }
            Ok(())
        }
        // The ipip module's fallback device already has these (empty) endpoints: loaded.
        Err(e) if e.errno() == Some(libc::EEXIST) => Ok(()),
        Err(e) if e.is_unsupported() || e.errno() == Some(libc::EOPNOTSUPP) => {
            Err(DemoError::MissingModule {
                module: encap.name(),
                encap: encap.name(),
            })
        }
        Err(e) => Err(DemoError::Rtnl(e)),
    }
}

fn print_node(
    out: &mut dyn Write,
    ctl: &Controller,
    p: &Plan,
    encap: Encap,
) -> Result<(), DemoError> {
    if let Some(n) = ctl.node(p.node) {
        let tunnel = match encap {
            Encap::Vxlan => format!("VTEP {} {}", n.tunnel_ip, n.vtep_mac),
            Encap::Ipip => format!("tunl0 {:<28}", n.tunnel_ip),
            Encap::Wireguard => format!("WireGuard {:<24}", n.tunnel_ip),
        };
        say!(
            out,
            "  {:<7} {:<12} block {:<13} {tunnel}   pod {:<9} {:<10} role={}",
            n.name,
            n.ip.to_string(),
            n.block.to_string(),
            p.pod,
            p.pod_ip().to_string(),
            p.role
        );
    }
    Ok(())
}

/// The members of the clients set as first sent (to the node that uses it).
fn clients_sent(first: &BTreeMap<String, Vec<ToDataplane>>) -> String {
    use felix_api::to_dataplane::Payload;
    first
        .values()
        .flatten()
        .find_map(|m| match &m.payload {
            Some(Payload::IpsetUpdate(u)) if u.id == CLIENTS_SET => Some(u.members.join(", ")),
            _ => None,
        })
        .unwrap_or_default()
}

/// A short account of a node's messages: `vtep_update node-4, route_update 10.65.4.0/26, …`.
fn kinds(msgs: &[ToDataplane]) -> String {
    use felix_api::to_dataplane::Payload;
    msgs.iter()
        .map(|m| match &m.payload {
            Some(Payload::VtepUpdate(u)) => format!("vtep_update {}", u.node),
            Some(Payload::VtepRemove(u)) => format!("vtep_remove {}", u.node),
            Some(Payload::RouteUpdate(u)) => format!("route_update {}", u.dst),
            Some(Payload::RouteRemove(u)) => format!("route_remove {}", u.dst),
            Some(Payload::HostMetadataUpdate(u)) => format!("host_metadata_update {}", u.hostname),
            Some(Payload::HostMetadataRemove(u)) => format!("host_metadata_remove {}", u.hostname),
            Some(Payload::WireguardEndpointUpdate(u)) => {
                format!("wireguard_endpoint_update {}", u.hostname)
            }
            Some(Payload::WireguardEndpointRemove(u)) => {
                format!("wireguard_endpoint_remove {}", u.hostname)
            }
            Some(Payload::IpsetDeltaUpdate(u)) => {
                let mut s = format!("ipset_delta_update {}", u.id);
                for a in &u.added_members {
                    s.push_str(&format!(" +{a}"));
                }
                for r in &u.removed_members {
                    s.push_str(&format!(" -{r}"));
                }
                s
            }
            Some(p) => format!("{p:?}")
                .split('(')
                .next()
                .unwrap_or("?")
                .to_string(),
            None => "empty".to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Hands each running agent its messages, waits until the overlay converges, and shows how long
/// that took since `since` and what each node then holds. `Ok(false)` when it did not converge.
fn deliver<'a>(
    out: &mut dyn Write,
    rt: &tokio::runtime::Runtime,
    (cluster, ctl, encap): (&Cluster, &Controller, Encap),
    agents: &BTreeMap<&str, Agent>,
    msgs: impl Iterator<Item = (&'a String, &'a Vec<ToDataplane>)>,
    since: Instant,
) -> Result<bool, DemoError> {
    for (n, msgs) in msgs {
        if let Some(a) = agents.get(n.as_str()) {
            a.send(msgs.clone())?;
        }
    }
    let converged = wait_converged(rt, cluster, ctl, encap)?;
    say!(
        out,
        "   every node converged after {} ms:",
        since.elapsed().as_millis()
    );
    print_overlay(out, rt, cluster, ctl, encap)?;
    Ok(converged)
}

/// Waits until every node holds the overlay for every other node the controller knows.
/// `Ok(false)` when some node did not within the apply timeout.
fn wait_converged(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    ctl: &Controller,
    encap: Encap,
) -> Result<bool, DemoError> {
    let deadline = Instant::now() + APPLY_TIMEOUT;
    loop {
        let mut all = true;
        for me in ctl.nodes() {
            let Some(node) = cluster.node(&me.name) else {
                continue;
            };
            let peers: Vec<&NodeInfo> = ctl.nodes().filter(|n| n.name != me.name).collect();
            if !rt.block_on(read_overlay(node.ns(), encap))?.holds(&peers) {
                all = false;
                break;
            }
        }
        if all {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Prints a row per node of what its overlay holds, then one node's routes and FDB in full.
fn print_overlay(
    out: &mut dyn Write,
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    ctl: &Controller,
    encap: Encap,
) -> Result<(), DemoError> {
    let (a, b) = match encap {
        Encap::Vxlan => ("FDB", "ARP"),
        Encap::Ipip => ("", ""),
        Encap::Wireguard => ("", "peer"),
    };
    let routes = match encap {
        Encap::Wireguard => "table 1",
        _ => "routes",
    };
    say!(
        out,
        "   {:<7} {:<36} {:>3} {:>4} {:>7}  blackhole",
        "node",
        encap.device(),
        a,
        b,
        routes
    );
    let mut example = None;
    for me in ctl.nodes() {
        let Some(node) = cluster.node(&me.name) else {
            continue;
        };
        let o = rt.block_on(read_overlay(node.ns(), encap))?;
        o.print_row(out, &me.name)?;
        if example.is_none() {
            example = Some((me.name.clone(), o));
        }
    }
    if let Some((name, o)) = example {
        o.print_detail(out, &name)?;
    }
    Ok(())
}

impl OverlayState {
    /// One line of the table: the device, the counts that matter for the encapsulation, the
    /// routes through it, and the blackholes.
    fn print_row(&self, out: &mut dyn Write, node: &str) -> Result<(), DemoError> {
        let dev = match &self.device {
            Some((what, mtu, addr)) => format!(
                "{what}mtu {mtu}, {}",
                addr.map(|a| a.to_string())
                    .unwrap_or_else(|| "no address".into())
            ),
            None => "missing".to_string(),
        };
        let (a, b) = match self.encap {
            Encap::Vxlan => (self.fdb.len().to_string(), self.arp.len().to_string()),
            Encap::Ipip => (String::new(), String::new()),
            Encap::Wireguard => (String::new(), self.peers.len().to_string()),
        };
        say!(
            out,
            "   {:<7} {:<36} {:>3} {:>4} {:>7}  {}",
            node,
            dev,
            a,
            b,
            self.tunnel_routes.len(),
            self.blackholes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(())
    }

    /// The routes through the device and what the encapsulation adds, each listed.
    fn print_detail(&self, out: &mut dyn Write, node: &str) -> Result<(), DemoError> {
        let routes: Vec<String> = self
            .tunnel_routes
            .iter()
            .map(|(dst, gw)| match gw {
                Some(gw) => format!("{dst} via {gw}"),
                None => dst.to_string(),
            })
            .collect();
        let dev = self.encap.device();
        match self.encap {
            Encap::Vxlan => {
                let fdb: Vec<String> = self
                    .fdb
                    .iter()
                    .map(|(m, ip)| format!("{} → {ip}", fmt_mac(m)))
                    .collect();
                say!(
                    out,
                    "   on {node}: routes {} (dev {dev} onlink); FDB {}",
                    routes.join(", "),
                    fdb.join(", ")
                );
            }
            Encap::Ipip => say!(
                out,
                "   on {node}: routes {} (dev {dev} onlink proto 80)",
                routes.join(", ")
            ),
            Encap::Wireguard => {
                let peers: Vec<String> = self
                    .peers
                    .iter()
                    .map(|(ep, ips)| {
                        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
                        format!(
                            "{} allowed {}",
                            ep.map_or("no endpoint".to_string(), |e| e.to_string()),
                            ips.join(" ")
                        )
                    })
                    .collect();
                say!(
                    out,
                    "   on {node}: peers {}; table {WG_TABLE}: {} dev {dev}; rule `not fwmark \
                     0x200000/0x200000 lookup {WG_TABLE}`",
                    peers.join(", "),
                    routes.join(", ")
                );
            }
        }
        Ok(())
    }
}

/// Reads the overlay of the node namespace `ns`: the device, the routes through it and the
/// blackholes; for VXLAN its FDB and permanent ARP entries, for WireGuard its peers.
async fn read_overlay(ns: &NetNs, encap: Encap) -> Result<OverlayState, DemoError> {
    let h = RtnlHandle::connect(Some(ns)).map_err(DemoError::Rtnl)?;
    let mut o = OverlayState {
        encap,
        ..OverlayState::default()
    };
    let routes = ipv4_routes(&h).await?;
    let Some(msg) = link::get_link_message(&h, encap.device())
        .await
        .map_err(DemoError::Rtnl)?
    else {
        for m in &routes {
            o.add_route(m, None);
        }
        return Ok(o);
    };
    let index = msg.header.index;
    let (vni, mtu) = vni_and_mtu(&msg);
    let addr = link::list_addresses(&h)
        .await
        .map_err(DemoError::Rtnl)?
        .into_iter()
        .find(|(i, _)| *i == index)
        .map(|(_, a)| a);
    let mut what = String::new();
    match encap {
        Encap::Vxlan => {
            what = format!("vni {vni}, ");
            o.fdb = dump_fdb(&h, index).await.map_err(DemoError::Rtnl)?;
            o.arp = list_permanent(&h)
                .await
                .map_err(DemoError::Rtnl)?
                .into_iter()
                .filter(|n| n.ifindex == index)
                .map(|n| (n.ip, n.mac))
                .collect();
        }
        Encap::Ipip => {}
        Encap::Wireguard => {
            let dev = WgSocket::open(Some(ns))
                .and_then(|mut s| s.get_device(WG_IFACE))
                .map_err(DemoError::Rtnl)?;
            what = format!("port {}, ", dev.listen_port);
            o.peers = dev
                .peers
                .into_iter()
                .map(|p| (p.endpoint, p.allowed_ips))
                .collect();
        }
    }
    o.device = Some((what, mtu, addr));
    for m in &routes {
        o.add_route(m, Some(index));
    }
    Ok(o)
}

/// The VXLAN device's VNI and MTU (0 where the message does not say).
fn vni_and_mtu(msg: &LinkMessage) -> (u32, u32) {
    let (mut vni, mut mtu) = (0, 0);
    for a in &msg.attributes {
        match a {
            LinkAttribute::Mtu(m) => mtu = *m,
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Data(InfoData::Vxlan(vs)) = i {
                        for v in vs {
                            if let InfoVxlan::Id(x) = v {
                                vni = *x;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    (vni, mtu)
}

impl OverlayState {
    /// Keeps route `m` if it is a blackhole of the main table, or a route to a block (shorter
    /// than /32) through the device at `index` in the encapsulation's table.
    fn add_route(&mut self, m: &RouteMessage, index: Option<u32>) {
        let (mut dst, mut oif, mut gw) = (None, None, None);
        let mut table = u32::from(m.header.table);
        for a in &m.attributes {
            match a {
                RouteAttribute::Destination(RouteAddress::Inet(v4)) => dst = Some(*v4),
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Gateway(RouteAddress::Inet(v4)) => gw = Some(IpAddr::V4(*v4)),
                RouteAttribute::Table(t) => table = *t,
                _ => {}
            }
        }
        let Some(dst) = dst.and_then(|d| {
            Ipv4Net::new(d, m.header.destination_prefix_length)
                .ok()
                .map(IpNet::V4)
        }) else {
            return;
        };
        let main = table == rtnl::routes::RT_TABLE_MAIN;
        if m.header.kind == RouteType::BlackHole && main {
            self.blackholes.push(dst);
        } else if index.is_some()
            && oif == index
            && dst.prefix_len() < 32
            && table == self.encap.table()
        {
            self.tunnel_routes.push((dst, gw));
        }
    }
}

type Flows<'a> = (Vec<Flow<'a>>, Vec<&'static str>);

/// A flow from pod `from` to pod `to` (each `pod@node`), if both exist.
fn flow<'a>(
    cluster: &'a Cluster,
    from: &Plan,
    to: &Plan,
    proto: Proto,
    expect: Verdict,
) -> Option<Flow<'a>> {
    let src = cluster.node(from.node)?.pod(from.pod)?;
    Some(Flow {
        from: format!("{}@{}", from.pod, from.node),
        ns: src.ns(),
        to: format!("{}@{}", to.pod, to.node),
        dst: IpAddr::V4(to.pod_ip()),
        proto,
        port: if proto == Proto::Icmp { 0 } else { PORT },
        expect,
    })
}

fn collect<'a>(v: Vec<(Option<Flow<'a>>, &'static str)>) -> Flows<'a> {
    v.into_iter()
        .filter_map(|(f, why)| f.map(|f| (f, why)))
        .unzip()
}

/// The three nodes' flows.
fn flows_three(cluster: &Cluster) -> Flows<'_> {
    use Proto::*;
    use Verdict::*;
    let [n1, n2, n3, _] = &PLAN;
    collect(vec![
        (
            flow(cluster, n1, n2, Tcp, Pass),
            "server admits s:clients; client (node-1) is in it",
        ),
        (
            flow(cluster, n3, n2, Tcp, Drop),
            "batch is not in s:clients: dropped on node-2 at the end of the tier",
        ),
        (
            flow(cluster, n2, n3, Icmp, Pass),
            "profile allows; node-2 → node-3 through the tunnel",
        ),
        (
            flow(cluster, n3, n1, Tcp, Pass),
            "profile allows; node-3 → node-1 through the tunnel",
        ),
        (
            flow(cluster, n1, n3, Icmp, Pass),
            "profile allows; node-1 → node-3 through the tunnel",
        ),
    ])
}

/// The flows to and from node-4's pod while it is a member (`joined`) and after it left.
fn flows_joined(cluster: &Cluster, joined: bool, encap: Encap) -> Flows<'_> {
    use Proto::*;
    use Verdict::*;
    let (learned, n2_left, n1_left) = match encap {
        Encap::Vxlan => (
            "node-3 learned node-4's VTEP and block",
            "node-2 drops VXLAN from node-4, no longer a known VTEP",
            "node-1 drops VXLAN from node-4, no longer a known VTEP",
        ),
        Encap::Ipip => (
            "node-3 learned node-4's block and host",
            "node-2 drops IPIP from node-4, no longer in all-hosts-net",
            "node-1 drops IPIP from node-4, no longer in all-hosts-net",
        ),
        Encap::Wireguard => (
            "node-3 learned node-4's block, host and key",
            "node-2 has no WireGuard peer node-4 any more",
            "node-1 has no WireGuard peer node-4 any more",
        ),
    };
    let [n1, n2, n3, n4] = &PLAN;
    // (from, to, protocol, why it passes while node-4 is a member, why it drops once it left)
    let rows = [
        (
            n4,
            n2,
            Tcp,
            "node-2's s:clients gained client-4 (an IP set delta)",
            n2_left,
        ),
        (
            n3,
            n4,
            Icmp,
            learned,
            "node-3 has no route to 10.65.4.0/26 any more",
        ),
        (
            n4,
            n1,
            Icmp,
            "node-4 learned the others' from its snapshot",
            n1_left,
        ),
    ];
    let mut v: Vec<_> = rows
        .into_iter()
        .map(|(from, to, proto, member, left)| {
            if joined {
                (flow(cluster, from, to, proto, Pass), member)
            } else {
                (flow(cluster, from, to, proto, Drop), left)
            }
        })
        .collect();
    if !joined {
        v.push((
            flow(cluster, n1, n2, Tcp, Pass),
            "unaffected by node-4 leaving",
        ));
    }
    collect(v)
}
