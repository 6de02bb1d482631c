//! Privileged: WireGuard devices over generic netlink (`rtnl::wireguard`). Where the kernel has
//! the module (the VM bed's kernels), a device is created, given a key, port and fwmark, and
//! peers are added (one with more allowed IPs than one message carries), appended to, replaced,
//! updated and removed; `wg show` is the oracle, and what the socket reads back must agree with
//! it. Where it has not (our build machines), both the link and the family are refused as
//! unsupported, not as some other failure.

use testkit::rtnl as rtnl_common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use base64::Engine;
use ipnet::IpNet;
use rtnl::wireguard::{self, PeerUpdate, WgSocket, WgUpdate};
use rtnl::RtnlHandle;
use rtnl_common::{in_netns_async, run_in};

fn kernel_has_wireguard() -> bool {
    let _ = Command::new("modprobe").args(["-q", "wireguard"]).status();
    let have = Path::new("/sys/module/wireguard").exists();
    eprintln!("this kernel has the wireguard module: {have}");
    have
}

fn b64(k: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(k)
}

/// `wg show DEV dump`: the device line, then one line per peer (key, psk, endpoint, allowed
/// IPs, handshake, rx, tx, keepalive).
fn wg_dump(dev: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let out = run_in(None, &["wg", "show", dev, "dump"]);
    let mut lines = out
        .lines()
        .map(|l| l.split('\t').map(String::from).collect::<Vec<_>>());
    let dev = lines.next().expect("the device line");
    (dev, lines.collect())
}

fn nets(n: usize, second: u8) -> Vec<IpNet> {
    (0..n)
        .map(|i| IpNet::new([10, second, (i / 256) as u8, (i % 256) as u8].into(), 32).unwrap())
        .collect()
}

fn set_of(s: &str) -> BTreeSet<String> {
    s.split(',')
        .filter(|x| !x.is_empty() && *x != "(none)")
        .map(String::from)
        .collect()
}

#[test]
fn devices_keys_and_peers_go_over_generic_netlink() {
    if !kernel_has_wireguard() {
        return in_netns_async(|| async {
            let h = RtnlHandle::connect(None).unwrap();
            let e = wireguard::create_device(&h, "wg0").await.unwrap_err();
            assert!(e.is_unsupported(), "{e:?}");
            let e = WgSocket::open(None).unwrap_err();
            assert!(e.is_unsupported(), "{e:?}");
        });
    }
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        wireguard::create_device(&h, "wg0").await.unwrap();
        let mut wg = WgSocket::open(None).unwrap();

        // A new device has no key.
        let d = wg.get_device("wg0").unwrap();
        assert_eq!(
            (d.private_key, d.public_key, d.peers.len()),
            (None, None, 0)
        );

        // Key, port, fwmark, and two peers: one with 600 allowed IPs (three messages' worth).
        let private = wireguard::generate_private_key().unwrap();
        let (k1, k2) = ([1u8; 32], [2u8; 32]);
        let ep1: SocketAddr = "172.31.0.11:51820".parse().unwrap();
        let mut p1 = PeerUpdate::new(k1);
        p1.endpoint = Some(ep1);
        p1.keepalive = Some(25);
        p1.allowed_ips = nets(600, 1);
        let mut p2 = PeerUpdate::new(k2);
        p2.endpoint = Some("[fd00::12]:51820".parse().unwrap());
        p2.allowed_ips = vec![
            "10.65.2.0/26".parse().unwrap(),
            "fd65::2:0/122".parse().unwrap(),
        ];
        wg.set_device(
            "wg0",
            &WgUpdate {
                private_key: Some(private),
                listen_port: Some(51820),
                fwmark: Some(0x200000),
                peers: vec![p1, p2],
            },
        )
        .unwrap();

        let (dev, peers) = wg_dump("wg0");
        assert_eq!(dev[0], b64(&private), "private key");
        assert_eq!((dev[2].as_str(), dev[3].as_str()), ("51820", "0x200000"));
        let d = wg.get_device("wg0").unwrap();
        assert_eq!(d.private_key, Some(private));
        assert_eq!(
            d.public_key.map(|k| b64(&k)).as_deref(),
            Some(dev[1].as_str()),
            "public key as wg derives it"
        );
        assert_eq!((d.listen_port, d.fwmark), (51820, 0x200000));
        assert_eq!(peers.len(), 2);
        let line = |key: &[u8; 32]| -> Vec<String> {
            let (_, peers) = wg_dump("wg0");
            peers
                .into_iter()
                .find(|p| p[0] == b64(key))
                .expect("the peer")
        };
        let l1 = line(&k1);
        assert_eq!(l1[2], "172.31.0.11:51820");
        assert_eq!(l1[7], "25");
        let want: BTreeSet<String> = nets(600, 1).iter().map(ToString::to_string).collect();
        assert_eq!(
            set_of(&l1[3]),
            want,
            "600 allowed IPs over several messages"
        );
        let read1 = d
            .peers
            .iter()
            .find(|p| p.public_key == k1)
            .expect("peer 1 read back");
        assert_eq!(read1.allowed_ips.len(), 600, "merged from the dump's parts");
        assert_eq!(read1.endpoint, Some(ep1));
        assert_eq!(line(&k2)[2], "[fd00::12]:51820");

        // Appended (update only), then replaced: the list follows.
        let mut more = PeerUpdate::new(k2);
        more.update_only = true;
        more.allowed_ips = vec!["10.65.9.9/32".parse().unwrap()];
        wg.set_device(
            "wg0",
            &WgUpdate {
                peers: vec![more],
                ..WgUpdate::default()
            },
        )
        .unwrap();
        assert_eq!(
            set_of(&line(&k2)[3]),
            ["10.65.2.0/26", "10.65.9.9/32", "fd65::2:0/122"]
                .map(String::from)
                .into()
        );
        let mut replace = PeerUpdate::new(k2);
        replace.update_only = true;
        replace.replace_allowed_ips = true;
        replace.allowed_ips = vec!["10.65.2.0/26".parse().unwrap()];
        wg.set_device(
            "wg0",
            &WgUpdate {
                peers: vec![replace],
                ..WgUpdate::default()
            },
        )
        .unwrap();
        assert_eq!(set_of(&line(&k2)[3]), ["10.65.2.0/26".to_string()].into());

        // An update-only change to a peer that does not exist creates nothing.
        let mut ghost = PeerUpdate::new([3u8; 32]);
        ghost.update_only = true;
        ghost.allowed_ips = vec!["10.65.3.0/26".parse().unwrap()];
        wg.set_device(
            "wg0",
            &WgUpdate {
                peers: vec![ghost],
                ..WgUpdate::default()
            },
        )
        .unwrap();
        assert_eq!(wg_dump("wg0").1.len(), 2);

        // Removed: gone, the other stays.
        wg.set_device(
            "wg0",
            &WgUpdate {
                peers: vec![PeerUpdate::remove(k1)],
                ..WgUpdate::default()
            },
        )
        .unwrap();
        let (_, peers) = wg_dump("wg0");
        assert_eq!(
            peers.iter().map(|p| p[0].clone()).collect::<Vec<_>>(),
            [b64(&k2)]
        );

        // A device that does not exist is an error that names it.
        let e = wg.get_device("wg-none").unwrap_err();
        assert!(format!("{e}").contains("wg-none"), "{e}");
    });
}
