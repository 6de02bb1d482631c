//! What the workspace's tests share. Every test that touches netlink or /proc/sys runs inside a
//! network namespace it made itself, never the host's; without privilege a test fails with a
//! clear message. Knows no Calico, so that every crate's tests may use it.
//!
//! Test code only: a dev-dependency of the crates, never a dependency (checked by the agent's
//! `dependencies` suite), so nothing here is in a binary. It runs programs, as tests may: the
//! independent oracles its callers name (`ip`, `nft`, `bridge`, `conntrack`, `wg`, `cargo tree`,
//! `bash` for the shell completion, the agent's own CLI) and the test binary itself.
//!
//! - this module: private namespaces, root and kernel checks, the oracles' output;
//! - [`rtnl`]: a tokio runtime in a private namespace, `ip -j` and /proc/sys read from inside it.
// A `pub` item no other crate can reach is `pub(crate)` or narrower: the public surface says
// what the crates above use.
#![warn(unreachable_pub)]

pub mod rtnl;

use ::rtnl::netns::NetNs;

/// Runs `f` on a fresh thread inside a new, private network namespace. The namespace disappears
/// when the thread ends (unless something else still holds it). Panics with a clear message when
/// the namespace cannot be created (not root).
pub fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let handle = std::thread::spawn(move || {
        let _guard = NetNs::new_private().unwrap_or_else(|e| {
            panic!(
                "this privileged test needs its own network namespace and could not create one \
                 ({e}: {:?}); run the tests as root",
                std::error::Error::source(&e)
            )
        });
        f()
    });
    match handle.join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Makes a child process start in a fresh, empty network namespace of its own: a `felix-nft`
/// daemon started by a test must never program the host's.
pub fn isolate_netns(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: unshare(2) is async-signal-safe and affects only the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Fails with a clear message unless the test runs as root (it makes namespaces).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this privileged test creates network namespaces under /run/netns; run the tests as root"
    );
}

/// Whether the tests run in a guest of the VM bed (`scripts/kernel-matrix` sets
/// `FELIX_NFT_IN_VM`): under emulation, where wall time says nothing about the code under test.
fn in_vm_bed() -> bool {
    std::env::var_os("FELIX_NFT_IN_VM").is_some()
}

/// How many times longer than on the host a test waits for something to happen: 1 on the host;
/// in the VM bed `FELIX_NFT_VM_PATIENCE`, default 5. An emulated guest runs the same steps at a
/// speed that depends on the machine under it and on what else that machine runs, so a wait
/// that is ample here can be short there; a wait that ends early costs nothing, so it is long.
pub fn patience() -> u32 {
    if !in_vm_bed() {
        return 1;
    }
    match std::env::var("FELIX_NFT_VM_PATIENCE") {
        Err(_) => 5,
        Ok(v) => match v.parse::<u32>() {
            Ok(n) if n >= 1 => n,
            _ => panic!("FELIX_NFT_VM_PATIENCE={v:?}: expected a whole number, 1 or more"),
        },
    }
}

/// `limit` stretched by [`patience`]: the deadline of every wait for something to happen (a
/// sync, a repair, a route, a packet, a process's exit). A bound that a test asserts as
/// behaviour ("repaired within 5 s") is a wait too: in the VM bed it says only that the thing
/// happens, and the run on the host holds the bound itself.
pub fn patient(limit: std::time::Duration) -> std::time::Duration {
    limit * patience()
}

/// Runs a future to completion on a fresh current-thread runtime. The calling thread stays in
/// its own network namespace; the test bed enters its namespaces per socket.
pub fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(f)
}

/// The output of `ip -j …` as its JSON array; empty output (nothing listed) is an empty array.
pub fn ip_json_array(out: &str) -> Vec<serde_json::Value> {
    if out.trim().is_empty() {
        return Vec::new();
    }
    serde_json::from_str::<serde_json::Value>(out)
        .unwrap()
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Runs `cmd`, a test oracle (`ip`, `nft`, `bridge`, `cargo tree`, the agent's own CLI), and
/// returns its stdout; panics naming `what` with its stderr when it cannot start or fails.
pub fn oracle_stdout(cmd: &mut std::process::Command, what: &str) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {what} (test oracle): {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Asserts that `text` contains every one of `needles`, showing `text` when one is missing.
pub fn assert_contains_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

/// The running kernel is at least `major.minor`, read from `/proc/sys/kernel/osrelease`: the
/// tests' own oracle of what a kernel offers, independent of felix-nft's probes.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let rel = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("the kernel release");
    let mut nums = rel
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (maj, min) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    (maj, min) >= (major, minor)
}

/// Owned + persistent nf_tables tables (`NFT_TABLE_F_OWNER|NFT_TABLE_F_PERSIST`) exist from 6.9.
pub fn kernel_has_owned_tables() -> bool {
    kernel_at_least(6, 9)
}

/// For a test that changes what a whole process shares (signals sent to it, the global logger):
/// a crate's suites run in one test binary, so the test runs again alone in a fresh process of
/// that binary. True in that process, where the test goes on; false in the first, after the run
/// in the fresh one passed (it panics with the run's output otherwise).
pub fn in_own_process(test: &str) -> bool {
    const CHILD: &str = "TESTKIT_IN_OWN_PROCESS";
    if std::env::var(CHILD).is_ok_and(|t| t == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(CHILD, test)
        .output()
        .expect("running the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} in a process of its own:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}
