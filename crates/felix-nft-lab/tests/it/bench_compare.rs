//! `felix-nft bench compare --scale small` end to end: every backend installed runs,
//! the backends hold the same policy afterwards (rule and member counts against the generator),
//! the JSON and SVG are written, and no benchmark namespace is left behind — also when a backend
//! fails half way. The cluster scale at 20 nodes: both backends run, the kernel holds exactly the
//! nodes' routes, neighbours and FDB entries, and felix-nft's updates dump nothing. The
//! dual-stack mode: every backend programs both families (IPv6 tables and sets beside IPv4).

use testkit as common;

use std::path::Path;
use std::process::Command;

use felix_nft_lab::bench::{self, workload::Scale, Options};

/// The benchmarks run one at a time (each is timed); a test that runs one in this process holds
/// the lock to its end, as the namespaces it checks are named after this process.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The namespaces a benchmark process `pid` made and left (its names carry its process id, so
/// a benchmark running beside the tests is not counted).
fn left_by(pid: u32) -> Vec<String> {
    let prefix = format!("fnft-bench-{pid}-");
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `felix-nft bench compare --scale SCALE --reps 1 --inc 1 --out OUT` in a private network
/// namespace (the benchmark makes named namespaces of its own; the process itself starts in a
/// private one too, so not even a bug could reach the host's firewall), and fails unless it
/// succeeds. Its stdout and process id.
fn bench_compare(scale: &str, out: &Path) -> (String, u32) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"));
    c.args([
        "bench", "compare", "--scale", scale, "--reps", "1", "--inc", "1", "--out",
    ])
    .arg(out)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    common::isolate_netns(&mut c);
    let child = c.spawn().unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "bench compare --scale {scale} failed (run as root?):\n{stdout}\n{stderr}"
    );
    (stdout, pid)
}

/// The JSON report `name` that a run wrote into `out`.
fn report(out: &Path, name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join(name)).unwrap()).unwrap()
}

/// Runs [`bench_compare`] at `scale` into a fresh directory, alone: its table has the row `row`
/// and its JSON report `name` says every check passed. The directory, that report and the run's
/// pid.
fn run_checked(scale: &str, row: &str, name: &str) -> (tempfile::TempDir, serde_json::Value, u32) {
    let out = tempfile::tempdir().unwrap();
    let (stdout, pid) = {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        bench_compare(scale, out.path())
    };
    assert!(stdout.contains(row), "no {row:?} in:\n{stdout}");
    let json = report(out.path(), name);
    assert_eq!(json["checks_ok"], true, "{}", json["checks"]);
    (out, json, pid)
}

/// Each of `ops` ran once for `backend` in `json`, and took a plausible time.
fn assert_timed_once(json: &serde_json::Value, backend: &str, ops: &[&str]) {
    for op in ops {
        let result = &json["results"][backend][op];
        let m = result["wall_median_ms"].as_f64().unwrap_or(f64::NAN);
        assert!(m > 0.0 && m < 60_000.0, "{backend} {op}: {m}");
        assert_eq!(result["n"], 1, "{backend} {op}");
    }
}

/// Options for one repetition and one increment of `scale`, writing into `out`.
fn options(scale: &str, out: &Path) -> Options {
    let mut opts = Options::for_scale(scale.parse::<Scale>().unwrap(), out.into());
    opts.reps = 1;
    opts.inc = 1;
    opts
}

fn installed(bin: &str) -> bool {
    ["/usr/sbin", "/usr/bin"]
        .iter()
        .any(|d| Path::new(d).join(bin).exists())
}

#[test]
fn small_scale_runs_every_backend_and_they_agree() {
    let (out, json, pid) = run_checked(
        "small",
        "| full sync into an empty namespace |",
        "bench-small.json",
    );
    let mut want = vec!["felix-nft", "felix-nft-proc"];
    if installed("iptables-nft-restore") && installed("ipset") {
        want.push("ipt-nft");
    }
    if installed("iptables-legacy-restore") && installed("ipset") {
        want.push("ipt-legacy");
    }
    if installed("nft") {
        want.push("nft-f");
    }
    for b in &want {
        assert_timed_once(
            &json,
            b,
            &[
                "full",
                "add_ep",
                "add_mem_ip",
                "add_mem_net",
                "repl_pol",
                "del_ep",
                "noop",
            ],
        );
        // Every backend that ran is in the counts check, except the fresh process (no `dump`).
        if *b != "felix-nft-proc" {
            assert!(json["counts"][b].is_object(), "{b} has no read-back counts");
        }
    }
    // Spawned tools have a peak RSS; the generator's sizes are the small scale.
    if want.contains(&"nft-f") && Path::new("/usr/bin/time").exists() {
        assert!(json["results"]["nft-f"]["full"]["rss_kb"].as_u64().unwrap() > 1000);
    }
    assert_eq!(json["sizes"]["set_members"], 5000);
    assert!(json["sizes"]["ipt_rules"].as_u64().unwrap() > 3000);
    let svg = std::fs::read_to_string(out.path().join("bench-small.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("felix-nft") && svg.contains("add_ep"));
    // Every namespace the run made is gone.
    let left = left_by(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_failing_backend_leaves_no_namespace_behind() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = tempfile::tempdir().unwrap();
    let mut opts = options("4,2,1,2,2,1", out.path());
    opts.felix_exe = Some("/bin/false".into());
    opts.only = Some(vec!["felix-nft-proc".into()]);
    let err = bench::compare(&opts).unwrap_err();
    assert!(err.to_string().contains("/bin/false"), "{err}");
    let left = left_by(std::process::id());
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn cluster_scale_programs_every_remote_node_and_updates_without_dumps() {
    let (_out, json, pid) = run_checked(
        "cluster:20",
        "| one node joins (VTEP + block) |",
        "bench-cluster-20.json",
    );
    assert_eq!(json["nodes"], 20);
    let mut want = vec!["felix-nft"];
    if installed("ip") && installed("bridge") {
        want.push("ip-batch");
    }
    let checks: Vec<String> = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    for b in &want {
        assert_timed_once(&json, b, &["full", "add_vtep", "del_vtep", "mac_vtep"]);
        // Read back with ip/bridge, entry by entry: exactly the 20 remote nodes.
        for (when, kind) in [
            ("after the first sync", "routes via the device"),
            ("after the first sync", "permanent neighbours"),
            ("after the first sync", "FDB entries"),
            ("after the updates", "FDB entries"),
        ] {
            let line = format!("ok   {b} {when}: 20 {kind}, expected 20 (missing 0, unexpected 0)");
            assert!(checks.contains(&line), "no {line:?} in {checks:?}");
        }
    }
    // The first sync wrote a route, a neighbour and an FDB entry per node; an update wrote a
    // few entries and dumped nothing.
    let req = &json["requests"];
    assert!(req["full"]["writes"].as_u64().unwrap() >= 60, "{req}");
    for op in ["add_vtep", "del_vtep", "mac_vtep"] {
        assert_eq!(req[op]["dumps"], 0, "{op}: {req}");
        let w = req[op]["writes"].as_u64().unwrap();
        assert!((1..=4).contains(&w), "{op} wrote {w}: {req}");
    }
    assert_eq!(json["baseline_lines"]["full"], 3 * 20 + 4);
    let left = left_by(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn dual_stack_programs_both_families_in_every_backend() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = |dual: bool| {
        let out = tempfile::tempdir().unwrap();
        let mut opts = options("20,4,2,4,10,2", out.path());
        opts.dual_stack = dual;
        let mut only = vec!["felix-nft".to_string()];
        if installed("iptables-legacy-restore") && installed("ip6tables-legacy-restore") {
            only.push("ipt-legacy".into());
        }
        if installed("nft") {
            only.push("nft-f".into());
        }
        opts.only = Some(only);
        let r = bench::compare(&opts).unwrap();
        let file = if dual {
            "bench-w20-dual.json"
        } else {
            "bench-w20.json"
        };
        assert!(out.path().join(file).exists(), "{file}");
        assert!(r.checks_ok, "{:?}", r.checks);
        r
    };
    let (v4, dual) = (run(false), run(true));
    assert!(dual.dual_stack && !v4.dual_stack);
    // felix-nft holds an IPv6 table beside the IPv4 one; the workload's members stay IPv4.
    let (c4, c46) = (&v4.counts["felix-nft"], &dual.counts["felix-nft"]);
    assert!(
        c46.chains > c4.chains && c46.rules > c4.rules,
        "{c4:?} {c46:?}"
    );
    assert_eq!(c46.workload_members, c4.workload_members);
    // iptables restores the same filter chains for IPv6 (the counts check compared them with
    // the generator's, both families).
    if let (Some(a), Some(b)) = (v4.counts.get("ipt-legacy"), dual.counts.get("ipt-legacy")) {
        assert_eq!(b.rules, 2 * a.rules, "{a:?} {b:?}");
        assert_eq!(dual.expected.ipt_rules, 2 * v4.expected.ipt_rules);
    }
    // nft -f: each set match also for the set's IPv6 twin, in the one inet table.
    if let (Some(a), Some(b)) = (v4.counts.get("nft-f"), dual.counts.get("nft-f")) {
        assert!(b.rules > a.rules && b.chains == a.chains, "{a:?} {b:?}");
    }
    let left = left_by(std::process::id());
    assert!(left.is_empty(), "left behind: {left:?}");
}
