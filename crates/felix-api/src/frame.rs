//! Felix's external-driver framing (§1.2): each message, in either direction, is
//!
//! ```text
//! +--------------------------------+------------------------------------+
//! | length: u64, little-endian (8) | protobuf envelope (length bytes)   |
//! +--------------------------------+------------------------------------+
//! ```
//!
//! Felix → driver envelopes are `felix.ToDataplane` (fd 3); driver → Felix are
//! `felix.FromDataplane` (fd 4). This module only cuts and joins frames (over blocking
//! `Read`/`Write`, or an `AsyncRead`); decoding the envelope is the caller's (see
//! [`super::decode_to_dataplane`]).
//!
//! A length above the reader's limit (`InputMaxMessageBytes`, [`MAX_FRAME_LEN`] by default) is
//! refused before anything is allocated: a corrupt or
//! misaligned stream must fail clearly, not ask for an exabyte. A stream that ends inside a frame
//! is an error; one that ends exactly between frames is the clean end.

use std::io::{self, ErrorKind, Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

/// The default largest frame (64 MiB). Felix's biggest messages are IP set snapshots; a
/// million IPv6 members is well under this.
pub const MAX_FRAME_LEN: u64 = 64 << 20;

/// Size of the length prefix.
pub const HEADER_LEN: usize = 8;

/// Why a frame could not be read. `index` counts frames from 0 on this stream.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("reading frame {index}")]
    Io {
        index: u64,
        #[source]
        source: io::Error,
    },
    #[error(
        "stream ended inside the length prefix of frame {index} ({got} of {HEADER_LEN} bytes)"
    )]
    TruncatedHeader { index: u64, got: usize },
    #[error("stream ended inside frame {index}: {got} of {len} bytes")]
    TruncatedBody { index: u64, len: u64, got: usize },
    #[error(
        "frame {index} claims {len} bytes, more than the limit of {max} (InputMaxMessageBytes)"
    )]
    TooLong { index: u64, len: u64, max: u64 },
}

/// Where a stream of frames is: how many were read, and the size limit. The blocking and the
/// async reader share it, so both judge a header and a body the same way.
struct Position {
    index: u64,
    max_len: u64,
}

impl Position {
    /// The body length a header announces, of which `got` bytes arrived; `Ok(None)` at a clean
    /// end of stream (nothing arrived).
    fn header(&self, header: [u8; HEADER_LEN], got: usize) -> Result<Option<usize>, FrameError> {
        let index = self.index;
        if got == 0 {
            return Ok(None);
        }
        if got < HEADER_LEN {
            return Err(FrameError::TruncatedHeader { index, got });
        }
        let len = u64::from_le_bytes(header);
        if len > self.max_len {
            let max = self.max_len;
            return Err(FrameError::TooLong { index, len, max });
        }
        usize::try_from(len)
            .map(Some)
            .map_err(|_| FrameError::TooLong {
                index,
                len,
                max: usize::MAX as u64,
            })
    }

    /// The body, of which `got` bytes arrived.
    fn body(&mut self, body: Vec<u8>, got: usize) -> Result<Vec<u8>, FrameError> {
        if got < body.len() {
            let (index, len) = (self.index, body.len() as u64);
            return Err(FrameError::TruncatedBody { index, len, got });
        }
        self.index += 1;
        Ok(body)
    }

    fn io(&self, source: io::Error) -> FrameError {
        FrameError::Io {
            index: self.index,
            source,
        }
    }
}

/// Read buffer: many small frames arriving in one pipe read cost one syscall.
const BUFFER: usize = 64 * 1024;

/// Reads frames from a byte stream with blocking reads: the async reader over [`BlockingRead`],
/// driven on the calling thread, so that one parser serves both kinds of stream.
pub struct FrameReader<R>(AsyncFrameReader<BlockingRead<R>>);

impl<R: Read + Unpin> FrameReader<R> {
    /// A reader enforcing [`MAX_FRAME_LEN`].
    pub fn new(inner: R) -> Self {
        Self::with_max_len(inner, MAX_FRAME_LEN)
    }

    /// A reader with another size limit.
    pub fn with_max_len(inner: R, max_len: u64) -> Self {
        FrameReader(AsyncFrameReader::with_max_len(BlockingRead(inner), max_len))
    }

    /// How many whole frames have been read.
    pub fn frames_read(&self) -> u64 {
        self.0.frames_read()
    }

    /// The next frame's body; `Ok(None)` at a clean end of stream (EOF between frames).
    pub fn read_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        futures::executor::block_on(self.0.read_frame())
    }
}

/// A blocking reader as an [`AsyncRead`] that is always ready: each poll reads, blocking the
/// thread. It lets a thread with blocking reads run the same async read loop as a task on the
/// runtime (under `futures::executor::block_on`), so each loop is written once.
pub struct BlockingRead<R>(pub R);

impl<R: Read + Unpin> AsyncRead for BlockingRead<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let inner = &mut self.get_mut().0;
        loop {
            match inner.read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Reads frames from an async stream (fd 3 as a pipe the runtime polls). Buffered.
pub struct AsyncFrameReader<R> {
    inner: tokio::io::BufReader<R>,
    at: Position,
}

impl<R: AsyncRead + Unpin> AsyncFrameReader<R> {
    /// A reader enforcing [`MAX_FRAME_LEN`].
    pub fn new(inner: R) -> Self {
        Self::with_max_len(inner, MAX_FRAME_LEN)
    }

    /// A reader with another size limit.
    pub fn with_max_len(inner: R, max_len: u64) -> Self {
        AsyncFrameReader {
            inner: tokio::io::BufReader::with_capacity(BUFFER, inner),
            at: Position { index: 0, max_len },
        }
    }

    /// How many whole frames have been read.
    pub fn frames_read(&self) -> u64 {
        self.at.index
    }

    /// The next frame's body; `Ok(None)` at a clean end of stream (EOF between frames).
    pub async fn read_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let mut header = [0u8; HEADER_LEN];
        let got = read_full(&mut self.inner, &mut header)
            .await
            .map_err(|e| self.at.io(e))?;
        let Some(len) = self.at.header(header, got)? else {
            return Ok(None);
        };
        let mut body = vec![0u8; len];
        let got = read_full(&mut self.inner, &mut body)
            .await
            .map_err(|e| self.at.io(e))?;
        self.at.body(body, got).map(Some)
    }
}

/// Fills `buf` unless the stream ends first; returns how many bytes were read. Unlike
/// `read_exact`, says how far it got, so a truncation can be reported precisely.
async fn read_full<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]).await {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Encodes `msg` as one frame (length prefix + protobuf).
pub fn encode_frame<M: Message>(msg: &M) -> Vec<u8> {
    let len = msg.encoded_len();
    let mut out = Vec::with_capacity(HEADER_LEN + len);
    out.extend_from_slice(&(len as u64).to_le_bytes());
    // Encoding into a Vec only fails for lack of capacity, which `reserve` rules out.
    out.reserve(len);
    if msg.encode(&mut out).is_err() {
        unreachable!("a Vec with reserved capacity always has room for the encoding");
    }
    out
}

/// Writes `msg` as one frame with a single `write_all`, then flushes.
pub fn write_frame<W: Write, M: Message>(w: &mut W, msg: &M) -> io::Result<()> {
    w.write_all(&encode_frame(msg))?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IpSetRemove, ToDataplane};

    fn msg(seq: u64) -> ToDataplane {
        ToDataplane {
            sequence_number: seq,
            payload: Some(crate::to_dataplane::Payload::IpsetRemove(IpSetRemove {
                id: format!("s:{seq}"),
            })),
        }
    }

    #[test]
    fn many_frames_in_one_buffer_then_clean_eof() {
        let mut bytes = Vec::new();
        for seq in 0..100 {
            bytes.extend(encode_frame(&msg(seq)));
        }
        let mut r = FrameReader::new(&bytes[..]);
        for seq in 0..100 {
            let body = r.read_frame().unwrap().unwrap();
            assert_eq!(crate::decode_to_dataplane(&body).unwrap(), msg(seq));
        }
        assert!(r.read_frame().unwrap().is_none());
        assert_eq!(r.frames_read(), 100);
    }

    #[test]
    fn empty_frame_is_an_empty_envelope() {
        let bytes = 0u64.to_le_bytes();
        let mut r = FrameReader::new(&bytes[..]);
        assert_eq!(r.read_frame().unwrap(), Some(vec![]));
    }

    #[test]
    fn truncated_header_and_body_are_errors() {
        let frame = encode_frame(&msg(7));
        let err = FrameReader::new(&frame[..5]).read_frame().unwrap_err();
        assert!(
            matches!(err, FrameError::TruncatedHeader { index: 0, got: 5 }),
            "{err}"
        );

        let cut = frame.len() - 3;
        let err = FrameReader::new(&frame[..cut]).read_frame().unwrap_err();
        match err {
            FrameError::TruncatedBody { index: 0, len, got } => {
                assert_eq!(len as usize, frame.len() - HEADER_LEN);
                assert_eq!(got, cut - HEADER_LEN);
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn oversize_length_is_refused_before_reading() {
        let mut bytes = (MAX_FRAME_LEN + 1).to_le_bytes().to_vec();
        bytes.extend([0u8; 16]);
        let err = FrameReader::new(&bytes[..]).read_frame().unwrap_err();
        assert!(
            matches!(err, FrameError::TooLong { index: 0, len, .. } if len == MAX_FRAME_LEN + 1)
        );
        assert!(err.to_string().contains("limit"), "{err}");

        let bytes = u64::MAX.to_le_bytes();
        assert!(matches!(
            FrameReader::new(&bytes[..]).read_frame(),
            Err(FrameError::TooLong { .. })
        ));
    }

    #[test]
    fn error_names_the_frame_index() {
        let mut bytes = encode_frame(&msg(1));
        bytes.extend(encode_frame(&msg(2)));
        bytes.extend([1, 2, 3]);
        let mut r = FrameReader::new(&bytes[..]);
        r.read_frame().unwrap();
        r.read_frame().unwrap();
        let err = r.read_frame().unwrap_err();
        assert!(
            matches!(err, FrameError::TruncatedHeader { index: 2, got: 3 }),
            "{err}"
        );
    }

    /// A reader that hands out one byte per call: frames split across reads still decode.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0[0];
            self.0 = &self.0[1..];
            Ok(1)
        }
    }

    #[test]
    fn frames_split_across_reads() {
        let mut bytes = encode_frame(&msg(1));
        bytes.extend(encode_frame(&msg(2)));
        let mut r = FrameReader::new(Trickle(&bytes));
        assert_eq!(
            crate::decode_to_dataplane(&r.read_frame().unwrap().unwrap()).unwrap(),
            msg(1)
        );
        assert_eq!(
            crate::decode_to_dataplane(&r.read_frame().unwrap().unwrap()).unwrap(),
            msg(2)
        );
        assert!(r.read_frame().unwrap().is_none());
    }

    /// Every frame (or error) of `bytes`, as a comparable string, up to the end or first error.
    fn cut_blocking(bytes: &[u8]) -> Vec<String> {
        let mut r = FrameReader::new(Trickle(bytes));
        let mut out = Vec::new();
        loop {
            match r.read_frame() {
                Ok(Some(b)) => out.push(format!("{b:?}")),
                Ok(None) => return out,
                Err(e) => {
                    out.push(e.to_string());
                    return out;
                }
            }
        }
    }

    async fn cut_async(bytes: &[u8]) -> Vec<String> {
        // Small reads from the mock: frames and headers split across reads, as from a pipe.
        let mut mock = chunks(bytes);
        let mut r = AsyncFrameReader::new(&mut mock);
        let mut out = Vec::new();
        loop {
            match r.read_frame().await {
                Ok(Some(b)) => out.push(format!("{b:?}")),
                Ok(None) => return out,
                Err(e) => {
                    out.push(e.to_string());
                    return out;
                }
            }
        }
    }

    /// An async reader handing out `bytes` three at a time.
    fn chunks(bytes: &[u8]) -> impl AsyncRead + Unpin + '_ {
        struct Chunks<'a>(&'a [u8]);
        impl AsyncRead for Chunks<'_> {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                let n = self.0.len().min(3).min(buf.remaining());
                buf.put_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                std::task::Poll::Ready(Ok(()))
            }
        }
        Chunks(bytes)
    }

    #[tokio::test]
    async fn the_async_reader_cuts_and_fails_as_the_blocking_one() {
        let two = [encode_frame(&msg(1)), encode_frame(&msg(2))].concat();
        let mut oversize = two.clone();
        oversize.extend((MAX_FRAME_LEN + 1).to_le_bytes());
        let cases: Vec<Vec<u8>> = vec![
            two.clone(),
            0u64.to_le_bytes().to_vec(),
            two[..two.len() - 3].to_vec(),
            [&two[..], &[1, 2, 3][..]].concat(),
            oversize,
            vec![],
        ];
        for bytes in cases {
            let want = cut_blocking(&bytes);
            assert!(!want.is_empty() || bytes.is_empty());
            assert_eq!(cut_async(&bytes).await, want, "{bytes:?}");
        }
    }
}
