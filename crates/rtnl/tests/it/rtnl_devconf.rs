//! Privileged: every interface sysctl and global lands with the right value — including
//! `rp_filter=0` — in the target namespace only; a second namespace with an interface of the same
//! name is untouched. /proc/sys (read from inside each namespace) is the oracle.

use testkit::rtnl as rtnl_common;

use rtnl::devconf::{set_ipv4_conf, set_proxy_delay, Ipv4Conf, Ipv6Conf, ProcSys};
use rtnl::netns::NetNs;
use rtnl::{link, RtnlHandle};
use rtnl_common::{in_netns_async, new_netns, read_sysctl};

const FILES: [&str; 14] = [
    "net/ipv4/conf/cali1/rp_filter",
    "net/ipv4/conf/cali1/proxy_arp",
    "net/ipv4/conf/cali1/forwarding",
    "net/ipv4/conf/cali1/route_localnet",
    "net/ipv4/neigh/cali1/proxy_delay",
    "net/ipv6/conf/cali1/accept_ra",
    "net/ipv6/conf/cali1/proxy_ndp",
    "net/ipv6/conf/cali1/forwarding",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/rp_filter",
    "net/ipv4/conf/default/rp_filter",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/accept_ra",
    "net/netfilter/nf_conntrack_acct",
];

fn snapshot(ns: &NetNs) -> Vec<(String, String)> {
    FILES
        .iter()
        .map(|f| {
            (
                f.to_string(),
                read_sysctl(Some(ns), &format!("/proc/sys/{f}")),
            )
        })
        .collect()
}

fn get(ns: &NetNs, rel: &str) -> String {
    read_sysctl(Some(ns), &format!("/proc/sys/{rel}"))
}

/// A target and another namespace, each with an up veth `cali1` (same name on purpose: a write
/// that lands in the wrong namespace shows).
async fn two_namespaces_with_cali1() -> (NetNs, NetNs) {
    let (target, other) = (new_netns(), new_netns());
    for ns in [&target, &other] {
        let h = RtnlHandle::connect(Some(ns)).unwrap();
        link::create_veth(&h, "cali1", "peer1").await.unwrap();
        link::set_up(&h, "cali1", true).await.unwrap();
    }
    (target, other)
}

#[test]
fn sysctls_land_in_the_target_namespace_only() {
    in_netns_async(|| async {
        let (target, other) = two_namespaces_with_cali1().await;
        let before_other = snapshot(&other);

        let h = RtnlHandle::connect(Some(&target)).unwrap();
        // rp_filter=2 first, then 0: the zero must really land (the typed builder drops it).
        set_ipv4_conf(&h, "cali1", &[(Ipv4Conf::RpFilter, 2)])
            .await
            .unwrap();
        assert_eq!(get(&target, "net/ipv4/conf/cali1/rp_filter"), "2");
        set_ipv4_conf(
            &h,
            "cali1",
            &[
                (Ipv4Conf::RpFilter, 0),
                (Ipv4Conf::ProxyArp, 1),
                (Ipv4Conf::Forwarding, 1),
                (Ipv4Conf::RouteLocalnet, 1),
            ],
        )
        .await
        .unwrap();
        assert_eq!(
            get(&target, "net/ipv4/neigh/cali1/proxy_delay"),
            "80",
            "kernel default before"
        );
        set_proxy_delay(&h, "cali1", 0).await.unwrap();

        let sys = ProcSys::new(Some(target.try_clone().unwrap()));
        let default_rpf = sys.default_rp_filter();
        assert_eq!(
            default_rpf.to_string(),
            get(&target, "net/ipv4/conf/default/rp_filter")
        );
        sys.set_ipv6_iface("cali1", Ipv6Conf::AcceptRa, 0).unwrap();
        sys.set_ipv6_iface("cali1", Ipv6Conf::ProxyNdp, 1).unwrap();
        sys.set_ipv6_iface("cali1", Ipv6Conf::Forwarding, 1)
            .unwrap();
        sys.write("net/ipv4/ip_forward", "1").unwrap();
        sys.write("net/ipv4/conf/all/rp_filter", "0").unwrap();
        sys.write("net/ipv4/conf/default/rp_filter", "2").unwrap();
        sys.write("net/ipv6/conf/all/forwarding", "1").unwrap();
        sys.write("net/ipv6/conf/default/accept_ra", "0").unwrap();
        sys.write("net/netfilter/nf_conntrack_acct", "1").unwrap();

        let want = [
            ("net/ipv4/conf/cali1/rp_filter", "0"),
            ("net/ipv4/conf/cali1/proxy_arp", "1"),
            ("net/ipv4/conf/cali1/forwarding", "1"),
            ("net/ipv4/conf/cali1/route_localnet", "1"),
            ("net/ipv4/neigh/cali1/proxy_delay", "0"),
            ("net/ipv6/conf/cali1/accept_ra", "0"),
            ("net/ipv6/conf/cali1/proxy_ndp", "1"),
            ("net/ipv6/conf/cali1/forwarding", "1"),
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv4/conf/all/rp_filter", "0"),
            ("net/ipv4/conf/default/rp_filter", "2"),
            ("net/ipv6/conf/all/forwarding", "1"),
            ("net/ipv6/conf/default/accept_ra", "0"),
            ("net/netfilter/nf_conntrack_acct", "1"),
        ];
        for (f, v) in want {
            assert_eq!(get(&target, f), v, "{f} in the target namespace");
        }
        assert_eq!(sys.read("net/ipv4/conf/cali1/proxy_arp").unwrap(), "1");

        // The other namespace, with an interface of the same name, did not move.
        assert_eq!(snapshot(&other), before_other);
        // The values we wrote differ from the other namespace's defaults where it matters, so
        // "untouched" is a real check.
        let other_now: std::collections::BTreeMap<_, _> = snapshot(&other).into_iter().collect();
        assert_eq!(other_now["net/ipv4/conf/cali1/proxy_arp"], "0");
        assert_eq!(other_now["net/ipv4/neigh/cali1/proxy_delay"], "80");
        assert_eq!(other_now["net/ipv6/conf/cali1/accept_ra"], "1");

        // A vanished interface is a distinguishable, benign error on both paths.
        let e = set_ipv4_conf(&h, "gone0", &[(Ipv4Conf::RpFilter, 0)])
            .await
            .unwrap_err();
        assert!(e.is_vanished_interface(), "{e}");
        let e = set_proxy_delay(&h, "gone0", 0).await.unwrap_err();
        assert!(e.is_vanished_interface(), "{e}");
        let e = sys
            .set_ipv6_iface("gone0", Ipv6Conf::AcceptRa, 0)
            .unwrap_err();
        assert!(e.is_vanished_interface(), "{e}");
        // A real refusal is not: an id outside 1..=IPV4_DEVCONF_MAX.
        let e = set_ipv4_conf(&h, "cali1", &[(Ipv4Conf::Other(0), 1)])
            .await
            .unwrap_err();
        assert!(
            !e.is_vanished_interface() && e.errno() == Some(libc::EINVAL),
            "{e:?}"
        );
        let e = sys.write("net/ipv4/no_such_knob", "1").unwrap_err();
        assert!(!e.is_vanished_interface(), "{e}");
    });
}

/// The agent's IPv4 per-interface path (`ProcSys::set_ipv4_iface`, one namespace entry for all
/// four files): the values land, zero included, in the target namespace only; a vanished
/// interface is the benign error; a setting without a file is refused before anything is written.
#[test]
fn ipv4_interface_settings_through_proc_land_in_the_target_namespace_only() {
    in_netns_async(|| async {
        let (target, other) = two_namespaces_with_cali1().await;
        let before_other = snapshot(&other);
        let sys = ProcSys::new(Some(target.try_clone().unwrap()));
        sys.set_ipv4_iface("cali1", &[(Ipv4Conf::RpFilter, 2)])
            .unwrap();
        assert_eq!(get(&target, "net/ipv4/conf/cali1/rp_filter"), "2");
        sys.set_ipv4_iface(
            "cali1",
            &[
                (Ipv4Conf::RouteLocalnet, 1),
                (Ipv4Conf::ProxyArp, 1),
                (Ipv4Conf::Forwarding, 1),
                (Ipv4Conf::RpFilter, 0),
            ],
        )
        .unwrap();
        for (f, v) in [
            ("net/ipv4/conf/cali1/rp_filter", "0"),
            ("net/ipv4/conf/cali1/proxy_arp", "1"),
            ("net/ipv4/conf/cali1/forwarding", "1"),
            ("net/ipv4/conf/cali1/route_localnet", "1"),
        ] {
            assert_eq!(get(&target, f), v, "{f}");
        }
        assert_eq!(snapshot(&other), before_other);

        let e = sys
            .set_ipv4_iface("gone0", &[(Ipv4Conf::ProxyArp, 1)])
            .unwrap_err();
        assert!(e.is_vanished_interface(), "{e}");
        let e = sys
            .set_ipv4_iface("cali1", &[(Ipv4Conf::ProxyArp, 0), (Ipv4Conf::Other(2), 1)])
            .unwrap_err();
        assert!(!e.is_vanished_interface(), "{e}");
        assert_eq!(
            get(&target, "net/ipv4/conf/cali1/proxy_arp"),
            "1",
            "nothing written"
        );
    })
}
