//! The operations HTTP endpoints over real TCP on loopback (ephemeral ports): health answers
//! 200/503 as the dataplane's reports change, liveness fails when the loop stops reporting,
//! metrics carry Felix's names and move when the loop records, shutdown closes the ports.

use std::net::SocketAddr;
use std::time::Duration;

use felix_nft::config::{Config, KeyDuration};
use felix_nft::ops::health::DATAPLANE_REPORTER;
use felix_nft::ops::{NftObjectCounts, Notifier, Ops, OpsError, Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Health and metrics on 127.0.0.1, ephemeral ports.
fn loopback_config() -> Config {
    Config {
        health_enabled: true,
        health_host: "127.0.0.1".into(),
        health_port: 0,
        prometheus_metrics_enabled: true,
        prometheus_metrics_host: Some("127.0.0.1".into()),
        prometheus_metrics_port: 0,
        ..Config::default()
    }
}

struct Running {
    health: SocketAddr,
    metrics: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

async fn start(ops: &Ops, config: &Config) -> Running {
    let server = ops.bind_server(config).await.expect("binding on loopback");
    let health = server.health_addr().expect("health enabled");
    let metrics = server.metrics_addr().expect("metrics enabled");
    assert!(health.ip().is_loopback() && health.port() != 0);
    assert!(metrics.ip().is_loopback() && metrics.port() != 0);
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    Running {
        health,
        metrics,
        stop,
        task,
    }
}

/// One HTTP/1.1 request; returns (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    request(addr, "GET", path).await
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("connecting");
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut raw))
        .await
        .expect("response within 5 s")
        .unwrap();
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}

#[tokio::test]
async fn health_follows_the_dataplane_reports() {
    let config = loopback_config();
    let ops = Ops::with_notifier(&config, Notifier::disabled()).unwrap();
    // Before the loop registers: no reporters, Felix says live and ready.
    let run = start(&ops, &config).await;
    assert_eq!(get(run.health, "/readiness").await.0, 200);

    let mut dp = ops.dataplane_health();
    let (code, body) = get(run.health, "/liveness").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(DATAPLANE_REPORTER), "{body}");
    let (code, body) = get(run.health, "/readiness").await;
    assert_eq!(code, 503, "not ready before the first apply: {body}");
    assert!(
        body.contains("waiting for the first successful apply"),
        "{body}"
    );
    assert!(body.contains("reporting non-ready"), "{body}");

    // A failed apply: still live, still not ready, the reason is shown.
    let first = ops.apply_finished(&mut dp, Duration::from_millis(3), Err(&"EBUSY on batch"));
    assert!(!first);
    let (code, body) = get(run.health, "/readiness").await;
    assert_eq!(code, 503);
    assert!(body.contains("EBUSY on batch"), "{body}");

    assert!(ops.apply_finished(&mut dp, Duration::from_millis(3), Ok(())));
    let (code, body) = get(run.health, "/readiness").await;
    assert_eq!(code, 503, "interface monitor not in sync yet: {body}");
    assert!(body.contains("interface monitor not in sync"), "{body}");

    dp.set_iface_in_sync();
    let (code, body) = get(run.health, "/readiness").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("reporting ready"), "{body}");
    assert_eq!(get(run.health, "/liveness").await.0, 200);

    // Felix's behaviour for anything else.
    assert_eq!(get(run.health, "/metrics").await.0, 404);
    assert_eq!(request(run.health, "POST", "/liveness").await.0, 405);

    run.stop.send(()).unwrap();
    run.task.await.unwrap();
}

#[tokio::test]
async fn liveness_fails_when_the_loop_stops_reporting() {
    let mut config = loopback_config();
    // The timeout comes from HealthTimeoutOverrides, as an operator would shorten it.
    config.health_timeout_overrides = vec![KeyDuration {
        name: DATAPLANE_REPORTER.into(),
        timeout: Duration::from_secs(1),
    }];
    let ops = Ops::with_notifier(&config, Notifier::disabled()).unwrap();
    let run = start(&ops, &config).await;
    let mut dp = ops.dataplane_health();
    dp.set_iface_in_sync();
    ops.apply_finished(&mut dp, Duration::from_millis(1), Ok(()));
    assert_eq!(get(run.health, "/liveness").await.0, 200);
    assert_eq!(get(run.health, "/readiness").await.0, 200);

    // The loop hangs: no heartbeat for longer than the timeout.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (code, body) = get(run.health, "/liveness").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("timed out"), "{body}");
    assert!(body.contains("1s (override)"), "{body}");
    assert_eq!(get(run.health, "/readiness").await.0, 503);

    // It comes back.
    dp.heartbeat();
    assert_eq!(get(run.health, "/liveness").await.0, 200);
    assert_eq!(get(run.health, "/readiness").await.0, 200);

    run.stop.send(()).unwrap();
    run.task.await.unwrap();
}

#[tokio::test]
async fn metrics_carry_felix_names_and_move_with_the_loop() {
    let config = loopback_config();
    let ops = Ops::with_notifier(&config, Notifier::disabled()).unwrap();
    let run = start(&ops, &config).await;

    let (code, before) = get(run.metrics, "/metrics").await;
    assert_eq!(code, 200);
    for name in [
        "felix_int_dataplane_apply_time_seconds",
        "felix_int_dataplane_failures",
        "felix_nft_calls",
        "felix_nft_errors",
        "felix_nft_list_calls",
        "felix_nft_list_errors",
        "felix_nft_set_calls",
        "felix_nft_set_errors",
        "felix_route_table_resync_seconds",
        "felix_nft_agent_batch_bytes",
        "felix_nft_agent_table_rebuilds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(
            before.contains(&format!("# TYPE {name} ")),
            "{name} missing in\n{before}"
        );
    }
    assert_eq!(
        metric(&before, "felix_int_dataplane_apply_time_seconds_count"),
        0.0
    );

    let mut dp = ops.dataplane_health();
    ops.apply_finished(&mut dp, Duration::from_millis(40), Ok(()));
    ops.apply_finished(&mut dp, Duration::from_millis(10), Err(&"ENOENT"));
    let m = &ops.metrics;
    m.record_message("WorkloadEndpointUpdate");
    m.record_message("WorkloadEndpointUpdate");
    m.record_msg_batch(2);
    m.record_nft_call(true);
    m.record_nft_call(false);
    m.record_nft_list(true);
    m.record_nft_set_call(true);
    m.record_batch(4096, 17);
    m.record_drift_repairs("chain", 3);
    m.set_nft_objects(
        4,
        "calico",
        NftObjectCounts {
            chains: 12,
            rules: 80,
            sets: 5,
            maps: 2,
        },
    );
    m.record_table_rebuild();

    let (_, after) = get(run.metrics, "/metrics").await;
    let sum = metric(&after, "felix_int_dataplane_apply_time_seconds_sum");
    assert!((sum - 0.05).abs() < 1e-9, "{sum}");
    for (name, want) in [
        ("felix_int_dataplane_apply_time_seconds_count", 2.0),
        ("felix_int_dataplane_failures", 1.0),
        (
            "felix_int_dataplane_messages{type=\"*proto.WorkloadEndpointUpdate\"}",
            2.0,
        ),
        ("felix_nft_calls", 2.0),
        ("felix_nft_errors", 1.0),
        ("felix_nft_list_calls", 1.0),
        ("felix_nft_set_calls", 1.0),
        ("felix_nft_chains{ip_version=\"4\",table=\"calico\"}", 12.0),
        ("felix_nft_rules{ip_version=\"4\",table=\"calico\"}", 80.0),
        ("felix_nft_maps{ip_version=\"4\",table=\"calico\"}", 2.0),
        ("felix_nft_agent_drift_repairs_total{object=\"chain\"}", 3.0),
        ("felix_nft_agent_batch_bytes_sum", 4096.0),
        ("felix_nft_agent_table_rebuilds_total", 1.0),
    ] {
        assert_eq!(metric(&after, name), want, "{name}");
    }
    assert!(
        metric(
            &after,
            "felix_nft_agent_last_apply_success_timestamp_seconds"
        ) > 1.7e9
    );

    assert_eq!(get(run.metrics, "/liveness").await.0, 404);

    run.stop.send(()).unwrap();
    run.task.await.unwrap();
}

#[tokio::test]
async fn shutdown_closes_the_ports() {
    let config = loopback_config();
    let ops = Ops::with_notifier(&config, Notifier::disabled()).unwrap();
    let run = start(&ops, &config).await;
    assert_eq!(get(run.health, "/liveness").await.0, 200);
    run.stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), run.task)
        .await
        .expect("run returns after shutdown")
        .unwrap();
    assert!(TcpStream::connect(run.health).await.is_err());
    assert!(TcpStream::connect(run.metrics).await.is_err());
}

#[tokio::test]
async fn disabled_by_default_and_run_still_returns() {
    let config = Config::default();
    assert!(!config.health_enabled && !config.prometheus_metrics_enabled);
    let ops = Ops::with_notifier(&config, Notifier::disabled()).unwrap();
    let server = ops.bind_server(&config).await.unwrap();
    assert_eq!(server.health_addr(), None);
    assert_eq!(server.metrics_addr(), None);
    tokio::time::timeout(Duration::from_secs(5), server.run(async {}))
        .await
        .expect("returns when shut down");
}

#[test]
fn felix_defaults_for_the_listen_addresses() {
    let config = Config {
        health_enabled: true,
        prometheus_metrics_enabled: true,
        ..Config::default()
    };
    let sc = ServerConfig::from_config(&config);
    assert_eq!(sc.health, Some(("localhost".to_string(), 9099)));
    assert_eq!(sc.metrics, Some((None, 9091)));
}

#[tokio::test]
async fn localhost_resolves_to_loopback() {
    let sc = ServerConfig {
        health: Some(("localhost".into(), 0)),
        metrics: None,
    };
    let server = Server::bind(
        &sc,
        Default::default(),
        felix_nft::ops::Metrics::new(false).unwrap(),
        Notifier::disabled(),
    )
    .await
    .unwrap();
    let addr = server.health_addr().unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
}

#[tokio::test]
async fn a_port_in_use_is_an_error_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let sc = ServerConfig {
        health: Some(("127.0.0.1".into(), port)),
        metrics: None,
    };
    let err = Server::bind(
        &sc,
        Default::default(),
        felix_nft::ops::Metrics::new(false).unwrap(),
        Notifier::disabled(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, OpsError::Bind { what: "health", .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}
