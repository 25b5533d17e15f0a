//! Instruction count per alloc+free pair, for callgrind: the `strategies` workload (same seed, same 100k
//! live blocks, same operation stream), without criterion, so the count is deterministic.
//!
//! Usage (one allocator per run; `NAME` is one of the `strategies` rows, PAIRS defaults to 200 000):
//! ```text
//! cargo bench -p gpuheap --bench strategies_icount --no-run
//! valgrind --tool=callgrind --toggle-collect='*measured_pairs*' --callgrind-out-file=/tmp/cg.NAME \
//!     target/release/deps/strategies_icount-<hash> NAME [PAIRS]
//! ```
//! Instructions per pair = the `Collected` total / PAIRS. The prefill and the first `PAIRS` pairs (warm-up,
//! bringing the heap to its steady state) run outside `measured_pairs`, so they are not counted.
//! Without valgrind it prints the CPU time per pair of the measured part (a rough cross-check).

use std::time::Instant;

#[path = "common/strategy_workload.rs"]
#[allow(dead_code)]
mod workload;
use workload::{pair, visit, Bench, Visitor, Workload, NAMES};

struct Run<'a> {
    w: &'a Workload,
    pairs: usize,
}

/// Runs `pairs` alloc+free pairs from position `start` of the stream; returns the failed requests.
#[inline(never)]
fn measured_pairs<B: Bench>(
    b: &mut B,
    slots: &mut [Option<B::Handle>],
    w: &Workload,
    start: usize,
    pairs: usize,
) -> usize {
    (start..start + pairs).filter(|&i| pair(b, slots, w, i)).count()
}

impl Visitor for Run<'_> {
    fn visit<B: Bench>(&mut self, name: &str, mut b: B) {
        let w = self.w;
        let mut slots: Vec<Option<B::Handle>> = w.prefill.iter().map(|&s| b.alloc(s)).collect();
        // Warm-up outside the counted function: the same number of pairs as measured.
        let warm = warm_up(&mut b, &mut slots, w, self.pairs);
        let t = Instant::now();
        let failed = measured_pairs(&mut b, &mut slots, w, self.pairs, self.pairs);
        let ns = t.elapsed().as_nanos() as f64 / self.pairs as f64;
        println!(
            "{name}: {} pairs measured, {failed} failed ({warm} in warm-up), {ns:.1} ns/pair wall {}",
            self.pairs,
            b.report()
        );
    }
}

#[inline(never)]
fn warm_up<B: Bench>(b: &mut B, slots: &mut [Option<B::Handle>], w: &Workload, pairs: usize) -> usize {
    (0..pairs).filter(|&i| pair(b, slots, w, i)).count()
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let name = args.next().unwrap_or_else(|| {
        eprintln!("usage: strategies_icount NAME [PAIRS]; NAME one of {NAMES:?}");
        std::process::exit(2)
    });
    let pairs = args.next().map_or(200_000, |p| p.parse().expect("PAIRS is a number"));
    let w = Workload::new();
    if !visit(&name, &mut Run { w: &w, pairs }) {
        eprintln!("unknown allocator {name}; one of {NAMES:?}");
        std::process::exit(2);
    }
}
