//! The route syncer's `plan` and `apply` share one decision (privileged, private namespace):
//! what `plan` lists is what `apply` then does; `plan` writes nothing and does not start grace
//! periods; `list_owned` follows the §15 ownership rule.

use testkit::rtnl as rtnl_common;

use std::time::Duration;

use rtnl::link::{create_veth, set_up};
use rtnl::routes::{RouteOwnership, RouteSyncer, RT_TABLE_MAIN};
use rtnl::{IpFamily, RtnlHandle};
use rtnl_common::{device_route, in_netns_async, run_in};

fn syncer(grace: Duration) -> RouteSyncer {
    // Ours: protocol 80 anywhere; any protocol on `cali*` (RemoveExternalRoutes).
    let own = RouteOwnership::by_prefixes([80], vec!["cali".into()], None);
    RouteSyncer::new(IpFamily::V4, RT_TABLE_MAIN, own).with_grace(grace)
}

#[test]
fn plan_predicts_apply_and_writes_nothing() {
    in_netns_async(|| async {
        let h = RtnlHandle::connect(None).unwrap();
        create_veth(&h, "cali1", "peer1").await.unwrap();
        set_up(&h, "cali1", true).await.unwrap();
        set_up(&h, "peer1", true).await.unwrap();
        create_veth(&h, "eth1", "eth1p").await.unwrap();
        set_up(&h, "eth1", true).await.unwrap();
        // Stale ours (proto 80), unknown on a workload interface (proto 186: grace period), and
        // foreign (boot on a host interface).
        run_in(
            None,
            &[
                "ip", "route", "add", "10.9.0.1", "dev", "eth1", "proto", "80",
            ],
        );
        run_in(
            None,
            &[
                "ip", "route", "add", "10.9.0.2", "dev", "cali1", "proto", "186",
            ],
        );
        run_in(None, &["ip", "route", "add", "192.0.2.0/24", "dev", "eth1"]);

        let mut s = syncer(Duration::from_secs(10));
        s.set_routes("cali1", vec![device_route("10.65.0.2/32", "cali1", 3)]);
        s.set_routes("cali9", vec![device_route("10.65.0.9/32", "cali9", 3)]);
        let before = run_in(None, &["ip", "route", "show"]);
        let plan = s.plan(&h).await.unwrap();
        assert_eq!(run_in(None, &["ip", "route", "show"]), before, "plan wrote");
        assert_eq!(s.next_deadline(), None, "plan started a grace period");
        let add: Vec<String> = plan.add.iter().map(|r| r.to_string()).collect();
        assert_eq!(add, ["10.65.0.2/32 metric 1024 dev cali1 proto 3"]);
        let del: Vec<String> = plan.delete.iter().map(|r| r.to_string()).collect();
        assert_eq!(del, ["10.9.0.1/32 metric 0 dev eth1 proto 80"]);
        assert_eq!(plan.parked.len(), 1);
        assert_eq!(plan.parked[0].1, "cali9");
        assert_eq!(plan.in_grace.len(), 1);

        let rep = s.apply(&h).await.unwrap();
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        let added: Vec<_> = plan.add.iter().map(|r| (r.dst, r.metric)).collect();
        assert_eq!(
            rep.added
                .iter()
                .map(|k| (k.dst, k.metric))
                .collect::<Vec<_>>(),
            added
        );
        assert_eq!(
            rep.deleted,
            plan.delete.iter().map(|o| o.key).collect::<Vec<_>>()
        );
        assert_eq!(rep.in_grace, plan.in_grace);
        assert!(s.next_deadline().is_some(), "apply starts the grace period");

        // Nothing left to do but the parked and in-grace routes.
        let again = s.plan(&h).await.unwrap();
        assert!(again.is_empty(), "{again:?}");

        // Ours now: the route we added and the unknown one on the workload interface; the
        // foreign route on eth1 is not.
        let owned: Vec<String> = s
            .list_owned(&h)
            .await
            .unwrap()
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(owned.len(), 2, "{owned:?}");
        assert!(owned.contains(&"10.65.0.2/32 metric 1024 dev cali1 proto 3".to_string()));
        assert!(owned.contains(&"10.9.0.2/32 metric 0 dev cali1 proto 186".to_string()));

        // With no grace (cleanup), the unknown route is deleted at once.
        let mut none = syncer(Duration::ZERO);
        let p = none.plan(&h).await.unwrap();
        assert_eq!(p.delete.len(), 2, "{p:?}");
        let rep = none.apply(&h).await.unwrap();
        assert_eq!(rep.deleted.len(), 2);
        assert!(none.list_owned(&h).await.unwrap().is_empty());
        assert!(run_in(None, &["ip", "route", "show"]).contains("192.0.2.0/24 dev eth1"));
    });
}
