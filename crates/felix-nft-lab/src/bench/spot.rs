//! The traffic spot-check ("the three shapes must express the same policy"): at a tiny
//! scale, the generated endpoints become real `cali…` veths of a [`Topology`], each backend in
//! turn loads the full sync into a freshly built host namespace, and a handful of TCP flows
//! chosen from the model (allowed source and port; source not in the set; port not allowed; the
//! same for egress) are probed with real packets. Every backend must give the same verdict per
//! flow, and the model's expectation is printed beside them.
//!
//! What a CNI plugin and Felix's route manager would add for traffic to flow at all (a route per
//! workload, proxy ARP with proxy_delay 0, forwarding; §14–15) is programmed here with
//! `rtnl`, identically for every backend, so only the filtering differs. The external namespace
//! (192.0.2.2) stands for "a peer": it is added as a member of one of the first endpoint's
//! ingress sets and one of its egress sets, so exactly the flows the model allows can pass.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use super::run::{self, InProcess, Tool};
use super::shapes::{IptState, NftState};
use super::workload::{RuleSpec, Scale, Workload};
use super::{need, write, BenchError};
use crate::testbed::probe::{tcp_connect, TcpServer, Verdict};
use crate::testbed::topology::{ExternalSpec, Topology, TopologySpec, WorkloadSpec};
use rtnl::devconf::{set_ipv4_conf, set_proxy_delay, Ipv4Conf, ProcSys};
use rtnl::netns::NetNs;
use rtnl::{link, RtnlHandle};

/// The spot-check's scale: W=4, P=4 (two ingress, two egress policies), R=2, S=8, M=2, K=1.
pub const SPOT_SCALE: Scale = Scale {
    w: 4,
    p: 4,
    r: 2,
    s: 8,
    m: 2,
    k: 1,
};

/// A port no generated rule allows (rules use 80, 443, 8000+ and 8080+).
const CLOSED_PORT: u16 = 7;
/// Probe timeout: a drop is a timeout.
const TIMEOUT: Duration = Duration::from_millis(500);

/// Where a probe starts or ends: the external peer or workload endpoint `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    External,
    Endpoint(usize),
}

/// One probed flow and what the model says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpotFlow {
    pub from: End,
    pub to: End,
    pub port: u16,
    /// The model's verdict: pass iff the destination's ingress (if a workload) and the source's
    /// egress (if a workload) both have a rule allowing the peer's address and the port.
    pub expect: Verdict,
    pub why: &'static str,
}

/// The verdict of every flow under every backend that ran.
#[derive(Debug, Clone, Default)]
pub struct SpotReport {
    pub flows: Vec<SpotFlow>,
    /// Backend → verdict per flow (same order as `flows`).
    pub verdicts: BTreeMap<String, Vec<Verdict>>,
    /// The same flows through the same bed with no backend loaded: every one must pass, so a
    /// drop above is the policy's doing, not the bed's.
    pub control: Vec<Verdict>,
    pub notes: Vec<String>,
}

impl SpotReport {
    /// Flows on which the backends that ran disagree.
    pub fn disagreements(&self) -> Vec<usize> {
        (0..self.flows.len())
            .filter(|&i| {
                let mut v = self.verdicts.values().map(|vs| vs[i]);
                let first = v.next();
                v.any(|x| Some(x) != first)
            })
            .collect()
    }

    /// Flows on which some backend differs from the model.
    pub fn model_mismatches(&self) -> Vec<usize> {
        (0..self.flows.len())
            .filter(|&i| {
                self.verdicts
                    .values()
                    .any(|vs| vs[i] != self.flows[i].expect)
            })
            .collect()
    }

    /// Whether some flow passed and some dropped under every backend.
    pub fn discriminates(&self) -> bool {
        self.control.len() == self.flows.len()
            && self.control.iter().all(|v| *v == Verdict::Pass)
            && self
                .verdicts
                .values()
                .all(|vs| vs.contains(&Verdict::Pass) && vs.contains(&Verdict::Drop))
            && !self.verdicts.is_empty()
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::External => write!(f, "ext"),
            End::Endpoint(i) => write!(f, "ep{i}"),
        }
    }
}

impl fmt::Display for SpotReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backends: Vec<&String> = self.verdicts.keys().collect();
        write!(
            f,
            "spot-check ({SPOT_SCALE}):\n  {:<40} {:<7} {:<8}",
            "flow", "model", "no rules"
        )?;
        for b in &backends {
            write!(f, " {b:<10}")?;
        }
        writeln!(f)?;
        for (i, fl) in self.flows.iter().enumerate() {
            let name = format!("{}→{}:{} ({})", fl.from, fl.to, fl.port, fl.why);
            let ctl = self.control.get(i).map_or("–".into(), |v| v.to_string());
            write!(f, "  {name:<40} {:<7} {ctl:<8}", fl.expect.to_string())?;
            for b in &backends {
                write!(f, " {:<10}", self.verdicts[*b][i].to_string())?;
            }
            writeln!(f)?;
        }
        let d = self.disagreements();
        let m = self.model_mismatches();
        writeln!(
            f,
            "  backends agree: {}; match the model: {}; pass and drop seen (all pass without rules): {}",
            if d.is_empty() { "yes".to_string() } else { format!("NO (flows {d:?})") },
            if m.is_empty() { "yes".to_string() } else { format!("NO (flows {m:?})") },
            if self.discriminates() { "yes" } else { "NO" },
        )?;
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        Ok(())
    }
}

pub(super) fn tb(op: &str) -> impl FnOnce(crate::testbed::TestbedError) -> BenchError + '_ {
    move |source| BenchError::Testbed {
        op: op.to_string(),
        source,
    }
}

fn rt(op: &str) -> impl FnOnce(rtnl::RtnlError) -> BenchError + '_ {
    move |source| BenchError::Rtnl {
        op: op.to_string(),
        source: Box::new(source),
    }
}

/// Runs `f` to completion on a runtime of its own.
pub(super) fn block_on<T>(f: impl std::future::Future<Output = T>) -> Result<T, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| BenchError::Io {
            op: "starting a runtime for the test bed".into(),
            source,
        })?;
    Ok(rt.block_on(f))
}

/// The addresses the test bed gives the workloads (distinct from every generated set member).
fn workload_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, 10 + i as u8)
}

/// The spot-check's workload, its topology spec, and the flows to probe.
fn plan(prefix: &str) -> (Workload, TopologySpec, Vec<SpotFlow>) {
    let mut w = Workload::generate(SPOT_SCALE);
    let spec = topology_spec(prefix, w.endpoints.len());
    let rules = PeerRules::of(&w);
    rules.admit_peer(&mut w);
    let flows = rules.flows(&w);
    (w, spec, flows)
}

/// One `cali…` veth per endpoint at [`workload_ip`], and the external peer.
fn topology_spec(prefix: &str, endpoints: usize) -> TopologySpec {
    TopologySpec {
        prefix: prefix.into(),
        workloads: (0..endpoints)
            .map(|i| WorkloadSpec::v4(format!("ep{i}"), workload_ip(i)))
            .collect(),
        external: Some(ExternalSpec {
            routes_to_workloads: true,
            ipv6: false,
        }),
    }
}

/// The external peer's address.
const PEER: Ipv4Addr = crate::testbed::topology::EXTERNAL_V4;

/// The rules of ep0 whose sets the peer joins, so that exactly the flows they allow can pass.
struct PeerRules {
    /// ep0's first ingress rule.
    ingress: RuleSpec,
    /// ep0's first egress rule.
    egress: RuleSpec,
    /// An ingress rule of ep0 on a hash:net set other than `ingress`'s, so interval matching
    /// is probed too.
    net: Option<RuleSpec>,
}

impl PeerRules {
    fn of(w: &Workload) -> Self {
        let ingress = w.policies[w.endpoints[0].ingress[0]].rules[0].clone();
        let egress = w.policies[w.endpoints[0].egress[0]].rules[0].clone();
        let net = w.endpoints[0]
            .ingress
            .iter()
            .flat_map(|&p| w.policies[p].rules.iter())
            .find(|r| w.sets[r.set].net && r.set != ingress.set)
            .cloned();
        PeerRules {
            ingress,
            egress,
            net,
        }
    }

    /// Adds the peer to the sets of the ingress and egress rules, and a /30 around it to the
    /// net rule's set.
    fn admit_peer(&self, w: &mut Workload) {
        for set in [self.ingress.set, self.egress.set] {
            let m = if w.sets[set].net {
                format!("{PEER}/32")
            } else {
                PEER.to_string()
            };
            if !w.sets[set].members.contains(&m) {
                w.sets[set].members.push(m);
            }
        }
        if let Some(r) = &self.net {
            w.sets[r.set]
                .members
                .push(format!("{}/30", Ipv4Addr::from(u32::from(PEER) & !3)));
        }
    }

    /// The flows to probe, each with the model's verdict on `w` (the peer already admitted).
    fn flows(&self, w: &Workload) -> Vec<SpotFlow> {
        use End::*;
        let (oi, oe) = (
            endpoint_without_peer(w, true),
            endpoint_without_peer(w, false),
        );
        let oi_port = w.policies[w.endpoints[oi].ingress[0]].rules[0].ports[0];
        let mut flows = Vec::new();
        let mut add = |from, to, port, why| {
            let expect = model(w, from, to, port);
            flows.push(SpotFlow {
                from,
                to,
                port,
                expect,
                why,
            });
        };
        add(
            External,
            Endpoint(0),
            self.ingress.ports[0],
            "src in set, port ok",
        );
        if let Some(r) = &self.net {
            add(External, Endpoint(0), r.ports[0], "src in net set");
        }
        add(External, Endpoint(0), CLOSED_PORT, "port not allowed");
        add(External, Endpoint(oi), oi_port, "src not in set");
        add(
            Endpoint(0),
            External,
            self.egress.ports[0],
            "egress: dst in set",
        );
        add(
            Endpoint(0),
            External,
            CLOSED_PORT,
            "egress: port not allowed",
        );
        add(
            Endpoint(oe),
            External,
            self.egress.ports[0],
            "egress: dst not in set",
        );
        flows
    }
}

/// The model's verdict: allowed iff every workload end's policies have a rule for the peer
/// address and port.
fn model(w: &Workload, from: End, to: End, port: u16) -> Verdict {
    let ip_of = |e: End| match e {
        End::External => PEER,
        End::Endpoint(i) => w.endpoints[i].ip,
    };
    let (src, dst) = (ip_of(from), ip_of(to));
    let egress_ok = match from {
        End::Endpoint(i) => allows(w, &w.endpoints[i].egress, dst, port),
        End::External => true,
    };
    let ingress_ok = match to {
        End::Endpoint(i) => allows(w, &w.endpoints[i].ingress, src, port),
        End::External => true,
    };
    if egress_ok && ingress_ok {
        Verdict::Pass
    } else {
        Verdict::Drop
    }
}

/// Whether one of `pols` has a rule allowing `peer` on `port`.
fn allows(w: &Workload, pols: &[usize], peer: Ipv4Addr, port: u16) -> bool {
    pols.iter().any(|&p| {
        w.policies[p]
            .rules
            .iter()
            .any(|r| r.ports.contains(&port) && set_contains(&w.sets[r.set].members, peer))
    })
}

/// An endpoint other than ep0 whose ingress (egress) sets do not hold the peer; ep1 if none.
fn endpoint_without_peer(w: &Workload, ingress: bool) -> usize {
    (1..w.endpoints.len())
        .find(|&i| {
            let e = &w.endpoints[i];
            let pols = if ingress { &e.ingress } else { &e.egress };
            !pols.iter().any(|&p| {
                w.policies[p]
                    .rules
                    .iter()
                    .any(|r| set_contains(&w.sets[r.set].members, PEER))
            })
        })
        .unwrap_or(1)
}

fn set_contains(members: &[String], ip: Ipv4Addr) -> bool {
    members.iter().any(|m| match m.parse::<ipnet::Ipv4Net>() {
        Ok(n) => n.contains(&ip),
        Err(_) => m.parse::<Ipv4Addr>() == Ok(ip),
    })
}

/// What a CNI plugin and Felix's route manager leave in the host namespace (§14–15).
async fn program_host(topo: &Topology) -> Result<(), BenchError> {
    let h = RtnlHandle::connect(Some(topo.host())).map_err(rt("connecting rtnetlink"))?;
    let host = topo.host().try_clone().map_err(|source| BenchError::Io {
        op: "cloning the host namespace handle".into(),
        source,
    })?;
    let sys = ProcSys::new(Some(host));
    sys.write("net/ipv4/ip_forward", "1")
        .map_err(rt("enabling forwarding"))?;
    for wl in topo.workloads() {
        let ifname = &wl.host_ifname;
        set_ipv4_conf(
            &h,
            ifname,
            &[(Ipv4Conf::Forwarding, 1), (Ipv4Conf::ProxyArp, 1)],
        )
        .await
        .map_err(rt("setting forwarding and proxy_arp"))?;
        set_proxy_delay(&h, ifname, 0)
            .await
            .map_err(rt("setting proxy_delay"))?;
        for net in wl.nets() {
            link::add_route(&h, net, Some(ifname), None)
                .await
                .map_err(rt("adding a workload route"))?;
        }
    }
    Ok(())
}

/// Loads backend `backend`'s full sync of `w` into `host`.
fn load(
    backend: &str,
    w: &Workload,
    host: &NetNs,
    tools: &[String],
    dir: &Path,
) -> Result<(), BenchError> {
    match backend {
        "" => {}
        "felix-nft" => {
            let mut fx = InProcess::open(host, false)?;
            fx.apply(&w.messages())?;
        }
        "nft-f" => {
            let p = dir.join("spot.nft");
            write(&p, &NftState::render(w, false).full())?;
            run::spawn_in(
                host,
                &Tool::new(&[&tools[0], "-f", &p.display().to_string()]),
                false,
                dir,
            )?;
        }
        _ => {
            let ipt = IptState::render(w);
            let (ps, pr) = (dir.join("spot.ipset"), dir.join("spot.ipt"));
            write(&ps, &ipt.ipset_restore())?;
            write(&pr, &ipt.restore())?;
            run::spawn_in(
                host,
                &Tool::new(&[&tools[0], "restore"]).stdin(&ps),
                false,
                dir,
            )?;
            run::spawn_in(
                host,
                &Tool::new(&[&tools[1], "--noflush"]).stdin(&pr),
                false,
                dir,
            )?;
        }
    }
    Ok(())
}

/// Runs the spot-check for the backends `wanted` accepts (the fresh-process felix-nft backend
/// loads the same ruleset as the in-process one and is not probed separately). `dir` holds the
/// inputs and the tools' stderr.
pub fn spot_check(dir: &Path, wanted: &dyn Fn(&str) -> bool) -> Result<SpotReport, BenchError> {
    super::create_dir(dir)?;
    let (mut w, spec, flows) = plan("fnft-spot");
    let mut report = SpotReport {
        flows,
        ..SpotReport::default()
    };
    for backend in ["", "felix-nft", "ipt-nft", "ipt-legacy", "nft-f"] {
        if !backend.is_empty() && !wanted(backend) {
            continue;
        }
        let tools = match backend {
            "" | "felix-nft" => Ok(vec![]),
            "ipt-nft" => need(&["ipset", "iptables-nft-restore"]),
            "ipt-legacy" => need(&["ipset", "iptables-legacy-restore"]),
            _ => need(&["nft"]),
        };
        let tools: Vec<String> = match tools {
            Ok(t) => t.iter().map(|p| p.display().to_string()).collect(),
            Err(missing) => {
                report
                    .notes
                    .push(format!("{backend}: skipped, {missing} not installed"));
                continue;
            }
        };
        // A fresh bed per backend: nothing one backend left can decide another's verdicts.
        let topo = block_on(Topology::build(&spec))?.map_err(tb("building the test bed"))?;
        for (e, wl) in w.endpoints.iter_mut().zip(topo.workloads()) {
            e.iface = wl.host_ifname.clone();
            if let Some(ip) = wl.ipv4 {
                e.ip = ip;
            }
        }
        block_on(program_host(&topo))??;
        load(backend, &w, topo.host(), &tools, dir)?;
        let ns_of = |e: End| match e {
            End::External => topo.external().map(|x| x.ns()),
            End::Endpoint(i) => topo.workloads().get(i).map(|x| x.ns()),
        };
        let ip_of = |e: End| match e {
            End::External => topo.external().map(|x| x.ipv4),
            End::Endpoint(i) => topo.workloads().get(i).and_then(|x| x.ipv4),
        };
        let mut verdicts = Vec::new();
        for fl in &report.flows {
            let (Some(src), Some(dst_ns), Some(dst)) = (ns_of(fl.from), ns_of(fl.to), ip_of(fl.to))
            else {
                return Err(BenchError::Refused(format!(
                    "flow {}→{}: not in the test bed",
                    fl.from, fl.to
                )));
            };
            let _srv = TcpServer::start(dst_ns, fl.port).map_err(tb("starting a listener"))?;
            let v = tcp_connect(
                src,
                std::net::SocketAddr::new(IpAddr::V4(dst), fl.port),
                TIMEOUT,
            )
            .map_err(tb("probing"))?;
            verdicts.push(v);
        }
        if backend.is_empty() {
            report.control = verdicts;
        } else {
            report.verdicts.insert(backend.to_string(), verdicts);
        }
    }
    Ok(report)
}
