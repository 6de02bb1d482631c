//! Privileged: a UDP exchange in a private namespace shows up on a [`CtEventSocket`] as the
//! connection's new event (its tuples), an update when the reply is seen, and, when the entry
//! is deleted, a destroy event with the packets and bytes each way (accounting on). Only the
//! groups subscribed to arrive.

use testkit::rtnl as rtnl_common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use rtnl::conntrack::delete_by_source;
use rtnl::ctevents::{CtEvent, CtEventSocket, CtGroups};
use rtnl::netns::NetNs;
use rtnl_common::{new_netns, run_in};

/// Reads events until `done` holds for what came (or five seconds passed,
/// [`testkit::patient`]).
fn read_until(sock: &mut CtEventSocket, done: impl Fn(&[CtEvent]) -> bool) -> Vec<CtEvent> {
    let mut out = Vec::new();
    let (t0, limit) = (Instant::now(), testkit::patient(Duration::from_secs(5)));
    while !done(&out) && t0.elapsed() < limit {
        sock.recv(&mut out).expect("reading conntrack events");
    }
    out
}

fn in_ns<T>(ns: &NetNs, f: impl FnOnce() -> T) -> T {
    ns.run(f).expect("entering the namespace")
}

#[test]
fn a_connection_is_new_then_updated_then_destroyed_with_its_counters() {
    let ns = new_netns();
    run_in(Some(&ns), &["ip", "link", "set", "lo", "up"]);
    // A stateful rule makes the namespace track connections; accounting gives them counters.
    run_in(
        Some(&ns),
        &[
            "nft",
            "add table ip t; add chain ip t in { type filter hook input priority 0; }; \
             add rule ip t in ct state established accept",
        ],
    );
    in_ns(&ns, || {
        std::fs::write("/proc/sys/net/netfilter/nf_conntrack_acct", "1").expect("accounting on")
    });
    let groups = CtGroups {
        new: true,
        update: true,
        destroy: true,
    };
    let mut sock = CtEventSocket::open(Some(&ns), groups, 1 << 20).expect("subscribing");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");
    let mut only_destroy = CtEventSocket::open(
        Some(&ns),
        CtGroups {
            new: false,
            update: false,
            destroy: true,
        },
        1 << 16,
    )
    .expect("subscribing to destroy events");
    only_destroy
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");

    let (server, client) = in_ns(&ns, || {
        (
            UdpSocket::bind("127.0.0.1:5301").expect("server"),
            UdpSocket::bind("127.0.0.1:5302").expect("client"),
        )
    });
    client.send_to(b"ping", "127.0.0.1:5301").expect("ping");
    let mut buf = [0u8; 16];
    let (_, from) = server.recv_from(&mut buf).expect("the ping");
    server.send_to(b"pong!", from).expect("pong");
    client.recv_from(&mut buf).expect("the pong");

    let ours = |e: &CtEvent| {
        e.entry()
            .orig
            .is_some_and(|t| t.dport == 5301 && t.sport == 5302)
    };
    let got = read_until(&mut sock, |evs| {
        evs.iter()
            .any(|e| matches!(e, CtEvent::Update(_)) && ours(e))
    });
    let new = got
        .iter()
        .find(|e| matches!(e, CtEvent::New(_)) && ours(e))
        .unwrap_or_else(|| panic!("no new event for the connection: {got:#?}"));
    let t = new.entry().orig.expect("the original tuple");
    assert_eq!(t.proto, 17);
    assert_eq!(t.src, "127.0.0.1".parse::<std::net::IpAddr>().unwrap());
    let reply = new.entry().reply.expect("the reply tuple");
    assert_eq!((reply.sport, reply.dport), (5301, 5302));
    assert!(
        got.iter()
            .any(|e| matches!(e, CtEvent::Update(_)) && ours(e)),
        "the reply updates the entry: {got:#?}"
    );

    // Deleted (as the agent's cleanup does): destroyed, with its counts each way: one packet,
    // IPv4 and UDP headers and the 4 and 5 bytes sent.
    let report = in_ns(&ns, || delete_by_source(None, "127.0.0.1".parse().unwrap()))
        .expect("deleting the entry");
    assert!(report.deleted >= 1, "{report:?}");
    let got = read_until(&mut sock, |evs| {
        evs.iter()
            .any(|e| matches!(e, CtEvent::Destroy(_)) && ours(e))
    });
    let gone = got
        .iter()
        .find(|e| matches!(e, CtEvent::Destroy(_)) && ours(e))
        .unwrap_or_else(|| panic!("no destroy event: {got:#?}"));
    let orig = gone
        .entry()
        .counters_orig
        .expect("counters, accounting being on");
    let back = gone.entry().counters_reply.expect("reply counters");
    assert_eq!((orig.packets, orig.bytes), (1, 20 + 8 + 4));
    assert_eq!((back.packets, back.bytes), (1, 20 + 8 + 5));

    // The destroy-only socket saw the destroy and nothing else.
    let only = read_until(&mut only_destroy, |evs| evs.iter().any(ours));
    assert!(only.iter().any(ours), "{only:#?}");
    assert!(
        only.iter().all(|e| matches!(e, CtEvent::Destroy(_))),
        "{only:#?}"
    );
}
