//! The bounded fuzz run of the readers, on stable Rust: the seeds of `fuzz/seeds/`, the snapshots and
//! CSVs of `data/` and of the shared folder's `traces/` go through the fuzz targets' own checks
//! ([`gpuheap::testing::fuzz_pickle`], [`gpuheap::testing::fuzz_csv`]: never a panic, one-line errors,
//! accepted traces validate), then a fixed number of mutants of them (byte flips, interesting bytes,
//! truncations, insertions, duplicated and spliced chunks) from a fixed seed, so that a failure replays.
//! `GPUHEAP_FUZZ_ITERS` sets the mutants per target (default 2,000) and `GPUHEAP_FUZZ_SEED` the seed
//! (default 0). The open-ended run is cargo-fuzz's (`fuzz/Cargo.toml`).

use std::path::{Path, PathBuf};

use gpuheap::testing::SplitMix64;

mod common;

/// The project's seeded generator (`gpuheap::testing::SplitMix64`): the run replays from its seed on
/// every platform. `below` over `usize` for the indices a mutation picks.
struct Rng(SplitMix64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }
}

/// Bytes that pickles and CSVs give meaning to: opcodes of containers, memo and marks, lengths at their
/// extremes, separators.
const INTERESTING: &[u8] = b"\x00\x01\x7f\x80\xff()]}hjqruesatl.0129\x94\x95\x8c\x8a,\n\r-";

fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            b.push(INTERESTING[rng.below(INTERESTING.len())]);
            continue;
        }
        let i = rng.below(b.len());
        match rng.below(7) {
            0 => b[i] ^= 1 << rng.below(8),
            1 => b[i] = INTERESTING[rng.below(INTERESTING.len())],
            2 => b.truncate(i.max(1)),
            3 => b.insert(i, rng.next() as u8),
            4 => {
                // A chunk repeated: memo references and rows multiplied.
                let len = 1 + rng.below(16.min(b.len() - i));
                let chunk = b[i..i + len].to_vec();
                for _ in 0..1 + rng.below(64) {
                    b.splice(i..i, chunk.iter().copied());
                }
            }
            5 if !other.is_empty() => {
                // The tail of another seed spliced in.
                let j = rng.below(other.len());
                b.truncate(i);
                b.extend_from_slice(&other[j..]);
            }
            _ => {
                let v = rng.next().to_le_bytes();
                let n = 1 + rng.below(8.min(b.len() - i));
                b[i..i + n].copy_from_slice(&v[..n]);
            }
        }
    }
    b
}

fn files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| exts.is_empty() || p.extension().and_then(|x| x.to_str()).is_some_and(|x| exts.contains(&x)))
        .collect();
    v.sort();
    v
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// Runs `target` on every seed, then on `iters` mutants of the seeds under `max_mutated` bytes.
fn run(name: &str, target: fn(&[u8]), seeds: &[PathBuf], max_mutated: usize) {
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let iters = env_u64("GPUHEAP_FUZZ_ITERS", 2000);
    let mut rng = Rng(SplitMix64::new(env_u64("GPUHEAP_FUZZ_SEED", 0)));
    let mut small = Vec::new();
    for p in seeds {
        let bytes = std::fs::read(p).unwrap();
        let r = std::panic::catch_unwind(|| target(&bytes));
        assert!(r.is_ok(), "{name}: seed {} breaks an invariant", p.display());
        if bytes.len() <= max_mutated {
            small.push(bytes);
        }
    }
    assert!(!small.is_empty(), "{name}: no seed under {max_mutated} B to mutate");
    for n in 0..iters {
        let seed = &small[rng.below(small.len())];
        let other = &small[rng.below(small.len())];
        let input = mutate(&mut rng, seed, other);
        if std::panic::catch_unwind(|| target(&input)).is_err() {
            let keep = std::env::temp_dir().join(format!("gpuheap-fuzz-{name}-{n}"));
            std::fs::write(&keep, &input).unwrap();
            panic!("{name}: mutant {n} breaks an invariant (kept as {}; GPUHEAP_FUZZ_SEED replays)", keep.display());
        }
    }
    println!("{name}: {} seeds, {iters} mutants of the {} under {max_mutated} B", seeds.len(), small.len());
}

#[test]
fn pickle_target_bounded_run() {
    let ws = common::workspace();
    let mut seeds = files(&ws.join("fuzz/seeds/pickle"), &[]);
    seeds.extend(files(&ws.join("data"), &["pickle", "pkl"]));
    seeds.extend(common::shared_files("traces", &["pickle", "pkl"]));
    run("pickle", gpuheap::testing::fuzz_pickle, &seeds, 256 << 10);
}

#[test]
fn csv_target_bounded_run() {
    let ws = common::workspace();
    // The CSV target takes a selector byte first (even: minimalloc rows, odd: RMM rows); the seeds of
    // fuzz/seeds/csv have it, whole files are given as they are (the detection path).
    let mut seeds = files(&ws.join("fuzz/seeds/csv"), &[]);
    seeds.extend(files(&ws.join("data"), &["csv"]));
    seeds.extend(common::shared_files("traces", &["csv"]));
    run("csv", gpuheap::testing::fuzz_csv, &seeds, 256 << 10);
}
