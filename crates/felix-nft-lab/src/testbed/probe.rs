//! Probes and listeners that run inside a given network namespace and tell a flow that passed
//! from one that was dropped or refused, with real sockets.
//!
//! A socket belongs to the namespace of the thread that created it, so every probe and listener
//! creates its socket inside [`NetNs::run`] (the thread enters, creates, leaves at once) and then
//! uses it from wherever it is; each listener serves from a dedicated thread. All calls block:
//! from async code use `tokio::task::spawn_blocking`.
//!
//! Verdicts:
//! - [`Verdict::Pass`]: TCP handshake completed / UDP payload echoed back / ICMP echo reply.
//! - [`Verdict::Drop`]: no answer before the timeout (a DROP rule anywhere on the path), or a
//!   send refused with EPERM by a DROP in the sender's own output path.
//! - [`Verdict::Refused`]: TCP RST or ICMP port unreachable — the packet reached a host with no
//!   listener (or a REJECT rule answered); for a [`LongFlow`], the connection was reset.
//! - [`Verdict::Unreachable`]: ICMP host/net unreachable or administratively prohibited.
//!
//! Timeouts should be short (300–500 ms): within one namespace topology a passing flow answers
//! in well under a millisecond once ARP is resolved, so the timeout only bounds how long an
//! expected drop takes. [`run_matrix`] runs flows in parallel, so a matrix costs about one timeout.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::TestbedError;
use rtnl::netns::NetNs;

/// A timeout that suits an expected drop: short, but well above a real answer's latency.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(400);
/// The payload UDP and long-flow probes send and expect echoed.
const PAYLOAD: &[u8] = b"felix-nft probe";
/// How often listener threads look at their stop flag.
const POLL: Duration = Duration::from_millis(20);

/// What happened to a probe (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The flow went through and was answered.
    Pass,
    /// No answer within the timeout (or a local DROP failed the send with EPERM).
    Drop,
    /// TCP RST / ICMP port unreachable: delivered, but nobody listens (or a REJECT answered).
    Refused,
    /// ICMP host/net unreachable or administratively prohibited.
    Unreachable,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::Drop => "drop",
            Verdict::Refused => "refused",
            Verdict::Unreachable => "unreachable",
        })
    }
}

/// Transport of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// A TCP handshake ([`tcp_connect`]).
    Tcp,
    /// A UDP datagram echoed by an [`UdpEchoServer`] ([`udp_request`]).
    Udp,
    /// ICMP echo (ICMPv6 echo for IPv6 destinations); the port is ignored.
    Icmp,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Icmp => "icmp",
        })
    }
}

/// Maps a socket error to a verdict; `None` for errors that are not an answer from the network.
fn verdict_of(e: &io::Error) -> Option<Verdict> {
    match e.kind() {
        ErrorKind::TimedOut | ErrorKind::WouldBlock => return Some(Verdict::Drop),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            return Some(Verdict::Refused)
        }
        _ => {}
    }
    match e.raw_os_error() {
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => Some(Verdict::Unreachable),
        // A DROP in the sender's own output path (e.g. host endpoint rules when probing from the
        // host namespace) fails the send at once with EPERM.
        Some(libc::EPERM) => Some(Verdict::Drop),
        _ => None,
    }
}

fn classify(op: &'static str, r: io::Result<Verdict>) -> Result<Verdict, TestbedError> {
    match r {
        Ok(v) => Ok(v),
        Err(e) => verdict_of(&e).ok_or(TestbedError::Io { op, source: e }),
    }
}

/// TCP connect from `ns` to `dst`: Pass when the handshake completes within `timeout`.
pub fn tcp_connect(
    ns: &NetNs,
    dst: SocketAddr,
    timeout: Duration,
) -> Result<Verdict, TestbedError> {
    let sock = socket_in(ns, dst, Type::STREAM, Protocol::TCP)?;
    let r = sock.connect_timeout(&dst.into(), timeout);
    classify("TCP probe", r.map(|()| Verdict::Pass))
}

/// A socket for talking to `dst`, created inside `ns` (the thread enters and leaves again).
fn socket_in(
    ns: &NetNs,
    dst: SocketAddr,
    ty: Type,
    proto: Protocol,
) -> Result<Socket, TestbedError> {
    let r = ns.run(|| Socket::new(Domain::for_address(dst), ty, Some(proto)))?;
    r.map_err(|source| TestbedError::Io {
        op: "opening probe socket",
        source,
    })
}

/// UDP request/response from `ns` to `dst`: Pass when the payload comes back (an
/// [`UdpEchoServer`] must listen there).
pub fn udp_request(
    ns: &NetNs,
    dst: SocketAddr,
    timeout: Duration,
) -> Result<Verdict, TestbedError> {
    let sock: UdpSocket = socket_in(ns, dst, Type::DGRAM, Protocol::UDP)?.into();
    let exchange = || -> io::Result<Verdict> {
        sock.connect(dst)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.send(PAYLOAD)?;
        let mut buf = [0u8; 512];
        until_reply(
            timeout,
            |left| sock.set_read_timeout(Some(left)),
            || {
                let n = sock.recv(&mut buf)?;
                Ok(&buf[..n] == PAYLOAD)
            },
        )
    };
    classify("UDP probe", exchange())
}

/// Receives (`recv_ours` says whether what came is our reply) until our reply comes, Pass, or
/// `timeout` has passed, Drop; `set_timeout` shortens the socket's read timeout to what is left
/// so that others' packets cannot stretch the wait.
fn until_reply(
    timeout: Duration,
    set_timeout: impl Fn(Duration) -> io::Result<()>,
    mut recv_ours: impl FnMut() -> io::Result<bool>,
) -> io::Result<Verdict> {
    let deadline = Instant::now() + timeout;
    loop {
        if recv_ours()? {
            return Ok(Verdict::Pass);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Verdict::Drop);
        }
        set_timeout(left)?;
    }
}

/// ICMP echo from `ns` to `dst` over a datagram ICMP socket (the kernel fills in the identifier
/// and checksum and delivers only our replies). The namespace must allow ping sockets
/// (`net.ipv4.ping_group_range`; the topology sets it in every namespace it makes).
pub fn icmp_echo(ns: &NetNs, dst: IpAddr, timeout: Duration) -> Result<Verdict, TestbedError> {
    let (domain, proto, request, reply) = match dst {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, 8u8, 0u8),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, 128u8, 129u8),
    };
    let sock = ns
        .run(|| Socket::new(domain, Type::DGRAM, Some(proto)))?
        .map_err(|source| TestbedError::Io {
            op: "opening ICMP datagram socket (EACCES: net.ipv4.ping_group_range excludes us)",
            source,
        })?;
    let seq: u16 = 1;
    let exchange = || -> io::Result<Verdict> {
        sock.connect(&SocketAddr::new(dst, 0).into())?;
        sock.set_read_timeout(Some(timeout))?;
        // type, code, checksum (kernel), identifier (kernel), sequence, payload.
        let mut pkt = vec![request, 0, 0, 0, 0, 0];
        pkt.extend_from_slice(&seq.to_be_bytes());
        pkt.extend_from_slice(PAYLOAD);
        sock.send(&pkt)?;
        let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
        until_reply(
            timeout,
            |left| sock.set_read_timeout(Some(left)),
            || {
                let n = sock.recv(&mut buf)?;
                // SAFETY: recv initialised the first n bytes.
                let got: Vec<u8> = buf[..n]
                    .iter()
                    .map(|b| unsafe { b.assume_init() })
                    .collect();
                Ok(got.len() >= 8 && got[0] == reply && got[6..8] == seq.to_be_bytes())
            },
        )
    };
    classify("ICMP probe", exchange())
}

/// One probe of any protocol (`port` is ignored for ICMP).
pub fn probe(
    ns: &NetNs,
    proto: Proto,
    dst: IpAddr,
    port: u16,
    timeout: Duration,
) -> Result<Verdict, TestbedError> {
    match proto {
        Proto::Tcp => tcp_connect(ns, SocketAddr::new(dst, port), timeout),
        Proto::Udp => udp_request(ns, SocketAddr::new(dst, port), timeout),
        Proto::Icmp => icmp_echo(ns, dst, timeout),
    }
}

/// Binds `[::]:port` (both families) in `ns`, or `0.0.0.0:port` when the namespace has no IPv6.
fn bind_dual<T>(
    ns: &NetNs,
    port: u16,
    bind: impl Fn(SocketAddr) -> io::Result<T>,
) -> Result<T, TestbedError> {
    let r = ns.run(|| match bind((Ipv6Addr::UNSPECIFIED, port).into()) {
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            bind((Ipv4Addr::UNSPECIFIED, port).into())
        }
        other => other,
    })?;
    r.map_err(|source| TestbedError::Io {
        op: "binding listener",
        source,
    })
}

/// An IPv4 peer arrives on a dual-stack socket as `::ffff:a.b.c.d`; report it as IPv4.
fn unmap(peer: SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => peer,
        },
        v4 => v4,
    }
}

/// State shared by a listener and its threads.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    peers: Mutex<Vec<SocketAddr>>,
}

impl Shared {
    fn record(&self, peer: SocketAddr) {
        if let Ok(mut p) = self.peers.lock() {
            p.push(unmap(peer));
        }
    }

    fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Waits until at least `n` peers are recorded (a client's connect returns when the kernel
    /// completes the handshake, a moment before the server thread accepts).
    fn wait_peers(&self, n: usize, timeout: Duration) -> Vec<SocketAddr> {
        self.wait_until(|p| p.len() >= n, timeout)
    }

    /// Waits until every address in `ips` has been seen as a peer (flows may run concurrently,
    /// so a count says nothing about which peer arrived first).
    fn wait_peers_from(&self, ips: &[IpAddr], timeout: Duration) -> Vec<SocketAddr> {
        self.wait_until(
            |p| ips.iter().all(|ip| p.iter().any(|a| a.ip() == *ip)),
            timeout,
        )
    }

    fn wait_until(
        &self,
        done: impl Fn(&[SocketAddr]) -> bool,
        timeout: Duration,
    ) -> Vec<SocketAddr> {
        let deadline = Instant::now() + timeout;
        loop {
            let p = self.peers();
            if done(&p) || Instant::now() >= deadline {
                return p;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Waits up to [`POLL`] for `fd` to become readable (so listener threads answer at once but
/// still look at their stop flag regularly).
fn wait_readable(fd: &impl std::os::fd::AsRawFd) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, POLL.as_millis() as libc::c_int) };
}

/// A server thread in a namespace that records each peer's address (what a NAT test checks),
/// until dropped. `K` says what it serves: see [`TcpServer`] and [`UdpEchoServer`].
#[derive(Debug)]
pub struct Server<K> {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    port: u16,
    kind: PhantomData<K>,
}

/// What a [`TcpServer`] serves: TCP, echoing what each connection sends.
#[derive(Debug)]
pub enum TcpEcho {}

/// What a [`UdpEchoServer`] serves: UDP, echoing each datagram.
#[derive(Debug)]
pub enum UdpEcho {}

/// A TCP listener in a namespace that accepts every connection and echoes what it reads, until
/// dropped.
pub type TcpServer = Server<TcpEcho>;

/// A UDP echo server in a namespace, until dropped.
pub type UdpEchoServer = Server<UdpEcho>;

impl<K> Server<K> {
    /// Runs `serve` on a thread named `name`, handing it the state the server shares with it;
    /// `op` names the spawn in an error.
    fn spawn(
        port: u16,
        name: String,
        op: &'static str,
        serve: impl FnOnce(Arc<Shared>) + Send + 'static,
    ) -> Result<Server<K>, TestbedError> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || serve(s))
            .map_err(|source| TestbedError::Io { op, source })?;
        Ok(Server {
            shared,
            thread: Some(thread),
            port,
            kind: PhantomData,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Source addresses of every connection accepted or datagram received so far (IPv4-mapped
    /// shown as IPv4).
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.shared.peers()
    }

    /// [`Self::peers`], once at least `n` are known or `timeout` has passed.
    pub fn wait_peers(&self, n: usize, timeout: Duration) -> Vec<SocketAddr> {
        self.shared.wait_peers(n, timeout)
    }

    /// [`Self::peers`], once every address in `ips` is among them or `timeout` has passed.
    pub fn wait_peers_from(&self, ips: &[IpAddr], timeout: Duration) -> Vec<SocketAddr> {
        self.shared.wait_peers_from(ips, timeout)
    }
}

impl<K> Drop for Server<K> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl TcpServer {
    /// Starts listening on port `port` (all addresses, both families) inside `ns`.
    pub fn start(ns: &NetNs, port: u16) -> Result<TcpServer, TestbedError> {
        let listener = bind_dual(ns, port, TcpListener::bind)?;
        listener
            .set_nonblocking(true)
            .map_err(|source| TestbedError::Io {
                op: "configuring listener",
                source,
            })?;
        Server::spawn(
            port,
            format!("tcp-server-{port}"),
            "spawning TCP server thread",
            move |s| accept_loop(listener, s),
        )
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                shared.record(peer);
                let s = shared.clone();
                conns.push(std::thread::spawn(move || echo_conn(stream, s)));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => wait_readable(&listener),
            Err(e) => {
                tracing::debug!(error = %e, "test bed TCP accept failed");
                std::thread::sleep(POLL);
            }
        }
    }
    for c in conns {
        let _ = c.join();
    }
}

fn echo_conn(mut stream: TcpStream, shared: Arc<Shared>) {
    if stream.set_nonblocking(false).is_err() || stream.set_read_timeout(Some(POLL)).is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    while !shared.stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

impl UdpEchoServer {
    /// Starts echoing datagrams on port `port` (all addresses, both families) inside `ns`.
    pub fn start(ns: &NetNs, port: u16) -> Result<UdpEchoServer, TestbedError> {
        let sock = bind_dual(ns, port, UdpSocket::bind)?;
        sock.set_read_timeout(Some(POLL))
            .map_err(|source| TestbedError::Io {
                op: "configuring UDP server",
                source,
            })?;
        Server::spawn(
            port,
            format!("udp-echo-{port}"),
            "spawning UDP server thread",
            move |s| {
                let mut buf = [0u8; 2048];
                while !s.stop.load(Ordering::Relaxed) {
                    if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                        s.record(peer);
                        let _ = sock.send_to(&buf[..n], peer);
                    }
                }
            },
        )
    }
}

/// A TCP connection kept open so it can be probed again later (e.g. across an agent restart:
/// established flows must keep going). Talks to a [`TcpServer`].
#[derive(Debug)]
pub struct LongFlow {
    stream: TcpStream,
    dst: SocketAddr,
}

impl LongFlow {
    /// Connects from `ns` to `dst` and checks one echo round trip. Fails unless the flow passes.
    pub fn open(ns: &NetNs, dst: SocketAddr, timeout: Duration) -> Result<LongFlow, TestbedError> {
        let sock = socket_in(ns, dst, Type::STREAM, Protocol::TCP)?;
        sock.connect_timeout(&dst.into(), timeout)
            .map_err(|source| TestbedError::Io {
                op: "opening long-lived TCP flow",
                source,
            })?;
        let mut flow = LongFlow {
            stream: sock.into(),
            dst,
        };
        match flow.check(timeout)? {
            Verdict::Pass => Ok(flow),
            v => Err(TestbedError::Spec(format!(
                "long-lived flow to {dst} connected but its first echo was {v}"
            ))),
        }
    }

    /// Sends a payload on the open connection and waits for the echo: Pass, Drop (no echo in
    /// time; the connection stays usable for a later check), or Refused (reset/closed).
    pub fn check(&mut self, timeout: Duration) -> Result<Verdict, TestbedError> {
        let stream = &mut self.stream;
        let mut exchange = || -> io::Result<Verdict> {
            stream.set_read_timeout(Some(timeout))?;
            stream.write_all(PAYLOAD)?;
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            let deadline = Instant::now() + timeout;
            while got.len() < PAYLOAD.len() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Verdict::Drop);
                }
                stream.set_read_timeout(Some(left))?;
                match stream.read(&mut buf)? {
                    0 => return Ok(Verdict::Refused),
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
            // A late echo of an earlier (dropped) check may arrive first; any whole echo counts.
            Ok(if got.ends_with(PAYLOAD) {
                Verdict::Pass
            } else {
                Verdict::Drop
            })
        };
        classify("long-lived flow check", exchange())
    }

    /// Where the flow goes.
    pub fn dst(&self) -> SocketAddr {
        self.dst
    }

    /// The local (source) address of the connection.
    pub fn local(&self) -> Option<SocketAddr> {
        self.stream.local_addr().ok()
    }
}

/// One flow of a matrix: from a namespace to an address, with the verdict expected.
#[derive(Debug)]
pub struct Flow<'a> {
    /// Label of the source (e.g. the workload name).
    pub from: String,
    pub ns: &'a NetNs,
    /// Label of the destination.
    pub to: String,
    pub dst: IpAddr,
    pub proto: Proto,
    /// Ignored for ICMP.
    pub port: u16,
    pub expect: Verdict,
}

impl Flow<'_> {
    fn describe(&self) -> String {
        match self.proto {
            Proto::Icmp => format!("{} → {} {} icmp", self.from, self.to, self.dst),
            p => format!("{} → {} {} {p}/{}", self.from, self.to, self.dst, self.port),
        }
    }
}

/// Result of one flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowResult {
    /// `from → to dst proto/port`.
    pub flow: String,
    pub expect: Verdict,
    /// The verdict, or the text of the error that prevented the probe.
    pub got: Result<Verdict, String>,
}

impl FlowResult {
    /// True when the probe ran and its verdict is the expected one.
    pub fn matches(&self) -> bool {
        self.got.as_ref() == Ok(&self.expect)
    }
}

/// The results of [`run_matrix`], printable as a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixReport {
    pub results: Vec<FlowResult>,
    /// Wall time of the whole matrix.
    pub elapsed: Duration,
}

impl MatrixReport {
    /// The flows whose verdict differs from the expected one (or that could not be probed).
    pub fn mismatches(&self) -> Vec<&FlowResult> {
        self.results.iter().filter(|r| !r.matches()).collect()
    }

    /// True when every flow matched.
    pub fn all_match(&self) -> bool {
        self.results.iter().all(FlowResult::matches)
    }
}

impl fmt::Display for MatrixReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.results.iter().map(|r| r.flow.chars().count()).max();
        let width = width.unwrap_or(0).max(4);
        writeln!(f, "{:<width$}  {:<11}  {:<11}", "flow", "expected", "got")?;
        for r in &self.results {
            let got = match &r.got {
                Ok(v) => v.to_string(),
                Err(e) => format!("error: {e}"),
            };
            let mark = if r.matches() { "" } else { "  ✗ MISMATCH" };
            writeln!(
                f,
                "{:<width$}  {:<11}  {:<11}{mark}",
                r.flow,
                r.expect.to_string(),
                got
            )?;
        }
        write!(
            f,
            "{} flows, {} mismatches, {} ms",
            self.results.len(),
            self.mismatches().len(),
            self.elapsed.as_millis()
        )
    }
}

/// Runs every flow at once (one thread each) with `timeout` per probe and returns the matrix in
/// the order given. Listeners must already run at the destinations.
pub fn run_matrix(flows: &[Flow<'_>], timeout: Duration) -> MatrixReport {
    let start = Instant::now();
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = flows
            .iter()
            .map(|fl| {
                scope.spawn(move || {
                    probe(fl.ns, fl.proto, fl.dst, fl.port, timeout).map_err(|e| {
                        let mut text = e.to_string();
                        let mut src = std::error::Error::source(&e);
                        while let Some(s) = src {
                            text.push_str(&format!(": {s}"));
                            src = s.source();
                        }
                        text
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(flows)
            .map(|(h, fl)| FlowResult {
                flow: fl.describe(),
                expect: fl.expect,
                got: h
                    .join()
                    .unwrap_or_else(|_| Err("probe thread panicked".to_string())),
            })
            .collect()
    });
    MatrixReport {
        results,
        elapsed: start.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_errors_map_to_verdicts() {
        let e = |k: ErrorKind| io::Error::from(k);
        assert_eq!(verdict_of(&e(ErrorKind::TimedOut)), Some(Verdict::Drop));
        assert_eq!(verdict_of(&e(ErrorKind::WouldBlock)), Some(Verdict::Drop));
        assert_eq!(
            verdict_of(&e(ErrorKind::ConnectionRefused)),
            Some(Verdict::Refused)
        );
        assert_eq!(
            verdict_of(&io::Error::from_raw_os_error(libc::EHOSTUNREACH)),
            Some(Verdict::Unreachable)
        );
        assert_eq!(verdict_of(&e(ErrorKind::AddrInUse)), None);
    }

    #[test]
    fn mapped_peers_are_reported_as_ipv4() {
        let p: SocketAddr = "[::ffff:192.0.2.1]:5".parse().unwrap();
        assert_eq!(unmap(p), "192.0.2.1:5".parse::<SocketAddr>().unwrap());
        let p6: SocketAddr = "[2001:db8::1]:5".parse().unwrap();
        assert_eq!(unmap(p6), p6);
    }

    #[test]
    fn report_marks_mismatches() {
        let r = MatrixReport {
            results: vec![
                FlowResult {
                    flow: "a → b tcp/80".into(),
                    expect: Verdict::Pass,
                    got: Ok(Verdict::Pass),
                },
                FlowResult {
                    flow: "a → b tcp/81".into(),
                    expect: Verdict::Drop,
                    got: Ok(Verdict::Pass),
                },
            ],
            elapsed: Duration::from_millis(3),
        };
        assert_eq!(r.mismatches().len(), 1);
        let text = r.to_string();
        assert!(text.contains("MISMATCH"), "{text}");
        assert!(text.ends_with("2 flows, 1 mismatches, 3 ms"), "{text}");
    }
}
