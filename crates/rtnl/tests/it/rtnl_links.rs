//! The link dump (`rtnl::link::list_links`) against `ip -j link` as the oracle: every interface
//! of the target namespace with its index, name, MAC and up/down state, none of another
//! namespace's, with enough interfaces that the dump spans many netlink reads.

use testkit::rtnl as rtnl_common;

use std::collections::BTreeMap;

use rtnl::link::{self, LinkState};
use rtnl_common::{in_netns_async, ip_json, link_flags, netns_with_handle};

fn mac_text(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn the_link_dump_matches_ip_link() {
    in_netns_async(|| async {
        let (target, h) = netns_with_handle();
        let (_other, o) = netns_with_handle();
        link::create_veth(&o, "caliother", "peerother")
            .await
            .unwrap();
        for i in 0..150 {
            link::create_veth(&h, &format!("cali{i}"), &format!("peer{i}"))
                .await
                .unwrap();
            if i % 3 != 0 {
                link::set_up(&h, &format!("cali{i}"), true).await.unwrap();
                link::set_up(&h, &format!("peer{i}"), true).await.unwrap();
            }
        }
        let got: BTreeMap<String, LinkState> = link::list_links(&h)
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.name.clone(), l))
            .collect();
        let want = ip_json(Some(&target), &["link", "show"]);
        assert_eq!(got.len(), want.len(), "{:?}", got.keys());
        assert!(got.len() > 300);
        for w in &want {
            let name = w["ifname"].as_str().unwrap();
            let l = got.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(u64::from(l.index), w["ifindex"].as_u64().unwrap(), "{name}");
            let flags = link_flags(w);
            assert_eq!(l.admin_up, flags.contains(&"UP"), "{name}: {flags:?}");
            // Ethernet links only: `ip` prints a tunnel's address (the `tunl0` a loaded ipip
            // module puts in every namespace) as an IP address.
            if w["link_type"] == "ether" {
                assert_eq!(mac_text(&l.mac), w["address"].as_str().unwrap(), "{name}");
            }
        }
        // Up on both ends: the veth is running.
        assert!(got["cali1"].admin_up && got["cali1"].oper_up);
        assert!(!got["cali0"].admin_up && !got["cali0"].oper_up);
        assert!(!got.contains_key("caliother"));
    })
}
