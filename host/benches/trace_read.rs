//! Time to read the real traces: `cargo bench -p gpuheap --bench trace_read`.
//! The 3.2 MB training-step snapshot is read from `../shared/traces/` when present (it is not
//! shipped); the target is under 100 ms per read.

use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, Criterion};
use gpuheap::trace::{parse_trace, read_trace};

fn files() -> Vec<PathBuf> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let mut v = vec![ws.join("data/1.3b_snapshot.pickle"), ws.join("data/K.1048576.csv")];
    let shared = ws.join("../shared/traces/memory_ctx512_fullstep_.pickle");
    if shared.is_file() {
        v.insert(0, shared);
    } else {
        println!("{} is absent: not benchmarked", shared.display());
    }
    v
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("trace_read");
    g.sample_size(20);
    for path in files() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        g.bench_function(format!("parse/{name}"), |b| b.iter(|| parse_trace(&path, &bytes).unwrap()));
        g.bench_function(format!("read_trace/{name}"), |b| b.iter(|| read_trace(&path).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
