//! What `apply` and `plan` print: the changes, counted and listed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use nf_tables::diff::{Op, Plan};
use rtnl::neigh::Mac;
use rtnl::routes::RoutePlan;
use rtnl::vxlan::VxlanSpec;

use super::Mode;

/// A sysctl whose value differs from what we write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlChange {
    /// Relative to /proc/sys (`net/ipv4/conf/cali1/proxy_arp`).
    pub path: String,
    pub from: String,
    pub to: String,
}

/// The changes `apply` makes (or made), as `plan` and `apply` print them.
#[derive(Debug, Default)]
pub struct ConvergeReport {
    /// nf_tables plans (per table) and their operation count.
    pub tables: Vec<Plan>,
    pub table_ops: usize,
    /// Routes (both families). For `apply`, what was written.
    pub routes: RoutePlan,
    /// Whether route and neighbour work was skipped (`RouteSyncDisabled`).
    pub route_sync_disabled: bool,
    /// Permanent neighbours to set: (interface, address, MAC).
    pub neigh_set: Vec<(String, IpAddr, Mac)>,
    /// Permanent neighbours to delete: (interface, address).
    pub neigh_delete: Vec<(String, IpAddr)>,
    /// Interfaces whose neighbours wait for the interface.
    pub neigh_parked: Vec<String>,
    pub sysctls: Vec<SysctlChange>,
    /// VXLAN devices: for `plan`, those to create and those waiting for their parent; for
    /// `apply`, those created, corrected or given FDB writes, and those waiting.
    pub vxlan: Vec<VxlanChange>,
    /// Failures (apply only); any makes the exit code non-zero.
    pub errors: Vec<String>,
}

/// What `plan` or `apply` does to one VXLAN device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanChange {
    /// The device's name.
    pub name: String,
    /// The device as wanted, in `ip link add` words.
    pub device: String,
    /// `plan`: missing, to be created; `apply`: created (or re-created: it was incompatible).
    pub create: bool,
    /// `apply`: corrections of the device and FDB writes, besides the creation.
    pub changes: usize,
    /// The parent interface is missing: nothing is done until it appears.
    pub parked: bool,
}

impl VxlanChange {
    pub(super) fn of(spec: &VxlanSpec, create: bool, changes: usize, parked: bool) -> VxlanChange {
        VxlanChange {
            name: spec.name.clone(),
            device: format!(
                "{} id {} dstport {} dev {} local {}",
                spec.name, spec.vni, spec.port, spec.parent, spec.local
            ),
            create,
            changes,
            parked,
        }
    }
}

impl ConvergeReport {
    fn is_empty(&self) -> bool {
        self.table_ops == 0
            && self.routes.is_empty()
            && self.neigh_set.is_empty()
            && self.neigh_delete.is_empty()
            && self.sysctls.is_empty()
            && self.vxlan.iter().all(|v| !v.create && v.changes == 0)
    }

    /// The report: counts first, then one line per route/neighbour/sysctl change (the same lines
    /// for `plan` and `apply`), then (`plan`, `--dry-run`) the nf_tables operations.
    pub fn text(&self, mode: Mode) -> String {
        let mut s = String::new();
        self.headline(mode, &mut s);
        self.counts(mode, &mut s);
        self.change_lines(mode, &mut s);
        self.table_lines(mode, &mut s);
        s
    }

    /// What the run amounts to, when one line says it all.
    fn headline(&self, mode: Mode, s: &mut String) {
        match mode {
            Mode::Apply if self.is_empty() && self.errors.is_empty() => {
                s.push_str("converged: nothing changed\n")
            }
            Mode::Apply => {}
            Mode::DryRun => s.push_str(
                "dry run: the kernel validated the nf_tables batch and kept nothing; no \
                 route, neighbour or sysctl was written\n",
            ),
            Mode::Plan if self.is_empty() => s.push_str("nothing to do\n"),
            Mode::Plan => {}
        }
    }

    /// The counts of each kind of change.
    fn counts(&self, mode: Mode, s: &mut String) {
        let (add, repl, del, set) = match mode {
            Mode::Apply => ("added", "replaced", "deleted", "set"),
            _ => ("to add", "to replace", "to delete", "to set"),
        };
        let _ = writeln!(
            s,
            "nf_tables: {} operation(s) in {} table(s)",
            self.table_ops,
            self.tables.len()
        );
        if self.route_sync_disabled {
            s.push_str("routes: skipped (RouteSyncDisabled)\nneighbours: skipped\n");
        } else {
            let _ = writeln!(
                s,
                "routes: {} {add}, {} {repl}, {} {del}, {} parked, {} in grace",
                self.routes.add.len(),
                self.routes.replace.len(),
                self.routes.delete.len(),
                self.routes.parked.len(),
                self.routes.in_grace.len()
            );
            let _ = writeln!(
                s,
                "neighbours: {} {set}, {} {del}, {} interface(s) parked",
                self.neigh_set.len(),
                self.neigh_delete.len(),
                self.neigh_parked.len()
            );
            if !self.vxlan.is_empty() {
                let _ = writeln!(
                    s,
                    "vxlan: {} {}, {} corrected, {} parked",
                    self.vxlan.iter().filter(|v| v.create).count(),
                    if mode == Mode::Apply {
                        "created"
                    } else {
                        "to create"
                    },
                    self.vxlan.iter().filter(|v| v.changes > 0).count(),
                    self.vxlan.iter().filter(|v| v.parked).count(),
                );
            }
        }
        let _ = writeln!(
            s,
            "sysctls: {} {}",
            self.sysctls.len(),
            if mode == Mode::Apply {
                "changed"
            } else {
                "to change"
            }
        );
        if !self.errors.is_empty() {
            let _ = writeln!(s, "errors: {}", self.errors.len());
        }
    }

    /// One line per route, VXLAN device, neighbour and sysctl change, and per error.
    fn change_lines(&self, mode: Mode, s: &mut String) {
        for r in &self.routes.add {
            let _ = writeln!(s, "route add {r}");
        }
        for r in &self.routes.replace {
            let _ = writeln!(s, "route replace {r}");
        }
        for r in &self.routes.delete {
            let _ = writeln!(s, "route delete {r}");
        }
        for (k, dev) in &self.routes.parked {
            let _ = writeln!(s, "route parked {k} (interface {dev} absent or down)");
        }
        for k in &self.routes.in_grace {
            let _ = writeln!(
                s,
                "route in-grace {k} (unknown route on a workload interface, kept for now)"
            );
        }
        for v in &self.vxlan {
            if v.parked {
                let _ = writeln!(s, "vxlan parked {} (parent interface absent)", v.device);
            } else if v.create {
                let _ = writeln!(
                    s,
                    "vxlan {} {}",
                    if mode == Mode::Apply {
                        "created"
                    } else {
                        "create"
                    },
                    v.device
                );
            }
            if v.changes > 0 {
                let _ = writeln!(
                    s,
                    "vxlan corrected {}: {} write(s) (device or FDB)",
                    v.device, v.changes
                );
            }
        }
        for (dev, ip, mac) in &self.neigh_set {
            let _ = writeln!(s, "neigh set {ip} lladdr {} dev {dev}", fmt_mac(mac));
        }
        for (dev, ip) in &self.neigh_delete {
            let _ = writeln!(s, "neigh delete {ip} dev {dev}");
        }
        for c in &self.sysctls {
            let _ = writeln!(s, "sysctl {} {} -> {}", c.path, c.from, c.to);
        }
        for e in &self.errors {
            let _ = writeln!(s, "error: {e}");
        }
    }

    /// The nf_tables operations (`plan`, `--dry-run`), or a summary per table (`apply`).
    fn table_lines(&self, mode: Mode, s: &mut String) {
        if mode != Mode::Apply {
            for p in &self.tables {
                let _ = write!(s, "{p}");
            }
        } else {
            for p in &self.tables {
                let _ = writeln!(
                    s,
                    "table {} {}: {}",
                    p.family.name(),
                    p.table,
                    op_summary(&p.ops)
                );
            }
        }
    }
}

fn op_summary(ops: &[Op]) -> String {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for op in ops {
        let k = match op {
            Op::AddTable { .. } => "add table",
            Op::DelTable => "delete table",
            Op::AddSet(_) => "add set",
            Op::DelSet(_) => "delete set",
            Op::AddElements { .. } => "add elements",
            Op::DelElements { .. } => "delete elements",
            Op::AddChain(_) => "add chain",
            Op::FlushChain(_) => "flush chain",
            Op::DelChain(_) => "delete chain",
            Op::AddRule { .. } => "add rule",
        };
        *n.entry(k).or_default() += 1;
    }
    n.iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn fmt_mac(m: &Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
