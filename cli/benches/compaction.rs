//! Criterion benchmark of the in-place compaction against a plain copy of the
//! same bytes on the same backend (`GPUHEAP_BACKEND`, default auto), on the
//! quick synthetic layouts of `gpuheap_cli::bench::compact`. Times are kernel
//! times (`iter_custom`); throughput is bytes moved per second.
//!
//! `cargo bench -p gpuheap-cli --bench compaction`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpuheap::backend::Backend;
use gpuheap::compaction::{oracle, CompactTuning, Compactor};
use gpuheap_cli::bench::compact::layouts;

fn compaction(c: &mut Criterion) {
    let backend = Backend::from_env().expect("backend");
    let mut compactor = Compactor::new(CompactTuning::for_backend(&backend));
    let mut g = c.benchmark_group(format!("compaction/{}", if backend.is_gpu() { "gpu" } else { "cpu" }));
    g.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
    for l in layouts(true) {
        let moved = oracle::slide_plan(&l.blocks).expect("valid layout").bytes_moved;
        g.throughput(Throughput::Bytes(moved));
        let fill: Vec<u8> = (0..l.capacity).map(|i| i as u8).collect();
        let mut region = backend.upload(&fill).expect("region");
        g.bench_function(format!("{}/compact", l.name), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let r = compactor.compact(&backend, &mut region, &l.blocks, None).expect("compact");
                        r.plan_time + r.move_time
                    })
                    .sum()
            })
        });
        let src = backend.upload(&vec![1u8; moved as usize]).expect("src");
        let mut dst = backend.alloc_zeroed(moved as usize).expect("dst");
        g.bench_function(format!("{}/copy", l.name), |b| {
            b.iter_custom(|iters| {
                (0..iters).map(|_| compactor.copy(&backend, &mut dst, &src, moved).expect("copy").elapsed).sum()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, compaction);
criterion_main!(benches);
