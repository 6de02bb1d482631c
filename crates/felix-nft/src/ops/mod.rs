//! Operations surface: health endpoints, Prometheus metrics, systemd notify, logging setup. Owns no
//! dataplane state.
//!
//! Layer: may read [`crate::config`]; nothing else in the crate. The dataplane loop *writes*
//! here (reports, counters) and never reads back; the HTTP handlers only read snapshots, so a
//! slow scrape or a hung loop cannot block the other.
//!
//! - [`health`]: Felix's health aggregator; the loop's reporter is [`DataplaneHealth`].
//! - [`metrics`]: the registry with Felix's metric names (`felix_int_dataplane_*`,
//!   `felix_nft_*`, `felix_route_table_*`), Calico Enterprise's for flow logs
//!   (`cnx_policy_rule_*`, `calico_denied_*`) and ours (`felix_nft_agent_*`).
//! - [`systemd`]: `READY=1`, `WATCHDOG=1`, `STOPPING=1`.
//! - [`logging`]: an error and its causes on one line.
//! - [`logfmt`]: Felix's severity parameters on `tracing`, text or one-line JSON.
//! - [`server`]: the HTTP endpoints and the watchdog task, run until a shutdown future.
//! - [`signal`]: SIGTERM/SIGINT as a future, the daemon's usual shutdown trigger.
//!
//! [`Ops`] bundles the handles the daemon needs.

pub mod health;
pub mod logfmt;
pub mod logging;
pub mod metrics;
pub mod server;
pub mod signal;
pub mod systemd;

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

pub use health::{DataplaneHealth, HealthAggregator, HealthReport, HealthReporter, HealthSummary};
pub use logfmt::{init_logging, LogError, LogFormat, LOG_FORMAT_ENV};
pub use metrics::{Metrics, MetricsError, NftObjectCounts};
pub use server::{Server, ServerConfig};
pub use signal::Termination;
pub use systemd::{Notifier, NotifyError};

use crate::config::Config;

/// What can go wrong setting up the operations surface.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("resolving {what} host {host:?}")]
    Resolve {
        what: &'static str,
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("listening for {what} on {addr}")]
    Bind {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("setting up metrics")]
    Metrics(#[from] MetricsError),
    #[error("setting up systemd notifications")]
    Notify(#[from] NotifyError),
}

/// The handles the daemon passes around: health, metrics and systemd notifications. Cheap to
/// clone; every clone shares the same state.
#[derive(Debug, Clone)]
pub struct Ops {
    pub health: HealthAggregator,
    pub metrics: Metrics,
    pub notifier: Notifier,
    watchdog_timeout: Duration,
}

impl Ops {
    /// From the config and this process's environment (`NOTIFY_SOCKET`, `WATCHDOG_USEC`).
    pub fn new(config: &Config) -> Result<Self, OpsError> {
        Ok(Self::with_notifier(config, Notifier::from_env()?)?)
    }

    /// With an explicit notifier (tests, or a disabled one).
    pub fn with_notifier(config: &Config, notifier: Notifier) -> Result<Self, MetricsError> {
        Ok(Ops {
            health: HealthAggregator::with_overrides(&config.health_timeout_overrides),
            metrics: Metrics::new(config.prometheus_process_metrics_enabled)?,
            notifier,
            watchdog_timeout: health::dataplane_watchdog_timeout(config),
        })
    }

    /// Registers the dataplane loop's reporter, with `DataplaneWatchdogTimeout` (≥ 20 s) as
    /// its liveness timeout. Call once, when the loop starts.
    pub fn dataplane_health(&self) -> DataplaneHealth {
        DataplaneHealth::register(&self.health, self.watchdog_timeout)
    }

    /// The loop finished an apply: records the metrics and the health report, and on the
    /// first success sends systemd `READY=1`. Returns `true` on the first success (the moment
    /// to send Felix `DataplaneInSync`).
    pub fn apply_finished(
        &self,
        dataplane: &mut DataplaneHealth,
        duration: Duration,
        result: Result<(), &dyn Display>,
    ) -> bool {
        self.metrics.record_apply(duration, result.is_ok());
        let first = dataplane.applied(result);
        if first {
            if let Err(e) = self.notifier.ready() {
                tracing::warn!(error = %e, "systemd READY notification failed");
            }
        }
        first
    }

    /// Binds the enabled endpoints (see [`Server::bind`]).
    pub async fn bind_server(&self, config: &Config) -> Result<Server, OpsError> {
        Server::bind(
            &ServerConfig::from_config(config),
            self.health.clone(),
            self.metrics.clone(),
            self.notifier.clone(),
        )
        .await
    }

    /// Binds and serves the enabled endpoints until `shutdown` (see [`Server::run`]).
    pub async fn run(
        &self,
        config: &Config,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), OpsError> {
        self.bind_server(config).await?.run(shutdown).await;
        Ok(())
    }
}
