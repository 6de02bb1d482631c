//! JSON stream transport: one `ToDataplane` in proto3 JSON per line, from standard
//! input or from the clients of a unix socket, each client served on its own task.
//!
//! A line that does not decode is sent down the channel as [`Rejected`] with its line number and
//! the field path at fault, and reading goes on. Blank lines are skipped (but counted, so line
//! numbers match an editor's). A line longer than the limit (`InputMaxMessageBytes`,
//! [`MAX_LINE_LEN`] by default) is rejected the same way without being buffered: what was read
//! of it is dropped as it arrives and reading resumes after its newline, so one client cannot
//! exhaust memory and the stream never stops silently.
//!
//! What the agent says back (`FromDataplane`: endpoint statuses, WireGuard keys, in-sync) goes
//! the same way, one JSON line per message in the input's field names: to standard output for
//! `stdin`, and to every client of the unix socket connected when it is written (a client
//! that half-closes its end keeps reading). Like fd 4's, the queue never blocks the loop:
//! statuses waiting are coalesced per endpoint, and a client that does not read loses lines
//! (counted in the log), never the agent's time.
//!
//! The unix socket is created with mode 0600 without a window in which it is reachable with
//! looser permissions: it is bound inside a fresh 0700 directory, chmodded, then renamed into
//! place (rename keeps the inode and its mode).

use std::fs::{self, File};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use super::outbox::{outbox, Outbox};
use super::{
    input, Input, Origin, Reader, Received, RejectReason, Rejected, SourceError, Update,
    CHANNEL_CAPACITY,
};
use felix_api::frame::BlockingRead;
use felix_api::{json, FromDataplane, ToDataplane};

/// The default longest line (64 MiB, the same bound as an fd 3 frame): an IP set update of
/// 1,000,000 IPv6 members with ports is about 57 MB of JSON.
pub const MAX_LINE_LEN: usize = 64 << 20;

/// What one stream carried.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LineSummary {
    /// Lines read, blank ones included.
    pub lines: u64,
    pub decoded: u64,
    pub rejected: u64,
    /// True when the consumer dropped its receiver before the end of the stream.
    pub consumer_gone: bool,
}

/// Reads JSON lines from `reader` into `tx` until EOF. `stream` names the source in origins
/// (`stdin`, `unix:/run/x.sock#3`); a line longer than `max_len` bytes is rejected unread.
pub async fn read_lines<R: AsyncRead + Unpin>(
    reader: R,
    stream: Arc<str>,
    tx: &mpsc::Sender<Received>,
    max_len: usize,
) -> Result<LineSummary, SourceError> {
    let mut reader = BufReader::new(reader);
    let mut summary = LineSummary::default();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = (&mut reader)
            .take(max_len as u64 + 1)
            .read_until(b'\n', &mut buf)
            .await
            .map_err(|source| read_error(&stream, source))?;
        if n == 0 {
            return Ok(summary);
        }
        let skipped = if over_long(&buf, max_len) {
            buf.clear();
            discard_line(&mut reader)
                .await
                .map_err(|source| read_error(&stream, source))?
        } else {
            0
        };
        let Some(item) = line_item(&buf, skipped, &stream, max_len, &mut summary) else {
            continue;
        };
        if tx.send(item).await.is_err() {
            summary.consumer_gone = true;
            return Ok(summary);
        }
    }
}

/// [`read_lines`] with blocking reads, for a thread of its own.
pub fn read_lines_blocking<R: std::io::Read + Unpin>(
    reader: R,
    stream: Arc<str>,
    tx: &mpsc::Sender<Received>,
    max_len: usize,
) -> Result<LineSummary, SourceError> {
    futures::executor::block_on(read_lines(BlockingRead(reader), stream, tx, max_len))
}

fn read_error(stream: &Arc<str>, source: std::io::Error) -> SourceError {
    SourceError::Read {
        stream: stream.to_string(),
        source,
    }
}

/// True when `buf`, read with a bound of `max_len + 1` bytes, holds the start of a longer line.
fn over_long(buf: &[u8], max_len: usize) -> bool {
    buf.len() > max_len && buf.last() != Some(&b'\n')
}

/// How much of `chunk` belongs to the current line (through its newline), and whether the line
/// ends in it.
fn through_newline(chunk: &[u8]) -> (usize, bool) {
    match chunk.iter().position(|&b| b == b'\n') {
        Some(i) => (i + 1, true),
        None => (chunk.len(), false),
    }
}

/// Reads and drops the rest of a line, through its newline or EOF, holding no more than the
/// reader's buffer; returns how many bytes were dropped.
async fn discard_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> std::io::Result<u64> {
    let mut dropped = 0u64;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(dropped);
        }
        let (n, done) = through_newline(chunk);
        reader.consume(n);
        dropped += n as u64;
        if done {
            return Ok(dropped);
        }
    }
}

/// One line read into `buf` (with its newline, if any), or, when `skipped` is not zero, the
/// first `max_len + 1` bytes of an over-long line of which `skipped` more were dropped unread:
/// counts it and decodes or rejects it. `None` for a blank line.
fn line_item(
    buf: &[u8],
    skipped: u64,
    stream: &Arc<str>,
    max_len: usize,
    summary: &mut LineSummary,
) -> Option<Received> {
    summary.lines += 1;
    let origin = Origin::Line {
        stream: stream.clone(),
        line: summary.lines,
    };
    let item = if skipped > 0 {
        Some(Err(Rejected {
            origin,
            reason: RejectReason::TooLong {
                len: max_len as u64 + 1 + skipped,
                max: max_len as u64,
            },
        }))
    } else {
        decode_line(buf, origin)
    };
    match &item {
        Some(Ok(_)) => summary.decoded += 1,
        Some(Err(_)) => summary.rejected += 1,
        None => {}
    }
    item
}

/// Decodes one line; `None` for a blank line.
pub fn decode_line(raw: &[u8], origin: Origin) -> Option<Received> {
    let received = std::time::Instant::now();
    let text = match std::str::from_utf8(raw) {
        Ok(t) => t.trim(),
        Err(_) => {
            return Some(Err(Rejected {
                origin,
                reason: RejectReason::NotUtf8,
            }))
        }
    };
    if text.is_empty() {
        return None;
    }
    Some(match json::decode::<ToDataplane>(text) {
        Ok(message) => Ok(Update {
            origin,
            message,
            received,
        }),
        Err(e) => Err(Rejected {
            origin,
            reason: RejectReason::Json(e),
        }),
    })
}

/// Reads JSON lines from standard input: on a task when stdin is a pipe, else on a thread of its
/// own with blocking reads (see [`Reader`]). Returns the channel of messages and the reader, which
/// ends at EOF, or when the receiver is dropped and the next line arrives. Needs a runtime.
pub fn spawn_stdin(
    max_len: usize,
) -> Result<(mpsc::Receiver<Received>, Reader<LineSummary>), SourceError> {
    let stream: Arc<str> = Arc::from("stdin");
    let stdin = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| read_error(&stream, source))?;
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let input = input(File::from(stdin)).map_err(|source| read_error(&stream, source))?;
    let reader = match input {
        Input::Pipe(pipe) => Reader::Task(tokio::spawn(async move {
            read_lines(pipe, stream, &tx, max_len).await
        })),
        Input::Blocking(file) => Reader::Thread(
            std::thread::Builder::new()
                .name("felix-nft-stdin".into())
                .spawn(move || read_lines_blocking(file, stream, &tx, max_len))
                .map_err(|source| SourceError::Spawn {
                    what: "stdin reader",
                    source,
                })?,
        ),
    };
    Ok((rx, reader))
}

/// Reads JSON lines from any reader on a task, with the default line limit; the task ends at EOF.
pub fn spawn_reader<R: AsyncRead + Unpin + Send + 'static>(
    reader: R,
    name: &str,
) -> (
    mpsc::Receiver<Received>,
    JoinHandle<Result<LineSummary, SourceError>>,
) {
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let stream: Arc<str> = Arc::from(name);
    let handle = tokio::spawn(async move { read_lines(reader, stream, &tx, MAX_LINE_LEN).await });
    (rx, handle)
}

/// How many reply lines a slow client may fall behind before it loses some.
const REPLY_BACKLOG: usize = 4096;

/// One message as the line written back: proto3 JSON, `sequence_number` counted per stream.
fn reply_line(mut msg: FromDataplane, seq: &mut u64) -> String {
    msg.sequence_number = *seq;
    *seq += 1;
    let mut line = json::encode(&msg);
    line.push('\n');
    line
}

/// Writes each `FromDataplane` pushed to the returned outbox as one JSON line to `output`
/// (standard output in `--source stdin` mode), flushing after each batch. Ends when every
/// outbox handle is dropped (`Ok(lines written)`) or a write fails (`Err`, logged once; later
/// messages are dropped).
pub fn spawn_json_writer<W: std::io::Write + Send + 'static>(
    output: W,
) -> Result<super::felix::Writer, SourceError> {
    let (tx, rx) = outbox();
    let handle = std::thread::Builder::new()
        .name("json-replies".into())
        .spawn(move || {
            let mut output = output;
            let mut seq = 0u64;
            while let Some(batch) = rx.blocking_take() {
                let lines: String = batch.into_iter().map(|m| reply_line(m, &mut seq)).collect();
                if let Err(e) = output
                    .write_all(lines.as_bytes())
                    .and_then(|()| output.flush())
                {
                    rx.break_off();
                    let e = SourceError::WriteStdout(e);
                    tracing::warn!(
                        error = %crate::ops::logging::chain(&e),
                        "standard output is closed: the agent's statuses are no longer written"
                    );
                    return Err(e);
                }
            }
            Ok(seq)
        })
        .map_err(|source| SourceError::Spawn {
            what: "JSON reply writer",
            source,
        })?;
    Ok((tx, handle))
}

/// A bound unix socket; the socket file is removed when this is dropped.
pub struct UnixSource {
    listener: UnixListener,
    path: PathBuf,
    max_len: usize,
    /// The reply lines every connected client is sent.
    replies: Option<broadcast::Sender<Arc<str>>>,
}

impl UnixSource {
    /// Creates the socket at `path` with mode 0600. A stale socket file (nobody listening) is
    /// replaced; a live one, or any other kind of file, is an error. Needs a tokio runtime.
    pub fn bind(path: &Path) -> Result<Self, SourceError> {
        let err = |op: &'static str| {
            let path = path.to_path_buf();
            move |source| SourceError::Socket { op, path, source }
        };
        let listener =
            crate::unixsock::bind_private(path).map_err(|(op, source)| err(op)(source))?;
        listener
            .set_nonblocking(true)
            .map_err(err("setting non-blocking"))?;
        let listener = UnixListener::from_std(listener).map_err(err("registering"))?;
        Ok(UnixSource {
            listener,
            path: path.to_path_buf(),
            max_len: MAX_LINE_LEN,
            replies: None,
        })
    }

    /// Sets the longest line accepted from a client (the default is [`MAX_LINE_LEN`]).
    pub fn with_max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// Sends each `FromDataplane` pushed to the returned outbox, as one JSON line, to every
    /// client connected when it is written; the forwarding task ends when every outbox handle
    /// is dropped. Needs a tokio runtime.
    pub fn with_replies(mut self) -> (Self, Outbox) {
        let (tx, rx) = outbox();
        let (lines, _) = broadcast::channel::<Arc<str>>(REPLY_BACKLOG);
        let out = lines.clone();
        tokio::spawn(async move {
            let mut seq = 0u64;
            while let Some(batch) = rx.take().await {
                for m in batch {
                    // No client connected: nobody to tell.
                    let _ = out.send(Arc::from(reply_line(m, &mut seq)));
                }
            }
        });
        self.replies = Some(lines);
        (self, tx)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves clients concurrently, each on a task of its own until its EOF, forever — until the
    /// receiver is dropped. One client's lines keep their order; lines of different clients
    /// interleave as they arrive. Line numbers restart for each client; origins read
    /// `unix:PATH#N` for the N-th client.
    pub async fn serve(self, tx: mpsc::Sender<Received>) -> Result<(), SourceError> {
        let mut client = 0u64;
        let mut clients = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                _ = tx.closed() => return Ok(()),
                // Reap finished clients so the set does not grow with every connection.
                Some(_) = clients.join_next(), if !clients.is_empty() => continue,
            };
            let (conn, _) = accepted.map_err(|source| SourceError::Socket {
                op: "accepting on",
                path: self.path.clone(),
                source,
            })?;
            client += 1;
            let name: Arc<str> = Arc::from(format!("unix:{}#{client}", self.path.display()));
            let tx = tx.clone();
            let max_len = self.max_len;
            let (conn, out) = conn.into_split();
            if let Some(lines) = &self.replies {
                tokio::spawn(write_replies(out, lines.subscribe(), name.clone()));
            }
            clients.spawn(async move {
                match read_lines(conn, name.clone(), &tx, max_len).await {
                    Ok(s) => tracing::debug!(stream = %name, lines = s.lines, "client done"),
                    // One client's failure (a reset) does not end the service.
                    Err(e) => tracing::warn!(
                        stream = %name,
                        error = %crate::ops::logging::chain(&e),
                        "client dropped"
                    ),
                }
            });
        }
    }

    /// Starts serving on a task.
    pub fn spawn(
        self,
    ) -> (
        mpsc::Receiver<Received>,
        JoinHandle<Result<(), SourceError>>,
    ) {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        (rx, tokio::spawn(self.serve(tx)))
    }
}

/// Writes the reply lines to one client until it goes away or the agent stops.
async fn write_replies(
    mut out: tokio::net::unix::OwnedWriteHalf,
    mut lines: broadcast::Receiver<Arc<str>>,
    name: Arc<str>,
) {
    loop {
        match lines.recv().await {
            Ok(line) => {
                if out.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(stream = %name, lost = n, "a client reads too slowly: reply lines dropped");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

impl Drop for UnixSource {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WITH_LONG_LINE: &[u8] =
        b"{\"in_sync\":{}}\n{\"ipset_remove\":{\"id\":\"aaaaaaaaaaaaaaaaaaaaaaaa\"}}\n{\"in_sync\":{}}";

    /// Line 2 is over the limit: rejected with its size, and line 3 is read.
    fn assert_long_line_skipped(s: LineSummary, rx: &mut mpsc::Receiver<Received>) {
        assert_eq!((s.lines, s.decoded, s.rejected), (3, 2, 1));
        assert!(rx.try_recv().unwrap().is_ok());
        let err = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(line_of(&err.origin), 2);
        assert!(
            matches!(err.reason, RejectReason::TooLong { len: 51, max: 20 }),
            "{:?}",
            err.reason
        );
        assert!(rx.try_recv().unwrap().is_ok());
    }

    #[tokio::test]
    async fn an_over_long_line_is_rejected_and_the_next_one_read() {
        let (tx, mut rx) = mpsc::channel(8);
        // A reader buffer smaller than the line: the rest is dropped chunk by chunk.
        let reader = tokio::io::BufReader::with_capacity(4, WITH_LONG_LINE);
        let s = read_lines(reader, Arc::from("t"), &tx, 20).await.unwrap();
        assert_long_line_skipped(s, &mut rx);
    }

    #[test]
    fn the_blocking_reader_rejects_an_over_long_line_too() {
        let (tx, mut rx) = mpsc::channel(8);
        let s = read_lines_blocking(WITH_LONG_LINE, Arc::from("t"), &tx, 20).unwrap();
        assert_long_line_skipped(s, &mut rx);
    }

    #[test]
    fn a_line_of_exactly_the_limit_is_accepted() {
        let (tx, mut rx) = mpsc::channel(8);
        let line = b"{\"in_sync\":{}}";
        let s = read_lines_blocking(&line[..], Arc::from("t"), &tx, line.len()).unwrap();
        assert_eq!((s.decoded, s.rejected), (1, 0));
        assert!(rx.try_recv().unwrap().is_ok());
    }

    #[test]
    fn blocking_reader_counts_and_delivers_like_the_async_one() {
        let (tx, mut rx) = mpsc::channel(8);
        let input = b"{\"in_sync\":{}}\n\nnot json\n{\"ipset_remove\":{\"id\":\"s:a\"}}";
        let s = read_lines_blocking(&input[..], Arc::from("t"), &tx, MAX_LINE_LEN).unwrap();
        assert_eq!((s.lines, s.decoded, s.rejected), (4, 2, 1));
        assert!(!s.consumer_gone);
        drop(tx);
        let lines: Vec<(u64, bool)> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|r| match r {
                Ok(u) => (line_of(&u.origin), true),
                Err(e) => (line_of(&e.origin), false),
            })
            .collect();
        assert_eq!(lines, vec![(1, true), (3, false), (4, true)]);
    }

    fn line_of(o: &Origin) -> u64 {
        match o {
            Origin::Line { line, .. } => *line,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn blank_and_non_utf8_lines() {
        let o = Origin::Line {
            stream: Arc::from("t"),
            line: 1,
        };
        assert!(decode_line(b"  \r\n", o.clone()).is_none());
        assert!(matches!(
            decode_line(b"\xff\n", o.clone()),
            Some(Err(Rejected {
                reason: RejectReason::NotUtf8,
                ..
            }))
        ));
        assert!(decode_line(b"{\"in_sync\":{}}\r\n", o).unwrap().is_ok());
    }
}
