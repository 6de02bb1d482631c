//! The binary parses its command line, reports its version, and refuses to pretend: commands whose
//! capability has not landed exit non-zero and say so.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_felix-nft"))
}

#[test]
fn version_prints_the_crate_version() {
    let out = bin().arg("version").output().expect("running felix-nft");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        format!("felix-nft {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_lists_every_subcommand() {
    let out = bin().arg("--help").output().expect("running felix-nft");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "run", "apply", "plan", "dump", "cleanup", "demo", "bench", "config", "version",
    ] {
        assert!(
            text.contains(cmd),
            "--help does not mention `{cmd}`:\n{text}"
        );
    }
}
