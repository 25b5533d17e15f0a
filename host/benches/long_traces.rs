//! Cost against length on long PyTorch snapshots (issue 23): reading (`parse_trace`), `explain` without
//! the search (`explain_with_bytes`) and `tune`'s whole settings search, at about 10^4, 10^5 and 10^6
//! events. The snapshots are the shipped DeComFL snapshot (23,105 events) repeated 1, 5 and 42 times by
//! `gpuheap trace repeat` ([`gpuheap::trace::repeat`], made in memory before the run: 23,105, 118,945
//! and 1,005,465 events). Each row reports its throughput in events (reading: bytes): equal rates at the
//! three sizes are linear scaling.
//!
//! `cargo bench -p gpuheap --bench long_traces` (rayon uses every core; `RAYON_NUM_THREADS=1` pins one).
//! `GPUHEAP_LONG_STEPS=1,5` limits the sizes (the 10^6-event rows take about a minute each);
//! `GPUHEAP_LONG_FILES=A.pickle,B.pickle` measures those snapshots instead (e.g. files written by
//! `gpuheap trace repeat` from the shared traces).

use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpuheap::explain::{explain_with_bytes, tune::tune};
use gpuheap::facts::capacity_from_evidence;
use gpuheap::reference::StrategyKind;
use gpuheap::replay::{replay, ReplayOptions};
use gpuheap::trace::repeat::{Repeat, RepeatOptions};
use gpuheap::trace::{parse_trace, read_trace_and_bytes};

/// The shipped snapshot repeated `steps` times: its path (for messages) and bytes.
fn repeated(steps: u32) -> (PathBuf, Vec<u8>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let input = root.join("data/decomfl_opt_zo_federated_memory.pickle");
    let (trace, bytes) = read_trace_and_bytes(&input).expect("the shipped snapshot reads");
    let plan = Repeat::new(&trace, &bytes, RepeatOptions::new(steps, 1000)).expect("it repeats");
    let out = plan.write_to(Vec::new()).expect("written to memory");
    (PathBuf::from(format!("decomfl.x{steps}.pickle")), out)
}

fn steps() -> Vec<u32> {
    std::env::var("GPUHEAP_LONG_STEPS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 5, 42])
}

/// The snapshots measured: `GPUHEAP_LONG_FILES`, else the shipped one repeated [`steps`] times.
fn inputs() -> Vec<(PathBuf, Vec<u8>)> {
    match std::env::var("GPUHEAP_LONG_FILES") {
        Ok(files) => files
            .split(',')
            .map(|f| {
                let path = PathBuf::from(f.trim());
                let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                (path, bytes)
            })
            .collect(),
        Err(_) => steps().into_iter().map(repeated).collect(),
    }
}

fn bench(c: &mut Criterion) {
    for (path, bytes) in inputs() {
        let trace = parse_trace(&path, &bytes).expect("the repeated snapshot reads");
        let dev = &trace.devices[0];
        let events = dev.events.len() as u64;
        let cap = capacity_from_evidence(&trace, dev, None).expect("capacity");
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let id = BenchmarkId::new(name, events);

        let mut g = c.benchmark_group("long_traces/read");
        g.sample_size(10).throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_with_input(id.clone(), &bytes, |b, bytes| b.iter(|| parse_trace(&path, bytes).unwrap()));
        g.finish();

        let mut g = c.benchmark_group("long_traces/explain_without_search");
        g.sample_size(10).throughput(Throughput::Elements(events));
        g.bench_with_input(id.clone(), &bytes, |b, bytes| {
            b.iter(|| explain_with_bytes(&trace, Some(bytes), None, None).unwrap())
        });
        g.finish();

        let mut g = c.benchmark_group("long_traces/tune");
        g.sample_size(10).throughput(Throughput::Elements(events));
        g.bench_with_input(id, &cap, |b, cap| b.iter(|| tune(&trace, dev, cap, &|| {}).unwrap()));
        g.finish();
    }
}

/// A replay of the caching model through a new stream per request (an RMM log of 3,000 streams, 512 B
/// each) at a capacity that holds 1,024 small segments, so that every later request fails and releases
/// cached blocks across every stream (`tests/replay.rs`,
/// `caching_replay_with_thousands_of_streams_is_not_quadratic_in_classes`, checks its result; it took
/// 11 s when each release walked every size class of every stream).
fn many_streams(c: &mut Criterion) {
    const N: u64 = 3000;
    let mut log = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for i in 0..N {
        log +=
            &format!("1,{}.{:06},allocate,{:#x},512,{}\n", i / 1_000_000, i % 1_000_000, 0x1000_0000 + i * 512, i + 1);
    }
    let trace = parse_trace(Path::new("streams.rmm.csv"), log.as_bytes()).expect("parses");
    let mut opts = ReplayOptions::new(StrategyKind::Caching);
    opts.capacity = Some(2 << 30);
    let mut g = c.benchmark_group("long_traces/many_streams");
    g.sample_size(10);
    g.bench_function("caching_3000_streams", |b| {
        b.iter(|| replay(&trace, &trace.devices[0], &opts, None, &mut |_| {}).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench, many_streams);
criterion_main!(benches);
