//! What the tests, benchmarks and the command line's benchmark suites share and no user programs
//! against: hidden from the documentation, outside the reviewed public API (`host/public-api.txt`), and
//! free to change in any release.
//!
//! Among them, the entry points of the fuzz targets (`fuzz/`, cargo-fuzz on nightly) and of the bounded
//! fuzz run of the test suite (`host/tests/fuzz_readers.rs`, stable): [`fuzz_pickle`] and [`fuzz_csv`]
//! feed one input to the readers and check their invariants, panicking on a violation (as a fuzzer
//! expects): a reader never panics; an error message is one line; a trace it accepts validates; the
//! stack frames of an accepted snapshot can be read from the same bytes.

use std::path::Path;

use crate::trace::{csv_lifetime, parse_trace, pytorch, rmm, validate, Trace, TraceError};

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): the small seeded generator behind every
/// reproducible workload and layout of the benchmarks and tests. Not for
/// anything that needs unpredictability.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed` (every seed, 0 included, is fine).
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (`n > 0`; the modulo bias is negligible for the
    /// small `n` used here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[lo, hi]` (`lo <= hi`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn check(r: Result<Trace, TraceError>) -> Option<Trace> {
    match r {
        Ok(trace) => {
            for d in &trace.devices {
                validate(d, trace.addresses).expect("an accepted trace validates");
            }
            Some(trace)
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n') && !msg.contains('\r'), "multi-line error: {msg}");
            assert_eq!(e.exit_code(), 2, "{msg}");
            None
        }
    }
}

/// The PyTorch snapshot reader (pickle decoder, schema walk, seeding and validation) on `data`, then the
/// stack frames of the first events and blocks of each device of an accepted snapshot.
pub fn fuzz_pickle(data: &[u8]) {
    let path = Path::new("fuzz.pickle");
    if let Some(trace) = check(pytorch::parse(path, data)) {
        for d in &trace.devices {
            let events: Vec<usize> = (0..d.events.len().min(16)).collect();
            let blocks: Vec<u64> = d
                .final_state
                .iter()
                .flat_map(|s| s.segments.iter().flat_map(|seg| seg.blocks.iter().map(|b| b.addr)))
                .take(16)
                .collect();
            if let Err(e) = pytorch::read_frames(path, data, d.device, &events, &blocks) {
                assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
            }
        }
    }
}

/// The CSV readers on `data`: the first byte picks the header put in front of the rest, so that a
/// fuzzer spends its time on rows (even: `id,lower,upper,size`; odd: RMM's
/// `Thread,Time,Action,Pointer,Size,Stream`); the raw input also goes through format detection.
pub fn fuzz_csv(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else { return };
    let path = Path::new("fuzz.csv");
    if sel % 2 == 0 {
        let mut v = b"id,lower,upper,size\n".to_vec();
        v.extend_from_slice(rest);
        check(csv_lifetime::parse(path, &v));
    } else {
        let mut v = b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec();
        v.extend_from_slice(rest);
        check(rmm::parse(path, &v));
    }
    check(parse_trace(path, data));
}
