//! Incremental rendering: re-renders only the objects whose inputs changed and says what
//! changed as [`TablePatch`]es, so an update costs what it touches, not the whole state.
//!
//! The unit of re-rendering is a [`Key`]: one workload interface, one host endpoint, one Felix
//! IP set, one referenced policy or profile in one layer, or the base (static chains, internal
//! sets, dispatch maps and everything else that depends on the whole endpoint list). Each key
//! remembers the object names it produced; re-rendering a key upserts what it produces now and
//! deletes what it no longer produces. Content-addressed sets shared by several policies are
//! reference-counted. Which policies and profiles exist in the tables follows reference counts
//! per (layer, direction) kept from each endpoint's references, as [`super::render`] computes them.
//!
//! Placement: with the side table on ([`super::side`]), a workload endpoint added or
//! changed after the first render goes to the side table, and so do the main-table endpoints
//! that use a policy or profile that changed; their chains leave the main table (deletes cost
//! the kernel nothing) and appear in the small side table, with the policies, profiles and IP
//! sets they reference copied there. A *merge* ([`Changes::merge_side`]) moves them back in two
//! steps: first main gets them while the side copies stay, then the copies go. At most
//! `NftablesSideTableSize` endpoints live in the side table; beyond that, changes go to main.
//!
//! The result is always exactly what [`super::render_text_placed`] gives for the same model and
//! placement (the test `crates/felix-nft/tests/it/rules_incremental.rs` checks this after every step of random
//! update sequences).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use felix_api::types::{HostEndpoint, HostEndpointId, PolicyId, WorkloadEndpointId};
use nf_tables::build::TextTable;
use nf_tables::model::{Chain, Element, ElementDelta, Exprs, Family, Set, Table, TablePatch};

use super::{
    names, policy, render_base_head, render_dispatch_maps, render_hep_statics, render_owner,
    render_workload_derived, side, Direction, Dirs, Layer, Members, Model, OwnerRef, Refs,
    Renderer, RulesError,
};

/// What changed in the model since the last [`Incremental::update`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Everything (start of day).
    pub all: bool,
    /// Pools, hosts, VTEPs, service CIDRs, host addresses, the endpoint list: the base objects.
    pub base: bool,
    /// Host endpoints (all are re-rendered: they are few).
    pub host_endpoints: bool,
    /// Workload interfaces whose endpoint was added, changed or removed.
    pub workloads: BTreeSet<String>,
    pub policies: BTreeSet<PolicyId>,
    pub profiles: BTreeSet<String>,
    /// IP sets to render whole (a new, replaced or removed set, or a delta of a `NET` set).
    pub ipsets: BTreeSet<String>,
    /// Members an `IpSetDeltaUpdate` touched, per set not in `ipsets`: they become element
    /// adds and deletes by what the model holds when rendered (DESIGN §4: a delta costs its
    /// elements, not the set's size).
    pub ipset_members: BTreeMap<String, BTreeSet<String>>,
    /// Move the side table's endpoints back to the main table (one step per update).
    pub merge_side: bool,
    /// Internal sets (by id) whose members changed while nothing else of the base did: hosts
    /// and VTEPs come and go by element, not by re-rendering the base.
    pub internal_sets: BTreeSet<&'static str>,
    /// Addresses whose membership of an internal set (`all-hosts-net`, `all-vxlan-net`) may
    /// have changed, per set not in `internal_sets`: element adds and deletes by what the
    /// model holds when rendered, where the set holds addresses.
    pub internal_members: BTreeMap<&'static str, BTreeSet<IpAddr>>,
}

impl Changes {
    pub fn any(&self) -> bool {
        self.all
            || self.merge_side
            || self.base
            || self.host_endpoints
            || !self.workloads.is_empty()
            || !self.policies.is_empty()
            || !self.profiles.is_empty()
            || !self.ipsets.is_empty()
            || !self.ipset_members.is_empty()
            || !self.internal_sets.is_empty()
            || !self.internal_members.is_empty()
    }

    /// Records that address `a` may have joined or left internal set `id`.
    pub fn internal_member(&mut self, id: &'static str, a: IpAddr) {
        if !self.internal_sets.contains(id) {
            self.internal_members.entry(id).or_default().insert(a);
        }
    }

    /// Records a member change of IP set `id`; a set to be rendered whole needs none.
    pub fn ipset_delta<'a>(&mut self, id: &str, members: impl IntoIterator<Item = &'a String>) {
        if !self.ipsets.contains(id) {
            let touched = self.ipset_members.entry(id.to_string()).or_default();
            touched.extend(members.into_iter().cloned());
        }
    }

    /// Marks IP set `id` to be rendered whole (its touched members are covered then).
    pub fn ipset_whole(&mut self, id: &str) {
        self.ipset_members.remove(id);
        self.ipsets.insert(id.to_string());
    }
}

/// What the renderer reads besides the model's own maps.
pub struct Inputs<'a> {
    pub model: &'a Model,
    /// Workload endpoint ids per interface name (the smallest id wins, §14.1).
    pub workload_ids: &'a BTreeMap<String, BTreeSet<WorkloadEndpointId>>,
    /// Host endpoints with interface-less ones resolved to interfaces (§14.4); used instead of
    /// `model.host_endpoints`.
    pub host_endpoints: &'a BTreeMap<HostEndpointId, HostEndpoint>,
}

/// The table of a family an object lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tbl {
    Main,
    Side,
}

impl Tbl {
    fn name(self) -> &'static str {
        match self {
            Tbl::Main => crate::OWNER,
            Tbl::Side => crate::SIDE_TABLE,
        }
    }
}

/// The unit of re-rendering.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// Static chains, internal sets, host dispatch, NAT-outgoing, CIDR block and the dispatch
    /// maps in full (their workload elements change by deltas otherwise); the side table's
    /// base chains and maps.
    Base,
    /// RPF skip and floating IPs: they depend on the workloads as a whole.
    WorkloadDerived,
    /// A workload interface's chains, in whichever tables it lives in.
    Workload(String),
    HostEndpoint(String),
    IpSet(Tbl, String),
    Policy(Tbl, Layer, PolicyId),
    Profile(Tbl, Layer, String),
}

/// The input behind an object of the tables, as [`Incremental::producers`] tells it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Producer {
    /// The workload endpoint on this interface.
    Workload(String),
    /// The host endpoint(s) on this interface.
    HostEndpoint(String),
    IpSet(String),
    Policy(PolicyId),
    Profile(String),
    /// Static chains, dispatch maps, internal sets and the rest that depends on the whole
    /// model rather than on one input.
    Shared,
}

/// An endpoint that references policies and profiles (a workload once per table it is in).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Workload(Tbl, String),
    HostEndpoint(String),
}

/// An object: table, family, name.
type Obj = (Tbl, Family, String);

/// Object names one key produced.
#[derive(Debug, Clone, Default)]
struct Produced {
    chains: Vec<Obj>,
    sets: Vec<Obj>,
}

/// Reference counts of one policy or profile, inbound and outbound.
type DirCounts = [u32; 2];

fn count_of(c: &mut DirCounts, d: Direction) -> &mut u32 {
    match d {
        Direction::Inbound => &mut c[0],
        Direction::Outbound => &mut c[1],
    }
}

/// The incremental renderer's memory of what it rendered.
pub struct Incremental {
    r: Renderer,
    families: Vec<Family>,
    side_on: bool,
    produced: BTreeMap<Key, Produced>,
    /// Users of each set (content-addressed policy sets are shared).
    set_users: BTreeMap<Obj, u32>,
    /// How many keys produce each chain: endpoint chains are shared by every interface with
    /// the same body; a chain goes when its last user does.
    chain_users: BTreeMap<Obj, u32>,
    policy_refs: BTreeMap<(Tbl, Layer, PolicyId), DirCounts>,
    profile_refs: BTreeMap<(Tbl, Layer, String), DirCounts>,
    source_refs: BTreeMap<Source, Refs>,
    /// Who references each policy and profile (any table, any layer).
    policy_users: BTreeMap<PolicyId, BTreeSet<Source>>,
    profile_users: BTreeMap<String, BTreeSet<Source>>,
    /// The Felix IP sets each side-table policy/profile key references, and their counts.
    side_ipsets_of: BTreeMap<Key, BTreeSet<String>>,
    side_ipset_refs: BTreeMap<String, u32>,
    /// Host endpoint interfaces rendered last time.
    hep_ifaces: BTreeSet<String>,
    /// The dispatch-map elements (from, to) of each workload interface, per table.
    wl_dispatch: BTreeMap<(Tbl, Family, String), (Element, Element)>,
    /// Interfaces whose endpoint lives in the side table (main hands them off).
    side: BTreeSet<String>,
    /// Interfaces in both tables, main active: the first half of a merge.
    lingering: BTreeSet<String>,
    /// The interfaces in main's `filter-cali-wl-side` set.
    listed: BTreeSet<String>,
    /// One copy of each rule body rendered (see [`share_rules`]).
    bodies: HashSet<Exprs, foldhash::fast::RandomState>,
    /// `bodies.len()` after the last sweep of unused bodies.
    bodies_swept: usize,
    /// Whether each Felix IP set had members of IPv4 and of IPv6 when policies and profiles
    /// were last rendered: a rule matching a set with none of a family is left out of that
    /// family's chain, so a set gaining its first member of a family (or losing its last)
    /// re-renders the policies and profiles that use it.
    ipset_families: BTreeMap<String, [bool; 2]>,
    /// The policies with no rule in a family and direction when endpoints were last rendered:
    /// endpoint chains leave out their jumps (see [`super::endpoint::NoopPolicy`]), so a policy
    /// entering or leaving this set re-renders the endpoints that use it.
    noop_policies: BTreeSet<(Family, PolicyId, Direction)>,
}

/// An update goes to the side table only while it copies there no more IP set members than the
/// main table has workload interfaces (and never fewer than this many). Copying one member
/// costs the kernel about what validating one main-table interface costs in a commit that adds
/// to main (its two dispatch-map elements, each walked into its endpoint chain): 1.5–2.5 µs
/// either way. So a small node, or an endpoint whose policies name large IP sets on a node of
/// average size, goes straight to main, and 50 endpoints arriving together go there in one
/// commit; below this floor the copy is cheap whatever main holds.
const MIN_SIDE_COPY: usize = 256;

/// The endpoint that owns an interface (the smallest id wins, §14.1).
fn winner<'a>(inp: &Inputs<'a>, iface: &str) -> Option<&'a felix_api::types::WorkloadEndpoint> {
    inp.workload_ids
        .get(iface)
        .and_then(|ids| ids.iter().next())
        .and_then(|id| inp.model.workloads.get(id))
}

/// Upserts and deletes collected during one update.
/// What one update re-renders (see [`Incremental::touched`]).
#[derive(Default)]
struct Todo {
    workloads: BTreeSet<String>,
    /// Host endpoints to render again although none changed.
    host_endpoints: bool,
    owners: BTreeSet<(Tbl, Layer, RuleOwner)>,
    ipsets: BTreeSet<(Tbl, String)>,
}

/// A policy or a profile: the two kinds of rule owners, rendered and referenced alike.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RuleOwner {
    Policy(PolicyId),
    Profile(String),
}

impl RuleOwner {
    fn borrowed(&self) -> OwnerRef<'_> {
        match self {
            RuleOwner::Policy(id) => OwnerRef::Policy(id),
            RuleOwner::Profile(n) => OwnerRef::Profile(n),
        }
    }
}

#[derive(Default)]
struct Pending {
    chains: BTreeMap<Obj, Option<Chain>>,
    sets: BTreeMap<Obj, Option<Set>>,
    /// Element deltas of the dispatch maps (one family's) and the side set (every family's).
    elements: BTreeMap<(Tbl, Option<Family>, String), ElementDelta>,
    /// Element deltas of Felix IP sets (one family's set each).
    set_elements: BTreeMap<Obj, ElementDelta>,
}

impl Incremental {
    /// The renderer's configuration.
    pub fn config(&self) -> &super::RulesConfig {
        &self.r.cfg
    }

    /// Changes the configuration the base renders against (the encapsulations in use, which
    /// follow the pools and VTEPs when Felix does not set them); the caller marks the base
    /// changed. Mark bits and families do not change here.
    pub fn set_config(&mut self, cfg: super::RulesConfig) {
        self.r.cfg = cfg;
    }

    pub fn new(r: Renderer) -> Incremental {
        Incremental {
            families: r.families(),
            side_on: r.side_table_on(),
            r,
            produced: BTreeMap::new(),
            set_users: BTreeMap::new(),
            chain_users: BTreeMap::new(),
            policy_refs: BTreeMap::new(),
            profile_refs: BTreeMap::new(),
            source_refs: BTreeMap::new(),
            policy_users: BTreeMap::new(),
            profile_users: BTreeMap::new(),
            side_ipsets_of: BTreeMap::new(),
            side_ipset_refs: BTreeMap::new(),
            hep_ifaces: BTreeSet::new(),
            wl_dispatch: BTreeMap::new(),
            side: BTreeSet::new(),
            lingering: BTreeSet::new(),
            listed: BTreeSet::new(),
            bodies: HashSet::default(),
            bodies_swept: 0,
            ipset_families: BTreeMap::new(),
            noop_policies: BTreeSet::new(),
        }
    }

    /// The inputs whose rendering produced `object` in table `table` of `family` (several for
    /// a content-addressed set shared by policies); empty when nothing rendered here made it.
    /// Walks everything rendered: meant for the rare refused batch, not for every apply.
    pub fn producers(
        &self,
        table: &str,
        family: Family,
        object: &nf_tables::error::ObjectRef,
    ) -> Vec<Producer> {
        use nf_tables::error::ObjectRef;
        let matches = |objs: &[Obj], name: &str| {
            objs.iter()
                .any(|(t, f, n)| t.name() == table && *f == family && n == name)
        };
        let mut out: Vec<Producer> = self
            .produced
            .iter()
            .filter(|(_, p)| match object {
                ObjectRef::Table => false,
                ObjectRef::Chain(c) => matches(&p.chains, c),
                ObjectRef::Set(s) => matches(&p.sets, s),
            })
            .map(|(k, _)| match k {
                Key::Base | Key::WorkloadDerived => Producer::Shared,
                Key::Workload(i) => Producer::Workload(i.clone()),
                Key::HostEndpoint(i) => Producer::HostEndpoint(i.clone()),
                Key::IpSet(_, id) => Producer::IpSet(id.clone()),
                Key::Policy(_, _, id) => Producer::Policy(id.clone()),
                Key::Profile(_, _, n) => Producer::Profile(n.clone()),
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The placement: interfaces in the side table, and those in both tables (main active).
    pub fn placement(&self) -> (&BTreeSet<String>, &BTreeSet<String>) {
        (&self.side, &self.lingering)
    }

    /// Whether a merge has work: endpoints in the side table, or side copies to drop.
    pub fn side_pending(&self) -> bool {
        !self.side.is_empty() || !self.lingering.is_empty()
    }

    /// Re-renders what `changes` touches and returns the patches (one per table; empty
    /// patches are left out).
    pub fn update(&mut self, inp: &Inputs, changes: &Changes) -> Vec<TablePatch> {
        let mut pending = Pending::default();
        let mut todo = self.touched(inp, changes);
        // Host endpoints by interface; the smallest id wins.
        let mut heps: BTreeMap<&str, &HostEndpoint> = BTreeMap::new();
        for hep in inp.host_endpoints.values() {
            if !hep.name.is_empty() {
                heps.entry(hep.name.as_str()).or_insert(hep);
            }
        }
        self.update_workloads(inp, &mut todo, &mut pending);
        if changes.all || changes.host_endpoints || todo.host_endpoints {
            self.update_host_endpoints(inp.model, &heps, &mut todo, &mut pending);
        }
        self.update_rule_owners(inp.model, &mut todo, &mut pending);
        self.update_ipsets(inp.model, &todo.ipsets, &mut pending);
        self.update_ipset_members(inp.model, changes, &todo.ipsets, &mut pending);
        if changes.all || changes.base || changes.host_endpoints {
            self.update_base(inp.model, &heps, &mut pending);
        } else {
            if !changes.internal_sets.is_empty() {
                self.update_internal_sets(inp.model, &changes.internal_sets, &mut pending);
            }
            if !changes.internal_members.is_empty() {
                self.update_internal_members(inp.model, changes, &mut pending);
            }
        }
        if changes.all || !todo.workloads.is_empty() {
            self.update_workload_derived(inp, &mut pending);
        }
        self.patches(pending)
    }

    /// What an update must re-render: the workloads, policies and profiles (per table and
    /// layer) and IP sets it touched, with the workloads' placement decided.
    fn touched(&mut self, inp: &Inputs, changes: &Changes) -> Todo {
        let m = inp.model;
        let mut todo = Todo {
            workloads: changes.workloads.clone(),
            ipsets: changes
                .ipsets
                .iter()
                .flat_map(|id| [(Tbl::Main, id.clone()), (Tbl::Side, id.clone())])
                .collect(),
            ..Todo::default()
        };
        if changes.all {
            todo.workloads.extend(inp.workload_ids.keys().cloned());
            todo.ipsets
                .extend(m.ipsets.keys().map(|id| (Tbl::Main, id.clone())));
            for k in self.produced.keys() {
                match k {
                    Key::Workload(i) => {
                        todo.workloads.insert(i.clone());
                    }
                    Key::IpSet(t, i) => {
                        todo.ipsets.insert((*t, i.clone()));
                    }
                    Key::Policy(t, l, id) => {
                        todo.owners.insert((*t, *l, RuleOwner::Policy(id.clone())));
                    }
                    Key::Profile(t, l, n) => {
                        todo.owners.insert((*t, *l, RuleOwner::Profile(n.clone())));
                    }
                    _ => {}
                }
            }
        }
        self.place(inp, changes, &mut todo.workloads);
        // A changed policy or profile is re-rendered in every table and layer that references
        // it; so is one using an IP set that gained its first or lost its last member of a
        // family.
        let emptied = self.ipset_family_changes(m, changes);
        self.noop_changes(inp, changes, &emptied, &mut todo);
        let changed = changes
            .policies
            .iter()
            .map(|id| RuleOwner::Policy(id.clone()))
            .chain(
                changes
                    .profiles
                    .iter()
                    .map(|n| RuleOwner::Profile(n.clone())),
            )
            .chain(emptied);
        for owner in changed {
            for t in [Tbl::Main, Tbl::Side] {
                for l in [Layer::Filter, Layer::Mangle, Layer::Raw] {
                    if self.refs_of(t, l, &owner).is_some() {
                        todo.owners.insert((t, l, owner.clone()));
                    }
                }
            }
        }
        todo
    }

    /// The policies and profiles to render again because an IP set they match on gained its
    /// first or lost its last member of a family (see [`policy::EmptyIpSet`]); records what each
    /// touched set holds now. At start of day everything is rendered and only recorded.
    fn ipset_family_changes(&mut self, m: &Model, changes: &Changes) -> Vec<RuleOwner> {
        let families = |id: &str| {
            m.ipsets
                .get(id)
                .map_or([false; 2], |s| [s.has_family(false), s.has_family(true)])
        };
        if changes.all {
            self.ipset_families = m
                .ipsets
                .keys()
                .map(|id| (id.clone(), families(id)))
                .collect();
            return Vec::new();
        }
        let touched = changes.ipsets.iter().chain(changes.ipset_members.keys());
        let mut flipped: BTreeSet<&str> = BTreeSet::new();
        for id in touched {
            let now = families(id);
            let before = self.ipset_families.get(id).copied().unwrap_or([false; 2]);
            if now != before {
                flipped.insert(id);
            }
            if m.ipsets.contains_key(id) {
                self.ipset_families.insert(id.clone(), now);
            } else {
                self.ipset_families.remove(id);
            }
        }
        if flipped.is_empty() {
            return Vec::new();
        }
        let uses = |rules: &[felix_api::Rule]| {
            rules
                .iter()
                .any(|r| flipped.iter().any(|id| policy::rule_matches_ipset(r, id)))
        };
        let policies = m
            .policies
            .iter()
            .filter(|(_, p)| uses(&p.inbound_rules) || uses(&p.outbound_rules))
            .map(|(id, _)| RuleOwner::Policy(id.clone()));
        let profiles = m
            .profiles
            .iter()
            .filter(|(_, p)| uses(&p.inbound_rules) || uses(&p.outbound_rules))
            .map(|(n, _)| RuleOwner::Profile(n.clone()));
        policies.chain(profiles).collect()
    }

    /// Records which policies are no-ops now (see [`Incremental::noop_policies`]) among those
    /// an update changed or re-renders for their IP sets, and marks the endpoints using one
    /// that became or stopped being one for rendering again. At start of day everything is
    /// rendered and only recorded.
    fn noop_changes(
        &mut self,
        inp: &Inputs,
        changes: &Changes,
        emptied: &[RuleOwner],
        todo: &mut Todo,
    ) {
        let m = inp.model;
        let candidates: BTreeSet<&PolicyId> = if changes.all {
            self.noop_policies.clear();
            m.policies.keys().collect()
        } else {
            let rerendered = emptied.iter().filter_map(|o| match o {
                RuleOwner::Policy(id) => Some(id),
                RuleOwner::Profile(_) => None,
            });
            changes.policies.iter().chain(rerendered).collect()
        };
        if candidates.is_empty() {
            return;
        }
        let mut flipped = BTreeSet::new();
        for &f in &self.families {
            let noop = super::noop_policies(m, f);
            for &id in &candidates {
                for dir in [Direction::Inbound, Direction::Outbound] {
                    let (key, now) = ((f, id.clone(), dir), noop(id, dir));
                    let was = if now {
                        !self.noop_policies.insert(key)
                    } else {
                        self.noop_policies.remove(&key)
                    };
                    if was != now {
                        flipped.insert(id);
                    }
                }
            }
        }
        if changes.all || flipped.is_empty() {
            return;
        }
        for src in flipped
            .iter()
            .filter_map(|id| self.policy_users.get(*id))
            .flatten()
        {
            match src {
                Source::Workload(_, iface) => {
                    todo.workloads.insert(iface.clone());
                }
                Source::HostEndpoint(_) => todo.host_endpoints = true,
            }
        }
    }

    /// The references to a policy's or profile's chains in one table and layer.
    fn refs_of(&self, t: Tbl, l: Layer, owner: &RuleOwner) -> Option<&DirCounts> {
        match owner {
            RuleOwner::Policy(id) => self.policy_refs.get(&(t, l, id.clone())),
            RuleOwner::Profile(n) => self.profile_refs.get(&(t, l, n.clone())),
        }
    }

    /// Workload endpoints: their chains (each distinct body rendered once in this pass), their
    /// dispatch-map elements, main's list of handed-off interfaces, and what they reference.
    fn update_workloads(&mut self, inp: &Inputs, todo: &mut Todo, pending: &mut Pending) {
        let workloads = std::mem::take(&mut todo.workloads);
        let mut bodies = super::endpoint::ChainBodies::default();
        let noops: Vec<_> = self
            .families
            .iter()
            .map(|&f| (f, super::noop_policies(inp.model, f)))
            .collect();
        for iface in &workloads {
            let wep = winner(inp, iface);
            let mut chains = Vec::new();
            for t in [Tbl::Main, Tbl::Side] {
                let here = wep.filter(|_| self.lives_in(t, iface));
                let mut refs = Refs::default();
                if let Some(wep) = here {
                    refs.workload(wep);
                    for (f, noop) in &noops {
                        // Shared as each body is first rendered: its renamed copies
                        // carry the shared expressions already.
                        let (r, shared, swept) =
                            (&self.r, &mut self.bodies, &mut self.bodies_swept);
                        let mut share = |c: &mut Chain| share_rules(shared, swept, c);
                        chains.extend(
                            r.workload_chains_shared(
                                *f,
                                wep,
                                (t == Tbl::Side, noop),
                                &mut bodies,
                                &mut share,
                            )
                            .into_iter()
                            .map(|c| (t, *f, c)),
                        );
                    }
                }
                // Dispatch elements, per family (a shared chain's name may differ between
                // them): deltas, unless the base re-renders the maps whole below.
                for (f, noop) in &noops {
                    let now = here.map(|w| {
                        self.r
                            .workload_dispatch_elements(iface, w, (t == Tbl::Side, noop))
                    });
                    let key = (t, *f, iface.clone());
                    let before = match &now {
                        Some(n) => self.wl_dispatch.insert(key, n.clone()),
                        None => self.wl_dispatch.remove(&key),
                    };
                    if before == now {
                        continue;
                    }
                    let maps = [
                        Layer::Filter.chain(names::logical::FROM_WL_DISPATCH),
                        Layer::Filter.chain(names::logical::TO_WL_DISPATCH),
                    ];
                    for (i, map) in maps.into_iter().enumerate() {
                        let pick = |p: &(Element, Element)| {
                            if i == 0 {
                                p.0.clone()
                            } else {
                                p.1.clone()
                            }
                        };
                        let d = pending.elements.entry((t, Some(*f), map)).or_default();
                        d.del.extend(before.as_ref().map(pick));
                        d.add.extend(now.as_ref().map(pick));
                    }
                }
                self.set_source_refs(Source::Workload(t, iface.clone()), refs, &mut todo.owners);
            }
            // Main's list of handed-off interfaces.
            let listed = wep.is_some() && self.side_on && self.side.contains(iface);
            if listed != self.listed.contains(iface) {
                let d = pending
                    .elements
                    .entry((Tbl::Main, None, side::SIDE_IFACES.to_string()))
                    .or_default();
                if listed {
                    self.listed.insert(iface.clone());
                    d.add.push(side::side_iface_element(iface));
                } else {
                    self.listed.remove(iface);
                    d.del.push(side::side_iface_element(iface));
                }
            }
            self.replace_shared(Key::Workload(iface.clone()), chains, Vec::new(), pending);
        }

        todo.workloads = workloads;
    }

    /// Host endpoints: their chains, per interface, and what they reference.
    fn update_host_endpoints(
        &mut self,
        m: &Model,
        heps: &BTreeMap<&str, &HostEndpoint>,
        todo: &mut Todo,
        pending: &mut Pending,
    ) {
        let now: BTreeSet<String> = heps.keys().map(|s| s.to_string()).collect();
        for gone in self
            .hep_ifaces
            .difference(&now)
            .cloned()
            .collect::<Vec<_>>()
        {
            self.replace(
                Key::HostEndpoint(gone.clone()),
                Vec::new(),
                Vec::new(),
                pending,
            );
            self.set_source_refs(
                Source::HostEndpoint(gone),
                Refs::default(),
                &mut todo.owners,
            );
        }
        for (iface, hep) in heps {
            let mut chains = Vec::new();
            for &f in &self.families {
                let noop = super::noop_policies(m, f);
                chains.extend(
                    self.r
                        .host_endpoint_chains(f, iface, hep, &noop)
                        .into_iter()
                        .map(|c| (Tbl::Main, f, c.chain)),
                );
            }
            self.replace(
                Key::HostEndpoint(iface.to_string()),
                chains,
                Vec::new(),
                pending,
            );
            let mut refs = Refs::default();
            refs.host_endpoint(iface, hep);
            self.set_source_refs(
                Source::HostEndpoint(iface.to_string()),
                refs,
                &mut todo.owners,
            );
        }
        self.hep_ifaces = now;
    }

    /// Policies and profiles, in the directions still referenced; a side-table copy records
    /// the IP sets it needs there.
    fn update_rule_owners(&mut self, m: &Model, todo: &mut Todo, pending: &mut Pending) {
        for (t, layer, owner) in std::mem::take(&mut todo.owners) {
            let dirs = live_dirs(self.refs_of(t, layer, &owner));
            let (mut chains, mut sets) = (Vec::new(), Vec::new());
            let mut uses = BTreeSet::new();
            if !dirs.is_empty() {
                for &f in &self.families {
                    let (c, s) = render_owner(&self.r, f, m, (layer, owner.borrowed()), &dirs);
                    chains.extend(c.into_iter().map(|c| (t, f, c.chain)));
                    sets.extend(s.into_iter().map(|s| (t, f, s)));
                }
                let rules = match &owner {
                    RuleOwner::Policy(id) => m
                        .policies
                        .get(id)
                        .map(|p| (&p.inbound_rules, &p.outbound_rules)),
                    RuleOwner::Profile(n) => m
                        .profiles
                        .get(n)
                        .map(|p| (&p.inbound_rules, &p.outbound_rules)),
                };
                if let Some((inbound, outbound)) = rules {
                    policy::rules_ipsets(inbound.iter().chain(outbound), &mut uses);
                }
            } else {
                match &owner {
                    RuleOwner::Policy(id) => self.policy_refs.remove(&(t, layer, id.clone())),
                    RuleOwner::Profile(n) => self.profile_refs.remove(&(t, layer, n.clone())),
                };
            }
            let key = match owner {
                RuleOwner::Policy(id) => Key::Policy(t, layer, id),
                RuleOwner::Profile(n) => Key::Profile(t, layer, n),
            };
            if t == Tbl::Side {
                self.set_side_ipsets(key.clone(), uses, &mut todo.ipsets);
            }
            self.replace(key, chains, sets, pending);
        }
    }

    /// Felix IP sets rendered whole: all of them in main, the referenced ones in the side table,
    /// each in the tables of the families it has members of (see [`Renderer::ipset_families`]).
    fn update_ipsets(
        &mut self,
        m: &Model,
        ipsets: &BTreeSet<(Tbl, String)>,
        pending: &mut Pending,
    ) {
        for (t, id) in ipsets {
            let wanted = *t == Tbl::Main || self.side_ipset_refs.contains_key(id);
            let mut sets = Vec::new();
            if let Some(members) = m.ipsets.get(id).filter(|_| wanted) {
                for f in self.r.ipset_families(members) {
                    sets.push((*t, f, self.r.ipset(f, id, members)));
                }
            }
            self.replace(Key::IpSet(*t, id.clone()), Vec::new(), sets, pending);
        }
    }

    /// IP set deltas: the touched members of the sets not rendered whole, in every table and
    /// family that holds the set, added when the model has them, else deleted. A set that
    /// gained its first or lost its last member of a family comes into or goes out of that
    /// family's table whole; where it stays, only its members change.
    fn update_ipset_members(
        &mut self,
        m: &Model,
        changes: &Changes,
        ipsets: &BTreeSet<(Tbl, String)>,
        pending: &mut Pending,
    ) {
        for (id, touched) in &changes.ipset_members {
            let Some(members) = m.ipsets.get(id) else {
                continue;
            };
            for t in [Tbl::Main, Tbl::Side] {
                let wanted = t == Tbl::Main || self.side_ipset_refs.contains_key(id);
                if !wanted || ipsets.contains(&(t, id.clone())) {
                    continue;
                }
                let key = Key::IpSet(t, id.clone());
                let families = self.r.ipset_families(members);
                let had = self.produced.get(&key).map_or(&[][..], |p| &p.sets[..]);
                if had.len() != families.len() || had.iter().any(|o| !families.contains(&o.1)) {
                    // Into or out of a family's table: the set there is written whole (its
                    // deltas below are dropped for it, see `patches`); where it stays, only
                    // its members change.
                    let kept: Vec<Obj> = had
                        .iter()
                        .filter(|o| families.contains(&o.1))
                        .cloned()
                        .collect();
                    let sets = families
                        .iter()
                        .map(|&f| (t, f, self.r.ipset(f, id, members)))
                        .collect();
                    self.replace(key.clone(), Vec::new(), sets, pending);
                    for obj in &kept {
                        pending.sets.remove(obj);
                    }
                }
                let Some(made) = self.produced.get(&key) else {
                    continue;
                };
                for obj in &made.sets {
                    let d = pending.set_elements.entry(obj.clone()).or_default();
                    for s in touched {
                        if let Some(e) = self.r.ipset_member_element(obj.1, members.kind(), s) {
                            if members.contains(s) {
                                d.add.push(e);
                            } else {
                                d.del.push(e);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The base (static chains, dispatch maps whole, host-endpoint statics, the side table's
    /// base): whenever anything global or the host endpoints changed.
    fn update_base(
        &mut self,
        m: &Model,
        heps: &BTreeMap<&str, &HostEndpoint>,
        pending: &mut Pending,
    ) {
        let (mut chains, mut sets) = (Vec::new(), Vec::new());
        let of = |t: Tbl, f: Family| {
            self.wl_dispatch
                .iter()
                .filter(move |((tt, ff, _), _)| *tt == t && *ff == f)
                .map(|(_, e)| e.clone())
        };
        for &f in &self.families {
            let mut t = TextTable::new(f, crate::OWNER);
            render_base_head(&self.r, f, m, &mut t);
            for s in render_dispatch_maps(&self.r, of(Tbl::Main, f), heps) {
                t.add_set(s);
            }
            render_hep_statics(&self.r, f, m, heps, &mut t);
            chains.extend(t.table.chains.into_values().map(|c| (Tbl::Main, f, c)));
            sets.extend(t.table.sets.into_values().map(|s| (Tbl::Main, f, s)));
            if self.side_on {
                let mut list = self.r.side_ifaces_set();
                list.elements = self
                    .listed
                    .iter()
                    .map(|i| side::side_iface_element(i))
                    .collect();
                sets.push((Tbl::Main, f, list));
                let (c, s) = self.r.side_base(f, of(Tbl::Side, f));
                chains.extend(c.into_iter().map(|c| (Tbl::Side, f, c.chain)));
                sets.extend(s.into_iter().map(|s| (Tbl::Side, f, s)));
            }
        }
        self.replace(Key::Base, chains, sets, pending);
        // The maps went whole.
        pending.elements.clear();
    }

    /// Internal sets whose members changed: upserted whole into the patch, which the
    /// reconciler turns into element adds and deletes against what the kernel holds. They stay
    /// the base's objects (the base renders them too).
    fn update_internal_sets(
        &mut self,
        m: &Model,
        ids: &BTreeSet<&'static str>,
        pending: &mut Pending,
    ) {
        for &f in &self.families {
            for s in super::render_internal_sets(&self.r, f, m, Some(ids)) {
                pending.sets.insert((Tbl::Main, f, s.name.clone()), Some(s));
            }
        }
    }

    /// Internal sets whose members a host or VTEP change touched (and that are not rendered
    /// whole): an element added or deleted per address, by what the model holds, where the set
    /// holds addresses; rendered whole where it holds intervals.
    fn update_internal_members(&mut self, m: &Model, changes: &Changes, pending: &mut Pending) {
        for &f in &self.families {
            let v6 = f == Family::Ip6;
            for (&id, touched) in &changes.internal_members {
                if changes.internal_sets.contains(id) {
                    continue;
                }
                if !self.r.internal_set_by_address(f, id) {
                    let ids = BTreeSet::from([id]);
                    for s in super::render_internal_sets(&self.r, f, m, Some(&ids)) {
                        pending.sets.insert((Tbl::Main, f, s.name.clone()), Some(s));
                    }
                    continue;
                }
                let obj = (Tbl::Main, f, super::names::ipset_name(f, id));
                let d = pending.set_elements.entry(obj).or_default();
                for &a in touched.iter().filter(|a| a.is_ipv6() == v6) {
                    let e = nf_tables::build::addr_element(a);
                    if super::internal_set_has(&self.r, m, id, a) {
                        d.add.push(e);
                    } else {
                        d.del.push(e);
                    }
                }
            }
        }
    }

    /// RPF skip and floating IPs: whenever a workload changed.
    fn update_workload_derived(&mut self, inp: &Inputs, pending: &mut Pending) {
        let m = inp.model;
        // Only spoofing workloads make RPF rules; skip the per-interface winner lookups
        // when there are none (the common case).
        let spoofing = m
            .workloads
            .values()
            .any(|w| !w.allow_spoofed_source_prefixes.is_empty());
        let winners: Vec<_> = inp
            .workload_ids
            .values()
            .filter(|_| spoofing)
            .filter_map(|ids| ids.iter().next().and_then(|id| m.workloads.get(id)))
            .collect();
        let mut chains = Vec::new();
        for &f in &self.families {
            let mut t = TextTable::new(f, crate::OWNER);
            render_workload_derived(&self.r, f, m, winners.iter().copied(), &mut t);
            chains.extend(t.table.chains.into_values().map(|c| (Tbl::Main, f, c)));
        }
        self.replace(Key::WorkloadDerived, chains, Vec::new(), pending);
    }

    /// Whether a workload interface's chains live in table `t`.
    fn lives_in(&self, t: Tbl, iface: &str) -> bool {
        match t {
            Tbl::Main => !self.side.contains(iface),
            Tbl::Side => self.side.contains(iface) || self.lingering.contains(iface),
        }
    }

    /// Decides which table each endpoint lives in for this update; every interface whose
    /// placement changes joins `workloads` (re-rendered in its new tables).
    fn place(&mut self, inp: &Inputs, changes: &Changes, workloads: &mut BTreeSet<String>) {
        if changes.all || !self.side_on {
            workloads.extend(std::mem::take(&mut self.side));
            workloads.extend(std::mem::take(&mut self.lingering));
            return;
        }
        let cap = self.r.cfg.side_table_size;
        // A merge, one step at a time: drop the side copies, or hand the side's endpoints
        // back to main while the copies stay (a packet handed off just before the commit
        // still finds its endpoint).
        if changes.merge_side {
            if self.lingering.is_empty() {
                self.lingering = std::mem::take(&mut self.side);
                workloads.extend(self.lingering.iter().cloned());
            } else {
                workloads.extend(std::mem::take(&mut self.lingering));
            }
        }
        // Endpoints added or changed go to the side table while it has room, unless the IP
        // sets they would copy there cost more than validating the main table once.
        let mut moving = BTreeSet::new();
        for iface in &changes.workloads {
            if winner(inp, iface).is_none() {
                self.side.remove(iface);
                self.lingering.remove(iface);
            } else if !self.side.contains(iface) {
                moving.insert(iface.clone());
            }
        }
        let budget = inp
            .workload_ids
            .len()
            .saturating_sub(self.side.len())
            .max(MIN_SIDE_COPY);
        if self.side.len() + moving.len() <= cap && self.copy_cost(inp, &moving) <= budget {
            for i in moving {
                self.lingering.remove(&i);
                self.side.insert(i);
            }
        }
        // The main-table users of a changed policy or profile move to the side table (all of
        // them or none), so main's copy loses its users instead of changing.
        let mut users: BTreeSet<String> = BTreeSet::new();
        let of_main = |s: &BTreeSet<Source>, out: &mut BTreeSet<String>| {
            for src in s {
                if let Source::Workload(Tbl::Main, i) = src {
                    out.insert(i.clone());
                }
            }
        };
        for id in &changes.policies {
            if let Some(s) = self.policy_users.get(id) {
                of_main(s, &mut users);
            }
        }
        for n in &changes.profiles {
            if let Some(s) = self.profile_users.get(n) {
                of_main(s, &mut users);
            }
        }
        users.retain(|i| !self.side.contains(i));
        if !users.is_empty()
            && self.side.len() + users.len() <= cap
            && self.copy_cost(inp, &users) <= budget
        {
            for i in users {
                self.lingering.remove(&i);
                self.side.insert(i.clone());
                workloads.insert(i);
            }
        }
    }

    /// How many IP set members moving `ifaces` to the side table would copy there (sets their
    /// policies and profiles use that the side table does not have yet).
    fn copy_cost(&self, inp: &Inputs, ifaces: &BTreeSet<String>) -> usize {
        let m = inp.model;
        let mut refs = Refs::default();
        for wep in ifaces.iter().filter_map(|i| winner(inp, i)) {
            refs.workload(wep);
        }
        let mut ids = BTreeSet::new();
        refs.ipsets(m, &mut ids);
        ids.iter()
            .filter(|id| !self.side_ipset_refs.contains_key(*id))
            .filter_map(|id| m.ipsets.get(id))
            .map(Members::len)
            .sum()
    }

    /// Records the Felix IP sets a side-table policy/profile key references; sets whose use
    /// count starts or ends join `ipsets`.
    fn set_side_ipsets(
        &mut self,
        key: Key,
        uses: BTreeSet<String>,
        ipsets: &mut BTreeSet<(Tbl, String)>,
    ) {
        let old = if uses.is_empty() {
            self.side_ipsets_of.remove(&key)
        } else {
            self.side_ipsets_of.insert(key, uses.clone())
        }
        .unwrap_or_default();
        for id in uses.difference(&old) {
            let n = self.side_ipset_refs.entry(id.clone()).or_default();
            *n += 1;
            if *n == 1 {
                ipsets.insert((Tbl::Side, id.clone()));
            }
        }
        for id in old.difference(&uses) {
            if let Some(n) = self.side_ipset_refs.get_mut(id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.side_ipset_refs.remove(id);
                    ipsets.insert((Tbl::Side, id.clone()));
                }
            }
        }
    }

    /// Records `source`'s new references; policies/profiles whose direction set changed are
    /// added to the to-render lists.
    fn set_source_refs(
        &mut self,
        source: Source,
        refs: Refs,
        owners: &mut BTreeSet<(Tbl, Layer, RuleOwner)>,
    ) {
        if self.source_refs.get(&source).map_or(
            refs.policies.is_empty() && refs.profiles.is_empty(),
            |old| *old == refs,
        ) {
            return;
        }
        let old = self.source_refs.remove(&source).unwrap_or_default();
        let t = match source {
            Source::Workload(t, _) => t,
            Source::HostEndpoint(_) => Tbl::Main,
        };
        users(
            &mut self.policy_users,
            &source,
            &old.policies,
            &refs.policies,
        );
        users(
            &mut self.profile_users,
            &source,
            &old.profiles,
            &refs.profiles,
        );
        let (mut policies, mut profiles) = (BTreeSet::new(), BTreeSet::new());
        adjust(
            &mut self.policy_refs,
            t,
            &old.policies,
            &refs.policies,
            &mut policies,
        );
        adjust(
            &mut self.profile_refs,
            t,
            &old.profiles,
            &refs.profiles,
            &mut profiles,
        );
        owners.extend(
            policies
                .into_iter()
                .map(|(t, l, id)| (t, l, RuleOwner::Policy(id))),
        );
        owners.extend(
            profiles
                .into_iter()
                .map(|(t, l, n)| (t, l, RuleOwner::Profile(n))),
        );
        if !(refs.policies.is_empty() && refs.profiles.is_empty()) {
            self.source_refs.insert(source, refs);
        }
    }

    /// Makes `key` produce exactly `chains` and `sets` from now on.
    fn replace(
        &mut self,
        key: Key,
        mut chains: Vec<(Tbl, Family, Chain)>,
        sets: Vec<(Tbl, Family, Set)>,
        pending: &mut Pending,
    ) {
        for (_, _, c) in &mut chains {
            share_rules(&mut self.bodies, &mut self.bodies_swept, c);
        }
        self.replace_shared(key, chains, sets, pending);
    }

    /// [`Incremental::replace`] for chains whose rules are shared already.
    fn replace_shared(
        &mut self,
        key: Key,
        chains: Vec<(Tbl, Family, Chain)>,
        sets: Vec<(Tbl, Family, Set)>,
        pending: &mut Pending,
    ) {
        let mut now = Produced::default();
        for (t, f, c) in chains {
            let k = (t, f, c.name.clone());
            if now.chains.contains(&k) {
                continue;
            }
            *self.chain_users.entry(k.clone()).or_default() += 1;
            now.chains.push(k.clone());
            pending.chains.insert(k, Some(c));
        }
        // Users are counted up before the old ones are counted down, so a set this key keeps
        // never drops to zero in between.
        for (t, f, s) in sets {
            let k = (t, f, s.name.clone());
            *self.set_users.entry(k.clone()).or_default() += 1;
            now.sets.push(k.clone());
            pending.sets.insert(k, Some(s));
        }
        // What the key made before goes unless it made it again (nothing, in a full render).
        let old = self.produced.remove(&key).unwrap_or_default();
        for c in old.chains {
            let users = self.chain_users.entry(c.clone()).or_default();
            *users = users.saturating_sub(1);
            if *users == 0 {
                self.chain_users.remove(&c);
                pending.chains.insert(c, None);
            }
        }
        for s in old.sets {
            let users = self.set_users.entry(s.clone()).or_default();
            *users = users.saturating_sub(1);
            if *users == 0 {
                self.set_users.remove(&s);
                pending.sets.insert(s, None);
            }
        }
        if !(now.chains.is_empty() && now.sets.is_empty()) {
            self.produced.insert(key, now);
        }
    }

    fn patches(&self, pending: Pending) -> Vec<TablePatch> {
        let mut out: BTreeMap<(Tbl, Family), TablePatch> = BTreeMap::new();
        fn patch(
            out: &mut BTreeMap<(Tbl, Family), TablePatch>,
            t: Tbl,
            f: Family,
        ) -> &mut TablePatch {
            out.entry((t, f))
                .or_insert_with(|| TablePatch::new(f, t.name()))
        }
        for ((t, f, name), c) in pending.chains {
            patch(&mut out, t, f).chains.insert(name, c);
        }
        for ((t, f, name), s) in pending.sets {
            patch(&mut out, t, f).sets.insert(name, s);
        }
        for ((t, f, name), mut d) in pending.set_elements {
            // A set replaced or removed in the same patch already says it all.
            if out.get(&(t, f)).is_some_and(|p| p.sets.contains_key(&name)) {
                continue;
            }
            for v in [&mut d.del, &mut d.add] {
                v.sort();
                v.dedup();
            }
            if !(d.del.is_empty() && d.add.is_empty()) {
                patch(&mut out, t, f).elements.insert(name, d);
            }
        }
        for ((t, family, map), mut d) in pending.elements {
            d.del.sort();
            d.add.sort();
            if d.del.is_empty() && d.add.is_empty() {
                continue;
            }
            for &f in self
                .families
                .iter()
                .filter(|&&f| family.is_none_or(|g| g == f))
            {
                patch(&mut out, t, f)
                    .elements
                    .insert(map.clone(), d.clone());
            }
        }
        out.into_values().filter(|p| !p.is_empty()).collect()
    }
}

/// Makes `c`'s rules hold the copy of their expressions already rendered elsewhere (in
/// `bodies`), if any. Endpoint chains repeat a few bodies thousands of times, with only the
/// comments (the rule ids) differing: at 5,000 endpoints 148,000 rules have 4,000 distinct
/// bodies, and sharing them halves the desired state's memory.
fn share_rules(
    bodies: &mut HashSet<Exprs, foldhash::fast::RandomState>,
    swept: &mut usize,
    c: &mut Chain,
) {
    for r in &mut c.rules {
        match bodies.get(&r.exprs[..]) {
            Some(b) => r.exprs = b.clone(),
            None => {
                bodies.insert(r.exprs.clone());
            }
        }
    }
    // Bodies no rule holds any more go when the set has doubled since the last sweep.
    if bodies.len() > 2 * (*swept).max(4096) {
        bodies.retain(|b| b.holders() > 1);
        *swept = bodies.len();
    }
}

/// Moves `source` between the user lists of the policies (or profiles) it stopped and started
/// referencing.
fn users<K: Ord + Clone>(
    lists: &mut BTreeMap<K, BTreeSet<Source>>,
    source: &Source,
    old: &BTreeMap<(Layer, K), Dirs>,
    new: &BTreeMap<(Layer, K), Dirs>,
) {
    for (_, k) in old.keys() {
        if !new.keys().any(|(_, n)| n == k) {
            if let Some(s) = lists.get_mut(k) {
                s.remove(source);
                if s.is_empty() {
                    lists.remove(k);
                }
            }
        }
    }
    for (_, k) in new.keys() {
        match lists.get_mut(k) {
            Some(s) => {
                if !s.contains(source) {
                    s.insert(source.clone());
                }
            }
            None => {
                lists.insert(k.clone(), BTreeSet::from([source.clone()]));
            }
        }
    }
}

/// The directions with a live reference.
fn live_dirs(c: Option<&DirCounts>) -> Vec<Direction> {
    let [inbound, outbound] = c.copied().unwrap_or_default();
    [
        (Direction::Inbound, inbound),
        (Direction::Outbound, outbound),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(d, _)| d)
    .collect()
}

/// Moves the reference counts of one source in table `t` from `old` to `new` (per layer and
/// policy or profile); keys whose direction set changed go to `dirty`.
fn adjust<K: Ord + Clone>(
    counts: &mut BTreeMap<(Tbl, Layer, K), DirCounts>,
    t: Tbl,
    old: &BTreeMap<(Layer, K), Dirs>,
    new: &BTreeMap<(Layer, K), Dirs>,
    dirty: &mut BTreeSet<(Tbl, Layer, K)>,
) {
    for ((l, k), dirs) in new {
        let c = counts.entry((t, *l, k.clone())).or_default();
        for d in dirs.iter() {
            let n = count_of(c, d);
            *n += 1;
            if *n == 1 {
                dirty.insert((t, *l, k.clone()));
            }
        }
    }
    for ((l, k), dirs) in old {
        // An old reference was counted when it was made, so its key is there.
        let Some(c) = counts.get_mut(&(t, *l, k.clone())) else {
            continue;
        };
        for d in dirs.iter() {
            let n = count_of(c, d);
            *n = n.saturating_sub(1);
            if *n == 0 {
                dirty.insert((t, *l, k.clone()));
            }
        }
    }
}

/// Renders everything from scratch through the incremental path, as whole tables (one-shot
/// commands; equals [`super::render`] of the same inputs).
pub fn render_all(inp: &Inputs) -> Result<Vec<Table>, RulesError> {
    let mut inc = Incremental::new(Renderer::new(inp.model.config.clone())?);
    let patches = inc.update(
        inp,
        &Changes {
            all: true,
            ..Changes::default()
        },
    );
    let mut tables = Vec::new();
    TablePatch::fold_all(patches, &mut tables);
    Ok(tables)
}
