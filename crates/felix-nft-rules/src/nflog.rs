//! Flow logs' NFLOG prefixes, as Felix writes them: which rule of which policy or profile, or
//! which tier's end, decided a packet, in a string Felix's collector (and ours) maps back to
//! the policy trace. Pure: the renderer puts them in `log group` statements; [`parse`] reads
//! them back from logged packets.
//!
//! - A rule: action (`A`llow, `D`eny, `P`ass), owner (`P`olicy, p`R`ofile), direction
//!   (`I`ngress, `E`gress), the rule's index in its direction, `|`, then the policy's id
//!   (`<kind>/<namespace>/<name>` or `<kind>/<name>`, the kind short: `np`, `gnp`, …) or the
//!   profile's name: `API0|np/default/allow-web`.
//! - A tier's end: `D` (or `P` when the tier passes by default), `P`, the direction, `|`, the
//!   tier: `DPI|default`. No profile matched: `DRI` / `DRE`.
//! - At most 63 bytes (the kernel keeps 64 with the NUL). A prefix of 63 bytes or more keeps its
//!   first and last 10 bytes around `_` and 41 characters of the SHA-256 of the whole prefix
//!   (base64url), so a hashed prefix can never equal an unhashed one.

use base64::Engine;
use sha2::{Digest, Sha256};

use crate::names::{kind_short, Direction};
use felix_api::types::PolicyId;

/// The NFLOG group of packets entering an endpoint (its ingress policy).
pub const GROUP_INGRESS: u16 = 1;
/// The NFLOG group of packets leaving an endpoint (its egress policy).
pub const GROUP_EGRESS: u16 = 2;
/// Bytes of each packet copied to the reader: the headers (Felix's `snaplen 80`).
pub const SNAPLEN: u32 = 80;

/// Longest prefix kept whole; longer ones (and one this long) are hashed.
const MAX_LEN: usize = 63;
/// Bytes of a hashed prefix kept from its start and from its end.
const KEEP: usize = 10;
/// Characters of the hash in a hashed prefix.
const HASH_LEN: usize = MAX_LEN - 2 * KEEP - 2;

/// What a logged rule did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
    Pass,
}

impl Action {
    fn code(self) -> char {
        match self {
            Action::Allow => 'A',
            Action::Deny => 'D',
            Action::Pass => 'P',
        }
    }

    /// The action of a policy rule's `action` field (`""` is allow, `next-tier` is pass);
    /// `None` for `log` and anything unknown.
    pub fn of_rule(action: &str) -> Option<Action> {
        match action.to_ascii_lowercase().as_str() {
            "" | "allow" => Some(Action::Allow),
            "deny" => Some(Action::Deny),
            "pass" | "next-tier" => Some(Action::Pass),
            _ => None,
        }
    }
}

/// Whose rule it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    Policy,
    Profile,
}

impl Owner {
    fn code(self) -> char {
        match self {
            Owner::Policy => 'P',
            Owner::Profile => 'R',
        }
    }
}

fn dir_code(dir: Direction) -> char {
    match dir {
        Direction::Inbound => 'I',
        Direction::Outbound => 'E',
    }
}

/// The NFLOG group of a direction.
pub fn group(dir: Direction) -> u16 {
    match dir {
        Direction::Inbound => GROUP_INGRESS,
        Direction::Outbound => GROUP_EGRESS,
    }
}

/// A policy's id in prefixes: `<kind>/<namespace>/<name>`, or `<kind>/<name>` without a
/// namespace, the kind short.
pub fn policy_id(id: &PolicyId) -> String {
    if id.namespace.is_empty() {
        format!("{}/{}", kind_short(id), id.name)
    } else {
        format!("{}/{}/{}", kind_short(id), id.namespace, id.name)
    }
}

/// The prefix of rule `idx` (from 0, in its direction) of a policy (`id` from [`policy_id`])
/// or a profile (`id` its name).
pub fn rule_prefix(action: Action, owner: Owner, dir: Direction, idx: usize, id: &str) -> String {
    limit(whole_rule_prefix(action, owner, dir, idx, id))
}

/// [`rule_prefix`] before it is cut to the kernel's 63 bytes: what a hashed prefix stands for.
pub fn whole_rule_prefix(
    action: Action,
    owner: Owner,
    dir: Direction,
    idx: usize,
    id: &str,
) -> String {
    format!(
        "{}{}{}{idx}|{id}",
        action.code(),
        owner.code(),
        dir_code(dir)
    )
}

/// The prefix of a tier's end: `Deny` where the tier drops what no policy passed, `Pass`
/// where it passes it on.
pub fn end_of_tier(action: Action, dir: Direction, tier: &str) -> String {
    limit(whole_end_of_tier(action, dir, tier))
}

/// [`end_of_tier`] before it is cut to the kernel's 63 bytes.
pub fn whole_end_of_tier(action: Action, dir: Direction, tier: &str) -> String {
    format!("{}P{}|{tier}", action.code(), dir_code(dir))
}

/// The prefix the kernel is given for a whole one: itself when it fits, else hashed as
/// Felix hashes it ([`is_hashed`]).
pub fn cut(whole: &str) -> String {
    limit(whole.to_string())
}

/// The prefix of the drop after the profiles, when none matched.
pub fn no_profile_matched(dir: Direction) -> String {
    format!("DR{}", dir_code(dir))
}

/// What a prefix says: the rule, tier end or profile drop that logged the packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hit {
    /// Rule `idx` of a policy (`id` as [`policy_id`] writes it) or a profile (its name).
    Rule {
        action: Action,
        owner: Owner,
        dir: Direction,
        idx: usize,
        id: String,
    },
    /// The end of `tier`: a drop, or a pass on to the next tier.
    TierEnd {
        action: Action,
        dir: Direction,
        tier: String,
    },
    /// No profile matched: a drop.
    NoProfile { dir: Direction },
}

/// Whether `prefix` is one [`limit`] hashed: its meaning is found by computing the prefixes
/// of what is programmed, not by reading it.
pub fn is_hashed(prefix: &[u8]) -> bool {
    prefix.len() == MAX_LEN && prefix[KEEP] == b'_' && prefix[MAX_LEN - KEEP - 1] == b'_'
}

/// Reads a prefix this module writes; `None` for a hashed one ([`is_hashed`]) and for anything
/// else (another program's, or damaged): the caller counts those, it never trusts them.
pub fn parse(prefix: &[u8]) -> Option<Hit> {
    if is_hashed(prefix) {
        return None;
    }
    let s = std::str::from_utf8(prefix).ok()?;
    let mut chars = s.chars();
    let (a, o, d) = (chars.next()?, chars.next()?, chars.next()?);
    let action = match a {
        'A' => Action::Allow,
        'D' => Action::Deny,
        'P' => Action::Pass,
        _ => return None,
    };
    let owner = match o {
        'P' => Owner::Policy,
        'R' => Owner::Profile,
        _ => return None,
    };
    let dir = match d {
        'I' => Direction::Inbound,
        'E' => Direction::Outbound,
        _ => return None,
    };
    let rest = &s[3..];
    if rest.is_empty() {
        return (action == Action::Deny && owner == Owner::Profile)
            .then_some(Hit::NoProfile { dir });
    }
    let (idx, name) = rest.split_once('|')?;
    if name.is_empty() {
        return None;
    }
    if idx.is_empty() {
        return (owner == Owner::Policy && action != Action::Allow).then(|| Hit::TierEnd {
            action,
            dir,
            tier: name.to_string(),
        });
    }
    if !idx.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Hit::Rule {
        action,
        owner,
        dir,
        idx: idx.parse().ok()?,
        id: name.to_string(),
    })
}

/// `prefix` whole when shorter than 63 bytes, else hashed to 63.
fn limit(prefix: String) -> String {
    if prefix.len() < MAX_LEN {
        return prefix;
    }
    let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(&prefix));
    let bytes = prefix.as_bytes();
    let mut out = Vec::with_capacity(MAX_LEN);
    out.extend_from_slice(&bytes[..KEEP]);
    out.push(b'_');
    out.extend_from_slice(&hash.as_bytes()[..HASH_LEN]);
    out.push(b'_');
    out.extend_from_slice(&bytes[bytes.len() - KEEP..]);
    // Cutting a multi-byte character at either end leaves bytes that are not UTF-8; they
    // become U+FFFD, which changes the prefix only for names Kubernetes does not allow.
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pol(name: &str, namespace: &str, kind: &str) -> String {
        policy_id(&PolicyId {
            name: name.into(),
            namespace: namespace.into(),
            kind: kind.into(),
        })
    }

    /// Felix's own cases (`felix/rules/nflogprefix_test.go`), byte for byte.
    #[test]
    fn prefixes_are_felix_s() {
        use Direction::{Inbound as I, Outbound as E};
        let chars62 = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let chars63 = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0";
        let gnp = |n: &str| pol(n, "", "GlobalNetworkPolicy");
        let cases = [
            (
                rule_prefix(
                    Action::Allow,
                    Owner::Policy,
                    I,
                    0,
                    &pol("default.policy", "namespace1", "NetworkPolicy"),
                ),
                "API0|np/namespace1/default.policy".to_string(),
            ),
            (
                rule_prefix(Action::Pass, Owner::Profile, E, 999, "short.profile.name"),
                "PRE999|short.profile.name".into(),
            ),
            (
                rule_prefix(Action::Deny, Owner::Policy, E, 88, &gnp(chars62)),
                format!("DPE88|gnp/{chars62}"),
            ),
            (
                rule_prefix(Action::Deny, Owner::Policy, I, 88, &gnp(chars63)),
                "DPI88|gnp/_12IXaBPahNM7a7dZhI8zg6PStmHsgneYaax8LVSIq_RSTUVWXYZ0".into(),
            ),
            (
                rule_prefix(
                    Action::Deny,
                    Owner::Policy,
                    E,
                    1,
                    &gnp("this-is-still-quite-a-long-tier-name-even-though-its-not-required.quite-a-long-policy-name"),
                ),
                "DPE1|gnp/t_FSGxA9eGa6t_A5Rj2agPvl4aq8-eohq0An6xEW4n7_olicy-name".into(),
            ),
            (
                rule_prefix(
                    Action::Deny,
                    Owner::Policy,
                    E,
                    2,
                    &gnp("this-is-still-quite-a-long-tier-name-even-though-its-not-required.quite-a-long-policy-name2"),
                ),
                "DPE2|gnp/t_G4MaamO0BQNQg8Ibyy-r9qg2HIK8-7EaPOVzsy5Nv_licy-name2".into(),
            ),
            (end_of_tier(Action::Deny, E, "tier-1"), "DPE|tier-1".into()),
            (
                end_of_tier(
                    Action::Deny,
                    I,
                    "tier-01234567890123456789012345678901234567890123456789012",
                ),
                "DPI|tier-01234567890123456789012345678901234567890123456789012".into(),
            ),
            (
                end_of_tier(
                    Action::Deny,
                    I,
                    "tier-012345678901234567890123456789012345678901234567890123",
                ),
                "DPI|tier-0_phEfG4Vhbq2xh4TQsePNa2X9YRj5peCVw1FgaNSbd_4567890123".into(),
            ),
            (no_profile_matched(I), "DRI".into()),
            (no_profile_matched(E), "DRE".into()),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
            assert!(got.len() <= MAX_LEN, "{got}");
        }
        assert_eq!(end_of_tier(Action::Pass, I, "default"), "PPI|default");
        assert_eq!((group(I), group(E)), (1, 2));
    }

    /// What the writers write, the reader reads back; hashed prefixes and other programs'
    /// prefixes are not read.
    #[test]
    fn prefixes_read_back() {
        use Direction::{Inbound as I, Outbound as E};
        let rule = |action, owner, dir, idx, id: &str| Hit::Rule {
            action,
            owner,
            dir,
            idx,
            id: id.into(),
        };
        let cases = [
            (
                rule_prefix(Action::Allow, Owner::Policy, I, 0, "np/prod/web"),
                rule(Action::Allow, Owner::Policy, I, 0, "np/prod/web"),
            ),
            (
                rule_prefix(Action::Deny, Owner::Profile, E, 12, "kns.prod"),
                rule(Action::Deny, Owner::Profile, E, 12, "kns.prod"),
            ),
            (
                end_of_tier(Action::Pass, E, "security"),
                Hit::TierEnd {
                    action: Action::Pass,
                    dir: E,
                    tier: "security".into(),
                },
            ),
            (no_profile_matched(I), Hit::NoProfile { dir: I }),
        ];
        for (prefix, hit) in cases {
            assert_eq!(parse(prefix.as_bytes()), Some(hit), "{prefix}");
        }
        let long = rule_prefix(Action::Deny, Owner::Policy, I, 3, &"x".repeat(80));
        assert!(is_hashed(long.as_bytes()));
        assert_eq!(parse(long.as_bytes()), None);
        for foreign in [
            &b"calico-packet: "[..],
            b"",
            b"AP",
            b"XPI0|a",
            b"API|tier",
            b"APIx|a",
            b"API0|",
            b"DRIX",
            &[0xff, 0xfe, 0x00],
        ] {
            assert_eq!(parse(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn actions_of_rules() {
        assert_eq!(Action::of_rule(""), Some(Action::Allow));
        assert_eq!(Action::of_rule("Next-Tier"), Some(Action::Pass));
        assert_eq!(Action::of_rule("deny"), Some(Action::Deny));
        assert_eq!(Action::of_rule("log"), None);
    }
}
