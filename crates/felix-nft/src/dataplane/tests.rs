//! Unit tests of the desired-state core (no kernel).

use proptest::prelude::*;

use super::status::StatusReporter;
use super::*;
use felix_api::{
    FromDataplane, HostEndpointRemove, HostEndpointUpdate, HostMetadataUpdate,
    WorkloadEndpointRemove, WorkloadEndpointUpdate,
};
use rtnl::link::LinkState;
use rtnl::monitor::IfaceEvent;

#[derive(Clone, Debug)]
enum Ev {
    Wep { id: u8, iface: u8, active: bool },
    WepGone(u8),
    Link { iface: u8, up: bool },
    LinkGone(u8),
    Hep { id: u8, iface: u8 },
    HepGone(u8),
    ConfFailed(u8),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0u8..6, 0u8..4, any::<bool>()).prop_map(|(id, iface, active)| Ev::Wep {
            id,
            iface,
            active
        }),
        (0u8..6).prop_map(Ev::WepGone),
        (0u8..6, any::<bool>()).prop_map(|(iface, up)| Ev::Link { iface, up }),
        (0u8..6).prop_map(Ev::LinkGone),
        (0u8..2, 4u8..6).prop_map(|(id, iface)| Ev::Hep { id, iface }),
        (0u8..2).prop_map(Ev::HepGone),
        (0u8..4).prop_map(Ev::ConfFailed),
    ]
}

fn iface(i: u8) -> String {
    if i < 4 {
        format!("cali{i}")
    } else {
        format!("eth{i}")
    }
}

fn wid(id: u8) -> WorkloadEndpointId {
    WorkloadEndpointId {
        orchestrator_id: "k8s".into(),
        workload_id: format!("w{id}"),
        endpoint_id: "eth0".into(),
    }
}

fn hid(id: u8) -> HostEndpointId {
    HostEndpointId {
        endpoint_id: format!("h{id}"),
    }
}

fn msg(p: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

fn event(dp: &mut Dataplane, e: &Ev) {
    match *e {
        Ev::Wep {
            id,
            iface: i,
            active,
        } => {
            let ep = WorkloadEndpoint {
                state: if active { "active" } else { "inactive" }.into(),
                name: iface(i),
                ..WorkloadEndpoint::default()
            };
            let u = WorkloadEndpointUpdate {
                id: Some(wid(id)),
                endpoint: Some(ep),
            };
            dp.on_update(&msg(Payload::WorkloadEndpointUpdate(u)))
                .unwrap();
        }
        Ev::WepGone(id) => {
            let r = WorkloadEndpointRemove { id: Some(wid(id)) };
            dp.on_update(&msg(Payload::WorkloadEndpointRemove(r)))
                .unwrap();
        }
        Ev::Link { iface: i, up } => dp.on_iface(&IfaceEvent::Link(LinkState {
            index: u32::from(i) + 10,
            name: iface(i),
            admin_up: up,
            oper_up: up,
            mac: vec![0xee; 6],
            mtu: 1500,
        })),
        Ev::LinkGone(i) => dp.on_iface(&IfaceEvent::Removed {
            index: u32::from(i) + 10,
            name: iface(i),
        }),
        Ev::Hep { id, iface: i } => {
            let u = HostEndpointUpdate {
                id: Some(hid(id)),
                endpoint: Some(HostEndpoint {
                    name: iface(i),
                    ..HostEndpoint::default()
                }),
            };
            dp.on_update(&msg(Payload::HostEndpointUpdate(u))).unwrap();
        }
        Ev::HepGone(id) => {
            let r = HostEndpointRemove { id: Some(hid(id)) };
            dp.on_update(&msg(Payload::HostEndpointRemove(r))).unwrap();
        }
        Ev::ConfFailed(i) => dp.iface_conf_failed(&iface(i)),
    }
}

fn sorted(mut m: Vec<FromDataplane>) -> Vec<String> {
    let mut v: Vec<String> = m.drain(..).map(|m| format!("{m:?}")).collect();
    v.sort();
    v
}

proptest! {
    /// Recomputing only the endpoints an event may have touched reports exactly what
    /// recomputing every endpoint reports, after every batch of events.
    #[test]
    fn scoped_statuses_report_what_full_statuses_report(
        evs in proptest::collection::vec(ev(), 1..40),
        batch in 1usize..4,
    ) {
        let mut dp = Dataplane::new(DataplaneConfig::default(), 1).unwrap();
        let (mut full, mut scoped) = (StatusReporter::default(), StatusReporter::default());
        for chunk in evs.chunks(batch) {
            for e in chunk {
                event(&mut dp, e);
            }
            let want = {
                let (w, h) = dp.statuses();
                sorted(full.update(&w, &h))
            };
            let got = match dp.take_status_dirty() {
                Some(scope) => {
                    let (w, h) = dp.statuses_in(&scope);
                    sorted(scoped.update_in(&w, &h, &scope))
                }
                None => Vec::new(),
            };
            prop_assert_eq!(got, want, "after {:?}", chunk);
        }
    }
}

fn vtep(node: &str, n: u8) -> Payload {
    Payload::VtepUpdate(felix_api::VxlanTunnelEndpointUpdate {
        node: node.into(),
        mac: format!("66:00:00:00:00:{n:02x}"),
        ipv4_addr: format!("10.65.{n}.0"),
        parent_device_ip: format!("172.31.0.1{n}"),
        ..Default::default()
    })
}

/// The IPv4 table as `nft` would print it.
fn v4_table_text(dp: &Dataplane) -> String {
    nf_tables::print::table(&v4_table(dp))
}

fn v4_table(dp: &Dataplane) -> nf_tables::model::Table {
    let tables = dp.render_tables().unwrap();
    tables
        .into_iter()
        .find(|t| t.family == nf_tables::model::Family::Ip)
        .unwrap()
}

/// The start addresses of the intervals of an IPv4 interval set.
fn v4_set_elements(dp: &Dataplane, set: &str) -> String {
    let t = v4_table(dp);
    t.sets[set]
        .elements
        .iter()
        .filter(|e| e.flags & nf_tables::model::elem_flags::INTERVAL_END == 0)
        .map(|e| {
            let k: [u8; 4] = e.key[..4].try_into().unwrap();
            std::net::Ipv4Addr::from(k).to_string()
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn vteps_turn_the_vxlan_rules_on_and_change_the_vtep_set_by_element() {
    let mut cfg = DataplaneConfig::default();
    cfg.rules.hostname = "n0".into();
    cfg.overlay.hostname = "n0".into();
    let mut dp = Dataplane::new(cfg, 1).unwrap();
    let _ = dp.tables_patch();
    assert!(!v4_table_text(&dp).contains("VXLAN packets from allowed hosts"));

    // VXLAN is not configured: the first VTEP turns it on (Encapsulation may come later).
    dp.on_update(&msg(vtep("n0", 0))).unwrap();
    dp.on_update(&msg(vtep("n1", 1))).unwrap();
    let _ = dp.tables_patch();
    let text = v4_table_text(&dp);
    assert!(text.contains("VXLAN packets from allowed hosts"), "{text}");
    assert!(text.contains("notrack"), "VXLAN is untracked: {text}");
    assert!(
        text.contains("[ masq"),
        "host traffic leaving the tunnel is masqueraded: {text}"
    );
    let set_line = v4_set_elements(&dp, "cali40all-vxlan-net");
    assert!(set_line.contains("172.31.0.11"), "{set_line}");
    assert!(
        !set_line.contains("172.31.0.10"),
        "this node's own VTEP is not a remote host: {set_line}"
    );

    // One more VTEP: one element more, nothing else rendered again.
    dp.on_update(&msg(vtep("n5", 5))).unwrap();
    let patches = dp.tables_patch();
    let mut added = Vec::new();
    for p in &patches {
        assert!(
            p.chains.is_empty() && p.sets.is_empty(),
            "no chain or whole set: {:?} {:?}",
            p.chains.keys(),
            p.sets.keys()
        );
        for (set, d) in &p.elements {
            assert!(set.ends_with("all-vxlan-net"), "only the VTEP set: {set}");
            assert!(d.del.is_empty(), "{d:?}");
            added.extend(d.add.iter().cloned());
        }
    }
    assert_eq!(
        added,
        [nf_tables::build::addr_element(
            "172.31.0.15".parse().unwrap()
        )]
    );
    assert!(v4_set_elements(&dp, "cali40all-vxlan-net").contains("172.31.0.15"));
    // It leaves: one element less.
    dp.on_update(&msg(Payload::VtepRemove(
        felix_api::VxlanTunnelEndpointRemove { node: "n5".into() },
    )))
    .unwrap();
    let patches = dp.tables_patch();
    let dels: Vec<_> = patches
        .iter()
        .flat_map(|p| p.elements.values())
        .flat_map(|d| d.del.iter().cloned())
        .collect();
    assert_eq!(
        dels,
        [nf_tables::build::addr_element(
            "172.31.0.15".parse().unwrap()
        )]
    );
    assert!(!v4_set_elements(&dp, "cali40all-vxlan-net").contains("172.31.0.15"));
}

#[test]
fn this_host_holds_the_tunnel_address_of_its_own_vxlan_device() {
    let this_host = |dp: &Dataplane| v4_set_elements(dp, "cali40this-host");
    let mut cfg = DataplaneConfig::default();
    cfg.rules.hostname = "n0".into();
    cfg.overlay.hostname = "n0".into();
    let mut dp = Dataplane::new(cfg.clone(), 1).unwrap();
    dp.on_update(&msg(vtep("n1", 1))).unwrap();
    assert_eq!(this_host(&dp), "", "a remote VTEP is not this host");
    // This node's VTEP: its device will hold the tunnel address.
    dp.on_update(&msg(vtep("n0", 0))).unwrap();
    assert_eq!(this_host(&dp), "10.65.0.0");
    // The address appearing on the device changes nothing in the tables.
    let _ = dp.tables_patch();
    dp.on_iface(&IfaceEvent::Addrs {
        index: 9,
        name: "vxlan.calico".into(),
        addrs: ["10.65.0.0/32".parse().unwrap()].into(),
    });
    assert!(dp.tables_patch().iter().all(|p| p.is_empty()));
    dp.on_update(&msg(Payload::VtepRemove(
        felix_api::VxlanTunnelEndpointRemove { node: "n0".into() },
    )))
    .unwrap();
    assert_eq!(this_host(&dp), "10.65.0.0", "the device still holds it");

    // VXLAN off: the VTEP's address is not the host's.
    cfg.overlay.vxlan_enabled = Some(false);
    let mut dp = Dataplane::new(cfg, 1).unwrap();
    dp.on_update(&msg(vtep("n0", 0))).unwrap();
    assert_eq!(this_host(&dp), "");
}

#[test]
fn external_nodes_are_allowed_hosts_and_vteps() {
    let mut cfg = DataplaneConfig::default();
    cfg.rules.vxlan_enabled = true;
    cfg.rules.external_nodes = vec!["192.0.2.0/24".into()];
    let dp = Dataplane::new(cfg, 1).unwrap();
    for set in ["all-vxlan-net", "all-hosts-net"] {
        let line = v4_set_elements(&dp, &format!("cali40{set}"));
        assert!(line.contains("192.0.2.0"), "{set}: {line}");
    }
}

#[test]
fn host_metadata_of_every_felix_version_fills_the_host_sets_by_element() {
    use felix_api::{HostMetadataRemove, HostMetadataV6};
    let mut dp = Dataplane::new(DataplaneConfig::default(), 1).unwrap();
    let _ = dp.tables_patch();
    let hosts_v6 = |dp: &Dataplane| {
        let tables = dp.render_tables().unwrap();
        let t = tables
            .iter()
            .find(|t| t.family == nf_tables::model::Family::Ip6)
            .unwrap();
        t.sets["cali60all-hosts-net"]
            .elements
            .iter()
            .filter(|e| e.flags & nf_tables::model::elem_flags::INTERVAL_END == 0)
            .map(|e| {
                let k: [u8; 16] = e.key[..16].try_into().unwrap();
                std::net::Ipv6Addr::from(k).to_string()
            })
            .collect::<Vec<_>>()
    };
    // Felix 3.31/3.32: the IPv4 address, the IPv6 address apart, then both in CIDR form.
    dp.on_update(&msg(Payload::HostMetadataUpdate(HostMetadataUpdate {
        hostname: "h1".into(),
        ipv4_addr: "172.31.0.11".into(),
        ..Default::default()
    })))
    .unwrap();
    dp.on_update(&msg(Payload::HostMetadataV6Update(HostMetadataV6 {
        hostname: "h1".into(),
        ipv6_addr: "fd00:31::11".into(),
    })))
    .unwrap();
    let patches = dp.tables_patch();
    assert!(patches.iter().all(|p| p.chains.is_empty()), "sets only");
    assert_eq!(hosts_v6(&dp), ["fd00:31::11"]);
    assert_eq!(v4_set_elements(&dp, "cali40all-hosts-net"), "172.31.0.11");
    dp.on_update(&msg(Payload::HostMetadataV4v6Update(HostMetadataUpdate {
        hostname: "h2".into(),
        ipv4_addr: "172.31.0.20/24".into(),
        ipv6_addr: "fd00:31::20/64".into(),
        ..Default::default()
    })))
    .unwrap();
    assert_eq!(hosts_v6(&dp), ["fd00:31::11", "fd00:31::20"]);
    // A bad address is refused with the message and field named.
    let e = dp
        .on_update(&msg(Payload::HostMetadataV6Update(HostMetadataV6 {
            hostname: "h3".into(),
            ipv6_addr: "172.31.0.30".into(),
        })))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("host_metadata_v6_update") && e.contains("ipv6_addr"),
        "{e}"
    );
    // The v6 half goes, the v4 half stays; the V4V6 remove takes the whole host.
    dp.on_update(&msg(Payload::HostMetadataV6Remove(HostMetadataV6 {
        hostname: "h1".into(),
        ipv6_addr: String::new(),
    })))
    .unwrap();
    dp.on_update(&msg(Payload::HostMetadataV4v6Remove(HostMetadataRemove {
        hostname: "h2".into(),
        ipv4_addr: String::new(),
    })))
    .unwrap();
    assert!(hosts_v6(&dp).is_empty());
    assert_eq!(v4_set_elements(&dp, "cali40all-hosts-net"), "172.31.0.11");
}

/// Overlay events of the delta property: a remote node's VTEP (MAC generation `gen`) or host
/// address (generation `gen`) comes or goes, a block of the VXLAN or the IPIP pool routed to a
/// node comes or goes, moves to another node or flips same-subnet.
#[derive(Clone, Debug)]
enum Ov {
    Vtep {
        node: u8,
        gen: u8,
    },
    VtepGone(u8),
    Host {
        node: u8,
        gen: u8,
    },
    HostGone(u8),
    Block {
        block: u8,
        node: u8,
        same_subnet: bool,
        ipip: bool,
    },
    BlockGone {
        block: u8,
        ipip: bool,
    },
}

fn ov() -> impl Strategy<Value = Ov> {
    prop_oneof![
        (1u8..6, 0u8..3).prop_map(|(node, gen)| Ov::Vtep { node, gen }),
        (1u8..6).prop_map(Ov::VtepGone),
        (1u8..6, 0u8..3).prop_map(|(node, gen)| Ov::Host { node, gen }),
        (1u8..6).prop_map(Ov::HostGone),
        (0u8..8, 1u8..6, any::<bool>(), any::<bool>()).prop_map(
            |(block, node, same_subnet, ipip)| Ov::Block {
                block,
                node,
                same_subnet,
                ipip
            }
        ),
        (0u8..8, any::<bool>()).prop_map(|(block, ipip)| Ov::BlockGone { block, ipip }),
    ]
}

/// The pool of the delta property's blocks (VXLAN: 10.66/16, IPIP: 10.67/16).
fn ov_pool(ipip: bool) -> (IpPoolType, u8) {
    if ipip {
        (IpPoolType::Ipip, 67)
    } else {
        (IpPoolType::Vxlan, 66)
    }
}

fn ov_msg(e: &Ov) -> ToDataplane {
    use felix_api::{RouteRemove, VxlanTunnelEndpointRemove};
    msg(match *e {
        Ov::Vtep { node, gen } => Payload::VtepUpdate(VxlanTunnelEndpointUpdate {
            node: format!("n{node}"),
            // A generation may reuse another node's MAC: entries moving between nodes.
            mac: format!("66:00:00:00:{gen:02x}:{:02x}", node % 3),
            ipv4_addr: format!("10.65.{node}.0"),
            parent_device_ip: format!("172.31.0.{}", 10 + node),
            ..Default::default()
        }),
        Ov::VtepGone(node) => Payload::VtepRemove(VxlanTunnelEndpointRemove {
            node: format!("n{node}"),
        }),
        Ov::Host { node, gen } => Payload::HostMetadataUpdate(HostMetadataUpdate {
            hostname: format!("n{node}"),
            ipv4_addr: format!("172.31.{gen}.{}", 10 + node),
            ..Default::default()
        }),
        Ov::HostGone(node) => Payload::HostMetadataRemove(felix_api::HostMetadataRemove {
            hostname: format!("n{node}"),
            ..Default::default()
        }),
        Ov::Block {
            block,
            node,
            same_subnet,
            ipip,
        } => {
            let (pool, b) = ov_pool(ipip);
            Payload::RouteUpdate(RouteUpdate {
                types: RouteType::RemoteWorkload as i32,
                ip_pool_type: pool as i32,
                dst: format!("10.{b}.{block}.0/26"),
                dst_node_name: format!("n{node}"),
                dst_node_ip: format!("172.31.0.{}", 10 + node),
                same_subnet,
                ..Default::default()
            })
        }
        Ov::BlockGone { block, ipip } => Payload::RouteRemove(RouteRemove {
            dst: format!("10.{}.{block}.0/26", ov_pool(ipip).1),
        }),
    })
}

/// The overlay part of a desired state: FDB and neighbour entries per device, route groups.
#[derive(Debug, Default, PartialEq)]
struct OverlayState {
    fdb: BTreeMap<String, BTreeMap<Mac, IpAddr>>,
    neigh: BTreeMap<String, BTreeMap<IpAddr, Mac>>,
    routes: BTreeMap<String, Vec<RouteSpec>>,
}

impl OverlayState {
    fn full(d: &Desired) -> OverlayState {
        use rtnl::vxlan::Entries;
        let mut s = OverlayState::default();
        for v in &d.vxlan {
            let Entries::All(all) = &v.fdb else {
                panic!("a full state lists every FDB entry");
            };
            s.fdb.insert(v.name.clone(), all.iter().copied().collect());
            s.neigh.insert(
                v.name.clone(),
                d.neighbours
                    .get(&v.name)
                    .into_iter()
                    .flatten()
                    .copied()
                    .collect(),
            );
        }
        s.routes = d
            .routes
            .iter()
            .filter(|(g, _)| g.starts_with("overlay "))
            .map(|(g, r)| (g.clone(), r.clone()))
            .collect();
        s
    }

    /// Folds a delta in, as the syncers do.
    fn fold(&mut self, d: &Desired) {
        use rtnl::vxlan::Entries;
        assert!(d.overlay_delta, "{d:#?}");
        for v in &d.vxlan {
            let Entries::Changed(changed) = &v.fdb else {
                panic!("a delta lists changed FDB entries");
            };
            let fdb = self.fdb.entry(v.name.clone()).or_default();
            for &(mac, ip) in changed {
                match ip {
                    Some(ip) => fdb.insert(mac, ip),
                    None => fdb.remove(&mac),
                };
            }
            let neigh = self.neigh.entry(v.name.clone()).or_default();
            for &(ip, mac) in &v.neighbour_changes {
                match mac {
                    Some(mac) => neigh.insert(ip, mac),
                    None => neigh.remove(&ip),
                };
            }
        }
        for g in &d.overlay_groups {
            match d.routes.get(g).filter(|r| !r.is_empty()) {
                Some(r) => self.routes.insert(g.clone(), r.clone()),
                None => self.routes.remove(g),
            };
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Remote nodes and blocks coming, going and changing cost deltas that add up to what the
    /// whole overlay computed again would state, for VXLAN and IPIP blocks alike.
    #[test]
    fn overlay_deltas_add_up_to_the_whole_overlay(
        chunks in prop::collection::vec(prop::collection::vec(ov(), 1..5), 1..8),
    ) {
        let mut cfg = DataplaneConfig::default();
        cfg.overlay.hostname = "me".into();
        cfg.overlay.ipip_routes = true;
        let mut dp = Dataplane::new(cfg, 1).unwrap();
        dp.on_iface(&IfaceEvent::Link(LinkState {
            index: 2,
            name: "eth0".into(),
            admin_up: true,
            oper_up: true,
            mac: vec![2, 0, 0, 0, 0, 1],
            mtu: 1500,
        }));
        dp.on_iface(&IfaceEvent::Addrs {
            index: 2,
            name: "eth0".into(),
            addrs: ["172.31.0.10/24".parse().unwrap()].into(),
        });
        dp.on_update(&msg(Payload::IpamPoolUpdate(felix_api::IpamPoolUpdate {
            id: "pool".into(),
            pool: Some(felix_api::IpamPool {
                cidr: "10.66.0.0/16".into(),
                vxlan_mode: "Always".into(),
                ..Default::default()
            }),
        })))
        .unwrap();
        dp.on_update(&msg(Payload::IpamPoolUpdate(felix_api::IpamPoolUpdate {
            id: "ipip".into(),
            pool: Some(felix_api::IpamPool {
                cidr: "10.67.0.0/16".into(),
                ipip_mode: "Always".into(),
                ..Default::default()
            }),
        })))
        .unwrap();
        dp.on_update(&msg(vtep("me", 0))).unwrap();
        dp.on_update(&msg(Payload::HostMetadataUpdate(HostMetadataUpdate {
            hostname: "me".into(),
            ipv4_addr: "172.31.0.10".into(),
            ..Default::default()
        })))
        .unwrap();
        let mut state = OverlayState::full(&dp.desired_host());
        dp.dirty = Dirty::clean();
        for chunk in &chunks {
            for e in chunk {
                // Invalid sequences (a block on a node's address...) are refused; fine.
                let _ = dp.on_update(&ov_msg(e));
            }
            prop_assert!(!dp.dirty.overlay(), "only remote nodes changed: {:?}", chunk);
            if dp.dirty.overlay_delta_keys().is_some() {
                state.fold(&dp.desired_host_in(Some(&BTreeSet::new())));
            }
            dp.dirty = Dirty::clean();
            prop_assert_eq!(&state, &OverlayState::full(&dp.desired_host()), "after {:?}", chunk);
        }
    }
}

/// The model says what an update changed: the interfaces a workload moved between, a repeat
/// as unchanged, the VTEP an update replaced, the hosts-set addresses a host touched, and the
/// members of a delta of an address set (a delta of a set it does not hold is whole).
#[test]
fn the_model_says_what_an_update_changed() {
    let mut m = Model::new(RulesConfig::default());
    let wep = |name: &str| {
        msg(Payload::WorkloadEndpointUpdate(WorkloadEndpointUpdate {
            id: Some(wid(1)),
            endpoint: Some(WorkloadEndpoint {
                name: name.into(),
                state: "active".into(),
                ..Default::default()
            }),
        }))
    };
    let workload = |old: Option<&str>, new: Option<&str>, unchanged| Change::Workload {
        id: Some(wid(1)),
        old_iface: old.map(str::to_string),
        new_iface: new.map(str::to_string),
        unchanged,
    };
    assert_eq!(m.apply(&wep("cali1")), workload(None, Some("cali1"), false));
    assert_eq!(
        m.apply(&wep("cali1")),
        workload(Some("cali1"), Some("cali1"), true)
    );
    assert_eq!(
        m.apply_owned(wep("cali2"), None),
        workload(Some("cali1"), Some("cali2"), false)
    );
    let gone = msg(Payload::WorkloadEndpointRemove(WorkloadEndpointRemove {
        id: Some(wid(1)),
    }));
    assert_eq!(m.apply(&gone), workload(Some("cali2"), None, false));

    let Payload::VtepUpdate(first) = vtep("n1", 1) else {
        unreachable!()
    };
    assert_eq!(
        m.apply(&msg(vtep("n1", 1))),
        Change::Vtep {
            node: "n1".into(),
            old: None
        }
    );
    assert_eq!(
        m.apply(&msg(vtep("n1", 2))),
        Change::Vtep {
            node: "n1".into(),
            old: Some(first)
        }
    );

    let host = |v4: &str| {
        msg(Payload::HostMetadataUpdate(felix_api::HostMetadataUpdate {
            hostname: "h".into(),
            ipv4_addr: v4.into(),
            ..Default::default()
        }))
    };
    m.apply(&host("172.31.0.1/24"));
    assert_eq!(
        m.apply(&host("172.31.0.2")),
        Change::Hosts {
            node: "h".into(),
            addrs: vec!["172.31.0.1".parse().unwrap(), "172.31.0.2".parse().unwrap()]
        }
    );

    let delta = |id: &str| {
        msg(Payload::IpsetDeltaUpdate(felix_api::IpSetDeltaUpdate {
            id: id.into(),
            added_members: vec!["10.0.0.2".into()],
            removed_members: vec!["10.0.0.1".into()],
        }))
    };
    assert_eq!(m.apply(&delta("s")), Change::IpSet("s".into()));
    m.apply(&msg(Payload::IpsetUpdate(felix_api::IpSetUpdate {
        id: "s".into(),
        members: vec!["10.0.0.1".into()],
        r#type: felix_api::IpSetType::Ip as i32,
    })));
    assert_eq!(
        m.apply(&delta("s")),
        Change::IpSetMembers {
            id: "s".into(),
            touched: vec!["10.0.0.1".into(), "10.0.0.2".into()]
        }
    );
    assert_eq!(
        m.apply(&msg(Payload::InSync(Default::default()))),
        Change::None
    );
}

/// Flow logs are on when Felix names a Goldmane server or enables the local reporter.
#[test]
fn flow_logs_are_on_with_goldmane_or_the_local_reporter() {
    use crate::config::{resolve, RawValue, Source};
    let on = |kv: &[(&str, &str)]| {
        let raw = kv
            .iter()
            .map(|(k, v)| RawValue {
                key: k.to_string(),
                value: v.to_string(),
                source: Source::ConfigUpdate,
            })
            .collect();
        let config = resolve(raw).expect("valid config").config;
        DataplaneConfig::from_config(&config).rules.flow_logs
    };
    assert!(!on(&[]));
    assert!(on(&[(
        "FlowLogsGoldmaneServer",
        "goldmane.calico-system.svc:7443"
    )]));
    assert!(on(&[("FlowLogsLocalReporter", "Enabled")]));
    assert!(!on(&[("FlowLogsLocalReporter", "Disabled")]));
}
