//! Privileged: packets a rule logs to NFLOG groups reach an [`NflogSocket`] bound to those
//! groups, decoded: the group, the rule's prefix, the interface, the packet's headers and its
//! connection; a group another socket holds is refused; a flood the reader does not keep up
//! with is reported as an overrun, not an error. The rules come from `nft` (a test tool).

use testkit::rtnl as rtnl_common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use rtnl::ctevents::decode_entry;
use rtnl::netns::NetNs;
use rtnl::nflog::{LoggedPacket, NflogSocket, Received};
use rtnl_common::{new_netns, run_in};

/// Reads until `n` packets came (or five seconds passed, [`testkit::patient`]).
fn read(sock: &mut NflogSocket, n: usize) -> Vec<LoggedPacket> {
    let mut out = Vec::new();
    let (t0, limit) = (Instant::now(), testkit::patient(Duration::from_secs(5)));
    while out.len() < n && t0.elapsed() < limit {
        sock.recv(&mut out).expect("reading NFLOG");
    }
    out
}

fn udp_to(ns: &NetNs, dst: &str, n: usize) {
    let sock = ns
        .run(|| UdpSocket::bind("127.0.0.1:0"))
        .expect("entering the namespace")
        .expect("a UDP socket");
    for _ in 0..n {
        // A packet our own output chain drops fails its send with EPERM: that is the point.
        let _ = sock.send_to(b"flow", dst);
    }
}

#[test]
fn logged_packets_arrive_decoded_with_their_prefix_and_connection() {
    let ns = new_netns();
    run_in(Some(&ns), &["ip", "link", "set", "lo", "up"]);
    run_in(
        Some(&ns),
        &[
            "nft",
            "add table ip t; \
             add chain ip t out { type filter hook output priority 0; }; \
             add rule ip t out udp dport 5001 ct state new log prefix \"API0|np/prod/web\" group 1 snaplen 80; \
             add rule ip t out udp dport 5002 log prefix \"DPE|default\" group 2 snaplen 80 drop",
        ],
    );
    let mut sock = NflogSocket::open(Some(&ns), &[1, 2], 80, 1 << 20).expect("binding groups 1, 2");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");

    // A group has one listener: a second socket cannot take it.
    let second = NflogSocket::open(Some(&ns), &[1], 80, 1 << 16);
    let e = second.expect_err("group 1 is held");
    assert!(format!("{e}").contains("NFLOG group 1"), "{e}");

    udp_to(&ns, "127.0.0.1:5001", 1);
    udp_to(&ns, "127.0.0.1:5002", 1);
    // Each group's instance flushes on its own: the order between groups is not kept.
    let got = read(&mut sock, 2);
    assert_eq!(got.len(), 2, "{got:#?}");
    let of = |g: u16| {
        got.iter()
            .find(|p| p.group == g)
            .unwrap_or_else(|| panic!("no packet for group {g}: {got:#?}"))
    };
    let (allow, deny) = (of(1), of(2));
    assert_eq!(allow.group, 1);
    assert_eq!(allow.prefix, b"API0|np/prod/web");
    assert_eq!(allow.family, libc::AF_INET as u8);
    assert_eq!(allow.outdev, Some(1), "leaves by lo");
    // The headers: IPv4, UDP, to 127.0.0.1:5001.
    let t = allow.five_tuple().expect("the headers");
    assert_eq!(t.dst, "127.0.0.1".parse::<std::net::IpAddr>().unwrap());
    assert_eq!((t.proto, t.dport), (17, 5001));
    assert!(allow.payload.len() <= 80);
    // Its connection, where the kernel has the conntrack glue (Debian's kernels do): tuples
    // present, state new (IP_CT_NEW = 2).
    if sock.with_conntrack() {
        let ct = decode_entry(allow.ct.as_deref().expect("the connection"));
        let t = ct.orig.expect("its original tuple");
        assert_eq!((t.proto, t.dport), (17, 5001), "{ct:#?}");
        assert_eq!(allow.ct_info, Some(2));
    } else {
        eprintln!(
            "this kernel has no NETFILTER_NETLINK_GLUE_CT: packets come without their connection"
        );
        assert_eq!((&allow.ct, allow.ct_info), (&None, None));
    }
    assert_eq!(deny.group, 2);
    assert_eq!(deny.prefix, b"DPE|default");

    // A flood over a small buffer the reader leaves alone: the next reads report the overrun.
    drop(sock);
    let mut small = NflogSocket::open(Some(&ns), &[2], 80, 4096).expect("binding group 2");
    small
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");
    udp_to(&ns, "127.0.0.1:5002", 2000);
    let mut out = Vec::new();
    let mut overrun = false;
    for _ in 0..100 {
        match small.recv(&mut out).expect("reading") {
            Received::Overrun => {
                overrun = true;
                break;
            }
            Received::Packets(_) => {}
        }
    }
    assert!(
        overrun,
        "2,000 packets into 4 KiB: the kernel must have dropped some"
    );
}
