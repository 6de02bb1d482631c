//! The workspace's dependencies say what the design says: every crate's dependencies are used
//! by its code (a crate that nothing names is weight in every build and in the agent's supply
//! chain; a text check, as `cargo machete` does: a crate counts as used when the sources name it
//! as `crate::` or in a `use`), the layers below the agent reach nothing above them, and the
//! binary operators ship has no lab code in its tree.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use testkit as common;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sources(dir: &Path, out: &mut String) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            read_with_includes(&p, out);
        }
    }
}

/// A source file and the files it includes with `#[path = "…"]` (a suite shared with another
/// crate's tests counts for both).
fn read_with_includes(file: &Path, out: &mut String) {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    for line in text.lines() {
        let included = line
            .trim()
            .strip_prefix("#[path = \"")
            .and_then(|l| l.strip_suffix("\"]"));
        if let (Some(rel), Some(dir)) = (included, file.parent()) {
            out.push_str(&std::fs::read_to_string(dir.join(rel)).unwrap_or_default());
        }
    }
    out.push_str(&text);
}

/// The names in a `[section]` of a Cargo.toml, up to the next section (`tokio.workspace =
/// true` names `tokio`).
fn deps(manifest: &str, section: &str) -> Vec<String> {
    manifest
        .split(section)
        .nth(1)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim()))
        .map(|k| k.trim_end_matches(".workspace").to_string())
        .filter(|k| !k.is_empty())
        .collect()
}

/// Every crate of the workspace, by directory.
fn members() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(workspace().join("crates"))
        .expect("crates/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_dependency_is_named_by_the_code() {
    let mut unused = Vec::new();
    for dir in members() {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
        let mut code = String::new();
        for d in ["src", "benches", "tests"] {
            sources(&dir.join(d), &mut code);
        }
        // Crates whose package name differs from the one the code uses.
        let lib_name = |dep: &str| match dep {
            "rust-ini" => "ini".to_string(),
            d => d.replace('-', "_"),
        };
        for section in ["[dependencies]", "[dev-dependencies]"] {
            for dep in deps(&manifest, section) {
                let name = lib_name(&dep);
                let used = code.contains(&format!("{name}::"))
                    || code.contains(&format!("use {name}"))
                    || code.contains(&format!("{name} as "))
                    // The nf_tables codec's pin of a transitive dependency, named in a comment.
                    || manifest.contains(&format!("# pinned: {dep}"));
                if !used {
                    unused.push(format!("{} {section} {dep}", dir.display()));
                }
            }
        }
    }
    assert!(unused.is_empty(), "dependencies nothing names: {unused:?}");
    // The check itself sees the manifests.
    let agent = std::fs::read_to_string(workspace().join("crates/felix-nft/Cargo.toml")).unwrap();
    assert!(deps(&agent, "[dependencies]").iter().any(|d| d == "tokio"));
}

/// The package names in `cargo tree -e normal` of the workspace with `args` (one per line, no
/// prefix, deduplicated).
fn tree(args: &[&str]) -> BTreeSet<String> {
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
    .arg(workspace().join("Cargo.toml"))
    .args(args);
    let out = common::oracle_stdout(&mut cmd, &format!("cargo tree {args:?}"));
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The agent operators ship (`felix-nft`) has none of the lab (the test bed, `demo`, `bench`,
/// the chart crates) in its tree, and its tree is a strict part of the lab's.
#[test]
fn the_agent_has_no_lab_crates() {
    let agent = tree(&["-p", "felix-nft"]);
    let lab = tree(&["-p", "felix-nft-lab"]);
    assert!(agent.contains("felix-nft") && lab.contains("felix-nft-lab"));
    let leaked: Vec<_> = agent
        .iter()
        .filter(|c| *c == "felix-nft-lab" || c.starts_with("plotters"))
        .collect();
    assert!(leaked.is_empty(), "lab crates in the agent: {leaked:?}");
    // The tests' kit runs programs (oracles): no binary may carry it.
    for (name, t) in [("felix-nft", &agent), ("felix-nft-lab", &lab)] {
        assert!(!t.contains("testkit"), "testkit is in {name}'s tree");
    }
    let direct = tree(&["-p", "felix-nft", "--depth", "1"]);
    assert!(
        !direct.contains("socket2"),
        "`socket2` (the test bed's probes) is a dependency of the agent"
    );
    assert!(
        agent.is_subset(&lab) && agent.len() < lab.len(),
        "the agent's tree is not a strict part of the lab's: {:?}",
        agent.symmetric_difference(&lab).collect::<Vec<_>>()
    );
}

/// The layers below the agent reach nothing above them: the netlink crates know no Calico, the
/// Felix API no kernel, the renderer no rtnetlink and no agent.
#[test]
fn the_layers_reach_only_down() {
    let forbidden: &[(&str, &[&str])] = &[
        (
            "netlink-wire",
            &[
                "nf-tables",
                "rtnl",
                "felix-api",
                "felix-nft-rules",
                "felix-nft",
            ],
        ),
        (
            "nf-tables",
            &["rtnl", "felix-api", "felix-nft-rules", "felix-nft"],
        ),
        (
            "rtnl",
            &["nf-tables", "felix-api", "felix-nft-rules", "felix-nft"],
        ),
        (
            "felix-api",
            &[
                "netlink-wire",
                "nf-tables",
                "rtnl",
                "felix-nft-rules",
                "felix-nft",
            ],
        ),
        ("felix-nft-rules", &["rtnl", "felix-nft", "felix-nft-lab"]),
    ];
    for (krate, above) in forbidden {
        let t = tree(&["-p", krate]);
        assert!(t.contains(*krate), "cargo tree -p {krate}: {t:?}");
        let reached: Vec<_> = above.iter().filter(|a| t.contains(**a)).collect();
        assert!(reached.is_empty(), "{krate} depends on {reached:?}");
    }
}
