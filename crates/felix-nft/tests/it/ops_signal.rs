//! SIGTERM and SIGINT, once [`Termination`] is installed, end up as a value instead of killing
//! the process — and drive [`Ops::run`]'s shutdown, which sends systemd nothing without a
//! notify socket and returns.
//!
//! The test signals its own process, so it runs in a process of its own: a signal would
//! interrupt the blocking calls of the other suites of this binary.

use std::time::Duration;

use felix_nft::config::Config;
use felix_nft::ops::{Notifier, Ops, Termination};

#[test]
fn termination_signals_are_caught_and_named() {
    if testkit::in_own_process("ops_signal::termination_signals_are_caught_and_named") {
        tokio::runtime::Runtime::new()
            .expect("a runtime")
            .block_on(caught_and_named());
    }
}

async fn caught_and_named() {
    let mut term = Termination::install().expect("installing signal handlers");
    // SAFETY: kill(2) on our own pid with a signal we now handle.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
    let got = tokio::time::timeout(Duration::from_secs(5), term.recv())
        .await
        .expect("SIGTERM delivered");
    assert_eq!(got, "SIGTERM");

    // As the daemon wires it: the ops server runs until the signal.
    let config = Config {
        health_enabled: true,
        health_host: "127.0.0.1".into(),
        health_port: 0,
        ..Config::default()
    };
    let ops = Ops::with_notifier(&config, Notifier::disabled()).unwrap();
    let server = ops.bind_server(&config).await.unwrap();
    let addr = server.health_addr().unwrap();
    let run = tokio::spawn(server.run(async move {
        term.recv().await;
    }));
    tokio::net::TcpStream::connect(addr).await.expect("serving");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGINT) }, 0);
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("run returns after SIGINT")
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
