//! The `felix-nft` subcommands. Parsing and dispatch only: every command calls into
//! the library. Commands whose capability has not landed yet say so and exit non-zero.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::daemon::DaemonOptions;
use crate::dataplane::oneshot;
use crate::source::{self, SourceSpec};
use clap::{Args, Parser, Subcommand};

/// Exit code for a command whose capability is not built yet.
pub const EXIT_NOT_IMPLEMENTED: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "felix-nft",
    version,
    about = "Calico Felix's Linux dataplane on native nftables over raw netlink",
    long_about = "Calico Felix's Linux dataplane on native nftables over raw netlink.\n\n\
                  With no arguments and file descriptors 3 and 4 open, runs as Felix's external \
                  dataplane driver."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Options shared by every command that acts on the kernel.
#[derive(Debug, Clone, Args)]
pub struct NetnsArg {
    /// Act in this network namespace: a name under /run/netns, or a path (/proc/PID/ns/net).
    #[arg(long, value_name = "NAME|PATH")]
    pub netns: Option<String>,
}

/// Where a one-shot command acts: the configuration it reads and the network namespace.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Configuration file (default: $FELIX_CONFIGFILE, else /etc/calico/felix.cfg).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub netns: NetnsArg,
}

impl From<TargetArgs> for oneshot::Target {
    fn from(args: TargetArgs) -> oneshot::Target {
        oneshot::Target {
            netns: args.netns.netns,
            config: args.config,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent (the daemon).
    Run(RunArgs),
    /// Converge the kernel to a state document, then exit.
    Apply {
        /// The state document (JSON array of ToDataplane messages, or one per line).
        state: PathBuf,
        /// Send the transaction without committing it: the kernel validates and keeps nothing.
        #[arg(long)]
        dry_run: bool,
        /// Apply a document that describes nothing (removing all policy from the node), or one
        /// message per line without a closing in_sync; refused otherwise.
        #[arg(long)]
        allow_empty: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Print what `apply` would change; touches nothing.
    Plan {
        state: PathBuf,
        /// As for `apply`.
        #[arg(long)]
        allow_empty: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Show what is programmed, read back from the kernel.
    Dump {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Remove everything felix-nft owns (tables of both families, our routes and neighbours).
    Cleanup {
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Show recent flows from the running agent, one line each, like `hubble observe` (root
    /// only; needs FlowLogsLocalReporter=Enabled or FlowLogsGoldmaneServer set).
    Flows(FlowsArgs),
    /// Configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print the version.
    Version,
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff; `felix-nft man | man -l -`): felix-nft's, or a subcommand's
    /// (`felix-nft man run` is felix-nft-run(1)).
    Man {
        /// The subcommand whose page to print.
        command: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Configuration file (default: $FELIX_CONFIGFILE, else /etc/calico/felix.cfg).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where updates come from: `felix` (fds 3/4), `stdin` (JSON lines) or `unix:PATH` (JSON
    /// lines from any number of clients, served concurrently; each client's lines in order).
    #[arg(long, default_value = "felix")]
    pub source: String,
    /// Log every decoded input message at info level (sequence number and payload kind).
    #[arg(long, env = "FELIX_NFT_TRACE_INPUT", value_parser = clap::builder::BoolishValueParser::new())]
    pub trace_input: bool,
    /// Keep running after standard input ends (by default the agent applies what it was told
    /// and exits). Felix's pipes always end the run; a unix socket never does.
    #[arg(long)]
    pub keep_running: bool,
    #[command(flatten)]
    pub netns: NetnsArg,
}

#[derive(Debug, Args)]
pub struct FlowsArgs {
    /// The agent's flow socket.
    #[arg(long, value_name = "PATH", default_value = crate::flows::serve::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// After the recent flows, print new ones as the agent flushes them, until interrupted.
    #[arg(short, long)]
    pub follow: bool,
    /// Print each flow as the agent's JSON record, one per line (as `-o json`).
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
    /// Output format.
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub output: Option<FlowsOutput>,
    /// Flows from or to this pod: NAME or NAMESPACE/NAME.
    #[arg(long, value_name = "[NAMESPACE/]NAME")]
    pub pod: Option<String>,
    /// Flows from or to a pod of this namespace.
    #[arg(short, long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Flows any hit of whose policy trace is this policy or profile: NAME, TIER.NAME,
    /// NAMESPACE/NAME or NAMESPACE/TIER.NAME.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Flows with this final verdict.
    #[arg(long, value_name = "allowed|denied")]
    pub verdict: Option<crate::flows::query::FinalVerdict>,
    /// Flows of this IP protocol (icmp is either family's).
    #[arg(long, value_name = "tcp|udp|sctp|icmp|icmpv6|N")]
    pub protocol: Option<crate::flows::query::Protocol>,
    /// Flows to this destination port.
    #[arg(long, value_name = "N")]
    pub port: Option<u16>,
    /// Flows reported by this side: src (the source's egress policy) or dst (the
    /// destination's ingress policy).
    #[arg(long, value_name = "src|dst", value_parser = crate::flows::show::parse_reporter)]
    pub reporter: Option<crate::flows::Reporter>,
    /// Only flows of the last DURATION (30s, 5m, 1h, 2d, 1h30m).
    #[arg(long, value_name = "DURATION", value_parser = crate::flows::show::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// Show each flow's whole policy trace.
    #[arg(short, long)]
    pub verbose: bool,
}

/// How `felix-nft flows` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlowsOutput {
    /// One line per flow.
    Text,
    /// One JSON record per line.
    Json,
}

impl FlowsArgs {
    /// The command's options; `--pod NS/NAME` with a different `--namespace` is refused.
    fn into_options(self) -> Result<crate::flows::show::FlowsOptions, String> {
        use crate::flows::query::Filter;
        let (namespace, pod) = match self.pod.as_deref().and_then(|p| p.split_once('/')) {
            Some((ns, _)) if self.namespace.as_deref().is_some_and(|n| n != ns) => {
                return Err(format!(
                    "--pod {} names another namespace than --namespace",
                    felix_api::clip::Clipped(self.pod.as_deref().unwrap_or_default())
                ))
            }
            Some((ns, name)) => (Some(ns.to_string()), Some(name.to_string())),
            None => (self.namespace, self.pod),
        };
        Ok(crate::flows::show::FlowsOptions {
            socket: self.socket,
            follow: self.follow,
            since: self.since,
            filter: Filter {
                pod,
                namespace,
                policy: self.policy,
                verdict: self.verdict,
                protocol: self.protocol,
                port: self.port,
                reporter: self.reporter,
            },
            json: self.json || self.output == Some(FlowsOutput::Json),
            verbose: self.verbose,
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print every parameter's value and where it came from.
    Show {
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Print the JSON Schema of the configuration.
    Schema,
}

/// The running kernel and what felix-nft decides about it (`nft::features`); the owner +
/// persist probe is a dry run, so nothing is written.
fn print_kernel_features() {
    use nf_tables::features::KernelRelease;
    let release = match KernelRelease::current() {
        Ok(r) => r,
        Err(e) => return println!("kernel: {e}"),
    };
    let supported = crate::dataplane::features::check_supported(&release);
    match nf_tables::reconcile::Nft::open().and_then(|mut n| n.features_dry_run()) {
        Ok(f) => print!("{f}"),
        Err(e) => println!("kernel {release}: features not probed ({e})"),
    }
    if let Err(e) = supported {
        println!("unsupported: {e}");
    }
}

/// Entry point used by `main.rs`.
pub fn main() -> ExitCode {
    dispatch(Cli::parse().command)
}

/// Runs a parsed command line: the binary's, or another binary's that embeds these commands
/// (the lab's).
pub fn dispatch(command: Option<Command>) -> ExitCode {
    match command {
        None => run_external_driver(),
        Some(Command::Version) => {
            println!("felix-nft {}", env!("CARGO_PKG_VERSION"));
            print_kernel_features();
            ExitCode::SUCCESS
        }
        Some(Command::Completions { shell }) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "felix-nft", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Some(Command::Man { command }) => {
            let top = <Cli as clap::CommandFactory>::command();
            let page = match &command {
                None => top,
                Some(name) => match top.find_subcommand(name) {
                    Some(sub) => sub.clone().name(format!("felix-nft-{name}")),
                    None => {
                        eprintln!("felix-nft: no subcommand `{name}`");
                        return ExitCode::from(EXIT_USAGE);
                    }
                },
            };
            match clap_mangen::Man::new(page).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("felix-nft: writing the manual page: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(Command::Run(args)) => run(&args),
        Some(Command::Apply {
            state,
            dry_run,
            allow_empty,
            target,
        }) => finish(oneshot::apply_command(
            &state,
            dry_run,
            allow_empty,
            &target.into(),
        )),
        Some(Command::Plan {
            state,
            allow_empty,
            target,
        }) => finish(oneshot::plan_command(&state, allow_empty, &target.into())),
        Some(Command::Dump { json, target }) => finish(oneshot::dump_command(json, &target.into())),
        Some(Command::Cleanup { target }) => finish(oneshot::cleanup_command(&target.into())),
        Some(Command::Flows(args)) => match args.into_options() {
            Ok(opts) => ExitCode::from(crate::flows::show::flows_command(
                &opts,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr(),
            )),
            Err(e) => {
                eprintln!("felix-nft: {e}");
                ExitCode::from(EXIT_USAGE)
            }
        },
        Some(Command::Config { command }) => ExitCode::from(match command {
            ConfigCommand::Show { json, config } => crate::config::show::show_command(
                config.as_deref(),
                json,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            ),
            ConfigCommand::Schema => crate::config::show::schema_command(&mut std::io::stdout()),
        }),
    }
}

/// Exit code for a command line that cannot be acted on (bad `--source`, no fds 3/4).
pub const EXIT_USAGE: u8 = 2;

/// No subcommand: Felix started us as its external dataplane driver (§1.1), with no
/// arguments and fds 3 (in) and 4 (out). `FELIX_NFT_TRACE_INPUT=1` logs each message at info.
fn run_external_driver() -> ExitCode {
    use crate::source::felix::{fd_is_open, FD_IN, FD_OUT};
    if !(fd_is_open(FD_IN) && fd_is_open(FD_OUT)) {
        eprintln!(
            "felix-nft: no command given, and file descriptors 3 and 4 are not both open, so this \
             is not Felix starting its dataplane driver; see `felix-nft --help`"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let opts = DaemonOptions {
        config_file: None,
        source: SourceSpec::Felix,
        trace_input: env_flag("FELIX_NFT_TRACE_INPUT"),
        netns: None,
        keep_running: false,
    };
    start_daemon(opts)
}

fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        .unwrap_or(false)
}

/// `felix-nft run`.
fn run(args: &RunArgs) -> ExitCode {
    match args.source.parse::<SourceSpec>() {
        Ok(source) => start_daemon(DaemonOptions {
            config_file: args.config.clone(),
            source,
            trace_input: args.trace_input,
            netns: args.netns.netns.clone(),
            keep_running: args.keep_running,
        }),
        Err(e) => {
            eprintln!("felix-nft: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn start_daemon(opts: DaemonOptions) -> ExitCode {
    // Felix's fds first, before the runtime or anything else opens a file: once 3 and 4 are
    // free, the next descriptors opened (tokio's epoll, say) would get those numbers.
    let felix_fds = match opts.source {
        SourceSpec::Felix => match source::felix::take_felix_fds() {
            Ok(fds) => Some(fds),
            Err(e) => {
                eprintln!("felix-nft: {}", crate::ops::logging::chain(&e));
                return ExitCode::from(EXIT_USAGE);
            }
        },
        _ => None,
    };
    ExitCode::from(crate::daemon::run(opts, felix_fds))
}

/// Prints a one-shot command's report (stdout) or error chain (stderr) and ends the process
/// with its exit code. `_exit`, not a return from `main`: these commands leave their tables and
/// models allocated (`std::mem::forget`), and the allocator's at-exit collection would walk
/// every page of them — about 3 % of a fresh mid-scale `apply`'s user CPU. Nothing else runs at
/// exit that matters: stdout and stderr are flushed here, and whatever else the command held
/// was dropped before this (the runtime) or is the kernel's to release at exit.
fn finish(r: oneshot::CommandResult) -> ! {
    use std::io::Write;
    let code = match r {
        Ok((text, code)) => {
            // A closed pipe (`| head`) is not a failure of the command.
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
            code
        }
        Err(e) => {
            eprintln!("felix-nft: {}", crate::ops::logging::chain(&e));
            e.exit_code()
        }
    };
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process; it touches no Rust state, and the buffered output was
    // flushed above.
    unsafe { libc::_exit(i32::from(code)) }
}
