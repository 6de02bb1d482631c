//! Helpers shared by the `testbed_*` privileged tests: a tokio runtime for the async builders, and
//! the test-only oracles (`ip -n NAME -j ...`, `ip netns exec NAME nft ...`), which only ever act
//! in named namespaces the test made itself.
#![allow(dead_code)]

use std::process::{Child, ChildStdin, Command, Stdio};

use felix_nft_lab::testbed::topology::Topology;
use rtnl::devconf::{set_ipv4_conf, set_proxy_delay, Ipv4Conf, ProcSys};
use rtnl::{link, RtnlHandle};

#[allow(unused_imports)]
pub use common::{block_on, kernel_has_owned_tables, patient, require_root};
use testkit as common;

/// Runs a command, panics unless it succeeds, returns stdout.
pub fn run(argv: &[&str], stdin: Option<&str>) -> String {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("running {argv:?}: {e}"));
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{argv:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `felix-nft run --source stdin --keep-running` in a node's namespace as that node, with no
/// config file, no status reports and the default log format; its stderr goes to a log file.
/// Killed on drop.
pub struct NodeDaemon {
    pub child: Child,
    stdin: ChildStdin,
    log: tempfile::NamedTempFile,
    /// What it said back (JSON lines on standard output).
    out: tempfile::NamedTempFile,
}

impl NodeDaemon {
    /// Starts it in the namespace `netns` as node `hostname`, with extra `FELIX_*` environment.
    pub fn start(netns: &str, hostname: &str, env: &[(&str, &str)]) -> NodeDaemon {
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let out = tempfile::NamedTempFile::new().expect("a file for its replies");
        let mut child = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"))
            .args([
                "run",
                "--source",
                "stdin",
                "--keep-running",
                "--netns",
                netns,
            ])
            .env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
            .env("FELIX_REPORTINGINTERVALSECS", "0")
            .env("FELIX_FELIXHOSTNAME", hostname)
            .env_remove("FELIX_NFT_LOG_FORMAT")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(out.reopen().expect("reopening the replies file"))
            .stderr(log.reopen().expect("reopening the log"))
            .spawn()
            .expect("spawning felix-nft run");
        let stdin = child.stdin.take().expect("the daemon's stdin");
        NodeDaemon {
            child,
            stdin,
            log,
            out,
        }
    }

    /// Writes each message as one JSON line.
    pub fn send<T: serde::Serialize>(&mut self, msgs: &[T]) {
        use std::io::Write;
        for m in msgs {
            let line = serde_json::to_string(m).expect("a message as JSON");
            writeln!(self.stdin, "{line}").expect("writing to felix-nft");
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// What it said back so far (`FromDataplane` messages, one JSON line each).
    pub fn replies(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.out.path())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a reply line is JSON"))
            .collect()
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs an oracle, panics unless it succeeds, returns stdout.
pub fn sh(argv: &[&str]) -> String {
    try_sh(argv).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs an oracle whose object may not exist yet (a device, a table): its failure is an
/// answer to poll again on, not an error.
pub fn try_sh(argv: &[&str]) -> Result<String, String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {argv:?}: {e}"));
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{argv:?} failed: {err}"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n NETNS ARGS`, stdout.
pub fn ip_n(netns: &str, args: &[&str]) -> String {
    let mut argv = vec!["ip", "-n", netns];
    argv.extend_from_slice(args);
    sh(&argv)
}

/// `nft ARGS` inside the named namespace, stdout.
pub fn nft_n(netns: &str, args: &[&str]) -> String {
    let mut argv = vec!["ip", "netns", "exec", netns, "nft"];
    argv.extend_from_slice(args);
    sh(&argv)
}

/// `ip -n NETNS -j ARGS` parsed as a JSON array.
pub fn ip_json(netns: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let mut argv = vec!["ip", "-n", netns, "-j"];
    argv.extend_from_slice(args);
    common::ip_json_array(&run(&argv, None))
}

/// Loads an nft script in the named namespace (test-only oracle use of `nft`).
pub fn nft_in(netns: &str, script: &str) {
    run(
        &["ip", "netns", "exec", netns, "nft", "-f", "-"],
        Some(script),
    );
}

/// True when `/run/netns/NAME` exists or is still a mount point.
/// The links `ip -j link` listed, by name, without the fallback devices a loaded tunnel module
/// puts in every namespace (`tunl0` of ipip, `sit0`, `ip6tnl0`, `gre0`, …): the links something
/// made.
pub fn made_links(links: &[serde_json::Value]) -> Vec<&str> {
    const FALLBACK: &[&str] = &[
        "tunl0", "sit0", "ip6tnl0", "gre0", "gretap0", "erspan0", "ip6gre0", "ip_vti0", "ip6_vti0",
    ];
    links
        .iter()
        .filter_map(|l| l["ifname"].as_str())
        .filter(|n| !FALLBACK.contains(n))
        .collect()
}

pub fn netns_present(name: &str) -> bool {
    let path = format!("/run/netns/{name}");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.as_str()));
    std::path::Path::new(&path).exists() || mounted
}

/// Fails unless every namespace in `names` is gone (from `/run/netns` and the mount table).
pub fn assert_all_gone(names: &[String]) {
    for n in names {
        assert!(!netns_present(n), "{n} left behind");
    }
}

/// What felix-nft does for a local workload (§14–15), done here by the test with `rtnl`.
pub fn program_host(topo: &Topology) {
    block_on(async {
        let hh = RtnlHandle::connect(Some(topo.host())).unwrap();
        let sys = ProcSys::new(Some(topo.host().try_clone().unwrap()));
        sys.write("net/ipv4/ip_forward", "1").unwrap();
        sys.write("net/ipv6/conf/all/forwarding", "1").unwrap();
        for w in topo.workloads() {
            let ifname = &w.host_ifname;
            set_ipv4_conf(
                &hh,
                ifname,
                &[(Ipv4Conf::Forwarding, 1), (Ipv4Conf::ProxyArp, 1)],
            )
            .await
            .unwrap();
            set_proxy_delay(&hh, ifname, 0).await.unwrap();
            for net in w.nets() {
                link::add_route(&hh, net, Some(ifname), None).await.unwrap();
            }
        }
    })
}
