//! `felix-nft bench compare`: the same Felix-shaped workload programmed by each backend
//! in turn, each repetition in a fresh private network namespace, timed side by side.
//!
//! - [`workload`]: the generator (scales small/mid/large/custom) and the timed operations.
//! - [`shapes`]: the baselines' inputs (Felix's iptables + ipset shape, Calico's nft shape).
//! - [`run`]: timing a spawned tool (wait4 rusage, GNU time RSS) and felix-nft in-process.
//! - [`spot`]: the traffic spot-check (real packets through a test bed, every backend).
//! - [`cluster`]: the cluster scale: a node learning N remote VXLAN nodes, the agent's loop
//!   against `ip -batch` + `bridge -batch`.
//! - [`flowlogs`]: `bench flowlogs`, what flow logs cost a node: the agent binary on a test bed
//!   node at a scale's policy load, connections per second and IP set applies with flow logs
//!   off and on, and a denied flood's cost to the agent.
//! - [`report`]: medians with min/max, ratios, the table, JSON and the SVG chart.
//!
//! Invariants: nothing here writes the host's namespace (every spawn and socket checks it is not
//! in PID 1's netns); every namespace made is deleted afterwards, also on error (a drop guard);
//! a baseline whose binary is missing is skipped with a note, never faked. This module is the
//! only production code allowed to run external programs, and only the baselines (and, for
//! `bench flowlogs`, the felix-nft agent itself).

pub mod cluster;
pub mod flowlogs;
pub mod report;
pub mod run;
pub mod shapes;
pub mod spot;
pub mod tunnels;
pub mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

use felix_api::ToDataplane;
use nf_tables::error::NftError;
use report::Report;
use rtnl::netns::{self, NetNs, NetNsError};
use run::{Counts, InProcess, Sample, Tool};
use shapes::{IptState, NftState};
use workload::{Scale, Workload, OPS};

/// What can stop a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{op}")]
    Netns {
        op: &'static str,
        #[source]
        source: NetNsError,
    },
    #[error("{op}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}")]
    Nft {
        op: String,
        #[source]
        source: NftError,
    },
    #[error("{tool} failed (wait status {status}): {stderr}")]
    ToolFailed {
        tool: String,
        status: i32,
        stderr: String,
    },
    #[error("{op}")]
    Testbed {
        op: String,
        #[source]
        source: crate::testbed::TestbedError,
    },
    #[error("{op}")]
    Rtnl {
        op: String,
        /// Boxed: rtnetlink's error is large and would bloat every result here.
        #[source]
        source: Box<rtnl::RtnlError>,
    },
    #[error("refused: {0}")]
    Refused(String),
    /// The agent a benchmark runs as a child failed; the end of its log says why.
    #[error("the felix-nft agent {op}; its log ends:\n{log_tail}")]
    Agent { op: String, log_tail: String },
    #[error("cleaning the node between agents")]
    Cleanup {
        #[source]
        source: Box<felix_nft::dataplane::oneshot::OneShotError>,
    },
    #[error("reading the agent's flows")]
    Flows {
        #[source]
        source: felix_nft::flows::serve::FlowClientError,
    },
    #[error("writing the chart")]
    Chart(String),
}

/// The backends, in table order.
pub const BACKENDS: [&str; 5] = [
    "felix-nft",
    "felix-nft-proc",
    "ipt-nft",
    "ipt-legacy",
    "nft-f",
];

/// Options of one comparison.
#[derive(Debug, Clone)]
pub struct Options {
    pub scale: Scale,
    /// Full syncs (fresh namespaces) per backend.
    pub reps: usize,
    /// Rounds of the six incremental operations per repetition.
    pub inc: usize,
    /// Where inputs, the JSON and the SVG go.
    pub out_dir: PathBuf,
    /// The felix-nft binary for the fresh-process backend (default: this executable).
    pub felix_exe: Option<PathBuf>,
    /// Only these backends (default: all).
    pub only: Option<Vec<String>>,
    /// Also run the traffic spot-check ([`spot`]) before the timings.
    pub spot_check: bool,
    /// IPv6 on as well (Felix's default): felix-nft with IPv6 support, the iptables baselines
    /// restoring the same ruleset with `ip6tables` beside `iptables` (IPv6 sets empty: the
    /// workload has no IPv6 members), `nft -f` with the IPv6 set matches in its `inet` table.
    pub dual_stack: bool,
}

impl Options {
    /// Defaults sized to finish in a couple of minutes on 2 cores.
    pub fn for_scale(scale: Scale, out_dir: PathBuf) -> Options {
        let (reps, inc) = if scale.w <= 200 {
            (5, 3)
        } else if scale.w <= 2000 {
            (3, 3)
        } else {
            (1, 2)
        };
        Options {
            scale,
            reps,
            inc,
            out_dir,
            felix_exe: None,
            only: None,
            spot_check: false,
            dual_stack: false,
        }
    }
}

/// One step of the operation sequence, with every backend's input for it.
struct Step {
    op: &'static str,
    msgs: Vec<ToDataplane>,
    ipt: PathBuf,
    /// The IPv6 table's restore (dual stack only).
    ip6t: Option<PathBuf>,
    ipset_adds: Vec<(String, String)>,
    nft: PathBuf,
    state: PathBuf,
}

struct Inputs {
    full_ipt: PathBuf,
    /// The IPv6 table's full restore (dual stack only).
    full_ip6t: Option<PathBuf>,
    dual_stack: bool,
    full_ipset: PathBuf,
    full_nft: PathBuf,
    full_state: PathBuf,
    full_msgs: Vec<ToDataplane>,
    /// `inc` timed rounds, then one round run under GNU time for RSS.
    steps: Vec<Vec<Step>>,
    /// Expected counts after everything ran.
    ipt_rules: usize,
    ipt_members: usize,
    nft_rules: usize,
    nft_elements: usize,
    members: usize,
}

impl Inputs {
    /// The steps a run replays, each with whether it is timed: the `inc` timed rounds, then the
    /// rounds after them (untimed, run for peak RSS) only when `rss_round`.
    fn replayed(&self, inc: usize, rss_round: bool) -> impl Iterator<Item = (&Step, bool)> {
        self.steps
            .iter()
            .enumerate()
            .map(move |(i, round)| (round, i < inc))
            .take_while(move |(_, timed)| *timed || rss_round)
            .flat_map(|(round, timed)| round.iter().map(move |st| (st, timed)))
    }
}

/// `mkdir -p dir`.
fn create_dir(dir: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
        op: format!("creating {}", dir.display()),
        source,
    })
}

fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Io {
        op: format!("writing {}", path.display()),
        source,
    })
}

fn build_inputs(opts: &Options, sizes: &mut report::Sizes) -> Result<Inputs, BenchError> {
    let dir = opts.out_dir.join("inputs");
    create_dir(&dir)?;
    let dual = opts.dual_stack;
    let mut w = Workload::generate(opts.scale);
    let mut ipt = IptState::render(&w);
    let mut ip6t = ipt.ipv6_copy();
    let mut nft = NftState::render(&w, dual);
    let full = |n: &str| dir.join(n);
    let mut ipset_text = ipt.ipset_restore();
    if dual {
        ipset_text.push_str(&ip6t.ipset_restore());
        write(&full("full.ip6t"), &ip6t.restore())?;
    }
    let (ipt_text, nft_text, state_text) = (ipt.restore(), nft.full(), w.state_document());
    sizes.ipt_bytes = ipt_text.len();
    sizes.ipset_bytes = ipset_text.len();
    sizes.nft_bytes = nft_text.len();
    sizes.state_bytes = state_text.len();
    sizes.ipt_rules = ipt.rule_count();
    sizes.ipt_chains = ipt.chains.len();
    sizes.nft_rules = nft.rule_count();
    sizes.nft_chains = nft.chain_count();
    sizes.nft_map_elements = nft.element_count() - w.members();
    sizes.set_members = w.members();
    write(&full("full.ipt"), &ipt_text)?;
    write(&full("full.ipset"), &ipset_text)?;
    write(&full("full.nft"), &nft_text)?;
    write(&full("full.jsonl"), &state_text)?;
    let full_msgs = w.messages();
    let mut steps = Vec::new();
    for round in 0..=opts.inc {
        let mut r = Vec::new();
        for op in OPS {
            let msgs = w.mutate(op, round);
            let (ipt2, nft2) = (IptState::render(&w), NftState::render(&w, dual));
            let ip6t2 = ipt2.ipv6_copy();
            let stem = format!("r{round}-{op}");
            let s = Step {
                op,
                msgs,
                ipt: dir.join(format!("{stem}.ipt")),
                ip6t: dual.then(|| dir.join(format!("{stem}.ip6t"))),
                ipset_adds: ipt.added_members(&ipt2),
                nft: dir.join(format!("{stem}.nft")),
                state: dir.join(format!("{stem}.jsonl")),
            };
            write(&s.ipt, &ipt.delta_restore(&ipt2))?;
            if let Some(p) = &s.ip6t {
                write(p, &ip6t.delta_restore(&ip6t2))?;
            }
            write(&s.nft, &nft.delta(&nft2))?;
            write(&s.state, &w.state_document())?;
            ipt = ipt2;
            ip6t = ip6t2;
            nft = nft2;
            r.push(s);
        }
        steps.push(r);
    }
    Ok(Inputs {
        full_ipt: full("full.ipt"),
        full_ip6t: dual.then(|| full("full.ip6t")),
        dual_stack: dual,
        full_ipset: full("full.ipset"),
        full_nft: full("full.nft"),
        full_state: full("full.jsonl"),
        full_msgs,
        steps,
        ipt_rules: ipt.rule_count() + if dual { ip6t.rule_count() } else { 0 },
        ipt_members: ipt.member_count(),
        nft_rules: nft.rule_count(),
        nft_elements: nft.element_count(),
        members: w.members(),
    })
}

/// Deletes the namespace on drop (also on error or panic), then lets the kernel's asynchronous
/// netns teardown finish before the next measurement.
struct BenchNs(Option<netns::NamedNetNs>);

impl Drop for BenchNs {
    fn drop(&mut self) {
        drop(self.0.take());
        std::thread::sleep(Duration::from_millis(150));
    }
}

fn fresh_ns() -> Result<BenchNs, BenchError> {
    let name = netns::unique_netns_name("fnft-bench");
    NetNs::create_named(&name)
        .map(|n| BenchNs(Some(n)))
        .map_err(|source| BenchError::Netns {
            op: "creating a benchmark namespace",
            source,
        })
}

impl BenchNs {
    fn ns(&self) -> &NetNs {
        // Some until drop.
        self.0
            .as_ref()
            .map(|n| n.ns())
            .unwrap_or_else(|| unreachable!())
    }
    fn name(&self) -> String {
        self.0
            .as_ref()
            .map(|n| n.name().to_string())
            .unwrap_or_default()
    }
}

fn which(bin: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.exists())
}

/// Records samples under (backend, op).
struct Collector<'a> {
    report: &'a mut Report,
    backend: &'static str,
}

impl Collector<'_> {
    fn push(&mut self, op: &str, s: Sample, timed: bool) {
        let st = self
            .report
            .results
            .entry(self.backend.to_string())
            .or_default()
            .entry(op.to_string())
            .or_default();
        if timed {
            st.samples.push(s);
        }
        if let Some(k) = s.rss_kb {
            st.rss_kb = Some(st.rss_kb.unwrap_or(0).max(k));
        }
    }
}

/// Runs the comparison and writes `bench-<scale>.json` and `.svg` into `opts.out_dir`.
pub fn compare(opts: &Options) -> Result<Report, BenchError> {
    if run::in_root_netns() && !Path::new(netns::NETNS_RUN_DIR).exists() {
        std::fs::create_dir_all(netns::NETNS_RUN_DIR).ok();
    }
    let mut report = Report::new(opts);
    let wanted = |b: &str| opts.only.as_ref().is_none_or(|o| o.iter().any(|x| x == b));
    if opts.spot_check {
        eprintln!("bench: traffic spot-check");
        let sp = spot::spot_check(&opts.out_dir.join("spot"), &wanted)?;
        report.spot_ok = Some(sp.disagreements().is_empty() && sp.discriminates());
        report.spot = Some(sp.to_string());
    }
    let inputs = build_inputs(opts, &mut report.sizes)?;
    let scratch = opts.out_dir.clone();
    let rss = Path::new(run::GNU_TIME).exists();
    if !rss {
        report.notes.push(format!(
            "{} missing: no peak RSS for spawned tools",
            run::GNU_TIME
        ));
    }
    let felix_exe = opts
        .felix_exe
        .clone()
        .or_else(|| std::env::current_exe().ok());
    for backend in BACKENDS {
        if !wanted(backend) {
            continue;
        }
        let tools: Result<Vec<PathBuf>, String> = match backend {
            "felix-nft" => Ok(vec![]),
            "felix-nft-proc" => felix_exe
                .clone()
                .map(|p| vec![p])
                .ok_or_else(|| "no felix-nft executable".into()),
            "ipt-nft" | "ipt-legacy" => {
                let v = if backend == "ipt-nft" {
                    "nft"
                } else {
                    "legacy"
                };
                let mut bins = vec![
                    "ipset".to_string(),
                    format!("iptables-{v}-restore"),
                    format!("iptables-{v}-save"),
                ];
                if opts.dual_stack {
                    bins.push(format!("ip6tables-{v}-restore"));
                    bins.push(format!("ip6tables-{v}-save"));
                }
                need(&bins.iter().map(String::as_str).collect::<Vec<_>>())
            }
            _ => need(&["nft"]),
        };
        let tools = match tools {
            Ok(t) => t,
            Err(missing) => {
                report
                    .notes
                    .push(format!("{backend}: skipped, {missing} not installed"));
                continue;
            }
        };
        eprintln!(
            "bench: {backend} ({} reps × {} rounds)",
            opts.reps, opts.inc
        );
        let mode = if backend == "felix-nft-proc" {
            probe_fresh_mode(&tools[0], &scratch, &mut report.notes)
        } else {
            FreshMode::RunStdin
        };
        let mut c = Collector {
            report: &mut report,
            backend,
        };
        for rep in 0..opts.reps {
            let last = rep + 1 == opts.reps;
            let fresh = Rep {
                inp: &inputs,
                inc: opts.inc,
                rss_round: last && rss,
                rss,
                scratch: &scratch,
            };
            let counts = match backend {
                "felix-nft" => run_in_process(&inputs, &mut c, opts.inc, last)?,
                "felix-nft-proc" => run_fresh(fresh, &tools[0], mode, &mut c)?,
                "nft-f" => run_nft(fresh, &tools[0], &mut c)?,
                _ => run_ipt(fresh, &tools, &mut c)?,
            };
            if last {
                c.report.counts.insert(backend.to_string(), counts);
            }
        }
    }
    report.expected = report::Expected {
        ipt_rules: inputs.ipt_rules,
        ipt_members: inputs.ipt_members,
        nft_rules: inputs.nft_rules,
        nft_elements: inputs.nft_elements,
        workload_members: inputs.members,
    };
    report.check();
    report.finish();
    report.write_files(&opts.out_dir)?;
    Ok(report)
}

fn need(bins: &[&str]) -> Result<Vec<PathBuf>, String> {
    bins.iter()
        .map(|b| which(b).ok_or_else(|| b.to_string()))
        .collect()
}

fn run_in_process(
    inp: &Inputs,
    c: &mut Collector,
    inc: usize,
    last: bool,
) -> Result<Counts, BenchError> {
    let ns = fresh_ns()?;
    // Peak RSS of the in-process backend: on the last repetition the process's high-water mark
    // is reset to its current RSS (proc(5) clear_refs "5") before the socket opens and read
    // after the full sync. It is the whole process's peak — the daemon's situation too.
    let hwm = last && run::reset_peak_rss();
    let mut fx = InProcess::open(ns.ns(), inp.dual_stack)?;
    c.push("full", fx.apply(&inp.full_msgs)?, true);
    if let Some(k) = run::peak_rss_kb().filter(|_| hwm) {
        let s = Sample {
            rss_kb: Some(k),
            ..Sample::default()
        };
        c.push("full", s, false);
        c.report.notes.push(
            "felix-nft peak RSS: this process's VmHWM, reset (clear_refs 5) before the socket \
             opens and again before the incremental rounds; the incremental figure is the peak \
             over all of them"
                .into(),
        );
    }
    let hwm = hwm && inc > 0 && run::reset_peak_rss();
    for round in inp.steps.iter().take(inc) {
        for s in round {
            c.push(s.op, fx.apply(&s.msgs)?, true);
        }
        // What the daemon does once it has been idle: merge the side table back (two commits;
        // their sum is one sample).
        if let Some(s) = fx.merge_side()? {
            c.push("merge_side", s, true);
        }
    }
    if let Some(k) = run::peak_rss_kb().filter(|_| hwm) {
        let s = Sample {
            rss_kb: Some(k),
            ..Sample::default()
        };
        c.push("add_ep", s, false);
    }
    let (rb, _) = fx.read_back()?;
    c.push("read_back", rb, true);
    if !last {
        return Ok(Counts::default());
    }
    // The RSS round is not timed for felix-nft in-process; run it so every backend ends in the
    // same state for the count check.
    for s in &inp.steps[inc] {
        fx.apply(&s.msgs)?;
    }
    Ok(fx.read_back()?.1)
}

/// How the fresh-process backend drives the binary: `apply STATE` when the binary has
/// it, else the daemon reading the state document on stdin and exiting when it is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FreshMode {
    Apply { dump: bool },
    RunStdin,
}

fn felix_env(t: Tool, dual_stack: bool) -> Tool {
    let ipv6 = if dual_stack { "true" } else { "false" };
    t.env("FELIX_CONFIGFILE", "/nonexistent")
        .env("FELIX_IPV6SUPPORT", ipv6)
        .env("FELIX_REPORTINGINTERVALSECS", "0")
        .env("FELIX_LOGSEVERITYSCREEN", "warning")
        .env("RUST_LOG", "warn")
}

fn felix_tool(exe: &Path, mode: FreshMode, ns: &BenchNs, state: &Path, dual_stack: bool) -> Tool {
    let exe = exe.display().to_string();
    let name = ns.name();
    felix_env(
        match mode {
            // The bench writes its documents itself, some of them empty on purpose.
            FreshMode::Apply { .. } => Tool::new(&[
                &exe,
                "apply",
                "--allow-empty",
                &state.display().to_string(),
                "--netns",
                &name,
            ]),
            FreshMode::RunStdin => {
                Tool::new(&[&exe, "run", "--source", "stdin", "--netns", &name]).stdin(state)
            }
        },
        dual_stack,
    )
}

/// Asks the binary itself whether `apply` and `dump` work (they exit 3 until built), on an
/// empty state in a throwaway namespace.
fn probe_fresh_mode(exe: &Path, scratch: &Path, notes: &mut Vec<String>) -> FreshMode {
    let empty = scratch.join("inputs").join("empty.jsonl");
    if write(&empty, "{\"in_sync\":{}}\n").is_err() {
        return FreshMode::RunStdin;
    }
    let Ok(ns) = fresh_ns() else {
        return FreshMode::RunStdin;
    };
    let exe_s = exe.display().to_string();
    let name = ns.name();
    let apply = run::spawn_in(
        ns.ns(),
        &felix_env(
            Tool::new(&[
                &exe_s,
                "apply",
                "--allow-empty",
                &empty.display().to_string(),
                "--netns",
                &name,
            ]),
            false,
        ),
        false,
        scratch,
    );
    if let Err(e) = apply {
        notes.push(format!(
            "felix-nft-proc: `apply` unavailable in this binary ({e}); measured as a fresh \
             `felix-nft run --source stdin` process fed the state document instead, no read-back"
        ));
        return FreshMode::RunStdin;
    }
    let dump = run::spawn_in(
        ns.ns(),
        &felix_env(Tool::new(&[&exe_s, "dump", "--netns", &name]), false),
        false,
        scratch,
    );
    if let Err(e) = &dump {
        notes.push(format!(
            "felix-nft-proc: `dump` unavailable ({e}); no read-back row"
        ));
    }
    FreshMode::Apply { dump: dump.is_ok() }
}

/// One repetition of a backend that runs as its own processes in a fresh namespace.
#[derive(Clone, Copy)]
struct Rep<'a> {
    inp: &'a Inputs,
    /// Timed incremental rounds.
    inc: usize,
    /// The last repetition with RSS on: it also runs the untimed rounds (for peak RSS) and reads
    /// back the counts.
    rss_round: bool,
    /// Measure the full load's peak RSS.
    rss: bool,
    scratch: &'a Path,
}

fn run_fresh(
    rep: Rep,
    exe: &Path,
    mode: FreshMode,
    c: &mut Collector,
) -> Result<Counts, BenchError> {
    let ns = fresh_ns()?;
    let s = run::spawn_in(
        ns.ns(),
        &felix_tool(exe, mode, &ns, &rep.inp.full_state, rep.inp.dual_stack),
        rep.rss_round,
        rep.scratch,
    )?;
    c.push("full", s, true);
    for (st, timed) in rep.inp.replayed(rep.inc, rep.rss_round) {
        let s = run::spawn_in(
            ns.ns(),
            &felix_tool(exe, mode, &ns, &st.state, rep.inp.dual_stack),
            !timed,
            rep.scratch,
        )?;
        c.push(st.op, s, timed);
    }
    if let FreshMode::Apply { dump: true } = mode {
        let exe_s = exe.display().to_string();
        let t = felix_env(
            Tool::new(&[&exe_s, "dump", "--netns", &ns.name()]),
            rep.inp.dual_stack,
        );
        c.push(
            "read_back",
            run::spawn_in(ns.ns(), &t, false, rep.scratch)?,
            true,
        );
    }
    Ok(Counts::default())
}

fn run_nft(rep: Rep, nft: &Path, c: &mut Collector) -> Result<Counts, BenchError> {
    let ns = fresh_ns()?;
    let nft = nft.display().to_string();
    let load = |p: &Path| Tool::new(&[&nft, "-f", &p.display().to_string()]);
    c.push(
        "full",
        run::spawn_in(ns.ns(), &load(&rep.inp.full_nft), rep.rss, rep.scratch)?,
        true,
    );
    for (st, timed) in rep.inp.replayed(rep.inc, rep.rss_round) {
        c.push(
            st.op,
            run::spawn_in(ns.ns(), &load(&st.nft), !timed, rep.scratch)?,
            timed,
        );
    }
    let rb = Tool::new(&[&nft, "list", "ruleset"]);
    c.push(
        "read_back",
        run::spawn_in(ns.ns(), &rb, false, rep.scratch)?,
        true,
    );
    if !rep.rss_round {
        return Ok(Counts::default());
    }
    // Counts through nft's JSON output (not timed).
    let out = capture_in(ns.ns(), &[&nft, "-j", "list", "ruleset"])?;
    Ok(nft_counts(&out))
}

fn capture_in(ns: &NetNs, argv: &[&str]) -> Result<String, BenchError> {
    let _g = ns.enter().map_err(|source| BenchError::Netns {
        op: "entering the benchmark namespace",
        source,
    })?;
    if run::in_root_netns() {
        return Err(BenchError::Refused(
            "read-back in the host namespace".into(),
        ));
    }
    let out = output(argv)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `argv` (a read-back oracle) to the end and collects what it printed.
fn output(argv: &[&str]) -> Result<std::process::Output, BenchError> {
    std::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .map_err(|source| BenchError::Io {
            op: format!("running {}", argv.join(" ")),
            source,
        })
}

/// Rules, chains and elements in `nft -j list ruleset` output.
pub fn nft_counts(json: &str) -> Counts {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mut c = Counts::default();
    for o in v["nftables"].as_array().into_iter().flatten() {
        if o.get("rule").is_some() {
            c.rules += 1;
        } else if o.get("chain").is_some() {
            c.chains += 1;
        } else if let Some(s) = o.get("set").or_else(|| o.get("map")) {
            let n = s["elem"].as_array().map_or(0, Vec::len);
            c.elements += n;
            // The side table holds copies of the sets its endpoints use: count each set once.
            if s["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("cali40s-"))
                && s["table"].as_str() != Some(felix_nft_rules::SIDE_TABLE)
            {
                c.workload_members += n;
            }
        }
    }
    c
}

fn run_ipt(rep: Rep, tools: &[PathBuf], c: &mut Collector) -> Result<Counts, BenchError> {
    let ns = fresh_ns()?;
    let [ipset, restore, save] = [0, 1, 2].map(|i| tools[i].display().to_string());
    // Dual stack: `ip6tables-*-restore` and `-save` follow.
    let (restore6, save6) = (
        tools.get(3).map(|p| p.display().to_string()),
        tools.get(4).map(|p| p.display().to_string()),
    );
    let a = run::spawn_in(
        ns.ns(),
        &Tool::new(&[&ipset, "restore"]).stdin(&rep.inp.full_ipset),
        rep.rss,
        rep.scratch,
    )?;
    let rst = |p: &Path| Tool::new(&[&restore, "--noflush"]).stdin(p);
    // Both families' restores, one after the other (Felix runs them side by side, so on idle
    // cores its wall time is nearer the larger than the sum).
    let both = |v4: &Path, v6: Option<&PathBuf>, rss: bool| -> Result<Sample, BenchError> {
        let mut s = run::spawn_in(ns.ns(), &rst(v4), rss, rep.scratch)?;
        if let (Some(r6), Some(p)) = (&restore6, v6) {
            let t = Tool::new(&[r6, "--noflush"]).stdin(p);
            s = s.plus(run::spawn_in(ns.ns(), &t, rss, rep.scratch)?);
        }
        Ok(s)
    };
    let b = both(&rep.inp.full_ipt, rep.inp.full_ip6t.as_ref(), rep.rss)?;
    c.push("full_ipset", a, true);
    c.push("full", a.plus(b), true);
    for (st, timed) in rep.inp.replayed(rep.inc, rep.rss_round) {
        let s = if st.ipset_adds.is_empty() {
            both(&st.ipt, st.ip6t.as_ref(), !timed)?
        } else {
            let mut acc = Sample::default();
            for (set, m) in &st.ipset_adds {
                let t = Tool::new(&[&ipset, "add", set, m]);
                acc = acc.plus(run::spawn_in(ns.ns(), &t, !timed, rep.scratch)?);
            }
            acc
        };
        c.push(st.op, s, timed);
    }
    let mut rb = run::spawn_in(ns.ns(), &Tool::new(&[&save]), false, rep.scratch)?;
    if let Some(s6) = &save6 {
        rb = rb.plus(run::spawn_in(
            ns.ns(),
            &Tool::new(&[s6]),
            false,
            rep.scratch,
        )?);
    }
    let b = run::spawn_in(ns.ns(), &Tool::new(&[&ipset, "save"]), false, rep.scratch)?;
    c.push("read_back", rb.plus(b), true);
    if !rep.rss_round {
        return Ok(Counts::default());
    }
    let mut saved = capture_in(ns.ns(), &[&save, "-t", "filter"])?;
    if let Some(s6) = &save6 {
        saved.push_str(&capture_in(ns.ns(), &[s6, "-t", "filter"])?);
    }
    let sets = capture_in(ns.ns(), &[&ipset, "save"])?;
    Ok(Counts {
        chains: saved.lines().filter(|l| l.starts_with(":cali")).count(),
        rules: saved.lines().filter(|l| l.starts_with("-A ")).count(),
        elements: sets.lines().filter(|l| l.starts_with("add ")).count(),
        workload_members: sets
            .lines()
            .filter(|l| l.starts_with("add cali40s:"))
            .count(),
    })
}
