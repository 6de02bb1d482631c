//! Privileged: a pipelined batch of route writes spanning several datagrams, with failing
//! requests in the middle: every other request lands, and each failure is reported for exactly
//! its own request, with the kernel's errno. `ip -j route` is the oracle.

use testkit::rtnl as rtnl_common;

use std::net::Ipv4Addr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::route::{RouteProtocol, RouteScope};
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::RouteMessageBuilder;
use rtnl::batch::{Batch, Failure};
use rtnl::{link, RtnlHandle};
use rtnl_common::{in_netns_async, ip_json, veth_up};

/// Requests in the batch: more than one datagram holds at the bound of 64 KiB.
const N: usize = 3000;
/// The request that names an interface index no interface has.
const NO_SUCH_IFACE: usize = 1234;
/// The request that deletes a route that does not exist.
const NO_SUCH_ROUTE: usize = 2001;

fn dst(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0a40_0000 + (i as u32) * 64)
}

fn route(i: usize, oif: u32) -> netlink_packet_route::route::RouteMessage {
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(dst(i), 26)
        .output_interface(oif)
        .scope(RouteScope::Link)
        .protocol(RouteProtocol::Static)
        .build()
}

#[test]
fn a_batch_reports_each_failure_for_its_own_request_and_lands_the_rest() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        veth_up(&h, "bat0", "bat1").await;
        let idx = link::get_link(&h, "bat0").await.unwrap().unwrap().index;

        let mut batch = Batch::new();
        for i in 0..N {
            if i == NO_SUCH_ROUTE {
                batch.push(RouteNetlinkMessage::DelRoute(route(N + 1, idx)), 0);
            } else {
                let oif = if i == NO_SUCH_IFACE { 999_999 } else { idx };
                batch.push(
                    RouteNetlinkMessage::NewRoute(route(i, oif)),
                    NLM_F_CREATE | NLM_F_REPLACE,
                );
            }
        }
        assert_eq!(batch.len(), N);
        let outcomes = h.write_batch(&mut batch).unwrap();
        assert_eq!(outcomes.len(), N);
        for (i, o) in outcomes.iter().enumerate() {
            let errno = match o {
                Ok(()) => None,
                Err(Failure::Nack(m)) => Some(-m.raw_code()),
                Err(Failure::Io(e)) => panic!("request {i}: no answer: {e}"),
            };
            let want = match i {
                NO_SUCH_IFACE => Some(libc::ENODEV),
                NO_SUCH_ROUTE => Some(libc::ESRCH),
                _ => None,
            };
            assert_eq!(errno, want, "request {i}");
        }

        let routes = ip_json(None, &["route", "show", "dev", "bat0", "proto", "static"]);
        let got: std::collections::BTreeSet<String> = routes
            .iter()
            .filter_map(|r| r["dst"].as_str().map(String::from))
            .collect();
        let want: std::collections::BTreeSet<String> = (0..N)
            .filter(|i| ![NO_SUCH_IFACE, NO_SUCH_ROUTE].contains(i))
            .map(|i| format!("{}/26", dst(i)))
            .collect();
        assert_eq!(got.len(), N - 2);
        assert_eq!(got, want);

        // The socket is in step afterwards: a second batch (deleting them all) gets its own
        // answers, and a dump on the same socket still works.
        let mut batch = Batch::new();
        for i in 0..N {
            batch.push(RouteNetlinkMessage::DelRoute(route(i, idx)), 0);
        }
        let outcomes = h.write_batch(&mut batch).unwrap();
        let failed: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_err())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(failed, vec![NO_SUCH_IFACE, NO_SUCH_ROUTE], "never written");
        assert!(ip_json(None, &["route", "show", "dev", "bat0", "proto", "static"]).is_empty());
        assert!(!link::list_links(&h).await.unwrap().is_empty());
    });
}

#[test]
fn an_empty_batch_sends_nothing() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        assert!(h.write_batch(&mut Batch::new()).unwrap().is_empty());
    });
}
