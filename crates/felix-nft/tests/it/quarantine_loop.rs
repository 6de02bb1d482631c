//! Quarantine in the apply loop, on a fake kernel that refuses one object among many: the input
//! behind it is found (from the object the error names, or by bisection when it names none),
//! set aside at its last good version or fail-closed without one, everything else is
//! committed, the endpoints it touches report `error`, and its next update is tried again. A
//! refusal that is not about one input stays a failure: retried, rebuilt, then the loop gives up.

use felix_api::from_dataplane::Payload as Out;
use felix_api::PolicyId;
use felix_nft::dataplane::driver::{Driver, DriverError, LoopOptions};
use felix_nft::dataplane::kernel::FakeKernel;
use felix_nft::dataplane::quarantine::ObjKey;
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft::source::outbox::{outbox, OutboxReader};
use felix_nft::source::Received;
use felix_nft_rules::Renderer;
use rtnl::monitor::IfaceEvent;

use crate::loop_common;
use loop_common::{link, msg, IN_SYNC};

const MARK: &str = "refuse=me";

fn policy(n: u32, refused: bool) -> String {
    let note = if refused {
        r#","metadata":{"annotations":{"refuse":"me"}}"#
    } else {
        ""
    };
    format!(
        r#"{{"active_policy_update":{{"id":{{"name":"p{n}","kind":"GlobalNetworkPolicy"}},"policy":{{"inbound_rules":[{{"action":"allow","protocol":{{"name":"tcp"}},"dst_ports":[{{"first":{port},"last":{port}}}]{note}}}],"outbound_rules":[{{"action":"allow"}}]}}}}}}"#,
        port = 8000 + n
    )
}

fn iface(n: u32) -> String {
    format!("cali{n:011}")
}

/// Endpoint `n` on `cali…n` with policy `p<n>` in its only tier.
fn wep(n: u32) -> String {
    format!(
        r#"{{"workload_endpoint_update":{{"id":{{"orchestrator_id":"k8s","workload_id":"w{n}","endpoint_id":"eth0"}},"endpoint":{{"state":"active","name":"{}","mac":"ee:ee:ee:ee:ee:0{}","ipv4_nets":["10.65.0.{n}/32"],"tiers":[{{"name":"default","ingress_policies":[{{"name":"p{n}","kind":"GlobalNetworkPolicy"}}],"egress_policies":[{{"name":"p{n}","kind":"GlobalNetworkPolicy"}}]}}]}}}}}}"#,
        iface(n),
        n % 10
    )
}

fn pid(n: u32) -> PolicyId {
    PolicyId {
        name: format!("p{n}"),
        namespace: String::new(),
        kind: "GlobalNetworkPolicy".into(),
    }
}

fn driver(kernel: FakeKernel) -> (Driver<FakeKernel>, OutboxReader) {
    let mut cfg = DataplaneConfig::default();
    cfg.rules.ipv6_enabled = false;
    let dp = Dataplane::new(cfg, 1).expect("default config renders");
    let (tx, rx) = outbox();
    let d = Driver::new(
        dp,
        kernel,
        LoopOptions {
            exit_on_eof: true,
            ..LoopOptions::default()
        },
        Some(tx),
        None,
    );
    (d, rx)
}

fn refusing(named: bool) -> FakeKernel {
    FakeKernel {
        refuse_comment: Some(MARK.into()),
        name_refused: named,
        ..FakeKernel::default()
    }
}

async fn run(
    d: &mut Driver<FakeKernel>,
    msgs: Vec<Received>,
    ifaces: Vec<IfaceEvent>,
) -> Result<(), DriverError> {
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(3600),
        loop_common::run(d, msgs, ifaces),
    )
    .await;
    match r {
        Ok(r) => r,
        Err(_) => panic!(
            "the loop did not end: {:?}; quarantined {:?}; dirty {:?}; calls {}",
            d.summary(),
            d.dp.quarantined().keys().collect::<Vec<_>>(),
            d.dp.dirty(),
            d.kernel.calls.len()
        ),
    }
}

/// Ten endpoints, each with its own policy; policy `bad` (if any) is one the kernel refuses.
fn ten(bad: Option<u32>) -> (Vec<Received>, Vec<IfaceEvent>) {
    let mut msgs = Vec::new();
    let mut ifaces = Vec::new();
    for n in 1..=10 {
        msgs.push(msg(&policy(n, Some(n) == bad)));
        msgs.push(msg(&wep(n)));
        ifaces.push(link(&iface(n), 100 + n, true));
    }
    msgs.push(msg(IN_SYNC));
    ifaces.push(IfaceEvent::InSync);
    (msgs, ifaces)
}

/// The comments of the committed chain `name`, in any of our tables.
fn chain_comments(k: &FakeKernel, name: &str) -> Option<Vec<String>> {
    k.committed.iter().find_map(|t| {
        t.chains.get(name).map(|c| {
            c.rules
                .iter()
                .map(|r| r.comment.clone().unwrap_or_default())
                .collect()
        })
    })
}

/// The statuses waiting for Felix: the latest of each endpoint.
fn statuses(rx: &mut OutboxReader) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for m in rx.try_take() {
        if let Some(Out::WorkloadEndpointStatusUpdate(u)) = m.payload {
            out.push((
                u.id.map(|i| i.workload_id).unwrap_or_default(),
                u.status.map(|s| s.status).unwrap_or_default(),
            ));
        }
    }
    out
}

async fn quarantines_the_refused_policy_and_programs_the_rest(named: bool) {
    let (mut d, mut rx) = driver(refusing(named));
    let (msgs, ifaces) = ten(Some(7));
    run(&mut d, msgs, ifaces).await.expect("the loop runs on");
    assert!(
        d.in_sync(),
        "the first apply succeeded without the bad input"
    );
    let q: Vec<&ObjKey> = d.dp.quarantined().keys().collect();
    assert_eq!(q, vec![&ObjKey::Policy(pid(7))]);
    // Every endpoint is programmed; the bad policy had no good version: its chain drops.
    // (A workload whose policy changed may live in the side table meanwhile.)
    let dispatched: usize = d
        .kernel
        .committed
        .iter()
        .filter_map(|t| t.sets.get("filter-cali-to-wl-dispatch"))
        .map(|s| s.elements.len())
        .sum();
    assert_eq!(dispatched, 10);
    let p7 = chain_comments(&d.kernel, "filter-cali-pi-gnp/p7").expect("p7's chain");
    assert!(
        p7.iter().any(|c| c.contains("not received yet: deny")),
        "{p7:?}"
    );
    assert!(!p7.iter().any(|c| c.contains(MARK)));
    let p3 = chain_comments(&d.kernel, "filter-cali-pi-gnp/p3").expect("p3's chain");
    assert!(!p3.iter().any(|c| c.contains("deny")), "{p3:?}");
    // w7 reports an error (its policy is not what was asked); the others are up.
    let st = statuses(&mut rx);
    assert!(st.contains(&("w7".into(), "error".into())), "{st:?}");
    assert!(st.contains(&("w3".into(), "up".into())), "{st:?}");
    assert!(!st.contains(&("w3".into(), "error".into())), "{st:?}");
    assert_eq!(
        d.summary().failures,
        0,
        "no apply failed: {:?}",
        d.summary()
    );
}

#[tokio::test(start_paused = true)]
async fn the_input_behind_a_named_object_is_quarantined() {
    quarantines_the_refused_policy_and_programs_the_rest(true).await;
}

#[tokio::test(start_paused = true)]
async fn without_a_named_object_bisection_finds_the_input() {
    quarantines_the_refused_policy_and_programs_the_rest(false).await;
}

#[tokio::test(start_paused = true)]
async fn a_bad_version_leaves_the_last_good_one_and_the_next_update_is_tried() {
    for named in [true, false] {
        let (mut d, _rx) = driver(refusing(named));
        let (msgs, ifaces) = ten(None);
        run(&mut d, msgs, ifaces).await.expect("the loop runs on");
        assert!(d.in_sync());
        // Once in sync, policy 3 changes to a version the kernel refuses, and endpoint 11
        // arrives in the same batch.
        let msgs = vec![
            msg(&policy(3, true)),
            msg(&policy(11, false)),
            msg(&wep(11)),
        ];
        run(&mut d, msgs, vec![link(&iface(11), 111, true)])
            .await
            .expect("the loop runs on");
        assert_eq!(
            d.dp.quarantined().keys().collect::<Vec<_>>(),
            vec![&ObjKey::Policy(pid(3))],
            "named: {named}"
        );
        // p3 keeps its last good version (port 8003, no marker); endpoint 11 is in.
        let p3 = chain_comments(&d.kernel, "filter-cali-pi-gnp/p3").expect("p3's chain");
        assert!(
            !p3.iter().any(|c| c.contains(MARK) || c.contains("deny")),
            "{p3:?}"
        );
        assert_eq!(
            d.dp.model().policies[&pid(3)].inbound_rules[0].dst_ports[0].first,
            8003
        );
        // (In the side table, as an endpoint added after the first sync is.)
        let tw = d
            .kernel
            .committed
            .iter()
            .find_map(|t| Renderer::workload_chain_of(t, "cali00000000011", true));
        assert!(chain_comments(&d.kernel, tw.expect("endpoint 11 dispatched")).is_some());

        // The next update of p3 (a good one) leaves the quarantine and is programmed.
        let next = policy(3, false).replace("8003", "9003");
        run(&mut d, vec![msg(&next)], vec![]).await.expect("runs");
        assert!(d.dp.quarantined().is_empty());
        assert_eq!(
            d.dp.model().policies[&pid(3)].inbound_rules[0].dst_ports[0].first,
            9003
        );
        let p3 = chain_comments(&d.kernel, "filter-cali-pi-gnp/p3").expect("p3's chain");
        assert!(!p3.iter().any(|c| c.contains("deny")), "{p3:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_quarantined_endpoint_without_a_good_version_fails_closed() {
    // An endpoint whose own chain the kernel refuses: no good version, so it is left out (its
    // interface is unknown to the dispatch maps, which drop it) and reports `error`.
    let (mut d, mut rx) = driver(refusing(true));
    let (mut msgs, ifaces) = ten(None);
    let bad = wep(4).replace(
        r#""tiers""#,
        r#""annotations":{},"allow_spoofed_source_prefixes":[],"profile_ids":["refuse-prof"],"tiers""#,
    );
    msgs.insert(0, msg(r#"{"active_profile_update":{"id":{"name":"refuse-prof"},"profile":{"inbound_rules":[{"action":"allow","metadata":{"annotations":{"refuse":"me"}}}]}}}"#));
    msgs.retain(|m| !matches!(m, Ok(u) if format!("{:?}", u.message).contains("\"w4\"")));
    msgs.insert(msgs.len() - 1, msg(&bad));
    run(&mut d, msgs, ifaces).await.expect("the loop runs on");
    // The profile made the refused chain; it is quarantined, and w4 uses it.
    let q: Vec<&ObjKey> = d.dp.quarantined().keys().collect();
    assert_eq!(q, vec![&ObjKey::Profile("refuse-prof".into())]);
    let st = statuses(&mut rx);
    assert!(st.contains(&("w4".into(), "error".into())), "{st:?}");
    let prof = chain_comments(&d.kernel, "filter-cali-pri-refuse-prof").expect("chain");
    assert!(
        prof.iter().any(|c| c.contains("deny")),
        "fails closed: {prof:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_not_about_an_input_still_ends_in_giving_up() {
    // The refused object is a static chain no input made: nothing to quarantine. The loop
    // retries, rebuilds, and gives up, with nothing wrongly set aside.
    let (mut d, _rx) = driver(FakeKernel {
        refuse_comment: Some("Unknown interface".into()),
        name_refused: false,
        ..FakeKernel::default()
    });
    let (msgs, ifaces) = ten(None);
    let r = run(&mut d, msgs, ifaces).await;
    assert!(
        matches!(r, Err(DriverError::GaveUp { failures: 10, .. })),
        "{r:?}"
    );
    assert!(d.dp.quarantined().is_empty(), "{:?}", d.dp.quarantined());
    assert!(!d.dp.bisecting());
}
