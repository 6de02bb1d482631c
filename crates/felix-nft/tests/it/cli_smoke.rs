//! The binary parses its command line, reports its version, and refuses to pretend: commands whose
//! capability has not landed exit non-zero and say so.

use testkit as common;

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_felix-nft"))
}

#[test]
fn version_prints_the_crate_version_and_what_it_decided_about_the_kernel() {
    // The owner + persist probe is a dry run; it still runs in a namespace of its own.
    let mut cmd = bin();
    cmd.arg("version");
    common::isolate_netns(&mut cmd);
    let out = cmd.output().expect("running felix-nft");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(format!("felix-nft {}", env!("CARGO_PKG_VERSION")).as_str())
    );
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(
        lines.next(),
        Some(format!("kernel {}", release.trim()).as_str())
    );
    // Each decision as this kernel's release calls for it (the tests' own oracle).
    for (name, on) in [
        ("OwnerPersistTables", common::kernel_at_least(6, 9)),
        ("SetElementsByID", common::kernel_at_least(6, 12)),
        ("EveryTableValidated", !common::kernel_at_least(6, 4)),
    ] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        let said = line.split_whitespace().nth(1);
        assert_eq!(said, Some(if on { "yes" } else { "no" }), "{line}");
    }
}

#[test]
fn help_lists_every_subcommand() {
    let out = bin().arg("--help").output().expect("running felix-nft");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in subcommands() {
        assert!(
            text.contains(cmd),
            "--help does not mention `{cmd}`:\n{text}"
        );
    }
}

const SUBCOMMANDS: [&str; 10] = [
    "run",
    "apply",
    "plan",
    "dump",
    "cleanup",
    "flows",
    "config",
    "version",
    "completions",
    "man",
];

/// The lab's subcommands (`felix-nft-lab`): the agent's binary has none of them.
const LAB: [&str; 2] = ["demo", "bench"];

/// Every subcommand the agent's binary has.
fn subcommands() -> Vec<&'static str> {
    SUBCOMMANDS.to_vec()
}

#[test]
fn the_agent_has_no_lab_subcommands() {
    for cmd in LAB {
        let out = bin()
            .args([cmd, "--help"])
            .output()
            .expect("running felix-nft");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "`{cmd}` exists in the agent");
        assert!(err.contains("unrecognized subcommand"), "{err}");
    }
}

#[test]
fn bash_completion_loads_and_knows_every_subcommand() {
    let out = bin()
        .args(["completions", "bash"])
        .output()
        .expect("running felix-nft");
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout).into_owned();
    for cmd in subcommands() {
        assert!(script.contains(cmd), "no `{cmd}` in the bash completion");
    }
    // bash itself loads it and registers the completion for the command.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("felix-nft.bash");
    std::fs::write(&path, &script).expect("writing the script");
    let source = format!("source {} && complete -p felix-nft", path.display());
    let registered = common::oracle_stdout(Command::new("bash").arg("-c").arg(source), "bash");
    let registered = String::from_utf8_lossy(&registered);
    assert!(
        registered.contains("felix-nft"),
        "bash did not register it: {registered}"
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = bin()
            .args(["completions", shell])
            .output()
            .expect("running felix-nft");
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    assert!(!bin()
        .args(["completions", "tcsh"])
        .status()
        .expect("running")
        .success());
}

#[test]
fn the_man_page_is_roff_naming_every_subcommand() {
    let out = bin().arg("man").output().expect("running felix-nft");
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains(".TH felix-nft 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    for cmd in subcommands() {
        assert!(
            page.contains(&format!("felix\\-nft\\-{cmd}(1)")),
            "{cmd}: {page}"
        );
        // Each page it names exists.
        let sub = bin()
            .args(["man", cmd])
            .output()
            .expect("running felix-nft");
        let text = String::from_utf8_lossy(&sub.stdout);
        assert!(
            sub.status.success() && text.contains(&format!(".TH felix-nft-{cmd} 1")),
            "{cmd}: {text}"
        );
    }
    assert_eq!(
        bin()
            .args(["man", "nope"])
            .status()
            .expect("running")
            .code(),
        Some(2)
    );
}
