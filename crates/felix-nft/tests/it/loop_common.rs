//! The apply loop on a fake kernel, for the loop's tests: messages, interface events, a driver
//! and a run of it to the end of its input.
#![allow(dead_code)]

use felix_api::{json, ToDataplane};
use felix_nft::dataplane::driver::{Driver, DriverError, LoopOptions};
use felix_nft::dataplane::kernel::FakeKernel;
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft::source::{Origin, Received, Update};
use rtnl::link::LinkState;
use rtnl::monitor::IfaceEvent;
use tokio::sync::mpsc;

pub fn msg(text: &str) -> Received {
    let message: ToDataplane = json::decode(text).expect("test message");
    Ok(Update::new(Origin::Item { index: 0 }, message))
}

pub const IN_SYNC: &str = r#"{"in_sync":{}}"#;

pub fn wep(n: u32, iface: &str) -> String {
    format!(
        r#"{{"workload_endpoint_update":{{"id":{{"orchestrator_id":"k8s","workload_id":"w{n}","endpoint_id":"eth0"}},"endpoint":{{"state":"active","name":"{iface}","mac":"ee:ee:ee:ee:ee:0{}","ipv4_nets":["10.65.0.{n}/32"],"profile_ids":["kns.default"]}}}}}}"#,
        n % 10
    )
}

pub fn link(name: &str, index: u32, up: bool) -> IfaceEvent {
    IfaceEvent::Link(LinkState {
        index,
        name: name.into(),
        admin_up: up,
        oper_up: up,
        mac: vec![0xee; 6],
        mtu: 1500,
    })
}

pub fn driver(kernel: FakeKernel) -> Driver<FakeKernel> {
    let dp = Dataplane::new(DataplaneConfig::default(), 1).expect("default config renders");
    Driver::new(
        dp,
        kernel,
        LoopOptions {
            exit_on_eof: true,
            ..LoopOptions::default()
        },
        None,
        None,
    )
}

/// Feeds the messages and interface events, closes the input, and runs the loop to its end.
/// One workload endpoint on an interface that is up, then both InSyncs: one apply.
pub async fn run_one_endpoint(d: &mut Driver<FakeKernel>) -> Result<(), DriverError> {
    run(
        d,
        vec![msg(&wep(1, "cali0000000001")), msg(IN_SYNC)],
        vec![link("cali0000000001", 7, true), IfaceEvent::InSync],
    )
    .await
}

/// The ends of a loop's two inputs, still open: the senders to feed it more with, the receivers
/// for [`Driver::run`].
pub struct Inputs {
    pub tx: mpsc::Sender<Received>,
    pub rx: mpsc::Receiver<Received>,
    pub itx: mpsc::Sender<IfaceEvent>,
    pub irx: mpsc::Receiver<IfaceEvent>,
}

/// Inputs already holding the interfaces' InSync, one workload endpoint (w1 on
/// `cali0000000001`) and the datastore's InSync: the loop's first apply, with room for more.
pub async fn one_endpoint_inputs() -> Inputs {
    let (tx, rx) = mpsc::channel(16);
    let (itx, irx) = mpsc::channel(16);
    itx.send(IfaceEvent::InSync).await.expect("iface channel");
    tx.send(msg(&wep(1, "cali0000000001")))
        .await
        .expect("update channel");
    tx.send(msg(IN_SYNC)).await.expect("update channel");
    Inputs { tx, rx, itx, irx }
}

pub async fn run(
    d: &mut Driver<FakeKernel>,
    msgs: Vec<Received>,
    ifaces: Vec<IfaceEvent>,
) -> Result<(), DriverError> {
    let (tx, rx) = mpsc::channel(1024);
    let (itx, irx) = mpsc::channel(64);
    for i in ifaces {
        itx.send(i).await.expect("iface channel");
    }
    for m in msgs {
        tx.send(m).await.expect("update channel");
    }
    drop(tx);
    let _keep_monitor_open = itx;
    d.run(rx, irx, std::future::pending()).await
}
