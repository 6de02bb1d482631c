//! Privileged: the route syncer's gateway routes on an interface point at nexthop objects it owns.
//! Routes through one gateway share an object; an object goes with its last route; one deleted
//! from outside comes back at the resync; a flapped interface (which takes its objects and their
//! routes) gets both back without a dump; everything goes at cleanup, and someone else's objects
//! are never touched. `ip -j route` and `ip -j nexthop` are the oracles.

use testkit::rtnl as rtnl_common;

use rtnl::link;
use rtnl::nexthop::id_range;
use rtnl::routes::{RouteOwnership, RouteSpec, RouteSyncer, RouteTarget, RT_TABLE_MAIN};
use rtnl::{IpFamily, RtnlHandle};
use rtnl_common::{in_netns_async, ip_json, run_in, veth_up};
use serde_json::Value;

const PROTO: u8 = 80;

/// `RTPROT_BOOT`: Felix's device route protocol by default, ours only on the devices we own.
const BOOT: u8 = 3;

fn gateway(dst: &str, via: &str) -> RouteSpec {
    RouteSpec {
        dst: dst.parse().unwrap(),
        target: RouteTarget::Gateway {
            via: via.parse().unwrap(),
            dev: Some("eth0".into()),
            onlink: true,
        },
        protocol: PROTO,
        metric: 1024,
        src: None,
        mtu: Some(1450),
    }
}

/// The objects in the namespace: id → gateway.
fn objects() -> Vec<(u64, String)> {
    ip_json(None, &["nexthop", "show"])
        .iter()
        .map(|o| {
            (
                o["id"].as_u64().unwrap(),
                o["gateway"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The route to `dst` (`ip -j route`), if any.
fn route_to(dst: &str) -> Option<Value> {
    ip_json(None, &["route", "show", "table", "main"])
        .into_iter()
        .find(|r| r["dst"] == dst)
}

/// The route to `dst` goes via `via` on eth0, onlink, with the tunnel MTU, through our object
/// for `via`; returns that object's id.
fn through_object(dst: &str, via: &str) -> u64 {
    let r = route_to(dst).unwrap_or_else(|| panic!("no route to {dst}"));
    assert_eq!(r["gateway"], via, "{r}");
    assert_eq!(r["dev"], "eth0", "{r}");
    assert!(r["flags"].to_string().contains("onlink"), "{r}");
    assert!(r["metrics"].to_string().contains("1450"), "{r}");
    let id = r["nhid"]
        .as_u64()
        .unwrap_or_else(|| panic!("not through an object: {r}"));
    assert!(
        id_range(IpFamily::V4).contains(&(id as u32)),
        "id {id} outside our range"
    );
    assert!(
        objects().contains(&(id, via.to_string())),
        "{:?}",
        objects()
    );
    id
}

/// Someone else's object, in our protocol and below our range: never ours.
fn add_foreign_object() {
    let argv = "ip nexthop add id 7 via 10.200.0.9 dev eth0 onlink proto 80";
    run_in(None, &argv.split(' ').collect::<Vec<_>>());
}

#[test]
fn gateway_routes_share_nexthop_objects_that_follow_them() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        veth_up(&h, "eth0", "peer0").await;
        run_in(None, &["ip", "link", "set", "lo", "up"]);
        add_foreign_object();
        let foreign = (7, "10.200.0.9".to_string());

        let mut s = RouteSyncer::new(
            IpFamily::V4,
            RT_TABLE_MAIN,
            RouteOwnership::by_prefixes([PROTO], vec!["cali".into()], None)
                .with_device_ifaces(["eth0".to_string()]),
        );
        s.set_routes(
            "a",
            vec![
                gateway("10.65.1.0/26", "10.200.0.1"),
                gateway("10.65.1.64/26", "10.200.0.1"),
            ],
        );
        // Ours by the device, not the protocol (as the tunnel routes on `vxlan.calico` are).
        let boot = RouteSpec {
            protocol: BOOT,
            ..gateway("10.65.2.0/26", "10.200.0.2")
        };
        s.set_routes("b", vec![boot.clone()]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.added.len(), r.errors.len()), (3, 0), "{r:?}");
        let one = through_object("10.65.1.0/26", "10.200.0.1");
        assert_eq!(through_object("10.65.1.64/26", "10.200.0.1"), one, "shared");
        let two = through_object("10.65.2.0/26", "10.200.0.2");
        assert_ne!(one, two);
        assert_eq!(objects().len(), 3, "{:?}", objects());

        // A second apply finds everything in place, objects included.
        s.request_resync();
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.changes(), 0, "{r:?}");
        assert_eq!(objects().len(), 3, "{:?}", objects());
        assert_eq!(through_object("10.65.2.0/26", "10.200.0.2"), two);

        // The object stays while a route uses it, and goes with the last one.
        s.set_routes("a", vec![gateway("10.65.1.0/26", "10.200.0.1")]);
        s.apply(&h).await.unwrap();
        assert_eq!(through_object("10.65.1.0/26", "10.200.0.1"), one);
        let before = s.stats();
        s.set_routes("a", vec![]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.deleted.len(), r.errors.len()), (1, 0), "{r:?}");
        let d = s.stats();
        assert_eq!(
            (d.dumps - before.dumps, d.writes - before.writes),
            (0, 2),
            "the route and its object, no dump"
        );
        assert!(
            !objects().iter().any(|(id, _)| *id == one),
            "{:?}",
            objects()
        );
        assert!(route_to("10.65.1.0/26").is_none());

        // Deleted from outside (it takes its route along): back at the resync.
        run_in(None, &["ip", "nexthop", "del", "id", &two.to_string()]);
        assert!(
            route_to("10.65.2.0/26").is_none(),
            "the kernel took the route too"
        );
        s.request_resync();
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.added.len(), r.errors.len()), (1, 0), "{r:?}");
        through_object("10.65.2.0/26", "10.200.0.2");

        // An interface taken down loses its objects and their routes: both come back after it,
        // without a dump.
        let before = s.stats();
        link::set_up(&h, "eth0", false).await.unwrap();
        s.iface_changed("eth0");
        s.apply(&h).await.unwrap();
        link::set_up(&h, "eth0", true).await.unwrap();
        s.iface_changed("eth0");
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.added.len(), r.errors.len()), (1, 0), "{r:?}");
        through_object("10.65.2.0/26", "10.200.0.2");
        assert_eq!(s.stats().dumps, before.dumps);

        // Cleanup: nothing of ours stays; the foreign object was never touched (the flap took it
        // with the rest: put back to check that cleanup leaves it).
        if !objects().contains(&foreign) {
            add_foreign_object();
        }
        s.set_routes("b", vec![]);
        s.request_resync();
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.errors.len(), 0, "{r:?}");
        assert_eq!(objects(), vec![foreign]);
        assert!(ip_json(None, &["route", "show", "proto", "80"]).is_empty());
    });
}
