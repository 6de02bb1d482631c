//! The benchmark workload: one Felix-shaped node (W workload endpoints, P policies of R rules,
//! S IP sets of M members, K policies per endpoint and direction), generated once and expressed
//! for every backend — Felix API messages for felix-nft, and the textual states the baselines load
//! (see [`super::shapes`]). The operations of the comparison are mutations of this one model, so
//! every backend is asked to make exactly the same change.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use felix_api::to_dataplane::Payload;
use felix_api::types::{
    protocol::NumberOrName, ActivePolicyUpdate, ActiveProfileUpdate, InSync, IpSetDeltaUpdate,
    IpSetType, IpSetUpdate, Policy, PolicyId, PortRange, Profile, ProfileId, Protocol, Rule,
    TierInfo, ToDataplane, WorkloadEndpoint, WorkloadEndpointId, WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
};

/// The workload's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Scale {
    /// Workload endpoints.
    pub w: usize,
    /// Policies.
    pub p: usize,
    /// Rules per policy.
    pub r: usize,
    /// IP sets (even ids hash:ip, odd ids hash:net).
    pub s: usize,
    /// Members per set.
    pub m: usize,
    /// Policies per endpoint and direction.
    pub k: usize,
}

impl Scale {
    /// The benchmark's named scales.
    pub const SMALL: Scale = Scale {
        w: 100,
        p: 50,
        r: 5,
        s: 50,
        m: 100,
        k: 2,
    };
    pub const MID: Scale = Scale {
        w: 1000,
        p: 500,
        r: 5,
        s: 500,
        m: 200,
        k: 2,
    };
    pub const LARGE: Scale = Scale {
        w: 5000,
        p: 2000,
        r: 5,
        s: 2000,
        m: 200,
        k: 2,
    };
}

impl fmt::Display for Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "W={} P={} R={} S={} M={} K={}",
            self.w, self.p, self.r, self.s, self.m, self.k
        )
    }
}

impl FromStr for Scale {
    type Err = String;

    /// `small`, `mid`, `large`, or `W,P,R,S,M,K`.
    fn from_str(s: &str) -> Result<Scale, String> {
        match s {
            "small" => return Ok(Scale::SMALL),
            "mid" => return Ok(Scale::MID),
            "large" => return Ok(Scale::LARGE),
            _ => {}
        }
        let v: Vec<usize> = s
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("scale {s:?}: not small|mid|large|W,P,R,S,M,K ({e})"))?;
        let [w, p, r, s_, m, k] = v[..] else {
            return Err(format!("scale {s:?}: want six numbers W,P,R,S,M,K"));
        };
        if w == 0 || p < 2 || r == 0 || s_ < 2 || m == 0 || k == 0 {
            return Err(format!(
                "scale {s:?}: need W≥1, P≥2 (ingress and egress policies), R≥1, S≥2 (an ip \
                 and a net set), M≥1, K≥1"
            ));
        }
        Ok(Scale {
            w,
            p,
            r,
            s: s_,
            m,
            k,
        })
    }
}

/// One workload endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its index (names and addresses derive from it).
    pub index: usize,
    /// `cali` + 11 hex digits, as Calico's CNI names host-side veths.
    pub iface: String,
    pub ip: Ipv4Addr,
    /// Policy indices applied on ingress (to the workload) and egress (from it).
    pub ingress: Vec<usize>,
    pub egress: Vec<usize>,
}

/// One allow rule: TCP from (ingress) or to (egress) an IP set, to one port or a port list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    pub set: usize,
    pub ports: Vec<u16>,
}

/// One policy: even indices are ingress policies, odd ones egress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    pub inbound: bool,
    pub rules: Vec<RuleSpec>,
}

/// One IP set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    /// hash:net (an interval set in nft) rather than hash:ip.
    pub net: bool,
    pub members: Vec<String>,
}

/// The whole node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub scale: Scale,
    pub endpoints: Vec<Endpoint>,
    pub policies: Vec<PolicySpec>,
    pub sets: Vec<SetSpec>,
}

/// The profile every endpoint carries (a namespace profile that allows everything).
pub const PROFILE: &str = "kns.bench";

/// The operations timed on a populated ruleset, in the order they run each round.
pub const OPS: [&str; 8] = [
    "add_ep",
    "add_mem_ip",
    "add_mem_net",
    "repl_pol",
    "del_ep",
    "add_50_ep",
    "del_50_ep",
    "noop",
];

/// Endpoints that arrive (and leave) together in `add_50_ep` / `del_50_ep`.
pub const BURST: usize = 50;

fn host_ip(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0A00_0000 + n)
}

fn member_ip(set: usize, i: usize) -> String {
    // hash:ip members from 10.64.0.0/10 upward; distinct for S·M < 4M.
    host_ip(0x40_0000 + (set as u32) * 4096 + i as u32).to_string()
}

fn member_net(set: usize, i: usize) -> String {
    // Non-adjacent /28s inside 11.0.0.0/8 (a gap after each, so no backend can merge
    // neighbours into one interval): room for 2048 sets of 256 members, wrapping beyond.
    let n = ((set as u32 % 2048) * 256 + (i as u32 % 256)) * 32;
    format!("{}/28", Ipv4Addr::from(0x0B00_0000 + n % 0x0100_0000))
}

impl Endpoint {
    fn new(scale: &Scale, index: usize) -> Endpoint {
        // A multiplicative hash spreads the first hex digit the way Calico's hashed names do,
        // so the iptables dispatch trie has its usual 16 branches.
        let h = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
        let half = scale.p / 2;
        let ingress = (0..scale.k)
            .map(|k| 2 * ((index * scale.k + k) % half.max(1)))
            .collect();
        let egress = (0..scale.k)
            .map(|k| (2 * ((index * scale.k + k) % half.max(1)) + 1).min(scale.p - 1))
            .collect();
        Endpoint {
            index,
            iface: format!("cali{:011x}", h & 0xfff_ffff_ffff),
            ip: Ipv4Addr::from(0xC0A8_0000u32 + index as u32),
            ingress,
            egress,
        }
    }
}

impl Workload {
    /// The workload for a scale. Deterministic.
    pub fn generate(scale: Scale) -> Workload {
        let policies = (0..scale.p)
            .map(|p| PolicySpec {
                inbound: p % 2 == 0,
                rules: (0..scale.r).map(|r| rule_spec(&scale, p, r, 0)).collect(),
            })
            .collect();
        let sets = (0..scale.s)
            .map(|s| SetSpec {
                net: s % 2 == 1,
                members: (0..scale.m)
                    .map(|i| {
                        if s % 2 == 1 {
                            member_net(s, i)
                        } else {
                            member_ip(s, i)
                        }
                    })
                    .collect(),
            })
            .collect();
        Workload {
            scale,
            endpoints: (0..scale.w).map(|e| Endpoint::new(&scale, e)).collect(),
            policies,
            sets,
        }
    }

    /// Applies round `round`'s operation `op` (one of [`OPS`]) and returns the Felix messages
    /// that say the same thing.
    pub fn mutate(&mut self, op: &str, round: usize) -> Vec<ToDataplane> {
        match op {
            "add_ep" => {
                let ep = Endpoint::new(&self.scale, self.scale.w + round);
                let msg = wep_update(&ep);
                self.endpoints.push(ep);
                vec![msg]
            }
            "add_mem_ip" | "add_mem_net" => {
                let set = usize::from(op == "add_mem_net");
                let i = self.scale.m + round;
                let member = if set == 1 {
                    member_net(set, i)
                } else {
                    member_ip(set, i)
                };
                self.sets[set].members.push(member.clone());
                vec![msg(Payload::IpsetDeltaUpdate(IpSetDeltaUpdate {
                    id: set_id(set),
                    added_members: vec![member],
                    removed_members: vec![],
                }))]
            }
            "repl_pol" => {
                let scale = self.scale;
                let pol = &mut self.policies[0];
                pol.rules = (0..scale.r)
                    .map(|r| rule_spec(&scale, 0, r, round + 1))
                    .collect();
                vec![policy_update(0, pol)]
            }
            "add_50_ep" => (0..BURST)
                .map(|i| {
                    let ep = Endpoint::new(&self.scale, self.burst_index(round, i));
                    let msg = wep_update(&ep);
                    self.endpoints.push(ep);
                    msg
                })
                .collect(),
            "del_50_ep" => (0..BURST)
                .map(|i| {
                    let idx = self.burst_index(round, i);
                    self.endpoints.retain(|e| e.index != idx);
                    msg(Payload::WorkloadEndpointRemove(WorkloadEndpointRemove {
                        id: Some(wep_id(idx)),
                    }))
                })
                .collect(),
            "del_ep" => {
                let idx = self.scale.w + round;
                self.endpoints.retain(|e| e.index != idx);
                vec![msg(Payload::WorkloadEndpointRemove(
                    WorkloadEndpointRemove {
                        id: Some(wep_id(idx)),
                    },
                ))]
            }
            _ => vec![],
        }
    }

    /// Index of endpoint `i` of round `round`'s burst (clear of `add_ep`'s indices).
    fn burst_index(&self, round: usize, i: usize) -> usize {
        self.scale.w + 10_000 + round * BURST + i
    }

    /// The whole state as Felix messages, ending with `InSync`.
    pub fn messages(&self) -> Vec<ToDataplane> {
        let mut out = Vec::new();
        for (s, set) in self.sets.iter().enumerate() {
            out.push(msg(Payload::IpsetUpdate(IpSetUpdate {
                id: set_id(s),
                members: set.members.clone(),
                r#type: if set.net {
                    IpSetType::Net as i32
                } else {
                    IpSetType::Ip as i32
                },
            })));
        }
        out.push(msg(Payload::ActiveProfileUpdate(ActiveProfileUpdate {
            id: Some(ProfileId {
                name: PROFILE.into(),
            }),
            profile: Some(Profile {
                inbound_rules: vec![allow_all()],
                outbound_rules: vec![allow_all()],
            }),
        })));
        for (p, pol) in self.policies.iter().enumerate() {
            out.push(policy_update(p, pol));
        }
        out.extend(self.endpoints.iter().map(wep_update));
        out.push(msg(Payload::InSync(InSync {})));
        out
    }

    /// The state document (`felix-nft apply`'s input): the messages, one JSON object per line.
    pub fn state_document(&self) -> String {
        let mut s = String::new();
        for m in self.messages() {
            s.push_str(&felix_api::json::encode(&m));
            s.push('\n');
        }
        s
    }

    /// Total IP set members.
    pub fn members(&self) -> usize {
        self.sets.iter().map(|s| s.members.len()).sum()
    }
}

fn rule_spec(scale: &Scale, p: usize, r: usize, variant: usize) -> RuleSpec {
    let set = (p * scale.r + r + variant) % scale.s;
    // Every other rule has a port list (multiport / a port set), as Calico policies often do.
    let ports = if r % 2 == 0 {
        vec![8000 + (r + variant) as u16]
    } else {
        vec![80, 443, 8080 + (r + variant) as u16]
    };
    RuleSpec { set, ports }
}

/// Felix's IP set ID for set `s`.
pub fn set_id(s: usize) -> String {
    format!("s:bench{s}")
}

/// The policy name of policy `p`.
pub fn policy_name(p: usize) -> String {
    format!("pol{p}")
}

pub(super) fn msg(p: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

fn allow_all() -> Rule {
    Rule {
        action: "allow".into(),
        ..Default::default()
    }
}

/// Felix's id of policy `p`.
pub(super) fn policy_id(p: usize) -> PolicyId {
    PolicyId {
        name: policy_name(p),
        namespace: "bench".into(),
        kind: "NetworkPolicy".into(),
    }
}

fn policy_update(p: usize, pol: &PolicySpec) -> ToDataplane {
    let rules: Vec<Rule> = pol
        .rules
        .iter()
        .map(|r| {
            let mut rule = Rule {
                action: "allow".into(),
                protocol: Some(Protocol {
                    number_or_name: Some(NumberOrName::Name("tcp".into())),
                }),
                dst_ports: r
                    .ports
                    .iter()
                    .map(|&p| PortRange {
                        first: p.into(),
                        last: p.into(),
                    })
                    .collect(),
                ..Default::default()
            };
            if pol.inbound {
                rule.src_ip_set_ids = vec![set_id(r.set)];
            } else {
                rule.dst_ip_set_ids = vec![set_id(r.set)];
            }
            rule
        })
        .collect();
    let policy = if pol.inbound {
        Policy {
            inbound_rules: rules,
            ..Default::default()
        }
    } else {
        Policy {
            outbound_rules: rules,
            ..Default::default()
        }
    };
    msg(Payload::ActivePolicyUpdate(ActivePolicyUpdate {
        id: Some(policy_id(p)),
        policy: Some(policy),
    }))
}

fn wep_id(index: usize) -> WorkloadEndpointId {
    WorkloadEndpointId {
        orchestrator_id: "k8s".into(),
        workload_id: format!("bench/pod{index}"),
        endpoint_id: "eth0".into(),
    }
}

fn wep_update(ep: &Endpoint) -> ToDataplane {
    msg(Payload::WorkloadEndpointUpdate(WorkloadEndpointUpdate {
        id: Some(wep_id(ep.index)),
        endpoint: Some(WorkloadEndpoint {
            state: "active".into(),
            name: ep.iface.clone(),
            mac: "ee:ee:ee:ee:ee:ee".into(),
            profile_ids: vec![PROFILE.into()],
            ipv4_nets: vec![format!("{}/32", ep.ip)],
            tiers: vec![TierInfo {
                name: "default".into(),
                ingress_policies: ep.ingress.iter().map(|&p| policy_id(p)).collect(),
                egress_policies: ep.egress.iter().map(|&p| policy_id(p)).collect(),
                default_action: String::new(),
            }],
            ..Default::default()
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_parse() {
        assert_eq!("mid".parse::<Scale>().unwrap(), Scale::MID);
        assert_eq!(
            "10,4,2,4,3,1".parse::<Scale>().unwrap(),
            Scale {
                w: 10,
                p: 4,
                r: 2,
                s: 4,
                m: 3,
                k: 1
            }
        );
        assert!("10,1,2,4,3,1".parse::<Scale>().is_err());
        assert!("huge".parse::<Scale>().is_err());
    }

    #[test]
    fn generation_is_sized_and_distinct() {
        let w = Workload::generate(Scale::SMALL);
        assert_eq!(w.endpoints.len(), 100);
        assert_eq!(w.members(), 5000);
        let mut ifaces: Vec<_> = w.endpoints.iter().map(|e| &e.iface).collect();
        ifaces.sort();
        ifaces.dedup();
        assert_eq!(ifaces.len(), 100);
        assert!(w.endpoints.iter().all(|e| e.iface.len() == 15));
        let mut all: Vec<&String> = w.sets.iter().flat_map(|s| &s.members).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 5000);
        // Ingress policies are inbound ones, egress outbound.
        for e in &w.endpoints {
            assert!(e.ingress.iter().all(|&p| w.policies[p].inbound));
            assert!(e.egress.iter().all(|&p| !w.policies[p].inbound));
        }
    }

    #[test]
    fn a_round_of_ops_returns_to_the_same_endpoints() {
        let mut w = Workload::generate(Scale::SMALL);
        let before = w.endpoints.clone();
        for op in OPS {
            let msgs = w.mutate(op, 0);
            let want = match op {
                "noop" => 0,
                "add_50_ep" | "del_50_ep" => BURST,
                _ => 1,
            };
            assert_eq!(msgs.len(), want, "{op}");
        }
        assert_eq!(w.endpoints, before);
        assert_eq!(w.members(), 5002);
    }
}
