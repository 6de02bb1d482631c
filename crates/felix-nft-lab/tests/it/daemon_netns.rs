//! The daemon binary in a private "host" namespace with veth "workloads", driven the way users
//! drive it: `run --source stdin --netns`, and Felix's fds 3/4 from a harness acting as Felix.
//! `ip`, `nft` and /proc/sys are read as oracles only. Every namespace is made here and deleted
//! on drop, also when a test fails.

use testkit as common;

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use felix_api::frame::{encode_frame, FrameReader};
use felix_api::{decode_from_dataplane, json, ToDataplane};

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn sh(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"))
}

fn ok(cmd: &str, args: &[&str]) -> String {
    let out = sh(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed (these tests need root to make network namespaces): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named namespace, deleted on drop.
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!(
            "fnft-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        ok("ip", &["netns", "add", &name]);
        let ns = Ns(name);
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", &self.0];
        a.extend_from_slice(args);
        ok("ip", &a)
    }

    fn exec(&self, args: &[&str]) -> String {
        let mut a = vec!["netns", "exec", &self.0];
        a.extend_from_slice(args);
        ok("ip", &a)
    }

    fn sysctl(&self, path: &str) -> String {
        self.exec(&["cat", &format!("/proc/sys/{path}")])
            .trim()
            .to_string()
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = sh("ip", &["netns", "del", &self.0]);
    }
}

/// A workload the way Calico's CNI leaves it: a veth whose host end `cali…` is up in the host
/// namespace, whose other end is `eth0` with a /32 and a default route via 169.254.1.1.
struct Workload {
    ns: Ns,
    iface: String,
    ip: String,
    mac: String,
}

fn workload(host: &Ns, n: u8) -> Workload {
    let ns = Ns::new(&format!("w{n}"));
    let iface = format!("cali{:011x}", 0xabc00 + u32::from(n));
    let ip = format!("10.65.0.{n}");
    host.ip(&[
        "link", "add", &iface, "type", "veth", "peer", "name", "tmp0",
    ]);
    host.ip(&["link", "set", "tmp0", "netns", &ns.0]);
    host.ip(&["link", "set", &iface, "up"]);
    for cmd in [
        "link set tmp0 name eth0".to_string(),
        format!("addr add {ip}/32 dev eth0"),
        "link set eth0 up".to_string(),
        "route add 169.254.1.1 dev eth0 scope link".to_string(),
        "route add default via 169.254.1.1 dev eth0 onlink".to_string(),
    ] {
        ns.ip(&cmd.split(' ').collect::<Vec<_>>());
    }
    let mac = ns
        .exec(&["cat", "/sys/class/net/eth0/address"])
        .trim()
        .to_string();
    Workload { ns, iface, ip, mac }
}

/// A host namespace with a default route out of a second veth (a real node has one, and proxy
/// ARP answers for 169.254.1.1 only when the host has a route to it elsewhere).
fn host() -> Ns {
    let h = Ns::new("host");
    h.ip(&[
        "link", "add", "ext0", "type", "veth", "peer", "name", "ext1",
    ]);
    h.ip(&["addr", "add", "198.51.100.1/30", "dev", "ext0"]);
    h.ip(&["link", "set", "ext0", "up"]);
    h.ip(&["link", "set", "ext1", "up"]);
    h.ip(&[
        "route",
        "add",
        "default",
        "via",
        "198.51.100.2",
        "dev",
        "ext0",
    ]);
    h
}

fn wep_update(w: &Workload, n: u8, profile: &str) -> String {
    format!(
        r#"{{"workload_endpoint_update":{{"id":{{"orchestrator_id":"k8s","workload_id":"w{n}","endpoint_id":"eth0"}},"endpoint":{{"state":"active","name":"{}","mac":"{}","ipv4_nets":["{}/32"],"profile_ids":["{profile}"]}}}}}}"#,
        w.iface, w.mac, w.ip
    )
}

const ALLOW_ALL: &str = r#"{"active_profile_update":{"id":{"name":"allow-all"},"profile":{"inbound_rules":[{"action":"allow"}],"outbound_rules":[{"action":"allow"}]}}}"#;
const DENY_80: &str = r#"{"active_profile_update":{"id":{"name":"allow-all"},"profile":{"inbound_rules":[{"action":"deny","protocol":{"name":"tcp"},"dst_ports":[{"first":80,"last":80}]},{"action":"allow"}],"outbound_rules":[{"action":"allow"}]}}}"#;
const IN_SYNC: &str = r#"{"in_sync":{}}"#;

fn felix_nft(host: &Ns) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_felix-nft-lab"));
    // Plain tables: Debian's `nft -j` cannot print owner+persist ones.
    c.env("FELIX_NFTABLESTABLEOWNER", "false")
        .env("FELIX_REPORTINGINTERVALSECS", "0")
        .env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
        .env_remove("FELIX_NFT_LOG_FORMAT");
    let _ = host;
    c
}

/// Runs `felix-nft run --source stdin --netns host` over `lines` and waits for it to exit.
fn run_stdin(host: &Ns, lines: &[&str]) -> Output {
    let (child, mut stdin) = spawn_stdin(host, Stdio::piped());
    for l in lines {
        writeln!(stdin, "{l}").expect("writing to felix-nft");
    }
    drop(stdin);
    wait_output(child, Duration::from_secs(60))
}

fn wait_output(mut child: Child, limit: Duration) -> Output {
    let limit = common::patient(limit);
    let t0 = Instant::now();
    loop {
        if child.try_wait().expect("waiting").is_some() {
            return child.wait_with_output().expect("collecting output");
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collecting output");
            panic!(
                "felix-nft did not exit within {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// TCP connect from a workload namespace, with a short timeout: true = connected.
fn tcp_ok(from: &Ns, ip: &str, port: u16) -> bool {
    let out = sh(
        "ip",
        &[
            "netns",
            "exec",
            &from.0,
            "timeout",
            "2",
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/{ip}/{port}"),
        ],
    );
    out.status.success()
}

/// A TCP listener in a namespace (accepts forever until killed).
struct Listener(Child);

fn listen(ns: &Ns, port: u16) -> Listener {
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0,
            "python3",
            "-c",
            &format!(
                "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('0.0.0.0',{port}))\ns.listen(64)\nwhile True:\n c,_=s.accept()\n c.close()"
            ),
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("starting a listener");
    std::thread::sleep(Duration::from_millis(300));
    Listener(child)
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn stdin_stream_programs_rules_routes_arp_and_sysctls() {
    // after the stream, the kernel holds what the reference says (§6, §14.2, §15).
    let h = host();
    let w1 = workload(&h, 1);
    let w2 = workload(&h, 2);
    let out = run_stdin(
        &h,
        &[
            ALLOW_ALL,
            &wep_update(&w1, 1, "allow-all"),
            &wep_update(&w2, 2, "allow-all"),
            IN_SYNC,
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "felix-nft failed:\n{err}");

    // nf_tables: our tables with the static chains, both endpoints' chains and dispatch.
    let rules = h.exec(&["nft", "-s", "list", "ruleset"]);
    for needle in [
        "table ip calico",
        "table ip6 calico",
        "chain filter-cali-FORWARD",
        &format!("\"{}\" counter : goto filter-cali-tw-", w1.iface),
        &format!("\"{}\" counter : goto filter-cali-fw-", w2.iface),
        "map filter-cali-to-wl-dispatch",
        "chain filter-cali-pri-allow-all",
    ] {
        assert!(rules.contains(needle), "`{needle}` missing from:\n{rules}");
    }

    // Routes: /32 scope link on the veth, protocol boot (3), metric 1024 (§15).
    let routes: serde_json::Value =
        serde_json::from_str(&h.ip(&["-j", "route", "show", "table", "main"])).unwrap();
    for w in [&w1, &w2] {
        let r = routes
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["dst"] == w.ip.as_str())
            .unwrap_or_else(|| panic!("no route to {} in {routes}", w.ip));
        assert_eq!(r["dev"], w.iface.as_str());
        assert_eq!(r["scope"], "link");
        // `ip` prints no protocol for boot (3), the default it would use itself.
        assert!(r["protocol"].is_null() || r["protocol"] == "boot", "{r}");
        assert_eq!(r["metric"], 1024);
    }

    // Static ARP: permanent entries with the workload MAC.
    let neigh: serde_json::Value =
        serde_json::from_str(&h.ip(&["-j", "neigh", "show", "nud", "permanent"])).unwrap();
    for w in [&w1, &w2] {
        assert!(
            neigh
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["dst"] == w.ip.as_str()
                    && n["dev"] == w.iface.as_str()
                    && n["lladdr"] == w.mac.as_str()),
            "no permanent neighbour for {} in {neigh}",
            w.ip
        );
    }

    // Per-interface sysctls (§14.2) and the globals (§10.4), in the host namespace.
    for w in [&w1, &w2] {
        let i = &w.iface;
        assert_eq!(h.sysctl(&format!("net/ipv4/conf/{i}/proxy_arp")), "1");
        assert_eq!(h.sysctl(&format!("net/ipv4/conf/{i}/forwarding")), "1");
        assert_eq!(h.sysctl(&format!("net/ipv4/conf/{i}/route_localnet")), "1");
        assert_eq!(h.sysctl(&format!("net/ipv4/neigh/{i}/proxy_delay")), "0");
        assert_eq!(h.sysctl(&format!("net/ipv6/conf/{i}/accept_ra")), "0");
        assert_eq!(h.sysctl(&format!("net/ipv6/conf/{i}/proxy_ndp")), "1");
        assert_eq!(
            h.sysctl(&format!("net/ipv4/conf/{i}/rp_filter")),
            h.sysctl("net/ipv4/conf/default/rp_filter")
        );
    }
    assert_eq!(h.sysctl("net/ipv4/ip_forward"), "1");
}

#[test]
fn tcp_between_workloads_is_allowed_denied_and_allowed_again() {
    // One running daemon, three policy states; real TCP flows decide (§8.1, §9.4, §22.4).
    // The host namespace lives as long as `_h`.
    let bed = stdin_bed();
    bed.allow_both();
    let passes = |want: bool| eventually(|| bed.w1_reaches_w2() == want);
    bed.send(DENY_80);
    assert!(passes(false), "denied flow still passes");
    bed.send(ALLOW_ALL);
    assert!(passes(true), "flow did not come back");
    bed.exits_cleanly();
}

/// Two workloads (w2 listening on tcp/80) and the daemon fed from stdin, in a host namespace.
struct StdinBed {
    h: Ns,
    w1: Workload,
    w2: Workload,
    _listener: Listener,
    child: Child,
    stdin: ChildStdin,
}

fn stdin_bed() -> StdinBed {
    let h = host();
    let w1 = workload(&h, 1);
    let w2 = workload(&h, 2);
    let _listener = listen(&w2.ns, 80);
    let (child, stdin) = spawn_stdin(&h, Stdio::null());
    StdinBed {
        h,
        w1,
        w2,
        _listener,
        child,
        stdin,
    }
}

impl StdinBed {
    fn send(&self, line: &str) {
        writeln!(&self.stdin, "{line}").expect("writing to felix-nft");
    }

    /// A TCP connect from w1 to w2:80 succeeds.
    fn w1_reaches_w2(&self) -> bool {
        tcp_ok(&self.w1.ns, &self.w2.ip, 80)
    }

    /// Sends the allow-all profile, both endpoints and InSync; waits until w1 reaches w2:80.
    fn allow_both(&self) {
        self.send(ALLOW_ALL);
        self.send(&wep_update(&self.w1, 1, "allow-all"));
        self.send(&wep_update(&self.w2, 2, "allow-all"));
        self.send(IN_SYNC);
        assert!(
            eventually(|| self.w1_reaches_w2()),
            "w1 → w2:80 never passed"
        );
    }

    /// [`exits_cleanly`], then the namespaces go.
    fn exits_cleanly(self) {
        exits_cleanly(self.child, self.stdin);
    }
}

/// Closes the daemon's input; it must exit 0 within 30 s. Returns its stderr.
fn exits_cleanly(child: Child, stdin: ChildStdin) -> String {
    drop(stdin);
    let out = wait_output(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

/// `nft flush chain ip calico <chain>` in `h`, as an outside program would.
fn flush_chain(h: &Ns, chain: &str) -> Output {
    sh(
        "ip",
        &[
            "netns", "exec", &h.0, "nft", "flush", "chain", "ip", "calico", chain,
        ],
    )
}

/// Whether the flushed `chain` gets its rules back within 15 s.
fn chain_repaired(h: &Ns, chain: &str) -> bool {
    eventually(|| {
        h.exec(&["nft", "list", "chain", "ip", "calico", chain])
            .contains("ct state")
    })
}

/// `run --source stdin` in `host`'s namespace, exiting at the end of its input. `stdout` takes
/// its status reports: piped only when the caller reads them after the exit (a long run would
/// fill the pipe).
fn spawn_stdin(host: &Ns, stdout: Stdio) -> (Child, ChildStdin) {
    spawn_stdin_with(host, stdout, &[])
}

/// [`spawn_stdin`] with more `FELIX_*` environment.
fn spawn_stdin_with(host: &Ns, stdout: Stdio, env: &[(&str, &str)]) -> (Child, ChildStdin) {
    spawn_run(host, false, stdout, env)
}

/// `run --source stdin` in `host`'s namespace with more `FELIX_*` environment, kept running
/// after its input ends or not; its stdin and stderr piped.
fn spawn_run(
    host: &Ns,
    keep_running: bool,
    stdout: Stdio,
    env: &[(&str, &str)],
) -> (Child, ChildStdin) {
    let mut cmd = felix_nft(host);
    cmd.envs(env.iter().copied())
        .args(["run", "--source", "stdin"]);
    if keep_running {
        cmd.arg("--keep-running");
    }
    let mut child = cmd
        .args(["--netns", &host.0])
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning felix-nft");
    let stdin = child.stdin.take().expect("stdin");
    (child, stdin)
}

/// A `felix-nft run --keep-running` daemon, killed if the test fails before it is stopped
/// (it does not end with its input).
struct Daemon(Option<Child>);

impl Daemon {
    /// SIGTERM, then its output once it exited.
    fn terminate(mut self) -> Output {
        let child = self.0.take().expect("the daemon runs");
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        wait_output(child, Duration::from_secs(20))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `felix-nft run --source stdin --keep-running` in `host` with more `FELIX_*`
/// environment.
fn spawn_keep_running(host: &Ns, env: &[(&str, &str)]) -> (Daemon, ChildStdin) {
    let (child, stdin) = spawn_run(host, true, Stdio::null(), env);
    (Daemon(Some(child)), stdin)
}

/// Sends the allow-all profile, `w`'s endpoint and InSync; waits until `w`'s chain is
/// programmed and returns its name.
fn program_allow_all(h: &Ns, stdin: &mut ChildStdin, w: &Workload) -> String {
    first_sync(
        |l| writeln!(stdin, "{l}").expect("writing to felix-nft"),
        w,
        || h.exec(&["nft", "list", "ruleset"]),
        "never programmed",
    );
    tw_chain_of(h, &w.iface).expect("programmed")
}

/// Sends the allow-all profile, `w` (as endpoint 1) and InSync through `send`; waits until
/// `rules()` dispatches `w`'s interface.
fn first_sync(mut send: impl FnMut(&str), w: &Workload, rules: impl Fn() -> String, what: &str) {
    for l in [ALLOW_ALL, &wep_update(w, 1, "allow-all"), IN_SYNC] {
        send(l);
    }
    assert!(eventually(|| dispatched(&rules(), &w.iface)), "{what}");
}

/// The chain the workload interface `iface` is dispatched to on ingress (endpoint chains are
/// shared by content, so the dispatch map says which), read from `nft list ruleset`.
fn tw_chain_of(h: &Ns, iface: &str) -> Option<String> {
    let rules = h.exec(&["nft", "list", "ruleset"]);
    let name = felix_nft_lab::testbed::dispatched_ingress_chains(&rules).remove(iface)?;
    rules.contains(&format!("chain {name} ")).then_some(name)
}

/// Whether `nft list` text says `iface` is dispatched to an ingress chain.
fn dispatched(rules: &str, iface: &str) -> bool {
    felix_nft_lab::testbed::dispatched_ingress_chains(rules).contains_key(iface)
}

/// Polls `what` for up to 15 s ([`common::patient`]).
fn eventually(what: impl Fn() -> bool) -> bool {
    let (t0, limit) = (Instant::now(), common::patient(Duration::from_secs(15)));
    while t0.elapsed() < limit {
        if what() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Spawns the binary as Felix would: no arguments, fds 3 and 4 are pipes, in `host`'s namespace.
fn spawn_as_felix(host: &Ns) -> (Child, std::fs::File, std::fs::File) {
    let mut p3 = [0; 2];
    let mut p4 = [0; 2];
    // SAFETY: pipe(2) fills the arrays with two new descriptors we own.
    unsafe {
        assert_eq!(libc::pipe2(p3.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::pipe2(p4.as_mut_ptr(), libc::O_CLOEXEC), 0);
    }
    let (r3, w3, r4, w4) = (p3[0], p3[1], p4[0], p4[1]);
    let nsfile = std::fs::File::open(format!("/run/netns/{}", host.0)).expect("netns file");
    let nsfd = nsfile.into_raw_fd();
    let mut cmd = felix_nft(host);
    cmd.env("FELIX_ENDPOINTREPORTINGENABLED", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(nsfd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let hi3 = libc::fcntl(r3, libc::F_DUPFD_CLOEXEC, 10);
            let hi4 = libc::fcntl(w4, libc::F_DUPFD_CLOEXEC, 10);
            if hi3 < 0 || hi4 < 0 || libc::dup2(hi3, 3) < 0 || libc::dup2(hi4, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawning felix-nft as Felix's driver");
    // SAFETY: we own these descriptors; the child has its copies.
    unsafe {
        libc::close(r3);
        libc::close(w4);
        libc::close(nsfd);
        (
            child,
            std::fs::File::from_raw_fd(w3),
            std::fs::File::from_raw_fd(r4),
        )
    }
}

#[test]
fn felix_pipes_program_the_node_and_report_status() {
    // the same messages over fds 3/4 from a harness acting as Felix, which also
    // checks what comes back (§1.3, §2.2, §14.1).
    let h = host();
    let w1 = workload(&h, 1);
    let (child, mut to_fd3, mut from_fd4) = spawn_as_felix(&h);
    let mut seq = 0u64;
    let mut send = |text: &str| {
        let mut m: ToDataplane = json::decode(text).expect("test message");
        m.sequence_number = seq;
        seq += 1;
        to_fd3.write_all(&encode_frame(&m)).expect("writing fd 3");
    };
    send(ALLOW_ALL);
    send(&wep_update(&w1, 1, "allow-all"));
    send(IN_SYNC);
    // Read frames until the endpoint is reported up (DataplaneInSync comes first).
    let reader = std::thread::spawn(move || {
        let mut kinds = Vec::new();
        let mut r = FrameReader::new(&mut from_fd4);
        while let Ok(Some(f)) = r.read_frame() {
            let m = decode_from_dataplane(&f).expect("a FromDataplane frame");
            let kind = m.kind();
            let done = matches!(&m.payload, Some(felix_api::from_dataplane::Payload::WorkloadEndpointStatusUpdate(u)) if u.status.as_ref().is_some_and(|s| s.status == "up"));
            kinds.push(kind);
            if done {
                break;
            }
        }
        let mut rest = Vec::new();
        let _ = from_fd4.read_to_end(&mut rest);
        kinds
    });
    let (t0, limit) = (Instant::now(), common::patient(Duration::from_secs(30)));
    while !reader.is_finished() && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(to_fd3); // Felix goes away: the driver exits 0
    let out = wait_output(child, Duration::from_secs(30));
    let kinds = reader.join().expect("reader thread");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(kinds.contains(&"dataplane_in_sync"), "{kinds:?}");
    assert_eq!(
        kinds.last(),
        Some(&"workload_endpoint_status_update"),
        "{kinds:?}"
    );
    let rules = h.exec(&["nft", "list", "ruleset"]);
    assert!(dispatched(&rules, &w1.iface));
}

#[test]
fn sigterm_leaves_every_rule_route_and_neighbour_in_place() {
    // stopping never removes policy (§22.1).
    let h = host();
    let w1 = workload(&h, 1);
    let (daemon, mut stdin) = spawn_keep_running(&h, &[]);
    program_allow_all(&h, &mut stdin, &w1);
    std::thread::sleep(Duration::from_millis(300));
    // `-s`: stateless, so counters ticking over do not count as a change.
    let before = (
        h.exec(&["nft", "-s", "list", "ruleset"]),
        h.ip(&["route"]),
        h.ip(&["neigh", "show", "nud", "permanent"]),
    );
    let out = daemon.terminate();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = (
        h.exec(&["nft", "-s", "list", "ruleset"]),
        h.ip(&["route"]),
        h.ip(&["neigh", "show", "nud", "permanent"]),
    );
    assert!(before == after, "SIGTERM changed the kernel state");
    drop(stdin);
}

#[test]
fn outside_changes_are_refused_with_owner_flag_and_repaired_without() {
    // with OWNER|PERSIST an outside flush is refused by the kernel; with the flag
    // off, the running agent repairs an outside flush within the refresh interval (§11, §22.13).
    for owner in [true, false] {
        let h = host();
        let w1 = workload(&h, 1);
        let (daemon, mut stdin) = spawn_keep_running(
            &h,
            &[
                (
                    "FELIX_NFTABLESTABLEOWNER",
                    if owner { "true" } else { "false" },
                ),
                ("FELIX_NFTABLESREFRESHINTERVAL", "1"),
            ],
        );
        let chain = program_allow_all(&h, &mut stdin, &w1);
        let flush = flush_chain(&h, &chain);
        // Before 6.9 the kernel cannot own tables: the flag asks for what it cannot give, and
        // the agent falls back to plain tables, repaired like the flag-off case.
        let owned = owner && common::kernel_has_owned_tables();
        if owned {
            assert!(
                !flush.status.success(),
                "the kernel let an outsider flush our table"
            );
        } else {
            assert!(flush.status.success());
            assert!(
                chain_repaired(&h, &chain),
                "the flushed chain was not repaired:\n{}",
                h.exec(&["nft", "list", "chain", "ip", "calico", &chain])
            );
        }
        let out = daemon.terminate();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        if !owned {
            assert!(err.contains("drifted"), "no drift repair logged:\n{err}");
        }
        drop(stdin);
    }
}

/// `GET /metrics` over plain HTTP/1.0; the value of each sample line (`name{labels} value`).
fn scrape(port: u16) -> Vec<(String, f64)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the metrics port");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("a request");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("a response");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, v) = l.rsplit_once(' ')?;
            Some((name.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn sample(samples: &[(String, f64)], name: &str) -> f64 {
    samples
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no sample {name}"))
}

#[test]
fn the_metrics_say_what_the_daemon_did() {
    // Every metric the daemon registers is fed: a stuck one would mislead an operator.
    let h = host();
    let w1 = workload(&h, 1);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let port = port.to_string();
    let (child, mut stdin) = spawn_stdin_with(
        &h,
        Stdio::null(),
        &[
            ("FELIX_PROMETHEUSMETRICSENABLED", "true"),
            ("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1"),
            ("FELIX_PROMETHEUSMETRICSPORT", &port),
            ("FELIX_HEALTHENABLED", "false"),
        ],
    );
    let set = r#"{"ipset_update":{"id":"s:a","type":"IP","members":["10.9.0.1"]}}"#;
    let profile = r#"{"active_profile_update":{"id":{"name":"p"},"profile":{"inbound_rules":[{"action":"allow","src_ip_set_ids":["s:a"]}],"outbound_rules":[{"action":"allow"}]}}}"#;
    for l in [set, profile, &wep_update(&w1, 1, "p"), IN_SYNC] {
        writeln!(stdin, "{l}").unwrap();
    }
    assert!(
        eventually(|| tw_chain_of(&h, &w1.iface).is_some()),
        "never programmed"
    );
    writeln!(
        stdin,
        r#"{{"ipset_delta_update":{{"id":"s:a","added_members":["10.9.0.2"]}}}}"#
    )
    .unwrap();
    assert!(
        eventually(|| h.exec(&["nft", "list", "ruleset"]).contains("10.9.0.2")),
        "the delta was not programmed"
    );
    let m = scrape(port.parse().expect("the port"));
    assert!(sample(&m, "felix_int_dataplane_initial_resync_time_seconds") > 0.0);
    assert!(
        sample(&m, "felix_nft_list_calls") >= 1.0,
        "the first sync reads back"
    );
    assert!(
        sample(&m, "felix_nft_set_calls") >= 1.0,
        "the delta changed set members"
    );
    assert!(sample(&m, "felix_nft_agent_batch_bytes_count") >= 2.0);
    assert!(sample(&m, "felix_nft_agent_batch_bytes_sum") > 0.0);
    assert!(sample(&m, "felix_route_table_resync_seconds_count") >= 1.0);
    assert!(sample(&m, "felix_nft_chains{ip_version=\"4\",table=\"calico\"}") > 10.0);
    assert!(sample(&m, "felix_nft_rules{ip_version=\"4\",table=\"calico\"}") > 10.0);
    // What the agent decided about this kernel, by the release's rules (the tests' oracle).
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for (feature, source, on) in [
        (
            "OwnerPersistTables",
            "probed",
            common::kernel_at_least(6, 9),
        ),
        ("SetElementsByID", "release", common::kernel_at_least(6, 12)),
        (
            "EveryTableValidated",
            "release",
            !common::kernel_at_least(6, 4),
        ),
    ] {
        let name = format!(
            "felix_nft_agent_kernel_feature{{feature=\"{feature}\",kernel=\"{}\",source=\"{source}\"}}",
            release.trim()
        );
        assert_eq!(sample(&m, &name), f64::from(u8::from(on)), "{name}");
    }
    assert_eq!(sample(&m, "felix_nft_agent_table_touches_total"), 0.0);
    assert_eq!(
        sample(&m, "felix_nft_agent_table_repair_backoff_seconds"),
        0.0
    );
    exits_cleanly(child, stdin);
}

#[test]
fn a_refresh_reads_nothing_back_unless_our_tables_were_touched() {
    // A big set made every refresh read it whole while updates waited. The generation says
    // whether anyone committed since us, and the nf_tables events whether those commits were
    // about our tables: only then is there anything to read.
    let h = host();
    let w1 = workload(&h, 1);
    let (child, mut stdin) = spawn_stdin_with(
        &h,
        Stdio::null(),
        &[
            ("FELIX_NFTABLESREFRESHINTERVAL", "1"),
            ("FELIX_LOGSEVERITYSCREEN", "debug"),
        ],
    );
    let chain = program_allow_all(&h, &mut stdin, &w1);
    std::thread::sleep(Duration::from_millis(2500));
    // Another program commits to a table of its own, again and again; an update of ours goes
    // in meanwhile.
    let nft = |args: &[&str]| {
        let mut argv = vec!["netns", "exec", &h.0, "nft"];
        argv.extend_from_slice(args);
        assert!(sh("ip", &argv).status.success(), "nft {args:?}");
    };
    let w2 = workload(&h, 2);
    nft(&["add", "table", "ip", "other"]);
    let busy_from = SystemTime::now() + Duration::from_secs(1);
    for i in 0..20 {
        nft(&["add", "chain", "ip", "other", &format!("c{i}")]);
        if i == 10 {
            writeln!(stdin, "{}", wep_update(&w2, 2, "allow-all")).unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let busy_until = SystemTime::now();
    // Then it flushes one of our chains: that is read back and repaired.
    nft(&["flush", "chain", "ip", "calico", &chain]);
    assert!(
        chain_repaired(&h, &chain),
        "the flushed chain was not repaired by the refresh"
    );
    let err = exits_cleanly(child, stdin);
    let (from, until) = (
        felix_nft::dataplane::driver::rfc3339_utc(busy_from),
        felix_nft::dataplane::driver::rfc3339_utc(busy_until),
    );
    let skipped_while_busy = err
        .lines()
        .filter(|l| l.contains("nothing to read back"))
        .filter(|l| {
            l.get(..19)
                .is_some_and(|t| t >= &from[..19] && t < &until[..19])
        })
        .count();
    eprintln!(
        "{skipped_while_busy} refreshes skipped the read-back while another program committed"
    );
    assert!(
        skipped_while_busy >= 3,
        "{skipped_while_busy} refreshes skipped the read-back while another program committed ({from}..{until}):\n{err}"
    );
    assert!(
        !err.contains("nf_tables changed from outside under an update"),
        "{err}"
    );
    assert!(err.contains("drifted from the desired state"), "{err}");
    // The other program's table is not ours to touch.
    assert!(h
        .exec(&["nft", "list", "tables"])
        .contains("table ip other"));
}

#[test]
fn an_outside_change_is_repaired_before_or_with_the_next_update_counted_and_logged() {
    // The refresh timer is far away. The outside commit's event starts the repair at once; if
    // an update gets there first, its batch meets the outside write (the kernel refuses it,
    // ERESTART) and the read-back that follows repairs the change with it. Either way: one
    // repair, counted and logged.
    let h = host();
    let w1 = workload(&h, 1);
    let w2 = workload(&h, 2);
    let (child, mut stdin) = spawn_stdin_with(
        &h,
        Stdio::null(),
        &[("FELIX_NFTABLESREFRESHINTERVAL", "3600")],
    );
    let chain = program_allow_all(&h, &mut stdin, &w1);
    assert!(flush_chain(&h, &chain).status.success());
    writeln!(stdin, "{}", wep_update(&w2, 2, "allow-all")).unwrap();
    assert!(
        chain_repaired(&h, &chain),
        "the flushed chain was not repaired"
    );
    let err = exits_cleanly(child, stdin);
    assert!(
        err.contains("another program changed our nf_tables tables: repairing now")
            || err.contains("changed from outside under an update; repaired with it"),
        "no repair logged:\n{err}"
    );
    assert!(
        err.contains("drift_repairs=1"),
        "repair not counted once:\n{err}"
    );
}

#[test]
fn a_route_parked_on_a_down_interface_is_programmed_when_it_comes_up() {
    // A route whose interface is down waits for that interface's event, not for the
    // next apply of something else (§15); the event programs its route and ARP entry.
    let h = host();
    let w1 = workload(&h, 1);
    let w2 = workload(&h, 2);
    h.ip(&["link", "set", &w1.iface, "down"]);
    let (child, mut stdin) = spawn_stdin(&h, Stdio::null());
    let mut send = |l: &str| writeln!(stdin, "{l}").expect("writing to felix-nft");
    let route_to = |w: &Workload| h.ip(&["route", "show", &w.ip]).contains(&w.iface);
    let arp_for = |w: &Workload| {
        h.ip(&["neigh", "show", "nud", "permanent", "dev", &w.iface])
            .contains(&w.mac)
    };
    first_sync(
        &mut send,
        &w1,
        || h.exec(&["nft", "list", "ruleset"]),
        "first sync never happened",
    );
    // Another endpoint's apply programs its own route; w1's stays parked.
    send(&wep_update(&w2, 2, "allow-all"));
    assert!(eventually(|| route_to(&w2)), "w2's route never came");
    assert!(!route_to(&w1), "a route on a down interface");

    h.ip(&["link", "set", &w1.iface, "up"]);
    assert!(
        eventually(|| route_to(&w1) && arp_for(&w1)),
        "w1's route and ARP entry never came after its interface went up: {} / {}",
        h.ip(&["route"]),
        h.ip(&["neigh", "show", "nud", "permanent"])
    );
    exits_cleanly(child, stdin);
}

#[test]
fn a_removed_endpoints_conntrack_entries_are_deleted() {
    // §15: when a workload's address goes away, the conntrack entries from or to it go too (in
    // the background, as Felix does).
    let bed = stdin_bed();
    bed.allow_both();
    let entries = |ip: &str| {
        bed.h
            .exec(&["conntrack", "-L", "-f", "ipv4"])
            .lines()
            .filter(|l| l.contains(&format!("={ip} ")))
            .count()
    };
    assert!(entries(&bed.w2.ip) > 0, "the flow left no conntrack entry");
    bed.send(
        r#"{"workload_endpoint_remove":{"id":{"orchestrator_id":"k8s","workload_id":"w2","endpoint_id":"eth0"}}}"#,
    );
    assert!(
        eventually(|| entries(&bed.w2.ip) == 0),
        "w2's conntrack entries stayed: {}",
        bed.h.exec(&["conntrack", "-L", "-f", "ipv4"])
    );
    bed.exits_cleanly();
}

#[test]
fn an_endpoint_added_later_is_policed_from_the_side_table_and_merged_back() {
    // A workload added after the first sync lives in the side table (its verdicts
    // unchanged), a profile change moves its other users there too, and after 2 s without an
    // apply everything is back in the main table — with real TCP deciding at every step.
    // Before 6.4 every commit validates every table, so a side table makes no commit cheaper:
    // there the agent keeps every endpoint in the main table, with the same verdicts.
    let side_table = common::kernel_at_least(6, 4);
    let bed = stdin_bed();
    let (w1, w2) = (&bed.w1, &bed.w2);
    // Empty until the table exists.
    let table = |name: &str| {
        let out = sh(
            "ip",
            &[
                "netns", "exec", &bed.h.0, "nft", "list", "table", "ip", name,
            ],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let side = || table("calico-side");
    let main = || table("calico");
    // Where endpoints changed after the first sync are dispatched.
    let recent = || if side_table { side() } else { main() };
    first_sync(|l| bed.send(l), w1, main, "first sync: w1 in main");

    // w2 arrives: side table, and the flow to it passes.
    bed.send(&wep_update(w2, 2, "allow-all"));
    assert!(
        eventually(|| bed.w1_reaches_w2()),
        "w1 → w2:80 never passed"
    );
    assert!(
        dispatched(&recent(), &w2.iface),
        "w2 dispatched (side table: {side_table}): {}",
        recent()
    );
    if side_table {
        assert!(!dispatched(&main(), &w2.iface), "w2 not in main");
    } else {
        assert!(!side().contains("chain "), "no side table: {}", side());
    }

    // The profile changes: denied; w1 (a main-table user) moves to the side table too.
    bed.send(DENY_80);
    assert!(
        eventually(|| !bed.w1_reaches_w2()),
        "denied flow still passes"
    );
    let s = recent();
    assert!(
        dispatched(&s, &w1.iface) && dispatched(&s, &w2.iface),
        "{s}"
    );

    // Quiet: the merge brings both back to main; the verdict holds.
    assert!(
        eventually(|| !side().contains("chain filter-cali-tw-")),
        "side table never emptied: {}",
        side()
    );
    let m = main();
    assert!(
        dispatched(&m, &w1.iface) && dispatched(&m, &w2.iface),
        "{m}"
    );
    assert!(!bed.w1_reaches_w2(), "denied after the merge");
    bed.send(ALLOW_ALL);
    assert!(eventually(|| bed.w1_reaches_w2()), "flow did not come back");
    bed.exits_cleanly();
}
