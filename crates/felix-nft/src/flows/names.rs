//! The names a flow's addresses and policy ids resolve to, read from the model: this node's
//! workload and host endpoints by address, remote blocks and hosts by the node they route to,
//! and each policy's tier and position on the endpoints that use it.
//!
//! Built whole from the model (a few microseconds per thousand endpoints) and swapped into the
//! collector as one value, so the collector never holds a lock the loop waits on.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::record::{Endpoint, EndpointKind};
use felix_api::types::{RouteUpdate, Rule, TierInfo};
use felix_nft_rules::names::Direction;
use felix_nft_rules::nflog::policy_id;
use felix_nft_rules::Model;

/// What the collector knows of the names behind addresses and prefixes.
#[derive(Debug, Default, Clone)]
pub struct FlowNames {
    /// This node's endpoints' and own addresses.
    local: HashMap<IpAddr, Endpoint>,
    /// Endpoints owning a wider net than one address (rare), most specific first.
    local_nets: Vec<(IpNet, Endpoint)>,
    /// Remote blocks and nodes' own addresses, most specific first, with their node.
    remote: Vec<(IpNet, String)>,
    /// A policy's id as its prefixes write it → its tier and its index in that tier.
    tiers: HashMap<String, (String, i64)>,
    /// Each prefix too long for the kernel, as hashed → whole: what a hashed prefix in a log
    /// stands for (Felix keeps the same lookup).
    hashed: HashMap<Vec<u8>, Vec<u8>>,
}

impl FlowNames {
    /// The names in `model`, with `routes` (Felix's route updates by destination) for remote
    /// blocks and `hostname` this node's name.
    pub fn from_model(
        model: &Model,
        routes: &std::collections::BTreeMap<String, RouteUpdate>,
        hostname: &str,
    ) -> FlowNames {
        let mut n = FlowNames::default();
        for (id, wep) in &model.workloads {
            // Kubernetes writes the workload as `<namespace>/<pod>`.
            let (namespace, name) = match id.workload_id.split_once('/') {
                Some((ns, pod)) => (ns.to_string(), pod.to_string()),
                None => (String::new(), id.workload_id.clone()),
            };
            let ep = Endpoint {
                kind: EndpointKind::Workload,
                name,
                namespace,
                node: None,
            };
            for net in wep.ipv4_nets.iter().chain(&wep.ipv6_nets) {
                n.add_local(net, &ep);
            }
            n.add_tiers(&wep.tiers);
        }
        for (id, hep) in &model.host_endpoints {
            let name = if hep.name.is_empty() {
                id.endpoint_id.clone()
            } else {
                hep.name.clone()
            };
            let ep = Endpoint {
                kind: EndpointKind::Host,
                name,
                namespace: String::new(),
                node: None,
            };
            for a in hep
                .expected_ipv4_addrs
                .iter()
                .chain(&hep.expected_ipv6_addrs)
            {
                n.add_local(a, &ep);
            }
            n.add_tiers(&hep.tiers);
        }
        let this_node = Endpoint {
            kind: EndpointKind::Host,
            name: hostname.to_string(),
            namespace: String::new(),
            node: None,
        };
        for a in &model.this_host {
            n.local.entry(*a).or_insert_with(|| this_node.clone());
        }
        for r in routes.values() {
            if r.dst_node_name.is_empty() || r.dst_node_name == hostname {
                continue;
            }
            if let Ok(net) = r.dst.parse::<IpNet>() {
                n.remote.push((net, r.dst_node_name.clone()));
            }
        }
        for (node, h) in &model.hosts {
            if node == hostname {
                continue;
            }
            for a in [&h.ipv4_addr, &h.ipv6_addr] {
                if let Some(net) = host_net(a) {
                    n.remote.push((net, node.clone()));
                }
            }
        }
        n.add_hashed(model);
        n.remote
            .sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        n.local_nets
            .sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        n
    }

    fn add_local(&mut self, net: &str, ep: &Endpoint) {
        let Some(net) = host_net(net) else {
            return;
        };
        if net.prefix_len() == net.max_prefix_len() {
            self.local.insert(net.addr(), ep.clone());
        } else {
            self.local_nets.push((net, ep.clone()));
        }
    }

    /// The prefixes of `model`'s rules and tier ends that the kernel gets hashed.
    fn add_hashed(&mut self, model: &Model) {
        use felix_nft_rules::nflog::{self as p, Action, Owner};
        let mut add = |whole: String| {
            let cut = p::cut(&whole);
            if cut != whole {
                self.hashed.insert(cut.into_bytes(), whole.into_bytes());
            }
        };
        let rules = |owner: Owner,
                     id: &str,
                     inbound: &[Rule],
                     outbound: &[Rule],
                     add: &mut dyn FnMut(String)| {
            for (dir, list) in [
                (Direction::Inbound, inbound),
                (Direction::Outbound, outbound),
            ] {
                for (i, r) in list.iter().enumerate() {
                    if let Some(a) = Action::of_rule(&r.action) {
                        add(p::whole_rule_prefix(a, owner, dir, i, id));
                    }
                }
            }
        };
        for (id, pol) in &model.policies {
            if !pol.untracked {
                let id = policy_id(id);
                rules(
                    Owner::Policy,
                    &id,
                    &pol.inbound_rules,
                    &pol.outbound_rules,
                    &mut add,
                );
            }
        }
        for (name, prof) in &model.profiles {
            rules(
                Owner::Profile,
                name,
                &prof.inbound_rules,
                &prof.outbound_rules,
                &mut add,
            );
        }
        let tiers: std::collections::BTreeSet<&str> = (model.workloads.values())
            .flat_map(|w| w.tiers.iter())
            .chain(model.host_endpoints.values().flat_map(|h| h.tiers.iter()))
            .map(|t| t.name.as_str())
            .collect();
        for t in tiers {
            for dir in [Direction::Inbound, Direction::Outbound] {
                for a in [Action::Deny, Action::Pass] {
                    add(p::whole_end_of_tier(a, dir, t));
                }
            }
        }
    }

    fn add_tiers(&mut self, tiers: &[TierInfo]) {
        for t in tiers {
            for list in [&t.ingress_policies, &t.egress_policies] {
                for (i, p) in list.iter().enumerate() {
                    self.tiers
                        .entry(policy_id(p))
                        .or_insert_with(|| (t.name.clone(), i as i64));
                }
            }
        }
    }

    /// Who `ip` is: a local endpoint or this node by name, else a network end named by its
    /// address, with the node it routes to where known.
    pub fn endpoint(&self, ip: IpAddr) -> Endpoint {
        if let Some(ep) = self.local.get(&ip) {
            return ep.clone();
        }
        if let Some((_, ep)) = self.local_nets.iter().find(|(n, _)| n.contains(&ip)) {
            return ep.clone();
        }
        Endpoint {
            kind: EndpointKind::Network,
            name: ip.to_string(),
            namespace: String::new(),
            node: (self.remote.iter().find(|(n, _)| n.contains(&ip))).map(|(_, node)| node.clone()),
        }
    }

    /// The tier of the policy whose prefix id is `id` (`<kind>/<namespace>/<name>`), and its
    /// index in the tier on the first endpoint that lists it.
    pub fn tier_of(&self, id: &str) -> Option<(String, i64)> {
        self.tiers.get(id).cloned()
    }
}

impl super::aggregate::Names for FlowNames {
    fn endpoint(&self, ip: IpAddr) -> Endpoint {
        FlowNames::endpoint(self, ip)
    }

    fn tier_of(&self, policy_id: &str) -> Option<String> {
        self.tiers.get(policy_id).map(|(t, _)| t.clone())
    }

    fn policy_index(&self, policy_id: &str) -> Option<i64> {
        self.tiers.get(policy_id).map(|(_, i)| *i)
    }

    fn full_prefix(&self, hashed: &[u8]) -> Option<Vec<u8>> {
        self.hashed.get(hashed).cloned()
    }
}

/// An address or CIDR as a net (`10.0.0.1` is `10.0.0.1/32`).
fn host_net(s: &str) -> Option<IpNet> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_api::types::{HostMetadataUpdate, PolicyId, WorkloadEndpoint, WorkloadEndpointId};

    fn model() -> Model {
        let mut m = Model::default();
        m.workloads.insert(
            WorkloadEndpointId {
                orchestrator_id: "k8s".into(),
                workload_id: "prod/web-1".into(),
                endpoint_id: "eth0".into(),
            },
            WorkloadEndpoint {
                ipv4_nets: vec!["10.65.0.2/32".into()],
                ipv6_nets: vec!["fd00::2/128".into()],
                tiers: vec![TierInfo {
                    name: "security".into(),
                    ingress_policies: vec![
                        PolicyId {
                            name: "a".into(),
                            namespace: String::new(),
                            kind: "GlobalNetworkPolicy".into(),
                        },
                        PolicyId {
                            name: "deny-web".into(),
                            namespace: "prod".into(),
                            kind: "NetworkPolicy".into(),
                        },
                    ],
                    ..TierInfo::default()
                }],
                ..WorkloadEndpoint::default()
            },
        );
        m.hosts.insert(
            "node-b".into(),
            HostMetadataUpdate {
                hostname: "node-b".into(),
                ipv4_addr: "192.168.0.12".into(),
                ..HostMetadataUpdate::default()
            },
        );
        m.this_host.insert("192.168.0.11".parse().unwrap());
        m
    }

    #[test]
    fn local_endpoints_remote_blocks_and_nodes_are_named() {
        let mut routes = std::collections::BTreeMap::new();
        routes.insert(
            "10.65.1.0/26".to_string(),
            RouteUpdate {
                dst: "10.65.1.0/26".into(),
                dst_node_name: "node-b".into(),
                ..RouteUpdate::default()
            },
        );
        let n = FlowNames::from_model(&model(), &routes, "node-a");
        let web = n.endpoint("10.65.0.2".parse().unwrap());
        assert_eq!(
            (web.kind, web.name.as_str(), web.namespace.as_str()),
            (EndpointKind::Workload, "web-1", "prod")
        );
        assert_eq!(n.endpoint("fd00::2".parse().unwrap()).name, "web-1");
        let me = n.endpoint("192.168.0.11".parse().unwrap());
        assert_eq!((me.kind, me.name.as_str()), (EndpointKind::Host, "node-a"));
        let remote = n.endpoint("10.65.1.7".parse().unwrap());
        assert_eq!(remote.kind, EndpointKind::Network);
        assert_eq!(remote.name, "10.65.1.7");
        assert_eq!(remote.node.as_deref(), Some("node-b"));
        assert_eq!(
            n.endpoint("192.168.0.12".parse().unwrap()).node.as_deref(),
            Some("node-b")
        );
        assert_eq!(n.endpoint("8.8.8.8".parse().unwrap()).node, None);
    }

    #[test]
    fn a_hashed_prefix_resolves_to_the_rule_it_stands_for() {
        use crate::flows::aggregate::Names;
        use felix_api::types::Policy;
        use felix_nft_rules::nflog::{self as p, Action, Owner};
        let mut m = model();
        let long = "a-policy-whose-name-is-long-enough-to-push-its-prefix-past-63-bytes";
        let id = PolicyId {
            name: long.into(),
            namespace: "prod".into(),
            kind: "NetworkPolicy".into(),
        };
        let rule = |action: &str| Rule {
            action: action.into(),
            ..Rule::default()
        };
        m.policies.insert(
            id.clone(),
            Policy {
                inbound_rules: vec![rule("allow"), rule("deny")],
                ..Policy::default()
            },
        );
        let n = FlowNames::from_model(&m, &Default::default(), "node-a");
        let whole = p::whole_rule_prefix(
            Action::Deny,
            Owner::Policy,
            Direction::Inbound,
            1,
            &policy_id(&id),
        );
        let hashed = p::rule_prefix(
            Action::Deny,
            Owner::Policy,
            Direction::Inbound,
            1,
            &policy_id(&id),
        );
        assert!(p::is_hashed(hashed.as_bytes()), "{hashed}");
        assert_eq!(n.full_prefix(hashed.as_bytes()), Some(whole.into_bytes()));
        // A short one is never in the lookup: it is read as it is.
        assert_eq!(n.full_prefix(b"ARI0|allow-all"), None);
    }

    #[test]
    fn a_policy_resolves_to_its_tier_and_index() {
        let n = FlowNames::from_model(&model(), &Default::default(), "node-a");
        let deny_web = policy_id(&PolicyId {
            name: "deny-web".into(),
            namespace: "prod".into(),
            kind: "NetworkPolicy".into(),
        });
        assert_eq!(n.tier_of(&deny_web), Some(("security".to_string(), 1)));
        assert_eq!(n.tier_of("gnp/a"), Some(("security".to_string(), 0)));
        assert_eq!(n.tier_of("gnp/unknown"), None);
    }
}
