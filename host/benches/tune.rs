//! `gpuheap tune`'s whole settings search, minimum-capacity bisections included (issue 9 target: under
//! 10 s on the 2-core build machine for the 19,936-event training step
//! `../shared/traces/memory_ctx512_fullstep_.pickle`; the shipped DeComFL snapshot otherwise).
//!
//! `cargo bench -p gpuheap --bench tune` (rayon uses every core; `RAYON_NUM_THREADS=2` pins two;
//! `GPUHEAP_SHARED=DIR` names the shared folder when it is not `../shared`).

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use gpuheap::explain::tune::tune;
use gpuheap::facts::capacity_from_evidence;
use gpuheap::trace::read_trace;

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let shared = std::env::var_os("GPUHEAP_SHARED")
        .map_or_else(|| root.join("../shared"), std::path::PathBuf::from)
        .join("traces/memory_ctx512_fullstep_.pickle");
    let path = if shared.exists() { shared } else { root.join("data/decomfl_opt_zo_federated_memory.pickle") };
    let trace = read_trace(&path).expect("trace reads");
    let dev = &trace.devices[0];
    let cap = capacity_from_evidence(&trace, dev, None).expect("capacity");
    let mut g = c.benchmark_group("tune");
    g.sample_size(10);
    g.bench_function(path.file_name().unwrap().to_string_lossy().into_owned(), |b| {
        b.iter(|| tune(&trace, dev, &cap, &|| {}).expect("tune runs"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
