//! Every dependency in Cargo.toml is used by the code: a crate that nothing names is weight in
//! every build and in the agent's supply chain. (A text check, as `cargo machete` does: a
//! crate counts as used when the sources name it as `crate::` or in a `use`.)

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
