//! Replay speed per strategy (issue 6 target: ≥ 5 M events/s per strategy on one core, i.e. the
//! 19,936-event training-step trace in under 4 ms, reading excluded). Uses
//! `../shared/traces/memory_ctx512_fullstep_.pickle` when present, else the shipped minimalloc trace.
//!
//! `cargo bench -p gpuheap --bench replay`

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpuheap::reference::StrategyKind;
use gpuheap::replay::{replay, ReplayOptions};
use gpuheap::trace::read_trace;

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let shared = root.join("../shared/traces/memory_ctx512_fullstep_.pickle");
    let path = if shared.exists() { shared } else { root.join("data/K.1048576.csv") };
    let trace = read_trace(&path).expect("trace reads");
    let dev = &trace.devices[0];
    let mut g = c.benchmark_group(format!("replay/{}", path.file_name().unwrap().to_string_lossy()));
    g.throughput(Throughput::Elements(dev.events.len() as u64));
    g.sample_size(20);
    for k in StrategyKind::ALL {
        let opts = ReplayOptions::new(k);
        if replay(&trace, dev, &opts, None, &mut |_| {}).is_err() {
            continue; // a capacity the strategy cannot use
        }
        g.bench_function(k.as_str(), |b| b.iter(|| replay(&trace, dev, &opts, None, &mut |_| {}).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
