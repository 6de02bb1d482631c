//! The dataplane agent in-process: the real loop (`Driver` + `RealKernel` + the interface
//! monitor) on its own thread and runtime, acting in one namespace, fed from a channel exactly as
//! `felix-nft run` feeds it from a transport. The demos run one per node; `felix-nft run` in a
//! separate process is what the end-to-end tests drive.

use std::io;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::DemoError;
use crate::dataplane::driver::{Driver, DriverError, LoopOptions, RunSummary};
use crate::dataplane::kernel::{KernelError, RealKernel};
use crate::dataplane::{Dataplane, DataplaneConfig};
use crate::netns::NetNs;
use crate::proto::from_dataplane::Payload as Out;
use crate::proto::{FromDataplane, ToDataplane};
use crate::rtnl::monitor::{self, MonitorConfig};
use crate::rtnl::RtnlError;
use crate::rules::RulesError;
use crate::source::{Origin, Received, Update};
use crate::testbed::TestbedError;

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

/// The dataplane loop on its own thread and runtime, acting in the scratch host namespace, fed
/// from a channel exactly as `felix-nft run` feeds it from a transport.
pub(crate) struct Agent {
    updates: mpsc::Sender<Received>,
    status: std_mpsc::Receiver<FromDataplane>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<RunSummary, AgentError>>>,
}

impl Agent {
    pub(crate) fn start(host: &NetNs, cfg: DataplaneConfig) -> Result<Agent, DemoError> {
        let ns = host.try_clone().map_err(|source| DemoError::Testbed {
            op: "duplicating the host namespace handle",
            source: TestbedError::Io { op: "dup", source },
        })?;
        let (utx, urx) = mpsc::channel(256);
        let (stx, srx) = std_mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("agent-{}", host.label()))
            .spawn(move || agent_main(ns, cfg, urx, stx, stop_rx))
            .map_err(DemoError::Runtime)?;
        Ok(Agent {
            updates: utx,
            status: srx,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
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
                }) if u.ip_version == crate::proto::IpVersion::Ipv4 as i32 => {
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

fn agent_main(
    ns: NetNs,
    cfg: DataplaneConfig,
    updates: mpsc::Receiver<Received>,
    status: std_mpsc::Sender<FromDataplane>,
    stop: oneshot::Receiver<()>,
) -> Result<RunSummary, AgentError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
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
        let (out_tx, out_rx) = crate::source::outbox::outbox();
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
