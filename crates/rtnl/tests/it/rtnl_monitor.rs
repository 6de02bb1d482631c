//! Privileged: the interface monitor reports create, up, down, address add/remove (damped),
//! rename and delete, honours the exclude list, and after a receive overrun under an event storm
//! its resync still reports the true state (`ip -j addr` as the oracle).

use testkit::rtnl as rtnl_common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use rtnl::monitor::{self, EventReceiver, IfaceEvent, MonitorConfig};
use rtnl::netns::NetNs;
use rtnl::{link, RtnlHandle};
use rtnl_common::{in_netns_async, ip_json, link_flags};

/// Waits (up to 3 s, [`testkit::patient`]) for an event matching `pred`, returning it; panics
/// with what was seen.
async fn wait_for(
    rx: &mut EventReceiver,
    what: &str,
    pred: impl Fn(&IfaceEvent) -> bool,
) -> IfaceEvent {
    let limit = testkit::patient(Duration::from_secs(3));
    let deadline = tokio::time::Instant::now() + limit;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) if pred(&e) => return e,
            Ok(Some(e)) => seen.push(e),
            Ok(None) => panic!("monitor stopped while waiting for {what}; saw {seen:#?}"),
            Err(_) => panic!("no event {what} within {limit:?}; saw {seen:#?}"),
        }
    }
}

/// Waits for the next event of `want`'s kind (`what`) and checks it is `want`.
async fn expect_next_of_kind(rx: &mut EventReceiver, what: &str, want: IfaceEvent) {
    let kind = std::mem::discriminant(&want);
    let e = wait_for(rx, what, |e| std::mem::discriminant(e) == kind).await;
    assert_eq!(e, want);
}

/// Every event arriving within `quiet` of the previous one.
async fn drain(rx: &mut EventReceiver, quiet: Duration) -> Vec<IfaceEvent> {
    let mut out = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(quiet, rx.recv()).await {
        out.push(e);
    }
    out
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Adds (`true`) or deletes the address `cidr` on `cali1`.
async fn cali1_address(h: &RtnlHandle, add: bool, cidr: &str) {
    if add {
        link::add_address(h, "cali1", net(cidr)).await.unwrap();
    } else {
        link::delete_address(h, "cali1", net(cidr)).await.unwrap();
    }
}

fn link_is(e: &IfaceEvent, name: &str, up: bool) -> bool {
    matches!(e, IfaceEvent::Link(l) if l.name == name && l.oper_up == up)
}

fn addrs_of<'a>(e: &'a IfaceEvent, name: &str) -> Option<&'a BTreeSet<IpNet>> {
    match e {
        IfaceEvent::Addrs { name: n, addrs, .. } if n == name => Some(addrs),
        _ => None,
    }
}

#[test]
fn monitor_reports_the_interface_lifecycle() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        let cfg = MonitorConfig {
            exclude: vec!["/^skip/".into(), "peer1".into()],
            ..MonitorConfig::default()
        };
        let (mut rx, _mon) = monitor::start(None, cfg).unwrap();
        let first = wait_for(&mut rx, "InSync", |e| *e == IfaceEvent::InSync).await;
        assert_eq!(first, IfaceEvent::InSync);

        // Create: reported down, with its MAC.
        link::create_veth(&h, "cali1", "peer1").await.unwrap();
        let e = wait_for(&mut rx, "cali1 created", |e| link_is(e, "cali1", false)).await;
        let IfaceEvent::Link(l) = e else {
            unreachable!()
        };
        assert_eq!(l.mac.len(), 6);
        let index = l.index;

        // Up (both ends, so the carrier comes up): oper up.
        link::set_up(&h, "cali1", true).await.unwrap();
        link::set_up(&h, "peer1", true).await.unwrap();
        wait_for(&mut rx, "cali1 up", |e| link_is(e, "cali1", true)).await;

        // Addresses, both families.
        cali1_address(&h, true, "10.1.0.1/24").await;
        cali1_address(&h, true, "fd01::1/64").await;
        wait_for(&mut rx, "both addresses", |e| {
            addrs_of(e, "cali1")
                .is_some_and(|a| a.contains(&net("10.1.0.1/24")) && a.contains(&net("fd01::1/64")))
        })
        .await;

        // Removal is reported, but only after the 100 ms damping.
        let t = Instant::now();
        cali1_address(&h, false, "10.1.0.1/24").await;
        wait_for(&mut rx, "address removed", |e| {
            addrs_of(e, "cali1").is_some_and(|a| !a.contains(&net("10.1.0.1/24")))
        })
        .await;
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "deletion damped: {:?}",
            t.elapsed()
        );

        // A remove + re-add flap inside the damping window produces no removal event.
        cali1_address(&h, true, "10.1.0.2/24").await;
        wait_for(&mut rx, "second address", |e| {
            addrs_of(e, "cali1").is_some_and(|a| a.contains(&net("10.1.0.2/24")))
        })
        .await;
        cali1_address(&h, false, "10.1.0.2/24").await;
        cali1_address(&h, true, "10.1.0.2/24").await;
        let flap = drain(&mut rx, Duration::from_millis(300)).await;
        assert!(
            !flap
                .iter()
                .any(|e| addrs_of(e, "cali1").is_some_and(|a| !a.contains(&net("10.1.0.2/24")))),
            "flap was damped: {flap:#?}"
        );

        // Down.
        link::set_up(&h, "cali1", false).await.unwrap();
        wait_for(&mut rx, "cali1 down", |e| link_is(e, "cali1", false)).await;

        // Rename (the kernel wants it down).
        link::rename(&h, "cali1", "cali9").await.unwrap();
        expect_next_of_kind(
            &mut rx,
            "rename",
            IfaceEvent::Renamed {
                index,
                old_name: "cali1".into(),
                new_name: "cali9".into(),
            },
        )
        .await;

        // Excluded interfaces are invisible.
        link::create_veth(&h, "skip0", "skip1").await.unwrap();
        let quiet = drain(&mut rx, Duration::from_millis(300)).await;
        let names = |evs: &[IfaceEvent]| -> Vec<String> {
            evs.iter()
                .filter_map(|e| match e {
                    IfaceEvent::Link(l) => Some(l.name.clone()),
                    IfaceEvent::Addrs { name, .. } | IfaceEvent::Removed { name, .. } => {
                        Some(name.clone())
                    }
                    _ => None,
                })
                .collect()
        };
        assert!(
            !names(&quiet)
                .iter()
                .any(|n| n.starts_with("skip") || n == "peer1"),
            "{quiet:#?}"
        );

        // Delete.
        link::delete(&h, "cali9").await.unwrap();
        expect_next_of_kind(
            &mut rx,
            "removed",
            IfaceEvent::Removed {
                index,
                name: "cali9".into(),
            },
        )
        .await;
    });
}

/// The consumer's picture built from events: index → (name, oper up, addresses).
#[derive(Default)]
struct Picture(BTreeMap<u32, (String, bool, BTreeSet<IpNet>)>);

impl Picture {
    fn apply(&mut self, e: &IfaceEvent) {
        match e {
            IfaceEvent::Link(l) => {
                let entry = self.0.entry(l.index).or_default();
                entry.0 = l.name.clone();
                entry.1 = l.oper_up;
            }
            IfaceEvent::Renamed {
                index, new_name, ..
            } => {
                if let Some(entry) = self.0.get_mut(index) {
                    entry.0 = new_name.clone();
                }
            }
            IfaceEvent::Removed { index, .. } => {
                self.0.remove(index);
            }
            IfaceEvent::Addrs { index, addrs, .. } => {
                self.0.entry(*index).or_default().2 = addrs.clone();
            }
            IfaceEvent::InSync => {}
        }
    }

    /// The same picture from `ip -j addr show`.
    fn oracle() -> Picture {
        let mut p = Picture::default();
        for l in ip_json(None, &["addr", "show"]) {
            let flags = link_flags(&l);
            let up = flags.contains(&"UP") && flags.contains(&"LOWER_UP");
            let addrs = l["addr_info"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|i| {
                            net(&format!(
                                "{}/{}",
                                i["local"].as_str().unwrap(),
                                i["prefixlen"]
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            p.0.insert(
                u32::try_from(l["ifindex"].as_u64().unwrap()).unwrap(),
                (l["ifname"].as_str().unwrap().to_string(), up, addrs),
            );
        }
        p
    }
}

#[test]
fn overrun_under_an_event_storm_resyncs_to_the_truth() {
    in_netns_async(|| async {
        let ns = NetNs::current().unwrap();
        let cfg = MonitorConfig {
            exclude: vec![],
            rcvbuf: Some(1), // the kernel rounds this up to its minimum (a couple of KiB)
            ..MonitorConfig::default()
        };
        let (mut rx, mon) = monitor::start(None, cfg).unwrap();
        let mut pic = Picture::default();
        loop {
            let e = rx.recv().await.unwrap();
            pic.apply(&e);
            if e == IfaceEvent::InSync {
                break;
            }
        }

        // The storm runs on another thread while this one — the only runtime thread, which also
        // reads the monitor socket — is blocked: the kernel must drop events.
        std::thread::spawn(move || {
            let _in = ns.enter().unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let h = RtnlHandle::connect(None).unwrap();
                for i in 0..40 {
                    let (a, b) = (format!("st{i}a"), format!("st{i}b"));
                    link::create_veth(&h, &a, &b).await.unwrap();
                    link::set_up(&h, &a, true).await.unwrap();
                    if i % 3 != 0 {
                        link::set_up(&h, &b, true).await.unwrap();
                    }
                    link::add_address(&h, &a, net(&format!("10.2.{i}.1/24")))
                        .await
                        .unwrap();
                    if i % 4 == 0 {
                        link::delete(&h, &a).await.unwrap();
                    } else if i % 4 == 1 {
                        // Kernels before 6.2 refuse to rename a link that is up (EBUSY).
                        let up = i % 3 != 0;
                        if up {
                            link::set_up(&h, &b, false).await.unwrap();
                        }
                        let new = format!("rn{i}");
                        link::rename(&h, &b, &new).await.unwrap();
                        if up {
                            link::set_up(&h, &new, true).await.unwrap();
                        }
                    }
                }
            });
        })
        .join()
        .unwrap();

        // Let the monitor read, overrun, resync; then compare with the kernel until they agree
        // (IPv6 link-local addresses keep arriving for a moment after links come up).
        let mut last = String::new();
        for _ in 0..10 {
            for e in drain(&mut rx, Duration::from_millis(300)).await {
                pic.apply(&e);
            }
            let truth = Picture::oracle();
            if truth.0 == pic.0
                && mon
                    .stats()
                    .overruns
                    .load(std::sync::atomic::Ordering::Relaxed)
                    > 0
            {
                break;
            }
            last = format!("monitor: {:#?}\nkernel: {:#?}", pic.0, truth.0);
        }
        let stats = mon.stats();
        let overruns = stats.overruns.load(std::sync::atomic::Ordering::Relaxed);
        let resyncs = stats.resyncs.load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "storm: overruns={overruns} resyncs={resyncs} kernel messages read={} interfaces={}",
            stats.messages.load(std::sync::atomic::Ordering::Relaxed),
            pic.0.len()
        );
        assert!(
            overruns >= 1,
            "a tiny buffer under a storm overran (overruns={overruns})"
        );
        assert!(
            resyncs >= 2,
            "the overrun caused a resync (resyncs={resyncs})"
        );
        assert_eq!(Picture::oracle().0, pic.0, "{last}");
        assert!(
            pic.0.len() > 40,
            "the storm left interfaces behind: {}",
            pic.0.len()
        );
        assert!(rx.backlog() == 0);
    });
}

#[test]
fn monitor_watches_the_namespace_it_was_given() {
    in_netns_async(|| async {
        let other = rtnl_common::new_netns();
        let cfg = MonitorConfig {
            resync_interval: Duration::from_millis(200),
            ..MonitorConfig::default()
        };
        let (mut rx, mon) = monitor::start(Some(&other), cfg).unwrap();
        wait_for(&mut rx, "InSync", |e| *e == IfaceEvent::InSync).await;
        let here = RtnlHandle::connect(None).unwrap();
        let there = RtnlHandle::connect(Some(&other)).unwrap();
        link::create_veth(&here, "here0", "here1").await.unwrap();
        link::create_veth(&there, "there0", "there1").await.unwrap();
        wait_for(&mut rx, "there0 created", |e| link_is(e, "there0", false)).await;
        let rest = drain(&mut rx, Duration::from_millis(300)).await;
        assert!(
            !rest
                .iter()
                .any(|e| matches!(e, IfaceEvent::Link(l) if l.name.starts_with("here"))),
            "events of the monitor's own thread namespace leaked in: {rest:#?}"
        );
        // Periodic resyncs happen, and with nothing changed they emit nothing.
        let quiet = drain(&mut rx, Duration::from_millis(600)).await;
        let resyncs = mon
            .stats()
            .resyncs
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            resyncs >= 3,
            "periodic resync every 200 ms (resyncs={resyncs})"
        );
        assert!(
            quiet.is_empty(),
            "a resync that finds nothing new says nothing: {quiet:#?}"
        );
    });
}
