//! `felix-nft demo` run as a user runs it: the binary builds its scratch node,
//! programs it, measures the matrix, flips one flow with an IP set delta, shows the flow logs of
//! it all and removes everything;
//! `--cluster` does the same for three nodes over VXLAN with a fourth joining and leaving (and,
//! where the kernel has the modules, over IPIP and WireGuard: `--encap`); with
//! `--keep` they leave the namespaces and say how to remove them; without root the demo says so
//! and does nothing. `ip` and `bridge` are used here only as test-side oracles, in the demo's own
//! namespaces.

use crate::route_oracle;
use testkit as common;

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
    let child = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
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

impl Leftovers {
    /// The kept namespace of `role` (`fnft-demo-ROLE-…`).
    fn named(&self, role: &str) -> &str {
        let prefix = format!("fnft-demo-{role}-");
        self.0
            .iter()
            .find(|n| n.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {role} namespace in {:?}", self.0))
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// Runs `felix-nft demo ARGS` to its end as root: it must succeed, `check` reads what it printed,
/// and it must then have removed every namespace it made, within 30 s.
fn demo_to_the_end(args: &[&str], check: impl FnOnce(&str)) {
    require_root();
    let t0 = Instant::now();
    let (out, text, pid) = demo(args);
    let took = t0.elapsed();
    let _guard = Leftovers(namespaces_of(pid));
    assert!(
        out.status.success(),
        "demo {args:?} failed ({:?}):\n{text}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    check(&text);
    assert!(
        namespaces_of(pid).is_empty(),
        "left behind: {:?}",
        namespaces_of(pid)
    );
    assert!(took.as_secs() < 30, "demo {args:?} took {took:?}");
}

/// Runs `felix-nft demo --keep ARGS` as root: it must succeed and name every namespace it kept
/// in a cleanup command. Returns what it printed, the pid it ran as, and the kept namespaces
/// (deleted when the returned guard drops).
fn demo_kept(args: &[&str]) -> (String, u32, Leftovers) {
    require_root();
    let (out, text, pid) = demo(args);
    let left = Leftovers(namespaces_of(pid));
    assert!(
        out.status.success(),
        "demo {args:?} failed:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in &left.0 {
        assert!(
            text.contains(&format!("ip netns del {n}")),
            "{n} not in:\n{text}"
        );
    }
    (text, pid, left)
}

#[test]
fn demo_shows_the_matrix_flips_one_flow_and_leaves_nothing_behind() {
    demo_to_the_end(&[], |text| {
        // What it programmed, read back: both tables, routes and ARP for the three workloads.
        common::assert_contains_all(
            text,
            &[
                "table ip   calico",
                "table ip6  calico",
                "198.18.0.1/32 → cali",
                "198.18.0.2/32 → cali",
                "198.18.0.3/32 → cali",
                "static ARP entries on workload interfaces: 3",
            ],
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
        // The flow logs of it all, as `felix-nft flows` prints them: each verdict with the rule
        // that decided it, the flipped flow both denied at the end of `app` and allowed.
        let flows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("5. flow logs"))
            .take_while(|l| !l.is_empty())
            .collect();
        let shows = |wanted: &str| {
            assert!(
                flows.iter().any(|l| l.contains(wanted)),
                "no flow {wanted:?} in\n{}",
                flows.join("\n")
            )
        };
        shows("frontend -> backend:8080 TCP ingress ALLOWED by gnp app.backend-ingress rule 0");
        shows("frontend -> backend:9090 TCP ingress DENIED by gnp platform.guard rule 0");
        shows("backend -> db:8080 TCP ingress ALLOWED by profile kns.demo rule 0");
        shows("db -> backend:8080 TCP ingress DENIED by end of tier app");
        shows("db -> backend:8080 TCP ingress ALLOWED by gnp app.backend-ingress rule 0");
        assert!(
            text.contains("every flow did what the policy says"),
            "{text}"
        );
    });
}

#[test]
fn demo_keep_leaves_the_node_and_prints_how_to_remove_it() {
    // Every namespace it kept is named in a cleanup command, and the host's cleanup is given.
    let (text, _, kept) = demo_kept(&["--keep"]);
    let left = &kept.0;
    assert_eq!(
        left.len(),
        5,
        "host, external and three workloads: {left:?}"
    );
    let host = kept.named("host");
    assert!(
        text.contains(&format!("felix-nft cleanup --netns {host}")),
        "{text}"
    );
    // What the agent programmed is still there after it stopped (oracle: `ip`).
    let routes = route_oracle::routes(host, &[]);
    assert!(
        routes.contains("198.18.0.3 dev cali"),
        "kept host has no workload route:\n{routes}"
    );
    assert!(Path::new(&format!("/run/netns/{host}")).exists());
}

#[test]
fn demo_cluster_shows_cross_node_verdicts_a_join_and_a_leave_and_leaves_nothing_behind() {
    demo_to_the_end(&["--cluster"], |text| {
        let row = |flow: &str, nth: usize| {
            text.lines()
                .filter(|l| l.trim_start().starts_with(flow))
                .nth(nth)
                .unwrap_or_default()
                .to_string()
        };
        // Three nodes, each with the overlay for the other two, read back from its kernel.
        for n in ["node-1", "node-2", "node-3"] {
            let r = row(&format!("{n}  vni 4096, mtu 1450"), 0);
            assert!(r.contains("   2    2       2  10.65."), "{n}: {r}\n{text}");
        }
        // Across nodes: the policy admits the client on node-1 and drops the batch pod on node-3.
        let v = |flow: &str, nth: usize, verdict: &str| {
            let r = row(flow, nth);
            assert!(
                r.contains(&format!("{verdict:<8}  {verdict:<8}")),
                "{flow} #{nth} should be {verdict}: {r}\n{text}"
            );
        };
        v("client@node-1 → server@node-2 tcp/8080", 0, "PASS");
        v("batch@node-3 → server@node-2 tcp/8080", 0, "DROP");
        v("server@node-2 → batch@node-3 icmp", 0, "PASS");
        assert!(text.contains("5 flows, 5 as expected"), "{text}");
        // node-4 joins: four nodes with three peers each, its client admitted on node-2.
        assert!(
            text.contains("node-2: ipset_delta_update s:clients +10.65.4.2/32, vtep_update node-4"),
            "{text}"
        );
        assert!(
            row("node-4  vni 4096", 0).contains("   3    3       3  10.65.4.0/26"),
            "{text}"
        );
        v("client-4@node-4 → server@node-2 tcp/8080", 0, "PASS");
        v("batch@node-3 → client-4@node-4 icmp", 0, "PASS");
        assert!(text.contains("3 flows, 3 as expected"), "{text}");
        // node-4 leaves: withdrawn everywhere, route before VTEP; traffic to and from it fails.
        common::assert_contains_all(
            text,
            &[
                "node-1: route_remove 10.65.4.0/26, vtep_remove node-4",
                "nothing of node-4 is left anywhere",
            ],
        );
        v("client-4@node-4 → server@node-2 tcp/8080", 1, "DROP");
        v("batch@node-3 → client-4@node-4 icmp", 1, "DROP");
        v("client@node-1 → server@node-2 tcp/8080", 1, "PASS");
        assert_eq!(text.matches("flipped (was PASS)").count(), 3, "{text}");
        assert!(!text.contains("MISMATCH") && !text.contains('✗'), "{text}");
        common::assert_contains_all(
            text,
            &[
                "4 flows, 4 as expected",
                "every flow did what the policy says, and every node held what it should",
            ],
        );
    });
}

/// Whether this kernel has `module` (loaded as a distribution's boot would load it; the demo
/// itself loads nothing).
fn kernel_has(module: &str) -> bool {
    let _ = Command::new("modprobe").args(["-q", module]).status();
    Path::new("/sys/module").join(module).exists()
}

/// IPIP and WireGuard: where the kernel has the module (the VM bed), the same story over tunl0
/// and over wireguard.cali, with the WireGuard keys going round through the controller; where
/// not (our build machines), the demo says which module is missing, exits non-zero and leaves
/// nothing behind.
#[test]
fn demo_cluster_runs_over_ipip_and_wireguard_where_the_kernel_can() {
    require_root();
    for encap in ["ipip", "wireguard"] {
        let args = ["--cluster", "--encap", encap];
        if !kernel_has(encap) {
            let (out, text, pid) = demo(&args);
            let _guard = Leftovers(namespaces_of(pid));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{encap}: {text}");
            assert!(
                stderr.contains(&format!("this kernel has no {encap} module")),
                "{encap}: {stderr}"
            );
            assert!(namespaces_of(pid).is_empty(), "{encap}: left behind");
            continue;
        }
        demo_to_the_end(&args, |text| {
            let row = |start: &str| {
                text.lines()
                    .find(|l| l.trim_start().starts_with(start))
                    .unwrap_or_default()
                    .to_string()
            };
            match encap {
                "ipip" => {
                    // tunl0 with its tunnel address, two routes through it on each node.
                    for (n, k) in [("node-1", 1), ("node-2", 2), ("node-3", 3)] {
                        let r = row(&format!("{n}  mtu 1480, 10.65.{k}.0/32"));
                        assert!(r.contains("        2  10.65."), "{n}: {r}\n{text}");
                    }
                    assert!(text.contains("dev tunl0 onlink proto 80"), "{text}");
                }
                _ => {
                    // Keys reported and handed round; two peers and two table routes each.
                    assert!(text.contains("reported the public one"), "{text}");
                    assert!(text.contains("wireguard_endpoint_update node-4"), "{text}");
                    for (n, k) in [("node-1", 1), ("node-2", 2), ("node-3", 3)] {
                        let r = row(&format!("{n}  port 51820, mtu 1440, 10.65.{k}.0/32"));
                        assert!(r.contains("   2       2  10.65."), "{n}: {r}\n{text}");
                    }
                    assert!(
                        text.contains("node-2 has no WireGuard peer node-4 any more"),
                        "{text}"
                    );
                }
            }
            common::assert_contains_all(
                text,
                &[
                    "5 flows, 5 as expected",
                    "nothing of node-4 is left anywhere",
                    "every flow did what the policy says, and every node held what it should",
                ],
            );
            assert!(!text.contains("MISMATCH") && !text.contains('✗'), "{text}");
        });
    }
}

#[test]
fn demo_cluster_keep_leaves_the_three_nodes_as_programmed() {
    // Every namespace it kept is named in a cleanup command.
    let (_, pid, kept) = demo_kept(&["--cluster", "--keep"]);
    let left = &kept.0;
    // The underlay, three nodes and their pods; node-4 left during the demo.
    assert_eq!(left.len(), 7, "{left:?}");
    // Names are `fnft-demo-ROLE-PID-N`: the pid may start with a 4 too.
    let gone = [format!("-node-4-{pid}-"), format!("-client-4-{pid}-")];
    assert!(
        !left.iter().any(|n| gone.iter().any(|g| n.contains(g))),
        "{left:?}"
    );
    // What the agents programmed stays after they stopped (oracle: `bridge`, `ip`).
    let node1 = kept.named("node-1");
    let fdb = common::oracle_stdout(
        Command::new("bridge").args(["-n", node1, "fdb", "show", "dev", "vxlan.calico"]),
        "bridge fdb",
    );
    let fdb = String::from_utf8_lossy(&fdb);
    common::assert_contains_all(
        &fdb,
        &[
            "dst 172.31.0.12 self permanent",
            "dst 172.31.0.13 self permanent",
        ],
    );
    assert!(!fdb.contains("172.31.0.14"), "node-4 stayed:\n{fdb}");
    let routes = route_oracle::routes(node1, &[]);
    assert!(
        routes.lines().any(
            |l| l.starts_with("10.65.2.0/26 via 10.65.2.0 dev vxlan.calico")
                && l.contains("onlink")
        ),
        "{routes}"
    );
    assert!(routes.contains("blackhole 10.65.1.0/26"), "{routes}");
}

#[test]
fn demo_without_root_says_so_and_touches_nothing() {
    require_root();
    // Run as `nobody`: the binary must refuse before it makes anything, with either demo.
    for args in [&[][..], &["--cluster"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
            .arg("demo")
            .args(args)
            .uid(65534)
            .gid(65534)
            .output()
            .expect("spawning felix-nft demo as nobody");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} stderr:\n{err}");
        assert!(err.contains("needs root"), "{err}");
        assert_eq!(err.lines().count(), 1, "one line of reason:\n{err}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "",
            "nothing on stdout"
        );
    }
}

#[test]
fn demo_cluster_executes_no_program() {
    require_root();
    // The whole cluster demo — bed, controller, four agents, probes, teardown — under
    // `strace -f -e trace=execve` (test tool): the only execve is the binary's own start.
    let trace = tempfile::NamedTempFile::new().expect("a temporary file");
    let bin = env!("CARGO_BIN_EXE_felix-nft-lab");
    let out = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=execve", "-o"])
        .arg(trace.path())
        .args([bin, "demo", "--cluster"])
        .output()
        .expect("running strace (test tool)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo --cluster under strace failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = std::fs::read_to_string(trace.path()).expect("reading the trace");
    let execs: Vec<&str> = trace.lines().filter(|l| l.contains("execve(")).collect();
    assert_eq!(
        execs.len(),
        1,
        "the demo executed programs:\n{}",
        execs.join("\n")
    );
    assert!(execs[0].contains(bin), "{}", execs[0]);
}
