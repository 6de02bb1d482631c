//! The dataplane agent in-process: the real loop (`Driver` + `RealKernel` + the interface
//! monitor) on its own thread and runtime, acting in one namespace, fed from a channel exactly as
//! `felix-nft run` feeds it from a transport. The demos run one per node; `felix-nft run` in a
//! separate process is what the end-to-end tests drive. With flow logs asked for, the agent also
//! runs what `felix-nft run` starts for them: the collector (reading NFLOG and conntrack in the
//! agent's namespace, handed the model's names by the loop) and the local view's socket.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::DemoError;
use crate::testbed::TestbedError;
use felix_api::from_dataplane::Payload as Out;
use felix_api::{FromDataplane, ToDataplane};
use felix_nft::collector::{Collector, CollectorConfig};
use felix_nft::dataplane::driver::{Driver, DriverError, LoopOptions, RunSummary};
use felix_nft::dataplane::kernel::{KernelError, RealKernel};
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft::flows::serve::{FlowServer, FlowServerConfig};
use felix_nft::source::{Origin, Received, Update};
use felix_nft_rules::RulesError;
use rtnl::monitor::{self, MonitorConfig};
use rtnl::netns::NetNs;
use rtnl::RtnlError;

/// Why the in-process agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("starting the agent's runtime")]
    Runtime(#[source] io::Error),
    #[error("opening the kernel sockets")]
    Kernel(#[source] Box<KernelError>),
    #[error("setting up the dataplane")]
    Rules(#[source] RulesError),
    #[error("starting the interface monitor")]
    Monitor(#[source] RtnlError),
    #[error("the dataplane loop")]
    Driver(#[source] Box<DriverError>),
    #[error("the agent thread panicked")]
    Panicked,
}

/// Flow logs for the in-process agent, as `FlowLogsLocalReporter=Enabled` turns them on for
/// `felix-nft run` (the rules must log too: `DataplaneConfig::rules.flow_logs`).
#[derive(Debug, Clone)]
pub(crate) struct FlowLogsSpec {
    /// The local view's socket (`FlowLogsLocalSocket`).
    pub(crate) socket: PathBuf,
    /// `FlowLogsFlushInterval`.
    pub(crate) flush: Duration,
}

/// The dataplane loop on its own thread and runtime, acting in the scratch host namespace, fed
/// from a channel exactly as `felix-nft run` feeds it from a transport.
pub(crate) struct Agent {
    updates: mpsc::Sender<Received>,
    status: std_mpsc::Receiver<FromDataplane>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<RunSummary, AgentError>>>,
    /// Where the flows are served, or why they are not; `None` when not asked for.
    flows: Option<Result<PathBuf, String>>,
}

impl Agent {
    /// Starts the agent in `host`. Flow logs that cannot start (another program holds NFLOG
    /// group 1 or 2, the socket cannot be made) leave it running without them, as
    /// `felix-nft run` does; [`Agent::flow_socket`] says why.
    pub(crate) fn start(
        host: &NetNs,
        cfg: DataplaneConfig,
        flows: Option<FlowLogsSpec>,
    ) -> Result<Agent, DemoError> {
        let ns = host.try_clone().map_err(|source| DemoError::Testbed {
            op: "duplicating the host namespace handle",
            source: TestbedError::Io { op: "dup", source },
        })?;
        // Built here so that the flow socket is served on it from the start.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(AgentError::Runtime)?;
        let (collector, flows) = match flows {
            Some(spec) => match start_flow_logs(&rt, host, &spec) {
                Ok(c) => (Some(c), Some(Ok(spec.socket))),
                Err(why) => (None, Some(Err(why))),
            },
            None => (None, None),
        };
        let (utx, urx) = mpsc::channel(256);
        let (stx, srx) = std_mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("agent-{}", host.label()))
            .spawn(move || agent_main(rt, ns, cfg, collector, urx, stx, stop_rx))
            .map_err(DemoError::Runtime)?;
        Ok(Agent {
            updates: utx,
            status: srx,
            stop: Some(stop_tx),
            thread: Some(thread),
            flows,
        })
    }

    /// The socket the agent serves its flows on (`felix-nft flows --socket`), or why there is
    /// none. `None` when flow logs were not asked for.
    pub(crate) fn flow_socket(&self) -> Option<Result<&Path, &str>> {
        self.flows
            .as_ref()
            .map(|f| f.as_ref().map(PathBuf::as_path).map_err(String::as_str))
    }

    pub(crate) fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    pub(crate) fn send(&self, messages: Vec<ToDataplane>) -> Result<(), DemoError> {
        for (index, message) in messages.into_iter().enumerate() {
            let u = Update::new(Origin::Item { index }, message);
            if self.updates.blocking_send(Ok(u)).is_err() {
                return Err(DemoError::AgentGone {
                    what: "taking its messages",
                });
            }
        }
        Ok(())
    }

    /// Waits for the agent's `DataplaneInSync`; returns the IPv4 WireGuard key it reported on
    /// the way, if one (non-empty).
    pub(crate) fn wait_in_sync(&self, timeout: Duration) -> Result<Option<String>, DemoError> {
        let deadline = Instant::now() + timeout;
        let mut key = None;
        while Instant::now() < deadline {
            match self.status.recv_timeout(Duration::from_millis(20)) {
                Ok(FromDataplane {
                    payload: Some(Out::DataplaneInSync(_)),
                    ..
                }) => return Ok(key.filter(|k: &String| !k.is_empty())),
                Ok(FromDataplane {
                    payload: Some(Out::WireguardStatusUpdate(u)),
                    ..
                }) if u.ip_version == felix_api::IpVersion::Ipv4 as i32 => {
                    key = Some(u.public_key);
                }
                Ok(_) | Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(DemoError::AgentGone {
                        what: "reaching DataplaneInSync",
                    })
                }
            }
            if self.finished() {
                return Err(DemoError::AgentGone {
                    what: "reaching DataplaneInSync",
                });
            }
        }
        Err(DemoError::Timeout {
            what: "DataplaneInSync",
            timeout,
        })
    }

    /// Stops the loop (the kernel state stays, as on SIGTERM) and returns what it did.
    pub(crate) fn stop(mut self) -> Result<RunSummary, DemoError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => Ok(r?),
            Some(Err(_)) => Err(AgentError::Panicked.into()),
            None => Err(DemoError::AgentGone { what: "stopping" }),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // On an early error: stop the loop before the namespaces it acts in are deleted.
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The local view's socket, served on `rt` until the runtime shuts down (which removes the
/// socket), and the collector publishing to it from `host`.
fn start_flow_logs(
    rt: &tokio::runtime::Runtime,
    host: &NetNs,
    spec: &FlowLogsSpec,
) -> Result<Arc<Collector>, String> {
    let serve = FlowServerConfig {
        path: spec.socket.clone(),
        ..FlowServerConfig::default()
    };
    let (sink, server) = {
        let _in_rt = rt.enter();
        FlowServer::start(&serve, std::future::pending())
            .map_err(|e| felix_nft::ops::logging::chain(&e))?
    };
    let cfg = CollectorConfig {
        flush_interval: spec.flush,
        ..CollectorConfig::default()
    };
    Collector::start(Some(host), cfg, sink)
        .map(Arc::new)
        .map_err(|e| {
            // Nothing would publish to it.
            server.abort();
            felix_nft::ops::logging::chain(&e)
        })
}

fn agent_main(
    rt: tokio::runtime::Runtime,
    ns: NetNs,
    cfg: DataplaneConfig,
    collector: Option<Arc<Collector>>,
    updates: mpsc::Receiver<Received>,
    status: std_mpsc::Sender<FromDataplane>,
    stop: oneshot::Receiver<()>,
) -> Result<RunSummary, AgentError> {
    let r = rt.block_on(async move {
        let kernel =
            RealKernel::open(Some(&ns), &cfg).map_err(|e| AgentError::Kernel(Box::new(e)))?;
        let rp_filter = kernel.procsys().default_rp_filter();
        let dp = Dataplane::new(cfg.clone(), rp_filter).map_err(AgentError::Rules)?;
        let (mut mon_rx, _mon) = monitor::start(
            Some(&ns),
            MonitorConfig {
                exclude: cfg.iface_exclude.clone(),
                resync_interval: cfg.iface_refresh,
                ..MonitorConfig::default()
            },
        )
        .map_err(AgentError::Monitor)?;
        let (iface_tx, iface_rx) = mpsc::channel(64);
        tokio::spawn(async move {
            while let Some(ev) = mon_rx.recv().await {
                if iface_tx.send(ev).await.is_err() {
                    break;
                }
            }
        });
        // Status goes through an outbox to a std channel, so the loop never waits on the demo.
        let (out_tx, out_rx) = felix_nft::source::outbox::outbox();
        tokio::spawn(async move {
            while let Some(batch) = out_rx.take().await {
                for m in batch {
                    if status.send(m).is_err() {
                        return;
                    }
                }
            }
        });
        let mut driver = Driver::new(dp, kernel, LoopOptions::default(), Some(out_tx), None);
        if let Some(c) = collector {
            driver = driver.with_flow_names(Box::new(move |names| c.set_names(names)));
        }
        driver
            .run(updates, iface_rx, async {
                let _ = stop.await;
            })
            .await
            .map_err(|e| AgentError::Driver(Box::new(e)))?;
        Ok(driver.summary().clone())
    });
    // The monitor's blocking reader may still wait on its socket: do not wait for it.
    rt.shutdown_timeout(Duration::from_millis(200));
    r
}
