//! One nf_tables transaction as bytes: `BATCH_BEGIN` (with the generation id) … `BATCH_END`,
//! ready for one `sendmsg`.
//!
//! Every object message gets its own sequence number, and the batch remembers what each one
//! does, so a kernel error (which names only a seq) can be reported as "adding rule 3 of chain
//! filter-cali-tw-cali12 in table ip calico". Only END asks for an ACK: per-message ACKs flood
//! the receive buffer on big batches (gotcha 3). Element lists are split so no attribute passes
//! 64 KiB (gotcha 2). Without END the batch is a dry-run: the kernel validates every message and
//! keeps nothing.

use std::collections::HashMap;

use super::codec::{self, CodecError, MsgWriter};
use super::consts::*;
use super::error::{ObjectRef, Target};
use super::model::*;

/// Budget for one element list, under the 64 KiB attribute limit with room for headers.
const ELEM_LIST_BUDGET: usize = 60 * 1024;

/// A transaction being built.
#[derive(Debug)]
pub struct Batch {
    w: MsgWriter,
    first_seq: u32,
    next_seq: u32,
    /// What message `first_seq + i` does.
    descs: Vec<Desc>,
    next_set_id: u32,
    /// Sets created in this batch, per table → their `NFTA_SET_ID`.
    set_ids: SetIds,
    /// Where the expressions of each shared rule body were encoded for the table of the last
    /// rule: endpoint chains repeat a few bodies thousands of times, and copying the
    /// encoded attribute is cheaper than encoding it again. Holding the body keeps its address
    /// from being reused while it is a key.
    encoded_bodies: EncodedBodies,
    /// Element lists of a set created in this batch name it by ID alone (`true`) or by name and
    /// ID, as `nft` does (see [`super::features`]: which is cheaper depends on the kernel).
    elems_by_id: bool,
}

/// Encoded rule bodies of one table: (family, table) and body address → (body, byte range).
#[derive(Debug, Default)]
struct EncodedBodies {
    table: Option<(Family, String)>,
    at: HashMap<usize, (Exprs, std::ops::Range<usize>)>,
}

impl EncodedBodies {
    /// The bodies of `table`, forgetting another table's (their set ids differ).
    fn of(
        &mut self,
        family: Family,
        table: &str,
    ) -> &mut HashMap<usize, (Exprs, std::ops::Range<usize>)> {
        if !self
            .table
            .as_ref()
            .is_some_and(|(f, t)| *f == family && t == table)
        {
            self.table = Some((family, table.to_string()));
            self.at.clear();
        }
        &mut self.at
    }
}

/// The ids of the sets a batch creates in one table (a handful of tables: found without building
/// a key, which would be an allocation per rule).
fn table_set_ids<'a>(
    set_ids: &'a SetIds,
    family: Family,
    table: &str,
) -> Option<&'a HashMap<String, u32>> {
    set_ids
        .iter()
        .find(|((f, t), _)| *f == family && t == table)
        .map(|(_, ids)| ids)
}

/// Per table, the `NFTA_SET_ID` of each set the batch creates.
type SetIds = HashMap<(Family, String), HashMap<String, u32>>;

/// A finished batch.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The netlink messages, BATCH_BEGIN to BATCH_END, for one `sendmsg`.
    pub bytes: Vec<u8>,
    /// Seq of BATCH_BEGIN; object messages follow at +1, +2, ...
    pub first_seq: u32,
    /// Seq of BATCH_END when committing, `None` for a dry-run.
    pub end_seq: Option<u32>,
    descs: Vec<Desc>,
}

/// What one message of a batch does, for error messages. A rule (nearly every message of a
/// full load) keeps only where its message starts and its position in the chain: its table,
/// chain and comment are read back from the bytes if an error names it. Written out, the
/// descriptions cost ~100 bytes per rule, 16 MB of a large full load.
#[derive(Debug, Clone)]
enum Desc {
    Text(String, Target),
    Rule { offset: u32, index: u32 },
}

impl Encoded {
    /// What the message with sequence number `seq` did.
    pub fn describe(&self, seq: u32) -> String {
        if seq == self.first_seq {
            return "the batch (generation check at BATCH_BEGIN)".into();
        }
        if Some(seq) == self.end_seq {
            return "the batch commit (BATCH_END)".into();
        }
        seq.checked_sub(self.first_seq + 1)
            .and_then(|i| self.descs.get(i as usize))
            .map(|d| match d {
                Desc::Text(t, _) => t.clone(),
                Desc::Rule { offset, index } => self.describe_rule(*offset as usize, *index),
            })
            .unwrap_or_else(|| format!("message seq {seq} (not in this batch)"))
    }

    /// The object the message with sequence number `seq` was about; `None` for BEGIN, END or a
    /// number not in this batch.
    pub fn target(&self, seq: u32) -> Option<Target> {
        let d = seq
            .checked_sub(self.first_seq + 1)
            .and_then(|i| self.descs.get(i as usize))?;
        match d {
            Desc::Text(_, t) => Some(t.clone()),
            Desc::Rule { offset, .. } => {
                let offset = *offset as usize;
                let len = self
                    .bytes
                    .get(offset..offset + 4)
                    .and_then(|h| h.try_into().ok())
                    .map(u32::from_ne_bytes)? as usize;
                let payload = self.bytes.get(offset + NLMSG_HDRLEN..offset + len)?;
                let r = codec::decode_rule_ref(payload).ok()?;
                Some(Target {
                    family: r.family,
                    table: r.table.to_string(),
                    object: ObjectRef::Chain(r.chain.to_string()),
                })
            }
        }
    }

    /// "adding rule 3 of chain C in table ip T (comment)", from the NEWRULE message at `offset`.
    fn describe_rule(&self, offset: usize, index: u32) -> String {
        let payload = self
            .bytes
            .get(offset..offset + NLMSG_HDRLEN)
            .and_then(|h| h[..4].try_into().ok())
            .map(|len| offset + u32::from_ne_bytes(len) as usize)
            .and_then(|end| self.bytes.get(offset + NLMSG_HDRLEN..end));
        match payload.map(codec::decode_rule_ref) {
            Some(Ok(r)) => {
                let mut d = format!(
                    "adding rule {index} of chain {} in table {} {}",
                    r.chain,
                    r.family.name(),
                    r.table
                );
                if let Some(c) = &r.rule.comment {
                    d.push_str(&format!(" ({c})"));
                }
                d
            }
            _ => format!("adding rule {index} (message at byte {offset} of the batch)"),
        }
    }

    /// Number of object messages (without BEGIN/END).
    pub fn messages(&self) -> usize {
        self.descs.len()
    }

    /// True when the batch holds no object message: nothing to send.
    pub fn is_empty(&self) -> bool {
        self.descs.is_empty()
    }
}

use netlink_wire::NLMSG_HDRLEN;

fn msg_type(m: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | m
}

impl Batch {
    /// Starts a batch at sequence number `seq`, carrying `genid` (from `NFT_MSG_GETGEN`) when
    /// given, so a concurrent writer makes the kernel refuse it with ERESTART.
    pub fn new(seq: u32, genid: Option<u32>) -> Batch {
        let mut w = MsgWriter::with_capacity(4096);
        let m = w.begin_msg(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            seq,
            libc::AF_UNSPEC as u8,
            NFNL_SUBSYS_NFTABLES,
        );
        if let Some(g) = genid {
            w.put_be32(NFNL_BATCH_GENID, g);
        }
        // Cannot overflow: one 8-byte attribute.
        let _ = w.end_msg(m);
        Batch {
            w,
            first_seq: seq,
            next_seq: seq.wrapping_add(1),
            descs: Vec::new(),
            next_set_id: 1,
            set_ids: HashMap::new(),
            encoded_bodies: EncodedBodies::default(),
            elems_by_id: true,
        }
    }

    /// How element lists name a set this batch creates: by ID alone, or by name and ID.
    pub fn with_elems_by_id(mut self, by_id: bool) -> Batch {
        self.elems_by_id = by_id;
        self
    }

    /// Bytes so far (for capacity planning and benches).
    pub fn len(&self) -> usize {
        self.w.buf.len()
    }

    /// True when no object message was added.
    pub fn is_empty(&self) -> bool {
        self.descs.is_empty()
    }

    #[allow(clippy::too_many_arguments)]
    fn msg(
        &mut self,
        ty: u16,
        flags: u16,
        family: Family,
        (table, object): (&str, ObjectRef),
        desc: impl FnOnce() -> String,
        body: impl FnOnce(&mut MsgWriter) -> Result<(), CodecError>,
    ) -> Result<(), CodecError> {
        let target = Target {
            family,
            table: table.to_string(),
            object,
        };
        self.msg_desc(ty, flags, family, |_| Desc::Text(desc(), target), body)
    }

    /// [`Batch::msg`] for a message whose body cannot fail (names and flags only).
    fn plain(
        &mut self,
        (ty, flags): (u16, u16),
        family: Family,
        target: (&str, ObjectRef),
        desc: impl FnOnce() -> String,
        body: impl FnOnce(&mut MsgWriter),
    ) {
        let _ = self.msg(ty, flags, family, target, desc, |w| {
            body(w);
            Ok(())
        });
    }

    /// [`Batch::msg`] with the description made from the message's offset in the batch.
    fn msg_desc(
        &mut self,
        ty: u16,
        flags: u16,
        family: Family,
        desc: impl FnOnce(u32) -> Desc,
        body: impl FnOnce(&mut MsgWriter) -> Result<(), CodecError>,
    ) -> Result<(), CodecError> {
        let seq = self.next_seq;
        let start = self.w.buf.len();
        let m = self.w.begin_msg(
            msg_type(ty),
            NLM_F_REQUEST | flags,
            seq,
            family.nfproto(),
            0,
        );
        let res = body(&mut self.w).and_then(|()| self.w.end_msg(m));
        if let Err(e) = res {
            self.w.buf.truncate(start);
            return Err(e);
        }
        self.next_seq = seq.wrapping_add(1);
        self.descs.push(desc(start as u32));
        Ok(())
    }

    /// NEWTABLE (create, or update flags / re-adopt an orphaned persistent table).
    pub fn add_table(&mut self, family: Family, name: &str, flags: u32) {
        self.plain(
            (NFT_MSG_NEWTABLE, NLM_F_CREATE),
            family,
            (name, ObjectRef::Table),
            || format!("adding table {} {name} (flags 0x{flags:x})", family.name()),
            |w| codec::put_table(w, name, flags),
        );
    }

    /// DELTABLE: the table and everything in it.
    pub fn del_table(&mut self, family: Family, name: &str) {
        self.plain(
            (NFT_MSG_DELTABLE, 0),
            family,
            (name, ObjectRef::Table),
            || format!("deleting table {} {name}", family.name()),
            |w| codec::put_table_ref(w, name),
        );
    }

    /// NEWCHAIN (without its rules).
    pub fn add_chain(&mut self, family: Family, table: &str, chain: &Chain) {
        self.plain(
            (NFT_MSG_NEWCHAIN, NLM_F_CREATE),
            family,
            (table, ObjectRef::Chain(chain.name.clone())),
            || {
                format!(
                    "adding {}chain {} in table {} {table}",
                    if chain.base.is_some() { "base " } else { "" },
                    chain.name,
                    family.name()
                )
            },
            |w| codec::put_chain(w, table, chain),
        );
    }

    /// DELRULE with only table and chain: removes every rule of the chain.
    pub fn flush_chain(&mut self, family: Family, table: &str, chain: &str) {
        self.plain(
            (NFT_MSG_DELRULE, 0),
            family,
            (table, ObjectRef::Chain(chain.to_string())),
            || format!("flushing chain {chain} in table {} {table}", family.name()),
            |w| codec::put_rule_chain_ref(w, table, chain),
        );
    }

    /// DELCHAIN.
    pub fn del_chain(&mut self, family: Family, table: &str, chain: &str) {
        self.plain(
            (NFT_MSG_DELCHAIN, 0),
            family,
            (table, ObjectRef::Chain(chain.to_string())),
            || format!("deleting chain {chain} in table {} {table}", family.name()),
            |w| codec::put_chain_ref(w, table, chain),
        );
    }

    /// NEWRULE, appended. `index` is only for the error text.
    pub fn add_rule(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        index: usize,
        rule: &Rule,
    ) -> Result<(), CodecError> {
        // Lookups of sets created in this batch carry their id, as nft does. (The map is taken
        // out while the message is written.)
        let set_ids = std::mem::take(&mut self.set_ids);
        let ids = table_set_ids(&set_ids, family, table);
        let set_id = |set: &str| ids.and_then(|ids| ids.get(set)).copied();
        // Bodies held by one rule only are not worth remembering.
        let shared = rule.exprs.holders() > 1;
        let mut bodies = std::mem::take(&mut self.encoded_bodies);
        let known = bodies.of(family, table);
        let from = shared
            .then(|| known.get(&rule.exprs.addr()).map(|(_, r)| r.clone()))
            .flatten();
        let reused = from.is_some();
        let mut at = None;
        let res = self.msg_desc(
            NFT_MSG_NEWRULE,
            NLM_F_CREATE | NLM_F_APPEND,
            family,
            |offset| Desc::Rule {
                offset,
                index: index as u32,
            },
            |w| {
                at = Some(codec::put_rule_reusing(
                    w, table, chain, rule, &set_id, from,
                )?);
                Ok(())
            },
        );
        // A failed message was cut from the buffer: only a kept one is remembered.
        if let (Ok(()), Some(at), true, false) = (&res, at, shared, reused) {
            known.insert(rule.exprs.addr(), (rule.exprs.clone(), at));
        }
        self.encoded_bodies = bodies;
        self.set_ids = set_ids;
        res
    }

    /// DELRULE of one rule by handle.
    pub fn del_rule(&mut self, family: Family, table: &str, chain: &str, handle: u64) {
        self.plain(
            (NFT_MSG_DELRULE, 0),
            family,
            (table, ObjectRef::Chain(chain.to_string())),
            || {
                format!(
                    "deleting rule handle {handle} of chain {chain} in table {} {table}",
                    family.name()
                )
            },
            |w| codec::put_rule_ref(w, table, chain, handle),
        );
    }

    /// NEWSET (without elements; add them with [`Batch::add_elements`]).
    pub fn add_set(&mut self, family: Family, table: &str, set: &Set) {
        let id = self.next_set_id;
        self.next_set_id += 1;
        self.set_ids
            .entry((family, table.to_owned()))
            .or_default()
            .insert(set.name.clone(), id);
        self.plain(
            (NFT_MSG_NEWSET, NLM_F_CREATE),
            family,
            (table, ObjectRef::Set(set.name.clone())),
            || {
                format!(
                    "adding {} {} in table {} {table}",
                    if set.data.is_some() { "map" } else { "set" },
                    set.name,
                    family.name()
                )
            },
            |w| codec::put_set(w, table, set, Some(id)),
        );
    }

    /// DELSET.
    pub fn del_set(&mut self, family: Family, table: &str, set: &str) {
        self.plain(
            (NFT_MSG_DELSET, 0),
            family,
            (table, ObjectRef::Set(set.to_string())),
            || format!("deleting set {set} in table {} {table}", family.name()),
            |w| codec::put_set_ref(w, table, set),
        );
    }

    fn elements(
        &mut self,
        ty: u16,
        family: Family,
        table: &str,
        set: &str,
        elems: &[Element],
    ) -> Result<(), CodecError> {
        let set_id = table_set_ids(&self.set_ids, family, table)
            .and_then(|ids| ids.get(set))
            .copied();
        let by_id = self.elems_by_id;
        let verb = if ty == NFT_MSG_NEWSETELEM {
            "adding"
        } else {
            "deleting"
        };
        let mut start = 0;
        while start < elems.len() {
            let mut size = 0;
            let mut end = start;
            while end < elems.len() {
                let s = codec::elem_size_hint(&elems[end]);
                if end > start && size + s > ELEM_LIST_BUDGET {
                    break;
                }
                size += s;
                end += 1;
            }
            let chunk = &elems[start..end];
            let (from, n) = (start, chunk.len());
            self.msg(
                ty,
                if ty == NFT_MSG_NEWSETELEM {
                    NLM_F_CREATE
                } else {
                    0
                },
                family,
                (table, ObjectRef::Set(set.to_string())),
                || {
                    format!(
                        "{verb} elements {from}..{} of set {set} in table {} {table}",
                        from + n,
                        family.name()
                    )
                },
                |w| {
                    let of = match set_id {
                        Some(id) if by_id => codec::ElemsOf::Id(id),
                        id => codec::ElemsOf::Name(set, id),
                    };
                    codec::put_elems(w, table, of, chunk);
                    Ok(())
                },
            )?;
            start = end;
        }
        Ok(())
    }

    /// NEWSETELEM, split into messages under 64 KiB.
    pub fn add_elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        elems: &[Element],
    ) -> Result<(), CodecError> {
        self.elements(NFT_MSG_NEWSETELEM, family, table, set, elems)
    }

    /// DELSETELEM, split into messages under 64 KiB.
    pub fn del_elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        elems: &[Element],
    ) -> Result<(), CodecError> {
        self.elements(NFT_MSG_DELSETELEM, family, table, set, elems)
    }

    /// Reserves room for `bytes` more bytes, so a big batch is not copied while it grows.
    pub fn reserve(&mut self, bytes: usize) {
        self.w.buf.reserve(bytes);
    }

    /// Closes the batch: with END (and an ACK asked on it) to commit, without END for a dry-run.
    pub fn finish(mut self, commit: bool) -> Encoded {
        let end_seq = commit.then_some(self.next_seq);
        if commit {
            let m = self.w.begin_msg(
                NFNL_MSG_BATCH_END,
                NLM_F_REQUEST | NLM_F_ACK,
                self.next_seq,
                libc::AF_UNSPEC as u8,
                NFNL_SUBSYS_NFTABLES,
            );
            let _ = self.w.end_msg(m);
        }
        Encoded {
            bytes: self.w.buf,
            first_seq: self.first_seq,
            end_seq,
            descs: self.descs,
        }
    }

    /// Sequence numbers this batch uses, END included: the socket reserves them.
    pub fn seq_count(&self) -> u32 {
        self.descs.len() as u32 + 2
    }
}
