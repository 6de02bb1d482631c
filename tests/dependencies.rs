//! Every dependency in Cargo.toml is used by the code: a crate that nothing names is weight in
//! every build and in the agent's supply chain. (A text check, as `cargo machete` does: a
//! crate counts as used when the sources name it as `crate::` or in a `use`.)

mod common;

use std::path::Path;

fn sources(dir: &Path, out: &mut String) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
    }
}

/// The names in a `[section]` of Cargo.toml, up to the next section.
fn deps(manifest: &str, section: &str) -> Vec<String> {
    manifest
        .split(section)
        .nth(1)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_string()))
        .filter(|k| !k.is_empty())
        .collect()
}

#[test]
fn every_dependency_is_named_by_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let mut code = String::new();
    for d in ["src", "benches", "tests"] {
        sources(&root.join(d), &mut code);
    }
    // Crates whose package name differs from the one the code uses.
    let lib_name = |dep: &str| match dep {
        "rust-ini" => "ini".to_string(),
        d => d.replace('-', "_"),
    };
    let mut unused = Vec::new();
    for section in ["[dependencies]", "[dev-dependencies]"] {
        for dep in deps(&manifest, section) {
            let name = lib_name(&dep);
            let used = code.contains(&format!("{name}::"))
                || code.contains(&format!("use {name}"))
                || code.contains(&format!("{name} as "));
            if !used {
                unused.push(format!("{section} {dep}"));
            }
        }
    }
    assert!(unused.is_empty(), "dependencies nothing names: {unused:?}");
    // The check itself sees the manifest.
    assert!(deps(&manifest, "[dependencies]")
        .iter()
        .any(|d| d == "tokio"));
}

/// The crate names in `cargo tree -e normal` of this package with `args` (one per line, no
/// prefix, deduplicated).
fn tree(args: &[&str]) -> std::collections::BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args([
        "tree",
        "--locked",
        "--offline",
        "-e",
        "normal",
        "--prefix",
        "none",
    ])
    .args(["--format", "{p}", "--manifest-path"])
    .arg(root.join("Cargo.toml"))
    .args(args);
    let out = common::oracle_stdout(&mut cmd, &format!("cargo tree {args:?}"));
    let text = String::from_utf8_lossy(&out);
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "felix-nft")
        .map(str::to_string)
        .collect()
}

/// The agent operators ship is built without the `lab` feature (the test bed, `demo`, `bench
/// compare`): none of the crates the lab enables is a dependency of it, the chart crates are not
/// in its tree at all, and its tree is a strict part of the lab build's.
#[test]
fn the_agent_without_the_lab_has_no_lab_crates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let lab: Vec<String> = manifest
        .lines()
        .find_map(|l| l.strip_prefix("lab = "))
        .expect("a `lab` feature in Cargo.toml")
        .split('"')
        .filter_map(|s| s.strip_prefix("dep:"))
        .map(str::to_string)
        .collect();
    assert!(lab.iter().any(|d| d == "plotters"), "lab crates: {lab:?}");

    let agent = ["--no-default-features"];
    let direct = tree(&[&agent[..], &["--depth", "1"]].concat());
    let without = tree(&agent);
    let with = tree(&[]);
    for dep in &lab {
        assert!(
            !direct.contains(dep),
            "`{dep}` is a dependency of the agent built without the lab"
        );
        assert!(with.contains(dep), "`{dep}` is not in the lab build's tree");
    }
    let charts: Vec<_> = without
        .iter()
        .filter(|c| c.starts_with("plotters"))
        .collect();
    assert!(charts.is_empty(), "chart crates in the agent: {charts:?}");
    assert!(
        without.is_subset(&with) && without.len() < with.len(),
        "the agent's tree is not a strict part of the lab build's: {:?}",
        without.symmetric_difference(&with).collect::<Vec<_>>()
    );
}
