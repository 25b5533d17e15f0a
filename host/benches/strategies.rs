//! ns per alloc+free pair at a steady state of 100k live blocks, for every reference strategy and, in the
//! same run, `offset-allocator`, `rlsf` and `buddy_system_allocator` on the same seeded workload.
//!
//! Workload: sizes 64 B–64 MiB, log-uniform within three bands (70 % 64 B–64 KiB, 29 % 64 KiB–1 MiB,
//! 1 % 1–64 MiB; mean ≈ 200 KiB), 100 000 blocks allocated up front (not measured), then each measured
//! iteration frees a random live block and allocates the next size into its slot. The operation stream
//! (victims and sizes) is precomputed from a fixed seed and identical for every allocator. The range is
//! 128 GiB; allocators without byte granularity get the same sizes in 256-byte units (offset-allocator,
//! `FrameAllocator` frames). rlsf manages real memory, so it gets a 128 MiB pool and sizes in 1 KiB units
//! (its 32-byte granularity makes the smallest requests equal in size). Failed requests leave their slot
//! empty; their count is printed.
//!
//! Each live block's slot keeps what its allocator's free needs, as a caller would: offset-allocator its
//! `Option<Allocation<u32>>` (12 bytes), rlsf a pointer (8), buddy_system_allocator `(start, count)` (16),
//! our TLSF, best-fit and first-fit their `Option<Handle>` (8, freed by `free_handle`), and our other
//! strategies their `Option<Allocation>` (24; the row `best-fit-allocation` is best-fit kept that way).
//! The slots are the largest random-access array of the benchmark (100k of them), so their size shows in
//! the time per pair: with 24 bytes instead of 8, best-fit took 1.3 to 1.8 times as long in three runs
//! (`bench/results/2026-12-02-467cbcf-best-fit-handle.md`).
//!
//! Time is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time: on a shared build
//! machine wall time also counts the time the thread waits for a core. Cache interference from other
//! processes still shows, so compare the rows of one run with each other.
//!
//! Run: `cargo bench -p gpuheap --bench strategies -- --warm-up-time 1 --measurement-time 3`
//!
//! The workload and adapters live in `common/strategy_workload.rs`, shared with the `strategies_icount`
//! harness, which counts instructions per pair under callgrind (deterministic, unlike CPU time).

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[path = "common/strategy_workload.rs"]
#[allow(dead_code)] // `Bench::report` is for the icount harness
mod workload;
use workload::{pair, thread_cpu_ns, visit, Bench, Visitor, Workload, NAMES, STREAM};

/// Thread CPU time in nanoseconds.
struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &Nanos
    }
}

/// Formats values as CPU nanoseconds.
struct Nanos;

impl ValueFormatter for Nanos {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "ns (cpu)"
    }
    fn scale_throughputs(&self, _typical: f64, throughput: &Throughput, values: &mut [f64]) -> &'static str {
        let n = match *throughput {
            Throughput::Elements(n) | Throughput::Bytes(n) | Throughput::BytesDecimal(n) => n as f64,
            _ => 1.0,
        };
        values.iter_mut().for_each(|v| *v = n * 1e9 / *v);
        "per cpu second"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn run<B: Bench>(c: &mut criterion::BenchmarkGroup<'_, ThreadCpuTime>, name: &str, w: &Workload, mut b: B) {
    let mut slots: Vec<Option<B::Handle>> = w.prefill.iter().map(|&s| b.alloc(s)).collect();
    let mut failed = slots.iter().filter(|s| s.is_none()).count();
    let mut i = 0usize;
    c.bench_function(name, |bench| {
        bench.iter(|| {
            failed += usize::from(pair(&mut b, &mut slots, w, i));
            i = (i + 1) % STREAM;
        })
    });
    if failed > 0 {
        eprintln!("{name}: {failed} failed requests (slots left empty)");
    }
}

struct Group<'a, 'b> {
    g: &'a mut criterion::BenchmarkGroup<'b, ThreadCpuTime>,
    w: &'a Workload,
}

impl Visitor for Group<'_, '_> {
    fn visit<B: Bench>(&mut self, name: &str, b: B) {
        run(self.g, name, self.w, b);
    }
}

fn strategies(c: &mut Criterion<ThreadCpuTime>) {
    let w = Workload::new();
    let mut g = c.benchmark_group("alloc_free_pair");
    for name in NAMES {
        visit(name, &mut Group { g: &mut g, w: &w });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = strategies
}
criterion_main!(benches);
