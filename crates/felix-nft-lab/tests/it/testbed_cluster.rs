//! The cluster bed builds what the machines and the CNI plugin would (checked with `ip -n NAME -j
//! ...` as an independent oracle): an underlay bridge with one port per node; on each node `eth0`
//! with its underlay address and a default route via the underlay's first address; pods laid
//! out as Calico's CNI leaves them; nothing a dataplane programs (no VXLAN device, no routes to
//! pods). Nodes reach each other over the underlay at once. A node removed takes its pods and
//! its bridge port with it; a dropped cluster leaves no namespace, also when the test panics.

use crate::testbed_common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use felix_nft_lab::testbed::cluster::{
    Cluster, ClusterSpec, NodeSpec, NODE_UPLINK, UNDERLAY_BRIDGE,
};
use felix_nft_lab::testbed::probe::{icmp_echo, Verdict};
use felix_nft_lab::testbed::topology::WorkloadSpec;
use testbed_common::{assert_all_gone, block_on, ip_json, netns_present, patient, require_root};

fn node(name: &str, k: u8, pods: &[&str]) -> NodeSpec {
    NodeSpec {
        name: name.to_string(),
        ip: Ipv4Addr::new(172, 31, 0, 10 + k),
        pods: pods
            .iter()
            .enumerate()
            .map(|(i, p)| WorkloadSpec::v4(*p, Ipv4Addr::new(10, 65, k, 2 + i as u8)))
            .collect(),
    }
}

fn bridge_ports(c: &Cluster) -> Vec<String> {
    let mut v: Vec<String> = ip_json(
        c.lan_netns_name(),
        &["link", "show", "master", UNDERLAY_BRIDGE],
    )
    .iter()
    .map(|l| l["ifname"].as_str().unwrap().to_string())
    .collect();
    v.sort();
    v
}

/// As root: a cluster of one flat segment, its namespaces named `prefix-…`.
fn build_flat(prefix: &str) -> Cluster {
    require_root();
    block_on(Cluster::build(&ClusterSpec {
        prefix: prefix.into(),
        ..ClusterSpec::default()
    }))
    .unwrap()
}

fn all_netns(c: &Cluster) -> Vec<String> {
    let mut v = vec![c.lan_netns_name().to_string()];
    for n in c.nodes() {
        v.push(n.netns_name().to_string());
        v.extend(n.pods().iter().map(|p| p.netns_name().to_string()));
    }
    v
}

#[test]
fn builds_nodes_on_one_segment_with_cni_pods_and_removes_everything() {
    let mut c = build_flat("fnt-t-cl");
    assert_eq!(c.gateway(), Ipv4Addr::new(172, 31, 0, 1));
    block_on(c.add_node(&node("n1", 1, &["a", "b"]))).unwrap();
    block_on(c.add_node(&node("n2", 2, &["c"]))).unwrap();
    let names = all_netns(&c);
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(
        names.iter().all(|n| n.starts_with("fnt-t-cl-")),
        "{names:?}"
    );
    assert_eq!(bridge_ports(&c), vec!["port0", "port1"]);

    for (n, ip) in [("n1", "172.31.0.11"), ("n2", "172.31.0.12")] {
        let ns = c.node(n).unwrap().netns_name();
        let links = ip_json(ns, &["addr", "show", "dev", NODE_UPLINK]);
        let addrs: Vec<String> = links[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["family"] == "inet")
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
            .collect();
        assert_eq!(addrs, vec![format!("{ip}/24")], "{n}");
        assert!(links[0]["flags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "UP"));
        let routes = ip_json(ns, &["route", "show", "default"]);
        assert_eq!(routes[0]["gateway"], "172.31.0.1", "{n}: {routes:?}");
        // Nothing a dataplane would program.
        assert!(ip_json(ns, &["link", "show"])
            .iter()
            .all(|l| l["ifname"] != "vxlan.calico"));
        let all = ip_json(ns, &["route", "show"]);
        assert!(
            all.iter()
                .all(|r| !r["dst"].as_str().unwrap_or("").starts_with("10.65.")),
            "{n}: {all:?}"
        );
    }
    // Pods as the CNI plugin leaves them, their host ends in the node's namespace.
    let n1 = c.node("n1").unwrap();
    assert_eq!(n1.pods().len(), 2);
    let b = n1.pod("b").unwrap();
    assert_eq!(b.ipv4, Some(Ipv4Addr::new(10, 65, 1, 3)));
    let host_end = ip_json(n1.netns_name(), &["link", "show", &b.host_ifname]);
    assert_eq!(host_end[0]["address"], "ee:ee:ee:ee:ee:ee");
    let pod_routes = ip_json(b.netns_name(), &["route", "show"]);
    assert!(
        pod_routes
            .iter()
            .any(|r| r["dst"] == "default" && r["gateway"] == "169.254.1.1"),
        "{pod_routes:?}"
    );

    // The underlay carries traffic between nodes with no dataplane at all.
    let v = icmp_echo(
        c.node("n1").unwrap().ns(),
        IpAddr::V4(Ipv4Addr::new(172, 31, 0, 12)),
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(v, Verdict::Pass, "n1 → n2 over the underlay");

    // A pod added later; a third node; then that node removed: its namespaces and its bridge
    // port go, the rest stays.
    block_on(c.add_pod("n2", &WorkloadSpec::v4("d", Ipv4Addr::new(10, 65, 2, 3)))).unwrap();
    assert_eq!(c.node("n2").unwrap().pods().len(), 2);
    block_on(c.add_node(&node("n3", 3, &["e"]))).unwrap();
    let n3: Vec<String> = {
        let n = c.node("n3").unwrap();
        let mut v = vec![n.netns_name().to_string()];
        v.extend(n.pods().iter().map(|p| p.netns_name().to_string()));
        v
    };
    assert_eq!(bridge_ports(&c).len(), 3);
    assert!(c.remove_node("n3"));
    assert!(!c.remove_node("n3"));
    for n in &n3 {
        assert!(!netns_present(n), "{n} still there");
    }
    // The port goes with the node's namespace, which the kernel frees asynchronously.
    let deadline = std::time::Instant::now() + patient(Duration::from_secs(5));
    while bridge_ports(&c).len() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(bridge_ports(&c), vec!["port0", "port1"]);

    let names = all_netns(&c);
    drop(c);
    assert_all_gone(&names);
}

#[test]
fn refuses_nodes_it_cannot_place() {
    let mut c = build_flat("fnt-t-clbad");
    block_on(c.add_node(&node("n1", 1, &[]))).unwrap();
    let lan = c.lan_netns_name().to_string();
    for (bad, why) in [
        (node("n1", 2, &[]), "exists already"),
        (node("n9", 1, &[]), "not a free host address"),
        (
            NodeSpec {
                ip: Ipv4Addr::new(172, 31, 0, 1),
                ..node("gw", 0, &[])
            },
            "not a free host address",
        ),
        (
            NodeSpec {
                ip: Ipv4Addr::new(192, 0, 2, 1),
                ..node("far", 0, &[])
            },
            "not a free host address",
        ),
    ] {
        let e = block_on(c.add_node(&bad)).unwrap_err();
        assert!(e.to_string().contains(why), "{}: {e}", bad.name);
    }
    assert!(
        block_on(c.add_pod("nope", &WorkloadSpec::v4("x", Ipv4Addr::new(10, 65, 9, 2)))).is_err()
    );
    assert_eq!(c.nodes().len(), 1);
    assert_eq!(bridge_ports(&c), vec!["port0"]);
    drop(c);
    assert!(!netns_present(&lan));
}

#[test]
fn routed_segments_reach_each_other_through_the_underlay_namespace() {
    require_root();
    let second: ipnet::Ipv4Net = "172.31.1.0/24".parse().unwrap();
    let overlapping = ClusterSpec {
        prefix: "fnt-t-clovl".into(),
        routed: vec!["172.31.0.128/25".parse().unwrap()],
        ..ClusterSpec::default()
    };
    let e = block_on(Cluster::build(&overlapping)).unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");

    let mut c = block_on(Cluster::build(&ClusterSpec {
        prefix: "fnt-t-clrt".into(),
        routed: vec![second],
        ..ClusterSpec::default()
    }))
    .unwrap();
    block_on(c.add_node(&node("near", 1, &["a"]))).unwrap();
    let far = NodeSpec {
        ip: Ipv4Addr::new(172, 31, 1, 21),
        ..node("far", 2, &["b"])
    };
    block_on(c.add_node(&far)).unwrap();
    assert_eq!(c.segment_of(far.ip), Some((1, second)));
    assert_eq!(c.node("far").unwrap().gateway, Ipv4Addr::new(172, 31, 1, 1));
    // The first address of a routed segment is the router's: no node may take it.
    let e = block_on(c.add_node(&NodeSpec {
        ip: Ipv4Addr::new(172, 31, 1, 1),
        ..node("gw", 3, &[])
    }))
    .unwrap_err();
    assert!(e.to_string().contains("not a free host address"), "{e}");

    // Each bridge holds its segment's gateway address and one node's port.
    let lan = c.lan_netns_name().to_string();
    for (br, gw) in [("br0", "172.31.0.1"), ("br1", "172.31.1.1")] {
        let a = ip_json(&lan, &["addr", "show", "dev", br]);
        let addrs: Vec<&str> = a[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["family"] == "inet")
            .map(|x| x["local"].as_str().unwrap())
            .collect();
        assert_eq!(addrs, vec![gw], "{br}");
        assert_eq!(
            ip_json(&lan, &["link", "show", "master", br]).len(),
            1,
            "{br}"
        );
    }
    let far_ns = c.node("far").unwrap().netns_name().to_string();
    assert_eq!(
        ip_json(&far_ns, &["route", "show", "default"])[0]["gateway"],
        "172.31.1.1"
    );
    // Node to node across the router, both ways, with no dataplane.
    for (from, to) in [("near", "172.31.1.21"), ("far", "172.31.0.11")] {
        let v = icmp_echo(
            c.node(from).unwrap().ns(),
            to.parse().unwrap(),
            Duration::from_secs(2),
        )
        .unwrap();
        assert_eq!(v, Verdict::Pass, "{from} → {to} through the router");
    }
    let names = all_netns(&c);
    drop(c);
    assert_all_gone(&names);
}
