//! `felix-nft demo` run as a user runs it: the binary builds its scratch node,
//! programs it, measures the matrix, flips one flow with an IP set delta and removes everything;
//! with `--keep` it leaves the namespaces and says how to remove them; without root it says so
//! and does nothing. `ip` is used here only as a test-side oracle, in the demo's own namespaces.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this privileged test runs `felix-nft demo`, which creates network namespaces; run the \
         tests as root"
    );
}

fn demo(args: &[&str]) -> (Output, String, u32) {
    let child = Command::new(env!("CARGO_BIN_EXE_felix-nft"))
        .arg("demo")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning felix-nft demo");
    let pid = child.id();
    let out = child
        .wait_with_output()
        .expect("waiting for felix-nft demo");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text, pid)
}

/// Namespaces under /run/netns that the demo process `pid` made (`fnft-demo-ROLE-PID-N`).
fn namespaces_of(pid: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mark = format!("-{pid}-");
    let mut v: Vec<String> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fnft-demo-") && n.contains(&mark))
        .collect();
    v.sort();
    v
}

/// Deletes the namespaces a `--keep` run left, also when the test fails.
struct Leftovers(Vec<String>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

#[test]
fn demo_shows_the_matrix_flips_one_flow_and_leaves_nothing_behind() {
    require_root();
    let t0 = Instant::now();
    let (out, text, pid) = demo(&[]);
    let took = t0.elapsed();
    let _guard = Leftovers(namespaces_of(pid));
    assert!(
        out.status.success(),
        "demo failed ({:?}):\n{text}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    // What it programmed, read back: both tables, routes and ARP for the three workloads.
    assert!(text.contains("table ip   calico"), "{text}");
    assert!(text.contains("table ip6  calico"), "{text}");
    for ip in [
        "198.18.0.1/32 → cali",
        "198.18.0.2/32 → cali",
        "198.18.0.3/32 → cali",
    ] {
        assert!(text.contains(ip), "route {ip} missing:\n{text}");
    }
    assert!(
        text.contains("static ARP entries on workload interfaces: 3"),
        "{text}"
    );
    // Both matrices measured and matched, with both verdicts present.
    assert_eq!(text.matches("8 flows, 8 as expected").count(), 2, "{text}");
    assert!(!text.contains("MISMATCH"), "{text}");
    let db_row = |after: bool| {
        text.lines()
            .filter(|l| l.contains("db → backend tcp/8080"))
            .nth(usize::from(after))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        db_row(false).contains("DROP      DROP"),
        "{}",
        db_row(false)
    );
    assert!(
        db_row(true).contains("PASS      PASS") && db_row(true).contains("flipped (was DROP)"),
        "{}",
        db_row(true)
    );
    // Exactly one flow flipped.
    assert_eq!(text.matches("flipped").count(), 1, "{text}");
    // NAT outgoing: the external host saw the host's transit address only.
    assert!(text.contains("saw connections from [192.0.2.1]"), "{text}");
    assert!(
        text.contains("every flow did what the policy says"),
        "{text}"
    );
    // Everything removed.
    assert!(
        namespaces_of(pid).is_empty(),
        "left behind: {:?}",
        namespaces_of(pid)
    );
    assert!(took.as_secs() < 30, "the demo took {took:?}");
}

#[test]
fn demo_keep_leaves_the_node_and_prints_how_to_remove_it() {
    require_root();
    let (out, text, pid) = demo(&["--keep"]);
    let left = namespaces_of(pid);
    let _guard = Leftovers(left.clone());
    assert!(
        out.status.success(),
        "demo --keep failed:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        left.len(),
        5,
        "host, external and three workloads: {left:?}"
    );
    // Every namespace it kept is named in a cleanup command, and the host's cleanup is given.
    for n in &left {
        assert!(
            text.contains(&format!("ip netns del {n}")),
            "{n} not in:\n{text}"
        );
    }
    let host = left
        .iter()
        .find(|n| n.starts_with("fnft-demo-host-"))
        .expect("a host namespace");
    assert!(
        text.contains(&format!("felix-nft cleanup --netns {host}")),
        "{text}"
    );
    // What the agent programmed is still there after it stopped (oracle: `ip`).
    let routes = Command::new("ip")
        .args(["-n", host, "route", "show"])
        .output()
        .expect("ip route");
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert!(
        routes.contains("198.18.0.3 dev cali"),
        "kept host has no workload route:\n{routes}"
    );
    assert!(Path::new(&format!("/run/netns/{host}")).exists());
}

#[test]
fn demo_without_root_says_so_and_touches_nothing() {
    require_root();
    // Run as `nobody`: the binary must refuse before it makes anything.
    let out = Command::new(env!("CARGO_BIN_EXE_felix-nft"))
        .arg("demo")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("spawning felix-nft demo as nobody");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{err}");
    assert!(err.contains("needs root"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line of reason:\n{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
