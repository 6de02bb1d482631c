//! The apply loop on a fake kernel (no privilege): InSync gating, the fixed apply order,
//! coalescing, retry with backoff, the atomic rebuild after repeated failures, the fail-closed
//! exit, rejected updates and empty updates (§10.2–10.4, §11).

use std::time::Duration;

use felix_api::{json, ToDataplane};
use felix_nft::dataplane::driver::{Driver, DriverError, LoopOptions};
use felix_nft::dataplane::kernel::{Call, FakeKernel, TableMode};
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft::source::Received;
use felix_nft_rules::Renderer;
use rtnl::ipip::IpipWanted;
use rtnl::monitor::IfaceEvent;
use rtnl::wgsync::WgWanted;
use tokio::sync::mpsc;

use crate::loop_common;
use loop_common::{driver, msg, one_endpoint_inputs, run, run_one_endpoint, wep, Inputs, IN_SYNC};

fn table_calls(k: &FakeKernel) -> Vec<TableMode> {
    k.calls
        .iter()
        .filter_map(|c| match c {
            Call::Tables { mode, .. } => Some(*mode),
            _ => None,
        })
        .collect()
}

/// A driver whose fake kernel fails the first `n` table transactions.
fn driver_failing_tables(n: usize) -> Driver<FakeKernel> {
    driver(FakeKernel {
        fail_tables: n,
        ..FakeKernel::default()
    })
}

/// Runs the loop over an empty datastore: both in-syncs, no endpoints.
async fn run_empty_sync(d: &mut Driver<FakeKernel>) -> Result<(), DriverError> {
    run(d, vec![msg(IN_SYNC)], vec![IfaceEvent::InSync]).await
}

#[tokio::test(start_paused = true)]
async fn nothing_touches_the_kernel_before_both_in_syncs() {
    // §22.2: no datastore InSync → no kernel call at all, whatever else arrived.
    let mut d = driver(FakeKernel::default());
    run(
        &mut d,
        vec![msg(&wep(1, "cali0000000001"))],
        vec![IfaceEvent::InSync],
    )
    .await
    .unwrap();
    assert!(d.kernel.calls.is_empty(), "{:?}", d.kernel.calls);

    // Datastore InSync but the interface monitor never synced: still nothing.
    let mut d = driver(FakeKernel::default());
    let (tx, rx) = mpsc::channel(16);
    let (_itx, irx) = mpsc::channel::<IfaceEvent>(16);
    tx.send(msg(IN_SYNC)).await.unwrap();
    let run = d.run(rx, irx, tokio::time::sleep(Duration::from_secs(5)));
    run.await.unwrap();
    assert!(d.kernel.calls.is_empty(), "{:?}", d.kernel.calls);
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn one_apply_runs_the_phases_in_the_fixed_order() {
    // §10.3: globals (first apply) → tables → overlay → routes → neighbours → WireGuard →
    // interface sysctls.
    let mut d = driver(FakeKernel::default());
    run_one_endpoint(&mut d).await.unwrap();
    let calls = &d.kernel.calls;
    assert_eq!(
        calls[..],
        [
            Call::Globals,
            Call::Tables {
                mode: TableMode::Resync,
                // Main and side table of both families.
                tables: 4
            },
            // No VXLAN here: the overlay phase leaves the device alone.
            Call::Overlay {
                device: false,
                fdb: 0,
                neighbour_changes: 0,
                resync: true
            },
            // No IPIP, and IpInIpEnabled unset: tunl0's addresses go, as Felix clears them.
            Call::Ipip(IpipWanted::Strip),
            Call::Routes {
                groups: 1,
                resync: true
            },
            Call::Neighbours {
                ifaces: 1,
                resync: true
            },
            // WireGuard off: each family's device, rule and table routes are removed (and
            // the empty key reported), as Felix cleans up.
            Call::Wireguard(vec![
                WgWanted::Disabled {
                    name: "wireguard.cali".into(),
                    table: 1
                },
                WgWanted::Disabled {
                    name: "wg-v6.cali".into(),
                    table: 1
                },
            ]),
            Call::IfaceConf("cali0000000001".into()),
        ],
        "{calls:#?}"
    );
    assert!(d.in_sync());
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_updates_is_one_transaction() {
    // §10.2: messages are drained in batches before an apply; 50 endpoints → one commit.
    let mut d = driver(FakeKernel::default());
    let mut msgs: Vec<Received> = (1..=50)
        .map(|n| msg(&wep(n, &format!("cali{n:011}"))))
        .collect();
    msgs.push(msg(IN_SYNC));
    run(&mut d, msgs, vec![IfaceEvent::InSync]).await.unwrap();
    assert_eq!(table_calls(&d.kernel), [TableMode::Resync]);
    assert_eq!(d.kernel.commits, 1);
    let weps = d.kernel.committed[0]
        .sets
        .get("filter-cali-to-wl-dispatch")
        .map(|s| s.elements.len());
    assert_eq!(weps, Some(50), "every endpoint is in the dispatch map");
}

#[tokio::test(start_paused = true)]
async fn failures_are_retried_with_backoff_until_they_succeed() {
    let mut d = driver_failing_tables(3);
    let t0 = tokio::time::Instant::now();
    run_empty_sync(&mut d).await.unwrap();
    // Three failures, then success; every retry re-reads the kernel first.
    assert_eq!(
        table_calls(&d.kernel),
        [TableMode::Resync; 4],
        "{:?}",
        d.kernel.calls
    );
    // Backoff 100 + 200 + 400 ms between the attempts.
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(d.summary().failures, 3);
    assert!(d.in_sync());
}

#[tokio::test(start_paused = true)]
async fn repeated_failures_lead_to_an_atomic_rebuild() {
    // §11: from the sixth consecutive failure on, the table is recreated in one transaction.
    let mut d = driver_failing_tables(5);
    run_empty_sync(&mut d).await.unwrap();
    let modes = table_calls(&d.kernel);
    assert_eq!(modes.len(), 6, "{modes:?}");
    assert_eq!(modes[5], TableMode::Rebuild);
    assert!(d.in_sync());
}

#[tokio::test(start_paused = true)]
async fn the_loop_fails_closed_when_even_the_rebuild_fails() {
    // §10.3 / §22.13: better exit than run half-programmed; the kernel keeps the last good rules.
    let mut d = driver_failing_tables(1000);
    let err = run_empty_sync(&mut d).await.unwrap_err();
    assert!(
        matches!(err, DriverError::GaveUp { failures: 10, .. }),
        "{err}"
    );
    let modes = table_calls(&d.kernel);
    assert_eq!(modes.len(), 10);
    assert!(
        modes[5..].iter().all(|m| *m == TableMode::Rebuild),
        "{modes:?}"
    );
    assert!(!d.in_sync());
}

#[tokio::test(start_paused = true)]
async fn a_rejected_update_changes_nothing_and_the_stream_goes_on() {
    let mut d = driver(FakeKernel::default());
    let bad_policy = r#"{"active_policy_update":{"id":{"name":"p","kind":"GlobalNetworkPolicy"},"policy":{"inbound_rules":[{"action":"allow","src_ip_set_ids":["s:missing"]}]}}}"#;
    let bad_wep = r#"{"workload_endpoint_update":{"id":{"orchestrator_id":"k8s","workload_id":"x","endpoint_id":"eth0"},"endpoint":{"state":"active","name":"cali-much-too-long-name","ipv4_nets":["10.0.0.1/32"]}}}"#;
    run(
        &mut d,
        vec![
            msg(IN_SYNC),
            msg(&wep(1, "cali0000000001")),
            msg(bad_policy),
            msg(bad_wep),
            msg(&wep(2, "cali0000000002")),
        ],
        vec![IfaceEvent::InSync],
    )
    .await
    .unwrap();
    assert_eq!(d.summary().rejected, 2);
    let t = &d.kernel.committed[0];
    assert!(
        Renderer::workload_chain_of(t, "cali0000000002", true)
            .is_some_and(|c| t.chains.contains_key(c)),
        "later updates still apply"
    );
    assert!(!t.chains.keys().any(|c| c.contains("cali-much-too-long")));
    assert!(
        !t.chains.keys().any(|c| c.contains("pi-")),
        "the bad policy was not recorded"
    );
}

#[tokio::test(start_paused = true)]
async fn an_update_that_changes_nothing_sends_nothing() {
    let mut d = driver(FakeKernel::default());
    let Inputs { tx, rx, itx, irx } = one_endpoint_inputs().await;
    let feeder = async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The same endpoint again: desired state unchanged.
        tx.send(msg(&wep(1, "cali0000000001"))).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(tx);
        drop(itx);
    };
    let (res, ()) = tokio::join!(d.run(rx, irx, std::future::pending()), feeder);
    res.unwrap();
    // The second apply computed the same tables: the fake saw no change to commit.
    assert_eq!(d.kernel.commits, 1, "{:?}", d.kernel.calls);
}

#[tokio::test(start_paused = true)]
async fn route_sync_disabled_leaves_nothing_dirty() {
    // RouteSyncDisabled=true skips route work entirely; the endpoint's route must not stay
    // "dirty" and make the loop re-apply forever.
    let dp = Dataplane::new(
        DataplaneConfig {
            route_sync_disabled: true,
            ..DataplaneConfig::default()
        },
        1,
    )
    .expect("default config renders");
    let mut d = Driver::new(
        dp,
        FakeKernel::default(),
        LoopOptions::default(),
        None,
        None,
    );
    let Inputs { tx, rx, itx, irx } = one_endpoint_inputs().await;
    // Run for a while with the input still open: only the one apply may happen.
    // (Timers fire meanwhile: heartbeat and health ticks every 10 s wake the loop.)
    d.run(rx, irx, tokio::time::sleep(Duration::from_secs(35)))
        .await
        .unwrap();
    assert_eq!(d.summary().applies, 1, "the loop kept re-applying");
    assert_eq!(
        table_calls(&d.kernel),
        [TableMode::Resync],
        "{:?}",
        d.kernel.calls
    );
    assert!(!d
        .kernel
        .calls
        .iter()
        .any(|c| matches!(c, Call::Routes { .. })));
    drop((tx, itx));
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_added_later_goes_to_the_side_table_and_merges_back_when_idle() {
    let mut d = driver(FakeKernel::default());
    let Inputs { tx, rx, itx, irx } = one_endpoint_inputs().await;
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel::<()>();
    let feeder = async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        tx.send(msg(&wep(2, "cali0000000002"))).await.unwrap();
        // Well past the 2 s of quiet after which the side table merges back (two commits).
        tokio::time::sleep(Duration::from_secs(10)).await;
        let _ = seen_tx.send(());
        drop(tx);
        drop(itx);
    };
    let (res, ()) = tokio::join!(d.run(rx, irx, std::future::pending()), feeder);
    res.unwrap();
    assert!(seen_rx.try_recv().is_ok());
    // First sync, the side-table add, then the merge's two steps.
    assert_eq!(d.kernel.commits, 4, "{:?}", d.kernel.calls);
    assert!(!d.dp.side_pending());
    let table = |name: &str| {
        d.kernel
            .desired
            .iter()
            .find(|t| t.family == nf_tables::model::Family::Ip && t.name == name)
            .cloned()
            .unwrap()
    };
    let (main, side) = (
        table(felix_nft_rules::OWNER),
        table(felix_nft_rules::SIDE_TABLE),
    );
    assert!(Renderer::workload_chain_of(&main, "cali0000000002", true)
        .is_some_and(|c| main.chains.contains_key(c)));
    assert!(Renderer::workload_chain_of(&side, "cali0000000002", true).is_none());
    assert!(main.sets["filter-cali-wl-side"].elements.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_update_restates_only_its_own_routes_and_neighbours() {
    // The host phases of an endpoint change cost that endpoint's interface, not a
    // pass over every workload.
    let mut d = driver(FakeKernel::default());
    run(
        &mut d,
        vec![
            msg(&wep(1, "cali0000000001")),
            msg(&wep(2, "cali0000000002")),
            msg(&wep(3, "cali0000000003")),
            msg(IN_SYNC),
        ],
        vec![IfaceEvent::InSync],
    )
    .await
    .unwrap();
    assert!(d.kernel.calls.contains(&Call::Routes {
        groups: 3,
        resync: true
    }));
    d.kernel.calls.clear();
    let m: ToDataplane = json::decode(&wep(4, "cali0000000004")).unwrap();
    d.dp.on_update(&m).unwrap();
    d.apply().await.unwrap();
    for want in [
        Call::Routes {
            groups: 1,
            resync: false,
        },
        Call::Neighbours {
            ifaces: 1,
            resync: false,
        },
    ] {
        assert!(
            d.kernel.calls.contains(&want),
            "{want:?} missing: {:?}",
            d.kernel.calls
        );
    }
}
