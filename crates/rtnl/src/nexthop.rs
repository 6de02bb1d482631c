//! Nexthop objects (`RTM_NEWNEXTHOP`): the route syncer's gateway routes point at one object per
//! (gateway, interface, onlink, protocol) instead of carrying the gateway themselves.
//!
//! Why: the kernel finds a gateway route's shared `fib_info` in a hash keyed by the output
//! interface but not the gateway, so every route via another gateway on one device lands in one
//! bucket, and adding N such routes (a VTEP per remote node, all on `vxlan.calico`) compares
//! against every earlier one — quadratic. A route by nexthop id hashes by the id. Forwarding is
//! the same, and route dumps still report the gateway, device and onlink flag of the object
//! (`net.ipv4.nexthop_compat_mode`, on by default); where that is off, the syncer fills them in
//! from its own nexthop dump.
//!
//! This module owns the wire format (request bodies, the dump) and the bookkeeping of the objects
//! a syncer believes it has: which id each key has, which ids are taken, how many believed routes
//! use each. Which objects are ours follows the route ownership rule's protocols.
//! `netlink-packet-route` has no nexthop messages, so they are written here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::handle::RtnlHandle;
use super::{IpFamily, Result};
use netlink_wire::{attrs, put_attr};

/// Message types (uapi linux/rtnetlink.h).
pub const RTM_NEWNEXTHOP: u16 = 104;
pub const RTM_DELNEXTHOP: u16 = 105;
pub const RTM_GETNEXTHOP: u16 = 106;

/// Attributes (uapi linux/nexthop.h).
const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_BLACKHOLE: u16 = 4;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;
/// `RTNH_F_ONLINK` (uapi linux/rtnetlink.h), in `nhmsg.nh_flags`.
const RTNH_F_ONLINK: u32 = 4;
/// `struct nhmsg`: family, scope, protocol, reserved, flags.
const NHMSG_LEN: usize = 8;

/// The ids the syncer of each family gives its objects. Ids are global in a namespace, and other
/// routing software numbers its own from 1; ours are high so the two rarely meet, a create never
/// replaces an id someone else holds (`NLM_F_EXCL`), and the two families' syncers, which
/// allocate independently, never meet.
pub fn id_range(family: IpFamily) -> std::ops::RangeInclusive<u32> {
    match family {
        IpFamily::V4 => 0x4643_0000..=0x5642_ffff,
        IpFamily::V6 => 0x5643_0000..=0x6642_ffff,
    }
}

/// What makes two gateway routes share one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NexthopKey {
    pub via: IpAddr,
    pub oif: u32,
    pub onlink: bool,
    pub protocol: u8,
}

/// A nexthop object as dumped: `key` is `None` for groups, blackholes and objects without a
/// gateway (nothing the syncer makes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelNexthop {
    pub id: u32,
    pub protocol: u8,
    pub key: Option<NexthopKey>,
}

/// The body of a request creating or replacing object `id` for `key`.
pub fn new_body(id: u32, key: &NexthopKey) -> Vec<u8> {
    let family = match key.via {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    } as u8;
    let flags = if key.onlink { RTNH_F_ONLINK } else { 0 };
    let mut body = Vec::with_capacity(NHMSG_LEN + 3 * 8 + 16);
    body.extend_from_slice(&[family, 0, key.protocol, 0]);
    body.extend_from_slice(&flags.to_ne_bytes());
    put_attr(&mut body, NHA_ID, &id.to_ne_bytes());
    put_attr(&mut body, NHA_OIF, &key.oif.to_ne_bytes());
    match key.via {
        IpAddr::V4(a) => put_attr(&mut body, NHA_GATEWAY, &a.octets()),
        IpAddr::V6(a) => put_attr(&mut body, NHA_GATEWAY, &a.octets()),
    }
    body
}

/// The body of a request deleting object `id`.
pub fn del_body(id: u32) -> Vec<u8> {
    let mut body = vec![0u8; NHMSG_LEN];
    put_attr(&mut body, NHA_ID, &id.to_ne_bytes());
    body
}

/// Reads one dumped object; `None` when the message is malformed.
pub fn parse(payload: &[u8]) -> Option<KernelNexthop> {
    let header = payload.get(..NHMSG_LEN)?;
    let (family, protocol) = (header[0], header[2]);
    let flags = u32::from_ne_bytes(header[4..8].try_into().ok()?);
    let mut id = None;
    let mut oif = None;
    let mut via = None;
    let mut plain = true;
    for (ty, value) in attrs(payload.get(NHMSG_LEN..)?) {
        match ty {
            NHA_ID => id = Some(u32::from_ne_bytes(value.try_into().ok()?)),
            NHA_OIF => oif = Some(u32::from_ne_bytes(value.try_into().ok()?)),
            NHA_GATEWAY => {
                via = match (i32::from(family), value.len()) {
                    (libc::AF_INET, 4) => Some(IpAddr::from(<[u8; 4]>::try_from(value).ok()?)),
                    (libc::AF_INET6, 16) => Some(IpAddr::from(<[u8; 16]>::try_from(value).ok()?)),
                    _ => None,
                }
            }
            NHA_GROUP | NHA_BLACKHOLE => plain = false,
            _ => {}
        }
    }
    let key = match (plain, via, oif) {
        (true, Some(via), Some(oif)) => Some(NexthopKey {
            via,
            oif,
            onlink: flags & RTNH_F_ONLINK != 0,
            protocol,
        }),
        _ => None,
    };
    Some(KernelNexthop {
        id: id?,
        protocol,
        key,
    })
}

/// Every nexthop object of the namespace, of both families (their ids share one space).
pub fn dump(h: &RtnlHandle) -> Result<Vec<KernelNexthop>> {
    let body = [0u8; NHMSG_LEN];
    h.dump(
        RTM_GETNEXTHOP,
        RTM_NEWNEXTHOP,
        &body,
        "dumping nexthop objects",
        parse,
    )
}

/// The objects a syncer believes the kernel holds for it, and the ids it must not take.
#[derive(Debug, Clone)]
pub struct Nexthops {
    /// The ids this syncer gives out.
    range: std::ops::RangeInclusive<u32>,
    /// Our objects: key → id.
    by_key: BTreeMap<NexthopKey, u32>,
    /// Believed routes per id of ours.
    refs: BTreeMap<u32, usize>,
    /// Every id seen in the kernel (anyone's) or given out by us.
    taken: BTreeSet<u32>,
    /// An object may have become unused since [`Nexthops::take_released`] last said so.
    released: bool,
}

impl Nexthops {
    /// None yet; new objects get ids of `family`'s range.
    pub fn new(family: IpFamily) -> Nexthops {
        Nexthops {
            range: id_range(family),
            by_key: BTreeMap::new(),
            refs: BTreeMap::new(),
            taken: BTreeSet::new(),
            released: false,
        }
    }

    /// True when `id` is one this syncer gives out.
    pub fn in_range(&self, id: u32) -> bool {
        self.range.contains(&id)
    }

    /// Starts over from a dump: `ours` are the objects the ownership rule makes ours (with a
    /// key), `all` every id in the namespace. No route uses any yet.
    pub fn reset(&mut self, ours: impl IntoIterator<Item = (NexthopKey, u32)>, all: &[u32]) {
        self.by_key.clear();
        self.refs.clear();
        self.taken = all.iter().copied().collect();
        for (key, id) in ours {
            // Two objects with one key (someone made a copy): the lower id is used, the other
            // is unreferenced and goes.
            let e = self.by_key.entry(key).or_insert(id);
            *e = (*e).min(id);
        }
    }

    /// The id of `key`'s object, if we have one.
    pub fn id(&self, key: &NexthopKey) -> Option<u32> {
        self.by_key.get(key).copied()
    }

    /// Gives `key` a fresh id (the caller creates the object with `NLM_F_EXCL`).
    pub fn allocate(&mut self, key: NexthopKey) -> u32 {
        // Unused until a route holds it: a route write that fails leaves it to delete.
        self.released = true;
        let (first, last) = (*self.range.start(), *self.range.end());
        let mut id = self
            .taken
            .range(self.range.clone())
            .next_back()
            .map_or(first, |top| top.saturating_add(1));
        // Past the top: the lowest free id of the range.
        if id > last {
            id = self
                .range
                .clone()
                .find(|i| !self.taken.contains(i))
                .unwrap_or(first);
        }
        self.taken.insert(id);
        self.by_key.insert(key, id);
        id
    }

    /// Forgets `key`'s object (its create failed, or it was deleted).
    pub fn forget(&mut self, key: &NexthopKey) {
        if let Some(id) = self.by_key.remove(key) {
            self.refs.remove(&id);
        }
    }

    /// No route uses any object (the caller then holds each believed route's again).
    pub fn clear_refs(&mut self) {
        self.refs.clear();
    }

    /// A believed route now uses `id`.
    pub fn hold(&mut self, id: u32) {
        *self.refs.entry(id).or_default() += 1;
    }

    /// A believed route no longer uses `id`.
    pub fn release(&mut self, id: u32) {
        if let Some(n) = self.refs.get_mut(&id) {
            *n = n.saturating_sub(1);
            self.released |= *n == 0;
        }
    }

    /// True (once) when an object may have become unused since the last call.
    pub fn take_released(&mut self) -> bool {
        std::mem::take(&mut self.released)
    }

    /// Our objects no believed route uses, to delete.
    pub fn unused(&self) -> Vec<(NexthopKey, u32)> {
        self.by_key
            .iter()
            .filter(|(_, id)| self.refs.get(id).copied().unwrap_or(0) == 0)
            .map(|(k, id)| (*k, *id))
            .collect()
    }

    /// How many objects we have.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// True when we have none.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u32 = 0x4643_0000;

    fn key(last: u8) -> NexthopKey {
        NexthopKey {
            via: IpAddr::from([10, 200, 0, last]),
            oif: 7,
            onlink: true,
            protocol: 80,
        }
    }

    #[test]
    fn a_request_body_reads_back_as_its_key() {
        let mut dumped = new_body(F + 3, &key(9));
        // The kernel's answer is the request's body.
        let n = parse(&dumped).expect("parses");
        assert_eq!(n.id, F + 3);
        assert_eq!(n.key, Some(key(9)));
        dumped.truncate(4);
        assert_eq!(parse(&dumped), None);
        let v6 = NexthopKey {
            via: "fd00::1".parse().expect("v6"),
            onlink: false,
            ..key(1)
        };
        assert_eq!(parse(&new_body(5, &v6)).and_then(|n| n.key), Some(v6));
    }

    #[test]
    fn ids_avoid_every_taken_id_and_unused_objects_are_found() {
        let mut n = Nexthops::new(IpFamily::V4);
        n.reset([(key(1), F + 5), (key(1), F + 2)], &[3, F + 2, F + 5]);
        assert_eq!(n.id(&key(1)), Some(F + 2));
        let fresh = n.allocate(key(2));
        assert_eq!(fresh, F + 6);
        n.hold(fresh);
        assert_eq!(n.unused(), vec![(key(1), F + 2)]);
        n.release(fresh);
        assert_eq!(n.unused().len(), 2);
        n.forget(&key(2));
        assert_eq!(n.id(&key(2)), None);
        assert_eq!(
            n.allocate(key(3)),
            F + 7,
            "a forgotten id is not given out again"
        );
    }

    #[test]
    fn at_the_top_of_the_range_the_lowest_free_id_is_taken() {
        let mut n = Nexthops::new(IpFamily::V4);
        let top = *id_range(IpFamily::V4).end();
        n.reset([], &[top, F]);
        assert_eq!(n.allocate(key(1)), F + 1);
        assert!(!n.in_range(*id_range(IpFamily::V6).start()));
    }
}
