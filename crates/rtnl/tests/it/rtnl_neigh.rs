//! Privileged: permanent ARP entries appear, are re-asserted after a down/up flap, and go with the
//! endpoint; stray permanent entries on a managed interface go on resync; other interfaces are
//! untouched. `ip -j neigh` is the oracle.

use testkit::rtnl as rtnl_common;

use std::net::IpAddr;

use netlink_packet_route::neighbour::NeighbourState;
use rtnl::link;
use rtnl::neigh::NeighSyncer;
use rtnl::RtnlHandle;
use rtnl_common::{in_netns_async, ip_json, veth_up};

/// (dst, lladdr, states) on `dev`.
fn neighs(dev: &str) -> Vec<(String, String, Vec<String>)> {
    ip_json(None, &["neigh", "show", "dev", dev])
        .iter()
        .map(|n| {
            (
                n["dst"].as_str().unwrap_or("").to_string(),
                n["lladdr"].as_str().unwrap_or("").to_string(),
                n["state"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
            )
        })
        .collect()
}

fn permanent(dev: &str, dst: &str, mac: &str) -> bool {
    neighs(dev)
        .iter()
        .any(|(d, l, s)| d == dst && l == mac && s.iter().any(|x| x == "PERMANENT"))
}

#[test]
fn static_arp_entries_follow_the_endpoint() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        for (a, b) in [("cali1", "peer1"), ("eth9", "peer9")] {
            veth_up(&h, a, b).await;
        }
        let ip1: IpAddr = "10.65.0.1".parse().unwrap();
        let ip2: IpAddr = "10.65.0.2".parse().unwrap();
        let mac1 = [0xee, 0xee, 0xee, 0, 0, 1];

        // A foreign permanent entry elsewhere, and a stray one on the managed interface.
        let idx9 = link::get_link(&h, "eth9").await.unwrap().unwrap().index;
        let idx1 = link::get_link(&h, "cali1").await.unwrap().unwrap().index;
        for (idx, ip) in [(idx9, "10.9.9.9"), (idx1, "10.65.0.99")] {
            h.handle()
                .neighbours()
                .add(idx, ip.parse().unwrap())
                .link_layer_address(&[0xaa, 0, 0, 0, 0, 9])
                .state(NeighbourState::Permanent)
                .execute()
                .await
                .unwrap();
        }

        let mut s = NeighSyncer::new();
        s.set_neighbours("cali1", [(ip1, mac1), (ip2, [0xee, 0xee, 0xee, 0, 0, 2])]);
        let r = s.apply(&h).await.unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.set.len(), 2);
        assert!(
            permanent("cali1", "10.65.0.1", "ee:ee:ee:00:00:01"),
            "{:?}",
            neighs("cali1")
        );
        assert!(permanent("cali1", "10.65.0.2", "ee:ee:ee:00:00:02"));
        assert!(
            !neighs("cali1").iter().any(|(d, ..)| d == "10.65.0.99"),
            "the first apply is a resync: the stray entry on a managed interface is gone"
        );

        // Down/up flap: the kernel flushes the interface's entries; we put them back.
        link::set_up(&h, "cali1", false).await.unwrap();
        assert!(
            !permanent("cali1", "10.65.0.1", "ee:ee:ee:00:00:01"),
            "admin down flushes permanent entries"
        );
        let r = s.apply(&h).await.unwrap();
        assert!(r.set.is_empty(), "nothing dirty");
        s.iface_changed("cali1");
        let r = s.apply(&h).await.unwrap();
        assert_eq!(
            r.parked,
            vec!["cali1".to_string()],
            "down interface parks its entries"
        );
        link::set_up(&h, "cali1", true).await.unwrap();
        s.iface_changed("cali1");
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.set.len(), 2, "{r:?}");
        assert!(permanent("cali1", "10.65.0.1", "ee:ee:ee:00:00:01"));

        // Someone overwrites our entry (e.g. dnsmasq): the resync re-asserts it (replace).
        h.handle()
            .neighbours()
            .add(idx1, ip1)
            .link_layer_address(&[0xbb, 0, 0, 0, 0, 1])
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .unwrap();
        assert!(!permanent("cali1", "10.65.0.1", "ee:ee:ee:00:00:01"));
        s.request_resync();
        s.apply(&h).await.unwrap();
        assert!(permanent("cali1", "10.65.0.1", "ee:ee:ee:00:00:01"));

        // One address leaves, then the endpoint goes.
        s.set_neighbours("cali1", [(ip1, mac1)]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.deleted, vec![("cali1".to_string(), ip2)]);
        assert!(
            r.set.is_empty(),
            "a deletion rewrites no other entry: {r:?}"
        );
        assert!(!neighs("cali1").iter().any(|(d, ..)| d == "10.65.0.2"));
        s.set_neighbours("cali1", []);
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.deleted, vec![("cali1".to_string(), ip1)]);
        assert!(!neighs("cali1")
            .iter()
            .any(|(_, _, st)| st.iter().any(|x| x == "PERMANENT")));

        // The foreign entry on another interface survived everything, including resyncs.
        s.request_resync();
        s.apply(&h).await.unwrap();
        assert!(permanent("eth9", "10.9.9.9", "aa:00:00:00:00:09"));
    });
}
