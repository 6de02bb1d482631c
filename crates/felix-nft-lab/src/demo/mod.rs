//! `felix-nft demo`: the first thing a new user runs. It builds a scratch node
//! with the [`testbed`](crate::testbed) — a host namespace, three workloads joined to it by `cali…`
//! veths the way Calico's CNI does, and an external host — runs the real dataplane loop
//! (`Driver` + `RealKernel` + the interface monitor, in-process, acting only in the scratch host
//! namespace) on a bundled example state, then shows what it programmed, read back from the kernel,
//! and which flows pass, measured with real connections. Then it changes one IP set, shows the flow
//! that flipped, shows the flow logs the agent made of all that traffic (as `felix-nft flows`
//! prints them), and deletes every namespace it made (unless `--keep`).
//!
//! Layering: this is a tool on top of the whole stack, like `daemon`; it reaches the kernel only
//! through `dataplane`, `nft` (read-back), `rtnl` and the test bed, and runs no external program.
//! Nothing in the caller's own network namespace is touched: every socket is opened in a namespace
//! the demo created. The agent's flow socket is a unix socket in a private directory the demo
//! makes under the temporary directory and removes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::DirBuilder;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use netlink_packet_route::neighbour::{NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use rtnetlink::RouteMessageBuilder;

use crate::testbed::probe::{run_matrix, Flow, MatrixReport, Proto, TcpServer, Verdict};
use crate::testbed::topology::{External, ExternalSpec, Topology, TopologySpec, WorkloadSpec};
use crate::testbed::TestbedError;
use felix_api::to_dataplane::Payload;
use felix_api::{IpSetDeltaUpdate, PolicyId, TierInfo, ToDataplane, WorkloadEndpointUpdate};
use felix_nft::config::{Config, EnabledDisabled};
use felix_nft::dataplane::DataplaneConfig;
use felix_nft::flows::query::Request;
use felix_nft::flows::serve::{FlowClient, FlowClientError, Reply};
use felix_nft::flows::show::format_record;
use felix_nft::flows::{FlowKey, FlowRecord, Reporter, Verdict as FlowVerdict};
use felix_nft::source::state::StateError;
use felix_nft_rules::OWNER;
use nf_tables::dump::read_table;
use nf_tables::model::elem_flags::INTERVAL_END;
use nf_tables::model::{Family, Table};
use nf_tables::reconcile::Nft;
use nf_tables::NftError;
use rtnl::netns::{NetNs, NetNsError};
use rtnl::{link, RtnlError, RtnlHandle};

/// The bundled example state: a state document holding the NAT-outgoing pool, the
/// IP set, the profile and the two tiers' policies. The workload endpoints that refer to them are
/// added at run time, because their interface MACs are only known once the veths exist.
pub const EXAMPLE_STATE: &str = include_str!("example-state.json");

/// Prefix of every namespace the demo makes (`fnft-demo-ROLE-PID-N`).
pub const NETNS_PREFIX: &str = "fnft-demo";

/// The IP set the demo changes, and the member it adds.
const DELTA_SET: &str = "s:backend-clients";
const WORKLOAD_PORT: u16 = 8080;
const ADMIN_PORT: u16 = 9090;
/// Per-probe timeout: a dropped flow costs this much; an answered one a fraction of a ms.
const PROBE_TIMEOUT: Duration = Duration::from_millis(400);
/// How long the agent may take to reach `DataplaneInSync` or to apply the delta.
const APPLY_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the agent flushes its flow logs: short, so that the last matrix's flows can be
/// shown a second or so after it.
const FLOW_FLUSH: Duration = Duration::from_secs(1);

const FRONTEND: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const DB: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);

/// How the demo was asked to run.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// Leave the namespaces (and what felix-nft programmed in them) in place for inspection.
    pub keep: bool,
    /// How the cluster demo's nodes carry pod traffic between them.
    pub encap: cluster::Encap,
}

/// What a finished demo found.
#[derive(Debug, Clone)]
pub struct DemoOutcome {
    /// The matrix with the example state, then after the IP set delta.
    pub before: MatrixReport,
    pub after: MatrixReport,
    /// Namespace names left in place (`--keep`), host first; empty otherwise.
    pub kept: Vec<String>,
}

impl DemoOutcome {
    /// True when every flow did what the policy says, in both matrices.
    pub fn all_match(&self) -> bool {
        self.before.all_match() && self.after.all_match()
    }
}

/// Why the demo could not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(
        "felix-nft demo needs root: it creates network namespaces and veth pairs \
         (nothing on this host is changed); run it as root, e.g. `sudo felix-nft demo`"
    )]
    NotRoot,
    #[error("loading the bundled example state")]
    State(#[source] StateError),
    #[error("{op}")]
    Testbed {
        op: &'static str,
        #[source]
        source: TestbedError,
    },
    #[error("running the dataplane agent in the scratch host namespace")]
    Agent(#[source] Box<AgentError>),
    #[error("the agent stopped before {what}")]
    AgentGone { what: &'static str },
    #[error("{what} did not happen within {timeout:?}")]
    Timeout {
        what: &'static str,
        timeout: Duration,
    },
    #[error("entering the scratch host namespace")]
    Netns(#[from] NetNsError),
    #[error("reading back {what}")]
    Nft {
        what: String,
        #[source]
        source: NftError,
    },
    #[error("reading back routes and neighbours")]
    Rtnl(#[source] RtnlError),
    #[error("starting a runtime for the test bed")]
    Runtime(#[source] io::Error),
    #[error("writing the demo's output")]
    Output(#[source] io::Error),
    #[error(
        "this kernel has no {module} module, which the {encap} cluster demo needs \
         (load it: modprobe {module})"
    )]
    MissingModule {
        module: &'static str,
        encap: &'static str,
    },
    #[error("configuring the agents: {0}")]
    Config(String),
}

impl From<AgentError> for DemoError {
    fn from(e: AgentError) -> Self {
        DemoError::Agent(Box::new(e))
    }
}

mod agent;

pub use agent::AgentError;
use agent::{Agent, FlowLogsSpec};

macro_rules! say {
    ($out:expr) => { writeln!($out).map_err(DemoError::Output)? };
    ($out:expr, $($arg:tt)*) => { writeln!($out, $($arg)*).map_err(DemoError::Output)? };
}

pub mod cluster;

/// True when the process runs as root (the demo makes namespaces and veths).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs the whole demo, printing to `out`. `Ok` means it ran to the end; whether every flow did
/// what the policy says is in the outcome.
pub fn run(opts: &DemoOptions, out: &mut dyn Write) -> Result<DemoOutcome, DemoError> {
    if !is_root() {
        return Err(DemoError::NotRoot);
    }
    let t0 = Instant::now();
    let state = felix_nft::source::state::parse(EXAMPLE_STATE.as_bytes(), "example-state.json")
        .map_err(DemoError::State)?;
    let rt = runtime()?;

    say!(
        out,
        "felix-nft demo: a scratch node in network namespaces; nothing on this host is changed"
    );
    say!(out);
    let topo = build_node(&rt, out)?;
    let node = Scratch::start(topo)?;
    node.apply_example_state(out, state)?;
    node.show_programmed(out, &rt)?;
    let before = node.measure_traffic(out)?;
    let after = node.flip_with_ipset_delta(out, &before)?;
    node.show_flows(out)?;
    let (kept, applies) = node.remove_or_keep(out, opts.keep)?;
    print_verdict(out, &before, &after, t0, applies)?;
    Ok(DemoOutcome {
        before,
        after,
        kept,
    })
}

/// Builds the scratch topology and shows it: the host namespace, the workloads with their
/// `cali…` interfaces, and the external host.
fn build_node(rt: &tokio::runtime::Runtime, out: &mut dyn Write) -> Result<Topology, DemoError> {
    let topo = rt
        .block_on(Topology::build(&TopologySpec {
            prefix: NETNS_PREFIX.to_string(),
            workloads: vec![
                WorkloadSpec::v4("frontend", FRONTEND),
                WorkloadSpec::v4("backend", BACKEND),
                WorkloadSpec::v4("db", DB),
            ],
            // No routes back to the workloads: only NAT outgoing lets them reach the outside.
            external: Some(ExternalSpec {
                routes_to_workloads: false,
                ipv6: false,
            }),
        }))
        .map_err(|source| DemoError::Testbed {
            op: "building the scratch topology",
            source,
        })?;
    let ext = external(&topo)?;
    say!(out, "node (built the way Calico's CNI plugin leaves one):");
    say!(out, "  host namespace  {}", topo.host_netns_name());
    for w in topo.workloads() {
        say!(
            out,
            "  workload        {:<9} {:<12} eth0 ── {}",
            w.name,
            w.ipv4.map(|a| a.to_string()).unwrap_or_default(),
            w.host_ifname
        );
    }
    say!(
        out,
        "  external host   {:<9} {:<12} (the host's default route; no route back to workloads)",
        "",
        ext.ipv4
    );
    say!(out);
    Ok(topo)
}

/// The external host of the scratch topology, which the demo always asks for.
fn external(topo: &Topology) -> Result<&External, DemoError> {
    topo.external().ok_or_else(|| DemoError::Testbed {
        op: "building the scratch topology",
        source: TestbedError::Spec("no external namespace".into()),
    })
}

/// The scratch node while the demo runs. Fields drop in declaration order, so on an early error
/// the agent stops before the listeners close and the namespaces it acts in are deleted.
struct Scratch {
    agent: Agent,
    ext_server: TcpServer,
    servers: Vec<TcpServer>,
    topo: Topology,
    /// Holds the agent's flow socket.
    _flow_dir: PrivateDir,
}

/// A directory of the demo's own under the temporary directory, 0700 (the flow socket says
/// who talks to whom), removed with what is in it on drop.
struct PrivateDir(PathBuf);

impl PrivateDir {
    /// A fresh one: an existing directory of the same name (someone else's) is not reused.
    fn make() -> Result<PrivateDir, DemoError> {
        let base = std::env::temp_dir();
        let err = |source| DemoError::Testbed {
            op: "making a private directory for the flow socket",
            source: TestbedError::Io {
                op: "mkdir",
                source,
            },
        };
        let mut taken = None;
        for n in 0..16 {
            let path = base.join(format!("felix-nft-demo-{}-{n}", std::process::id()));
            match DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(PrivateDir(path)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => taken = Some(e),
                Err(e) => return Err(err(e)),
            }
        }
        Err(err(
            taken.unwrap_or_else(|| io::ErrorKind::AlreadyExists.into())
        ))
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Scratch {
    /// Starts the listeners (every workload on the app and admin ports, the external host on the
    /// app port) and the agent, on defaults (the demo is hermetic: no config file, no
    /// environment) but for flow logs: on, flushed every [`FLOW_FLUSH`], served in a private
    /// directory.
    fn start(topo: Topology) -> Result<Scratch, DemoError> {
        let mut servers = Vec::new();
        for w in topo.workloads() {
            for port in [WORKLOAD_PORT, ADMIN_PORT] {
                servers.push(TcpServer::start(w.ns(), port).map_err(|source| {
                    DemoError::Testbed {
                        op: "starting a listener",
                        source,
                    }
                })?);
            }
        }
        let ext_server =
            TcpServer::start(external(&topo)?.ns(), WORKLOAD_PORT).map_err(|source| {
                DemoError::Testbed {
                    op: "starting the external listener",
                    source,
                }
            })?;
        let flow_dir = PrivateDir::make()?;
        let config = Config {
            flow_logs_local_reporter: EnabledDisabled::Enabled,
            flow_logs_flush_interval: FLOW_FLUSH,
            flow_logs_local_socket: flow_dir.0.join("flows.sock").display().to_string(),
            ..Config::default()
        };
        let flows = FlowLogsSpec {
            socket: PathBuf::from(&config.flow_logs_local_socket),
            flush: config.flow_logs_flush_interval,
        };
        let agent = Agent::start(
            topo.host(),
            DataplaneConfig::from_config(&config),
            Some(flows),
        )?;
        Ok(Scratch {
            agent,
            ext_server,
            servers,
            topo,
            _flow_dir: flow_dir,
        })
    }

    /// Step 1: the example state plus the workload endpoints goes to the agent; shows how long
    /// the agent took to reach `DataplaneInSync`.
    fn apply_example_state(
        &self,
        out: &mut dyn Write,
        state: Vec<ToDataplane>,
    ) -> Result<(), DemoError> {
        let mut messages = state;
        messages.extend(endpoint_updates(&self.topo));
        messages.push(ToDataplane {
            sequence_number: 0,
            payload: Some(Payload::InSync(felix_api::InSync {})),
        });
        say!(
            out,
            "1. example state ({} messages): tiers `platform` (deny tcp/{ADMIN_PORT}, else Pass) \
             and `app` (backend: tcp/{WORKLOAD_PORT} only from IP set {DELTA_SET}), profile \
             `kns.demo` (allow), pool 198.18.0.0/24 with NAT outgoing",
            messages.len()
        );
        let t_apply = Instant::now();
        self.agent.send(messages)?;
        let _ = self.agent.wait_in_sync(APPLY_TIMEOUT)?;
        say!(
            out,
            "   in sync after {} ms (the agent's DataplaneInSync)",
            t_apply.elapsed().as_millis()
        );
        say!(out);
        Ok(())
    }

    /// Step 2: what the agent programmed, read back from the kernel: the tables, the workload
    /// routes and the static ARP entries.
    fn show_programmed(
        &self,
        out: &mut dyn Write,
        rt: &tokio::runtime::Runtime,
    ) -> Result<(), DemoError> {
        say!(out, "2. programmed (read back from the kernel):");
        let tables = read_tables(self.topo.host())?;
        for t in &tables {
            say!(out, "   {t}");
        }
        let (routes, neighbours) = rt.block_on(read_routes(self.topo.host()))?;
        say!(out, "   routes   {}", routes.join(", "));
        say!(
            out,
            "   static ARP entries on workload interfaces: {neighbours}; proxy ARP on each"
        );
        say!(out);
        Ok(())
    }

    /// Step 3: the traffic matrix with the example state, and the source address the external
    /// host saw (NAT outgoing).
    fn measure_traffic(&self, out: &mut dyn Write) -> Result<MatrixReport, DemoError> {
        let (flows, why) = demo_flows(&self.topo, false);
        let before = settled_matrix(&flows);
        say!(
            out,
            "3. traffic, real TCP/ICMP from inside the namespaces ({} ms timeout):",
            PROBE_TIMEOUT.as_millis()
        );
        print_matrix(out, &flows, &why, &before, None)?;
        let ext_peers: Vec<IpAddr> = self
            .ext_server
            .peers()
            .iter()
            .map(SocketAddr::ip)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        say!(
            out,
            "   the external host saw connections from {:?} (NAT outgoing: the host's address, not the workload's)",
            ext_peers
        );
        say!(out);
        Ok(before)
    }

    /// Step 4: one IP set delta and no rule change; shows how long it took to reach the kernel
    /// and the matrix again, marking the flow that flipped against `before`.
    fn flip_with_ipset_delta(
        &self,
        out: &mut dyn Write,
        before: &MatrixReport,
    ) -> Result<MatrixReport, DemoError> {
        say!(
            out,
            "4. IP set delta: {DELTA_SET} += {DB}/32 (db); no rule changes"
        );
        let t_delta = Instant::now();
        self.agent.send(vec![ToDataplane {
            sequence_number: 0,
            payload: Some(Payload::IpsetDeltaUpdate(IpSetDeltaUpdate {
                id: DELTA_SET.to_string(),
                added_members: vec![format!("{DB}/32")],
                removed_members: Vec::new(),
            })),
        }])?;
        wait_for_element(self.topo.host(), DB, &self.agent)?;
        say!(
            out,
            "   in the kernel after {} ms",
            t_delta.elapsed().as_millis()
        );
        let (flows_after, why_after) = demo_flows(&self.topo, true);
        let after = run_matrix(&flows_after, PROBE_TIMEOUT);
        print_matrix(out, &flows_after, &why_after, &after, Some(before))?;
        say!(out);
        Ok(after)
    }

    /// Step 5: the flow logs the agent made of steps 3 and 4, read from its flow socket as
    /// `felix-nft flows` reads them and printed as it prints them: each flow once, its records
    /// of every flush added up, and from the destination's side where the destination reported
    /// it (this demo's policies are the destinations'; every source's profile allows out).
    fn show_flows(&self, out: &mut dyn Write) -> Result<(), DemoError> {
        let socket = match self.agent.flow_socket() {
            Some(Ok(socket)) => socket,
            Some(Err(why)) => {
                say!(out, "5. flow logs: none, they could not start: {why}");
                say!(out);
                return Ok(());
            }
            None => return Ok(()),
        };
        say!(
            out,
            "5. flow logs, as `felix-nft flows` shows them (flushed every {} s): who talked to \
             whom, the side that reported it, the verdict and the rule that decided",
            FLOW_FLUSH.as_secs()
        );
        let records = match settled_flows(socket) {
            Ok(r) => r,
            Err(e) => {
                say!(out, "   none: {}", felix_nft::ops::logging::chain(&e));
                say!(out);
                return Ok(());
            }
        };
        let n = records.len();
        let flows = one_per_flow(records);
        for r in &flows {
            say!(out, "   {}", format_record(r, false));
        }
        say!(out, "   {} flows, from {n} records", flows.len());
        say!(out);
        Ok(())
    }

    /// Step 6: stops the agent, closes the listeners, and deletes the namespaces or, with `keep`,
    /// leaves them and says how to look and clean up. Returns the namespaces kept and the agent's
    /// number of applies.
    fn remove_or_keep(
        self,
        out: &mut dyn Write,
        keep: bool,
    ) -> Result<(Vec<String>, u64), DemoError> {
        let summary = self.agent.stop()?;
        drop(self.servers);
        drop(self.ext_server);
        let mut kept = Vec::new();
        if keep {
            kept = self.topo.keep();
            say!(
                out,
                "6. kept for inspection (the agent has stopped; its rules stay). Look with"
            );
            say!(out, "     ip netns exec {} nft list ruleset", kept[0]);
            say!(out, "   and clean up with");
            say!(out, "     felix-nft cleanup --netns {}", kept[0]);
            for n in &kept {
                say!(out, "     ip netns del {n}");
            }
        } else {
            drop(self.topo);
            say!(
                out,
                "6. removed everything: the agent stopped, and all 5 namespaces are deleted"
            );
        }
        Ok((kept, summary.applies))
    }
}

/// The last line: whether every flow in both matrices did what the policy says, and how long
/// the demo took.
fn print_verdict(
    out: &mut dyn Write,
    before: &MatrixReport,
    after: &MatrixReport,
    t0: Instant,
    applies: u64,
) -> Result<(), DemoError> {
    let ok = before.all_match() && after.all_match();
    say!(
        out,
        "{} in {:.1} s ({} applies by the agent)",
        if ok {
            "every flow did what the policy says".to_string()
        } else {
            format!(
                "✗ {} flows did NOT do what the policy says",
                before.mismatches().len() + after.mismatches().len()
            )
        },
        t0.elapsed().as_secs_f64(),
        applies
    );
    Ok(())
}

/// The workload endpoints: every workload in tier `platform`, the backend also in tier `app`,
/// all with profile `kns.demo` (a Kubernetes namespace profile would look like this).
fn endpoint_updates(topo: &Topology) -> Vec<ToDataplane> {
    let policy = |name: &str| PolicyId {
        name: name.to_string(),
        kind: "GlobalNetworkPolicy".to_string(),
        ..PolicyId::default()
    };
    let tier = |name: &str, ingress: &str| TierInfo {
        name: name.to_string(),
        ingress_policies: vec![policy(ingress)],
        ..TierInfo::default()
    };
    topo.workloads()
        .iter()
        .map(|w| {
            let mut ep = w.endpoint(&["kns.demo"]);
            ep.tiers = vec![tier("platform", "platform.guard")];
            if w.name == "backend" {
                ep.tiers.push(tier("app", "app.backend-ingress"));
            }
            ToDataplane {
                sequence_number: 0,
                payload: Some(Payload::WorkloadEndpointUpdate(WorkloadEndpointUpdate {
                    id: Some(w.endpoint_id()),
                    endpoint: Some(ep),
                })),
            }
        })
        .collect()
}

/// One flow of the demo and why it passes or drops (printed beside it).
struct FlowRow {
    /// A workload's name.
    from: &'static str,
    /// A workload's name, or `external`.
    to: &'static str,
    proto: Proto,
    port: u16,
    expect: Verdict,
    why: &'static str,
}

impl FlowRow {
    const fn new(
        (from, to): (&'static str, &'static str),
        proto: Proto,
        port: u16,
        expect: Verdict,
        why: &'static str,
    ) -> Self {
        FlowRow {
            from,
            to,
            proto,
            port,
            expect,
            why,
        }
    }
}

const FRONTEND_TO_BACKEND: FlowRow = FlowRow::new(
    ("frontend", "backend"),
    Proto::Tcp,
    WORKLOAD_PORT,
    Verdict::Pass,
    "app: source in s:backend-clients",
);

/// db → backend before db joins s:backend-clients.
const DB_OUTSIDE_SET: FlowRow = FlowRow::new(
    ("db", "backend"),
    Proto::Tcp,
    WORKLOAD_PORT,
    Verdict::Drop,
    "app: not in the set, end of tier drops",
);

/// db → backend after db joins s:backend-clients.
const DB_IN_SET: FlowRow = FlowRow::new(
    ("db", "backend"),
    Proto::Tcp,
    WORKLOAD_PORT,
    Verdict::Pass,
    "app: db is in s:backend-clients now",
);

/// The flows after db → backend, the same whether db is in the set or not.
const PLATFORM_FLOWS: [FlowRow; 6] = {
    use Proto::*;
    use Verdict::*;
    const DENIED: &str = "platform: tcp/9090 denied";
    const ALLOWED: &str = "platform passes; profile allows";
    [
        FlowRow::new(("frontend", "backend"), Tcp, ADMIN_PORT, Drop, DENIED),
        FlowRow::new(("db", "frontend"), Tcp, ADMIN_PORT, Drop, DENIED),
        FlowRow::new(("backend", "frontend"), Tcp, WORKLOAD_PORT, Pass, ALLOWED),
        FlowRow::new(("backend", "db"), Tcp, WORKLOAD_PORT, Pass, ALLOWED),
        FlowRow::new(("frontend", "db"), Icmp, 0, Pass, ALLOWED),
        FlowRow::new(
            ("frontend", "external"),
            Tcp,
            WORKLOAD_PORT,
            Pass,
            "egress allowed; NAT outgoing",
        ),
    ]
};

/// The demo's flows (db → backend as before or after db joins the set), each with why it
/// passes or drops; flows whose ends are not in `topo` are left out.
fn demo_flows(topo: &Topology, db_in_set: bool) -> (Vec<Flow<'_>>, Vec<&'static str>) {
    let db = if db_in_set {
        &DB_IN_SET
    } else {
        &DB_OUTSIDE_SET
    };
    [&FRONTEND_TO_BACKEND, db]
        .into_iter()
        .chain(&PLATFORM_FLOWS)
        .filter_map(|row| demo_flow(topo, row))
        .unzip()
}

/// The flow `row` describes, probed from the source workload's namespace; `None` when either
/// end (or the destination's address) is missing from `topo`.
fn demo_flow<'a>(topo: &'a Topology, row: &FlowRow) -> Option<(Flow<'a>, &'static str)> {
    let src = topo.workload(row.from)?;
    let dst = match topo.workload(row.to) {
        Some(w) => w.ipv4.map(IpAddr::V4)?,
        None => IpAddr::V4(topo.external()?.ipv4),
    };
    let flow = Flow {
        from: row.from.to_string(),
        ns: src.ns(),
        to: row.to.to_string(),
        dst,
        proto: row.proto,
        port: row.port,
        expect: row.expect,
    };
    Some((flow, row.why))
}

fn print_matrix(
    out: &mut dyn Write,
    flows: &[Flow<'_>],
    why: &[&str],
    report: &MatrixReport,
    previous: Option<&MatrixReport>,
) -> Result<(), DemoError> {
    let label = |f: &Flow<'_>| match f.proto {
        Proto::Icmp => format!("{} → {} icmp", f.from, f.to),
        p => format!("{} → {} {p}/{}", f.from, f.to, f.port),
    };
    let width = flows
        .iter()
        .map(|f| label(f).chars().count())
        .max()
        .unwrap_or(4);
    say!(
        out,
        "   {:<width$}  {:<8}  {:<8}  why",
        "flow",
        "expected",
        "got"
    );
    for (i, ((f, why), r)) in flows.iter().zip(why).zip(&report.results).enumerate() {
        let got = match &r.got {
            Ok(v) => v.to_string().to_uppercase(),
            Err(e) => format!("ERROR ({e})"),
        };
        let mut note = String::new();
        if !r.matches() {
            note.push_str("  ✗ MISMATCH");
        }
        if let Some(prev) = previous.and_then(|p| p.results.get(i)) {
            if prev.got != r.got {
                let was = match &prev.got {
                    Ok(v) => v.to_string().to_uppercase(),
                    Err(_) => "ERROR".to_string(),
                };
                note.push_str(&format!("  ← flipped (was {was})"));
            }
        }
        say!(
            out,
            "   {:<width$}  {:<8}  {:<8}  {why}{note}",
            label(f),
            r.expect.to_string().to_uppercase(),
            got
        );
    }
    say!(
        out,
        "   {} flows, {} as expected, {} ms",
        report.results.len(),
        report.results.len() - report.mismatches().len(),
        report.elapsed.as_millis()
    );
    Ok(())
}

/// One table's contents, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableSummary {
    pub family: &'static str,
    pub name: String,
    pub chains: usize,
    pub base_chains: usize,
    pub rules: usize,
    pub sets: usize,
    pub set_elements: usize,
    pub maps: usize,
    pub map_elements: usize,
}

impl TableSummary {
    /// Counts what a table holds; interval ends (`NFT_SET_ELEM_INTERVAL_END`) are not members.
    pub fn of(family: &'static str, t: &Table) -> TableSummary {
        let members = |s: &nf_tables::model::Set| {
            s.elements
                .iter()
                .filter(|e| e.flags & INTERVAL_END == 0)
                .count()
        };
        let mut s = TableSummary {
            family,
            name: t.name.clone(),
            chains: t.chains.len(),
            base_chains: t.chains.values().filter(|c| c.base.is_some()).count(),
            rules: t.chains.values().map(|c| c.rules.len()).sum(),
            ..TableSummary::default()
        };
        for set in t.sets.values() {
            if set.data.is_some() {
                s.maps += 1;
                s.map_elements += members(set);
            } else {
                s.sets += 1;
                s.set_elements += members(set);
            }
        }
        s
    }
}

impl std::fmt::Display for TableSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "table {:<4} {}  {} chains ({} base), {} rules, {} sets ({} elements), {} verdict maps ({} elements)",
            self.family,
            self.name,
            self.chains,
            self.base_chains,
            self.rules,
            self.sets,
            self.set_elements,
            self.maps,
            self.map_elements
        )
    }
}

/// Reads our tables (main and side, both families) in `host` over nf_tables netlink.
fn read_tables(host: &NetNs) -> Result<Vec<TableSummary>, DemoError> {
    // The socket is bound to the namespace it was opened in.
    let mut nft = host.run(Nft::open)?.map_err(|source| DemoError::Nft {
        what: "nf_tables (opening the socket)".into(),
        source,
    })?;
    let mut out = Vec::new();
    for name in [OWNER, felix_nft_rules::SIDE_TABLE] {
        for (family, label) in [(Family::Ip, "ip"), (Family::Ip6, "ip6")] {
            let state =
                read_table(nft.socket(), family, name).map_err(|source| DemoError::Nft {
                    what: format!("table {label} {name}"),
                    source,
                })?;
            if let Some(state) = state {
                out.push(TableSummary::of(label, &state.table));
            }
        }
    }
    Ok(out)
}

/// The single-threaded runtime the demo drives its async parts on (test bed, agents, read-backs).
fn runtime() -> Result<tokio::runtime::Runtime, DemoError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DemoError::Runtime)
}

/// How long a matrix may take to settle once the kernel holds what it should: the first
/// packets to a fresh workload or node wait for (proxy) ARP and tunnel handshakes, which an
/// emulated machine running other work slows by seconds.
const SETTLE: Duration = Duration::from_secs(10);

/// The traffic matrix of `flows` once the network has settled: an untimed round runs first,
/// then rounds until every flow does what is expected or [`SETTLE`] has passed; the last round
/// is the one shown.
fn settled_matrix(flows: &[Flow<'_>]) -> MatrixReport {
    let _ = run_matrix(flows, PROBE_TIMEOUT);
    let deadline = Instant::now() + SETTLE;
    loop {
        let m = run_matrix(flows, PROBE_TIMEOUT);
        if m.all_match() || Instant::now() >= deadline {
            return m;
        }
    }
}

/// The agent's flow records once the last matrix's flows are in them. Each flow is in the
/// first flush after it, within a flush interval (plus NFLOG's 100 ms batching); past that,
/// this waits at most one more interval for an allowed and a denied record.
fn settled_flows(socket: &Path) -> Result<Vec<FlowRecord>, FlowClientError> {
    let settled = Instant::now() + FLOW_FLUSH + Duration::from_millis(300);
    let deadline = settled + FLOW_FLUSH;
    std::thread::sleep(settled.saturating_duration_since(Instant::now()));
    loop {
        let records = list_flows(socket)?;
        let has = |v: FlowVerdict| records.iter().any(|r| r.key.action == v);
        if (has(FlowVerdict::Allow) && has(FlowVerdict::Deny)) || Instant::now() >= deadline {
            return Ok(records);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every record the agent holds, oldest first.
fn list_flows(socket: &Path) -> Result<Vec<FlowRecord>, FlowClientError> {
    let mut records = Vec::new();
    for reply in FlowClient::connect(socket, &Request::default())? {
        if let Reply::Record(r) = reply? {
            records.push(*r);
        }
    }
    Ok(records)
}

/// One record per flow key, the counts of its flushes added up (from its first start to its
/// last end, live connections as of the last); a flow's source-side record is left out when
/// its destination reported it too. By source, destination and port, then in the order they
/// were first flushed (a flow whose verdict flipped within one flush interval shows its
/// verdicts in key order: records carry no finer time).
fn one_per_flow(records: Vec<FlowRecord>) -> Vec<FlowRecord> {
    let mut merged: BTreeMap<FlowKey, (usize, FlowRecord)> = BTreeMap::new();
    for (i, r) in records.into_iter().enumerate() {
        match merged.get_mut(&r.key) {
            None => {
                merged.insert(r.key.clone(), (i, r));
            }
            Some((_, m)) => {
                m.start_time = m.start_time.min(r.start_time);
                if r.end_time >= m.end_time {
                    m.end_time = r.end_time;
                    m.connections_live = r.connections_live;
                }
                m.packets_in = m.packets_in.saturating_add(r.packets_in);
                m.packets_out = m.packets_out.saturating_add(r.packets_out);
                m.bytes_in = m.bytes_in.saturating_add(r.bytes_in);
                m.bytes_out = m.bytes_out.saturating_add(r.bytes_out);
                m.connections_started = m.connections_started.saturating_add(r.connections_started);
                m.connections_completed = m
                    .connections_completed
                    .saturating_add(r.connections_completed);
            }
        }
    }
    let ends = |k: &FlowKey| (k.src.clone(), k.dst.clone(), k.proto, k.dest_port);
    let by_dst: BTreeSet<_> = merged
        .keys()
        .filter(|k| k.reporter == Reporter::Dst)
        .map(ends)
        .collect();
    let mut flows: Vec<(usize, FlowRecord)> = merged
        .into_values()
        .filter(|(_, r)| r.key.reporter == Reporter::Dst || !by_dst.contains(&ends(&r.key)))
        .collect();
    flows.sort_by_cached_key(|(first, r)| (ends(&r.key), *first));
    flows.into_iter().map(|(_, r)| r).collect()
}

/// Every IPv4 route in the namespace of `h`.
async fn ipv4_routes(h: &RtnlHandle) -> Result<Vec<RouteMessage>, DemoError> {
    h.handle()
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(|e| DemoError::Rtnl(RtnlError::kernel("dumping", "routes", e)))
}

/// The IPv4 routes on workload (`cali…`) interfaces, as `dst → ifname`, and the number of
/// permanent (static ARP) neighbours on them.
async fn read_routes(host: &NetNs) -> Result<(Vec<String>, usize), DemoError> {
    let h = RtnlHandle::connect(Some(host)).map_err(DemoError::Rtnl)?;
    let links = link::list_links(&h).await.map_err(DemoError::Rtnl)?;
    let name_of = |idx: u32| {
        links
            .iter()
            .find(|l| l.index == idx)
            .map(|l| l.name.clone())
    };
    let msgs = ipv4_routes(&h).await?;
    let mut routes = Vec::new();
    for m in &msgs {
        let mut dst = None;
        let mut oif = None;
        for a in &m.attributes {
            match a {
                RouteAttribute::Destination(RouteAddress::Inet(v4)) => dst = Some(*v4),
                RouteAttribute::Oif(i) => oif = name_of(*i),
                _ => {}
            }
        }
        if let (Some(dst), Some(oif)) = (dst, oif) {
            if oif.starts_with("cali") {
                routes.push(format!(
                    "{dst}/{} → {oif}",
                    m.header.destination_prefix_length
                ));
            }
        }
    }
    routes.sort();
    let neigh: Vec<NeighbourMessage> = h
        .handle()
        .neighbours()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|e| DemoError::Rtnl(RtnlError::kernel("dumping", "neighbours", e)))?;
    let neighbours = neigh
        .iter()
        .filter(|n| n.header.state == NeighbourState::Permanent)
        .filter(|n| name_of(n.header.ifindex).is_some_and(|i| i.starts_with("cali")))
        .count();
    Ok((routes, neighbours))
}

/// Waits until some set of our IPv4 table holds `ip` (the delta's transaction committed: set
/// elements and rules go in one batch).
fn wait_for_element(host: &NetNs, ip: Ipv4Addr, agent: &Agent) -> Result<(), DemoError> {
    let mut nft = host.run(Nft::open)?.map_err(|source| DemoError::Nft {
        what: "nf_tables (opening the socket)".into(),
        source,
    })?;
    let key = ip.octets().to_vec();
    let deadline = Instant::now() + APPLY_TIMEOUT;
    loop {
        let state =
            read_table(nft.socket(), Family::Ip, OWNER).map_err(|source| DemoError::Nft {
                what: format!("table ip {OWNER}"),
                source,
            })?;
        let found = state.is_some_and(|s| {
            s.table
                .sets
                .values()
                .filter(|set| set.data.is_none())
                .any(|set| {
                    // An interval's end element sits at the first address after it: only a start element makes `ip` a member.
                    set.elements
                        .iter()
                        .any(|e| e.key[..] == key[..] && e.flags & INTERVAL_END == 0)
                })
        });
        if found {
            return Ok(());
        }
        if agent.finished() {
            return Err(DemoError::AgentGone {
                what: "applying the IP set delta",
            });
        }
        if Instant::now() >= deadline {
            return Err(DemoError::Timeout {
                what: "the IP set delta reaching the kernel",
                timeout: APPLY_TIMEOUT,
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nf_tables::model::{Chain, DataType, ElemData, ElemKey, Element, Set, Verdict};

    fn elem(key: [u8; 4], flags: u32, data: Option<ElemData>) -> Element {
        Element {
            key: ElemKey::from_slice(&key),
            key_end: None,
            flags,
            data: data.map(Box::new),
        }
    }

    #[test]
    fn summary_counts_members_not_interval_ends_and_tells_maps_from_sets() {
        let mut t = Table::new(Family::Ip, "calico");
        t.chains.insert(
            "c".into(),
            Chain {
                name: "c".into(),
                base: None,
                rules: Vec::new(),
            },
        );
        // Two /32 members: each a start element and an end element at the next address.
        t.sets.insert(
            "s".into(),
            Set {
                counter: false,
                counters: Default::default(),
                name: "s".into(),
                key: vec![DataType::Ipv4Addr],
                flags: 0,
                data: None,
                size: None,
                elements: vec![
                    elem([198, 18, 0, 1], 0, None),
                    elem([198, 18, 0, 2], INTERVAL_END, None),
                    elem([198, 18, 0, 3], 0, None),
                    elem([198, 18, 0, 4], INTERVAL_END, None),
                ],
            },
        );
        t.sets.insert(
            "m".into(),
            Set {
                counter: false,
                counters: Default::default(),
                name: "m".into(),
                key: vec![DataType::Ipv4Addr],
                flags: 0,
                data: Some(DataType::Verdict),
                size: None,
                elements: vec![elem(
                    [1, 2, 3, 4],
                    0,
                    Some(ElemData::Verdict(Verdict::Accept)),
                )],
            },
        );
        let s = TableSummary::of("ip", &t);
        assert_eq!((s.chains, s.base_chains, s.rules), (1, 0, 0));
        assert_eq!((s.sets, s.set_elements), (1, 2));
        assert_eq!((s.maps, s.map_elements), (1, 1));
        assert_eq!(
            s.to_string(),
            "table ip   calico  1 chains (0 base), 0 rules, 1 sets (2 elements), 1 verdict maps (1 elements)"
        );
    }

    fn flow(src: &str, dst: &str, reporter: Reporter, action: FlowVerdict) -> FlowRecord {
        use felix_nft::flows::{Endpoint, EndpointKind};
        let end = |name: &str| Endpoint {
            kind: EndpointKind::Workload,
            name: name.into(),
            namespace: String::new(),
            node: None,
        };
        FlowRecord {
            key: FlowKey {
                src: end(src),
                dst: end(dst),
                proto: 6,
                dest_port: 8080,
                reporter,
                action,
                trace: Vec::new(),
            },
            start_time: 100,
            end_time: 101,
            packets_in: 2,
            packets_out: 1,
            bytes_in: 120,
            bytes_out: 60,
            connections_started: 1,
            connections_completed: 0,
            connections_live: 1,
        }
    }

    #[test]
    fn flows_are_shown_once_each_from_the_destination_where_it_reported() {
        use FlowVerdict::{Allow, Deny};
        let mut later = flow("a", "b", Reporter::Dst, Allow);
        (later.start_time, later.end_time) = (101, 102);
        later.connections_live = 0;
        // The listing is oldest first: c -> b was denied, then allowed.
        let shown = one_per_flow(vec![
            flow("a", "b", Reporter::Src, Allow),
            flow("a", "b", Reporter::Dst, Allow),
            flow("c", "b", Reporter::Dst, Deny),
            later,
            flow("c", "b", Reporter::Dst, Allow),
            flow("c", "ext", Reporter::Src, Allow),
        ]);
        let summary: Vec<_> = shown
            .iter()
            .map(|r| {
                (
                    r.key.src.name.as_str(),
                    r.key.dst.name.as_str(),
                    r.key.reporter,
                    r.key.action,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("a", "b", Reporter::Dst, Allow),
                ("c", "b", Reporter::Dst, Deny),
                ("c", "b", Reporter::Dst, Allow),
                ("c", "ext", Reporter::Src, Allow),
            ]
        );
        let a_b = &shown[0];
        assert_eq!((a_b.start_time, a_b.end_time), (100, 102));
        assert_eq!((a_b.packets_in, a_b.bytes_out), (4, 120));
        assert_eq!((a_b.connections_started, a_b.connections_live), (2, 0));
    }

    #[test]
    fn the_bundled_example_state_parses() {
        let msgs = felix_nft::source::state::parse(EXAMPLE_STATE.as_bytes(), "example-state.json")
            .expect("the bundled state is valid");
        assert_eq!(msgs.len(), 5);
    }
}
