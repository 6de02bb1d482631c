//! Felix's external-driver pipes (§1.1–1.2): fd 3 carries `ToDataplane` frames from
//! Felix, fd 4 carries our `FromDataplane` frames back.
//!
//! fd 3 is read by a task on the runtime when it is a pipe (as Felix's is), by a thread of its own
//! otherwise (see [`Reader`]). Felix writes synchronously from one goroutine, so the pace at which
//! we read is the pace at which Felix's calculation graph runs: each decoded message goes to a
//! bounded channel, which keeps that back-pressure intact. EOF between frames is Felix closing
//! the pipe: a clean end.
//!
//! fd 4 is written by a thread of its own, fed by a bounded channel: a slow Felix must never block
//! the task that owns dataplane state.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::thread::JoinHandle;

use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use super::outbox::{outbox, Outbox};
use super::{
    Input, Origin, Reader, Received, RejectReason, Rejected, SourceError, Update, CHANNEL_CAPACITY,
};
use felix_api::decode_to_dataplane;
use felix_api::frame::{write_frame, AsyncFrameReader, BlockingRead};

/// Felix → driver (§1.1).
pub const FD_IN: RawFd = 3;
/// Driver → Felix.
pub const FD_OUT: RawFd = 4;

/// Whether `fd` is an open file descriptor of this process.
pub fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags; any integer is a valid argument.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Takes ownership of fds 3 and 4 as Felix passed them, marking them close-on-exec.
///
/// Call at most once per process, and before anything else opens a descriptor: if Felix did not
/// pass fds 3 and 4, the first files opened get those numbers and would be taken for Felix's
/// pipes. The returned files close the descriptors when dropped.
pub fn take_felix_fds() -> Result<(File, File), SourceError> {
    for fd in [FD_IN, FD_OUT] {
        // SAFETY: as above; F_SETFD with FD_CLOEXEC changes only this descriptor's flag.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
            return Err(SourceError::FdNotOpen {
                fd,
                source: std::io::Error::last_os_error(),
            });
        }
    }
    // SAFETY: both descriptors are open (checked above) and, per this function's contract,
    // owned by nothing else in this process: Felix handed them to us for exactly this use.
    let (input, output) = unsafe { (File::from_raw_fd(FD_IN), File::from_raw_fd(FD_OUT)) };
    Ok((input, output))
}

/// The fd 4 writer: the sender the dataplane reports on, and the thread (returns frames written).
pub type Writer = (Outbox, JoinHandle<Result<u64, SourceError>>);

/// What the fd 3 reader saw before it ended cleanly.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadSummary {
    /// Whole frames read.
    pub frames: u64,
    /// Frames whose envelope did not decode (sent down the channel as [`Rejected`]).
    pub rejected: u64,
    /// True when the consumer dropped its receiver before EOF.
    pub consumer_gone: bool,
}

/// Starts reading fd 3 (`input`): on a task when it is a pipe (Felix's always is), else on a
/// thread of its own with blocking reads (see [`Reader`]). Returns the channel of messages and the
/// reader, which ends at EOF (clean: `Ok`), on a framing or I/O error (`Err`; the stream cannot be
/// resynchronised; logged when it happens, not only when the run ends), or when the receiver is
/// dropped. A frame longer than `max_len` is such an error: skipping it would lose an update
/// Felix believes delivered. Needs a runtime.
pub fn spawn_fd3(
    input: File,
    max_len: u64,
) -> Result<(mpsc::Receiver<Received>, Reader<ReadSummary>), SourceError> {
    let read_error = |source| SourceError::Read {
        stream: "fd 3".into(),
        source,
    };
    match super::input(input).map_err(read_error)? {
        Input::Pipe(pipe) => {
            let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
            Ok((
                rx,
                Reader::Task(tokio::spawn(async move {
                    read_frames(pipe, tx, max_len).await.inspect_err(log_end)
                })),
            ))
        }
        Input::Blocking(file) => spawn_reader(file, max_len).map(|(rx, h)| (rx, Reader::Thread(h))),
    }
}

/// A reader thread's channel of messages, and the thread (which returns how it ended).
pub type ThreadReader = (
    mpsc::Receiver<Received>,
    JoinHandle<Result<ReadSummary, SourceError>>,
);

/// Starts a thread reading frames from `input` with blocking reads; see [`spawn_fd3`].
pub fn spawn_reader<R: Read + Unpin + Send + 'static>(
    input: R,
    max_len: u64,
) -> Result<ThreadReader, SourceError> {
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let handle = std::thread::Builder::new()
        .name("felix-fd3".into())
        .spawn(move || {
            futures::executor::block_on(read_frames(BlockingRead(input), tx, max_len))
                .inspect_err(log_end)
        })
        .map_err(|source| SourceError::Spawn {
            what: "fd 3 reader",
            source,
        })?;
    Ok((rx, handle))
}

/// The fd 3 reader ended on an error: said at once, since the run goes on until the loop sees
/// the end of its channel.
fn log_end(e: &SourceError) {
    tracing::error!(error = %crate::ops::logging::chain(e), "fd 3 input failed; no more updates can be read");
}

async fn read_frames<R: AsyncRead + Unpin>(
    input: R,
    tx: mpsc::Sender<Received>,
    max_len: u64,
) -> Result<ReadSummary, SourceError> {
    let mut frames = AsyncFrameReader::with_max_len(input, max_len);
    let mut summary = ReadSummary::default();
    loop {
        let index = frames.frames_read();
        let Some(body) = frames.read_frame().await.map_err(SourceError::Frame)? else {
            return Ok(summary);
        };
        if tx
            .send(frame_item(index, &body, &mut summary))
            .await
            .is_err()
        {
            summary.consumer_gone = true;
            return Ok(summary);
        }
    }
}

/// Frame `index`, just read, decoded and counted.
fn frame_item(index: u64, body: &[u8], summary: &mut ReadSummary) -> Received {
    summary.frames += 1;
    let origin = Origin::Frame { index };
    let received = std::time::Instant::now();
    match decode_to_dataplane(body) {
        Ok(message) => Ok(Update {
            origin,
            message,
            received,
        }),
        Err(e) => {
            summary.rejected += 1;
            Err(Rejected {
                origin,
                reason: RejectReason::Protobuf(e),
            })
        }
    }
}

/// Starts the fd 4 writer thread: each `FromDataplane` pushed to the returned [`Outbox`] is
/// written as one frame, with `sequence_number` assigned here (0, 1, 2, …; Felix ignores it,
/// §1.2). The outbox never blocks its pusher: while Felix is slow to read, statuses are coalesced
/// (see [`super::outbox`]). The thread ends when every outbox handle is dropped
/// (`Ok(frames written)`) or a write fails (`Err`, logged once when it happens: Felix has gone,
/// and will shut down — §1.1; later statuses are dropped).
pub fn spawn_writer<W: Write + Send + 'static>(output: W) -> Result<Writer, SourceError> {
    let (tx, rx) = outbox();
    let handle = std::thread::Builder::new()
        .name("felix-fd4".into())
        .spawn(move || {
            let mut output = output;
            let mut seq = 0u64;
            while let Some(batch) = rx.blocking_take() {
                for mut msg in batch {
                    msg.sequence_number = seq;
                    if let Err(e) = write_frame(&mut output, &msg) {
                        rx.break_off();
                        let e = SourceError::WriteFd4(e);
                        tracing::error!(
                            error = %crate::ops::logging::chain(&e),
                            "fd 4 is closed: no more statuses can be sent to Felix"
                        );
                        return Err(e);
                    }
                    seq += 1;
                }
            }
            Ok(seq)
        })
        .map_err(|source| SourceError::Spawn {
            what: "fd 4 writer",
            source,
        })?;
    Ok((tx, handle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_api::frame::{encode_frame, FrameReader, MAX_FRAME_LEN};
    use felix_api::{
        from_dataplane, to_dataplane, DataplaneInSync, FromDataplane, InSync, ToDataplane,
    };

    fn in_sync(seq: u64) -> ToDataplane {
        ToDataplane {
            sequence_number: seq,
            payload: Some(to_dataplane::Payload::InSync(InSync {})),
        }
    }

    #[test]
    fn reader_delivers_frames_and_rejects_a_bad_envelope_without_stopping() {
        let mut bytes = encode_frame(&in_sync(0));
        // A frame whose body is not a valid envelope (field 2, wire type 2, length past end).
        bytes.extend(3u64.to_le_bytes());
        bytes.extend([0x12, 0x7f, 0x00]);
        bytes.extend(encode_frame(&in_sync(2)));
        let (mut rx, h) = spawn_reader(std::io::Cursor::new(bytes), MAX_FRAME_LEN).unwrap();
        let a = rx.blocking_recv().unwrap().unwrap();
        assert_eq!(a.message, in_sync(0));
        assert_eq!(a.origin, Origin::Frame { index: 0 });
        let b = rx.blocking_recv().unwrap().unwrap_err();
        assert_eq!(b.origin, Origin::Frame { index: 1 });
        let c = rx.blocking_recv().unwrap().unwrap();
        assert_eq!(c.message, in_sync(2));
        assert!(rx.blocking_recv().is_none());
        let s = h.join().unwrap().unwrap();
        assert_eq!(
            s,
            ReadSummary {
                frames: 3,
                rejected: 1,
                consumer_gone: false
            }
        );
    }

    #[test]
    fn reader_ends_with_an_error_on_a_truncated_frame() {
        let mut bytes = encode_frame(&in_sync(0));
        bytes.extend(100u64.to_le_bytes());
        bytes.extend([0u8; 10]);
        let (mut rx, h) = spawn_reader(std::io::Cursor::new(bytes), MAX_FRAME_LEN).unwrap();
        assert!(rx.blocking_recv().unwrap().is_ok());
        assert!(rx.blocking_recv().is_none());
        let err = h.join().unwrap().unwrap_err();
        assert!(matches!(err, SourceError::Frame(_)), "{err}");
    }

    #[test]
    fn writer_frames_and_numbers_messages() {
        let (tx, h) = spawn_writer(Vec::new()).unwrap();
        drop(tx);
        assert_eq!(h.join().unwrap().unwrap(), 0);

        let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
        let (tx, h) = spawn_writer(w).unwrap();
        for _ in 0..3 {
            tx.push(FromDataplane {
                sequence_number: 99,
                payload: Some(from_dataplane::Payload::DataplaneInSync(DataplaneInSync {})),
            });
        }
        drop(tx);
        assert_eq!(h.join().unwrap().unwrap(), 3);
        let mut frames = FrameReader::new(r);
        for seq in 0..3 {
            let body = frames.read_frame().unwrap().unwrap();
            let m = felix_api::decode_from_dataplane(&body).unwrap();
            assert_eq!(m.sequence_number, seq);
            assert_eq!(m.kind(), "dataplane_in_sync");
        }
        assert!(frames.read_frame().unwrap().is_none());
    }

    #[tokio::test]
    async fn fd3_as_a_pipe_is_read_by_a_task_and_a_file_by_a_thread() {
        let bytes = [encode_frame(&in_sync(0)), encode_frame(&in_sync(1))].concat();
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the array with two new descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors are open and owned by nothing else: the files take them.
        let (read_end, mut write_end) =
            unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let (mut rx, reader) = spawn_fd3(read_end, MAX_FRAME_LEN).unwrap();
        assert!(matches!(reader, Reader::Task(_)));
        write_end.write_all(&bytes).unwrap();
        drop(write_end);
        for seq in 0..2 {
            assert_eq!(rx.recv().await.unwrap().unwrap().message, in_sync(seq));
        }
        assert!(rx.recv().await.is_none());
        assert_eq!(reader.finish().await.unwrap().frames, 2);

        let path = std::env::temp_dir().join(format!("felix-nft-fd3-{}", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (mut rx, reader) = spawn_fd3(file, MAX_FRAME_LEN).unwrap();
        assert!(matches!(reader, Reader::Thread(_)));
        for seq in 0..2 {
            assert_eq!(rx.recv().await.unwrap().unwrap().message, in_sync(seq));
        }
        assert!(rx.recv().await.is_none());
        assert_eq!(reader.finish().await.unwrap().frames, 2);
    }
}
