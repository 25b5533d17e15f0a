//! The caching-allocator model against PyTorch: fidelity on every real snapshot (reserved bytes event by
//! event, recorded OOMs), and synthetic snapshots for each option with values worked out by hand from
//! PyTorch's rules (`c10/cuda/CUDACachingAllocator.cpp`, `c10/core/AllocatorConfig.cpp`).
//!
//! Fidelity tolerance (issue 9): with the snapshot's own settings, max |model − PyTorch| reserved bytes
//! over all events ≤ 1 % of PyTorch's peak reserved, the same at the end, every recorded OOM reproduced
//! at its event and no request PyTorch served failed.

mod common;

use std::path::{Path, PathBuf};

use common::pickle::{pickle, V};
use gpuheap::reference::caching::{capacity_at_oom, config_for_trace, fidelity, CachingConfig, Fidelity};
use gpuheap::replay::{fmt_bytes, pytorch_series};
use gpuheap::trace::{parse_trace, read_trace, DeviceTrace, EventKind};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The shared traces folder: `../shared/traces` next to the workspace (as the other tests find it), or
/// `GPUHEAP_TRACES_DIR` when set (a git worktree elsewhere).
fn shared_dir() -> PathBuf {
    std::env::var_os("GPUHEAP_TRACES_DIR").map_or_else(|| workspace().join("../shared/traces"), PathBuf::from)
}

/// Every snapshot in the shared traces folder and `data/` (a message names what is absent).
fn snapshots() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for dir in [shared_dir(), workspace().join("data")] {
        match std::fs::read_dir(&dir) {
            Ok(rd) => {
                let mut files: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "pickle" || x == "pkl"))
                    .collect();
                files.sort();
                v.extend(files);
            }
            Err(_) => println!("skipped: {} is absent", dir.display()),
        }
    }
    v
}

/// The capacity of a fidelity replay: the OOM evidence, else PyTorch's peak reserved rounded up to a GiB.
fn capacity(dev: &DeviceTrace) -> u64 {
    capacity_at_oom(dev).unwrap_or_else(|| {
        let s = pytorch_series(dev);
        let peak = s.peak.max(s.snapshot_reserved.unwrap_or(0));
        peak.div_ceil(GIB).max(1) * GIB
    })
}

fn run(dev: &DeviceTrace) -> (Fidelity, Vec<String>) {
    let (cfg, warnings) = config_for_trace(dev, capacity(dev));
    (fidelity(dev, cfg).expect("replays"), warnings.iter().map(|w| w.to_string()).collect())
}

#[test]
fn fidelity_on_every_real_snapshot() {
    println!(
        "| snapshot | events | PyTorch peak / end reserved | model peak / end | max deviation | end deviation | \
         segments PyTorch / model | OOMs reproduced |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut failures = Vec::new();
    for p in snapshots() {
        let t = read_trace(&p).unwrap_or_else(|e| panic!("{e}"));
        for dev in &t.devices {
            let (f, warnings) = run(dev);
            let name = p.file_name().unwrap().to_string_lossy();
            println!(
                "| {name} (device {}) | {} | {} / {} | {} / {} | {:.3} % | {:.3} % | {} / {} | {}/{} |",
                dev.device,
                f.events,
                fmt_bytes(f.pytorch_peak),
                fmt_bytes(f.pytorch_end),
                fmt_bytes(f.model_peak),
                fmt_bytes(f.model_end),
                100.0 * f.max_deviation_fraction(),
                100.0 * f.end_deviation_fraction(),
                f.pytorch_segments.map_or("-".into(), |s| s.to_string()),
                f.model_segments,
                f.reproduced_ooms,
                f.recorded_ooms.len()
            );
            for w in &warnings {
                println!("    warning: {w}");
            }
            let ok = f.max_deviation_fraction() <= 0.01
                && f.end_deviation_fraction() <= 0.01
                && f.reproduced_ooms == f.recorded_ooms.len()
                && f.invented_failures.is_empty();
            if !ok {
                failures.push(format!("{name}: {f:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "fidelity out of tolerance:\n{}", failures.join("\n"));
}

/// Debug aid (ignored): `GPUHEAP_TRACE=file GPUHEAP_AT=event cargo test --test caching_model dump -- --ignored`.
#[test]
#[ignore]
fn dump() {
    let p = PathBuf::from(std::env::var("GPUHEAP_TRACE").unwrap());
    let at: usize = std::env::var("GPUHEAP_AT").unwrap().parse().unwrap();
    let t = read_trace(&p).unwrap();
    let dev = &t.devices[0];
    for (i, e) in dev.events.iter().enumerate().skip(at.saturating_sub(30)).take(40) {
        println!("{i} {:?} id {} addr {:#x} size {} stream {}", e.kind, e.id, e.addr, e.size, e.stream);
    }
    let (cfg, _) = config_for_trace(dev, capacity(dev));
    let (f, m) = gpuheap::reference::caching::fidelity_until(dev, cfg, at + 1).unwrap();
    println!("{f:?}");
    for s in m.segments() {
        println!("seg {:#x} {} {:?} stream {} blocks {:?}", s.offset, s.size, s.pool, s.stream, s.blocks);
    }
}
