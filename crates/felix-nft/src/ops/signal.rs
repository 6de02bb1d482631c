//! The termination signals the daemon stops on: SIGTERM (systemd, Kubernetes, Felix stopping
//! its external driver) and SIGINT (a terminal). Stopping never removes rules, routes or
//! neighbours: it only ends the process.

use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Handlers for SIGTERM and SIGINT. Install them early: from then on the signals are queued
/// for [`Termination::recv`] instead of killing the process.
#[derive(Debug)]
pub struct Termination {
    term: Signal,
    int: Signal,
}

impl Termination {
    /// Installs the handlers. Needs a tokio runtime.
    pub fn install() -> io::Result<Self> {
        Ok(Termination {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for the next termination signal and names it (`SIGTERM` or `SIGINT`), for the
    /// log line that says why the agent stopped.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
