//! The side table: a small second table per family (`ip calico-side`,
//! [`crate::SIDE_TABLE`]) holding the workload endpoints added or changed since the last merge,
//! with the policy and profile chains they jump to and the IP sets those reference. The kernel
//! validates every table a commit touches by walking it whole from its base chains
//! (docs/design.md, cost model),
//! so an endpoint that goes to the side table costs a small table's validation, and deleting
//! it from the main table costs nothing (deletes are not validated). Which endpoint lives
//! where is [`super::incremental`]'s business; this module renders the structure.
//!
//! A packet's verdict must be exactly Calico's although an `accept` in one table does not end
//! evaluation in the next (only `drop` is final). Main keeps Felix's chains; at the two
//! workload dispatch points it *hands off* an interface listed in its set `filter-cali-wl-side`:
//! it sets a hand-off mark bit and accepts, which ends main's base chain. Base chains at higher
//! priorities of the same hook then continue exactly where main stopped:
//!
//! | hook | priority | table | chain | runs when |
//! |---|---|---|---|---|
//! | forward | 0 | main | `filter-FORWARD` (Felix's) | always |
//! | forward | 1 | side | `filter-FORWARD-from-wl`: `iifname vmap`, else drop | `side_from` set |
//! | forward | 2 | main | `filter-FORWARD-after-from-wl`: the rest of `cali-FORWARD` after the from-workload dispatch, then `filter-FORWARD`'s tail | `side_from` set (cleared first) |
//! | forward | 3 | side | `filter-FORWARD-to-wl`: `oifname vmap`, else drop | `side_to` set |
//! | forward | 4 | main | `filter-FORWARD-after-to-wl`: the rest after the to-workload dispatch | `side_to` set (cleared first) |
//! | input | 1 | side | `filter-INPUT-from-wl` | `side_from` set |
//! | input | 2 | main | `filter-INPUT-after-from-wl`: `cali-wl-to-host`'s rest (the configured default action) | `side_from` set (cleared first) |
//!
//! Why this is Calico's verdict:
//! - the stages run in Felix's order (from-workload before to-workload, both after the
//!   host-endpoint forward checks and before the rest), and marks carry between tables, so the
//!   accept/pass bits each stage leaves are what Felix's next rule would see;
//! - a side endpoint chain's only terminal accept (conntrack established/related, with the
//!   allow action `ACCEPT`) also clears both hand-off bits, so nothing of main runs after it,
//!   as in Felix where that `ACCEPT` ends the hook; `drop` and `reject` are final anyway;
//! - a handed-off interface the side table does not know (a commit landed between two of the
//!   packet's base chains and removed the endpoint) is dropped: fail closed. Moving an endpoint
//!   back into main takes two commits — main first, the side copy after — so that window never
//!   sees it missing.
//!
//! The side table exists whenever the feature is on, even empty, so a handed-off packet always
//! meets its fail-closed chains. It is on when the mark mask leaves two bits for the hand-off,
//! `NftablesSideTableSize` > 0 and there is exactly one workload interface prefix (with several,
//! Felix's dispatch interleaves prefixes and the resume point would depend on which matched).

use crate::names::{logical, ChainBuilder, Layer};
use crate::Renderer;
use nf_tables::build::{self, Iface, RuleBuilder, TextChain};
use nf_tables::model::{BaseChain, ChainType, DataType, Element, Family, Hook, Set, Verdict};

/// Main's set of the interfaces whose endpoint lives in the side table.
pub const SIDE_IFACES: &str = "filter-cali-wl-side";

/// The side table's base chains: (name, hook, priority, which interface it dispatches on).
const SIDE_BASE: [(&str, Hook, i32, Iface); 3] = [
    ("filter-FORWARD-from-wl", Hook::Forward, 1, Iface::In),
    ("filter-FORWARD-to-wl", Hook::Forward, 3, Iface::Out),
    ("filter-INPUT-from-wl", Hook::Input, 1, Iface::In),
];

fn base(name: &str, hook: Hook, priority: i32) -> ChainBuilder {
    ChainBuilder::base(
        name,
        BaseChain {
            chain_type: ChainType::Filter,
            hook,
            priority,
            policy: Verdict::Accept,
        },
    )
}

/// An element of main's `filter-cali-wl-side` set.
pub fn side_iface_element(iface: &str) -> Element {
    build::ifname_element(iface)
}

impl Renderer {
    /// Whether the side table is rendered (see the module documentation).
    pub fn side_table_on(&self) -> bool {
        self.cfg.side_table_size > 0
            && self.marks.can_side()
            && self.cfg.workload_iface_prefixes.len() == 1
    }

    /// The hand-off bit of one dispatch direction.
    fn side_bit(&self, which: Iface) -> u32 {
        match which {
            Iface::In => self.marks.side_from,
            Iface::Out => self.marks.side_to,
        }
    }

    /// Main's first rule of a workload dispatch chain: an interface in the side table is handed
    /// off (hand-off bit set, main's evaluation of this hook ends here).
    pub(crate) fn side_handoff(&self, family: Family, which: Iface, c: &mut ChainBuilder) {
        c.push(
            RuleBuilder::new(family)
                .ifname_in_set(which, SIDE_IFACES)
                .counter()
                .mark_set_or(self.side_bit(which))
                .accept()
                .build(),
            &["Endpoint in the side table"],
        );
    }

    /// Main's set of handed-off interfaces (elements from [`side_iface_element`]).
    pub fn side_ifaces_set(&self) -> Set {
        build::new_set(SIDE_IFACES, vec![DataType::IfName], 0, None)
    }

    /// Main's base chains that resume after a hand-off (priorities 2 and 4 of forward, 2 of
    /// input): each continues with exactly the rules Felix runs after the dispatch point.
    pub fn side_resume_chains(&self, family: Family) -> Vec<TextChain> {
        let m = self.marks;
        let r = || RuleBuilder::new(family);
        let prefix = format!(
            "{}*",
            self.cfg
                .workload_iface_prefixes
                .first()
                .map_or("cali", String::as_str)
        );
        let gate = |c: &mut ChainBuilder, bit: u32| {
            c.push(r().mark_lacks(bit).accept().build(), &["Not handed off"]);
            c.push(r().mark_clear(bit).build(), &[]);
        };

        // After the from-workload dispatch: the rest of cali-FORWARD, then filter-FORWARD's tail.
        let mut a = base("filter-FORWARD-after-from-wl", Hook::Forward, 2);
        gate(&mut a, m.side_from);
        a.push(self.wl_dispatch_jump(family, Iface::Out, &prefix), &[]);
        self.forward_after_workloads(family, &mut a);
        self.forward_tail(family, &mut a);

        // After the to-workload dispatch.
        let mut b = base("filter-FORWARD-after-to-wl", Hook::Forward, 4);
        gate(&mut b, m.side_to);
        self.forward_after_workloads(family, &mut b);
        self.forward_tail(family, &mut b);

        // After the from-workload dispatch of cali-wl-to-host: its default action.
        let mut i = base("filter-INPUT-after-from-wl", Hook::Input, 2);
        gate(&mut i, m.side_from);
        i.push(
            self.endpoint_to_host_rule(family),
            &["Configured DefaultEndpointToHostAction"],
        );

        vec![a.finish(), b.finish(), i.finish()]
    }

    /// The side table's fixed objects: its three base chains and its two dispatch maps with the
    /// elements given ((from, to) per interface, as [`Renderer::workload_dispatch_elements`]).
    pub fn side_base(
        &self,
        family: Family,
        wl_elements: impl IntoIterator<Item = (Element, Element)>,
    ) -> (Vec<TextChain>, Vec<Set>) {
        let r = || RuleBuilder::new(family);
        let chains = SIDE_BASE
            .iter()
            .map(|&(name, hook, priority, which)| {
                let map = Layer::Filter.chain(match which {
                    Iface::In => logical::FROM_WL_DISPATCH,
                    Iface::Out => logical::TO_WL_DISPATCH,
                });
                let mut c = base(name, hook, priority);
                c.push(
                    r().mark_lacks(self.side_bit(which)).accept().build(),
                    &["Not handed off"],
                );
                c.push(r().ifname_vmap(which, &map).build(), &[]);
                c.push(
                    self.deny(r().counter(), Layer::Filter).build(),
                    &["Unknown interface"],
                );
                c.finish()
            })
            .collect();
        let map = |n: &str| {
            let mut m = build::new_set(
                &Layer::Filter.chain(n),
                vec![DataType::IfName],
                0,
                Some(DataType::Verdict),
            );
            // Counted per element, as main's dispatch maps.
            m.counter = true;
            m
        };
        let (mut from, mut to) = (map(logical::FROM_WL_DISPATCH), map(logical::TO_WL_DISPATCH));
        for (f, t) in wl_elements {
            from.elements.push(f);
            to.elements.push(t);
        }
        from.elements.sort();
        to.elements.sort();
        (chains, vec![from, to])
    }
}
