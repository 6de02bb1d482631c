//! The flow-log aggregator: NFLOG hits and conntrack events, already decoded, joined into flows
//! keyed as Goldmane keys them ([`FlowKey`]) and counted per flush interval. Pure and
//! synchronous: no netlink I/O, no clock (every call takes `now`, seconds since the Unix
//! epoch), no tokio; who an address is and which tier a policy is in come from the caller's
//! [`Names`].
//!
//! How Felix's collector joins the two streams, made concrete:
//!
//! - The hits of one packet in one direction arrive in evaluation order: zero or more passes
//!   (a rule's `pass`, a tier's end that passes on) then one final hit (a rule's allow or deny,
//!   a tier's end that drops, no profile). The passes wait per (reporter, connection); the final
//!   hit fixes the connection's flow key for that reporter and starts one connection on it.
//! - A connection is known by its conntrack original tuple when NFLOG carried the entry
//!   (`NFULA_CT`), else by the packet's own tuple; a conntrack event finds it by its original
//!   tuple, or by its reply tuple reversed (DNAT seen without `NFULA_CT`: the packet's tuple is
//!   the translated one, which is the reply reversed).
//! - Packets and bytes of allowed connections are conntrack's cumulative counters, added as
//!   differences; a denied packet has no confirmed conntrack entry, so each logged deny counts
//!   one packet of the IP header's length.
//!
//! Invariants:
//! - Memory is bounded whatever the input: at most [`Limits::max_connections`] connections,
//!   [`Limits::max_pending`] unfinished traces of at most [`MAX_TRACE`] hits each, and
//!   [`Limits::max_flows`] flow keys. What does not fit is dropped, or for connections the one
//!   due to expire first is evicted, and counted in [`Stats`].
//! - A connection starts once per reporter: a retransmitted first packet is logged again but
//!   is not a second connection.
//! - A flow's live count is the number of its reporter's bindings to open connections; a flow
//!   key is forgotten at the first flush where it has no live connection (after reporting what
//!   it counted).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use super::record::{Endpoint, FlowKey, FlowRecord, PolicyHit, PolicyKind, Reporter, Verdict};
use felix_nft_rules::names::Direction;
use felix_nft_rules::nflog::{self as prefixes, Action, Hit, Owner, GROUP_EGRESS, GROUP_INGRESS};
use rtnl::ctevents::{decode_entry, CtCounters, CtEntry, CtEvent, CtTuple};
use rtnl::nflog::{FiveTuple, LoggedPacket};

/// Most hits one packet's trace may have in one direction: one pass per tier, then the final
/// hit. A longer run is not a trace we wrote, and keeping it would let one connection grow
/// without bound.
pub const MAX_TRACE: usize = 64;

/// The aggregator's bounds and timeouts; times in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections remembered (at least 1). When full, the one due to expire first is evicted.
    pub max_connections: usize,
    /// Traces waiting for their final hit. When full, a new one is dropped.
    pub max_pending: usize,
    /// Flow keys held: those counted in this interval plus those with live connections. When
    /// full, a connection with a new key is dropped.
    pub max_flows: usize,
    /// How long passes wait for their final hit: the hits of one packet come in one batch
    /// (the kernel flushes NFLOG groups every 100 ms), so older passes belong to a packet whose
    /// final hit was lost.
    pub pending_secs: i64,
    /// How long an open connection is kept without a conntrack event: destroy events can be
    /// lost (a reader that falls behind), and an entry that never ends must not stay forever.
    pub idle_secs: i64,
    /// How long a denied connection is remembered, so that its client's retransmitted first
    /// packets (TCP retries for about two minutes) are not counted as new connections.
    pub closed_secs: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 65_536,
            max_pending: 16_384,
            max_flows: 10_000,
            pending_secs: 5,
            idle_secs: 3_600,
            closed_secs: 120,
        }
    }
}

/// What the aggregator asks of the model. Resolved at a trace's final hit, so a flow is named
/// as the model stood when its connection started.
pub trait Names {
    /// Who has address `ip`: a local workload or host endpoint, or the network.
    fn endpoint(&self, ip: IpAddr) -> Endpoint;
    /// The tier of the policy whose prefix id is `policy_id` (`np/prod/web`, as
    /// [`prefixes::policy_id`] writes it), where known.
    fn tier_of(&self, policy_id: &str) -> Option<String>;
    /// The policy's position among those of its tier, where the model says; -1 otherwise.
    fn policy_index(&self, _policy_id: &str) -> Option<i64> {
        None
    }
    /// The whole prefix a hashed one ([`prefixes::is_hashed`]) stands for, where the caller
    /// keeps the prefixes it programmed. Without it a hashed prefix is counted as foreign.
    fn full_prefix(&self, _hashed: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// One NFLOG hit as the aggregator needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NflogHit<'a> {
    /// The log group: [`GROUP_INGRESS`] (reported by the destination) or [`GROUP_EGRESS`]
    /// (by the source).
    pub group: u16,
    /// The rule's prefix, without its NUL.
    pub prefix: &'a [u8],
    /// The packet's addresses, protocol and ports.
    pub packet: FiveTuple,
    /// The original tuple of the packet's conntrack entry, when NFLOG carried it.
    pub ct_orig: Option<CtTuple>,
    /// The packet's length from its IP header (0 where unknown): what a denied packet counts.
    pub len: u32,
}

impl<'a> NflogHit<'a> {
    /// The hit a logged packet makes; `None` when its headers cannot be read.
    pub fn from_packet(p: &'a LoggedPacket) -> Option<NflogHit<'a>> {
        Some(NflogHit {
            group: p.group,
            prefix: &p.prefix,
            packet: p.five_tuple()?,
            ct_orig: p.ct.as_deref().and_then(|ct| decode_entry(ct).orig),
            len: ip_len(&p.payload),
        })
    }
}

/// What the aggregator saw and dropped, cumulative since it was made (counters for metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// NFLOG hits offered, readable or not.
    pub nflog_hits: u64,
    /// Logged packets whose headers could not be read.
    pub unreadable_packets: u64,
    /// Hits in a group that is not one of ours.
    pub foreign_groups: u64,
    /// Hits whose prefix is not one we write for its group: another program's, damaged, or
    /// hashed with no lookup.
    pub foreign_prefixes: u64,
    /// Of `foreign_prefixes`, the hashed ones [`Names::full_prefix`] did not know.
    pub hashed_unresolved: u64,
    /// Final hits for a connection its reporter had already decided (retransmitted first
    /// packets).
    pub repeated_finals: u64,
    /// Waiting passes discarded for being older than [`Limits::pending_secs`].
    pub pending_expired: u64,
    /// Passes dropped because the pending table was full or the trace too long.
    pub pending_dropped: u64,
    /// Conntrack events offered.
    pub ct_events: u64,
    /// Update and destroy events for connections no NFLOG hit started.
    pub ct_unmatched: u64,
    /// Connections evicted to make room for a new one.
    pub conns_evicted: u64,
    /// Connections forgotten after [`Limits::idle_secs`] (open) or [`Limits::closed_secs`]
    /// (denied) without an event.
    pub conns_expired: u64,
    /// Final hits dropped because their flow key was new and the flow table full.
    pub flows_dropped: u64,
}

/// A flow key's handle; never reused, so a stale one finds nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FlowId(u64);

/// A connection as the aggregator keys it: the tuple with ports only where the protocol has
/// them. The conntrack decoder reads no ICMP id, so ICMP is keyed by addresses alone on both
/// sides.
type ConnKey = FiveTuple;

/// What one reporter decided about a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// No final hit yet (the reporter is not local, or its hit has not come).
    Unseen,
    /// Allowed, and the connection is open: the flow counts it live and gets its counters.
    Open(FlowId),
    /// Decided, and the connection is not open: denied here or by the other side.
    Closed,
}

struct Conn {
    src: Side,
    dst: Side,
    /// A reporter denied it: no side is open, whatever order the hits came in.
    denied: bool,
    /// The last cumulative counters seen, per conntrack direction.
    orig: CtCounters,
    reply: CtCounters,
    /// Its key in [`Aggregator::deadlines`]: when it expires, and a sequence number.
    deadline: (i64, u64),
}

impl Conn {
    fn side(&self, reporter: Reporter) -> Side {
        match reporter {
            Reporter::Src => self.src,
            Reporter::Dst => self.dst,
        }
    }

    fn side_mut(&mut self, reporter: Reporter) -> &mut Side {
        match reporter {
            Reporter::Src => &mut self.src,
            Reporter::Dst => &mut self.dst,
        }
    }

    fn is_open(&self) -> bool {
        matches!(self.src, Side::Open(_)) || matches!(self.dst, Side::Open(_))
    }
}

/// One hit of a trace, its tier still to be looked up.
struct Step {
    hit: PolicyHit,
    /// The policy's prefix id, for [`Names::tier_of`].
    policy_id: Option<String>,
}

/// Passes waiting for their final hit.
struct Pending {
    since: i64,
    steps: Vec<Step>,
    /// More than [`MAX_TRACE`] hits came: the final hit is dropped, not reported with a
    /// trace missing its head.
    overflowed: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    packets_in: u64,
    packets_out: u64,
    bytes_in: u64,
    bytes_out: u64,
    started: u64,
    completed: u64,
}

struct Flow {
    key: FlowKey,
    counts: Counts,
    live: u64,
}

/// NFLOG hits and conntrack events in, [`FlowRecord`]s out at each [`Aggregator::flush`].
pub struct Aggregator {
    limits: Limits,
    stats: Stats,
    /// The start of the current interval: the last flush, or the first call.
    interval_start: Option<i64>,
    conns: HashMap<ConnKey, Conn>,
    /// Every connection by when it expires: the order of expiry and of eviction.
    deadlines: BTreeMap<(i64, u64), ConnKey>,
    next_seq: u64,
    pending: HashMap<(Reporter, ConnKey), Pending>,
    /// When stale passes were last swept, so a full table is swept at most once a second.
    pending_swept: Option<i64>,
    flows: HashMap<FlowId, Flow>,
    index: HashMap<FlowKey, FlowId>,
    next_flow: u64,
}

impl Aggregator {
    /// An empty aggregator; its first interval starts at the first call that gives a time.
    pub fn new(limits: Limits) -> Aggregator {
        Aggregator {
            limits: Limits {
                max_connections: limits.max_connections.max(1),
                ..limits
            },
            stats: Stats::default(),
            interval_start: None,
            conns: HashMap::new(),
            deadlines: BTreeMap::new(),
            next_seq: 0,
            pending: HashMap::new(),
            pending_swept: None,
            flows: HashMap::new(),
            index: HashMap::new(),
            next_flow: 0,
        }
    }

    /// What it saw and dropped so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Connections remembered.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Traces waiting for their final hit.
    pub fn pending_traces(&self) -> usize {
        self.pending.len()
    }

    /// Flow keys held.
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    /// A logged packet: [`Aggregator::on_nflog`] with what it carries, or counted as unreadable.
    pub fn on_packet(&mut self, now: i64, packet: &LoggedPacket, names: &dyn Names) {
        match NflogHit::from_packet(packet) {
            Some(hit) => self.on_nflog(now, hit, names),
            None => {
                self.begin(now);
                self.stats.nflog_hits += 1;
                self.stats.unreadable_packets += 1;
            }
        }
    }

    /// One NFLOG hit: a pass waits for its packet's final hit; a final hit decides the
    /// connection for its reporter.
    pub fn on_nflog(&mut self, now: i64, hit: NflogHit<'_>, names: &dyn Names) {
        self.begin(now);
        self.stats.nflog_hits += 1;
        let reporter = match hit.group {
            GROUP_INGRESS => Reporter::Dst,
            GROUP_EGRESS => Reporter::Src,
            _ => {
                self.stats.foreign_groups += 1;
                return;
            }
        };
        let full;
        let prefix = if prefixes::is_hashed(hit.prefix) {
            match names.full_prefix(hit.prefix) {
                Some(p) => {
                    full = p;
                    &full[..]
                }
                None => {
                    self.stats.hashed_unresolved += 1;
                    self.stats.foreign_prefixes += 1;
                    return;
                }
            }
        } else {
            hit.prefix
        };
        let Some((step, action)) = prefixes::parse(prefix).and_then(|h| step(h, reporter)) else {
            self.stats.foreign_prefixes += 1;
            return;
        };
        let conn = conn_key(hit.ct_orig.map(|t| five_tuple(&t)).unwrap_or(hit.packet));
        if action == Action::Pass {
            self.push_pass(now, (reporter, conn), step);
            return;
        }
        let mut steps = match self.pending.remove(&(reporter, conn)) {
            Some(p) if self.is_stale(&p, now) => {
                self.stats.pending_expired += 1;
                Vec::new()
            }
            Some(p) if p.overflowed => {
                self.stats.pending_dropped += 1;
                return;
            }
            Some(p) => p.steps,
            None => Vec::new(),
        };
        steps.push(step);
        let key = flow_key(reporter, &hit.packet, verdict(action), steps, names);
        self.decide(now, reporter, conn, key, hit.len);
    }

    /// One conntrack event: counter differences to the open flows of a connection NFLOG
    /// started; a destroy completes it.
    pub fn on_ct(&mut self, now: i64, event: &CtEvent) {
        self.stats.ct_events += 1;
        let destroy = matches!(event, CtEvent::Destroy(_));
        if !self.count_entry(now, event.entry(), destroy) && !matches!(event, CtEvent::New(_)) {
            self.stats.ct_unmatched += 1;
        }
    }

    /// One entry of a conntrack table dump: the counters of a connection still open (its
    /// update events carry none). Entries of connections no hit started are skipped, not
    /// counted as unmatched: a dump lists every connection of the namespace.
    pub fn on_ct_polled(&mut self, now: i64, entry: &CtEntry) {
        self.count_entry(now, entry, false);
    }

    /// Adds what `entry`'s counters grew by to the flows of its connection, and ends the
    /// connection when `destroy`; false when no hit started the connection.
    fn count_entry(&mut self, now: i64, entry: &CtEntry, destroy: bool) -> bool {
        self.begin(now);
        let Some(conn) = self.find(entry.orig, entry.reply) else {
            return false;
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            let orig = delta(&mut c.orig, entry.counters_orig);
            let reply = delta(&mut c.reply, entry.counters_reply);
            for (reporter, side) in [(Reporter::Src, c.src), (Reporter::Dst, c.dst)] {
                let Side::Open(id) = side else { continue };
                let Some(flow) = self.flows.get_mut(&id) else {
                    continue;
                };
                // The source sends the original direction; the destination receives it.
                let (rx, tx) = match reporter {
                    Reporter::Src => (reply, orig),
                    Reporter::Dst => (orig, reply),
                };
                // Saturating: the counts are the kernel's, not bounded by anything here.
                let n = &mut flow.counts;
                n.packets_in = n.packets_in.saturating_add(rx.packets);
                n.bytes_in = n.bytes_in.saturating_add(rx.bytes);
                n.packets_out = n.packets_out.saturating_add(tx.packets);
                n.bytes_out = n.bytes_out.saturating_add(tx.bytes);
                if destroy {
                    n.completed += 1;
                }
            }
        }
        if destroy {
            self.remove_conn(&conn);
        } else {
            self.touch(now, conn);
        }
        true
    }

    /// The interval ending at `now`: one record per flow key that counted something or has
    /// live connections, in key order. Expires stale passes and idle connections first, then
    /// resets the counts and forgets keys with no live connection.
    pub fn flush(&mut self, now: i64) -> Vec<FlowRecord> {
        let start = self.interval_start.unwrap_or(now);
        self.expire_pending(now);
        while let Some((&(at, seq), &conn)) = self.deadlines.first_key_value() {
            if at > now {
                break;
            }
            self.deadlines.remove(&(at, seq));
            self.remove_conn(&conn);
            self.stats.conns_expired += 1;
        }
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (&id, flow) in &mut self.flows {
            let n = std::mem::take(&mut flow.counts);
            if n != Counts::default() || flow.live > 0 {
                out.push(FlowRecord {
                    key: flow.key.clone(),
                    start_time: start,
                    end_time: now,
                    packets_in: n.packets_in,
                    packets_out: n.packets_out,
                    bytes_in: n.bytes_in,
                    bytes_out: n.bytes_out,
                    connections_started: n.started,
                    connections_completed: n.completed,
                    connections_live: flow.live,
                });
            }
            if flow.live == 0 {
                gone.push(id);
            }
        }
        for id in gone {
            if let Some(flow) = self.flows.remove(&id) {
                self.index.remove(&flow.key);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        self.interval_start = Some(now);
        out
    }

    fn begin(&mut self, now: i64) {
        self.interval_start.get_or_insert(now);
    }

    fn is_stale(&self, p: &Pending, now: i64) -> bool {
        now.saturating_sub(p.since) > self.limits.pending_secs
    }

    fn push_pass(&mut self, now: i64, key: (Reporter, ConnKey), step: Step) {
        let ttl = self.limits.pending_secs;
        if let Some(p) = self.pending.get_mut(&key) {
            if now.saturating_sub(p.since) > ttl {
                self.stats.pending_expired += 1;
                *p = Pending {
                    since: now,
                    steps: Vec::new(),
                    overflowed: false,
                };
            }
            if p.overflowed || p.steps.len() + 1 >= MAX_TRACE {
                // Room is kept for the final hit; the rest of this trace is dropped with it.
                if !p.overflowed {
                    self.stats.pending_dropped += 1;
                }
                p.overflowed = true;
                p.steps = Vec::new();
            } else {
                p.steps.push(step);
            }
            return;
        }
        if self.pending.len() >= self.limits.max_pending
            && self.pending_swept.is_none_or(|at| at < now)
        {
            self.expire_pending(now);
        }
        if self.pending.len() >= self.limits.max_pending {
            self.stats.pending_dropped += 1;
            return;
        }
        self.pending.insert(
            key,
            Pending {
                since: now,
                steps: vec![step],
                overflowed: false,
            },
        );
    }

    fn expire_pending(&mut self, now: i64) {
        let ttl = self.limits.pending_secs;
        let before = self.pending.len();
        self.pending
            .retain(|_, p| now.saturating_sub(p.since) <= ttl);
        self.stats.pending_expired += (before - self.pending.len()) as u64;
        self.pending_swept = Some(now);
    }

    /// A reporter's final hit for `conn`, its flow key resolved.
    fn decide(&mut self, now: i64, reporter: Reporter, conn: ConnKey, key: FlowKey, len: u32) {
        let denied = key.action == Verdict::Deny;
        if self
            .conns
            .get(&conn)
            .is_some_and(|c| c.side(reporter) != Side::Unseen)
        {
            self.stats.repeated_finals += 1;
            if denied {
                if let Some(id) = self.flow_id(key) {
                    self.count_denied(id, reporter, len);
                }
            }
            self.touch(now, conn);
            return;
        }
        let Some(id) = self.flow_id(key) else { return };
        if let Some(flow) = self.flows.get_mut(&id) {
            flow.counts.started += 1;
        }
        if denied {
            self.count_denied(id, reporter, len);
        }
        if !self.conns.contains_key(&conn) {
            while self.conns.len() >= self.limits.max_connections {
                let Some(((_, _), victim)) = self.deadlines.pop_first() else {
                    break;
                };
                self.remove_conn(&victim);
                self.stats.conns_evicted += 1;
            }
            let deadline = (now, self.next_seq);
            self.next_seq += 1;
            self.deadlines.insert(deadline, conn);
            self.conns.insert(
                conn,
                Conn {
                    src: Side::Unseen,
                    dst: Side::Unseen,
                    denied: false,
                    orig: CtCounters::default(),
                    reply: CtCounters::default(),
                    deadline,
                },
            );
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            if denied {
                // Dropped on this node, so never confirmed: the other side's allow is not an
                // open connection either.
                c.denied = true;
                for side in [&mut c.src, &mut c.dst] {
                    if let Side::Open(open) = *side {
                        if let Some(flow) = self.flows.get_mut(&open) {
                            flow.live = flow.live.saturating_sub(1);
                        }
                        *side = Side::Closed;
                    }
                }
                *c.side_mut(reporter) = Side::Closed;
            } else if c.denied {
                *c.side_mut(reporter) = Side::Closed;
            } else {
                *c.side_mut(reporter) = Side::Open(id);
                if let Some(flow) = self.flows.get_mut(&id) {
                    flow.live += 1;
                }
            }
        }
        self.touch(now, conn);
    }

    /// The id of `key`, made if new and there is room; `None` (counted) when there is not.
    fn flow_id(&mut self, key: FlowKey) -> Option<FlowId> {
        if let Some(&id) = self.index.get(&key) {
            return Some(id);
        }
        if self.flows.len() >= self.limits.max_flows {
            self.stats.flows_dropped += 1;
            return None;
        }
        let id = FlowId(self.next_flow);
        self.next_flow += 1;
        self.index.insert(key.clone(), id);
        self.flows.insert(
            id,
            Flow {
                key,
                counts: Counts::default(),
                live: 0,
            },
        );
        Some(id)
    }

    /// A logged denied packet: sent by the source, received by the destination.
    fn count_denied(&mut self, id: FlowId, reporter: Reporter, len: u32) {
        let Some(flow) = self.flows.get_mut(&id) else {
            return;
        };
        let n = &mut flow.counts;
        match reporter {
            Reporter::Src => {
                n.packets_out = n.packets_out.saturating_add(1);
                n.bytes_out = n.bytes_out.saturating_add(u64::from(len));
            }
            Reporter::Dst => {
                n.packets_in = n.packets_in.saturating_add(1);
                n.bytes_in = n.bytes_in.saturating_add(u64::from(len));
            }
        }
    }

    /// Moves `conn`'s deadline to `now` plus its timeout.
    fn touch(&mut self, now: i64, conn: ConnKey) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let ttl = if c.is_open() {
            self.limits.idle_secs
        } else {
            self.limits.closed_secs
        };
        let at = now.saturating_add(ttl);
        if c.deadline.0 != at {
            self.deadlines.remove(&c.deadline);
            c.deadline.0 = at;
            self.deadlines.insert(c.deadline, conn);
        }
    }

    /// Forgets `conn`, releasing its open flows' live counts.
    fn remove_conn(&mut self, conn: &ConnKey) {
        let Some(c) = self.conns.remove(conn) else {
            return;
        };
        self.deadlines.remove(&c.deadline);
        for side in [c.src, c.dst] {
            if let Side::Open(id) = side {
                if let Some(flow) = self.flows.get_mut(&id) {
                    flow.live = flow.live.saturating_sub(1);
                }
            }
        }
    }

    /// The connection a conntrack entry is: by its original tuple, else by its reply tuple
    /// reversed (the packet's tuple after DNAT).
    fn find(&self, orig: Option<CtTuple>, reply: Option<CtTuple>) -> Option<ConnKey> {
        let by_orig = orig.map(|t| conn_key(five_tuple(&t)));
        if let Some(k) = by_orig.filter(|k| self.conns.contains_key(k)) {
            return Some(k);
        }
        let by_reply = reply.map(|t| {
            conn_key(FiveTuple {
                src: t.dst,
                dst: t.src,
                proto: t.proto,
                sport: t.dport,
                dport: t.sport,
            })
        });
        by_reply.filter(|k| self.conns.contains_key(k))
    }

    /// Checks the bookkeeping the invariants rest on.
    #[cfg(test)]
    fn assert_consistent(&self) {
        assert_eq!(self.deadlines.len(), self.conns.len());
        for (deadline, conn) in &self.deadlines {
            assert_eq!(self.conns.get(conn).map(|c| c.deadline), Some(*deadline));
        }
        assert_eq!(self.index.len(), self.flows.len());
        let mut open: HashMap<FlowId, u64> = HashMap::new();
        for c in self.conns.values() {
            assert!(!(c.denied && c.is_open()));
            for side in [c.src, c.dst] {
                if let Side::Open(id) = side {
                    *open.entry(id).or_default() += 1;
                }
            }
        }
        for (id, flow) in &self.flows {
            assert_eq!(open.get(id).copied().unwrap_or(0), flow.live);
        }
        assert!(open.keys().all(|id| self.flows.contains_key(id)));
        assert!(self.conns.len() <= self.limits.max_connections);
        assert!(self.pending.len() <= self.limits.max_pending);
        assert!(self.flows.len() <= self.limits.max_flows);
        assert!(self.pending.values().all(|p| p.steps.len() < MAX_TRACE));
    }
}

/// Protocols whose tuples have ports: TCP, UDP, DCCP, SCTP, UDP-Lite.
fn has_ports(proto: u8) -> bool {
    matches!(proto, 6 | 17 | 33 | 132 | 136)
}

fn conn_key(t: FiveTuple) -> ConnKey {
    if has_ports(t.proto) {
        t
    } else {
        FiveTuple {
            sport: 0,
            dport: 0,
            ..t
        }
    }
}

fn five_tuple(t: &CtTuple) -> FiveTuple {
    FiveTuple {
        src: t.src,
        dst: t.dst,
        proto: t.proto,
        sport: t.sport,
        dport: t.dport,
    }
}

/// The counters since `last` (all of `now` if they went backwards: a new entry on the same
/// tuple), and `now` kept as the new `last`.
fn delta(last: &mut CtCounters, now: Option<CtCounters>) -> CtCounters {
    let Some(now) = now else {
        return CtCounters::default();
    };
    let d = if now.packets >= last.packets && now.bytes >= last.bytes {
        CtCounters {
            packets: now.packets - last.packets,
            bytes: now.bytes - last.bytes,
        }
    } else {
        now
    };
    *last = now;
    d
}

fn verdict(action: Action) -> Verdict {
    match action {
        Action::Allow => Verdict::Allow,
        Action::Deny => Verdict::Deny,
        Action::Pass => Verdict::Pass,
    }
}

/// A parsed hit as one step of a trace, with its action; `None` when its direction is not the
/// reporter's (the renderer logs ingress to group 1 and egress to group 2) or its policy id is
/// not one [`prefixes::policy_id`] writes.
fn step(hit: Hit, reporter: Reporter) -> Option<(Step, Action)> {
    let want = match reporter {
        Reporter::Src => Direction::Outbound,
        Reporter::Dst => Direction::Inbound,
    };
    let plain = |kind, name, tier, action, rule_index| PolicyHit {
        kind,
        namespace: String::new(),
        name,
        tier,
        action: verdict(action),
        policy_index: -1,
        rule_index,
    };
    match hit {
        Hit::Rule { dir, .. } | Hit::TierEnd { dir, .. } | Hit::NoProfile { dir }
            if dir != want =>
        {
            None
        }
        Hit::Rule {
            action,
            owner: Owner::Policy,
            idx,
            id,
            ..
        } => {
            let (kind, namespace, name) = policy_names(&id)?;
            let hit = PolicyHit {
                kind,
                namespace: namespace.to_string(),
                name: name.to_string(),
                tier: String::new(),
                action: verdict(action),
                policy_index: -1,
                rule_index: i64::try_from(idx).ok()?,
            };
            Some((
                Step {
                    hit,
                    policy_id: Some(id),
                },
                action,
            ))
        }
        Hit::Rule {
            action,
            owner: Owner::Profile,
            idx,
            id,
            ..
        } => {
            let hit = plain(
                PolicyKind::Profile,
                id,
                String::new(),
                action,
                i64::try_from(idx).ok()?,
            );
            Some((
                Step {
                    hit,
                    policy_id: None,
                },
                action,
            ))
        }
        Hit::TierEnd { action, tier, .. } => {
            let hit = plain(PolicyKind::EndOfTier, String::new(), tier, action, -1);
            Some((
                Step {
                    hit,
                    policy_id: None,
                },
                action,
            ))
        }
        Hit::NoProfile { .. } => {
            let hit = plain(
                PolicyKind::NoProfile,
                String::new(),
                String::new(),
                Action::Deny,
                -1,
            );
            Some((
                Step {
                    hit,
                    policy_id: None,
                },
                Action::Deny,
            ))
        }
    }
}

/// The kind, namespace and name in a policy's prefix id, `<kind>/<namespace>/<name>` or
/// `<kind>/<name>`. The kind codes are `rules::names::kind_short`'s; Kubernetes' cluster
/// policies (`kcnp`) report as Kubernetes policies, the record having no kind of their own, and
/// a code of a kind we do not know as a Calico policy, namespaced or global as the id is.
fn policy_names(id: &str) -> Option<(PolicyKind, &str, &str)> {
    let mut parts = id.splitn(3, '/');
    let code = parts.next()?;
    let first = parts.next()?;
    let (namespace, name) = match parts.next() {
        Some(name) => (first, name),
        None => ("", first),
    };
    if code.is_empty() || name.is_empty() {
        return None;
    }
    let kind = match code {
        "np" => PolicyKind::CalicoNetworkPolicy,
        "gnp" => PolicyKind::GlobalNetworkPolicy,
        "knp" | "kcnp" => PolicyKind::NetworkPolicy,
        "snp" | "sgnp" | "sknp" => PolicyKind::Staged,
        _ if namespace.is_empty() => PolicyKind::GlobalNetworkPolicy,
        _ => PolicyKind::CalicoNetworkPolicy,
    };
    Some((kind, namespace, name))
}

/// The flow key a final hit fixes: the packet's ends named now, its trace's tiers looked up.
fn flow_key(
    reporter: Reporter,
    packet: &FiveTuple,
    action: Verdict,
    steps: Vec<Step>,
    names: &dyn Names,
) -> FlowKey {
    let trace = steps
        .into_iter()
        .map(|s| {
            let mut hit = s.hit;
            if let Some(id) = s.policy_id {
                hit.tier = names.tier_of(&id).unwrap_or_default();
                hit.policy_index = names.policy_index(&id).unwrap_or(-1);
            }
            hit
        })
        .collect();
    FlowKey {
        src: names.endpoint(packet.src),
        dst: names.endpoint(packet.dst),
        proto: packet.proto,
        dest_port: if has_ports(packet.proto) {
            packet.dport
        } else {
            0
        },
        reporter,
        action,
        trace,
    }
}

/// A packet's length from its IP header (IPv6: the payload length plus the fixed header); 0
/// when the header is cut short.
fn ip_len(p: &[u8]) -> u32 {
    let be16 = |at: usize| {
        p.get(at..at + 2)
            .map(|b| u32::from(u16::from_be_bytes([b[0], b[1]])))
    };
    match p.first().map(|b| b >> 4) {
        Some(4) => be16(2).unwrap_or(0),
        Some(6) => be16(4).map_or(0, |n| n + 40),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::flows::record::EndpointKind;
    use felix_nft_rules::nflog::rule_prefix;
    use netlink_wire::put_attr;
    use rtnl::ctevents::CtEntry;

    const T0: i64 = 1_700_000_000;
    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 2);
    const WEB: Ipv4Addr = Ipv4Addr::new(10, 65, 0, 3);
    const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 65, 9, 9);
    const SERVICE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
    /// The length every test packet claims in its IP header.
    const LEN: u32 = 60;

    /// The model of a node with two workloads, `prod/client` and `prod/web`.
    #[derive(Default)]
    struct Fake {
        endpoints: HashMap<IpAddr, Endpoint>,
        tiers: HashMap<String, String>,
        hashed: HashMap<Vec<u8>, Vec<u8>>,
        /// Every other address is one network end, so many addresses make one flow key.
        one_world: bool,
    }

    impl Fake {
        fn node() -> Fake {
            let mut f = Fake::default();
            f.endpoints
                .insert(CLIENT.into(), workload("prod", "client"));
            f.endpoints.insert(WEB.into(), workload("prod", "web"));
            for (id, tier) in [
                ("np/prod/deny-db", "security"),
                ("gnp/platform-pass", "platform"),
                ("np/prod/client-out", "default"),
                ("np/prod/web-in", "default"),
            ] {
                f.tiers.insert(id.into(), tier.into());
            }
            f
        }
    }

    impl Names for Fake {
        fn endpoint(&self, ip: IpAddr) -> Endpoint {
            match self.endpoints.get(&ip) {
                Some(ep) => ep.clone(),
                None if self.one_world => network("world"),
                None => network(&ip.to_string()),
            }
        }

        fn tier_of(&self, policy_id: &str) -> Option<String> {
            self.tiers.get(policy_id).cloned()
        }

        fn full_prefix(&self, hashed: &[u8]) -> Option<Vec<u8>> {
            self.hashed.get(hashed).cloned()
        }
    }

    fn workload(namespace: &str, name: &str) -> Endpoint {
        Endpoint {
            kind: EndpointKind::Workload,
            name: name.into(),
            namespace: namespace.into(),
            node: None,
        }
    }

    fn network(name: &str) -> Endpoint {
        Endpoint {
            kind: EndpointKind::Network,
            name: name.into(),
            namespace: String::new(),
            node: None,
        }
    }

    fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> FiveTuple {
        FiveTuple {
            src: src.into(),
            dst: dst.into(),
            proto: 6,
            sport,
            dport,
        }
    }

    fn ct_tuple(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> CtTuple {
        CtTuple {
            src: src.into(),
            dst: dst.into(),
            proto: 6,
            sport,
            dport,
        }
    }

    fn hit(group: u16, prefix: &str, packet: FiveTuple) -> NflogHit<'_> {
        NflogHit {
            group,
            prefix: prefix.as_bytes(),
            packet,
            ct_orig: None,
            len: LEN,
        }
    }

    /// A connection's entry without NAT: the reply is the original reversed.
    fn entry(orig: CtTuple, sent: (u64, u64), received: (u64, u64)) -> CtEntry {
        let reply = CtTuple {
            src: orig.dst,
            dst: orig.src,
            sport: orig.dport,
            dport: orig.sport,
            ..orig
        };
        nat_entry(orig, reply, sent, received)
    }

    fn nat_entry(
        orig: CtTuple,
        reply: CtTuple,
        (op, ob): (u64, u64),
        (rp, rb): (u64, u64),
    ) -> CtEntry {
        CtEntry {
            orig: Some(orig),
            reply: Some(reply),
            id: Some(7),
            counters_orig: Some(CtCounters {
                packets: op,
                bytes: ob,
            }),
            counters_reply: Some(CtCounters {
                packets: rp,
                bytes: rb,
            }),
            ..CtEntry::default()
        }
    }

    fn policy(
        kind: PolicyKind,
        namespace: &str,
        name: &str,
        tier: &str,
        action: Verdict,
        rule_index: i64,
    ) -> PolicyHit {
        PolicyHit {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            tier: tier.into(),
            action,
            policy_index: -1,
            rule_index,
        }
    }

    fn key(
        src: Endpoint,
        dst: Endpoint,
        dest_port: u16,
        reporter: Reporter,
        action: Verdict,
        trace: Vec<PolicyHit>,
    ) -> FlowKey {
        FlowKey {
            src,
            dst,
            proto: 6,
            dest_port,
            reporter,
            action,
            trace,
        }
    }

    /// A record of the interval `[T0, end)` with nothing counted.
    fn record(key: FlowKey, end: i64) -> FlowRecord {
        FlowRecord {
            key,
            start_time: T0,
            end_time: end,
            packets_in: 0,
            packets_out: 0,
            bytes_in: 0,
            bytes_out: 0,
            connections_started: 0,
            connections_completed: 0,
            connections_live: 0,
        }
    }

    #[test]
    fn allowed_by_a_profile() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let packet = tcp(CLIENT, 40000, REMOTE, 80);
        agg.on_nflog(T0, hit(GROUP_EGRESS, "ARE0|kns.prod", packet), &names);
        let want = FlowRecord {
            connections_started: 1,
            connections_live: 1,
            ..record(
                key(
                    workload("prod", "client"),
                    network("10.65.9.9"),
                    80,
                    Reporter::Src,
                    Verdict::Allow,
                    vec![policy(
                        PolicyKind::Profile,
                        "",
                        "kns.prod",
                        "",
                        Verdict::Allow,
                        0,
                    )],
                ),
                T0 + 15,
            )
        };
        assert_eq!(agg.flush(T0 + 15), vec![want]);
        assert_eq!((agg.connections(), agg.flows()), (1, 1));
        agg.assert_consistent();
    }

    /// Denied by rule 2 of a policy in tier `security`: the logged packet is counted, no
    /// connection is live. Kinds come from the id's code; an unknown tier stays empty.
    #[test]
    fn denied_by_a_policy_rule_with_its_tier() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let from_remote = tcp(REMOTE, 5555, WEB, 5432);
        agg.on_nflog(
            T0,
            hit(GROUP_INGRESS, "DPI2|np/prod/deny-db", from_remote),
            &names,
        );
        let other = tcp(REMOTE, 5556, WEB, 6379);
        agg.on_nflog(
            T0,
            hit(GROUP_INGRESS, "DPI0|knp/prod/default-deny", other),
            &names,
        );
        let global = tcp(REMOTE, 5557, WEB, 22);
        agg.on_nflog(T0, hit(GROUP_INGRESS, "DPI1|gnp/no-ssh", global), &names);
        let denied = |dest_port, hit| FlowRecord {
            packets_in: 1,
            bytes_in: u64::from(LEN),
            connections_started: 1,
            ..record(
                key(
                    network("10.65.9.9"),
                    workload("prod", "web"),
                    dest_port,
                    Reporter::Dst,
                    Verdict::Deny,
                    vec![hit],
                ),
                T0 + 15,
            )
        };
        let records = agg.flush(T0 + 15);
        assert_eq!(
            records,
            vec![
                denied(
                    22,
                    policy(
                        PolicyKind::GlobalNetworkPolicy,
                        "",
                        "no-ssh",
                        "",
                        Verdict::Deny,
                        1
                    )
                ),
                denied(
                    5432,
                    policy(
                        PolicyKind::CalicoNetworkPolicy,
                        "prod",
                        "deny-db",
                        "security",
                        Verdict::Deny,
                        2
                    )
                ),
                denied(
                    6379,
                    policy(
                        PolicyKind::NetworkPolicy,
                        "prod",
                        "default-deny",
                        "",
                        Verdict::Deny,
                        0
                    )
                ),
            ]
        );
        // The denied tuples are remembered (for retransmissions), their flows are not.
        assert_eq!((agg.connections(), agg.flows()), (3, 0));
        agg.assert_consistent();
    }

    /// A pass in tier `platform`, then an allow in `default`: both hits, in that order.
    #[test]
    fn a_pass_then_an_allow_in_the_next_tier() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let packet = tcp(CLIENT, 40000, REMOTE, 443);
        agg.on_nflog(
            T0,
            hit(GROUP_EGRESS, "PPE0|gnp/platform-pass", packet),
            &names,
        );
        assert_eq!(agg.pending_traces(), 1);
        agg.on_nflog(
            T0,
            hit(GROUP_EGRESS, "APE3|np/prod/client-out", packet),
            &names,
        );
        assert_eq!(agg.pending_traces(), 0);
        let records = agg.flush(T0 + 15);
        assert_eq!(records.len(), 1);
        assert_eq!(
            records[0].key.trace,
            vec![
                policy(
                    PolicyKind::GlobalNetworkPolicy,
                    "",
                    "platform-pass",
                    "platform",
                    Verdict::Pass,
                    0
                ),
                policy(
                    PolicyKind::CalicoNetworkPolicy,
                    "prod",
                    "client-out",
                    "default",
                    Verdict::Allow,
                    3
                ),
            ]
        );
        assert_eq!(records[0].key.action, Verdict::Allow);
    }

    /// `platform` passes at its end, `security` drops at its end.
    #[test]
    fn a_tier_s_end_denies() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let packet = tcp(CLIENT, 40000, REMOTE, 25);
        agg.on_nflog(T0, hit(GROUP_EGRESS, "PPE|platform", packet), &names);
        agg.on_nflog(T0, hit(GROUP_EGRESS, "DPE|security", packet), &names);
        let records = agg.flush(T0 + 15);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].key.action, Verdict::Deny);
        assert_eq!(
            records[0].key.trace,
            vec![
                policy(PolicyKind::EndOfTier, "", "", "platform", Verdict::Pass, -1),
                policy(PolicyKind::EndOfTier, "", "", "security", Verdict::Deny, -1),
            ]
        );
        assert_eq!((records[0].packets_out, records[0].bytes_out), (1, 60));
        assert_eq!(records[0].packets_in, 0);
    }

    #[test]
    fn no_profile_matched() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        agg.on_nflog(
            T0,
            hit(GROUP_INGRESS, "DRI", tcp(REMOTE, 1234, WEB, 9090)),
            &names,
        );
        let records = agg.flush(T0 + 15);
        assert_eq!(records.len(), 1);
        assert_eq!(
            records[0].key.trace,
            vec![policy(PolicyKind::NoProfile, "", "", "", Verdict::Deny, -1)]
        );
        assert_eq!(
            (records[0].key.reporter, records[0].key.action),
            (Reporter::Dst, Verdict::Deny)
        );
    }

    /// A pod talking to a pod of the same node: each side reports its own flow, and the
    /// connection's counters go to both, each from its side.
    #[test]
    fn both_reporters_of_a_pod_to_pod_flow() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let packet = tcp(CLIENT, 40000, WEB, 8080);
        agg.on_nflog(
            T0,
            hit(GROUP_INGRESS, "API1|np/prod/web-in", packet),
            &names,
        );
        agg.on_nflog(
            T0,
            hit(GROUP_EGRESS, "APE0|np/prod/client-out", packet),
            &names,
        );
        let orig = ct_tuple(CLIENT, 40000, WEB, 8080);
        agg.on_ct(T0 + 1, &CtEvent::Update(entry(orig, (3, 180), (2, 120))));
        let trace = |name: &str, rule_index| {
            vec![policy(
                PolicyKind::CalicoNetworkPolicy,
                "prod",
                name,
                "default",
                Verdict::Allow,
                rule_index,
            )]
        };
        let ends = || (workload("prod", "client"), workload("prod", "web"));
        let (src, dst) = ends();
        let from_src = FlowRecord {
            packets_out: 3,
            bytes_out: 180,
            packets_in: 2,
            bytes_in: 120,
            connections_started: 1,
            connections_live: 1,
            ..record(
                key(
                    src,
                    dst,
                    8080,
                    Reporter::Src,
                    Verdict::Allow,
                    trace("client-out", 0),
                ),
                T0 + 15,
            )
        };
        let (src, dst) = ends();
        let from_dst = FlowRecord {
            packets_in: 3,
            bytes_in: 180,
            packets_out: 2,
            bytes_out: 120,
            connections_started: 1,
            connections_live: 1,
            ..record(
                key(
                    src,
                    dst,
                    8080,
                    Reporter::Dst,
                    Verdict::Allow,
                    trace("web-in", 1),
                ),
                T0 + 15,
            )
        };
        assert_eq!(agg.flush(T0 + 15), vec![from_src, from_dst]);
        assert_eq!(agg.connections(), 1);
        agg.assert_consistent();
    }

    /// Conntrack's counters are cumulative: each interval gets what was added in it; the
    /// destroy's final counts complete the connection.
    #[test]
    fn counters_are_update_and_destroy_differences() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let packet = tcp(CLIENT, 40000, REMOTE, 80);
        agg.on_nflog(T0, hit(GROUP_EGRESS, "ARE0|kns.prod", packet), &names);
        let orig = ct_tuple(CLIENT, 40000, REMOTE, 80);
        agg.on_ct(T0, &CtEvent::New(entry(orig, (1, 60), (0, 0))));
        agg.on_ct(T0 + 1, &CtEvent::Update(entry(orig, (3, 180), (2, 120))));
        let first = agg.flush(T0 + 15);
        assert_eq!(first.len(), 1);
        let r = &first[0];
        assert_eq!(
            (r.packets_out, r.bytes_out, r.packets_in, r.bytes_in),
            (3, 180, 2, 120)
        );
        assert_eq!(
            (
                r.connections_started,
                r.connections_completed,
                r.connections_live
            ),
            (1, 0, 1)
        );

        agg.on_ct(T0 + 20, &CtEvent::Update(entry(orig, (5, 300), (4, 260))));
        agg.on_ct(T0 + 25, &CtEvent::Destroy(entry(orig, (6, 352), (4, 260))));
        let second = agg.flush(T0 + 30);
        assert_eq!(second.len(), 1);
        let r = &second[0];
        assert_eq!((r.start_time, r.end_time), (T0 + 15, T0 + 30));
        assert_eq!(
            (r.packets_out, r.bytes_out, r.packets_in, r.bytes_in),
            (3, 172, 2, 140)
        );
        assert_eq!(
            (
                r.connections_started,
                r.connections_completed,
                r.connections_live
            ),
            (0, 1, 0)
        );
        assert_eq!(agg.flush(T0 + 45), vec![]);
        assert_eq!((agg.connections(), agg.flows()), (0, 0));
        assert_eq!(agg.stats().ct_unmatched, 0);
        agg.assert_consistent();
    }

    /// A first packet sent again logs its hits again: one connection. A denied one counts
    /// each packet.
    #[test]
    fn a_retransmitted_first_packet_is_one_connection() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let allowed = tcp(CLIENT, 40000, REMOTE, 443);
        for at in [T0, T0 + 1] {
            agg.on_nflog(
                at,
                hit(GROUP_EGRESS, "PPE0|gnp/platform-pass", allowed),
                &names,
            );
            agg.on_nflog(
                at,
                hit(GROUP_EGRESS, "APE3|np/prod/client-out", allowed),
                &names,
            );
        }
        let denied = tcp(REMOTE, 5555, WEB, 5432);
        for at in [T0, T0 + 1, T0 + 3] {
            agg.on_nflog(
                at,
                hit(GROUP_INGRESS, "DPI2|np/prod/deny-db", denied),
                &names,
            );
        }
        assert_eq!(agg.pending_traces(), 0);
        let records = agg.flush(T0 + 15);
        assert_eq!(records.len(), 2);
        let (allow, deny) = (&records[0], &records[1]);
        assert_eq!(allow.key.action, Verdict::Allow);
        assert_eq!(allow.key.trace.len(), 2);
        assert_eq!((allow.connections_started, allow.connections_live), (1, 1));
        assert_eq!(allow.packets_out, 0, "conntrack counts allowed packets");
        assert_eq!(deny.key.action, Verdict::Deny);
        assert_eq!((deny.connections_started, deny.connections_live), (1, 0));
        assert_eq!((deny.packets_in, deny.bytes_in), (3, 180));
        assert_eq!(agg.stats().repeated_finals, 3);
        agg.assert_consistent();
    }

    /// Other programs' prefixes, other groups, a prefix in the wrong group and a hashed prefix
    /// nobody can resolve are counted and otherwise ignored; a hashed prefix the caller
    /// resolves reads as its whole form.
    #[test]
    fn foreign_and_hashed_prefixes_are_counted() {
        let mut names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let packet = tcp(REMOTE, 5555, WEB, 80);
        agg.on_nflog(T0, hit(5, "API0|np/prod/web-in", packet), &names);
        for prefix in [
            &b"calico-packet: "[..],
            b"",
            &[0xff, 0xfe, 0x00],
            b"APE0|np/prod/client-out",
            b"API0|no-kind",
            b"API0|np//",
        ] {
            let foreign = NflogHit {
                prefix,
                ..hit(GROUP_INGRESS, "", packet)
            };
            agg.on_nflog(T0, foreign, &names);
        }
        let long_id = format!("gnp/{}", "a-rather-long-policy-name-".repeat(3));
        let hashed = rule_prefix(Action::Deny, Owner::Policy, Direction::Inbound, 4, &long_id);
        assert!(prefixes::is_hashed(hashed.as_bytes()));
        agg.on_nflog(T0, hit(GROUP_INGRESS, &hashed, packet), &names);
        assert_eq!(agg.flush(T0 + 15), vec![]);
        let stats = agg.stats();
        assert_eq!(
            (
                stats.nflog_hits,
                stats.foreign_groups,
                stats.foreign_prefixes,
                stats.hashed_unresolved
            ),
            (8, 1, 7, 1)
        );
        assert_eq!((agg.connections(), agg.pending_traces()), (0, 0));

        let full = format!("DPI4|{long_id}");
        names
            .hashed
            .insert(hashed.clone().into_bytes(), full.into_bytes());
        agg.on_nflog(T0 + 20, hit(GROUP_INGRESS, &hashed, packet), &names);
        let records = agg.flush(T0 + 30);
        assert_eq!(records.len(), 1);
        assert_eq!(
            records[0].key.trace,
            vec![policy(
                PolicyKind::GlobalNetworkPolicy,
                "",
                &long_id["gnp/".len()..],
                "",
                Verdict::Deny,
                4
            )]
        );
        assert_eq!(agg.stats().foreign_prefixes, 7);
    }

    /// A million distinct connections against small limits: the tables stay within them and
    /// every drop is counted.
    #[test]
    fn limits_bound_memory() {
        let limits = Limits {
            max_connections: 100,
            max_pending: 50,
            max_flows: 20,
            ..Limits::default()
        };
        let mut agg = Aggregator::new(limits);
        let names = Fake {
            one_world: true,
            ..Fake::node()
        };
        let mut started = 0;
        let mut denied_started = 0;
        let (mut finals, mut passes, mut events) = (0u64, 0u64, 0u64);
        for i in 0u32..1_000_000 {
            let now = T0 + i64::from(i / 1000);
            let src = Ipv4Addr::from(0x0b00_0000 | i);
            let sport = 1024 + (i % 60_000) as u16;
            match i % 4 {
                0 => {
                    let packet = tcp(src, sport, WEB, 80);
                    let pass = hit(GROUP_INGRESS, "PPI0|gnp/platform-pass", packet);
                    agg.on_nflog(now, pass, &names);
                    passes += 1;
                }
                1 => {
                    let packet = tcp(src, sport, WEB, 8080);
                    agg.on_nflog(
                        now,
                        hit(GROUP_INGRESS, "API1|np/prod/web-in", packet),
                        &names,
                    );
                    finals += 1;
                }
                2 => {
                    let packet = tcp(src, sport, WEB, (i / 4 % 60_000) as u16);
                    agg.on_nflog(now, hit(GROUP_INGRESS, "DRI", packet), &names);
                    finals += 1;
                }
                _ => {
                    let orig = ct_tuple(src, sport, REMOTE, 443);
                    agg.on_ct(now, &CtEvent::Update(entry(orig, (1, 60), (1, 60))));
                    events += 1;
                }
            }
            if i % 100_000 == 99_999 {
                agg.assert_consistent();
                let records = agg.flush(now);
                assert!(records.len() <= 20);
                for r in &records {
                    started += r.connections_started;
                    if r.key.action == Verdict::Deny {
                        denied_started += r.connections_started;
                    }
                }
                agg.assert_consistent();
            }
        }
        let stats = agg.stats();
        assert_eq!(stats.nflog_hits, passes + finals);
        assert_eq!((stats.ct_events, stats.ct_unmatched), (events, events));
        assert_eq!(stats.foreign_prefixes, 0);
        // Every allowed connection started; a denied one started unless the flow table was
        // full, and every connection that started is live, evicted or expired.
        assert_eq!(started, 250_000 + denied_started);
        assert_eq!(stats.flows_dropped + denied_started, 250_000);
        assert!(stats.flows_dropped > 200_000, "{stats:?}");
        assert_eq!(
            stats.conns_evicted + stats.conns_expired + agg.connections() as u64,
            started
        );
        assert!(stats.conns_evicted > 200_000, "{stats:?}");
        // A pass either waits, expires or is dropped; none is ever finished here.
        assert!(
            stats.pending_dropped > 0 && stats.pending_expired > 0,
            "{stats:?}"
        );
        assert_eq!(
            stats.pending_dropped + stats.pending_expired + agg.pending_traces() as u64,
            passes
        );
        assert!(agg.connections() <= 100 && agg.pending_traces() <= 50 && agg.flows() <= 20);
    }

    /// A flush reports the interval, resets the counts and forgets keys with nothing live; a
    /// connection silent for longer than the idle limit is expired.
    #[test]
    fn flush_resets_and_forgets_idle_keys() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let short = tcp(CLIENT, 40000, REMOTE, 80);
        let long = tcp(CLIENT, 40001, REMOTE, 5432);
        agg.on_nflog(T0, hit(GROUP_EGRESS, "ARE0|kns.prod", short), &names);
        agg.on_nflog(T0, hit(GROUP_EGRESS, "ARE0|kns.prod", long), &names);
        let short_ct = ct_tuple(CLIENT, 40000, REMOTE, 80);
        agg.on_ct(
            T0 + 2,
            &CtEvent::Destroy(entry(short_ct, (4, 240), (3, 200))),
        );
        let first = agg.flush(T0 + 15);
        let summary = |records: &[FlowRecord]| -> Vec<(u16, u64, u64, u64, u64)> {
            records
                .iter()
                .map(|r| {
                    (
                        r.key.dest_port,
                        r.packets_out,
                        r.connections_started,
                        r.connections_completed,
                        r.connections_live,
                    )
                })
                .collect()
        };
        assert_eq!(summary(&first), [(80, 4, 1, 1, 0), (5432, 0, 1, 0, 1)]);
        assert_eq!(agg.flows(), 1);

        let second = agg.flush(T0 + 30);
        assert_eq!(summary(&second), [(5432, 0, 0, 0, 1)]);
        assert_eq!(
            (second[0].start_time, second[0].end_time),
            (T0 + 15, T0 + 30)
        );

        // No event for over an hour: the destroy was lost.
        let third = agg.flush(T0 + 3_601);
        assert_eq!(third, vec![]);
        assert_eq!((agg.connections(), agg.flows()), (0, 0));
        assert_eq!(agg.stats().conns_expired, 1);
        agg.assert_consistent();
    }

    /// Passes whose final hit never came do not join a later packet's trace.
    #[test]
    fn stale_passes_expire() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let packet = tcp(CLIENT, 40000, REMOTE, 443);
        agg.on_nflog(
            T0,
            hit(GROUP_EGRESS, "PPE0|gnp/platform-pass", packet),
            &names,
        );
        agg.on_nflog(
            T0 + 10,
            hit(GROUP_EGRESS, "APE3|np/prod/client-out", packet),
            &names,
        );
        let other = tcp(CLIENT, 40001, REMOTE, 443);
        agg.on_nflog(
            T0 + 10,
            hit(GROUP_EGRESS, "PPE0|gnp/platform-pass", other),
            &names,
        );
        let records = agg.flush(T0 + 20);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].key.trace.len(), 1);
        assert_eq!(agg.pending_traces(), 0);
        assert_eq!(agg.stats().pending_expired, 2);
    }

    /// DNAT to a service: NFLOG without the conntrack entry saw the translated tuple, which
    /// conntrack's events carry as the reply reversed; with the entry, its original tuple
    /// keys the connection.
    #[test]
    fn dnat_matches_by_the_reply_tuple() {
        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        let translated = tcp(CLIENT, 40000, WEB, 8080);
        agg.on_nflog(
            T0,
            hit(GROUP_EGRESS, "APE0|np/prod/client-out", translated),
            &names,
        );
        let orig = ct_tuple(CLIENT, 40000, SERVICE, 80);
        let reply = ct_tuple(WEB, 8080, CLIENT, 40000);
        agg.on_ct(
            T0 + 1,
            &CtEvent::Update(nat_entry(orig, reply, (2, 120), (1, 60))),
        );

        let with_ct = NflogHit {
            ct_orig: Some(ct_tuple(CLIENT, 40001, SERVICE, 80)),
            ..hit(
                GROUP_EGRESS,
                "APE0|np/prod/client-out",
                tcp(CLIENT, 40001, WEB, 8080),
            )
        };
        agg.on_nflog(T0 + 2, with_ct, &names);
        let orig2 = ct_tuple(CLIENT, 40001, SERVICE, 80);
        let reply2 = ct_tuple(WEB, 8080, CLIENT, 40001);
        agg.on_ct(
            T0 + 3,
            &CtEvent::Destroy(nat_entry(orig2, reply2, (5, 400), (4, 300))),
        );

        // Neither tuple is known.
        let stranger = ct_tuple(REMOTE, 1, CLIENT, 2);
        agg.on_ct(T0 + 3, &CtEvent::New(entry(stranger, (1, 60), (0, 0))));
        agg.on_ct(T0 + 3, &CtEvent::Destroy(entry(stranger, (1, 60), (0, 0))));

        let records = agg.flush(T0 + 15);
        assert_eq!(records.len(), 1);
        let r = &records[0];
        assert_eq!((r.key.dst.name.as_str(), r.key.dest_port), ("web", 8080));
        assert_eq!(
            (r.packets_out, r.bytes_out, r.packets_in, r.bytes_in),
            (7, 520, 5, 360)
        );
        assert_eq!(
            (
                r.connections_started,
                r.connections_completed,
                r.connections_live
            ),
            (2, 1, 1)
        );
        assert_eq!(agg.stats().ct_unmatched, 1);
        agg.assert_consistent();
    }

    /// A logged packet's hit: its tuple and length from the headers, the connection from
    /// `NFULA_CT`; unreadable headers are counted.
    #[test]
    fn a_logged_packet_becomes_a_hit() {
        // ctnetlink attribute types (uapi `nfnetlink_conntrack.h`).
        const CTA_TUPLE_ORIG: u16 = 1;
        const CTA_TUPLE_IP: u16 = 1;
        const CTA_TUPLE_PROTO: u16 = 2;
        const CTA_IP_V4_SRC: u16 = 1;
        const CTA_IP_V4_DST: u16 = 2;
        const CTA_PROTO_NUM: u16 = 1;
        const CTA_PROTO_SRC_PORT: u16 = 2;
        const CTA_PROTO_DST_PORT: u16 = 3;
        let mut ip = Vec::new();
        put_attr(&mut ip, CTA_IP_V4_SRC, &CLIENT.octets());
        put_attr(&mut ip, CTA_IP_V4_DST, &SERVICE.octets());
        let mut proto = Vec::new();
        put_attr(&mut proto, CTA_PROTO_NUM, &[6]);
        put_attr(&mut proto, CTA_PROTO_SRC_PORT, &40000u16.to_be_bytes());
        put_attr(&mut proto, CTA_PROTO_DST_PORT, &80u16.to_be_bytes());
        let mut tuple = Vec::new();
        put_attr(&mut tuple, CTA_TUPLE_IP, &ip);
        put_attr(&mut tuple, CTA_TUPLE_PROTO, &proto);
        let mut ct = Vec::new();
        put_attr(&mut ct, CTA_TUPLE_ORIG, &tuple);

        let mut payload = vec![0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0];
        payload.extend_from_slice(&CLIENT.octets());
        payload.extend_from_slice(&WEB.octets());
        payload.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90]);
        let logged = LoggedPacket {
            group: GROUP_EGRESS,
            family: libc::AF_INET as u8,
            prefix: b"APE0|np/prod/client-out".to_vec(),
            hook: 2,
            indev: Some(3),
            outdev: Some(4),
            mark: None,
            payload,
            ct: Some(ct),
            ct_info: Some(2),
        };
        let got = NflogHit::from_packet(&logged).expect("a readable packet");
        assert_eq!(
            got,
            NflogHit {
                group: GROUP_EGRESS,
                prefix: b"APE0|np/prod/client-out",
                packet: tcp(CLIENT, 40000, WEB, 8080),
                ct_orig: Some(ct_tuple(CLIENT, 40000, SERVICE, 80)),
                len: 60,
            }
        );

        let names = Fake::node();
        let mut agg = Aggregator::new(Limits::default());
        agg.on_packet(T0, &logged, &names);
        let cut = LoggedPacket {
            payload: vec![0x45, 0, 0],
            ..logged.clone()
        };
        agg.on_packet(T0, &cut, &names);
        let stats = agg.stats();
        assert_eq!((stats.nflog_hits, stats.unreadable_packets), (2, 1));
        assert_eq!(agg.connections(), 1);

        let mut v6 = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        v6.extend_from_slice(&[0xfd; 32]);
        assert_eq!((ip_len(&v6), ip_len(&v6[..5]), ip_len(&[])), (60, 0, 0));
    }
}
