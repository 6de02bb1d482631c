//! nftables idioms as kernel expressions *and* as `nft` syntax, built in lockstep.
//!
//! Layer: generic nftables (no Calico). The renderer (`rules`) describes a rule as a chain of
//! idioms — `iifname "cali*"`, `ip saddr 10.0.0.0/8`, `meta mark set mark or 0x10000` — and
//! [`RuleBuilder`] appends, for each idiom, exactly the expressions `nft` 1.0.6 generates for it
//! (checked with `nft --debug=netlink`) together with the text. The text is
//! what the snapshot tests show and what the privileged tests feed to `nft -f`; the expressions
//! are what our codec commits. Keeping both in one call is what lets the two be compared.
//!
//! Encoding notes:
//! - register data from payloads (addresses, ports) is network order; meta/ct/fib values
//!   (mark, l4proto, ct state, address type) are host order;
//! - `iifname "x*"` is a prefix compare without NUL, an exact name is 16 bytes NUL-padded;
//! - byte-aligned CIDR prefixes load only the prefix bytes (what nft emits), other prefixes load
//!   the whole address and mask it with `bitwise`;
//! - concatenation components are 4-byte aligned; a component that starts on a 16-byte register
//!   boundary is addressed by its 16-byte register number, as nft does;
//! - interval sets carry a start element and an `INTERVAL_END` element at the first value after
//!   each range (no end element when the range reaches the top of the key space).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::model::{
    ct_state, ct_status, elem_flags, fib_flags, nat_flags, set_flags, BaseChain, Chain, CmpOp,
    CtKey, DataType, ElemData, ElemKey, Element, Expr, Family, FibResult, Hook, LimitType, MetaKey,
    NatType, PayloadBase, Reg, RejectType, Rule, Set, Table, Verdict,
};

/// Packet direction of an address or port match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    /// Source (`saddr`, `sport`, `iifname`).
    Src,
    /// Destination (`daddr`, `dport`, `oifname`).
    Dst,
}

/// Interface direction for `iifname` / `oifname`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Iface {
    /// `iifname`: the input interface.
    In,
    /// `oifname`: the output interface.
    Out,
}

/// One rule under construction: kernel expressions plus the same rule in `nft` syntax.
#[derive(Clone, Debug)]
pub struct RuleBuilder {
    family: Family,
    exprs: Vec<Expr>,
    /// The statements so far in nft syntax, separated by spaces: written in place, as the
    /// render writes some 30,000 rules at mid scale.
    text: String,
}

/// A finished rule: its expressions and its `nft` text (without the comment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltRule {
    /// The kernel expressions, in order.
    pub exprs: Vec<Expr>,
    /// The same rule in nft syntax, statements separated by spaces, without a comment.
    pub text: String,
}

fn cmp(op: CmpOp, data: Vec<u8>) -> Expr {
    Expr::Cmp {
        sreg: Reg::R1,
        op,
        data,
    }
}

fn op_text(neg: bool) -> &'static str {
    if neg {
        "!= "
    } else {
        ""
    }
}

fn eq_or_neq(neg: bool) -> CmpOp {
    if neg {
        CmpOp::Neq
    } else {
        CmpOp::Eq
    }
}

/// Name nft uses for an IP protocol number where it has one; the number otherwise.
pub fn l4proto_name(proto: u8) -> String {
    match proto {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "ipv6-icmp".into(),
        132 => "sctp".into(),
        136 => "udplite".into(),
        other => other.to_string(),
    }
}

/// Quotes a string for nft text (names of interfaces, log prefixes, comments).
pub fn quote(s: &str) -> String {
    Quoted(s).to_string()
}

/// A string quoted for nft text, written without an intermediate `String`.
struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars() {
            if c == '\\' || c == '"' {
                f.write_char('\\')?;
            }
            f.write_char(c)?;
        }
        f.write_char('"')
    }
}

/// An interface name as the 16-byte NUL-padded key that `meta iifname` loads (IFNAMSIZ).
/// Longer names are truncated to 15 bytes plus NUL, as the kernel would store them.
pub fn ifname_key(name: &str) -> ElemKey {
    let mut key = ElemKey::from_buf([0u8; 16]);
    let bytes = name.as_bytes();
    let n = bytes.len().min(15);
    key[..n].copy_from_slice(&bytes[..n]);
    key
}

fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    addr_key(addr).to_vec()
}

/// An address as an element key (network order, 4 or 16 bytes).
fn addr_key(addr: IpAddr) -> ElemKey {
    match addr {
        IpAddr::V4(a) => ElemKey::from_slice(&a.octets()),
        IpAddr::V6(a) => ElemKey::from_buf(a.octets()),
    }
}

fn family_keyword(family: Family) -> &'static str {
    match family {
        Family::Ip6 => "ip6",
        _ => "ip",
    }
}

fn addr_offset(family: Family, dir: Dir) -> (u32, u32) {
    match (family, dir) {
        (Family::Ip6, Dir::Src) => (8, 16),
        (Family::Ip6, Dir::Dst) => (24, 16),
        (_, Dir::Src) => (12, 4),
        (_, Dir::Dst) => (16, 4),
    }
}

fn dir_word(dir: Dir) -> &'static str {
    match dir {
        Dir::Src => "saddr",
        Dir::Dst => "daddr",
    }
}

fn port_word(dir: Dir) -> &'static str {
    match dir {
        Dir::Src => "sport",
        Dir::Dst => "dport",
    }
}

/// The nft names of the ct state bits, in nft's print order, comma-separated.
struct CtStateText(u32);

impl fmt::Display for CtStateText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (bit, name) in CT_STATE_NAMES {
            if self.0 & bit != 0 {
                if !first {
                    f.write_char(',')?;
                }
                first = false;
                f.write_str(name)?;
            }
        }
        Ok(())
    }
}

const CT_STATE_NAMES: [(u32, &str); 5] = [
    (ct_state::INVALID, "invalid"),
    (ct_state::ESTABLISHED, "established"),
    (ct_state::RELATED, "related"),
    (ct_state::NEW, "new"),
    (ct_state::UNTRACKED, "untracked"),
];

/// `RTN_LOCAL`, the address type `fib ... type local` compares with.
const RTN_LOCAL: u32 = 2;

impl RuleBuilder {
    /// A new, empty rule for a table of `family` (`ip` or `ip6` decides the address keywords).
    pub fn new(family: Family) -> RuleBuilder {
        RuleBuilder {
            family,
            exprs: Vec::new(),
            text: String::with_capacity(64),
        }
    }

    fn push(mut self, exprs: impl IntoIterator<Item = Expr>, text: impl fmt::Display) -> Self {
        self.exprs.extend(exprs);
        self.write_text(text);
        self
    }

    /// Appends one statement's text.
    fn write_text(&mut self, text: impl fmt::Display) {
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        let _ = write!(self.text, "{text}");
    }

    /// True when no statement has been added yet.
    pub fn is_empty(&self) -> bool {
        self.exprs.is_empty()
    }

    /// `iifname "name"` / `oifname "name"`; a trailing `*` makes it a prefix match.
    pub fn ifname(self, which: Iface, name: &str, neg: bool) -> Self {
        let (key, word) = match which {
            Iface::In => (MetaKey::IifName, "iifname"),
            Iface::Out => (MetaKey::OifName, "oifname"),
        };
        let data = match name.strip_suffix('*') {
            Some(prefix) => prefix.as_bytes().to_vec(),
            None => ifname_key(name).to_vec(),
        };
        self.push(
            [Expr::Meta { key, dreg: Reg::R1 }, cmp(eq_or_neq(neg), data)],
            format_args!("{word} {}{}", op_text(neg), Quoted(name)),
        )
    }

    /// `iifname "name"` (exact, or prefix with a trailing `*`).
    pub fn iifname(self, name: &str) -> Self {
        self.ifname(Iface::In, name, false)
    }

    /// `oifname "name"` (exact, or prefix with a trailing `*`).
    pub fn oifname(self, name: &str) -> Self {
        self.ifname(Iface::Out, name, false)
    }

    /// `meta l4proto P` / `meta l4proto != P`.
    pub fn l4proto_cmp(self, proto: u8, neg: bool) -> Self {
        self.push(
            [
                Expr::Meta {
                    key: MetaKey::L4Proto,
                    dreg: Reg::R1,
                },
                cmp(eq_or_neq(neg), vec![proto]),
            ],
            format!("meta l4proto {}{}", op_text(neg), l4proto_name(proto)),
        )
    }

    /// `meta l4proto P`.
    pub fn l4proto(self, proto: u8) -> Self {
        self.l4proto_cmp(proto, false)
    }

    /// `ip saddr|daddr [!=] CIDR` (or `ip6`). A full-length prefix is a plain compare; a
    /// byte-aligned prefix loads only the prefix bytes; any other prefix is masked.
    pub fn addr(self, dir: Dir, net: IpNet, neg: bool) -> Self {
        let (offset, full) = addr_offset(self.family, dir);
        let net = net.trunc();
        let prefix = u32::from(net.prefix_len());
        let bytes = addr_bytes(net.network());
        let (fam, word, op) = (family_keyword(self.family), dir_word(dir), op_text(neg));
        let mut this = self;
        if prefix == full * 8 {
            this.write_text(format_args!("{fam} {word} {op}{}", net.addr()));
        } else {
            this.write_text(format_args!("{fam} {word} {op}{net}"));
        }
        let load = |len: u32| Expr::Payload {
            base: PayloadBase::Network,
            offset,
            len,
            dreg: Reg::R1,
        };
        let exprs = if prefix == full * 8 {
            vec![load(full), cmp(eq_or_neq(neg), bytes)]
        } else if prefix % 8 == 0 && prefix > 0 {
            let n = prefix / 8;
            vec![load(n), cmp(eq_or_neq(neg), bytes[..n as usize].to_vec())]
        } else {
            vec![
                load(full),
                Expr::Bitwise {
                    sreg: Reg::R1,
                    dreg: Reg::R1,
                    len: full,
                    mask: addr_bytes(net.netmask()),
                    xor: vec![0; full as usize],
                },
                cmp(eq_or_neq(neg), bytes),
            ]
        };
        this.exprs.extend(exprs);
        this
    }

    /// `ip saddr CIDR`.
    pub fn ip_saddr(self, net: IpNet) -> Self {
        self.addr(Dir::Src, net, false)
    }

    /// `ip daddr CIDR`.
    pub fn ip_daddr(self, net: IpNet) -> Self {
        self.addr(Dir::Dst, net, false)
    }

    /// `ip saddr|daddr [!=] @set`.
    pub fn addr_in_set(self, dir: Dir, set: &str, neg: bool) -> Self {
        let (offset, len) = addr_offset(self.family, dir);
        let family = self.family;
        self.push(
            [
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    len,
                    dreg: Reg::R1,
                },
                lookup(set, neg),
            ],
            format_args!(
                "{} {} {}@{set}",
                family_keyword(family),
                dir_word(dir),
                op_text(neg)
            ),
        )
    }

    /// `ip saddr @set`.
    pub fn saddr_in_set(self, set: &str) -> Self {
        self.addr_in_set(Dir::Src, set, false)
    }

    /// `ip daddr @set`.
    pub fn daddr_in_set(self, set: &str) -> Self {
        self.addr_in_set(Dir::Dst, set, false)
    }

    fn port_load(dir: Dir) -> Expr {
        Self::port_load_into(dir, Reg::R1)
    }

    /// The transport header's source or destination port into `dreg`.
    fn port_load_into(dir: Dir, dreg: Reg) -> Expr {
        Expr::Payload {
            base: PayloadBase::Transport,
            offset: match dir {
                Dir::Src => 0,
                Dir::Dst => 2,
            },
            len: 2,
            dreg,
        }
    }

    /// `th sport|dport [!=] first[-last]`. Needs a transport protocol match before it.
    /// A positive range is two compares (`gte`, `lte`); a negated one is a `range` expression.
    pub fn th_port(self, dir: Dir, first: u16, last: u16, neg: bool) -> Self {
        let word = port_word(dir);
        if first == last {
            return self.push(
                [
                    Self::port_load(dir),
                    cmp(eq_or_neq(neg), first.to_be_bytes().to_vec()),
                ],
                format_args!("th {word} {}{first}", op_text(neg)),
            );
        }
        let exprs = if neg {
            vec![
                Self::port_load(dir),
                Expr::Range {
                    sreg: Reg::R1,
                    op: CmpOp::Neq,
                    from: first.to_be_bytes().to_vec(),
                    to: last.to_be_bytes().to_vec(),
                },
            ]
        } else {
            vec![
                Self::port_load(dir),
                cmp(CmpOp::Gte, first.to_be_bytes().to_vec()),
                cmp(CmpOp::Lte, last.to_be_bytes().to_vec()),
            ]
        };
        self.push(
            exprs,
            format_args!("th {word} {}{first}-{last}", op_text(neg)),
        )
    }

    /// `th sport|dport [!=] @set` (an `inet_service` set).
    pub fn th_port_in_set(self, dir: Dir, set: &str, neg: bool) -> Self {
        self.push(
            [Self::port_load(dir), lookup(set, neg)],
            format_args!("th {} {}@{set}", port_word(dir), op_text(neg)),
        )
    }

    /// `th dport @set`.
    pub fn th_dport_in_set(self, set: &str) -> Self {
        self.th_port_in_set(Dir::Dst, set, false)
    }

    /// `ip daddr . meta l4proto . th dport [!=] @set` (or saddr/sport): a lookup in an
    /// `addr . inet_proto . inet_service` set, one 4-byte-aligned register per component.
    pub fn addr_proto_port_in_set(self, dir: Dir, set: &str, neg: bool) -> Self {
        let (offset, len) = addr_offset(self.family, dir);
        let words = len / 4;
        let text = format!(
            "{} {} . meta l4proto . th {} {}@{set}",
            family_keyword(self.family),
            dir_word(dir),
            port_word(dir),
            op_text(neg)
        );
        let exprs = [
            Expr::Payload {
                base: PayloadBase::Network,
                offset,
                len,
                dreg: Reg::R1,
            },
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: concat_reg(words),
            },
            Self::port_load_into(dir, concat_reg(words + 1)),
            lookup(set, neg),
        ];
        self.push(exprs, text)
    }

    /// `icmp type T [icmp code C]` (`icmpv6` in an ip6 table); needs the l4proto match first.
    ///
    /// Type and code are one 2-byte compare, as nft merges them. The negation of a type+code
    /// pair is "not (type T and code C)" — iptables' `! --icmp-type T/C` and the meaning of
    /// Calico's `notICMP {type, code}` — written as the raw 16-bit header field
    /// `@th,0,16 != 0xTTCC`, because the keyword form `icmp type != T icmp code != C` reads as
    /// an AND of two inequalities (§9.2, §23.9).
    ///
    /// `v6` picks the header (`icmpv6` or `icmp`): it follows the protocol matched before, not
    /// the table's family.
    pub fn icmp(self, v6: bool, icmp_type: u8, code: Option<u8>, neg: bool) -> Self {
        let kw = if v6 { "icmpv6" } else { "icmp" };
        match code {
            None => self.push(
                [
                    Expr::Payload {
                        base: PayloadBase::Transport,
                        offset: 0,
                        len: 1,
                        dreg: Reg::R1,
                    },
                    cmp(eq_or_neq(neg), vec![icmp_type]),
                ],
                format_args!("{kw} type {}{icmp_type}", op_text(neg)),
            ),
            Some(code) => {
                let text = if neg {
                    format!(
                        "@th,0,16 != 0x{:04x}",
                        (u16::from(icmp_type) << 8) | u16::from(code)
                    )
                } else {
                    format!("{kw} type {icmp_type} {kw} code {code}")
                };
                self.push(
                    [
                        Expr::Payload {
                            base: PayloadBase::Transport,
                            offset: 0,
                            len: 2,
                            dreg: Reg::R1,
                        },
                        cmp(eq_or_neq(neg), vec![icmp_type, code]),
                    ],
                    text,
                )
            }
        }
    }

    fn mark_test(self, bits: u32, set: bool) -> Self {
        let expect = if set { bits } else { 0 };
        let [load, mask] = mark_and_xor(bits, 0);
        self.push(
            [load, mask, cmp(CmpOp::Eq, expect.to_ne_bytes().to_vec())],
            format_args!("meta mark & 0x{bits:08x} == 0x{expect:08x}"),
        )
    }

    /// `meta mark & BITS == BITS`: all of `bits` are set.
    pub fn mark_has(self, bits: u32) -> Self {
        self.mark_test(bits, true)
    }

    /// `meta mark & BITS == 0`: none of `bits` is set.
    pub fn mark_lacks(self, bits: u32) -> Self {
        self.mark_test(bits, false)
    }

    /// `meta mark set mark and ~CLEAR xor SET` — the general masked write.
    pub fn mark_write(self, clear: u32, set: u32) -> Self {
        let mask = !(clear | set);
        let mut this = self;
        if clear == 0 {
            this.write_text(format_args!("meta mark set mark or 0x{set:08x}"));
        } else if set == 0 {
            this.write_text(format_args!("meta mark set mark and 0x{mask:08x}"));
        } else {
            this.write_text(format_args!(
                "meta mark set mark and 0x{mask:08x} xor 0x{set:08x}"
            ));
        }
        let [load, masked] = mark_and_xor(mask, set);
        this.exprs.extend([
            load,
            masked,
            Expr::MetaSet {
                key: MetaKey::Mark,
                sreg: Reg::R1,
            },
        ]);
        this
    }

    /// `meta mark set mark or BITS`.
    pub fn mark_set_or(self, bits: u32) -> Self {
        self.mark_write(0, bits)
    }

    /// `meta mark set mark and ~BITS`.
    pub fn mark_clear(self, bits: u32) -> Self {
        self.mark_write(bits, 0)
    }

    /// `ct state S1,S2`: any of the `ct_state` bits.
    pub fn ct_state(self, bits: u32) -> Self {
        self.ct_bits(
            CtKey::State,
            bits,
            true,
            format_args!("ct state {}", CtStateText(bits)),
        )
    }

    /// `ct status dnat` (has) or `ct status & dnat == 0` (lacks).
    pub fn ct_status_dnat(self, has: bool) -> Self {
        let text = if has {
            "ct status dnat"
        } else {
            "ct status & dnat == 0"
        };
        self.ct_bits(CtKey::Status, ct_status::DST_NAT, has, text)
    }

    fn ct_bits(self, key: CtKey, bits: u32, any: bool, text: impl fmt::Display) -> Self {
        self.push(
            [
                Expr::Ct {
                    key,
                    dreg: Reg::R1,
                    direction: None,
                },
                Expr::Bitwise {
                    sreg: Reg::R1,
                    dreg: Reg::R1,
                    len: 4,
                    mask: bits.to_ne_bytes().to_vec(),
                    xor: 0u32.to_ne_bytes().to_vec(),
                },
                cmp(
                    if any { CmpOp::Neq } else { CmpOp::Eq },
                    0u32.to_ne_bytes().to_vec(),
                ),
            ],
            text,
        )
    }

    /// `fib saddr . mark . iif oif missing`: strict reverse-path check failed.
    pub fn fib_rpf_missing(self) -> Self {
        self.push(
            [
                Expr::Fib {
                    flags: fib_flags::SADDR | fib_flags::MARK | fib_flags::IIF | fib_flags::PRESENT,
                    result: FibResult::Oif,
                    dreg: Reg::R1,
                },
                cmp(CmpOp::Eq, 0u32.to_ne_bytes().to_vec()),
            ],
            "fib saddr . mark . iif oif missing",
        )
    }

    /// `fib saddr|daddr type [!=] local`.
    pub fn fib_addr_type_local(self, dir: Dir, neg: bool) -> Self {
        let flag = match dir {
            Dir::Src => fib_flags::SADDR,
            Dir::Dst => fib_flags::DADDR,
        };
        self.push(
            [
                Expr::Fib {
                    flags: flag,
                    result: FibResult::AddrType,
                    dreg: Reg::R1,
                },
                cmp(eq_or_neq(neg), RTN_LOCAL.to_ne_bytes().to_vec()),
            ],
            format_args!("fib {} type {}local", dir_word(dir), op_text(neg)),
        )
    }

    /// `fib saddr . oif type [!=] local`: is the source local *to the output interface*.
    pub fn fib_saddr_oif_type_local(self, neg: bool) -> Self {
        self.push(
            [
                Expr::Fib {
                    flags: fib_flags::SADDR | fib_flags::OIF,
                    result: FibResult::AddrType,
                    dreg: Reg::R1,
                },
                cmp(eq_or_neq(neg), RTN_LOCAL.to_ne_bytes().to_vec()),
            ],
            format_args!("fib saddr . oif type {}local", op_text(neg)),
        )
    }

    /// `counter`.
    pub fn counter(self) -> Self {
        self.push(
            [Expr::Counter {
                packets: 0,
                bytes: 0,
            }],
            "counter",
        )
    }

    /// A verdict statement (`accept`, `drop`, `return`, `jump C`, `goto C`, `continue`).
    pub fn verdict(self, v: Verdict) -> Self {
        let mut this = self;
        this.write_text(VerdictText(&v));
        this.exprs.push(Expr::Verdict(v));
        this
    }

    /// `accept`.
    pub fn accept(self) -> Self {
        self.verdict(Verdict::Accept)
    }

    /// `drop` (named with a trailing `_` so it does not read as `Drop::drop`).
    pub fn drop_(self) -> Self {
        self.verdict(Verdict::Drop)
    }

    /// `return`.
    pub fn ret(self) -> Self {
        self.verdict(Verdict::Return)
    }

    /// `jump CHAIN`.
    pub fn jump(self, chain: &str) -> Self {
        self.verdict(Verdict::Jump(chain.to_string()))
    }

    /// `goto CHAIN`.
    pub fn goto(self, chain: &str) -> Self {
        self.verdict(Verdict::Goto(chain.to_string()))
    }

    /// `iifname|oifname @set`: the interface name is in a set of names.
    pub fn ifname_in_set(self, which: Iface, set: &str) -> Self {
        let (key, word) = match which {
            Iface::In => (MetaKey::IifName, "iifname"),
            Iface::Out => (MetaKey::OifName, "oifname"),
        };
        self.push(
            [Expr::Meta { key, dreg: Reg::R1 }, lookup(set, false)],
            format_args!("{word} @{set}"),
        )
    }

    /// `iifname|oifname vmap @map`: verdict-map dispatch on the interface name.
    pub fn ifname_vmap(self, which: Iface, map: &str) -> Self {
        let (key, word) = match which {
            Iface::In => (MetaKey::IifName, "iifname"),
            Iface::Out => (MetaKey::OifName, "oifname"),
        };
        self.push(
            [
                Expr::Meta { key, dreg: Reg::R1 },
                Expr::Lookup {
                    set: map.to_string(),
                    set_id: None,
                    sreg: Reg::R1,
                    dreg: Some(Reg::VERDICT),
                    invert: false,
                },
            ],
            format_args!("{word} vmap @{map}"),
        )
    }

    /// `log prefix "P" level info`.
    pub fn log(self, prefix: &str) -> Self {
        self.push(
            [Expr::Log {
                prefix: Some(prefix.to_string()),
                level: Some(6),
                group: None,
                snaplen: None,
                flags: None,
            }],
            format_args!("log prefix {} level info", Quoted(prefix)),
        )
    }

    /// `log prefix P group G snaplen S`: the packet's first `snaplen` bytes to NFLOG group `group`.
    pub fn nflog(self, group: u16, prefix: &str, snaplen: u32) -> Self {
        self.push(
            [Expr::Log {
                prefix: Some(prefix.to_string()),
                level: None,
                group: Some(group),
                snaplen: Some(snaplen),
                flags: None,
            }],
            format_args!(
                "log prefix {} group {group} snaplen {snaplen}",
                Quoted(prefix)
            ),
        )
    }

    /// `limit rate [over] R/UNIT burst B packets`; `unit` is in seconds (1, 60, 3600, 86400).
    pub fn limit(self, rate: u64, unit: u64, burst: u32, over: bool) -> Self {
        let unit_name = match unit {
            1 => "second",
            60 => "minute",
            3600 => "hour",
            86400 => "day",
            _ => "week",
        };
        self.push(
            [Expr::Limit {
                rate,
                unit,
                burst,
                kind: LimitType::Packets,
                over,
            }],
            format_args!(
                "limit rate {}{rate}/{unit_name} burst {burst} packets",
                if over { "over " } else { "" }
            ),
        )
    }

    /// `reject` (ICMP port unreachable; ICMPv6 port unreachable in ip6).
    pub fn reject(self) -> Self {
        let code = if self.family == Family::Ip6 { 4 } else { 3 };
        self.push(
            [Expr::Reject {
                kind: RejectType::IcmpUnreach,
                code,
            }],
            "reject",
        )
    }

    /// `reject with tcp reset`; needs a TCP match before it.
    pub fn reject_tcp_reset(self) -> Self {
        self.push(
            [Expr::Reject {
                kind: RejectType::TcpRst,
                code: 0,
            }],
            "reject with tcp reset",
        )
    }

    /// `masquerade [to :LO-HI] [fully-random]`; a port range needs a transport match before it.
    pub fn masquerade(self, ports: Option<(u16, u16)>, fully_random: bool) -> Self {
        let mut flags = if fully_random {
            nat_flags::PROTO_RANDOM_FULLY
        } else {
            0
        };
        let mut exprs = Vec::new();
        let mut text = "masquerade".to_string();
        let (mut pmin, mut pmax) = (None, None);
        if let Some((lo, hi)) = ports {
            exprs.push(Expr::ImmediateData {
                dreg: Reg::R1,
                data: lo.to_be_bytes().to_vec(),
            });
            exprs.push(Expr::ImmediateData {
                dreg: Reg::R2,
                data: hi.to_be_bytes().to_vec(),
            });
            flags |= nat_flags::PROTO_SPECIFIED;
            pmin = Some(Reg::R1);
            pmax = Some(Reg::R2);
            let _ = write!(text, " to :{lo}-{hi}");
        }
        if fully_random {
            text.push_str(" fully-random");
        }
        exprs.push(Expr::Masq {
            flags,
            proto_min: pmin,
            proto_max: pmax,
        });
        self.push(exprs, text)
    }

    fn nat(self, kind: NatType, addr: IpAddr, ports: Option<(u16, u16)>) -> Self {
        let family = self.family;
        let mut exprs = vec![Expr::ImmediateData {
            dreg: Reg::R1,
            data: addr_bytes(addr),
        }];
        let word = match kind {
            NatType::Snat => "snat",
            NatType::Dnat => "dnat",
        };
        let mut flags = 0;
        let (mut pmin, mut pmax) = (None, None);
        let text = match ports {
            None => format!("{word} to {addr}"),
            Some((lo, hi)) => {
                exprs.push(Expr::ImmediateData {
                    dreg: Reg::R2,
                    data: lo.to_be_bytes().to_vec(),
                });
                pmin = Some(Reg::R2);
                if hi != lo {
                    exprs.push(Expr::ImmediateData {
                        dreg: Reg::R3,
                        data: hi.to_be_bytes().to_vec(),
                    });
                    pmax = Some(Reg::R3);
                }
                flags = nat_flags::PROTO_SPECIFIED;
                let a = match addr {
                    IpAddr::V6(a) => format!("[{a}]"),
                    IpAddr::V4(a) => a.to_string(),
                };
                if hi != lo {
                    format!("{word} to {a}:{lo}-{hi}")
                } else {
                    format!("{word} to {a}:{lo}")
                }
            }
        };
        exprs.push(Expr::Nat {
            kind,
            family,
            addr_min: Some(Reg::R1),
            addr_max: None,
            proto_min: pmin,
            proto_max: pmax,
            flags,
        });
        self.push(exprs, text)
    }

    /// `snat to ADDR[:LO-HI]`.
    pub fn snat(self, addr: IpAddr, ports: Option<(u16, u16)>) -> Self {
        self.nat(NatType::Snat, addr, ports)
    }

    /// `dnat to ADDR`.
    pub fn dnat(self, addr: IpAddr) -> Self {
        self.nat(NatType::Dnat, addr, None)
    }

    /// `ct count over N`: more than `n` connections tracked for this rule's flows
    /// (`NFT_CONNLIMIT_F_INV`).
    pub fn ct_count_over(self, n: u32) -> Self {
        self.push(
            [Expr::Connlimit { count: n, flags: 1 }],
            format_args!("ct count over {n}"),
        )
    }

    /// `notrack`.
    pub fn notrack(self) -> Self {
        self.push([Expr::Notrack], "notrack")
    }

    /// Finishes the rule. An empty rule becomes `continue` (a rule needs one statement).
    pub fn build(self) -> BuiltRule {
        if self.exprs.is_empty() {
            return RuleBuilder::new(self.family)
                .verdict(Verdict::Continue)
                .build();
        }
        let mut text = self.text;
        text.shrink_to_fit();
        BuiltRule {
            exprs: self.exprs,
            text,
        }
    }
}

/// `meta mark` into R1, then `R1 & mask ^ xor`.
fn mark_and_xor(mask: u32, xor: u32) -> [Expr; 2] {
    [
        Expr::Meta {
            key: MetaKey::Mark,
            dreg: Reg::R1,
        },
        Expr::Bitwise {
            sreg: Reg::R1,
            dreg: Reg::R1,
            len: 4,
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
        },
    ]
}

fn lookup(set: &str, invert: bool) -> Expr {
    Expr::Lookup {
        set: set.to_string(),
        set_id: None,
        sreg: Reg::R1,
        dreg: None,
        invert,
    }
}

/// The register nft uses for the concatenation component that starts at 32-bit word `word`:
/// the 16-byte register when the word is 16-byte aligned, the 32-bit register otherwise.
fn concat_reg(word: u32) -> Reg {
    if word % 4 == 0 {
        Reg(1 + word / 4)
    } else {
        Reg::r32(word)
    }
}

/// A verdict in nft syntax.
pub fn verdict_text(v: &Verdict) -> String {
    VerdictText(v).to_string()
}

/// A verdict in nft syntax, written without an intermediate `String`.
struct VerdictText<'a>(&'a Verdict);

impl fmt::Display for VerdictText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Continue => f.write_str("continue"),
            Verdict::Break => f.write_str("break"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
            Verdict::Other(code) => write!(f, "verdict {code}"),
        }
    }
}

// -----------------------------------------------------------------------------------------------
// Elements
// -----------------------------------------------------------------------------------------------

/// The element of one address in a plain set of addresses.
pub fn addr_element(addr: IpAddr) -> Element {
    key_element(addr_key(addr))
}

fn key_element(key: ElemKey) -> Element {
    Element {
        key,
        key_end: None,
        flags: 0,
        data: None,
    }
}

/// Inclusive ranges of `u128` values (addresses or ports) merged so that none overlap or touch:
/// the form an interval set accepts (overlaps make the kernel refuse the whole batch, §23.1).
pub fn merge_ranges(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort();
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The inclusive address range a CIDR covers, as integers.
pub fn cidr_range(net: &IpNet) -> (u128, u128) {
    match net {
        IpNet::V4(n) => (
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
        ),
        IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast())),
    }
}

/// Interval-set elements for merged inclusive ranges of a key `len` bytes wide (big-endian):
/// a start element per range and an `INTERVAL_END` element at the value after it, unless the
/// range reaches the top of the key space, plus a leading `INTERVAL_END` at zero when the first
/// range starts above zero (what nft sends, checked with `--debug=netlink`).
pub fn interval_elements(ranges: &[(u128, u128)], len: usize) -> Vec<Element> {
    let max = if len >= 16 {
        u128::MAX
    } else {
        (1u128 << (len * 8)) - 1
    };
    let be = |v: u128| ElemKey::from_slice(&v.to_be_bytes()[16 - len..]);
    let mut out = Vec::with_capacity(2 * ranges.len() + 1);
    // nft opens with an end element at zero when the first range does not start there: it
    // marks the gap below the first range as "not in the set". Sent the same way here so
    // that a set we commit and one `nft -f` loads are element-for-element equal.
    if ranges.first().is_some_and(|&(lo, _)| lo != 0) {
        out.push(Element {
            key: be(0),
            key_end: None,
            flags: elem_flags::INTERVAL_END,
            data: None,
        });
    }
    for &(lo, hi) in ranges {
        out.push(key_element(be(lo)));
        if hi < max {
            out.push(Element {
                key: be(hi + 1),
                key_end: None,
                flags: elem_flags::INTERVAL_END,
                data: None,
            });
        }
    }
    out
}

/// Interval elements for CIDRs of one family (`v6` selects 16-byte keys), overlaps merged.
pub fn cidr_interval_elements(nets: &[IpNet], v6: bool) -> Vec<Element> {
    let ranges = merge_ranges(
        nets.iter()
            .filter(|n| matches!(n, IpNet::V6(_)) == v6)
            .map(cidr_range)
            .collect(),
    );
    interval_elements(&ranges, if v6 { 16 } else { 4 })
}

/// Interval elements for port ranges (`inet_service`), overlaps merged.
pub fn port_interval_elements(ranges: &[(u16, u16)]) -> Vec<Element> {
    let ranges = merge_ranges(
        ranges
            .iter()
            .map(|&(a, b)| (u128::from(a.min(b)), u128::from(a.max(b))))
            .collect(),
    );
    interval_elements(&ranges, 2)
}

/// A concatenated key: each component padded to a 4-byte boundary.
pub fn concat_key(parts: &[&[u8]]) -> ElemKey {
    let mut key = ElemKey::new();
    for p in parts {
        key.extend_from_slice(p);
        while key.len() % 4 != 0 {
            key.push(0);
        }
    }
    key
}

/// An `addr . inet_proto . inet_service` element.
pub fn addr_proto_port_element(addr: IpAddr, proto: u8, port: u16) -> Element {
    key_element(concat_key(&[
        &addr_bytes(addr),
        &[proto],
        &port.to_be_bytes(),
    ]))
}

/// An element of a set of interface names.
pub fn ifname_element(ifname: &str) -> Element {
    key_element(ifname_key(ifname))
}

/// An `ifname : verdict` element of a dispatch map.
pub fn ifname_verdict_element(ifname: &str, verdict: Verdict) -> Element {
    Element {
        key: ifname_key(ifname),
        key_end: None,
        flags: 0,
        data: Some(Box::new(ElemData::Verdict(verdict))),
    }
}

// -----------------------------------------------------------------------------------------------
// Text: tables, chains and sets in `nft -f` syntax
// -----------------------------------------------------------------------------------------------

/// A chain together with the nft text of each of its rules (`texts[i]` is `chain.rules[i]`
/// without its comment, which the rule carries): the renderer's output before it is reduced to
/// the object model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextChain {
    /// The chain as the codec commits it.
    pub chain: Chain,
    /// The nft text of each rule, without its comment.
    pub texts: Vec<String>,
}

impl TextChain {
    /// An empty regular chain.
    pub fn new(name: impl Into<String>) -> TextChain {
        TextChain {
            chain: Chain::regular(name),
            texts: Vec::new(),
        }
    }

    /// Appends a rule with an optional userdata comment.
    pub fn push(&mut self, rule: BuiltRule, comment: Option<String>) {
        // The comment joins the text only when the text is printed ([`chain_text`]): a full
        // load renders every rule, and printing is for tests and tools.
        self.texts.push(rule.text);
        self.chain.rules.push(Rule {
            exprs: rule.exprs.into(),
            comment,
            handle: None,
        });
    }
}

/// A table with the text of its rules: convertible to the object model and to `nft -f` text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextTable {
    /// The table as the codec commits it.
    pub table: Table,
    /// Rule texts by chain name.
    pub texts: BTreeMap<String, Vec<String>>,
}

impl TextTable {
    /// An empty table.
    pub fn new(family: Family, name: &str) -> TextTable {
        TextTable {
            table: Table::new(family, name),
            texts: BTreeMap::new(),
        }
    }

    /// Adds (or replaces) a chain.
    pub fn add_chain(&mut self, c: TextChain) {
        self.texts.insert(c.chain.name.clone(), c.texts);
        self.table.chains.insert(c.chain.name.clone(), c.chain);
    }

    /// Adds (or replaces) a set.
    pub fn add_set(&mut self, s: Set) {
        self.table.sets.insert(s.name.clone(), s);
    }

    /// The table in `nft -f` syntax (sets first, then chains, ordered by name).
    pub fn to_nft(&self) -> String {
        let t = &self.table;
        let mut out = format!("table {} {} {{\n", t.family.name(), t.name);
        for set in t.sets.values() {
            out.push_str(&set_text(set, t.family));
        }
        for chain in t.chains.values() {
            let texts = self.texts.get(&chain.name).cloned().unwrap_or_default();
            out.push_str(&chain_text(chain, &texts));
        }
        out.push_str("}\n");
        out
    }
}

fn hook_name(h: Hook) -> String {
    match h {
        Hook::Prerouting => "prerouting".into(),
        Hook::Input => "input".into(),
        Hook::Forward => "forward".into(),
        Hook::Output => "output".into(),
        Hook::Postrouting => "postrouting".into(),
        Hook::Other(n) => n.to_string(),
    }
}

fn base_text(b: &BaseChain) -> String {
    format!(
        "\t\ttype {} hook {} priority {}; policy {};\n",
        b.chain_type.name(),
        hook_name(b.hook),
        b.priority,
        verdict_text(&b.policy)
    )
}

/// A chain in nft syntax, given the text of each rule without its comment (the comment is the
/// rule's own).
pub fn chain_text(chain: &Chain, rule_texts: &[String]) -> String {
    let mut out = format!("\tchain {} {{\n", chain.name);
    if let Some(b) = &chain.base {
        out.push_str(&base_text(b));
    }
    for (i, t) in rule_texts.iter().enumerate() {
        match chain.rules.get(i).and_then(|r| r.comment.as_deref()) {
            Some(c) => {
                let _ = writeln!(out, "\t\t{t} comment {}", quote(c));
            }
            None => {
                let _ = writeln!(out, "\t\t{t}");
            }
        }
    }
    out.push_str("\t}\n");
    out
}

fn type_name(t: DataType) -> String {
    match t {
        DataType::Verdict => "verdict".into(),
        DataType::Ipv4Addr => "ipv4_addr".into(),
        DataType::Ipv6Addr => "ipv6_addr".into(),
        DataType::EtherAddr => "ether_addr".into(),
        DataType::InetProto => "inet_proto".into(),
        DataType::InetService => "inet_service".into(),
        DataType::Mark => "mark".into(),
        DataType::IfName => "ifname".into(),
        DataType::Other { id, .. } => format!("type{id}"),
    }
}

fn value_text(t: DataType, b: &[u8]) -> String {
    match t {
        DataType::Ipv4Addr if b.len() >= 4 => Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string(),
        DataType::Ipv6Addr if b.len() >= 16 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[..16]);
            Ipv6Addr::from(a).to_string()
        }
        DataType::InetService if b.len() >= 2 => u16::from_be_bytes([b[0], b[1]]).to_string(),
        DataType::InetProto if !b.is_empty() => l4proto_name(b[0]),
        DataType::Mark if b.len() >= 4 => {
            format!("0x{:08x}", u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        }
        DataType::IfName => {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            quote(&String::from_utf8_lossy(&b[..end]))
        }
        _ => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

fn key_text(key: &[DataType], bytes: &[u8]) -> String {
    if key.len() == 1 {
        return value_text(key[0], bytes);
    }
    let mut parts = Vec::new();
    let mut off = 0usize;
    for t in key {
        let len = t.len() as usize;
        let end = (off + len).min(bytes.len());
        parts.push(value_text(*t, &bytes[off.min(end)..end]));
        off += len.div_ceil(4) * 4;
    }
    parts.join(" . ")
}

fn be_to_u128(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |acc, &x| (acc << 8) | u128::from(x))
}

fn u128_to_be(v: u128, len: usize) -> Vec<u8> {
    v.to_be_bytes()[16 - len..].to_vec()
}

/// One interval `lo..=hi` in nft syntax: a CIDR when it is one, `lo-hi` otherwise.
fn range_text(t: DataType, lo: u128, hi: u128) -> String {
    let len = t.len() as usize;
    if lo == hi {
        return value_text(t, &u128_to_be(lo, len));
    }
    if matches!(t, DataType::Ipv4Addr | DataType::Ipv6Addr) {
        let size = hi - lo + 1;
        let bits = (len * 8) as u32;
        if size.is_power_of_two() && lo % size == 0 {
            let prefix = bits - size.trailing_zeros();
            return format!("{}/{prefix}", value_text(t, &u128_to_be(lo, len)));
        }
        if size == 0 {
            // The whole 128-bit space overflowed `size`.
            return format!("{}/0", value_text(t, &u128_to_be(0, len)));
        }
    }
    format!(
        "{}-{}",
        value_text(t, &u128_to_be(lo, len)),
        value_text(t, &u128_to_be(hi, len))
    )
}

fn elements_text(set: &Set) -> Vec<String> {
    if set.flags & set_flags::INTERVAL != 0 && set.key.len() == 1 {
        let t = set.key[0];
        let len = t.len() as usize;
        let max = if len >= 16 {
            u128::MAX
        } else {
            (1u128 << (len * 8)) - 1
        };
        let mut out = Vec::new();
        let mut start: Option<u128> = None;
        for e in &set.elements {
            let v = be_to_u128(&e.key);
            if e.flags & elem_flags::INTERVAL_END != 0 {
                if let Some(lo) = start.take() {
                    out.push(range_text(t, lo, v.saturating_sub(1)));
                }
            } else {
                if let Some(lo) = start.take() {
                    out.push(range_text(t, lo, lo));
                }
                start = Some(v);
            }
        }
        if let Some(lo) = start {
            out.push(range_text(t, lo, max));
        }
        return out;
    }
    set.elements
        .iter()
        .map(|e| {
            let k = key_text(&set.key, &e.key);
            match e.data.as_deref() {
                Some(ElemData::Verdict(v)) => format!("{k} : {}", verdict_text(v)),
                Some(ElemData::Value(b)) => match set.data {
                    Some(t) => format!("{k} : {}", value_text(t, b)),
                    None => k,
                },
                None => k,
            }
        })
        .collect()
}

/// A set or map in nft syntax.
pub fn set_text(set: &Set, _family: Family) -> String {
    let kind = if set.data.is_some() { "map" } else { "set" };
    let key = set
        .key
        .iter()
        .map(|t| type_name(*t))
        .collect::<Vec<_>>()
        .join(" . ");
    let mut out = format!("\t{kind} {} {{\n", set.name);
    match set.data {
        Some(d) => {
            let _ = writeln!(out, "\t\ttype {key} : {}", type_name(d));
        }
        None => {
            let _ = writeln!(out, "\t\ttype {key}");
        }
    }
    if set.flags & set_flags::INTERVAL != 0 {
        out.push_str("\t\tflags interval\n");
    }
    if let Some(size) = set.size {
        let _ = writeln!(out, "\t\tsize {size}");
    }
    if set.counter {
        out.push_str("\t\tcounter\n");
    }
    let elems = elements_text(set);
    if !elems.is_empty() {
        let _ = writeln!(out, "\t\telements = {{ {} }}", elems.join(",\n\t\t\t     "));
    }
    out.push_str("\t}\n");
    out
}

/// A named set with no elements yet.
pub fn new_set(name: &str, key: Vec<DataType>, flags: u32, data: Option<DataType>) -> Set {
    Set {
        counter: false,
        counters: Default::default(),
        name: name.to_string(),
        key,
        flags,
        data,
        size: None,
        elements: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn prefix_wildcard_is_prefix_compare_and_exact_is_padded() {
        let r = RuleBuilder::new(Family::Ip).iifname("cali*").build();
        assert_eq!(r.text, "iifname \"cali*\"");
        assert_eq!(r.exprs[1], cmp(CmpOp::Eq, b"cali".to_vec()));
        let r = RuleBuilder::new(Family::Ip).oifname("cali123").build();
        let mut want = b"cali123".to_vec();
        want.resize(16, 0);
        assert_eq!(r.exprs[1], cmp(CmpOp::Eq, want));
    }

    #[test]
    fn cidr_shapes_follow_nft() {
        // Byte-aligned: only the prefix bytes (`payload load 1b @ network header + 12`).
        let r = RuleBuilder::new(Family::Ip)
            .ip_saddr(net("10.0.0.0/8"))
            .build();
        assert_eq!(
            r.exprs[0],
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 12,
                len: 1,
                dreg: Reg::R1
            }
        );
        assert_eq!(r.exprs[1], cmp(CmpOp::Eq, vec![10]));
        // Not aligned: load, mask, compare.
        let r = RuleBuilder::new(Family::Ip)
            .ip_daddr(net("10.0.0.0/20"))
            .build();
        assert!(
            matches!(&r.exprs[1], Expr::Bitwise { mask, .. } if mask == &vec![255, 255, 240, 0])
        );
        // Host: plain compare, printed without /32.
        let r = RuleBuilder::new(Family::Ip)
            .ip_daddr(net("10.1.2.3/32"))
            .build();
        assert_eq!(r.exprs.len(), 2);
        assert_eq!(r.text, "ip daddr 10.1.2.3");
        // IPv6 /64: 8 bytes at offset 8.
        let r = RuleBuilder::new(Family::Ip6)
            .ip_saddr(net("fd00::/64"))
            .build();
        assert!(matches!(
            r.exprs[0],
            Expr::Payload {
                offset: 8,
                len: 8,
                ..
            }
        ));
        assert_eq!(r.text, "ip6 saddr fd00::/64");
    }

    #[test]
    fn concat_registers_match_nft() {
        let r = RuleBuilder::new(Family::Ip)
            .addr_proto_port_in_set(Dir::Dst, "s", false)
            .build();
        assert!(matches!(r.exprs[1], Expr::Meta { dreg: Reg(9), .. }));
        assert!(matches!(r.exprs[2], Expr::Payload { dreg: Reg(10), .. }));
        let r = RuleBuilder::new(Family::Ip6)
            .addr_proto_port_in_set(Dir::Dst, "s", false)
            .build();
        assert!(matches!(r.exprs[1], Expr::Meta { dreg: Reg(2), .. }));
        assert!(matches!(r.exprs[2], Expr::Payload { dreg: Reg(13), .. }));
    }

    #[test]
    fn overlapping_and_adjacent_cidrs_merge() {
        let e = cidr_interval_elements(
            &[
                net("10.0.0.0/24"),
                net("10.0.0.5/32"),
                net("10.0.1.0/24"),
                net("192.168.0.0/16"),
                net("fd00::/64"),
            ],
            false,
        );
        let keys: Vec<(Vec<u8>, u32)> = e.iter().map(|e| (e.key.to_vec(), e.flags)).collect();
        assert_eq!(
            keys,
            vec![
                (vec![0, 0, 0, 0], elem_flags::INTERVAL_END),
                (vec![10, 0, 0, 0], 0),
                (vec![10, 0, 2, 0], elem_flags::INTERVAL_END),
                (vec![192, 168, 0, 0], 0),
                (vec![192, 169, 0, 0], elem_flags::INTERVAL_END),
            ]
        );
        let mut set = new_set("s", vec![DataType::Ipv4Addr], set_flags::INTERVAL, None);
        set.elements = e;
        assert_eq!(elements_text(&set), vec!["10.0.0.0/23", "192.168.0.0/16"]);
    }

    #[test]
    fn top_of_range_has_no_end_element() {
        let e = port_interval_elements(&[(8000, 65535), (80, 80)]);
        assert_eq!(e.len(), 4);
        assert_eq!(e[3].key[..], 8000u16.to_be_bytes());
        assert_eq!(e[3].flags, 0);
        // A range from zero needs no leading end element.
        assert_eq!(port_interval_elements(&[(0, 10)]).len(), 2);
        let mut set = new_set("p", vec![DataType::InetService], set_flags::INTERVAL, None);
        set.elements = e;
        assert_eq!(elements_text(&set), vec!["80", "8000-65535"]);
    }

    #[test]
    fn negated_icmp_type_code_is_one_pair_compare() {
        let r = RuleBuilder::new(Family::Ip)
            .icmp(false, 8, Some(0), true)
            .build();
        assert_eq!(r.text, "@th,0,16 != 0x0800");
        assert_eq!(r.exprs[1], cmp(CmpOp::Neq, vec![8, 0]));
    }
}
