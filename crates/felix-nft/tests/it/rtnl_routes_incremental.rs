//! Privileged: the route syncer is O(change) between resyncs. An apply without a resync writes
//! exactly the changed routes and dumps nothing; drift from outside waits for the resync; a failed
//! write makes the next apply a full one; a flapped interface gets its routes back without a
//! dump; routes parked on absent interfaces cost nothing until their interface's event; the
//! daemon's kernel seam (`RealKernel`) drives it the same way. `ip -j route` is the
//! oracle, the syncer's request counters say what was sent.

use testkit::rtnl as rtnl_common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

use felix_nft::dataplane::kernel::{Kernel, RealKernel};
use felix_nft::dataplane::DataplaneConfig;
use rtnl::link;
use rtnl::routes::{
    RouteOwnership, RouteSpec, RouteSyncReport, RouteSyncStats, RouteSyncer, RT_TABLE_MAIN,
};
use rtnl::{IpFamily, RtnlHandle};
use rtnl_common::{device_route, in_netns_async, ip_json, run_in, veth_up};

const PROTO: u8 = 80;

fn has(dst: &str, dev: &str) -> bool {
    ip_json(None, &["route", "show", "table", "main"])
        .iter()
        .any(|r| r["dst"] == dst && r["dev"] == dev)
}

fn syncer() -> RouteSyncer {
    RouteSyncer::new(
        IpFamily::V4,
        RT_TABLE_MAIN,
        RouteOwnership::by_prefixes([PROTO], vec!["cali".into()], None),
    )
}

fn route(dst: &str, dev: &str) -> RouteSpec {
    device_route(dst, dev, PROTO)
}

/// What happened between two counter readings.
fn delta(after: RouteSyncStats, before: RouteSyncStats) -> RouteSyncStats {
    RouteSyncStats {
        dumps: after.dumps - before.dumps,
        incremental: after.incremental - before.incremental,
        link_gets: after.link_gets - before.link_gets,
        writes: after.writes - before.writes,
    }
}

/// A handle and a syncer over up veths `cali1..=caliN` (peers `peerN`), with cali1's route
/// 10.65.0.1/32 set but not applied yet.
async fn veths_and_syncer(n: u32) -> (RtnlHandle, RouteSyncer) {
    let h = RtnlHandle::connect(None).unwrap();
    for i in 1..=n {
        veth_up(&h, &format!("cali{i}"), &format!("peer{i}")).await;
    }
    let mut s = syncer();
    s.set_routes("cali1", vec![route("10.65.0.1/32", "cali1")]);
    (h, s)
}

/// One apply: its report and the requests it sent.
async fn counted_apply(s: &mut RouteSyncer, h: &RtnlHandle) -> (RouteSyncReport, RouteSyncStats) {
    let before = s.stats();
    let r = s.apply(h).await.unwrap();
    (r, delta(s.stats(), before))
}

#[test]
fn an_added_route_is_one_write_and_no_dump() {
    in_netns_async(|| async {
        let (h, mut s) = veths_and_syncer(2).await;
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.added.len(), r.errors.len()), (1, 0), "{r:?}");
        assert_eq!(s.stats().dumps, 1, "the first apply is full");

        s.set_routes("cali2", vec![route("10.65.0.2/32", "cali2")]);
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!((r.added.len(), r.errors.len()), (1, 0), "{r:?}");
        assert_eq!(
            d,
            RouteSyncStats {
                dumps: 0,
                incremental: 1,
                link_gets: 1,
                writes: 1
            },
            "one lookup of cali2, one RTM_NEWROUTE, no dump"
        );
        assert!(has("10.65.0.2", "cali2") && has("10.65.0.1", "cali1"));

        // Removal: one RTM_DELROUTE, no lookup, no dump.
        s.set_routes("cali2", vec![]);
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!(r.deleted.len(), 1, "{r:?}");
        assert_eq!(r.moved_or_gone, vec!["10.65.0.2/32".parse().unwrap()]);
        assert_eq!((d.dumps, d.link_gets, d.writes), (0, 0, 1), "{d:?}");
        assert!(!has("10.65.0.2", "cali2"));

        // A move to another interface: one replace, reported for conntrack cleanup.
        s.set_routes("cali1", vec![route("10.65.0.1/32", "cali2")]);
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!(r.replaced.len(), 1, "{r:?}");
        assert_eq!(r.moved_or_gone, vec!["10.65.0.1/32".parse().unwrap()]);
        assert_eq!(d.writes, 1);
        assert!(has("10.65.0.1", "cali2") && !has("10.65.0.1", "cali1"));

        // A block route (a remote node's /26) that goes needs no conntrack cleanup: conntrack
        // is keyed by address, and the block's first address may be a live workload's.
        s.set_routes("block", vec![route("10.66.0.0/26", "cali2")]);
        s.apply(&h).await.unwrap();
        s.set_routes("block", vec![]);
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.deleted.len(), 1, "{r:?}");
        assert!(r.moved_or_gone.is_empty(), "{r:?}");

        // Nothing changed: no I/O at all.
        let (r, d) = counted_apply(&mut s, &h).await;
        assert!(r.skipped, "{r:?}");
        assert_eq!(d, RouteSyncStats::default());
    });
}

#[test]
fn drift_from_outside_waits_for_the_resync() {
    in_netns_async(|| async {
        let (h, mut s) = veths_and_syncer(1).await;
        assert_eq!(s.apply(&h).await.unwrap().added.len(), 1);

        run_in(
            None,
            &["ip", "route", "del", "10.65.0.1/32", "dev", "cali1"],
        );
        assert!(!has("10.65.0.1", "cali1"));
        // An unrelated change is applied incrementally and does not see the drift.
        s.set_routes(
            "blocks",
            vec![RouteSpec::blackhole(
                "10.65.8.0/26".parse().unwrap(),
                PROTO,
                0,
            )],
        );
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!((r.added.len(), r.changes()), (1, 1), "{r:?}");
        assert_eq!(d.dumps, 0);
        assert!(!has("10.65.0.1", "cali1"), "not repaired without a resync");

        // The refresh timer's resync dumps and repairs it.
        s.request_resync();
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!((r.added.len(), r.changes()), (1, 1), "{r:?}");
        assert_eq!(d.dumps, 1);
        assert!(has("10.65.0.1", "cali1"), "repaired by the resync");
    });
}

#[test]
fn a_failed_write_makes_the_next_apply_full() {
    in_netns_async(|| async {
        let (h, mut s) = veths_and_syncer(1).await;
        assert_eq!(s.apply(&h).await.unwrap().added.len(), 1);

        // A preferred source that is no address of this host: the kernel refuses the route.
        let bad = RouteSpec {
            src: Some("10.250.0.1".parse().unwrap()),
            ..route("10.65.0.9/32", "cali1")
        };
        s.set_routes("cali9", vec![bad]);
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!((r.errors.len(), r.added.len()), (1, 0), "{r:?}");
        assert_eq!(d.dumps, 0, "the failing apply itself was incremental");
        assert!(s.needs_apply(), "a failure leaves work to do");

        // Meanwhile the kernel lost a route: the next apply, which has nothing new to write,
        // re-reads everything because the last one failed — and so repairs it too.
        run_in(
            None,
            &["ip", "route", "del", "10.65.0.1/32", "dev", "cali1"],
        );
        s.set_routes("cali9", vec![route("10.65.0.9/32", "cali1")]);
        let (r, d) = counted_apply(&mut s, &h).await;
        assert!(r.errors.is_empty(), "{r:?}");
        assert_eq!(d.dumps, 1, "full after a failure");
        assert_eq!(
            r.added.len(),
            2,
            "the fixed route and the repaired one: {r:?}"
        );
        assert!(has("10.65.0.9", "cali1") && has("10.65.0.1", "cali1"));

        // Back to incremental.
        s.set_routes("cali9", vec![]);
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!(r.deleted.len(), 1);
        assert_eq!(d.dumps, 0);
    });
}

#[test]
fn a_flapped_interface_gets_its_routes_back_without_a_dump() {
    in_netns_async(|| async {
        let (h, mut s) = veths_and_syncer(2).await;
        s.set_routes("cali2", vec![route("10.65.0.2/32", "cali2")]);
        assert_eq!(s.apply(&h).await.unwrap().added.len(), 2);

        // Admin down flushes the route; the monitor's event becomes iface_changed.
        link::set_up(&h, "cali1", false).await.unwrap();
        assert!(!has("10.65.0.1", "cali1"), "the kernel flushed it");
        s.iface_changed("cali1");
        let before = s.stats();
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.parked.len(), 1, "down: parked: {r:?}");
        link::set_up(&h, "cali1", true).await.unwrap();
        s.iface_changed("cali1");
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.added.len(), r.parked.len()), (1, 0), "{r:?}");
        let d = delta(s.stats(), before);
        assert_eq!((d.dumps, d.writes), (0, 1), "{d:?}");
        assert!(has("10.65.0.1", "cali1") && has("10.65.0.2", "cali2"));

        // Re-created with a new index: re-resolved by name.
        link::delete(&h, "cali1").await.unwrap();
        veth_up(&h, "cali1", "peer1").await;
        s.iface_changed("cali1");
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.changes(), 1, "{r:?}");
        assert!(has("10.65.0.1", "cali1"));
        assert_eq!(delta(s.stats(), before).dumps, 0);
    });
}

/// Routes parked on absent interfaces wait for their interface's event: an apply for another
/// endpoint neither looks them up nor writes them, and the event programs exactly that
/// interface's route.
#[test]
fn parked_routes_wait_for_their_interface_and_cost_nothing_meanwhile() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        veth_up(&h, "cali1", "peer1").await;
        let mut s = syncer();
        // More parked interfaces than one lookup each would take (a link dump then).
        for i in 0..40 {
            let dev = format!("calip{i}");
            s.set_routes(dev.clone(), vec![route(&format!("10.66.0.{i}/32"), &dev)]);
        }
        let r = s.apply(&h).await.unwrap();
        assert_eq!(r.parked.len(), 40, "{r:?}");

        // Nothing changed: no apply at all.
        let (r, d) = counted_apply(&mut s, &h).await;
        assert!(r.skipped, "{r:?}");
        assert_eq!(d, RouteSyncStats::default());
        // Another endpoint: its own lookup and write, nothing for the parked ones.
        s.set_routes("cali1", vec![route("10.65.0.1/32", "cali1")]);
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!((r.added.len(), r.parked.len()), (1, 40), "{r:?}");
        assert_eq!((d.dumps, d.link_gets, d.writes), (0, 1, 1), "{d:?}");

        // One parked interface appears: its event programs its route alone.
        veth_up(&h, "calip7", "peerp7").await;
        s.iface_changed("calip7");
        let (r, d) = counted_apply(&mut s, &h).await;
        assert_eq!((r.added.len(), r.parked.len()), (1, 39), "{r:?}");
        assert_eq!((d.dumps, d.link_gets, d.writes), (0, 1, 1), "{d:?}");
        assert!(has("10.66.0.7", "calip7") && has("10.65.0.1", "cali1"));

        // A full apply (the refresh timer) still looks at every parked route.
        veth_up(&h, "calip9", "peerp9").await;
        s.request_resync();
        let r = s.apply(&h).await.unwrap();
        assert_eq!((r.added.len(), r.parked.len()), (1, 38), "{r:?}");
        assert!(has("10.66.0.9", "calip9"));
    });
}

/// The daemon's seam: routes and neighbours through `RealKernel`, a flap reported to the
/// neighbours phase (as the loop does) restores the flushed route, all without a route dump.
#[test]
fn real_kernel_applies_routes_and_neighbours_incrementally() {
    in_netns_async(|| async {
        let cfg = DataplaneConfig::default();
        let mut k = RealKernel::open(None, &cfg).unwrap();
        let h = RtnlHandle::connect(None).unwrap();
        for i in 1..=3 {
            veth_up(&h, &format!("cali{i}"), &format!("peer{i}")).await;
        }
        let spec = |i: u32| {
            RouteSpec::device(
                format!("10.65.0.{i}/32").parse().unwrap(),
                format!("cali{i}"),
                cfg.routes.protocol,
                cfg.routes.metric_v4,
            )
        };
        let mac = |i: u8| [0xee, 0xee, 0, 0, 0, i];
        let ip = |i: u32| -> IpAddr { format!("10.65.0.{i}").parse().unwrap() };
        let mut routes = BTreeMap::new();
        let mut neigh = BTreeMap::new();
        for i in 1..=2u32 {
            routes.insert(format!("cali{i}"), vec![spec(i)]);
            neigh.insert(format!("cali{i}"), vec![(ip(i), mac(i as u8))]);
        }
        let none = BTreeSet::new();
        k.routes(&routes, None, true).await.unwrap();
        k.neighbours(&neigh, None, &none, true).await.unwrap();
        let [v4, _] = k.route_stats();
        assert_eq!(v4.dumps, 1);
        let n0 = k.neigh_stats();
        assert_eq!(n0.dumps, 1);

        // One more endpoint, stated for its interface only (the loop's scope): one route write,
        // one neighbour write, no dumps.
        let only3 = BTreeSet::from(["cali3".to_string()]);
        let routes3 = BTreeMap::from([("cali3".to_string(), vec![spec(3)])]);
        let neigh3 = BTreeMap::from([("cali3".to_string(), vec![(ip(3), mac(3))])]);
        let out = k.routes(&routes3, Some(&only3), false).await.unwrap();
        assert_eq!(out.changes, 1, "{out:?}");
        k.neighbours(&neigh3, Some(&only3), &none, false)
            .await
            .unwrap();
        routes.insert("cali3".into(), vec![spec(3)]);
        neigh.insert("cali3".into(), vec![(ip(3), mac(3))]);
        let [v4b, v6b] = k.route_stats();
        assert_eq!((v4b.dumps, v4b.writes - v4.writes), (1, 1), "{v4b:?}");
        assert_eq!(v6b.writes, 0, "no IPv6 routes");
        let n1 = k.neigh_stats();
        assert_eq!((n1.dumps, n1.writes - n0.writes), (1, 1), "{n1:?}");
        assert!(has("10.65.0.3", "cali3"));

        // cali1 flaps: the loop calls routes (nothing changed there) and then neighbours with
        // the changed interface; the route comes back without a dump.
        link::set_up(&h, "cali1", false).await.unwrap();
        link::set_up(&h, "cali1", true).await.unwrap();
        assert!(!has("10.65.0.1", "cali1"));
        let out = k.routes(&routes, None, false).await.unwrap();
        assert_eq!(out.changes, 0, "{out:?}");
        k.neighbours(&neigh, None, &BTreeSet::from(["cali1".to_string()]), false)
            .await
            .unwrap();
        assert!(has("10.65.0.1", "cali1"), "re-asserted after the flap");
        assert_eq!(k.route_stats()[0].dumps, 1, "still no second dump");
        let arp = ip_json(None, &["neigh", "show", "dev", "cali1"]);
        assert!(
            arp.iter()
                .any(|n| n["dst"] == "10.65.0.1" && n["state"].to_string().contains("PERMANENT")),
            "{arp:?}"
        );

        // cali2's endpoint goes: scoped to cali2 and absent from the maps, its route and ARP
        // entry leave; the others stay.
        let only2 = BTreeSet::from(["cali2".to_string()]);
        let out = k
            .routes(&BTreeMap::new(), Some(&only2), false)
            .await
            .unwrap();
        assert_eq!(out.changes, 1, "{out:?}");
        k.neighbours(&BTreeMap::new(), Some(&only2), &none, false)
            .await
            .unwrap();
        assert!(!has("10.65.0.2", "cali2"));
        assert!(has("10.65.0.1", "cali1") && has("10.65.0.3", "cali3"));
        let arp = ip_json(None, &["neigh", "show", "dev", "cali2"]);
        assert!(
            !arp.iter().any(|n| n["dst"] == "10.65.0.2"),
            "ARP entry removed: {arp:?}"
        );
        assert_eq!(k.route_stats()[0].dumps, 1, "no dump for any of it");
    });
}

/// Adding one route with N workload interfaces and routes present (N = 1000, or
/// `FELIX_NFT_ROUTES_N`): incremental apply vs the full apply (link dump + route dump + diff) that
/// every apply used to be. Prints the numbers (`--nocapture`).
///
/// The host gets a global address on an interface made before the workloads, as a real node
/// has: without one, every IPv4 route insert scans all interfaces for a source address
/// (`fib_create_info` → `inet_select_addr` walks the whole device list when the route's device
/// has no address), which makes each insert O(interfaces) and measures the wrong thing.
#[test]
fn one_route_among_many() {
    in_netns_async(|| async {
        let n: u32 = std::env::var("FELIX_NFT_ROUTES_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        let h = RtnlHandle::connect(None).unwrap();
        link::set_up(&h, "lo", true).await.unwrap();
        veth_up(&h, "eth0", "eth0p").await;
        link::add_address(&h, "eth0", "192.168.200.1/24".parse().unwrap())
            .await
            .unwrap();
        let t = Instant::now();
        let mut batch = String::new();
        for i in 0..=n {
            let (a, b) = (format!("cali{i:011x}"), format!("peer{i:011x}"));
            batch.push_str(&format!(
                "link add {a} type veth peer name {b}\nlink set {a} up\nlink set {b} up\n"
            ));
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), batch).unwrap();
        run_in(None, &["ip", "-batch", &file.path().to_string_lossy()]);
        let mk = t.elapsed();
        let dst = |i: u32| format!("10.{}.{}.{}/32", 64 + i / 65536, (i / 256) % 256, i % 256);
        let mut s = syncer();
        for i in 0..n {
            let name = format!("cali{i:011x}");
            s.set_routes(name.clone(), vec![route(&dst(i), &name)]);
        }
        let t = Instant::now();
        let r = s.apply(&h).await.unwrap();
        let full_load = t.elapsed();
        assert_eq!((r.added.len(), r.errors.len()), (n as usize, 0));

        let mut incr = Vec::new();
        let mut full = Vec::new();
        let name = format!("cali{n:011x}");
        for rep in 0..5u32 {
            let i = n + rep;
            // Incremental: add one route (then remove it again).
            s.set_routes(name.clone(), vec![route(&dst(i), &name)]);
            let before = s.stats();
            let t = Instant::now();
            let r = s.apply(&h).await.unwrap();
            incr.push(t.elapsed());
            assert_eq!(r.added.len(), 1);
            assert_eq!(delta(s.stats(), before).dumps, 0);
            s.set_routes(name.clone(), vec![]);
            assert_eq!(s.apply(&h).await.unwrap().deleted.len(), 1);
            // Full (what every apply did before): the same add with a resync.
            s.set_routes(name.clone(), vec![route(&dst(i), &name)]);
            s.request_resync();
            let t = Instant::now();
            let r = s.apply(&h).await.unwrap();
            full.push(t.elapsed());
            assert_eq!(r.added.len(), 1);
            s.set_routes(name.clone(), vec![]);
            assert_eq!(s.apply(&h).await.unwrap().deleted.len(), 1);
        }
        incr.sort();
        full.sort();
        println!(
            "{n} routes on {n} veths (made in {mk:?}; first apply {full_load:?}): add one route, \
             median of 5: incremental {:?}, full {:?}",
            incr[2], full[2]
        );
        assert!(incr[2] < full[2]);
    });
}
