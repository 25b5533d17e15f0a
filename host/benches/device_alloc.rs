//! Criterion benches of the device heap on the CPU backend (the regressions
//! signal; GPU figures come from `gpuheap bench alloc`).
//!
//! `cargo bench -p gpuheap --bench device_alloc`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpuheap::backend::Backend;
use gpuheap::device_heap::ops::{self, Sizes};
use gpuheap::device_heap::DeviceHeap;

const THREADS: u64 = 1 << 12;

fn alloc_free(c: &mut Criterion) {
    let b = Backend::cpu();
    let mut g = c.benchmark_group("device_heap_alloc_free");
    g.sample_size(20);
    g.throughput(Throughput::Elements(THREADS));
    for size in [16u64, 256, 4096, 64 << 10] {
        let heap = DeviceHeap::new(&b, 1 << 30).unwrap();
        g.bench_with_input(BenchmarkId::new("warm", size), &size, |bench, &size| {
            bench.iter(|| {
                let batch = ops::malloc_batch(&heap, &Sizes::Uniform(size), THREADS, false).unwrap();
                ops::free_batch(&heap, batch, 1).unwrap();
            })
        });
    }
    let heap = DeviceHeap::new(&b, 1 << 30).unwrap();
    let mixed: Vec<u64> = (0..THREADS).map(|i| 16 + (i * 2654435761) % 4080).collect();
    g.bench_function("warm/mixed_16_4096", |bench| {
        bench.iter(|| {
            let batch = ops::malloc_batch(&heap, &Sizes::PerThread(mixed.clone()), THREADS, false).unwrap();
            ops::free_batch(&heap, batch, 1).unwrap();
        })
    });
    g.bench_function("bump/16", |bench| bench.iter(|| gpuheap::ops::bump_alloc(&b, THREADS, 16, 1 << 30).unwrap()));
    g.finish();
}

fn churn(c: &mut Criterion) {
    let b = Backend::cpu();
    let mut heap = DeviceHeap::new(&b, 1 << 30).unwrap();
    let mut g = c.benchmark_group("device_heap_churn");
    g.sample_size(10);
    g.throughput(Throughput::Elements(1024 * 20));
    g.bench_function("1024x20_16_4096", |bench| {
        bench.iter(|| ops::churn(&mut heap, 1024, 20, (16, 4096), 1, true).unwrap())
    });
    g.finish();
}

criterion_group!(benches, alloc_free, churn);
criterion_main!(benches);
