//! Transports that bring `ToDataplane` messages in — Felix's fd 3/4 pipes ([`felix`]), a JSON
//! stream on stdin or a unix socket ([`stream`]), a state document ([`state`]) — each feeding one
//! bounded channel. Does not interpret the messages.
//!
//! Every transport sends [`Received`] items: a decoded [`Update`] with its [`Origin`], or a
//! [`Rejected`] input (one bad line or frame, the stream goes on). Errors after which a stream
//! cannot go on (a truncated frame, an I/O error) end the transport and are returned by its task.
//! The channel is bounded ([`CHANNEL_CAPACITY`]): a consumer that falls behind slows the producer,
//! which for fd 3 is Felix itself (§1.2, natural back-pressure).

pub mod felix;
pub mod outbox;
pub mod state;
pub mod stream;

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use felix_api::frame::FrameError;
use felix_api::json::{self, JsonError};
use felix_api::{DecodeError, ToDataplane};

/// Capacity of a transport's channel. Small enough to push back on Felix quickly, large enough
/// to absorb a burst of IP set deltas between two applies.
pub const CHANNEL_CAPACITY: usize = 1024;

/// Where a message came from, for logs and error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Frame `index` (from 0) on Felix's fd 3.
    Frame { index: u64 },
    /// Line `line` (from 1) of a JSON stream (`stdin`, `unix:PATH#2` for the second client…).
    Line { stream: Arc<str>, line: u64 },
    /// Message `index` (from 0) of a state document's JSON array.
    Item { index: usize },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Origin::Frame { index } => write!(f, "fd 3 frame {index}"),
            Origin::Line { stream, line } => write!(f, "{stream} line {line}"),
            Origin::Item { index } => write!(f, "message {index}"),
        }
    }
}

/// One decoded message, where it came from and when it was read.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub origin: Origin,
    pub message: ToDataplane,
    /// When the transport had read it (before decoding): where the daemon's end-to-end
    /// latency of an update starts (the `apply` log line's `since_read_ms`).
    pub received: Instant,
}

impl Update {
    /// A message read just now.
    pub fn new(origin: Origin, message: ToDataplane) -> Update {
        Update {
            origin,
            message,
            received: Instant::now(),
        }
    }
}

/// Why one input was rejected.
#[derive(Debug, thiserror::Error)]
pub enum RejectReason {
    #[error(transparent)]
    Json(#[from] JsonError),
    #[error(transparent)]
    Protobuf(#[from] DecodeError),
    #[error("the line is not UTF-8")]
    NotUtf8,
    /// Longer than the input limit (`InputMaxMessageBytes`); dropped as it was read.
    #[error("{len} bytes, more than the limit of {max} (InputMaxMessageBytes): dropped unread")]
    TooLong { len: u64, max: u64 },
}

/// One input (line, frame, array element) that could not be decoded; the stream went on.
#[derive(Debug, thiserror::Error)]
#[error("rejected {origin}")]
pub struct Rejected {
    pub origin: Origin,
    #[source]
    pub reason: RejectReason,
}

/// What a transport sends down its channel.
pub type Received = Result<Update, Rejected>;

/// An error that ended a transport.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("file descriptor {fd} is not open: not started as Felix's external driver")]
    FdNotOpen {
        fd: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("reading Felix's messages on fd 3")]
    Frame(#[source] FrameError),
    #[error("writing a message to Felix on fd 4")]
    WriteFd4(#[source] std::io::Error),
    #[error("writing a message to standard output")]
    WriteStdout(#[source] std::io::Error),
    #[error("reading {stream}")]
    Read {
        stream: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} unix socket {}", path.display())]
    Socket {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown source `{0}`: expected `felix`, `stdin` or `unix:PATH`")]
    BadSpec(String),
    #[error("starting the {what} thread")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the transport's thread panicked")]
    Panicked,
}

/// A transport's reader, which returns how its stream ended.
///
/// A pipe (Felix's fd 3, a piped stdin) is read by a task on the runtime: the kernel wakes the
/// runtime's own thread, which reads, decodes and hands the message to the loop's task on the same
/// thread. A reader thread of its own adds a wake-up of a second, idle CPU to every update, which
/// on this kind of VM is 0.1–0.2 ms. Anything else (a regular file, a terminal) cannot
/// be polled and is read by a thread with blocking reads. A polled pipe is made non-blocking, a
/// flag its other holders (a parent that kept the read end) share: the agent owns its input.
pub enum Reader<T> {
    Task(tokio::task::JoinHandle<Result<T, SourceError>>),
    Thread(std::thread::JoinHandle<Result<T, SourceError>>),
}

impl<T: Send + 'static> Reader<T> {
    /// How the reader ended. Waits for it: call it once its channel has closed.
    pub async fn finish(self) -> Result<T, SourceError> {
        match self {
            Reader::Task(h) => h.await.map_err(|_| SourceError::Panicked)?,
            Reader::Thread(h) => tokio::task::spawn_blocking(move || h.join())
                .await
                .map_err(|_| SourceError::Panicked)?
                .map_err(|_| SourceError::Panicked)?,
        }
    }
}

/// What a transport reads from: a pipe the runtime polls, or anything else (a regular file, a
/// terminal), which only blocking reads can wait on.
enum Input {
    Pipe(tokio::net::unix::pipe::Receiver),
    Blocking(File),
}

/// `file` as an [`Input`]; a pipe is registered with the runtime (and made non-blocking).
fn input(file: File) -> std::io::Result<Input> {
    if file.metadata()?.file_type().is_fifo() {
        tokio::net::unix::pipe::Receiver::from_file(file).map(Input::Pipe)
    } else {
        Ok(Input::Blocking(file))
    }
}

/// Which transport `felix-nft run --source` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// Felix's pipes, fds 3 and 4.
    Felix,
    /// JSON lines on standard input.
    Stdin,
    /// JSON lines from clients of a unix socket created at this path.
    Unix(PathBuf),
}

impl std::str::FromStr for SourceSpec {
    type Err = SourceError;
    fn from_str(s: &str) -> Result<Self, SourceError> {
        match s {
            "felix" => Ok(SourceSpec::Felix),
            "stdin" | "-" => Ok(SourceSpec::Stdin),
            _ => match s.strip_prefix("unix:") {
                Some(path) if !path.is_empty() => Ok(SourceSpec::Unix(PathBuf::from(path))),
                _ => Err(SourceError::BadSpec(s.to_string())),
            },
        }
    }
}

/// Logs one decoded message: at info with its sequence number and kind when `trace_input`, else at
/// debug.
pub fn log_update(update: &Update, trace_input: bool) {
    let m = &update.message;
    if trace_input {
        tracing::info!(
            seq = m.sequence_number,
            kind = m.kind(),
            origin = %update.origin,
            "input"
        );
        tracing::debug!(seq = m.sequence_number, message = %json::encode(m), "input message");
    } else {
        tracing::debug!(
            seq = m.sequence_number,
            kind = m.kind(),
            origin = %update.origin,
            "input"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_specs() {
        assert_eq!("felix".parse::<SourceSpec>().unwrap(), SourceSpec::Felix);
        assert_eq!("stdin".parse::<SourceSpec>().unwrap(), SourceSpec::Stdin);
        assert_eq!(
            "unix:/run/x.sock".parse::<SourceSpec>().unwrap(),
            SourceSpec::Unix("/run/x.sock".into())
        );
        assert!(matches!(
            "unix:".parse::<SourceSpec>(),
            Err(SourceError::BadSpec(_))
        ));
        assert!(matches!(
            "tcp:1".parse::<SourceSpec>(),
            Err(SourceError::BadSpec(_))
        ));
    }
}
