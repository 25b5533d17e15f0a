//! Replay speed per strategy (issue 6 target: ≥ 5 M events/s per strategy on one core, i.e. the
//! 19,936-event training-step trace in under 4 ms, reading excluded). Uses
//! `../shared/traces/memory_ctx512_fullstep_.pickle` when present, else the shipped minimalloc trace.
//!
//! `cargo bench -p gpuheap --bench replay`
//!
//! Group `caching_model/FILE`: the caching model alone replaying each PyTorch snapshot event by event
//! ([`gpuheap::reference::caching::fidelity`]: seeding, allocs, frees, recorded releases; issue 9 target
//! ≥ 10 M events/s on one core). The snapshots are read from `../shared/traces` (`GPUHEAP_SHARED` names the shared folder).

use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpuheap::reference::caching::{config_for_trace, fidelity};
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

fn bench_caching_model(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = std::env::var_os("GPUHEAP_SHARED").map_or_else(|| root.join("../shared"), PathBuf::from).join("traces");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        println!("caching_model: skipped, {} is absent", dir.display());
        return;
    };
    let mut files: Vec<_> =
        rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "pickle")).collect();
    files.sort();
    let mut g = c.benchmark_group("caching_model");
    g.sample_size(20);
    for p in files {
        let trace = read_trace(&p).expect("trace reads");
        let dev = &trace.devices[0];
        if dev.events.len() < 1000 {
            continue;
        }
        let peak = gpuheap::facts::pytorch_series(dev).peak;
        let (cfg, _) = config_for_trace(dev, peak.div_ceil(1 << 30).max(1) << 30);
        g.throughput(Throughput::Elements(dev.events.len() as u64));
        g.bench_function(p.file_stem().unwrap().to_string_lossy().as_ref(), |b| b.iter(|| fidelity(dev, cfg).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, bench, bench_caching_model);
criterion_main!(benches);
