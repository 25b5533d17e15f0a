//! Two allocators of the `strategies` workload timed in alternation: thread CPU time per alloc+free pair,
//! slice by slice, so that both see the same interference from the other guests of a shared machine.
//!
//! Criterion times one allocator after the other, a few seconds each; on the project's 2-core VM the
//! offset-allocator row took between 102 and 199 ns per pair in runs of one afternoon, and a ratio of two
//! rows taken seconds apart moved with it. Alternation does not remove the noise (offset-allocator
//! against itself: quartiles 0.70–1.44 over 101 rounds), but both sides of a round share it. Here both allocators are built, filled with
//! the same 100k live blocks and warmed up, then measured in `ROUNDS` rounds; each round runs `SLICE`
//! pairs on one and then on the other (the order alternating from round to round), from the same stream
//! position. The ratio of each round (B / A) is printed, then their median and quartiles, which are what
//! to read.
//!
//! ```text
//! cargo bench -p gpuheap --bench strategies_ab -- A B [ROUNDS] [SLICE]
//! ```
//! `A` and `B` are rows of the `strategies` benchmark (`offset-allocator`, `best-fit`, ...); `ROUNDS`
//! defaults to 41 and `SLICE` to 200,000 pairs (about 20 to 80 ms per slice).

use std::io::Write;

#[path = "common/strategy_workload.rs"]
#[allow(dead_code)]
mod workload;
use workload::{pair, thread_cpu_ns, visit, Bench, Visitor, Workload, NAMES, STREAM};

/// One allocator of the pair: its heap and its slots.
struct Side<B: Bench> {
    b: B,
    slots: Vec<Option<B::Handle>>,
}

impl<B: Bench> Side<B> {
    /// Fills the heap with the prefill and runs `warm` pairs from stream position 0.
    fn new(mut b: B, w: &Workload, warm: usize) -> Self {
        let slots = w.prefill.iter().map(|&s| b.alloc(s)).collect();
        let mut side = Side { b, slots };
        side.pairs(w, 0, warm);
        side
    }

    /// Runs `n` pairs from stream position `start`; returns the thread CPU time in ns.
    #[inline(never)]
    fn pairs(&mut self, w: &Workload, start: usize, n: usize) -> u64 {
        let t = thread_cpu_ns();
        for i in start..start + n {
            pair(&mut self.b, &mut self.slots, w, i);
        }
        thread_cpu_ns() - t
    }
}

struct Config<'a> {
    w: &'a Workload,
    second: String,
    rounds: usize,
    slice: usize,
}

/// Builds A, then hands it to [`Second`] while B is built.
struct First<'a>(Config<'a>);

impl Visitor for First<'_> {
    fn visit<A: Bench>(&mut self, name: &str, a: A) {
        let side = Side::new(a, self.0.w, self.0.slice);
        let second = self.0.second.clone();
        let mut s = Second { cfg: &self.0, a_name: name.to_string(), a: Some(side) };
        if !visit(&second, &mut s) {
            eprintln!("unknown allocator {second}; one of {NAMES:?}");
            std::process::exit(2);
        }
    }
}

struct Second<'a, A: Bench> {
    cfg: &'a Config<'a>,
    a_name: String,
    a: Option<Side<A>>,
}

impl<A: Bench> Visitor for Second<'_, A> {
    fn visit<B: Bench>(&mut self, b_name: &str, b: B) {
        let (w, slice) = (self.cfg.w, self.cfg.slice);
        let mut a = self.a.take().expect("visited once");
        let mut b = Side::new(b, w, slice);
        let (mut ratios, mut ta, mut tb) = (Vec::new(), 0u64, 0u64);
        for r in 0..self.cfg.rounds {
            let start = (slice * (r + 1)) % STREAM;
            let (x, y) = if r % 2 == 0 {
                let x = a.pairs(w, start, slice);
                (x, b.pairs(w, start, slice))
            } else {
                let y = b.pairs(w, start, slice);
                (a.pairs(w, start, slice), y)
            };
            let (na, nb) = (x as f64 / slice as f64, y as f64 / slice as f64);
            // A reader that stops early (`| head`) ends the output, not the run with a panic.
            let _ = writeln!(
                std::io::stdout(),
                "round {r:3}: {} {na:7.1} ns/pair, {} {nb:7.1} ns/pair, ratio {:.3}",
                self.a_name,
                b_name,
                nb / na
            );
            ratios.push(nb / na);
            (ta, tb) = (ta + x, tb + y);
        }
        ratios.sort_by(f64::total_cmp);
        let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f).round() as usize];
        let n = (self.cfg.rounds * slice) as f64;
        let _ = writeln!(
            std::io::stdout(),
            "{b_name} / {}: median ratio {:.3} (quartiles {:.3}–{:.3}) over {} rounds of {slice} pairs; \
             totals {:.1} and {:.1} ns/pair",
            self.a_name,
            q(0.5),
            q(0.25),
            q(0.75),
            self.cfg.rounds,
            tb as f64 / n,
            ta as f64 / n,
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.len() < 2 {
        eprintln!("usage: strategies_ab A B [ROUNDS] [SLICE]; A and B among {NAMES:?}");
        std::process::exit(2);
    }
    let num = |i: usize, default: usize| {
        args.get(i).map_or(default, |v| {
            v.parse().ok().filter(|&n| n > 0).unwrap_or_else(|| {
                eprintln!("strategies_ab: `{v}` is not a positive number");
                std::process::exit(2)
            })
        })
    };
    let (rounds, slice) = (num(2, 41), num(3, 200_000));
    let w = Workload::new();
    let cfg = Config { w: &w, second: args[1].clone(), rounds, slice };
    if !visit(&args[0], &mut First(cfg)) {
        eprintln!("unknown allocator {}; one of {NAMES:?}", args[0]);
        std::process::exit(2);
    }
}
