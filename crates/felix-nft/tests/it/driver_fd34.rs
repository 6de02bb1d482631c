//! End to end: the `felix-nft` binary run the way Felix runs its external dataplane driver
//! (§1.1) — no arguments, fd 3 = messages in, fd 4 = messages out, 8-byte
//! little-endian length + protobuf envelope per frame. We send frames, watch the trace lines on
//! stderr, close fd 3 and see the driver exit 0; broken framing makes it exit non-zero, promptly.

use testkit as common;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use felix_api::frame::encode_frame;
use felix_api::{json, ToDataplane};

/// How long to wait for what must come (only a failure waits it out; under an emulated CPU
/// 3,000 endpoints take tens of seconds, and [`testkit::patient`] stretches it there).
fn timeout() -> Duration {
    testkit::patient(Duration::from_secs(30))
}

fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid 2-element array for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    (fds[0], fds[1])
}

/// The driver as a child, with the parent's ends of its fd 3 and fd 4 pipes.
struct Driver {
    child: Child,
    to_fd3: Option<File>,
    from_fd4: File,
    stderr_lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

fn spawn_driver(envs: &[(&str, &str)]) -> Driver {
    let (r3, w3) = pipe();
    let (r4, w4) = pipe();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix-nft"));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove("FELIX_NFT_LOG")
        .env_remove("FELIX_NFT_LOG_FORMAT");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    common::isolate_netns(&mut cmd);
    // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Move both ends above 3/4 first, so neither dup2 below clobbers the other's source.
            let hi3 = libc::fcntl(r3, libc::F_DUPFD_CLOEXEC, 10);
            let hi4 = libc::fcntl(w4, libc::F_DUPFD_CLOEXEC, 10);
            if hi3 < 0 || hi4 < 0 || libc::dup2(hi3, 3) < 0 || libc::dup2(hi4, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawning felix-nft");
    // SAFETY: we own these descriptors; the child has its own copies.
    let (to_fd3, from_fd4) = unsafe {
        libc::close(r3);
        libc::close(w4);
        (File::from_raw_fd(w3), File::from_raw_fd(r4))
    };
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Driver {
        child,
        to_fd3: Some(to_fd3),
        from_fd4,
        stderr_lines: rx,
        seen: Vec::new(),
    }
}

impl Driver {
    fn send(&mut self, bytes: &[u8]) {
        let f = self.to_fd3.as_mut().expect("fd 3 already closed");
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
    }

    fn close_fd3(&mut self) {
        self.to_fd3 = None;
    }

    /// Waits for a stderr line containing every one of `parts`.
    fn expect_line(&mut self, parts: &[&str]) -> String {
        let deadline = Instant::now() + timeout();
        if let Some(l) = self
            .seen
            .iter()
            .find(|l| parts.iter().all(|p| l.contains(p)))
        {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if parts.iter().all(|p| line.contains(p)) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no stderr line with {parts:?} within {:?}; saw:\n{}",
                    timeout(),
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + timeout();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Collect what is left of stderr for the assertions' messages.
                while let Ok(line) = self.stderr_lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(line);
                }
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "driver did not exit within {:?}; stderr:\n{}",
                    timeout(),
                    self.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn msg(text: &str) -> ToDataplane {
    json::decode(text).unwrap()
}

#[test]
fn driver_decodes_frames_and_exits_zero_when_fd3_closes() {
    let mut d = spawn_driver(&[("FELIX_NFT_TRACE_INPUT", "1")]);
    d.expect_line(&["felix-nft starting"]);

    // Two frames in one write, then one more on its own.
    let mut burst = encode_frame(&msg(
        r#"{"sequence_number":0,"config_update":{"config":{"LogSeverityScreen":"Info"}}}"#,
    ));
    burst.extend(encode_frame(&msg(
        r#"{"sequence_number":1,"ipset_update":{"id":"s:abc","type":"NET","members":["10.0.0.0/24"]}}"#,
    )));
    d.send(&burst);
    d.expect_line(&["input", "seq=0", "kind=\"config_update\"", "fd 3 frame 0"]);
    d.expect_line(&["input", "seq=1", "kind=\"ipset_update\"", "fd 3 frame 1"]);

    d.send(&encode_frame(&msg(r#"{"sequence_number":2,"in_sync":{}}"#)));
    d.expect_line(&["input", "seq=2", "kind=\"in_sync\""]);

    // Still running: it has not seen EOF.
    assert!(d.child.try_wait().unwrap().is_none());
    d.close_fd3();
    let status = d.wait();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        d.seen.join("\n")
    );
    d.expect_line(&["end of input", "decoded=3", "rejected=0"]);

    // Its first apply told Felix each family's WireGuard key (empty: WireGuard is off, as
    // Felix's own dataplane reports it), then that it is in sync (one `DataplaneInSync`
    // frame); then it closed fd 4 cleanly, with no stray bytes.
    let mut rest = Vec::new();
    d.from_fd4.read_to_end(&mut rest).unwrap();
    let mut frames = felix_api::frame::FrameReader::new(&rest[..]);
    let mut kinds = Vec::new();
    while let Some(f) = frames.read_frame().unwrap() {
        kinds.push(felix_api::decode_from_dataplane(&f).unwrap().kind());
    }
    assert_eq!(
        kinds,
        [
            "wireguard_status_update",
            "wireguard_status_update",
            "dataplane_in_sync"
        ],
        "frames on fd 4"
    );
}

#[test]
fn driver_logs_json_when_asked() {
    let mut d = spawn_driver(&[
        ("FELIX_NFT_TRACE_INPUT", "1"),
        ("FELIX_NFT_LOG_FORMAT", "json"),
    ]);
    d.send(&encode_frame(&msg(r#"{"sequence_number":7,"in_sync":{}}"#)));
    let line = d.expect_line(&["\"kind\":\"in_sync\""]);
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object per line");
    assert_eq!(v["seq"], 7);
    assert_eq!(v["level"], "INFO");
    d.close_fd3();
    assert!(d.wait().success());
}

#[test]
fn undecodable_envelope_is_rejected_and_the_stream_goes_on() {
    let mut d = spawn_driver(&[("FELIX_NFT_TRACE_INPUT", "1")]);
    let mut bytes = 2u64.to_le_bytes().to_vec();
    bytes.extend([0x12, 0x7f]); // ipset_update claiming 127 bytes it does not have
    bytes.extend(encode_frame(&msg(r#"{"sequence_number":1,"in_sync":{}}"#)));
    d.send(&bytes);
    d.expect_line(&["input rejected", "fd 3 frame 0", "felix.ToDataplane"]);
    d.expect_line(&["input", "kind=\"in_sync\"", "fd 3 frame 1"]);
    d.close_fd3();
    assert!(d.wait().success());
    d.expect_line(&["end of input", "decoded=1", "rejected=1"]);
}

#[test]
fn truncated_frame_fails_clearly() {
    let mut d = spawn_driver(&[]);
    let frame = encode_frame(&msg(r#"{"ipset_remove":{"id":"s:abc"}}"#));
    d.send(&frame[..frame.len() - 2]);
    d.close_fd3();
    let status = d.wait();
    assert_eq!(status.code(), Some(1), "stderr:\n{}", d.seen.join("\n"));
    d.expect_line(&["input failed", "stream ended inside frame 0"]);
}

#[test]
fn oversize_length_fails_without_waiting_for_the_body() {
    let mut d = spawn_driver(&[]);
    // 1 TiB claimed; fd 3 stays open, so a reader that waited for the body would hang.
    d.send(&(1u64 << 40).to_le_bytes());
    let status = d.wait();
    assert_eq!(status.code(), Some(1), "stderr:\n{}", d.seen.join("\n"));
    d.expect_line(&["input failed", "more than the limit"]);
}

fn wep_frame(seq: u64, n: u32) -> Vec<u8> {
    encode_frame(&msg(&format!(
        r#"{{"sequence_number":{seq},"workload_endpoint_update":{{"id":{{"orchestrator_id":"k8s","workload_id":"default/w{n}","endpoint_id":"eth0"}},"endpoint":{{"state":"active","name":"cali{n:011}","mac":"ee:ee:ee:ee:ee:01","ipv4_nets":["10.{}.{}.{}/32"]}}}}}}"#,
        n >> 16,
        (n >> 8) & 255,
        n & 255
    )))
}

#[test]
fn a_felix_that_does_not_read_fd4_does_not_stop_the_dataplane() {
    // 3,000 endpoint statuses are far more than the fd 4 pipe holds; nobody reads it.
    let mut d = spawn_driver(&[
        ("FELIX_NFT_TRACE_INPUT", "1"),
        ("FELIX_CONFIGFILE", "/nonexistent/felix.cfg"),
        ("FELIX_NFTABLESTABLEOWNER", "false"),
    ]);
    const N: u32 = 3000;
    let mut burst = Vec::new();
    for n in 0..N {
        burst.extend(wep_frame(u64::from(n), n));
    }
    burst.extend(encode_frame(&msg(&format!(
        r#"{{"sequence_number":{N},"in_sync":{{}}}}"#
    ))));
    d.send(&burst);
    d.expect_line(&["dataplane in sync"]);
    // The loop is still applying: one more endpoint, then one more apply.
    let late = u64::from(N) + 1;
    d.send(&wep_frame(late, N + 1));
    d.expect_line(&["input", &format!("seq={late}")]);
    let at = d.seen.len();
    let deadline = Instant::now() + timeout();
    while !d.seen[at..]
        .iter()
        .any(|l| l.contains("apply") && l.contains("ok=true"))
    {
        assert!(
            Instant::now() < deadline,
            "no apply after the late update; stderr:\n{}",
            d.seen[at..].join("\n")
        );
        if let Ok(l) = d.stderr_lines.recv_timeout(Duration::from_millis(200)) {
            d.seen.push(l);
        }
    }
    if let Some(apply) = d.seen[at..]
        .iter()
        .find(|l| l.contains("apply") && l.contains("ok=true"))
    {
        eprintln!("the late update's apply, fd 4 unread: {apply}");
    }
    // Now Felix reads: every endpoint's latest status arrives, the late one's too.
    d.close_fd3();
    let mut rest = Vec::new();
    d.from_fd4.read_to_end(&mut rest).unwrap();
    assert!(d.wait().success(), "stderr:\n{}", d.seen.join("\n"));
    let mut frames = felix_api::frame::FrameReader::new(&rest[..]);
    let mut statuses = std::collections::BTreeSet::new();
    while let Some(f) = frames.read_frame().unwrap() {
        let m = felix_api::decode_from_dataplane(&f).unwrap();
        if let Some(felix_api::from_dataplane::Payload::WorkloadEndpointStatusUpdate(u)) = m.payload
        {
            statuses.insert(u.id.unwrap_or_default().workload_id);
        }
    }
    assert_eq!(statuses.len(), N as usize + 1);
    assert!(statuses.contains(&format!("default/w{}", N + 1)));
}

#[test]
fn a_frame_over_the_configured_limit_fails_at_once_naming_the_limit() {
    let mut d = spawn_driver(&[("FELIX_INPUTMAXMESSAGEBYTES", "4096")]);
    let members: Vec<String> = (0..600)
        .map(|i| format!("\"10.1.{}.{}/32\"", i / 250, i % 250))
        .collect();
    let big = msg(&format!(
        r#"{{"ipset_update":{{"id":"s:big","type":"IP","members":[{}]}}}}"#,
        members.join(",")
    ));
    let frame = encode_frame(&big);
    assert!(frame.len() > 4096 + 8);
    d.send(&frame);
    // Said when it happens, with fd 3 still open: not only in the exit summary.
    d.expect_line(&[
        "fd 3 input failed",
        "more than the limit of 4096",
        "InputMaxMessageBytes",
    ]);
    let status = d.wait();
    assert_eq!(status.code(), Some(1), "stderr:\n{}", d.seen.join("\n"));
}

/// Starts `felix-nft run --source stdin` in a network namespace of its own, with no config
/// file, default logging and `env` added; returns the child and its stdin.
fn spawn_stdin_agent(env: &[(&str, &str)]) -> (Child, ChildStdin) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix-nft"));
    cmd.args(["run", "--source", "stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env("FELIX_CONFIGFILE", "/nonexistent/felix.cfg")
        .envs(env.iter().copied())
        .env_remove("FELIX_NFT_LOG")
        .env_remove("FELIX_NFT_LOG_FORMAT");
    common::isolate_netns(&mut cmd);
    let mut child = cmd.spawn().expect("spawning felix-nft");
    let stdin = child.stdin.take().expect("stdin");
    (child, stdin)
}

#[test]
fn an_over_long_json_line_is_rejected_and_the_next_one_applied() {
    let (child, mut stdin) = spawn_stdin_agent(&[
        ("FELIX_INPUTMAXMESSAGEBYTES", "4096"),
        ("FELIX_NFT_TRACE_INPUT", "1"),
    ]);
    let members: Vec<String> = (0..100_000)
        .map(|i| format!("\"10.{}.{}.{}\"", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    // A 1.4 MB line against a 4 KiB limit, then a good one: the reader drops the first as it
    // arrives (the writer is not blocked) and goes on.
    let writer = std::thread::spawn(move || {
        writeln!(
            stdin,
            r#"{{"ipset_update":{{"id":"s:big","type":"IP","members":[{}]}}}}"#,
            members.join(",")
        )?;
        writeln!(stdin, r#"{{"sequence_number":2,"in_sync":{{}}}}"#)
    });
    let out = child.wait_with_output().expect("waiting for felix-nft");
    let written = writer.join().expect("writer thread");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}; stderr:\n{err}", out.status);
    assert!(
        written.is_ok(),
        "writing both lines: {written:?}; stderr:\n{err}"
    );
    let rejected = err
        .lines()
        .find(|l| l.contains("input rejected"))
        .unwrap_or_else(|| panic!("no rejection logged:\n{err}"));
    common::assert_contains_all(
        rejected,
        &[
            "stdin line 1",
            "more than the limit of 4096",
            "InputMaxMessageBytes",
        ],
    );
    assert!(
        err.lines()
            .any(|l| l.contains("kind=\"in_sync\"") && l.contains("stdin line 2")),
        "{err}"
    );
    assert!(err.contains("decoded=1 rejected=1"), "{err}");
}

#[test]
fn a_huge_bad_value_is_logged_cut_with_its_size() {
    let (child, mut stdin) = spawn_stdin_agent(&[]);
    let huge = "x".repeat(10 << 20);
    let writer = std::thread::spawn(move || {
        // A validation error (a member that is no address) and a decode error (a string where
        // a number belongs), each carrying the 10 MB value.
        writeln!(
            stdin,
            r#"{{"ipset_update":{{"id":"s:a","type":"IP","members":["{huge}"]}}}}"#
        )?;
        writeln!(stdin, r#"{{"sequence_number":"{huge}"}}"#)?;
        writeln!(stdin, r#"{{"in_sync":{{}}}}"#)
    });
    let out = child.wait_with_output().expect("waiting for felix-nft");
    let written = writer.join().expect("writer thread");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        written.is_ok() && out.status.success(),
        "{written:?} {}",
        out.status
    );
    assert!(err.contains("decoded=2 rejected=2"), "{err}");
    let longest = err.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "a log line of {longest} bytes");
    let cut = |l: &&str| l.contains("…[10485") && l.contains(" bytes]");
    assert_eq!(
        err.lines().filter(cut).count(),
        2,
        "no cut values with their size:\n{err}"
    );
}

/// A command with fds 3 and 4 closed in the child, even if the test runner inherited them.
fn without_fds_3_and_4(args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix-nft"));
    cmd.args(args).stdin(Stdio::null());
    common::isolate_netns(&mut cmd);
    // SAFETY: close is async-signal-safe. The test runner may itself have inherited fds 3/4
    // (a make jobserver, say); the child must not.
    unsafe {
        cmd.pre_exec(|| {
            libc::close(3);
            libc::close(4);
            Ok(())
        });
    }
    cmd.output().unwrap()
}

#[test]
fn no_arguments_without_fds_3_and_4_is_a_usage_error() {
    let out = without_fds_3_and_4(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not both open"));
}

#[test]
fn run_source_felix_without_fds_is_a_usage_error_not_a_crash() {
    // Regression: taking fd 3 after the async runtime had opened its epoll descriptor as fd 3
    // closed the runtime's descriptor under it.
    let out = without_fds_3_and_4(&["run", "--source", "felix"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("file descriptor 3 is not open"), "{err}");
}
