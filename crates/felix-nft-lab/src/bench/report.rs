//! The comparison's results: medians over repetitions with min and max, ratios against each
//! baseline, peak RSS, input sizes; printed as a table, written as JSON, drawn as an SVG chart
//! (grouped bars, log scale).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::run::{Counts, Sample};
use super::workload::{Scale, OPS};
use super::{BenchError, Options, BACKENDS};

/// Rows of the table, in order: the full sync, the operations timed on it, the side table's
/// merge and the read-back.
fn rows() -> impl Iterator<Item = &'static str> {
    ["full", "full_ipset"]
        .into_iter()
        .chain(OPS)
        .chain(["merge_side", "read_back"])
}

fn row_label(op: &str) -> &'static str {
    match op {
        "full" => "full sync into an empty namespace",
        "full_ipset" => "  of which ipset restore",
        "add_ep" => "add endpoint (2 chains + dispatch)",
        "add_mem_ip" => "add 1 member, hash:ip",
        "add_mem_net" => "add 1 member, hash:net / interval",
        "repl_pol" => "replace one policy's rules",
        "del_ep" => "remove endpoint",
        "add_50_ep" => "add 50 endpoints at once",
        "del_50_ep" => "remove those 50 endpoints",
        "noop" => "empty update",
        "merge_side" => "merge side table (idle, per round)",
        "read_back" => "read back",
        _ => "?",
    }
}

/// One (backend, operation) cell.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    pub samples: Vec<Sample>,
    pub n: usize,
    pub wall_median_ms: f64,
    pub wall_min_ms: f64,
    pub wall_max_ms: f64,
    pub user_median_ms: f64,
    pub sys_median_ms: f64,
    /// Peak RSS over the runs measured under GNU time, kB.
    pub rss_kb: Option<u64>,
    /// felix-nft in-process: median wall ms spent rendering the whole desired state.
    pub render_median_ms: Option<f64>,
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// backend → operation → stats.
pub type Results = BTreeMap<String, BTreeMap<String, Stats>>;

/// The median wall time of `op` through `backend`, if it ran and the median is finite.
pub(super) fn wall_median(results: &Results, backend: &str, op: &str) -> Option<f64> {
    results
        .get(backend)?
        .get(op)
        .map(|s| s.wall_median_ms)
        .filter(|m| m.is_finite())
}

/// Computes every operation's statistics from its samples.
pub(super) fn finish_all(results: &mut Results) {
    for ops in results.values_mut() {
        for s in ops.values_mut() {
            s.finish();
        }
    }
}

impl Stats {
    pub(super) fn finish(&mut self) {
        let wall: Vec<f64> = self.samples.iter().map(|s| s.wall_ms).collect();
        self.n = wall.len();
        self.wall_min_ms = wall.iter().copied().fold(f64::INFINITY, f64::min);
        self.wall_max_ms = wall.iter().copied().fold(0.0, f64::max);
        self.wall_median_ms = median(wall);
        self.user_median_ms = median(self.samples.iter().map(|s| s.user_ms).collect());
        self.sys_median_ms = median(self.samples.iter().map(|s| s.sys_ms).collect());
        let r: Vec<f64> = self.samples.iter().filter_map(|s| s.render_ms).collect();
        self.render_median_ms = (!r.is_empty()).then(|| median(r));
    }
}

/// Input sizes.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Sizes {
    pub ipt_bytes: usize,
    pub ipset_bytes: usize,
    pub nft_bytes: usize,
    pub state_bytes: usize,
    pub ipt_rules: usize,
    pub ipt_chains: usize,
    pub nft_rules: usize,
    pub nft_chains: usize,
    pub nft_map_elements: usize,
    pub set_members: usize,
}

/// What the generator says each backend must hold after the whole sequence.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Expected {
    pub ipt_rules: usize,
    pub ipt_members: usize,
    pub nft_rules: usize,
    pub nft_elements: usize,
    pub workload_members: usize,
}

/// The whole result.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    pub scale: Option<Scale>,
    /// IPv6 on too (felix-nft's IPv6 support, `ip6tables` beside `iptables`).
    pub dual_stack: bool,
    pub reps: usize,
    pub inc: usize,
    pub sizes: Sizes,
    /// backend → operation → stats.
    pub results: Results,
    /// What each backend held at the end (last repetition).
    pub counts: BTreeMap<String, Counts>,
    pub expected: Expected,
    /// Equivalence checks: each line says what was compared and whether it held.
    pub checks: Vec<String>,
    pub checks_ok: bool,
    pub notes: Vec<String>,
    /// op → "baseline/felix-nft" → ratio of medians (baseline ÷ felix-nft in-process).
    pub ratios: BTreeMap<String, BTreeMap<String, f64>>,
    /// The traffic spot-check's table, when it ran.
    pub spot: Option<String>,
    /// Whether the backends that ran agreed on every probed flow, and both pass and drop were seen.
    pub spot_ok: Option<bool>,
}

impl Report {
    pub fn new(opts: &Options) -> Report {
        Report {
            scale: Some(opts.scale),
            dual_stack: opts.dual_stack,
            reps: opts.reps,
            inc: opts.inc,
            ..Report::default()
        }
    }

    fn median(&self, backend: &str, op: &str) -> Option<f64> {
        wall_median(&self.results, backend, op)
    }

    /// Compares what each backend holds with the generator's expectation.
    pub fn check(&mut self) {
        let e = &self.expected;
        let mut ok = true;
        for (b, c) in &self.counts {
            // (count, what it counts, expected) for each backend's objects.
            let expect: &[(usize, &str, usize)] = match b.as_str() {
                "ipt-nft" | "ipt-legacy" => &[
                    (c.rules, "filter rules", e.ipt_rules),
                    (c.workload_members, "ipset members", e.ipt_members),
                ],
                "nft-f" => &[
                    (c.rules, "rules", e.nft_rules),
                    (c.elements, "set+map elements", e.nft_elements),
                ],
                "felix-nft" => &[(
                    c.workload_members,
                    "members in the workload's sets",
                    e.workload_members,
                )],
                _ => &[],
            };
            for &(got, what, want) in expect {
                let good = got == want;
                ok &= good;
                self.checks.push(format!(
                    "{} {b}: {got} {what}, expected {want}",
                    if good { "ok  " } else { "FAIL" }
                ));
            }
        }
        self.checks_ok = ok;
    }

    /// Computes the statistics and ratios.
    pub fn finish(&mut self) {
        finish_all(&mut self.results);
        for op in rows() {
            let Some(ours) = self.median("felix-nft", op) else {
                continue;
            };
            for b in ["ipt-nft", "ipt-legacy", "nft-f"] {
                if let Some(theirs) = self.median(b, op) {
                    self.ratios
                        .entry(op.to_string())
                        .or_default()
                        .insert(b.to_string(), theirs / ours);
                }
            }
        }
    }

    fn backends(&self) -> Vec<&'static str> {
        BACKENDS
            .into_iter()
            .filter(|b| self.results.contains_key(*b))
            .collect()
    }

    /// The table as Markdown.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let bs = self.backends();
        if let Some(sc) = &self.scale {
            let z = &self.sizes;
            let _ = writeln!(
                s,
                "scale {sc}{}; {} reps × {} rounds. iptables: {} rules in {} chains; nft: {} rules in {} chains + {} vmap elements; {} set members. Inputs: ipt {:.2} MB + ipset {:.2} MB, nft {:.2} MB, state {:.2} MB.\n",
                if self.dual_stack { ", dual stack (IPv4 + IPv6; the IPv6 sets empty)" } else { "" },
                self.reps, self.inc, z.ipt_rules, z.ipt_chains, z.nft_rules, z.nft_chains, z.nft_map_elements, z.set_members,
                z.ipt_bytes as f64 / 1e6, z.ipset_bytes as f64 / 1e6, z.nft_bytes as f64 / 1e6, z.state_bytes as f64 / 1e6
            );
        }
        let _ = writeln!(s, "Wall ms, median (min–max):\n");
        let _ = writeln!(s, "| operation | {} |", bs.join(" | "));
        let _ = writeln!(s, "|---|{}", "---:|".repeat(bs.len()));
        for op in rows() {
            if !bs.iter().any(|b| self.median(b, op).is_some()) {
                continue;
            }
            let cells: Vec<String> = bs
                .iter()
                .map(|b| wall_cell(self.results.get(*b).and_then(|o| o.get(op))))
                .collect();
            let _ = writeln!(s, "| {} | {} |", row_label(op), cells.join(" | "));
        }
        let rss: Vec<String> = bs
            .iter()
            .map(|b| {
                let ops = &self.results[*b];
                let full = ops.get("full").and_then(|s| s.rss_kb);
                let inc = ["add_ep", "add_mem_ip", "repl_pol", "del_ep"]
                    .iter()
                    .filter_map(|o| ops.get(*o).and_then(|s| s.rss_kb))
                    .max();
                match (full, inc) {
                    (None, None) => "–".into(),
                    (f, i) => format!("{} / {}", fmt_mb(f), fmt_mb(i)),
                }
            })
            .collect();
        let _ = writeln!(
            s,
            "| peak RSS MB, full / incremental | {} |",
            rss.join(" | ")
        );
        if let Some(ops) = self.results.get("felix-nft") {
            let parts: Vec<String> = rows()
                .filter_map(|o| {
                    let st = ops.get(o)?;
                    Some(format!("{o} {}", fmt_ms(st.render_median_ms?)))
                })
                .collect();
            let _ = writeln!(
                s,
                "\nfelix-nft in-process, median ms spent rendering what changed \
                 (included above): {}",
                parts.join(", ")
            );
        }
        if !self.ratios.is_empty() {
            let _ = writeln!(
                s,
                "\nBaseline median ÷ felix-nft in-process median (× faster):\n"
            );
            let _ = writeln!(
                s,
                "| operation | ipt-nft | ipt-legacy | nft -f |\n|---|---:|---:|---:|"
            );
            for op in rows() {
                let Some(r) = self.ratios.get(op) else {
                    continue;
                };
                let cell = |b: &str| r.get(b).map_or("–".into(), |x| format!("{x:.1}×"));
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} |",
                    row_label(op),
                    cell("ipt-nft"),
                    cell("ipt-legacy"),
                    cell("nft-f")
                );
            }
        }
        let _ = writeln!(s, "\nBackends: felix-nft = in-process, long-lived socket (Dataplane → Reconciler, the daemon's path); felix-nft-proc = a fresh felix-nft process per operation fed the whole state document (`apply STATE --netns NS`, or `run --source stdin` where this binary has no `apply`: see notes); ipt-* = ipset + iptables-*-restore --noflush (member adds: `ipset add`); nft-f = `nft -f` of knftables-style input. Read back: our netlink dump (in-process) or `felix-nft dump` / iptables-save + ipset save / nft list ruleset.");
        for c in &self.checks {
            let _ = writeln!(s, "- check: {c}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "- note: {n}");
        }
        if let Some(sp) = &self.spot {
            let _ = writeln!(s, "\n{sp}");
        }
        s
    }

    /// Writes `bench-<W>.json` and `bench-<W>.svg` (`bench-<W>-dual.*` for dual stack).
    pub fn write_files(&self, dir: &Path) -> Result<(), BenchError> {
        let mut stem = match &self.scale {
            Some(s) if *s == Scale::SMALL => "small".to_string(),
            Some(s) if *s == Scale::MID => "mid".to_string(),
            Some(s) if *s == Scale::LARGE => "large".to_string(),
            Some(s) => format!("w{}", s.w),
            None => "bench".into(),
        };
        if self.dual_stack {
            stem.push_str("-dual");
        }
        let json = serde_json::to_string_pretty(self).unwrap_or_default();
        let p = dir.join(format!("bench-{stem}.json"));
        std::fs::write(&p, json).map_err(|source| BenchError::Io {
            op: format!("writing {}", p.display()),
            source,
        })?;
        self.chart(&dir.join(format!("bench-{stem}.svg")))
    }

    /// Grouped bars, one group per operation, one bar per backend, log-scale wall ms.
    pub fn chart(&self, path: &Path) -> Result<(), BenchError> {
        use plotters::prelude::*;
        let bs = self.backends();
        let ops: Vec<&str> = rows().filter(|o| *o != "full_ipset").collect();
        let vals: Vec<f64> = bs
            .iter()
            .flat_map(|b| ops.iter().filter_map(move |o| self.median(b, o)))
            .collect();
        let lo = vals.iter().copied().fold(f64::INFINITY, f64::min).max(1e-3) / 2.0;
        let hi = vals.iter().copied().fold(0.0, f64::max).max(lo * 10.0) * 2.0;
        let err = |e: &dyn std::fmt::Display| BenchError::Chart(e.to_string());
        let root = SVGBackend::new(path, (1100, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let title = match &self.scale {
            Some(s) if self.dual_stack => {
                format!("felix-nft bench compare, {s}, dual stack (median wall ms, log)")
            }
            Some(s) => format!("felix-nft bench compare, {s} (median wall ms, log)"),
            None => "felix-nft bench compare".into(),
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..ops.len() as f64, (lo..hi).log_scale())
            .map_err(|e| err(&e))?;
        let names = ops.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(ops.len() * 2 + 1)
            .x_label_formatter(&move |x| {
                let i = x.floor() as usize;
                if (x - x.floor() - 0.5).abs() < 0.01 && i < names.len() {
                    names[i].to_string()
                } else {
                    String::new()
                }
            })
            .y_desc("ms")
            .draw()
            .map_err(|e| err(&e))?;
        let width = 0.8 / bs.len().max(1) as f64;
        for (bi, b) in bs.iter().enumerate() {
            let color = Palette99::pick(bi).to_rgba();
            let bars: Vec<Rectangle<(f64, f64)>> = ops
                .iter()
                .enumerate()
                .filter_map(|(oi, o)| {
                    let v = self.median(b, o)?;
                    let x0 = oi as f64 + 0.1 + bi as f64 * width;
                    Some(Rectangle::new(
                        [(x0, lo), (x0 + width * 0.9, v)],
                        color.filled(),
                    ))
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(|e| err(&e))?
                .label(*b)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}

/// A table cell: the wall median in bold with (min–max), or a dash without samples.
pub(super) fn wall_cell(st: Option<&Stats>) -> String {
    match st {
        Some(st) if st.n > 0 => format!(
            "**{}** ({}–{})",
            fmt_ms(st.wall_median_ms),
            fmt_ms(st.wall_min_ms),
            fmt_ms(st.wall_max_ms)
        ),
        _ => "–".into(),
    }
}

pub(super) fn fmt_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_mb(kb: Option<u64>) -> String {
    kb.map_or("–".into(), |k| format!("{:.1}", k as f64 / 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let mut s = Stats::default();
        for w in [3.0, 1.0, 2.0, 10.0] {
            s.samples.push(Sample {
                wall_ms: w,
                ..Sample::default()
            });
        }
        s.finish();
        assert_eq!(
            (s.n, s.wall_median_ms, s.wall_min_ms, s.wall_max_ms),
            (4, 2.5, 1.0, 10.0)
        );
    }
}
