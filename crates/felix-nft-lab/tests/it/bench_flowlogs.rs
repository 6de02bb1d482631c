//! `felix-nft bench flowlogs` end to end, as small as it runs: one agent life per mode (flow
//! logs off, then on) with one-second windows on a test bed node. Checks that every measurement
//! produced something — connections completed, IP set adds seen in the kernel, a flood sent and
//! reaching the node, the flows counting it with flow logs on — and that the bed is gone
//! afterwards. No timing is asserted: the numbers are the benchmark's to report.

use std::process::Command;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "bench flowlogs builds a test bed under /run/netns and runs the agent; run the tests as root"
    );
}

/// The bench's namespaces still present (its test-bed prefix).
fn bench_namespaces() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("fnft-flowbench"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn bench_flowlogs_measures_both_modes_and_writes_its_json() {
    require_root();
    let out = tempfile::tempdir().unwrap();
    let before = bench_namespaces();
    let o = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
        .args([
            "bench",
            "flowlogs",
            "--seconds",
            "1",
            "--reps",
            "1",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("new TCP connections/s"), "{stdout}");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("flowlogs-mid.json")).unwrap(),
    )
    .unwrap();
    assert!(json["machine"]["kernel"]
        .as_str()
        .is_some_and(|k| !k.is_empty()));
    let lives = json["lives"].as_array().unwrap();
    assert_eq!(lives.len(), 2, "{json:#}");
    for (life, mode) in lives.iter().zip(["off", "on"]) {
        assert_eq!(life["mode"], mode);
        assert!(
            life["load"]["conns_per_sec"].as_f64().unwrap() > 0.0,
            "{life:#}"
        );
        assert!(life["load"]["completed"].as_u64().unwrap() > 0, "{life:#}");
        let adds = life["updates"]["latencies_ms"].as_array().unwrap();
        assert!(!adds.is_empty(), "IP set adds seen in the kernel: {life:#}");
        assert!(adds.iter().all(|ms| ms.as_f64().unwrap() > 0.0));
        let flood = &life["flood"];
        assert!(flood["sent_pps"].as_f64().unwrap() > 0.0, "{life:#}");
        assert!(flood["arrived"].as_u64().unwrap() > 0, "{life:#}");
    }
    let on = &lives[1];
    assert!(on["flows"]["src_started"].as_u64().unwrap() > 0, "{on:#}");
    assert!(on["flows"]["dst_started"].as_u64().unwrap() > 0, "{on:#}");
    assert!(
        on["flood"]["denied_counted"].as_u64().unwrap() > 0,
        "{on:#}"
    );
    assert!(json["off"]["conns_per_sec"]["median"].as_f64().unwrap() > 0.0);
    assert!(json["on"]["conns_per_sec"]["median"].as_f64().unwrap() > 0.0);
    assert!(json["conns_ratio_on_off"].as_f64().unwrap() > 0.0);
    assert!(json["update_latency_ratio_on_off"].as_f64().unwrap() > 0.0);
    // The agents' logs are kept beside the JSON.
    assert!(out.path().join("flowlogs-logs/on-1.log").exists());
    // Namespaces of a run beside this one may come and go; ours must not stay.
    let after: Vec<String> = bench_namespaces()
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert!(
        after.is_empty(),
        "test-bed namespaces left behind: {after:?}"
    );
}
