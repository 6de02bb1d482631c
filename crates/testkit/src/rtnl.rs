//! Helpers shared by the `rtnl_*` privileged tests: a tokio runtime inside a private namespace, and
//! the test-only oracles (`ip -j ...`, `conntrack`, `wg`, /proc/sys reads) run from a thread
//! inside that namespace (a forked child inherits the forking thread's network namespace).

use std::future::Future;
use std::process::Command;

use ::rtnl::netns::NetNs;
use ::rtnl::routes::RouteSpec;
use ::rtnl::{link, RtnlHandle};

use crate as common;

/// Runs the future on a current-thread tokio runtime, on a fresh thread inside a new private
/// network namespace. Everything the future does (sockets, forks of oracles) happens there.
pub fn in_netns_async<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    common::in_private_netns(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(f())
    })
}

/// Makes an extra private namespace and returns a handle on it; the calling thread stays where it
/// was. The namespace lives as long as the handle.
pub fn new_netns() -> NetNs {
    let guard = NetNs::new_private().unwrap_or_else(|e| {
        panic!("this privileged test needs to create network namespaces ({e}); run as root")
    });
    guard.current().unwrap()
}

/// [`new_netns`] and a netlink handle into it.
pub fn netns_with_handle() -> (NetNs, RtnlHandle) {
    let ns = new_netns();
    let h = RtnlHandle::connect(Some(&ns)).unwrap();
    (ns, h)
}

/// Creates the veth pair `a`–`b` (in `h`'s namespace) with both ends up.
pub async fn veth_up(h: &RtnlHandle, a: &str, b: &str) {
    link::create_veth(h, a, b).await.unwrap();
    link::set_up(h, a, true).await.unwrap();
    link::set_up(h, b, true).await.unwrap();
}

/// Runs a command in the current thread's namespace (or in `ns`), panics unless it succeeds, and
/// returns stdout.
pub fn run_in(ns: Option<&NetNs>, argv: &[&str]) -> String {
    let go = || Command::new(argv[0]).args(&argv[1..]).output();
    let out = match ns {
        Some(ns) => ns.run(go).unwrap(),
        None => go(),
    }
    .unwrap_or_else(|e| panic!("running {argv:?}: {e}"));
    assert!(
        out.status.success(),
        "{argv:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `ip -j ARGS` parsed as JSON (an array), in the current namespace or `ns`.
pub fn ip_json(ns: Option<&NetNs>, args: &[&str]) -> Vec<serde_json::Value> {
    let mut argv = vec!["ip", "-j"];
    argv.extend_from_slice(args);
    common::ip_json_array(&run_in(ns, &argv))
}

/// The `flags` of one interface of `ip -j link` / `ip -j addr` (`UP`, `LOWER_UP`, …).
pub fn link_flags(l: &serde_json::Value) -> Vec<&str> {
    l["flags"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .collect()
}

/// Reads a /proc/sys file as seen from `ns` (or the current namespace).
pub fn read_sysctl(ns: Option<&NetNs>, path: &str) -> String {
    let go = || std::fs::read_to_string(path);
    match ns {
        Some(ns) => ns.run(go).unwrap(),
        None => go(),
    }
    .unwrap_or_else(|e| panic!("reading {path}: {e}"))
    .trim()
    .to_string()
}

/// A route to `dst` on the interface `dev` with protocol `proto` and metric 1024, the form of a
/// workload's route.
pub fn device_route(dst: &str, dev: &str, proto: u8) -> RouteSpec {
    RouteSpec::device(dst.parse().unwrap(), dev, proto, 1024)
}
