//! The local view of flow logs on a unix socket, both ends: [`FlowServer`] keeps the most
//! recent records in a bounded ring and serves them to local clients; [`FlowClient`] is what
//! `felix-nft flows` reads them with. The one part of [`super`] that does I/O, and only on its
//! own socket; it never waits on the agent.
//!
//! Protocol, one JSON document per line each way:
//!
//! ```text
//! client → {"follow": bool, "since": secs|null, "filter": {...}}      (query::Request)
//! server ← {FlowRecord} …  the ring's matching records, oldest first
//!        ← {FlowRecord} …  then, with follow, each new matching record as it is published
//!        ← {"lost": N}     (follow) N matching records were dropped before the next one
//!        ← {"error": "…"}  the request was refused; the connection closes
//! ```
//!
//! Without `follow` the server closes the connection after the listing. With it, the server
//! sends until the agent stops or the client closes its end; closing only its sending half
//! counts as going away, so a follower keeps its write side open.
//!
//! Invariants:
//! - [`FlowSink::publish`] never awaits and never waits on a client: each follower has a
//!   bounded queue filled with `try_send`, and a record a full queue cannot take is dropped for
//!   that client and counted (reported to it as a `lost` line, and in [`FlowSink::lost`]). The
//!   ring lock it takes is held by a client only to copy the ring's pointers.
//! - The socket is reachable by root only (the flows say who talks to whom): its directory is
//!   created 0700, and the socket is bound inside a fresh 0700 directory, set to 0600 and only
//!   then renamed into place, so there is no moment it exists with looser permissions.
//! - Bounded: the ring ([`FlowServerConfig::ring`] records), the request line
//!   ([`MAX_REQUEST_LEN`]), the time to send it ([`REQUEST_TIMEOUT`]), the clients
//!   ([`FlowServerConfig::max_clients`]; one more is sent an error line and closed) and each
//!   follower's queue ([`FOLLOW_QUEUE`]).

use std::collections::VecDeque;
use std::fs::{self, DirBuilder};
use std::future::Future;
use std::io::{self, BufRead, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use super::query::Request;
use super::record::FlowRecord;

/// Where the agent serves its flows unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/felix-nft/flows.sock";
/// Records kept for a client that connects later: about a minute of a busy node's flushes.
pub const DEFAULT_RING: usize = 10_000;
/// Clients served at once; a request is a few hundred bytes, so more means something is wrong.
pub const DEFAULT_MAX_CLIENTS: usize = 16;
/// The longest request line accepted, newline included.
pub const MAX_REQUEST_LEN: usize = 64 << 10;
/// A client that has not sent its request line within this is sent an error and closed, so a
/// silent connection does not hold a client slot.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Records queued for one follower before further ones are dropped for it.
pub const FOLLOW_QUEUE: usize = 1024;
/// The longest line the client accepts from the server: a record with a long trace is a few
/// KiB; anything near this is not a record.
const MAX_REPLY_LEN: usize = 1 << 20;
/// After a failed accept (out of file descriptors, say), wait this long before the next one
/// instead of spinning on the error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Failing to set up the flow socket.
#[derive(Debug, thiserror::Error)]
#[error("{op} the flow socket {}", .path.display())]
pub struct FlowServeError {
    op: &'static str,
    path: PathBuf,
    #[source]
    source: io::Error,
}

/// Where and how much to serve.
#[derive(Clone, Debug)]
pub struct FlowServerConfig {
    /// The socket's path ([`DEFAULT_SOCKET`]); its directory is created if missing.
    pub path: PathBuf,
    /// Records kept ([`DEFAULT_RING`]); the oldest goes when a new one comes.
    pub ring: usize,
    /// Clients served at once ([`DEFAULT_MAX_CLIENTS`]).
    pub max_clients: usize,
}

impl Default for FlowServerConfig {
    fn default() -> Self {
        FlowServerConfig {
            path: PathBuf::from(DEFAULT_SOCKET),
            ring: DEFAULT_RING,
            max_clients: DEFAULT_MAX_CLIENTS,
        }
    }
}

/// The bound flow socket, ready to [`FlowServer::run`]. The socket file is removed when the
/// server is dropped (at the end of `run`, or with its task).
pub struct FlowServer {
    listener: UnixListener,
    socket: SocketFile,
    shared: Arc<Shared>,
    max_clients: usize,
}

/// The publishing end: cheap to clone, usable from any thread, never blocks on a client.
#[derive(Clone)]
pub struct FlowSink {
    shared: Arc<Shared>,
}

/// What the sink and the client tasks share.
struct Shared {
    state: Mutex<State>,
    /// Records dropped for followers that did not keep up, over all of them.
    lost: AtomicU64,
}

struct State {
    ring: VecDeque<Arc<FlowRecord>>,
    capacity: usize,
    followers: Vec<Follower>,
}

/// A following client as the publisher sees it.
struct Follower {
    request: Request,
    tx: mpsc::Sender<Arc<FlowRecord>>,
    lost: Arc<AtomicU64>,
}

/// A following client as its task sees it.
struct Live {
    rx: mpsc::Receiver<Arc<FlowRecord>>,
    lost: Arc<AtomicU64>,
}

impl Shared {
    /// The state even if a holder panicked: every update leaves it consistent (a push and a pop
    /// of whole records), so the data is still good.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ring as it is now and, when following, a queue of every matching record published
    /// after it: taken under one lock, so nothing is missed or sent twice between them.
    fn subscribe(&self, request: &Request) -> (Vec<Arc<FlowRecord>>, Option<Live>) {
        let mut state = self.state();
        let listing = state.ring.iter().cloned().collect();
        let live = request.follow.then(|| {
            let (tx, rx) = mpsc::channel(FOLLOW_QUEUE);
            let lost = Arc::new(AtomicU64::new(0));
            state.followers.push(Follower {
                request: request.clone(),
                tx,
                lost: lost.clone(),
            });
            Live { rx, lost }
        });
        (listing, live)
    }
}

impl FlowSink {
    /// Adds one flush's records to the ring and queues each to the followers it matches. Never
    /// awaits and never waits on a client: a follower whose queue is full loses the record.
    pub fn publish(&self, records: Vec<FlowRecord>) {
        if records.is_empty() {
            return;
        }
        let records: Vec<Arc<FlowRecord>> = records.into_iter().map(Arc::new).collect();
        let mut dropped = 0u64;
        let mut gone = false;
        let mut state = self.shared.state();
        for record in records {
            for f in &state.followers {
                if !f.request.matches(&record) {
                    continue;
                }
                match f.tx.try_send(record.clone()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        f.lost.fetch_add(1, Ordering::Relaxed);
                        dropped += 1;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => gone = true,
                }
            }
            if state.capacity == 0 {
                continue;
            }
            if state.ring.len() == state.capacity {
                state.ring.pop_front();
            }
            state.ring.push_back(record);
        }
        if gone {
            state.followers.retain(|f| !f.tx.is_closed());
        }
        drop(state);
        if dropped > 0 {
            self.shared.lost.fetch_add(dropped, Ordering::Relaxed);
        }
    }

    /// Records dropped so far because a follower did not read them in time.
    pub fn lost(&self) -> u64 {
        self.shared.lost.load(Ordering::Relaxed)
    }

    /// Followers currently registered (a closed one is forgotten at the next publish).
    #[cfg(test)]
    fn followers(&self) -> usize {
        self.shared.state().followers.len()
    }
}

/// The socket file we bound, removed on drop unless another has replaced it since (a second
/// agent's, say: removing that would cut its clients off).
struct SocketFile {
    path: PathBuf,
    id: Option<(u64, u64)>,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = fs::symlink_metadata(&self.path)
            .is_ok_and(|m| self.id.is_none_or(|id| id == (m.dev(), m.ino())));
        if ours {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Binds a unix socket at `path` reachable by its owner only. Creates the directory (0700) if
/// missing; replaces a stale socket (nobody listening) and refuses a live one or any other
/// kind of file.
fn bind_private(
    path: &Path,
) -> Result<(std::os::unix::net::UnixListener, SocketFile), FlowServeError> {
    let err = |op: &'static str| {
        let path = path.to_path_buf();
        move |source| FlowServeError { op, path, source }
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&parent)
        .map_err(err("creating the directory of"))?;
    let listener = crate::unixsock::bind_private(path).map_err(|(op, source)| err(op)(source))?;
    // Rename keeps the inode: this identifies our socket until someone replaces it.
    let id = fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()));
    let socket = SocketFile {
        path: path.to_path_buf(),
        id,
    };
    listener
        .set_nonblocking(true)
        .map_err(err("setting non-blocking"))?;
    Ok((listener, socket))
}

impl FlowServer {
    /// Binds the socket now, so a problem is reported before the agent starts work. Needs a
    /// tokio runtime.
    pub fn bind(config: &FlowServerConfig) -> Result<FlowServer, FlowServeError> {
        let (listener, socket) = bind_private(&config.path)?;
        let listener = UnixListener::from_std(listener).map_err(|source| FlowServeError {
            op: "registering",
            path: config.path.clone(),
            source,
        })?;
        Ok(FlowServer {
            listener,
            socket,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    ring: VecDeque::with_capacity(config.ring.min(DEFAULT_RING)),
                    capacity: config.ring,
                    followers: Vec::new(),
                }),
                lost: AtomicU64::new(0),
            }),
            max_clients: config.max_clients,
        })
    }

    /// Binds and serves on a task of its own until `shutdown` completes.
    pub fn start(
        config: &FlowServerConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(FlowSink, JoinHandle<()>), FlowServeError> {
        let server = FlowServer::bind(config)?;
        let sink = server.sink();
        Ok((sink, tokio::spawn(server.run(shutdown))))
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.socket.path
    }

    /// A publishing handle; records published before [`FlowServer::run`] are kept too.
    pub fn sink(&self) -> FlowSink {
        FlowSink {
            shared: self.shared.clone(),
        }
    }

    /// Serves clients, each on a task of its own, until `shutdown` completes; then drops every
    /// client and removes the socket.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let slots = Arc::new(Semaphore::new(self.max_clients));
        let mut clients = JoinSet::new();
        let mut next_id = 0u64;
        tracing::info!(path = %self.path().display(), "serving flow logs");
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                // Reap finished clients so the set does not grow with every connection.
                Some(_) = clients.join_next(), if !clients.is_empty() => continue,
                a = self.listener.accept() => a,
            };
            let conn = match accepted {
                Ok((conn, _)) => conn,
                Err(e) => {
                    tracing::warn!(
                        path = %self.path().display(),
                        error = %e,
                        "accepting a flow client failed"
                    );
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            next_id += 1;
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(
                    client = next_id,
                    max_clients = self.max_clients,
                    "too many flow clients: refused"
                );
                let line = error_line(&format!(
                    "too many clients (the agent serves {} at once); try again later",
                    self.max_clients
                ));
                // A fresh socket's send buffer takes one short line without waiting; if it did
                // not, the client loses only the explanation.
                let _ = conn.try_write(line.as_bytes());
                continue;
            };
            let shared = self.shared.clone();
            clients.spawn(async move {
                serve_client(conn, &shared, next_id).await;
                drop(slot);
            });
        }
        // Aborting the tasks closes every connection; dropping `self` removes the socket.
        clients.shutdown().await;
        tracing::info!(path = %self.path().display(), "stopped serving flow logs");
    }
}

/// `{"error": "…"}` and a newline.
fn error_line(message: &str) -> String {
    let mut line = serde_json::json!({ "error": message }).to_string();
    line.push('\n');
    line
}

/// Why a client's request went unanswered; the text is its error line.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("the request line is longer than {MAX_REQUEST_LEN} bytes")]
    TooLong,
    #[error("no request line within {} s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
    #[error("the request line is not UTF-8")]
    NotUtf8,
    #[error(transparent)]
    Invalid(#[from] super::query::RequestError),
}

/// The request line; `None` when the client closed without sending anything.
async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
) -> Result<Option<Request>, Refusal> {
    let mut buf = Vec::new();
    // A read error is the client gone: nothing to answer.
    let n = reader
        .take(MAX_REQUEST_LEN as u64 + 1)
        .read_until(b'\n', &mut buf)
        .await
        .unwrap_or(0);
    if n == 0 {
        return Ok(None);
    }
    if buf.len() > MAX_REQUEST_LEN {
        return Err(Refusal::TooLong);
    }
    let text = std::str::from_utf8(&buf).map_err(|_| Refusal::NotUtf8)?;
    Request::parse(text.trim_end_matches(['\n', '\r']))
        .map(Some)
        .map_err(Refusal::Invalid)
}

/// One client: its request, the listing, then (following) new records until it goes away. An
/// error writing to it ends only its task.
async fn serve_client(conn: UnixStream, shared: &Shared, client: u64) {
    let (read, write) = conn.into_split();
    let mut read = BufReader::new(read);
    let mut out = BufWriter::new(write);
    let request = match tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut read)).await {
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => return,
        Ok(Err(refusal)) => return refuse(out, client, &refusal).await,
        Err(_) => return refuse(out, client, &Refusal::Timeout).await,
    };
    tracing::debug!(client, follow = request.follow, "flow client connected");
    let (listing, live) = shared.subscribe(&request);
    for record in listing.iter().filter(|r| request.matches(r)) {
        if write_json(&mut out, record.as_ref()).await.is_err() {
            return;
        }
    }
    if out.flush().await.is_err() {
        return;
    }
    let Some(Live { mut rx, lost }) = live else {
        let _ = out.shutdown().await;
        return;
    };
    let mut reported = 0u64;
    let mut scratch = [0u8; 512];
    loop {
        tokio::select! {
            record = rx.recv() => {
                // The sender lives as long as the shared state, which outlives this task.
                let Some(record) = record else { return };
                let now_lost = lost.load(Ordering::Relaxed);
                if now_lost > reported {
                    tracing::warn!(
                        client,
                        lost = now_lost - reported,
                        "a flow client reads too slowly: records dropped"
                    );
                    let line = serde_json::json!({ "lost": now_lost - reported });
                    reported = now_lost;
                    if write_json(&mut out, &line).await.is_err() {
                        return;
                    }
                }
                if write_json(&mut out, record.as_ref()).await.is_err() {
                    return;
                }
                if rx.is_empty() && out.flush().await.is_err() {
                    return;
                }
            }
            // A follower sends nothing more; its end closing is the only thing to notice.
            n = read.read(&mut scratch) => match n {
                Ok(0) | Err(_) => {
                    tracing::debug!(client, "flow client went away");
                    return;
                }
                Ok(_) => {}
            },
        }
    }
}

/// Sends the one error line and closes.
async fn refuse(mut out: BufWriter<OwnedWriteHalf>, client: u64, refusal: &Refusal) {
    let message = refusal.to_string();
    tracing::debug!(client, error = %message, "flow client's request refused");
    let _ = out.write_all(error_line(&message).as_bytes()).await;
    let _ = out.flush().await;
    let _ = out.shutdown().await;
}

/// One JSON line. Serialising a record cannot fail (its maps have no non-string keys); if it
/// ever did, the line is skipped rather than the client cut off.
async fn write_json<T: serde::Serialize + ?Sized>(
    out: &mut BufWriter<OwnedWriteHalf>,
    value: &T,
) -> io::Result<()> {
    let mut line = match serde_json::to_vec(value) {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %e, "a flow record did not serialise");
            return Ok(());
        }
    };
    line.push(b'\n');
    out.write_all(&line).await
}

/// What the server sent, other than a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A record that matched the request.
    Record(Box<FlowRecord>),
    /// This many matching records were dropped here because the client read too slowly.
    Lost(u64),
}

/// Reading flows from the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum FlowClientError {
    #[error(
        "no flow socket is served at {}: is the agent running with flow logs on? \
         (FlowLogsLocalReporter=Enabled or FlowLogsGoldmaneServer set)",
        .path.display()
    )]
    NotServed {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "permission denied on the flow socket {}: it is root only (flows say who talks to whom)",
        .path.display()
    )]
    PermissionDenied {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{op} the flow socket {}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("line {line} from the flow socket {} is not a flow record", .path.display())]
    Decode {
        path: PathBuf,
        line: u64,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "line {line} from the flow socket {} is longer than {MAX_REPLY_LEN} bytes",
        .path.display()
    )]
    TooLong { path: PathBuf, line: u64 },
    #[error("the agent refused the request: {message}")]
    Refused { message: String },
}

/// Why connecting to `path` failed, in the reader's terms: nobody serving (no file, or a stale
/// one), not allowed, or something else.
fn connect_error(path: &Path, source: io::Error) -> FlowClientError {
    let path = path.to_path_buf();
    match source.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            FlowClientError::NotServed { path, source }
        }
        io::ErrorKind::PermissionDenied => FlowClientError::PermissionDenied { path, source },
        _ => FlowClientError::Io {
            op: "connecting to",
            path,
            source,
        },
    }
}

/// A connection to the flow socket with its request sent; its replies are read with
/// [`FlowClient::next_reply`] or as an iterator. Blocking: `felix-nft flows` needs no runtime.
/// The connection stays open both ways until this is dropped, which is what keeps a follow
/// going.
pub struct FlowClient {
    reader: io::BufReader<std::os::unix::net::UnixStream>,
    path: PathBuf,
    line: u64,
    buf: Vec<u8>,
}

impl FlowClient {
    /// Connects to the socket at `path` and sends `request`.
    pub fn connect(path: &Path, request: &Request) -> Result<FlowClient, FlowClientError> {
        let stream =
            std::os::unix::net::UnixStream::connect(path).map_err(|e| connect_error(path, e))?;
        let send = |source| FlowClientError::Io {
            op: "sending the request to",
            path: path.to_path_buf(),
            source,
        };
        let mut line = serde_json::to_vec(request).map_err(|e| send(io::Error::other(e)))?;
        line.push(b'\n');
        let mut client = FlowClient {
            reader: io::BufReader::new(stream),
            path: path.to_path_buf(),
            line: 0,
            buf: Vec::new(),
        };
        if let Err(e) = client.reader.get_mut().write_all(&line) {
            // A server refusing at once (too many clients) writes its error line and closes
            // without reading the request: the line is still there to be read, and says more.
            return Err(match client.next_reply() {
                Err(refused @ FlowClientError::Refused { .. }) => refused,
                _ => send(e),
            });
        }
        Ok(client)
    }

    /// The next reply; `None` when the server closed the connection (the end of a listing, or
    /// the agent stopping while following). A refusal is [`FlowClientError::Refused`].
    pub fn next_reply(&mut self) -> Result<Option<Reply>, FlowClientError> {
        loop {
            self.buf.clear();
            let n = Read::take(&mut self.reader, MAX_REPLY_LEN as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|source| FlowClientError::Io {
                    op: "reading from",
                    path: self.path.clone(),
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            if self.buf.len() > MAX_REPLY_LEN {
                return Err(FlowClientError::TooLong {
                    path: self.path.clone(),
                    line: self.line,
                });
            }
            if self.buf.trim_ascii().is_empty() {
                continue;
            }
            return self.decode().map(Some);
        }
    }

    fn decode(&self) -> Result<Reply, FlowClientError> {
        let decode = |source| FlowClientError::Decode {
            path: self.path.clone(),
            line: self.line,
            source,
        };
        let value: serde_json::Value = serde_json::from_slice(&self.buf).map_err(decode)?;
        if let Some(e) = value.get("error") {
            let message = e.as_str().map_or_else(|| e.to_string(), str::to_string);
            return Err(FlowClientError::Refused {
                message: felix_api::clip::clip(message),
            });
        }
        if let Some(n) = value.get("lost").and_then(serde_json::Value::as_u64) {
            return Ok(Reply::Lost(n));
        }
        serde::Deserialize::deserialize(value)
            .map(|r| Reply::Record(Box::new(r)))
            .map_err(decode)
    }
}

impl Iterator for FlowClient {
    type Item = Result<Reply, FlowClientError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_reply().transpose()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use std::os::unix::net::UnixStream as StdStream;

    use super::*;
    use crate::flows::query::tests::{record, workload};
    use crate::flows::query::Filter;

    /// A record told apart by its port.
    fn flow(ns: &str, port: u16) -> FlowRecord {
        record(workload(ns, "web"), workload(ns, "db"), 6, port, vec![])
    }

    fn config(dir: &Path) -> FlowServerConfig {
        FlowServerConfig {
            path: dir.join("run").join("flows.sock"),
            ..FlowServerConfig::default()
        }
    }

    /// Reads a listing to its end with the client the CLI uses, off the runtime's threads.
    async fn list(path: &Path, request: Request) -> Result<Vec<Reply>, FlowClientError> {
        let path = path.to_path_buf();
        let read = tokio::task::spawn_blocking(move || {
            FlowClient::connect(&path, &request)?.collect::<Result<Vec<_>, _>>()
        });
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the listing ended")
            .expect("the reader did not panic")
    }

    fn ports(replies: &[Reply]) -> Vec<u16> {
        replies
            .iter()
            .map(|r| match r {
                Reply::Record(r) => r.key.dest_port,
                Reply::Lost(n) => panic!("{n} lost"),
            })
            .collect()
    }

    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting until {what}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_socket_is_root_only_and_removed_at_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (_sink, task) = FlowServer::start(&cfg, async {
            let _ = stopped.await;
        })
        .unwrap();
        let meta = fs::symlink_metadata(&cfg.path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let parent = fs::metadata(dir.path().join("run")).unwrap();
        assert_eq!(parent.permissions().mode() & 0o777, 0o700);
        // Nothing but the socket is left in the directory (no staging directory).
        let names: Vec<_> = fs::read_dir(dir.path().join("run")).unwrap().collect();
        assert_eq!(names.len(), 1);
        stop.send(()).unwrap();
        task.await.unwrap();
        assert!(!cfg.path.exists());
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_or_a_file_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        fs::create_dir(dir.path().join("run")).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&cfg.path).unwrap());
        let server = FlowServer::bind(&cfg).unwrap();
        let e = FlowServer::bind(&cfg).err().unwrap();
        assert!(e.to_string().contains("another process is serving"), "{e}");
        drop(server);
        assert!(!cfg.path.exists());
        fs::write(&cfg.path, "not a socket").unwrap();
        let e = FlowServer::bind(&cfg).err().unwrap();
        assert!(e.to_string().contains("non-socket"), "{e}");
        assert!(cfg.path.exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_filter_and_follow() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = FlowServerConfig {
            ring: 4,
            ..config(dir.path())
        };
        let (sink, _task) = FlowServer::start(&cfg, std::future::pending()).unwrap();
        // Published before anyone connects: kept in the ring, the oldest beyond 4 dropped.
        sink.publish((1..=5).map(|p| flow("prod", p)).collect());
        sink.publish(vec![flow("staging", 6)]);
        assert_eq!(
            ports(&list(&cfg.path, Request::default()).await.unwrap()),
            [3, 4, 5, 6]
        );
        let prod = Request {
            filter: Filter {
                namespace: Some("prod".into()),
                ..Filter::default()
            },
            ..Request::default()
        };
        assert_eq!(
            ports(&list(&cfg.path, prod.clone()).await.unwrap()),
            [3, 4, 5]
        );
        let port_4 = Request {
            filter: Filter {
                port: Some(4),
                ..Filter::default()
            },
            ..Request::default()
        };
        assert_eq!(ports(&list(&cfg.path, port_4).await.unwrap()), [4]);

        // Following: the listing, then what is published after, filtered.
        let (listed, listed_rx) = tokio::sync::oneshot::channel();
        let path = cfg.path.clone();
        let follower = tokio::task::spawn_blocking(move || {
            let mut client = FlowClient::connect(
                &path,
                &Request {
                    follow: true,
                    ..prod
                },
            )?;
            let mut got = Vec::new();
            for _ in 0..3 {
                got.extend(client.next_reply()?);
            }
            let _ = listed.send(());
            got.extend(client.next_reply()?);
            Ok::<_, FlowClientError>(got)
        });
        listed_rx.await.unwrap();
        sink.publish(vec![flow("staging", 7), flow("prod", 8)]);
        let got = tokio::time::timeout(Duration::from_secs(10), follower)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(ports(&got), [3, 4, 5, 8]);
        // Its end closed: forgotten at the next publish.
        until("the follower is gone", || {
            sink.publish(vec![flow("prod", 9)]);
            sink.followers() == 0
        })
        .await;
    }

    /// A follower that does not read costs the publisher nothing: 100,000 records go through
    /// `publish` while its socket is full, and every record is either delivered or reported
    /// lost to it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_never_reads_does_not_slow_publish() {
        const N: u16 = 50_000;
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let (sink, _task) = FlowServer::start(&cfg, std::future::pending()).unwrap();
        let path = cfg.path.clone();
        let follow = Request {
            follow: true,
            ..Request::default()
        };
        let mut client = tokio::task::spawn_blocking(move || FlowClient::connect(&path, &follow))
            .await
            .unwrap()
            .unwrap();
        until("the follower is registered", || sink.followers() == 1).await;
        let publisher = sink.clone();
        let publish = tokio::task::spawn_blocking(move || {
            for i in 0..2 * u32::from(N) {
                publisher.publish(vec![flow("prod", (i % u32::from(N)) as u16 + 1)]);
            }
        });
        tokio::time::timeout(Duration::from_secs(30), publish)
            .await
            .expect("publishing 100,000 records did not wait on the client")
            .unwrap();
        let lost = sink.lost();
        assert!(lost > 0);

        // Now it reads: every record published is either delivered or reported lost to it,
        // and after that it still gets what comes next.
        let (accounted, accounted_rx) = tokio::sync::oneshot::channel();
        let reader = tokio::task::spawn_blocking(move || {
            let (mut delivered, mut lost_seen) = (0u64, 0u64);
            let mut accounted = Some(accounted);
            while let Some(reply) = client.next_reply()? {
                match reply {
                    Reply::Lost(n) => lost_seen += n,
                    Reply::Record(r) if r.key.dest_port == 0 => break,
                    Reply::Record(_) => delivered += 1,
                }
                if delivered + lost_seen == 2 * u64::from(N) {
                    if let Some(tx) = accounted.take() {
                        let _ = tx.send(());
                    }
                }
            }
            Ok::<_, FlowClientError>((delivered, lost_seen))
        });
        tokio::time::timeout(Duration::from_secs(30), accounted_rx)
            .await
            .expect("every record delivered or reported lost")
            .unwrap();
        sink.publish(vec![flow("prod", 0)]);
        let (delivered, lost_seen) = tokio::time::timeout(Duration::from_secs(30), reader)
            .await
            .expect("the record published after the loss arrived")
            .unwrap()
            .unwrap();
        assert_eq!(lost_seen, lost);
        assert_eq!(delivered + lost, 2 * u64::from(N));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_request_gets_one_error_line_naming_field_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let (_sink, _task) = FlowServer::start(&cfg, std::future::pending()).unwrap();
        let path = cfg.path.clone();
        let answer = move |request: Vec<u8>| {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                let mut s = StdStream::connect(&path).unwrap();
                s.write_all(&request).unwrap();
                let mut answer = String::new();
                s.read_to_string(&mut answer).unwrap();
                answer
            })
        };
        let a = answer(b"{\"filter\":{\"verdict\":\"pass\"}}\n".to_vec())
            .await
            .unwrap();
        assert_eq!(a.lines().count(), 1, "{a}");
        let v: serde_json::Value = serde_json::from_str(&a).unwrap();
        let e = v["error"].as_str().unwrap();
        assert!(
            e.contains("`filter.verdict`") && e.contains("`pass`"),
            "{e}"
        );

        let a = answer(vec![b'x'; MAX_REQUEST_LEN + 10]).await.unwrap();
        assert!(a.contains("longer than 65536 bytes"), "{a}");
        assert_eq!(a.lines().count(), 1, "{a}");

        // The client the CLI uses turns the line into its error.
        let request = Request {
            filter: Filter {
                pod: Some(String::new()),
                ..Filter::default()
            },
            ..Request::default()
        };
        match list(&cfg.path, request).await {
            Err(FlowClientError::Refused { message }) => {
                assert!(message.contains("`filter.pod`"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// A silent client is told why and closed, freeing its slot.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_sends_no_request_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let (_sink, _task) = FlowServer::start(&cfg, std::future::pending()).unwrap();
        let mut silent = UnixStream::connect(&cfg.path).await.unwrap();
        let mut answer = String::new();
        silent.read_to_string(&mut answer).await.unwrap();
        assert!(answer.contains("no request line within 10 s"), "{answer}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clients_beyond_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = FlowServerConfig {
            max_clients: 1,
            ..config(dir.path())
        };
        let (sink, _task) = FlowServer::start(&cfg, std::future::pending()).unwrap();
        let mut first = StdStream::connect(&cfg.path).unwrap();
        first.write_all(b"{\"follow\":true}\n").unwrap();
        until("the first client follows", || sink.followers() == 1).await;
        match list(&cfg.path, Request::default()).await {
            Err(FlowClientError::Refused { message }) => {
                assert!(message.contains("too many clients"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        drop(first);
        until("the slot is free again", || {
            sink.publish(vec![flow("prod", 1)]);
            sink.followers() == 0
        })
        .await;
        // The slot is given back when the task ends, just after it forgets its queue.
        let mut listed = None;
        for _ in 0..100 {
            match list(&cfg.path, Request::default()).await {
                Ok(r) => {
                    listed = Some(r);
                    break;
                }
                Err(FlowClientError::Refused { .. }) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(!listed.expect("served again").is_empty());
    }

    #[test]
    fn connect_errors_say_what_they_mean() {
        let path = Path::new("/run/felix-nft/flows.sock");
        let e = connect_error(path, io::Error::from(io::ErrorKind::PermissionDenied));
        let text = e.to_string();
        assert!(matches!(e, FlowClientError::PermissionDenied { .. }));
        assert!(
            text.contains(DEFAULT_SOCKET) && text.contains("root only"),
            "{text}"
        );
        for kind in [io::ErrorKind::NotFound, io::ErrorKind::ConnectionRefused] {
            let text = connect_error(path, io::Error::from(kind)).to_string();
            assert!(text.contains(DEFAULT_SOCKET), "{text}");
            assert!(
                text.contains("is the agent running with flow logs on?"),
                "{text}"
            );
        }
    }
}
