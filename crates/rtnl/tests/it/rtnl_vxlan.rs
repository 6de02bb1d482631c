//! Privileged: the VXLAN device is created with the spec's parameters, corrected in place (MTU,
//! address, admin state) or re-created (VNI, port, MAC, parent), and its permanent FDB entries
//! follow the desired set one write per change, with stray and deleted entries repaired on a
//! resync. `ip -d -j link`, `ip -j addr` and `bridge -j fdb` are the oracles.

use testkit::rtnl as rtnl_common;

use std::net::IpAddr;

use rtnl::link;
use rtnl::vxlan::{VxlanSpec, VxlanSyncer};
use rtnl::RtnlHandle;
use rtnl_common::{in_netns_async, ip_json, run_in, veth_up};

fn vxlan_info() -> serde_json::Value {
    let l = ip_json(None, &["-d", "link", "show", "vxlan.calico"]);
    l[0].clone()
}

/// (mac, dst) of the permanent FDB entries on vxlan.calico.
fn fdb() -> Vec<(String, String)> {
    let out = run_in(
        None,
        &["bridge", "-j", "fdb", "show", "dev", "vxlan.calico"],
    );
    let v: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_default();
    let mut e: Vec<(String, String)> = v
        .iter()
        .filter(|e| e["state"] == "permanent")
        .map(|e| {
            (
                e["mac"].as_str().unwrap_or("").to_string(),
                e["dst"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    e.sort();
    e
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn the_vxlan_device_and_its_fdb_converge_and_are_repaired() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        veth_up(&h, "eth0", "peer0").await;
        link::add_address(&h, "eth0", "172.31.0.10/24".parse().unwrap())
            .await
            .unwrap();
        link::create_veth(&h, "eth1", "peer1").await.unwrap();

        let spec = VxlanSpec {
            name: "vxlan.calico".into(),
            vni: 4096,
            port: 4789,
            parent: "eth0".into(),
            local: ip("172.31.0.10"),
            mac: [0x66, 0x11, 0x22, 0x33, 0x44, 0x55],
            mtu: None,
            addr: ip("10.65.0.0"),
        };
        let mut s = VxlanSyncer::new();
        s.set_device(Some(spec.clone()));
        let mac_a = [0x66, 0, 0, 0, 0, 1];
        let mac_b = [0x66, 0, 0, 0, 0, 2];
        s.set_fdb([(mac_a, ip("172.31.0.11")), (mac_b, ip("172.31.0.12"))]);
        let r = s.apply(&h).await.unwrap();
        assert!(r.created && r.fdb_set == 2, "{r:?}");

        let d = vxlan_info();
        let info = &d["linkinfo"]["info_data"];
        assert_eq!(info["id"], 4096, "{d}");
        assert_eq!(info["port"], 4789, "{d}");
        assert_eq!(info["local"], "172.31.0.10", "{d}");
        assert_eq!(info["learning"], false, "{d}");
        assert_eq!(d["address"], "66:11:22:33:44:55", "{d}");
        assert_eq!(d["mtu"], 1450, "auto: the parent's 1500 less 50: {d}");
        assert!(
            d["flags"].to_string().contains("\"UP\""),
            "the device is up: {d}"
        );
        let addrs = ip_json(None, &["-4", "addr", "show", "dev", "vxlan.calico"]);
        assert_eq!(addrs[0]["addr_info"][0]["local"], "10.65.0.0", "{addrs:?}");
        assert_eq!(addrs[0]["addr_info"][0]["prefixlen"], 32, "{addrs:?}");
        assert_eq!(
            fdb(),
            vec![
                ("66:00:00:00:00:01".into(), "172.31.0.11".into()),
                ("66:00:00:00:00:02".into(), "172.31.0.12".into())
            ]
        );

        // Steady state: nothing to do, nothing sent.
        let before = s.stats();
        assert!(!s.needs_apply());
        s.apply(&h).await.unwrap();
        assert_eq!(s.stats(), before);

        // One entry changes: one write, no dump, no link lookup.
        s.set_fdb([(mac_a, ip("172.31.0.11")), (mac_b, ip("172.31.0.22"))]);
        let r = s.apply(&h).await.unwrap();
        let after = s.stats();
        assert_eq!((r.fdb_set, r.fdb_deleted), (1, 0));
        assert_eq!(after.fdb_writes - before.fdb_writes, 1);
        assert_eq!(after.fdb_dumps, before.fdb_dumps);
        assert_eq!(after.link_gets, before.link_gets);
        // One goes: one delete.
        s.set_fdb([(mac_b, ip("172.31.0.22"))]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.fdb_set, r.fdb_deleted), (0, 1));
        assert_eq!(
            fdb(),
            vec![("66:00:00:00:00:02".into(), "172.31.0.22".into())]
        );

        // Drift: a stray entry, the wanted one deleted, an extra address, the device down.
        run_in(
            None,
            &[
                "bridge",
                "fdb",
                "add",
                "66:99:99:99:99:99",
                "dev",
                "vxlan.calico",
                "dst",
                "172.31.0.99",
                "self",
                "permanent",
            ],
        );
        run_in(
            None,
            &[
                "bridge",
                "fdb",
                "del",
                "66:00:00:00:00:02",
                "dev",
                "vxlan.calico",
                "self",
            ],
        );
        run_in(
            None,
            &["ip", "addr", "add", "10.99.0.1/24", "dev", "vxlan.calico"],
        );
        run_in(None, &["ip", "link", "set", "vxlan.calico", "down"]);
        s.request_resync();
        let r = s.apply(&h).await.unwrap();
        assert!(!r.created && r.recreated.is_none(), "{r:?}");
        assert_eq!((r.fdb_set, r.fdb_deleted), (1, 1), "{r:?}");
        assert_eq!(
            fdb(),
            vec![("66:00:00:00:00:02".into(), "172.31.0.22".into())]
        );
        let addrs = ip_json(None, &["-4", "addr", "show", "dev", "vxlan.calico"]);
        assert_eq!(
            addrs[0]["addr_info"].as_array().unwrap().len(),
            1,
            "{addrs:?}"
        );
        assert!(vxlan_info()["flags"].to_string().contains("\"UP\""));

        // An explicit MTU is set in place.
        s.set_device(Some(VxlanSpec {
            mtu: Some(1400),
            ..spec.clone()
        }));
        let r = s.apply(&h).await.unwrap();
        assert!(!r.created && r.recreated.is_none(), "{r:?}");
        assert_eq!(vxlan_info()["mtu"], 1400);

        // A different VNI, port, MAC or parent cannot be changed in place: re-created, with its
        // FDB entries written again.
        for changed in [
            VxlanSpec {
                vni: 4097,
                ..spec.clone()
            },
            VxlanSpec {
                port: 8472,
                ..spec.clone()
            },
            VxlanSpec {
                mac: [0x66, 0xaa, 0xbb, 0xcc, 0xdd, 0xee],
                ..spec.clone()
            },
        ] {
            s.set_device(Some(changed.clone()));
            let r = s.apply(&h).await.unwrap();
            assert!(
                r.created && r.recreated.is_some() && r.fdb_set == 1,
                "{r:?}"
            );
            let d = vxlan_info();
            assert_eq!(d["linkinfo"]["info_data"]["id"], changed.vni, "{d}");
            assert_eq!(d["linkinfo"]["info_data"]["port"], changed.port, "{d}");
            assert_eq!(fdb().len(), 1);
        }

        // Someone deletes the device: the next look re-creates it, entries and all.
        run_in(None, &["ip", "link", "del", "vxlan.calico"]);
        s.device_changed();
        let r = s.apply(&h).await.unwrap();
        assert!(r.created && r.fdb_set == 1, "{r:?}");
        assert_eq!(
            fdb(),
            vec![("66:00:00:00:00:02".into(), "172.31.0.22".into())]
        );

        // A parent that does not exist parks the device.
        s.set_device(Some(VxlanSpec {
            parent: "eth7".into(),
            ..spec.clone()
        }));
        assert!(s.apply(&h).await.unwrap().parked);
    });
}
