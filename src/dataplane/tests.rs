//! Unit tests of the desired-state core (no kernel).

use proptest::prelude::*;

use super::status::StatusReporter;
use super::*;
use crate::proto::{
    FromDataplane, HostEndpointRemove, HostEndpointUpdate, WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
};
use crate::rtnl::link::LinkState;
use crate::rtnl::monitor::IfaceEvent;

#[derive(Clone, Debug)]
enum Ev {
    Wep { id: u8, iface: u8, active: bool },
    WepGone(u8),
    Link { iface: u8, up: bool },
    LinkGone(u8),
    Hep { id: u8, iface: u8 },
    HepGone(u8),
    ConfFailed(u8),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0u8..6, 0u8..4, any::<bool>()).prop_map(|(id, iface, active)| Ev::Wep {
            id,
            iface,
            active
        }),
        (0u8..6).prop_map(Ev::WepGone),
        (0u8..6, any::<bool>()).prop_map(|(iface, up)| Ev::Link { iface, up }),
        (0u8..6).prop_map(Ev::LinkGone),
        (0u8..2, 4u8..6).prop_map(|(id, iface)| Ev::Hep { id, iface }),
        (0u8..2).prop_map(Ev::HepGone),
        (0u8..4).prop_map(Ev::ConfFailed),
    ]
}

fn iface(i: u8) -> String {
    if i < 4 {
        format!("cali{i}")
    } else {
        format!("eth{i}")
    }
}

fn wid(id: u8) -> WorkloadEndpointId {
    WorkloadEndpointId {
        orchestrator_id: "k8s".into(),
        workload_id: format!("w{id}"),
        endpoint_id: "eth0".into(),
    }
}

fn hid(id: u8) -> HostEndpointId {
    HostEndpointId {
        endpoint_id: format!("h{id}"),
    }
}

fn msg(p: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(p),
    }
}

fn event(dp: &mut Dataplane, e: &Ev) {
    match *e {
        Ev::Wep {
            id,
            iface: i,
            active,
        } => {
            let ep = WorkloadEndpoint {
                state: if active { "active" } else { "inactive" }.into(),
                name: iface(i),
                ..WorkloadEndpoint::default()
            };
            let u = WorkloadEndpointUpdate {
                id: Some(wid(id)),
                endpoint: Some(ep),
            };
            dp.on_update(&msg(Payload::WorkloadEndpointUpdate(u)))
                .unwrap();
        }
        Ev::WepGone(id) => {
            let r = WorkloadEndpointRemove { id: Some(wid(id)) };
            dp.on_update(&msg(Payload::WorkloadEndpointRemove(r)))
                .unwrap();
        }
        Ev::Link { iface: i, up } => dp.on_iface(&IfaceEvent::Link(LinkState {
            index: u32::from(i) + 10,
            name: iface(i),
            admin_up: up,
            oper_up: up,
            mac: vec![0xee; 6],
        })),
        Ev::LinkGone(i) => dp.on_iface(&IfaceEvent::Removed {
            index: u32::from(i) + 10,
            name: iface(i),
        }),
        Ev::Hep { id, iface: i } => {
            let u = HostEndpointUpdate {
                id: Some(hid(id)),
                endpoint: Some(HostEndpoint {
                    name: iface(i),
                    ..HostEndpoint::default()
                }),
            };
            dp.on_update(&msg(Payload::HostEndpointUpdate(u))).unwrap();
        }
        Ev::HepGone(id) => {
            let r = HostEndpointRemove { id: Some(hid(id)) };
            dp.on_update(&msg(Payload::HostEndpointRemove(r))).unwrap();
        }
        Ev::ConfFailed(i) => dp.iface_conf_failed(&iface(i)),
    }
}

fn sorted(mut m: Vec<FromDataplane>) -> Vec<String> {
    let mut v: Vec<String> = m.drain(..).map(|m| format!("{m:?}")).collect();
    v.sort();
    v
}

proptest! {
    /// Recomputing only the endpoints an event may have touched reports exactly what
    /// recomputing every endpoint reports, after every batch of events.
    #[test]
    fn scoped_statuses_report_what_full_statuses_report(
        evs in proptest::collection::vec(ev(), 1..40),
        batch in 1usize..4,
    ) {
        let mut dp = Dataplane::new(DataplaneConfig::default(), 1).unwrap();
        let (mut full, mut scoped) = (StatusReporter::default(), StatusReporter::default());
        for chunk in evs.chunks(batch) {
            for e in chunk {
                event(&mut dp, e);
            }
            let want = {
                let (w, h) = dp.statuses();
                sorted(full.update(&w, &h))
            };
            let got = match dp.take_status_dirty() {
                Some(scope) => {
                    let (w, h) = dp.statuses_in(&scope);
                    sorted(scoped.update_in(&w, &h, &scope))
                }
                None => Vec::new(),
            };
            prop_assert_eq!(got, want, "after {:?}", chunk);
        }
    }
}
