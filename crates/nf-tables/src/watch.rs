//! Which nf_tables commits of other processes touched our tables: a second `NETLINK_NETFILTER`
//! socket in the `NFNLGRP_NFTABLES` multicast group. The kernel's ruleset generation moves with
//! every commit, anyone's — a kube-proxy writing its own table makes our next batch fail its
//! generation check (ERESTART) and our refresh see a new generation, and both used to mean
//! reading all our tables back (seconds with a big set). The events say whether those commits
//! were about our tables at all; when none was, the believed state is still true at the new
//! generation.
//!
//! Soundness rests on three facts of the kernel: a commit's object events (each names its
//! table, attribute 1 of every object type) are sent before its `NEWGEN` event, which carries
//! the generation it made; generations go up by one per commit; and the generation is bumped
//! before the events are sent. So the watch is *clean at G* only from a known start (a
//! generation read after joining the group, with nothing of a newer commit possibly missed)
//! through an unbroken run of `NEWGEN`s, each preceded by no event naming one of our tables. A
//! gap, a lost event (`ENOBUFS`), or a touch makes it *unknown* until the next start. Anything
//! the watch misses is still caught by the kernel: a batch with a wrong generation is refused.
//!
//! Our own commits would flood the group (one event per set element): the watch leaves the
//! group while we commit and starts again after. Joining is the one moment a commit's events
//! could be seen in part, which is why a start reads the generation after joining.

use std::io;
use std::os::fd::AsRawFd;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use super::codec::Attrs;
use super::consts::*;
use super::model::Family;
use super::socket::{for_each_msg, sockopt};

/// `NFNLGRP_NFTABLES` in `linux/netfilter/nfnetlink.h`.
const NFNLGRP_NFTABLES: u32 = 7;
/// Receive buffer: many small events between two polls.
const RCVBUF: usize = 8 << 20;

/// What the watch knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Every commit after generation `from` (the last start) up to `at` left our tables alone.
    Clean {
        from: u32,
        at: u32,
    },
    Unknown,
}

/// What the events said so far.
#[derive(Debug)]
struct Tracker {
    state: State,
    /// An event of the commit whose `NEWGEN` has not arrived yet named one of our tables.
    pending_touch: bool,
    /// Since the last [`Watch::take_touched`]: another process's commit touched our tables, or
    /// events were lost (and might have said so).
    touched: bool,
}

/// The multicast listener.
pub struct Watch {
    sock: Socket,
    joined: bool,
    t: Tracker,
    buf: Vec<u8>,
}

/// The generation of a `NEWGEN` event, or the family and table an object event names.
#[derive(Debug, PartialEq, Eq)]
enum Event<'a> {
    NewGen(u32),
    Object(u8, &'a str),
    Other,
}

fn event<'a>(ty: u16, payload: &'a [u8]) -> Event<'a> {
    if ty >> 8 != NFNL_SUBSYS_NFTABLES {
        return Event::Other;
    }
    let Some((head, attrs)) = payload.split_at_checked(4) else {
        return Event::Other;
    };
    let first = |want: u16| Attrs::new(attrs).flatten().find(|a| a.ty & 0x3fff == want);
    match ty & 0xff {
        NFT_MSG_NEWGEN => first(NFTA_GEN_ID)
            .and_then(|a| a.be32("generation").ok())
            .map_or(Event::Other, Event::NewGen),
        // Every object message names its table in attribute 1.
        _ => first(1)
            .and_then(|a| a.str_ref("table").ok())
            .map_or(Event::Other, |t| Event::Object(head[0], t)),
    }
}

impl Watch {
    /// Opens the listener in the calling thread's network namespace, not yet in the group.
    pub fn open() -> io::Result<Watch> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        let fd = sock.as_raw_fd();
        // SO_RCVBUFFORCE needs CAP_NET_ADMIN; without it SO_RCVBUF, which the kernel caps at
        // rmem_max. Either failing leaves the default buffer.
        if sockopt(fd, libc::SO_RCVBUFFORCE, RCVBUF).is_err() {
            let _ = sockopt(fd, libc::SO_RCVBUF, RCVBUF);
        }
        sock.set_non_blocking(true)?;
        Ok(Watch {
            sock,
            joined: false,
            t: Tracker {
                state: State::Unknown,
                pending_touch: false,
                touched: false,
            },
            buf: Vec::with_capacity(256 << 10),
        })
    }

    /// Leaves the group (before our own commit). What is known stays known, and the events
    /// queued before stay readable: a commit missed while out of the group leaves the kernel's
    /// generation past the watch's, which the kernel's check and the refresh's catch.
    pub fn pause(&mut self) {
        if self.joined {
            if self.sock.drop_membership(NFNLGRP_NFTABLES).is_ok() {
                self.joined = false;
            } else {
                self.t.state = State::Unknown;
            }
        }
    }

    /// Starts from a known generation: drops what is queued, joins the group, then reads the
    /// generation with `generation`; clean at `expected` if that is what the kernel has (no
    /// commit can have begun before we joined), unknown otherwise.
    pub fn start<E>(&mut self, expected: u32, generation: impl FnOnce() -> Result<u32, E>) {
        self.t.state = State::Unknown;
        self.discard();
        if !self.joined {
            if self.sock.add_membership(NFNLGRP_NFTABLES).is_err() {
                return;
            }
            self.joined = true;
        }
        self.t.pending_touch = false;
        if matches!(generation(), Ok(g) if g == expected) {
            self.t.state = State::Clean {
                from: expected,
                at: expected,
            };
        }
    }

    fn discard(&mut self) {
        loop {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, libc::MSG_DONTWAIT) {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // ENOBUFS: the queue overflowed; it is empty now.
                Err(_) => continue,
            }
        }
    }

    /// The socket, for a poller to wait on: it is readable when events are queued.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// Reads every queued event; returns the generation up to which every commit after
    /// `since` left the `ours` tables alone, if known.
    pub fn clean_since(&mut self, since: u32, ours: &[(Family, &str)]) -> Option<u32> {
        self.drain(ours);
        match self.t.state {
            // `since` within [from, at], in the generation's wrapping order.
            State::Clean { from, at } if since.wrapping_sub(from) <= at.wrapping_sub(from) => {
                Some(at)
            }
            _ => None,
        }
    }

    /// Reads every queued event; true if, since the last call, a commit of another process
    /// touched one of the `ours` tables (an inserted rule, a deleted chain or table, a flushed
    /// ruleset) or events were lost. Our own commits are never seen: the watch is out of the
    /// group while we commit.
    pub fn take_touched(&mut self, ours: &[(Family, &str)]) -> bool {
        self.drain(ours);
        std::mem::take(&mut self.t.touched)
    }

    fn drain(&mut self, ours: &[(Family, &str)]) {
        loop {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, libc::MSG_DONTWAIT) {
                Ok(_) => {
                    let buf = std::mem::take(&mut self.buf);
                    let t = &mut self.t;
                    let r = for_each_msg(&buf, |m| {
                        t.on_event(event(m.ty, m.payload), ours);
                        Ok(())
                    });
                    self.buf = buf;
                    if r.is_err() {
                        self.t.state = State::Unknown;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // Events were lost (ENOBUFS): nothing is known until the next start.
                    self.t.state = State::Unknown;
                    self.t.touched = true;
                }
            }
        }
    }
}

impl Tracker {
    fn on_event(&mut self, e: Event<'_>, ours: &[(Family, &str)]) {
        match e {
            Event::Object(family, table) => {
                if ours
                    .iter()
                    .any(|(f, t)| f.nfproto() == family && *t == table)
                {
                    self.pending_touch = true;
                }
            }
            Event::NewGen(g) => {
                let touched = std::mem::take(&mut self.pending_touch);
                self.touched |= touched;
                if let State::Clean { from, at } = self.state {
                    if g.wrapping_sub(at) == 0 || g.wrapping_sub(at) > u32::MAX / 2 {
                        // A commit we already counted (queued before the start).
                    } else if g == at.wrapping_add(1) && !touched {
                        self.state = State::Clean { from, at: g };
                    } else {
                        self.state = State::Unknown;
                    }
                }
            }
            Event::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch_at(g: u32) -> Tracker {
        Tracker {
            state: State::Clean { from: g, at: g },
            pending_touch: false,
            touched: false,
        }
    }

    fn at(w: &Tracker) -> Option<u32> {
        match w.state {
            State::Clean { at, .. } => Some(at),
            State::Unknown => None,
        }
    }

    const OURS: &[(Family, &str)] = &[(Family::Ip, "calico"), (Family::Ip6, "calico")];

    #[test]
    fn commits_to_other_tables_keep_it_clean_and_move_it_on() {
        let mut w = watch_at(10);
        w.on_event(Event::Object(2, "kube-proxy"), OURS);
        w.on_event(Event::Object(10, "calico-other"), OURS);
        w.on_event(Event::NewGen(11), OURS);
        w.on_event(Event::NewGen(12), OURS);
        assert_eq!(at(&w), Some(12));
        // A stale NEWGEN (queued before the start) changes nothing.
        w.on_event(Event::NewGen(12), OURS);
        assert_eq!(at(&w), Some(12));
    }

    #[test]
    fn a_touch_of_ours_or_a_gap_makes_it_unknown() {
        let mut w = watch_at(10);
        w.on_event(Event::Object(10, "calico"), OURS);
        w.on_event(Event::NewGen(11), OURS);
        assert_eq!(at(&w), None);
        assert!(w.touched, "a touch is reported until taken");
        let mut w = watch_at(10);
        w.on_event(Event::NewGen(12), OURS);
        assert!(!w.touched, "a gap is not a touch by itself");
        assert_eq!(at(&w), None);
        // The same name in another family is not ours.
        let mut w = watch_at(10);
        w.on_event(Event::Object(1, "calico"), OURS);
        w.on_event(Event::NewGen(11), OURS);
        assert_eq!(at(&w), Some(11));
    }

    #[test]
    fn events_decode_from_their_messages() {
        let ty = |m: u16| (NFNL_SUBSYS_NFTABLES << 8) | m;
        // nfgenmsg (family 2) + NFTA_CHAIN_TABLE "calico"
        let mut p = vec![2, 0, 0, 0];
        p.extend(11u16.to_ne_bytes());
        p.extend(1u16.to_ne_bytes());
        p.extend(b"calico\0\0");
        assert_eq!(event(ty(NFT_MSG_NEWCHAIN), &p), Event::Object(2, "calico"));
        let mut g = vec![0, 0, 0, 0];
        g.extend(8u16.to_ne_bytes());
        g.extend(NFTA_GEN_ID.to_ne_bytes());
        g.extend(42u32.to_be_bytes());
        assert_eq!(event(ty(NFT_MSG_NEWGEN), &g), Event::NewGen(42));
        assert_eq!(event(NLMSG_DONE, &g), Event::Other);
    }
}
