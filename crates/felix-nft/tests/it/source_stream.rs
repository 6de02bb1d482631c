//! The JSON stream transport: one message per line from stdin or a unix socket. Good lines are
//! delivered in order; a bad line is reported with its line number and the field path at fault,
//! and the lines after it are still delivered.

use testkit as common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_nft::source::stream::{self, UnixSource};
use felix_nft::source::{Origin, Received, RejectReason, SourceError};
use tokio::sync::mpsc;

const GOOD_BAD_GOOD: &str = concat!(
    r#"{"sequence_number":1,"ipset_update":{"id":"s:a","type":"NET","members":["10.0.0.0/24"]}}"#,
    "\n\n",
    r#"{"sequence_number":2,"active_policy_update":{"id":{"name":"p"},"policy":{"inbound_rules":[{"action":"allow","dst_ports":[{"first":"eighty"}]}]}}}"#,
    "\n",
    r#"{"sequenceNumber":"3","ipsetRemove":{"id":"s:a"}}"#,
    "\n",
    r#"{"sequence_number":4,"in_sync":{}}"#,
    "\n",
);

/// Checks what GOOD_BAD_GOOD produces on a channel, with line origins on `stream`.
async fn check_good_bad_good(rx: &mut mpsc::Receiver<Received>, stream: &str) {
    let line = |n| Origin::Line {
        stream: Arc::from(stream),
        line: n,
    };
    let a = rx.recv().await.unwrap().unwrap();
    assert_eq!((a.origin, a.message.sequence_number), (line(1), 1));
    let bad = rx.recv().await.unwrap().unwrap_err();
    assert_eq!(bad.origin, line(3), "blank line 2 is skipped but counted");
    let RejectReason::Json(e) = &bad.reason else {
        panic!("{bad:?}")
    };
    assert_eq!(
        e.path,
        "active_policy_update.policy.inbound_rules[0].dst_ports[0].first"
    );
    let c = rx.recv().await.unwrap().unwrap();
    assert_eq!((c.origin, c.message.kind()), (line(4), "ipset_remove"));
    assert_eq!(c.message.sequence_number, 3);
    let d = rx.recv().await.unwrap().unwrap();
    assert_eq!((d.origin, d.message.kind()), (line(5), "in_sync"));
}

#[tokio::test]
async fn reader_delivers_good_lines_around_a_bad_one() {
    let (mut rx, task) = stream::spawn_reader(GOOD_BAD_GOOD.as_bytes(), "mem");
    check_good_bad_good(&mut rx, "mem").await;
    assert!(rx.recv().await.is_none());
    let s = task.await.unwrap().unwrap();
    assert_eq!((s.lines, s.decoded, s.rejected), (5, 3, 1));
}

/// `felix-nft run --trace-input --source SOURCE` in a namespace of its own, with the default log
/// format; its stderr piped.
fn spawn_run(source: &str, stdin: Stdio) -> Child {
    spawn_run_to(source, stdin, Stdio::null())
}

fn spawn_run_to(source: &str, stdin: Stdio, stdout: Stdio) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix-nft"));
    common::isolate_netns(&mut cmd);
    cmd.args(["run", "--trace-input", "--source", source])
        .env_remove("FELIX_NFT_LOG")
        .env_remove("FELIX_NFT_LOG_FORMAT")
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning felix-nft")
}

/// The kinds of `FromDataplane` JSON lines (each must decode as one).
fn reply_kinds(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}"));
            let m: felix_api::FromDataplane = felix_api::json::decode(l)
                .unwrap_or_else(|e| panic!("{l:?} is not a FromDataplane: {e}"));
            assert!(m.payload.is_some(), "{l}");
            let obj = v.as_object().expect("an object");
            obj.keys()
                .find(|k| *k != "sequence_number")
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// In the stream modes the agent says what Felix would hear on fd 4, as JSON lines on
/// standard output: each family's WireGuard key (empty: WireGuard is off), then in-sync.
#[test]
fn stdin_mode_answers_with_json_lines_on_stdout() {
    let mut child = spawn_run_to("stdin", Stdio::piped(), Stdio::piped());
    let mut stdin = child.stdin.take().expect("a piped stdin");
    stdin.write_all(b"{\"in_sync\":{}}\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let kinds = reply_kinds(&text);
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("dataplane_in_sync"),
        "{text}"
    );
    assert!(
        text.contains(r#""wireguard_status_update":{"ip_version":"IPV4"}"#),
        "{text}"
    );
}

#[test]
fn stdin_through_the_binary() {
    let mut child = spawn_run("stdin", Stdio::piped());
    let mut stdin = child.stdin.take().expect("a piped stdin");
    stdin.write_all(GOOD_BAD_GOOD.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let find = |parts: &[&str]| {
        lines
            .iter()
            .position(|l| parts.iter().all(|p| l.contains(p)))
            .unwrap_or_else(|| panic!("no line with {parts:?} in:\n{err}"))
    };
    let first = find(&["input", "seq=1", "stdin line 1", "ipset_update"]);
    let bad = find(&[
        "input rejected",
        "stdin line 3",
        "active_policy_update.policy.inbound_rules[0].dst_ports[0].first",
    ]);
    let third = find(&["input", "seq=3", "stdin line 4", "ipset_remove"]);
    let fourth = find(&["input", "seq=4", "stdin line 5", "in_sync"]);
    assert!(first < bad && bad < third && third < fourth, "{err}");
    find(&["end of input", "decoded=3", "rejected=1"]);
}

#[tokio::test]
async fn unix_socket_serves_each_client_with_its_own_line_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.sock");
    let source = UnixSource::bind(&path).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Nothing left over from the private staging directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let (mut rx, server) = source.spawn();
    let client = |text: &'static str| {
        let p = path.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = UnixStream::connect(&p).unwrap();
            c.write_all(text.as_bytes()).unwrap();
        })
    };
    client(GOOD_BAD_GOOD).await.unwrap();
    let first = format!("unix:{}#1", path.display());
    check_good_bad_good(&mut rx, &first).await;
    let clients = client("{\"in_sync\":{}}\n{\"bogus\":1}\n");
    let second = format!("unix:{}#2", path.display());
    let a = rx.recv().await.unwrap().unwrap();
    assert_eq!(
        a.origin,
        Origin::Line {
            stream: Arc::from(second.as_str()),
            line: 1
        }
    );
    let b = rx.recv().await.unwrap().unwrap_err();
    assert!(b.to_string().contains(&format!("{second} line 2")), "{b}");
    assert!(
        format!("{:?}", b.reason).contains("unknown field `bogus`"),
        "{b:?}"
    );
    clients.await.unwrap();

    // Dropping the receiver stops the server, which removes the socket file.
    drop(rx);
    tokio::time::timeout(common::patient(Duration::from_secs(10)), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!path.exists());
}

#[tokio::test]
async fn an_idle_unix_client_does_not_hold_up_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.sock");
    let (mut rx, _server) = UnixSource::bind(&path).unwrap().spawn();
    // The first client connects, sends half a line and stays.
    let mut idle = tokio::net::UnixStream::connect(&path).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut idle, b"{\"in_sync\"")
        .await
        .unwrap();
    let mut busy = tokio::net::UnixStream::connect(&path).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut busy, b"{\"ipset_remove\":{\"id\":\"s:a\"}}\n")
        .await
        .unwrap();
    let got = tokio::time::timeout(common::patient(Duration::from_secs(5)), rx.recv())
        .await
        .expect("the second client's line arrives while the first is idle")
        .unwrap()
        .unwrap();
    assert_eq!(
        got.origin,
        Origin::Line {
            stream: Arc::from(format!("unix:{}#2", path.display()).as_str()),
            line: 1
        }
    );
    // The first client finishes its line later; it is read in turn.
    tokio::io::AsyncWriteExt::write_all(&mut idle, b":{}}\n")
        .await
        .unwrap();
    let later = tokio::time::timeout(common::patient(Duration::from_secs(5)), rx.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        later.origin,
        Origin::Line {
            stream: Arc::from(format!("unix:{}#1", path.display()).as_str()),
            line: 1
        }
    );
}

#[tokio::test]
async fn unix_socket_refuses_live_sockets_and_other_files_and_replaces_stale_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");

    // A stale socket (bound, then its listener gone) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let live = UnixSource::bind(&path).unwrap();

    // A live one is not.
    let err = UnixSource::bind(&path).err().unwrap();
    assert!(matches!(err, SourceError::Socket { .. }), "{err}");
    assert!(err.to_string().contains("another process"), "{err}");
    drop(live);
    assert!(!path.exists());

    // Nor is a regular file.
    std::fs::write(&path, b"data").unwrap();
    let err = UnixSource::bind(&path).err().unwrap();
    assert!(err.to_string().contains("non-socket"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
}

#[test]
fn unix_socket_through_the_binary_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.sock");
    let mut child = spawn_run(&format!("unix:{}", path.display()), Stdio::null());
    let deadline = Instant::now() + common::patient(Duration::from_secs(20));
    while !path.exists() {
        assert!(Instant::now() < deadline, "socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = UnixStream::connect(&path).unwrap();
    c.write_all(b"{\"sequence_number\":9,\"in_sync\":{}}\n{\"in_sync\":{\"x\":1}}\n")
        .unwrap();
    // Half-closed: the client still hears what the agent says, as JSON lines.
    c.shutdown(std::net::Shutdown::Write).unwrap();
    c.set_read_timeout(Some(common::patient(Duration::from_secs(60))))
        .unwrap();
    let mut replies = String::new();
    let mut reader = BufReader::new(c);
    while !replies.contains("dataplane_in_sync") {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap_or(0) > 0,
            "the socket ended before in-sync: {replies}"
        );
        replies.push_str(&line);
    }
    assert_eq!(
        reply_kinds(&replies).last().map(String::as_str),
        Some("dataplane_in_sync")
    );
    drop(reader);

    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    while !seen.contains("input rejected") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "{seen}");
        seen.push_str(&line);
    }
    assert!(seen.contains("seq=9"), "{seen}");
    assert!(
        seen.contains("line 2") && seen.contains("in_sync.x"),
        "{seen}"
    );

    // SAFETY: sending SIGTERM to our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!path.exists(), "socket file left behind");
}
