//! The operations HTTP endpoints and the systemd watchdog, run until a shutdown future
//! completes (mini-redis style: the caller owns the signal, tests pass their own).
//!
//! - Health (`HealthEnabled`, `HealthHost:HealthPort`, default localhost:9099): `GET
//!   /liveness` and `GET /readiness` answer 200 when good and 503 when not, with Felix's
//!   component table as the body. Handlers read a [`HealthAggregator`] snapshot only.
//! - Metrics (`PrometheusMetricsEnabled`, `PrometheusMetricsHost:PrometheusMetricsPort`,
//!   default all interfaces :9091): `GET /metrics` in the Prometheus text format.
//!
//! A two-route HTTP/1 server is hyper's connection API plus an accept loop; a web framework
//! would add routing and middleware we do not use. Port 0 binds an ephemeral port; the bound
//! addresses are reported by [`Server::health_addr`] and [`Server::metrics_addr`].

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::health::HealthAggregator;
use super::metrics::{Metrics, TEXT_CONTENT_TYPE};
use super::systemd::{run_watchdog, Notifier};
use super::OpsError;
use crate::config::Config;

/// How long open connections get to finish after shutdown before they are dropped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// A client that sends no request headers within this is disconnected.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the endpoints listen; `None` = that endpoint is off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `HealthHost`, `HealthPort` when `HealthEnabled`.
    pub health: Option<(String, u16)>,
    /// `PrometheusMetricsHost` (`None` = all interfaces), `PrometheusMetricsPort` when
    /// `PrometheusMetricsEnabled`.
    pub metrics: Option<(Option<String>, u16)>,
}

impl ServerConfig {
    /// From Felix's parameters.
    pub fn from_config(config: &Config) -> Self {
        ServerConfig {
            health: config
                .health_enabled
                .then(|| (config.health_host.clone(), config.health_port)),
            metrics: config.prometheus_metrics_enabled.then(|| {
                (
                    config.prometheus_metrics_host.clone(),
                    config.prometheus_metrics_port,
                )
            }),
        }
    }
}

/// The bound endpoints, ready to [`Server::run`].
#[derive(Debug)]
pub struct Server {
    health: Option<(TcpListener, SocketAddr)>,
    metrics: Option<(TcpListener, SocketAddr)>,
    aggregator: HealthAggregator,
    registry: Metrics,
    notifier: Notifier,
}

/// Binds `host:port`. A name is resolved and its IPv4 addresses tried first, as Go's
/// `net.Listen("tcp", "localhost:9099")` (Felix) listens on 127.0.0.1. No host = every
/// interface, both families where the kernel allows.
async fn bind(
    what: &'static str,
    host: Option<&str>,
    port: u16,
) -> Result<(TcpListener, SocketAddr), OpsError> {
    let mut candidates: Vec<SocketAddr> = match host.map(str::trim).filter(|h| !h.is_empty()) {
        None => vec![
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        ],
        Some(h) => {
            let h = h.trim_start_matches('[').trim_end_matches(']');
            match h.parse::<IpAddr>() {
                Ok(ip) => vec![SocketAddr::new(ip, port)],
                Err(_) => {
                    let mut v: Vec<SocketAddr> = tokio::net::lookup_host((h, port))
                        .await
                        .map_err(|source| OpsError::Resolve {
                            what,
                            host: h.to_string(),
                            source,
                        })?
                        .collect();
                    v.sort_by_key(|a| a.is_ipv6());
                    v
                }
            }
        }
    };
    candidates.dedup();
    let mut last_err = None;
    for addr in &candidates {
        match TcpListener::bind(addr).await {
            Ok(l) => {
                let local = l.local_addr().map_err(|source| OpsError::Bind {
                    what,
                    addr: addr.to_string(),
                    source,
                })?;
                return Ok((l, local));
            }
            Err(e) => last_err = Some((addr, e)),
        }
    }
    let (addr, source) = match last_err {
        Some((a, e)) => (a.to_string(), e),
        None => (
            format!("{}:{port}", host.unwrap_or_default()),
            std::io::Error::new(std::io::ErrorKind::NotFound, "host has no address"),
        ),
    };
    Err(OpsError::Bind { what, addr, source })
}

impl Server {
    /// Binds the enabled endpoints now, so a port in use is reported before the agent
    /// starts work.
    pub async fn bind(
        config: &ServerConfig,
        aggregator: HealthAggregator,
        registry: Metrics,
        notifier: Notifier,
    ) -> Result<Self, OpsError> {
        let health = match &config.health {
            Some((host, port)) => Some(bind("health", Some(host), *port).await?),
            None => None,
        };
        let metrics = match &config.metrics {
            Some((host, port)) => Some(bind("metrics", host.as_deref(), *port).await?),
            None => None,
        };
        Ok(Server {
            health,
            metrics,
            aggregator,
            registry,
            notifier,
        })
    }

    /// Where the health endpoints listen, if enabled.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health.as_ref().map(|(_, a)| *a)
    }

    /// Where the metrics endpoint listens, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(_, a)| *a)
    }

    /// Serves until `shutdown` completes, then sends systemd `STOPPING=1`, stops accepting,
    /// and gives open requests 5 s to finish. Also runs the systemd watchdog.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        // One signal, many listeners: each task holds a receiver and stops when it flips.
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            // An error means the sender is gone, which also means stop.
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut tasks = tokio::task::JoinSet::new();
        if let Some((listener, addr)) = self.health {
            tracing::info!(%addr, "serving /liveness and /readiness");
            let agg = self.aggregator.clone();
            tasks.spawn(serve(
                listener,
                move |req| health_response(&agg, req),
                stopped(stop_rx.clone()),
            ));
        }
        if let Some((listener, addr)) = self.metrics {
            tracing::info!(%addr, "serving Prometheus /metrics");
            let reg = self.registry.clone();
            tasks.spawn(serve(
                listener,
                move |req| metrics_response(&reg, req),
                stopped(stop_rx.clone()),
            ));
        }
        tasks.spawn(run_watchdog(
            self.notifier.clone(),
            self.aggregator.clone(),
            stopped(stop_rx),
        ));
        shutdown.await;
        if let Err(e) = self.notifier.stopping() {
            tracing::warn!(error = %e, "systemd STOPPING notification failed");
        }
        let _ = stop_tx.send(true);
        while let Some(r) = tasks.join_next().await {
            if let Err(e) = r {
                tracing::error!(error = %e, "operations endpoint task failed");
            }
        }
    }
}

type Body = Full<Bytes>;

fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut rsp = Response::new(Full::new(body.into()));
    *rsp.status_mut() = status;
    rsp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    rsp
}

const PLAIN: &str = "text/plain; charset=utf-8";

fn not_get(req: &Request<Incoming>) -> Option<Response<Body>> {
    (req.method() != Method::GET && req.method() != Method::HEAD)
        .then(|| text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "use GET\n"))
}

/// `/liveness` and `/readiness`: 200 when good, 503 otherwise, the component table as body.
fn health_response(agg: &HealthAggregator, req: &Request<Incoming>) -> Response<Body> {
    if let Some(rsp) = not_get(req) {
        return rsp;
    }
    let summary = agg.summary();
    let good = match req.uri().path() {
        "/liveness" => summary.live,
        "/readiness" => summary.ready,
        _ => return text(StatusCode::NOT_FOUND, PLAIN, "404 page not found\n"),
    };
    let status = if good {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    text(status, PLAIN, summary.table())
}

fn metrics_response(reg: &Metrics, req: &Request<Incoming>) -> Response<Body> {
    if let Some(rsp) = not_get(req) {
        return rsp;
    }
    if req.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, PLAIN, "404 page not found\n");
    }
    match reg.encode() {
        Ok(body) => text(StatusCode::OK, TEXT_CONTENT_TYPE, body),
        Err(e) => {
            tracing::error!(error = %e, "encoding metrics failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, PLAIN, format!("{e}\n"))
        }
    }
}

/// Accepts connections on `listener`, answering each request with `handler`, until `stop`.
async fn serve<H>(listener: TcpListener, handler: H, stop: impl Future<Output = ()>)
where
    H: Fn(&Request<Incoming>) -> Response<Body> + Send + Sync + 'static,
{
    let handler = Arc::new(handler);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting an operations connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let handler = Arc::clone(&handler);
        let service = service_fn(move |req: Request<Incoming>| {
            let rsp = handler(&req);
            async move { Ok::<_, Infallible>(rsp) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "operations connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("operations connections still open after the drain timeout");
    }
}
