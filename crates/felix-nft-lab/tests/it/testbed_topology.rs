//! The topology builds Calico CNI's layout (checked with `ip -n NAME -j ...` as an independent
//! oracle): workload `eth0` with a /32 and a /128, `lo` up, `169.254.1.1 dev eth0 scope link` +
//! `default via 169.254.1.1`, IPv6 default via the host end's link-local gateway; host ends
//! `cali<11 hex>` up with MAC ee:ee:ee:ee:ee:ee and nothing felix-nft would program (no routes to
//! workloads, no proxy_arp, no neighbours); the external namespace is the host's default route.
//! Every namespace is gone after drop, also when the test panics.

use crate::testbed_common;

use std::net::Ipv4Addr;

use felix_nft_lab::testbed::topology::{
    veth_name_for_workload, ExternalSpec, Topology, TopologySpec, WorkloadSpec, EXTERNAL_V4,
    GATEWAY_V6, HOST_EXT_V4,
};
use serde_json::Value;
use testbed_common::{
    assert_all_gone, block_on, ip_json, made_links, netns_present, patient, require_root, run,
};

fn spec() -> TopologySpec {
    TopologySpec {
        prefix: "fnt-t-topo".into(),
        workloads: vec![
            WorkloadSpec::dual(
                "ns1.pod-a",
                Ipv4Addr::new(198, 18, 0, 1),
                "2001:db8:1::1".parse().unwrap(),
            ),
            WorkloadSpec::v4("ns1.pod-b", Ipv4Addr::new(198, 18, 0, 2)),
        ],
        external: Some(ExternalSpec {
            routes_to_workloads: true,
            ipv6: true,
        }),
    }
}

fn all_netns(t: &Topology) -> Vec<String> {
    let mut v = vec![t.host_netns_name().to_string()];
    v.extend(t.workloads().iter().map(|w| w.netns_name().to_string()));
    v.extend(t.external().map(|e| e.netns_name().to_string()));
    v
}

fn addrs_of(netns: &str, ifname: &str) -> Vec<String> {
    let links = ip_json(netns, &["addr", "show", "dev", ifname]);
    links[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["scope"] != "link")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect()
}

fn route_lines(netns: &str, family: &str) -> Vec<String> {
    ip_json(netns, &[family, "route", "show", "table", "main"])
        .iter()
        .filter(|r| r["dst"] != "fe80::/64" && !r["dst"].as_str().unwrap_or("").starts_with("ff"))
        .map(|r| {
            let mut s = r["dst"].as_str().unwrap().to_string();
            if let Some(gw) = r["gateway"].as_str() {
                s += &format!(" via {gw}");
            }
            s += &format!(" dev {}", r["dev"].as_str().unwrap_or("-"));
            if let Some(scope) = r["scope"].as_str() {
                s += &format!(" scope {scope}");
            }
            s
        })
        .collect()
}

#[test]
fn builds_calico_cni_layout_and_removes_everything() {
    require_root();
    let topo = block_on(Topology::build(&spec())).unwrap();
    let names = all_netns(&topo);
    assert_eq!(names.len(), 4);
    for n in &names {
        assert!(netns_present(n), "{n} missing");
    }
    let host = topo.host_netns_name();

    // Workload a: dual stack.
    let a = topo.workload("ns1.pod-a").unwrap();
    assert_eq!(a.host_ifname, veth_name_for_workload("ns1.pod-a"));
    assert_eq!(a.ifname, "eth0");
    let wl = a.netns_name();
    let links = ip_json(wl, &["link"]);
    let mut ifnames = made_links(&links);
    ifnames.sort();
    assert_eq!(ifnames, ["eth0", "lo"]);
    let made = links
        .iter()
        .filter(|l| l["ifname"].as_str().is_some_and(|n| ifnames.contains(&n)));
    for l in made {
        let flags: Vec<&str> = l["flags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert!(flags.contains(&"UP"), "{} not up: {flags:?}", l["ifname"]);
    }
    let eth0 = links.iter().find(|l| l["ifname"] == "eth0").unwrap();
    assert_eq!(eth0["address"].as_str().unwrap(), a.mac_string());
    assert_eq!(addrs_of(wl, "eth0"), ["198.18.0.1/32", "2001:db8:1::1/128"]);
    assert_eq!(
        route_lines(wl, "-4"),
        [
            "default via 169.254.1.1 dev eth0",
            "169.254.1.1 dev eth0 scope link"
        ]
    );
    assert_eq!(
        route_lines(wl, "-6"),
        [
            "2001:db8:1::1 dev eth0".to_string(),
            format!("default via {GATEWAY_V6} dev eth0")
        ]
    );

    // What a test sends felix-nft for it.
    let ep = a.endpoint(&["kns.ns1"]);
    assert_eq!(ep.state, "active");
    assert_eq!(ep.name, a.host_ifname);
    assert_eq!(ep.mac, eth0["address"].as_str().unwrap());
    assert_eq!(ep.ipv4_nets, ["198.18.0.1/32"]);
    assert_eq!(ep.ipv6_nets, ["2001:db8:1::1/128"]);
    assert_eq!(ep.profile_ids, ["kns.ns1"]);
    assert_eq!(a.endpoint_id().workload_id, "ns1.pod-a");

    // Workload b: IPv4 only.
    let b = topo.workload("ns1.pod-b").unwrap();
    assert_eq!(addrs_of(b.netns_name(), "eth0"), ["198.18.0.2/32"]);
    assert_ne!(a.mac, b.mac);

    // Host: cali ends up, MAC ee:ee:..., no addresses, no workload routes, no proxy_arp.
    let hlinks = ip_json(host, &["link"]);
    for w in topo.workloads() {
        let l = hlinks
            .iter()
            .find(|l| l["ifname"] == w.host_ifname.as_str())
            .unwrap_or_else(|| panic!("{} missing in host: {hlinks:?}", w.host_ifname));
        assert_eq!(l["address"], "ee:ee:ee:ee:ee:ee");
        assert_eq!(l["operstate"], "UP", "{l}");
        assert!(addrs_of(host, &w.host_ifname).is_empty());
        let proxy = run(
            &[
                "ip",
                "netns",
                "exec",
                host,
                "cat",
                &format!("/proc/sys/net/ipv4/conf/{}/proxy_arp", w.host_ifname),
            ],
            None,
        );
        assert_eq!(proxy.trim(), "0", "the bed must not program proxy_arp");
        // The IPv6 gateway is the host end's own link-local address.
        let ll = ip_json(host, &["-6", "addr", "show", "dev", &w.host_ifname]);
        let has_gw = ll[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["local"] == GATEWAY_V6.to_string().as_str());
        assert!(has_gw, "{GATEWAY_V6} not on {}: {ll:?}", w.host_ifname);
    }
    assert_eq!(
        route_lines(host, "-4"),
        [
            format!("default via {EXTERNAL_V4} dev ext0"),
            "192.0.2.0/30 dev ext0 scope link".to_string()
        ],
        "host routes must be only the node's own (felix-nft adds workload routes)"
    );
    let neigh: Vec<Value> = ip_json(host, &["neigh", "show", "nud", "permanent"]);
    assert!(neigh.is_empty(), "no static ARP from the bed: {neigh:?}");

    // External: routes back to the workloads via the host.
    let ext = topo.external().unwrap();
    assert_eq!(
        addrs_of(ext.netns_name(), "eth0"),
        ["192.0.2.2/30", "2001:db8:ffff::2/64"]
    );
    let er = route_lines(ext.netns_name(), "-4");
    assert!(
        er.contains(&format!("198.18.0.1 via {HOST_EXT_V4} dev eth0")),
        "{er:?}"
    );
    assert!(
        er.contains(&format!("198.18.0.2 via {HOST_EXT_V4} dev eth0")),
        "{er:?}"
    );

    drop(topo);
    assert_all_gone(&names);
}

#[test]
fn workloads_come_and_go_like_pods() {
    require_root();
    let mut topo = block_on(Topology::build(&TopologySpec {
        prefix: "fnt-t-topo".into(),
        ..Default::default()
    }))
    .unwrap();
    let c = WorkloadSpec::v4("c", Ipv4Addr::new(198, 18, 0, 3));
    let wl = block_on(topo.add_workload(&c))
        .unwrap()
        .netns_name()
        .to_string();
    let cali = veth_name_for_workload("c");
    let host = topo.host_netns_name().to_string();
    assert!(ip_json(&host, &["link"])
        .iter()
        .any(|l| l["ifname"] == cali.as_str()));
    assert!(
        block_on(topo.add_workload(&c)).is_err(),
        "duplicate name accepted"
    );
    assert!(block_on(topo.add_workload(&WorkloadSpec {
        name: "none".into(),
        ipv4: None,
        ipv6: None
    }))
    .is_err());
    // A pod re-created at once under the same name gets the same cali name (the bed waits for
    // the kernel to free the old one).
    assert!(topo.remove_workload("c"));
    assert!(!netns_present(&wl));
    let wl = block_on(topo.add_workload(&c))
        .unwrap()
        .netns_name()
        .to_string();
    assert!(topo.remove_workload("c"));
    assert!(!netns_present(&wl));
    // The host end dies with the workload namespace (asynchronously, in the kernel's netns
    // cleanup work).
    let deadline = std::time::Instant::now() + patient(std::time::Duration::from_secs(5));
    while ip_json(&host, &["link"])
        .iter()
        .any(|l| l["ifname"] == cali.as_str())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{cali} survived its workload"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!topo.remove_workload("c"));
}

#[test]
fn a_panic_mid_test_still_deletes_every_namespace() {
    require_root();
    let (tx, rx) = std::sync::mpsc::channel();
    let r = std::panic::catch_unwind(move || {
        let topo = block_on(Topology::build(&spec())).unwrap();
        tx.send(all_netns(&topo)).unwrap();
        panic!("scenario failed while the topology is up");
    });
    assert!(r.is_err());
    let names = rx.recv().unwrap();
    assert_eq!(names.len(), 4);
    for n in &names {
        assert!(!netns_present(n), "{n} survived a panic");
    }
}

#[test]
fn keep_leaves_namespaces_for_inspection_until_deleted() {
    require_root();
    let topo = block_on(Topology::build(&TopologySpec {
        prefix: "fnt-t-keep".into(),
        workloads: vec![WorkloadSpec::v4("k", Ipv4Addr::new(198, 18, 0, 9))],
        external: Some(ExternalSpec {
            routes_to_workloads: false,
            ipv6: false,
        }),
    }))
    .unwrap();
    let host = topo.host_netns_name().to_string();
    let names = topo.keep();
    assert_eq!(names.len(), 3);
    assert_eq!(names[0], host);
    assert!(names[2].contains("-wl-k-"), "{names:?}");
    for n in &names {
        assert!(netns_present(n), "{n} not kept");
    }
    // Still a working layout after the guards are gone.
    assert!(ip_json(&host, &["link"])
        .iter()
        .any(|l| l["ifname"] == "ext0"));
    for n in &names {
        rtnl::netns::NetNs::delete_named(n).unwrap();
        assert!(!netns_present(n), "{n} left behind");
    }
}

#[test]
fn twenty_workloads_build_and_go_quickly() {
    require_root();
    let spec = TopologySpec {
        prefix: "fnt-t-scale".into(),
        workloads: (1..=20)
            .map(|i| {
                WorkloadSpec::dual(
                    format!("w{i}"),
                    Ipv4Addr::new(198, 18, 1, i),
                    format!("2001:db8:2::{i}").parse().unwrap(),
                )
            })
            .collect(),
        external: Some(ExternalSpec {
            routes_to_workloads: true,
            ipv6: true,
        }),
    };
    let t = std::time::Instant::now();
    let topo = block_on(Topology::build(&spec)).unwrap();
    let built = t.elapsed();
    let names = all_netns(&topo);
    assert_eq!(names.len(), 22);
    let t = std::time::Instant::now();
    drop(topo);
    let dropped = t.elapsed();
    assert_all_gone(&names);
    println!("20 dual-stack workloads + external: build {built:?}, teardown {dropped:?}");
    assert!(
        built < patient(std::time::Duration::from_secs(10)),
        "build took {built:?}"
    );
}
