//! Read-back of our own tables: table, chains, rules (with userdata), sets and elements, decoded
//! into the model. Only the named tables are ever asked for (never other users' tables).
//!
//! Consistency: the generation id is read before and after; a change, an `NLM_F_DUMP_INTR`
//! flag, or duplicate keys in an element dump (the large-set rhashtable anomaly, netlink.md
//! gotcha 10) make us read again. A failed read is an error, never an empty table; ENOENT on
//! the table itself is the one "absent" answer.

use std::collections::{BTreeMap, HashSet};

use super::codec::{self, MsgWriter, Object};
use super::consts::*;
use super::error::NftError;
use super::model::*;
use super::socket::{NfSocket, Reply};

/// What the kernel holds for one of our tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableState {
    pub table: Table,
    /// Netlink port id of the owning socket (`NFTA_TABLE_OWNER`), if the table is owned and its
    /// owner is alive. An orphaned persistent table has `OWNER|PERSIST` flags and no owner.
    pub owner: Option<u32>,
}

const MAX_READS: u32 = 5;

fn msg_type(m: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | m
}

/// The current ruleset generation (`NFT_MSG_GETGEN`).
pub fn generation(sock: &mut NfSocket) -> Result<u32, NftError> {
    let seq = sock.take_seq(1);
    let mut w = MsgWriter::new();
    let m = w.begin_msg(
        msg_type(NFT_MSG_GETGEN),
        NLM_F_REQUEST,
        seq,
        libc::AF_UNSPEC as u8,
        0,
    );
    let _ = w.end_msg(m);
    let replies = sock.request(&w.buf, seq, false)?;
    for r in &replies {
        if let Some(e) = r.as_error() {
            if e.errno != 0 {
                return Err(rejected("reading the ruleset generation", e));
            }
        }
        if r.ty == msg_type(NFT_MSG_NEWGEN) {
            for a in codec::Attrs::new(r.payload.get(4..).unwrap_or_default()) {
                let a = a.map_err(|source| NftError::Codec {
                    op: "decoding NEWGEN".into(),
                    source,
                })?;
                if a.ty == NFTA_GEN_ID {
                    return a.be32("generation").map_err(|source| NftError::Codec {
                        op: "decoding NEWGEN".into(),
                        source,
                    });
                }
            }
        }
    }
    Err(NftError::Protocol(
        "GETGEN answered without NFTA_GEN_ID".into(),
    ))
}

fn rejected(what: &str, e: super::socket::ErrorReply) -> NftError {
    NftError::Rejected {
        object: what.to_owned(),
        errno: e.errno,
        ext_ack: e.ext_ack,
        attr_offset: e.attr_offset,
        more: 0,
        source: std::io::Error::from_raw_os_error(e.errno),
    }
}

/// Result of one GET: objects, whether the dump was interrupted, or ENOENT.
enum Got {
    Objects(Vec<Object>, bool),
    NotFound,
}

fn get(
    sock: &mut NfSocket,
    what: &str,
    msg: u16,
    family: Family,
    dump: bool,
    attrs: impl FnOnce(&mut MsgWriter),
) -> Result<Got, NftError> {
    let seq = sock.take_seq(1);
    let mut w = MsgWriter::new();
    let flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
    let m = w.begin_msg(msg_type(msg), flags, seq, family.nfproto(), 0);
    attrs(&mut w);
    w.end_msg(m).map_err(|source| NftError::Codec {
        op: format!("encoding the request for {what}"),
        source,
    })?;
    let replies: Vec<Reply> = sock.request(&w.buf, seq, dump)?;
    let mut out = Vec::new();
    let mut intr = false;
    for r in replies {
        intr |= r.flags & NLM_F_DUMP_INTR != 0;
        if let Some(e) = r.as_error() {
            match e.errno {
                0 => continue,
                libc::ENOENT => return Ok(Got::NotFound),
                _ => return Err(rejected(what, e)),
            }
        }
        if r.ty == NLMSG_DONE {
            // A dump that failed midway reports its error in DONE's payload.
            if let Some(b) = r.payload.get(..4) {
                let err = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                if err < 0 {
                    return Err(rejected(
                        what,
                        super::socket::ErrorReply {
                            seq,
                            errno: -err,
                            ext_ack: None,
                            attr_offset: None,
                        },
                    ));
                }
            }
            continue;
        }
        if r.ty >> 8 != NFNL_SUBSYS_NFTABLES {
            continue;
        }
        let obj =
            codec::decode_message(r.ty & 0xff, &r.payload).map_err(|source| NftError::Codec {
                op: format!("decoding {what}"),
                source,
            })?;
        out.push(obj);
    }
    Ok(Got::Objects(out, intr))
}

/// Reads one of our tables. `Ok(None)`: the kernel says the table does not exist.
pub fn read_table(
    sock: &mut NfSocket,
    family: Family,
    name: &str,
) -> Result<Option<TableState>, NftError> {
    let what = format!("table {} {name}", family.name());
    let wrap = |e: NftError| NftError::Read {
        what: what.clone(),
        source: Box::new(e),
    };
    for attempt in 0..MAX_READS {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1 << attempt));
        }
        let gen_before = generation(sock).map_err(wrap)?;
        match read_once(sock, family, name).map_err(wrap)? {
            Attempt::Consistent(state) => {
                if generation(sock).map_err(wrap)? == gen_before {
                    return Ok(state);
                }
            }
            Attempt::Retry(why) => {
                tracing::debug!(
                    table = name,
                    family = family.name(),
                    why,
                    "re-reading table"
                );
            }
        }
    }
    Err(NftError::Inconsistent {
        what,
        tries: MAX_READS,
    })
}

enum Attempt {
    Consistent(Option<TableState>),
    Retry(&'static str),
}

fn read_once(sock: &mut NfSocket, family: Family, name: &str) -> Result<Attempt, NftError> {
    let tmsg = match get(sock, "the table", NFT_MSG_GETTABLE, family, false, |w| {
        codec::put_table_ref(w, name)
    })? {
        Got::NotFound => return Ok(Attempt::Consistent(None)),
        Got::Objects(objs, _) => objs.into_iter().find_map(|o| match o {
            Object::Table(t) if t.name == name && t.family == family => Some(t),
            _ => None,
        }),
    };
    let Some(tmsg) = tmsg else {
        return Err(NftError::Protocol(format!(
            "GETTABLE {name} returned no table"
        )));
    };
    let mut table = Table::new(family, name);
    table.flags = tmsg.flags;
    let mut interrupted = false;

    let mut dump = |sock: &mut NfSocket, what: &str, msg: u16, attrs: &dyn Fn(&mut MsgWriter)| {
        match get(sock, what, msg, family, true, attrs)? {
            // The table vanished between GETTABLE and this dump: read again.
            Got::NotFound => Ok(None),
            Got::Objects(o, intr) => {
                interrupted |= intr;
                Ok::<_, NftError>(Some(o))
            }
        }
    };
    let Some(chains) = dump(sock, "chains", NFT_MSG_GETCHAIN, &|w| {
        w.put_str(NFTA_CHAIN_TABLE, name)
    })?
    else {
        return Ok(Attempt::Retry("table vanished"));
    };
    for o in chains {
        if let Object::Chain(c) = o {
            if c.table == name && c.family == family {
                table.chains.insert(c.chain.name.clone(), c.chain);
            }
        }
    }
    let Some(rules) = dump(sock, "rules", NFT_MSG_GETRULE, &|w| {
        w.put_str(NFTA_RULE_TABLE, name)
    })?
    else {
        return Ok(Attempt::Retry("table vanished"));
    };
    for o in rules {
        if let Object::Rule(r) = o {
            if r.table != name || r.family != family {
                continue;
            }
            match table.chains.get_mut(&r.chain) {
                Some(c) => c.rules.push(r.rule),
                None => return Ok(Attempt::Retry("rule of an unknown chain")),
            }
        }
    }
    let Some(sets) = dump(sock, "sets", NFT_MSG_GETSET, &|w| {
        w.put_str(NFTA_SET_TABLE, name)
    })?
    else {
        return Ok(Attempt::Retry("table vanished"));
    };
    let mut set_map = BTreeMap::new();
    for o in sets {
        if let Object::Set(s) = o {
            if s.table == name && s.family == family {
                set_map.insert(s.set.name.clone(), s.set);
            }
        }
    }
    for (sname, set) in set_map.iter_mut() {
        let what = format!("elements of set {sname}");
        let Some(objs) = dump(sock, &what, NFT_MSG_GETSETELEM, &|w| {
            w.put_str(NFTA_SET_ELEM_LIST_TABLE, name);
            w.put_str(NFTA_SET_ELEM_LIST_SET, sname);
        })?
        else {
            return Ok(Attempt::Retry("set vanished"));
        };
        for o in objs {
            if let Object::Elems(e) = o {
                set.elements.extend(e.elements);
            }
        }
        let mut seen = HashSet::with_capacity(set.elements.len());
        if !set
            .elements
            .iter()
            .all(|e| seen.insert((&e.key, &e.key_end, e.flags)))
        {
            return Ok(Attempt::Retry("duplicate elements in a set dump"));
        }
    }
    table.sets = set_map;
    if interrupted {
        return Ok(Attempt::Retry("NLM_F_DUMP_INTR"));
    }
    Ok(Attempt::Consistent(Some(TableState {
        table,
        owner: tmsg.owner,
    })))
}
