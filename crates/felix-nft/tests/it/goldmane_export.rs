//! The Goldmane exporter against a Goldmane stand-in on 127.0.0.1 (a TCP listener in the host's
//! namespace, no privilege; `goldmane_common`): each `FlowUpdate` arrives as raw bytes, which
//! `protoc --decode=goldmane.FlowUpdate` reads against `tests/fixtures/goldmane.proto` (copied
//! from Goldmane's `api.proto`): what arrives is checked by a decoder nobody here wrote, not by
//! our prost types.
//!
//! Cases: every field arrives as Goldmane reads it; a Goldmane that is not there yet, then resets
//! the stream, gets the flows once it is up and again after the reset; a Goldmane that accepts
//! and never reads leaves `publish` quick and the queue bounded, drops counted; mutual TLS with
//! a CA and certificates made here works, and a server certificate of another CA fails with a
//! plain logged cause and nothing sent.
//!
//! Needs `protoc` (Debian `protobuf-compiler`); without it the field test fails and says so.

use crate::goldmane_common;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_nft::flows::record::{
    Endpoint, EndpointKind, FlowKey, FlowRecord, PolicyHit, PolicyKind, Reporter, Verdict,
};
use felix_nft::goldmane::export::MAX_IN_FLIGHT;
use felix_nft::goldmane::{GoldmaneConfig, GoldmaneExporter, GoldmaneSink, Timing};
use goldmane_common::{protoc_decode, serve, stand_in, Mode, Running};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

// --- Logs, records ---

#[derive(Clone)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every test's log lines (one subscriber per process; tests tell theirs apart by address).
fn logs() -> String {
    static BUF: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    let buf = BUF.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = LogBuf(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("felix_nft=debug")
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buf
    });
    String::from_utf8_lossy(&buf.lock().unwrap()).into_owned()
}

/// The lines logged at `level` about `addr`.
fn logged(level: &str, addr: &str) -> Vec<String> {
    logs()
        .lines()
        .filter(|l| l.contains(level) && l.contains(&format!("address={addr}")))
        .map(str::to_string)
        .collect()
}

fn fast() -> Timing {
    Timing {
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
        connect_timeout: Duration::from_secs(2),
        receipt_timeout: Duration::from_secs(1),
    }
}

fn config(address: String) -> GoldmaneConfig {
    logs();
    GoldmaneConfig {
        queue: 1000,
        timing: fast(),
        ..GoldmaneConfig::new(address, "node-a")
    }
}

fn workload(name: &str, ns: &str) -> Endpoint {
    Endpoint {
        kind: EndpointKind::Workload,
        name: name.into(),
        namespace: ns.into(),
        node: None,
    }
}

/// A plain flow to port `port`, told apart by it.
fn record(port: u16) -> FlowRecord {
    FlowRecord {
        key: FlowKey {
            src: workload("a", "ns"),
            dst: workload("b", "ns"),
            proto: 17,
            dest_port: port,
            reporter: Reporter::Src,
            action: Verdict::Allow,
            trace: vec![],
        },
        start_time: 1_700_000_000,
        end_time: 1_700_000_015,
        packets_in: 0,
        packets_out: 1,
        bytes_in: 0,
        bytes_out: 100,
        connections_started: 1,
        connections_completed: 0,
        connections_live: 1,
    }
}

/// The `dest_port` protoc reads in an update.
fn port_of(bytes: &[u8]) -> u16 {
    let text = protoc_decode(bytes);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("dest_port: "))
        .map_or(0, |p| p.parse().unwrap())
}

async fn next(run: &mut Running) -> Bytes {
    tokio::time::timeout(Duration::from_secs(10), run.got.recv())
        .await
        .expect("an update within 10 s")
        .expect("the stand-in is running")
}

/// Waits until `cond` holds (polling every 20 ms), for at most `secs`.
async fn until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "not within {secs} s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// --- Cases ---

/// Every field of our hand-written messages, set, reads back under its own name in protoc's
/// decoding against Goldmane's `.proto`: the field numbers and types agree, including those the
/// exporter leaves empty (labels, services, pending policies).
#[test]
fn our_message_types_match_goldmanes_field_for_field() {
    use felix_nft::goldmane::api;
    use prost::Message;
    let hit = |kind: api::PolicyKind, name: &str| api::PolicyHit {
        kind: kind as i32,
        namespace: "ns".into(),
        name: name.into(),
        tier: "t".into(),
        action: api::Action::Deny as i32,
        policy_index: 1,
        rule_index: 2,
        trigger: None,
    };
    let update = api::FlowUpdate {
        flow: Some(api::Flow {
            key: Some(api::FlowKey {
                source_name: "sn".into(),
                source_namespace: "sns".into(),
                source_type: api::EndpointType::NetworkSet as i32,
                dest_name: "dn".into(),
                dest_namespace: "dns".into(),
                dest_type: api::EndpointType::HostEndpoint as i32,
                dest_port: 443,
                dest_service_name: "svc".into(),
                dest_service_namespace: "svcns".into(),
                dest_service_port_name: "https".into(),
                dest_service_port: 8443,
                proto: "sctp".into(),
                reporter: api::Reporter::Dst as i32,
                action: api::Action::Pass as i32,
                policies: Some(api::PolicyTrace {
                    enforced_policies: vec![api::PolicyHit {
                        trigger: Some(Box::new(hit(api::PolicyKind::ClusterNetworkPolicy, "c"))),
                        ..hit(api::PolicyKind::EndOfTier, "")
                    }],
                    pending_policies: vec![hit(
                        api::PolicyKind::StagedKubernetesNetworkPolicy,
                        "s",
                    )],
                }),
            }),
            start_time: 1,
            end_time: 2,
            source_labels: vec!["a=b".into()],
            dest_labels: vec!["c=d".into(), "e=f".into()],
            packets_in: 3,
            packets_out: 4,
            bytes_in: 5,
            bytes_out: 6,
            num_connections_started: 7,
            num_connections_completed: 8,
            num_connections_live: 9,
        }),
    };
    let text = protoc_decode(&update.encode_to_vec());
    let want = r#"flow {
  Key {
    source_name: "sn"
    source_namespace: "sns"
    source_type: NetworkSet
    dest_name: "dn"
    dest_namespace: "dns"
    dest_type: HostEndpoint
    dest_port: 443
    dest_service_name: "svc"
    dest_service_namespace: "svcns"
    dest_service_port_name: "https"
    dest_service_port: 8443
    proto: "sctp"
    reporter: Dst
    action: Pass
    policies {
      enforced_policies {
        kind: EndOfTier
        namespace: "ns"
        tier: "t"
        action: Deny
        policy_index: 1
        rule_index: 2
        trigger {
          kind: ClusterNetworkPolicy
          namespace: "ns"
          name: "c"
          tier: "t"
          action: Deny
          policy_index: 1
          rule_index: 2
        }
      }
      pending_policies {
        kind: StagedKubernetesNetworkPolicy
        namespace: "ns"
        name: "s"
        tier: "t"
        action: Deny
        policy_index: 1
        rule_index: 2
      }
    }
  }
  start_time: 1
  end_time: 2
  source_labels: "a=b"
  dest_labels: "c=d"
  dest_labels: "e=f"
  packets_in: 3
  packets_out: 4
  bytes_in: 5
  bytes_out: 6
  num_connections_started: 7
  num_connections_completed: 8
  num_connections_live: 9
}
"#;
    assert_eq!(text, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_arrives_as_goldmane_reads_it() {
    let mut run = stand_in(Mode::Ack, None, None).await;
    let (sink, task) = GoldmaneExporter::start(config(format!("http://{}", run.addr)));

    let full = FlowRecord {
        key: FlowKey {
            src: workload("client-7f9c", "prod"),
            dst: Endpoint {
                kind: EndpointKind::Network,
                name: "192.168.5.5".into(),
                namespace: String::new(),
                node: Some("node-b".into()),
            },
            proto: 6,
            dest_port: 5432,
            reporter: Reporter::Src,
            action: Verdict::Deny,
            trace: vec![
                PolicyHit {
                    kind: PolicyKind::GlobalNetworkPolicy,
                    namespace: String::new(),
                    name: "platform".into(),
                    tier: "platform".into(),
                    action: Verdict::Pass,
                    policy_index: 0,
                    rule_index: 3,
                },
                PolicyHit {
                    kind: PolicyKind::EndOfTier,
                    namespace: String::new(),
                    name: String::new(),
                    tier: "default".into(),
                    action: Verdict::Deny,
                    policy_index: -1,
                    rule_index: -1,
                },
            ],
        },
        start_time: 1_700_000_000,
        end_time: 1_700_000_015,
        packets_in: 3,
        packets_out: 4,
        bytes_in: 300,
        bytes_out: 400,
        connections_started: 2,
        connections_completed: 1,
        connections_live: 1,
    };
    let host = FlowRecord {
        key: FlowKey {
            src: Endpoint {
                kind: EndpointKind::Host,
                name: "eth0-hep".into(),
                namespace: String::new(),
                node: None,
            },
            dst: workload("web-0", "web"),
            proto: 58,
            dest_port: 0,
            reporter: Reporter::Dst,
            action: Verdict::Allow,
            trace: vec![PolicyHit {
                kind: PolicyKind::Profile,
                namespace: String::new(),
                name: "kns.web".into(),
                tier: String::new(),
                action: Verdict::Allow,
                policy_index: -1,
                rule_index: 0,
            }],
        },
        ..record(0)
    };
    sink.publish(&[full, host]);

    let first = protoc_decode(&next(&mut run).await);
    let want = r#"flow {
  Key {
    source_name: "client-7f9c"
    source_namespace: "prod"
    source_type: WorkloadEndpoint
    dest_name: "pvt"
    dest_namespace: "-"
    dest_type: Network
    dest_port: 5432
    dest_service_name: "-"
    dest_service_namespace: "-"
    dest_service_port_name: "-"
    proto: "tcp"
    reporter: Src
    action: Deny
    policies {
      enforced_policies {
        kind: GlobalNetworkPolicy
        name: "platform"
        tier: "platform"
        action: Pass
        rule_index: 3
      }
      enforced_policies {
        kind: EndOfTier
        tier: "default"
        action: Deny
        policy_index: 1
        rule_index: -1
        trigger {
          tier: "default"
        }
      }
    }
  }
  start_time: 1700000000
  end_time: 1700000015
  packets_in: 3
  packets_out: 4
  bytes_in: 300
  bytes_out: 400
  num_connections_started: 2
  num_connections_completed: 1
  num_connections_live: 1
}
"#;
    assert_eq!(first, want);

    let second = protoc_decode(&next(&mut run).await);
    let want = r#"flow {
  Key {
    source_name: "node-a"
    source_namespace: "-"
    source_type: HostEndpoint
    dest_name: "web-0"
    dest_namespace: "web"
    dest_type: WorkloadEndpoint
    dest_service_name: "-"
    dest_service_namespace: "-"
    dest_service_port_name: "-"
    proto: "icmp6"
    reporter: Dst
    action: Allow
    policies {
      enforced_policies {
        kind: Profile
        name: "kns.web"
        action: Allow
      }
    }
  }
  start_time: 1700000000
  end_time: 1700000015
  packets_out: 1
  bytes_out: 100
  num_connections_started: 1
  num_connections_live: 1
}
"#;
    assert_eq!(second, want);

    until(5, "both receipts counted", || sink.sent() == 2).await;
    assert_eq!(sink.dropped(), 0);
    assert_eq!(sink.last_error(), None);
    let addr = format!("http://{}", run.addr);
    assert_eq!(logged("WARN", &addr), Vec::<String>::new());

    // The last sink gone, the task ends.
    drop(sink);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the exporter ends when its sink is dropped")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goldmane_that_is_away_then_resets_the_stream_gets_the_flows_again() {
    // Nothing listens yet: the connection is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let address = format!("http://{addr}");
    let (sink, _task) = GoldmaneExporter::start(config(address.clone()));
    sink.publish(&[record(1), record(2)]);
    until(5, "the refused connection reported", || {
        sink.last_error().is_some()
    })
    .await;
    let cause = sink.last_error().unwrap_or_default();
    assert!(cause.contains("onnection refused"), "{cause}");

    // Goldmane comes up, takes three flows, then fails the stream on the fourth.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let mut run = serve(listener, Mode::ResetAfter(3), None, None).await;
    sink.publish(&[record(3), record(4), record(5)]);
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(port_of(&next(&mut run).await));
    }
    assert_eq!(
        seen,
        [1, 2, 3, 4],
        "the flows queued while Goldmane was away, in order"
    );

    // The exporter reconnects and sends again what was not acknowledged (4, and 5 if it was in
    // flight), then what comes later.
    until(5, "a second stream", || {
        run.streams.load(Ordering::SeqCst) >= 2
    })
    .await;
    sink.publish(&[record(6), record(7)]);
    let mut after = Vec::new();
    while !after.contains(&7) {
        after.push(port_of(&next(&mut run).await));
    }
    assert_eq!(after, [4, 5, 6, 7]);
    until(5, "every flow acknowledged", || sink.sent() == 7).await;
    assert_eq!(sink.dropped(), 0);
    assert_eq!(sink.last_error(), None);

    // One warning per state: refused, then the reset; and the way back is logged.
    let warns = logged("WARN", &address);
    assert_eq!(warns.len(), 2, "{warns:#?}");
    assert!(warns[0].contains("onnection refused"), "{}", warns[0]);
    assert!(
        warns[1].contains("Unavailable: stand-in reset"),
        "{}",
        warns[1]
    );
    assert!(
        !logged("INFO", &address).is_empty(),
        "the recovery is logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goldmane_that_never_reads_leaves_publish_quick_and_the_queue_bounded() {
    // A 1 KiB HTTP/2 stream window: the exporter's stream stalls after a few flows.
    let run = stand_in(Mode::NeverRead, None, Some(1024)).await;
    let address = format!("http://{}", run.addr);
    let queue = 200;
    let (sink, _task) = GoldmaneExporter::start(GoldmaneConfig {
        queue,
        ..config(address.clone())
    });
    until(5, "the stream open", || {
        run.streams.load(Ordering::SeqCst) >= 1
    })
    .await;

    // The collector publishes from a thread of its own.
    let publisher = sink.clone();
    let slowest = std::thread::spawn(move || {
        let mut slowest = Duration::ZERO;
        for batch in 0..50u16 {
            let records: Vec<_> = (0..100).map(|i| record(batch * 100 + i)).collect();
            let t = Instant::now();
            publisher.publish(&records);
            slowest = slowest.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(5));
        }
        slowest
    })
    .join()
    .unwrap();
    assert!(
        slowest < Duration::from_millis(100),
        "publish took {slowest:?}"
    );
    assert!(sink.queued() <= queue, "{} queued", sink.queued());
    assert!(
        sink.dropped() >= (5000 - queue - MAX_IN_FLIGHT) as u64,
        "{} dropped",
        sink.dropped()
    );
    assert_eq!(sink.sent(), 0);

    // With flows in flight and no receipt, the exporter gives up on the stream and says why.
    until(5, "the stall reported", || {
        sink.last_error().is_some_and(|e| e.contains("not reading"))
    })
    .await;
    assert!(sink.queued() <= queue);
    let warns = logged("WARN", &address);
    assert!(
        warns.iter().any(|w| w.contains("not reading")),
        "{warns:#?}"
    );
    until(5, "a reconnect", || run.streams.load(Ordering::SeqCst) >= 2).await;
    assert_eq!(
        logged("INFO", &address),
        Vec::<String>::new(),
        "a peer that never answers is not logged as working"
    );
}

// --- TLS ---

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    server_cert: String,
    server_key: String,
}

/// A CA, a server certificate for `goldmane.test` and a client certificate signed by it; the
/// CA and the client's pair written to files as Felix's Typha files would be.
fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    static CAS: AtomicUsize = AtomicUsize::new(0);
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let n = CAS.fetch_add(1, Ordering::Relaxed);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("test CA {n}"));
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf("goldmane.test");
    let (client_cert, client_key) = leaf("typha-client");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.path().join("tls.crt"), client_cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), client_key).unwrap();
    Pki {
        dir,
        ca_pem: ca.pem(),
        server_cert,
        server_key,
    }
}

fn tls_client(pki: &Pki, addr: SocketAddr) -> GoldmaneConfig {
    let file = |name: &str| Some(pki.dir.path().join(name));
    GoldmaneConfig {
        ca_file: file("ca.crt"),
        cert_file: file("tls.crt"),
        key_file: file("tls.key"),
        server_name: Some("goldmane.test".into()),
        ..config(addr.to_string())
    }
}

/// The server side: `server` presents its certificate, and requires a client certificate of
/// `client_ca`.
fn tls_server(server: &Pki, client_ca: &Pki) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(Identity::from_pem(&server.server_cert, &server.server_key))
        .client_ca_root(Certificate::from_pem(&client_ca.ca_pem))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_the_typha_files_works() {
    let pki = pki();
    let mut run = stand_in(Mode::Ack, Some(tls_server(&pki, &pki)), None).await;
    // A bare host:port with the TLS files set: TLS, as Felix.
    let (sink, _task): (GoldmaneSink, _) = GoldmaneExporter::start(tls_client(&pki, run.addr));
    sink.publish(&[record(443)]);
    assert_eq!(port_of(&next(&mut run).await), 443);
    until(5, "the receipt", || sink.sent() == 1).await;
    assert_eq!(sink.last_error(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_of_another_ca_is_refused_and_said_so() {
    let ours = pki();
    let theirs = pki();
    let mut run = stand_in(Mode::Ack, Some(tls_server(&theirs, &ours)), None).await;
    let cfg = tls_client(&ours, run.addr);
    let ca_file = cfg.ca_file.clone().unwrap_or_default();
    let (sink, _task) = GoldmaneExporter::start(cfg);
    sink.publish(&[record(443)]);
    until(5, "the TLS failure reported", || {
        sink.last_error().is_some()
    })
    .await;
    let cause = sink.last_error().unwrap_or_default();
    assert!(
        cause.contains(&format!(
            "Goldmane's certificate does not verify against the CA in TyphaCAFile ({})",
            ca_file.display()
        )),
        "{cause}"
    );
    // A few more attempts: still one warning, nothing sent.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let warns = logged("WARN", &run.addr.to_string());
    assert_eq!(warns.len(), 1, "{warns:#?}");
    assert!(warns[0].contains("does not verify"), "{}", warns[0]);
    assert_eq!(sink.sent(), 0);
    assert!(run.got.try_recv().is_err(), "nothing reached the server");
    assert_eq!(run.streams.load(Ordering::SeqCst), 0);
    assert_eq!(
        sink.queued(),
        1,
        "the flow waits for a Goldmane it can trust"
    );
}
