//! The `felix-nft-lab` subcommands: every command of `felix-nft` (the same parser and code),
//! plus `demo` and `bench`. Parsing and dispatch only.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use felix_nft::cli::EXIT_USAGE;

#[derive(Debug, Parser)]
#[command(
    name = "felix-nft-lab",
    version,
    about = "felix-nft's lab: its demo and benchmarks, and every felix-nft command",
    long_about = "felix-nft's lab: a scratch node or cluster in network namespaces (`demo`), the \
                  benchmarks against iptables, ipset and nft (`bench`), and every command of \
                  felix-nft itself, which the lab's tests and benchmarks run as the agent."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a scratch topology, apply an example state and show which flows pass.
    Demo {
        /// Leave the topology in place for inspection.
        #[arg(long)]
        keep: bool,
        /// A three-node cluster, one agent per node, and a fourth node joining and leaving,
        /// instead of the single node.
        #[arg(long)]
        cluster: bool,
        /// How the cluster's nodes carry pod traffic: VXLAN, IPIP, or WireGuard (pool without
        /// encapsulation, encrypted between nodes). IPIP and WireGuard need their kernel module.
        #[arg(long, value_enum, default_value = "vxlan", requires = "cluster")]
        encap: crate::demo::cluster::Encap,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    #[command(flatten)]
    Agent(felix_nft::cli::Command),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Program the same workload with each backend and compare.
    Compare {
        /// small, mid, large, W,P,R,S,M,K; or `cluster` (a node learning 1,000 remote VXLAN
        /// nodes, against `ip -batch` + `bridge -batch`) and `cluster:N`; `cluster-ipip[:N]`
        /// (against `ip -batch`) and `cluster-wireguard[:N]` (against `ip -batch` + `wg set`),
        /// which need their kernel module.
        #[arg(long, default_value = "small")]
        scale: String,
        /// Full syncs (fresh namespaces) per backend (default by scale: 5 / 3 / 1; cluster 5).
        #[arg(long)]
        reps: Option<usize>,
        /// Rounds of the incremental operations per repetition (default by scale: 3 / 3 / 2;
        /// cluster 5).
        #[arg(long)]
        inc: Option<usize>,
        /// Directory for the inputs, the JSON and the SVG chart.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// Only these backends (comma-separated: felix-nft, felix-nft-proc, ipt-nft, ipt-legacy,
        /// nft-f; cluster: felix-nft, ip-batch).
        #[arg(long, value_delimiter = ',')]
        only: Option<Vec<String>>,
        /// First probe real traffic through a tiny test bed under each backend, and fail unless
        /// they agree (the spot-check).
        #[arg(long)]
        spot_check: bool,
        /// The felix-nft binary the fresh-process backend runs (default: this one).
        #[arg(long, value_name = "PATH")]
        felix_exe: Option<PathBuf>,
        /// IPv6 on as well, as Felix's default: felix-nft with IPv6 support against the same
        /// ruleset restored by iptables and ip6tables (IPv6 sets empty); writes
        /// `bench-<scale>-dual.*`.
        #[arg(long)]
        dual_stack: bool,
    },
    /// What flow logs cost a node: the agent on a test bed node at a scale's policy load, new
    /// TCP connections per second and IP set member applies with flow logs off and on (agent
    /// lives alternating), and a flood of denied UDP packets (the agent's CPU, peak RSS and
    /// what the flows counted).
    Flowlogs {
        /// The policy load besides the measured pair: small, mid, large or W,P,R,S,M,K.
        #[arg(long, default_value = "mid")]
        scale: String,
        /// Seconds of each measured window (the connections, then the flood).
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Agent lives per mode, alternating off and on.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Client threads opening connections.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// The flood's target rate, packets per second (0: as fast as the sender can).
        #[arg(long, default_value_t = 100_000)]
        flood_pps: u64,
        /// Directory for the JSON, the agents' logs and the state document.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// The felix-nft binary run as the agent (default: this one).
        #[arg(long, value_name = "PATH")]
        felix_exe: Option<PathBuf>,
    },
}

/// Entry point used by `main.rs`.
pub fn main() -> ExitCode {
    match Cli::parse().command {
        Some(Command::Demo {
            keep,
            cluster,
            encap,
        }) => demo(keep, cluster, encap),
        Some(Command::Bench {
            command: command @ BenchCommand::Flowlogs { .. },
        }) => bench_flowlogs(command),
        Some(Command::Bench { command }) => bench_compare(command),
        Some(Command::Agent(command)) => felix_nft::cli::dispatch(Some(command)),
        None => felix_nft::cli::dispatch(None),
    }
}

/// `felix-nft demo [--cluster [--encap E]]`: exit 0 when every flow did what the policy says
/// (and, for the cluster, every node held what it should), 1 otherwise or on error (a kernel
/// without the encapsulation's module included).
fn demo(keep: bool, cluster: bool, encap: crate::demo::cluster::Encap) -> ExitCode {
    let opts = crate::demo::DemoOptions { keep, encap };
    let out = &mut std::io::stdout();
    let result = if cluster {
        crate::demo::cluster::run(&opts, out).map(|o| o.all_match())
    } else {
        crate::demo::run(&opts, out).map(|o| o.all_match())
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(felix_nft::daemon::EXIT_FAILURE),
        Err(e) => {
            eprintln!("felix-nft: {}", felix_nft::ops::logging::chain(&e));
            ExitCode::from(felix_nft::daemon::EXIT_FAILURE)
        }
    }
}

/// A cluster scale's run: refuses the flags that do not apply to it, runs it, prints its table
/// and fails when the kernel did not hold what the cluster asked for.
fn cluster_scale<O>(
    parsed: Result<O, String>,
    other_flags: bool,
    run: impl FnOnce(O) -> Result<(String, bool, std::path::PathBuf), crate::bench::BenchError>,
) -> ExitCode {
    let opts = match parsed {
        Ok(o) => o,
        Err(e) => {
            eprintln!("felix-nft: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if other_flags {
        eprintln!(
            "felix-nft: --spot-check, --felix-exe and --dual-stack do not apply to the cluster scales"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    match run(opts) {
        Ok((table, checks_ok, dir)) => {
            println!("{table}");
            println!("(JSON in {})", dir.display());
            if checks_ok {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "felix-nft: the kernel does not hold what the cluster asked for (see checks)"
                );
                ExitCode::FAILURE
            }
        }
        Err(e) => bench_failed(&e),
    }
}

/// `felix-nft bench compare`.
fn bench_compare(command: BenchCommand) -> ExitCode {
    use crate::bench;
    let BenchCommand::Compare {
        scale,
        reps,
        inc,
        out,
        only,
        spot_check,
        felix_exe,
        dual_stack,
    } = command
    else {
        unreachable!("`bench flowlogs` is dispatched before `bench compare`");
    };
    // The cluster scales: their own options, a table and the kernel's checks.
    let cluster_only = spot_check || felix_exe.is_some() || dual_stack;
    if let Some(t) = bench::tunnels::TunnelOptions::parse(&scale, out.clone()) {
        return cluster_scale(t, cluster_only, |mut o| {
            (o.reps, o.inc, o.only) = (reps.unwrap_or(o.reps).max(1), inc.unwrap_or(o.inc), only);
            let r = bench::tunnels::compare(&o)?;
            Ok((r.table(), r.checks_ok, o.out_dir))
        });
    }
    if let Some(c) = bench::cluster::ClusterOptions::parse(&scale, out.clone()) {
        return cluster_scale(c, cluster_only, |mut o| {
            (o.reps, o.inc, o.only) = (reps.unwrap_or(o.reps).max(1), inc.unwrap_or(o.inc), only);
            let r = bench::cluster::compare(&o)?;
            Ok((r.table(), r.checks_ok, o.out_dir))
        });
    }
    let scale = match scale.parse::<bench::workload::Scale>() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("felix-nft: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut opts = bench::Options::for_scale(scale, out);
    opts.reps = reps.unwrap_or(opts.reps).max(1);
    opts.inc = inc.unwrap_or(opts.inc);
    opts.only = only;
    opts.felix_exe = felix_exe;
    opts.spot_check = spot_check;
    opts.dual_stack = dual_stack;
    match bench::compare(&opts) {
        Ok(r) => {
            println!("{}", r.table());
            println!("(JSON and SVG in {})", opts.out_dir.display());
            if r.spot_ok == Some(false) {
                eprintln!("felix-nft: the traffic spot-check failed (see its table)");
                ExitCode::FAILURE
            } else if r.checks_ok {
                ExitCode::SUCCESS
            } else {
                eprintln!("felix-nft: the backends do not hold the same policy (see checks)");
                ExitCode::FAILURE
            }
        }
        Err(e) => bench_failed(&e),
    }
}

/// `felix-nft bench flowlogs`.
fn bench_flowlogs(command: BenchCommand) -> ExitCode {
    use crate::bench::flowlogs::{run, FlowlogsOptions};
    let BenchCommand::Flowlogs {
        scale,
        seconds,
        reps,
        threads,
        flood_pps,
        out,
        felix_exe,
    } = command
    else {
        unreachable!("only `bench flowlogs` comes here");
    };
    let mut opts = FlowlogsOptions::new(out);
    opts.scale = match scale.parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("felix-nft: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    (opts.seconds, opts.reps, opts.threads) = (seconds.max(1), reps.max(1), threads.max(1));
    opts.flood_pps = flood_pps;
    opts.felix_exe = felix_exe;
    match run(&opts) {
        Ok(r) => {
            println!("{}", r.table());
            println!("(JSON and the agents' logs in {})", opts.out_dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "felix-nft: bench flowlogs: {}",
                felix_nft::ops::logging::chain(&e)
            );
            ExitCode::FAILURE
        }
    }
}

/// `bench compare` could not run: the error with its causes.
fn bench_failed(e: &crate::bench::BenchError) -> ExitCode {
    eprintln!(
        "felix-nft: bench compare: {}",
        felix_nft::ops::logging::chain(e)
    );
    ExitCode::FAILURE
}
