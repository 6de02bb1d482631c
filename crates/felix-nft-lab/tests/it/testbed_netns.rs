//! Named network namespaces (`NetNs::create_named` = `ip netns add`, by syscalls): they are real,
//! separate namespaces that `ip -n NAME` sees, and deleting them — by guard drop, also during a
//! panic — leaves nothing behind in /run/netns or the mount table.

use crate::testbed_common;

use rtnl::netns::{unique_netns_name, NetNs, NetNsError};
use testbed_common::{assert_all_gone, ip_json, made_links, netns_present, require_root};

fn ns_inode(ns: &NetNs) -> std::path::PathBuf {
    ns.run(|| std::fs::read_link("/proc/thread-self/ns/net").unwrap())
        .unwrap()
}

#[test]
fn create_is_a_new_namespace_that_ip_sees_and_delete_leaves_nothing() {
    require_root();
    let name = unique_netns_name("fnt-t-ns");
    let before = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
    let guard = NetNs::create_named(&name).unwrap();
    assert_eq!(guard.name(), name);
    assert!(netns_present(&name), "/run/netns/{name} should exist");
    // A fresh namespace: only lo, and a different nsfs inode from ours.
    let links = ip_json(&name, &["link"]);
    assert_eq!(made_links(&links), ["lo"]);
    assert_ne!(ns_inode(guard.ns()), before);
    // The caller's thread is still where it was.
    assert_eq!(
        std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
        before
    );
    // The same name cannot be taken twice; the first stays intact.
    match NetNs::create_named(&name) {
        Err(NetNsError::Named { source, .. }) => {
            assert_eq!(source.raw_os_error(), Some(libc::EEXIST))
        }
        other => panic!("second create of {name} should fail with EEXIST, got {other:?}"),
    }
    assert!(netns_present(&name));
    drop(guard);
    assert!(!netns_present(&name), "/run/netns/{name} left behind");
}

#[test]
fn explicit_delete_and_drop_after_it_are_fine() {
    require_root();
    let name = unique_netns_name("fnt-t-ns");
    let guard = NetNs::create_named(&name).unwrap();
    NetNs::delete_named(&name).unwrap();
    assert!(!netns_present(&name));
    // Deleting what is gone is not an error (the goal is "gone"), so the guard's drop is quiet.
    NetNs::delete_named(&name).unwrap();
    drop(guard);
    assert!(!netns_present(&name));
}

#[test]
fn a_panicking_test_still_deletes_its_namespace() {
    require_root();
    let name = unique_netns_name("fnt-t-ns");
    let n = name.clone();
    let r = std::panic::catch_unwind(move || {
        let _guard = NetNs::create_named(&n).unwrap();
        assert!(netns_present(&n));
        panic!("test failure while the namespace exists");
    });
    assert!(r.is_err());
    assert!(!netns_present(&name), "/run/netns/{name} survived a panic");
}

#[test]
fn names_are_unique_and_bad_names_are_refused() {
    let a = unique_netns_name("x");
    let b = unique_netns_name("x");
    assert_ne!(a, b);
    assert!(a.starts_with(&format!("x-{}-", std::process::id())));
    for bad in ["", ".", "..", "a/b"] {
        assert!(
            matches!(NetNs::create_named(bad), Err(NetNsError::InvalidName(_))),
            "{bad:?} accepted"
        );
    }
}

#[test]
fn parallel_creates_do_not_collide() {
    require_root();
    let names: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let g = NetNs::create_named(&unique_netns_name("fnt-t-par")).unwrap();
                    let n = g.name().to_string();
                    assert!(netns_present(&n));
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_all_gone(&names);
}
