//! Incremental rendering: re-renders only the objects whose inputs changed and says what
//! changed as [`TablePatch`]es, so an update costs what it touches, not the whole state (issue 9).
//!
//! The unit of re-rendering is a [`Key`]: one workload interface, one host endpoint, one Felix
//! IP set, one referenced policy or profile in one layer, or the base (static chains, internal
//! sets, dispatch maps and everything else that depends on the whole endpoint list). Each key
//! remembers the object names it produced; re-rendering a key upserts what it produces now and
//! deletes what it no longer produces. Content-addressed sets shared by several policies are
//! reference-counted. Which policies and profiles exist in the tables follows reference counts
//! per (layer, direction) kept from each endpoint's references, as [`super::render`] computes them.
//!
//! The result is always exactly what [`super::render`] gives for the same model (the test
//! `tests/rules_incremental.rs` checks this after every step of random update sequences).

use std::collections::{BTreeMap, BTreeSet};

use crate::nft::build::TextTable;
use crate::nft::model::{Chain, Element, ElementDelta, Family, Set, Table, TablePatch};
use crate::proto::types::{HostEndpoint, HostEndpointId, PolicyId, WorkloadEndpointId};

use super::{
    names, render_base_head, render_dispatch_maps, render_hep_statics, render_policy,
    render_profile, render_workload_derived, Direction, Layer, Model, Refs, Renderer, RulesError,
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
    pub ipsets: BTreeSet<String>,
}

impl Changes {
    pub fn any(&self) -> bool {
        self.all
            || self.base
            || self.host_endpoints
            || !self.workloads.is_empty()
            || !self.policies.is_empty()
            || !self.profiles.is_empty()
            || !self.ipsets.is_empty()
    }

    /// Folds `other` into `self` (changes not yet rendered are kept across a failed apply).
    pub fn merge(&mut self, other: Changes) {
        self.all |= other.all;
        self.base |= other.base;
        self.host_endpoints |= other.host_endpoints;
        self.workloads.extend(other.workloads);
        self.policies.extend(other.policies);
        self.profiles.extend(other.profiles);
        self.ipsets.extend(other.ipsets);
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

/// The unit of re-rendering.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// Static chains, internal sets, host dispatch, NAT-outgoing, CIDR block and the dispatch
    /// maps in full (their workload elements change by deltas otherwise).
    Base,
    /// RPF skip and floating IPs: they depend on the workloads as a whole.
    WorkloadDerived,
    Workload(String),
    HostEndpoint(String),
    IpSet(String),
    Policy(Layer, PolicyId),
    Profile(Layer, String),
}

/// An endpoint that references policies and profiles.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Workload(String),
    HostEndpoint(String),
}

/// Object names one key produced.
#[derive(Debug, Clone, Default)]
struct Produced {
    chains: Vec<(Family, String)>,
    sets: Vec<(Family, String)>,
}

/// Reference counts of one policy or profile per direction.
type DirCounts = BTreeMap<Direction, u32>;

/// The incremental renderer's memory of what it rendered.
pub struct Incremental {
    r: Renderer,
    families: Vec<Family>,
    produced: BTreeMap<Key, Produced>,
    /// Users of each set (content-addressed policy sets are shared).
    set_users: BTreeMap<(Family, String), u32>,
    policy_refs: BTreeMap<(Layer, PolicyId), DirCounts>,
    profile_refs: BTreeMap<(Layer, String), DirCounts>,
    source_refs: BTreeMap<Source, Refs>,
    /// Host endpoint interfaces rendered last time.
    hep_ifaces: BTreeSet<String>,
    /// The dispatch-map elements (from, to) of each workload interface in the tables.
    wl_dispatch: BTreeMap<String, (Element, Element)>,
}

/// Upserts and deletes collected during one update, per family.
#[derive(Default)]
struct Pending {
    chains: BTreeMap<(Family, String), Option<Chain>>,
    sets: BTreeMap<(Family, String), Option<Set>>,
    /// Element deltas of the dispatch maps (every family).
    elements: BTreeMap<String, ElementDelta>,
}

impl Incremental {
    pub fn new(r: Renderer) -> Incremental {
        Incremental {
            families: r.families(),
            r,
            produced: BTreeMap::new(),
            set_users: BTreeMap::new(),
            policy_refs: BTreeMap::new(),
            profile_refs: BTreeMap::new(),
            source_refs: BTreeMap::new(),
            hep_ifaces: BTreeSet::new(),
            wl_dispatch: BTreeMap::new(),
        }
    }

    /// Re-renders what `changes` touches and returns the patches (one per table; empty
    /// patches are left out).
    pub fn update(&mut self, inp: &Inputs, changes: &Changes) -> Vec<TablePatch> {
        let m = inp.model;
        let mut pending = Pending::default();
        let mut workloads: BTreeSet<String> = changes.workloads.clone();
        let mut policies: BTreeSet<(Layer, PolicyId)> = BTreeSet::new();
        let mut profiles: BTreeSet<(Layer, String)> = BTreeSet::new();
        let mut ipsets: BTreeSet<String> = changes.ipsets.clone();
        let all = changes.all;
        if all {
            workloads.extend(inp.workload_ids.keys().cloned());
            ipsets.extend(m.ipsets.keys().cloned());
            for k in self.produced.keys() {
                match k {
                    Key::Workload(i) => {
                        workloads.insert(i.clone());
                    }
                    Key::IpSet(i) => {
                        ipsets.insert(i.clone());
                    }
                    Key::Policy(l, id) => {
                        policies.insert((*l, id.clone()));
                    }
                    Key::Profile(l, n) => {
                        profiles.insert((*l, n.clone()));
                    }
                    _ => {}
                }
            }
        }
        // A changed policy or profile is re-rendered in every layer that references it.
        for id in &changes.policies {
            for l in [Layer::Filter, Layer::Mangle, Layer::Raw] {
                if self.policy_refs.contains_key(&(l, id.clone())) {
                    policies.insert((l, id.clone()));
                }
            }
        }
        for n in &changes.profiles {
            for l in [Layer::Filter, Layer::Mangle, Layer::Raw] {
                if self.profile_refs.contains_key(&(l, n.clone())) {
                    profiles.insert((l, n.clone()));
                }
            }
        }

        // Workloads.
        for iface in &workloads {
            let wep = inp
                .workload_ids
                .get(iface)
                .and_then(|ids| ids.iter().next())
                .and_then(|id| m.workloads.get(id));
            let mut refs = Refs::default();
            let mut chains = Vec::new();
            if let Some(wep) = wep {
                refs.workload(wep);
                for &f in &self.families {
                    chains.extend(
                        self.r
                            .workload_chains(f, wep)
                            .into_iter()
                            .map(|c| (f, c.chain)),
                    );
                }
            }
            // Dispatch elements: deltas, unless the base re-renders the maps whole below.
            let now = wep.map(|_| self.r.workload_dispatch_elements(iface));
            let before = match &now {
                Some(n) => self.wl_dispatch.insert(iface.clone(), n.clone()),
                None => self.wl_dispatch.remove(iface),
            };
            if before != now {
                let maps = [
                    Layer::Filter.chain(names::logical::FROM_WL_DISPATCH),
                    Layer::Filter.chain(names::logical::TO_WL_DISPATCH),
                ];
                for (i, map) in maps.into_iter().enumerate() {
                    let pick =
                        |p: &(Element, Element)| if i == 0 { p.0.clone() } else { p.1.clone() };
                    let d = pending.elements.entry(map).or_default();
                    d.del.extend(before.as_ref().map(pick));
                    d.add.extend(now.as_ref().map(pick));
                }
            }
            self.replace(
                Key::Workload(iface.clone()),
                chains,
                Vec::new(),
                &mut pending,
            );
            self.set_source_refs(
                Source::Workload(iface.clone()),
                refs,
                &mut policies,
                &mut profiles,
            );
        }

        // Host endpoints (by interface; the smallest id wins).
        let mut heps: BTreeMap<&str, &HostEndpoint> = BTreeMap::new();
        for hep in inp.host_endpoints.values() {
            if !hep.name.is_empty() {
                heps.entry(hep.name.as_str()).or_insert(hep);
            }
        }
        if all || changes.host_endpoints {
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
                    &mut pending,
                );
                self.set_source_refs(
                    Source::HostEndpoint(gone),
                    Refs::default(),
                    &mut policies,
                    &mut profiles,
                );
            }
            for (iface, hep) in &heps {
                let mut chains = Vec::new();
                for &f in &self.families {
                    chains.extend(
                        self.r
                            .host_endpoint_chains(f, iface, hep)
                            .into_iter()
                            .map(|c| (f, c.chain)),
                    );
                }
                self.replace(
                    Key::HostEndpoint(iface.to_string()),
                    chains,
                    Vec::new(),
                    &mut pending,
                );
                let mut refs = Refs::default();
                refs.host_endpoint(iface, hep);
                self.set_source_refs(
                    Source::HostEndpoint(iface.to_string()),
                    refs,
                    &mut policies,
                    &mut profiles,
                );
            }
            self.hep_ifaces = now;
        }

        // Policies and profiles, in the directions still referenced.
        for (layer, id) in &policies {
            let dirs = live_dirs(self.policy_refs.get(&(*layer, id.clone())));
            let (mut chains, mut sets) = (Vec::new(), Vec::new());
            if !dirs.is_empty() {
                for &f in &self.families {
                    let (c, s) = render_policy(&self.r, f, m, (*layer, id), &dirs);
                    chains.extend(c.into_iter().map(|c| (f, c.chain)));
                    sets.extend(s.into_iter().map(|s| (f, s)));
                }
            } else {
                self.policy_refs.remove(&(*layer, id.clone()));
            }
            self.replace(Key::Policy(*layer, id.clone()), chains, sets, &mut pending);
        }
        for (layer, name) in &profiles {
            let dirs = live_dirs(self.profile_refs.get(&(*layer, name.clone())));
            let (mut chains, mut sets) = (Vec::new(), Vec::new());
            if !dirs.is_empty() {
                for &f in &self.families {
                    let (c, s) = render_profile(&self.r, f, m, (*layer, name), &dirs);
                    chains.extend(c.into_iter().map(|c| (f, c.chain)));
                    sets.extend(s.into_iter().map(|s| (f, s)));
                }
            } else {
                self.profile_refs.remove(&(*layer, name.clone()));
            }
            self.replace(
                Key::Profile(*layer, name.clone()),
                chains,
                sets,
                &mut pending,
            );
        }

        // Felix IP sets.
        for id in &ipsets {
            let mut sets = Vec::new();
            if let Some((kind, members)) = m.ipsets.get(id) {
                let members: Vec<String> = members.iter().cloned().collect();
                for &f in &self.families {
                    sets.push((f, self.r.ipset(f, id, *kind, &members)));
                }
            }
            self.replace(Key::IpSet(id.clone()), Vec::new(), sets, &mut pending);
        }

        // The base: whenever anything global or the host endpoints changed.
        if all || changes.base || changes.host_endpoints {
            let (mut chains, mut sets) = (Vec::new(), Vec::new());
            for &f in &self.families {
                let mut t = TextTable::new(f, crate::OWNER);
                render_base_head(&self.r, f, m, &mut t);
                for s in render_dispatch_maps(&self.r, self.wl_dispatch.values().cloned(), &heps) {
                    t.add_set(s);
                }
                render_hep_statics(&self.r, f, m, &heps, &mut t);
                chains.extend(t.table.chains.into_values().map(|c| (f, c)));
                sets.extend(t.table.sets.into_values().map(|s| (f, s)));
            }
            self.replace(Key::Base, chains, sets, &mut pending);
            // The maps went whole.
            pending.elements.clear();
        }
        // RPF skip and floating IPs: whenever a workload changed.
        if all || !workloads.is_empty() {
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
                chains.extend(t.table.chains.into_values().map(|c| (f, c)));
            }
            self.replace(Key::WorkloadDerived, chains, Vec::new(), &mut pending);
        }

        self.patches(pending)
    }

    /// Records `source`'s new references; policies/profiles whose direction set changed are
    /// added to the to-render lists.
    fn set_source_refs(
        &mut self,
        source: Source,
        refs: Refs,
        policies: &mut BTreeSet<(Layer, PolicyId)>,
        profiles: &mut BTreeSet<(Layer, String)>,
    ) {
        let old = if refs.policies.is_empty() && refs.profiles.is_empty() {
            self.source_refs.remove(&source)
        } else {
            self.source_refs.insert(source, refs.clone())
        }
        .unwrap_or_default();
        if old == refs {
            return;
        }
        adjust(
            &mut self.policy_refs,
            &old.policies,
            &refs.policies,
            policies,
        );
        adjust(
            &mut self.profile_refs,
            &old.profiles,
            &refs.profiles,
            profiles,
        );
    }

    /// Makes `key` produce exactly `chains` and `sets` from now on.
    fn replace(
        &mut self,
        key: Key,
        chains: Vec<(Family, Chain)>,
        sets: Vec<(Family, Set)>,
        pending: &mut Pending,
    ) {
        let mut now = Produced::default();
        for (f, c) in chains {
            now.chains.push((f, c.name.clone()));
            pending.chains.insert((f, c.name.clone()), Some(c));
        }
        // Users are counted up before the old ones are counted down, so a set this key keeps
        // never drops to zero in between.
        for (f, s) in sets {
            let k = (f, s.name.clone());
            *self.set_users.entry(k.clone()).or_default() += 1;
            now.sets.push(k.clone());
            pending.sets.insert(k, Some(s));
        }
        let old = if now.chains.is_empty() && now.sets.is_empty() {
            self.produced.remove(&key)
        } else {
            self.produced.insert(key, now.clone())
        }
        .unwrap_or_default();
        let kept: BTreeSet<&(Family, String)> = now.chains.iter().collect();
        for c in old.chains {
            if !kept.contains(&c) {
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
    }

    fn patches(&self, pending: Pending) -> Vec<TablePatch> {
        let mut out: BTreeMap<Family, TablePatch> = BTreeMap::new();
        for ((f, name), c) in pending.chains {
            out.entry(f)
                .or_insert_with(|| TablePatch::new(f, crate::OWNER))
                .chains
                .insert(name, c);
        }
        for ((f, name), s) in pending.sets {
            out.entry(f)
                .or_insert_with(|| TablePatch::new(f, crate::OWNER))
                .sets
                .insert(name, s);
        }
        for (map, mut d) in pending.elements {
            d.del.sort();
            d.add.sort();
            if d.del.is_empty() && d.add.is_empty() {
                continue;
            }
            for &f in &self.families {
                out.entry(f)
                    .or_insert_with(|| TablePatch::new(f, crate::OWNER))
                    .elements
                    .insert(map.clone(), d.clone());
            }
        }
        out.into_values().filter(|p| !p.is_empty()).collect()
    }
}

/// The directions with a live reference.
fn live_dirs(c: Option<&DirCounts>) -> Vec<Direction> {
    c.map(|c| c.iter().filter(|(_, n)| **n > 0).map(|(d, _)| *d).collect())
        .unwrap_or_default()
}

/// Moves reference counts from `old` to `new`; keys whose direction set changed go to `dirty`.
fn adjust<K: Ord + Clone>(
    counts: &mut BTreeMap<K, DirCounts>,
    old: &BTreeMap<K, BTreeSet<Direction>>,
    new: &BTreeMap<K, BTreeSet<Direction>>,
    dirty: &mut BTreeSet<K>,
) {
    for (k, dirs) in new {
        let c = counts.entry(k.clone()).or_default();
        for d in dirs {
            let n = c.entry(*d).or_default();
            *n += 1;
            if *n == 1 {
                dirty.insert(k.clone());
            }
        }
    }
    for (k, dirs) in old {
        let c = counts.entry(k.clone()).or_default();
        for d in dirs {
            let n = c.entry(*d).or_default();
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(d);
                dirty.insert(k.clone());
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
