//! Privileged: conntrack entries created by real UDP traffic between two namespaces are gone after
//! `delete_by_source`, for IPv4 and IPv6, matching original *or* reply source; unrelated entries
//! stay; one kept `Conntrack` socket serves cleanup after cleanup, as in the daemon.
//! `conntrack -L` in the host namespace is the oracle.

use testkit::rtnl as rtnl_common;

use std::net::{IpAddr, UdpSocket};
use std::time::Duration;

use rtnl::conntrack::{delete_by_source, Conntrack};
use rtnl::link;
use rtnl::netns::NetNs;
use rtnl_common::{in_netns_async, netns_with_handle, run_in};

/// `conntrack -L -f FAMILY` lines in `ns`.
fn ct_list(ns: &NetNs, family: &str) -> Vec<String> {
    run_in(Some(ns), &["conntrack", "-L", "-f", family])
        .lines()
        .map(String::from)
        .collect()
}

fn count_with(lines: &[String], needle: &str) -> usize {
    lines.iter().filter(|l| l.contains(needle)).count()
}

/// Sends one UDP datagram from a socket made in `from` to `to:port`.
/// The socket is returned so callers can keep its port from being reused.
fn udp(from: &NetNs, bind: &str, to: &str, port: u16) -> UdpSocket {
    let sock = from.run(|| UdpSocket::bind(bind)).unwrap().unwrap();
    let dst: IpAddr = to.parse().unwrap();
    sock.send_to(b"ping", (dst, port)).unwrap();
    sock
}

#[test]
fn conntrack_entries_of_an_ip_are_deleted() {
    in_netns_async(|| async {
        let (host, hh) = netns_with_handle();
        let (wl, wh) = netns_with_handle();
        link::create_veth(&hh, "cali1", "eth0").await.unwrap();
        link::move_to_netns(&hh, "eth0", &wl).await.unwrap();
        for (h, dev, v4, v6) in [
            (&hh, "cali1", "10.70.0.1/24", "fd70::1/64"),
            (&wh, "eth0", "10.70.0.2/24", "fd70::2/64"),
        ] {
            link::add_address(h, dev, v4.parse().unwrap())
                .await
                .unwrap();
            link::add_address(h, dev, v6.parse().unwrap())
                .await
                .unwrap();
            link::set_up(h, dev, true).await.unwrap();
            link::set_up(h, "lo", true).await.unwrap();
        }
        // A stateful rule makes the host namespace track connections.
        run_in(
            Some(&host),
            &[
                "nft",
                "add table inet t; add chain inet t in { type filter hook input priority 0; }; \
                 add rule inet t in ct state established accept",
            ],
        );

        // Workload → host (original source = workload IP), host → workload (reply source =
        // workload IP), and one unrelated flow from the host to a third address.
        udp(&wl, "0.0.0.0:0", "10.70.0.1", 5001);
        udp(&host, "0.0.0.0:0", "10.70.0.2", 5002);
        udp(&host, "0.0.0.0:0", "10.70.0.9", 5003);
        udp(&wl, "[::]:0", "fd70::1", 5001);
        udp(&host, "[::]:0", "fd70::2", 5002);
        udp(&host, "[::]:0", "fd70::9", 5003);
        tokio::time::sleep(Duration::from_millis(200)).await;

        let v4 = ct_list(&host, "ipv4");
        assert_eq!(count_with(&v4, "10.70.0.2"), 2, "{v4:#?}");
        assert_eq!(count_with(&v4, "10.70.0.9"), 1, "{v4:#?}");
        let v6 = ct_list(&host, "ipv6");
        assert_eq!(count_with(&v6, "fd70::2"), 2, "{v6:#?}");

        let r = delete_by_source(Some(&host), "10.70.0.2".parse().unwrap()).unwrap();
        assert_eq!((r.matched, r.deleted), (2, 2), "{r:?}");
        let v4 = ct_list(&host, "ipv4");
        assert_eq!(count_with(&v4, "10.70.0.2"), 0, "{v4:#?}");
        assert_eq!(
            count_with(&v4, "10.70.0.9"),
            1,
            "unrelated flow stays: {v4:#?}"
        );
        assert_eq!(
            count_with(&ct_list(&host, "ipv6"), "fd70::2"),
            2,
            "IPv6 untouched by a v4 delete"
        );

        // From here on one socket, kept open (the daemon's): requests one after another.
        let mut ct = Conntrack::open(Some(&host)).unwrap();
        let r = ct.delete_by_source("fd70::2".parse().unwrap()).unwrap();
        assert_eq!((r.matched, r.deleted), (2, 2), "{r:?}");
        let v6 = ct_list(&host, "ipv6");
        assert_eq!(count_with(&v6, "fd70::2"), 0, "{v6:#?}");
        assert_eq!(count_with(&v6, "fd70::9"), 1, "{v6:#?}");

        // Nothing left to match: a no-op, not an error.
        let r = ct.delete_by_source("10.70.0.2".parse().unwrap()).unwrap();
        assert_eq!(r.matched, 0);

        // Scale: 500 flows from the workload (one source port each) among 100 unrelated ones.
        let mut keep = Vec::new();
        for _ in 0..500 {
            keep.push(udp(&wl, "0.0.0.0:0", "10.70.0.1", 6000));
        }
        for port in 0..100 {
            keep.push(udp(&host, "0.0.0.0:0", "10.70.0.9", 7000 + port));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(count_with(&ct_list(&host, "ipv4"), "src=10.70.0.2"), 500);
        let t = std::time::Instant::now();
        let r = ct.delete_by_source("10.70.0.2".parse().unwrap()).unwrap();
        let took = t.elapsed();
        assert_eq!((r.matched, r.deleted), (500, 500), "{r:?}");
        let v4 = ct_list(&host, "ipv4");
        assert_eq!(count_with(&v4, "10.70.0.2"), 0);
        assert_eq!(count_with(&v4, "10.70.0.9"), 101);
        println!("conntrack: deleted 500 of 601 entries in {took:?}");
    });
}
