//! Policy-routing rules that point at a table the caller owns: every rule of a family whose
//! action is "look up table N" is the caller's; the one it wants is kept, every other such rule
//! is deleted, as Felix's route-rule manager does. Rules pointing at other tables are never
//! touched. Knows rules, not why a table exists.

use futures::TryStreamExt;
use netlink_packet_route::route::RouteProtocol;
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};
use rtnetlink::IpVersion;

use super::{IpFamily, Result, RtnlError, RtnlHandle};

/// One `[not] fwmark MARK/MASK lookup TABLE` rule at a priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleSpec {
    pub family: IpFamily,
    pub priority: u32,
    pub mark: u32,
    pub mask: u32,
    /// `not`: the rule matches packets whose mark does not match.
    pub invert: bool,
    pub table: u32,
}

/// What one sync did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RuleReport {
    pub added: bool,
    pub deleted: usize,
}

/// The parts of a kernel rule the spec compares.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    table: u32,
    priority: u32,
    mark: u32,
    mask: u32,
    invert: bool,
    to_table: bool,
    /// Source, destination or interface selectors (ours have none).
    selectors: bool,
}

fn seen(m: &RuleMessage) -> Seen {
    let mut s = Seen {
        table: u32::from(m.header.table),
        priority: 0,
        mark: 0,
        mask: 0,
        invert: m.header.flags.contains(RuleFlags::Invert),
        to_table: m.header.action == RuleAction::ToTable,
        selectors: m.header.src_len != 0 || m.header.dst_len != 0,
    };
    for a in &m.attributes {
        match a {
            RuleAttribute::Table(t) => s.table = *t,
            RuleAttribute::Priority(p) => s.priority = *p,
            RuleAttribute::FwMark(v) => s.mark = *v,
            RuleAttribute::FwMask(v) => s.mask = *v,
            RuleAttribute::Iifname(_) | RuleAttribute::Oifname(_) => s.selectors = true,
            _ => {}
        }
    }
    s
}

impl RuleSpec {
    fn matches(&self, s: &Seen) -> bool {
        s.to_table
            && !s.selectors
            && s.table == self.table
            && s.priority == self.priority
            && s.mark == self.mark
            && s.mask == self.mask
            && s.invert == self.invert
    }
}

impl std::fmt::Display for RuleSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let not = if self.invert { "not " } else { "" };
        write!(
            f,
            "{}: {not}fwmark {:#x}/{:#x} lookup {}",
            self.priority, self.mark, self.mask, self.table
        )
    }
}

fn version(family: IpFamily) -> IpVersion {
    match family {
        IpFamily::V4 => IpVersion::V4,
        IpFamily::V6 => IpVersion::V6,
    }
}

/// Makes `want` the only rule of `family` that looks up `table` (none at all with `None`).
pub async fn sync_table_rules(
    h: &RtnlHandle,
    family: IpFamily,
    table: u32,
    want: Option<&RuleSpec>,
) -> Result<RuleReport> {
    let rules: Vec<RuleMessage> = h
        .handle()
        .rule()
        .get(version(family))
        .execute()
        .try_collect()
        .await
        .map_err(|e| RtnlError::kernel("dumping rules for table", table.to_string(), e))?;
    let mut report = RuleReport::default();
    let mut present = false;
    for m in rules {
        let s = seen(&m);
        if !s.to_table || s.table != table {
            continue;
        }
        if !present && want.is_some_and(|w| w.matches(&s)) {
            present = true;
            continue;
        }
        match h.handle().rule().del(m).execute().await {
            Ok(()) => report.deleted += 1,
            Err(e) => {
                let e = RtnlError::kernel("deleting rule for table", table.to_string(), e);
                // Gone meanwhile: what we wanted.
                if e.errno() != Some(libc::ENOENT) {
                    return Err(e);
                }
            }
        }
    }
    if let (Some(w), false) = (want, present) {
        let add = h
            .handle()
            .rule()
            .add()
            .table_id(w.table)
            .priority(w.priority)
            .fw_mark(w.mark)
            .action(RuleAction::ToTable);
        let res = match family {
            IpFamily::V4 => {
                let mut r = add.v4();
                decorate(r.message_mut(), w);
                r.execute().await
            }
            IpFamily::V6 => {
                let mut r = add.v6();
                decorate(r.message_mut(), w);
                r.execute().await
            }
        };
        res.map_err(|e| RtnlError::kernel("adding rule", w.to_string(), e))?;
        report.added = true;
    }
    Ok(report)
}

fn decorate(m: &mut RuleMessage, w: &RuleSpec) {
    m.attributes.push(RuleAttribute::FwMask(w.mask));
    m.attributes
        .push(RuleAttribute::Protocol(RouteProtocol::Boot));
    if w.invert {
        m.header.flags |= RuleFlags::Invert;
    }
}
