//! The apply loop on a fake kernel (no privilege), for a resilience bug the 200-endpoint churn
//! test found: while unknown routes on a workload interface wait out their grace period (§15:
//! e.g. after an endpoint is removed but its `cali` interface is still there), the loop must still
//! apply every other change at once. It used the failure backoff timer for the grace re-check,
//! which held back every apply, policy changes included, for up to 10 s.

use std::time::Duration;

use felix_api::{json, ToDataplane};
use felix_nft::dataplane::driver::{Driver, LoopOptions};
use felix_nft::dataplane::kernel::{Call, FakeKernel};
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft::source::{Origin, Received, Update};
use rtnl::link::LinkState;
use rtnl::monitor::IfaceEvent;
use tokio::sync::{mpsc, oneshot};
use tokio::time::sleep;

fn msg(text: &str) -> Received {
    let message: ToDataplane = json::decode(text).expect("test message");
    Ok(Update::new(Origin::Item { index: 0 }, message))
}

const IN_SYNC: &str = r#"{"in_sync":{}}"#;
const WEP: &str = r#"{"workload_endpoint_update":{"id":{"orchestrator_id":"k8s","workload_id":"w1","endpoint_id":"eth0"},"endpoint":{"state":"active","name":"cali00000000001","mac":"ee:ee:ee:ee:ee:01","ipv4_nets":["10.65.0.1/32"],"profile_ids":["kns.default"]}}}"#;
const PROFILE: &str = r#"{"active_profile_update":{"id":{"name":"kns.default"},"profile":{"inbound_rules":[{"action":"deny"}]}}}"#;

/// Runs the loop (kernel reporting one route in grace on every routes call) while `script`
/// feeds it; stops the loop when the script ends. Returns the kernel's calls.
async fn run_with<F, Fut>(script: F) -> Vec<Call>
where
    F: FnOnce(mpsc::Sender<Received>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dp = Dataplane::new(DataplaneConfig::default(), 1).expect("default config renders");
    let kernel = FakeKernel {
        routes_in_grace: 1,
        ..FakeKernel::default()
    };
    let mut d = Driver::new(dp, kernel, LoopOptions::default(), None, None);
    let (tx, rx) = mpsc::channel(64);
    let (itx, irx) = mpsc::channel(64);
    itx.send(IfaceEvent::Link(LinkState {
        index: 7,
        name: "cali00000000001".into(),
        admin_up: true,
        oper_up: true,
        mac: vec![0xee; 6],
        mtu: 1500,
    }))
    .await
    .unwrap();
    itx.send(IfaceEvent::InSync).await.unwrap();
    tx.send(msg(WEP)).await.unwrap();
    tx.send(msg(IN_SYNC)).await.unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let feed = async move {
        script(tx).await;
        let _ = stop_tx.send(());
    };
    let (r, ()) = tokio::join!(
        d.run(rx, irx, async {
            let _ = stop_rx.await;
        }),
        feed
    );
    r.expect("the loop runs");
    drop(itx);
    d.kernel.calls
}

fn count(calls: &[Call], f: impl Fn(&Call) -> bool) -> usize {
    calls.iter().filter(|c| f(c)).count()
}

#[tokio::test(start_paused = true)]
async fn a_policy_change_during_the_route_grace_period_is_applied_at_once() {
    let calls = run_with(|tx| async move {
        sleep(Duration::from_secs(1)).await;
        tx.send(msg(PROFILE)).await.unwrap();
        // Well inside the 10 s grace period.
        sleep(Duration::from_millis(300)).await;
    })
    .await;
    let tables = count(&calls, |c| matches!(c, Call::Tables { .. }));
    assert_eq!(
        tables, 2,
        "the profile change was not applied while a route was in grace: {calls:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn routes_in_grace_are_looked_at_again_when_it_ends_without_a_busy_loop() {
    let calls = run_with(|_tx| async move {
        sleep(Duration::from_millis(10_500)).await;
    })
    .await;
    let routes = count(&calls, |c| matches!(c, Call::Routes { .. }));
    assert_eq!(
        routes, 2,
        "want the first apply and one re-check after the grace period: {calls:?}"
    );
    // The re-check touches routes only: the tables were not dirty.
    let tables = count(&calls, |c| matches!(c, Call::Tables { .. }));
    assert_eq!(tables, 1, "{calls:?}");
}
