//! The routes of a namespace as `ip route` prints them, the oracle of the cluster tests.
//!
//! The agent points gateway routes at nexthop objects, which `ip route` prints as
//! `nhid N via GW dev DEV …`; the id is the agent's to choose, so it is left out here and the
//! lines read as Felix's `via GW dev DEV …` routes do (the kernel reports the object's gateway,
//! device and flags on the route).

use std::process::Command;

/// `ip -n NS ARGS route show`, without the nexthop ids. Panics when `ip` cannot run.
pub fn routes(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .args(["route", "show"])
        .output()
        .expect("ip route (oracle)");
    assert!(
        out.status.success(),
        "ip -n {ns} {args:?} route show: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    without_nhid(&String::from_utf8_lossy(&out.stdout))
}

/// `text` with every `nhid N ` token pair removed.
pub fn without_nhid(text: &str) -> String {
    text.lines()
        .map(|l| {
            let mut words = l.split(' ').peekable();
            let mut out: Vec<&str> = Vec::new();
            while let Some(w) = words.next() {
                if w == "nhid" && words.peek().is_some_and(|n| n.parse::<u32>().is_ok()) {
                    words.next();
                } else {
                    out.push(w);
                }
            }
            out.join(" ") + "\n"
        })
        .collect()
}
