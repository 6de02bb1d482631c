//! The nf_tables object model: tables, chains, rules, sets and elements as the kernel holds them.
//!
//! This is the contract between the renderer (`rules`, which builds these values) and the codec
//! (`crate::codec`, which encodes them into netlink and decodes dumps back into them). It knows
//! nftables and nothing about Calico.
//!
//! Expressions are modelled at the kernel's level — one [`Expr`] per netlink expression, with
//! explicit registers — so that `decode(encode(x)) == x` holds exactly and what we compare is what
//! the kernel stores. Idioms such as "`iifname cali*`" or "`ip saddr 10.0.0.0/8`" are built from
//! these by `crate::build`.
//!
//! Byte order: register *data* (`Cmp::data`, element keys, ...)
//! is stored here exactly as the kernel sees it — payload-derived values (addresses, ports) in
//! network order, meta/ct values (mark, l4proto, ct state) in host order. Integer *attributes*
//! (offsets, lengths, flags) are plain Rust integers; the codec converts them to big-endian.

use std::collections::BTreeMap;

/// Address family of a table (`NFPROTO_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// `NFPROTO_INET` (1)
    Inet,
    /// `NFPROTO_IPV4` (2)
    Ip,
    /// `NFPROTO_ARP` (3)
    Arp,
    /// `NFPROTO_IPV6` (10)
    Ip6,
}

impl Family {
    /// The `NFPROTO_*` number, as sent in `nfgenmsg.nfgen_family` (and `NFTA_NAT_FAMILY`).
    pub const fn nfproto(self) -> u8 {
        match self {
            Family::Inet => 1,
            Family::Ip => 2,
            Family::Arp => 3,
            Family::Ip6 => 10,
        }
    }

    /// The family of an `NFPROTO_*` number; `None` for one not modelled (bridge, netdev, ...).
    pub const fn from_nfproto(v: u8) -> Option<Family> {
        match v {
            1 => Some(Family::Inet),
            2 => Some(Family::Ip),
            3 => Some(Family::Arp),
            10 => Some(Family::Ip6),
            _ => None,
        }
    }

    /// The keyword `nft` uses (`ip`, `ip6`, `inet`, `arp`).
    pub const fn name(self) -> &'static str {
        match self {
            Family::Inet => "inet",
            Family::Ip => "ip",
            Family::Arp => "arp",
            Family::Ip6 => "ip6",
        }
    }
}

/// `NFT_TABLE_F_*` flags.
pub mod table_flags {
    /// `NFT_TABLE_F_DORMANT`: the table's base chains are off their hooks; it sees no packet.
    pub const DORMANT: u32 = 0x1;
    /// The table belongs to the socket that created it; other processes get EPERM.
    pub const OWNER: u32 = 0x2;
    /// With OWNER (kernel ≥ 6.9): the table outlives its owner and can be re-adopted.
    pub const PERSIST: u32 = 0x4;
}

/// A table and everything in it: the unit the renderer produces and the dump returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Address family (`nfgenmsg.nfgen_family`); the same name in two families is two tables.
    pub family: Family,
    /// Table name (`NFTA_TABLE_NAME`).
    pub name: String,
    /// `NFT_TABLE_F_*`.
    pub flags: u32,
    /// Chains by name (ordered for determinism).
    pub chains: BTreeMap<String, Chain>,
    /// Sets and maps by name. An anonymous set (flags `ANONYMOUS|CONSTANT`, name `__set<N>`) is
    /// kept here too and referenced by that name from its rule's lookup; the codec sends it just
    /// before the rule. Prefer named sets: anonymous ones make big commits superlinear
    /// (docs/design.md, cost model).
    pub sets: BTreeMap<String, Set>,
}

impl Table {
    /// An empty table without flags.
    pub fn new(family: Family, name: impl Into<String>) -> Table {
        Table {
            family,
            name: name.into(),
            flags: 0,
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
        }
    }
}

/// A change to one table: chains and sets to upsert (`Some`) or delete (`None`), by name. The
/// incremental renderer produces these; the reconciler folds them into its desired tables and
/// diffs only what they name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TablePatch {
    /// Family of the patched table.
    pub family: Family,
    /// Name of the patched table.
    pub name: String,
    /// Chains to replace whole, rules included (`Some`), or to delete (`None`).
    pub chains: BTreeMap<String, Option<Chain>>,
    /// Sets and maps to replace whole, elements included (`Some`), or to delete (`None`).
    pub sets: BTreeMap<String, Option<Set>>,
    /// Element changes of sets the patch does not replace whole: (to delete, to add). Kept
    /// sorted in the set (the renderer's order), so folding equals rendering.
    pub elements: BTreeMap<String, ElementDelta>,
}

/// Elements to delete from and add to one set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElementDelta {
    /// Elements to delete (those not in the set are ignored).
    pub del: Vec<Element>,
    /// Elements to add (those already in the set are ignored).
    pub add: Vec<Element>,
}

impl ElementDelta {
    /// Leaves out an element both deleted and added as it was (a map element whose key and
    /// value stay): deleting then adding it changes nothing, and a delta that names it on both
    /// sides must not read as "gone". Sorts both lists.
    pub fn cancel_unchanged(&mut self) {
        self.del.sort();
        self.add.sort();
        let both: Vec<Element> = self
            .del
            .iter()
            .filter(|e| self.add.binary_search(e).is_ok())
            .cloned()
            .collect();
        if !both.is_empty() {
            self.del.retain(|e| both.binary_search(e).is_err());
            self.add.retain(|e| both.binary_search(e).is_err());
        }
    }
}

impl TablePatch {
    /// A patch of table `name` in `family` that changes nothing yet.
    pub fn new(family: Family, name: impl Into<String>) -> TablePatch {
        TablePatch {
            family,
            name: name.into(),
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            elements: BTreeMap::new(),
        }
    }

    /// True when the patch names no chain, set or element delta.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.sets.is_empty() && self.elements.is_empty()
    }

    /// Folds `patches` into `store`, creating tables that are not there yet.
    pub fn fold_all(patches: Vec<TablePatch>, store: &mut Vec<Table>) {
        for p in patches {
            let i = match store
                .iter()
                .position(|t| t.family == p.family && t.name == p.name)
            {
                Some(i) => i,
                None => {
                    store.push(Table::new(p.family, p.name.clone()));
                    store.len() - 1
                }
            };
            p.apply_to(&mut store[i]);
        }
    }

    /// Applies the patch to `t` (same family and name) and returns what it replaced or removed,
    /// as a table holding only those objects.
    pub fn apply_to(self, t: &mut Table) -> Table {
        let mut old = Table {
            flags: t.flags,
            ..Table::new(t.family, t.name.clone())
        };
        for (name, c) in self.chains {
            let prev = match c {
                Some(c) => t.chains.insert(name.clone(), c),
                None => t.chains.remove(&name),
            };
            if let Some(p) = prev {
                old.chains.insert(name, p);
            }
        }
        for (name, s) in self.sets {
            let prev = match s {
                Some(s) => t.sets.insert(name.clone(), s),
                None => t.sets.remove(&name),
            };
            if let Some(p) = prev {
                old.sets.insert(name, p);
            }
        }
        for (name, d) in self.elements {
            let Some(set) = t.sets.get_mut(&name) else {
                continue;
            };
            // What the delta removes, as a set with the same definition (for the diff).
            let mut removed = set.clone_def();
            for e in d.del {
                if let Ok(i) = set.elements.binary_search(&e) {
                    removed.elements.push(set.elements.remove(i));
                }
            }
            for e in d.add {
                if let Err(i) = set.elements.binary_search(&e) {
                    set.elements.insert(i, e);
                }
            }
            old.sets.entry(name).or_insert(removed);
        }
        old
    }
}

/// Netfilter hooks (`NF_INET_*`; for the ARP family `NF_ARP_IN` = 0, `NF_ARP_OUT` = 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// `NF_INET_PRE_ROUTING` (0): every incoming packet, before the routing decision.
    Prerouting,
    /// `NF_INET_LOCAL_IN` (1): packets delivered to this host.
    Input,
    /// `NF_INET_FORWARD` (2): packets routed through this host.
    Forward,
    /// `NF_INET_LOCAL_OUT` (3): packets this host sends.
    Output,
    /// `NF_INET_POST_ROUTING` (4): every outgoing packet, after the routing decision.
    Postrouting,
    /// Raw hook number, for families whose numbering differs (ARP) or unknown hooks.
    Other(u32),
}

impl Hook {
    /// The hook number sent in `NFTA_HOOK_HOOKNUM`.
    pub const fn number(self) -> u32 {
        match self {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
            Hook::Other(n) => n,
        }
    }
}

/// Base chain type (`NFTA_CHAIN_TYPE`, a string on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainType {
    /// `filter`: sees every packet of its hook.
    Filter,
    /// `nat`: sees the first packet of each connection; its NAT statements set up the mapping.
    Nat,
    /// `route` (output hook): a locally sent packet whose mark or addresses a rule changed is
    /// routed again.
    Route,
}

impl ChainType {
    /// The type's name, as sent in `NFTA_CHAIN_TYPE`.
    pub const fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
            ChainType::Route => "route",
        }
    }
}

/// What makes a chain a base chain: attached to a hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseChain {
    /// Chain type (`NFTA_CHAIN_TYPE`).
    pub chain_type: ChainType,
    /// Hook the chain is attached to (`NFTA_HOOK_HOOKNUM`).
    pub hook: Hook,
    /// Order among the chains of the same hook, lowest first (`NFTA_HOOK_PRIORITY`, signed).
    pub priority: i32,
    /// Chain policy: `Verdict::Accept` (the default) or `Verdict::Drop`.
    pub policy: Verdict,
}

/// A chain with its rules, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Chain name (`NFTA_CHAIN_NAME`).
    pub name: String,
    /// `Some` for a base chain (on a hook); `None` for a regular chain, reached by jump or goto.
    pub base: Option<BaseChain>,
    /// The rules, in evaluation order.
    pub rules: Vec<Rule>,
}

impl Chain {
    /// A regular chain (on no hook) without rules.
    pub fn regular(name: impl Into<String>) -> Chain {
        Chain {
            name: name.into(),
            base: None,
            rules: Vec::new(),
        }
    }
}

/// A rule's expressions. Shared: rules with the same expressions (the thousands of endpoint
/// chains repeat a few bodies; only their comments differ) hold one copy, and copying a rule
/// copies a pointer (desired state was ~0.5 KiB per rule).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exprs(std::sync::Arc<[Expr]>);

impl Exprs {
    /// Whether both hold the very same copy.
    pub fn shares(&self, other: &Exprs) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// How many rules hold this copy.
    pub fn holders(&self) -> usize {
        std::sync::Arc::strong_count(&self.0)
    }

    /// The address of this copy: equal for rules that [`Exprs::shares`], and not reused while
    /// any holder lives.
    pub fn addr(&self) -> usize {
        std::sync::Arc::as_ptr(&self.0).cast::<Expr>() as usize
    }
}

impl std::ops::Deref for Exprs {
    type Target = [Expr];
    fn deref(&self) -> &[Expr] {
        &self.0
    }
}

impl std::hash::Hash for Exprs {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As the slice hashes: `Exprs` is looked up by `&[Expr]` (`Borrow`).
        self.0[..].hash(state)
    }
}

impl std::borrow::Borrow<[Expr]> for Exprs {
    fn borrow(&self) -> &[Expr] {
        &self.0
    }
}

impl From<Vec<Expr>> for Exprs {
    fn from(v: Vec<Expr>) -> Exprs {
        Exprs(v.into())
    }
}

impl<const N: usize> From<[Expr; N]> for Exprs {
    fn from(a: [Expr; N]) -> Exprs {
        Exprs(std::sync::Arc::new(a))
    }
}

impl FromIterator<Expr> for Exprs {
    fn from_iter<I: IntoIterator<Item = Expr>>(it: I) -> Exprs {
        Exprs(it.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a Exprs {
    type Item = &'a Expr;
    type IntoIter = std::slice::Iter<'a, Expr>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

// Callers written against the former `Vec<Expr>` field still compare with a vector.
impl PartialEq<Vec<Expr>> for Exprs {
    fn eq(&self, other: &Vec<Expr>) -> bool {
        self.0[..] == other[..]
    }
}

/// One rule: a list of expressions evaluated in order, plus its userdata comment.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Rule {
    /// The expressions, in evaluation order (`NFTA_RULE_EXPRESSIONS`).
    pub exprs: Exprs,
    /// Rule userdata comment (libnftnl udata TLV type 0): at most 253 bytes, as the TLV's header
    /// and the NUL fill the kernel's 256 bytes of userdata. `nft` prints it as `comment "..."`.
    pub comment: Option<String>,
    /// Kernel handle: `None` in desired state, set when read back from the kernel.
    pub handle: Option<u64>,
}

/// Registers. `NFT_REG_VERDICT` = 0; 16-byte `NFT_REG_1..4` = 1..4; 4-byte `NFT_REG32_00..15`
/// = 8..23. We use the 32-bit register numbering so concatenations can address each component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg(pub u32);

impl Reg {
    /// `NFT_REG_VERDICT` (0): the verdict register (immediate verdicts, verdict-map lookups).
    pub const VERDICT: Reg = Reg(0);
    /// `NFT_REG_1` (1): 16 bytes, the same storage as `NFT_REG32_00..03`.
    pub const R1: Reg = Reg(1);
    /// `NFT_REG_2` (2): 16 bytes, the same storage as `NFT_REG32_04..07`.
    pub const R2: Reg = Reg(2);
    /// `NFT_REG_3` (3): 16 bytes, the same storage as `NFT_REG32_08..11`.
    pub const R3: Reg = Reg(3);
    /// `NFT_REG_4` (4): 16 bytes, the same storage as `NFT_REG32_12..15`.
    pub const R4: Reg = Reg(4);
    /// `NFT_REG32_00 + n`.
    pub const fn r32(n: u32) -> Reg {
        Reg(8 + n)
    }
}

/// A verdict (`NFT_*` / `NF_*` codes).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// `NF_ACCEPT` (1)
    Accept,
    /// `NF_DROP` (0)
    Drop,
    /// `NFT_CONTINUE` (-1)
    Continue,
    /// `NFT_BREAK` (-2)
    Break,
    /// `NFT_JUMP` (-3)
    Jump(String),
    /// `NFT_GOTO` (-4)
    Goto(String),
    /// `NFT_RETURN` (-5)
    Return,
    /// Any other code, kept so that it round-trips.
    Other(i32),
}

/// `NFT_META_*` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetaKey {
    /// `NFT_META_LEN` (0)
    Len,
    /// `NFT_META_PROTOCOL` (1)
    Protocol,
    /// `NFT_META_MARK` (3)
    Mark,
    /// `NFT_META_IIF` (4)
    Iif,
    /// `NFT_META_OIF` (5)
    Oif,
    /// `NFT_META_IIFNAME` (6)
    IifName,
    /// `NFT_META_OIFNAME` (7)
    OifName,
    /// `NFT_META_IIFTYPE` (8)
    IifType,
    /// `NFT_META_OIFTYPE` (9)
    OifType,
    /// `NFT_META_NFPROTO` (15)
    NfProto,
    /// `NFT_META_L4PROTO` (16)
    L4Proto,
    /// `NFT_META_PKTTYPE` (19)
    PktType,
    /// Any other `NFT_META_*` key, by number.
    Other(u32),
}

/// `NFT_PAYLOAD_*_HEADER` bases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PayloadBase {
    /// `NFT_PAYLOAD_LL_HEADER` (0)
    LinkLayer,
    /// `NFT_PAYLOAD_NETWORK_HEADER` (1)
    Network,
    /// `NFT_PAYLOAD_TRANSPORT_HEADER` (2)
    Transport,
    /// `NFT_PAYLOAD_INNER_HEADER` (3)
    Inner,
}

/// `NFT_CMP_*` operators (also used by `range`, which accepts only `Eq`/`Neq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CmpOp {
    /// `NFT_CMP_EQ` (0): equal.
    Eq,
    /// `NFT_CMP_NEQ` (1): not equal.
    Neq,
    /// `NFT_CMP_LT` (2): less than. Order comparisons are the kernel's `memcmp` of the bytes:
    /// numeric only for big-endian data.
    Lt,
    /// `NFT_CMP_LTE` (3): less than or equal (`memcmp` order).
    Lte,
    /// `NFT_CMP_GT` (4): greater than (`memcmp` order).
    Gt,
    /// `NFT_CMP_GTE` (5): greater than or equal (`memcmp` order).
    Gte,
}

/// `NFT_CT_*` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CtKey {
    /// `NFT_CT_STATE` (0)
    State,
    /// `NFT_CT_DIRECTION` (1)
    Direction,
    /// `NFT_CT_STATUS` (2)
    Status,
    /// `NFT_CT_MARK` (3)
    Mark,
    /// Any other `NFT_CT_*` key, by number.
    Other(u32),
}

/// Conntrack state bits as `ct state` loads them (host order): `NF_CT_STATE_BIT(ctinfo)`.
pub mod ct_state {
    /// `invalid` (`NF_CT_STATE_INVALID_BIT`): the packet could not be tracked.
    pub const INVALID: u32 = 1;
    /// `established` (`IP_CT_ESTABLISHED`): a packet, either way, of a connection that has
    /// seen a reply.
    pub const ESTABLISHED: u32 = 2;
    /// `related` (`IP_CT_RELATED`): a packet related to a known connection (an ICMP error
    /// about it, a connection a helper expects).
    pub const RELATED: u32 = 4;
    /// `new` (`IP_CT_NEW`): a packet of a connection that has not seen a reply yet.
    pub const NEW: u32 = 8;
    /// `untracked` (`NF_CT_STATE_UNTRACKED_BIT`): the packet bypassed conntrack (`notrack`).
    pub const UNTRACKED: u32 = 64;
}

/// Conntrack status bits (`IPS_*`) as `ct status` loads them (host order).
pub mod ct_status {
    /// `IPS_EXPECTED`: the connection was expected by another (a helper's expectation).
    pub const EXPECTED: u32 = 1;
    /// `IPS_SEEN_REPLY`: packets were seen in both directions.
    pub const SEEN_REPLY: u32 = 2;
    /// `IPS_ASSURED`: the connection is kept when the table is full (not an early-drop victim).
    pub const ASSURED: u32 = 4;
    /// `IPS_CONFIRMED`: the entry is in the conntrack table (its first packet got through).
    pub const CONFIRMED: u32 = 8;
    /// `IPS_SRC_NAT`: the connection's source is translated.
    pub const SRC_NAT: u32 = 16;
    /// `IPS_DST_NAT`: the connection's destination is translated.
    pub const DST_NAT: u32 = 32;
}

/// `NFT_REJECT_*` types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectType {
    /// `NFT_REJECT_ICMP_UNREACH` (0), with an ICMP(v6) code.
    IcmpUnreach,
    /// `NFT_REJECT_TCP_RST` (1)
    TcpRst,
    /// `NFT_REJECT_ICMPX_UNREACH` (2), with an `NFT_REJECT_ICMPX_*` code.
    IcmpxUnreach,
}

/// `NFT_NAT_*` types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NatType {
    /// `NFT_NAT_SNAT` (0): rewrites the source.
    Snat,
    /// `NFT_NAT_DNAT` (1): rewrites the destination.
    Dnat,
}

/// `NF_NAT_RANGE_*` flags used by nat/masquerade.
pub mod nat_flags {
    /// `NF_NAT_RANGE_MAP_IPS`: an address range is given (the kernel sets it when `nat` has
    /// address registers).
    pub const MAP_IPS: u32 = 0x1;
    /// `NF_NAT_RANGE_PROTO_SPECIFIED`: a port range is given (the kernel sets it when the
    /// expression has port registers).
    pub const PROTO_SPECIFIED: u32 = 0x2;
    /// `NF_NAT_RANGE_PROTO_RANDOM` (`random`): the port is chosen by a keyed hash.
    pub const PROTO_RANDOM: u32 = 0x4;
    /// `NF_NAT_RANGE_PERSISTENT` (`persistent`): a client gets the same address every time.
    pub const PERSISTENT: u32 = 0x8;
    /// `NF_NAT_RANGE_PROTO_RANDOM_FULLY` (`fully-random`): the port is chosen at random.
    pub const PROTO_RANDOM_FULLY: u32 = 0x10;
}

/// `NFT_FIB_RESULT_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FibResult {
    /// `NFT_FIB_RESULT_OIF` (1)
    Oif,
    /// `NFT_FIB_RESULT_OIFNAME` (2)
    OifName,
    /// `NFT_FIB_RESULT_ADDRTYPE` (3)
    AddrType,
}

/// `NFTA_FIB_F_*` flags.
pub mod fib_flags {
    /// `NFTA_FIB_F_SADDR`: look up the packet's source address.
    pub const SADDR: u32 = 0x1;
    /// `NFTA_FIB_F_DADDR`: look up the packet's destination address.
    pub const DADDR: u32 = 0x2;
    /// `NFTA_FIB_F_MARK`: the lookup uses the packet's mark (policy routing).
    pub const MARK: u32 = 0x4;
    /// `NFTA_FIB_F_IIF`: the lookup is bound to the input interface.
    pub const IIF: u32 = 0x8;
    /// `NFTA_FIB_F_OIF`: the lookup is bound to the output interface.
    pub const OIF: u32 = 0x10;
    /// `NFTA_FIB_F_PRESENT`: the result is only whether there is one (`fib ... exists`).
    pub const PRESENT: u32 = 0x20;
}

/// `NFT_LIMIT_*` types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LimitType {
    /// `NFT_LIMIT_PKTS` (0): the rate counts packets.
    Packets,
    /// `NFT_LIMIT_PKT_BYTES` (1): the rate counts bytes.
    Bytes,
}

/// One kernel expression. Each variant maps 1:1 to an nf_tables expression type; see the
/// uapi (`linux/netfilter/nf_tables.h`) for the attribute of each field.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `meta load <key> => reg`
    Meta {
        /// What to load (`NFTA_META_KEY`).
        key: MetaKey,
        /// Register it lands in (`NFTA_META_DREG`).
        dreg: Reg,
    },
    /// `meta set <key> with reg` (e.g. `meta mark set`)
    MetaSet {
        /// What to set (`NFTA_META_KEY`).
        key: MetaKey,
        /// Register holding the new value (`NFTA_META_SREG`).
        sreg: Reg,
    },
    /// `payload load <len>b @ <base> header + <offset> => reg`
    Payload {
        /// Header the offset counts from (`NFTA_PAYLOAD_BASE`).
        base: PayloadBase,
        /// Byte offset into that header (`NFTA_PAYLOAD_OFFSET`).
        offset: u32,
        /// Bytes to load (`NFTA_PAYLOAD_LEN`).
        len: u32,
        /// Register the bytes land in, in packet (network) order (`NFTA_PAYLOAD_DREG`).
        dreg: Reg,
    },
    /// `payload write reg => <len>b @ <base> header + <offset>`, with checksum fix-up
    /// (`csum_type` `NFT_PAYLOAD_CSUM_*`, `csum_offset`, `csum_flags`).
    PayloadSet {
        /// Header the offset counts from (`NFTA_PAYLOAD_BASE`).
        base: PayloadBase,
        /// Byte offset into that header (`NFTA_PAYLOAD_OFFSET`).
        offset: u32,
        /// Bytes to write (`NFTA_PAYLOAD_LEN`).
        len: u32,
        /// Register holding the bytes to write (`NFTA_PAYLOAD_SREG`).
        sreg: Reg,
        /// `NFT_PAYLOAD_CSUM_*` (`NFTA_PAYLOAD_CSUM_TYPE`): 0 none, 1 the header's internet
        /// checksum, 2 SCTP's CRC32c.
        csum_type: u32,
        /// Offset of the checksum field in the same header (`NFTA_PAYLOAD_CSUM_OFFSET`).
        csum_offset: u32,
        /// `NFT_PAYLOAD_L4CSUM_PSEUDOHDR` (1): fix the layer-4 checksum too, the field being in
        /// its pseudo-header (`NFTA_PAYLOAD_CSUM_FLAGS`, not sent when 0).
        csum_flags: u32,
    },
    /// `cmp <op> reg <data>`
    Cmp {
        /// Register compared (`NFTA_CMP_SREG`).
        sreg: Reg,
        /// Operator (`NFTA_CMP_OP`).
        op: CmpOp,
        /// Value compared with, as the register holds it; its length is the compare's
        /// (`NFTA_CMP_DATA`).
        data: Vec<u8>,
    },
    /// `bitwise reg = (reg & mask) ^ xor` over `len` bytes.
    Bitwise {
        /// Input register (`NFTA_BITWISE_SREG`).
        sreg: Reg,
        /// Output register (`NFTA_BITWISE_DREG`).
        dreg: Reg,
        /// Bytes operated on (`NFTA_BITWISE_LEN`).
        len: u32,
        /// AND mask, `len` bytes (`NFTA_BITWISE_MASK`).
        mask: Vec<u8>,
        /// XOR value, `len` bytes (`NFTA_BITWISE_XOR`).
        xor: Vec<u8>,
    },
    /// `range <op> reg from .. to` (op is `Eq` or `Neq`).
    Range {
        /// Register compared (`NFTA_RANGE_SREG`).
        sreg: Reg,
        /// `Eq`: inside `from..=to`; `Neq`: outside (`NFTA_RANGE_OP`).
        op: CmpOp,
        /// Lower bound, inclusive, in `memcmp` order (`NFTA_RANGE_FROM_DATA`).
        from: Vec<u8>,
        /// Upper bound, inclusive (`NFTA_RANGE_TO_DATA`).
        to: Vec<u8>,
    },
    /// `lookup reg set <name> [dreg <reg>] [invert]`. A map lookup sets `dreg` (a data register,
    /// or `Reg::VERDICT` for a verdict map). `set_id` refers to a set created in the same batch;
    /// the codec fills it in, so desired state leaves it `None`.
    Lookup {
        /// Name of the set or map (`NFTA_LOOKUP_SET`).
        set: String,
        /// `NFTA_LOOKUP_SET_ID` of a set created in the same batch.
        set_id: Option<u32>,
        /// First register of the key (`NFTA_LOOKUP_SREG`); a concatenation continues in the
        /// registers after it.
        sreg: Reg,
        /// Register the map's value lands in (`NFTA_LOOKUP_DREG`); `None` for a set.
        dreg: Option<Reg>,
        /// `NFT_LOOKUP_F_INV`: match when the key is *not* in the set.
        invert: bool,
    },
    /// `immediate reg <data>`: loads a value into a data register.
    ImmediateData {
        /// Data register loaded (`NFTA_IMMEDIATE_DREG`).
        dreg: Reg,
        /// The value, as the register will hold it (`NFTA_IMMEDIATE_DATA`).
        data: Vec<u8>,
    },
    /// `immediate reg 0 <verdict>`: the verdict register.
    Verdict(Verdict),
    /// `counter packets P bytes B` (values are what the kernel reports; zero in desired state).
    Counter {
        /// Packets counted (`NFTA_COUNTER_PACKETS`).
        packets: u64,
        /// Bytes counted (`NFTA_COUNTER_BYTES`).
        bytes: u64,
    },
    /// `ct load <key> => reg [, dir original|reply]`
    Ct {
        /// What to load (`NFTA_CT_KEY`).
        key: CtKey,
        /// Register it lands in (`NFTA_CT_DREG`).
        dreg: Reg,
        /// For a per-direction key: 0 original, 1 reply (`NFTA_CT_DIRECTION`, one byte).
        direction: Option<u8>,
    },
    /// `log [prefix P] [level L] [group G] [snaplen S]`
    Log {
        /// Text put before the log line (`NFTA_LOG_PREFIX`).
        prefix: Option<String>,
        /// Syslog level (`NFTA_LOG_LEVEL`); when absent the kernel uses warning (4) and
        /// reports it.
        level: Option<u32>,
        /// NFLOG group (`NFTA_LOG_GROUP`): the packet goes to nfnetlink_log listeners instead
        /// of the kernel log.
        group: Option<u16>,
        /// Bytes of the packet copied to the NFLOG group (`NFTA_LOG_SNAPLEN`).
        snaplen: Option<u32>,
        /// `NF_LOG_*` flags: TCP sequence, TCP and IP options, uid, MAC header
        /// (`NFTA_LOG_FLAGS`).
        flags: Option<u32>,
    },
    /// `limit rate [over] <rate>/<unit seconds> burst <burst> <packets|bytes>`
    Limit {
        /// Packets (or bytes) allowed per `unit` (`NFTA_LIMIT_RATE`).
        rate: u64,
        /// The rate's period in seconds (`NFTA_LIMIT_UNIT`: 1, 60, 3600, ...).
        unit: u64,
        /// Packets (or bytes) allowed at once above the rate (`NFTA_LIMIT_BURST`, not sent
        /// when 0).
        burst: u32,
        /// What the rate counts (`NFTA_LIMIT_TYPE`).
        kind: LimitType,
        /// `NFT_LIMIT_F_INV`: matches when *over* the rate.
        over: bool,
    },
    /// `reject type <t> code <c>`
    Reject {
        /// Reject type (`NFTA_REJECT_TYPE`).
        kind: RejectType,
        /// ICMP or ICMPv6 code, or an `NFT_REJECT_ICMPX_*` code for `IcmpxUnreach`; 0 for a
        /// TCP reset (`NFTA_REJECT_ICMP_CODE`).
        code: u8,
    },
    /// `nat snat|dnat <family> addr reg [.. reg] [proto reg [.. reg]] flags F`
    Nat {
        /// Source or destination NAT (`NFTA_NAT_TYPE`).
        kind: NatType,
        /// Family of the addresses in the registers, `Ip` or `Ip6` (`NFTA_NAT_FAMILY`).
        family: Family,
        /// Register holding the (lowest) address (`NFTA_NAT_REG_ADDR_MIN`).
        addr_min: Option<Reg>,
        /// Register holding the highest address (`NFTA_NAT_REG_ADDR_MAX`); absent, the kernel
        /// takes `addr_min` and reports it.
        addr_max: Option<Reg>,
        /// Register holding the (lowest) port, network order (`NFTA_NAT_REG_PROTO_MIN`).
        proto_min: Option<Reg>,
        /// Register holding the highest port (`NFTA_NAT_REG_PROTO_MAX`); absent, the kernel
        /// takes `proto_min`.
        proto_max: Option<Reg>,
        /// [`nat_flags`] (`NFTA_NAT_FLAGS`, not sent when 0).
        flags: u32,
    },
    /// `masq [proto reg [.. reg]] flags F`
    Masq {
        /// [`nat_flags`], e.g. `PROTO_RANDOM_FULLY` (`NFTA_MASQ_FLAGS`, not sent when 0).
        flags: u32,
        /// Register holding the (lowest) source port (`NFTA_MASQ_REG_PROTO_MIN`).
        proto_min: Option<Reg>,
        /// Register holding the highest source port (`NFTA_MASQ_REG_PROTO_MAX`).
        proto_max: Option<Reg>,
    },
    /// `notrack`
    Notrack,
    /// `fib <flags> <result> => reg` (e.g. `fib saddr . mark . iif oif`)
    Fib {
        /// [`fib_flags`]: what the route lookup uses (`NFTA_FIB_FLAGS`).
        flags: u32,
        /// What the lookup yields (`NFTA_FIB_RESULT`).
        result: FibResult,
        /// Register the result lands in (`NFTA_FIB_DREG`).
        dreg: Reg,
    },
    /// `connlimit count N [flags F]` (`ct count [over] N`; flag 1 = `NFT_CONNLIMIT_F_INV`).
    Connlimit {
        /// Connections of the packet's connection key allowed (`NFTA_CONNLIMIT_COUNT`).
        count: u32,
        /// `NFT_CONNLIMIT_F_INV` (1): match when over `count`; without it, when at most
        /// `count` (`NFTA_CONNLIMIT_FLAGS`).
        flags: u32,
    },
    /// An expression we do not model: its name and raw `NFTA_EXPR_DATA` bytes, kept so that a
    /// dump of something unexpected still round-trips.
    Other {
        /// Expression name (`NFTA_EXPR_NAME`).
        name: String,
        /// The `NFTA_EXPR_DATA` payload: the expression's attributes, undecoded.
        data: Vec<u8>,
    },
}

/// A data type of a set key or map value (nft's datatype ids; `len` is the value's size in
/// bytes before register padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    /// `verdict` (1) — map values only.
    Verdict,
    /// `ipv4_addr` (7), 4 bytes, network order.
    Ipv4Addr,
    /// `ipv6_addr` (8), 16 bytes, network order.
    Ipv6Addr,
    /// `ether_addr` (9), 6 bytes.
    EtherAddr,
    /// `inet_proto` (12), 1 byte.
    InetProto,
    /// `inet_service` (13), 2 bytes, network order.
    InetService,
    /// `mark` (19), 4 bytes, host order.
    Mark,
    /// `ifname` (41), 16 bytes, NUL-padded.
    IfName,
    /// Any other datatype id with its length.
    Other {
        /// nft's datatype id (`TYPE_*`).
        id: u32,
        /// Size of a value in bytes.
        len: u32,
    },
}

impl DataType {
    /// nft's datatype id (`TYPE_*` in nftables' datatype.h).
    pub const fn id(self) -> u32 {
        match self {
            DataType::Verdict => 1,
            DataType::Ipv4Addr => 7,
            DataType::Ipv6Addr => 8,
            DataType::EtherAddr => 9,
            DataType::InetProto => 12,
            DataType::InetService => 13,
            DataType::Mark => 19,
            DataType::IfName => 41,
            DataType::Other { id, .. } => id,
        }
    }

    /// Size of a value of this type in bytes, before register padding.
    #[allow(clippy::len_without_is_empty)]
    pub const fn len(self) -> u32 {
        match self {
            DataType::Verdict => 0,
            DataType::Ipv4Addr => 4,
            DataType::Ipv6Addr => 16,
            DataType::EtherAddr => 6,
            DataType::InetProto => 1,
            DataType::InetService => 2,
            DataType::Mark => 4,
            DataType::IfName => 16,
            DataType::Other { len, .. } => len,
        }
    }
}

/// `NFT_SET_*` flags.
pub mod set_flags {
    /// `NFT_SET_ANONYMOUS`: bound to the rule that looks it up, deleted with it.
    pub const ANONYMOUS: u32 = 0x1;
    /// `NFT_SET_CONSTANT`: the elements cannot change after the set's creating batch.
    pub const CONSTANT: u32 = 0x2;
    /// `NFT_SET_INTERVAL`: elements are ranges (a start element and an `INTERVAL_END` one).
    pub const INTERVAL: u32 = 0x4;
    /// `NFT_SET_MAP`: elements carry a value (`NFTA_SET_DATA_TYPE`).
    pub const MAP: u32 = 0x8;
    /// `NFT_SET_TIMEOUT`: elements may expire (not modelled here: no element timeouts).
    pub const TIMEOUT: u32 = 0x10;
    /// `NFT_SET_EVAL`: rules update the set from the packet path (dynamic set).
    pub const EVAL: u32 = 0x20;
    /// `NFT_SET_OBJECT`: a map whose values are stateful objects.
    pub const OBJECT: u32 = 0x40;
    /// `NFT_SET_CONCAT`: the key is a concatenation (with `INTERVAL`: the pipapo backend).
    pub const CONCAT: u32 = 0x80;
    /// The set carries expressions its elements get (`NFTA_SET_EXPR`). nft does not send it
    /// for a `counter` template and the kernel does not require it: the codec leaves it clear.
    pub const EXPR: u32 = 0x100;
}

/// A named set or map with its elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    /// Set name (`NFTA_SET_NAME`).
    pub name: String,
    /// Key type: one component, or several for a concatenation (`ipv4_addr . inet_proto .
    /// inet_service`). Each component is padded to 4 bytes in the key.
    pub key: Vec<DataType>,
    /// `NFT_SET_*` flags (MAP is implied by `data` and set by the codec).
    pub flags: u32,
    /// Map value type: `Some(DataType::Verdict)` for a verdict map.
    pub data: Option<DataType>,
    /// `NFTA_SET_DESC_SIZE` hint (halves insert time and keeps dumps consistent).
    pub size: Option<u32>,
    /// Elements in the kernel's form. For interval sets, each range is a start element plus an
    /// `INTERVAL_END` element at the first address after it.
    pub elements: Vec<Element>,
    /// Every element gets its own packet and byte counter: the set's `counter` expression
    /// template (`NFTA_SET_EXPR`). Part of the definition; the kernel cannot add it in place.
    pub counter: bool,
    /// The elements' counters as a dump read them (empty in a desired set). State, not
    /// configuration: never part of a comparison.
    pub counters: ElemCounters,
}

impl Set {
    /// The set without its elements.
    pub fn clone_def(&self) -> Set {
        Set {
            name: self.name.clone(),
            key: self.key.clone(),
            flags: self.flags,
            data: self.data,
            size: self.size,
            elements: Vec::new(),
            counter: self.counter,
            counters: ElemCounters::default(),
        }
    }
}

/// One element's counter as a dump read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElemCounter {
    /// The element's key bytes (as [`Element::key`]).
    pub key: ElemKey,
    /// The element's `NFT_SET_ELEM_*` flags (an interval set's start and end share a key).
    pub flags: u32,
    /// Packets that matched the element.
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
}

/// Counters of a set's elements, in dump order. Always equal to any other: counters are what
/// the traffic did, not what was asked for, so two sets differing only in them are the same.
#[derive(Clone, Debug, Default)]
pub struct ElemCounters(pub Vec<ElemCounter>);

impl ElemCounters {
    /// The counter of the element with key `key` (not an interval end).
    pub fn get(&self, key: &[u8]) -> Option<&ElemCounter> {
        self.0
            .iter()
            .find(|c| c.key.as_slice() == key && c.flags & elem_flags::INTERVAL_END == 0)
    }
}

impl PartialEq for ElemCounters {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ElemCounters {}

/// `NFT_SET_ELEM_*` flags.
pub mod elem_flags {
    /// `NFT_SET_ELEM_INTERVAL_END`: the element ends a range (it is the first key after it).
    pub const INTERVAL_END: u32 = 0x1;
}

/// An element's key bytes, inline up to 16 (an IPv6 address, an interface name, IPv4 address .
/// protocol . port): a set member costs no allocation of its own (150,000 of them in a
/// full render at mid). Longer keys (IPv6 concatenations) spill to the heap.
pub type ElemKey = smallvec::SmallVec<[u8; 16]>;

/// One set or map element.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    /// Key bytes as the kernel stores them (components padded to 4 bytes).
    pub key: ElemKey,
    /// `NFTA_SET_ELEM_KEY_END` for concatenated ranges (pipapo).
    pub key_end: Option<Box<[u8]>>,
    /// `NFT_SET_ELEM_*` flags.
    pub flags: u32,
    /// Map value.
    pub data: Option<Box<ElemData>>,
}
// Most elements are set members with neither a range end nor a value: both are boxed so they
// cost 8 + 16 bytes instead of 24 + 32 (611,000 elements at large scale); the
// key is inline.
const _: () = assert!(std::mem::size_of::<Element>() <= 56);

/// A map element's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemData {
    /// A verdict map's value (`NFTA_DATA_VERDICT`).
    Verdict(Verdict),
    /// A data map's value, as the register will hold it (`NFTA_DATA_VALUE`).
    Value(Vec<u8>),
}
