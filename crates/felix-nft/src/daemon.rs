//! The running agent: wires a transport, the interface monitor, the dataplane loop and the
//! operations surface together. `felix-nft run` and Felix's external-driver mode
//! both end up here.
//!
//! Start-up order: configuration (bad die-on-fail values stop the start, exit 2) → logging →
//! the target namespace → sockets (nf_tables, rtnetlink, monitor) → transports →
//! the loop. Nothing is written to the kernel before the datastore's `InSync` and the monitor's
//! first sync. SIGTERM/SIGINT stop the loop and leave every rule, route and neighbour in place.

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::{self, Config};
use crate::dataplane::driver::{Driver, DriverError, LoopOptions};
use crate::dataplane::kernel::RealKernel;
use crate::dataplane::{Dataplane, DataplaneConfig};
use crate::ops::logging::chain;
use crate::ops::Ops;
use crate::source::{self, Received, SourceSpec};
use nf_tables::features::KernelRelease;
use rtnl::monitor::{self, MonitorConfig};
use rtnl::netns::NetNs;

/// Exit code when the tables could not be programmed (fail closed) or start-up failed.
pub const EXIT_FAILURE: u8 = 1;

/// Why the agent stopped with a failure; [`AgentError::exit_code`] is the process's.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Something the agent needs could not be set up (`what` says which).
    #[error("{what}")]
    Setup {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The configuration does not render (a bad die-on-fail value, exit 2).
    #[error("invalid configuration")]
    BadConfig(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The kernel is too old, or its release cannot be read.
    #[error("{0}")]
    Kernel(String),
    #[error("Felix's file descriptors 3 and 4 are not open")]
    NoFelixFds,
    /// The input ended on an error (a truncated frame, a broken pipe).
    #[error("input failed: {0}")]
    Input(String),
    #[error("giving up")]
    GaveUp(#[source] DriverError),
    #[error("stopped on error")]
    Driver(#[source] DriverError),
}

impl AgentError {
    fn setup<E>(what: &'static str) -> impl FnOnce(E) -> AgentError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        move |e| AgentError::Setup {
            what,
            source: Box::new(e),
        }
    }

    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::BadConfig(_) => config::EXIT_BAD_CONFIG,
            _ => EXIT_FAILURE,
        }
    }
}

/// How the daemon was asked to run.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub config_file: Option<PathBuf>,
    pub source: SourceSpec,
    /// Log every decoded input message at info.
    pub trace_input: bool,
    /// `--netns`: act in this namespace.
    pub netns: Option<String>,
    /// Keep running after the input ends (JSON on stdin). Felix's pipes always end the run.
    pub keep_running: bool,
}

/// Runs the agent to completion; returns the process exit code. `felix_fds` are Felix's fds 3
/// and 4, taken before anything else could open a file under those numbers.
pub fn run(opts: DaemonOptions, felix_fds: Option<(File, File)>) -> u8 {
    let resolved = match config::load_for_cli(opts.config_file.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("felix-nft: {e}");
            return match e {
                config::ConfigError::Invalid { .. } => config::EXIT_BAD_CONFIG,
                _ => EXIT_FAILURE,
            };
        }
    };
    if let Err(e) = crate::ops::init_logging(&resolved.config) {
        eprintln!("felix-nft: setting up logging: {e}");
    }
    resolved.log_warnings();
    let ns = match opts.netns.as_deref().map(NetNs::open).transpose() {
        Ok(ns) => ns,
        Err(e) => {
            tracing::error!(error = %chain(&e), "opening the target network namespace");
            return EXIT_FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "starting the async runtime");
            return EXIT_FAILURE;
        }
    };
    // The loop runs as a task on a worker, not on this thread: the reader task that decodes an
    // update then wakes it on its own worker (tokio's LIFO slot) instead of waking a parked
    // thread on another CPU (from reading a member update to the loop taking it went
    // from 155 to 65 µs at mid).
    let code = runtime.block_on(async move {
        match tokio::spawn(run_async(opts, resolved.config, ns, felix_fds)).await {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                tracing::error!(error = %chain(&e), "felix-nft stopped");
                e.exit_code()
            }
            Err(e) => {
                tracing::error!(error = %e, "the agent's task failed");
                EXIT_FAILURE
            }
        }
    });
    // Readers blocked on stdin or a pipe hold blocking threads: do not wait for them.
    runtime.shutdown_timeout(Duration::from_millis(200));
    code
}

/// Decides what the kernel offers (see [`nf_tables::features`]), logs and exports each
/// decision, and follows it: the side table is off where every commit validates every table.
fn follow_features(
    kernel: &mut RealKernel,
    dpcfg: &mut DataplaneConfig,
    config: &Config,
    ops: &Ops,
) -> Result<(), AgentError> {
    let side_table = dpcfg.rules.side_table_size;
    let (f, ignored) = kernel
        .decide_features(config.feature_detect_override.as_deref(), &mut dpcfg.rules)
        .map_err(AgentError::setup("probing the kernel's nf_tables features"))?;
    if !ignored.is_empty() {
        tracing::info!(names = ?ignored, "FeatureDetectOverride: Felix's iptables features, not used by felix-nft");
    }
    for (name, d, what) in f.list() {
        tracing::info!(kernel = %f.release, feature = name, on = d.on, decided_by = d.source.as_str(), "{what}");
        ops.metrics
            .set_kernel_feature(name, &f.release.text, d.source.as_str(), d.on);
    }
    if side_table > 0 && dpcfg.rules.side_table_size == 0 {
        tracing::info!(
            kernel = %f.release,
            "this kernel validates every table at every commit: no side table (NftablesSideTableSize ignored)"
        );
    }
    if !f.owner_persist_tables.on
        && dpcfg.ownership == nf_tables::reconcile::TableOwnership::OwnerPersist
    {
        tracing::info!(
            kernel = %f.release,
            "no owned tables on this kernel (6.9+): another program's change to our tables is repaired from its event"
        );
    }
    Ok(())
}

async fn run_async(
    opts: DaemonOptions,
    config: Config,
    ns: Option<NetNs>,
    felix_fds: Option<(File, File)>,
) -> Result<(), AgentError> {
    let release = KernelRelease::current().map_err(AgentError::Kernel)?;
    crate::dataplane::features::check_supported(&release).map_err(AgentError::Kernel)?;
    let mut dpcfg = DataplaneConfig::from_config(&config);
    let ops = Ops::new(&config).map_err(AgentError::setup("setting up health and metrics"))?;
    let mut kernel = RealKernel::open(ns.as_ref(), &dpcfg)
        .map_err(AgentError::setup("opening netlink sockets"))?;
    follow_features(&mut kernel, &mut dpcfg, &config, &ops)?;
    let rp_filter = kernel.procsys().default_rp_filter();
    let dp =
        Dataplane::new(dpcfg.clone(), rp_filter).map_err(|e| AgentError::BadConfig(Box::new(e)))?;

    // The monitor runs as long as its handle lives: to the end of the run.
    let (iface_rx, _monitor) = start_monitor(ns.as_ref(), &dpcfg)?;
    tracing::info!(version = env!("CARGO_PKG_VERSION"), source = ?opts.source, netns = ?opts.netns, "felix-nft starting");
    let t = Transport::start(&opts, felix_fds, config.input_max_message_bytes)?;

    // Health and metrics endpoints, until shutdown.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let collector = dpcfg
        .rules
        .flow_logs
        .then(|| {
            let (metrics, node) = (ops.metrics.clone(), dpcfg.overlay.hostname.as_str());
            start_flow_logs(ns.as_ref(), &config, stop_rx.clone(), metrics, node)
        })
        .flatten();
    let server = serve_ops(ops.clone(), config.clone(), stop_rx);
    let (status_out, writer) = (t.status_out, t.writer);
    let mut driver = Driver::new(
        dp,
        kernel,
        LoopOptions {
            exit_on_eof: t.exit_on_eof,
            trace_input: opts.trace_input,
            ..LoopOptions::default()
        },
        status_out,
        Some(ops),
    );
    if let Some(c) = &collector {
        let c = c.clone();
        driver = driver.with_flow_names(Box::new(move |names| c.set_names(names)));
    }
    let shutdown = shutdown_signal();
    let result = driver.run(t.updates, iface_rx, shutdown).await;
    let s = driver.summary().clone();
    tracing::info!(
        decoded = s.decoded,
        rejected = s.rejected,
        applies = s.applies,
        failures = s.failures,
        drift_repairs = s.drift_repairs,
        "stopped"
    );
    // A transport that ended on an error (a truncated frame, a broken pipe) fails the run.
    // Only when the input really ended: after a signal the reader may still be blocked on fd 3.
    let input_error = if driver.input_ended() {
        t.reader.error().await
    } else {
        None
    };
    drop(driver); // closes the status channel, so the fd 4 writer finishes
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    if let Some(w) = writer {
        let _ = tokio::task::spawn_blocking(move || w.join()).await;
    }
    match result {
        Ok(()) => input_error.map_or(Ok(()), |e| Err(AgentError::Input(e))),
        Err(e @ DriverError::GaveUp { .. }) => Err(AgentError::GaveUp(e)),
        Err(e) => Err(AgentError::Driver(e)),
    }
}

/// Flow logs, when on: the local view's socket and the collector reading NFLOG and conntrack
/// events into it. Either failing (another program holds NFLOG group 1 or 2, the socket's
/// directory cannot be made) leaves the agent running without flow logs, said at warn: the
/// dataplane does not depend on them. The collector records into `metrics`, labelled with the
/// node's name (Calico's `instance`).
fn start_flow_logs(
    ns: Option<&NetNs>,
    config: &Config,
    stop: tokio::sync::watch::Receiver<bool>,
    metrics: crate::ops::Metrics,
    instance: &str,
) -> Option<std::sync::Arc<crate::collector::Collector>> {
    use crate::flows::serve::{FlowServer, FlowServerConfig};
    let serve = FlowServerConfig {
        path: config.flow_logs_local_socket.clone().into(),
        ..FlowServerConfig::default()
    };
    let mut stop = stop;
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let sink = match FlowServer::start(&serve, shutdown) {
        Ok((sink, _task)) => sink,
        Err(e) => {
            tracing::warn!(error = %chain(&e), "flow logs: the local view cannot be served; flow logs are off");
            return None;
        }
    };
    // The exporter's task runs to the end of the process; it holds nothing the dataplane needs.
    let goldmane =
        crate::goldmane::export::GoldmaneConfig::from_config(config, instance).map(|g| {
            let address = g.address.clone();
            let (sink, _task) = crate::goldmane::export::GoldmaneExporter::start(g);
            tracing::info!(goldmane = %address, "flow logs: streaming flows to Goldmane");
            sink
        });
    let cfg = crate::collector::CollectorConfig {
        flush_interval: config.flow_logs_flush_interval,
        goldmane,
        metrics: Some(metrics),
        instance: instance.to_string(),
        ..Default::default()
    };
    match crate::collector::Collector::start(ns, cfg, sink) {
        Ok(c) => {
            tracing::info!(
                socket = %serve.path.display(),
                flush_secs = config.flow_logs_flush_interval.as_secs_f64(),
                "flow logs: reading NFLOG groups 1 and 2 and conntrack events; `felix-nft flows` shows them"
            );
            Some(std::sync::Arc::new(c))
        }
        Err(e) => {
            tracing::warn!(error = %chain(&e), "flow logs: the readers cannot start; the rules still log, but no flows are made");
            None
        }
    }
}

/// The interface monitor, forwarded into a small bounded channel the loop selects on. Without
/// it Felix exits rather than run blind (§16).
fn start_monitor(
    ns: Option<&NetNs>,
    dpcfg: &DataplaneConfig,
) -> Result<(mpsc::Receiver<monitor::IfaceEvent>, monitor::MonitorHandle), AgentError> {
    let (mut mon_rx, handle) = monitor::start(
        ns,
        MonitorConfig {
            exclude: dpcfg.iface_exclude.clone(),
            resync_interval: dpcfg.iface_refresh,
            ..MonitorConfig::default()
        },
    )
    .map_err(AgentError::setup("starting the interface monitor"))?;
    let (iface_tx, iface_rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some(ev) = mon_rx.recv().await {
            if iface_tx.send(ev).await.is_err() {
                break;
            }
        }
    });
    Ok((iface_rx, handle))
}

/// The input the loop reads, and what is left of it to wait for when the run ends.
struct Transport {
    updates: mpsc::Receiver<Received>,
    /// The loop ends when the input does.
    exit_on_eof: bool,
    /// Where the loop reports (Felix's fd 4; standard output or the socket's clients in the
    /// stream modes), and the thread writing it, if one does.
    status_out: Option<source::outbox::Outbox>,
    writer: Option<std::thread::JoinHandle<Result<u64, source::SourceError>>>,
    reader: InputReader,
}

/// The reader whose end says whether the input ended cleanly.
enum InputReader {
    Fd3(source::Reader<source::felix::ReadSummary>),
    Stream(source::Reader<source::stream::LineSummary>),
    /// The unix socket's server, which does not end with a client.
    None,
}

impl InputReader {
    /// How the reader ended, when on an error. Call it once the input has ended.
    async fn error(self) -> Option<String> {
        match self {
            InputReader::Fd3(r) => r.finish().await.err().map(|e| chain(&e)),
            InputReader::Stream(r) => r.finish().await.err().map(|e| chain(&e)),
            InputReader::None => None,
        }
    }
}

impl Transport {
    fn start(
        opts: &DaemonOptions,
        felix_fds: Option<(File, File)>,
        max_message: u32,
    ) -> Result<Transport, AgentError> {
        let t = match &opts.source {
            SourceSpec::Felix => {
                let (input, output) = felix_fds.ok_or(AgentError::NoFelixFds)?;
                let (updates, reader) = source::felix::spawn_fd3(input, u64::from(max_message))
                    .map_err(AgentError::setup("reading fd 3"))?;
                let (out, writer) = source::felix::spawn_writer(output)
                    .map_err(AgentError::setup("writing fd 4"))?;
                Transport {
                    updates,
                    // Felix gone = our job is done (§1.1).
                    exit_on_eof: true,
                    status_out: Some(out),
                    writer: Some(writer),
                    reader: InputReader::Fd3(reader),
                }
            }
            SourceSpec::Stdin => {
                let (updates, reader) = source::stream::spawn_stdin(max_message as usize)
                    .map_err(AgentError::setup("reading standard input"))?;
                let (out, writer) = source::stream::spawn_json_writer(std::io::stdout())
                    .map_err(AgentError::setup("writing standard output"))?;
                Transport {
                    updates,
                    exit_on_eof: !opts.keep_running,
                    status_out: Some(out),
                    writer: Some(writer),
                    reader: InputReader::Stream(reader),
                }
            }
            SourceSpec::Unix(path) => {
                let l = source::stream::UnixSource::bind(path)
                    .map_err(AgentError::setup("binding the unix socket"))?;
                tracing::info!(path = %path.display(), "listening for JSON lines");
                let (l, out) = l.with_max_len(max_message as usize).with_replies();
                let (updates, _server) = l.spawn();
                Transport {
                    updates,
                    exit_on_eof: false,
                    status_out: Some(out),
                    writer: None,
                    reader: InputReader::None,
                }
            }
        };
        Ok(t)
    }
}

/// The health and metrics endpoints, served until `stop` turns true.
fn serve_ops(
    ops: Ops,
    config: Config,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = ops.run(&config, stopped).await {
            tracing::error!(error = %chain(&e), "health/metrics server");
        }
    })
}

/// Watches for SIGTERM and SIGINT from now on; the future resolves at the first (never, when
/// signals cannot be watched).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    let termination = crate::ops::Termination::install();
    async move {
        match termination {
            Ok(mut t) => {
                let sig = t.recv().await;
                tracing::info!(signal = ?sig, "signal received");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for signals");
                std::future::pending::<()>().await;
            }
        }
    }
}
