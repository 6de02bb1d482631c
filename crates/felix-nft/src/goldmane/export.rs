//! The exporter: a bounded queue the collector's thread fills without waiting, and one tokio task
//! that streams it to Goldmane's `FlowCollector.Connect` and reconnects when anything fails.
//!
//! How Felix connects (`felix/collector/dpstatshelper.go` → `goldmane/pkg/client`): a gRPC
//! client to `FlowLogsGoldmaneServer`, with TLS and Felix's Typha client certificate
//! (`TyphaCertFile`, `TyphaKeyFile`) when any of `TyphaCAFile`/`TyphaCertFile`/`TyphaKeyFile` is
//! set (all three are needed then, here as in Felix), the server's certificate checked against
//! `TyphaCAFile` for the host name of the address (Felix sets no server name: `TyphaCN` and
//! `TyphaURISAN` are for Typha only). One `Connect` stream; each flow is sent as a `FlowUpdate`
//! and Goldmane answers each with a `FlowReceipt`.
//!
//! Where felix-nft differs, and why:
//! - Plaintext: Felix dials in plaintext whenever no TLS file is set (a fallback its source says
//!   is for its own tests). Flows name every workload of the node, so felix-nft sends them in
//!   plaintext only when the address says so, `http://host:port`; a bare `host:port` with no TLS
//!   file is an error that is logged, and nothing is sent.
//! - Pipelining: Felix waits for each receipt before sending the next flow. felix-nft keeps up to
//!   [`MAX_IN_FLIGHT`] flows unacknowledged, so a flush of thousands of flows does not take
//!   thousands of round trips; receipts still count what Goldmane took ([`GoldmaneSink::sent`]).
//! - Replay: Felix resends every flow of the last five minutes after a reconnect (so a restarted
//!   Goldmane rebuilds its window). felix-nft resends only the flows Goldmane had not
//!   acknowledged, then what queued meanwhile.
//!
//! Memory is bounded whatever Goldmane does: the queue holds at most `queue` flows (the oldest
//! is dropped and counted), at most [`MAX_IN_FLIGHT`] more are in flight, and HTTP/2 flow
//! control stops the stream's sender when Goldmane does not read. A Goldmane that takes no flow
//! for `receipt_timeout` while flows are in flight is treated as failed: the exporter drops the
//! connection and reconnects, as for a refused connection, a failed TLS handshake or a reset
//! stream. Back-off doubles from `backoff_initial` to `backoff_max` and starts again once
//! Goldmane acknowledges a flow (or a stream has stayed open 10 s). Each change of state is logged once, at `warn!` with the address and
//! the cause when export stops working and at `info!` when it works again; repeats go to
//! `debug!`.

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::api::{self, FlowReceipt, FlowUpdate};
use super::convert::to_flow;
use crate::config::Config;
use crate::flows::record::FlowRecord;

/// Felix's Goldmane client buffers 5000 flows (`goldmane/pkg/client`, `inChan`).
pub const DEFAULT_QUEUE: usize = 5000;

/// Flows sent and not yet acknowledged, at most: enough to keep a stream busy over a round trip
/// of a few milliseconds, few enough that a reconnect resends little.
pub const MAX_IN_FLIGHT: usize = 128;

/// Flows handed to the HTTP/2 stream's encoder ahead of what it has sent.
const STREAM_BUFFER: usize = 16;

/// How long a stream must stay open for the back-off to start again from `backoff_initial`
/// (a receipt does it at once). Only a receipt counts as export working, for the logs and
/// [`GoldmaneSink::last_error`]: a peer that accepts and never answers is not Goldmane working.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// TCP keepalive on the connection, so that the kernel eventually notices a peer that vanished
/// while the stream is idle (with flows in flight, `receipt_timeout` notices first). HTTP/2
/// pings are not used: gRPC-Go servers answer pings more frequent than their enforcement policy
/// allows (5 minutes by default) with GOAWAY.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Where Goldmane is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoldmaneConfig {
    /// `host:port` (TLS; the TLS files must be set), `https://host:port` (the same),
    /// `http://host:port` (plaintext), or gRPC-Go's `dns:///host:port`.
    pub address: String,
    /// The CA the server's certificate must chain to (`TyphaCAFile`).
    pub ca_file: Option<PathBuf>,
    /// Our client certificate (`TyphaCertFile`).
    pub cert_file: Option<PathBuf>,
    /// Its key (`TyphaKeyFile`).
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry; `None` = the host of `address` (as Felix).
    pub server_name: Option<String>,
    /// Flows kept while Goldmane is slow or away; the oldest is dropped beyond this (at least 1).
    pub queue: usize,
    /// This node's name: Felix's name for this node's host endpoints
    /// ([`super::convert::to_flow`]).
    pub node_name: String,
    /// Back-off and timeouts ([`Timing::default`] in the agent; tests shorten them).
    pub timing: Timing,
}

/// The exporter's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The first wait after a failure; doubled after each failure in a row.
    pub backoff_initial: Duration,
    /// The longest wait between attempts.
    pub backoff_max: Duration,
    /// TCP connect and TLS handshake, each.
    pub connect_timeout: Duration,
    /// How long flows may stay unacknowledged before Goldmane counts as not reading.
    pub receipt_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            receipt_timeout: Duration::from_secs(30),
        }
    }
}

impl GoldmaneConfig {
    /// An exporter to `address` with no TLS files and the default queue and timers.
    pub fn new(address: impl Into<String>, node_name: impl Into<String>) -> Self {
        GoldmaneConfig {
            address: address.into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: None,
            queue: DEFAULT_QUEUE,
            node_name: node_name.into(),
            timing: Timing::default(),
        }
    }

    /// The exporter Felix's parameters ask for: `None` unless `FlowLogsGoldmaneServer` is set.
    pub fn from_config(config: &Config, node_name: &str) -> Option<Self> {
        let address = config.flow_logs_goldmane_server.clone()?;
        Some(GoldmaneConfig {
            ca_file: config.typha_ca_file.as_ref().map(PathBuf::from),
            cert_file: config.typha_cert_file.as_ref().map(PathBuf::from),
            key_file: config.typha_key_file.as_ref().map(PathBuf::from),
            ..GoldmaneConfig::new(address, node_name)
        })
    }
}

/// Why a connection to Goldmane could not be made or did not last.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}")]
    Address(String),
    #[error(
        "TLS to Goldmane needs TyphaCAFile, TyphaCertFile and TyphaKeyFile; {missing} is not set"
    )]
    TlsIncomplete { missing: &'static str },
    #[error("reading {param} {}", path.display())]
    TlsFile {
        param: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("setting up TLS")]
    TlsSetup(#[source] tonic::transport::Error),
    #[error("connecting")]
    Connect(#[source] tonic::transport::Error),
    #[error("the stream failed")]
    Stream(#[source] tonic::Status),
    #[error("Goldmane ended the stream")]
    Ended,
    #[error("the stream closed for sending")]
    SendClosed,
    #[error(
        "Goldmane acknowledged no flow in {} s: it is not reading",
        .0.as_secs_f64()
    )]
    Stalled(Duration),
}

/// Starts exporting; see [`GoldmaneExporter::start`].
pub struct GoldmaneExporter;

impl GoldmaneExporter {
    /// Spawns the exporter task on the current tokio runtime and returns the sink that feeds it.
    /// The task runs until every clone of the sink is dropped: it then sends what is queued if
    /// it is connected, and ends without reconnecting.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as `tokio::spawn`). The sink itself may be used from any thread.
    pub fn start(cfg: GoldmaneConfig) -> (GoldmaneSink, JoinHandle<()>) {
        let any_file = cfg.ca_file.is_some() || cfg.cert_file.is_some() || cfg.key_file.is_some();
        if any_file && cfg.address.trim().starts_with("http://") {
            tracing::warn!(
                address = %cfg.address,
                "flow logs: the Goldmane address asks for plaintext (http://); TyphaCAFile, \
                 TyphaCertFile and TyphaKeyFile are not used"
            );
        }
        let shared = Arc::new(Shared::new(cfg.queue, &cfg.node_name));
        let sink = GoldmaneSink {
            handle: Arc::new(SinkHandle {
                shared: shared.clone(),
            }),
        };
        let task = Task {
            backoff: cfg.timing.backoff_initial,
            cfg,
            shared,
            in_flight: VecDeque::new(),
            state: LinkState::Starting,
        };
        (sink, tokio::spawn(task.run()))
    }
}

/// The collector's end of the exporter. Cheap to clone; never blocks on the network.
#[derive(Clone)]
pub struct GoldmaneSink {
    handle: Arc<SinkHandle>,
}

impl std::fmt::Debug for GoldmaneSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoldmaneSink")
            .field("queued", &self.queued())
            .field("sent", &self.sent())
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// Closes the exporter when the last sink goes.
struct SinkHandle {
    shared: Arc<Shared>,
}

impl Drop for SinkHandle {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

impl GoldmaneSink {
    /// Queues `records` for Goldmane. Synchronous and short: converts, locks the queue for the
    /// push, drops the oldest flows beyond the bound (counted in [`Self::dropped`]) and wakes
    /// the task. Never waits for the network.
    pub fn publish(&self, records: &[FlowRecord]) {
        let shared = &self.handle.shared;
        if records.is_empty() {
            return;
        }
        // Records that would be dropped on arrival are not converted.
        let skipped = records.len().saturating_sub(shared.capacity);
        let updates: Vec<FlowUpdate> = records[skipped..]
            .iter()
            .map(|r| FlowUpdate {
                flow: Some(to_flow(r, &shared.node_name)),
            })
            .collect();
        if skipped > 0 {
            shared.dropped.fetch_add(skipped as u64, Ordering::Relaxed);
        }
        let dropped = skipped as u64 + {
            let mut q = shared.lock_queue();
            q.extend(updates);
            shared.trim(&mut q)
        };
        shared.wake.notify_one();
        let was_dropping = shared.dropping.swap(dropped > 0, Ordering::Relaxed);
        if dropped > 0 && !was_dropping {
            tracing::warn!(
                dropped_total = self.dropped(),
                queue = shared.capacity,
                "flow logs: the Goldmane queue is full; dropping the oldest flows"
            );
        }
    }

    /// Flows Goldmane acknowledged.
    pub fn sent(&self) -> u64 {
        self.handle.shared.sent.load(Ordering::Relaxed)
    }

    /// Flows dropped because the queue was full (the oldest first).
    pub fn dropped(&self) -> u64 {
        self.handle.shared.dropped.load(Ordering::Relaxed)
    }

    /// Flows waiting in the queue (not counting those in flight).
    pub fn queued(&self) -> usize {
        self.handle.shared.lock_queue().len()
    }

    /// Why export is not working now, as logged; `None` while it works (or has not failed).
    pub fn last_error(&self) -> Option<String> {
        self.handle
            .shared
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Shared {
    queue: Mutex<VecDeque<FlowUpdate>>,
    capacity: usize,
    node_name: String,
    /// Flows queued, or the sink closed.
    wake: Notify,
    dropped: AtomicU64,
    sent: AtomicU64,
    /// The last publish dropped flows (so that only the start of a run of drops is logged).
    dropping: AtomicBool,
    closed: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl Shared {
    fn new(capacity: usize, node_name: &str) -> Self {
        Shared {
            queue: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            node_name: node_name.to_string(),
            wake: Notify::new(),
            dropped: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            dropping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            last_error: Mutex::new(None),
        }
    }

    /// A panic elsewhere while holding the lock leaves a queue that is still a valid queue.
    fn lock_queue(&self) -> MutexGuard<'_, VecDeque<FlowUpdate>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the oldest flows beyond the bound; returns how many.
    fn trim(&self, q: &mut VecDeque<FlowUpdate>) -> u64 {
        let excess = q.len().saturating_sub(self.capacity);
        q.drain(..excess);
        let excess = excess as u64;
        if excess > 0 {
            self.dropped.fetch_add(excess, Ordering::Relaxed);
        }
        excess
    }

    fn pop(&self) -> Option<FlowUpdate> {
        self.lock_queue().pop_front()
    }

    fn is_empty(&self) -> bool {
        self.lock_queue().is_empty()
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LinkState {
    Starting,
    Up,
    /// Failing, for this (logged) cause.
    Down(String),
}

struct Task {
    cfg: GoldmaneConfig,
    shared: Arc<Shared>,
    /// Sent on the current stream and not yet acknowledged, oldest first.
    in_flight: VecDeque<FlowUpdate>,
    state: LinkState,
    /// The wait before the next attempt after a failure.
    backoff: Duration,
}

impl Task {
    async fn run(mut self) {
        loop {
            if self.shared.closed() {
                break;
            }
            let result = match self.connect().await {
                Ok(channel) => self.session(channel).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => break,
                Err(e) => {
                    self.requeue_in_flight();
                    let wait = self.backoff;
                    self.failed(&e, wait);
                    self.backoff = (self.backoff * 2).min(self.cfg.timing.backoff_max);
                    let deadline = Instant::now() + wait;
                    // Wake early only to close.
                    while !self.shared.closed() {
                        tokio::select! {
                            _ = tokio::time::sleep_until(deadline) => break,
                            _ = self.shared.wake.notified() => {}
                        }
                    }
                }
            }
        }
        let unsent = self.shared.lock_queue().len() + self.in_flight.len();
        if unsent > 0 {
            tracing::info!(
                address = %self.cfg.address,
                unsent,
                "flow logs: the Goldmane exporter stopped with flows unsent"
            );
        } else {
            tracing::debug!(address = %self.cfg.address, "flow logs: the Goldmane exporter stopped");
        }
    }

    /// A channel to Goldmane: TCP connected, TLS and HTTP/2 handshakes done.
    async fn connect(&self) -> Result<Channel, ExportError> {
        let (uri, tls) = target(&self.cfg)?;
        let timing = &self.cfg.timing;
        let mut endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| ExportError::Address(format!("{:?} is not a usable address: {e}", uri)))?
            .connect_timeout(timing.connect_timeout)
            .tcp_keepalive(Some(TCP_KEEPALIVE));
        if tls {
            endpoint = endpoint
                .tls_config(self.tls_config().await?)
                .map_err(ExportError::TlsSetup)?;
        }
        endpoint.connect().await.map_err(ExportError::Connect)
    }

    /// Read on every attempt: the files are rotated in place, and one that could not be read
    /// before may be there now.
    async fn tls_config(&self) -> Result<ClientTlsConfig, ExportError> {
        let (ca, cert, key) = tls_files(&self.cfg)?;
        let ca = read("TyphaCAFile", ca).await?;
        let cert = read("TyphaCertFile", cert).await?;
        let key = read("TyphaKeyFile", key).await?;
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .timeout(self.cfg.timing.connect_timeout);
        if let Some(name) = &self.cfg.server_name {
            tls = tls.domain_name(name.clone());
        }
        Ok(tls)
    }

    /// One `Connect` stream: sends what is queued, counts receipts, until something fails or
    /// the sink is closed and everything queued was acknowledged (`Ok`).
    async fn session(&mut self, channel: Channel) -> Result<(), ExportError> {
        tracing::debug!(address = %self.cfg.address, "flow logs: connected to Goldmane");
        let shared = self.shared.clone();
        let (tx, rx) = mpsc::channel::<FlowUpdate>(STREAM_BUFFER);
        let outbound =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|u| (u, rx)) });
        let mut grpc = tonic::client::Grpc::new(channel);
        // The call resolves when Goldmane's response headers arrive, which a gRPC-Go server
        // sends with its first receipt, after our first flow: so the call is polled as part of
        // the receipt stream, alongside the sending below, never awaited before it.
        let call = async move {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::from_error(e.into()))?;
            let codec = tonic_prost::ProstCodec::<FlowUpdate, FlowReceipt>::default();
            let path = http::uri::PathAndQuery::from_static(api::CONNECT_PATH);
            grpc.streaming(tonic::Request::new(outbound), path, codec)
                .await
        };
        let receipts = futures::stream::once(call)
            .map(|r| match r {
                Ok(response) => response.into_inner().left_stream(),
                Err(status) => futures::stream::iter([Err(status)]).right_stream(),
            })
            .flatten();
        tokio::pin!(receipts);

        let opened = Instant::now();
        let mut stable = false;
        let mut sending = true;
        let timeout = self.cfg.timing.receipt_timeout;
        // The last receipt, or when the oldest flow in flight was sent.
        let mut progress = Instant::now();
        loop {
            let queued = !shared.is_empty();
            if shared.closed() && !queued && self.in_flight.is_empty() {
                // Dropping the sender ends our half of the stream; Goldmane sees the end.
                return Ok(());
            }
            if !sending && self.in_flight.is_empty() {
                return Err(ExportError::SendClosed);
            }
            let can_send = sending && queued && self.in_flight.len() < MAX_IN_FLIGHT;
            tokio::select! {
                r = receipts.next() => match r {
                    Some(Ok(FlowReceipt {})) => {
                        if self.in_flight.pop_front().is_some() {
                            shared.sent.fetch_add(1, Ordering::Relaxed);
                        }
                        progress = Instant::now();
                        self.working();
                    }
                    Some(Err(status)) => return Err(ExportError::Stream(status)),
                    None => return Err(ExportError::Ended),
                },
                permit = tx.reserve(), if can_send => {
                    // The stream's body was dropped: the receipts (or their absence) say why.
                    let Ok(permit) = permit else {
                        sending = false;
                        continue;
                    };
                    if let Some(update) = shared.pop() {
                        if self.in_flight.is_empty() {
                            progress = Instant::now();
                        }
                        permit.send(update.clone());
                        self.in_flight.push_back(update);
                    }
                }
                _ = shared.wake.notified() => {}
                _ = tokio::time::sleep_until(progress + timeout), if !self.in_flight.is_empty() => {
                    return Err(ExportError::Stalled(timeout));
                }
                _ = tokio::time::sleep_until(opened + STABLE_AFTER), if !stable => {
                    stable = true;
                    self.backoff = self.cfg.timing.backoff_initial;
                }
            }
        }
    }

    /// Flows sent but not acknowledged go back to the front of the queue, to be sent again
    /// (Goldmane deduplicates); the bound still holds, and the oldest go first.
    fn requeue_in_flight(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        let mut q = self.shared.lock_queue();
        while let Some(u) = self.in_flight.pop_back() {
            q.push_front(u);
        }
        self.shared.trim(&mut q);
    }

    /// Goldmane acknowledged a flow: log it if that is news, and start the back-off again.
    fn working(&mut self) {
        if self.state == LinkState::Up {
            return;
        }
        if matches!(self.state, LinkState::Down(_)) {
            tracing::info!(address = %self.cfg.address, "flow logs: exporting to Goldmane again");
        } else {
            tracing::info!(address = %self.cfg.address, "flow logs: exporting to Goldmane");
        }
        self.state = LinkState::Up;
        self.backoff = self.cfg.timing.backoff_initial;
        *self
            .shared
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn failed(&mut self, e: &ExportError, wait: Duration) {
        let cause = describe(e, &self.cfg);
        let retry_in_secs = wait.as_secs_f64();
        if self.state == LinkState::Down(cause.clone()) {
            tracing::debug!(address = %self.cfg.address, %cause, retry_in_secs, "flow logs: still cannot export to Goldmane");
            return;
        }
        tracing::warn!(address = %self.cfg.address, %cause, retry_in_secs, "flow logs: cannot export to Goldmane");
        *self
            .shared
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(cause.clone());
        self.state = LinkState::Down(cause);
    }
}

async fn read(param: &'static str, path: &Path) -> Result<Vec<u8>, ExportError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| ExportError::TlsFile {
            param,
            path: path.to_path_buf(),
            source,
        })
}

/// The three TLS files, all of which TLS needs (Felix loads all three too).
fn tls_files(cfg: &GoldmaneConfig) -> Result<(&Path, &Path, &Path), ExportError> {
    let missing = |missing| ExportError::TlsIncomplete { missing };
    Ok((
        cfg.ca_file
            .as_deref()
            .ok_or_else(|| missing("TyphaCAFile"))?,
        cfg.cert_file
            .as_deref()
            .ok_or_else(|| missing("TyphaCertFile"))?,
        cfg.key_file
            .as_deref()
            .ok_or_else(|| missing("TyphaKeyFile"))?,
    ))
}

/// The URI to dial and whether to use TLS.
fn target(cfg: &GoldmaneConfig) -> Result<(String, bool), ExportError> {
    let address = cfg.address.trim();
    let any_file = cfg.ca_file.is_some() || cfg.cert_file.is_some() || cfg.key_file.is_some();
    if let Some(rest) = address.strip_prefix("http://") {
        return Ok((format!("http://{rest}"), false));
    }
    let host_port = address
        .strip_prefix("https://")
        .or_else(|| address.strip_prefix("dns:///"))
        .unwrap_or(address);
    if host_port.is_empty() || host_port.contains("://") {
        return Err(ExportError::Address(format!(
            "{address:?} is not host:port, http://host:port or https://host:port"
        )));
    }
    if !any_file && !address.starts_with("https://") {
        return Err(ExportError::Address(format!(
            "no TLS file is set (TyphaCAFile, TyphaCertFile, TyphaKeyFile): flows are not sent \
             in plaintext unless the address says so (http://{host_port})"
        )));
    }
    Ok((format!("https://{host_port}"), true))
}

/// The cause as logged: a TLS failure said plainly, anything else as its chain of errors.
fn describe(e: &ExportError, cfg: &GoldmaneConfig) -> String {
    let mut parts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(err) = next {
        if let Some(tls) = rustls_error(err) {
            return format!("{}: {}", tls_cause(tls, cfg), tls);
        }
        let text = match err.downcast_ref::<tonic::Status>() {
            Some(s) if s.message().is_empty() => format!("gRPC status {:?}", s.code()),
            Some(s) => format!("gRPC status {:?}: {}", s.code(), s.message()),
            None => err.to_string(),
        };
        // Wrappers often repeat their source's text.
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}

/// The rustls error behind `err`, which reaches us inside an `io::Error` (whose `source()`
/// skips the error it wraps, so look inside it).
fn rustls_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = err.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    err.downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

fn tls_cause(e: &rustls::Error, cfg: &GoldmaneConfig) -> String {
    use rustls::CertificateError as C;
    let ca = cfg
        .ca_file
        .as_deref()
        .map_or_else(|| "?".to_string(), |p| p.display().to_string());
    let name = cfg.server_name.clone().unwrap_or_else(|| {
        target(cfg)
            .ok()
            .and_then(|(uri, _)| uri.parse::<http::Uri>().ok())
            .and_then(|u| u.host().map(str::to_string))
            .unwrap_or_default()
    });
    match e {
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => {
            format!("TLS: Goldmane's certificate is not valid for the name {name:?}")
        }
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "TLS: Goldmane's certificate has expired".to_string()
        }
        rustls::Error::InvalidCertificate(_) => format!(
            "TLS: Goldmane's certificate does not verify against the CA in TyphaCAFile ({ca})"
        ),
        rustls::Error::AlertReceived(_) => {
            "TLS: Goldmane refused the handshake (does it accept our TyphaCertFile?)".to_string()
        }
        _ => "TLS handshake with Goldmane failed".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::record::{Endpoint, EndpointKind, FlowKey, Reporter, Verdict};

    fn record(port: u16) -> FlowRecord {
        let ep = |name: &str| Endpoint {
            kind: EndpointKind::Workload,
            name: name.into(),
            namespace: "ns".into(),
            node: None,
        };
        FlowRecord {
            key: FlowKey {
                src: ep("a"),
                dst: ep("b"),
                proto: 6,
                dest_port: port,
                reporter: Reporter::Src,
                action: Verdict::Allow,
                trace: vec![],
            },
            start_time: 0,
            end_time: 1,
            packets_in: 0,
            packets_out: 0,
            bytes_in: 0,
            bytes_out: 0,
            connections_started: 0,
            connections_completed: 0,
            connections_live: 0,
        }
    }

    fn port_of(u: &FlowUpdate) -> i64 {
        u.flow
            .as_ref()
            .and_then(|f| f.key.as_ref())
            .map_or(-1, |k| k.dest_port)
    }

    /// A sink with no task behind it: the queue alone.
    fn sink(capacity: usize) -> (GoldmaneSink, Arc<Shared>) {
        let shared = Arc::new(Shared::new(capacity, "n"));
        let sink = GoldmaneSink {
            handle: Arc::new(SinkHandle {
                shared: shared.clone(),
            }),
        };
        (sink, shared)
    }

    #[test]
    fn the_queue_keeps_the_newest_and_counts_what_it_drops() {
        let (sink, shared) = sink(3);
        sink.publish(&[record(1), record(2)]);
        assert_eq!((sink.queued(), sink.dropped()), (2, 0));
        sink.publish(&[record(3), record(4), record(5)]);
        assert_eq!((sink.queued(), sink.dropped()), (3, 2));
        let ports: Vec<_> = shared.lock_queue().iter().map(port_of).collect();
        assert_eq!(ports, [3, 4, 5]);
        // One publish larger than the queue keeps its own newest.
        sink.publish(&(10..20).map(record).collect::<Vec<_>>());
        let ports: Vec<_> = shared.lock_queue().iter().map(port_of).collect();
        assert_eq!(ports, [17, 18, 19]);
        assert_eq!(sink.dropped(), 12);
        assert_eq!(sink.sent(), 0);
    }

    #[test]
    fn in_flight_flows_go_back_first_within_the_bound() {
        let (sink, shared) = sink(4);
        sink.publish(&[record(3), record(4)]);
        let mut task = Task {
            cfg: GoldmaneConfig::new("http://x:1", "n"),
            shared: shared.clone(),
            in_flight: [1, 2]
                .into_iter()
                .map(|p| FlowUpdate {
                    flow: Some(to_flow(&record(p), "n")),
                })
                .collect(),
            state: LinkState::Starting,
            backoff: Duration::from_secs(1),
        };
        task.requeue_in_flight();
        let ports: Vec<_> = shared.lock_queue().iter().map(port_of).collect();
        assert_eq!(ports, [1, 2, 3, 4]);
        task.in_flight = [0]
            .into_iter()
            .map(|p| FlowUpdate {
                flow: Some(to_flow(&record(p), "n")),
            })
            .collect();
        task.requeue_in_flight();
        let ports: Vec<_> = shared.lock_queue().iter().map(port_of).collect();
        assert_eq!(ports, [1, 2, 3, 4], "the oldest, just requeued, is dropped");
        assert_eq!(sink.dropped(), 1);
    }

    #[test]
    fn dropping_the_last_sink_closes() {
        let (sink, shared) = sink(1);
        let other = sink.clone();
        drop(sink);
        assert!(!shared.closed());
        drop(other);
        assert!(shared.closed());
    }

    #[test]
    fn plaintext_only_when_the_address_says_so() {
        let mut cfg = GoldmaneConfig::new("goldmane.calico-system.svc:7443", "n");
        let err = target(&cfg).map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("http://goldmane.calico-system.svc:7443"),
            "{err}"
        );
        cfg.address = "http://127.0.0.1:7443".into();
        assert_eq!(
            target(&cfg).ok(),
            Some(("http://127.0.0.1:7443".into(), false))
        );
        cfg.address = "https://g:7443".into();
        assert_eq!(target(&cfg).ok(), Some(("https://g:7443".into(), true)));
        cfg.address = "g:7443".into();
        cfg.ca_file = Some("/ca".into());
        assert_eq!(target(&cfg).ok(), Some(("https://g:7443".into(), true)));
        cfg.address = "dns:///g:7443".into();
        assert_eq!(target(&cfg).ok(), Some(("https://g:7443".into(), true)));
        cfg.address = "unix:///run/g.sock".into();
        assert!(target(&cfg).is_err());
        // TLS needs all three files, and says which is missing.
        cfg.address = "g:7443".into();
        let err = tls_files(&cfg).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("TyphaCertFile is not set"), "{err}");
    }

    #[test]
    fn config_keys_fill_the_exporter() {
        use crate::config::{resolve, RawValue, Source};
        let raw = |key: &str, value: &str| RawValue {
            key: key.into(),
            value: value.into(),
            source: Source::ConfigUpdate,
        };
        let defaults = resolve(Vec::new()).map(|r| r.config);
        assert_eq!(
            defaults
                .ok()
                .and_then(|c| GoldmaneConfig::from_config(&c, "n")),
            None
        );
        let config = resolve(vec![
            raw("FlowLogsGoldmaneServer", "goldmane:7443"),
            raw("TyphaCAFile", "/etc/ca.crt"),
            raw("typhacertfile", "/etc/tls.crt"),
            raw("TyphaKeyFile", "/etc/tls.key"),
        ])
        .map(|r| r.config);
        let want = GoldmaneConfig {
            ca_file: Some("/etc/ca.crt".into()),
            cert_file: Some("/etc/tls.crt".into()),
            key_file: Some("/etc/tls.key".into()),
            ..GoldmaneConfig::new("goldmane:7443", "node-a")
        };
        assert_eq!(
            config
                .ok()
                .and_then(|c| GoldmaneConfig::from_config(&c, "node-a")),
            Some(want)
        );
    }
}
