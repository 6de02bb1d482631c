//! The one-shot commands driven as the binary, each test in named network namespaces it makes
//! (and deletes again, also on panic): `apply` twice is a no-op the second time (c), `plan`
//! lists exactly what `apply` then changes (d), routes of a missing interface are parked and
//! programmed once it appears, `cleanup` removes everything of ours and nothing else (f), an
//! invalid state document changes nothing byte for byte (g), and `--dry-run` surfaces a kernel
//! error while keeping nothing. `nft`, `ip` are oracles only.

use testkit as common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};

/// A named namespace (`ip netns add`) acting as the host, with a companion "workload" namespace
/// holding the far ends of the veth pairs; both deleted on drop.
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("osh-{tag}-{}", std::process::id());
        for n in [name.clone(), format!("{name}-w")] {
            // A leftover from an aborted run would make `add` fail.
            let _ = Command::new("ip").args(["netns", "del", &n]).output();
            sh(&["ip", "netns", "add", &n]);
            sh(&["ip", "-n", &n, "link", "set", "lo", "up"]);
        }
        Ns(name)
    }

    fn workload_ns(&self) -> String {
        format!("{}-w", self.0)
    }

    fn name(&self) -> &str {
        &self.0
    }

    /// `ip -n NS ARGS`.
    fn ip(&self, args: &[&str]) -> String {
        let mut argv = vec!["ip", "-n", self.name()];
        argv.extend_from_slice(args);
        sh(&argv)
    }

    /// Runs a command inside the namespace (`ip netns exec`).
    fn exec(&self, args: &[&str]) -> String {
        let mut argv = vec!["ip", "netns", "exec", self.name()];
        argv.extend_from_slice(args);
        sh(&argv)
    }

    /// A new namespace `name` with a workload veth pair per `(iface, peer)` of `veths`.
    fn with_veths(name: &str, veths: &[(&str, &str)]) -> Ns {
        let ns = Ns::new(name);
        for (iface, peer) in veths {
            ns.veth(iface, peer);
        }
        ns
    }

    /// A veth pair `name` ↔ `peer`, `peer` in the workload namespace, both up, so `name` is
    /// operationally up.
    fn veth(&self, name: &str, peer: &str) {
        let wl = self.workload_ns();
        self.ip(&[
            "link", "add", name, "type", "veth", "peer", "name", peer, "netns", &wl,
        ]);
        self.ip(&["link", "set", name, "up"]);
        sh(&["ip", "-n", &wl, "link", "set", peer, "up"]);
    }

    /// A host interface that is not a workload's (a veth pair kept in this namespace).
    fn host_iface(&self, name: &str) {
        let peer = format!("{name}p");
        self.ip(&["link", "add", name, "type", "veth", "peer", "name", &peer]);
        self.ip(&["link", "set", name, "up"]);
        self.ip(&["link", "set", &peer, "up"]);
    }

    /// Everything `apply` could touch, as the kernel's own tools print it. Rule counters are
    /// left out (`nft -s`): the kernel counts the veths' IPv6 autoconfiguration packets.
    /// What the agent may write: the ruleset, routes and permanent neighbours. Left out is what
    /// the kernel adds and drops on its own while the links settle (`proto kernel` routes such
    /// as IPv6 link-local and multicast ones, neighbours it resolves), which would otherwise
    /// make two reads of an unchanged node differ.
    fn kernel_state(&self) -> String {
        let keep = |text: String, want: fn(&str) -> bool| {
            text.lines()
                .filter(|l| want(l))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let ours = |l: &str| !l.contains("proto kernel");
        [
            self.exec(&["nft", "-s", "list", "ruleset"]),
            keep(self.ip(&["route", "show", "table", "all"]), ours),
            keep(self.ip(&["-6", "route", "show", "table", "all"]), ours),
            keep(self.ip(&["neigh", "show"]), |l| l.contains("PERMANENT")),
        ]
        .join("\n--\n")
    }

    fn ruleset(&self) -> String {
        self.exec(&["nft", "list", "ruleset"])
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.workload_ns()])
            .output();
    }
}

fn sh(argv: &[&str]) -> String {
    let what = format!("{argv:?} (these tests need root)");
    String::from_utf8(common::oracle_stdout(
        Command::new(argv[0]).args(&argv[1..]),
        &what,
    ))
    .unwrap()
}

/// What one run of the binary said.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "felix-nft failed:\n{}\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// The first line starting with `prefix`.
    fn line(&self, prefix: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{}", self.stdout))
    }

    /// The route/neighbour/sysctl change lines, without their verb's tense.
    fn changes(&self) -> BTreeSet<String> {
        self.stdout
            .lines()
            .filter(|l| {
                [
                    "route add ",
                    "route replace ",
                    "route delete ",
                    "neigh ",
                    "sysctl ",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            })
            .map(str::to_string)
            .collect()
    }

    /// `nf_tables: N operation(s)` → N.
    fn table_ops(&self) -> usize {
        let l = self.line("nf_tables: ");
        l["nf_tables: ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }
}

fn empty_config() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("osh-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("felix.cfg");
    std::fs::write(&p, "").unwrap();
    p
}

fn felix_nft(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix-nft"));
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .arg("--config")
        .arg(empty_config())
        .envs(env.iter().copied());
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("running felix-nft");
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

fn state_file(tag: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("osh-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{tag}.json"));
    std::fs::write(&p, text).unwrap();
    p
}

/// Two workloads on `cali1a` (10.65.0.2) and `cali2b` (10.65.0.3), a profile referencing an IP
/// set.
const GOOD: &str = r#"[
{"ipset_update":{"id":"s:web","members":["10.65.0.0/24"],"type":2}},
{"active_profile_update":{"id":{"name":"kns.prod"},"profile":{"inbound_rules":[{"action":"allow","src_ip_set_ids":["s:web"]}],"outbound_rules":[{"action":"allow"}]}}},
{"workload_endpoint_update":{"id":{"orchestrator_id":"k8s","workload_id":"prod/a","endpoint_id":"eth0"},"endpoint":{"state":"active","name":"cali1a","mac":"ee:ee:ee:ee:ee:01","profile_ids":["kns.prod"],"ipv4_nets":["10.65.0.2/32"]}}},
{"workload_endpoint_update":{"id":{"orchestrator_id":"k8s","workload_id":"prod/b","endpoint_id":"eth0"},"endpoint":{"state":"active","name":"cali2b","mac":"ee:ee:ee:ee:ee:02","profile_ids":["kns.prod"],"ipv4_nets":["10.65.0.3/32"]}}}
]"#;

/// A namespace with both workload interfaces of `GOOD`, and `GOOD` applied to it; returns the
/// namespace and the document's path.
fn ns_with_good_applied(name: &str) -> (Ns, PathBuf) {
    let ns = Ns::with_veths(name, &[("cali1a", "w1"), ("cali2b", "w2")]);
    let good = state_file(&format!("{name}-good"), GOOD);
    felix_nft(
        &["apply", good.to_str().unwrap(), "--netns", ns.name()],
        &[],
    )
    .ok();
    (ns, good)
}

/// Every class of input error the brief names, one per message.
const BAD: &str = r#"[
{"active_profile_update":{"id":{"name":"kns.prod"},"profile":{"inbound_rules":[{"action":"allow","src_ip_set_ids":["s:nope"]}]}}},
{"workload_endpoint_update":{"id":{"orchestrator_id":"k8s","workload_id":"prod/a","endpoint_id":"eth0"},"endpoint":{"state":"active","name":"cali1a","ipv4_nets":["10.65.0.300/32"]}}},
{"workload_endpoint_update":{"id":{"orchestrator_id":"k8s","workload_id":"prod/b","endpoint_id":"eth0"},"endpoint":{"state":"active","name":"cali0123456789abc","ipv4_nets":["10.65.0.3/32"]}}},
{"ipset_update":{"id":"s:dup","members":["10.0.0.1"]}},
{"ipset_update":{"id":"s:dup","members":["10.0.0.2"]}}
]"#;

#[test]
fn apply_twice_is_a_no_op_the_second_time() {
    let ns = Ns::with_veths("twice", &[("cali1a", "w1"), ("cali2b", "w2")]);
    let good = state_file("twice", GOOD);
    let args = ["apply", good.to_str().unwrap(), "--netns", ns.name()];
    // Each batch sent is logged at debug.
    let debug = [("FELIX_LOGSEVERITYSCREEN", "debug")];
    let first = felix_nft(&args, &debug).ok();
    assert!(first.table_ops() > 100, "{}", first.stdout);
    assert!(first.stderr.contains("nf_tables transaction done"));
    assert_eq!(
        first.line("routes: "),
        "routes: 2 added, 0 replaced, 0 deleted, 0 parked, 0 in grace"
    );
    let programmed = ns.kernel_state();

    // Watch every route and neighbour message the kernel emits during the second run.
    let mut monitor = Command::new("ip")
        .args(["-n", ns.name(), "monitor", "route", "neigh"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let second = felix_nft(&args, &debug).ok();
    std::thread::sleep(std::time::Duration::from_millis(200));
    monitor.kill().unwrap();
    let events = String::from_utf8(monitor.wait_with_output().unwrap().stdout).unwrap();
    let ours: Vec<&str> = events.lines().filter(|l| l.contains("10.65.")).collect();
    assert!(ours.is_empty(), "the second apply wrote: {ours:?}");
    assert!(second.stdout.starts_with("converged: nothing changed\n"));
    assert_eq!(second.table_ops(), 0);
    assert_eq!(
        second.line("routes: "),
        "routes: 0 added, 0 replaced, 0 deleted, 0 parked, 0 in grace"
    );
    assert_eq!(
        second.line("neighbours: "),
        "neighbours: 0 set, 0 deleted, 0 interface(s) parked"
    );
    assert_eq!(second.line("sysctls: "), "sysctls: 0 changed");
    // The log says no batch was sent: the reconciler logs every batch it sends.
    assert!(
        !second.stderr.contains("nf_tables transaction done"),
        "{}",
        second.stderr
    );
    assert!(second.stderr.contains("no transaction sent"));
    assert_eq!(ns.kernel_state(), programmed);
}

#[test]
fn plan_lists_exactly_what_apply_changes() {
    let ns = Ns::with_veths("plan", &[("cali1a", "w1"), ("cali2b", "w2")]);
    // Stale state of ours for apply to remove: a proto-80 route, a permanent neighbour on a
    // workload interface that no endpoint wants.
    ns.ip(&["route", "add", "10.99.0.1", "dev", "cali1a", "proto", "80"]);
    ns.ip(&[
        "neigh",
        "replace",
        "10.65.0.9",
        "lladdr",
        "02:00:00:00:00:09",
        "dev",
        "cali2b",
        "nud",
        "permanent",
    ]);
    let good = state_file("plan", GOOD);
    let path = good.to_str().unwrap();

    let before = ns.kernel_state();
    let plan = felix_nft(&["plan", path, "--netns", ns.name()], &[]).ok();
    assert_eq!(ns.kernel_state(), before, "plan touched the kernel");
    assert!(plan.stdout.contains("add table ip calico"));

    let apply = felix_nft(&["apply", path, "--netns", ns.name()], &[]).ok();
    assert_eq!(apply.table_ops(), plan.table_ops());
    let planned = plan.changes();
    assert_eq!(apply.changes(), planned);
    for line in [
        "route add 10.65.0.2/32 metric 1024 dev cali1a proto 3",
        "route add 10.65.0.3/32 metric 1024 dev cali2b proto 3",
        "route delete 10.99.0.1/32 metric 0 dev cali1a proto 80",
        "neigh set 10.65.0.2 lladdr ee:ee:ee:ee:ee:01 dev cali1a",
        "neigh delete 10.65.0.9 dev cali2b",
        "sysctl net/ipv4/conf/cali1a/proxy_arp 0 -> 1",
    ] {
        assert!(
            planned.contains(line),
            "plan lacks `{line}`:\n{}",
            plan.stdout
        );
    }

    // The kernel before/after agrees with the plan.
    let routes = ns.ip(&["route", "show"]);
    assert!(routes.contains("10.65.0.2 dev cali1a scope link metric 1024"));
    assert!(!routes.contains("10.99.0.1"), "{routes}");
    let neigh = ns.ip(&["neigh", "show", "nud", "permanent"]);
    assert!(neigh.contains("10.65.0.2 dev cali1a lladdr ee:ee:ee:ee:ee:01 PERMANENT"));
    assert!(!neigh.contains("10.65.0.9"), "{neigh}");
    assert_eq!(
        ns.exec(&["sysctl", "-n", "net.ipv4.conf.cali1a.proxy_arp"])
            .trim(),
        "1"
    );
    assert!(ns.ruleset().contains("table ip calico"));

    let again = felix_nft(&["plan", path, "--netns", ns.name()], &[]).ok();
    assert!(
        again.stdout.starts_with("nothing to do\n"),
        "{}",
        again.stdout
    );
    assert_eq!(again.table_ops(), 0);
    assert!(again.changes().is_empty(), "{}", again.stdout);
}

#[test]
fn routes_of_a_missing_interface_are_parked_then_programmed() {
    let ns = Ns::with_veths("park", &[("cali1a", "w1")]);
    let good = state_file("park", GOOD);
    let args = ["apply", good.to_str().unwrap(), "--netns", ns.name()];
    let first = felix_nft(&args, &[]).ok();
    assert!(first
        .stdout
        .contains("route parked 10.65.0.3/32 metric 1024 (interface cali2b absent or down)"));
    // The endpoint is programmed all the same: its chains and its dispatch-map element.
    let rules = ns.ruleset();
    assert!(rules.contains("\"cali2b\""), "{rules}");
    assert!(!ns.ip(&["route", "show"]).contains("10.65.0.3"));

    ns.veth("cali2b", "w2");
    let second = felix_nft(&args, &[]).ok();
    assert_eq!(second.table_ops(), 0, "{}", second.stdout);
    assert!(second
        .stdout
        .contains("route add 10.65.0.3/32 metric 1024 dev cali2b proto 3"));
    assert!(second
        .stdout
        .contains("neigh set 10.65.0.3 lladdr ee:ee:ee:ee:ee:02 dev cali2b"));
    assert!(ns
        .ip(&["route", "show"])
        .contains("10.65.0.3 dev cali2b scope link metric 1024"));
}

#[test]
fn route_sync_disabled_skips_route_work() {
    let ns = Ns::with_veths("nosync", &[("cali1a", "w1")]);
    let good = state_file("nosync", GOOD);
    let run = felix_nft(
        &["apply", good.to_str().unwrap(), "--netns", ns.name()],
        &[("FELIX_ROUTESYNCDISABLED", "true")],
    )
    .ok();
    assert!(run.stdout.contains("routes: skipped (RouteSyncDisabled)"));
    assert!(!ns.ip(&["route", "show"]).contains("10.65.0.2"));
    assert!(ns.ruleset().contains("table ip calico"));
    // Routes on workload interfaces belong to whoever syncs them then: cleanup keeps them.
    ns.ip(&["route", "add", "10.65.0.2", "dev", "cali1a"]);
    let clean = felix_nft(
        &["cleanup", "--netns", ns.name()],
        &[("FELIX_ROUTESYNCDISABLED", "true")],
    )
    .ok();
    assert!(clean
        .stdout
        .contains("routes and neighbours: skipped (RouteSyncDisabled)"));
    assert_eq!(
        clean.line("removed: "),
        "removed: 4 table(s), 0 route(s), 0 neighbour(s)"
    );
    assert!(ns.ip(&["route", "show"]).contains("10.65.0.2 dev cali1a"));
}

#[test]
fn cleanup_removes_ours_only_and_is_idempotent() {
    let (ns, _) = ns_with_good_applied("clean");
    // Foreign objects that must survive.
    ns.exec(&["nft", "add", "table", "inet", "foreign"]);
    ns.exec(&["nft", "add", "table", "ip6", "other"]);
    ns.host_iface("eth9");
    ns.ip(&["route", "add", "192.0.2.0/24", "dev", "eth9"]);
    ns.ip(&[
        "route",
        "add",
        "198.51.100.0/24",
        "dev",
        "eth9",
        "proto",
        "static",
    ]);
    ns.ip(&[
        "neigh",
        "replace",
        "192.0.2.7",
        "lladdr",
        "02:00:00:00:00:07",
        "dev",
        "eth9",
        "nud",
        "permanent",
    ]);

    let dump = felix_nft(&["dump", "--netns", ns.name()], &[]).ok();
    assert!(dump
        .stdout
        .starts_with("tables: 4, routes: 2, neighbours: 2\n"));
    let json = felix_nft(&["dump", "--json", "--netns", ns.name()], &[]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    // Main and side table of both families.
    assert_eq!(v["tables"].as_array().unwrap().len(), 4);
    assert!(v["tables"][0]["rules"].as_u64().unwrap() > 50);
    assert_eq!(v["routes"].as_array().unwrap().len(), 2);
    assert_eq!(v["neighbours"][0]["lladdr"], "ee:ee:ee:ee:ee:01");

    let clean = felix_nft(&["cleanup", "--netns", ns.name()], &[]).ok();
    assert_eq!(
        clean.line("removed: "),
        "removed: 4 table(s), 2 route(s), 2 neighbour(s)"
    );
    let tables = ns.exec(&["nft", "list", "tables"]);
    assert!(!tables.contains("calico"), "{tables}");
    assert!(tables.contains("table inet foreign") && tables.contains("table ip6 other"));
    let routes = ns.ip(&["route", "show"]);
    assert!(!routes.contains("cali"), "{routes}");
    assert!(ns.ip(&["route", "show", "proto", "80"]).trim().is_empty());
    assert!(routes.contains("192.0.2.0/24 dev eth9"), "{routes}");
    assert!(
        routes.contains("198.51.100.0/24 dev eth9 proto static"),
        "{routes}"
    );
    let neigh = ns.ip(&["neigh", "show", "nud", "permanent"]);
    assert!(!neigh.contains("cali"), "{neigh}");
    assert!(neigh.contains("192.0.2.7 dev eth9"), "{neigh}");

    let state = ns.kernel_state();
    let again = felix_nft(&["cleanup", "--netns", ns.name()], &[]).ok();
    assert!(again.stdout.starts_with("nothing to do\n"));
    assert_eq!(ns.kernel_state(), state);
    let dump = felix_nft(&["dump", "--netns", ns.name()], &[]).ok();
    assert!(dump
        .stdout
        .starts_with("tables: 0, routes: 0, neighbours: 0\n"));
}

fn assert_rejected_listing_every_error(run: &Run) {
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    for want in [
        "4 invalid message(s); nothing was changed",
        "message 0: rejected active_profile_update kns.prod: field `profile.inbound_rules[0].src_ip_set_ids[0]` = \"s:nope\"",
        "message 1: rejected workload_endpoint_update k8s/prod/a/eth0: field `endpoint.ipv4_nets[0]` = \"10.65.0.300/32\"",
        "message 2: rejected workload_endpoint_update k8s/prod/b/eth0: field `endpoint.name` = \"cali0123456789abc\"",
        "message 4: rejected ipset_update s:dup: field `id` = \"s:dup\": duplicate id",
    ] {
        assert!(run.stderr.contains(want), "missing `{want}` in:\n{}", run.stderr);
    }
}

#[test]
fn an_invalid_document_changes_nothing() {
    let ns = Ns::with_veths("invalid", &[("cali1a", "w1")]);
    let bad = state_file("invalid-bad", BAD);
    let good = state_file("invalid-good", GOOD);
    for verb in ["apply", "plan"] {
        let before = ns.kernel_state();
        let run = felix_nft(&[verb, bad.to_str().unwrap(), "--netns", ns.name()], &[]);
        assert_rejected_listing_every_error(&run);
        assert_eq!(
            ns.kernel_state(),
            before,
            "{verb} changed an empty namespace"
        );
    }

    felix_nft(
        &["apply", good.to_str().unwrap(), "--netns", ns.name()],
        &[],
    )
    .ok();
    let programmed = ns.kernel_state();
    assert!(programmed.contains("table ip calico"));
    let run = felix_nft(&["apply", bad.to_str().unwrap(), "--netns", ns.name()], &[]);
    assert_rejected_listing_every_error(&run);
    assert_eq!(
        ns.kernel_state(),
        programmed,
        "a programmed namespace changed"
    );

    // A document that does not even decode: every decode error listed, nothing touched.
    let undecodable = state_file(
        "invalid-json",
        r#"[{"ipset_update":{"id":5}}, {"bogus":1}]"#,
    );
    let run = felix_nft(
        &["apply", undecodable.to_str().unwrap(), "--netns", ns.name()],
        &[],
    );
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("has 2 message(s) that do not decode; nothing was changed"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("\n  message 0: ") && run.stderr.contains("\n  message 1: "));
    assert!(run.stderr.contains("(at `ipset_update.id`)"));
    assert_eq!(ns.kernel_state(), programmed);
}

#[test]
fn an_empty_or_cut_short_document_is_refused_unless_allowed() {
    let (ns, _) = ns_with_good_applied("empty");
    let programmed = ns.kernel_state();
    assert!(
        programmed.contains("\"cali1a\" counter : goto filter-cali-tw-"),
        "{programmed}"
    );

    // One message per line, cut after its second line: no closing in_sync.
    let lines: Vec<&str> = GOOD.lines().filter(|l| l.starts_with('{')).collect();
    let cut = lines[..2]
        .iter()
        .map(|l| l.trim_end_matches(','))
        .collect::<Vec<_>>()
        .join("\n");
    let whole = format!(
        "{}\n{{\"in_sync\":{{}}}}\n",
        lines
            .iter()
            .map(|l| l.trim_end_matches(','))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let cases = [
        ("empty-file", "", "no messages"),
        ("empty-array", "[]", "no messages"),
        (
            "only-sync",
            "[{\"in_sync\":{}}]",
            "only in_sync and config_update",
        ),
        (
            "cut",
            cut.as_str(),
            "not in_sync: it may have been cut short",
        ),
    ];
    for (tag, text, why) in cases {
        let doc = state_file(tag, text);
        for verb in ["apply", "plan"] {
            let run = felix_nft(&[verb, doc.to_str().unwrap(), "--netns", ns.name()], &[]);
            assert_eq!(run.code, 1, "{verb} {tag}: {}", run.stderr);
            assert!(run.stderr.contains(why), "{verb} {tag}: {}", run.stderr);
            assert!(run.stderr.contains("--allow-empty"), "{}", run.stderr);
            assert_eq!(
                ns.kernel_state(),
                programmed,
                "{verb} {tag} changed the node"
            );
        }
    }

    // The whole line-form document (closed by in_sync) applies: nothing to change.
    let whole = state_file("whole-lines", &whole);
    let again = felix_nft(
        &["apply", whole.to_str().unwrap(), "--netns", ns.name()],
        &[],
    )
    .ok();
    assert_eq!(again.table_ops(), 0, "{}", again.stdout);

    // Said on purpose, an empty document empties the node.
    let empty = state_file("empty-allowed", "[]");
    felix_nft(
        &[
            "apply",
            "--allow-empty",
            empty.to_str().unwrap(),
            "--netns",
            ns.name(),
        ],
        &[],
    )
    .ok();
    assert!(!ns
        .kernel_state()
        .contains("\"cali1a\" counter : goto filter-cali-tw-"));
}

#[test]
fn a_bad_die_on_fail_value_exits_2_before_touching_anything() {
    let ns = Ns::new("badcfg");
    let good = state_file("badcfg", GOOD);
    let before = ns.kernel_state();
    let run = felix_nft(
        &["apply", good.to_str().unwrap(), "--netns", ns.name()],
        &[("FELIX_NFTABLESMARKMASK", "0x1")],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("NftablesMarkMask"));
    assert_eq!(ns.kernel_state(), before);
}

#[test]
fn dry_run_validates_in_the_kernel_and_keeps_nothing() {
    let ns = Ns::with_veths("dry", &[("cali1a", "w1")]);
    let good = state_file("dry-good", GOOD);
    let dry_run = [
        "apply",
        "--dry-run",
        good.to_str().unwrap(),
        "--netns",
        ns.name(),
    ];
    let before = ns.kernel_state();
    let run = felix_nft(&dry_run, &[]).ok();
    assert!(run.stdout.starts_with("dry run:"));
    assert!(run.table_ops() > 100);
    assert!(run.stdout.contains("route add 10.65.0.2/32"));
    assert_eq!(ns.kernel_state(), before, "dry run kept something");

    // A table of ours that another live process owns (NFT_TABLE_F_OWNER on its socket): the
    // input is valid, only the kernel can refuse it (EPERM), and the dry run must report that.
    // Before 6.9 no process can own a table this way (felix-nft never sets the owner flag
    // without persist): there is nothing for the kernel to refuse.
    if !common::kernel_has_owned_tables() {
        return;
    }
    use nf_tables::model::{Family, Table};
    use nf_tables::reconcile::{sync, Nft, SyncOptions, TableOwnership};
    use rtnl::netns::NetNs;
    let handle = NetNs::open(ns.name()).unwrap();
    let mut owner = handle.run(Nft::open).unwrap().unwrap();
    sync(
        &mut owner,
        &[Table::new(Family::Ip, "calico")],
        &SyncOptions {
            ownership: TableOwnership::OwnerPersist,
            ..SyncOptions::default()
        },
    )
    .unwrap();
    let before = ns.kernel_state();
    let run = felix_nft(&dry_run, &[]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("the kernel refused") && run.stderr.contains("table ip calico"),
        "{}",
        run.stderr
    );
    assert_eq!(ns.kernel_state(), before, "failed dry run kept something");
    drop(owner);
}

#[test]
fn apply_takes_over_a_table_a_stopped_daemon_left_behind() {
    use nf_tables::model::{Family, Table};
    use nf_tables::reconcile::{sync, Nft, SyncOptions, TableOwnership};
    use rtnl::netns::NetNs;

    let ns = Ns::new("orphan");
    // A daemon's table: OWNER|PERSIST, then the daemon's socket closes (it stopped).
    {
        let handle = NetNs::open(ns.name()).unwrap();
        let mut nft = handle.run(Nft::open).unwrap().unwrap();
        let opts = SyncOptions {
            ownership: TableOwnership::OwnerPersist,
            ..SyncOptions::default()
        };
        sync(&mut nft, &[Table::new(Family::Ip, "calico")], &opts).unwrap();
    }
    assert!(
        ns.ruleset().contains("table ip calico"),
        "persist table gone"
    );
    let good = state_file("orphan", GOOD);
    let args = ["apply", good.to_str().unwrap(), "--netns", ns.name()];
    // Each batch sent is logged at debug.
    let debug = [("FELIX_LOGSEVERITYSCREEN", "debug")];
    let first = felix_nft(&args, &debug).ok();
    assert!(first.table_ops() > 100, "{}", first.stdout);
    let second = felix_nft(&args, &[]).ok();
    assert_eq!(second.table_ops(), 0, "{}", second.stdout);
}

/// Tables an earlier version programmed, whose dispatch maps had no per-element counters: the
/// next apply rebuilds each such table in one batch (a set's expressions cannot change in
/// place) and the one after finds nothing to do.
#[test]
fn apply_converges_over_dispatch_maps_without_counters() {
    use nf_tables::model::Family;
    use nf_tables::reconcile::{sync, Nft, NftKernel, SyncOptions, TableOwnership};
    use rtnl::netns::NetNs;

    let (ns, good) = ns_with_good_applied("uncounted");
    let args = ["apply", good.to_str().unwrap(), "--netns", ns.name()];
    assert!(ns.ruleset().contains("\"cali1a\" counter packets "));

    // The same tables with every set's counter template dropped, as the earlier version had them.
    let handle = NetNs::open(ns.name()).unwrap();
    handle
        .run(|| {
            let mut nft = Nft::open().unwrap();
            let mut old = Vec::new();
            for (family, name) in [
                (Family::Ip, "calico"),
                (Family::Ip, "calico-side"),
                (Family::Ip6, "calico"),
                (Family::Ip6, "calico-side"),
            ] {
                if let Some(mut st) = nft.read_table(family, name).unwrap() {
                    for s in st.table.sets.values_mut() {
                        s.counter = false;
                    }
                    // Desired rules carry no kernel handle (one would make them replacements).
                    for c in st.table.chains.values_mut() {
                        for r in &mut c.rules {
                            r.handle = None;
                        }
                    }
                    old.push(st.table);
                }
            }
            assert!(!old.is_empty());
            let opts = SyncOptions {
                ownership: TableOwnership::Off,
                ..SyncOptions::default()
            };
            sync(&mut nft, &old, &opts).unwrap();
        })
        .unwrap();
    let before = ns.ruleset();
    assert!(
        before.contains("\"cali1a\" : goto filter-cali-tw-"),
        "{before}"
    );
    assert!(!before.contains("counter packets 0 bytes 0 :"), "{before}");

    let upgrade = felix_nft(&args, &[]).ok();
    assert!(upgrade.table_ops() > 100, "rebuilt: {}", upgrade.stdout);
    assert!(ns.ruleset().contains("\"cali1a\" counter packets "));
    let again = felix_nft(&args, &[]).ok();
    assert_eq!(again.table_ops(), 0, "{}", again.stdout);
}

/// This node (`n0`, 10.0.0.1 on `eth0`) and a remote one (`n1`, 10.0.0.2) with their VTEPs as
/// Felix sends them, a VXLAN pool and `n1`'s block.
const VXLAN: &str = r#"[
{"ipam_pool_update":{"id":"10.65.0.0-16","pool":{"cidr":"10.65.0.0/16","masquerade":false,"vxlan_mode":"Always"}}},
{"vtep_update":{"node":"n0","mac":"66:00:00:00:00:00","ipv4_addr":"10.65.0.0","parent_device_ip":"10.0.0.1"}},
{"vtep_update":{"node":"n1","mac":"66:00:00:00:00:01","ipv4_addr":"10.65.1.0","parent_device_ip":"10.0.0.2"}},
{"host_metadata_update":{"hostname":"n0","ipv4_addr":"10.0.0.1/24"}},
{"host_metadata_update":{"hostname":"n1","ipv4_addr":"10.0.0.2/24"}},
{"route_update":{"types":"REMOTE_WORKLOAD","ip_pool_type":"VXLAN","dst":"10.65.1.0/26","dst_node_name":"n1","dst_node_ip":"10.0.0.2"}},
{"encapsulation":{"vxlan_enabled":true}}
]"#;

#[test]
fn apply_programs_the_vxlan_device_its_fdb_neighbours_and_routes() {
    let ns = Ns::new("vxlan");
    ns.host_iface("eth0");
    ns.ip(&["addr", "add", "10.0.0.1/24", "dev", "eth0"]);
    let doc = state_file("vxlan", VXLAN);
    let env = [("FELIX_FELIXHOSTNAME", "n0")];
    let device = "vxlan.calico id 4096 dstport 4789 dev eth0 local 10.0.0.1";

    let plan = felix_nft(&["plan", doc.to_str().unwrap(), "--netns", ns.name()], &env).ok();
    assert_eq!(
        plan.line("vxlan: "),
        "vxlan: 1 to create, 0 corrected, 0 parked"
    );
    assert!(
        plan.stdout.contains(&format!("vxlan create {device}\n")),
        "{}",
        plan.stdout
    );
    // The device is created before the neighbours phase: its entries are planned, not parked.
    assert!(
        plan.stdout
            .contains("neigh set 10.65.1.0 lladdr 66:00:00:00:00:01 dev vxlan.calico"),
        "{}",
        plan.stdout
    );
    assert!(
        !ns.ip(&["link", "show"]).contains("vxlan.calico"),
        "plan wrote"
    );

    let args = ["apply", doc.to_str().unwrap(), "--netns", ns.name()];
    let first = felix_nft(&args, &env).ok();
    assert!(
        first.stdout.contains(&format!("vxlan created {device}\n")),
        "{}",
        first.stdout
    );
    let link = ns.ip(&["-d", "link", "show", "vxlan.calico"]);
    for want in [
        "vxlan id 4096 local 10.0.0.1 dev eth0",
        "dstport 4789",
        "nolearning",
    ] {
        assert!(link.contains(want), "{want} not in {link}");
    }
    let fdb = sh(&[
        "bridge",
        "-n",
        ns.name(),
        "fdb",
        "show",
        "dev",
        "vxlan.calico",
    ]);
    assert!(
        fdb.contains("66:00:00:00:00:01 dst 10.0.0.2 self permanent"),
        "{fdb}"
    );
    let neigh = ns.ip(&["neigh", "show", "dev", "vxlan.calico"]);
    assert!(
        neigh.contains("10.65.1.0 lladdr 66:00:00:00:00:01 PERMANENT"),
        "{neigh}"
    );
    let routes = ns.ip(&["route", "show"]);
    assert!(
        routes.lines().any(|l| l.starts_with("10.65.1.0/26 ")
            && l.contains("via 10.65.1.0 dev vxlan.calico")
            && l.contains("onlink")),
        "{routes}"
    );
    assert!(
        first.stdout.contains("route add 10.65.1.0/26"),
        "{}",
        first.stdout
    );
    // The plan said exactly that: the route through the device it creates is added, not
    // parked.
    assert_eq!(first.changes(), plan.changes());
    let programmed = ns.kernel_state();

    // Everything in place: the second apply finds nothing to do (the device, its FDB and its
    // neighbours are read back, not written again).
    let second = felix_nft(&args, &env).ok();
    assert!(
        second.stdout.starts_with("converged: nothing changed\n"),
        "{}",
        second.stdout
    );
    assert_eq!(ns.kernel_state(), programmed);

    // Someone deletes the device: apply creates it again, with what lives on it.
    ns.ip(&["link", "del", "vxlan.calico"]);
    let third = felix_nft(&args, &env).ok();
    assert!(
        third.stdout.contains(&format!("vxlan created {device}\n")),
        "{}",
        third.stdout
    );
    assert_eq!(ns.kernel_state(), programmed);

    // The device is ours: cleanup deletes it (its FDB and neighbours go with it), once.
    let clean = felix_nft(&["cleanup", "--netns", ns.name()], &env).ok();
    assert!(
        clean.stdout.contains("link delete vxlan.calico\n"),
        "{}",
        clean.stdout
    );
    assert!(
        clean.stdout.contains("route delete 10.65.1.0/26"),
        "{}",
        clean.stdout
    );
    assert!(!ns.ip(&["link", "show"]).contains("vxlan.calico"));
    let again = felix_nft(&["cleanup", "--netns", ns.name()], &env).ok();
    assert!(
        again.stdout.starts_with("nothing to do\n"),
        "{}",
        again.stdout
    );
}
