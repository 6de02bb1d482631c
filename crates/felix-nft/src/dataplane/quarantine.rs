//! Quarantine: an update whose objects the kernel refuses is set aside, so that one bad input
//! cannot stop the programming of every other.
//!
//! Validation and the renderer keep what the kernel is given valid, so a refusal means a bug
//! or a kernel limit nobody foresaw. Then the loop finds the input at fault — the input that
//! rendered the object the kernel's error names, or, when it names none of ours, by bisecting
//! the inputs changed since the last good commit (half of them held back at their last good
//! version, commit, repeat) — and quarantines it: the model goes back to the input's last
//! good version (the one the kernel holds), or forgets it if it had none. A workload then
//! passes nothing (its interface is unknown to the dispatch maps), a policy or profile becomes
//! a chain that drops, both fail closed. Everything else is committed. The refused version is
//! kept and tried again when the next update for the same object arrives.
//!
//! To restore a last good version, [`Dataplane`] keeps an undo log of the objects changed
//! since the last commit that succeeded: the previous value of each (a clone, or nothing for
//! an object that did not exist), and for IP sets changed only by deltas the members added
//! and removed since, so that a member costs its own size and not the set's. The log is
//! cleared by [`Dataplane::tables_committed`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use felix_api::to_dataplane::Payload;
use felix_api::{
    ActivePolicyRemove, ActivePolicyUpdate, ActiveProfileRemove, ActiveProfileUpdate, HostEndpoint,
    HostEndpointId, HostEndpointRemove, HostEndpointUpdate, IpSetDeltaUpdate, IpSetRemove,
    IpSetUpdate, Policy, PolicyId, Profile, ProfileId, ToDataplane, WorkloadEndpoint,
    WorkloadEndpointId, WorkloadEndpointRemove, WorkloadEndpointUpdate,
};
use felix_nft_rules::incremental::Producer;
use felix_nft_rules::Members;
use nf_tables::error::Target;

use super::validate::policy_label;
use super::Dataplane;

/// One input object of the model.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjKey {
    IpSet(String),
    Policy(PolicyId),
    Profile(String),
    Workload(WorkloadEndpointId),
    HostEndpoint(HostEndpointId),
}

impl fmt::Display for ObjKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjKey::IpSet(id) => write!(f, "IP set {id:?}"),
            ObjKey::Policy(id) => write!(f, "policy {:?}", policy_label(id)),
            ObjKey::Profile(n) => write!(f, "profile {n:?}"),
            ObjKey::Workload(id) => write!(
                f,
                "workload endpoint {:?}",
                format!(
                    "{}/{}/{}",
                    id.orchestrator_id, id.workload_id, id.endpoint_id
                )
            ),
            ObjKey::HostEndpoint(id) => write!(f, "host endpoint {:?}", id.endpoint_id),
        }
    }
}

impl ObjKey {
    /// The object an update is about, for the objects the undo log keeps.
    pub fn of(p: &Payload) -> Option<ObjKey> {
        Some(match p {
            Payload::IpsetUpdate(u) => ObjKey::IpSet(u.id.clone()),
            Payload::IpsetDeltaUpdate(u) => ObjKey::IpSet(u.id.clone()),
            Payload::IpsetRemove(u) => ObjKey::IpSet(u.id.clone()),
            Payload::ActivePolicyUpdate(u) => ObjKey::Policy(u.id.clone()?),
            Payload::ActivePolicyRemove(u) => ObjKey::Policy(u.id.clone()?),
            Payload::ActiveProfileUpdate(u) => ObjKey::Profile(u.id.as_ref()?.name.clone()),
            Payload::ActiveProfileRemove(u) => ObjKey::Profile(u.id.as_ref()?.name.clone()),
            Payload::WorkloadEndpointUpdate(u) => ObjKey::Workload(u.id.clone()?),
            Payload::WorkloadEndpointRemove(u) => ObjKey::Workload(u.id.clone()?),
            Payload::HostEndpointUpdate(u) => ObjKey::HostEndpoint(u.id.clone()?),
            Payload::HostEndpointRemove(u) => ObjKey::HostEndpoint(u.id.clone()?),
            _ => return None,
        })
    }
}

/// A version of one object: what the model holds for it (`None`: nothing), or for an IP set
/// the members to add and remove to get from one version to another.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Version {
    IpSet(Option<Members>),
    IpSetDelta {
        added: BTreeSet<String>,
        removed: BTreeSet<String>,
    },
    Policy(Option<Policy>),
    Profile(Option<Profile>),
    Workload(Option<Box<WorkloadEndpoint>>),
    HostEndpoint(Option<Box<HostEndpoint>>),
}

/// What the undo log keeps for an object changed since the last good commit.
#[derive(Debug, Clone)]
enum Undo {
    /// Its value then.
    Was(Version),
    /// An IP set changed by deltas only: the members added and removed since (disjoint).
    Members {
        added: BTreeSet<String>,
        removed: BTreeSet<String>,
    },
}

/// An update the kernel refused, set aside.
#[derive(Debug, Clone)]
pub struct Quarantined {
    /// Why: the kernel's refusal, or how bisection found it.
    pub reason: String,
    /// The refused version, tried again when the object's next update arrives.
    pub(super) bad: Version,
}

impl Quarantined {
    /// The refused workload endpoint, when the object is one (for its status).
    pub(super) fn workload(&self) -> Option<&WorkloadEndpoint> {
        match &self.bad {
            Version::Workload(w) => w.as_deref(),
            _ => None,
        }
    }
}

/// The undo log, the updates held back while bisecting, and the quarantine.
#[derive(Debug, Default)]
pub(super) struct Book {
    undo: BTreeMap<ObjKey, Undo>,
    /// Inputs held back at their last good version while bisecting, with the version they had.
    held: BTreeMap<ObjKey, Version>,
    /// The held inputs of the current round; the rest were held in rounds whose commit still
    /// failed (the input at fault was elsewhere).
    testing: BTreeSet<ObjKey>,
    pub(super) quarantined: BTreeMap<ObjKey, Quarantined>,
}

/// What the loop should do after a refused commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    /// These inputs were quarantined (the kernel's error named their objects): commit again.
    Quarantined(Vec<ObjKey>),
    /// Half of the changed inputs are held back at their last good version: commit again.
    Bisecting { held: usize, suspects: usize },
    /// The refusal is not about one of the inputs changed since the last good commit (or it
    /// is about none at all): a failure like any other.
    NotAboutAnInput,
}

fn msg(p: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

impl Dataplane {
    /// The value the model holds for `key` now.
    fn version_of(&self, key: &ObjKey) -> Version {
        let m = &self.model;
        match key {
            ObjKey::IpSet(id) => Version::IpSet(m.ipsets.get(id).cloned()),
            ObjKey::Policy(id) => Version::Policy(m.policies.get(id).cloned()),
            ObjKey::Profile(n) => Version::Profile(m.profiles.get(n).cloned()),
            ObjKey::Workload(id) => Version::Workload(m.workloads.get(id).cloned().map(Box::new)),
            ObjKey::HostEndpoint(id) => {
                Version::HostEndpoint(m.host_endpoints.get(id).cloned().map(Box::new))
            }
        }
    }

    /// Notes in the undo log what `p` is about to change (before the model records it).
    pub(super) fn remember(&mut self, p: &Payload) {
        let Some(key) = ObjKey::of(p) else { return };
        match (p, self.book.undo.get_mut(&key)) {
            (Payload::IpsetDeltaUpdate(d), None) => {
                let mut added = BTreeSet::new();
                let mut removed = BTreeSet::new();
                if let Some(set) = self.model.ipsets.get(&d.id) {
                    journal(set, d, &mut added, &mut removed);
                }
                self.book.undo.insert(key, Undo::Members { added, removed });
            }
            (Payload::IpsetDeltaUpdate(d), Some(Undo::Members { added, removed })) => {
                if let Some(set) = self.model.ipsets.get(&d.id) {
                    journal(set, d, added, removed);
                }
            }
            // A whole set replaced after deltas: its good version, rebuilt from the log.
            (_, Some(Undo::Members { added, removed })) => {
                let (added, removed) = (added.clone(), removed.clone());
                let good = self.model.ipsets.get(&key_ipset(&key)).map(|s| {
                    let mut s = s.clone();
                    for m in &added {
                        s.remove(m);
                    }
                    for m in &removed {
                        s.insert(m);
                    }
                    s
                });
                self.book.undo.insert(key, Undo::Was(Version::IpSet(good)));
            }
            (_, Some(Undo::Was(_))) => {}
            (_, None) => {
                let v = self.version_of(&key);
                self.book.undo.insert(key, Undo::Was(v));
            }
        }
    }

    /// Puts `v` into the model as if an update had said it (marking what to re-render).
    fn record_version(&mut self, key: &ObjKey, v: Version) {
        let (m, members) = version_msg(key, v);
        self.record(&m, members);
        self.tables_follow_changes();
    }

    /// Takes `key` back to its last good version; returns the version it had.
    fn restore(&mut self, key: &ObjKey) -> Version {
        let bad = match self.book.undo.remove(key) {
            Some(Undo::Was(good)) => {
                let bad = self.version_of(key);
                self.record_version(key, good);
                bad
            }
            Some(Undo::Members { added, removed }) => {
                let back = Version::IpSetDelta {
                    added: removed.clone(),
                    removed: added.clone(),
                };
                self.record_version(key, back);
                Version::IpSetDelta { added, removed }
            }
            None => self.version_of(key),
        };
        // Endpoints affected by a policy or profile set aside report an error.
        self.status_dirty.all = true;
        bad
    }

    /// Puts a set-aside version back, recorded in the undo log like an update.
    fn replay(&mut self, key: &ObjKey, v: Version) {
        let (m, members) = version_msg(key, v);
        if let Some(p) = &m.payload {
            self.remember(p);
        }
        self.record(&m, members);
        self.tables_follow_changes();
        self.status_dirty.all = true;
    }

    /// Before an update for a quarantined object is recorded: its refused version comes back
    /// first (a delta applies to it), and it leaves the quarantine to be tried again.
    pub(super) fn unquarantine_for(&mut self, p: &Payload) {
        let Some(key) = ObjKey::of(p) else { return };
        if let Some(q) = self.book.quarantined.remove(&key) {
            tracing::info!(object = %key, "an update for a quarantined object arrived; trying it again");
            self.replay(&key, q.bad);
        }
    }

    /// The inputs changed since the last good commit, not held back.
    pub fn suspects(&self) -> Vec<ObjKey> {
        self.book
            .undo
            .keys()
            .filter(|k| !self.book.held.contains_key(*k))
            .cloned()
            .collect()
    }

    /// The inputs whose rendering made the object `target` names, among the suspects.
    pub fn culprits(&self, target: &Target) -> Vec<ObjKey> {
        let mut out = Vec::new();
        for p in self
            .inc
            .producers(&target.table, target.family, &target.object)
        {
            match p {
                Producer::Workload(iface) => {
                    if let Some(id) = self.workload_ids.get(&iface).and_then(|s| s.iter().next()) {
                        out.push(ObjKey::Workload(id.clone()));
                    }
                }
                Producer::HostEndpoint(iface) => {
                    for (id, h) in &self.heps_resolved {
                        if h.name != iface {
                            continue;
                        }
                        // Resolved copies of an endpoint without a name carry `<id>\0<iface>`.
                        let id = if self.model.host_endpoints.contains_key(id) {
                            id.clone()
                        } else {
                            HostEndpointId {
                                endpoint_id: id
                                    .endpoint_id
                                    .rsplit_once('\u{0}')
                                    .map_or(id.endpoint_id.clone(), |(o, _)| o.to_string()),
                            }
                        };
                        out.push(ObjKey::HostEndpoint(id));
                    }
                }
                Producer::IpSet(id) => out.push(ObjKey::IpSet(id)),
                Producer::Policy(id) => out.push(ObjKey::Policy(id)),
                Producer::Profile(n) => out.push(ObjKey::Profile(n)),
                Producer::Shared => {}
            }
        }
        out.retain(|k| self.book.undo.contains_key(k) && !self.book.held.contains_key(k));
        out.sort();
        out.dedup();
        out
    }

    /// Sets `key` aside at its last good version (or without one), for `reason`.
    pub fn quarantine(&mut self, key: ObjKey, reason: String) {
        let bad = match self.book.held.remove(&key) {
            Some(bad) => bad,
            None => self.restore(&key),
        };
        tracing::error!(object = %key, reason = %reason, "quarantined: the kernel refused what this update renders to; its last good version stays programmed (or none, failing closed) until its next update");
        self.book
            .quarantined
            .insert(key, Quarantined { reason, bad });
    }

    /// Decides what to do about a commit the kernel refused, and does it: quarantines the
    /// inputs behind the object it names, or holds back half of the suspects.
    pub fn isolate(&mut self, target: Option<&Target>, reason: &str) -> Isolation {
        if let Some(t) = target {
            let keys = self.culprits(t);
            if !keys.is_empty() {
                for k in &keys {
                    self.quarantine(k.clone(), reason.to_string());
                }
                return Isolation::Quarantined(keys);
            }
        }
        // The last round's held inputs stay held: the commit failed without them.
        self.book.testing.clear();
        let suspects = self.suspects();
        if suspects.is_empty() {
            // Everything changed is held back and it still fails: not one of them.
            self.release_held();
            return Isolation::NotAboutAnInput;
        }
        // The first half in key order: IP sets, policies and profiles before endpoints. A
        // definition held back renders as its last good version (or a chain that drops) while
        // its users stay, so the bisection ends on the definition at fault, not on the
        // endpoint whose removal would only stop it being rendered.
        let hold: Vec<ObjKey> = suspects[..suspects.len().div_ceil(2)].to_vec();
        for k in &hold {
            let bad = self.restore(k);
            self.book.held.insert(k.clone(), bad);
            self.book.testing.insert(k.clone());
        }
        tracing::warn!(
            held = hold.len(),
            suspects = suspects.len(),
            "the kernel refused a batch without naming an object of ours; holding back half of the changed inputs to find the one at fault"
        );
        Isolation::Bisecting {
            held: hold.len(),
            suspects: suspects.len(),
        }
    }

    /// Ends a bisection that found nothing: every held input comes back.
    pub fn abandon_isolation(&mut self) {
        self.release_held();
    }

    /// Puts every held-back input back (recorded as changed since the last good commit).
    fn release_held(&mut self) {
        self.book.testing.clear();
        for (k, bad) in std::mem::take(&mut self.book.held) {
            self.replay(&k, bad);
        }
    }

    /// Puts the held inputs of the current round back.
    fn release_testing(&mut self) {
        for k in std::mem::take(&mut self.book.testing) {
            if let Some(bad) = self.book.held.remove(&k) {
                self.replay(&k, bad);
            }
        }
    }

    /// The tables were committed: the undo log starts again. While bisecting, the commit
    /// succeeded without this round's held inputs, so the input at fault is among them: alone,
    /// it is quarantined and the inputs held in earlier rounds come back; else this round's
    /// come back, to be halved again. Returns the quarantined input, if one was.
    pub fn tables_committed(&mut self) -> Option<ObjKey> {
        self.book.undo.clear();
        if self.book.held.is_empty() {
            return None;
        }
        match self.book.testing.len() {
            0 => {
                self.release_held();
                None
            }
            1 => {
                let key = self.book.testing.pop_first()?;
                self.quarantine(
                    key.clone(),
                    "the kernel refused every batch with this update, and took the batch without it"
                        .into(),
                );
                self.release_held();
                Some(key)
            }
            _ => {
                self.release_testing();
                None
            }
        }
    }

    /// Whether inputs are held back (the bisection goes on).
    pub fn bisecting(&self) -> bool {
        !self.book.held.is_empty()
    }

    /// The updates set aside, by object.
    pub fn quarantined(&self) -> &BTreeMap<ObjKey, Quarantined> {
        &self.book.quarantined
    }

    /// Whether an endpoint is touched by the quarantine: its own update, or a policy or
    /// profile it uses.
    pub(super) fn quarantine_touches(&self, key: &ObjKey, wep: Option<&WorkloadEndpoint>) -> bool {
        let q = &self.book.quarantined;
        if q.is_empty() {
            return false;
        }
        if q.contains_key(key) {
            return true;
        }
        wep.is_some_and(|w| {
            w.profile_ids
                .iter()
                .any(|p| q.contains_key(&ObjKey::Profile(p.clone())))
                || w.tiers.iter().any(|t| {
                    t.ingress_policies
                        .iter()
                        .chain(&t.egress_policies)
                        .any(|p| q.contains_key(&ObjKey::Policy(p.clone())))
                })
        })
    }
}

fn key_ipset(key: &ObjKey) -> String {
    match key {
        ObjKey::IpSet(id) => id.clone(),
        _ => String::new(),
    }
}

/// Adds a delta's real changes to a set's journal since the last good commit.
fn journal(
    set: &Members,
    d: &IpSetDeltaUpdate,
    added: &mut BTreeSet<String>,
    removed: &mut BTreeSet<String>,
) {
    // The model removes first, then adds: the journal follows the same order, and `present`
    // tracks what the set holds member by member as it goes.
    let mut gone: BTreeSet<&str> = BTreeSet::new();
    for m in &d.removed_members {
        if added.remove(m) {
            gone.insert(m);
        } else if set.contains(m) {
            removed.insert(m.clone());
            gone.insert(m);
        }
    }
    for m in &d.added_members {
        let present = set.contains(m) && !gone.contains(m.as_str());
        if removed.remove(m) {
            continue;
        }
        if !present {
            added.insert(m.clone());
        }
    }
}

/// The update that makes the model hold `v` for `key` (with the parsed members of a whole IP
/// set, which the model takes as they are).
fn version_msg(key: &ObjKey, v: Version) -> (ToDataplane, Option<Members>) {
    match (key, v) {
        (ObjKey::IpSet(id), Version::IpSet(Some(members))) => (
            msg(Payload::IpsetUpdate(IpSetUpdate {
                id: id.clone(),
                members: Vec::new(),
                r#type: members.kind() as i32,
            })),
            Some(members),
        ),
        (ObjKey::IpSet(id), Version::IpSetDelta { added, removed }) => (
            msg(Payload::IpsetDeltaUpdate(IpSetDeltaUpdate {
                id: id.clone(),
                added_members: added.into_iter().collect(),
                removed_members: removed.into_iter().collect(),
            })),
            None,
        ),
        (ObjKey::IpSet(id), _) => (
            msg(Payload::IpsetRemove(IpSetRemove { id: id.clone() })),
            None,
        ),
        (ObjKey::Policy(id), Version::Policy(Some(p))) => (
            msg(Payload::ActivePolicyUpdate(ActivePolicyUpdate {
                id: Some(id.clone()),
                policy: Some(p),
            })),
            None,
        ),
        (ObjKey::Policy(id), _) => (
            msg(Payload::ActivePolicyRemove(ActivePolicyRemove {
                id: Some(id.clone()),
            })),
            None,
        ),
        (ObjKey::Profile(n), Version::Profile(Some(p))) => (
            msg(Payload::ActiveProfileUpdate(ActiveProfileUpdate {
                id: Some(ProfileId { name: n.clone() }),
                profile: Some(p),
            })),
            None,
        ),
        (ObjKey::Profile(n), _) => (
            msg(Payload::ActiveProfileRemove(ActiveProfileRemove {
                id: Some(ProfileId { name: n.clone() }),
            })),
            None,
        ),
        (ObjKey::Workload(id), Version::Workload(Some(e))) => (
            msg(Payload::WorkloadEndpointUpdate(WorkloadEndpointUpdate {
                id: Some(id.clone()),
                endpoint: Some(*e),
            })),
            None,
        ),
        (ObjKey::Workload(id), _) => (
            msg(Payload::WorkloadEndpointRemove(WorkloadEndpointRemove {
                id: Some(id.clone()),
            })),
            None,
        ),
        (ObjKey::HostEndpoint(id), Version::HostEndpoint(Some(e))) => (
            msg(Payload::HostEndpointUpdate(HostEndpointUpdate {
                id: Some(id.clone()),
                endpoint: Some(*e),
            })),
            None,
        ),
        (ObjKey::HostEndpoint(id), _) => (
            msg(Payload::HostEndpointRemove(HostEndpointRemove {
                id: Some(id.clone()),
            })),
            None,
        ),
    }
}
