//! Quarantine over the real kernel, proven with traffic: the apply loop runs in-process on a
//! test bed node with `RealKernel`, behind a wrapper that makes the kernel refuse one object
//! among many (any chain holding a rule marked `refuse=me`, as the kernel refuses an object it
//! cannot take; the wrapper still folds the batch and has the kernel validate it, as a real
//! refusal leaves the reconciler). The input behind it is set aside, everything else is
//! programmed and passes traffic, the endpoint it touches fails closed, and its next update
//! is programmed.

use crate::e2e_common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use e2e_common::{abc, require_root, step_deadline, three_v4_workloads, PROBE_TIMEOUT};
use felix_api::{json, ToDataplane};
use felix_nft::dataplane::driver::{Driver, LoopOptions};
use felix_nft::dataplane::kernel::{
    Kernel, KernelError, RealKernel, RoutesOutcome, TableMode, TablesInput, TablesOutcome,
};
use felix_nft::dataplane::quarantine::ObjKey;
use felix_nft::dataplane::{Dataplane, DataplaneConfig, IfaceConf};
use felix_nft::source::{Origin, Update};
use felix_nft_lab::testbed::probe::{run_matrix, Flow, Proto, TcpServer, Verdict};
use felix_nft_lab::testbed::topology::Workload;
use nf_tables::error::{ObjectRef, Target};
use nf_tables::model::Table;
use nf_tables::NftError;
use rtnl::monitor::{self, MonitorConfig};
use rtnl::neigh::Mac;
use rtnl::routes::RouteSpec;
use serde_json::json;
use tokio::sync::mpsc;

const A: Ipv4Addr = Ipv4Addr::new(198, 18, 5, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 5, 2);
const C: Ipv4Addr = Ipv4Addr::new(198, 18, 5, 3);
const WEB: u16 = 8080;

/// The real kernel, refusing every commit whose tables hold a chain with a marked rule.
struct Refusing {
    inner: RealKernel,
    folded: Vec<Table>,
    refusals: usize,
}

impl Refusing {
    fn marked(&self) -> Option<Target> {
        self.folded.iter().find_map(|t| {
            t.chains
                .values()
                .find(|c| {
                    c.rules.iter().any(|r| {
                        r.comment
                            .as_deref()
                            .is_some_and(|x| x.contains("refuse=me"))
                    })
                })
                .map(|c| Target {
                    family: t.family,
                    table: t.name.clone(),
                    object: ObjectRef::Chain(c.name.clone()),
                })
        })
    }
}

impl Kernel for Refusing {
    async fn globals(&mut self, ip_forwarding: bool, ipv6: bool) -> Result<(), KernelError> {
        self.inner.globals(ip_forwarding, ipv6).await
    }

    async fn tables(
        &mut self,
        input: TablesInput,
        mode: TableMode,
    ) -> Result<TablesOutcome, KernelError> {
        input.clone().fold_into(&mut self.folded);
        let Some(target) = self.marked() else {
            return self.inner.tables(input, mode).await;
        };
        // The reconciler folds the batch and the kernel checks it, keeping nothing; then the
        // refusal, naming the object as the kernel's extended ACK does.
        self.inner.tables(input, TableMode::DryRun).await?;
        self.refusals += 1;
        Err(KernelError::Nft(NftError::Rejected {
            object: format!("adding chain {:?} (refused by the test)", target.object),
            errno: libc::EINVAL,
            ext_ack: None,
            attr_offset: None,
            more: 0,
            target: Some(Box::new(target)),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        }))
    }

    async fn routes(
        &mut self,
        routes: &BTreeMap<String, Vec<RouteSpec>>,
        only: Option<&std::collections::BTreeSet<String>>,
        resync: bool,
    ) -> Result<RoutesOutcome, KernelError> {
        self.inner.routes(routes, only, resync).await
    }

    async fn overlay(
        &mut self,
        devices: &[rtnl::vxlan::VxlanWanted],
        changed: &std::collections::BTreeSet<String>,
        resync: bool,
    ) -> Result<felix_nft::dataplane::kernel::OverlayOutcome, KernelError> {
        self.inner.overlay(devices, changed, resync).await
    }

    async fn ipip(
        &mut self,
        want: &rtnl::ipip::IpipWanted,
        changed: &std::collections::BTreeSet<String>,
        resync: bool,
    ) -> Result<felix_nft::dataplane::kernel::IpipOutcome, KernelError> {
        self.inner.ipip(want, changed, resync).await
    }

    async fn wireguard(
        &mut self,
        want: Vec<(rtnl::IpFamily, rtnl::wgsync::WgWanted)>,
        src_valid_mark: bool,
        changed: &std::collections::BTreeSet<String>,
        resync: bool,
    ) -> Result<felix_nft::dataplane::kernel::WgOutcome, KernelError> {
        self.inner
            .wireguard(want, src_valid_mark, changed, resync)
            .await
    }

    async fn neighbours(
        &mut self,
        neigh: &BTreeMap<String, Vec<(IpAddr, Mac)>>,
        only: Option<&std::collections::BTreeSet<String>>,
        changed: &std::collections::BTreeSet<String>,
        resync: bool,
    ) -> Result<(), KernelError> {
        self.inner.neighbours(neigh, only, changed, resync).await
    }

    async fn iface_conf(&mut self, iface: &str, conf: &IfaceConf) -> Result<(), KernelError> {
        self.inner.iface_conf(iface, conf).await
    }

    async fn conntrack_cleanup(&mut self, ips: Vec<IpAddr>) {
        self.inner.conntrack_cleanup(ips).await
    }

    async fn conntrack_settle(&mut self) -> Vec<(IpAddr, String)> {
        self.inner.conntrack_settle().await
    }
}

fn send(tx: &mpsc::Sender<felix_nft::source::Received>, v: serde_json::Value) {
    let m: ToDataplane = json::decode(&v.to_string()).expect("test message");
    tx.blocking_send(Ok(Update::new(Origin::Item { index: 0 }, m)))
        .expect("the loop takes updates");
}

fn wep(w: &Workload, tiers: serde_json::Value) -> serde_json::Value {
    let mut ep = serde_json::to_value(w.endpoint(&["allow-all"])).expect("endpoint JSON");
    ep["tiers"] = tiers;
    json!({"workload_endpoint_update": {"id": serde_json::to_value(w.endpoint_id()).unwrap(), "endpoint": ep}})
}

fn policy(name: &str, marked: bool) -> serde_json::Value {
    let mut rule = json!({"action": "allow", "protocol": {"name": "tcp"},
        "dst_ports": [{"first": WEB, "last": WEB}]});
    if marked {
        rule["metadata"] = json!({"annotations": {"refuse": "me"}});
    }
    json!({"active_policy_update": {"id": {"name": name, "kind": "GlobalNetworkPolicy"},
        "policy": {"inbound_rules": [rule], "outbound_rules": [{"action": "allow"}]}}})
}

fn tier(name: &str) -> serde_json::Value {
    let id = json!({"name": name, "kind": "GlobalNetworkPolicy"});
    json!([{"name": "default", "ingress_policies": [id.clone()], "egress_policies": [id],
        "default_action": "Deny"}])
}

fn expect(step: &str, flows: &[Flow<'_>]) {
    let t0 = Instant::now();
    loop {
        let r = run_matrix(flows, PROBE_TIMEOUT);
        if r.all_match() {
            eprintln!("step {step:?} after {:?}\n{r}", t0.elapsed());
            return;
        }
        assert!(t0.elapsed() < step_deadline(), "step {step:?}:\n{r}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn flow<'a>(from: &'a Workload, to: &Workload, expect: Verdict) -> Flow<'a> {
    Flow {
        from: from.name.clone(),
        ns: from.ns(),
        to: to.name.clone(),
        dst: IpAddr::V4(to.ipv4.expect("v4 workload")),
        proto: Proto::Tcp,
        port: WEB,
        expect,
    }
}

#[test]
fn one_refused_policy_among_many_is_quarantined_and_the_rest_is_programmed() {
    require_root();
    let topo = three_v4_workloads("fnt-quar", [A, B, C]);
    let _srv: Vec<TcpServer> = topo
        .workloads()
        .iter()
        .map(|w| TcpServer::start(w.ns(), WEB).expect("listening"))
        .collect();
    let (a, b, c) = abc(&topo);
    let ns = topo.host().try_clone().expect("the host namespace");
    let (tx, rx) = mpsc::channel(1024);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let cfg = DataplaneConfig {
                ownership: nf_tables::reconcile::TableOwnership::Off,
                ..DataplaneConfig::default()
            };
            let inner = RealKernel::open(Some(&ns), &cfg).expect("kernel sockets");
            let dp =
                Dataplane::new(cfg.clone(), inner.procsys().default_rp_filter()).expect("renderer");
            let (mut mon_rx, _mon) =
                monitor::start(Some(&ns), MonitorConfig::default()).expect("monitor");
            let (itx, irx) = mpsc::channel(64);
            tokio::spawn(async move {
                while let Some(ev) = mon_rx.recv().await {
                    if itx.send(ev).await.is_err() {
                        break;
                    }
                }
            });
            let kernel = Refusing {
                inner,
                folded: Vec::new(),
                refusals: 0,
            };
            let mut d = Driver::new(dp, kernel, LoopOptions::default(), None, None);
            d.run(rx, irx, async {
                let _ = stop_rx.await;
            })
            .await
            .expect("the loop never gives up over one input");
            (
                d.kernel.refusals,
                d.dp.quarantined().keys().cloned().collect::<Vec<_>>(),
                d.summary().failures,
            )
        })
    });

    // Ten policies, one refused; a and c use good ones, b the refused one.
    send(
        &tx,
        json!({"active_profile_update": {"id": {"name": "allow-all"},
        "profile": {"inbound_rules": [{"action": "allow"}], "outbound_rules": [{"action": "allow"}]}}}),
    );
    for n in 0..10 {
        send(&tx, policy(&format!("p{n}"), n == 7));
    }
    send(&tx, wep(a, tier("p1")));
    send(&tx, wep(b, tier("p7")));
    send(&tx, wep(c, tier("p2")));
    send(&tx, json!({"in_sync": {}}));
    expect(
        "everything but the refused policy is programmed; its endpoint fails closed",
        &[
            flow(a, c, Verdict::Pass),
            flow(c, a, Verdict::Pass),
            flow(a, b, Verdict::Drop),
            flow(c, b, Verdict::Drop),
        ],
    );
    // A good version of the refused policy: programmed.
    send(&tx, policy("p7", false));
    expect(
        "the next update of the quarantined policy is programmed",
        &[flow(a, b, Verdict::Pass), flow(a, c, Verdict::Pass)],
    );
    // A bad version of a policy already programmed: the last good one stays in force.
    send(
        &tx,
        json!({"active_policy_update": {"id": {"name": "p2", "kind": "GlobalNetworkPolicy"},
            "policy": {"inbound_rules": [{"action": "deny", "metadata": {"annotations": {"refuse": "me"}}}],
                       "outbound_rules": [{"action": "allow"}]}}}),
    );
    send(&tx, wep(a, tier("p3")));
    std::thread::sleep(Duration::from_millis(1500));
    expect(
        "the last good version of p2 stays",
        &[flow(a, c, Verdict::Pass), flow(b, c, Verdict::Pass)],
    );
    drop(tx);
    let _ = stop_tx.send(());
    let (refusals, quarantined, failures) = agent.join().expect("the agent thread");
    assert!(refusals >= 2, "the kernel refused {refusals} times");
    assert_eq!(
        quarantined,
        vec![ObjKey::Policy(felix_api::PolicyId {
            name: "p2".into(),
            namespace: String::new(),
            kind: "GlobalNetworkPolicy".into()
        })]
    );
    assert_eq!(failures, 0, "no apply failed");
}
