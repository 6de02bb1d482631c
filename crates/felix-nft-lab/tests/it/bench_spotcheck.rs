//! The traffic spot-check: at a tiny scale the generated endpoints are real `cali…`
//! veths, and each backend (felix-nft in-process, ipset + iptables-nft-restore, ipset +
//! iptables-legacy-restore, `nft -f`) in turn loads the full sync into a fresh host namespace.
//! Real TCP probes must get the same verdict under every backend, match the model, and include
//! both a pass and a drop. Also through the CLI (`bench compare --spot-check`).

use std::path::Path;
use std::process::Command;

use felix_nft_lab::bench::spot::{spot_check, End};
use felix_nft_lab::testbed::probe::Verdict;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the spot-check creates network namespaces under /run/netns; run the tests as root"
    );
}

fn installed(bin: &str) -> bool {
    ["/usr/sbin", "/usr/bin"]
        .iter()
        .any(|d| Path::new(d).join(bin).exists())
}

/// Namespaces the spot-check makes (its test-bed prefix).
/// The spot check's namespaces that this test process made (their names carry its pid), so a
/// suite running beside this one cannot make it fail.
fn spot_namespaces() -> Vec<String> {
    let ours = format!("-{}-", std::process::id());
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("fnft-spot") && n.contains(&ours))
                .collect()
        })
        .unwrap_or_default()
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn every_backend_gives_the_same_verdicts_on_real_traffic() {
    require_root();
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let before = spot_namespaces();
    let r = spot_check(dir.path(), &|_| true).unwrap();
    println!("{r}");
    // Every installed backend ran; absent ones are named in a note, never faked.
    for (b, bins) in [
        ("felix-nft", &[][..]),
        ("ipt-nft", &["ipset", "iptables-nft-restore"][..]),
        ("ipt-legacy", &["ipset", "iptables-legacy-restore"][..]),
        ("nft-f", &["nft"][..]),
    ] {
        if bins.iter().all(|x| installed(x)) {
            assert!(r.verdicts.contains_key(b), "{b} did not run:\n{r}");
        } else {
            assert!(r.notes.iter().any(|n| n.starts_with(b)), "{r}");
        }
    }
    assert!(r.verdicts.len() >= 2, "need two backends to compare:\n{r}");
    assert!(r.disagreements().is_empty(), "backends disagree:\n{r}");
    assert!(
        r.control.iter().all(|v| *v == Verdict::Pass),
        "without rules every flow must pass (the bed routes):\n{r}"
    );
    assert!(r.discriminates(), "need a pass and a drop:\n{r}");
    assert!(
        r.model_mismatches().is_empty(),
        "verdicts differ from the model:\n{r}"
    );
    // The flows cover ingress and egress, allowed and denied.
    let flows = &r.flows;
    assert!(flows
        .iter()
        .any(|f| matches!(f.to, End::Endpoint(_)) && f.expect == Verdict::Pass));
    assert!(flows
        .iter()
        .any(|f| matches!(f.from, End::Endpoint(_)) && f.expect == Verdict::Pass));
    assert!(flows.iter().filter(|f| f.expect == Verdict::Drop).count() >= 3);
    assert_eq!(spot_namespaces(), before, "test-bed namespaces left behind");
}

#[test]
fn bench_compare_prints_the_spot_check() {
    require_root();
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
        .args([
            "bench",
            "compare",
            "--spot-check",
            "--scale",
            "4,4,2,8,2,1",
            "--reps",
            "1",
            "--inc",
            "1",
            "--only",
            "felix-nft,nft-f",
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
    assert!(stdout.contains("spot-check"), "{stdout}");
    assert!(
        stdout.contains("backends agree: yes; match the model: yes; pass and drop seen (all pass without rules): yes"),
        "{stdout}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("bench-w4.json")).unwrap())
            .unwrap();
    assert_eq!(json["spot_ok"], true);
}
