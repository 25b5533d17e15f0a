//! Instruction count per replayed event, for callgrind: one strategy's `replay` of the `replay` bench's
//! trace (or the caching model's fidelity replay, `caching_model`), without criterion, so the count is
//! deterministic.
//!
//! Usage (`NAME` is a strategy name or `caching_model`; RUNS defaults to 3):
//! ```text
//! cargo bench -p gpuheap --bench replay_icount --no-run
//! valgrind --tool=callgrind --toggle-collect='*measured_runs*' --callgrind-out-file=/tmp/cg.replay.NAME \
//!     target/release/deps/replay_icount-<hash> NAME [RUNS]
//! ```
//! Instructions per event = the `Collected` total / (RUNS × events). Reading the trace and one warm-up run
//! happen outside `measured_runs`. Without valgrind it prints the wall time per run (a rough cross-check).
//! With RUNS = 0 it prints the strategy's report as JSON with the timing fields zeroed (to check that two
//! builds report the same numbers). `REPLAY_ICOUNT_TRACE=PATH` replays another trace.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpuheap::reference::caching::{config_for_trace, fidelity};
use gpuheap::reference::StrategyKind;
use gpuheap::replay::{replay, ReplayOptions};
use gpuheap::trace::{read_trace, DeviceTrace, Trace};

/// Runs `runs` whole replays (what the `replay` bench times per iteration); returns the events replayed.
#[inline(never)]
fn measured_runs(trace: &Trace, dev: &DeviceTrace, name: &str, runs: usize) -> usize {
    let mut events = 0;
    for _ in 0..runs {
        events += one(trace, dev, name);
    }
    events
}

fn one(trace: &Trace, dev: &DeviceTrace, name: &str) -> usize {
    if name == "caching_model" {
        let peak = gpuheap::facts::pytorch_series(dev).peak;
        let (cfg, _) = config_for_trace(dev, peak.div_ceil(1 << 30).max(1) << 30);
        black_box(fidelity(dev, cfg).expect("fidelity replay")).events
    } else {
        let kind: StrategyKind = name.parse().expect("a strategy name or caching_model");
        black_box(replay(trace, dev, &ReplayOptions::new(kind), None, &mut |_| {}).expect("replay")).events
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let name = args.next().unwrap_or_else(|| "caching".into());
    let runs: usize = args.next().map_or(3, |s| s.parse().expect("RUNS is a number"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = std::env::var_os("GPUHEAP_SHARED").map_or_else(|| root.join("../shared"), PathBuf::from).join("traces");
    let shared = Path::new(&dir).join("memory_ctx512_fullstep_.pickle");
    let path = match std::env::var_os("REPLAY_ICOUNT_TRACE") {
        Some(p) => p.into(),
        None if shared.exists() => shared,
        None => root.join("data/K.1048576.csv"),
    };
    let trace = read_trace(&path).expect("trace reads");
    let dev = &trace.devices[0];
    if runs == 0 {
        // The report as JSON, timing fields zeroed (to compare the reported numbers of two builds).
        let kind: StrategyKind = name.parse().expect("a strategy name");
        let mut r = replay(&trace, dev, &ReplayOptions::new(kind), None, &mut |_| {}).expect("replay");
        (r.replay_ns, r.events_per_s) = (0, 0.0);
        println!("{}", serde_json::to_string(&r).expect("report serialises"));
        return;
    }
    one(&trace, dev, &name);
    let t = Instant::now();
    let events = measured_runs(&trace, dev, &name, runs);
    let ns = t.elapsed().as_nanos() as f64;
    println!(
        "{name}: {} on {}: {runs} runs, {events} events, {:.3} ms/run wall, {:.2} M events/s",
        path.file_name().unwrap().to_string_lossy(),
        dev.events.len(),
        ns / runs as f64 * 1e-6,
        events as f64 / ns * 1e3
    );
}
