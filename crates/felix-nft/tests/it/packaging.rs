//! The systemd unit in `packaging/`: `systemd-analyze verify` accepts it (with ExecStart pointed
//! at the binary under test, since verify checks that the command exists), and it asks for what
//! the agent does: readiness and watchdog notifications, and no capability but CAP_NET_ADMIN.

use std::process::Command;

const UNIT: &str = include_str!("../../../../packaging/felix-nft.service");

fn directive<'a>(key: &str) -> Vec<&'a str> {
    UNIT.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn the_unit_verifies_and_asks_for_what_the_agent_does() {
    assert_eq!(directive("Type"), ["notify"]);
    assert_eq!(directive("CapabilityBoundingSet"), ["CAP_NET_ADMIN"]);
    assert_eq!(directive("WatchdogSec").len(), 1);
    let exec = directive("ExecStart");
    assert_eq!(exec.len(), 1);
    assert!(exec[0].starts_with("/usr/local/bin/felix-nft run --source unix:"));

    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("felix-nft.service");
    let unit = UNIT.replace("/usr/local/bin/felix-nft", env!("CARGO_BIN_EXE_felix-nft"));
    std::fs::write(&path, unit).expect("writing the unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (package systemd) is installed by scripts/setup");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{err}"
    );
    assert!(
        err.trim().is_empty(),
        "systemd-analyze verify warned:\n{err}"
    );
}
