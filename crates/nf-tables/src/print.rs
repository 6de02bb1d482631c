//! Text forms of the model for logs, `plan`, `dump` and golden tests. Expressions print exactly
//! as libnftnl prints them under `nft --debug=netlink` (`[ meta load iifname => reg 1 ]`), so our
//! output can be compared line by line with nft's.

use std::fmt::Write as _;

use crate::model::*;

/// Register data as libnftnl prints it: one `0x%08x` per 4-byte word, read in host order.
pub fn data(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "0x{:08x}", u32::from_ne_bytes(w));
    }
    out
}

fn meta_key(k: MetaKey) -> String {
    const NAMES: [&str; 20] = [
        "len",
        "protocol",
        "priority",
        "mark",
        "iif",
        "oif",
        "iifname",
        "oifname",
        "iiftype",
        "oiftype",
        "skuid",
        "skgid",
        "nftrace",
        "rtclassid",
        "secmark",
        "nfproto",
        "l4proto",
        "bri_iifname",
        "bri_oifname",
        "pkttype",
    ];
    let n = crate::codec::meta_key_num_pub(k);
    NAMES
        .get(n as usize)
        .map_or_else(|| format!("unknown({n})"), |s| (*s).to_owned())
}

fn ct_key(k: CtKey) -> String {
    const NAMES: [&str; 24] = [
        "state",
        "direction",
        "status",
        "mark",
        "secmark",
        "expiration",
        "helper",
        "l3protocol",
        "src",
        "dst",
        "protocol",
        "proto_src",
        "proto_dst",
        "label",
        "packets",
        "bytes",
        "avgpkt",
        "zone",
        "event",
        "src_ip",
        "dst_ip",
        "src_ip6",
        "dst_ip6",
        "ct_id",
    ];
    let n = match k {
        CtKey::State => 0,
        CtKey::Direction => 1,
        CtKey::Status => 2,
        CtKey::Mark => 3,
        CtKey::Other(n) => n,
    };
    NAMES
        .get(n as usize)
        .map_or_else(|| format!("unknown({n})"), |s| (*s).to_owned())
}

fn base(b: PayloadBase) -> &'static str {
    match b {
        PayloadBase::LinkLayer => "link",
        PayloadBase::Network => "network",
        PayloadBase::Transport => "transport",
        PayloadBase::Inner => "inner",
    }
}

fn op(o: CmpOp) -> &'static str {
    match o {
        CmpOp::Eq => "eq",
        CmpOp::Neq => "neq",
        CmpOp::Lt => "lt",
        CmpOp::Lte => "lte",
        CmpOp::Gt => "gt",
        CmpOp::Gte => "gte",
    }
}

/// A verdict as nft's debug output writes it (`accept`, `jump -> chain`).
pub fn verdict(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Continue => "continue".into(),
        Verdict::Break => "break".into(),
        Verdict::Return => "return".into(),
        Verdict::Jump(c) => format!("jump -> {c}"),
        Verdict::Goto(c) => format!("goto -> {c}"),
        Verdict::Other(n) => format!("verdict {n}"),
    }
}

fn unit(u: u64) -> String {
    match u {
        1 => "second".into(),
        60 => "minute".into(),
        3600 => "hour".into(),
        86400 => "day".into(),
        604800 => "week".into(),
        n => format!("{n}s"),
    }
}

/// One expression, `[ ... ]`, as `nft --debug=netlink` prints it.
pub fn expr(e: &Expr) -> String {
    let body = match e {
        Expr::Meta { key, dreg } => format!("meta load {} => reg {} ", meta_key(*key), dreg.0),
        Expr::MetaSet { key, sreg } => format!("meta set {} with reg {} ", meta_key(*key), sreg.0),
        Expr::Payload {
            base: b,
            offset,
            len,
            dreg,
        } => format!(
            "payload load {len}b @ {} header + {offset} => reg {} ",
            base(*b),
            dreg.0
        ),
        Expr::PayloadSet {
            base: b,
            offset,
            len,
            sreg,
            csum_type,
            csum_offset,
            csum_flags,
        } => format!(
            "payload write reg {} => {len}b @ {} header + {offset} csum_type {csum_type} \
             csum_off {csum_offset} csum_flags 0x{csum_flags:x} ",
            sreg.0,
            base(*b)
        ),
        Expr::Cmp {
            sreg,
            op: o,
            data: d,
        } => format!("cmp {} reg {} {} ", op(*o), sreg.0, data(d)),
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
            ..
        } => format!(
            "bitwise reg {} = ( reg {} & {} ) ^ {} ",
            dreg.0,
            sreg.0,
            data(mask),
            data(xor)
        ),
        Expr::Range {
            sreg,
            op: o,
            from,
            to,
        } => format!(
            "range {} reg {} {} {} ",
            op(*o),
            sreg.0,
            data(from),
            data(to)
        ),
        Expr::Lookup {
            set,
            sreg,
            dreg,
            invert,
            ..
        } => {
            let mut s = format!("lookup reg {} set {set} ", sreg.0);
            if let Some(d) = dreg {
                let _ = write!(s, "dreg {} ", d.0);
            }
            if *invert {
                s.push_str("0x1 ");
            }
            s
        }
        Expr::ImmediateData { dreg, data: d } => format!("immediate reg {} {} ", dreg.0, data(d)),
        Expr::Verdict(v) => format!("immediate reg 0 {} ", verdict(v)),
        Expr::Counter { packets, bytes } => format!("counter pkts {packets} bytes {bytes} "),
        Expr::Ct {
            key,
            dreg,
            direction,
        } => {
            let mut s = format!("ct load {} => reg {} ", ct_key(*key), dreg.0);
            if let Some(d) = direction {
                let _ = write!(s, ", dir {} ", if *d == 0 { "original" } else { "reply" });
            }
            s
        }
        Expr::Log {
            prefix,
            level,
            group,
            snaplen,
            flags,
        } => {
            let mut s = "log ".to_owned();
            if let Some(p) = prefix {
                let _ = write!(s, "prefix {p} ");
            }
            if let Some(g) = group {
                let _ = write!(
                    s,
                    "group {g} snaplen {} qthreshold 0 ",
                    snaplen.unwrap_or(0)
                );
            } else if let Some(l) = level {
                let _ = write!(s, "level {l} ");
                if let Some(f) = flags {
                    let _ = write!(s, "flags {f} ");
                }
            }
            s
        }
        Expr::Limit {
            rate,
            unit: u,
            burst,
            kind,
            over,
        } => format!(
            "limit rate {rate}/{} burst {burst} type {} flags 0x{:x} ",
            unit(*u),
            match kind {
                LimitType::Packets => "packets",
                LimitType::Bytes => "bytes",
            },
            u32::from(*over)
        ),
        Expr::Reject { kind, code } => format!(
            "reject type {} code {code} ",
            match kind {
                RejectType::IcmpUnreach => 0,
                RejectType::TcpRst => 1,
                RejectType::IcmpxUnreach => 2,
            }
        ),
        Expr::Nat {
            kind,
            family,
            addr_min,
            addr_max,
            proto_min,
            proto_max,
            flags,
        } => {
            let mut s = format!(
                "nat {} {} ",
                match kind {
                    NatType::Snat => "snat",
                    NatType::Dnat => "dnat",
                },
                family.name()
            );
            for (n, r) in [
                ("addr_min", addr_min),
                ("addr_max", addr_max),
                ("proto_min", proto_min),
                ("proto_max", proto_max),
            ] {
                if let Some(r) = r {
                    let _ = write!(s, "{n} reg {} ", r.0);
                }
            }
            if *flags != 0 {
                let _ = write!(s, "flags 0x{flags:x} ");
            }
            s
        }
        Expr::Masq {
            flags,
            proto_min,
            proto_max,
        } => {
            let mut s = "masq ".to_owned();
            if let Some(r) = proto_min {
                let _ = write!(s, "proto_min reg {} ", r.0);
            }
            if let Some(r) = proto_max {
                let _ = write!(s, "proto_max reg {} ", r.0);
            }
            if *flags != 0 {
                let _ = write!(s, "flags 0x{flags:x} ");
            }
            s
        }
        Expr::Notrack => "notrack ".into(),
        Expr::Fib {
            flags,
            result,
            dreg,
        } => {
            let names = ["saddr", "daddr", "mark", "iif", "oif"];
            let parts: Vec<&str> = names
                .iter()
                .enumerate()
                .filter(|(i, _)| flags & (1 << i) != 0)
                .map(|(_, n)| *n)
                .collect();
            format!(
                "fib {} {}{} => reg {} ",
                parts.join(" . "),
                match result {
                    FibResult::Oif => "oif",
                    FibResult::OifName => "oifname",
                    FibResult::AddrType => "type",
                },
                if flags & fib_flags::PRESENT != 0 {
                    " present"
                } else {
                    ""
                },
                dreg.0
            )
        }
        Expr::Connlimit { count, flags } => format!("connlimit count {count} flags {flags} "),
        Expr::Other { name, data: d } => format!("{name} raw {} ", data(d)),
    };
    format!("[ {body}]")
}

/// A rule: one expression per line, then its comment.
pub fn rule(r: &Rule) -> String {
    let mut s = String::new();
    for e in r.exprs.iter() {
        let _ = writeln!(s, "  {}", expr(e));
    }
    if let Some(c) = &r.comment {
        let _ = writeln!(s, "  comment {c:?}");
    }
    s
}

fn key(k: &[DataType]) -> String {
    k.iter()
        .map(|t| match t {
            DataType::Verdict => "verdict".to_owned(),
            DataType::Ipv4Addr => "ipv4_addr".to_owned(),
            DataType::Ipv6Addr => "ipv6_addr".to_owned(),
            DataType::EtherAddr => "ether_addr".to_owned(),
            DataType::InetProto => "inet_proto".to_owned(),
            DataType::InetService => "inet_service".to_owned(),
            DataType::Mark => "mark".to_owned(),
            DataType::IfName => "ifname".to_owned(),
            DataType::Other { id, len } => format!("type{id}/{len}"),
        })
        .collect::<Vec<_>>()
        .join(" . ")
}

/// One set element: key (and interval end / data) in hex.
pub fn element(e: &Element) -> String {
    let mut s = data(&e.key);
    if let Some(k) = &e.key_end {
        let _ = write!(s, " - {}", data(k));
    }
    if e.flags & elem_flags::INTERVAL_END != 0 {
        s.push_str(" [end]");
    }
    match e.data.as_deref() {
        None => {}
        Some(ElemData::Verdict(v)) => {
            let _ = write!(s, " : {}", verdict(v));
        }
        Some(ElemData::Value(v)) => {
            let _ = write!(s, " : {}", data(v));
        }
    }
    s
}

/// A whole table in an `nft list`-like layout with debug-style rules.
pub fn table(t: &Table) -> String {
    let mut s = format!("table {} {}", t.family.name(), t.name);
    if t.flags != 0 {
        let _ = write!(s, " flags 0x{:x}", t.flags);
    }
    s.push('\n');
    for set in t.sets.values() {
        let _ = write!(s, "  set {} type {}", set.name, key(&set.key));
        if let Some(d) = set.data {
            let _ = write!(s, " : {}", key(&[d]));
        }
        if set.flags != 0 {
            let _ = write!(s, " flags 0x{:x}", set.flags);
        }
        if let Some(sz) = set.size {
            let _ = write!(s, " size {sz}");
        }
        if set.counter {
            s.push_str(" counter");
        }
        let _ = writeln!(s, " ({} elements)", set.elements.len());
        for e in &set.elements {
            let _ = writeln!(s, "    {}", element(e));
        }
    }
    for c in t.chains.values() {
        let _ = write!(s, "  chain {}", c.name);
        if let Some(b) = &c.base {
            let _ = write!(
                s,
                " type {} hook {} priority {} policy {}",
                b.chain_type.name(),
                match b.hook {
                    Hook::Prerouting => "prerouting".to_owned(),
                    Hook::Input => "input".to_owned(),
                    Hook::Forward => "forward".to_owned(),
                    Hook::Output => "output".to_owned(),
                    Hook::Postrouting => "postrouting".to_owned(),
                    Hook::Other(n) => n.to_string(),
                },
                b.priority,
                verdict(&b.policy)
            );
        }
        s.push('\n');
        for (i, r) in c.rules.iter().enumerate() {
            let _ = writeln!(s, "   rule {i}");
            s.push_str(&rule(r));
        }
    }
    s
}
