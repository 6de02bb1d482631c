//! Privileged: the route syncer converges the main table through add, change, removal and
//! interface re-creation; foreign routes stay; the grace period holds. `ip -j route` is the oracle.

use testkit::rtnl as rtnl_common;

use std::time::Duration;

use rtnl::link;
use rtnl::routes::{RouteOwnership, RouteSpec, RouteSyncer, RouteTarget, RT_TABLE_MAIN};
use rtnl::{IpFamily, RtnlHandle};
use rtnl_common::{device_route, in_netns_async, ip_json, veth_up};

const PROTO: u8 = 80;

/// (dst, dev, protocol, metric) of every main-table route in the test namespace.
fn routes(v6: bool) -> Vec<(String, String, String, u64)> {
    let mut args = vec![];
    if v6 {
        args.push("-6");
    }
    args.extend(["route", "show", "table", "main"]);
    ip_json(None, &args)
        .iter()
        .map(|r| {
            (
                r["dst"].as_str().unwrap_or("").to_string(),
                r["dev"]
                    .as_str()
                    .unwrap_or(r["type"].as_str().unwrap_or(""))
                    .to_string(),
                r["protocol"]
                    .as_str()
                    .map(String::from)
                    .unwrap_or_else(|| r["protocol"].to_string()),
                r["metric"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn has(dst: &str, dev: &str) -> bool {
    routes(dst.contains(':'))
        .iter()
        .any(|(d, v, _, _)| d == dst && v == dev)
}

#[test]
fn routes_converge_through_add_change_remove_and_recreate() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        // With lo down the kernel calls every onlink gateway "invalid" (no local table yet).
        link::set_up(&h, "lo", true).await.unwrap();
        veth_up(&h, "cali1", "peer1").await;
        veth_up(&h, "cali2", "peer2").await;
        // Foreign routes: on a non-workload interface with a foreign protocol.
        link::add_route(&h, "10.99.0.0/24".parse().unwrap(), Some("peer1"), None)
            .await
            .unwrap();

        let own = RouteOwnership::by_prefixes([PROTO], vec!["cali".into()], None);
        let mut s = RouteSyncer::new(IpFamily::V4, RT_TABLE_MAIN, own.clone())
            .with_grace(Duration::from_millis(800));

        // Add.
        s.set_routes("cali1", vec![device_route("10.65.0.1/32", "cali1", PROTO)]);
        s.set_routes(
            "blocks",
            vec![RouteSpec::blackhole(
                "10.65.1.0/26".parse().unwrap(),
                PROTO,
                0,
            )],
        );
        let r = s.apply(&h).await.unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.added.len(), 2, "{r:?}");
        let all = routes(false);
        assert!(
            all.contains(&("10.65.0.1".into(), "cali1".into(), "80".into(), 1024)),
            "{all:?}"
        );
        assert!(
            all.iter()
                .any(|(d, t, p, _)| d == "10.65.1.0/26" && t == "blackhole" && p == "80"),
            "{all:?}"
        );
        let scope = ip_json(None, &["route", "show", "10.65.0.1"]);
        assert_eq!(scope[0]["scope"], "link", "{scope:?}");

        // Converged: a second apply writes nothing (and with nothing dirty, does no I/O).
        s.request_resync();
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.changes(), 0, "{r:?}");
        assert!(s.apply(&h).await.unwrap().skipped);

        // Change: the address moves to another interface (IP reuse) → replaced, reported for
        // conntrack cleanup.
        s.set_routes("cali1", vec![device_route("10.65.0.1/32", "cali2", PROTO)]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.replaced.len(), 1, "{r:?}");
        assert_eq!(r.moved_or_gone, vec!["10.65.0.1/32".parse().unwrap()]);
        assert!(has("10.65.0.1", "cali2") && !has("10.65.0.1", "cali1"));

        // Removal.
        s.set_routes("cali1", vec![]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.deleted.len(), 1, "{r:?}");
        assert!(!routes(false).iter().any(|(d, ..)| d == "10.65.0.1"));

        // Absent interface: parked; down: parked; up: programmed.
        s.set_routes("cali3", vec![device_route("10.65.0.3/32", "cali3", PROTO)]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.parked.len(), 1, "{r:?}");
        // The monitor's events become iface_changed: a parked route waits for one.
        link::create_veth(&h, "cali3", "peer3").await.unwrap();
        s.iface_changed("cali3");
        let r = s.apply(&h).await.unwrap();
        assert_eq!(
            r.parked.len(),
            1,
            "down interface keeps the route parked: {r:?}"
        );
        link::set_up(&h, "cali3", true).await.unwrap();
        link::set_up(&h, "peer3", true).await.unwrap();
        s.iface_changed("cali3");
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.added.len(), r.parked.len()), (1, 0), "{r:?}");
        assert!(has("10.65.0.3", "cali3"));
        let old_index = link::get_link(&h, "cali3").await.unwrap().unwrap().index;

        // Re-creation with a new index: the kernel drops the route with the old link; the next
        // apply (after the monitor's event) re-resolves the name.
        link::delete(&h, "cali3").await.unwrap();
        veth_up(&h, "cali3", "peer3").await;
        let new_index = link::get_link(&h, "cali3").await.unwrap().unwrap().index;
        assert_ne!(old_index, new_index);
        assert!(
            !has("10.65.0.3", "cali3"),
            "kernel removed the route with the old link"
        );
        s.request_resync();
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.added.len(), 1, "{r:?}");
        assert!(has("10.65.0.3", "cali3"));
        let dev_index = ip_json(None, &["-d", "link", "show", "cali3"])[0]["ifindex"]
            .as_u64()
            .unwrap();
        assert_eq!(dev_index, u64::from(new_index));

        // Grace period: a route some other agent (a CNI plugin) put on a workload interface.
        link::add_route(&h, "10.65.9.9/32".parse().unwrap(), Some("cali2"), None)
            .await
            .unwrap();
        s.request_resync();
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.in_grace.len(), 1, "{r:?}");
        assert!(has("10.65.9.9", "cali2"), "kept during the grace period");
        assert!(s.needs_apply() && s.next_deadline().is_some());
        tokio::time::sleep(Duration::from_millis(900)).await;
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.deleted.len(), 1, "{r:?}");
        assert!(!has("10.65.9.9", "cali2"), "deleted after the grace period");

        // A workload route we programmed ourselves with the device protocol (boot, 3 — not one
        // of the "always ours" protocols) goes at once when no longer desired: the grace period
        // is for routes someone else wrote (§15; an admin-down or removed endpoint's route).
        s.set_routes("cali2", vec![device_route("10.65.0.2/32", "cali2", 3)]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.added.len(), 1, "{r:?}");
        s.set_routes("cali2", vec![]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.deleted.len(), r.in_grace.len()), (1, 0), "{r:?}");
        assert!(
            !has("10.65.0.2", "cali2"),
            "our own route waited for the grace"
        );

        // A gateway route (onlink, as Felix's IPIP/no-encap routes) converges too.
        s.set_routes(
            "remote",
            vec![RouteSpec {
                dst: "10.66.0.0/24".parse().unwrap(),
                target: RouteTarget::Gateway {
                    via: "10.200.0.1".parse().unwrap(),
                    dev: Some("cali2".into()),
                    onlink: true,
                },
                protocol: PROTO,
                metric: 0,
                src: None,
                mtu: Some(1400),
            }],
        );
        let r = s.apply(&h).await.unwrap();
        assert!(r.errors.is_empty() && r.added.len() == 1, "{r:?}");
        let gw = ip_json(None, &["route", "show", "10.66.0.0/24"]);
        assert_eq!(gw[0]["gateway"], "10.200.0.1", "{gw:?}");
        assert!(gw[0]["flags"].to_string().contains("onlink"), "{gw:?}");
        // The tunnel MTU travels as RTAX_MTU and is read back, so a resync leaves it in place.
        assert_eq!(gw[0]["metrics"][0]["mtu"], 1400, "{gw:?}");
        s.request_resync();
        assert_eq!(s.apply(&h).await.unwrap().changes(), 0);
        s.set_routes("remote", vec![]);
        assert_eq!(s.apply(&h).await.unwrap().deleted.len(), 1);

        // Foreign routes were never touched.
        assert!(has("10.99.0.0/24", "peer1"));

        // IPv6: the same syncer shape for the other family.
        let mut s6 = RouteSyncer::new(IpFamily::V6, RT_TABLE_MAIN, own);
        s6.set_routes(
            "cali1",
            vec![device_route("fd00:65::1/128", "cali1", PROTO)],
        );
        let r = s6.apply(&h).await.unwrap();
        assert!(r.errors.is_empty() && r.added.len() == 1, "{r:?}");
        assert!(has("fd00:65::1", "cali1"));
        s6.set_routes(
            "blocks",
            vec![RouteSpec::blackhole(
                "fd00:66::/64".parse().unwrap(),
                PROTO,
                1024,
            )],
        );
        let r = s6.apply(&h).await.unwrap();
        assert!(r.errors.is_empty() && r.added.len() == 1, "{r:?}");
        s6.request_resync();
        let r = s6.apply(&h).await.unwrap();
        assert_eq!(r.changes(), 0, "IPv6 converged too: {r:?}");
        s6.set_routes("blocks", vec![]);
        s6.set_routes("cali1", vec![]);
        let r = s6.apply(&h).await.unwrap();
        assert_eq!(r.deleted.len(), 2, "{r:?}");
        assert!(!has("fd00:65::1", "cali1"));
        assert!(!routes(true).iter().any(|(d, ..)| d == "fd00:66::/64"));
        // The v4 blackhole is still there: families are independent.
        assert!(routes(false).iter().any(|(d, ..)| d == "10.65.1.0/26"));
    });
}

/// 1000 workload routes over 20 interfaces: converge, stay converged with no writes, go away.
/// Prints timings (run with `--nocapture` to see them).
#[test]
fn a_thousand_routes_converge_and_leave() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        for i in 0..20 {
            veth_up(&h, &format!("cali{i}"), &format!("peer{i}")).await;
        }
        let own = RouteOwnership::by_prefixes([PROTO], vec!["cali".into()], None);
        let mut s = RouteSyncer::new(IpFamily::V4, RT_TABLE_MAIN, own);
        for i in 0..20u32 {
            let routes = (0..50u32)
                .map(|j| {
                    let dst = format!("10.{}.{}.{}/32", 100 + i, j / 250, j % 250 + 1);
                    RouteSpec::device(dst.parse().unwrap(), format!("cali{i}"), PROTO, 1024)
                })
                .collect();
            s.set_routes(format!("cali{i}"), routes);
        }
        let t = std::time::Instant::now();
        let r = s.apply(&h).await.unwrap();
        let add = t.elapsed();
        assert_eq!((r.added.len(), r.errors.len()), (1000, 0));
        let n = ip_json(None, &["route", "show", "proto", "80"]).len();
        assert_eq!(n, 1000);

        s.request_resync();
        let t = std::time::Instant::now();
        let r = s.apply(&h).await.unwrap();
        let resync = t.elapsed();
        assert_eq!(r.changes(), 0);

        for i in 0..20 {
            s.set_routes(format!("cali{i}"), vec![]);
        }
        let t = std::time::Instant::now();
        let r = s.apply(&h).await.unwrap();
        let del = t.elapsed();
        assert_eq!(r.deleted.len(), 1000);
        assert!(ip_json(None, &["route", "show", "proto", "80"]).is_empty());
        println!("1000 routes: add {add:?}, no-op resync {resync:?}, delete {del:?}");
    });
}
