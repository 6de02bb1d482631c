//! Endpoint status reporting (§10.3 step 12, §14.1, §14.4): what each endpoint's
//! status is after an apply, and which `FromDataplane` messages tell Felix about the changes.
//!
//! A workload endpoint is `up` iff it is admin up, its interface is oper-up and its interface
//! configuration did not fail; otherwise `down`. A host endpoint is `up` when it resolved to
//! interfaces that are all up, `down` when one is down, `error` when it matched no interface. A
//! deleted endpoint gets an explicit remove. Only changes are sent.

use std::collections::{BTreeMap, BTreeSet};

use felix_api::from_dataplane::Payload as Out;
use felix_api::{
    EndpointStatus, FromDataplane, HostEndpointId, HostEndpointStatusRemove,
    HostEndpointStatusUpdate, WorkloadEndpoint, WorkloadEndpointId, WorkloadEndpointStatusRemove,
    WorkloadEndpointStatusUpdate,
};

/// Status strings Felix understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Up,
    Down,
    Error,
}

impl Status {
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Up => "up",
            Status::Down => "down",
            Status::Error => "error",
        }
    }
}

/// Which endpoints' statuses may have changed. An update touches one endpoint, an interface
/// event the endpoints on that interface: only those are recomputed and compared (at 5,000
/// endpoints recomputing all of them was a fifth of the daemon's apply of one endpoint).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusScope {
    /// Every endpoint.
    pub all: bool,
    /// These workload endpoints (present, or removed since).
    pub workloads: BTreeSet<WorkloadEndpointId>,
    /// Every host endpoint (they are few).
    pub hosts: bool,
}

impl StatusScope {
    pub fn everything() -> StatusScope {
        StatusScope {
            all: true,
            ..StatusScope::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.all && !self.hosts && self.workloads.is_empty()
    }
}

/// Each workload endpoint's status, with the endpoint (borrowed from the model).
pub type WorkloadStatuses<'a> = BTreeMap<&'a WorkloadEndpointId, (Status, &'a WorkloadEndpoint)>;

/// Remembers what was last reported and turns a new snapshot into messages.
#[derive(Debug, Default)]
pub struct StatusReporter {
    workloads: BTreeMap<WorkloadEndpointId, Status>,
    hosts: BTreeMap<HostEndpointId, Status>,
}

impl StatusReporter {
    /// Compares the snapshot with what was reported before; returns the messages to send.
    pub fn update(
        &mut self,
        workloads: &WorkloadStatuses,
        hosts: &BTreeMap<HostEndpointId, Status>,
    ) -> Vec<FromDataplane> {
        self.update_in(workloads, hosts, &StatusScope::everything())
    }

    /// [`StatusReporter::update`] for a snapshot of `scope` only: what the snapshot lacks is
    /// removed only if it is in scope.
    pub fn update_in(
        &mut self,
        workloads: &WorkloadStatuses,
        hosts: &BTreeMap<HostEndpointId, Status>,
        scope: &StatusScope,
    ) -> Vec<FromDataplane> {
        let mut out = Vec::new();
        for (id, (status, ep)) in workloads {
            if self.workloads.get(*id) != Some(status) {
                self.workloads.insert((*id).clone(), *status);
                out.push(msg(Out::WorkloadEndpointStatusUpdate(
                    WorkloadEndpointStatusUpdate {
                        id: Some((*id).clone()),
                        status: Some(EndpointStatus {
                            status: status.as_str().into(),
                        }),
                        endpoint: Some((*ep).clone()),
                    },
                )));
            }
        }
        let gone: Vec<_> = if scope.all {
            self.workloads
                .keys()
                .filter(|id| !workloads.contains_key(*id))
                .cloned()
                .collect()
        } else {
            scope
                .workloads
                .iter()
                .filter(|id| !workloads.contains_key(*id) && self.workloads.contains_key(*id))
                .cloned()
                .collect()
        };
        for id in gone {
            self.workloads.remove(&id);
            out.push(msg(Out::WorkloadEndpointStatusRemove(
                WorkloadEndpointStatusRemove { id: Some(id) },
            )));
        }
        if !(scope.all || scope.hosts) {
            return out;
        }
        for (id, status) in hosts {
            if self.hosts.get(id) != Some(status) {
                self.hosts.insert(id.clone(), *status);
                out.push(msg(Out::HostEndpointStatusUpdate(
                    HostEndpointStatusUpdate {
                        id: Some(id.clone()),
                        status: Some(EndpointStatus {
                            status: status.as_str().into(),
                        }),
                    },
                )));
            }
        }
        let gone: Vec<_> = self
            .hosts
            .keys()
            .filter(|id| !hosts.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            self.hosts.remove(&id);
            out.push(msg(Out::HostEndpointStatusRemove(
                HostEndpointStatusRemove { id: Some(id) },
            )));
        }
        out
    }
}

fn msg(p: Out) -> FromDataplane {
    FromDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wid(n: &str) -> WorkloadEndpointId {
        WorkloadEndpointId {
            orchestrator_id: "k8s".into(),
            workload_id: n.into(),
            endpoint_id: "eth0".into(),
        }
    }

    #[test]
    fn only_changes_and_removes_are_reported() {
        let mut r = StatusReporter::default();
        let ep = WorkloadEndpoint::default();
        let mut w = BTreeMap::new();
        let a = wid("a");
        w.insert(&a, (Status::Down, &ep));
        assert_eq!(r.update(&w, &BTreeMap::new()).len(), 1);
        assert!(
            r.update(&w, &BTreeMap::new()).is_empty(),
            "no change, no message"
        );
        w.insert(&a, (Status::Up, &ep));
        let m = r.update(&w, &BTreeMap::new());
        assert!(matches!(
            &m[0].payload,
            Some(Out::WorkloadEndpointStatusUpdate(u)) if u.status.as_ref().map(|s| s.status.as_str()) == Some("up")
        ));
        let m = r.update(&BTreeMap::new(), &BTreeMap::new());
        assert!(matches!(
            &m[0].payload,
            Some(Out::WorkloadEndpointStatusRemove(_))
        ));
    }
}
