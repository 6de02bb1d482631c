//! systemd notifications as systemd would receive them: the test binds a unix datagram socket,
//! puts it in `NOTIFY_SOCKET` (with `WATCHDOG_USEC`), and the agent's [`Ops`] built from the
//! environment sends `READY=1` once after the first good apply, `WATCHDOG=1` at half the
//! interval while live and none once the loop stops reporting, and `STOPPING=1` on shutdown.
//!
//! One test in this binary: it sets process environment variables.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use felix_nft::config::{Config, KeyDuration};
use felix_nft::ops::health::DATAPLANE_REPORTER;
use felix_nft::ops::Ops;

/// Every datagram that arrives within `window`.
fn collect(rx: &UnixDatagram, window: Duration) -> Vec<String> {
    let end = Instant::now() + window;
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        rx.set_read_timeout(Some(left)).unwrap();
        match rx.recv(&mut buf) {
            Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                break
            }
            Err(e) => panic!("receiving: {e}"),
        }
    }
    out
}

/// Everything already queued, without waiting.
fn drain(rx: &UnixDatagram) -> Vec<String> {
    rx.set_nonblocking(true).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok(n) = rx.recv(&mut buf) {
        out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    rx.set_nonblocking(false).unwrap();
    out
}

fn count(msgs: &[String], state: &str) -> usize {
    msgs.iter()
        .filter(|m| m.lines().any(|l| l == state))
        .count()
}

#[test]
fn notifications_reach_the_notify_socket() {
    // It sets systemd's variables in the environment, which every program the other suites of
    // this binary start would inherit: it runs in a process of its own.
    if testkit::in_own_process("ops_sdnotify::notifications_reach_the_notify_socket") {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(reach_the_notify_socket());
    }
}

async fn reach_the_notify_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let rx = UnixDatagram::bind(&path).unwrap();
    // Rust 2021: set_var is safe; this process runs this test alone, so no other thread reads env.
    std::env::set_var("NOTIFY_SOCKET", &path);
    std::env::set_var("WATCHDOG_USEC", "200000"); // 200 ms → ping every 100 ms
    std::env::set_var("WATCHDOG_PID", std::process::id().to_string());

    let config = Config {
        health_timeout_overrides: vec![KeyDuration {
            name: DATAPLANE_REPORTER.into(),
            timeout: Duration::from_millis(500),
        }],
        ..Config::default()
    };
    let ops = Ops::new(&config).expect("ops from the environment");
    assert!(ops.notifier.is_enabled());
    assert_eq!(
        ops.notifier.watchdog_interval(),
        Some(Duration::from_millis(100))
    );

    let server = ops.bind_server(&config).await.unwrap();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stop_rx.await;
    }));

    let mut dp = ops.dataplane_health();
    // Live: pings arrive; no READY before the first apply.
    let msgs = tokio::task::block_in_place(|| collect(&rx, Duration::from_millis(400)));
    assert!(count(&msgs, "WATCHDOG=1") >= 1, "{msgs:?}");
    assert_eq!(count(&msgs, "READY=1"), 0, "{msgs:?}");

    // A failed apply sends nothing; the first good one sends READY=1; a second one does not.
    ops.apply_finished(&mut dp, Duration::from_millis(1), Err(&"EINVAL"));
    dp.set_iface_in_sync();
    assert!(ops.apply_finished(&mut dp, Duration::from_millis(1), Ok(())));
    assert!(!ops.apply_finished(&mut dp, Duration::from_millis(1), Ok(())));
    let msgs = tokio::task::block_in_place(|| collect(&rx, Duration::from_millis(150)));
    assert_eq!(count(&msgs, "READY=1"), 1, "{msgs:?}");
    assert!(msgs.iter().all(|m| !m.contains("STOPPING")), "{msgs:?}");

    // The loop hangs: once its reporter times out (500 ms) the pings stop.
    tokio::time::sleep(Duration::from_millis(700)).await;
    drain(&rx);
    let msgs = tokio::task::block_in_place(|| collect(&rx, Duration::from_millis(400)));
    assert_eq!(
        count(&msgs, "WATCHDOG=1"),
        0,
        "pings while not live: {msgs:?}"
    );

    // It recovers: pings resume.
    dp.heartbeat();
    let msgs = tokio::task::block_in_place(|| collect(&rx, Duration::from_millis(400)));
    assert!(count(&msgs, "WATCHDOG=1") >= 1, "{msgs:?}");

    // Shutdown: STOPPING=1, and run returns.
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run returns")
        .unwrap();
    let msgs = tokio::task::block_in_place(|| collect(&rx, Duration::from_millis(200)));
    assert_eq!(count(&msgs, "STOPPING=1"), 1, "{msgs:?}");
}
