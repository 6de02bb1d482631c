//! The nf_tables object model: tables, chains, rules, sets and elements as the kernel holds them.
//!
//! This is the contract between the renderer (`rules`, which builds these values) and the codec
//! (`nft::codec`, which encodes them into netlink and decodes dumps back into them). It knows
//! nftables and nothing about Calico.
//!
//! Expressions are modelled at the kernel's level — one [`Expr`] per netlink expression, with
//! explicit registers — so that `decode(encode(x)) == x` holds exactly and what we compare is what
//! the kernel stores. Idioms such as "`iifname cali*`" or "`ip saddr 10.0.0.0/8`" are built from
//! these by `nft::build`.
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
    pub const fn nfproto(self) -> u8 {
        match self {
            Family::Inet => 1,
            Family::Ip => 2,
            Family::Arp => 3,
            Family::Ip6 => 10,
        }
    }

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
    pub const DORMANT: u32 = 0x1;
    /// The table belongs to the socket that created it; other processes get EPERM.
    pub const OWNER: u32 = 0x2;
    /// With OWNER (kernel ≥ 6.9): the table outlives its owner and can be re-adopted.
    pub const PERSIST: u32 = 0x4;
}

/// A table and everything in it: the unit the renderer produces and the dump returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub family: Family,
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
    pub family: Family,
    pub name: String,
    pub chains: BTreeMap<String, Option<Chain>>,
    pub sets: BTreeMap<String, Option<Set>>,
    /// Element changes of sets the patch does not replace whole: (to delete, to add). Kept
    /// sorted in the set (the renderer's order), so folding equals rendering.
    pub elements: BTreeMap<String, ElementDelta>,
}

/// Elements to delete from and add to one set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElementDelta {
    pub del: Vec<Element>,
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
    pub fn new(family: Family, name: impl Into<String>) -> TablePatch {
        TablePatch {
            family,
            name: name.into(),
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            elements: BTreeMap::new(),
        }
    }

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
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
    /// Raw hook number, for families whose numbering differs (ARP) or unknown hooks.
    Other(u32),
}

impl Hook {
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
    Filter,
    Nat,
    Route,
}

impl ChainType {
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
    pub chain_type: ChainType,
    pub hook: Hook,
    pub priority: i32,
    /// Chain policy: `Verdict::Accept` (the default) or `Verdict::Drop`.
    pub policy: Verdict,
}

/// A chain with its rules, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

impl Chain {
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
    pub exprs: Exprs,
    /// Rule userdata comment (libnftnl udata TLV type 0; at most 255 bytes + NUL). Our identity comments live here (`cali:<hash>; ...`).
    pub comment: Option<String>,
    /// Kernel handle: `None` in desired state, set when read back from the kernel.
    pub handle: Option<u64>,
}

/// Registers. `NFT_REG_VERDICT` = 0; 16-byte `NFT_REG_1..4` = 1..4; 4-byte `NFT_REG32_00..15`
/// = 8..23. We use the 32-bit register numbering so concatenations can address each component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg(pub u32);

impl Reg {
    pub const VERDICT: Reg = Reg(0);
    pub const R1: Reg = Reg(1);
    pub const R2: Reg = Reg(2);
    pub const R3: Reg = Reg(3);
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
    Eq,
    Neq,
    Lt,
    Lte,
    Gt,
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
    Other(u32),
}

/// Conntrack state bits as `ct state` loads them (host order): `NF_CT_STATE_BIT(ctinfo)`.
pub mod ct_state {
    pub const INVALID: u32 = 1;
    pub const ESTABLISHED: u32 = 2;
    pub const RELATED: u32 = 4;
    pub const NEW: u32 = 8;
    pub const UNTRACKED: u32 = 64;
}

/// Conntrack status bits (`IPS_*`) as `ct status` loads them (host order).
pub mod ct_status {
    pub const EXPECTED: u32 = 1;
    pub const SEEN_REPLY: u32 = 2;
    pub const ASSURED: u32 = 4;
    pub const CONFIRMED: u32 = 8;
    pub const SRC_NAT: u32 = 16;
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
    Snat,
    Dnat,
}

/// `NF_NAT_RANGE_*` flags used by nat/masquerade.
pub mod nat_flags {
    pub const MAP_IPS: u32 = 0x1;
    pub const PROTO_SPECIFIED: u32 = 0x2;
    pub const PROTO_RANDOM: u32 = 0x4;
    pub const PERSISTENT: u32 = 0x8;
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
    pub const SADDR: u32 = 0x1;
    pub const DADDR: u32 = 0x2;
    pub const MARK: u32 = 0x4;
    pub const IIF: u32 = 0x8;
    pub const OIF: u32 = 0x10;
    pub const PRESENT: u32 = 0x20;
}

/// `NFT_LIMIT_*` types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LimitType {
    Packets,
    Bytes,
}

/// One kernel expression. Each variant maps 1:1 to an nf_tables expression type; see the
/// uapi (`linux/netfilter/nf_tables.h`) for the attribute of each field.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `meta load <key> => reg`
    Meta { key: MetaKey, dreg: Reg },
    /// `meta set <key> with reg` (e.g. `meta mark set`)
    MetaSet { key: MetaKey, sreg: Reg },
    /// `payload load <len>b @ <base> header + <offset> => reg`
    Payload {
        base: PayloadBase,
        offset: u32,
        len: u32,
        dreg: Reg,
    },
    /// `payload write reg => <len>b @ <base> header + <offset>`, with checksum fix-up
    /// (`csum_type` `NFT_PAYLOAD_CSUM_*`, `csum_offset`, `csum_flags`).
    PayloadSet {
        base: PayloadBase,
        offset: u32,
        len: u32,
        sreg: Reg,
        csum_type: u32,
        csum_offset: u32,
        csum_flags: u32,
    },
    /// `cmp <op> reg <data>`
    Cmp { sreg: Reg, op: CmpOp, data: Vec<u8> },
    /// `bitwise reg = (reg & mask) ^ xor` over `len` bytes.
    Bitwise {
        sreg: Reg,
        dreg: Reg,
        len: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// `range <op> reg from .. to` (op is `Eq` or `Neq`).
    Range {
        sreg: Reg,
        op: CmpOp,
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// `lookup reg set <name> [dreg <reg>] [invert]`. A map lookup sets `dreg` (a data register,
    /// or `Reg::VERDICT` for a verdict map). `set_id` refers to a set created in the same batch;
    /// the codec fills it in, so desired state leaves it `None`.
    Lookup {
        set: String,
        set_id: Option<u32>,
        sreg: Reg,
        dreg: Option<Reg>,
        invert: bool,
    },
    /// `immediate reg <data>`: loads a value into a data register.
    ImmediateData { dreg: Reg, data: Vec<u8> },
    /// `immediate reg 0 <verdict>`: the verdict register.
    Verdict(Verdict),
    /// `counter packets P bytes B` (values are what the kernel reports; zero in desired state).
    Counter { packets: u64, bytes: u64 },
    /// `ct load <key> => reg [, dir original|reply]`
    Ct {
        key: CtKey,
        dreg: Reg,
        direction: Option<u8>,
    },
    /// `log [prefix P] [level L] [group G] [snaplen S]`
    Log {
        prefix: Option<String>,
        level: Option<u32>,
        group: Option<u16>,
        snaplen: Option<u32>,
        flags: Option<u32>,
    },
    /// `limit rate [over] <rate>/<unit seconds> burst <burst> <packets|bytes>`
    Limit {
        rate: u64,
        unit: u64,
        burst: u32,
        kind: LimitType,
        /// `NFT_LIMIT_F_INV`: matches when *over* the rate.
        over: bool,
    },
    /// `reject type <t> code <c>`
    Reject { kind: RejectType, code: u8 },
    /// `nat snat|dnat <family> addr reg [.. reg] [proto reg [.. reg]] flags F`
    Nat {
        kind: NatType,
        family: Family,
        addr_min: Option<Reg>,
        addr_max: Option<Reg>,
        proto_min: Option<Reg>,
        proto_max: Option<Reg>,
        flags: u32,
    },
    /// `masq [proto reg [.. reg]] flags F`
    Masq {
        flags: u32,
        proto_min: Option<Reg>,
        proto_max: Option<Reg>,
    },
    /// `notrack`
    Notrack,
    /// `fib <flags> <result> => reg` (e.g. `fib saddr . mark . iif oif`)
    Fib {
        flags: u32,
        result: FibResult,
        dreg: Reg,
    },
    /// `connlimit count N [flags F]` (`ct count [over] N`; flag 1 = `NFT_CONNLIMIT_F_INV`).
    Connlimit { count: u32, flags: u32 },
    /// An expression we do not model: its name and raw `NFTA_EXPR_DATA` bytes, kept so that a
    /// dump of something unexpected still round-trips.
    Other { name: String, data: Vec<u8> },
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
    Other { id: u32, len: u32 },
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
    pub const ANONYMOUS: u32 = 0x1;
    pub const CONSTANT: u32 = 0x2;
    pub const INTERVAL: u32 = 0x4;
    pub const MAP: u32 = 0x8;
    pub const TIMEOUT: u32 = 0x10;
    pub const EVAL: u32 = 0x20;
    pub const OBJECT: u32 = 0x40;
    pub const CONCAT: u32 = 0x80;
    /// The set carries expressions its elements get (`NFTA_SET_EXPR`). nft does not send it
    /// for a `counter` template and the kernel does not require it: the codec leaves it clear.
    pub const EXPR: u32 = 0x100;
}

/// A named set or map with its elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
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
    pub packets: u64,
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
    Verdict(Verdict),
    Value(Vec<u8>),
}
