//! Felix's external-driver pipes (reference §1.1–1.2): fd 3 carries `ToDataplane` frames from
//! Felix, fd 4 carries our `FromDataplane` frames back.
//!
//! fd 3 is read on its own OS thread with blocking reads: Felix writes synchronously from one
//! goroutine, so the pace at which we read is the pace at which Felix's calculation graph runs.
//! The thread hands each decoded message to a bounded channel with `blocking_send`, which keeps
//! that back-pressure intact. EOF between frames is Felix closing the pipe: a clean end.
//!
//! fd 4 is written by its own thread too, fed by a bounded channel: a slow Felix must never block
//! the task that owns dataplane state.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::thread::JoinHandle;

use tokio::sync::mpsc;

use super::{Origin, Received, RejectReason, Rejected, SourceError, Update, CHANNEL_CAPACITY};
use crate::proto::frame::{write_frame, FrameReader};
use crate::proto::{decode_to_dataplane, FromDataplane};

/// Felix → driver (reference §1.1).
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

/// The fd 3 reader: its channel of messages, and its thread (which returns how it ended).
pub type Reader = (
    mpsc::Receiver<Received>,
    JoinHandle<Result<ReadSummary, SourceError>>,
);

/// The fd 4 writer: the sender the dataplane reports on, and the thread (returns frames written).
pub type Writer = (
    mpsc::Sender<FromDataplane>,
    JoinHandle<Result<u64, SourceError>>,
);

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

/// Starts the fd 3 reader thread on `input`, returning the channel of messages and the thread.
/// The thread ends at EOF (clean: `Ok`), on a framing or I/O error (`Err`; the stream cannot be
/// resynchronised), or when the receiver is dropped.
pub fn spawn_reader<R: Read + Send + 'static>(input: R) -> Result<Reader, SourceError> {
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let handle = std::thread::Builder::new()
        .name("felix-fd3".into())
        .spawn(move || read_frames(input, tx))
        .map_err(|source| SourceError::Spawn {
            what: "fd 3 reader",
            source,
        })?;
    Ok((rx, handle))
}

fn read_frames<R: Read>(input: R, tx: mpsc::Sender<Received>) -> Result<ReadSummary, SourceError> {
    let mut frames = FrameReader::new(input);
    let mut summary = ReadSummary::default();
    loop {
        let index = frames.frames_read();
        let body = match frames.read_frame().map_err(SourceError::Frame)? {
            Some(body) => body,
            None => return Ok(summary),
        };
        summary.frames += 1;
        let origin = Origin::Frame { index };
        let received = std::time::Instant::now();
        let item = match decode_to_dataplane(&body) {
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
        };
        if tx.blocking_send(item).is_err() {
            summary.consumer_gone = true;
            return Ok(summary);
        }
    }
}

/// Starts the fd 4 writer thread: each `FromDataplane` sent to the returned channel is written
/// as one frame, with `sequence_number` assigned here (0, 1, 2, …; Felix ignores it, §1.2). The
/// thread ends when every sender is dropped (`Ok(frames written)`) or a write fails (`Err`:
/// Felix has gone, and will shut down — §1.1).
pub fn spawn_writer<W: Write + Send + 'static>(output: W) -> Result<Writer, SourceError> {
    let (tx, mut rx) = mpsc::channel::<FromDataplane>(CHANNEL_CAPACITY);
    let handle = std::thread::Builder::new()
        .name("felix-fd4".into())
        .spawn(move || {
            let mut output = output;
            let mut seq = 0u64;
            while let Some(mut msg) = rx.blocking_recv() {
                msg.sequence_number = seq;
                write_frame(&mut output, &msg).map_err(SourceError::WriteFd4)?;
                seq += 1;
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
    use crate::proto::frame::encode_frame;
    use crate::proto::{
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
        let (mut rx, h) = spawn_reader(std::io::Cursor::new(bytes)).unwrap();
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
        let (mut rx, h) = spawn_reader(std::io::Cursor::new(bytes)).unwrap();
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
            tx.blocking_send(FromDataplane {
                sequence_number: 99,
                payload: Some(from_dataplane::Payload::DataplaneInSync(DataplaneInSync {})),
            })
            .unwrap();
        }
        drop(tx);
        assert_eq!(h.join().unwrap().unwrap(), 3);
        let mut frames = FrameReader::new(r);
        for seq in 0..3 {
            let body = frames.read_frame().unwrap().unwrap();
            let m = crate::proto::decode_from_dataplane(&body).unwrap();
            assert_eq!(m.sequence_number, seq);
            assert_eq!(m.kind(), "dataplane_in_sync");
        }
        assert!(frames.read_frame().unwrap().is_none());
    }
}
