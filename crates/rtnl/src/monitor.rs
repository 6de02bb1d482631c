//! The interface monitor (§16): which interfaces exist, whether they are up, their MAC
//! and addresses — as a stream of events for the dataplane's apply loop.
//!
//! How it keeps in step with the kernel:
//! 1. subscribe to RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR and RTNLGRP_IPV6_IFADDR (a multicast socket
//!    made in the target namespace), *then* dump links and addresses, so nothing falls between;
//! 2. after the first dump, the consumer receives the resulting events and then
//!    [`IfaceEvent::InSync`] (the loop applies nothing before that, §10);
//! 3. a receive overrun (ENOBUFS, surfaced by netlink-proto as `NetlinkPayload::Overrun`) means
//!    events were lost: full resync by dump. So does every `resync_interval` (Felix's
//!    InterfaceRefreshInterval, 90 s) and [`MonitorHandle::request_resync`];
//! 4. an address deletion is held for `damping` (100 ms) and dropped if the address comes back,
//!    so a DHCP renew makes no event;
//! 5. interfaces matching the exclude list (exact names, or `/regex/`) are invisible.
//!
//! **Bounded, coalescing channel.** The monitor task keeps the latest known state of every
//! interface ("view"); the channel keeps what the consumer was last told ("delivered") and a set
//! of interface indexes that may differ. [`EventReceiver::recv`] turns one dirty index into the
//! events that take "delivered" to "view". The channel therefore holds at most one entry per
//! interface that exists or that the consumer still believes exists, however fast the kernel
//! talks, and an interface that flapped ten times between two reads yields one event.
//! (netlink-proto's internal queue between the socket task and us is unbounded, but the monitor
//! task only moves messages into the view and never blocks, so it stays short; the kernel's
//! receive buffer is the real bound, and its overflow is the overrun above.)

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::channel::mpsc::UnboundedReceiver;
use futures::StreamExt;
use ipnet::IpNet;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, SocketAddr};
use regex::Regex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::handle::{into_tokio, socket_in};
use super::link::{address_of, list_addresses, list_links, LinkState};
use super::{Result, RtnlError, RtnlHandle};
use crate::netns::NetNs;

/// rtnetlink multicast groups (uapi linux/rtnetlink.h, `enum rtnetlink_groups`).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV6_IFADDR: u32 = 9;

/// Monitor settings.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Interfaces to ignore: exact names, or `/regex/` (Felix's InterfaceExclude, default
    /// `kube-ipvs0`).
    pub exclude: Vec<String>,
    /// Full resync period (Felix's InterfaceRefreshInterval, 90 s). Zero disables it.
    pub resync_interval: Duration,
    /// How long an address deletion is held before it is reported (100 ms in Felix).
    pub damping: Duration,
    /// SO_RCVBUFFORCE for the multicast socket; `None` keeps the kernel default.
    pub rcvbuf: Option<usize>,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            exclude: vec!["kube-ipvs0".to_string()],
            resync_interval: Duration::from_secs(90),
            damping: Duration::from_millis(100),
            rcvbuf: Some(4 << 20),
        }
    }
}

/// What the consumer hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfaceEvent {
    /// The first full dump has been delivered.
    InSync,
    /// An interface appeared, or its up/down state or MAC changed.
    Link(LinkState),
    /// An interface changed name (same index). A `Link` event follows if anything else changed.
    Renamed {
        index: u32,
        old_name: String,
        new_name: String,
    },
    /// An interface is gone (or became excluded).
    Removed { index: u32, name: String },
    /// The complete current address set of an interface.
    Addrs {
        index: u32,
        name: String,
        addrs: BTreeSet<IpNet>,
    },
}

/// Counters, for tests and metrics.
#[derive(Debug, Default)]
pub struct MonitorStats {
    /// Receive overruns seen (each triggered a resync).
    pub overruns: AtomicU64,
    /// Full resyncs done (the first dump included).
    pub resyncs: AtomicU64,
    /// Kernel messages processed.
    pub messages: AtomicU64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Iface {
    link: LinkState,
    addrs: BTreeSet<IpNet>,
}

#[derive(Debug, Default)]
struct Coalescer {
    view: BTreeMap<u32, Iface>,
    delivered: BTreeMap<u32, Iface>,
    dirty: BTreeSet<u32>,
    ready: VecDeque<IfaceEvent>,
    in_sync_pending: bool,
    closed: bool,
}

impl Coalescer {
    /// Produces the events that take the consumer's picture of `index` to the current one.
    fn diff(&mut self, index: u32) {
        let now = self.view.get(&index).cloned();
        let before = match &now {
            Some(n) => self.delivered.insert(index, n.clone()),
            None => self.delivered.remove(&index),
        };
        match (before, now) {
            (None, None) => {}
            (Some(b), None) => self.ready.push_back(IfaceEvent::Removed {
                index,
                name: b.link.name,
            }),
            (None, Some(n)) => {
                self.ready.push_back(IfaceEvent::Link(n.link.clone()));
                self.ready.push_back(IfaceEvent::Addrs {
                    index,
                    name: n.link.name,
                    addrs: n.addrs,
                });
            }
            (Some(b), Some(n)) => {
                if b.link.name != n.link.name {
                    self.ready.push_back(IfaceEvent::Renamed {
                        index,
                        old_name: b.link.name.clone(),
                        new_name: n.link.name.clone(),
                    });
                }
                let same_link = b.link.admin_up == n.link.admin_up
                    && b.link.oper_up == n.link.oper_up
                    && b.link.mac == n.link.mac;
                if !same_link {
                    self.ready.push_back(IfaceEvent::Link(n.link.clone()));
                }
                if b.addrs != n.addrs || b.link.name != n.link.name {
                    self.ready.push_back(IfaceEvent::Addrs {
                        index,
                        name: n.link.name,
                        addrs: n.addrs,
                    });
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<Coalescer>,
    notify: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Coalescer> {
        // A panic while holding the lock leaves plain data behind; keep going with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The consumer side of the coalescing channel.
#[derive(Debug)]
pub struct EventReceiver {
    shared: Arc<Shared>,
}

impl EventReceiver {
    /// The next event; `None` once the monitor has stopped and everything was delivered.
    pub async fn recv(&mut self) -> Option<IfaceEvent> {
        loop {
            {
                let mut st = self.shared.lock();
                loop {
                    if let Some(e) = st.ready.pop_front() {
                        return Some(e);
                    }
                    match st.dirty.pop_first() {
                        Some(idx) => st.diff(idx),
                        None => break,
                    }
                }
                if st.in_sync_pending {
                    st.in_sync_pending = false;
                    return Some(IfaceEvent::InSync);
                }
                if st.closed {
                    return None;
                }
            }
            self.shared.notify.notified().await;
        }
    }

    /// Number of interfaces waiting to be reported (the channel's whole backlog).
    pub fn backlog(&self) -> usize {
        let st = self.shared.lock();
        st.dirty.len() + st.ready.len()
    }
}

/// Controls a running monitor; dropping it stops the monitor task.
#[derive(Debug)]
pub struct MonitorHandle {
    stats: Arc<MonitorStats>,
    resync: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl MonitorHandle {
    /// Asks for a full resync now.
    pub fn request_resync(&self) {
        self.resync.notify_one();
    }

    /// Counters.
    pub fn stats(&self) -> &MonitorStats {
        &self.stats
    }
}

impl Drop for MonitorHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Compiled exclude list.
#[derive(Debug, Clone, Default)]
pub struct ExcludeList {
    names: BTreeSet<String>,
    regexes: Vec<Regex>,
}

impl ExcludeList {
    /// Parses entries: `/re/` is a regex, anything else an exact name.
    pub fn new(entries: &[String]) -> std::result::Result<ExcludeList, regex::Error> {
        let mut out = ExcludeList::default();
        for e in entries {
            if e.len() >= 2 && e.starts_with('/') && e.ends_with('/') {
                out.regexes.push(Regex::new(&e[1..e.len() - 1])?);
            } else {
                out.names.insert(e.clone());
            }
        }
        Ok(out)
    }

    /// True when `name` is excluded.
    pub fn matches(&self, name: &str) -> bool {
        self.names.contains(name) || self.regexes.iter().any(|r| r.is_match(name))
    }
}

/// Starts the monitor for namespace `ns` (current with `None`) on the current tokio runtime.
pub fn start(ns: Option<&NetNs>, cfg: MonitorConfig) -> Result<(EventReceiver, MonitorHandle)> {
    let exclude = ExcludeList::new(&cfg.exclude).map_err(|e| RtnlError::Unexpected {
        op: "parsing the interface exclude list",
        what: e.to_string(),
    })?;
    let label = ns.map(NetNs::label).unwrap_or("current").to_string();
    let mut sock = socket_in(ns, NETLINK_ROUTE)?;
    let sock_err = |op: &'static str| {
        let ns = label.clone();
        move |source| RtnlError::Socket { op, ns, source }
    };
    if let Some(size) = cfg.rcvbuf {
        super::handle::set_rcvbuf_force(&sock, size)
            .map_err(sock_err("setting SO_RCVBUFFORCE on monitor socket"))?;
    }
    let groups = [RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR]
        .iter()
        .fold(0u32, |m, g| m | 1 << (g - 1));
    sock.bind(&SocketAddr::new(0, groups))
        .map_err(sock_err("subscribing to link and address groups"))?;
    let sock = into_tokio(sock, &label, "starting the interface monitor")?;
    let (conn, _h, messages) = rtnetlink::from_socket(sock);
    let dumper = RtnlHandle::connect(ns)?;

    let shared = Arc::new(Shared::default());
    let stats = Arc::new(MonitorStats::default());
    let resync = Arc::new(Notify::new());
    let task = Task {
        shared: shared.clone(),
        stats: stats.clone(),
        resync: resync.clone(),
        dumper,
        exclude,
        cfg,
        pending_dels: BTreeMap::new(),
        first: true,
    };
    let task = tokio::spawn(async move {
        let conn_task = tokio::spawn(conn);
        if let Err(e) = task.run(messages).await {
            tracing::error!(error = %e, source = ?std::error::Error::source(&e), "interface monitor stopped");
        }
        conn_task.abort();
    });
    Ok((
        EventReceiver { shared },
        MonitorHandle {
            stats,
            resync,
            task,
        },
    ))
}

struct Task {
    shared: Arc<Shared>,
    stats: Arc<MonitorStats>,
    resync: Arc<Notify>,
    dumper: RtnlHandle,
    exclude: ExcludeList,
    cfg: MonitorConfig,
    /// Damped address deletions: (index, address) → when to apply.
    pending_dels: BTreeMap<(u32, IpNet), Instant>,
    first: bool,
}

type Messages = UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>;

impl Task {
    async fn run(mut self, mut messages: Messages) -> Result<()> {
        let result = self.main_loop(&mut messages).await;
        let mut st = self.shared.lock();
        st.closed = true;
        drop(st);
        self.shared.notify.notify_one();
        result
    }

    async fn main_loop(&mut self, messages: &mut Messages) -> Result<()> {
        self.resync_now(messages).await?;
        let far = Duration::from_secs(365 * 24 * 3600);
        let period = if self.cfg.resync_interval.is_zero() {
            far
        } else {
            self.cfg.resync_interval
        };
        let mut next_resync = Instant::now() + period;
        loop {
            let next_damp = self
                .pending_dels
                .values()
                .min()
                .copied()
                .unwrap_or_else(|| Instant::now() + far);
            tokio::select! {
                msg = messages.next() => {
                    let Some((msg, _)) = msg else {
                        return Err(RtnlError::Unexpected {
                            op: "reading interface events",
                            what: "the multicast netlink socket closed".into(),
                        });
                    };
                    if self.handle(msg) {
                        self.stats.overruns.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("interface monitor overrun: events lost, resyncing");
                        self.resync_now(messages).await?;
                    }
                }
                _ = tokio::time::sleep_until(next_damp) => self.flush_damped(),
                _ = tokio::time::sleep_until(next_resync) => {
                    self.resync_now(messages).await?;
                    next_resync = Instant::now() + period;
                }
                _ = self.resync.notified() => self.resync_now(messages).await?,
            }
        }
    }

    /// Applies one kernel message to the view. Returns true on an overrun.
    fn handle(&mut self, msg: NetlinkMessage<RouteNetlinkMessage>) -> bool {
        self.stats.messages.fetch_add(1, Ordering::Relaxed);
        let inner = match msg.payload {
            NetlinkPayload::Overrun(_) => return true,
            NetlinkPayload::InnerMessage(m) => m,
            _ => return false,
        };
        let mut st = self.shared.lock();
        let mut touched = None;
        match inner {
            RouteNetlinkMessage::NewLink(m) => {
                if let Some(link) = LinkState::from_message(&m) {
                    let index = link.index;
                    if self.exclude.matches(&link.name) {
                        st.view.remove(&index);
                    } else {
                        let addrs = st
                            .view
                            .get(&index)
                            .map(|i| i.addrs.clone())
                            .unwrap_or_default();
                        st.view.insert(index, Iface { link, addrs });
                    }
                    touched = Some(index);
                }
            }
            RouteNetlinkMessage::DelLink(m) => {
                let index = m.header.index;
                st.view.remove(&index);
                self.pending_dels.retain(|(i, _), _| *i != index);
                touched = Some(index);
            }
            RouteNetlinkMessage::NewAddress(m) => {
                if let Some(net) = address_of(&m) {
                    let index = m.header.index;
                    self.pending_dels.remove(&(index, net));
                    if let Some(iface) = st.view.get_mut(&index) {
                        if iface.addrs.insert(net) {
                            touched = Some(index);
                        }
                    }
                }
            }
            RouteNetlinkMessage::DelAddress(m) => {
                if let Some(net) = address_of(&m) {
                    let index = m.header.index;
                    if st.view.get(&index).is_some_and(|i| i.addrs.contains(&net)) {
                        self.pending_dels
                            .insert((index, net), Instant::now() + self.cfg.damping);
                    }
                }
            }
            _ => {}
        }
        if let Some(index) = touched {
            st.dirty.insert(index);
            drop(st);
            self.shared.notify.notify_one();
        }
        false
    }

    fn flush_damped(&mut self) {
        let now = Instant::now();
        let due: Vec<(u32, IpNet)> = self
            .pending_dels
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(k, _)| *k)
            .collect();
        if due.is_empty() {
            return;
        }
        let mut st = self.shared.lock();
        for key in due {
            self.pending_dels.remove(&key);
            if let Some(iface) = st.view.get_mut(&key.0) {
                if iface.addrs.remove(&key.1) {
                    st.dirty.insert(key.0);
                }
            }
        }
        drop(st);
        self.shared.notify.notify_one();
    }

    /// Full resync: drop what is queued (older than the dump), dump links and addresses, and
    /// replace the view.
    async fn resync_now(&mut self, messages: &mut Messages) -> Result<()> {
        while messages.try_recv().is_ok() {}
        let links = list_links(&self.dumper).await?;
        let addrs = list_addresses(&self.dumper).await?;
        let mut view: BTreeMap<u32, Iface> = links
            .into_iter()
            .filter(|l| !self.exclude.matches(&l.name))
            .map(|l| {
                (
                    l.index,
                    Iface {
                        link: l,
                        addrs: BTreeSet::new(),
                    },
                )
            })
            .collect();
        for (index, net) in addrs {
            if let Some(i) = view.get_mut(&index) {
                i.addrs.insert(net);
            }
        }
        self.pending_dels.clear();
        self.stats.resyncs.fetch_add(1, Ordering::Relaxed);
        let mut st = self.shared.lock();
        let changed: Vec<u32> = view
            .keys()
            .chain(st.delivered.keys())
            .copied()
            .filter(|i| view.get(i) != st.delivered.get(i))
            .collect();
        st.dirty.extend(changed);
        st.view = view;
        if self.first {
            st.in_sync_pending = true;
            self.first = false;
        }
        drop(st);
        self.shared.notify.notify_one();
        tracing::debug!("interface monitor resynced");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(index: u32, name: &str, up: bool, addrs: &[&str]) -> Iface {
        Iface {
            link: LinkState {
                index,
                name: name.into(),
                admin_up: up,
                oper_up: up,
                mac: vec![2, 0, 0, 0, 0, index as u8],
                mtu: 1500,
            },
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    fn drain(c: &mut Coalescer) -> Vec<IfaceEvent> {
        while let Some(i) = c.dirty.pop_first() {
            c.diff(i);
        }
        c.ready.drain(..).collect()
    }

    #[test]
    fn coalescer_reports_only_the_net_change() {
        let mut c = Coalescer::default();
        c.view.insert(3, iface(3, "cali1", false, &[]));
        c.dirty.insert(3);
        let ev = drain(&mut c);
        assert!(matches!(&ev[0], IfaceEvent::Link(l) if l.name == "cali1" && !l.oper_up));
        // Ten flaps between two reads, ending up: one Link event.
        for i in 0..10 {
            c.view.insert(3, iface(3, "cali1", i % 2 == 0, &[]));
            c.dirty.insert(3);
        }
        c.view.insert(3, iface(3, "cali1", true, &[]));
        let ev = drain(&mut c);
        assert_eq!(ev.len(), 1, "{ev:?}");
        // Rename plus address: Renamed then Addrs under the new name.
        c.view.insert(3, iface(3, "cali2", true, &["10.0.0.1/32"]));
        c.dirty.insert(3);
        let ev = drain(&mut c);
        assert!(
            matches!(&ev[0], IfaceEvent::Renamed { old_name, new_name, .. } if old_name == "cali1" && new_name == "cali2")
        );
        assert!(
            matches!(&ev[1], IfaceEvent::Addrs { name, addrs, .. } if name == "cali2" && addrs.len() == 1)
        );
        // Created and deleted between two reads: nothing at all.
        c.view.insert(9, iface(9, "tmp", true, &[]));
        c.dirty.insert(9);
        c.view.remove(&9);
        assert!(drain(&mut c).is_empty());
        c.view.remove(&3);
        c.dirty.insert(3);
        assert_eq!(
            drain(&mut c),
            vec![IfaceEvent::Removed {
                index: 3,
                name: "cali2".into()
            }]
        );
    }

    #[test]
    fn exclude_list_takes_names_and_regexes() {
        let ex = ExcludeList::new(&["kube-ipvs0".into(), "/^veth.*/".into()]).unwrap();
        assert!(ex.matches("kube-ipvs0"));
        assert!(ex.matches("veth123"));
        assert!(!ex.matches("cali1"));
        assert!(!ex.matches("kube-ipvs01"));
        assert!(ExcludeList::new(&["/(/".into()]).is_err());
    }
}
