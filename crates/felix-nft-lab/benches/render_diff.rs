//! CPU cost of what every felix-nft apply does before the kernel sees a byte, at endpoint scale
//! (criterion, CPU only): rendering the whole desired state from the model, diffing it against
//! the believed state (no change, and one endpoint added), encoding the full load into one
//! batch, and the daemon's incremental path (render only what an update touches —
//! one endpoint added then removed, one IP set member added). The workload is `bench compare`'s generator: W endpoints, W/2 policies of 5 rules,
//! 500 IP sets of 200 members (100k members), 2 policies per endpoint and direction. Kernel time
//! is `felix-nft bench compare`'s job.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use felix_nft::dataplane::Dataplane;
use felix_nft_lab::bench::run::bench_dataplane_config;
use felix_nft_lab::bench::workload::{Scale, Workload};
use nf_tables::batch::Batch;
use nf_tables::diff;
use nf_tables::model::Table;

fn dataplane(w: &Workload) -> Dataplane {
    let mut dp = Dataplane::new(bench_dataplane_config(), 1).unwrap();
    for m in w.messages() {
        dp.on_update(&m).unwrap();
    }
    dp
}

fn tables(dp: &Dataplane) -> Vec<Table> {
    dp.desired().unwrap().tables
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("endpoints");
    g.sample_size(10);
    for w_eps in [1000usize, 10_000] {
        let scale = Scale {
            w: w_eps,
            p: w_eps / 2,
            r: 5,
            s: 500,
            m: 200,
            k: 2,
        };
        let mut w = Workload::generate(scale);
        let dp = dataplane(&w);
        let before = tables(&dp);
        let mut dp2 = dataplane(&w);
        for m in w.mutate("add_ep", 0) {
            dp2.on_update(&m).unwrap();
        }
        let after = tables(&dp2);

        g.bench_with_input(BenchmarkId::new("render", w_eps), &dp, |b, dp| {
            b.iter(|| black_box(dp.desired().unwrap().tables.len()))
        });
        g.bench_with_input(BenchmarkId::new("diff_nochange", w_eps), &before, |b, t| {
            b.iter(|| black_box(diff::diff(&t[0], Some(&t[0]), false).ops.len()))
        });
        g.bench_with_input(BenchmarkId::new("diff_add_ep", w_eps), &(), |b, _| {
            b.iter(|| black_box(diff::diff(&after[0], Some(&before[0]), false).ops.len()))
        });
        g.bench_with_input(BenchmarkId::new("encode_full", w_eps), &before, |b, t| {
            b.iter(|| {
                let plan = diff::diff(&t[0], None, false);
                let mut batch = Batch::new(1, Some(1));
                plan.encode(&mut batch).unwrap();
                black_box(batch.finish(true).bytes.len())
            })
        });

        // The daemon's path: patches of what changed.
        let mut inc = dataplane(&w);
        black_box(inc.tables_patch());
        let mut round = 1;
        g.bench_function(BenchmarkId::new("incremental_add_del_ep", w_eps), |b| {
            b.iter(|| {
                round += 1;
                for m in w.mutate("add_ep", round) {
                    inc.on_update(&m).unwrap();
                }
                let n = inc.tables_patch().len();
                for m in w.mutate("del_ep", round) {
                    inc.on_update(&m).unwrap();
                }
                black_box(n + inc.tables_patch().len())
            })
        });
        g.bench_function(BenchmarkId::new("incremental_member", w_eps), |b| {
            b.iter(|| {
                round += 1;
                for m in w.mutate("add_mem_ip", round) {
                    inc.on_update(&m).unwrap();
                }
                black_box(inc.tables_patch().len())
            })
        });
    }
    g.finish();
}

criterion_group!(render_diff, benches);
criterion_main!(render_diff);
