//! A Goldmane stand-in for the tests (shared the way `e2e_common` is: `mod goldmane_common;`):
//! tonic's server side with a codec that hands the test each `FlowUpdate`'s raw bytes, which
//! `protoc --decode=goldmane.FlowUpdate` reads against `tests/fixtures/goldmane.proto` (copied
//! from Goldmane's `api.proto`): what arrives is checked by a decoder nobody here wrote, not by
//! our prost types.
//!
//! Needs `protoc` (Debian `protobuf-compiler`); without it `protoc_decode` fails and says so.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Server, ServerTlsConfig};
use tonic::Status;

/// Passes a `FlowUpdate` through as bytes; a `FlowReceipt` is empty, zero bytes.
#[derive(Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = ();
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = ();
    type Error = Status;
    fn encode(&mut self, _: (), _: &mut EncodeBuf<'_>) -> Result<(), Status> {
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Forward each update to the test and acknowledge it, as Goldmane does.
    Ack,
    /// On the first stream: acknowledge `n` updates, then fail the stream on the next (which is
    /// forwarded, not acknowledged). Later streams acknowledge everything.
    ResetAfter(usize),
    /// Answer the call and never read a flow.
    NeverRead,
}

#[derive(Clone)]
pub struct StandIn {
    mode: Mode,
    got: mpsc::UnboundedSender<Bytes>,
    streams: Arc<AtomicUsize>,
    /// Streams the never-reading stand-in holds open.
    held: Arc<Mutex<Vec<tonic::Streaming<Bytes>>>>,
}

pub type ReceiptStream = Pin<Box<dyn futures::Stream<Item = Result<(), Status>> + Send>>;

impl StandIn {
    pub fn connect(&self, mut updates: tonic::Streaming<Bytes>) -> ReceiptStream {
        let first = self.streams.fetch_add(1, Ordering::SeqCst) == 0;
        let mode = self.mode;
        if let Mode::NeverRead = mode {
            self.held.lock().unwrap().push(updates);
            return futures::stream::pending().boxed();
        }
        let got = self.got.clone();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut n = 0;
            while let Some(Ok(bytes)) = updates.next().await {
                let _ = got.send(bytes);
                match mode {
                    Mode::ResetAfter(k) if first && n == k => {
                        let _ = tx.send(Err(Status::unavailable("stand-in reset")));
                        return;
                    }
                    _ => {
                        let _ = tx.send(Ok(()));
                    }
                }
                n += 1;
            }
        });
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) })
            .boxed()
    }
}

/// `FlowCollector.Connect` for tonic's router.
#[derive(Clone)]
pub struct ConnectMethod(StandIn);

impl tower_service::Service<tonic::Request<tonic::Streaming<Bytes>>> for ConnectMethod {
    type Response = tonic::Response<ReceiptStream>;
    type Error = Status;
    type Future = futures::future::Ready<Result<Self::Response, Status>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: tonic::Request<tonic::Streaming<Bytes>>) -> Self::Future {
        futures::future::ready(Ok(tonic::Response::new(self.0.connect(req.into_inner()))))
    }
}

impl tower_service::Service<http::Request<tonic::body::Body>> for StandIn {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let method = ConnectMethod(self.clone());
        Box::pin(async move {
            if req.uri().path() != "/goldmane.FlowCollector/Connect" {
                return Ok(Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            Ok(tonic::server::Grpc::new(RawCodec)
                .streaming(method, req)
                .await)
        })
    }
}

impl tonic::server::NamedService for StandIn {
    const NAME: &'static str = "goldmane.FlowCollector";
}

pub struct Running {
    pub addr: SocketAddr,
    pub got: mpsc::UnboundedReceiver<Bytes>,
    pub streams: Arc<AtomicUsize>,
    _stop: oneshot::Sender<()>,
}

/// Serves a stand-in on `listener`; `window` = the HTTP/2 stream window it grants.
pub async fn serve(
    listener: tokio::net::TcpListener,
    mode: Mode,
    tls: Option<ServerTlsConfig>,
    window: Option<u32>,
) -> Running {
    let addr = listener.local_addr().unwrap();
    let (got_tx, got) = mpsc::unbounded_channel();
    let streams = Arc::new(AtomicUsize::new(0));
    let svc = StandIn {
        mode,
        got: got_tx,
        streams: streams.clone(),
        held: Arc::default(),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let incoming = futures::stream::unfold(listener, |l| async move {
        let conn = l.accept().await.map(|(s, _)| s);
        Some((conn, l))
    });
    let mut builder = Server::builder().initial_stream_window_size(window);
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).unwrap();
    }
    let router = builder.add_service(svc);
    tokio::spawn(async move {
        let _ = router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await;
    });
    Running {
        addr,
        got,
        streams,
        _stop: stop,
    }
}

pub async fn stand_in(mode: Mode, tls: Option<ServerTlsConfig>, window: Option<u32>) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve(listener, mode, tls, window).await
}

pub fn fixtures() -> PathBuf {
    // The agent's fixtures, from its tests and from the lab's (which include this file).
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../felix-nft/tests/fixtures")
}

/// `protoc --decode=goldmane.FlowUpdate` of `bytes`.
pub fn protoc_decode(bytes: &[u8]) -> String {
    let mut child = Command::new("protoc")
        .arg(format!("--proto_path={}", fixtures().display()))
        .arg("--decode=goldmane.FlowUpdate")
        .arg("goldmane.proto")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("running protoc ({e}); install Debian's protobuf-compiler to run these tests")
        });
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "protoc --decode failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
