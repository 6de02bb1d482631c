//! Names (§5): the layer prefix that folds raw/mangle/filter/nat into one table,
//! endpoint/policy/profile chain names, IP-set names, and the `cali:<hash>;` rule identity
//! comments of §5.4.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha224, Sha256};

use felix_api::types::PolicyId;
use nf_tables::build::{BuiltRule, TextChain};
use nf_tables::model::{BaseChain, Chain, Family, Rule};

/// The longest table, chain or set name the kernel takes: `NFT_NAME_MAXLEN` (256) counts the
/// terminating NUL, and the attribute policy allows 255 bytes before it.
pub const MAX_NAME_LEN: usize = 255;
/// nft's comment limit (§5.4, §12).
pub const MAX_COMMENT_LEN: usize = 128;
/// The iptables table a chain belongs to in Felix, kept as a name prefix (§6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    Raw,
    Mangle,
    Filter,
    Nat,
}

impl Layer {
    /// `raw`, `mangle`, `filter`, `nat`.
    pub const fn prefix(self) -> &'static str {
        match self {
            Layer::Raw => "raw",
            Layer::Mangle => "mangle",
            Layer::Filter => "filter",
            Layer::Nat => "nat",
        }
    }

    /// `<layer>-<logical>`: `filter-cali-FORWARD`.
    pub fn chain(self, logical: &str) -> String {
        format!("{}-{logical}", self.prefix())
    }
}

/// Logical (un-prefixed) names of the static chains (§5.1).
pub mod logical {
    pub const INPUT: &str = "cali-INPUT";
    pub const FORWARD: &str = "cali-FORWARD";
    pub const OUTPUT: &str = "cali-OUTPUT";
    pub const PREROUTING: &str = "cali-PREROUTING";
    pub const POSTROUTING: &str = "cali-POSTROUTING";
    pub const FAILSAFE_IN: &str = "cali-failsafe-in";
    pub const FAILSAFE_OUT: &str = "cali-failsafe-out";
    pub const WL_TO_HOST: &str = "cali-wl-to-host";
    pub const FROM_WL_DISPATCH: &str = "cali-from-wl-dispatch";
    pub const TO_WL_DISPATCH: &str = "cali-to-wl-dispatch";
    pub const FROM_HOST_ENDPOINT: &str = "cali-from-host-endpoint";
    pub const TO_HOST_ENDPOINT: &str = "cali-to-host-endpoint";
    pub const FROM_HEP_FORWARD: &str = "cali-from-hep-forward";
    pub const TO_HEP_FORWARD: &str = "cali-to-hep-forward";
    pub const RPF_SKIP: &str = "cali-rpf-skip";
    pub const WIREGUARD_INCOMING_MARK: &str = "cali-wireguard-incoming-mark";
    pub const NAT_OUTGOING: &str = "cali-nat-outgoing";
    pub const FIP_DNAT: &str = "cali-fip-dnat";
    pub const FIP_SNAT: &str = "cali-fip-snat";
    pub const CIDR_BLOCK: &str = "cali-cidr-block";
}

/// Stand-in for `*` (the all-interfaces host endpoint) in chain names: nft cannot parse `*`
/// in a jump target, and a name longer than IFNAMSIZ cannot collide with a real interface.
pub const ALL_INTERFACES: &str = "all-host-interfaces";

/// Whether a byte may appear in a name as it is: what Kubernetes and Calico names are made of,
/// and what `nft` can print and parse back. Anything else (NUL, control characters, spaces,
/// quotes, non-ASCII) makes the name hashed.
fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'_' | b'.' | b'/' | b':' | b'@' | b'+' | b'=' | b'~' | b',' | b'%'
        )
}

/// `prefix` followed by `_` and base64url(SHA-256(`input`)): 44 bytes after the prefix.
fn hashed_name(prefix: &str, input: &[u8]) -> String {
    let mut out = String::with_capacity(prefix.len() + 44);
    out.push_str(prefix);
    out.push('_');
    URL_SAFE_NO_PAD.encode_string(Sha256::digest(input), &mut out);
    out
}

/// Felix's length-limited ID rule (§5.2), made total: `prefix + suffix` when the suffix is
/// plain (only [`name_byte`]s, not starting with `_`) and the name fits the kernel's limit;
/// otherwise `prefix + "_" + base64url(SHA-256(suffix))`.
///
/// Injective over suffixes: a verbatim name never has `_` right after its prefix and a hashed
/// one always has, and two suffixes share a hash only if SHA-256 collides. Every prefix used
/// with it ends in `-` and none is a prefix of another, so names of different kinds never meet.
pub fn limited_name(prefix: &str, suffix: &str) -> String {
    if is_plain(suffix) && prefix.len() + suffix.len() <= MAX_NAME_LEN {
        return format!("{prefix}{suffix}");
    }
    hashed_name(prefix, suffix.as_bytes())
}

/// A suffix that may stand verbatim in a name (see [`limited_name`]).
fn is_plain(suffix: &str) -> bool {
    !suffix.is_empty() && !suffix.starts_with('_') && suffix.bytes().all(name_byte)
}

fn iface_suffix(iface: &str) -> &str {
    if iface == "*" {
        ALL_INTERFACES
    } else {
        iface
    }
}

/// Per-endpoint chain kinds (§5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointChain {
    /// `cali-tw-`: to workload (ingress policy).
    ToWorkload,
    /// `cali-fw-`: from workload (egress policy).
    FromWorkload,
    /// `cali-th-`: to host endpoint (egress policy).
    ToHost,
    /// `cali-fh-`: from host endpoint (ingress policy).
    FromHost,
    /// `cali-thfw-`: apply-on-forward egress.
    ToHostForward,
    /// `cali-fhfw-`: apply-on-forward ingress.
    FromHostForward,
}

impl EndpointChain {
    const fn logical_prefix(self) -> &'static str {
        match self {
            EndpointChain::ToWorkload => "cali-tw-",
            EndpointChain::FromWorkload => "cali-fw-",
            EndpointChain::ToHost => "cali-th-",
            EndpointChain::FromHost => "cali-fh-",
            EndpointChain::ToHostForward => "cali-thfw-",
            EndpointChain::FromHostForward => "cali-fhfw-",
        }
    }
}

/// `<layer>-cali-tw-<iface>` and friends.
pub fn endpoint_chain(layer: Layer, kind: EndpointChain, iface: &str) -> String {
    limited_name(&layer.chain(kind.logical_prefix()), iface_suffix(iface))
}

/// `<layer>-cali-tw-s.<hash>` and friends: an endpoint chain shared by every interface whose
/// chain has this body, named by `digest` (of what makes the body). The suffix is 24
/// characters, longer than any interface name (15), so it never meets a per-interface chain's
/// name.
pub fn shared_endpoint_chain(layer: Layer, kind: EndpointChain, digest: &[u8]) -> String {
    let mut name = layer.chain(kind.logical_prefix());
    name.push_str("s.");
    URL_SAFE_NO_PAD.encode_string(&digest[..digest.len().min(16)], &mut name);
    name
}

/// Policy direction: inbound (`pi`/`pri`) or outbound (`po`/`pro`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Towards the endpoint (ingress policy).
    Inbound,
    /// From the endpoint (egress policy).
    Outbound,
}

impl Direction {
    /// `ingress` / `egress`, as chain comments say it.
    pub const fn word(self) -> &'static str {
        match self {
            Direction::Inbound => "ingress",
            Direction::Outbound => "egress",
        }
    }
}

/// A set of directions, as two bits: the directions in which an endpoint references a policy
/// or profile (a `BTreeSet<Direction>` was an allocation per reference).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dirs(u8);

impl Dirs {
    const ALL: [Direction; 2] = [Direction::Inbound, Direction::Outbound];

    fn bit(d: Direction) -> u8 {
        match d {
            Direction::Inbound => 1,
            Direction::Outbound => 2,
        }
    }

    pub fn insert(&mut self, d: Direction) {
        self.0 |= Dirs::bit(d);
    }

    pub fn contains(self, d: Direction) -> bool {
        self.0 & Dirs::bit(d) != 0
    }

    /// The directions in the set, inbound first.
    pub fn iter(self) -> impl Iterator<Item = Direction> {
        Dirs::ALL.into_iter().filter(move |d| self.contains(*d))
    }
}

/// The short name of a policy kind Felix sends (§5.2), `None` for a kind it does not.
pub fn known_kind_short(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "GlobalNetworkPolicy" => "gnp",
        "NetworkPolicy" => "np",
        "KubernetesNetworkPolicy" => "knp",
        "KubernetesClusterNetworkPolicy" => "kcnp",
        "StagedNetworkPolicy" => "snp",
        "StagedGlobalNetworkPolicy" => "sgnp",
        "StagedKubernetesNetworkPolicy" => "sknp",
        _ => return None,
    })
}

/// Felix's short policy kind (§5.2): `gnp`, `np`, `knp`, `kcnp`, `snp`, `sgnp`, `sknp`; for
/// display (comments, log prefixes) any other kind in lower case.
pub fn kind_short(id: &PolicyId) -> String {
    match (known_kind_short(&id.kind), id.kind.as_str()) {
        (Some(k), _) => k.into(),
        (None, "") if id.namespace.is_empty() => "gnp".into(),
        (None, "") => "np".into(),
        (None, other) => other.to_ascii_lowercase(),
    }
}

/// The same policy named the way Felix names it now, when `id` uses an older spelling of its
/// kind: none (a global policy without a namespace, a namespaced one with), or the
/// `ClusterNetworkPolicy` alias. The model keeps policies under this form, so that two
/// spellings of one policy are one policy and program one chain.
pub fn canonical_policy_id(id: &PolicyId) -> Option<PolicyId> {
    let kind = match id.kind.as_str() {
        "" if id.namespace.is_empty() => "GlobalNetworkPolicy",
        "" => "NetworkPolicy",
        "ClusterNetworkPolicy" => "KubernetesClusterNetworkPolicy",
        _ => return None,
    };
    Some(PolicyId {
        kind: kind.to_string(),
        ..id.clone()
    })
}

/// Staged policies are never programmed (§8.1).
pub fn is_staged(id: &PolicyId) -> bool {
    id.kind.starts_with("Staged") || id.name.starts_with("staged:")
}

/// `<kindShort>/<name>` or `<kindShort>/<namespace>/<name>`.
pub fn policy_suffix(id: &PolicyId) -> String {
    if id.namespace.is_empty() {
        format!("{}/{}", kind_short(id), id.name)
    } else {
        format!("{}/{}/{}", kind_short(id), id.namespace, id.name)
    }
}

/// `<layer>-cali-pi-<suffix>` / `<layer>-cali-po-<suffix>`.
///
/// The suffix names the policy unambiguously only when its kind is one Felix sends (or none)
/// and neither namespace nor name holds a `/`; any other id is hashed whole, its fields
/// length-prefixed and the input marked with a NUL (which no plain suffix holds), so that no
/// two ids share a chain.
pub fn policy_chain(layer: Layer, dir: Direction, id: &PolicyId) -> String {
    let p = match dir {
        Direction::Inbound => "cali-pi-",
        Direction::Outbound => "cali-po-",
    };
    let prefix = layer.chain(p);
    let unambiguous = (id.kind.is_empty() || known_kind_short(&id.kind).is_some())
        && !id.namespace.contains('/')
        && !id.name.contains('/');
    if unambiguous {
        return limited_name(&prefix, &policy_suffix(id));
    }
    let mut input = vec![0u8];
    for field in [&id.kind, &id.namespace, &id.name] {
        input.extend_from_slice(&(field.len() as u64).to_be_bytes());
        input.extend_from_slice(field.as_bytes());
    }
    hashed_name(&prefix, &input)
}

/// `<layer>-cali-pri-<name>` / `<layer>-cali-pro-<name>`.
pub fn profile_chain(layer: Layer, dir: Direction, name: &str) -> String {
    let p = match dir {
        Direction::Inbound => "cali-pri-",
        Direction::Outbound => "cali-pro-",
    };
    limited_name(&layer.chain(p), name)
}

/// nftables-legal form of a Felix name: `:` becomes `-` (§5.3).
pub fn legalise(name: &str) -> String {
    name.replace(':', "-")
}

fn family_digit(family: Family) -> char {
    if family == Family::Ip6 {
        '6'
    } else {
        '4'
    }
}

/// The set name of a Felix IP set ID in a family's table: `cali40` (`cali60` for IPv6) and the
/// ID, legalised, when it has one of the shapes Felix's IDs have — `s:AbCd…`, `n:…`, `svc:…`
/// (becoming `cali40s-AbCd…`, `cali40svc-…`) or a plain word like `all-hosts-net` — and
/// otherwise `cali40_` and the base64url SHA-256 of the ID.
///
/// Felix cuts its names to ipset's 31 characters; nf_tables sets have no such limit, and a cut
/// makes two IDs with a long common prefix one set (a policy leak), so nothing is cut here. The
/// mapping is injective: a `x:` or `svc:` ID becomes `x-…` or `svc-…`, a plain word never
/// starts that way, so the two shapes never meet, and hashed names alone have `_` after the
/// family digits.
pub fn ipset_name(family: Family, id: &str) -> String {
    let prefix = format!("cali{}0", family_digit(family));
    let b = id.as_bytes();
    let tail = |t: &[u8]| {
        !t.is_empty()
            && t.iter()
                .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
    };
    // Felix's typed IDs: one lowercase letter (`s:` selectors, `n:` named ports) or `svc:`
    // (services), a colon, a legal tail.
    let typed = |sep: u8| match b {
        [c, x, rest @ ..] if c.is_ascii_lowercase() && *x == sep => Some(rest),
        [b's', b'v', b'c', x, rest @ ..] if *x == sep => Some(rest),
        _ => None,
    };
    let felix_id = typed(b':').is_some_and(tail);
    let word = !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && typed(b'-').is_none()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if (felix_id || word) && prefix.len() + id.len() <= MAX_NAME_LEN {
        return legalise(&format!("{prefix}{id}"));
    }
    hashed_name(&prefix, id.as_bytes())
}

/// Name of a content-addressed set of ours (CIDR or port lists shared by every rule that uses
/// the same list): `cali4n-<hash>` (nets), `cali4p-<hash>` (ports). The `n`/`p` in the place
/// of Felix's `0`/`t` keeps them apart from Felix-named sets.
pub fn shared_set_name(family: Family, kind: char, canonical: &str) -> String {
    let hash = URL_SAFE_NO_PAD.encode(Sha224::digest(canonical.as_bytes()));
    format!("cali{}{kind}-{}", family_digit(family), &hash[..20])
}

/// Escapes a human comment: any char outside `[A-Za-z0-9_ @%+=:,./-]` becomes `_` (§5.4).
pub fn escape_comment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_escaped(&mut out, s);
    out
}

fn escape_char(c: char) -> char {
    if u8::try_from(c).is_ok_and(comment_byte) {
        c
    } else {
        '_'
    }
}

/// Whether an ASCII byte stays as it is in a comment.
fn comment_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b' ' | b'_' | b'@' | b'%' | b'+' | b'=' | b':' | b',' | b'.' | b'/' | b'-'
        )
}

/// Appends `s` escaped as [`escape_comment`] does: copied whole when nothing needs escaping,
/// as for nearly every comment (a full load writes one per rule).
fn push_escaped(out: &mut String, s: &str) {
    if s.bytes().all(comment_byte) {
        out.push_str(s);
    } else {
        out.extend(s.chars().map(escape_char));
    }
}

/// The length of a rule comment's identity prefix, `cali:<16 characters>;`.
const ID_COMMENT_LEN: usize = 22;

/// hᵢ = SHA-224(hᵢ₋₁ ‖ rule text).
fn next_rule_hash(hash: &mut [u8; 28], text: &str) {
    let mut h = Sha224::new();
    h.update(*hash);
    h.update(text.as_bytes());
    *hash = h.finalize().into();
}

/// `cali:<id>;` for rule hash `hash`, in a string of capacity `capacity`. The first 16
/// characters of the hash's base64 are those of its first 12 bytes.
fn id_comment(hash: &[u8; 28], capacity: usize) -> String {
    let mut comment = String::with_capacity(capacity);
    comment.push_str("cali:");
    URL_SAFE_NO_PAD.encode_string(&hash[..12], &mut comment);
    comment.push(';');
    comment
}

/// The chain [`ChainBuilder`] makes from `template`'s rules under the name `name`: the same
/// expressions (shared, not copied) and human comments, with the rule ids chained from `name`.
/// `template` must come from [`ChainBuilder::new`] and [`ChainBuilder::push`] alone (no
/// [`ChainBuilder::start_appends`]). Endpoint chains repeat a few bodies under thousands of
/// names: this re-hashes a body instead of rendering it again.
pub fn rename_chain(template: &TextChain, name: &str) -> Chain {
    let mut hash: [u8; 28] = Sha224::digest(name.as_bytes()).into();
    let rules = template
        .chain
        .rules
        .iter()
        .zip(&template.texts)
        .map(|(r, text)| {
            next_rule_hash(&mut hash, text);
            let human = r
                .comment
                .as_deref()
                .and_then(|c| c.get(ID_COMMENT_LEN..))
                .unwrap_or("");
            let mut comment = id_comment(&hash, ID_COMMENT_LEN + human.len());
            comment.push_str(human);
            Rule {
                exprs: r.exprs.clone(),
                comment: Some(comment),
                handle: None,
            }
        })
        .collect();
    Chain {
        name: name.to_string(),
        base: template.chain.base.clone(),
        rules,
    }
}

/// Builds one chain while computing Felix's rule identity hashes (§5.4):
/// h0 = SHA-224(chain name), hᵢ = SHA-224(hᵢ₋₁ ‖ rule text), id = base64url(hᵢ)[..16]; the
/// rule's userdata comment is `cali:<id>;` followed by the escaped human comments.
#[derive(Clone, Debug)]
pub struct ChainBuilder {
    hash: [u8; 28],
    /// The hash before the last rule's: its id is computed again when that rule changes.
    prev: [u8; 28],
    out: TextChain,
}

impl ChainBuilder {
    /// A regular chain.
    pub fn new(name: &str) -> ChainBuilder {
        let hash = Sha224::digest(name.as_bytes()).into();
        ChainBuilder {
            hash,
            prev: hash,
            out: TextChain::new(name),
        }
    }

    /// A base chain.
    pub fn base(name: &str, base: BaseChain) -> ChainBuilder {
        let mut b = ChainBuilder::new(name);
        b.out.chain.base = Some(base);
        b
    }

    /// From here on, rules are hashed as Felix hashes rules *appended* to a base chain: a
    /// fresh hash chain under `<name>*appends*`.
    pub fn start_appends(&mut self) {
        let name = format!("{}*appends*", self.out.chain.name);
        self.hash = Sha224::digest(name.as_bytes()).into();
    }

    /// The chain's name.
    pub fn name(&self) -> &str {
        &self.out.chain.name
    }

    /// Rules so far.
    pub fn len(&self) -> usize {
        self.out.chain.rules.len()
    }

    /// No rule yet.
    pub fn is_empty(&self) -> bool {
        self.out.chain.rules.is_empty()
    }

    /// Appends a rule with its human comments.
    pub fn push(&mut self, rule: BuiltRule, comments: &[&str]) {
        self.prev = self.hash;
        next_rule_hash(&mut self.hash, &rule.text);
        // Every rule of a full load comes through here: the comment is written in place.
        // Sized up front (escaping never lengthens a comment), so no spare capacity stays with
        // every rule of the desired state.
        let human: usize = comments.iter().map(|c| c.len() + 1).sum();
        let mut comment = id_comment(&self.hash, (ID_COMMENT_LEN + human).min(MAX_COMMENT_LEN));
        for c in comments.iter().filter(|c| !c.is_empty()) {
            comment.push(' ');
            push_escaped(&mut comment, c);
        }
        comment.truncate(MAX_COMMENT_LEN);
        self.out.push(rule, Some(comment));
    }

    /// Drops the final `return` of the last rule (redundant at the end of a chain, §9.4); the
    /// rule keeps its matches and the mark it sets. Returns whether a `return` was dropped.
    pub fn elide_trailing_return(&mut self) -> bool {
        use nf_tables::model::{Expr, Verdict};
        let Some(rule) = self.out.chain.rules.last_mut() else {
            return false;
        };
        let Some((Expr::Verdict(Verdict::Return), rest)) = rule.exprs.split_last() else {
            return false;
        };
        rule.exprs = rest.to_vec().into();
        if let Some(text) = self.out.texts.last_mut() {
            let kept = text.strip_suffix("return").unwrap_or(text).trim_end().len();
            text.truncate(kept);
            // The id is that of the rule as it now reads.
            self.hash = self.prev;
            next_rule_hash(&mut self.hash, text);
            if let Some(comment) = rule.comment.as_mut() {
                let id = id_comment(&self.hash, ID_COMMENT_LEN);
                comment.replace_range(..ID_COMMENT_LEN.min(comment.len()), &id);
            }
        }
        true
    }

    /// The finished chain.
    pub fn finish(self) -> TextChain {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nf_tables::build::RuleBuilder;

    #[test]
    fn comments_keep_only_felix_characters() {
        assert_eq!(
            escape_comment("Policy ns/a.b-c_d @x%y+z=1:2,3"),
            "Policy ns/a.b-c_d @x%y+z=1:2,3"
        );
        assert_eq!(escape_comment("größe <x>\t\"q\";"), "gr__e _x___q__");
        assert_eq!(escape_comment(""), "");
    }

    #[test]
    fn set_names_follow_felix() {
        // Felix's IDs keep their shape (legalised) and are not cut.
        assert_eq!(
            ipset_name(Family::Ip, "s:AbCdEfGhIjKlMnOpQrStUvWxYz0123456789ab"),
            "cali40s-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789ab"
        );
        assert_eq!(ipset_name(Family::Ip, "n:a-b_c"), "cali40n-a-b_c");
        assert_eq!(ipset_name(Family::Ip, "svc:Ab-c"), "cali40svc-Ab-c");
        // Anything else is hashed: it could otherwise meet another ID's name.
        assert!(ipset_name(Family::Ip, "s-abc").starts_with("cali40_"));
        assert!(ipset_name(Family::Ip, "svc-abc").starts_with("cali40_"));
        assert!(ipset_name(Family::Ip, "ab:c").starts_with("cali40_"));
        assert!(ipset_name(Family::Ip, "a b").starts_with("cali40_"));
        assert_ne!(
            ipset_name(Family::Ip, "s-abc"),
            ipset_name(Family::Ip, "s:abc")
        );
        assert_eq!(
            ipset_name(Family::Ip6, "all-hosts-net"),
            "cali60all-hosts-net"
        );
    }

    #[test]
    fn policy_names() {
        let id = PolicyId {
            name: "allow-web".into(),
            namespace: "default".into(),
            kind: "KubernetesNetworkPolicy".into(),
        };
        assert_eq!(
            policy_chain(Layer::Filter, Direction::Inbound, &id),
            "filter-cali-pi-knp/default/allow-web"
        );
        let long = "x".repeat(300);
        let n = limited_name("filter-cali-tw-", &long);
        assert!(n.len() <= MAX_NAME_LEN);
        assert!(n.starts_with("filter-cali-tw-_"));
    }

    #[test]
    fn hashes_depend_on_chain_position_and_predecessors() {
        let rule = || RuleBuilder::new(Family::Ip).accept().build();
        let mut a = ChainBuilder::new("a");
        a.push(rule(), &[]);
        a.push(rule(), &["hello world!"]);
        let mut b = ChainBuilder::new("b");
        b.push(rule(), &[]);
        let a = a.finish();
        let b = b.finish();
        let ca = a.chain.rules[0].comment.clone().unwrap();
        let ca2 = a.chain.rules[1].comment.clone().unwrap();
        let cb = b.chain.rules[0].comment.clone().unwrap();
        assert_ne!(ca, cb);
        assert_ne!(ca[..22], ca2[..22]);
        assert!(ca2.ends_with("; hello world_"), "{ca2}");
        assert_eq!(ca.len(), "cali:".len() + 16 + 1);
    }

    #[test]
    fn odd_policy_ids_are_hashed_apart() {
        let id = |kind: &str, ns: &str, name: &str| PolicyId {
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
        };
        let n = |i: &PolicyId| policy_chain(Layer::Filter, Direction::Inbound, i);
        // A `/` inside a field would otherwise make two ids one suffix.
        let a = id("GlobalNetworkPolicy", "a", "b");
        let b = id("GlobalNetworkPolicy", "", "a/b");
        assert_eq!(n(&a), "filter-cali-pi-gnp/a/b");
        assert_ne!(n(&a), n(&b));
        assert!(n(&b).starts_with("filter-cali-pi-_"), "{}", n(&b));
        // Kinds Felix does not send are hashed whole, not lower-cased into a known one.
        assert_ne!(
            n(&id("Gnp", "", "x")),
            n(&id("GlobalNetworkPolicy", "", "x"))
        );
        // A NUL never reaches the kernel, and a name never passes its limit.
        let nul = id("", "", "a\0b");
        assert!(!n(&nul).contains('\0'));
        assert!(n(&id("", "", &"p".repeat(300))).len() <= MAX_NAME_LEN);
        assert_eq!(
            limited_name("filter-cali-pri-", &"x".repeat(239)).len(),
            MAX_NAME_LEN
        );
        assert!(limited_name("filter-cali-pri-", &"x".repeat(240)).starts_with("filter-cali-pri-_"));
    }

    #[test]
    fn older_spellings_of_a_kind_are_one_policy() {
        let id = |kind: &str, ns: &str| PolicyId {
            kind: kind.into(),
            namespace: ns.into(),
            name: "p".into(),
        };
        assert_eq!(
            canonical_policy_id(&id("", "")),
            Some(id("GlobalNetworkPolicy", ""))
        );
        assert_eq!(
            canonical_policy_id(&id("", "ns")),
            Some(id("NetworkPolicy", "ns"))
        );
        assert_eq!(
            canonical_policy_id(&id("ClusterNetworkPolicy", "")),
            Some(id("KubernetesClusterNetworkPolicy", ""))
        );
        assert_eq!(canonical_policy_id(&id("NetworkPolicy", "ns")), None);
        // The canonical form names the same chain the old spelling did.
        for old in [id("", ""), id("", "ns")] {
            let new = canonical_policy_id(&old).unwrap_or_else(|| old.clone());
            assert_eq!(
                policy_chain(Layer::Filter, Direction::Outbound, &old),
                policy_chain(Layer::Filter, Direction::Outbound, &new)
            );
        }
    }
}
