//! The `felix-nft` subcommands (DESIGN.md §6). Parsing and dispatch only: every command calls into
//! the library. Commands whose capability has not landed yet say so and exit non-zero.

use std::path::PathBuf;
use std::process::ExitCode;

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
        #[command(flatten)]
        netns: NetnsArg,
    },
    /// Print what `apply` would change; touches nothing.
    Plan {
        state: PathBuf,
        #[command(flatten)]
        netns: NetnsArg,
    },
    /// Show what is programmed, read back from the kernel.
    Dump {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        netns: NetnsArg,
    },
    /// Remove everything felix-nft owns (tables of both families, our routes and neighbours).
    Cleanup {
        #[command(flatten)]
        netns: NetnsArg,
    },
    /// Build a scratch topology, apply an example state and show which flows pass.
    Demo {
        /// Leave the topology in place for inspection.
        #[arg(long)]
        keep: bool,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print the version.
    Version,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Configuration file (default: $FELIX_CONFIGFILE, else /etc/calico/felix.cfg).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where updates come from: `felix` (fds 3/4), `stdin` (JSON lines) or `unix:PATH`.
    #[arg(long, default_value = "felix")]
    pub source: String,
    /// Log every decoded input message at info level.
    #[arg(long)]
    pub trace_input: bool,
    #[command(flatten)]
    pub netns: NetnsArg,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Program the same workload with each backend and compare.
    Compare {
        /// small, mid, large, or W,P,R,S,M,K.
        #[arg(long, default_value = "small")]
        scale: String,
    },
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

/// Entry point used by `main.rs`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None => not_yet("running as Felix's external driver (fds 3/4)", 6),
        Some(Command::Version) => {
            println!("felix-nft {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some(Command::Run(_)) => not_yet("run", 6),
        Some(Command::Apply { .. }) => not_yet("apply", 6),
        Some(Command::Plan { .. }) => not_yet("plan", 6),
        Some(Command::Dump { .. }) => not_yet("dump", 6),
        Some(Command::Cleanup { .. }) => not_yet("cleanup", 6),
        Some(Command::Demo { .. }) => not_yet("demo", 7),
        Some(Command::Bench { .. }) => not_yet("bench compare", 8),
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

fn not_yet(what: &str, issue: u32) -> ExitCode {
    eprintln!(
        "felix-nft: `{what}` is not built yet (it lands with issue {issue}); nothing was done"
    );
    ExitCode::from(EXIT_NOT_IMPLEMENTED)
}
