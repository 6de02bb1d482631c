//! Pipelined rtnetlink writes: already-built requests sent many to a datagram on a plain blocking
//! socket, each answer matched to its request by sequence number.
//!
//! The kernel handles a datagram's messages one after the other inside `sendmsg`, answers every
//! request that fails with a NACK, and acknowledges a request that succeeds only when it asked
//! (`NLM_F_ACK`). So only the last request of a datagram asks: its answer comes after every
//! answer of the requests before it, and a request before it that got no NACK succeeded. A
//! datagram of many requests costs one `sendmsg` and one answer to queue and read (an ACK per
//! request costs the kernel an skb each, a third of the work of a neighbour write); the requests
//! are otherwise byte for byte what the `rtnetlink` handle sends (same `netlink_packet_route`
//! message, same flags).
//!
//! Bounds: a datagram holds at most [`MAX_DATAGRAM`] bytes and at most as many requests as the
//! socket's receive buffer holds answers (an answer the kernel cannot queue is dropped, and the
//! socket reports `ENOBUFS`); the answers of one datagram are read before the next is sent.

use std::io;
use std::ops::Range;

use netlink_packet_core::{
    ErrorBuffer, ErrorMessage, NetlinkMessage, Parseable, NLM_F_ACK, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr};

use netlink_wire::{messages_with_seq, NLMSG_ERROR};

/// Most bytes of requests in one datagram.
pub const MAX_DATAGRAM: usize = 64 * 1024;

/// The receive buffer a batch socket asks for (the kernel doubles it, and caps it at
/// `net.core.rmem_max`).
pub const RCVBUF: usize = 1024 * 1024;

/// What one queued answer costs the receive buffer, at most: a small skb's truesize (an ACK
/// with `NETLINK_CAP_ACK` carries no copy of the request) with room to spare.
const ANSWER_TRUESIZE: usize = 2048;

/// Byte offsets of `nlmsg_flags` and `nlmsg_seq` in `struct nlmsghdr`.
const FLAGS_OFFSET: usize = 6;
const SEQ_OFFSET: usize = 8;

/// Requests to send together, serialized back to back (sequence numbers are filled in when the
/// batch is sent).
#[derive(Debug, Default)]
pub struct Batch {
    buf: Vec<u8>,
    /// Where each request starts in `buf`.
    starts: Vec<usize>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Appends a request: `msg` with `flags` (`NLM_F_REQUEST` is added; `NLM_F_ACK` is set on
    /// the last request of each datagram when it is sent).
    pub fn push(&mut self, msg: RouteNetlinkMessage, flags: u16) {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = (flags | NLM_F_REQUEST) & !NLM_F_ACK;
        req.finalize();
        let start = self.buf.len();
        let len = req.buffer_len();
        self.buf.resize(start + len, 0);
        req.serialize(&mut self.buf[start..]);
        self.starts.push(start);
    }

    /// Appends a request written by hand: message type `ty`, `flags` (as for [`Batch::push`])
    /// and its payload `body` (for messages `netlink-packet-route` does not have).
    pub fn push_raw(&mut self, ty: u16, flags: u16, body: &[u8]) {
        let flags = (flags | NLM_F_REQUEST) & !NLM_F_ACK;
        let start = self.buf.len();
        self.buf
            .extend_from_slice(&netlink_wire::nl_request(ty, flags, 0, &[body]));
        self.starts.push(start);
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True when there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The bytes of request `i`.
    #[cfg(test)]
    fn request(&self, i: usize) -> &[u8] {
        let end = self.starts.get(i + 1).copied().unwrap_or(self.buf.len());
        &self.buf[self.starts[i]..end]
    }

    /// Numbers the requests `first`, `first + 1`, … (wrapping).
    fn number(&mut self, first: u32) {
        for (i, &start) in self.starts.iter().enumerate() {
            let seq = first.wrapping_add(i as u32);
            self.buf[start + SEQ_OFFSET..start + SEQ_OFFSET + 4]
                .copy_from_slice(&seq.to_ne_bytes());
        }
    }

    /// Makes request `i` ask for an acknowledgement.
    fn ask_ack(&mut self, i: usize) {
        let at = self.starts[i] + FLAGS_OFFSET;
        let flags = u16::from_ne_bytes([self.buf[at], self.buf[at + 1]]) | NLM_F_ACK;
        self.buf[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
    }

    /// The requests split into datagrams: ranges of request indices, each at most `max_bytes`
    /// long (a single larger request goes alone) and at most `max_requests` requests.
    fn datagrams(&self, max_bytes: usize, max_requests: usize) -> Vec<Range<usize>> {
        let max_requests = max_requests.max(1);
        let mut out = Vec::new();
        let mut first = 0;
        for i in 0..self.len() {
            let end = self.starts.get(i + 1).copied().unwrap_or(self.buf.len());
            let too_long = end - self.starts[first] > max_bytes;
            if i > first && (too_long || i - first == max_requests) {
                out.push(first..i);
                first = i;
            }
        }
        if first < self.len() {
            out.push(first..self.len());
        }
        out
    }
}

/// Why a request of a batch did not succeed.
#[derive(Debug)]
pub enum Failure {
    /// The kernel answered with an error.
    Nack(ErrorMessage),
    /// Its answer is unknown: the socket failed before it (the request may or may not have been
    /// applied).
    Io(io::Error),
}

/// What became of one request.
pub type Outcome = std::result::Result<(), Failure>;

/// Records the answers in one received datagram: an `NLMSG_ERROR` whose sequence number is
/// `first + i` (wrapping) for `i` in `pending` settles request `i`. Anything else (answers to
/// earlier requests, stale dump messages) is skipped. Returns how many were settled.
fn settle(
    datagram: &[u8],
    first: u32,
    pending: Range<usize>,
    out: &mut [Option<Outcome>],
) -> usize {
    let mut settled = 0;
    for (ty, payload, seq) in messages_with_seq(datagram) {
        if ty != NLMSG_ERROR {
            continue;
        }
        let i = seq.wrapping_sub(first) as usize;
        if !pending.contains(&i) || out[i].is_some() {
            continue;
        }
        let Ok(buf) = ErrorBuffer::new_checked(&payload) else {
            continue;
        };
        let Ok(msg) = ErrorMessage::parse(&buf) else {
            continue;
        };
        out[i] = Some(match msg.code {
            None => Ok(()),
            Some(_) => Err(Failure::Nack(msg)),
        });
        settled += 1;
    }
    settled
}

/// How many answers a receive buffer of `rcvbuf` bytes (as `SO_RCVBUF` reads it back) queues
/// safely.
pub fn requests_per_datagram(rcvbuf: usize) -> usize {
    (rcvbuf / ANSWER_TRUESIZE).max(1)
}

/// Sends `batch` on `sock` (a plain blocking rtnetlink socket) with sequence numbers `first`, …,
/// at most `max_requests` requests to a datagram, reading each datagram's answers into `rx` (a
/// reused buffer) before the next. Returns one outcome per request, in order. After a socket
/// failure the requests whose answers are unknown, and those not sent, fail with it.
pub fn send(
    sock: &Socket,
    batch: &mut Batch,
    first: u32,
    max_requests: usize,
    rx: &mut Vec<u8>,
) -> Vec<Outcome> {
    batch.number(first);
    let mut out: Vec<Option<Outcome>> = (0..batch.len()).map(|_| None).collect();
    if rx.capacity() < MAX_DATAGRAM {
        rx.reserve(MAX_DATAGRAM - rx.len());
    }
    let kernel = SocketAddr::new(0, 0);
    let mut failed: Option<io::Error> = None;
    for range in batch.datagrams(MAX_DATAGRAM, max_requests) {
        if failed.is_some() {
            break;
        }
        let bytes_start = batch.starts[range.start];
        let bytes_end = batch
            .starts
            .get(range.end)
            .copied()
            .unwrap_or(batch.buf.len());
        batch.ask_ack(range.end - 1);
        if let Err(e) = sock.send_to(&batch.buf[bytes_start..bytes_end], &kernel, 0) {
            failed = Some(e);
            break;
        }
        // The last request's answer comes after every other answer of the datagram.
        let last = range.end - 1;
        while out[last].is_none() {
            rx.clear();
            match sock.recv(rx, 0) {
                Ok(_) => {
                    settle(rx, first, range.clone(), &mut out);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if failed.is_none() {
            // No NACK: done.
            for o in &mut out[range] {
                o.get_or_insert(Ok(()));
            }
        }
    }
    out.into_iter()
        .map(|o| {
            o.unwrap_or_else(|| {
                Err(Failure::Io(match &failed {
                    Some(e) => io::Error::new(e.kind(), e.to_string()),
                    None => io::Error::other("no answer"),
                }))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{NetlinkBuffer, NLM_F_CREATE, NLM_F_REPLACE};
    use netlink_packet_route::route::RouteMessage;
    use rtnetlink::RouteMessageBuilder;
    use std::net::Ipv4Addr;

    fn route(i: u8) -> RouteNetlinkMessage {
        let msg: RouteMessage = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(Ipv4Addr::new(10, 0, i, 0), 24)
            .output_interface(7)
            .build();
        RouteNetlinkMessage::NewRoute(msg)
    }

    /// An `NLMSG_ERROR` answer to sequence number `seq` with `code` (0: ACK, -errno: NACK).
    fn answer(seq: u32, code: i32) -> Vec<u8> {
        let mut m = ErrorMessage::default();
        m.code = std::num::NonZeroI32::new(code);
        m.header = vec![0; 16];
        let mut msg = NetlinkMessage::new(
            netlink_packet_core::NetlinkHeader::default(),
            netlink_packet_core::NetlinkPayload::<RouteNetlinkMessage>::Error(m),
        );
        msg.header.sequence_number = seq;
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        buf
    }

    #[test]
    fn requests_are_serialized_back_to_back_as_the_handle_would() {
        let mut b = Batch::new();
        let flags = NLM_F_CREATE | NLM_F_REPLACE;
        for i in 0..3 {
            b.push(route(i), flags);
        }
        b.number(41);
        assert_eq!(b.len(), 3);
        for i in 0..3 {
            let mut want = NetlinkMessage::from(route(i as u8));
            // The last of a datagram asks for the ACK.
            if i == 2 {
                b.ask_ack(2);
            }
            want.header.flags = NLM_F_REQUEST | flags | if i == 2 { NLM_F_ACK } else { 0 };
            want.header.sequence_number = 41 + i as u32;
            want.finalize();
            let mut bytes = vec![0; want.buffer_len()];
            want.serialize(&mut bytes);
            assert_eq!(b.request(i), &bytes[..], "request {i}");
            let parsed = NetlinkBuffer::new(b.request(i));
            assert_eq!(parsed.length() as usize, bytes.len());
        }
    }

    #[test]
    fn datagrams_respect_both_bounds() {
        let mut b = Batch::new();
        for i in 0..10 {
            b.push(route(i), 0);
        }
        let one = b.request(0).len();
        assert_eq!(b.datagrams(usize::MAX, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(b.datagrams(3 * one, 100), vec![0..3, 3..6, 6..9, 9..10]);
        assert_eq!(
            b.datagrams(1, 100).len(),
            10,
            "a request longer than the bound goes alone"
        );
        assert!(Batch::new().datagrams(MAX_DATAGRAM, 64).is_empty());
    }

    #[test]
    fn answers_settle_their_own_requests_only() {
        let mut out: Vec<Option<Outcome>> = (0..4).map(|_| None).collect();
        // One datagram may hold several answers; stale ones and other types are skipped.
        let mut dg = answer(99, 0); // an earlier request's
        dg.extend(answer(102, -libc::ENODEV));
        dg.extend(answer(100, 0));
        assert_eq!(settle(&dg, 100, 0..4, &mut out), 2);
        assert!(matches!(out[0], Some(Ok(()))));
        assert!(out[1].is_none());
        match &out[2] {
            Some(Err(Failure::Nack(m))) => assert_eq!(m.raw_code(), -libc::ENODEV),
            other => panic!("want a NACK, got {other:?}"),
        }
        // A duplicate answer, and one outside the datagram being read, settle nothing.
        assert_eq!(settle(&answer(100, -1), 100, 0..4, &mut out), 0);
        assert_eq!(settle(&answer(101, 0), 100, 2..4, &mut out), 0);
        assert_eq!(settle(&answer(101, 0), 100, 0..4, &mut out), 1);
        assert_eq!(settle(&answer(103, 0), 100, 0..4, &mut out), 1);
        assert!(out.iter().all(Option::is_some));
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut b = Batch::new();
        b.push(route(0), 0);
        b.push(route(1), 0);
        b.number(u32::MAX);
        let seq = |i| u32::from_ne_bytes(b.request(i)[8..12].try_into().unwrap());
        assert_eq!((seq(0), seq(1)), (u32::MAX, 0));
        let mut out: Vec<Option<Outcome>> = (0..2).map(|_| None).collect();
        assert_eq!(settle(&answer(0, 0), u32::MAX, 0..2, &mut out), 1);
        assert!(matches!(out[1], Some(Ok(()))));
    }

    #[test]
    fn answers_per_datagram_follow_the_receive_buffer() {
        assert_eq!(requests_per_datagram(0), 1);
        assert_eq!(requests_per_datagram(2 * RCVBUF), 1024);
    }
}
